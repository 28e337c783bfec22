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

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

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

/* Threads for n ranks: one a rank, at most the online CPUs and 16. */
static inline int par_ranks_threads(int n)
{
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int t = n < 16 ? n : 16;
    if (cpus >= 1 && t > cpus)
        t = (int)cpus;
    return t < 1 ? 1 : t;
}

static inline void par_ranks(int n, int threads, par_rank_fn fn, void *ctx)
{
    enum { MAX_THREADS = 16 };
    par_ranks_job job = {.fn = fn, .ctx = ctx, .n = n};
    atomic_init(&job.next, 0);
    pthread_t t[MAX_THREADS];
    int started = 0;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads > n)
        threads = n;
    while (started < threads - 1 && pthread_create(&t[started], NULL, par_ranks_worker, &job) == 0)
        started++;
    par_ranks_worker(&job);
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
}

#endif
