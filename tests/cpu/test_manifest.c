/* test_manifest.c: opening variants by name from a manifest.json
 * (symm_manifest_*, symm_variant_open): the hand-written fixture in
 * tests/cpu/fixtures/manifest, random manifests written by the generator's
 * own writer, a real symmgen output of specs/default.lua compared with its C
 * stubs, one message per kind of bad field, JSON syntax errors with their
 * line and column, and a fuzz loop that must never crash. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_api.h"
#include "json.h"
#include "sg.h"
#include "sha256.h"
#include "symm_manifest.h"
#include "symm_world.h"
#include "variant_internal.h"
#include "world_fork.h"
#include "test_file.h"

#define FIXTURE_DIR "tests/cpu/fixtures/manifest"
#define FIXTURE FIXTURE_DIR "/manifest.json"
#define RANK_SHA "890e784e8e9d9d4c835ceb7feb5fc46d206824c3beaad6f92fe939e008560e0b"

/* --- helpers ------------------------------------------------------------- */

static uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t below(uint64_t *s, uint64_t n) { return next_random(s) % n; }

static uint64_t fresh_seed(void)
{
    uint64_t seed;
    wf_random(&seed, sizeof seed);
    return seed;
}

static void spit(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot create %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

/* text with its first occurrence of from replaced by to (which must exist:
 * a mutation that does not apply would make its test pass for nothing). */
static char *replace_once(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    cr_assert(at, "the fixture has no \"%s\" to replace", from);
    size_t head = (size_t)(at - text), n = strlen(text) - strlen(from) + strlen(to);
    char *out = malloc(n + 1);
    cr_assert(out);
    snprintf(out, n + 1, "%.*s%s%s", (int)head, text, to, at + strlen(from));
    return out;
}

/* A temporary directory holding the fixture's .cu files and a manifest. */
typedef struct scratch {
    char dir[256];
    char manifest[320];
} scratch;

static void scratch_make(scratch *s)
{
    wf_tempdir(s->dir, sizeof s->dir);
    cr_assert(s->dir[0], "mkdtemp failed");
    snprintf(s->manifest, sizeof s->manifest, "%s/manifest.json", s->dir);
    static const char *const sources[] = {"tiny_rank.cu", "tiny_expert_fp8.cu"};
    for (size_t i = 0; i < 2; i++) {
        char from[256], to[320];
        size_t len;
        snprintf(from, sizeof from, FIXTURE_DIR "/%s", sources[i]);
        snprintf(to, sizeof to, "%s/%s", s->dir, sources[i]);
        char *text = test_slurp(from, &len);
        spit(to, text, len);
        free(text);
    }
}

static void scratch_write(const scratch *s, const char *text) { spit(s->manifest, text, strlen(text)); }

static void expect_failure(symm_status got, symm_status want, const char *prefix, const char *needle)
{
    const char *msg = symm_last_error();
    cr_assert_eq(got, want, "got %s (%s), expected %s", symm_status_name(got), msg, symm_status_name(want));
    cr_assert(strncmp(msg, prefix, strlen(prefix)) == 0, "message \"%s\" does not start with \"%s\"", msg, prefix);
    cr_assert(strstr(msg, needle), "message \"%s\" lacks \"%s\"", msg, needle);
}

/* --- the fixture ---------------------------------------------------------- */

typedef struct want_region {
    symm_region id;
    uint64_t offset, bytes;
} want_region;

static void expect_regions(const symm_variant_desc *d, const want_region *want, size_t n)
{
    bool listed[SYMM_REGION_COUNT] = {false};
    for (size_t i = 0; i < n; i++) {
        const symm_region_desc *r = &d->regions[want[i].id];
        listed[want[i].id] = true;
        cr_assert(r->offset == want[i].offset && r->bytes == want[i].bytes,
                  "%s: region %d: offset %llu bytes %llu, expected %llu %llu", d->name, (int)want[i].id,
                  (unsigned long long)r->offset, (unsigned long long)r->bytes,
                  (unsigned long long)want[i].offset, (unsigned long long)want[i].bytes);
    }
    for (int id = 0; id < SYMM_REGION_COUNT; id++) {
        const symm_region_desc *r = &d->regions[id];
        const bool symmetric = id < SYMM_REGION_STATE || id == SYMM_REGION_COMBINE_FLAGS ||
                               id == SYMM_REGION_RECV_CHAIN || id == SYMM_REGION_Y ||
                               id == SYMM_REGION_CHAIN_READY;
        cr_assert_eq(r->symmetric, symmetric, "%s: region %d: symmetric %d", d->name, id, r->symmetric);
        if (!listed[id])
            cr_assert(r->offset == 0 && r->bytes == 0, "%s: region %d is not listed, expected it empty", d->name, id);
    }
}

static void expect_source(const symm_variant_desc *d, const char *file, const char *sha)
{
    size_t len;
    char *text = test_slurp(file, &len);
    cr_assert_eq(d->source_len, len, "%s: source_len %zu, the file has %zu bytes", d->name, d->source_len, len);
    cr_assert(d->source && memcmp(d->source, text, len) == 0 && d->source[len] == '\0',
              "%s: source differs from %s", d->name, file);
    cr_assert_str_eq(d->source_sha256, sha);
    free(text);
}

static void expect_common(const symm_variant_desc *d)
{
    cr_assert_eq(d->abi, SYMM_DESC_ABI);
    cr_assert_str_eq(d->spec_file, "specs/tiny.lua");
    cr_assert_str_eq(d->symmgen_version, "0.1.0");
    cr_assert_eq(d->n_nvrtc_options, 2);
    cr_assert_str_eq(d->nvrtc_options[0], "-std=c++17");
    cr_assert_str_eq(d->nvrtc_options[1], "-default-device");
}

Test(manifest, fixture_fills_every_field_of_the_desc)
{
    symm_manifest *m;
    cr_assert_eq(symm_manifest_open(FIXTURE, &m), SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(symm_manifest_count(m), 2);
    cr_assert_str_eq(symm_manifest_name(m, 0), "tiny_rank");
    cr_assert_str_eq(symm_manifest_name(m, 1), "tiny_expert_fp8");

    const symm_variant_desc *d;
    cr_assert_eq(symm_manifest_variant(m, "tiny_rank", &d), SYMM_OK, "%s", symm_last_error());
    expect_common(d);
    cr_assert_str_eq(d->name, "tiny_rank");
    cr_assert(d->hidden == 256 && d->topk == 2 && d->experts == 8 && d->world == 2 && d->max_tokens == 16);
    cr_assert(d->dtype == SYMM_DTYPE_BF16 && d->combine_dtype == SYMM_DTYPE_BF16 && d->layout == SYMM_LAYOUT_RANK);
    cr_assert(d->weights == 1 && d->align == 1 && d->sms == 24 && d->capacity == 32 && d->worst_capacity == 32);
    cr_assert_eq(d->combine, SYMM_COMBINE_PUSH, "\"combine\": \"push\" reads as SYMM_COMBINE_PUSH");
    cr_assert(d->symmetric_bytes == 35072 && d->scratch_bytes == 1024);
    static const want_region rank_regions[] = {
        {SYMM_REGION_SIGNALS, 0, 768},         {SYMM_REGION_COUNTS, 768, 32},
        {SYMM_REGION_RECV_X, 1024, 16384},     {SYMM_REGION_RECV_SRC, 17408, 512},
        {SYMM_REGION_RECV_TOPK, 17920, 256},   {SYMM_REGION_RECV_WEIGHTS, 18176, 256},
        {SYMM_REGION_COMBINE_IN, 18432, 16384}, {SYMM_REGION_STATE, 0, 256},
        {SYMM_REGION_EXPERT_COUNT, 256, 16},   {SYMM_REGION_EXPERT_OFFSET, 512, 16},
        {SYMM_REGION_TOKEN_ROUTE, 768, 128},   {SYMM_REGION_COMBINE_FLAGS, 34816, 256},
    };
    expect_regions(d, rank_regions, SYMM_ARRAY_LEN(rank_regions));
    expect_source(d, FIXTURE_DIR "/tiny_rank.cu", RANK_SHA);

    /* The second variant lists its keys and regions in another order. */
    cr_assert_eq(symm_manifest_variant(m, "tiny_expert_fp8", &d), SYMM_OK, "%s", symm_last_error());
    expect_common(d);
    cr_assert_str_eq(d->name, "tiny_expert_fp8");
    cr_assert(d->hidden == 256 && d->topk == 4 && d->experts == 8 && d->world == 4 && d->max_tokens == 8);
    cr_assert(d->dtype == SYMM_DTYPE_FP8_E4M3 && d->combine_dtype == SYMM_DTYPE_FP16 &&
              d->layout == SYMM_LAYOUT_EXPERT);
    cr_assert(d->weights == 1 && d->align == 4 && d->sms == 8 && d->capacity == 40 && d->worst_capacity == 70);
    cr_assert_eq(d->combine, SYMM_COMBINE_PUSH, "a variant without \"combine\" pushes");
    cr_assert(d->symmetric_bytes == 30208 && d->scratch_bytes == 1280);
    static const want_region expert_regions[] = {
        {SYMM_REGION_SIGNALS, 0, 1536},         {SYMM_REGION_COUNTS, 1536, 256},
        {SYMM_REGION_RECV_X, 1792, 10240},      {SYMM_REGION_RECV_SCALES, 12032, 320},
        {SYMM_REGION_RECV_SRC, 12544, 640},     {SYMM_REGION_RECV_WEIGHTS, 13312, 160},
        {SYMM_REGION_COMBINE_IN, 13568, 16384}, {SYMM_REGION_STATE, 0, 256},
        {SYMM_REGION_EXPERT_COUNT, 256, 8},     {SYMM_REGION_EXPERT_OFFSET, 512, 8},
        {SYMM_REGION_TOKEN_ROUTE, 768, 256},    {SYMM_REGION_TOKEN_WEIGHTS, 1024, 128},
        {SYMM_REGION_COMBINE_FLAGS, 29952, 256},
    };
    expect_regions(d, expert_regions, SYMM_ARRAY_LEN(expert_regions));
    expect_source(d, FIXTURE_DIR "/tiny_expert_fp8.cu",
                  "790d4f62b9b1af1617df299cb627c531b1c92e933fd9754906f9e148e67dfb23");
    symm_manifest_close(m);
}

/* The fixture with `from` replaced by `to`, opened; when it opens, its two
 * variants in *rank and *expert. The open's status comes back. */
static symm_status open_edited(scratch *s, const char *text, const char *from, const char *to, symm_manifest **m,
                               const symm_variant_desc **rank, const symm_variant_desc **expert)
{
    char *edited = replace_once(text, from, to);
    scratch_write(s, edited);
    free(edited);
    symm_status st = symm_manifest_open(s->manifest, m);
    if (st == SYMM_OK) {
        cr_assert_eq(symm_manifest_variant(*m, "tiny_rank", rank), SYMM_OK, "%s", symm_last_error());
        cr_assert_eq(symm_manifest_variant(*m, "tiny_expert_fp8", expert), SYMM_OK, "%s", symm_last_error());
    }
    return st;
}

/* "combine": "pull" or "auto" sets desc.combine; "push" and a manifest
 * without the member (written before combine = "pull" existed) push;
 * "auto" with layout expert, or another word, is refused naming the field
 * and the values. */
Test(manifest, combine_is_read_and_a_manifest_without_it_pushes)
{
    char *text = test_slurp(FIXTURE, NULL);
    static const struct {
        const char *from, *to;
        int rank, expert; /* desc.combine of tiny_rank and tiny_expert_fp8 */
    } cases[] = {
        {"\"combine\": \"push\"", "\"combine\": \"push\"", SYMM_COMBINE_PUSH, SYMM_COMBINE_PUSH},
        {"\"combine\": \"push\"", "\"combine\": \"pull\"", SYMM_COMBINE_PULL, SYMM_COMBINE_PUSH},
        {"\"combine\": \"push\"", "\"combine\": \"auto\"", SYMM_COMBINE_AUTO, SYMM_COMBINE_PUSH},
        {"      \"combine\": \"push\",\n", "", SYMM_COMBINE_PUSH, SYMM_COMBINE_PUSH},
        {"\"layout\": \"expert\",", "\"layout\": \"expert\", \"combine\": \"pull\",", SYMM_COMBINE_PUSH,
         SYMM_COMBINE_PULL},
        {"\"layout\": \"expert\",", "\"layout\": \"expert\", \"combine\": \"push\",", SYMM_COMBINE_PUSH,
         SYMM_COMBINE_PUSH},
    };
    scratch s;
    scratch_make(&s);
    for (size_t i = 0; i < SYMM_ARRAY_LEN(cases); i++) {
        symm_manifest *m;
        const symm_variant_desc *rank, *expert;
        cr_assert_eq(open_edited(&s, text, cases[i].from, cases[i].to, &m, &rank, &expert), SYMM_OK, "case %zu: %s",
                     i, symm_last_error());
        cr_assert((int)rank->combine == cases[i].rank && (int)expert->combine == cases[i].expert,
                  "case %zu (%s): combine %d and %d, expected %d and %d", i, cases[i].to, (int)rank->combine,
                  (int)expert->combine, cases[i].rank, cases[i].expert);
        symm_manifest_close(m);
    }
    static const struct {
        const char *from, *to, *why;
    } bad[] = {
        {"\"layout\": \"expert\",", "\"layout\": \"expert\", \"combine\": \"auto\",",
         "variant tiny_expert_fp8: field combine: got \"auto\", expected push or pull with layout expert (auto is "
         "for layout rank only)"},
        {"\"combine\": \"push\"", "\"combine\": \"automatic\"",
         "variant tiny_rank: field combine: got \"automatic\", expected push, pull or auto"},
    };
    for (size_t i = 0; i < SYMM_ARRAY_LEN(bad); i++) {
        symm_manifest *m;
        const symm_variant_desc *rank, *expert;
        symm_status st = open_edited(&s, text, bad[i].from, bad[i].to, &m, &rank, &expert);
        cr_assert(st == SYMM_ERR_INVALID_ARG && strstr(symm_last_error(), bad[i].why),
                  "%s: got %s (%s), expected SYMM_ERR_INVALID_ARG naming: %s", bad[i].to, symm_status_name(st),
                  symm_last_error(), bad[i].why);
    }
    free(text);
    wf_rmtree(s.dir);
}

/* "combine_order": "k" or "rank"; a manifest without it reads as rank.
 * The fixture's tiny_expert_fp8 says k (and its source agrees). */
Test(manifest, combine_order_is_read_and_a_manifest_without_it_sums_by_rank)
{
    char *text = test_slurp(FIXTURE, NULL);
    static const struct {
        const char *from, *to;
        symm_combine_order expert;
        const char *error; /* NULL: opens */
    } cases[] = {
        {"\"combine_order\": \"k\"", "\"combine_order\": \"k\"", SYMM_COMBINE_ORDER_K, NULL},
        {"\"combine_order\": \"k\"", "\"combine_order\": \"rank\"", SYMM_COMBINE_ORDER_RANK, NULL},
        {"      \"combine_order\": \"k\",\n", "", SYMM_COMBINE_ORDER_RANK, NULL},
        {"\"combine_order\": \"k\"", "\"combine_order\": \"token\"", SYMM_COMBINE_ORDER_K,
         "field combine_order: got \"token\", expected rank or k"},
    };
    scratch s;
    scratch_make(&s);
    for (size_t i = 0; i < SYMM_ARRAY_LEN(cases); i++) {
        symm_manifest *m;
        const symm_variant_desc *rank, *expert;
        symm_status st = open_edited(&s, text, cases[i].from, cases[i].to, &m, &rank, &expert);
        if (cases[i].error) {
            cr_assert(st != SYMM_OK && strstr(symm_last_error(), cases[i].error), "case %zu: %s: %s", i,
                      symm_status_name(st), symm_last_error());
            continue;
        }
        cr_assert_eq(st, SYMM_OK, "case %zu: %s", i, symm_last_error());
        cr_assert(rank->combine_order == SYMM_COMBINE_ORDER_RANK && expert->combine_order == cases[i].expert,
                  "case %zu: combine_order %d and %d, expected 0 and %d", i, rank->combine_order,
                  expert->combine_order, cases[i].expert);
        symm_manifest_close(m);
    }
    free(text);
    wf_rmtree(s.dir);
}

Test(manifest, nvrtc_options_are_the_generators)
{
    static const char *const runtime[] = {SYMM_NVRTC_DEFAULT_OPTIONS};
    static const char *const generator[] = {SG_NVRTC_OPTIONS};
    cr_assert_eq(SYMM_ARRAY_LEN(runtime), SYMM_ARRAY_LEN(generator), "SYMM_NVRTC_DEFAULT_OPTIONS and SG_NVRTC_OPTIONS differ in length");
    for (size_t i = 0; i < SYMM_ARRAY_LEN(runtime); i++)
        cr_assert_str_eq(runtime[i], generator[i], "option %zu differs from SG_NVRTC_OPTIONS", i);
}

Test(manifest, desc_is_read_once_and_names_come_in_order)
{
    symm_manifest *m;
    cr_assert_eq(symm_manifest_open(FIXTURE, &m), SYMM_OK, "%s", symm_last_error());
    const symm_variant_desc *a, *b;
    cr_assert_eq(symm_manifest_variant(m, "tiny_expert_fp8", &a), SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(symm_manifest_variant(m, "tiny_expert_fp8", &b), SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(a, b, "the same name must give the same descriptor");
    cr_assert_null(symm_manifest_name(m, 2));
    cr_assert_null(symm_manifest_name(NULL, 0));
    cr_assert_eq(symm_manifest_count(NULL), 0);
    symm_manifest_close(m);
    symm_manifest_close(NULL);
}

Test(manifest, null_arguments_are_refused)
{
    symm_manifest *m = (symm_manifest *)1;
    expect_failure(symm_manifest_open(NULL, &m), SYMM_ERR_INVALID_ARG, "symm_manifest_open", "path is NULL");
    cr_assert_null(m);
    expect_failure(symm_manifest_open(FIXTURE, NULL), SYMM_ERR_INVALID_ARG, "symm_manifest_open", "out is NULL");
    const symm_variant_desc *d = (const symm_variant_desc *)1;
    expect_failure(symm_manifest_variant(NULL, "x", &d), SYMM_ERR_INVALID_ARG, "symm_manifest_variant",
                   "manifest is NULL");
    cr_assert_null(d);
    symm_variant *v = (symm_variant *)1;
    expect_failure(symm_variant_open(NULL, FIXTURE, "tiny_rank", NULL, &v), SYMM_ERR_INVALID_ARG,
                   "symm_variant_open", "world is NULL");
    cr_assert_null(v);
}

Test(manifest, unreadable_manifest_is_a_system_error_naming_it)
{
    scratch s;
    scratch_make(&s);
    symm_manifest *m;
    expect_failure(symm_manifest_open(s.manifest, &m), SYMM_ERR_SYSTEM, "symm_manifest_open", s.manifest);
    cr_assert(strstr(symm_last_error(), "No such file"), "%s", symm_last_error());
    expect_failure(symm_manifest_open(s.dir, &m), SYMM_ERR_SYSTEM, "symm_manifest_open", "not a regular file");
    wf_rmtree(s.dir);
}

/* --- the source and its hash --------------------------------------------- */

Test(manifest, edited_source_is_refused_with_both_hashes)
{
    scratch s;
    scratch_make(&s);
    char *text = test_slurp(FIXTURE, NULL);
    scratch_write(&s, text);
    free(text);
    char cu[400];
    snprintf(cu, sizeof cu, "%s/tiny_rank.cu", s.dir);
    size_t len;
    char *source = test_slurp(cu, &len), *edited = malloc(len);
    memcpy(edited, source, len);
    uint64_t rng = fresh_seed();
    size_t at = below(&rng, len);
    edited[at] = (char)(edited[at] == 'x' ? 'y' : 'x');
    spit(cu, edited, len);
    char got_sha[SYMM_SHA256_HEX_SIZE], needle[256];
    symm_sha256_hex_of(edited, len, got_sha);
    snprintf(needle, sizeof needle,
             "variant tiny_rank: tiny_rank.cu does not match the manifest (sha256 %.12s... expected %.12s...): "
             "regenerate", got_sha, RANK_SHA);

    symm_manifest *m;
    cr_assert_eq(symm_manifest_open(s.manifest, &m), SYMM_OK, "%s", symm_last_error());
    const symm_variant_desc *d = (const symm_variant_desc *)1;
    expect_failure(symm_manifest_variant(m, "tiny_rank", &d), SYMM_ERR_MISMATCH, s.manifest, needle);
    cr_assert_null(d);
    /* The other variant is unaffected, and the failure is not remembered. */
    cr_assert_eq(symm_manifest_variant(m, "tiny_expert_fp8", &d), SYMM_OK, "%s", symm_last_error());
    spit(cu, source, len);
    cr_assert_eq(symm_manifest_variant(m, "tiny_rank", &d), SYMM_OK, "%s", symm_last_error());
    cr_assert(memcmp(d->source, source, len) == 0);
    symm_manifest_close(m);
    free(source);
    free(edited);
    wf_rmtree(s.dir);
}

Test(manifest, missing_source_file_is_a_system_error_naming_it)
{
    scratch s;
    scratch_make(&s);
    char *text = test_slurp(FIXTURE, NULL);
    scratch_write(&s, text);
    free(text);
    char cu[400];
    snprintf(cu, sizeof cu, "%s/tiny_expert_fp8.cu", s.dir);
    cr_assert_eq(unlink(cu), 0);
    symm_manifest *m;
    cr_assert_eq(symm_manifest_open(s.manifest, &m), SYMM_OK, "%s", symm_last_error());
    const symm_variant_desc *d;
    expect_failure(symm_manifest_variant(m, "tiny_expert_fp8", &d), SYMM_ERR_SYSTEM, s.manifest, cu);
    symm_manifest_close(m);
    wf_rmtree(s.dir);
}

/* --- random manifests from the generator's writer ------------------------- */

static void random_variant(uint64_t *rng, int index, sg_variant *v)
{
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "v%d_%llx", index, (unsigned long long)(next_random(rng) >> 20));
    v->line = 1 + index;
    v->world = 2 + (int)below(rng, 63);
    v->experts = v->world * (1 + (int)below(rng, 32));
    v->topk = 1 + (int)below(rng, v->experts < 16 ? (uint64_t)v->experts : 16);
    v->dtype = (symm_dtype)below(rng, 4);
    v->combine_dtype = (symm_dtype)below(rng, 3);
    v->hidden = SYMM_FP8_BLOCK * (1 + (int)below(rng, 64));
    v->layout = (symm_layout)below(rng, 2);
    v->align = v->layout == SYMM_LAYOUT_EXPERT ? 1 + (int)below(rng, 128) : 1;
    v->max_tokens = 1 + (int)below(rng, 4096);
    v->weights = below(rng, 2);
    v->capacity = 1 + (int64_t)below(rng, (uint64_t)sg_worst_capacity(v));
    v->capacity_set = true;
    v->sms = 1 + (int)below(rng, 132);
    v->combine = v->layout == SYMM_LAYOUT_RANK ? (symm_combine_mode)below(rng, 3) : (symm_combine_mode)below(rng, 2);
    v->combine_order = v->layout == SYMM_LAYOUT_EXPERT && below(rng, 2) ? SYMM_COMBINE_ORDER_K : SYMM_COMBINE_ORDER_RANK;
}

/* Source text of random printable characters and newlines (never NUL). */
static char *random_source(uint64_t *rng, size_t *len)
{
    *len = 1 + below(rng, 3000);
    char *s = malloc(*len + 1);
    for (size_t i = 0; i < *len; i++)
        s[i] = below(rng, 20) == 0 ? '\n' : (char)(' ' + below(rng, 95));
    s[*len] = '\0';
    return s;
}

static void expect_desc_of(const symm_variant_desc *d, const sg_variant *v, const char *spec)
{
    sg_layout l;
    sg_layout_compute(v, &l);
    cr_assert_str_eq(d->name, v->name);
    cr_assert_str_eq(d->spec_file, spec);
    cr_assert_str_eq(d->symmgen_version, SYMM_VERSION);
    cr_assert(d->hidden == v->hidden && d->topk == v->topk && d->experts == v->experts && d->world == v->world &&
              d->max_tokens == v->max_tokens, "%s: shape differs", v->name);
    cr_assert(d->dtype == v->dtype && d->combine_dtype == v->combine_dtype && d->layout == v->layout &&
              d->weights == (int)v->weights && d->align == v->align && d->sms == v->sms &&
              d->combine == v->combine, "%s: kind differs", v->name);
    cr_assert(d->capacity == v->capacity && d->worst_capacity == l.worst_capacity, "%s: capacity %lld/%lld",
              v->name, (long long)d->capacity, (long long)d->worst_capacity);
    cr_assert(d->symmetric_bytes == l.symmetric_bytes && d->scratch_bytes == l.scratch_bytes, "%s: sizes", v->name);
    for (int i = 0; i < SYMM_REGION_COUNT; i++)
        cr_assert(d->regions[i].offset == l.regions[i].offset && d->regions[i].bytes == l.regions[i].bytes &&
                  d->regions[i].symmetric == (int)l.regions[i].symmetric,
                  "%s: region %s: {%llu, %llu, %d}, expected {%llu, %llu, %d}", v->name, l.regions[i].name,
                  (unsigned long long)d->regions[i].offset, (unsigned long long)d->regions[i].bytes,
                  d->regions[i].symmetric, (unsigned long long)l.regions[i].offset,
                  (unsigned long long)l.regions[i].bytes, (int)l.regions[i].symmetric);
}

/* The regions the kernels index (templates/variant.cu.in) have exactly the
 * sizes docs/protocol.md gives them, for random variants: 128 bytes per
 * signal (the rows signal alone; with combine = "pull" also "y is ready" and
 * "done reading y", while combine_flags goes and region y holds [capacity,
 * hidden] of the combine dtype), one 8-byte word per count (the count
 * beside its call) in [2][W][SMS][bins + expert words], and so on. A kernel that indexed
 * a region by another rule would write out of bounds on the GPU; this
 * catches the generator's side of such a change without one. */
Test(layout, regions_have_the_sizes_of_the_protocol)
{
    uint64_t rng = fresh_seed();
    const uint64_t seed = rng;
    for (int i = 0; i < 500; i++) {
        sg_variant v;
        random_variant(&rng, i, &v);
        sg_layout l;
        sg_layout_compute(&v, &l);
        const uint64_t W = (uint64_t)v.world, T = (uint64_t)v.max_tokens, K = (uint64_t)v.topk;
        const uint64_t H = (uint64_t)v.hidden, cap = (uint64_t)v.capacity;
        const bool rank = v.layout == SYMM_LAYOUT_RANK;
        const uint64_t bins = rank ? W : (uint64_t)v.experts;
        /* Layout rank with at most 1024 experts: each count row also holds
         * the block's rows per local expert of the receiver. */
        const uint64_t words = bins + (rank && v.experts <= 1024 ? (uint64_t)(v.experts / v.world) : 0);
        const uint64_t slots = rank ? W * T : T * K;
        const uint64_t celt = (uint64_t)symm_dtype_size(v.combine_dtype);
        /* With "auto", both forms' regions and the pull's signals. */
        const bool pull = v.combine != SYMM_COMBINE_PUSH, push = v.combine != SYMM_COMBINE_PULL;
        /* A pushing combine of layout expert by rank has a second signal
         * kind: the peers' warps that have stored their partial sums. */
        const bool grouped = !rank && v.combine_order == SYMM_COMBINE_ORDER_RANK;
        const struct {
            symm_region id;
            uint64_t bytes;
        } want[] = {
            {SYMM_REGION_SIGNALS, (pull ? 3 : grouped ? 2 : 1) * W * 128},
            {SYMM_REGION_COUNTS, 2 * W * (uint64_t)v.sms * words * 8},
            {SYMM_REGION_RECV_X, cap * H * (uint64_t)symm_dtype_size(v.dtype)},
            {SYMM_REGION_RECV_SRC, cap * 16},
            {SYMM_REGION_COMBINE_IN, push ? slots * H * celt : 0},
            {SYMM_REGION_COMBINE_FLAGS, push ? slots * 8 : 0},
            {SYMM_REGION_Y, pull ? cap * H * celt : 0},
            /* The chain lists, then with combine_order rank a group word a row. */
            {SYMM_REGION_RECV_CHAIN, rank ? 0 : cap * (v.combine_order == SYMM_COMBINE_ORDER_K ? K - 1 : K) * 4},
            {SYMM_REGION_EXPERT_COUNT, (uint64_t)(v.experts / v.world) * 4},
            /* Layout expert's chains: the counters' slot, the T words, a word per (source, token). */
            {SYMM_REGION_CHAIN_READY, !rank && K > 1 && W > 1 ? 128 + (W * 8 + 127) / 128 * 128 + W * T * 8 : 0},
        };
        for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
            cr_assert_eq(l.regions[want[k].id].bytes, want[k].bytes,
                         "seed %llu, variant %d (world %d, sms %d, %s, %s): region %s has %llu bytes, the "
                         "protocol %llu", (unsigned long long)seed, i, v.world, v.sms, rank ? "rank" : "expert",
                         pull ? "pull" : "push",
                         l.regions[want[k].id].name, (unsigned long long)l.regions[want[k].id].bytes,
                         (unsigned long long)want[k].bytes);
        /* The state record holds the profile's 16 slots after its first 128 bytes. */
        cr_assert_geq(l.regions[SYMM_REGION_STATE].bytes, 128 + 16 * 8);
        /* The peers read y there: it lives in the symmetric buffer. */
        cr_assert(l.regions[SYMM_REGION_Y].symmetric, "region y must be symmetric");
        /* Regions of one buffer are aligned and do not overlap. */
        for (int a = 0; a < SYMM_REGION_COUNT; a++) {
            const sg_region *ra = &l.regions[a];
            if (!ra->bytes)
                continue;
            cr_assert_eq(ra->offset % 256, 0, "region %s at %llu", ra->name, (unsigned long long)ra->offset);
            cr_assert_leq(ra->offset + ra->bytes, ra->symmetric ? l.symmetric_bytes : l.scratch_bytes);
            for (int b = a + 1; b < SYMM_REGION_COUNT; b++) {
                const sg_region *rb = &l.regions[b];
                if (rb->bytes && rb->symmetric == ra->symmetric)
                    cr_assert(ra->offset + ra->bytes <= rb->offset || rb->offset + rb->bytes <= ra->offset,
                              "regions %s and %s overlap", ra->name, rb->name);
            }
        }
    }
}

Test(manifest, random_variants_from_the_generators_writer_round_trip)
{
    enum { N = 24 };
    uint64_t rng = fresh_seed();
    scratch s;
    scratch_make(&s);
    sg_variant vs[N];
    sg_generated gens[N];
    char *sources[N];
    size_t lens[N];
    memset(gens, 0, sizeof gens);
    for (int i = 0; i < N; i++) {
        random_variant(&rng, i, &vs[i]);
        sources[i] = random_source(&rng, &lens[i]);
        gens[i].variant = &vs[i];
        symm_sha256_hex_of(sources[i], lens[i], gens[i].source_sha256);
        symm_sha256_hex_of(vs[i].name, strlen(vs[i].name), gens[i].content_sha256);
        char cu[400];
        snprintf(cu, sizeof cu, "%s/%s.cu", s.dir, vs[i].name);
        spit(cu, sources[i], lens[i]);
    }
    sg_buf json = {0};
    sg_manifest("specs/random.lua", gens, N, &json);
    scratch_write(&s, json.data);

    symm_manifest *m;
    cr_assert_eq(symm_manifest_open(s.manifest, &m), SYMM_OK, "seed %llu: %s", (unsigned long long)rng,
                 symm_last_error());
    cr_assert_eq(symm_manifest_count(m), N);
    /* Ask in another order than the manifest's. */
    for (int k = 0; k < N; k++) {
        int i = (k * 7 + 3) % N;
        cr_assert_str_eq(symm_manifest_name(m, (size_t)i), vs[i].name);
        const symm_variant_desc *d;
        cr_assert_eq(symm_manifest_variant(m, vs[i].name, &d), SYMM_OK, "%s", symm_last_error());
        expect_desc_of(d, &vs[i], "specs/random.lua");
        cr_assert_eq(d->source_len, lens[i]);
        cr_assert(memcmp(d->source, sources[i], lens[i]) == 0 && d->source[lens[i]] == '\0');
        cr_assert_str_eq(d->source_sha256, gens[i].source_sha256);
    }
    symm_manifest_close(m);
    sg_buf_free(&json);
    for (int i = 0; i < N; i++)
        free(sources[i]);
    wf_rmtree(s.dir);
}

Test(manifest, unknown_name_lists_the_names_the_manifest_has)
{
    symm_manifest *m;
    cr_assert_eq(symm_manifest_open(FIXTURE, &m), SYMM_OK, "%s", symm_last_error());
    const symm_variant_desc *d;
    expect_failure(symm_manifest_variant(m, "tiny_rnak", &d), SYMM_ERR_INVALID_ARG, FIXTURE,
                   "no variant \"tiny_rnak\": expected one of tiny_rank, tiny_expert_fp8");
    symm_manifest_close(m);

    /* Many variants: the first 20, then how many there are. */
    enum { N = 23 };
    uint64_t rng = fresh_seed();
    sg_variant vs[N];
    sg_generated gens[N];
    memset(gens, 0, sizeof gens);
    for (int i = 0; i < N; i++) {
        random_variant(&rng, i, &vs[i]);
        gens[i].variant = &vs[i];
        symm_sha256_hex_of(vs[i].name, strlen(vs[i].name), gens[i].source_sha256);
        memcpy(gens[i].content_sha256, gens[i].source_sha256, sizeof gens[i].content_sha256);
    }
    scratch s;
    scratch_make(&s);
    sg_buf json = {0};
    sg_manifest("specs/many.lua", gens, N, &json);
    scratch_write(&s, json.data);
    cr_assert_eq(symm_manifest_open(s.manifest, &m), SYMM_OK, "%s", symm_last_error());
    expect_failure(symm_manifest_variant(m, "absent", &d), SYMM_ERR_INVALID_ARG, s.manifest,
                   ", ... (23 in all)");
    const char *msg = symm_last_error();
    for (int i = 0; i < N; i++) {
        char item[sizeof vs[i].name + 8];
        snprintf(item, sizeof item, "%s%.*s%s", i ? " " : "of ", (int)sizeof vs[i].name - 1, vs[i].name,
                 i == N - 1 ? "" : ",");
        cr_assert_eq(strstr(msg, item) != NULL, i < 20, "\"%s\" %s listed: %s", vs[i].name,
                     i < 20 ? "must be" : "must not be", msg);
    }
    symm_manifest_close(m);
    sg_buf_free(&json);
    wf_rmtree(s.dir);
}

/* --- the format version ---------------------------------------------------- */

Test(manifest, other_format_versions_are_unsupported)
{
    char *text = test_slurp(FIXTURE, NULL);
    uint64_t rng = fresh_seed();
    long long versions[] = {3 + (long long)below(&rng, 1000), 1, 0, -(1 + (long long)below(&rng, 1000))};
    scratch s;
    scratch_make(&s);
    symm_manifest *m;
    for (size_t i = 0; i < SYMM_ARRAY_LEN(versions); i++) {
        char to[64], needle[160];
        snprintf(to, sizeof to, "\"format\": %lld", versions[i]);
        char *edited = replace_once(text, "\"format\": 2", to);
        scratch_write(&s, edited);
        snprintf(needle, sizeof needle, "manifest format %lld: this libsymm (%s) reads format 2", versions[i],
                 SYMM_VERSION);
        expect_failure(symm_manifest_open(s.manifest, &m), SYMM_ERR_UNSUPPORTED, s.manifest, needle);
        cr_assert_null(m);
        free(edited);
    }
    static const struct { const char *to, *needle; } bad[] = {
        {"\"format\": \"2\"", "field format: got \"2\", expected an integer (the manifest format version"},
        {"\"format\": 2.0", "field format: got 2.0, expected an integer"},
        {"\"formats\": 2", "field format: missing, expected an integer"},
    };
    for (size_t i = 0; i < SYMM_ARRAY_LEN(bad); i++) {
        char *edited = replace_once(text, "\"format\": 2", bad[i].to);
        scratch_write(&s, edited);
        expect_failure(symm_manifest_open(s.manifest, &m), SYMM_ERR_INVALID_ARG, s.manifest, bad[i].needle);
        free(edited);
    }
    free(text);
    wf_rmtree(s.dir);
}

/* --- one message per kind of bad field ------------------------------------ */

/* Arrays, not pointers: Criterion hands parameters to the test's own process. */
typedef struct bad_field {
    char from[80], to[120]; /* first occurrence in the fixture (tiny_rank comes first) */
    char needle[224];       /* follows "<path>: " */
} bad_field;

ParameterizedTestParameters(manifest, bad_field_is_named_with_its_value)
{
    static bad_field cases[] = {
        {"      \"hidden\": 256,\n", "", "variant tiny_rank: field hidden: missing, expected an integer 1..1048576"},
        {"\"hidden\": 256", "\"hidden\": \"256\"", "variant tiny_rank: field hidden: got \"256\", expected an integer 1..1048576"},
        {"\"hidden\": 256", "\"hidden\": 256.0", "variant tiny_rank: field hidden: got 256.0, expected an integer"},
        {"\"hidden\": 256", "\"hidden\": [256]", "variant tiny_rank: field hidden: got an array, expected an integer"},
        {"\"max_tokens\": 16", "\"max_tokens\": 184467440737095516160",
         "variant tiny_rank: field max_tokens: got 184467440737095516160, expected an integer 1..1048576"},
        {"\"topk\": 2", "\"topk\": 0", "variant tiny_rank: field topk: got 0, expected an integer 1..65536"},
        {"\"symmetric_bytes\": 35072", "\"symmetric_bytes\": -35072",
         "variant tiny_rank: field symmetric_bytes: got -35072, expected an integer >= 1"},
        {"\"dtype\": \"bf16\"", "\"dtype\": \"bf17\"",
         "variant tiny_rank: field dtype: got \"bf17\", expected bf16, fp16, fp32 or fp8_e4m3"},
        {"\"combine_dtype\": \"bf16\"", "\"combine_dtype\": \"fp8_e4m3\"",
         "variant tiny_rank: field combine_dtype: got \"fp8_e4m3\", expected bf16, fp16 or fp32 (fp8_e4m3 is a dispatch dtype only)"},
        {"\"layout\": \"rank\"", "\"layout\": \"Rank\"", "variant tiny_rank: field layout: got \"Rank\", expected rank or expert"},
        {"\"weights\": true", "\"weights\": 1", "variant tiny_rank: field weights: got 1, expected true or false"},
        {"\"combine\": \"push\"", "\"combine\": \"sideways\"",
         "variant tiny_rank: field combine: got \"sideways\", expected push, pull or auto"},
        {"\"combine\": \"push\"", "\"combine\": \"Pull\"", "variant tiny_rank: field combine: got \"Pull\", expected push, pull or auto"},
        {"\"combine\": \"push\"", "\"combine\": true", "variant tiny_rank: field combine: got true, expected push, pull or auto"},
        {"\"combine\": \"push\"", "\"combine\": null", "variant tiny_rank: field combine: got null, expected push, pull or auto"},
        {"\"combine\": \"push\",", "\"combine\": \"push\", \"combine\": \"pull\",",
         "variant tiny_rank: field combine: given 2 times, expected once"},
        {"\"world\": 2", "\"world\": 3", "variant tiny_rank: field experts: got 8, expected a multiple of world (3)"},
        {"\"topk\": 2", "\"topk\": 9", "variant tiny_rank: field topk: got 9, expected 1..8 (at most experts)"},
        {"\"hidden\": 256", "\"hidden\": 260",
         "variant tiny_rank: field hidden: got 260, expected a multiple of 8 for dtype bf16 and combine_dtype bf16"},
        {"\"align\": 1", "\"align\": 64", "variant tiny_rank: field align: got 64, expected 1 (align applies only to layout \"expert\")"},
        {"\"local_experts\": 4", "\"local_experts\": 5", "variant tiny_rank: field local_experts: got 5, expected 4 (experts / world)"},
        {"\"worst_capacity\": 32", "\"worst_capacity\": 33",
         "variant tiny_rank: field worst_capacity: got 33, expected 32 (world * max_tokens)"},
        {"\"capacity\": 32", "\"capacity\": 40", "variant tiny_rank: field capacity: got 40, expected 1..32 (at most worst_capacity)"},
        {"\"offset\": 34816, \"bytes\": 256", "\"offset\": 34816, \"bytes\": 257",
         "variant tiny_rank: field regions[11]: got combine_flags at offset 34816 with 257 bytes, expected it to end "
         "within the symmetric buffer (symmetric_bytes 35072)"},
        {"\"offset\": 18432, \"bytes\": 16384", "\"offset\": 18432, \"bytes\": 16385",
         "variant tiny_rank: field regions: combine_in [18432, 34817) overlaps combine_flags [34816, 35072)"},
        {"\"offset\": 768, \"bytes\": 128", "\"offset\": 1000, \"bytes\": 128",
         "variant tiny_rank: field regions[10]: got token_route at offset 1000 with 128 bytes, expected it to end "
         "within the local scratch (scratch_bytes 1024)"},
        {"\"offset\": 768, \"bytes\": 128", "\"offset\": 9223372036854775807, \"bytes\": 128",
         "variant tiny_rank: field regions[10]: got token_route at offset 9223372036854775807 with 128 bytes"},
        {"\"offset\": 768, \"bytes\": 32", "\"offset\": 700, \"bytes\": 32",
         "variant tiny_rank: field regions: signals [0, 768) overlaps counts [700, 732) in the symmetric buffer"},
        {"\"offset\": 512, \"bytes\": 16", "\"offset\": 200, \"bytes\": 16",
         "variant tiny_rank: field regions: state [0, 256) overlaps expert_offset [200, 216) in the local scratch"},
        {"\"name\": \"counts\"", "\"name\": \"count\"",
         "variant tiny_rank: field regions[1].name: got \"count\", expected one of signals, counts, recv_x,"},
        {"\"name\": \"counts\"", "\"name\": \"signals\"",
         "variant tiny_rank: field regions[1].name: got \"signals\", expected a region not listed before"},
        {"\"bytes\": 256, \"symmetric\": false", "\"bytes\": 256, \"symmetric\": true",
         "variant tiny_rank: field regions[7].symmetric: got true, expected false (state lives in the local scratch)"},
        {"{\"name\": \"signals\", \"offset\": 0, \"bytes\": 768, \"symmetric\": true}", "\"signals\"",
         "variant tiny_rank: field regions[0]: got \"signals\", expected an object"},
        {"\"offset\": 768, \"bytes\": 32, ", "\"offset\": 768, ",
         "variant tiny_rank: field regions[1].bytes: missing, expected an integer >= 0"},
        {"\"regions\": [", "\"regions\": {}, \"old_regions\": [",
         "variant tiny_rank: field regions: got an object, expected an array"},
        {"\"name\": \"tiny_rank\"", "\"name\": \"tiny-rank\"",
         "variants[0]: field name: got \"tiny-rank\", expected a C identifier of at most 63 characters"},
        {"\"name\": \"tiny_rank\"", "\"name\": \"tiny\\u0000rank\"",
         "variants[0]: field name: got \"tiny\\x00rank\", expected a C identifier"},
        {"\"name\": \"tiny_rank\"", "\"name\": \"t234567890123456789012345678901234567890123456789012345678901234\"",
         "variants[0]: field name: got \"t234567890123456789012345678901234567890\"... (64 bytes), expected a C identifier of at most 63"},
        {"\"name\": \"tiny_rank\"", "\"nam\": \"tiny_rank\"", "variants[0]: field name: missing, expected a C identifier"},
        {"\"name\": \"tiny_expert_fp8\"", "\"name\": \"tiny_rank\"",
         "variants[1]: field name: got \"tiny_rank\", expected a name not used before (variants[0] has it)"},
        {"\"source_sha256\": \"890e", "\"source_sha256\": \"890E",
         "variant tiny_rank: field source_sha256: got \"890E784e8e9d9d4c835ceb7feb5fc46d206824c3\"... (64 bytes), expected 64 lowercase hex digits"},
        {"\"content_sha256\": \"ee1a", "\"content_sha256\": 7, \"x\": \"",
         "variant tiny_rank: field content_sha256: got 7, expected 64 lowercase hex digits"},
        {"\"cu\": \"tiny_rank.cu\"", "\"cu\": \"/etc/passwd\"",
         "variant tiny_rank: field files.cu: got \"/etc/passwd\", expected a path inside the manifest's directory "
         "(relative, without \"..\")"},
        {"\"cu\": \"tiny_rank.cu\"", "\"cu\": \"../../../../etc/passwd\"",
         "variant tiny_rank: field files.cu: got \"../../../../etc/passwd\", expected a path inside the manifest's "
         "directory (relative, without \"..\")"},
        {"\"cu\": \"tiny_rank.cu\"", "\"cu\": \"sub/../../tiny_rank.cu\"",
         "variant tiny_rank: field files.cu: got \"sub/../../tiny_rank.cu\", expected a path inside the manifest's "
         "directory"},

        {"\"cu\": \"tiny_rank.cu\", ", "", "variant tiny_rank: field files.cu: missing"},
        {"\"hidden\": 256,", "\"hidden\": 256, \"hidden\": 512,", "variant tiny_rank: field hidden: given 2 times, expected once"},
        {"\"variants\": [\n    {", "\"variants\": [\n    17, {", "field variants[0]: got 17, expected an object (one variant)"},
        {"\"variants\": [", "\"variants\": \"none\", \"old\": [", "field variants: got \"none\", expected an array of variants"},
        {"\"symmgen\": \"0.1.0\",", "", "field symmgen: missing, expected the version of symmgen"},
        {"\"spec\": \"specs/tiny.lua\"", "\"spec\": null", "field spec: got null, expected the path of the spec"},
    };
    return cr_make_param_array(bad_field, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(bad_field *c, manifest, bad_field_is_named_with_its_value)
{
    char *text = test_slurp(FIXTURE, NULL);
    char *edited = replace_once(text, c->from, c->to);
    scratch s;
    scratch_make(&s);
    scratch_write(&s, edited);
    char prefix[400];
    snprintf(prefix, sizeof prefix, "%s: ", s.manifest);
    symm_manifest *m = (symm_manifest *)1;
    expect_failure(symm_manifest_open(s.manifest, &m), SYMM_ERR_INVALID_ARG, prefix, c->needle);
    cr_assert_null(m);
    free(edited);
    free(text);
    wf_rmtree(s.dir);
}

Test(manifest, unknown_members_are_ignored)
{
    /* Every kind of value, at every level a future symmgen might add one. */
    static const char *const values[] = {
        "null", "true", "-0", "1.5e300", "-123456789012345678901234567890", "\"\\ud83d\\ude00\"",
        "[]", "{}", "[[{\"a\": [null]}], {\"b\": {}}]",
    };
    static const char *const anchors[] = {"\"format\": 2,", "\"name\": \"tiny_rank\",", "\"bytes\": 768,",
                                          "\"cu\": \"tiny_rank.cu\",", "\"name\": \"tiny_expert_fp8\""};
    char *text = test_slurp(FIXTURE, NULL);
    scratch s;
    scratch_make(&s);
    uint64_t rng = fresh_seed();
    for (size_t a = 0; a < SYMM_ARRAY_LEN(anchors); a++) {
        char to[256];
        const char *value = values[below(&rng, SYMM_ARRAY_LEN(values))];
        if (anchors[a][strlen(anchors[a]) - 1] == ',')
            snprintf(to, sizeof to, "%s \"new_%zu\": %s,", anchors[a], a, value);
        else
            snprintf(to, sizeof to, "%s, \"new_%zu\": %s", anchors[a], a, value);
        char *edited = replace_once(text, anchors[a], to);
        free(text);
        text = edited;
    }
    scratch_write(&s, text);
    symm_manifest *m;
    cr_assert_eq(symm_manifest_open(s.manifest, &m), SYMM_OK, "%s\n%s", symm_last_error(), text);
    const symm_variant_desc *d;
    cr_assert_eq(symm_manifest_variant(m, "tiny_rank", &d), SYMM_OK, "%s", symm_last_error());
    cr_assert(d->regions[SYMM_REGION_SIGNALS].bytes == 768);
    symm_manifest_close(m);
    free(text);
    wf_rmtree(s.dir);
}

/* --- JSON syntax --------------------------------------------------------- */

typedef struct syntax_case {
    char text[96];
    size_t len;     /* 0: strlen(text) */
    int line, col;
    char needle[96];
} syntax_case;

ParameterizedTestParameters(manifest, syntax_error_names_line_and_column)
{
    static syntax_case cases[] = {
        {"", 0, 1, 1, "expected a value, got end of file"},
        {"{\n  \"format\": 1,\n  \"spec\" \"x\"\n}", 0, 3, 10, "expected ':' after key \"spec\", got '\"'"},
        {"{\"a\": [1, 2,]}", 0, 1, 13, "expected a value, got ']'"},
        {"{\"a\": 1 \"b\": 2}", 0, 1, 9, "expected ',' or '}' after a member, got '\"'"},
        {"{\n\t\"a\": \"x\\qy\"}", 0, 2, 9, "invalid escape: backslash followed by 'q'"},
        {"{\"a\": 01}", 0, 1, 7, "leading zeros"},
        {"{\"a\": -}", 0, 1, 8, "expected a digit after '-', got '}'"},
        {"{\"a\": 1.}", 0, 1, 9, "expected a digit after '.', got '}'"},
        {"{\"a\": 1e+}", 0, 1, 10, "expected a digit in the exponent, got '}'"},
        {"{}\n\n  x", 0, 3, 3, "unexpected 'x' after the end of the top-level value"},
        {"{\"a\": \"abc", 0, 1, 11, "end of file inside a string (it starts at column 7)"},
        {"{\"a\": \"a\tb\"}", 0, 1, 9, "control character (byte 0x09) inside a string"},
        {"{\"a\": \"\\ud800x\"}", 0, 1, 8, "high surrogate without a low one"},
        {"{\"a\": \"\\udc00\"}", 0, 1, 8, "low surrogate without a high one"},
        {"{\"a\": \"\\u12G4\"}", 0, 1, 8, "\\u needs four hex digits"},
        {"{\"a\": tru}", 0, 1, 7, "expected a value, got 't'"},
        {"{\"a\" 1}", 0, 1, 6, "expected ':' after key \"a\", got '1'"},
        {"{,}", 0, 1, 2, "expected a string key or '}', got ','"},
        {"{\"a\": 1,}", 0, 1, 9, "expected a string key, got '}'"},
        {"\xff", 0, 1, 1, "expected a value, got byte 0xff"},
        {"{\"a\": [1 2]}", 0, 1, 10, "expected ',' or ']' after an array element, got '2'"},
        {"{\r\n\"a\" 1}", 0, 2, 5, "expected ':' after key \"a\", got '1'"},
        {"{\"a\": \0}", 8, 1, 7, "expected a value, got byte 0x00"},
        {"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", 0, 1, 65,
         "arrays and objects nested deeper than 64 levels"},
    };
    return cr_make_param_array(syntax_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(syntax_case *c, manifest, syntax_error_names_line_and_column)
{
    scratch s;
    scratch_make(&s);
    spit(s.manifest, c->text, c->len ? c->len : strlen(c->text));
    char prefix[400];
    snprintf(prefix, sizeof prefix, "%s:%d:%d: JSON syntax error: ", s.manifest, c->line, c->col);
    symm_manifest *m;
    expect_failure(symm_manifest_open(s.manifest, &m), SYMM_ERR_INVALID_ARG, prefix, c->needle);
    wf_rmtree(s.dir);
}

Test(manifest, valid_json_of_another_shape_is_refused)
{
    scratch s;
    scratch_make(&s);
    symm_manifest *m;
    scratch_write(&s, "\xef\xbb\xbf [ {\"format\": 1} ]");
    expect_failure(symm_manifest_open(s.manifest, &m), SYMM_ERR_INVALID_ARG, s.manifest,
                   ": got an array at the top, expected an object");
    scratch_write(&s, "{\"format\": 2, \"symmgen\": \"0.1.0\", \"spec\": \"x.lua\", \"variants\": []}");
    cr_assert_eq(symm_manifest_open(s.manifest, &m), SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(symm_manifest_count(m), 0);
    const symm_variant_desc *d;
    expect_failure(symm_manifest_variant(m, "any", &d), SYMM_ERR_INVALID_ARG, s.manifest,
                   "no variant \"any\": the manifest has no variants");
    symm_manifest_close(m);
    wf_rmtree(s.dir);
}

/* Line and column of text[len] (where a cut-off text ends). */
static void end_position(const char *text, size_t len, int *line, int *col)
{
    *line = 1;
    size_t start = 0;
    for (size_t i = 0; i < len; i++)
        if (text[i] == '\n') {
            (*line)++;
            start = i + 1;
        }
    *col = (int)(len - start) + 1;
}

Test(manifest, truncated_manifest_is_reported_where_it_ends)
{
    size_t len;
    char *text = test_slurp(FIXTURE, &len);
    scratch s;
    scratch_make(&s);
    uint64_t rng = fresh_seed();
    int tried = 0;
    while (tried < 150) {
        /* Never through a literal (true, false, null): those are reported
         * where they start. Everything else runs into the end of the text. */
        size_t cut = below(&rng, len - 2);
        char last = cut ? text[cut - 1] : ' ';
        if (last >= 'a' && last <= 'z')
            continue;
        tried++;
        spit(s.manifest, text, cut);
        int line, col;
        end_position(text, cut, &line, &col);
        char prefix[400];
        snprintf(prefix, sizeof prefix, "%s:%d:%d: JSON syntax error: ", s.manifest, line, col);
        symm_manifest *m;
        expect_failure(symm_manifest_open(s.manifest, &m), SYMM_ERR_INVALID_ARG, prefix, "");
    }
    free(text);
    wf_rmtree(s.dir);
}

/* --- never crash -------------------------------------------------------- */

static const char *const tokens[] = {
    "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "\\ud800", "\\udfff", "-", "0", "01", "1e999", "-1e-999",
    "99999999999999999999", "-9223372036854775808", "9223372036854775807", "true", "fals", "null", "\"hidden\"",
    "\"regions\"", "\"name\"", "\"format\"", "\n", " ", "\t", "\xff", "\xef\xbb\xbf", "\"\\u0000\"", "1.5",
};

/* One random edit of text (len bytes) into out (room for len + 64 bytes). */
static size_t mutate(uint64_t *rng, const char *text, size_t len, char *out)
{
    size_t at = len ? below(rng, len) : 0, n = 0;
    switch (below(rng, 6)) {
    case 0: /* flip bytes */
        memcpy(out, text, len);
        for (int k = 1 + (int)below(rng, 4); k > 0 && len; k--)
            out[below(rng, len)] = (char)next_random(rng);
        return len;
    case 1: { /* drop a span */
        size_t span = below(rng, 32) + 1;
        span = span > len - at ? len - at : span;
        memcpy(out, text, at);
        memcpy(out + at, text + at + span, len - at - span);
        return len - span;
    }
    case 2: { /* insert a token */
        const char *t = tokens[below(rng, SYMM_ARRAY_LEN(tokens))];
        n = strlen(t);
        memcpy(out, text, at);
        memcpy(out + at, t, n);
        memcpy(out + at + n, text + at, len - at);
        return len + n;
    }
    case 3: /* cut */
        memcpy(out, text, at);
        return at;
    case 4: { /* copy a short span over another place */
        memcpy(out, text, len);
        size_t from = len ? below(rng, len) : 0, span = below(rng, 48);
        for (size_t i = 0; i < span && at + i < len && from + i < len; i++)
            out[at + i] = text[from + i];
        return len;
    }
    default: { /* a digit becomes a huge or negative number */
        memcpy(out, text, len);
        for (size_t i = at; i < len; i++) {
            if (text[i] >= '1' && text[i] <= '9') {
                const char *t = below(rng, 2) ? "-7" : "99999999999999999999999";
                n = strlen(t);
                memcpy(out, text, i);
                memcpy(out + i, t, n);
                memcpy(out + i + n, text + i + 1, len - i - 1);
                return len - 1 + n;
            }
        }
        return len;
    }
    }
}

static const char *const fuzz_values[] = {
    "0", "1", "-1", "2", "3", "8", "16", "64", "128", "4096", "1048577", "2147483648", "9223372036854775807",
    "-9223372036854775808", "99999999999999999999", "1.5", "true", "false", "null", "[]", "{}", "\"\"",
    "\"bf16\"", "\"fp8_e4m3\"", "\"expert\"", "\"rank\"", "\"signals\"", "\"state\"", "\"tiny_rank\"",
    "\"x.cu\"", "\"/x.cu\"", "\"" RANK_SHA "\"",
};

/* A scalar member value of the fixture, replaced by another value, an
 * integer nudged, or the member deleted: mostly still valid JSON, so that
 * the checks behind the parser get exercised. */
static size_t mutate_value(uint64_t *rng, const char *text, size_t len, char *out)
{
    size_t starts[1024], n = 0;
    for (size_t i = 2; i < len && n < SYMM_ARRAY_LEN(starts); i++)
        if (text[i - 2] == ':' && text[i - 1] == ' ' && text[i] != '[' && text[i] != '{')
            starts[n++] = i;
    if (!n) {
        memcpy(out, text, len);
        return len;
    }
    size_t at = starts[below(rng, n)], end = at + 1;
    if (text[at] == '"') {
        while (end < len && text[end] != '"')
            end += text[end] == '\\' ? 2 : 1;
        end = end < len ? end + 1 : len;
    }
    while (end < len && !strchr(",}]\n", text[end]))
        end++;
    char repl[64] = "";
    uint64_t how = below(rng, 4);
    if (how == 0 && text[at] >= '0' && text[at] <= '9') {
        /* Digits only, so at least 0; strtoll stops at LLONG_MAX. */
        long long v = strtoll(text + at, NULL, 10);
        snprintf(repl, sizeof repl, "%lld", v > LLONG_MAX - 3 ? v - 3 : v + (long long)below(rng, 7) - 3);
    } else if (how == 1 && at >= 3) {
        /* Delete the whole member: back to its key's opening quote, on past a ", ". */
        size_t quote = at - 3; /* the key's closing quote (keys hold no escapes) */
        while (quote > 0 && text[quote - 1] != '"')
            quote--;
        at = quote ? quote - 1 : 0;
        if (end + 1 < len && text[end] == ',')
            end += text[end + 1] == ' ' ? 2 : 1;
    } else {
        snprintf(repl, sizeof repl, "%s", fuzz_values[below(rng, SYMM_ARRAY_LEN(fuzz_values))]);
    }
    size_t r = strlen(repl);
    memcpy(out, text, at);
    memcpy(out + at, repl, r);
    memcpy(out + at + r, text + end, len - end);
    return at + r + len - end;
}

static void open_everything(const char *path, uint64_t seed, int iteration)
{
    symm_manifest *m;
    symm_status st = symm_manifest_open(path, &m);
    cr_assert(st == SYMM_OK || st == SYMM_ERR_INVALID_ARG || st == SYMM_ERR_UNSUPPORTED,
              "seed %llu, iteration %d: %s: %s", (unsigned long long)seed, iteration, symm_status_name(st),
              symm_last_error());
    if (st != SYMM_OK) {
        cr_assert(strncmp(symm_last_error(), path, strlen(path)) == 0, "seed %llu, iteration %d: %s",
                  (unsigned long long)seed, iteration, symm_last_error());
        return;
    }
    for (size_t i = 0; i < symm_manifest_count(m); i++) {
        const symm_variant_desc *d;
        st = symm_manifest_variant(m, symm_manifest_name(m, i), &d);
        cr_assert(st == SYMM_OK || st == SYMM_ERR_MISMATCH || st == SYMM_ERR_SYSTEM,
                  "seed %llu, iteration %d: %s: %s", (unsigned long long)seed, iteration, symm_status_name(st),
                  symm_last_error());
        if (st == SYMM_OK)
            cr_assert_eq(strlen(d->source), d->source_len);
    }
    symm_manifest_close(m);
}

/* Deterministic, so that a crash can be replayed: the seed is fixed. */
Test(manifest, mutated_manifests_never_crash)
{
    wf_watchdog(120);
    const uint64_t seed = 0x5eed0f5e3e7a11full;
    uint64_t rng = seed;
    size_t len;
    char *text = test_slurp(FIXTURE, &len);
    char *cur = malloc(len + 1024), *next = malloc(len + 1024);
    scratch s;
    scratch_make(&s);
    for (int it = 0; it < 3000; it++) {
        /* One to eight stacked edits of the fixture's bytes. */
        memcpy(cur, text, len);
        size_t n = len;
        for (int k = 1 + (int)below(&rng, 8); k > 0; k--) {
            n = mutate(&rng, cur, n, next);
            char *t = cur;
            cur = next;
            next = t;
        }
        symm_json_doc *doc;
        int line, col;
        char why[256];
        int rc = symm_json_parse(cur, n, &doc, &line, &col, why, sizeof why);
        cr_assert(rc == SYMM_JSON_OK || (rc == SYMM_JSON_SYNTAX && line >= 1 && col >= 1 && why[0]),
                  "iteration %d: rc %d", it, rc);
        symm_json_free(doc);
        if (it % 4 == 0) {
            spit(s.manifest, cur, n);
            open_everything(s.manifest, seed, it);
        }
    }
    for (int it = 0; it < 2000; it++) {
        memcpy(cur, text, len);
        size_t n = len;
        for (int k = 1 + (int)below(&rng, 3); k > 0; k--) {
            n = mutate_value(&rng, cur, n, next);
            char *t = cur;
            cur = next;
            next = t;
        }
        spit(s.manifest, cur, n);
        open_everything(s.manifest, seed, 3000 + it);
    }
    free(cur);
    free(next);
    free(text);
    wf_rmtree(s.dir);
}

Test(manifest, random_bytes_and_token_soup_never_crash)
{
    uint64_t seed = fresh_seed(), rng = seed;
    char buf[4096];
    for (int it = 0; it < 4000; it++) {
        size_t n = 0;
        if (it % 2) {
            n = below(&rng, 512);
            for (size_t i = 0; i < n; i++)
                buf[i] = (char)next_random(&rng);
        } else {
            for (int k = (int)below(&rng, 200); k > 0; k--) {
                const char *t = tokens[below(&rng, SYMM_ARRAY_LEN(tokens))];
                size_t tl = strlen(t);
                if (n + tl > sizeof buf)
                    break;
                memcpy(buf + n, t, tl);
                n += tl;
            }
        }
        symm_json_doc *doc;
        int line, col;
        char why[256];
        int rc = symm_json_parse(buf, n, &doc, &line, &col, why, sizeof why);
        cr_assert(rc == SYMM_JSON_OK || (rc == SYMM_JSON_SYNTAX && line >= 1 && col >= 1 && why[0]),
                  "seed %llu, iteration %d: rc %d", (unsigned long long)seed, it, rc);
        symm_json_free(doc);
    }
}

Test(manifest, deep_nesting_stops_at_the_cap)
{
    size_t n = 1 << 20;
    char *text = malloc(2 * n);
    memset(text, '[', n);
    symm_json_doc *doc;
    int line, col;
    char why[256];
    cr_assert_eq(symm_json_parse(text, n, &doc, &line, &col, why, sizeof why), SYMM_JSON_SYNTAX);
    cr_assert(line == 1 && col == SYMM_JSON_MAX_DEPTH + 1, "at %d:%d: %s", line, col, why);
    /* Exactly the cap is fine, objects as arrays. */
    char *p = text;
    for (int i = 0; i < SYMM_JSON_MAX_DEPTH; i++)
        p += sprintf(p, i % 2 ? "[" : "{\"k\":");
    p += sprintf(p, "-9223372036854775808");
    for (int i = SYMM_JSON_MAX_DEPTH - 1; i >= 0; i--)
        *p++ = i % 2 ? ']' : '}';
    cr_assert_eq(symm_json_parse(text, (size_t)(p - text), &doc, &line, &col, why, sizeof why), SYMM_JSON_OK,
                 "%d:%d: %s", line, col, why);
    const symm_json *v = symm_json_root(doc);
    for (int i = 0; i < SYMM_JSON_MAX_DEPTH; i++)
        v = v->first;
    cr_assert(v->type == SYMM_JSON_NUMBER && v->is_int && v->integer == INT64_MIN);
    symm_json_free(doc);
    free(text);
}

/* Heap bytes in use now (the JSON tree's, measured around a parse). */
static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* A value costs a node of about 90 bytes however short its text: "[0,0,...]"
 * once took 64 times its size. The tree is capped at 16 bytes per byte of
 * text (and 1 GiB): a denser document is refused where the cap is met,
 * without taking the memory; the manifests symmgen writes stay far below. */
Test(manifest, json_memory_is_bounded_not_only_bytes)
{
    uint64_t rng = fresh_seed();
    size_t n = ((size_t)4 << 20) + below(&rng, 4096), len = 0;
    char *text = malloc(n + 2);
    text[len++] = '[';
    while (len + 2 < n) {
        text[len++] = below(&rng, 2) ? '0' : '1';
        text[len++] = ',';
    }
    text[len++] = '0';
    text[len++] = ']';
    symm_json_doc *doc = NULL;
    int line = 0, col = 0;
    char why[256];
    size_t before = heap_in_use();
    int rc = symm_json_parse(text, len, &doc, &line, &col, why, sizeof why);
    size_t used = heap_in_use() - before;
    cr_assert_eq(rc, SYMM_JSON_TOO_LARGE, "a dense array of %zu bytes was read (rc %d, %zu bytes in use)", len, rc,
                 used);
    cr_assert(doc == NULL && line == 1 && col > 1 && col < (int)len, "at %d:%d", line, col);
    cr_assert(strstr(why, "too many values for a document of its size") && strstr(why, "16 bytes for each byte"),
              "%s", why);

    /* Through the manifest reader: a clear error naming where. */
    scratch s;
    scratch_make(&s);
    FILE *f = fopen(s.manifest, "w");
    cr_assert(f);
    fprintf(f, "{\"format\": 2, \"symmgen\": \"x\", \"spec\": \"s.lua\", \"variants\": [], \"pad\": ");
    fwrite(text, 1, len, f);
    fputs("}\n", f);
    fclose(f);
    symm_manifest *m;
    expect_failure(symm_manifest_open(s.manifest, &m), SYMM_ERR_INVALID_ARG, s.manifest, "too many values");

    /* Under the cap, the tree takes what it says. */
    size_t small = 1000 + below(&rng, 20000);
    text[0] = '[';
    for (len = 1; len + 2 < small;) {
        text[len++] = '7';
        text[len++] = ',';
    }
    text[len++] = '7';
    text[len++] = ']';
    before = heap_in_use();
    cr_assert_eq(symm_json_parse(text, len, &doc, &line, &col, why, sizeof why), SYMM_JSON_OK, "%s", why);
    used = heap_in_use() - before;
    cr_assert(used <= len * SYMM_JSON_MEMORY_PER_BYTE + SYMM_JSON_MEMORY_FLOOR + 4096,
              "%zu bytes of text took %zu bytes", len, used);
    cr_assert_eq(symm_json_root(doc)->count, (len - 1) / 2);
    symm_json_free(doc);
    free(text);
    wf_rmtree(s.dir);
}

Test(manifest, numbers_beyond_int64_are_kept_as_text)
{
    static const struct { const char *text; int is_int; long long value; } cases[] = {
        {"9223372036854775807", 1, INT64_MAX},  {"9223372036854775808", 0, 0},
        {"-9223372036854775808", 1, INT64_MIN}, {"-9223372036854775809", 0, 0},
        {"18446744073709551616", 0, 0},        {"1e2", 0, 0}, {"-0", 1, 0},
    };
    for (size_t i = 0; i < SYMM_ARRAY_LEN(cases); i++) {
        symm_json_doc *doc;
        int line, col;
        char why[256];
        cr_assert_eq(symm_json_parse(cases[i].text, strlen(cases[i].text), &doc, &line, &col, why, sizeof why),
                     SYMM_JSON_OK, "%s: %s", cases[i].text, why);
        const symm_json *v = symm_json_root(doc);
        cr_assert_str_eq(v->str, cases[i].text);
        cr_assert_eq(v->is_int, cases[i].is_int, "%s", cases[i].text);
        if (v->is_int)
            cr_assert_eq(v->integer, cases[i].value, "%s", cases[i].text);
        symm_json_free(doc);
    }
}

Test(manifest, strings_are_decoded)
{
    static const char text[] = "{\"k\\u00e9y\": \"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u20ac\\ud83d\\ude00\"}";
    symm_json_doc *doc;
    int line, col;
    char why[256];
    cr_assert_eq(symm_json_parse(text, sizeof text - 1, &doc, &line, &col, why, sizeof why), SYMM_JSON_OK, "%s", why);
    int count;
    const symm_json *v = symm_json_member(symm_json_root(doc), "k\xc3\xa9y", &count);
    cr_assert(v && count == 1);
    static const char want[] = "a\"b\\c/d\b\f\n\r\t\xe2\x82\xac\xf0\x9f\x98\x80";
    cr_assert_eq(v->len, sizeof want - 1);
    cr_assert(memcmp(v->str, want, sizeof want) == 0);
    symm_json_free(doc);
}

/* --- a real symmgen output ------------------------------------------------ */

static const char *const region_enum[SYMM_REGION_COUNT] = {
    "SYMM_REGION_SIGNALS",      "SYMM_REGION_COUNTS",        "SYMM_REGION_RECV_X",
    "SYMM_REGION_RECV_SCALES",  "SYMM_REGION_RECV_SRC",      "SYMM_REGION_RECV_TOPK",
    "SYMM_REGION_RECV_WEIGHTS", "SYMM_REGION_COMBINE_IN",    "SYMM_REGION_STATE",
    "SYMM_REGION_EXPERT_COUNT", "SYMM_REGION_EXPERT_OFFSET", "SYMM_REGION_TOKEN_ROUTE",
    "SYMM_REGION_TOKEN_WEIGHTS", "SYMM_REGION_LAYOUT_WORK", "SYMM_REGION_COMBINE_FLAGS",
    "SYMM_REGION_RECV_CHAIN",   "SYMM_REGION_Y",             "SYMM_REGION_CHAIN_READY",
};

static void expect_in_stub(const char *stub, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void expect_in_stub(const char *stub, const char *name, const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    cr_assert(strstr(stub, line), "%s.c lacks \"%s\": the manifest's descriptor differs from the stub's", name, line);
}

/* What the stub's initializer says, field by field, against the descriptor
 * read from the manifest. */
static void expect_stub_matches(const symm_variant_desc *d, const char *stub)
{
    static const char *const dtype_enum[] = {"SYMM_DTYPE_BF16", "SYMM_DTYPE_FP16", "SYMM_DTYPE_FP32",
                                             "SYMM_DTYPE_FP8_E4M3"};
    const char *n = d->name;
    expect_in_stub(stub, n, ".name = \"%s\",", d->name);
    expect_in_stub(stub, n, ".spec_file = \"%s\",", d->spec_file);
    expect_in_stub(stub, n, ".symmgen_version = \"%s\",", d->symmgen_version);
    expect_in_stub(stub, n, ".hidden = %d,\n    .topk = %d,\n    .experts = %d,\n    .world = %d,\n    "
                   ".max_tokens = %d,", d->hidden, d->topk, d->experts, d->world, d->max_tokens);
    expect_in_stub(stub, n, ".dtype = %s,\n    .combine_dtype = %s,\n    .layout = %s,", dtype_enum[d->dtype],
                   dtype_enum[d->combine_dtype], d->layout == SYMM_LAYOUT_RANK ? "SYMM_LAYOUT_RANK" : "SYMM_LAYOUT_EXPERT");
    static const char *const combine_enum[] = {"SYMM_COMBINE_PUSH", "SYMM_COMBINE_PULL", "SYMM_COMBINE_AUTO"};
    expect_in_stub(stub, n, ".weights = %d,\n    .combine = %s,\n    .combine_order = %s,\n    .align = %d,\n    .sms = %d,",
                   d->weights, combine_enum[d->combine],
                   d->combine_order == SYMM_COMBINE_ORDER_K ? "SYMM_COMBINE_ORDER_K" : "SYMM_COMBINE_ORDER_RANK", d->align,
                   d->sms);
    expect_in_stub(stub, n, ".capacity = %lld,\n    .worst_capacity = %lld,", (long long)d->capacity,
                   (long long)d->worst_capacity);
    expect_in_stub(stub, n, ".symmetric_bytes = %lluu,\n    .scratch_bytes = %lluu,",
                   (unsigned long long)d->symmetric_bytes, (unsigned long long)d->scratch_bytes);
    for (int i = 0; i < SYMM_REGION_COUNT; i++)
        expect_in_stub(stub, n, "[%s] = {%lluu, %lluu, %d},", region_enum[i],
                       (unsigned long long)d->regions[i].offset, (unsigned long long)d->regions[i].bytes,
                       d->regions[i].symmetric);
    expect_in_stub(stub, n, ".source_len = %zuu,", d->source_len);
    expect_in_stub(stub, n, ".source_sha256 = \"%s\",", d->source_sha256);
    expect_in_stub(stub, n, ".n_nvrtc_options = %d,\n    .hosts = %d,", d->n_nvrtc_options, d->hosts);
    if (d->n_companions)
        expect_in_stub(stub, n, ".companions = %s_companions,\n    .n_companions = %d,", d->name, d->n_companions);
    else
        expect_in_stub(stub, n, ".companions = NULL,\n    .n_companions = 0,");
    expect_in_stub(stub, n, "_nvrtc_options[] = { \"%s\", \"%s\" };", d->nvrtc_options[0], d->nvrtc_options[1]);
}

Test(manifest, generated_default_spec_matches_its_stubs)
{
    wf_watchdog(60);
    const char *spec_path = "specs/default.lua";
    sg_spec spec;
    sg_diag diag = {0};
    cr_assert_eq(sg_spec_load(spec_path, NULL, 0, &spec, &diag), 0, "%s", diag.count ? diag.messages[0] : "");
    cr_assert(spec.count > 0);
    sg_generated *gens = calloc(spec.count, sizeof *gens);
    for (size_t i = 0; i < spec.count; i++)
        cr_assert_eq(sg_generate_variant(sg_embedded_templates, &spec.variants[i], spec_path, &gens[i], &diag),
                     SG_EXIT_OK, "%s", diag.count ? diag.messages[0] : "");
    scratch s;
    scratch_make(&s);
    char out[400], manifest[480];
    snprintf(out, sizeof out, "%s/out", s.dir);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", out);
    sg_output o = {.dir = out, .spec_path = spec_path, .variants = gens, .count = spec.count};
    cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_OK, "%s", diag.count ? diag.messages[0] : "");

    symm_manifest *m;
    cr_assert_eq(symm_manifest_open(manifest, &m), SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(symm_manifest_count(m), spec.count);
    for (size_t i = 0; i < spec.count; i++) {
        const sg_variant *v = &spec.variants[i];
        const symm_variant_desc *d;
        cr_assert_eq(symm_manifest_variant(m, v->name, &d), SYMM_OK, "%s", symm_last_error());
        expect_desc_of(d, v, spec_path);
        cr_assert_eq(d->source_len, gens[i].cu.len, "%s", v->name);
        cr_assert(memcmp(d->source, gens[i].cu.data, d->source_len) == 0, "%s: source differs", v->name);
        cr_assert_str_eq(d->source_sha256, gens[i].source_sha256);
        /* The runtime reads back the constants the generator wrote. */
        cr_assert_eq(symm_desc_check_source(d), SYMM_OK, "%s: %s", v->name, symm_last_error());
        char stub[512];
        snprintf(stub, sizeof stub, "%s/%s.c", out, v->name);
        char *text = test_slurp(stub, NULL);
        expect_stub_matches(d, text);
        free(text);
    }
    symm_manifest_close(m);
    for (size_t i = 0; i < spec.count; i++)
        sg_generated_free(&gens[i]);
    free(gens);
    sg_spec_free(&spec);
    sg_diag_free(&diag);
    wf_rmtree(s.dir);
}

/* --- symm_variant_open ---------------------------------------------------- */

typedef struct open_test {
    char dir[128], job[64], secret[65];
    char bad_manifest[320];
    char other_hidden[320]; /* valid by itself, but not what tiny_rank.cu was made with */
} open_test;

static int expect_rank(wf_result *res, const char *what, symm_status got, symm_status want, const char *needle)
{
    if (got != want || !strstr(symm_last_error(), needle))
        return wf_failf(res, "%s: got %s (%s), expected %s with \"%s\"", what, symm_status_name(got),
                        symm_last_error(), symm_status_name(want), needle);
    return 0;
}

static int rank_opens(int i, void *arg, wf_result *res, wf_result *all)
{
    (void)all;
    const open_test *t = arg;
    symm_world_config cfg = {.rank = i, .size = 2, .local_rank = i, .device = -1, .job_id = t->job,
                             .secret = t->secret, .socket_dir = t->dir, .timeout_s = 10};
    symm_world *w;
    symm_status st = symm_world_create(&cfg, &w);
    if (st)
        return wf_failf(res, "symm_world_create: %s", symm_last_error());
    symm_variant *v = NULL;
    int code = expect_rank(res, "bad manifest", symm_variant_open(w, t->bad_manifest, "tiny_rank", NULL, &v),
                           SYMM_ERR_INVALID_ARG, "variant tiny_rank: field topk: got 0");
    if (!code)
        code = expect_rank(res, "manifest unlike its source", symm_variant_open(w, t->other_hidden, "tiny_rank", NULL, &v),
                           SYMM_ERR_MISMATCH,
                           "descriptor field hidden is 512, its CUDA source was generated with "
                           "\"constexpr int HIDDEN = 256;\"");
    if (!code)
        code = expect_rank(res, "unknown name", symm_variant_open(w, FIXTURE, "tiny", NULL, &v), SYMM_ERR_INVALID_ARG,
                           "no variant \"tiny\": expected one of tiny_rank, tiny_expert_fp8");
    if (!code)
        code = expect_rank(res, "other world", symm_variant_open(w, FIXTURE, "tiny_expert_fp8", NULL, &v),
                           SYMM_ERR_INVALID_ARG, "is for world 4, the world has 2 ranks");
    /* A good manifest reaches the GPU: without a driver that is the error. */
    const symm_cuda_api *cu;
    if (!code && symm_cuda(&cu) != SYMM_OK)
        code = expect_rank(res, "no GPU", symm_variant_open(w, FIXTURE, "tiny_rank", NULL, &v), SYMM_ERR_NO_GPU, "");
    if (!code && v)
        code = wf_failf(res, "a failed open left a variant behind");
    symm_world_destroy(w);
    return code;
}

Test(manifest, variant_open_checks_the_manifest_before_the_gpu)
{
    wf_watchdog(30);
    open_test t;
    memset(&t, 0, sizeof t);
    wf_tempdir(t.dir, sizeof t.dir);
    wf_job_id(t.job, sizeof t.job);
    wf_secret(t.secret);
    snprintf(t.bad_manifest, sizeof t.bad_manifest, "%s/bad.json", t.dir);
    char *text = test_slurp(FIXTURE, NULL), *bad = replace_once(text, "\"topk\": 2", "\"topk\": 0");
    spit(t.bad_manifest, bad, strlen(bad));
    free(bad);
    /* Hidden 512 passes every check of the manifest by itself (recv_x keeps
     * its bytes); the source beside it was generated with 256. */
    snprintf(t.other_hidden, sizeof t.other_hidden, "%s/other_hidden.json", t.dir);
    char *other = replace_once(text, "\"hidden\": 256", "\"hidden\": 512");
    spit(t.other_hidden, other, strlen(other));
    free(other);
    char cu_path[320];
    size_t cu_len;
    char *cu = test_slurp(FIXTURE_DIR "/tiny_rank.cu", &cu_len);
    snprintf(cu_path, sizeof cu_path, "%s/tiny_rank.cu", t.dir);
    spit(cu_path, cu, cu_len);
    free(cu);
    free(text);
    wf_result *r = wf_run(2, rank_opens, &t, 20);
    for (int i = 0; i < 2; i++) {
        cr_assert(r[i].done, "rank %d did not finish: %s", i, r[i].msg);
        cr_assert_eq(r[i].code, 0, "rank %d: %s", i, r[i].msg);
    }
    wf_free(r, 2);

    /* The same in this process, where the sanitizers see every allocation. */
    symm_world_config cfg = {.size = 1, .job_id = "solo", .socket_dir = t.dir};
    symm_world *w;
    cr_assert_eq(symm_world_create(&cfg, &w), SYMM_OK, "%s", symm_last_error());
    symm_variant *v = (symm_variant *)1;
    expect_failure(symm_variant_open(w, FIXTURE, "tiny_rank", NULL, &v), SYMM_ERR_INVALID_ARG,
                   "symm_variant_create", "is for world 2, the world has 1 ranks");
    cr_assert_null(v);
    expect_failure(symm_variant_open(w, t.bad_manifest, "tiny_rank", NULL, &v), SYMM_ERR_INVALID_ARG,
                   t.bad_manifest, "field topk: got 0");
    symm_world_destroy(w);
    wf_rmtree(t.dir);
}

/* A world of one and the fixture's tiny_rank made a variant of one rank: the
 * descriptor and its source's WORLD both say 1, so that what a test changes
 * is the only thing wrong. */
typedef struct solo_fixture {
    char dir[128];
    symm_world *w;
    symm_manifest *m;
    symm_variant_desc desc;
    char *source;
} solo_fixture;

static void solo_open(solo_fixture *f, const char *job_id)
{
    wf_tempdir(f->dir, sizeof f->dir);
    symm_world_config cfg = {.size = 1, .job_id = job_id, .socket_dir = f->dir};
    cr_assert_eq(symm_world_create(&cfg, &f->w), SYMM_OK, "%s", symm_last_error());
    const symm_variant_desc *d;
    cr_assert_eq(symm_manifest_open(FIXTURE, &f->m), SYMM_OK, "%s", symm_last_error());
    cr_assert_eq(symm_manifest_variant(f->m, "tiny_rank", &d), SYMM_OK, "%s", symm_last_error());
    f->desc = *d;
    f->desc.world = 1;
    f->source = strdup(d->source);
    char *world = strstr(f->source, "\nconstexpr int WORLD = 2;");
    cr_assert(world, "the fixture source has no WORLD = 2");
    world[sizeof "\nconstexpr int WORLD = " - 1] = '1';
    f->desc.source = f->source;
}

static void solo_close(solo_fixture *f)
{
    free(f->source);
    symm_manifest_close(f->m);
    symm_world_destroy(f->w);
    wf_rmtree(f->dir);
}

/* A device timeout that is NaN, negative or too long for int64 nanoseconds is
 * refused before any GPU work (it used to reach the device, or worse, be
 * converted to timeout_ns with undefined behaviour). */
Test(manifest, variant_create_refuses_a_timeout_out_of_range)
{
    uint64_t rng = fresh_seed();
    solo_fixture f;
    solo_open(&f, "solo-timeout");
    const double bad[] = {
        NAN,
        INFINITY,
        -INFINITY,
        -(double)(1 + below(&rng, 1000)) / 8,
        1e6 + (double)(1 + below(&rng, 1000000)),
        1e10 * (double)(1 + below(&rng, 1000)), /* its nanoseconds overflow int64 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        symm_variant_options opts = {.backend = SYMM_BACKEND_NATIVE, .timeout_s = bad[i]};
        symm_variant *v = (symm_variant *)1;
        symm_status st = symm_variant_create(f.w, &f.desc, &opts, &v);
        cr_assert_eq(st, SYMM_ERR_INVALID_ARG, "timeout_s %g: got %s (%s), expected SYMM_ERR_INVALID_ARG", bad[i],
                     symm_status_name(st), symm_last_error());
        cr_assert(strstr(symm_last_error(), "symm_variant_create: timeout_s") &&
                      strstr(symm_last_error(), "expected 0..1e+06 seconds"),
                  "timeout_s %g: the message should name timeout_s and the accepted range: %s", bad[i],
                  symm_last_error());
        cr_assert_null(v, "timeout_s %g: a refused create left a variant behind", bad[i]);
    }
    solo_close(&f);
}

/* The backend is picked before any GPU work: SYMM_BACKEND's unknown value
 * is refused listing native, nccl and hybrid, and hybrid (by the
 * environment or the options) on a world of one host is refused saying
 * that native serves it; all without a GPU. */
Test(manifest, variant_create_picks_the_backend_before_the_gpu)
{
    solo_fixture f;
    solo_open(&f, "solo-backend");
    symm_variant *v = (symm_variant *)1;

    setenv("SYMM_BACKEND", "nvlink", 1);
    symm_status st = symm_variant_create(f.w, &f.desc, NULL, &v);
    cr_assert_eq(st, SYMM_ERR_INVALID_ARG, "SYMM_BACKEND=nvlink: got %s (%s)", symm_status_name(st),
                 symm_last_error());
    cr_assert(strstr(symm_last_error(), "SYMM_BACKEND=\"nvlink\": expected native, nccl or hybrid"),
              "the message should list the accepted values: %s", symm_last_error());
    cr_assert_null(v);

    setenv("SYMM_BACKEND", "hybrid", 1);
    v = (symm_variant *)1;
    st = symm_variant_create(f.w, &f.desc, NULL, &v);
    cr_assert_eq(st, SYMM_ERR_UNSUPPORTED, "SYMM_BACKEND=hybrid on one host: got %s (%s)", symm_status_name(st),
                 symm_last_error());
    cr_assert(strstr(symm_last_error(), "backend hybrid") && strstr(symm_last_error(), "on one host") &&
                  strstr(symm_last_error(), "use backend native"),
              "the message should say that native serves one host: %s", symm_last_error());
    cr_assert_null(v);

    unsetenv("SYMM_BACKEND");
    symm_variant_options opts = {.backend = SYMM_BACKEND_HYBRID};
    v = (symm_variant *)1;
    st = symm_variant_create(f.w, &f.desc, &opts, &v);
    cr_assert_eq(st, SYMM_ERR_UNSUPPORTED, "SYMM_BACKEND_HYBRID on one host: got %s (%s)", symm_status_name(st),
                 symm_last_error());
    cr_assert(strstr(symm_last_error(), "use backend native"), "%s", symm_last_error());
    cr_assert_null(v);
    opts.backend = (symm_backend)(SYMM_BACKEND_HYBRID + 1);
    st = symm_variant_create(f.w, &f.desc, &opts, &v);
    cr_assert_eq(st, SYMM_ERR_INVALID_ARG);
    cr_assert(strstr(symm_last_error(), "SYMM_BACKEND_NCCL or SYMM_BACKEND_HYBRID"), "%s", symm_last_error());
    solo_close(&f);
}

/* symm_desc_check_source: the fixture's descriptor agrees with its source;
 * each parameter, the scratch's bytes and each region's offset and bytes changed alone is refused
 * naming that field, and a source without a constant says which. */
Test(manifest, descriptor_must_match_the_constants_of_its_source)
{
    symm_manifest *m;
    const symm_variant_desc *d;
    cr_assert_eq(symm_manifest_open(FIXTURE, &m), SYMM_OK, "%s", symm_last_error());
    const char *names[] = {"tiny_rank", "tiny_expert_fp8"};
    for (size_t v = 0; v < 2; v++) {
        cr_assert_eq(symm_manifest_variant(m, names[v], &d), SYMM_OK, "%s", symm_last_error());
        cr_assert_eq(symm_desc_check_source(d), SYMM_OK, "%s: %s", names[v], symm_last_error());
        symm_variant_desc e;
#define PERTURB(field, expr)                                                                                     \
    do {                                                                                                         \
        e = *d;                                                                                                  \
        expr;                                                                                                    \
        expect_failure(symm_desc_check_source(&e), SYMM_ERR_MISMATCH, "symm_variant_create: variant",           \
                       "descriptor field " field " is ");                                                        \
    } while (0)
        PERTURB("hidden", e.hidden += 8);
        PERTURB("topk", e.topk += 1);
        PERTURB("experts", e.experts *= 2);
        PERTURB("world", e.world += 1);
        PERTURB("max_tokens", e.max_tokens -= 1);
        PERTURB("capacity", e.capacity -= 1);
        PERTURB("align", e.align += 1);
        PERTURB("sms", e.sms += 1);
        PERTURB("layout", e.layout = e.layout == SYMM_LAYOUT_RANK ? SYMM_LAYOUT_EXPERT : SYMM_LAYOUT_RANK);
        PERTURB("weights", e.weights = !e.weights);
        PERTURB("combine", e.combine = e.combine == SYMM_COMBINE_PUSH ? SYMM_COMBINE_PULL : SYMM_COMBINE_PUSH);
        PERTURB("combine", e.combine = e.combine == SYMM_COMBINE_AUTO ? SYMM_COMBINE_PUSH : SYMM_COMBINE_AUTO);
        PERTURB("dtype", e.dtype = e.dtype == SYMM_DTYPE_BF16 ? SYMM_DTYPE_FP16 : SYMM_DTYPE_BF16);
        PERTURB("combine_dtype",
                e.combine_dtype = e.combine_dtype == SYMM_DTYPE_FP32 ? SYMM_DTYPE_BF16 : SYMM_DTYPE_FP32);
        /* The profile's spans (PROFILE=2) lie after the scratch: the kernels' SCRATCH_BYTES. */
        PERTURB("scratch_bytes", e.scratch_bytes += 256);
        for (int i = 0; i < SYMM_REGION_COUNT; i++) {
            char field[80];
            snprintf(field, sizeof field, "descriptor field regions.%s.offset is ", symm_region_name(i));
            e = *d;
            e.regions[i].offset += 128;
            expect_failure(symm_desc_check_source(&e), SYMM_ERR_MISMATCH, "symm_variant_create: variant", field);
            snprintf(field, sizeof field, "descriptor field regions.%s.bytes is ", symm_region_name(i));
            e = *d;
            e.regions[i].bytes = e.regions[i].bytes ? 0 : 64; /* a region dropped, or one the source lacks */
            expect_failure(symm_desc_check_source(&e), SYMM_ERR_MISMATCH, "symm_variant_create: variant", field);
            snprintf(field, sizeof field, "descriptor field regions.%s.offset is ", symm_region_name(i));
            e = *d;
            e.regions[i].symmetric = !e.regions[i].symmetric;
            expect_failure(symm_desc_check_source(&e), SYMM_ERR_MISMATCH, "symm_variant_create: variant", field);
        }
#undef PERTURB
        /* A source without one of the constants. */
        e = *d;
        char *src = strdup(d->source), *at = strstr(src, "\nconstexpr int SMS = ");
        cr_assert(at, "%s: the fixture source has no SMS constant", names[v]);
        memcpy(at + 1, "//", 2);
        e.source = src;
        expect_failure(symm_desc_check_source(&e), SYMM_ERR_MISMATCH, "symm_variant_create: variant",
                       "its CUDA source declares no \"constexpr int SMS = \" (descriptor field sms: ");
        free(src);
    }
    symm_manifest_close(m);
}

/* combine against the source's COMBINE_AUTO and COMBINE_PULL: a pulling
 * descriptor with a pushing source (or the other way round) would have its
 * peers read a y that was never offered, or wait on flags nobody sets; an
 * "auto" descriptor needs the source of both forms (COMBINE_PULL the
 * program's: SYMM_PART == 4), whose runtime launches one kernel or the
 * other. */
Test(manifest, combine_must_match_the_sources_constants)
{
    symm_manifest *m;
    const symm_variant_desc *d;
    cr_assert_eq(symm_manifest_open(FIXTURE, &m), SYMM_OK, "%s", symm_last_error());
    const char *names[] = {"tiny_rank", "tiny_expert_fp8"};
    for (size_t v = 0; v < 2; v++) {
        cr_assert_eq(symm_manifest_variant(m, names[v], &d), SYMM_OK, "%s", symm_last_error());
        cr_assert_eq(d->combine, SYMM_COMBINE_PUSH);
        symm_variant_desc e = *d;
        char want[256];
        /* A pushing source: only SYMM_COMBINE_PUSH passes. */
        e.combine = SYMM_COMBINE_PULL;
        expect_failure(symm_desc_check_source(&e), SYMM_ERR_MISMATCH, "symm_variant_create: variant",
                       "descriptor field combine is true, its CUDA source was generated with "
                       "\"constexpr bool COMBINE_PULL = false;\"");
        e.combine = SYMM_COMBINE_AUTO;
        expect_failure(symm_desc_check_source(&e), SYMM_ERR_MISMATCH, "symm_variant_create: variant",
                       "descriptor field combine is true, its CUDA source was generated with "
                       "\"constexpr bool COMBINE_AUTO = false;\"");
        /* The same source made to pull: now only SYMM_COMBINE_PULL passes. */
        char *src = replace_once(d->source, "\nconstexpr bool COMBINE_PULL = false;\n",
                                 "\nconstexpr bool COMBINE_PULL = true;\n");
        e.source = src;
        e.combine = SYMM_COMBINE_PULL;
        cr_assert_eq(symm_desc_check_source(&e), SYMM_OK, "%s: %s", names[v], symm_last_error());
        e.combine = SYMM_COMBINE_PUSH;
        expect_failure(symm_desc_check_source(&e), SYMM_ERR_MISMATCH, "symm_variant_create: variant",
                       "descriptor field combine is false, its CUDA source was generated with "
                       "\"constexpr bool COMBINE_PULL = true;\"");
        free(src);
        /* The source of both forms: only SYMM_COMBINE_AUTO passes. */
        char *half = replace_once(d->source, "\nconstexpr bool COMBINE_PULL = false;\n",
                                  "\nconstexpr bool COMBINE_PULL = SYMM_PART == 4;\n");
        src = replace_once(half, "\nconstexpr bool COMBINE_AUTO = false;\n", "\nconstexpr bool COMBINE_AUTO = true;\n");
        free(half);
        e.source = src;
        e.combine = SYMM_COMBINE_AUTO;
        cr_assert_eq(symm_desc_check_source(&e), SYMM_OK, "%s: %s", names[v], symm_last_error());
        for (int mode = SYMM_COMBINE_PUSH; mode <= SYMM_COMBINE_PULL; mode++) {
            e.combine = (symm_combine_mode)mode;
            expect_failure(symm_desc_check_source(&e), SYMM_ERR_MISMATCH, "symm_variant_create: variant",
                           "descriptor field combine is false, its CUDA source was generated with "
                           "\"constexpr bool COMBINE_AUTO = true;\"");
        }
        free(src);
        /* A source from before combine = "pull": no constant at all. */
        src = replace_once(d->source, "\nconstexpr bool COMBINE_PULL = false;\n", "\n");
        e.source = src;
        for (int pull = 0; pull < 2; pull++) {
            e.combine = pull ? SYMM_COMBINE_PULL : SYMM_COMBINE_PUSH;
            snprintf(want, sizeof want, "variant %s: its CUDA source declares no \"constexpr bool COMBINE_PULL = \" "
                     "(descriptor field combine: %s)", names[v], pull ? "true" : "false");
            expect_failure(symm_desc_check_source(&e), SYMM_ERR_MISMATCH, "symm_variant_create: variant", want);
        }
        free(src);
        /* A source from before combine = "auto". */
        src = replace_once(d->source, "\nconstexpr bool COMBINE_AUTO = false;\n", "\n");
        e.source = src;
        e.combine = SYMM_COMBINE_PUSH;
        snprintf(want, sizeof want, "variant %s: its CUDA source declares no \"constexpr bool COMBINE_AUTO = \" "
                 "(descriptor field combine: false)", names[v]);
        expect_failure(symm_desc_check_source(&e), SYMM_ERR_MISMATCH, "symm_variant_create: variant", want);
        free(src);
    }
    symm_manifest_close(m);
}

/* Create refuses a GPU older than Hopper in one sentence, before NVRTC
 * would fail on the kernels' instructions (the check create makes on each
 * rank's GPU after opening it). */
Test(manifest, variant_create_refuses_a_gpu_older_than_hopper_in_one_sentence)
{
    static const int older[][2] = {{7, 0}, {7, 5}, {8, 0}, {8, 6}, {8, 9}};
    for (size_t i = 0; i < sizeof older / sizeof older[0]; i++) {
        symm_status st = symm_variant_check_gpu("dsv3", older[i][0], older[i][1]);
        char want[128];
        snprintf(want, sizeof want, "variant dsv3 needs a Hopper (sm_90) or newer GPU, and this rank's GPU is sm_%d%d",
                 older[i][0], older[i][1]);
        cr_assert_eq(st, SYMM_ERR_UNSUPPORTED, "sm_%d%d: %s", older[i][0], older[i][1], symm_status_name(st));
        cr_assert_str_eq(symm_last_error(), want);
    }
    static const int newer[][2] = {{9, 0}, {10, 0}, {10, 3}, {12, 0}};
    for (size_t i = 0; i < sizeof newer / sizeof newer[0]; i++)
        cr_assert_eq(symm_variant_check_gpu("dsv3", newer[i][0], newer[i][1]), SYMM_OK, "sm_%d%d: %s",
                     newer[i][0], newer[i][1], symm_last_error());
}

/* --- across hosts: companions --------------------------------------------- */

/* A variant with hosts: its manifest entry lists its companions, each a
 * variant of its own ("companion_of", "hosts", world 1 allowed), and the
 * parent's descriptor carries theirs, sources included, as its stub does. */
Test(manifest, companions_are_linked_and_carried_as_in_the_stub)
{
    wf_watchdog(60);
    scratch s;
    scratch_make(&s);
    char spec_path[400], out[400], manifest[480];
    snprintf(spec_path, sizeof spec_path, "%s/hosts.lua", s.dir);
    const char *spec_text =
        "layout { name = \"hy\", hidden = 256, topk = 4, experts = 16, world = 4, max_tokens = 64, hosts = { 4, 2 } }\n"
        "layout { name = \"hx\", hidden = 128, topk = 2, experts = 4, world = 2, max_tokens = 8, layout = \"expert\", "
        "align = 4, dtype = \"fp8_e4m3\", hosts = { 2 } }\n";
    spit(spec_path, spec_text, strlen(spec_text));
    sg_spec spec;
    sg_diag diag = {0};
    cr_assert_eq(sg_spec_load(spec_path, NULL, 0, &spec, &diag), 0, "%s", diag.count ? diag.messages[0] : "");
    cr_assert_eq(spec.count, 5);
    sg_generated gens[5];
    for (size_t i = 0; i < spec.count; i++)
        cr_assert_eq(sg_generate_variant(sg_embedded_templates, &spec.variants[i], spec_path, &gens[i], &diag),
                     SG_EXIT_OK, "%s", diag.count ? diag.messages[0] : "");
    snprintf(out, sizeof out, "%s/out", s.dir);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", out);
    sg_output o = {.dir = out, .spec_path = spec_path, .variants = gens, .count = spec.count};
    cr_assert_eq(sg_output_write(&o, 1, NULL, &diag), SG_EXIT_OK, "%s", diag.count ? diag.messages[0] : "");

    symm_manifest *m;
    cr_assert_eq(symm_manifest_open(manifest, &m), SYMM_OK, "%s", symm_last_error());
    const struct { const char *parent; int hosts[2], n; } want[] = {{"hy", {2, 4}, 2}, {"hx", {2, 0}, 1}};
    for (size_t w = 0; w < 2; w++) {
        const symm_variant_desc *p;
        cr_assert_eq(symm_manifest_variant(m, want[w].parent, &p), SYMM_OK, "%s", symm_last_error());
        cr_assert_eq(p->n_companions, want[w].n, "%s", p->name);
        cr_assert_eq(p->hosts, 0);
        char stub_path[512];
        snprintf(stub_path, sizeof stub_path, "%s/%s.c", out, p->name);
        char *stub = test_slurp(stub_path, NULL);
        for (int i = 0; i < p->n_companions; i++) {
            const symm_variant_desc *c = &p->companions[i], *alone;
            const int H = want[w].hosts[i];
            char name[64];
            snprintf(name, sizeof name, "%s_h%d", p->name, H);
            cr_assert_str_eq(c->name, name);
            cr_assert_eq(c->hosts, H);
            cr_assert(c->world * H == p->world && c->experts * H == p->experts && c->max_tokens == H * p->max_tokens &&
                      c->capacity == p->capacity && c->worst_capacity == p->worst_capacity && c->n_companions == 0);
            cr_assert_eq(symm_manifest_variant(m, name, &alone), SYMM_OK, "%s", symm_last_error());
            cr_assert(c->source && c->source_len == alone->source_len &&
                      memcmp(c->source, alone->source, c->source_len) == 0, "%s: source", name);
            cr_assert_eq(symm_desc_check_source(c), SYMM_OK, "%s: %s", name, symm_last_error());
            /* The parent's stub carries the companion's descriptor too. */
            expect_stub_matches(c, stub);
        }
        expect_stub_matches(p, stub);
        free(stub);
    }
    symm_manifest_close(m);

    /* Broken links are refused at open, naming the variant and the entry. */
    char *text = test_slurp(manifest, NULL);
    static const struct { const char *from, *to, *needle; } bad[] = {
        {"{\"hosts\": 2, \"name\": \"hy_h2\"}", "{\"hosts\": 2, \"name\": \"hy_h9\"}",
         "variant hy: field companions[0]: {\"hosts\": 2, \"name\": \"hy_h9\"}: no variant of that name"},
        {"{\"hosts\": 2, \"name\": \"hy_h2\"}", "{\"hosts\": 2, \"name\": \"hx_h2\"}",
         "is not a companion of this one"},
        {"{\"hosts\": 2, \"name\": \"hy_h2\"}", "{\"hosts\": 2, \"name\": \"hy_h4\"}",
         "that companion's \"hosts\" differs"},
        {"\"companion_of\": \"hx\",\n      \"hosts\": 2,\n", "",
         "field world: got 1, expected an integer 2..65536 (world 1 only in a companion"},
        {"{\"hosts\": 2, \"name\": \"hy_h2\"}", "{\"hosts\": 1, \"name\": \"hy_h2\"}",
         "field companions[0].hosts: got 1, expected an integer 2..128"},
    };
    scratch t;
    scratch_make(&t);
    for (size_t i = 0; i < SYMM_ARRAY_LEN(bad); i++) {
        char *edited = replace_once(text, bad[i].from, bad[i].to);
        scratch_write(&t, edited);
        free(edited);
        expect_failure(symm_manifest_open(t.manifest, &m), SYMM_ERR_INVALID_ARG, t.manifest, bad[i].needle);
    }
    free(text);
    for (size_t i = 0; i < spec.count; i++)
        sg_generated_free(&gens[i]);
    sg_spec_free(&spec);
    sg_diag_free(&diag);
    wf_rmtree(s.dir);
    wf_rmtree(t.dir);
}
