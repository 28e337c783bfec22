/* world_coll.c: the host-side collectives of a world, as a star through
 * rank 0 (at most a few thousand ranks), over Unix sockets on one host and
 * over TCP across hosts, with the same frames.
 *
 * Every collective is one round: each rank sends rank 0 a CONTRIB frame that
 * says which collective it is calling (kind, call number, byte count, root)
 * with its part of the data; rank 0 waits for all of them in one poll() loop,
 * so a rank that dies is seen the moment its EOF arrives, whatever the order,
 * checks that every rank called the same thing, then sends each rank a
 * RESULT. When anything fails, rank 0 sends every rank an ERROR frame with the
 * message instead, and the world stays failed: later collectives return the
 * same error at once (the ranks no longer agree on where they are). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "world_internal.h"

enum coll_kind { COLL_ALLGATHER = 1, COLL_BCAST, COLL_BARRIER, COLL_ALLGATHER_FD };

static const char *kind_name(unsigned kind)
{
    switch (kind) {
    case COLL_ALLGATHER: return "symm_world_allgather";
    case COLL_BCAST: return "symm_world_bcast";
    case COLL_BARRIER: return "symm_world_barrier";
    case COLL_ALLGATHER_FD: return "symm_world_allgather_fd";
    }
    return "an unknown collective";
}

typedef struct coll {
    enum coll_kind kind;
    const char *name;
    uint64_t seq;
    uint64_t count;   /* allgather: bytes per rank; bcast: bytes */
    uint32_t root;    /* bcast: whose buffer everyone gets */
    const void *send; /* allgather: this rank's bytes */
    void *buf;        /* allgather: size * count; bcast: count */
    int fd;           /* allgather_fd: this rank's descriptor */
    int *fds;         /* allgather_fd: size descriptors */
} coll;

/* Payload bytes rank r contributes. */
static uint64_t contrib_len(const coll *c, int r)
{
    switch (c->kind) {
    case COLL_ALLGATHER: return c->count;
    case COLL_BCAST: return (uint32_t)r == c->root ? c->count : 0;
    case COLL_ALLGATHER_FD: return 1;
    default: return 0;
    }
}

/* Payload bytes rank 0 sends rank r in the RESULT (for descriptors: one byte
 * per descriptor, every rank's but r's own). */
static uint64_t result_len(const symm_world *w, const coll *c, int r)
{
    switch (c->kind) {
    case COLL_ALLGATHER: return c->count * (uint64_t)w->size;
    case COLL_BCAST: return (uint32_t)r == c->root ? 0 : c->count;
    case COLL_ALLGATHER_FD: return (uint64_t)w->size - 1;
    default: return 0;
    }
}

/* A failed exchange with peer; receiving: whether this rank was reading
 * from it (else writing to it). */
static symm_status io_fail(const symm_world *w, const coll *c, int peer, bool receiving, symm_wio io)
{
    char who[SYMM_WORLD_HOST_ID_MAX + 32];
    symm_world_who(w, peer, who, sizeof who);
    switch (io) {
    case SYMM_WIO_EOF:
        return symm_fail(SYMM_ERR_PEER, "%s disconnected during %s (collective call %llu)", who, c->name,
                         (unsigned long long)c->seq);
    case SYMM_WIO_TIMEOUT:
        return symm_fail(SYMM_ERR_TIMEOUT, "%s: %s did not %s within %g s (collective call %llu)", c->name,
                         who,
                         receiving ? (peer == 0 ? "answer" : "send all of its data")
                                   : (peer == 0 ? "take this rank's data" : "take its data"),
                         w->timeout_s, (unsigned long long)c->seq);
    case SYMM_WIO_BADFD:
        return symm_fail(SYMM_ERR_PEER, "%s: %s sent descriptors that were missing, unexpected or "
                         "truncated (collective call %llu)", c->name, who, (unsigned long long)c->seq);
    case SYMM_WIO_NOFD: {
        struct rlimit lim;
        const unsigned long long cap = getrlimit(RLIMIT_NOFILE, &lim) == 0 ? (unsigned long long)lim.rlim_cur : 0;
        return symm_fail(SYMM_ERR_SYSTEM, "%s: a descriptor from %s could not be received: this process "
                         "is probably out of file descriptors (RLIMIT_NOFILE %llu; raise it with ulimit -n) "
                         "(collective call %llu)", c->name, who, cap, (unsigned long long)c->seq);
    }
    default:
        return symm_fail(SYMM_ERR_SYSTEM, "%s: talking to %s: %s (collective call %llu)", c->name, who,
                         strerror(errno), (unsigned long long)c->seq);
    }
}

/* An ERROR frame f has arrived from peer: adopt its status and message. */
static symm_status take_error(const symm_world *w, const coll *c, int peer, const symm_world_frame *f)
{
    char msg[SYMM_WORLD_MSG_MAX];
    symm_status st = f->arg > SYMM_OK && f->arg < SYMM_ERR_COUNT_ ? (symm_status)f->arg : SYMM_ERR_PEER;
    symm_wio io = symm_wio_recv_error(w->conn[w->rank == 0 ? peer : 0], f, msg, sizeof msg,
                                      symm_wio_now() + 1.0);
    if (io != SYMM_WIO_OK)
        return io_fail(w, c, peer, true, io);
    if (peer == 0)
        return symm_fail(st, "%s", msg);
    char who[SYMM_WORLD_HOST_ID_MAX + 32];
    return symm_fail(st, "%s: %s failed: %s", c->name, symm_world_who(w, peer, who, sizeof who), msg);
}

symm_status symm_world_break(symm_world *w, symm_status st)
{
    if (w->failed)
        return st;
    w->failed = st;
    snprintf(w->failed_msg, sizeof w->failed_msg, "%s", symm_last_error());
    double until = symm_wio_now() + 0.5;
    for (int r = 0; r < w->size; r++)
        if (w->conn[r] >= 0)
            symm_wio_send_error(w->conn[r], st, w->failed_msg, until);
    return st;
}

/* --- rank 0 -------------------------------------------------------------- */

static symm_status check_frame(const symm_world *w, const coll *c, int r, const symm_world_frame *f)
{
    unsigned long long seq = (unsigned long long)c->seq;
    if (f->type != SYMM_FRAME_CONTRIB)
        return symm_fail(SYMM_ERR_PEER, "%s: rank %d sent an unexpected message (type %u, collective call %llu)",
                         c->name, r, f->type, seq);
    if (f->seq != c->seq)
        return symm_fail(SYMM_ERR_MISMATCH, "%s: rank 0 is at collective call %llu, rank %d at call %llu "
                         "(%s): a rank skipped or added a collective",
                         c->name, seq, r, (unsigned long long)f->seq, kind_name(f->kind));
    if (f->kind != c->kind)
        return symm_fail(SYMM_ERR_MISMATCH, "%s: at collective call %llu rank 0 called %s, rank %d called %s",
                         c->name, seq, c->name, r, kind_name(f->kind));
    if (f->count != c->count)
        return symm_fail(SYMM_ERR_MISMATCH, "%s: rank 0 passed %llu bytes, rank %d passed %llu bytes "
                         "(collective call %llu)",
                         c->name, (unsigned long long)c->count, r, (unsigned long long)f->count, seq);
    if (f->arg != c->root)
        return symm_fail(SYMM_ERR_MISMATCH, "%s: rank 0 passed root %u, rank %d passed root %u (collective call "
                         "%llu)", c->name, c->root, r, f->arg, seq);
    if (f->len != contrib_len(c, r))
        return symm_fail(SYMM_ERR_PEER, "%s: rank %d sent %llu bytes, expected %llu (collective call %llu)",
                         c->name, r, (unsigned long long)f->len, (unsigned long long)contrib_len(c, r), seq);
    (void)w;
    return SYMM_OK;
}

/* Read rank r's CONTRIB (rank r's socket is readable). */
static symm_status root_take(symm_world *w, coll *c, int r, double deadline)
{
    symm_world_frame f;
    symm_wio io = symm_wio_recv(w->conn[r], &f, sizeof f, NULL, deadline);
    if (io != SYMM_WIO_OK)
        return io_fail(w, c, r, true, io);
    if (f.type == SYMM_FRAME_ERROR)
        return take_error(w, c, r, &f);
    SYMM_TRY(check_frame(w, c, r, &f));
    if (c->kind == COLL_ALLGATHER_FD) {
        char byte;
        io = symm_wio_recv(w->conn[r], &byte, 1, &c->fds[r], deadline);
    } else if (f.len > 0) {
        char *dst = c->kind == COLL_ALLGATHER ? (char *)c->buf + (size_t)r * c->count : c->buf;
        io = symm_wio_recv(w->conn[r], dst, f.len, NULL, deadline);
    }
    return io == SYMM_WIO_OK ? SYMM_OK : io_fail(w, c, r, true, io);
}

static symm_status root_gather(symm_world *w, coll *c)
{
    size_t n = (size_t)w->size;
    unsigned char *arrived = calloc(n, 1);
    struct pollfd *pfd = calloc(n, sizeof *pfd);
    int *who = calloc(n, sizeof *who);
    symm_status st = SYMM_OK;
    if (!arrived || !pfd || !who)
        st = symm_fail(SYMM_ERR_NOMEM, "%s: out of host memory", c->name);
    double deadline = symm_wio_now() + w->timeout_s;
    int left = w->size - 1;
    if (arrived)
        arrived[0] = 1;
    while (st == SYMM_OK && left > 0) {
        int k = 0;
        for (int r = 1; r < w->size; r++)
            if (!arrived[r]) {
                who[k] = r;
                pfd[k++] = (struct pollfd){.fd = w->conn[r], .events = POLLIN};
            }
        int ms = symm_wio_poll_ms(deadline);
        int ready = poll(pfd, (nfds_t)k, ms);
        if (ready < 0 && errno != EINTR) {
            st = symm_fail(SYMM_ERR_SYSTEM, "%s: poll: %s", c->name, strerror(errno));
        } else if (ready == 0 && ms == 0) {
            char list[256], hosts[512];
            symm_world_missing_ranks(arrived, w->size, list, sizeof list);
            symm_world_missing_hosts(w, arrived, hosts, sizeof hosts);
            st = symm_fail(SYMM_ERR_TIMEOUT, "%s: %s%s did not arrive within %g s (collective call %llu)", c->name,
                           list, hosts, w->timeout_s, (unsigned long long)c->seq);
        }
        for (int i = 0; st == SYMM_OK && ready > 0 && i < k; i++) {
            if (!pfd[i].revents)
                continue;
            st = root_take(w, c, who[i], deadline);
            arrived[who[i]] = 1;
            left--;
        }
    }
    free(who);
    free(pfd);
    free(arrived);
    return st;
}

static symm_status root_send_result(symm_world *w, coll *c, int r, double deadline)
{
    symm_world_frame f = {.type = SYMM_FRAME_RESULT, .kind = (uint16_t)c->kind, .arg = c->root,
                          .seq = c->seq, .count = c->count, .len = result_len(w, c, r)};
    symm_wio io;
    if (c->kind != COLL_ALLGATHER_FD) {
        io = symm_wio_send_frame(w->conn[r], &f, c->buf, deadline, 0);
        return io == SYMM_WIO_OK ? SYMM_OK : io_fail(w, c, r, false, io);
    }
    /* The payload is one byte per descriptor, each sent with its own. */
    io = symm_wio_send(w->conn[r], &f, sizeof f, -1, deadline, 0);
    for (int i = 0; io == SYMM_WIO_OK && i < w->size; i++)
        if (i != r)
            io = symm_wio_send(w->conn[r], "", 1, c->fds[i], deadline, 0);
    return io == SYMM_WIO_OK ? SYMM_OK : io_fail(w, c, r, false, io);
}

static symm_status root_collective(symm_world *w, coll *c)
{
    SYMM_TRY(root_gather(w, c));
    double deadline = symm_wio_now() + w->timeout_s;
    for (int r = 1; r < w->size; r++)
        SYMM_TRY(root_send_result(w, c, r, deadline));
    return SYMM_OK;
}

/* --- ranks other than 0 -------------------------------------------------- */

static symm_status peer_contribute(symm_world *w, coll *c, double deadline)
{
    int s = w->conn[0];
    symm_world_frame f = {.type = SYMM_FRAME_CONTRIB, .kind = (uint16_t)c->kind, .arg = c->root,
                          .seq = c->seq, .count = c->count, .len = contrib_len(c, w->rank)};
    symm_wio io = symm_wio_send(s, &f, sizeof f, -1, deadline, 1);
    if (io == SYMM_WIO_OK && c->kind == COLL_ALLGATHER_FD)
        io = symm_wio_send(s, "", 1, c->fd, deadline, 1);
    else if (io == SYMM_WIO_OK && f.len > 0)
        io = symm_wio_send(s, c->kind == COLL_ALLGATHER ? c->send : c->buf, f.len, -1, deadline, 1);
    /* SYMM_WIO_INPUT: rank 0 has spoken first, which can only be an error;
     * the caller reads it. */
    return io == SYMM_WIO_OK || io == SYMM_WIO_INPUT ? SYMM_OK : io_fail(w, c, 0, false, io);
}

static symm_status peer_receive(symm_world *w, coll *c, double deadline)
{
    int s = w->conn[0];
    symm_world_frame f;
    symm_wio io = symm_wio_recv(s, &f, sizeof f, NULL, deadline);
    if (io != SYMM_WIO_OK)
        return io_fail(w, c, 0, true, io);
    if (f.type == SYMM_FRAME_ERROR)
        return take_error(w, c, 0, &f);
    if (f.type != SYMM_FRAME_RESULT || f.seq != c->seq || f.kind != c->kind ||
        f.len != result_len(w, c, w->rank))
        return symm_fail(SYMM_ERR_PEER, "%s: rank 0 answered with an unexpected message (type %u, call %llu, "
                         "%llu bytes; expected call %llu)", c->name, f.type, (unsigned long long)f.seq,
                         (unsigned long long)f.len, (unsigned long long)c->seq);
    deadline = symm_wio_now() + w->timeout_s;
    if (c->kind != COLL_ALLGATHER_FD) {
        io = f.len ? symm_wio_recv(s, c->buf, f.len, NULL, deadline) : SYMM_WIO_OK;
        return io == SYMM_WIO_OK ? SYMM_OK : io_fail(w, c, 0, true, io);
    }
    for (int i = 0; i < w->size && io == SYMM_WIO_OK; i++) {
        char byte;
        if (i != w->rank)
            io = symm_wio_recv(s, &byte, 1, &c->fds[i], deadline);
    }
    return io == SYMM_WIO_OK ? SYMM_OK : io_fail(w, c, 0, true, io);
}

static symm_status peer_collective(symm_world *w, coll *c)
{
    double start = symm_wio_now();
    SYMM_TRY(peer_contribute(w, c, start + w->timeout_s));
    /* Rank 0 times out at about the same time as we would, and then says who
     * did not arrive: wait a little longer for that. */
    return peer_receive(w, c, start + w->timeout_s + symm_world_grace(w->timeout_s));
}

/* --- the collectives ----------------------------------------------------- */

static symm_status run(symm_world *w, coll *c)
{
    if (w->failed)
        return symm_fail(w->failed, "%s: the world failed earlier: %s", c->name, w->failed_msg);
    c->seq = ++w->calls;
    if (w->size == 1)
        return SYMM_OK;
    symm_status st = w->rank == 0 ? root_collective(w, c) : peer_collective(w, c);
    return st == SYMM_OK ? SYMM_OK : symm_world_break(w, st);
}

/* "sim0, sim1" or "sim0, sim1, ... (12 in all)". */
static const char *host_list(const symm_world *w, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int h = 0; h < w->hosts && used < n; h++) {
        char label[SYMM_WORLD_HOST_ID_MAX];
        symm_world_host_label(w->host_ids[h], label, sizeof label);
        if (h == 8) {
            snprintf(buf + used, n - used, ", ... (%d in all)", w->hosts);
            break;
        }
        used += (size_t)snprintf(buf + used, n - used, "%s%s", h ? ", " : "", label);
    }
    return buf;
}

/* A bad argument on one rank fails the collective on every rank: the others
 * would otherwise wait for this rank until the timeout. */
static symm_status bad_arg(symm_world *w, const char *call, const char *what)
{
    if (!w)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s: world is NULL", call);
    symm_fail(SYMM_ERR_INVALID_ARG, "%s: %s", call, what);
    if (w->failed)
        return symm_fail(w->failed, "%s: the world failed earlier: %s", call, w->failed_msg);
    w->calls++;
    return symm_world_break(w, SYMM_ERR_INVALID_ARG);
}

symm_status symm_world_allgather(symm_world *w, const void *send, void *recv, size_t bytes)
{
    static const char call[] = "symm_world_allgather";
    if (!w || (bytes > 0 && (!send || !recv)))
        return bad_arg(w, call, !send ? "send is NULL" : "recv is NULL");
    if (bytes > SIZE_MAX / (size_t)w->size)
        return bad_arg(w, call, "size * bytes overflows");
    coll c = {.kind = COLL_ALLGATHER, .name = call, .count = bytes, .send = send, .buf = recv};
    if (bytes > 0)
        memmove((char *)recv + (size_t)w->rank * bytes, send, bytes);
    return run(w, &c);
}

symm_status symm_world_bcast(symm_world *w, void *buf, size_t bytes, int root)
{
    static const char call[] = "symm_world_bcast";
    char what[96];
    if (!w || (bytes > 0 && !buf))
        return bad_arg(w, call, "buf is NULL");
    if (root < 0 || root >= w->size) {
        snprintf(what, sizeof what, "root %d: expected 0..%d", root, w->size - 1);
        return bad_arg(w, call, what);
    }
    coll c = {.kind = COLL_BCAST, .name = call, .count = bytes, .root = (uint32_t)root, .buf = buf};
    return run(w, &c);
}

symm_status symm_world_barrier(symm_world *w)
{
    if (!w)
        return bad_arg(w, "symm_world_barrier", "");
    coll c = {.kind = COLL_BARRIER, .name = "symm_world_barrier"};
    return run(w, &c);
}

symm_status symm_world_allgather_fd(symm_world *w, int fd, int *fds_out)
{
    static const char call[] = "symm_world_allgather_fd";
    char what[640];
    if (!w || !fds_out)
        return bad_arg(w, call, "fds_out is NULL");
    for (int r = 0; r < w->size; r++)
        fds_out[r] = -1;
    /* Every rank knows its world's hosts: all refuse alike, nobody waits. */
    if (w->hosts > 1)
        return symm_fail(SYMM_ERR_UNSUPPORTED, "%s: the world spans %d hosts (%s): descriptors cannot cross "
                         "hosts, and GPU memory is shared within a host: use symm_world_host_world", call,
                         w->hosts, host_list(w, what, sizeof what));
    int own = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (own < 0) {
        if (fd < 0 || errno == EBADF)
            snprintf(what, sizeof what, "fd %d: not an open descriptor", fd);
        else
            snprintf(what, sizeof what, "fd %d: dup: %s", fd, strerror(errno));
        return bad_arg(w, call, what);
    }
    fds_out[w->rank] = own;
    coll c = {.kind = COLL_ALLGATHER_FD, .name = call, .fd = fd, .fds = fds_out};
    symm_status st = run(w, &c);
    if (st != SYMM_OK)
        for (int r = 0; r < w->size; r++)
            if (fds_out[r] >= 0) {
                close(fds_out[r]);
                fds_out[r] = -1;
            }
    return st;
}
