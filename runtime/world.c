/* world.c: how the ranks of a job find each other (symm_world_create) and
 * part (symm_world_destroy); the rendezvous of one host, and what a world
 * knows of its hosts. Across hosts the rendezvous is world_tcp.c's.
 *
 * Rank 0 binds <socket_dir>/symm-<uid>/<job id>.sock and waits in one poll()
 * loop (world_root.c's) for the listening socket, the connections that have
 * not yet said hello and the ranks that have joined, so that no single
 * connection can make it wait: a stranger that connects and says nothing, or says the wrong
 * secret, costs nothing. Every other rank connects, checks that the socket
 * belongs to its own uid, sends a hello and waits for WELCOME (once all ranks
 * are in), REFUSE or ERROR. A connection that rank 0 closes before answering
 * (the socket of a world being torn down, a stale socket) is retried until
 * the timeout. Once everyone is in, rank 0 unlinks the socket: the name is
 * free for the next world at once, and latecomers cannot knock. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "world_internal.h"

typedef struct listener {
    int fd;
    dev_t dev;
    ino_t ino;
    const char *path;
} listener;

typedef struct pending {
    int fd;
    size_t got;
    symm_world_hello hello;
} pending;

double symm_world_grace(double timeout_s) { return timeout_s * 0.25 < 2.0 ? timeout_s * 0.25 : 2.0; }

static int peer_uid_ok(int fd, uid_t *uid)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    *uid = (uid_t)-1;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return 0;
    *uid = cred.uid;
    return cred.uid == geteuid();
}

void symm_world_missing_ranks(const unsigned char *present, int size, char *buf, size_t n)
{
    int count = 0;
    for (int r = 0; r < size; r++)
        count += !present[r];
    size_t used = (size_t)snprintf(buf, n, "%s", count == 1 ? "rank" : "ranks");
    int listed = 0;
    for (int r = 0; r < size && used < n; r++) {
        if (present[r])
            continue;
        if (listed == 16) {
            snprintf(buf + used, n - used, ", ... (%d in all)", count);
            return;
        }
        used += (size_t)snprintf(buf + used, n - used, "%s %d", listed ? "," : "", r);
        listed++;
    }
}

/* --- rank 0 -------------------------------------------------------------- */

/* Is something listening at path? (A socket nobody listens on is stale.) */
static int socket_is_live(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return 0;
    int live = connect(fd, (struct sockaddr *)&a, sizeof a) == 0 || errno == EAGAIN;
    close(fd);
    return live;
}

/* Bind fd at path and listen. *in_use when the name is taken (SYMM_OK then,
 * with nothing bound); other failures set the message. */
static symm_status bind_listen(int fd, const char *path, listener *l, int *in_use)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, path, strlen(path) + 1);
    *in_use = 0;
    /* bind() creates the socket with 0777 less the umask, so the socket is
     * made 0600 from its first moment by the umask around it: a chmod after
     * bind would leave a window in which it is open to every user (the
     * directory is 0700 anyway). The umask is the process's: a file another
     * thread creates meanwhile gets at most 0600, never more. */
    mode_t old_mask = umask(0177);
    int rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    int bind_errno = errno;
    umask(old_mask);
    if (rc != 0) {
        if (bind_errno == EADDRINUSE) {
            *in_use = 1;
            return SYMM_OK;
        }
        return symm_fail(SYMM_ERR_SYSTEM, "symm_world_create: bind %s: %s", path, strerror(bind_errno));
    }
    struct stat st;
    if (lstat(path, &st) != 0 || listen(fd, SOMAXCONN) != 0) {
        int err = errno;
        unlink(path);
        return symm_fail(SYMM_ERR_SYSTEM, "symm_world_create: listen on %s: %s", path, strerror(err));
    }
    l->fd = fd;
    l->dev = st.st_dev;
    l->ino = st.st_ino;
    l->path = path;
    return SYMM_OK;
}

static symm_status root_listen(const symm_wenv *env, listener *l)
{
    for (int attempt = 0; attempt < 4; attempt++) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            return symm_fail(SYMM_ERR_SYSTEM, "symm_world_create: socket: %s", strerror(errno));
        int in_use;
        symm_status st = bind_listen(fd, env->path, l, &in_use);
        if (st == SYMM_OK && !in_use)
            return SYMM_OK;
        close(fd);
        if (st != SYMM_OK)
            return st;
        if (socket_is_live(env->path))
            return symm_fail(SYMM_ERR_STATE,
                             "symm_world_create: %s is in use by a live world: another job has job id "
                             "\"%s\" (give each job its own SYMM_JOB_ID)",
                             env->path, env->job_id);
        unlink(env->path); /* stale: left by a job that died */
    }
    return symm_fail(SYMM_ERR_SYSTEM, "symm_world_create: cannot bind %s: it keeps reappearing", env->path);
}

/* Close the listener and unlink its socket, unless someone replaced it. */
static void listener_close(listener *l)
{
    struct stat st;
    if (lstat(l->path, &st) == 0 && st.st_dev == l->dev && st.st_ino == l->ino)
        unlink(l->path);
    close(l->fd);
    l->fd = -1;
}

/* Judge a complete hello: the connection joins (conn[rank] takes it) or is
 * refused and closed. Returns 1 when it joined. */
static int judge_hello(symm_world *w, const symm_wenv *env, pending *p)
{
    const symm_world_hello *h = &p->hello;
    uint32_t reason = 0;
    uint64_t detail = 0;
    if (h->magic != SYMM_WORLD_MAGIC || h->version != SYMM_WORLD_PROTOCOL)
        reason = SYMM_REFUSE_PROTOCOL, detail = SYMM_WORLD_PROTOCOL;
    else if (!symm_world_digest_equal(h->digest, env->digest))
        reason = SYMM_REFUSE_SECRET;
    else if (h->size != w->size)
        reason = SYMM_REFUSE_SIZE, detail = (uint64_t)w->size;
    else if (h->rank <= 0 || h->rank >= w->size)
        reason = SYMM_REFUSE_RANK;
    else if (w->conn[h->rank] >= 0)
        reason = SYMM_REFUSE_DUPLICATE;
    if (reason) {
        symm_wroot_refuse(p->fd, reason, detail);
        close(p->fd);
        p->fd = -1;
        return 0;
    }
    w->conn[h->rank] = p->fd;
    p->fd = -1;
    return 1;
}

typedef struct rendezvous {
    symm_wroot root; /* first: the loop's functions reach the rest through it */
    const symm_wenv *env;
    listener l;
    pending pend[SYMM_WROOT_MAX_PENDING];
} rendezvous;

static int admit(symm_wroot *root, int fd)
{
    (void)root;
    uid_t uid;
    return peer_uid_ok(fd, &uid); /* another user: not even an answer */
}

static int pending_read(symm_wroot *root, void *arg)
{
    rendezvous *z = (rendezvous *)root;
    pending *p = arg;
    size_t got = 0;
    symm_wio r = symm_wio_recv_some(p->fd, (char *)&p->hello + p->got, sizeof p->hello - p->got, &got);
    if (r != SYMM_WIO_OK) {
        close(p->fd);
        p->fd = -1;
        return 0;
    }
    p->got += got;
    return p->got == sizeof p->hello ? judge_hello(root->w, z->env, p) : 0;
}

/* "ranks 2, 3": those that have not joined (but for rank gone, which left),
 * or "" when all have. */
static void not_joined(const symm_world *w, int gone, char *buf, size_t n)
{
    unsigned char *present = calloc((size_t)w->size, 1);
    int all = 1;
    snprintf(buf, n, "some ranks");
    if (!present)
        return;
    for (int r = 0; r < w->size; r++) {
        present[r] = r == 0 || r == gone || w->conn[r] >= 0;
        all &= present[r];
    }
    if (all)
        buf[0] = '\0';
    else
        symm_world_missing_ranks(present, w->size, buf, n);
    free(present);
}

static symm_status left(symm_wroot *root, int r, int eof)
{
    char missing[256];
    if (!eof)
        return symm_fail(SYMM_ERR_PEER, "symm_world_create: rank %d sent an unexpected message before the "
                         "world was complete", r);
    not_joined(root->w, r, missing, sizeof missing);
    return symm_fail(SYMM_ERR_PEER, "rank %d disconnected during symm_world_create%s%s%s", r,
                     missing[0] ? " (" : "", missing, missing[0] ? " had not joined yet)" : "");
}

static symm_status timed_out(symm_wroot *root)
{
    char list[256];
    not_joined(root->w, -1, list, sizeof list);
    return symm_fail(SYMM_ERR_TIMEOUT, "symm_world_create: %s did not join within %g s", list, root->w->timeout_s);
}

static symm_status send_welcome(symm_world *w)
{
    double deadline = symm_wio_now() + w->timeout_s;
    symm_world_frame f = {.type = SYMM_FRAME_WELCOME, .count = (uint64_t)w->size};
    for (int r = 1; r < w->size; r++) {
        symm_wio io = symm_wio_send_frame(w->conn[r], &f, NULL, deadline, 0);
        if (io != SYMM_WIO_OK)
            return symm_fail(io == SYMM_WIO_TIMEOUT ? SYMM_ERR_TIMEOUT : SYMM_ERR_PEER,
                             "rank %d disconnected during symm_world_create", r);
    }
    return SYMM_OK;
}

static symm_status root_rendezvous(symm_world *w, const symm_wenv *env)
{
    rendezvous *z = calloc(1, sizeof *z);
    if (!z)
        return symm_fail(SYMM_ERR_NOMEM, "symm_world_create: out of host memory");
    z->root = (symm_wroot){.w = w, .lfd = -1, .where = env->path, .pend = z->pend, .pend_size = sizeof z->pend[0],
                           .joined = 1, .admit = admit, .read = pending_read, .left = left, .timeout = timed_out};
    z->env = env;
    z->l.fd = -1; /* nothing to close until root_listen binds */
    symm_status st = root_listen(env, &z->l);
    z->root.lfd = z->l.fd;
    if (st == SYMM_OK)
        st = symm_wroot_wait(&z->root);
    if (z->l.fd >= 0)
        listener_close(&z->l);
    if (st == SYMM_OK)
        st = send_welcome(w);
    if (st != SYMM_OK)
        symm_wroot_tell_error(w, st);
    free(z);
    return st;
}

/* --- ranks other than 0 -------------------------------------------------- */

enum { CONNECT_OK, CONNECT_RETRY };

static int try_connect(const char *path, int *out)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        /* Not there yet, nobody listening yet, or the backlog is full. */
        if (err == ENOENT || err == ECONNREFUSED || err == EAGAIN || err == EINTR)
            return CONNECT_RETRY;
        return -1;
    }
    *out = fd;
    return CONNECT_OK;
}

static symm_status refused(const symm_world *w, const symm_wenv *env, const symm_world_frame *f)
{
    char secret[640];
    /* Most often not a wrong secret of this job but another job's rank 0 at
     * this job id's socket: its own rank 0 then failed to bind it. */
    snprintf(secret, sizeof secret, "wrong job secret: the rank 0 listening at %s has another one. Another job may "
             "be using job id \"%.200s\" (its rank 0 would have found the socket in use: give each job its own "
             "SYMM_JOB_ID), or this rank's SYMM_JOB_SECRET differs from its rank 0's", env->path, env->job_id);
    return symm_world_refused(w, f, SYMM_WORLD_PROTOCOL, secret, "rank out of range");
}

/* After connecting: hello, then rank 0's verdict. SYMM_OK with *retry set
 * when rank 0 closed the connection without answering: connect again. */
static symm_status handshake(symm_world *w, const symm_wenv *env, int fd, double deadline, int *retry)
{
    uid_t uid;
    *retry = 0;
    if (!peer_uid_ok(fd, &uid))
        return symm_fail(SYMM_ERR_PEER, "symm_world_create: the socket %s belongs to uid %u, not to this user "
                         "(uid %u)", env->path, (unsigned)uid, (unsigned)geteuid());
    symm_world_hello h = {.magic = SYMM_WORLD_MAGIC, .version = SYMM_WORLD_PROTOCOL, .rank = w->rank,
                          .size = w->size};
    memcpy(h.digest, env->digest, sizeof h.digest);
    symm_wio io = symm_wio_send(fd, &h, sizeof h, -1, deadline, 0);
    symm_world_frame f;
    if (io == SYMM_WIO_OK)
        io = symm_wio_recv(fd, &f, sizeof f, NULL, deadline + symm_world_grace(w->timeout_s));
    if (io == SYMM_WIO_EOF) {
        *retry = 1;
        return SYMM_OK;
    }
    if (io == SYMM_WIO_TIMEOUT)
        return symm_fail(SYMM_ERR_TIMEOUT, "symm_world_create: rank %d reached rank 0, but the world was not "
                         "complete within %g s (rank 0 names the missing ranks)", w->rank, w->timeout_s);
    if (io == SYMM_WIO_BADFD)
        return symm_fail(SYMM_ERR_PEER, "symm_world_create: rank 0 sent descriptors in its answer");
    if (io != SYMM_WIO_OK)
        return symm_fail(SYMM_ERR_SYSTEM, "symm_world_create: talking to rank 0 over %s: %s", env->path,
                         strerror(errno));
    if (f.type == SYMM_FRAME_REFUSE)
        return refused(w, env, &f);
    if (f.type == SYMM_FRAME_ERROR)
        return symm_world_adopt_error(fd, &f);
    if (f.type != SYMM_FRAME_WELCOME || f.count != (uint64_t)w->size || f.len != 0)
        return symm_fail(SYMM_ERR_PEER, "symm_world_create: rank 0 answered with an unexpected message "
                         "(type %u)", f.type);
    return SYMM_OK;
}

typedef struct peer {
    symm_world *w;
    const symm_wenv *env;
} peer;

static symm_status peer_try(void *ctx, double deadline, int *out)
{
    const peer *p = ctx;
    int fd = -1, retry = 1;
    int c = try_connect(p->env->path, &fd);
    if (c < 0)
        return symm_fail(SYMM_ERR_SYSTEM, "symm_world_create: connect to %s: %s", p->env->path, strerror(errno));
    if (c != CONNECT_OK)
        return SYMM_OK;
    symm_status st = handshake(p->w, p->env, fd, deadline, &retry);
    if (st == SYMM_OK && !retry) {
        *out = fd;
        return SYMM_OK;
    }
    close(fd);
    return st;
}

static symm_status peer_timed_out(void *ctx)
{
    const peer *p = ctx;
    return symm_fail(SYMM_ERR_TIMEOUT, "symm_world_create: rank %d could not reach rank 0 within %g s (socket %s)",
                     p->w->rank, p->w->timeout_s, p->env->path);
}

static symm_status peer_rendezvous(symm_world *w, const symm_wenv *env)
{
    peer p = {.w = w, .env = env};
    return symm_world_reach_root(w, 0.05, peer_try, peer_timed_out, &p);
}

/* --- public ---------------------------------------------------------------- */

static symm_status check_config(const symm_world_config *cfg)
{
    if (cfg->size < 1 || cfg->size > SYMM_WORLD_MAX_SIZE)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_world_create: size %d: expected 1..%d", cfg->size,
                         SYMM_WORLD_MAX_SIZE);
    if (cfg->rank < 0 || cfg->rank >= cfg->size)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_world_create: rank %d: expected 0..%d", cfg->rank,
                         cfg->size - 1);
    if (cfg->local_rank < 0 || cfg->local_rank >= cfg->size)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_world_create: local_rank %d: expected 0..%d",
                         cfg->local_rank, cfg->size - 1);
    if (cfg->device < -1)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_world_create: device %d: expected a device ordinal "
                         ">= 0, or -1 for the local rank's", cfg->device);
    if (cfg->local_size < 0 || cfg->local_size > cfg->size)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_world_create: local_size %d: expected 1..%d, or 0 "
                         "(unknown)", cfg->local_size, cfg->size);
    if (cfg->local_size > 0 && cfg->local_rank >= cfg->local_size)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_world_create: local_rank %d: expected 0..%d "
                         "(local_size is %d)", cfg->local_rank, cfg->local_size - 1, cfg->local_size);
    return SYMM_OK;
}

/* local: the Unix-socket path whatever cfg and the environment say. */
static symm_status create(const symm_world_config *cfg, int local, symm_world **out)
{
    if (!cfg || !out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_world_create: %s is NULL", cfg ? "out" : "cfg");
    *out = NULL;
    SYMM_TRY(check_config(cfg));
    symm_wenv *env = calloc(1, sizeof *env);
    symm_world *w = calloc(1, sizeof *w);
    int *conn = calloc((size_t)cfg->size, sizeof *conn);
    symm_status st = SYMM_OK;
    if (!env || !w || !conn)
        st = symm_fail(SYMM_ERR_NOMEM, "symm_world_create: out of host memory");
    if (st == SYMM_OK) {
        for (int r = 0; r < cfg->size; r++)
            conn[r] = -1;
        *w = (symm_world){.rank = cfg->rank, .size = cfg->size, .local_rank = cfg->local_rank,
                          .device = cfg->device, .conn = conn, .hosts = 1, .local_size = cfg->size,
                          .host_major = 1};
        conn = NULL;
        st = symm_wenv_resolve_as(cfg, local, env);
    }
    if (st == SYMM_OK) {
        w->timeout_s = env->timeout_s;
        w->host_ids = calloc(1, sizeof *w->host_ids);
        if (!w->host_ids)
            st = symm_fail(SYMM_ERR_NOMEM, "symm_world_create: out of host memory");
        else
            memcpy(w->host_ids[0], env->host_id, sizeof env->host_id);
    }
    int tcp = st == SYMM_OK && env->root_host[0];
    if (st == SYMM_OK && w->size > 1 && !tcp)
        st = symm_wenv_prepare_dir(env);
    if (st == SYMM_OK && tcp)
        st = symm_world_tcp_rendezvous(w, cfg, env);
    else if (st == SYMM_OK && w->size > 1)
        st = w->rank == 0 ? root_rendezvous(w, env) : peer_rendezvous(w, env);
    free(env);
    free(conn);
    if (st != SYMM_OK) {
        symm_world_destroy(w);
        return st;
    }
    *out = w;
    return SYMM_OK;
}

symm_status symm_world_create(const symm_world_config *cfg, symm_world **out) { return create(cfg, 0, out); }

symm_status symm_world_create_local(const symm_world_config *cfg, symm_world **out) { return create(cfg, 1, out); }

symm_status symm_world_create_from_env(symm_world **out)
{
    symm_world_config cfg;
    if (!out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_world_create_from_env: out is NULL");
    *out = NULL;
    SYMM_TRY(symm_world_config_from_env(&cfg));
    return symm_world_create(&cfg, out);
}

symm_status symm_world_destroy(symm_world *w)
{
    if (!w)
        return SYMM_OK;
    /* The host world first: its failure is reported, but everything goes. */
    symm_status host_st = symm_world_destroy(w->host_world);
    char host_msg[SYMM_WORLD_MSG_MAX];
    if (host_st != SYMM_OK)
        snprintf(host_msg, sizeof host_msg, "%s", symm_last_error());
    int failed_rank = -1, failed_errno = 0;
    if (w->conn)
        for (int r = 0; r < w->size; r++)
            if (w->conn[r] >= 0 && close(w->conn[r]) != 0 && failed_rank < 0) {
                failed_rank = r;
                failed_errno = errno;
            }
    const int rank = w->rank;
    free(w->conn);
    free(w->rank_host);
    free(w->host_ids);
    free(w);
    if (failed_rank >= 0)
        return symm_fail(SYMM_ERR_SYSTEM, "symm_world_destroy: rank %d: closing the connection to rank %d: %s "
                         "(everything is freed)", rank, failed_rank, strerror(failed_errno));
    if (host_st != SYMM_OK)
        return symm_fail(host_st, "%s", host_msg);
    return SYMM_OK;
}

int symm_world_rank(const symm_world *w) { return w ? w->rank : -1; }
int symm_world_size(const symm_world *w) { return w ? w->size : 0; }
int symm_world_local_rank(const symm_world *w) { return w ? w->local_rank : -1; }
int symm_world_device(const symm_world *w) { return !w ? -1 : w->device >= 0 ? w->device : w->local_rank; }
double symm_world_timeout(const symm_world *w) { return w ? w->timeout_s : 0; }

/* --- hosts ----------------------------------------------------------------- */

int symm_world_host(const symm_world *w) { return w ? w->host : -1; }
int symm_world_host_count(const symm_world *w) { return w ? w->hosts : 0; }
int symm_world_local_size(const symm_world *w) { return w ? w->local_size : 0; }
int symm_world_host_major(const symm_world *w) { return w ? w->host_major : 0; }

int symm_world_rank_host(const symm_world *w, int rank)
{
    if (!w || rank < 0 || rank >= w->size)
        return -1;
    return w->rank_host ? w->rank_host[rank] : 0;
}

const char *symm_world_host_name(const symm_world *w, int host)
{
    return w && w->host_ids && host >= 0 && host < w->hosts ? w->host_ids[host] : NULL;
}

symm_world *symm_world_host_world(symm_world *w)
{
    return !w ? NULL : w->host_world ? w->host_world : w;
}

void symm_world_host_label(const char *id, char *buf, size_t n)
{
    const char *boot = strstr(id, " (boot ");
    snprintf(buf, n, "%.*s", boot ? (int)(boot - id) : (int)strlen(id), id);
}

const char *symm_world_who(const symm_world *w, int rank, char *buf, size_t n)
{
    int h = symm_world_rank_host(w, rank);
    char label[SYMM_WORLD_HOST_ID_MAX];
    if (w->hosts > 1 && h >= 0) {
        symm_world_host_label(w->host_ids[h], label, sizeof label);
        snprintf(buf, n, "rank %d (host %s)", rank, label);
    } else {
        snprintf(buf, n, "rank %d", rank);
    }
    return buf;
}

void symm_world_missing_hosts(const symm_world *w, const unsigned char *present, char *buf, size_t n)
{
    buf[0] = '\0';
    if (w->hosts <= 1 || !w->rank_host)
        return;
    unsigned char *listed = calloc((size_t)w->hosts, 1);
    if (!listed)
        return;
    size_t used = 0;
    int count = 0;
    for (int r = 0; r < w->size; r++)
        if (!present[r] && !listed[w->rank_host[r]]) {
            listed[w->rank_host[r]] = 1;
            count++;
        }
    for (int h = 0; h < w->hosts && used < n; h++) {
        if (!listed[h])
            continue;
        char label[SYMM_WORLD_HOST_ID_MAX];
        symm_world_host_label(w->host_ids[h], label, sizeof label);
        used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? ", " : count > 1 ? " (hosts " : " (host ",
                                 label);
    }
    if (used > 0 && used < n)
        snprintf(buf + used, n - used, ")");
    free(listed);
}
