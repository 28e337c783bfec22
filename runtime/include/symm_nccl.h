/* symm_nccl.h: an NCCL communicator over the ranks of a world.
 *
 * NCCL is the reference backend of dispatch/combine and the baseline of the
 * benchmarks. libsymm does not link it: libnccl.so.2 is opened at run time
 * (the dynamic loader's search path, then $CUDA_HOME/lib{,64} and
 * /usr/local/cuda/lib{,64}), so that libsymm loads where NCCL is absent and
 * only these calls fail, with SYMM_ERR_NCCL.
 *
 * NVLink multicast (NVLS) must stay off: before its first NCCL call libsymm
 * sets NCCL_NVLS_ENABLE=0 in the environment unless it is already set. */
#ifndef SYMM_NCCL_H
#define SYMM_NCCL_H

#include <stdbool.h>

#include "symm_heap.h"
#include "symm_status.h"
#include "symm_world.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct symm_nccl symm_nccl;

/* Collective. Build a communicator of the world's ranks on dev's GPU (dev
 * must have been opened on world; its context is made current on the calling
 * thread): rank 0 makes the unique id, the world broadcasts it, every rank
 * calls ncclCommInitRank. NCCL needs one GPU per rank: when two ranks share
 * one, every rank gets SYMM_ERR_UNSUPPORTED naming them, before NCCL is
 * called, unless every rank runs in the shared-GPU mode (below).
 * SYMM_ERR_NCCL when NCCL is missing or fails (its own words in the
 * message). */
symm_status symm_nccl_create(symm_world *world, symm_device *dev, symm_nccl **out);

/* The shared-GPU mode, for tests on a host with fewer GPUs than ranks: true
 * when SYMM_NCCL_SHARED_GPU=1 and NCCL_HOSTID is set, as `symmrun
 * --nccl-shared-gpu` sets them (NCCL_HOSTID different for every rank,
 * NCCL_SOCKET_IFNAME=lo and NCCL_IB_DISABLE=1 unless already set). NCCL
 * then takes each rank for a host of its own and joins them by its socket
 * transport over loopback instead of refusing a GPU it sees twice: the
 * results are NCCL's, the speed is not NVLink's. */
bool symm_nccl_shared_gpu_mode(void);

/* Free the communicator (ncclCommDestroy, or ncclCommAbort after an
 * asynchronous error, which would make a destroy wait for dead peers).
 * NULL: SYMM_OK. */
symm_status symm_nccl_destroy(symm_nccl *nccl);

/* Free the communicator without waiting for peers (ncclCommAbort): for error
 * paths where a peer may be gone. NULL: SYMM_OK. */
symm_status symm_nccl_abort(symm_nccl *nccl);

/* The ncclComm_t, as void * so that this header does not need nccl.h. */
void *symm_nccl_comm(const symm_nccl *nccl);

/* SYMM_ERR_NCCL with NCCL's message when the communicator has recorded an
 * asynchronous error (ncclCommGetAsyncError); SYMM_OK otherwise. */
symm_status symm_nccl_check_async(symm_nccl *nccl);

/* NCCL's version code (e.g. 22809 for 2.28.9) of the library libsymm loads;
 * SYMM_ERR_NCCL when none can be loaded. */
symm_status symm_nccl_version(int *version);

#ifdef __cplusplus
}
#endif
#endif
