/* symm_status.h: the one result type of libsymm and the message that goes
 * with it.
 *
 * Every public function of libsymm returns a symm_status. When it is not
 * SYMM_OK, symm_last_error() returns a message for the calling thread that
 * says which call failed, which value was wrong and what was expected. No
 * libsymm function prints, exits or aborts. */
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

#ifdef __cplusplus
}
#endif
#endif
