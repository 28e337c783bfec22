/* variant_internal.h: the state of a created variant, shared by variant.c
 * (native backend), variant_nccl.c (NCCL backend) and variant_hybrid.c
 * (hybrid backend). Internal. */
#ifndef SYMM_VARIANT_INTERNAL_H
#define SYMM_VARIANT_INTERNAL_H

#include <stdbool.h>

#include "symm_heap.h"
#include "symm_variant.h"

struct symm_variant_nccl;
struct symm_variant_hybrid;

/* Mirror of State in templates/variant.cu.in: the variant's local record of
 * the last dispatch (sequence number, T, statistics, sticky error). */
typedef struct device_state {
    uint64_t seq;
    int32_t tokens, recv_rows, invalid, dropped_send, dropped_recv, clamped;
    int32_t err_code, err_peer, err_phase, combine_next;
    uint64_t err_seq;
    int32_t own_first, own_end;
    uint64_t pulls;
    int32_t push_next, pad;
} device_state;
_Static_assert(sizeof(device_state) == 80, "device_state mirrors State in variant.cu.in");

/* State.err_code: the sticky device error. */
enum {
    SYMM_DEVICE_ERR_TIMEOUT = 1,     /* a wait for err_peer gave up */
    SYMM_DEVICE_ERR_PULLED_PUSH = 2, /* combine = "auto": this rank pulled, err_peer pushed */
    SYMM_DEVICE_ERR_PUSHED_PULL = 3, /* combine = "auto": this rank pushed, err_peer pulled */
};

/* The profile's slots and what they become: profile.h. */

struct symm_variant {
    symm_world *world;
    const symm_variant_desc *desc;
    symm_backend backend;
    int rank;
    int64_t timeout_ns;
    symm_device *dev;
    symm_device *host_dev;     /* on a world across hosts: dev's GPU on the host world (alloc's) */
    symm_alloc *alloc;         /* the symmetric buffer (desc->symmetric_bytes), on the host world */
    CUdeviceptr scratch;       /* local scratch (desc->scratch_bytes) */
    CUmodule module;           /* part 2: combine */
    CUmodule module_dispatch;  /* part 1: dispatch */
    CUmodule module_nccl;      /* part 3: the NCCL and hybrid backends' kernels (those backends only) */
    CUmodule module_pull;      /* part 4: combine = "auto": the pulling combine (native backend only) */
    CUfunction fn_dispatch, fn_combine;             /* native backend (combine = "auto": the pushing one) */
    CUfunction fn_combine_pull;                     /* native backend, combine = "auto": the pulling one */
    CUfunction fn_nccl_scatter, fn_nccl_count, fn_nccl_scan, fn_nccl_pack, fn_nccl_gather, fn_nccl_unstage,
        fn_nccl_restage, fn_count_experts,
        fn_reduce; /* NCCL backend (the hybrid uses fn_nccl_gather) */
    CUfunction fn_hybrid_src, fn_hybrid_sum; /* hybrid backend */
    unsigned dispatch_smem, combine_smem, combine_pull_smem; /* dynamic shared memory of the kernels
                                                                 (bulk-copy buffers) */
    bool awaiting_combine;     /* a dispatch was issued; its combine was not */
    int profile;               /* the tuning knob PROFILE: 0, 1 or 2 (symm_variant_profile_read) */
    bool pdl;                  /* dispatch and combine launched as programmatic dependents (tune PDL) */
    double jit_ms;
    bool jit_cache_hit;
    struct symm_variant_nccl *nccl; /* NCCL backend state, or NULL */
    struct symm_variant_hybrid *hybrid; /* hybrid backend state, or NULL */
    /* Called with on_destroy_arg after the variant is freed: symm_variant_open
     * (manifest.c) closes the manifest that owns desc. */
    void (*on_destroy)(void *arg);
    void *on_destroy_arg;
};

/* Descriptors (manifest.c). d's parameters and regions are those its CUDA
 * source was generated with (the source's constants: HIDDEN, ...,
 * RECV_X_OFF, RECV_X_BYTES, ...); else SYMM_ERR_MISMATCH naming the first
 * field that differs. The kernels use the source's values and the host the
 * descriptor's, so the two must agree before any buffer is sized. */
symm_status symm_desc_check_source(const symm_variant_desc *d);

/* The manifest's name of region id (SYMM_REGION_*), "?" out of range. */
const char *symm_region_name(int id);

/* NCCL backend (variant_nccl.c). symm_variant_dispatch and _combine refuse
 * stream capture (symm_variant_nccl_refuse_capture) before they call
 * symm_variant_nccl_dispatch and _combine; combine also checks
 * symm_variant_nccl_failure first. */
symm_status symm_variant_nccl_setup(symm_variant *v);
/* SYMM_OK, or the NCCL backend's sticky failure (an earlier wait timed out
 * or NCCL failed): "NAME OP (NCCL backend): an earlier call failed: ...". */
symm_status symm_variant_nccl_failure(const symm_variant *v, const char *op);
/* SYMM_ERR_STATE when stream is capturing (the NCCL backend waits on the host). */
symm_status symm_variant_nccl_refuse_capture(const symm_variant *v, CUstream stream, const char *op);
void symm_variant_nccl_release(symm_variant *v);
/* Wait (at most the variant's timeout) for the NCCL backend's last call; on
 * a timeout its communicator is aborted, which lets NCCL's kernels on this
 * GPU return, and SYMM_ERR_TIMEOUT comes back. SYMM_OK without the backend. */
symm_status symm_variant_nccl_quiesce(symm_variant *v);
/* Wait for stream's work as every host wait of the backend does (polled,
 * bounded by the variant's timeout; a timeout is sticky). After an earlier
 * failure (sticky) it returns that at once, waiting for nothing; op names
 * the caller in the error (e.g. "stats_read"). */
symm_status symm_variant_nccl_sync(symm_variant *v, CUstream stream, const char *op);
symm_status symm_variant_nccl_dispatch(symm_variant *v, const symm_dispatch_args *args, CUstream stream);
symm_status symm_variant_nccl_combine(symm_variant *v, const void *y, void *out, CUstream stream);

/* Hybrid backend (variant_hybrid.c), on a world of several hosts, with a
 * companion created natively on the host world. symm_variant_dispatch and
 * _combine refuse stream capture (symm_variant_hybrid_refuse_capture) and
 * check symm_variant_hybrid_failure (sticky after any failed call) first. */
/* Create's checks before any GPU work (hybrid_plan.h symm_hybrid_check over
 * the world's host table): the companion of the world's host count. */
symm_status symm_variant_hybrid_check(symm_world *world, const symm_variant_desc *desc,
                                      const symm_variant_desc **companion);
/* Collective: the companion, the buffers, the tables (a symmetric buffer of
 * the host world on v->host_dev), the NCCL communicator over the world. */
symm_status symm_variant_hybrid_setup(symm_variant *v, const symm_variant_desc *companion,
                                      const symm_variant_options *opts);
void symm_variant_hybrid_release(symm_variant *v);
symm_status symm_variant_hybrid_refuse_capture(const symm_variant *v, CUstream stream, const char *op);
symm_status symm_variant_hybrid_failure(const symm_variant *v, const char *op);
symm_status symm_variant_hybrid_quiesce(symm_variant *v);
symm_status symm_variant_hybrid_dispatch(symm_variant *v, const symm_dispatch_args *args, CUstream stream);
symm_status symm_variant_hybrid_combine(symm_variant *v, const void *y, void *out, CUstream stream);
/* The companion's buffers with the hybrid's own src. */
symm_status symm_variant_hybrid_recv(const symm_variant *v, symm_recv_buffers *out);
/* The merged statistics (this synchronizes stream): the hybrid's T, invalid
 * ids and clamping, the companion's rows, drops and timeouts (its peer as a
 * rank of the world). SYMM_OK, or the sticky failure, or a CUDA error. */
symm_status symm_variant_hybrid_stats(symm_variant *v, CUstream stream, symm_variant_stats *out);
/* The companion's profile (its kernels do the work inside the host). */
symm_status symm_variant_hybrid_profile(symm_variant *v, CUstream stream, symm_variant_profile *out);

/* The oldest GPUs the kernels run on: compute capability 9.0 (Hopper). */
#define SYMM_MIN_CC_MAJOR 9

/* variant.c: SYMM_OK on a GPU of compute capability major.minor the kernels
 * run on; else SYMM_ERR_UNSUPPORTED in one sentence naming the variant, the
 * GPU's architecture and the oldest one supported (create checks it before
 * anything is allocated or compiled). */
symm_status symm_variant_check_gpu(const char *name, int cc_major, int cc_minor);

/* variant.c: whether all capacity rows of a y at address y lie inside a
 * symmetric buffer of d->symmetric_bytes at base (where a pulling combine's
 * peers can read them). */
bool symm_variant_y_inside(const symm_variant_desc *d, CUdeviceptr base, CUdeviceptr y);

/* variant.c: whether the native backend's combine of y pulls: always with
 * combine = "pull" (whose y the host checks first), with "auto" when y is
 * inside (symm_variant_y_inside), never with "push". The NCCL backend lands
 * the rows in COMBINE_IN (or a buffer of its own) whatever the mode, and the
 * hybrid's companion decides for itself. */
bool symm_variant_native_pulls(const symm_variant_desc *d, CUdeviceptr base, CUdeviceptr y);

/* variant.c: where region id of v lives on this rank (its symmetric buffer
 * or its scratch), 0 for a region the variant does not have. */
CUdeviceptr symm_variant_region_ptr(const symm_variant *v, symm_region id);

/* variant.c: launch symm_reduce (the sum of combine: the peers' rows from
 * combine_in, laid out as COMBINE_IN, this rank's own from y) into out. */
symm_status symm_variant_launch_reduce(symm_variant *v, const void *y, void *out, CUdeviceptr combine_in,
                                       CUstream stream);

#endif
