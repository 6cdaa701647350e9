/* IEEE 754 binary16 (fp16) on the host and, under nvcc, the device: 1 sign,
 * 5 exponent, 10 fraction bits (precision p = 11: one rounding to nearest
 * errs by at most u = 2^-11 relative, in the normal range), largest finite
 * 65504, smallest normal 2^-14, subnormals down to 2^-24.  Widening is
 * exact; narrowing rounds to nearest, ties to even, as __float2half_rn does:
 * values from 65520 up become infinity (the overflow loss scaling watches
 * for), values below 2^-25 become (signed) zero.  NaNs stay NaN. */
#ifndef SPB_FP16_H
#define SPB_FP16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t spb_fp16;

#ifdef __CUDACC__
#define SPB_FP16_FN static inline __host__ __device__
#else
#define SPB_FP16_FN static inline
#endif

SPB_FP16_FN float spb_fp16_to_float(spb_fp16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, frac = h & 0x3ffu, bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (frac << 13); /* infinity, NaN (payload kept) */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (frac << 13); /* normal: rebias 15 -> 127 */
    } else if (frac == 0) {
        bits = sign; /* zero */
    } else {
        /* subnormal: frac * 2^-24, normalised (exact in fp32) */
        int shift = 0;
        while (!(frac & 0x400u)) frac <<= 1, shift++;
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((frac & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

SPB_FP16_FN spb_fp16 spb_fp16_from_float(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint32_t sign = (bits >> 16) & 0x8000u, abs = bits & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* infinity, or NaN kept a (quiet) NaN */
        return (spb_fp16)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u | ((abs >> 13) & 0x3ffu) : 0u));
    if (abs >= 0x477ff000u) return (spb_fp16)(sign | 0x7c00u); /* >= 65520: rounds to infinity */
    if (abs >= 0x38800000u) {
        /* normal (>= 2^-14): drop 13 bits, half to even; a carry into the
         * exponent is the correct rounding up */
        uint32_t h = ((abs - 0x38000000u) >> 13), rest = abs & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
        return (spb_fp16)(sign | h);
    }
    if (abs < 0x33000000u) return (spb_fp16)sign; /* below 2^-25: zero (2^-25 itself ties to even: zero) */
    /* subnormal result: the significand with its implicit bit, shifted so
     * that one unit is 2^-24, rounded half to even */
    uint32_t e = abs >> 23, m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 for e in 102..112 */
    uint32_t h = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u))) h++;
    return (spb_fp16)(sign | h);
}

/* f rounded to the nearest fp16, as a float. */
SPB_FP16_FN float spb_fp16_round(float f) { return spb_fp16_to_float(spb_fp16_from_float(f)); }

#endif
