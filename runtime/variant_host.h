/* variant_host.h: the host side that the NCCL backend (variant_nccl.c) and
 * the hybrid backend (variant_hybrid.c) share, so that a fix to the wait or
 * the failure path lands in both: the communicator, the event after each
 * call's work and the sticky failure (symm_vhost), the polling host wait,
 * the refusal of stream capture, the NCCL group helpers, the pinned and
 * device allocations and the grid of a grid-stride kernel. Internal.
 *
 * Where the two backends differ, the difference is a parameter:
 *   - the backend's name in messages ("NCCL backend", "hybrid backend");
 *   - who makes a failed wait sticky (symm_vhost_sticky);
 *   - the reason a backend gives when it refuses stream capture. */
#ifndef SYMM_VARIANT_HOST_H
#define SYMM_VARIANT_HOST_H

#include <stdbool.h>
#include <stddef.h>

#include "cuda_api.h"
#include "nccl_api.h"
#include "symm_nccl.h"
#include "variant_internal.h"

/* Who makes a wait's timeout or NCCL error sticky. */
typedef enum symm_vhost_sticky {
    /* The wait itself (the NCCL backend: only a wait's timeout or NCCL
     * error is sticky; other failures of a call are not). */
    SYMM_VHOST_WAIT_STICKY,
    /* The caller (the hybrid backend, which makes every failed dispatch,
     * combine or quiesce sticky, the waits' among them): the wait only
     * reports. */
    SYMM_VHOST_CALLER_STICKY,
} symm_vhost_sticky;

typedef struct symm_vhost {
    const char *backend;      /* "NCCL backend": in messages */
    symm_vhost_sticky sticky;
    symm_nccl *comm;          /* NULL before create and once aborted */
    CUevent done;             /* recorded after each call's work: the next
                                 dispatch's stream, quiesce and destroy wait for it */
    symm_status failed;       /* a call failed: later calls fail with this */
    char failure[512];        /* ... and this message */
} symm_vhost;

/* An empty state (no communicator, no event, no failure). */
void symm_vhost_init(symm_vhost *h, const char *backend, symm_vhost_sticky sticky);

/* Free the listed pinned (hosts) and device (devs) buffers, NULL or 0
 * entries skipped, and the done event (with cu; cu NULL: the driver is
 * gone and none of them is freed), then the communicator. */
void symm_vhost_release(symm_vhost *h, const symm_cuda_api *cu, void *const *hosts, size_t n_hosts,
                        const CUdeviceptr *devs, size_t n_devs);

/* Pinned host memory and device memory of bytes (16 when bytes is 0, so
 * that every buffer is a real one); a failure names the call and the
 * backend: "cuMemAllocHost (NCCL backend): CUDA_ERROR_...". */
symm_status symm_vhost_host_alloc(const symm_vhost *h, const symm_cuda_api *cu, void *out, size_t bytes);
symm_status symm_vhost_dev_alloc(const symm_vhost *h, const symm_cuda_api *cu, CUdeviceptr *out, size_t bytes);

/* Record the failure in symm_last_error() as sticky (st, not SYMM_OK) and
 * abort the communicator (no more NCCL calls on it; the abort makes NCCL's
 * kernels that still wait for a peer on this GPU return). Returns st with
 * the same message. */
symm_status symm_vhost_fail(symm_vhost *h, symm_status st);

/* SYMM_OK when h is NULL or no call failed; else the sticky status with
 * "NAME OP (BACKEND): an earlier call failed: MESSAGE". */
symm_status symm_vhost_failure(const symm_vhost *h, const symm_variant *v, const char *op);

/* Wait until the stream's work (use_stream) or the last call's (the event
 * done) is complete. Polls: spins for the first 200 us, then gives the CPU
 * away between polls. SYMM_ERR_NCCL when the communicator reports an
 * asynchronous error, SYMM_ERR_TIMEOUT after the variant's timeout, both
 * made sticky here under SYMM_VHOST_WAIT_STICKY; a failed query is
 * SYMM_ERR_CUDA (not sticky). what names the work in messages. */
symm_status symm_vhost_wait(symm_vhost *h, const symm_variant *v, const symm_cuda_api *cu, CUstream stream,
                            bool use_stream, const char *what);

/* SYMM_ERR_STATE "NAME OP: REASON" when stream is being captured (or its
 * capture was invalidated): the backends wait on the host, which a graph
 * cannot. reason is the backend's sentence, e.g. "the NCCL backend cannot
 * run inside CUDA graph capture (...); use ...". */
symm_status symm_vhost_refuse_capture(const symm_variant *v, const symm_cuda_api *cu, CUstream stream,
                                      const char *op, const char *reason);

/* Inside an NCCL group (st, nc and comm in scope: a symm_status, a const
 * symm_nccl_api * and an ncclComm_t): the first failure is kept in st and
 * the rest of the group's operations are skipped; symm_vhost_group_end
 * closes the group whatever failed, so that no group stays open on this
 * thread, and returns the first failure. */
#define SYMM_GROUP_OP(call)                                                             \
    do {                                                                                \
        if (st == SYMM_OK)                                                              \
            st = symm_nccl_check(nc, comm, nc->call, #call);                            \
    } while (0)

symm_status symm_vhost_group_end(const symm_nccl_api *nc, ncclComm_t comm, symm_status st);

/* Blocks of a grid-stride kernel over items, per_block (> 0) items a block:
 * at least 1 (a launch of no blocks is an error, and a kernel over no
 * items returns at once) and at most 4096. */
unsigned symm_vhost_grid(int64_t items, int per_block);

#endif
