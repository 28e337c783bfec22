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
 * and of the launchers' variables, besides ranks and job ids, the ones that
 * say how many hosts a job spans (env_one_host).
 *
 * Without SYMM_JOB_SECRET (torchrun, mpirun and srun set none), the secret is
 * derived from the job id and the uid, which any process of this user can
 * compute: then only the uid check of every connection (SO_PEERCRED) and the
 * 0700 directory keep other users out, and the job id keeps other jobs of the
 * same user apart. symmrun always sets a fresh random secret. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sha256.h"
#include "world_internal.h"

/* A launcher's variables. local_size: its ranks on this host; hosts: the
 * hosts of the job (Slurm's step, else its allocation); NULL where the
 * launcher has none. */
typedef struct launcher {
    const char *name, *rank, *size, *local;
    const char *local_size;
    const char *hosts[2];
} launcher;

static const launcher launchers[] = {
    {"symmrun", "SYMM_RANK", "SYMM_WORLD_SIZE", "SYMM_LOCAL_RANK", NULL, {NULL, NULL}},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", {NULL, NULL}},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", {NULL, NULL}},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}},
};

/* The composed job id handed out by symm_world_config_from_env (Slurm's
 * "job.step", torchrun's "run:port") lives here, per thread, until the
 * thread's next call. */
static _Thread_local char env_job_id_buf[SYMM_WORLD_JOB_ID_MAX];

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

/* A world holds the ranks of one host: a job that spans several fails here,
 * at once, instead of waiting SYMM_TIMEOUT at create for ranks that can
 * never reach this host's socket. The one place that knows it (worlds across
 * hosts replace this check). */
static symm_status env_one_host(const launcher *l, long size)
{
    static const char call[] = "symm_world_config_from_env";
    const char *v;
    long n;
    for (int i = 0; i < 2 && l->hosts[i]; i++) {
        if (!(v = getenv(l->hosts[i])))
            continue;
        if (!parse_count(v, SYMM_WORLD_MAX_SIZE, &n) || n < 1)
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: got \"%.64s\", expected a number of hosts >= 1",
                             call, l->hosts[i], v);
        if (n > 1)
            return symm_fail(SYMM_ERR_UNSUPPORTED,
                             "%s: the job spans %ld hosts (%s is %ld), and a world holds the ranks of one "
                             "host: run the job on one host",
                             call, n, l->hosts[i], n);
        return SYMM_OK;
    }
    if (!l->local_size || !(v = getenv(l->local_size)))
        return SYMM_OK;
    if (!parse_count(v, size, &n) || n < 1)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s: got \"%.64s\", expected 1..%ld (%s is %ld)", call,
                         l->local_size, v, size, l->size, size);
    if (n < size)
        return symm_fail(SYMM_ERR_UNSUPPORTED,
                         "%s: the job spans %s%ld hosts (%s is %ld, %s %ld), and a world holds the ranks of "
                         "one host: run the job on one host",
                         call, size % n ? "at least " : "", (size + n - 1) / n, l->size, size, l->local_size, n);
    return SYMM_OK;
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
    SYMM_TRY(env_one_host(l, c.size));
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

symm_status symm_wenv_resolve(const symm_world_config *cfg, symm_wenv *env)
{
    memset(env, 0, sizeof *env);
    SYMM_TRY(resolve_timeout(cfg, &env->timeout_s));
    if (cfg->job_id)
        SYMM_TRY(copy_job_id(create_call, "job_id", cfg->job_id, "", env->job_id, sizeof env->job_id));
    else
        SYMM_TRY(env_job_id(create_call, env->job_id, sizeof env->job_id));
    SYMM_TRY(resolve_digest(cfg, env));
    return resolve_paths(cfg, env);
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
