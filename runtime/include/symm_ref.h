/* symm_ref.h: the CPU reference model of dispatch and combine.
 *
 * Plain C on host memory, no GPU and no CUDA toolkit needed. It implements the
 * contract of docs/api.md "Dispatch, the experts, combine" for a whole world
 * at once (every rank's input in, every rank's result out), and every GPU
 * backend is checked against it bit for bit: same rows in the same order,
 * same counts, same rounding.
 *
 * Terms: W = world, E = experts, L = E/W local experts per rank, K = topk,
 * H = hidden. Expert e lives on rank e / L.
 *
 * Valid top-k entries: an id in [0, E) that differs from every earlier entry
 * of the same token's row. -1 means "no expert" and is skipped silently. Any
 * other id (< -1, >= E, or a repeat) is invalid: skipped as if it were -1 and
 * counted per source rank in symm_ref_send_stats.invalid.
 *
 * Layout rank: token t of rank s goes once to each rank of D(t), the ranks
 * owning at least one of its valid experts. On rank p, rows are ordered by
 * source rank, then source token. Layout expert: one row per valid (t, k),
 * in expert-major segments; segment j starts at offset[j], with offset[0] = 0
 * and offset[j+1] = round_up(offset[j] + count[j], align); rows within a
 * segment are ordered by (source rank, source token). Padding rows are not
 * written. In both layouts a row whose index is >= capacity is dropped (not
 * written, counted at its destination and its source); since rows are
 * numbered in order, the dropped rows are always the last ones.
 *
 * Combine accumulates in fp32 and rounds once to combine_dtype. Layout rank:
 * acc = acc + y_p[row] over p in D(t) ascending. Layout expert with
 * combine_order rank (the default): for each rank p ascending that kept a
 * row of t, part = fmaf(w[t,k], y_p[row(t,k)], part) over its k ascending
 * from part = 0.0f, rounded once to combine_dtype (the one row p sends
 * back), then acc = acc + part. Layout expert with combine_order k:
 * acc = fmaf(w[t,k], y[row(t,k)], acc) over valid k ascending. w = 1 without
 * weights. Every form starts from acc = 0.0f; dropped rows contribute
 * nothing, and a token that went nowhere gets +0.
 *
 * Across hosts (hosts = H >= 2; docs/protocol.md "Across hosts"): the W
 * ranks are H hosts of L = W / H, rank s = (host s / L, local index s % L),
 * host-major. On every rank, rows (layout rank; layout expert: within each
 * segment) are ordered by (source local index, source host, source token)
 * instead of (source rank, source token): the order the hybrid backend's
 * proxies give. Capacity drops the last rows of that order. Combine sums
 * per host first: for each host g ascending that owns a valid expert of t,
 * P_g = the one-host sum above restricted to g's ranks (layout rank:
 * P_g = P_g + v over g's ranks ascending; layout expert, combine_order
 * rank: P_g = P_g + part_p over g's ranks p ascending that kept a row),
 * from 0.0f, rounded once to combine_dtype (the row that crosses the
 * network back); then acc = acc + P_g, rounded once. combine_order k is
 * refused with hosts. Sources, local ids, weights, counts and statistics
 * are as on one host. */
#ifndef SYMM_REF_H
#define SYMM_REF_H

#include <stdint.h>

#include "symm_status.h"
#include "symm_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits shared with the generator. */
#define SYMM_REF_MAX_TOPK 16
#define SYMM_REF_MAX_WORLD 128
#define SYMM_REF_MAX_ALIGN 4096

/* The byte symm_ref_recv_alloc fills its arrays with. */
#define SYMM_REF_POISON 0xA5

/* The parameters of a variant, as in a spec's layout { } call. */
typedef struct symm_ref_config {
    int hidden, topk, experts, world, max_tokens;
    symm_dtype dtype;          /* dispatch payload */
    symm_dtype combine_dtype;  /* bf16, fp16 or fp32 */
    symm_layout layout;
    int weights;               /* 0/1: carry top-k weights */
    int64_t capacity;          /* rows per rank; 0 = worst case */
    int align;                 /* layout expert; >= 1 (must be 1 for layout rank) */
    symm_combine_order combine_order; /* layout expert: RANK (0, the default) or K;
                                         layout rank: RANK only */
    int hosts;                 /* 0 or 1: one host (the contract above); H >= 2:
                                  the hybrid backend on H hosts (below) */
} symm_ref_config;

/* Receive rows per rank that can never overflow: W * max_tokens for layout
 * rank, W * max_tokens * min(K, L) + L * (align - 1) for layout expert.
 * -1 when cfg is NULL or a field the formula uses is out of range. */
int64_t symm_ref_worst_capacity(const symm_ref_config *cfg);

/* The capacity dispatch uses: cfg->capacity, or the worst case when it is 0.
 * -1 as symm_ref_worst_capacity. */
int64_t symm_ref_capacity(const symm_ref_config *cfg);

/* SYMM_OK when cfg is within the generator's limits, else
 * SYMM_ERR_INVALID_ARG with a message naming the field, its value and what
 * was expected. Limits (the generator's): hidden 1..2^20 with hidden *
 * element size a multiple of 16 bytes for dtype and for combine_dtype;
 * hidden % 128 == 0 for fp8_e4m3; combine_dtype not fp8; world 2..128;
 * experts 1..65536 and a multiple of world; topk 1..min(16, experts);
 * max_tokens 1..2^20; weights 0 or 1; align 1..4096 (exactly 1 for layout
 * rank); the worst case at most INT32_MAX rows and at most 1 TiB of rows
 * (hidden times the larger element size); capacity 0 or 1..worst case;
 * hosts 0..world, and when >= 2 a divisor of world with combine_order rank.
 * World 1 is accepted (a companion of one rank a host). */
symm_status symm_ref_check_config(const symm_ref_config *cfg);

/* One rank's dispatch input, in host memory. */
typedef struct symm_ref_input {
    int tokens;                   /* T, 0..max_tokens */
    const void *x;                /* [T, hidden] dtype */
    const float *x_scales;        /* fp8: [T, hidden/128]; else NULL */
    const int32_t *topk_idx;      /* [T, topk] */
    const float *topk_weights;    /* [T, topk] when weights, else ignored */
} symm_ref_input;

/* One rank's dispatch result. symm_ref_recv_alloc sizes it for a config;
 * a caller may also point the arrays at its own buffers of at least these
 * sizes (capacity must then equal symm_ref_capacity(cfg)). Rows at and past
 * `rows`, and padding rows between expert segments, are never written. */
typedef struct symm_ref_recv {
    int64_t capacity;             /* rows the arrays hold */
    int64_t rows;                 /* layout rank: rows received (kept);
                                     layout expert: end of the last segment,
                                     clamped to capacity */
    void *x;                      /* [capacity, hidden] dtype */
    float *scales;                /* fp8: [capacity, hidden/128]; else NULL */
    int32_t *src;                 /* [capacity, 4]: {src rank, src token, k (expert) or -1 (rank), 0} */
    int32_t *topk_idx;            /* layout rank: [capacity, topk] local expert ids or -1; else NULL */
    float *weights;               /* rank: [capacity, topk]; expert: [capacity]; NULL without weights */
    int32_t *expert_count;        /* [L]: layout rank: kept rows choosing local expert j;
                                     layout expert: rows of segment j that fit */
    int32_t *expert_offset;       /* [L]: layout expert: min(offset[j], capacity); layout rank: 0 */
    int64_t dropped;              /* rows meant for this rank that did not fit */
} symm_ref_recv;

/* Per source rank, what its dispatch input cost. */
typedef struct symm_ref_send_stats {
    int64_t invalid;              /* invalid (out of range or repeated) topk entries */
    int64_t dropped;              /* rows this rank sent that were dropped at their destination */
} symm_ref_send_stats;

/* Allocate r's arrays for cfg (capacity = symm_ref_capacity(cfg)) and fill
 * every byte of them with the poison 0xA5, so that a test sees which bytes
 * dispatch did not write. rows and dropped start at 0. On failure r is left
 * zeroed: SYMM_ERR_INVALID_ARG (bad cfg) or SYMM_ERR_NOMEM. */
symm_status symm_ref_recv_alloc(const symm_ref_config *cfg, symm_ref_recv *r);

/* As symm_ref_recv_alloc, but every array zeroed instead of poisoned, and
 * its pages taken only as they are written: for a caller that reads only
 * what dispatch writes (rows below rows; layout expert: the segments) and
 * would otherwise pay for touching the whole worst-case capacity (layout
 * expert at world 4, T = 4096, hidden 7168, top-8: 1.9 GB a rank, of which
 * uniform routing writes a quarter). Freed by symm_ref_recv_free. */
symm_status symm_ref_recv_alloc_lazy(const symm_ref_config *cfg, symm_ref_recv *r);

/* Poison again what a symm_ref_dispatch with cfg may have written into r
 * (its rows below r->rows and the per-expert arrays) and set rows and
 * dropped to 0, so that r is as symm_ref_recv_alloc left it without a new
 * allocation (capacity-sized buffers are large; a test reuses them).
 * SYMM_ERR_INVALID_ARG for a bad cfg, a NULL array that cfg needs, or an r of
 * another capacity or with rows outside 0..capacity; r is then untouched. */
symm_status symm_ref_recv_repoison(const symm_ref_config *cfg, symm_ref_recv *r);

/* Free what symm_ref_recv_alloc allocated and zero r. NULL or a zeroed r is
 * fine. Never call it on a recv whose arrays the caller owns. Always
 * SYMM_OK. */
symm_status symm_ref_recv_free(symm_ref_recv *r);

/* Whole-world dispatch: in[world] -> recv[world], and stats[world] unless
 * stats is NULL. Each recv[p] must have capacity symm_ref_capacity(cfg) and
 * the arrays the config needs. Sets rows, dropped, expert_count and
 * expert_offset of every recv and writes every kept row; nothing else.
 * Returns SYMM_ERR_INVALID_ARG (nothing written) for a bad config, a NULL
 * array that is needed, a recv of the wrong capacity, or tokens outside
 * 0..max_tokens; SYMM_ERR_OVERFLOW (after writing everything that fits) when
 * any row was dropped or any invalid id was seen, with a message giving the
 * counts per rank; else SYMM_OK. */
symm_status symm_ref_dispatch(const symm_ref_config *cfg, const symm_ref_input *in,
                              symm_ref_recv *recv, symm_ref_send_stats *stats);

/* Whole-world combine after a symm_ref_dispatch of the same in: y[p] is rank
 * p's [recv[p].capacity, hidden] combine_dtype rows, aligned with recv[p].x
 * (only rows below recv[p].rows are read; y[p] may be NULL when that is 0);
 * out[s] receives [in[s].tokens, hidden] combine_dtype (may be NULL when
 * in[s].tokens is 0). y[p] may be recv[p].x itself. The routing is
 * recomputed from in; dropped rows and invalid ids are skipped silently
 * (dispatch reported them). Returns SYMM_ERR_INVALID_ARG for a bad config,
 * a NULL array that is needed, or an in that visibly does not match recv
 * (rows, or layout expert's segment offsets and counts, differ from what in
 * routes), SYMM_ERR_NOMEM, or SYMM_OK. A large world's tokens are summed on
 * several threads (one a 4 Mi multiply-adds, at most the online CPUs and
 * 16), each token's sum whole on one of them: the same bits whatever the
 * threads. Thread-safe for distinct out arrays. */
symm_status symm_ref_combine(const symm_ref_config *cfg, const symm_ref_input *in,
                             const symm_ref_recv *recv, const void *const *y, void *const *out);

/* Conversions as the GPU's cvt.rn does them: round to nearest, ties to even.
 * f32 -> bf16/fp16: subnormals rounded exactly, overflow to +-inf, any NaN
 * to the quiet NaN 0x7fff. The widening ones are exact (NaN stays NaN). */
uint16_t symm_f32_to_bf16(float f);
float symm_bf16_to_f32(uint16_t h);
uint16_t symm_f32_to_f16(float f);
float symm_f16_to_f32(uint16_t h);

/* fp8 e4m3fn (bias 7, no infinities, NaN = 0x7f/0xff, largest finite 448):
 * f32 -> e4m3 rounds to nearest even and saturates (+-inf included) to
 * +-448 like cvt.rn.satfinite; NaN gives 0x7f. e4m3 -> f32 is exact. */
uint8_t symm_f32_to_e4m3(float f);
float symm_e4m3_to_f32(uint8_t v);

#ifdef __cplusplus
}
#endif
#endif
