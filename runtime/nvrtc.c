/* nvrtc.c: opens libnvrtc at run time and resolves the functions of
 * nvrtc_api.h, once per process. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvrtc_api.h"

static symm_nvrtc_api api;
static symm_status load_status = SYMM_ERR_NVRTC;
static char load_message[2048];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void append(char *buf, size_t size, const char *fmt, ...) SYMM_PRINTF(3, 4);

static void append(char *buf, size_t size, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, size - used, fmt, ap);
    va_end(ap);
}

/* Resolve every function from lib; NULL, or the name of the one missing. */
static const char *resolve(void *lib, symm_nvrtc_api *out)
{
#define SYMM_NVRTC_RESOLVE(name)                                  \
    *(void **)&out->name = dlsym(lib, #name);                     \
    if (!out->name)                                               \
        return #name;
    SYMM_NVRTC_FUNCTIONS(SYMM_NVRTC_RESOLVE)
#undef SYMM_NVRTC_RESOLVE
    return NULL;
}

int symm_nvrtc_open(const char *const *candidates, size_t count, symm_nvrtc_api *out,
                    char *why, size_t why_size)
{
    why[0] = '\0';
    for (size_t i = 0; i < count; i++) {
        void *lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *err = dlerror();
            append(why, why_size, "%s%s", why[0] ? "; " : "", err ? err : candidates[i]);
            continue;
        }
        memset(out, 0, sizeof *out);
        const char *missing = resolve(lib, out);
        if (!missing && out->nvrtcVersion(&out->major, &out->minor) != NVRTC_SUCCESS)
            missing = "a working nvrtcVersion";
        if (missing) {
            append(why, why_size, "%s%s lacks %s", why[0] ? "; " : "", candidates[i], missing);
            dlclose(lib);
            memset(out, 0, sizeof *out);
            continue;
        }
        snprintf(out->library, sizeof out->library, "%s", candidates[i]);
        /* The library stays open for the life of the process. */
        return 0;
    }
    return -1;
}

static void load_nvrtc(void)
{
    static const char *const versions[] = {"13", "12"};
    char paths[6][PATH_MAX];
    const char *candidates[6];
    size_t n = 0;
    for (size_t v = 0; v < SYMM_ARRAY_LEN(versions); v++) {
        snprintf(paths[n], sizeof paths[n], "libnvrtc.so.%s", versions[v]);
        candidates[n] = paths[n];
        n++;
    }
    const char *cuda_home = getenv("CUDA_HOME");
    const char *roots[2] = {cuda_home, "/usr/local/cuda"};
    for (size_t r = 0; r < 2; r++) {
        if (!roots[r] || !roots[r][0] || (r == 1 && cuda_home && !strcmp(cuda_home, roots[1])))
            continue;
        for (size_t v = 0; v < SYMM_ARRAY_LEN(versions); v++) {
            snprintf(paths[n], sizeof paths[n], "%s/lib64/libnvrtc.so.%s", roots[r], versions[v]);
            candidates[n] = paths[n];
            n++;
        }
    }
    char why[1536];
    if (symm_nvrtc_open(candidates, n, &api, why, sizeof why) != 0) {
        snprintf(load_message, sizeof load_message,
                 "NVRTC is not available: %s (install the CUDA toolkit, version 12 or 13, "
                 "and set CUDA_HOME or LD_LIBRARY_PATH to find its libnvrtc)",
                 why);
        return;
    }
    load_status = SYMM_OK;
}

symm_status symm_nvrtc(const symm_nvrtc_api **out)
{
    pthread_once(&load_once, load_nvrtc);
    if (load_status != SYMM_OK)
        return symm_fail(load_status, "%s", load_message);
    *out = &api;
    return SYMM_OK;
}

const char *symm_nvrtc_error(const symm_nvrtc_api *nv, nvrtcResult result)
{
    const char *s = nv && nv->nvrtcGetErrorString ? nv->nvrtcGetErrorString(result) : NULL;
    return s ? s : "NVRTC_ERROR_UNKNOWN";
}
