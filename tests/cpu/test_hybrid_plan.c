/* test_hybrid_plan.c: the hybrid backend's host side without a GPU.
 *
 * symm_hybrid_route_tokens against a direct model of the rules (rows by
 * destination host, then token; rewritten top-k rows; invalid ids counted
 * at the source), and the whole backend composed on the CPU for random
 * worlds of several hosts: every rank routes, the counts are all-gathered,
 * every proxy assembles its forwarded tokens (symm_hybrid_forward) from
 * the rows its peers of the same local index send, the companion's native
 * dispatch and combine run as the one-host CPU reference over each host's
 * forwarded tokens, src is mapped through the proxies' tables, P_g comes
 * back along the slots and is summed over hosts in fp32, rounded once (as
 * symm_hybrid_sum does). Everything must equal symm_ref_dispatch and
 * symm_ref_combine with hosts = H bit for bit: rows, src, local ids,
 * weights, expert counts and offsets, drops, invalid ids and combine's out.
 * Also create's checks (symm_hybrid_check). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hybrid_plan.h"
#include "moe_inputs.h"
#include "symm_ref.h"

static uint64_t fresh_seed(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
}

/* A row of K entries: mostly distinct valid ids, some -1, some invalid
 * (out of range or repeated) when bad. */
static void random_row(moe_rng *r, int K, int E, int bad, int32_t *row)
{
    for (int k = 0; k < K; k++) {
        int e;
        do {
            e = moe_rng_int(r, E);
        } while (moe_row_has(row, k, e) && moe_rng_int(r, 8) != 0);
        row[k] = e;
        const int u = moe_rng_int(r, 10);
        if (u == 0)
            row[k] = -1;
        else if (bad && u == 1)
            row[k] = moe_rng_int(r, 2) ? E + moe_rng_int(r, 5) : -2 - moe_rng_int(r, 3);
        else if (bad && u == 2 && k > 0)
            row[k] = row[moe_rng_int(r, k)];
    }
}

static int valid_at(const int32_t *row, int k, int E)
{
    if (row[k] < 0 || row[k] >= E)
        return 0;
    for (int i = 0; i < k; i++)
        if (row[i] == row[k])
            return 0;
    return 1;
}

typedef struct route_bufs {
    int32_t *send_token, *send_topk, *send_origin, *send_count, *send_first, *slot;
    float *send_weights;
} route_bufs;

static void route_alloc(route_bufs *b, int T, int K, int H)
{
    const size_t rows = (size_t)T * (size_t)(K < H ? K : H) + 1;
    b->send_token = calloc(rows, 4);
    b->send_topk = calloc(rows * K, 4);
    b->send_origin = calloc(rows * 2, 4);
    b->send_weights = calloc(rows * K, 4);
    b->send_count = calloc((size_t)H, 4);
    b->send_first = calloc((size_t)H, 4);
    b->slot = calloc((size_t)T * H + 1, 4);
}

static void route_free(route_bufs *b)
{
    free(b->send_token);
    free(b->send_topk);
    free(b->send_origin);
    free(b->send_weights);
    free(b->send_count);
    free(b->send_first);
    free(b->slot);
}

static symm_hybrid_route route_of(route_bufs *b, int H, int L, int E, int K, int rank, int T, const int32_t *topk,
                                  const float *weights)
{
    return (symm_hybrid_route){
        .hosts = H, .local = L, .experts = E, .topk = K, .rank = rank, .tokens = T,
        .topk_idx = topk, .topk_weights = weights,
        .send_token = b->send_token, .send_topk = b->send_topk, .send_weights = weights ? b->send_weights : NULL,
        .send_origin = b->send_origin, .send_count = b->send_count, .send_first = b->send_first, .slot = b->slot,
    };
}

Test(hybrid_plan, route_follows_the_rules_for_random_rows)
{
    const uint64_t seed = fresh_seed();
    for (int iter = 0; iter < 300; iter++) {
        moe_rng r = moe_rng_for(seed, (uint64_t)iter, 1);
        const int H = 2 + moe_rng_int(&r, 5), L = 1 + moe_rng_int(&r, 3), W = H * L;
        const int E = W * (1 + moe_rng_int(&r, 4)), K = 1 + moe_rng_int(&r, E < 8 ? E : 8);
        const int T = moe_rng_int(&r, 40), rank = moe_rng_int(&r, W), Eh = E / H;
        int32_t *topk = malloc(sizeof(int32_t) * ((size_t)T * K + 1));
        float *w = malloc(sizeof(float) * ((size_t)T * K + 1));
        for (int t = 0; t < T; t++)
            random_row(&r, K, E, 1, topk + (size_t)t * K);
        moe_random_floats(&r, w, (size_t)T * K, 0.0);
        route_bufs b;
        route_alloc(&b, T, K, H);
        symm_hybrid_route rt = route_of(&b, H, L, E, K, rank, T, topk, w);
        symm_hybrid_route_tokens(&rt);
        /* The model: for each host ascending, each token ascending that has
         * a valid expert there. */
        int row = 0, invalid = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                invalid += topk[t * K + k] != -1 && !valid_at(topk + t * K, k, E);
        cr_assert_eq(rt.invalid, invalid, "seed 0x%llx iter %d: invalid %d, want %d", (unsigned long long)seed, iter,
                     rt.invalid, invalid);
        for (int g = 0; g < H; g++) {
            cr_assert_eq(b.send_first[g], row, "seed 0x%llx iter %d: host %d starts at %d, want %d",
                         (unsigned long long)seed, iter, g, b.send_first[g], row);
            for (int t = 0; t < T; t++) {
                const int32_t *tr = topk + (size_t)t * K;
                int there = 0;
                for (int k = 0; k < K; k++)
                    there |= valid_at(tr, k, E) && tr[k] / Eh == g;
                if (!there) {
                    cr_assert_eq(b.slot[t * H + g], -1, "seed 0x%llx iter %d: slot (%d, %d) should be -1",
                                 (unsigned long long)seed, iter, t, g);
                    continue;
                }
                cr_assert_eq(b.slot[t * H + g], row, "seed 0x%llx iter %d: slot (%d, %d) = %d, want %d",
                             (unsigned long long)seed, iter, t, g, b.slot[t * H + g], row);
                cr_assert_eq(b.send_token[row], t);
                cr_assert_eq(b.send_origin[2 * row], rank);
                cr_assert_eq(b.send_origin[2 * row + 1], t);
                for (int k = 0; k < K; k++) {
                    const int want = valid_at(tr, k, E) && tr[k] / Eh == g ? tr[k] - g * Eh : -1;
                    cr_assert_eq(b.send_topk[row * K + k], want,
                                 "seed 0x%llx iter %d: row %d k %d: %d, want %d (id %d, host %d)",
                                 (unsigned long long)seed, iter, row, k, b.send_topk[row * K + k], want, tr[k], g);
                    cr_assert(!memcmp(&b.send_weights[row * K + k], &w[t * K + k], 4));
                }
                row++;
            }
            cr_assert_eq(b.send_count[g], row - b.send_first[g]);
        }
        cr_assert_eq(rt.rows, row);
        cr_assert_leq(rt.rows, T * (K < H ? K : H));
        route_free(&b);
        free(topk);
        free(w);
    }
}

Test(hybrid_plan, forward_takes_each_source_host_in_order)
{
    /* 3 hosts of 2: counts[s][g] = rows rank s sends to host g. */
    const int H = 3, L = 2, W = 6;
    int32_t counts[6 * 3];
    for (int s = 0; s < W; s++)
        for (int g = 0; g < H; g++)
            counts[s * H + g] = 10 * s + g;
    int32_t cnt[3], first[3];
    /* Proxy (1, 1) = rank 3: from ranks 1, 3, 5, each its column 1. */
    cr_assert_eq(symm_hybrid_forward(H, L, 3, counts, cnt, first), 11 + 31 + 51);
    cr_assert_eq(cnt[0], 11);
    cr_assert_eq(cnt[1], 31);
    cr_assert_eq(cnt[2], 51);
    cr_assert_eq(first[0], 0);
    cr_assert_eq(first[1], 11);
    cr_assert_eq(first[2], 42);
    /* Proxy (2, 0) = rank 4: ranks 0, 2, 4, column 2. */
    cr_assert_eq(symm_hybrid_forward(H, L, 4, counts, cnt, first), 2 + 22 + 42);
    cr_assert_eq(cnt[1], 22);
    cr_assert_eq(first[2], 24);
}

/* ---- the backend composed on the CPU ------------------------------------ */

static float load_elem(const void *p, size_t i, symm_dtype dt)
{
    switch (dt) {
    case SYMM_DTYPE_BF16: return symm_bf16_to_f32(((const uint16_t *)p)[i]);
    case SYMM_DTYPE_FP16: return symm_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static void store_elem(void *p, size_t i, symm_dtype dt, float f)
{
    switch (dt) {
    case SYMM_DTYPE_BF16: ((uint16_t *)p)[i] = symm_f32_to_bf16(f); break;
    case SYMM_DTYPE_FP16: ((uint16_t *)p)[i] = symm_f32_to_f16(f); break;
    default: ((float *)p)[i] = f; break;
    }
}

typedef struct src_inputs {
    int tokens;
    void *x;
    float *scales, *weights;
    int32_t *topk;
} src_inputs;

static void compose_one(uint64_t seed, int iter)
{
    moe_rng r = moe_rng_for(seed, (uint64_t)iter, 2);
    static const symm_dtype dts[] = {SYMM_DTYPE_BF16, SYMM_DTYPE_FP16, SYMM_DTYPE_FP32, SYMM_DTYPE_FP8_E4M3};
    static const symm_dtype cdts[] = {SYMM_DTYPE_BF16, SYMM_DTYPE_FP16, SYMM_DTYPE_FP32};
    const int H = 2 + moe_rng_int(&r, 3), L = 1 + moe_rng_int(&r, 3), W = H * L;
    symm_ref_config cfg = {
        .hidden = 128, .topk = 0, .experts = W * (1 + moe_rng_int(&r, 3)), .world = W,
        .max_tokens = 1 + moe_rng_int(&r, 12), .dtype = dts[moe_rng_int(&r, 4)],
        .combine_dtype = cdts[moe_rng_int(&r, 3)], .layout = moe_rng_int(&r, 2) ? SYMM_LAYOUT_EXPERT : SYMM_LAYOUT_RANK,
        .weights = moe_rng_int(&r, 2), .align = 1, .hosts = H,
    };
    const int E = cfg.experts, Eh = E / H, T_max = cfg.max_tokens;
    cfg.topk = 1 + moe_rng_int(&r, Eh < 6 ? Eh : 6);
    if (cfg.layout == SYMM_LAYOUT_EXPERT)
        cfg.align = 1 + moe_rng_int(&r, 4);
    const int K = cfg.topk;
    const int64_t worst = symm_ref_worst_capacity(&cfg);
    cfg.capacity = moe_rng_int(&r, 3) == 0 ? 1 + moe_rng_int(&r, (int)worst) : worst;
    cr_assert_eq(symm_ref_check_config(&cfg), SYMM_OK, "%s", symm_last_error());
    /* The companion: L ranks, E / H experts, H * max_tokens, the same capacity. */
    symm_ref_config comp = cfg;
    comp.world = L;
    comp.experts = Eh;
    comp.max_tokens = H * T_max;
    comp.hosts = 0;
    cr_assert_eq(symm_ref_worst_capacity(&comp), worst, "the companion's worst case is the variant's");
    cr_assert_eq(symm_ref_check_config(&comp), SYMM_OK, "companion: %s", symm_last_error());

    const size_t hid = (size_t)cfg.hidden, row = hid * symm_dtype_size(cfg.dtype), sc = hid / SYMM_FP8_BLOCK;
    const size_t crow = hid * symm_dtype_size(cfg.combine_dtype);
    const int fp8 = cfg.dtype == SYMM_DTYPE_FP8_E4M3;
    src_inputs in[SYMM_REF_MAX_WORLD];
    symm_ref_input ref_in[SYMM_REF_MAX_WORLD];
    route_bufs rb[SYMM_REF_MAX_WORLD];
    symm_hybrid_route rt[SYMM_REF_MAX_WORLD];
    for (int s = 0; s < W; s++) {
        const int T = moe_rng_int(&r, T_max + 1);
        in[s].tokens = T;
        in[s].x = malloc((size_t)T * row + 1);
        in[s].scales = malloc(sizeof(float) * ((size_t)T * sc + 1));
        in[s].weights = malloc(sizeof(float) * ((size_t)T * K + 1));
        in[s].topk = malloc(sizeof(int32_t) * ((size_t)T * K + 1));
        moe_random_elems(&r, cfg.dtype, in[s].x, (size_t)T * hid);
        moe_random_floats(&r, in[s].scales, (size_t)T * sc, 0.01);
        moe_random_floats(&r, in[s].weights, (size_t)T * K, 0.0);
        for (int t = 0; t < T; t++)
            random_row(&r, K, E, moe_rng_int(&r, 2), in[s].topk + (size_t)t * K);
        ref_in[s] = (symm_ref_input){T, in[s].x, fp8 ? in[s].scales : NULL, in[s].topk,
                                     cfg.weights ? in[s].weights : NULL};
        route_alloc(&rb[s], T, K, H);
        rt[s] = route_of(&rb[s], H, L, E, K, s, T, in[s].topk, cfg.weights ? in[s].weights : NULL);
        symm_hybrid_route_tokens(&rt[s]);
    }
    /* The counts' all-gather. */
    int32_t *counts = malloc(sizeof(int32_t) * (size_t)W * H);
    for (int s = 0; s < W; s++)
        memcpy(counts + (size_t)s * H, rb[s].send_count, sizeof(int32_t) * (size_t)H);

    /* Each proxy's forwarded tokens, as NCCL and the own-host copies place them. */
    const size_t F = (size_t)H * T_max;
    void *fx[SYMM_REF_MAX_WORLD];
    float *fscales[SYMM_REF_MAX_WORLD], *fweights[SYMM_REF_MAX_WORLD];
    int32_t *ftopk[SYMM_REF_MAX_WORLD], *ftable[SYMM_REF_MAX_WORLD], fcount[SYMM_REF_MAX_WORLD][8],
        ffirst[SYMM_REF_MAX_WORLD][8];
    int forwarded[SYMM_REF_MAX_WORLD];
    for (int p = 0; p < W; p++) {
        const int h = p / L, l = p % L;
        fx[p] = malloc(F * row + 1);
        fscales[p] = malloc(sizeof(float) * (F * sc + 1));
        fweights[p] = malloc(sizeof(float) * (F * K + 1));
        ftopk[p] = malloc(sizeof(int32_t) * (F * K + 1));
        ftable[p] = malloc(sizeof(int32_t) * (F * 2 + 1));
        forwarded[p] = symm_hybrid_forward(H, L, p, counts, fcount[p], ffirst[p]);
        cr_assert_leq(forwarded[p], (int)F);
        for (int g = 0; g < H; g++) {
            const int s = g * L + l; /* the source of this segment */
            cr_assert_eq(fcount[p][g], rb[s].send_count[h], "NCCL's sizes must match: proxy %d from %d", p, s);
            for (int j = 0; j < fcount[p][g]; j++) {
                const int from = rb[s].send_first[h] + j, to = ffirst[p][g] + j, t = rb[s].send_token[from];
                memcpy((char *)fx[p] + (size_t)to * row, (const char *)in[s].x + (size_t)t * row, row);
                memcpy(fscales[p] + (size_t)to * sc, in[s].scales + (size_t)t * sc, sc * sizeof(float));
                memcpy(ftopk[p] + (size_t)to * K, rb[s].send_topk + (size_t)from * K, (size_t)K * 4);
                if (cfg.weights)
                    memcpy(fweights[p] + (size_t)to * K, rb[s].send_weights + (size_t)from * K, (size_t)K * 4);
                memcpy(ftable[p] + (size_t)to * 2, rb[s].send_origin + (size_t)from * 2, 8);
            }
        }
    }

    /* The whole-world reference with hosts. */
    symm_ref_recv want[SYMM_REF_MAX_WORLD];
    symm_ref_send_stats want_stats[SYMM_REF_MAX_WORLD];
    for (int p = 0; p < W; p++)
        cr_assert_eq(symm_ref_recv_alloc(&cfg, &want[p]), SYMM_OK, "%s", symm_last_error());
    const symm_status ws = symm_ref_dispatch(&cfg, ref_in, want, want_stats);
    cr_assert(ws == SYMM_OK || ws == SYMM_ERR_OVERFLOW, "%s", symm_last_error());
    /* The companions: each host's one-host reference over its forwarded tokens. */
    symm_ref_recv got[SYMM_REF_MAX_WORLD];
    symm_ref_send_stats comp_stats[SYMM_REF_MAX_WORLD];
    for (int p = 0; p < W; p++)
        cr_assert_eq(symm_ref_recv_alloc(&comp, &got[p]), SYMM_OK, "%s", symm_last_error());
    /* Each rank's forwarded tokens, the input of its host's companion (host g: ranks g * L ...). */
    symm_ref_input cin[SYMM_REF_MAX_WORLD];
    for (int p = 0; p < W; p++)
        cin[p] = (symm_ref_input){forwarded[p], fx[p], fp8 ? fscales[p] : NULL, ftopk[p],
                                  cfg.weights ? fweights[p] : NULL};
    for (int g = 0; g < H; g++) {
        const symm_status cs = symm_ref_dispatch(&comp, cin + g * L, got + g * L, comp_stats + g * L);
        cr_assert(cs == SYMM_OK || cs == SYMM_ERR_OVERFLOW, "%s", symm_last_error());
    }
    /* Invalid ids at the source; drops summed over the world (the
     * companion counts a drop at the proxy that forwarded the row). */
    int64_t drops_want = 0, drops_got = 0;
    for (int s = 0; s < W; s++) {
        cr_assert_eq(rt[s].invalid, want_stats[s].invalid, "seed 0x%llx iter %d: rank %d invalid",
                     (unsigned long long)seed, iter, s);
        cr_assert_eq(comp_stats[s].invalid, 0, "the rewritten rows hold no invalid id");
        drops_want += want_stats[s].dropped;
        drops_got += comp_stats[s].dropped;
    }
    cr_assert_eq(drops_got, drops_want, "seed 0x%llx iter %d: rows dropped", (unsigned long long)seed, iter);
    const int Lx = E / W;
    for (int p = 0; p < W; p++) {
        const int g = p / L;
        const char *ctx = cfg.layout == SYMM_LAYOUT_RANK ? "rank" : "expert";
        cr_assert_eq(got[p].rows, want[p].rows, "seed 0x%llx iter %d (%s): rank %d rows %lld, want %lld",
                     (unsigned long long)seed, iter, ctx, p, (long long)got[p].rows, (long long)want[p].rows);
        cr_assert_eq(got[p].dropped, want[p].dropped, "seed 0x%llx iter %d: rank %d dropped",
                     (unsigned long long)seed, iter, p);
        cr_assert(!memcmp(got[p].expert_count, want[p].expert_count, (size_t)Lx * 4), "seed 0x%llx iter %d: counts",
                  (unsigned long long)seed, iter);
        cr_assert(!memcmp(got[p].expert_offset, want[p].expert_offset, (size_t)Lx * 4),
                  "seed 0x%llx iter %d: offsets", (unsigned long long)seed, iter);
        for (int64_t i = 0; i < got[p].rows; i++) {
            const int32_t *c = got[p].src + i * 4, *w = want[p].src + i * 4;
            if (cfg.layout == SYMM_LAYOUT_EXPERT && c[0] == (int32_t)0xA5A5A5A5) {
                cr_assert_eq(w[0], (int32_t)0xA5A5A5A5, "padding row %lld on both", (long long)i);
                continue;
            }
            /* symm_hybrid_src: proxy c[0] of this host, its forwarded token c[1]. */
            const int proxy = g * L + c[0];
            const int32_t *o = ftable[proxy] + (size_t)c[1] * 2;
            cr_assert(o[0] == w[0] && o[1] == w[1] && c[2] == w[2] && c[3] == w[3],
                      "seed 0x%llx iter %d (%s): rank %d row %lld: src {%d, %d, %d}, want {%d, %d, %d}",
                      (unsigned long long)seed, iter, ctx, p, (long long)i, o[0], o[1], c[2], w[0], w[1], w[2]);
            cr_assert(!memcmp((char *)got[p].x + i * row, (char *)want[p].x + i * row, row), "row %lld x", (long long)i);
            if (fp8)
                cr_assert(!memcmp(got[p].scales + i * sc, want[p].scales + i * sc, sc * 4), "scales");
            if (cfg.layout == SYMM_LAYOUT_RANK) {
                cr_assert(!memcmp(got[p].topk_idx + i * K, want[p].topk_idx + i * K, (size_t)K * 4),
                          "seed 0x%llx iter %d: rank %d row %lld: local ids", (unsigned long long)seed, iter, p,
                          (long long)i);
                if (cfg.weights)
                    cr_assert(!memcmp(got[p].weights + i * K, want[p].weights + i * K, (size_t)K * 4), "weights");
            } else if (cfg.weights) {
                cr_assert(!memcmp(got[p].weights + i, want[p].weights + i, 4), "weight");
            }
        }
    }

    /* Combine: y per rank (the same rows on both sides), the companions'
     * out at the proxies, back along the slots, summed over hosts. */
    void *y[SYMM_REF_MAX_WORLD], *want_out[SYMM_REF_MAX_WORLD], *pout[SYMM_REF_MAX_WORLD];
    for (int p = 0; p < W; p++) {
        y[p] = calloc((size_t)want[p].capacity + 1, crow);
        moe_random_elems(&r, cfg.combine_dtype, y[p], (size_t)want[p].rows * hid);
        want_out[p] = malloc((size_t)in[p].tokens * crow + 1);
        pout[p] = malloc((size_t)forwarded[p] * crow + 1);
    }
    cr_assert_eq(symm_ref_combine(&cfg, ref_in, want, (const void *const *)y, want_out), SYMM_OK, "%s",
                 symm_last_error());
    for (int g = 0; g < H; g++) {
        cr_assert_eq(symm_ref_combine(&comp, cin + g * L, got + g * L, (const void *const *)(y + g * L), pout + g * L),
                     SYMM_OK, "%s", symm_last_error());
    }
    for (int s = 0; s < W; s++) {
        const int h = s / L, l = s % L;
        /* ret: the rows coming back, where the send rows were. */
        void *ret = malloc((size_t)rt[s].rows * crow + 1);
        for (int g = 0; g < H; g++) {
            const int proxy = g * L + l;
            memcpy((char *)ret + (size_t)rb[s].send_first[g] * crow,
                   (char *)pout[proxy] + (size_t)ffirst[proxy][h] * crow, (size_t)rb[s].send_count[g] * crow);
        }
        void *out = malloc((size_t)in[s].tokens * crow + 1);
        for (int t = 0; t < in[s].tokens; t++)
            for (size_t e = 0; e < hid; e++) {
                float acc = 0.0f;
                for (int g = 0; g < H; g++) {
                    const int slot = rb[s].slot[t * H + g];
                    if (slot >= 0)
                        acc = acc + load_elem(ret, (size_t)slot * hid + e, cfg.combine_dtype);
                }
                store_elem(out, (size_t)t * hid + e, cfg.combine_dtype, acc);
            }
        for (int t = 0; t < in[s].tokens; t++)
            cr_assert(!memcmp((char *)out + (size_t)t * crow, (char *)want_out[s] + (size_t)t * crow, crow),
                      "seed 0x%llx iter %d: rank %d token %d: combine's out differs from the reference",
                      (unsigned long long)seed, iter, s, t);
        free(ret);
        free(out);
    }

    for (int p = 0; p < W; p++) {
        symm_ref_recv_free(&want[p]);
        symm_ref_recv_free(&got[p]);
        free(y[p]);
        free(want_out[p]);
        free(pout[p]);
        free(fx[p]);
        free(fscales[p]);
        free(fweights[p]);
        free(ftopk[p]);
        free(ftable[p]);
        free(in[p].x);
        free(in[p].scales);
        free(in[p].weights);
        free(in[p].topk);
        route_free(&rb[p]);
    }
    free(counts);
}

Test(hybrid_plan, composed_with_the_companions_equals_the_reference_across_hosts)
{
    const uint64_t seed = fresh_seed();
    for (int iter = 0; iter < 200; iter++)
        compose_one(seed, iter);
}

/* ---- create's checks ---------------------------------------------------- */

static symm_variant_desc desc_with(symm_variant_desc *comps, int n)
{
    return (symm_variant_desc){.name = "v", .world = 4, .experts = 16, .topk = 2, .layout = SYMM_LAYOUT_RANK,
                               .combine_order = SYMM_COMBINE_ORDER_RANK, .companions = comps, .n_companions = n};
}

Test(hybrid_plan, check_picks_the_companion_of_the_host_count)
{
    symm_variant_desc comps[2] = {{.name = "v_h2", .hosts = 2}, {.name = "v_h4", .hosts = 4}};
    const symm_variant_desc d = desc_with(comps, 2);
    const int two[4] = {0, 0, 1, 1}, four[4] = {0, 1, 2, 3};
    const symm_variant_desc *c = NULL;
    cr_assert_eq(symm_hybrid_check(&d, 4, 2, two, &c), SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(c, &comps[0]);
    cr_assert_eq(symm_hybrid_check(&d, 4, 4, four, &c), SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(c, &comps[1]);
}

static void expect(symm_status got, symm_status want, const char *a, const char *b)
{
    cr_assert_eq(got, want, "got %s (%s), want %s", symm_status_name(got), symm_last_error(), symm_status_name(want));
    cr_assert(strstr(symm_last_error(), a) && (!b || strstr(symm_last_error(), b)),
              "the message should say \"%s\"%s%s%s: %s", a, b ? " and \"" : "", b ? b : "", b ? "\"" : "",
              symm_last_error());
}

Test(hybrid_plan, check_refuses_what_the_backend_cannot_serve)
{
    symm_variant_desc comps[1] = {{.name = "v_h2", .hosts = 2}};
    symm_variant_desc d = desc_with(comps, 1);
    const symm_variant_desc *c = (const symm_variant_desc *)&d;
    const int one[4] = {0, 0, 0, 0};
    expect(symm_hybrid_check(&d, 4, 1, one, &c), SYMM_ERR_UNSUPPORTED, "on one host", "use backend native");
    cr_assert_null(c);
    /* Not host-major: rank 1 on host 1 where rank = host * 2 + local. */
    const int mixed[4] = {0, 1, 0, 1};
    expect(symm_hybrid_check(&d, 4, 2, mixed, &c), SYMM_ERR_UNSUPPORTED, "host-major", "rank 1 is on host 1");
    const int uneven[3] = {0, 0, 1};
    expect(symm_hybrid_check(&d, 3, 2, uneven, &c), SYMM_ERR_UNSUPPORTED, "same number of ranks on every host",
           NULL);
    const int two[4] = {0, 0, 1, 1};
    d.combine_order = SYMM_COMBINE_ORDER_K;
    d.layout = SYMM_LAYOUT_EXPERT;
    expect(symm_hybrid_check(&d, 4, 2, two, &c), SYMM_ERR_INVALID_ARG, "combine_order = \"k\"",
           "combine_order = \"rank\"");
    d.combine_order = SYMM_COMBINE_ORDER_RANK;
    const int four[4] = {0, 1, 2, 3};
    expect(symm_hybrid_check(&d, 4, 4, four, &c), SYMM_ERR_INVALID_ARG, "no companion for 4 hosts",
           "add 4 to the field hosts of its layout (hosts = {2, 4})");
    cr_assert_null(c);
    symm_variant_desc bare = desc_with(NULL, 0);
    expect(symm_hybrid_check(&bare, 4, 2, two, &c), SYMM_ERR_INVALID_ARG, "(its spec's hosts: {})",
           "(hosts = {2})");
}
