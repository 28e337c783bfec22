/* profile.c: the profile's slots as a symm_variant_profile (see profile.h);
 * variant.c copies them from the device and resets them. */
#include <string.h>

#include "profile.h"

void symm_profile_empty(uint64_t phases[SYMM_PROFILE_SLOTS])
{
    memset(phases, 0, SYMM_PROFILE_SLOTS * sizeof *phases);
    phases[SYMM_PROF_DISPATCH_START] = UINT64_MAX;
    phases[SYMM_PROF_COMBINE_START] = UINT64_MAX;
}

static double us(uint64_t ns) { return (double)ns / 1e3; }

/* A span that holds another (PARTS_WAIT inside SUMS_SUM): what is left of
 * it, never below 0. */
static uint64_t less(uint64_t outer, uint64_t inner) { return outer > inner ? outer - inner : 0; }

static void spans_from_slots(const uint64_t *s, symm_variant_profile *out)
{
    out->parts = (symm_variant_spans_parts){
        .warps = s[SYMM_SPAN_PARTS],
        .loop_us = us(s[SYMM_SPAN_PARTS_LOOP]),
        .scan_us = us(s[SYMM_SPAN_PARTS_SCAN]),
        .part_us = us(s[SYMM_SPAN_PARTS_PART]),
        .issue_us = us(s[SYMM_SPAN_PARTS_ISSUE]),
        .loads_us = us(s[SYMM_SPAN_PARTS_LOADS]),
        .sums_us = us(s[SYMM_SPAN_PARTS_SUMS]),
        .slots_us = us(s[SYMM_SPAN_PARTS_SLOTS]),
        .publish_us = us(s[SYMM_SPAN_PARTS_PUBLISH]),
        .parts = s[SYMM_SPAN_PARTS_PARTS],
        .chunks = s[SYMM_SPAN_PARTS_CHUNKS],
        .rows = s[SYMM_SPAN_PARTS_ROWS],
    };
    out->push = (symm_variant_spans_push){
        .warps = s[SYMM_SPAN_PUSH],
        .loop_us = us(s[SYMM_SPAN_PUSH_LOOP]),
        .copy_us = us(s[SYMM_SPAN_PUSH_COPY]),
        .loads_us = us(s[SYMM_SPAN_PUSH_LOADS]),
        .slots_us = us(s[SYMM_SPAN_PUSH_SLOTS]),
        .publish_us = us(s[SYMM_SPAN_PUSH_PUBLISH]),
        .rows = s[SYMM_SPAN_PUSH_ROWS],
        .batches = s[SYMM_SPAN_PUSH_BATCHES],
    };
    /* The sums' wait for the peers' parts (PARTIAL_GRID) lies inside their
     * summing span: it moves to the waits. */
    out->sums = (symm_variant_spans_sums){
        .warps = s[SYMM_SPAN_SUMS],
        .loop_us = us(s[SYMM_SPAN_SUMS_LOOP]),
        .wait_us = us(s[SYMM_SPAN_SUMS_WAIT] + s[SYMM_SPAN_SUMS_PARTS_WAIT]),
        .sum_us = us(less(s[SYMM_SPAN_SUMS_SUM], s[SYMM_SPAN_SUMS_PARTS_WAIT])),
        .units = s[SYMM_SPAN_SUMS_UNITS],
        .tokens = s[SYMM_SPAN_SUMS_TOKENS],
    };
    out->rows = (symm_variant_spans_rows){
        .warps = s[SYMM_SPAN_ROWS],
        .loop_us = us(s[SYMM_SPAN_ROWS_LOOP]),
        .loads_us = us(s[SYMM_SPAN_ROWS_LOADS]),
        .slots_us = us(s[SYMM_SPAN_ROWS_SLOTS]),
        .drain_us = us(s[SYMM_SPAN_ROWS_DRAIN]),
        .tokens = s[SYMM_SPAN_ROWS_TOKENS],
        .rows = s[SYMM_SPAN_ROWS_ROWS],
        .idle_us = us(s[SYMM_SPAN_ROWS_IDLE]),
    };
}

void symm_profile_from_slots(const uint64_t phases[SYMM_PROFILE_SLOTS], const uint64_t *spans, int level,
                             symm_variant_profile *out)
{
    const uint64_t *t = phases;
    /* Microseconds after the kernel's start; -1 where nothing was recorded. */
    const uint64_t d0 = t[SYMM_PROF_DISPATCH_START], c0 = t[SYMM_PROF_COMBINE_START];
#define SINCE(start, i) ((start) != UINT64_MAX && t[i] >= (start) ? (double)(t[i] - (start)) / 1e3 : -1.0)
    *out = (symm_variant_profile){
        .dispatch_routed_us = SINCE(d0, SYMM_PROF_DISPATCH_ROUTED),
        .dispatch_counted_us = SINCE(d0, SYMM_PROF_DISPATCH_COUNTED),
        .dispatch_counts_in_us = SINCE(d0, SYMM_PROF_DISPATCH_COUNTS_IN),
        .dispatch_bases_us = SINCE(d0, SYMM_PROF_DISPATCH_BASES),
        .dispatch_stored_us = SINCE(d0, SYMM_PROF_DISPATCH_STORED),
        .dispatch_rows_out_us = SINCE(d0, SYMM_PROF_DISPATCH_ROWS_OUT),
        .dispatch_rows_in_us = SINCE(d0, SYMM_PROF_DISPATCH_ROWS_IN),
        .dispatch_us = SINCE(d0, SYMM_PROF_DISPATCH_END),
        .combine_issued_us = SINCE(c0, SYMM_PROF_COMBINE_ISSUED),
        .combine_stored_us = SINCE(c0, SYMM_PROF_COMBINE_STORED),
        .combine_fenced_us = SINCE(c0, SYMM_PROF_COMBINE_FENCED),
        .combine_flags_in_us = SINCE(c0, SYMM_PROF_COMBINE_FLAGS_IN),
        .combine_pushed_us = SINCE(c0, SYMM_PROF_COMBINE_PUSHED),
        .combine_us = SINCE(c0, SYMM_PROF_COMBINE_END),
        .level = level,
    };
#undef SINCE
    if (level >= 2 && spans)
        spans_from_slots(spans, out);
}
