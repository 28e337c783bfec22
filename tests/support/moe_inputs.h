/* moe_inputs.h: the random inputs the GPU tests (tests/gpu/) and the
 * benchmark (bench/moe_bench.c) build alike. A splitmix64 stream per
 * (seed, a, b), so that every rank can rebuild every rank's data from one
 * shared seed; finite values of a dtype; Zipf routing over expert ids; the
 * CPU reference's configuration of a variant. Header-only (static inline):
 * changing a function here changes, for the same seed, the inputs of every
 * program that uses it. */
#ifndef MOE_INPUTS_H
#define MOE_INPUTS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "symm_ref.h"
#include "symm_variant.h"

/* Exponent of the Zipf routings: expert 0 is the hottest. */
#define MOE_ZIPF_S 1.2

typedef struct moe_rng {
    uint64_t s;
} moe_rng;

/* splitmix64 */
static inline uint64_t moe_rng_next(moe_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1), 53 bits. */
static inline double moe_rng_unit(moe_rng *r) { return (double)(moe_rng_next(r) >> 11) / 9007199254740992.0; }

/* Uniform in 0 .. n - 1. */
static inline int moe_rng_int(moe_rng *r, int n) { return (int)(moe_rng_unit(r) * n); }

/* A stream of its own for each (seed, a, b). */
static inline moe_rng moe_rng_for(uint64_t seed, uint64_t a, uint64_t b)
{
    moe_rng r = {seed ^ (a * 0xD1342543DE82EF95ull) ^ (b * 0x9E3779B97F4A7C15ull)};
    moe_rng_next(&r);
    return r;
}

/* n finite values of dt, as its bits: uniform in [-4, 4) rounded to dt
 * (fp8: times 50, to use its range); one draw each. */
static inline void moe_random_elems(moe_rng *r, symm_dtype dt, void *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float f = (float)(moe_rng_unit(r) * 8.0 - 4.0);
        switch (dt) {
        case SYMM_DTYPE_BF16: ((uint16_t *)dst)[i] = symm_f32_to_bf16(f); break;
        case SYMM_DTYPE_FP16: ((uint16_t *)dst)[i] = symm_f32_to_f16(f); break;
        case SYMM_DTYPE_FP32: ((float *)dst)[i] = f; break;
        case SYMM_DTYPE_FP8_E4M3: ((uint8_t *)dst)[i] = symm_f32_to_e4m3(f * 50.0f); break;
        }
    }
}

/* n floats uniform in [lo, lo + 1): fp8 block scales (lo > 0 keeps them off
 * zero) or top-k weights. */
static inline void moe_random_floats(moe_rng *r, float *dst, size_t n, double lo)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (float)(moe_rng_unit(r) + lo);
}

/* The CDF of Zipf(MOE_ZIPF_S) over expert ids 0 .. experts - 1; the last
 * entry is exactly 1 so that every draw finds an expert. */
static inline void moe_zipf_cdf(double *cdf, int experts)
{
    double sum = 0, acc = 0;
    for (int e = 0; e < experts; e++)
        sum += pow(e + 1.0, -MOE_ZIPF_S);
    for (int e = 0; e < experts; e++)
        cdf[e] = (acc += pow(e + 1.0, -MOE_ZIPF_S) / sum);
    cdf[experts - 1] = 1.0;
}

/* An expert drawn from cdf (moe_zipf_cdf): the first whose entry is at
 * least a uniform draw. */
static inline int moe_zipf_expert(moe_rng *r, const double *cdf, int experts)
{
    double u = moe_rng_unit(r);
    int lo = 0, hi = experts - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Whether expert e is among row[0 .. n - 1] (top-k ids are distinct). */
static inline bool moe_row_has(const int32_t *row, int n, int e)
{
    for (int i = 0; i < n; i++)
        if (row[i] == e)
            return true;
    return false;
}

/* The CPU reference's configuration of a variant. */
static inline symm_ref_config moe_ref_config(const symm_variant_desc *d)
{
    return (symm_ref_config){
        .hidden = d->hidden, .topk = d->topk, .experts = d->experts, .world = d->world,
        .max_tokens = d->max_tokens, .dtype = d->dtype, .combine_dtype = d->combine_dtype,
        .layout = d->layout, .weights = d->weights, .capacity = d->capacity, .align = d->align,
        .combine_order = d->combine_order,
    };
}

#endif
