/* test_cuda_api.c: how libsymm reaches the CUDA driver, checked without one. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"

/* cuGetProcAddress takes base names: "cuMemAlloc", never the "cuMemAlloc_v2"
 * that cuda.h's macros turn the name into (asking for that one fails on a
 * real driver: every call then reports that the driver lacks it). */
Test(cuda_api, symbols_are_asked_for_by_their_base_names)
{
    size_t n = symm_cuda_symbol_count();
    cr_assert(n > 40, "only %zu driver functions listed", n);
    for (size_t i = 0; i < n; i++) {
        const char *name = symm_cuda_symbol_name(i);
        cr_assert(name && strncmp(name, "cu", 2) == 0, "symbol %zu: %s", i, name ? name : "(null)");
        const char *suffix = strrchr(name, '_');
        cr_assert(!suffix || !(suffix[1] == 'v' && isdigit((unsigned char)suffix[2])),
                  "symbol %zu is a versioned name: %s", i, name);
        cr_assert(!strstr(name, "_ptsz") && !strstr(name, "_ptds"), "symbol %zu is a per-thread name: %s", i, name);
    }
    cr_assert_null(symm_cuda_symbol_name(n));
}

/* Every line of cuda_syms.h is in the table, in order. */
Test(cuda_api, table_matches_cuda_syms_h)
{
    FILE *f = fopen("runtime/cuda_syms.h", "r");
    cr_assert(f, "runtime/cuda_syms.h: run from the repository root");
    char line[256];
    size_t i = 0;
    while (fgets(line, sizeof line, f)) {
        char name[128];
        if (sscanf(line, "SYMM_CUDA_FN(%127[A-Za-z0-9_])", name) != 1 &&
            sscanf(line, "SYMM_CUDA_FN_AT(%127[A-Za-z0-9_],", name) != 1)
            continue;
        cr_assert_str_eq(symm_cuda_symbol_name(i), name, "entry %zu", i);
        i++;
    }
    fclose(f);
    cr_assert_eq(i, symm_cuda_symbol_count());
}

/* Without a driver every call says so instead of crashing. */
Test(cuda_api, no_driver_is_a_clear_error)
{
    const symm_cuda_api *cu = NULL;
    symm_status st = symm_cuda(&cu);
    if (st == SYMM_OK)
        cr_skip_test("a GPU driver is present");
    cr_assert_eq(st, SYMM_ERR_NO_GPU);
    cr_assert(strstr(symm_last_error(), "libcuda.so.1") || strstr(symm_last_error(), "cuInit"),
              "message: %s", symm_last_error());
}
