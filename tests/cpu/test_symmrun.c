/* test_symmrun.c: the launcher ($SYMM_BUILD_DIR/bin/symmrun) from outside:
 * exit codes, output prefixes, the ranks' environment, signals, usage
 * errors, and that no rank outlives it. The ranks are /bin/sh scripts, and in
 * one test this binary itself (a constructor takes over when
 * SYMM_TEST_WORLD_CHILD is set) joining a real world. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "symm_world.h"
#include "world_fork.h"

/* --- a rank of the world test: this binary run by symmrun ------------------ */

__attribute__((constructor)) static void world_child(void)
{
    if (!getenv("SYMM_TEST_WORLD_CHILD"))
        return;
    symm_world *w;
    symm_status st = symm_world_create_from_env(&w);
    if (st) {
        fprintf(stderr, "create: %s\n", symm_last_error());
        _exit(3);
    }
    int n = symm_world_size(w), me = symm_world_rank(w), *all = calloc((size_t)n, sizeof *all);
    int mine = 100 + me * me;
    st = symm_world_allgather(w, &mine, all, sizeof mine);
    int ok = st == SYMM_OK;
    for (int r = 0; ok && r < n; r++)
        ok = all[r] == 100 + r * r;
    printf("world rank %d of %d: %s\n", me, n, ok ? "allgather ok" : symm_last_error());
    printf("rank %d: host %d of %d (%s), local rank %d of %d\n", me, symm_world_host(w), symm_world_host_count(w),
           symm_world_host_name(w, symm_world_host(w)), symm_world_local_rank(w), symm_world_local_size(w));
    fflush(stdout);
    symm_world_destroy(w);
    free(all);
    _exit(ok ? 0 : 4);
}

/* --- running symmrun --------------------------------------------------------- */

TestSuite(symmrun, .fini = wf_cleanup_tempdirs);

typedef struct run {
    pid_t pid;
    int fd[2]; /* its stdout, stderr; -1 at EOF */
    char *buf[2];
    size_t len[2];
    int code; /* exit code, 128+signal, or -1 while running */
    double t0, elapsed;
} run;

static const char *symmrun_path(void)
{
    static char path[4096];
    const char *dir = getenv("SYMM_BUILD_DIR");
    snprintf(path, sizeof path, "%s/bin/symmrun", dir ? dir : "build");
    cr_assert_eq(access(path, X_OK), 0, "%s is not there: run through make, which sets SYMM_BUILD_DIR", path);
    return path;
}

/* The child's signals as a terminal's foreground job has them: a signal
 * the test runner inherited as ignored (a shell's background job ignores
 * SIGINT and SIGQUIT, nohup SIGHUP) would stay ignored across exec, and
 * symmrun rightly keeps it so. */
static void default_signals(void)
{
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], SIG_DFL);
}

/* start, with `ignored` (0: none) ignored in symmrun from its start. */
static void start_ignoring(run *r, const char *const *args, int ignored)
{
    const char *argv[64] = {symmrun_path()};
    int n = 1;
    for (; args[n - 1]; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    int out[2], err[2];
    cr_assert(pipe(out) == 0 && pipe(err) == 0);
    memset(r, 0, sizeof *r);
    r->code = -1;
    r->t0 = wf_now();
    r->pid = fork();
    cr_assert(r->pid >= 0);
    if (r->pid == 0) {
        default_signals();
        if (ignored)
            signal(ignored, SIG_IGN);
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]);
        close(err[0]);
        close(out[1]);
        close(err[1]);
        execv(argv[0], (char *const *)argv);
        _exit(99);
    }
    close(out[1]);
    close(err[1]);
    r->fd[0] = out[0];
    r->fd[1] = err[0];
}

static void start(run *r, const char *const *args) { start_ignoring(r, args, 0); }

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Read symmrun's output until both pipes are at EOF, until stdout holds
 * needle `count` times (needle non-NULL), or until `until`. */
static void pump(run *r, double until, const char *needle, int count)
{
    while (r->fd[0] >= 0 || r->fd[1] >= 0) {
        if (needle && r->buf[0] && count_of(r->buf[0], needle) >= count)
            return;
        struct pollfd p[2] = {{.fd = r->fd[0], .events = POLLIN}, {.fd = r->fd[1], .events = POLLIN}};
        int ms = (int)((until - wf_now()) * 1000);
        if (ms <= 0 || poll(p, 2, ms) == 0)
            return;
        for (int k = 0; k < 2; k++) {
            if (r->fd[k] < 0 || !p[k].revents)
                continue;
            r->buf[k] = realloc(r->buf[k], r->len[k] + 65536 + 1);
            ssize_t got = read(r->fd[k], r->buf[k] + r->len[k], 65536);
            if (got <= 0) {
                close(r->fd[k]);
                r->fd[k] = -1;
                got = 0;
            }
            r->len[k] += (size_t)got;
            r->buf[k][r->len[k]] = '\0';
        }
    }
}

/* Collect everything and the exit code; a symmrun still running after
 * timeout seconds is killed and the test fails. */
static void finish(run *r, double timeout)
{
    double until = wf_now() + timeout;
    pump(r, until, NULL, 0);
    int st = 0;
    while (waitpid(r->pid, &st, WNOHANG) == 0) {
        if (wf_now() > until) {
            kill(r->pid, SIGKILL);
            waitpid(r->pid, &st, 0);
            cr_assert_fail("symmrun still running after %g s; stderr: %s", timeout, r->buf[1] ? r->buf[1] : "");
        }
        wf_sleep(0.005);
    }
    r->elapsed = wf_now() - r->t0;
    r->code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    for (int k = 0; k < 2; k++) {
        if (!r->buf[k])
            r->buf[k] = calloc(1, 1);
        if (r->fd[k] >= 0)
            close(r->fd[k]);
    }
}

static void release(run *r)
{
    free(r->buf[0]);
    free(r->buf[1]);
}

static run run_symmrun(const char *const *args, double timeout)
{
    run r;
    start(&r, args);
    finish(&r, timeout);
    return r;
}

static uint32_t rnd(uint32_t below)
{
    uint32_t v;
    wf_random(&v, sizeof v);
    return v % below;
}

static void random_word(char *buf, size_t n)
{
    char hex[65];
    wf_secret(hex);
    snprintf(buf, n, "w%.12s", hex);
}

/* A temp file the ranks append their pids to, and the pids read back. */
static int read_pids(const char *path, pid_t *pids, int max)
{
    FILE *f = fopen(path, "r");
    int n = 0;
    long v;
    while (f && n < max && fscanf(f, "%ld", &v) == 1)
        pids[n++] = (pid_t)v;
    if (f)
        fclose(f);
    return n;
}

static void assert_all_dead(const char *pidfile, int want)
{
    pid_t pids[16];
    int n = read_pids(pidfile, pids, 16);
    cr_assert_eq(n, want, "%d rank pids recorded, expected %d", n, want);
    for (int i = 0; i < n; i++)
        cr_assert(kill(pids[i], 0) != 0 && errno == ESRCH, "rank process %d is still alive", pids[i]);
}

static void make_pidfile(char *dir, size_t dn, char *file, size_t fn)
{
    wf_tempdir(dir, dn);
    snprintf(file, fn, "%s/pids", dir);
    FILE *f = fopen(file, "w");
    cr_assert(f);
    fclose(f);
}

/* --- exit codes and stopping ------------------------------------------------- */

Test(symmrun, all_ranks_succeed_exit_0)
{
    char word[32];
    random_word(word, sizeof word);
    run r = run_symmrun((const char *[]){"-n", "3", "--", "/bin/sh", "-c", "echo $1", "sh", word, NULL}, 10);
    cr_assert_eq(r.code, 0, "exit %d; stderr: %s", r.code, r.buf[1]);
    cr_assert_eq(count_of(r.buf[0], word), 3, "stdout: %s", r.buf[0]);
    release(&r);
}

static const char stop_script[] =
    "if [ \"$SYMM_RANK\" = 1 ]; then\n"
    "  while [ \"$(wc -l < \"$1\")\" -lt 2 ]; do sleep 0.01; done\n"
    "  exit \"$2\"\n"
    "fi\n"
    "[ \"$3\" = ignore ] && trap '' TERM\n"
    "echo $$ >> \"$1\"\n"
    "exec sleep 30\n";

Test(symmrun, failing_rank_exit_code_propagates_and_the_others_are_killed_quickly)
{
    char dir[128], pidfile[192], code[8];
    make_pidfile(dir, sizeof dir, pidfile, sizeof pidfile);
    int want = 3 + (int)rnd(100);
    snprintf(code, sizeof code, "%d", want);
    run r = run_symmrun((const char *[]){"-n", "3", "/bin/sh", "-c", stop_script, "sh", pidfile, code, "die",
                                         NULL},
                        10);
    cr_assert_eq(r.code, want, "exit %d, expected %d; stderr: %s", r.code, want, r.buf[1]);
    cr_assert(r.elapsed < 1.8, "took %.2f s: the sleeping ranks were not stopped by SIGTERM", r.elapsed);
    cr_assert(strstr(r.buf[1], "rank 1 exited with status"), "stderr: %s", r.buf[1]);
    assert_all_dead(pidfile, 2);
    release(&r);
    wf_rmtree(dir);
}

Test(symmrun, rank_ignoring_sigterm_is_killed_after_the_grace_period)
{
    char dir[128], pidfile[192];
    make_pidfile(dir, sizeof dir, pidfile, sizeof pidfile);
    run r = run_symmrun((const char *[]){"-n", "3", "/bin/sh", "-c", stop_script, "sh", pidfile, "9", "ignore",
                                         NULL},
                        10);
    cr_assert_eq(r.code, 9, "exit %d; stderr: %s", r.code, r.buf[1]);
    cr_assert(r.elapsed > 1.9 && r.elapsed < 4.5, "took %.2f s; expected SIGKILL 2 s after SIGTERM", r.elapsed);
    assert_all_dead(pidfile, 2);
    release(&r);
    wf_rmtree(dir);
}

Test(symmrun, rank_killed_by_a_signal_gives_128_plus_signal)
{
    static const char *names[] = {"USR1", "USR2", "ALRM"};
    static const int numbers[] = {SIGUSR1, SIGUSR2, SIGALRM};
    int k = (int)rnd(3);
    run r = run_symmrun((const char *[]){"-n", "2", "/bin/sh", "-c",
                                         "if [ \"$SYMM_RANK\" = 0 ]; then kill -s $1 $$; fi; exec sleep 30", "sh",
                                         names[k], NULL},
                        10);
    cr_assert_eq(r.code, 128 + numbers[k], "exit %d for SIG%s; stderr: %s", r.code, names[k], r.buf[1]);
    cr_assert(r.elapsed < 1.8, "took %.2f s", r.elapsed);
    release(&r);
}

/* --- output ------------------------------------------------------------------ */

Test(symmrun, output_lines_are_prefixed_with_the_rank)
{
    char word[32], line[64];
    random_word(word, sizeof word);
    run r = run_symmrun((const char *[]){"-n", "2", "/bin/sh", "-c",
                                         "echo out$SYMM_RANK$1; echo err$SYMM_RANK$1 >&2; printf tail$SYMM_RANK",
                                         "sh", word, NULL},
                        10);
    cr_assert_eq(r.code, 0, "stderr: %s", r.buf[1]);
    for (int rank = 0; rank < 2; rank++) {
        snprintf(line, sizeof line, "[%d] out%d%s\n", rank, rank, word);
        cr_assert(strstr(r.buf[0], line), "stdout lacks \"%s\": %s", line, r.buf[0]);
        snprintf(line, sizeof line, "[%d] err%d%s\n", rank, rank, word);
        cr_assert(strstr(r.buf[1], line), "stderr lacks \"%s\": %s", line, r.buf[1]);
        snprintf(line, sizeof line, "[%d] tail%d\n", rank, rank);
        cr_assert(strstr(r.buf[0], line), "the partial last line \"%s\" is missing: %s", line, r.buf[0]);
    }
    cr_assert_null(strstr(r.buf[0], "err"), "stderr leaked into stdout: %s", r.buf[0]);
    release(&r);
}

Test(symmrun, prefix_is_padded_to_the_widest_rank)
{
    run r = run_symmrun((const char *[]){"-n", "11", "/bin/sh", "-c", "echo x$SYMM_RANK", NULL}, 10);
    cr_assert_eq(r.code, 0, "stderr: %s", r.buf[1]);
    cr_assert(strstr(r.buf[0], "[ 3] x3\n") && strstr(r.buf[0], "[10] x10\n"), "stdout: %s", r.buf[0]);
    release(&r);
}

/* Four ranks write far more than a pipe holds, on both streams at once:
 * every line arrives whole, once, with its own rank's prefix. */
Test(symmrun, lines_stay_whole_when_ranks_write_at_once)
{
    char word[32];
    random_word(word, sizeof word);
    int lines = 3000 + (int)rnd(1000);
    char count[16];
    snprintf(count, sizeof count, "%d", lines);
    run r = run_symmrun(
        (const char *[]){"-n", "4", "/bin/sh", "-c",
                         "yes \"$1-e$SYMM_RANK\" | head -n $2 >&2 & "
                         "yes \"$1-o$SYMM_RANK-................................................................\" "
                         "| head -n $2; wait",
                         "sh", word, count, NULL},
        20);
    cr_assert_eq(r.code, 0, "stderr: %.500s", r.buf[1]);
    int seen_out[4] = {0}, seen_err[4] = {0};
    for (int k = 0; k < 2; k++) {
        char *save = NULL;
        for (char *l = strtok_r(r.buf[k], "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
            int rank = -1, n = 0;
            char tag = 0;
            char want[160];
            cr_assert(sscanf(l, "[%d] %n", &rank, &n) == 1 && rank >= 0 && rank < 4, "bad line: %s", l);
            snprintf(want, sizeof want, k == 0 ? "%s-o%d-..........." : "%s-e%d", word, rank);
            cr_assert(!strncmp(l + n, want, strlen(want)), "line of rank %d is not its own: %s", rank, l);
            tag = k == 0 ? 'o' : 'e';
            if (tag == 'o')
                seen_out[rank]++;
            else
                seen_err[rank]++;
        }
    }
    for (int i = 0; i < 4; i++)
        cr_assert(seen_out[i] == lines && seen_err[i] == lines, "rank %d: %d stdout and %d stderr lines of %d", i,
                  seen_out[i], seen_err[i], lines);
    release(&r);
}

/* --- environment of the ranks ------------------------------------------------ */

typedef struct rank_env {
    int rank, size, local;
    char job[128], secret[128], nvls[16], device[16], timeout[16];
} rank_env;

static void parse_envs(const run *r, int n, rank_env *e)
{
    char *copy = strdup(r->buf[0]), *save = NULL;
    int seen = 0;
    for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        int prefix;
        rank_env x;
        cr_assert(sscanf(l, "[%d] %d %d %d %127s %127s %15s %15s %15s", &prefix, &x.rank, &x.size, &x.local, x.job,
                         x.secret, x.nvls, x.device, x.timeout) == 9,
                  "bad line: %s", l);
        cr_assert(prefix == x.rank && x.rank >= 0 && x.rank < n, "line of rank %d says rank %d", prefix, x.rank);
        e[x.rank] = x;
        seen++;
    }
    cr_assert_eq(seen, n, "stdout: %s", r->buf[0]);
    free(copy);
}

static const char env_script[] = "echo \"$SYMM_RANK $SYMM_WORLD_SIZE $SYMM_LOCAL_RANK $SYMM_JOB_ID "
                                 "$SYMM_JOB_SECRET ${NCCL_NVLS_ENABLE-unset} ${SYMM_DEVICE-unset} "
                                 "${SYMM_TIMEOUT-unset}\"";

Test(symmrun, ranks_get_their_variables_and_a_fresh_job)
{
    unsetenv("NCCL_NVLS_ENABLE");
    unsetenv("SYMM_TIMEOUT");
    setenv("SYMM_DEVICE", "7", 1); /* inherited: must not pin every rank */
    rank_env a[3], b[3];
    for (int k = 0; k < 2; k++) {
        run r = run_symmrun((const char *[]){"-n", "3", "/bin/sh", "-c", env_script, NULL}, 10);
        cr_assert_eq(r.code, 0, "stderr: %s", r.buf[1]);
        parse_envs(&r, 3, k ? b : a);
        release(&r);
    }
    for (int i = 0; i < 3; i++) {
        cr_assert(a[i].size == 3 && a[i].local == i, "rank %d: size %d local %d", i, a[i].size, a[i].local);
        cr_assert_str_eq(a[i].job, a[0].job, "every rank has the same job id");
        cr_assert_str_eq(a[i].secret, a[0].secret, "every rank has the same secret");
        cr_assert_eq(strlen(a[i].secret), 64, "secret: %s", a[i].secret);
        cr_assert_eq(strspn(a[i].secret, "0123456789abcdef"), 64, "secret: %s", a[i].secret);
        cr_assert_str_eq(a[i].nvls, "0", "NCCL_NVLS_ENABLE must be 0 in the ranks");
        cr_assert_str_eq(a[i].device, "unset", "without --gpus SYMM_DEVICE is left to the default");
        cr_assert_str_eq(a[i].timeout, "unset");
    }
    cr_assert(strncmp(a[0].job, "symmrun-", 8) == 0, "job id %s", a[0].job);
    cr_assert_str_neq(a[0].job, b[0].job, "two runs must not share a job id");
    cr_assert_str_neq(a[0].secret, b[0].secret, "two runs must not share a secret");
}

Test(symmrun, gpus_are_assigned_round_robin_and_timeout_is_passed_on)
{
    int g0 = (int)rnd(8), g1 = (g0 + 1 + (int)rnd(7)) % 8;
    char gpus[32];
    snprintf(gpus, sizeof gpus, "%d,%d", g0, g1);
    run r = run_symmrun(
        (const char *[]){"-n", "5", "--gpus", gpus, "--timeout", "2.5", "/bin/sh", "-c", env_script, NULL}, 10);
    cr_assert_eq(r.code, 0, "stderr: %s", r.buf[1]);
    rank_env e[5];
    parse_envs(&r, 5, e);
    for (int i = 0; i < 5; i++) {
        char want[8];
        snprintf(want, sizeof want, "%d", i % 2 ? g1 : g0);
        cr_assert_str_eq(e[i].device, want, "rank %d with --gpus %s", i, gpus);
        cr_assert_str_eq(e[i].timeout, "2.5");
    }
    release(&r);
    r = run_symmrun((const char *[]){"-n", "2", "--gpus=3", "/bin/sh", "-c", env_script, NULL}, 10);
    cr_assert_eq(r.code, 0, "stderr: %s", r.buf[1]);
    parse_envs(&r, 2, e);
    cr_assert(!strcmp(e[0].device, "3") && !strcmp(e[1].device, "3"), "--gpus=3: %s %s", e[0].device, e[1].device);
    release(&r);
}

/* --nccl-shared-gpu: a different NCCL host for every rank, the mode flag, and
 * the socket transport's settings only where the caller has not chosen. */
Test(symmrun, nccl_shared_gpu_gives_each_rank_its_own_nccl_host)
{
    static const char script[] = "echo \"$SYMM_RANK ${NCCL_HOSTID-unset} ${SYMM_NCCL_SHARED_GPU-unset} "
                                 "${NCCL_SOCKET_IFNAME-unset} ${NCCL_IB_DISABLE-unset}\"";
    setenv("NCCL_HOSTID", "inherited", 1);
    unsetenv("NCCL_SOCKET_IFNAME");
    setenv("NCCL_IB_DISABLE", "0", 1);
    run r = run_symmrun((const char *[]){"-n", "3", "--nccl-shared-gpu", "/bin/sh", "-c", script, NULL}, 10);
    cr_assert_eq(r.code, 0, "stderr: %s", r.buf[1]);
    char host[3][128] = {{0}};
    char *copy = strdup(r.buf[0]), *save = NULL;
    int seen = 0;
    for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        int prefix, rank;
        char h[128], mode[16], ifname[16], ib[16];
        cr_assert(sscanf(l, "[%d] %d %127s %15s %15s %15s", &prefix, &rank, h, mode, ifname, ib) == 6, "bad line: %s",
                  l);
        cr_assert(rank >= 0 && rank < 3 && prefix == rank, "line: %s", l);
        cr_assert(strncmp(h, "symmrun-", 8) == 0, "rank %d: NCCL_HOSTID %s, expected the job's own", rank, h);
        cr_assert_str_eq(mode, "1", "rank %d: SYMM_NCCL_SHARED_GPU", rank);
        cr_assert_str_eq(ifname, "lo", "rank %d: NCCL_SOCKET_IFNAME unset before, expected lo", rank);
        cr_assert_str_eq(ib, "0", "rank %d: NCCL_IB_DISABLE set by the caller must be kept", rank);
        snprintf(host[rank], sizeof host[rank], "%s", h);
        seen++;
    }
    free(copy);
    cr_assert_eq(seen, 3, "stdout: %s", r.buf[0]);
    cr_assert(strcmp(host[0], host[1]) && strcmp(host[0], host[2]) && strcmp(host[1], host[2]),
              "every rank needs its own NCCL_HOSTID: %s %s %s", host[0], host[1], host[2]);
    release(&r);

    /* Without the option nothing of it is set. */
    unsetenv("NCCL_HOSTID");
    unsetenv("NCCL_IB_DISABLE");
    r = run_symmrun((const char *[]){"-n", "2", "/bin/sh", "-c", script, NULL}, 10);
    cr_assert_eq(r.code, 0, "stderr: %s", r.buf[1]);
    cr_assert(count_of(r.buf[0], "unset unset unset unset") == 2, "stdout: %s", r.buf[0]);
    release(&r);
}

/* --- usage ------------------------------------------------------------------- */

static void usage_fails(const char *const *args, const char *needle)
{
    run r = run_symmrun(args, 10);
    cr_assert_eq(r.code, 2, "exit %d for a usage error; stderr: %s", r.code, r.buf[1]);
    cr_assert(strstr(r.buf[1], needle), "stderr \"%s\" lacks \"%s\"", r.buf[1], needle);
    cr_assert_eq(r.len[0], 0, "nothing on stdout: %s", r.buf[0]);
    release(&r);
}

Test(symmrun, usage_errors_exit_2_with_a_message)
{
    usage_fails((const char *[]){NULL}, "-n N is required");
    usage_fails((const char *[]){"-n", "x", "true", NULL}, "symmrun: -n: got \"x\", expected a positive integer");
    usage_fails((const char *[]){"-n", "0", "true", NULL}, "-n: got \"0\"");
    usage_fails((const char *[]){"-n", NULL}, "-n: missing value");
    usage_fails((const char *[]){"-n", "2", NULL}, "missing PROG");
    usage_fails((const char *[]){"true", NULL}, "-n N is required");
    usage_fails((const char *[]){"-n", "2", "--bogus", "true", NULL}, "unknown option \"--bogus\"");
    usage_fails((const char *[]){"-n", "2", "--gpus", "1,,2", "true", NULL}, "--gpus: got \"1,,2\"");
    usage_fails((const char *[]){"-n", "2", "--timeout", "soon", "true", NULL}, "--timeout: got \"soon\"");
    usage_fails((const char *[]){"-n", "4", "--sim-hosts", "3", "true", NULL},
                "--sim-hosts 3: expected a number of hosts that divides -n 4");
    usage_fails((const char *[]){"-n", "4", "--sim-hosts", "0", "true", NULL}, "--sim-hosts: got \"0\"");
    usage_fails((const char *[]){"-n", "2", "--hosts", "2", "true", NULL},
                "--hosts, --host-index and --root go together");
    usage_fails((const char *[]){"-n", "2", "--sim-hosts", "2", "--hosts", "2", "true", NULL},
                "does not go with --hosts");
    usage_fails((const char *[]){"-n", "2", "--hosts", "2", "--host-index", "2", "--root", "a:1", "true", NULL},
                "--host-index 2: expected 0..1");
    usage_fails((const char *[]){"-n", "2", "--hosts", "2", "--host-index", "0", "--root", "node01", "true", NULL},
                "--root: got \"node01\", expected ADDR:PORT");
    unsetenv("SYMM_JOB_SECRET");
    usage_fails((const char *[]){"-n", "2", "--hosts", "2", "--host-index", "1", "--root", "a:1", "true", NULL},
                "--hosts needs SYMM_JOB_SECRET in the environment");
}

Test(symmrun, help_and_version)
{
    run r = run_symmrun((const char *[]){"--help", NULL}, 10);
    cr_assert_eq(r.code, 0);
    cr_assert(strstr(r.buf[0], "usage: symmrun -n N"), "%s", r.buf[0]);
    release(&r);
    r = run_symmrun((const char *[]){"--version", NULL}, 10);
    cr_assert_eq(r.code, 0);
    cr_assert(strstr(r.buf[0], SYMM_VERSION), "version output \"%s\" lacks %s", r.buf[0], SYMM_VERSION);
    release(&r);
}

Test(symmrun, missing_program_exits_127)
{
    char word[32], prog[64];
    random_word(word, sizeof word);
    snprintf(prog, sizeof prog, "no-such-command-%s", word);
    run r = run_symmrun((const char *[]){"-n", "2", prog, NULL}, 10);
    cr_assert_eq(r.code, 127, "exit %d; stderr: %s", r.code, r.buf[1]);
    cr_assert(strstr(r.buf[1], prog) && strstr(r.buf[1], "not found"), "stderr: %s", r.buf[1]);
    release(&r);
    r = run_symmrun((const char *[]){"-n", "2", "/nonexistent/dir/prog", NULL}, 10);
    cr_assert_eq(r.code, 127, "exit %d; stderr: %s", r.code, r.buf[1]);
    release(&r);
}

/* --- signals ----------------------------------------------------------------- */

Test(symmrun, sigterm_to_symmrun_is_forwarded_to_every_rank)
{
    run r;
    start(&r, (const char *[]){"-n", "2", "/bin/sh", "-c",
                               "trap 'echo got-term-$SYMM_RANK; exit 5' TERM; echo ready; "
                               "while :; do sleep 0.05; done",
                               NULL});
    pump(&r, wf_now() + 5, "ready", 2);
    cr_assert_eq(count_of(r.buf[0], "ready"), 2, "the ranks never got ready: %s", r.buf[0]);
    kill(r.pid, SIGTERM);
    finish(&r, 10);
    cr_assert_eq(r.code, 5, "exit %d; stderr: %s", r.code, r.buf[1]);
    cr_assert(strstr(r.buf[0], "[0] got-term-0") && strstr(r.buf[0], "[1] got-term-1"), "stdout: %s", r.buf[0]);
    release(&r);
}

Test(symmrun, sigint_to_symmrun_stops_the_ranks_with_130)
{
    run r;
    start(&r, (const char *[]){"-n", "3", "/bin/sh", "-c", "echo ready; exec sleep 30", NULL});
    pump(&r, wf_now() + 5, "ready", 3);
    kill(r.pid, SIGINT);
    finish(&r, 10);
    cr_assert_eq(r.code, 130, "exit %d; stderr: %s", r.code, r.buf[1]);
    release(&r);
}

/* A signal symmrun inherits as ignored stays ignored (`nohup symmrun ...`
 * keeps running when the terminal hangs up): the ranks finish. */
Test(symmrun, a_signal_ignored_at_start_stays_ignored)
{
    run r;
    start_ignoring(&r, (const char *[]){"-n", "2", "/bin/sh", "-c", "echo ready; sleep 1; echo done", NULL}, SIGHUP);
    pump(&r, wf_now() + 5, "ready", 2);
    cr_assert_eq(count_of(r.buf[0], "ready"), 2, "the ranks never got ready: %s", r.buf[0]);
    kill(r.pid, SIGHUP);
    finish(&r, 10);
    cr_assert_eq(r.code, 0, "exit %d; stderr: %s", r.code, r.buf[1]);
    cr_assert_eq(count_of(r.buf[0], "done"), 2, "stdout: %s", r.buf[0]);
    release(&r);
}

/* Waits up to `seconds` for every pid to be gone (reaping any that came to
 * this process, a subreaper); true when none is left. */
static bool all_gone(const pid_t *pids, int n, double seconds)
{
    double until = wf_now() + seconds;
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        int left = 0;
        for (int i = 0; i < n; i++)
            left += kill(pids[i], 0) == 0 || errno != ESRCH;
        if (left == 0)
            return true;
        if (wf_now() > until)
            return false;
        wf_sleep(0.01);
    }
}

/* All of pids are gone within seconds, else they are killed (nothing of a
 * test outlives it) and the test fails saying what outlived symmrun. */
static void expect_gone(const pid_t *pids, int n, double seconds, const char *what)
{
    if (all_gone(pids, n, seconds))
        return;
    for (int i = 0; i < n; i++)
        kill(pids[i], SIGKILL);
    cr_assert_fail("%s outlived symmrun", what);
}

/* symmrun itself dies by SIGKILL: its ranks, and what they started (in
 * their process groups or in sessions of their own), must die with it.
 * This process becomes a subreaper, so that anything orphaned comes here
 * and can be checked. */
Test(symmrun, ranks_and_their_children_die_when_symmrun_is_killed)
{
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    char dir[128], pidfile[192];
    make_pidfile(dir, sizeof dir, pidfile, sizeof pidfile);
    run r;
    start(&r, (const char *[]){"-n", "3", "/bin/sh", "-c",
                               "sleep 301 & echo $! >> \"$1\"; setsid sleep 302 & echo $! >> \"$1\"; "
                               "echo $$ >> \"$1\"; wait", "sh", pidfile, NULL});
    pid_t pids[9];
    double until = wf_now() + 5;
    while (read_pids(pidfile, pids, 9) < 9 && wf_now() < until)
        wf_sleep(0.01);
    cr_assert_eq(read_pids(pidfile, pids, 9), 9, "the ranks did not start their children");
    kill(r.pid, SIGKILL);
    finish(&r, 5);
    expect_gone(pids, 9, 3, "with symmrun killed by SIGKILL, a rank or a child of one");
    release(&r);
    wf_rmtree(dir);
}

/* The review's reproducer: a rank that leaves a background child and fails.
 * symmrun returns the rank's status and the child is gone. */
Test(symmrun, background_child_of_a_failing_rank_is_stopped)
{
    char dir[128], pidfile[192];
    make_pidfile(dir, sizeof dir, pidfile, sizeof pidfile);
    run r = run_symmrun((const char *[]){"-n", "2", "sh", "-c", "sleep 302 & echo $! >> \"$1\"; exit 1", "sh",
                                         pidfile, NULL},
                        10);
    cr_assert_eq(r.code, 1, "exit %d; stderr: %s", r.code, r.buf[1]);
    pid_t pids[2];
    /* The first rank to fail stops the other, which may not have started its sleep. */
    int n = read_pids(pidfile, pids, 2);
    cr_assert(n >= 1, "no sleep was started");
    expect_gone(pids, n, 0.5, "the background sleep");
    cr_assert(r.elapsed < 1.8, "took %.2f s", r.elapsed);
    release(&r);
    wf_rmtree(dir);
}

/* Ranks that all succeed but leave processes running, one in a session of
 * its own (out of the rank's process group): symmrun says so, stops them
 * and still returns 0. */
Test(symmrun, processes_left_by_successful_ranks_are_stopped)
{
    char dir[128], pidfile[192];
    make_pidfile(dir, sizeof dir, pidfile, sizeof pidfile);
    run r = run_symmrun((const char *[]){"-n", "2", "sh", "-c",
                                         "sleep 303 & echo $! >> \"$1\"; setsid sleep 304 & echo $! >> \"$1\"",
                                         "sh", pidfile, NULL},
                        10);
    cr_assert_eq(r.code, 0, "exit %d; stderr: %s", r.code, r.buf[1]);
    cr_assert(strstr(r.buf[1], "symmrun: the ranks left") && strstr(r.buf[1], "running: stopping them"),
              "stderr: %s", r.buf[1]);
    pid_t pids[4];
    cr_assert_eq(read_pids(pidfile, pids, 4), 4);
    expect_gone(pids, 4, 0.5, "a process the ranks left");
    cr_assert(r.elapsed < 1.8, "took %.2f s: SIGTERM should have stopped them", r.elapsed);
    release(&r);
    wf_rmtree(dir);
}

/* A leftover that ignores SIGTERM gets SIGKILL after the grace period. */
Test(symmrun, leftover_ignoring_sigterm_is_killed_after_the_grace_period)
{
    char dir[128], pidfile[192];
    make_pidfile(dir, sizeof dir, pidfile, sizeof pidfile);
    run r = run_symmrun((const char *[]){"-n", "1", "sh", "-c",
                                         "sh -c 'trap \"\" TERM; echo $$ >> \"$1\"; exec sleep 305' sh \"$1\" & "
                                         "while [ ! -s \"$1\" ]; do sleep 0.01; done", "sh", pidfile, NULL},
                        10);
    cr_assert_eq(r.code, 0, "exit %d; stderr: %s", r.code, r.buf[1]);
    pid_t pids[1];
    cr_assert_eq(read_pids(pidfile, pids, 1), 1);
    expect_gone(pids, 1, 0.5, "the leftover ignoring SIGTERM");
    cr_assert(r.elapsed > 1.9 && r.elapsed < 4.5, "took %.2f s; expected SIGKILL 2 s after SIGTERM", r.elapsed);
    release(&r);
    wf_rmtree(dir);
}

/* A rank killed by SIGKILL while its child runs: the child goes too. */
Test(symmrun, child_of_a_rank_killed_by_sigkill_is_stopped)
{
    char dir[128], pidfile[192];
    make_pidfile(dir, sizeof dir, pidfile, sizeof pidfile);
    run r = run_symmrun((const char *[]){"-n", "2", "sh", "-c",
                                         "sleep 306 & echo $! >> \"$1\"; "
                                         "while [ \"$(wc -l < \"$1\")\" -lt 2 ]; do sleep 0.01; done; "
                                         "if [ \"$SYMM_RANK\" = 0 ]; then kill -9 $$; fi; wait", "sh", pidfile, NULL},
                        10);
    cr_assert_eq(r.code, 128 + SIGKILL, "exit %d; stderr: %s", r.code, r.buf[1]);
    pid_t pids[2];
    cr_assert_eq(read_pids(pidfile, pids, 2), 2);
    expect_gone(pids, 2, 0.5, "a child of the killed rank");
    release(&r);
    wf_rmtree(dir);
}

/* SIGINT to symmrun's whole process group (a terminal's Ctrl-C) reaches the
 * ranks once, as a single SIGINT, not as the second one that kills (the
 * supervisor is in a group of its own: only the front gets it). */
Test(symmrun, sigint_to_the_process_group_is_passed_on_once)
{
    const char *path = symmrun_path();
    int out[2];
    cr_assert(pipe(out) == 0);
    pid_t holder = fork();
    if (holder == 0) {
        /* A process group of its own, as a shell makes for a job. */
        setpgid(0, 0);
        default_signals();
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        execl(path, path, "-n", "2", "/bin/sh", "-c",
              "trap 'echo got-int-$SYMM_RANK; exit 7' INT; echo ready; while :; do sleep 0.05; done", (char *)NULL);
        _exit(99);
    }
    setpgid(holder, holder);
    close(out[1]);
    run r = {.pid = holder, .fd = {out[0], -1}, .code = -1, .t0 = wf_now()};
    pump(&r, wf_now() + 5, "ready", 2);
    cr_assert_eq(count_of(r.buf[0], "ready"), 2, "the ranks never got ready: %s", r.buf[0]);
    kill(-holder, SIGINT);
    finish(&r, 10);
    cr_assert_eq(r.code, 7, "exit %d: a single SIGINT should end the ranks with 7; stdout: %s", r.code, r.buf[0]);
    cr_assert(strstr(r.buf[0], "got-int-"), "stdout: %s", r.buf[0]);
    release(&r);
}

/* --- a real world ------------------------------------------------------------ */

Test(symmrun, ranks_join_one_world_through_the_environment)
{
    char dir[128], exe[4096];
    wf_tempdir(dir, sizeof dir);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    cr_assert(n > 0);
    exe[n] = '\0';
    setenv("SYMM_TEST_WORLD_CHILD", "1", 1);
    setenv("SYMM_SOCKET_DIR", dir, 1);
    run r = run_symmrun((const char *[]){"-n", "3", "--timeout", "5", exe, NULL}, 20);
    unsetenv("SYMM_TEST_WORLD_CHILD");
    cr_assert_eq(r.code, 0, "exit %d; stdout: %s; stderr: %s", r.code, r.buf[0], r.buf[1]);
    for (int i = 0; i < 3; i++) {
        char want[64];
        snprintf(want, sizeof want, "[%d] world rank %d of 3: allgather ok\n", i, i);
        cr_assert(strstr(r.buf[0], want), "stdout lacks \"%s\": %s", want, r.buf[0]);
    }
    release(&r);
    wf_rmtree(dir);
}

/* --sim-hosts: host-major simulated hosts, each with its host id, NCCL host,
 * socket directory (removed afterwards) and the one root address. */
Test(symmrun, sim_hosts_give_each_host_its_identity_and_socket_directory)
{
    static const char script[] = "echo \"$SYMM_RANK $SYMM_LOCAL_RANK $SYMM_LOCAL_SIZE $SYMM_HOST_ID $NCCL_HOSTID "
                                 "$SYMM_SOCKET_DIR $SYMM_ROOT_ADDR ${NCCL_SOCKET_IFNAME-unset} ${NCCL_IB_DISABLE-unset}\"";
    unsetenv("NCCL_HOSTID");
    unsetenv("NCCL_SOCKET_IFNAME");
    setenv("NCCL_IB_DISABLE", "0", 1);
    run r = run_symmrun((const char *[]){"-n", "6", "--sim-hosts", "3", "/bin/sh", "-c", script, NULL}, 10);
    cr_assert_eq(r.code, 0, "stderr: %s", r.buf[1]);
    char nccl[6][128] = {{0}}, dir[6][256] = {{0}}, root[6][64] = {{0}};
    char *copy = strdup(r.buf[0]), *save = NULL;
    int seen = 0;
    for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        int prefix, rank, local, lsize;
        char host[32], n[128], d[256], a[64], ifname[16], ib[16];
        cr_assert(sscanf(l, "[%d] %d %d %d %31s %127s %255s %63s %15s %15s", &prefix, &rank, &local, &lsize, host, n, d,
                         a, ifname, ib) == 10, "bad line: %s", l);
        cr_assert_str_eq(ifname, "lo", "rank %d: NCCL_SOCKET_IFNAME unset before, expected lo", rank);
        cr_assert_str_eq(ib, "0", "rank %d: NCCL_IB_DISABLE set by the caller must be kept", rank);
        cr_assert(rank >= 0 && rank < 6 && prefix == rank, "line: %s", l);
        char want[16];
        snprintf(want, sizeof want, "sim%d", rank / 2);
        cr_assert_str_eq(host, want, "rank %d", rank);
        cr_assert(local == rank % 2 && lsize == 2, "rank %d: local rank %d of %d", rank, local, lsize);
        cr_assert(!strncmp(a, "127.0.0.1:", 10), "rank %d: SYMM_ROOT_ADDR %s", rank, a);
        snprintf(nccl[rank], sizeof nccl[rank], "%s", n);
        snprintf(dir[rank], sizeof dir[rank], "%s", d);
        snprintf(root[rank], sizeof root[rank], "%s", a);
        seen++;
    }
    free(copy);
    cr_assert_eq(seen, 6, "stdout: %s", r.buf[0]);
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 6; k++) {
            int same_host = i / 2 == k / 2;
            cr_assert_eq(!strcmp(nccl[i], nccl[k]), same_host, "NCCL_HOSTID of ranks %d, %d: %s %s", i, k, nccl[i],
                         nccl[k]);
            cr_assert_eq(!strcmp(dir[i], dir[k]), same_host, "SYMM_SOCKET_DIR of ranks %d, %d", i, k);
            cr_assert_str_eq(root[i], root[k]);
        }
    for (int i = 0; i < 6; i++)
        cr_assert(access(dir[i], F_OK) != 0, "%s is left behind", dir[i]);
    unsetenv("NCCL_IB_DISABLE");
    release(&r);
}

static const char *self_exe(char *exe, size_t n)
{
    ssize_t k = readlink("/proc/self/exe", exe, n - 1);
    cr_assert(k > 0);
    exe[k] = '\0';
    return exe;
}

Test(symmrun, sim_hosts_ranks_join_one_world_across_hosts)
{
    char exe[4096];
    setenv("SYMM_TEST_WORLD_CHILD", "1", 1);
    run r = run_symmrun((const char *[]){"-n", "4", "--sim-hosts", "2", "--timeout", "5", self_exe(exe, sizeof exe),
                                         NULL}, 20);
    unsetenv("SYMM_TEST_WORLD_CHILD");
    cr_assert_eq(r.code, 0, "exit %d; stdout: %s; stderr: %s", r.code, r.buf[0], r.buf[1]);
    for (int i = 0; i < 4; i++) {
        char want[96];
        snprintf(want, sizeof want, "[%d] world rank %d of 4: allgather ok\n", i, i);
        cr_assert(strstr(r.buf[0], want), "stdout lacks \"%s\": %s", want, r.buf[0]);
        snprintf(want, sizeof want, "[%d] rank %d: host %d of 2 (sim%d), local rank %d of 2\n", i, i, i / 2, i / 2,
                 i % 2);
        cr_assert(strstr(r.buf[0], want), "stdout lacks \"%s\": %s", want, r.buf[0]);
    }
    release(&r);
}

/* --hosts: one symmrun per host (here two on this machine, as hosts A and
 * B with their own socket directories), global ranks host-major. */
Test(symmrun, hosts_form_joins_the_symmruns_of_every_host)
{
    char exe[4096], dir[2][128], root[32], index[2][4];
    snprintf(root, sizeof root, "127.0.0.1:%d", wf_free_port());
    setenv("SYMM_TEST_WORLD_CHILD", "1", 1);
    setenv("SYMM_JOB_SECRET", "0123456789abcdef", 1);
    run r[2];
    for (int h = 0; h < 2; h++) {
        wf_tempdir(dir[h], sizeof dir[h]);
        setenv("SYMM_SOCKET_DIR", dir[h], 1);
        setenv("SYMM_HOST_ID", h ? "hostB" : "hostA", 1);
        snprintf(index[h], sizeof index[h], "%d", h);
        start(&r[h], (const char *[]){"-n", "2", "--hosts", "2", "--host-index", index[h], "--root", root,
                                      "--timeout", "5", self_exe(exe, sizeof exe), NULL});
    }
    for (int h = 0; h < 2; h++)
        finish(&r[h], 20);
    unsetenv("SYMM_TEST_WORLD_CHILD");
    unsetenv("SYMM_JOB_SECRET");
    unsetenv("SYMM_HOST_ID");
    unsetenv("SYMM_SOCKET_DIR");
    for (int h = 0; h < 2; h++) {
        cr_assert_eq(r[h].code, 0, "host %d: exit %d; stdout: %s; stderr: %s", h, r[h].code, r[h].buf[0],
                     r[h].buf[1]);
        for (int l = 0; l < 2; l++) {
            char want[96];
            const int g = 2 * h + l;
            snprintf(want, sizeof want, "[%d] rank %d: host %d of 2 (host%c), local rank %d of 2\n", g, g, h,
                     h ? 'B' : 'A', l);
            cr_assert(strstr(r[h].buf[0], want), "host %d: stdout lacks \"%s\": %s", h, want, r[h].buf[0]);
        }
        release(&r[h]);
        wf_rmtree(dir[h]);
    }
}
