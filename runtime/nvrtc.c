/* nvrtc.c: opens libnvrtc at run time and resolves the functions of
 * nvrtc_api.h, once per process. */
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nvrtc_api.h"
#include "symm_jit.h"

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

/* The files of the NVRTC that was opened: the library, and the builtins
 * library it opens at its first compile (same directory). */
int symm_nvrtc_files(const symm_nvrtc_api *nv, char (*paths)[PATH_MAX], int max)
{
    Dl_info info;
    if (!nv || max < 1 || !dladdr((void *)nv->nvrtcVersion, &info) || !info.dli_fname || !info.dli_fname[0])
        return 0;
    int n = 0;
    if (snprintf(paths[n], PATH_MAX, "%s", info.dli_fname) < PATH_MAX)
        n++;
    const char *slash = strrchr(info.dli_fname, '/');
    const int dir = slash ? (int)(slash - info.dli_fname + 1) : 0;
    if (n < max && snprintf(paths[n], PATH_MAX, "%.*slibnvrtc-builtins.so.%d.%d", dir, info.dli_fname,
                            nv->major, nv->minor) < PATH_MAX && access(paths[n], R_OK) == 0)
        n++;
    return n;
}

/* Reads NVRTC's files once, so that the page cache holds them when the first
 * compile needs them. posix_fadvise(WILLNEED) is not enough: Linux reads
 * ahead at most the device's readahead window of it (measured: a quarter of
 * libnvrtc.so cached 300 ms later). The files are mapped by the caller, which
 * closes its descriptors at once (no descriptor outlives the call); a
 * detached thread touches every page of the mappings, then unmaps them. */
typedef struct mapped_file {
    void *at;
    size_t size;
} mapped_file;

static void *touch_files(void *arg)
{
    mapped_file *files = arg;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    /* The small builtins library first: the compile opens it early. */
    for (int i = 1; i >= 0; i--) {
        if (!files[i].at)
            continue;
        unsigned sum = 0;
        for (size_t off = 0; off < files[i].size; off += page)
            sum += ((volatile const unsigned char *)files[i].at)[off];
        (void)sum;
        munmap(files[i].at, files[i].size);
    }
    return NULL;
}

static void prefetch_files(void)
{
    static mapped_file files[2];
    char paths[2][PATH_MAX];
    pthread_once(&load_once, load_nvrtc);
    const int n = load_status == SYMM_OK ? symm_nvrtc_files(&api, paths, 2) : 0;
    int mapped = 0;
    for (int i = 0; i < n; i++) {
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        off_t size = lseek(fd, 0, SEEK_END);
        void *at = size > 0 ? mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
        close(fd);
        if (at == MAP_FAILED)
            continue;
        (void)madvise(at, (size_t)size, MADV_SEQUENTIAL);
        files[mapped++] = (mapped_file){at, (size_t)size};
    }
    if (!mapped)
        return;
    /* A detached thread that only reads: the caller goes on at once. */
    pthread_attr_t attr;
    pthread_t thread;
    int started = -1;
    if (pthread_attr_init(&attr) == 0) {
        if (pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0)
            started = pthread_create(&thread, &attr, touch_files, files);
        pthread_attr_destroy(&attr);
    }
    if (started != 0)
        for (int i = 0; i < mapped; i++)
            munmap(files[i].at, files[i].size);
}

void symm_nvrtc_prefetch(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, prefetch_files);
}

symm_status symm_jit_prefetch(void)
{
    symm_nvrtc_prefetch();
    if (load_status != SYMM_OK)
        return symm_fail(load_status, "%s", load_message);
    return SYMM_OK;
}
