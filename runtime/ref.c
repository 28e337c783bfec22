/* ref.c: the CPU reference of dispatch and combine (symm_ref.h): the
 * routing both operations share, and the operations themselves.
 *
 * Plain C and libm, no CUDA: it must build and run without the toolkit.
 * Routing is recomputed from the inputs on every call, walking tokens in
 * (source rank, source token) order and handing out each destination's rows
 * in that order, which is exactly the row order the contract fixes. */
#if defined(__FAST_MATH__)
#error "ref.c must not be built with -ffast-math: combine must round exactly like the GPU"
#endif
/* Combine must not fuse a*b+c behind our back. GCC ignores (and warns about)
 * this pragma, but in ISO mode (-std=c11, as the Makefile builds) it already
 * defaults to -ffp-contract=off; besides, the only sums here are plain adds
 * and explicit fmaf calls, so there is nothing to contract. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "symm_ref.h"
#include "threads.h"

/* ---- routing ------------------------------------------------------------- */

/* Bit k set when topk entry k is valid: in [0, E) and unlike every earlier
 * entry of the row. */
static uint32_t valid_mask(const int32_t *row, int topk, int experts)
{
    uint32_t mask = 0;
    for (int k = 0; k < topk; k++) {
        if (row[k] < 0 || row[k] >= experts)
            continue;
        int repeat = 0;
        for (int i = 0; i < k && !repeat; i++)
            repeat = row[i] == row[k];
        if (!repeat)
            mask |= 1u << k;
    }
    return mask;
}

static int invalid_entries(const int32_t *row, int topk, uint32_t mask)
{
    int n = 0;
    for (int k = 0; k < topk; k++)
        n += row[k] != -1 && !(mask & (1u << k));
    return n;
}

/* The distinct ranks owning the valid experts of a row, ascending. */
static int token_ranks(const int32_t *row, int topk, uint32_t mask, int local, int *ranks)
{
    int n = 0;
    for (int k = 0; k < topk; k++) {
        if (!(mask & (1u << k)))
            continue;
        int p = row[k] / local, i = n;
        while (i > 0 && ranks[i - 1] > p)
            i--;
        if (i > 0 && ranks[i - 1] == p)
            continue;
        memmove(ranks + i + 1, ranks + i, (size_t)(n - i) * sizeof *ranks);
        ranks[i] = p;
        n++;
    }
    return n;
}

/* Where a whole world's tokens go, from counts of a first pass over them. */
typedef struct plan {
    const symm_ref_config *cfg;
    int local;
    int64_t capacity;
    int64_t *need;    /* [W] rows each rank needs (end of the last segment) */
    int64_t *count;   /* [E] layout expert: valid entries naming expert e */
    int64_t *offset;  /* [E] layout expert: start of e's segment, unclamped */
    int64_t *next;    /* [W] or [E]: rows handed out so far */
} plan;

/* One copy of a token: its rank, its k (layout expert; -1 for rank) and
 * its row there (>= capacity: dropped). */
typedef struct dest {
    int rank, k;
    int64_t row;
} dest;

static const int32_t *topk_row(const symm_ref_input *in, int t, int topk)
{
    return in->topk_idx + (size_t)t * (size_t)topk;
}

static void plan_count(plan *pl, const symm_ref_input *in)
{
    const symm_ref_config *c = pl->cfg;
    int ranks[SYMM_REF_MAX_TOPK];
    for (int s = 0; s < c->world; s++) {
        for (int t = 0; t < in[s].tokens; t++) {
            const int32_t *row = topk_row(&in[s], t, c->topk);
            uint32_t mask = valid_mask(row, c->topk, c->experts);
            if (c->layout == SYMM_LAYOUT_RANK) {
                int n = token_ranks(row, c->topk, mask, pl->local, ranks);
                for (int i = 0; i < n; i++)
                    pl->need[ranks[i]]++;
                continue;
            }
            for (int k = 0; k < c->topk; k++)
                if (mask & (1u << k))
                    pl->count[row[k]]++;
        }
    }
}

static void plan_segments(plan *pl)
{
    const symm_ref_config *c = pl->cfg;
    for (int p = 0; p < c->world; p++) {
        int64_t end = 0;
        for (int j = 0; j < pl->local; j++) {
            int e = p * pl->local + j;
            if (j > 0)
                end = (end + c->align - 1) / c->align * c->align;
            pl->offset[e] = end;
            end += pl->count[e];
        }
        pl->need[p] = end;
    }
}

static symm_status plan_init(plan *pl, const symm_ref_config *c, const symm_ref_input *in,
                             const char *fn)
{
    memset(pl, 0, sizeof *pl);
    pl->cfg = c;
    pl->local = c->experts / c->world;
    pl->capacity = symm_ref_capacity(c);
    size_t n = (size_t)c->world * 2 + (size_t)c->experts * 3;
    int64_t *mem = calloc(n, sizeof *mem);
    if (!mem)
        return symm_fail(SYMM_ERR_NOMEM, "%s: cannot allocate %zu routing counters", fn, n);
    pl->need = mem;
    pl->count = pl->need + c->world;
    pl->offset = pl->count + c->experts;
    pl->next = pl->offset + c->experts;
    plan_count(pl, in);
    if (c->layout == SYMM_LAYOUT_EXPERT)
        plan_segments(pl);
    return SYMM_OK;
}

static void plan_free(plan *pl) { free(pl->need); }

/* The copies of one token, in combine order (ranks ascending for layout
 * rank, k ascending for layout expert). Hands out rows: call it once per
 * token, tokens in (source rank, source token) order. */
static int route_token(plan *pl, const int32_t *row, uint32_t mask, dest *d)
{
    const symm_ref_config *c = pl->cfg;
    int n = 0;
    if (c->layout == SYMM_LAYOUT_RANK) {
        int ranks[SYMM_REF_MAX_TOPK];
        n = token_ranks(row, c->topk, mask, pl->local, ranks);
        for (int i = 0; i < n; i++)
            d[i] = (dest){ ranks[i], -1, pl->next[ranks[i]]++ };
        return n;
    }
    for (int k = 0; k < c->topk; k++) {
        if (!(mask & (1u << k)))
            continue;
        int e = row[k];
        d[n++] = (dest){ e / pl->local, k, pl->offset[e] + pl->next[e]++ };
    }
    return n;
}

/* The i-th source rank in the order rows are handed out: s = i on one
 * host; across hosts (hosts H >= 2, L = W / H ranks a host) local index
 * major, host minor: i = l * H + h is rank h * L + l, so that each
 * destination's rows come by (source local index, source host, source
 * token), as the hybrid backend's proxies forward them. */
static int source_at(const symm_ref_config *c, int i)
{
    if (c->hosts < 2)
        return i;
    const int H = c->hosts, L = c->world / H;
    return (i % H) * L + i / H;
}

/* ---- argument checks ----------------------------------------------------- */

static symm_status check_inputs(const char *fn, const symm_ref_config *c,
                                const symm_ref_input *in, int dispatching)
{
    if (!in)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: in is NULL", fn);
    int need_weights = c->weights && (dispatching || c->layout == SYMM_LAYOUT_EXPERT);
    for (int s = 0; s < c->world; s++) {
        const symm_ref_input *i = &in[s];
        if (i->tokens < 0 || i->tokens > c->max_tokens)
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s: in[%d].tokens %d: expected 0..%d (max_tokens)",
                             fn, s, i->tokens, c->max_tokens);
        if (i->tokens == 0)
            continue;
        const char *missing = !i->topk_idx                                     ? "topk_idx"
                              : dispatching && !i->x                           ? "x"
                              : dispatching && c->dtype == SYMM_DTYPE_FP8_E4M3 &&
                                        !i->x_scales                           ? "x_scales"
                              : need_weights && !i->topk_weights               ? "topk_weights"
                                                                               : NULL;
        if (missing)
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s: in[%d].%s is NULL with %d tokens", fn, s,
                             missing, i->tokens);
    }
    return SYMM_OK;
}

static symm_status check_recv(const char *fn, const symm_ref_config *c, const symm_ref_recv *recv,
                              int dispatching)
{
    if (!recv)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: recv is NULL", fn);
    int64_t cap = symm_ref_capacity(c);
    for (int p = 0; p < c->world; p++) {
        const symm_ref_recv *r = &recv[p];
        if (r->capacity != cap)
            return symm_fail(SYMM_ERR_INVALID_ARG,
                             "%s: recv[%d].capacity %lld: expected %lld (the config's capacity)", fn,
                             p, (long long)r->capacity, (long long)cap);
        if (!dispatching)
            continue;
        const char *missing = !r->x                                                 ? "x"
                              : !r->src                                             ? "src"
                              : !r->expert_count                                    ? "expert_count"
                              : !r->expert_offset                                   ? "expert_offset"
                              : c->dtype == SYMM_DTYPE_FP8_E4M3 && !r->scales       ? "scales"
                              : c->layout == SYMM_LAYOUT_RANK && !r->topk_idx       ? "topk_idx"
                              : c->weights && !r->weights                           ? "weights"
                                                                                    : NULL;
        if (missing)
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s: recv[%d].%s is NULL", fn, p, missing);
    }
    return SYMM_OK;
}

static symm_status check_call(const char *fn, const symm_ref_config *c, const symm_ref_input *in,
                              const symm_ref_recv *recv, int dispatching)
{
    symm_status st = symm_ref_check_config(c);
    if (st != SYMM_OK)
        return symm_fail_context(st, "%s: ", fn);
    SYMM_TRY(check_inputs(fn, c, in, dispatching));
    return check_recv(fn, c, recv, dispatching);
}

/* ---- dispatch ------------------------------------------------------------ */

static void copy_payload(const symm_ref_config *c, const symm_ref_input *in, int t,
                         symm_ref_recv *r, int64_t row)
{
    size_t bytes = (size_t)c->hidden * (size_t)symm_dtype_size(c->dtype);
    memcpy((char *)r->x + (size_t)row * bytes, (const char *)in->x + (size_t)t * bytes, bytes);
    if (c->dtype != SYMM_DTYPE_FP8_E4M3)
        return;
    size_t blocks = (size_t)(c->hidden / SYMM_FP8_BLOCK);
    memcpy(r->scales + (size_t)row * blocks, in->x_scales + (size_t)t * blocks,
           blocks * sizeof(float));
}

static void write_rank_row(const plan *pl, const symm_ref_input *in, int s, int t, uint32_t mask,
                           int p, symm_ref_recv *r, int64_t row)
{
    const symm_ref_config *c = pl->cfg;
    const int32_t *ids = topk_row(in, t, c->topk);
    size_t base = (size_t)row * (size_t)c->topk;
    copy_payload(c, in, t, r, row);
    memcpy(r->src + (size_t)row * 4, (int32_t[4]){ s, t, -1, 0 }, 4 * sizeof(int32_t));
    for (int k = 0; k < c->topk; k++) {
        int j = (mask & (1u << k)) && ids[k] / pl->local == p ? ids[k] - p * pl->local : -1;
        r->topk_idx[base + k] = j;
        if (c->weights)
            r->weights[base + k] = j >= 0 ? in->topk_weights[(size_t)t * c->topk + k] : 0.0f;
        if (j >= 0)
            r->expert_count[j]++;
    }
}

static void write_expert_row(const symm_ref_config *c, const symm_ref_input *in, int s, int t,
                             int k, symm_ref_recv *r, int64_t row)
{
    copy_payload(c, in, t, r, row);
    memcpy(r->src + (size_t)row * 4, (int32_t[4]){ s, t, k, 0 }, 4 * sizeof(int32_t));
    if (c->weights)
        r->weights[row] = in->topk_weights[(size_t)t * c->topk + k];
}

/* rows, expert_offset and expert_count as the contract reports them. */
static void finish_counts(const plan *pl, symm_ref_recv *recv)
{
    const symm_ref_config *c = pl->cfg;
    int64_t cap = pl->capacity;
    for (int p = 0; p < c->world; p++) {
        symm_ref_recv *r = &recv[p];
        r->rows = pl->need[p] < cap ? pl->need[p] : cap;
        if (c->layout == SYMM_LAYOUT_RANK)
            continue;
        for (int j = 0; j < pl->local; j++) {
            int e = p * pl->local + j;
            int64_t off = pl->offset[e], fit = cap - off;
            fit = fit < 0 ? 0 : fit > pl->count[e] ? pl->count[e] : fit;
            r->expert_offset[j] = (int32_t)(off < cap ? off : cap);
            r->expert_count[j] = (int32_t)fit;
        }
    }
}

static void dispatch_rows(plan *pl, const symm_ref_input *in, symm_ref_recv *recv,
                          symm_ref_send_stats *stats)
{
    const symm_ref_config *c = pl->cfg;
    for (int p = 0; p < c->world; p++) {
        recv[p].dropped = 0;
        for (int j = 0; j < pl->local; j++)
            recv[p].expert_count[j] = recv[p].expert_offset[j] = 0;
    }
    dest d[SYMM_REF_MAX_TOPK];
    for (int s = 0; s < c->world; s++)
        stats[s] = (symm_ref_send_stats){ 0, 0 };
    for (int i = 0; i < c->world; i++) {
        const int s = source_at(c, i);
        for (int t = 0; t < in[s].tokens; t++) {
            const int32_t *row = topk_row(&in[s], t, c->topk);
            uint32_t mask = valid_mask(row, c->topk, c->experts);
            stats[s].invalid += invalid_entries(row, c->topk, mask);
            int n = route_token(pl, row, mask, d);
            for (int i = 0; i < n; i++) {
                symm_ref_recv *r = &recv[d[i].rank];
                if (d[i].row >= pl->capacity) {
                    r->dropped++;
                    stats[s].dropped++;
                } else if (c->layout == SYMM_LAYOUT_RANK) {
                    write_rank_row(pl, &in[s], s, t, mask, d[i].rank, r, d[i].row);
                } else {
                    write_expert_row(c, &in[s], s, t, d[i].k, r, d[i].row);
                }
            }
        }
    }
    finish_counts(pl, recv);
}

static void appendf(char *buf, size_t size, size_t *len, const char *fmt, ...) SYMM_PRINTF(4, 5);

static void appendf(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, size - *len, fmt, ap);
    va_end(ap);
    if (n > 0)
        *len = *len + (size_t)n < size ? *len + (size_t)n : size - 1;
}

/* SYMM_ERR_OVERFLOW naming every rank that dropped, sent a dropped row or
 * sent an invalid id, with its count; SYMM_OK when there are none. */
static symm_status report(const plan *pl, const symm_ref_recv *recv,
                          const symm_ref_send_stats *stats)
{
    const symm_ref_config *c = pl->cfg;
    int64_t dropped = 0, invalid = 0;
    for (int s = 0; s < c->world; s++) {
        dropped += stats[s].dropped;
        invalid += stats[s].invalid;
    }
    if (!dropped && !invalid)
        return SYMM_OK;
    char msg[4096];
    size_t len = 0;
    appendf(msg, sizeof msg, &len, "symm_ref_dispatch:");
    if (dropped) {
        appendf(msg, sizeof msg, &len, " %lld rows dropped (capacity %lld rows per rank): dropped at",
                (long long)dropped, (long long)pl->capacity);
        for (int p = 0, n = 0; p < c->world; p++)
            if (recv[p].dropped)
                appendf(msg, sizeof msg, &len, "%s rank %d: %lld", n++ ? "," : "", p,
                        (long long)recv[p].dropped);
        appendf(msg, sizeof msg, &len, "; sent by");
        for (int s = 0, n = 0; s < c->world; s++)
            if (stats[s].dropped)
                appendf(msg, sizeof msg, &len, "%s rank %d: %lld", n++ ? "," : "", s,
                        (long long)stats[s].dropped);
        appendf(msg, sizeof msg, &len, "%s", invalid ? ";" : "");
    }
    if (invalid) {
        appendf(msg, sizeof msg, &len,
                " %lld invalid expert ids (outside -1..%d or repeated in a token's row), skipped: sent by",
                (long long)invalid, c->experts - 1);
        for (int s = 0, n = 0; s < c->world; s++)
            if (stats[s].invalid)
                appendf(msg, sizeof msg, &len, "%s rank %d: %lld", n++ ? "," : "", s,
                        (long long)stats[s].invalid);
    }
    return symm_fail(SYMM_ERR_OVERFLOW, "%s", msg);
}

symm_status symm_ref_dispatch(const symm_ref_config *cfg, const symm_ref_input *in,
                              symm_ref_recv *recv, symm_ref_send_stats *stats)
{
    const char *fn = "symm_ref_dispatch";
    SYMM_TRY(check_call(fn, cfg, in, recv, 1));
    symm_ref_send_stats *own = NULL;
    if (!stats) {
        own = calloc((size_t)cfg->world, sizeof *own);
        if (!own)
            return symm_fail(SYMM_ERR_NOMEM, "%s: cannot allocate statistics", fn);
        stats = own;
    }
    plan pl;
    symm_status st = plan_init(&pl, cfg, in, fn);
    if (st == SYMM_OK) {
        dispatch_rows(&pl, in, recv, stats);
        st = report(&pl, recv, stats);
        plan_free(&pl);
    }
    free(own);
    return st;
}

/* ---- combine ------------------------------------------------------------- */

/* A row of y (or out) as floats; the element loads go through memcpy, as
 * the caller's buffers need not be aligned. The dtype is chosen once a row. */
static void load_row(const void *base, int64_t row, int hidden, symm_dtype dtype, float *dst)
{
    const size_t first = (size_t)row * (size_t)hidden;
    const uint16_t *halves = (const uint16_t *)base + first;
    uint16_t half;
    switch (dtype) {
    case SYMM_DTYPE_BF16:
        for (int h = 0; h < hidden; h++) {
            memcpy(&half, halves + h, sizeof half);
            dst[h] = symm_bf16_to_f32(half);
        }
        break;
    case SYMM_DTYPE_FP16:
        for (int h = 0; h < hidden; h++) {
            memcpy(&half, halves + h, sizeof half);
            dst[h] = symm_f16_to_f32(half);
        }
        break;
    default:
        memcpy(dst, (const float *)base + first, (size_t)hidden * sizeof(float));
        break;
    }
}

static void store_row(void *base, int t, int hidden, symm_dtype dtype, const float *acc)
{
    const size_t first = (size_t)t * (size_t)hidden;
    uint16_t *halves = (uint16_t *)base + first, half;
    switch (dtype) {
    case SYMM_DTYPE_BF16:
        for (int h = 0; h < hidden; h++) {
            half = symm_f32_to_bf16(acc[h]);
            memcpy(halves + h, &half, sizeof half);
        }
        break;
    case SYMM_DTYPE_FP16:
        for (int h = 0; h < hidden; h++) {
            half = symm_f32_to_f16(acc[h]);
            memcpy(halves + h, &half, sizeof half);
        }
        break;
    default:
        memcpy((float *)base + first, acc, (size_t)hidden * sizeof(float));
        break;
    }
}

/* Round an fp32 value to the combine dtype and back (exact for fp32). */
static float round_combine(float f, symm_dtype dtype)
{
    switch (dtype) {
    case SYMM_DTYPE_BF16: return symm_bf16_to_f32(symm_f32_to_bf16(f));
    case SYMM_DTYPE_FP16: return symm_f16_to_f32(symm_f32_to_f16(f));
    default: return f;
    }
}

/* Layout expert, combine_order rank: per rank p ascending that kept a row
 * of the token, part = fmaf(w, v, part) over its rows in ascending k from
 * +0, rounded to the combine dtype; acc = acc + part. d is in ascending k. */
static void combine_token_by_rank(const plan *pl, const symm_ref_input *in, int t, const dest *d, int n,
                                  const void *const *y, float *acc, float *row, float *part)
{
    const symm_ref_config *c = pl->cfg;
    for (int p = 0; p < c->world; p++) {
        int kept = 0;
        for (int i = 0; i < n; i++) {
            if (d[i].rank != p || d[i].row >= pl->capacity)
                continue;
            if (kept++ == 0)
                for (int h = 0; h < c->hidden; h++)
                    part[h] = 0.0f;
            load_row(y[p], d[i].row, c->hidden, c->combine_dtype, row);
            float w = c->weights ? in->topk_weights[(size_t)t * c->topk + d[i].k] : 1.0f;
            for (int h = 0; h < c->hidden; h++)
                part[h] = fmaf(w, row[h], part[h]);
        }
        if (kept)
            for (int h = 0; h < c->hidden; h++)
                acc[h] = acc[h] + round_combine(part[h], c->combine_dtype);
    }
}

/* One token's output, from +0: layout rank acc = acc + v over the ranks in
 * the order of d; layout expert acc = fmaf(w, v, acc) in the order of d
 * (combine_order k) or by rank (above). */
static void combine_token(const plan *pl, const symm_ref_input *in, int t, const dest *d, int n,
                          const void *const *y, float *acc, float *row, float *part)
{
    const symm_ref_config *c = pl->cfg;
    for (int h = 0; h < c->hidden; h++)
        acc[h] = 0.0f;
    if (c->layout == SYMM_LAYOUT_EXPERT && c->combine_order == SYMM_COMBINE_ORDER_RANK) {
        combine_token_by_rank(pl, in, t, d, n, y, acc, row, part);
        return;
    }
    for (int i = 0; i < n; i++) {
        if (d[i].row >= pl->capacity)
            continue;
        load_row(y[d[i].rank], d[i].row, c->hidden, c->combine_dtype, row);
        if (c->layout == SYMM_LAYOUT_RANK) {
            for (int h = 0; h < c->hidden; h++)
                acc[h] = acc[h] + row[h];
            continue;
        }
        float w = c->weights ? in->topk_weights[(size_t)t * c->topk + d[i].k] : 1.0f;
        for (int h = 0; h < c->hidden; h++)
            acc[h] = fmaf(w, row[h], acc[h]);
    }
}

/* Across hosts: for each host g ascending that holds a copy of the token
 * (kept or dropped: its proxy returns a row either way), P_g from +0 over
 * g's ranks ascending (layout rank: + v; layout expert: + the rank's part,
 * rounded), rounded once to the combine dtype; acc = acc + P_g from +0.
 * d is in ascending rank (layout rank) or ascending k (layout expert). */
static void combine_token_hosts(const plan *pl, const symm_ref_input *in, int t, const dest *d, int n,
                                const void *const *y, float *acc, float *row, float *part, float *host)
{
    const symm_ref_config *c = pl->cfg;
    const int L = c->world / c->hosts;
    for (int h = 0; h < c->hidden; h++)
        acc[h] = 0.0f;
    for (int g = 0; g < c->hosts; g++) {
        int there = 0;
        for (int i = 0; i < n; i++)
            there |= d[i].rank / L == g;
        if (!there)
            continue;
        for (int h = 0; h < c->hidden; h++)
            host[h] = 0.0f;
        for (int p = g * L; p < (g + 1) * L; p++) {
            int kept = 0;
            for (int i = 0; i < n; i++) {
                if (d[i].rank != p || d[i].row >= pl->capacity)
                    continue;
                load_row(y[p], d[i].row, c->hidden, c->combine_dtype, row);
                if (c->layout == SYMM_LAYOUT_RANK) {
                    for (int h = 0; h < c->hidden; h++)
                        host[h] = host[h] + row[h];
                    continue;
                }
                if (kept++ == 0)
                    for (int h = 0; h < c->hidden; h++)
                        part[h] = 0.0f;
                float w = c->weights ? in->topk_weights[(size_t)t * c->topk + d[i].k] : 1.0f;
                for (int h = 0; h < c->hidden; h++)
                    part[h] = fmaf(w, row[h], part[h]);
            }
            if (kept)
                for (int h = 0; h < c->hidden; h++)
                    host[h] = host[h] + round_combine(part[h], c->combine_dtype);
        }
        for (int h = 0; h < c->hidden; h++)
            acc[h] = acc[h] + round_combine(host[h], c->combine_dtype);
    }
}

/* Layout expert: each segment's reported offset and count must be the ones
 * in routes to it (a token lost to padding changes no row count). */
static symm_status check_segments(const char *fn, const plan *pl, int p, const symm_ref_recv *r)
{
    if (pl->cfg->layout != SYMM_LAYOUT_EXPERT)
        return SYMM_OK;
    for (int j = 0; j < pl->local; j++) {
        int e = p * pl->local + j;
        int64_t off = pl->offset[e], fit = pl->capacity - off;
        fit = fit < 0 ? 0 : fit > pl->count[e] ? pl->count[e] : fit;
        if (r->expert_count[j] != fit || r->expert_offset[j] != (off < pl->capacity ? off : pl->capacity))
            return symm_fail(SYMM_ERR_INVALID_ARG,
                             "%s: recv[%d] local expert %d: %d rows at %d, but in routes %lld rows "
                             "at %lld there; in must be the input of the dispatch that filled recv",
                             fn, p, j, r->expert_count[j], r->expert_offset[j], (long long)fit,
                             (long long)(off < pl->capacity ? off : pl->capacity));
    }
    return SYMM_OK;
}

static symm_status check_combine(const char *fn, const plan *pl, const symm_ref_input *in,
                                 const symm_ref_recv *recv, const void *const *y, void *const *out)
{
    const symm_ref_config *c = pl->cfg;
    for (int s = 0; s < c->world; s++)
        if (in[s].tokens > 0 && !out[s])
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s: out[%d] is NULL with %d tokens", fn, s,
                             in[s].tokens);
    for (int p = 0; p < c->world; p++) {
        int64_t rows = pl->need[p] < pl->capacity ? pl->need[p] : pl->capacity;
        if (recv[p].rows != rows)
            return symm_fail(SYMM_ERR_INVALID_ARG,
                             "%s: recv[%d].rows %lld: in routes %lld rows to rank %d (capacity "
                             "%lld); in must be the input of the dispatch that filled recv",
                             fn, p, (long long)recv[p].rows, (long long)rows, p,
                             (long long)pl->capacity);
        SYMM_TRY(check_segments(fn, pl, p, &recv[p]));
        if (rows > 0 && !y[p])
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s: y[%d] is NULL with %lld rows", fn, p,
                             (long long)rows);
    }
    return SYMM_OK;
}

/* Combine's tokens, routed first (route_token hands out rows in token
 * order, so it runs once, in order) and then summed on several threads:
 * every token's sum is its own arithmetic, in the contract's order, into its
 * own out row, so the result is the same bits whatever the threads. */
typedef struct combine_work {
    const plan *pl;
    const symm_ref_input *in;
    const void *const *y;
    void *const *out;
    int64_t items;        /* tokens of the whole world */
    const int32_t *src;   /* [items][3]: source rank, token, copies */
    const dest *dests;    /* [items][topk] */
    atomic_llong next;    /* the first item not yet taken */
} combine_work;

enum { COMBINE_BATCH = 8 };

static void *combine_items(void *arg)
{
    combine_work *w = arg;
    const symm_ref_config *c = w->pl->cfg;
    const size_t H = (size_t)c->hidden;
    float *acc = malloc(4 * H * sizeof *acc);
    if (!acc)
        return NULL; /* the other threads take its share */
    for (;;) {
        const int64_t first = atomic_fetch_add(&w->next, COMBINE_BATCH);
        if (first >= w->items)
            break;
        const int64_t last = first + COMBINE_BATCH < w->items ? first + COMBINE_BATCH : w->items;
        for (int64_t i = first; i < last; i++) {
            const int s = w->src[3 * i], t = w->src[3 * i + 1], n = w->src[3 * i + 2];
            const dest *d = w->dests + i * c->topk;
            if (c->hosts >= 2)
                combine_token_hosts(w->pl, &w->in[s], t, d, n, w->y, acc, acc + H, acc + 2 * H, acc + 3 * H);
            else
                combine_token(w->pl, &w->in[s], t, d, n, w->y, acc, acc + H, acc + 2 * H);
            store_row(w->out[s], t, c->hidden, c->combine_dtype, acc);
        }
    }
    free(acc);
    return NULL;
}

/* Threads for n multiply-adds: one a 4 Mi of them, at most the online CPUs
 * and SYMM_MAX_THREADS. */
static int combine_threads(double n)
{
    const double by_work = n / (double)(1 << 22) + 1.0;
    return symm_threads_for(by_work < SYMM_MAX_THREADS ? (int64_t)by_work : SYMM_MAX_THREADS);
}

static symm_status combine_all(plan *pl, const symm_ref_input *in, const void *const *y,
                               void *const *out)
{
    const symm_ref_config *c = pl->cfg;
    int64_t items = 0;
    for (int s = 0; s < c->world; s++)
        items += in[s].tokens;
    int32_t *src = malloc((size_t)(items > 0 ? items : 1) * 3 * sizeof *src);
    dest *dests = malloc((size_t)(items > 0 ? items : 1) * (size_t)c->topk * sizeof *dests);
    if (!src || !dests) {
        free(src);
        free(dests);
        return symm_fail(SYMM_ERR_NOMEM, "symm_ref_combine: cannot allocate the routes of %lld tokens",
                         (long long)items);
    }
    int64_t i = 0;
    for (int r = 0; r < c->world; r++) {
        const int s = source_at(c, r);
        for (int t = 0; t < in[s].tokens; t++, i++) {
            const int32_t *row = topk_row(&in[s], t, c->topk);
            src[3 * i] = s;
            src[3 * i + 1] = t;
            src[3 * i + 2] = route_token(pl, row, valid_mask(row, c->topk, c->experts), dests + i * c->topk);
        }
    }
    combine_work w = {.pl = pl, .in = in, .y = y, .out = out, .items = items, .src = src, .dests = dests};
    atomic_init(&w.next, 0);
    /* This thread works too; a thread that cannot start leaves its share to
     * the others. */
    symm_run_threads(combine_threads((double)items * c->topk * c->hidden), combine_items, &w);
    free(src);
    free(dests);
    /* A thread that could not allocate its rows took no item; only when
     * every one of them failed are items left. */
    if (atomic_load(&w.next) < items)
        return symm_fail(SYMM_ERR_NOMEM, "symm_ref_combine: cannot allocate %d floats", 4 * c->hidden);
    return SYMM_OK;
}

symm_status symm_ref_combine(const symm_ref_config *cfg, const symm_ref_input *in,
                             const symm_ref_recv *recv, const void *const *y, void *const *out)
{
    const char *fn = "symm_ref_combine";
    SYMM_TRY(check_call(fn, cfg, in, recv, 0));
    if (!y || !out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s is NULL", fn, !y ? "y" : "out");
    plan pl;
    SYMM_TRY(plan_init(&pl, cfg, in, fn));
    symm_status st = check_combine(fn, &pl, in, recv, y, out);
    if (st == SYMM_OK)
        st = combine_all(&pl, in, y, out);
    plan_free(&pl);
    return st;
}
