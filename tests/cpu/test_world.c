/* test_world.c: the bootstrap of ranks (symm_world_*) among forked processes:
 * collectives, fd passing, and every way a rank can be missing, dead, wrong
 * or unwelcome, each bounded by a short timeout. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "symm_world.h"
#include "world_expect.h"
#include "world_fork.h"

TestSuite(world, .fini = wf_cleanup_tempdirs);

typedef struct world_test {
    char dir[128];
    char job[256];
    char secret[65];
    int size;
    double timeout;
    uint64_t seed;
    int victim; /* rank that dies, for the tests that kill one */
} world_test;

static void setup(world_test *t, int size, double timeout)
{
    memset(t, 0, sizeof *t);
    wf_tempdir(t->dir, sizeof t->dir);
    cr_assert(t->dir[0], "mkdtemp failed");
    wf_job_id(t->job, sizeof t->job);
    wf_secret(t->secret);
    wf_random(&t->seed, sizeof t->seed);
    t->size = size;
    t->timeout = timeout;
}

static symm_world_config cfg_of(const world_test *t, int rank)
{
    return (symm_world_config){.rank = rank, .size = t->size, .local_rank = rank, .device = -1,
                               .job_id = t->job, .secret = t->secret, .socket_dir = t->dir,
                               .timeout_s = t->timeout};
}

static void socket_path(const world_test *t, char *buf, size_t n)
{
    int len = snprintf(buf, n, "%.40s/symm-%u/%.40s.sock", t->dir, (unsigned)geteuid(), t->job);
    cr_assert(len > 0 && (size_t)len < n, "socket path too long");
}

/* Rank i joins t's world; 1 (with res->msg saying why) when it cannot. */
static int join(const world_test *t, int i, wf_result *res, symm_world **w)
{
    symm_world_config cfg = cfg_of(t, i);
    symm_status st = symm_world_create(&cfg, w);
    return st ? wf_failed_call(res, "symm_world_create", st) : 0;
}

/* --- every collective among 2, 3 and 8 ranks -------------------------------- */

static int check_allgather(symm_world *w, const world_test *t, size_t bytes, wf_result *res)
{
    int n = t->size, me = symm_world_rank(w);
    unsigned char *send = malloc(bytes), *recv = malloc(bytes * (size_t)n), *want = malloc(bytes);
    int code = 0;
    wf_fill(send, bytes, t->seed, (uint64_t)me, bytes);
    memset(recv, 0xa5, bytes * (size_t)n);
    symm_status st = symm_world_allgather(w, send, recv, bytes);
    if (st)
        code = wf_failed_call(res, "symm_world_allgather", st);
    for (int r = 0; r < n && !code; r++) {
        wf_fill(want, bytes, t->seed, (uint64_t)r, bytes);
        if (memcmp(recv + (size_t)r * bytes, want, bytes))
            code = wf_failf(res, "allgather of %zu bytes: rank %d's part differs on rank %d", bytes, r, me);
    }
    free(send);
    free(recv);
    free(want);
    return code;
}

static int check_bcast(symm_world *w, const world_test *t, wf_result *res)
{
    size_t bytes = 5000 + (t->seed % 1000);
    int root = t->size - 1, me = symm_world_rank(w);
    unsigned char *buf = malloc(bytes), *want = malloc(bytes);
    wf_fill(want, bytes, t->seed, 1000, 7);
    if (me == root)
        memcpy(buf, want, bytes);
    else
        wf_fill(buf, bytes, t->seed, 2000 + (uint64_t)me, 7);
    symm_status st = symm_world_bcast(w, buf, bytes, root);
    int code = st ? wf_failed_call(res, "symm_world_bcast", st)
               : memcmp(buf, want, bytes) ? wf_failf(res, "bcast from rank %d: rank %d got other bytes", root, me)
                                          : 0;
    free(buf);
    free(want);
    return code;
}

/* Ranks arrive one after the other; nobody may leave before the last came. */
static int check_barrier(symm_world *w, const world_test *t, wf_result *res, wf_result *all)
{
    int me = symm_world_rank(w);
    wf_sleep(0.03 * me);
    res->flag = 1;
    symm_status st = symm_world_barrier(w);
    if (st)
        return wf_failed_call(res, "symm_world_barrier", st);
    for (int r = 0; r < t->size; r++)
        if (!all[r].flag)
            return wf_failf(res, "rank %d left the barrier before rank %d arrived", me, r);
    return 0;
}

/* Every rank writes a random token into a temp file and reads every peer's
 * through the descriptor it received. */
static int check_allgather_fd(symm_world *w, const world_test *t, wf_result *res, wf_result *all)
{
    int me = symm_world_rank(w), n = t->size;
    char path[256];
    snprintf(path, sizeof path, "%s/token-%d-XXXXXX", t->dir, me);
    int fd = mkstemp(path);
    if (fd < 0)
        return wf_failf(res, "mkstemp: %s", strerror(errno));
    unlink(path);
    wf_random(res->token, sizeof res->token);
    if (write(fd, res->token, sizeof res->token) != (ssize_t)sizeof res->token)
        return wf_failf(res, "write token: %s", strerror(errno));
    int fds[8];
    symm_status st = symm_world_allgather_fd(w, fd, fds);
    int code = st ? wf_failed_call(res, "symm_world_allgather_fd", st) : 0;
    struct stat own, got;
    fstat(fd, &own);
    for (int r = 0; r < n && !code; r++) {
        unsigned char tok[32];
        if (pread(fds[r], tok, sizeof tok, 0) != (ssize_t)sizeof tok || memcmp(tok, all[r].token, sizeof tok))
            code = wf_failf(res, "rank %d: rank %d's token did not come through its descriptor", me, r);
        else if (!(fcntl(fds[r], F_GETFD) & FD_CLOEXEC))
            code = wf_failf(res, "rank %d: descriptor of rank %d lacks FD_CLOEXEC", me, r);
    }
    if (!code && (fds[me] == fd || fstat(fds[me], &got) || got.st_ino != own.st_ino))
        code = wf_failf(res, "rank %d: fds_out[own rank] is not a new descriptor of its own file", me);
    for (int r = 0; r < n && !st; r++)
        close(fds[r]);
    close(fd);
    return code;
}

static int rank_collectives(int i, void *arg, wf_result *res, wf_result *all)
{
    const world_test *t = arg;
    int fds_before = wf_count_fds();
    symm_world *w;
    if (join(t, i, res, &w))
        return 1;
    int code = 0;
    if (symm_world_rank(w) != i || symm_world_size(w) != t->size || symm_world_local_rank(w) != i ||
        symm_world_device(w) != i || symm_world_timeout(w) != t->timeout)
        code = wf_failf(res, "rank %d: accessors disagree with the config", i);
    size_t sizes[] = {1, 1000 + (size_t)(t->seed % 97), 300000};
    for (size_t k = 0; k < 3 && !code; k++)
        code = check_allgather(w, t, sizes[k], res);
    if (!code)
        code = check_bcast(w, t, res);
    if (!code)
        code = check_barrier(w, t, res, all);
    if (!code)
        code = check_allgather_fd(w, t, res, all);
    symm_world_destroy(w);
    int fds_after = wf_count_fds();
    if (!code && fds_after != fds_before)
        code = wf_failf(res, "rank %d: %d descriptors open before, %d after destroy", i, fds_before, fds_after);
    return code;
}

ParameterizedTestParameters(world, collectives_among_forked_ranks)
{
    static int sizes[] = {2, 3, 8};
    return cr_make_param_array(int, sizes, sizeof sizes / sizeof sizes[0]);
}

ParameterizedTest(int *size, world, collectives_among_forked_ranks)
{
    world_test t;
    setup(&t, *size, 5);
    wf_result *r = wf_run(t.size, rank_collectives, &t, 20);
    wf_expect_success(r, t.size);
    wf_free(r, t.size);
    wf_rmtree(t.dir);
}

Test(world, size_one_needs_no_socket)
{
    symm_world_config cfg = {.size = 1, .device = 3, .job_id = "solo", .socket_dir = "/nonexistent/dir"};
    symm_world *w;
    symm_status st = symm_world_create(&cfg, &w);
    cr_assert_eq(st, SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(symm_world_device(w), 3);
    cr_assert_eq(symm_world_timeout(w), 60.0);
    uint64_t in, out = 0;
    wf_random(&in, sizeof in);
    cr_assert_eq(symm_world_allgather(w, &in, &out, sizeof in), SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(in, out);
    cr_assert_eq(symm_world_bcast(w, &out, sizeof out, 0), SYMM_OK);
    cr_assert_eq(symm_world_barrier(w), SYMM_OK);
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC), got = -1;
    cr_assert_eq(symm_world_allgather_fd(w, fd, &got), SYMM_OK, "%s", symm_last_error());
    cr_assert(got >= 0 && got != fd, "expected a new descriptor, got %d", got);
    close(got);
    close(fd);
    cr_assert_eq(symm_world_bcast(w, &out, sizeof out, 1), SYMM_ERR_INVALID_ARG);
    cr_assert(strstr(symm_last_error(), "root 1"), "%s", symm_last_error());
    symm_world_destroy(w);
}

Test(world, bad_config_is_refused_naming_the_field)
{
    symm_world_config cfg = {.rank = 3, .size = 3, .job_id = "x", .device = -1};
    symm_world *w = (symm_world *)&cfg;
    cr_assert_eq(symm_world_create(&cfg, &w), SYMM_ERR_INVALID_ARG);
    cr_assert_null(w, "out must be NULL after a failure");
    cr_assert(strstr(symm_last_error(), "rank 3: expected 0..2"), "%s", symm_last_error());
    cfg = (symm_world_config){.rank = 0, .size = 2, .job_id = "x", .device = -1, .timeout_s = -2};
    cr_assert_eq(symm_world_create(&cfg, &w), SYMM_ERR_INVALID_ARG);
    cr_assert(strstr(symm_last_error(), "timeout_s -2"), "%s", symm_last_error());
    cfg = (symm_world_config){.rank = 0, .size = 2, .job_id = "x", .device = -1, .socket_dir = "rel/dir"};
    cr_assert_eq(symm_world_create(&cfg, &w), SYMM_ERR_INVALID_ARG);
    cr_assert(strstr(symm_last_error(), "absolute path"), "%s", symm_last_error());
    cr_assert_eq(symm_world_create(NULL, &w), SYMM_ERR_INVALID_ARG);
}

/* --- missing, wrong and dead ranks ----------------------------------------- */

typedef struct missing_arg {
    world_test t;
    unsigned absent; /* bit mask of ranks that never come */
} missing_arg;

static int rank_maybe_absent(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    missing_arg *m = arg;
    if (m->absent & (1u << i))
        return 0;
    symm_world_config cfg = cfg_of(&m->t, i);
    symm_world *w = NULL;
    double t0 = wf_now();
    symm_status st = symm_world_create(&cfg, &w);
    wf_record(res, st, t0);
    symm_world_destroy(w);
    return st == SYMM_OK ? wf_failf(res, "rank %d: create succeeded without every rank", i) : 0;
}

static void check_missing(unsigned absent, const char *needle)
{
    missing_arg m = {.absent = absent};
    setup(&m.t, 4, 2);
    wf_result *r = wf_run(4, rank_maybe_absent, &m, 10);
    for (int i = 0; i < 4; i++) {
        if (absent & (1u << i))
            continue;
        wf_expect_status(r, i, SYMM_ERR_TIMEOUT, needle);
        cr_assert(r[i].elapsed_s > 1.8 && r[i].elapsed_s < 3.5, "rank %d gave up after %.2f s, timeout 2 s", i,
                  r[i].elapsed_s);
    }
    wf_free(r, 4);
    wf_rmtree(m.t.dir);
}

Test(world, missing_rank_times_out_naming_it)
{
    check_missing(1u << 2, "symm_world_create: rank 2 did not join within 2 s");
}

Test(world, missing_ranks_time_out_naming_each)
{
    check_missing(1u << 2 | 1u << 3, "symm_world_create: ranks 2, 3 did not join within 2 s");
}

/* Ranks 0..2 are the job; 3 claims rank 1 with a wrong secret, 4 has the
 * right secret but a wrong size, 5 connects and says nothing, 6 sends
 * garbage. The real rank 1 comes last. */
static int raw_connect(const world_test *t, double wait_s)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    socket_path(t, a.sun_path, sizeof a.sun_path);
    double end = wf_now() + wait_s;
    while (wf_now() < end) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            return fd;
        close(fd);
        wf_sleep(0.005);
    }
    return -1;
}

static int rank_or_intruder(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    world_test *t = arg;
    if (i >= 5) {
        int fd = raw_connect(t, 2);
        if (fd < 0)
            return wf_failf(res, "intruder %d could not connect", i);
        if (i == 6) {
            unsigned char junk[56];
            wf_random(junk, sizeof junk);
            send(fd, junk, sizeof junk, MSG_NOSIGNAL);
        }
        wf_sleep(1.5); /* hold the connection open while the world forms */
        close(fd);
        return 0;
    }
    symm_world_config cfg = cfg_of(t, i == 3 ? 1 : i == 4 ? 2 : i);
    char wrong[65];
    if (i == 3) {
        wf_secret(wrong);
        cfg.secret = wrong;
    }
    if (i == 4)
        cfg.size = 4;
    if (i == 1)
        wf_sleep(0.4);
    symm_world *w = NULL;
    double t0 = wf_now();
    symm_status st = symm_world_create(&cfg, &w);
    wf_record(res, st, t0);
    if (i >= 3) {
        symm_world_destroy(w);
        return st == SYMM_OK ? wf_failf(res, "intruder %d was let in", i) : 0;
    }
    if (st)
        return wf_failed_call(res, "symm_world_create", st);
    uint32_t mine = (uint32_t)i * 7919u, got[3];
    st = symm_world_allgather(w, &mine, got, sizeof mine);
    symm_world_destroy(w);
    if (st)
        return wf_failed_call(res, "symm_world_allgather", st);
    for (int r = 0; r < 3; r++)
        if (got[r] != (uint32_t)r * 7919u)
            return wf_failf(res, "rank %d: wrong value from rank %d", i, r);
    return 0;
}

Test(world, wrong_secret_is_refused_and_the_right_ranks_still_join)
{
    world_test t;
    setup(&t, 3, 3);
    wf_result *r = wf_run(7, rank_or_intruder, &t, 15);
    wf_expect_success(r, 3);
    for (int i = 0; i < 3; i++)
        cr_assert(r[i].elapsed_s < 1.4, "rank %d needed %.2f s: the intruders held it up", i, r[i].elapsed_s);
    wf_expect_status(r, 3, SYMM_ERR_PEER, "symm_world_create: rank 0 refused this rank (1): wrong job secret");
    cr_assert(r[3].elapsed_s < 1.5, "the refused rank waited %.2f s", r[3].elapsed_s);
    wf_expect_status(r, 4, SYMM_ERR_PEER, "world size 4 here, 3 at rank 0");
    wf_expect_success(r + 5, 2);
    wf_free(r, 7);
    wf_rmtree(t.dir);
}

/* Without a secret, ranks of one job agree on one derived from the job id;
 * a rank with an explicit secret does not match it. */
static int rank_derived_secret(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    world_test *t = arg;
    unsetenv("SYMM_JOB_SECRET");
    symm_world_config cfg = cfg_of(t, i < 2 ? i : 1);
    cfg.secret = i < 2 ? NULL : t->secret;
    if (i == 1)
        wf_sleep(0.3);
    symm_world *w = NULL;
    double t0 = wf_now();
    symm_status st = symm_world_create(&cfg, &w);
    wf_record(res, st, t0);
    if (st == SYMM_OK)
        st = symm_world_barrier(w);
    symm_world_destroy(w);
    if (i < 2 && st)
        return wf_failed_call(res, "derived secret", st);
    return 0;
}

Test(world, derived_secret_joins_and_an_explicit_one_is_refused)
{
    world_test t;
    setup(&t, 2, 3);
    wf_result *r = wf_run(3, rank_derived_secret, &t, 10);
    wf_expect_success(r, 2);
    wf_expect_status(r, 2, SYMM_ERR_PEER, "wrong job secret");
    wf_free(r, 3);
    wf_rmtree(t.dir);
}

static void kill_self(int sig)
{
    (void)sig;
    kill(getpid(), SIGKILL);
}

/* Big allgathers in a loop; the victim is killed by SIGKILL at a random
 * moment, inside or between them. */
static int rank_until_killed(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    world_test *t = arg;
    symm_world *w;
    if (join(t, i, res, &w))
        return 1;
    size_t bytes = 1 << 20;
    char *send = malloc(bytes), *recv = malloc(bytes * (size_t)t->size);
    memset(send, i + 1, bytes);
    double t0 = wf_now();
    if (i == t->victim) {
        uint32_t us;
        wf_random(&us, sizeof us);
        signal(SIGALRM, kill_self);
        struct itimerval it = {.it_value = {.tv_usec = 20000 + (long)(us % 100000)}};
        setitimer(ITIMER_REAL, &it, NULL);
    }
    symm_status st = SYMM_OK;
    for (int k = 0; k < 100000 && st == SYMM_OK; k++)
        st = symm_world_allgather(w, send, recv, bytes);
    wf_record(res, st, t0);
    symm_world_destroy(w);
    free(send);
    free(recv);
    return st == SYMM_OK ? wf_failf(res, "rank %d: no error after the victim died", i) : 0;
}

static void check_killed(int victim)
{
    world_test t;
    setup(&t, 3, 5);
    t.victim = victim;
    wf_result *r = wf_run(3, rank_until_killed, &t, 20);
    char needle[64];
    snprintf(needle, sizeof needle, "rank %d disconnected during symm_world_allgather", victim);
    cr_assert_not(r[victim].done, "the victim survived: %s", r[victim].msg);
    for (int i = 0; i < 3; i++) {
        if (i == victim)
            continue;
        wf_expect_status(r, i, SYMM_ERR_PEER, needle);
        cr_assert(r[i].elapsed_s < 2.0, "rank %d learned of the death after %.2f s (timeout 5 s)", i,
                  r[i].elapsed_s);
    }
    wf_free(r, 3);
    wf_rmtree(t.dir);
}

Test(world, peer_killed_midway_is_named_at_once) { check_killed(2); }

Test(world, rank0_killed_midway_is_named_at_once) { check_killed(0); }

/* Rank 2 comes late to a collective: rank 0 names it after the timeout, and
 * rank 2 learns that the world failed when it arrives. */
static int rank_late(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    world_test *t = arg;
    symm_world *w;
    if (join(t, i, res, &w))
        return 1;
    if (i == 2)
        wf_sleep(t->timeout + 1);
    double t0 = wf_now();
    symm_status st = symm_world_barrier(w);
    wf_record(res, st, t0);
    symm_world_destroy(w);
    return 0;
}

Test(world, late_rank_in_a_collective_times_out_naming_it)
{
    world_test t;
    setup(&t, 3, 1);
    wf_result *r = wf_run(3, rank_late, &t, 10);
    wf_expect_status(r, 0, SYMM_ERR_TIMEOUT, "symm_world_barrier: rank 2 did not arrive within 1 s");
    wf_expect_status(r, 1, SYMM_ERR_TIMEOUT, "symm_world_barrier: rank 2 did not arrive within 1 s");
    cr_assert(r[0].elapsed_s > 0.9 && r[0].elapsed_s < 2.0, "rank 0 gave up after %.2f s", r[0].elapsed_s);
    wf_expect_status(r, 2, SYMM_ERR_TIMEOUT, "rank 2 did not arrive");
    wf_free(r, 3);
    wf_rmtree(t.dir);
}

/* A rank that stops partway: each of the four timeouts of a collective's
 * exchange with rank 0 names the rank and what it did not do. */
typedef struct stall_arg {
    world_test t;
    int kind; /* 0: rank 0 never answers; 1: rank 0 never reads rank 1's data;
               * 2: rank 1 stops halfway through its data; 3: rank 1 stops
               * before it reads rank 0's answer */
} stall_arg;

/* More than any socket buffer holds, so a send of it needs a reader. */
#define STALL_BYTES ((size_t)64 << 20)

/* Waits until process pid is asleep (blocked in the world's poll) and stops it. */
static int stop_when_asleep(pid_t pid, wf_result *res)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    for (double t0 = wf_now(); wf_now() - t0 < 20;) {
        char buf[512] = "";
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        const char *close_paren = strrchr(buf, ')'); /* the state follows "(comm) " */
        if (close_paren && close_paren[1] == ' ' && close_paren[2] == 'S')
            return kill(pid, SIGSTOP) == 0 ? 0 : wf_failf(res, "SIGSTOP: %s", strerror(errno));
        wf_sleep(0.005);
    }
    return wf_failf(res, "rank 1 (pid %d) never blocked in its collective", (int)pid);
}

static int rank_stall(int i, void *arg, wf_result *res, wf_result *all)
{
    stall_arg *a = arg;
    symm_world *w;
    if (join(&a->t, i, res, &w))
        return 1;
    const bool bcast = a->kind == 0 || a->kind == 3;
    size_t bytes = a->kind == 0 ? 64 : STALL_BYTES;
    unsigned char *send = calloc(1, bytes), *recv = calloc(2, bytes);
    int code = 0;
    if (!send || !recv)
        code = wf_failf(res, "out of memory");
    if (!code && i == 0 && a->kind <= 1) {
        /* Rank 0 does not come: rank 1 waits out its timeout (and the grace
         * of at most 2 s that ranks other than 0 add for rank 0's answer). */
        wf_sleep(a->t.timeout + 3);
    } else if (!code) {
        pid_t other = 0;
        if (i == 1) {
            all[1].flag = (int)getpid();
        } else {
            while (!all[1].flag)
                wf_sleep(0.001);
            other = (pid_t)all[1].flag;
            code = stop_when_asleep(other, res);
        }
        double t0 = wf_now();
        if (!code) {
            wf_record(res, bcast ? symm_world_bcast(w, recv, bytes, 0) : symm_world_allgather(w, send, recv, bytes), t0);
        }
        if (other)
            kill(other, SIGKILL);
    }
    free(send);
    free(recv);
    symm_world_destroy(w);
    return code;
}

static void check_stall(int kind, int rank, const char *needle)
{
    stall_arg a = {.kind = kind};
    setup(&a.t, 2, 1);
    wf_result *r = wf_run(2, rank_stall, &a, 20);
    wf_expect_status(r, rank, SYMM_ERR_TIMEOUT, needle);
    cr_assert(r[rank].elapsed_s > 0.9 && r[rank].elapsed_s < 3.0, "rank %d gave up after %.2f s", rank,
              r[rank].elapsed_s);
    wf_free(r, 2);
    wf_rmtree(a.t.dir);
}

Test(world, rank0_that_never_answers_is_named)
{
    check_stall(0, 1, "symm_world_bcast: rank 0 did not answer within 1 s (collective call 1)");
}

Test(world, rank0_that_never_takes_the_data_is_named)
{
    check_stall(1, 1, "symm_world_allgather: rank 0 did not take this rank's data within 1 s (collective call 1)");
}

Test(world, rank_that_stops_halfway_through_its_data_is_named)
{
    check_stall(2, 0, "symm_world_allgather: rank 1 did not send all of its data within 1 s (collective call 1)");
}

Test(world, rank_that_stops_before_the_answer_is_named)
{
    check_stall(3, 0, "symm_world_bcast: rank 1 did not take its data within 1 s (collective call 1)");
}

/* --- ranks that disagree ----------------------------------------------------- */

typedef struct mismatch_arg {
    world_test t;
    int kind; /* 0: allgather sizes differ; 1: rank 1 calls bcast; 2: rank 2 passes a bad root */
} mismatch_arg;

static int rank_mismatch(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    mismatch_arg *m = arg;
    symm_world *w;
    if (join(&m->t, i, res, &w))
        return 1;
    char send[64], recv[3 * 64];
    memset(send, 'a' + i, sizeof send);
    double t0 = wf_now();
    symm_status st;
    if (m->kind == 1 && i == 1)
        st = symm_world_bcast(w, send, sizeof send, 0);
    else if (m->kind == 2)
        st = symm_world_bcast(w, send, sizeof send, i == 2 ? 7 : 0);
    else
        st = symm_world_allgather(w, send, recv, m->kind == 0 && i == 2 ? 32 : 64);
    wf_record(res, st, t0);
    /* The world stays failed: the next call says so at once. */
    symm_status again = symm_world_barrier(w);
    symm_world_destroy(w);
    if (st && again != st)
        return wf_failf(res, "rank %d: after %s, barrier returned %s", i, symm_status_name(st),
                        symm_status_name(again));
    return 0;
}

static void check_mismatch(int kind, symm_status want, const char *needle)
{
    mismatch_arg m = {.kind = kind};
    setup(&m.t, 3, 3);
    wf_result *r = wf_run(3, rank_mismatch, &m, 15);
    for (int i = 0; i < 3; i++) {
        wf_expect_status(r, i, want, needle);
        cr_assert(r[i].elapsed_s < 1.5, "rank %d needed %.2f s to see it", i, r[i].elapsed_s);
    }
    wf_free(r, 3);
    wf_rmtree(m.t.dir);
}

Test(world, mismatched_allgather_sizes_name_both_ranks)
{
    check_mismatch(0, SYMM_ERR_MISMATCH, "rank 0 passed 64 bytes, rank 2 passed 32 bytes");
}

Test(world, different_collectives_name_both_calls)
{
    check_mismatch(1, SYMM_ERR_MISMATCH, "rank 0 called symm_world_allgather, rank 1 called symm_world_bcast");
}

Test(world, bad_argument_on_one_rank_fails_every_rank)
{
    check_mismatch(2, SYMM_ERR_INVALID_ARG, "root 7: expected 0..2");
}

/* --- the socket directory ---------------------------------------------------- */

static symm_status create_alone(const world_test *t, int rank)
{
    symm_world_config cfg = cfg_of(t, rank);
    symm_world *w = NULL;
    symm_status st = symm_world_create(&cfg, &w);
    symm_world_destroy(w);
    return st;
}

Test(world, socket_dir_with_wrong_mode_owner_or_type_is_refused)
{
    world_test t;
    setup(&t, 2, 1);
    char sub[256];
    snprintf(sub, sizeof sub, "%s/symm-%u", t.dir, (unsigned)geteuid());
    cr_assert_eq(mkdir(sub, 0700), 0);
    cr_assert_eq(chmod(sub, 0777), 0);
    for (int rank = 0; rank < 2; rank++) {
        cr_assert_eq(create_alone(&t, rank), SYMM_ERR_SYSTEM);
        cr_assert(strstr(symm_last_error(), "has mode 0777: expected 0700"), "%s", symm_last_error());
    }
    cr_assert_eq(chmod(sub, 0700), 0);
    if (geteuid() == 0) {
        cr_assert_eq(chown(sub, 65534, 65534), 0);
        cr_assert_eq(create_alone(&t, 0), SYMM_ERR_SYSTEM);
        cr_assert(strstr(symm_last_error(), "belongs to uid 65534"), "%s", symm_last_error());
    }
    cr_assert_eq(rmdir(sub), 0);
    char target[256];
    snprintf(target, sizeof target, "%s/elsewhere", t.dir);
    cr_assert_eq(mkdir(target, 0700), 0);
    cr_assert_eq(symlink(target, sub), 0);
    cr_assert_eq(create_alone(&t, 0), SYMM_ERR_SYSTEM);
    cr_assert(strstr(symm_last_error(), "is a symbolic link"), "%s", symm_last_error());
    cr_assert_eq(unlink(sub), 0);
    int fd = open(sub, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    close(fd);
    cr_assert_eq(create_alone(&t, 1), SYMM_ERR_SYSTEM);
    cr_assert(strstr(symm_last_error(), "is not a directory"), "%s", symm_last_error());
    wf_rmtree(t.dir);
}

/* bind() as libsymm calls it (this definition takes the place of libc's in
 * this program), noting the mode the rendezvous socket has the moment bind
 * creates it: an observer polling the file could miss a short window between
 * bind and a later chmod, this cannot. */
static volatile int socket_mode_at_bind = -1;

int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
    static int (*real_bind)(int, const struct sockaddr *, socklen_t);
    if (!real_bind)
        real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    int rc = real_bind(fd, addr, len);
    const struct sockaddr_un *un = (const struct sockaddr_un *)addr;
    struct stat st;
    if (rc == 0 && addr->sa_family == AF_UNIX && strstr(un->sun_path, "/symm-") && lstat(un->sun_path, &st) == 0)
        socket_mode_at_bind = (int)(st.st_mode & 07777);
    return rc;
}

/* Rank 0 runs with umask 0, rank 1 comes late, an observer looks at the
 * directory and the socket meanwhile, and after the world formed. Rank 0
 * also checks the mode its socket had when bind created it. */
static int rank_or_observer(int i, void *arg, wf_result *res, wf_result *all)
{
    world_test *t = arg;
    if (i == 2) {
        char path[256], dir[256];
        socket_path(t, path, sizeof path);
        snprintf(dir, sizeof dir, "%s/symm-%u", t->dir, (unsigned)geteuid());
        struct stat st, ds;
        double end = wf_now() + 2;
        while (lstat(path, &st) != 0 && wf_now() < end)
            wf_sleep(0.002);
        if (lstat(path, &st) != 0 || lstat(dir, &ds) != 0)
            return wf_failf(res, "the socket %s never appeared", path);
        if (!S_ISSOCK(st.st_mode) || (st.st_mode & 07777) != 0600)
            return wf_failf(res, "socket mode %04o, expected a socket with 0600", (unsigned)(st.st_mode & 07777));
        if (!S_ISDIR(ds.st_mode) || (ds.st_mode & 07777) != 0700)
            return wf_failf(res, "directory mode %04o, expected 0700", (unsigned)(ds.st_mode & 07777));
        while (!all[0].flag && wf_now() < end)
            wf_sleep(0.002);
        if (lstat(path, &st) == 0)
            return wf_failf(res, "the socket is still there after the world formed");
        return 0;
    }
    if (i == 0)
        umask(0);
    else
        wf_sleep(0.4);
    symm_world *w;
    if (join(t, i, res, &w))
        return 1;
    res->flag = 1;
    symm_status st = symm_world_barrier(w);
    symm_world_destroy(w);
    if (st)
        return wf_failed_call(res, "symm_world_barrier", st);
    if (i == 0 && socket_mode_at_bind != 0600)
        return wf_failf(res, "bind created the socket with mode %04o under umask 0, expected 0600 from the start",
                        (unsigned)socket_mode_at_bind);
    return 0;
}

Test(world, socket_is_0600_in_a_0700_dir_even_with_umask_0)
{
    world_test t;
    setup(&t, 2, 3);
    wf_result *r = wf_run(3, rank_or_observer, &t, 10);
    wf_expect_success(r, 3);
    wf_free(r, 3);
    wf_rmtree(t.dir);
}

static int rank_plain(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    world_test *t = arg;
    symm_world_config cfg = cfg_of(t, i);
    symm_world *w = NULL;
    double t0 = wf_now();
    symm_status st = symm_world_create(&cfg, &w);
    wf_record(res, st, t0);
    if (st == SYMM_OK)
        st = symm_world_barrier(w);
    symm_world_destroy(w);
    return st ? wf_failed_call(res, "create and barrier", st) : 0;
}

Test(world, stale_socket_is_replaced)
{
    world_test t;
    setup(&t, 2, 3);
    char sub[256];
    snprintf(sub, sizeof sub, "%s/symm-%u", t.dir, (unsigned)geteuid());
    cr_assert_eq(mkdir(sub, 0700), 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    socket_path(&t, a.sun_path, sizeof a.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    close(fd); /* a socket file nobody listens on, as a crashed job leaves it */
    wf_result *r = wf_run(2, rank_plain, &t, 10);
    wf_expect_success(r, 2);
    wf_free(r, 2);
    wf_rmtree(t.dir);
}

/* Two jobs with one job id: the second job's rank 0 finds the socket in
 * use, and its rank 1, refused by the first job's rank 0 for its secret,
 * says that the job id may be shared, not only that the secret is wrong. */
static int rank_of_two_jobs(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    world_test *t = arg;
    symm_world_config cfg = cfg_of(t, i % 2);
    char other[65];
    if (i >= 2) {
        wf_secret(other); /* job B: same id, its own secret */
        cfg.secret = other;
        wf_sleep(0.2);
    }
    if (i == 1)
        wf_sleep(1.2); /* job A's rank 0 keeps listening meanwhile */
    symm_world *w = NULL;
    double t0 = wf_now();
    symm_status st = symm_world_create(&cfg, &w);
    wf_record(res, st, t0);
    symm_world_destroy(w);
    if (i < 2 && st)
        return wf_failed_call(res, "job A", st);
    return 0;
}

Test(world, job_id_clash_is_named_by_both_ranks_of_the_second_job)
{
    world_test t;
    setup(&t, 2, 4);
    wf_result *r = wf_run(4, rank_of_two_jobs, &t, 15);
    wf_expect_success(r, 2);
    wf_expect_status(r, 2, SYMM_ERR_STATE, "in use by a live world: another job has job id");
    wf_expect_status(r, 3, SYMM_ERR_PEER, "wrong job secret");
    char want[400];
    snprintf(want, sizeof want, "Another job may be using job id \"%s\"", t.job);
    wf_expect_status(r, 3, SYMM_ERR_PEER, want);
    wf_expect_status(r, 3, SYMM_ERR_PEER, "give each job its own SYMM_JOB_ID");
    wf_free(r, 4);
    wf_rmtree(t.dir);
}

Test(world, live_socket_of_the_same_job_id_is_an_error)
{
    world_test t;
    setup(&t, 2, 3);
    char sub[256];
    snprintf(sub, sizeof sub, "%s/symm-%u", t.dir, (unsigned)geteuid());
    cr_assert_eq(mkdir(sub, 0700), 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    socket_path(&t, a.sun_path, sizeof a.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0, "%s", strerror(errno));
    cr_assert_eq(listen(fd, 4), 0);
    cr_assert_eq(create_alone(&t, 0), SYMM_ERR_STATE);
    cr_assert(strstr(symm_last_error(), "in use by a live world"), "%s", symm_last_error());
    close(fd);
    wf_rmtree(t.dir);
}

/* --- descriptors ------------------------------------------------------------- */

static int rank_cycles(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    world_test *t = arg;
    int before = wf_count_fds();
    for (int cycle = 0; cycle < 5; cycle++) {
        symm_world *w;
        if (join(t, i, res, &w))
            return 1;
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC), fds[3];
        symm_status st = symm_world_allgather_fd(w, fd, fds);
        close(fd);
        if (st == SYMM_OK)
            for (int r = 0; r < t->size; r++)
                close(fds[r]);
        symm_world_destroy(w);
        if (st)
            return wf_failed_call(res, "symm_world_allgather_fd", st);
    }
    /* A create that fails (rank 1 of a world whose rank 0 never comes, and
     * rank 0 of a world nobody joins) leaves nothing open either. */
    world_test lonely = *t;
    lonely.timeout = 0.3;
    wf_job_id(lonely.job, sizeof lonely.job);
    symm_status st = create_alone(&lonely, i == 0 ? 0 : 1);
    if (st != SYMM_ERR_TIMEOUT)
        return wf_failf(res, "lonely create: %s: %s", symm_status_name(st), symm_last_error());
    int after = wf_count_fds();
    return after == before ? 0 : wf_failf(res, "rank %d: %d descriptors before, %d after", i, before, after);
}

Test(world, no_descriptor_leaks_across_create_destroy_cycles)
{
    world_test t;
    setup(&t, 3, 3);
    wf_result *r = wf_run(3, rank_cycles, &t, 20);
    wf_expect_success(r, 3);
    wf_free(r, 3);
    wf_rmtree(t.dir);
}

/* Destroy says what it could not do and frees everything anyway: rank 1's
 * connection to rank 0 is closed behind the world's back (the descriptors
 * create opened, found by comparing /proc/self/fd before and after), so
 * closing it again fails; rank 0's destroy is clean. */
static int rank_destroy_status(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    world_test *t = arg;
    unsigned char before[1024] = {0};
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e; d && (e = readdir(d));)
        if (atoi(e->d_name) > 2 && atoi(e->d_name) < 1024 && atoi(e->d_name) != dirfd(d))
            before[atoi(e->d_name)] = 1;
    if (d)
        closedir(d);
    symm_world *w;
    if (join(t, i, res, &w))
        return 1;
    symm_status st = symm_world_barrier(w);
    if (st)
        return wf_failed_call(res, "symm_world_barrier", st);
    int closed = 0;
    for (int fd = 3; i == 1 && fd < 1024; fd++) {
        struct stat sb;
        if (!before[fd] && fstat(fd, &sb) == 0 && S_ISSOCK(sb.st_mode))
            closed += close(fd) == 0;
    }
    if (i == 1 && closed != 1)
        return wf_failf(res, "rank 1 found %d new sockets, expected its connection to rank 0", closed);
    st = symm_world_destroy(w);
    if (i == 0)
        return st ? wf_failed_call(res, "symm_world_destroy", st) : 0;
    if (st != SYMM_ERR_SYSTEM || !strstr(symm_last_error(), "rank 1: closing the connection to rank 0"))
        return wf_failf(res, "destroy after its connection was closed: %s: %s", symm_status_name(st),
                        symm_last_error());
    return 0;
}

Test(world, destroy_returns_a_status_and_takes_null)
{
    cr_assert_eq(symm_world_destroy(NULL), SYMM_OK);
    world_test t;
    setup(&t, 2, 5);
    wf_result *r = wf_run(2, rank_destroy_status, &t, 10);
    wf_expect_success(r, 2);
    wf_free(r, 2);
    wf_rmtree(t.dir);
}

/* Rank 1 has one free descriptor (its own dup) and none for rank 0's: the
 * kernel cuts the one it is sent, and the error says this process is out of
 * descriptors rather than blaming the peer. */
static int rank_out_of_fds(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    world_test *t = arg;
    symm_world *w;
    if (join(t, i, res, &w))
        return 1;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC), fds[2], fill[64], n = 0;
    struct rlimit old, lim;
    if (i == 1) {
        getrlimit(RLIMIT_NOFILE, &old);
        lim = old;
        lim.rlim_cur = (rlim_t)fd + 16;
        setrlimit(RLIMIT_NOFILE, &lim);
        while (n < 64 && (fill[n] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
            n++;
        if (n == 64 || errno != EMFILE)
            return wf_failf(res, "could not use up the descriptors: %d opened, %s", n, strerror(errno));
        close(fill[--n]); /* one left: for allgather_fd's dup of fd */
    }
    double t0 = wf_now();
    symm_status st = symm_world_allgather_fd(w, fd, fds);
    int code = wf_record(res, st, t0);
    if (i == 1) {
        while (n > 0)
            close(fill[--n]);
        setrlimit(RLIMIT_NOFILE, &old);
    }
    if (st == SYMM_OK)
        for (int r = 0; r < 2; r++)
            close(fds[r]);
    close(fd);
    symm_world_destroy(w);
    return code;
}

Test(world, descriptor_not_received_for_lack_of_descriptors_says_so)
{
    world_test t;
    setup(&t, 2, 5);
    wf_result *r = wf_run(2, rank_out_of_fds, &t, 20);
    for (int i = 0; i < 2; i++)
        cr_assert(r[i].done && r[i].code == 0, "rank %d: %s", i, r[i].msg);
    wf_expect_status(r, 1, SYMM_ERR_SYSTEM, "could not be received: this process is probably out of file descriptors");
    cr_assert(r[1].elapsed_s < 2.0, "rank 1 took %.2f s", r[1].elapsed_s);
    wf_free(r, 2);
    wf_rmtree(t.dir);
}

/* --- job ids and foreign sockets --------------------------------------------- */

Test(world, odd_and_long_job_ids_name_a_hashed_socket)
{
    world_test t;
    setup(&t, 2, 3);
    char id[250];
    int n = snprintf(id, sizeof id, "../%s/with spaces/", t.job);
    memset(id + n, 'x', sizeof id - 1 - (size_t)n);
    id[sizeof id - 1] = '\0';
    snprintf(t.job, sizeof t.job, "%s", id); /* odd characters, and too long for sun_path */
    wf_result *r = wf_run(2, rank_plain, &t, 10);
    wf_expect_success(r, 2);
    wf_free(r, 2);
    char sub[256];
    snprintf(sub, sizeof sub, "%s/symm-%u", t.dir, (unsigned)geteuid());
    struct stat st;
    cr_assert_eq(lstat(sub, &st), 0, "the world must have made %s", sub);
    wf_rmtree(t.dir);
}

/* A listener that belongs to another uid sits where rank 0's socket should
 * be: a rank must not talk to it. (Needs root to become another uid.) */
Test(world, socket_of_another_user_is_not_trusted)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to listen as another uid");
    world_test t;
    setup(&t, 2, 1);
    char sub[256];
    snprintf(sub, sizeof sub, "%s/symm-%u", t.dir, (unsigned)geteuid());
    cr_assert_eq(mkdir(sub, 0700), 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    socket_path(&t, a.sun_path, sizeof a.sun_path);
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && setresgid(65534, 65534, 65534) == 0 &&
                 setresuid(65534, 65534, 65534) == 0 && listen(fd, 4) == 0;
        char c = ok ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1 || !ok)
            _exit(1);
        wf_sleep(3);
        _exit(0);
    }
    char c = 0;
    cr_assert_eq(read(ready[0], &c, 1), 1);
    cr_assert_eq(c, 'y', "the foreign listener could not start");
    double t0 = wf_now();
    symm_status st = create_alone(&t, 1);
    double took = wf_now() - t0;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(ready[0]);
    close(ready[1]);
    cr_assert_eq(st, SYMM_ERR_PEER, "got %s: %s", symm_status_name(st), symm_last_error());
    cr_assert(strstr(symm_last_error(), "belongs to uid 65534, not to this user"), "%s", symm_last_error());
    cr_assert(took < 0.5, "refusing took %.2f s", took);
    wf_rmtree(t.dir);
}

/* Rank 2 joins and is killed while rank 3 is still missing: the others learn
 * of it at once, not at the timeout. */
static int rank_dies_in_create(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    world_test *t = arg;
    if (i == 3)
        return 0;
    if (i == 2) {
        signal(SIGALRM, kill_self);
        struct itimerval it = {.it_value = {.tv_usec = 300000}};
        setitimer(ITIMER_REAL, &it, NULL);
    }
    symm_world_config cfg = cfg_of(t, i);
    symm_world *w = NULL;
    double t0 = wf_now();
    symm_status st = symm_world_create(&cfg, &w);
    wf_record(res, st, t0);
    symm_world_destroy(w);
    return 0;
}

Test(world, rank_dying_during_create_is_named_at_once)
{
    world_test t;
    setup(&t, 4, 5);
    wf_result *r = wf_run(4, rank_dies_in_create, &t, 15);
    cr_assert_not(r[2].done, "rank 2 was meant to die");
    for (int i = 0; i < 2; i++) {
        wf_expect_status(r, i, SYMM_ERR_PEER, "rank 2 disconnected during symm_world_create (rank 3 had not joined yet)");
        cr_assert(r[i].elapsed_s < 1.5, "rank %d learned of it after %.2f s (timeout 5 s)", i, r[i].elapsed_s);
    }
    wf_free(r, 4);
    wf_rmtree(t.dir);
}

/* wf_watchdog, which the CPU tests use instead of Criterion's .timeout: a
 * test process that hangs past its limit says so on stderr and dies by
 * SIGALRM. */
Test(world, watchdog_ends_a_hung_test_process_saying_so)
{
    wf_watchdog(30); /* this process's own, should the child's never fire */
    int fds[2];
    cr_assert_eq(pipe(fds), 0, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        wf_watchdog(1);
        for (;;)
            pause();
    }
    close(fds[1]);
    char msg[256] = {0};
    size_t got = 0;
    ssize_t n;
    while (got < sizeof msg - 1 && (n = read(fds[0], msg + got, sizeof msg - 1 - got)) > 0)
        got += (size_t)n;
    close(fds[0]);
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM, "status 0x%x, expected death by SIGALRM", st);
    cr_assert(strstr(msg, "watchdog: the test ran past its limit of 1 s") != NULL, "stderr: \"%s\"", msg);
}
