/* symm_world.h: the ranks of one job on one host and how they meet.
 *
 * A world is a set of processes (ranks 0..size-1), one GPU each, that found
 * each other through a Unix-domain socket and share a per-job secret. It gives
 * host-side collectives (allgather, broadcast, barrier) and the passing of file
 * descriptors, which the symmetric heap uses to share GPU memory. Every
 * collective must be called by all ranks in the same order; every wait is
 * bounded by the world's timeout (SYMM_TIMEOUT seconds, default 60), after
 * which the call fails with SYMM_ERR_TIMEOUT naming the ranks that did not
 * arrive. A rank that dies makes the others' calls fail with SYMM_ERR_PEER
 * naming it, never hang.
 *
 * Only processes of this user with the job's secret may join: rank 0 checks
 * each connection's uid (SO_PEERCRED) and a digest of the secret in its hello
 * (the secret itself never travels), and keeps waiting for the right ranks
 * when a stranger knocks. The socket lives in <socket_dir>/symm-<uid>, a 0700
 * directory (refused when it is not ours, not 0700 or a symlink), and is
 * unlinked as soon as every rank has joined.
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
} symm_world_config;

/* Fill cfg from the environment: SYMM_RANK/SYMM_WORLD_SIZE/SYMM_LOCAL_RANK
 * (set by symmrun), else torchrun's RANK/WORLD_SIZE/LOCAL_RANK, else Open MPI's
 * OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK, else Slurm's SLURM_PROCID/SLURM_NTASKS/
 * SLURM_LOCALID (the first launcher whose rank variable is set; without its
 * local rank variable, local_rank = rank). The job id comes from SYMM_JOB_ID,
 * TORCHELASTIC_RUN_ID (":MASTER_PORT" appended, since torchrun's default run
 * id is "none" for every job), MASTER_ADDR:MASTER_PORT (torch.distributed
 * without torchrun, e.g. torch.multiprocessing.spawn), PMIX_NAMESPACE /
 * OMPI_MCA_orte_ess_jobid, or SLURM_JOB_ID(.SLURM_STEP_ID). A world holds
 * the ranks of one host: a job that spans several (LOCAL_WORLD_SIZE or
 * OMPI_COMM_WORLD_LOCAL_SIZE below the world size, or SLURM_STEP_NUM_NODES,
 * else SLURM_NNODES, above 1) is SYMM_ERR_UNSUPPORTED "... the job spans N
 * hosts ...", at once. Also read: SYMM_JOB_SECRET (secret, else
 * NULL), SYMM_DEVICE (device, else -1), SYMM_TIMEOUT (timeout_s, a positive
 * number of seconds, else 60) and SYMM_SOCKET_DIR (socket_dir, else NULL).
 * The strings in cfg point into the environment or into storage of this
 * thread that its next call reuses.
 * SYMM_ERR_INVALID_ARG naming the variable and its value when a value is
 * malformed or out of range, or when no launcher's variables are present. */
symm_status symm_world_config_from_env(symm_world_config *cfg);

/* Join the world described by cfg: rank 0 listens, the others connect (and
 * retry until the timeout), each peer's uid is checked (SO_PEERCRED) and the
 * secret compared. Collective. SYMM_ERR_TIMEOUT "symm_world_create: ranks 2, 3
 * did not join within 60 s" on rank 0 and on the ranks that had joined;
 * SYMM_ERR_PEER "... rank 0 refused this rank (1): wrong job secret" on a rank
 * rank 0 turns away. A world of size 1 needs no socket. */
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
 * rank 0. On failure every entry is -1 and nothing is left open. */
symm_status symm_world_allgather_fd(symm_world *world, int fd, int *fds_out);

#ifdef __cplusplus
}
#endif
#endif
