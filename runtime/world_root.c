/* world_root.c: rank 0's wait for every rank, whatever the transport (the
 * Unix socket of world.c, the TCP of world_tcp.c), the other ranks' tries to
 * reach it, and what both sides of either rendezvous say alike.
 *
 * One poll() loop watches the listening socket, the connections that have not
 * yet said who they are and the ranks that have joined, so that no single
 * connection can make rank 0 wait. The transport decides whom to take, how a
 * connection proves itself and what the errors say; the loop owns the
 * bookkeeping: accepting, dropping the oldest connection when too many wait,
 * and forgetting those the transport closed. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "world_internal.h"

/* The i-th pending connection; its descriptor is its first member. */
static void *pend_at(const symm_wroot *z, int i) { return (char *)z->pend + (size_t)i * z->pend_size; }
static int pend_fd(const symm_wroot *z, int i) { return *(const int *)pend_at(z, i); }

static symm_status accept_all(symm_wroot *z)
{
    for (;;) {
        int fd = accept4(z->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return SYMM_OK;
            return symm_fail(SYMM_ERR_SYSTEM, "symm_world_create: accept%s%s: %s", z->where ? " on " : "",
                             z->where ? z->where : "", strerror(errno));
        }
        if (!z->admit(z, fd)) {
            close(fd);
            continue;
        }
        if (z->npend == SYMM_WROOT_MAX_PENDING) {
            close(pend_fd(z, 0));
            memmove(pend_at(z, 0), pend_at(z, 1), z->pend_size * (SYMM_WROOT_MAX_PENDING - 1));
            z->npend--;
        }
        void *p = pend_at(z, z->npend++);
        memset(p, 0, z->pend_size);
        *(int *)p = fd;
    }
}

/* A rank that joined has nothing to say before WELCOME: what it says is EOF. */
static symm_status joined_event(symm_wroot *z, int r)
{
    symm_world *w = z->w;
    char byte;
    size_t got = 0;
    symm_wio io = symm_wio_recv_some(w->conn[r], &byte, 1, &got);
    if (io == SYMM_WIO_OK && got == 0)
        return SYMM_OK;
    close(w->conn[r]);
    w->conn[r] = -1;
    return z->left(z, r, io == SYMM_WIO_EOF);
}

/* One round of the loop: wait for any event, handle every one. */
static symm_status root_round(symm_wroot *z, struct pollfd *pfd, int *who, double deadline)
{
    symm_world *w = z->w;
    int n = 0;
    pfd[n++] = (struct pollfd){.fd = z->lfd, .events = POLLIN};
    for (int i = 0; i < z->npend; i++)
        pfd[n++] = (struct pollfd){.fd = pend_fd(z, i), .events = POLLIN};
    for (int r = 1; r < w->size; r++)
        if (w->conn[r] >= 0) {
            who[n] = r;
            pfd[n++] = (struct pollfd){.fd = w->conn[r], .events = POLLIN};
        }
    int ms = symm_wio_poll_ms(deadline);
    int k = poll(pfd, (nfds_t)n, ms);
    if (k < 0 && errno != EINTR)
        return symm_fail(SYMM_ERR_SYSTEM, "symm_world_create: poll: %s", strerror(errno));
    if (k == 0 && ms == 0)
        return z->timeout(z);
    for (int i = 1 + z->npend; i < n; i++)
        if (pfd[i].revents)
            SYMM_TRY(joined_event(z, who[i]));
    for (int i = 0; i < z->npend; i++)
        if (pfd[1 + i].revents)
            z->joined += z->read(z, pend_at(z, i));
    int kept = 0;
    for (int i = 0; i < z->npend; i++)
        if (pend_fd(z, i) >= 0)
            memmove(pend_at(z, kept++), pend_at(z, i), z->pend_size);
    z->npend = kept;
    if (pfd[0].revents)
        SYMM_TRY(accept_all(z));
    return SYMM_OK;
}

symm_status symm_wroot_wait(symm_wroot *z)
{
    const size_t n = (size_t)(1 + SYMM_WROOT_MAX_PENDING + z->w->size);
    struct pollfd *pfd = calloc(n, sizeof *pfd);
    int *who = calloc(n, sizeof *who);
    double deadline = symm_wio_now() + z->w->timeout_s;
    symm_status st = SYMM_OK;
    if (!pfd || !who)
        st = symm_fail(SYMM_ERR_NOMEM, "symm_world_create: out of host memory");
    while (st == SYMM_OK && z->joined < z->w->size)
        st = root_round(z, pfd, who, deadline);
    for (int i = 0; i < z->npend; i++)
        close(pend_fd(z, i));
    z->npend = 0;
    free(who);
    free(pfd);
    return st;
}

void symm_wroot_refuse(int fd, uint32_t reason, uint64_t detail)
{
    symm_world_frame f = {.type = SYMM_FRAME_REFUSE, .arg = reason, .count = detail};
    (void)symm_wio_send_frame(fd, &f, NULL, symm_wio_now() + 0.2, 0);
}

void symm_wroot_tell_error(const symm_world *w, symm_status st)
{
    double until = symm_wio_now() + 0.5;
    for (int r = 1; r < w->size; r++)
        if (w->conn[r] >= 0)
            symm_wio_send_error(w->conn[r], st, symm_last_error(), until);
}

/* --- both sides -------------------------------------------------------------- */

symm_status symm_world_refused(const symm_world *w, const symm_world_frame *f, int protocol, const char *secret,
                               const char *rank)
{
    const char *why = "an unknown reason";
    char buf[640];
    switch (f->arg) {
    case SYMM_REFUSE_PROTOCOL:
        snprintf(buf, sizeof buf, "protocol version %d here, %llu at rank 0 (mixed libsymm versions?)", protocol,
                 (unsigned long long)f->count);
        why = buf;
        break;
    case SYMM_REFUSE_SECRET:
        why = secret;
        break;
    case SYMM_REFUSE_SIZE:
        snprintf(buf, sizeof buf, "world size %d here, %llu at rank 0", w->size, (unsigned long long)f->count);
        why = buf;
        break;
    case SYMM_REFUSE_RANK:
        why = rank;
        break;
    case SYMM_REFUSE_DUPLICATE:
        snprintf(buf, sizeof buf, "rank %d has already joined", w->rank);
        why = buf;
        break;
    }
    return symm_fail(SYMM_ERR_PEER, "symm_world_create: rank 0 refused this rank (%d): %s", w->rank, why);
}

symm_status symm_world_reach_root(symm_world *w, double max_pause_s, symm_world_try_fn attempt,
                                  symm_status (*timed_out)(void *ctx), void *ctx)
{
    double deadline = symm_wio_now() + w->timeout_s;
    double backoff = 0.001;
    for (;;) {
        int fd = -1;
        SYMM_TRY(attempt(ctx, deadline, &fd));
        if (fd >= 0) {
            w->conn[0] = fd;
            return SYMM_OK;
        }
        double now = symm_wio_now();
        if (now >= deadline)
            return timed_out(ctx);
        symm_world_sleep_until(now + backoff < deadline ? now + backoff : deadline);
        backoff = backoff * 2 < max_pause_s ? backoff * 2 : max_pause_s;
    }
}

symm_status symm_world_adopt_error(int fd, const symm_world_frame *f)
{
    char msg[SYMM_WORLD_MSG_MAX];
    if (symm_wio_recv_error(fd, f, msg, sizeof msg, symm_wio_now() + 1.0) != SYMM_WIO_OK)
        snprintf(msg, sizeof msg, "symm_world_create: rank 0 failed");
    return symm_fail(f->arg > SYMM_OK && f->arg < SYMM_ERR_COUNT_ ? (symm_status)f->arg : SYMM_ERR_PEER, "%s", msg);
}

int symm_world_digest_equal(const uint8_t *a, const uint8_t *b)
{
    unsigned diff = 0;
    for (int i = 0; i < 32; i++)
        diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

void symm_world_sleep_until(double t)
{
    double left = t - symm_wio_now();
    if (left <= 0)
        return;
    struct timespec ts = {.tv_sec = (time_t)left, .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
    nanosleep(&ts, NULL);
}
