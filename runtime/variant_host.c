/* variant_host.c: the host side shared by the NCCL and hybrid backends
 * (variant_host.h). */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "variant_host.h"
#include "world_internal.h"

void symm_vhost_init(symm_vhost *h, const char *backend, symm_vhost_sticky sticky)
{
    memset(h, 0, sizeof *h);
    h->backend = backend;
    h->sticky = sticky;
}

void symm_vhost_release(symm_vhost *h, const symm_cuda_api *cu, void *const *hosts, size_t n_hosts,
                        const CUdeviceptr *devs, size_t n_devs)
{
    if (cu) {
        for (size_t i = 0; i < n_hosts; i++)
            if (hosts[i])
                cu->cuMemFreeHost(hosts[i]);
        for (size_t i = 0; i < n_devs; i++)
            if (devs[i])
                cu->cuMemFree(devs[i]);
        if (h->done)
            cu->cuEventDestroy(h->done);
        h->done = NULL;
    }
    if (h->comm)
        symm_nccl_destroy(h->comm);
    h->comm = NULL;
}

symm_status symm_vhost_host_alloc(const symm_vhost *h, const symm_cuda_api *cu, void *out, size_t bytes)
{
    char what[96];
    snprintf(what, sizeof what, "cuMemAllocHost (%s)", h->backend);
    return symm_cuda_check(cu->cuMemAllocHost((void **)out, bytes ? bytes : 16), what);
}

symm_status symm_vhost_dev_alloc(const symm_vhost *h, const symm_cuda_api *cu, CUdeviceptr *out, size_t bytes)
{
    char what[96];
    snprintf(what, sizeof what, "cuMemAlloc (%s)", h->backend);
    return symm_cuda_check(cu->cuMemAlloc(out, bytes ? bytes : 16), what);
}

symm_status symm_vhost_fail(symm_vhost *h, symm_status st)
{
    h->failed = st;
    snprintf(h->failure, sizeof h->failure, "%s", symm_last_error());
    if (h->comm) {
        symm_nccl_abort(h->comm);
        h->comm = NULL;
    }
    return symm_fail(st, "%s", h->failure);
}

symm_status symm_vhost_failure(const symm_vhost *h, const symm_variant *v, const char *op)
{
    if (!h || !h->failed)
        return SYMM_OK;
    return symm_fail(h->failed, "%s %s (%s): an earlier call failed: %s", v->desc->name, op, h->backend,
                     h->failure);
}

/* A failed wait: sticky here or by the caller (symm_vhost_sticky). */
static symm_status wait_failed(symm_vhost *h, symm_status st)
{
    return h->sticky == SYMM_VHOST_WAIT_STICKY ? symm_vhost_fail(h, st) : st;
}

symm_status symm_vhost_wait(symm_vhost *h, const symm_variant *v, const symm_cuda_api *cu, CUstream stream,
                            bool use_stream, const char *what)
{
    const double t0 = symm_wio_now(), limit = (double)v->timeout_ns * 1e-9;
    for (unsigned polls = 0;; polls++) {
        CUresult r = use_stream ? cu->cuStreamQuery(stream) : cu->cuEventQuery(h->done);
        if (r == CUDA_SUCCESS)
            return SYMM_OK;
        if (r != CUDA_ERROR_NOT_READY)
            return symm_cuda_check(r, use_stream ? "cuStreamQuery" : "cuEventQuery");
        if (h->comm && symm_nccl_check_async(h->comm) != SYMM_OK)
            return wait_failed(h, symm_fail_context(SYMM_ERR_NCCL, "rank %d: waiting for %s: ", v->rank, what));
        const double waited = symm_wio_now() - t0;
        if (waited > limit)
            return wait_failed(h, symm_fail(SYMM_ERR_TIMEOUT,
                                            "rank %d: %s did not complete within the variant's timeout of %g s: a "
                                            "peer did not arrive (NCCL cannot tell which); destroy the variant",
                                            v->rank, what, limit));
        /* Spin for the first 200 us (a dispatch's waits are that short),
         * then give the CPU away between polls. */
        if (waited > 200e-6) {
            if (polls % 16 == 0) {
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            } else {
                sched_yield();
            }
        }
    }
}

symm_status symm_vhost_refuse_capture(const symm_variant *v, const symm_cuda_api *cu, CUstream stream,
                                      const char *op, const char *reason)
{
    CUstreamCaptureStatus status;
    SYMM_CU(cu, cuStreamIsCapturing(stream, &status));
    if (status != CU_STREAM_CAPTURE_STATUS_NONE)
        return symm_fail(SYMM_ERR_STATE, "%s %s: %s", v->desc->name, op, reason);
    return SYMM_OK;
}

symm_status symm_vhost_group_end(const symm_nccl_api *nc, ncclComm_t comm, symm_status st)
{
    const symm_status end = symm_nccl_check(nc, comm, nc->ncclGroupEnd(), "ncclGroupEnd");
    return st != SYMM_OK ? st : end;
}

unsigned symm_vhost_grid(int64_t items, int per_block)
{
    enum { MAX_BLOCKS = 4096 };
    if (items <= 0)
        return 1;
    /* Rounded up without items + per_block - 1, which overflows near INT64_MAX. */
    const int64_t blocks = items / per_block + (items % per_block != 0);
    return (unsigned)(blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS);
}
