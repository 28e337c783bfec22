/* hybrid_plan.c: the hybrid backend's routing on the host (hybrid_plan.h). */
#include <stdio.h>
#include <string.h>

#include "hybrid_plan.h"
#include "internal.h"

/* Entry k of row is valid: in [0, E) and unlike every earlier entry (the
 * flat rules of symm_ref.h and the native kernels). */
static int valid_entry(const int32_t *row, int k, int experts)
{
    if (row[k] < 0 || row[k] >= experts)
        return 0;
    for (int i = 0; i < k; i++)
        if (row[i] == row[k])
            return 0;
    return 1;
}

void symm_hybrid_route_tokens(symm_hybrid_route *r)
{
    const int H = r->hosts, K = r->topk, E = r->experts, Eh = r->experts / r->hosts, T = r->tokens;
    r->invalid = 0;
    for (int g = 0; g < H; g++)
        r->send_count[g] = 0;
    /* First pass: the hosts of each token (slot = 1 where it goes), the
     * counts per host, the invalid entries. */
    for (int t = 0; t < T; t++) {
        const int32_t *row = r->topk_idx + (size_t)t * K;
        int32_t *slot = r->slot + (size_t)t * H;
        for (int g = 0; g < H; g++)
            slot[g] = -1;
        for (int k = 0; k < K; k++) {
            if (!valid_entry(row, k, E)) {
                r->invalid += row[k] != -1;
                continue;
            }
            slot[row[k] / Eh] = 1;
        }
        for (int g = 0; g < H; g++)
            r->send_count[g] += slot[g] == 1;
    }
    int32_t next[SYMM_HYBRID_MAX_HOSTS];
    int rows = 0;
    for (int g = 0; g < H; g++) {
        r->send_first[g] = rows;
        next[g] = rows;
        rows += r->send_count[g];
    }
    r->rows = rows;
    /* Second pass: each (token, host) its row, in host-major order. */
    for (int t = 0; t < T; t++) {
        const int32_t *row = r->topk_idx + (size_t)t * K;
        int32_t *slot = r->slot + (size_t)t * H;
        for (int g = 0; g < H; g++) {
            if (slot[g] != 1)
                continue;
            const int i = next[g]++;
            slot[g] = i;
            r->send_token[i] = t;
            r->send_origin[2 * (size_t)i] = r->rank;
            r->send_origin[2 * (size_t)i + 1] = t;
            int32_t *out = r->send_topk + (size_t)i * K;
            for (int k = 0; k < K; k++)
                out[k] = valid_entry(row, k, E) && row[k] / Eh == g ? row[k] - g * Eh : -1;
            if (r->send_weights)
                memcpy(r->send_weights + (size_t)i * K, r->topk_weights + (size_t)t * K, (size_t)K * sizeof(float));
        }
    }
}

int symm_hybrid_forward(int hosts, int local, int rank, const int32_t *counts, int32_t *fwd_count,
                        int32_t *fwd_first)
{
    const int h = rank / local, l = rank % local;
    int total = 0;
    for (int g = 0; g < hosts; g++) {
        fwd_first[g] = total;
        fwd_count[g] = counts[(size_t)(g * local + l) * hosts + h];
        total += fwd_count[g];
    }
    return total;
}

symm_status symm_hybrid_check(const symm_variant_desc *d, int world, int hosts, const int *rank_host,
                              const symm_variant_desc **companion)
{
    *companion = NULL;
    if (hosts < 2)
        return symm_fail(SYMM_ERR_UNSUPPORTED,
                         "backend hybrid joins the ranks of several hosts, and the world's %d ranks are on one "
                         "host: use backend native there (SYMM_BACKEND=native or unset)", world);
    if (hosts > SYMM_HYBRID_MAX_HOSTS)
        return symm_fail(SYMM_ERR_UNSUPPORTED, "backend hybrid: the world spans %d hosts, at most %d are supported",
                         hosts, SYMM_HYBRID_MAX_HOSTS);
    /* Host-major, the same number of ranks on every host. */
    if (world % hosts != 0)
        return symm_fail(SYMM_ERR_UNSUPPORTED,
                         "backend hybrid needs the same number of ranks on every host, and %d ranks do not divide "
                         "among %d hosts: start as many ranks on each host", world, hosts);
    const int L = world / hosts;
    for (int r = 0; r < world; r++)
        if (rank_host[r] != r / L)
            return symm_fail(SYMM_ERR_UNSUPPORTED,
                             "backend hybrid needs ranks host-major (rank = host * %d + local rank), and rank %d is "
                             "on host %d, not host %d: start ranks host by host (symmrun and torchrun do), or use "
                             "backend nccl", L, r, rank_host[r], r / L);
    if (d->combine_order == SYMM_COMBINE_ORDER_K)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "variant %s has combine_order = \"k\", which backend hybrid refuses (every (token, expert) "
                         "row would cross the network back): use combine_order = \"rank\" in the spec, or backend "
                         "nccl", d->name);
    for (int i = 0; i < d->n_companions; i++)
        if (d->companions && d->companions[i].hosts == hosts) {
            *companion = &d->companions[i];
            return SYMM_OK;
        }
    char have[256] = "";
    size_t len = 0;
    for (int i = 0; i < d->n_companions && d->companions && len < sizeof have; i++)
        len += (size_t)snprintf(have + len, sizeof have - len, "%s%d", i ? ", " : "", d->companions[i].hosts);
    return symm_fail(SYMM_ERR_INVALID_ARG,
                     "variant %s has no companion for %d hosts (its spec's hosts: {%s}): add %d to the field hosts "
                     "of its layout (hosts = {%s%s%d}) and regenerate it", d->name, hosts, have, hosts, have,
                     len ? ", " : "", hosts);
}
