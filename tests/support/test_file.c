/* test_file.c: see test_file.h. */
#include "test_file.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *test_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s: %s (run the tests from the repository root)", path, strerror(errno));
    cr_assert_eq(fseek(f, 0, SEEK_END), 0, "seek %s", path);
    long n = ftell(f);
    cr_assert(n >= 0, "size of %s", path);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    cr_assert(buf, "out of memory for %s", path);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n, "short read of %s", path);
    fclose(f);
    buf[n] = '\0';
    if (len)
        *len = (size_t)n;
    return buf;
}
