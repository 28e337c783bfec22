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
 * destination (rank, expert) (layout expert).
 *
 * NCCL moves runs, not chunks: one send and one receive per peer and array
 * (a peer's chunks are contiguous among the packed rows, bins going by
 * rank). Layout rank receives each run straight into its rows (a run is a
 * chunk). Layout expert's chunks from one sender land in as many expert
 * segments: its run lands in a receive stage (the senders' runs one after
 * the other, ascending rank, this rank's own rows never among them) and a
 * kernel (symm_nccl_unstage) moves each chunk to its rows; combine gathers
 * y the other way (symm_nccl_restage) and sends each peer one run back.
 * The operations of a group so stay at a few per peer whatever the
 * experts: per chunk they were up to world x experts / world x arrays, past
 * what one NCCL group takes at world 4 and 256 experts. */
#ifndef SYMM_NCCL_PLAN_H
#define SYMM_NCCL_PLAN_H

#include <stdbool.h>
#include <stdint.h>

typedef struct symm_nccl_chunk {
    int peer;      /* destination (sending) or source (receiving) rank */
    int64_t row;   /* first row: in the packed send buffer, or in recv_x */
    int64_t n;     /* rows */
    int64_t stage; /* a received chunk of layout expert from a peer: its first row in the
                      receive stage; else -1 */
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
    symm_nccl_chunk *send_runs;     /* [world]: per peer (never this rank), its chunks as one run
                                       of packed rows, ascending peer */
    symm_nccl_chunk *recv_runs;     /* [world]: per peer, the rows from it as one run: of recv_x
                                       (layout rank) or of the receive stage (layout expert) */
    /* What symm_nccl_plan_chunks found. */
    int n_send, n_recv;
    int n_send_runs, n_recv_runs;
    int64_t stage_rows;             /* layout expert: rows received from the peers (the receive
                                       stage's rows in use); layout rank: 0 */
    int64_t packed;                 /* rows packed for sending */
    int32_t recv_rows;              /* as the native state's recv_rows */
    int32_t dropped_recv;           /* rows meant for this rank that did not fit */
    int32_t dropped_send;           /* rows of this rank dropped at their destination */
    int64_t self_first, self_rows;  /* this rank's rows for itself: packed rows [self_first,
                                       self_first + self_rows), the chunks to itself (contiguous,
                                       as bins go by rank) */
} symm_nccl_plan;

/* With every rank's count row in counts: base, the send and receive chunks
 * and runs, packed, this rank's rows for itself (self_first, self_rows),
 * recv_rows, the drops, (layout expert) expert and stage_rows.
 * O(world x bins). */
void symm_nccl_plan_chunks(symm_nccl_plan *p);

/* Layout expert: the chunk list symm_nccl_unstage and symm_nccl_restage
 * take, each chunk from a peer as {its first stage row, its first received
 * row} in list[2 * i], list[2 * i + 1], ascending by stage row; list holds
 * n_recv pairs. Returns the chunks listed. */
int symm_nccl_unstage_list(const symm_nccl_plan *p, int32_t *list);

/* The most rows a layout-expert receive stage holds: what the peers can
 * send this rank, below its capacity. */
int64_t symm_nccl_stage_capacity(int world, int64_t max_send, int64_t capacity);

#endif
