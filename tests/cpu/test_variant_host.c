/* test_variant_host.c: the host side shared by the NCCL and hybrid backends
 * (runtime/variant_host.c) without a GPU: the driver is a table of fakes.
 * The sticky failure (recorded, reported to later calls with the
 * backend's name, made sticky by the wait or left to the caller), the
 * wait's timeout and its message, the refusal of stream capture, the
 * allocations' sizes and messages, what release frees, and the grid of a
 * grid-stride kernel at its edges. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "variant_host.h"

/* --- the fake driver --------------------------------------------------- */

static struct {
    int polls_until_ready;   /* queries answer NOT_READY this many times, then SUCCESS */
    CUresult query_error;    /* else: every query answers this (not CUDA_SUCCESS) */
    int stream_queries, event_queries;
    CUstream last_stream;
    CUevent last_event;
    CUstreamCaptureStatus capture;
    CUresult capture_error;
    size_t alloc_bytes;
    CUresult alloc_result;
    void *freed_hosts[8];
    CUdeviceptr freed_devs[8];
    int n_freed_hosts, n_freed_devs, events_destroyed;
} fake;

static CUresult answer_query(void)
{
    if (fake.query_error != CUDA_SUCCESS)
        return fake.query_error;
    if (fake.polls_until_ready < 0)
        return CUDA_ERROR_NOT_READY;
    return fake.polls_until_ready-- > 0 ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

static CUresult fake_stream_query(CUstream s)
{
    fake.stream_queries++;
    fake.last_stream = s;
    return answer_query();
}

static CUresult fake_event_query(CUevent e)
{
    fake.event_queries++;
    fake.last_event = e;
    return answer_query();
}

static CUresult fake_is_capturing(CUstream s, CUstreamCaptureStatus *status)
{
    (void)s;
    *status = fake.capture;
    return fake.capture_error;
}

static CUresult fake_alloc_host(void **p, size_t bytes)
{
    static char buf[64];
    fake.alloc_bytes = bytes;
    *p = fake.alloc_result == CUDA_SUCCESS ? buf : NULL;
    return fake.alloc_result;
}

static CUresult fake_alloc(CUdeviceptr *p, size_t bytes)
{
    fake.alloc_bytes = bytes;
    *p = fake.alloc_result == CUDA_SUCCESS ? 0x1000 : 0;
    return fake.alloc_result;
}

static CUresult fake_free_host(void *p)
{
    fake.freed_hosts[fake.n_freed_hosts++] = p;
    return CUDA_SUCCESS;
}

static CUresult fake_free(CUdeviceptr p)
{
    fake.freed_devs[fake.n_freed_devs++] = p;
    return CUDA_SUCCESS;
}

static CUresult fake_event_destroy(CUevent e)
{
    (void)e;
    fake.events_destroyed++;
    return CUDA_SUCCESS;
}

static symm_cuda_api cu;

static void reset(void)
{
    memset(&fake, 0, sizeof fake);
    memset(&cu, 0, sizeof cu);
    cu.cuStreamQuery = fake_stream_query;
    cu.cuEventQuery = fake_event_query;
    cu.cuStreamIsCapturing = fake_is_capturing;
    cu.cuMemAllocHost = fake_alloc_host;
    cu.cuMemAlloc = fake_alloc;
    cu.cuMemFreeHost = fake_free_host;
    cu.cuMemFree = fake_free;
    cu.cuEventDestroy = fake_event_destroy;
}

/* A variant as the backends see it: a name, a rank, a timeout. */
static symm_variant_desc desc = {.name = "bf16_rank_w2"};
static symm_variant variant = {.desc = &desc, .rank = 3, .timeout_ns = 2000000}; /* 2 ms */

TestSuite(variant_host, .init = reset);

/* --- the sticky failure -------------------------------------------------- */

Test(variant_host, no_failure_and_no_state_pass)
{
    symm_vhost h;
    symm_vhost_init(&h, "NCCL backend", SYMM_VHOST_WAIT_STICKY);
    cr_assert_eq(symm_vhost_failure(&h, &variant, "dispatch"), SYMM_OK);
    cr_assert_eq(symm_vhost_failure(NULL, &variant, "dispatch"), SYMM_OK);
}

Test(variant_host, a_failure_is_kept_and_named_by_later_calls)
{
    symm_vhost h;
    symm_vhost_init(&h, "hybrid backend", SYMM_VHOST_CALLER_STICKY);
    symm_fail(SYMM_ERR_NCCL, "rank 3: ncclSend: unhandled system error");
    cr_assert_eq(symm_vhost_fail(&h, SYMM_ERR_NCCL), SYMM_ERR_NCCL);
    cr_assert_str_eq(symm_last_error(), "rank 3: ncclSend: unhandled system error",
                     "the failing call keeps its message");
    cr_assert_eq(h.failed, SYMM_ERR_NCCL);
    symm_fail(SYMM_ERR_INVALID_ARG, "something else since");
    cr_assert_eq(symm_vhost_failure(&h, &variant, "combine"), SYMM_ERR_NCCL);
    cr_assert_str_eq(symm_last_error(), "bf16_rank_w2 combine (hybrid backend): an earlier call failed: "
                                        "rank 3: ncclSend: unhandled system error");
    /* ... and again for every later call. */
    cr_assert_eq(symm_vhost_failure(&h, &variant, "stats_read"), SYMM_ERR_NCCL);
    cr_assert(strstr(symm_last_error(), "stats_read (hybrid backend)"), "%s", symm_last_error());
}

/* --- the wait -------------------------------------------------------------- */

#define TIMEOUT_MESSAGE                                                                                       \
    "rank 3: the count exchange (ncclAllGather) did not complete within the variant's timeout of 0.002 s: a " \
    "peer did not arrive (NCCL cannot tell which); destroy the variant"

Test(variant_host, wait_polls_the_stream_until_its_work_is_done)
{
    symm_vhost h;
    symm_vhost_init(&h, "NCCL backend", SYMM_VHOST_WAIT_STICKY);
    fake.polls_until_ready = 5;
    CUstream stream = (CUstream)0x42;
    cr_assert_eq(symm_vhost_wait(&h, &variant, &cu, stream, true, "the count exchange (ncclAllGather)"), SYMM_OK,
                 "%s", symm_last_error());
    cr_assert_eq(fake.stream_queries, 6);
    cr_assert_eq(fake.event_queries, 0);
    cr_assert_eq(fake.last_stream, stream);
    cr_assert_eq(h.failed, SYMM_OK);
}

Test(variant_host, wait_without_stream_polls_the_done_event)
{
    symm_vhost h;
    symm_vhost_init(&h, "hybrid backend", SYMM_VHOST_CALLER_STICKY);
    h.done = (CUevent)0x77;
    fake.polls_until_ready = 2;
    /* NULL is a stream (the legacy default one): use_stream decides. */
    cr_assert_eq(symm_vhost_wait(&h, &variant, &cu, NULL, false, "the last call's work"), SYMM_OK);
    cr_assert_eq(fake.event_queries, 3);
    cr_assert_eq(fake.stream_queries, 0);
    cr_assert_eq(fake.last_event, h.done);
}

Test(variant_host, wait_times_out_and_makes_it_sticky_under_wait_sticky)
{
    symm_vhost h;
    symm_vhost_init(&h, "NCCL backend", SYMM_VHOST_WAIT_STICKY);
    fake.polls_until_ready = -1; /* never */
    cr_assert_eq(symm_vhost_wait(&h, &variant, &cu, NULL, true, "the count exchange (ncclAllGather)"),
                 SYMM_ERR_TIMEOUT);
    cr_assert_str_eq(symm_last_error(), TIMEOUT_MESSAGE);
    cr_assert_eq(h.failed, SYMM_ERR_TIMEOUT);
    cr_assert_eq(symm_vhost_failure(&h, &variant, "dispatch"), SYMM_ERR_TIMEOUT);
    cr_assert_str_eq(symm_last_error(), "bf16_rank_w2 dispatch (NCCL backend): an earlier call failed: "
                                        TIMEOUT_MESSAGE);
}

Test(variant_host, wait_times_out_and_leaves_it_to_the_caller_under_caller_sticky)
{
    symm_vhost h;
    symm_vhost_init(&h, "hybrid backend", SYMM_VHOST_CALLER_STICKY);
    fake.polls_until_ready = -1;
    cr_assert_eq(symm_vhost_wait(&h, &variant, &cu, NULL, true, "the count exchange (ncclAllGather)"),
                 SYMM_ERR_TIMEOUT);
    cr_assert_str_eq(symm_last_error(), TIMEOUT_MESSAGE);
    cr_assert_eq(h.failed, SYMM_OK, "the hybrid's caller decides");
    cr_assert_eq(symm_vhost_failure(&h, &variant, "dispatch"), SYMM_OK);
}

Test(variant_host, wait_gives_up_only_after_the_timeout)
{
    symm_vhost h;
    symm_vhost_init(&h, "NCCL backend", SYMM_VHOST_WAIT_STICKY);
    fake.polls_until_ready = -1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    symm_variant slow = variant;
    slow.timeout_ns = 30000000; /* 30 ms */
    cr_assert_eq(symm_vhost_wait(&h, &slow, &cu, NULL, true, "x"), SYMM_ERR_TIMEOUT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_assert(waited >= 0.03, "gave up after %g s, before the timeout of 0.03 s", waited);
    cr_assert(fake.stream_queries > 1, "polled %d times", fake.stream_queries);
}

Test(variant_host, a_failed_query_is_a_cuda_error_and_not_sticky)
{
    symm_vhost h;
    symm_vhost_init(&h, "NCCL backend", SYMM_VHOST_WAIT_STICKY);
    fake.query_error = CUDA_ERROR_ILLEGAL_ADDRESS;
    cr_assert_eq(symm_vhost_wait(&h, &variant, &cu, NULL, false, "the last call's work"), SYMM_ERR_CUDA);
    cr_assert(strncmp(symm_last_error(), "cuEventQuery: ", 14) == 0, "%s", symm_last_error());
    cr_assert_eq(h.failed, SYMM_OK);
}

/* --- the refusal of stream capture ------------------------------------------ */

static const char reason[] = "the NCCL backend cannot run inside CUDA graph capture (it needs the counts on the "
                             "host); use the native backend in graphs";

Test(variant_host, a_stream_not_capturing_is_accepted)
{
    fake.capture = CU_STREAM_CAPTURE_STATUS_NONE;
    cr_assert_eq(symm_vhost_refuse_capture(&variant, &cu, NULL, "dispatch", reason), SYMM_OK);
}

Test(variant_host, capture_is_refused_with_the_backends_reason)
{
    fake.capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    cr_assert_eq(symm_vhost_refuse_capture(&variant, &cu, NULL, "combine", reason), SYMM_ERR_STATE);
    cr_assert_str_eq(symm_last_error(), "bf16_rank_w2 combine: the NCCL backend cannot run inside CUDA graph "
                                        "capture (it needs the counts on the host); use the native backend in "
                                        "graphs");
    fake.capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    cr_assert_eq(symm_vhost_refuse_capture(&variant, &cu, NULL, "dispatch", reason), SYMM_ERR_STATE,
                 "an invalidated capture is still a capture");
}

Test(variant_host, a_failed_capture_query_is_a_cuda_error)
{
    fake.capture_error = CUDA_ERROR_INVALID_HANDLE;
    cr_assert_eq(symm_vhost_refuse_capture(&variant, &cu, NULL, "dispatch", reason), SYMM_ERR_CUDA);
    cr_assert(strstr(symm_last_error(), "cuStreamIsCapturing"), "%s", symm_last_error());
}

/* --- allocations and release --------------------------------------------- */

Test(variant_host, allocations_are_never_empty_and_name_the_backend)
{
    symm_vhost h;
    symm_vhost_init(&h, "hybrid backend", SYMM_VHOST_CALLER_STICKY);
    int32_t *pinned = NULL;
    CUdeviceptr dev = 0;
    cr_assert_eq(symm_vhost_host_alloc(&h, &cu, &pinned, 0), SYMM_OK);
    cr_assert_eq(fake.alloc_bytes, 16, "an empty buffer is 16 bytes, got %zu", fake.alloc_bytes);
    cr_assert_not_null(pinned);
    cr_assert_eq(symm_vhost_dev_alloc(&h, &cu, &dev, 1000), SYMM_OK);
    cr_assert_eq(fake.alloc_bytes, 1000);
    cr_assert_eq(dev, 0x1000);
    fake.alloc_result = CUDA_ERROR_OUT_OF_MEMORY;
    cr_assert_eq(symm_vhost_host_alloc(&h, &cu, &pinned, 64), SYMM_ERR_NOMEM);
    cr_assert(strncmp(symm_last_error(), "cuMemAllocHost (hybrid backend): ", 33) == 0, "%s", symm_last_error());
    symm_vhost_init(&h, "NCCL backend", SYMM_VHOST_WAIT_STICKY);
    cr_assert_eq(symm_vhost_dev_alloc(&h, &cu, &dev, 64), SYMM_ERR_NOMEM);
    cr_assert(strncmp(symm_last_error(), "cuMemAlloc (NCCL backend): ", 27) == 0, "%s", symm_last_error());
}

Test(variant_host, release_frees_what_was_allocated_and_the_event)
{
    symm_vhost h;
    symm_vhost_init(&h, "NCCL backend", SYMM_VHOST_WAIT_STICKY);
    h.done = (CUevent)0x77;
    char a, b;
    void *hosts[] = {&a, NULL, &b};
    const CUdeviceptr devs[] = {0, 0x2000, 0x3000, 0};
    symm_vhost_release(&h, &cu, hosts, 3, devs, 4);
    cr_assert_eq(fake.n_freed_hosts, 2);
    cr_assert(fake.freed_hosts[0] == &a && fake.freed_hosts[1] == &b);
    cr_assert_eq(fake.n_freed_devs, 2);
    cr_assert(fake.freed_devs[0] == 0x2000 && fake.freed_devs[1] == 0x3000);
    cr_assert_eq(fake.events_destroyed, 1);
    /* A second release (or one of a state never set up) frees nothing more. */
    symm_vhost_release(&h, &cu, NULL, 0, NULL, 0);
    cr_assert_eq(fake.events_destroyed, 1);
}

Test(variant_host, release_without_the_driver_touches_no_buffer)
{
    symm_vhost h;
    symm_vhost_init(&h, "NCCL backend", SYMM_VHOST_WAIT_STICKY);
    h.done = (CUevent)0x77;
    char a;
    void *hosts[] = {&a};
    const CUdeviceptr devs[] = {0x2000};
    symm_vhost_release(&h, NULL, hosts, 1, devs, 1);
    cr_assert_eq(fake.n_freed_hosts + fake.n_freed_devs + fake.events_destroyed, 0);
}

/* --- the grid ---------------------------------------------------------------- */

Test(variant_host, grid_has_one_block_at_least_and_4096_at_most)
{
    struct {
        int64_t items;
        int per_block;
        unsigned want;
    } cases[] = {
        {0, 8, 1},          {-5, 8, 1},        {1, 8, 1},          {8, 8, 1},
        {9, 8, 2},          {256, 256, 1},     {257, 256, 2},      {8 * 4095, 8, 4095},
        {8 * 4096, 8, 4096}, {8 * 4096 + 1, 8, 4096}, {INT64_MAX, 8, 4096}, {INT64_MAX, 1, 4096},
        {(int64_t)1 << 40, 256, 4096},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(symm_vhost_grid(cases[i].items, cases[i].per_block), cases[i].want,
                     "items %lld, %d a block: got %u blocks, want %u", (long long)cases[i].items,
                     cases[i].per_block, symm_vhost_grid(cases[i].items, cases[i].per_block), cases[i].want);
}
