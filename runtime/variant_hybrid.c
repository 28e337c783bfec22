/* variant_hybrid.c: the hybrid backend of dispatch and combine, for a world
 * of several hosts (docs/protocol.md "Across hosts: the hybrid backend").
 * NCCL between hosts, the native kernels of the variant's companion (a
 * native variant of one host's ranks) within each host.
 *
 * Dispatch on rank s = (host h, local index l): T and the top-k ids (and
 * the weights) are copied to the host and routed there
 * (runtime/hybrid_plan.c): one row per (token, destination host), by host
 * ascending, its top-k row rewritten to the host's experts; the counts per
 * (source, destination host) go round the world in one NCCL all-gather (the
 * second host wait); then one NCCL group among the ranks of local index l
 * moves each source's rows (x, fp8 scales, top-k ids, weights and the
 * origin {rank, token}) to the proxy (g, l) of each other host g. A proxy's
 * forwarded tokens are ordered by source host, then token; its own host's
 * are gathered from x in their place. The companion's native dispatch runs
 * over them, and a kernel rewrites each received row's src from the
 * companion's (proxy l, forwarded index) to the origin in proxy l's table,
 * which lives in a symmetric buffer of the host world (two of them, by the
 * parity of the call, so that a proxy writes call n + 1's while a slower
 * peer still reads call n's; call n + 2's waits for that peer's count
 * exchange of call n + 1, which follows its call n).
 *
 * Combine: the companion's native combine gives at the proxy one row per
 * forwarded token (P_g); NCCL brings each back to its source, and a kernel
 * sums per token over hosts ascending in fp32, rounded once.
 *
 * Because the host waits inside dispatch, a call during stream capture is
 * refused. Every host wait polls with the variant's timeout and watches
 * NCCL's asynchronous error, with the NCCL backend's code (variant_host.c);
 * a failure in dispatch or combine is sticky (the ranks no longer agree on
 * where the exchange stands): later calls fail at once until the variant is
 * destroyed. */
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
#include "heap_internal.h"
#include "hybrid_plan.h"
#include "nccl_api.h"
#include "symm_nccl.h"
#include "variant_host.h"
#include "variant_internal.h"

struct symm_variant_hybrid {
    symm_variant *companion;
    symm_vhost vhost;        /* the communicator over the world, the event after each call's work (the next
                                dispatch's stream, and destroy, wait for it), the sticky failure (a call
                                failed: later calls fail with it) */
    const symm_nccl_api *api;
    symm_alloc *table;       /* host world: [2][fwd_max] {rank, token} of the forwarded tokens */
    int hosts, local, host, lidx;
    int64_t fwd_max, send_max;
    /* host (pinned) */
    int32_t *h_tokens, *h_topk, *h_send_token, *h_send_topk, *h_send_origin, *h_slot, *h_counts, *h_self_dst;
    float *h_weights, *h_send_weights;
    /* host (malloc) */
    int32_t *send_count, *send_first, *fwd_count, *fwd_first, *rank_host;
    /* device */
    CUdeviceptr d_counts, d_send_index, d_self_dst, d_send_x, d_send_scales, d_send_topk, d_send_weights,
        d_send_origin, d_fwd_x, d_fwd_scales, d_fwd_topk, d_fwd_weights, d_src, d_comb_out, d_ret, d_slot;
    /* the last dispatch */
    int tokens, forwarded, send_rows, invalid, clamped, parity;
    uint64_t calls;
};

static const char capture_reason[] = "the hybrid backend cannot run inside CUDA graph capture (it routes on the "
                                     "host and NCCL needs the counts there); capture the native backend within "
                                     "one host";

symm_status symm_variant_hybrid_check(symm_world *world, const symm_variant_desc *desc,
                                      const symm_variant_desc **companion)
{
    const int W = symm_world_size(world), H = symm_world_host_count(world);
    int *rank_host = malloc(sizeof(int) * (size_t)W);
    if (!rank_host)
        return symm_fail(SYMM_ERR_NOMEM, "symm_variant_create: out of host memory");
    for (int r = 0; r < W; r++)
        rank_host[r] = symm_world_rank_host(world, r);
    symm_status st = symm_hybrid_check(desc, W, H, rank_host, companion);
    free(rank_host);
    return st;
}

static symm_status hybrid_buffers(symm_variant *v)
{
    struct symm_variant_hybrid *h = v->hybrid;
    const symm_variant_desc *d = v->desc;
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    SYMM_TRY(symm_nccl_load(&h->api));
    const int H = h->hosts, K = d->topk, W = d->world;
    const size_t T = (size_t)d->max_tokens, row = (size_t)d->hidden * symm_dtype_size(d->dtype);
    const size_t crow = (size_t)d->hidden * symm_dtype_size(d->combine_dtype);
    const size_t sc = (size_t)d->hidden / SYMM_FP8_BLOCK * 4;
    const int fp8 = d->dtype == SYMM_DTYPE_FP8_E4M3;
    h->fwd_max = (int64_t)H * d->max_tokens;
    h->send_max = (int64_t)T * (K < H ? K : H);
    const size_t F = (size_t)h->fwd_max, S = (size_t)h->send_max;
    h->send_count = calloc((size_t)H, sizeof(int32_t));
    h->send_first = calloc((size_t)H, sizeof(int32_t));
    h->fwd_count = calloc((size_t)H, sizeof(int32_t));
    h->fwd_first = calloc((size_t)H, sizeof(int32_t));
    if (!h->send_count || !h->send_first || !h->fwd_count || !h->fwd_first)
        return symm_fail(SYMM_ERR_NOMEM, "hybrid backend: out of host memory");
    const symm_vhost *vh = &h->vhost;
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &h->h_tokens, 16));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &h->h_topk, T * K * 4));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &h->h_weights, d->weights ? T * K * 4 : 0));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &h->h_send_token, S * 4));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &h->h_send_topk, S * K * 4));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &h->h_send_weights, d->weights ? S * K * 4 : 0));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &h->h_send_origin, S * 8));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &h->h_slot, T * (size_t)H * 4));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &h->h_counts, (size_t)W * H * 4));
    SYMM_TRY(symm_vhost_host_alloc(vh, cu, &h->h_self_dst, T * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_counts, (size_t)W * H * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_send_index, S * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_self_dst, T * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_send_x, S * row));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_send_scales, fp8 ? S * sc : 0));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_send_topk, S * K * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_send_weights, d->weights ? S * K * 4 : 0));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_send_origin, S * 8));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_fwd_x, F * row));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_fwd_scales, fp8 ? F * sc : 0));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_fwd_topk, F * K * 4));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_fwd_weights, d->weights ? F * K * 4 : 0));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_src, (size_t)d->capacity * 16));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_comb_out, F * crow));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_ret, S * crow));
    SYMM_TRY(symm_vhost_dev_alloc(vh, cu, &h->d_slot, T * (size_t)H * 4));
    SYMM_CU(cu, cuMemsetD8(h->d_src, 0, (size_t)d->capacity * 16));
    SYMM_CU(cu, cuEventCreate(&h->vhost.done, CU_EVENT_DISABLE_TIMING));
    return SYMM_OK;
}

/* Wait (symm_vhost_wait) for the stream's work (use_stream) or the last
 * call's; the callers make a failure sticky. */
static symm_status wait_work(symm_variant *v, CUstream stream, bool use_stream, const char *what)
{
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    return symm_vhost_wait(&v->hybrid->vhost, v, cu, stream, use_stream, what);
}

/* NCCL connects peers inside the host calls of a communicator's first
 * operations and waits there for a peer with no timeout of its own (the
 * NCCL backend's connect_peers says more): create makes dispatch's
 * all-gather of the counts and a send to and a receive from every rank of
 * this local index on the other hosts, while every rank is in it. */
static symm_status connect_peers(symm_variant *v)
{
    struct symm_variant_hybrid *h = v->hybrid;
    const symm_nccl_api *nc = h->api;
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    ncclComm_t comm = (ncclComm_t)symm_nccl_comm(h->vhost.comm);
    CUstream stream;
    SYMM_CU(cu, cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    const CUdeviceptr mine = h->d_counts + (size_t)v->rank * h->hosts * 4;
    symm_status st = symm_nccl_check(nc, comm, nc->ncclAllGather((const void *)mine, (void *)h->d_counts,
                                                                 (size_t)h->hosts, ncclInt32, comm, stream),
                                     "ncclAllGather");
    if (st == SYMM_OK)
        st = symm_nccl_check(nc, comm, nc->ncclGroupStart(), "ncclGroupStart");
    if (st == SYMM_OK) {
        for (int g = 0; g < h->hosts; g++) {
            if (g == h->host)
                continue;
            const int peer = g * h->local + h->lidx;
            if (st == SYMM_OK)
                st = symm_nccl_check(nc, comm, nc->ncclSend((const void *)h->d_send_origin, 8, ncclUint8, peer, comm,
                                                            stream), "ncclSend");
            if (st == SYMM_OK)
                st = symm_nccl_check(nc, comm, nc->ncclRecv((void *)h->d_ret, 8, ncclUint8, peer, comm, stream),
                                     "ncclRecv");
        }
        st = symm_vhost_group_end(nc, comm, st);
    }
    if (st == SYMM_OK)
        st = wait_work(v, stream, true, "connecting the peers (NCCL)");
    cu->cuStreamDestroy(stream);
    if (st != SYMM_OK)
        symm_fail_context(st, "rank %d: ", v->rank);
    return st;
}

symm_status symm_variant_hybrid_setup(symm_variant *v, const symm_variant_desc *companion,
                                      const symm_variant_options *opts)
{
    struct symm_variant_hybrid *h = calloc(1, sizeof *h);
    v->hybrid = h;
    if (!h)
        return symm_agree(v->world, symm_fail(SYMM_ERR_NOMEM, "hybrid backend: out of host memory"),
                          "hybrid backend: allocating buffers");
    symm_vhost_init(&h->vhost, "hybrid backend", SYMM_VHOST_CALLER_STICKY);
    symm_world *host_world = symm_world_host_world(v->world);
    h->hosts = symm_world_host_count(v->world);
    h->local = symm_world_local_size(v->world);
    h->host = symm_world_host(v->world);
    h->lidx = symm_world_rank(host_world);
    /* The companion, natively on the host world (collective there; every
     * rank of the world learns whether every host's succeeded). */
    symm_variant_options co = {.backend = SYMM_BACKEND_NATIVE,
                               .cache_dir = opts ? opts->cache_dir : NULL,
                               .timeout_s = (double)v->timeout_ns * 1e-9,
                               .tune = opts ? opts->tune : NULL};
    symm_status local = symm_variant_create(host_world, companion, &co, &h->companion);
    if (local != SYMM_OK)
        symm_fail_context(local, "hybrid backend: the companion %s of %d hosts: ", companion->name, h->hosts);
    SYMM_TRY(symm_agree(v->world, local, "hybrid backend: creating the companions"));
    local = hybrid_buffers(v);
    SYMM_TRY(symm_agree(v->world, local, "hybrid backend: allocating buffers"));
    /* The tables of forwarded tokens, which the host's ranks read
     * (collective within the host; every host learns how the others fared
     * before the world's communicator is made). */
    local = symm_alloc_create(host_world, v->host_dev, (size_t)2 * (size_t)h->fwd_max * 8, 0, &h->table);
    SYMM_TRY(symm_agree(v->world, local, "hybrid backend: the tables of forwarded tokens"));
    SYMM_TRY(symm_nccl_create(v->world, v->dev, &h->vhost.comm));
    return symm_agree(v->world, connect_peers(v), "hybrid backend: connecting the peers");
}

void symm_variant_hybrid_release(symm_variant *v)
{
    struct symm_variant_hybrid *h = v->hybrid;
    if (!h)
        return;
    const symm_cuda_api *cu;
    void *hosts[] = {h->h_tokens, h->h_topk, h->h_weights, h->h_send_token, h->h_send_topk,
                     h->h_send_weights, h->h_send_origin, h->h_slot, h->h_counts, h->h_self_dst};
    const CUdeviceptr devs[] = {h->d_counts, h->d_send_index, h->d_self_dst, h->d_send_x, h->d_send_scales,
                                h->d_send_topk, h->d_send_weights, h->d_send_origin, h->d_fwd_x, h->d_fwd_scales,
                                h->d_fwd_topk, h->d_fwd_weights, h->d_src, h->d_comb_out, h->d_ret, h->d_slot};
    symm_vhost_release(&h->vhost, symm_cuda(&cu) == SYMM_OK ? cu : NULL, hosts, SYMM_ARRAY_LEN(hosts), devs,
                       SYMM_ARRAY_LEN(devs));
    if (h->table)
        symm_alloc_destroy(h->table);
    if (h->companion)
        symm_variant_destroy(h->companion);
    free(h->send_count);
    free(h->send_first);
    free(h->fwd_count);
    free(h->fwd_first);
    free(h);
    v->hybrid = NULL;
}

symm_status symm_variant_hybrid_refuse_capture(const symm_variant *v, CUstream stream, const char *op)
{
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    return symm_vhost_refuse_capture(v, cu, stream, op, capture_reason);
}

symm_status symm_variant_hybrid_failure(const symm_variant *v, const char *op)
{
    return symm_vhost_failure(v->hybrid ? &v->hybrid->vhost : NULL, v, op);
}

symm_status symm_variant_hybrid_quiesce(symm_variant *v)
{
    struct symm_variant_hybrid *h = v->hybrid;
    if (!h || !h->vhost.done || h->vhost.failed)
        return SYMM_OK;
    symm_status st = wait_work(v, NULL, false, "the last call's work");
    if (st != SYMM_OK)
        return symm_vhost_fail(&h->vhost, st);
    return SYMM_OK;
}

/* This call's table of forwarded tokens (parity of the call). */
static CUdeviceptr table_at(const struct symm_variant_hybrid *h, int parity)
{
    return symm_alloc_local(h->table) + (size_t)parity * (size_t)h->fwd_max * 8;
}

static symm_status dispatch_steps(symm_variant *v, const symm_dispatch_args *a, CUstream stream)
{
    const symm_variant_desc *d = v->desc;
    struct symm_variant_hybrid *h = v->hybrid;
    const symm_nccl_api *nc = h->api;
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    ncclComm_t comm = (ncclComm_t)symm_nccl_comm(h->vhost.comm);
    const int H = h->hosts, L = h->local, K = d->topk, me = v->rank;
    const size_t row = (size_t)d->hidden * symm_dtype_size(d->dtype), sc = (size_t)d->hidden / SYMM_FP8_BLOCK * 4;
    const int fp8 = d->dtype == SYMM_DTYPE_FP8_E4M3;
    /* After the last call's work (maybe on another stream): the waits below
     * wait for it too before the host arrays, the sources of its copies, are
     * rewritten. */
    SYMM_CU(cu, cuStreamWaitEvent(stream, h->vhost.done, 0));

    /* 1. T and the top-k ids (and weights) on the host. */
    int T = a->tokens;
    h->clamped = 0;
    if (a->tokens_dev) {
        SYMM_CU(cu, cuMemcpyDtoHAsync(h->h_tokens, (CUdeviceptr)a->tokens_dev, 4, stream));
        SYMM_TRY(wait_work(v, stream, true, "reading T (tokens_dev)"));
        const int32_t requested = h->h_tokens[0];
        T = requested < 0 ? 0 : requested > d->max_tokens ? d->max_tokens : requested;
        h->clamped = T != requested;
    }
    if (T > 0) {
        SYMM_CU(cu, cuMemcpyDtoHAsync(h->h_topk, (CUdeviceptr)a->topk_idx, (size_t)T * K * 4, stream));
        if (d->weights)
            SYMM_CU(cu, cuMemcpyDtoHAsync(h->h_weights, (CUdeviceptr)a->topk_weights, (size_t)T * K * 4, stream));
    }
    SYMM_TRY(wait_work(v, stream, true, "copying the top-k ids to the host"));

    /* 2. Route: one row per (token, destination host). */
    symm_hybrid_route r = {
        .hosts = H, .local = L, .experts = d->experts, .topk = K, .rank = me, .tokens = T,
        .topk_idx = h->h_topk, .topk_weights = d->weights ? h->h_weights : NULL,
        .send_token = h->h_send_token, .send_topk = h->h_send_topk,
        .send_weights = d->weights ? h->h_send_weights : NULL, .send_origin = h->h_send_origin,
        .send_count = h->send_count, .send_first = h->send_first, .slot = h->h_slot,
    };
    symm_hybrid_route_tokens(&r);
    h->tokens = T;
    h->invalid = r.invalid;
    h->send_rows = r.rows;

    /* 3. The counts per (source, destination host) round the world. */
    for (int g = 0; g < H; g++)
        h->h_counts[(size_t)me * H + g] = h->send_count[g];
    const CUdeviceptr mine = h->d_counts + (size_t)me * H * 4;
    SYMM_CU(cu, cuMemcpyHtoDAsync(mine, h->h_counts + (size_t)me * H, (size_t)H * 4, stream));
    SYMM_NCCL(nc, comm, ncclAllGather((const void *)mine, (void *)h->d_counts, (size_t)H, ncclInt32, comm, stream));
    SYMM_CU(cu, cuMemcpyDtoHAsync(h->h_counts, h->d_counts, (size_t)d->world * H * 4, stream));
    SYMM_TRY(wait_work(v, stream, true, "the count exchange (ncclAllGather)"));
    h->forwarded = symm_hybrid_forward(H, L, me, h->h_counts, h->fwd_count, h->fwd_first);

    /* 4. The send rows on the GPU: metadata from the host, rows of x (and
     * scales) gathered; this host's own rows straight to their forwarded
     * place, with their metadata. */
    const CUdeviceptr table = table_at(h, h->parity);
    const int own = h->send_count[h->host], own_from = h->send_first[h->host], own_to = h->fwd_first[h->host];
    if (r.rows > 0) {
        const size_t n = (size_t)r.rows;
        SYMM_CU(cu, cuMemcpyHtoDAsync(h->d_send_index, h->h_send_token, n * 4, stream));
        SYMM_CU(cu, cuMemcpyHtoDAsync(h->d_send_topk, h->h_send_topk, n * K * 4, stream));
        if (d->weights)
            SYMM_CU(cu, cuMemcpyHtoDAsync(h->d_send_weights, h->h_send_weights, n * K * 4, stream));
        SYMM_CU(cu, cuMemcpyHtoDAsync(h->d_send_origin, h->h_send_origin, n * 8, stream));
        for (int j = 0; j < own; j++)
            h->h_self_dst[j] = own_to + j;
        if (own > 0)
            SYMM_CU(cu, cuMemcpyHtoDAsync(h->d_self_dst, h->h_self_dst, (size_t)own * 4, stream));
        enum { WARPS = 8 };
        CUdeviceptr x = (CUdeviceptr)a->x, scales = fp8 ? (CUdeviceptr)a->x_scales : 0;
        int64_t rows = r.rows, self_first = own_from, self_rows = own;
        void *params[] = {&x, &scales, &h->d_send_index, &rows, &self_first, &self_rows, &h->d_self_dst,
                          &h->d_send_x, &h->d_send_scales, &h->d_fwd_x, &h->d_fwd_scales};
        SYMM_CU(cu, cuLaunchKernel(v->fn_nccl_gather, symm_vhost_grid(rows, WARPS), 1, 1, WARPS * 32, 1, 1, 0, stream,
                                   params, NULL));
    }
    if (own > 0) {
        SYMM_CU(cu, cuMemcpyDtoDAsync(h->d_fwd_topk + (size_t)own_to * K * 4, h->d_send_topk + (size_t)own_from * K * 4,
                                      (size_t)own * K * 4, stream));
        if (d->weights)
            SYMM_CU(cu, cuMemcpyDtoDAsync(h->d_fwd_weights + (size_t)own_to * K * 4,
                                          h->d_send_weights + (size_t)own_from * K * 4, (size_t)own * K * 4, stream));
        SYMM_CU(cu, cuMemcpyDtoDAsync(table + (size_t)own_to * 8, h->d_send_origin + (size_t)own_from * 8,
                                      (size_t)own * 8, stream));
    }

    /* 5. Across the network: one group among the ranks of this local index. */
    SYMM_NCCL(nc, comm, ncclGroupStart());
    symm_status st = SYMM_OK;
    for (int g = 0; g < H; g++) {
        const size_t n = (size_t)h->send_count[g], at = (size_t)h->send_first[g];
        if (g == h->host || n == 0)
            continue;
        const int peer = g * L + h->lidx;
        SYMM_GROUP_OP(ncclSend((const void *)(h->d_send_x + at * row), n * row, ncclUint8, peer, comm, stream));
        if (fp8)
            SYMM_GROUP_OP(ncclSend((const void *)(h->d_send_scales + at * sc), n * sc, ncclUint8, peer, comm, stream));
        SYMM_GROUP_OP(ncclSend((const void *)(h->d_send_topk + at * K * 4), n * K * 4, ncclUint8, peer, comm, stream));
        if (d->weights)
            SYMM_GROUP_OP(ncclSend((const void *)(h->d_send_weights + at * K * 4), n * K * 4, ncclUint8, peer, comm,
                                   stream));
        SYMM_GROUP_OP(ncclSend((const void *)(h->d_send_origin + at * 8), n * 8, ncclUint8, peer, comm, stream));
    }
    for (int g = 0; g < H; g++) {
        const size_t n = (size_t)h->fwd_count[g], at = (size_t)h->fwd_first[g];
        if (g == h->host || n == 0)
            continue;
        const int peer = g * L + h->lidx;
        SYMM_GROUP_OP(ncclRecv((void *)(h->d_fwd_x + at * row), n * row, ncclUint8, peer, comm, stream));
        if (fp8)
            SYMM_GROUP_OP(ncclRecv((void *)(h->d_fwd_scales + at * sc), n * sc, ncclUint8, peer, comm, stream));
        SYMM_GROUP_OP(ncclRecv((void *)(h->d_fwd_topk + at * K * 4), n * K * 4, ncclUint8, peer, comm, stream));
        if (d->weights)
            SYMM_GROUP_OP(ncclRecv((void *)(h->d_fwd_weights + at * K * 4), n * K * 4, ncclUint8, peer, comm, stream));
        SYMM_GROUP_OP(ncclRecv((void *)(table + at * 8), n * 8, ncclUint8, peer, comm, stream));
    }
    SYMM_TRY(symm_vhost_group_end(nc, comm, st));

    /* 6. The companion's native dispatch over the forwarded tokens. */
    const symm_dispatch_args ca = {
        .tokens = h->forwarded,
        .x = (const void *)h->d_fwd_x,
        .x_scales = fp8 ? (const float *)h->d_fwd_scales : NULL,
        .topk_idx = (const int32_t *)h->d_fwd_topk,
        .topk_weights = d->weights ? (const float *)h->d_fwd_weights : NULL,
    };
    SYMM_TRY(symm_variant_dispatch(h->companion, &ca, stream));

    /* 7. Each received row's src from the proxies' tables. */
    symm_recv_buffers cb;
    SYMM_TRY(symm_variant_recv(h->companion, &cb));
    {
        enum { THREADS = 256 };
        CUdeviceptr peers = symm_alloc_peer_table(h->table);
        int64_t capacity = d->capacity, table_off = (int64_t)h->parity * h->fwd_max * 8, fwd_max = h->fwd_max;
        int local = L;
        void *params[] = {&cb.src, &cb.rows, &capacity, &peers, &local, &table_off, &fwd_max, &h->d_src};
        SYMM_CU(cu, cuLaunchKernel(v->fn_hybrid_src, symm_vhost_grid(capacity, THREADS), 1, 1, THREADS, 1, 1, 0, stream,
                                   params, NULL));
    }
    /* 8. Combine's map, (token, host) to the row its P comes back to. */
    if (T > 0)
        SYMM_CU(cu, cuMemcpyHtoDAsync(h->d_slot, h->h_slot, (size_t)T * H * 4, stream));
    SYMM_CU(cu, cuEventRecord(h->vhost.done, stream));
    h->parity ^= 1;
    h->calls++;
    return SYMM_OK;
}

symm_status symm_variant_hybrid_dispatch(symm_variant *v, const symm_dispatch_args *args, CUstream stream)
{
    SYMM_TRY(symm_variant_hybrid_failure(v, "dispatch"));
    symm_status st = dispatch_steps(v, args, stream);
    if (st != SYMM_OK) {
        symm_fail_context(st, "%s dispatch (hybrid backend): ", v->desc->name);
        return symm_vhost_fail(&v->hybrid->vhost, st);
    }
    return SYMM_OK;
}

static symm_status combine_steps(symm_variant *v, const void *y, void *out, CUstream stream)
{
    const symm_variant_desc *d = v->desc;
    struct symm_variant_hybrid *h = v->hybrid;
    const symm_nccl_api *nc = h->api;
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    ncclComm_t comm = (ncclComm_t)symm_nccl_comm(h->vhost.comm);
    const int H = h->hosts, L = h->local;
    const size_t crow = (size_t)d->hidden * symm_dtype_size(d->combine_dtype);
    /* 1. P_g per forwarded token at the proxy. */
    SYMM_TRY(symm_variant_combine(h->companion, y, (void *)h->d_comb_out, stream));
    /* 2. Back to the sources: the proxy's rows of one source host are
     * contiguous (one send each); they land where the source's send rows
     * for that host were. */
    SYMM_NCCL(nc, comm, ncclGroupStart());
    symm_status st = SYMM_OK;
    for (int g = 0; g < H; g++) {
        const size_t n = (size_t)h->fwd_count[g], at = (size_t)h->fwd_first[g];
        if (g != h->host && n > 0)
            SYMM_GROUP_OP(ncclSend((const void *)(h->d_comb_out + at * crow), n * crow, ncclUint8, g * L + h->lidx,
                                   comm, stream));
    }
    for (int g = 0; g < H; g++) {
        const size_t n = (size_t)h->send_count[g], at = (size_t)h->send_first[g];
        if (g != h->host && n > 0)
            SYMM_GROUP_OP(ncclRecv((void *)(h->d_ret + at * crow), n * crow, ncclUint8, g * L + h->lidx, comm, stream));
    }
    SYMM_TRY(symm_vhost_group_end(nc, comm, st));
    const int own = h->send_count[h->host];
    if (own > 0)
        SYMM_CU(cu, cuMemcpyDtoDAsync(h->d_ret + (size_t)h->send_first[h->host] * crow,
                                      h->d_comb_out + (size_t)h->fwd_first[h->host] * crow, (size_t)own * crow,
                                      stream));
    /* 3. The sum over hosts ascending. */
    if (h->tokens > 0) {
        enum { WARPS = 8 };
        CUdeviceptr parts = h->d_ret, o = (CUdeviceptr)out;
        int tokens = h->tokens, hosts = H;
        void *params[] = {&parts, &h->d_slot, &tokens, &hosts, &o};
        SYMM_CU(cu, cuLaunchKernel(v->fn_hybrid_sum, symm_vhost_grid(tokens, WARPS), 1, 1, WARPS * 32, 1, 1, 0, stream,
                                   params, NULL));
    }
    SYMM_CU(cu, cuEventRecord(h->vhost.done, stream));
    return SYMM_OK;
}

symm_status symm_variant_hybrid_combine(symm_variant *v, const void *y, void *out, CUstream stream)
{
    symm_status st = combine_steps(v, y, out, stream);
    if (st != SYMM_OK) {
        symm_fail_context(st, "%s combine (hybrid backend): ", v->desc->name);
        return symm_vhost_fail(&v->hybrid->vhost, st);
    }
    return SYMM_OK;
}

symm_status symm_variant_hybrid_recv(const symm_variant *v, symm_recv_buffers *out)
{
    SYMM_TRY(symm_variant_recv(v->hybrid->companion, out));
    out->src = v->hybrid->d_src;
    return SYMM_OK;
}

symm_status symm_variant_hybrid_stats(symm_variant *v, CUstream stream, symm_variant_stats *out)
{
    struct symm_variant_hybrid *h = v->hybrid;
    memset(out, 0, sizeof *out);
    symm_status failed = symm_variant_hybrid_failure(v, "stats_read");
    if (failed != SYMM_OK) {
        out->timed_out = failed == SYMM_ERR_TIMEOUT;
        out->timeout_peer = -1;
        out->mismatch_peer = -1;
        return failed;
    }
    /* The companion's statistics (this synchronizes stream): its rows,
     * drops and device timeouts; OVERFLOW is judged below on the merged
     * numbers. */
    symm_variant_stats cs;
    symm_status st = symm_variant_stats_read(h->companion, stream, &cs);
    if (st != SYMM_OK && st != SYMM_ERR_OVERFLOW && !cs.timed_out && !cs.mismatch) {
        out->mismatch_peer = -1;
        return st;
    }
    *out = (symm_variant_stats){
        .calls = h->calls,
        .tokens = h->tokens,
        .recv_rows = cs.recv_rows,
        .invalid = h->invalid,
        .dropped_send = cs.dropped_send,
        .dropped_recv = cs.dropped_recv,
        .clamped = h->clamped,
        .timed_out = cs.timed_out,
        .timeout_peer = cs.timed_out && cs.timeout_peer >= 0 ? h->host * h->local + cs.timeout_peer : -1,
        .timeout_phase = cs.timeout_phase,
        /* combine = "auto": the companion's ranks of this host disagreed. */
        .mismatch = cs.mismatch,
        .mismatch_peer = cs.mismatch && cs.mismatch_peer >= 0 ? h->host * h->local + cs.mismatch_peer : -1,
    };
    return SYMM_OK;
}

symm_status symm_variant_hybrid_profile(symm_variant *v, CUstream stream, symm_variant_profile *out)
{
    return symm_variant_profile_read(v->hybrid->companion, stream, out);
}
