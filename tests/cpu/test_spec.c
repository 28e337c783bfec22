/* test_spec.c: spec loading and validation (generator/spec.c) through
 * sg_spec_load: every error class with its whole message (file, line of the
 * layout call, variant, field, value, expectation), the sandbox and its
 * limits, require, overrides, defaults, and the example specs in specs/.
 *
 * Each test writes its specs into a fresh temporary directory; shapes and
 * line numbers are random, so nothing below is a constant answer. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "moe_inputs.h"
#include "sg.h"
#include "world_fork.h"

#define NAME_WHAT "a C identifier (letters, digits and _, not starting with a digit)"
#define ROWS_WHY "(rows of whole 16-byte vectors)"
/* The seconds a spec may run in these tests (SYMM_SPEC_TIMEOUT, set by
 * setup: room for the instruction budget and the memory cap to be met first
 * on a loaded machine), and in the tests of specs that only the deadline
 * stops (set by deadline_tests, read once per test process). */
#define LIMIT_S "5"
#define SHORT_LIMIT_S "2"
#define TOO_LONG_AT(limit)                                                                                    \
    "spec ran too long (more than 200000000 instructions, with the time of string functions and the bytes "   \
    "allocated counted in, or more than " limit " s; SYMM_SPEC_TIMEOUT sets the seconds)"
#define TOO_LONG TOO_LONG_AT(LIMIT_S)
#define OUT_OF_MEMORY "out of memory (a spec may use at most 256 MiB)"

static char dir[512];
static sg_spec spec;
static sg_diag diag;
static moe_rng rng; /* fresh each test */
static int pad_lines;
static unsigned serial;

static void seed(void) { wf_random(&rng.s, sizeof rng.s); }

static void setup(void)
{
    wf_watchdog(60);
    /* Read once, at the first load: a short deadline keeps the tests of
     * specs that run forever short. */
    setenv("SYMM_SPEC_TIMEOUT", LIMIT_S, 1);
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/sg-spec-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert(mkdtemp(dir) != NULL, "mkdtemp %s: %s", dir, strerror(errno));
    seed();
}

static void teardown(void)
{
    sg_spec_free(&spec);
    sg_diag_free(&diag);
    wf_rmtree(dir);
}

TestSuite(spec, .init = setup, .fini = teardown);

/* ---------------------------------------------------------------------- */

/* Uniform in lo..hi (inclusive). */
static unsigned rnd(unsigned lo, unsigned hi)
{
    return lo + (unsigned)(moe_rng_next(&rng) % ((uint64_t)hi - lo + 1));
}

static const char *path_in(const char *name)
{
    static char slots[8][640];
    static int next;
    char *p = slots[next++ % 8];
    snprintf(p, sizeof slots[0], "%s/%s", dir, name);
    return p;
}

static const char *write_bytes(const char *name, const void *bytes, size_t len)
{
    const char *path = path_in(name);
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL, "fopen %s: %s", path, strerror(errno));
    cr_assert(fwrite(bytes, 1, len, f) == len, "write %s", path);
    fclose(f);
    return path;
}

static const char *write_file(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *write_file(const char *name, const char *fmt, ...)
{
    char *text;
    va_list ap;
    va_start(ap, fmt);
    cr_assert(vasprintf(&text, fmt, ap) >= 0);
    va_end(ap);
    const char *path = write_bytes(name, text, strlen(text));
    free(text);
    return path;
}

/* Comment lines put before the code under test, so line numbers vary. */
static const char *padding(void)
{
    static char buf[64 * 16];
    pad_lines = (int)rnd(0, 40);
    buf[0] = '\0';
    for (int i = 0; i < pad_lines; i++)
        strcat(buf, "-- padding\n");
    return buf;
}

static int load_with(const char *path, const sg_override *ov, size_t n)
{
    sg_spec_free(&spec);
    sg_diag_free(&diag);
    return sg_spec_load(path, ov, n, &spec, &diag);
}

static int load(const char *path) { return load_with(path, NULL, 0); }

/* Every message, one per line, for assertion output. */
static const char *messages(void)
{
    static char buf[32768];
    buf[0] = '\0';
    for (size_t i = 0; i < diag.count; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, sizeof buf - used, "  [%zu] %s\n", i, diag.messages[i]);
    }
    return diag.count ? buf : "  (no messages)\n";
}

static bool has_message(const char *want)
{
    for (size_t i = 0; i < diag.count; i++)
        if (strcmp(diag.messages[i], want) == 0)
            return true;
    return false;
}

#define expect_message(...)                                                              \
    do {                                                                                 \
        char *want_ = NULL;                                                              \
        cr_assert(asprintf(&want_, __VA_ARGS__) >= 0);                                   \
        cr_expect(has_message(want_), "expected the message\n  %s\nbut got\n%s", want_, \
                  messages());                                                           \
        free(want_);                                                                     \
    } while (0)

#define expect_count(n)                                                                    \
    cr_expect(diag.count == (size_t)(n), "expected %d message(s), got %zu:\n%s", (int)(n), \
              diag.count, messages())

/* Every field of a layout, as spec.c names them. */
static const char *const field_names_for_test[14] = {
    "name", "hidden", "topk", "experts", "world", "max_tokens", "dtype",
    "combine_dtype", "layout", "weights", "capacity", "align", "sms", "combine",
};

/* A valid random shape: the required fields. */
typedef struct shape {
    char name[80];
    int hidden, topk, experts, world, max_tokens;
} shape;

/* s at world `world`, its experts (a multiple of it) and top-k drawn again. */
static void set_world(shape *s, int world)
{
    s->world = world;
    s->experts = world * (int)rnd(1, 16);
    s->topk = (int)rnd(1, s->experts < 16 ? (unsigned)s->experts : 16);
}

static shape random_shape(void)
{
    shape s;
    snprintf(s.name, sizeof s.name, "v%u_%u", rnd(0, 99999), serial++);
    set_world(&s, (int)rnd(2, 16));
    s.hidden = 128 * (int)rnd(1, 56);
    s.max_tokens = (int)rnd(1, 8192);
    return s;
}

/* The shape as Lua fields, leaving out the field named skip. */
static const char *fields_except(const shape *s, const char *skip)
{
    static char slots[8][512];
    static int next;
    char *b = slots[next++ % 8];
    b[0] = '\0';
    const char *sep = "";
    char item[128];
#define FIELD(key, fmt, val)                                                  \
    if (!skip || strcmp(skip, key) != 0) {                                    \
        snprintf(item, sizeof item, "%s" key " = " fmt, sep, val);           \
        strcat(b, item);                                                      \
        sep = ", ";                                                           \
    }
    FIELD("name", "\"%s\"", s->name);
    FIELD("hidden", "%d", s->hidden);
    FIELD("topk", "%d", s->topk);
    FIELD("experts", "%d", s->experts);
    FIELD("world", "%d", s->world);
    FIELD("max_tokens", "%d", s->max_tokens);
#undef FIELD
    return b;
}

static const char *fields(const shape *s) { return fields_except(s, NULL); }

static int64_t worst_rank(const shape *s) { return (int64_t)s->world * s->max_tokens; }

static int64_t worst_expert(const shape *s, int align)
{
    int64_t local = s->experts / s->world;
    int64_t per_token = s->topk < local ? s->topk : local;
    return (int64_t)s->world * s->max_tokens * per_token + local * (align - 1);
}

/* ---------------------------------------------------------------------- */
/* Valid specs */

Test(spec, valid_variant_keeps_every_field)
{
    static const char *const dtypes[] = { "bf16", "fp16", "fp32", "fp8_e4m3" };
    shape s = random_shape();
    int dt = (int)rnd(0, 3), ct = (int)rnd(0, 2), expert = (int)rnd(0, 1), weights = (int)rnd(0, 1);
    int align = expert ? (int)rnd(2, 256) : 1, sms = (int)rnd(1, 1024);
    /* push, pull, or (layout rank only) auto */
    int mode = (int)rnd(0, expert ? 1 : 2);
    static const char *const modes[] = { "push", "pull", "auto" };
    int order_k = expert ? (int)rnd(0, 1) : 0;
    int64_t worst = expert ? worst_expert(&s, align) : worst_rank(&s);
    int64_t capacity = (int64_t)rnd(1, (unsigned)worst);
    const char *path = write_file("spec.lua",
        "%slayout { %s, dtype = \"%s\", combine_dtype = \"%s\", layout = \"%s\",\n"
        "  weights = %s, align = %d, sms = %d, capacity = %lld, combine = \"%s\", combine_order = \"%s\" }\n",
        padding(), fields(&s), dtypes[dt], dtypes[ct], expert ? "expert" : "rank",
        weights ? "true" : "false", align, sms, (long long)capacity, modes[mode], order_k ? "k" : "rank");

    cr_assert(load(path) == 0, "load failed:\n%s", messages());
    cr_assert(diag.count == 0, "a valid spec left messages:\n%s", messages());
    cr_assert(spec.count == 1, "expected 1 variant, got %zu", spec.count);
    cr_expect(strcmp(spec.path, path) == 0, "path %s, expected %s", spec.path, path);
    const sg_variant *v = &spec.variants[0];
    cr_expect(strcmp(v->name, s.name) == 0, "name %s, expected %s", v->name, s.name);
    cr_expect(v->line == pad_lines + 1, "line %d, expected %d", v->line, pad_lines + 1);
    cr_expect(v->hidden == s.hidden && v->topk == s.topk && v->experts == s.experts &&
              v->world == s.world && v->max_tokens == s.max_tokens,
              "shape %d/%d/%d/%d/%d, expected %d/%d/%d/%d/%d", v->hidden, v->topk, v->experts,
              v->world, v->max_tokens, s.hidden, s.topk, s.experts, s.world, s.max_tokens);
    cr_expect(v->dtype == (symm_dtype)dt, "dtype %s, expected %s", sg_dtype_name(v->dtype), dtypes[dt]);
    cr_expect(v->combine_dtype == (symm_dtype)ct, "combine_dtype %s, expected %s",
              sg_dtype_name(v->combine_dtype), dtypes[ct]);
    cr_expect(v->layout == (expert ? SYMM_LAYOUT_EXPERT : SYMM_LAYOUT_RANK), "layout %s",
              sg_layout_name(v->layout));
    cr_expect(v->weights == (bool)weights, "weights %d, expected %d", v->weights, weights);
    cr_expect(v->align == align && v->sms == sms, "align %d sms %d, expected %d %d", v->align, v->sms,
              align, sms);
    cr_expect(v->capacity == capacity && v->capacity_set, "capacity %lld (set %d), expected %lld",
              (long long)v->capacity, v->capacity_set, (long long)capacity);
    cr_expect(v->combine == (symm_combine_mode)mode, "combine %s, expected %s", sg_combine_name(v->combine),
              modes[mode]);
    cr_expect(v->combine_order == (order_k ? SYMM_COMBINE_ORDER_K : SYMM_COMBINE_ORDER_RANK),
              "combine_order %d, expected %s", (int)v->combine_order, order_k ? "k" : "rank");
}

/* combine_order "k" keeps layout expert's ascending-k sum; layout rank has
 * only one order, and says why. */
Test(spec, combine_order_k_is_for_layout_expert_only)
{
    shape a = random_shape(), b = random_shape();
    const char *path = write_file("spec.lua",
        "layout { %s, layout = \"expert\", combine_order = \"k\" }\n"
        "layout { %s, combine_order = \"k\" }\n",
        fields(&a), fields(&b));
    cr_assert(load(path) == -1);
    expect_message("%s:2: variant %s: field combine_order: got \"k\", expected \"rank\" (combine_order \"k\" "
                   "applies only to layout \"expert\": layout rank sends one row per token and rank)",
                   path, b.name);
    expect_count(1);
}

Test(spec, defaults_are_applied)
{
    shape a = random_shape(), b = random_shape(), c = random_shape(), d = random_shape(), e = random_shape();
    const char *path = write_file("spec.lua",
        "layout { %s }\n"
        "layout { %s, dtype = \"fp8_e4m3\" }\n"
        "layout { %s, dtype = \"fp16\" }\n"
        "layout { %s, dtype = \"fp32\" }\n"
        "layout { %s, layout = \"expert\" }\n",
        fields(&a), fields(&b), fields(&c), fields(&d), fields(&e));

    cr_assert(load(path) == 0, "load failed:\n%s", messages());
    cr_assert(spec.count == 5, "expected 5 variants, got %zu", spec.count);
    const symm_dtype want_dtype[] = { SYMM_DTYPE_BF16, SYMM_DTYPE_FP8_E4M3, SYMM_DTYPE_FP16, SYMM_DTYPE_FP32,
                                      SYMM_DTYPE_BF16 };
    const symm_dtype want_combine[] = { SYMM_DTYPE_BF16, SYMM_DTYPE_BF16, SYMM_DTYPE_FP16, SYMM_DTYPE_FP32,
                                        SYMM_DTYPE_BF16 };
    const shape *shapes[] = { &a, &b, &c, &d, &e };
    for (int i = 0; i < 5; i++) {
        const sg_variant *v = &spec.variants[i];
        int64_t worst = i == 4 ? worst_expert(&e, 1) : worst_rank(shapes[i]);
        cr_expect(v->dtype == want_dtype[i], "variant %d: dtype %s", i, sg_dtype_name(v->dtype));
        cr_expect(v->combine_dtype == want_combine[i], "variant %d: combine_dtype %s, expected %s", i,
                  sg_dtype_name(v->combine_dtype), sg_dtype_name(want_combine[i]));
        cr_expect(v->weights, "variant %d: weights default to true", i);
        cr_expect(v->sms == 24, "variant %d: sms %d, expected 24", i, v->sms);
        cr_expect(v->align == 1, "variant %d: align %d, expected 1", i, v->align);
        /* "auto" for layout rank from SG_AUTO_MIN_TOKENS tokens or world
         * SG_AUTO_MIN_WORLD, else "push". */
        const symm_combine_mode mode =
            i != 4 && (shapes[i]->max_tokens >= SG_AUTO_MIN_TOKENS || shapes[i]->world >= SG_AUTO_MIN_WORLD)
                ? SYMM_COMBINE_AUTO
                : SYMM_COMBINE_PUSH;
        cr_expect(v->combine == mode, "variant %d (max_tokens %d, world %d, layout %s): combine %s, expected %s", i,
                  shapes[i]->max_tokens, shapes[i]->world, sg_layout_name(v->layout), sg_combine_name(v->combine),
                  sg_combine_name(mode));
        cr_expect(v->combine_order == SYMM_COMBINE_ORDER_RANK, "variant %d: combine_order defaults to \"rank\"", i);
        cr_expect(v->layout == (i == 4 ? SYMM_LAYOUT_EXPERT : SYMM_LAYOUT_RANK), "variant %d: layout %s", i,
                  sg_layout_name(v->layout));
        cr_expect(v->capacity == worst && !v->capacity_set, "variant %d: capacity %lld (set %d), expected %lld",
                  i, (long long)v->capacity, v->capacity_set, (long long)worst);
        cr_expect(v->line == i + 1, "variant %d: line %d", i, v->line);
    }
}

Test(spec, integers_written_as_floats_are_accepted)
{
    shape s = random_shape();
    const char *path = write_file("spec.lua",
        "layout { name = \"%s\", hidden = %d.0, topk = %d.0, experts = %d, world = %d.0, max_tokens = %d,"
        " sms = 1.6e1 }\n",
        s.name, s.hidden, s.topk, s.experts, s.world, s.max_tokens);
    cr_assert(load(path) == 0, "load failed:\n%s", messages());
    const sg_variant *v = &spec.variants[0];
    cr_expect(v->hidden == s.hidden && v->topk == s.topk && v->world == s.world && v->sms == 16,
              "got hidden %d topk %d world %d sms %d", v->hidden, v->topk, v->world, v->sms);
}

Test(spec, table_changed_after_layout_is_not_seen)
{
    shape s = random_shape();
    int other = s.hidden + 128 * (int)rnd(1, 8);
    const char *path = write_file("spec.lua",
        "local t = { %s }\n"
        "layout(t)\n"
        "t.hidden = %d\n"
        "t.name = t.name .. \"_again\"\n"
        "layout(t)\n"
        "t.hidden = \"not a number\"\n",
        fields(&s), other);
    cr_assert(load(path) == 0, "load failed:\n%s", messages());
    cr_assert(spec.count == 2);
    cr_expect(spec.variants[0].hidden == s.hidden, "first variant hidden %d, expected %d",
              spec.variants[0].hidden, s.hidden);
    cr_expect(spec.variants[1].hidden == other, "second variant hidden %d, expected %d",
              spec.variants[1].hidden, other);
    cr_expect(spec.variants[0].line == 2 && spec.variants[1].line == 5, "lines %d %d",
              spec.variants[0].line, spec.variants[1].line);
}

Test(spec, layout_inside_a_helper_reports_the_call_line)
{
    shape s = random_shape();
    const char *pad = padding();
    const char *path = write_file("spec.lua",
        "%slocal function declare(t)\n"
        "  layout(t)\n"
        "end\n"
        "declare { %s }\n",
        pad, fields_except(&s, "hidden"));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field hidden: missing, expected an integer > 0", path, pad_lines + 2,
                   s.name);
    expect_count(1);
}

/* ---------------------------------------------------------------------- */
/* Field errors */

Test(spec, unknown_field_suggests_the_nearest)
{
    static const struct { const char *key, *near; } cases[] = {
        { "hiden", "hidden" }, { "max_token", "max_tokens" }, { "Topk", "topk" },
        { "expert", "experts" }, { "combine_type", "combine_dtype" }, { "wrold", "world" },
        { "capacity_rows", "capacity" }, { "dtpye", "dtype" }, { "combin", "combine" }, { "Combine", "combine" },
    };
    const int n = sizeof cases / sizeof cases[0];
    shape s[16];
    char text[8192] = "";
    const char *pad = padding();
    strcat(text, pad);
    for (int i = 0; i < n; i++) {
        s[i] = random_shape();
        char line[700];
        snprintf(line, sizeof line, "layout { %s, %s = %u }\n", fields(&s[i]), cases[i].key, rnd(1, 1000));
        strcat(text, line);
    }
    const char *path = write_file("spec.lua", "%s", text);
    cr_assert(load(path) == -1);
    for (int i = 0; i < n; i++)
        expect_message("%s:%d: variant %s: field %s: unknown field, did you mean \"%s\"?", path,
                       pad_lines + 1 + i, s[i].name, cases[i].key, cases[i].near);
    expect_count(n);
}

Test(spec, unknown_field_far_from_all_lists_them)
{
    shape s = random_shape();
    const char *path = write_file("spec.lua", "%slayout { %s, frobnicate = true, [\"two words\"] = 1 }\n",
                                  padding(), fields(&s));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field frobnicate: unknown field, expected one of name, hidden, topk, "
                   "experts, world, max_tokens, dtype, combine_dtype, layout, weights, capacity, align, sms, combine, combine_order, hosts",
                   path, pad_lines + 1, s.name);
    expect_message("%s:%d: variant %s: field \"two words\": unknown field, expected one of name, hidden, topk, "
                   "experts, world, max_tokens, dtype, combine_dtype, layout, weights, capacity, align, sms, combine, combine_order, hosts",
                   path, pad_lines + 1, s.name);
    expect_count(2);
}

Test(spec, value_without_field_name_is_an_error)
{
    shape s = random_shape();
    unsigned x = rnd(1, 1000);
    const char *path = write_file("spec.lua", "%slayout { %s, %u }\n", padding(), fields(&s), x);
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: got %u without a field name, expected field = value", path,
                   pad_lines + 1, s.name, x);
    expect_count(1);
}

Test(spec, wrong_type_names_value_and_expectation)
{
    static const struct { const char *field, *lua, *shown, *expected; } cases[] = {
        { "hidden", "\"7168\"", "\"7168\"", "an integer > 0" },
        { "hidden", "7168.5", "7168.5", "an integer > 0" },
        { "topk", "true", "true", "an integer 1..16" },
        { "world", "{ 2 }", "{2}", "an integer 2..128" },
        { "max_tokens", "function() end", "a function", "an integer > 0" },
        { "experts", "1/0", "inf", "an integer 1..8192" },
        { "weights", "1", "1", "true or false" },
        { "dtype", "16", "16", "\"bf16\", \"fp16\", \"fp32\" or \"fp8_e4m3\"" },
        { "layout", "\"ranks\"", "\"ranks\"", "\"rank\" or \"expert\"" },
        { "combine_dtype", "\"BF16\"", "\"BF16\"", "\"bf16\", \"fp16\" or \"fp32\"" },
        { "sms", "\"a\\nb\\1\"", "\"a\\nb\\x01\"", "an integer 1..1024" },
        { "align", "2.5", "2.5", "an integer 1..4096" },
        { "capacity", "\"all\"", "\"all\"", "an integer > 0" },
        { "combine", "\"pul\"", "\"pul\"", "\"push\", \"pull\" or \"auto\"" },
        { "combine", "1", "1", "\"push\", \"pull\" or \"auto\"" },
        { "combine", "true", "true", "\"push\", \"pull\" or \"auto\"" },
        { "combine_order", "\"K\"", "\"K\"", "\"rank\" or \"k\"" },
    };
    const int n = sizeof cases / sizeof cases[0];
    shape s[17];
    char text[16384] = "";
    strcat(text, padding());
    for (int i = 0; i < n; i++) {
        s[i] = random_shape();
        char line[800];
        snprintf(line, sizeof line, "layout { %s, %s = %s }\n", fields_except(&s[i], cases[i].field),
                 cases[i].field, cases[i].lua);
        strcat(text, line);
    }
    const char *path = write_file("spec.lua", "%s", text);
    cr_assert(load(path) == -1);
    for (int i = 0; i < n; i++)
        expect_message("%s:%d: variant %s: field %s: got %s, expected %s", path, pad_lines + 1 + i, s[i].name,
                       cases[i].field, cases[i].shown, cases[i].expected);
    expect_count(n);
}

Test(spec, out_of_range_numbers_report_the_range)
{
    static const struct { const char *field; long long min, max; const char *extra; } cases[] = {
        { "hidden", 1, 1048576, "" },   { "topk", 1, 16, "" },         { "experts", 1, 8192, "" },
        { "world", 2, 128, "" },        { "max_tokens", 1, 1048576, "" },
        { "align", 1, 4096, ", layout = \"expert\"" }, { "sms", 1, 1024, "" },
    };
    const int n = sizeof cases / sizeof cases[0];
    shape s[16];
    long long bad[16];
    char text[16384] = "";
    strcat(text, padding());
    for (int i = 0; i < n; i++) {
        s[i] = random_shape();
        bad[i] = rnd(0, 1) ? cases[i].min - (long long)rnd(1, 1000) : cases[i].max + (long long)rnd(1, 100000);
        char line[800];
        snprintf(line, sizeof line, "layout { %s, %s = %lld%s }\n", fields_except(&s[i], cases[i].field),
                 cases[i].field, bad[i], cases[i].extra);
        strcat(text, line);
    }
    const char *path = write_file("spec.lua", "%s", text);
    cr_assert(load(path) == -1);
    for (int i = 0; i < n; i++)
        expect_message("%s:%d: variant %s: field %s: got %lld, expected %lld..%lld", path, pad_lines + 1 + i,
                       s[i].name, cases[i].field, bad[i], cases[i].min, cases[i].max);
    expect_count(n);
}

Test(spec, capacity_below_one_is_refused)
{
    shape s = random_shape();
    long long bad = -(long long)rnd(0, 1000);
    const char *path = write_file("spec.lua", "%slayout { %s, capacity = %lld }\n", padding(), fields(&s), bad);
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field capacity: got %lld, expected an integer > 0", path, pad_lines + 1,
                   s.name, bad);
    expect_count(1);
}

Test(spec, missing_required_fields_are_named)
{
    static const struct { const char *field, *expected; } cases[] = {
        { "hidden", "an integer > 0" },    { "topk", "an integer 1..16" },
        { "experts", "an integer 1..8192" }, { "world", "an integer 2..128" },
        { "max_tokens", "an integer > 0" }, { "name", NAME_WHAT },
    };
    const int n = sizeof cases / sizeof cases[0];
    shape s[8];
    char text[8192] = "";
    strcat(text, padding());
    for (int i = 0; i < n; i++) {
        s[i] = random_shape();
        char line[700];
        snprintf(line, sizeof line, "layout { %s }\n", fields_except(&s[i], cases[i].field));
        strcat(text, line);
    }
    const char *path = write_file("spec.lua", "%s", text);
    cr_assert(load(path) == -1);
    for (int i = 0; i < n; i++) {
        char label[96];
        if (strcmp(cases[i].field, "name") == 0)
            snprintf(label, sizeof label, "#%d", i + 1);
        else
            snprintf(label, sizeof label, "%.79s", s[i].name);
        expect_message("%s:%d: variant %s: field %s: missing, expected %s", path, pad_lines + 1 + i, label,
                       cases[i].field, cases[i].expected);
    }
    expect_count(n);
}

Test(spec, hidden_must_fill_16_byte_rows_for_each_dtype)
{
    static const struct { const char *dtype, *combine; int need; const char *named; } cases[] = {
        { "bf16", NULL, 8, "bf16" },
        { "fp16", NULL, 8, "fp16" },
        { "fp32", NULL, 4, "fp32" },
        { "fp32", "bf16", 8, "combine_dtype bf16" },
        { "fp32", "fp16", 8, "combine_dtype fp16" },
    };
    const int n = sizeof cases / sizeof cases[0];
    shape s[8];
    int hidden[8];
    char text[8192] = "";
    strcat(text, padding());
    for (int i = 0; i < n; i++) {
        s[i] = random_shape();
        /* Not a multiple of need, but a multiple of everything weaker. */
        int weaker = cases[i].need / 2;
        hidden[i] = cases[i].need * (int)rnd(1, 500) + weaker * (cases[i].combine ? 1 : 0) +
                    (cases[i].combine ? 0 : (int)rnd(1, (unsigned)cases[i].need - 1));
        char line[800];
        snprintf(line, sizeof line, "layout { %s, hidden = %d, dtype = \"%s\"%s%s%s }\n",
                 fields_except(&s[i], "hidden"), hidden[i], cases[i].dtype,
                 cases[i].combine ? ", combine_dtype = \"" : "", cases[i].combine ? cases[i].combine : "",
                 cases[i].combine ? "\"" : "");
        strcat(text, line);
    }
    const char *path = write_file("spec.lua", "%s", text);
    cr_assert(load(path) == -1);
    for (int i = 0; i < n; i++)
        expect_message("%s:%d: variant %s: field hidden: got %d, expected a multiple of %d for %s " ROWS_WHY,
                       path, pad_lines + 1 + i, s[i].name, hidden[i], cases[i].need, cases[i].named);
    expect_count(n);
}

Test(spec, fp8_hidden_must_be_a_multiple_of_128)
{
    shape s = random_shape();
    int hidden = 128 * (int)rnd(0, 100) + 16 * (int)rnd(1, 7);
    const char *path = write_file("spec.lua", "%slayout { %s, hidden = %d, dtype = \"fp8_e4m3\" }\n", padding(),
                                  fields_except(&s, "hidden"), hidden);
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field hidden: got %d, expected a multiple of 128 for fp8_e4m3 "
                   "(one scale per 128 elements)", path, pad_lines + 1, s.name, hidden);
    expect_count(1);
}

Test(spec, experts_must_be_a_multiple_of_world)
{
    shape s = random_shape();
    s.world = (int)rnd(3, 32);
    s.experts = s.world * (int)rnd(1, 20) + (int)rnd(1, (unsigned)s.world - 1);
    s.topk = 1;
    const char *path = write_file("spec.lua", "%slayout { %s }\n", padding(), fields(&s));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field experts: got %d, expected a multiple of world (%d)", path,
                   pad_lines + 1, s.name, s.experts, s.world);
    expect_count(1);
}

Test(spec, topk_at_most_experts)
{
    shape s = random_shape();
    s.world = (int)rnd(2, 4);
    s.experts = s.world * (int)rnd(1, 3);
    s.topk = s.experts + (int)rnd(1, 16 - (unsigned)s.experts);
    const char *path = write_file("spec.lua", "%slayout { %s }\n", padding(), fields(&s));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field topk: got %d, expected 1..%d (at most experts)", path,
                   pad_lines + 1, s.name, s.topk, s.experts);
    expect_count(1);
}

Test(spec, duplicate_name_names_both_lines)
{
    shape a = random_shape(), b = random_shape(), c = random_shape();
    strcpy(c.name, a.name);
    int gap = (int)rnd(1, 20);
    char blank[64] = "";
    for (int i = 0; i < gap; i++)
        strcat(blank, "\n");
    const char *path = write_file("spec.lua", "%slayout { %s }\nlayout { %s }%slayout { %s }\n", padding(),
                                  fields(&a), fields(&b), blank, fields(&c));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field name: got \"%s\", expected a name not used before, ignoring case (line %d has it)",
                   path, pad_lines + 2 + gap, a.name, a.name, pad_lines + 1);
    expect_count(1);
}

Test(spec, names_must_be_c_identifiers)
{
    char longest[80];
    memset(longest, 'n', 64);
    longest[64] = '\0';
    const struct { const char *lua, *shown, *expected; } cases[] = {
        { "\"1abc\"", "\"1abc\"", NAME_WHAT },
        { "\"a-b\"", "\"a-b\"", NAME_WHAT },
        { "\"\"", "\"\"", NAME_WHAT },
        { "\"two words\"", "\"two words\"", NAME_WHAT },
        { "\"caf\\u{e9}\"", "\"caf\\xc3\\xa9\"", NAME_WHAT },
        { "42", "42", NAME_WHAT },
        { "\"int\"", "\"int\"", "a name that is not a C or C++ keyword" },
        { "\"while\"", "\"while\"", "a name that is not a C or C++ keyword" },
        { "\"class\"", "\"class\"", "a name that is not a C or C++ keyword" },
    };
    const int n = sizeof cases / sizeof cases[0];
    shape s[16];
    char text[16384] = "";
    strcat(text, padding());
    for (int i = 0; i < n; i++) {
        s[i] = random_shape();
        char line[800];
        snprintf(line, sizeof line, "layout { %s, name = %s }\n", fields_except(&s[i], "name"), cases[i].lua);
        strcat(text, line);
    }
    /* One character too long: 64 of them. */
    shape last = random_shape();
    char line[800];
    snprintf(line, sizeof line, "layout { %s, name = \"%s\" }\n", fields_except(&last, "name"), longest);
    strcat(text, line);
    const char *path = write_file("spec.lua", "%s", text);
    cr_assert(load(path) == -1);
    for (int i = 0; i < n; i++)
        expect_message("%s:%d: variant #%d: field name: got %s, expected %s", path, pad_lines + 1 + i, i + 1,
                       cases[i].shown, cases[i].expected);
    expect_message("%s:%d: variant #%d: field name: got \"%.48s\"... (64 bytes), expected a name of at most "
                   "63 characters", path, pad_lines + 1 + n, n + 1, longest);
    expect_count(n + 1);
}

Test(spec, sixty_three_character_name_is_accepted)
{
    shape s = random_shape();
    memset(s.name, 'a' + (char)rnd(0, 25), 63);
    s.name[63] = '\0';
    const char *path = write_file("spec.lua", "layout { %s }\n", fields(&s));
    cr_assert(load(path) == 0, "load failed:\n%s", messages());
    cr_expect(strcmp(spec.variants[0].name, s.name) == 0);
}

Test(spec, fp8_is_not_a_combine_dtype)
{
    shape s = random_shape();
    const char *path = write_file("spec.lua",
        "%slayout { %s, dtype = \"fp8_e4m3\", combine_dtype = \"fp8_e4m3\" }\n", padding(), fields(&s));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field combine_dtype: got \"fp8_e4m3\", expected \"bf16\", \"fp16\" or "
                   "\"fp32\" (fp8 is a dispatch dtype only: combine accumulates in fp32 and returns 16 or 32 "
                   "bits)", path, pad_lines + 1, s.name);
    expect_count(1);
}

Test(spec, align_applies_only_to_layout_expert)
{
    shape a = random_shape(), b = random_shape();
    int align_a = (int)rnd(2, 4096), align_b = (int)rnd(2, 4096);
    const char *path = write_file("spec.lua",
        "%slayout { %s, align = %d }\nlayout { %s, layout = \"rank\", align = %d }\n", padding(), fields(&a),
        align_a, fields(&b), align_b);
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field align: got %d, expected 1 (align applies only to layout \"expert\")",
                   path, pad_lines + 1, a.name, align_a);
    expect_message("%s:%d: variant %s: field align: got %d, expected 1 (align applies only to layout \"expert\")",
                   path, pad_lines + 2, b.name, align_b);
    expect_count(2);
}

Test(spec, capacity_above_the_worst_case_is_refused)
{
    shape a = random_shape(), b = random_shape();
    int align = (int)rnd(1, 512);
    long long cap_a = worst_rank(&a) + rnd(1, 1000), cap_b = worst_expert(&b, align) + rnd(1, 1000);
    const char *path = write_file("spec.lua",
        "%slayout { %s, capacity = %lld }\nlayout { %s, layout = \"expert\", align = %d, capacity = %lld }\n",
        padding(), fields(&a), cap_a, fields(&b), align, cap_b);
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field capacity: got %lld, expected 1..%lld (the worst case, world * "
                   "max_tokens)", path, pad_lines + 1, a.name, cap_a, (long long)worst_rank(&a));
    expect_message("%s:%d: variant %s: field capacity: got %lld, expected 1..%lld (the worst case, world * "
                   "max_tokens * min(topk, experts/world) + (experts/world) * (align - 1))",
                   path, pad_lines + 2, b.name, cap_b, (long long)worst_expert(&b, align));
    expect_count(2);
}

Test(spec, worst_case_too_large_names_max_tokens)
{
    /* Rows must fit in int32: 128 ranks, 16 copies per token; and for
     * layout expert the capacity times min(topk, experts/world) (16 here),
     * which dispatch's word per token holds (a row and how many follow):
     * a smaller max_tokens or a capacity of at most int32 / 16. */
    int align = (int)rnd(1, 4096);
    long long local = 8192 / 128;
    long long fit_rows = (2147483647LL - local * (align - 1)) / (128 * 16);
    long long fit_words = (2147483647LL / 16 - local * (align - 1)) / (128 * 16);
    /* Still within max_tokens' own range (1..1048576). */
    long long tokens = fit_rows + rnd(1, (unsigned)(1048576 - fit_rows));
    long long rows = 128 * 16 * tokens + local * (align - 1);
    long long tokens_w = fit_words + rnd(1, (unsigned)(fit_rows - fit_words));
    long long rows_w = 128 * 16 * tokens_w + local * (align - 1);
    /* Bytes must fit in 1 TiB: 2 ranks of 4 MiB rows fit 2^17 tokens. */
    long long tokens_b = (1LL << 17) + rnd(1, 1000);
    const char *path = write_file("spec.lua",
        "%slayout { name = \"big_rows\", hidden = 128, topk = 16, experts = 8192, world = 128,"
        " max_tokens = %lld, layout = \"expert\", align = %d }\n"
        "layout { name = \"big_bytes\", hidden = 1048576, dtype = \"fp32\", topk = 1, experts = 2, world = 2,"
        " max_tokens = %lld }\n"
        "layout { name = \"big_words\", hidden = 128, topk = 16, experts = 8192, world = 128,"
        " max_tokens = %lld, layout = \"expert\", align = %d }\n"
        "layout { name = \"big_cap\", hidden = 128, topk = 16, experts = 8192, world = 128,"
        " max_tokens = %lld, layout = \"expert\", align = %d, capacity = 134217728 }\n",
        padding(), tokens, align, tokens_b, tokens_w, align, tokens_w, align);
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant big_rows: field max_tokens: got %lld, expected at most %lld (the worst-case "
                   "capacity, %lld rows, must fit in int32)", path, pad_lines + 1, tokens, fit_rows, rows);
    expect_message("%s:%d: variant big_bytes: field max_tokens: got %lld, expected at most %lld (the worst-case "
                   "buffers, %lld rows of %lld bytes, must fit in 1 TiB)", path, pad_lines + 2, tokens_b,
                   1LL << 17, 2 * tokens_b, 4LL << 20);
    expect_message("%s:%d: variant big_words: field max_tokens: got %lld, expected at most %lld, or a capacity of "
                   "at most 134217727 (the worst-case capacity, %lld rows, times min(topk, experts/world), 16, must "
                   "fit in int32: dispatch's word per token holds a row and how many follow)", path, pad_lines + 3,
                   tokens_w, fit_words, rows_w);
    expect_message("%s:%d: variant big_cap: field capacity: got 134217728, expected at most 134217727 (the "
                   "capacity times min(topk, experts/world), 16, must fit in int32: dispatch's word per token holds "
                   "a row and how many follow)", path, pad_lines + 4);
    expect_count(4);
}

/* The word bound multiplies the capacity by min(topk, experts/world):
 * layout rank at 2^27 rows (above int32 / 16) is accepted, and so are
 * layout expert at top-2 with 2^28 rows (2^29 in the word) and at top-16
 * with its capacity set to int32 / 16 below a worst case above it. */
Test(spec, the_word_bound_is_the_capacity_times_min_topk_local)
{
    const char *path = write_file("spec.lua",
        "layout { name = \"rank_rows\", hidden = 128, topk = 16, experts = 8192, world = 128, max_tokens = 1048576 }\n"
        "layout { name = \"expert_top2\", hidden = 128, topk = 2, experts = 8192, world = 128,"
        " max_tokens = 1048576, layout = \"expert\" }\n"
        "layout { name = \"expert_cap\", hidden = 128, topk = 16, experts = 8192, world = 128,"
        " max_tokens = 1000000, layout = \"expert\", capacity = 134217727 }\n");
    cr_assert(load(path) == 0, "%s", messages());
}

Test(spec, every_error_is_reported_in_order)
{
    shape ok1 = random_shape(), bad1 = random_shape(), ok2 = random_shape(), bad2 = random_shape();
    int topk = (int)rnd(17, 100);
    const char *path = write_file("spec.lua",
        "%slayout { %s }\n"
        "layout { %s, dtype = \"bf32\" }\n"
        "layout { %s }\n"
        "layout { %s, topk = %d, weights = \"yes\" }\n"
        "layout { hidden = 0 }\n",
        padding(), fields(&ok1), fields(&bad1), fields(&ok2), fields_except(&bad2, "topk"), topk);
    cr_assert(load(path) == -1);
    const char *want[] = { "dtype", "topk", "weights", "name", "hidden", "topk", "experts", "world", "max_tokens" };
    const int n = sizeof want / sizeof want[0];
    expect_count(n);
    for (int i = 0; i < n && i < (int)diag.count; i++) {
        char field[64];
        snprintf(field, sizeof field, ": field %s: ", want[i]);
        cr_expect(strstr(diag.messages[i], field) != NULL, "message %d should be about %s:\n%s", i, want[i],
                  messages());
    }
    expect_message("%s:%d: variant %s: field dtype: got \"bf32\", expected \"bf16\", \"fp16\", \"fp32\" or "
                   "\"fp8_e4m3\"", path, pad_lines + 2, bad1.name);
    expect_message("%s:%d: variant %s: field topk: got %d, expected 1..16", path, pad_lines + 4, bad2.name, topk);
    expect_message("%s:%d: variant %s: field weights: got \"yes\", expected true or false", path, pad_lines + 4,
                   bad2.name);
    expect_message("%s:%d: variant #5: field hidden: got 0, expected 1..1048576", path, pad_lines + 5);

    /* A failed load leaves the output as it was. */
    sg_variant sentinel_variant;
    char sentinel_path[] = "untouched";
    size_t sentinel_count = rnd(1, 1000);
    sg_spec out = { .path = sentinel_path, .variants = &sentinel_variant, .count = sentinel_count };
    sg_diag d = { 0 };
    cr_assert(sg_spec_load(path, NULL, 0, &out, &d) == -1);
    cr_expect(out.path == sentinel_path && out.variants == &sentinel_variant && out.count == sentinel_count,
              "a failed load must leave *out untouched");
    cr_expect(d.count == (size_t)n, "the same %d messages again, got %zu", n, d.count);
    sg_diag_free(&d);
}

Test(spec, fields_can_be_inherited_through_index)
{
    shape s = random_shape();
    const char *path = write_file("spec.lua",
        "local base = { %s }\n"
        "layout(setmetatable({ name = base.name .. \"_child\", dtype = \"fp16\" }, { __index = base }))\n",
        fields(&s));
    cr_assert(load(path) == 0, "load failed:\n%s", messages());
    const sg_variant *v = &spec.variants[0];
    cr_expect(v->hidden == s.hidden && v->world == s.world && v->dtype == SYMM_DTYPE_FP16 &&
              strncmp(v->name, s.name, strlen(s.name)) == 0 && strstr(v->name, "_child") != NULL,
              "inherited hidden %d world %d name %s", v->hidden, v->world, v->name);
}

/* ---------------------------------------------------------------------- */
/* Lua-level errors */

Test(spec, syntax_error_has_file_and_line)
{
    const char *path = write_file("spec.lua", "%slocal x = 1\nlocal y = = 2\n", padding());
    cr_assert(load(path) == -1);
    expect_message("%s:%d: unexpected symbol near '='", path, pad_lines + 2);
    expect_count(1);
}

Test(spec, long_paths_are_not_cut_in_messages)
{
    char sub[640];
    snprintf(sub, sizeof sub, "%s/a_directory_name_long_enough_to_pass_sixty_characters_of_lua", dir);
    cr_assert(mkdir(sub, 0700) == 0, "mkdir %s: %s", sub, strerror(errno));
    const char *path = write_file("a_directory_name_long_enough_to_pass_sixty_characters_of_lua/spec.lua",
                                  "%serror(\"boom\")\n", padding());
    cr_assert(load(path) == -1);
    expect_message("%s:%d: boom", path, pad_lines + 1);
}

Test(spec, runtime_error_has_file_and_line_and_no_traceback)
{
    const char *pad = padding();
    const char *path = write_file("spec.lua",
        "%slocal function check(n)\n"
        "  if n > 2 then error(\"boom \" .. n) end\n"
        "  check(n + 1)\n"
        "end\n"
        "check(1)\n", pad);
    cr_assert(load(path) == -1);
    expect_message("%s:%d: boom 3", path, pad_lines + 2);
    expect_count(1);
    cr_expect(diag.count == 0 || strstr(diag.messages[0], "traceback") == NULL, "%s", messages());
}

Test(spec, error_without_position_gets_one)
{
    const char *path = write_file("spec.lua", "%sassert(false, \"level zero\")\n", padding());
    cr_assert(load(path) == -1);
    expect_message("%s:%d: level zero", path, pad_lines + 1);
    const char *path2 = write_file("other.lua", "\n\nerror(\"no position\", 0)\n");
    cr_assert(load(path2) == -1);
    expect_message("%s:3: no position", path2);
    const char *path3 = write_file("third.lua", "%serror({ code = 1 })\n", padding());
    cr_assert(load(path3) == -1);
    expect_message("%s:%d: error raised with a table, expected a message string", path3, pad_lines + 1);
}

Test(spec, layout_needs_a_table)
{
    const char *path = write_file("spec.lua", "%slayout(%u)\n", padding(), rnd(1, 100000));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: layout: expected a table of fields, got number", path, pad_lines + 1);
    expect_count(1);
    const char *path2 = write_file("two.lua", "layout \"bf16\"\n");
    cr_assert(load(path2) == -1);
    expect_message("%s:1: layout: expected a table of fields, got string", path2);
}

Test(spec, spec_without_variants_says_so)
{
    const char *empty = write_file("empty.lua", "%s", "");
    cr_assert(load(empty) == -1);
    expect_message("%s: declares no variants (call layout { ... })", empty);
    expect_count(1);
    const char *quiet = write_file("quiet.lua", "%slocal x = %u\n", padding(), rnd(1, 1000));
    cr_assert(load(quiet) == -1);
    expect_message("%s: declares no variants (call layout { ... })", quiet);
}

Test(spec, unreadable_file_says_why)
{
    const char *missing = path_in("missing.lua");
    cr_assert(load(missing) == -1);
    expect_message("%s: cannot read: No such file or directory", missing);
    expect_count(1);
    cr_assert(load(dir) == -1);
    expect_message("%s: cannot read: Is a directory", dir);
}

Test(spec, huge_file_is_refused)
{
    size_t len = (16u << 20) + rnd(1, 4096);
    char *text = malloc(len);
    cr_assert(text != NULL);
    memset(text, '-', len);
    for (size_t i = 80; i < len; i += 80)
        text[i] = '\n';
    const char *path = write_bytes("huge.lua", text, len);
    free(text);
    cr_assert(load(path) == -1);
    expect_message("%s: too large for a spec (more than 16 MiB)", path);
    expect_count(1);
}

Test(spec, binary_garbage_is_a_clean_error)
{
    unsigned char bytes[4096];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (unsigned char)rnd(0, 255);
    const char *path = write_bytes("garbage.lua", bytes, sizeof bytes);
    cr_assert(load(path) == -1);
    cr_assert(diag.count == 1, "%s", messages());
    size_t plen = strlen(path);
    cr_expect(strncmp(diag.messages[0], path, plen) == 0 && diag.messages[0][plen] == ':',
              "message should start with the path: %s", diag.messages[0]);
    for (const char *p = diag.messages[0]; *p; p++)
        cr_expect((unsigned char)*p >= 0x20 && *p != 0x7f, "control byte 0x%02x in: %s", (unsigned char)*p,
                  diag.messages[0]);

    const char chunk[] = "\x1bLua\x54\x00\x19\x93\r\n\x1a\n";
    const char *compiled = write_bytes("compiled.lua", chunk, sizeof chunk - 1);
    cr_assert(load(compiled) == -1);
    expect_message("%s: attempt to load a binary chunk (mode is 't')", compiled);
}

Test(spec, deep_recursion_is_a_clean_error)
{
    const char *path = write_file("spec.lua", "%slocal function f(n) return 1 + f(n + 1) end\nf(1)\n", padding());
    cr_assert(load(path) == -1);
    expect_message("%s:%d: stack overflow", path, pad_lines + 1);
    expect_count(1);

    size_t depth = 100000 + rnd(0, 1000);
    char *text = malloc(depth + 32);
    cr_assert(text != NULL);
    strcpy(text, "return ");
    memset(text + 7, '(', depth);
    text[7 + depth] = '\0';
    const char *nested = write_bytes("nested.lua", text, strlen(text));
    free(text);
    cr_assert(load(nested) == -1);
    cr_assert(diag.count == 1, "%s", messages());
    cr_expect(strncmp(diag.messages[0], nested, strlen(nested)) == 0, "%s", messages());
}

/* ---------------------------------------------------------------------- */
/* Sandbox and limits */

Test(spec, sandbox_refuses_the_outside_world)
{
    static const char *const snippets[] = {
        "os.execute(\"touch %s\")",
        "io.open(\"%s\", \"w\"):write(\"x\")",
        "load(\"local f = io.open('%s', 'w')\")()",
        "loadfile(\"%s\")",
        "dofile(\"%s\")",
        "package.loadlib(\"%s\", \"luaopen_x\")",
        "debug.sethook(print, \"%s\")",
        "string.dump(function() return \"%s\" end)",
        "(\"%s\").dump(function() end)",
        "collectgarbage(\"%s\")",
        "print(\"%s\")",
        "require(\"os\").execute(\"touch %s\")",
    };
    for (size_t i = 0; i < sizeof snippets / sizeof snippets[0]; i++) {
        char marker[700], code[2048], name[32];
        snprintf(marker, sizeof marker, "%s/marker_%zu_%u", dir, i, rnd(0, 1u << 30));
        snprintf(code, sizeof code, snippets[i], marker);
        snprintf(name, sizeof name, "s%zu.lua", i);
        shape s = random_shape();
        const char *path = write_file(name, "%s%s\nlayout { %s }\n", padding(), code, fields(&s));
        cr_expect(load(path) == -1, "spec %zu (%s) should fail", i, code);
        char prefix[800];
        snprintf(prefix, sizeof prefix, "%s:%d: ", path, pad_lines + 1);
        cr_expect(diag.count == 1 && strncmp(diag.messages[0], prefix, strlen(prefix)) == 0,
                  "spec %zu (%s): expected one message starting %s, got\n%s", i, code, prefix, messages());
        cr_expect(access(marker, F_OK) != 0, "spec %zu (%s) created %s", i, code, marker);
    }
}

Test(spec, sandbox_keeps_pure_lua)
{
    shape s = random_shape();
    const char *path = write_file("spec.lua",
        "assert(os == nil and io == nil and debug == nil and package == nil and load == nil)\n"
        "assert(loadfile == nil and dofile == nil and collectgarbage == nil and print == nil)\n"
        "assert(string.dump == nil and getmetatable('').__index.dump == nil)\n"
        "local parts = {}\n"
        "for i, w in ipairs({ 'a', 'b' }) do parts[#parts + 1] = string.format('%%s%%d', w, i) end\n"
        "assert(table.concat(parts, ',') == 'a1,b2' and math.floor(2.5) == 2 and utf8.char(65) == 'A')\n"
        "assert(select('#', 1, 2) == 2 and tonumber('12') == 12 and tostring(3) == '3' and type({}) == 'table')\n"
        "assert(pcall(error, 'x') == false and rawequal(_G, _ENV) and rawlen({ 1 }) == 1)\n"
        "local t = setmetatable({}, { __index = function() return 5 end })\n"
        "assert(t.x == 5 and next({}) == nil and xpcall(function() return 1 end, function() end))\n"
        "assert(('abc'):upper() == 'ABC' and ('a_b'):gsub('_', '') == 'ab')\n"
        "local r1 = math.random(1, 1000000)\n"
        "layout { %s, sms = r1 %% 1024 + 1 }\n",
        fields(&s));
    cr_assert(load(path) == 0, "load failed:\n%s", messages());
    int first = spec.variants[0].sms;
    cr_assert(load(path) == 0);
    cr_expect(spec.variants[0].sms == first, "math.random must be seeded the same on every run: %d then %d",
              first, spec.variants[0].sms);
}

Test(spec, require_rejects_paths_and_missing_modules)
{
    static const struct { const char *arg, *msg; } cases[] = {
        { "\"../x\"", "require \"../x\": expected a module name of letters, digits and _" },
        { "\"a.b\"", "require \"a.b\": expected a module name of letters, digits and _" },
        { "\"/etc/passwd\"", "require \"/etc/passwd\": expected a module name of letters, digits and _" },
        { "\"missing\"", "require \"missing\": no file missing.lua next to the spec" },
        { "42", "require: expected a module name of letters, digits and _, got number" },
        { "\"spec\"", "require \"spec\": circular require (spec.lua is still loading)" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = write_file("spec.lua", "%srequire(%s)\n", padding(), cases[i].arg);
        cr_expect(load(path) == -1, "require(%s) should fail", cases[i].arg);
        expect_message("%s:%d: %s", path, pad_lines + 1, cases[i].msg);
        expect_count(1);
    }
}

Test(spec, require_loads_a_sibling_module_once)
{
    shape s = random_shape();
    int mod_pad = (int)rnd(0, 20);
    char mpad[256] = "";
    for (int i = 0; i < mod_pad; i++)
        strcat(mpad, "--\n");
    write_file("shapes.lua",
        "%sloads = (loads or 0) + 1\n"
        "local M = {}\n"
        "function M.declare(name, hidden)\n"
        "  layout { name = name, hidden = hidden, topk = %d, experts = %d, world = %d, max_tokens = %d }\n"
        "end\n"
        "function M.fail() error(\"module refuses\") end\n"
        "return M\n",
        mpad, s.topk, s.experts, s.world, s.max_tokens);
    const char *module = path_in("shapes.lua");
    const char *path = write_file("spec.lua",
        "%slocal shapes = require \"shapes\"\n"
        "assert(require(\"shapes\") == shapes and loads == 1)\n"
        "shapes.declare(\"%s\", %d)\n"
        "shapes.declare(\"%s_bad\", \"x\")\n",
        padding(), s.name, s.hidden, s.name);
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s_bad: field hidden: got \"x\", expected an integer > 0", module, mod_pad + 4,
                   s.name);
    expect_count(1);

    path = write_file("spec.lua", "%slocal shapes = require \"shapes\"\nshapes.declare(\"%s\", %d)\n", padding(),
                      s.name, s.hidden);
    cr_assert(load(path) == 0, "load failed:\n%s", messages());
    cr_expect(spec.count == 1 && spec.variants[0].hidden == s.hidden && spec.variants[0].line == mod_pad + 4,
              "variant from the module: count %zu line %d", spec.count, spec.count ? spec.variants[0].line : 0);

    path = write_file("spec.lua", "%slocal shapes = require \"shapes\"\nshapes.fail()\n", padding());
    cr_assert(load(path) == -1);
    expect_message("%s:%d: module refuses", module, mod_pad + 6);
    expect_count(1);

    write_file("broken.lua", "%slocal = 1\n", mpad);
    path = write_file("spec.lua", "require \"broken\"\n");
    cr_assert(load(path) == -1);
    expect_message("%s:%d: <name> expected near '='", path_in("broken.lua"), mod_pad + 1);
}

Test(spec, endless_loop_stops_with_too_long)
{
    const char *path = write_file("spec.lua", "%slocal n = 0\nwhile true do n = n + 1 end\n", padding());
    cr_assert(load(path) == -1);
    expect_message("%s: " TOO_LONG, path);
    expect_count(1);
}

Test(spec, endless_loop_inside_pcall_still_stops)
{
    const char *path = write_file("spec.lua",
        "%swhile true do\n"
        "  pcall(function() while true do end end)\n"
        "  xpcall(function() while true do end end, function() while true do end end)\n"
        "end\n", padding());
    cr_assert(load(path) == -1);
    expect_message("%s: " TOO_LONG, path);
    expect_count(1);
}

Test(spec, memory_bomb_stops_cleanly)
{
    const char *path = write_file("spec.lua", "%slocal s = \"x\"\nwhile true do s = s .. s end\n", padding());
    cr_assert(load(path) == -1);
    expect_message("%s: " OUT_OF_MEMORY, path);
    expect_count(1);

    /* Caught once by pcall, the memory comes back; the second bomb is not caught. */
    const char *path2 = write_file("caught.lua",
        "local ok = pcall(function() local s = \"x\" while true do s = s .. s end end)\n"
        "assert(not ok)\n"
        "local t = {}\n"
        "for i = 1, 1e9 do t[i] = i end\n");
    cr_assert(load(path2) == -1);
    expect_message("%s: " OUT_OF_MEMORY, path2);
    expect_count(1);
}

Test(spec, costly_pattern_is_refused_and_cheap_one_works)
{
    const char *path = write_file("spec.lua",
        "%slocal s = string.rep(\"a\", %u)\nlocal found = s:find(\".-.-.-.-b\")\n", padding(), rnd(2000, 5000));
    cr_assert(load(path) == -1);
    cr_assert(diag.count == 1, "%s", messages());
    char prefix[700];
    snprintf(prefix, sizeof prefix, "%s:%d: string.find: pattern too costly for a spec", path, pad_lines + 2);
    cr_expect(strncmp(diag.messages[0], prefix, strlen(prefix)) == 0, "expected %s...\n%s", prefix, messages());

    shape s = random_shape();
    path = write_file("ok.lua",
        "local name = \"%s\"\n"
        "local head, tail = name:match(\"^(%%a+)(%%d+)\")\n"
        "assert(head == \"v\" and name:gsub(\"_\", \"\") ~= name)\n"
        "layout { %s }\n", s.name, fields(&s));
    cr_assert(load(path) == 0, "a cheap pattern must work:\n%s", messages());
}

/* The tests below whose specs only the deadline stops wait for it: a short
 * one (run after the suite's setup). */
static void deadline_tests(void)
{
    setenv("SYMM_SPEC_TIMEOUT", SHORT_LIMIT_S, 1);
}

static bool short_deadline(void) { return strcmp(getenv("SYMM_SPEC_TIMEOUT"), SHORT_LIMIT_S) == 0; }

/* A spec of code, then a layout, stops with "spec ran too long" in under
 * max_s seconds. */
static void expect_too_long(const char *code, int max_s)
{
    shape s = random_shape();
    const char *path = write_file("spec.lua", "%s%slayout { %s }\n", padding(), code, fields(&s));
    time_t start = time(NULL);
    cr_assert(load(path) == -1, "%s must stop", code);
    if (short_deadline())
        expect_message("%s: " TOO_LONG_AT(SHORT_LIMIT_S), path);
    else
        expect_message("%s: " TOO_LONG, path);
    expect_count(1);
    cr_expect(time(NULL) - start < max_s, "%s took %lld s", code, (long long)(time(NULL) - start));
}

/* Work in C that nothing charges (two long strings compared with ==, a
 * memcmp of 64 MiB in one instruction) stops at the deadline. */
Test(spec, uncharged_c_work_stops_at_the_deadline, .init = deadline_tests)
{
    wf_watchdog(240);
    expect_too_long("local a = (\"x\"):rep(1 << 26)\nlocal b = a:sub(1, -2) .. \"y\"\n"
                    "for i = 1, 1e9 do local same = a == b end\n",
                    40);
}

/* A short loop repeating a long string call (a backtracking match, a scan of
 * 64 MiB, a gmatch iteration): each call's time is charged to the budget. */
Test(spec, loops_of_long_string_calls_stop_with_too_long)
{
    static const char *const bombs[] = {
        "local s = (\"a\"):rep(%u) for i = 1, 100000 do s:find(\".-b\") end\n",
        "local s = (\"x\"):rep(1 << 26) for i = 1, 10000000 do s:find(\"y\", 1, true) end -- %u\n",
        "local s = (\"a\"):rep(%u) for i = 1, 100000 do for w in s:gmatch(\".-b\") do end end\n",
        "local s = (\"\\u{e9}\"):rep(1 << 24) for i = 1, 10000000 do utf8.len(s) end -- %u\n",
        "local s = (\"x\"):rep(1 << 25) for i = 1, 10000000 do local u = s:upper() end -- %u\n",
        /* One VM instruction copies 32 MiB: the bytes allocated count. */
        "local s = (\"x\"):rep(1 << 25) for i = 1, 10000000 do local u = s .. i end -- %u\n",
    };
    for (size_t i = 0; i < sizeof bombs / sizeof bombs[0]; i++) {
        char code[512];
        snprintf(code, sizeof code, bombs[i], rnd(2000, 5000));
        expect_too_long(code, 10);
    }
}

/* Loops that run in C see no count hook: each is charged to the budget. */
Test(spec, c_library_loops_stop_with_too_long)
{
    static const char *const bombs[] = {
        "table.move({}, 1, 1 << %u, 2)\n",
        "table.insert(setmetatable({}, { __len = function() return 1 << %u end }), 1, 5)\n",
        "table.remove(setmetatable({}, { __len = function() return 1 << %u end }), 1)\n",
        "table.concat(setmetatable({}, { __index = table.concat }), \"\", 1, 1 << %u)\n",
        "table.sort(setmetatable({}, { __index = rawlen, __newindex = rawequal,\n"
        "  __len = function() return (1 << %u) - 2 end }))\n",
    };
    for (size_t i = 0; i < sizeof bombs / sizeof bombs[0]; i++) {
        char code[512];
        snprintf(code, sizeof code, bombs[i], i == 4 ? rnd(28, 31) : rnd(40, 62));
        expect_too_long(code, 10);
    }
}

Test(spec, library_loops_of_real_tables_still_work)
{
    shape s = random_shape();
    unsigned n = rnd(20000, 60000), k = rnd(3, 9);
    const char *path = write_file("spec.lua",
        "local t = {}\n"
        "for i = 1, %u do table.insert(t, (i * 7919) %% %u) end\n"
        "for i = 1, 100 do table.insert(t, 1, i); table.remove(t, 1) end\n"
        "local u = table.move(t, 1, #t, 1, {})\n"
        "table.sort(setmetatable(u, {}))\n"
        "assert(u[1] <= u[#u] and #table.concat(u, \",\") > 0)\n"
        "assert(string.rep(\"\", 1 << 62) == \"\" and string.rep(\"\", 1 << 62, \"\") == \"\")\n"
        "assert(string.rep(\"ab\", %u, \"-\") == \"ab\" .. string.rep(\"-ab\", %u))\n"
        "layout { %s }\n", n, n, k, k - 1, fields(&s));
    cr_assert(load(path) == 0, "load failed:\n%s", messages());
}

/* The review's reproducers: single C calls that run for minutes or forever
 * where no count hook runs, and a message handler that Lua runs with hooks
 * off. Each stops at the deadline, whatever it does. */
Test(spec, handler_and_long_find_that_run_forever_stop_at_the_deadline, .init = deadline_tests)
{
    static const char *const bombs[] = {
        /* The budget error is raised in the hook; Lua runs the handler with hooks off. */
        "xpcall(function() while true do end end, function() while true do end end)\n",
        /* find, plain find and match cost n * m, charged only after the call. */
        "local s = (\"a\"):rep(2^25) local p = (\"a\"):rep(2^24) .. \"b\" s:find(p)\n",
        "local s = (\"a\"):rep(2^25) local p = (\"a\"):rep(2^24) .. \"b\" s:find(p, 1, true)\n",
    };
    for (size_t i = 0; i < sizeof bombs / sizeof bombs[0]; i++)
        expect_too_long(bombs[i], 10);
}

Test(spec, match_backreference_and_table_shift_stop_at_the_deadline, .init = deadline_tests)
{
    static const char *const bombs[] = {
        "local s = (\"a\"):rep(2^25) local p = (\"a\"):rep(2^24) .. \"b\" s:match(p)\n",
        /* Back-references are not priced. */
        "local found = (\"a\"):rep(30000):find(\"(.*)%1x\")\n",
        /* Shifting a long table is not charged. */
        "local t = {} for i = 1, 6e6 do t[i] = i end\n"
        "for i = 1, 1e7 do table.insert(t, 1, 0) table.remove(t, 1) end\n",
    };
    for (size_t i = 0; i < sizeof bombs / sizeof bombs[0]; i++)
        expect_too_long(bombs[i], 10);
}

/* string.rep of "" answers at once, whatever form the count takes (a float
 * or a string once looped 2^62 times in C). */
Test(spec, rep_of_an_empty_string_answers_at_once_for_any_count)
{
    static const char *const counts[] = { "2^62", "1e18", "\"1000000000000000000\"", "1 << 62" };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        shape s = random_shape();
        const char *path = write_file("spec.lua", "local s = string.rep(\"\", %s)\n"
                                      "assert(s == \"\" and (\"\"):rep(%s, \"\") == \"\")\nlayout { %s }\n",
                                      counts[i], counts[i], fields(&s));
        time_t start = time(NULL);
        cr_assert(load(path) == 0, "string.rep(\"\", %s):\n%s", counts[i], messages());
        cr_expect(time(NULL) - start < 2, "string.rep(\"\", %s) took %lld s", counts[i],
                  (long long)(time(NULL) - start));
    }
}

/* The deadline comes from SYMM_SPEC_TIMEOUT; a value it cannot take is an
 * error naming the accepted ones. */
Test(spec, spec_timeout_that_is_not_a_number_of_seconds_is_refused)
{
    static const char *const bad[] = { "abc", "0", "-1", "1e3", "", "100000" };
    const char *value = bad[rnd(0, sizeof bad / sizeof bad[0] - 1)];
    setenv("SYMM_SPEC_TIMEOUT", value, 1);
    shape s = random_shape();
    const char *path = write_file("spec.lua", "layout { %s }\n", fields(&s));
    cr_assert(load(path) == -1, "SYMM_SPEC_TIMEOUT=\"%s\" was taken", value);
    expect_message("SYMM_SPEC_TIMEOUT=\"%s\": expected the seconds a spec may run, a number in 0.1..86400 "
                   "(default 10)", value);
    expect_count(1);
}

Test(spec, spec_timeout_sets_the_deadline)
{
    setenv("SYMM_SPEC_TIMEOUT", "1.5", 1);
    shape s = random_shape();
    const char *path = write_file("spec.lua", "%sxpcall(function() while true do end end, function() "
                                  "while true do end end)\nlayout { %s }\n", padding(), fields(&s));
    time_t start = time(NULL);
    cr_assert(load(path) == -1);
    expect_message("%s: spec ran too long (more than 200000000 instructions, with the time of string functions "
                   "and the bytes allocated counted in, or more than 1.5 s; SYMM_SPEC_TIMEOUT sets the seconds)",
                   path);
    cr_expect(time(NULL) - start <= 4, "took %lld s with a deadline of 1.5 s", (long long)(time(NULL) - start));
}

/* A FIFO (or another file that is not a regular one) given as the spec or
 * required as a module is refused at once: opening it must not wait for a
 * writer that never comes. */
Test(spec, fifo_as_spec_or_module_is_refused_without_blocking)
{
    const char *fifo = path_in("pipe.lua");
    cr_assert(mkfifo(fifo, 0600) == 0, "mkfifo %s: %s", fifo, strerror(errno));
    time_t start = time(NULL);
    cr_assert(load(fifo) == -1);
    expect_message("%s: cannot read: a FIFO, expected a regular file", fifo);
    expect_count(1);

    const char *path = write_file("spec.lua", "%slocal m = require \"pipe\"\n", padding());
    cr_assert(load(path) == -1);
    expect_message("%s:%d: require \"pipe\": %s: cannot read: a FIFO, expected a regular file", path,
                   pad_lines + 1, fifo);
    expect_count(1);

    cr_assert(load("/dev/null") == -1);
    expect_message("/dev/null: cannot read: a character device, expected a regular file");
    cr_expect(time(NULL) - start < 5, "refusing took %lld s", (long long)(time(NULL) - start));
}

/* Lua runs finalizers with hooks off: an endless __gc would never stop. */
Test(spec, finalizers_are_refused)
{
    shape s = random_shape();
    const char *path = write_file("spec.lua",
        "%slayout { %s }\n"
        "setmetatable({}, { __gc = function() while true do end end })\n", padding(), fields(&s));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: setmetatable: a spec cannot use __gc (finalizers run outside the spec's "
                   "instruction limit)", path, pad_lines + 2);
    expect_count(1);
}

/* A field read through __index may declare more variants (and move the
 * array that holds the one being read). */
Test(spec, index_that_declares_variants_keeps_the_outer_one)
{
    shape s = random_shape();
    unsigned before = rnd(1, 40), inner = rnd(20, 80);
    const char *path = write_file("spec.lua",
        "for i = 1, %u do layout { %s, name = \"a\" .. i } end\n"
        "local base, done = { %s }, false\n"
        "%slayout(setmetatable({}, { __index = function(_, key)\n"
        "  if key == \"world\" and not done then\n"
        "    done = true\n"
        "    for j = 1, %u do layout { %s, name = \"b\" .. j } end\n"
        "  end\n"
        "  return base[key]\n"
        "end }))\n", before, fields_except(&s, "name"), fields(&s), padding(), inner,
        fields_except(&s, "name"));
    cr_assert(load(path) == 0, "load failed:\n%s", messages());
    cr_assert(spec.count == before + inner + 1, "%zu variants, expected %u", spec.count, before + inner + 1);
    const sg_variant *v = &spec.variants[before];
    cr_expect(strcmp(v->name, s.name) == 0 && v->hidden == s.hidden && v->topk == s.topk &&
              v->experts == s.experts && v->world == s.world && v->max_tokens == s.max_tokens &&
              v->line == pad_lines + 3,
              "outer variant: %s hidden %d topk %d experts %d world %d max_tokens %d line %d",
              v->name, v->hidden, v->topk, v->experts, v->world, v->max_tokens, v->line);
    cr_expect(strcmp(spec.variants[before + 1].name, "b1") == 0, "inner variants follow the outer one");
}

/* A layout call that raised an error (here in a field's __index, caught by
 * pcall) declares nothing; variants declared by calls nested in it that
 * returned stay, and the error reaches the spec as it was raised. */
Test(spec, layout_call_that_raised_an_error_declares_nothing)
{
    shape bad = random_shape(), good = random_shape(), inner = random_shape();
    unsigned failing = rnd(1, 5);
    /* One the table does not hold, so that it is read through __index. */
    const char *field = field_names_for_test[rnd(6, 13)];
    const char *path = write_file("spec.lua",
        "%s"
        "for i = 1, %u do\n"
        "  local ok, err = pcall(layout, setmetatable({ %s }, { __index = function(_, k)\n"
        "    if k == \"%s\" then error({ code = i }) end\n"
        "  end }))\n"
        "  assert(not ok and type(err) == \"table\" and err.code == i, \"the error changed on its way\")\n"
        "end\n"
        "local ok = pcall(layout, setmetatable({ %s }, { __index = function(_, k)\n"
        "  if k == \"hidden\" then layout { %s } error(\"late\") end\n"
        "end }))\n"
        "assert(not ok)\n"
        "layout { %s }\n",
        padding(), failing, fields(&bad), field, fields_except(&bad, "hidden"), fields(&inner), fields(&good));
    cr_assert(load(path) == 0, "load failed:\n%s", messages());
    cr_assert(spec.count == 2, "%zu variants, expected 2 (%s declared in __index, then %s): the %u failed calls "
              "for %s and the one that failed after it must declare nothing", spec.count, inner.name, good.name,
              failing + 1, bad.name);
    cr_expect(strcmp(spec.variants[0].name, inner.name) == 0 && spec.variants[0].line == pad_lines + 8 &&
              spec.variants[0].hidden == inner.hidden,
              "variant 0: %s line %d hidden %d, expected %s line %d hidden %d", spec.variants[0].name,
              spec.variants[0].line, spec.variants[0].hidden, inner.name, pad_lines + 8, inner.hidden);
    cr_expect(strcmp(spec.variants[1].name, good.name) == 0 && spec.variants[1].line == pad_lines + 11 &&
              spec.variants[1].max_tokens == good.max_tokens,
              "variant 1: %s line %d, expected %s line %d", spec.variants[1].name, spec.variants[1].line,
              good.name, pad_lines + 11);
}

/* ---------------------------------------------------------------------- */
/* Overrides */

Test(spec, overrides_replace_every_variants_value)
{
    shape a = random_shape(), b = random_shape();
    int hidden = 128 * (int)rnd(1, 64);
    char hidden_text[16];
    snprintf(hidden_text, sizeof hidden_text, "%d", hidden);
    const char *path = write_file("spec.lua", "layout { %s, dtype = \"fp32\" }\nlayout { %s, weights = true }\n",
                                  fields(&a), fields(&b));
    sg_override ov[] = {
        { "hidden", hidden_text }, { "weights", "false" }, { "dtype", "fp16" }, { "capacity", "1" },
    };
    cr_assert(load_with(path, ov, 4) == 0, "load failed:\n%s", messages());
    for (size_t i = 0; i < spec.count; i++) {
        const sg_variant *v = &spec.variants[i];
        cr_expect(v->hidden == hidden && !v->weights && v->dtype == SYMM_DTYPE_FP16 &&
                  v->combine_dtype == SYMM_DTYPE_FP16 && v->capacity == 1 && v->capacity_set,
                  "variant %zu: hidden %d weights %d dtype %s capacity %lld", i, v->hidden, v->weights,
                  sg_dtype_name(v->dtype), (long long)v->capacity);
    }
    cr_expect(strcmp(spec.variants[0].name, a.name) == 0 && strcmp(spec.variants[1].name, b.name) == 0);
}

Test(spec, bad_overrides_are_named)
{
    shape a = random_shape();
    int bad_hidden = 8 * (int)rnd(1, 100) + (int)rnd(1, 7);
    char hidden_text[16];
    snprintf(hidden_text, sizeof hidden_text, "%d", bad_hidden);
    const char *path = write_file("spec.lua", "%slayout { %s }\n", padding(), fields(&a));
    sg_override ov[] = {
        { "hiden", "7" }, { "name", "x" }, { "hidden", hidden_text }, { "topk", "abc" }, { "frob", "1" },
    };
    cr_assert(load_with(path, ov, 5) == -1);
    expect_message("-D hiden=7: unknown field, did you mean \"hidden\"?");
    expect_message("-D name=x: name cannot be overridden (each variant needs its own)");
    expect_message("-D frob=1: unknown field, expected one of name, hidden, topk, experts, world, max_tokens, "
                   "dtype, combine_dtype, layout, weights, capacity, align, sms, combine, combine_order, hosts");
    expect_message("%s:%d: variant %s: field hidden: got %d, expected a multiple of 8 for bf16 " ROWS_WHY
                   " (from -D hidden=%d) (with -D topk=abc in effect)", path, pad_lines + 1, a.name, bad_hidden,
                   bad_hidden);
    expect_message("-D topk=abc: got \"abc\", expected an integer 1..16");
    expect_count(5);
}

/* -D combine=pull, push or auto sets every variant's combine, whatever its
 * spec wrote (auto: every variant of layout rank; a layout expert variant
 * is refused, naming the -D); a value other than those is refused once,
 * naming the -D and the three values. */
Test(spec, combine_override_sets_every_variant)
{
    shape a = random_shape(), b = random_shape(), c = random_shape(), d = random_shape();
    a.max_tokens = (int)rnd(1, SG_AUTO_MIN_TOKENS - 1);
    set_world(&a, (int)rnd(2, SG_AUTO_MIN_WORLD - 1));
    const char *path = write_file("spec.lua", "%slayout { %s }\nlayout { %s, combine = \"pull\" }\n"
                                  "layout { %s, combine = \"push\", layout = \"expert\" }\n"
                                  "layout { %s, combine = \"auto\" }\n",
                                  padding(), fields(&a), fields(&b), fields(&c), fields(&d));
    cr_assert(load(path) == 0, "load failed:\n%s", messages());
    cr_assert(spec.count == 4);
    const symm_combine_mode written[] = { SYMM_COMBINE_PUSH, SYMM_COMBINE_PULL, SYMM_COMBINE_PUSH, SYMM_COMBINE_AUTO };
    for (size_t i = 0; i < spec.count; i++)
        cr_expect(spec.variants[i].combine == written[i], "as written: variant %zu: combine %s, expected %s", i,
                  sg_combine_name(spec.variants[i].combine), sg_combine_name(written[i]));
    static const char *const values[] = { "push", "pull" };
    for (int k = 0; k < 2; k++) {
        sg_override ov[] = { { "combine", values[k] } };
        cr_assert(load_with(path, ov, 1) == 0, "-D combine=%s:\n%s", values[k], messages());
        cr_assert(spec.count == 4);
        for (size_t i = 0; i < spec.count; i++)
            cr_expect(spec.variants[i].combine == (symm_combine_mode)k, "-D combine=%s: variant %zu: combine %s",
                      values[k], i, sg_combine_name(spec.variants[i].combine));
    }
    sg_override to_auto[] = { { "combine", "auto" } };
    cr_assert(load_with(path, to_auto, 1) == -1, "-D combine=auto was accepted for a layout expert variant");
    expect_message("%s:%d: variant %s: field combine: got \"auto\", expected \"push\" or \"pull\" with layout "
                   "\"expert\" (\"auto\", both forms chosen per call by where y lies, is for layout \"rank\": "
                   "layout expert's pushing combine is the faster at every size measured, docs/spec.md) "
                   "(from -D combine=auto)", path, pad_lines + 3, c.name);
    expect_count(1);
    static const struct { const char *value, *shown; } bad[] = {
        { "pul", "\"pul\"" }, { "PULL", "\"PULL\"" }, { "1", "1" }, { "true", "true" }, { "Auto", "\"Auto\"" },
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        sg_override ov[] = { { "combine", bad[k].value } };
        cr_assert(load_with(path, ov, 1) == -1, "-D combine=%s was accepted", bad[k].value);
        expect_message("-D combine=%s: got %s, expected \"push\", \"pull\" or \"auto\"", bad[k].value,
                       bad[k].shown);
        expect_count(1);
    }
}

/* A spec's bad combine names the field, the value and the three values. */
Test(spec, unknown_combine_lists_push_pull_and_auto)
{
    shape a = random_shape();
    const char *path = write_file("spec.lua", "%slayout { %s, combine = \"pulll\" }\n", padding(), fields(&a));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field combine: got \"pulll\", expected \"push\", \"pull\" or \"auto\"",
                   path, pad_lines + 1, a.name);
    expect_count(1);
}

/* combine = "auto" (both forms, chosen per call by where y lies) is for
 * layout rank: with layout expert it is refused, saying why. */
Test(spec, combine_auto_is_for_layout_rank_only)
{
    shape a = random_shape(), b = random_shape();
    const char *path = write_file("spec.lua", "layout { %s, combine = \"auto\" }\n"
                                  "layout { %s, layout = \"expert\", combine = \"auto\" }\n",
                                  fields(&a), fields(&b));
    cr_assert(load(path) == -1);
    expect_message("%s:2: variant %s: field combine: got \"auto\", expected \"push\" or \"pull\" with layout "
                   "\"expert\" (\"auto\", both forms chosen per call by where y lies, is for layout \"rank\": "
                   "layout expert's pushing combine is the faster at every size measured, docs/spec.md)",
                   path, b.name);
    expect_count(1);
}

/* The default of combine follows layout, max_tokens and world: "auto" for
 * layout rank from SG_AUTO_MIN_TOKENS (1024) tokens a rank up or from world
 * SG_AUTO_MIN_WORLD (4) up, "push" below both and for layout expert at any
 * size; -D max_tokens moves a variant across. */
Test(spec, combine_defaults_to_auto_for_prefill_sized_or_wide_layout_rank)
{
    enum { N = 8 };
    shape s[N];
    for (int i = 0; i < N; i++)
        s[i] = random_shape();
    const int tokens[N] = { SG_AUTO_MIN_TOKENS - 1, SG_AUTO_MIN_TOKENS, (int)rnd(SG_AUTO_MIN_TOKENS + 1, 8192),
                            (int)rnd(1, SG_AUTO_MIN_TOKENS - 1), (int)rnd(SG_AUTO_MIN_TOKENS, 8192),
                            (int)rnd(1, SG_AUTO_MIN_TOKENS - 1), (int)rnd(1, SG_AUTO_MIN_TOKENS - 1),
                            (int)rnd(1, SG_AUTO_MIN_TOKENS - 1) };
    /* Variants 0-4 below world SG_AUTO_MIN_WORLD; 5 (rank) and 6 (expert)
     * at it or above; 7 (rank) just below it. */
    const int worlds[N] = { 2, 3, 2, 3, 2, (int)rnd(SG_AUTO_MIN_WORLD, 16), (int)rnd(SG_AUTO_MIN_WORLD, 16),
                            SG_AUTO_MIN_WORLD - 1 };
    for (int i = 0; i < N; i++) {
        s[i].max_tokens = tokens[i];
        set_world(&s[i], worlds[i]);
    }
    const bool expert[N] = { false, false, false, true, true, false, true, false };
    char text[8192] = "";
    for (int i = 0; i < N; i++) {
        char line[1024];
        snprintf(line, sizeof line, "layout { %s%s }\n", fields(&s[i]), expert[i] ? ", layout = \"expert\"" : "");
        strcat(text, line);
    }
    const char *path = write_file("spec.lua", "%s", text);
    cr_assert(load(path) == 0, "%s", messages());
    const symm_combine_mode want[N] = { SYMM_COMBINE_PUSH, SYMM_COMBINE_AUTO, SYMM_COMBINE_AUTO, SYMM_COMBINE_PUSH,
                                        SYMM_COMBINE_PUSH, SYMM_COMBINE_AUTO, SYMM_COMBINE_PUSH, SYMM_COMBINE_PUSH };
    for (int i = 0; i < N; i++)
        cr_expect(spec.variants[i].combine == want[i],
                  "variant %d (max_tokens %d, world %d, layout %s): combine %s, expected %s", i, tokens[i], worlds[i],
                  sg_layout_name(spec.variants[i].layout), sg_combine_name(spec.variants[i].combine),
                  sg_combine_name(want[i]));
    /* -D max_tokens applies before the default is taken: layout rank is
     * "auto" at 4096 tokens whatever its world, and at 128 only from world
     * SG_AUTO_MIN_WORLD. */
    sg_override up[] = { { "max_tokens", "4096" } }, down[] = { { "max_tokens", "128" } };
    cr_assert(load_with(path, up, 1) == 0, "%s", messages());
    for (int i = 0; i < N; i++)
        cr_expect(spec.variants[i].combine == (expert[i] ? SYMM_COMBINE_PUSH : SYMM_COMBINE_AUTO),
                  "-D max_tokens=4096: variant %d: combine %s", i, sg_combine_name(spec.variants[i].combine));
    cr_assert(load_with(path, down, 1) == 0, "%s", messages());
    for (int i = 0; i < N; i++)
        cr_expect(spec.variants[i].combine ==
                      (!expert[i] && worlds[i] >= SG_AUTO_MIN_WORLD ? SYMM_COMBINE_AUTO : SYMM_COMBINE_PUSH),
                  "-D max_tokens=128: variant %d: combine %s", i, sg_combine_name(spec.variants[i].combine));
}

/* -D takes numbers as a spec writes them: 7168.0 and 0x8 are integers. */
Test(spec, overrides_read_numbers_as_a_spec_writes_them)
{
    shape a = random_shape();
    const char *path = write_file("spec.lua", "layout { %s }\n", fields(&a));
    char hidden[32], topk[32];
    snprintf(hidden, sizeof hidden, "%d.0", a.hidden);
    snprintf(topk, sizeof topk, "0x%x", a.topk);
    sg_override ov[] = { { "hidden", hidden }, { "topk", topk } };
    cr_assert(load_with(path, ov, 2) == 0, "-D hidden=%s -D topk=%s:\n%s", hidden, topk, messages());
    cr_assert(spec.variants[0].hidden == a.hidden && spec.variants[0].topk == a.topk, "hidden %d topk %d",
              spec.variants[0].hidden, spec.variants[0].topk);
    snprintf(hidden, sizeof hidden, "%d.5", a.hidden);
    sg_override half[] = { { "hidden", hidden } };
    cr_assert(load_with(path, half, 1) == -1);
    expect_message("-D hidden=%s: got %s, expected an integer > 0", hidden, hidden);
    expect_count(1);
}

/* A -D value that is wrong whatever the variant (its type, range or
 * choices) is reported once, naming the -D, however many variants the spec
 * declares; sg_overrides_check reports the same without a spec. */
Test(spec, bad_override_value_is_reported_once_not_per_variant)
{
    unsigned n = rnd(2, 12);
    char text[16384] = "";
    strcat(text, padding());
    for (unsigned i = 0; i < n; i++) {
        shape s = random_shape();
        char line[800];
        snprintf(line, sizeof line, "layout { %s }\n", fields(&s));
        strcat(text, line);
    }
    const char *path = write_file("spec.lua", "%s", text);
    static const struct { sg_override ov; const char *msg; } bad[] = {
        { { "topk", "17" }, "-D topk=17: got 17, expected 1..16" },
        { { "world", "two" }, "-D world=two: got \"two\", expected an integer 2..128" },
        { { "dtype", "bf8" }, "-D dtype=bf8: got \"bf8\", expected \"bf16\", \"fp16\", \"fp32\" or \"fp8_e4m3\"" },
        { { "weights", "yes" }, "-D weights=yes: got \"yes\", expected true or false" },
        { { "combine_dtype", "fp8_e4m3" }, "-D combine_dtype=fp8_e4m3: got \"fp8_e4m3\", expected \"bf16\", "
                                           "\"fp16\" or \"fp32\" (fp8 is a dispatch dtype only: combine "
                                           "accumulates in fp32 and returns 16 or 32 bits)" },
        { { "align", "0.5" }, "-D align=0.5: got 0.5, expected an integer 1..4096" },
    };
    const size_t nb = sizeof bad / sizeof bad[0];
    sg_override ov[sizeof bad / sizeof bad[0]];
    for (size_t i = 0; i < nb; i++)
        ov[i] = bad[i].ov;
    cr_assert(load_with(path, ov, nb) == -1);
    for (size_t i = 0; i < nb; i++)
        expect_message("%s", bad[i].msg);
    expect_count(nb);

    sg_diag_free(&diag);
    cr_assert_eq(sg_overrides_check(ov, nb, &diag), (int)nb, "%s", messages());
    for (size_t i = 0; i < nb; i++)
        expect_message("%s", bad[i].msg);
    expect_count(nb);
    sg_diag_free(&diag);
    sg_override good[] = { { "topk", "2" }, { "dtype", "fp16" }, { "capacity", "64" } };
    cr_assert_eq(sg_overrides_check(good, 3, &diag), 0, "%s", messages());
    expect_count(0);
}

/* An integer past 64 bits (in -D or in a spec) is said to be out of range,
 * shown in full. */
Test(spec, integer_beyond_64_bits_is_out_of_range)
{
    shape a = random_shape();
    const char *path = write_file("spec.lua", "%slayout { %s, capacity = 2^63 }\n", padding(), fields(&a));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field capacity: got 9223372036854775808, which is out of range, expected an "
                   "integer > 0", path, pad_lines + 1, a.name);
    expect_count(1);
    path = write_file("ok.lua", "layout { %s }\n", fields(&a));
    sg_override ov[] = { { "capacity", "9223372036854775808" }, { "topk", "-1e19" } };
    cr_assert(load_with(path, ov, 2) == -1);
    expect_message("-D capacity=9223372036854775808: got 9223372036854775808, which is out of range, expected an "
                   "integer > 0");
    expect_message("-D topk=-1e19: got -10000000000000000000, which is out of range, expected an integer 1..16");
    expect_count(2);
}

/* What a -D echoes is what was typed, with control bytes and bytes that
 * are not UTF-8 escaped: a value cannot drive the terminal. */
Test(spec, override_echo_escapes_control_bytes)
{
    shape a = random_shape();
    const char *path = write_file("spec.lua", "layout { %s }\n", fields(&a));
    sg_override ov[] = { { "layout", "rank\x1b[2J\r\xff\xc3\xa9" }, { "hid\x07" "den", "1" } };
    cr_assert(load_with(path, ov, 2) == -1);
    expect_message("-D layout=rank\\x1b[2J\\x0d\\xff\xc3\xa9: got \"rank\\x1b[2J\\x0d\\xff\\xc3\\xa9\", expected "
                   "\"rank\" or \"expert\"");
    expect_message("-D hid\\x07den=1: unknown field, did you mean \"hidden\"?");
    expect_count(2);
    for (size_t i = 0; i < diag.count; i++)
        for (const char *p = diag.messages[i]; *p; p++)
            cr_expect((unsigned char)*p >= 0x20 && *p != 0x7f, "control byte 0x%02x in: %s", (unsigned char)*p,
                      diag.messages[i]);
}

/* A field's string value with a NUL inside comes back from the spec's
 * process whole: the message shows every byte kept, the same on every run. */
Test(spec, string_value_with_a_nul_is_shown_whole)
{
    shape a = random_shape();
    unsigned tail = rnd(100, 999);
    const char *path = write_file("spec.lua", "%slayout { %s, dtype = \"a\\0b%u\" }\n", padding(),
                                  fields(&a), tail);
    for (int run = 0; run < 3; run++) {
        cr_assert(load(path) == -1);
        expect_message("%s:%d: variant %s: field dtype: got \"a\\x00b%u\", expected \"bf16\", \"fp16\", \"fp32\" "
                       "or \"fp8_e4m3\"", path, pad_lines + 1, a.name, tail);
        expect_count(1);
    }
}

/* error("a\0b"): the whole message, its NUL escaped. */
Test(spec, error_message_with_a_nul_is_not_cut)
{
    unsigned tail = rnd(1, 1u << 30);
    const char *path = write_file("spec.lua", "%serror(\"before\\0after %u\")\n", padding(), tail);
    cr_assert(load(path) == -1);
    expect_message("%s:%d: before\\x00after %u", path, pad_lines + 1, tail);
    const char *path2 = write_file("level0.lua", "%serror(\"x\\0y\", 0)\n", padding());
    cr_assert(load(path2) == -1);
    expect_message("%s:%d: x\\x00y", path2, pad_lines + 1);
    expect_count(1);
}

/* A spec path that is not printable UTF-8 would go raw into manifest.json
 * (which strict JSON readers then refuse) and into messages. */
Test(spec, spec_path_that_is_not_printable_utf8_is_refused)
{
    static const char *const names[] = { "bad\xff.lua", "bad\xc0\xaf.lua", "esc\x1b.lua", "nl\n.lua" };
    static const char *const shown[] = { "bad\\xff.lua", "bad\\xc0\\xaf.lua", "esc\\x1b.lua", "nl\\x0a.lua" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        shape a = random_shape();
        const char *path = write_file(names[i], "layout { %s }\n", fields(&a));
        cr_assert(load(path) == -1, "%s was loaded", shown[i]);
        expect_message("%s/%s: expected a spec path of printable UTF-8 (it is written into manifest.json and the "
                       "generated files): rename the file", dir, shown[i]);
        expect_count(1);
    }
    shape a = random_shape();
    const char *path = write_file("caf\xc3\xa9.lua", "layout { %s }\n", fields(&a));
    cr_assert(load(path) == 0, "a UTF-8 name must load:\n%s", messages());
}

/* A UTF-8 byte order mark at the start of a spec is skipped, as Lua's own
 * loader does; line numbers stay those of the file. */
Test(spec, byte_order_mark_is_skipped)
{
    shape a = random_shape(), b = random_shape();
    snprintf(b.name, sizeof b.name, "%.60s_b", a.name);
    char first[512];
    snprintf(first, sizeof first, "%s", fields(&a));
    const char *path = write_file("spec.lua", "\xEF\xBB\xBFlayout { %s }\nlayout { %s, topk = \"x\" }\n", first,
                                  fields_except(&b, "topk"));
    cr_assert(load(path) == -1);
    expect_message("%s:2: variant %s: field topk: got \"x\", expected an integer 1..16", path, b.name);
    expect_count(1);
}

/* A field the spec wrote, refused because of another field's -D, says which
 * -D was in effect (the spec's line shows other values). */
Test(spec, error_from_another_fields_override_names_it)
{
    const int world = 2 + (int)rnd(0, 2), tokens = 64 << rnd(0, 3);
    const int capacity = world * tokens; /* the worst case as written */
    const char *path = write_file("spec.lua",
                                  "%slayout { name = \"c\", hidden = 1024, topk = 2, experts = %d, world = %d,\n"
                                  "         max_tokens = %d, capacity = %d }\n",
                                  padding(), 4 * world, world, tokens, capacity);
    cr_assert(load(path) == 0, "as written it loads:\n%s", messages());
    char smaller[16];
    snprintf(smaller, sizeof smaller, "%d", tokens / 2);
    sg_override ov[] = { { "max_tokens", smaller } };
    cr_assert(load_with(path, ov, 1) == -1);
    expect_message("%s:%d: variant c: field capacity: got %d, expected 1..%d (the worst case, world * max_tokens) "
                   "(with -D max_tokens=%s in effect)", path, pad_lines + 1, capacity, world * (tokens / 2), smaller);
    expect_count(1);
}

/* ---------------------------------------------------------------------- */
/* The specs in specs/ */

static int count_if(bool (*pred)(const sg_variant *, int), int arg)
{
    int n = 0;
    for (size_t i = 0; i < spec.count; i++)
        n += pred(&spec.variants[i], arg);
    return n;
}

static bool has_dtype(const sg_variant *v, int d) { return v->dtype == (symm_dtype)d; }
static bool has_combine(const sg_variant *v, int d) { return v->combine_dtype == (symm_dtype)d; }
static bool has_layout(const sg_variant *v, int l) { return v->layout == (symm_layout)l; }
static bool has_weights(const sg_variant *v, int w) { return v->weights == (bool)w; }
static bool has_world(const sg_variant *v, int w) { return v->world == w; }
static bool capped_in_world(const sg_variant *v, int w) { return v->world == w && v->capacity_set; }
static bool aligned(const sg_variant *v, int a) { return v->layout == SYMM_LAYOUT_EXPERT && v->align >= a; }
static bool few_sms_in_world(const sg_variant *v, int w) { return v->world == w && v->sms <= 4; }
static bool pulls_in_world(const sg_variant *v, int w) { return v->world == w && v->combine == SYMM_COMBINE_PULL; }
static bool auto_in_world(const sg_variant *v, int w)
{
    return v->world == w && v->combine == SYMM_COMBINE_AUTO && !v->capacity_set && !v->companion_hosts;
}
static bool pulls_rank_in_world(const sg_variant *v, int w)
{
    return pulls_in_world(v, w) && v->layout == SYMM_LAYOUT_RANK;
}
static bool pulls_expert_in_world(const sg_variant *v, int w)
{
    return pulls_in_world(v, w) && v->layout == SYMM_LAYOUT_EXPERT;
}

Test(spec, default_spec_covers_the_matrix)
{
    cr_assert(load("specs/default.lua") == 0, "specs/default.lua:\n%s", messages());
    /* The companions (field hosts) come on top: a few, one of them of one
     * rank and one of layout expert. */
    size_t companions = 0, of_one_rank = 0, of_expert = 0;
    for (size_t i = 0; i < spec.count; i++) {
        const sg_variant *v = &spec.variants[i];
        companions += v->companion_hosts > 0;
        of_one_rank += v->companion_hosts > 0 && v->world == 1;
        of_expert += v->companion_hosts > 0 && v->layout == SYMM_LAYOUT_EXPERT;
    }
    cr_expect(companions >= 2 && companions <= 6 && of_one_rank >= 1 && of_expert >= 1,
              "%zu companions (%zu of one rank, %zu of layout expert), expected 2..6 with one of each", companions,
              of_one_rank, of_expert);
    cr_expect(spec.count - companions >= 12 && spec.count - companions <= 30, "%zu variants, expected 12..30",
              spec.count - companions);
    for (int d = SYMM_DTYPE_BF16; d <= SYMM_DTYPE_FP8_E4M3; d++)
        cr_expect(count_if(has_dtype, d) > 0, "no %s variant", sg_dtype_name((symm_dtype)d));
    cr_expect(count_if(has_combine, SYMM_DTYPE_FP32) > 0 && count_if(has_combine, SYMM_DTYPE_FP16) > 0,
              "combine dtypes fp16 and fp32 should appear");
    cr_expect(count_if(has_layout, SYMM_LAYOUT_RANK) > 0 && count_if(has_layout, SYMM_LAYOUT_EXPERT) > 0);
    cr_expect(count_if(has_weights, 1) > 0 && count_if(has_weights, 0) > 0);
    cr_expect(count_if(has_world, 2) > 0 && count_if(has_world, 4) > 0);
    cr_expect(count_if(capped_in_world, 2) > 0 && count_if(capped_in_world, 4) > 0,
              "each world needs a variant with capacity below the worst case");
    cr_expect(count_if(aligned, 64) > 0, "an expert variant with align >= 64");
    cr_expect(count_if(few_sms_in_world, 2) > 0 && count_if(few_sms_in_world, 4) > 0,
              "each world needs a variant on at most 4 SMs (combine's grouped units at a few hundred tokens)");
    for (int w = 2; w <= 4; w += 2)
        cr_expect(count_if(pulls_rank_in_world, w) > 0 && count_if(pulls_expert_in_world, w) > 0,
                  "world %d needs a variant with combine = \"pull\" in each layout (rank %d, expert %d)", w,
                  count_if(pulls_rank_in_world, w), count_if(pulls_expert_in_world, w));
    for (int w = 2; w <= 4; w += 2)
        cr_expect(count_if(auto_in_world, w) > 0, "world %d needs a variant with combine = \"auto\" at full "
                  "capacity (tests/gpu/test_variant.c picks it)", w);
    for (size_t i = 0; i < spec.count; i++) {
        const sg_variant *v = &spec.variants[i];
        if (v->companion_hosts) /* its parent's shape on one host (spec.c) */
            continue;
        cr_expect(v->hidden >= 1024 && v->hidden <= 7168 && v->max_tokens >= 128 && v->max_tokens <= 512 &&
                  v->experts >= 8 && v->experts <= 64 && v->topk <= 8,
                  "%s: sizes should stay modest", v->name);
        cr_expect(!v->capacity_set || v->capacity < sg_worst_capacity(v), "%s: capacity", v->name);
    }
}

Test(spec, models_spec_loads)
{
    cr_assert(load("specs/models.lua") == 0, "specs/models.lua:\n%s", messages());
    cr_expect(spec.count > 0 && spec.count <= 40, "%zu variants, expected 1..40", spec.count);
    cr_expect(count_if(has_dtype, SYMM_DTYPE_FP8_E4M3) > 0 && count_if(aligned, 128) > 0);
    bool dsv3 = false;
    for (size_t i = 0; i < spec.count; i++)
        dsv3 = dsv3 || (spec.variants[i].hidden == 7168 && spec.variants[i].experts == 256 &&
                        spec.variants[i].topk == 8);
    cr_expect(dsv3, "DeepSeek-V3's shape is missing");
}

Test(spec, tutorial_loads_and_its_example_error_is_true)
{
    cr_assert(load("specs/tutorial.lua") == 0, "specs/tutorial.lua:\n%s", messages());
    cr_expect(spec.count > 0);

    /* The tutorial quotes the error for hidden = "4096" in its first variant. */
    FILE *f = fopen("specs/tutorial.lua", "r");
    cr_assert(f != NULL);
    char text[65536];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *quoted = strstr(text, "--   specs/tutorial.lua:");
    cr_assert(quoted != NULL, "the tutorial should quote an error message");
    char want[512];
    cr_assert(sscanf(quoted + strlen("--   specs/tutorial.lua"), "%511[^\n]", want) == 1);
    char *first = strstr(text, "hidden = 4096,");
    cr_assert(first != NULL);
    memmove(first + strlen("hidden = \"4096\","), first + strlen("hidden = 4096,"),
            strlen(first + strlen("hidden = 4096,")) + 1);
    memcpy(first, "hidden = \"4096\",", strlen("hidden = \"4096\","));
    const char *path = write_file("tutorial.lua", "%s", text);
    cr_assert(load(path) == -1);
    cr_assert(diag.count >= 1);
    cr_expect(strncmp(diag.messages[0], path, strlen(path)) == 0 &&
              strcmp(diag.messages[0] + strlen(path), want) == 0,
              "the tutorial says\n  ...%s\nbut symmgen says\n  %s", want, diag.messages[0]);
}

Test(spec, names_of_dtypes_and_layouts)
{
    cr_expect(strcmp(sg_dtype_name(SYMM_DTYPE_BF16), "bf16") == 0 && strcmp(sg_dtype_name(SYMM_DTYPE_FP16), "fp16") == 0 &&
              strcmp(sg_dtype_name(SYMM_DTYPE_FP32), "fp32") == 0 &&
              strcmp(sg_dtype_name(SYMM_DTYPE_FP8_E4M3), "fp8_e4m3") == 0);
    cr_expect(strcmp(sg_layout_name(SYMM_LAYOUT_RANK), "rank") == 0 &&
              strcmp(sg_layout_name(SYMM_LAYOUT_EXPERT), "expert") == 0);
    cr_expect(strcmp(sg_dtype_name((symm_dtype)(4 + rnd(0, 100))), "unknown") == 0);
}

Test(diag, keeps_every_message_in_order, .init = seed)
{
    sg_diag d = { 0 };
    unsigned n = rnd(1, 200), base = rnd(0, 100000);
    for (unsigned i = 0; i < n; i++)
        sg_diag_add(&d, "message %u of %s", base + i, "many");
    cr_assert(d.count == n, "count %zu, expected %u", d.count, n);
    for (unsigned i = 0; i < n; i++) {
        char want[64];
        snprintf(want, sizeof want, "message %u of many", base + i);
        cr_expect(strcmp(d.messages[i], want) == 0, "[%u] %s", i, d.messages[i]);
    }
    sg_diag_free(&d);
    cr_expect(d.count == 0 && d.messages == NULL);
}

/* Names differing only in case would share include guards and macros
 * (NAME_UPPER) and files on case-insensitive file systems. */
Test(spec, names_differing_only_in_case_are_duplicates)
{
    shape a = random_shape(), b = random_shape();
    strcpy(b.name, a.name);
    for (char *p = b.name; *p; p++)
        *p = (char)toupper((unsigned char)*p);
    const char *path = write_file("spec.lua", "%slayout { %s }\nlayout { %s }\n", padding(), fields(&a), fields(&b));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field name: got \"%s\", expected a name not used before, ignoring case (line %d has it)",
                   path, pad_lines + 2, b.name, b.name, pad_lines + 1);
    expect_count(1);
}

/* The runtime's prefix: "symm_variant" would make symm_variant.h include
 * itself and define functions the runtime defines. */
Test(spec, names_with_the_runtime_prefix_are_refused)
{
    shape a = random_shape();
    char name[sizeof a.name + 8];
    snprintf(name, sizeof name, "%s_%s", rnd(0, 1) ? "symm" : "SYMM", a.name);
    cr_assert(strlen(name) < sizeof a.name, "random name too long: %s", name);
    strcpy(a.name, name);
    const char *path = write_file("spec.lua", "%slayout { %s }\n", padding(), fields(&a));
    cr_assert(load(path) == -1);
    expect_message("%s:%d: variant %s: field name: got \"%s\", expected a name that does not start with symm_ "
                   "(the runtime's prefix)", path, pad_lines + 1, name, name);
    expect_count(1);
}

/* A name that the generated header's includes declare would be declared
 * again by it (typedef struct NAME NAME): the C would not compile. */
Test(spec, names_the_generated_headers_declare_are_refused)
{
    const char *t_rule = "a name that does not end in _t (reserved for types: the generated header includes "
                         "<stdint.h> and <stddef.h>, which declare int32_t, size_t and more)";
    const char *cu_rule = "a name that does not start with cu or CU (reserved for cuda.h, which the generated "
                          "header includes: CUstream, cuInit and more)";
    const char *std_rule = "a name that <stddef.h> and <stdint.h> do not define (the generated header includes "
                           "them and declares the variant's name as a type)";
    const char *stdlib_rule = "a name that <stdlib.h> does not declare (the generated header includes it, "
                              "through cuda.h, and declares the variant's name as a type)";
    const char *under_rule = "a name that does not start with _ (reserved at file scope for the compiler and "
                             "the C library: __int128, _Float16 and more)";
    char own_t[32], own_cu[32], own_CU[32], own_under[32], own_max[32];
    snprintf(own_t, sizeof own_t, "v%u_t", rnd(0, 99999));
    snprintf(own_cu, sizeof own_cu, "cu%u", rnd(0, 99999));
    snprintf(own_CU, sizeof own_CU, "CU_v%u", rnd(0, 99999));
    snprintf(own_under, sizeof own_under, "_v%u", rnd(0, 99999));
    snprintf(own_max, sizeof own_max, "UINT%u_MAX", rnd(0, 99999));
    const struct { const char *name, *expected; } cases[] = {
        { "int32_t", t_rule }, { "size_t", t_rule }, { "uint16_t", t_rule }, { own_t, t_rule },
        { "CUstream", cu_rule }, { "cuInit", cu_rule }, { own_cu, cu_rule }, { own_CU, cu_rule },
        { "NULL", std_rule }, { "INT8_MAX", std_rule }, { "UINTMAX_C", std_rule }, { own_max, std_rule },
        { "free", stdlib_rule }, { "malloc", stdlib_rule }, { "timespec", stdlib_rule },
        { "__int128", under_rule }, { own_under, under_rule },
    };
    const int n = sizeof cases / sizeof cases[0];
    int first = (int)rnd(0, n - 1); /* the cases in a random rotation */
    sg_buf text = { 0 };
    sg_buf_puts(&text, padding());
    for (int i = 0; i < n; i++) {
        shape sh = random_shape();
        sg_buf_printf(&text, "layout { %s, name = \"%s\" }\n", fields_except(&sh, "name"),
                      cases[(first + i) % n].name);
    }
    const char *path = write_file("spec.lua", "%s", text.data);
    cr_assert(load(path) == -1, "a spec of names the headers declare loaded");
    for (int i = 0; i < n; i++) {
        const char *name = cases[(first + i) % n].name;
        expect_message("%s:%d: variant %s: field name: got \"%s\", expected %s", path, pad_lines + 1 + i, name,
                       name, cases[(first + i) % n].expected);
    }
    expect_count(n);
    sg_buf_free(&text);
}

/* snprintf into a shape's name, failing the test rather than truncating. */
#define SET_NAME(name, ...) cr_assert(snprintf(name, sizeof name, __VA_ARGS__) < (int)sizeof name, "name too long")

/* Another variant's header declares P_create, ..., P_HIDDEN, ... and
 * P_LOCAL_EXPERTS: a file including both headers would not compile. */
Test(spec, names_another_variants_header_declares_are_refused)
{
    static const char *const functions[] = { "desc", "create", "destroy", "dispatch", "combine", "recv", "stats",
                                             "describe", "profile" };
    const unsigned n_functions = sizeof functions / sizeof functions[0];
    /* LOCAL_EXPERTS stands for itself below (base_local's EXPERTS too). */
    static const char *const macros[] = { "HIDDEN", "TOPK", "EXPERTS", "WORLD", "MAX_TOKENS", "CAPACITY",
                                          "WEIGHTS" };
    shape base = random_shape(), clash[3];
    char upper[80], want[3][128];
    snprintf(upper, sizeof upper, "%s", base.name);
    for (char *p = upper; *p; p++)
        *p = (char)toupper((unsigned char)*p);
    clash[0] = random_shape();
    unsigned f = rnd(0, n_functions - 1);
    SET_NAME(clash[0].name, "%s_%s", base.name, functions[f]);
    snprintf(want[0], sizeof want[0], "%s", clash[0].name);
    clash[1] = random_shape();
    SET_NAME(clash[1].name, "%s_%s", upper, macros[rnd(0, 6)]);
    snprintf(want[1], sizeof want[1], "%s", clash[1].name);
    clash[2] = random_shape();
    SET_NAME(clash[2].name, "%s_%s", base.name, rnd(0, 1) ? "local" : "LOCAL");
    snprintf(want[2], sizeof want[2], "%s_LOCAL_EXPERTS, as this one would", upper);
    /* Near misses that declare nothing of base's: accepted. */
    shape fine[2] = { random_shape(), random_shape() };
    SET_NAME(fine[0].name, "%s_%s", upper, functions[(f + rnd(1, n_functions - 1)) % n_functions]); /* not clash[0] in capitals */
    SET_NAME(fine[1].name, "%s_%s_x", base.name, functions[rnd(0, n_functions - 1)]);
    const char *path = write_file("spec.lua", "%slayout { %s }\nlayout { %s }\nlayout { %s }\nlayout { %s }\n"
                                  "layout { %s }\nlayout { %s }\n", padding(), fields(&clash[0]), fields(&fine[0]),
                                  fields(&clash[1]), fields(&base), fields(&clash[2]), fields(&fine[1]));
    cr_assert(load(path) == -1);
    const int lines[3] = { 1, 3, 5 };
    for (int i = 0; i < 3; i++)
        expect_message("%s:%d: variant %s: field name: got \"%s\", expected a name that no other variant's "
                       "header declares (the header of variant %s, line %d, declares %s)", path,
                       pad_lines + lines[i], clash[i].name, clash[i].name, base.name, pad_lines + 4, want[i]);
    expect_count(3);
}

/* ---- every identifier the stub's headers declare ---------------------- */

/* Adds the names of the file-scope declarations in a clang AST (JSON):
 * functions, types, tags, variables, enumerators, namespaces, also inside
 * extern "C" { }. */
static void add_declared(const symm_json *decls, sg_buf *names)
{
    static const char *const kinds[] = { "FunctionDecl", "TypedefDecl", "VarDecl", "RecordDecl", "CXXRecordDecl",
                                         "EnumDecl", "NamespaceDecl", "TypeAliasDecl", "FunctionTemplateDecl",
                                         "ClassTemplateDecl", "EnumConstantDecl", "UsingShadowDecl" };
    for (const symm_json *d = decls ? decls->first : NULL; d; d = d->next) {
        const symm_json *kind = symm_json_member(d, "kind", NULL), *name = symm_json_member(d, "name", NULL);
        if (!kind || kind->type != SYMM_JSON_STRING)
            continue;
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
            if (strcmp(kind->str, kinds[k]) == 0 && name && name->type == SYMM_JSON_STRING && name->len > 0)
                sg_buf_printf(names, "%s\n", name->str);
        if (strcmp(kind->str, "LinkageSpecDecl") == 0 || strcmp(kind->str, "EnumDecl") == 0)
            add_declared(symm_json_member(d, "inner", NULL), names);
    }
}

static char *command_output(const char *cmd, size_t *len)
{
    FILE *p = popen(cmd, "r");
    cr_assert(p != NULL, "%s: %s", cmd, strerror(errno));
    sg_buf out = { 0 };
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0)
        sg_buf_append(&out, chunk, n);
    cr_assert(pclose(p) == 0, "%s failed", cmd);
    *len = out.len;
    return out.data;
}

Test(spec, every_name_the_stub_headers_declare_is_refused)
{
    const char *cuda = getenv("CUDA_HOME") && *getenv("CUDA_HOME") ? getenv("CUDA_HOME") : "/usr/local/cuda";
    const char *stub = write_file("stub.h", "#include <stdint.h>\n#include \"symm_variant.h\"\n");
    sg_buf names = { 0 };
    /* What NAME.h's includes declare, in C and in C++ (glibc's most, with
     * _GNU_SOURCE), and the macros they define. */
    const char *const compilers[] = { "clang -x c -std=c11", "clang -x c++ -std=c++17" };
    for (int i = 0; i < 2; i++) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "%s -D_GNU_SOURCE -fsyntax-only -Xclang -ast-dump=json -Iruntime/include "
                 "-I%s/include %s", compilers[i], cuda, stub);
        size_t len;
        char *ast = command_output(cmd, &len);
        symm_json_doc *doc = NULL;
        int line, col;
        char why[256];
        cr_assert(symm_json_parse(ast, len, &doc, &line, &col, why, sizeof why) == SYMM_JSON_OK,
                  "%s: not JSON at %d:%d: %s", cmd, line, col, why);
        add_declared(symm_json_member(symm_json_root(doc), "inner", NULL), &names);
        symm_json_free(doc);
        free(ast);
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "gcc -std=c11 -D_GNU_SOURCE -dM -E -Iruntime/include -I%s/include %s | "
             "sed -n 's/^#define \\([A-Za-z_][A-Za-z0-9_]*\\).*/\\1/p'", cuda, stub);
    size_t len;
    char *macros = command_output(cmd, &len);
    sg_buf_append(&names, macros, len);
    free(macros);

    /* One variant per name, each on its own line. */
    sg_buf text = { 0 };
    int count = 0;
    shape sh = random_shape();
    for (char *name = names.data, *nl; (nl = strchr(name, '\n')); name = nl + 1, count++) {
        *nl = '\0';
        sg_buf_printf(&text, "layout { %s, name = \"%s\" }\n", fields_except(&sh, "name"), name);
    }
    cr_assert(count > 1000, "only %d names from the headers: is clang missing?", count);
    const char *path = write_file("spec.lua", "%s", text.data);
    cr_assert(load(path) == -1, "a spec of %d names the headers declare loaded", count);
    char **by_line = calloc((size_t)count + 2, sizeof *by_line);
    size_t plen = strlen(path);
    for (size_t i = 0; i < diag.count; i++) {
        const char *m = diag.messages[i];
        int line = strncmp(m, path, plen) == 0 && m[plen] == ':' ? atoi(m + plen + 1) : 0;
        if (line >= 1 && line <= count && strstr(m, ": field name: got ") && !by_line[line])
            by_line[line] = diag.messages[i];
    }
    char *name = names.data;
    for (int line = 1; line <= count; line++, name += strlen(name) + 1) {
        const char *m = by_line[line];
        /* Refused for being what it is, not for a clash with another line. */
        cr_expect(m && !strstr(m, "a name not used before") && !strstr(m, "no other variant's header"),
                  "%s, which the generated header's includes declare, is not refused as reserved: %s", name,
                  m ? m : "(accepted)");
    }
    free(by_line);
    sg_buf_free(&text);
    sg_buf_free(&names);
}

/* ---------------------------------------------------------------------- */
/* hosts: the companions of the hybrid backend */

/* Each host count H gives a companion NAME_hH right after its variant:
 * world / H, experts / H, H * max_tokens, the same capacity (whose worst
 * case the companion's equals), everything else equal; listed ascending. */
Test(spec, hosts_add_a_companion_per_host_count_after_the_variant)
{
    shape s = random_shape();
    s.world = 4 * (int)rnd(1, 4);
    s.experts = s.world * (int)rnd(1, 8);
    s.topk = (int)rnd(1, s.experts / 4 < 16 ? (unsigned)s.experts / 4 : 16);
    s.max_tokens = (int)rnd(1, 2048);
    const int expert = (int)rnd(0, 1), align = expert ? (int)rnd(1, 64) : 1;
    shape t = random_shape();
    const char *path = write_file("spec.lua",
        "layout { %s, layout = \"%s\", align = %d, dtype = \"fp8_e4m3\", sms = 7, hosts = { 4, 2 } }\n"
        "layout { %s }\n",
        fields(&s), expert ? "expert" : "rank", align, fields(&t));
    cr_assert(load(path) == 0, "%s", messages());
    cr_assert_eq(spec.count, 4);
    const sg_variant *v = &spec.variants[0];
    cr_assert_eq(v->n_hosts, 2);
    cr_assert(v->hosts[0] == 2 && v->hosts[1] == 4, "hosts %d, %d, expected 2, 4", v->hosts[0], v->hosts[1]);
    cr_assert(v->companions == &spec.variants[1] && v->n_companions == 2);
    cr_assert(v->companion_hosts == 0 && v->companion_of[0] == '\0');
    for (int i = 0; i < 2; i++) {
        const sg_variant *c = &spec.variants[1 + i];
        const int H = 2 << i;
        char name[96];
        snprintf(name, sizeof name, "%s_h%d", s.name, H);
        cr_expect_str_eq(c->name, name);
        cr_expect_str_eq(c->companion_of, s.name);
        cr_expect_eq(c->companion_hosts, H);
        cr_expect_eq(c->world, s.world / H);
        cr_expect_eq(c->experts, s.experts / H);
        cr_expect_eq(c->max_tokens, H * s.max_tokens);
        cr_expect_eq(c->capacity, v->capacity);
        cr_expect_eq(sg_worst_capacity(c), sg_worst_capacity(v));
        cr_expect(c->hidden == v->hidden && c->topk == v->topk && c->dtype == v->dtype &&
                  c->combine_dtype == v->combine_dtype && c->layout == v->layout && c->align == v->align &&
                  c->sms == 7 && c->weights == v->weights && c->n_hosts == 0 && c->n_companions == 0);
        /* The parent's combine, not the default of the companion's own
         * max_tokens (H times the parent's). */
        cr_expect(c->combine == v->combine, "%s: combine %s, its parent's %s", c->name, sg_combine_name(c->combine),
                  sg_combine_name(v->combine));
    }
    cr_expect_str_eq(spec.variants[3].name, t.name);
    cr_expect(spec.variants[3].n_companions == 0 && spec.variants[3].companion_hosts == 0);
}

/* A companion takes its parent's combine: a layout rank parent below
 * max_tokens 1024 and world 4 pushes, and so does its companion of H *
 * max_tokens >= 1024 tokens; a parent of combine = "auto" (written, or by
 * default: from max_tokens 1024 or from world 4) gives companions of
 * "auto", whose hosts then pull or push by where y lies. */
Test(spec, hosts_companions_take_the_parents_combine)
{
    const char *path = write_file("spec.lua",
        "layout { name = \"small\", hidden = 256, topk = 2, experts = 8, world = 2, max_tokens = %d, hosts = { 2 } }\n"
        "layout { name = \"wide\", hidden = 256, topk = 2, experts = 8, world = 4, max_tokens = %d, hosts = { 2, 4 } }\n"
        "layout { name = \"big\", hidden = 256, topk = 2, experts = 8, world = 4, max_tokens = %d, hosts = { 2 } }\n"
        "layout { name = \"set\", hidden = 256, topk = 2, experts = 8, world = 2, max_tokens = %d, combine = \"auto\","
        " hosts = { 2 } }\n",
        (int)rnd(SG_AUTO_MIN_TOKENS / 2, SG_AUTO_MIN_TOKENS - 1), (int)rnd(1, SG_AUTO_MIN_TOKENS / 4 - 1),
        (int)rnd(SG_AUTO_MIN_TOKENS, 8192), (int)rnd(1, 512));
    cr_assert(load(path) == 0, "%s", messages());
    cr_assert_eq(spec.count, 9);
    static const struct {
        const char *name;
        symm_combine_mode combine;
    } want[] = {
        {"small", SYMM_COMBINE_PUSH}, {"small_h2", SYMM_COMBINE_PUSH}, {"wide", SYMM_COMBINE_AUTO},
        {"wide_h2", SYMM_COMBINE_AUTO}, {"wide_h4", SYMM_COMBINE_AUTO}, {"big", SYMM_COMBINE_AUTO},
        {"big_h2", SYMM_COMBINE_AUTO}, {"set", SYMM_COMBINE_AUTO}, {"set_h2", SYMM_COMBINE_AUTO},
    };
    for (size_t i = 0; i < spec.count; i++) {
        cr_expect_str_eq(spec.variants[i].name, want[i].name);
        cr_expect(spec.variants[i].combine == want[i].combine, "%s (max_tokens %d): combine %s, expected %s",
                  spec.variants[i].name, spec.variants[i].max_tokens, sg_combine_name(spec.variants[i].combine),
                  sg_combine_name(want[i].combine));
    }
}

/* World 2 on 2 hosts: a companion of world 1 (two hosts of one GPU). */
Test(spec, hosts_may_give_a_companion_of_one_rank)
{
    const char *path = write_file("spec.lua", "layout { name = \"two\", hidden = 256, topk = 2, experts = 8, "
                                              "world = 2, max_tokens = 64, hosts = { 2 } }\n");
    cr_assert(load(path) == 0, "%s", messages());
    cr_assert_eq(spec.count, 2);
    cr_expect_eq(spec.variants[1].world, 1);
    cr_expect_eq(spec.variants[1].experts, 4);
    cr_expect_eq(spec.variants[1].max_tokens, 128);
    cr_expect_eq(spec.variants[1].capacity, 128);
}

Test(spec, hosts_errors_name_the_field_and_what_was_expected)
{
    static const struct { const char *extra, *lua_value, *expected; } cases[] = {
        { "", "3", "got 3, expected a list of host counts, each an integer 2..world dividing world, e.g. {2, 4}" },
        { "", "\"2\"", "got \"2\", expected a list of host counts, each an integer 2..world dividing world, e.g. {2, 4}" },
        { "", "{ 2, \"x\" }", "got a table, expected a list of host counts, each an integer 2..world dividing world, e.g. {2, 4}" },
        { "", "{ 1 }", "got {1}, expected host counts 2..128 (1 is not; hosts lists the counts of a world of several hosts)" },
        { "", "{ 2, 2 }", "got {2, 2}, expected distinct host counts (2 is listed twice)" },
        { "", "{ 3 }", "got {3}, expected host counts that divide world (4): 3 does not (every host has world / hosts ranks)" },
        { "", "{ 8 }", "got {8}, expected host counts that divide world (4): 8 does not (every host has world / hosts ranks)" },
        { ", layout = \"expert\", combine_order = \"k\"", "{ 2 }",
          "not with combine_order \"k\" (across hosts every (token, expert) row would cross the network back): "
          "use combine_order \"rank\", or the nccl backend without hosts" },
        { ", topk = 3", "{ 4 }", "got {4}, expected host counts H with topk (3) at most experts / H (the companion "
          "of 4 hosts has 2 experts)" },
        { ", max_tokens = 600000", "{ 2 }",
          "got {2}, expected host counts H with H * max_tokens at most 1048576 (the companion of 2 hosts takes "
          "2 * 600000 tokens a call)" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = write_file("spec.lua", "layout { name = \"v\", hidden = 128, topk = 2, experts = 8, "
                                      "world = 4, max_tokens = 16, hosts = %s%s }\n", cases[i].lua_value,
                                      cases[i].extra);
        /* (max_tokens given twice in a Lua table: the later one counts.) */
        cr_assert(load(path) == -1, "case %zu loaded", i);
        expect_message("%s:1: variant v: field hosts: %s", path, cases[i].expected);
        expect_count(1);
    }
}

/* A companion's name is free (ignoring case) or the spec is refused; a
 * name too long for its suffix too. */
Test(spec, hosts_companion_names_must_be_free_and_short_enough)
{
    const char *path = write_file("spec.lua",
        "layout { name = \"a\", hidden = 128, topk = 2, experts = 8, world = 4, max_tokens = 16, hosts = { 2 } }\n"
        "layout { name = \"A_H2\", hidden = 128, topk = 2, experts = 8, world = 4, max_tokens = 16 }\n");
    cr_assert(load(path) == -1);
    expect_message("%s:1: variant a: field hosts: the companion of 2 hosts is named a_h2, which variant A_H2 "
                   "(%s:2) also has: rename one", path, path);
    expect_count(1);
    char name[64];
    memset(name, 'n', 62);
    name[62] = '\0';
    path = write_file("spec.lua", "layout { name = \"%s\", hidden = 128, topk = 2, experts = 8, world = 4, "
                      "max_tokens = 16, hosts = { 4 } }\n", name);
    cr_assert(load(path) == -1);
    expect_message("%s:1: variant %s: field hosts: the companion of 4 hosts would be named %s_h4, longer than "
                   "63 characters: shorten the variant's name", path, name, name);
    expect_count(1);
}

/* -D hosts=2,4 (or {2,4}) sets the list; -D hosts= clears it. */
Test(spec, hosts_from_the_command_line)
{
    const char *path = write_file("spec.lua", "layout { name = \"v\", hidden = 128, topk = 2, experts = 8, "
                                              "world = 4, max_tokens = 16, hosts = { 4 } }\n");
    const sg_override set[] = { { "hosts", "2,4" } }, braces[] = { { "hosts", "{2, 4}" } },
                      none[] = { { "hosts", "" } }, bad[] = { { "hosts", "2,,4" } };
    cr_assert(load_with(path, set, 1) == 0, "%s", messages());
    cr_expect(spec.count == 3 && spec.variants[0].n_hosts == 2);
    cr_assert(load_with(path, braces, 1) == 0, "%s", messages());
    cr_expect(spec.count == 3);
    cr_assert(load_with(path, none, 1) == 0, "%s", messages());
    cr_expect(spec.count == 1 && spec.variants[0].n_hosts == 0);
    cr_assert(load_with(path, bad, 1) == -1);
    expect_message("-D hosts=2,,4: got \"2,,4\", expected a list of host counts, each an integer 2..world "
                   "dividing world, e.g. {2, 4}");
}
