/* test_tune.c: the kernel tuning knobs (runtime/tune.c, SYMM_TUNE): what the
 * parser accepts and refuses, and that generated variants compile with every
 * knob at its minimum, at its maximum and at fresh random values, without a
 * warning and into code that differs from the default (NVRTC needs no GPU).
 * Knobs out of range that bypass the parser stop at the template's
 * static_asserts. */
#include <criterion/criterion.h>
#include <elf.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "moe_inputs.h"
#include "symm_jit.h"
#include "tune.h"
#include "world_fork.h"
#include "test_file.h"

#define FMT(buf, ...) cr_assert(snprintf(buf, sizeof buf, __VA_ARGS__) < (int)sizeof buf, "%s: too long", #buf)

static moe_rng rng;

static uint32_t rnd(void) { return (uint32_t)(moe_rng_next(&rng) >> 32); }

static int rnd_in(int lo, int hi) { return lo + moe_rng_int(&rng, hi - lo + 1); }

static void seed(void) { wf_random(&rng.s, sizeof rng.s); }

static const struct {
    const char *name;
    int min, max;
} knobs[] = {
    {"BULK_SLOTS", 1, 4}, {"PUSH_WARPS", 1, 16}, {"PUSH_WARPS_SMALL", 0, 16}, {"PUSH_BATCH", 1, 32},
    {"PART_BATCH", 1, 32}, {"SUM_UNROLL", 1, 10}, {"SUM_GATHER", 1, 16},
    {"PREFETCH", 0, 1}, {"LOCAL_VEC", 0, 1}, {"PROFILE", 0, 2}, {"PDL", 0, 1}, {"DEDUP", 0, 1},
    {"PUSH_PARTIALS", 0, 1}, {"PARTIAL_SLOTS", 1, 4}, {"PARTIAL_LANES", 0, 1}, {"PUSH_INTERLEAVE", 0, 1},
    {"PARTIAL_GRID", 0, 1}, {"GRID_OWN", 0, 1}, {"GRID_PACK", 0, 1},
    {"CHAIN_STREAM", 0, 1}, {"CHAIN_WARPS", 0, 8}, {"SUM_PREFETCH", 0, 1},
    {"PART_FLAT", 0, 1}, {"PUSH_SLOTS", 1, 4}, {"GRID_LEAN", 0, 1},
    {"SUM_LEAN", 0, 1}, {"PART_ORDER", 0, 1}, {"BASE_LOADS", 1, 32},
    {"PUSH_ORDER", 0, 1}, {"COUNT16", 0, 1}, {"STEAL", 0, 1}, {"PUSH_DEAL", 0, 1},
    {"SUM_EARLY", 0, 1},
};
#define N_KNOBS (int)(sizeof knobs / sizeof knobs[0])

/* ---- the parser ---------------------------------------------------------- */

TestSuite(tune, .init = seed);

Test(tune, nothing_means_no_option)
{
    symm_tune t;
    cr_assert_eq(symm_tune_parse(NULL, "SYMM_TUNE", &t), SYMM_OK);
    cr_assert_eq(t.count, 0);
    cr_assert(t.pdl && t.profile == 0, "defaults: PDL on, PROFILE 0");
    cr_assert_eq(symm_tune_parse("", "SYMM_TUNE", &t), SYMM_OK);
    cr_assert_eq(t.count, 0);
    cr_assert(t.pdl && t.profile == 0, "defaults: PDL on, PROFILE 0");
    cr_assert_eq(symm_tune_parse(" ,, \t", "SYMM_TUNE", &t), SYMM_OK);
    cr_assert_eq(t.count, 0);
}

/* Every knob in a random order with a random value in range, separated by
 * commas or spaces: one -D option each, in the order given. */
Test(tune, every_knob_in_range_becomes_one_define)
{
    for (int round = 0; round < 50; round++) {
        int order[N_KNOBS], value[N_KNOBS];
        for (int i = 0; i < N_KNOBS; i++)
            order[i] = i;
        for (int i = N_KNOBS - 1; i > 0; i--) {
            int j = rnd_in(0, i), t = order[i];
            order[i] = order[j], order[j] = t;
        }
        const int n = rnd_in(1, N_KNOBS);
        char text[512] = "";
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            const int k = order[i];
            value[i] = rnd_in(knobs[k].min, knobs[k].max);
            const char *sep = i == 0 ? (rnd() % 2 ? " " : "") : (rnd() % 2 ? "," : " \t");
            at += (size_t)snprintf(text + at, sizeof text - at, "%s%s=%d", sep, knobs[k].name, value[i]);
        }
        symm_tune t;
        cr_assert_eq(symm_tune_parse(text, "SYMM_TUNE", &t), SYMM_OK, "\"%s\": %s", text, symm_last_error());
        cr_assert_eq(t.count, n, "\"%s\"", text);
        int profile = 0;
        bool pdl = true;
        for (int i = 0; i < n; i++) {
            char want[64];
            FMT(want, "-DSYMM_TUNE_%s=%d", knobs[order[i]].name, value[i]);
            cr_assert_str_eq(t.option[i], want, "\"%s\"", text);
            if (!strcmp(knobs[order[i]].name, "PROFILE"))
                profile = value[i];
            pdl &= !(!strcmp(knobs[order[i]].name, "PDL") && value[i] == 0);
        }
        cr_assert_eq(t.profile, profile, "\"%s\": profile %d", text, t.profile);
        cr_assert_eq(t.pdl, pdl, "\"%s\": pdl %d", text, t.pdl);
    }
}

/* PROFILE keeps its level: 1 the phase times, 2 the spans too. */
Test(tune, profile_keeps_its_level)
{
    for (int level = 0; level <= 2; level++) {
        char text[32], want[48];
        FMT(text, "PDL=1 PROFILE=%d", level);
        FMT(want, "-DSYMM_TUNE_PROFILE=%d", level);
        symm_tune t;
        cr_assert_eq(symm_tune_parse(text, "SYMM_TUNE", &t), SYMM_OK, "\"%s\": %s", text, symm_last_error());
        cr_assert_eq(t.profile, level, "\"%s\": profile %d", text, t.profile);
        cr_assert_eq(t.count, 2);
        cr_assert_str_eq(t.option[1], want);
    }
}

static void refused(const char *text, const char *item, const char *why)
{
    symm_tune t;
    t.count = 3;
    cr_assert_eq(symm_tune_parse(text, "symm_variant_options.tune", &t), SYMM_ERR_INVALID_ARG, "\"%s\" accepted", text);
    cr_assert_eq(t.count, 0, "\"%s\": options left after an error", text);
    const char *msg = symm_last_error();
    char quoted[128];
    FMT(quoted, "\"%s\"", item);
    cr_assert(strstr(msg, "symm_variant_options.tune"), "\"%s\": no origin: %s", text, msg);
    cr_assert(strstr(msg, quoted), "\"%s\": the item is not named: %s", text, msg);
    cr_assert(strstr(msg, why), "\"%s\": expected \"%s\" in: %s", text, why, msg);
    cr_assert(strstr(msg, "PUSH_WARPS 1..16") && strstr(msg, "DEDUP 0..1") && strstr(msg, "CHAIN_STREAM 0..1"),
              "\"%s\": the knobs are not listed: %s", text, msg);
}

Test(tune, bad_items_are_refused_naming_the_item_and_the_knobs)
{
    refused("PUSH_WARPS", "PUSH_WARPS", "expected NAME=value");
    refused("PUSH_WARPS=4,PUSH_WRAPS=4", "PUSH_WRAPS=4", "unknown knob");
    refused("push_warps=4", "push_warps=4", "unknown knob");
    refused("=4", "=4", "unknown knob");
    refused("PUSH_WARPS=", "PUSH_WARPS=", "expected an integer value");
    refused("PUSH_WARPS=4x", "PUSH_WARPS=4x", "expected an integer value");
    refused("PUSH_WARPS=-4", "PUSH_WARPS=-4", "expected an integer value");
    refused("PUSH_WARPS=+4", "PUSH_WARPS=+4", "expected an integer value");
    refused("PUSH_WARPS=99999999999999999999999", "PUSH_WARPS=99999999999999999999999",
            "expected an integer value");
    refused("SUM_UNROLL=2 SUM_UNROLL=4", "SUM_UNROLL=4", "knob given twice");
    /* PROFILE's levels: 1 the phases, 2 the spans too; nothing above. */
    refused("PUSH_WARPS=4,PROFILE=3", "PROFILE=3", "out of range 0..2");
    for (int k = 0; k < N_KNOBS; k++) {
        char item[64], range[32];
        FMT(range, "out of range %d..%d", knobs[k].min, knobs[k].max);
        FMT(item, "%s=%d", knobs[k].name, knobs[k].max + rnd_in(1, 1000));
        refused(item, item, range);
        if (knobs[k].min > 0) {
            FMT(item, "%s=0", knobs[k].name);
            refused(item, item, range);
        }
    }
}

/* One list of knobs: the runtime's (as its refusal names them: "(knobs:
 * NAME min..max, ...; items"), this file's, and docs/api.md's table (a row
 * "| NAME | min..max |" each) name the same knobs with the same ranges, so
 * that a knob added in one place cannot be missed in another. */
static int knob_index(const char *name);

Test(tune, the_runtime_this_test_and_the_docs_list_the_same_knobs)
{
    symm_tune t;
    cr_assert_eq(symm_tune_parse("NO_SUCH_KNOB=1", "SYMM_TUNE", &t), SYMM_ERR_INVALID_ARG);
    const char *msg = symm_last_error();
    const char *from = strstr(msg, "(knobs: "), *to = from ? strstr(from, "; items") : NULL;
    cr_assert(from && to, "no knob list in: %s", msg);
    from += strlen("(knobs: ");
    char list[1024];
    cr_assert_lt((size_t)(to - from), sizeof list, "%s", msg);
    memcpy(list, from, (size_t)(to - from));
    list[to - from] = '\0';
    int listed = 0;
    for (char *save = NULL, *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char name[64];
        int lo, hi;
        cr_assert_eq(sscanf(item, " %63[A-Z0-9_] %d..%d", name, &lo, &hi), 3, "\"%s\" in: %s", item, msg);
        const int k = knob_index(name);
        cr_assert_eq(knobs[k].min, lo, "%s: the runtime's range %d..%d, this test's %d..%d", name, lo, hi, knobs[k].min,
                     knobs[k].max);
        cr_assert_eq(knobs[k].max, hi, "%s: the runtime's range %d..%d, this test's %d..%d", name, lo, hi, knobs[k].min,
                     knobs[k].max);
        listed++;
    }
    cr_assert_eq(listed, N_KNOBS, "the runtime lists %d knobs, this test %d: %s", listed, N_KNOBS, msg);
    char *docs = test_slurp("docs/api.md", NULL);
    for (int k = 0; k < N_KNOBS; k++) {
        char row[96];
        FMT(row, "\n| %s | %d..%d |", knobs[k].name, knobs[k].min, knobs[k].max);
        cr_assert(strstr(docs, row), "docs/api.md has no row \"%s\" in its table of knobs", row + 1);
    }
    free(docs);
}

/* scripts/test-gpu.sh's tunings part runs the default spec with the knobs at
 * one end of their ranges, then at the other: two SYMM_TUNE lists, the one
 * that starts "BULK_SLOTS=1," and the one that starts
 * "BULK_SLOTS=4,PUSH_WARPS=16,". Each names every knob with a value in its
 * range, and a knob of 0..1 is 0 in one list and 1 in the other, so that a
 * new knob runs on a GPU both ways. */
static int tuning_value(const char *script, const char *start, const char *name)
{
    const char *at = strstr(script, start);
    cr_assert(at, "scripts/test-gpu.sh has no tuning list starting %s", start);
    at++; /* past the opening quote */
    const char *end = strchr(at, '"');
    cr_assert(end, "scripts/test-gpu.sh: the list starting %s is not quoted", start);
    const size_t len = strlen(name);
    for (const char *p = at; p && p < end; p = strchr(p, ',')) {
        if (*p == ',')
            p++;
        if (strncmp(p, name, len) == 0 && p[len] == '=') {
            int v, used = 0;
            cr_assert_eq(sscanf(p + len + 1, "%d%n", &v, &used), 1, "scripts/test-gpu.sh: %s in the list %s...", name,
                         start);
            cr_assert(p[len + 1 + used] == ',' || p[len + 1 + used] == '"', "scripts/test-gpu.sh: %s in the list %s...",
                      name, start);
            return v;
        }
    }
    cr_assert_fail("scripts/test-gpu.sh's tuning list %s... has no %s", start, name);
    return -1;
}

Test(tune, test_gpu_runs_every_knob_at_both_ends)
{
    char *script = test_slurp("scripts/test-gpu.sh", NULL);
    const char *low = "\"BULK_SLOTS=1,", *high = "\"BULK_SLOTS=4,PUSH_WARPS=16,";
    for (int k = 0; k < N_KNOBS; k++) {
        const int lo = tuning_value(script, low, knobs[k].name), hi = tuning_value(script, high, knobs[k].name);
        cr_assert(lo >= knobs[k].min && lo <= knobs[k].max && hi >= knobs[k].min && hi <= knobs[k].max,
                  "scripts/test-gpu.sh: %s=%d and %d, outside %d..%d", knobs[k].name, lo, hi, knobs[k].min,
                  knobs[k].max);
        if (knobs[k].min == 0 && knobs[k].max == 1)
            cr_assert_neq(lo, hi, "scripts/test-gpu.sh: %s is %d in both tuning lists", knobs[k].name, lo);
    }
    free(script);
}

/* ---- compiling tuned variants -------------------------------------------- */

static char work[64];

static void gen_setup(void)
{
    wf_watchdog(600);
    seed();
    const char *build = getenv("SYMM_BUILD_DIR");
    char cmd[PATH_MAX + 200];
    FMT(work, "/tmp/symm-tune-XXXXXX");
    cr_assert(mkdtemp(work) != NULL);
    FMT(cmd, "%s/bin/symmgen -q -o %s specs/default.lua", build ? build : "build", work);
    cr_assert_eq(system(cmd), 0, "%s failed (run from the repository root, after the build)", cmd);
}

/* gen_setup, and specs/bench.lua's variants in work/bench (read them as
 * "bench/<name>"): the prefill shapes default.lua does not have. */
static void gen_setup_bench(void)
{
    gen_setup();
    const char *build = getenv("SYMM_BUILD_DIR");
    char cmd[PATH_MAX + 200];
    FMT(cmd, "%s/bin/symmgen -q -o %s/bench specs/bench.lua", build ? build : "build", work);
    cr_assert_eq(system(cmd), 0, "%s failed (run from the repository root, after the build)", cmd);
}

static void gen_teardown(void)
{
    wf_rmtree(work);
}

static char *read_variant(const char *name)
{
    char path[128];
    FMT(path, "%s/%s.cu", work, name);
    return test_slurp(path, NULL);
}

#define NOT_GIVEN INT_MIN

/* Compiles with -DSYMM_TUNE_<knob>=<value> for each knob (NOT_GIVEN: none);
 * returns the status, and the cubin in *res when it compiled. */
static symm_status compile_tuned(const char *name, const char *src, const int *value, symm_jit_result *res)
{
    static char defs[N_KNOBS][48];
    const char *options[N_KNOBS];
    int n = 0;
    for (int k = 0; k < N_KNOBS; k++)
        if (value[k] != NOT_GIVEN) {
            FMT(defs[n], "-DSYMM_TUNE_%s=%d", knobs[k].name, value[k]);
            options[n] = defs[n];
            n++;
        }
    symm_jit_request req = {.source = src, .source_name = name, .arch = "sm_90a", .options = options,
                            .option_count = (size_t)n, .flags = SYMM_JIT_NO_CACHE};
    return symm_jit_compile(&req, res);
}

/* A rank variant (2 sources per token) and an expert one (8 sources, hidden
 * 7168): the default, every knob at its minimum, at its maximum, and random. */
Test(tune, variants_compile_at_the_ends_of_every_range_and_at_random_values, .init = gen_setup,
     .fini = gen_teardown)
{
    const char *names[] = {"bf16_rank_w2", "bf16_expert_a64_w4"};
    for (size_t v = 0; v < sizeof names / sizeof names[0]; v++) {
        char *src = read_variant(names[v]);
        int none[N_KNOBS], lo[N_KNOBS], hi[N_KNOBS], random[N_KNOBS];
        for (int k = 0; k < N_KNOBS; k++)
            none[k] = NOT_GIVEN, lo[k] = knobs[k].min, hi[k] = knobs[k].max,
            random[k] = rnd() % 4 ? rnd_in(knobs[k].min, knobs[k].max) : NOT_GIVEN;
        symm_jit_result base;
        cr_assert_eq(compile_tuned(names[v], src, none, &base), SYMM_OK, "%s: %s", names[v], symm_last_error());
        const int *tunings[] = {lo, hi, random};
        const char *what[] = {"minimum", "maximum", "random"};
        for (int t = 0; t < 3; t++) {
            symm_jit_result res;
            symm_status st = compile_tuned(names[v], src, tunings[t], &res);
            cr_assert_eq(st, SYMM_OK, "%s, every knob at its %s: %s", names[v], what[t], symm_last_error());
            cr_assert_str_eq(res.log, "", "%s, %s: NVRTC warns: %s", names[v], what[t], res.log);
            if (t < 2)
                cr_assert(res.cubin_size != base.cubin_size || memcmp(res.cubin, base.cubin, res.cubin_size),
                          "%s, every knob at its %s: the same code as the default", names[v], what[t]);
            symm_jit_result_free(&res);
        }
        symm_jit_result_free(&base);
        free(src);
    }
}

/* A value the parser refuses never reaches NVRTC; given directly, the
 * template's static_assert stops it, naming the knob. */
Test(tune, the_template_refuses_out_of_range_knobs_itself, .init = gen_setup, .fini = gen_teardown)
{
    char *src = read_variant("bf16_rank_w2");
    const int k = rnd_in(0, N_KNOBS - 1);
    int value[N_KNOBS];
    for (int i = 0; i < N_KNOBS; i++)
        value[i] = NOT_GIVEN;
    value[k] = rnd() % 2 ? knobs[k].min - 1 : knobs[k].max + 1;
    symm_jit_result res;
    symm_status st = compile_tuned("bf16_rank_w2", src, value, &res);
    cr_assert_neq(st, SYMM_OK, "%s=%d compiled", knobs[k].name, value[k]);
    char want[64];
    FMT(want, "SYMM_TUNE_%s", knobs[k].name);
    cr_assert(strstr(symm_last_error(), want) || (res.log && strstr(res.log, want)),
              "%s=%d: the error does not name the knob: %s", knobs[k].name, value[k], symm_last_error());
    symm_jit_result_free(&res);
    free(src);
}

/* The runtime compiles a variant as programs at once: part 1 holds
 * dispatch, part 2 combine, part 3 the NCCL backend's kernels; each compiles
 * without a warning and holds its kernels only. */
static bool has_symbol(const symm_jit_result *r, const char *name)
{
    return memmem(r->cubin, r->cubin_size, name, strlen(name) + 1) != NULL;
}

Test(tune, a_variant_compiles_as_three_parts_each_with_its_kernels, .init = gen_setup, .fini = gen_teardown)
{
    const char *names[] = {"bf16_rank_w2", "fp8_expert_a128_w2"};
    enum { MAX_KERNELS = 7 };
    const char *kernels[3][MAX_KERNELS] = {{"symm_dispatch", "symm_dispatch_smem"},
                                           {"symm_combine", "symm_combine_smem"},
                                           {"symm_reduce", "symm_nccl_scatter", "symm_nccl_count", "symm_nccl_scan",
                                            "symm_nccl_pack", "symm_nccl_gather", "symm_count_experts"}};
    for (size_t v = 0; v < 2; v++) {
        char *src = read_variant(names[v]);
        const char *options[] = {"-std=c++17", "-default-device"};
        symm_jit_request req = {.source = src, .source_name = names[v], .arch = "sm_90a", .options = options,
                                .option_count = 2, .flags = SYMM_JIT_NO_CACHE};
        symm_jit_result res[3];
        cr_assert_eq(symm_jit_compile_parts(&req, 3, res), SYMM_OK, "%s: %s", names[v], symm_last_error());
        for (int p = 0; p < 3; p++)
            cr_assert_str_eq(res[p].log, "", "%s, part %d: NVRTC warns: %s", names[v], p + 1, res[p].log);
        for (int owner = 0; owner < 3; owner++)
            for (int k = 0; k < MAX_KERNELS && kernels[owner][k]; k++)
                for (int p = 0; p < 3; p++)
                    cr_assert_eq(has_symbol(&res[p], kernels[owner][k]), p == owner, "%s: %s in part %d: %s",
                                 names[v], kernels[owner][k], p + 1, p == owner ? "missing" : "present");
        for (int p = 0; p < 3; p++)
            symm_jit_result_free(&res[p]);
        free(src);
    }
}

/* PARTIAL_GRID, GRID_OWN and GRID_PACK change combine only where they
 * apply: layout expert with combine_order rank, pushing, at max_tokens <=
 * 512 (where all are on by default, so 1 is the default's code and 0
 * another); layout rank, the ascending-k order and the pulling combine
 * compile to the default's code with either value. With PARTIAL_GRID 0,
 * GRID_OWN and GRID_PACK change nothing anywhere. */
static bool same_cubin(const symm_jit_result *x, const symm_jit_result *y)
{
    return x->cubin_size == y->cubin_size && !memcmp(x->cubin, y->cubin, x->cubin_size);
}

/* A cubin's code sections (".text..."): at most 64, each as its name and
 * bytes; false when the ELF is not one this reads. */
typedef struct {
    int count;
    const char *name[64];
    const unsigned char *bytes[64];
    size_t size[64];
} code_sections;

static bool read_code(const symm_jit_result *r, code_sections *out)
{
    const unsigned char *c = (const unsigned char *)r->cubin;
    const size_t n = r->cubin_size;
    out->count = 0;
    if (n < sizeof(Elf64_Ehdr) || memcmp(c, ELFMAG, SELFMAG) != 0 || c[EI_CLASS] != ELFCLASS64)
        return false;
    Elf64_Ehdr eh;
    memcpy(&eh, c, sizeof eh);
    if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > n || eh.e_shnum > (n - eh.e_shoff) / sizeof(Elf64_Shdr) ||
        eh.e_shstrndx >= eh.e_shnum)
        return false;
    Elf64_Shdr names;
    memcpy(&names, c + eh.e_shoff + eh.e_shstrndx * sizeof(Elf64_Shdr), sizeof names);
    if (names.sh_offset > n || names.sh_size > n - names.sh_offset)
        return false;
    for (int i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr sh;
        memcpy(&sh, c + eh.e_shoff + (size_t)i * sizeof(Elf64_Shdr), sizeof sh);
        if (sh.sh_name >= names.sh_size || !memchr(c + names.sh_offset + sh.sh_name, 0, names.sh_size - sh.sh_name))
            return false;
        const char *name = (const char *)c + names.sh_offset + sh.sh_name;
        if (strncmp(name, ".text", 5) != 0)
            continue;
        if (out->count == 64 || sh.sh_offset > n || sh.sh_size > n - sh.sh_offset)
            return false;
        out->name[out->count] = name;
        out->bytes[out->count] = c + sh.sh_offset;
        out->size[out->count++] = sh.sh_size;
    }
    return out->count > 0;
}

/* The same code: the same code sections, byte for byte (the initialised
 * globals may be laid out anew when a constant that no code uses changes:
 * "no change" asks only for the code). */
static bool same_code(const symm_jit_result *x, const symm_jit_result *y)
{
    code_sections a, b;
    cr_assert(read_code(x, &a) && read_code(y, &b), "a cubin without readable code sections");
    if (a.count != b.count)
        return false;
    for (int i = 0; i < a.count; i++)
        if (strcmp(a.name[i], b.name[i]) != 0 || a.size[i] != b.size[i] || memcmp(a.bytes[i], b.bytes[i], a.size[i]))
            return false;
    return true;
}

static int knob_index(const char *name)
{
    for (int k = 0; k < N_KNOBS; k++)
        if (!strcmp(knobs[k].name, name))
            return k;
    cr_assert_fail("no knob %s", name);
    return -1;
}

/* One variant: with `fixed` (NULL: none) at fixed_value, the knob at its
 * default value compiles to the default's code, and at `other` to other
 * code exactly where it `applies`; NVRTC warns at neither.
 * check_knob_case: the same for a 0..1 knob, `other` the default's
 * opposite. */
static void check_knob_values(const char *name, const char *knob, int default_value, int other, const char *fixed,
                              int fixed_value, bool applies)
{
    const int at = knob_index(knob), fix = fixed ? knob_index(fixed) : -1;
    char with[64] = "";
    if (fixed)
        FMT(with, " with %s=%d", fixed, fixed_value);
    char *src = read_variant(name);
    int value[N_KNOBS];
    for (int k = 0; k < N_KNOBS; k++)
        value[k] = NOT_GIVEN;
    if (fix >= 0)
        value[fix] = fixed_value;
    symm_jit_result base, same, changed;
    cr_assert_eq(compile_tuned(name, src, value, &base), SYMM_OK, "%s: %s", name, symm_last_error());
    value[at] = default_value;
    cr_assert_eq(compile_tuned(name, src, value, &same), SYMM_OK, "%s: %s", name, symm_last_error());
    value[at] = other;
    cr_assert_eq(compile_tuned(name, src, value, &changed), SYMM_OK, "%s: %s", name, symm_last_error());
    cr_assert_str_eq(same.log, "", "%s, %s=%d: NVRTC warns: %s", name, knob, default_value, same.log);
    cr_assert_str_eq(changed.log, "", "%s, %s=%d: NVRTC warns: %s", name, knob, other, changed.log);
    cr_assert(same_cubin(&same, &base), "%s%s: %s=%d is not the default's code", name, with, knob, default_value);
    cr_assert_eq(!same_code(&changed, &base), applies, "%s%s: %s=%d %s the default's code", name, with, knob, other,
                 applies ? "gives" : "changes");
    symm_jit_result_free(&base);
    symm_jit_result_free(&same);
    symm_jit_result_free(&changed);
    free(src);
}

static void check_knob_case(const char *name, const char *knob, int default_value, const char *fixed, int fixed_value,
                            bool applies)
{
    check_knob_values(name, knob, default_value, !default_value, fixed, fixed_value, applies);
}

/* The knob on the decode variants: layout expert by rank (pushing) and,
 * where `pull_applies`, its pulling twin; never layout rank or the
 * ascending-k order. */
static void check_decode_knob(const char *knob, int default_value, const char *fixed, int fixed_value,
                              bool applies_anywhere, bool pull_applies)
{
    const struct {
        const char *name;
        bool applies;
    } cases[] = {{"bf16_expert_w2", true}, {"bf16_rank_w2", false}, {"bf16_expert_order_k_w2", false},
                 {"fp16_expert_a8_pull_w2", pull_applies}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        check_knob_case(cases[c].name, knob, default_value, fixed, fixed_value, applies_anywhere && cases[c].applies);
}

Test(tune, partial_grid_changes_only_layout_expert_by_rank_at_decode, .init = gen_setup, .fini = gen_teardown)
{
    check_decode_knob("PARTIAL_GRID", 1, NULL, 0, true, false);
}

Test(tune, grid_own_changes_only_layout_expert_by_rank_at_decode, .init = gen_setup, .fini = gen_teardown)
{
    check_decode_knob("GRID_OWN", 1, NULL, 0, true, false);
}

Test(tune, grid_own_changes_nothing_without_partial_grid, .init = gen_setup, .fini = gen_teardown)
{
    check_decode_knob("GRID_OWN", 1, "PARTIAL_GRID", 0, false, false);
}

Test(tune, grid_pack_changes_only_layout_expert_by_rank_at_decode, .init = gen_setup, .fini = gen_teardown)
{
    check_decode_knob("GRID_PACK", 1, NULL, 0, true, false);
}

Test(tune, grid_pack_changes_nothing_without_partial_grid, .init = gen_setup, .fini = gen_teardown)
{
    check_decode_knob("GRID_PACK", 1, "PARTIAL_GRID", 0, false, false);
}

/* GRID_LEAN (default 1 at world 2, 0 at other worlds) changes the code only
 * where the grid forms the parts: layout expert by rank at decode
 * (bf16_expert_w2's rows, hidden 1024 at top-2, are half a chunk, so its
 * code is the cut-short form); at world 4 its default is 0. */
Test(tune, grid_lean_changes_only_layout_expert_by_rank_at_decode, .init = gen_setup, .fini = gen_teardown)
{
    check_decode_knob("GRID_LEAN", 1, NULL, 0, true, false);
}

Test(tune, grid_lean_is_off_by_default_at_world_4, .init = gen_setup, .fini = gen_teardown)
{
    check_knob_case("bf16_expert_w4", "GRID_LEAN", 0, NULL, 0, true);
}

Test(tune, grid_lean_changes_nothing_without_partial_grid, .init = gen_setup, .fini = gen_teardown)
{
    check_decode_knob("GRID_LEAN", 1, "PARTIAL_GRID", 0, false, false);
}

/* SUM_LEAN (default 1, but 0 for layout rank's pushing combine at max_tokens
 * 512 or less) compiles to the default's code at its default and changes
 * the code only where a token is summed by sum_token_grouped (layout expert
 * by rank without PARTIAL_GRID: here with PUSH_PARTIALS, and the pulling
 * combine) or by sum_token with its sources in one round (layout rank at
 * world 2, pushing and pulling; layout expert's ascending-k order at top-4);
 * not the grid's waiting sums at decode. */
Test(tune, sum_lean_changes_only_the_sums_it_has_a_lean_form_of, .init = gen_setup, .fini = gen_teardown)
{
    check_knob_case("bf16_expert_w2", "SUM_LEAN", 1, "PUSH_PARTIALS", 1, true);
    check_knob_case("fp16_expert_a8_pull_w2", "SUM_LEAN", 1, NULL, 0, true);
    check_knob_case("bf16_rank_w2", "SUM_LEAN", 0, NULL, 0, true);
    check_knob_case("bf16_rank_pull_w2", "SUM_LEAN", 1, NULL, 0, true);
    check_knob_case("bf16_expert_w2", "SUM_LEAN", 1, NULL, 0, false);
    check_knob_case("bf16_expert_order_k_w2", "SUM_LEAN", 1, NULL, 0, true);
}

/* SUM_PREFETCH (default 1 for layout expert, 0 for layout rank): at the
 * default every variant compiles to the default's code, and at the other
 * value to other code where it applies: the prefetch before a token's sums
 * in layout rank, the ascending-k order and the parts' sums
 * (PUSH_PARTIALS). */
Test(tune, the_sum_prefetch_knob_keeps_the_default_and_changes_what_it_applies_to, .init = gen_setup, .fini = gen_teardown)
{
    check_knob_case("bf16_rank_w2", "SUM_PREFETCH", 0, NULL, 0, true);
    check_knob_case("bf16_rank_pull_w2", "SUM_PREFETCH", 0, NULL, 0, true);
    check_knob_case("bf16_expert_order_k_w2", "SUM_PREFETCH", 1, NULL, 0, true);
    check_knob_case("bf16_expert_w2", "SUM_PREFETCH", 1, "PUSH_PARTIALS", 1, true);
}

/* PART_FLAT (default 1): at 1 every variant compiles to the default's code;
 * at 0 it changes the code only where a push warp forms parts
 * (PUSH_PARTIALS: layout expert by rank), neither layout rank's nor the
 * ascending-k order's nor layout expert's without PUSH_PARTIALS. */
Test(tune, the_part_flat_knob_changes_only_the_pushed_parts, .init = gen_setup, .fini = gen_teardown)
{
    check_knob_case("bf16_expert_w2", "PART_FLAT", 1, "PUSH_PARTIALS", 1, true);
    check_knob_case("bf16_expert_w2", "PART_FLAT", 1, "PUSH_PARTIALS", 0, false);
    check_knob_case("bf16_rank_w2", "PART_FLAT", 1, NULL, 0, false);
    check_knob_case("bf16_expert_order_k_w2", "PART_FLAT", 1, NULL, 0, false);
}

/* PART_ORDER (default 1 where it applies) compiles to the default's code at
 * 1 and changes the code only where a push warp forms the peers' parts
 * (PUSH_PARTIALS, with DEDUP), and there both kernels: dispatch writes the
 * words a head, combine reads them. Not layout rank, not the ascending-k
 * order, not layout expert's grid parts at decode (no PUSH_PARTIALS). */
Test(tune, the_part_order_knob_changes_only_the_pushed_parts, .init = gen_setup, .fini = gen_teardown)
{
    check_knob_case("bf16_expert_w2", "PART_ORDER", 1, "PUSH_PARTIALS", 1, true);
    check_knob_case("bf16_expert_w4", "PART_ORDER", 1, "PUSH_PARTIALS", 1, true);
    check_knob_case("bf16_expert_w2", "PART_ORDER", 1, "PUSH_PARTIALS", 0, false);
    check_knob_case("bf16_rank_w2", "PART_ORDER", 1, NULL, 0, false);
    check_knob_case("bf16_expert_order_k_w2", "PART_ORDER", 1, NULL, 0, false);
}

/* BASE_LOADS (default 4): at 4 every variant compiles to the default's
 * code, and another batch changes dispatch's wait for the counts in both
 * layouts. */
Test(tune, the_base_loads_knob_changes_the_wait_for_the_counts, .init = gen_setup, .fini = gen_teardown)
{
    check_knob_values("bf16_expert_w2", "BASE_LOADS", 4, 16, NULL, 0, true);
    check_knob_values("bf16_expert_w4", "BASE_LOADS", 4, 8, NULL, 0, true);
    check_knob_values("bf16_rank_w2", "BASE_LOADS", 4, 16, NULL, 0, true);
}

/* STEAL (default 1) compiles to the default's code at 1; at 0 it changes
 * layout rank's dispatch, at worlds 2 and 4 and with fp8 rows, and never
 * layout expert's code. */
Test(tune, the_steal_knob_changes_only_layout_rank, .init = gen_setup, .fini = gen_teardown)
{
    check_knob_case("bf16_rank_w2", "STEAL", 1, NULL, 0, true);
    check_knob_case("bf16_rank_w4", "STEAL", 1, NULL, 0, true);
    check_knob_case("fp8_rank_w2", "STEAL", 1, NULL, 0, true);
    check_knob_case("bf16_expert_w2", "STEAL", 1, NULL, 0, false);
}

/* PUSH_DEAL (default 1) compiles to the default's code at 1; at 0 it
 * changes layout rank's pushing combine, at worlds 2 and 4, and never layout
 * expert's code. */
Test(tune, the_push_deal_knob_changes_only_layout_rank, .init = gen_setup, .fini = gen_teardown)
{
    check_knob_case("bf16_rank_w2", "PUSH_DEAL", 1, NULL, 0, true);
    check_knob_case("bf16_rank_w4", "PUSH_DEAL", 1, NULL, 0, true);
    check_knob_case("bf16_expert_w2", "PUSH_DEAL", 1, NULL, 0, false);
}

/* LOCAL_VEC (default 1 for layout rank's fp8 rows above max_tokens 512,
 * else 0) compiles to the default's code at its default and changes the
 * code the other way, in every layout and dtype (the knob reaches every
 * dispatch): the default's own value differs by variant. */
Test(tune, the_local_vec_knob_defaults_on_for_layout_rank_fp8_prefill, .init = gen_setup_bench, .fini = gen_teardown)
{
    check_knob_case("bench/bench_dsv3_prefill_fp8", "LOCAL_VEC", 1, NULL, 0, true);
    check_knob_case("bench/bench_dsv3_decode_fp8", "LOCAL_VEC", 0, NULL, 0, true);
    check_knob_case("bench/bench_dsv3_prefill", "LOCAL_VEC", 0, NULL, 0, true);
    check_knob_case("bench/bench_dsv3_prefill_expert_fp8", "LOCAL_VEC", 0, NULL, 0, true);
    check_knob_case("fp8_rank_w2", "LOCAL_VEC", 0, NULL, 0, true);
}

/* SUM_EARLY (default 1 where it applies) compiles to the default's code at
 * 1; at 0 it changes layout rank's pushing combine at max_tokens 512 or
 * less, at worlds 2 and 4, and never layout rank's at prefill (SUM_LEAN),
 * layout expert's or the pulling combine's. */
Test(tune, the_sum_early_knob_changes_only_layout_rank_s_pushing_sums, .init = gen_setup_bench, .fini = gen_teardown)
{
    check_knob_case("bf16_rank_w2", "SUM_EARLY", 1, NULL, 0, true);
    check_knob_case("bf16_rank_w4", "SUM_EARLY", 1, NULL, 0, true);
    check_knob_case("bench/bench_dsv3_decode", "SUM_EARLY", 1, NULL, 0, true);
    check_knob_case("bench/bench_dsv3_prefill", "SUM_EARLY", 1, NULL, 0, false);
    check_knob_case("bf16_expert_w2", "SUM_EARLY", 1, NULL, 0, false);
    check_knob_case("bench/bench_dsv3_decode_pull", "SUM_EARLY", 1, NULL, 0, false);
}

/* COUNT16 (default 1 where it applies) compiles to the default's code at
 * 1; at 0 it changes layout expert's code (dispatch writes 8-byte count
 * words, compute_bases reads them), both combine orders, at worlds 2 and 4,
 * and never layout rank's. */
Test(tune, the_count16_knob_changes_only_layout_expert, .init = gen_setup, .fini = gen_teardown)
{
    check_knob_case("bf16_expert_w2", "COUNT16", 1, NULL, 0, true);
    check_knob_case("bf16_expert_w4", "COUNT16", 1, NULL, 0, true);
    check_knob_case("bf16_expert_order_k_w2", "COUNT16", 1, NULL, 0, true);
    check_knob_case("bf16_rank_w2", "COUNT16", 1, NULL, 0, false);
}

/* PUSH_ORDER (default 1 where it applies) compiles to the default's code
 * at 1 and changes only the ascending-k order's variants (dispatch's words
 * and combine's pushes), at decode and at prefill; never layout rank or
 * layout expert by rank. */
Test(tune, the_push_order_knob_changes_only_the_ascending_k_order, .init = gen_setup_bench, .fini = gen_teardown)
{
    check_knob_case("bf16_expert_order_k_w2", "PUSH_ORDER", 1, NULL, 0, true);
    check_knob_case("bench/bench_dsv3_prefill_expert_k", "PUSH_ORDER", 1, NULL, 0, true);
    check_knob_case("bf16_expert_w2", "PUSH_ORDER", 1, NULL, 0, false);
    check_knob_case("bench/bench_dsv3_prefill_expert", "PUSH_ORDER", 1, NULL, 0, false);
    check_knob_case("bf16_rank_w2", "PUSH_ORDER", 1, NULL, 0, false);
}

/* PUSH_SLOTS (by default 3 for layout rank at world 2 with 24 SMs or more
 * above max_tokens 512 where a row fits three slots whole, else
 * BULK_SLOTS): at its default every variant compiles to the default's
 * code; another value changes the code of combines that push whole rows,
 * and not layout expert's with PUSH_PARTIALS (its staging follows
 * BULK_SLOTS and PARTIAL_SLOTS) or PARTIAL_GRID (the default at max_tokens
 * 512), nor a pulling combine (no staging). */
Test(tune, push_slots_default_and_where_it_applies, .init = gen_setup_bench, .fini = gen_teardown)
{
    check_knob_values("bench/bench_dsv3_prefill", "PUSH_SLOTS", 3, 2, NULL, 0, true); /* world 2, 24 SMs, 4096 */
    check_knob_values("bench/bench_dsv3_prefill_sms16", "PUSH_SLOTS", 2, 3, NULL, 0, true); /* 16 SMs */
    check_knob_values("bench/bench_dsv3_decode", "PUSH_SLOTS", 2, 3, NULL, 0, true);        /* max_tokens 128 */
    check_knob_values("bf16_rank_w2", "PUSH_SLOTS", 2, 3, NULL, 0, true);                   /* max_tokens 256 */
    check_knob_values("bf16_rank_w4", "PUSH_SLOTS", 2, 3, NULL, 0, true);                   /* world 4 */
    check_knob_values("bf16_expert_w2", "PUSH_SLOTS", 1, 3, "PARTIAL_GRID", 0, true);       /* rows pushed whole */
    check_knob_values("bf16_expert_w2", "PUSH_SLOTS", 1, 3, "PUSH_PARTIALS", 1, false);
    check_knob_values("bf16_expert_w2", "PUSH_SLOTS", 1, 3, NULL, 0, false);
    check_knob_values("bf16_rank_pull_w2", "PUSH_SLOTS", 2, 3, NULL, 0, false);
}

/* PART_BATCH (8 unless set, whatever PUSH_BATCH is): with PUSH_PARTIALS,
 * PART_BATCH=8 compiles to the default's code and 4 to other code, both
 * without a warning; PUSH_BATCH=8 leaves the parts' batch at 8 (its code
 * is the same as PUSH_BATCH=8 with PART_BATCH=8 given). */
Test(tune, part_batch_default_is_8, .init = gen_setup, .fini = gen_teardown)
{
    const char *name = "bf16_expert_w2";
    char *src = read_variant(name);
    const int part = knob_index("PART_BATCH"), push = knob_index("PUSH_BATCH");
    int value[N_KNOBS];
    for (int k = 0; k < N_KNOBS; k++)
        value[k] = NOT_GIVEN;
    value[knob_index("PUSH_PARTIALS")] = 1;
    symm_jit_result base, same, changed, push8, both;
    cr_assert_eq(compile_tuned(name, src, value, &base), SYMM_OK, "%s: %s", name, symm_last_error());
    value[part] = 8;
    cr_assert_eq(compile_tuned(name, src, value, &same), SYMM_OK, "%s: %s", name, symm_last_error());
    value[part] = 4;
    cr_assert_eq(compile_tuned(name, src, value, &changed), SYMM_OK, "%s: %s", name, symm_last_error());
    value[part] = NOT_GIVEN;
    value[push] = 8;
    cr_assert_eq(compile_tuned(name, src, value, &push8), SYMM_OK, "%s: %s", name, symm_last_error());
    value[part] = 8;
    cr_assert_eq(compile_tuned(name, src, value, &both), SYMM_OK, "%s: %s", name, symm_last_error());
    cr_assert_str_eq(changed.log, "", "%s, PART_BATCH=4: NVRTC warns: %s", name, changed.log);
    cr_assert(same_cubin(&same, &base), "%s: PART_BATCH=8 is not the default's code", name);
    cr_assert(!same_code(&changed, &base), "%s: PART_BATCH=4 gives the default's code", name);
    cr_assert(same_cubin(&both, &push8), "%s: PUSH_BATCH=8 changes the parts' batch from 8", name);
    symm_jit_result_free(&base);
    symm_jit_result_free(&same);
    symm_jit_result_free(&changed);
    symm_jit_result_free(&push8);
    symm_jit_result_free(&both);
    free(src);
}

/* PROFILE=2 compiles the spans of every kind of warp without a warning,
 * into code other than PROFILE=1's with the same knobs: layout rank's push
 * warps, sums and dispatch's rows; layout expert's parts formed by the grid
 * (its sums' wait for them), by the push warps with the lanes storing
 * (the default where PUSH_PARTIALS is on) and with bulk stores through two
 * slots; the pulling combine. */
Test(tune, profile_2_compiles_the_spans_of_every_kind_of_warp, .init = gen_setup, .fini = gen_teardown)
{
    const struct {
        const char *name;
        const char *knobs[3];
        int values[3];
    } cases[] = {
        {"bf16_rank_w2", {NULL}, {0}},
        {"bf16_expert_w2", {NULL}, {0}},
        {"bf16_expert_w2", {"PUSH_PARTIALS", NULL}, {1}},
        {"bf16_expert_w2", {"PUSH_PARTIALS", "PARTIAL_LANES", "PARTIAL_SLOTS"}, {1, 0, 2}},
        {"fp16_expert_a8_pull_w2", {NULL}, {0}},
    };
    const int profile = knob_index("PROFILE");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *src = read_variant(cases[c].name);
        int value[N_KNOBS];
        for (int k = 0; k < N_KNOBS; k++)
            value[k] = NOT_GIVEN;
        for (int i = 0; i < 3 && cases[c].knobs[i]; i++)
            value[knob_index(cases[c].knobs[i])] = cases[c].values[i];
        symm_jit_result phases, spans;
        value[profile] = 1;
        cr_assert_eq(compile_tuned(cases[c].name, src, value, &phases), SYMM_OK, "%s, case %zu, PROFILE=1: %s",
                     cases[c].name, c, symm_last_error());
        value[profile] = 2;
        cr_assert_eq(compile_tuned(cases[c].name, src, value, &spans), SYMM_OK, "%s, case %zu, PROFILE=2: %s",
                     cases[c].name, c, symm_last_error());
        cr_assert_str_eq(spans.log, "", "%s, case %zu, PROFILE=2: NVRTC warns: %s", cases[c].name, c, spans.log);
        cr_assert(!same_cubin(&phases, &spans), "%s, case %zu: PROFILE=2 compiles to PROFILE=1's code",
                  cases[c].name, c);
        symm_jit_result_free(&phases);
        symm_jit_result_free(&spans);
        free(src);
    }
}
