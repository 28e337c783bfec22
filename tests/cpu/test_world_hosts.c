/* test_world_hosts.c: worlds across hosts, among forked processes of this
 * machine that form simulated hosts (host ids "sim0", "sim1", ..., a socket
 * directory each, a TCP rendezvous on 127.0.0.1): the host table and host
 * worlds, collectives over TCP, and every way a connection, a rank or a host
 * can be wrong, missing or dead, each bounded by a short timeout. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sha256.h"
#include "symm_heap.h"
#include "symm_world.h"
#include "world_expect.h"
#include "world_fork.h"
#include "world_internal.h"

TestSuite(hosts, .fini = wf_cleanup_tempdirs);

#define MAX_RANKS 8

typedef struct hosts_test {
    char dir[128];
    char job[256];
    char secret[65];
    char root[64];
    int port;
    int size;
    double timeout;
    uint64_t seed;
    int host_of[MAX_RANKS];   /* simulated host of each rank */
    int local_of[MAX_RANKS];  /* the local rank each says */
    int lsize_of[MAX_RANKS];  /* the local size each says (0: unknown) */
    int absent[MAX_RANKS];    /* ranks that never join */
    char secret_of[MAX_RANKS][65]; /* a rank's own secret ("" : the job's) */
    int victim;               /* a rank that exits after joining (-1: none) */
} hosts_test;

/* size ranks on hosts of per_host ranks each, host-major. */
static void setup(hosts_test *t, int size, int per_host, double timeout)
{
    memset(t, 0, sizeof *t);
    wf_tempdir(t->dir, sizeof t->dir);
    cr_assert(t->dir[0], "mkdtemp failed");
    wf_job_id(t->job, sizeof t->job);
    wf_secret(t->secret);
    wf_random(&t->seed, sizeof t->seed);
    t->port = wf_free_port();
    cr_assert(t->port > 0, "no free port");
    snprintf(t->root, sizeof t->root, "127.0.0.1:%d", t->port);
    t->size = size;
    t->timeout = timeout;
    t->victim = -1;
    for (int r = 0; r < size; r++) {
        t->host_of[r] = r / per_host;
        t->local_of[r] = r % per_host;
        t->lsize_of[r] = per_host;
    }
    for (int h = 0; h < MAX_RANKS; h++) {
        char sub[160];
        snprintf(sub, sizeof sub, "%s/h%d", t->dir, h);
        cr_assert(mkdir(sub, 0700) == 0, "mkdir %s: %s", sub, strerror(errno));
    }
}

/* Rank i joins as t says: its own host id and socket directory. */
static symm_status join(const hosts_test *t, int i, symm_world **w)
{
    char host[16], sub[160];
    snprintf(host, sizeof host, "sim%d", t->host_of[i]);
    snprintf(sub, sizeof sub, "%s/h%d", t->dir, t->host_of[i]);
    symm_world_config cfg = {.rank = i, .size = t->size, .local_rank = t->local_of[i], .device = -1,
                             .job_id = t->job, .secret = t->secret_of[i][0] ? t->secret_of[i] : t->secret,
                             .socket_dir = sub, .timeout_s = t->timeout, .root_addr = t->root, .host_id = host,
                             .local_size = t->lsize_of[i]};
    return symm_world_create(&cfg, w);
}

/* --- a world of 2 and 3 simulated hosts ------------------------------------ */

/* What t says of the hosts, as the world must know them. */
static int check_table(symm_world *w, const hosts_test *t, int me, wf_result *res)
{
    int hosts = 0, first[MAX_RANKS], index_of[MAX_RANKS];
    for (int r = 0; r < t->size; r++) {
        int h = 0;
        while (h < hosts && t->host_of[first[h]] != t->host_of[r])
            h++;
        if (h == hosts)
            first[hosts++] = r;
        index_of[r] = h;
    }
    int mine = 0, major = 1;
    for (int r = 0; r < t->size; r++) {
        mine += index_of[r] == index_of[me];
        if (symm_world_rank_host(w, r) != index_of[r])
            return wf_failf(res, "rank %d: rank %d is on host %d, expected %d", me, r, symm_world_rank_host(w, r),
                            index_of[r]);
    }
    for (int r = 0; r < t->size; r++)
        major &= r == index_of[r] * mine + t->local_of[r] && t->lsize_of[r] == mine;
    char want[16];
    snprintf(want, sizeof want, "sim%d", t->host_of[me]);
    if (symm_world_host_count(w) != hosts || symm_world_host(w) != index_of[me] ||
        symm_world_local_size(w) != mine || symm_world_local_rank(w) != t->local_of[me])
        return wf_failf(res, "rank %d: hosts %d host %d local size %d local rank %d, expected %d %d %d %d", me,
                        symm_world_host_count(w), symm_world_host(w), symm_world_local_size(w),
                        symm_world_local_rank(w), hosts, index_of[me], mine, t->local_of[me]);
    if (strcmp(symm_world_host_name(w, index_of[me]), want) || symm_world_host_name(w, hosts) ||
        symm_world_host_name(w, -1) || symm_world_rank_host(w, t->size) != -1 || symm_world_rank_host(w, -1) != -1)
        return wf_failf(res, "rank %d: host names or out-of-range answers are wrong", me);
    if (symm_world_host_major(w) != major)
        return wf_failf(res, "rank %d: host_major %d, expected %d", me, symm_world_host_major(w), major);
    symm_world *hw = symm_world_host_world(w);
    if (!hw || hw == w || symm_world_size(hw) != mine || symm_world_rank(hw) != t->local_of[me] ||
        symm_world_host_count(hw) != 1 || symm_world_host_world(hw) != hw ||
        strcmp(symm_world_host_name(hw, 0), want))
        return wf_failf(res, "rank %d: the host world is not this host's ranks", me);
    return 0;
}

static int check_collectives(symm_world *w, const hosts_test *t, int me, wf_result *res)
{
    const size_t bytes = 3000 + t->seed % 500;
    unsigned char *send = malloc(bytes), *recv = malloc(bytes * (size_t)t->size), *want = malloc(bytes);
    int code = 0;
    wf_fill(send, bytes, t->seed, (uint64_t)me, 1);
    symm_status st = symm_world_allgather(w, send, recv, bytes);
    if (st)
        code = wf_failed_call(res, "symm_world_allgather", st);
    for (int r = 0; r < t->size && !code; r++) {
        wf_fill(want, bytes, t->seed, (uint64_t)r, 1);
        if (memcmp(recv + (size_t)r * bytes, want, bytes))
            code = wf_failf(res, "allgather: rank %d's part differs on rank %d", r, me);
    }
    if (!code) {
        int root = t->size - 1;
        wf_fill(want, bytes, t->seed, 99, 2);
        if (me == root)
            memcpy(send, want, bytes);
        st = symm_world_bcast(w, send, bytes, root);
        code = st ? wf_failed_call(res, "symm_world_bcast", st)
                  : memcmp(send, want, bytes) ? wf_failf(res, "bcast: rank %d got other bytes", me) : 0;
    }
    if (!code && (st = symm_world_barrier(w)))
        code = wf_failed_call(res, "symm_world_barrier", st);
    free(send);
    free(recv);
    free(want);
    return code;
}

/* Descriptors: refused on the world across hosts (and so is the heap),
 * passed within the host world. */
static int check_fds(symm_world *w, const hosts_test *t, int me, wf_result *res, wf_result *all)
{
    int fds[MAX_RANKS];
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    symm_status st = symm_world_allgather_fd(w, fd, fds);
    if (st != SYMM_ERR_UNSUPPORTED || !strstr(symm_last_error(), "sim0, sim1") ||
        !strstr(symm_last_error(), "symm_world_host_world") || fds[0] != -1)
        return wf_failf(res, "allgather_fd across hosts: %s: %s", symm_status_name(st), symm_last_error());
    close(fd);
    symm_alloc *a = NULL;
    st = symm_alloc_create(w, NULL, 4096, 0, &a);
    if (st != SYMM_ERR_UNSUPPORTED || !strstr(symm_last_error(), "sim0, sim1") || a)
        return wf_failf(res, "symm_alloc_create across hosts: %s: %s", symm_status_name(st), symm_last_error());
    /* Each rank's token, read by the other ranks of its host. */
    char path[256];
    snprintf(path, sizeof path, "%s/token-%d-XXXXXX", t->dir, me);
    fd = mkstemp(path);
    if (fd < 0)
        return wf_failf(res, "mkstemp: %s", strerror(errno));
    unlink(path);
    wf_random(res->token, sizeof res->token);
    if (write(fd, res->token, sizeof res->token) != (ssize_t)sizeof res->token)
        return wf_failf(res, "write: %s", strerror(errno));
    res->flag = 1;
    if ((st = symm_world_barrier(w)))
        return wf_failed_call(res, "symm_world_barrier", st);
    symm_world *hw = symm_world_host_world(w);
    st = symm_world_allgather_fd(hw, fd, fds);
    close(fd);
    if (st)
        return wf_failed_call(res, "symm_world_allgather_fd on the host world", st);
    int code = 0;
    for (int r = 0; r < t->size; r++) {
        if (t->host_of[r] != t->host_of[me])
            continue;
        unsigned char tok[32];
        int lr = t->local_of[r];
        if (pread(fds[lr], tok, sizeof tok, 0) != (ssize_t)sizeof tok || memcmp(tok, all[r].token, sizeof tok))
            code = wf_failf(res, "rank %d: rank %d's token did not come through the host world", me, r);
    }
    for (int r = 0; r < symm_world_size(hw); r++)
        close(fds[r]);
    return code;
}

static int rank_world(int i, void *arg, wf_result *res, wf_result *all)
{
    const hosts_test *t = arg;
    symm_world *w = NULL;
    symm_status st = join(t, i, &w);
    if (st)
        return wf_failed_call(res, "symm_world_create", st);
    int code = check_table(w, t, i, res);
    if (!code)
        code = check_collectives(w, t, i, res);
    if (!code)
        code = check_fds(w, t, i, res, all);
    if (!code && (st = symm_world_barrier(w)))
        code = wf_failed_call(res, "symm_world_barrier", st);
    st = symm_world_destroy(w);
    if (!code && st)
        code = wf_failed_call(res, "symm_world_destroy", st);
    return code;
}

typedef struct shape {
    int size, per_host;
    int interleaved; /* ranks alternate hosts: not host-major */
} shape;

ParameterizedTestParameters(hosts, simulated_hosts_form_a_world)
{
    static shape shapes[] = {{4, 2, 0}, {6, 2, 0}, {3, 1, 0}, {4, 2, 1}};
    return cr_make_param_array(shape, shapes, sizeof shapes / sizeof shapes[0]);
}

ParameterizedTest(shape *s, hosts, simulated_hosts_form_a_world)
{
    wf_watchdog(60);
    hosts_test t;
    setup(&t, s->size, s->per_host, 10);
    if (s->interleaved) /* 0, 2 on sim0; 1, 3 on sim1 */
        for (int r = 0; r < s->size; r++) {
            t.host_of[r] = r % 2;
            t.local_of[r] = r / 2;
        }
    wf_result *r = wf_run(t.size, rank_world, &t, 30);
    wf_expect_success(r, t.size);
    wf_free(r, t.size);
    wf_rmtree(t.dir);
}

Test(hosts, one_rank_with_a_root_address_is_a_world_of_one_host)
{
    wf_watchdog(30);
    hosts_test t;
    setup(&t, 1, 1, 5);
    symm_world *w = NULL;
    symm_status st = join(&t, 0, &w);
    cr_assert_eq(st, SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(symm_world_host_count(w), 1);
    cr_assert_str_eq(symm_world_host_name(w, 0), "sim0");
    cr_assert_eq(symm_world_barrier(w), SYMM_OK);
    cr_assert_eq(symm_world_destroy(w), SYMM_OK);
    wf_rmtree(t.dir);
}

/* --- strangers, garbage and wrong secrets ---------------------------------- */

static int raw_connect(int port, double wait_s)
{
    double until = wf_now() + wait_s;
    while (wf_now() < until) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr = {.s_addr = htonl(INADDR_LOOPBACK)}};
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            struct timeval tv = {.tv_sec = 3};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            return fd;
        }
        close(fd);
        wf_sleep(0.01);
    }
    return -1;
}

static int read_all(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

/* The answer to an intruder: a REFUSE frame with reason, then EOF. */
static int expect_refusal(int fd, uint32_t reason, const char *who, wf_result *res)
{
    symm_world_frame f;
    if (read_all(fd, &f, sizeof f) || f.type != SYMM_FRAME_REFUSE || f.arg != reason)
        return wf_failf(res, "%s: no refusal %u from rank 0", who, reason);
    char byte;
    if (read(fd, &byte, 1) != 0)
        return wf_failf(res, "%s: rank 0 kept the connection open after refusing", who);
    return 0;
}

/* A silent stranger, one that sends garbage, one that knows the protocol
 * but not the secret, and one that replays a proof made for other nonces:
 * each is refused, and the real ranks still join. */
static int intruders(const hosts_test *t, wf_result *res)
{
    int silent = raw_connect(t->port, 5);
    if (silent < 0)
        return wf_failf(res, "cannot reach rank 0");
    int garbage = raw_connect(t->port, 1);
    char junk[sizeof(symm_tcp_hello)];
    memset(junk, 'x', sizeof junk);
    if (write(garbage, junk, sizeof junk) != (ssize_t)sizeof junk || expect_refusal(garbage, SYMM_REFUSE_PROTOCOL,
                                                                                     "garbage", res))
        return 1;
    close(garbage);
    symm_tcp_proof replay;
    for (int k = 0; k < 2; k++) {
        int fd = raw_connect(t->port, 1);
        symm_tcp_hello h = {.magic = SYMM_WORLD_TCP_MAGIC, .version = SYMM_WORLD_TCP_PROTOCOL}, c;
        wf_random(h.nonce, sizeof h.nonce);
        if (write(fd, &h, sizeof h) != (ssize_t)sizeof h || read_all(fd, &c, sizeof c) ||
            c.magic != SYMM_WORLD_TCP_MAGIC)
            return wf_failf(res, "no challenge from rank 0");
        symm_tcp_proof p = {.rank = 1, .size = t->size, .local_rank = 1, .local_size = 2};
        snprintf(p.host_id, sizeof p.host_id, "sim0");
        if (k == 0) {
            /* The right form, a MAC under a guessed key. */
            uint8_t key[32];
            wf_random(key, sizeof key);
            symm_hmac_sha256(key, sizeof key, &p, offsetof(symm_tcp_proof, mac), p.mac);
            replay = p;
        } else {
            p = replay;
        }
        if (write(fd, &p, sizeof p) != (ssize_t)sizeof p ||
            expect_refusal(fd, SYMM_REFUSE_SECRET, k ? "replay" : "wrong key", res))
            return 1;
        close(fd);
    }
    res->flag = 1;
    close(silent);
    return 0;
}

static int rank_or_intruder(int i, void *arg, wf_result *res, wf_result *all)
{
    const hosts_test *t = arg;
    if (i == t->size)
        return intruders(t, res);
    if (i > 0) /* the intruders come first */
        while (!all[t->size].flag && !all[t->size].done)
            wf_sleep(0.01);
    symm_world *w = NULL;
    symm_status st = join(t, i, &w);
    if (st)
        return wf_failed_call(res, "symm_world_create", st);
    st = symm_world_barrier(w);
    symm_world_destroy(w);
    return st ? wf_failed_call(res, "symm_world_barrier", st) : 0;
}

Test(hosts, strangers_garbage_and_wrong_secrets_are_refused_while_rank0_waits)
{
    wf_watchdog(60);
    hosts_test t;
    setup(&t, 4, 2, 10);
    wf_result *r = wf_run(t.size + 1, rank_or_intruder, &t, 30);
    wf_expect_success(r, t.size + 1);
    wf_free(r, t.size + 1);
    wf_rmtree(t.dir);
}

static int rank_expecting(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    const hosts_test *t = arg;
    if (t->absent[i])
        return 0;
    double t0 = wf_now();
    symm_world *w = NULL;
    symm_status st = join(t, i, &w);
    if (st == SYMM_OK && i == t->victim) {
        symm_world_destroy(w);
        _exit(0); /* dies after joining */
    }
    if (st == SYMM_OK) {
        t0 = wf_now();
        wf_sleep(0.2); /* the victim leaves meanwhile */
        st = symm_world_barrier(w);
        if (st == SYMM_OK)
            st = symm_world_allgather(w, &i, (int[MAX_RANKS]){0}, sizeof i);
    }
    symm_world_destroy(w);
    return wf_record(res, st, t0);
}

Test(hosts, wrong_secret_is_refused_naming_it)
{
    wf_watchdog(60);
    hosts_test t;
    setup(&t, 2, 1, 1.5);
    wf_secret(t.secret_of[1]);
    wf_result *r = wf_run(t.size, rank_expecting, &t, 20);
    wf_expect_status(r, 1, SYMM_ERR_PEER, "rank 0 refused this rank (1): wrong job secret");
    wf_expect_status(r, 0, SYMM_ERR_TIMEOUT, "rank 1 did not join");
    wf_free(r, t.size);
    wf_rmtree(t.dir);
}

/* A process at the root address that answers like rank 0 but cannot prove
 * the secret: the rank refuses it (the proof goes both ways). */
static int rank_or_impostor(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    const hosts_test *t = arg;
    if (i == 1) {
        double t0 = wf_now();
        symm_world *w = NULL;
        symm_status st = join(t, 1, &w);
        symm_world_destroy(w);
        return wf_record(res, st, t0);
    }
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)t->port),
                            .sin_addr = {.s_addr = htonl(INADDR_LOOPBACK)}};
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 4))
        return wf_failf(res, "impostor: bind: %s", strerror(errno));
    int fd = accept(lfd, NULL, NULL);
    symm_tcp_hello h, c = {.magic = SYMM_WORLD_TCP_MAGIC, .version = SYMM_WORLD_TCP_PROTOCOL};
    symm_tcp_proof p;
    wf_random(c.nonce, sizeof c.nonce);
    if (read_all(fd, &h, sizeof h) || write(fd, &c, sizeof c) != (ssize_t)sizeof c || read_all(fd, &p, sizeof p))
        return wf_failf(res, "impostor: the rank did not say hello and prove itself");
    symm_world_frame f = {.type = SYMM_FRAME_PROOF, .len = 32};
    uint8_t mac[32];
    wf_random(mac, sizeof mac);
    if (write(fd, &f, sizeof f) != (ssize_t)sizeof f || write(fd, mac, sizeof mac) != (ssize_t)sizeof mac)
        return wf_failf(res, "impostor: write: %s", strerror(errno));
    char byte;
    ssize_t k = read(fd, &byte, 1); /* the rank hangs up */
    close(fd);
    close(lfd);
    return k == 0 ? 0 : wf_failf(res, "impostor: the rank did not hang up");
}

Test(hosts, rank0_that_cannot_prove_the_secret_is_refused)
{
    wf_watchdog(60);
    hosts_test t;
    setup(&t, 2, 1, 3);
    wf_result *r = wf_run(2, rank_or_impostor, &t, 20);
    cr_assert(r[0].done && r[0].code == 0, "impostor: %s", r[0].msg);
    wf_expect_status(r, 1, SYMM_ERR_PEER, "could not prove the job secret");
    wf_free(r, 2);
    wf_rmtree(t.dir);
}

/* --- missing, dead and inconsistent ranks ---------------------------------- */

Test(hosts, host_that_never_arrives_times_out_naming_ranks_and_hosts)
{
    wf_watchdog(60);
    hosts_test t;
    setup(&t, 6, 2, 1.5);
    t.absent[4] = t.absent[5] = 1; /* sim2 never comes */
    t.absent[3] = 1;               /* and sim1 only in part */
    wf_result *r = wf_run(t.size, rank_expecting, &t, 20);
    const char *want = "ranks 3, 4, 5 did not join within 1.5 s at 127.0.0.1:";
    for (int i = 0; i < 3; i++) {
        wf_expect_status(r, i, SYMM_ERR_TIMEOUT, want);
        wf_expect_status(r, i, SYMM_ERR_TIMEOUT, "sim0 (2 of 2 ranks), sim1 (1 of 2 ranks)");
        cr_assert(r[i].elapsed_s < 1.5 + 3, "rank %d took %.1f s", i, r[i].elapsed_s);
    }
    wf_free(r, t.size);
    wf_rmtree(t.dir);
}

static void check_victim(int victim, const char *needle)
{
    wf_watchdog(60);
    hosts_test t;
    setup(&t, 4, 2, 3);
    t.victim = victim;
    wf_result *r = wf_run(t.size, rank_expecting, &t, 20);
    for (int i = 0; i < t.size; i++) {
        if (i == victim)
            continue;
        wf_expect_status(r, i, SYMM_ERR_PEER, needle);
        cr_assert(r[i].elapsed_s < 2.5, "rank %d took %.1f s: a dead rank must be seen at once", i,
                  r[i].elapsed_s);
    }
    wf_free(r, t.size);
    wf_rmtree(t.dir);
}

Test(hosts, rank_that_dies_after_joining_fails_every_peer_naming_it_and_its_host)
{
    check_victim(3, "rank 3 (host sim1) disconnected during symm_world_barrier");
}

Test(hosts, rank0_that_dies_after_joining_fails_every_peer)
{
    check_victim(0, "rank 0 (host sim0) disconnected during symm_world_barrier");
}

static int rank_stalls(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    const hosts_test *t = arg;
    symm_world *w = NULL;
    symm_status st = join(t, i, &w);
    if (st)
        return wf_failed_call(res, "symm_world_create", st);
    double t0 = wf_now();
    if (i == 3)
        wf_sleep(t->timeout + 1.5); /* alive, but never in the collective */
    else
        st = symm_world_barrier(w);
    symm_world_destroy(w);
    return wf_record(res, st, t0);
}

Test(hosts, rank_late_in_a_collective_times_out_naming_it_and_its_host)
{
    wf_watchdog(60);
    hosts_test t;
    setup(&t, 4, 2, 1);
    wf_result *r = wf_run(t.size, rank_stalls, &t, 20);
    for (int i = 0; i < 3; i++) {
        wf_expect_status(r, i, SYMM_ERR_TIMEOUT, "symm_world_barrier: rank 3 (host sim1) did not arrive within 1 s");
        cr_assert(r[i].elapsed_s < 1 + 2.5, "rank %d took %.1f s", i, r[i].elapsed_s);
    }
    wf_free(r, t.size);
    wf_rmtree(t.dir);
}

Test(hosts, disagreeing_local_sizes_fail_every_rank_naming_them)
{
    wf_watchdog(60);
    hosts_test t;
    setup(&t, 4, 2, 5);
    t.lsize_of[3] = 3;
    wf_result *r = wf_run(t.size, rank_expecting, &t, 20);
    for (int i = 0; i < t.size; i++) {
        wf_expect_status(r, i, SYMM_ERR_MISMATCH, "host sim1: rank 3 says its host has 3 ranks (local size), but 2 "
                                               "arrived with its host id (ranks 2, 3)");
        cr_assert(r[i].elapsed_s < 3, "rank %d took %.1f s", i, r[i].elapsed_s);
    }
    wf_free(r, t.size);
    wf_rmtree(t.dir);
}

Test(hosts, local_ranks_that_are_not_a_permutation_fail_every_rank_naming_them)
{
    wf_watchdog(60);
    hosts_test t;
    setup(&t, 4, 2, 5);
    t.local_of[3] = 0;
    wf_result *r = wf_run(t.size, rank_expecting, &t, 20);
    for (int i = 0; i < t.size; i++)
        wf_expect_status(r, i, SYMM_ERR_MISMATCH, "host sim1: ranks 2 and 3 both have local rank 0");
    wf_free(r, t.size);
    /* Out of range, with local sizes unknown. */
    setup(&t, 4, 2, 5);
    for (int i = 0; i < t.size; i++)
        t.lsize_of[i] = 0;
    t.local_of[1] = 2;
    r = wf_run(t.size, rank_expecting, &t, 20);
    for (int i = 0; i < t.size; i++)
        wf_expect_status(r, i, SYMM_ERR_MISMATCH, "host sim0: rank 1 has local rank 2, but the host has 2 ranks "
                                               "(ranks 0, 1): expected local ranks 0..1, each once");
    wf_free(r, t.size);
    wf_rmtree(t.dir);
}

/* --- configuration --------------------------------------------------------- */

Test(hosts, malformed_root_address_and_host_id_are_refused_naming_them)
{
    hosts_test t;
    setup(&t, 2, 1, 1);
    static const char *bad[] = {"node01", "node01:", "node01:0", "node01:65536", ":29500", "::1:29500",
                                "[::1]29500", "node01:29x"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(t.root, sizeof t.root, "%s", bad[k]);
        symm_world *w = NULL;
        symm_status st = join(&t, 0, &w);
        cr_assert_eq(st, SYMM_ERR_INVALID_ARG, "%s: %s", bad[k], symm_status_name(st));
        cr_assert(strstr(symm_last_error(), "root_addr") && strstr(symm_last_error(), "expected host:port"), "%s",
                  symm_last_error());
        cr_assert_null(w);
    }
    char long_id[200];
    memset(long_id, 'h', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    symm_world_config cfg = {.rank = 0, .size = 1, .device = -1, .job_id = t.job, .secret = t.secret,
                             .host_id = long_id};
    symm_world *w = NULL;
    cr_assert_eq(symm_world_create(&cfg, &w), SYMM_ERR_INVALID_ARG);
    cr_assert(strstr(symm_last_error(), "host_id") && strstr(symm_last_error(), "expected a host id of 1..127"),
              "%s", symm_last_error());
    cfg.host_id = NULL;
    cfg.local_size = 2;
    cr_assert_eq(symm_world_create(&cfg, &w), SYMM_ERR_INVALID_ARG);
    cr_assert(strstr(symm_last_error(), "local_size 2: expected 1..1"), "%s", symm_last_error());
    wf_rmtree(t.dir);
}

Test(hosts, root_port_in_use_is_named)
{
    hosts_test t;
    setup(&t, 2, 1, 1);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)t.port),
                            .sin_addr = {.s_addr = htonl(INADDR_LOOPBACK)}};
    cr_assert(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 1) == 0);
    symm_world *w = NULL;
    symm_status st = join(&t, 0, &w);
    close(lfd);
    cr_assert_eq(st, SYMM_ERR_STATE, "%s: %s", symm_status_name(st), symm_last_error());
    char want[64];
    snprintf(want, sizeof want, "port %d is in use", t.port);
    cr_assert(strstr(symm_last_error(), want), "%s", symm_last_error());
    wf_rmtree(t.dir);
}

/* A world of one host knows it too: its host is the machine's (or
 * SYMM_HOST_ID's), and it is its own host world. */
Test(hosts, a_world_of_one_host_is_its_own_host_world)
{
    char job[64], secret[65];
    wf_job_id(job, sizeof job);
    wf_secret(secret);
    symm_world_config cfg = {.rank = 0, .size = 1, .device = -1, .job_id = job, .secret = secret};
    symm_world *w = NULL;
    cr_assert_eq(symm_world_create(&cfg, &w), SYMM_OK, "%s", symm_last_error());
    char host[256];
    gethostname(host, sizeof host);
    cr_assert_eq(symm_world_host_count(w), 1);
    cr_assert_eq(symm_world_host(w), 0);
    cr_assert_eq(symm_world_local_size(w), 1);
    cr_assert_eq(symm_world_host_major(w), 1);
    cr_assert_eq(symm_world_rank_host(w, 0), 0);
    cr_assert_eq(symm_world_rank_host(w, 1), -1);
    cr_assert(!strncmp(symm_world_host_name(w, 0), host, strlen(host)), "%s", symm_world_host_name(w, 0));
    cr_assert_null(symm_world_host_name(w, 1));
    cr_assert_eq(symm_world_host_world(w), w);
    cr_assert_null(symm_world_host_world(NULL));
    symm_world_destroy(w);
    cfg.host_id = "rack7";
    cr_assert_eq(symm_world_create(&cfg, &w), SYMM_OK, "%s", symm_last_error());
    cr_assert_str_eq(symm_world_host_name(w, 0), "rack7");
    symm_world_destroy(w);
}

/* --- Slurm hostlists --------------------------------------------------------- */

Test(hosts, slurm_hostlists_expand_in_order)
{
    static const struct {
        const char *list;
        long count;
        const char *names[8];
    } cases[] = {
        {"gpu[01-04,07],login1", 6, {"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"}},
        {"node1", 1, {"node1"}},
        {"a,b,c", 3, {"a", "b", "c"}},
        {"n[8-10]", 3, {"n8", "n9", "n10"}},
        {"rack[1-2]-gpu[01-02]", 4, {"rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"}},
        {"x[007]y,z[1,3]", 3, {"x007y", "z1", "z3"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (long i = 0; i < cases[c].count; i++) {
            char buf[64] = "";
            long n = symm_wenv_hostlist(cases[c].list, i, buf, sizeof buf);
            cr_assert_eq(n, cases[c].count, "%s: %ld hosts", cases[c].list, n);
            cr_assert_str_eq(buf, cases[c].names[i], "%s, host %ld", cases[c].list, i);
        }
    static const char *bad[] = {"", "gpu[01-", "gpu01]", "gpu[4-1]", "gpu[]", "gpu[1,]", ",a", "a,", "a,,b",
                                "gpu[a-b]", "gpu[[1]]", "a b"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char buf[64];
        cr_assert_eq(symm_wenv_hostlist(bad[k], 0, buf, sizeof buf), -1, "\"%s\" was taken", bad[k]);
    }
    char small[4];
    cr_assert_eq(symm_wenv_hostlist("longname", 0, small, sizeof small), -1);
}
