/* world_tcp.c: the rendezvous of a world across hosts (symm_world_create with
 * a root address), and the host world each rank joins after it.
 *
 * Rank 0 listens on TCP at the root address's port and waits in one poll()
 * loop (world_root.c's), as on one host, so that no connection can make it
 * wait. A connection proves the job secret by challenge and response, and so
 * does rank 0 (docs/protocol.md):
 *   rank -> root   hello      magic, protocol, nonce_c (32 random bytes)
 *   root -> rank   challenge  magic, protocol, nonce_s
 *   rank -> root   proof      rank, size, local rank, local size, host id,
 *                             HMAC(key, "client", job id, nonce_c, nonce_s, fields)
 *   root -> rank   PROOF      HMAC(key, "root", job id, nonce_c, nonce_s, fields)
 *                  (or REFUSE, and the connection is closed)
 *   root -> rank   WELCOME    the host table, once every rank has joined
 *                  (or ERROR with a message)
 * key = SHA-256 of the job secret: the secret never travels, a MAC is good
 * for one pair of nonces only, and a rank trusts rank 0 only once it has
 * proven the secret too. A stranger, garbage, a wrong secret or protocol, a
 * rank out of range or one already joined is refused and rank 0 keeps
 * waiting. Once all have joined, rank 0 checks that host ids, local ranks and
 * local sizes agree, closes the listening socket and sends the host table;
 * then the ranks of each host form their host world over the Unix-socket
 * path (symm_world_create_local), with a job id of their own, and all ranks
 * agree that every host world was made. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sha256.h"
#include "world_internal.h"

#define NONCE 32

static const char call[] = "symm_world_create";

/* --- shared by both sides ---------------------------------------------- */

static symm_status random_bytes(uint8_t *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = getrandom(buf + got, n - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return symm_fail(SYMM_ERR_SYSTEM, "%s: getrandom: %s", call, strerror(errno));
        got += (size_t)k;
    }
    return SYMM_OK;
}

/* HMAC(key, "symm-world-tcp-v1", side, job id, nonce_c, nonce_s, the proof's
 * fields before its mac). */
static void proof_mac(const symm_wenv *env, const char *side, const uint8_t *nonce_c, const uint8_t *nonce_s,
                      const symm_tcp_proof *p, uint8_t mac[32])
{
    static const char tag[] = "symm-world-tcp-v1";
    symm_hmac_sha256_ctx m;
    symm_hmac_sha256_init(&m, env->key, sizeof env->key);
    symm_hmac_sha256_update(&m, tag, sizeof tag);
    symm_hmac_sha256_update(&m, side, strlen(side) + 1);
    symm_hmac_sha256_update(&m, env->job_id, strlen(env->job_id) + 1);
    symm_hmac_sha256_update(&m, nonce_c, NONCE);
    symm_hmac_sha256_update(&m, nonce_s, NONCE);
    symm_hmac_sha256_update(&m, p, offsetof(symm_tcp_proof, mac));
    symm_hmac_sha256_final(&m, mac);
}

static void set_nodelay(int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void addr_text(const symm_wenv *env, char *buf, size_t n)
{
    int v6 = strchr(env->root_host, ':') != NULL;
    snprintf(buf, n, "%s%s%s:%d", v6 ? "[" : "", env->root_host, v6 ? "]" : "", env->root_port);
}

/* "ranks 0, 1, 3": the ranks r with host_of[r] == h. */
static void ranks_of_host(const int *host_of, int size, int h, char *buf, size_t n)
{
    unsigned char *absent = calloc((size_t)size, 1);
    buf[0] = '\0';
    if (!absent)
        return;
    for (int r = 0; r < size; r++)
        absent[r] = host_of[r] != h;
    symm_world_missing_ranks(absent, size, buf, n);
    free(absent);
}

/* The table rank 0 sends in WELCOME: hosts, then host_of[size] and
 * local_of[size] (int32), then hosts host ids of SYMM_WORLD_HOST_ID_MAX bytes. */
typedef struct host_table {
    int32_t hosts;
    int32_t *host_of, *local_of;
    char (*ids)[SYMM_WORLD_HOST_ID_MAX];
} host_table;

static size_t table_bytes(int size, int hosts)
{
    return sizeof(int32_t) * (1 + 2 * (size_t)size) + (size_t)hosts * SYMM_WORLD_HOST_ID_MAX;
}

/* The world learns its hosts from the table (checked by rank 0, or by
 * table_check on the others). */
static symm_status adopt_table(symm_world *w, const host_table *t)
{
    int *rank_host = calloc((size_t)w->size, sizeof *rank_host);
    char(*ids)[SYMM_WORLD_HOST_ID_MAX] = calloc((size_t)t->hosts, sizeof *ids);
    if (!rank_host || !ids) {
        free(rank_host);
        free(ids);
        return symm_fail(SYMM_ERR_NOMEM, "%s: out of host memory", call);
    }
    memcpy(ids, t->ids, (size_t)t->hosts * sizeof *ids);
    for (int h = 0; h < t->hosts; h++)
        ids[h][SYMM_WORLD_HOST_ID_MAX - 1] = '\0';
    int *count = calloc((size_t)t->hosts, sizeof *count);
    if (!count) {
        free(rank_host);
        free(ids);
        return symm_fail(SYMM_ERR_NOMEM, "%s: out of host memory", call);
    }
    for (int r = 0; r < w->size; r++) {
        rank_host[r] = t->host_of[r];
        count[t->host_of[r]]++;
    }
    int major = 1;
    for (int r = 0; r < w->size; r++) {
        int h = t->host_of[r];
        major &= count[h] == count[0] && r == h * count[0] + t->local_of[r];
    }
    free(w->rank_host);
    free(w->host_ids);
    w->rank_host = rank_host;
    w->host_ids = ids;
    w->hosts = t->hosts;
    w->host = t->host_of[w->rank];
    w->local_size = count[w->host];
    w->host_major = major;
    free(count);
    return SYMM_OK;
}

/* --- rank 0 ---------------------------------------------------------------- */

typedef struct tcp_pending {
    int fd;
    int stage; /* 0: reading the hello, 1: reading the proof */
    size_t got;
    uint8_t nonce_c[NONCE], nonce_s[NONCE];
    union {
        symm_tcp_hello hello;
        symm_tcp_proof proof;
    } u;
} tcp_pending;

typedef struct tcp_root {
    symm_wroot root; /* first: the loop's functions reach the rest through it */
    const symm_wenv *env;
    tcp_pending pend[SYMM_WROOT_MAX_PENDING];
    symm_tcp_proof *info; /* what each joined rank said */
} tcp_root;

static int is_loopback(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family == AF_INET6) {
        const struct in6_addr *x = &((const struct sockaddr_in6 *)a)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(x) || (IN6_IS_ADDR_V4MAPPED(x) && x->s6_addr[12] == 127);
    }
    return 0;
}

static symm_status bind_one(int family, const struct sockaddr *addr, socklen_t len, const symm_wenv *env,
                            int *out)
{
    char where[SYMM_WORLD_ADDR_MAX + 16];
    addr_text(env, where, sizeof where);
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return symm_fail(SYMM_ERR_SYSTEM, "%s: socket: %s", call, strerror(errno));
    int one = 1, zero = 0;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (family == AF_INET6)
        (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, addr, len) != 0 || listen(fd, SOMAXCONN) != 0) {
        int err = errno;
        close(fd);
        if (err == EADDRINUSE)
            return symm_fail(SYMM_ERR_STATE, "%s: rank 0 cannot listen at %s (%s): port %d is in use on this "
                             "host (another job's rendezvous, or another program): choose another port "
                             "(SYMM_ROOT_PORT, or the port of SYMM_ROOT_ADDR)", call, where, env->root_var,
                             env->root_port);
        errno = err;
        return SYMM_ERR_SYSTEM;
    }
    *out = fd;
    return SYMM_OK;
}

/* Listen at the root address's port: on the address itself when it is a
 * loopback literal or "localhost" (simulated hosts stay on this machine),
 * else on every interface: a name may resolve to another address here than
 * elsewhere (Debian maps a host's own name to 127.0.1.1). */
static symm_status root_listen(const symm_wenv *env, int *out)
{
    char port[16], where[SYMM_WORLD_ADDR_MAX + 16];
    snprintf(port, sizeof port, "%d", env->root_port);
    addr_text(env, where, sizeof where);
    int numeric = strcmp(env->root_host, "localhost") != 0;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (numeric ? AI_NUMERICHOST : 0)}, *res = NULL;
    symm_status st = SYMM_ERR_SYSTEM;
    if (getaddrinfo(env->root_host, port, &hints, &res) == 0 && res && is_loopback(res->ai_addr))
        st = bind_one(res->ai_family, res->ai_addr, res->ai_addrlen, env, out);
    else {
        struct sockaddr_in6 any6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)env->root_port),
                                    .sin6_addr = IN6ADDR_ANY_INIT};
        struct sockaddr_in any4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)env->root_port),
                                   .sin_addr = {.s_addr = htonl(INADDR_ANY)}};
        st = bind_one(AF_INET6, (struct sockaddr *)&any6, sizeof any6, env, out);
        if (st == SYMM_ERR_SYSTEM)
            st = bind_one(AF_INET, (struct sockaddr *)&any4, sizeof any4, env, out);
    }
    if (res)
        freeaddrinfo(res);
    if (st == SYMM_ERR_SYSTEM)
        return symm_fail(SYMM_ERR_SYSTEM, "%s: rank 0 cannot listen at %s (%s): %s", call, where, env->root_var,
                         strerror(errno));
    return st;
}

static void drop(tcp_pending *p, uint32_t reason, uint64_t detail)
{
    if (reason)
        symm_wroot_refuse(p->fd, reason, detail);
    close(p->fd);
    p->fd = -1;
}

/* A complete hello: answer with the challenge, or refuse. */
static void hello_read(tcp_pending *p)
{
    const symm_tcp_hello *h = &p->u.hello;
    if (h->magic != SYMM_WORLD_TCP_MAGIC || h->version != SYMM_WORLD_TCP_PROTOCOL) {
        drop(p, SYMM_REFUSE_PROTOCOL, SYMM_WORLD_TCP_PROTOCOL);
        return;
    }
    memcpy(p->nonce_c, h->nonce, NONCE);
    symm_tcp_hello c = {.magic = SYMM_WORLD_TCP_MAGIC, .version = SYMM_WORLD_TCP_PROTOCOL};
    if (random_bytes(p->nonce_s, NONCE) != SYMM_OK) {
        drop(p, 0, 0);
        return;
    }
    memcpy(c.nonce, p->nonce_s, NONCE);
    if (symm_wio_send(p->fd, &c, sizeof c, -1, symm_wio_now() + 0.2, 0) != SYMM_WIO_OK) {
        drop(p, 0, 0);
        return;
    }
    p->stage = 1;
    p->got = 0;
}

/* A complete proof: the rank joins (and gets rank 0's proof) or is refused.
 * Returns 1 when it joined. */
static int proof_read(tcp_root *z, tcp_pending *p)
{
    symm_world *w = z->root.w;
    symm_tcp_proof *q = &p->u.proof;
    uint8_t want[32];
    proof_mac(z->env, "client", p->nonce_c, p->nonce_s, q, want);
    if (!symm_world_digest_equal(want, q->mac)) {
        drop(p, SYMM_REFUSE_SECRET, 0);
        return 0;
    }
    if (q->size != w->size) {
        drop(p, SYMM_REFUSE_SIZE, (uint64_t)w->size);
        return 0;
    }
    if (q->rank <= 0 || q->rank >= w->size || q->local_rank < 0 || q->local_rank >= w->size ||
        q->local_size < 0 || q->local_size > w->size || !memchr(q->host_id, '\0', sizeof q->host_id) ||
        !q->host_id[0]) {
        drop(p, SYMM_REFUSE_RANK, 0);
        return 0;
    }
    if (w->conn[q->rank] >= 0) {
        drop(p, SYMM_REFUSE_DUPLICATE, 0);
        return 0;
    }
    uint8_t mac[32];
    proof_mac(z->env, "root", p->nonce_c, p->nonce_s, q, mac);
    symm_world_frame f = {.type = SYMM_FRAME_PROOF, .len = sizeof mac};
    if (symm_wio_send_frame(p->fd, &f, mac, symm_wio_now() + 0.2, 0) != SYMM_WIO_OK) {
        drop(p, 0, 0);
        return 0;
    }
    z->info[q->rank] = *q;
    w->conn[q->rank] = p->fd;
    p->fd = -1;
    return 1;
}

static int admit(symm_wroot *root, int fd)
{
    (void)root;
    set_nodelay(fd);
    return 1;
}

static int pending_read(symm_wroot *root, void *arg)
{
    tcp_pending *p = arg;
    size_t want = p->stage == 0 ? sizeof p->u.hello : sizeof p->u.proof, got = 0;
    symm_wio r = symm_wio_recv_some(p->fd, (char *)&p->u + p->got, want - p->got, &got);
    if (r != SYMM_WIO_OK) {
        drop(p, 0, 0);
        return 0;
    }
    p->got += got;
    if (p->got < want)
        return 0;
    if (p->stage == 0) {
        hello_read(p);
        return 0;
    }
    return proof_read((tcp_root *)root, p);
}

/* "ranks 2, 3 did not join within 5 s (hosts heard from: sim0 (2 of 2
 * ranks), sim1 (1 rank); no rank of another host arrived)". */
static symm_status not_joined(const tcp_root *z, int gone, const char *verb, symm_status st)
{
    const symm_world *w = z->root.w;
    unsigned char *present = calloc((size_t)w->size, 1);
    char list[256] = "some ranks", hosts[640] = "";
    if (present) {
        for (int r = 0; r < w->size; r++)
            present[r] = r == 0 || r == gone || w->conn[r] >= 0;
        symm_world_missing_ranks(present, w->size, list, sizeof list);
    }
    size_t used = 0;
    for (int r = 0; present && r < w->size && used < sizeof hosts; r++) {
        if (r == gone || !(r == 0 || w->conn[r] >= 0))
            continue;
        int first = 1, count = 0;
        for (int q = 0; q < w->size; q++)
            if ((q == 0 || w->conn[q] >= 0) && q != gone && !strcmp(z->info[q].host_id, z->info[r].host_id)) {
                first &= q >= r;
                count++;
            }
        if (!first)
            continue;
        char label[SYMM_WORLD_HOST_ID_MAX], of[32] = "";
        symm_world_host_label(z->info[r].host_id, label, sizeof label);
        if (z->info[r].local_size > 0)
            snprintf(of, sizeof of, " of %d", z->info[r].local_size);
        used += (size_t)snprintf(hosts + used, sizeof hosts - used, "%s%s (%d%s rank%s)", used ? ", " : "", label,
                                 count, of, count == 1 && !of[0] ? "" : "s");
    }
    free(present);
    char where[SYMM_WORLD_ADDR_MAX + 16];
    addr_text(z->env, where, sizeof where);
    if (gone >= 0)
        return symm_fail(st, "rank %d (host %s) disconnected during %s (%s had not joined yet; hosts heard from: "
                         "%s)", gone, z->info[gone].host_id, call, list, hosts);
    return symm_fail(st, "%s: %s %s within %g s at %s (hosts heard from: %s; no rank of any other host arrived)",
                     call, list, verb, w->timeout_s, where, hosts);
}

static symm_status left(symm_wroot *root, int r, int eof)
{
    const tcp_root *z = (const tcp_root *)root;
    if (!eof)
        return symm_fail(SYMM_ERR_PEER, "%s: rank %d (host %s) sent an unexpected message before the world was "
                         "complete", call, r, z->info[r].host_id);
    return not_joined(z, r, "", SYMM_ERR_PEER);
}

static symm_status timed_out(symm_wroot *root)
{
    return not_joined((const tcp_root *)root, -1, "did not join", SYMM_ERR_TIMEOUT);
}

/* Number the hosts in the order of their lowest rank and check what every
 * rank said of its host: local sizes agree with the ranks that arrived, and
 * the local ranks of a host are 0..n-1, each once. */
static symm_status build_table(const symm_world *w, const symm_tcp_proof *info, host_table *t)
{
    const int size = w->size;
    int *count = calloc((size_t)size, sizeof *count), *base = calloc((size_t)size, sizeof *base);
    int *slot = calloc((size_t)size, sizeof *slot);
    symm_status st = SYMM_OK;
    if (!count || !base || !slot)
        st = symm_fail(SYMM_ERR_NOMEM, "%s: out of host memory", call);
    t->hosts = 0;
    for (int r = 0; st == SYMM_OK && r < size; r++) {
        int h = 0;
        while (h < t->hosts && strcmp(t->ids[h], info[r].host_id))
            h++;
        if (h == t->hosts)
            memcpy(t->ids[t->hosts++], info[r].host_id, SYMM_WORLD_HOST_ID_MAX);
        t->host_of[r] = h;
        t->local_of[r] = info[r].local_rank;
        count[h]++;
    }
    for (int h = 1; st == SYMM_OK && h < t->hosts; h++)
        base[h] = base[h - 1] + count[h - 1];
    for (int r = 0; st == SYMM_OK && r < size; r++)
        slot[r] = -1;
    char ranks[256], label[SYMM_WORLD_HOST_ID_MAX];
    for (int r = 0; st == SYMM_OK && r < size; r++) {
        const int h = t->host_of[r], lr = info[r].local_rank, ls = info[r].local_size;
        if ((ls == 0 || ls == count[h]) && lr < count[h] && slot[base[h] + lr] < 0) {
            slot[base[h] + lr] = r;
            continue;
        }
        symm_world_host_label(t->ids[h], label, sizeof label);
        ranks_of_host(t->host_of, size, h, ranks, sizeof ranks);
        if (ls > 0 && ls != count[h])
            st = symm_fail(SYMM_ERR_MISMATCH, "%s: host %s: rank %d says its host has %d ranks (local size), but "
                           "%d arrived with its host id (%s): the launcher's local sizes and host ids disagree",
                           call, label, r, ls, count[h], ranks);
        else if (lr >= count[h])
            st = symm_fail(SYMM_ERR_MISMATCH, "%s: host %s: rank %d has local rank %d, but the host has %d ranks "
                           "(%s): expected local ranks 0..%d, each once", call, label, r, lr, count[h], ranks,
                           count[h] - 1);
        else
            st = symm_fail(SYMM_ERR_MISMATCH, "%s: host %s: ranks %d and %d both have local rank %d (the host's "
                           "%s): expected local ranks 0..%d, each once", call, label, slot[base[h] + lr], r, lr,
                           ranks, count[h] - 1);
    }
    free(count);
    free(base);
    free(slot);
    return st;
}

static symm_status send_welcome(symm_world *w, const host_table *t)
{
    size_t n = table_bytes(w->size, t->hosts);
    char *buf = malloc(n);
    if (!buf)
        return symm_fail(SYMM_ERR_NOMEM, "%s: out of host memory", call);
    size_t at = 0;
    memcpy(buf, &t->hosts, sizeof t->hosts);
    at += sizeof t->hosts;
    memcpy(buf + at, t->host_of, sizeof *t->host_of * (size_t)w->size);
    at += sizeof *t->host_of * (size_t)w->size;
    memcpy(buf + at, t->local_of, sizeof *t->local_of * (size_t)w->size);
    at += sizeof *t->local_of * (size_t)w->size;
    memcpy(buf + at, t->ids, (size_t)t->hosts * SYMM_WORLD_HOST_ID_MAX);
    symm_world_frame f = {.type = SYMM_FRAME_WELCOME, .count = (uint64_t)w->size, .len = n};
    double deadline = symm_wio_now() + w->timeout_s;
    symm_status st = SYMM_OK;
    for (int r = 1; r < w->size && st == SYMM_OK; r++) {
        symm_wio io = symm_wio_send_frame(w->conn[r], &f, buf, deadline, 0);
        if (io != SYMM_WIO_OK) {
            char who[SYMM_WORLD_HOST_ID_MAX + 32];
            st = symm_fail(io == SYMM_WIO_TIMEOUT ? SYMM_ERR_TIMEOUT : SYMM_ERR_PEER,
                           "%s disconnected during %s", symm_world_who(w, r, who, sizeof who), call);
        }
    }
    free(buf);
    return st;
}

/* Frees what t holds and leaves it empty, so that freeing it again (after
 * a failed table_alloc) does nothing. */
static void table_free(host_table *t)
{
    free(t->host_of);
    free(t->local_of);
    free(t->ids);
    t->host_of = NULL;
    t->local_of = NULL;
    t->ids = NULL;
}

static symm_status table_alloc(host_table *t, int size, int hosts)
{
    t->host_of = calloc((size_t)size, sizeof *t->host_of);
    t->local_of = calloc((size_t)size, sizeof *t->local_of);
    t->ids = calloc((size_t)hosts, sizeof *t->ids);
    if (!t->host_of || !t->local_of || !t->ids) {
        table_free(t);
        return symm_fail(SYMM_ERR_NOMEM, "%s: out of host memory", call);
    }
    return SYMM_OK;
}

static symm_status root_rendezvous(symm_world *w, const symm_world_config *cfg, const symm_wenv *env)
{
    tcp_root *z = calloc(1, sizeof *z);
    if (z)
        z->info = calloc((size_t)w->size, sizeof *z->info);
    if (!z || !z->info) {
        free(z);
        return symm_fail(SYMM_ERR_NOMEM, "%s: out of host memory", call);
    }
    z->root = (symm_wroot){.w = w, .lfd = -1, .pend = z->pend, .pend_size = sizeof z->pend[0], .joined = 1,
                           .admit = admit, .read = pending_read, .left = left, .timeout = timed_out};
    z->env = env;
    z->info[0] = (symm_tcp_proof){.rank = 0, .size = w->size, .local_rank = cfg->local_rank,
                                  .local_size = cfg->local_size};
    memcpy(z->info[0].host_id, env->host_id, sizeof env->host_id);
    symm_status st = w->size > 1 ? root_listen(env, &z->root.lfd) : SYMM_OK;
    if (st == SYMM_OK)
        st = symm_wroot_wait(&z->root);
    if (z->root.lfd >= 0)
        close(z->root.lfd);
    host_table t = {0};
    if (st == SYMM_OK)
        st = table_alloc(&t, w->size, w->size);
    if (st == SYMM_OK)
        st = build_table(w, z->info, &t);
    if (st == SYMM_OK)
        st = send_welcome(w, &t);
    if (st == SYMM_OK)
        st = adopt_table(w, &t);
    if (st != SYMM_OK)
        symm_wroot_tell_error(w, st);
    table_free(&t);
    free(z->info);
    free(z);
    return st;
}

/* --- ranks other than 0 -------------------------------------------------- */

/* One connection attempt to every address of the root; *fd_out >= 0 on
 * success, else why (for the timeout's message). */
static void try_connect(const symm_wenv *env, double deadline, int *fd_out, char *why, size_t n)
{
    char port[16];
    snprintf(port, sizeof port, "%d", env->root_port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res = NULL;
    *fd_out = -1;
    int rc = getaddrinfo(env->root_host, port, &hints, &res);
    if (rc != 0) {
        snprintf(why, n, "cannot resolve %s: %s", env->root_host, gai_strerror(rc));
        return;
    }
    for (struct addrinfo *a = res; a && *fd_out < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            snprintf(why, n, "socket: %s", strerror(errno));
            continue;
        }
        int err = 0;
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS) {
                struct pollfd p = {.fd = fd, .events = POLLOUT};
                double until = symm_wio_now() + 2.0 < deadline ? symm_wio_now() + 2.0 : deadline;
                socklen_t len = sizeof err;
                int k = poll(&p, 1, symm_wio_poll_ms(until));
                if (k <= 0)
                    err = ETIMEDOUT;
                else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
                    err = errno;
            }
        }
        if (err) {
            snprintf(why, n, "%s", strerror(err));
            close(fd);
            continue;
        }
        set_nodelay(fd);
        *fd_out = fd;
    }
    freeaddrinfo(res);
}

static symm_status refused(const symm_world *w, const symm_wenv *env, const symm_world_frame *f)
{
    char secret[640], where[SYMM_WORLD_ADDR_MAX + 16];
    addr_text(env, where, sizeof where);
    snprintf(secret, sizeof secret, "wrong job secret: the rank 0 listening at %s (%s) has another one: this rank's "
             "SYMM_JOB_SECRET (or job id \"%.200s\") differs from its rank 0's, or another job listens there", where,
             env->root_var, env->job_id);
    return symm_world_refused(w, f, SYMM_WORLD_TCP_PROTOCOL, secret,
                              "rank, local rank, local size or host id out of range");
}

static symm_status io_trouble(symm_wio io, const char *where, const char *doing)
{
    if (io == SYMM_WIO_TIMEOUT)
        return symm_fail(SYMM_ERR_TIMEOUT, "%s: rank 0 at %s did not answer within the timeout (%s)", call, where,
                         doing);
    if (io == SYMM_WIO_EOF)
        return symm_fail(SYMM_ERR_PEER, "%s: rank 0 at %s closed the connection (%s)", call, where, doing);
    return symm_fail(SYMM_ERR_SYSTEM, "%s: talking to rank 0 at %s (%s): %s", call, where, doing, strerror(errno));
}

/* The host table in a WELCOME frame f, checked before it is believed. */
static symm_status read_welcome(symm_world *w, int fd, const symm_world_frame *f, double deadline,
                                const char *where)
{
    int32_t hosts = 0;
    if (f->count != (uint64_t)w->size || f->len < sizeof hosts)
        return symm_fail(SYMM_ERR_PEER, "%s: rank 0 at %s sent a malformed welcome", call, where);
    symm_wio io = symm_wio_recv(fd, &hosts, sizeof hosts, NULL, deadline);
    if (io != SYMM_WIO_OK)
        return io_trouble(io, where, "reading the host table");
    if (hosts < 1 || hosts > w->size || f->len != table_bytes(w->size, hosts))
        return symm_fail(SYMM_ERR_PEER, "%s: rank 0 at %s sent a malformed host table", call, where);
    host_table t = {.hosts = hosts};
    SYMM_TRY(table_alloc(&t, w->size, hosts));
    io = symm_wio_recv(fd, t.host_of, sizeof *t.host_of * (size_t)w->size, NULL, deadline);
    if (io == SYMM_WIO_OK)
        io = symm_wio_recv(fd, t.local_of, sizeof *t.local_of * (size_t)w->size, NULL, deadline);
    if (io == SYMM_WIO_OK)
        io = symm_wio_recv(fd, t.ids, (size_t)hosts * SYMM_WORLD_HOST_ID_MAX, NULL, deadline);
    symm_status st = io == SYMM_WIO_OK ? SYMM_OK : io_trouble(io, where, "reading the host table");
    for (int r = 0; st == SYMM_OK && r < w->size; r++)
        if (t.host_of[r] < 0 || t.host_of[r] >= hosts || t.local_of[r] < 0 || t.local_of[r] >= w->size)
            st = symm_fail(SYMM_ERR_PEER, "%s: rank 0 at %s sent a malformed host table", call, where);
    if (st == SYMM_OK && t.local_of[w->rank] != w->local_rank)
        st = symm_fail(SYMM_ERR_PEER, "%s: rank 0's host table gives this rank (%d) local rank %d, not %d", call,
                       w->rank, t.local_of[w->rank], w->local_rank);
    if (st == SYMM_OK)
        st = adopt_table(w, &t);
    table_free(&t);
    return st;
}

/* After connecting: the challenge and response, then rank 0's verdict.
 * SYMM_OK with *retry set when rank 0 closed the connection before proving
 * itself: connect again. */
static symm_status handshake(symm_world *w, const symm_world_config *cfg, const symm_wenv *env, int fd,
                             double deadline, int *retry)
{
    char where[SYMM_WORLD_ADDR_MAX + 16];
    addr_text(env, where, sizeof where);
    *retry = 0;
    symm_tcp_hello hello = {.magic = SYMM_WORLD_TCP_MAGIC, .version = SYMM_WORLD_TCP_PROTOCOL}, chal;
    SYMM_TRY(random_bytes(hello.nonce, NONCE));
    /* The answer is a challenge, or a REFUSE frame (of a frame's size). */
    symm_world_frame f;
    _Static_assert(sizeof f < sizeof chal, "a frame is shorter than a challenge");
    symm_wio io = symm_wio_send(fd, &hello, sizeof hello, -1, deadline, 0);
    if (io == SYMM_WIO_OK)
        io = symm_wio_recv(fd, &chal, sizeof f, NULL, deadline);
    if (io == SYMM_WIO_OK && chal.magic != SYMM_WORLD_TCP_MAGIC) {
        memcpy(&f, &chal, sizeof f);
        if (f.type == SYMM_FRAME_REFUSE)
            return refused(w, env, &f);
        return symm_fail(SYMM_ERR_PEER, "%s: the process at %s (%s) answered with something other than a symm "
                         "world's challenge: not rank 0 of this job", call, where, env->root_var);
    }
    if (io == SYMM_WIO_OK)
        io = symm_wio_recv(fd, (char *)&chal + sizeof f, sizeof chal - sizeof f, NULL, deadline);
    if (io == SYMM_WIO_EOF) {
        *retry = 1;
        return SYMM_OK;
    }
    if (io != SYMM_WIO_OK)
        return io_trouble(io, where, "waiting for its challenge");
    if (chal.version != SYMM_WORLD_TCP_PROTOCOL)
        return symm_fail(SYMM_ERR_PEER, "%s: rank 0 at %s speaks protocol version %u, this rank %d (mixed libsymm "
                         "versions?)", call, where, chal.version, SYMM_WORLD_TCP_PROTOCOL);
    symm_tcp_proof p = {.rank = w->rank, .size = w->size, .local_rank = w->local_rank,
                        .local_size = cfg->local_size};
    memcpy(p.host_id, env->host_id, sizeof p.host_id);
    proof_mac(env, "client", hello.nonce, chal.nonce, &p, p.mac);
    io = symm_wio_send(fd, &p, sizeof p, -1, deadline, 0);
    if (io == SYMM_WIO_OK)
        io = symm_wio_recv(fd, &f, sizeof f, NULL, deadline);
    if (io == SYMM_WIO_EOF) {
        *retry = 1;
        return SYMM_OK;
    }
    if (io != SYMM_WIO_OK)
        return io_trouble(io, where, "waiting for its proof");
    if (f.type == SYMM_FRAME_REFUSE)
        return refused(w, env, &f);
    uint8_t mac[32], want[32];
    if (f.type != SYMM_FRAME_PROOF || f.len != sizeof mac)
        return symm_fail(SYMM_ERR_PEER, "%s: rank 0 at %s answered with an unexpected message (type %u)", call,
                         where, f.type);
    io = symm_wio_recv(fd, mac, sizeof mac, NULL, deadline);
    if (io != SYMM_WIO_OK)
        return io_trouble(io, where, "reading its proof");
    proof_mac(env, "root", hello.nonce, chal.nonce, &p, want);
    if (!symm_world_digest_equal(mac, want))
        return symm_fail(SYMM_ERR_PEER, "%s: the process at %s (%s) could not prove the job secret: it is not "
                         "rank 0 of this job (another job at this port, or another SYMM_JOB_SECRET)", call, where,
                         env->root_var);
    /* Rank 0 is who it says: wait for the world to be complete. Rank 0
     * times out at about the same moment and then says who was missing. */
    io = symm_wio_recv(fd, &f, sizeof f, NULL, deadline + symm_world_grace(w->timeout_s));
    if (io == SYMM_WIO_TIMEOUT)
        return symm_fail(SYMM_ERR_TIMEOUT, "%s: rank %d reached rank 0 at %s, but the world was not complete "
                         "within %g s (rank 0 names the missing ranks)", call, w->rank, where, w->timeout_s);
    if (io != SYMM_WIO_OK)
        return io_trouble(io, where, "waiting for the world to be complete");
    if (f.type == SYMM_FRAME_ERROR)
        return symm_world_adopt_error(fd, &f);
    if (f.type != SYMM_FRAME_WELCOME)
        return symm_fail(SYMM_ERR_PEER, "%s: rank 0 at %s answered with an unexpected message (type %u)", call,
                         where, f.type);
    return read_welcome(w, fd, &f, deadline + symm_world_grace(w->timeout_s), where);
}

typedef struct peer {
    symm_world *w;
    const symm_world_config *cfg;
    const symm_wenv *env;
    char why[512]; /* what the last try met, for the timeout's message */
} peer;

static symm_status peer_try(void *ctx, double deadline, int *out)
{
    peer *p = ctx;
    int fd = -1, retry = 1;
    try_connect(p->env, deadline, &fd, p->why, sizeof p->why);
    if (fd < 0)
        return SYMM_OK;
    symm_status st = handshake(p->w, p->cfg, p->env, fd, deadline, &retry);
    if (st == SYMM_OK && !retry) {
        *out = fd;
        return SYMM_OK;
    }
    close(fd);
    if (st == SYMM_OK)
        snprintf(p->why, sizeof p->why, "rank 0 closed the connection before answering");
    return st;
}

static symm_status peer_timed_out(void *ctx)
{
    const peer *p = ctx;
    char where[SYMM_WORLD_ADDR_MAX + 16];
    addr_text(p->env, where, sizeof where);
    return symm_fail(SYMM_ERR_TIMEOUT, "%s: rank %d (host %s) could not reach rank 0 at %s (%s) within %g s (last: "
                     "%s)", call, p->w->rank, p->env->host_id, where, p->env->root_var, p->w->timeout_s, p->why);
}

static symm_status peer_rendezvous(symm_world *w, const symm_world_config *cfg, const symm_wenv *env)
{
    peer p = {.w = w, .cfg = cfg, .env = env, .why = "no answer"};
    return symm_world_reach_root(w, 0.1, peer_try, peer_timed_out, &p);
}

/* --- the host world -------------------------------------------------------- */

/* "<job id>.h<16 hex of the host id's hash>", or with the job id hashed too
 * when that is too long: the ranks of one host, and only they, share it. */
static void host_job_id(const char *job, const char *host_id, char *out, size_t n)
{
    char host_hex[SYMM_SHA256_HEX_SIZE], job_hex[SYMM_SHA256_HEX_SIZE];
    symm_sha256_hex_of(host_id, strlen(host_id), host_hex);
    int len = snprintf(out, n, "%s.h%.16s", job, host_hex);
    if (len < 0 || (size_t)len >= n) {
        symm_sha256_hex_of(job, strlen(job), job_hex);
        snprintf(out, n, "j-%.32s.h%.16s", job_hex, host_hex);
    }
}

static symm_status join_host_world(symm_world *w, const symm_world_config *cfg, const symm_wenv *env)
{
    char job[SYMM_WORLD_JOB_ID_MAX];
    host_job_id(env->job_id, w->host_ids[w->host], job, sizeof job);
    symm_world_config hc = {.rank = w->local_rank, .size = w->local_size, .local_rank = w->local_rank,
                            .device = cfg->device, .job_id = job, .secret = cfg->secret,
                            .socket_dir = cfg->socket_dir, .timeout_s = env->timeout_s,
                            .host_id = w->host_ids[w->host], .local_size = w->local_size};
    symm_status st = symm_world_create_local(&hc, &w->host_world);
    if (st != SYMM_OK)
        symm_fail_context(st, "%s: rank %d: the world of its host: ", call, w->rank);
    return st;
}

/* Every rank learns whether every host world was made. */
static symm_status agree_host_worlds(symm_world *w, symm_status mine)
{
    int32_t *all = calloc((size_t)w->size, sizeof *all);
    char *saved = mine != SYMM_OK ? strdup(symm_last_error()) : NULL;
    int32_t me = (int32_t)mine;
    symm_status st = all ? symm_world_allgather(w, &me, all, sizeof me)
                         : symm_fail(SYMM_ERR_NOMEM, "%s: out of host memory", call);
    if (mine != SYMM_OK) {
        st = symm_fail(mine, "%s", saved ? saved : "symm_world_create: the host world failed");
    } else if (st == SYMM_OK) {
        for (int r = 0; r < w->size; r++)
            if (all[r] != SYMM_OK) {
                char who[SYMM_WORLD_HOST_ID_MAX + 32];
                st = symm_fail(SYMM_ERR_PEER, "%s: %s could not join the world of its host (%s; its own error says "
                               "why)", call, symm_world_who(w, r, who, sizeof who),
                               symm_status_name((symm_status)all[r]));
                break;
            }
    }
    free(saved);
    free(all);
    return st;
}

symm_status symm_world_tcp_rendezvous(symm_world *w, const symm_world_config *cfg, const symm_wenv *env)
{
    SYMM_TRY(w->rank == 0 ? root_rendezvous(w, cfg, env) : peer_rendezvous(w, cfg, env));
    return agree_host_worlds(w, join_host_world(w, cfg, env));
}
