/* test_spec_fuzz.c: a fuzzer of spec loading (generator/spec.c through
 * sg_spec_load), kept as a tool and run for a bounded time by `make test`.
 *
 * Each round writes a spec made of random pieces: layout calls with odd
 * values (bounds, huge and integral floats, strings with control bytes and
 * invalid UTF-8, tables, NaN), unknown and positional keys, hostile Lua
 * (loops under pcall and xpcall, metatables whose __index declares variants,
 * library calls with extreme arguments, errors raised with odd values,
 * require of a sibling module, deep nesting), or a byte-level mutation of a
 * spec in specs/; adds random -D overrides; and checks what every load must
 * hold whatever the input:
 *   - it returns 0 with variants that pass the generator's rules, or -1 with
 *     at least one message; never a crash, a hang past the deadline, a
 *     message with a control byte, or an "internal error";
 *   - a second load of the same spec gives the same variants and messages
 *     (loads are deterministic), checked on a share of the rounds;
 *   - the first variant of a loaded spec generates (sg_generate_variant).
 *
 *   SYMM_FUZZ_SECONDS  how long to run (default 3; `make test SAN=1` runs
 *                      longer under ASan and UBSan)
 *   SYMM_FUZZ_SEED     the seed (default: random, printed); a failure prints
 *                      the seed, the round and the spec
 * e.g. SYMM_FUZZ_SECONDS=600 build/tests/test_spec_fuzz for a long run. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sg.h"
#include "world_fork.h"

/* The deadline of a spec here: the hostile pieces that run forever cost this. */
#define FUZZ_SPEC_TIMEOUT "1"
/* A load may take at most this long, the deadline and a fork included. */
#define FUZZ_LOAD_MAX_S 6.0

static uint64_t state;

static uint64_t next(void)
{
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static unsigned below(unsigned n) { return n ? (unsigned)(next() % n) : 0; }
static bool chance(unsigned percent) { return below(100) < percent; }

typedef struct text {
    char *data;
    size_t len, cap;
} text;

static void add(text *t, const char *s, size_t n)
{
    if (t->cap - t->len < n + 1) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap - t->len < n + 1)
            cap *= 2;
        t->data = realloc(t->data, cap);
        cr_assert(t->data != NULL);
        t->cap = cap;
    }
    memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = '\0';
}

static void add_str(text *t, const char *s) { add(t, s, strlen(s)); }

static void addf(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(text *t, const char *fmt, ...)
{
    char *s;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    cr_assert(n >= 0);
    add(t, s, (size_t)n);
    free(s);
}

#define PICK(array) (array)[below(sizeof(array) / sizeof((array)[0]))]

static const char *const field_names[] = {
    "name", "hidden", "topk", "experts", "world", "max_tokens", "dtype", "combine_dtype", "layout",
    "weights", "capacity", "align", "sms", "combine", "combine_order", "hosts",
};

/* A Lua expression of any kind, biased towards the edges of every rule. */
static void value(text *t)
{
    static const char *const odd[] = {
        "0", "-1", "1", "2", "16", "17", "128", "7168", "7168.0", "7168.5", "2^31", "2^53", "2^63", "-2^63",
        "2^64", "1e308", "-0.0", "0/0", "1/0", "-1/0", "math.huge", "math.maxinteger", "math.mininteger",
        "0x7fffffffffffffff", "true", "false", "nil", "{}", "{ 1, 2 }", "function() end", "\"\"", "\"bf16\"",
        "\"fp16\"", "\"fp32\"", "\"fp8_e4m3\"", "\"rank\"", "\"expert\"", "\"push\"", "\"pull\"", "\"auto\"", "\"BF16\"",
        "\"a\\0b\"", "\"\\xff\\xfe\"", "\"\\27[2J\"", "\"\\n\\r\\t\"", "\"x\" .. (\"y\"):rep(300)",
        "setmetatable({}, { __index = function() return 1 end })", "string.rep(\"a\", 64)",
        "\"symm_x\"", "\"_x\"", "\"int\"", "\"x_t\"", "\"cuInit\"", "\"NULL\"", "\"malloc\"",
        "{ 2 }", "{ 2, 4 }", "{ 4, 2, 2 }", "{ 2.0, 8 }",
    };
    switch (below(4)) {
    case 1:
        addf(t, "%d", (int)below(9000) - 100);
        break;
    case 2:
        addf(t, "%u * %u", below(300), 1u << below(12));
        break;
    default:
        add_str(t, PICK(odd));
    }
}

static void layout_call(text *t, unsigned serial)
{
    int world = 2 << below(4), experts = world * (int)(1 + below(8));
    add(t, "layout { ", 9);
    if (!chance(10))
        addf(t, "name = \"v%u_%u\", ", serial, below(1000));
    if (!chance(10))
        addf(t, "hidden = %d, ", 128 * (int)(1 + below(16)));
    if (!chance(10))
        addf(t, "topk = %d, ", 1 + (int)below(experts < 16 ? (unsigned)experts : 16));
    if (!chance(10))
        addf(t, "experts = %d, ", experts);
    if (!chance(10))
        addf(t, "world = %d, ", world);
    if (!chance(10))
        addf(t, "max_tokens = %d, ", 1 + (int)below(4096));
    for (unsigned k = chance(50) ? 0 : 1 + below(3); k > 0; k--) {
        if (chance(80))
            addf(t, "%s = ", PICK(field_names));
        else if (chance(50))
            addf(t, "%s%u = ", PICK(field_names), below(3));
        else
            add(t, "[\"odd key\\1\"] = ", 16);
        value(t);
        add(t, ", ", 2);
    }
    if (chance(5)) {
        value(t);
        add(t, ", ", 2);
    }
    add(t, "}\n", 2);
}

/* Hostile Lua, most of it cheap; a few pieces run until the deadline. */
static const char *const cheap_pieces[] = {
    "local ok = pcall(error, setmetatable({}, { __tostring = function() return 'x' end }))\n",
    "pcall(function() error(nil) end)\n",
    "local ok, e = pcall(function() local t = nil; return t.x end)\n",
    "for i = 1, 100 do pcall(layout, { name = 'p' .. i }) end\n",
    "local t = setmetatable({}, { __index = function(_, k) if k == 'world' then layout { name = 'inner', "
    "hidden = 128, topk = 1, experts = 2, world = 2, max_tokens = 1 } end return nil end }) pcall(layout, t)\n",
    "local s = ('x'):rep(1 << 20) local u = s:upper() local n = #s:gsub('x', 'yy')\n",
    "local s = string.format('%q %5.2f %x %s', 'a\\0b', 1.5, 255, {})\n",
    "local p = string.pack('i4 z s1', 7, 'ab', 'cd') local a, b, c = string.unpack('i4 z s1', p)\n",
    "pcall(string.pack, 'i17', 1)\n",
    "local n = utf8.len('\\xff\\xfe') local c = utf8.char(0x10ffff, 65) pcall(utf8.codepoint, '\\xff', 1, -1)\n",
    "for p, c in utf8.codes('héllo') do end\n",
    "pcall(utf8.codes, '\\xff')\n",
    "local t = {} for i = 1, 1000 do t[i] = i end table.sort(t, function(a, b) return a > b end)\n",
    "pcall(table.sort, { 3, 1, 2 }, function() return true end)\n",
    "local t = table.move({ 1, 2, 3 }, 1, 3, 2) local s = table.concat(t, ',')\n",
    "pcall(table.concat, { {} })\n",
    "pcall(table.insert, {}, 5, 1)\n",
    "local s = string.rep('ab', 1000, '\\0')\n",
    "local s = string.rep('', 2^62) local u = string.rep('', '1000000000000000000')\n",
    "pcall(string.rep, 'x', 2^40)\n",
    "local x = ('a'):rep(100):find('(a*)(a*)(a*)b')\n",
    "pcall(string.find, 'abc', '%')\n",
    "pcall(string.gsub, 'abc', '(', '')\n",
    "pcall(string.format, '%d', 1.5)\n",
    "local x = math.tointeger(2^53) local y = math.fmod(7, 3) local z = math.ult(1, -1)\n",
    "pcall(math.random, 0)\n",
    "local r = math.random(1, 6) math.randomseed(42) local r2 = math.random()\n",
    "local function f(n) if n > 0 then return f(n - 1) end return 0 end f(150)\n",
    "pcall(function() local function g() return 1 + g() end return g() end)\n",
    "goto skip\nlocal never = 1\n::skip::\n",
    "local a <const> = 5 do local b <close> = setmetatable({}, { __close = function() end }) end\n",
    "pcall(setmetatable, {}, { __gc = function() end })\n",
    "local mt = getmetatable('') pcall(rawset, mt, 'x', 1)\n",
    "local ok = pcall(require, 'mod') local ok2 = pcall(require, '../x')\n",
    "local m = require 'mod'\n",
    "local big = {} for i = 1, 1e5 do big[#big + 1] = tostring(i) end local s = table.concat(big)\n",
    "local s = '' for i = 1, 20 do s = s .. s .. 'x' end\n",
    "pcall(select, 0)\n",
    "local k, v = next({}, nil) pcall(next, {}, 'nokey')\n",
    "local n = tonumber('0x1p4') local m = tonumber('z', 36) pcall(tonumber, '1', 99)\n",
    "local s = tostring(0/0) .. tostring(-0.0) .. tostring(2^63) .. tostring(math.mininteger // -1)\n",
    "pcall(function() return 1 // 0 end)\n",
    "do local _ENV = { layout = layout } layout { name = 'envy', hidden = 128, topk = 1, experts = 2, world = 2, "
    "max_tokens = 1 } end\n",
};

/* Pieces that end a spec: errors raised with odd values, syntax errors. */
static const char *const ending_pieces[] = {
    "error('plain', 0)\n",
    "error('with\\0nul')\n",
    "error(setmetatable({}, { __tostring = function() return 'obj' end }))\n",
    "error(42)\n",
    "assert(false)\n",
    "assert(nil, 'assert \\27[31mred')\n",
    "layout()\n",
    "layout 'x'\n",
    "layout(setmetatable({}, { __pairs = function() error('p') end }))\n",
    "local t = {} t[t] = t layout(t)\n",
    "return 1\n",
    "x = = 1\n",
    "local s = 'unterminated\n",
    "local t = {" /* unbalanced */ "\n",
    "select(-1)\n",
};

static const char *const costly_pieces[] = {
    "while true do end\n",
    "local function f() return f() end pcall(f)\n",
    "xpcall(function() while true do end end, function() while true do end end)\n",
    "while true do pcall(function() while true do end end) end\n",
    "local s = ('a'):rep(2^25) local p = ('a'):rep(2^24) .. 'b' s:find(p, 1, true)\n",
    "local x = ('a'):rep(30000):find('(.*)%1x')\n",
    "local s = 'x' while true do s = s .. s end\n",
    "local t = {} for i = 1, 1e9 do t[i] = i end\n",
    "table.move({}, 1, 1 << 50, 2)\n",
};

/* A byte-level mutation of text: flips, insertions, deletions, a cut, a
 * repeated slice. */
static void mutate(text *t)
{
    for (unsigned k = 1 + below(6); k > 0 && t->len > 0; k--) {
        size_t at = below((unsigned)t->len);
        switch (below(5)) {
        case 0:
            t->data[at] = (char)below(256);
            break;
        case 1:
            t->data[at] ^= (char)(1u << below(8));
            break;
        case 2:
            memmove(t->data + at, t->data + at + 1, t->len - at);
            t->len--;
            break;
        case 3:
            t->len = at;
            t->data[at] = '\0';
            break;
        default: {
            size_t n = 1 + below(64);
            if (at + n > t->len)
                n = t->len - at;
            char slice[64];
            memcpy(slice, t->data + at, n);
            add(t, slice, n);
        }
        }
    }
}

static char dir[512];

static void seed_from_specs(text *t)
{
    static const char *const files[] = { "specs/default.lua", "specs/models.lua", "specs/tutorial.lua" };
    FILE *f = fopen(PICK(files), "rb");
    if (!f)
        return;
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    add(t, buf, n);
}

static void write_text(const char *path, const text *t)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL, "fopen %s: %s", path, strerror(errno));
    cr_assert(fwrite(t->data ? t->data : "", 1, t->len, f) == t->len);
    fclose(f);
}

/* One spec and its module. */
static void make_spec(text *spec, text *mod, unsigned round)
{
    spec->len = mod->len = 0;
    add(spec, "", 0);
    add(mod, "", 0);
    if (chance(15)) {
        seed_from_specs(spec);
        if (!chance(10))
            mutate(spec);
        return;
    }
    for (unsigned k = below(5); k > 0; k--)
        add_str(mod, PICK(cheap_pieces));
    add(mod, "return { n = 1 }\n", 17);
    for (unsigned k = 1 + below(8); k > 0; k--) {
        const char *piece = NULL;
        if (chance(50))
            layout_call(spec, round * 16 + k);
        else if (below(200) == 0)
            piece = PICK(costly_pieces);
        else if (chance(4))
            piece = PICK(ending_pieces);
        else
            piece = PICK(cheap_pieces);
        if (piece)
            add(spec, piece, strlen(piece));
    }
    if (chance(10))
        mutate(spec);
}

static void make_overrides(sg_override *ov, size_t *n, char (*values)[64])
{
    static const char *const vals[] = {
        "1", "0", "-1", "17", "2", "128", "7168", "7168.0", "0x10", "1e3", "1.5", "9223372036854775808",
        "bf16", "fp8_e4m3", "expert", "pull", "push", "auto", "rank", "k", "true", "false", "", "x\x1by", "\xff",
    };
    *n = chance(70) ? 0 : 1 + below(3);
    for (size_t i = 0; i < *n; i++) {
        snprintf(values[i], 64, "%s", PICK(vals));
        ov[i].field = chance(90) ? PICK(field_names) : "hiden";
        ov[i].value = values[i];
    }
}

/* What a failed round shows: the seed, the round, the -D and the spec. */
static char report[16384];

static void describe(uint64_t seed, unsigned round, const text *spec, const sg_override *ov, size_t n)
{
    int used = snprintf(report, sizeof report, "seed %llu, round %u; -D:", (unsigned long long)seed, round);
    for (size_t i = 0; i < n && used > 0 && (size_t)used < sizeof report; i++)
        used += snprintf(report + used, sizeof report - (size_t)used, " %s=%s", ov[i].field, ov[i].value);
    if (used > 0 && (size_t)used < sizeof report)
        snprintf(report + used, sizeof report - (size_t)used, "\nspec:\n%.8000s", spec->data ? spec->data : "");
}

static bool printable(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return false;
    return true;
}

static void check_messages(const sg_diag *d)
{
    cr_assert(d->count > 0, "a failed load said nothing\n%s", report);
    for (size_t i = 0; i < d->count; i++) {
        const char *m = d->messages[i];
        cr_assert(m && *m && strlen(m) < 65536, "message %zu is empty or too long\n%s", i, report);
        cr_assert(printable(m), "message %zu holds a control byte: %s\n%s", i, m, report);
        cr_assert(!strstr(m, "internal error"), "%s\n%s", m, report);
        cr_assert(strncmp(m, dir, strlen(dir)) == 0 || strncmp(m, "-D ", 3) == 0,
                  "message %zu names neither the spec's directory nor a -D: %s\n%s", i, m, report);
    }
}

static void check_variants(const sg_spec *s)
{
    cr_assert(s->count > 0, "a loaded spec without variants\n%s", report);
    for (size_t i = 0; i < s->count; i++) {
        const sg_variant *v = &s->variants[i];
        bool ok = v->name[0] && v->hidden > 0 && v->topk >= 1 && v->topk <= 16 && v->topk <= v->experts &&
                  (v->world >= 2 || (v->companion_hosts && v->world >= 1)) && v->experts % v->world == 0 && v->max_tokens > 0 && v->capacity >= 1 &&
                  v->capacity <= sg_worst_capacity(v) && v->align >= 1 && v->sms >= 1 && v->file &&
                  (v->combine != SYMM_COMBINE_AUTO || v->layout == SYMM_LAYOUT_RANK);
        /* A companion: its parent's shape on one host, right after it or its other companions. */
        if (v->companion_hosts) {
            const sg_variant *p = v - 1;
            while (p->companion_hosts)
                p--;
            ok = ok && strcmp(p->name, v->companion_of) == 0 && v->world * v->companion_hosts == p->world &&
                 v->experts * v->companion_hosts == p->experts &&
                 v->max_tokens == v->companion_hosts * p->max_tokens && v->capacity == p->capacity &&
                 sg_worst_capacity(v) == sg_worst_capacity(p) && p->combine_order == SYMM_COMBINE_ORDER_RANK &&
                 v->combine == p->combine;
        }
        cr_assert(ok, "variant %zu (%s) breaks the rules: hidden %d topk %d experts %d world %d max_tokens %d "
                  "capacity %lld align %d sms %d combine %s\n%s", i, v->name, v->hidden, v->topk, v->experts, v->world,
                  v->max_tokens, (long long)v->capacity, v->align, v->sms, sg_combine_name(v->combine), report);
    }
}

static bool same_variants(const sg_spec *a, const sg_spec *b)
{
    if (a->count != b->count)
        return false;
    for (size_t i = 0; i < a->count; i++) {
        sg_variant x = a->variants[i], y = b->variants[i];
        if (!x.file || !y.file || strcmp(x.file, y.file) != 0)
            return false;
        x.file = y.file = NULL;
        /* Companions point into their own spec: the same place in both. */
        if ((x.companions ? x.companions - a->variants : -1) != (y.companions ? y.companions - b->variants : -1))
            return false;
        x.companions = y.companions = NULL;
        if (memcmp(&x, &y, sizeof x) != 0)
            return false;
    }
    return true;
}

static bool same_messages(const sg_diag *a, const sg_diag *b)
{
    if (a->count != b->count)
        return false;
    for (size_t i = 0; i < a->count; i++)
        if (strcmp(a->messages[i], b->messages[i]) != 0)
            return false;
    return true;
}

static bool ran_too_long(const sg_diag *d)
{
    for (size_t i = 0; i < d->count; i++)
        if (strstr(d->messages[i], "spec ran too long") || strstr(d->messages[i], "out of memory"))
            return true;
    return false;
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

Test(spec_fuzz, random_specs_load_or_fail_cleanly_and_deterministically)
{
    const char *env = getenv("SYMM_FUZZ_SECONDS");
    double seconds = env ? atof(env) : 3.0;
    cr_assert(seconds > 0 && seconds <= 86400, "SYMM_FUZZ_SECONDS=%s: expected seconds, 0..86400", env);
    wf_watchdog((unsigned)seconds + 120);
    const char *seed_env = getenv("SYMM_FUZZ_SEED");
    uint64_t seed;
    if (seed_env)
        seed = strtoull(seed_env, NULL, 10);
    else
        wf_random(&seed, sizeof seed);
    state = seed ? seed : 1;
    setenv("SYMM_SPEC_TIMEOUT", FUZZ_SPEC_TIMEOUT, 1);
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/sg-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert(mkdtemp(dir) != NULL);
    char spec_path[600], mod_path[600];
    snprintf(spec_path, sizeof spec_path, "%s/spec.lua", dir);
    snprintf(mod_path, sizeof mod_path, "%s/mod.lua", dir);

    text spec = { 0 }, mod = { 0 };
    unsigned rounds = 0, loaded = 0, repeated = 0, generated = 0;
    double start = seconds_now();
    for (; seconds_now() - start < seconds; rounds++) {
        make_spec(&spec, &mod, rounds);
        write_text(spec_path, &spec);
        write_text(mod_path, &mod);
        sg_override ov[3];
        char values[3][64];
        size_t n_ov = 0;
        make_overrides(ov, &n_ov, values);
        describe(seed, rounds, &spec, ov, n_ov);

        sg_spec s = { 0 };
        sg_diag d = { 0 };
        double t0 = seconds_now();
        int rc = sg_spec_load(spec_path, ov, n_ov, &s, &d);
        double took = seconds_now() - t0;
        cr_assert(rc == 0 || rc == -1, "sg_spec_load returned %d\n%s", rc, report);
        cr_assert(took < FUZZ_LOAD_MAX_S, "the load took %.1f s\n%s", took, report);
        if (rc == 0) {
            check_variants(&s);
            cr_assert(d.count == 0, "a loaded spec left messages: %s\n%s", d.messages[0], report);
            loaded++;
        } else {
            check_messages(&d);
        }
        /* Determinism: the same spec loads the same way (a deadline or a
         * memory cap met near the limit may fall either side, in either
         * load: string functions are charged by the CPU time they take). */
        if (chance(25) && !ran_too_long(&d)) {
            sg_spec again = { 0 };
            sg_diag d2 = { 0 };
            int rc2 = sg_spec_load(spec_path, ov, n_ov, &again, &d2);
            cr_assert(ran_too_long(&d2) ||
                          (rc2 == rc && same_messages(&d, &d2) && (rc != 0 || same_variants(&s, &again))),
                      "a second load differs (rc %d then %d, %zu then %zu messages)\n%s", rc, rc2, d.count,
                      d2.count, report);
            sg_spec_free(&again);
            sg_diag_free(&d2);
            repeated++;
        }
        if (rc == 0 && chance(10)) {
            sg_generated g = { 0 };
            sg_diag gd = { 0 };
            int st = sg_generate_variant(sg_embedded_templates, &s.variants[0], spec_path, &g, &gd);
            cr_assert(st == SG_EXIT_OK, "generating %s: %s\n%s", s.variants[0].name,
                      gd.count ? gd.messages[0] : "?", report);
            sg_generated_free(&g);
            sg_diag_free(&gd);
            generated++;
        }
        sg_spec_free(&s);
        sg_diag_free(&d);
    }
    free(spec.data);
    free(mod.data);
    wf_rmtree(dir);
    cr_log_info("spec fuzz: seed %llu, %u rounds in %.1f s (%u loaded, %u loaded twice, %u generated)",
                (unsigned long long)seed, rounds, seconds_now() - start, loaded, repeated, generated);
    printf("spec fuzz: seed %llu, %u rounds in %.1f s (%u loaded, %u loaded twice, %u generated)\n",
           (unsigned long long)seed, rounds, seconds_now() - start, loaded, repeated, generated);
    cr_assert(rounds > 0);
}
