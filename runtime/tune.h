/* tune.h: the tuning knobs of the generated kernels (SYMM_TUNE, or
 * symm_variant_options.tune). Internal.
 *
 * A tuning is "NAME=value" items separated by commas or spaces, for example
 * "PUSH_WARPS=4,PUSH_BATCH=8". Each item becomes the NVRTC option
 * -DSYMM_TUNE_NAME=value. No knob changes what the kernels compute or the
 * layout of any buffer (PROFILE=2 only appends its spans to the local
 * scratch, variant.c); each one only moves work between warps or changes
 * how many copies are in flight, so ranks may even differ, except in DEDUP,
 * CHAIN_STREAM, PUSH_PARTIALS and PARTIAL_GRID, which change what a rank
 * expects of its peers (what a peer sends and how the rank learns it is
 * there): every rank must agree on those. The JIT cache key includes the
 * options, so every tuning has its own cache entries. */
#ifndef SYMM_TUNE_H
#define SYMM_TUNE_H

#include <stdbool.h>

#include "symm_status.h"

#define SYMM_TUNE_MAX_ITEMS 40
#define SYMM_TUNE_OPTION_LEN 48

typedef struct symm_tune {
    int count;
    int profile;  /* PROFILE: 1: the kernels record phase times, 2: and spans (0: neither) */
    bool pdl;     /* PDL (default 1): dispatch and combine launched as programmatic dependents */
    char option[SYMM_TUNE_MAX_ITEMS][SYMM_TUNE_OPTION_LEN]; /* "-DSYMM_TUNE_NAME=value" */
} symm_tune;

/* Parses text (NULL or empty: no knob). origin names where the text came from
 * in error messages ("SYMM_TUNE", "symm_variant_options.tune"). On error out
 * is empty and the message names the item, what was wrong and the knobs with
 * their ranges. */
symm_status symm_tune_parse(const char *text, const char *origin, symm_tune *out);

#endif
