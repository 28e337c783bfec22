/* jit.c: symm_jit_compile (NVRTC + the on-disk cache of jit_cache.c), the
 * environment knobs of symm_jit.h, and loading cubins with the driver. */
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"
#include "internal.h"
#include "jit_cache.h"
#include "nvrtc_api.h"
#include "sha256.h"
#include "symm_jit.h"

/* --- environment, read once ------------------------------------------- */

typedef struct jit_env {
    symm_status status;      /* SYMM_OK, or the error every compile returns */
    char message[512];
    bool cache_enabled;      /* SYMM_JIT_CACHE */
    bool dump;               /* SYMM_JIT_DUMP */
    bool lineinfo;           /* SYMM_JIT_LINEINFO */
    char cache_dir[PATH_MAX]; /* the default cache directory; "" when none */
    char no_cache_dir[256];  /* why there is none */
    char include_opt[PATH_MAX + 3]; /* "-I<cuda>/include"; "" when absent */
} jit_env;

static jit_env env;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void env_error(const char *fmt, ...) SYMM_PRINTF(1, 2);

static void env_error(const char *fmt, ...)
{
    if (env.status != SYMM_OK)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(env.message, sizeof env.message, fmt, ap);
    va_end(ap);
    env.status = SYMM_ERR_INVALID_ARG;
}

static bool env_flag(const char *name, bool fallback)
{
    const char *v = getenv(name);
    if (!v)
        return fallback;
    if (!strcmp(v, "0") || !strcmp(v, "1"))
        return v[0] == '1';
    env_error("%s=\"%s\": expected 0 or 1", name, v);
    return fallback;
}

static void env_cache_dir(void)
{
    const char *dir = getenv("SYMM_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (dir && !dir[0]) {
        env_error("SYMM_CACHE_DIR is set but empty: expected a directory "
                  "(to turn the cache off, set SYMM_JIT_CACHE=0)");
        return;
    }
    if (dir)
        n = snprintf(env.cache_dir, sizeof env.cache_dir, "%s", dir);
    else if (xdg && xdg[0] == '/')
        n = snprintf(env.cache_dir, sizeof env.cache_dir, "%s/symmgen", xdg);
    else if (home && home[0])
        n = snprintf(env.cache_dir, sizeof env.cache_dir, "%s/.cache/symmgen", home);
    else {
        snprintf(env.no_cache_dir, sizeof env.no_cache_dir,
                 "no cache directory (SYMM_CACHE_DIR, XDG_CACHE_HOME and HOME are unset)");
        return;
    }
    if (n > PATH_MAX - 100) {
        env.cache_dir[0] = '\0';
        env_error("the cache directory (from SYMM_CACHE_DIR, XDG_CACHE_HOME or HOME) is "
                  "longer than %d bytes", PATH_MAX - 100);
    }
}

static void env_include(void)
{
    const char *home = getenv("CUDA_HOME");
    char dir[PATH_MAX];
    struct stat st;
    if (!home || !home[0])
        home = "/usr/local/cuda";
    if (snprintf(dir, sizeof dir, "%s/include", home) >= (int)sizeof dir)
        return;
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(env.include_opt, sizeof env.include_opt, "-I%s", dir);
}

static void read_env(void)
{
    env.status = SYMM_OK;
    env.cache_enabled = env_flag("SYMM_JIT_CACHE", true);
    env.dump = env_flag("SYMM_JIT_DUMP", false);
    env.lineinfo = env_flag("SYMM_JIT_LINEINFO", false);
    env_cache_dir();
    env_include();
}

static symm_status jit_env_get(const jit_env **out)
{
    pthread_once(&env_once, read_env);
    if (env.status != SYMM_OK)
        return symm_fail(env.status, "symm_jit_compile: %s", env.message);
    *out = &env;
    return SYMM_OK;
}

/* --- one compile call ------------------------------------------------- */

/* Everything a compile call owns; released by job_release on every path. */
typedef struct jit_job {
    const symm_jit_request *req;
    const jit_env *env;
    const symm_nvrtc_api *nv;
    const char **options;
    size_t option_count;
    char arch_opt[64];
    uint8_t key[SYMM_SHA256_SIZE];
    char key_hex[SYMM_SHA256_HEX_SIZE];
    const char *cache_dir;   /* NULL: no cache for this call */
    const char *dir;         /* the directory of dir_fd */
    int dir_fd;              /* the checked directory (jit_cache.c), or -1 */
    bool dir_refused;        /* dir was tried and may not be used: nothing is written there */
    char entry_name[SYMM_SHA256_HEX_SIZE + 8]; /* <key>.cubin, in dir_fd */
    char entry[PATH_MAX];    /* the same as a path, for messages and the result */
    char warning[4096];
    char *ptx;               /* for SYMM_JIT_DUMP */
} jit_job;

static void job_warn(jit_job *job, const char *fmt, ...) SYMM_PRINTF(2, 3);

static void job_warn(jit_job *job, const char *fmt, ...)
{
    size_t used = strlen(job->warning);
    if (used + 3 >= sizeof job->warning)
        return;
    if (used) {
        memcpy(job->warning + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(job->warning + used, sizeof job->warning - used, fmt, ap);
    va_end(ap);
}

static void job_release(jit_job *job)
{
    free(job->options);
    free(job->ptx);
    if (job->dir_fd >= 0)
        close(job->dir_fd);
    job->dir_fd = -1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* sm_<2 or 3 digits>, optionally followed by a or f. */
static bool arch_valid(const char *arch)
{
    if (strncmp(arch, "sm_", 3) != 0)
        return false;
    size_t digits = strspn(arch + 3, "0123456789");
    const char *rest = arch + 3 + digits;
    if (digits < 2 || digits > 3)
        return false;
    return rest[0] == '\0' || ((rest[0] == 'a' || rest[0] == 'f') && rest[1] == '\0');
}

static bool sets_arch(const char *opt)
{
    return !strncmp(opt, "--gpu-architecture", 18) || !strncmp(opt, "-arch", 5);
}

static symm_status check_request(const symm_jit_request *req)
{
    if (!req)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_jit_compile: req is NULL");
    if (!req->source)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_jit_compile: req->source is NULL");
    if (!req->source_name || !req->source_name[0])
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_jit_compile: req->source_name is %s: expected a file name such "
                         "as \"dsv3_w2.cu\"", req->source_name ? "empty" : "NULL");
    if (!req->arch)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_jit_compile: %s: req->arch is NULL: expected a cubin target "
                         "such as \"sm_90a\" (see symm_jit_device_arch)", req->source_name);
    if (!arch_valid(req->arch))
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_jit_compile: %s: arch \"%s\": expected sm_<digits> with an "
                         "optional a or f suffix, such as \"sm_90a\"", req->source_name, req->arch);
    if (req->option_count && !req->options)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_jit_compile: %s: req->options is NULL with option_count %zu",
                         req->source_name, req->option_count);
    for (size_t i = 0; i < req->option_count; i++) {
        const char *o = req->options[i];
        if (!o || !o[0])
            return symm_fail(SYMM_ERR_INVALID_ARG, "symm_jit_compile: %s: option %zu is %s",
                             req->source_name, i, o ? "empty" : "NULL");
        if (sets_arch(o))
            return symm_fail(SYMM_ERR_INVALID_ARG,
                             "symm_jit_compile: %s: option \"%s\": the architecture is set "
                             "by req->arch, not by an option", req->source_name, o);
    }
    if (req->flags & ~(unsigned)SYMM_JIT_NO_CACHE)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_jit_compile: %s: flags 0x%x: expected a combination of "
                         "SYMM_JIT_NO_CACHE (0x%x)", req->source_name, req->flags,
                         (unsigned)SYMM_JIT_NO_CACHE);
    if (req->cache_dir && (!req->cache_dir[0] || strlen(req->cache_dir) > PATH_MAX - 100))
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_jit_compile: %s: req->cache_dir \"%.64s\": expected a "
                         "directory path of 1..%d bytes", req->source_name, req->cache_dir,
                         PATH_MAX - 100);
    return SYMM_OK;
}

static symm_status build_options(jit_job *job)
{
    const symm_jit_request *req = job->req;
    job->options = malloc((6 + req->option_count) * sizeof *job->options);
    if (!job->options)
        return symm_fail(SYMM_ERR_NOMEM, "symm_jit_compile: out of memory");
    snprintf(job->arch_opt, sizeof job->arch_opt, "--gpu-architecture=%s", req->arch);
    size_t n = 0;
    job->options[n++] = job->arch_opt;
    job->options[n++] = "-std=c++17";
    job->options[n++] = "-default-device";
    /* NVRTC optimises the program's kernels in parallel threads, as many as
     * there are CPUs: the same machine code (every kernel's .text compared,
     * bench_dsv3_prefill) in 300 ms instead of 430 on 2 cores. NVRTC 12.4
     * and later take the option. */
    if (job->nv->major > 12 || (job->nv->major == 12 && job->nv->minor >= 4))
        job->options[n++] = "-split-compile=0";
    if (job->env->include_opt[0])
        job->options[n++] = job->env->include_opt;
    /* A line table (no other change to the machine code), for profilers
     * that map their samples to the source: Nsight Compute's source view
     * of a variant's kernels (scripts/device-run.sh's ncu step). The option
     * is part of the cache key like every other. */
    if (job->env->lineinfo)
        job->options[n++] = "-lineinfo";
    for (size_t i = 0; i < req->option_count; i++)
        job->options[n++] = req->options[i];
    job->option_count = n;
    return SYMM_OK;
}

/* Hash one self-delimiting field: tag, NUL, 64-bit length, bytes. */
static void hash_field(symm_sha256_ctx *h, const char *tag, const void *data, size_t size)
{
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)size >> (8 * i));
    symm_sha256_update(h, tag, strlen(tag) + 1);
    symm_sha256_update(h, len, sizeof len);
    symm_sha256_update(h, data, size);
}

static void compute_key(jit_job *job)
{
    char format[16], version[32];
    symm_sha256_ctx h;
    snprintf(format, sizeof format, "%u", SYMM_JIT_CACHE_FORMAT);
    snprintf(version, sizeof version, "%d.%d", job->nv->major, job->nv->minor);
    symm_sha256_init(&h);
    hash_field(&h, "format", format, strlen(format));
    hash_field(&h, "nvrtc", version, strlen(version));
    hash_field(&h, "arch", job->req->arch, strlen(job->req->arch));
    hash_field(&h, "name", job->req->source_name, strlen(job->req->source_name));
    hash_field(&h, "source", job->req->source, strlen(job->req->source));
    for (size_t i = 0; i < job->option_count; i++)
        hash_field(&h, "option", job->options[i], strlen(job->options[i]));
    symm_sha256_final(&h, job->key);
    symm_sha256_hex(job->key, job->key_hex);
}

/* The directory of this call's cache and dumps; NULL (with a warning when
 * it matters) when there is none. */
static const char *chosen_dir(jit_job *job, bool warn)
{
    if (job->req->cache_dir)
        return job->req->cache_dir;
    if (job->env->cache_dir[0])
        return job->env->cache_dir;
    if (warn)
        job_warn(job, "%s: compiled without caching", job->env->no_cache_dir);
    return NULL;
}

/* Opens (creating it when missing) and checks the directory of the cache
 * and dumps, once per call. False, with a warning, when there is none or it
 * may not be used: then nothing is read from or written to it. */
static bool open_dir(jit_job *job, const char *what, bool warn_missing)
{
    char why[PATH_MAX + 128];
    int created;
    if (job->dir_fd >= 0)
        return true;
    if (job->dir_refused)
        return false;
    const char *dir = chosen_dir(job, warn_missing);
    if (!dir)
        return false;
    int rc = symm_jit_cache_open_dir(dir, &job->dir_fd, &created, why, sizeof why);
    if (rc == SYMM_JIT_DIR_UNAVAILABLE)
        job_warn(job, "cache directory %s cannot be created (%s): %s", dir, why, what);
    else if (rc != 0)
        job_warn(job, "cache directory %s not used (%s): %s", dir, why, what);
    job->dir_refused = rc != 0;
    job->dir = dir;
    return rc == 0;
}

/* Decide whether this call uses the cache, and where. */
static void choose_cache(jit_job *job)
{
    job->cache_dir = NULL;
    if ((job->req->flags & SYMM_JIT_NO_CACHE) || !job->env->cache_enabled)
        return;
    if (!open_dir(job, "compiled without caching", true))
        return;
    snprintf(job->entry_name, sizeof job->entry_name, "%s.cubin", job->key_hex);
    if (snprintf(job->entry, sizeof job->entry, "%s/%s", job->dir, job->entry_name) >= (int)sizeof job->entry) {
        job_warn(job, "cache directory %s: path too long: compiled without caching", job->dir);
        return;
    }
    job->cache_dir = job->dir;
}

static symm_status lookup_cache(jit_job *job, symm_jit_result *res)
{
    char why[PATH_MAX + 128];
    symm_jit_cache_lookup lookup;
    if (symm_jit_cache_read(job->dir_fd, job->entry_name, job->key, &lookup, &res->cubin, &res->cubin_size,
                            why, sizeof why) != 0) {
        job_warn(job, "cache entry %s not read (%s): compiled again", job->entry, why);
        return SYMM_OK;
    }
    if (lookup == SYMM_JIT_CACHE_FOUND)
        res->cache_hit = true;
    else if (lookup == SYMM_JIT_CACHE_INVALID)
        job_warn(job, "cache entry %s was invalid (%s): compiled again and replaced", job->entry,
                 why);
    return SYMM_OK;
}

static char *program_log(const symm_nvrtc_api *nv, nvrtcProgram prog)
{
    size_t size = 0;
    if (nv->nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size == 0)
        return strdup("");
    char *log = malloc(size);
    if (log && nv->nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS)
        log[0] = '\0';
    if (log)
        log[size - 1] = '\0';
    return log;
}

/* PTX for SYMM_JIT_DUMP, when NVRTC made some; NULL otherwise. */
static char *program_ptx(const symm_nvrtc_api *nv, nvrtcProgram prog)
{
    size_t size = 0;
    if (nv->nvrtcGetPTXSize(prog, &size) != NVRTC_SUCCESS || size <= 1)
        return NULL;
    char *ptx = malloc(size);
    if (ptx && nv->nvrtcGetPTX(prog, ptx) != NVRTC_SUCCESS) {
        free(ptx);
        return NULL;
    }
    if (ptx)
        ptx[size - 1] = '\0';
    return ptx;
}

static symm_status take_cubin(jit_job *job, nvrtcProgram prog, symm_jit_result *res)
{
    const symm_nvrtc_api *nv = job->nv;
    const symm_jit_request *req = job->req;
    size_t size = 0;
    nvrtcResult r = nv->nvrtcGetCUBINSize(prog, &size);
    if (r != NVRTC_SUCCESS || size == 0)
        return symm_fail(SYMM_ERR_NVRTC,
                         "symm_jit_compile: %s for %s: NVRTC produced no cubin (%s)",
                         req->source_name, req->arch, symm_nvrtc_error(nv, r));
    res->cubin = malloc(size);
    if (!res->cubin)
        return symm_fail(SYMM_ERR_NOMEM, "symm_jit_compile: out of memory for a %zu-byte cubin",
                         size);
    r = nv->nvrtcGetCUBIN(prog, res->cubin);
    if (r != NVRTC_SUCCESS)
        return symm_fail(SYMM_ERR_NVRTC, "symm_jit_compile: %s for %s: nvrtcGetCUBIN: %s",
                         req->source_name, req->arch, symm_nvrtc_error(nv, r));
    res->cubin_size = size;
    if (job->env->dump)
        job->ptx = program_ptx(nv, prog);
    return SYMM_OK;
}

static symm_status run_nvrtc(jit_job *job, nvrtcProgram prog, symm_jit_result *res)
{
    const symm_nvrtc_api *nv = job->nv;
    const symm_jit_request *req = job->req;
    double start = now_ms();
    nvrtcResult r = nv->nvrtcCompileProgram(prog, (int)job->option_count, job->options);
    res->compile_ms = now_ms() - start;
    res->log = program_log(nv, prog);
    if (!res->log)
        return symm_fail(SYMM_ERR_NOMEM, "symm_jit_compile: out of memory for NVRTC's log");
    if (r == NVRTC_ERROR_COMPILATION)
        return symm_fail(SYMM_ERR_NVRTC, "symm_jit_compile: NVRTC failed to compile %s for %s:\n%s",
                         req->source_name, req->arch, res->log);
    if (r != NVRTC_SUCCESS)
        return symm_fail(SYMM_ERR_NVRTC,
                         "symm_jit_compile: NVRTC failed to compile %s for %s (%s):\n%s",
                         req->source_name, req->arch, symm_nvrtc_error(nv, r), res->log);
    return take_cubin(job, prog, res);
}

static symm_status compile(jit_job *job, symm_jit_result *res)
{
    const symm_nvrtc_api *nv = job->nv;
    nvrtcProgram prog;
    nvrtcResult r = nv->nvrtcCreateProgram(&prog, job->req->source, job->req->source_name, 0,
                                           NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return symm_fail(r == NVRTC_ERROR_OUT_OF_MEMORY ? SYMM_ERR_NOMEM : SYMM_ERR_NVRTC,
                         "symm_jit_compile: nvrtcCreateProgram for %s: %s",
                         job->req->source_name, symm_nvrtc_error(nv, r));
    symm_status st = run_nvrtc(job, prog, res);
    nv->nvrtcDestroyProgram(&prog);
    return st;
}

static void store_cache(jit_job *job, const symm_jit_result *res)
{
    char why[PATH_MAX + 128];
    if (symm_jit_cache_write(job->dir_fd, job->entry_name, job->key, res->cubin, res->cubin_size, why,
                             sizeof why) != 0) {
        job_warn(job, "cache directory %s is not writable (%s): compiled without caching",
                 job->cache_dir, why);
        job->entry[0] = '\0';
    }
}

static int dump_one(jit_job *job, const char *ext, const void *data, size_t size)
{
    char name[SYMM_SHA256_HEX_SIZE + 16], why[PATH_MAX + 128];
    snprintf(name, sizeof name, "%s.%s", job->key_hex, ext);
    if (symm_jit_write_file(job->dir_fd, name, data, size, why, sizeof why) == 0)
        return 0;
    job_warn(job, "SYMM_JIT_DUMP: %s/%s not written (%s)", job->dir, name, why);
    return -1;
}

/* SYMM_JIT_DUMP=1: the source, options, cubin (and PTX and log when NVRTC
 * ran) beside the cache entry. */
static void dump(jit_job *job, const symm_jit_result *res)
{
    /* Into the directory the cache checked (or would have): never into one
     * it refused. */
    if (!chosen_dir(job, false)) {
        job_warn(job, "SYMM_JIT_DUMP: nothing written: %s", job->env->no_cache_dir);
        return;
    }
    bool refused_before = job->dir_refused; /* choose_cache said why */
    if (!open_dir(job, "SYMM_JIT_DUMP: nothing written", false)) {
        if (refused_before)
            job_warn(job, "SYMM_JIT_DUMP: nothing written (cache directory %s not used)", job->dir);
        return;
    }
    size_t len = 0;
    for (size_t i = 0; i < job->option_count; i++)
        len += strlen(job->options[i]) + 1;
    char *opts = malloc(len + 1);
    if (opts) {
        opts[0] = '\0';
        for (size_t i = 0, at = 0; i < job->option_count; i++)
            at += (size_t)sprintf(opts + at, "%s\n", job->options[i]);
        dump_one(job, "options", opts, len);
        free(opts);
    }
    if (dump_one(job, "cu", job->req->source, strlen(job->req->source)) ||
        dump_one(job, "elf", res->cubin, res->cubin_size))
        return;
    if (!res->cache_hit)
        dump_one(job, "log", res->log, strlen(res->log));
    if (job->ptx)
        dump_one(job, "ptx", job->ptx, strlen(job->ptx));
}

static symm_status run_job(jit_job *job, symm_jit_result *res)
{
    SYMM_TRY(build_options(job));
    compute_key(job);
    choose_cache(job);
    if (job->cache_dir)
        SYMM_TRY(lookup_cache(job, res));
    if (!res->cache_hit) {
        SYMM_TRY(compile(job, res));
        if (job->cache_dir)
            store_cache(job, res);
    } else {
        res->log = strdup("");
    }
    if (job->env->dump)
        dump(job, res);
    res->cache_path = strdup(job->cache_dir ? job->entry : "");
    res->warning = strdup(job->warning);
    if (!res->log || !res->cache_path || !res->warning)
        return symm_fail(SYMM_ERR_NOMEM, "symm_jit_compile: out of memory");
    return SYMM_OK;
}

symm_status symm_jit_compile(const symm_jit_request *req, symm_jit_result *res)
{
    double start = now_ms();
    if (!res)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_jit_compile: res is NULL");
    memset(res, 0, sizeof *res);
    SYMM_TRY(check_request(req));
    jit_job job = {.req = req, .dir_fd = -1};
    SYMM_TRY(jit_env_get(&job.env));
    symm_status st = symm_nvrtc(&job.nv);
    if (st != SYMM_OK)
        return symm_fail_context(st, "symm_jit_compile: %s: ", req->source_name);
    st = run_job(&job, res);
    job_release(&job);
    if (st != SYMM_OK) {
        /* Keep the log of a failed compile for the caller; drop the rest. */
        char *log = res->log;
        res->log = NULL;
        symm_jit_result_free(res);
        res->log = log;
        return st;
    }
    res->total_ms = now_ms() - start;
    return SYMM_OK;
}

/* One part of symm_jit_compile_part_list, run on a thread of its own. */
typedef struct jit_part {
    symm_jit_request req;
    const char **options;
    char define[32];
    symm_jit_result *res;
    symm_status status;
    char message[SYMM_MSG_MAX]; /* all of symm_last_error(): NVRTC's log up to 8 KiB */
} jit_part;

static void *compile_part(void *arg)
{
    jit_part *p = arg;
    p->status = symm_jit_compile(&p->req, p->res);
    if (p->status != SYMM_OK)
        snprintf(p->message, sizeof p->message, "%s", symm_last_error());
    return NULL;
}

symm_status symm_jit_compile_parts(const symm_jit_request *req, int parts, symm_jit_result *res)
{
    if (!res)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_jit_compile_parts: res is NULL");
    if (parts < 1 || parts > SYMM_JIT_MAX_PARTS)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_jit_compile_parts: parts %d: expected 1..%d", parts,
                         SYMM_JIT_MAX_PARTS);
    const int list[SYMM_JIT_MAX_PARTS] = {1, 2, 3, 4};
    _Static_assert(SYMM_JIT_MAX_PARTS == 4, "the parts 1..SYMM_JIT_MAX_PARTS");
    return symm_jit_compile_part_list(req, list, parts, res);
}

symm_status symm_jit_compile_part_list(const symm_jit_request *req, const int *list, int parts,
                                       symm_jit_result *res)
{
    if (!res || !list)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_jit_compile_part_list: %s is NULL", res ? "list" : "res");
    if (parts < 1 || parts > SYMM_JIT_MAX_PARTS)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_jit_compile_part_list: parts %d: expected 1..%d", parts,
                         SYMM_JIT_MAX_PARTS);
    for (int i = 0; i < parts; i++)
        memset(&res[i], 0, sizeof res[i]);
    for (int i = 0; i < parts; i++) {
        bool again = false;
        for (int k = 0; k < i; k++)
            again |= list[k] == list[i];
        if (list[i] < 1 || list[i] > SYMM_JIT_MAX_PARTS || again)
            return symm_fail(SYMM_ERR_INVALID_ARG,
                             "symm_jit_compile_part_list: list[%d] = %d: expected distinct parts 1..%d", i,
                             list[i], SYMM_JIT_MAX_PARTS);
    }
    SYMM_TRY(check_request(req));
    jit_part part[SYMM_JIT_MAX_PARTS];
    pthread_t thread[SYMM_JIT_MAX_PARTS];
    bool started[SYMM_JIT_MAX_PARTS] = {false};
    memset(part, 0, sizeof part);
    symm_status st = SYMM_OK;
    for (int i = 0; i < parts; i++) {
        jit_part *p = &part[i];
        p->req = *req;
        p->res = &res[i];
        p->options = malloc((req->option_count + 1) * sizeof *p->options);
        if (!p->options) {
            st = symm_fail(SYMM_ERR_NOMEM, "symm_jit_compile_part_list: out of memory");
            break;
        }
        for (size_t k = 0; k < req->option_count; k++)
            p->options[k] = req->options[k];
        snprintf(p->define, sizeof p->define, "-DSYMM_PART=%d", list[i]);
        p->options[req->option_count] = p->define;
        p->req.options = p->options;
        p->req.option_count = req->option_count + 1;
    }
    /* Parts 2.. on threads of their own, part 1 on this one; where a thread
     * cannot start, its part compiles here after part 1. */
    for (int i = 1; i < parts && st == SYMM_OK; i++)
        started[i] = pthread_create(&thread[i], NULL, compile_part, &part[i]) == 0;
    if (st == SYMM_OK)
        compile_part(&part[0]);
    for (int i = 1; i < parts && st == SYMM_OK; i++) {
        if (started[i])
            pthread_join(thread[i], NULL);
        else
            compile_part(&part[i]);
    }
    for (int i = 0; i < parts && st == SYMM_OK; i++)
        if (part[i].status != SYMM_OK)
            st = symm_fail(part[i].status, "%s", part[i].message);
    for (int i = 0; i < parts; i++)
        free(part[i].options);
    return st;
}

symm_status symm_jit_result_free(symm_jit_result *res)
{
    if (!res)
        return SYMM_OK;
    free(res->cubin);
    free(res->cache_path);
    free(res->warning);
    free(res->log);
    memset(res, 0, sizeof *res);
    return SYMM_OK;
}

symm_status symm_jit_nvrtc_version(int *major, int *minor)
{
    const symm_nvrtc_api *nv;
    if (!major || !minor)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_jit_nvrtc_version: major or minor is NULL");
    symm_status st = symm_nvrtc(&nv);
    if (st != SYMM_OK)
        return symm_fail_context(st, "symm_jit_nvrtc_version: ");
    *major = nv->major;
    *minor = nv->minor;
    return SYMM_OK;
}

/* --- architecture and loading ------------------------------------------ */

symm_status symm_jit_arch_for(int major, int minor, char *buf, size_t n)
{
    if (major < 1 || major > 99 || minor < 0 || minor > 9)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_jit_arch_for: compute capability %d.%d: expected a major of 1..99 "
                         "and a minor of 0..9",
                         major, minor);
    /* From 9.0 on, every architecture has arch-specific ("a") features. */
    const char *suffix = major >= 9 ? "a" : "";
    int need = snprintf(NULL, 0, "sm_%d%d%s", major, minor, suffix);
    if (!buf || n <= (size_t)need)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_jit_arch_for: buffer of %zu bytes: \"sm_%d%d%s\" needs %d",
                         buf ? n : 0, major, minor, suffix, need + 1);
    snprintf(buf, n, "sm_%d%d%s", major, minor, suffix);
    return SYMM_OK;
}

symm_status symm_jit_device_arch(CUdevice dev, char *buf, size_t n)
{
    const symm_cuda_api *cu;
    int major = 0, minor = 0;
    symm_status st = symm_cuda(&cu);
    if (st != SYMM_OK)
        return symm_fail_context(st, "symm_jit_device_arch: ");
    st = symm_cuda_check(
        cu->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
        "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
    if (st == SYMM_OK)
        st = symm_cuda_check(
            cu->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
            "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)");
    if (st != SYMM_OK)
        return symm_fail_context(st, "symm_jit_device_arch: device %d: ", (int)dev);
    return symm_jit_arch_for(major, minor, buf, n);
}

symm_status symm_jit_load(const void *cubin, size_t size, CUmodule *out)
{
    static const unsigned char elf_magic[4] = {0x7f, 'E', 'L', 'F'};
    const symm_cuda_api *cu;
    CUcontext ctx = NULL;
    if (!out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_jit_load: out is NULL");
    *out = NULL;
    if (!cubin || size < 64 || memcmp(cubin, elf_magic, 4) != 0)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_jit_load: %s (%zu bytes): expected a cubin (an ELF image) "
                         "from symm_jit_compile", cubin ? "not a cubin" : "cubin is NULL", size);
    symm_status st = symm_cuda(&cu);
    if (st != SYMM_OK)
        return symm_fail_context(st, "symm_jit_load: ");
    SYMM_TRY(symm_cuda_check(cu->cuCtxGetCurrent(&ctx), "symm_jit_load: cuCtxGetCurrent"));
    if (!ctx)
        return symm_fail(SYMM_ERR_STATE, "symm_jit_load: no CUDA context is current on this "
                         "thread (make one current, e.g. the device's primary context)");
    CUresult r = cu->cuModuleLoadData(out, cubin);
    if (r == CUDA_SUCCESS)
        return SYMM_OK;
    *out = NULL;
    st = symm_cuda_check(r, "cuModuleLoadData");
    if (r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_INVALID_IMAGE) {
        char driver[512];
        snprintf(driver, sizeof driver, "%s", symm_last_error());
        return symm_fail(st, "symm_jit_load: %s: the cubin was compiled for another GPU "
                         "architecture (compile for the one symm_jit_device_arch returns)",
                         driver);
    }
    return symm_fail_context(st, "symm_jit_load: ");
}

symm_status symm_jit_get_function(CUmodule mod, const char *name, CUfunction *out)
{
    const symm_cuda_api *cu;
    if (!out || !mod || !name || !name[0])
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_jit_get_function: %s is %s",
                         !out ? "out" : !mod ? "mod" : "name", !out || !mod || !name ? "NULL"
                                                                                   : "empty");
    *out = NULL;
    symm_status st = symm_cuda(&cu);
    if (st != SYMM_OK)
        return symm_fail_context(st, "symm_jit_get_function: %s: ", name);
    CUresult r = cu->cuModuleGetFunction(out, mod, name);
    if (r == CUDA_ERROR_NOT_FOUND)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_jit_get_function: no kernel \"%s\" in the module (is it "
                         "declared extern \"C\" __global__?)", name);
    st = symm_cuda_check(r, "cuModuleGetFunction");
    if (st != SYMM_OK)
        return symm_fail_context(st, "symm_jit_get_function: kernel \"%s\": ", name);
    return SYMM_OK;
}

symm_status symm_jit_unload(CUmodule mod)
{
    const symm_cuda_api *cu;
    if (!mod)
        return SYMM_OK;
    symm_status st = symm_cuda(&cu);
    if (st != SYMM_OK)
        return symm_fail_context(st, "symm_jit_unload: ");
    st = symm_cuda_check(cu->cuModuleUnload(mod), "cuModuleUnload");
    return st == SYMM_OK ? st : symm_fail_context(st, "symm_jit_unload: ");
}
