/* cuda.c: opens libcuda.so.1 and resolves the driver functions the runtime
 * uses (cuda_syms.h) through cuGetProcAddress, at the ABI of the cuda.h we
 * compile against. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"

static symm_cuda_api api;
static symm_status load_status = SYMM_ERR_NO_GPU;
static char load_message[1024];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

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
    CUdriverProcAddressQueryResult found;
#define SYMM_CUDA_FN_AT(name, version)                                             \
    if (get_proc(#name, (void **)&api.name, version, CU_GET_PROC_ADDRESS_DEFAULT,  \
                 &found) != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS ||   \
        !api.name) {                                                               \
        snprintf(load_message, sizeof load_message,                               \
                 "the GPU driver lacks %s at CUDA %d.%d (update the driver)", #name, \
                 (version) / 1000, (version) % 1000 / 10);                         \
        return;                                                                    \
    }
#define SYMM_CUDA_FN(name) SYMM_CUDA_FN_AT(name, CUDA_VERSION)
#include "cuda_syms.h"
#undef SYMM_CUDA_FN
#undef SYMM_CUDA_FN_AT
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
