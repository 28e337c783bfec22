/* jit_bench.c: what the JIT costs at job start, for one .cu file: loading
 * NVRTC, the first compile in a process, a compile in a warm process, a
 * cache miss that also stores the entry, a cache hit, and (with a GPU)
 * loading the cubin. Our caches go to a temporary directory, removed at the
 * end.
 *
 *   jit_bench FILE.cu [--arch sm_90a] [--iters N] [--evict] [--parts N] [-- NVRTC options...]
 *
 * --parts 2 compiles the file as the runtime compiles a native variant:
 * dispatch and combine as two programs at once (symm_jit_compile_parts; the
 * NCCL backend adds its own kernels as a third); the times are wall times of
 * all parts, the cubin sizes part 1's.
 *
 * The default arch is sm_90a (Hopper), GPU or not. With a GPU, CUDA is
 * initialised first (cuInit, the primary context of device 0), as the
 * runtime does before it compiles a variant, and that time is printed on its
 * own: NVRTC 13 opens the driver too (below), and on a freshly started
 * machine the first cuInit alone takes hundreds of milliseconds.
 *
 * NVRTC 13 keeps a cache of its own where a driver is present, in the
 * driver's compute cache (~/.nv/ComputeCache; CUDA_CACHE_DISABLE=1 turns it
 * off, CUDA_CACHE_PATH moves it). A compile "without cache" here bypasses
 * ours, not NVRTC's: run once more with CUDA_CACHE_DISABLE=1 for what NVRTC
 * itself costs. The header says which it is.
 *
 * --evict drops NVRTC's library files from the page cache first
 * (posix_fadvise DONTNEED; pages a process maps stay), as on a host where
 * something else pushed them out; the share of each file in the page cache
 * is printed before the first compile. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"
#include "nvrtc_api.h"
#include "symm_jit.h"

static int g_parts = 1; /* --parts */

typedef struct bench_args {
    const char *file;
    const char *arch;
    int iters;
    bool evict;
    const char *const *options;
    size_t option_count;
} bench_args;

static int usage(const char *why)
{
    fprintf(stderr, "jit_bench: %s\nusage: jit_bench FILE.cu [--arch sm_90a] [--iters N] "
                    "[--evict] [--parts N] [-- NVRTC options...]\n", why);
    return 2;
}

static int parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.arch = "sm_90a", .iters = 10};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            a->options = (const char *const *)argv + i + 1;
            a->option_count = (size_t)(argc - i - 1);
            break;
        } else if (!strcmp(argv[i], "--arch") && i + 1 < argc) {
            a->arch = argv[++i];
        } else if (!strcmp(argv[i], "--parts") && i + 1 < argc) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > SYMM_JIT_MAX_PARTS)
                return usage("--parts: expected 1..4");
            g_parts = (int)n;
        } else if (!strcmp(argv[i], "--evict")) {
            a->evict = true;
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 10000)
                return usage("--iters: expected an integer of 1..10000");
            a->iters = (int)n;
        } else if (argv[i][0] == '-' || a->file) {
            fprintf(stderr, "jit_bench: unexpected argument \"%s\"\n", argv[i]);
            return usage("bad arguments");
        } else {
            a->file = argv[i];
        }
    }
    return a->file ? 0 : usage("no FILE.cu given");
}

static char *read_source(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "jit_bench: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *src = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (src && fread(src, 1, (size_t)n, f) == (size_t)n) {
        src[n] = '\0';
    } else {
        fprintf(stderr, "jit_bench: cannot read %s\n", path);
        free(src);
        src = NULL;
    }
    fclose(f);
    return src;
}

/* The share of path's pages in the page cache (mincore), in percent; -1
 * when it cannot be read. With evict, its clean pages that no process maps
 * are dropped from the cache first. */
static double cached_percent(const char *path, bool evict, double *mb)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (evict)
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    off_t size = lseek(fd, 0, SEEK_END);
    double pct = -1;
    void *map = size > 0 ? mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (map != MAP_FAILED) {
        const long page = sysconf(_SC_PAGESIZE);
        const size_t pages = ((size_t)size + (size_t)page - 1) / (size_t)page;
        unsigned char *vec = malloc(pages);
        if (vec && mincore(map, (size_t)size, vec) == 0) {
            size_t in = 0;
            for (size_t i = 0; i < pages; i++)
                in += vec[i] & 1;
            pct = 100.0 * (double)in / (double)pages;
        }
        free(vec);
        munmap(map, (size_t)size);
    }
    close(fd);
    *mb = (double)size / 1e6;
    return pct;
}

/* The files of the NVRTC that was opened: the library, and the builtins
 * library it opens at its first compile (same directory). */
static int nvrtc_files(char (*paths)[PATH_MAX])
{
    const symm_nvrtc_api *nv;
    Dl_info info;
    if (symm_nvrtc(&nv) != SYMM_OK || !dladdr((void *)nv->nvrtcVersion, &info) || !info.dli_fname)
        return 0;
    const char *slash = strrchr(info.dli_fname, '/');
    const int dir = slash ? (int)(slash - info.dli_fname + 1) : 0;
    snprintf(paths[0], PATH_MAX, "%s", info.dli_fname);
    snprintf(paths[1], PATH_MAX, "%.*slibnvrtc-builtins.so.%d.%d", dir, info.dli_fname, nv->major, nv->minor);
    return access(paths[1], R_OK) == 0 ? 2 : 1;
}

/* --evict, then how much of NVRTC's files is cached. */
static void page_cache(const bench_args *a)
{
    char paths[2][PATH_MAX];
    const int n = nvrtc_files(paths);
    double mb;
    for (int i = 0; a->evict && i < n; i++)
        cached_percent(paths[i], true, &mb);
    for (int i = 0; i < n; i++) {
        double pct = cached_percent(paths[i], false, &mb);
        printf("  page cache before the first compile%s: %s (%.1f MB): %.0f%% cached\n",
               a->evict ? " (after --evict)" : "", paths[i], mb, pct);
    }
}

static double ms_between(const struct timespec *t0, const struct timespec *t1)
{
    return (double)(t1->tv_sec - t0->tv_sec) * 1e3 + (double)(t1->tv_nsec - t0->tv_nsec) / 1e6;
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, double *ms, int n)
{
    qsort(ms, (size_t)n, sizeof *ms, compare_double);
    printf("  %-38s median %9.3f ms   min %9.3f ms\n", what, ms[n / 2], ms[0]);
}

/* --parts N: the source is compiled as N parts at once, as the runtime does
 * (symm_jit_compile_parts); *res is then part 1 and the time the wall time. */
static symm_status compile_as_parts(symm_jit_request *req, symm_jit_result *res)
{
    if (g_parts == 1)
        return symm_jit_compile(req, res);
    symm_jit_result part[SYMM_JIT_MAX_PARTS];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    symm_status st = symm_jit_compile_parts(req, g_parts, part);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    bool hit = true;
    for (int i = 1; i < g_parts; i++) {
        hit &= part[i].cache_hit;
        symm_jit_result_free(&part[i]);
    }
    *res = part[0];
    res->cache_hit &= hit;
    res->total_ms = ms_between(&t0, &t1);
    return st;
}

/* One compile; on failure prints why and returns -1. */
static int compile(symm_jit_request *req, symm_jit_result *res, double *ms, bool want_hit)
{
    symm_status st = compile_as_parts(req, res);
    if (st != SYMM_OK) {
        fprintf(stderr, "jit_bench: %s\n", symm_last_error());
        symm_jit_result_free(res);
        return -1;
    }
    if (res->warning[0])
        fprintf(stderr, "jit_bench: warning: %s\n", res->warning);
    if (res->cache_hit != want_hit) {
        fprintf(stderr, "jit_bench: expected a cache %s, got a %s\n", want_hit ? "hit" : "miss",
                res->cache_hit ? "hit" : "miss");
        symm_jit_result_free(res);
        return -1;
    }
    *ms = res->total_ms;
    return 0;
}

/* CUDA initialised as the runtime does before compiling: cuInit and the
 * primary context of device 0, made current. False without a GPU. */
static bool cuda_start(CUdevice *dev, double *ms)
{
    const symm_cuda_api *cu;
    CUcontext ctx;
    int count = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (symm_cuda(&cu) != SYMM_OK || cu->cuDeviceGetCount(&count) != CUDA_SUCCESS || !count ||
        cu->cuDeviceGet(dev, 0) != CUDA_SUCCESS || cu->cuDevicePrimaryCtxRetain(&ctx, *dev) != CUDA_SUCCESS ||
        cu->cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return false;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *ms = ms_between(&t0, &t1);
    return true;
}

/* Module load times (the context of cuda_start is current). */
static void bench_load(const symm_jit_result *res, int iters, double *ms)
{
    for (int i = 0; i < iters; i++) {
        CUmodule mod;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        symm_status st = symm_jit_load(res->cubin, res->cubin_size, &mod);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (st != SYMM_OK) {
            printf("  %-38s failed: %s\n", "module load (symm_jit_load):", symm_last_error());
            return;
        }
        ms[i] = ms_between(&t0, &t1);
        symm_jit_unload(mod);
    }
    report("module load (symm_jit_load):", ms, iters);
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int run(const bench_args *a, const char *src, const char *dir, double *ms)
{
    char sub[300];
    symm_jit_result res;
    symm_jit_request req = {.source = src, .source_name = a->file, .arch = a->arch,
                            .options = a->options, .option_count = a->option_count,
                            .cache_dir = dir};
    int major = 0, minor = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (symm_jit_nvrtc_version(&major, &minor) != SYMM_OK) {
        fprintf(stderr, "jit_bench: %s\n", symm_last_error());
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double load_ms = ms_between(&t0, &t1);
    page_cache(a);
    CUdevice dev;
    double cuda_ms = 0;
    const bool gpu = cuda_start(&dev, &cuda_ms);
    if (compile(&req, &res, &ms[0], false))
        return -1;
    const char *off = getenv("CUDA_CACHE_DISABLE");
    printf("jit_bench: %s for %s, NVRTC %d.%d, cubin %zu bytes, %d iterations, %d part(s); NVRTC's own cache %s\n",
           a->file, a->arch, major, minor, res.cubin_size, a->iters, g_parts,
           !gpu ? "off (no driver)" : off && !strcmp(off, "1") ? "off (CUDA_CACHE_DISABLE=1)" : "on (the driver's compute cache)");
    printf("  %-38s %9.3f ms\n", "NVRTC library load (dlopen):", load_ms);
    if (gpu)
        printf("  %-38s %9.3f ms\n", "CUDA init (cuInit, context):", cuda_ms);
    printf("  %-38s %9.3f ms (NVRTC %.3f ms)\n", "first compile in process:", ms[0],
           res.compile_ms);
    symm_jit_result_free(&res);

    req.flags = SYMM_JIT_NO_CACHE;
    for (int i = 0; i < a->iters; i++) {
        if (compile(&req, &res, &ms[i], false))
            return -1;
        symm_jit_result_free(&res);
    }
    report("compile, warm process (no cache):", ms, a->iters);

    req.flags = 0;
    req.cache_dir = sub;
    for (int i = 0; i < a->iters; i++) {
        snprintf(sub, sizeof sub, "%s/miss%d", dir, i);
        if (compile(&req, &res, &ms[i], false))
            return -1;
        symm_jit_result_free(&res);
    }
    report("cache miss + store:", ms, a->iters);

    req.cache_dir = dir;
    for (int i = 0; i < a->iters; i++) {
        if (compile(&req, &res, &ms[i], true))
            return -1;
        if (i + 1 < a->iters)
            symm_jit_result_free(&res);
    }
    report("cache hit (read + verify):", ms, a->iters);
    if (gpu) {
        bench_load(&res, a->iters, ms);
        const symm_cuda_api *cu;
        if (symm_cuda(&cu) == SYMM_OK)
            cu->cuDevicePrimaryCtxRelease(dev);
    } else {
        printf("  %-38s skipped: no GPU\n", "module load (symm_jit_load):");
    }
    symm_jit_result_free(&res);
    return 0;
}

int main(int argc, char **argv)
{
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    char *src = read_source(a.file);
    if (!src)
        return 1;
    char dir[] = "/tmp/symm-jit-bench-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "jit_bench: mkdtemp: %s\n", strerror(errno));
        free(src);
        return 1;
    }
    double *ms = malloc(sizeof *ms * (size_t)a.iters);
    rc = ms && run(&a, src, dir, ms) == 0 ? 0 : 1;
    nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
    free(ms);
    free(src);
    return rc;
}
