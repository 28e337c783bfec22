/* ref_convert.c: the number conversions of the CPU reference (symm_ref.h),
 * bit for bit those of the GPU's cvt.rn (round to nearest, ties to even).
 *
 * Done on the bit patterns with integer arithmetic, so that the result does
 * not depend on the host's floating-point environment (rounding mode, FTZ,
 * excess precision). */
#include <math.h>
#include <string.h>

#include "symm_ref.h"

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* m >> shift, rounded to nearest, ties to even. m < 2^25. */
static uint32_t rne_shift(uint32_t m, int shift)
{
    if (shift >= 32)
        return 0;
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return q;
}

#define F32_ABS 0x7fffffffu
#define F32_INF 0x7f800000u
#define F32_MIN_NORMAL 0x00800000u
#define QUIET_NAN16 0x7fffu

uint16_t symm_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & F32_ABS) > F32_INF)
        return QUIET_NAN16;
    /* Adding just under half an ulp (plus the kept lsb) rounds ties to even;
     * the carry may run into the exponent, up to infinity, as it should. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float symm_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t symm_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & F32_ABS;
    if (a > F32_INF)
        return QUIET_NAN16;
    if (a >= F32_INF)
        return sign | 0x7c00u;
    /* fp32 subnormals are far below half of fp16's smallest subnormal. */
    if (a < F32_MIN_NORMAL)
        return sign;
    int e = (int)(a >> 23) - 127;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    if (e > 15)
        return sign | 0x7c00u;
    if (e >= -14) {
        /* A mantissa that rounds up to 2048 carries into the exponent
         * (and from the largest exponent into infinity). */
        uint32_t h = ((uint32_t)(e + 15) << 10) + rne_shift(m, 13) - 0x400u;
        return (uint16_t)(sign | h);
    }
    /* Subnormal: units of 2^-24; a result of 0x400 is the smallest normal. */
    return (uint16_t)(sign | rne_shift(m, -e - 1));
}

float symm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f)
        return bits_f32(sign | F32_INF | (m << 13) | (m ? 0x400000u : 0));
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

#define E4M3_MAX 0x7eu
#define E4M3_NAN 0x7fu

uint8_t symm_f32_to_e4m3(float f)
{
    uint32_t u = f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & F32_ABS;
    if (a > F32_INF)
        return E4M3_NAN;
    if (a < F32_MIN_NORMAL)
        return sign;
    int e = (int)(a >> 23) - 127;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    /* satfinite: infinities and everything past 448 saturate. */
    if (a >= F32_INF || e > 8)
        return sign | E4M3_MAX;
    if (e >= -6) {
        uint32_t code = ((uint32_t)(e + 7) << 3) + rne_shift(m, 20) - 8u;
        return (uint8_t)(sign | (code > E4M3_MAX ? E4M3_MAX : code));
    }
    /* Subnormal: units of 2^-9. */
    return (uint8_t)(sign | rne_shift(m, 14 - e));
}

float symm_e4m3_to_f32(uint8_t v)
{
    int e = (v >> 3) & 15;
    int m = v & 7;
    float mag;
    if ((v & 0x7fu) == E4M3_NAN)
        mag = NAN;
    else if (e == 0)
        mag = ldexpf((float)m, -9);
    else
        mag = ldexpf((float)(8 + m), e - 10);
    return (v & 0x80u) ? -mag : mag;
}
