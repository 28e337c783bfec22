/* nccl_api.h: the one place that knows how NCCL is reached (like cuda_api.h
 * for the driver): the functions of libnccl.so.2, resolved with dlsym at run
 * time. Internal; not installed. The NCCL backend of dispatch/combine calls
 * through this table:
 *     const symm_nccl_api *nc;  SYMM_TRY(symm_nccl_load(&nc));
 *     SYMM_NCCL(nc, comm, ncclSend(buf, n, ncclBfloat16, peer, comm, stream)); */
#ifndef SYMM_NCCL_API_H
#define SYMM_NCCL_API_H

#include <nccl.h>

#include "internal.h"

/* Every NCCL function the runtime calls; add one here to use it. */
#define SYMM_NCCL_FUNCTIONS(X) \
    X(ncclGetVersion)          \
    X(ncclGetUniqueId)         \
    X(ncclCommInitRank)        \
    X(ncclCommDestroy)         \
    X(ncclCommAbort)           \
    X(ncclCommGetAsyncError)   \
    X(ncclGetErrorString)      \
    X(ncclGetLastError)        \
    X(ncclGroupStart)          \
    X(ncclGroupEnd)            \
    X(ncclSend)                \
    X(ncclRecv)                \
    X(ncclAllReduce)           \
    X(ncclAllGather)

typedef struct symm_nccl_api {
#define SYMM_NCCL_FIELD(name) __typeof__(&name) name;
    SYMM_NCCL_FUNCTIONS(SYMM_NCCL_FIELD)
#undef SYMM_NCCL_FIELD
    int version;        /* ncclGetVersion of the loaded library */
    char path[512];     /* which file was loaded */
} symm_nccl_api;

/* NCCL's functions, loaded once per process (thread-safe). SYMM_ERR_NCCL
 * "NCCL is not available: cannot open libnccl.so.2 (...)" without it. */
symm_status symm_nccl_load(const symm_nccl_api **out);

/* Turn an ncclResult_t into a status: SYMM_OK, or SYMM_ERR_NCCL with the
 * message "<what>: <ncclGetErrorString> (<ncclGetLastError(comm)>)"; comm
 * may be NULL. */
symm_status symm_nccl_check(const symm_nccl_api *api, ncclComm_t comm, ncclResult_t result,
                            const char *what);

/* Call an NCCL function and propagate a failure with the call's text. */
#define SYMM_NCCL(api, comm, call) SYMM_TRY(symm_nccl_check((api), (comm), (api)->call, #call))

#endif
