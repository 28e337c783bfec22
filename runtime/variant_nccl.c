/* variant_nccl.c: the NCCL backend of dispatch and combine: the same API,
 * the same rows in the same order and the same sums as the native kernels, with
 * the rows moved by NCCL send/receive. It is the reference of the GPU tests,
 * the baseline of the benchmarks and (later) the path to other hosts.
 *
 * Dispatch counts this rank's rows per destination on the GPU, with the
 * rules of the native kernels, exchanges the count rows with an NCCL
 * all-gather and waits for them on the host (its one stream
 * synchronisation: NCCL needs the sizes on the host), plans from them the
 * runs of rows to send and receive (runtime/nccl_plan.c), packs this
 * rank's rows per destination on the GPU and moves every contiguous run of destination
 * rows ("chunk": a destination rank for layout rank, a destination (rank,
 * expert) for layout expert) as one run per peer and array: one NCCL send
 * and receive per peer and array, whatever the experts (nccl_plan.h).
 * Layout rank receives each run straight into its rows; layout expert
 * receives the runs into a receive stage and symm_nccl_unstage moves each
 * chunk to its expert's segment. This rank's rows for itself never go
 * through NCCL: the pack kernel writes their metadata and the gather kernel
 * their rows of x straight to their received rows. Combine sends each
 * peer's rows of y back as one run (layout expert: gathered into the stage
 * first, symm_nccl_restage), moves what comes back into COMBINE_IN (a
 * pulling variant has none: a buffer of this backend's own with its layout)
 * and runs the native sum, which reads this rank's own rows from y. Dispatch
 * returns once its work is queued; the next dispatch queues its work after
 * the last call's (an event) and rewrites the host buffers only after its
 * own wait. Because the host waits
 * inside dispatch, a call during stream capture is refused.
 *
 * Every host wait polls (variant_host.c, shared with the hybrid backend),
 * watching NCCL's asynchronous error and the variant's timeout: when a peer does not arrive, the call fails with
 * SYMM_ERR_TIMEOUT, the communicator is aborted (which releases NCCL's
 * kernels still waiting on this GPU), and every later call fails at once
 * with the same error until the variant is destroyed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
#include "nccl_api.h"
#include "nccl_plan.h"
#include "heap_internal.h"
#include "symm_nccl.h"
#include "variant_host.h"
#include "variant_internal.h"

typedef symm_nccl_chunk chunk;

/* Blocks of the GPU count (symm_nccl_count): each a contiguous run of the
 * tokens; symm_nccl_scan adds them up in one thread per bin. */
enum { PLAN_BLOCKS = 32 };

struct symm_variant_nccl {
    symm_vhost vhost;    /* the communicator, the event after each call's work (the next dispatch's
                            stream, and destroy, wait for it), the sticky failure (a wait timed out
                            or NCCL failed: later calls fail with it) */
    const symm_nccl_api *api;
    int bins;            /* entries of a count row */
    int max_dests;       /* most destinations of one token */
    int64_t max_send;    /* max_tokens * max_dests */
    int plan_wpb;        /* warps per block of symm_nccl_count (PLAN_BLOCKS blocks) */
    /* host (pinned) */
    int32_t *h_counts;   /* [world, bins] */
    int32_t *h_info;     /* [4]: T, clamped, invalid ids (symm_nccl_count, symm_nccl_scan) */
    int32_t *h_bins;     /* [2, bins]: the plan's base, for symm_nccl_pack */
    int32_t *h_expert;   /* [2, local experts]: count, offset */
    int32_t *h_unstage;  /* layout expert: [world * local experts][2], per chunk from a peer its
                            first stage row and first received row (symm_nccl_unstage) */
    device_state *h_state;
    /* device */
    CUdeviceptr d_counts, d_info, d_bins, d_work, d_send_index, d_stage_index, d_send_x, d_send_scales,
        d_send_src, d_send_topk, d_send_weights, d_stage, d_self_dst;
    /* layout expert: the receive stage (stage_cap rows; x's rows are as wide as the wider of a
       dispatched and a combined row: combine gathers y there) and its chunk list */
    CUdeviceptr d_unstage, d_rstage_x, d_rstage_scales, d_rstage_src, d_rstage_weights;
    int64_t stage_cap;
    int n_unstage;       /* chunks in d_unstage (the last dispatch's) */
    CUdeviceptr d_combine_in; /* combine = "pull": where the peers' rows land (the
                                 variant has no COMBINE_IN region), else 0 */
    /* the routing of the last dispatch (its arrays are the pinned ones above) */
    symm_nccl_plan plan;
    chunk *send_chunks, *recv_chunks, *send_runs, *recv_runs;
    int64_t *base;       /* [2 * bins]: the plan's scratch */
    uint64_t calls;
};

static const char capture_reason[] = "the NCCL backend cannot run inside CUDA graph capture (it needs the counts "
                                     "on the host); use the native backend in graphs";

static symm_status nccl_buffers(symm_variant *v);
static symm_status connect_peers(symm_variant *v);

symm_status symm_variant_nccl_setup(symm_variant *v)
{
    /* The allocations are local; the communicator is collective: every rank
     * learns whether all allocations succeeded before it is made. */
    struct symm_variant_nccl *n = calloc(1, sizeof *n);
    v->nccl = n;
    if (n)
        symm_vhost_init(&n->vhost, "NCCL backend", SYMM_VHOST_WAIT_STICKY);
    symm_status local = n ? nccl_buffers(v) : symm_fail(SYMM_ERR_NOMEM, "NCCL backend: out of host memory");
    SYMM_TRY(symm_agree(v->world, local, "NCCL backend: allocating buffers"));
    SYMM_TRY(symm_nccl_create(v->world, v->dev, &n->vhost.comm));
    return symm_agree(v->world, connect_peers(v), "NCCL backend: connecting the peers");
}

static symm_status nccl_buffers(symm_variant *v)
{
    struct symm_variant_nccl *n = v->nccl;
    const symm_variant_desc *d = v->desc;
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    SYMM_TRY(symm_nccl_load(&n->api));
    const int W = d->world, K = d->topk, L = d->experts / d->world;
    const size_t T = (size_t)d->max_tokens, H = (size_t)d->hidden;
    const int expert = d->layout == SYMM_LAYOUT_EXPERT;
    n->bins = expert ? d->experts : W;
    n->max_dests = expert ? K : (K < W ? K : W);
    n->max_send = (int64_t)T * n->max_dests;
    n->send_chunks = calloc((size_t)W * (expert ? L : 1), sizeof(chunk));
    n->recv_chunks = calloc((size_t)W * (expert ? L : 1), sizeof(chunk));
    n->send_runs = calloc((size_t)W, sizeof(chunk));
    n->recv_runs = calloc((size_t)W, sizeof(chunk));
    n->base = calloc((size_t)2 * n->bins, sizeof *n->base);
    if (!n->send_chunks || !n->recv_chunks || !n->send_runs || !n->recv_runs || !n->base)
        return symm_fail(SYMM_ERR_NOMEM, "NCCL backend: out of host memory");
    const size_t S = (size_t)n->max_send, row = H * symm_dtype_size(d->dtype);
    const size_t crow = H * symm_dtype_size(d->combine_dtype), sc = H / SYMM_FP8_BLOCK * 4;
    /* symm_nccl_count's warps per block: 8, fewer where 8 rows of counters
     * would take more than 32 KiB of shared memory. */
    n->plan_wpb = 32768 / (n->bins * 4);
    n->plan_wpb = n->plan_wpb > 8 ? 8 : n->plan_wpb < 1 ? 1 : n->plan_wpb;
    const size_t work = ((size_t)PLAN_BLOCKS * n->plan_wpb * n->bins + (size_t)PLAN_BLOCKS * n->bins + PLAN_BLOCKS) * 4;
    const symm_vhost *vh = &n->vhost;
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &n->h_counts, (size_t)W * n->bins * 4));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &n->h_info, 16));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &n->h_bins, (size_t)2 * n->bins * 4));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &n->h_expert, (size_t)2 * L * 4));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &n->h_state, sizeof(device_state)));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_counts, (size_t)W * n->bins * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_info, 16));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_bins, (size_t)2 * n->bins * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_work, work));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_send_index, S * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_stage_index, S * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_send_x, S * row));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_send_scales, d->dtype == SYMM_DTYPE_FP8_E4M3 ? S * sc : 16));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_send_src, S * 16));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_send_topk, S * K * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_send_weights, S * K * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_stage, S * crow));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_self_dst, S * 4));
    /* A pulling variant's symmetric buffer has no COMBINE_IN (its native
     * combine reads the peers' y): this backend's rows land in a buffer of
     * its own, with COMBINE_IN's layout ([world][max_tokens] or
     * [max_tokens][topk] rows). combine = "auto" has COMBINE_IN (for its
     * pushing form) and lands them there, so y may lie anywhere, as with
     * "push": the form this backend takes is the same either way. */
    if (expert) {
        /* At most what the peers can send this rank, below its capacity:
         * 1.4 GB at world 4, T = 4096, hidden 7168, top-8, bf16. */
        n->stage_cap = symm_nccl_stage_capacity(W, n->max_send, d->capacity);
        const size_t R = (size_t)n->stage_cap, wide = row > crow ? row : crow;
        SYMM_TRY(symm_vhost_host_alloc(vh, cu, &n->h_unstage, (size_t)W * L * 8));
        SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_unstage, (size_t)W * L * 8));
        SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_rstage_x, R * wide));
        SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_rstage_scales,
                                      d->dtype == SYMM_DTYPE_FP8_E4M3 ? R * sc : 16));
        SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_rstage_src, R * 16));
        SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_rstage_weights, d->weights ? R * 4 : 16));
    }
    if (!d->regions[SYMM_REGION_COMBINE_IN].bytes)
        SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &n->d_combine_in, (expert ? T * (size_t)K : (size_t)W * T) * crow));
    SYMM_CU(cu, cuEventCreate(&n->vhost.done, CU_EVENT_DISABLE_TIMING));
    n->plan = (symm_nccl_plan){
        .world = W, .rank = v->rank, .experts = d->experts, .align = d->align, .expert_layout = expert,
        .capacity = d->capacity, .bins = n->bins, .counts = n->h_counts, .expert = n->h_expert,
        .base = n->base, .send_chunks = n->send_chunks, .recv_chunks = n->recv_chunks,
        .send_runs = n->send_runs, .recv_runs = n->recv_runs,
    };
    return SYMM_OK;
}

void symm_variant_nccl_release(symm_variant *v)
{
    struct symm_variant_nccl *n = v->nccl;
    const symm_cuda_api *cu;
    if (!n)
        return;
    void *hosts[] = {n->h_counts, n->h_info, n->h_bins, n->h_expert, n->h_state, n->h_unstage};
    const CUdeviceptr devs[] = {n->d_counts, n->d_info, n->d_bins, n->d_work, n->d_send_index, n->d_stage_index,
                                n->d_send_x, n->d_send_scales, n->d_send_src, n->d_send_topk, n->d_send_weights,
                                n->d_stage, n->d_self_dst, n->d_combine_in, n->d_unstage, n->d_rstage_x,
                                n->d_rstage_scales, n->d_rstage_src, n->d_rstage_weights};
    symm_vhost_release(&n->vhost, symm_cuda(&cu) == SYMM_OK ? cu : NULL, hosts, SYMM_ARRAY_LEN(hosts), devs,
                       SYMM_ARRAY_LEN(devs));
    free(n->send_chunks);
    free(n->recv_chunks);
    free(n->send_runs);
    free(n->recv_runs);
    free(n->base);
    free(n);
    v->nccl = NULL;
}

symm_status symm_variant_nccl_refuse_capture(const symm_variant *v, CUstream stream, const char *op)
{
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    return symm_vhost_refuse_capture(v, cu, stream, op, capture_reason);
}

symm_status symm_variant_nccl_failure(const symm_variant *v, const char *op)
{
    return symm_vhost_failure(v->nccl ? &v->nccl->vhost : NULL, v, op);
}

/* Wait (symm_vhost_wait) for the stream's work (use_stream) or the last
 * call's: a timeout or NCCL's error is sticky, and aborts the communicator. */
static symm_status wait_work(symm_variant *v, CUstream stream, bool use_stream, const char *what)
{
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    return symm_vhost_wait(&v->nccl->vhost, v, cu, stream, use_stream, what);
}

/* The count all-gather: every rank's count row into d_counts. Dispatch's and
 * create's (connect_peers) are this one call, so that they take the same
 * algorithm. */
static symm_status queue_count_gather(symm_variant *v, CUstream stream)
{
    struct symm_variant_nccl *n = v->nccl;
    const symm_nccl_api *nc = n->api;
    ncclComm_t comm = (ncclComm_t)symm_nccl_comm(n->vhost.comm);
    const CUdeviceptr mine = n->d_counts + (size_t)v->rank * n->bins * 4;
    return symm_nccl_check(nc, comm, nc->ncclAllGather((const void *)mine, (void *)n->d_counts, (size_t)n->bins,
                                                       ncclInt32, comm, stream),
                           "ncclAllGather");
}

/* NCCL connects peers inside the host calls of a communicator's first
 * operations (per peer and direction for send and receive, per algorithm for
 * a collective) and waits there for the peer with no timeout of its own. So
 * that no later call can wait there, the operations dispatch and combine make
 * run once now, while every rank is in create: the count all-gather (the
 * same size, hence the same algorithm) and a send to and a receive from
 * every peer. A peer that stops arriving later leaves only NCCL's kernels
 * waiting, and every host wait times those out. */
static symm_status connect_peers(symm_variant *v)
{
    struct symm_variant_nccl *n = v->nccl;
    const symm_nccl_api *nc = n->api;
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    ncclComm_t comm = (ncclComm_t)symm_nccl_comm(n->vhost.comm);
    const int W = v->desc->world, me = v->rank;
    CUstream stream;
    SYMM_CU(cu, cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    symm_status st = queue_count_gather(v, stream);
    if (st == SYMM_OK && (st = symm_nccl_check(nc, comm, nc->ncclGroupStart(), "ncclGroupStart")) == SYMM_OK) {
        for (int p = 0; p < W; p++) {
            if (p == me)
                continue;
            SYMM_GROUP_OP(ncclSend((const void *)n->d_send_src, 16, ncclUint8, p, comm, stream));
            SYMM_GROUP_OP(ncclRecv((void *)n->d_stage, 16, ncclUint8, p, comm, stream));
        }
        st = symm_vhost_group_end(nc, comm, st);
    }
    if (st == SYMM_OK)
        st = wait_work(v, stream, true, "connecting the peers (NCCL)");
    cu->cuStreamDestroy(stream);
    if (st != SYMM_OK)
        symm_fail_context(st, "rank %d: ", me);
    return st;
}

symm_status symm_variant_nccl_sync(symm_variant *v, CUstream stream, const char *op)
{
    SYMM_TRY(symm_variant_nccl_failure(v, op));
    char what[96];
    snprintf(what, sizeof what, "the stream's work (%s)", op);
    return wait_work(v, stream, true, what);
}

symm_status symm_variant_nccl_quiesce(symm_variant *v)
{
    struct symm_variant_nccl *n = v->nccl;
    if (!n || !n->vhost.done || n->vhost.failed)
        return SYMM_OK;
    return wait_work(v, NULL, false, "the last call's work");
}

/* One of the backend's kernels that take a warp a row, over rows rows. */
static symm_status launch_warp_rows(CUfunction fn, int64_t rows, void **params, CUstream stream, const char *what)
{
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    enum { WARPS = 8 };
    return symm_cuda_check(
        cu->cuLaunchKernel(fn, symm_vhost_grid(rows, WARPS), 1, 1, WARPS * 32, 1, 1, 0, stream, params, NULL), what);
}

/* symm_nccl_scatter: stage row i < rows to COMBINE_IN slot slot[i] (-1:
 * none). */
static symm_status launch_scatter(const symm_variant *v, CUdeviceptr stage, CUdeviceptr slot, int64_t rows,
                                  CUdeviceptr combine_in, CUstream stream)
{
    if (rows <= 0)
        return SYMM_OK;
    void *params[] = {&stage, &slot, &rows, &combine_in};
    return launch_warp_rows(v->fn_nccl_scatter, rows, params, stream, "launch of symm_nccl_scatter");
}

/* Layout expert: the peers' rows from the receive stage to their rows
 * (symm_nccl_unstage). */
static symm_status launch_unstage(const symm_variant *v, const symm_recv_buffers *rb, CUstream stream)
{
    const struct symm_variant_nccl *n = v->nccl;
    CUdeviceptr stage_x = n->d_rstage_x, stage_scales = n->d_rstage_scales, stage_src = n->d_rstage_src;
    CUdeviceptr stage_weights = n->d_rstage_weights, chunks = n->d_unstage;
    CUdeviceptr recv_x = rb->x, recv_scales = rb->scales, recv_src = rb->src, recv_weights = rb->weights;
    int m = n->n_unstage;
    int64_t rows = n->plan.stage_rows;
    void *params[] = {&stage_x, &stage_scales, &stage_src, &stage_weights, &chunks, &m, &rows,
                      &recv_x, &recv_scales, &recv_src, &recv_weights};
    return launch_warp_rows(v->fn_nccl_unstage, rows, params, stream, "launch of symm_nccl_unstage");
}

/* Layout expert's combine: the rows of y that go back to the peers into the
 * receive stage, each peer's as one run (symm_nccl_restage). */
static symm_status launch_restage(const symm_variant *v, const void *y, CUstream stream)
{
    const struct symm_variant_nccl *n = v->nccl;
    CUdeviceptr ys = (CUdeviceptr)y, chunks = n->d_unstage, stage = n->d_rstage_x;
    int m = n->n_unstage;
    int64_t rows = n->plan.stage_rows;
    void *params[] = {&ys, &chunks, &m, &rows, &stage};
    return launch_warp_rows(v->fn_nccl_restage, rows, params, stream, "launch of symm_nccl_restage");
}

/* One send/receive per array per run with a peer, in one NCCL group (this
 * rank's rows for itself were moved already): into the received rows
 * (layout rank) or the receive stage (layout expert). */
static symm_status exchange_rows(symm_variant *v, const symm_recv_buffers *rb, CUstream stream)
{
    const symm_variant_desc *d = v->desc;
    struct symm_variant_nccl *n = v->nccl;
    const symm_nccl_api *nc = n->api;
    ncclComm_t comm = (ncclComm_t)symm_nccl_comm(n->vhost.comm);
    const int K = d->topk;
    const size_t row = (size_t)d->hidden * symm_dtype_size(d->dtype), sc = (size_t)d->hidden / SYMM_FP8_BLOCK * 4;
    const size_t wrow = d->layout == SYMM_LAYOUT_RANK ? (size_t)K * 4 : 4;
    SYMM_NCCL(nc, comm, ncclGroupStart());
    symm_status st = SYMM_OK;
    for (int i = 0; i < n->plan.n_send_runs; i++) {
        const chunk c = n->send_runs[i];
        SYMM_GROUP_OP(ncclSend((void *)(n->d_send_x + c.row * row), c.n * row, ncclUint8, c.peer, comm, stream));
        SYMM_GROUP_OP(ncclSend((void *)(n->d_send_src + c.row * 16), c.n * 16, ncclUint8, c.peer, comm, stream));
        if (d->dtype == SYMM_DTYPE_FP8_E4M3)
            SYMM_GROUP_OP(ncclSend((void *)(n->d_send_scales + c.row * sc), c.n * sc, ncclUint8, c.peer, comm, stream));
        if (d->layout == SYMM_LAYOUT_RANK)
            SYMM_GROUP_OP(ncclSend((void *)(n->d_send_topk + c.row * K * 4), c.n * K * 4, ncclUint8,
                                   c.peer, comm, stream));
        if (d->weights)
            SYMM_GROUP_OP(ncclSend((void *)(n->d_send_weights + c.row * wrow), c.n * wrow, ncclUint8,
                                   c.peer, comm, stream));
    }
    const bool staged = d->layout == SYMM_LAYOUT_EXPERT;
    const CUdeviceptr to_x = staged ? n->d_rstage_x : rb->x, to_src = staged ? n->d_rstage_src : rb->src;
    const CUdeviceptr to_scales = staged ? n->d_rstage_scales : rb->scales;
    const CUdeviceptr to_weights = staged ? n->d_rstage_weights : rb->weights;
    for (int i = 0; i < n->plan.n_recv_runs; i++) {
        const chunk c = n->recv_runs[i];
        SYMM_GROUP_OP(ncclRecv((void *)(to_x + c.row * row), c.n * row, ncclUint8, c.peer, comm, stream));
        SYMM_GROUP_OP(ncclRecv((void *)(to_src + c.row * 16), c.n * 16, ncclUint8, c.peer, comm, stream));
        if (d->dtype == SYMM_DTYPE_FP8_E4M3)
            SYMM_GROUP_OP(ncclRecv((void *)(to_scales + c.row * sc), c.n * sc, ncclUint8, c.peer, comm, stream));
        if (d->layout == SYMM_LAYOUT_RANK)
            SYMM_GROUP_OP(ncclRecv((void *)(rb->topk_idx + c.row * K * 4), c.n * K * 4, ncclUint8,
                                   c.peer, comm, stream));
        if (d->weights)
            SYMM_GROUP_OP(ncclRecv((void *)(to_weights + c.row * wrow), c.n * wrow, ncclUint8, c.peer, comm, stream));
    }
    return symm_vhost_group_end(nc, comm, st);
}

static symm_status dispatch_steps(symm_variant *v, const symm_dispatch_args *a, CUstream stream)
{
    const symm_variant_desc *d = v->desc;
    struct symm_variant_nccl *n = v->nccl;
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    const int W = d->world, K = d->topk, L = d->experts / d->world;
    const int expert = d->layout == SYMM_LAYOUT_EXPERT;
    /* This call's work runs after the last call's (which may have been on
     * another stream): its kernels and NCCL's reuse the device buffers only
     * then, and the host rewrites the host buffers (the sources of the last
     * call's copies) only after the wait for the count exchange below,
     * which waits for the last call's work too. The host does not block on
     * the last call here. */
    SYMM_CU(cu, cuStreamWaitEvent(stream, n->vhost.done, 0));

    /* This rank's count row on the GPU, every rank's by the all-gather, and
     * the one wait: NCCL's calls below need the sizes. */
    const int wpb = n->plan_wpb, blocks = PLAN_BLOCKS, me = v->rank;
    {
        CUdeviceptr topk = (CUdeviceptr)a->topk_idx, weights = (CUdeviceptr)a->topk_weights;
        CUdeviceptr tokens_dev = (CUdeviceptr)a->tokens_dev, scratch = v->scratch;
        int64_t tokens = a->tokens;
        void *params[] = {&topk, &weights, &tokens_dev, &tokens, &scratch, &n->d_work, &n->d_info};
        SYMM_CU(cu, cuLaunchKernel(v->fn_nccl_count, blocks, 1, 1, (unsigned)wpb * 32, 1, 1,
                                   (unsigned)(wpb * n->bins * 4), stream, params, NULL));
        CUdeviceptr counts = n->d_counts + (size_t)me * n->bins * 4; /* this rank's row */
        void *scan_params[] = {&n->d_work, (void *)&blocks, (void *)&wpb, &counts, &n->d_info};
        SYMM_CU(cu, cuLaunchKernel(v->fn_nccl_scan, 1, 1, 1, 1024, 1, 1, 0, stream, scan_params, NULL));
    }
    const size_t row_bytes = (size_t)n->bins * 4;
    SYMM_TRY(queue_count_gather(v, stream));
    SYMM_CU(cu, cuMemcpyDtoHAsync(n->h_counts, n->d_counts, (size_t)W * row_bytes, stream));
    SYMM_CU(cu, cuMemcpyDtoHAsync(n->h_info, n->d_info, 16, stream));
    SYMM_TRY(wait_work(v, stream, true, "the count exchange (ncclAllGather)"));
    device_state *st = n->h_state;
    memset(st, 0, sizeof *st);
    const int T = n->h_info[0];
    st->clamped = n->h_info[1];
    st->invalid = n->h_info[2];

    symm_nccl_plan *plan = &n->plan;
    symm_nccl_plan_chunks(plan);
    if (plan->stage_rows > n->stage_cap)
        return symm_fail(SYMM_ERR_STATE, "rank %d: %lld rows from the peers, the receive stage holds %lld "
                         "(internal error)", me, (long long)plan->stage_rows, (long long)n->stage_cap);
    n->n_unstage = 0;
    if (plan->stage_rows > 0) {
        n->n_unstage = symm_nccl_unstage_list(plan, n->h_unstage);
        SYMM_CU(cu, cuMemcpyHtoDAsync(n->d_unstage, n->h_unstage, (size_t)n->n_unstage * 8, stream));
    }
    st->recv_rows = plan->recv_rows;
    st->dropped_recv = plan->dropped_recv;
    st->dropped_send = plan->dropped_send;

    /* Each row placed, and its metadata packed, on the GPU: the peers' rows
     * into the send buffer, this rank's own straight to their received rows. */
    symm_recv_buffers rb;
    SYMM_TRY(symm_variant_recv(v, &rb));
    if (T > 0) {
        for (int i = 0; i < 2 * n->bins; i++)
            n->h_bins[i] = (int32_t)plan->base[i];
        SYMM_CU(cu, cuMemcpyHtoDAsync(n->d_bins, n->h_bins, 2 * row_bytes, stream));
        CUdeviceptr topk = (CUdeviceptr)a->topk_idx, weights = (CUdeviceptr)a->topk_weights, scratch = v->scratch;
        int tokens = T;
        int64_t self_first = plan->self_first;
        void *params[] = {&topk, &weights, &scratch, &n->d_work, &n->d_bins, &tokens, (void *)&blocks,
                          (void *)&wpb, (void *)&me, &self_first, &n->d_send_index, &n->d_stage_index,
                          &n->d_send_src, &n->d_send_topk, &n->d_send_weights, &n->d_self_dst, &rb.src,
                          &rb.topk_idx, &rb.weights};
        SYMM_CU(cu, cuLaunchKernel(v->fn_nccl_pack, symm_vhost_grid((int64_t)T * (expert ? K : W), 256), 1, 1, 256,
                                   1, 1, 0, stream, params, NULL));
    }
    if (plan->packed > 0) {
        CUdeviceptr x = (CUdeviceptr)a->x, scales = (CUdeviceptr)a->x_scales;
        int64_t rows = plan->packed, self_first = plan->self_first, self_rows = plan->self_rows;
        void *params[] = {&x, &scales, &n->d_send_index, &rows, &self_first, &self_rows, &n->d_self_dst,
                          &n->d_send_x, &n->d_send_scales, &rb.x, &rb.scales};
        SYMM_TRY(launch_warp_rows(v->fn_nccl_gather, rows, params, stream, "launch of symm_nccl_gather"));
    }
    SYMM_TRY(exchange_rows(v, &rb, stream));
    if (plan->stage_rows > 0)
        SYMM_TRY(launch_unstage(v, &rb, stream));

    /* What this rank received. */
    st->seq = ++n->calls;
    st->tokens = (int32_t)T;
    if (!expert) {
        const int rows = st->recv_rows;
        void *params[] = {&rb.topk_idx, (void *)&rows, &rb.expert_count};
        SYMM_CU(cu, cuLaunchKernel(v->fn_count_experts, 1, 1, 1, 1024, 1, 1, 0, stream, params, NULL));
    } else {
        SYMM_CU(cu, cuMemcpyHtoDAsync(rb.expert_count, n->h_expert, (size_t)L * 4, stream));
        SYMM_CU(cu, cuMemcpyHtoDAsync(rb.expert_offset, n->h_expert + L, (size_t)L * 4, stream));
    }
    SYMM_CU(cu, cuMemcpyHtoDAsync(symm_variant_region_ptr(v, SYMM_REGION_STATE), st, sizeof *st, stream));
    SYMM_CU(cu, cuEventRecord(n->vhost.done, stream));
    return SYMM_OK;
}

symm_status symm_variant_nccl_dispatch(symm_variant *v, const symm_dispatch_args *args, CUstream stream)
{
    SYMM_TRY(symm_variant_nccl_failure(v, "dispatch"));
    symm_status st = dispatch_steps(v, args, stream);
    if (st != SYMM_OK)
        symm_fail_context(st, "%s dispatch (NCCL backend): ", v->desc->name);
    return st;
}

static symm_status combine_steps(symm_variant *v, const void *y, void *out, CUstream stream)
{
    const symm_variant_desc *d = v->desc;
    struct symm_variant_nccl *n = v->nccl;
    const symm_nccl_plan *p = &n->plan;
    const symm_nccl_api *nc = n->api;
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    ncclComm_t comm = (ncclComm_t)symm_nccl_comm(n->vhost.comm);
    const size_t crow = (size_t)d->hidden * symm_dtype_size(d->combine_dtype);
    /* Each peer's rows go back as one run: of y (layout rank), or of the
     * receive stage where symm_nccl_restage gathers them (layout expert);
     * what comes back lands in packed order in the stage. */
    const char *back = y;
    if (p->stage_rows > 0) {
        SYMM_TRY(launch_restage(v, y, stream));
        back = (const char *)n->d_rstage_x;
    }
    SYMM_NCCL(nc, comm, ncclGroupStart());
    symm_status st = SYMM_OK;
    for (int i = 0; i < p->n_recv_runs; i++) {
        const chunk c = n->recv_runs[i];
        SYMM_GROUP_OP(ncclSend(back + c.row * crow, c.n * crow, ncclUint8, c.peer, comm, stream));
    }
    for (int i = 0; i < p->n_send_runs; i++) {
        const chunk c = n->send_runs[i];
        SYMM_GROUP_OP(ncclRecv((void *)(n->d_stage + c.row * crow), c.n * crow, ncclUint8, c.peer, comm, stream));
    }
    SYMM_TRY(symm_vhost_group_end(nc, comm, st));
    /* Into COMBINE_IN (or this backend's own buffer in its place): the
     * peers' rows from the stage, in one launch over
     * every packed row (this rank's own have the slot -1, and the sum reads
     * them from y), none when every row was this rank's own. */
    const CUdeviceptr combine_in =
        n->d_combine_in ? n->d_combine_in : symm_variant_region_ptr(v, SYMM_REGION_COMBINE_IN);
    if (p->packed > p->self_rows)
        SYMM_TRY(launch_scatter(v, n->d_stage, n->d_stage_index, p->packed, combine_in, stream));
    SYMM_TRY(symm_variant_launch_reduce(v, y, out, combine_in, stream));
    SYMM_CU(cu, cuEventRecord(n->vhost.done, stream));
    return SYMM_OK;
}

symm_status symm_variant_nccl_combine(symm_variant *v, const void *y, void *out, CUstream stream)
{
    symm_status st = combine_steps(v, y, out, stream);
    if (st != SYMM_OK)
        symm_fail_context(st, "%s combine (NCCL backend): ", v->desc->name);
    return st;
}
