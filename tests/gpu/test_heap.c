/* test_heap.c: the symmetric heap on real GPUs (symm_heap.h). One binary is
 * one rank: run it as `symmrun -n N test_heap --jobs 1` (N = 2 and 4 on the
 * 2-GPU machine, so also with two ranks per GPU). Without a GPU every test
 * prints "skipped: no GPU" and skips.
 *
 * Data written into peers' memory comes from a kernel (kernels.cu, loaded as
 * PTX) that every rank runs with the peer pointers; each rank then checks on
 * the host what it received from every peer. Buffers are poisoned first, and
 * the pattern depends on a fresh per-rank seed, so stale data cannot pass. */
#include <stdint.h>

#include "heap_test.h"
#include "kernels_ptx.h"
#include "pattern.h"

#define MiB ((size_t)1 << 20)
#define POISON_BYTE 0xA5
#define POISON_WORD 0xA5A5A5A5u

typedef struct writer {
    CUmodule module;
    CUfunction fn;
} writer;

static void writer_load(writer *w)
{
    char log[4096] = "";
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *values[] = {log, (void *)(uintptr_t)sizeof log};
    CUresult r = cuModuleLoadDataEx(&w->module, kernels_ptx, 2, opts, values);
    const char *name = "?";
    if (r != CUDA_SUCCESS)
        cuGetErrorName(r, &name);
    cr_assert(r == CUDA_SUCCESS, "rank %d: cuModuleLoadDataEx(kernels_ptx): %s: %s", test_rank,
              name, log);
    CU_OK(cuModuleGetFunction(&w->fn, w->module, "write_peer_patterns"));
}

/* Every rank writes its pattern into its slot of every buffer of table
 * (device array of ranks pointers), and waits for its own kernel. */
static void writer_run(const writer *w, CUdeviceptr table, const rank_ctx *c,
                       unsigned long long slot_words, unsigned long long seed)
{
    int ranks = c->ranks, rank = c->rank;
    void *args[] = {&table, &ranks, &rank, &slot_words, &seed};
    CU_OK(cuLaunchKernel(w->fn, 132, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    CU_OK(cuCtxSynchronize());
}

static void gather_seeds(const rank_ctx *c, unsigned long long *seeds)
{
    unsigned long long mine = fresh_seed();
    EXPECT_OK(symm_world_allgather(c->world, &mine, seeds, sizeof mine));
}

static void *copy_out(CUdeviceptr p, size_t bytes)
{
    void *h = malloc(bytes);
    cr_assert(h != NULL, "rank %d: out of host memory (%zu bytes)", test_rank, bytes);
    CU_OK(cuMemcpyDtoH(h, p, bytes));
    return h;
}

static void poison_local(const rank_ctx *c, const symm_alloc *a)
{
    CU_OK(cuMemsetD8(symm_alloc_local(a), POISON_BYTE, symm_alloc_size(a)));
    CU_OK(cuCtxSynchronize());
    EXPECT_OK(symm_world_barrier(c->world));
}

/* This rank's buffer (total_words) must hold, in slot s, what rank s wrote,
 * and the poison past the last slot. */
static void expect_slots(const unsigned int *words, size_t total_words, const rank_ctx *c,
                         unsigned long long slot_words, const unsigned long long *seeds,
                         const char *via)
{
    for (int s = 0; s < c->ranks; s++) {
        const unsigned int *slot = words + (size_t)s * slot_words;
        for (unsigned long long i = 0; i < slot_words; i++) {
            unsigned int want = pattern_word(seeds[s], s, c->rank, i);
            if (slot[i] != want)
                cr_assert_fail("rank %d: word %llu of the slot rank %d wrote through %s is "
                               "0x%08x, expected 0x%08x%s (rank %d's seed 0x%llx)",
                               c->rank, i, s, via, slot[i], want,
                               slot[i] == POISON_WORD ? " (the poison: never written)" : "",
                               s, seeds[s]);
        }
    }
    for (size_t i = (size_t)c->ranks * slot_words; i < total_words; i++)
        if (words[i] != POISON_WORD)
            cr_assert_fail("rank %d: word %zu, past every rank's slot (%llu words each), is "
                           "0x%08x: a write went out of bounds (expected the poison 0x%08x)",
                           c->rank, i, slot_words, words[i], POISON_WORD);
}

static void expect_rounded(const symm_alloc *a, const symm_device *dev, size_t requested)
{
    size_t size = symm_alloc_size(a), g = symm_device_granularity(dev);
    cr_assert(symm_alloc_requested(a) == requested, "rank %d: requested size %zu, expected %zu",
              test_rank, symm_alloc_requested(a), requested);
    cr_assert(g > 0 && size % g == 0 && size >= requested && size - requested < g,
              "rank %d: %zu bytes were rounded to %zu, expected the next multiple of the "
              "granularity %zu", test_rank, requested, size, g);
}

Test(heap, device_open_reports_the_ranks_gpu)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "device");
    int count = 0;
    CU_OK(cuDeviceGetCount(&count));
    int want = symm_world_device(c.world) >= 0 ? symm_world_device(c.world)
                                                : symm_world_local_rank(c.world);
    cr_assert(symm_device_ordinal(c.dev) == want % count,
              "rank %d: device ordinal %d, expected %d (%d modulo %d devices)", c.rank,
              symm_device_ordinal(c.dev), want % count, want, count);
    CUdevice d;
    CU_OK(cuDeviceGet(&d, symm_device_ordinal(c.dev)));
    cr_assert(symm_device_handle(c.dev) == d, "rank %d: CUdevice %d, expected %d", c.rank,
              (int)symm_device_handle(c.dev), (int)d);
    CUcontext current = NULL;
    CU_OK(cuCtxGetCurrent(&current));
    cr_assert(current != NULL && current == symm_device_context(c.dev),
              "rank %d: the device's context is not current after symm_device_open", c.rank);

    int sms = 0, major = 0, minor = 0;
    CU_OK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d));
    CU_OK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d));
    CU_OK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d));
    cr_assert(symm_device_sm_count(c.dev) == sms && symm_device_cc_major(c.dev) == major &&
              symm_device_cc_minor(c.dev) == minor,
              "rank %d: device reports %d SMs, sm_%d%d; the driver says %d SMs, sm_%d%d", c.rank,
              symm_device_sm_count(c.dev), symm_device_cc_major(c.dev),
              symm_device_cc_minor(c.dev), sms, major, minor);

    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = symm_device_ordinal(c.dev);
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t minimum = 0, recommended = 0, g = symm_device_granularity(c.dev);
    CU_OK(cuMemGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CU_OK(cuMemGetAllocationGranularity(&recommended, &prop,
                                        CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    cr_assert(g > 0 && g % minimum == 0 && g % recommended == 0,
              "rank %d: granularity %zu, expected a multiple of the minimum %zu and the "
              "recommended %zu", c.rank, g, minimum, recommended);

    /* Which ranks share a GPU, worked out here from the UUIDs. */
    CUuuid mine, *all = calloc((size_t)c.ranks, sizeof *all);
    CU_OK(cuDeviceGetUuid(&mine, d));
    EXPECT_OK(symm_world_allgather(c.world, &mine, all, sizeof mine));
    int distinct = 0;
    for (int r = 0; r < c.ranks; r++) {
        int first = r;
        for (int q = 0; q < r && first == r; q++)
            if (memcmp(all[q].bytes, all[r].bytes, sizeof all[r].bytes) == 0)
                first = q;
        if (first == r)
            distinct++;
        cr_assert(symm_device_gpu_index(c.dev, r) == symm_device_gpu_index(c.dev, first),
                  "rank %d: ranks %d and %d share a GPU but got GPU indices %d and %d", c.rank,
                  first, r, symm_device_gpu_index(c.dev, first), symm_device_gpu_index(c.dev, r));
        if (first == r)
            for (int q = 0; q < r; q++)
                cr_assert(symm_device_gpu_index(c.dev, q) != symm_device_gpu_index(c.dev, r),
                          "rank %d: ranks %d and %d are on different GPUs but share index %d",
                          c.rank, q, r, symm_device_gpu_index(c.dev, r));
    }
    cr_assert(symm_device_gpu_count(c.dev) == distinct, "rank %d: %d distinct GPUs, expected %d",
              c.rank, symm_device_gpu_count(c.dev), distinct);
    cr_assert(symm_device_gpu_index(c.dev, c.ranks) == -1 && symm_device_gpu_index(c.dev, -1) == -1,
              "rank %d: a rank outside the world must have GPU index -1", c.rank);
    free(all);
    rank_end(&c);
}

Test(heap, fresh_allocation_reads_zero_through_every_mapping)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "zero");
    unsigned long long seed = shared_seed(c.world);
    size_t requested = random_between(&seed, MiB, 8 * MiB);

    /* Leave garbage behind in memory the next allocation may well reuse. */
    symm_alloc *a;
    EXPECT_OK(symm_alloc_create(c.world, c.dev, requested, 0, &a));
    CU_OK(cuMemsetD8(symm_alloc_local(a), 0x5A, symm_alloc_size(a)));
    EXPECT_OK(symm_alloc_destroy(a));

    EXPECT_OK(symm_alloc_create(c.world, c.dev, requested, 0, &a));
    expect_rounded(a, c.dev, requested);
    for (int r = 0; r < c.ranks; r++) {
        unsigned char *bytes = copy_out(symm_alloc_peer(a, r), symm_alloc_size(a));
        for (size_t i = 0; i < symm_alloc_size(a); i++)
            if (bytes[i] != 0)
                cr_assert_fail("rank %d: byte %zu of rank %d's fresh buffer is 0x%02x, "
                               "expected 0 (symm_alloc_create must zero it before returning)",
                               c.rank, i, r, bytes[i]);
        free(bytes);
    }
    EXPECT_OK(symm_alloc_destroy(a));
    rank_end(&c);
}

Test(heap, peer_pointers_carry_every_ranks_pattern)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "peers");
    unsigned long long seed = shared_seed(c.world);
    unsigned long long *seeds = calloc((size_t)c.ranks, sizeof *seeds);
    gather_seeds(&c, seeds);
    size_t requested = random_between(&seed, (size_t)c.ranks * 4096, 12 * MiB);
    writer w;
    writer_load(&w);

    symm_alloc *a;
    EXPECT_OK(symm_alloc_create(c.world, c.dev, requested, 0, &a));
    expect_rounded(a, c.dev, requested);
    cr_assert(symm_alloc_peer(a, c.rank) == symm_alloc_local(a) && symm_alloc_local(a) != 0,
              "rank %d: the own peer pointer must be the local mapping", c.rank);
    cr_assert(symm_alloc_peer(a, -1) == 0 && symm_alloc_peer(a, c.ranks) == 0,
              "rank %d: peer pointers outside the world must be 0", c.rank);
    cr_assert(symm_alloc_view(a) == 0 && symm_alloc_stride(a) == 0,
              "rank %d: no contiguous view was asked for", c.rank);
    unsigned long long *table = copy_out(symm_alloc_peer_table(a), c.ranks * sizeof *table);
    for (int r = 0; r < c.ranks; r++)
        cr_assert(table[r] == symm_alloc_peer(a, r),
                  "rank %d: device peer table[%d] = 0x%llx, symm_alloc_peer = 0x%llx", c.rank,
                  r, table[r], (unsigned long long)symm_alloc_peer(a, r));
    free(table);

    poison_local(&c, a);
    unsigned long long slot_words = requested / 4 / (size_t)c.ranks;
    writer_run(&w, symm_alloc_peer_table(a), &c, slot_words, seeds[c.rank]);
    EXPECT_OK(symm_world_barrier(c.world));
    unsigned int *words = copy_out(symm_alloc_local(a), symm_alloc_size(a));
    expect_slots(words, symm_alloc_size(a) / 4, &c, slot_words, seeds, "its peer pointer");
    free(words);

    EXPECT_OK(symm_alloc_destroy(a));
    CU_OK(cuModuleUnload(w.module));
    free(seeds);
    rank_end(&c);
}

Test(heap, contiguous_view_aliases_every_ranks_buffer)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "view");
    unsigned long long seed = shared_seed(c.world);
    unsigned long long *seeds = calloc((size_t)c.ranks, sizeof *seeds);
    gather_seeds(&c, seeds);
    size_t requested = random_between(&seed, (size_t)c.ranks * 4096, 6 * MiB);
    writer w;
    writer_load(&w);

    symm_alloc *a;
    EXPECT_OK(symm_alloc_create(c.world, c.dev, requested, SYMM_ALLOC_CONTIGUOUS, &a));
    expect_rounded(a, c.dev, requested);
    CUdeviceptr view = symm_alloc_view(a);
    size_t stride = symm_alloc_stride(a);
    cr_assert(view != 0 && stride == symm_alloc_size(a),
              "rank %d: view 0x%llx stride %zu, expected a view with stride %zu", c.rank,
              (unsigned long long)view, stride, symm_alloc_size(a));

    /* Write through the view: slot r of it must be rank r's buffer. */
    poison_local(&c, a);
    unsigned long long *slots = calloc((size_t)c.ranks, sizeof *slots);
    for (int r = 0; r < c.ranks; r++)
        slots[r] = view + (CUdeviceptr)r * stride;
    CUdeviceptr table;
    CU_OK(cuMemAlloc(&table, c.ranks * sizeof *slots));
    CU_OK(cuMemcpyHtoD(table, slots, c.ranks * sizeof *slots));
    unsigned long long slot_words = requested / 4 / (size_t)c.ranks;
    writer_run(&w, table, &c, slot_words, seeds[c.rank]);
    EXPECT_OK(symm_world_barrier(c.world));
    unsigned int *words = copy_out(symm_alloc_local(a), symm_alloc_size(a));
    expect_slots(words, symm_alloc_size(a) / 4, &c, slot_words, seeds, "the contiguous view");
    free(words);

    /* And read back: the same bytes through view + r * stride and peer r. */
    for (int r = 0; r < c.ranks; r++) {
        unsigned char *through_view = copy_out(slots[r], stride);
        unsigned char *through_peer = copy_out(symm_alloc_peer(a, r), stride);
        for (size_t i = 0; i < stride; i++)
            if (through_view[i] != through_peer[i])
                cr_assert_fail("rank %d: byte %zu of rank %d's buffer reads 0x%02x through the "
                               "view but 0x%02x through the peer pointer", c.rank, i, r,
                               through_view[i], through_peer[i]);
        free(through_view);
        free(through_peer);
    }
    EXPECT_OK(symm_world_barrier(c.world));
    CU_OK(cuMemFree(table));
    EXPECT_OK(symm_alloc_destroy(a));
    CU_OK(cuModuleUnload(w.module));
    free(slots);
    free(seeds);
    rank_end(&c);
}

static bool is_mapped(CUdeviceptr p)
{
    CUdeviceptr base;
    size_t size;
    return cuMemGetAddressRange(&base, &size, p) == CUDA_SUCCESS;
}

/* Free device memory once every rank sharing this GPU is at the same point. */
static size_t free_memory_together(const rank_ctx *c)
{
    EXPECT_OK(symm_world_barrier(c->world));
    size_t free_bytes = 0, total = 0;
    CU_OK(cuMemGetInfo(&free_bytes, &total));
    EXPECT_OK(symm_world_barrier(c->world));
    return free_bytes;
}

/* A leak of even one granule per cycle would be gigabytes here. Free memory
 * is compared as "nothing lost" rather than equal: another process (a rank of
 * the previous test, still exiting) may only give memory back meanwhile. */
Test(heap, thousand_alloc_free_cycles_leave_nothing_behind)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "cycles");
    unsigned long long seed = shared_seed(c.world), first_seed = seed;

    /* The driver sets up its own bookkeeping at the first allocation. */
    symm_alloc *a;
    EXPECT_OK(symm_alloc_create(c.world, c.dev, 64 * MiB, SYMM_ALLOC_CONTIGUOUS, &a));
    EXPECT_OK(symm_alloc_destroy(a));
    int fds_before = open_fd_count();
    size_t free_before = free_memory_together(&c);

    for (int cycle = 0; cycle < 1000; cycle++) {
        /* 1 byte .. 64 MiB, log-uniform, the same on every rank. */
        size_t limit = (size_t)1 << random_between(&seed, 0, 26);
        size_t bytes = random_between(&seed, 1, limit);
        unsigned flags = next_random(&seed) & 1 ? SYMM_ALLOC_CONTIGUOUS : 0;
        symm_status st = symm_alloc_create(c.world, c.dev, bytes, flags, &a);
        cr_assert(st == SYMM_OK, "rank %d: cycle %d (seed 0x%llx): symm_alloc_create(%zu, 0x%x): "
                  "%s: %s", c.rank, cycle, first_seed, bytes, flags, symm_status_name(st),
                  symm_last_error());
        CUdeviceptr local = symm_alloc_local(a), view = symm_alloc_view(a);
        CUdeviceptr peer = symm_alloc_peer(a, (c.rank + 1) % c.ranks);
        cr_assert(is_mapped(local) && is_mapped(peer) && (!view || is_mapped(view)),
                  "rank %d: cycle %d: a fresh allocation's pointers are not mapped", c.rank, cycle);
        EXPECT_OK(symm_alloc_destroy(a));
        cr_assert(!is_mapped(local) && !is_mapped(peer) && (!view || !is_mapped(view)),
                  "rank %d: cycle %d (%zu bytes, flags 0x%x): still mapped or reserved after "
                  "destroy: local %d, peer %d, view %d", c.rank, cycle, bytes, flags,
                  is_mapped(local), is_mapped(peer), view && is_mapped(view));
    }

    size_t free_after = free_memory_together(&c);
    int fds_after = open_fd_count();
    cr_assert(fds_after == fds_before, "rank %d: %d descriptors open before 1000 cycles, %d after",
              c.rank, fds_before, fds_after);
    cr_assert(free_after >= free_before, "rank %d: 1000 cycles (seed 0x%llx) lost %zu bytes of "
              "device memory (%zu free before, %zu after)", c.rank, first_seed,
              free_before - free_after, free_before, free_after);
    rank_end(&c);
}

Test(heap, mismatched_sizes_fail_on_every_rank_naming_both)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "mismatch");
    unsigned long long seed = shared_seed(c.world);
    size_t base = random_between(&seed, MiB, 4 * MiB);
    int fds_before = open_fd_count();

    symm_alloc *a = (symm_alloc *)&a;
    symm_status st = symm_alloc_create(c.world, c.dev, base + (size_t)c.rank * 4096, 0, &a);
    const char *msg = symm_last_error();
    char rank0[96], rank1[96];
    snprintf(rank0, sizeof rank0, "rank 0 asked for %zu bytes", base);
    snprintf(rank1, sizeof rank1, "rank 1 for %zu bytes", base + 4096);
    cr_assert(st == SYMM_ERR_MISMATCH && a == NULL,
              "rank %d: sizes differing by rank gave %s (%s), expected SYMM_ERR_MISMATCH and no "
              "allocation", c.rank, symm_status_name(st), msg);
    cr_assert(strstr(msg, rank0) && strstr(msg, rank1),
              "rank %d: the message must name both ranks and sizes (\"%s\", \"%s\"): %s", c.rank,
              rank0, rank1, msg);
    cr_assert(open_fd_count() == fds_before, "rank %d: a refused allocation left %d descriptors "
              "open", c.rank, open_fd_count() - fds_before);

    /* The next allocation is in step again on every rank and works. */
    EXPECT_OK(symm_alloc_create(c.world, c.dev, base, 0, &a));
    expect_rounded(a, c.dev, base);
    unsigned int mark = (unsigned int)fresh_seed() | 1, *marks = calloc((size_t)c.ranks, 4);
    EXPECT_OK(symm_world_allgather(c.world, &mark, marks, sizeof mark));
    CU_OK(cuMemsetD32(symm_alloc_local(a), mark, symm_alloc_size(a) / 4));
    CU_OK(cuCtxSynchronize());
    EXPECT_OK(symm_world_barrier(c.world));
    for (int r = 0; r < c.ranks; r++) {
        unsigned int last;
        CU_OK(cuMemcpyDtoH(&last, symm_alloc_peer(a, r) + symm_alloc_size(a) - 4, 4));
        cr_assert(last == marks[r], "rank %d: the last word of rank %d's buffer is 0x%08x, "
                  "expected 0x%08x", c.rank, r, last, marks[r]);
    }
    free(marks);
    EXPECT_OK(symm_alloc_destroy(a));
    rank_end(&c);
}

/* A bad size or flag on one rank fails every rank at once, naming it (not
 * after the world's timeout on the ranks that called correctly). */
Test(heap, bad_argument_on_one_rank_fails_every_rank_at_once_naming_it)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "bad-arg");
    unsigned long long seed = shared_seed(c.world);
    const size_t base = random_between(&seed, MiB, 4 * MiB);
    const int bad = (int)(seed % (unsigned long long)c.ranks);
    const unsigned bad_flags = 0x100u << (seed % 8);
    int fds_before = open_fd_count();
    for (int round = 0; round < 2; round++) {
        const bool mine = c.rank == bad;
        symm_alloc *a = (symm_alloc *)&a;
        const double t0 = now_s();
        symm_status st = round == 0 ? symm_alloc_create(c.world, c.dev, mine ? 0 : base, 0, &a)
                                    : symm_alloc_create(c.world, c.dev, base, mine ? bad_flags : 0, &a);
        const double took = now_s() - t0;
        char want[96];
        if (round == 0)
            snprintf(want, sizeof want, "rank %d passed bytes 0 (expected > 0)", bad);
        else
            snprintf(want, sizeof want, "rank %d passed flags 0x%x: unknown bits", bad, bad_flags);
        cr_assert(st == SYMM_ERR_INVALID_ARG && a == NULL && strstr(symm_last_error(), want),
                  "rank %d: round %d: got %s (%s), expected SYMM_ERR_INVALID_ARG with \"%s\" and no allocation",
                  c.rank, round, symm_status_name(st), symm_last_error(), want);
        cr_assert(took < 2.0, "rank %d: round %d: the refusal took %.2f s, expected at once", c.rank, round, took);
    }
    cr_assert(open_fd_count() == fds_before, "rank %d: refused allocations left %d descriptors open", c.rank,
              open_fd_count() - fds_before);
    /* In step again: the next allocation works on every rank. */
    symm_alloc *a;
    EXPECT_OK(symm_alloc_create(c.world, c.dev, base, 0, &a));
    expect_rounded(a, c.dev, base);
    EXPECT_OK(symm_alloc_destroy(a));
    rank_end(&c);
}

Test(heap, failed_create_releases_everything_and_a_retry_works)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "oom");
    /* Twice the GPU's memory: cuMemCreate fails on every rank. */
    size_t free_bytes, total;
    CU_OK(cuMemGetInfo(&free_bytes, &total));
    size_t huge = 2 * total + 12345;
    EXPECT_OK(symm_world_bcast(c.world, &huge, sizeof huge, 0));
    int fds_before = open_fd_count();
    size_t free_before = free_memory_together(&c);

    symm_alloc *a = (symm_alloc *)&a;
    symm_status st = symm_alloc_create(c.world, c.dev, huge, SYMM_ALLOC_CONTIGUOUS, &a);
    cr_assert(st != SYMM_OK && a == NULL, "rank %d: allocating %zu bytes on a %zu-byte GPU "
              "gave %s, expected a failure and no allocation", c.rank, huge, total,
              symm_status_name(st));
    cr_assert(strstr(symm_last_error(), "cuMemCreate") != NULL,
              "rank %d: %s: the message should name the failing cuMemCreate: %s", c.rank,
              symm_status_name(st), symm_last_error());

    size_t free_after = free_memory_together(&c);
    cr_assert(open_fd_count() == fds_before && free_after >= free_before,
              "rank %d: a failed create left %d descriptors and %zd bytes of device memory "
              "behind", c.rank, open_fd_count() - fds_before,
              (ssize_t)(free_before - free_after));

    unsigned long long seed = shared_seed(c.world);
    size_t bytes = random_between(&seed, 1, 8 * MiB);
    EXPECT_OK(symm_alloc_create(c.world, c.dev, bytes, SYMM_ALLOC_CONTIGUOUS, &a));
    expect_rounded(a, c.dev, bytes);
    EXPECT_OK(symm_alloc_destroy(a));
    rank_end(&c);
}

static void expect_found(CUdeviceptr p, size_t bytes, const symm_alloc *owner, size_t offset)
{
    symm_alloc *got = NULL;
    size_t off = 0;
    symm_status st = symm_alloc_find(p, bytes, &got, &off);
    cr_assert(st == SYMM_OK && got == owner && off == offset,
              "rank %d: symm_alloc_find(0x%llx, %zu): %s (%s), owner %p offset %zu; expected "
              "owner %p offset %zu", test_rank, (unsigned long long)p, bytes,
              symm_status_name(st), symm_last_error(), (void *)got, off, (const void *)owner,
              offset);
}

static void expect_refused(CUdeviceptr p, size_t bytes, const char *why, const char *words)
{
    symm_alloc *got = (symm_alloc *)&got;
    size_t off = 1;
    symm_status st = symm_alloc_find(p, bytes, &got, &off);
    cr_assert(st == SYMM_ERR_INVALID_ARG && got == NULL,
              "rank %d: symm_alloc_find(0x%llx, %zu) %s: got %s, owner %p; expected "
              "SYMM_ERR_INVALID_ARG and no owner", test_rank, (unsigned long long)p, bytes, why,
              symm_status_name(st), (void *)got);
    cr_assert(strstr(symm_last_error(), words) != NULL,
              "rank %d: symm_alloc_find %s: the message should say \"%s\": %s", test_rank, why,
              words, symm_last_error());
}

Test(heap, find_locates_local_pointers_and_refuses_others)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "find");
    unsigned long long seed = shared_seed(c.world);
    symm_alloc *allocs[2];
    for (int i = 0; i < 2; i++)
        EXPECT_OK(symm_alloc_create(c.world, c.dev, random_between(&seed, 1, 6 * MiB), 0,
                                    &allocs[i]));

    for (int trial = 0; trial < 200; trial++) {
        const symm_alloc *a = allocs[trial & 1];
        size_t size = symm_alloc_size(a);
        size_t off = random_between(&seed, 0, size - 1);
        size_t len = random_between(&seed, 1, size - off);
        expect_found(symm_alloc_local(a) + off, len, a, off);
    }
    for (int i = 0; i < 2; i++) {
        const symm_alloc *a = allocs[i];
        size_t size = symm_alloc_size(a);
        expect_found(symm_alloc_local(a), size, a, 0);
        size_t inside = random_between(&seed, 1, 4096);
        expect_found(symm_alloc_local(a) + size - inside, inside, a, size - inside);
        expect_refused(symm_alloc_local(a) + size - inside, inside + 1, "one byte past the end",
                       "past the end");
        /* The end is outside a, unless the other allocation happens to start there. */
        const symm_alloc *other = allocs[1 - i];
        CUdeviceptr end = symm_alloc_local(a) + size;
        if (end - symm_alloc_local(other) >= symm_alloc_size(other))
            expect_refused(end, 1, "at the end", "not inside");
        else
            expect_found(end, 1, other, (size_t)(end - symm_alloc_local(other)));
        expect_refused(symm_alloc_local(a) + size - inside, inside + random_between(&seed, 1, 4096),
                       "straddling the end", "past the end");
        expect_refused(symm_alloc_local(a) + size - inside, SIZE_MAX, "with SIZE_MAX bytes",
                       "past the end");
    }

    CUdeviceptr plain;
    CU_OK(cuMemAlloc(&plain, 4096));
    expect_refused(plain, 16, "on ordinary device memory", "not inside");
    CU_OK(cuMemFree(plain));
    if (c.ranks > 1)
        expect_refused(symm_alloc_peer(allocs[0], (c.rank + 1) % c.ranks), 16,
                       "on a peer's mapping", "not inside");

    CUdeviceptr gone = symm_alloc_local(allocs[0]) + random_between(&seed, 0, 4095);
    EXPECT_OK(symm_alloc_destroy(allocs[0]));
    expect_refused(gone, 1, "after the allocation was destroyed", "not inside");
    expect_found(symm_alloc_local(allocs[1]) + 8, 8, allocs[1], 8);
    EXPECT_OK(symm_alloc_destroy(allocs[1]));
    rank_end(&c);
}

Test(heap, device_close_is_refused_while_allocations_live)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "close");
    unsigned long long seed = shared_seed(c.world);
    symm_alloc *a;
    EXPECT_OK(symm_alloc_create(c.world, c.dev, random_between(&seed, 1, 4 * MiB), 0, &a));
    symm_status st = symm_device_close(c.dev);
    cr_assert(st == SYMM_ERR_STATE && strstr(symm_last_error(), "still live"),
              "rank %d: closing a device with a live allocation gave %s (%s), expected "
              "SYMM_ERR_STATE", c.rank, symm_status_name(st), symm_last_error());
    /* The device is untouched: the allocation still works and goes. */
    CU_OK(cuMemsetD8(symm_alloc_local(a), 0x11, symm_alloc_size(a)));
    CU_OK(cuCtxSynchronize());
    EXPECT_OK(symm_alloc_destroy(a));
    rank_end(&c);
}
