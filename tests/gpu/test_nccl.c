/* test_nccl.c: NCCL communicators built on our bootstrap (symm_nccl.h), and
 * the resolved NCCL functions (nccl_api.h) the NCCL backend calls. One
 * binary is one rank: `symmrun -n N test_nccl --jobs 1`. NCCL refuses two
 * ranks on one GPU, so with more ranks than GPUs the NCCL tests skip and the
 * refusal itself is tested instead, unless symmrun ran the ranks with
 * --nccl-shared-gpu (symm_nccl.h: NCCL over loopback sockets), which runs
 * them. */
#include "heap_test.h"
#include "nccl_api.h"
#include "symm_nccl.h"

/* Value i of rank r: a multiple of 1/4 in [-250, 250], never 0, so that any
 * summation order gives the exact sum in float. */
static float value_of(unsigned long long seed, unsigned long long i)
{
    unsigned long long s = seed ^ (i * 0xD1B54A32D192ED03ull);
    long v = (long)(next_random(&s) % 2000) - 1000;
    return (float)(v >= 0 ? v + 1 : v) * 0.25f;
}

static float *values(unsigned long long seed, size_t count)
{
    float *v = malloc(count * sizeof *v);
    cr_assert(v != NULL, "rank %d: out of host memory", test_rank);
    for (size_t i = 0; i < count; i++)
        v[i] = value_of(seed, i);
    return v;
}

/* Skip (on every rank alike) when ranks share a GPU, unless symmrun made
 * each rank its own NCCL host. */
static bool skip_if_shared(rank_ctx *c)
{
    if (symm_device_gpu_count(c->dev) == c->ranks || symm_nccl_shared_gpu_mode())
        return false;
    printf("skipped: NCCL needs one GPU per rank (%d ranks on %d GPUs)\n", c->ranks,
           symm_device_gpu_count(c->dev));
    fflush(stdout);
    rank_end(c);
    return true;
}

Test(nccl, all_reduce_sums_every_ranks_values)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "allreduce");
    if (skip_if_shared(&c))
        cr_skip_test("NCCL needs one GPU per rank");
    int version = 0;
    EXPECT_OK(symm_nccl_version(&version));
    cr_assert(version >= 21300, "rank %d: NCCL version code %d, expected 2.13 or newer", c.rank,
              version);
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    cr_assert(nvls != NULL && strcmp(nvls, "0") == 0, "rank %d: NCCL_NVLS_ENABLE is %s once "
              "NCCL is loaded, expected 0 (NVLink multicast must stay off)", c.rank,
              nvls ? nvls : "unset");

    symm_nccl *comm;
    EXPECT_OK(symm_nccl_create(c.world, c.dev, &comm));
    const symm_nccl_api *nc;
    EXPECT_OK(symm_nccl_load(&nc));

    unsigned long long shared = shared_seed(c.world);
    size_t count = ((size_t)1 << 20) + random_between(&shared, 0, 4099);
    unsigned long long *seeds = calloc((size_t)c.ranks, sizeof *seeds), mine = fresh_seed();
    EXPECT_OK(symm_world_allgather(c.world, &mine, seeds, sizeof mine));
    float *in = values(mine, count), *want = calloc(count, sizeof *want);
    for (int r = 0; r < c.ranks; r++)
        for (size_t i = 0; i < count; i++)
            want[i] += value_of(seeds[r], i);

    CUdeviceptr send, recv;
    CUstream stream;
    CU_OK(cuMemAlloc(&send, count * sizeof(float)));
    CU_OK(cuMemAlloc(&recv, count * sizeof(float)));
    CU_OK(cuMemcpyHtoD(send, in, count * sizeof(float)));
    CU_OK(cuMemsetD32(recv, 0x7FC00000u, count)); /* NaN: never a correct sum */
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    ncclComm_t nccl_comm = symm_nccl_comm(comm);
    EXPECT_OK(symm_nccl_check(nc, nccl_comm,
                              nc->ncclAllReduce((void *)send, (void *)recv, count, ncclFloat,
                                                ncclSum, nccl_comm, stream),
                              "ncclAllReduce"));
    CU_OK(cuStreamSynchronize(stream));
    EXPECT_OK(symm_nccl_check_async(comm));

    float *got = malloc(count * sizeof *got);
    CU_OK(cuMemcpyDtoH(got, recv, count * sizeof(float)));
    for (size_t i = 0; i < count; i++)
        if (got[i] != want[i])
            cr_assert_fail("rank %d: element %zu of the sum over %d ranks is %g, expected %g "
                           "(this rank's value %g)", c.rank, i, c.ranks, got[i], want[i], in[i]);

    CU_OK(cuStreamDestroy(stream));
    CU_OK(cuMemFree(send));
    CU_OK(cuMemFree(recv));
    EXPECT_OK(symm_nccl_destroy(comm));
    free(got);
    free(want);
    free(in);
    free(seeds);
    rank_end(&c);
}

Test(nccl, send_recv_ring_delivers_the_left_neighbours_data)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "ring");
    if (skip_if_shared(&c))
        cr_skip_test("NCCL needs one GPU per rank");
    symm_nccl *comm;
    EXPECT_OK(symm_nccl_create(c.world, c.dev, &comm));
    const symm_nccl_api *nc;
    EXPECT_OK(symm_nccl_load(&nc));

    unsigned long long shared = shared_seed(c.world);
    size_t count = random_between(&shared, 1000, 3u << 20);
    unsigned long long *seeds = calloc((size_t)c.ranks, sizeof *seeds), mine = fresh_seed();
    EXPECT_OK(symm_world_allgather(c.world, &mine, seeds, sizeof mine));
    int right = (c.rank + 1) % c.ranks, left = (c.rank + c.ranks - 1) % c.ranks;
    float *in = values(mine, count), *want = values(seeds[left], count);

    CUdeviceptr send, recv;
    CUstream stream;
    CU_OK(cuMemAlloc(&send, count * sizeof(float)));
    CU_OK(cuMemAlloc(&recv, count * sizeof(float)));
    CU_OK(cuMemcpyHtoD(send, in, count * sizeof(float)));
    CU_OK(cuMemsetD32(recv, 0x7FC00000u, count));
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    ncclComm_t nccl_comm = symm_nccl_comm(comm);
    EXPECT_OK(symm_nccl_check(nc, nccl_comm, nc->ncclGroupStart(), "ncclGroupStart"));
    EXPECT_OK(symm_nccl_check(nc, nccl_comm,
                              nc->ncclSend((void *)send, count, ncclFloat, right, nccl_comm,
                                           stream), "ncclSend"));
    EXPECT_OK(symm_nccl_check(nc, nccl_comm,
                              nc->ncclRecv((void *)recv, count, ncclFloat, left, nccl_comm,
                                           stream), "ncclRecv"));
    EXPECT_OK(symm_nccl_check(nc, nccl_comm, nc->ncclGroupEnd(), "ncclGroupEnd"));
    CU_OK(cuStreamSynchronize(stream));
    EXPECT_OK(symm_nccl_check_async(comm));

    float *got = malloc(count * sizeof *got);
    CU_OK(cuMemcpyDtoH(got, recv, count * sizeof(float)));
    for (size_t i = 0; i < count; i++)
        if (got[i] != want[i])
            cr_assert_fail("rank %d: element %zu received from rank %d is %g, expected %g",
                           c.rank, i, left, got[i], want[i]);

    CU_OK(cuStreamDestroy(stream));
    CU_OK(cuMemFree(send));
    CU_OK(cuMemFree(recv));
    EXPECT_OK(symm_nccl_destroy(comm));
    free(got);
    free(want);
    free(in);
    free(seeds);
    rank_end(&c);
}

Test(nccl, create_refuses_ranks_sharing_a_gpu)
{
    SKIP_WITHOUT_GPU();
    rank_ctx c;
    rank_begin(&c, "shared");
    if (symm_device_gpu_count(c.dev) == c.ranks || symm_nccl_shared_gpu_mode()) {
        printf("skipped: NCCL is let share GPUs here (every rank has its own GPU, or symmrun "
               "--nccl-shared-gpu)\n");
        fflush(stdout);
        rank_end(&c);
        cr_skip_test("NCCL is let share GPUs here");
    }
    symm_nccl *comm = (symm_nccl *)&comm;
    symm_status st = symm_nccl_create(c.world, c.dev, &comm);
    cr_assert(st == SYMM_ERR_UNSUPPORTED && comm == NULL,
              "rank %d: %d ranks on %d GPUs: symm_nccl_create gave %s (%s), expected "
              "SYMM_ERR_UNSUPPORTED and no communicator", c.rank, c.ranks,
              symm_device_gpu_count(c.dev), symm_status_name(st), symm_last_error());
    cr_assert(strstr(symm_last_error(), "NCCL needs one GPU per rank") != NULL,
              "rank %d: the message should say why: %s", c.rank, symm_last_error());
    rank_end(&c);
}
