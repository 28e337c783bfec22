/* heap.c: the rank's GPU (symm_device) and the symmetric heap over the CUDA
 * virtual memory API (symm_alloc).
 *
 * An allocation is made by a fixed sequence of steps, each either local
 * (driver calls on this rank) or collective (an exchange through the world).
 * After every local step the ranks compare outcomes (symm_agree), so that a
 * failure on one rank fails the call on every rank at the same step; then one
 * cleanup path (alloc_release) undoes whatever the alloc records as held, in
 * the order unmap view, unmap peers, free reservations, release handles,
 * close descriptors, free the peer table. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"
#include "heap_internal.h"
#include "symm_heap.h"

/* ---- all ranks fail together --------------------------------------------- */

#define OUTCOME_MESSAGE 1000

typedef struct outcome {
    int32_t status;
    char message[OUTCOME_MESSAGE];
} outcome;

symm_status symm_agree(symm_world *world, symm_status local, const char *call)
{
    int ranks = symm_world_size(world);
    outcome mine = {.status = local};
    char *saved = NULL;
    if (local != SYMM_OK) {
        snprintf(mine.message, sizeof mine.message, "%s", symm_last_error());
        saved = strdup(symm_last_error());
    }
    outcome *all = calloc((size_t)ranks, sizeof *all);
    symm_status st = all ? symm_world_allgather(world, &mine, all, sizeof mine)
                         : symm_fail(SYMM_ERR_NOMEM, "%s: out of host memory", call);
    if (local != SYMM_OK) {
        if (saved)
            symm_fail(local, "%s", saved);
        st = local;
    } else if (st == SYMM_OK) {
        for (int r = 0; r < ranks; r++) {
            if (all[r].status == SYMM_OK)
                continue;
            all[r].message[OUTCOME_MESSAGE - 1] = '\0';
            st = symm_fail(SYMM_ERR_PEER, "%s: rank %d failed (%s): %s", call, r,
                           symm_status_name((symm_status)all[r].status), all[r].message);
            break;
        }
    }
    free(saved);
    free(all);
    return st;
}

/* ---- the device ---------------------------------------------------------- */

struct symm_device {
    const symm_cuda_api *cu;
    symm_world *world;
    int rank, ranks;
    int ordinal;
    CUdevice device;
    CUcontext context;      /* the retained primary context; NULL if not retained */
    char name[128];
    int sm_count, cc_major, cc_minor;
    int mps;                /* CU_DEVICE_ATTRIBUTE_MPS_ENABLED */
    size_t granularity;
    int gpu_count;
    int *gpu_index;         /* [ranks]: which distinct GPU each rank runs on */
    uint64_t next_seq;      /* sequence number of the next symm_alloc_create */
    int live_allocs;        /* guarded by registry_lock */
};

/* Every live allocation of the process, for symm_alloc_find. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static symm_alloc *registry_head;

static symm_status device_attribute(const symm_device *dev, CUdevice_attribute which,
                                    const char *name, int *value)
{
    *value = 0;
    return symm_cuda_check(dev->cu->cuDeviceGetAttribute(value, which, dev->device), name);
}

static symm_status check_support(symm_device *dev)
{
    static const struct {
        CUdevice_attribute attr;
        const char *name, *what;
    } needed[] = {
        {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
         "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", "virtual memory management"},
        {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
         "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
         "sharing memory as POSIX file descriptors"},
    };
    for (size_t i = 0; i < SYMM_ARRAY_LEN(needed); i++) {
        int supported;
        SYMM_TRY(device_attribute(dev, needed[i].attr, needed[i].name, &supported));
        if (!supported)
            return symm_fail(SYMM_ERR_UNSUPPORTED,
                             "GPU %d (%s) does not support %s (%s is 0); the symmetric "
                             "heap needs it",
                             dev->ordinal, dev->name, needed[i].what, needed[i].name);
    }
    SYMM_TRY(device_attribute(dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                              "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", &dev->sm_count));
    /* A driver older than the attribute (CUDA 12.4) rejects it: no MPS known. */
    if (dev->cu->cuDeviceGetAttribute(&dev->mps, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, dev->device) != CUDA_SUCCESS)
        dev->mps = 0;
    SYMM_TRY(device_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                              "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", &dev->cc_major));
    return device_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                            "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", &dev->cc_minor);
}

static void alloc_prop(const symm_device *dev, CUmemAllocationProp *prop)
{
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = dev->ordinal;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

static size_t gcd_size(size_t a, size_t b)
{
    while (b) {
        size_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The recommended granularity, made a multiple of the minimum one (mapping
 * needs the minimum; the recommended one is faster). */
static symm_status query_granularity(symm_device *dev)
{
    CUmemAllocationProp prop;
    alloc_prop(dev, &prop);
    size_t minimum = 0, recommended = 0;
    SYMM_CU(dev->cu, cuMemGetAllocationGranularity(&minimum, &prop,
                                                   CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    SYMM_CU(dev->cu, cuMemGetAllocationGranularity(&recommended, &prop,
                                                   CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    if (minimum == 0)
        return symm_fail(SYMM_ERR_CUDA, "cuMemGetAllocationGranularity: GPU %d reports a "
                         "granularity of 0 bytes (expected > 0)", dev->ordinal);
    if (recommended == 0)
        recommended = minimum;
    dev->granularity = recommended / gcd_size(recommended, minimum) * minimum;
    return SYMM_OK;
}

/* Pick, check and make current this rank's GPU (no exchange yet). */
static symm_status open_local(symm_device *dev)
{
    SYMM_TRY(symm_cuda(&dev->cu));
    const symm_cuda_api *cu = dev->cu;
    int count = 0;
    SYMM_CU(cu, cuDeviceGetCount(&count));
    if (count <= 0) {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        return symm_fail(SYMM_ERR_NO_GPU, "no GPU: the driver sees no CUDA device "
                         "(CUDA_VISIBLE_DEVICES=%s)", visible ? visible : "(unset)");
    }
    int want = symm_world_device(dev->world);
    if (want < 0)
        want = symm_world_local_rank(dev->world);
    if (want < 0)
        want = 0;
    dev->ordinal = want % count;
    SYMM_CU(cu, cuDeviceGet(&dev->device, dev->ordinal));
    SYMM_CU(cu, cuDeviceGetName(dev->name, (int)sizeof dev->name, dev->device));
    SYMM_TRY(check_support(dev));
    CUcontext ctx = NULL;
    SYMM_CU(cu, cuDevicePrimaryCtxRetain(&ctx, dev->device));
    dev->context = ctx;
    SYMM_CU(cu, cuCtxSetCurrent(dev->context));
    return query_granularity(dev);
}

/* Which visible device of this process has uuid; false when none does. */
static symm_status find_visible(const symm_device *dev, const CUuuid *uuid, CUdevice *found,
                                bool *visible)
{
    int count = 0;
    *visible = false;
    SYMM_CU(dev->cu, cuDeviceGetCount(&count));
    for (int i = 0; i < count; i++) {
        CUdevice d;
        CUuuid u;
        SYMM_CU(dev->cu, cuDeviceGet(&d, i));
        SYMM_CU(dev->cu, cuDeviceGetUuid(&u, d));
        if (memcmp(u.bytes, uuid->bytes, sizeof u.bytes) == 0) {
            *found = d;
            *visible = true;
            return SYMM_OK;
        }
    }
    return SYMM_OK;
}

typedef struct gpu_info {
    CUuuid uuid;
    int32_t ordinal;
} gpu_info;

/* This rank's GPU must reach every other rank's GPU (its own row of the
 * pairs; the peer checks the other direction). */
static symm_status check_peers(const symm_device *dev, const gpu_info *gpus)
{
    for (int r = 0; r < dev->ranks; r++) {
        if (dev->gpu_index[r] == dev->gpu_index[dev->rank])
            continue;
        CUdevice peer = 0;
        bool visible;
        SYMM_TRY(find_visible(dev, &gpus[r].uuid, &peer, &visible));
        if (!visible)
            continue;
        int can = 0;
        SYMM_CU(dev->cu, cuDeviceCanAccessPeer(&can, dev->device, peer));
        if (!can)
            return symm_fail(SYMM_ERR_UNSUPPORTED,
                             "rank %d's GPU %d (%s) cannot access rank %d's GPU (device %d here; "
                             "cuDeviceCanAccessPeer is 0): the symmetric heap needs peer access "
                             "between the GPUs of every pair of ranks",
                             dev->rank, dev->ordinal, dev->name, r, (int)peer);
    }
    return SYMM_OK;
}

/* Collective: learn every rank's GPU, number the distinct ones, check that
 * every pair can reach each other. */
static symm_status exchange_gpus(symm_device *dev)
{
    gpu_info mine = {.ordinal = dev->ordinal};
    symm_status st = symm_cuda_check(dev->cu->cuDeviceGetUuid(&mine.uuid, dev->device),
                                     "cuDeviceGetUuid");
    SYMM_TRY(symm_agree(dev->world, st, "symm_device_open"));
    gpu_info *gpus = calloc((size_t)dev->ranks, sizeof *gpus);
    if (!gpus)
        return symm_fail(SYMM_ERR_NOMEM, "symm_device_open: out of host memory");
    st = symm_world_allgather(dev->world, &mine, gpus, sizeof mine);
    if (st != SYMM_OK) {
        free(gpus);
        return symm_fail_context(st, "symm_device_open: exchanging GPU ids: ");
    }
    dev->gpu_count = 0;
    for (int r = 0; r < dev->ranks; r++) {
        int first = r;
        for (int q = 0; q < r && first == r; q++)
            if (memcmp(gpus[q].uuid.bytes, gpus[r].uuid.bytes, sizeof gpus[r].uuid.bytes) == 0)
                first = q;
        dev->gpu_index[r] = first < r ? dev->gpu_index[first] : dev->gpu_count++;
    }
    st = check_peers(dev, gpus);
    free(gpus);
    if (st != SYMM_OK)
        symm_fail_context(st, "symm_device_open: ");
    return symm_agree(dev->world, st, "symm_device_open");
}

static symm_status device_release(symm_device *dev)
{
    symm_status st = SYMM_OK;
    if (dev->context)
        st = symm_cuda_check(dev->cu->cuDevicePrimaryCtxRelease(dev->device),
                             "symm_device_close: cuDevicePrimaryCtxRelease");
    free(dev->gpu_index);
    free(dev);
    return st;
}

symm_status symm_device_open(symm_world *world, symm_device **out)
{
    if (!out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_device_open: out is NULL");
    *out = NULL;
    if (!world)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_device_open: world is NULL (expected a "
                         "world from symm_world_create)");
    symm_device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return symm_fail(SYMM_ERR_NOMEM, "symm_device_open: out of host memory");
    dev->world = world;
    dev->rank = symm_world_rank(world);
    dev->ranks = symm_world_size(world);
    dev->gpu_index = calloc((size_t)dev->ranks, sizeof *dev->gpu_index);
    symm_status st = dev->gpu_index ? open_local(dev)
                                    : symm_fail(SYMM_ERR_NOMEM, "out of host memory");
    if (st != SYMM_OK)
        symm_fail_context(st, "symm_device_open: rank %d: ", dev->rank);
    st = symm_agree(world, st, "symm_device_open");
    if (st == SYMM_OK)
        st = exchange_gpus(dev);
    if (st != SYMM_OK) {
        char *saved = strdup(symm_last_error());
        device_release(dev);
        if (saved)
            symm_fail(st, "%s", saved);
        free(saved);
        return st;
    }
    *out = dev;
    return SYMM_OK;
}

symm_status symm_device_close(symm_device *dev)
{
    if (!dev)
        return SYMM_OK;
    pthread_mutex_lock(&registry_lock);
    int live = dev->live_allocs;
    pthread_mutex_unlock(&registry_lock);
    if (live > 0)
        return symm_fail(SYMM_ERR_STATE, "symm_device_close: %d symmetric allocation%s made on "
                         "this device %s still live (destroy them first)",
                         live, live == 1 ? "" : "s", live == 1 ? "is" : "are");
    return device_release(dev);
}

CUdevice symm_device_handle(const symm_device *dev) { return dev->device; }
CUcontext symm_device_context(const symm_device *dev) { return dev->context; }
int symm_device_ordinal(const symm_device *dev) { return dev->ordinal; }
int symm_device_sm_count(const symm_device *dev) { return dev->sm_count; }
int symm_device_cc_major(const symm_device *dev) { return dev->cc_major; }
int symm_device_cc_minor(const symm_device *dev) { return dev->cc_minor; }
size_t symm_device_granularity(const symm_device *dev) { return dev->granularity; }
symm_world *symm_device_world(const symm_device *dev) { return dev->world; }
int symm_device_gpu_count(const symm_device *dev) { return dev->gpu_count; }

bool symm_device_mps(const symm_device *dev) { return dev->mps != 0; }

int symm_device_ranks_here(const symm_device *dev)
{
    int n = 0;
    for (int r = 0; r < dev->ranks; r++)
        n += dev->gpu_index[r] == dev->gpu_index[dev->rank];
    return n;
}

int symm_device_gpu_index(const symm_device *dev, int rank)
{
    return rank >= 0 && rank < dev->ranks ? dev->gpu_index[rank] : -1;
}

/* Make dev's context current for the duration of a call from any thread. */
static symm_status context_enter(const symm_device *dev, CUcontext *saved)
{
    SYMM_CU(dev->cu, cuCtxGetCurrent(saved));
    if (*saved != dev->context)
        SYMM_CU(dev->cu, cuCtxSetCurrent(dev->context));
    return SYMM_OK;
}

static void context_leave(const symm_device *dev, CUcontext saved)
{
    if (saved != dev->context)
        dev->cu->cuCtxSetCurrent(saved);
}

/* ---- allocations --------------------------------------------------------- */

/* What this rank holds of rank r's buffer. */
typedef struct peer_mapping {
    CUmemGenericAllocationHandle handle;
    bool held;          /* handle to release */
    CUdeviceptr base;   /* reservation of bytes; 0 when none */
    bool mapped;        /* handle mapped at base */
    bool in_view;       /* handle mapped at view + r * bytes */
    int fd;             /* rank r's descriptor until imported; -1 when none */
} peer_mapping;

struct symm_alloc {
    symm_world *world;
    symm_device *dev;
    int rank, ranks;
    uint64_t seq;
    unsigned flags;
    size_t requested;
    size_t bytes;       /* rounded: the size of every mapping and the view's stride */
    size_t align;       /* the largest granularity among the ranks */
    int export_fd;      /* this rank's handle as a descriptor; -1 when closed */
    peer_mapping *peers;
    CUdeviceptr view;   /* reservation of ranks * bytes; 0 when none */
    CUdeviceptr table;  /* device array of the ranks' bases */
    bool registered;
    symm_alloc *next;
};

static void registry_add(symm_alloc *a)
{
    pthread_mutex_lock(&registry_lock);
    a->next = registry_head;
    registry_head = a;
    a->registered = true;
    a->dev->live_allocs++;
    pthread_mutex_unlock(&registry_lock);
}

static void registry_remove(symm_alloc *a)
{
    pthread_mutex_lock(&registry_lock);
    for (symm_alloc **p = &registry_head; *p; p = &(*p)->next) {
        if (*p == a) {
            *p = a->next;
            break;
        }
    }
    a->registered = false;
    a->dev->live_allocs--;
    pthread_mutex_unlock(&registry_lock);
}

symm_status symm_heap_round_up(size_t bytes, size_t granularity, size_t *out)
{
    if (!out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_heap_round_up: out is NULL");
    if (bytes == 0)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_heap_round_up: bytes is 0 (expected > 0)");
    if (granularity == 0)
        return symm_fail(SYMM_ERR_INVALID_ARG,
                         "symm_heap_round_up: granularity is 0 (expected > 0)");
    size_t rest = bytes % granularity;
    size_t pad = rest ? granularity - rest : 0;
    if (bytes > SIZE_MAX - pad)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_heap_round_up: %zu bytes rounded up to a "
                         "multiple of %zu do not fit in size_t", bytes, granularity);
    *out = bytes + pad;
    return SYMM_OK;
}

/* Record a failed release step; only the first one's message is kept, and
 * none when quiet (an earlier error is being reported). */
static void note(symm_status *first, bool quiet, CUresult result, const char *what)
{
    if (result == CUDA_SUCCESS || *first != SYMM_OK)
        return;
    *first = quiet ? SYMM_ERR_CUDA : symm_cuda_check(result, what);
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* The one cleanup path: undo whatever a records as held, then free it. */
static symm_status alloc_release(symm_alloc *a, bool quiet)
{
    const symm_cuda_api *cu = a->dev->cu;
    symm_status first = SYMM_OK;
    if (a->registered)
        registry_remove(a);
    for (int r = 0; r < a->ranks; r++)
        if (a->peers[r].in_view)
            note(&first, quiet, cu->cuMemUnmap(a->view + (CUdeviceptr)r * a->bytes, a->bytes),
                 "cuMemUnmap (view)");
    if (a->view)
        note(&first, quiet, cu->cuMemAddressFree(a->view, a->bytes * (size_t)a->ranks),
             "cuMemAddressFree (view)");
    for (int r = 0; r < a->ranks; r++)
        if (a->peers[r].mapped)
            note(&first, quiet, cu->cuMemUnmap(a->peers[r].base, a->bytes), "cuMemUnmap");
    for (int r = 0; r < a->ranks; r++)
        if (a->peers[r].base)
            note(&first, quiet, cu->cuMemAddressFree(a->peers[r].base, a->bytes),
                 "cuMemAddressFree");
    for (int r = 0; r < a->ranks; r++)
        if (a->peers[r].held)
            note(&first, quiet, cu->cuMemRelease(a->peers[r].handle), "cuMemRelease");
    close_fd(&a->export_fd);
    for (int r = 0; r < a->ranks; r++)
        close_fd(&a->peers[r].fd);
    if (a->table)
        note(&first, quiet, cu->cuMemFree(a->table), "cuMemFree (peer table)");
    free(a->peers);
    free(a);
    return first;
}

typedef struct alloc_shape {
    uint64_t seq, requested, granularity;
    uint32_t flags, pad;
} alloc_shape;

/* Every rank gets every rank's shape, so every rank reaches the same verdict
 * without another exchange. */
static symm_status check_shapes(const symm_alloc *a, const alloc_shape *all)
{
    /* Each rank's own arguments, checked here rather than before the
     * collective: a rank that returned early would leave the others waiting
     * in it until their timeout. */
    for (int r = 0; r < a->ranks; r++) {
        if (all[r].requested == 0)
            return symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_create: allocation #%llu: rank %d passed bytes 0 "
                             "(expected > 0)", (unsigned long long)all[r].seq, r);
        if (all[r].flags & ~SYMM_ALLOC_CONTIGUOUS)
            return symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_create: allocation #%llu: rank %d passed flags "
                             "0x%x: unknown bits 0x%x (expected 0 or SYMM_ALLOC_CONTIGUOUS)",
                             (unsigned long long)all[r].seq, r, all[r].flags, all[r].flags & ~SYMM_ALLOC_CONTIGUOUS);
    }
    for (int r = 1; r < a->ranks; r++)
        if (all[r].seq != all[0].seq)
            return symm_fail(SYMM_ERR_MISMATCH, "symm_alloc_create: ranks disagree on which "
                             "allocation this is: rank 0 is making allocation #%llu, rank %d "
                             "allocation #%llu (every rank must make the same symm_alloc_create "
                             "calls in the same order)", (unsigned long long)all[0].seq, r,
                             (unsigned long long)all[r].seq);
    for (int r = 1; r < a->ranks; r++)
        if (all[r].requested != all[0].requested)
            return symm_fail(SYMM_ERR_MISMATCH, "symm_alloc_create: allocation #%llu: rank 0 "
                             "asked for %llu bytes, rank %d for %llu bytes (expected the same "
                             "size on every rank)", (unsigned long long)all[0].seq,
                             (unsigned long long)all[0].requested, r,
                             (unsigned long long)all[r].requested);
    for (int r = 1; r < a->ranks; r++)
        if (all[r].flags != all[0].flags)
            return symm_fail(SYMM_ERR_MISMATCH, "symm_alloc_create: allocation #%llu: rank 0 "
                             "passed flags 0x%x, rank %d flags 0x%x (expected the same flags on "
                             "every rank)", (unsigned long long)all[0].seq, all[0].flags, r,
                             all[r].flags);
    return SYMM_OK;
}

/* Collective: agree on sequence, size and flags; round the size. */
static symm_status agree_shape(symm_alloc *a)
{
    alloc_shape mine = {.seq = a->seq, .requested = a->requested,
                        .granularity = a->dev->granularity, .flags = a->flags};
    alloc_shape *all = calloc((size_t)a->ranks, sizeof *all);
    if (!all)
        return symm_fail(SYMM_ERR_NOMEM, "symm_alloc_create: out of host memory");
    symm_status st = symm_world_allgather(a->world, &mine, all, sizeof mine);
    if (st != SYMM_OK) {
        free(all);
        return symm_fail_context(st, "symm_alloc_create: allocation #%llu: ",
                                 (unsigned long long)a->seq);
    }
    st = check_shapes(a, all);
    a->align = 0;
    for (int r = 0; r < a->ranks; r++)
        if (all[r].granularity > a->align)
            a->align = all[r].granularity;
    free(all);
    SYMM_TRY(st);
    st = symm_heap_round_up(a->requested, a->align, &a->bytes);
    if (st != SYMM_OK)
        return symm_fail_context(st, "symm_alloc_create: allocation #%llu: ",
                                 (unsigned long long)a->seq);
    if ((a->flags & SYMM_ALLOC_CONTIGUOUS) && a->bytes > SIZE_MAX / (size_t)a->ranks)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_create: allocation #%llu: a "
                         "contiguous view of %d x %zu bytes does not fit in the address space",
                         (unsigned long long)a->seq, a->ranks, a->bytes);
    return SYMM_OK;
}

static symm_status create_local(symm_alloc *a)
{
    const symm_cuda_api *cu = a->dev->cu;
    CUmemAllocationProp prop;
    alloc_prop(a->dev, &prop);
    peer_mapping *own = &a->peers[a->rank];
    SYMM_CU(cu, cuMemCreate(&own->handle, a->bytes, &prop, 0));
    own->held = true;
    int fd = -1;
    SYMM_CU(cu, cuMemExportToShareableHandle(&fd, own->handle,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    a->export_fd = fd;
    return SYMM_OK;
}

/* Collective. The exported descriptor stays open until the next agreement,
 * when every peer has imported it. */
static symm_status exchange_fds(symm_alloc *a)
{
    int *fds = malloc((size_t)a->ranks * sizeof *fds);
    if (!fds)
        return symm_fail(SYMM_ERR_NOMEM, "symm_alloc_create: out of host memory");
    for (int r = 0; r < a->ranks; r++)
        fds[r] = -1;
    symm_status st = symm_world_allgather_fd(a->world, a->export_fd, fds);
    if (st == SYMM_OK) {
        for (int r = 0; r < a->ranks; r++)
            a->peers[r].fd = fds[r];
        close_fd(&a->peers[a->rank].fd);
    } else {
        symm_fail_context(st, "symm_alloc_create: allocation #%llu: exchanging handles: ",
                          (unsigned long long)a->seq);
    }
    free(fds);
    return st;
}

static symm_status grant_access(const symm_alloc *a, CUdeviceptr va)
{
    CUmemAccessDesc desc;
    memset(&desc, 0, sizeof desc);
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = a->dev->ordinal;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    SYMM_CU(a->dev->cu, cuMemSetAccess(va, a->bytes, &desc, 1));
    return SYMM_OK;
}

static symm_status map_peer(symm_alloc *a, int r)
{
    const symm_cuda_api *cu = a->dev->cu;
    peer_mapping *p = &a->peers[r];
    if (r != a->rank) {
        SYMM_CU(cu, cuMemImportFromShareableHandle(&p->handle, (void *)(uintptr_t)p->fd,
                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        p->held = true;
        close_fd(&p->fd);
    }
    CUdeviceptr va = 0;
    SYMM_CU(cu, cuMemAddressReserve(&va, a->bytes, a->align, 0, 0));
    p->base = va;
    SYMM_CU(cu, cuMemMap(p->base, a->bytes, 0, p->handle, 0));
    p->mapped = true;
    return grant_access(a, p->base);
}

static symm_status map_view(symm_alloc *a)
{
    const symm_cuda_api *cu = a->dev->cu;
    CUdeviceptr va = 0;
    SYMM_CU(cu, cuMemAddressReserve(&va, a->bytes * (size_t)a->ranks, a->align, 0, 0));
    a->view = va;
    for (int r = 0; r < a->ranks; r++) {
        CUdeviceptr slot = a->view + (CUdeviceptr)r * a->bytes;
        SYMM_CU(cu, cuMemMap(slot, a->bytes, 0, a->peers[r].handle, 0));
        a->peers[r].in_view = true;
        SYMM_TRY(grant_access(a, slot));
    }
    return SYMM_OK;
}

static symm_status fill_peer_table(symm_alloc *a)
{
    const symm_cuda_api *cu = a->dev->cu;
    size_t bytes = (size_t)a->ranks * sizeof(unsigned long long);
    unsigned long long *bases = malloc(bytes);
    if (!bases)
        return symm_fail(SYMM_ERR_NOMEM, "out of host memory");
    for (int r = 0; r < a->ranks; r++)
        bases[r] = a->peers[r].base;
    CUdeviceptr table = 0;
    symm_status st = symm_cuda_check(cu->cuMemAlloc(&table, bytes), "cuMemAlloc (peer table)");
    if (st == SYMM_OK) {
        a->table = table;
        st = symm_cuda_check(cu->cuMemcpyHtoD(a->table, bases, bytes), "cuMemcpyHtoD (peer table)");
    }
    free(bases);
    return st;
}

/* Local: map every rank's buffer, the view and the table; zero our buffer
 * and wait for it, so that after the next agreement nobody reads garbage. */
static symm_status map_all(symm_alloc *a)
{
    for (int r = 0; r < a->ranks; r++) {
        symm_status st = map_peer(a, r);
        if (st != SYMM_OK)
            return symm_fail_context(st, "mapping rank %d's buffer: ", r);
    }
    if (a->flags & SYMM_ALLOC_CONTIGUOUS) {
        symm_status st = map_view(a);
        if (st != SYMM_OK)
            return symm_fail_context(st, "mapping the contiguous view: ");
    }
    SYMM_TRY(fill_peer_table(a));
    SYMM_CU(a->dev->cu, cuMemsetD8(a->peers[a->rank].base, 0, a->bytes));
    SYMM_CU(a->dev->cu, cuCtxSynchronize());
    return SYMM_OK;
}

static symm_status local_step(const symm_alloc *a, symm_status st)
{
    if (st == SYMM_OK)
        return st;
    return symm_fail_context(st, "symm_alloc_create: rank %d: allocation #%llu (%zu bytes): ",
                             a->rank, (unsigned long long)a->seq, a->bytes);
}

static symm_status create_steps(symm_alloc *a, CUcontext *saved, bool *entered)
{
    SYMM_TRY(agree_shape(a));
    symm_status st = context_enter(a->dev, saved);
    *entered = st == SYMM_OK;
    if (st == SYMM_OK)
        st = create_local(a);
    SYMM_TRY(symm_agree(a->world, local_step(a, st), "symm_alloc_create"));
    SYMM_TRY(exchange_fds(a));
    /* Every rank has zeroed its buffer when this agreement returns: it is
     * the barrier after which peers may write. */
    SYMM_TRY(symm_agree(a->world, local_step(a, map_all(a)), "symm_alloc_create"));
    close_fd(&a->export_fd);
    return SYMM_OK;
}

/* The first thing wrong when world or dev cannot be used (then no collective
 * is possible and the call fails on this rank alone). */
static symm_status check_create_args(symm_world *world, symm_device *dev, size_t bytes,
                                     unsigned flags)
{
    if (!world)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_create: world is NULL "
                         "(expected a world from symm_world_create)");
    if (bytes == 0)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_create: bytes is 0 (expected > 0)");
    if (flags & ~SYMM_ALLOC_CONTIGUOUS)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_create: flags 0x%x: unknown bits "
                         "0x%x (expected 0 or SYMM_ALLOC_CONTIGUOUS)", flags,
                         flags & ~SYMM_ALLOC_CONTIGUOUS);
    if (!dev)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_create: dev is NULL "
                         "(expected a device from symm_device_open)");
    if (dev->world != world)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_create: dev was opened on another "
                         "world than the one passed");
    return SYMM_OK;
}

void symm_hosts_text(const symm_world *world, char *buf, size_t n)
{
    int hosts = symm_world_host_count(world);
    size_t used = (size_t)snprintf(buf, n, "%d hosts (", hosts);
    for (int h = 0; h < hosts && used < n; h++) {
        const char *id = symm_world_host_name(world, h), *boot = strstr(id, " (boot ");
        if (h == 8) {
            used += (size_t)snprintf(buf + used, n - used, ", ...");
            break;
        }
        used += (size_t)snprintf(buf + used, n - used, "%s%.*s", h ? ", " : "",
                                 boot ? (int)(boot - id) : (int)strlen(id), id);
    }
    if (used < n)
        snprintf(buf + used, n - used, ")");
}

symm_status symm_alloc_create(symm_world *world, symm_device *dev, size_t bytes,
                              unsigned flags, symm_alloc **out)
{
    if (!out)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_create: out is NULL");
    *out = NULL;
    /* Every rank knows its world's hosts: all refuse alike, nobody waits. */
    if (world && symm_world_host_count(world) > 1) {
        char hosts[640];
        symm_hosts_text(world, hosts, sizeof hosts);
        return symm_fail(SYMM_ERR_UNSUPPORTED, "symm_alloc_create: the world spans %s, and GPU memory is "
                         "shared among the ranks of one host: allocate on symm_world_host_world(world)", hosts);
    }
    /* Every call with a usable device takes a sequence number, failed or
     * not, so that ranks stay in step after an error on some of them. */
    uint64_t seq = 0;
    if (world && dev && dev->world == world)
        seq = dev->next_seq++;
    else
        return check_create_args(world, dev, bytes, flags);
    /* bytes and flags: every rank hears of a bad one (check_shapes). */

    symm_alloc *a = calloc(1, sizeof *a);
    peer_mapping *peers = calloc((size_t)dev->ranks, sizeof *peers);
    if (!a || !peers) {
        free(a);
        free(peers);
        return symm_fail(SYMM_ERR_NOMEM, "symm_alloc_create: out of host memory");
    }
    *a = (symm_alloc){.world = world, .dev = dev, .rank = dev->rank, .ranks = dev->ranks,
                      .seq = seq, .flags = flags, .requested = bytes, .export_fd = -1,
                      .peers = peers};
    for (int r = 0; r < a->ranks; r++)
        peers[r].fd = -1;

    CUcontext saved = NULL;
    bool entered = false;
    symm_status st = create_steps(a, &saved, &entered);
    if (st != SYMM_OK)
        alloc_release(a, true);
    else
        registry_add(a);
    if (entered)
        context_leave(dev, saved);
    if (st == SYMM_OK)
        *out = a;
    return st;
}

symm_status symm_alloc_destroy(symm_alloc *a)
{
    if (!a)
        return SYMM_OK;
    const symm_device *dev = a->dev;
    if (a->registered)
        registry_remove(a);
    CUcontext saved = NULL;
    symm_status st = context_enter(dev, &saved);
    bool entered = st == SYMM_OK;
    /* Our own kernels must be done with the peers' memory before we tell
     * them we are. */
    if (st == SYMM_OK)
        st = symm_cuda_check(dev->cu->cuCtxSynchronize(), "cuCtxSynchronize");
    symm_status barrier = symm_world_barrier(a->world);
    if (st == SYMM_OK)
        st = barrier;
    if (st != SYMM_OK)
        symm_fail_context(st, "symm_alloc_destroy: allocation #%llu: ",
                          (unsigned long long)a->seq);
    symm_status released = alloc_release(a, st != SYMM_OK);
    if (released != SYMM_OK && st == SYMM_OK)
        st = symm_fail_context(released, "symm_alloc_destroy: ");
    if (entered)
        context_leave(dev, saved);
    return st;
}

CUdeviceptr symm_alloc_local(const symm_alloc *a) { return a->peers[a->rank].base; }

CUdeviceptr symm_alloc_peer(const symm_alloc *a, int rank)
{
    return rank >= 0 && rank < a->ranks ? a->peers[rank].base : 0;
}

CUdeviceptr symm_alloc_peer_table(const symm_alloc *a) { return a->table; }
CUdeviceptr symm_alloc_view(const symm_alloc *a) { return a->view; }
size_t symm_alloc_stride(const symm_alloc *a) { return a->view ? a->bytes : 0; }
size_t symm_alloc_size(const symm_alloc *a) { return a->bytes; }
size_t symm_alloc_requested(const symm_alloc *a) { return a->requested; }
uint64_t symm_alloc_seq(const symm_alloc *a) { return a->seq; }
symm_world *symm_alloc_world(const symm_alloc *a) { return a->world; }
symm_device *symm_alloc_device(const symm_alloc *a) { return a->dev; }

symm_status symm_alloc_find(CUdeviceptr ptr, size_t bytes, symm_alloc **owner, size_t *offset)
{
    if (!owner || !offset)
        return symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_find: %s is NULL",
                         owner ? "offset" : "owner");
    *owner = NULL;
    *offset = 0;
    pthread_mutex_lock(&registry_lock);
    symm_alloc *hit = NULL;
    int live = 0;
    for (symm_alloc *a = registry_head; a; a = a->next, live++) {
        CUdeviceptr base = symm_alloc_local(a);
        if (ptr >= base && ptr - base < a->bytes)
            hit = a;
    }
    symm_status st = SYMM_OK;
    if (!hit) {
        st = symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_find: 0x%llx (%zu bytes) is not inside "
                       "the local buffer of any live symmetric allocation of this process "
                       "(%d live)", (unsigned long long)ptr, bytes, live);
    } else {
        size_t off = (size_t)(ptr - symm_alloc_local(hit));
        if (bytes > hit->bytes - off)
            st = symm_fail(SYMM_ERR_INVALID_ARG, "symm_alloc_find: 0x%llx + %zu bytes runs %zu "
                           "bytes past the end of symmetric allocation #%llu [0x%llx, 0x%llx)",
                           (unsigned long long)ptr, bytes, bytes - (hit->bytes - off),
                           (unsigned long long)hit->seq,
                           (unsigned long long)symm_alloc_local(hit),
                           (unsigned long long)(symm_alloc_local(hit) + hit->bytes));
        else {
            *owner = hit;
            *offset = off;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return st;
}
