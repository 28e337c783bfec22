/* check.c: the GPU test matrix of dispatch and combine (one rank per process,
 * started by symmrun). For every variant of a manifest whose world matches,
 * for every routing and batch size, every rank generates the whole world's
 * inputs from one shared fresh seed, runs the CPU reference for the whole
 * world, runs dispatch and combine on the GPU with poisoned outputs, and
 * compares its own results bit for bit. Also: CUDA-graph replays with fresh
 * inputs and T read from device memory.
 *
 * usage: check --manifest out/default/manifest.json [--variant NAME]...
 *              [--backend native|nccl|hybrid] [--quick] [--graph-replays N] [--seed S]
 *              [--time N [--time-only]] [--max-elems N] [--skip-unsupported]
 * --time N times N calls at max_tokens after the matrix (and checks the last);
 * --time-only skips the matrix. --skip-unsupported: a variant whose create
 * is refused as SYMM_ERR_UNSUPPORTED (here: ranks sharing a GPU under CUDA
 * MPS that cannot all be resident at once) is listed as "unsupported NAME:
 * why" instead of failing; scripts/test-gpu.sh runs it again time-sliced.
 * --backend hybrid (a world of several hosts, symmrun --sim-hosts): the
 * variants with a companion for the world's host count, against the CPU
 * reference's hybrid order (symm_ref_config.hosts); a drop is counted at
 * the proxy that forwarded the row, so rows sent and dropped are compared
 * as the world's sum; dispatch during stream capture must be refused.
 * Prints "check: N passed, M failed" (rank 0) and exits 1 on any failure. */
#include <cuda.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe_inputs.h"
#include "par_ranks.h"
#include "symm_heap.h"
#include "symm_manifest.h"
#include "symm_ref.h"
#include "symm_variant.h"
#include "symm_world.h"

#define POISON 0xA5

static int g_rank;
static symm_world *g_world;
static symm_backend g_backend;
static int g_hosts; /* --backend hybrid: the world's hosts (the reference's order); else 0 */

static const char *backend_name(symm_backend b)
{
    return b == SYMM_BACKEND_NCCL ? "nccl" : b == SYMM_BACKEND_HYBRID ? "hybrid" : "native";
}

/* The reference's configuration of variant d for the backend under test. */
static symm_ref_config ref_config(const symm_variant_desc *d)
{
    symm_ref_config cfg = moe_ref_config(d);
    cfg.hosts = g_hosts;
    return cfg;
}

static void die(const char *what, symm_status st)
{
    fprintf(stderr, "check: %s: %s: %s\n", what, symm_status_name(st), symm_last_error());
    exit(2);
}

#define CU(call)                                                                    \
    do {                                                                            \
        CUresult r_ = (call);                                                       \
        if (r_ != CUDA_SUCCESS) {                                                   \
            const char *n_ = "?";                                                   \
            cuGetErrorName(r_, &n_);                                                \
            fprintf(stderr, "check: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, n_); \
            exit(2);                                                                \
        }                                                                           \
    } while (0)

/* ---- routings ------------------------------------------------------------ */
typedef enum { R_UNIFORM, R_ONE_RANK, R_ZIPF, R_MASKED, R_EMPTY, R_INVALID, R_COUNT } routing;
static const char *const routing_names[R_COUNT] = {"uniform", "one-rank", "zipf", "masked", "empty", "invalid"};

/* Pick K distinct experts for one token. */
static void pick_row(moe_rng *r, routing how, const symm_variant_desc *d, const double *zipf_cdf, int32_t *row)
{
    const int E = d->experts, K = d->topk, L = d->experts / d->world;
    for (int k = 0; k < K; k++) {
        int e;
        do {
            switch (how) {
            case R_ONE_RANK: /* experts of rank 0 first, then anywhere once they run out */
                e = k < L ? moe_rng_int(r, L) : moe_rng_int(r, E);
                break;
            case R_ZIPF:
                e = moe_zipf_expert(r, zipf_cdf, E);
                break;
            default:
                e = moe_rng_int(r, E);
            }
        } while (moe_row_has(row, k, e));
        row[k] = e;
    }
    if (how == R_MASKED || how == R_EMPTY)
        for (int k = 0; k < K; k++)
            if (how == R_EMPTY || moe_rng_unit(r) < 0.35)
                row[k] = -1;
    if (how == R_INVALID)
        for (int k = 0; k < K; k++) {
            double u = moe_rng_unit(r);
            if (u < 0.06)
                row[k] = E + moe_rng_int(r, 5);
            else if (u < 0.10)
                row[k] = -2 - moe_rng_int(r, 5);
            else if (u < 0.16 && k > 0)
                row[k] = row[moe_rng_int(r, k)]; /* a repeat */
        }
}

/* One rank's host inputs. */
typedef struct inputs {
    int tokens;
    void *x;
    float *scales;
    int32_t *topk;
    float *weights;
} inputs;

static void make_inputs(const symm_variant_desc *d, uint64_t seed, int case_id, int rank, routing how,
                        int tokens, const double *zipf_cdf, inputs *in)
{
    moe_rng r = moe_rng_for(seed, (uint64_t)case_id, (uint64_t)rank + 1);
    const size_t H = (size_t)d->hidden, K = (size_t)d->topk, T = (size_t)tokens;
    in->tokens = tokens;
    in->x = malloc(T * H * symm_dtype_size(d->dtype) + 16);
    in->scales = d->dtype == SYMM_DTYPE_FP8_E4M3 ? malloc(T * (H / SYMM_FP8_BLOCK) * 4 + 16) : NULL;
    in->topk = malloc(T * K * 4 + 16);
    in->weights = d->weights ? malloc(T * K * 4 + 16) : NULL;
    moe_random_elems(&r, d->dtype, in->x, T * H);
    if (in->scales)
        moe_random_floats(&r, in->scales, T * (H / SYMM_FP8_BLOCK), 0.01);
    for (size_t t = 0; t < T; t++)
        pick_row(&r, how, d, zipf_cdf, in->topk + t * K);
    if (in->weights)
        moe_random_floats(&r, in->weights, T * K, 0.0);
}

static void free_inputs(inputs *in)
{
    free(in->x);
    free(in->scales);
    free(in->topk);
    free(in->weights);
    memset(in, 0, sizeof *in);
}

/* ---- device buffers of one rank ----------------------------------------- */
typedef struct dev_inputs {
    CUdeviceptr x, scales, topk, weights, tokens, y, out;
    /* y's two places: the variant's region y (combine = "pull" or "auto":
     * where the peers read it) and one of this rank's own (ordinary device
     * memory; "push" or "auto"); y is the one the next call uses. */
    CUdeviceptr y_sym, y_own;
} dev_inputs;

static CUdeviceptr dalloc(size_t n)
{
    CUdeviceptr p;
    CU(cuMemAlloc(&p, n < 16 ? 16 : n));
    return p;
}

/* ---- comparison ---------------------------------------------------------- */
typedef struct failures {
    int count;
    char first[512];
} failures;

static void fail(failures *f, const char *fmt, ...)
{
    if (f->count++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->first, sizeof f->first, fmt, ap);
        va_end(ap);
    }
}

static void compare_bytes(failures *f, const char *what, const void *got, const void *want, size_t n, size_t row_bytes)
{
    const unsigned char *g = got, *w = want;
    for (size_t i = 0; i < n; i++)
        if (g[i] != w[i]) {
            fail(f, "%s: first difference at byte %zu (row %zu): got 0x%02x, want 0x%02x", what, i,
                 row_bytes ? i / row_bytes : 0, g[i], w[i]);
            return;
        }
}

static void *dget(CUdeviceptr p, size_t n)
{
    void *h = malloc(n ? n : 1);
    if (n)
        CU(cuMemcpyDtoH(h, p, n));
    return h;
}

/* Layout expert: whether row r is inside a segment of the reference. */
static bool in_segment(const symm_ref_recv *ref, int L, int64_t r)
{
    for (int j = 0; j < L; j++)
        if (r >= ref->expert_offset[j] && r < (int64_t)ref->expert_offset[j] + ref->expert_count[j])
            return true;
    return false;
}

static void compare_dispatch(failures *f, const symm_variant_desc *d, symm_variant *v, const symm_ref_recv *ref,
                             const symm_ref_send_stats *send, const symm_variant_stats *st)
{
    symm_recv_buffers rb;
    if (symm_variant_recv(v, &rb) != SYMM_OK)
        die("symm_variant_recv", SYMM_ERR_STATE);
    const int L = d->experts / d->world, K = d->topk;
    const size_t H = (size_t)d->hidden, row_bytes = H * symm_dtype_size(d->dtype);
    const int64_t rows = ref->rows;
    if (st->recv_rows != rows)
        fail(f, "recv_rows: got %d, want %" PRId64, st->recv_rows, rows);
    if (st->invalid != send->invalid)
        fail(f, "invalid: got %d, want %" PRId64, st->invalid, send->invalid);
    if (st->dropped_send != send->dropped || st->dropped_recv != ref->dropped)
        fail(f, "dropped: got send %d recv %d, want %" PRId64 " %" PRId64, st->dropped_send, st->dropped_recv,
             send->dropped, ref->dropped);
    if (f->count)
        return;
    unsigned char *x = dget(rb.x, (size_t)rows * row_bytes);
    int32_t *src = dget(rb.src, (size_t)rows * 16);
    int32_t *ec = dget(rb.expert_count, (size_t)L * 4);
    compare_bytes(f, "expert_count", ec, ref->expert_count, (size_t)L * 4, 4);
    if (d->layout == SYMM_LAYOUT_EXPERT) {
        int32_t *eo = dget(rb.expert_offset, (size_t)L * 4);
        compare_bytes(f, "expert_offset", eo, ref->expert_offset, (size_t)L * 4, 4);
        free(eo);
        float *w = d->weights ? dget(rb.weights, (size_t)rows * 4) : NULL;
        const unsigned char *rx = ref->x;
        for (int64_t r = 0; r < rows && !f->count; r++) {
            const unsigned char *gx = x + r * row_bytes;
            if (!in_segment(ref, L, r)) { /* padding: untouched since the poison */
                for (size_t i = 0; i < row_bytes; i++)
                    if (gx[i] != POISON) {
                        fail(f, "padding row %" PRId64 " was written (byte %zu = 0x%02x)", r, i, gx[i]);
                        break;
                    }
                continue;
            }
            compare_bytes(f, "recv_x", gx, rx + r * row_bytes, row_bytes, row_bytes);
            compare_bytes(f, "recv_src", src + r * 4, ref->src + r * 4, 16, 16);
            if (w)
                compare_bytes(f, "recv_weights", w + r, ref->weights + r, 4, 4);
            if (f->count)
                snprintf(f->first + strlen(f->first), sizeof f->first - strlen(f->first), " [row %" PRId64 "]", r);
        }
        free(w);
    } else {
        compare_bytes(f, "recv_x", x, ref->x, (size_t)rows * row_bytes, row_bytes);
        for (int64_t r = 0; r < rows && !f->count; r++)
            compare_bytes(f, "recv_src", src + r * 4, ref->src + r * 4, 16, 16);
        int32_t *tk = dget(rb.topk_idx, (size_t)rows * K * 4);
        compare_bytes(f, "recv_topk_idx", tk, ref->topk_idx, (size_t)rows * K * 4, (size_t)K * 4);
        free(tk);
        if (d->weights) {
            float *w = dget(rb.weights, (size_t)rows * K * 4);
            compare_bytes(f, "recv_weights", w, ref->weights, (size_t)rows * K * 4, (size_t)K * 4);
            free(w);
        }
    }
    if (d->dtype == SYMM_DTYPE_FP8_E4M3 && !f->count) {
        const size_t sb = H / SYMM_FP8_BLOCK * 4;
        float *s = dget(rb.scales, (size_t)rows * sb);
        for (int64_t r = 0; r < rows && !f->count; r++)
            if (d->layout == SYMM_LAYOUT_RANK || in_segment(ref, L, r))
                compare_bytes(f, "recv_scales", (char *)s + r * sb, (char *)ref->scales + r * sb, sb, sb);
        free(s);
    }
    free(x);
    free(src);
    free(ec);
}

/* ---- one case ------------------------------------------------------------- */
typedef struct world_case {
    const symm_variant_desc *d;
    symm_variant *v;
    CUstream stream;
    dev_inputs dev;
    uint64_t seed;
    double *zipf_cdf;
    /* The reference's receive buffers, allocated once per variant (lazily:
     * symm_ref_recv_alloc_lazy) and poisoned again before each case where
     * the last one wrote (symm_ref_recv_repoison): fresh capacity-sized
     * allocations made the host side the cost of the matrix, the kernel
     * zeroing pages. */
    symm_ref_recv pool[SYMM_REF_MAX_WORLD];
    bool pool_ready;
} world_case;

static int tokens_for(const symm_variant_desc *d, int batch_kind, int rank, moe_rng *r)
{
    const int max = d->max_tokens;
    switch (batch_kind) {
    case 0: return 0;
    case 1: return 1;
    case 2: { int t = (max / 3) | 1; return t > max ? max : t; }
    case 3: return max;
    case 5: /* the ranks' tokens add up to the capacity (6: one more) */
    case 6: {
        const int64_t total = d->capacity + (batch_kind == 6), W = d->world;
        return (int)(total / W + (rank < total % W));
    }
    default: return moe_rng_int(r, max + 1) * (rank + 1) % (max + 1); /* differs per rank */
    }
}

/* Host side of one call: inputs of all ranks, the reference, own y. */
typedef struct host_case {
    inputs in[SYMM_REF_MAX_WORLD];
    symm_ref_input ref_in[SYMM_REF_MAX_WORLD];
    symm_ref_recv recv[SYMM_REF_MAX_WORLD];
    symm_ref_send_stats stats[SYMM_REF_MAX_WORLD];
    void *y[SYMM_REF_MAX_WORLD];
    void *out[SYMM_REF_MAX_WORLD];
    symm_status ref_status;
} host_case;

/* host_case_build's work for one rank, run for the ranks on several
 * threads (par_ranks.h): each rank's inputs, receive buffers and y are its
 * own, drawn from its own stream. */
typedef struct case_build {
    world_case *wc;
    host_case *hc;
    symm_ref_config cfg;
    int case_id;
    routing how;
    int tokens[SYMM_REF_MAX_WORLD];
} case_build;

static void build_rank_inputs(void *arg, int p)
{
    case_build *b = arg;
    world_case *wc = b->wc;
    host_case *hc = b->hc;
    make_inputs(wc->d, wc->seed, b->case_id, p, b->how, b->tokens[p], wc->zipf_cdf, &hc->in[p]);
    hc->ref_in[p] = (symm_ref_input){hc->in[p].tokens, hc->in[p].x, hc->in[p].scales, hc->in[p].topk,
                                     hc->in[p].weights};
    if (!wc->pool_ready) {
        /* Zeroed, its pages taken as dispatch writes them: the
         * worst-case capacity of a prefill-sized layout-expert variant is
         * about four times the rows that arrive (nothing here reads past
         * what dispatch wrote). */
        symm_status st = symm_ref_recv_alloc_lazy(&b->cfg, &wc->pool[p]);
        if (st != SYMM_OK)
            die("symm_ref_recv_alloc_lazy", st);
    } else {
        symm_status st = symm_ref_recv_repoison(&b->cfg, &wc->pool[p]);
        if (st != SYMM_OK)
            die("symm_ref_recv_repoison", st);
    }
    hc->recv[p] = wc->pool[p];
}

static void build_rank_y(void *arg, int p)
{
    case_build *b = arg;
    const symm_variant_desc *d = b->wc->d;
    host_case *hc = b->hc;
    const size_t crow = (size_t)d->hidden * symm_dtype_size(d->combine_dtype);
    moe_rng yr = moe_rng_for(b->wc->seed, (uint64_t)b->case_id, 1000 + (uint64_t)p);
    /* Random rows where rows arrived, poison in layout expert's padding
     * between segments; combine reads neither the padding nor any row at or
     * past recv_rows (upload poisons the rest of the device's y).
     * Generating only these keeps layout expert's large aligned capacities
     * cheap. */
    const symm_ref_recv *rv = &hc->recv[p];
    const size_t rows = (size_t)rv->rows;
    hc->y[p] = malloc(rows * crow + 16);
    hc->out[p] = malloc((size_t)hc->in[p].tokens * crow + 16);
    if (!hc->y[p] || !hc->out[p]) {
        fprintf(stderr, "check: rank %d: out of host memory for y (%zu rows) and out\n", p, rows);
        exit(2);
    }
    if (d->layout == SYMM_LAYOUT_EXPERT) {
        memset(hc->y[p], POISON, rows * crow);
        for (int j = 0; j < d->experts / d->world; j++)
            moe_random_elems(&yr, d->combine_dtype, (char *)hc->y[p] + (size_t)rv->expert_offset[j] * crow,
                             (size_t)rv->expert_count[j] * (size_t)d->hidden);
    } else {
        moe_random_elems(&yr, d->combine_dtype, hc->y[p], rows * (size_t)d->hidden);
    }
}

static void host_case_build(world_case *wc, host_case *hc, int case_id, routing how, int batch_kind)
{
    const symm_variant_desc *d = wc->d;
    const int W = d->world;
    case_build b = {.wc = wc, .hc = hc, .cfg = ref_config(d), .case_id = case_id, .how = how};
    /* The token counts from one stream, in rank order, before the ranks'
     * own streams run on their threads. */
    moe_rng tr = moe_rng_for(wc->seed, (uint64_t)case_id, 777);
    for (int p = 0; p < W; p++)
        b.tokens[p] = tokens_for(d, batch_kind, p, &tr);
    const int threads = par_ranks_threads(W);
    par_ranks(W, threads, build_rank_inputs, &b);
    wc->pool_ready = true;
    hc->ref_status = symm_ref_dispatch(&b.cfg, hc->ref_in, hc->recv, hc->stats);
    if (hc->ref_status != SYMM_OK && hc->ref_status != SYMM_ERR_OVERFLOW)
        die("symm_ref_dispatch", hc->ref_status);
    par_ranks(W, threads, build_rank_y, &b);
    symm_status st = symm_ref_combine(&b.cfg, hc->ref_in, hc->recv, (const void *const *)hc->y, hc->out);
    if (st != SYMM_OK)
        die("symm_ref_combine", st);
}

/* The receive buffers go back to the pool (with their rows, which the next
 * build poisons again). */
static void host_case_free(world_case *wc, host_case *hc)
{
    const symm_variant_desc *d = wc->d;
    for (int p = 0; p < d->world; p++) {
        free_inputs(&hc->in[p]);
        wc->pool[p] = hc->recv[p];
        free(hc->y[p]);
        free(hc->out[p]);
    }
}

/* Upload this rank's inputs and y; poison what the call writes. */
static void upload(world_case *wc, host_case *hc, bool tokens_on_device)
{
    const symm_variant_desc *d = wc->d;
    const inputs *in = &hc->in[g_rank];
    const size_t T = (size_t)in->tokens, H = (size_t)d->hidden, K = (size_t)d->topk;
    CUstream s = wc->stream;
    if (T) {
        CU(cuMemcpyHtoDAsync(wc->dev.x, in->x, T * H * symm_dtype_size(d->dtype), s));
        CU(cuMemcpyHtoDAsync(wc->dev.topk, in->topk, T * K * 4, s));
        if (in->scales)
            CU(cuMemcpyHtoDAsync(wc->dev.scales, in->scales, T * (H / SYMM_FP8_BLOCK) * 4, s));
        if (in->weights)
            CU(cuMemcpyHtoDAsync(wc->dev.weights, in->weights, T * K * 4, s));
    }
    int32_t t32 = (int32_t)T;
    if (tokens_on_device)
        CU(cuMemcpyHtoDAsync(wc->dev.tokens, &t32, 4, s));
    const size_t crow = H * symm_dtype_size(d->combine_dtype);
    /* y: the rows that arrived, poison past them (read nowhere). */
    const size_t y_rows = (size_t)hc->recv[g_rank].rows;
    CU(cuMemsetD8Async(wc->dev.y, POISON, (size_t)d->capacity * crow, s));
    if (y_rows)
        CU(cuMemcpyHtoDAsync(wc->dev.y, hc->y[g_rank], y_rows * crow, s));
    CU(cuMemsetD8Async(wc->dev.out, POISON, (size_t)d->max_tokens * crow, s));
    symm_recv_buffers rb;
    const symm_status rs = symm_variant_recv(wc->v, &rb);
    if (rs != SYMM_OK)
        die("symm_variant_recv", rs);
    const size_t cap = (size_t)d->capacity;
    CU(cuMemsetD8Async(rb.x, POISON, cap * H * symm_dtype_size(d->dtype), s));
    CU(cuMemsetD8Async(rb.src, POISON, cap * 16, s));
    /* Every expert's count (and offset) is written by each call. */
    CU(cuMemsetD8Async(rb.expert_count, POISON, (size_t)(d->experts / d->world) * 4, s));
    if (rb.expert_offset)
        CU(cuMemsetD8Async(rb.expert_offset, POISON, (size_t)(d->experts / d->world) * 4, s));
    if (rb.topk_idx)
        CU(cuMemsetD8Async(rb.topk_idx, POISON, cap * K * 4, s));
    if (rb.weights)
        CU(cuMemsetD8Async(rb.weights, POISON, cap * (d->layout == SYMM_LAYOUT_RANK ? K : 1) * 4, s));
    if (rb.scales)
        CU(cuMemsetD8Async(rb.scales, POISON, cap * (H / SYMM_FP8_BLOCK) * 4, s));
    CU(cuStreamSynchronize(s));
}

static symm_status run_call(world_case *wc, host_case *hc, bool tokens_on_device)
{
    const symm_variant_desc *d = wc->d;
    symm_dispatch_args a = {
        .tokens = hc->in[g_rank].tokens,
        .tokens_dev = tokens_on_device ? (const int32_t *)wc->dev.tokens : NULL,
        .x = (const void *)wc->dev.x,
        .x_scales = d->dtype == SYMM_DTYPE_FP8_E4M3 ? (const float *)wc->dev.scales : NULL,
        .topk_idx = (const int32_t *)wc->dev.topk,
        .topk_weights = d->weights ? (const float *)wc->dev.weights : NULL,
    };
    symm_status st = symm_variant_dispatch(wc->v, &a, wc->stream);
    if (st == SYMM_OK)
        st = symm_variant_combine(wc->v, (const void *)wc->dev.y, (void *)wc->dev.out, wc->stream);
    return st;
}

static void check_results(world_case *wc, host_case *hc, failures *f)
{
    const symm_variant_desc *d = wc->d;
    symm_variant_stats st;
    symm_status s = symm_variant_stats_read(wc->v, wc->stream, &st);
    symm_ref_send_stats send = hc->stats[g_rank];
    if (g_backend == SYMM_BACKEND_HYBRID) {
        /* The companion counts a row dropped at its destination at the
         * proxy that forwarded it, not at its source: the world's sums must
         * agree (every rank takes part in the all-gather). */
        int mine = st.dropped_send, all[SYMM_REF_MAX_WORLD];
        symm_status gs = symm_world_allgather(g_world, &mine, all, sizeof mine);
        if (gs != SYMM_OK)
            die("symm_world_allgather", gs);
        int64_t got = 0, want = 0;
        for (int p = 0; p < wc->d->world; p++) {
            got += all[p];
            want += hc->stats[p].dropped;
        }
        if (got != want)
            fail(f, "rows sent and dropped, over the world: got %" PRId64 ", want %" PRId64, got, want);
        send.dropped = st.dropped_send;
    }
    const bool want_overflow = send.invalid || send.dropped || hc->recv[g_rank].dropped;
    if (s != (want_overflow ? SYMM_ERR_OVERFLOW : SYMM_OK))
        fail(f, "stats: got %s (%s), want %s", symm_status_name(s), symm_last_error(),
             want_overflow ? "SYMM_ERR_OVERFLOW" : "SYMM_OK");
    if (st.timed_out)
        return;
    compare_dispatch(f, d, wc->v, &hc->recv[g_rank], &send, &st);
    const size_t crow = (size_t)d->hidden * symm_dtype_size(d->combine_dtype);
    const size_t T = (size_t)hc->in[g_rank].tokens;
    void *out = dget(wc->dev.out, T * crow);
    compare_bytes(f, "combine out", out, hc->out[g_rank], T * crow, crow);
    free(out);
}

/* All ranks agree: the number of ranks that failed. */
static int world_failures(symm_world *w, int mine)
{
    int all[SYMM_REF_MAX_WORLD];
    symm_status st = symm_world_allgather(w, &mine, all, sizeof mine);
    if (st != SYMM_OK)
        die("symm_world_allgather", st);
    int n = 0;
    for (int i = 0; i < symm_world_size(w); i++)
        n += all[i] != 0;
    return n;
}

typedef struct options {
    const char *manifest;
    const char *variants[64];
    int n_variants;
    symm_backend backend;
    bool quick;
    int graph_replays;
    int time_iters;
    bool time_only; /* --time-only: no matrix, only the timed calls (and their check) */
    bool skip_unsupported; /* a create refused as SYMM_ERR_UNSUPPORTED is listed, not failed */
    long long max_elems; /* skip variants with max_tokens * hidden above this (0: none) */
    uint64_t seed;
} options;

static void usage(void)
{
    fprintf(stderr, "usage: check --manifest PATH [--variant NAME]... [--backend native|nccl|hybrid] [--quick] "
                    "[--graph-replays N] [--time N [--time-only]] [--max-elems N] [--seed S] "
                    "[--skip-unsupported]\n");
    exit(2);
}

static void parse(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->backend = SYMM_BACKEND_NATIVE;
    o->graph_replays = 100;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--manifest") && next)
            o->manifest = argv[++i];
        else if (!strcmp(a, "--variant") && next && o->n_variants < 64)
            o->variants[o->n_variants++] = argv[++i];
        else if (!strcmp(a, "--backend") && next) {
            i++;
            if (!strcmp(next, "native"))
                o->backend = SYMM_BACKEND_NATIVE;
            else if (!strcmp(next, "nccl"))
                o->backend = SYMM_BACKEND_NCCL;
            else if (!strcmp(next, "hybrid"))
                o->backend = SYMM_BACKEND_HYBRID;
            else
                usage();
        } else if (!strcmp(a, "--quick"))
            o->quick = true;
        else if (!strcmp(a, "--graph-replays") && next)
            o->graph_replays = atoi(argv[++i]);
        else if (!strcmp(a, "--max-elems") && next)
            o->max_elems = strtoll(argv[++i], NULL, 0);
        else if (!strcmp(a, "--time") && next)
            o->time_iters = atoi(argv[++i]);
        else if (!strcmp(a, "--time-only"))
            o->time_only = true;
        else if (!strcmp(a, "--skip-unsupported"))
            o->skip_unsupported = true;
        else if (!strcmp(a, "--seed") && next)
            o->seed = strtoull(argv[++i], NULL, 0);
        else
            usage();
    }
    if (!o->manifest)
        usage();
}

static bool wanted(const options *o, const char *name)
{
    if (!o->n_variants)
        return true;
    for (int i = 0; i < o->n_variants; i++)
        if (!strcmp(o->variants[i], name))
            return true;
    return false;
}

static void setup_case(world_case *wc, const symm_variant_desc *d)
{
    const size_t H = (size_t)d->hidden, T = (size_t)d->max_tokens, K = (size_t)d->topk;
    wc->dev.x = dalloc(T * H * symm_dtype_size(d->dtype));
    wc->dev.scales = dalloc(T * (H / SYMM_FP8_BLOCK) * 4);
    wc->dev.topk = dalloc(T * K * 4);
    wc->dev.weights = dalloc(T * K * 4);
    wc->dev.tokens = dalloc(4);
    if (d->combine != SYMM_COMBINE_PUSH) {
        /* combine = "pull" or "auto": y in the variant's symmetric buffer,
         * where the peers read it (the region the variant gives for it). */
        symm_recv_buffers rb;
        const symm_status rs = symm_variant_recv(wc->v, &rb);
        if (rs != SYMM_OK || !rb.y)
            die("symm_variant_recv (y of a pulling combine)", rs != SYMM_OK ? rs : SYMM_ERR_STATE);
        wc->dev.y_sym = rb.y;
    }
    if (d->combine != SYMM_COMBINE_PULL)
        wc->dev.y_own = dalloc((size_t)d->capacity * H * symm_dtype_size(d->combine_dtype));
    wc->dev.y = wc->dev.y_own ? wc->dev.y_own : wc->dev.y_sym;
    wc->dev.out = dalloc(T * H * symm_dtype_size(d->combine_dtype));
    wc->zipf_cdf = malloc(sizeof(double) * (size_t)d->experts);
    moe_zipf_cdf(wc->zipf_cdf, d->experts);
}

static void teardown_case(world_case *wc)
{
    if (wc->pool_ready)
        for (int p = 0; p < wc->d->world; p++)
            symm_ref_recv_free(&wc->pool[p]);
    CUdeviceptr ps[] = {wc->dev.x, wc->dev.scales, wc->dev.topk, wc->dev.weights, wc->dev.tokens,
                        wc->dev.y_own, wc->dev.out};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (ps[i])
            CU(cuMemFree(ps[i]));
    free(wc->zipf_cdf);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median time of dispatch and of combine over iters calls at T = max_tokens,
 * uniform routing (CUDA events around each call), then the last call's
 * results against the reference. Returns 1 when they differ (agreed by all
 * ranks), else 0. */
static int time_variant(symm_world *w, world_case *wc, int iters)
{
    const symm_variant_desc *d = wc->d;
    host_case *hc = calloc(1, sizeof *hc);
    host_case_build(wc, hc, 999999, R_UNIFORM, 3);
    upload(wc, hc, false);
    float *td = malloc(sizeof(float) * (size_t)iters), *tc = malloc(sizeof(float) * (size_t)iters);
    CUevent e0, e1, e2;
    CU(cuEventCreate(&e0, 0));
    CU(cuEventCreate(&e1, 0));
    CU(cuEventCreate(&e2, 0));
    symm_dispatch_args a = {
        .tokens = hc->in[g_rank].tokens,
        .x = (const void *)wc->dev.x,
        .x_scales = d->dtype == SYMM_DTYPE_FP8_E4M3 ? (const float *)wc->dev.scales : NULL,
        .topk_idx = (const int32_t *)wc->dev.topk,
        .topk_weights = d->weights ? (const float *)wc->dev.weights : NULL,
    };
    for (int i = -3; i < iters; i++) {
        if (symm_world_barrier(w) != SYMM_OK)
            die("barrier", SYMM_ERR_PEER);
        CU(cuEventRecord(e0, wc->stream));
        symm_status st = symm_variant_dispatch(wc->v, &a, wc->stream);
        CU(cuEventRecord(e1, wc->stream));
        if (st == SYMM_OK)
            st = symm_variant_combine(wc->v, (const void *)wc->dev.y, (void *)wc->dev.out, wc->stream);
        CU(cuEventRecord(e2, wc->stream));
        if (st != SYMM_OK)
            die("timed call", st);
        CU(cuEventSynchronize(e2));
        if (i >= 0) {
            CU(cuEventElapsedTime(&td[i], e0, e1));
            CU(cuEventElapsedTime(&tc[i], e1, e2));
        }
    }
    qsort(td, (size_t)iters, sizeof *td, cmp_float);
    qsort(tc, (size_t)iters, sizeof *tc, cmp_float);
    /* Remote bytes of dispatch: rows sent to other ranks. */
    int64_t remote = 0;
    for (int p = 0; p < d->world; p++)
        if (p != g_rank)
            for (int64_t r = 0; r < hc->recv[p].rows; r++)
                remote += hc->recv[p].src[r * 4] == g_rank;
    const double bytes = (double)remote * d->hidden * symm_dtype_size(d->dtype);
    if (g_rank == 0)
        printf("time %-24s T=%d: dispatch %.1f us (p90 %.1f), combine %.1f us (p90 %.1f), median of %d; dispatch "
               "%.0f GB/s remote per GPU\n",
               d->name, hc->in[g_rank].tokens, td[iters / 2] * 1e3, td[iters * 9 / 10] * 1e3, tc[iters / 2] * 1e3,
               tc[iters * 9 / 10] * 1e3, iters, bytes / (td[iters / 2] * 1e-3) / 1e9);
    failures f = {0};
    check_results(wc, hc, &f);
    if (f.count)
        fprintf(stderr, "FAIL %s rank %d timed calls (T=%d) seed 0x%" PRIx64 ": %s\n", d->name, g_rank,
                hc->in[g_rank].tokens, wc->seed, f.first);
    CU(cuEventDestroy(e0));
    CU(cuEventDestroy(e1));
    CU(cuEventDestroy(e2));
    free(td);
    free(tc);
    host_case_free(wc, hc);
    free(hc);
    return world_failures(w, f.count) != 0;
}

/* combine = "auto": the y of case case_id, inside the symmetric buffer
 * (the pulling form) in odd cases and outside it (the pushing form) in even
 * ones, the same on every rank, so that consecutive calls change form;
 * other modes keep their one place. The form's name, for messages. */
static const char *place_y(world_case *wc, int case_id)
{
    if (wc->d->combine != SYMM_COMBINE_AUTO)
        return wc->d->combine == SYMM_COMBINE_PULL ? "pull" : "push";
    wc->dev.y = case_id % 2 ? wc->dev.y_sym : wc->dev.y_own;
    return case_id % 2 ? "auto, y inside: pull" : "auto, y outside: push";
}

/* One case of the matrix: inputs, a dispatch + combine, every result
 * checked. 1 when it failed on some rank (agreed by all ranks), else 0. */
static int run_case(symm_world *w, world_case *wc, int case_id, routing how, int batch, uint64_t seed)
{
    host_case *hc = calloc(1, sizeof *hc);
    if (!hc)
        die("run_case", SYMM_ERR_NOMEM);
    const char *form = place_y(wc, case_id);
    host_case_build(wc, hc, case_id, how, batch);
    upload(wc, hc, batch == 4);
    failures f = {0};
    const symm_status st = run_call(wc, hc, batch == 4);
    if (st != SYMM_OK)
        fail(&f, "call: %s: %s", symm_status_name(st), symm_last_error());
    else
        check_results(wc, hc, &f);
    if (f.count)
        fprintf(stderr, "FAIL %s rank %d routing %s batch %d (T=%d, combine %s) seed 0x%" PRIx64 ": %s\n",
                wc->d->name, g_rank, routing_names[how], batch, hc->in[g_rank].tokens, form, seed, f.first);
    const int failed = world_failures(w, f.count) != 0;
    host_case_free(wc, hc);
    free(hc);
    return failed;
}

/* The matrix for one variant: routings x batch kinds, then graph replays.
 * Returns the number of failed cases (agreed by all ranks). */
static int run_variant(symm_world *w, const options *o, const symm_variant_desc *d, int *cases_out)
{
    world_case wc = {.d = d, .seed = o->seed};
    symm_variant_options vo = {.backend = o->backend};
    symm_status st = symm_variant_create(w, d, &vo, &wc.v);
    if (st == SYMM_ERR_UNSUPPORTED && o->skip_unsupported) {
        /* Every rank got the same status (create agrees on it). */
        if (g_rank == 0)
            printf("unsupported %s: %s\n", d->name, symm_last_error());
        *cases_out = 0;
        return -1;
    }
    if (st != SYMM_OK) {
        fprintf(stderr, "[%s] create: %s: %s\n", d->name, symm_status_name(st), symm_last_error());
        *cases_out = 1;
        return 1;
    }
    CU(cuStreamCreate(&wc.stream, CU_STREAM_NON_BLOCKING));
    setup_case(&wc, d);
    int failed = 0, cases = 0, case_id = 0;
    const bool big = (int64_t)d->max_tokens * d->hidden > 4096LL * 4096;
    for (int how = 0; how < (o->time_only ? 0 : R_COUNT); how++) {
        for (int batch = 0; batch < 5; batch++) {
            if ((o->quick || big) && batch == 3 && how != R_UNIFORM && how != R_INVALID)
                continue;
            if (o->quick && batch == 4)
                continue;
            failed += run_case(w, &wc, ++case_id, (routing)how, batch, o->seed);
            cases++;
        }
    }
    /* Layout rank below the worst-case capacity, top-k within one rank's
     * experts: every token to rank 0 (one row each), which then receives
     * exactly its capacity (nothing dropped: the expert counts come from
     * the count words), then one row more (one dropped: they come from the
     * arrived rows). */
    if (!o->time_only && d->layout == SYMM_LAYOUT_RANK && d->capacity < d->worst_capacity &&
        d->topk <= d->experts / d->world)
        for (int batch = 5; batch <= 6; batch++) {
            failed += run_case(w, &wc, ++case_id, R_ONE_RANK, batch, o->seed);
            cases++;
        }
    /* The hybrid routes on the host: a dispatch during capture is refused,
     * saying so, and leaves the variant usable (the matrix ran before). */
    if (o->backend == SYMM_BACKEND_HYBRID && !o->time_only) {
        failures f = {0};
        CUgraph graph;
        symm_dispatch_args none = {.tokens = 0};
        CU(cuStreamBeginCapture(wc.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
        st = symm_variant_dispatch(wc.v, &none, wc.stream);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", symm_last_error());
        CU(cuStreamEndCapture(wc.stream, &graph));
        if (graph)
            CU(cuGraphDestroy(graph));
        if (st != SYMM_ERR_STATE || !strstr(msg, "CUDA graph capture"))
            fail(&f, "dispatch during capture: got %s (%s), want SYMM_ERR_STATE naming the capture",
                 symm_status_name(st), msg);
        if (f.count)
            fprintf(stderr, "FAIL %s rank %d capture: %s\n", d->name, g_rank, f.first);
        failed += world_failures(w, f.count) != 0;
        cases++;
    }
    /* Graph: dispatch + combine captured once, replayed with fresh inputs and
     * T from device memory each time. */
    int replays = o->backend == SYMM_BACKEND_NATIVE ? (o->quick ? o->graph_replays / 10 : o->graph_replays) : 0;
    if (big)
        replays = replays > 5 ? 5 : replays;
    if (replays > 0 && !o->time_only) {
        CUgraph graph;
        CUgraphExec exec;
        host_case *hc = calloc(1, sizeof *hc);
        /* combine = "auto": the graph freezes y, and with it the form. */
        const char *form = place_y(&wc, ++case_id);
        host_case_build(&wc, hc, case_id, R_UNIFORM, 4);
        upload(&wc, hc, true);
        CU(cuStreamBeginCapture(wc.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
        st = run_call(&wc, hc, true);
        CU(cuStreamEndCapture(wc.stream, &graph));
        if (st != SYMM_OK)
            die("capture", st);
        CU(cuGraphInstantiate(&exec, graph, 0));
        host_case_free(&wc, hc);
        free(hc);
        int graph_failed = 0;
        for (int i = 0; i < replays; i++) {
            hc = calloc(1, sizeof *hc);
            host_case_build(&wc, hc, ++case_id, (routing)(i % R_COUNT), 4);
            upload(&wc, hc, true);
            failures f = {0};
            CU(cuGraphLaunch(exec, wc.stream));
            check_results(&wc, hc, &f);
            if (f.count)
                fprintf(stderr, "FAIL %s rank %d graph replay %d (T=%d, combine %s) seed 0x%" PRIx64 ": %s\n",
                        d->name, g_rank, i, hc->in[g_rank].tokens, form, o->seed, f.first);
            graph_failed += world_failures(w, f.count) != 0;
            host_case_free(&wc, hc);
            free(hc);
        }
        CU(cuGraphExecDestroy(exec));
        CU(cuGraphDestroy(graph));
        failed += graph_failed != 0;
        cases++;
    }
    if (o->time_iters > 0) {
        failed += time_variant(w, &wc, o->time_iters);
        cases++;
    }
    teardown_case(&wc);
    CU(cuStreamDestroy(wc.stream));
    st = symm_variant_destroy(wc.v);
    if (st != SYMM_OK)
        die("symm_variant_destroy", st);
    *cases_out = cases;
    return failed;
}

int main(int argc, char **argv)
{
    options o;
    parse(argc, argv, &o);
    symm_world *w;
    symm_status st = symm_world_create_from_env(&w);
    if (st != SYMM_OK)
        die("symm_world_create_from_env", st);
    g_rank = symm_world_rank(w);
    g_world = w;
    g_backend = o.backend;
    g_hosts = o.backend == SYMM_BACKEND_HYBRID ? symm_world_host_count(w) : 0;
    if (!o.seed) {
        uint64_t s = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
        if ((st = symm_world_bcast(w, &s, sizeof s, 0)) != SYMM_OK)
            die("symm_world_bcast", st);
        o.seed = s;
    }
    symm_manifest *m;
    if ((st = symm_manifest_open(o.manifest, &m)) != SYMM_OK)
        die("symm_manifest_open", st);
    /* A name that matches nothing is a typo, not an empty selection. */
    for (int i = 0; i < o.n_variants; i++) {
        const symm_variant_desc *d;
        if (symm_manifest_variant(m, o.variants[i], &d) != SYMM_OK) {
            fprintf(stderr, "check: --variant %s: no such variant in %s\n", o.variants[i], o.manifest);
            exit(2);
        }
    }
    int passed = 0, failed = 0, skipped = 0, too_large = 0, unsupported = 0;
    for (size_t i = 0; i < symm_manifest_count(m); i++) {
        const char *name = symm_manifest_name(m, i);
        if (!wanted(&o, name))
            continue;
        const symm_variant_desc *d;
        if ((st = symm_manifest_variant(m, name, &d)) != SYMM_OK)
            die("symm_manifest_variant", st);
        if (d->world != symm_world_size(w)) {
            skipped++;
            continue;
        }
        /* The hybrid serves the variants with a companion of this host count
         * (a companion itself is a native variant of one host). */
        if (o.backend == SYMM_BACKEND_HYBRID) {
            bool has = false;
            for (int c = 0; c < d->n_companions; c++)
                has |= d->companions[c].hosts == g_hosts;
            if (d->hosts || !has) {
                skipped++;
                continue;
            }
        }
        if (o.max_elems && (long long)d->max_tokens * d->hidden > o.max_elems) {
            if (g_rank == 0)
                printf("skip %-28s max_tokens x hidden = %lld > --max-elems %lld\n", name,
                       (long long)d->max_tokens * d->hidden, o.max_elems);
            too_large++;
            continue;
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int cases = 0;
        int bad = run_variant(w, &o, d, &cases);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (bad < 0) {
            unsupported++;
            continue;
        }
        if (g_rank == 0)
            printf("%s %-28s %d/%d cases (%s backend, %.1f s)\n", bad ? "FAIL" : "ok  ", name, cases - bad, cases,
                   backend_name(o.backend),
                   (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
        passed += cases - bad;
        failed += bad;
        fflush(stdout);
    }
    symm_manifest_close(m);
    if (g_rank == 0)
        printf("check (world %d, seed 0x%" PRIx64 ", %d variants of other worlds%s and %d too large skipped%s): "
               "%d passed, %d failed\n",
               symm_world_size(w), o.seed, skipped,
               o.backend == SYMM_BACKEND_HYBRID ? " or without a companion for these hosts" : "", too_large,
               unsupported ? ", some unsupported here (listed above)" : "", passed, failed);
    /* Nothing run is not a pass: a world no variant of the selection has. */
    const bool none = passed + failed == 0 && too_large == 0 && unsupported == 0;
    if (none && g_rank == 0)
        fprintf(stderr, "check: no variant of world %d in %s%s\n", symm_world_size(w), o.manifest,
                o.n_variants ? " among those named by --variant" : "");
    fflush(stdout);
    /* symmrun stops every rank when one exits nonzero: none leaves before
     * rank 0 has written its verdict. */
    if ((st = symm_world_barrier(w)) != SYMM_OK)
        die("symm_world_barrier", st);
    symm_world_destroy(w);
    return failed || none ? 1 : 0;
}
