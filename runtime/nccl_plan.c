/* nccl_plan.c: the NCCL backend's chunks on the host (see nccl_plan.h). */
#include <stddef.h>

#include "nccl_plan.h"

/* base[b]: where this rank's rows for bin b start at the bin's rank (like
 * compute_bases in the template); also what this rank receives. */
static void bases(symm_nccl_plan *p)
{
    const int W = p->world, L = p->experts / p->world, me = p->rank;
    const int64_t cap = p->capacity;
    int64_t *base = p->base;
    for (int b = 0; b < p->bins; b++) {
        int64_t total = 0, earlier = 0;
        for (int s = 0; s < W; s++) {
            total += p->counts[(size_t)s * p->bins + b];
            if (s < me)
                earlier += p->counts[(size_t)s * p->bins + b];
        }
        base[b] = total;
        base[p->bins + b] = earlier;
    }
    if (p->expert_layout) {
        int64_t dropped = 0;
        for (int q = 0; q < W; q++) {
            int64_t offset = 0;
            for (int j = 0; j < L; j++) {
                const int64_t total = base[q * L + j];
                if (q == me) {
                    const int64_t fit = cap - offset;
                    p->expert[j] = (int32_t)(fit < 0 ? 0 : fit < total ? fit : total);
                    p->expert[L + j] = (int32_t)(offset < cap ? offset : cap);
                    dropped += total - p->expert[j];
                    if (j == L - 1)
                        p->recv_rows = (int32_t)(offset + total < cap ? offset + total : cap);
                }
                base[q * L + j] = offset;
                offset = (offset + total + p->align - 1) / p->align * p->align;
            }
        }
        p->dropped_recv = (int32_t)dropped;
    } else {
        const int64_t total = base[me];
        p->recv_rows = (int32_t)(total < cap ? total : cap);
        p->dropped_recv = (int32_t)(total < cap ? 0 : total - cap);
        for (int q = 0; q < W; q++)
            base[q] = 0;
    }
    for (int b = 0; b < p->bins; b++)
        base[b] += base[p->bins + b];
}

/* This rank's kept rows per chunk (chunks ascending; the GPU packs them
 * tokens ascending within one): a (token, bin)'s index among this rank's
 * rows for the bin grows with the token, so a chunk keeps its first rows
 * (those below the capacity at the destination). base[bins + b] becomes
 * where bin b's kept rows start among the packed rows. */
static void send_chunks(symm_nccl_plan *p)
{
    const int L = p->experts / p->world, me = p->rank;
    const bool expert = p->expert_layout;
    const int32_t *mine = p->counts + (size_t)me * p->bins;
    const int64_t *base = p->base;
    int64_t *first = p->base + p->bins; /* free once bases() is done */
    int64_t packed = 0, dropped = 0;
    p->n_send = 0;
    p->self_first = p->self_rows = 0;
    for (int c = 0; c < p->bins; c++) {
        const int64_t room = p->capacity - base[c];
        const int64_t kept = mine[c] < room ? mine[c] : room < 0 ? 0 : room;
        const int rank = expert ? c / L : c;
        first[c] = packed;
        if (rank == me && c == (expert ? me * L : me))
            p->self_first = packed;
        if (rank == me)
            p->self_rows += kept;
        if (kept > 0)
            p->send_chunks[p->n_send++] = (symm_nccl_chunk){rank, packed, kept, -1};
        packed += kept;
        dropped += mine[c] - kept;
    }
    p->packed = packed;
    p->dropped_send = (int32_t)dropped;
}

/* What this rank receives, chunk by chunk, in the order the senders pack. */
static void plan_receives(symm_nccl_plan *p)
{
    const int W = p->world, L = p->experts / p->world, me = p->rank;
    const int64_t cap = p->capacity;
    p->n_recv = 0;
    if (!p->expert_layout) {
        int64_t start = 0;
        for (int s = 0; s < W; s++) {
            const int64_t cnt = p->counts[(size_t)s * p->bins + me];
            const int64_t keep = start >= cap ? 0 : (start + cnt <= cap ? cnt : cap - start);
            if (keep > 0)
                p->recv_chunks[p->n_recv++] = (symm_nccl_chunk){s, start, keep, -1};
            start += cnt;
        }
        return;
    }
    /* The senders' chunks go (rank q, expert j) ascending, so from each sender
     * the chunks of this rank come in ascending j. Segment starts unclamped. */
    int64_t offset = 0;
    for (int j = 0; j < L; j++) {
        int64_t total = 0, earlier = 0;
        for (int s = 0; s < W; s++)
            total += p->counts[(size_t)s * p->bins + me * L + j];
        for (int s = 0; s < W; s++) {
            const int64_t cnt = p->counts[(size_t)s * p->bins + me * L + j];
            const int64_t start = offset + earlier;
            const int64_t keep = start >= cap ? 0 : (start + cnt <= cap ? cnt : cap - start);
            /* Placed by sender below; ordered after the loop. */
            p->recv_chunks[(size_t)s * L + j] = (symm_nccl_chunk){keep > 0 ? s : -1, start, keep, -1};
            earlier += cnt;
        }
        offset = (offset + total + p->align - 1) / p->align * p->align;
    }
    /* A peer's chunks take the next rows of the receive stage, in the order
     * it sends them. */
    int64_t stage = 0;
    for (int i = 0; i < W * L; i++) {
        symm_nccl_chunk c = p->recv_chunks[i];
        if (c.peer < 0)
            continue;
        if (c.peer != me) {
            c.stage = stage;
            stage += c.n;
        }
        p->recv_chunks[p->n_recv++] = c;
    }
    p->stage_rows = stage;
}

/* Consecutive chunks of one peer (this rank's own skipped) as one run:
 * packed rows (sending), or recv_x's rows (layout rank) or the stage's
 * (layout expert) when receiving. A peer's chunks are consecutive in
 * either list, and contiguous where the run's rows go. */
static int runs_of(const symm_nccl_chunk *chunks, int n, int me, bool staged, symm_nccl_chunk *runs)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        const symm_nccl_chunk c = chunks[i];
        if (c.peer == me)
            continue;
        const int64_t row = staged ? c.stage : c.row;
        if (m > 0 && runs[m - 1].peer == c.peer)
            runs[m - 1].n += c.n;
        else
            runs[m++] = (symm_nccl_chunk){c.peer, row, c.n, -1};
    }
    return m;
}

int symm_nccl_unstage_list(const symm_nccl_plan *p, int32_t *list)
{
    int m = 0;
    for (int i = 0; i < p->n_recv; i++) {
        const symm_nccl_chunk c = p->recv_chunks[i];
        if (c.peer == p->rank)
            continue;
        list[2 * m] = (int32_t)c.stage;
        list[2 * m + 1] = (int32_t)c.row;
        m++;
    }
    return m;
}

int64_t symm_nccl_stage_capacity(int world, int64_t max_send, int64_t capacity)
{
    const int64_t peers = (int64_t)(world - 1) * max_send;
    return peers < capacity ? peers : capacity;
}

void symm_nccl_plan_chunks(symm_nccl_plan *p)
{
    p->recv_rows = p->dropped_recv = p->dropped_send = 0;
    p->stage_rows = 0;
    bases(p);
    send_chunks(p);
    plan_receives(p);
    p->n_send_runs = runs_of(p->send_chunks, p->n_send, p->rank, false, p->send_runs);
    p->n_recv_runs = runs_of(p->recv_chunks, p->n_recv, p->rank, p->expert_layout, p->recv_runs);
}
