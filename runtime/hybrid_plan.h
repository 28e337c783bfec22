/* hybrid_plan.h: the hybrid backend's routing on the host
 * (runtime/variant_hybrid.c; docs/protocol.md "Across hosts: the hybrid
 * backend"). Plain C on host arrays (no CUDA), so that
 * tests/cpu/test_hybrid_plan.c checks it, composed over whole worlds,
 * against the CPU reference's hybrid order without a GPU. Internal.
 *
 * W ranks on H hosts of L = W / H ranks, host-major (rank = host * L +
 * local index); E experts, E_h = E / H a host: host g owns
 * [g * E_h, (g + 1) * E_h). */
#ifndef SYMM_HYBRID_PLAN_H
#define SYMM_HYBRID_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "symm_status.h"
#include "symm_variant.h"

/* The most hosts a hybrid world may span. */
#define SYMM_HYBRID_MAX_HOSTS 128

/* One source rank's rows, by destination host. The caller sets the
 * parameters and the inputs and owns every array; rows is at most
 * tokens * min(hosts, topk). */
typedef struct symm_hybrid_route {
    int hosts, local, experts, topk, rank; /* rank: this (global) rank */
    int tokens;
    const int32_t *topk_idx;   /* [tokens, topk] */
    const float *topk_weights; /* [tokens, topk], or NULL (no weights) */
    /* Out: the send rows, by destination host ascending, then token ascending. */
    int32_t *send_token;       /* [rows]: the token of each row (x's row to send) */
    int32_t *send_topk;        /* [rows, topk]: the row rewritten to the host's experts
                                  (e - g * E_h for a valid e of host g, else -1) */
    float *send_weights;       /* [rows, topk]: the token's weights, or NULL */
    int32_t *send_origin;      /* [rows, 2]: {rank, token}, what the proxy tabulates */
    int32_t *send_count;       /* [hosts]: rows for each host */
    int32_t *send_first;       /* [hosts]: where each host's rows start */
    int32_t *slot;             /* [tokens, hosts]: the row of (token, host), -1 where none */
    int rows;                  /* rows in all */
    int invalid;               /* entries outside [-1, E) or repeating an earlier id of the row */
} symm_hybrid_route;

/* Fill r's outputs from its inputs: ids checked by the flat rules (an
 * invalid entry is skipped, counted, and -1 wherever it is rewritten),
 * token t goes once to each host that owns one of its valid experts. */
void symm_hybrid_route_tokens(symm_hybrid_route *r);

/* The proxy (h, l) of rank = h * L + l: with counts [world, hosts] (every
 * rank's send_count), the forwarded tokens it assembles: from each source
 * host h' ascending (its rank h' * L + l) fwd_count[h'] rows starting at
 * fwd_first[h'] (its own host's among them). Returns the total. */
int symm_hybrid_forward(int hosts, int local, int rank, const int32_t *counts, int32_t *fwd_count,
                        int32_t *fwd_first);

/* The checks of create on a world of `hosts` hosts, before any GPU work:
 * hosts >= 2; ranks host-major with the same count on every host
 * (rank_host[r], r < world: each rank's host index); combine_order rank;
 * a companion of desc for hosts, returned in *companion. SYMM_ERR_UNSUPPORTED
 * (a one-host world, ranks not host-major) or SYMM_ERR_INVALID_ARG (the
 * spec: combine_order k, no companion) with a message that says what to
 * change. */
symm_status symm_hybrid_check(const symm_variant_desc *desc, int world, int hosts, const int *rank_host,
                              const symm_variant_desc **companion);

#endif
