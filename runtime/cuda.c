/* cuda.c: opens libcuda.so.1 and resolves the driver functions the runtime
 * uses (cuda_syms.h) through cuGetProcAddress, at the ABI of the cuda.h we
 * compile against. */
#include <dlfcn.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"

static symm_cuda_api api;
static symm_status load_status = SYMM_ERR_NO_GPU;
static char load_message[1024];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

/* Every function of cuda_syms.h: the name cuGetProcAddress takes (stringified
 * here, before cuda.h's macros such as cuMemAlloc -> cuMemAlloc_v2 rename it),
 * the ABI version asked for, and where the pointer goes. */
static const struct {
    const char *name;
    int version;
    size_t offset;
} symbols[] = {
#define SYMM_CUDA_FN(name) {#name, CUDA_VERSION, offsetof(symm_cuda_api, name)},
#define SYMM_CUDA_FN_AT(name, version) {#name, version, offsetof(symm_cuda_api, name)},
#include "cuda_syms.h"
#undef SYMM_CUDA_FN
#undef SYMM_CUDA_FN_AT
};

size_t symm_cuda_symbol_count(void) { return SYMM_ARRAY_LEN(symbols); }

const char *symm_cuda_symbol_name(size_t i) { return i < SYMM_ARRAY_LEN(symbols) ? symbols[i].name : NULL; }

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static void load_driver(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        snprintf(load_message, sizeof load_message,
                 "no GPU driver: cannot open libcuda.so.1 (%s)", dlerror());
        return;
    }
    get_proc_fn get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
    if (!get_proc) {
        snprintf(load_message, sizeof load_message,
                 "the GPU driver is too old: libcuda.so.1 has no cuGetProcAddress_v2 "
                 "(expected a driver for CUDA %d.%d or newer)",
                 CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
        return;
    }
    for (size_t i = 0; i < SYMM_ARRAY_LEN(symbols); i++) {
        void **slot = (void **)((char *)&api + symbols[i].offset);
        CUdriverProcAddressQueryResult found;
        if (get_proc(symbols[i].name, slot, symbols[i].version, CU_GET_PROC_ADDRESS_DEFAULT, &found) !=
                CUDA_SUCCESS ||
            found != CU_GET_PROC_ADDRESS_SUCCESS || !*slot) {
            snprintf(load_message, sizeof load_message,
                     "the GPU driver lacks %s at CUDA %d.%d (update the driver)", symbols[i].name,
                     symbols[i].version / 1000, symbols[i].version % 1000 / 10);
            return;
        }
    }
    CUresult r = api.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char *name = "?";
        api.cuGetErrorName(r, &name);
        snprintf(load_message, sizeof load_message, "no GPU: cuInit failed: %s", name);
        return;
    }
    load_status = SYMM_OK;
}

symm_status symm_cuda(const symm_cuda_api **out)
{
    pthread_once(&load_once, load_driver);
    if (load_status != SYMM_OK)
        return symm_fail(load_status, "%s", load_message);
    *out = &api;
    return SYMM_OK;
}

symm_status symm_cuda_check(CUresult result, const char *what)
{
    if (result == CUDA_SUCCESS)
        return SYMM_OK;
    const char *name = "CUDA_ERROR_UNKNOWN", *text = "unknown error";
    if (api.cuGetErrorName)
        api.cuGetErrorName(result, &name);
    if (api.cuGetErrorString)
        api.cuGetErrorString(result, &text);
    symm_status st = result == CUDA_ERROR_OUT_OF_MEMORY ? SYMM_ERR_NOMEM : SYMM_ERR_CUDA;
    return symm_fail(st, "%s: %s (%s)", what, name, text);
}
