/* test_profile.c: the profile's slots (runtime/profile.c, the tuning knob
 * PROFILE) without a GPU: the host's slot names agree with the kernels'
 * (templates/cu/primitives.cu.in: ProfileSlot, SpanSlot, their counts and
 * places), and the slots become the phases and the spans of
 * symm_variant_profile as documented (PROFILE=1: no spans). */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "profile.h"
#include "test_file.h"

#define TEMPLATE "templates/cu/primitives.cu.in"

typedef struct entry {
    char name[48];
    long value;
} entry;

/* The entries of `enum NAME {...};` in text, in order, values as C counts
 * them (NAME = N, else one more than the last); comments skipped. */
static int parse_enum(const char *text, const char *name, entry *out, int max)
{
    char open[64];
    snprintf(open, sizeof open, "enum %s {", name);
    const char *p = strstr(text, open);
    cr_assert(p, "%s: no \"%s\"", TEMPLATE, open);
    p += strlen(open);
    const char *end = strstr(p, "};");
    cr_assert(end, "%s: enum %s does not end", TEMPLATE, name);
    int n = 0;
    long next = 0;
    while (p < end) {
        if (p[0] == '/' && p[1] == '/') {
            p = strchr(p, '\n');
            continue;
        }
        if (!(isalpha((unsigned char)*p) || *p == '_')) {
            p++;
            continue;
        }
        cr_assert_lt(n, max, "enum %s: more than %d entries", name, max);
        size_t len = 0;
        while (isalnum((unsigned char)p[len]) || p[len] == '_')
            len++;
        cr_assert_lt(len, sizeof out[n].name);
        memcpy(out[n].name, p, len);
        out[n].name[len] = '\0';
        p += len;
        while (*p == ' ')
            p++;
        if (*p == '=') {
            char *after;
            next = strtol(p + 1, &after, 10);
            p = after;
        }
        out[n++].value = next++;
        while (p < end && *p != ',' && *p != '\n')
            p++;
    }
    return n;
}

static long constant(const char *text, const char *decl)
{
    const char *p = strstr(text, decl);
    cr_assert(p, "%s: no \"%s\"", TEMPLATE, decl);
    return strtol(p + strlen(decl), NULL, 10);
}

typedef struct named {
    const char *name;
    long value;
} named;

/* Every entry of the template's enum is in `host` with the same value, and
 * the other way round. */
static void expect_same(const char *text, const char *enum_name, const named *host, int n_host)
{
    entry got[80];
    const int n = parse_enum(text, enum_name, got, 80);
    cr_assert_eq(n, n_host, "enum %s: %d entries in %s, %d on the host (runtime/profile.h)", enum_name, n, TEMPLATE,
                 n_host);
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < n_host && strcmp(host[j].name, got[i].name))
            j++;
        cr_assert_lt(j, n_host, "%s: %s has no SYMM_%s in runtime/profile.h", TEMPLATE, got[i].name, got[i].name);
        cr_assert_eq(got[i].value, host[j].value, "%s is %ld in %s, SYMM_%s %ld in runtime/profile.h", got[i].name,
                     got[i].value, TEMPLATE, host[j].name, host[j].value);
    }
}

#define N(x) {#x, SYMM_##x}

Test(profile, the_hosts_slots_are_the_kernels)
{
    char *text = test_slurp(TEMPLATE, NULL);
    const named phases[] = {
        N(PROF_DISPATCH_START), N(PROF_DISPATCH_COUNTED), N(PROF_DISPATCH_COUNTS_IN), N(PROF_DISPATCH_ROWS_OUT),
        N(PROF_DISPATCH_ROWS_IN), N(PROF_DISPATCH_END), N(PROF_DISPATCH_BASES), N(PROF_DISPATCH_STORED),
        N(PROF_COMBINE_START), N(PROF_COMBINE_PUSHED), N(PROF_COMBINE_END), N(PROF_COMBINE_ISSUED),
        N(PROF_COMBINE_STORED), N(PROF_DISPATCH_ROUTED), N(PROF_COMBINE_FENCED), N(PROF_COMBINE_FLAGS_IN),
    };
    expect_same(text, "ProfileSlot", phases, sizeof phases / sizeof phases[0]);
    const named spans[] = {
        N(SPAN_PARTS), N(SPAN_PARTS_LOOP), N(SPAN_PARTS_SCAN), N(SPAN_PARTS_PART), N(SPAN_PARTS_ISSUE),
        N(SPAN_PARTS_LOADS), N(SPAN_PARTS_SUMS), N(SPAN_PARTS_SLOTS), N(SPAN_PARTS_PUBLISH), N(SPAN_PARTS_PARTS),
        N(SPAN_PARTS_CHUNKS), N(SPAN_PARTS_ROWS), N(SPAN_PARTS_END),
        N(SPAN_PUSH), N(SPAN_PUSH_LOOP), N(SPAN_PUSH_COPY), N(SPAN_PUSH_LOADS), N(SPAN_PUSH_SLOTS),
        N(SPAN_PUSH_PUBLISH), N(SPAN_PUSH_ROWS), N(SPAN_PUSH_BATCHES), N(SPAN_PUSH_END),
        N(SPAN_SUMS), N(SPAN_SUMS_LOOP), N(SPAN_SUMS_WAIT), N(SPAN_SUMS_PARTS_WAIT), N(SPAN_SUMS_SUM),
        N(SPAN_SUMS_UNITS), N(SPAN_SUMS_TOKENS), N(SPAN_SUMS_END),
        N(SPAN_ROWS), N(SPAN_ROWS_LOOP), N(SPAN_ROWS_LOADS), N(SPAN_ROWS_SLOTS), N(SPAN_ROWS_DRAIN),
        N(SPAN_ROWS_TOKENS), N(SPAN_ROWS_ROWS), N(SPAN_ROWS_IDLE), N(SPAN_ROWS_END),
    };
    expect_same(text, "SpanSlot", spans, sizeof spans / sizeof spans[0]);
    cr_assert_eq(constant(text, "constexpr int PROFILE_SLOTS = "), SYMM_PROFILE_SLOTS);
    cr_assert_eq(constant(text, "constexpr int PROFILE_SPAN_SLOTS = "), SYMM_PROFILE_SPAN_SLOTS);
    cr_assert(strstr(text, "constexpr u64 PROFILE_OFF = STATE_OFF + 128;"), "the phases' place");
    cr_assert_eq(SYMM_PROFILE_OFFSET, 128);
    /* The spans right after the scratch's regions, where the runtime adds them. */
    cr_assert(strstr(text, "constexpr u64 PROFILE_SPANS_OFF = SCRATCH_BYTES;"), "the spans' place");
    /* STEAL's words after the spans, as runtime/profile.h sizes them
     * (symm_steal_bytes): 16 warps a block, a claim each, a ready word and
     * a count word a block, a row a (warp, rank); none for layout expert. */
    char *variant = test_slurp("templates/variant.cu.in", NULL);
    cr_assert(strstr(variant, "constexpr int COPY_THREADS = 512;"), "16 warps a block (SYMM_STEAL_WARPS)");
    free(variant);
    cr_assert_eq(SYMM_STEAL_WARPS, 16);
    cr_assert(strstr(text, "constexpr u64 STEAL_OFF = SCRATCH_BYTES + PROFILE_SPAN_SLOTS * 8;"), "STEAL's place");
    cr_assert(strstr(text, "constexpr int STEAL_RUNS = LAYOUT_EXPERT ? 0 : SMS * COPY_WARPS;"), "STEAL's runs");
    cr_assert(strstr(text, "constexpr u64 STEAL_READY_OFF = STEAL_OFF + u64(STEAL_RUNS) * 8;"), "the claims");
    cr_assert(strstr(text, "constexpr u64 STEAL_ENDS_OFF = STEAL_READY_OFF + u64(LAYOUT_EXPERT ? 0 : SMS) * 16;"),
              "the ready words");
    cr_assert(strstr(text, "constexpr u64 STEAL_BYTES = STEAL_ENDS_OFF + u64(STEAL_RUNS) * WORLD * 4 - STEAL_OFF;"),
              "the ends");
    symm_variant_desc d = {0};
    d.layout = SYMM_LAYOUT_RANK;
    d.sms = 24;
    d.world = 4;
    cr_assert_eq(symm_steal_bytes(&d), 24 * 16 * 8 + 24 * 16 + 24 * 16 * 4 * 4);
    d.layout = SYMM_LAYOUT_EXPERT;
    cr_assert_eq(symm_steal_bytes(&d), 0);
    free(text);
}

/* Slot i holds 1000 * (i + 1) + i: every field shows which slot it came from. */
static void numbered(uint64_t *s, int n)
{
    for (int i = 0; i < n; i++)
        s[i] = 1000u * (uint64_t)(i + 1) + (uint64_t)i;
}

static double us_of(const uint64_t *s, int i) { return (double)s[i] / 1e3; }

Test(profile, phases_are_microseconds_after_their_kernels_start_and_minus_1_where_not_reached)
{
    uint64_t t[SYMM_PROFILE_SLOTS];
    symm_profile_empty(t);
    symm_variant_profile p;
    symm_profile_from_slots(t, NULL, 1, &p);
    cr_assert(p.dispatch_us == -1 && p.combine_us == -1 && p.combine_pushed_us == -1 && p.dispatch_routed_us == -1,
              "nothing recorded: every phase -1");
    cr_assert_eq(p.level, 1);
    t[SYMM_PROF_DISPATCH_START] = 5000000;
    t[SYMM_PROF_DISPATCH_END] = 5012500;
    t[SYMM_PROF_COMBINE_START] = 9000000;
    t[SYMM_PROF_COMBINE_PUSHED] = 9000750;
    t[SYMM_PROF_COMBINE_END] = 8999999; /* before its start: not this call's */
    symm_profile_from_slots(t, NULL, 1, &p);
    cr_assert_float_eq(p.dispatch_us, 12.5, 1e-9);
    cr_assert_float_eq(p.combine_pushed_us, 0.75, 1e-9);
    cr_assert_eq(p.combine_us, -1);
    cr_assert_eq(p.dispatch_counted_us, -1);
}

Test(profile, level_1_has_no_spans_whatever_the_slots_hold)
{
    uint64_t t[SYMM_PROFILE_SLOTS], s[SYMM_PROFILE_SPAN_SLOTS];
    symm_profile_empty(t);
    numbered(s, SYMM_PROFILE_SPAN_SLOTS);
    symm_variant_profile p, zero;
    memset(&zero, 0, sizeof zero);
    symm_profile_from_slots(t, s, 1, &p);
    cr_assert_eq(p.level, 1);
    cr_assert(!memcmp(&p.parts, &zero.parts, sizeof p.parts) && !memcmp(&p.push, &zero.push, sizeof p.push) &&
                  !memcmp(&p.sums, &zero.sums, sizeof p.sums) && !memcmp(&p.rows, &zero.rows, sizeof p.rows),
              "PROFILE=1: the spans read 0");
    symm_profile_from_slots(t, NULL, 2, &p);
    cr_assert_eq(p.parts.warps, 0, "no span slots: zeros");
}

Test(profile, level_2_spans_come_from_their_slots)
{
    uint64_t t[SYMM_PROFILE_SLOTS], s[SYMM_PROFILE_SPAN_SLOTS];
    symm_profile_empty(t);
    numbered(s, SYMM_PROFILE_SPAN_SLOTS);
    symm_variant_profile p;
    symm_profile_from_slots(t, s, 2, &p);
    cr_assert_eq(p.level, 2);
    const struct {
        double got;
        int slot;
    } times[] = {
        {p.parts.loop_us, SYMM_SPAN_PARTS_LOOP},     {p.parts.scan_us, SYMM_SPAN_PARTS_SCAN},
        {p.parts.part_us, SYMM_SPAN_PARTS_PART},     {p.parts.issue_us, SYMM_SPAN_PARTS_ISSUE},
        {p.parts.loads_us, SYMM_SPAN_PARTS_LOADS},   {p.parts.sums_us, SYMM_SPAN_PARTS_SUMS},
        {p.parts.slots_us, SYMM_SPAN_PARTS_SLOTS},   {p.parts.publish_us, SYMM_SPAN_PARTS_PUBLISH},
        {p.push.loop_us, SYMM_SPAN_PUSH_LOOP},       {p.push.copy_us, SYMM_SPAN_PUSH_COPY},
        {p.push.loads_us, SYMM_SPAN_PUSH_LOADS},     {p.push.slots_us, SYMM_SPAN_PUSH_SLOTS},
        {p.push.publish_us, SYMM_SPAN_PUSH_PUBLISH}, {p.sums.loop_us, SYMM_SPAN_SUMS_LOOP},
        {p.rows.loop_us, SYMM_SPAN_ROWS_LOOP},       {p.rows.loads_us, SYMM_SPAN_ROWS_LOADS},
        {p.rows.slots_us, SYMM_SPAN_ROWS_SLOTS},     {p.rows.drain_us, SYMM_SPAN_ROWS_DRAIN},
        {p.rows.idle_us, SYMM_SPAN_ROWS_IDLE},
    };
    for (size_t i = 0; i < sizeof times / sizeof times[0]; i++)
        cr_assert_float_eq(times[i].got, us_of(s, times[i].slot), 1e-9, "field %zu: %f us, slot %d holds %llu ns", i,
                           times[i].got, times[i].slot, (unsigned long long)s[times[i].slot]);
    const struct {
        uint64_t got;
        int slot;
    } counts[] = {
        {p.parts.warps, SYMM_SPAN_PARTS},      {p.parts.parts, SYMM_SPAN_PARTS_PARTS},
        {p.parts.chunks, SYMM_SPAN_PARTS_CHUNKS}, {p.parts.rows, SYMM_SPAN_PARTS_ROWS},
        {p.push.warps, SYMM_SPAN_PUSH},        {p.push.rows, SYMM_SPAN_PUSH_ROWS},
        {p.push.batches, SYMM_SPAN_PUSH_BATCHES}, {p.sums.warps, SYMM_SPAN_SUMS},
        {p.sums.units, SYMM_SPAN_SUMS_UNITS},  {p.sums.tokens, SYMM_SPAN_SUMS_TOKENS},
        {p.rows.warps, SYMM_SPAN_ROWS},        {p.rows.tokens, SYMM_SPAN_ROWS_TOKENS},
        {p.rows.rows, SYMM_SPAN_ROWS_ROWS},
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        cr_assert_eq(counts[i].got, s[counts[i].slot], "count %zu: %llu, slot %d holds %llu", i,
                     (unsigned long long)counts[i].got, counts[i].slot, (unsigned long long)s[counts[i].slot]);
    /* The sums' wait for the peers' parts (inside their summing span) moves
     * to the waits. */
    cr_assert_float_eq(p.sums.wait_us, us_of(s, SYMM_SPAN_SUMS_WAIT) + us_of(s, SYMM_SPAN_SUMS_PARTS_WAIT), 1e-9);
    cr_assert_float_eq(p.sums.sum_us, us_of(s, SYMM_SPAN_SUMS_SUM) - us_of(s, SYMM_SPAN_SUMS_PARTS_WAIT), 1e-9);
    /* Never below 0, whatever the slots hold. */
    s[SYMM_SPAN_SUMS_PARTS_WAIT] = s[SYMM_SPAN_SUMS_SUM] + 1;
    symm_profile_from_slots(t, s, 2, &p);
    cr_assert_eq(p.sums.sum_us, 0);
}
