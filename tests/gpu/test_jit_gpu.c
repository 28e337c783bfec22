/* test_jit_gpu.c: the JIT on a GPU: a compiled kernel loads, launches and
 * writes what it should, from a cold compile and from a cache hit; the
 * architecture rule matches the device; load errors name what went wrong.
 * Without a GPU every test prints "skipped: no GPU" and is skipped. */
#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "cuda_api.h"
#include "symm_jit.h"

static char cache_dir[256];
static uint64_t rng_state;
static const symm_cuda_api *cu;
static CUdevice device;
static CUcontext context;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void teardown(void)
{
    if (context)
        cu->cuDevicePrimaryCtxRelease(device);
    context = NULL;
    nftw(cache_dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh cache directory, and device 0's primary context made current; or
 * "skipped: no GPU" when there is no driver or no device. */
static void setup(void)
{
    if (getrandom(&rng_state, sizeof rng_state, 0) != sizeof rng_state || !rng_state)
        rng_state = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull + 1;
    unsetenv("SYMM_CACHE_DIR");
    unsetenv("SYMM_JIT_CACHE");
    unsetenv("SYMM_JIT_DUMP");
    strcpy(cache_dir, "/tmp/symm-test-jit-gpu-XXXXXX");
    cr_assert(mkdtemp(cache_dir), "mkdtemp: %s", strerror(errno));
    int count = 0;
    if (symm_cuda(&cu) != SYMM_OK || cu->cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 1 ||
        cu->cuDeviceGet(&device, 0) != CUDA_SUCCESS) {
        printf("skipped: no GPU (%s)\n", symm_last_error());
        fflush(stdout);
        teardown(); /* a skipped test does not run .fini */
        cr_skip_test("skipped: no GPU");
    }
    cr_assert(cu->cuDevicePrimaryCtxRetain(&context, device) == CUDA_SUCCESS);
    cr_assert(cu->cuCtxSetCurrent(context) == CUDA_SUCCESS);
}

TestSuite(jit_gpu, .init = setup, .fini = teardown, .timeout = 120);

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The pattern the kernel writes; the salt makes each run's source new. */
static uint32_t pattern(uint64_t i, uint32_t seed)
{
    uint32_t x = (uint32_t)i * 0x9e3779b9u ^ seed;
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

static char *pattern_source(uint32_t salt)
{
    char *src;
    cr_assert(asprintf(&src,
                       "// salt 0x%08x\n"
                       "extern \"C\" __global__ void pattern(unsigned *out, unsigned long long n,\n"
                       "                                     unsigned seed)\n"
                       "{\n"
                       "    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x\n"
                       "             + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {\n"
                       "        unsigned x = (unsigned)i * 0x9e3779b9u ^ seed;\n"
                       "        x ^= x >> 16;\n"
                       "        x *= 0x85ebca6bu;\n"
                       "        x ^= x >> 13;\n"
                       "        x *= 0xc2b2ae35u;\n"
                       "        x ^= x >> 16;\n"
                       "        out[i] = x;\n"
                       "    }\n"
                       "}\n",
                       salt) > 0);
    return src;
}

static symm_jit_request request(const char *src, const char *arch)
{
    symm_jit_request req = {.source = src, .source_name = "pattern.cu", .arch = arch,
                            .cache_dir = cache_dir};
    return req;
}

static void device_arch(char *arch, size_t n)
{
    cr_assert_eq(symm_jit_device_arch(device, arch, n), SYMM_OK, "%s", symm_last_error());
}

/* Load res's cubin, launch pattern over a random size with a random seed,
 * and compare every element; returns the load time in ms. */
static double load_launch_check(const symm_jit_result *res)
{
    CUmodule mod;
    CUfunction fn;
    double start = now_ms();
    symm_status st = symm_jit_load(res->cubin, res->cubin_size, &mod);
    double load_ms = now_ms() - start;
    cr_assert_eq(st, SYMM_OK, "symm_jit_load: %s", symm_last_error());
    cr_assert_eq(symm_jit_get_function(mod, "pattern", &fn), SYMM_OK, "%s", symm_last_error());
    unsigned long long n = (1u << 20) + rnd() % (1u << 20);
    unsigned seed = (unsigned)rnd();
    CUdeviceptr out;
    cr_assert(cu->cuMemAlloc(&out, n * 4) == CUDA_SUCCESS);
    cr_assert(cu->cuMemsetD32(out, ~pattern(0, seed), n) == CUDA_SUCCESS);
    void *args[] = {&out, &n, &seed};
    CUresult r = cu->cuLaunchKernel(fn, 264, 1, 1, 256, 1, 1, 0, NULL, args, NULL);
    const char *name = "?";
    cu->cuGetErrorName(r, &name);
    cr_assert(r == CUDA_SUCCESS, "cuLaunchKernel: %s", name);
    r = cu->cuCtxSynchronize();
    cu->cuGetErrorName(r, &name);
    cr_assert(r == CUDA_SUCCESS, "the kernel failed: %s (n %llu, arch of the cubin: see above)", name, n);
    uint32_t *host = malloc(n * 4);
    cr_assert(cu->cuMemcpyDtoH(host, out, n * 4) == CUDA_SUCCESS);
    for (unsigned long long i = 0; i < n; i++)
        if (host[i] != pattern(i, seed))
            cr_assert_fail("element %llu of %llu: got 0x%08x, expected 0x%08x (seed 0x%08x)", i,
                           n, host[i], pattern(i, seed), seed);
    free(host);
    cu->cuMemFree(out);
    cr_assert_eq(symm_jit_unload(mod), SYMM_OK, "%s", symm_last_error());
    return load_ms;
}

Test(jit_gpu, cold_compile_and_cache_hit_both_load_and_run_correctly)
{
    char arch[16];
    device_arch(arch, sizeof arch);
    char *src = pattern_source((uint32_t)rnd());
    symm_jit_request req = request(src, arch);
    symm_jit_result cold, warm;
    cr_assert_eq(symm_jit_compile(&req, &cold), SYMM_OK, "%s", symm_last_error());
    cr_assert(!cold.cache_hit, "fresh cache directory gave a hit");
    double cold_load = load_launch_check(&cold);
    cr_assert_eq(symm_jit_compile(&req, &warm), SYMM_OK, "%s", symm_last_error());
    cr_assert(warm.cache_hit, "second compile missed the cache");
    cr_assert(warm.cubin_size == cold.cubin_size && !memcmp(warm.cubin, cold.cubin,
                                                            cold.cubin_size));
    double warm_load = load_launch_check(&warm);
    printf("jit_gpu: %s, cubin %zu bytes: cold compile %.1f ms (NVRTC %.1f ms), "
           "cache hit %.3f ms; load %.2f / %.2f ms\n",
           arch, cold.cubin_size, cold.total_ms, cold.compile_ms, warm.total_ms, cold_load,
           warm_load);
    fflush(stdout);
    symm_jit_result_free(&cold);
    symm_jit_result_free(&warm);
    free(src);
}

Test(jit_gpu, device_arch_follows_the_compute_capability)
{
    int major, minor;
    char arch[16], want[16];
    cr_assert(cu->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                       device) == CUDA_SUCCESS);
    cr_assert(cu->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                       device) == CUDA_SUCCESS);
    device_arch(arch, sizeof arch);
    cr_assert_eq(symm_jit_arch_for(major, minor, want, sizeof want), SYMM_OK);
    cr_assert_str_eq(arch, want, "compute capability %d.%d", major, minor);
    if (major == 9 && minor == 0)
        cr_assert_str_eq(arch, "sm_90a", "Hopper");
    cr_assert_eq(symm_jit_device_arch(device, arch, 4), SYMM_ERR_INVALID_ARG);
}

Test(jit_gpu, cubin_for_another_architecture_is_refused_with_a_hint)
{
    int major;
    cr_assert(cu->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                       device) == CUDA_SUCCESS);
    char *src = pattern_source((uint32_t)rnd());
    symm_jit_request req = request(src, major >= 8 ? "sm_75" : "sm_90a");
    symm_jit_result res;
    cr_assert_eq(symm_jit_compile(&req, &res), SYMM_OK, "%s", symm_last_error());
    CUmodule mod = (CUmodule)(uintptr_t)1;
    symm_status st = symm_jit_load(res.cubin, res.cubin_size, &mod);
    cr_assert_eq(st, SYMM_ERR_CUDA, "a %s cubin loaded: %s", req.arch, symm_status_name(st));
    cr_assert(mod == NULL && strstr(symm_last_error(), "symm_jit_load") &&
                  strstr(symm_last_error(), "another GPU architecture"),
              "message \"%s\"", symm_last_error());
    symm_jit_result_free(&res);
    free(src);
}

Test(jit_gpu, missing_kernel_is_named)
{
    char arch[16];
    device_arch(arch, sizeof arch);
    char *src = pattern_source((uint32_t)rnd());
    symm_jit_request req = request(src, arch);
    symm_jit_result res;
    cr_assert_eq(symm_jit_compile(&req, &res), SYMM_OK, "%s", symm_last_error());
    CUmodule mod;
    CUfunction fn;
    cr_assert_eq(symm_jit_load(res.cubin, res.cubin_size, &mod), SYMM_OK, "%s",
                 symm_last_error());
    char name[32];
    snprintf(name, sizeof name, "no_kernel_%u", (unsigned)(rnd() % 1000));
    cr_assert_eq(symm_jit_get_function(mod, name, &fn), SYMM_ERR_INVALID_ARG);
    cr_assert(strstr(symm_last_error(), name), "message \"%s\"", symm_last_error());
    cr_assert_eq(symm_jit_unload(mod), SYMM_OK);
    symm_jit_result_free(&res);
    free(src);
}

typedef struct load_job {
    const symm_jit_result *res;
    symm_status status;
    char message[512];
} load_job;

static void *load_without_context(void *arg)
{
    load_job *job = arg;
    CUmodule mod;
    job->status = symm_jit_load(job->res->cubin, job->res->cubin_size, &mod);
    snprintf(job->message, sizeof job->message, "%s", symm_last_error());
    if (job->status == SYMM_OK)
        symm_jit_unload(mod);
    return NULL;
}

Test(jit_gpu, load_on_a_thread_without_a_context_says_so)
{
    char arch[16];
    device_arch(arch, sizeof arch);
    char *src = pattern_source((uint32_t)rnd());
    symm_jit_request req = request(src, arch);
    symm_jit_result res;
    cr_assert_eq(symm_jit_compile(&req, &res), SYMM_OK, "%s", symm_last_error());
    load_job job = {.res = &res};
    pthread_t thread;
    cr_assert(pthread_create(&thread, NULL, load_without_context, &job) == 0);
    pthread_join(thread, NULL);
    cr_assert_eq(job.status, SYMM_ERR_STATE, "got %s", symm_status_name(job.status));
    cr_assert(strstr(job.message, "no CUDA context"), "message \"%s\"", job.message);
    symm_jit_result_free(&res);
    free(src);
}
