/* diag.c: the generator's error list (sg_diag). Every message is a malloc'd
 * string already in its final "file:line: ..." shape, so whoever prints them
 * adds nothing. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "sg.h"

/* The array grows in powers of two starting at 4; sg_diag has no capacity
 * field, so the capacity is implied by the count. */
static int reserve_one(sg_diag *d)
{
    size_t n = d->count;
    if (n != 0 && (n < 4 || (n & (n - 1)) != 0))
        return 0;
    size_t cap = n == 0 ? 4 : n * 2;
    char **grown = realloc(d->messages, cap * sizeof *grown);
    if (!grown)
        return -1;
    d->messages = grown;
    return 0;
}

void sg_diag_add(sg_diag *d, const char *fmt, ...)
{
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    /* Out of memory: the caller still fails, with what was recorded so far. */
    if (n < 0)
        return;
    if (reserve_one(d) != 0) {
        free(msg);
        return;
    }
    d->messages[d->count++] = msg;
}

void sg_diag_free(sg_diag *d)
{
    for (size_t i = 0; i < d->count; i++)
        free(d->messages[i]);
    free(d->messages);
    d->messages = NULL;
    d->count = 0;
}
