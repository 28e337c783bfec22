/* tests/support/par_ranks.h: every rank's work runs exactly once whatever
 * the threads, and per-rank random streams give the bytes of a plain loop
 * (what check and moe_bench rely on when they build the ranks' inputs and
 * expert outputs on several threads). */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe_inputs.h"
#include "par_ranks.h"

enum { MAX_N = 40, ELEMS = 4096 };

typedef struct counts {
    atomic_int runs[MAX_N];
} counts;

static void count_run(void *ctx, int p)
{
    counts *c = ctx;
    atomic_fetch_add(&c->runs[p], 1);
}

Test(par_ranks, runs_every_rank_exactly_once_whatever_the_threads)
{
    static const int threads[] = {0, 1, 2, 3, 8, 16, 17, 100};
    for (int n = 0; n <= MAX_N; n++)
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
            counts c;
            for (int p = 0; p < MAX_N; p++)
                atomic_init(&c.runs[p], 0);
            par_ranks(n, threads[t], count_run, &c);
            for (int p = 0; p < MAX_N; p++)
                cr_assert_eq(atomic_load(&c.runs[p]), p < n ? 1 : 0, "n %d, %d threads: rank %d ran %d times", n,
                             threads[t], p, atomic_load(&c.runs[p]));
        }
}

Test(par_ranks, threads_follow_the_ranks_and_the_cpus)
{
    cr_assert_eq(par_ranks_threads(0), 1);
    cr_assert_eq(par_ranks_threads(1), 1);
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    for (int n = 1; n <= 64; n++) {
        const int t = par_ranks_threads(n);
        cr_assert(t >= 1 && t <= n && t <= 16 && (cpus < 1 || t <= cpus), "%d ranks: %d threads", n, t);
    }
}

typedef struct fills {
    uint64_t seed;
    uint16_t *buf[MAX_N];
} fills;

static void fill_rank(void *ctx, int p)
{
    fills *f = ctx;
    moe_rng r = moe_rng_for(f->seed, 7, (uint64_t)p + 1);
    moe_random_elems(&r, SYMM_DTYPE_BF16, f->buf[p], ELEMS);
}

Test(par_ranks, per_rank_streams_give_the_bytes_of_a_loop)
{
    fills seq = {.seed = 0x5eed1234abcdull}, par = seq;
    for (int p = 0; p < MAX_N; p++) {
        seq.buf[p] = malloc(ELEMS * sizeof(uint16_t));
        par.buf[p] = calloc(ELEMS, sizeof(uint16_t));
        cr_assert(seq.buf[p] && par.buf[p]);
        fill_rank(&seq, p);
    }
    par_ranks(MAX_N, 8, fill_rank, &par);
    for (int p = 0; p < MAX_N; p++) {
        cr_assert(!memcmp(seq.buf[p], par.buf[p], ELEMS * sizeof(uint16_t)), "rank %d's stream differs", p);
        free(seq.buf[p]);
        free(par.buf[p]);
    }
}
