/* profile.h: the profile's slots in device memory (the tuning knob PROFILE,
 * templates/cu/primitives.cu.in) and how they become a
 * symm_variant_profile. Internal.
 *
 * PROFILE=1 and 2: SYMM_PROFILE_SLOTS u64 of %globaltimer at
 * SYMM_PROFILE_OFFSET of the state record, named and ordered as ProfileSlot
 * in the template; the starts keep the earliest value, the others the
 * latest. PROFILE=2 also: SYMM_PROFILE_SPAN_SLOTS u64 after the local
 * scratch's regions (at the descriptor's scratch_bytes, where the variant
 * then allocates them), named and ordered as SpanSlot in the template: per
 * kind of warp, the count of warps that recorded, then sums of ns and
 * counts. tests/cpu/test_profile.c checks both lists against the template. */
#ifndef SYMM_PROFILE_H
#define SYMM_PROFILE_H

#include <stdint.h>

#include "symm_variant.h"

#define SYMM_PROFILE_OFFSET 128
#define SYMM_PROFILE_SLOTS 16
enum {
    SYMM_PROF_DISPATCH_START = 0,
    SYMM_PROF_DISPATCH_COUNTED,
    SYMM_PROF_DISPATCH_COUNTS_IN,
    SYMM_PROF_DISPATCH_ROWS_OUT,
    SYMM_PROF_DISPATCH_ROWS_IN,
    SYMM_PROF_DISPATCH_END,
    SYMM_PROF_DISPATCH_BASES,
    SYMM_PROF_DISPATCH_STORED,
    SYMM_PROF_COMBINE_START = 8,
    SYMM_PROF_COMBINE_PUSHED,
    SYMM_PROF_COMBINE_END,
    SYMM_PROF_COMBINE_ISSUED,
    SYMM_PROF_COMBINE_STORED,
    SYMM_PROF_DISPATCH_ROUTED,
    SYMM_PROF_COMBINE_FENCED,
    SYMM_PROF_COMBINE_FLAGS_IN,
    SYMM_PROF_USED
};
_Static_assert(SYMM_PROF_USED <= SYMM_PROFILE_SLOTS, "profile slots");

#define SYMM_PROFILE_SPAN_SLOTS 64
#define SYMM_PROFILE_SPANS_BYTES (SYMM_PROFILE_SPAN_SLOTS * 8)

/* Layout rank's dispatch with the tuning STEAL (templates/cu/dispatch.cu.in)
 * keeps, after the spans: a claim word (u64) per (block, warp), a ready word
 * and a count word (u64 each) per block and a row per (block, warp, rank)
 * (int32); 16 warps a block. The template's STEAL_OFF .. STEAL_BYTES,
 * checked by test_profile. */
#define SYMM_STEAL_WARPS 16
static inline uint64_t symm_steal_bytes(const symm_variant_desc *d)
{
    if (d->layout != SYMM_LAYOUT_RANK)
        return 0;
    const uint64_t runs = (uint64_t)d->sms * SYMM_STEAL_WARPS;
    return runs * 8 + (uint64_t)d->sms * 16 + runs * (uint64_t)d->world * 4;
}
enum {
    SYMM_SPAN_PARTS = 0, /* warps */
    SYMM_SPAN_PARTS_LOOP,
    SYMM_SPAN_PARTS_SCAN,
    SYMM_SPAN_PARTS_PART,
    SYMM_SPAN_PARTS_ISSUE,
    SYMM_SPAN_PARTS_LOADS,
    SYMM_SPAN_PARTS_SUMS,
    SYMM_SPAN_PARTS_SLOTS,
    SYMM_SPAN_PARTS_PUBLISH,
    SYMM_SPAN_PARTS_PARTS,
    SYMM_SPAN_PARTS_CHUNKS,
    SYMM_SPAN_PARTS_ROWS,
    SYMM_SPAN_PARTS_END,
    SYMM_SPAN_PUSH = 16, /* warps */
    SYMM_SPAN_PUSH_LOOP,
    SYMM_SPAN_PUSH_COPY,
    SYMM_SPAN_PUSH_LOADS,
    SYMM_SPAN_PUSH_SLOTS,
    SYMM_SPAN_PUSH_PUBLISH,
    SYMM_SPAN_PUSH_ROWS,
    SYMM_SPAN_PUSH_BATCHES,
    SYMM_SPAN_PUSH_END,
    SYMM_SPAN_SUMS = 32, /* warps */
    SYMM_SPAN_SUMS_LOOP,
    SYMM_SPAN_SUMS_WAIT,
    SYMM_SPAN_SUMS_PARTS_WAIT, /* inside SUMS_SUM (wait_parts is called from the sums) */
    SYMM_SPAN_SUMS_SUM,
    SYMM_SPAN_SUMS_UNITS,
    SYMM_SPAN_SUMS_TOKENS,
    SYMM_SPAN_SUMS_END,
    SYMM_SPAN_ROWS = 48, /* warps */
    SYMM_SPAN_ROWS_LOOP,
    SYMM_SPAN_ROWS_LOADS,
    SYMM_SPAN_ROWS_SLOTS,
    SYMM_SPAN_ROWS_DRAIN,
    SYMM_SPAN_ROWS_TOKENS,
    SYMM_SPAN_ROWS_ROWS,
    SYMM_SPAN_ROWS_IDLE, /* from the warp's stores complete to its block's last warp's */
    SYMM_SPAN_ROWS_END,
};
_Static_assert(SYMM_SPAN_PARTS_END <= SYMM_SPAN_PUSH && SYMM_SPAN_PUSH_END <= SYMM_SPAN_SUMS &&
                   SYMM_SPAN_SUMS_END <= SYMM_SPAN_ROWS && SYMM_SPAN_ROWS_END <= SYMM_PROFILE_SPAN_SLOTS,
               "a kind's spans within its 16 slots");

/* The phase slots as they are reset: the starts at the largest value (they
 * keep the minimum), the ends at 0. */
void symm_profile_empty(uint64_t phases[SYMM_PROFILE_SLOTS]);

/* The slots as the public profile of a variant of PROFILE level (1 or 2):
 * the phases in microseconds after their kernel's start (-1 where not
 * recorded), and at level 2 the spans (spans: SYMM_PROFILE_SPAN_SLOTS
 * slots; else NULL, and the spans read 0). */
void symm_profile_from_slots(const uint64_t phases[SYMM_PROFILE_SLOTS], const uint64_t *spans, int level,
                             symm_variant_profile *out);

#endif
