/* nccl_plan.h: the NCCL backend's chunks on the host (runtime/variant_nccl.c):
 * from the count matrix alone, which runs of rows go to whom and come from
 * whom, by the rules of the native kernels. Plain C on host arrays (no
 * CUDA), so that tests/cpu/test_nccl_plan.c checks it, beside a C model of
 * the GPU's part (templates/variant.cu.in: symm_nccl_count, symm_nccl_pack),
 * against the CPU reference model for whole worlds without a GPU. Internal.
 *
 * One dispatch on rank r: the GPU counts this rank's rows per destination
 * bin (row r of the count matrix) and the ranks exchange their count rows
 * (an NCCL all-gather); symm_nccl_plan_chunks then plans, from the matrix,
 * this rank's send and receive chunks, where each bin's rows start at the
 * destination and among the packed rows, the drops and what this rank
 * receives; the GPU packs the rows by it. A chunk is a contiguous run of
 * rows between two ranks: one per destination rank (layout rank) or per
 * destination (rank, expert) (layout expert); the senders send their
 * chunks in ascending chunk order, and each receiver receives them in the
 * same order from each sender. */
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
    int world, rank, experts, align;
    bool expert_layout;
    int64_t capacity;
    int bins; /* entries of a count row: world (layout rank) or experts */
    /* Arrays the caller owns (L = experts / world). */
    const int32_t *counts;          /* [world, bins]: every rank's rows per bin */
    int32_t *expert;                /* [2, L]: layout expert: per local expert its count, offset */
    int64_t *base;                  /* [2 * bins]: per bin b, base[b] is where this rank's rows
                                       for b start at the destination (kept while below the
                                       capacity) and base[bins + b] where the kept ones start
                                       among the packed rows */
    symm_nccl_chunk *send_chunks;   /* [world * (expert ? L : 1)] */
    symm_nccl_chunk *recv_chunks;   /* [world * (expert ? L : 1)] */
    /* What symm_nccl_plan_chunks found. */
    int n_send, n_recv;
    int64_t packed;                 /* rows packed for sending */
    int32_t recv_rows;              /* as the native state's recv_rows */
    int32_t dropped_recv;           /* rows meant for this rank that did not fit */
    int32_t dropped_send;           /* rows of this rank dropped at their destination */
    int64_t self_first, self_rows;  /* this rank's rows for itself: packed rows [self_first,
                                       self_first + self_rows), the chunks to itself (contiguous,
                                       as bins go by rank) */
} symm_nccl_plan;

/* With every rank's count row in counts: base, the send and receive chunks,
 * packed, this rank's rows for itself (self_first, self_rows), recv_rows,
 * the drops and (layout expert) expert. O(world x bins). */
void symm_nccl_plan_chunks(symm_nccl_plan *p);

#endif
