/* test_ref.c: the CPU reference of dispatch and combine (symm_ref.h).
 *
 * Hand-worked worlds with their expected rows written out literally, then
 * properties over fresh random worlds (worlds 2, 3, 4 and 8, both layouts,
 * every dtype), edge cases, config checks, and exhaustive checks of the
 * conversions. Inputs are random on every run; every failure message carries
 * the seed, and SYMM_TEST_SEED=<seed> replays it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "symm_ref.h"

/* ---- randomness and assertions ------------------------------------------- */

static unsigned long long g_seed;
static uint64_t g_rng;
static int g_seeded;

/* The seed of this test process, drawn on first use. */
static unsigned long long seed(void)
{
    if (!g_seeded) {
        const char *env = getenv("SYMM_TEST_SEED");
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        g_seed = env ? strtoull(env, NULL, 0)
                     : ((unsigned long long)ts.tv_sec * 1000000007ull) ^
                           (unsigned long long)ts.tv_nsec ^ ((unsigned long long)getpid() << 40);
        g_rng = g_seed;
        g_seeded = 1;
    }
    return g_seed;
}

static uint64_t rnd64(void)
{
    seed();
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int rnd(int n) { return (int)(rnd64() % (uint64_t)n); }
static int chance(int percent) { return rnd(100) < percent; }

static const char *msgf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *msgf(const char *fmt, ...)
{
    static char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

/* cr_assert with the seed in the message; the message is built only on failure. */
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond))                                                            \
            cr_assert_fail("seed %llu: %s", seed(), msgf(__VA_ARGS__));         \
    } while (0)

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int all_poison(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != SYMM_REF_POISON)
            return 0;
    return 1;
}

/* ---- a test world ---------------------------------------------------------- */

#define MAXW 8

typedef struct tworld {
    symm_ref_config cfg;
    symm_ref_input in[MAXW];
    symm_ref_recv recv[MAXW];
    symm_ref_send_stats stats[MAXW];
    void *x[MAXW];
    float *scales[MAXW];
    int32_t *idx[MAXW];
    float *tw[MAXW];
} tworld;

/* How random top-k rows are drawn. */
typedef struct gen {
    int masked;   /* percent of entries set to -1 */
    int invalid;  /* percent of entries made invalid (out of range or repeated) */
    int to_rank;  /* -1, or every expert lies on this rank */
    int empty;    /* percent of ranks with T = 0 */
} gen;

static const gen GEN_PLAIN = { 10, 0, -1, 15 };

static int local_experts(const symm_ref_config *c) { return c->experts / c->world; }
static size_t dsize(symm_dtype d) { return (size_t)symm_dtype_size(d); }
static size_t x_row_bytes(const symm_ref_config *c) { return (size_t)c->hidden * dsize(c->dtype); }
static int scale_blocks(const symm_ref_config *c) { return c->hidden / SYMM_FP8_BLOCK; }

/* A small nonzero value, exact in bf16 even after a sum of 8 of them:
 * +-0.5 .. +-8 in steps of 0.5. */
static float small_value(void)
{
    float v = (float)(1 + rnd(16)) * 0.5f;
    return chance(50) ? -v : v;
}

/* A float in [-4, 4) with 24 random mantissa bits (never 0 in practice). */
static float rough_value(void)
{
    return (float)(rnd64() >> 40) * (8.0f / 16777216.0f) - 4.0f;
}

static void store_value(symm_dtype d, void *base, size_t i, float v)
{
    uint16_t h;
    switch (d) {
    case SYMM_DTYPE_BF16: h = symm_f32_to_bf16(v); memcpy((uint16_t *)base + i, &h, 2); break;
    case SYMM_DTYPE_FP16: h = symm_f32_to_f16(v); memcpy((uint16_t *)base + i, &h, 2); break;
    case SYMM_DTYPE_FP32: memcpy((float *)base + i, &v, 4); break;
    case SYMM_DTYPE_FP8_E4M3: ((uint8_t *)base)[i] = (uint8_t)rnd(256); break;
    }
}

static float load_value(symm_dtype d, const void *base, size_t i)
{
    uint16_t h;
    float f;
    switch (d) {
    case SYMM_DTYPE_BF16: memcpy(&h, (const uint16_t *)base + i, 2); return symm_bf16_to_f32(h);
    case SYMM_DTYPE_FP16: memcpy(&h, (const uint16_t *)base + i, 2); return symm_f16_to_f32(h);
    case SYMM_DTYPE_FP32: memcpy(&f, (const float *)base + i, 4); return f;
    case SYMM_DTYPE_FP8_E4M3: return symm_e4m3_to_f32(((const uint8_t *)base)[i]);
    }
    return NAN;
}

static int make_invalid(int32_t *row, int k, int experts)
{
    int earlier = -1;
    for (int i = 0; i < k; i++)
        if (row[i] >= 0 && row[i] < experts)
            earlier = i;
    switch (rnd(4)) {
    case 0: return experts + rnd(1000);
    case 1: return -2 - rnd(1000);
    case 2: return chance(50) ? INT32_MAX : INT32_MIN;
    default: return earlier >= 0 ? row[earlier] : experts;
    }
}

static void gen_row(const symm_ref_config *c, const gen *g, int32_t *row)
{
    int lo = 0, n = c->experts;
    if (g->to_rank >= 0) {
        lo = g->to_rank * local_experts(c);
        n = local_experts(c);
    }
    int pool[1024];
    for (int i = 0; i < n; i++)
        pool[i] = lo + i;
    for (int k = 0; k < c->topk; k++) {
        if (k < n) {
            int j = k + rnd(n - k), tmp = pool[k];
            pool[k] = pool[j];
            pool[j] = tmp;
        }
        row[k] = k < n ? pool[k] : -1;
    }
    for (int k = 0; k < c->topk; k++) {
        if (chance(g->masked))
            row[k] = -1;
        else if (chance(g->invalid))
            row[k] = make_invalid(row, k, c->experts);
    }
}

/* Rank s's payload (x, scales) and weights for T tokens, random; top-k
 * rows allocated but not filled. T = 0 leaves every pointer NULL. */
static void token_inputs(tworld *w, int s, int T, int small)
{
    const symm_ref_config *c = &w->cfg;
    size_t elems = (size_t)T * (size_t)c->hidden;
    w->in[s] = (symm_ref_input){ T, NULL, NULL, NULL, NULL };
    if (T == 0)
        return;
    w->x[s] = malloc(elems * dsize(c->dtype));
    for (size_t i = 0; i < elems; i++)
        store_value(c->dtype, w->x[s], i, small ? small_value() : rough_value());
    if (c->dtype == SYMM_DTYPE_FP8_E4M3) {
        w->scales[s] = malloc((size_t)T * (size_t)scale_blocks(c) * sizeof(float));
        for (int i = 0; i < T * scale_blocks(c); i++)
            w->scales[s][i] = rough_value();
    }
    w->idx[s] = malloc((size_t)T * (size_t)c->topk * sizeof(int32_t));
    w->tw[s] = malloc((size_t)T * (size_t)c->topk * sizeof(float));
    for (int i = 0; i < T * c->topk; i++)
        w->tw[s][i] = small ? small_value() * 0.25f : rough_value() * 0.5f;
    w->in[s] = (symm_ref_input){ T, w->x[s], w->scales[s], w->idx[s], w->tw[s] };
}

static void world_inputs(tworld *w, const gen *g, int small)
{
    const symm_ref_config *c = &w->cfg;
    for (int s = 0; s < c->world; s++) {
        token_inputs(w, s, chance(g->empty) ? 0 : rnd(c->max_tokens + 1), small);
        for (int t = 0; t < w->in[s].tokens; t++)
            gen_row(c, g, w->idx[s] + (size_t)t * c->topk);
    }
}

/* A world for cfg with inputs drawn by g and receive buffers allocated. */
static void world_make(tworld *w, const symm_ref_config *cfg, const gen *g, int small)
{
    memset(w, 0, sizeof *w);
    w->cfg = *cfg;
    cr_assert(cfg->world <= MAXW);
    symm_status st = symm_ref_check_config(cfg);
    CHECK(st == SYMM_OK, "config rejected: %s", symm_last_error());
    world_inputs(w, g, small);
    for (int p = 0; p < cfg->world; p++) {
        st = symm_ref_recv_alloc(cfg, &w->recv[p]);
        CHECK(st == SYMM_OK, "symm_ref_recv_alloc: %s", symm_last_error());
    }
}

/* The dispatch inputs of every rank, freed and cleared. */
static void world_free_inputs(tworld *w)
{
    for (int p = 0; p < w->cfg.world; p++) {
        free(w->x[p]);
        free(w->scales[p]);
        free(w->idx[p]);
        free(w->tw[p]);
        w->x[p] = NULL;
        w->scales[p] = NULL;
        w->idx[p] = NULL;
        w->tw[p] = NULL;
    }
}

static void world_free(tworld *w)
{
    for (int p = 0; p < w->cfg.world; p++)
        symm_ref_recv_free(&w->recv[p]);
    world_free_inputs(w);
}

static symm_ref_config random_config(void)
{
    static const int worlds[] = { 2, 3, 4, 8 };
    static const int aligns[] = { 1, 1, 2, 3, 8, 64 };
    symm_ref_config c = { 0 };
    c.world = worlds[rnd(4)];
    c.experts = c.world * (1 + rnd(4));
    int max_k = c.experts < SYMM_REF_MAX_TOPK ? c.experts : SYMM_REF_MAX_TOPK;
    c.topk = 1 + rnd(chance(20) ? max_k : (max_k < 6 ? max_k : 6));
    c.dtype = (symm_dtype)rnd(4);
    c.combine_dtype = (symm_dtype)rnd(3);
    c.hidden = c.dtype == SYMM_DTYPE_FP8_E4M3 ? 128 : 16 * (1 + rnd(2));
    c.max_tokens = 1 + rnd(12);
    c.layout = (symm_layout)rnd(2);
    c.weights = rnd(2);
    c.align = c.layout == SYMM_LAYOUT_EXPERT ? aligns[rnd(6)] : 1;
    c.combine_order = c.layout == SYMM_LAYOUT_EXPERT && chance(50) ? SYMM_COMBINE_ORDER_K
                                                                   : SYMM_COMBINE_ORDER_RANK;
    return c;
}

static symm_status world_dispatch(tworld *w)
{
    return symm_ref_dispatch(&w->cfg, w->in, w->recv, w->stats);
}

/* ---- what the contract says, computed straight from the inputs ------------ */

static int entry_valid(const int32_t *row, int k, int experts)
{
    if (row[k] < 0 || row[k] >= experts)
        return 0;
    for (int i = 0; i < k; i++)
        if (row[i] == row[k])
            return 0;
    return 1;
}

static const int32_t *token_row(const tworld *w, int s, int t)
{
    return w->idx[s] + (size_t)t * w->cfg.topk;
}

static int goes_to(const tworld *w, int s, int t, int p)
{
    const int32_t *row = token_row(w, s, t);
    for (int k = 0; k < w->cfg.topk; k++)
        if (entry_valid(row, k, w->cfg.experts) && row[k] / local_experts(&w->cfg) == p)
            return 1;
    return 0;
}

static int64_t invalid_of(const tworld *w, int s)
{
    int64_t n = 0;
    for (int t = 0; t < w->in[s].tokens; t++)
        for (int k = 0; k < w->cfg.topk; k++)
            n += token_row(w, s, t)[k] != -1 && !entry_valid(token_row(w, s, t), k, w->cfg.experts);
    return n;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The payload of row `row` on p is token t of s, bit for bit. */
static void check_payload(const tworld *w, int p, int64_t row, int s, int t)
{
    const symm_ref_config *c = &w->cfg;
    size_t rb = x_row_bytes(c);
    CHECK(!memcmp((const char *)w->recv[p].x + (size_t)row * rb, (const char *)w->x[s] + (size_t)t * rb, rb),
          "rank %d row %lld: x differs from token %d of rank %d", p, (long long)row, t, s);
    if (c->dtype != SYMM_DTYPE_FP8_E4M3)
        return;
    size_t nb = (size_t)scale_blocks(c);
    CHECK(!memcmp(w->recv[p].scales + (size_t)row * nb, w->scales[s] + (size_t)t * nb, nb * sizeof(float)),
          "rank %d row %lld: scales differ from token %d of rank %d", p, (long long)row, t, s);
}

static void check_src(const tworld *w, int p, int64_t row, int s, int t, int k)
{
    const int32_t *src = w->recv[p].src + (size_t)row * 4;
    CHECK(src[0] == s && src[1] == t && src[2] == k && src[3] == 0,
          "rank %d row %lld: src {%d,%d,%d,%d}, expected {%d,%d,%d,0}", p, (long long)row, src[0],
          src[1], src[2], src[3], s, t, k);
}

/* Rows [from, to) of rank p still hold the poison in every array. */
static void check_unwritten(const tworld *w, int p, int64_t from, int64_t to, const char *why)
{
    const symm_ref_config *c = &w->cfg;
    const symm_ref_recv *r = &w->recv[p];
    if (from >= to)
        return;
    size_t n = (size_t)(to - from);
    int topk_cols = c->layout == SYMM_LAYOUT_RANK ? c->topk : 1;
    CHECK(all_poison((const char *)r->x + (size_t)from * x_row_bytes(c), n * x_row_bytes(c)),
          "rank %d: x rows %lld..%lld (%s) were written", p, (long long)from, (long long)to - 1, why);
    CHECK(all_poison(r->src + (size_t)from * 4, n * 16), "rank %d: src rows %lld..%lld (%s) were written",
          p, (long long)from, (long long)to - 1, why);
    if (r->topk_idx)
        CHECK(all_poison(r->topk_idx + (size_t)from * c->topk, n * (size_t)c->topk * 4),
              "rank %d: topk rows %lld.. (%s) were written", p, (long long)from, why);
    if (r->weights)
        CHECK(all_poison(r->weights + (size_t)from * topk_cols, n * (size_t)topk_cols * 4),
              "rank %d: weight rows %lld.. (%s) were written", p, (long long)from, why);
    if (r->scales)
        CHECK(all_poison(r->scales + (size_t)from * scale_blocks(c), n * (size_t)scale_blocks(c) * 4),
              "rank %d: scale rows %lld.. (%s) were written", p, (long long)from, why);
}

static void check_rank_row(const tworld *w, int p, int64_t row, int s, int t, int32_t *count)
{
    const symm_ref_config *c = &w->cfg;
    const symm_ref_recv *r = &w->recv[p];
    const int32_t *ids = token_row(w, s, t);
    int L = local_experts(c);
    check_src(w, p, row, s, t, -1);
    check_payload(w, p, row, s, t);
    for (int k = 0; k < c->topk; k++) {
        int want = entry_valid(ids, k, c->experts) && ids[k] / L == p ? ids[k] - p * L : -1;
        int32_t got = r->topk_idx[(size_t)row * c->topk + k];
        CHECK(got == want, "rank %d row %lld k %d: topk %d, expected %d (global id %d)", p,
              (long long)row, k, got, want, ids[k]);
        if (want >= 0)
            count[want]++;
        if (!c->weights)
            continue;
        float wt = r->weights[(size_t)row * c->topk + k];
        float expect = want >= 0 ? w->tw[s][(size_t)t * c->topk + k] : 0.0f;
        CHECK(f32_bits(wt) == f32_bits(expect), "rank %d row %lld k %d: weight %a, expected %a", p,
              (long long)row, k, wt, expect);
    }
}

/* Everything layout rank promises, rank by rank, from a scan over every
 * token for each destination. */
static void check_rank_layout(const tworld *w)
{
    const symm_ref_config *c = &w->cfg;
    int64_t cap = symm_ref_capacity(c), sent_dropped[MAXW] = { 0 };
    for (int p = 0; p < c->world; p++) {
        const symm_ref_recv *r = &w->recv[p];
        int32_t count[64] = { 0 };
        int64_t n = 0;
        for (int s = 0; s < c->world; s++)
            for (int t = 0; t < w->in[s].tokens; t++) {
                if (!goes_to(w, s, t, p))
                    continue;
                int64_t row = n++;
                if (row >= cap)
                    sent_dropped[s]++;
                else
                    check_rank_row(w, p, row, s, t, count);
            }
        CHECK(r->rows == min64(n, cap), "rank %d: rows %lld, expected %lld (capacity %lld)", p,
              (long long)r->rows, (long long)min64(n, cap), (long long)cap);
        CHECK(r->dropped == (n > cap ? n - cap : 0), "rank %d: dropped %lld, expected %lld", p,
              (long long)r->dropped, (long long)(n > cap ? n - cap : 0));
        for (int j = 0; j < local_experts(c); j++) {
            CHECK(r->expert_count[j] == count[j], "rank %d: expert_count[%d] %d, expected %d", p, j,
                  r->expert_count[j], count[j]);
            CHECK(r->expert_offset[j] == 0, "rank %d: expert_offset[%d] %d, expected 0", p, j,
                  r->expert_offset[j]);
        }
        check_unwritten(w, p, r->rows, cap, "past rows");
    }
    for (int s = 0; s < c->world; s++) {
        CHECK(w->stats[s].dropped == sent_dropped[s], "rank %d: stats.dropped %lld, expected %lld", s,
              (long long)w->stats[s].dropped, (long long)sent_dropped[s]);
        CHECK(w->stats[s].invalid == invalid_of(w, s), "rank %d: stats.invalid %lld, expected %lld", s,
              (long long)w->stats[s].invalid, (long long)invalid_of(w, s));
    }
}

/* Segment of expert e: its rows in (s, t) order; returns how many. */
static int64_t check_segment(const tworld *w, int p, int e, int64_t off, int64_t *sent_dropped)
{
    const symm_ref_config *c = &w->cfg;
    int64_t cap = symm_ref_capacity(c), i = 0;
    for (int s = 0; s < c->world; s++)
        for (int t = 0; t < w->in[s].tokens; t++)
            for (int k = 0; k < c->topk; k++) {
                if (!entry_valid(token_row(w, s, t), k, c->experts) || token_row(w, s, t)[k] != e)
                    continue;
                int64_t row = off + i++;
                if (row >= cap) {
                    sent_dropped[s]++;
                    continue;
                }
                check_src(w, p, row, s, t, k);
                check_payload(w, p, row, s, t);
                if (!c->weights)
                    continue;
                float got = w->recv[p].weights[row], want = w->tw[s][(size_t)t * c->topk + k];
                CHECK(f32_bits(got) == f32_bits(want), "rank %d row %lld: weight %a, expected %a", p,
                      (long long)row, got, want);
            }
    return i;
}

/* Everything layout expert promises, expert by expert. */
static void check_expert_layout(const tworld *w)
{
    const symm_ref_config *c = &w->cfg;
    int64_t cap = symm_ref_capacity(c), sent_dropped[MAXW] = { 0 };
    int L = local_experts(c);
    for (int p = 0; p < c->world; p++) {
        const symm_ref_recv *r = &w->recv[p];
        int64_t off = 0, kept = 0, total = 0;
        for (int j = 0; j < L; j++) {
            int64_t n = check_segment(w, p, p * L + j, off, sent_dropped);
            total += n;
            int64_t fit = min64(n, cap - off < 0 ? 0 : cap - off);
            kept += fit;
            CHECK(r->expert_offset[j] == min64(off, cap), "rank %d: expert_offset[%d] %d, expected %lld",
                  p, j, r->expert_offset[j], (long long)min64(off, cap));
            CHECK(r->expert_count[j] == fit, "rank %d: expert_count[%d] %d, expected %lld", p, j,
                  r->expert_count[j], (long long)fit);
            int64_t end = off + n;
            off = j + 1 < L ? (end + c->align - 1) / c->align * c->align : end;
            check_unwritten(w, p, min64(end, cap), min64(off, cap), "padding");
        }
        CHECK(r->rows == min64(off, cap), "rank %d: rows %lld, expected %lld", p, (long long)r->rows,
              (long long)min64(off, cap));
        CHECK(r->dropped == total - kept, "rank %d: dropped %lld, expected %lld", p,
              (long long)r->dropped, (long long)(total - kept));
        check_unwritten(w, p, r->rows, cap, "past rows");
    }
    for (int s = 0; s < c->world; s++) {
        CHECK(w->stats[s].dropped == sent_dropped[s], "rank %d: stats.dropped %lld, expected %lld", s,
              (long long)w->stats[s].dropped, (long long)sent_dropped[s]);
        CHECK(w->stats[s].invalid == invalid_of(w, s), "rank %d: stats.invalid %lld, expected %lld", s,
              (long long)w->stats[s].invalid, (long long)invalid_of(w, s));
    }
}

static int64_t src_key(const tworld *w, const int32_t *src)
{
    return (int64_t)src[0] * (w->cfg.max_tokens + 1) + src[1];
}

/* Rows ordered by (source rank, source token): the whole rank (layout rank)
 * or each segment, whose offsets are aligned and do not overlap (layout
 * expert); a segment holds only rows choosing its expert. */
static void check_order(const tworld *w)
{
    const symm_ref_config *c = &w->cfg;
    int64_t cap = symm_ref_capacity(c);
    int L = local_experts(c);
    for (int p = 0; p < c->world; p++) {
        const symm_ref_recv *r = &w->recv[p];
        if (c->layout == SYMM_LAYOUT_RANK) {
            for (int64_t i = 1; i < r->rows; i++)
                CHECK(src_key(w, r->src + i * 4) > src_key(w, r->src + (i - 1) * 4),
                      "rank %d: row %lld is not after row %lld in (rank, token) order", p, (long long)i,
                      (long long)i - 1);
            continue;
        }
        int64_t prev_end = 0;
        for (int j = 0; j < L; j++) {
            int64_t off = r->expert_offset[j], n = r->expert_count[j];
            CHECK(off % c->align == 0 || off == cap, "rank %d: expert_offset[%d] %lld not a multiple of %d",
                  p, j, (long long)off, c->align);
            CHECK(off >= prev_end, "rank %d: segment %d at %lld overlaps the previous one ending at %lld",
                  p, j, (long long)off, (long long)prev_end);
            prev_end = off + n;
            for (int64_t i = off; i < off + n; i++) {
                const int32_t *src = r->src + i * 4;
                CHECK(token_row(w, src[0], src[1])[src[2]] == p * L + j,
                      "rank %d row %lld: in segment %d but chose expert %d", p, (long long)i, j,
                      token_row(w, src[0], src[1])[src[2]]);
                if (i > off)
                    CHECK(src_key(w, src) > src_key(w, src - 4),
                          "rank %d: segment %d row %lld out of (rank, token) order", p, j, (long long)i);
            }
        }
        CHECK(r->rows == prev_end, "rank %d: rows %lld, last segment ends at %lld", p, (long long)r->rows,
              (long long)prev_end);
    }
}

/* Each valid (token, destination rank) (layout rank) or (token, k) (layout
 * expert) is received exactly once, and nothing else is: read from the rows'
 * src alone. Only meaningful when nothing was dropped. */
static void check_each_copy_once(const tworld *w)
{
    const symm_ref_config *c = &w->cfg;
    int L = local_experts(c), slots = c->layout == SYMM_LAYOUT_RANK ? c->world : c->topk;
    int *seen = calloc((size_t)c->world * (c->max_tokens + 1) * slots, sizeof *seen);
    for (int p = 0; p < c->world; p++) {
        const symm_ref_recv *r = &w->recv[p];
        for (int j = 0; j < (c->layout == SYMM_LAYOUT_RANK ? 1 : L); j++) {
            int64_t from = c->layout == SYMM_LAYOUT_RANK ? 0 : r->expert_offset[j];
            int64_t to = c->layout == SYMM_LAYOUT_RANK ? r->rows : from + r->expert_count[j];
            for (int64_t i = from; i < to; i++) {
                const int32_t *src = r->src + i * 4;
                CHECK(src[0] >= 0 && src[0] < c->world && src[1] >= 0 && src[1] < w->in[src[0]].tokens,
                      "rank %d row %lld: src {%d,%d} is no token", p, (long long)i, src[0], src[1]);
                int slot = c->layout == SYMM_LAYOUT_RANK ? p : src[2];
                if (c->layout == SYMM_LAYOUT_EXPERT)
                    CHECK(token_row(w, src[0], src[1])[slot] / L == p,
                          "rank %d row %lld: expert of src k %d lives elsewhere", p, (long long)i, slot);
                seen[((size_t)src[0] * (c->max_tokens + 1) + src[1]) * slots + slot]++;
            }
        }
    }
    for (int s = 0; s < c->world; s++)
        for (int t = 0; t < w->in[s].tokens; t++)
            for (int slot = 0; slot < slots; slot++) {
                int want = c->layout == SYMM_LAYOUT_RANK ? goes_to(w, s, t, slot)
                                                         : entry_valid(token_row(w, s, t), slot, c->experts);
                int got = seen[((size_t)s * (c->max_tokens + 1) + t) * slots + slot];
                CHECK(got == want, "token %d of rank %d, %s %d: received %d times, expected %d", t, s,
                      c->layout == SYMM_LAYOUT_RANK ? "rank" : "k", slot, got, want);
            }
    free(seen);
}

static int any_dropped(const tworld *w)
{
    for (int s = 0; s < w->cfg.world; s++)
        if (w->stats[s].dropped)
            return 1;
    return 0;
}

static int any_invalid(const tworld *w)
{
    for (int s = 0; s < w->cfg.world; s++)
        if (w->stats[s].invalid)
            return 1;
    return 0;
}

/* Dispatch w and check everything dispatch promises. */
static void dispatch_and_check(tworld *w)
{
    symm_status st = world_dispatch(w);
    if (w->cfg.layout == SYMM_LAYOUT_RANK)
        check_rank_layout(w);
    else
        check_expert_layout(w);
    symm_status want = any_dropped(w) || any_invalid(w) ? SYMM_ERR_OVERFLOW : SYMM_OK;
    CHECK(st == want, "dispatch returned %s, expected %s: %s", symm_status_name(st),
          symm_status_name(want), symm_last_error());
    check_order(w);
    if (!any_dropped(w))
        check_each_copy_once(w);
}

/* ---- combine --------------------------------------------------------------- */

typedef struct tcombine {
    void *y[MAXW];
    void *out[MAXW];
    void *want[MAXW];
} tcombine;

static int row_written(const tworld *w, int p, int64_t row)
{
    return !all_poison(w->recv[p].src + (size_t)row * 4, 16);
}

/* y: random values in combine_dtype on the rows dispatch wrote, NaN on every
 * other row (padding, past rows), so that reading one shows in the output. */
static void random_y(const tworld *w, tcombine *cb)
{
    const symm_ref_config *c = &w->cfg;
    int64_t cap = symm_ref_capacity(c);
    for (int p = 0; p < c->world; p++) {
        cb->y[p] = malloc((size_t)cap * c->hidden * dsize(c->combine_dtype));
        for (int64_t r = 0; r < cap; r++) {
            int live = row_written(w, p, r);
            for (int h = 0; h < c->hidden; h++)
                store_value(c->combine_dtype, cb->y[p], (size_t)r * c->hidden + h,
                            live ? rough_value() : NAN);
        }
    }
}

/* Run combine into poisoned outputs. */
static symm_status run_combine(const tworld *w, tcombine *cb)
{
    const symm_ref_config *c = &w->cfg;
    for (int s = 0; s < c->world; s++) {
        size_t n = (size_t)w->in[s].tokens * c->hidden * dsize(c->combine_dtype);
        cb->out[s] = n ? malloc(n) : NULL;
        cb->want[s] = n ? malloc(n) : NULL;
        if (n)
            memset(cb->out[s], SYMM_REF_POISON, n);
    }
    return symm_ref_combine(c, w->in, w->recv, (const void *const *)cb->y, cb->out);
}

static void combine_free(const tworld *w, tcombine *cb)
{
    for (int p = 0; p < w->cfg.world; p++) {
        free(cb->y[p]);
        free(cb->out[p]);
        free(cb->want[p]);
    }
}

/* What combine must give, found through the rows' src alone: per token, the
 * rows that hold it, in rank order (layout rank), k order (layout expert,
 * combine_order k), or per rank ascending a partial sum over its rows in k
 * order, rounded to the combine dtype (layout expert, combine_order rank). */
static void expected_combine(const tworld *w, tcombine *cb)
{
    const symm_ref_config *c = &w->cfg;
    int H = c->hidden, K = c->topk, slots = c->layout == SYMM_LAYOUT_RANK ? c->world : K;
    size_t nmap = (size_t)c->world * (c->max_tokens + 1) * slots;
    int64_t *row_of = malloc(nmap * sizeof *row_of);
    int *rank_of = malloc(nmap * sizeof *rank_of);
    for (size_t i = 0; i < nmap; i++)
        row_of[i] = -1;
    for (int p = 0; p < c->world; p++)
        for (int64_t r = 0; r < w->recv[p].rows; r++) {
            if (!row_written(w, p, r))
                continue;
            const int32_t *src = w->recv[p].src + r * 4;
            size_t i = ((size_t)src[0] * (c->max_tokens + 1) + src[1]) * slots +
                       (c->layout == SYMM_LAYOUT_RANK ? p : src[2]);
            row_of[i] = r;
            rank_of[i] = p;
        }
    float *acc = malloc((size_t)H * sizeof *acc);
    float *part = malloc((size_t)H * sizeof *part);
    const bool by_rank = c->layout == SYMM_LAYOUT_EXPERT && c->combine_order == SYMM_COMBINE_ORDER_RANK;
    for (int s = 0; s < c->world; s++)
        for (int t = 0; t < w->in[s].tokens; t++) {
            for (int h = 0; h < H; h++)
                acc[h] = 0.0f;
            for (int p = 0; by_rank && p < c->world; p++) {
                bool any = false;
                for (int h = 0; h < H; h++)
                    part[h] = 0.0f;
                for (int slot = 0; slot < slots; slot++) {
                    size_t i = ((size_t)s * (c->max_tokens + 1) + t) * slots + slot;
                    if (row_of[i] < 0 || rank_of[i] != p)
                        continue;
                    any = true;
                    float wt = c->weights ? w->tw[s][(size_t)t * K + slot] : 1.0f;
                    for (int h = 0; h < H; h++)
                        part[h] = fmaf(wt, load_value(c->combine_dtype, cb->y[p], (size_t)row_of[i] * H + h),
                                       part[h]);
                }
                /* The partial sum travels in the combine dtype. */
                for (int h = 0; any && h < H; h++) {
                    store_value(c->combine_dtype, cb->want[s], (size_t)t * H + h, part[h]);
                    acc[h] = acc[h] + load_value(c->combine_dtype, cb->want[s], (size_t)t * H + h);
                }
            }
            for (int slot = 0; !by_rank && slot < slots; slot++) {
                size_t i = ((size_t)s * (c->max_tokens + 1) + t) * slots + slot;
                if (row_of[i] < 0)
                    continue;
                const void *y = cb->y[rank_of[i]];
                float wt = c->layout == SYMM_LAYOUT_EXPERT && c->weights ? w->tw[s][(size_t)t * K + slot] : 1.0f;
                for (int h = 0; h < H; h++) {
                    float v = load_value(c->combine_dtype, y, (size_t)row_of[i] * H + h);
                    acc[h] = c->layout == SYMM_LAYOUT_RANK ? acc[h] + v : fmaf(wt, v, acc[h]);
                }
            }
            for (int h = 0; h < H; h++)
                store_value(c->combine_dtype, cb->want[s], (size_t)t * H + h, acc[h]);
        }
    free(acc);
    free(part);
    free(row_of);
    free(rank_of);
}

static void check_outputs(const tworld *w, const tcombine *cb, const char *what)
{
    const symm_ref_config *c = &w->cfg;
    size_t es = dsize(c->combine_dtype);
    for (int s = 0; s < c->world; s++)
        for (int t = 0; t < w->in[s].tokens; t++)
            for (int h = 0; h < c->hidden; h++) {
                size_t i = (size_t)t * c->hidden + h;
                CHECK(!memcmp((char *)cb->out[s] + i * es, (char *)cb->want[s] + i * es, es),
                      "%s: rank %d token %d element %d: got %a, expected %a", what, s, t, h,
                      load_value(c->combine_dtype, cb->out[s], i),
                      load_value(c->combine_dtype, cb->want[s], i));
            }
}

/* Combine random y over w (already dispatched) and compare bit for bit. */
static void combine_and_check(const tworld *w)
{
    tcombine cb = { 0 };
    random_y(w, &cb);
    symm_status st = run_combine(w, &cb);
    CHECK(st == SYMM_OK, "combine: %s", symm_last_error());
    expected_combine(w, &cb);
    check_outputs(w, &cb, "combine");
    combine_free(w, &cb);
}

/* ---- hand-worked worlds ------------------------------------------------------ */

/* A world whose top-k rows are given literally (payload and weights random). */
static void world_from_rows(tworld *w, const symm_ref_config *cfg, const int *tokens,
                            const int32_t *const *rows)
{
    memset(w, 0, sizeof *w);
    w->cfg = *cfg;
    CHECK(symm_ref_check_config(cfg) == SYMM_OK, "config rejected: %s", symm_last_error());
    for (int s = 0; s < cfg->world; s++) {
        token_inputs(w, s, tokens[s], 1);
        if (tokens[s])
            memcpy(w->idx[s], rows[s], (size_t)tokens[s] * cfg->topk * sizeof(int32_t));
        CHECK(symm_ref_recv_alloc(cfg, &w->recv[s]) == SYMM_OK, "alloc: %s", symm_last_error());
    }
}

/* Receive buffers whose arrays have `guard` poisoned rows past the capacity,
 * so that a write past it shows. */
static void guarded_recvs(tworld *w, int64_t guard)
{
    symm_ref_config big = w->cfg;
    big.capacity = symm_ref_capacity(&w->cfg) + guard;
    for (int p = 0; p < w->cfg.world; p++) {
        symm_ref_recv_free(&w->recv[p]);
        CHECK(symm_ref_recv_alloc(&big, &w->recv[p]) == SYMM_OK, "alloc: %s", symm_last_error());
        w->recv[p].capacity = symm_ref_capacity(&w->cfg);
    }
}

/* W = 2, E = 4 (L = 2), K = 2, max_tokens 3.
 *   rank 0: t0 {1, 2} -> ranks 0, 1   t1 {3, -1} -> rank 1   t2 {0, 1} -> rank 0
 *   rank 1: t0 {2, 0} -> ranks 1, 0   t1 {-1, -1} -> nowhere */
static const int32_t HAND_ROWS0[] = { 1, 2, 3, -1, 0, 1 };
static const int32_t HAND_ROWS1[] = { 2, 0, -1, -1 };
static const int32_t *const HAND_ROWS[] = { HAND_ROWS0, HAND_ROWS1 };
static const int HAND_TOKENS[] = { 3, 2 };

static symm_ref_config hand_config(symm_layout layout, symm_dtype dtype, int hidden, int align,
                                   int64_t capacity)
{
    return (symm_ref_config){ .hidden = hidden, .topk = 2, .experts = 4, .world = 2, .max_tokens = 3,
                              .dtype = dtype, .combine_dtype = dtype, .layout = layout, .weights = 1,
                              .capacity = capacity, .align = align, .combine_order = SYMM_COMBINE_ORDER_RANK };
}

/* One expected row of layout rank: wk[k] is the k of the source weight
 * carried in column k, -1 for 0.0f. */
typedef struct rank_row {
    int p, row, s, t;
    int32_t topk[2];
    int wk[2];
} rank_row;

static void check_rank_rows(const tworld *w, const rank_row *want, int n)
{
    for (int i = 0; i < n; i++) {
        const rank_row *e = &want[i];
        const symm_ref_recv *r = &w->recv[e->p];
        check_src(w, e->p, e->row, e->s, e->t, -1);
        check_payload(w, e->p, e->row, e->s, e->t);
        for (int k = 0; k < 2; k++) {
            CHECK(r->topk_idx[e->row * 2 + k] == e->topk[k], "rank %d row %d k %d: topk %d, expected %d",
                  e->p, e->row, k, r->topk_idx[e->row * 2 + k], e->topk[k]);
            float want_w = e->wk[k] < 0 ? 0.0f : w->tw[e->s][e->t * 2 + e->wk[k]];
            CHECK(f32_bits(r->weights[e->row * 2 + k]) == f32_bits(want_w),
                  "rank %d row %d k %d: weight %a, expected %a", e->p, e->row, k, r->weights[e->row * 2 + k],
                  want_w);
        }
    }
}

static void check_counts(const tworld *w, const int64_t *rows, const int32_t (*count)[2],
                         const int32_t (*offset)[2], const int64_t *dropped)
{
    for (int p = 0; p < 2; p++) {
        const symm_ref_recv *r = &w->recv[p];
        CHECK(r->rows == rows[p], "rank %d: rows %lld, expected %lld", p, (long long)r->rows, (long long)rows[p]);
        CHECK(r->dropped == dropped[p], "rank %d: dropped %lld, expected %lld", p, (long long)r->dropped,
              (long long)dropped[p]);
        for (int j = 0; j < 2; j++) {
            CHECK(r->expert_count[j] == count[p][j], "rank %d: expert_count[%d] %d, expected %d", p, j,
                  r->expert_count[j], count[p][j]);
            CHECK(r->expert_offset[j] == offset[p][j], "rank %d: expert_offset[%d] %d, expected %d", p, j,
                  r->expert_offset[j], offset[p][j]);
        }
    }
}

Test(dispatch, rank_layout_hand_worked_world)
{
    tworld w;
    symm_ref_config cfg = hand_config(SYMM_LAYOUT_RANK, SYMM_DTYPE_FP32, 8, 1, 0);
    world_from_rows(&w, &cfg, HAND_TOKENS, HAND_ROWS);
    symm_status st = world_dispatch(&w);
    CHECK(st == SYMM_OK, "dispatch: %s", symm_last_error());
    static const rank_row want[] = {
        { 0, 0, 0, 0, { 1, -1 }, { 0, -1 } }, { 0, 1, 0, 2, { 0, 1 }, { 0, 1 } },
        { 0, 2, 1, 0, { -1, 0 }, { -1, 1 } }, { 1, 0, 0, 0, { -1, 0 }, { -1, 1 } },
        { 1, 1, 0, 1, { 1, -1 }, { 0, -1 } }, { 1, 2, 1, 0, { 0, -1 }, { 0, -1 } },
    };
    check_rank_rows(&w, want, 6);
    static const int64_t rows[] = { 3, 3 }, dropped[] = { 0, 0 };
    static const int32_t count[2][2] = { { 2, 2 }, { 2, 1 } }, offset[2][2] = { { 0, 0 }, { 0, 0 } };
    check_counts(&w, rows, count, offset, dropped);
    for (int p = 0; p < 2; p++)
        check_unwritten(&w, p, 3, 6, "past rows");
    CHECK(w.stats[0].invalid == 0 && w.stats[1].invalid == 0 && w.stats[0].dropped == 0 &&
              w.stats[1].dropped == 0, "stats not all zero");
    world_free(&w);
}

/* y_p = (p + 1) * recv_x: out = sum over p in D(t) of (p + 1) * x. */
static void check_rank_hand_combine(const tworld *w, const float (*mult)[3])
{
    tcombine cb = { 0 };
    int64_t cap = symm_ref_capacity(&w->cfg);
    for (int p = 0; p < 2; p++) {
        cb.y[p] = malloc((size_t)cap * 8 * sizeof(float));
        for (int64_t i = 0; i < w->recv[p].rows * 8; i++)
            ((float *)cb.y[p])[i] = ((const float *)w->recv[p].x)[i] * (float)(p + 1);
    }
    CHECK(run_combine(w, &cb) == SYMM_OK, "combine: %s", symm_last_error());
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < HAND_TOKENS[s]; t++)
            for (int h = 0; h < 8; h++) {
                float got = ((float *)cb.out[s])[t * 8 + h];
                float want = mult[s][t] == 0.0f ? 0.0f : mult[s][t] * ((float *)w->x[s])[t * 8 + h];
                CHECK(f32_bits(got) == f32_bits(want), "token %d of rank %d [%d]: %a, expected %a (x %g)",
                      t, s, h, got, want, mult[s][t]);
            }
    combine_free(w, &cb);
}

Test(combine, rank_layout_hand_worked_sums_in_rank_order)
{
    tworld w;
    symm_ref_config cfg = hand_config(SYMM_LAYOUT_RANK, SYMM_DTYPE_FP32, 8, 1, 0);
    world_from_rows(&w, &cfg, HAND_TOKENS, HAND_ROWS);
    CHECK(world_dispatch(&w) == SYMM_OK, "dispatch: %s", symm_last_error());
    static const float mult[2][3] = { { 3, 2, 1 }, { 3, 0, 0 } };
    check_rank_hand_combine(&w, mult);
    world_free(&w);
}

Test(dispatch, rank_layout_capacity_drops_the_last_rows)
{
    tworld w;
    symm_ref_config cfg = hand_config(SYMM_LAYOUT_RANK, SYMM_DTYPE_FP32, 8, 1, 2);
    world_from_rows(&w, &cfg, HAND_TOKENS, HAND_ROWS);
    guarded_recvs(&w, 4);
    symm_status st = world_dispatch(&w);
    CHECK(st == SYMM_ERR_OVERFLOW, "dispatch returned %s, expected SYMM_ERR_OVERFLOW", symm_status_name(st));
    const char *msg = symm_last_error();
    CHECK(strstr(msg, "2 rows dropped") && strstr(msg, "capacity 2") && strstr(msg, "sent by rank 1: 2"),
          "message does not give the counts: %s", msg);
    static const rank_row want[] = {
        { 0, 0, 0, 0, { 1, -1 }, { 0, -1 } }, { 0, 1, 0, 2, { 0, 1 }, { 0, 1 } },
        { 1, 0, 0, 0, { -1, 0 }, { -1, 1 } }, { 1, 1, 0, 1, { 1, -1 }, { 0, -1 } },
    };
    check_rank_rows(&w, want, 4);
    static const int64_t rows[] = { 2, 2 }, dropped[] = { 1, 1 };
    static const int32_t count[2][2] = { { 1, 2 }, { 1, 1 } }, offset[2][2] = { { 0, 0 }, { 0, 0 } };
    check_counts(&w, rows, count, offset, dropped);
    CHECK(w.stats[0].dropped == 0 && w.stats[1].dropped == 2, "stats.dropped %lld %lld, expected 0 2",
          (long long)w.stats[0].dropped, (long long)w.stats[1].dropped);
    for (int p = 0; p < 2; p++)
        check_unwritten(&w, p, 2, 6, "past capacity");
    static const float mult[2][3] = { { 3, 2, 1 }, { 0, 0, 0 } };
    check_rank_hand_combine(&w, mult);
    world_free(&w);
}

typedef struct expert_row {
    int p, row, s, t, k;
} expert_row;

static void check_expert_rows(const tworld *w, const expert_row *want, int n)
{
    for (int i = 0; i < n; i++) {
        const expert_row *e = &want[i];
        check_src(w, e->p, e->row, e->s, e->t, e->k);
        check_payload(w, e->p, e->row, e->s, e->t);
        float got = w->recv[e->p].weights[e->row], wt = w->tw[e->s][e->t * 2 + e->k];
        CHECK(f32_bits(got) == f32_bits(wt), "rank %d row %d: weight %a, expected %a", e->p, e->row, got, wt);
    }
}

/* Layout expert, align 4: segments of experts 0 | 1 on rank 0 and 2 | 3 on
 * rank 1 start at rows 0 and 4. */
static const expert_row HAND_EXPERT_ROWS[] = {
    { 0, 0, 0, 2, 0 }, { 0, 1, 1, 0, 1 }, { 0, 4, 0, 0, 0 }, { 0, 5, 0, 2, 1 },
    { 1, 0, 0, 0, 1 }, { 1, 1, 1, 0, 0 }, { 1, 4, 0, 1, 0 },
};

Test(dispatch, expert_layout_hand_worked_world_align_4)
{
    tworld w;
    symm_ref_config cfg = hand_config(SYMM_LAYOUT_EXPERT, SYMM_DTYPE_BF16, 16, 4, 0);
    CHECK(symm_ref_worst_capacity(&cfg) == 18, "worst capacity %lld, expected 18",
          (long long)symm_ref_worst_capacity(&cfg));
    world_from_rows(&w, &cfg, HAND_TOKENS, HAND_ROWS);
    CHECK(world_dispatch(&w) == SYMM_OK, "dispatch: %s", symm_last_error());
    check_expert_rows(&w, HAND_EXPERT_ROWS, 7);
    static const int64_t rows[] = { 6, 5 }, dropped[] = { 0, 0 };
    static const int32_t count[2][2] = { { 2, 2 }, { 2, 1 } }, offset[2][2] = { { 0, 4 }, { 0, 4 } };
    check_counts(&w, rows, count, offset, dropped);
    for (int p = 0; p < 2; p++)
        check_unwritten(&w, p, 2, 4, "padding");
    check_unwritten(&w, 0, 6, 18, "past rows");
    check_unwritten(&w, 1, 5, 18, "past rows");
    world_free(&w);
}

Test(combine, expert_layout_hand_worked_weighted_sum_in_k_order)
{
    tworld w;
    symm_ref_config cfg = hand_config(SYMM_LAYOUT_EXPERT, SYMM_DTYPE_BF16, 16, 4, 0);
    cfg.combine_order = SYMM_COMBINE_ORDER_K;
    world_from_rows(&w, &cfg, HAND_TOKENS, HAND_ROWS);
    CHECK(world_dispatch(&w) == SYMM_OK, "dispatch: %s", symm_last_error());
    tcombine cb = { 0 };
    for (int p = 0; p < 2; p++)
        cb.y[p] = w.recv[p].x;
    CHECK(run_combine(&w, &cb) == SYMM_OK, "combine: %s", symm_last_error());
    /* The k of each token that contribute, in order. */
    static const int ks[2][3][2] = { { { 0, 1 }, { 0, -1 }, { 0, 1 } }, { { 0, 1 }, { -1, -1 } } };
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < HAND_TOKENS[s]; t++)
            for (int h = 0; h < 16; h++) {
                float x = load_value(SYMM_DTYPE_BF16, w.x[s], t * 16 + h), acc = 0.0f;
                for (int i = 0; i < 2 && ks[s][t][i] >= 0; i++)
                    acc = fmaf(w.tw[s][t * 2 + ks[s][t][i]], x, acc);
                uint16_t got, want = symm_f32_to_bf16(acc);
                memcpy(&got, (uint16_t *)cb.out[s] + t * 16 + h, 2);
                CHECK(got == want, "token %d of rank %d [%d]: 0x%04x, expected 0x%04x", t, s, h, got, want);
            }
    for (int p = 0; p < 2; p++)
        cb.y[p] = NULL;
    combine_free(&w, &cb);
    world_free(&w);
}

/* combine_order rank: each rank's rows of a token are summed there in k
 * order and rounded to bf16, then the ranks' sums in rank order. Rank 0's
 * token 0 has k 0 on rank 0 and k 1 on rank 1 (two roundings before the
 * last); its token 2 has both k on rank 0 (one partial sum); rank 1's token
 * 0 has k 1 on rank 0 and k 0 on rank 1: rank 0's part comes first
 * although its k is larger. */
Test(combine, expert_layout_hand_worked_partial_sums_in_rank_order)
{
    tworld w;
    symm_ref_config cfg = hand_config(SYMM_LAYOUT_EXPERT, SYMM_DTYPE_BF16, 16, 4, 0);
    world_from_rows(&w, &cfg, HAND_TOKENS, HAND_ROWS);
    /* Values whose sums round, so that the two orders differ. */
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < HAND_TOKENS[s] * 16; i++) {
            store_value(SYMM_DTYPE_BF16, w.x[s], (size_t)i, rough_value());
            if (i < HAND_TOKENS[s] * 2)
                w.tw[s][i] = rough_value() * 0.5f;
        }
    CHECK(world_dispatch(&w) == SYMM_OK, "dispatch: %s", symm_last_error());
    tcombine cb = { 0 };
    for (int p = 0; p < 2; p++)
        cb.y[p] = w.recv[p].x;
    CHECK(run_combine(&w, &cb) == SYMM_OK, "combine: %s", symm_last_error());
    /* Per token, per rank ascending, the k it sums (-1: none). */
    static const int parts[2][3][2][2] = {
        { { { 0, -1 }, { 1, -1 } }, { { -1, -1 }, { 0, -1 } }, { { 0, 1 }, { -1, -1 } } },
        { { { 1, -1 }, { 0, -1 } }, { { -1, -1 }, { -1, -1 } } },
    };
    int rounded_twice = 0;
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < HAND_TOKENS[s]; t++)
            for (int h = 0; h < 16; h++) {
                float x = load_value(SYMM_DTYPE_BF16, w.x[s], t * 16 + h), acc = 0.0f, once = 0.0f;
                for (int p = 0; p < 2; p++) {
                    float part = 0.0f;
                    for (int i = 0; i < 2 && parts[s][t][p][i] >= 0; i++) {
                        part = fmaf(w.tw[s][t * 2 + parts[s][t][p][i]], x, part);
                        once = fmaf(w.tw[s][t * 2 + parts[s][t][p][i]], x, once);
                    }
                    if (parts[s][t][p][0] >= 0)
                        acc = acc + symm_bf16_to_f32(symm_f32_to_bf16(part));
                }
                uint16_t got, want = symm_f32_to_bf16(acc);
                rounded_twice += want != symm_f32_to_bf16(once);
                memcpy(&got, (uint16_t *)cb.out[s] + t * 16 + h, 2);
                CHECK(got == want, "token %d of rank %d [%d]: 0x%04x, expected 0x%04x", t, s, h, got, want);
            }
    /* The data tell the two orders apart somewhere, or the test shows nothing. */
    CHECK(rounded_twice > 0, "no element differs between the rank order and the k order");
    for (int p = 0; p < 2; p++)
        cb.y[p] = NULL;
    combine_free(&w, &cb);
    world_free(&w);
}

Test(dispatch, expert_layout_capacity_drops_the_last_rows)
{
    static const struct {
        int64_t capacity;
        int n_rows;
        expert_row rows[7];
        int64_t rows_end[2], dropped[2], sent_dropped0;
        int32_t count[2][2], offset[2][2];
    } cases[] = {
        { 5, 6, { { 0, 0, 0, 2, 0 }, { 0, 1, 1, 0, 1 }, { 0, 4, 0, 0, 0 }, { 1, 0, 0, 0, 1 },
                  { 1, 1, 1, 0, 0 }, { 1, 4, 0, 1, 0 } },
          { 5, 5 }, { 1, 0 }, 1, { { 2, 1 }, { 2, 1 } }, { { 0, 4 }, { 0, 4 } } },
        { 3, 4, { { 0, 0, 0, 2, 0 }, { 0, 1, 1, 0, 1 }, { 1, 0, 0, 0, 1 }, { 1, 1, 1, 0, 0 } },
          { 3, 3 }, { 2, 1 }, 3, { { 2, 0 }, { 2, 0 } }, { { 0, 3 }, { 0, 3 } } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tworld w;
        symm_ref_config cfg = hand_config(SYMM_LAYOUT_EXPERT, SYMM_DTYPE_BF16, 16, 4, cases[i].capacity);
        world_from_rows(&w, &cfg, HAND_TOKENS, HAND_ROWS);
        guarded_recvs(&w, 18 - cases[i].capacity);
        symm_status st = world_dispatch(&w);
        CHECK(st == SYMM_ERR_OVERFLOW, "capacity %lld: dispatch returned %s", (long long)cases[i].capacity,
              symm_status_name(st));
        check_expert_rows(&w, cases[i].rows, cases[i].n_rows);
        check_counts(&w, cases[i].rows_end, cases[i].count, cases[i].offset, cases[i].dropped);
        CHECK(w.stats[0].dropped == cases[i].sent_dropped0 && w.stats[1].dropped == 0,
              "capacity %lld: stats.dropped %lld %lld", (long long)cases[i].capacity,
              (long long)w.stats[0].dropped, (long long)w.stats[1].dropped);
        for (int p = 0; p < 2; p++) {
            check_unwritten(&w, p, 2, cases[i].capacity < 4 ? cases[i].capacity : 4, "padding");
            check_unwritten(&w, p, cases[i].capacity, 18, "past capacity");
        }
        world_free(&w);
    }
}

Test(dispatch, invalid_ids_are_counted_reported_and_skipped)
{
    /* rank 0: {1, 1, 4}: repeat, out of range   {-2, 0, -1}: -2   {3, 7, 3}: 7, repeat
     * rank 1: {-1, -1, -1}: nothing   {0, 2, 0}: repeat */
    static const int32_t rows0[] = { 1, 1, 4, -2, 0, -1, 3, 7, 3 };
    static const int32_t rows1[] = { -1, -1, -1, 0, 2, 0 };
    static const int32_t *const rows[] = { rows0, rows1 };
    static const int tokens[] = { 3, 2 };
    symm_ref_config cfg = hand_config(SYMM_LAYOUT_RANK, SYMM_DTYPE_FP32, 8, 1, 0);
    cfg.topk = 3;
    tworld w;
    world_from_rows(&w, &cfg, tokens, rows);
    symm_status st = world_dispatch(&w);
    CHECK(st == SYMM_ERR_OVERFLOW, "dispatch returned %s, expected SYMM_ERR_OVERFLOW", symm_status_name(st));
    const char *msg = symm_last_error();
    CHECK(strstr(msg, "6 invalid expert ids") && strstr(msg, "rank 0: 5") && strstr(msg, "rank 1: 1") &&
              !strstr(msg, "dropped"),
          "message does not give the invalid counts per rank: %s", msg);
    CHECK(w.stats[0].invalid == 5 && w.stats[1].invalid == 1, "stats.invalid %lld %lld, expected 5 1",
          (long long)w.stats[0].invalid, (long long)w.stats[1].invalid);
    static const struct { int p, row, s, t; int32_t topk[3]; } want[] = {
        { 0, 0, 0, 0, { 1, -1, -1 } }, { 0, 1, 0, 1, { -1, 0, -1 } }, { 0, 2, 1, 1, { 0, -1, -1 } },
        { 1, 0, 0, 2, { 1, -1, -1 } }, { 1, 1, 1, 1, { -1, 0, -1 } },
    };
    for (int i = 0; i < 5; i++) {
        check_src(&w, want[i].p, want[i].row, want[i].s, want[i].t, -1);
        for (int k = 0; k < 3; k++)
            CHECK(w.recv[want[i].p].topk_idx[want[i].row * 3 + k] == want[i].topk[k],
                  "rank %d row %d k %d: topk %d, expected %d", want[i].p, want[i].row, k,
                  w.recv[want[i].p].topk_idx[want[i].row * 3 + k], want[i].topk[k]);
    }
    static const int64_t rows_end[] = { 3, 2 }, dropped[] = { 0, 0 };
    static const int32_t count[2][2] = { { 2, 1 }, { 1, 1 } }, offset[2][2] = { { 0, 0 }, { 0, 0 } };
    check_counts(&w, rows_end, count, offset, dropped);
    check_rank_layout(&w);
    static const float mult[2][3] = { { 1, 1, 1 }, { 0, 2, 0 } };
    tcombine cb = { 0 };
    for (int p = 0; p < 2; p++)
        cb.y[p] = w.recv[p].x;
    CHECK(run_combine(&w, &cb) == SYMM_OK, "combine: %s", symm_last_error());
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < tokens[s]; t++)
            for (int h = 0; h < 8; h++) {
                float got = ((float *)cb.out[s])[t * 8 + h];
                float want_v = mult[s][t] == 0.0f ? 0.0f : mult[s][t] * ((float *)w.x[s])[t * 8 + h];
                CHECK(f32_bits(got) == f32_bits(want_v), "token %d of rank %d: %a, expected %a", t, s, got, want_v);
            }
    for (int p = 0; p < 2; p++)
        cb.y[p] = NULL;
    combine_free(&w, &cb);
    world_free(&w);
}

/* ---- properties over random worlds ------------------------------------------- */

static void random_world_round(symm_ref_config cfg, gen g)
{
    tworld w;
    world_make(&w, &cfg, &g, 0);
    dispatch_and_check(&w);
    combine_and_check(&w);
    world_free(&w);
}

Test(properties, random_worlds_follow_the_contract)
{
    for (int round = 0; round < 150; round++) {
        symm_ref_config cfg = random_config();
        if (chance(30))
            cfg.capacity = 1 + rnd((int)symm_ref_worst_capacity(&cfg));
        gen g = GEN_PLAIN;
        g.invalid = chance(30) ? 10 : 0;
        random_world_round(cfg, g);
    }
}

Test(properties, every_world_size_layout_and_combine_dtype)
{
    static const int worlds[] = { 2, 3, 4, 8 };
    for (int wi = 0; wi < 4; wi++)
        for (int layout = 0; layout < 2; layout++)
            for (int cd = 0; cd < 3; cd++)
                for (int round = 0; round < 3; round++) {
                    symm_ref_config cfg = random_config();
                    cfg.world = worlds[wi];
                    cfg.experts = cfg.world * (1 + rnd(3));
                    cfg.topk = 1 + rnd(cfg.experts < 5 ? cfg.experts : 5);
                    cfg.layout = (symm_layout)layout;
                    cfg.align = layout == SYMM_LAYOUT_EXPERT ? 1 + rnd(8) : 1;
                    cfg.combine_order = layout == SYMM_LAYOUT_EXPERT ? cfg.combine_order : SYMM_COMBINE_ORDER_RANK;
                    cfg.combine_dtype = (symm_dtype)cd;
                    random_world_round(cfg, GEN_PLAIN);
                }
}

/* A world large enough that combine sums its tokens on several threads
 * (runtime/ref.c: a thread a 4 Mi multiply-adds, at most the CPUs and 16)
 * gives the contract's bits in each form, by the oracle above. */
Test(properties, large_worlds_summed_on_several_threads_follow_the_contract)
{
    static const struct {
        symm_layout layout;
        symm_combine_order order;
    } forms[] = {
        { SYMM_LAYOUT_RANK, SYMM_COMBINE_ORDER_RANK },
        { SYMM_LAYOUT_EXPERT, SYMM_COMBINE_ORDER_RANK },
        { SYMM_LAYOUT_EXPERT, SYMM_COMBINE_ORDER_K },
    };
    for (int f = 0; f < 3; f++) {
        symm_ref_config cfg = random_config();
        cfg.world = 4;
        cfg.experts = 32;
        cfg.topk = 8;
        cfg.dtype = SYMM_DTYPE_BF16;
        cfg.combine_dtype = (symm_dtype)rnd(3);
        cfg.hidden = 1024;
        cfg.max_tokens = 1000 + rnd(24); /* 4 x 1000 x 8 x 1024: about 8 threads' work */
        cfg.layout = forms[f].layout;
        cfg.combine_order = forms[f].order;
        cfg.align = cfg.layout == SYMM_LAYOUT_EXPERT ? 1 + rnd(4) : 1;
        cfg.weights = 1;
        random_world_round(cfg, GEN_PLAIN);
    }
}

/* Layout rank, y = recv_x: every token comes back as x * |D(t)|, exactly
 * (small values, so no rounding anywhere). */
Test(properties, rank_combine_of_recv_x_is_x_times_destination_count)
{
    static const symm_dtype dtypes[] = { SYMM_DTYPE_FP32, SYMM_DTYPE_BF16, SYMM_DTYPE_FP16 };
    for (int round = 0; round < 60; round++) {
        symm_ref_config cfg = random_config();
        cfg.layout = SYMM_LAYOUT_RANK;
        cfg.combine_order = SYMM_COMBINE_ORDER_RANK;
        cfg.align = 1;
        cfg.dtype = cfg.combine_dtype = dtypes[round % 3];
        cfg.hidden = 16;
        tworld w;
        world_make(&w, &cfg, &GEN_PLAIN, 1);
        CHECK(world_dispatch(&w) == SYMM_OK, "dispatch: %s", symm_last_error());
        tcombine cb = { 0 };
        for (int p = 0; p < cfg.world; p++)
            cb.y[p] = w.recv[p].x;
        CHECK(run_combine(&w, &cb) == SYMM_OK, "combine: %s", symm_last_error());
        for (int s = 0; s < cfg.world; s++)
            for (int t = 0; t < w.in[s].tokens; t++) {
                int d = 0;
                for (int p = 0; p < cfg.world; p++)
                    d += goes_to(&w, s, t, p);
                for (int h = 0; h < cfg.hidden; h++) {
                    size_t i = (size_t)t * cfg.hidden + h;
                    float x = load_value(cfg.dtype, w.x[s], i);
                    store_value(cfg.dtype, cb.want[s], i, d ? (float)d * x : 0.0f);
                }
            }
        check_outputs(&w, &cb, "x * |D(t)|");
        for (int p = 0; p < cfg.world; p++)
            cb.y[p] = NULL;
        combine_free(&w, &cb);
        world_free(&w);
    }
}

/* Layout expert with weights, y = recv_x: every token comes back as
 * fmaf(w[k], x, acc) over its valid k ascending, rounded once. */
Test(properties, expert_combine_of_recv_x_is_weighted_sum_over_valid_k)
{
    static const symm_dtype dtypes[] = { SYMM_DTYPE_FP32, SYMM_DTYPE_BF16, SYMM_DTYPE_FP16 };
    for (int round = 0; round < 60; round++) {
        symm_ref_config cfg = random_config();
        cfg.layout = SYMM_LAYOUT_EXPERT;
        cfg.combine_order = SYMM_COMBINE_ORDER_K;
        cfg.weights = 1;
        cfg.dtype = cfg.combine_dtype = dtypes[round % 3];
        cfg.hidden = 16;
        gen g = GEN_PLAIN;
        g.invalid = 10;
        tworld w;
        world_make(&w, &cfg, &g, 0);
        symm_status st = world_dispatch(&w);
        CHECK(st == (any_invalid(&w) ? SYMM_ERR_OVERFLOW : SYMM_OK), "dispatch: %s", symm_last_error());
        tcombine cb = { 0 };
        for (int p = 0; p < cfg.world; p++)
            cb.y[p] = w.recv[p].x;
        CHECK(run_combine(&w, &cb) == SYMM_OK, "combine: %s", symm_last_error());
        for (int s = 0; s < cfg.world; s++)
            for (int t = 0; t < w.in[s].tokens; t++)
                for (int h = 0; h < cfg.hidden; h++) {
                    size_t i = (size_t)t * cfg.hidden + h;
                    float x = load_value(cfg.dtype, w.x[s], i), acc = 0.0f;
                    for (int k = 0; k < cfg.topk; k++)
                        if (entry_valid(token_row(&w, s, t), k, cfg.experts))
                            acc = fmaf(w.tw[s][(size_t)t * cfg.topk + k], x, acc);
                    store_value(cfg.dtype, cb.want[s], i, acc);
                }
        check_outputs(&w, &cb, "sum of w * x");
        for (int p = 0; p < cfg.world; p++)
            cb.y[p] = NULL;
        combine_free(&w, &cb);
        world_free(&w);
    }
}

/* ---- edge cases --------------------------------------------------------------- */

Test(edge, empty_ranks_send_nothing_with_null_pointers)
{
    for (int round = 0; round < 40; round++) {
        symm_ref_config cfg = random_config();
        gen g = GEN_PLAIN;
        g.empty = 0;
        tworld w;
        world_make(&w, &cfg, &g, 0);
        int empty[2] = { rnd(cfg.world), rnd(cfg.world) };
        for (int i = 0; i < 2; i++) {
            int s = empty[i];
            free(w.x[s]);
            free(w.scales[s]);
            free(w.idx[s]);
            free(w.tw[s]);
            w.x[s] = NULL, w.scales[s] = NULL, w.idx[s] = NULL, w.tw[s] = NULL;
            w.in[s] = (symm_ref_input){ 0, NULL, NULL, NULL, NULL };
        }
        dispatch_and_check(&w);
        for (int p = 0; p < cfg.world; p++)
            for (int64_t r = 0; r < w.recv[p].rows; r++)
                if (row_written(&w, p, r))
                    CHECK(w.recv[p].src[r * 4] != empty[0] && w.recv[p].src[r * 4] != empty[1],
                          "rank %d row %lld comes from empty rank %d", p, (long long)r, w.recv[p].src[r * 4]);
        combine_and_check(&w);
        world_free(&w);
    }
}

Test(edge, all_tokens_to_one_rank)
{
    for (int round = 0; round < 40; round++) {
        symm_ref_config cfg = random_config();
        gen g = { 0, 0, rnd(cfg.world), 0 };
        tworld w;
        world_make(&w, &cfg, &g, 0);
        dispatch_and_check(&w);
        int64_t total = 0;
        for (int s = 0; s < cfg.world; s++)
            total += w.in[s].tokens;
        for (int p = 0; p < cfg.world; p++) {
            if (p == g.to_rank) {
                /* No -1 and no invalid ids: every token reaches it. */
                CHECK(cfg.layout == SYMM_LAYOUT_EXPERT || w.recv[p].rows == total,
                      "rank %d: rows %lld, expected all %lld tokens", p, (long long)w.recv[p].rows,
                      (long long)total);
                continue;
            }
            CHECK(w.recv[p].rows == 0, "rank %d: rows %lld, expected 0 (all to rank %d)", p,
                  (long long)w.recv[p].rows, g.to_rank);
            for (int j = 0; j < local_experts(&cfg); j++)
                CHECK(w.recv[p].expert_count[j] == 0, "rank %d: expert_count[%d] %d", p, j,
                      w.recv[p].expert_count[j]);
        }
        combine_and_check(&w);
        world_free(&w);
    }
}

Test(edge, all_masked_gives_no_rows_and_positive_zero_outputs)
{
    for (int round = 0; round < 20; round++) {
        symm_ref_config cfg = random_config();
        gen g = { 100, 0, -1, 0 };
        tworld w;
        world_make(&w, &cfg, &g, 0);
        CHECK(world_dispatch(&w) == SYMM_OK, "dispatch: %s", symm_last_error());
        for (int p = 0; p < cfg.world; p++) {
            CHECK(w.recv[p].rows == 0 && w.recv[p].dropped == 0, "rank %d: rows %lld", p,
                  (long long)w.recv[p].rows);
            for (int j = 0; j < local_experts(&cfg); j++)
                CHECK(w.recv[p].expert_count[j] == 0 && w.recv[p].expert_offset[j] == 0,
                      "rank %d expert %d: count %d offset %d", p, j, w.recv[p].expert_count[j],
                      w.recv[p].expert_offset[j]);
            check_unwritten(&w, p, 0, symm_ref_capacity(&cfg), "no rows");
            CHECK(w.stats[p].invalid == 0 && w.stats[p].dropped == 0, "rank %d: stats not zero", p);
        }
        tcombine cb = { 0 }; /* y all NULL: no rank has rows */
        CHECK(run_combine(&w, &cb) == SYMM_OK, "combine: %s", symm_last_error());
        for (int s = 0; s < cfg.world; s++) {
            size_t n = (size_t)w.in[s].tokens * cfg.hidden * dsize(cfg.combine_dtype);
            for (size_t i = 0; i < n; i++)
                CHECK(((unsigned char *)cb.out[s])[i] == 0, "rank %d: output byte %zu is 0x%02x, expected +0",
                      s, i, ((unsigned char *)cb.out[s])[i]);
        }
        combine_free(&w, &cb);
        world_free(&w);
    }
}

Test(edge, random_invalid_ids_are_counted_and_reported_per_rank)
{
    for (int round = 0; round < 40; round++) {
        symm_ref_config cfg = random_config();
        gen g = { 10, 30, -1, 10 };
        tworld w;
        world_make(&w, &cfg, &g, 0);
        dispatch_and_check(&w);
        if (any_invalid(&w)) {
            const char *msg = symm_last_error();
            for (int s = 0; s < cfg.world; s++)
                if (w.stats[s].invalid)
                    CHECK(strstr(msg, msgf("rank %d: %lld", s, (long long)w.stats[s].invalid)),
                          "message lacks rank %d's %lld invalid ids: %s", s, (long long)w.stats[s].invalid, msg);
        }
        combine_and_check(&w);
        world_free(&w);
    }
}

/* Dispatch once with the worst case, then again below the need: the rows
 * that stay are the first ones of the first run, the rest are counted, and
 * nothing lands past the capacity. */
Test(edge, capacity_overflow_keeps_the_first_rows_and_writes_nothing_past_capacity)
{
    for (int round = 0; round < 60; round++) {
        symm_ref_config cfg = random_config();
        gen g = { 0, 0, -1, 0 };
        tworld w;
        world_make(&w, &cfg, &g, 0);
        CHECK(world_dispatch(&w) == SYMM_OK, "full dispatch: %s", symm_last_error());
        int64_t need = 0, worst = symm_ref_capacity(&cfg);
        /* The last row written, not rows: an empty last segment leaves
         * padding at the end. */
        for (int p = 0; p < cfg.world; p++)
            for (int64_t r = w.recv[p].rows; r > need; r--)
                if (row_written(&w, p, r - 1))
                    need = r;
        if (need < 2) {
            world_free(&w);
            continue;
        }
        symm_ref_recv full[MAXW];
        memcpy(full, w.recv, sizeof full);
        memset(w.recv, 0, sizeof w.recv);
        w.cfg.capacity = 1 + rnd((int)need - 1);
        int64_t cap = w.cfg.capacity;
        guarded_recvs(&w, worst - cap);
        dispatch_and_check(&w);
        CHECK(any_dropped(&w), "capacity %lld below the need %lld but nothing dropped", (long long)cap,
              (long long)need);
        CHECK(strstr(symm_last_error(), "rows dropped"), "message: %s", symm_last_error());
        for (int p = 0; p < cfg.world; p++) {
            for (int64_t r = 0; r < cap; r++) {
                int was = !all_poison(full[p].src + r * 4, 16), is = row_written(&w, p, r);
                CHECK(was == is, "rank %d row %lld: written %d, with the worst case %d", p, (long long)r, is, was);
                CHECK(!is || !memcmp(full[p].src + r * 4, w.recv[p].src + r * 4, 16),
                      "rank %d row %lld: src differs from the worst-case run", p, (long long)r);
            }
            check_unwritten(&w, p, cap, worst, "past capacity");
            symm_ref_recv_free(&full[p]);
        }
        combine_and_check(&w);
        world_free(&w);
    }
}

Test(edge, align_64_segments_start_on_multiples_of_64)
{
    for (int round = 0; round < 30; round++) {
        symm_ref_config cfg = random_config();
        cfg.layout = SYMM_LAYOUT_EXPERT;
        cfg.align = 64;
        if (chance(30))
            cfg.capacity = 1 + rnd((int)symm_ref_worst_capacity(&cfg));
        tworld w;
        world_make(&w, &cfg, &GEN_PLAIN, 0);
        dispatch_and_check(&w);
        for (int p = 0; p < cfg.world; p++)
            for (int j = 0; j < local_experts(&cfg); j++)
                CHECK(w.recv[p].expert_offset[j] % 64 == 0 || w.recv[p].expert_offset[j] == symm_ref_capacity(&cfg),
                      "rank %d: expert_offset[%d] %d", p, j, w.recv[p].expert_offset[j]);
        combine_and_check(&w);
        world_free(&w);
    }
}

Test(edge, fp8_payload_and_scales_are_copied_bit_for_bit)
{
    for (int round = 0; round < 30; round++) {
        symm_ref_config cfg = random_config();
        cfg.dtype = SYMM_DTYPE_FP8_E4M3;
        cfg.hidden = 128 * (1 + rnd(2));
        cfg.layout = (symm_layout)(round % 2);
        cfg.align = cfg.layout == SYMM_LAYOUT_EXPERT ? 1 + rnd(4) : 1;
        cfg.combine_order = cfg.layout == SYMM_LAYOUT_EXPERT ? cfg.combine_order : SYMM_COMBINE_ORDER_RANK;
        tworld w;
        world_make(&w, &cfg, &GEN_PLAIN, 0);
        dispatch_and_check(&w); /* compares every x byte and every scale */
        CHECK(w.recv[0].scales != NULL, "no scales array for fp8");
        combine_and_check(&w);
        world_free(&w);
    }
}

/* ---- configuration and argument checks ---------------------------------------- */

Test(config, worst_capacity_follows_the_formulas)
{
    static const struct {
        symm_ref_config cfg;
        int64_t worst;
    } cases[] = {
        { { 16, 2, 4, 2, 3, SYMM_DTYPE_BF16, SYMM_DTYPE_BF16, SYMM_LAYOUT_RANK, 0, 0, 1, SYMM_COMBINE_ORDER_RANK, 0 }, 6 },
        { { 16, 8, 9, 3, 5, SYMM_DTYPE_BF16, SYMM_DTYPE_BF16, SYMM_LAYOUT_RANK, 0, 0, 1, SYMM_COMBINE_ORDER_RANK, 0 }, 15 },
        { { 16, 2, 4, 2, 3, SYMM_DTYPE_BF16, SYMM_DTYPE_BF16, SYMM_LAYOUT_EXPERT, 1, 0, 4, SYMM_COMBINE_ORDER_RANK, 0 }, 18 },
        /* min(K, L) = L = 2: 4 * 10 * 2 + 2 * 63 */
        { { 16, 3, 8, 4, 10, SYMM_DTYPE_BF16, SYMM_DTYPE_BF16, SYMM_LAYOUT_EXPERT, 1, 0, 64, SYMM_COMBINE_ORDER_RANK, 0 }, 206 },
        /* min(K, L) = K = 1 */
        { { 16, 1, 8, 2, 5, SYMM_DTYPE_BF16, SYMM_DTYPE_BF16, SYMM_LAYOUT_EXPERT, 0, 0, 1, SYMM_COMBINE_ORDER_RANK, 0 }, 10 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(symm_ref_worst_capacity(&cases[i].cfg) == cases[i].worst, "case %zu: %lld, expected %lld", i,
              (long long)symm_ref_worst_capacity(&cases[i].cfg), (long long)cases[i].worst);
        CHECK(symm_ref_capacity(&cases[i].cfg) == cases[i].worst, "case %zu: capacity 0 is not the worst case", i);
    }
    CHECK(symm_ref_worst_capacity(NULL) == -1, "NULL config has a worst case");
}

/* Spoil one field of a valid config; returns the field the message must name. */
static const char *spoil(int i, symm_ref_config *c)
{
    switch (i) {
    case 0: c->hidden = 0; return "hidden";
    case 1: c->dtype = SYMM_DTYPE_BF16; c->hidden = 4; return "hidden";
    case 2: c->dtype = SYMM_DTYPE_FP32; c->combine_dtype = SYMM_DTYPE_BF16; c->hidden = 4; return "combine_dtype";
    case 3: c->dtype = SYMM_DTYPE_FP8_E4M3; c->hidden = 64; return "fp8_e4m3";
    case 4: c->combine_dtype = SYMM_DTYPE_FP8_E4M3; return "combine_dtype";
    case 5: c->dtype = (symm_dtype)7; return "dtype";
    case 6: c->layout = (symm_layout)2; return "layout";
    case 7: c->world = 0; return "world";
    case 8: c->world = 129; c->experts = 129 * 2; return "world";
    case 9: c->experts = c->world * 2 + 1; return "experts";
    case 10: c->experts = 0; return "experts";
    case 11: c->topk = 0; return "topk";
    case 12: c->experts = 32; c->world = 2; c->topk = 17; return "topk";
    case 13: c->experts = c->world; c->topk = c->world + 1; return "topk";
    case 14: c->max_tokens = 0; return "max_tokens";
    case 15: c->weights = 2; return "weights";
    case 16: c->layout = SYMM_LAYOUT_RANK; c->align = 2; return "align";
    case 17: c->layout = SYMM_LAYOUT_EXPERT; c->align = 0; return "align";
    case 18: c->layout = SYMM_LAYOUT_EXPERT; c->align = 4097; return "align";
    case 19: c->capacity = -1; return "capacity";
    case 20: c->capacity = symm_ref_worst_capacity(c) + 1; return "capacity";
    case 21: c->max_tokens = 1 << 21; return "max_tokens";
    case 22: c->experts = 8192 * 2; c->world = 2; return "experts";
    case 23: c->hidden = 2 * 1048576; return "hidden";
    /* worst case 128 * 2^20 * 16 rows: past int32 */
    case 24: c->world = 128; c->experts = 128 * 16; c->topk = 16; c->max_tokens = 1048576;
             c->layout = SYMM_LAYOUT_EXPERT; return "int32";
    /* 8 * 2^20 rows of 2^20 * 4 bytes: past 1 TiB */
    case 25: c->world = 8; c->experts = 8; c->topk = 1; c->max_tokens = 1048576; c->hidden = 1048576;
             c->dtype = c->combine_dtype = SYMM_DTYPE_FP32; return "1 TiB";
    case 26: c->combine_order = (symm_combine_order)2; return "combine_order";
    case 27: c->layout = SYMM_LAYOUT_RANK; c->align = 1; c->combine_order = SYMM_COMBINE_ORDER_K;
             return "combine_order";
    case 28: c->hosts = c->world + 1; return "hosts";
    case 29: c->hosts = -1; return "hosts";
    }
    return NULL;
}

Test(config, rejects_each_bad_field_naming_it)
{
    const char *field;
    for (int i = 0; (field = spoil(i, &(symm_ref_config){ 0 })) != NULL; i++) {
        symm_ref_config c = random_config();
        c.hidden = 128;
        spoil(i, &c);
        symm_status st = symm_ref_check_config(&c);
        CHECK(st == SYMM_ERR_INVALID_ARG, "case %d (%s): %s", i, field, symm_status_name(st));
        CHECK(strstr(symm_last_error(), field) && strstr(symm_last_error(), "symm_ref_check_config"),
              "case %d: message does not name %s: %s", i, field, symm_last_error());
        symm_ref_recv r;
        CHECK(symm_ref_recv_alloc(&c, &r) == SYMM_ERR_INVALID_ARG && r.x == NULL,
              "case %d: recv_alloc accepted the bad config", i);
    }
    CHECK(symm_ref_check_config(NULL) == SYMM_ERR_INVALID_ARG && strstr(symm_last_error(), "cfg"),
          "NULL config: %s", symm_last_error());
}

Test(config, accepts_every_config_within_the_limits)
{
    for (int i = 0; i < 500; i++) {
        symm_ref_config c = random_config();
        int64_t worst = symm_ref_worst_capacity(&c);
        c.capacity = chance(50) ? 0 : 1 + rnd((int)worst);
        CHECK(symm_ref_check_config(&c) == SYMM_OK, "rejected: %s", symm_last_error());
    }
    symm_ref_config big = { 7168, 16, 256, 128, 4096, SYMM_DTYPE_FP8_E4M3, SYMM_DTYPE_BF16,
                            SYMM_LAYOUT_EXPERT, 1, 0, 4096, SYMM_COMBINE_ORDER_RANK, 0 };
    CHECK(symm_ref_check_config(&big) == SYMM_OK, "largest shapes rejected: %s", symm_last_error());
}

Test(config, recv_alloc_sizes_arrays_for_the_layout_and_poisons_them)
{
    for (int i = 0; i < 40; i++) {
        symm_ref_config c = random_config();
        if (chance(50))
            c.capacity = 1 + rnd((int)symm_ref_worst_capacity(&c));
        symm_ref_recv r;
        CHECK(symm_ref_recv_alloc(&c, &r) == SYMM_OK, "alloc: %s", symm_last_error());
        int64_t cap = symm_ref_capacity(&c);
        int L = local_experts(&c), cols = c.layout == SYMM_LAYOUT_RANK ? c.topk : 1;
        CHECK(r.capacity == cap && r.rows == 0 && r.dropped == 0, "capacity %lld, expected %lld",
              (long long)r.capacity, (long long)cap);
        CHECK(all_poison(r.x, (size_t)cap * x_row_bytes(&c)) && all_poison(r.src, (size_t)cap * 16) &&
                  all_poison(r.expert_count, (size_t)L * 4) && all_poison(r.expert_offset, (size_t)L * 4),
              "arrays not poisoned");
        CHECK((r.topk_idx != NULL) == (c.layout == SYMM_LAYOUT_RANK), "topk_idx presence wrong for layout");
        CHECK(!r.topk_idx || all_poison(r.topk_idx, (size_t)cap * c.topk * 4), "topk_idx not poisoned");
        CHECK((r.weights != NULL) == (c.weights == 1), "weights presence wrong");
        CHECK(!r.weights || all_poison(r.weights, (size_t)cap * cols * 4), "weights not poisoned");
        CHECK((r.scales != NULL) == (c.dtype == SYMM_DTYPE_FP8_E4M3), "scales presence wrong");
        CHECK(!r.scales || all_poison(r.scales, (size_t)cap * scale_blocks(&c) * 4), "scales not poisoned");
        symm_ref_recv_free(&r);
        CHECK(r.x == NULL && r.capacity == 0, "free did not clear the recv");
        symm_ref_recv_free(&r);
    }
    symm_ref_recv_free(NULL);
}

static int all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

/* A random world (half the time with a random capacity), dispatched into
 * fresh poisoned buffers and checked against the contract; its config. */
static symm_ref_config dispatched_random_world(tworld *w)
{
    symm_ref_config c = random_config();
    if (chance(50))
        c.capacity = 1 + rnd((int)symm_ref_worst_capacity(&c));
    world_make(w, &c, &GEN_PLAIN, 0);
    dispatch_and_check(w);
    return c;
}

/* The lazy allocation: the arrays of recv_alloc, zeroed; a dispatch into it
 * writes exactly what it writes into poisoned buffers (every written row the
 * same bytes, the counts, offsets, rows and dropped the same) and nothing
 * else; a bad config is refused as recv_alloc refuses it. */
Test(config, recv_alloc_lazy_gives_zeroed_arrays_that_dispatch_fills_as_the_poisoned_ones)
{
    for (int i = 0; i < 30; i++) {
        tworld w;
        const symm_ref_config c = dispatched_random_world(&w);
        const int64_t cap = symm_ref_capacity(&c);
        const int L = local_experts(&c), cols = c.layout == SYMM_LAYOUT_RANK ? c.topk : 1;
        const size_t xrow = x_row_bytes(&c), srow = (size_t)scale_blocks(&c) * 4;
        symm_ref_recv lazy[MAXW];
        for (int p = 0; p < c.world; p++) {
            CHECK(symm_ref_recv_alloc_lazy(&c, &lazy[p]) == SYMM_OK, "lazy alloc: %s", symm_last_error());
            symm_ref_recv *r = &lazy[p];
            CHECK(r->capacity == cap && r->rows == 0 && r->dropped == 0, "rank %d: capacity %lld, expected %lld", p,
                  (long long)r->capacity, (long long)cap);
            CHECK(all_zero(r->x, (size_t)cap * xrow) && all_zero(r->src, (size_t)cap * 16) &&
                      all_zero(r->expert_count, (size_t)L * 4) && all_zero(r->expert_offset, (size_t)L * 4),
                  "rank %d: lazy arrays not zeroed", p);
            CHECK((r->topk_idx != NULL) == (c.layout == SYMM_LAYOUT_RANK) && (r->weights != NULL) == (c.weights == 1) &&
                      (r->scales != NULL) == (c.dtype == SYMM_DTYPE_FP8_E4M3),
                  "rank %d: lazy arrays present where recv_alloc's are not", p);
        }
        symm_ref_send_stats stats[MAXW];
        const symm_status want = symm_ref_dispatch(&c, w.in, w.recv, w.stats);
        /* Dispatched again into the poisoned buffers above (same inputs, same
         * result), then into the lazy ones. */
        const symm_status got = symm_ref_dispatch(&c, w.in, lazy, stats);
        CHECK(got == want, "lazy dispatch returned %s, the poisoned one %s", symm_status_name(got),
              symm_status_name(want));
        for (int p = 0; p < c.world; p++) {
            const symm_ref_recv *a = &w.recv[p], *b = &lazy[p];
            CHECK(a->rows == b->rows && a->dropped == b->dropped, "rank %d: rows %lld / %lld, dropped %lld / %lld", p,
                  (long long)a->rows, (long long)b->rows, (long long)a->dropped, (long long)b->dropped);
            CHECK(!memcmp(a->expert_count, b->expert_count, (size_t)L * 4) &&
                      !memcmp(a->expert_offset, b->expert_offset, (size_t)L * 4),
                  "rank %d: expert counts or offsets differ", p);
            for (int64_t row = 0; row < cap; row++) {
                const size_t ri = (size_t)row;
                if (row < a->rows && row_written(&w, p, row)) {
                    CHECK(!memcmp((char *)a->x + ri * xrow, (char *)b->x + ri * xrow, xrow) &&
                              !memcmp(a->src + ri * 4, b->src + ri * 4, 16) &&
                              (!a->topk_idx || !memcmp(a->topk_idx + ri * c.topk, b->topk_idx + ri * c.topk,
                                                       (size_t)c.topk * 4)) &&
                              (!a->weights || !memcmp(a->weights + ri * cols, b->weights + ri * cols, (size_t)cols * 4)) &&
                              (!a->scales || !memcmp((char *)a->scales + ri * srow, (char *)b->scales + ri * srow, srow)),
                          "rank %d: row %lld differs between the lazy and the poisoned buffers", p, (long long)row);
                } else {
                    CHECK(all_zero((char *)b->x + ri * xrow, xrow) && all_zero(b->src + ri * 4, 16) &&
                              (!b->topk_idx || all_zero(b->topk_idx + ri * c.topk, (size_t)c.topk * 4)) &&
                              (!b->weights || all_zero(b->weights + ri * cols, (size_t)cols * 4)) &&
                              (!b->scales || all_zero((char *)b->scales + ri * srow, srow)),
                          "rank %d: row %lld, which dispatch does not write, written in the lazy buffers", p,
                          (long long)row);
                }
            }
            symm_ref_recv_free(&lazy[p]);
            CHECK(lazy[p].x == NULL && lazy[p].capacity == 0, "free did not clear the lazy recv");
        }
        world_free(&w);
    }
    symm_ref_config bad = random_config();
    bad.world = 0;
    symm_ref_recv r;
    CHECK(symm_ref_recv_alloc_lazy(&bad, &r) == SYMM_ERR_INVALID_ARG && r.x == NULL &&
              strstr(symm_last_error(), "symm_ref_recv_alloc_lazy"),
          "a bad config accepted, or the message does not name the call: %s", symm_last_error());
    CHECK(symm_ref_recv_alloc_lazy(&bad, NULL) == SYMM_ERR_INVALID_ARG, "NULL recv accepted");
}

static void expect_rejected(tworld *w, const char *what, const char *needle)
{
    symm_status st = world_dispatch(w);
    CHECK(st == SYMM_ERR_INVALID_ARG, "%s: dispatch returned %s", what, symm_status_name(st));
    CHECK(strstr(symm_last_error(), "symm_ref_dispatch") && strstr(symm_last_error(), needle),
          "%s: message does not name %s: %s", what, needle, symm_last_error());
}

/* A bad call returns before writing anything: every recv stays poison. */
static void check_nothing_written(const tworld *w)
{
    int64_t cap = symm_ref_capacity(&w->cfg);
    for (int p = 0; p < w->cfg.world; p++) {
        CHECK(w->recv[p].rows == 0, "rank %d: rows set to %lld by a rejected call", p, (long long)w->recv[p].rows);
        check_unwritten(w, p, 0, cap, "rejected call");
        CHECK(all_poison(w->recv[p].expert_count, (size_t)local_experts(&w->cfg) * 4),
              "rank %d: expert_count written by a rejected call", p);
    }
}

/* After a dispatch, repoison leaves every array as recv_alloc did (rows and
 * dropped 0, every byte poison), and a second dispatch into the same
 * buffers with fresh inputs follows the contract again. */
Test(config, recv_repoison_restores_the_fresh_buffers_for_another_dispatch)
{
    for (int i = 0; i < 30; i++) {
        tworld w;
        const symm_ref_config c = dispatched_random_world(&w);
        for (int p = 0; p < c.world; p++) {
            CHECK(symm_ref_recv_repoison(&c, &w.recv[p]) == SYMM_OK, "repoison: %s", symm_last_error());
            CHECK(w.recv[p].dropped == 0, "rank %d: dropped left at %lld", p, (long long)w.recv[p].dropped);
            CHECK(all_poison(w.recv[p].expert_offset, (size_t)local_experts(&c) * 4),
                  "rank %d: expert_offset not poisoned again", p);
        }
        check_nothing_written(&w);
        /* The same buffers serve a fresh world's inputs. */
        world_free_inputs(&w);
        world_inputs(&w, &GEN_PLAIN, 0);
        dispatch_and_check(&w);
        world_free(&w);
    }
}

Test(config, recv_repoison_refuses_a_recv_that_does_not_match_leaving_it)
{
    symm_ref_config c = random_config();
    symm_ref_recv r;
    CHECK(symm_ref_recv_alloc(&c, &r) == SYMM_OK, "alloc: %s", symm_last_error());
    CHECK(symm_ref_recv_repoison(&c, NULL) == SYMM_ERR_INVALID_ARG, "NULL recv accepted");
    r.capacity += 1;
    CHECK(symm_ref_recv_repoison(&c, &r) == SYMM_ERR_INVALID_ARG && strstr(symm_last_error(), "capacity"),
          "a recv of another capacity accepted: %s", symm_last_error());
    r.capacity -= 1;
    r.rows = r.capacity + 1;
    CHECK(symm_ref_recv_repoison(&c, &r) == SYMM_ERR_INVALID_ARG && r.rows == r.capacity + 1,
          "rows past capacity accepted or changed");
    r.rows = 0;
    void *x = r.x;
    r.x = NULL;
    CHECK(symm_ref_recv_repoison(&c, &r) == SYMM_ERR_INVALID_ARG && strstr(symm_last_error(), "x is NULL"),
          "a NULL x accepted: %s", symm_last_error());
    r.x = x;
    symm_ref_recv_free(&r);
}

Test(config, dispatch_rejects_bad_calls_writing_nothing)
{
    symm_ref_config cfg = random_config();
    gen g = GEN_PLAIN;
    g.empty = 0;
    tworld w;
    world_make(&w, &cfg, &g, 0);
    int s = rnd(cfg.world), T = w.in[s].tokens;
    w.in[s].tokens = cfg.max_tokens + 1;
    expect_rejected(&w, "tokens > max_tokens", msgf("in[%d].tokens %d", s, cfg.max_tokens + 1));
    w.in[s].tokens = -1;
    expect_rejected(&w, "tokens < 0", msgf("in[%d].tokens -1", s));
    w.in[s].tokens = T;
    int p = rnd(cfg.world);
    w.recv[p].capacity--;
    expect_rejected(&w, "wrong capacity", msgf("recv[%d].capacity", p));
    w.recv[p].capacity++;
    void *x = w.recv[p].x;
    w.recv[p].x = NULL;
    expect_rejected(&w, "NULL recv x", msgf("recv[%d].x", p));
    w.recv[p].x = x;
    w.cfg.topk = 0;
    expect_rejected(&w, "bad config", "topk");
    w.cfg.topk = cfg.topk;
    CHECK(symm_ref_dispatch(&w.cfg, NULL, w.recv, NULL) == SYMM_ERR_INVALID_ARG, "NULL in accepted");
    CHECK(symm_ref_dispatch(&w.cfg, w.in, NULL, NULL) == SYMM_ERR_INVALID_ARG, "NULL recv accepted");
    check_nothing_written(&w);
    /* And the same world is fine once the call is right; NULL stats too. */
    symm_status st = symm_ref_dispatch(&w.cfg, w.in, w.recv, NULL);
    CHECK(st == SYMM_OK, "valid dispatch: %s", symm_last_error());
    world_free(&w);
}

Test(config, combine_rejects_inputs_that_do_not_match_recv)
{
    symm_ref_config cfg = random_config();
    gen g = { 0, 0, -1, 0 };
    tworld w;
    world_make(&w, &cfg, &g, 0);
    int s = rnd(cfg.world);
    if (w.in[s].tokens == 0) { /* make sure rank s sends something */
        token_inputs(&w, s, 1, 0);
        gen_row(&cfg, &g, w.idx[s]);
    }
    CHECK(world_dispatch(&w) == SYMM_OK, "dispatch: %s", symm_last_error());
    tcombine cb = { 0 };
    random_y(&w, &cb);
    w.in[s].tokens--;
    symm_status st = run_combine(&w, &cb);
    CHECK(st == SYMM_ERR_INVALID_ARG && strstr(symm_last_error(), "symm_ref_combine") &&
              strstr(symm_last_error(), "rows"),
          "combine with one token fewer: %s: %s", symm_status_name(st), symm_last_error());
    w.in[s].tokens++;
    void *out = cb.out[s];
    cb.out[s] = NULL;
    st = symm_ref_combine(&w.cfg, w.in, w.recv, (const void *const *)cb.y, cb.out);
    CHECK(st == SYMM_ERR_INVALID_ARG && strstr(symm_last_error(), msgf("out[%d]", s)),
          "combine with NULL out: %s", symm_last_error());
    cb.out[s] = out;
    combine_free(&w, &cb);
    world_free(&w);
}

/* ---- conversions ------------------------------------------------------------------ */

/* fp16 value of bits h, computed the long way in double. */
static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

Test(convert, bf16_decode_and_round_trip_for_all_patterns)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = symm_bf16_to_f32((uint16_t)h);
        CHECK(f32_bits(f) == h << 16, "bf16 0x%04x decodes to 0x%08x", h, f32_bits(f));
        uint16_t back = symm_f32_to_bf16(f);
        CHECK(isnan(f) ? back == 0x7fff : back == h, "bf16 0x%04x -> %a -> 0x%04x", h, f, back);
    }
}

Test(convert, fp16_decode_and_round_trip_for_all_patterns)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = symm_f16_to_f32((uint16_t)h);
        double want = f16_value((uint16_t)h);
        CHECK(isnan(want) ? isnan(f) : ((double)f == want && !signbit(f) == !signbit(want)),
              "fp16 0x%04x decodes to %a, expected %a", h, f, want);
        uint16_t back = symm_f32_to_f16(f);
        CHECK(isnan(f) ? back == 0x7fff : back == h, "fp16 0x%04x -> %a -> 0x%04x", h, f, back);
    }
}

Test(convert, f32_to_bf16_rounds_ties_to_even_and_overflows_to_inf)
{
    static const uint32_t cases[][2] = {
        { 0x3F808000, 0x3F80 }, { 0x3F818000, 0x3F82 }, { 0x3F808001, 0x3F81 }, { 0x3F807FFF, 0x3F80 },
        { 0xBF808000, 0xBF80 }, { 0xBF818000, 0xBF82 }, { 0x7F7FFFFF, 0x7F80 }, { 0x7F7F8000, 0x7F80 },
        { 0x7F7E8000, 0x7F7E }, { 0xFF7FFFFF, 0xFF80 }, { 0x00008000, 0x0000 }, { 0x00018000, 0x0002 },
        { 0x80000000, 0x8000 }, { 0x7F800000, 0x7F80 }, { 0xFF800000, 0xFF80 }, { 0x7FC00001, 0x7FFF },
        { 0xFF800001, 0x7FFF }, { 0x7F800001, 0x7FFF },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = symm_f32_to_bf16(bits_f32(cases[i][0]));
        CHECK(got == cases[i][1], "0x%08x -> 0x%04x, expected 0x%04x", cases[i][0], got, cases[i][1]);
    }
}

Test(convert, f32_to_f16_rounds_ties_to_even_subnormals_and_overflow)
{
    static const uint32_t cases[][2] = {
        { 0x3F801000, 0x3C00 }, /* 1 + 2^-11: tie, down to even */
        { 0x3F803000, 0x3C02 }, /* 1 + 3 * 2^-11: tie, up to even */
        { 0x3F801001, 0x3C01 }, { 0xBF803000, 0xBC02 },
        { 0x477FE000, 0x7BFF }, /* 65504 */
        { 0x477FEFFF, 0x7BFF }, /* just below 65520 */
        { 0x477FF000, 0x7C00 }, /* 65520: tie with 65536, odd, to inf */
        { 0xC77FF000, 0xFC00 }, { 0x501502F9, 0x7C00 }, /* 1e10 */
        { 0x33800000, 0x0001 }, /* 2^-24 */
        { 0x33000000, 0x0000 }, /* 2^-25: tie, to even 0 */
        { 0x33000001, 0x0001 }, { 0x33C00000, 0x0002 }, /* 3 * 2^-25: tie, up to 2 */
        { 0x387FE000, 0x0400 }, /* 1023.5 * 2^-24: tie, up to the smallest normal */
        { 0x387FC000, 0x03FF }, { 0x38800000, 0x0400 }, { 0x80000000, 0x8000 }, { 0x0DA24260, 0x0000 }, /* 1e-30 */
        { 0x8DA24260, 0x8000 }, { 0x00000001, 0x0000 }, { 0x7F800000, 0x7C00 }, { 0xFF800000, 0xFC00 },
        { 0x7FC00000, 0x7FFF }, { 0xFFC00001, 0x7FFF },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = symm_f32_to_f16(bits_f32(cases[i][0]));
        CHECK(got == cases[i][1], "0x%08x (%a) -> 0x%04x, expected 0x%04x", cases[i][0], bits_f32(cases[i][0]),
              got, cases[i][1]);
    }
}

/* Nearest of two neighbours (a < b, both as codes), ties to the even code. */
static uint32_t nearest(double v, double va, uint32_t a, double vb, uint32_t b)
{
    double da = v - va, db = vb - v;
    return da < db ? a : db < da ? b : ((a & 1) ? b : a);
}

/* Random floats against a slow reference: bracket |f| between neighbouring
 * codes (by decoding them) and take the nearer, ties to even. */
Test(convert, random_floats_round_to_the_nearest_even_bf16_and_fp16)
{
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rnd64();
        if (chance(80)) /* mostly fp16's range: exponents 2^-26 .. 2^17 */
            u = (u & 0x807fffffu) | ((uint32_t)(101 + rnd(44)) << 23);
        float f = bits_f32(u);
        if (isnan(f))
            continue;
        double v = fabs((double)f);
        uint32_t sign = u >> 31;
        /* bf16: truncation and the next code up. */
        uint32_t a = (u & 0x7fffffffu) >> 16;
        double va = (double)fabsf(symm_bf16_to_f32((uint16_t)a));
        double vb = a + 1 == 0x7f80 ? ldexp(1.0, 128) : (double)symm_bf16_to_f32((uint16_t)(a + 1));
        uint32_t want = va == v ? a : nearest(v, va, a, vb, a + 1);
        uint16_t got = symm_f32_to_bf16(f);
        CHECK(isinf(f) || got == (sign << 15 | want), "bf16 of %a (0x%08x): 0x%04x, expected 0x%04x", f, u, got,
              sign << 15 | want);
        /* fp16: binary search over the ordered codes 0..0x7c00 (0x7c00 as 2^16). */
        uint32_t lo = 0, hi = 0x7c00;
        while (hi - lo > 1) {
            uint32_t mid = (lo + hi) / 2;
            if (f16_value((uint16_t)mid) <= v)
                lo = mid;
            else
                hi = mid;
        }
        double vlo = f16_value((uint16_t)lo), vhi = hi == 0x7c00 ? 65536.0 : f16_value((uint16_t)hi);
        want = v >= 65536.0 ? 0x7c00 : vlo == v ? lo : nearest(v, vlo, lo, vhi, hi);
        got = symm_f32_to_f16(f);
        CHECK(got == (sign << 15 | want), "fp16 of %a (0x%08x): 0x%04x, expected 0x%04x", f, u, got,
              sign << 15 | want);
    }
}

Test(convert, e4m3_decode_and_round_trip_for_all_patterns)
{
    for (uint32_t v = 0; v < 256; v++) {
        float f = symm_e4m3_to_f32((uint8_t)v);
        if ((v & 0x7f) == 0x7f) {
            CHECK(isnan(f), "e4m3 0x%02x should be NaN, got %a", v, f);
            CHECK(symm_f32_to_e4m3(f) == 0x7f, "NaN does not go back to 0x7f");
            continue;
        }
        int e = (v >> 3) & 15, m = v & 7;
        double want = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
        want = (v & 0x80) ? -want : want;
        CHECK((double)f == want && !signbit(f) == !signbit(want), "e4m3 0x%02x decodes to %a, expected %a", v, f,
              want);
        CHECK(symm_f32_to_e4m3(f) == v, "e4m3 0x%02x -> %a -> 0x%02x", v, f, symm_f32_to_e4m3(f));
    }
    CHECK(symm_e4m3_to_f32(0x7e) == 448.0f && symm_e4m3_to_f32(0x01) == ldexpf(1, -9) &&
              symm_e4m3_to_f32(0x08) == ldexpf(1, -6),
          "e4m3 landmarks wrong");
}

Test(convert, f32_to_e4m3_rounds_ties_to_even_and_saturates)
{
    static const struct {
        float f;
        uint8_t want;
    } cases[] = {
        { 448.0f, 0x7e }, { 464.0f, 0x7e }, /* tie with 480: even is 448 */
        { 470.0f, 0x7e }, { 1e9f, 0x7e }, { INFINITY, 0x7e }, { -INFINITY, 0xfe }, { -500.0f, 0xfe },
        { NAN, 0x7f }, { 0x1p-10f, 0x00 }, /* half the smallest subnormal: tie to 0 */
        { 0x1.8p-9f, 0x02 }, /* 1.5 units: tie up to 2 */
        { 0x1.01p-10f, 0x01 }, { 1.0625f, 0x38 }, /* 1 + 1/16: tie down to 1.0 */
        { 1.1875f, 0x3a }, /* tie up to 1.25 */
        { 0x1.ep-7f, 0x08 }, /* 7.5 units of 2^-9: tie up to the smallest normal */
        { -0.0f, 0x80 }, { 0x1p-30f, 0x00 }, { -0x1p-30f, 0x80 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t got = symm_f32_to_e4m3(cases[i].f);
        CHECK(got == cases[i].want, "%a -> 0x%02x, expected 0x%02x", cases[i].f, got, cases[i].want);
    }
    for (int i = 0; i < 100000; i++) {
        float f = ldexpf(rough_value(), rnd(24) - 14);
        double v = fabs((double)f);
        uint32_t lo = 0;
        while (lo < 0x7e && (double)symm_e4m3_to_f32((uint8_t)(lo + 1)) <= v)
            lo++;
        uint32_t want = v >= 448.0 ? 0x7e
                        : (double)symm_e4m3_to_f32((uint8_t)lo) == v
                            ? lo
                            : nearest(v, symm_e4m3_to_f32((uint8_t)lo), lo, symm_e4m3_to_f32((uint8_t)(lo + 1)), lo + 1);
        want |= signbit(f) ? 0x80 : 0;
        CHECK(symm_f32_to_e4m3(f) == want, "e4m3 of %a: 0x%02x, expected 0x%02x", f, symm_f32_to_e4m3(f), want);
    }
}

/* ---- across hosts (cfg.hosts) ------------------------------------------------ */

/* The hybrid backend built literally from one-host references: each
 * source forwards its tokens with an expert on host g to the proxy (g, its
 * local index), ordered by source host then token, ids rewritten to g's
 * experts; each host runs the one-host reference of the companion (world
 * L, experts E / H, H * max_tokens, the same capacity); combine returns
 * each host's output row to the source, which sums them over hosts
 * ascending in fp32 and rounds once. cfg.hosts must give the same rows,
 * the same sources (mapped back), counts and sums, bit for bit. */
typedef struct fwd_src {
    int s, t;
} fwd_src;

static void hosts_composed_check(const tworld *w)
{
    const symm_ref_config *c = &w->cfg;
    const int H = c->hosts, L = c->world / H, Eh = c->experts / H, K = c->topk;
    const size_t xb = x_row_bytes(c), cb = (size_t)c->hidden * dsize(c->combine_dtype);
    const int blocks = c->dtype == SYMM_DTYPE_FP8_E4M3 ? scale_blocks(c) : 0;
    symm_ref_config cc = *c;
    cc.world = L;
    cc.experts = Eh;
    cc.max_tokens = H * c->max_tokens;
    cc.hosts = 0;
    cc.capacity = symm_ref_capacity(c);
    CHECK(symm_ref_check_config(&cc) == SYMM_OK, "companion config: %s", symm_last_error());
    CHECK(symm_ref_capacity(&cc) == symm_ref_capacity(c), "the companion's capacity differs");
    /* y on the hybrid's rows: random, the same array for the companion. */
    tcombine ycb = { 0 };
    random_y(w, &ycb);
    tcombine got = { 0 };
    memcpy(got.y, ycb.y, sizeof got.y);
    CHECK(run_combine(w, &got) == SYMM_OK, "combine with hosts: %s", symm_last_error());
    /* Per host: the proxies' forwarded tokens, the companion's dispatch and combine. */
    void *part[MAXW][MAXW] = { { 0 } };   /* [g][l]: the proxy's combine output */
    int *slot[MAXW][MAXW] = { { 0 } };    /* [g][s]: token t of s -> forwarded index at (g, l_s), or -1 */
    for (int g = 0; g < H; g++) {
        symm_ref_input fin[MAXW];
        symm_ref_recv frecv[MAXW];
        fwd_src *fsrc[MAXW];
        void *fx[MAXW];
        float *fsc[MAXW], *fw[MAXW];
        int32_t *fidx[MAXW];
        for (int l = 0; l < L; l++) {
            size_t cap = (size_t)H * c->max_tokens;
            fx[l] = malloc(cap * xb + 1);
            fsc[l] = malloc(cap * (size_t)(blocks + 1) * sizeof(float));
            fw[l] = malloc(cap * K * sizeof(float));
            fidx[l] = malloc(cap * K * sizeof(int32_t));
            fsrc[l] = malloc(cap * sizeof(fwd_src));
            int n = 0;
            for (int h = 0; h < H; h++) {
                const int s = h * L + l;
                slot[g][s] = malloc(((size_t)w->in[s].tokens + 1) * sizeof(int));
                for (int t = 0; t < w->in[s].tokens; t++) {
                    const int32_t *row = token_row(w, s, t);
                    int here = 0;
                    for (int k = 0; k < K; k++)
                        here |= entry_valid(row, k, c->experts) && row[k] / Eh == g;
                    slot[g][s][t] = here ? n : -1;
                    if (!here)
                        continue;
                    memcpy((char *)fx[l] + (size_t)n * xb, (const char *)w->x[s] + (size_t)t * xb, xb);
                    if (blocks)
                        memcpy(fsc[l] + (size_t)n * blocks, w->scales[s] + (size_t)t * blocks, blocks * sizeof(float));
                    memcpy(fw[l] + (size_t)n * K, w->tw[s] + (size_t)t * K, K * sizeof(float));
                    for (int k = 0; k < K; k++)
                        fidx[l][(size_t)n * K + k] =
                            entry_valid(row, k, c->experts) && row[k] / Eh == g ? row[k] - g * Eh : -1;
                    fsrc[l][n++] = (fwd_src){ s, t };
                }
            }
            fin[l] = (symm_ref_input){ n, fx[l], blocks ? fsc[l] : NULL, fidx[l], fw[l] };
            CHECK(symm_ref_recv_alloc(&cc, &frecv[l]) == SYMM_OK, "alloc: %s", symm_last_error());
        }
        symm_status st = symm_ref_dispatch(&cc, fin, frecv, NULL);
        CHECK(st == SYMM_OK || st == SYMM_ERR_OVERFLOW, "companion dispatch: %s", symm_last_error());
        /* The hybrid's rows on host g are the companion's, sources mapped back. */
        for (int j = 0; j < L; j++) {
            const symm_ref_recv *a = &w->recv[g * L + j], *b = &frecv[j];
            const int p = g * L + j;
            CHECK(a->rows == b->rows && a->dropped == b->dropped, "rank %d: rows %lld dropped %lld, the composed "
                  "backend %lld and %lld", p, (long long)a->rows, (long long)a->dropped, (long long)b->rows,
                  (long long)b->dropped);
            CHECK(!memcmp(a->expert_count, b->expert_count, (size_t)local_experts(c) * 4) &&
                  !memcmp(a->expert_offset, b->expert_offset, (size_t)local_experts(c) * 4),
                  "rank %d: expert counts or offsets differ", p);
            for (int64_t r = 0; r < a->rows; r++) {
                if (!row_written(w, p, r)) /* padding: unwritten in both */
                    continue;
                const int32_t *bs = b->src + (size_t)r * 4;
                const fwd_src o = fsrc[bs[0]][bs[1]];
                const int32_t want[4] = { o.s, o.t, bs[2], 0 };
                CHECK(!memcmp(a->src + (size_t)r * 4, want, 16), "rank %d row %lld: src {%d, %d, %d}, the composed "
                      "backend {%d, %d, %d}", p, (long long)r, a->src[r * 4], a->src[r * 4 + 1], a->src[r * 4 + 2],
                      want[0], want[1], want[2]);
                CHECK(!memcmp((char *)a->x + r * xb, (char *)b->x + r * xb, xb), "rank %d row %lld: x", p, (long long)r);
                if (blocks)
                    CHECK(!memcmp(a->scales + r * blocks, b->scales + r * blocks, blocks * sizeof(float)), "scales");
                if (c->layout == SYMM_LAYOUT_RANK)
                    CHECK(!memcmp(a->topk_idx + r * K, b->topk_idx + r * K, K * 4), "rank %d row %lld: topk", p,
                          (long long)r);
                if (c->weights) {
                    size_t wn = c->layout == SYMM_LAYOUT_RANK ? (size_t)K : 1;
                    CHECK(!memcmp(a->weights + r * wn, b->weights + r * wn, wn * 4), "weights");
                }
            }
        }
        /* The companion's combine: the proxies' rows. */
        const void *yg[MAXW];
        void *outg[MAXW];
        for (int j = 0; j < L; j++) {
            yg[j] = ycb.y[g * L + j];
            outg[j] = part[g][j] = malloc((size_t)fin[j].tokens * cb + 1);
        }
        CHECK(symm_ref_combine(&cc, fin, frecv, yg, outg) == SYMM_OK, "companion combine: %s", symm_last_error());
        for (int l = 0; l < L; l++) {
            symm_ref_recv_free(&frecv[l]);
            free(fx[l]);
            free(fsc[l]);
            free(fw[l]);
            free(fidx[l]);
            free(fsrc[l]);
        }
    }
    /* The source: sum over hosts ascending of the returned rows, fp32, rounded once. */
    for (int s = 0; s < c->world; s++) {
        const int l = s % L;
        for (int t = 0; t < w->in[s].tokens; t++)
            for (int h = 0; h < c->hidden; h++) {
                float acc = 0.0f;
                for (int g = 0; g < H; g++)
                    if (slot[g][s][t] >= 0)
                        acc = acc + load_value(c->combine_dtype, part[g][l], (size_t)slot[g][s][t] * c->hidden + h);
                store_value(c->combine_dtype, got.want[s], (size_t)t * c->hidden + h, acc);
            }
    }
    check_outputs(w, &got, "combine with hosts");
    for (int g = 0; g < H; g++)
        for (int i = 0; i < c->world; i++) {
            free(part[g][i]);
            free(slot[g][i]);
        }
    combine_free(w, &got);
}

Test(hosts, rows_and_sums_are_the_hybrid_built_from_one_host_references)
{
    seed();
    static const int shapes[][2] = { { 2, 2 }, { 4, 2 }, { 4, 4 }, { 6, 2 }, { 6, 3 }, { 8, 2 }, { 8, 4 } };
    for (int iter = 0; iter < 300; iter++) {
        symm_ref_config c = random_config();
        const int *sh = shapes[rnd(7)];
        c.world = sh[0];
        c.hosts = sh[1];
        c.experts = c.world * (1 + rnd(4));
        int max_k = c.experts < SYMM_REF_MAX_TOPK ? c.experts : SYMM_REF_MAX_TOPK;
        max_k = c.experts / c.hosts < max_k ? c.experts / c.hosts : max_k; /* the companion's experts */
        c.topk = 1 + rnd(max_k < 6 ? max_k : 6);
        c.combine_order = SYMM_COMBINE_ORDER_RANK;
        if (chance(30))
            c.capacity = 1 + rnd((int)symm_ref_worst_capacity(&c));
        const gen g = { 10, chance(30) ? 5 : 0, -1, 15 };
        tworld w;
        world_make(&w, &c, &g, 0);
        symm_status st = world_dispatch(&w);
        CHECK(st == SYMM_OK || st == SYMM_ERR_OVERFLOW, "dispatch with hosts: %s", symm_last_error());
        for (int s = 0; s < c.world; s++)
            CHECK(w.stats[s].invalid == invalid_of(&w, s), "rank %d: invalid %lld, expected %lld", s,
                  (long long)w.stats[s].invalid, (long long)invalid_of(&w, s));
        hosts_composed_check(&w);
        world_free(&w);
    }
}

/* W = 4 on 2 hosts (ranks 0, 1 | 2, 3), one expert a rank, K = 3, bf16.
 * Every rank's token 0 chooses expert 0; rank 0's also experts 1 and 2.
 * On rank 0 the rows come by (local index, host, token): from ranks 0, 2,
 * 1, 3 (one host: 0, 1, 2, 3). Rank 0's token gets y = 1 from rank 0 and
 * 2^-8 from ranks 1 and 2: one host sums 1 + 2^-8 + 2^-8 = 1 + 2^-7 (a
 * bf16); across hosts host 0's part 1 + 2^-8 rounds (a tie, to even) to 1,
 * host 1's is 2^-8, and 1 + 2^-8 rounds to 1 again. */
Test(hosts, hand_worked_order_and_rounding_differ_from_one_host)
{
    static const int32_t r0[] = { 0, 1, 2 }, r1[] = { 0, -1, -1 }, r2[] = { 0, -1, -1 }, r3[] = { 0, -1, -1 };
    static const int32_t *const rows[] = { r0, r1, r2, r3 };
    static const int tokens[] = { 1, 1, 1, 1 };
    for (int hosts = 0; hosts <= 2; hosts += 2) {
        symm_ref_config c = { .hidden = 16, .topk = 3, .experts = 4, .world = 4, .max_tokens = 1,
                              .dtype = SYMM_DTYPE_BF16, .combine_dtype = SYMM_DTYPE_BF16, .layout = SYMM_LAYOUT_RANK,
                              .weights = 0, .align = 1, .hosts = hosts };
        tworld w;
        world_from_rows(&w, &c, tokens, rows);
        CHECK(world_dispatch(&w) == SYMM_OK, "dispatch: %s", symm_last_error());
        const int order[2][4] = { { 0, 1, 2, 3 }, { 0, 2, 1, 3 } };
        CHECK(w.recv[0].rows == 4, "rank 0: %lld rows, expected 4", (long long)w.recv[0].rows);
        for (int r = 0; r < 4; r++)
            CHECK(w.recv[0].src[r * 4] == order[hosts / 2][r] && w.recv[0].src[r * 4 + 1] == 0,
                  "hosts %d: rank 0 row %d comes from rank %d, expected %d", hosts, r, w.recv[0].src[r * 4],
                  order[hosts / 2][r]);
        CHECK(w.recv[1].rows == 1 && w.recv[2].rows == 1 && w.recv[3].rows == 0, "rows on ranks 1..3");
        tcombine cb = { 0 };
        for (int p = 0; p < 4; p++) {
            cb.y[p] = calloc((size_t)symm_ref_capacity(&c) * 16, 2);
            const float v = p == 0 ? 1.0f : 0x1p-8f;
            for (int h = 0; h < 16; h++)
                store_value(SYMM_DTYPE_BF16, cb.y[p], (size_t)h, v); /* row 0 on every rank: rank 0's token */
        }
        CHECK(run_combine(&w, &cb) == SYMM_OK, "combine: %s", symm_last_error());
        const float want = hosts ? 1.0f : 1.0f + 0x1p-7f;
        for (int h = 0; h < 16; h++)
            CHECK(load_value(SYMM_DTYPE_BF16, cb.out[0], (size_t)h) == want, "hosts %d: element %d is %a, expected %a",
                  hosts, h, load_value(SYMM_DTYPE_BF16, cb.out[0], (size_t)h), want);
        combine_free(&w, &cb);
        world_free(&w);
    }
}

Test(hosts, config_checks_name_hosts)
{
    symm_ref_config c = { .hidden = 16, .topk = 2, .experts = 8, .world = 4, .max_tokens = 4,
                          .dtype = SYMM_DTYPE_BF16, .combine_dtype = SYMM_DTYPE_BF16, .layout = SYMM_LAYOUT_EXPERT,
                          .weights = 1, .align = 1 };
    const struct { int hosts; symm_combine_order order; const char *needle; } cases[] = {
        { 3, SYMM_COMBINE_ORDER_RANK, "hosts 3: expected 0 or 1 (one host), or a host count 2..4 that divides world 4" },
        { 8, SYMM_COMBINE_ORDER_RANK, "hosts 8: expected 0 or 1" },
        { -1, SYMM_COMBINE_ORDER_RANK, "hosts -1: expected 0 or 1" },
        { 2, SYMM_COMBINE_ORDER_K, "combine_order k with hosts 2: expected rank" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        c.hosts = cases[i].hosts;
        c.combine_order = cases[i].order;
        CHECK(symm_ref_check_config(&c) == SYMM_ERR_INVALID_ARG, "case %zu accepted", i);
        CHECK(strstr(symm_last_error(), cases[i].needle), "case %zu: \"%s\" lacks \"%s\"", i, symm_last_error(),
              cases[i].needle);
    }
    for (int h = 0; h <= 4; h += h == 2 ? 2 : 1) {
        c.hosts = h;
        c.combine_order = SYMM_COMBINE_ORDER_RANK;
        CHECK(h == 3 || symm_ref_check_config(&c) == SYMM_OK, "hosts %d refused: %s", h, symm_last_error());
    }
}
