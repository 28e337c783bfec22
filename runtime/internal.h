/* internal.h: helpers shared by the runtime's sources; not installed.
 *
 * Errors: a failing function calls symm_fail(status, fmt, ...), which stores a
 * message for symm_last_error() and returns the status, so that
 *     return symm_fail(SYMM_ERR_INVALID_ARG, "symm_x: size %zu: expected > 0", n);
 * both reports and returns. SYMM_TRY (symm_status.h) propagates a failure
 * unchanged (the message set by the callee stays). */
#ifndef SYMM_INTERNAL_H
#define SYMM_INTERNAL_H

#include "symm_status.h"

#if defined(__GNUC__)
#define SYMM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define SYMM_PRINTF(a, b)
#endif

/* Size of the message buffer behind symm_last_error(), NUL included. */
#define SYMM_MSG_MAX 8192

symm_status symm_fail(symm_status status, const char *fmt, ...) SYMM_PRINTF(2, 3);

/* Prefix the current message with more context ("symm_alloc_create: " ...)
 * and return status unchanged. */
symm_status symm_fail_context(symm_status status, const char *fmt, ...) SYMM_PRINTF(2, 3);

#define SYMM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
