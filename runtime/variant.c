/* variant.c: a generated variant at run time. Create allocates its symmetric
 * buffer and scratch, JIT-compiles its kernels and checks they fit; dispatch
 * and combine check their arguments on the host and launch the kernels of
 * templates/variant.cu.in (native backend), or run over NCCL (nccl backend,
 * variant_nccl.c), or across hosts over NCCL and a native companion within
 * each host (hybrid backend, variant_hybrid.c). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "heap_internal.h"
#include "profile.h"
#include "symm_heap.h"
#include "symm_jit.h"
#include "symm_variant.h"
#include "tune.h"
#include "variant_internal.h"

/* Threads per block of the kernels (templates/variant.cu.in). */
#define COPY_THREADS 512
/* The longest device wait, as for the world's SYMM_TIMEOUT. */
#define MAX_TIMEOUT_S 1e6

/* Mirrors of the template's Args and State. */
typedef struct kernel_args {
    CUdeviceptr x, x_scales, topk_idx, topk_weights, tokens_dev;
    int64_t tokens;
    CUdeviceptr y, out, peers, local, scratch;
    int64_t rank, timeout_ns;
    CUdeviceptr combine_in;
} kernel_args;
_Static_assert(sizeof(kernel_args) == 14 * 8, "kernel_args mirrors Args in variant.cu.in");

static const char *const phase_names[] = {"?", "count exchange", "dispatch rows", "combine rows"};

static symm_status check_desc(const symm_variant_desc *d, int world_size)
{
    if (!d)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_create: desc is NULL");
    if (!d->name)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_create: desc->name is NULL");
    if (d->abi != SYMM_DESC_ABI)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_variant_create: variant %s was generated for descriptor ABI %d, "
                         "this libsymm reads ABI %d: regenerate it with a matching symmgen",
                         d->name, d->abi, SYMM_DESC_ABI);
    if (d->world != world_size)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_variant_create: variant %s is for world %d, the world has %d ranks",
                         d->name, d->world, world_size);
    if (!d->source)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_create: variant %s: desc->source is NULL", d->name);
    size_t len = strlen(d->source);
    if (d->source_len != len)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_variant_create: variant %s: desc->source_len is %zu, expected %zu (the source's "
                         "length up to its NUL)", d->name, d->source_len, len);
    if (d->n_nvrtc_options < 0 || (d->n_nvrtc_options > 0 && !d->nvrtc_options))
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_variant_create: variant %s: desc->n_nvrtc_options is %d with nvrtc_options %s, "
                         "expected 0 or more options in a non-NULL array", d->name, d->n_nvrtc_options,
                         d->nvrtc_options ? "set" : "NULL");
    for (int i = 0; i < d->n_nvrtc_options; i++)
        if (!d->nvrtc_options[i])
            return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_create: variant %s: desc->nvrtc_options[%d] is NULL",
                             d->name, i);
    if ((int)d->combine < SYMM_COMBINE_PUSH || (int)d->combine > SYMM_COMBINE_AUTO ||
        (d->combine == SYMM_COMBINE_AUTO && d->layout != SYMM_LAYOUT_RANK))
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_variant_create: variant %s: desc->combine is %d with layout %s: expected "
                         "SYMM_COMBINE_PUSH, SYMM_COMBINE_PULL or (layout rank only) SYMM_COMBINE_AUTO",
                         d->name, (int)d->combine, d->layout == SYMM_LAYOUT_RANK ? "rank" : "expert");
    /* Each region inside its buffer (the manifest reader checks the same;
     * a stub's descriptor comes here directly). */
    for (int i = 0; i < SYMM_REGION_COUNT; i++) {
        const symm_region_desc *r = &d->regions[i];
        uint64_t size = r->symmetric ? d->symmetric_bytes : d->scratch_bytes;
        if (r->bytes && (r->offset > size || r->bytes > size - r->offset))
            return symm_fail(SYMM_ERR_INVALID_ARG,
                             "symm_variant_create: variant %s: region %s at [%llu, +%llu) outside its %s of %llu "
                             "bytes", d->name, symm_region_name(i), (unsigned long long)r->offset, (unsigned long long)r->bytes,
                             r->symmetric ? "symmetric buffer" : "scratch", (unsigned long long)size);
    }
    const symm_region_desc *state = &d->regions[SYMM_REGION_STATE];
    if (state->symmetric || state->bytes < sizeof(device_state))
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_variant_create: variant %s: the state region has %llu bytes in the %s, expected at "
                         "least %zu in the scratch", d->name, (unsigned long long)state->bytes,
                         state->symmetric ? "symmetric buffer" : "scratch", sizeof(device_state));
    return symm_desc_check_source(d);
}

/* The kernels use Hopper's instructions (bulk copies through the TMA,
 * mbarriers, griddepcontrol): on an older GPU NVRTC would fail with pages
 * of errors, so create refuses it first, in words. */
symm_status symm_variant_check_gpu(const char *name, int cc_major, int cc_minor)
{
    if (cc_major >= SYMM_MIN_CC_MAJOR)
        return SYMM_OK;
    return symm_fail(SYMM_ERR_UNSUPPORTED,
                     "variant %s needs a Hopper (sm_90) or newer GPU, and this rank's GPU is sm_%d%d", name,
                     cc_major, cc_minor);
}

/* The backend of a create: opts->backend, else SYMM_BACKEND from the
 * environment, else native on a world of one host and hybrid on a world of
 * several (hosts > 1). */
static symm_status pick_backend(const symm_variant_options *opts, int hosts, symm_backend *out)
{
    symm_backend b = opts ? opts->backend : SYMM_BACKEND_DEFAULT;
    if (b == SYMM_BACKEND_DEFAULT) {
        const char *env = getenv("SYMM_BACKEND");
        if (!env || !*env)
            b = hosts > 1 ? SYMM_BACKEND_HYBRID : SYMM_BACKEND_NATIVE;
        else if (strcmp(env, "native") == 0)
            b = SYMM_BACKEND_NATIVE;
        else if (strcmp(env, "nccl") == 0)
            b = SYMM_BACKEND_NCCL;
        else if (strcmp(env, "hybrid") == 0)
            b = SYMM_BACKEND_HYBRID;
        else
            return symm_fail(SYMM_ERR_INVALID_ARG,
                             "symm_variant_create: SYMM_BACKEND=\"%s\": expected native, nccl or hybrid", env);
    }
    if (b != SYMM_BACKEND_NATIVE && b != SYMM_BACKEND_NCCL && b != SYMM_BACKEND_HYBRID)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_variant_create: backend %d: expected SYMM_BACKEND_DEFAULT, "
                         "SYMM_BACKEND_NATIVE, SYMM_BACKEND_NCCL or SYMM_BACKEND_HYBRID", (int)b);
    *out = b;
    return SYMM_OK;
}

/* The dynamic shared memory a kernel is launched with, as the module says in
 * the int `symbol` (none when the module has no such symbol), and the
 * kernel's limit raised to it. */
static symm_status dynamic_smem(symm_variant *v, CUmodule module, CUfunction fn, const char *symbol, unsigned *out)
{
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    *out = 0;
    CUdeviceptr ptr = 0;
    size_t bytes = 0;
    /* Every kernel symmgen emits says how much it needs, zero included: a
     * module without the symbol is not symmgen's (or not this version's),
     * and launching it with none would overrun its staging buffers. */
    const CUresult r = cu->cuModuleGetGlobal(&ptr, &bytes, module, symbol);
    if (r != CUDA_SUCCESS || bytes != sizeof(int))
        return symm_fail(SYMM_ERR_UNSUPPORTED,
                         "symm_variant_create: variant %s: its kernels do not define %s (an int, the bytes of dynamic "
                         "shared memory they launch with): %s; regenerate the variant with this symmgen",
                         v->desc->name, symbol,
                         r != CUDA_SUCCESS ? "not found in the compiled module" : "not the size of an int");
    int smem = 0;
    SYMM_CU(cu, cuMemcpyDtoH(&smem, ptr, sizeof smem));
    if (smem < 0)
        return symm_fail(SYMM_ERR_UNSUPPORTED,
                         "symm_variant_create: variant %s: %s = %d: expected >= 0 (regenerate the variant)",
                         v->desc->name, symbol, smem);
    if (smem > 0)
        SYMM_CU(cu, cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem));
    *out = (unsigned)smem;
    return SYMM_OK;
}

/* The tuning: symm_variant_options.tune, else SYMM_TUNE. */
static symm_status parse_tune(const symm_variant_options *opts, symm_tune *tune)
{
    if (opts && opts->tune)
        return symm_tune_parse(opts->tune, "symm_variant_options.tune", tune);
    return symm_tune_parse(getenv("SYMM_TUNE"), "SYMM_TUNE", tune);
}

/* Bytes of the local scratch: the descriptor's, the profile's spans after
 * them (profile.h; written only with PROFILE=2), then layout rank's words of
 * dispatch's tuning STEAL (symm_steal_bytes). */
static uint64_t scratch_bytes(const symm_variant *v)
{
    return v->desc->scratch_bytes + SYMM_PROFILE_SPANS_BYTES + symm_steal_bytes(v->desc);
}

/* Where the spans lie (PROFILE=2): right after the descriptor's scratch. */
static CUdeviceptr profile_spans(const symm_variant *v) { return v->scratch + v->desc->scratch_bytes; }

/* JIT-compile (through the cache) and load the kernels with the tuning;
 * check that every block of a launch can be resident at once (blocks wait
 * for each other). */
static symm_status load_kernels(symm_variant *v, const symm_variant_options *opts, const symm_tune *tune)
{
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    char arch[16];
    SYMM_TRY(symm_jit_device_arch(symm_device_handle(v->dev), arch, sizeof arch));
    char source_name[96];
    snprintf(source_name, sizeof source_name, "%s.cu", v->desc->name);
    /* The variant's NVRTC options, then the tuning's -D options. */
    const int n_desc = v->desc->n_nvrtc_options > 0 ? v->desc->n_nvrtc_options : 0;
    const char **options = calloc((size_t)(n_desc + tune->count) + 1, sizeof *options);
    if (!options)
        return symm_fail(SYMM_ERR_NOMEM, "symm_variant_create: out of host memory");
    for (int i = 0; i < n_desc; i++)
        options[i] = v->desc->nvrtc_options[i];
    for (int i = 0; i < tune->count; i++)
        options[n_desc + i] = tune->option[i];
    symm_jit_request req = {
        .source = v->desc->source,
        .source_name = source_name,
        .arch = arch,
        .options = options,
        .option_count = (size_t)(n_desc + tune->count),
        .cache_dir = opts ? opts->cache_dir : NULL,
    };
    /* Programs compiled at once (symm_jit_compile_part_list): part 1 holds
     * dispatch, part 2 combine, part 3 (the NCCL and hybrid backends only)
     * those backends' kernels, part 4 (combine = "auto", native backend
     * only) the pulling combine, part 2 then being the pushing one; so a
     * cold compile of a native variant takes as long as its longest part.
     * The hybrid compiles part 3 alone (its companion runs the native
     * kernels), with the options symm_jit_compile_parts gives part 3: the
     * same cache entry. */
    const bool hybrid = v->backend == SYMM_BACKEND_HYBRID;
    const bool two_forms = v->backend == SYMM_BACKEND_NATIVE && v->desc->combine == SYMM_COMBINE_AUTO;
    const int list[3] = {1, 2, two_forms ? 4 : 3};
    const int parts = v->backend == SYMM_BACKEND_NATIVE ? (two_forms ? 3 : 2) : hybrid ? 1 : 3;
    symm_jit_result res[3];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    symm_status st;
    if (hybrid) {
        options[n_desc + tune->count] = "-DSYMM_PART=3";
        req.option_count++;
        st = symm_jit_compile(&req, &res[0]);
    } else {
        st = symm_jit_compile_part_list(&req, list, parts, res);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st == SYMM_OK) {
        v->jit_ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        v->jit_cache_hit = true;
        for (int i = 0; i < parts; i++)
            v->jit_cache_hit &= res[i].cache_hit;
        CUmodule *modules[3] = {hybrid ? &v->module_nccl : &v->module_dispatch, &v->module,
                                two_forms ? &v->module_pull : &v->module_nccl};
        for (int i = 0; i < parts && st == SYMM_OK; i++)
            st = symm_jit_load(res[i].cubin, res[i].cubin_size, modules[i]);
    }
    for (int i = 0; i < parts; i++)
        symm_jit_result_free(&res[i]);
    free(options);
    SYMM_TRY(st);
    if (!hybrid) {
        SYMM_TRY(symm_jit_get_function(v->module_dispatch, "symm_dispatch", &v->fn_dispatch));
        SYMM_TRY(symm_jit_get_function(v->module, "symm_combine", &v->fn_combine));
    }
    if (two_forms)
        SYMM_TRY(symm_jit_get_function(v->module_pull, "symm_combine_pull", &v->fn_combine_pull));
    if (v->backend != SYMM_BACKEND_NATIVE) {
        SYMM_TRY(symm_jit_get_function(v->module_nccl, "symm_nccl_scatter", &v->fn_nccl_scatter));
        SYMM_TRY(symm_jit_get_function(v->module_nccl, "symm_nccl_count", &v->fn_nccl_count));
        SYMM_TRY(symm_jit_get_function(v->module_nccl, "symm_nccl_scan", &v->fn_nccl_scan));
        SYMM_TRY(symm_jit_get_function(v->module_nccl, "symm_nccl_pack", &v->fn_nccl_pack));
        SYMM_TRY(symm_jit_get_function(v->module_nccl, "symm_nccl_gather", &v->fn_nccl_gather));
        SYMM_TRY(symm_jit_get_function(v->module_nccl, "symm_nccl_unstage", &v->fn_nccl_unstage));
        SYMM_TRY(symm_jit_get_function(v->module_nccl, "symm_nccl_restage", &v->fn_nccl_restage));
        SYMM_TRY(symm_jit_get_function(v->module_nccl, "symm_count_experts", &v->fn_count_experts));
        SYMM_TRY(symm_jit_get_function(v->module_nccl, "symm_reduce", &v->fn_reduce));
        if (v->backend == SYMM_BACKEND_HYBRID) {
            SYMM_TRY(symm_jit_get_function(v->module_nccl, "symm_hybrid_src", &v->fn_hybrid_src));
            SYMM_TRY(symm_jit_get_function(v->module_nccl, "symm_hybrid_sum", &v->fn_hybrid_sum));
        }
        return SYMM_OK;
    }

    /* The kernels stage rows in dynamic shared memory (bulk copies). */
    SYMM_TRY(dynamic_smem(v, v->module_dispatch, v->fn_dispatch, "symm_dispatch_smem", &v->dispatch_smem));
    SYMM_TRY(dynamic_smem(v, v->module, v->fn_combine, "symm_combine_smem", &v->combine_smem));
    if (two_forms)
        SYMM_TRY(dynamic_smem(v, v->module_pull, v->fn_combine_pull, "symm_combine_pull_smem",
                              &v->combine_pull_smem));

    const int sms = symm_device_sm_count(v->dev);
    CUfunction waiting[3] = {v->fn_dispatch, v->fn_combine, v->fn_combine_pull};
    const size_t smem[3] = {v->dispatch_smem, v->combine_smem, v->combine_pull_smem};
    int fewest = 0; /* blocks an SM holds of the kernel that fits fewer */
    for (int i = 0; i < (two_forms ? 3 : 2); i++) {
        int per_sm = 0;
        SYMM_CU(cu, cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, waiting[i], COPY_THREADS, smem[i]));
        if ((int64_t)per_sm * sms < v->desc->sms)
            return symm_fail(SYMM_ERR_UNSUPPORTED,
                             "symm_variant_create: variant %s: sms = %d blocks cannot all be resident "
                             "on this GPU (%d SMs x %d blocks): lower sms in the spec",
                             v->desc->name, v->desc->sms, sms, per_sm);
        fewest = i == 0 || per_sm < fewest ? per_sm : fewest;
    }
    /* Ranks sharing a GPU as MPS clients run at once, so every block of all
     * of them must be resident together (time-sliced ranks each get the
     * whole GPU in turn). Otherwise some would spin on SMs that the others'
     * blocks never get, until the timeout. */
    const int here = symm_device_ranks_here(v->dev);
    if (here > 1 && symm_device_mps(v->dev) && (int64_t)here * v->desc->sms > (int64_t)fewest * sms)
        return symm_fail(SYMM_ERR_UNSUPPORTED,
                         "symm_variant_create: variant %s: %d ranks share this GPU as CUDA MPS clients and "
                         "run at once, and %d x sms = %d blocks cannot all be resident (%d SMs x %d blocks): "
                         "lower sms in the spec, put fewer ranks on a GPU, or run them without MPS (they "
                         "then take turns)",
                         v->desc->name, here, here, here * v->desc->sms, sms, fewest);
    return SYMM_OK;
}

static void release(symm_variant *v)
{
    const symm_cuda_api *cu;
    /* Only where there is something to free: a create refused before any
     * GPU work keeps its message (symm_cuda would set its own without a
     * driver). */
    if ((v->scratch || v->module || v->module_dispatch || v->module_nccl || v->module_pull) &&
        symm_cuda(&cu) == SYMM_OK) {
        if (v->scratch)
            cu->cuMemFree(v->scratch);
        if (v->module)
            symm_jit_unload(v->module);
        if (v->module_dispatch)
            symm_jit_unload(v->module_dispatch);
        if (v->module_nccl)
            symm_jit_unload(v->module_nccl);
        if (v->module_pull)
            symm_jit_unload(v->module_pull);
    }
    if (v->nccl)
        symm_variant_nccl_release(v);
    if (v->hybrid)
        symm_variant_hybrid_release(v);
    if (v->alloc)
        symm_alloc_destroy(v->alloc);
    if (v->host_dev)
        symm_device_close(v->host_dev);
    if (v->dev)
        symm_device_close(v->dev);
    void (*on_destroy)(void *) = v->on_destroy;
    void *on_destroy_arg = v->on_destroy_arg;
    free(v);
    if (on_destroy)
        on_destroy(on_destroy_arg);
}

static symm_status profile_reset(symm_variant *v, CUstream stream);

symm_status symm_variant_create(symm_world *world, const symm_variant_desc *desc,
                                const symm_variant_options *opts, symm_variant **out)
{
    if (!world || !out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_create: %s is NULL", world ? "out" : "world");
    *out = NULL;
    SYMM_TRY(check_desc(desc, symm_world_size(world)));
    /* Refuse NaN and values whose nanoseconds do not fit timeout_ns (the
     * conversion would be undefined); the bound is the world's. */
    if (opts && !(opts->timeout_s >= 0 && opts->timeout_s <= MAX_TIMEOUT_S))
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_variant_create: timeout_s %g: expected 0..%g seconds (0: the world's)",
                         opts->timeout_s, MAX_TIMEOUT_S);
    symm_variant *v = calloc(1, sizeof *v);
    if (!v)
        return symm_fail(SYMM_ERR_NOMEM, "symm_variant_create: out of host memory");
    v->world = world;
    v->desc = desc;
    v->rank = symm_world_rank(world);
    double timeout = opts && opts->timeout_s > 0 ? opts->timeout_s : symm_world_timeout(world);
    v->timeout_ns = (int64_t)(timeout * 1e9);

    const symm_cuda_api *cu = NULL;
    const int across_hosts = symm_world_host_count(world) > 1;
    symm_status st = pick_backend(opts, symm_world_host_count(world), &v->backend);
    /* Every rank knows its world's hosts: all refuse alike, nobody waits. */
    if (st == SYMM_OK && across_hosts && v->backend == SYMM_BACKEND_NATIVE) {
        char hosts[640];
        symm_hosts_text(world, hosts, sizeof hosts);
        st = symm_fail(SYMM_ERR_UNSUPPORTED, "backend native shares GPU memory over NVLink within one host, and "
                       "the world spans %s: use backend hybrid (the default there: SYMM_BACKEND unset or "
                       "hybrid, SYMM_BACKEND_HYBRID in the options) or nccl", hosts);
    }
    /* The hybrid's refusals (one host, ranks not host-major, combine_order
     * k, no companion for the host count) come before any GPU work. */
    const symm_variant_desc *companion = NULL;
    if (st == SYMM_OK && v->backend == SYMM_BACKEND_HYBRID)
        st = symm_variant_hybrid_check(world, desc, &companion);
    if (st == SYMM_OK)
        st = symm_cuda(&cu);
    if (st == SYMM_OK)
        st = symm_device_open(world, &v->dev);
    /* Across hosts the NCCL backend's symmetric buffer is shared within the
     * host only: it is allocated on the host world, with its own device. */
    if (st == SYMM_OK && across_hosts)
        st = symm_device_open(symm_world_host_world(world), &v->host_dev);
    if (st == SYMM_OK)
        st = symm_agree(world,
                        symm_variant_check_gpu(desc->name, symm_device_cc_major(v->dev),
                                               symm_device_cc_minor(v->dev)),
                        "symm_variant_create: checking the GPU");
    /* The hybrid's symmetric buffers are its companion's (and its own
     * tables); the variant's own would go unused. */
    if (st == SYMM_OK && v->backend != SYMM_BACKEND_HYBRID)
        st = symm_alloc_create(symm_world_host_world(world), across_hosts ? v->host_dev : v->dev,
                               desc->symmetric_bytes, 0, &v->alloc);
    /* The local steps may fail on one rank only: every rank learns of it
     * (symm_agree) before anyone goes on, so all fail, and release, together.
     * The tuning comes first: PROFILE=2 sizes the scratch. */
    if (st == SYMM_OK) {
        symm_tune tune;
        symm_status local = parse_tune(opts, &tune);
        if (local == SYMM_OK) {
            v->profile = tune.profile;
            v->pdl = tune.pdl;
            local = symm_cuda_check(cu->cuMemAlloc(&v->scratch, scratch_bytes(v)), "cuMemAlloc(scratch)");
        }
        if (local == SYMM_OK)
            local = symm_cuda_check(cu->cuMemsetD8(v->scratch, 0, scratch_bytes(v)), "cuMemsetD8(scratch)");
        if (local == SYMM_OK)
            local = load_kernels(v, opts, &tune);
        if (local == SYMM_OK && v->profile)
            local = profile_reset(v, NULL);
        st = symm_agree(world, local, "symm_variant_create: setting up the variant");
    }
    if (st == SYMM_OK && v->backend == SYMM_BACKEND_NCCL)
        st = symm_variant_nccl_setup(v);
    if (st == SYMM_OK && v->backend == SYMM_BACKEND_HYBRID)
        st = symm_variant_hybrid_setup(v, companion, opts);
    /* Every rank must have succeeded before anyone uses the variant. */
    if (st == SYMM_OK)
        st = symm_world_barrier(world);
    if (st != SYMM_OK) {
        symm_fail_context(st, "symm_variant_create(%s): ", desc->name);
        release(v);
        return st;
    }
    *out = v;
    return SYMM_OK;
}

symm_status symm_variant_destroy(symm_variant *v)
{
    if (!v)
        return SYMM_OK;
    const symm_cuda_api *cu;
    /* NCCL's kernels wait for peers without a timeout: a peer that is gone
     * would keep the synchronisation below waiting for ever. */
    symm_status quiet = v->nccl ? symm_variant_nccl_quiesce(v) : v->hybrid ? symm_variant_hybrid_quiesce(v) : SYMM_OK;
    if (quiet != SYMM_OK)
        symm_fail_context(quiet, "symm_variant_destroy: %s (everything is released): ", v->desc->name);
    symm_status st = symm_cuda(&cu);
    if (st == SYMM_OK)
        st = symm_cuda_check(cu->cuCtxSynchronize(), "symm_variant_destroy: cuCtxSynchronize");
    release(v);
    return quiet != SYMM_OK ? quiet : st;
}

const symm_variant_desc *symm_variant_describe(const symm_variant *v) { return v ? v->desc : NULL; }

symm_backend symm_variant_backend(const symm_variant *v) { return v ? v->backend : SYMM_BACKEND_DEFAULT; }

static int misaligned(const void *p, size_t a) { return ((uintptr_t)p % a) != 0; }

/* Host-side checks of a dispatch; nothing is queued when they fail. */
static symm_status check_dispatch(const symm_variant *v, const symm_dispatch_args *a)
{
    const symm_variant_desc *d = v->desc;
    if (!a)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s dispatch: args is NULL", d->name);
    if (!a->tokens_dev && (a->tokens < 0 || a->tokens > d->max_tokens))
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s dispatch: tokens %d: expected 0..%d (max_tokens)",
                         d->name, a->tokens, d->max_tokens);
    const int may_have_rows = a->tokens_dev || a->tokens > 0;
    if (may_have_rows && (!a->x || !a->topk_idx))
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s dispatch: %s is NULL", d->name, a->x ? "topk_idx" : "x");
    /* The kernels read x by 16-byte vectors and the others by 4-byte words:
     * a misaligned address would fault on the GPU, which ends the context. */
    const struct {
        const char *name;
        const void *p;
        size_t align;
    } ptrs[] = {
        {"x", a->x, 16},
        {"topk_idx", a->topk_idx, 4},
        {"topk_weights", a->topk_weights, 4},
        {"x_scales", a->x_scales, 4},
        {"tokens_dev", a->tokens_dev, 4},
    };
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i].p && misaligned(ptrs[i].p, ptrs[i].align))
            return symm_fail(SYMM_ERR_INVALID_ARG, "%s dispatch: %s %p: expected %zu-byte alignment", d->name,
                             ptrs[i].name, ptrs[i].p, ptrs[i].align);
    if (d->dtype == SYMM_DTYPE_FP8_E4M3 && may_have_rows && !a->x_scales)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s dispatch: x_scales is NULL: expected [T, %d] float scales for fp8_e4m3",
                         d->name, d->hidden / SYMM_FP8_BLOCK);
    if (d->dtype != SYMM_DTYPE_FP8_E4M3 && a->x_scales)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s dispatch: x_scales given, expected NULL (dtype %s has no scales)",
                         d->name, d->dtype == SYMM_DTYPE_FP32 ? "fp32" : d->dtype == SYMM_DTYPE_FP16 ? "fp16" : "bf16");
    if (d->weights && may_have_rows && !a->topk_weights)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s dispatch: topk_weights is NULL: the variant carries weights",
                         d->name);
    if (!d->weights && a->topk_weights)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "%s dispatch: topk_weights given, expected NULL (the variant has weights = false)", d->name);
    return SYMM_OK;
}

bool symm_variant_y_inside(const symm_variant_desc *d, CUdeviceptr base, CUdeviceptr y)
{
    const uint64_t need = (uint64_t)d->capacity * (uint64_t)d->hidden * symm_dtype_size(d->combine_dtype);
    return y >= base && need <= d->symmetric_bytes && y - base <= d->symmetric_bytes - need;
}

bool symm_variant_native_pulls(const symm_variant_desc *d, CUdeviceptr base, CUdeviceptr y)
{
    return d->combine == SYMM_COMBINE_PULL || (d->combine == SYMM_COMBINE_AUTO && symm_variant_y_inside(d, base, y));
}

CUdeviceptr symm_variant_region_ptr(const symm_variant *v, symm_region id)
{
    const symm_region_desc *r = &v->desc->regions[id];
    if (!r->bytes || (r->symmetric && !v->alloc)) /* the hybrid has no symmetric buffer of its own */
        return 0;
    return (r->symmetric ? symm_alloc_local(v->alloc) : v->scratch) + r->offset;
}

static void base_args(const symm_variant *v, kernel_args *k)
{
    memset(k, 0, sizeof *k);
    k->peers = symm_alloc_peer_table(v->alloc);
    k->local = symm_alloc_local(v->alloc);
    k->scratch = v->scratch;
    k->rank = v->rank;
    k->timeout_ns = v->timeout_ns;
    k->combine_in = symm_variant_region_ptr(v, SYMM_REGION_COMBINE_IN); /* 0 in a pulling variant */
}

/* pdl: launched as a programmatic dependent of the kernel before it on the
 * stream (programmatic stream serialization): its blocks may be scheduled
 * while that kernel ends, and each waits (griddepcontrol.wait, the kernels'
 * first instruction that touches memory) until that kernel has completed and
 * its writes are visible. It hides the launch of dispatch and combine behind
 * the kernel before them, inside CUDA graphs too; after anything but a kernel
 * the dependency is an ordinary one. */
static symm_status launch(const symm_variant *v, CUfunction fn, unsigned blocks, unsigned threads, unsigned smem,
                          kernel_args *k, CUstream stream, bool pdl, const char *what)
{
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    void *params[] = {k};
    CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                              .value = {.programmaticStreamSerializationAllowed = 1}};
    const CUlaunchConfig config = {.gridDimX = blocks, .gridDimY = 1, .gridDimZ = 1,
                                   .blockDimX = threads, .blockDimY = 1, .blockDimZ = 1,
                                   .sharedMemBytes = smem, .hStream = stream,
                                   .attrs = &attr, .numAttrs = 1};
    /* On the default streams (legacy or per-thread) the launches stay
     * ordinary ones: PDL is for streams an application made (and the graphs
     * captured from them). */
    pdl = pdl && stream != NULL && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD;
    symm_status st = symm_cuda_check(pdl ? cu->cuLaunchKernelEx(&config, fn, params, NULL)
                                         : cu->cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, smem, stream, params,
                                                              NULL),
                                     what);
    if (st != SYMM_OK)
        symm_fail_context(st, "%s: ", v->desc->name);
    return st;
}

symm_status symm_variant_dispatch(symm_variant *v, const symm_dispatch_args *args, CUstream stream)
{
    if (!v)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_dispatch: variant is NULL");
    SYMM_TRY(check_dispatch(v, args));
    if (v->backend == SYMM_BACKEND_NCCL)
        SYMM_TRY(symm_variant_nccl_refuse_capture(v, stream, "dispatch"));
    if (v->backend == SYMM_BACKEND_HYBRID)
        SYMM_TRY(symm_variant_hybrid_refuse_capture(v, stream, "dispatch"));
    if (v->awaiting_combine)
        return symm_fail(SYMM_ERR_STATE,
                         "%s dispatch: the previous dispatch has not been combined: every dispatch "
                         "must be followed by its combine before the next dispatch", v->desc->name);
    if (v->backend == SYMM_BACKEND_NCCL || v->backend == SYMM_BACKEND_HYBRID) {
        symm_status st = v->backend == SYMM_BACKEND_NCCL ? symm_variant_nccl_dispatch(v, args, stream)
                                                         : symm_variant_hybrid_dispatch(v, args, stream);
        v->awaiting_combine = st == SYMM_OK;
        return st;
    }
    kernel_args k;
    base_args(v, &k);
    k.x = (CUdeviceptr)args->x;
    k.x_scales = (CUdeviceptr)args->x_scales;
    k.topk_idx = (CUdeviceptr)args->topk_idx;
    k.topk_weights = (CUdeviceptr)args->topk_weights;
    k.tokens_dev = (CUdeviceptr)args->tokens_dev;
    k.tokens = args->tokens;
    SYMM_TRY(launch(v, v->fn_dispatch, (unsigned)v->desc->sms, COPY_THREADS, v->dispatch_smem, &k, stream, v->pdl,
                    "dispatch: launch of symm_dispatch"));
    v->awaiting_combine = true;
    return SYMM_OK;
}

symm_status symm_variant_combine(symm_variant *v, const void *y, void *out, CUstream stream)
{
    if (!v)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_combine: variant is NULL");
    const char *name = v->desc->name;
    if (!y || !out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s combine: %s is NULL", name, y ? "out" : "y");
    if (misaligned(y, 16) || misaligned(out, 16))
        return symm_fail(SYMM_ERR_INVALID_ARG, "%s combine: %s %p: expected 16-byte alignment", name,
                         misaligned(y, 16) ? "y" : "out", misaligned(y, 16) ? y : out);
    if (v->desc->combine == SYMM_COMBINE_PULL && v->backend != SYMM_BACKEND_HYBRID) {
        /* (The hybrid's companion checks its own buffer.) The peers read y where it is: inside this variant's symmetric
         * buffer, all of its capacity rows (either backend: the manifest
         * declares y symmetric). */
        const symm_variant_desc *d = v->desc;
        const CUdeviceptr base = symm_alloc_local(v->alloc);
        const uint64_t need = (uint64_t)d->capacity * (uint64_t)d->hidden * symm_dtype_size(d->combine_dtype);
        if (!symm_variant_y_inside(d, base, (CUdeviceptr)y))
            return symm_fail(SYMM_ERR_INVALID_ARG,
                             "%s combine: y %p (%llu bytes: capacity %lld rows) is not inside the variant's "
                             "symmetric buffer [0x%llx, 0x%llx): with combine = \"pull\" the peers read y "
                             "there; write it to symm_recv_buffers.y (or recv_x when dtype == combine_dtype)",
                             name, y, (unsigned long long)need, (long long)d->capacity, (unsigned long long)base,
                             (unsigned long long)(base + d->symmetric_bytes));
    }
    if (v->backend == SYMM_BACKEND_NCCL) {
        SYMM_TRY(symm_variant_nccl_refuse_capture(v, stream, "combine"));
        /* After a failed dispatch there is no dispatch to combine, but the
         * failure is what the caller needs to hear (sticky). */
        SYMM_TRY(symm_variant_nccl_failure(v, "combine"));
    }
    if (v->backend == SYMM_BACKEND_HYBRID) {
        SYMM_TRY(symm_variant_hybrid_refuse_capture(v, stream, "combine"));
        SYMM_TRY(symm_variant_hybrid_failure(v, "combine"));
    }
    if (!v->awaiting_combine)
        return symm_fail(SYMM_ERR_STATE,
                         "%s combine: no dispatch to combine: every combine follows exactly one dispatch",
                         name);
    symm_status st;
    if (v->backend == SYMM_BACKEND_NCCL) {
        st = symm_variant_nccl_combine(v, y, out, stream);
    } else if (v->backend == SYMM_BACKEND_HYBRID) {
        st = symm_variant_hybrid_combine(v, y, out, stream);
    } else {
        kernel_args k;
        base_args(v, &k);
        k.y = (CUdeviceptr)y;
        k.out = (CUdeviceptr)out;
        /* combine = "auto": the pulling kernel where y lies in the symmetric
         * buffer (every rank must choose alike: the kernels check it). */
        const bool auto_pull =
            v->desc->combine == SYMM_COMBINE_AUTO && symm_variant_native_pulls(v->desc, k.local, k.y);
        st = auto_pull ? launch(v, v->fn_combine_pull, (unsigned)v->desc->sms, COPY_THREADS, v->combine_pull_smem,
                                &k, stream, v->pdl, "combine: launch of symm_combine_pull")
                       : launch(v, v->fn_combine, (unsigned)v->desc->sms, COPY_THREADS, v->combine_smem, &k, stream,
                                v->pdl, "combine: launch of symm_combine");
    }
    if (st == SYMM_OK)
        v->awaiting_combine = false;
    return st;
}

symm_status symm_variant_launch_reduce(symm_variant *v, const void *y, void *out, CUdeviceptr combine_in,
                                       CUstream stream)
{
    kernel_args k;
    base_args(v, &k);
    k.combine_in = combine_in;
    k.y = (CUdeviceptr)y;
    k.out = (CUdeviceptr)out;
    return launch(v, v->fn_reduce, (unsigned)v->desc->sms, COPY_THREADS, 0, &k, stream, false,
                  "combine: launch of symm_reduce");
}

symm_status symm_variant_recv(const symm_variant *v, symm_recv_buffers *out)
{
    if (!v || !out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_recv: %s is NULL", v ? "out" : "variant");
    if (v->hybrid)
        return symm_variant_hybrid_recv(v, out);
    out->x = symm_variant_region_ptr(v, SYMM_REGION_RECV_X);
    out->scales = symm_variant_region_ptr(v, SYMM_REGION_RECV_SCALES);
    out->src = symm_variant_region_ptr(v, SYMM_REGION_RECV_SRC);
    out->topk_idx = symm_variant_region_ptr(v, SYMM_REGION_RECV_TOPK);
    out->weights = symm_variant_region_ptr(v, SYMM_REGION_RECV_WEIGHTS);
    out->expert_count = symm_variant_region_ptr(v, SYMM_REGION_EXPERT_COUNT);
    out->expert_offset =
        v->desc->layout == SYMM_LAYOUT_EXPERT ? symm_variant_region_ptr(v, SYMM_REGION_EXPERT_OFFSET) : 0;
    out->rows = symm_variant_region_ptr(v, SYMM_REGION_STATE) + offsetof(device_state, recv_rows);
    out->y = symm_variant_region_ptr(v, SYMM_REGION_Y);
    return SYMM_OK;
}

/* The profile slots back to "nothing recorded" (profile.h), the spans
 * (PROFILE=2) to 0. */
static symm_status profile_reset(symm_variant *v, CUstream stream)
{
    static const uint64_t zeros[SYMM_PROFILE_SPAN_SLOTS];
    uint64_t empty[SYMM_PROFILE_SLOTS];
    symm_profile_empty(empty);
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    SYMM_CU(cu, cuMemcpyHtoDAsync(symm_variant_region_ptr(v, SYMM_REGION_STATE) + SYMM_PROFILE_OFFSET, empty,
                                  sizeof empty, stream));
    if (v->profile >= 2)
        SYMM_CU(cu, cuMemcpyHtoDAsync(profile_spans(v), zeros, sizeof zeros, stream));
    SYMM_CU(cu, cuStreamSynchronize(stream));
    return SYMM_OK;
}

symm_status symm_variant_profile_read(symm_variant *v, CUstream stream, symm_variant_profile *out)
{
    if (!v || !out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_profile_read: %s is NULL", v ? "out" : "variant");
    if (v->hybrid)
        return symm_variant_hybrid_profile(v, stream, out);
    if (!v->profile)
        return symm_fail(SYMM_ERR_STATE, "symm_variant_profile_read: %s was created without the tuning knob "
                         "PROFILE=1 or PROFILE=2 (SYMM_TUNE or symm_variant_options.tune)", v->desc->name);
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    /* The NCCL backend's stream may wait inside NCCL: a bounded wait (see
     * stats_read). The native kernels time out on the device. */
    if (v->nccl)
        SYMM_TRY(symm_variant_nccl_sync(v, stream, "profile_read"));
    else
        SYMM_CU(cu, cuStreamSynchronize(stream));
    uint64_t phases[SYMM_PROFILE_SLOTS], spans[SYMM_PROFILE_SPAN_SLOTS];
    SYMM_CU(cu, cuMemcpyDtoH(phases, symm_variant_region_ptr(v, SYMM_REGION_STATE) + SYMM_PROFILE_OFFSET,
                             sizeof phases));
    if (v->profile >= 2)
        SYMM_CU(cu, cuMemcpyDtoH(spans, profile_spans(v), sizeof spans));
    SYMM_TRY(profile_reset(v, stream));
    symm_profile_from_slots(phases, v->profile >= 2 ? spans : NULL, v->profile, out);
    return SYMM_OK;
}

symm_status symm_variant_stats_read(symm_variant *v, CUstream stream, symm_variant_stats *stats)
{
    if (!v)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_variant_stats_read: variant is NULL");
    symm_variant_stats local;
    uint64_t err_seq = 0;
    if (v->hybrid) {
        symm_status st = symm_variant_hybrid_stats(v, stream, &local);
        if (st != SYMM_OK) {
            if (stats)
                *stats = local;
            return st;
        }
        err_seq = local.calls;
    } else {
        const symm_cuda_api *cu;
        SYMM_TRY(symm_cuda(&cu));
        /* The NCCL backend's stream may wait on a peer inside NCCL: its wait
         * is bounded by the variant's timeout (and then sticky) like every
         * host wait of that backend, and an earlier failure (sticky) returns
         * at once, waiting for nothing. */
        if (v->backend == SYMM_BACKEND_NCCL) {
            symm_status waited = symm_variant_nccl_sync(v, stream, "stats_read");
            if (waited != SYMM_OK) {
                if (stats) {
                    memset(stats, 0, sizeof *stats);
                    stats->timed_out = waited == SYMM_ERR_TIMEOUT;
                    stats->timeout_peer = -1; /* NCCL cannot tell which */
                    stats->mismatch_peer = -1;
                }
                return waited;
            }
        } else {
            SYMM_CU(cu, cuStreamSynchronize(stream));
        }
        device_state s;
        SYMM_CU(cu, cuMemcpyDtoH(&s, symm_variant_region_ptr(v, SYMM_REGION_STATE), sizeof s));
        local = (symm_variant_stats){
            .calls = s.seq,
            .tokens = s.tokens,
            .recv_rows = s.recv_rows,
            .invalid = s.invalid,
            .dropped_send = s.dropped_send,
            .dropped_recv = s.dropped_recv,
            .clamped = s.clamped,
            .timed_out = s.err_code == SYMM_DEVICE_ERR_TIMEOUT,
            .timeout_peer = s.err_peer,
            .timeout_phase = s.err_phase,
            .mismatch = s.err_code == SYMM_DEVICE_ERR_PULLED_PUSH   ? 1
                        : s.err_code == SYMM_DEVICE_ERR_PUSHED_PULL ? 2
                                                                    : 0,
            .mismatch_peer = -1,
        };
        if (local.mismatch)
            local.mismatch_peer = s.err_peer;
        err_seq = s.err_seq;
        /* An error code this libsymm does not know (a kernel of another
         * version): reported as such, never as a clean call. */
        if (s.err_code != 0 && !local.timed_out && !local.mismatch) {
            if (stats)
                *stats = local;
            return symm_fail(SYMM_ERR_STATE, "%s: rank %d: device error code %d in call %llu: expected 0..3 "
                             "(regenerate the variant with this libsymm's symmgen)", v->desc->name, v->rank,
                             s.err_code, (unsigned long long)err_seq);
        }
    }
    if (stats)
        *stats = local;
    const char *name = v->desc->name;
    if (local.timed_out)
        return symm_fail(SYMM_ERR_TIMEOUT,
                         "%s: rank %d waited more than %.3g s for rank %d in the %s of call %llu "
                         "(is that rank alive and issuing the same calls?)",
                         name, v->rank, (double)v->timeout_ns / 1e9, local.timeout_peer,
                         phase_names[local.timeout_phase >= 1 && local.timeout_phase <= 3 ? local.timeout_phase : 0],
                         (unsigned long long)err_seq);
    if (local.mismatch)
        return symm_fail(SYMM_ERR_MISMATCH,
                         "%s: rank %d %s and rank %d %s in the combine of call %llu: with combine = \"auto\" "
                         "every rank must place y alike in a call (all inside the variant's symmetric buffer, "
                         "symm_recv_buffers.y or recv_x: pull; or all outside: push); the variant must be "
                         "destroyed and created again",
                         name, v->rank,
                         local.mismatch == 1 ? "pulled (its y inside the symmetric buffer)"
                                             : "pushed (its y outside the symmetric buffer)",
                         local.mismatch_peer, local.mismatch == 1 ? "pushed" : "pulled",
                         (unsigned long long)err_seq);
    if (local.dropped_send || local.dropped_recv || local.invalid || local.clamped)
        return symm_fail(SYMM_ERR_OVERFLOW,
                         "%s: rank %d, dispatch %llu: %d rows sent and %d rows received did not fit "
                         "(capacity %lld), %d invalid topk entries%s",
                         name, v->rank, (unsigned long long)local.calls, local.dropped_send, local.dropped_recv,
                         (long long)v->desc->capacity, local.invalid,
                         local.clamped ? ", T from device memory above max_tokens (clamped)" : "");
    return SYMM_OK;
}
