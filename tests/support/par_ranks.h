/* par_ranks.h: the host side of the GPU tests and moe_bench builds every
 * rank's inputs and expert outputs (the CPU reference simulates the whole
 * world), one random stream a rank. par_ranks runs that work for the ranks
 * on several threads: fn(ctx, p) once for each p in [0, n), on at most
 * `threads` threads including the caller's, all done when it returns. A
 * thread that cannot start leaves its share to the others, so the work is
 * always done. The results are those of a loop over p as long as fn(ctx, p)
 * writes only what belongs to p (each rank's stream is its own).
 * At world 4, T = 4096, hidden 7168, top-8 the expert outputs of the four
 * ranks are 940 M elements a call, drawn one at a time. */
#ifndef SYMM_TESTS_PAR_RANKS_H
#define SYMM_TESTS_PAR_RANKS_H

#include <stdatomic.h>

#include "threads.h"

typedef void (*par_rank_fn)(void *ctx, int p);

typedef struct par_ranks_job {
    par_rank_fn fn;
    void *ctx;
    int n;
    atomic_int next;
} par_ranks_job;

static void *par_ranks_worker(void *arg)
{
    par_ranks_job *job = arg;
    for (;;) {
        const int p = atomic_fetch_add(&job->next, 1);
        if (p >= job->n)
            return NULL;
        job->fn(job->ctx, p);
    }
}

/* Threads for n ranks: one a rank, at most the online CPUs and
 * SYMM_MAX_THREADS (runtime/threads.h). */
static inline int par_ranks_threads(int n)
{
    return symm_threads_for(n);
}

static inline void par_ranks(int n, int threads, par_rank_fn fn, void *ctx)
{
    par_ranks_job job = {.fn = fn, .ctx = ctx, .n = n};
    atomic_init(&job.next, 0);
    symm_run_threads(threads < n ? threads : n, par_ranks_worker, &job);
}

#endif
