/* test_variant.c: the host API contract of a created variant (symm_variant.h)
 * and how dispatch and combine fail, where tests/gpu/check.c covers the
 * results over a matrix of routings. One binary is one rank:
 *
 *     SYMM_TEST_MANIFEST=out/default/manifest.json \
 *         symmrun -n 2 --gpus 0,1 -- build/tests-gpu/test_variant --jobs 1
 *
 * (and -n 4: two ranks per GPU). Every Test joins its own world (the job id
 * plus a tag), opens the smallest variant of the manifest that fits what it
 * needs and whose world is the world's size, makes the same collective calls
 * in the same order on every rank, and leaves through a barrier. Results are
 * compared bit for bit with the CPU reference (symm_ref.h) on fresh random
 * inputs that every rank generates for the whole world from one shared seed.
 * Without a GPU or SYMM_TEST_MANIFEST every test prints why and skips. */
#include <inttypes.h>

#include "heap_test.h"
#include "moe_inputs.h"
#include "symm_manifest.h"
#include "symm_nccl.h"
#include "symm_ref.h"
#include "symm_variant.h"

#define POISON 0xA5
#define MAX_W SYMM_REF_MAX_WORLD

/* ---- random inputs (streams per (seed, a, b): tests/support/moe_inputs.h) ---- */

/* K distinct experts, about one entry in ten masked with -1. */
static void random_topk_row(moe_rng *s, int experts, int topk, int32_t *row)
{
    for (int k = 0; k < topk; k++) {
        int e;
        do {
            e = (int)(moe_rng_next(s) % (uint64_t)experts);
        } while (moe_row_has(row, k, e));
        row[k] = e;
    }
    for (int k = 0; k < topk; k++)
        if (moe_rng_next(s) % 10 == 0)
            row[k] = -1;
}

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    cr_assert(p != NULL, "rank %d: out of host memory (%zu bytes)", test_rank, n);
    return p;
}

/* ---- choosing a variant ------------------------------------------------------ */

/* What a test needs of its variant; -1: anything. */
typedef struct want {
    int layout, weights, fp8;
    int other_world; /* 1: a variant for another world size than this one */
    int combine;     /* symm_combine_mode: 0 push, 1 pull (y in the variant's symmetric buffer),
                        2 auto (both forms, by where y lies) */
} want;

static const want ANY = {-1, -1, -1, 0, 0};

static bool fits(const symm_variant_desc *d, int world, want w)
{
    if (w.other_world ? d->world == world : d->world != world)
        return false;
    /* Full capacity, so that a random routing never drops rows. */
    if (d->capacity != d->worst_capacity)
        return false;
    return (w.layout < 0 || (int)d->layout == w.layout) && (w.weights < 0 || d->weights == w.weights) &&
           (w.fp8 < 0 || (d->dtype == SYMM_DTYPE_FP8_E4M3) == w.fp8) && (int)d->combine == w.combine;
}

/* The variant of the manifest with the smallest symmetric buffer that fits w
 * (the same choice on every rank); its name in name, its world in *world_out.
 * false when none does. */
static bool pick_variant(const char *manifest, int world, want w, char *name, size_t cap, int *world_out)
{
    symm_manifest *m;
    symm_status st = symm_manifest_open(manifest, &m);
    cr_assert(st == SYMM_OK, "rank %d: symm_manifest_open(%s): %s: %s", test_rank, manifest,
              symm_status_name(st), symm_last_error());
    uint64_t best = UINT64_MAX;
    for (size_t i = 0; i < symm_manifest_count(m); i++) {
        const symm_variant_desc *d;
        st = symm_manifest_variant(m, symm_manifest_name(m, i), &d);
        cr_assert(st == SYMM_OK, "rank %d: symm_manifest_variant(%s): %s: %s", test_rank,
                  symm_manifest_name(m, i), symm_status_name(st), symm_last_error());
        if (fits(d, world, w) && d->symmetric_bytes < best) {
            best = d->symmetric_bytes;
            snprintf(name, cap, "%s", d->name);
            if (world_out)
                *world_out = d->world;
        }
    }
    symm_manifest_close(m);
    return best != UINT64_MAX;
}

/* ---- one test's rank ------------------------------------------------------------ */

typedef struct vt {
    rank_ctx c;             /* world and this test's own device (keeps the context alive) */
    const char *manifest;
    char name[64];          /* the variant picked for the test */
    symm_variant *v;
    const symm_variant_desc *d;
    CUstream stream;
    unsigned long long seed; /* shared by every rank */
} vt;

static const char *manifest_or_skip(void)
{
    const char *m = getenv("SYMM_TEST_MANIFEST");
    if (!m || !*m) {
        printf("skipped: SYMM_TEST_MANIFEST not set (the manifest.json of specs/default.lua)\n");
        fflush(stdout);
        cr_skip_test("SYMM_TEST_MANIFEST not set");
    }
    return m;
}

/* Join this test's world (job id plus tag, with a timeout of at least
 * min_timeout_s) and open the rank's GPU. */
static void join(rank_ctx *c, const char *tag, double min_timeout_s)
{
    symm_world_config cfg;
    symm_status st = symm_world_config_from_env(&cfg);
    cr_assert(st == SYMM_OK, "symm_world_config_from_env: %s: %s (run this binary through symmrun -n N)",
              symm_status_name(st), symm_last_error());
    char job[256];
    snprintf(job, sizeof job, "%s.variant.%s", cfg.job_id ? cfg.job_id : "variant-test", tag);
    cfg.job_id = job;
    if (cfg.timeout_s < min_timeout_s)
        cfg.timeout_s = min_timeout_s;
    st = symm_world_create(&cfg, &c->world);
    cr_assert(st == SYMM_OK, "rank %d: symm_world_create (job %s): %s: %s", cfg.rank, job,
              symm_status_name(st), symm_last_error());
    c->rank = test_rank = symm_world_rank(c->world);
    c->ranks = symm_world_size(c->world);
    EXPECT_OK(symm_device_open(c->world, &c->dev));
}

/* Everything a test needs before its variant: skips (alike on every rank)
 * without a GPU, a manifest or a variant that fits w. */
static void vt_setup(vt *t, const char *tag, want w, double min_timeout_s)
{
    memset(t, 0, sizeof *t);
    SKIP_WITHOUT_GPU();
    t->manifest = manifest_or_skip();
    join(&t->c, tag, min_timeout_s);
    if (!pick_variant(t->manifest, t->c.ranks, w, t->name, sizeof t->name, NULL)) {
        printf("skipped: %s has no full-capacity variant of world %d with layout %d, weights %d, fp8 %d "
               "(-1: any)\n", t->manifest, t->c.ranks, w.layout, w.weights, w.fp8);
        fflush(stdout);
        rank_end(&t->c);
        cr_skip_test("no variant fits");
    }
    t->seed = shared_seed(t->c.world);
    CU_OK(cuStreamCreate(&t->stream, CU_STREAM_NON_BLOCKING));
}

/* Collective. */
static void vt_open(vt *t, const symm_variant_options *o)
{
    symm_status st = symm_variant_open(t->c.world, t->manifest, t->name, o, &t->v);
    cr_assert(st == SYMM_OK, "rank %d: symm_variant_open(%s): %s: %s", t->c.rank, t->name,
              symm_status_name(st), symm_last_error());
    t->d = symm_variant_describe(t->v);
}

/* Collective. */
static void vt_close(vt *t)
{
    symm_status st = symm_variant_destroy(t->v);
    cr_assert(st == SYMM_OK, "rank %d: symm_variant_destroy(%s): %s: %s", t->c.rank, t->name,
              symm_status_name(st), symm_last_error());
    t->v = NULL;
    t->d = NULL;
}

static void vt_finish(vt *t)
{
    CU_OK(cuStreamDestroy(t->stream));
    rank_end(&t->c);
}

static symm_variant_options native_options(void)
{
    symm_variant_options o = {.backend = SYMM_BACKEND_NATIVE};
    return o;
}

/* vt_setup, then the native backend's variant (collective). */
static void vt_start(vt *t, const char *tag, want w)
{
    vt_setup(t, tag, w, 0);
    symm_variant_options o = native_options();
    vt_open(t, &o);
}

/* Collective. */
static void vt_end(vt *t)
{
    vt_close(t);
    vt_finish(t);
}

/* ---- one call of the whole world, on the CPU ---------------------------------- */

typedef struct vcase {
    symm_ref_config cfg;
    int world;
    void *x[MAX_W];
    float *scales[MAX_W], *weights[MAX_W];
    int32_t *topk[MAX_W];
    void *y[MAX_W], *out[MAX_W];
    int64_t y_rows[MAX_W];
    symm_ref_input in[MAX_W];
    symm_ref_recv recv[MAX_W];
    symm_ref_send_stats stats[MAX_W];
} vcase;

static size_t x_row(const symm_variant_desc *d) { return (size_t)d->hidden * (size_t)symm_dtype_size(d->dtype); }
static size_t y_row(const symm_variant_desc *d) { return (size_t)d->hidden * (size_t)symm_dtype_size(d->combine_dtype); }
static size_t scales_row(const symm_variant_desc *d) { return (size_t)d->hidden / SYMM_FP8_BLOCK * 4; }

/* Rank p's T rows of input from (seed, p). */
static void case_inputs(vcase *k, const symm_variant_desc *d, unsigned long long seed, int p, int tokens)
{
    const size_t T = (size_t)tokens, K = (size_t)d->topk;
    moe_rng s = moe_rng_for(seed, 1, (uint64_t)p);
    k->x[p] = xmalloc(T * x_row(d));
    moe_random_elems(&s, d->dtype, k->x[p], T * (size_t)d->hidden);
    if (d->dtype == SYMM_DTYPE_FP8_E4M3) {
        k->scales[p] = xmalloc(T * scales_row(d));
        moe_random_floats(&s, k->scales[p], T * scales_row(d) / 4, 0.01);
    }
    k->topk[p] = xmalloc(T * K * 4);
    for (size_t t = 0; t < T; t++)
        random_topk_row(&s, d->experts, d->topk, k->topk[p] + t * K);
    if (d->weights) {
        k->weights[p] = xmalloc(T * K * 4);
        moe_random_floats(&s, k->weights[p], T * K, 0.01);
    }
    k->in[p] = (symm_ref_input){tokens, k->x[p], k->scales[p], k->topk[p], k->weights[p]};
}

/* Every rank's inputs (tokens[p] rows from seed), the reference dispatch, y
 * for the rows each rank received (row r of rank p's y depends only on
 * (y_seed, p, r), so two cases with one y_seed agree on their common rows),
 * and the reference combine. */
static vcase *case_build(const symm_variant_desc *d, unsigned long long seed, unsigned long long y_seed,
                         const int *tokens)
{
    vcase *k = xmalloc(sizeof *k);
    k->world = d->world;
    k->cfg = moe_ref_config(d);
    for (int p = 0; p < k->world; p++) {
        case_inputs(k, d, seed, p, tokens[p]);
        EXPECT_OK(symm_ref_recv_alloc(&k->cfg, &k->recv[p]));
    }
    EXPECT_OK(symm_ref_dispatch(&k->cfg, k->in, k->recv, k->stats));
    for (int p = 0; p < k->world; p++) {
        moe_rng s = moe_rng_for(y_seed, 2, (uint64_t)p);
        k->y_rows[p] = k->recv[p].rows;
        k->y[p] = xmalloc((size_t)k->y_rows[p] * y_row(d));
        moe_random_elems(&s, d->combine_dtype, k->y[p], (size_t)k->y_rows[p] * (size_t)d->hidden);
        k->out[p] = xmalloc((size_t)tokens[p] * y_row(d));
    }
    EXPECT_OK(symm_ref_combine(&k->cfg, k->in, k->recv, (const void *const *)k->y, k->out));
    return k;
}

static void case_free(vcase *k)
{
    for (int p = 0; p < k->world; p++) {
        free(k->x[p]);
        free(k->scales[p]);
        free(k->topk[p]);
        free(k->weights[p]);
        free(k->y[p]);
        free(k->out[p]);
        symm_ref_recv_free(&k->recv[p]);
    }
    free(k);
}

/* T of every rank: random in 1..max_tokens (from the shared seed, so every
 * rank knows every rank's T). */
static void random_tokens(const vt *t, int *tokens, unsigned long long salt)
{
    moe_rng s = moe_rng_for(t->seed, 3, salt);
    for (int p = 0; p < t->c.ranks; p++)
        tokens[p] = 1 + (int)(moe_rng_next(&s) % (uint64_t)t->d->max_tokens);
}

/* ---- device side --------------------------------------------------------------- */

/* This rank's dispatch inputs, sized for max_tokens. */
typedef struct dev_in {
    CUdeviceptr x, scales, topk, weights, tokens;
} dev_in;

static CUdeviceptr dalloc(size_t n)
{
    CUdeviceptr p;
    CU_OK(cuMemAlloc(&p, n < 16 ? 16 : n));
    return p;
}

static void dev_in_alloc(const symm_variant_desc *d, dev_in *b)
{
    const size_t T = (size_t)d->max_tokens, K = (size_t)d->topk;
    b->x = dalloc(T * x_row(d));
    b->scales = dalloc(T * scales_row(d));
    b->topk = dalloc(T * K * 4);
    b->weights = dalloc(T * K * 4);
    b->tokens = dalloc(4);
}

static void dev_in_free(dev_in *b)
{
    CUdeviceptr ps[] = {b->x, b->scales, b->topk, b->weights, b->tokens};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        CU_OK(cuMemFree(ps[i]));
}

/* Uploads go on the variant's stream and are waited for: a copy from
 * pageable memory may return before its DMA has landed, and the variant's
 * stream does not wait for the legacy stream (CU_STREAM_NON_BLOCKING), so
 * a kernel (or a peer reading this rank's y in place) could see the bytes
 * before they arrive. */
static void upload(const vt *t, CUdeviceptr dst, const void *src, size_t n)
{
    if (n)
        CU_OK(cuMemcpyHtoDAsync(dst, src, n, t->stream));
}

static void dev_in_upload(const vt *t, const vcase *k, const dev_in *b)
{
    const symm_variant_desc *d = t->d;
    const int me = t->c.rank;
    const size_t T = (size_t)k->in[me].tokens, K = (size_t)d->topk;
    upload(t, b->x, k->x[me], T * x_row(d));
    upload(t, b->topk, k->topk[me], T * K * 4);
    if (k->scales[me])
        upload(t, b->scales, k->scales[me], T * scales_row(d));
    if (k->weights[me])
        upload(t, b->weights, k->weights[me], T * K * 4);
    int32_t t32 = (int32_t)T;
    upload(t, b->tokens, &t32, 4);
    CU_OK(cuStreamSynchronize(t->stream));
}

static CUdeviceptr y_alloc(const symm_variant_desc *d) { return dalloc((size_t)d->capacity * y_row(d)); }

static void y_upload(const vt *t, const vcase *k, CUdeviceptr y)
{
    const int me = t->c.rank;
    if (k->y_rows[me])
        upload(t, y, k->y[me], (size_t)k->y_rows[me] * y_row(t->d));
    CU_OK(cuStreamSynchronize(t->stream));
}

/* Poison the outputs (recv buffers of the variant, out) so that stale data
 * never passes for a result. */
static void poison(const vt *t, CUdeviceptr out, size_t out_bytes)
{
    const symm_variant_desc *d = t->d;
    const size_t cap = (size_t)d->capacity, K = (size_t)d->topk;
    symm_recv_buffers rb;
    EXPECT_OK(symm_variant_recv(t->v, &rb));
    CU_OK(cuMemsetD8(out, POISON, out_bytes));
    CU_OK(cuMemsetD8(rb.x, POISON, cap * x_row(d)));
    CU_OK(cuMemsetD8(rb.src, POISON, cap * 16));
    if (rb.topk_idx)
        CU_OK(cuMemsetD8(rb.topk_idx, POISON, cap * K * 4));
    if (rb.weights)
        CU_OK(cuMemsetD8(rb.weights, POISON, cap * (d->layout == SYMM_LAYOUT_RANK ? K : 1) * 4));
    if (rb.scales)
        CU_OK(cuMemsetD8(rb.scales, POISON, cap * scales_row(d)));
    CU_OK(cuCtxSynchronize());
}

/* Arguments of a correct dispatch of tokens rows (or T from device memory). */
static symm_dispatch_args good_args(const symm_variant_desc *d, const dev_in *b, int tokens, bool on_device)
{
    symm_dispatch_args a = {
        /* Ignored with tokens_dev; 0 would give other results if it were used. */
        .tokens = on_device ? 0 : tokens,
        .tokens_dev = on_device ? (const int32_t *)b->tokens : NULL,
        .x = (const void *)b->x,
        .x_scales = d->dtype == SYMM_DTYPE_FP8_E4M3 ? (const float *)b->scales : NULL,
        .topk_idx = (const int32_t *)b->topk,
        .topk_weights = d->weights ? (const float *)b->weights : NULL,
    };
    return a;
}

static void *dget(CUdeviceptr p, size_t n)
{
    void *h = xmalloc(n);
    if (n)
        CU_OK(cuMemcpyDtoH(h, p, n));
    return h;
}

/* ---- comparing with the reference ------------------------------------------------ */

static void expect_bytes(const vt *t, const char *what, const void *got, const void *want, size_t n, size_t row)
{
    const unsigned char *g = got, *w = want;
    for (size_t i = 0; i < n; i++)
        if (g[i] != w[i])
            cr_assert_fail("rank %d: %s (%s): byte %zu (row %zu) is 0x%02x, expected 0x%02x%s (seed 0x%llx)",
                           t->c.rank, what, t->name, i, row ? i / row : 0, g[i], w[i],
                           g[i] == POISON ? " (the poison: never written)" : "", t->seed);
}

static bool in_segment(const symm_ref_recv *ref, int local_experts, int64_t r)
{
    for (int j = 0; j < local_experts; j++)
        if (r >= ref->expert_offset[j] && r < (int64_t)ref->expert_offset[j] + ref->expert_count[j])
            return true;
    return false;
}

/* The last dispatch's rows, sources, top-k ids and expert counts of this rank. */
static void expect_recv(const vt *t, const vcase *k)
{
    const symm_variant_desc *d = t->d;
    const symm_ref_recv *ref = &k->recv[t->c.rank];
    const int L = d->experts / d->world, K = d->topk;
    const int64_t rows = ref->rows;
    symm_recv_buffers rb;
    EXPECT_OK(symm_variant_recv(t->v, &rb));
    int32_t *count = dget(rb.expert_count, (size_t)L * 4);
    expect_bytes(t, "expert_count", count, ref->expert_count, (size_t)L * 4, 4);
    free(count);
    const bool expert = d->layout == SYMM_LAYOUT_EXPERT;
    if (expert) {
        int32_t *offset = dget(rb.expert_offset, (size_t)L * 4);
        expect_bytes(t, "expert_offset", offset, ref->expert_offset, (size_t)L * 4, 4);
        free(offset);
    }
    unsigned char *x = dget(rb.x, (size_t)rows * x_row(d));
    int32_t *src = dget(rb.src, (size_t)rows * 16);
    for (int64_t r = 0; r < rows; r++) {
        if (expert && !in_segment(ref, L, r))
            continue;
        const void *want_x = (const char *)ref->x + r * x_row(d);
        if (memcmp(x + r * x_row(d), want_x, x_row(d)) || memcmp(src + r * 4, ref->src + r * 4, 16)) {
            char what[64];
            snprintf(what, sizeof what, "recv_x/recv_src of row %" PRId64, r);
            expect_bytes(t, what, x + r * x_row(d), want_x, x_row(d), 0);
            expect_bytes(t, what, src + r * 4, ref->src + r * 4, 16, 0);
        }
    }
    if (!expert) {
        int32_t *topk = dget(rb.topk_idx, (size_t)rows * K * 4);
        expect_bytes(t, "recv_topk_idx", topk, ref->topk_idx, (size_t)rows * K * 4, (size_t)K * 4);
        free(topk);
    }
    free(x);
    free(src);
}

static void expect_out(const vt *t, const vcase *k, CUdeviceptr out, const char *what)
{
    const size_t n = (size_t)k->in[t->c.rank].tokens * y_row(t->d);
    void *got = dget(out, n);
    expect_bytes(t, what, got, k->out[t->c.rank], n, y_row(t->d));
    free(got);
}

/* Statistics, received rows and combine output of the last call against the
 * reference: calls dispatches so far, and (clamped) T from device memory was
 * above max_tokens on this rank. */
static void expect_results(const vt *t, const vcase *k, CUdeviceptr out, uint64_t calls, bool clamped)
{
    const int me = t->c.rank;
    symm_variant_stats s;
    symm_status st = symm_variant_stats_read(t->v, t->stream, &s);
    if (clamped) {
        cr_assert(st == SYMM_ERR_OVERFLOW && strstr(symm_last_error(), "clamped"),
                  "rank %d: stats after a clamped T: %s (%s), expected SYMM_ERR_OVERFLOW saying \"clamped\"",
                  me, symm_status_name(st), st == SYMM_OK ? "" : symm_last_error());
    } else {
        cr_assert(st == SYMM_OK, "rank %d: stats of a clean call (%s): %s: %s", me, t->name,
                  symm_status_name(st), symm_last_error());
    }
    cr_assert(s.calls == calls && s.tokens == k->in[me].tokens && s.recv_rows == k->recv[me].rows &&
                  s.clamped == (int)clamped && s.invalid == 0 && s.dropped_send == 0 && s.dropped_recv == 0 &&
                  !s.timed_out,
              "rank %d: stats (%s): calls %" PRIu64 " tokens %d recv_rows %d clamped %d invalid %d dropped %d/%d "
              "timed_out %d; expected calls %" PRIu64 " tokens %d recv_rows %" PRId64 " clamped %d and no errors",
              me, t->name, s.calls, s.tokens, s.recv_rows, s.clamped, s.invalid, s.dropped_send, s.dropped_recv,
              s.timed_out, calls, k->in[me].tokens, k->recv[me].rows, (int)clamped);
    expect_recv(t, k);
    expect_out(t, k, out, "combine out");
}

/* ---- one case on this rank's GPU ------------------------------------------------ */

/* The reference of one call of the whole world (k), and this rank's side of
 * it: its inputs and y on the GPU, out for combine, the arguments of a
 * correct dispatch. */
typedef struct gpu_case {
    vcase *k;
    dev_in b;
    CUdeviceptr y, out;
    bool y_owned; /* y allocated here (else the variant's region y: combine = "pull"; "auto" takes
                     y here, pushing, unless a test places it otherwise) */
    symm_dispatch_args args;
} gpu_case;

/* case_build(seed, y_seed, tokens), then this rank's inputs and y uploaded;
 * args take T from device memory when tokens_dev. gpu_case_poison must
 * follow before a call (it also waits for the uploads). */
static void gpu_case_upload(const vt *t, gpu_case *c, unsigned long long seed, unsigned long long y_seed,
                            const int *tokens, bool tokens_dev)
{
    const symm_variant_desc *d = t->d;
    c->k = case_build(d, seed, y_seed, tokens);
    dev_in_alloc(d, &c->b);
    /* combine = "pull": y where the peers read it, the variant's region y. */
    c->y_owned = d->combine != SYMM_COMBINE_PULL;
    if (c->y_owned) {
        c->y = y_alloc(d);
    } else {
        symm_recv_buffers rb;
        EXPECT_OK(symm_variant_recv(t->v, &rb));
        cr_assert(rb.y != 0, "rank %d: %s: combine = \"pull\" but symm_recv_buffers.y is 0", t->c.rank, d->name);
        c->y = rb.y;
    }
    c->out = dalloc((size_t)d->max_tokens * y_row(d));
    dev_in_upload(t, c->k, &c->b);
    y_upload(t, c->k, c->y);
    c->args = good_args(d, &c->b, tokens[t->c.rank], tokens_dev);
}

static void gpu_case_poison(const vt *t, const gpu_case *c)
{
    poison(t, c->out, (size_t)t->d->max_tokens * y_row(t->d));
}

/* A test's usual case: random T per rank, inputs from the shared seed,
 * uploaded and poisoned. */
static void gpu_case_start(const vt *t, gpu_case *c, bool tokens_dev)
{
    int tokens[MAX_W];
    random_tokens(t, tokens, 0);
    gpu_case_upload(t, c, t->seed, t->seed + 1, tokens, tokens_dev);
    gpu_case_poison(t, c);
}

/* The combine of c after its dispatch, checked as expect_results. */
static void gpu_case_combine(const vt *t, const gpu_case *c, uint64_t calls, bool clamped)
{
    EXPECT_OK(symm_variant_combine(t->v, (const void *)c->y, (void *)c->out, t->stream));
    expect_results(t, c->k, c->out, calls, clamped);
}

/* The correct dispatch + combine of c, checked as expect_results. */
static void gpu_case_call(const vt *t, const gpu_case *c, uint64_t calls, bool clamped)
{
    EXPECT_OK(symm_variant_dispatch(t->v, &c->args, t->stream));
    gpu_case_combine(t, c, calls, clamped);
}

static void gpu_case_free(gpu_case *c)
{
    dev_in_free(&c->b);
    if (c->y_owned)
        CU_OK(cuMemFree(c->y));
    CU_OK(cuMemFree(c->out));
    case_free(c->k);
}

/* One correct dispatch + combine on fresh random inputs, checked. */
static void good_call(vt *t, uint64_t calls_before)
{
    int tokens[MAX_W];
    random_tokens(t, tokens, 100 + calls_before);
    gpu_case c;
    gpu_case_upload(t, &c, moe_rng_for(t->seed, 4, calls_before).s, t->seed ^ calls_before, tokens, false);
    gpu_case_poison(t, &c);
    gpu_case_call(t, &c, calls_before + 1, false);
    gpu_case_free(&c);
}

static uint64_t calls_so_far(const vt *t)
{
    symm_variant_stats s;
    symm_status st = symm_variant_stats_read(t->v, t->stream, &s);
    cr_assert(st == SYMM_OK, "rank %d: stats_read (%s): %s: %s", t->c.rank, t->name, symm_status_name(st),
              symm_last_error());
    return s.calls;
}

/* ---- capture: proof that a call queued nothing ----------------------------------- */

static void capture_begin(const vt *t)
{
    CU_OK(cuStreamBeginCapture(t->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
}

static void capture_end_expect_empty(const vt *t, const char *call)
{
    CUgraph g;
    CU_OK(cuStreamEndCapture(t->stream, &g));
    size_t nodes = 0;
    CU_OK(cuGraphGetNodes(g, NULL, &nodes));
    CU_OK(cuGraphDestroy(g));
    cr_assert(nodes == 0, "rank %d: the refused %s (%s) queued %zu operations on the stream, expected none",
              t->c.rank, call, t->name, nodes);
}

/* ---- 1. bad input is refused before any GPU work ------------------------------------ */

/* One refused call: how to spoil correct arguments, and what the message
 * must contain. */
typedef struct bad_call {
    const char *tag;
    want w;
    bool combine; /* a combine argument is bad (after a correct dispatch) */
    void (*spoil)(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                  void **out, unsigned long long *rng, char (*needle)[96]);
} bad_call;

static void refused(const bad_call *bc)
{
    vt t;
    vt_start(&t, bc->tag, bc->w);
    gpu_case c;
    gpu_case_start(&t, &c, false);
    if (bc->combine)
        EXPECT_OK(symm_variant_dispatch(t.v, &c.args, t.stream));
    const uint64_t calls = calls_so_far(&t);

    symm_dispatch_args a = c.args;
    const void *bad_y = (const void *)c.y;
    void *bad_out = (void *)c.out;
    unsigned long long rng = fresh_seed();
    char needle[2][96] = {"", ""};
    bc->spoil(t.d, &c.b, &a, &bad_y, &bad_out, &rng, needle);
    capture_begin(&t);
    symm_status st = bc->combine ? symm_variant_combine(t.v, bad_y, bad_out, t.stream)
                                 : symm_variant_dispatch(t.v, &a, t.stream);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", symm_last_error());
    capture_end_expect_empty(&t, bc->combine ? "combine" : "dispatch");
    cr_assert(st == SYMM_ERR_INVALID_ARG, "rank %d: %s (%s): got %s (%s), expected SYMM_ERR_INVALID_ARG",
              t.c.rank, bc->tag, t.name, symm_status_name(st), msg);
    for (int i = 0; i < 2; i++)
        cr_assert(strstr(msg, needle[i]) != NULL, "rank %d: %s: the message should contain \"%s\": %s",
                  t.c.rank, bc->tag, needle[i], msg);
    cr_assert(calls_so_far(&t) == calls, "rank %d: %s: the refused call advanced the call count from %" PRIu64,
              t.c.rank, bc->tag, calls);

    /* The variant is still in step on every rank. */
    if (!bc->combine)
        EXPECT_OK(symm_variant_dispatch(t.v, &c.args, t.stream));
    gpu_case_combine(&t, &c, 1, false);

    gpu_case_free(&c);
    vt_end(&t);
}

static void tokens_too_many(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                            void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)b, (void)y, (void)out;
    a->tokens = d->max_tokens + 1 + (int)(next_random(rng) % 1000);
    snprintf(needle[0], 96, "tokens %d", a->tokens);
    snprintf(needle[1], 96, "max_tokens");
}

static void tokens_negative(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                            void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)b, (void)y, (void)out;
    a->tokens = -1 - (int)(next_random(rng) % 1000);
    snprintf(needle[0], 96, "tokens %d", a->tokens);
    snprintf(needle[1], 96, "expected 0..%d", d->max_tokens);
}

static void x_null(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                   void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)b, (void)y, (void)out, (void)rng;
    a->x = NULL;
    snprintf(needle[0], 96, " x is NULL");
}

static void topk_null(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                      void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)b, (void)y, (void)out, (void)rng;
    a->topk_idx = NULL;
    snprintf(needle[0], 96, "topk_idx is NULL");
}

static void x_misaligned(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                         void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)y, (void)out;
    a->x = (const void *)(b->x + 1 + next_random(rng) % 15);
    snprintf(needle[0], 96, " x %p", a->x);
    snprintf(needle[1], 96, "16-byte alignment");
}

static void weights_misaligned(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                               void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)y, (void)out;
    a->topk_weights = (const float *)(b->weights + 1 + next_random(rng) % 3);
    snprintf(needle[0], 96, "topk_weights %p", (const void *)a->topk_weights);
    snprintf(needle[1], 96, "4-byte alignment");
}

static void scales_misaligned(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                              void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)y, (void)out;
    a->x_scales = (const float *)(b->scales + 1 + next_random(rng) % 3);
    snprintf(needle[0], 96, "x_scales %p", (const void *)a->x_scales);
    snprintf(needle[1], 96, "4-byte alignment");
}

static void tokens_dev_misaligned(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a,
                                  const void **y, void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)y, (void)out;
    a->tokens_dev = (const int32_t *)(b->tokens + 1 + next_random(rng) % 3);
    snprintf(needle[0], 96, "tokens_dev %p", (const void *)a->tokens_dev);
    snprintf(needle[1], 96, "4-byte alignment");
}

static void scales_given(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                         void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)y, (void)out, (void)rng;
    a->x_scales = (const float *)b->scales;
    snprintf(needle[0], 96, "x_scales given");
    snprintf(needle[1], 96, "has no scales");
}

static void weights_missing(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                            void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)b, (void)y, (void)out, (void)rng;
    a->topk_weights = NULL;
    snprintf(needle[0], 96, "topk_weights is NULL");
}

static void weights_given(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                          void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)y, (void)out, (void)rng;
    a->topk_weights = (const float *)b->weights;
    snprintf(needle[0], 96, "topk_weights given");
    snprintf(needle[1], 96, "weights = false");
}

static void y_null(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                   void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)b, (void)a, (void)out, (void)rng;
    *y = NULL;
    snprintf(needle[0], 96, "combine: y is NULL");
}

static void out_null(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                     void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)b, (void)a, (void)y, (void)rng;
    *out = NULL;
    snprintf(needle[0], 96, "combine: out is NULL");
}

static void y_misaligned(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                         void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)b, (void)a, (void)out;
    *y = (const char *)*y + 1 + next_random(rng) % 15;
    snprintf(needle[0], 96, "combine: y %p", *y);
    snprintf(needle[1], 96, "16-byte alignment");
}

#define LAYOUT_RANK_ANY ((want){SYMM_LAYOUT_RANK, -1, -1, 0, 0})
#define LAYOUT_EXPERT_ANY ((want){SYMM_LAYOUT_EXPERT, -1, -1, 0, 0})

Test(variant, dispatch_refuses_tokens_above_max_tokens_before_queueing_work)
{
    refused(&(bad_call){"rej-tokens-hi", LAYOUT_RANK_ANY, false, tokens_too_many});
}

Test(variant, dispatch_refuses_negative_tokens_before_queueing_work)
{
    refused(&(bad_call){"rej-tokens-neg", LAYOUT_EXPERT_ANY, false, tokens_negative});
}

Test(variant, dispatch_refuses_null_x_with_tokens_before_queueing_work)
{
    refused(&(bad_call){"rej-x-null", LAYOUT_RANK_ANY, false, x_null});
}

Test(variant, dispatch_refuses_null_topk_idx_with_tokens_before_queueing_work)
{
    refused(&(bad_call){"rej-topk-null", LAYOUT_EXPERT_ANY, false, topk_null});
}

Test(variant, dispatch_refuses_misaligned_x_before_queueing_work)
{
    refused(&(bad_call){"rej-x-align", LAYOUT_RANK_ANY, false, x_misaligned});
}

Test(variant, dispatch_refuses_misaligned_topk_weights_before_queueing_work)
{
    refused(&(bad_call){"rej-w-align", (want){-1, 1, -1, 0, 0}, false, weights_misaligned});
}

Test(variant, dispatch_refuses_misaligned_x_scales_before_queueing_work)
{
    refused(&(bad_call){"rej-scales-align", (want){-1, -1, 1, 0, 0}, false, scales_misaligned});
}

Test(variant, dispatch_refuses_misaligned_tokens_dev_before_queueing_work)
{
    refused(&(bad_call){"rej-tdev-align", LAYOUT_EXPERT_ANY, false, tokens_dev_misaligned});
}

Test(variant, dispatch_refuses_x_scales_for_a_non_fp8_variant)
{
    refused(&(bad_call){"rej-scales", (want){-1, -1, 0, 0, 0}, false, scales_given});
}

Test(variant, dispatch_refuses_missing_topk_weights_on_a_weights_variant)
{
    refused(&(bad_call){"rej-w-missing", (want){-1, 1, -1, 0, 0}, false, weights_missing});
}

Test(variant, dispatch_refuses_topk_weights_on_a_no_weights_variant)
{
    refused(&(bad_call){"rej-w-given", (want){-1, 0, -1, 0, 0}, false, weights_given});
}

Test(variant, combine_refuses_null_y_before_queueing_work)
{
    refused(&(bad_call){"rej-y-null", LAYOUT_EXPERT_ANY, true, y_null});
}

Test(variant, combine_refuses_null_out_before_queueing_work)
{
    refused(&(bad_call){"rej-out-null", LAYOUT_RANK_ANY, true, out_null});
}

Test(variant, combine_refuses_misaligned_y_before_queueing_work)
{
    refused(&(bad_call){"rej-y-align", LAYOUT_EXPERT_ANY, true, y_misaligned});
}

/* combine = "pull": y in ordinary device memory (here the dispatch input x,
 * which is large enough and aligned), where no peer can read it. */
static void y_outside_symmetric(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a, const void **y,
                                void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)d, (void)a, (void)out, (void)rng;
    *y = (const void *)(uintptr_t)b->x;
    snprintf(needle[0], 96, "y %p", *y);
    snprintf(needle[1], 96, "is not inside the variant's symmetric buffer");
}

/* A pulling combine's y, one past its place: its last rows would lie past
 * the end of the symmetric buffer. */
static void y_past_symmetric_end(const symm_variant_desc *d, const dev_in *b, symm_dispatch_args *a,
                                 const void **y, void **out, unsigned long long *rng, char (*needle)[96])
{
    (void)b, (void)a, (void)out, (void)rng;
    /* Moved on so that its capacity rows end 4 KiB past the buffer's end
     * (region y need not be the last region: layout expert's chain_ready
     * may follow it). */
    const symm_region_desc *r = &d->regions[SYMM_REGION_Y];
    const uint64_t need = (uint64_t)d->capacity * (uint64_t)d->hidden * symm_dtype_size(d->combine_dtype);
    cr_assert(r->symmetric && need <= d->symmetric_bytes && r->offset <= d->symmetric_bytes - need,
              "%s: region y at %llu with %llu bytes of rows inside %llu symmetric bytes", d->name,
              (unsigned long long)r->offset, (unsigned long long)need, (unsigned long long)d->symmetric_bytes);
    *y = (const char *)*y + (d->symmetric_bytes - need - r->offset) + 4096;
    snprintf(needle[0], 96, "capacity %lld rows", (long long)d->capacity);
    snprintf(needle[1], 96, "symm_recv_buffers.y");
}

#define PULL_ANY ((want){-1, -1, -1, 0, SYMM_COMBINE_PULL})

Test(variant, pulling_combine_refuses_y_outside_the_symmetric_buffer)
{
    refused(&(bad_call){"rej-y-pull", PULL_ANY, true, y_outside_symmetric});
}

Test(variant, pulling_combine_refuses_y_that_ends_past_the_symmetric_buffer)
{
    refused(&(bad_call){"rej-y-pull-end", PULL_ANY, true, y_past_symmetric_end});
}

/* combine = "pull" with y in recv_x itself (the expert work in place): the
 * peers read each rank's y there, and the next call is still exact. */
Test(variant, pulling_combine_reads_y_in_place_in_recv_x)
{
    vt t;
    vt_start(&t, "pull-in-place", ((want){SYMM_LAYOUT_RANK, -1, 0, 0, 1}));
    cr_assert(t.d->dtype == t.d->combine_dtype, "rank %d: %s: y in recv_x needs dtype == combine_dtype",
              t.c.rank, t.name);
    gpu_case c;
    gpu_case_start(&t, &c, false);
    EXPECT_OK(symm_variant_dispatch(t.v, &c.args, t.stream));
    EXPECT_OK(symm_variant_stats_read(t.v, t.stream, NULL)); /* dispatch done: its rows checked first */
    expect_recv(&t, c.k);
    symm_recv_buffers rb;
    EXPECT_OK(symm_variant_recv(t.v, &rb));
    y_upload(&t, c.k, rb.x);
    EXPECT_OK(symm_variant_combine(t.v, (const void *)rb.x, (void *)c.out, t.stream));
    CU_OK(cuStreamSynchronize(t.stream));
    expect_out(&t, c.k, c.out, "combine out (y in recv_x)");
    gpu_case_free(&c);
    good_call(&t, 1);
    vt_end(&t);
}

/* ---- 2. an absent peer ---------------------------------------------------------------- */

/* Open descriptors and free device memory, taken while no rank of the world
 * is between two barriers (ranks sharing a GPU see each other's memory). */
static void quiet_snapshot(const vt *t, int *fds, size_t *free_bytes)
{
    size_t total = 0;
    EXPECT_OK(symm_world_barrier(t->c.world));
    CU_OK(cuCtxSynchronize());
    CU_OK(cuMemGetInfo(free_bytes, &total));
    *fds = open_fd_count();
    EXPECT_OK(symm_world_barrier(t->c.world));
}

/* vt_setup for a test of the NCCL backend: where ranks share a GPU and NCCL
 * is not let share it (symmrun --nccl-shared-gpu), says so, ends the test's
 * world and skips (alike on every rank). */
static void vt_setup_nccl(vt *t, const char *tag, double min_timeout_s)
{
    vt_setup(t, tag, ANY, min_timeout_s);
    if (symm_device_gpu_count(t->c.dev) >= t->c.ranks || symm_nccl_shared_gpu_mode())
        return;
    printf("skipped: NCCL needs one GPU per rank (%d ranks on %d GPUs)\n", t->c.ranks,
           symm_device_gpu_count(t->c.dev));
    fflush(stdout);
    vt_finish(t);
    cr_skip_test("NCCL needs one GPU per rank");
}

/* A first variant with a working call pays the one-time costs (module
 * loading, lazy driver allocations, NCCL's process-wide setup); then the
 * descriptors and device memory a second variant must give back. */
static void warm_up_then_snapshot(vt *t, const symm_variant_options *o, gpu_case *c, int *fds, size_t *free_bytes)
{
    vt_open(t, o);
    gpu_case_start(t, c, false);
    gpu_case_call(t, c, 1, false);
    vt_close(t);
    quiet_snapshot(t, fds, free_bytes);
}

/* After the second variant's destroy: as many descriptors open and at
 * least as much device memory free as before its create. */
static void expect_nothing_leaked(vt *t, int fds_before, size_t free_before)
{
    int fds_after;
    size_t free_after;
    quiet_snapshot(t, &fds_after, &free_after);
    cr_assert(fds_after == fds_before, "rank %d: %d descriptors open after the destroy, %d before the create",
              t->c.rank, fds_after, fds_before);
    cr_assert(free_after >= free_before, "rank %d: %zu bytes of device memory free after the destroy, %zu before "
              "the create: %zu bytes were not released", t->c.rank, free_after, free_before,
              free_before - free_after);
}

/* The end of a test that checks destroy frees everything: every rank done,
 * `made` (a case uploaded after the snapshot; may be NULL) freed, the
 * variant destroyed, nothing leaked against the snapshot, then `warm` (the
 * case of the warm-up before it) freed. */
static void end_leak_test(vt *t, gpu_case *made, gpu_case *warm, int fds_before, size_t free_before)
{
    EXPECT_OK(symm_world_barrier(t->c.world));
    if (made)
        gpu_case_free(made);
    vt_close(t);
    expect_nothing_leaked(t, fds_before, free_before);
    gpu_case_free(warm);
    vt_finish(t);
}

/* Seconds until the stream's work is done; fails the test after limit_s,
 * so that a device wait that never gives up is reported, not waited for. */
static double drain(const vt *t, double t0, double limit_s, const char *what)
{
    for (;;) {
        CUresult r = cuStreamQuery(t->stream);
        double elapsed = now_s() - t0;
        if (r == CUDA_SUCCESS)
            return elapsed;
        cr_assert(r == CUDA_ERROR_NOT_READY, "rank %d: cuStreamQuery after %s: error %d", t->c.rank, what, (int)r);
        cr_assert(elapsed < limit_s, "rank %d: %s still running after %.1f s: the device wait did not give up",
                  t->c.rank, what, elapsed);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Rank 0 dispatches alone: its device wait gives up after the variant's
 * timeout and names the peer; later calls fail at once. */
static void lonely_rank_zero(vt *t, const gpu_case *c, double timeout)
{
    symm_dispatch_args a = good_args(t->d, &c->b, c->k->in[0].tokens, false);
    symm_variant_stats s;
    double t0 = now_s();
    EXPECT_OK(symm_variant_dispatch(t->v, &a, t->stream));
    EXPECT_OK(symm_variant_combine(t->v, (const void *)c->y, (void *)c->out, t->stream));
    const double first = drain(t, t0, timeout + 10.0, "a dispatch no peer joined");
    symm_status st = symm_variant_stats_read(t->v, t->stream, &s);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", symm_last_error());
    cr_assert(st == SYMM_ERR_TIMEOUT, "rank 0: stats after a dispatch no peer joined: %s (%s), expected "
              "SYMM_ERR_TIMEOUT", symm_status_name(st), st == SYMM_OK ? "" : msg);
    const int W = t->c.ranks;
    cr_assert(s.timed_out && s.timeout_peer >= 1 && s.timeout_peer < W && (W != 2 || s.timeout_peer == 1) &&
                  s.timeout_phase == 1 && s.calls == 1,
              "rank 0: stats timed_out %d peer %d phase %d calls %" PRIu64 ", expected a timeout waiting for "
              "rank %s in phase 1 (counts) of call 1", s.timed_out, s.timeout_peer, s.timeout_phase, s.calls,
              W == 2 ? "1" : "1..W-1");
    char peer[32];
    snprintf(peer, sizeof peer, "for rank %d ", s.timeout_peer);
    cr_assert(strstr(msg, peer) && strstr(msg, "count exchange"),
              "rank 0: the message should name rank %d and the count exchange: %s", s.timeout_peer, msg);
    cr_assert(first >= timeout * 0.95 && first < timeout + 4.0,
              "rank 0: the timed-out call took %.3f s, expected about the variant's timeout of %g s", first,
              timeout);

    /* Sticky: the next call fails fast and still reports the first failure. */
    const symm_variant_stats before = s;
    t0 = now_s();
    EXPECT_OK(symm_variant_dispatch(t->v, &a, t->stream));
    EXPECT_OK(symm_variant_combine(t->v, (const void *)c->y, (void *)c->out, t->stream));
    const double second = drain(t, t0, timeout + 10.0, "the call after a timeout");
    st = symm_variant_stats_read(t->v, t->stream, &s);
    cr_assert(st == SYMM_ERR_TIMEOUT && s.timed_out && s.timeout_peer == before.timeout_peer &&
                  s.timeout_phase == before.timeout_phase,
              "rank 0: after a timeout the next call gave %s (%s), timed_out %d peer %d phase %d; expected the "
              "same timeout (peer %d phase %d) again", symm_status_name(st), symm_last_error(), s.timed_out,
              s.timeout_peer, s.timeout_phase, before.timeout_peer, before.timeout_phase);
    cr_assert(second < 1.0, "rank 0: a call after a timeout took %.3f s on the device, expected it to fail fast "
              "(under 1 s)", second);
}

/* The start of a test of the device waits' timeout: the test's world (other
 * ranks wait in a host barrier, up to 30 s, while rank 0 times out on the
 * device), the native options with a device timeout of 2 s, one call on a
 * variant that is then destroyed (warm), and the descriptors and free
 * device memory before the variant under test is created. */
static symm_variant_options timeout_test_start(vt *t, const char *tag, want w, gpu_case *warm, int *fds,
                                               size_t *free_bytes)
{
    vt_setup(t, tag, w, 30.0);
    symm_variant_options o = native_options();
    o.timeout_s = 2.0;
    warm_up_then_snapshot(t, &o, warm, fds, free_bytes);
    return o;
}

/* timeout_test_start for the NCCL backend: the world of vt_setup_nccl
 * (skipped where NCCL may not share the ranks' GPUs), the NCCL options
 * with a timeout of 2 s, the warm-up and the snapshot. */
static symm_variant_options nccl_timeout_test_start(vt *t, const char *tag, gpu_case *warm, int *fds,
                                                    size_t *free_bytes)
{
    vt_setup_nccl(t, tag, 30.0);
    symm_variant_options o = {.backend = SYMM_BACKEND_NCCL, .timeout_s = 2.0};
    warm_up_then_snapshot(t, &o, warm, fds, free_bytes);
    return o;
}

Test(variant, absent_peer_times_out_naming_it_then_calls_fail_fast_and_destroy_frees_everything)
{
    vt t;
    gpu_case c;
    int fds_before;
    size_t free_before;
    const symm_variant_options o = timeout_test_start(&t, "timeout", ANY, &c, &fds_before, &free_before);
    const double timeout = o.timeout_s;

    vt_open(&t, &o);
    if (t.c.rank == 0) {
        lonely_rank_zero(&t, &c, timeout);
    } else {
        symm_variant_stats s;
        symm_status st = symm_variant_stats_read(t.v, t.stream, &s);
        cr_assert(st == SYMM_OK && s.calls == 0 && !s.timed_out,
                  "rank %d: a variant this rank never called reports %s, calls %" PRIu64 ", timed_out %d",
                  t.c.rank, symm_status_name(st), s.calls, s.timed_out);
    }
    end_leak_test(&t, NULL, &c, fds_before, free_before);
}

/* Every rank dispatches, then only rank 0 combines: its combine waits for
 * its peers (pushing: for the rows they push back; pulling: for their y to
 * be ready) until the variant's timeout, names the peer and the combine
 * phase, and destroy still frees everything on every rank. */
static void combine_alone(const char *tag, want w)
{
    vt t;
    gpu_case warm;
    int fds_before;
    size_t free_before;
    const symm_variant_options o = timeout_test_start(&t, tag, w, &warm, &fds_before, &free_before);
    const double timeout = o.timeout_s;

    vt_open(&t, &o);
    /* Every rank at max_tokens: rank 0 has rows at its peers (uniform
     * routing over their experts), so even a pushing combine waits. */
    int tokens[MAX_W];
    for (int p = 0; p < t.c.ranks; p++)
        tokens[p] = t.d->max_tokens;
    gpu_case c;
    gpu_case_upload(&t, &c, t.seed + 7, t.seed + 8, tokens, false);
    gpu_case_poison(&t, &c);
    EXPECT_OK(symm_variant_dispatch(t.v, &c.args, t.stream));
    EXPECT_OK(symm_variant_stats_read(t.v, t.stream, NULL));
    EXPECT_OK(symm_world_barrier(t.c.world));
    if (t.c.rank == 0) {
        const double t0 = now_s();
        EXPECT_OK(symm_variant_combine(t.v, (const void *)c.y, (void *)c.out, t.stream));
        const double took = drain(&t, t0, timeout + 10.0, "a combine no peer joined");
        symm_variant_stats s;
        symm_status st = symm_variant_stats_read(t.v, t.stream, &s);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", symm_last_error());
        cr_assert(st == SYMM_ERR_TIMEOUT && s.timed_out && s.timeout_phase == 3 && s.timeout_peer >= 1 &&
                      s.timeout_peer < t.c.ranks && s.calls == 1,
                  "rank 0 (%s): stats after a combine no peer joined: %s (%s), timed_out %d peer %d phase %d calls "
                  "%" PRIu64 "; expected SYMM_ERR_TIMEOUT waiting for a peer in phase 3 (combine) of call 1",
                  t.name, symm_status_name(st), st == SYMM_OK ? "" : msg, s.timed_out, s.timeout_peer,
                  s.timeout_phase, s.calls);
        char peer[32];
        snprintf(peer, sizeof peer, "for rank %d ", s.timeout_peer);
        cr_assert(strstr(msg, peer) && strstr(msg, "combine rows"),
                  "rank 0 (%s): the message should name rank %d and the combine: %s", t.name, s.timeout_peer, msg);
        cr_assert(took >= timeout * 0.95 && took < timeout + 4.0,
                  "rank 0 (%s): the timed-out combine took %.3f s, expected about the variant's timeout of %g s",
                  t.name, took, timeout);
    }
    end_leak_test(&t, &c, &warm, fds_before, free_before);
}

Test(variant, combine_without_its_peers_times_out_naming_one_then_destroy_frees_everything)
{
    combine_alone("combine-alone", LAYOUT_RANK_ANY);
}

Test(variant, pulling_combine_without_its_peers_times_out_naming_one_then_destroy_frees_everything)
{
    combine_alone("pull-alone", PULL_ANY);
}

/* ---- combine = "auto": the form by where y lies --------------------------------------- */

#define AUTO_ANY ((want){SYMM_LAYOUT_RANK, -1, -1, 0, SYMM_COMBINE_AUTO})

/* Where a call of an "auto" variant puts y: its region y, recv_x itself
 * (both inside the symmetric buffer: the pulling form), or this rank's own
 * device memory (the pushing form). */
typedef enum y_place { Y_REGION, Y_RECV_X, Y_OWN } y_place;
static const char *const y_place_names[] = {"region y (pull)", "recv_x in place (pull)", "own memory (push)"};

/* One correct call of the "auto" variant with y at `where` on every rank,
 * checked bit for bit against the reference. */
static void auto_call(vt *t, y_place where, uint64_t calls_before)
{
    int tokens[MAX_W];
    random_tokens(t, tokens, 300 + calls_before);
    gpu_case c;
    gpu_case_upload(t, &c, moe_rng_for(t->seed, 6, calls_before).s, t->seed ^ (calls_before * 7 + 1), tokens, false);
    symm_recv_buffers rb;
    EXPECT_OK(symm_variant_recv(t->v, &rb));
    cr_assert(rb.y != 0, "rank %d: %s: combine = \"auto\" but symm_recv_buffers.y is 0", t->c.rank, t->name);
    gpu_case_poison(t, &c);
    if (where == Y_REGION)
        y_upload(t, c.k, rb.y);
    EXPECT_OK(symm_variant_dispatch(t->v, &c.args, t->stream));
    const CUdeviceptr y = where == Y_REGION ? rb.y : where == Y_RECV_X ? rb.x : c.y;
    if (where == Y_RECV_X) {
        /* The expert work in place: y over the received rows, after dispatch. */
        EXPECT_OK(symm_variant_stats_read(t->v, t->stream, NULL));
        expect_recv(t, c.k);
        y_upload(t, c.k, rb.x);
    }
    EXPECT_OK(symm_variant_combine(t->v, (const void *)y, (void *)c.out, t->stream));
    char what[96];
    snprintf(what, sizeof what, "combine out, call %" PRIu64 ", y in %s", calls_before + 1, y_place_names[where]);
    symm_variant_stats s;
    symm_status st = symm_variant_stats_read(t->v, t->stream, &s);
    const int me = t->c.rank;
    cr_assert(st == SYMM_OK && !s.mismatch && s.mismatch_peer == -1 && !s.timed_out && s.calls == calls_before + 1 &&
                  s.tokens == c.k->in[me].tokens && s.recv_rows == c.k->recv[me].rows,
              "rank %d: %s: %s: %s (%s), mismatch %d peer %d timed_out %d calls %" PRIu64 " tokens %d rows %d", me,
              t->name, what, symm_status_name(st), st == SYMM_OK ? "" : symm_last_error(), s.mismatch,
              s.mismatch_peer, s.timed_out, s.calls, s.tokens, s.recv_rows);
    if (where != Y_RECV_X) /* (else recv_x holds y now; checked before) */
        expect_recv(t, c.k);
    expect_out(t, c.k, c.out, what);
    gpu_case_free(&c);
}

/* combine = "auto": consecutive calls pull (y in region y, or in recv_x)
 * and push (y in this rank's own memory) in turn, every one exact. */
Test(variant, auto_combine_pulls_with_y_inside_and_pushes_with_y_outside_in_turn)
{
    vt t;
    vt_start(&t, "auto-forms", AUTO_ANY);
    const bool in_place = t.d->dtype == t.d->combine_dtype;
    const y_place plan[] = {Y_REGION, Y_OWN, Y_OWN, Y_REGION, in_place ? Y_RECV_X : Y_REGION, Y_OWN, Y_REGION,
                            in_place ? Y_RECV_X : Y_OWN, Y_OWN};
    for (uint64_t i = 0; i < sizeof plan / sizeof plan[0]; i++)
        auto_call(&t, plan[i], i);
    vt_end(&t);
}

/* combine = "auto" with y placed differently across ranks in one call
 * (some pull, some push; a random split from the shared seed, both forms
 * present): every rank fails the call with SYMM_ERR_MISMATCH naming a
 * peer of the other form, the call, and both forms, fast (the kernels see
 * the peers' form in the call's signal words; the variant's timeout is far
 * longer), nothing is left waiting, and the error is sticky as a timeout
 * is: the next call fails fast with it (the ranks no longer agree on where
 * the exchange stands; a timeout is not recoverable either, so neither is
 * this), and destroy frees everything. */
Test(variant, auto_combine_with_y_placed_differently_fails_fast_on_every_rank_then_destroy_frees_everything)
{
    vt t;
    gpu_case warm;
    int fds_before;
    size_t free_before;
    vt_setup(&t, "auto-mismatch", AUTO_ANY, 60.0);
    symm_variant_options o = native_options();
    o.timeout_s = 60.0;
    warm_up_then_snapshot(&t, &o, &warm, &fds_before, &free_before);

    vt_open(&t, &o);
    const int W = t.c.ranks, me = t.c.rank;
    moe_rng r = moe_rng_for(t.seed, 9, 0);
    unsigned pulls = (unsigned)(moe_rng_next(&r) % ((1u << W) - 2)) + 1; /* neither none nor all */
    const bool i_pull = (pulls >> me) & 1;
    int tokens[MAX_W];
    for (int p = 0; p < W; p++)
        tokens[p] = t.d->max_tokens; /* every rank has rows at every peer */
    gpu_case c;
    gpu_case_upload(&t, &c, t.seed + 11, t.seed + 12, tokens, false);
    gpu_case_poison(&t, &c);
    symm_recv_buffers rb;
    EXPECT_OK(symm_variant_recv(t.v, &rb));
    const CUdeviceptr y = i_pull ? rb.y : c.y;
    if (i_pull)
        y_upload(&t, c.k, rb.y);
    EXPECT_OK(symm_world_barrier(t.c.world));
    double t0 = now_s();
    EXPECT_OK(symm_variant_dispatch(t.v, &c.args, t.stream));
    EXPECT_OK(symm_variant_combine(t.v, (const void *)y, (void *)c.out, t.stream));
    const double took = drain(&t, t0, o.timeout_s + 10.0, "a combine whose ranks placed y differently");
    symm_variant_stats s;
    symm_status st = symm_variant_stats_read(t.v, t.stream, &s);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", symm_last_error());
    const bool peer_ok = s.mismatch_peer >= 0 && s.mismatch_peer < W && s.mismatch_peer != me &&
                         (((pulls >> s.mismatch_peer) & 1) != i_pull);
    cr_assert(st == SYMM_ERR_MISMATCH && s.mismatch == (i_pull ? 1 : 2) && peer_ok && !s.timed_out &&
                  s.timeout_phase == 3 && s.calls == 1,
              "rank %d (%s, pulls 0x%x): stats after a combine of mixed forms: %s (%s), mismatch %d peer %d "
              "timed_out %d phase %d calls %" PRIu64 "; expected SYMM_ERR_MISMATCH, mismatch %d, a peer of the "
              "other form", me, i_pull ? "pulled" : "pushed", pulls, symm_status_name(st), st == SYMM_OK ? "" : msg,
              s.mismatch, s.mismatch_peer, s.timed_out, s.timeout_phase, s.calls, i_pull ? 1 : 2);
    char want[3][96];
    snprintf(want[0], sizeof want[0], "rank %d %s", me, i_pull ? "pulled" : "pushed");
    snprintf(want[1], sizeof want[1], "rank %d %s in the combine of call 1", s.mismatch_peer,
             i_pull ? "pushed" : "pulled");
    snprintf(want[2], sizeof want[2], "combine = \"auto\"");
    for (int i = 0; i < 3; i++)
        cr_assert(strstr(msg, want[i]), "rank %d: the message should say \"%s\": %s", me, want[i], msg);
    cr_assert(took < 10.0, "rank %d: the call of mixed forms took %.3f s, expected it to fail fast (the variant's "
              "timeout is %g s)", me, took, o.timeout_s);

    /* Sticky: the next call (y alike on every rank now) fails fast with the
     * same error. */
    const symm_variant_stats before = s;
    EXPECT_OK(symm_world_barrier(t.c.world));
    t0 = now_s();
    EXPECT_OK(symm_variant_dispatch(t.v, &c.args, t.stream));
    EXPECT_OK(symm_variant_combine(t.v, (const void *)c.y, (void *)c.out, t.stream));
    const double second = drain(&t, t0, o.timeout_s + 10.0, "the call after a mismatch");
    st = symm_variant_stats_read(t.v, t.stream, &s);
    cr_assert(st == SYMM_ERR_MISMATCH && s.mismatch == before.mismatch && s.mismatch_peer == before.mismatch_peer,
              "rank %d: after a mismatch the next call gave %s (%s), mismatch %d peer %d; expected the same "
              "mismatch (%d, peer %d) again", me, symm_status_name(st), symm_last_error(), s.mismatch,
              s.mismatch_peer, before.mismatch, before.mismatch_peer);
    cr_assert(second < 1.0, "rank %d: a call after a mismatch took %.3f s on the device, expected it to fail fast",
              me, second);

    end_leak_test(&t, &c, &warm, fds_before, free_before);
}

/* The NCCL backend waits on the host: when a peer stops arriving, rank 0's
 * dispatch itself fails with SYMM_ERR_TIMEOUT after the variant's timeout,
 * later calls fail at once with the same error, and destroy frees
 * everything (the communicator is aborted, so NCCL's kernel that still
 * waits for the peer on this GPU returns). The peers never call the
 * variant at all: NCCL connects peers inside the host calls of a
 * communicator's first operations and waits there without a timeout of its
 * own, so create makes those operations (runtime/variant_nccl.c,
 * connect_peers) and no call of rank 0 may wait there. */
Test(variant, nccl_backend_absent_peer_times_out_then_calls_fail_fast_and_destroy_frees_everything)
{
    vt t;
    gpu_case c;
    int fds_before;
    size_t free_before;
    const symm_variant_options o = nccl_timeout_test_start(&t, "nccl-timeout", &c, &fds_before, &free_before);
    const double timeout = o.timeout_s;

    vt_open(&t, &o);
    if (t.c.rank == 0) {
        symm_dispatch_args a = good_args(t.d, &c.b, c.k->in[0].tokens, false);
        double t0 = now_s();
        symm_status st = symm_variant_dispatch(t.v, &a, t.stream);
        const double first = now_s() - t0;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", symm_last_error());
        cr_assert(st == SYMM_ERR_TIMEOUT && strstr(msg, "count exchange") && strstr(msg, "NCCL backend") &&
                      strstr(msg, t.name),
                  "rank 0: NCCL dispatch no peer joined: %s (%s), expected SYMM_ERR_TIMEOUT naming the variant, "
                  "the backend and the count exchange", symm_status_name(st), msg);
        cr_assert(first >= timeout * 0.95 && first < timeout + 4.0,
                  "rank 0: the timed-out dispatch took %.3f s, expected about the variant's timeout of %g s", first,
                  timeout);
        t0 = now_s();
        st = symm_variant_dispatch(t.v, &a, t.stream);
        const double second = now_s() - t0;
        cr_assert(st == SYMM_ERR_TIMEOUT && strstr(symm_last_error(), "earlier call"),
                  "rank 0: the dispatch after a timeout gave %s (%s), expected the same SYMM_ERR_TIMEOUT saying an "
                  "earlier call failed", symm_status_name(st), symm_last_error());
        cr_assert(second < 0.5, "rank 0: a dispatch after a timeout took %.3f s, expected it to fail at once", second);
        /* Combine and the statistics say the same, at once. */
        t0 = now_s();
        st = symm_variant_combine(t.v, (const void *)c.y, (void *)c.out, t.stream);
        cr_assert(st == SYMM_ERR_TIMEOUT && strstr(symm_last_error(), "earlier call"),
                  "rank 0: the combine after a timeout gave %s (%s), expected SYMM_ERR_TIMEOUT saying an earlier "
                  "call failed", symm_status_name(st), symm_last_error());
        symm_variant_stats stats;
        memset(&stats, 0x5a, sizeof stats);
        st = symm_variant_stats_read(t.v, t.stream, &stats);
        cr_assert(st == SYMM_ERR_TIMEOUT && strstr(symm_last_error(), "earlier call"),
                  "rank 0: stats_read after a timeout gave %s (%s), expected SYMM_ERR_TIMEOUT", symm_status_name(st),
                  symm_last_error());
        cr_assert(stats.timed_out == 1 && stats.timeout_peer == -1 && stats.calls == 0,
                  "rank 0: stats after an NCCL timeout: timed_out %d, timeout_peer %d, calls %llu; expected 1, -1, 0",
                  stats.timed_out, stats.timeout_peer, (unsigned long long)stats.calls);
        cr_assert(now_s() - t0 < 0.5, "rank 0: combine and stats_read after a timeout took %.3f s, expected at once",
                  now_s() - t0);
        /* NCCL's all-gather kernel was left waiting; the abort lets it return. */
        drain(&t, now_s(), 10.0, "the aborted count exchange");
    }
    end_leak_test(&t, NULL, &c, fds_before, free_before);
}

/* A peer that dispatches but never combines leaves rank 0's combine waiting
 * inside NCCL on the device (combine itself does not wait on the host):
 * stats_read, the first host wait after it, fails with SYMM_ERR_TIMEOUT
 * after the variant's timeout instead of blocking for ever, and the
 * aborted communicator lets the waiting kernel return. Every rank sends
 * max_tokens tokens, so rank 0 sent rows to rank 1 and waits for them back. */
Test(variant, nccl_backend_stats_read_after_a_combine_its_peer_skipped_times_out)
{
    vt t;
    gpu_case warm;
    int fds_before;
    size_t free_before;
    const symm_variant_options o = nccl_timeout_test_start(&t, "nccl-stats-timeout", &warm, &fds_before, &free_before);
    const double timeout = o.timeout_s;

    vt_open(&t, &o);
    int tokens[MAX_W];
    for (int p = 0; p < t.c.ranks; p++)
        tokens[p] = t.d->max_tokens;
    gpu_case c;
    gpu_case_upload(&t, &c, t.seed ^ 0x5ca1ab1eull, t.seed + 7, tokens, false);
    gpu_case_poison(&t, &c);
    symm_dispatch_args a = good_args(t.d, &c.b, tokens[t.c.rank], false);
    EXPECT_OK(symm_variant_dispatch(t.v, &a, t.stream));
    if (t.c.rank == 0) {
        EXPECT_OK(symm_variant_combine(t.v, (const void *)c.y, (void *)c.out, t.stream));
        const double t0 = now_s();
        symm_variant_stats stats;
        memset(&stats, 0x5a, sizeof stats);
        symm_status st = symm_variant_stats_read(t.v, t.stream, &stats);
        const double waited = now_s() - t0;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", symm_last_error());
        cr_assert(st == SYMM_ERR_TIMEOUT && strstr(msg, "stats_read") && strstr(msg, "timeout"),
                  "rank 0: stats_read with a combine its peer never joined gave %s (%s), expected SYMM_ERR_TIMEOUT "
                  "naming stats_read and the timeout", symm_status_name(st), msg);
        cr_assert(stats.timed_out == 1 && stats.timeout_peer == -1,
                  "rank 0: stats after the timeout: timed_out %d, timeout_peer %d; expected 1, -1", stats.timed_out,
                  stats.timeout_peer);
        cr_assert(waited >= timeout * 0.95 && waited < timeout + 4.0,
                  "rank 0: the timed-out stats_read took %.3f s, expected about the variant's timeout of %g s", waited,
                  timeout);
        st = symm_variant_dispatch(t.v, &a, t.stream);
        cr_assert(st == SYMM_ERR_TIMEOUT && strstr(symm_last_error(), "earlier call"),
                  "rank 0: the dispatch after the timeout gave %s (%s), expected SYMM_ERR_TIMEOUT saying an earlier "
                  "call failed", symm_status_name(st), symm_last_error());
        drain(&t, now_s(), 10.0, "the aborted combine");
    } else {
        /* Its dispatch completes (rank 0 joined it); its combine never comes. */
        drain(&t, now_s(), 30.0, "the dispatch");
    }
    end_leak_test(&t, &c, &warm, fds_before, free_before);
}

/* ---- 3. T from device memory --------------------------------------------------------------- */

Test(variant, tokens_dev_takes_t_from_device_memory)
{
    vt t;
    vt_start(&t, "tokens-dev", LAYOUT_EXPERT_ANY);
    gpu_case c;
    gpu_case_start(&t, &c, true);
    gpu_case_call(&t, &c, 1, false);
    gpu_case_free(&c);
    vt_end(&t);
}

Test(variant, tokens_dev_above_max_tokens_is_clamped_and_reported)
{
    vt t;
    vt_start(&t, "tokens-clamp", (want){SYMM_LAYOUT_RANK, 1, -1, 0, 0});
    const symm_variant_desc *d = t.d;
    int tokens[MAX_W];
    random_tokens(&t, tokens, 0);
    /* Rank 0 says more than max_tokens: it sends max_tokens rows. */
    tokens[0] = d->max_tokens;
    gpu_case c;
    gpu_case_upload(&t, &c, t.seed, t.seed + 1, tokens, true);
    if (t.c.rank == 0) {
        unsigned long long s = fresh_seed();
        int32_t too_many = d->max_tokens + 1 + (int32_t)(next_random(&s) % 100000);
        upload(&t, c.b.tokens, &too_many, 4);
        CU_OK(cuStreamSynchronize(t.stream));
    }
    gpu_case_poison(&t, &c);
    gpu_case_call(&t, &c, 1, t.c.rank == 0);
    gpu_case_free(&c);
    vt_end(&t);
}

/* ---- 3b. tuning and the profile ------------------------------------------------------------ */

/* PROFILE=1 (with other knobs at random values) leaves every result exact;
 * the phase times of one call come in order, and the next read, with no call
 * in between, finds nothing. A variant without it refuses the read. */
Test(variant, profiled_and_tuned_variant_is_exact_and_reports_its_phases_in_order)
{
    vt t;
    vt_setup(&t, "profile", ANY, 0);
    symm_variant_options plain = native_options();
    vt_open(&t, &plain);
    symm_variant_profile p;
    cr_assert_eq(symm_variant_profile_read(t.v, t.stream, &p), SYMM_ERR_STATE, "read without PROFILE=1");
    cr_assert(strstr(symm_last_error(), "PROFILE=1"), "%s", symm_last_error());
    vt_close(&t);

    /* The same knobs on every rank (from the shared seed), PROFILE=1 last.
     * The variant picked is a layout-rank one, which DEDUP does not touch
     * (scripts/test-gpu.sh runs every default variant with DEDUP 0 and 1). */
    unsigned long long s = t.seed;
    char tune[160];
    snprintf(tune, sizeof tune,
             "PUSH_WARPS=%d,PUSH_WARPS_SMALL=%d,PUSH_BATCH=%d,BULK_SLOTS=%d,SUM_UNROLL=%d,PREFETCH=%d,LOCAL_VEC=%d, "
             "PDL=%d,PROFILE=1",
             1 + (int)(next_random(&s) % 16), (int)(next_random(&s) % 17), 1 + (int)(next_random(&s) % 32),
             1 + (int)(next_random(&s) % 4), 1 + (int)(next_random(&s) % 10), (int)(next_random(&s) % 2),
             (int)(next_random(&s) % 2), (int)(next_random(&s) % 2));
    symm_variant_options o = native_options();
    o.tune = tune;
    vt_open(&t, &o);
    for (uint64_t call = 1; call <= 3; call++) {
        int tokens[MAX_W];
        random_tokens(&t, tokens, 200 + call);
        gpu_case c;
        gpu_case_upload(&t, &c, moe_rng_for(t.seed, 7, call).s, t.seed ^ (call << 8), tokens, false);
        gpu_case_poison(&t, &c);
        gpu_case_call(&t, &c, call, false);
        EXPECT_OK(symm_variant_profile_read(t.v, t.stream, &p));
        cr_assert(p.level == 1 && p.sums.warps == 0 && p.rows.warps == 0 && p.rows.loop_us == 0,
                  "rank %d: PROFILE=1 reads no spans (level %d)", t.c.rank, p.level);
        const double d[] = {p.dispatch_routed_us, p.dispatch_counted_us, p.dispatch_counts_in_us, p.dispatch_bases_us,
                            p.dispatch_stored_us, p.dispatch_rows_out_us, p.dispatch_rows_in_us, p.dispatch_us};
        for (int i = 0; i < 8; i++)
            cr_assert(d[i] >= 0 && (i == 0 || d[i] >= d[i - 1]) && d[i] < 60e6,
                      "rank %d, %s, call %llu: dispatch phase %d at %.1f us (phases %.1f %.1f %.1f %.1f %.1f %.1f %.1f "
                      "%.1f)", t.c.rank, tune, (unsigned long long)call, i, d[i], d[0], d[1], d[2], d[3], d[4], d[5],
                      d[6], d[7]);
        cr_assert(p.combine_us >= 0 && p.combine_us < 60e6, "rank %d: combine end %.1f us", t.c.rank, p.combine_us);
        /* Push warps run when this rank received rows from peers; the
         * phase is then before the end. */
        cr_assert(p.combine_pushed_us <= p.combine_us, "rank %d: pushed %.1f us after the end %.1f us", t.c.rank,
                  p.combine_pushed_us, p.combine_us);
        /* A first batch is issued, then complete, then flagged (issued and
         * stored -1 when no push warp had rows for a peer). */
        cr_assert((p.combine_issued_us >= 0) == (p.combine_stored_us >= 0) &&
                      (p.combine_issued_us >= 0) == (p.combine_fenced_us >= 0) &&
                      (p.combine_issued_us < 0 ||
                       (p.combine_issued_us <= p.combine_stored_us && p.combine_stored_us <= p.combine_fenced_us &&
                        p.combine_fenced_us <= p.combine_pushed_us)),
                  "rank %d: first batch issued %.1f, stored %.1f, fenced %.1f, pushed %.1f us", t.c.rank,
                  p.combine_issued_us, p.combine_stored_us, p.combine_fenced_us, p.combine_pushed_us);
        /* Every unit of summing work waits for its rows before it sums
         * (-1 when this rank had no tokens). */
        cr_assert(p.combine_flags_in_us <= p.combine_us, "rank %d: flags in %.1f us after the end %.1f us", t.c.rank,
                  p.combine_flags_in_us, p.combine_us);
        if (t.c.rank == 0 && call == 1)
            printf("profile (%s, %s, 2 ranks time-sliced: not a timing): dispatch %.1f %.1f %.1f %.1f %.1f %.1f "
                   "%.1f %.1f, combine %.1f %.1f %.1f %.1f us\n", t.name, tune, d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
                   p.combine_issued_us, p.combine_stored_us, p.combine_pushed_us, p.combine_us);
        EXPECT_OK(symm_variant_profile_read(t.v, t.stream, &p));
        cr_assert(p.dispatch_counted_us == -1 && p.dispatch_us == -1 && p.combine_us == -1,
                  "rank %d: a read with no call in between found %.1f %.1f %.1f", t.c.rank, p.dispatch_counted_us,
                  p.dispatch_us, p.combine_us);
        gpu_case_free(&c);
    }
    vt_end(&t);
}

/* PROFILE=2: each kind of warp's spans nest as documented (docs/api.md
 * "Spans": the spans of a loop add up to at most the loop, the parts of a
 * span to at most that span), its counts are whole: every combine warp sums
 * once, dispatch sends every one of this rank's tokens once, every part
 * has rows and chunks; the results stay exact; and the next read, with no
 * call in between, finds nothing. */
static void expect_spans(const vt *t, const symm_variant_profile *p, int tokens, const char *tune, bool parts)
{
    const double e = 1e-6;
#define NESTS(inner, outer)                                                                                        \
    cr_assert((inner) <= (outer) * (1 + e) + e, "rank %d, %s, %s: %s = %.3f us above %s = %.3f us", t->c.rank,    \
              t->name, tune, #inner, (double)(inner), #outer, (double)(outer))
    cr_assert_eq(p->level, 2, "rank %d, %s: level %d", t->c.rank, tune, p->level);
    /* Every warp of combine sums (the push warps after their pushes). */
    cr_assert_eq(p->sums.warps, (uint64_t)t->d->sms * 16, "rank %d, %s, %s: %llu sum warps", t->c.rank, t->name, tune,
                 (unsigned long long)p->sums.warps);
    NESTS(p->sums.wait_us + p->sums.sum_us, p->sums.loop_us);
    cr_assert(p->sums.tokens >= (uint64_t)tokens && p->sums.units >= 1, "rank %d, %s: %llu token sums of %d tokens",
              t->c.rank, tune, (unsigned long long)p->sums.tokens, tokens);
    /* Each of this rank's tokens goes out from one warp. */
    cr_assert_eq(p->rows.tokens, (uint64_t)tokens, "rank %d, %s, %s: %llu tokens sent of %d", t->c.rank, t->name,
                 tune, (unsigned long long)p->rows.tokens, tokens);
    cr_assert(p->rows.warps >= 1 && p->rows.warps <= (uint64_t)t->d->sms * 16, "rank %d: %llu sending warps",
              t->c.rank, (unsigned long long)p->rows.warps);
    NESTS(p->rows.loads_us + p->rows.slots_us + p->rows.drain_us, p->rows.loop_us);
    NESTS(p->push.copy_us + p->push.publish_us, p->push.loop_us);
    NESTS(p->push.loads_us + p->push.slots_us, p->push.copy_us);
    cr_assert(p->push.rows >= p->push.batches, "rank %d: %llu rows in %llu batches", t->c.rank,
              (unsigned long long)p->push.rows, (unsigned long long)p->push.batches);
    NESTS(p->parts.scan_us + p->parts.part_us + p->parts.publish_us, p->parts.loop_us);
    NESTS(p->parts.issue_us + p->parts.loads_us + p->parts.sums_us + p->parts.slots_us, p->parts.part_us);
    cr_assert(p->parts.chunks >= p->parts.parts && p->parts.rows >= p->parts.parts, "rank %d: %llu parts, %llu "
              "chunks, %llu rows", t->c.rank, (unsigned long long)p->parts.parts, (unsigned long long)p->parts.chunks,
              (unsigned long long)p->parts.rows);
    /* The push warps forming parts (PUSH_PARTIALS) pushed no whole rows, and
     * the other way round. */
    cr_assert(parts ? p->parts.warps >= 1 && p->push.warps == 0 : p->parts.warps == 0, "rank %d, %s, %s: %llu warps "
              "forming parts, %llu pushing rows", t->c.rank, t->name, tune, (unsigned long long)p->parts.warps,
              (unsigned long long)p->push.warps);
#undef NESTS
}

static void spans_case(want w, const char *tag, const char *knobs, bool parts)
{
    vt t;
    vt_setup(&t, tag, w, 0);
    char tune[96];
    snprintf(tune, sizeof tune, "%s%sPROFILE=2", knobs, *knobs ? "," : "");
    symm_variant_options o = native_options();
    o.tune = tune;
    vt_open(&t, &o);
    for (uint64_t call = 1; call <= 2; call++) {
        int tokens[MAX_W];
        random_tokens(&t, tokens, 300 + call);
        gpu_case c;
        gpu_case_upload(&t, &c, moe_rng_for(t.seed, 9, call).s, t.seed ^ (call << 9), tokens, false);
        gpu_case_poison(&t, &c);
        gpu_case_call(&t, &c, call, false);
        symm_variant_profile p;
        EXPECT_OK(symm_variant_profile_read(t.v, t.stream, &p));
        expect_spans(&t, &p, tokens[t.c.rank], tune, parts);
        if (t.c.rank == 0 && call == 1)
            printf("spans (%s, %s, not a timing): a part warp's loop %.1f us (parts %.1f), a push warp's %.1f, a sum "
                   "warp's %.1f (waits %.1f), a sending warp's %.1f (loads %.1f)\n", t.name, tune,
                   p.parts.warps ? p.parts.loop_us / (double)p.parts.warps : 0.0,
                   p.parts.warps ? (double)p.parts.parts / (double)p.parts.warps : 0.0,
                   p.push.warps ? p.push.loop_us / (double)p.push.warps : 0.0, p.sums.loop_us / (double)p.sums.warps,
                   p.sums.wait_us / (double)p.sums.warps, p.rows.loop_us / (double)p.rows.warps,
                   p.rows.loads_us / (double)p.rows.warps);
        EXPECT_OK(symm_variant_profile_read(t.v, t.stream, &p));
        cr_assert(p.level == 2 && p.sums.warps == 0 && p.rows.warps == 0 && p.parts.warps == 0 && p.push.warps == 0 &&
                      p.sums.loop_us == 0 && p.rows.tokens == 0,
                  "rank %d: a read with no call in between found spans", t.c.rank);
        gpu_case_free(&c);
    }
    vt_end(&t);
}

Test(variant, spans_of_layout_rank_nest_and_count_every_warp)
{
    spans_case(LAYOUT_RANK_ANY, "spans-rank", "", false);
}

/* Layout expert at the default spec's sizes: the grid forms the parts
 * (PARTIAL_GRID), which the sums wait for; with PUSH_PARTIALS the push
 * warps form them (partial_row). */
Test(variant, spans_of_layout_expert_nest_and_count_every_warp)
{
    spans_case(LAYOUT_EXPERT_ANY, "spans-expert", "", false);
}

Test(variant, spans_of_pushed_partial_sums_nest_and_count_every_part)
{
    spans_case(LAYOUT_EXPERT_ANY, "spans-parts", "PUSH_PARTIALS=1", true);
}

/* ---- 4. backends -------------------------------------------------------------------------- */

/* The NCCL backend's calls on two streams, queued with no synchronisation
 * between them: the second dispatch's work (which rewrites the route, the
 * plan's device arrays and the received rows) must queue after the first
 * combine's, which read them, on another stream. Both combines exact. */
Test(variant, nccl_backend_pairs_on_two_streams_queue_in_order)
{
    vt t;
    vt_setup_nccl(&t, "nccl-streams", 0);
    symm_variant_options o = {.backend = SYMM_BACKEND_NCCL};
    vt_open(&t, &o);
    vt u = t;
    CU_OK(cuStreamCreate(&u.stream, CU_STREAM_NON_BLOCKING));
    gpu_case a, b;
    int tokens[MAX_W];
    random_tokens(&t, tokens, 500);
    gpu_case_upload(&t, &a, moe_rng_for(t.seed, 11, 0).s, t.seed ^ 0x5a, tokens, false);
    gpu_case_poison(&t, &a);
    random_tokens(&t, tokens, 501);
    gpu_case_upload(&t, &b, moe_rng_for(t.seed, 11, 1).s, t.seed ^ 0xa5, tokens, false);
    gpu_case_poison(&t, &b);
    EXPECT_OK(symm_variant_dispatch(t.v, &a.args, t.stream));
    EXPECT_OK(symm_variant_combine(t.v, (const void *)a.y, (void *)a.out, t.stream));
    EXPECT_OK(symm_variant_dispatch(t.v, &b.args, u.stream));
    EXPECT_OK(symm_variant_combine(t.v, (const void *)b.y, (void *)b.out, u.stream));
    CU_OK(cuStreamSynchronize(u.stream));
    CU_OK(cuStreamSynchronize(t.stream));
    expect_out(&t, a.k, a.out, "the first pair's combine out (first stream)");
    expect_results(&u, b.k, b.out, 2, false);
    CU_OK(cuStreamDestroy(u.stream));
    gpu_case_free(&a);
    gpu_case_free(&b);
    vt_end(&t);
}

Test(variant, nccl_backend_refuses_stream_capture_saying_why)
{
    vt t;
    vt_setup_nccl(&t, "nccl-capture", 0);
    symm_variant_options o = {.backend = SYMM_BACKEND_NCCL};
    vt_open(&t, &o);
    gpu_case c;
    gpu_case_start(&t, &c, false);

    for (int combine = 0; combine < 2; combine++) {
        capture_begin(&t);
        symm_status st = combine ? symm_variant_combine(t.v, (const void *)c.y, (void *)c.out, t.stream)
                                 : symm_variant_dispatch(t.v, &c.args, t.stream);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", symm_last_error());
        capture_end_expect_empty(&t, combine ? "combine" : "dispatch");
        cr_assert(st == SYMM_ERR_STATE && strstr(msg, "capture") && strstr(msg, "NCCL"),
                  "rank %d: NCCL %s during stream capture: %s (%s), expected SYMM_ERR_STATE saying that the NCCL "
                  "backend cannot be captured", t.c.rank, combine ? "combine" : "dispatch", symm_status_name(st),
                  msg);
    }
    /* Outside capture the same call works, and every rank is still in step. */
    gpu_case_call(&t, &c, 1, false);

    gpu_case_free(&c);
    vt_end(&t);
}

/* Ranks that share a GPU cannot have the NCCL backend, and are told so. The
 * refusal comes after the variant's kernels (the NCCL backend's own among
 * them, a third JIT part) were compiled and loaded and its buffers set
 * up, so on one GPU this runs that much of the backend; everything is
 * released, and the same world still makes a native variant that works. */
Test(variant, nccl_backend_on_a_shared_gpu_is_refused_after_its_kernels_load)
{
    vt t;
    vt_setup(&t, "nccl-shared", ANY, 0);
    if (symm_device_gpu_count(t.c.dev) >= t.c.ranks || symm_nccl_shared_gpu_mode()) {
        printf("skipped: NCCL is let share GPUs here (every rank has its own GPU, or symmrun "
               "--nccl-shared-gpu)\n");
        fflush(stdout);
        vt_finish(&t);
        cr_skip_test("NCCL is let share GPUs here");
    }
    symm_variant_options o = {.backend = SYMM_BACKEND_NCCL};
    symm_variant *v = NULL;
    symm_status st = symm_variant_open(t.c.world, t.manifest, t.name, &o, &v);
    cr_assert(st == SYMM_ERR_UNSUPPORTED && v == NULL,
              "rank %d: NCCL backend with %d ranks on %d GPUs: %s (%s), expected SYMM_ERR_UNSUPPORTED and no variant",
              t.c.rank, t.c.ranks, symm_device_gpu_count(t.c.dev), symm_status_name(st), symm_last_error());
    cr_assert(strstr(symm_last_error(), "NCCL needs one GPU per rank") && strstr(symm_last_error(), t.name),
              "rank %d: the message should name the variant and say why: %s", t.c.rank, symm_last_error());
    symm_variant_options n = native_options();
    vt_open(&t, &n);
    gpu_case c;
    gpu_case_start(&t, &c, false);
    gpu_case_call(&t, &c, 1, false);
    gpu_case_free(&c);
    vt_end(&t);
}

Test(variant, unknown_symm_backend_is_refused_listing_the_accepted_values)
{
    vt t;
    vt_setup(&t, "backend-env", ANY, 0);
    char value[32];
    unsigned long long s = fresh_seed();
    snprintf(value, sizeof value, "nvlink%llu", next_random(&s) % 100000);
    /* Every rank fails alike, before any collective (the backend is picked first). */
    setenv("SYMM_BACKEND", value, 1);
    symm_variant_options o = {.backend = SYMM_BACKEND_DEFAULT};
    symm_variant *v = (symm_variant *)&v;
    symm_status st = symm_variant_open(t.c.world, t.manifest, t.name, &o, &v);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", symm_last_error());
    cr_assert(st == SYMM_ERR_INVALID_ARG && v == NULL,
              "rank %d: SYMM_BACKEND=%s: got %s (%s) and %s variant, expected SYMM_ERR_INVALID_ARG and none",
              t.c.rank, value, symm_status_name(st), msg, v ? "a" : "no");
    cr_assert(strstr(msg, "SYMM_BACKEND") && strstr(msg, value) && strstr(msg, "native, nccl or hybrid"),
              "rank %d: the message should name SYMM_BACKEND, its value %s and list \"native, nccl or hybrid\": %s",
              t.c.rank, value, msg);

    /* A retry starts clean: the default is native again. */
    unsetenv("SYMM_BACKEND");
    vt_open(&t, &o);
    cr_assert(symm_variant_backend(t.v) == SYMM_BACKEND_NATIVE, "rank %d: without SYMM_BACKEND the backend is "
              "%d, expected native (%d)", t.c.rank, (int)symm_variant_backend(t.v), (int)SYMM_BACKEND_NATIVE);
    good_call(&t, 0);
    vt_end(&t);
}

/* ---- 5. many calls in a row -------------------------------------------------------------- */

#define STRESS_CALLS 200

Test(variant, back_to_back_calls_without_host_sync_stay_in_step)
{
    vt t;
    vt_start(&t, "stress", LAYOUT_RANK_ANY);
    const symm_variant_desc *d = t.d;
    /* Two input sets in turn, so that a call that saw the previous call's
     * data would show; one y, whose rows both sets' references agree on. */
    vcase *k[2];
    dev_in b[2];
    for (int i = 0; i < 2; i++) {
        int tokens[MAX_W];
        random_tokens(&t, tokens, (unsigned long long)i);
        k[i] = case_build(d, moe_rng_for(t.seed, 5, (uint64_t)i).s, t.seed + 7, tokens);
        dev_in_alloc(d, &b[i]);
        dev_in_upload(&t, k[i], &b[i]);
    }
    const int me = t.c.rank;
    CUdeviceptr y = y_alloc(d);
    y_upload(&t, k[k[0]->y_rows[me] >= k[1]->y_rows[me] ? 0 : 1], y);
    /* Each call's combine writes its own slice of out, so every call is checked. */
    const size_t slice = (size_t)d->max_tokens * y_row(d);
    CUdeviceptr out = dalloc(STRESS_CALLS * slice);
    poison(&t, out, STRESS_CALLS * slice);

    symm_dispatch_args a[2] = {good_args(d, &b[0], k[0]->in[me].tokens, false),
                               good_args(d, &b[1], k[1]->in[me].tokens, false)};
    for (int i = 0; i < STRESS_CALLS; i++) {
        EXPECT_OK(symm_variant_dispatch(t.v, &a[i % 2], t.stream));
        EXPECT_OK(symm_variant_combine(t.v, (const void *)y, (void *)(out + (size_t)i * slice), t.stream));
    }
    const int last = (STRESS_CALLS - 1) % 2;
    expect_results(&t, k[last], out + (size_t)(STRESS_CALLS - 1) * slice, STRESS_CALLS, false);
    for (int i = 0; i < STRESS_CALLS - 1; i++) {
        char what[64];
        snprintf(what, sizeof what, "combine out of call %d of %d", i + 1, STRESS_CALLS);
        expect_out(&t, k[i % 2], out + (size_t)i * slice, what);
    }

    for (int i = 0; i < 2; i++) {
        dev_in_free(&b[i]);
        case_free(k[i]);
    }
    CU_OK(cuMemFree(y));
    CU_OK(cuMemFree(out));
    vt_end(&t);
}

/* ---- 6. where the results live ------------------------------------------------------------- */

/* p must be set exactly when the variant has the buffer; a symmetric one must
 * lie wholly in a live symmetric allocation, a local one in device memory. */
static void expect_buffer(const vt *t, const char *what, CUdeviceptr p, bool has, bool symmetric, size_t bytes)
{
    if (!has) {
        cr_assert(p == 0, "rank %d: %s: recv.%s is 0x%llx, expected 0 (the variant has no such buffer)", t->c.rank,
                  t->name, what, (unsigned long long)p);
        return;
    }
    cr_assert(p != 0, "rank %d: %s: recv.%s is 0, expected a device pointer", t->c.rank, t->name, what);
    if (symmetric) {
        symm_alloc *owner;
        size_t offset;
        symm_status st = symm_alloc_find(p, bytes, &owner, &offset);
        cr_assert(st == SYMM_OK, "rank %d: %s: recv.%s (%zu bytes) is not inside a symmetric allocation: %s",
                  t->c.rank, t->name, what, bytes, symm_last_error());
        return;
    }
    CUdeviceptr base;
    size_t size;
    CU_OK(cuMemGetAddressRange(&base, &size, p));
    cr_assert(p + bytes <= base + size, "rank %d: %s: recv.%s needs %zu bytes, its allocation ends %llu bytes "
              "after it", t->c.rank, t->name, what, bytes, (unsigned long long)(base + size - p));
}

static void expect_recv_pointers(const vt *t)
{
    const symm_variant_desc *d = t->d;
    const size_t cap = (size_t)d->capacity, K = (size_t)d->topk, L = (size_t)(d->experts / d->world);
    const bool rank = d->layout == SYMM_LAYOUT_RANK, fp8 = d->dtype == SYMM_DTYPE_FP8_E4M3;
    symm_recv_buffers rb;
    memset(&rb, POISON, sizeof rb);
    EXPECT_OK(symm_variant_recv(t->v, &rb));
    expect_buffer(t, "x", rb.x, true, true, cap * x_row(d));
    expect_buffer(t, "scales", rb.scales, fp8, true, cap * scales_row(d));
    expect_buffer(t, "src", rb.src, true, true, cap * 16);
    expect_buffer(t, "topk_idx", rb.topk_idx, rank, true, cap * K * 4);
    expect_buffer(t, "weights", rb.weights, d->weights, true, cap * (rank ? K : 1) * 4);
    expect_buffer(t, "expert_count", rb.expert_count, true, false, L * 4);
    expect_buffer(t, "expert_offset", rb.expert_offset, !rank, false, L * 4);
    expect_buffer(t, "rows", rb.rows, true, false, 4);
    symm_status st = symm_variant_recv(t->v, NULL);
    cr_assert(st == SYMM_ERR_INVALID_ARG, "rank %d: symm_variant_recv(v, NULL) gave %s, expected "
              "SYMM_ERR_INVALID_ARG", t->c.rank, symm_status_name(st));
}

Test(variant, recv_buffers_are_set_exactly_where_the_variant_has_them)
{
    vt t;
    vt_setup(&t, "recv-ptrs", ANY, 0);
    /* One variant per (layout, fp8, weights) that the manifest has. */
    int tried = 0;
    for (int layout = 0; layout < 2; layout++)
        for (int fp8 = 0; fp8 < 2; fp8++)
            for (int weights = 0; weights < 2; weights++) {
                if (!pick_variant(t.manifest, t.c.ranks, (want){layout, weights, fp8, 0, 0}, t.name, sizeof t.name,
                                  NULL))
                    continue;
                symm_variant_options o = native_options();
                vt_open(&t, &o);
                expect_recv_pointers(&t);
                vt_close(&t);
                tried++;
            }
    cr_assert(tried >= 2, "rank %d: only %d kinds of variant of world %d in %s", t.c.rank, tried, t.c.ranks,
              t.manifest);
    vt_finish(&t);
}

/* ---- 7. the world's size -------------------------------------------------------------------- */

Test(variant, variant_of_another_world_size_is_refused_before_any_collective)
{
    vt t;
    vt_setup(&t, "world-size", ANY, 0);
    char other[64];
    int other_world = 0;
    if (!pick_variant(t.manifest, t.c.ranks, (want){-1, -1, -1, 1, 0}, other, sizeof other, &other_world)) {
        printf("skipped: %s has no variant for another world than %d\n", t.manifest, t.c.ranks);
        fflush(stdout);
        vt_finish(&t);
        cr_skip_test("no variant of another world size");
    }
    /* Rank 0 alone: a collective inside would leave it out of step with the
     * others, and the good variant below would fail. */
    if (t.c.rank == 0) {
        symm_variant *v = (symm_variant *)&v;
        symm_variant_options o = native_options();
        symm_status st = symm_variant_open(t.c.world, t.manifest, other, &o, &v);
        char msg[1024], a[32], b[32];
        snprintf(msg, sizeof msg, "%s", symm_last_error());
        snprintf(a, sizeof a, "world %d", other_world);
        snprintf(b, sizeof b, "%d ranks", t.c.ranks);
        cr_assert(st == SYMM_ERR_INVALID_ARG && v == NULL,
                  "rank 0: opening %s (world %d) on a world of %d: %s (%s), expected SYMM_ERR_INVALID_ARG and no "
                  "variant", other, other_world, t.c.ranks, symm_status_name(st), msg);
        cr_assert(strstr(msg, a) && strstr(msg, b), "rank 0: the message should say \"%s\" and \"%s\": %s", a, b,
                  msg);
    }
    symm_variant_options o = native_options();
    vt_open(&t, &o);
    good_call(&t, 0);
    vt_end(&t);
}

/* Kernels that do not say how much dynamic shared memory they launch with
 * (a source that is not symmgen's, here the combine's size symbol renamed)
 * are refused at create, naming the symbol, on every rank; the world is
 * still usable after. */
Test(variant, kernels_without_their_shared_memory_size_are_refused_naming_the_symbol)
{
    vt t;
    vt_setup(&t, "smem-symbol", ANY, 0);
    symm_manifest *m = NULL;
    symm_status st = symm_manifest_open(t.manifest, &m);
    cr_assert(st == SYMM_OK, "rank %d: symm_manifest_open(%s): %s", t.c.rank, t.manifest, symm_last_error());
    const symm_variant_desc *d = NULL;
    st = symm_manifest_variant(m, t.name, &d);
    cr_assert(st == SYMM_OK, "rank %d: symm_manifest_variant(%s): %s", t.c.rank, t.name, symm_last_error());
    const char *def = "symm_combine_smem = ";
    const char *at = strstr(d->source, def);
    cr_assert_not_null(at, "%s: its source defines no \"%s\"", t.name, def);
    char *source = strdup(d->source);
    cr_assert_not_null(source);
    source[at - d->source + strlen("symm_combine_sme")] = 'X'; /* symm_combine_smeX */
    symm_variant_desc bad = *d;
    bad.source = source;
    bad.source_len = strlen(source);
    symm_variant *v = (symm_variant *)&v;
    symm_variant_options o = native_options();
    st = symm_variant_create(t.c.world, &bad, &o, &v);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", symm_last_error());
    cr_assert(st == SYMM_ERR_UNSUPPORTED && v == NULL,
              "rank %d: %s without symm_combine_smem: %s (%s), expected SYMM_ERR_UNSUPPORTED and no variant",
              t.c.rank, t.name, symm_status_name(st), msg);
    cr_assert(strstr(msg, "symm_combine_smem") && strstr(msg, t.name) && strstr(msg, "regenerate"),
              "rank %d: the message should name the variant, the symbol and the remedy: %s", t.c.rank, msg);
    free(source);
    symm_manifest_close(m);
    vt_open(&t, &o);
    good_call(&t, 0);
    vt_end(&t);
}

/* Dispatch and combine alternate: a second dispatch before the combine, or a
 * combine with no dispatch, is refused on the host (nothing queued), and the
 * variant stays in step for the right call. */
/* The default streams (the legacy one and the per-thread one) take the calls
 * too, with ordinary launches (PDL is for streams the application made): the
 * same exact results, in step with the calls on t's own stream. */
Test(variant, calls_on_the_default_streams_are_exact)
{
    vt t;
    vt_start(&t, "default-streams", ANY);
    CUstream streams[] = {NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, t.stream};
    for (uint64_t i = 0; i < 4; i++) {
        vt u = t;
        u.stream = streams[i];
        int tokens[MAX_W];
        random_tokens(&u, tokens, 300 + i);
        gpu_case c;
        gpu_case_upload(&u, &c, moe_rng_for(t.seed, 9, i).s, t.seed ^ (i << 12), tokens, false);
        gpu_case_poison(&u, &c);
        gpu_case_call(&u, &c, i + 1, false);
        gpu_case_free(&c);
    }
    vt_end(&t);
}

Test(variant, dispatch_and_combine_must_alternate)
{
    vt t;
    vt_start(&t, "alternate", LAYOUT_EXPERT_ANY);
    gpu_case c;
    gpu_case_start(&t, &c, false);

    symm_status st = symm_variant_combine(t.v, (const void *)c.y, (void *)c.out, t.stream);
    cr_assert(st == SYMM_ERR_STATE && strstr(symm_last_error(), "no dispatch to combine"),
              "rank %d: combine before any dispatch: %s (%s)", t.c.rank, symm_status_name(st), symm_last_error());
    EXPECT_OK(symm_variant_dispatch(t.v, &c.args, t.stream));
    st = symm_variant_dispatch(t.v, &c.args, t.stream);
    cr_assert(st == SYMM_ERR_STATE && strstr(symm_last_error(), "has not been combined"),
              "rank %d: second dispatch: %s (%s)", t.c.rank, symm_status_name(st), symm_last_error());
    gpu_case_combine(&t, &c, 1, false);
    gpu_case_free(&c);
    vt_end(&t);
}
