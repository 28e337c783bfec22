/* nvrtc_api.h: the one place that knows how NVRTC is reached.
 *
 * libsymm does not link libnvrtc: it opens it at run time (libnvrtc.so.13,
 * then .12, by soname, then under $CUDA_HOME/lib64 and /usr/local/cuda/lib64)
 * so that the library loads where the CUDA toolkit is absent; compiling then
 * fails with SYMM_ERR_NVRTC "NVRTC is not available: ...". Internal; not
 * installed. */
#ifndef SYMM_NVRTC_API_H
#define SYMM_NVRTC_API_H

#include <stddef.h>

#include <nvrtc.h>

#include "internal.h"

/* Every NVRTC function the runtime calls. All of them exist since CUDA 11.1,
 * with the same signatures in 12.x and 13.x. */
#define SYMM_NVRTC_FUNCTIONS(X) \
    X(nvrtcVersion)             \
    X(nvrtcGetErrorString)      \
    X(nvrtcCreateProgram)       \
    X(nvrtcDestroyProgram)      \
    X(nvrtcCompileProgram)      \
    X(nvrtcGetProgramLogSize)   \
    X(nvrtcGetProgramLog)       \
    X(nvrtcGetCUBINSize)        \
    X(nvrtcGetCUBIN)            \
    X(nvrtcGetPTXSize)          \
    X(nvrtcGetPTX)

typedef struct symm_nvrtc_api {
#define SYMM_NVRTC_FIELD(name) __typeof__(&name) name;
    SYMM_NVRTC_FUNCTIONS(SYMM_NVRTC_FIELD)
#undef SYMM_NVRTC_FIELD
    int major, minor;  /* nvrtcVersion() of the library that was opened */
    char library[512]; /* the name or path it was opened by */
} symm_nvrtc_api;

/* NVRTC, opened once per process (thread-safe). SYMM_ERR_NVRTC with
 * "NVRTC is not available: ..." when no candidate library opens. */
symm_status symm_nvrtc(const symm_nvrtc_api **out);

/* Open the first of `candidates` (sonames or paths) that loads and has every
 * function; fills *api. Returns 0, or -1 with the reasons in why. Used by
 * symm_nvrtc() with the default candidates, and by tests. */
int symm_nvrtc_open(const char *const *candidates, size_t count, symm_nvrtc_api *api,
                    char *why, size_t why_size);

/* NVRTC's name for a result ("NVRTC_ERROR_COMPILATION"). */
const char *symm_nvrtc_error(const symm_nvrtc_api *api, nvrtcResult result);

#endif
