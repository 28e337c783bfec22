/* test_nccl_plan.c: the NCCL backend's routing, checked against the CPU
 * reference model for whole worlds, without a GPU: its chunk plan on the
 * host (runtime/nccl_plan.c) and its GPU part (templates/variant.cu.in:
 * symm_nccl_count, symm_nccl_scan, symm_nccl_pack, symm_count_experts)
 * written again in C, thread for thread where the order matters, with the
 * same cut of the tokens into blocks and warps (random counts of each).
 *
 * Every rank plans as runtime/variant_nccl.c does (count, all-gather of the
 * count rows, chunks, pack); the exchange is simulated as NCCL would carry it:
 * at most one run a peer each way, each receiver's run from a sender exactly
 * the size of that sender's run for it (NCCL send and receive sizes must
 * match), the runs made of the chunks (contiguous, in order), and each
 * received chunk's rows found where the run put them (its received rows, or
 * the receive stage for layout expert, symm_nccl_unstage's map). What lands (source rank, token, k; local top-k ids;
 * weights), the row counts, drops, invalid ids, expert counts and offsets,
 * the route combine reads and, for a rank's rows for itself (moved by a
 * kernel, not NCCL), the received row of each must equal symm_ref_dispatch's, for random
 * configs, routings with masked, invalid and repeated ids, token counts from
 * 0 to max_tokens, and capacities below the worst case. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moe_inputs.h"
#include "nccl_plan.h"
#include "symm_ref.h"
#include "world_fork.h"

#define MAX_W 8

typedef struct rank_plan {
    symm_nccl_plan p;
    int32_t *topk;
    float *weights;
    int tokens;
    int invalid;
    /* the GPU's arrays */
    int blocks, wpb;
    int32_t *work;          /* symm_nccl_count's and symm_nccl_scan's */
    int32_t *route;         /* [T, topk or world] */
    float *token_weights;   /* [T, topk] */
    int32_t *send_index, *stage_index, *send_src, *self_dst;
    int32_t *own_src;       /* [capacity, 4]: recv_src of this rank's rows for itself, by received row */
} rank_plan;

static void *zalloc(size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    cr_assert(p, "out of memory");
    return p;
}

static void plan_alloc(rank_plan *r, const symm_ref_config *c, int rank, int64_t cap, int32_t *counts, moe_rng *g)
{
    const int W = c->world, K = c->topk, L = c->experts / W, T = c->max_tokens;
    const bool expert = c->layout == SYMM_LAYOUT_EXPERT;
    const int bins = expert ? c->experts : W;
    const size_t M = (size_t)T * (size_t)(expert ? K : (K < W ? K : W));
    const size_t chunks = (size_t)W * (expert ? L : 1);
    r->topk = zalloc((size_t)T * K * 4);
    r->weights = zalloc((size_t)T * K * 4);
    r->p = (symm_nccl_plan){
        .world = W, .rank = rank, .experts = c->experts, .align = c->align, .expert_layout = expert,
        .capacity = cap, .bins = bins, .counts = counts, .expert = zalloc((size_t)2 * L * 4),
        .base = zalloc((size_t)2 * bins * 8), .send_chunks = zalloc(chunks * sizeof(symm_nccl_chunk)),
        .recv_chunks = zalloc(chunks * sizeof(symm_nccl_chunk)),
        .send_runs = zalloc((size_t)W * sizeof(symm_nccl_chunk)),
        .recv_runs = zalloc((size_t)W * sizeof(symm_nccl_chunk)),
    };
    r->blocks = 1 + moe_rng_int(g, 5);
    r->wpb = 1 + moe_rng_int(g, 4);
    r->work = zalloc(((size_t)r->blocks * r->wpb * bins + (size_t)r->blocks * bins + (size_t)r->blocks) * 4);
    r->route = zalloc((size_t)T * (expert ? K : W) * 4);
    r->token_weights = zalloc((size_t)T * K * 4);
    r->send_index = zalloc(M * 4);
    r->stage_index = zalloc(M * 4);
    r->send_src = zalloc(M * 16);
    r->self_dst = zalloc(M * 4);
    r->own_src = zalloc((size_t)cap * 16);
}

static void plan_free(rank_plan *r)
{
    void *bufs[] = {r->topk, r->weights, r->work, r->route, r->token_weights, r->send_index, r->stage_index,
                    r->send_src, r->self_dst, r->own_src, r->p.expert, r->p.base, r->p.send_chunks, r->p.recv_chunks,
                    r->p.send_runs, r->p.recv_runs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
}

/* The run of runs[0..n) with the peer, or NULL. */
static const symm_nccl_chunk *run_with(const symm_nccl_chunk *runs, int n, int peer)
{
    for (int i = 0; i < n; i++)
        if (runs[i].peer == peer)
            return &runs[i];
    return NULL;
}

/* symm_nccl_unstage's staged_row (templates/cu/nccl.cu.in) in C: the
 * received row of stage row i, from the chunk list the backend uploads. */
static int64_t staged_row(const int32_t *chunks, int m, int64_t i)
{
    int lo = 0, hi = m - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (chunks[2 * mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return chunks[2 * lo + 1] + (i - chunks[2 * lo]);
}

/* A rank's runs: one a peer at most each way, never itself, ascending peer,
 * each its chunks with the peer back to back (packed rows sending; received
 * rows (layout rank) or stage rows (layout expert) receiving); the stage
 * rows of layout expert's chunks from the peers one after the other, as
 * many as stage_rows, below symm_nccl_stage_capacity. */
static void check_runs(uint64_t seed, const symm_nccl_plan *p, int64_t max_send)
{
    const symm_nccl_chunk *lists[2] = {p->send_chunks, p->recv_chunks};
    const symm_nccl_chunk *runs[2] = {p->send_runs, p->recv_runs};
    const int n_chunks[2] = {p->n_send, p->n_recv}, n_runs[2] = {p->n_send_runs, p->n_recv_runs};
    for (int way = 0; way < 2; way++) {
        const bool staged = way == 1 && p->expert_layout;
        int used = 0;
        for (int i = 0; i < n_runs[way]; i++) {
            const symm_nccl_chunk u = runs[way][i];
            cr_assert(u.peer >= 0 && u.peer < p->world && u.peer != p->rank && u.n > 0,
                      "seed %llu rank %d: run %d {peer %d, %lld rows}", (unsigned long long)seed, p->rank, i, u.peer,
                      (long long)u.n);
            cr_assert(i == 0 || runs[way][i - 1].peer < u.peer, "seed %llu rank %d: runs not by ascending peer",
                      (unsigned long long)seed, p->rank);
            int64_t at = u.row;
            for (int c = 0; c < n_chunks[way]; c++) {
                const symm_nccl_chunk k = lists[way][c];
                if (k.peer != u.peer)
                    continue;
                cr_assert_eq(staged ? k.stage : k.row, at, "seed %llu rank %d: the chunks with %d are not one run",
                             (unsigned long long)seed, p->rank, u.peer);
                at += k.n;
                used++;
            }
            cr_assert_eq(at, u.row + u.n, "seed %llu rank %d: run with %d: %lld rows, its chunks %lld",
                         (unsigned long long)seed, p->rank, u.peer, (long long)u.n, (long long)(at - u.row));
        }
        int others = 0;
        for (int c = 0; c < n_chunks[way]; c++)
            others += lists[way][c].peer != p->rank;
        cr_assert_eq(used, others, "seed %llu rank %d: chunks with peers outside the runs", (unsigned long long)seed,
                     p->rank);
    }
    int64_t staged = 0;
    for (int c = 0; c < p->n_recv; c++) {
        const symm_nccl_chunk k = p->recv_chunks[c];
        const bool in_stage = p->expert_layout && k.peer != p->rank;
        cr_assert_eq(k.stage, in_stage ? staged : -1, "seed %llu rank %d: chunk %d's stage row",
                     (unsigned long long)seed, p->rank, c);
        if (in_stage)
            staged += k.n;
    }
    cr_assert_eq(p->stage_rows, staged, "seed %llu rank %d: stage_rows", (unsigned long long)seed, p->rank);
    cr_assert(staged <= symm_nccl_stage_capacity(p->world, max_send, p->capacity),
              "seed %llu rank %d: %lld stage rows past the stage's capacity", (unsigned long long)seed, p->rank,
              (long long)staged);
}

/* A random top-k row: distinct experts, some masked (-1), some invalid (out
 * of range or a repeat of an earlier entry), or a hot expert range. */
static void random_row(moe_rng *g, const symm_ref_config *c, int32_t *row, int mode)
{
    const int K = c->topk, E = c->experts;
    const int range = mode == 1 ? (K > 3 ? K : 3 < E ? 3 : E) : E; /* >= K: distinct ids exist */
    for (int k = 0; k < K; k++) {
        int e;
        do
            e = moe_rng_int(g, range);
        while (moe_row_has(row, k, e));
        row[k] = e;
        const int u = moe_rng_int(g, 20);
        if (mode == 2 && u < 3)
            row[k] = -1;
        else if (mode == 2 && u == 3)
            row[k] = moe_rng_int(g, 2) ? E + moe_rng_int(g, 5) : -2 - moe_rng_int(g, 5);
        else if (mode == 2 && u == 4 && k > 0)
            row[k] = row[moe_rng_int(g, k)];
    }
}

/* symm_nccl_count's and symm_nccl_pack's cut of tokens [0, T) into
 * blocks, then warps: the first token of block b's run, and its length. */
static void block_run(const rank_plan *r, int T, int b, int *begin, int *len)
{
    const int per_block = (T + r->blocks - 1) / r->blocks;
    *begin = b * per_block < T ? b * per_block : T;
    *len = (*begin + per_block < T ? *begin + per_block : T) - *begin;
}

/* The lane rule of classify (templates/variant.cu.in): entry k is valid when
 * in [0, E) and no earlier entry holds the same id; layout rank, the owner
 * of a destination rank is its first valid entry. */
static bool entry_valid(const symm_ref_config *c, const int32_t *ids, int k)
{
    bool ok = ids[k] >= 0 && ids[k] < c->experts;
    for (int j = 0; j < k; j++)
        ok = ok && ids[j] != ids[k];
    return ok;
}

/* symm_nccl_count then symm_nccl_scan on rank s: its route (indexes among
 * its warp's rows per bin), token weights, work and count row; returns
 * the invalid ids. */
static int model_count(const symm_ref_config *c, rank_plan *r, int32_t *count_row)
{
    const int W = c->world, K = c->topk, L = c->experts / W, T = r->tokens;
    const bool expert = c->layout == SYMM_LAYOUT_EXPERT;
    const int bins = expert ? c->experts : W, per = expert ? K : W, wpb = r->wpb, blocks = r->blocks;
    int32_t *block_rows = r->work + (size_t)blocks * wpb * bins;
    int32_t *warp_rows = zalloc((size_t)wpb * bins * 4);
    int invalid = 0;
    for (int b = 0; b < blocks; b++) {
        memset(warp_rows, 0, (size_t)wpb * bins * 4);
        int begin, len;
        block_run(r, T, b, &begin, &len);
        const int per_warp = (len + wpb - 1) / wpb;
        int block_invalid = 0;
        for (int w = 0; w < wpb; w++) {
            const int t0 = begin + (w * per_warp < len ? w * per_warp : len);
            const int t1 = t0 + per_warp < begin + len ? t0 + per_warp : begin + len;
            int32_t *count = warp_rows + (size_t)w * bins;
            for (int t = t0; t < t1; t++) {
                const int32_t *ids = r->topk + (size_t)t * K;
                int32_t *route = r->route + (size_t)t * per;
                for (int i = 0; i < per; i++)
                    route[i] = -1;
                for (int k = 0; k < K; k++) {
                    const bool valid = entry_valid(c, ids, k);
                    block_invalid += !valid && ids[k] != -1;
                    if (expert)
                        r->token_weights[(size_t)t * K + k] =
                            valid && c->weights ? r->weights[(size_t)t * K + k] : 0.0f;
                    if (!valid)
                        continue;
                    const int bin = expert ? ids[k] : ids[k] / L;
                    bool owner = true;
                    for (int j = 0; j < k && !expert; j++)
                        owner = owner && !(entry_valid(c, ids, j) && ids[j] / L == bin);
                    if (owner)
                        route[expert ? k : bin] = count[bin]++;
                }
            }
        }
        for (int bin = 0; bin < bins; bin++) {
            int sum = 0;
            for (int w = 0; w < wpb; w++) {
                r->work[((size_t)b * wpb + w) * bins + bin] = sum;
                sum += warp_rows[(size_t)w * bins + bin];
            }
            block_rows[(size_t)b * bins + bin] = sum;
        }
        block_rows[(size_t)blocks * bins + b] = block_invalid;
    }
    /* symm_nccl_scan */
    for (int bin = 0; bin < bins; bin++) {
        int sum = 0;
        for (int b = 0; b < blocks; b++) {
            const int rows = block_rows[(size_t)b * bins + bin];
            block_rows[(size_t)b * bins + bin] = sum;
            sum += rows;
        }
        count_row[bin] = sum;
    }
    for (int b = 0; b < blocks; b++)
        invalid += block_rows[(size_t)blocks * bins + b];
    free(warp_rows);
    return invalid;
}

/* symm_nccl_pack on rank s, with its plan's base: every (token, slot). */
static void model_pack(const symm_ref_config *c, rank_plan *r)
{
    const int W = c->world, K = c->topk, L = c->experts / W, T = r->tokens, me = r->p.rank;
    const bool expert = c->layout == SYMM_LAYOUT_EXPERT;
    const int bins = expert ? c->experts : W, per = expert ? K : W, wpb = r->wpb, blocks = r->blocks;
    const int64_t cap = r->p.capacity, *base = r->p.base;
    const int32_t *block_first = r->work + (size_t)blocks * wpb * bins;
    for (int t = 0; t < T; t++) {
        /* plan_slice */
        const int per_block = (T + blocks - 1) / blocks, b = t / per_block;
        int begin, len;
        block_run(r, T, b, &begin, &len);
        const int w = (t - begin) / ((len + wpb - 1) / wpb);
        for (int slot = 0; slot < per; slot++) {
            int32_t *route = r->route + (size_t)t * per + slot;
            if (*route < 0)
                continue;
            const int bin = expert ? r->topk[(size_t)t * K + slot] : slot;
            const int64_t n = *route + r->work[((size_t)b * wpb + w) * bins + bin] + block_first[(size_t)b * bins + bin];
            const int64_t dest = base[bin] + n, at = base[bins + bin] + n;
            if (dest >= cap) {
                *route = -1;
                continue;
            }
            *route = (int32_t)dest;
            /* This rank's own rows: their metadata straight to the received
             * row, their COMBINE_IN slot -1. */
            const bool own = (expert ? bin / L : bin) == me;
            if (own)
                r->self_dst[at - r->p.self_first] = (int32_t)dest;
            r->send_index[at] = t;
            r->stage_index[at] = own ? -1 : expert ? t * K + slot : slot * c->max_tokens + t;
            int32_t *src = own ? r->own_src + dest * 4 : r->send_src + at * 4;
            src[0] = me, src[1] = t, src[2] = expert ? slot : -1, src[3] = 0;
        }
    }
}

/* The rest of the metadata symm_nccl_pack writes for a row of token t for
 * rank dest (entry k for layout expert), from the caller's top-k arrays:
 * layout rank, the local ids at the destination and their weights; layout
 * expert, the weight of its k. */
static void pack_meta(const symm_ref_config *c, const rank_plan *r, int t, int dest, int k_expert, int32_t *topk,
                      float *w)
{
    const int K = c->topk, L = c->experts / c->world;
    if (c->layout == SYMM_LAYOUT_EXPERT) {
        w[0] = c->weights ? r->weights[(size_t)t * K + k_expert] : 0.0f;
        return;
    }
    const int32_t *ids = r->topk + (size_t)t * K;
    for (int k = 0; k < K; k++) {
        bool local = ids[k] >= 0 && ids[k] < c->experts && ids[k] / L == dest;
        for (int j = 0; j < k; j++)
            local = local && ids[j] != ids[k];
        topk[k] = local ? ids[k] - dest * L : -1;
        w[k] = local && c->weights ? r->weights[(size_t)t * K + k] : 0.0f;
    }
}

static void one_world(uint64_t seed)
{
    moe_rng g = moe_rng_for(seed, 1, 2);
    symm_ref_config c = {0};
    c.world = 2 + moe_rng_int(&g, MAX_W - 1);
    c.experts = c.world * (1 + moe_rng_int(&g, 6));
    c.topk = 1 + moe_rng_int(&g, c.experts < 16 ? c.experts : 16);
    c.max_tokens = 1 + moe_rng_int(&g, 48);
    c.hidden = 8;
    c.dtype = SYMM_DTYPE_BF16;
    c.combine_dtype = SYMM_DTYPE_BF16;
    c.layout = moe_rng_int(&g, 2) ? SYMM_LAYOUT_EXPERT : SYMM_LAYOUT_RANK;
    c.weights = moe_rng_int(&g, 2);
    c.align = c.layout == SYMM_LAYOUT_EXPERT ? 1 + moe_rng_int(&g, 8) : 1;
    const int64_t worst = symm_ref_worst_capacity(&c);
    c.capacity = moe_rng_int(&g, 2) ? 0 : 1 + moe_rng_int(&g, (int)worst);
    cr_assert_eq(symm_ref_check_config(&c), SYMM_OK, "seed %llu: %s", (unsigned long long)seed, symm_last_error());
    const int64_t cap = symm_ref_capacity(&c);
    const int W = c.world, K = c.topk, L = c.experts / W;
    const bool expert = c.layout == SYMM_LAYOUT_EXPERT;
    const int bins = expert ? c.experts : W;
    const int mode = moe_rng_int(&g, 3);

    /* Inputs, and every rank's count row. */
    int32_t *counts = zalloc((size_t)W * bins * 4);
    rank_plan r[MAX_W];
    symm_ref_input in[MAX_W];
    void *x = zalloc((size_t)c.max_tokens * c.hidden * 2);
    for (int s = 0; s < W; s++) {
        plan_alloc(&r[s], &c, s, cap, counts, &g);
        const int pick = moe_rng_int(&g, 4);
        r[s].tokens = pick == 0 ? 0 : pick == 1 ? c.max_tokens : moe_rng_int(&g, c.max_tokens + 1);
        for (int t = 0; t < r[s].tokens; t++)
            random_row(&g, &c, r[s].topk + (size_t)t * K, mode);
        moe_random_floats(&g, r[s].weights, (size_t)r[s].tokens * K, 0.0);
        in[s] = (symm_ref_input){.tokens = r[s].tokens, .x = x, .topk_idx = r[s].topk,
                                 .topk_weights = c.weights ? r[s].weights : NULL};
        r[s].invalid = model_count(&c, &r[s], counts + (size_t)s * bins);
    }
    /* The all-gather gave every rank the same matrix: each plans its chunks
     * and packs its rows. */
    for (int s = 0; s < W; s++) {
        symm_nccl_plan_chunks(&r[s].p);
        model_pack(&c, &r[s]);
    }

    symm_ref_recv ref[MAX_W];
    symm_ref_send_stats stats[MAX_W];
    for (int p = 0; p < W; p++)
        cr_assert_eq(symm_ref_recv_alloc(&c, &ref[p]), SYMM_OK);
    symm_status st = symm_ref_dispatch(&c, in, ref, stats);
    cr_assert(st == SYMM_OK || st == SYMM_ERR_OVERFLOW, "seed %llu: %s", (unsigned long long)seed,
              symm_last_error());

    for (int s = 0; s < W; s++) {
        cr_assert_eq(r[s].invalid, stats[s].invalid, "seed %llu rank %d: invalid %d, reference %lld",
                     (unsigned long long)seed, s, r[s].invalid, (long long)stats[s].invalid);
        cr_assert_eq(r[s].p.dropped_send, stats[s].dropped, "seed %llu rank %d: dropped_send %d, reference %lld",
                     (unsigned long long)seed, s, r[s].p.dropped_send, (long long)stats[s].dropped);
    }

    /* The runs, and that NCCL's sends and receives pair up: one a peer each
     * way, of one size. */
    const int64_t max_send = (int64_t)c.max_tokens * (expert ? K : (K < W ? K : W));
    for (int s = 0; s < W; s++) {
        check_runs(seed, &r[s].p, max_send);
        for (int p = 0; p < W; p++) {
            const symm_nccl_chunk *out = run_with(r[s].p.send_runs, r[s].p.n_send_runs, p);
            const symm_nccl_chunk *in_ = run_with(r[p].p.recv_runs, r[p].p.n_recv_runs, s);
            cr_assert((out == NULL) == (in_ == NULL) && (!out || out->n == in_->n),
                      "seed %llu: %d sends %lld rows to %d, which receives %lld", (unsigned long long)seed, s,
                      out ? (long long)out->n : 0ll, p, in_ ? (long long)in_->n : 0ll);
        }
    }

    /* Chunk by chunk: receiver p takes from sender s its chunks in order,
     * each where the runs put it. */
    int next_send[MAX_W][MAX_W] = {{0}}; /* [s][p]: index into s's send chunks */
    int64_t self_landed[MAX_W] = {0};
    for (int p = 0; p < W; p++) {
        const symm_nccl_plan *rp = &r[p].p;
        const symm_ref_recv *rf = &ref[p];
        cr_assert_eq(rp->recv_rows, rf->rows, "seed %llu rank %d: recv_rows %d, reference %lld",
                     (unsigned long long)seed, p, rp->recv_rows, (long long)rf->rows);
        cr_assert_eq(rp->dropped_recv, rf->dropped, "seed %llu rank %d: dropped_recv", (unsigned long long)seed, p);
        int64_t landed = 0;
        int32_t *hist = zalloc((size_t)L * 4);
        /* The chunk list symm_nccl_unstage gets (variant_nccl.c). */
        int32_t *unstage = zalloc((size_t)rp->n_recv * 8);
        const int m = symm_nccl_unstage_list(rp, unstage);
        for (int i = 0; i < rp->n_recv; i++) {
            const symm_nccl_chunk rc = rp->recv_chunks[i];
            const rank_plan *sr = &r[rc.peer];
            const symm_nccl_plan *sp = &sr->p;
            int *k = &next_send[rc.peer][p];
            while (*k < sp->n_send && sp->send_chunks[*k].peer != p)
                (*k)++;
            cr_assert(*k < sp->n_send, "seed %llu: rank %d expects a chunk from %d that it never sends",
                      (unsigned long long)seed, p, rc.peer);
            const symm_nccl_chunk sc = sp->send_chunks[(*k)++];
            cr_assert_eq(sc.n, rc.n, "seed %llu: %d sends %lld rows to %d, which receives %lld",
                         (unsigned long long)seed, rc.peer, (long long)sc.n, p, (long long)rc.n);
            cr_assert(rc.row >= 0 && rc.row + rc.n <= cap, "seed %llu: chunk past the capacity",
                      (unsigned long long)seed);
            const symm_nccl_chunk *out = run_with(sp->send_runs, sp->n_send_runs, p);
            const symm_nccl_chunk *in_ = run_with(rp->recv_runs, rp->n_recv_runs, rc.peer);
            for (int64_t j = 0; j < rc.n; j++) {
                const int64_t row = rc.row + j, from = sc.row + j;
                if (rc.peer != p) {
                    /* Where NCCL puts packed row `from` of the sender, and
                     * where the unstage kernel takes it from there. */
                    const int64_t at = expert ? rc.stage + j : row;
                    cr_assert_eq(out->row + (at - in_->row), from,
                                 "seed %llu: rank %d's row %lld from %d is the sender's packed row %lld, its run "
                                 "carries %lld there", (unsigned long long)seed, p, (long long)row, rc.peer,
                                 (long long)from, (long long)(out->row + (at - in_->row)));
                    if (expert)
                        cr_assert_eq(staged_row(unstage, m, at), row,
                                     "seed %llu: rank %d's stage row %lld goes to row %lld, belongs at %lld",
                                     (unsigned long long)seed, p, (long long)at, (long long)staged_row(unstage, m, at),
                                     (long long)row);
                }
                if (rc.peer == p) {
                    cr_assert(from >= sp->self_first && from < sp->self_first + sp->self_rows,
                              "seed %llu: rank %d's packed row %lld for itself is outside its self rows [%lld, +%lld)",
                              (unsigned long long)seed, p, (long long)from, (long long)sp->self_first,
                              (long long)sp->self_rows);
                    cr_assert_eq(sr->self_dst[from - sp->self_first], row,
                                 "seed %llu: rank %d's packed row %lld for itself goes to row %d, lands at %lld",
                                 (unsigned long long)seed, p, (long long)from, sr->self_dst[from - sp->self_first],
                                 (long long)row);
                    self_landed[p]++;
                }
                /* A row for a peer carries its metadata from the send buffer;
                 * a rank's own row has it at its received row already. */
                const bool own = rc.peer == p;
                const int32_t *src = own ? sr->own_src + row * 4 : sr->send_src + from * 4;
                cr_assert_arr_eq(src, rf->src + row * 4, 16,
                                 "seed %llu: rank %d row %lld: src {%d, %d, %d} against the reference's {%d, %d, %d}",
                                 (unsigned long long)seed, p, (long long)row, src[0], src[1], src[2], rf->src[row * 4],
                                 rf->src[row * 4 + 1], rf->src[row * 4 + 2]);
                const int t = src[1];
                cr_assert_eq(sr->send_index[from], t, "seed %llu: send_index", (unsigned long long)seed);
                int32_t meta_topk[16];
                float meta_w[16];
                pack_meta(&c, &r[rc.peer], t, p, src[2], meta_topk, meta_w);
                if (!expert) {
                    cr_assert_arr_eq(meta_topk, rf->topk_idx + row * K, (size_t)K * 4,
                                     "seed %llu: rank %d row %lld: local top-k ids", (unsigned long long)seed, p,
                                     (long long)row);
                    for (int e = 0; e < K; e++)
                        if (meta_topk[e] >= 0)
                            hist[meta_topk[e]]++;
                    if (c.weights)
                        cr_assert_arr_eq(meta_w, rf->weights + row * K, (size_t)K * 4,
                                         "seed %llu: rank %d row %lld: weights", (unsigned long long)seed, p,
                                         (long long)row);
                    cr_assert_eq(sr->route[(size_t)t * W + p], row, "seed %llu: route of %d's token %d to %d",
                                 (unsigned long long)seed, rc.peer, t, p);
                    cr_assert_eq(sr->stage_index[from], own ? -1 : p * c.max_tokens + t, "seed %llu: stage",
                                 (unsigned long long)seed);
                } else {
                    const int kk = src[2];
                    if (c.weights)
                        cr_assert_eq(meta_w[0], rf->weights[row], "seed %llu: rank %d row %lld: weight",
                                     (unsigned long long)seed, p, (long long)row);
                    cr_assert_eq(sr->route[(size_t)t * K + kk], row, "seed %llu: route of %d's (%d, %d)",
                                 (unsigned long long)seed, rc.peer, t, kk);
                    cr_assert_eq(sr->stage_index[from], own ? -1 : t * K + kk, "seed %llu: stage",
                                 (unsigned long long)seed);
                }
            }
            landed += rc.n;
        }
        /* Every row the reference wrote arrived (layout expert: its segments). */
        int64_t kept = 0;
        if (expert) {
            for (int j = 0; j < L; j++) {
                kept += rf->expert_count[j];
                cr_assert_eq(rp->expert[j], rf->expert_count[j], "seed %llu: rank %d expert %d count",
                             (unsigned long long)seed, p, j);
                cr_assert_eq(rp->expert[L + j], rf->expert_offset[j], "seed %llu: rank %d expert %d offset",
                             (unsigned long long)seed, p, j);
            }
        } else {
            kept = rf->rows;
            /* The backend counts the experts from the received ids. */
            cr_assert_arr_eq(hist, rf->expert_count, (size_t)L * 4, "seed %llu: rank %d expert counts",
                             (unsigned long long)seed, p);
        }
        cr_assert_eq(landed, kept, "seed %llu: rank %d: %lld rows landed, the reference kept %lld",
                     (unsigned long long)seed, p, (long long)landed, (long long)kept);
        cr_assert_eq(self_landed[p], rp->self_rows, "seed %llu: rank %d: %lld of its rows for itself landed, it "
                     "plans %lld", (unsigned long long)seed, p, (long long)self_landed[p], (long long)rp->self_rows);
        free(hist);
        free(unstage);
    }
    /* Nothing sent that nobody receives; every route entry is a landed row. */
    for (int s = 0; s < W; s++) {
        int64_t routed = 0;
        const int per = expert ? K : W;
        for (int i = 0; i < r[s].tokens * per; i++)
            routed += r[s].route[i] >= 0;
        cr_assert_eq(routed, r[s].p.packed, "seed %llu: rank %d routes %lld rows, packs %lld",
                     (unsigned long long)seed, s, (long long)routed, (long long)r[s].p.packed);
        for (int p = 0; p < W; p++) {
            for (int i = next_send[s][p]; i < r[s].p.n_send; i++)
                cr_assert_neq(r[s].p.send_chunks[i].peer, p, "seed %llu: %d sends a chunk to %d that it never receives",
                              (unsigned long long)seed, s, p);
        }
    }
    for (int p = 0; p < W; p++)
        symm_ref_recv_free(&ref[p]);
    for (int s = 0; s < W; s++)
        plan_free(&r[s]);
    free(counts);
    free(x);
}

Test(nccl_plan, rows_chunks_and_counts_match_the_reference_for_random_worlds)
{
    wf_watchdog(120);
    const uint64_t base = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 16;
    for (uint64_t i = 0; i < 400; i++)
        one_world(base + i);
}
