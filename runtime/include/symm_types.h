/* symm_types.h: the enumerations that describe a variant's layout, shared by
 * the CPU reference, the variant API and the generated stubs. */
#ifndef SYMM_TYPES_H
#define SYMM_TYPES_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum symm_dtype {
    SYMM_DTYPE_BF16 = 0,
    SYMM_DTYPE_FP16 = 1,
    SYMM_DTYPE_FP32 = 2,
    SYMM_DTYPE_FP8_E4M3 = 3, /* dispatch only; one float scale per 128 elements */
} symm_dtype;

typedef enum symm_layout {
    SYMM_LAYOUT_RANK = 0,   /* one copy per token and destination rank */
    SYMM_LAYOUT_EXPERT = 1, /* one copy per (token, k), expert-major segments */
} symm_layout;

/* Layout expert: the order in which combine sums a token's rows.
 * RANK (the default): each rank p that received rows of token t first forms
 * P_p(t) = sum over the k whose expert lives on p, ascending k, of
 * w[t,k] * y[row(t,k)] in fp32, rounded once to the combine dtype, and sends
 * that one row; the source returns sum over p ascending of P_p(t) in fp32,
 * rounded once. K: sum over the valid k, ascending, of w[t,k] * y[row(t,k)]
 * in fp32, rounded once: every (token, expert) row travels back. Layout rank
 * has only RANK (one row per token and rank, no weights applied). */
typedef enum symm_combine_order {
    SYMM_COMBINE_ORDER_RANK = 0,
    SYMM_COMBINE_ORDER_K = 1,
} symm_combine_order;

/* How combine brings each token's rows back (spec field combine).
 * PUSH: the rank that holds a row sends it back into the source's COMBINE_IN;
 * y may be any device memory. PULL: each rank reads its tokens' rows from
 * its peers' y, which must then lie in the variant's symmetric buffer.
 * AUTO (layout rank only): both forms in one variant, chosen per call by
 * where y lies: inside the symmetric buffer (all capacity rows of it) it
 * pulls, elsewhere it pushes; every rank must choose alike in a call, else
 * the call fails with SYMM_ERR_MISMATCH on every rank (docs/protocol.md). */
typedef enum symm_combine_mode {
    SYMM_COMBINE_PUSH = 0,
    SYMM_COMBINE_PULL = 1,
    SYMM_COMBINE_AUTO = 2,
} symm_combine_mode;

/* Bytes per element of a dtype (1, 2 or 4); 0 for an unknown value. */
static inline int symm_dtype_size(symm_dtype d)
{
    switch (d) {
    case SYMM_DTYPE_BF16: return 2;
    case SYMM_DTYPE_FP16: return 2;
    case SYMM_DTYPE_FP32: return 4;
    case SYMM_DTYPE_FP8_E4M3: return 1;
    }
    return 0;
}

/* The buffers of a variant. Symmetric regions lie in the variant's symmetric
 * buffer, at the same offset on every rank; the others in its local scratch.
 * The generator computes where each lies (its layout.c) and writes the table
 * into the generated stub. */
typedef enum symm_region {
    SYMM_REGION_SIGNALS = 0,    /* sym: per-peer signal slots */
    SYMM_REGION_COUNTS,         /* sym: count matrix, two parities */
    SYMM_REGION_RECV_X,         /* sym: received rows [capacity, hidden] dtype */
    SYMM_REGION_RECV_SCALES,    /* sym: fp8 scales [capacity, hidden/128] float */
    SYMM_REGION_RECV_SRC,       /* sym: per row int32 {src rank, src token, k, 0} */
    SYMM_REGION_RECV_TOPK,      /* sym: layout rank: [capacity, topk] int32 local expert ids */
    SYMM_REGION_RECV_WEIGHTS,   /* sym: [capacity, topk] (rank) or [capacity] (expert) float */
    SYMM_REGION_COMBINE_IN,     /* sym: combine rows pushed back to their source */
    SYMM_REGION_STATE,          /* local: sequence number, T, statistics, error record */
    SYMM_REGION_EXPERT_COUNT,   /* local: [local experts] int32 rows per local expert */
    SYMM_REGION_EXPERT_OFFSET,  /* local: [local experts] int32 segment start (expert) */
    SYMM_REGION_TOKEN_ROUTE,    /* local: per token, where each copy went */
    SYMM_REGION_TOKEN_WEIGHTS,  /* local: [max_tokens, topk] float (expert layout) */
    SYMM_REGION_LAYOUT_WORK,    /* local: layout counters that do not fit in shared memory */
    SYMM_REGION_COMBINE_FLAGS,  /* sym: per COMBINE_IN slot, the call whose row has landed there */
    SYMM_REGION_RECV_CHAIN,     /* sym: layout expert: [capacity, topk - 1] int32 rows a chain's head fills */
    SYMM_REGION_Y,              /* sym: combine = "pull" or "auto": [capacity, hidden] combine dtype, a place for y */
    SYMM_REGION_CHAIN_READY,    /* sym: layout expert: per (source rank, token) the call whose chain head landed */
    SYMM_REGION_COUNT
} symm_region;

/* Elements per fp8 scale. */
#define SYMM_FP8_BLOCK 128

#ifdef __cplusplus
}
#endif
#endif
