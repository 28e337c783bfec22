/* layout.c: where a variant's buffers live. One table of regions for the
 * symmetric buffer (identical offsets on every rank, because every rank runs
 * the same variant) and one for the rank's local scratch. The numbers go into
 * the generated kernels as constants, into the C stub for the runtime, and
 * into the manifest; nothing else computes them. */
#include <string.h>

#include "sg.h"

/* Signal words get their own 128-byte slot: nothing else shares the line. */
#define SG_SIGNAL_SLOT 128
/* Payload regions start on 256-byte boundaries (16-byte vector and bulk copies). */
#define SG_REGION_ALIGN 256
/* Bytes of the per-variant state record (see STATE in templates/variant.cu.in). */
#define SG_STATE_BYTES 256
/* Signal kinds: dispatch rows arrived; with combine = "pull" or "auto", also
 * "y is ready" (its offset beside the call; with "auto" also the call in
 * which the peer pushed, so that each rank sees which form a peer took) and
 * "done reading a peer's y"; with a
 * pushing combine of layout expert by rank (GROUPED), "a peer's warps have
 * stored their partial sums" (kind 1, which only the pulling combine uses
 * otherwise; the tuning knob PARTIAL_GRID, docs/protocol.md). The counts
 * carry their call in each 8-byte word, and a pushing combine otherwise
 * waits per COMBINE_IN slot on combine_flags: neither needs a signal. */
#define SG_SIGNAL_GROUPED(v) ((v)->layout == SYMM_LAYOUT_EXPERT && (v)->combine_order == SYMM_COMBINE_ORDER_RANK)
#define SG_SIGNAL_KINDS(v) ((v)->combine != SYMM_COMBINE_PUSH ? 3 : SG_SIGNAL_GROUPED(v) ? 2 : 1)
/* Bytes of one count: the count and its call's sequence number. */
#define SG_COUNT_BYTES 8

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

int64_t sg_worst_capacity(const sg_variant *v)
{
    int64_t local = v->experts / v->world;
    if (v->layout == SYMM_LAYOUT_RANK)
        return (int64_t)v->world * v->max_tokens;
    int64_t per_token = v->topk < local ? v->topk : local;
    return (int64_t)v->world * v->max_tokens * per_token + local * (v->align - 1);
}

/* Bins of the count matrix: per destination rank (layout rank) or per
 * global expert (layout expert). */
static uint64_t count_row_entries(const sg_variant *v)
{
    return v->layout == SYMM_LAYOUT_RANK ? (uint64_t)v->world : (uint64_t)v->experts;
}

/* Words of one count row: the bins, then (layout rank, at most
 * SG_EXPERT_WORDS_MAX experts) the sender block's rows per local expert of
 * the receiving rank, so that each rank learns its expert counts with the
 * counts instead of from the rows after they land (docs/protocol.md). */
#define SG_EXPERT_WORDS_MAX 1024
static uint64_t count_row_words(const sg_variant *v)
{
    const bool words = v->layout == SYMM_LAYOUT_RANK && v->experts <= SG_EXPERT_WORDS_MAX;
    return count_row_entries(v) + (words ? (uint64_t)(v->experts / v->world) : 0);
}

static void place(sg_layout *l, symm_region id, const char *name, uint64_t bytes, bool symmetric)
{
    uint64_t *cursor = symmetric ? &l->symmetric_bytes : &l->scratch_bytes;
    sg_region *r = &l->regions[id];
    r->name = name;
    r->symmetric = symmetric;
    r->bytes = bytes;
    r->offset = bytes ? round_up(*cursor, SG_REGION_ALIGN) : 0;
    if (bytes)
        *cursor = r->offset + bytes;
}

void sg_layout_compute(const sg_variant *v, sg_layout *out)
{
    const uint64_t cap = (uint64_t)v->capacity, H = (uint64_t)v->hidden, K = (uint64_t)v->topk;
    const uint64_t T = (uint64_t)v->max_tokens, W = (uint64_t)v->world;
    const uint64_t L = (uint64_t)(v->experts / v->world);
    const uint64_t elt = (uint64_t)symm_dtype_size(v->dtype);
    const uint64_t celt = (uint64_t)symm_dtype_size(v->combine_dtype);
    const bool rank = v->layout == SYMM_LAYOUT_RANK;
    const bool fp8 = v->dtype == SYMM_DTYPE_FP8_E4M3;

    memset(out, 0, sizeof *out);
    out->worst_capacity = sg_worst_capacity(v);

    place(out, SYMM_REGION_SIGNALS, "signals", SG_SIGNAL_KINDS(v) * W * SG_SIGNAL_SLOT, true);
    /* One count row per (source rank, source block), two parities. */
    place(out, SYMM_REGION_COUNTS, "counts", 2 * W * (uint64_t)v->sms * count_row_words(v) * SG_COUNT_BYTES, true);
    place(out, SYMM_REGION_RECV_X, "recv_x", cap * H * elt, true);
    place(out, SYMM_REGION_RECV_SCALES, "recv_scales", fp8 ? cap * (H / SYMM_FP8_BLOCK) * 4 : 0, true);
    place(out, SYMM_REGION_RECV_SRC, "recv_src", cap * 16, true);
    place(out, SYMM_REGION_RECV_TOPK, "recv_topk_idx", rank ? cap * K * 4 : 0, true);
    place(out, SYMM_REGION_RECV_WEIGHTS, "recv_weights",
          v->weights ? (rank ? cap * K * 4 : cap * 4) : 0, true);
    /* A pulling combine reads the peers' y instead (region y below); the
     * NCCL backend then lands its rows in a buffer of its own. combine =
     * "auto" has both, for its two forms. */
    const bool pushes = v->combine != SYMM_COMBINE_PULL, pulls = v->combine != SYMM_COMBINE_PUSH;
    place(out, SYMM_REGION_COMBINE_IN, "combine_in", pushes ? (rank ? W * T : T * K) * H * celt : 0, true);
    /* One 8-byte flag per COMBINE_IN slot: the call whose row has landed in
     * it (combine sums each token as soon as its rows are in); none with
     * a pulling combine. */
    place(out, SYMM_REGION_COMBINE_FLAGS, "combine_flags", pushes ? (rank ? W * T : T * K) * 8 : 0, true);
    /* Layout expert: at a chain's head (a token's first row at a peer, which
     * alone crosses NVLink), the token's other rows there, which the
     * receiver fills from it (templates/variant.cu.in, DEDUP); with
     * combine_order rank also a group word a row (GROUPED), by which combine
     * sums a token's rows where they are before one row goes back. */
    const uint64_t chain_ints = v->combine_order == SYMM_COMBINE_ORDER_RANK ? K : K - 1;
    place(out, SYMM_REGION_RECV_CHAIN, "recv_chain", rank ? 0 : cap * chain_ints * 4, true);
    /* combine = "pull" or "auto": a place for y that the peers can read
     * (the user may put y anywhere else in the symmetric buffer too, recv_x
     * included). */
    place(out, SYMM_REGION_Y, "y", pulls ? cap * H * celt : 0, true);
    /* Layout expert with chains (top-k above 1, a peer to chain at): what
     * lets the receiver copy each head into its chain as soon as it lands
     * (templates/cu/dispatch.cu.in, CHAIN_STREAM): a 128-byte slot of this
     * rank's own counters (the items its warps take, by the call's parity),
     * each source rank's T of the call (a tagged u64 each, in 128-byte
     * slots), then per (source rank, source token) a tagged u64 that the
     * source publishes once the token's head has landed here. */
    place(out, SYMM_REGION_CHAIN_READY, "chain_ready",
          !rank && K > 1 && W > 1 ? SG_SIGNAL_SLOT + round_up(W * 8, SG_SIGNAL_SLOT) + W * T * 8 : 0, true);

    place(out, SYMM_REGION_STATE, "state", SG_STATE_BYTES, false);
    place(out, SYMM_REGION_EXPERT_COUNT, "expert_count", L * 4, false);
    place(out, SYMM_REGION_EXPERT_OFFSET, "expert_offset", L * 4, false);
    /* Layout rank: [max_tokens][world] rows at each rank. Layout expert:
     * [max_tokens][topk] rows, then [max_tokens][topk] the rank of each. */
    place(out, SYMM_REGION_TOKEN_ROUTE, "token_route", T * (rank ? W : 2 * K) * 4, false);
    place(out, SYMM_REGION_TOKEN_WEIGHTS, "token_weights", (!rank && v->weights) ? T * K * 4 : 0, false);
    /* Dispatch keeps per-warp counters of every bin in shared memory when the
     * 16 warps' worth fit in 32 KiB, else here (templates/variant.cu.in
     * derives the same from this region's size). */
    const uint64_t bins = count_row_entries(v), warps = 16;
    place(out, SYMM_REGION_LAYOUT_WORK, "layout_work",
          warps * bins * 4 <= 32768 ? 0 : (uint64_t)v->sms * warps * bins * 4, false);
    out->symmetric_bytes = round_up(out->symmetric_bytes, SG_REGION_ALIGN);
    out->scratch_bytes = round_up(out->scratch_bytes, SG_REGION_ALIGN);
}
