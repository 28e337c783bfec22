/* world_env.c: a world's configuration from the environment, and the private
 * directory that holds its rendezvous socket.
 *
 * Every SYMM_* variable of the world is read here:
 *   SYMM_RANK, SYMM_WORLD_SIZE, SYMM_LOCAL_RANK  set by symmrun (else torchrun's,
 *                       Open MPI's or Slurm's variables, in that order)
 *   SYMM_JOB_ID         names the rendezvous socket (else the launcher's job id)
 *   SYMM_JOB_SECRET     proves that a rank belongs to the job
 *   SYMM_DEVICE         CUDA device ordinal of this rank (default: local rank)
 *   SYMM_TIMEOUT        seconds any wait may take (default 60)
 *   SYMM_SOCKET_DIR     where the 0700 socket directory symm-<uid> is made
 *                       (default $XDG_RUNTIME_DIR, else /tmp)
 *   SYMM_ROOT_ADDR      host:port of rank 0's TCP rendezvous: the world spans
 *                       hosts (always wins over the launcher's)
 *   SYMM_ROOT_PORT      the port, with the host a multi-node launcher names
 *   SYMM_HOST_ID        this rank's host identity (default: the machine's)
 *   SYMM_LOCAL_SIZE     ranks on this rank's host (set by symmrun)
 * and of the launchers' variables, besides ranks and job ids, the ones that
 * say how many hosts a job spans and where rank 0 is (env_hosts).
 *
 * Without SYMM_JOB_SECRET (torchrun, mpirun and srun set none), the secret is
 * derived from the job id and the uid, which any process of this user can
 * compute: then only the uid check of every connection (SO_PEERCRED) and the
 * 0700 directory keep other users out, and the job id keeps other jobs of the
 * same user apart. Across hosts there is no uid check: the derived secret
 * keeps apart jobs that do not know each other's job id, not an attacker on
 * the network who can guess it (docs/troubleshooting.md). symmrun and the
 * Python package always set a fresh random secret. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sha256.h"
#include "world_internal.h"

enum launcher_kind { LAUNCHER_SYMMRUN, LAUNCHER_TORCHRUN, LAUNCHER_OMPI, LAUNCHER_SLURM };

/* A launcher's variables. local_size: its ranks on this host; hosts: the
 * hosts of the job (Slurm's step, else its allocation); NULL where the
 * launcher has none. */
typedef struct launcher {
    enum launcher_kind kind;
    const char *name, *rank, *size, *local;
    const char *local_size;
    const char *hosts[2];
} launcher;

static const launcher launchers[] = {
    {LAUNCHER_SYMMRUN, "symmrun", "SYMM_RANK", "SYMM_WORLD_SIZE", "SYMM_LOCAL_RANK", "SYMM_LOCAL_SIZE",
     {NULL, NULL}},
    {LAUNCHER_TORCHRUN, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", {NULL, NULL}},
    {LAUNCHER_OMPI, "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", {NULL, NULL}},
    {LAUNCHER_SLURM, "Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL,
     {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}},
};

/* The composed job id handed out by symm_world_config_from_env (Slurm's
 * "job.step", torchrun's "run:port") and the root address it composes live
 * here, per thread, until the thread's next call. */
static _Thread_local char env_job_id_buf[SYMM_WORLD_JOB_ID_MAX];
static _Thread_local char env_root_buf[SYMM_WORLD_ADDR_MAX + 16];

/* A decimal integer 0..max, digits only ("3x", "-1", " 3", "" are refused). */
static int parse_count(const char *s, long max, long *out)
{
    if (!s || !*s)
        return 0;
    long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        v = v * 10 + (*p - '0');
        if (v > max)
            return 0;
    }
    *out = v;
    return 1;
}

symm_status symm_wenv_parse_timeout(const char *call, const char *value, double *out)
{
    char *end = NULL;
    double v = 0;
    int ok = value && *value && strspn(value, "0123456789.eE+-") == strlen(value);
    if (ok) {
        errno = 0;
        v = strtod(value, &end);
        ok = errno == 0 && end && *end == '\0' && isfinite(v) && v > 0 && v <= SYMM_WORLD_MAX_TIMEOUT;
    }
    if (!ok)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "%s: SYMM_TIMEOUT: got \"%.64s\", expected a positive number of seconds "
                         "up to %g (for example 60 or 2.5)",
                         call, value ? value : "", SYMM_WORLD_MAX_TIMEOUT);
    *out = v;
    return SYMM_OK;
}

static symm_status copy_job_id(const char *call, const char *var, const char *value, const char *suffix,
                               char *buf, size_t n)
{
    if (!*value)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s is empty: expected a job id", call, var);
    int len = snprintf(buf, n, "%s%s", value, suffix);
    if (len < 0 || (size_t)len >= n) {
        if (*suffix)
            return symm_fail(SYMM_ERR_INVALID_ARG,
                             "%s: %s: %zu characters, and with \"%s\" added %zu, expected at most %zu in all",
                             call, var, strlen(value), suffix, strlen(value) + strlen(suffix), n - 1);
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: %zu characters, expected at most %zu", call, var,
                         strlen(value), n - 1);
    }
    return SYMM_OK;
}

/* The job id from the environment, in the order SYMM_JOB_ID, torchrun, Open
 * MPI (PMIx), Slurm. torchrun's default run id is "none" for every job, so its
 * MASTER_PORT (which no two live jobs on a host share) is added. Without a
 * run id (torch.multiprocessing.spawn, a launcher of one's own), the
 * MASTER_ADDR:MASTER_PORT that torch.distributed's ranks meet at names the
 * job: every rank has the same, and no two live jobs do. */
static symm_status env_job_id(const char *call, char *buf, size_t n)
{
    const char *v, *port = getenv("MASTER_PORT"), *addr = getenv("MASTER_ADDR");
    char suffix[64] = "";
    if ((v = getenv("SYMM_JOB_ID")))
        return copy_job_id(call, "SYMM_JOB_ID", v, "", buf, n);
    if ((v = getenv("TORCHELASTIC_RUN_ID"))) {
        if (port && *port)
            snprintf(suffix, sizeof suffix, ":%.32s", port);
        return copy_job_id(call, "TORCHELASTIC_RUN_ID", v, suffix, buf, n);
    }
    if (addr && *addr && port && *port) {
        snprintf(suffix, sizeof suffix, ":%.32s", port);
        return copy_job_id(call, "MASTER_ADDR", addr, suffix, buf, n);
    }
    if ((v = getenv("PMIX_NAMESPACE")))
        return copy_job_id(call, "PMIX_NAMESPACE", v, "", buf, n);
    if ((v = getenv("OMPI_MCA_orte_ess_jobid")))
        return copy_job_id(call, "OMPI_MCA_orte_ess_jobid", v, "", buf, n);
    if ((v = getenv("SLURM_JOB_ID"))) {
        const char *step = getenv("SLURM_STEP_ID");
        if (step && *step)
            snprintf(suffix, sizeof suffix, ".%.32s", step);
        return copy_job_id(call, "SLURM_JOB_ID", v, suffix, buf, n);
    }
    return symm_fail(SYMM_ERR_INVALID_ARG,
                     "%s: no job id in the environment: expected SYMM_JOB_ID (set by symmrun), "
                     "TORCHELASTIC_RUN_ID (torchrun), MASTER_ADDR and MASTER_PORT (torch.distributed), "
                     "PMIX_NAMESPACE or OMPI_MCA_orte_ess_jobid (Open MPI) or SLURM_JOB_ID (Slurm)",
                     call);
}

static symm_status env_rank_vars(const launcher *l, symm_world_config *c)
{
    static const char call[] = "symm_world_config_from_env";
    const char *rs = getenv(l->rank), *ss = getenv(l->size), *ls = getenv(l->local);
    long size, rank, local;
    if (!ss)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s is set (%s) but %s is not", call, l->rank, l->name,
                         l->size);
    if (!parse_count(ss, SYMM_WORLD_MAX_SIZE, &size) || size < 1)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: got \"%.64s\", expected a world size 1..%d", call,
                         l->size, ss, SYMM_WORLD_MAX_SIZE);
    if (!parse_count(rs, size - 1, &rank))
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: got \"%.64s\", expected a rank 0..%ld (%s is %ld)",
                         call, l->rank, rs, size - 1, l->size, size);
    /* One host: without a local rank, the rank is the local rank. */
    local = rank;
    if (ls && !parse_count(ls, size - 1, &local))
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "%s: %s: got \"%.64s\", expected a local rank 0..%ld (%s is %ld)", call, l->local,
                         ls, size - 1, l->size, size);
    c->rank = (int)rank;
    c->size = (int)size;
    c->local_rank = (int)local;
    return SYMM_OK;
}

static const char env_call[] = "symm_world_config_from_env";

/* SYMM_ROOT_PORT when set (1..65535), else dflt. */
static symm_status env_root_port(long dflt, long *port)
{
    const char *v = getenv("SYMM_ROOT_PORT");
    *port = dflt;
    if (v && (!parse_count(v, 65535, port) || *port < 1))
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: SYMM_ROOT_PORT: got \"%.64s\", expected a TCP port 1..65535",
                         env_call, v);
    return SYMM_OK;
}

/* "host:port" (an IPv6 literal in brackets) into env_root_buf. */
static const char *compose_root(const char *host, long port)
{
    int v6 = strchr(host, ':') != NULL;
    snprintf(env_root_buf, sizeof env_root_buf, "%s%.*s%s:%ld", v6 ? "[" : "", SYMM_WORLD_ADDR_MAX - 1, host,
             v6 ? "]" : "", port);
    return env_root_buf;
}

/* torchrun across hosts: rank 0 is at MASTER_ADDR; MASTER_PORT is torch's
 * store, so the rendezvous takes the next port (or SYMM_ROOT_PORT). */
static symm_status env_torchrun_root(const char *span, symm_world_config *c)
{
    const char *addr = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT");
    long master_port = 0, port;
    if (!addr || !*addr)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s, and MASTER_ADDR is not set: expected torchrun's "
                         "MASTER_ADDR, or SYMM_ROOT_ADDR=host:port of rank 0's host", env_call, span);
    if (!getenv("SYMM_ROOT_PORT") && (!mp || !parse_count(mp, 65534, &master_port) || master_port < 1))
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: MASTER_PORT: got \"%.64s\", expected a port 1..65534 "
                         "(the rendezvous takes MASTER_PORT + 1), or set SYMM_ROOT_PORT", env_call, span,
                         mp ? mp : "(unset)");
    SYMM_TRY(env_root_port(master_port + 1, &port));
    c->root_addr = compose_root(addr, port);
    return SYMM_OK;
}

/* Slurm across nodes: rank 0 runs on the first node of the step (block
 * distribution); the port comes from the job and step ids. */
static symm_status env_slurm_root(const char *span, symm_world_config *c)
{
    const char *var = "SLURM_STEP_NODELIST", *list = getenv(var), *job = getenv("SLURM_JOB_ID"),
               *step = getenv("SLURM_STEP_ID");
    if (!list || !*list)
        list = getenv(var = "SLURM_JOB_NODELIST");
    if (!list || !*list)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s, and neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST "
                         "is set: set SYMM_ROOT_ADDR=host:port of rank 0's host", env_call, span);
    char first[SYMM_WORLD_ADDR_MAX];
    if (symm_wenv_hostlist(list, 0, first, sizeof first) < 1)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: got \"%.200s\", expected a Slurm hostlist such as "
                         "\"gpu[01-04,07],login1\" (or set SYMM_ROOT_ADDR=host:port)", env_call, var, list);
    long job_id = 0, step_id = 0, port;
    if (!getenv("SYMM_ROOT_PORT") && (!job || !parse_count(job, 1L << 40, &job_id)))
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: SLURM_JOB_ID: got \"%.64s\", expected a number to "
                         "derive the rendezvous port from, or set SYMM_ROOT_PORT", env_call, span,
                         job ? job : "(unset)");
    if (!step || !parse_count(step, 1L << 40, &step_id))
        step_id = 0; /* "batch", "extern", or none */
    SYMM_TRY(env_root_port(20000 + (long)(((unsigned long long)job_id * 97 + (unsigned long long)step_id) % 12000),
                           &port));
    c->root_addr = compose_root(first, port);
    return SYMM_OK;
}

/* How many hosts the job spans, and where rank 0 listens when it is more
 * than one: the one place that knows each launcher's multi-node variables.
 * SYMM_ROOT_ADDR always wins. */
static symm_status env_hosts(const launcher *l, symm_world_config *c)
{
    const char *v;
    long n, local_size = 0;
    char span[192] = "";
    if (l->local_size && (v = getenv(l->local_size))) {
        if (!parse_count(v, c->size, &local_size) || local_size < 1)
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: got \"%.64s\", expected 1..%d (%s is %d)", env_call,
                             l->local_size, v, c->size, l->size, c->size);
        if (c->local_rank >= local_size)
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: got %d, expected a local rank 0..%ld (%s is %ld)",
                             env_call, l->local, c->local_rank, local_size - 1, l->local_size, local_size);
        if (local_size < c->size)
            snprintf(span, sizeof span, "the job spans %s%ld hosts (%s is %d, %s %ld)",
                     c->size % local_size ? "at least " : "", (c->size + local_size - 1) / local_size, l->size,
                     c->size, l->local_size, local_size);
    }
    c->local_size = (int)local_size;
    for (int i = 0; i < 2 && l->hosts[i]; i++) {
        if (!(v = getenv(l->hosts[i])))
            continue;
        if (!parse_count(v, SYMM_WORLD_MAX_SIZE, &n) || n < 1)
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: got \"%.64s\", expected a number of hosts >= 1",
                             env_call, l->hosts[i], v);
        if (n > 1)
            snprintf(span, sizeof span, "the job spans %ld hosts (%s is %ld)", n, l->hosts[i], n);
        break;
    }
    c->host_id = getenv("SYMM_HOST_ID");
    c->root_addr = getenv("SYMM_ROOT_ADDR");
    if (c->root_addr) {
        if (!*c->root_addr)
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s: SYMM_ROOT_ADDR is empty: expected host:port of rank 0's "
                             "host, or leave it unset", env_call);
        return SYMM_OK;
    }
    if (!span[0])
        return SYMM_OK; /* one host */
    switch (l->kind) {
    case LAUNCHER_TORCHRUN: return env_torchrun_root(span, c);
    case LAUNCHER_SLURM: return env_slurm_root(span, c);
    default:
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s, and %s names no rendezvous address: set "
                         "SYMM_ROOT_ADDR=host:port of rank 0's host (for example mpirun -x "
                         "SYMM_ROOT_ADDR=node01:29600)", env_call, span, l->name);
    }
}

static symm_status env_options(symm_world_config *c)
{
    static const char call[] = "symm_world_config_from_env";
    const char *v = getenv("SYMM_DEVICE");
    long device = -1;
    if (v && !parse_count(v, 1 << 20, &device))
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "%s: SYMM_DEVICE: got \"%.64s\", expected a CUDA device ordinal (an integer >= 0)",
                         call, v);
    c->device = (int)device;
    c->timeout_s = SYMM_WORLD_DEFAULT_TIMEOUT;
    if ((v = getenv("SYMM_TIMEOUT")))
        SYMM_TRY(symm_wenv_parse_timeout(call, v, &c->timeout_s));
    c->secret = getenv("SYMM_JOB_SECRET");
    if (c->secret && !*c->secret)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "%s: SYMM_JOB_SECRET is empty: expected a secret, or leave it unset", call);
    c->socket_dir = getenv("SYMM_SOCKET_DIR");
    if (c->socket_dir && c->socket_dir[0] != '/')
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: SYMM_SOCKET_DIR: got \"%.200s\", expected an absolute path",
                         call, c->socket_dir);
    SYMM_TRY(env_job_id(call, env_job_id_buf, sizeof env_job_id_buf));
    c->job_id = env_job_id_buf;
    return SYMM_OK;
}

symm_status symm_world_config_from_env(symm_world_config *cfg)
{
    if (!cfg)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_world_config_from_env: cfg is NULL");
    const launcher *l = NULL;
    for (size_t i = 0; i < SYMM_ARRAY_LEN(launchers) && !l; i++)
        if (getenv(launchers[i].rank))
            l = &launchers[i];
    if (!l)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_world_config_from_env: no rank in the environment: expected SYMM_RANK and "
                         "SYMM_WORLD_SIZE (symmrun), RANK and WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK "
                         "and OMPI_COMM_WORLD_SIZE (Open MPI), or SLURM_PROCID and SLURM_NTASKS (Slurm)");
    symm_world_config c = {0};
    SYMM_TRY(env_rank_vars(l, &c));
    SYMM_TRY(env_hosts(l, &c));
    SYMM_TRY(env_options(&c));
    *cfg = c;
    return SYMM_OK;
}

/* --- resolution for symm_world_create ---------------------------------- */

static const char create_call[] = "symm_world_create";

static symm_status resolve_timeout(const symm_world_config *cfg, double *out)
{
    double t = cfg->timeout_s;
    if (isnan(t) || t < 0 || t > SYMM_WORLD_MAX_TIMEOUT)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "%s: timeout_s %g: expected a positive number of seconds up to %g (0: "
                         "SYMM_TIMEOUT or %g)",
                         create_call, t, SYMM_WORLD_MAX_TIMEOUT, SYMM_WORLD_DEFAULT_TIMEOUT);
    if (t == 0) {
        const char *v = getenv("SYMM_TIMEOUT");
        t = SYMM_WORLD_DEFAULT_TIMEOUT;
        if (v)
            SYMM_TRY(symm_wenv_parse_timeout(create_call, v, &t));
    }
    *out = t;
    return SYMM_OK;
}

/* digest = sha256("symm-world-hello-v1", job id, secret), NUL-separated:
 * proves the secret without sending it. */
static symm_status resolve_digest(const symm_world_config *cfg, symm_wenv *env)
{
    static const char tag[] = "symm-world-hello-v1";
    char derived[64];
    const char *secret = cfg->secret ? cfg->secret : getenv("SYMM_JOB_SECRET");
    if (secret && !*secret)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: the job secret is empty: expected a secret, or none",
                         create_call);
    if (!secret) {
        snprintf(derived, sizeof derived, "derived:uid=%u", (unsigned)geteuid());
        secret = derived;
    }
    symm_sha256_ctx h;
    symm_sha256_init(&h);
    symm_sha256_update(&h, tag, sizeof tag);
    symm_sha256_update(&h, env->job_id, strlen(env->job_id) + 1);
    symm_sha256_update(&h, secret, strlen(secret));
    symm_sha256_final(&h, env->digest);
    memset(&h, 0, sizeof h);
    /* Across hosts the HMAC key: the secret of any length, as 32 bytes. */
    symm_sha256(secret, strlen(secret), env->key);
    memset(derived, 0, sizeof derived);
    return SYMM_OK;
}

void symm_wenv_machine_id(char *buf, size_t n)
{
    char host[256] = "", boot[64] = "";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0])
        snprintf(host, sizeof host, "unknown-host");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(boot, sizeof boot, f))
            boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    if (boot[0])
        snprintf(buf, n, "%.64s (boot %s)", host, boot);
    else
        snprintf(buf, n, "%.64s", host);
}

static symm_status resolve_host_id(const symm_world_config *cfg, symm_wenv *env)
{
    const char *var = "host_id", *id = cfg->host_id;
    if (!id && (id = getenv("SYMM_HOST_ID")))
        var = "SYMM_HOST_ID";
    if (!id) {
        symm_wenv_machine_id(env->host_id, sizeof env->host_id);
        return SYMM_OK;
    }
    if (!*id || strlen(id) >= sizeof env->host_id)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: got \"%.64s%s\" (%zu bytes), expected a host id of "
                         "1..%zu bytes", create_call, var, id, strlen(id) > 64 ? "..." : "", strlen(id),
                         sizeof env->host_id - 1);
    memcpy(env->host_id, id, strlen(id) + 1);
    return SYMM_OK;
}

int symm_wenv_split_addr(const char *addr, char *host, size_t n, int *port)
{
    const char *colon, *h = addr;
    size_t hl;
    if (addr[0] == '[') {
        const char *close = strchr(addr, ']');
        if (!close || close[1] != ':')
            return 0;
        h = addr + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon || memchr(addr, ':', (size_t)(colon - addr)))
            return 0; /* no port, or an IPv6 literal without brackets */
        hl = (size_t)(colon - addr);
    }
    long p;
    if (hl == 0 || hl >= n || !parse_count(colon + 1, 65535, &p) || p < 1)
        return 0;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 1;
}

static symm_status resolve_root(const symm_world_config *cfg, symm_wenv *env)
{
    const char *var = "root_addr", *addr = cfg->root_addr;
    if (!addr && (addr = getenv("SYMM_ROOT_ADDR")))
        var = "SYMM_ROOT_ADDR";
    if (!addr)
        return SYMM_OK;
    if (!symm_wenv_split_addr(addr, env->root_host, sizeof env->root_host, &env->root_port))
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: got \"%.200s\", expected host:port of rank 0's host "
                         "(for example node01:29600, 10.0.0.1:29600 or [fd00::1]:29600; port 1..65535)",
                         create_call, var, addr);
    env->root_var = var;
    return SYMM_OK;
}

/* A job id that is a plain file name names the socket; any other is hashed. */
static int plain_name(const char *s)
{
    return s[0] != '.' && s[0] != '-' && strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                   "0123456789._-+:=@") == strlen(s);
}

static symm_status resolve_paths(const symm_world_config *cfg, symm_wenv *env)
{
    const char *var = "socket_dir", *dir = cfg->socket_dir;
    if (!dir && (dir = getenv("SYMM_SOCKET_DIR")))
        var = "SYMM_SOCKET_DIR";
    if (!dir && (dir = getenv("XDG_RUNTIME_DIR")) && *dir)
        var = "XDG_RUNTIME_DIR";
    if (!dir || !*dir) {
        dir = "/tmp";
        var = "the default";
    }
    if (dir[0] != '/')
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: got \"%.200s\", expected an absolute path",
                         create_call, var, dir);
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dl--;
    int n = snprintf(env->dir, sizeof env->dir, "%.*s/symm-%u", (int)dl, dir, (unsigned)geteuid());
    char name[80];
    uint8_t h[32];
    symm_sha256(env->job_id, strlen(env->job_id), h);
    snprintf(name, sizeof name, "j-");
    for (int i = 0; i < 16; i++)
        snprintf(name + 2 + 2 * i, 3, "%02x", h[i]);
    int m = -1;
    if (plain_name(env->job_id))
        m = snprintf(env->path, sizeof env->path, "%s/%s.sock", env->dir, env->job_id);
    if (m < 0 || m >= (int)sizeof env->path)
        m = snprintf(env->path, sizeof env->path, "%s/%s.sock", env->dir, name);
    if (n < 0 || n >= (int)sizeof env->dir || m < 0 || m >= (int)sizeof env->path)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "%s: %s \"%.200s\" is too long for a socket path (at most %d bytes with "
                         "/symm-<uid>/<%zu-byte name>.sock): choose a shorter SYMM_SOCKET_DIR",
                         create_call, var, dir, SYMM_WORLD_PATH_MAX - 1, strlen(name));
    return SYMM_OK;
}

symm_status symm_wenv_resolve_as(const symm_world_config *cfg, int local, symm_wenv *env)
{
    memset(env, 0, sizeof *env);
    SYMM_TRY(resolve_timeout(cfg, &env->timeout_s));
    if (cfg->job_id)
        SYMM_TRY(copy_job_id(create_call, "job_id", cfg->job_id, "", env->job_id, sizeof env->job_id));
    else
        SYMM_TRY(env_job_id(create_call, env->job_id, sizeof env->job_id));
    SYMM_TRY(resolve_digest(cfg, env));
    SYMM_TRY(resolve_host_id(cfg, env));
    if (!local)
        SYMM_TRY(resolve_root(cfg, env));
    return resolve_paths(cfg, env);
}

symm_status symm_wenv_resolve(const symm_world_config *cfg, symm_wenv *env)
{
    return symm_wenv_resolve_as(cfg, 0, env);
}

/* --- Slurm hostlists ----------------------------------------------------- */

/* One bracket group "01-04,07" (between [ and ]): its count, and with
 * index < count the index-th value into *value, *width its digits. */
static long bracket_group(const char *s, size_t len, long index, unsigned long long *value, int *width)
{
    long count = 0;
    size_t i = 0;
    while (i < len) {
        size_t a = i;
        while (i < len && s[i] >= '0' && s[i] <= '9')
            i++;
        size_t alen = i - a;
        if (alen == 0 || alen > 18)
            return -1;
        unsigned long long lo = strtoull(s + a, NULL, 10), hi = lo;
        if (i < len && s[i] == '-') {
            size_t b = ++i;
            while (i < len && s[i] >= '0' && s[i] <= '9')
                i++;
            if (i == b || i - b > 18)
                return -1;
            hi = strtoull(s + b, NULL, 10);
        }
        if (hi < lo || hi - lo >= 1000000 || (i < len && s[i] != ','))
            return -1;
        if (i < len && ++i == len)
            return -1; /* a trailing comma */
        if (index >= count && (unsigned long long)(index - count) <= hi - lo) {
            *value = lo + (unsigned long long)(index - count);
            *width = (int)alen;
        }
        count += (long)(hi - lo + 1);
    }
    return count > 0 ? count : -1;
}

/* One name with bracket groups ("rack[1-2]-gpu[01-04]"): its count, and
 * with index < count the index-th name into buf (the last group varies
 * fastest, as Slurm orders them). */
static long hostlist_item(const char *s, size_t len, long index, char *buf, size_t n)
{
    long count = 1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ']')
            return -1;
        if (s[i] != '[')
            continue;
        const char *close = memchr(s + i, ']', len - i);
        unsigned long long v;
        int w;
        long c = close ? bracket_group(s + i + 1, (size_t)(close - s - i - 1), -1, &v, &w) : -1;
        if (c < 0 || count > 1000000000L / c)
            return -1;
        count *= c;
        i = (size_t)(close - s);
    }
    if (index < 0 || index >= count)
        return count;
    size_t used = 0;
    long radix = count;
    for (size_t i = 0; i < len; i++) {
        char piece[32];
        size_t pl = 1;
        piece[0] = s[i];
        if (s[i] == '[') {
            const char *close = memchr(s + i, ']', len - i);
            size_t glen = (size_t)(close - s - i - 1);
            unsigned long long v = 0;
            int w = 1;
            long c = bracket_group(s + i + 1, glen, -1, &v, &w);
            radix /= c;
            bracket_group(s + i + 1, glen, (index / radix) % c, &v, &w);
            pl = (size_t)snprintf(piece, sizeof piece, "%0*llu", w, v);
            i = (size_t)(close - s);
        }
        if (used + pl >= n)
            return -1;
        memcpy(buf + used, piece, pl);
        used += pl;
    }
    buf[used] = '\0';
    return count;
}

long symm_wenv_hostlist(const char *list, long index, char *buf, size_t n)
{
    long total = 0;
    const char *p = list;
    if (!p || !*p)
        return -1;
    for (;;) {
        /* An item ends at a comma outside brackets. */
        size_t len = 0;
        int depth = 0;
        while (p[len] && (depth || p[len] != ',')) {
            depth += p[len] == '[' ? 1 : p[len] == ']' ? -1 : 0;
            if (depth < 0 || depth > 1 || p[len] == ' ')
                return -1;
            len++;
        }
        if (len == 0 || depth)
            return -1;
        long c = hostlist_item(p, len, index - total, buf, n);
        if (c < 0)
            return -1;
        total += c;
        if (!p[len])
            return total;
        p += len + 1;
    }
}

symm_status symm_wenv_prepare_dir(const symm_wenv *env)
{
    uid_t uid = geteuid();
    int created = mkdir(env->dir, 0700) == 0;
    if (!created && errno != EEXIST)
        return symm_fail(SYMM_ERR_SYSTEM,
                         "%s: cannot create the socket directory %s: %s (set SYMM_SOCKET_DIR to a "
                         "writable directory)",
                         create_call, env->dir, strerror(errno));
    struct stat st;
    if (lstat(env->dir, &st) != 0)
        return symm_fail(SYMM_ERR_SYSTEM, "%s: socket directory %s: %s", create_call, env->dir,
                         strerror(errno));
    if (S_ISLNK(st.st_mode))
        return symm_fail(SYMM_ERR_SYSTEM, "%s: socket directory %s is a symbolic link: expected a directory "
                         "of uid %u with mode 0700 (remove it)", create_call, env->dir, (unsigned)uid);
    if (!S_ISDIR(st.st_mode))
        return symm_fail(SYMM_ERR_SYSTEM, "%s: socket directory %s is not a directory (remove it)",
                         create_call, env->dir);
    if (st.st_uid != uid)
        return symm_fail(SYMM_ERR_SYSTEM,
                         "%s: socket directory %s belongs to uid %u: expected this user (uid %u); "
                         "set SYMM_SOCKET_DIR elsewhere",
                         create_call, env->dir, (unsigned)st.st_uid, (unsigned)uid);
    /* A umask may have taken bits from the directory we just made. */
    if (created && (st.st_mode & 07777) != 0700) {
        if (chmod(env->dir, 0700) != 0)
            return symm_fail(SYMM_ERR_SYSTEM, "%s: chmod 0700 %s: %s", create_call, env->dir, strerror(errno));
        st.st_mode = (st.st_mode & ~07777u) | 0700;
    }
    if ((st.st_mode & 07777) != 0700)
        return symm_fail(SYMM_ERR_SYSTEM,
                         "%s: socket directory %s has mode %04o: expected 0700 (chmod 0700 it or remove it)",
                         create_call, env->dir, (unsigned)(st.st_mode & 07777));
    return SYMM_OK;
}
