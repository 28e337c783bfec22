/* status.c: the thread-local error message behind symm_last_error(). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

static _Thread_local char last_message[SYMM_MSG_MAX];

const char *symm_last_error(void) { return last_message; }

void symm_clear_error(void) { last_message[0] = '\0'; }

symm_status symm_fail(symm_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    va_end(ap);
    return status;
}

symm_status symm_fail_context(symm_status status, const char *fmt, ...)
{
    char prefix[512];
    char old[SYMM_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_message, sizeof old);
    size_t n = strlen(prefix);
    if (n >= sizeof last_message)
        n = sizeof last_message - 1;
    memcpy(last_message, prefix, n);
    size_t rest = strnlen(old, sizeof old - 1);
    if (rest > sizeof last_message - 1 - n)
        rest = sizeof last_message - 1 - n;
    memcpy(last_message + n, old, rest);
    last_message[n + rest] = '\0';
    return status;
}

const char *symm_status_name(symm_status status)
{
    static const char *const names[] = {
        [SYMM_OK] = "SYMM_OK",
        [SYMM_ERR_INVALID_ARG] = "SYMM_ERR_INVALID_ARG",
        [SYMM_ERR_NO_GPU] = "SYMM_ERR_NO_GPU",
        [SYMM_ERR_CUDA] = "SYMM_ERR_CUDA",
        [SYMM_ERR_NVRTC] = "SYMM_ERR_NVRTC",
        [SYMM_ERR_NCCL] = "SYMM_ERR_NCCL",
        [SYMM_ERR_SYSTEM] = "SYMM_ERR_SYSTEM",
        [SYMM_ERR_TIMEOUT] = "SYMM_ERR_TIMEOUT",
        [SYMM_ERR_PEER] = "SYMM_ERR_PEER",
        [SYMM_ERR_MISMATCH] = "SYMM_ERR_MISMATCH",
        [SYMM_ERR_OVERFLOW] = "SYMM_ERR_OVERFLOW",
        [SYMM_ERR_NOMEM] = "SYMM_ERR_NOMEM",
        [SYMM_ERR_UNSUPPORTED] = "SYMM_ERR_UNSUPPORTED",
        [SYMM_ERR_STATE] = "SYMM_ERR_STATE",
    };
    if ((unsigned)status >= SYMM_ARRAY_LEN(names) || !names[status])
        return "SYMM_ERR_UNKNOWN";
    return names[status];
}
