/* symmrun.c: the launcher. `symmrun -n N prog args...` starts N ranks of prog
 * on this host with the SYMM_* variables that symm_world_create_from_env()
 * reads, prefixes every line they print with their rank, passes signals on,
 * and stops the whole job when one rank fails. `--sim-hosts H` splits them
 * into H simulated hosts of this machine (a world across hosts, for tests);
 * `--hosts N --host-index I --root ADDR:PORT` starts this host's part of a
 * job on N real hosts (one symmrun per host).
 *
 * Two processes. The one the user starts (the front) passes SIGINT, SIGTERM
 * and SIGHUP on to its child, the supervisor, and exits with its status
 * (a signal inherited as ignored is discarded by the kernel and stays so:
 * nohup's SIGHUP, a background job's SIGINT).
 * The supervisor runs the job: one thread, one poll() loop over a signalfd
 * (SIGCHLD and the signals the front passes on, all blocked), every rank's
 * stdout and stderr pipe and a pipe from the front, so that no full pipe and
 * no signal is ever left waiting.
 *
 * Nothing the job starts outlives it. Each rank runs in its own process
 * group, signalled as a group, also after its leader is gone; the
 * supervisor is a subreaper (PR_SET_CHILD_SUBREAPER), so that whatever a
 * rank leaves behind (in its group or in a session of its own) becomes its
 * child once orphaned, and it ends only when it has no child left: what is
 * still running when the last rank has exited gets SIGTERM, then SIGKILL.
 * A front killed with SIGKILL closes the pipe: the supervisor then kills
 * everything at once. Ranks die with the supervisor (PR_SET_PDEATHSIG), and
 * the front, a subreaper too, kills what a killed supervisor leaves. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SYMM_VERSION
#define SYMM_VERSION "unknown"
#endif

#define MAX_RANKS 1024
#define KILL_GRACE_S 2.0
#define READ_CHUNK 65536
/* A line longer than this is cut (and each part ends with a newline). */
#define MAX_LINE (1u << 20)

static const char usage_text[] =
    "usage: symmrun -n N [--gpus LIST] [--timeout S] [--nccl-shared-gpu] [--sim-hosts H] [--] PROG [ARGS...]\n"
    "       symmrun -n N --hosts H --host-index I --root ADDR:PORT [options] [--] PROG [ARGS...]\n"
    "\n"
    "Start N ranks of PROG on this host. Each gets SYMM_RANK, SYMM_WORLD_SIZE,\n"
    "SYMM_LOCAL_RANK, SYMM_JOB_ID (unique to this run) and SYMM_JOB_SECRET (32\n"
    "fresh random bytes), which symm_world_create_from_env() reads.\n"
    "\n"
    "  -n N          number of ranks (of this host with --hosts), 1..1024\n"
    "  --gpus LIST   comma-separated device ordinals: rank r gets SYMM_DEVICE set to\n"
    "                LIST[r %% len]; without it SYMM_DEVICE is unset, and a rank\n"
    "                uses the device of its local rank\n"
    "  --timeout S   SYMM_TIMEOUT of the ranks: the seconds any wait of the world\n"
    "                may take before it fails\n"
    "  --nccl-shared-gpu  for tests with more ranks than GPUs: each rank gets its own\n"
    "                NCCL_HOSTID, SYMM_NCCL_SHARED_GPU=1, and NCCL_SOCKET_IFNAME=lo and\n"
    "                NCCL_IB_DISABLE=1 unless set, so that NCCL joins ranks that share\n"
    "                a GPU by its socket transport over loopback (correct, not fast)\n"
    "  --sim-hosts H split the N ranks, host-major, into H simulated hosts of this\n"
    "                machine (H divides N): a world across hosts, for tests. Rank r\n"
    "                is on host h = r / (N/H) and gets SYMM_HOST_ID=sim<h>, an\n"
    "                NCCL_HOSTID of its host (NCCL treats the hosts as separate\n"
    "                nodes), a SYMM_SOCKET_DIR of its host (made and removed by\n"
    "                symmrun), SYMM_LOCAL_RANK r %% (N/H), SYMM_LOCAL_SIZE N/H and\n"
    "                SYMM_ROOT_ADDR=127.0.0.1:<a free port>; NCCL_SOCKET_IFNAME=lo and\n"
    "                NCCL_IB_DISABLE=1 unless set (NCCL's network transport over\n"
    "                loopback between the simulated hosts: correct, not fast)\n"
    "  --hosts H --host-index I --root ADDR:PORT\n"
    "                this host's part of a job on H hosts, started by one symmrun\n"
    "                per host (I = 0..H-1; host 0 runs rank 0, which listens at\n"
    "                ADDR:PORT). Rank r of this host is global rank I * N + r, of\n"
    "                H * N, with SYMM_LOCAL_RANK r, SYMM_LOCAL_SIZE N and\n"
    "                SYMM_ROOT_ADDR. SYMM_JOB_SECRET must be set, the same on every\n"
    "                host (symmrun cannot make one up for the others); SYMM_JOB_ID\n"
    "                defaults to \"symmrun-ADDR:PORT\"\n"
    "  -h, --help    show this text\n"
    "  --version     show the version\n"
    "\n"
    "Every line a rank writes to stdout or stderr is written to symmrun's stdout or\n"
    "stderr with the prefix \"[r] \". Rank 0 reads symmrun's stdin unless that is a\n"
    "terminal; the other ranks read /dev/null. SIGINT, SIGTERM and SIGHUP are\n"
    "passed on to every rank (a second one kills them; one that symmrun inherits\n"
    "as ignored, as under nohup or in a script's background job, stays ignored).\n"
    "When a rank exits non-zero or is killed, the others get SIGTERM, then SIGKILL\n"
    "%g s later. Each rank runs in a process group of its own; what the ranks leave\n"
    "running once they have all exited gets SIGTERM, then SIGKILL: nothing the job\n"
    "starts outlives symmrun, even when symmrun is killed with SIGKILL.\n"
    "NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1\n"
    "are set unless already set: NVLink multicast stays off.\n"
    "\n"
    "Exit status: 0 when every rank succeeds; else that of the first rank to fail\n"
    "(128+N for a rank killed by signal N); 2 for a usage error; 127 when PROG is\n"
    "not found, 126 when it cannot be run.\n";

typedef struct options {
    int n;
    int *gpus;
    int ngpus;
    const char *timeout;
    int nccl_shared_gpu;
    int sim_hosts;        /* 0: none */
    int hosts, host_index; /* --hosts: 0: none */
    const char *root;
    char **argv;
} options;

typedef struct stream {
    int fd;  /* read end of the rank's pipe; -1 once closed */
    int out; /* 1 or 2 */
    char *buf;
    size_t len, cap;
} stream;

typedef struct rank_proc {
    pid_t pid;       /* also its process group */
    int alive;
    int group_gone;  /* its process group was found empty: never signalled again */
    stream out, err;
} rank_proc;

typedef struct job {
    options opt;
    rank_proc *ranks;
    int started, live;
    int width;          /* digits of N-1 */
    pid_t self;
    char job_id[320];
    char secret[65];
    const char *secret_env; /* --hosts: SYMM_JOB_SECRET as given */
    char sim_dir[256];      /* --sim-hosts: the per-host socket directories are sim_dir/h<h> */
    char sim_root[64];      /* --sim-hosts: 127.0.0.1:<port> */
    int failed;         /* a rank failed (or a rank could not be started) */
    int exit_code;
    double kill_at;     /* when SIGKILL follows SIGTERM; 0: not armed */
    int killed;
    int signals_seen;
    int front_fd;       /* read end of the front's pipe: EOF once the front is gone; -1 after */
    int children;       /* at the last reap: some child (a rank or an orphan) is left */
    double leftovers_kill_at; /* leftovers got SIGTERM; SIGKILL follows then; 0: not yet */
    int out_broken[3];  /* stdout/stderr of symmrun went away: drop output */
    sigset_t saved_mask;
    struct rlimit saved_nofile;
    int nofile_raised;
} job;

/* The job's world: -n ranks, or --hosts times as many. */
static int world_size(const job *j) { return j->opt.hosts ? j->opt.hosts * j->opt.n : j->opt.n; }

/* The global rank of this host's rank r. */
static int global_rank(const job *j, int r) { return j->opt.hosts ? j->opt.host_index * j->opt.n + r : r; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("symmrun: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\nTry 'symmrun --help' for more information.\n", stderr);
    va_end(ap);
    exit(2);
}

/* --- options --------------------------------------------------------------- */

static int parse_nonneg(const char *s, long max, long *out)
{
    if (!*s)
        return 0;
    long v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return 0;
        v = v * 10 + (*s - '0');
        if (v > max)
            return 0;
    }
    *out = v;
    return 1;
}

static void parse_gpus(const char *s, options *o)
{
    size_t len = strlen(s);
    o->gpus = calloc(len / 2 + 1, sizeof *o->gpus);
    if (!o->gpus) {
        fprintf(stderr, "symmrun: out of memory\n");
        exit(1);
    }
    char *copy = strdup(s), *save = NULL;
    int ok = copy && len > 0 && s[0] != ',' && s[len - 1] != ',' && !strstr(s, ",,");
    for (char *tok = ok ? strtok_r(copy, ",", &save) : NULL; ok && tok; tok = strtok_r(NULL, ",", &save)) {
        long v = 0;
        ok = parse_nonneg(tok, 1 << 20, &v);
        o->gpus[o->ngpus++] = (int)v;
    }
    free(copy);
    if (!ok || o->ngpus == 0)
        usage_error("--gpus: got \"%s\", expected a comma-separated list of device ordinals (for example 0,1)", s);
}

static void parse_timeout(const char *s)
{
    char *end = NULL;
    double v = 0;
    int ok = *s && strspn(s, "0123456789.eE+-") == strlen(s);
    if (ok) {
        errno = 0;
        v = strtod(s, &end);
        ok = errno == 0 && *end == '\0' && isfinite(v) && v > 0 && v <= 1e6;
    }
    if (!ok)
        usage_error("--timeout: got \"%s\", expected a positive number of seconds (for example 60 or 2.5)", s);
}

/* The value of option name: "--name=value", "-nVALUE" or the next argument. */
static const char *option_value(int argc, char **argv, int *i, const char *name, size_t name_len)
{
    const char *a = argv[*i];
    if (a[name_len] == '=' && a[1] == '-')
        return a + name_len + 1;
    if (a[name_len] != '\0')
        return a + name_len;
    if (*i + 1 >= argc)
        usage_error("%s: missing value", name);
    return argv[++*i];
}

/* --sim-hosts, or --hosts with --host-index and --root, not both. */
static void check_hosts(options *o)
{
    if (o->sim_hosts && (o->hosts || o->host_index || o->root))
        usage_error("--sim-hosts simulates hosts on this machine: it does not go with --hosts, --host-index "
                    "or --root");
    if (o->sim_hosts && o->n % o->sim_hosts)
        usage_error("--sim-hosts %d: expected a number of hosts that divides -n %d", o->sim_hosts, o->n);
    if (!o->hosts && !o->host_index && !o->root)
        return;
    if (!o->hosts || !o->host_index || !o->root)
        usage_error("--hosts, --host-index and --root go together: this host's index among how many, and "
                    "rank 0's ADDR:PORT");
    o->host_index--;
    if (o->host_index >= o->hosts)
        usage_error("--host-index %d: expected 0..%d (--hosts is %d)", o->host_index, o->hosts - 1, o->hosts);
    if ((long)o->hosts * o->n > 4096)
        usage_error("--hosts %d x -n %d: at most 4096 ranks in all", o->hosts, o->n);
    const char *colon = strrchr(o->root, ':');
    long port;
    if (!colon || colon == o->root || !parse_nonneg(colon + 1, 65535, &port) || port < 1)
        usage_error("--root: got \"%s\", expected ADDR:PORT of host 0 (for example node01:29600 or "
                    "[fd00::1]:29600)", o->root);
    const char *secret = getenv("SYMM_JOB_SECRET");
    if (!secret || !*secret)
        usage_error("--hosts needs SYMM_JOB_SECRET in the environment, the same on every host (for example "
                    "export SYMM_JOB_SECRET=$(openssl rand -hex 32), passed to each host): symmrun cannot "
                    "make up one that the other hosts know");
}

static void parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf(usage_text, KILL_GRACE_S);
            exit(0);
        }
        if (!strcmp(a, "--version")) {
            printf("symmrun (symmgen) %s\n", SYMM_VERSION);
            exit(0);
        }
        if (!strncmp(a, "-n", 2)) {
            const char *v = option_value(argc, argv, &i, "-n", 2);
            long n;
            if (!parse_nonneg(v, MAX_RANKS, &n) || n < 1)
                usage_error("-n: got \"%s\", expected a positive integer up to %d", v, MAX_RANKS);
            o->n = (int)n;
        } else if (!strncmp(a, "--gpus", 6) && (a[6] == '\0' || a[6] == '=')) {
            parse_gpus(option_value(argc, argv, &i, "--gpus", 6), o);
        } else if (!strncmp(a, "--timeout", 9) && (a[9] == '\0' || a[9] == '=')) {
            o->timeout = option_value(argc, argv, &i, "--timeout", 9);
            parse_timeout(o->timeout);
        } else if (!strcmp(a, "--nccl-shared-gpu")) {
            o->nccl_shared_gpu = 1;
        } else if (!strncmp(a, "--sim-hosts", 11) && (a[11] == '\0' || a[11] == '=')) {
            const char *v = option_value(argc, argv, &i, "--sim-hosts", 11);
            long h;
            if (!parse_nonneg(v, MAX_RANKS, &h) || h < 1)
                usage_error("--sim-hosts: got \"%s\", expected a positive integer up to %d", v, MAX_RANKS);
            o->sim_hosts = (int)h;
        } else if (!strncmp(a, "--hosts", 7) && (a[7] == '\0' || a[7] == '=')) {
            const char *v = option_value(argc, argv, &i, "--hosts", 7);
            long h;
            if (!parse_nonneg(v, MAX_RANKS, &h) || h < 1)
                usage_error("--hosts: got \"%s\", expected a positive integer up to %d", v, MAX_RANKS);
            o->hosts = (int)h;
        } else if (!strncmp(a, "--host-index", 12) && (a[12] == '\0' || a[12] == '=')) {
            const char *v = option_value(argc, argv, &i, "--host-index", 12);
            long h;
            if (!parse_nonneg(v, MAX_RANKS, &h))
                usage_error("--host-index: got \"%s\", expected an integer 0..(--hosts - 1)", v);
            o->host_index = (int)h + 1; /* 0: not given */
        } else if (!strncmp(a, "--root", 6) && (a[6] == '\0' || a[6] == '=')) {
            o->root = option_value(argc, argv, &i, "--root", 6);
        } else if (a[0] == '-' && a[1] != '\0') {
            usage_error("unknown option \"%s\"", a);
        } else {
            break;
        }
    }
    if (o->n == 0)
        usage_error("-n N is required");
    if (i >= argc)
        usage_error("missing PROG: what should the ranks run?");
    o->argv = argv + i;
    check_hosts(o);
}

/* execvp's search, done once before starting anything: 0, 127 (not found)
 * or 126 (found but not executable). */
static int find_program(const char *prog)
{
    if (strchr(prog, '/')) {
        if (access(prog, X_OK) == 0)
            return 0;
        return errno == ENOENT || errno == ENOTDIR ? 127 : 126;
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    int seen = 0;
    for (const char *p = path;; p++) {
        const char *end = strchr(p, ':');
        size_t dl = end ? (size_t)(end - p) : strlen(p);
        char full[PATH_MAX];
        int n = snprintf(full, sizeof full, "%.*s/%s", (int)dl, dl ? p : ".", prog);
        struct stat st;
        if (n > 0 && n < (int)sizeof full && stat(full, &st) == 0 && S_ISREG(st.st_mode)) {
            if (access(full, X_OK) == 0)
                return 0;
            seen = 1;
        }
        if (!end)
            break;
        p = end;
    }
    return seen ? 126 : 127;
}

static void random_hex(char *out, size_t bytes)
{
    unsigned char buf[64];
    size_t got = 0;
    while (got < bytes) {
        ssize_t k = getrandom(buf + got, bytes - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            fprintf(stderr, "symmrun: getrandom: %s\n", strerror(errno));
            exit(1);
        }
        got += (size_t)k;
    }
    for (size_t i = 0; i < bytes; i++)
        snprintf(out + 2 * i, 3, "%02x", buf[i]);
}

/* --- output ---------------------------------------------------------------- */

static void write_all(job *j, int fd, struct iovec *iov, int n)
{
    while (n > 0 && !j->out_broken[fd]) {
        ssize_t k = writev(fd, iov, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                struct pollfd p = {.fd = fd, .events = POLLOUT};
                poll(&p, 1, -1);
                continue;
            }
            j->out_broken[fd] = 1; /* EPIPE and the like: keep draining, drop output */
            return;
        }
        while (n > 0 && (size_t)k >= iov->iov_len) {
            k -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= (size_t)k;
        }
    }
}

/* One whole line, prefix and newline included, in one writev. */
static void write_line(job *j, int rank, int out, const char *p, size_t n)
{
    char prefix[32];
    int pl = snprintf(prefix, sizeof prefix, "[%*d] ", j->width, global_rank(j, rank));
    struct iovec iov[3] = {{prefix, (size_t)pl}, {(void *)p, n}, {"\n", 1}};
    write_all(j, out, iov, 3);
}

static void emit_lines(job *j, int rank, stream *s, int at_eof)
{
    size_t start = 0;
    for (;;) {
        char *nl = memchr(s->buf + start, '\n', s->len - start);
        if (!nl)
            break;
        write_line(j, rank, s->out, s->buf + start, (size_t)(nl - (s->buf + start)));
        start = (size_t)(nl - s->buf) + 1;
    }
    if (s->len > start && (at_eof || s->len - start >= MAX_LINE)) {
        write_line(j, rank, s->out, s->buf + start, s->len - start);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

static void stream_close(job *j, int rank, stream *s)
{
    emit_lines(j, rank, s, 1);
    close(s->fd);
    s->fd = -1;
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
}

/* Read what is there; returns 0 once the stream is closed or drained. */
static int stream_read(job *j, int rank, stream *s)
{
    if (s->cap - s->len < READ_CHUNK) {
        size_t cap = s->len + READ_CHUNK;
        char *buf = realloc(s->buf, cap);
        if (!buf) {
            stream_close(j, rank, s);
            return 0;
        }
        s->buf = buf;
        s->cap = cap;
    }
    ssize_t k = read(s->fd, s->buf + s->len, s->cap - s->len);
    if (k > 0) {
        s->len += (size_t)k;
        emit_lines(j, rank, s, 0);
        return 1;
    }
    if (k < 0 && errno == EINTR)
        return 1;
    if (k < 0 && errno == EAGAIN)
        return 0;
    stream_close(j, rank, s);
    return 0;
}

/* --- ranks ----------------------------------------------------------------- */

/* Every rank's process group, also once the rank itself is gone: what it
 * started runs on in it. A group found empty is never signalled again (its
 * number could come back as another's). Returns how many groups were there. */
static int signal_all(job *j, int sig)
{
    int groups = 0;
    for (int r = 0; r < j->started; r++) {
        rank_proc *p = &j->ranks[r];
        if (p->group_gone)
            continue;
        if (kill(-p->pid, sig) == 0) {
            groups++;
            continue;
        }
        if (p->alive)
            kill(p->pid, sig); /* its group may not exist yet */
        else if (errno == ESRCH)
            p->group_gone = 1;
    }
    return groups;
}

/* The processes whose parent is this one: the ranks, and once orphaned,
 * whatever they started (this process is their subreaper). Read from /proc;
 * returns how many were signalled. */
static int signal_children(pid_t parent, int sig)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t k = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (k <= 0)
            continue;
        buf[k] = '\0';
        /* pid (comm) state ppid ...: comm may hold anything, so from the last ')'. */
        char *close_paren = strrchr(buf, ')');
        char state;
        long ppid;
        if (!close_paren || sscanf(close_paren + 1, " %c %ld", &state, &ppid) != 2 || ppid != (long)parent)
            continue;
        if (state != 'Z' && kill((pid_t)atol(e->d_name), sig) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* All that is left of the job: every rank's group, and every child.
 * Returns how many groups and children were signalled. */
static int signal_leftovers(job *j, int sig)
{
    int n = signal_all(j, sig);
    return n + signal_children(j->self, sig);
}

static void fail_job(job *j, int code)
{
    if (j->failed)
        return;
    j->failed = 1;
    j->exit_code = code;
    signal_all(j, SIGTERM);
    j->kill_at = now_s() + KILL_GRACE_S;
}

static void setenv_int(const char *name, int v)
{
    char buf[16];
    snprintf(buf, sizeof buf, "%d", v);
    setenv(name, buf, 1);
}

/* In the child: become rank r and exec; never returns. */
static void child_exec(job *j, int r, int out_fd, int err_fd)
{
    setpgid(0, 0);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != j->self)
        _exit(137); /* symmrun is gone already */
    if (dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0)
        _exit(126);
    if (r != 0 || isatty(0)) {
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (null >= 0)
            dup2(null, 0);
    }
    if (j->nofile_raised)
        setrlimit(RLIMIT_NOFILE, &j->saved_nofile);
    sigprocmask(SIG_SETMASK, &j->saved_mask, NULL);
    setenv_int("SYMM_RANK", global_rank(j, r));
    setenv_int("SYMM_WORLD_SIZE", world_size(j));
    setenv_int("SYMM_LOCAL_RANK", r);
    setenv("SYMM_JOB_ID", j->job_id, 1);
    setenv("SYMM_JOB_SECRET", j->secret_env ? j->secret_env : j->secret, 1);
    if (j->opt.hosts) {
        setenv_int("SYMM_LOCAL_SIZE", j->opt.n);
        setenv("SYMM_ROOT_ADDR", j->opt.root, 1);
    }
    if (j->opt.sim_hosts) {
        const int per = j->opt.n / j->opt.sim_hosts, h = r / per;
        char buf[320];
        setenv_int("SYMM_LOCAL_RANK", r % per);
        setenv_int("SYMM_LOCAL_SIZE", per);
        setenv("SYMM_ROOT_ADDR", j->sim_root, 1);
        snprintf(buf, sizeof buf, "sim%d", h);
        setenv("SYMM_HOST_ID", buf, 1);
        snprintf(buf, sizeof buf, "%s/h%d", j->sim_dir, h);
        setenv("SYMM_SOCKET_DIR", buf, 1);
        snprintf(buf, sizeof buf, "symmrun-%.200s-host-%d", j->job_id, h);
        setenv("NCCL_HOSTID", buf, 1);
        /* The hosts are one machine: NCCL's network transport over loopback. */
        setenv("NCCL_SOCKET_IFNAME", "lo", 0);
        setenv("NCCL_IB_DISABLE", "1", 0);
    }
    if (j->opt.ngpus > 0)
        setenv_int("SYMM_DEVICE", j->opt.gpus[r % j->opt.ngpus]);
    else
        unsetenv("SYMM_DEVICE");
    if (j->opt.timeout)
        setenv("SYMM_TIMEOUT", j->opt.timeout, 1);
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 0);
    setenv("NVSHMEM_DISABLE_NVLS", "1", 0);
    if (j->opt.nccl_shared_gpu) {
        char host[128];
        snprintf(host, sizeof host, "symmrun-%.80s-rank-%d", j->job_id, r);
        setenv("NCCL_HOSTID", host, 1);
        setenv("SYMM_NCCL_SHARED_GPU", "1", 1);
        setenv("NCCL_SOCKET_IFNAME", "lo", 0);
        setenv("NCCL_IB_DISABLE", "1", 0);
    }
    execvp(j->opt.argv[0], j->opt.argv);
    int err = errno;
    dprintf(2, "symmrun: %s: %s\n", j->opt.argv[0], strerror(err));
    _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
}

static int spawn(job *j, int r)
{
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(err, O_CLOEXEC) != 0) {
        close(out[0]);
        close(out[1]);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0)
        child_exec(j, r, out[1], err[1]);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        close(out[0]);
        close(err[0]);
        return -1;
    }
    setpgid(pid, pid); /* also done by the child: whoever is first */
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    j->ranks[r] = (rank_proc){.pid = pid, .alive = 1, .out = {.fd = out[0], .out = 1},
                              .err = {.fd = err[0], .out = 2}};
    j->started++;
    j->live++;
    return 0;
}

/* Reaps every child that ended: ranks, and orphans that came to this
 * subreaper. j->children says whether any child is left. */
static void reap(job *j)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
            j->children = !(pid < 0 && errno == ECHILD);
            return;
        }
        int r = 0;
        while (r < j->started && j->ranks[r].pid != pid)
            r++;
        if (r == j->started || !j->ranks[r].alive)
            continue;
        j->ranks[r].alive = 0;
        j->live--;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code == 0 || j->failed)
            continue;
        if (WIFSIGNALED(status))
            fprintf(stderr, "symmrun: rank %d was killed by signal %d (%s)%s\n", r, WTERMSIG(status),
                    strsignal(WTERMSIG(status)), j->live ? "; stopping the other ranks" : "");
        else
            fprintf(stderr, "symmrun: rank %d exited with status %d%s\n", r, code,
                    j->live ? "; stopping the other ranks" : "");
        fail_job(j, code);
    }
}

static void handle_signals(job *j, int sfd)
{
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        int sig = (int)si.ssi_signo;
        if (sig == SIGCHLD) {
            reap(j);
        } else if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            /* Pass it on; a second one means "now". */
            signal_all(j, ++j->signals_seen > 1 ? SIGKILL : sig);
        }
    }
}

/* The front is gone (killed with SIGKILL): nobody is waiting for the job
 * any more, so all of it is killed now. */
static void front_gone(job *j)
{
    close(j->front_fd);
    j->front_fd = -1;
    if (!j->failed) {
        j->failed = 1;
        j->exit_code = 128 + SIGKILL;
    }
    signal_leftovers(j, SIGKILL);
    j->killed = 1;
    j->leftovers_kill_at = now_s();
}

/* Every rank has exited: what they left running gets SIGTERM, and SIGKILL
 * (again and again, as orphans keep coming) once the grace period is over. */
static void stop_leftovers(job *j)
{
    double now = now_s();
    if (j->leftovers_kill_at == 0) {
        if (signal_leftovers(j, SIGTERM) > 0)
            fprintf(stderr, "symmrun: the ranks left processes running: stopping them\n");
        j->leftovers_kill_at = now + KILL_GRACE_S;
    } else if (now >= j->leftovers_kill_at) {
        signal_leftovers(j, SIGKILL);
    }
}

static void event_loop(job *j, int sfd)
{
    int cap = 2 + 2 * j->started;
    struct pollfd *pfd = calloc((size_t)cap, sizeof *pfd);
    stream **who = calloc((size_t)cap, sizeof *who);
    int *who_rank = calloc((size_t)cap, sizeof *who_rank);
    if (!pfd || !who || !who_rank) {
        fprintf(stderr, "symmrun: out of memory\n");
        signal_all(j, SIGKILL);
        exit(1);
    }
    reap(j);
    while (j->live > 0 || j->children) {
        if (j->live == 0)
            stop_leftovers(j);
        int n = 0;
        pfd[n++] = (struct pollfd){.fd = sfd, .events = POLLIN};
        int front_at = j->front_fd >= 0 ? n : -1;
        if (j->front_fd >= 0)
            pfd[n++] = (struct pollfd){.fd = j->front_fd, .events = POLLIN};
        for (int r = 0; r < j->started; r++) {
            stream *ss[2] = {&j->ranks[r].out, &j->ranks[r].err};
            for (int k = 0; k < 2; k++)
                if (ss[k]->fd >= 0) {
                    who[n] = ss[k];
                    who_rank[n] = r;
                    pfd[n++] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
                }
        }
        int ms = -1;
        if (j->kill_at > 0 && !j->killed) {
            double left = j->kill_at - now_s();
            ms = left <= 0 ? 0 : (int)ceil(left * 1000);
        }
        /* Leftovers are looked for again every 50 ms: orphans keep coming. */
        if (j->live == 0 || (j->leftovers_kill_at > 0 && j->killed))
            ms = ms < 0 || ms > 50 ? 50 : ms;
        int k = poll(pfd, (nfds_t)n, ms);
        if (k < 0 && errno != EINTR) {
            fprintf(stderr, "symmrun: poll: %s\n", strerror(errno));
            signal_all(j, SIGKILL);
            exit(1);
        }
        if (j->kill_at > 0 && !j->killed && now_s() >= j->kill_at) {
            signal_all(j, SIGKILL);
            j->killed = 1;
        }
        for (int i = 1; k > 0 && i < n; i++)
            if (pfd[i].revents && i != front_at)
                stream_read(j, who_rank[i], who[i]);
        if (k > 0 && front_at > 0 && pfd[front_at].revents) {
            char c;
            if (read(j->front_fd, &c, 1) <= 0)
                front_gone(j);
        }
        if (k > 0 && pfd[0].revents)
            handle_signals(j, sfd);
        if (j->leftovers_kill_at > 0 && j->killed && j->front_fd < 0)
            signal_leftovers(j, SIGKILL);
        reap(j);
    }
    /* Every rank is gone: what they wrote is in the pipes. Whatever they left
     * running in the background may hold a pipe open; do not wait for it. */
    for (int r = 0; r < j->started; r++) {
        stream *ss[2] = {&j->ranks[r].out, &j->ranks[r].err};
        for (int s = 0; s < 2; s++) {
            while (ss[s]->fd >= 0 && stream_read(j, r, ss[s]))
                ;
            if (ss[s]->fd >= 0)
                stream_close(j, r, ss[s]);
        }
    }
    free(who_rank);
    free(who);
    free(pfd);
}

/* The signals both processes read from a signalfd. */
static void handled_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGCHLD);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
}

/* Blocks what the signalfds read, and SIGPIPE (a closed stdout is an EPIPE
 * to handle, not death) and SIGTTOU (the supervisor, in a process group of
 * its own, may write to a terminal with TOSTOP set); the ranks get the mask
 * symmrun started with. */
static int setup_signals(job *j)
{
    sigset_t set;
    handled_signals(&set);
    sigaddset(&set, SIGPIPE);
    sigaddset(&set, SIGTTOU);
    if (sigprocmask(SIG_BLOCK, &set, &j->saved_mask) != 0)
        return -1;
    handled_signals(&set);
    return signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

/* Two pipes per rank must fit under the descriptor limit. */
static void raise_nofile(job *j)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)(2 * j->opt.n + 32);
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need)
        return;
    j->saved_nofile = rl;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
        j->nofile_raised = 1;
}

/* Remove path and what it holds (the simulated hosts' socket directories:
 * a few levels of directories and sockets). */
static void remove_tree(const char *path, int depth)
{
    DIR *d = depth < 4 ? opendir(path) : NULL;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode))
            remove_tree(sub, depth + 1);
        else
            unlink(sub);
    }
    if (d)
        closedir(d);
    rmdir(path);
}

/* --sim-hosts: a socket directory per host under a fresh 0700 directory,
 * and a free port of 127.0.0.1 for the rendezvous. */
static int sim_setup(job *j)
{
    const char *base = getenv("SYMM_SOCKET_DIR");
    if (!base || base[0] != '/')
        base = getenv("XDG_RUNTIME_DIR");
    if (!base || base[0] != '/')
        base = "/tmp";
    snprintf(j->sim_dir, sizeof j->sim_dir, "%.200s/symmrun-sim-XXXXXX", base);
    if (!mkdtemp(j->sim_dir)) {
        fprintf(stderr, "symmrun: --sim-hosts: cannot make a directory in %s: %s\n", base, strerror(errno));
        return -1;
    }
    for (int h = 0; h < j->opt.sim_hosts; h++) {
        char sub[300];
        snprintf(sub, sizeof sub, "%s/h%d", j->sim_dir, h);
        if (mkdir(sub, 0700) != 0) {
            fprintf(stderr, "symmrun: --sim-hosts: mkdir %s: %s\n", sub, strerror(errno));
            remove_tree(j->sim_dir, 0);
            return -1;
        }
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr = {.s_addr = htonl(INADDR_LOOPBACK)}};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len)) {
        fprintf(stderr, "symmrun: --sim-hosts: no free port on 127.0.0.1: %s\n", strerror(errno));
        if (fd >= 0)
            close(fd);
        remove_tree(j->sim_dir, 0);
        return -1;
    }
    close(fd);
    snprintf(j->sim_root, sizeof j->sim_root, "127.0.0.1:%d", ntohs(a.sin_port));
    return 0;
}

/* The supervisor (see the top of the file): runs the job, returns its
 * exit status. front_fd reads EOF once the front is gone. */
static int supervise(job *j, int front_fd)
{
    j->self = getpid();
    j->front_fd = front_fd;
    setpgid(0, 0); /* terminal signals reach the front, which passes them on once */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
        fprintf(stderr, "symmrun: PR_SET_CHILD_SUBREAPER: %s\n", strerror(errno));
        return 1;
    }
    sigset_t set;
    handled_signals(&set);
    int sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0) {
        fprintf(stderr, "symmrun: signals: %s\n", strerror(errno));
        return 1;
    }
    raise_nofile(j);
    j->ranks = calloc((size_t)j->opt.n, sizeof *j->ranks);
    if (!j->ranks) {
        fprintf(stderr, "symmrun: out of memory\n");
        return 1;
    }
    if (j->opt.sim_hosts && sim_setup(j) != 0)
        return 1;
    for (int r = 0; r < j->opt.n; r++)
        if (spawn(j, r) != 0) {
            fprintf(stderr, "symmrun: cannot start rank %d: %s\n", r, strerror(errno));
            fail_job(j, 1);
            break;
        }
    event_loop(j, sfd);
    if (j->opt.sim_hosts)
        remove_tree(j->sim_dir, 0);
    return j->failed ? j->exit_code : 0;
}

/* The front, once the supervisor has ended some other way than by itself
 * (SIGKILL): the orphans it leaves come here (a subreaper too) and are
 * killed until none is left. */
static void kill_orphans(pid_t self)
{
    double until = now_s() + 10.0;
    for (;;) {
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
            ;
        if (pid < 0 || now_s() > until)
            return;
        signal_children(self, SIGKILL);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* The front: starts the supervisor, passes SIGINT, SIGTERM and SIGHUP on to
 * it, and returns its exit status (128+N when it was killed by signal N). */
static int front(job *j, int sfd)
{
    pid_t self = getpid();
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
        fprintf(stderr, "symmrun: PR_SET_CHILD_SUBREAPER: %s\n", strerror(errno));
        return 1;
    }
    int alive[2];
    if (pipe2(alive, O_CLOEXEC) != 0) {
        fprintf(stderr, "symmrun: pipe: %s\n", strerror(errno));
        return 1;
    }
    pid_t sup = fork();
    if (sup < 0) {
        fprintf(stderr, "symmrun: fork: %s\n", strerror(errno));
        return 1;
    }
    if (sup == 0) {
        close(alive[1]);
        close(sfd);
        exit(supervise(j, alive[0]));
    }
    close(alive[0]);
    int code = -1;
    while (code < 0) {
        struct pollfd p = {.fd = sfd, .events = POLLIN};
        if (poll(&p, 1, -1) < 0 && errno != EINTR) {
            fprintf(stderr, "symmrun: poll: %s\n", strerror(errno));
            kill(sup, SIGKILL);
        }
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
            int sig = (int)si.ssi_signo;
            if (sig != SIGCHLD) {
                kill(sup, sig);
                continue;
            }
            int status;
            pid_t pid;
            while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
                if (pid == sup)
                    code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
    }
    kill_orphans(self);
    return code;
}

int main(int argc, char **argv)
{
    static job j;
    parse_args(argc, argv, &j.opt);
    int missing = find_program(j.opt.argv[0]);
    if (missing) {
        fprintf(stderr, "symmrun: %s: %s\n", j.opt.argv[0],
                missing == 127 ? "command not found" : "permission denied (not executable)");
        return missing;
    }
    j.self = getpid();
    char rnd[17];
    random_hex(rnd, 8);
    snprintf(j.job_id, sizeof j.job_id, "symmrun-%ld-%s", (long)j.self, rnd);
    random_hex(j.secret, 32);
    if (j.opt.hosts) {
        /* Every host's symmrun must name the same job and secret. */
        const char *id = getenv("SYMM_JOB_ID");
        if (id && *id)
            snprintf(j.job_id, sizeof j.job_id, "%.255s", id);
        else
            snprintf(j.job_id, sizeof j.job_id, "symmrun-%.240s", j.opt.root);
        j.secret_env = getenv("SYMM_JOB_SECRET");
    }
    for (int n = world_size(&j) - 1; n > 0; n /= 10)
        j.width++;
    if (j.width == 0)
        j.width = 1;
    int sfd = setup_signals(&j);
    if (sfd < 0) {
        fprintf(stderr, "symmrun: signals: %s\n", strerror(errno));
        return 1;
    }
    return front(&j, sfd);
}
