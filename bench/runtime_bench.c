/* runtime_bench.c: what libsymm costs at job start, on a GPU host, one rank
 * per process under symmrun: joining the world, opening the GPU, allocating
 * and mapping a 1 GiB symmetric buffer (with and without the contiguous view)
 * and destroying it, NVRTC compiling a real variant without the cache, with
 * a cache miss, and with a cache hit, and loading its cubin.
 *
 *   symmrun -n 4 --gpus 0,1 runtime_bench --cu out/default/bf16_rank_w2.cu
 *           [--iters N] [--mib M]
 *
 * Every rank times each step between barriers; a step's time is the slowest
 * rank's (an allgather), and repeated steps report the median (min, max) of
 * that over --iters runs. Rank 0 prints the table as it goes, then one
 * summary line (which device-run.sh's summary picks up). Ranks that share a
 * GPU are time-sliced: their times say so in the header and are not the
 * one-rank-per-GPU figures. Each rank's JIT cache is a fresh temporary
 * directory, removed when the JIT step ends (or the program exits). */
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"
#include "symm_heap.h"
#include "symm_jit.h"
#include "symm_manifest.h"
#include "symm_world.h"

#define MAX_ITERS 1000
#define CACHE_HIT_GOAL_MS 10.0

typedef struct bench {
    const char *cu_path;
    int iters;
    size_t bytes;
    symm_world *world;
    symm_device *dev;
    int rank, size;
    double *samples;    /* iters slowest-rank times of the step being measured */
    char cache_dir[64]; /* this rank's JIT cache during bench_jit; "" otherwise */
    double join_ms, alloc_ms, compile_ms, hit_ms; /* for the summary line */
} bench;

/* The one per-process context: main's, reached by the exit handler that
 * removes the cache directory whichever way the program ends. */
static bench g_bench;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void die(const bench *b, const char *what, symm_status st)
{
    fprintf(stderr, "runtime_bench: rank %d: %s: %s: %s\n", b->rank, what, symm_status_name(st),
            symm_last_error());
    exit(1);
}

static void check(const bench *b, symm_status st, const char *what)
{
    if (st != SYMM_OK)
        die(b, what, st);
}

static int usage(const char *fmt, const char *arg)
{
    fputs("runtime_bench: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\nusage: symmrun -n N [--gpus LIST] runtime_bench --cu FILE.cu [--iters N] [--mib M]\n",
          stderr);
    return 2;
}

static int parse_count(const char *opt, const char *text, long max, long *out)
{
    char *end;
    errno = 0;
    long n = strtol(text, &end, 10);
    if (errno || *end || n < 1 || n > max) {
        fprintf(stderr, "runtime_bench: %s: got \"%s\", expected an integer of 1..%ld\n", opt, text, max);
        return 2;
    }
    *out = n;
    return 0;
}

static int parse_args(int argc, char **argv, bench *b)
{
    long iters = 5, mib = 1024;
    for (int i = 1; i < argc; i++) {
        int rc = 0;
        if (!strcmp(argv[i], "--cu") && i + 1 < argc)
            b->cu_path = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            rc = parse_count("--iters", argv[++i], MAX_ITERS, &iters);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            rc = parse_count("--mib", argv[++i], 1L << 20, &mib);
        else
            return usage("unexpected argument \"%s\"", argv[i]);
        if (rc)
            return rc;
    }
    if (!b->cu_path)
        return usage("%s", "no --cu FILE.cu given (a generated variant, e.g. out/default/bf16_rank_w2.cu)");
    b->iters = (int)iters;
    b->bytes = (size_t)mib << 20;
    return 0;
}

/* The time this process started (CLOCK_BOOTTIME, ms), from /proc/self/stat:
 * field 22, in clock ticks (so to 1/CLK_TCK s, 10 ms on most kernels). -1
 * when it cannot be read. */
static double process_start_ms(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ticks = 0;
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    if (!p || sscanf(p + 1, "%llu", &ticks) != 1)
        return -1;
    return (double)ticks * 1e3 / (double)sysconf(_SC_CLK_TCK);
}

/* The slowest rank's value of mine (collective). */
static double slowest(bench *b, double mine)
{
    double all[b->size];
    check(b, symm_world_allgather(b->world, &mine, all, sizeof mine), "symm_world_allgather");
    double max = all[0];
    for (int r = 1; r < b->size; r++)
        max = all[r] > max ? all[r] : max;
    return max;
}

static void barrier(bench *b)
{
    check(b, symm_world_barrier(b->world), "symm_world_barrier");
}

static int compare_double(const void *x, const void *y)
{
    double a = *(const double *)x, c = *(const double *)y;
    return (a > c) - (a < c);
}

static void print_one(const bench *b, const char *what, double ms, const char *note)
{
    if (b->rank == 0)
        printf("  %-46s %10.3f ms  %s\n", what, ms, note ? note : "");
}

/* Rank 0 prints the median (min..max) of b->samples[0..n); returns the median. */
static double print_samples(bench *b, const char *what, int n, const char *note)
{
    qsort(b->samples, (size_t)n, sizeof *b->samples, compare_double);
    double median = b->samples[n / 2];
    if (b->rank == 0)
        printf("  %-46s %10.3f ms  (min %.3f, max %.3f, n %d)  %s\n", what, median, b->samples[0],
               b->samples[n - 1], n, note ? note : "");
    return median;
}

/* ---- (a) the world ------------------------------------------------------- */

typedef struct join_times {
    double start, main, before, after; /* CLOCK_BOOTTIME ms */
} join_times;

static void report_first_join(bench *b, join_times mine)
{
    join_times all[b->size];
    check(b, symm_world_allgather(b->world, &mine, all, sizeof mine), "symm_world_allgather");
    double first_start = all[0].start, last_ready = all[0].after;
    double own = 0, from_main = 0, call = 0;
    for (int r = 0; r < b->size; r++) {
        first_start = all[r].start < first_start ? all[r].start : first_start;
        last_ready = all[r].after > last_ready ? all[r].after : last_ready;
        own = all[r].after - all[r].start > own ? all[r].after - all[r].start : own;
        from_main = all[r].after - all[r].main > from_main ? all[r].after - all[r].main : from_main;
        call = all[r].after - all[r].before > call ? all[r].after - all[r].before : call;
    }
    long tick_ms = 1000 / sysconf(_SC_CLK_TCK);
    char note[64];
    snprintf(note, sizeof note, "(process start known to %ld ms)", tick_ms);
    bool have_start = first_start >= 0;
    if (have_start) {
        print_one(b, "join: first rank's start -> last rank joined", last_ready - first_start, note);
        print_one(b, "join: own process start -> joined (max)", own, note);
    }
    print_one(b, "join: main() -> joined (max)", from_main, NULL);
    print_one(b, "join: symm_world_create_from_env call (max)", call, "(rank 0 waits for the last)");
    b->join_ms = have_start ? last_ready - first_start : from_main;
}

/* Join fresh worlds (a job id of their own, the same secret) with every rank
 * starting together: the rendezvous alone, without process start-up. */
static void bench_rejoin(bench *b)
{
    symm_world_config cfg;
    check(b, symm_world_config_from_env(&cfg), "symm_world_config_from_env");
    char job_id[300];
    char base[200];
    snprintf(base, sizeof base, "%s", cfg.job_id ? cfg.job_id : "rtbench");
    for (int i = 0; i < b->iters; i++) {
        snprintf(job_id, sizeof job_id, "%s.rtbench%d", base, i);
        cfg.job_id = job_id;
        symm_world *fresh = NULL;
        barrier(b);
        double t0 = now_ms();
        check(b, symm_world_create(&cfg, &fresh), "symm_world_create (a fresh world)");
        double t = now_ms() - t0;
        /* Nobody leaves while a peer may still be joining. */
        check(b, symm_world_barrier(fresh), "symm_world_barrier (a fresh world)");
        symm_world_destroy(fresh);
        b->samples[i] = slowest(b, t);
    }
    print_samples(b, "join: symm_world_create, ranks start together", b->iters, NULL);
}

/* ---- (b) the GPU --------------------------------------------------------- */

static void print_header(bench *b)
{
    if (b->rank != 0)
        return;
    const symm_cuda_api *cu;
    char name[128] = "?";
    if (symm_cuda(&cu) == SYMM_OK)
        cu->cuDeviceGetName(name, sizeof name, symm_device_handle(b->dev));
    int gpus = symm_device_gpu_count(b->dev);
    printf("runtime_bench: %d ranks on %d GPU%s (%s)%s; each time is the slowest rank's, "
           "repeated ones the median of %d\n", b->size, gpus, gpus == 1 ? "" : "s", name,
           gpus < b->size ? ", ranks share GPUs (time-sliced: not one-rank-per-GPU figures)" : "",
           b->iters);
}

/* First, so that a host without a GPU stops before any other work. */
static void bench_device(bench *b)
{
    const symm_cuda_api *cu;
    double t0 = now_ms();
    symm_status st = symm_cuda(&cu);
    double driver_ms = now_ms() - t0;
    if (st != SYMM_OK) {
        fprintf(stderr, "runtime_bench: rank %d: needs a GPU: %s\n", b->rank, symm_last_error());
        exit(1);
    }
    driver_ms = slowest(b, driver_ms);
    for (int i = 0; i <= b->iters; i++) {
        if (b->dev)
            check(b, symm_device_close(b->dev), "symm_device_close");
        b->dev = NULL;
        barrier(b);
        t0 = now_ms();
        check(b, symm_device_open(b->world, &b->dev), "symm_device_open");
        double t = slowest(b, now_ms() - t0);
        if (i > 0) {
            b->samples[i - 1] = t;
            continue;
        }
        print_header(b);
        print_one(b, "CUDA driver load + cuInit", driver_ms, NULL);
        print_one(b, "symm_device_open, first (creates the context)", t, NULL);
    }
    print_samples(b, "symm_device_open, again (after a close)", b->iters, NULL);
}

/* ---- (c) the symmetric heap ---------------------------------------------- */

static void bench_alloc(bench *b, unsigned flags)
{
    double destroy[b->iters];
    for (int i = 0; i < b->iters; i++) {
        symm_alloc *a;
        barrier(b);
        double t0 = now_ms();
        check(b, symm_alloc_create(b->world, b->dev, b->bytes, flags, &a), "symm_alloc_create");
        b->samples[i] = slowest(b, now_ms() - t0);
        barrier(b);
        t0 = now_ms();
        check(b, symm_alloc_destroy(a), "symm_alloc_destroy");
        destroy[i] = slowest(b, now_ms() - t0);
    }
    char what[80];
    const char *view = flags & SYMM_ALLOC_CONTIGUOUS ? " +view" : "";
    snprintf(what, sizeof what, "symm_alloc_create %zu MiB%s", b->bytes >> 20, view);
    double create_ms = print_samples(b, what, b->iters, "(allocate, map all peers, zero)");
    if (!flags)
        b->alloc_ms = create_ms;
    memcpy(b->samples, destroy, sizeof destroy);
    snprintf(what, sizeof what, "symm_alloc_destroy %zu MiB%s", b->bytes >> 20, view);
    print_samples(b, what, b->iters, NULL);
}

/* ---- (d) the JIT --------------------------------------------------------- */

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Also at exit, after a failed step; a rank killed by symmrun (because
 * another failed) mid-JIT leaves its directory behind. */
static void remove_cache_dir(void)
{
    if (g_bench.cache_dir[0])
        nftw(g_bench.cache_dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
    g_bench.cache_dir[0] = '\0';
}

static void make_cache_dir(bench *b)
{
    snprintf(b->cache_dir, sizeof b->cache_dir, "/tmp/symm-rtbench-XXXXXX");
    if (!mkdtemp(b->cache_dir)) {
        b->cache_dir[0] = '\0';
        fprintf(stderr, "runtime_bench: rank %d: mkdtemp /tmp/symm-rtbench-XXXXXX: %s\n", b->rank,
                strerror(errno));
        exit(1);
    }
}

static char *read_source(const bench *b)
{
    FILE *f = fopen(b->cu_path, "rb");
    if (!f) {
        fprintf(stderr, "runtime_bench: cannot open %s: %s\n", b->cu_path, strerror(errno));
        exit(1);
    }
    char *src = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (src = malloc((size_t)n + 1)) &&
        fread(src, 1, (size_t)n, f) == (size_t)n) {
        src[n] = '\0';
    } else {
        fprintf(stderr, "runtime_bench: cannot read %s\n", b->cu_path);
        exit(1);
    }
    fclose(f);
    return src;
}

/* One compile between barriers; returns the slowest rank's total time. */
static double timed_compile(bench *b, const symm_jit_request *req, bool want_hit, symm_jit_result *res)
{
    barrier(b);
    check(b, symm_jit_compile(req, res), "symm_jit_compile");
    if (res->cache_hit != want_hit) {
        const char *env = getenv("SYMM_JIT_CACHE");
        fprintf(stderr, "runtime_bench: rank %d: expected a cache %s, got a %s%s%s%s%s%s\n", b->rank,
                want_hit ? "hit" : "miss", res->cache_hit ? "hit" : "miss",
                res->warning[0] ? ": " : "", res->warning, env ? " (SYMM_JIT_CACHE is " : "",
                env ? env : "", env ? ")" : "");
        exit(1);
    }
    return slowest(b, res->total_ms);
}

static void bench_loads(bench *b, const symm_jit_result *res)
{
    for (int i = 0; i < b->iters; i++) {
        CUmodule mod;
        barrier(b);
        double t0 = now_ms();
        check(b, symm_jit_load(res->cubin, res->cubin_size, &mod), "symm_jit_load");
        b->samples[i] = slowest(b, now_ms() - t0);
        check(b, symm_jit_unload(mod), "symm_jit_unload");
    }
    print_samples(b, "symm_jit_load (cuModuleLoadData)", b->iters, NULL);
}

static void bench_jit(bench *b)
{
    static const char *const options[] = {SYMM_NVRTC_DEFAULT_OPTIONS};
    char arch[16], sub[128];
    check(b, symm_jit_device_arch(symm_device_handle(b->dev), arch, sizeof arch), "symm_jit_device_arch");
    char *src = read_source(b);
    const char *slash = strrchr(b->cu_path, '/');
    symm_jit_request req = {.source = src, .source_name = slash ? slash + 1 : b->cu_path,
                            .arch = arch, .options = options,
                            .option_count = SYMM_ARRAY_LEN(options), .flags = SYMM_JIT_NO_CACHE};
    symm_jit_result res;
    int major = 0, minor = 0;
    double t0 = now_ms();
    check(b, symm_jit_nvrtc_version(&major, &minor), "symm_jit_nvrtc_version");
    print_one(b, "NVRTC library load", slowest(b, now_ms() - t0), NULL);
    print_one(b, "compile, first in process (no cache)", timed_compile(b, &req, false, &res), NULL);
    if (b->rank == 0)
        printf("  (%s for %s, NVRTC %d.%d, cubin %zu bytes)\n", req.source_name, arch, major, minor,
               res.cubin_size);
    symm_jit_result_free(&res);
    for (int i = 0; i < b->iters; i++) {
        b->samples[i] = timed_compile(b, &req, false, &res);
        symm_jit_result_free(&res);
    }
    b->compile_ms = print_samples(b, "compile, SYMM_JIT_NO_CACHE", b->iters, NULL);

    double hits[b->iters];
    make_cache_dir(b);
    req.flags = 0;
    req.cache_dir = sub;
    for (int i = 0; i < b->iters; i++) {
        snprintf(sub, sizeof sub, "%s/%d", b->cache_dir, i);
        b->samples[i] = timed_compile(b, &req, false, &res);
        symm_jit_result_free(&res);
        hits[i] = timed_compile(b, &req, true, &res);
        if (i + 1 < b->iters)
            symm_jit_result_free(&res);
    }
    print_samples(b, "compile, cache miss + store (fresh dir)", b->iters, NULL);
    memcpy(b->samples, hits, sizeof hits);
    char note[64];
    snprintf(note, sizeof note, "(read + verify; goal < %.0f ms)", CACHE_HIT_GOAL_MS);
    b->hit_ms = print_samples(b, "compile, cache hit", b->iters, note);
    remove_cache_dir();
    bench_loads(b, &res);
    symm_jit_result_free(&res);
    free(src);
}

/* ---- the whole run ------------------------------------------------------- */

int main(int argc, char **argv)
{
    join_times join = {.main = now_ms(), .start = process_start_ms()};
    bench *b = &g_bench;
    /* symmrun reads a pipe: the rows a failed run got through still arrive. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int rc = parse_args(argc, argv, b);
    if (rc)
        return rc;
    join.before = now_ms();
    symm_status st = symm_world_create_from_env(&b->world);
    join.after = now_ms();
    if (st != SYMM_OK) {
        fprintf(stderr, "runtime_bench: %s: %s\n(run it under symmrun: symmrun -n 2 %s --cu FILE.cu)\n",
                symm_status_name(st), symm_last_error(), argv[0]);
        return 1;
    }
    b->rank = symm_world_rank(b->world);
    b->size = symm_world_size(b->world);
    b->samples = calloc((size_t)b->iters, sizeof *b->samples);
    if (!b->samples) {
        fprintf(stderr, "runtime_bench: rank %d: out of memory\n", b->rank);
        return 1;
    }
    atexit(remove_cache_dir);

    bench_device(b);
    report_first_join(b, join);
    bench_rejoin(b);
    bench_alloc(b, 0);
    bench_alloc(b, SYMM_ALLOC_CONTIGUOUS);
    bench_jit(b);
    if (b->rank == 0)
        printf("summary n%d: join %.0f ms, alloc %zu MiB %.1f ms, NVRTC %.0f ms, hit %.2f ms "
               "(goal <%.0f ms: %s)\n", b->size, b->join_ms, b->bytes >> 20, b->alloc_ms, b->compile_ms,
               b->hit_ms, CACHE_HIT_GOAL_MS, b->hit_ms < CACHE_HIT_GOAL_MS ? "passed" : "FAIL");
    check(b, symm_device_close(b->dev), "symm_device_close");
    symm_world_destroy(b->world);
    free(b->samples);
    return 0;
}
