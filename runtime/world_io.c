/* world_io.c: socket I/O of the world with a deadline on every wait.
 *
 * Sockets are non-blocking; a call tries the operation and polls only when it
 * would block, with the time left. Sends use MSG_NOSIGNAL, so a dead peer is
 * an EPIPE to report, never a SIGPIPE that kills the process. Receives always
 * offer room for ancillary data, so descriptors a peer sends where none are
 * expected are closed rather than leaked. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "world_internal.h"

/* Room for a few descriptors: more than one in a message is a protocol error,
 * and the room lets us see (and close) them rather than truncate. */
#define MAX_FDS_PER_MSG 4

double symm_wio_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int symm_wio_poll_ms(double deadline)
{
    double left = deadline - symm_wio_now();
    if (left <= 0)
        return 0;
    double ms = ceil(left * 1000.0);
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* Poll one socket: its revents, 0 when the deadline passed, -1 on error. */
static int wait_ready(int sock, short events, double deadline)
{
    for (;;) {
        struct pollfd p = {.fd = sock, .events = events};
        int ms = symm_wio_poll_ms(deadline);
        int n = poll(&p, 1, ms);
        if (n > 0)
            return p.revents;
        if (n == 0 && ms == 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

static int is_disconnect(int err) { return err == EPIPE || err == ECONNRESET || err == ENOTCONN; }

static ssize_t send_once(int sock, const char *p, size_t n, int fd)
{
    struct iovec iov = {.iov_base = (void *)p, .iov_len = n};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&ctl, 0, sizeof ctl);
        m.msg_control = ctl.buf;
        m.msg_controllen = sizeof ctl.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    return sendmsg(sock, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* The socket's poll events for reading right now (POLLIN, POLLHUP, ...), 0
 * when there are none. */
static short input_now(int sock)
{
    struct pollfd q = {.fd = sock, .events = POLLIN};
    return poll(&q, 1, 0) > 0 ? q.revents : 0;
}

symm_wio symm_wio_send(int sock, const void *buf, size_t n, int fd, double deadline, int watch_input)
{
    const char *p = buf;
    while (n > 0) {
        if (watch_input && (input_now(sock) & (POLLIN | POLLHUP)))
            return SYMM_WIO_INPUT;
        ssize_t k = send_once(sock, p, n, fd);
        if (k > 0) {
            fd = -1; /* the descriptor went with the first byte */
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            if (!is_disconnect(errno))
                return SYMM_WIO_ERRNO;
            /* The peer may have spoken and left between the poll above and
             * the send (rank 0 sends its error, then closes): let the caller
             * read what it said rather than report a bare disconnect. */
            return watch_input && (input_now(sock) & POLLIN) ? SYMM_WIO_INPUT : SYMM_WIO_EOF;
        }
        int ev = wait_ready(sock, POLLOUT | (watch_input ? POLLIN : 0), deadline);
        if (ev == 0)
            return SYMM_WIO_TIMEOUT;
        if (ev < 0)
            return SYMM_WIO_ERRNO;
        if (watch_input && (ev & (POLLIN | POLLHUP)))
            return SYMM_WIO_INPUT;
    }
    return SYMM_WIO_OK;
}

/* Move the descriptors of m's SCM_RIGHTS messages into fds (at most max; any
 * beyond are closed) and return how many there were in all. */
static int take_fds(struct msghdr *m, int *fds, int max)
{
    int total = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (total < max)
                fds[total] = fd;
            else
                close(fd);
            total++;
        }
    }
    return total;
}

static void close_fds(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

/* One recvmsg: bytes (0 at EOF) or -1 with errno. Descriptors go to fds
 * (*nfds of them); *truncated when the kernel cut the ancillary data. */
static ssize_t recv_once(int sock, char *p, size_t n, int *fds, int *nfds, int *truncated)
{
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * MAX_FDS_PER_MSG)];
    } ctl;
    struct iovec iov = {.iov_base = p, .iov_len = n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                       .msg_controllen = sizeof ctl.buf};
    ssize_t k = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    *nfds = 0;
    *truncated = 0;
    if (k < 0)
        return k;
    int total = take_fds(&m, fds, MAX_FDS_PER_MSG);
    *nfds = total < MAX_FDS_PER_MSG ? total : MAX_FDS_PER_MSG;
    *truncated = (m.msg_flags & MSG_CTRUNC) || total > MAX_FDS_PER_MSG;
    return k;
}

symm_wio symm_wio_recv(int sock, void *buf, size_t n, int *fd_out, double deadline)
{
    char *p = buf;
    int got_fd = -1;
    symm_wio res = SYMM_WIO_OK;
    while (n > 0) {
        int fds[MAX_FDS_PER_MSG], nfds, truncated;
        ssize_t k = recv_once(sock, p, n, fds, &nfds, &truncated);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                res = errno == ECONNRESET ? SYMM_WIO_EOF : SYMM_WIO_ERRNO;
                break;
            }
            int ev = wait_ready(sock, POLLIN, deadline);
            if (ev <= 0) {
                res = ev == 0 ? SYMM_WIO_TIMEOUT : SYMM_WIO_ERRNO;
                break;
            }
            continue;
        }
        if (truncated || nfds > 1 || (nfds == 1 && (!fd_out || got_fd >= 0))) {
            close_fds(fds, nfds);
            /* A descriptor this call waits for, cut off by the kernel: it
             * could not be installed here (RLIMIT_NOFILE reached). */
            res = truncated && nfds == 0 && fd_out && got_fd < 0 ? SYMM_WIO_NOFD : SYMM_WIO_BADFD;
            break;
        }
        if (nfds == 1)
            got_fd = fds[0];
        if (k == 0) {
            res = SYMM_WIO_EOF;
            break;
        }
        p += k;
        n -= (size_t)k;
    }
    if (res == SYMM_WIO_OK && fd_out && got_fd < 0)
        res = SYMM_WIO_BADFD;
    if (res != SYMM_WIO_OK) {
        if (got_fd >= 0) {
            int saved = errno;
            close(got_fd);
            errno = saved;
        }
        return res;
    }
    if (fd_out)
        *fd_out = got_fd;
    return SYMM_WIO_OK;
}

symm_wio symm_wio_recv_some(int sock, void *buf, size_t n, size_t *got)
{
    *got = 0;
    for (;;) {
        int fds[MAX_FDS_PER_MSG], nfds, truncated;
        ssize_t k = recv_once(sock, buf, n, fds, &nfds, &truncated);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? SYMM_WIO_OK
                   : errno == ECONNRESET                   ? SYMM_WIO_EOF
                                                           : SYMM_WIO_ERRNO;
        if (nfds > 0 || truncated) {
            close_fds(fds, nfds);
            return SYMM_WIO_BADFD;
        }
        if (k == 0)
            return SYMM_WIO_EOF;
        *got = (size_t)k;
        return SYMM_WIO_OK;
    }
}

symm_wio symm_wio_send_frame(int sock, const symm_world_frame *f, const void *payload, double deadline,
                             int watch_input)
{
    symm_wio r = symm_wio_send(sock, f, sizeof *f, -1, deadline, watch_input);
    if (r == SYMM_WIO_OK && f->len > 0)
        r = symm_wio_send(sock, payload, f->len, -1, deadline, watch_input);
    return r;
}

void symm_wio_send_error(int sock, symm_status status, const char *message, double deadline)
{
    size_t len = strnlen(message, SYMM_WORLD_MSG_MAX - 1);
    symm_world_frame f = {.type = SYMM_FRAME_ERROR, .arg = (uint32_t)status, .len = len};
    (void)symm_wio_send_frame(sock, &f, message, deadline, 0);
}

symm_wio symm_wio_recv_error(int sock, const symm_world_frame *f, char *msg, size_t msg_size,
                             double deadline)
{
    size_t keep = f->len < msg_size - 1 ? (size_t)f->len : msg_size - 1;
    symm_wio r = symm_wio_recv(sock, msg, keep, NULL, deadline);
    msg[r == SYMM_WIO_OK ? keep : 0] = '\0';
    for (uint64_t left = f->len - keep; r == SYMM_WIO_OK && left > 0;) {
        char sink[256];
        size_t k = left < sizeof sink ? (size_t)left : sizeof sink;
        r = symm_wio_recv(sock, sink, k, NULL, deadline);
        left -= k;
    }
    return r;
}
