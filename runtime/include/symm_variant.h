/* symm_variant.h: running a generated variant: create it on a world, dispatch,
 * combine, read its results and statistics, destroy it.
 *
 * A variant is described by a symm_variant_desc that symmgen writes into the
 * variant's C stub (<name>.c), with its CUDA source inside. The typed
 * functions of the stub (<name>_create, <name>_dispatch, ...) call these.
 *
 * Calls on one variant are stream-ordered and must be issued in the same order
 * on every rank, alternating: every dispatch is followed by exactly one
 * combine before the next dispatch (SYMM_ERR_STATE otherwise; in a CUDA graph
 * the captured sequence must alternate the same way). Dispatch and combine never allocate, compile or wait on the
 * host (native backend), so both can be captured in a CUDA graph. Results of a
 * dispatch stay valid until the next dispatch on the same variant.
 *
 * On a stream the application made (not the legacy or per-thread default
 * stream), the native dispatch and combine launch as programmatic dependents
 * of the kernel before them (tuning knob PDL, on by default; docs/api.md
 * "Tuning"): their blocks may be scheduled while that kernel ends and wait
 * for it to complete before they touch memory, so nothing changes for the
 * kernels before them. Dispatch also lets the kernel after it start early,
 * once its counts are exchanged: a kernel launched after dispatch with the
 * programmatic-serialization attribute itself must wait
 * (cudaGridDependencySynchronize or griddepcontrol.wait) before it reads
 * dispatch's outputs, as PDL requires of any dependent; an ordinary launch
 * needs nothing.
 *
 * A launch's blocks wait for each other and for the peers' blocks, so they
 * must all be resident at once (create checks it for one variant, and for
 * the ranks that share a GPU as CUDA MPS clients). Variants that run at the
 * same time on separate streams of one GPU must fit on it together: the
 * sum of their sms at most the GPU's SMs (at one block an SM, as the
 * DeepSeek-V3-sized kernels take). Beyond that, a rank's blocks of one
 * variant may wait on SMs that its blocks of another hold while those wait
 * for a peer in the same state: SYMM_ERR_TIMEOUT after SYMM_TIMEOUT. Kernels
 * of the application that never wait for ours are no such risk. */
#ifndef SYMM_VARIANT_H
#define SYMM_VARIANT_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "symm_status.h"
#include "symm_types.h"
#include "symm_world.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version of symm_variant_desc; a stub built for another version is refused. */
#define SYMM_DESC_ABI 7

typedef struct symm_region_desc {
    uint64_t offset; /* from the start of the symmetric buffer or of the scratch */
    uint64_t bytes;  /* 0: not used by this variant */
    int symmetric;   /* 1: symmetric buffer, 0: local scratch */
} symm_region_desc;

/* Everything the runtime needs to know of one generated variant. */
typedef struct symm_variant_desc {
    int abi;                    /* SYMM_DESC_ABI */
    const char *name;
    const char *spec_file;
    const char *symmgen_version;
    int hidden, topk, experts, world, max_tokens;
    symm_dtype dtype, combine_dtype;
    symm_layout layout;
    int weights, align, sms;
    symm_combine_mode combine;  /* PULL: combine reads the peers' y, which must lie in
                                   the variant's symmetric buffer; AUTO: pulls when
                                   it does, pushes otherwise (symm_types.h) */
    symm_combine_order combine_order; /* layout expert: how combine sums (symm_types.h) */
    int64_t capacity, worst_capacity;
    uint64_t symmetric_bytes;   /* per rank, before rounding to the VMM granularity */
    uint64_t scratch_bytes;     /* per rank, local device memory */
    symm_region_desc regions[SYMM_REGION_COUNT];
    const char *source;         /* the CUDA source (NUL-terminated) */
    size_t source_len;
    const char *source_sha256;  /* hex SHA-256 of source, as in the manifest */
    const char *const *nvrtc_options; /* besides --gpu-architecture */
    int n_nvrtc_options;
    /* Across hosts (the hybrid backend; spec field hosts): a companion is
     * the native variant of one host's ranks for a world of `hosts` hosts
     * (world / hosts ranks, experts / hosts, hosts * max_tokens); hosts is
     * 0 in any other variant. A variant whose spec lists hosts carries its
     * companions here, one per host count, ascending. */
    int hosts;
    const struct symm_variant_desc *companions;
    int n_companions;
} symm_variant_desc;

typedef enum symm_backend {
    SYMM_BACKEND_DEFAULT = 0, /* SYMM_BACKEND from the environment, else native on a
                                 world of one host, hybrid on a world of several */
    SYMM_BACKEND_NATIVE,      /* generated kernels over NVLink symmetric memory (one host) */
    SYMM_BACKEND_NCCL,        /* NCCL send/receive (needs host counts; not capturable) */
    SYMM_BACKEND_HYBRID,      /* across hosts: NCCL between hosts, the native kernels of the
                                 variant's companion within each (docs/protocol.md "Across
                                 hosts"; needs host counts; not capturable). Refused on a
                                 world of one host (native serves it). */
} symm_backend;

typedef struct symm_variant_options {
    symm_backend backend;
    const char *cache_dir;    /* JIT cache; NULL: the default (SYMM_CACHE_DIR, ...) */
    double timeout_s;         /* device waits (NCCL backend: its host waits); 0: the
                                 world's timeout */
    const char *tune;         /* kernel tuning, "NAME=value,..." (docs/api.md, "Tuning");
                                 NULL: SYMM_TUNE from the environment, else none */
} symm_variant_options;

typedef struct symm_variant symm_variant;

/* Collective. Checks desc against the world (same world size) and the GPU
 * (Hopper, sm_90, or newer: SYMM_ERR_UNSUPPORTED "variant NAME needs a Hopper
 * (sm_90) or newer GPU, and this rank's GPU is sm_80" otherwise), allocates the
 * symmetric buffer and the scratch, JIT-compiles the source (through the disk
 * cache), loads it, checks that every block of a launch can be resident.
 * All or nothing: on failure everything is released. opts may be NULL. */
symm_status symm_variant_create(symm_world *world, const symm_variant_desc *desc,
                                const symm_variant_options *opts, symm_variant **out);

/* Collective. Waits for this rank's work on the variant, then frees it. The
 * NCCL backend's last call is waited for at most the variant's timeout; past
 * it the communicator is aborted (NCCL's kernels return), everything is still
 * freed, and SYMM_ERR_TIMEOUT comes back. */
symm_status symm_variant_destroy(symm_variant *v);

const symm_variant_desc *symm_variant_describe(const symm_variant *v);
symm_backend symm_variant_backend(const symm_variant *v);

/* Dispatch input, all device memory of this rank. */
typedef struct symm_dispatch_args {
    int tokens;                 /* T, 0..max_tokens; ignored when tokens_dev is set */
    const int32_t *tokens_dev;  /* optional: T read on the device (graph replays);
                                   a value above max_tokens is clamped and reported */
    const void *x;              /* [T, hidden] dtype, 16-byte aligned */
    const float *x_scales;      /* fp8: [T, hidden/128]; else NULL */
    const int32_t *topk_idx;    /* [T, topk] */
    const float *topk_weights;  /* [T, topk] when the variant has weights; else NULL */
} symm_dispatch_args;

symm_status symm_variant_dispatch(symm_variant *v, const symm_dispatch_args *args, CUstream stream);

/* Combine: y [capacity, hidden] combine dtype, aligned with recv_x (any
 * device memory, recv_x itself included when the dtypes agree); out
 * [T, hidden] combine dtype with T of the last dispatch. A variant with
 * combine = "pull" (desc->combine SYMM_COMBINE_PULL) reads its peers' y where
 * they are: y must then lie, all capacity rows of it, inside the variant's
 * symmetric buffer (symm_recv_buffers.y, or recv_x), else
 * SYMM_ERR_INVALID_ARG names it; ranks may put it at different places there.
 * combine = "auto" (SYMM_COMBINE_AUTO, the native backend) pulls in a call
 * whose y lies so and pushes in any other: every rank must place y alike in
 * a call (all inside, or all outside), else the call fails on every rank
 * (symm_variant_stats_read: SYMM_ERR_MISMATCH, sticky); the NCCL backend
 * takes y anywhere either way (the hybrid: as its companion does).
 * Layout rank: out[t] = sum over the ranks p that received t, ascending p,
 * of y_p[row], in fp32, rounded once. Layout expert, desc->combine_order
 * RANK (the default): out[t] = sum over ranks p ascending of P_p(t), where
 * P_p(t) = sum over t's k whose expert lives on p, ascending k, of
 * w[t,k] * y_p[row(t,k)] in fp32, rounded once to the combine dtype (the
 * one row p sends back); the outer sum in fp32, rounded once. Combine
 * order K: sum over the valid k ascending of w[t,k] * y[row(t,k)] in fp32,
 * rounded once (every (token, expert) row comes back). w = 1 without
 * weights; symm_ref.h gives the exact operations. */
symm_status symm_variant_combine(symm_variant *v, const void *y, void *out, CUstream stream);

/* Where the results of the last dispatch live (device pointers owned by the
 * variant; valid until the next dispatch). */
typedef struct symm_recv_buffers {
    CUdeviceptr x;            /* [capacity, hidden] dtype */
    CUdeviceptr scales;       /* fp8: [capacity, hidden/128] float; else 0 */
    CUdeviceptr src;          /* [capacity] int32 x4: {src rank, src token, k or -1, 0} */
    CUdeviceptr topk_idx;     /* layout rank: [capacity, topk] int32 local ids or -1; else 0 */
    CUdeviceptr weights;      /* [capacity, topk] (rank) or [capacity] (expert) float; 0 without weights */
    CUdeviceptr expert_count; /* [local experts] int32 */
    CUdeviceptr expert_offset;/* layout expert: [local experts] int32; else 0 */
    CUdeviceptr rows;         /* int32: rows received (see symm_variant_stats) */
    CUdeviceptr y;            /* combine = "pull" or "auto": [capacity, hidden] combine dtype,
                                 a place for combine's y in the symmetric buffer; else 0 */
} symm_recv_buffers;

/* The hybrid backend hands out its companion's buffers (its rows, in the
 * order docs/protocol.md "Across hosts" gives) with src of its own:
 * {source rank in the world, source token, k or -1, 0}. */
symm_status symm_variant_recv(const symm_variant *v, symm_recv_buffers *out);

/* Per-call statistics of the last dispatch and the sticky device error. */
typedef struct symm_variant_stats {
    uint64_t calls;        /* dispatches so far */
    int tokens;            /* T of the last dispatch (after clamping) */
    int recv_rows;         /* rows received */
    int invalid;           /* invalid topk entries (out of range or repeated) */
    int dropped_send;      /* rows this rank sent that did not fit at their destination */
    int dropped_recv;      /* rows meant for this rank that did not fit */
    int clamped;           /* T from device memory was above max_tokens */
    int timed_out;         /* a device wait timed out ... */
    int timeout_peer;      /* ... waiting for this rank (-1: unknown, NCCL backend) ... */
    int timeout_phase;     /* ... in this phase: 1 counts, 2 rows, 3 combine */
    int mismatch;          /* combine = "auto": the ranks took different forms in a call:
                              1 this rank pulled (its y inside the symmetric buffer) and
                              rank mismatch_peer pushed, 2 the other way round; 0 none */
    int mismatch_peer;     /* ... the peer that took the other form (-1 with none) */
} symm_variant_stats;

/* Copy the statistics to the host after the variant's work queued so far on
 * stream has finished (this synchronizes that stream). Returns SYMM_OK when the
 * last dispatch was clean, SYMM_ERR_OVERFLOW when rows were dropped, ids were
 * invalid or T was clamped, SYMM_ERR_TIMEOUT when a device wait timed out (the
 * message names the peer and the phase), SYMM_ERR_MISMATCH when a combine of
 * combine = "auto" found a peer that took the other form (the message names
 * the peer, the call and both forms). Either is sticky: the ranks no
 * longer agree on where the exchange stands, so every later call fails fast
 * and the variant must be destroyed (which still works and frees everything)
 * and created again. The NCCL backend waits on the host inside dispatch: there
 * dispatch itself returns SYMM_ERR_TIMEOUT (NCCL cannot say which peer is
 * missing), sticky in the same way: every later dispatch, combine and
 * stats_read returns it (stats: timed_out set, timeout_peer -1, the rest 0).
 * The hybrid backend (across hosts) counts invalid ids and clamping at the
 * source, rows and drops in its companion: a row dropped at its destination
 * counts in dropped_send of the rank that forwarded it (the source's peer
 * of the same local index on the row's host), and a device timeout names a
 * rank of the world; any failed call is sticky as the NCCL backend's.
 * stats may be NULL. */
symm_status symm_variant_stats_read(symm_variant *v, CUstream stream, symm_variant_stats *stats);

/* Spans (a variant created with PROFILE=2): where one kind of warp spends
 * its time. Each duration (microseconds of %globaltimer, as lane 0 of the
 * warp saw it) and each count is summed over the warps of this rank that
 * recorded it in the calls since the last read, and `warps` counts those
 * warps (a warp records once a call): a sum / warps is a warp's mean. An
 * indented field is a part of the one above it; what no field names (the
 * rest of a loop) is the loop's other work. docs/api.md says which code
 * each one covers. */
typedef struct symm_variant_spans_parts {
    uint64_t warps;    /* combine's push warps that formed partial sums (layout expert, PUSH_PARTIALS) */
    double loop_us;    /* from the warp's start to its last batch published */
    double scan_us;    /* finding each batch's heads, listing a head's rows and weights */
    double part_us;    /* forming each part and storing it at the peer (partial_row), of which: */
    double issue_us;   /*   lane 0 issuing a chunk's bulk loads */
    double loads_us;   /*   waiting for a chunk's loads to land */
    double sums_us;    /*   the lanes summing a chunk and storing its sums */
    double slots_us;   /*   lane 0 waiting for bulk stores to read a staging slot */
    double publish_us; /* each batch: its stores complete, a fence, its flags */
    uint64_t parts;    /* parts formed */
    uint64_t chunks;   /* chunks (rounds of loads) of those parts */
    uint64_t rows;     /* rows summed into them */
} symm_variant_spans_parts;

typedef struct symm_variant_spans_push {
    uint64_t warps;    /* combine's push warps that pushed whole rows (no partial sums) */
    double loop_us;    /* from the warp's start to its last batch published */
    double copy_us;    /* copying the rows through the staging slots, of which: */
    double loads_us;   /*   waiting for a chunk to land */
    double slots_us;   /*   lane 0 waiting for a slot's stores to read it */
    double publish_us; /* each batch: its stores complete, a fence, its flags */
    uint64_t rows;     /* rows pushed */
    uint64_t batches;  /* batches published */
} symm_variant_spans_push;

typedef struct symm_variant_spans_sums {
    uint64_t warps;    /* combine's warps that summed (every warp; push warps after their pushes) */
    double loop_us;    /* from the warp's first unit of work taken to none left */
    double wait_us;    /* waiting for a unit's rows or the peers' parts to arrive */
    double sum_us;     /* summing (loads, adds, stores of out), the waits excluded */
    uint64_t units;    /* units of work taken */
    uint64_t tokens;   /* token sums (a slice of a token counts as one) */
} symm_variant_spans_sums;

typedef struct symm_variant_spans_rows {
    uint64_t warps;    /* dispatch's warps that sent tokens */
    double loop_us;    /* sending the rows: from the bases known to every store complete */
    double loads_us;   /* waiting for a chunk of x to land */
    double slots_us;   /* lane 0 waiting for a slot's stores to read it */
    double drain_us;   /* the last wait: every store complete */
    uint64_t tokens;   /* tokens sent */
    uint64_t rows;     /* row copies (destinations) */
    double idle_us;    /* from its stores complete to the last of its block's warps' (not in loop_us) */
} symm_variant_spans_rows;

/* Where the time of dispatch and combine goes, on a variant created with the
 * tuning knob PROFILE=1 or 2 (SYMM_TUNE or symm_variant_options.tune; the
 * kernels then read %globaltimer at the end of each phase, a few atomics per
 * block; with 2 also the spans, a few atomics per warp). The phases:
 * microseconds from the earliest block's start of the kernel on this rank's
 * GPU, the latest block or warp for each phase. Fields are only ever
 * appended. */
typedef struct symm_variant_profile {
    double dispatch_routed_us;    /* every warp's tokens validated and counted */
    double dispatch_counted_us;   /* this rank's counts published to every peer */
    double dispatch_counts_in_us; /* every peer's counts arrived */
    double dispatch_bases_us;     /* every block's destination rows computed */
    double dispatch_stored_us;    /* every row store of this rank complete */
    double dispatch_rows_out_us;  /* this rank's rows landed and were announced */
    double dispatch_rows_in_us;   /* every peer's rows arrived */
    double dispatch_us;           /* the kernel's last warp done */
    double combine_issued_us;     /* every push warp's first batch of rows issued */
    double combine_stored_us;     /* ... and complete at the peers (before its flags) */
    double combine_fenced_us;     /* ... and fenced at system scope (then its flags) */
    double combine_pushed_us;     /* every received row pushed back and flagged */
    double combine_flags_in_us;   /* every unit of summing work found its rows arrived */
    double combine_us;            /* every sum written */
    int level;                    /* the variant's PROFILE: 1, or 2 with the spans below */
    symm_variant_spans_parts parts; /* PROFILE=2 (else zeros): combine's push warps forming partial sums */
    symm_variant_spans_push push;   /* ... combine's push warps pushing whole rows */
    symm_variant_spans_sums sums;   /* ... combine's sums */
    symm_variant_spans_rows rows;   /* ... dispatch's rows sent */
} symm_variant_profile;

/* The profile of the calls since the last read (earliest start, latest ends:
 * read after each dispatch + combine for one call's phases; the spans sum
 * over the calls), after the work queued so far on stream has finished
 * (this synchronizes that stream); then starts afresh. A phase no call
 * reached reads -1. SYMM_ERR_STATE when the variant was not created with
 * PROFILE=1 or 2. */
symm_status symm_variant_profile_read(symm_variant *v, CUstream stream, symm_variant_profile *out);

#ifdef __cplusplus
}
#endif
#endif
