/* symm_status.h: the one result type of libsymm, the message that goes
 * with it, and the rules every public header follows.
 *
 * Results. Every public function that can fail returns a symm_status. When
 * it is not SYMM_OK, symm_last_error() returns a message for the calling
 * thread that says which call failed, which value was wrong and what was
 * expected. A function that cannot fail returns its value instead: the
 * accessors of a handle (symm_world_rank, symm_variant_describe, ...), the
 * dtype conversions of symm_ref.h and the three functions of this header. No
 * libsymm function prints, exits or aborts.
 *
 * Names. open = from a file or a manifest (or, for symm_device_open, the
 * rank's GPU), create = from a description; what an _open makes is released
 * by its _close, what a _create makes by its _destroy. symm_variant_open is
 * symm_variant_create of a manifest's variant: its variant is released by
 * symm_variant_destroy like any other. What a call filled into a struct of
 * the caller's (symm_jit_result, symm_ref_recv) is released by _free.
 * Every _destroy, _close and _free returns a symm_status, takes NULL (and returns
 * SYMM_OK), and releases everything even when it fails, except
 * symm_device_close, which refuses (SYMM_ERR_STATE) while allocations on its
 * device are live. tests/cpu/test_api.c checks the headers against this. */
#ifndef SYMM_STATUS_H
#define SYMM_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum symm_status {
    SYMM_OK = 0,
    SYMM_ERR_INVALID_ARG,  /* a caller's argument is out of range or NULL */
    SYMM_ERR_NO_GPU,       /* no CUDA driver or no device */
    SYMM_ERR_CUDA,         /* a CUDA driver call failed */
    SYMM_ERR_NVRTC,        /* NVRTC failed to compile; the log is in the message */
    SYMM_ERR_NCCL,         /* an NCCL call failed, or NCCL is not available */
    SYMM_ERR_SYSTEM,       /* an operating system call failed */
    SYMM_ERR_TIMEOUT,      /* a peer did not arrive within SYMM_TIMEOUT */
    SYMM_ERR_PEER,         /* a peer failed, disconnected or was refused */
    SYMM_ERR_MISMATCH,     /* ranks disagree on a collective call */
    SYMM_ERR_OVERFLOW,     /* rows dropped (capacity) or invalid ids seen */
    SYMM_ERR_NOMEM,        /* host or device memory exhausted */
    SYMM_ERR_UNSUPPORTED,  /* valid request this build or device cannot do */
    SYMM_ERR_STATE,        /* call not allowed now (e.g. during stream capture) */
    SYMM_ERR_COUNT_
} symm_status;

/* Message for the last failing libsymm call of this thread ("" if none).
 * Valid until the next failing libsymm call on this thread. */
const char *symm_last_error(void);

/* Short constant name of a status ("SYMM_ERR_TIMEOUT"); never NULL. */
const char *symm_status_name(symm_status status);

/* Clear this thread's message. */
void symm_clear_error(void);

/* In a function that returns symm_status: return the status of expr unless
 * it is SYMM_OK (the message its callee set stays). */
#define SYMM_TRY(expr)                         \
    do {                                       \
        symm_status symm_try_st_ = (expr);     \
        if (symm_try_st_ != SYMM_OK)           \
            return symm_try_st_;               \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
