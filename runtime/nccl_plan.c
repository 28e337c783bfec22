/* nccl_plan.c: the NCCL backend's routing on the host (see nccl_plan.h). */
#include <string.h>

#include "nccl_plan.h"

int symm_nccl_plan_count(symm_nccl_plan *p, int T)
{
    const int W = p->world, K = p->topk, E = p->experts, L = E / W;
    const bool expert = p->expert_layout, weights = p->weights;
    const int per = expert ? K : W;
    /* e / L as a multiply: exact for e and L below 2^16 (experts <= 8192). */
    const uint64_t inv = ((uint64_t)1 << 32) / (uint64_t)L + 1;
    const int32_t *topk = p->topk_idx;
    const float *topk_weights = p->topk_weights;
    float *token_weights = p->token_weights;
    int32_t *routes = p->route;
    int32_t *row = p->counts + (size_t)p->rank * p->bins;
    memset(row, 0, (size_t)p->bins * sizeof *row);
    int invalid = 0;
    for (int t = 0; t < T; t++) {
        const int32_t *ids = topk + (size_t)t * K;
        int32_t *route = routes + (size_t)t * per;
        for (int i = 0; i < per; i++)
            route[i] = -1;
        for (int k = 0; k < K; k++) {
            const int e = ids[k];
            /* Valid: in [0, E) and no repeat of an earlier entry of the row
             * (as the kernels' classify). */
            bool repeat = false;
            for (int j = 0; j < k; j++)
                repeat |= ids[j] == e;
            if (e < 0 || e >= E || repeat) {
                invalid += e != -1;
                if (expert)
                    token_weights[(size_t)t * K + k] = 0.0f;
                continue;
            }
            if (expert) {
                route[k] = row[e]++;
                token_weights[(size_t)t * K + k] = weights ? topk_weights[(size_t)t * K + k] : 0.0f;
            } else {
                /* The token's first row for rank r; no branch on it (its
                 * outcome is random). */
                const int r = (int)(((uint64_t)(uint32_t)e * inv) >> 32);
                const int32_t old = route[r], next = row[r];
                const bool first = old < 0;
                route[r] = first ? next : old;
                row[r] = next + first;
            }
        }
    }
    return invalid;
}

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

/* Pack this rank's kept rows per chunk (chunks ascending, tokens ascending
 * within one): the token, source and COMBINE_IN slot of each packed row
 * (the rest of its metadata comes from the top-k arrays on the GPU:
 * symm_pack_meta in the template) and the final route. A (token, bin)'s index among this rank's rows for
 * its chunk grows with the token, so a chunk keeps its first rows (those
 * below the capacity at the destination) and each lands at its chunk's start
 * plus that index: one pass over the tokens. */
static void pack(symm_nccl_plan *p, int T)
{
    const int W = p->world, K = p->topk, L = p->experts / p->world, me = p->rank;
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
            p->send_chunks[p->n_send++] = (symm_nccl_chunk){rank, packed, kept};
        packed += kept;
        dropped += mine[c] - kept;
    }
    const int per = expert ? K : W;
    const int64_t cap = p->capacity;
    const int32_t *topk = p->topk_idx;
    int32_t *send_index = p->send_index, *stage_index = p->stage_index, *send_src = p->send_src;
    int32_t *self_dst = p->self_dst;
    const int64_t self_first = p->self_first;
    const int max_tokens = p->max_tokens;
    for (int t = 0; t < T; t++) {
        const int32_t *ids = topk + (size_t)t * K;
        int32_t *route = p->route + (size_t)t * per;
        for (int slot = 0; slot < per; slot++) {
            if (route[slot] < 0)
                continue;
            const int c = expert ? ids[slot] : slot;
            const int64_t dest_row = base[c] + route[slot];
            if (dest_row >= cap) {
                route[slot] = -1;
                continue;
            }
            const int64_t at = first[c] + route[slot];
            route[slot] = (int32_t)dest_row;
            if (at >= self_first && at < self_first + p->self_rows) /* this rank's own chunks */
                self_dst[at - self_first] = (int32_t)dest_row;
            send_index[at] = t;
            stage_index[at] = expert ? t * K + slot : slot * max_tokens + t;
            int32_t *src = send_src + at * 4;
            src[0] = me, src[1] = t, src[2] = expert ? slot : -1, src[3] = 0;
        }
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
                p->recv_chunks[p->n_recv++] = (symm_nccl_chunk){s, start, keep};
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
            p->recv_chunks[(size_t)s * L + j] = (symm_nccl_chunk){keep > 0 ? s : -1, start, keep};
            earlier += cnt;
        }
        offset = (offset + total + p->align - 1) / p->align * p->align;
    }
    for (int i = 0; i < W * L; i++)
        if (p->recv_chunks[i].peer >= 0)
            p->recv_chunks[p->n_recv++] = p->recv_chunks[i];
}

void symm_nccl_plan_rows(symm_nccl_plan *p, int T)
{
    p->recv_rows = p->dropped_recv = p->dropped_send = 0;
    bases(p);
    pack(p, T);
    plan_receives(p);
}
