/* moe_bench.c: the benchmark of dispatch and combine (`make bench`), one
 * process per rank under symmrun, one rank per GPU. For every row of the
 * matrix below (variants of specs/bench.lua) it measures, in one run:
 *   ours        the native backend, CUDA-graph replays;
 *   NCCL bk     our NCCL backend, plain calls (it needs the counts on the
 *               host, so it refuses graph capture);
 *   raw NCCL    ncclSend/ncclRecv of exactly the payload bytes our dispatch
 *               moves to each peer, captured in a graph when NCCL allows;
 *   ceiling     cuMemcpyDtoDAsync of the same bytes into every peer's
 *               VMM-mapped buffer (copy engines), every GPU at once.
 * Before a variant is timed, one dispatch + combine at its largest T is
 * compared bit for bit with the CPU reference (symm_ref.h): a wrong variant
 * gives FAIL rows, never a speed.
 *
 * Every repetition starts with a host barrier then a device barrier (stream
 * memory operations on flags in symmetric memory), so all GPUs start within
 * microseconds; a repetition's time is that of the slowest rank; p50 and p90
 * are taken over the repetitions after the warm-up. A repetition of ours is
 * `calls` dispatch+combine pairs (20 at small T) with an event around every
 * call; a dispatch is never timed without its combine, nor a combine
 * repeated, because combine's flags count arrivals per dispatch.
 *
 *   symmrun -n 2 moe_bench --manifest out/bench/manifest.json [--csv F] [--markdown F]
 *   moe_bench --manifest out/bench/manifest.json --plan   (no GPU, no launcher)
 *
 * Exit status: 0 all rows measured and correct, 1 some row FAIL, 2 the
 * benchmark could not run (usage, launcher, GPU, manifest). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "moe_inputs.h"
#include "nccl_api.h"
#include "par_ranks.h"
#include "symm_heap.h"
#include "symm_manifest.h"
#include "symm_nccl.h"
#include "symm_ref.h"
#include "symm_variant.h"
#include "symm_world.h"

#define FLAG_SLOT 128         /* bytes per device-barrier flag: one cache line each */
#define SMALL_T 512           /* at or below this T a repetition holds SMALL_T_CALLS pairs */
#define SMALL_T_CALLS 20
#define MAX_EVENTS (2 * SMALL_T_CALLS + 1) /* around every call of a repetition */
#define MIN_REPS 50           /* fewer repetitions are allowed, but flagged */
#define POISON 0xA5
#define NOTE_LEN 200
#define DEFAULT_GRANULARITY (2u << 20) /* --plan only: the VMM granularity of Hopper */

/* ---- the matrix --------------------------------------------------------- */

typedef enum routing { ROUTE_UNIFORM, ROUTE_ZIPF, ROUTE_LOCAL } routing;
static const char *const routing_names[] = {"uniform", "zipf", "local"};

/* One row: a variant of specs/bench.lua at one T and routing. The group is
 * the first letter of the id (the letters of the issue: a..g; h: the fixed
 * costs, every token routed to its own rank's experts, no row crosses; p:
 * rows a, b, f.8, f.16 and g with combine = "pull", bench/NOTES.md 46; i:
 * rows a, b and g with fp8_e4m3 dispatch and bf16 combine; u: rows a and b
 * with combine = "auto", y in the variant's region y (the pulling form) and,
 * rows *.push, in a buffer of the benchmark's (the pushing form)). */
typedef struct row_spec {
    const char *id;
    const char *variant;
    int tokens;
    routing route;
    bool y_outside; /* combine = "auto": y outside the symmetric buffer (it pushes) */
} row_spec;

static const row_spec matrix[] = {
    {"a", "bench_dsv3_prefill", 4096, ROUTE_UNIFORM, false},
    {"b", "bench_dsv3_decode", 128, ROUTE_UNIFORM, false},
    {"b.64", "bench_dsv3_decode_sms64", 128, ROUTE_UNIFORM, false},
    {"c.prefill", "bench_qwen3_prefill", 4096, ROUTE_UNIFORM, false},
    {"c.decode", "bench_qwen3_decode", 128, ROUTE_UNIFORM, false},
    {"d", "bench_dsv3_prefill", 4096, ROUTE_ZIPF, false},
    {"e.128", "bench_dsv3_sweep", 128, ROUTE_UNIFORM, false},
    {"e.256", "bench_dsv3_sweep", 256, ROUTE_UNIFORM, false},
    {"e.512", "bench_dsv3_sweep", 512, ROUTE_UNIFORM, false},
    {"e.1024", "bench_dsv3_sweep", 1024, ROUTE_UNIFORM, false},
    {"e.2048", "bench_dsv3_sweep", 2048, ROUTE_UNIFORM, false},
    {"e.4096", "bench_dsv3_sweep", 4096, ROUTE_UNIFORM, false},
    {"e.8192", "bench_dsv3_sweep", 8192, ROUTE_UNIFORM, false},
    {"f.8", "bench_dsv3_prefill_sms8", 4096, ROUTE_UNIFORM, false},
    {"f.16", "bench_dsv3_prefill_sms16", 4096, ROUTE_UNIFORM, false},
    {"f.24", "bench_dsv3_prefill", 4096, ROUTE_UNIFORM, false},
    {"f.32", "bench_dsv3_prefill_sms32", 4096, ROUTE_UNIFORM, false},
    {"f.48", "bench_dsv3_prefill_sms48", 4096, ROUTE_UNIFORM, false},
    {"f.64", "bench_dsv3_prefill_sms64", 4096, ROUTE_UNIFORM, false},
    {"g.prefill", "bench_dsv3_prefill_expert", 4096, ROUTE_UNIFORM, false},
    {"g.decode", "bench_dsv3_decode_expert", 128, ROUTE_UNIFORM, false},
    {"g.k.prefill", "bench_dsv3_prefill_expert_k", 4096, ROUTE_UNIFORM, false},
    {"g.k.decode", "bench_dsv3_decode_expert_k", 128, ROUTE_UNIFORM, false},
    {"h.prefill", "bench_dsv3_prefill", 4096, ROUTE_LOCAL, false},
    {"h.decode", "bench_dsv3_decode", 128, ROUTE_LOCAL, false},
    {"h.expert", "bench_dsv3_prefill_expert", 4096, ROUTE_LOCAL, false},
    {"p.a", "bench_dsv3_prefill_pull", 4096, ROUTE_UNIFORM, false},
    {"p.b", "bench_dsv3_decode_pull", 128, ROUTE_UNIFORM, false},
    {"p.f.8", "bench_dsv3_prefill_sms8_pull", 4096, ROUTE_UNIFORM, false},
    {"p.f.16", "bench_dsv3_prefill_sms16_pull", 4096, ROUTE_UNIFORM, false},
    {"p.g.prefill", "bench_dsv3_prefill_expert_pull", 4096, ROUTE_UNIFORM, false},
    {"p.g.decode", "bench_dsv3_decode_expert_pull", 128, ROUTE_UNIFORM, false},
    {"i.a", "bench_dsv3_prefill_fp8", 4096, ROUTE_UNIFORM, false},
    {"i.b", "bench_dsv3_decode_fp8", 128, ROUTE_UNIFORM, false},
    {"i.g.prefill", "bench_dsv3_prefill_expert_fp8", 4096, ROUTE_UNIFORM, false},
    {"i.g.decode", "bench_dsv3_decode_expert_fp8", 128, ROUTE_UNIFORM, false},
    {"u.a", "bench_dsv3_prefill_auto", 4096, ROUTE_UNIFORM, false},
    {"u.a.push", "bench_dsv3_prefill_auto", 4096, ROUTE_UNIFORM, true},
    {"u.b", "bench_dsv3_decode_auto", 128, ROUTE_UNIFORM, false},
    {"u.b.push", "bench_dsv3_decode_auto", 128, ROUTE_UNIFORM, true},
};
#define N_ROWS ((int)(sizeof matrix / sizeof matrix[0]))

/* Calls per timed graph (and per timed set of plain calls). */
static int calls_for(int tokens) { return tokens <= SMALL_T ? SMALL_T_CALLS : 1; }

/* ---- options ------------------------------------------------------------ */

typedef struct options {
    const char *manifest, *csv, *markdown, *groups, *rows;
    bool picked[N_ROWS]; /* --rows: the rows it names (read only when rows is set) */
    int reps, warmup;
    uint64_t seed;
    int profile; /* the tuning knob PROFILE: 0 (none), 1 (phases), 2 (and spans) */
    bool no_nccl, nccl_plain, plan, shared_gpu, inline_events;
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: symmrun -n 2 moe_bench --manifest out/bench/manifest.json [options]\n"
            "       moe_bench --manifest out/bench/manifest.json --plan\n"
            "\n"
            "Times dispatch and combine of the variants of specs/bench.lua (generate them with\n"
            "`build/bin/symmgen -o out/bench specs/bench.lua`) beside our NCCL backend, raw NCCL\n"
            "send/receive of the same bytes and the copy-engine ceiling, one rank per GPU.\n"
            "scripts/bench.sh (`make bench`) runs it, then plots and records the results.\n"
            "\n"
            "  --manifest PATH  manifest.json of the generated bench variants (required)\n"
            "  --csv PATH       write the rows as CSV (rank 0; rows appear as variants finish)\n"
            "  --markdown PATH  write the final tables in Markdown (rank 0), for bench/RESULTS.md\n"
            "  --groups LIST    only these row groups, letters a..i, p and u separated by commas\n"
            "                   (default all): a prefill, b decode, c qwen3 shape, d zipf, e T sweep, f SM\n"
            "                   budgets, g layout expert (g.k: combine_order = \"k\"), h fixed costs (a,\n"
            "                   b and g.prefill with every token routed to its own rank: no row\n"
            "                   crosses), i a, b and g with fp8_e4m3 dispatch (bf16 combine), p a, b,\n"
            "                   f.8, f.16 and g with a combine that pulls the peers' rows (combine =\n"
            "                   \"pull\"), u a and b with combine = \"auto\": y in the variant's region\n"
            "                   y (it pulls) and, rows u.*.push, outside it (it pushes)\n"
            "  --rows LIST      only these rows, ids separated by commas (e.g. g.prefill,b; --plan\n"
            "                   lists them); with --groups, the rows both select\n"
            "  --reps N         timed repetitions per measurement (default %d, at least %d for\n"
            "                   numbers worth reporting)\n"
            "  --warmup N       untimed repetitions before them (default 5)\n"
            "  --seed S         seed of routings and inputs (default: fresh, printed)\n"
            "  --no-nccl        skip the NCCL backend and raw NCCL (their columns stay empty)\n"
            "  --nccl-plain     time raw NCCL with plain calls instead of a CUDA graph\n"
            "  --inline-events  time ours with the event nodes between the kernels (each kernel\n"
            "                   then waits for an event node) instead of on a side branch\n"
            "  --shared-gpu     let ranks share GPUs (a development proxy: run it under CUDA MPS so\n"
            "                   that they run at once; their rows then never cross NVLink, so the\n"
            "                   times are not the benchmark's); implies --no-nccl unless symmrun\n"
            "                   --nccl-shared-gpu started the ranks (NCCL over loopback sockets)\n"
            "  --profile        build the native kernels with the tuning knob PROFILE=1 and, after\n"
            "                   each row's timing, print when each phase of dispatch and combine\n"
            "                   ended (median of 20 plain calls, per rank; the timings then include\n"
            "                   the profile's few atomics)\n"
            "  --profile=2, --profile-spans\n"
            "                   the same with PROFILE=2, and where each kind of warp spent its time:\n"
            "                   per kind (combine's push warps forming partial sums, push warps\n"
            "                   pushing rows, the sums; dispatch's warps sending rows), the warps\n"
            "                   that recorded, a warp's mean loop in us, each span's mean and its\n"
            "                   share of the loop (\"[...]\": parts of the span before), the rest as\n"
            "                   \"other\", and the counts a warp (median of the 20 calls of each;\n"
            "                   docs/api.md \"Spans\" says what each covers)\n"
            "  --plan           print the rows, their remote bytes and each variant's memory;\n"
            "                   needs neither a GPU nor a launcher\n"
            "  -h, --help       this text\n"
            "\n"
            "Exit status: 0 every row measured and correct, 1 some row FAIL, 2 the benchmark\n"
            "could not run (usage, launcher, GPU, NCCL, manifest).\n",
            MIN_REPS, MIN_REPS);
}

static bool parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static int bad_usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "moe_bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(moe_bench --help for the options)\n");
    return 2;
}

/* Mark in picked the rows that the comma-separated list ids names. NULL
 * when every entry names a row of the matrix; else the first that does
 * not, its length in *len (0: an empty entry). */
static const char *pick_rows(const char *ids, bool *picked, size_t *len)
{
    for (const char *p = ids;;) {
        const char *end = strchr(p, ',');
        *len = end ? (size_t)(end - p) : strlen(p);
        int i = 0;
        while (i < N_ROWS && !(strlen(matrix[i].id) == *len && !strncmp(matrix[i].id, p, *len)))
            i++;
        if (i == N_ROWS)
            return p;
        picked[i] = true;
        if (!end)
            return NULL;
        p = end + 1;
    }
}

/* 0: run; 1: help printed; 2: usage error (message printed). */
static int parse_options(int argc, char **argv, options *o)
{
    *o = (options){.reps = MIN_REPS, .warmup = 5};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = !strcmp(a, "--manifest") || !strcmp(a, "--csv") || !strcmp(a, "--markdown") ||
                     !strcmp(a, "--groups") || !strcmp(a, "--rows") || !strcmp(a, "--reps") ||
                     !strcmp(a, "--warmup") || !strcmp(a, "--seed");
        if (takes && !next)
            return bad_usage("%s needs a value", a);
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--manifest")) {
            o->manifest = argv[++i];
        } else if (!strcmp(a, "--csv")) {
            o->csv = argv[++i];
        } else if (!strcmp(a, "--markdown")) {
            o->markdown = argv[++i];
        } else if (!strcmp(a, "--groups")) {
            o->groups = argv[++i];
            for (const char *g = o->groups; *g; g++)
                if (*g != ',' && (*g < 'a' || *g > 'i') && *g != 'p' && *g != 'u')
                    return bad_usage("--groups \"%s\": expected letters a..i, p and u separated by commas",
                                     o->groups);
        } else if (!strcmp(a, "--rows")) {
            o->rows = argv[++i];
            memset(o->picked, 0, sizeof o->picked); /* the last --rows counts, as the last --groups does */
            size_t len;
            const char *bad = pick_rows(o->rows, o->picked, &len);
            if (bad) {
                char what[128];
                if (len)
                    snprintf(what, sizeof what, "\"%.*s\" is no row", (int)(len < 80 ? len : 80), bad);
                else
                    snprintf(what, sizeof what, "\"%.80s\" has an empty entry", o->rows);
                return bad_usage("--rows: %s; expected row ids of the matrix separated by commas, e.g. "
                                 "g.prefill,b (moe_bench --manifest M --plan lists them)",
                                 what);
            }
        } else if (!strcmp(a, "--reps")) {
            if (!parse_int(argv[++i], 1, 100000, &o->reps))
                return bad_usage("--reps \"%s\": expected an integer 1..100000", argv[i]);
        } else if (!strcmp(a, "--warmup")) {
            if (!parse_int(argv[++i], 0, 10000, &o->warmup))
                return bad_usage("--warmup \"%s\": expected an integer 0..10000", argv[i]);
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(argv[++i], &end, 0);
            if (errno || *end || end == argv[i])
                return bad_usage("--seed \"%s\": expected an unsigned integer", argv[i]);
        } else if (!strcmp(a, "--no-nccl")) {
            o->no_nccl = true;
        } else if (!strcmp(a, "--shared-gpu")) {
            o->shared_gpu = true;
            o->no_nccl = o->no_nccl || !symm_nccl_shared_gpu_mode();
        } else if (!strcmp(a, "--nccl-plain")) {
            o->nccl_plain = true;
        } else if (!strcmp(a, "--inline-events")) {
            o->inline_events = true;
        } else if (!strcmp(a, "--profile") || !strcmp(a, "--profile=1")) {
            o->profile = 1;
        } else if (!strcmp(a, "--profile=2") || !strcmp(a, "--profile-spans")) {
            o->profile = 2;
        } else if (!strncmp(a, "--profile=", 10)) {
            return bad_usage("%s: expected --profile (or --profile=1: the phases) or --profile=2 (and the spans)", a);
        } else if (!strcmp(a, "--plan")) {
            o->plan = true;
        } else {
            return bad_usage("unknown argument \"%s\"", a);
        }
    }
    if (!o->manifest)
        return bad_usage("%s", "--manifest PATH is required (the bench variants: build/bin/symmgen -o out/bench "
                               "specs/bench.lua writes out/bench/manifest.json)");
    return 0;
}

static bool row_selected(const options *o, const row_spec *r)
{
    return (!o->groups || strchr(o->groups, r->id[0]) != NULL) && (!o->rows || o->picked[r - matrix]);
}

/* ---- routings (random numbers: tests/support/moe_inputs.h) -------------- */

/* What every rank routes at one T: all ranks' topk (each rank computes the
 * whole world's, from the shared seed) and the payload rows each rank sends
 * to each rank. */
typedef struct routing_set {
    int world, tokens, topk;
    int32_t *idx;   /* [world][tokens][topk] */
    int64_t *rows;  /* [world][world]: rows rank s sends to rank p (p == s: local) */
} routing_set;

static void routing_free(routing_set *r)
{
    free(r->idx);
    free(r->rows);
    memset(r, 0, sizeof *r);
}

/* An expert of rank s's token: uniform, Zipf, or uniform among s's own
 * experts (local; uniform over all where s has fewer than topk). */
static int pick_expert(moe_rng *r, routing how, const symm_variant_desc *d, int s, const double *zipf_cdf)
{
    const int L = d->experts / d->world;
    if (how == ROUTE_LOCAL && L >= d->topk)
        return s * L + moe_rng_int(r, L);
    return how == ROUTE_ZIPF ? moe_zipf_expert(r, zipf_cdf, d->experts) : moe_rng_int(r, d->experts);
}

/* K distinct experts per token: uniform, or Zipf(MOE_ZIPF_S) over expert ids. */
static symm_status routing_make(const symm_variant_desc *d, uint64_t seed, routing how, int T, routing_set *out)
{
    const int W = d->world, K = d->topk, E = d->experts, L = E / W;
    memset(out, 0, sizeof *out);
    routing_set r = {.world = W, .tokens = T, .topk = K};
    r.idx = malloc((size_t)W * T * K * sizeof *r.idx + 16);
    r.rows = calloc((size_t)W * W, sizeof *r.rows);
    double *cdf = malloc(sizeof *cdf * (size_t)E);
    int *seen = malloc(sizeof *seen * (size_t)W);
    if (!r.idx || !r.rows || !cdf || !seen) {
        free(cdf);
        free(seen);
        routing_free(&r);
        return symm_fail(SYMM_ERR_NOMEM, "routing of %s at T=%d: out of host memory", d->name, T);
    }
    moe_zipf_cdf(cdf, E);
    for (int s = 0; s < W; s++) {
        /* The same (seed, routing, shape, T) gives the same routing in every variant. */
        moe_rng g = moe_rng_for(seed, ((uint64_t)how << 48) ^ ((uint64_t)T << 20) ^ ((uint64_t)E << 5) ^ (uint64_t)K,
                                (uint64_t)s + 1);
        for (int i = 0; i < W; i++)
            seen[i] = -1;
        for (int t = 0; t < T; t++) {
            int32_t *row = r.idx + ((size_t)s * T + t) * K;
            for (int k = 0; k < K; k++) {
                int e;
                do {
                    e = pick_expert(&g, how, d, s, cdf);
                } while (moe_row_has(row, k, e));
                row[k] = e;
                const int p = e / L;
                if (d->layout == SYMM_LAYOUT_EXPERT)
                    r.rows[s * W + p]++;
                else if (seen[p] != t) {
                    seen[p] = t;
                    r.rows[s * W + p]++;
                }
            }
        }
    }
    free(cdf);
    free(seen);
    *out = r;
    return SYMM_OK;
}

/* Payload bytes rank s sends to other ranks in one dispatch. */
static double remote_bytes(const symm_variant_desc *d, const routing_set *r, int s)
{
    int64_t rows = 0;
    for (int p = 0; p < r->world; p++)
        if (p != s)
            rows += r->rows[s * r->world + p];
    return (double)rows * d->hidden * symm_dtype_size(d->dtype);
}

/* Random finite values of a dtype; 16-bit ones built from random bits
 * (exponent kept in a narrow range) since the guard fills gigabytes, the
 * others as the GPU tests build them. */
static void fill_random(moe_rng *r, symm_dtype dt, void *dst, size_t n)
{
    if (dt == SYMM_DTYPE_BF16 || dt == SYMM_DTYPE_FP16) {
        const int mant = dt == SYMM_DTYPE_BF16 ? 7 : 10, base = dt == SYMM_DTYPE_BF16 ? 124 : 12;
        uint16_t *h = dst;
        uint64_t bits = 0;
        for (size_t i = 0; i < n; i++) {
            if (i % 4 == 0)
                bits = moe_rng_next(r);
            const unsigned b = (unsigned)(bits >> (16 * (i % 4))) & 0xFFFFu;
            const unsigned e = (unsigned)base + ((b >> mant) & 7u);
            h[i] = (uint16_t)((b & 0x8000u) | (e << mant) | (b & ((1u << mant) - 1)));
        }
        return;
    }
    moe_random_elems(r, dt, dst, n);
}

static uint64_t shape_key(const symm_variant_desc *d)
{
    const int64_t f[] = {d->hidden, d->topk, d->experts, d->world, d->max_tokens, d->dtype,
                         d->combine_dtype, d->layout, d->weights, d->align, d->capacity};
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        h = (h ^ (uint64_t)f[i]) * 1099511628211ull;
    return h;
}

/* ---- results ------------------------------------------------------------ */

typedef struct stat2 {
    double p50, p90; /* microseconds per call */
} stat2;

typedef struct row_result {
    const row_spec *spec;
    const symm_variant_desc *desc;
    int calls;
    double remote_mean, remote_max; /* payload bytes per GPU per call */
    double sym_mib, create_ms;
    bool done;
    /* ours: the native backend */
    bool ours_ok;
    stat2 dispatch, combine;
    const char *ours_mode;   /* "one graph" of all pairs, or "graph per call" */
    bool pair_ok;            /* pair: one dispatch + combine, `calls` back to back in one graph */
    stat2 pair;              /* with events only around the graph (per pair) */
    char note[NOTE_LEN];
    /* the NCCL backend (measured, or copied from a row with the same traffic) */
    bool have_nccl, nccl_ok;
    stat2 nccl_dispatch, nccl_combine;
    char nccl_note[NOTE_LEN];
    /* raw NCCL and the copy-engine ceiling */
    bool have_base, raw_ok, raw_graph, ceiling_ok;
    stat2 raw, ceiling;
} row_result;

/* Two rows move the same bytes in the same pattern (only the variant's name,
 * sms or max_tokens differ): their baselines are measured once. */
static bool same_traffic(const row_result *x, const row_result *y)
{
    const symm_variant_desc *a = x->desc, *c = y->desc;
    return a->hidden == c->hidden && a->topk == c->topk && a->experts == c->experts && a->world == c->world &&
           a->layout == c->layout && a->dtype == c->dtype && a->combine_dtype == c->combine_dtype &&
           a->weights == c->weights && a->align == c->align && x->spec->tokens == y->spec->tokens &&
           x->spec->route == y->spec->route && x->calls == y->calls;
}

/* The variants to create, in order of first use, and their rows. */
typedef struct variant_plan {
    const symm_variant_desc *desc;
    int rows[N_ROWS];
    int n_rows;
} variant_plan;

/* ---- the benchmark's context -------------------------------------------- */

typedef struct bench {
    const options *o;
    symm_world *world;
    int rank, size;
    const symm_cuda_api *cu;
    symm_device *dev;
    symm_nccl *nccl;          /* raw NCCL; NULL with --no-nccl */
    const symm_nccl_api *nc;
    CUstream stream;
    CUstream *peer_streams;   /* [size]: the ceiling's copies, one stream per peer */
    CUevent ev[MAX_EVENTS];   /* timing events */
    CUevent done;             /* recorded after each repetition: what the host waits for */
    CUevent fork, *join;      /* the ceiling's fork and joins */
    CUstream side;            /* ours: the timing events' side branch (issue_timed_pairs) */
    CUevent side_fork, side_join;
    symm_alloc *flags;        /* device barrier: flag of rank s at s * FLAG_SLOT */
    uint32_t epoch;
    double wait_timeout_s;
    uint64_t seed;
    row_result rows[N_ROWS];
    FILE *csv;
} bench;

static void say(const bench *b, const char *fmt, ...) SYMM_PRINTF(2, 3);
static void say(const bench *b, const char *fmt, ...)
{
    if (b->rank != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* The benchmark cannot go on: say why and stop (symmrun stops the other ranks). */
static _Noreturn void die(const bench *b, const char *what, symm_status st)
{
    fprintf(stderr, "moe_bench: rank %d: %s: %s: %s\n", b ? b->rank : -1, what, symm_status_name(st),
            symm_last_error());
    fprintf(stderr, "moe_bench: rank %d: stopping; rows finished so far are in the CSV\n", b ? b->rank : -1);
    exit(2);
}

#define CHECK(b, what, expr)                  \
    do {                                      \
        symm_status check_st_ = (expr);       \
        if (check_st_ != SYMM_OK)             \
            die((b), (what), check_st_);      \
    } while (0)

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* Every rank says whether its step succeeded and why not; true when all did.
 * Otherwise note gets "rank R: why" of the first rank that failed. */
typedef struct verdict {
    int ok;
    char why[NOTE_LEN - 24];
} verdict;

static bool agree(bench *b, bool ok, const char *why, char *note)
{
    verdict mine = {.ok = ok}, *all = calloc((size_t)b->size, sizeof *all);
    if (!all)
        die(b, "agree", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
    snprintf(mine.why, sizeof mine.why, "%s", ok ? "" : why);
    CHECK(b, "symm_world_allgather (agreeing on a step)", symm_world_allgather(b->world, &mine, all, sizeof mine));
    bool all_ok = true;
    for (int r = 0; r < b->size && all_ok; r++)
        if (!all[r].ok) {
            all_ok = false;
            if (note)
                snprintf(note, NOTE_LEN, "rank %d: %s", r, all[r].why);
        }
    free(all);
    return all_ok;
}

/* Wait for an event without hanging forever on a dead peer. */
static symm_status wait_event(bench *b, CUevent e, const char *what)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        CUresult r = b->cu->cuEventQuery(e);
        if (r == CUDA_SUCCESS)
            return SYMM_OK;
        if (r != CUDA_ERROR_NOT_READY)
            return symm_cuda_check(r, what);
        if (seconds_since(&t0) > b->wait_timeout_s)
            return symm_fail(SYMM_ERR_TIMEOUT,
                             "%s: the GPU has not finished after %.0f s: a peer rank is missing or stuck "
                             "(see its messages)", what, b->wait_timeout_s);
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    }
}

/* Wait for everything queued on the benchmark's stream. */
static symm_status stream_sync(bench *b, const char *what)
{
    SYMM_CU(b->cu, cuEventRecord(b->ev[0], b->stream));
    return wait_event(b, b->ev[0], what);
}

/* Queue a barrier of all GPUs on the stream: write this rank's epoch into
 * every peer's flag slot, then wait until every peer's slot here holds it. */
static symm_status device_barrier(bench *b)
{
    const symm_cuda_api *cu = b->cu;
    b->epoch++;
    for (int p = 0; p < b->size; p++)
        if (p != b->rank)
            SYMM_CU(cu, cuStreamWriteValue32(b->stream, symm_alloc_peer(b->flags, p) + (size_t)b->rank * FLAG_SLOT,
                                             b->epoch, CU_STREAM_WRITE_VALUE_DEFAULT));
    for (int p = 0; p < b->size; p++)
        if (p != b->rank)
            SYMM_CU(cu, cuStreamWaitValue32(b->stream, symm_alloc_local(b->flags) + (size_t)p * FLAG_SLOT, b->epoch,
                                            CU_STREAM_WAIT_VALUE_GEQ));
    return SYMM_OK;
}

/* ---- timing ------------------------------------------------------------- */

/* Something timed: issued directly, or replayed from the graph it was captured in. */
typedef symm_status (*issue_fn)(bench *b, void *ctx, CUstream s);
typedef struct work {
    issue_fn issue;
    void *ctx;
    CUgraphExec graph;
} work;

static symm_status work_capture(bench *b, work *w)
{
    const symm_cuda_api *cu = b->cu;
    CUgraph g = NULL;
    SYMM_CU(cu, cuStreamBeginCapture(b->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    symm_status st = w->issue(b, w->ctx, b->stream);
    CUresult end = cu->cuStreamEndCapture(b->stream, &g);
    if (st == SYMM_OK)
        st = symm_cuda_check(end, "cuStreamEndCapture");
    if (st == SYMM_OK)
        st = symm_cuda_check(cu->cuGraphInstantiateWithFlags(&w->graph, g, 0), "cuGraphInstantiateWithFlags");
    if (g)
        cu->cuGraphDestroy(g);
    return st;
}

static symm_status work_run(bench *b, const work *w)
{
    if (w->graph)
        return symm_cuda_check(b->cu->cuGraphLaunch(w->graph, b->stream), "cuGraphLaunch");
    return w->issue(b, w->ctx, b->stream);
}

static void work_release(bench *b, work *w)
{
    if (w->graph)
        b->cu->cuGraphExecDestroy(w->graph);
    w->graph = NULL;
}

/* Warm-up, then o->reps timed repetitions of w, each after a host barrier
 * and a device barrier: samples[i] = milliseconds of repetition i, this rank. */
static symm_status time_work(bench *b, const work *w, double *samples)
{
    const symm_cuda_api *cu = b->cu;
    const int reps = b->o->reps, warmup = b->o->warmup;
    for (int i = 0; i < warmup + reps; i++) {
        SYMM_TRY(symm_world_barrier(b->world));
        SYMM_TRY(device_barrier(b));
        SYMM_CU(cu, cuEventRecord(b->ev[0], b->stream));
        SYMM_TRY(work_run(b, w));
        SYMM_CU(cu, cuEventRecord(b->ev[1], b->stream));
        SYMM_TRY(wait_event(b, b->ev[1], "a timed repetition"));
        if (i < warmup)
            continue;
        float ms;
        SYMM_CU(cu, cuEventElapsedTime(&ms, b->ev[0], b->ev[1]));
        samples[i - warmup] = ms;
    }
    return SYMM_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double quantile(const double *sorted, int n, double q)
{
    const double pos = q * (n - 1);
    const int i = (int)pos;
    return i + 1 < n ? sorted[i] + (pos - i) * (sorted[i + 1] - sorted[i]) : sorted[n - 1];
}

/* p50 and p90 over repetitions of the slowest rank's time (us per call). */
static stat2 slowest_rank(bench *b, const double *mine_us)
{
    const int reps = b->o->reps;
    double *all = malloc(sizeof *all * (size_t)reps * b->size), *worst = malloc(sizeof *worst * (size_t)reps);
    if (!all || !worst)
        die(b, "slowest_rank", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
    CHECK(b, "symm_world_allgather (timings)",
          symm_world_allgather(b->world, mine_us, all, sizeof *all * (size_t)reps));
    for (int i = 0; i < reps; i++) {
        worst[i] = all[i];
        for (int r = 1; r < b->size; r++)
            worst[i] = fmax(worst[i], all[(size_t)r * reps + i]);
    }
    qsort(worst, (size_t)reps, sizeof *worst, cmp_double);
    stat2 s = {quantile(worst, reps, 0.5), quantile(worst, reps, 0.9)};
    free(all);
    free(worst);
    return s;
}

/* ---- device buffers of a variant ---------------------------------------- */

typedef struct dev_bufs {
    CUdeviceptr x, scales, topk, weights, y, out;
} dev_bufs;

static size_t row_bytes(const symm_variant_desc *d) { return (size_t)d->hidden * symm_dtype_size(d->dtype); }
static size_t crow_bytes(const symm_variant_desc *d) { return (size_t)d->hidden * symm_dtype_size(d->combine_dtype); }
static size_t scale_bytes(const symm_variant_desc *d)
{
    return d->dtype == SYMM_DTYPE_FP8_E4M3 ? (size_t)d->hidden / SYMM_FP8_BLOCK * 4 : 0;
}

static void bufs_free(bench *b, dev_bufs *db)
{
    CUdeviceptr *all[] = {&db->x, &db->scales, &db->topk, &db->weights, &db->y, &db->out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (*all[i])
            b->cu->cuMemFree(*all[i]);
        *all[i] = 0;
    }
}

static symm_status bufs_alloc(bench *b, const symm_variant_desc *d, dev_bufs *db)
{
    const symm_cuda_api *cu = b->cu;
    const size_t T = (size_t)d->max_tokens, K = (size_t)d->topk;
    memset(db, 0, sizeof *db);
    symm_status st = symm_cuda_check(cu->cuMemAlloc(&db->x, T * row_bytes(d)), "cuMemAlloc(x)");
    if (st == SYMM_OK && scale_bytes(d))
        st = symm_cuda_check(cu->cuMemAlloc(&db->scales, T * scale_bytes(d)), "cuMemAlloc(x_scales)");
    if (st == SYMM_OK)
        st = symm_cuda_check(cu->cuMemAlloc(&db->topk, T * K * 4), "cuMemAlloc(topk_idx)");
    if (st == SYMM_OK && d->weights)
        st = symm_cuda_check(cu->cuMemAlloc(&db->weights, T * K * 4), "cuMemAlloc(topk_weights)");
    /* A pulling variant's y is its region y (with_variant_y); "auto" has
     * both, for rows of either form. */
    if (st == SYMM_OK && d->combine != SYMM_COMBINE_PULL)
        st = symm_cuda_check(cu->cuMemAlloc(&db->y, (size_t)d->capacity * crow_bytes(d)), "cuMemAlloc(y)");
    if (st == SYMM_OK && db->y) /* rows the guard does not fill still hold finite values */
        st = symm_cuda_check(cu->cuMemsetD8(db->y, 0x3c, (size_t)d->capacity * crow_bytes(d)), "cuMemsetD8(y)");
    if (st == SYMM_OK)
        st = symm_cuda_check(cu->cuMemAlloc(&db->out, T * crow_bytes(d)), "cuMemAlloc(out)");
    if (st != SYMM_OK) {
        symm_fail_context(st, "%s: device buffers of the benchmark: ", d->name);
        bufs_free(b, db);
    }
    return st;
}

static symm_status upload_topk(bench *b, const dev_bufs *db, const routing_set *r)
{
    const size_t n = (size_t)r->tokens * r->topk;
    if (n)
        SYMM_CU(b->cu, cuMemcpyHtoD(db->topk, r->idx + (size_t)b->rank * n, n * 4));
    return SYMM_OK;
}

/* ---- the correctness guard ---------------------------------------------- */

/* This rank's share of the CPU reference of one variant at T = max_tokens,
 * uniform routing: its inputs, its y, what dispatch must deliver to it and
 * what combine must return to it. */
typedef struct guard {
    const symm_variant_desc *desc; /* the variant it was built for */
    symm_ref_config cfg;
    int tokens;
    routing_set route;
    void *x;
    float *scales, *weights;
    void *y;
    void *out;
    symm_ref_recv recv;
} guard;

static bool same_config(const symm_ref_config *a, const symm_ref_config *c)
{
    return a->hidden == c->hidden && a->topk == c->topk && a->experts == c->experts && a->world == c->world &&
           a->max_tokens == c->max_tokens && a->dtype == c->dtype && a->combine_dtype == c->combine_dtype &&
           a->layout == c->layout && a->weights == c->weights && a->capacity == c->capacity &&
           a->align == c->align && a->combine_order == c->combine_order;
}

static void guard_free(guard *g)
{
    routing_free(&g->route);
    free(g->x);
    free(g->scales);
    free(g->weights);
    free(g->y);
    free(g->out);
    symm_ref_recv_free(&g->recv);
    memset(g, 0, sizeof *g);
}

/* The whole world's inputs of the guard (every rank computes them all: its
 * combine output depends on its peers' y). */
typedef struct world_inputs {
    symm_ref_input *in;
    symm_ref_recv *recv;
    void **x, **y, **out;
    float **scales, **weights;
} world_inputs;

static void world_inputs_free(world_inputs *wi, int world, int keep)
{
    const bool arrays = wi->in && wi->recv && wi->x && wi->y && wi->out && wi->scales && wi->weights;
    for (int p = 0; arrays && p < world; p++) {
        if (p == keep)
            continue;
        free(wi->x[p]);
        free(wi->y[p]);
        free(wi->out[p]);
        free(wi->scales[p]);
        free(wi->weights[p]);
        symm_ref_recv_free(&wi->recv[p]);
    }
    free(wi->in);
    free(wi->recv);
    free(wi->x);
    free(wi->y);
    free(wi->out);
    free(wi->scales);
    free(wi->weights);
}

/* guard_inputs' and guard_build's work for one rank, run for the ranks on
 * several threads (par_ranks.h): each rank's arrays are its own, drawn from
 * its own stream, so the bytes are those of a loop over the ranks. */
typedef struct guard_fill {
    const bench *b;
    const symm_variant_desc *d;
    guard *g;
    world_inputs *wi;
    symm_status st[SYMM_REF_MAX_WORLD];
    /* The first failure's rank and message (symm_last_error is the
     * failing thread's own). */
    atomic_int failed;
    char why[256];
} guard_fill;

/* Rank p's status: kept, and the first failure's message copied. */
static void guard_fill_set(guard_fill *f, int p, symm_status st)
{
    f->st[p] = st;
    int none = -1;
    if (st != SYMM_OK && atomic_compare_exchange_strong(&f->failed, &none, p))
        snprintf(f->why, sizeof f->why, "%s", symm_last_error());
}

static void guard_rank_inputs(void *arg, int p)
{
    guard_fill *f = arg;
    const symm_variant_desc *d = f->d;
    guard *g = f->g;
    world_inputs *wi = f->wi;
    const int T = g->tokens, K = d->topk;
    const size_t H = (size_t)d->hidden;
    moe_rng r = moe_rng_for(f->b->seed, shape_key(d), (uint64_t)p + 1);
    wi->x[p] = malloc((size_t)T * row_bytes(d) + 16);
    wi->scales[p] = scale_bytes(d) ? malloc((size_t)T * scale_bytes(d) + 16) : NULL;
    wi->weights[p] = d->weights ? malloc((size_t)T * K * sizeof(float) + 16) : NULL;
    if (!wi->x[p] || (scale_bytes(d) && !wi->scales[p]) || (d->weights && !wi->weights[p])) {
        guard_fill_set(f, p, symm_fail(SYMM_ERR_NOMEM, "out of host memory for rank %d's inputs", p));
        return;
    }
    fill_random(&r, d->dtype, wi->x[p], (size_t)T * H);
    if (wi->scales[p])
        moe_random_floats(&r, wi->scales[p], (size_t)T * (H / SYMM_FP8_BLOCK), 0.01);
    if (wi->weights[p])
        moe_random_floats(&r, wi->weights[p], (size_t)T * K, 0.0);
    wi->in[p] = (symm_ref_input){T, wi->x[p], wi->scales[p], g->route.idx + (size_t)p * T * K, wi->weights[p]};
    guard_fill_set(f, p, symm_ref_recv_alloc_lazy(&g->cfg, &wi->recv[p]));
}

static void guard_rank_y(void *arg, int p)
{
    guard_fill *f = arg;
    const symm_variant_desc *d = f->d;
    world_inputs *wi = f->wi;
    const int64_t rows = wi->recv[p].rows;
    moe_rng r = moe_rng_for(f->b->seed, shape_key(d) ^ 0x5EED, (uint64_t)p + 1);
    wi->y[p] = malloc((size_t)(rows > 0 ? rows : 1) * crow_bytes(d));
    wi->out[p] = malloc((size_t)f->g->tokens * crow_bytes(d) + 16);
    if (!wi->y[p] || !wi->out[p])
        guard_fill_set(f, p, symm_fail(SYMM_ERR_NOMEM, "out of host memory for rank %d's y", p));
    else
        fill_random(&r, d->combine_dtype, wi->y[p], (size_t)rows * d->hidden);
}

/* The first failure of a par_ranks run, its message raised again on this
 * thread; SYMM_OK when every rank's work was done. */
static symm_status guard_fill_status(const guard_fill *f)
{
    const int p = atomic_load(&f->failed);
    return p < 0 ? SYMM_OK : symm_fail(f->st[p], "%s", f->why);
}

static symm_status guard_inputs(const bench *b, const symm_variant_desc *d, guard *g, world_inputs *wi)
{
    const int W = d->world;
    wi->in = calloc((size_t)W, sizeof *wi->in);
    wi->recv = calloc((size_t)W, sizeof *wi->recv);
    wi->x = calloc((size_t)W, sizeof *wi->x);
    wi->y = calloc((size_t)W, sizeof *wi->y);
    wi->out = calloc((size_t)W, sizeof *wi->out);
    wi->scales = calloc((size_t)W, sizeof *wi->scales);
    wi->weights = calloc((size_t)W, sizeof *wi->weights);
    if (!wi->in || !wi->recv || !wi->x || !wi->y || !wi->out || !wi->scales || !wi->weights)
        return symm_fail(SYMM_ERR_NOMEM, "out of host memory");
    if (W > SYMM_REF_MAX_WORLD)
        return symm_fail(SYMM_ERR_INVALID_ARG, "world %d: the CPU reference takes at most %d ranks", W,
                         SYMM_REF_MAX_WORLD);
    guard_fill f = {.b = b, .d = d, .g = g, .wi = wi};
    atomic_init(&f.failed, -1);
    par_ranks(W, par_ranks_threads(W), guard_rank_inputs, &f);
    return guard_fill_status(&f);
}

/* Build this rank's share of the reference for d. */
static symm_status guard_build(const bench *b, const symm_variant_desc *d, guard *g)
{
    const int W = d->world, me = b->rank;
    memset(g, 0, sizeof *g);
    g->desc = d;
    g->cfg = moe_ref_config(d);
    g->tokens = d->max_tokens;
    SYMM_TRY(routing_make(d, b->seed, ROUTE_UNIFORM, g->tokens, &g->route));
    world_inputs wi = {0};
    symm_status st = guard_inputs(b, d, g, &wi);
    if (st == SYMM_OK)
        st = symm_ref_dispatch(&g->cfg, wi.in, wi.recv, NULL);
    if (st == SYMM_OK) {
        guard_fill f = {.b = b, .d = d, .g = g, .wi = &wi};
        atomic_init(&f.failed, -1);
        par_ranks(W, par_ranks_threads(W), guard_rank_y, &f);
        st = guard_fill_status(&f);
    }
    if (st == SYMM_OK)
        st = symm_ref_combine(&g->cfg, wi.in, wi.recv, (const void *const *)wi.y, wi.out);
    if (st == SYMM_OK) {
        g->x = wi.x[me];
        g->scales = wi.scales[me];
        g->weights = wi.weights[me];
        g->y = wi.y[me];
        g->out = wi.out[me];
        g->recv = wi.recv[me];
    }
    world_inputs_free(&wi, W, st == SYMM_OK ? me : -1);
    if (st != SYMM_OK) {
        symm_fail_context(st, "CPU reference of %s at T=%d: ", d->name, g->tokens);
        guard_free(g);
    }
    return st;
}

static void *download(bench *b, CUdeviceptr p, size_t n, symm_status *st)
{
    void *h = malloc(n ? n : 1);
    if (!h)
        *st = symm_fail(SYMM_ERR_NOMEM, "out of host memory (%zu bytes)", n);
    else if (n)
        *st = symm_cuda_check(b->cu->cuMemcpyDtoH(h, p, n), "cuMemcpyDtoH (guard)");
    return h;
}

/* Compare rows [first, first + n) of recv_x and recv_src with the reference. */
static bool same_rows(const guard *g, const unsigned char *x, const int32_t *src, int64_t first, int64_t n,
                      char *why)
{
    const size_t rb = row_bytes(g->desc);
    for (int64_t r = first; r < first + n; r++) {
        if (memcmp(x + r * rb, (const unsigned char *)g->recv.x + r * rb, rb)) {
            snprintf(why, NOTE_LEN, "recv_x row %" PRId64 " differs from the CPU reference", r);
            return false;
        }
        if (memcmp(src + r * 4, g->recv.src + r * 4, 12)) {
            snprintf(why, NOTE_LEN, "recv_src row %" PRId64 ": got {%d,%d,%d}, want {%d,%d,%d}", r, src[r * 4],
                     src[r * 4 + 1], src[r * 4 + 2], g->recv.src[r * 4], g->recv.src[r * 4 + 1],
                     g->recv.src[r * 4 + 2]);
            return false;
        }
    }
    return true;
}

/* The variant's results of the guard's call against the reference. */
static bool guard_compare(bench *b, symm_variant *v, const guard *g, const dev_bufs *db, char *why)
{
    const symm_variant_desc *d = g->desc;
    const int L = d->experts / d->world;
    symm_variant_stats stats;
    symm_status st = symm_variant_stats_read(v, b->stream, &stats);
    if (st != SYMM_OK) {
        snprintf(why, NOTE_LEN, "%s: %s", symm_status_name(st), symm_last_error());
        return false;
    }
    if (stats.recv_rows != g->recv.rows) {
        snprintf(why, NOTE_LEN, "received %d rows, the CPU reference %" PRId64, stats.recv_rows, g->recv.rows);
        return false;
    }
    symm_recv_buffers rb;
    st = symm_variant_recv(v, &rb);
    const size_t rows = (size_t)g->recv.rows;
    unsigned char *x = st == SYMM_OK ? download(b, rb.x, rows * row_bytes(d), &st) : NULL;
    int32_t *src = st == SYMM_OK ? download(b, rb.src, rows * 16, &st) : NULL;
    int32_t *count = st == SYMM_OK ? download(b, rb.expert_count, (size_t)L * 4, &st) : NULL;
    unsigned char *out = st == SYMM_OK ? download(b, db->out, (size_t)g->tokens * crow_bytes(d), &st) : NULL;
    bool ok = st == SYMM_OK;
    if (!ok)
        snprintf(why, NOTE_LEN, "reading the results: %s", symm_last_error());
    if (ok && memcmp(count, g->recv.expert_count, (size_t)L * 4)) {
        ok = false;
        snprintf(why, NOTE_LEN, "expert_count differs from the CPU reference");
    }
    if (ok && d->layout == SYMM_LAYOUT_RANK)
        ok = same_rows(g, x, src, 0, g->recv.rows, why);
    for (int j = 0; ok && d->layout == SYMM_LAYOUT_EXPERT && j < L; j++)
        ok = same_rows(g, x, src, g->recv.expert_offset[j], g->recv.expert_count[j], why);
    if (ok) {
        const size_t crow = crow_bytes(d);
        for (int t = 0; t < g->tokens && ok; t++)
            if (memcmp(out + t * crow, (const unsigned char *)g->out + t * crow, crow)) {
                ok = false;
                snprintf(why, NOTE_LEN, "combine output of token %d differs from the CPU reference", t);
            }
    }
    free(x);
    free(src);
    free(count);
    free(out);
    return ok;
}

/* One dispatch + combine of the guard's inputs on v, compared with the
 * reference. Returns a status only for failures of the benchmark itself. */
static symm_status guard_run(bench *b, symm_variant *v, const guard *g, const dev_bufs *db, bool *ok, char *why)
{
    const symm_cuda_api *cu = b->cu;
    const symm_variant_desc *d = g->desc;
    const size_t T = (size_t)g->tokens, K = (size_t)d->topk;
    SYMM_CU(cu, cuMemcpyHtoD(db->x, g->x, T * row_bytes(d)));
    if (db->scales)
        SYMM_CU(cu, cuMemcpyHtoD(db->scales, g->scales, T * scale_bytes(d)));
    if (db->weights)
        SYMM_CU(cu, cuMemcpyHtoD(db->weights, g->weights, T * K * 4));
    SYMM_TRY(upload_topk(b, db, &g->route));
    if (g->recv.rows)
        SYMM_CU(cu, cuMemcpyHtoD(db->y, g->y, (size_t)g->recv.rows * crow_bytes(d)));
    SYMM_CU(cu, cuMemsetD8(db->out, POISON, T * crow_bytes(d)));
    /* The copies from pageable memory may return before their DMA lands, and
     * b->stream does not wait for the legacy stream: wait here. */
    SYMM_CU(cu, cuCtxSynchronize());
    symm_dispatch_args a = {
        .tokens = g->tokens,
        .x = (const void *)(uintptr_t)db->x,
        .x_scales = (const float *)(uintptr_t)db->scales,
        .topk_idx = (const int32_t *)(uintptr_t)db->topk,
        .topk_weights = (const float *)(uintptr_t)db->weights,
    };
    symm_status st = symm_variant_dispatch(v, &a, b->stream);
    if (st == SYMM_OK)
        st = symm_variant_combine(v, (const void *)(uintptr_t)db->y, (void *)(uintptr_t)db->out, b->stream);
    if (st != SYMM_OK) {
        *ok = false;
        snprintf(why, NOTE_LEN, "guard call: %s: %s", symm_status_name(st), symm_last_error());
        /* Let the peers' kernels give up (device timeout) before going on. */
        symm_variant_stats_read(v, b->stream, NULL);
        return SYMM_OK;
    }
    *ok = guard_compare(b, v, g, db, why);
    return SYMM_OK;
}

/* ---- dispatch and combine rows ------------------------------------------ */

/* One row's calls. A repetition is `calls` dispatch+combine pairs with an
 * event before and after every call (b->ev[0 .. 2 * calls]). A combine must
 * follow every dispatch: its flags count arrivals per dispatch, so neither
 * dispatches alone nor combines alone may be repeated. */
typedef struct pair_ctx {
    symm_variant *v;
    symm_dispatch_args args;
    CUdeviceptr y, out;
    int calls;
} pair_ctx;

static symm_status issue_dispatch(bench *b, void *ctx, CUstream s)
{
    (void)b;
    pair_ctx *c = ctx;
    return symm_variant_dispatch(c->v, &c->args, s);
}

static symm_status issue_combine(bench *b, void *ctx, CUstream s)
{
    (void)b;
    pair_ctx *c = ctx;
    return symm_variant_combine(c->v, (const void *)(uintptr_t)c->y, (void *)(uintptr_t)c->out, s);
}

/* Timing event k, for capture: an event-record node (CU_EVENT_RECORD_EXTERNAL,
 * recorded by every replay) after everything issued on s so far. By default
 * on a side branch: the node depends on the kernel before it and nothing
 * depends on it, so the kernels follow each other as in an application's
 * graph (a kernel after an event node waits for that node, and dispatch and
 * combine then are not programmatic dependents of each other). With
 * --inline-events the node sits on s itself, between the kernels. */
static symm_status mark(bench *b, CUstream s, int k)
{
    const symm_cuda_api *cu = b->cu;
    if (b->o->inline_events) {
        SYMM_CU(cu, cuEventRecordWithFlags(b->ev[k], s, CU_EVENT_RECORD_EXTERNAL));
        return SYMM_OK;
    }
    SYMM_CU(cu, cuEventRecord(b->side_fork, s));
    SYMM_CU(cu, cuStreamWaitEvent(b->side, b->side_fork, 0));
    SYMM_CU(cu, cuEventRecordWithFlags(b->ev[k], b->side, CU_EVENT_RECORD_EXTERNAL));
    return SYMM_OK;
}

/* Every pair with its events, for capture into one graph (see mark); the
 * side branch joins s at the end. */
static symm_status issue_timed_pairs(bench *b, void *ctx, CUstream s)
{
    const symm_cuda_api *cu = b->cu;
    pair_ctx *c = ctx;
    for (int i = 0; i < c->calls; i++) {
        SYMM_TRY(mark(b, s, 2 * i));
        SYMM_TRY(issue_dispatch(b, c, s));
        SYMM_TRY(mark(b, s, 2 * i + 1));
        SYMM_TRY(issue_combine(b, c, s));
    }
    SYMM_TRY(mark(b, s, 2 * c->calls));
    if (!b->o->inline_events) {
        SYMM_CU(cu, cuEventRecord(b->side_join, b->side));
        SYMM_CU(cu, cuStreamWaitEvent(s, b->side_join, 0));
    }
    return SYMM_OK;
}

/* Every pair back to back with nothing between them, as an application's
 * graph holds them: timed by events around the whole graph (time_one). */
static symm_status issue_bare_pairs(bench *b, void *ctx, CUstream s)
{
    pair_ctx *c = ctx;
    for (int i = 0; i < c->calls; i++) {
        SYMM_TRY(issue_dispatch(b, c, s));
        SYMM_TRY(issue_combine(b, c, s));
    }
    return SYMM_OK;
}

/* How a row's pairs are issued: one graph of all of them (whole), or one
 * graph or plain call per dispatch and per combine with the events between. */
typedef struct pair_works {
    work whole, dispatch, combine;
} pair_works;

static symm_status run_pairs(bench *b, const pair_ctx *c, const pair_works *pw)
{
    const symm_cuda_api *cu = b->cu;
    if (pw->whole.graph) {
        SYMM_TRY(work_run(b, &pw->whole));
    } else {
        for (int i = 0; i < c->calls; i++) {
            SYMM_CU(cu, cuEventRecord(b->ev[2 * i], b->stream));
            SYMM_TRY(work_run(b, &pw->dispatch));
            SYMM_CU(cu, cuEventRecord(b->ev[2 * i + 1], b->stream));
            SYMM_TRY(work_run(b, &pw->combine));
        }
        SYMM_CU(cu, cuEventRecord(b->ev[2 * c->calls], b->stream));
    }
    /* A plain record after everything: the host waits for it (the graph's
     * own event nodes are only read once the stream has passed them). */
    SYMM_CU(cu, cuEventRecord(b->done, b->stream));
    return SYMM_OK;
}

/* Warm-up, then the timed repetitions: us[i] and us[reps + i] = dispatch and
 * combine microseconds per call in repetition i, this rank. */
static symm_status time_pairs(bench *b, const pair_ctx *c, const pair_works *pw, double *us)
{
    const symm_cuda_api *cu = b->cu;
    const int reps = b->o->reps, warmup = b->o->warmup, n = c->calls;
    for (int i = 0; i < warmup + reps; i++) {
        SYMM_TRY(symm_world_barrier(b->world));
        SYMM_TRY(device_barrier(b));
        SYMM_TRY(run_pairs(b, c, pw));
        SYMM_TRY(wait_event(b, b->done, "a timed repetition"));
        if (i < warmup)
            continue;
        double dispatch = 0, combine = 0;
        for (int k = 0; k < 2 * n; k++) {
            float ms;
            SYMM_CU(cu, cuEventElapsedTime(&ms, b->ev[k], b->ev[k + 1]));
            *(k % 2 ? &combine : &dispatch) += ms;
        }
        us[i - warmup] = dispatch * 1e3 / n;
        us[reps + i - warmup] = combine * 1e3 / n;
    }
    return SYMM_OK;
}

/* Native backend: one graph with event nodes; if that capture fails on some
 * rank, one graph per call. *mode says which; false when neither worked. */
static bool capture_pairs(bench *b, pair_works *pw, const char **mode, char *why)
{
    symm_status st = work_capture(b, &pw->whole);
    if (st != SYMM_OK)
        fprintf(stderr, "moe_bench: rank %d: one graph with event nodes: %s; trying one graph per call\n", b->rank,
                symm_last_error());
    if (agree(b, st == SYMM_OK, "", NULL)) {
        *mode = "one graph";
        return true;
    }
    work_release(b, &pw->whole);
    st = work_capture(b, &pw->dispatch);
    if (st == SYMM_OK)
        st = work_capture(b, &pw->combine);
    if (st != SYMM_OK)
        snprintf(why, NOTE_LEN, "graph capture: %s: %s", symm_status_name(st), symm_last_error());
    *mode = "graph per call";
    return st == SYMM_OK;
}

/* --profile: PROFILE_CALLS single plain dispatch + combine pairs, each
 * starting after a host and a device barrier, the phase times of each read
 * after it (symm_variant_profile_read); rank 0 prints every rank's medians.
 * --profile=2: also the spans of each call, as a warp's means (a sum over
 * the warps / the warps), and their medians. */
#define PROFILE_CALLS 20
#define PROFILE_FIELDS 14

/* The spans as a warp's means: per kind, its warps, then each field. */
enum {
    SP_PARTS_WARPS, SP_PARTS_LOOP, SP_PARTS_SCAN, SP_PARTS_PART, SP_PARTS_ISSUE, SP_PARTS_LOADS, SP_PARTS_SUMS,
    SP_PARTS_SLOTS, SP_PARTS_PUBLISH, SP_PARTS_PARTS, SP_PARTS_CHUNKS, SP_PARTS_ROWS,
    SP_PUSH_WARPS, SP_PUSH_LOOP, SP_PUSH_COPY, SP_PUSH_LOADS, SP_PUSH_SLOTS, SP_PUSH_PUBLISH, SP_PUSH_ROWS,
    SP_PUSH_BATCHES,
    SP_SUMS_WARPS, SP_SUMS_LOOP, SP_SUMS_WAIT, SP_SUMS_SUM, SP_SUMS_UNITS, SP_SUMS_TOKENS,
    SP_ROWS_WARPS, SP_ROWS_LOOP, SP_ROWS_LOADS, SP_ROWS_SLOTS, SP_ROWS_DRAIN, SP_ROWS_TOKENS, SP_ROWS_ROWS,
    SP_ROWS_IDLE, SPAN_FIELDS
};

static double per_warp(double sum, uint64_t warps) { return warps ? sum / (double)warps : 0.0; }

static void span_fields(const symm_variant_profile *p, double *f)
{
    const symm_variant_spans_parts *pa = &p->parts;
    const symm_variant_spans_push *pu = &p->push;
    const symm_variant_spans_sums *su = &p->sums;
    const symm_variant_spans_rows *ro = &p->rows;
    const double w[4] = {(double)pa->warps, (double)pu->warps, (double)su->warps, (double)ro->warps};
    const double parts[] = {w[0], per_warp(pa->loop_us, pa->warps), per_warp(pa->scan_us, pa->warps),
                            per_warp(pa->part_us, pa->warps), per_warp(pa->issue_us, pa->warps),
                            per_warp(pa->loads_us, pa->warps), per_warp(pa->sums_us, pa->warps),
                            per_warp(pa->slots_us, pa->warps), per_warp(pa->publish_us, pa->warps),
                            per_warp((double)pa->parts, pa->warps), per_warp((double)pa->chunks, pa->warps),
                            per_warp((double)pa->rows, pa->warps)};
    const double push[] = {w[1], per_warp(pu->loop_us, pu->warps), per_warp(pu->copy_us, pu->warps),
                           per_warp(pu->loads_us, pu->warps), per_warp(pu->slots_us, pu->warps),
                           per_warp(pu->publish_us, pu->warps), per_warp((double)pu->rows, pu->warps),
                           per_warp((double)pu->batches, pu->warps)};
    const double sums[] = {w[2], per_warp(su->loop_us, su->warps), per_warp(su->wait_us, su->warps),
                           per_warp(su->sum_us, su->warps), per_warp((double)su->units, su->warps),
                           per_warp((double)su->tokens, su->warps)};
    const double rows[] = {w[3], per_warp(ro->loop_us, ro->warps), per_warp(ro->loads_us, ro->warps),
                           per_warp(ro->slots_us, ro->warps), per_warp(ro->drain_us, ro->warps),
                           per_warp((double)ro->tokens, ro->warps), per_warp((double)ro->rows, ro->warps),
                           per_warp(ro->idle_us, ro->warps)};
    _Static_assert(sizeof parts / sizeof parts[0] == SP_PUSH_WARPS && sizeof push / sizeof push[0] == SP_SUMS_WARPS -
                   SP_PUSH_WARPS && sizeof sums / sizeof sums[0] == SP_ROWS_WARPS - SP_SUMS_WARPS &&
                   sizeof rows / sizeof rows[0] == SPAN_FIELDS - SP_ROWS_WARPS, "the span fields");
    memcpy(f + SP_PARTS_WARPS, parts, sizeof parts);
    memcpy(f + SP_PUSH_WARPS, push, sizeof push);
    memcpy(f + SP_SUMS_WARPS, sums, sizeof sums);
    memcpy(f + SP_ROWS_WARPS, rows, sizeof rows);
}

/* " + name 12.3 (45%)", the share of `loop`; "[" or "]" around the parts of
 * the span before when open / close. */
static int span_term(char *buf, size_t n, const char *sep, const char *name, double us, double loop)
{
    return snprintf(buf, n, "%s%s %.1f (%.0f%%)", sep, name, us, loop > 0 ? 100.0 * us / loop : 0.0);
}

/* One kind's line: its loop = the spans (names[i] of m[first + i]; a name
 * starting with '[' opens the parts of the span before it, one ending with
 * ']' closes them, and they do not count towards the rest) + other;
 * then the counts a warp. */
static void span_line(const bench *b, const char *kind, const double *m, int warps_at, const char *const *names,
                      int n_spans, const char *const *counts, int n_counts)
{
    const double warps = m[warps_at], loop = m[warps_at + 1];
    if (warps <= 0)
        return;
    char line[768];
    size_t at = 0;
    at += (size_t)snprintf(line, sizeof line, "      %s (%.0f warps): loop %.1f us =", kind, warps, loop);
    double rest = loop;
    bool inner = false;
    for (int i = 0; i < n_spans && at < sizeof line; i++) {
        const double us = m[warps_at + 2 + i];
        const char *name = names[i];
        const bool opens = name[0] == '[';
        const size_t len = strlen(name);
        const bool closes = len > 0 && name[len - 1] == ']';
        char bare[32];
        snprintf(bare, sizeof bare, "%.*s", (int)(len - opens - closes), name + opens);
        const char *sep = opens ? " [" : i == 0 ? " " : inner ? ", " : " + ";
        at += (size_t)span_term(line + at, sizeof line - at, sep, bare, us, loop);
        if (closes && at < sizeof line)
            at += (size_t)snprintf(line + at, sizeof line - at, "]");
        if (!opens && !inner)
            rest -= us;
        inner = (inner || opens) && !closes;
    }
    if (at < sizeof line)
        at += (size_t)span_term(line + at, sizeof line - at, " + ", "other", rest, loop);
    for (int i = 0; i < n_counts && at < sizeof line; i++)
        at += (size_t)snprintf(line + at, sizeof line - at, "%s%s %.1f", i ? ", " : "; ", counts[i],
                               m[warps_at + 2 + n_spans + i]);
    if (at < sizeof line)
        snprintf(line + at, sizeof line - at, "%s", n_counts ? " a warp" : "");
    say(b, "%s\n", line);
}

static void print_spans(const bench *b, const row_result *r, int q, const double *m)
{
    say(b, "    spans   %-10s rank %d (a warp's mean in us, share of its loop; median of %d single pairs):\n",
        r->spec->id, q, PROFILE_CALLS);
    static const char *const parts[] = {"scan", "part", "[issue", "loads", "sums", "slots]", "publish"};
    static const char *const parts_n[] = {"parts", "chunks", "rows"};
    span_line(b, "combine push warps forming parts", m, SP_PARTS_WARPS, parts, 7, parts_n, 3);
    static const char *const push[] = {"copy", "[loads", "slots]", "publish"};
    static const char *const push_n[] = {"rows", "batches"};
    span_line(b, "combine push warps pushing rows", m, SP_PUSH_WARPS, push, 4, push_n, 2);
    static const char *const sums[] = {"waits", "sums"};
    static const char *const sums_n[] = {"units", "tokens"};
    span_line(b, "combine sums", m, SP_SUMS_WARPS, sums, 2, sums_n, 2);
    static const char *const rows[] = {"loads", "slots", "drain"};
    static const char *const rows_n[] = {"tokens", "rows"};
    span_line(b, "dispatch warps sending rows", m, SP_ROWS_WARPS, rows, 3, rows_n, 2);
    if (m[SP_ROWS_WARPS] > 0)
        say(b, "        then idle %.1f us a warp (its stores complete to its block's last warp's)\n", m[SP_ROWS_IDLE]);
}

static void profile_calls(bench *b, const pair_ctx *c, const row_result *r)
{
    enum { FIELDS = PROFILE_FIELDS + SPAN_FIELDS };
    double t[FIELDS][PROFILE_CALLS];
    for (int i = 0; i < PROFILE_CALLS; i++) {
        CHECK(b, "profile", symm_world_barrier(b->world));
        CHECK(b, "profile", device_barrier(b));
        CHECK(b, "profile: dispatch", issue_dispatch(b, (void *)c, b->stream));
        CHECK(b, "profile: combine", issue_combine(b, (void *)c, b->stream));
        symm_variant_profile p;
        CHECK(b, "symm_variant_profile_read", symm_variant_profile_read(c->v, b->stream, &p));
        double f[FIELDS] = {p.dispatch_routed_us, p.dispatch_counted_us, p.dispatch_counts_in_us, p.dispatch_bases_us,
                            p.dispatch_stored_us, p.dispatch_rows_out_us, p.dispatch_rows_in_us,
                            p.dispatch_us, p.combine_issued_us, p.combine_stored_us, p.combine_fenced_us,
                            p.combine_pushed_us, p.combine_flags_in_us, p.combine_us};
        span_fields(&p, f + PROFILE_FIELDS);
        for (int j = 0; j < FIELDS; j++)
            t[j][i] = f[j];
    }
    double mine[FIELDS], *all = calloc((size_t)b->size * FIELDS, sizeof *all);
    if (!all)
        die(b, "profile", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
    for (int j = 0; j < FIELDS; j++) {
        qsort(t[j], PROFILE_CALLS, sizeof t[j][0], cmp_double);
        mine[j] = t[j][PROFILE_CALLS / 2];
    }
    CHECK(b, "symm_world_allgather (profile)", symm_world_allgather(b->world, mine, all, sizeof mine));
    for (int q = 0; q < b->size; q++) {
        const double *m = all + (size_t)q * FIELDS;
        say(b, "    profile %-10s rank %d (us from the kernel's start, median of %d single pairs): dispatch: "
               "routed %.1f, counts out %.1f, in %.1f, bases %.1f, stored %.1f, rows out %.1f, in %.1f, end %.1f; "
               "combine: first batch issued %.1f, stored %.1f, fenced %.1f, pushed %.1f, flags in %.1f, end %.1f\n",
            r->spec->id, q, PROFILE_CALLS, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8], m[9], m[10], m[11], m[12],
            m[13]);
        if (b->o->profile >= 2)
            print_spans(b, r, q, m + PROFILE_FIELDS);
    }
    free(all);
}

/* Time dispatch and combine of v at one row (graphs for the native backend,
 * plain calls for the NCCL backend). *ok false (agreed by all ranks) with a
 * note when a capture, a call or the statistics after the timing failed. */
static stat2 time_one(bench *b, work *w, int calls);

/* After timed calls: the variant's statistics read clean on every rank
 * (agreed); else false with note saying what failed after `what`. */
static bool stats_clean(bench *b, symm_variant *v, const char *what, char *note)
{
    char why[NOTE_LEN] = "";
    symm_status st = symm_variant_stats_read(v, b->stream, NULL);
    if (st != SYMM_OK)
        snprintf(why, sizeof why, "after the timed %s: %s: %s", what, symm_status_name(st), symm_last_error());
    return agree(b, st == SYMM_OK, why, note);
}

/* With graphs, also *pair (when pair is not NULL): the pairs back to back in
 * one graph with no event between them, per pair; *pair_ok false where that
 * capture failed on some rank. */
static void time_calls(bench *b, symm_variant *v, bool graphs, const dev_bufs *db, const row_result *r,
                       stat2 *dispatch, stat2 *combine, const char **mode, bool *ok, char *note, stat2 *pair,
                       bool *pair_ok)
{
    const symm_variant_desc *d = r->desc;
    const int reps = b->o->reps;
    char why[NOTE_LEN] = "";
    routing_set route;
    CHECK(b, "routing", routing_make(d, b->seed, r->spec->route, r->spec->tokens, &route));
    CHECK(b, "uploading topk_idx", upload_topk(b, db, &route));
    routing_free(&route);
    pair_ctx c = {
        .v = v,
        .args = {.tokens = r->spec->tokens,
                 .x = (const void *)(uintptr_t)db->x,
                 .x_scales = (const float *)(uintptr_t)db->scales,
                 .topk_idx = (const int32_t *)(uintptr_t)db->topk,
                 .topk_weights = (const float *)(uintptr_t)db->weights},
        .y = db->y, .out = db->out, .calls = r->calls,
    };
    pair_works pw = {{issue_timed_pairs, &c, NULL}, {issue_dispatch, &c, NULL}, {issue_combine, &c, NULL}};
    *mode = "plain calls";
    *ok = agree(b, !graphs || capture_pairs(b, &pw, mode, why), why, note);
    double *us = malloc(sizeof *us * 2 * (size_t)reps);
    if (!us)
        die(b, "time_calls", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
    if (*ok) {
        CHECK(b, d->name, time_pairs(b, &c, &pw, us));
        *ok = stats_clean(b, v, "calls", note);
    }
    if (*ok) {
        *dispatch = slowest_rank(b, us);
        *combine = slowest_rank(b, us + reps);
        if (b->o->profile)
            profile_calls(b, &c, r);
    }
    if (*ok && graphs && pair) {
        work bare = {issue_bare_pairs, &c, NULL};
        symm_status st = work_capture(b, &bare);
        if (st != SYMM_OK)
            fprintf(stderr, "moe_bench: rank %d: %s: the pairs in one graph without events: %s\n", b->rank, d->name,
                    symm_last_error());
        *pair_ok = agree(b, st == SYMM_OK, "", NULL);
        if (*pair_ok)
            *pair = time_one(b, &bare, r->calls);
        work_release(b, &bare);
        *ok = stats_clean(b, v, "pairs", note);
    }
    work_release(b, &pw.whole);
    work_release(b, &pw.dispatch);
    work_release(b, &pw.combine);
    free(us);
}

/* Create v on this world with one backend; all ranks agree it worked. */
static symm_variant *create_variant(bench *b, const symm_variant_desc *d, symm_backend backend, double *ms,
                                    char *note)
{
    symm_variant_options vo = {.backend = backend};
    char tune[512];
    if (b->o->profile && backend == SYMM_BACKEND_NATIVE) {
        const char *env = getenv("SYMM_TUNE");
        snprintf(tune, sizeof tune, "%s%sPROFILE=%d", env && *env ? env : "", env && *env ? "," : "", b->o->profile);
        vo.tune = tune;
    }
    symm_variant *v = NULL;
    char why[NOTE_LEN] = "";
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    symm_status st = symm_variant_create(b->world, d, &vo, &v);
    *ms = seconds_since(&t0) * 1e3;
    if (st != SYMM_OK)
        snprintf(why, sizeof why, "create: %s: %s", symm_status_name(st), symm_last_error());
    bool ok = agree(b, st == SYMM_OK, why, note);
    if (!ok && v)
        die(b, "symm_variant_create", symm_fail(SYMM_ERR_PEER, "%s: created here but not on every rank (%s)",
                                                  d->name, note));
    return ok ? v : NULL;
}

/* The guard on a fresh variant; false (agreed) with note when it is wrong. */
static bool guard_agreed(bench *b, symm_variant *v, const guard *g, const dev_bufs *db, char *note)
{
    bool ok = true;
    char why[NOTE_LEN] = "";
    CHECK(b, "guard", guard_run(b, v, g, db, &ok, why));
    if (!ok)
        fprintf(stderr, "moe_bench: rank %d: %s (%s backend) at T=%d is WRONG: %s\n", b->rank,
                symm_variant_describe(v)->name,
                symm_variant_backend(v) == SYMM_BACKEND_NCCL ? "NCCL" : "native", g->tokens, why);
    return agree(b, ok, why, note);
}

/* The buffers of a variant's calls: with combine = "pull" or "auto", y in
 * the variant's symmetric buffer (where the peers read it; "auto" then
 * pulls), else db's. */
static dev_bufs with_variant_y(bench *b, symm_variant *v, const dev_bufs *db)
{
    dev_bufs yb = *db;
    const symm_variant_desc *d = v ? symm_variant_describe(v) : NULL;
    if (d && d->combine != SYMM_COMBINE_PUSH) {
        symm_recv_buffers rb;
        CHECK(b, "symm_variant_recv", symm_variant_recv(v, &rb));
        yb.y = rb.y;
        /* As bufs_alloc fills db's: rows the guard does not fill hold finite values. */
        CHECK(b, "cuMemsetD8(y)", symm_cuda_check(b->cu->cuMemsetD8(yb.y, 0x3c, (size_t)d->capacity * crow_bytes(d)),
                                                  "cuMemsetD8(y)"));
    }
    return yb;
}

static void stage_native(bench *b, const variant_plan *vp, const guard *g, const dev_bufs *db)
{
    const symm_variant_desc *d = vp->desc;
    char note[NOTE_LEN] = "";
    double ms;
    symm_variant *v = create_variant(b, d, SYMM_BACKEND_NATIVE, &ms, note);
    const dev_bufs *own_y = db; /* combine = "auto", rows y_outside: the pushing form */
    dev_bufs yb = with_variant_y(b, v, db);
    db = &yb;
    bool ok = v && guard_agreed(b, v, g, db, note);
    say(b, "  %-28s native: %s in %.0f ms; guard at T=%d: %s\n", d->name, v ? "created" : "NOT created", ms,
        g->tokens, ok ? "ok" : "FAIL");
    for (int i = 0; i < vp->n_rows; i++) {
        row_result *r = &b->rows[vp->rows[i]];
        r->create_ms = ms;
        r->ours_ok = ok;
        if (!ok) {
            snprintf(r->note, NOTE_LEN, "%s", note);
            continue;
        }
        time_calls(b, v, true, r->spec->y_outside ? own_y : db, r, &r->dispatch, &r->combine, &r->ours_mode,
                   &r->ours_ok, r->note, &r->pair, &r->pair_ok);
        if (r->ours_ok)
            say(b, "    row %-10s T=%-5d dispatch %8.1f us  combine %8.1f us  pair %8.1f us  (p50, %d pairs per "
                "repetition, %s)\n", r->spec->id, r->spec->tokens, r->dispatch.p50, r->combine.p50,
                r->pair_ok ? r->pair.p50 : NAN, r->calls, r->ours_mode);
        else
            say(b, "    row %-10s FAIL: %s\n", r->spec->id, r->note);
    }
    if (v)
        CHECK(b, "symm_variant_destroy", symm_variant_destroy(v));
}

/* An earlier row with the same traffic whose baseline `which` is measured. */
static const row_result *twin(const bench *b, const row_result *r, int which)
{
    for (int i = 0; i < N_ROWS; i++) {
        const row_result *o = &b->rows[i];
        if (o == r || !o->desc || !same_traffic(o, r))
            continue;
        if ((which == 0 && o->have_nccl) || (which == 1 && o->have_base))
            return o;
    }
    return NULL;
}

/* Whether some row of vp needs a measurement of baseline `which`: one with no
 * twin measured before, nor earlier in vp (that one is measured first). */
static bool needs_baseline(const bench *b, const variant_plan *vp, int which)
{
    for (int i = 0; i < vp->n_rows; i++) {
        const row_result *r = &b->rows[vp->rows[i]];
        bool earlier = false;
        for (int j = 0; j < i && !earlier; j++)
            earlier = same_traffic(&b->rows[vp->rows[j]], r);
        if (!earlier && !twin(b, r, which))
            return true;
    }
    return false;
}

static void copy_nccl(row_result *r, const row_result *from)
{
    r->have_nccl = true;
    r->nccl_ok = from->nccl_ok;
    r->nccl_dispatch = from->nccl_dispatch;
    r->nccl_combine = from->nccl_combine;
    snprintf(r->nccl_note, NOTE_LEN, "%s", from->nccl_note);
}

static void stage_nccl_backend(bench *b, const variant_plan *vp, const guard *g, const dev_bufs *db)
{
    const symm_variant_desc *d = vp->desc;
    if (b->o->no_nccl)
        return;
    symm_variant *v = NULL;
    char note[NOTE_LEN] = "";
    bool ok = true;
    dev_bufs yb;
    if (needs_baseline(b, vp, 0)) {
        double ms;
        v = create_variant(b, d, SYMM_BACKEND_NCCL, &ms, note);
        yb = with_variant_y(b, v, db);
        db = &yb;
        ok = v && guard_agreed(b, v, g, db, note);
        say(b, "  %-28s NCCL backend: %s in %.0f ms; guard at T=%d: %s\n", d->name, v ? "created" : "NOT created",
            ms, g->tokens, ok ? "ok" : "FAIL");
    }
    for (int i = 0; i < vp->n_rows; i++) {
        row_result *r = &b->rows[vp->rows[i]];
        const row_result *from = twin(b, r, 0);
        if (from) {
            copy_nccl(r, from);
            continue;
        }
        r->have_nccl = true;
        r->nccl_ok = ok;
        if (!ok) {
            snprintf(r->nccl_note, NOTE_LEN, "%s", note);
            continue;
        }
        const char *mode;
        time_calls(b, v, false, db, r, &r->nccl_dispatch, &r->nccl_combine, &mode, &r->nccl_ok, r->nccl_note,
                   NULL, NULL);
        if (r->nccl_ok)
            say(b, "    row %-10s T=%-5d NCCL backend: dispatch %8.1f us  combine %8.1f us\n", r->spec->id,
                r->spec->tokens, r->nccl_dispatch.p50, r->nccl_combine.p50);
    }
    if (v)
        CHECK(b, "symm_variant_destroy (NCCL backend)", symm_variant_destroy(v));
}

/* ---- raw NCCL and the copy-engine ceiling ------------------------------- */

typedef struct move_ctx {
    CUdeviceptr send, recv;   /* local, W slots */
    symm_alloc *peer_dst;     /* the ceiling's destination: slot `rank` of every peer */
    size_t slot;
    int64_t *to, *from;       /* [W] payload bytes to and from each rank */
    int calls;
} move_ctx;

static symm_status issue_nccl(bench *b, void *ctx, CUstream s)
{
    move_ctx *m = ctx;
    const symm_nccl_api *nc = b->nc;
    ncclComm_t comm = (ncclComm_t)symm_nccl_comm(b->nccl);
    for (int c = 0; c < m->calls; c++) {
        SYMM_NCCL(nc, comm, ncclGroupStart());
        for (int p = 0; p < b->size; p++) {
            if (p == b->rank)
                continue;
            if (m->to[p])
                SYMM_NCCL(nc, comm, ncclSend((const void *)(uintptr_t)(m->send + p * m->slot), (size_t)m->to[p],
                                             ncclUint8, p, comm, s));
            if (m->from[p])
                SYMM_NCCL(nc, comm, ncclRecv((void *)(uintptr_t)(m->recv + p * m->slot), (size_t)m->from[p],
                                             ncclUint8, p, comm, s));
        }
        SYMM_NCCL(nc, comm, ncclGroupEnd());
    }
    return SYMM_OK;
}

/* One copy stream per peer, forked from and joined to s. */
static symm_status issue_copies(bench *b, void *ctx, CUstream s)
{
    move_ctx *m = ctx;
    const symm_cuda_api *cu = b->cu;
    SYMM_CU(cu, cuEventRecord(b->fork, s));
    for (int p = 0; p < b->size; p++) {
        if (p == b->rank || !m->to[p])
            continue;
        CUstream ps = b->peer_streams[p];
        const CUdeviceptr dst = symm_alloc_peer(m->peer_dst, p) + (size_t)b->rank * m->slot;
        SYMM_CU(cu, cuStreamWaitEvent(ps, b->fork, 0));
        for (int c = 0; c < m->calls; c++)
            SYMM_CU(cu, cuMemcpyDtoDAsync(dst, m->send, (size_t)m->to[p], ps));
        SYMM_CU(cu, cuEventRecord(b->join[p], ps));
        SYMM_CU(cu, cuStreamWaitEvent(s, b->join[p], 0));
    }
    return SYMM_OK;
}

static stat2 time_one(bench *b, work *w, int calls)
{
    const int reps = b->o->reps;
    double *ms = malloc(sizeof *ms * (size_t)reps);
    if (!ms)
        die(b, "time_one", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
    CHECK(b, "timing a baseline", time_work(b, w, ms));
    for (int i = 0; i < reps; i++)
        ms[i] *= 1e3 / calls;
    stat2 s = slowest_rank(b, ms);
    free(ms);
    return s;
}

/* Raw NCCL of one row: a plain call first (NCCL connects peers lazily),
 * then a graph unless --nccl-plain or capture fails on some rank. */
static void time_raw_nccl(bench *b, move_ctx *m, row_result *r)
{
    work w = {issue_nccl, m, NULL};
    CHECK(b, "raw NCCL send/recv", issue_nccl(b, m, b->stream));
    CHECK(b, "raw NCCL send/recv", stream_sync(b, "the first raw NCCL call"));
    bool graph = !b->o->nccl_plain;
    if (graph) {
        symm_status st = work_capture(b, &w);
        if (st != SYMM_OK)
            fprintf(stderr, "moe_bench: rank %d: raw NCCL: graph capture failed (%s); timing plain calls\n",
                    b->rank, symm_last_error());
        graph = agree(b, st == SYMM_OK, "capture failed", NULL);
        if (!graph)
            work_release(b, &w);
    }
    r->raw = time_one(b, &w, m->calls);
    r->raw_graph = graph;
    r->raw_ok = true;
    work_release(b, &w);
    CHECK(b, "raw NCCL", symm_nccl_check_async(b->nccl));
}

/* Largest bytes one rank sends one peer, over the rows of vp that measure
 * their own baselines. */
static size_t baseline_slot(const bench *b, const variant_plan *vp, bool *any)
{
    size_t slot = 0;
    *any = false;
    for (int i = 0; i < vp->n_rows; i++) {
        const row_result *r = &b->rows[vp->rows[i]];
        if (twin(b, r, 1))
            continue;
        *any = true;
        routing_set route;
        CHECK(b, "routing", routing_make(r->desc, b->seed, r->spec->route, r->spec->tokens, &route));
        for (int s = 0; s < route.world; s++)
            for (int p = 0; p < route.world; p++) {
                const size_t bytes = (size_t)route.rows[s * route.world + p] * row_bytes(r->desc);
                if (p != s && bytes > slot)
                    slot = bytes;
            }
        routing_free(&route);
    }
    return (slot + 4095) / 4096 * 4096 + 4096;
}

static void measure_baselines(bench *b, move_ctx *m, row_result *r)
{
    routing_set route;
    CHECK(b, "routing", routing_make(r->desc, b->seed, r->spec->route, r->spec->tokens, &route));
    const size_t rb = row_bytes(r->desc);
    for (int p = 0; p < b->size; p++) {
        m->to[p] = p == b->rank ? 0 : route.rows[b->rank * b->size + p] * (int64_t)rb;
        m->from[p] = p == b->rank ? 0 : route.rows[p * b->size + b->rank] * (int64_t)rb;
    }
    routing_free(&route);
    m->calls = r->calls;
    if (b->nccl)
        time_raw_nccl(b, m, r);
    work w = {issue_copies, m, NULL};
    r->ceiling = time_one(b, &w, m->calls);
    r->ceiling_ok = true;
    r->have_base = true;
    say(b, "    row %-10s T=%-5d raw NCCL %8.1f us (%s)  ceiling %8.1f us\n", r->spec->id, r->spec->tokens,
        r->raw_ok ? r->raw.p50 : NAN, r->raw_ok ? (r->raw_graph ? "graph" : "plain") : "skipped", r->ceiling.p50);
}

static void stage_baselines(bench *b, const variant_plan *vp)
{
    const symm_cuda_api *cu = b->cu;
    bool any;
    const size_t slot = baseline_slot(b, vp, &any);
    move_ctx m = {.slot = slot};
    if (any) {
        const size_t bytes = slot * (size_t)b->size;
        m.to = calloc((size_t)b->size, sizeof *m.to);
        m.from = calloc((size_t)b->size, sizeof *m.from);
        if (!m.to || !m.from)
            die(b, "baselines", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
        CHECK(b, "baseline buffers", symm_cuda_check(cu->cuMemAlloc(&m.send, bytes), "cuMemAlloc(send)"));
        CHECK(b, "baseline buffers", symm_cuda_check(cu->cuMemAlloc(&m.recv, bytes), "cuMemAlloc(recv)"));
        CHECK(b, "baseline buffers", symm_cuda_check(cu->cuMemsetD8(m.send, 0x3c, bytes), "cuMemsetD8(send)"));
        CHECK(b, "ceiling buffer (symm_alloc_create)", symm_alloc_create(b->world, b->dev, bytes, 0, &m.peer_dst));
    }
    for (int i = 0; i < vp->n_rows; i++) {
        row_result *r = &b->rows[vp->rows[i]];
        const row_result *from = twin(b, r, 1);
        if (!from) {
            measure_baselines(b, &m, r);
            continue;
        }
        r->have_base = true;
        r->raw_ok = from->raw_ok;
        r->raw_graph = from->raw_graph;
        r->raw = from->raw;
        r->ceiling_ok = from->ceiling_ok;
        r->ceiling = from->ceiling;
    }
    if (any) {
        CHECK(b, "symm_alloc_destroy (ceiling)", symm_alloc_destroy(m.peer_dst));
        cu->cuMemFree(m.send);
        cu->cuMemFree(m.recv);
    }
    free(m.to);
    free(m.from);
}

/* ---- output ------------------------------------------------------------- */

static double gbs(double bytes, double us) { return bytes / us / 1e3; }

/* Column widths of the text tables follow the cells; Markdown just pipes. */
#define MAX_COLS 16
#define CELL 48
typedef struct table {
    int ncols, nrows;
    const char *head[MAX_COLS];
    char (*cell)[MAX_COLS][CELL];
} table;

static void cell(table *t, int row, int col, const char *fmt, ...) SYMM_PRINTF(4, 5);
static void cell(table *t, int row, int col, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->cell[row][col], CELL, fmt, ap);
    va_end(ap);
    for (char *c = t->cell[row][col]; *c; c++) /* a note must not split a Markdown row */
        if (*c == '|')
            *c = '/';
}

static void print_table(FILE *f, const table *t, bool markdown)
{
    int width[MAX_COLS];
    for (int c = 0; c < t->ncols; c++) {
        width[c] = (int)strlen(t->head[c]);
        for (int r = 0; r < t->nrows; r++)
            if ((int)strlen(t->cell[r][c]) > width[c])
                width[c] = (int)strlen(t->cell[r][c]);
    }
    for (int r = -1; r < t->nrows; r++) {
        fprintf(f, "%s", markdown ? "| " : "");
        for (int c = 0; c < t->ncols; c++) {
            const char *text = r < 0 ? t->head[c] : t->cell[r][c];
            if (c + 1 < t->ncols)
                fprintf(f, "%-*s%s", width[c], text, markdown ? " | " : "  ");
            else
                fprintf(f, "%s%s\n", text, markdown ? " |" : "");
        }
        for (int c = 0; markdown && r < 0 && c < t->ncols; c++)
            fprintf(f, "%s", c + 1 < t->ncols ? "|---" : "|---|\n");
    }
}

/* v with `digits` decimals, or "-" when it was not measured. */
static const char *num(char *buf, bool ok, double v, int digits)
{
    if (!ok)
        return "-";
    snprintf(buf, CELL, "%.*f", digits, v);
    return buf;
}

/* "a/b" with `digits` decimals, or "-". */
static const char *pair(char *buf, bool ok, double a, double b, int digits)
{
    if (!ok)
        return "-";
    snprintf(buf, CELL, "%.*f/%.*f", digits, a, digits, b);
    return buf;
}

/* Table 1: ours, with the ratios to the baselines. */
static void fill_main_table(const bench *b, table *t)
{
    static const char *const head[] = {"row", "variant", "T", "sms", "dispatch us p50/p90", "combine us p50/p90",
                                       "remote MB", "dispatch GB/s", "combine GB/s", "% ceiling d/c",
                                       "x NCCL backend d/c", "x raw NCCL d/c", "sym MiB", "note"};
    t->ncols = (int)(sizeof head / sizeof head[0]);
    memcpy(t->head, head, sizeof head);
    t->nrows = 0;
    for (int i = 0; i < N_ROWS; i++) {
        const row_result *r = &b->rows[i];
        if (!r->done)
            continue;
        const int n = t->nrows++;
        char buf[CELL];
        cell(t, n, 0, "%s", r->spec->id);
        cell(t, n, 1, "%s", r->desc->name);
        cell(t, n, 2, "%d", r->spec->tokens);
        cell(t, n, 3, "%d", r->desc->sms);
        cell(t, n, 6, "%.2f", r->remote_mean / 1e6);
        cell(t, n, 12, "%.0f", r->sym_mib);
        cell(t, n, 13, "%s", r->ours_ok ? (r->nccl_ok || !r->have_nccl ? "" : r->nccl_note) : r->note);
        if (!r->ours_ok) {
            for (int c = 4; c <= 11; c++)
                if (c != 6)
                    cell(t, n, c, "FAIL");
            continue;
        }
        const stat2 d = r->dispatch, c = r->combine;
        /* A row where nothing crosses (h) has no rate, and copies of nothing
         * are no baseline: those cells stay "-". */
        const bool moves = r->remote_mean > 0;
        cell(t, n, 4, "%s", pair(buf, true, d.p50, d.p90, 1));
        cell(t, n, 5, "%s", pair(buf, true, c.p50, c.p90, 1));
        cell(t, n, 7, "%s", num(buf, moves, gbs(r->remote_mean, d.p50), 0));
        cell(t, n, 8, "%s", num(buf, moves, gbs(r->remote_mean, c.p50), 0));
        cell(t, n, 9, "%s", pair(buf, moves && r->ceiling_ok, 100 * r->ceiling.p50 / d.p50,
                                 100 * r->ceiling.p50 / c.p50, 0));
        cell(t, n, 10, "%s", pair(buf, r->nccl_ok, r->nccl_dispatch.p50 / d.p50, r->nccl_combine.p50 / c.p50, 2));
        cell(t, n, 11, "%s", pair(buf, moves && r->raw_ok, r->raw.p50 / d.p50, r->raw.p50 / c.p50, 2));
    }
}

/* Table 2: the baselines themselves. */
static void fill_baseline_table(const bench *b, table *t)
{
    static const char *const head[] = {"row", "T", "calls", "ours timed as", "ours pair us", "NCCL backend dispatch us",
                                       "NCCL backend combine us",
                                       "NCCL backend GB/s d/c", "raw NCCL us", "raw NCCL GB/s", "raw NCCL timed as",
                                       "ceiling us", "ceiling GB/s", "create ms"};
    t->ncols = (int)(sizeof head / sizeof head[0]);
    memcpy(t->head, head, sizeof head);
    t->nrows = 0;
    for (int i = 0; i < N_ROWS; i++) {
        const row_result *r = &b->rows[i];
        if (!r->done)
            continue;
        const int n = t->nrows++;
        char buf[CELL];
        const bool nccl = r->nccl_ok, moves = r->remote_mean > 0;
        cell(t, n, 0, "%s", r->spec->id);
        cell(t, n, 1, "%d", r->spec->tokens);
        cell(t, n, 2, "%d", r->calls);
        cell(t, n, 3, "%s", r->ours_ok && r->ours_mode ? r->ours_mode : "-");
        cell(t, n, 4, "%s", pair(buf, r->ours_ok && r->pair_ok, r->pair.p50, r->pair.p90, 1));
        const char *nccl_failed = r->have_nccl && !nccl ? "FAIL" : NULL;
        cell(t, n, 5, "%s", nccl_failed ? nccl_failed : pair(buf, nccl, r->nccl_dispatch.p50, r->nccl_dispatch.p90, 1));
        cell(t, n, 6, "%s", nccl_failed ? nccl_failed : pair(buf, nccl, r->nccl_combine.p50, r->nccl_combine.p90, 1));
        cell(t, n, 7, "%s", pair(buf, nccl && moves, gbs(r->remote_mean, r->nccl_dispatch.p50),
                                 gbs(r->remote_mean, r->nccl_combine.p50), 0));
        cell(t, n, 8, "%s", pair(buf, r->raw_ok, r->raw.p50, r->raw.p90, 1));
        cell(t, n, 9, "%s", num(buf, r->raw_ok && moves, gbs(r->remote_mean, r->raw.p50), 0));
        cell(t, n, 10, "%s", r->raw_ok ? (r->raw_graph ? "graph" : "plain calls") : "-");
        cell(t, n, 11, "%s", pair(buf, r->ceiling_ok, r->ceiling.p50, r->ceiling.p90, 1));
        cell(t, n, 12, "%s", num(buf, r->ceiling_ok && moves, gbs(r->remote_mean, r->ceiling.p50), 0));
        cell(t, n, 13, "%.0f", r->create_ms);
    }
}

static void print_notes(FILE *f, const bench *b, bool markdown)
{
    const char *li = markdown ? "- " : "  ";
    fprintf(f, "%sTimes are per call: p50/p90 over %d repetitions after %d warm-up ones%s; each repetition starts\n"
               "%s  after a host barrier and a device barrier, and its time is the slowest rank's (CUDA events).\n",
            li, b->o->reps, b->o->warmup, b->o->reps < MIN_REPS ? " (FEWER THAN 50: not for reporting)" : "", li);
    fprintf(f, "%sA repetition is `calls` dispatch+combine pairs (%d when T <= %d, else 1), with an event before\n"
               "%s  and after every call; times are per call: the sum of the dispatch (combine) intervals / calls.\n"
               "%s  Dispatch covers routing, count exchange and rows (nothing cached). Each dispatch is followed by\n"
               "%s  its combine: combine's flags count arrivals per dispatch, so neither may be repeated alone.\n",
            li, SMALL_T_CALLS, SMALL_T, li, li, li);
    fprintf(f, "%sours: CUDA-graph replays; `one graph`: all pairs in one graph, the events as event-record nodes\n"
               "%s  (CU_EVENT_RECORD_EXTERNAL) %s; `graph per call`: one graph per dispatch and per combine\n"
               "%s  (the fallback where such a capture fails), the events between the graph launches.\n",
            li, li,
            b->o->inline_events ? "between the kernels (--inline-events)"
                                : "on a side branch (each after the kernel before it; no kernel waits for one)",
            li);
    fprintf(f, "%sours pair: one dispatch and its combine, the row's `calls` pairs back to back in one graph\n"
               "%s  with no event node between them (as an application's graph holds them), timed by events\n"
               "%s  around the graph launch: p50/p90 of the slowest rank's time / calls.\n", li, li, li);
    fprintf(f, "%sNCCL backend: plain calls, not graphs (it needs host counts and refuses capture); its host\n"
               "%s  waits count.\n", li, li);
    fprintf(f, "%sraw NCCL: ncclSend/ncclRecv of exactly the payload bytes dispatch moves to each peer, `calls`\n"
               "%s  groups per repetition.\n", li, li);
    fprintf(f, "%sceiling: cuMemcpyDtoDAsync of the same bytes into each peer's VMM-mapped buffer, every GPU at\n"
               "%s  once.\n", li, li);
    fprintf(f, "%sremote MB: payload bytes a GPU sends to other GPUs per dispatch (rows x hidden x dtype size; no\n"
               "%s  metadata, scales or weights), mean over ranks; combine moves the same rows back. GB/s = remote\n"
               "%s  bytes / p50. %% ceiling = ceiling p50 / ours p50; x NCCL backend and x raw NCCL = their p50\n"
               "%s  / ours p50 (above 1: ours is faster). d/c = dispatch/combine. sms: the variant's blocks per\n"
               "%s  kernel. sym MiB: symmetric memory per rank, rounded to the VMM granularity.\n",
            li, li, li, li, li);
    fprintf(f, "%slayout expert (rows g): remote MB counts a row per (token, expert); dispatch sends a token's row\n"
               "%s  to a peer once however many of its experts live there (tuning knob DEDUP, on by default) and\n"
               "%s  the peer copies it locally, and combine (combine_order rank, the default; g.k: \"k\") sends\n"
               "%s  one partial sum per (token, peer) back, so its GB/s is that payload over the time, not\n"
               "%s  NVLink's bytes.\n",
            li, li, li, li, li);
    fprintf(f, "%sroutings: uniform = top-k distinct experts uniformly; zipf = Zipf(s = %.1f) over expert ids,\n"
               "%s  expert 0 hottest, so the low ranks' experts take most rows; local = top-k distinct experts\n"
               "%s  uniformly among the token's own rank's (no row crosses: the fixed costs). Seed 0x%" PRIx64 ".\n",
            li, MOE_ZIPF_S, li, li, b->seed);
    const char *tune = getenv("SYMM_TUNE");
    fprintf(f, "%skernel tuning (SYMM_TUNE): %s.\n", li, tune && *tune ? tune : "the defaults");
}

static void print_results(FILE *f, const bench *b, bool markdown)
{
    table t = {0};
    t.cell = calloc(N_ROWS, sizeof *t.cell);
    if (!t.cell)
        return;
    fill_main_table(b, &t);
    print_table(f, &t, markdown);
    fprintf(f, "\n");
    fill_baseline_table(b, &t);
    print_table(f, &t, markdown);
    fprintf(f, "\n");
    print_notes(f, b, markdown);
    free(t.cell);
}

static const char *const csv_head =
    "row,group,variant,layout,routing,tokens,calls,sms,hidden,topk,experts,world,status,ours_mode,remote_mb,"
    "remote_mb_max,dispatch_p50_us,dispatch_p90_us,combine_p50_us,combine_p90_us,dispatch_gbs,combine_gbs,"
    "nccl_status,nccl_dispatch_p50_us,nccl_dispatch_p90_us,nccl_combine_p50_us,nccl_combine_p90_us,"
    "nccl_dispatch_gbs,nccl_combine_gbs,raw_nccl_mode,raw_nccl_p50_us,raw_nccl_p90_us,raw_nccl_gbs,"
    "ceiling_p50_us,ceiling_p90_us,ceiling_gbs,pct_ceiling_dispatch,pct_ceiling_combine,"
    "x_nccl_backend_dispatch,x_nccl_backend_combine,x_raw_nccl_dispatch,x_raw_nccl_combine,sym_mib,create_ms,"
    "pair_p50_us,pair_p90_us,note\n";

/* One number, or an empty field when it was not measured. */
static void csv_num(FILE *f, bool ok, double v) { ok ? fprintf(f, ",%.2f", v) : fprintf(f, ","); }

static void csv_row(FILE *f, const row_result *r)
{
    const symm_variant_desc *d = r->desc;
    const double m = r->remote_mean;
    const stat2 dp = r->dispatch, cb = r->combine;
    const bool ours = r->ours_ok, nc = r->nccl_ok, raw = r->raw_ok, ceil = r->ceiling_ok, moves = m > 0;
    fprintf(f, "%s,%c,%s,%s,%s,%d,%d,%d,%d,%d,%d,%d,%s,%s,%.3f,%.3f", r->spec->id, r->spec->id[0], d->name,
            d->layout == SYMM_LAYOUT_EXPERT ? "expert" : "rank", routing_names[r->spec->route], r->spec->tokens,
            r->calls, d->sms, d->hidden, d->topk, d->experts, d->world, ours ? "ok" : "FAIL",
            ours && r->ours_mode ? r->ours_mode : "", m / 1e6, r->remote_max / 1e6);
    csv_num(f, ours, dp.p50), csv_num(f, ours, dp.p90), csv_num(f, ours, cb.p50), csv_num(f, ours, cb.p90);
    csv_num(f, ours && moves, gbs(m, dp.p50)), csv_num(f, ours && moves, gbs(m, cb.p50));
    fprintf(f, ",%s", !r->have_nccl ? "" : nc ? "ok" : "FAIL");
    csv_num(f, nc, r->nccl_dispatch.p50), csv_num(f, nc, r->nccl_dispatch.p90);
    csv_num(f, nc, r->nccl_combine.p50), csv_num(f, nc, r->nccl_combine.p90);
    csv_num(f, nc && moves, gbs(m, r->nccl_dispatch.p50)), csv_num(f, nc && moves, gbs(m, r->nccl_combine.p50));
    fprintf(f, ",%s", raw ? (r->raw_graph ? "graph" : "plain") : "");
    csv_num(f, raw, r->raw.p50), csv_num(f, raw, r->raw.p90), csv_num(f, raw && moves, gbs(m, r->raw.p50));
    csv_num(f, ceil, r->ceiling.p50), csv_num(f, ceil, r->ceiling.p90), csv_num(f, ceil && moves, gbs(m, r->ceiling.p50));
    csv_num(f, ours && ceil && moves, 100 * r->ceiling.p50 / dp.p50),
        csv_num(f, ours && ceil && moves, 100 * r->ceiling.p50 / cb.p50);
    csv_num(f, ours && nc, r->nccl_dispatch.p50 / dp.p50), csv_num(f, ours && nc, r->nccl_combine.p50 / cb.p50);
    csv_num(f, ours && raw && moves, r->raw.p50 / dp.p50), csv_num(f, ours && raw && moves, r->raw.p50 / cb.p50);
    csv_num(f, true, r->sym_mib), csv_num(f, true, r->create_ms);
    csv_num(f, ours && r->pair_ok, r->pair.p50), csv_num(f, ours && r->pair_ok, r->pair.p90);
    /* The note is free text: keep it one CSV field. */
    fprintf(f, ",\"");
    for (const char *p = ours ? (nc || !r->have_nccl ? "" : r->nccl_note) : r->note; *p; p++)
        fputc(*p == '"' ? '\'' : *p == '\n' ? ' ' : *p, f);
    fprintf(f, "\"\n");
    fflush(f);
}

/* ---- planning ----------------------------------------------------------- */

/* Resolve every selected row's variant in the manifest (before any GPU
 * work) and group the rows by variant, in order of first use. */
static int make_plans(bench *b, symm_manifest *m, variant_plan *plans)
{
    int n = 0, world = 0;
    for (int i = 0; i < N_ROWS; i++) {
        const row_spec *s = &matrix[i];
        if (!row_selected(b->o, s))
            continue;
        const symm_variant_desc *d;
        symm_status st = symm_manifest_variant(m, s->variant, &d);
        if (st != SYMM_OK) {
            fprintf(stderr, "moe_bench: row %s needs variant %s: %s: %s\n"
                            "moe_bench: regenerate the bench variants: "
                            "build/bin/symmgen -o out/bench specs/bench.lua\n",
                    s->id, s->variant, symm_status_name(st), symm_last_error());
            return -1;
        }
        if (!world)
            world = d->world;
        if (s->tokens > d->max_tokens || d->world != world) {
            fprintf(stderr, "moe_bench: row %s: variant %s has max_tokens %d and world %d; the row needs T = %d "
                            "and every variant the same world: specs/bench.lua and bench/moe_bench.c disagree\n",
                    s->id, d->name, d->max_tokens, d->world, s->tokens);
            return -1;
        }
        int p = 0;
        while (p < n && plans[p].desc != d)
            p++;
        if (p == n)
            plans[n++] = (variant_plan){.desc = d};
        plans[p].rows[plans[p].n_rows++] = i;
        b->rows[i] = (row_result){.spec = s, .desc = d, .calls = calls_for(s->tokens)};
    }
    if (n == 0)
        fprintf(stderr, "moe_bench: --groups %s and --rows %s select no row together\n",
                b->o->groups ? b->o->groups : "(all)", b->o->rows ? b->o->rows : "(all)");
    return n ? n : -1;
}

/* Remote bytes of every selected row (the routing needs the seed) and the
 * symmetric memory of its variant. */
static void size_rows(bench *b, size_t granularity)
{
    for (int i = 0; i < N_ROWS; i++) {
        row_result *r = &b->rows[i];
        if (!r->desc)
            continue;
        routing_set route;
        CHECK(b, "routing", routing_make(r->desc, b->seed, r->spec->route, r->spec->tokens, &route));
        r->remote_mean = r->remote_max = 0;
        for (int s = 0; s < route.world; s++) {
            const double bytes = remote_bytes(r->desc, &route, s);
            r->remote_mean += bytes / route.world;
            r->remote_max = fmax(r->remote_max, bytes);
        }
        routing_free(&route);
        size_t sym = 0;
        symm_heap_round_up(r->desc->symmetric_bytes, granularity, &sym);
        r->sym_mib = (double)sym / (1 << 20);
    }
}

static void print_plan(const bench *b, const variant_plan *plans, int n)
{
    printf("moe_bench plan: %d variants, seed 0x%" PRIx64 " (remote MB: payload a GPU sends to the others per "
           "dispatch, mean and max over ranks)\n", n, b->seed);
    for (int v = 0; v < n; v++) {
        const symm_variant_desc *d = plans[v].desc;
        printf("%s: layout %s, hidden %d, topk %d, experts %d, world %d, max_tokens %d, sms %d, capacity %" PRId64
               " rows, symmetric %.0f MiB per rank (2 MiB granularity), y %.0f MiB\n",
               d->name, d->layout == SYMM_LAYOUT_EXPERT ? "expert" : "rank", d->hidden, d->topk, d->experts,
               d->world, d->max_tokens, d->sms, d->capacity, b->rows[plans[v].rows[0]].sym_mib,
               (double)d->capacity * crow_bytes(d) / (1 << 20));
        for (int i = 0; i < plans[v].n_rows; i++) {
            const row_result *r = &b->rows[plans[v].rows[i]];
            printf("  row %-10s T=%-5d %-7s pairs/repetition %-2d remote MB %8.2f (max %8.2f)\n", r->spec->id,
                   r->spec->tokens, routing_names[r->spec->route], r->calls, r->remote_mean / 1e6,
                   r->remote_max / 1e6);
        }
    }
}

/* ---- one variant, all its rows ------------------------------------------ */

/* The CPU references built so far that a later variant still needs. */
typedef struct guard_cache {
    guard *g[N_ROWS];
} guard_cache;

static guard *guard_for(bench *b, guard_cache *gc, const symm_variant_desc *d)
{
    const symm_ref_config cfg = moe_ref_config(d);
    for (int i = 0; i < N_ROWS; i++)
        if (gc->g[i] && same_config(&gc->g[i]->cfg, &cfg))
            return gc->g[i];
    guard *g = calloc(1, sizeof *g);
    if (!g)
        die(b, "guard", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(b, "the CPU reference", guard_build(b, d, g));
    say(b, "  %-28s CPU reference at T=%d: %.1f s\n", d->name, g->tokens, seconds_since(&t0));
    for (int i = 0; i < N_ROWS; i++)
        if (!gc->g[i]) {
            gc->g[i] = g;
            break;
        }
    return g;
}

/* Free the references no variant after plans[v] uses. */
static void guard_trim(guard_cache *gc, const variant_plan *plans, int n, int v)
{
    for (int i = 0; i < N_ROWS; i++) {
        if (!gc->g[i])
            continue;
        bool later = false;
        for (int j = v + 1; j < n && !later; j++) {
            const symm_ref_config cfg = moe_ref_config(plans[j].desc);
            later = same_config(&gc->g[i]->cfg, &cfg);
        }
        if (!later) {
            guard_free(gc->g[i]);
            free(gc->g[i]);
            gc->g[i] = NULL;
        }
    }
}

static void bench_variant(bench *b, guard_cache *gc, const variant_plan *plans, int n, int v)
{
    const variant_plan *vp = &plans[v];
    const symm_variant_desc *d = vp->desc;
    say(b, "%s (layout %s, hidden %d, topk %d, experts %d, max_tokens %d, sms %d)\n", d->name,
        d->layout == SYMM_LAYOUT_EXPERT ? "expert" : "rank", d->hidden, d->topk, d->experts, d->max_tokens, d->sms);
    const guard *g = guard_for(b, gc, d);
    dev_bufs db;
    CHECK(b, d->name, bufs_alloc(b, d, &db));
    stage_native(b, vp, g, &db);
    stage_nccl_backend(b, vp, g, &db);
    bufs_free(b, &db);
    guard_trim(gc, plans, n, v);
    stage_baselines(b, vp);
    for (int i = 0; i < vp->n_rows; i++) {
        row_result *r = &b->rows[vp->rows[i]];
        r->done = true;
        if (b->csv)
            csv_row(b->csv, r);
    }
}

/* ---- set-up ------------------------------------------------------------- */

static int join_world(bench *b, int world)
{
    symm_status st = symm_world_create_from_env(&b->world);
    if (st != SYMM_OK) {
        fprintf(stderr,
                "moe_bench: cannot join the ranks of a job: %s: %s\n"
                "moe_bench: start it with symmrun, one rank per GPU:\n"
                "  build/bin/symmrun -n %d build/bench/moe_bench --manifest %s\n"
                "(scripts/bench.sh, which `make bench` runs, does this; --plan runs without it)\n",
                symm_status_name(st), symm_last_error(), world, b->o->manifest);
        return 2;
    }
    b->rank = symm_world_rank(b->world);
    b->size = symm_world_size(b->world);
    if (b->size != world) {
        fprintf(stderr, "moe_bench: rank %d: the bench variants are for world %d, this job has %d ranks: "
                        "run symmrun -n %d\n", b->rank, world, b->size, world);
        return 2;
    }
    return 0;
}

static int open_gpu(bench *b)
{
    symm_status st = symm_cuda(&b->cu);
    if (st == SYMM_OK)
        st = symm_device_open(b->world, &b->dev);
    if (st != SYMM_OK) {
        fprintf(stderr, "moe_bench: rank %d: cannot use a GPU: %s: %s\n"
                        "moe_bench: the benchmark needs %d GPUs joined by NVLink, one per rank\n",
                b->rank, symm_status_name(st), symm_last_error(), b->size);
        return 2;
    }
    if (symm_device_gpu_count(b->dev) != b->size && !b->o->shared_gpu) {
        fprintf(stderr, "moe_bench: rank %d: %d ranks share %d GPUs; timings need one rank per GPU "
                        "(symmrun -n %d --gpus 0,1,...)\n", b->rank, b->size, symm_device_gpu_count(b->dev), b->size);
        return 2;
    }
    return 0;
}

static void make_streams(bench *b)
{
    const symm_cuda_api *cu = b->cu;
    b->peer_streams = calloc((size_t)b->size, sizeof *b->peer_streams);
    b->join = calloc((size_t)b->size, sizeof *b->join);
    if (!b->peer_streams || !b->join)
        die(b, "set-up", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
    CHECK(b, "set-up", symm_cuda_check(cu->cuStreamCreate(&b->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
    for (int i = 0; i < MAX_EVENTS; i++)
        CHECK(b, "set-up", symm_cuda_check(cu->cuEventCreate(&b->ev[i], CU_EVENT_DEFAULT), "cuEventCreate"));
    CHECK(b, "set-up", symm_cuda_check(cu->cuEventCreate(&b->fork, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    CHECK(b, "set-up", symm_cuda_check(cu->cuEventCreate(&b->done, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    CHECK(b, "set-up", symm_cuda_check(cu->cuStreamCreate(&b->side, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
    CHECK(b, "set-up", symm_cuda_check(cu->cuEventCreate(&b->side_fork, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    CHECK(b, "set-up", symm_cuda_check(cu->cuEventCreate(&b->side_join, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    for (int p = 0; p < b->size; p++) {
        CHECK(b, "set-up", symm_cuda_check(cu->cuStreamCreate(&b->peer_streams[p], CU_STREAM_NON_BLOCKING),
                                           "cuStreamCreate"));
        CHECK(b, "set-up", symm_cuda_check(cu->cuEventCreate(&b->join[p], CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    }
    CHECK(b, "device barrier flags (symm_alloc_create)",
          symm_alloc_create(b->world, b->dev, (size_t)b->size * FLAG_SLOT, 0, &b->flags));
}

static void free_streams(bench *b)
{
    const symm_cuda_api *cu = b->cu;
    CHECK(b, "symm_alloc_destroy (flags)", symm_alloc_destroy(b->flags));
    for (int p = 0; p < b->size; p++) {
        cu->cuStreamDestroy(b->peer_streams[p]);
        cu->cuEventDestroy(b->join[p]);
    }
    for (int i = 0; i < MAX_EVENTS; i++)
        cu->cuEventDestroy(b->ev[i]);
    cu->cuEventDestroy(b->fork);
    cu->cuEventDestroy(b->done);
    cu->cuEventDestroy(b->side_fork);
    cu->cuEventDestroy(b->side_join);
    cu->cuStreamDestroy(b->side);
    cu->cuStreamDestroy(b->stream);
    free(b->peer_streams);
    free(b->join);
}

/* Rank 0 opens the output files before the long run; every rank learns
 * whether that worked. */
static int open_outputs(bench *b, FILE **markdown)
{
    int ok = 1;
    *markdown = NULL;
    if (b->rank == 0 && b->o->csv && !(b->csv = fopen(b->o->csv, "w"))) {
        fprintf(stderr, "moe_bench: cannot write --csv %s: %s\n", b->o->csv, strerror(errno));
        ok = 0;
    }
    if (b->rank == 0 && ok && b->o->markdown && !(*markdown = fopen(b->o->markdown, "w"))) {
        fprintf(stderr, "moe_bench: cannot write --markdown %s: %s\n", b->o->markdown, strerror(errno));
        ok = 0;
    }
    CHECK(b, "symm_world_bcast", symm_world_bcast(b->world, &ok, sizeof ok, 0));
    if (ok && b->csv)
        fputs(csv_head, b->csv);
    return ok ? 0 : 2;
}

/* ---- main --------------------------------------------------------------- */

static int run(bench *b, const variant_plan *plans, int n)
{
    FILE *markdown;
    int rc = open_outputs(b, &markdown);
    if (rc)
        return rc;
    if (!b->o->no_nccl) {
        symm_status st = symm_nccl_create(b->world, b->dev, &b->nccl);
        if (st == SYMM_OK)
            st = symm_nccl_load(&b->nc);
        if (st != SYMM_OK) {
            fprintf(stderr, "moe_bench: rank %d: NCCL: %s: %s\nmoe_bench: --no-nccl runs without the NCCL "
                            "backend and raw NCCL columns\n", b->rank, symm_status_name(st), symm_last_error());
            return 2;
        }
    }
    make_streams(b);
    size_rows(b, symm_device_granularity(b->dev));
    const char *tune = getenv("SYMM_TUNE");
    say(b, "moe_bench: %d ranks, %d variants, %d reps after %d warm-up, seed 0x%" PRIx64 "%s, tuning %s%s\n",
        b->size, n, b->o->reps, b->o->warmup, b->seed, b->o->no_nccl ? ", without NCCL" : "",
        tune && *tune ? tune : "default",
        symm_device_gpu_count(b->dev) != b->size ? "; RANKS SHARE GPUS (--shared-gpu): not NVLink, not the benchmark"
                                                  : "");
    guard_cache gc = {0};
    for (int v = 0; v < n; v++)
        bench_variant(b, &gc, plans, n, v);
    guard_trim(&gc, plans, n, n);
    free_streams(b);
    if (b->nccl)
        CHECK(b, "symm_nccl_destroy", symm_nccl_destroy(b->nccl));
    int passed = 0, failed = 0;
    for (int i = 0; i < N_ROWS; i++) {
        const row_result *r = &b->rows[i];
        if (r->done && r->ours_ok && (!r->have_nccl || r->nccl_ok))
            passed++;
        else if (r->done)
            failed++;
    }
    if (b->rank == 0) {
        printf("\n");
        print_results(stdout, b, false);
        if (markdown) {
            print_results(markdown, b, true);
            fclose(markdown);
        }
        if (b->csv) /* rewritten in the matrix's order, now that every row is done */
            b->csv = freopen(b->o->csv, "w", b->csv);
        if (b->csv) {
            fputs(csv_head, b->csv);
            for (int i = 0; i < N_ROWS; i++)
                if (b->rows[i].done)
                    csv_row(b->csv, &b->rows[i]);
            fclose(b->csv);
        }
        printf("moe_bench: %d rows passed, %d failed%s\n", passed, failed, failed ? " (FAIL: see the notes)" : "");
    }
    return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : 2;
    static bench b; /* large (the rows); one per process */
    b.o = &o;
    b.wait_timeout_s = 120;
    symm_manifest *m;
    symm_status st = symm_manifest_open(o.manifest, &m);
    if (st != SYMM_OK) {
        fprintf(stderr, "moe_bench: %s: %s\nmoe_bench: generate the bench variants first: "
                        "build/bin/symmgen -o out/bench specs/bench.lua\n", symm_status_name(st), symm_last_error());
        return 2;
    }
    variant_plan plans[N_ROWS];
    int n = make_plans(&b, m, plans);
    if (n < 0)
        return 2;
    const int world = plans[0].desc->world;
    if (o.plan) {
        b.seed = o.seed ? o.seed : 1;
        b.size = world;
        size_rows(&b, DEFAULT_GRANULARITY);
        print_plan(&b, plans, n);
        symm_manifest_close(m);
        return 0;
    }
    if ((rc = join_world(&b, world)) || (rc = open_gpu(&b))) {
        symm_manifest_close(m);
        return rc;
    }
    b.wait_timeout_s = 2 * symm_world_timeout(b.world) + 30;
    b.seed = o.seed;
    if (!b.seed) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        b.seed = ((uint64_t)now.tv_sec << 32) ^ (uint64_t)now.tv_nsec;
        CHECK(&b, "symm_world_bcast (seed)", symm_world_bcast(b.world, &b.seed, sizeof b.seed, 0));
    }
    rc = run(&b, plans, n);
    CHECK(&b, "symm_device_close", symm_device_close(b.dev));
    symm_world_destroy(b.world);
    symm_manifest_close(m);
    return rc;
}
