/* link_probe.c: how many bytes an SM moves, by which path, over NVLink or
 * within one GPU: the measurement behind a choice between pushing rows to a
 * peer and pulling them from it (bench/NOTES.md 42).
 *
 *   symmrun -n 2 --gpus 0,1 link_probe [--mib N] [--sms LIST] [--reps N]
 *   symmrun -n 1 link_probe ...                 (one GPU: local copies only)
 *   symmrun -n 2 --gpus 0 link_probe --shared-gpu ...  (under CUDA MPS: a proxy)
 *
 * Every rank runs the same kernel at once on SMS blocks of 512 threads (one
 * block an SM), over N MiB, on a symmetric buffer of three N MiB regions
 * A, B, C:
 *   tma   each warp moves chunks of 7 KiB through shared memory with bulk
 *         copies (cp.async.bulk load, then store; two chunks a warp in
 *         flight), as dispatch and combine's push do;
 *   lsu   each lane copies 16-byte vectors, 8 in flight;
 *   sum   each lane loads a 16-byte vector from two sources, adds them (fp32)
 *         and stores the sum, 8 in flight: a combine's sum;
 *   load  loads alone (each thread adds its vectors up, one store at the
 *         end), 8 in flight; ld16, ld24 the same with 16 and 24 in flight;
 *   tld   loads alone through the TMA: both of a warp's 7 KiB staging slots
 *         loading at once (224 KiB a block in flight), nothing stored but a
 *         sum a warp: what bulk loads into shared memory can fetch (issue
 *         28.1: layout expert's combine reads about five rows a token);
 *   store stores alone;
 *   tce   tma push with the copy engine beside it: the kernel pushes the
 *         first (100 - P)% of A to the peer's B while a cuMemcpyDtoDAsync on
 *         a second stream pushes the rest, for each P of --ce-pct (default
 *         50; 0 is tma push alone, 100 the copy engine alone): whether the
 *         links carry more than either path alone, the question behind a
 *         dispatch that gives the copy engines a share of its rows
 *         (bench/NOTES.md 106). After its copy the stream writes a word
 *         into the peer's C (cuStreamWriteValue32 through the peer's
 *         mapping, as a dispatch would flag a landed piece), checked with
 *         the row. Push mode only, and only when --kernels names it; its
 *         kern column is cP.
 * Modes: local (A -> B on this GPU), push (this rank's A -> the peer's B),
 * pull (the peer's A -> this rank's B; the loads: the peer's A); sum local (A + C -> B), sum pull
 * (this rank's A + the peer's A -> B), sum push (this rank's A + C -> the
 * peer's B: local loads, the sums stored over NVLink from the lanes, as
 * layout expert's combine forms and pushes its partial sums, bench/NOTES.md
 * 68); load local or pull (A), store local or push (B). The peer is rank + 1 (mod world). With more than two ranks,
 * spread (tma and lsu): this rank's A to every peer at once, CHUNK bytes at
 * a time, chunk c to the (c mod (W - 1))-th rank after this one, at its own
 * offset of that rank's B: all-to-all traffic, what dispatch and combine
 * make at world W (issue 29).
 * Exchanges (kern flag and line, mode xchg; with two ranks or more): every
 * rank sends a message of --xchg-kib KiB (default 1792, about what (b) moves)
 * to rank + 1 while it takes one from rank - 1, 16 calls a launch, and the
 * row gives a call's time from the first store to the last byte checked at
 * the receiver: flag, the shares stored by the lanes, then a system fence
 * and a flag a warp (as dispatch and combine say "landed" today); line,
 * 128-byte lines of 120 bytes of payload and the call's number (NCCL's
 * LL128 layout), polled line by line: no fence, no flag (bench/NOTES.md
 * Next, issue 28.4). The payload is made from the call's number, so a line
 * read torn or a share read early counts as a mismatch and the row is
 * WRONG. The kernels' source is link_probe_kernels.h (make test compiles
 * it: tests/cpu/test_scripts.c).
 * A row's time is the slowest rank's (an allgather) per repetition; the table
 * gives the median and p90 over --reps, the bytes each SM loads and stores
 * per second (the SM's traffic), and the bytes that cross to or from the peer
 * per GPU per second. Each mode's first run is checked: the destination must
 * hold what the kernel was to put there. Exit status: 0 every row measured
 * and checked, 1 a check failed, 2 the probe could not run. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
#include "symm_heap.h"
#include "symm_jit.h"
#include "symm_world.h"

#define MAX_REPS 1000
#define COPY_SMEM (32 * CHUNK)
#define MAX_SMS_LIST 16
#define CHUNK 7168 /* bytes of a tma chunk: two a warp fill 224 KiB of shared memory */

#include "link_probe_kernels.h"

typedef enum { K_TMA, K_LSU, K_SUM, K_LOAD, K_STORE, K_LOAD16, K_LOAD24, K_TMA_LOAD, K_TCE, K_COUNT } kernel_kind;
static const char *const kernel_names[K_COUNT] = {"tma", "lsu", "sum", "load", "store", "ld16", "ld24", "tld", "tce"};
#define MAX_CE_PCT 8
#define TCE_FLAG 0x7ce00000u /* tce: the word the copy engine's stream writes after its copy, | the writer's rank */
/* Loads alone: no push mode; their check reads the sums they stored. */
static bool loads_only(kernel_kind k)
{
    return k == K_LOAD || k == K_LOAD16 || k == K_LOAD24 || k == K_TMA_LOAD;
}
/* M_SPREAD: push to every peer at once, chunk c (CHUNK bytes) to the
 * (c mod (W - 1))-th rank after this one; only where W > 2, tma and lsu. */
typedef enum { M_LOCAL, M_PUSH, M_PULL, M_SPREAD, M_COUNT } mode_kind;

typedef struct probe {
    const symm_cuda_api *cu;
    symm_world *world;
    symm_device *dev;
    symm_alloc *buf;
    int rank, size, peer, sm_count;
    size_t bytes; /* of each region */
    int reps;
    int sms[MAX_SMS_LIST];
    int n_sms;
    bool shared_gpu;
    unsigned kernels; /* bit k: kernel_kind k's rows; bit K_COUNT: the exchanges (--kernels) */
    CUmodule mod;
    CUfunction fn[K_COUNT];
    CUfunction spread[2]; /* tma_spread, lsu_spread */
    CUfunction xchg[2];   /* xchg_flag, xchg_line */
    size_t xchg_bytes;    /* the exchanges' message a rank sends (--xchg-kib) */
    unsigned long long xchg_seq; /* the exchanges' last call number */
    int ce_pct[MAX_CE_PCT]; /* tce: the copy engine's shares of the bytes, percent (--ce-pct) */
    int n_ce_pct;
    int ce_pct_now; /* the share of the tce row being run */
    bool tce_word_refused; /* cuStreamWriteValue32 into the peer's mapping failed: tce rows without the word */
    CUstream stream;
    CUstream ce_stream; /* tce: the copy engine's share */
    CUevent ev[4];      /* 0, 1: a rep's start and end; 2, 3: tce's fork and join */
    double *samples;
    int failed;
} probe;

static void die(const probe *p, const char *what, symm_status st)
{
    fprintf(stderr, "link_probe: rank %d: %s: %s: %s\n", p->rank, what, symm_status_name(st), symm_last_error());
    exit(2);
}

static void check(const probe *p, symm_status st, const char *what)
{
    if (st != SYMM_OK)
        die(p, what, st);
}

#define CU(p, call) check((p), symm_cuda_check((p)->cu->call, #call), #call)

static int usage(const char *fmt, const char *arg)
{
    fputs("link_probe: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\nusage: symmrun -n N [--gpus LIST] link_probe [--mib N] [--sms LIST] [--reps N] [--xchg-kib N] "
          "[--kernels LIST] [--ce-pct LIST] [--shared-gpu]\n", stderr);
    return 2;
}

static int parse_long(const char *opt, const char *text, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "link_probe: %s \"%s\": expected an integer %ld..%ld\n", opt, text, lo, hi);
        return 2;
    }
    *out = v;
    return 0;
}

/* A list of integers lo..hi separated by commas (--sms, --ce-pct), at most
 * `most` of them, into out[0..*n); 2 with a message naming opt, the list and
 * what was expected (`many`: what "at most N" counts, `expected`: the items). */
static int parse_int_list(const char *opt, const char *val, long lo, long hi, int *out, int most, int *n,
                          const char *many, const char *expected)
{
    char copy[256], why[320];
    if (strlen(val) >= sizeof copy) {
        snprintf(why, sizeof why, "%s \"%s\": too long", opt, val);
        return usage("%s", why);
    }
    strcpy(copy, val);
    *n = 0;
    for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
        long v;
        if (*n == most) {
            snprintf(why, sizeof why, "%s \"%s\": at most %d %s", opt, val, most, many);
            return usage("%s", why);
        }
        if (parse_long(opt, tok, lo, hi, &v))
            return 2;
        out[(*n)++] = (int)v;
    }
    if (*n == 0) {
        snprintf(why, sizeof why, "%s \"%s\": expected %s separated by commas", opt, val, expected);
        return usage("%s", why);
    }
    return 0;
}

static int parse_args(probe *p, int argc, char **argv)
{
    long v;
    p->bytes = (size_t)64 << 20;
    p->reps = 20;
    p->xchg_bytes = (size_t)1792 << 10;
    static const int default_sms[] = {8, 16, 24, 32, 48, 64, 132};
    p->n_sms = (int)(sizeof default_sms / sizeof default_sms[0]);
    memcpy(p->sms, default_sms, sizeof default_sms);
    p->kernels = ((1u << (K_COUNT + 1)) - 1) & ~(1u << K_TCE); /* tce only when named */
    p->ce_pct[0] = 50;
    p->n_ce_pct = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--shared-gpu")) {
            p->shared_gpu = true;
            continue;
        }
        if (i + 1 >= argc)
            return usage("%s needs a value", a);
        const char *val = argv[++i];
        if (!strcmp(a, "--mib")) {
            if (parse_long(a, val, 1, 4096, &v))
                return 2;
            p->bytes = (size_t)v << 20;
        } else if (!strcmp(a, "--xchg-kib")) {
            if (parse_long(a, val, 16, 4096, &v))
                return 2;
            p->xchg_bytes = (size_t)v << 10;
        } else if (!strcmp(a, "--reps")) {
            if (parse_long(a, val, 1, MAX_REPS, &v))
                return 2;
            p->reps = (int)v;
        } else if (!strcmp(a, "--sms")) {
            if (parse_int_list(a, val, 1, 1024, p->sms, MAX_SMS_LIST, &p->n_sms, "counts", "counts"))
                return 2;
        } else if (!strcmp(a, "--ce-pct")) {
            if (parse_int_list(a, val, 0, 100, p->ce_pct, MAX_CE_PCT, &p->n_ce_pct, "shares", "percentages"))
                return 2;
        } else if (!strcmp(a, "--kernels")) {
            /* Which rows: kernel names (the table's kern column) and xchg. */
            p->kernels = 0;
            char copy[256];
            if (strlen(val) >= sizeof copy)
                return usage("--kernels \"%s\": too long", val);
            strcpy(copy, val);
            for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
                int k = 0;
                while (k < K_COUNT && strcmp(tok, kernel_names[k]))
                    k++;
                if (k == K_COUNT && strcmp(tok, "xchg"))
                    return usage("--kernels: unknown kernel \"%s\" (expected tma, lsu, sum, load, store, ld16, ld24, "
                                 "tld, tce or xchg)", tok);
                p->kernels |= 1u << k;
            }
            if (!p->kernels)
                return usage("--kernels \"%s\": expected names separated by commas", val);
        } else {
            return usage("unknown argument \"%s\"", a);
        }
    }
    return 0;
}

static void setup(probe *p)
{
    check(p, symm_cuda(&p->cu), "the CUDA driver");
    check(p, symm_device_open(p->world, &p->dev), "symm_device_open");
    if (p->size > 1 && symm_device_gpu_count(p->dev) != p->size && !p->shared_gpu) {
        fprintf(stderr, "link_probe: rank %d: %d ranks share %d GPUs: use one rank per GPU, or --shared-gpu "
                        "(under CUDA MPS, a proxy)\n", p->rank, p->size, symm_device_gpu_count(p->dev));
        exit(2);
    }
    p->sm_count = symm_device_sm_count(p->dev);
    char arch[32];
    check(p, symm_jit_device_arch(symm_device_handle(p->dev), arch, sizeof arch), "symm_jit_device_arch");
    symm_jit_request req = {.source = probe_source, .source_name = "link_probe.cu", .arch = arch};
    symm_jit_result res;
    symm_status st = symm_jit_compile(&req, &res);
    if (st == SYMM_OK)
        st = symm_jit_load(res.cubin, res.cubin_size, &p->mod);
    symm_jit_result_free(&res);
    check(p, st, "compiling the probe kernels");
    static const char *const names[K_COUNT] = {"tma_copy",   "lsu_copy",   "lsu_sum",  "lsu_load", "lsu_store",
                                               "lsu_load16", "lsu_load24", "tma_load", "tma_copy"};
    for (int k = 0; k < K_COUNT; k++)
        check(p, symm_jit_get_function(p->mod, names[k], &p->fn[k]), names[k]);
    CU(p, cuFuncSetAttribute(p->fn[K_TMA], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, COPY_SMEM));
    CU(p, cuFuncSetAttribute(p->fn[K_TMA_LOAD], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, COPY_SMEM));
    CU(p, cuFuncSetAttribute(p->fn[K_TCE], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, COPY_SMEM));
    check(p, symm_jit_get_function(p->mod, "tma_spread", &p->spread[0]), "tma_spread");
    check(p, symm_jit_get_function(p->mod, "lsu_spread", &p->spread[1]), "lsu_spread");
    CU(p, cuFuncSetAttribute(p->spread[0], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, COPY_SMEM));
    check(p, symm_jit_get_function(p->mod, "xchg_flag", &p->xchg[0]), "xchg_flag");
    check(p, symm_jit_get_function(p->mod, "xchg_line", &p->xchg[1]), "xchg_line");
    CU(p, cuStreamCreate(&p->stream, CU_STREAM_NON_BLOCKING));
    CU(p, cuStreamCreate(&p->ce_stream, CU_STREAM_NON_BLOCKING));
    for (int i = 0; i < 2; i++)
        CU(p, cuEventCreate(&p->ev[i], CU_EVENT_DEFAULT));
    for (int i = 2; i < 4; i++)
        CU(p, cuEventCreate(&p->ev[i], CU_EVENT_DISABLE_TIMING));
    check(p, symm_alloc_create(p->world, p->dev, 3 * p->bytes, 0, &p->buf), "symm_alloc_create");
    p->samples = calloc((size_t)p->reps, sizeof *p->samples);
    if (!p->samples)
        die(p, "set-up", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
}

/* Region r (0 A, 1 B, 2 C) of rank's buffer, in this rank's mapping. */
static CUdeviceptr region(const probe *p, int rank, int r)
{
    return symm_alloc_peer(p->buf, rank) + (CUdeviceptr)r * p->bytes;
}

/* Fills A and C of this rank with words that name the rank and region. */
static void fill(probe *p)
{
    /* On the probe's stream, which does not wait for the legacy default stream. */
    CU(p, cuMemsetD32Async(region(p, p->rank, 0), 0x3f800000u + (unsigned)p->rank * 0x10000u, p->bytes / 4,
                           p->stream));
    CU(p, cuMemsetD32Async(region(p, p->rank, 2), 0x40000000u + (unsigned)p->rank * 0x10000u, p->bytes / 4,
                           p->stream));
    CU(p, cuMemsetD32Async(region(p, p->rank, 1), 0xffffffffu, p->bytes / 4, p->stream));
    CU(p, cuStreamSynchronize(p->stream));
    check(p, symm_world_barrier(p->world), "barrier");
}

/* The rank whose spread lands in chunk c of this rank's B (M_SPREAD). */
static int spread_source(const probe *p, size_t c)
{
    return (int)(((size_t)p->rank + 2 * (size_t)p->size - 1 - c % (size_t)(p->size - 1)) % (size_t)p->size);
}

/* The bytes of A the kernel of a tce row pushes (the rest goes by the copy
 * engine): (100 - P)% of a region, in whole MiB (the copy's offset stays
 * aligned). */
static size_t tce_kernel_bytes(const probe *p)
{
    const size_t mib = p->bytes >> 20;
    return (mib * (size_t)(100 - p->ce_pct_now) / 100) << 20;
}

static void launch(probe *p, kernel_kind k, mode_kind m, int sms)
{
    if (k == K_TCE) { /* push only: the kernel's share on the stream, the copy engine's beside it */
        const size_t kb = tce_kernel_bytes(p);
        CUdeviceptr src = region(p, p->rank, 0), dst = region(p, p->peer, 1);
        CU(p, cuEventRecord(p->ev[2], p->stream));
        CU(p, cuStreamWaitEvent(p->ce_stream, p->ev[2], 0));
        if (kb < p->bytes) {
            CU(p, cuMemcpyDtoDAsync(dst + kb, src + kb, p->bytes - kb, p->ce_stream));
            /* A word after the copy, as a dispatch would flag a landed
             * piece: written by the stream into the peer's mapping of its C
             * (checked after the first run). */
            if (!p->tce_word_refused) {
                /* Refused (not an error of the run): said once, and the
                 * rows go on without the word. */
                const CUresult r =
                    p->cu->cuStreamWriteValue32(p->ce_stream, region(p, p->peer, 2), TCE_FLAG | (unsigned)p->rank, 0);
                if (r != CUDA_SUCCESS) {
                    p->tce_word_refused = true;
                    symm_status why = symm_cuda_check(r, "cuStreamWriteValue32");
                    fprintf(stderr, "link_probe: rank %d: the word after the copy, into the peer's mapping: %s: %s "
                                    "(the tce rows go on without it)\n", p->rank, symm_status_name(why),
                            symm_last_error());
                }
            }
        }
        if (kb > 0) {
            unsigned long long bytes = kb;
            unsigned chunk = CHUNK;
            void *args[] = {&src, &dst, &bytes, &chunk};
            CU(p, cuLaunchKernel(p->fn[K_TCE], (unsigned)sms, 1, 1, 512, 1, 1, COPY_SMEM, p->stream, args, NULL));
        }
        CU(p, cuEventRecord(p->ev[3], p->ce_stream));
        CU(p, cuStreamWaitEvent(p->stream, p->ev[3], 0));
        return;
    }
    if (m == M_SPREAD) {
        struct { CUdeviceptr p[7]; } peers;
        memset(&peers, 0, sizeof peers);
        unsigned npeers = (unsigned)(p->size - 1);
        for (unsigned j = 0; j < npeers; j++)
            peers.p[j] = region(p, (p->rank + 1 + (int)j) % p->size, 1);
        CUdeviceptr src = region(p, p->rank, 0);
        unsigned long long bytes = p->bytes, vecs = p->bytes / 16;
        unsigned chunk = CHUNK;
        void *args_tma[] = {&src, &peers, &npeers, &bytes, &chunk};
        void *args_lsu[] = {&src, &peers, &npeers, &vecs, &chunk};
        CU(p, cuLaunchKernel(p->spread[k == K_TMA ? 0 : 1], (unsigned)sms, 1, 1, 512, 1, 1, k == K_TMA ? COPY_SMEM : 0,
                             p->stream, k == K_TMA ? args_tma : args_lsu, NULL));
        return;
    }
    const int src_rank = m == M_PULL ? p->peer : p->rank, dst_rank = m == M_PUSH ? p->peer : p->rank;
    CUdeviceptr src = region(p, src_rank, 0), dst = region(p, dst_rank, 1);
    CUdeviceptr other = m == M_PULL ? region(p, p->peer, 0) : region(p, p->rank, 2);
    unsigned long long bytes = p->bytes, vecs = p->bytes / 16;
    unsigned chunk = CHUNK;
    void *args_tma[] = {&src, &dst, &bytes, &chunk};
    void *args_lsu[] = {&src, &dst, &vecs};
    CUdeviceptr a = region(p, p->rank, 0);
    void *args_sum[] = {&a, &other, &dst, &vecs};
    void *args_load[] = {&src, &vecs, &dst}; /* dst: the sums, one a thread */
    void *args_tma_load[] = {&src, &bytes, &chunk, &dst}; /* dst: the sums, one a warp */
    unsigned word = 0x3f800000u + (unsigned)p->rank * 0x10000u;
    void *args_store[] = {&dst, &vecs, &word};
    void **args = k == K_TMA ? args_tma : k == K_LSU ? args_lsu : k == K_SUM ? args_sum : k == K_STORE ? args_store
                : k == K_TMA_LOAD ? args_tma_load : args_load;
    const unsigned smem = k == K_TMA || k == K_TMA_LOAD ? COPY_SMEM : 0;
    CU(p, cuLaunchKernel(p->fn[k], (unsigned)sms, 1, 1, 512, 1, 1, smem, p->stream, args, NULL));
}

/* The sums the loads-only kernels leave at the start of this rank's B: unit
 * u of `units` (a thread or a warp) added up items u, u + units, ... of n,
 * each `words` (1..4) words equal to `from`, and stored `words` sums; the first
 * and the last unit's are checked. */
static bool check_sums(probe *p, const char *unit, unsigned long long n, unsigned long long units, int words,
                       unsigned from)
{
    const unsigned long long idx[2] = {0, units - 1};
    for (int i = 0; i < 2; i++) {
        unsigned sum[4];
        CU(p, cuMemcpyDtoH(sum, region(p, p->rank, 1) + idx[i] * 4 * (unsigned long long)words,
                           (size_t)words * sizeof sum[0]));
        const unsigned long long count = n > idx[i] ? (n - idx[i] + units - 1) / units : 0;
        const unsigned want_sum = (unsigned)(count * from);
        for (int j = 0; j < words; j++)
            if (sum[j] != want_sum) {
                fprintf(stderr, "link_probe: rank %d: %s %llu's sum is 0x%08x, expected 0x%08x\n", p->rank, unit,
                        idx[i], sum[j], want_sum);
                return false;
            }
    }
    return true;
}

/* What B of the destination rank must hold after a run. */
static bool check_result(probe *p, kernel_kind k, mode_kind m, int sms_of_run)
{
    CU(p, cuStreamSynchronize(p->stream));
    check(p, symm_world_barrier(p->world), "barrier");
    /* After push, this rank's B holds what the rank before it pushed. */
    const int src = m == M_PUSH ? (p->rank + p->size - 1) % p->size : m == M_PULL ? p->peer : p->rank;
    const unsigned own = 0x3f800000u + (unsigned)p->rank * 0x10000u;
    const unsigned from = 0x3f800000u + (unsigned)src * 0x10000u;
    const unsigned other = m == M_PULL ? 0x3f800000u + (unsigned)p->peer * 0x10000u
                                       : 0x40000000u + (unsigned)p->rank * 0x10000u;
    float want, x, y;
    memcpy(&want, &from, 4);
    if (k == K_SUM && m == M_PUSH) {
        /* The rank before this one pushed its A + C. */
        const unsigned src_c = 0x40000000u + (unsigned)src * 0x10000u;
        memcpy(&x, &from, 4);
        memcpy(&y, &src_c, 4);
        want = x + y;
    } else if (k == K_SUM) {
        memcpy(&x, &own, 4);
        memcpy(&y, &other, 4);
        want = x + y;
    }
    if (k == K_TCE && tce_kernel_bytes(p) < p->bytes && !p->tce_word_refused) { /* the word the rank before wrote after its copy */
        unsigned word = 0;
        CU(p, cuMemcpyDtoH(&word, region(p, p->rank, 2), sizeof word));
        if (word != (TCE_FLAG | (unsigned)src)) {
            fprintf(stderr, "link_probe: rank %d: the word written after the copy engine's copy is 0x%08x, expected "
                            "0x%08x\n", p->rank, word, TCE_FLAG | (unsigned)src);
            return false;
        }
    }
    if (k == K_TMA_LOAD) /* warp g added up the first word of chunks g, g + G, ... (G warps) */
        return check_sums(p, "warp", (p->bytes + CHUNK - 1) / CHUNK, (unsigned long long)sms_of_run * 16, 1, from);
    if (loads_only(k)) /* thread i added up vectors i, i + T, ... (T threads), four words each */
        return check_sums(p, "thread", p->bytes / 16, (unsigned long long)sms_of_run * 512, 4, from);
    static float got[4096];
    const size_t at[3] = {0, p->bytes / 2, p->bytes - sizeof got};
    for (int i = 0; i < 3; i++) {
        CU(p, cuMemcpyDtoH(got, region(p, p->rank, 1) + at[i], sizeof got));
        for (size_t j = 0; j < sizeof got / 4; j++) {
            if (m == M_SPREAD) { /* each chunk from its own source rank */
                const unsigned w = 0x3f800000u + (unsigned)spread_source(p, (at[i] + 4 * j) / CHUNK) * 0x10000u;
                memcpy(&want, &w, 4);
            }
            if (memcmp(&got[j], &want, 4) != 0) {
                fprintf(stderr, "link_probe: rank %d: B[%zu] = %g after the run, expected %g\n", p->rank,
                        at[i] / 4 + j, (double)got[j], (double)want);
                return false;
            }
        }
    }
    return true;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A launch of the probe's kernel `what` in mode `how` at sms blocks (the
 * rows' kernel_kind and mode_kind, or an exchange's kind). */
typedef void (*launcher)(probe *p, int what, int how, int sms);

/* --reps timed launches of go, each after this rank's work is done and a
 * barrier of every rank: a launch's time is the slowest rank's, divided by
 * `calls` (the calls it makes); its median and p90 in *p50 and *p90. */
static void time_reps(probe *p, launcher go, int what, int how, int sms, int calls, double *p50, double *p90)
{
    double *gathered = calloc((size_t)p->size, sizeof *gathered);
    if (!gathered)
        die(p, "time_reps", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
    for (int i = 0; i < p->reps; i++) {
        CU(p, cuStreamSynchronize(p->stream));
        check(p, symm_world_barrier(p->world), "barrier");
        CU(p, cuEventRecord(p->ev[0], p->stream));
        go(p, what, how, sms);
        CU(p, cuEventRecord(p->ev[1], p->stream));
        CU(p, cuEventSynchronize(p->ev[1]));
        float ms = 0;
        CU(p, cuEventElapsedTime(&ms, p->ev[0], p->ev[1]));
        double us = (double)ms * 1e3 / calls;
        check(p, symm_world_allgather(p->world, &us, gathered, sizeof us), "allgather");
        double worst = 0;
        for (int r = 0; r < p->size; r++)
            worst = gathered[r] > worst ? gathered[r] : worst;
        p->samples[i] = worst;
    }
    free(gathered);
    qsort(p->samples, (size_t)p->reps, sizeof *p->samples, by_value);
    *p50 = p->samples[p->reps / 2];
    *p90 = p->samples[(p->reps * 9) / 10];
}

/* Rank 0 prints a row of the table: `traffic` bytes each SM loads and
 * stores, `remote` bytes that cross per GPU, in a call of p50 us. */
static void print_row(const probe *p, const char *kern, const char *mode, int sms, double p50, double p90,
                      double traffic, double remote, bool ok)
{
    if (p->rank == 0)
        printf("%-4s %-6s %4d  %9.1f %9.1f  %9.1f  %9.1f  %9.1f  %s\n", kern, mode, sms, p50, p90,
               traffic / p50 / 1e3, traffic / p50 / 1e3 / sms, remote / p50 / 1e3, ok ? "ok" : "WRONG");
    fflush(stdout);
}

static void launch_row(probe *p, int k, int m, int sms)
{
    launch(p, (kernel_kind)k, (mode_kind)m, sms);
}

static void row(probe *p, kernel_kind k, mode_kind m, int sms)
{
    static const char *const mname[M_COUNT] = {"local", "push", "pull", "spread"};
    fill(p);
    launch(p, k, m, sms);
    bool ok = check_result(p, k, m, sms);
    int all_ok = ok, sum_ok = 0;
    int *oks = calloc((size_t)p->size, sizeof *oks);
    if (!oks)
        die(p, "row", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
    check(p, symm_world_allgather(p->world, &all_ok, oks, sizeof all_ok), "allgather");
    for (int r = 0; r < p->size; r++)
        sum_ok += oks[r];
    free(oks);
    for (int i = 0; i < 3; i++)
        launch(p, k, m, sms); /* warm-up */
    double p50, p90;
    time_reps(p, launch_row, k, m, sms, 1, &p50, &p90);
    /* Bytes each SM loads and stores (tce: of the kernel's share); bytes
     * that cross per GPU. */
    const double traffic = k == K_TCE ? 2.0 * (double)tce_kernel_bytes(p)
                                      : (double)p->bytes * (k == K_SUM ? 3 : loads_only(k) || k == K_STORE ? 1 : 2);
    const double remote = m == M_LOCAL ? 0 : (double)p->bytes;
    char kern[8];
    snprintf(kern, sizeof kern, "c%d", p->ce_pct_now);
    print_row(p, k == K_TCE ? kern : kernel_names[k], mname[m], sms, p50, p90, traffic, remote, sum_ok == p->size);
    if (sum_ok != p->size)
        p->failed = 1;
}

/* The exchanges (xchg_flag, xchg_line in probe_source): XCHG_ITERS calls a
 * launch, call i in slice i of B, the flags [call][warp] at B + XCHG_FLAGS,
 * the mismatch count at the start of C. */
#define XCHG_ITERS 16
#define XCHG_FLAGS ((size_t)48 << 20)

static size_t xchg_slice(const probe *p)
{
    return ((p->xchg_bytes / 120 + 8) * 128 + 4095) & ~(size_t)4095;
}

static bool xchg_fits(const probe *p)
{
    return XCHG_ITERS * xchg_slice(p) <= XCHG_FLAGS && p->bytes >= XCHG_FLAGS + ((size_t)1 << 20);
}

/* Exchange kind `line` (0 flag, 1 line; `how` unused: a launcher). */
static void xchg_launch(probe *p, int line, int how, int sms)
{
    (void)how;
    const int prev = (p->rank + p->size - 1) % p->size;
    CUdeviceptr peer_b = region(p, p->peer, 1), own_b = region(p, p->rank, 1);
    CUdeviceptr peer_flags = peer_b + XCHG_FLAGS, own_flags = own_b + XCHG_FLAGS, bad = region(p, p->rank, 2);
    unsigned long long msg = p->xchg_bytes, slice = xchg_slice(p), seq0 = p->xchg_seq + 1;
    unsigned iters = XCHG_ITERS, me = (unsigned)p->rank, src = (unsigned)prev;
    p->xchg_seq += XCHG_ITERS;
    void *args_flag[] = {&peer_b, &own_b, &peer_flags, &own_flags, &msg, &slice, &iters, &seq0, &me, &src, &bad};
    void *args_line[] = {&peer_b, &own_b, &msg, &slice, &iters, &seq0, &me, &src, &bad};
    CU(p, cuLaunchKernel(p->xchg[line], (unsigned)sms, 1, 1, 512, 1, 1, 0, p->stream, line ? args_line : args_flag,
                         NULL));
}

/* One exchange row: three warm-up launches, then --reps timed launches,
 * each XCHG_ITERS calls; the time is a call's (the slowest rank's launch /
 * XCHG_ITERS). "SMs GB/s" counts the bytes on the wire (the lines' numbers
 * too), "remote GB/s" the message. Every call of every launch is checked: a
 * word the receiver read that is not the call's (a line read torn, a share
 * read before it landed) makes the row WRONG. */
static void xchg_row(probe *p, int line, int sms)
{
    /* Lines and flags at 0, below every call number (the other rows fill B
     * with ones), and the mismatch count at 0; every rank's, before any
     * rank sends. */
    CU(p, cuMemsetD32Async(region(p, p->rank, 1), 0, p->bytes / 4, p->stream));
    CU(p, cuMemsetD32Async(region(p, p->rank, 2), 0, 1, p->stream));
    CU(p, cuStreamSynchronize(p->stream));
    check(p, symm_world_barrier(p->world), "barrier");
    for (int i = 0; i < 3; i++) { /* warm-up (checked with the rest) */
        CU(p, cuStreamSynchronize(p->stream));
        check(p, symm_world_barrier(p->world), "barrier");
        xchg_launch(p, line, 0, sms);
    }
    double p50, p90;
    time_reps(p, xchg_launch, line, 0, sms, XCHG_ITERS, &p50, &p90);
    CU(p, cuStreamSynchronize(p->stream));
    unsigned bad = 0;
    CU(p, cuMemcpyDtoH(&bad, region(p, p->rank, 2), sizeof bad));
    unsigned *bads = calloc((size_t)p->size, sizeof *bads);
    if (!bads)
        die(p, "xchg_row", symm_fail(SYMM_ERR_NOMEM, "out of host memory"));
    check(p, symm_world_allgather(p->world, &bad, bads, sizeof bad), "allgather");
    unsigned long long all_bad = 0;
    for (int r = 0; r < p->size; r++)
        all_bad += bads[r];
    free(bads);
    if (bad)
        fprintf(stderr, "link_probe: rank %d: xchg %s at %d SMs: %u words read were not their call's\n", p->rank,
                line ? "line" : "flag", sms, bad);
    const double msg = (double)p->xchg_bytes, wire = line ? msg / 120.0 * 128.0 : msg;
    print_row(p, line ? "line" : "flag", "xchg", sms, p50, p90, wire, msg, all_bad == 0);
    if (all_bad)
        p->failed = 1;
}

int main(int argc, char **argv)
{
    probe p;
    memset(&p, 0, sizeof p);
    int rc = parse_args(&p, argc, argv);
    if (rc)
        return rc;
    symm_status st = symm_world_create_from_env(&p.world);
    if (st != SYMM_OK) {
        fprintf(stderr, "link_probe: %s: %s (start it with symmrun)\n", symm_status_name(st), symm_last_error());
        return 2;
    }
    p.rank = symm_world_rank(p.world);
    p.size = symm_world_size(p.world);
    p.peer = (p.rank + 1) % p.size;
    setup(&p);
    if (p.rank == 0) {
        printf("link_probe: %d rank(s), %d SMs per GPU, %zu MiB per region, %d reps, peer = rank + 1%s\n", p.size,
               p.sm_count, p.bytes >> 20, p.reps, p.size == 1 ? " (itself)" : p.shared_gpu ? " (RANKS SHARE GPUS)" : "");
        printf("%-4s %-6s %4s  %9s %9s  %9s  %9s  %9s\n", "kern", "mode", "sms", "us p50", "us p90",
               "SMs GB/s", "per SM", "remote GB/s");
    }
    for (int s = 0; s < p.n_sms; s++) {
        const int sms = p.sms[s] < p.sm_count ? p.sms[s] : p.sm_count;
        for (int k = 0; k < K_COUNT; k++)
            for (int m = 0; m < M_COUNT; m++) {
                if (!(p.kernels >> k & 1))
                    continue;
                if (m == M_SPREAD && (p.size < 3 || (k != K_TMA && k != K_LSU)))
                    continue; /* spread: tma and lsu where there are several peers */
                if (loads_only((kernel_kind)k) && m == M_PUSH)
                    continue; /* a load is pulled or local */
                if (k == K_STORE && m == M_PULL)
                    continue; /* a store is pushed or local */
                if (p.size == 1 && m != M_LOCAL)
                    continue;
                if (k == K_TCE) { /* push alone, a row a share */
                    if (m == M_PUSH)
                        for (int c = 0; c < p.n_ce_pct; c++) {
                            p.ce_pct_now = p.ce_pct[c];
                            row(&p, (kernel_kind)k, (mode_kind)m, sms);
                        }
                    continue;
                }
                row(&p, (kernel_kind)k, (mode_kind)m, sms);
            }
        if (p.size > 1 && (p.kernels >> K_COUNT & 1) && xchg_fits(&p))
            for (int line = 0; line < 2; line++)
                xchg_row(&p, line, sms);
    }
    check(&p, symm_alloc_destroy(p.buf), "symm_alloc_destroy");
    for (int i = 0; i < 4; i++)
        p.cu->cuEventDestroy(p.ev[i]);
    p.cu->cuStreamDestroy(p.ce_stream);
    p.cu->cuStreamDestroy(p.stream);
    symm_jit_unload(p.mod);
    symm_device_close(p.dev);
    symm_world_destroy(p.world);
    free(p.samples);
    return p.failed;
}
