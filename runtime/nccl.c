/* nccl.c: opens libnccl.so.2 at run time (nccl_api.h) and builds NCCL
 * communicators over the ranks of a world (symm_nccl.h), with the unique id
 * carried by the world's broadcast. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
#include "heap_internal.h"
#include "nccl_api.h"
#include "symm_nccl.h"

static symm_nccl_api api;
static symm_status load_status = SYMM_ERR_NCCL;
static char load_message[2048];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

/* The first libnccl.so.2 that opens; tried lists every failure. */
static void *open_library(char *tried, size_t cap)
{
    const char *home = getenv("CUDA_HOME");
    char paths[5][512];
    int n = 0;
    snprintf(paths[n++], sizeof paths[0], "libnccl.so.2");
    if (home && *home) {
        snprintf(paths[n++], sizeof paths[0], "%s/lib/libnccl.so.2", home);
        snprintf(paths[n++], sizeof paths[0], "%s/lib64/libnccl.so.2", home);
    }
    snprintf(paths[n++], sizeof paths[0], "/usr/local/cuda/lib/libnccl.so.2");
    snprintf(paths[n++], sizeof paths[0], "/usr/local/cuda/lib64/libnccl.so.2");
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        void *lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            size_t len = strnlen(paths[i], sizeof api.path - 1);
            memcpy(api.path, paths[i], len);
            api.path[len] = '\0';
            return lib;
        }
        const char *why = dlerror();
        if (used < cap)
            used += (size_t)snprintf(tried + used, cap - used, "%s%s", i ? "; " : "",
                                     why ? why : paths[i]);
    }
    return NULL;
}

static void load_nccl(void)
{
    /* NCCL reads its parameters at its first call, which has not happened. */
    if (!getenv("NCCL_NVLS_ENABLE"))
        setenv("NCCL_NVLS_ENABLE", "0", 0);
    char tried[1536] = "";
    void *lib = open_library(tried, sizeof tried);
    if (!lib) {
        snprintf(load_message, sizeof load_message,
                 "NCCL is not available: cannot open libnccl.so.2 (%s)", tried);
        return;
    }
#define SYMM_NCCL_RESOLVE(name)                                                       \
    api.name = (__typeof__(api.name))dlsym(lib, #name);                               \
    if (!api.name) {                                                                  \
        snprintf(load_message, sizeof load_message,                                   \
                 "NCCL is not usable: %s lacks %s (expected NCCL 2.13 or newer)",     \
                 api.path, #name);                                                    \
        dlclose(lib);                                                                 \
        return;                                                                       \
    }
    SYMM_NCCL_FUNCTIONS(SYMM_NCCL_RESOLVE)
#undef SYMM_NCCL_RESOLVE
    ncclResult_t r = api.ncclGetVersion(&api.version);
    if (r != ncclSuccess) {
        snprintf(load_message, sizeof load_message, "NCCL is not usable: ncclGetVersion of %s "
                 "failed: %s", api.path, api.ncclGetErrorString(r));
        return;
    }
    load_status = SYMM_OK;
}

symm_status symm_nccl_load(const symm_nccl_api **out)
{
    pthread_once(&load_once, load_nccl);
    if (load_status != SYMM_OK)
        return symm_fail(load_status, "%s", load_message);
    *out = &api;
    return SYMM_OK;
}

symm_status symm_nccl_check(const symm_nccl_api *nc, ncclComm_t comm, ncclResult_t result,
                            const char *what)
{
    if (result == ncclSuccess)
        return SYMM_OK;
    const char *text = nc->ncclGetErrorString(result);
    const char *last = nc->ncclGetLastError(comm);
    if (last && *last)
        return symm_fail(SYMM_ERR_NCCL, "%s: NCCL error %d: %s (%s)", what, (int)result,
                         text ? text : "?", last);
    return symm_fail(SYMM_ERR_NCCL, "%s: NCCL error %d: %s", what, (int)result,
                     text ? text : "?");
}

symm_status symm_nccl_version(int *version)
{
    if (!version)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_nccl_version: version is NULL");
    const symm_nccl_api *nc;
    SYMM_TRY(symm_nccl_load(&nc));
    *version = nc->version;
    return SYMM_OK;
}

struct symm_nccl {
    const symm_nccl_api *api;
    ncclComm_t comm;
};

bool symm_nccl_shared_gpu_mode(void)
{
    const char *mode = getenv("SYMM_NCCL_SHARED_GPU"), *host = getenv("NCCL_HOSTID");
    return mode && !strcmp(mode, "1") && host && *host;
}

/* Two ranks on one GPU: refused unless this rank runs in the shared-GPU mode
 * (symm_nccl.h). The verdict is local; the caller agrees on it. */
static symm_status refuse_shared_gpu(const symm_device *dev, int ranks)
{
    if (symm_device_gpu_count(dev) >= ranks || symm_nccl_shared_gpu_mode())
        return SYMM_OK;
    for (int q = 1; q < ranks; q++)
        for (int r = 0; r < q; r++)
            if (symm_device_gpu_index(dev, r) == symm_device_gpu_index(dev, q))
                return symm_fail(SYMM_ERR_UNSUPPORTED, "symm_nccl_create: ranks %d and %d run "
                                 "on the same GPU, and NCCL needs one GPU per rank (%d ranks "
                                 "on %d GPUs; for tests only, symmrun --nccl-shared-gpu makes "
                                 "each rank its own NCCL host)", r, q, ranks, symm_device_gpu_count(dev));
    return SYMM_OK;
}

static symm_status make_current(const symm_device *dev)
{
    const symm_cuda_api *cu;
    SYMM_TRY(symm_cuda(&cu));
    SYMM_CU(cu, cuCtxSetCurrent(symm_device_context(dev)));
    return SYMM_OK;
}

typedef struct id_message {
    int32_t status;
    char message[1000];
    ncclUniqueId id;
} id_message;

/* Collective: rank 0's unique id (or its failure) to every rank. */
static symm_status share_id(symm_world *world, const symm_nccl_api *nc, ncclUniqueId *id)
{
    id_message msg;
    memset(&msg, 0, sizeof msg);
    if (symm_world_rank(world) == 0) {
        msg.status = symm_nccl_check(nc, NULL, nc->ncclGetUniqueId(&msg.id), "ncclGetUniqueId");
        if (msg.status != SYMM_OK) {
            symm_fail_context((symm_status)msg.status, "symm_nccl_create: rank 0: ");
            snprintf(msg.message, sizeof msg.message, "%s", symm_last_error());
        }
    }
    SYMM_TRY(symm_world_bcast(world, &msg, sizeof msg, 0));
    if (msg.status != SYMM_OK) {
        msg.message[sizeof msg.message - 1] = '\0';
        if (symm_world_rank(world) == 0)
            return symm_fail((symm_status)msg.status, "%s", msg.message);
        return symm_fail(SYMM_ERR_PEER, "symm_nccl_create: rank 0 failed (%s): %s",
                         symm_status_name((symm_status)msg.status), msg.message);
    }
    *id = msg.id;
    return SYMM_OK;
}

symm_status symm_nccl_create(symm_world *world, symm_device *dev, symm_nccl **out)
{
    if (!out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_nccl_create: out is NULL");
    *out = NULL;
    if (!world)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_nccl_create: world is NULL "
                         "(expected a world from symm_world_create)");
    if (!dev)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_nccl_create: dev is NULL (expected a "
                         "device from symm_device_open: NCCL runs on the rank's GPU)");
    if (symm_device_world(dev) != world)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_nccl_create: dev was opened on another "
                         "world than the one passed");
    int rank = symm_world_rank(world), ranks = symm_world_size(world);
    SYMM_TRY(symm_agree(world, refuse_shared_gpu(dev, ranks), "symm_nccl_create"));

    const symm_nccl_api *nc = NULL;
    symm_status st = symm_nccl_load(&nc);
    if (st == SYMM_OK)
        st = make_current(dev);
    if (st != SYMM_OK)
        symm_fail_context(st, "symm_nccl_create: rank %d: ", rank);
    SYMM_TRY(symm_agree(world, st, "symm_nccl_create"));
    ncclUniqueId id;
    SYMM_TRY(share_id(world, nc, &id));

    ncclComm_t comm = NULL;
    st = symm_nccl_check(nc, NULL, nc->ncclCommInitRank(&comm, ranks, id, rank),
                         "ncclCommInitRank");
    if (st != SYMM_OK) {
        symm_fail_context(st, "symm_nccl_create: rank %d: ", rank);
        comm = NULL;
    }
    symm_nccl *c = st == SYMM_OK ? calloc(1, sizeof *c) : NULL;
    if (st == SYMM_OK && !c)
        st = symm_fail(SYMM_ERR_NOMEM, "symm_nccl_create: rank %d: out of host memory", rank);
    st = symm_agree(world, st, "symm_nccl_create");
    if (st != SYMM_OK) {
        if (comm)
            nc->ncclCommAbort(comm);
        free(c);
        return st;
    }
    c->api = nc;
    c->comm = comm;
    *out = c;
    return SYMM_OK;
}

symm_status symm_nccl_abort(symm_nccl *c)
{
    if (!c)
        return SYMM_OK;
    symm_status st = symm_nccl_check(c->api, NULL, c->api->ncclCommAbort(c->comm),
                                     "symm_nccl_abort: ncclCommAbort");
    free(c);
    return st;
}

symm_status symm_nccl_destroy(symm_nccl *c)
{
    if (!c)
        return SYMM_OK;
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = c->api->ncclCommGetAsyncError(c->comm, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress))
        return symm_nccl_abort(c);
    symm_status st = symm_nccl_check(c->api, NULL, c->api->ncclCommDestroy(c->comm),
                                     "symm_nccl_destroy: ncclCommDestroy");
    free(c);
    return st;
}

void *symm_nccl_comm(const symm_nccl *c) { return c->comm; }

symm_status symm_nccl_check_async(symm_nccl *c)
{
    if (!c)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_nccl_check_async: nccl is NULL");
    ncclResult_t async = ncclSuccess;
    SYMM_TRY(symm_nccl_check(c->api, c->comm, c->api->ncclCommGetAsyncError(c->comm, &async),
                             "ncclCommGetAsyncError"));
    if (async == ncclSuccess || async == ncclInProgress)
        return SYMM_OK;
    return symm_nccl_check(c->api, c->comm, async, "NCCL communicator (asynchronous error)");
}
