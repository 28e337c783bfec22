/* tune.c: SYMM_TUNE and symm_variant_options.tune (see tune.h). The names and
 * ranges match the static_asserts of templates/variant.cu.in, which check
 * them again at compile time. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "tune.h"

static const struct knob {
    const char *name;
    long min, max;
} knobs[] = {
    {"BULK_SLOTS", 1, 4},  /* staging buffers per copying warp (dispatch, combine's push) */
    {"PUSH_WARPS", 1, 16}, /* combine: warps per block that push rows before summing */
    {"PUSH_WARPS_SMALL", 0, 16}, /* combine: push warps with at most 2048 received rows (0: PUSH_WARPS) */
    {"PUSH_BATCH", 1, 32}, /* combine: rows a push warp moves per flag fence */
    {"PART_BATCH", 1, 32}, /* combine, PUSH_PARTIALS: rows a push warp scans for parts per flag fence (default 8) */
    {"SUM_UNROLL", 1, 10},  /* combine: output vectors per lane in flight */
    {"SUM_GATHER", 1, 16}, /* combine: sources whose loads are issued together */
    {"PREFETCH", 0, 1},    /* 1: loads issued ahead (topk ids, a warp's first rows, a push batch's rows) */
    {"LOCAL_VEC", 0, 1},   /* dispatch: 1: rows for this rank stored by the warp's lanes, not the bulk copy (default 1 for layout rank's fp8 rows above max_tokens 512) */
    {"PROFILE", 0, 2},     /* 1: the kernels record phase times, 2: and spans (symm_variant_profile_read) */
    {"PDL", 0, 1},         /* 1: dispatch and combine launched as programmatic dependents (default 1) */
    {"DEDUP", 0, 1},       /* dispatch, layout expert: 1: a token's row goes to each peer once (default 1) */
    {"PUSH_PARTIALS", 0, 1}, /* combine, layout expert by rank: 1: a peer pushes one partial sum per token */
    {"PARTIAL_SLOTS", 1, 4}, /* combine, PUSH_PARTIALS: staging slots a push warp loads ahead through */
    {"PARTIAL_LANES", 0, 1}, /* combine, PUSH_PARTIALS: 1: the lanes store a part at the peer (0: a bulk copy) */
    {"PUSH_INTERLEAVE", 0, 1}, /* combine, layout rank at world > 2: 1: push batches go round the peers */
    {"PARTIAL_GRID", 0, 1},    /* combine, layout expert by rank without PUSH_PARTIALS: 1: the grid forms the parts */
    {"GRID_OWN", 0, 1},        /* combine, PARTIAL_GRID: 1: the grid forms this rank's own parts too */
    {"GRID_PACK", 0, 1},       /* combine, PARTIAL_GRID: 1: a part of few rows loads several chunks a round */
    {"CHAIN_STREAM", 0, 1}, /* dispatch, layout expert with DEDUP: 1: heads copied into their chains as they land */
    {"CHAIN_WARPS", 0, 8},  /* dispatch, CHAIN_STREAM: warps per block that only copy chains (send no rows) */
    {"SUM_PREFETCH", 0, 1}, /* combine: 1: a summing warp asks L2 for its token's local rows first (default 1 for layout expert, 0 for layout rank) */
    {"PART_FLAT", 0, 1},    /* combine, PUSH_PARTIALS: 1: a chunk's rows all loaded before they are summed (default 1) */
    {"PUSH_SLOTS", 1, 4},   /* combine, rows pushed whole (not PUSH_PARTIALS, PARTIAL_GRID): a push warp's staging slots (default 3 or BULK_SLOTS) */
    {"GRID_LEAN", 0, 1},    /* combine, PARTIAL_GRID: 1: a round's loads and sums without a branch a lane (default 1 at world 2, else 0) */
    {"SUM_LEAN", 0, 1},     /* combine: 1: the sums without a branch a lane (layout expert by rank without PARTIAL_GRID; sources in one round; default 1, not layout rank pushing at decode) */
    {"PART_ORDER", 0, 1},   /* combine, PUSH_PARTIALS with DEDUP: 1: the peers' parts formed in token order from dispatch's words (default 1) */
    {"BASE_LOADS", 1, 32},  /* dispatch: count words a thread loads before it waits on any (default 4) */
    {"PUSH_ORDER", 0, 1},   /* combine, combine_order k pushing: 1: the rows pushed token by token (default 1) */
    {"COUNT16", 0, 1},      /* dispatch, layout expert below max_tokens 65536: 1: 4-byte count words (default 1) */
    {"STEAL", 0, 1},        /* dispatch, layout rank at prefill: 1: a warp done with its tokens takes others from the runs' backs (default 1) */
    {"PUSH_DEAL", 0, 1},    /* combine, layout rank pushing: 1: a push warp's batches after its first from a counter (default 1) */
    {"SUM_EARLY", 0, 1},    /* combine, layout rank pushing at max_tokens <= 512: 1: a one-token unit's sources found before its wait (default 1) */
};
_Static_assert(SYMM_ARRAY_LEN(knobs) <= SYMM_TUNE_MAX_ITEMS, "one option per knob");
_Static_assert(SYMM_ARRAY_LEN(knobs) <= 64, "symm_tune_parse: a bit a knob in `seen`");

static symm_status bad(symm_tune *out, const char *origin, const char *item, size_t len, const char *why)
{
    out->count = 0;
    out->profile = 0;
    out->pdl = true;
    /* "BULK_SLOTS 1..4, PUSH_WARPS 1..16, ...", from the table. */
    char list[768];
    size_t at = 0;
    for (size_t k = 0; k < SYMM_ARRAY_LEN(knobs) && at < sizeof list; k++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s %ld..%ld", k ? ", " : "", knobs[k].name,
                               knobs[k].min, knobs[k].max);
    return symm_fail(SYMM_ERR_INVALID_ARG, "%s: \"%.*s\": %s (knobs: %s; items NAME=value, separated by "
                     "commas or spaces)", origin, (int)(len > 64 ? 64 : len), item, why, list);
}

symm_status symm_tune_parse(const char *text, const char *origin, symm_tune *out)
{
    out->count = 0;
    out->profile = 0;
    out->pdl = true;
    if (!text)
        return SYMM_OK;
    unsigned long long seen = 0; /* a bit a knob */
    const char *p = text;
    for (;;) {
        while (*p == ',' || isspace((unsigned char)*p))
            p++;
        if (!*p)
            return SYMM_OK;
        const char *item = p;
        while (*p && *p != ',' && !isspace((unsigned char)*p))
            p++;
        const size_t len = (size_t)(p - item);
        const char *eq = memchr(item, '=', len);
        if (!eq)
            return bad(out, origin, item, len, "expected NAME=value");
        const size_t name_len = (size_t)(eq - item);
        size_t k = 0;
        while (k < SYMM_ARRAY_LEN(knobs) &&
               !(strlen(knobs[k].name) == name_len && !memcmp(knobs[k].name, item, name_len)))
            k++;
        if (k == SYMM_ARRAY_LEN(knobs))
            return bad(out, origin, item, len, "unknown knob");
        if (seen & (1ull << k))
            return bad(out, origin, item, len, "knob given twice");
        seen |= 1ull << k;
        char digits[24];
        const size_t vlen = len - name_len - 1;
        if (vlen == 0 || vlen >= sizeof digits)
            return bad(out, origin, item, len, "expected an integer value");
        memcpy(digits, eq + 1, vlen);
        digits[vlen] = '\0';
        char *end;
        errno = 0;
        long v = strtol(digits, &end, 10);
        if (errno || *end || !isdigit((unsigned char)digits[0]))
            return bad(out, origin, item, len, "expected an integer value");
        if (v < knobs[k].min || v > knobs[k].max) {
            char why[64];
            snprintf(why, sizeof why, "out of range %ld..%ld", knobs[k].min, knobs[k].max);
            return bad(out, origin, item, len, why);
        }
        snprintf(out->option[out->count++], SYMM_TUNE_OPTION_LEN, "-DSYMM_TUNE_%s=%ld", knobs[k].name, v);
        if (!strcmp(knobs[k].name, "PROFILE"))
            out->profile = (int)v;
        if (!strcmp(knobs[k].name, "PDL"))
            out->pdl = v == 1;
    }
}
