/* compile.c: `symmgen --compile`: NVRTC-compiles every generated variant as
 * the runtime's JIT does at create (runtime/jit.c, symm_jit_compile_parts):
 * the same source cut in the same programs, dispatch, combine, the NCCL
 * backend's kernels and, with combine = "auto", the pulling combine
 * (-DSYMM_PART=1, 2, 3, 4; create compiles 1 and 2, and 4 with "auto", or
 * 1..3 for the NCCL backend), with the same options (SG_NVRTC_OPTIONS),
 * so a spec that passes here compiles at job start too. Only -split-compile=0
 * is left out: it spreads one program over threads (the same code, about 20%
 * more CPU), and symmgen already spreads the programs over threads. Reports a
 * time per variant and per program. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nvrtc.h>

#include "sg.h"

#define MAX_THREADS 8

bool sg_arch_valid(const char *arch)
{
    if (!arch || strncmp(arch, "sm_", 3) != 0)
        return false;
    const char *p = arch + 3;
    if (*p < '0' || *p > '9')
        return false;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p == 'a' || *p == 'f')
        p++;
    return *p == '\0' && p - arch < 16;
}

/* The NN of "sm_NN[a|f]" (90 for sm_90a, 100 for sm_100a); 0 when arch
 * is not valid. */
static int arch_number(const char *arch)
{
    if (!sg_arch_valid(arch))
        return 0;
    int n = 0;
    for (const char *p = arch + 3; *p >= '0' && *p <= '9' && n < 100000; p++)
        n = n * 10 + (*p - '0');
    return n;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static char *dup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dup_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

static char *program_log(nvrtcProgram prog)
{
    size_t size = 0;
    if (nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size <= 1)
        return NULL;
    char *log = malloc(size);
    if (log && nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) {
        free(log);
        return NULL;
    }
    /* Drop the trailing newlines: callers print it as one message. */
    size_t n = strlen(log);
    while (n > 0 && log[n - 1] == '\n')
        log[--n] = '\0';
    return log;
}

int sg_nvrtc_compile(const char *program_name, const char *source, size_t len, const char *arch, int part,
                     double *ms, char **log)
{
    char arch_option[32], part_option[32];
    snprintf(arch_option, sizeof arch_option, "--gpu-architecture=%s", arch);
    snprintf(part_option, sizeof part_option, "-DSYMM_PART=%d", part);
    const char *options[8] = {arch_option, SG_NVRTC_OPTIONS};
    int n_options = 1 + (int)(sizeof(const char *[]){SG_NVRTC_OPTIONS} / sizeof(const char *));
    if (part > 0)
        options[n_options++] = part_option;
    double start = now_ms();
    *log = NULL;
    *ms = 0;
    if (strlen(source) != len) {
        *log = dup_printf("%s: the source holds a NUL byte at offset %zu", program_name, strlen(source));
        return -1;
    }
    nvrtcProgram prog;
    nvrtcResult rc = nvrtcCreateProgram(&prog, source, program_name, 0, NULL, NULL);
    if (rc != NVRTC_SUCCESS) {
        *log = dup_printf("%s: nvrtcCreateProgram: %s", program_name, nvrtcGetErrorString(rc));
        return -1;
    }
    rc = nvrtcCompileProgram(prog, n_options, options);
    *ms = now_ms() - start;
    char *text = program_log(prog);
    nvrtcDestroyProgram(&prog);
    if (rc == NVRTC_SUCCESS) {
        *log = text; /* warnings, if any */
        return 0;
    }
    *log = dup_printf("%s%s%s: NVRTC (%s) failed: %s%s%s", program_name, part > 0 ? ", " : "",
                      part > 0 ? sg_part_name(part) : "", arch, nvrtcGetErrorString(rc), text ? "\n" : "",
                      text ? text : "");
    free(text);
    return -1;
}

const char *sg_part_name(int part)
{
    static const char *const names[SG_PARTS + 1] = {"every kernel", "dispatch", "combine", "NCCL and hybrid backends",
                                                    "pulling combine"};
    return part >= 0 && part <= SG_PARTS ? names[part] : "?";
}

bool sg_part_applies(const sg_variant *v, int part)
{
    return part >= 1 && part <= SG_PARTS && (part != 4 || v->combine == SYMM_COMBINE_AUTO);
}

/* Shared by the compiling threads. The work is one unit per (variant,
 * part): unit u is part u % SG_PARTS + 1 of variant u / SG_PARTS (a part
 * the variant lacks is done at once, compiling nothing). */
typedef struct pool {
    const sg_generated *const *gens;
    size_t n, units;
    const sg_compile_opts *opts;
    pthread_mutex_t lock;
    size_t next, done, variants_done;
    int *parts_done;      /* per variant */
    bool failed;          /* stop handing out work */
    int *rc;              /* per unit */
    char **logs;
    double *ms;
    double start_ms;
    const char *current;  /* the variant started last */
} pool;

/* Under the lock, on a terminal: the bottom line, rewritten in place, says
 * how far the compilation is and which variant was started last. */
static void progress(pool *p)
{
    if (p->opts->verbosity < 2 || p->done >= p->units)
        return;
    fprintf(stderr, "\r\033[K[%zu/%zu] compiling %s for %s, %.1f s", p->variants_done, p->n, p->current,
            p->opts->arch, (now_ms() - p->start_ms) / 1e3);
    fflush(stderr);
}

/* Under the lock, once every part of variant v is done: one line on stderr
 * with NVRTC's time for each of its programs, and their warnings. */
static void report(pool *p, size_t v)
{
    const sg_compile_opts *o = p->opts;
    if (o->verbosity <= 0)
        return;
    if (o->verbosity >= 2)
        fputs("\r\033[K", stderr);
    const size_t u = v * SG_PARTS;
    const sg_variant *var = p->gens[v]->variant;
    bool ok = true;
    double total = 0;
    for (int k = 0; k < SG_PARTS; k++) {
        ok &= p->rc[u + (size_t)k] == 0;
        total += p->ms[u + (size_t)k];
    }
    if (ok) {
        fprintf(stderr, "compiled %s for %s in %.0f ms (", var->name, o->arch, total);
        for (int k = 0; k < SG_PARTS; k++)
            if (sg_part_applies(var, k + 1))
                fprintf(stderr, "%s%s %.0f", k ? ", " : "", sg_part_name(k + 1), p->ms[u + (size_t)k]);
        fputs(" ms)\n", stderr);
        for (int k = 0; k < SG_PARTS; k++)
            if (p->logs[u + (size_t)k])
                fprintf(stderr, "%s\n", p->logs[u + (size_t)k]);
    }
    progress(p);
}

static void *worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t u = p->next;
        if (p->failed || u >= p->units) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        p->next++;
        p->current = p->gens[u / SG_PARTS]->variant->name;
        progress(p);
        pthread_mutex_unlock(&p->lock);

        const sg_generated *g = p->gens[u / SG_PARTS];
        const int part = (int)(u % SG_PARTS) + 1;
        /* The program name the runtime gives NVRTC. */
        char program[SG_NAME_MAX + 8];
        snprintf(program, sizeof program, "%s.cu", g->variant->name);
        double ms = 0;
        char *log = NULL;
        int rc = sg_part_applies(g->variant, part)
                     ? sg_nvrtc_compile(program, g->cu.data ? g->cu.data : "", g->cu.len, p->opts->arch, part,
                                        &ms, &log)
                     : 0;

        pthread_mutex_lock(&p->lock);
        p->rc[u] = rc;
        p->logs[u] = log;
        p->ms[u] = ms;
        p->done++;
        p->failed |= rc != 0;
        if (++p->parts_done[u / SG_PARTS] == SG_PARTS) {
            p->variants_done++;
            report(p, u / SG_PARTS);
        }
        pthread_mutex_unlock(&p->lock);
    }
}

static int thread_count(const sg_compile_opts *o, size_t n)
{
    long t = o->threads > 0 ? o->threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (t < 1)
        t = 1;
    if (t > MAX_THREADS)
        t = MAX_THREADS;
    if ((size_t)t > n)
        t = (long)n;
    return (int)t;
}

int sg_compile_all(const sg_generated *const *gens, size_t n, const sg_compile_opts *o, sg_diag *diag)
{
    /* The kernels use Hopper's instructions: an older target would fail in
     * NVRTC with pages of errors. */
    if (arch_number(o->arch) < SG_MIN_ARCH) {
        sg_diag_add(diag, "--arch %s: the generated kernels need a Hopper (sm_90) or newer GPU", o->arch);
        return SG_EXIT_USAGE;
    }
    if (n == 0)
        return SG_EXIT_OK;
    const size_t units = n * SG_PARTS;
    pool p = {.gens = gens, .n = n, .units = units, .opts = o, .start_ms = now_ms()};
    p.rc = calloc(units, sizeof *p.rc);
    p.logs = calloc(units, sizeof *p.logs);
    p.ms = calloc(units, sizeof *p.ms);
    p.parts_done = calloc(n, sizeof *p.parts_done);
    if (!p.rc || !p.logs || !p.ms || !p.parts_done) {
        free(p.rc), free(p.logs), free(p.ms), free(p.parts_done);
        sg_diag_add(diag, "internal error: out of memory");
        return SG_EXIT_INTERNAL;
    }
    for (size_t u = 0; u < units; u++)
        p.rc[u] = 1; /* not compiled */
    pthread_mutex_init(&p.lock, NULL);

    int threads = thread_count(o, units);
    pthread_t tids[MAX_THREADS];
    int started = 0;
    for (; started < threads - 1; started++)
        if (pthread_create(&tids[started], NULL, worker, &p) != 0)
            break;
    worker(&p); /* this thread works too, so one thread always runs */
    for (int t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
    pthread_mutex_destroy(&p.lock);

    /* One message per failing variant: its first failing program's log (an
     * error in code the parts share fails each of them the same way). */
    int status = SG_EXIT_OK;
    double total = 0;
    size_t programs = 0;
    for (size_t v = 0; v < n; v++) {
        bool reported = false;
        for (size_t u = v * SG_PARTS; u < (v + 1) * SG_PARTS; u++) {
            total += p.ms[u];
            programs += sg_part_applies(gens[v]->variant, (int)(u % SG_PARTS) + 1);
            if (p.rc[u] < 0 && !reported) {
                sg_diag_add(diag, "%s", p.logs[u] ? p.logs[u] : "NVRTC failed without a log");
                reported = true;
                status = SG_EXIT_COMPILE;
            }
            free(p.logs[u]);
        }
    }
    if (o->verbosity >= 2)
        fputs("\r\033[K", stderr);
    if (status == SG_EXIT_OK && o->verbosity > 0)
        fprintf(stderr, "compiled %zu variant%s for %s in %.0f ms (NVRTC %.0f ms, %zu programs over %d thread%s)\n",
                n, n == 1 ? "" : "s", o->arch, now_ms() - p.start_ms, total, programs, threads, threads == 1 ? "" : "s");
    free(p.rc), free(p.logs), free(p.ms), free(p.parts_done);
    return status;
}
