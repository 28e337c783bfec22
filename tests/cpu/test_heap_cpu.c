/* test_heap_cpu.c: the host-side behaviour of the symmetric heap and the
 * NCCL communicator that needs no GPU: refusals of bad arguments, a clean
 * SYMM_ERR_NO_GPU where there is no driver, size rounding, pointer lookup
 * with nothing allocated, and loading NCCL. The GPU behaviour is in
 * tests/gpu/test_heap.c and tests/gpu/test_nccl.c. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "symm_heap.h"
#include "symm_nccl.h"
#include "symm_world.h"

static unsigned long long rng_state;

static unsigned long long next_random(void)
{
    unsigned long long x = (rng_state += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void seed_random(void)
{
    if (getrandom(&rng_state, sizeof rng_state, 0) != (ssize_t)sizeof rng_state)
        rng_state = (unsigned long long)getpid() * 0x9E3779B97F4A7C15ull;
}

/* A world of one rank, private to this test process. */
static symm_world *solo_world(void)
{
    char job[64];
    snprintf(job, sizeof job, "heap-cpu-%d-%llx", (int)getpid(), next_random() & 0xffffff);
    symm_world_config cfg = {.rank = 0, .size = 1, .local_rank = 0, .device = -1,
                             .job_id = job, .timeout_s = 10};
    symm_world *w = NULL;
    symm_status st = symm_world_create(&cfg, &w);
    cr_assert(st == SYMM_OK, "symm_world_create (one rank): %s: %s", symm_status_name(st),
              symm_last_error());
    return w;
}

static void expect_invalid(symm_status st, const char *call, const char *word)
{
    cr_assert(st == SYMM_ERR_INVALID_ARG, "%s: got %s (%s), expected SYMM_ERR_INVALID_ARG", call,
              symm_status_name(st), symm_last_error());
    cr_assert(strstr(symm_last_error(), word) != NULL,
              "%s: the message should name \"%s\": %s", call, word, symm_last_error());
}

TestSuite(heap_cpu, .init = seed_random);

Test(heap_cpu, device_open_without_a_driver_is_no_gpu_naming_libcuda)
{
    symm_world *w = solo_world();
    symm_device *dev = (symm_device *)&dev;
    symm_status st = symm_device_open(w, &dev);
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver) {
        cr_assert(st == SYMM_ERR_NO_GPU && dev == NULL,
                  "symm_device_open without libcuda.so.1: got %s (%s), expected "
                  "SYMM_ERR_NO_GPU and no device", symm_status_name(st), symm_last_error());
        cr_assert(strstr(symm_last_error(), "libcuda") != NULL,
                  "the message should name libcuda: %s", symm_last_error());
    } else {
        /* A machine with a driver: a GPU opens, or its absence is told. */
        cr_assert(st == SYMM_OK || (st == SYMM_ERR_NO_GPU && dev == NULL),
                  "symm_device_open with a driver: got %s (%s)", symm_status_name(st),
                  symm_last_error());
        cr_assert(symm_device_close(st == SYMM_OK ? dev : NULL) == SYMM_OK,
                  "symm_device_close: %s", symm_last_error());
        dlclose(driver);
    }
    symm_world_destroy(w);
}

Test(heap_cpu, null_and_zero_arguments_are_refused_naming_them)
{
    symm_world *w = solo_world();
    size_t bytes = 1 + next_random() % (64u << 20);
    symm_device *dev = (symm_device *)&dev;
    symm_alloc *a = (symm_alloc *)&a;

    expect_invalid(symm_device_open(NULL, &dev), "symm_device_open(NULL world)", "world");
    cr_assert(dev == NULL, "symm_device_open must clear *out on failure");
    expect_invalid(symm_device_open(w, NULL), "symm_device_open(NULL out)", "out");

    expect_invalid(symm_alloc_create(NULL, NULL, bytes, 0, &a), "symm_alloc_create(NULL world)",
                   "world");
    cr_assert(a == NULL, "symm_alloc_create must clear *out on failure");
    expect_invalid(symm_alloc_create(w, NULL, 0, 0, &a), "symm_alloc_create(0 bytes)", "bytes");
    unsigned bad = 1u << (1 + next_random() % 31);
    expect_invalid(symm_alloc_create(w, NULL, bytes, bad, &a), "symm_alloc_create(bad flags)",
                   "flags");
    expect_invalid(symm_alloc_create(w, NULL, bytes, SYMM_ALLOC_CONTIGUOUS, &a),
                   "symm_alloc_create(NULL dev)", "dev");
    expect_invalid(symm_alloc_create(w, NULL, bytes, 0, NULL), "symm_alloc_create(NULL out)",
                   "out");

    cr_assert(symm_alloc_destroy(NULL) == SYMM_OK, "symm_alloc_destroy(NULL) must be a no-op");
    cr_assert(symm_device_close(NULL) == SYMM_OK, "symm_device_close(NULL) must be a no-op");
    symm_world_destroy(w);
}

Test(heap_cpu, nccl_create_without_a_device_is_refused)
{
    symm_world *w = solo_world();
    symm_nccl *comm = (symm_nccl *)&comm;
    expect_invalid(symm_nccl_create(w, NULL, &comm), "symm_nccl_create(NULL dev)", "dev");
    cr_assert(comm == NULL, "symm_nccl_create must clear *out on failure");
    expect_invalid(symm_nccl_create(NULL, NULL, &comm), "symm_nccl_create(NULL world)", "world");
    expect_invalid(symm_nccl_create(w, NULL, NULL), "symm_nccl_create(NULL out)", "out");
    expect_invalid(symm_nccl_check_async(NULL), "symm_nccl_check_async(NULL)", "nccl");
    cr_assert(symm_nccl_destroy(NULL) == SYMM_OK && symm_nccl_abort(NULL) == SYMM_OK,
              "destroying or aborting NULL must be a no-op");
    symm_world_destroy(w);
}

Test(heap_cpu, nccl_shared_gpu_mode_needs_the_flag_and_a_host_id)
{
    static const struct {
        const char *mode, *host;
        bool want;
    } cases[] = {
        {"1", "symmrun-x-rank-0", true}, {"1", NULL, false}, {"1", "", false},
        {NULL, "symmrun-x-rank-0", false}, {"0", "symmrun-x-rank-0", false}, {"yes", "h", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].mode)
            setenv("SYMM_NCCL_SHARED_GPU", cases[i].mode, 1);
        else
            unsetenv("SYMM_NCCL_SHARED_GPU");
        if (cases[i].host)
            setenv("NCCL_HOSTID", cases[i].host, 1);
        else
            unsetenv("NCCL_HOSTID");
        cr_assert_eq(symm_nccl_shared_gpu_mode(), cases[i].want, "SYMM_NCCL_SHARED_GPU=%s NCCL_HOSTID=%s",
                     cases[i].mode ? cases[i].mode : "(unset)", cases[i].host ? cases[i].host : "(unset)");
    }
    unsetenv("SYMM_NCCL_SHARED_GPU");
    unsetenv("NCCL_HOSTID");
}

Test(heap_cpu, nccl_loads_with_multicast_off_or_says_why_not)
{
    unsetenv("NCCL_NVLS_ENABLE");
    int version = -1;
    symm_status st = symm_nccl_version(&version);
    if (st == SYMM_OK) {
        cr_assert(version >= 21300, "NCCL version code %d, expected 2.13 (21300) or newer",
                  version);
        const char *nvls = getenv("NCCL_NVLS_ENABLE");
        cr_assert(nvls && strcmp(nvls, "0") == 0, "NCCL_NVLS_ENABLE is %s after loading NCCL, "
                  "expected 0 (NVLink multicast must stay off)", nvls ? nvls : "unset");
    } else {
        cr_assert(st == SYMM_ERR_NCCL && strstr(symm_last_error(), "libnccl.so.2"),
                  "symm_nccl_version without NCCL: got %s (%s), expected SYMM_ERR_NCCL naming "
                  "libnccl.so.2", symm_status_name(st), symm_last_error());
    }
    expect_invalid(symm_nccl_version(NULL), "symm_nccl_version(NULL)", "version");
}

/* Reference: the smallest multiple of g that is >= n, found by another route. */
static size_t next_multiple(size_t n, size_t g)
{
    return (n / g + (n % g != 0)) * g;
}

Test(heap_cpu, round_up_gives_the_next_multiple_of_the_granularity)
{
    for (int i = 0; i < 10000; i++) {
        size_t g = next_random() % 4 ? (size_t)1 << (next_random() % 30)
                                     : 1 + next_random() % 100000;
        size_t n = 1 + next_random() % (1ull << (next_random() % 40));
        size_t got = 0;
        symm_status st = symm_heap_round_up(n, g, &got);
        cr_assert(st == SYMM_OK && got == next_multiple(n, g),
                  "symm_heap_round_up(%zu, %zu) = %zu (%s), expected %zu", n, g, got,
                  symm_status_name(st), next_multiple(n, g));
        cr_assert(symm_heap_round_up(got, g, &n) == SYMM_OK && n == got,
                  "a multiple of the granularity (%zu of %zu) must stay as it is, got %zu", got,
                  g, n);
    }
    size_t out = 0, g = (size_t)2 << (next_random() % 20);
    expect_invalid(symm_heap_round_up(0, g, &out), "symm_heap_round_up(0 bytes)", "bytes");
    expect_invalid(symm_heap_round_up(g, 0, &out), "symm_heap_round_up(granularity 0)",
                   "granularity");
    expect_invalid(symm_heap_round_up(SIZE_MAX - next_random() % (g - 1), g, &out),
                   "symm_heap_round_up(overflow)", "not fit");
    expect_invalid(symm_heap_round_up(g, g, NULL), "symm_heap_round_up(NULL out)", "out");
}

Test(heap_cpu, find_with_nothing_allocated_refuses_every_pointer)
{
    for (int i = 0; i < 100; i++) {
        CUdeviceptr p = (CUdeviceptr)next_random();
        size_t bytes = 1 + next_random() % 4096;
        symm_alloc *owner = (symm_alloc *)&owner;
        size_t offset = 7;
        symm_status st = symm_alloc_find(p, bytes, &owner, &offset);
        cr_assert(st == SYMM_ERR_INVALID_ARG && owner == NULL && offset == 0,
                  "symm_alloc_find(0x%llx, %zu) with nothing allocated: %s, owner %p",
                  (unsigned long long)p, bytes, symm_status_name(st), (void *)owner);
        cr_assert(strstr(symm_last_error(), "not inside") != NULL,
                  "the message should say the pointer is not inside an allocation: %s",
                  symm_last_error());
    }
    size_t offset;
    symm_alloc *owner;
    expect_invalid(symm_alloc_find(1, 1, NULL, &offset), "symm_alloc_find(NULL owner)", "owner");
    expect_invalid(symm_alloc_find(1, 1, &owner, NULL), "symm_alloc_find(NULL offset)", "offset");
}
