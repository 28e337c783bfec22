/* symm_world.h: the ranks of one job, on one host or several, and how they
 * meet.
 *
 * A world is a set of processes (ranks 0..size-1), one GPU each, that found
 * each other through a rendezvous at rank 0 and share a per-job secret. It
 * gives host-side collectives (allgather, broadcast, barrier) and, among the
 * ranks of one host, the passing of file descriptors, which the symmetric
 * heap uses to share GPU memory. Every collective must be called by all
 * ranks in the same order; every wait is bounded by the world's timeout
 * (SYMM_TIMEOUT seconds, default 60), after which the call fails with
 * SYMM_ERR_TIMEOUT naming the ranks that did not arrive (and their hosts). A
 * rank that dies makes the others' calls fail with SYMM_ERR_PEER naming it,
 * never hang.
 *
 * One host (no root address configured): the ranks meet at a Unix-domain
 * socket. Only processes of this user with the job's secret may join: rank 0
 * checks each connection's uid (SO_PEERCRED) and a digest of the secret in
 * its hello (the secret itself never travels), and keeps waiting for the
 * right ranks when a stranger knocks. The socket lives in
 * <socket_dir>/symm-<uid>, a 0700 directory (refused when it is not ours, not
 * 0700 or a symlink), and is unlinked as soon as every rank has joined.
 *
 * Several hosts (a root address: cfg.root_addr, SYMM_ROOT_ADDR, or what
 * symm_world_config_from_env finds in a multi-node launcher's environment):
 * rank 0 listens on TCP, every rank connects, and both sides prove the job
 * secret by challenge and response (HMAC-SHA256 over fresh nonces; the secret
 * never travels; docs/protocol.md). Each rank says its host id, local rank
 * and local size; rank 0 checks that they agree (SYMM_ERR_MISMATCH naming the
 * ranks and hosts otherwise) and sends every rank the host table. Then the
 * ranks of each host form a host world over the Unix-socket path
 * (symm_world_host_world), which passes descriptors; the world's own
 * collectives run over TCP through rank 0. Hosts are identified by
 * cfg.host_id, else SYMM_HOST_ID, else the machine (hostname and boot id), so
 * that ranks of one machine can form simulated hosts for tests.
 *
 * A collective that fails (a rank died, timed out, disagreed or passed a bad
 * argument) fails on every rank, and the world stays failed: later
 * collectives return the same status at once. Destroy it.
 *
 * A world is used by one thread at a time. */
#ifndef SYMM_WORLD_H
#define SYMM_WORLD_H

#include <stddef.h>

#include "symm_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct symm_world symm_world;

/* Where a rank's identity comes from, and how the ranks meet. Fields left 0 /
 * NULL take their defaults, except device: 0 is device 0, -1 the default. */
typedef struct symm_world_config {
    int rank;               /* 0..size-1 */
    int size;               /* number of ranks, >= 1 */
    int local_rank;         /* rank among this host's ranks; picks the GPU */
    int device;             /* CUDA device ordinal; -1: local_rank modulo visible devices */
    const char *job_id;     /* names the rendezvous socket; NULL: from the environment */
    const char *secret;     /* per-job secret; NULL: SYMM_JOB_SECRET, else derived from job_id
                             * and the uid (then only the uid check and the 0700 directory
                             * keep others out, as under torchrun, mpirun or srun) */
    const char *socket_dir; /* absolute; NULL: $SYMM_SOCKET_DIR, $XDG_RUNTIME_DIR or /tmp */
    double timeout_s;       /* 0: SYMM_TIMEOUT or 60 */
    const char *root_addr;  /* "host:port" of rank 0's TCP rendezvous (IPv4/IPv6 literal, "[v6]:port",
                             * or a name); NULL: SYMM_ROOT_ADDR, else one host (the Unix-socket
                             * rendezvous, unchanged). symm_world_config_from_env sets it from
                             * the launcher's variables when the job spans hosts (torchrun's
                             * MASTER_ADDR, Slurm's first node, ...) */
    const char *host_id;    /* this rank's host identity (at most 127 bytes); NULL: SYMM_HOST_ID,
                             * else the machine's (hostname + boot id) */
    int local_size;         /* ranks on this rank's host as the launcher says; 0: unknown.
                             * Checked against what arrives (error naming the ranks) */
} symm_world_config;

/* Fill cfg from the environment: SYMM_RANK/SYMM_WORLD_SIZE/SYMM_LOCAL_RANK
 * (set by symmrun), else torchrun's RANK/WORLD_SIZE/LOCAL_RANK, else Open MPI's
 * OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK, else Slurm's SLURM_PROCID/SLURM_NTASKS/
 * SLURM_LOCALID (the first launcher whose rank variable is set; without its
 * local rank variable, local_rank = rank). The job id comes from SYMM_JOB_ID,
 * TORCHELASTIC_RUN_ID (":MASTER_PORT" appended, since torchrun's default run
 * id is "none" for every job), MASTER_ADDR:MASTER_PORT (torch.distributed
 * without torchrun, e.g. torch.multiprocessing.spawn), PMIX_NAMESPACE /
 * OMPI_MCA_orte_ess_jobid, or SLURM_JOB_ID(.SLURM_STEP_ID).
 *
 * Hosts: local_size from SYMM_LOCAL_SIZE, LOCAL_WORLD_SIZE or
 * OMPI_COMM_WORLD_LOCAL_SIZE (else 0); host_id from SYMM_HOST_ID (else NULL).
 * root_addr is SYMM_ROOT_ADDR when set; else, for a job that spans hosts:
 * torchrun (LOCAL_WORLD_SIZE below WORLD_SIZE): MASTER_ADDR, port
 * SYMM_ROOT_PORT else MASTER_PORT + 1 (MASTER_PORT is torch's store); Slurm
 * (SLURM_STEP_NUM_NODES, else SLURM_NNODES, above 1): the first host of
 * SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), port SYMM_ROOT_PORT else
 * 20000 + (SLURM_JOB_ID * 97 + SLURM_STEP_ID) % 12000; Open MPI
 * (OMPI_COMM_WORLD_LOCAL_SIZE below the size): SYMM_ROOT_ADDR is required
 * (SYMM_ERR_INVALID_ARG naming it). Else NULL (one host).
 *
 * Also read: SYMM_JOB_SECRET (secret, else NULL), SYMM_DEVICE (device, else
 * -1), SYMM_TIMEOUT (timeout_s, a positive number of seconds, else 60) and
 * SYMM_SOCKET_DIR (socket_dir, else NULL). The strings in cfg point into the
 * environment or into storage of this thread that its next call reuses.
 * SYMM_ERR_INVALID_ARG naming the variable and its value when a value is
 * malformed or out of range, or when no launcher's variables are present. */
symm_status symm_world_config_from_env(symm_world_config *cfg);

/* Join the world described by cfg: rank 0 listens, the others connect (and
 * retry until the timeout), each peer's uid is checked (SO_PEERCRED) and the
 * secret compared (one host), or both sides prove the secret (across hosts).
 * Collective. SYMM_ERR_TIMEOUT "symm_world_create: ranks 2, 3 did not join
 * within 60 s" on rank 0 and on the ranks that had joined; SYMM_ERR_PEER
 * "... rank 0 refused this rank (1): wrong job secret" on a rank rank 0 turns
 * away; SYMM_ERR_MISMATCH across hosts when the ranks' host ids, local ranks
 * and local sizes disagree. A world of size 1 on one host needs no socket. */
symm_status symm_world_create(const symm_world_config *cfg, symm_world **out);

/* symm_world_config_from_env then symm_world_create. */
symm_status symm_world_create_from_env(symm_world **out);

/* Leave the world and free it (not collective; peers see a disconnect).
 * Everything is freed either way; SYMM_ERR_SYSTEM when closing a connection
 * failed. NULL: SYMM_OK. */
symm_status symm_world_destroy(symm_world *world);

int symm_world_rank(const symm_world *world);
int symm_world_size(const symm_world *world);
int symm_world_local_rank(const symm_world *world);
/* The CUDA device of this rank: cfg.device when >= 0, else local_rank (whoever
 * touches CUDA takes it modulo the number of visible devices). */
int symm_world_device(const symm_world *world);
double symm_world_timeout(const symm_world *world);

/* Every rank contributes bytes at send; recv (size * bytes) receives them in
 * rank order. bytes must agree on every rank (SYMM_ERR_MISMATCH naming both
 * ranks and both values otherwise). send may be recv + rank * bytes. */
symm_status symm_world_allgather(symm_world *world, const void *send, void *recv, size_t bytes);

/* root's buf (bytes) is copied into every rank's buf; bytes and root must
 * agree on every rank. */
symm_status symm_world_bcast(symm_world *world, void *buf, size_t bytes, int root);

symm_status symm_world_barrier(symm_world *world);

/* Every rank contributes one open file descriptor; fds_out[r] (size entries)
 * receives a new close-on-exec descriptor (owned by the caller, to close) for
 * rank r's, fds_out[rank] a dup of its own. Passed with SCM_RIGHTS through
 * rank 0. On failure every entry is -1 and nothing is left open. On a world
 * of several hosts: SYMM_ERR_UNSUPPORTED naming the hosts (GPU memory is
 * shared within a host: use symm_world_host_world). */
symm_status symm_world_allgather_fd(symm_world *world, int fd, int *fds_out);

/* Hosts are numbered 0..hosts-1 in the order of their lowest rank. A rank's
 * local index is its local_rank, which must be a permutation of
 * 0..local_size-1 on each host (checked at create, error naming the ranks). */
int symm_world_host(const symm_world *world);               /* this rank's host index */
int symm_world_host_count(const symm_world *world);         /* 1 on a one-host world */
int symm_world_local_size(const symm_world *world);         /* ranks of this rank's host */
int symm_world_rank_host(const symm_world *world, int rank); /* host index of rank; -1 out of range */
const char *symm_world_host_name(const symm_world *world, int host); /* its host id; NULL out of range */
/* 1 when rank = host * local_size + local_rank for every rank and every host
 * has the same number of ranks (what the hierarchical backend needs), else 0.
 * 1 on a world of one host (its host world is itself). */
int symm_world_host_major(const symm_world *world);
/* The world of this rank's host: its ranks are the local ranks, it passes file
 * descriptors (the symmetric heap and native variants work on it). Owned by
 * world, freed with it; world itself when the world has one host. Never NULL
 * (but for a NULL world). */
symm_world *symm_world_host_world(symm_world *world);

#ifdef __cplusplus
}
#endif
#endif
