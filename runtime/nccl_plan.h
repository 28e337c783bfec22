/* nccl_plan.h: the NCCL backend's routing on the host (runtime/variant_nccl.c):
 * which of this rank's rows go where and in which order, and what it
 * receives from whom, by the rules of the native kernels. Plain C on host
 * arrays (no CUDA), so that tests/cpu/test_nccl_plan.c checks it against the
 * CPU reference model for whole worlds without a GPU. Internal.
 *
 * One dispatch on rank r: symm_nccl_plan_count fills row r of the count
 * matrix (rows per destination bin) and the route of every token; the
 * caller exchanges the count rows (an NCCL all-gather); symm_nccl_plan_rows
 * then packs this rank's kept rows per destination chunk and plans the
 * receives. A chunk is a contiguous run of rows between two ranks: one per
 * destination rank (layout rank) or per destination (rank, expert) (layout
 * expert); the senders send their chunks in ascending chunk order, and each
 * receiver receives them in the same order from each sender. */
#ifndef SYMM_NCCL_PLAN_H
#define SYMM_NCCL_PLAN_H

#include <stdbool.h>
#include <stdint.h>

typedef struct symm_nccl_chunk {
    int peer;    /* destination (sending) or source (receiving) rank */
    int64_t row; /* first row: in the packed send buffer, or in recv_x */
    int64_t n;   /* rows */
} symm_nccl_chunk;

typedef struct symm_nccl_plan {
    /* The variant and this rank (the caller sets them). */
    int world, rank, topk, experts, max_tokens, align;
    bool expert_layout, weights;
    int64_t capacity;
    int bins; /* entries of a count row: world (layout rank) or experts */
    /* Host arrays the caller owns, sized for max_tokens tokens (M = max_tokens *
     * max dests, max dests = topk for layout expert, else min(topk, world);
     * L = experts / world). */
    const int32_t *topk_idx;        /* [T, topk]: this call's ids */
    const float *topk_weights;      /* [T, topk]: with weights */
    int32_t *counts;                /* [world, bins] */
    int32_t *route;                 /* [max_tokens, expert ? topk : world]: the row of each
                                       (token, k) or (token, rank) at its destination, -1 none */
    float *token_weights;           /* [max_tokens, topk]: layout expert, the weight of each kept k */
    int32_t *send_index;            /* [M]: token of each packed row */
    int32_t *stage_index;           /* [M]: COMBINE_IN slot of each packed row */
    int32_t *send_src;              /* [M, 4]: recv_src of each packed row */
    int32_t *expert;                /* [2, L]: layout expert: per local expert its count, offset */
    int64_t *base;                  /* [2 * bins]: scratch */
    symm_nccl_chunk *send_chunks;   /* [world * (expert ? L : 1)] */
    symm_nccl_chunk *recv_chunks;   /* [world * (expert ? L : 1)] */
    int32_t *self_dst;              /* [M]: for each of this rank's rows for itself, its received row */
    /* What symm_nccl_plan_rows found. */
    int n_send, n_recv;
    int64_t packed;                 /* rows packed for sending */
    int32_t recv_rows;              /* as the native state's recv_rows */
    int32_t dropped_recv;           /* rows meant for this rank that did not fit */
    int32_t dropped_send;           /* rows of this rank dropped at their destination */
    int64_t self_first, self_rows;  /* this rank's rows for itself: packed rows [self_first,
                                       self_first + self_rows), the chunks to itself (contiguous,
                                       as bins go by rank); self_dst[i] is where packed row
                                       self_first + i lands among its received rows */
} symm_nccl_plan;

/* Row `rank` of counts and the route of tokens [0, T); returns the number of
 * invalid top-k entries (out of range or a repeat; -1 is not invalid). */
int symm_nccl_plan_count(symm_nccl_plan *p, int T);

/* With every rank's count row in counts: the pack (send_index, stage_index,
 * send_src; the route rewritten to destination rows,
 * -1 where dropped), the send and receive chunks, this rank's rows for
 * itself (self_first, self_rows, self_dst), recv_rows, the drops and
 * (layout expert) expert. */
void symm_nccl_plan_rows(symm_nccl_plan *p, int T);

#endif
