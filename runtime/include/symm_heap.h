/* symm_heap.h: the GPU of a rank and the symmetric heap over it.
 *
 * symm_device is the GPU a rank of a world runs on: its primary context, its
 * properties, and where every other rank's GPU is. symm_alloc is one
 * symmetric allocation: the same number of bytes on every rank, made with the
 * CUDA virtual memory API (cuMemCreate), shared as POSIX file descriptors and
 * mapped into every rank, so that each rank holds a pointer to every peer's
 * buffer (and, on request, one contiguous view of all of them).
 *
 * Calls marked "collective" must be made by every rank of the world, in the
 * same order; they either succeed on every rank or fail on every rank (a rank
 * whose own step failed returns that error, the others SYMM_ERR_PEER naming
 * it). Two ranks may share a GPU. NVLink multicast is never used.
 *
 * The world and the device must outlive every allocation made with them. */
#ifndef SYMM_HEAP_H
#define SYMM_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "symm_status.h"
#include "symm_world.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct symm_device symm_device;
typedef struct symm_alloc symm_alloc;

/* ---- the rank's GPU ------------------------------------------------------ */

/* Collective. Open this rank's GPU: device symm_world_device(world) modulo the
 * number of visible devices (local rank when that is negative); retain its
 * primary context and make it current on the calling thread. Checks that the
 * GPU supports virtual memory management and POSIX file descriptor handles,
 * and that every pair of ranks' GPUs can access each other (ranks that share
 * a GPU need nothing; a peer GPU this process cannot see is not checked).
 * SYMM_ERR_NO_GPU when there is no driver or device, SYMM_ERR_UNSUPPORTED
 * naming the GPU, the attribute or the pair of ranks otherwise. */
symm_status symm_device_open(symm_world *world, symm_device **out);

/* Release the primary context (not collective). SYMM_ERR_STATE, and nothing
 * is released, while allocations made on dev are still live. NULL: SYMM_OK. */
symm_status symm_device_close(symm_device *dev);

CUdevice symm_device_handle(const symm_device *dev);
CUcontext symm_device_context(const symm_device *dev);
int symm_device_ordinal(const symm_device *dev);
int symm_device_sm_count(const symm_device *dev);
int symm_device_cc_major(const symm_device *dev);
int symm_device_cc_minor(const symm_device *dev);
/* Bytes every symmetric allocation is rounded up to (the VMM granularity
 * for POSIX-fd-shareable memory on this GPU; 2 MiB on Hopper). */
size_t symm_device_granularity(const symm_device *dev);
/* The world the device was opened on. */
symm_world *symm_device_world(const symm_device *dev);
/* Distinct GPUs among the world's ranks (by UUID); less than the world's size
 * when ranks share a GPU. */
int symm_device_gpu_count(const symm_device *dev);
/* Which of those GPUs rank runs on (0..gpu_count-1, numbered in order of
 * first appearance by rank), or -1 for a rank outside the world. */
int symm_device_gpu_index(const symm_device *dev, int rank);
/* Whether this rank's context on the GPU is a CUDA MPS client
 * (CU_DEVICE_ATTRIBUTE_MPS_ENABLED): ranks sharing a GPU then run at once
 * instead of taking turns. */
bool symm_device_mps(const symm_device *dev);
/* Ranks of the world on this rank's GPU, itself included. */
int symm_device_ranks_here(const symm_device *dev);

/* ---- symmetric allocations ----------------------------------------------- */

/* Also map every rank's buffer into one virtual range, rank r's at
 * view + r * stride (stride = the rounded size). */
#define SYMM_ALLOC_CONTIGUOUS 0x1u

/* Collective. Allocate bytes (rounded up to symm_device_granularity) on every
 * rank and map every rank's buffer into every rank with read/write access;
 * the memory is zero on every rank when the call returns. bytes, flags and
 * the allocation's sequence number (its position among this device's
 * symm_alloc_create calls) must agree on every rank: SYMM_ERR_MISMATCH names
 * two ranks and their values otherwise. dev must have been opened on world.
 * All or nothing: a failure at any step releases everything, on every rank,
 * and a retry starts clean. */
symm_status symm_alloc_create(symm_world *world, symm_device *dev, size_t bytes,
                              unsigned flags, symm_alloc **out);

/* Collective. Wait until every rank is done with the memory (this rank's
 * context is synchronised, then a barrier), then unmap the view and the peer
 * mappings, free the reservations, release the handles and free the peer
 * table. When the barrier fails (a peer died), everything is still released
 * locally and the barrier's error returned. NULL: SYMM_OK. */
symm_status symm_alloc_destroy(symm_alloc *alloc);

/* This rank's buffer, in its own mapping. */
CUdeviceptr symm_alloc_local(const symm_alloc *alloc);
/* Rank rank's buffer mapped into this rank (rank == own rank: the local
 * mapping); 0 for a rank outside the world. */
CUdeviceptr symm_alloc_peer(const symm_alloc *alloc, int rank);
/* Device memory holding the world-size array of peer pointers
 * (unsigned long long, rank order), for kernels. */
CUdeviceptr symm_alloc_peer_table(const symm_alloc *alloc);
/* The contiguous view and its stride; 0 unless created with
 * SYMM_ALLOC_CONTIGUOUS. */
CUdeviceptr symm_alloc_view(const symm_alloc *alloc);
size_t symm_alloc_stride(const symm_alloc *alloc);
/* Usable bytes (the rounded size) and the bytes asked for. */
size_t symm_alloc_size(const symm_alloc *alloc);
size_t symm_alloc_requested(const symm_alloc *alloc);
/* Position among the device's symm_alloc_create calls (0, 1, ...). */
uint64_t symm_alloc_seq(const symm_alloc *alloc);
symm_world *symm_alloc_world(const symm_alloc *alloc);
symm_device *symm_alloc_device(const symm_alloc *alloc);

/* Whether [ptr, ptr + bytes) lies wholly inside the local mapping of a live
 * symmetric allocation of this process (peer mappings and views do not
 * count). SYMM_OK with *owner and *offset (ptr - local) when it does;
 * SYMM_ERR_INVALID_ARG saying why not (outside every allocation, or running
 * past the end of one) otherwise. Thread-safe; the owner stays valid only
 * while nobody destroys it. */
symm_status symm_alloc_find(CUdeviceptr ptr, size_t bytes, symm_alloc **owner, size_t *offset);

/* bytes rounded up to a multiple of granularity, in *out. SYMM_ERR_INVALID_ARG
 * for bytes 0, granularity 0, or a result that does not fit in size_t. */
symm_status symm_heap_round_up(size_t bytes, size_t granularity, size_t *out);

#ifdef __cplusplus
}
#endif
#endif
