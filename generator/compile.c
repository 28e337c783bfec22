/* compile.c: `symmgen --compile`: NVRTC-compiles every generated variant with
 * exactly the options the runtime's JIT uses (SG_NVRTC_OPTIONS), so a spec
 * that passes here compiles at job start too. NVRTC is thread-safe; the
 * variants are spread over a few threads. Reports a time per variant. */
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

int sg_nvrtc_compile(const char *program_name, const char *source, size_t len, const char *arch,
                     double *ms, char **log)
{
    char arch_option[32];
    snprintf(arch_option, sizeof arch_option, "--gpu-architecture=%s", arch);
    const char *options[] = {SG_NVRTC_OPTIONS, arch_option};
    const int n_options = (int)(sizeof options / sizeof options[0]);
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
    *log = dup_printf("%s: NVRTC (%s) failed: %s%s%s", program_name, arch, nvrtcGetErrorString(rc),
                      text ? "\n" : "", text ? text : "");
    free(text);
    return -1;
}

/* Shared by the compiling threads. */
typedef struct pool {
    const sg_generated *const *gens;
    size_t n;
    const sg_compile_opts *opts;
    pthread_mutex_t lock;
    size_t next, done;
    bool failed;          /* stop handing out work */
    int *rc;
    char **logs;
    double *ms;
    double start_ms;
    const char *current;  /* the variant started last */
} pool;

/* Under the lock, on a terminal: the bottom line, rewritten in place, says
 * how far the compilation is and which variant was started last. */
static void progress(pool *p)
{
    if (p->opts->verbosity < 2 || p->done >= p->n)
        return;
    fprintf(stderr, "\r\033[K[%zu/%zu] compiling %s for %s, %.1f s", p->done, p->n, p->current,
            p->opts->arch, (now_ms() - p->start_ms) / 1e3);
    fflush(stderr);
}

/* Under the lock: one finished variant on stderr. */
static void report(pool *p, size_t i)
{
    const sg_compile_opts *o = p->opts;
    if (o->verbosity <= 0)
        return;
    if (o->verbosity >= 2)
        fputs("\r\033[K", stderr);
    if (p->rc[i] == 0) {
        fprintf(stderr, "compiled %s for %s in %.0f ms\n", p->gens[i]->variant->name, o->arch, p->ms[i]);
        if (p->logs[i])
            fprintf(stderr, "%s\n", p->logs[i]);
    }
    progress(p);
}

static void *worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t i = p->next;
        if (p->failed || i >= p->n) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        p->next++;
        p->current = p->gens[i]->variant->name;
        progress(p);
        pthread_mutex_unlock(&p->lock);

        const sg_generated *g = p->gens[i];
        char program[SG_NAME_MAX + 8];
        snprintf(program, sizeof program, "%s.cu", g->variant->name);
        double ms = 0;
        char *log = NULL;
        int rc = sg_nvrtc_compile(program, g->cu.data ? g->cu.data : "", g->cu.len, p->opts->arch,
                                  &ms, &log);

        pthread_mutex_lock(&p->lock);
        p->rc[i] = rc;
        p->logs[i] = log;
        p->ms[i] = ms;
        p->done++;
        p->failed |= rc != 0;
        report(p, i);
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
    pool p = {.gens = gens, .n = n, .opts = o, .start_ms = now_ms()};
    p.rc = calloc(n, sizeof *p.rc);
    p.logs = calloc(n, sizeof *p.logs);
    p.ms = calloc(n, sizeof *p.ms);
    if (!p.rc || !p.logs || !p.ms) {
        free(p.rc), free(p.logs), free(p.ms);
        sg_diag_add(diag, "internal error: out of memory");
        return SG_EXIT_INTERNAL;
    }
    for (size_t i = 0; i < n; i++)
        p.rc[i] = 1; /* not compiled */
    pthread_mutex_init(&p.lock, NULL);

    int threads = thread_count(o, n);
    pthread_t tids[MAX_THREADS];
    int started = 0;
    for (; started < threads - 1; started++)
        if (pthread_create(&tids[started], NULL, worker, &p) != 0)
            break;
    worker(&p); /* this thread works too, so one thread always runs */
    for (int t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
    pthread_mutex_destroy(&p.lock);

    int status = SG_EXIT_OK;
    double total = 0;
    for (size_t i = 0; i < n; i++) {
        total += p.ms[i];
        if (p.rc[i] < 0) {
            sg_diag_add(diag, "%s", p.logs[i] ? p.logs[i] : "NVRTC failed without a log");
            status = SG_EXIT_COMPILE;
        }
        free(p.logs[i]);
    }
    if (o->verbosity >= 2)
        fputs("\r\033[K", stderr);
    if (status == SG_EXIT_OK && o->verbosity > 0)
        fprintf(stderr, "compiled %zu variant%s for %s in %.0f ms (NVRTC %.0f ms over %d thread%s)\n", n,
                n == 1 ? "" : "s", o->arch, now_ms() - p.start_ms, total, threads, threads == 1 ? "" : "s");
    free(p.rc), free(p.logs), free(p.ms);
    return status;
}
