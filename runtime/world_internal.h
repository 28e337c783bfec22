/* world_internal.h: what the world's sources share (world.c: the Unix-socket
 * rendezvous of one host and lifetime, world_tcp.c: the TCP rendezvous of a
 * world across hosts, world_root.c: rank 0's wait for every rank on either,
 * world_coll.c: collectives, world_env.c: configuration and the socket
 * directory, world_io.c: bounded socket I/O). Not installed.
 *
 * The wire protocol of one host (native byte order): a connecting rank sends
 * a hello; rank 0 answers WELCOME once every rank has joined, REFUSE to a
 * connection it will not take, or ERROR when create fails. Every later message
 * is a frame header followed by len payload bytes; a descriptor travels as
 * SCM_RIGHTS on a payload of exactly one byte. Across hosts (docs/protocol.md)
 * the connection is TCP and the hello a challenge and response (HMAC-SHA256
 * of both sides' nonces, keyed by the job secret); after WELCOME, which then
 * carries the host table, the frames are the same. */
#ifndef SYMM_WORLD_INTERNAL_H
#define SYMM_WORLD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

#include "internal.h"
#include "symm_world.h"

/* Shared between the world's files, but not part of libsymm's interface. */
#define SYMM_HIDDEN __attribute__((visibility("hidden")))

#define SYMM_WORLD_MAX_SIZE 4096
#define SYMM_WORLD_DEFAULT_TIMEOUT 60.0
#define SYMM_WORLD_MAX_TIMEOUT 1e6
#define SYMM_WORLD_JOB_ID_MAX 256
#define SYMM_WORLD_PATH_MAX ((int)sizeof(((struct sockaddr_un *)0)->sun_path))
#define SYMM_WORLD_PROTOCOL 1
#define SYMM_WORLD_MAGIC 0x444c524f574d4d53ull /* "SMMWORLD" */
#define SYMM_WORLD_MSG_MAX 1024
#define SYMM_WORLD_HOST_ID_MAX 128 /* bytes of a host id, NUL included */
#define SYMM_WORLD_ADDR_MAX 256    /* bytes of a root address, NUL included */
#define SYMM_WORLD_TCP_PROTOCOL 1
#define SYMM_WORLD_TCP_MAGIC 0x31504354574d4d53ull /* "SMMWTCP1" */

struct symm_world {
    int rank, size, local_rank, device;
    double timeout_s;
    uint64_t calls;       /* collectives begun; the next one has number calls + 1 */
    int *conn;            /* rank 0: conn[r] is the socket to rank r (conn[0] = -1);
                           * other ranks: conn[0] is the socket to rank 0 */
    symm_status failed;   /* sticky: the first failure of a collective */
    char failed_msg[SYMM_WORLD_MSG_MAX];
    /* Hosts, numbered in the order of their lowest rank. */
    int host, hosts, local_size;
    int host_major;
    int *rank_host;       /* host index of every rank; NULL on a world of one host */
    char (*host_ids)[SYMM_WORLD_HOST_ID_MAX]; /* hosts entries */
    symm_world *host_world; /* the world of this rank's host; NULL: this world itself */
};

typedef struct symm_world_hello {
    uint64_t magic;
    uint32_t version;
    int32_t rank;
    int32_t size;
    uint32_t reserved;
    uint8_t digest[32]; /* sha256 of the job id and the secret, never the secret */
} symm_world_hello;

enum symm_world_frame_type {
    SYMM_FRAME_WELCOME = 1, /* count: size */
    SYMM_FRAME_REFUSE,      /* arg: enum symm_world_refusal; count: detail */
    SYMM_FRAME_ERROR,       /* arg: status; payload: the message */
    SYMM_FRAME_CONTRIB,     /* a rank's part of a collective, to rank 0 */
    SYMM_FRAME_RESULT,      /* rank 0's answer to a collective */
    SYMM_FRAME_PROOF,       /* across hosts: rank 0's MAC (payload, 32 bytes) */
};

enum symm_world_refusal {
    SYMM_REFUSE_PROTOCOL = 1, /* count: rank 0's protocol version */
    SYMM_REFUSE_SECRET,
    SYMM_REFUSE_SIZE,         /* count: rank 0's world size */
    SYMM_REFUSE_RANK,
    SYMM_REFUSE_DUPLICATE,
};

typedef struct symm_world_frame {
    uint16_t type;  /* enum symm_world_frame_type */
    uint16_t kind;  /* collective kind */
    uint32_t arg;   /* bcast root, refusal reason or status */
    uint64_t seq;   /* collective call number */
    uint64_t count; /* bytes argument of the collective */
    uint64_t len;   /* payload bytes that follow */
} symm_world_frame;

/* Across hosts: what a connecting rank says first, and rank 0's answer. */
typedef struct symm_tcp_hello {
    uint64_t magic;
    uint32_t version;
    uint32_t reserved;
    uint8_t nonce[32];
} symm_tcp_hello;

/* Then the connecting rank's claim, proven by mac = HMAC(key, "client",
 * job id, both nonces, the fields before mac). */
typedef struct symm_tcp_proof {
    int32_t rank, size, local_rank, local_size;
    char host_id[SYMM_WORLD_HOST_ID_MAX];
    uint8_t mac[32];
} symm_tcp_proof;

/* --- world_env.c ------------------------------------------------------ */

/* What create needs, resolved from a config and the environment. */
typedef struct symm_wenv {
    double timeout_s;
    char job_id[SYMM_WORLD_JOB_ID_MAX];
    uint8_t digest[32];
    uint8_t key[32];                /* across hosts: sha256 of the secret, the HMAC key */
    char dir[SYMM_WORLD_PATH_MAX];  /* <socket_dir>/symm-<uid> */
    char path[SYMM_WORLD_PATH_MAX]; /* dir/<job id or its hash>.sock */
    char host_id[SYMM_WORLD_HOST_ID_MAX];
    /* Across hosts: rank 0's address ("" on one host), where it came from. */
    char root_host[SYMM_WORLD_ADDR_MAX];
    int root_port;
    const char *root_var;
} symm_wenv;

/* local: the world of one host whatever the configuration says (a host
 * world of a world across hosts). */
SYMM_HIDDEN symm_status symm_wenv_resolve_as(const symm_world_config *cfg, int local, symm_wenv *env);

/* This machine's host id: hostname and boot id ("gpu01 (boot 1f0e...)"). */
SYMM_HIDDEN void symm_wenv_machine_id(char *buf, size_t n);

/* "host:port" or "[v6]:port" into host and port; 0 when malformed. */
SYMM_HIDDEN int symm_wenv_split_addr(const char *addr, char *host, size_t n, int *port);

/* The index-th host (from 0) of a Slurm hostlist ("gpu[01-04,07],login1")
 * into buf; returns how many hosts the list names, -1 when it is malformed
 * or a name does not fit in n bytes. */
SYMM_HIDDEN long symm_wenv_hostlist(const char *list, long index, char *buf, size_t n);

/* Fill env from cfg (rank, size and so on are checked by the caller); NULL
 * fields of cfg come from the environment. Errors name "symm_world_create". */
SYMM_HIDDEN symm_status symm_wenv_resolve(const symm_world_config *cfg, symm_wenv *env);

/* Create env->dir 0700, or check that the existing one is a directory (not a
 * symlink) of this user with mode 0700. */
SYMM_HIDDEN symm_status symm_wenv_prepare_dir(const symm_wenv *env);

/* Parse a SYMM_TIMEOUT value; SYMM_ERR_INVALID_ARG naming call and what is
 * accepted when it is not a positive number of seconds. */
SYMM_HIDDEN symm_status symm_wenv_parse_timeout(const char *call, const char *value, double *out);

/* --- world_io.c ------------------------------------------------------- */

/* Outcome of a bounded socket operation; the caller turns it into a message
 * that names the peer and the call. */
typedef enum symm_wio {
    SYMM_WIO_OK = 0,
    SYMM_WIO_EOF,     /* the peer closed or reset the connection */
    SYMM_WIO_TIMEOUT, /* the deadline passed */
    SYMM_WIO_INPUT,   /* (send with watch_input) the peer sent something first */
    SYMM_WIO_BADFD,   /* descriptors missing, unexpected or truncated (all closed) */
    SYMM_WIO_NOFD,    /* a descriptor was sent but this process could not take it (out of descriptors) */
    SYMM_WIO_ERRNO,   /* another system error; errno says which */
} symm_wio;

SYMM_HIDDEN double symm_wio_now(void);

/* Milliseconds left until deadline for poll(), rounded up; 0 once passed. */
SYMM_HIDDEN int symm_wio_poll_ms(double deadline);

/* Send n bytes (n >= 1 when fd >= 0, which is attached to the first byte),
 * never raising SIGPIPE. With watch_input, stop with SYMM_WIO_INPUT as soon
 * as the peer has something to read while we wait to send, or when it has
 * gone and left something to read (its error, sent before it closed). */
SYMM_HIDDEN symm_wio symm_wio_send(int sock, const void *buf, size_t n, int fd, double deadline,
                                   int watch_input);

/* Receive exactly n bytes. fd_out NULL: no descriptor may arrive; otherwise
 * exactly one must, and *fd_out gets it (close-on-exec). On any failure every
 * descriptor received is closed. */
SYMM_HIDDEN symm_wio symm_wio_recv(int sock, void *buf, size_t n, int *fd_out, double deadline);

/* One non-blocking receive of at most n bytes into buf; *got is 0 when nothing
 * was waiting. Descriptors are refused (closed, SYMM_WIO_BADFD). */
SYMM_HIDDEN symm_wio symm_wio_recv_some(int sock, void *buf, size_t n, size_t *got);

/* Send a frame with an optional payload (no descriptors). */
SYMM_HIDDEN symm_wio symm_wio_send_frame(int sock, const symm_world_frame *f, const void *payload,
                                         double deadline, int watch_input);

/* Send an ERROR frame carrying status and message; best effort. */
SYMM_HIDDEN void symm_wio_send_error(int sock, symm_status status, const char *message, double deadline);

/* Read the message payload of an ERROR frame f into msg (truncated to
 * msg_size - 1 bytes; the rest is drained). */
SYMM_HIDDEN symm_wio symm_wio_recv_error(int sock, const symm_world_frame *f, char *msg, size_t msg_size,
                                         double deadline);

/* --- world.c ---------------------------------------------------------- */

/* "rank 2" or "ranks 2, 3, 5" (or "ranks 2, 3, ... (40 in all)"): the ranks
 * whose present[] is 0. */
SYMM_HIDDEN void symm_world_missing_ranks(const unsigned char *present, int size, char *buf, size_t n);

/* How long a rank waits, beyond the timeout, for rank 0's verdict: rank 0
 * times out at about the same moment and then says who was missing. */
SYMM_HIDDEN double symm_world_grace(double timeout_s);

/* "rank 3", or on a world of several hosts "rank 3 (host sim1)". */
SYMM_HIDDEN const char *symm_world_who(const symm_world *w, int rank, char *buf, size_t n);

/* "" on one host, else " (host sim1)" or " (hosts sim0, sim1)": the hosts
 * of the ranks whose present[] is 0. */
SYMM_HIDDEN void symm_world_missing_hosts(const symm_world *w, const unsigned char *present, char *buf,
                                          size_t n);

/* The display form of a host id: up to " (boot " of a machine's id. */
SYMM_HIDDEN void symm_world_host_label(const char *id, char *buf, size_t n);

/* Create a world of one host (the Unix-socket path) from cfg, ignoring any
 * root address. */
SYMM_HIDDEN symm_status symm_world_create_local(const symm_world_config *cfg, symm_world **out);

/* --- world_tcp.c ------------------------------------------------------ */

/* The rendezvous across hosts: rank 0 listens at env's port, the others
 * connect; on success w knows its hosts and has its host world. */
SYMM_HIDDEN symm_status symm_world_tcp_rendezvous(symm_world *w, const symm_world_config *cfg,
                                                  const symm_wenv *env);

/* --- world_root.c ----------------------------------------------------- */

/* Connections that may wait at once to say who they are; beyond, the oldest
 * is dropped (a real rank whose connection is dropped reconnects). */
#define SYMM_WROOT_MAX_PENDING 64

/* Rank 0's wait for every rank, one poll() loop over the listening socket,
 * the pending connections and the joined ranks; the transport fills in the
 * socket, its pending connections and what differs (below). The transport's
 * own state begins with this struct, so that its functions reach the rest by
 * a cast. */
typedef struct symm_wroot symm_wroot;
struct symm_wroot {
    symm_world *w;
    int lfd;           /* the listening socket */
    const char *where; /* the accept error names it ("accept on <where>"); NULL: not */
    /* SYMM_WROOT_MAX_PENDING elements of pend_size bytes, each beginning with
     * its descriptor (int): the loop zeroes an element and sets its
     * descriptor on accept, and forgets one whose descriptor is -1. */
    void *pend;
    size_t pend_size;
    int npend;
    int joined; /* rank 0 included */
    /* A new connection: 0 to close it at once. */
    int (*admit)(symm_wroot *z, int fd);
    /* Pending connection p has something to read; 1 when it joined (then, or
     * when the transport closed it, its descriptor is -1). */
    int (*read)(symm_wroot *z, void *p);
    /* Joined rank r is gone (eof: it closed, else it sent something): the
     * error (its connection is closed and conn[r] is -1). */
    symm_status (*left)(symm_wroot *z, int r, int eof);
    /* The deadline passed before all joined: the error. */
    symm_status (*timeout)(symm_wroot *z);
};

/* Run the loop until every rank has joined, the world's timeout has passed
 * or something fails; the connections still pending are closed. */
SYMM_HIDDEN symm_status symm_wroot_wait(symm_wroot *z);

/* Refuse a connection with a REFUSE frame (best effort, not closed). */
SYMM_HIDDEN void symm_wroot_refuse(int fd, uint32_t reason, uint64_t detail);

/* Rank 0 failed with st: tell every rank that joined (best effort). */
SYMM_HIDDEN void symm_wroot_tell_error(const symm_world *w, symm_status st);

/* Constant-time comparison of 32 bytes: a wrong guess learns nothing from
 * the timing. */
SYMM_HIDDEN int symm_world_digest_equal(const uint8_t *a, const uint8_t *b);

SYMM_HIDDEN void symm_world_sleep_until(double t);

/* A connecting rank's error for rank 0's REFUSE frame f: protocol is this
 * rank's protocol version; secret and rank, the transport's words for those
 * two refusals. */
SYMM_HIDDEN symm_status symm_world_refused(const symm_world *w, const symm_world_frame *f, int protocol,
                                           const char *secret, const char *rank);

/* A connecting rank's one try to reach rank 0 and be welcomed: SYMM_OK with
 * *fd the connection once welcomed, SYMM_OK with *fd -1 to try again after a
 * pause, or the error that ends the rendezvous. */
typedef symm_status (*symm_world_try_fn)(void *ctx, double deadline, int *fd);

/* A connecting rank tries until it is welcomed (conn[0] then holds the
 * connection) or its timeout has passed (timed_out says the error), pausing
 * from 1 ms, doubled after each try, up to max_pause_s. */
SYMM_HIDDEN symm_status symm_world_reach_root(symm_world *w, double max_pause_s, symm_world_try_fn attempt,
                                              symm_status (*timed_out)(void *ctx), void *ctx);

/* A connecting rank's error for rank 0's ERROR frame f on fd: its message
 * and status. */
SYMM_HIDDEN symm_status symm_world_adopt_error(int fd, const symm_world_frame *f);

/* --- world_coll.c ----------------------------------------------------- */

/* Record st (with the current message) as the world's sticky failure and
 * tell the peers: rank 0 tells every rank, the others tell rank 0. */
SYMM_HIDDEN symm_status symm_world_break(symm_world *w, symm_status st);

#endif
