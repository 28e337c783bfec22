/* heap_test.h: what the heap and NCCL GPU tests share. Each test binary is
 * one rank, started by `symmrun -n N`; every Test joins its own world (the
 * launcher's job id plus the test's name, so consecutive tests never meet
 * each other's sockets), makes the same collective calls in the same order on
 * every rank, and leaves through a barrier. Messages start with the rank,
 * since the output of all ranks is interleaved. */
#ifndef HEAP_TEST_H
#define HEAP_TEST_H

#include <criterion/criterion.h>
#include <cuda.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "symm_heap.h"
#include "symm_world.h"

static int test_rank = -1;

/* Fail the test with the status and libsymm's message. */
#define EXPECT_OK(expr)                                                                   \
    do {                                                                                  \
        symm_status expect_st_ = (expr);                                                  \
        cr_assert(expect_st_ == SYMM_OK, "rank %d: %s: %s: %s", test_rank, #expr,         \
                  symm_status_name(expect_st_), symm_last_error());                       \
    } while (0)

/* A driver call the test makes itself. */
#define CU_OK(call)                                                                       \
    do {                                                                                  \
        CUresult cu_ok_r_ = (call);                                                       \
        const char *cu_ok_name_ = "?";                                                    \
        if (cu_ok_r_ != CUDA_SUCCESS)                                                     \
            cuGetErrorName(cu_ok_r_, &cu_ok_name_);                                       \
        cr_assert(cu_ok_r_ == CUDA_SUCCESS, "rank %d: %s: %s", test_rank, #call,          \
                  cu_ok_name_);                                                           \
    } while (0)

/* Whether the driver sees a GPU; why not in why. */
static inline bool gpu_present(char *why, size_t cap)
{
    CUresult r = cuInit(0);
    int count = 0;
    if (r == CUDA_SUCCESS)
        r = cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS) {
        const char *name = "?";
        cuGetErrorName(r, &name);
        snprintf(why, cap, "cuInit: %s (%d)", name, (int)r);
        return false;
    }
    if (count == 0) {
        snprintf(why, cap, "the driver sees no device");
        return false;
    }
    return true;
}

#define SKIP_WITHOUT_GPU()                                                                \
    do {                                                                                  \
        char skip_why_[256];                                                              \
        if (!gpu_present(skip_why_, sizeof skip_why_)) {                                  \
            printf("skipped: no GPU (%s)\n", skip_why_);                                  \
            fflush(stdout);                                                               \
            cr_skip_test("no GPU (%s)", skip_why_);                                       \
        }                                                                                 \
    } while (0)

typedef struct rank_ctx {
    symm_world *world;
    symm_device *dev;
    int rank, ranks;
} rank_ctx;

/* Join this test's world and open the rank's GPU. */
static inline void rank_begin(rank_ctx *c, const char *test)
{
    symm_world_config cfg;
    symm_status st = symm_world_config_from_env(&cfg);
    cr_assert(st == SYMM_OK, "symm_world_config_from_env: %s: %s (run this binary through "
              "symmrun -n N)", symm_status_name(st), symm_last_error());
    char job[256];
    snprintf(job, sizeof job, "%s.%s", cfg.job_id ? cfg.job_id : "heap-test", test);
    cfg.job_id = job;
    st = symm_world_create(&cfg, &c->world);
    cr_assert(st == SYMM_OK, "rank %d: symm_world_create (job %s): %s: %s", cfg.rank, job,
              symm_status_name(st), symm_last_error());
    c->rank = test_rank = symm_world_rank(c->world);
    c->ranks = symm_world_size(c->world);
    EXPECT_OK(symm_device_open(c->world, &c->dev));
}

/* Leave together: nobody destroys its world while a peer still needs it. */
static inline void rank_end(rank_ctx *c)
{
    EXPECT_OK(symm_world_barrier(c->world));
    EXPECT_OK(symm_device_close(c->dev));
    symm_world_destroy(c->world);
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline unsigned long long fresh_seed(void)
{
    unsigned long long s = 0;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s)
        s = (unsigned long long)time(NULL) * 0x9E3779B97F4A7C15ull ^ (unsigned long long)getpid();
    return s;
}

/* One seed for every rank (rank 0's), for choices that must agree. */
static inline unsigned long long shared_seed(symm_world *w)
{
    unsigned long long s = fresh_seed();
    EXPECT_OK(symm_world_bcast(w, &s, sizeof s, 0));
    return s;
}

/* splitmix64: the tests' random numbers, reproducible from a printed seed. */
static inline unsigned long long next_random(unsigned long long *state)
{
    unsigned long long x = (*state += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Uniform in [lo, hi]. */
static inline size_t random_between(unsigned long long *state, size_t lo, size_t hi)
{
    return lo + (size_t)(next_random(state) % (unsigned long long)(hi - lo + 1));
}

/* Descriptors this process has open (those of /proc/self/fd, less the one
 * used to read it). */
static inline int open_fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    cr_assert(d != NULL, "rank %d: cannot open /proc/self/fd", test_rank);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1;
}

#endif
