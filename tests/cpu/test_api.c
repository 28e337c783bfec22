/* test_api.c: the rules of symm_status.h that every public header follows:
 * what releases a handle returns a symm_status and takes NULL, and each
 * header compiles on its own in C11 and C++17 with every warning an error. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "symm_heap.h"
#include "symm_jit.h"
#include "symm_manifest.h"
#include "symm_nccl.h"
#include "symm_ref.h"
#include "symm_status.h"
#include "symm_variant.h"
#include "symm_world.h"
#include "test_file.h"

#define INCLUDE_DIR "runtime/include"

/* The public headers, sorted; *n of them. */
static char **public_headers(size_t *n)
{
    DIR *d = opendir(INCLUDE_DIR);
    cr_assert(d, INCLUDE_DIR ": cannot open (run the tests from the repository root)");
    char **names = NULL;
    *n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 3 || strcmp(e->d_name + len - 2, ".h") != 0)
            continue;
        names = realloc(names, (*n + 1) * sizeof *names);
        names[(*n)++] = strdup(e->d_name);
    }
    closedir(d);
    cr_assert(*n >= 8, "only %zu headers in " INCLUDE_DIR, *n);
    return names;
}

Test(api, every_destroy_close_and_free_returns_a_status)
{
    regex_t re;
    /* A declaration at the start of a line: return type, then the name. */
    cr_assert_eq(regcomp(&re, "^([a-z_][a-z0-9_ ]*[ *]+)(symm_[a-z0-9_]+_(destroy|close|free))\\(",
                         REG_EXTENDED | REG_NEWLINE),
                 0);
    size_t n, found = 0, status_count = 0;
    char **names = public_headers(&n);
    for (size_t i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, INCLUDE_DIR "/%s", names[i]);
        char *text = test_slurp(path, NULL);
        regmatch_t m[4];
        for (const char *p = text; regexec(&re, p, 4, m, p == text ? 0 : REG_NOTBOL) == 0; p += m[0].rm_eo) {
            char type[64], name[96];
            snprintf(type, sizeof type, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), p + m[1].rm_so);
            snprintf(name, sizeof name, "%.*s", (int)(m[2].rm_eo - m[2].rm_so), p + m[2].rm_so);
            found++;
            cr_assert_str_eq(type, "symm_status ", "%s: %s returns \"%s\", expected symm_status (symm_status.h)",
                             names[i], name, type);
            status_count++;
        }
        free(text);
        free(names[i]);
    }
    free(names);
    regfree(&re);
    cr_assert(found >= 8 && status_count == found,
              "%zu release functions found, %zu returning a status", found, status_count);
}

Test(api, every_destroy_close_and_free_takes_null)
{
    cr_assert_eq(symm_world_destroy(NULL), SYMM_OK);
    cr_assert_eq(symm_variant_destroy(NULL), SYMM_OK);
    cr_assert_eq(symm_alloc_destroy(NULL), SYMM_OK);
    cr_assert_eq(symm_device_close(NULL), SYMM_OK);
    cr_assert_eq(symm_nccl_destroy(NULL), SYMM_OK);
    cr_assert_eq(symm_jit_result_free(NULL), SYMM_OK);
    cr_assert_eq(symm_ref_recv_free(NULL), SYMM_OK);
    cr_assert_eq(symm_manifest_close(NULL), SYMM_OK);
}

/* A result and a recv with something in them are released and zeroed. */
Test(api, free_releases_and_zeroes)
{
    symm_jit_result res = {0};
    res.cubin = malloc(16);
    res.log = strdup("log");
    res.warning = strdup("");
    res.cache_path = strdup("/x");
    cr_assert_eq(symm_jit_result_free(&res), SYMM_OK);
    cr_assert(!res.cubin && !res.log && !res.warning && !res.cache_path);
    const symm_ref_config cfg = {.hidden = 128, .topk = 2, .experts = 4, .world = 2, .max_tokens = 4,
                                 .dtype = SYMM_DTYPE_BF16, .combine_dtype = SYMM_DTYPE_BF16,
                                 .layout = SYMM_LAYOUT_RANK, .weights = 1, .align = 1};
    symm_ref_recv r;
    cr_assert_eq(symm_ref_recv_alloc(&cfg, &r), SYMM_OK, "%s", symm_last_error());
    cr_assert(r.x != NULL);
    cr_assert_eq(symm_ref_recv_free(&r), SYMM_OK);
    cr_assert(!r.x && r.capacity == 0);
}

/* Each header on its own, as a user includes it, in C and C++. */
Test(api, every_public_header_compiles_alone_in_c_and_cpp)
{
    size_t n;
    char **names = public_headers(&n);
    char dir[] = "/tmp/symm-api-XXXXXX", repo[1024];
    cr_assert(mkdtemp(dir) && getcwd(repo, sizeof repo));
    const char *cuda = getenv("CUDA_HOME") ? getenv("CUDA_HOME") : "/usr/local/cuda";
    for (size_t i = 0; i < n; i++) {
        char src[256], cmd[4096];
        snprintf(src, sizeof src, "%s/one.c", dir);
        FILE *f = fopen(src, "w");
        cr_assert(f);
        fprintf(f, "#include \"%s\"\n#include \"%s\"\nint symm_api_test_unit;\n", names[i], names[i]);
        fclose(f);
        snprintf(cmd, sizeof cmd,
                 "cd %s && gcc -std=c11 -Wall -Wextra -Werror -pedantic -I%s/" INCLUDE_DIR " -I%s/include "
                 "-c one.c -o one.o && g++ -std=c++17 -x c++ -Wall -Wextra -Werror -I%s/" INCLUDE_DIR
                 " -I%s/include -c one.c -o one.o",
                 dir, repo, cuda, repo, cuda);
        cr_assert_eq(system(cmd), 0, "%s does not compile alone: %s", names[i], cmd);
        free(names[i]);
    }
    free(names);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    cr_assert_eq(system(rm), 0);
}
