/* cuda_api.h: the one place that knows how the CUDA driver is reached.
 *
 * libsymm does not link libcuda: it opens libcuda.so.1 at run time and
 * resolves each function of cuda_syms.h through cuGetProcAddress, so that the
 * library (and its CPU reference) loads on machines without a GPU driver, where
 * GPU calls then fail with SYMM_ERR_NO_GPU. Internal; not installed. */
#ifndef SYMM_CUDA_API_H
#define SYMM_CUDA_API_H

#include <cuda.h>

#include "internal.h"

typedef struct symm_cuda_api {
#define SYMM_CUDA_FN(name) __typeof__(&name) name;
#define SYMM_CUDA_FN_AT(name, version) __typeof__(&name) name;
#include "cuda_syms.h"
#undef SYMM_CUDA_FN
#undef SYMM_CUDA_FN_AT
} symm_cuda_api;

/* The driver's functions, loaded once per process (thread-safe) and cuInit'ed.
 * SYMM_ERR_NO_GPU with a message when libcuda.so.1 is missing or cuInit fails. */
symm_status symm_cuda(const symm_cuda_api **out);

/* The driver functions resolved, by the names given to cuGetProcAddress
 * (for tests: they must be base names, never cuMemAlloc_v2). */
size_t symm_cuda_symbol_count(void);
const char *symm_cuda_symbol_name(size_t i);

/* Turn a CUresult into a status: SYMM_OK, or SYMM_ERR_CUDA (SYMM_ERR_NOMEM
 * for CUDA_ERROR_OUT_OF_MEMORY) with the message
 * "<what>: CUDA_ERROR_NAME (description)". */
symm_status symm_cuda_check(CUresult result, const char *what);

/* Call a driver function and propagate a failure with the call's text:
 *     SYMM_CU(cu, cuMemAlloc(&p, n));  where cu is a const symm_cuda_api *. */
#define SYMM_CU(api, call) SYMM_TRY(symm_cuda_check((api)->call, #call))

#endif
