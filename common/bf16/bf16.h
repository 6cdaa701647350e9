/* bfloat16 on the host: the top 16 bits of an IEEE fp32 (1 sign, 8
 * exponent, 7 fraction bits; precision p = 8, so one rounding to nearest
 * errs by at most u = 2^-8 relative).  Widening is exact; narrowing rounds
 * to nearest, ties to even, as cuBLAS/cuDNN and __float2bfloat16_rn do.
 * NaNs stay NaN (quiet), infinities and signed zeros are kept. */
#ifndef SPB_BF16_H
#define SPB_BF16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t spb_bf16;

/* Under nvcc these are host and device functions: the CUDA bf16 storage's
 * kernels (common/cuda/cuda_bf16.cu) round with this very code. */
#ifdef __CUDACC__
#define SPB_BF16_FN static inline __host__ __device__
#else
#define SPB_BF16_FN static inline
#endif

SPB_BF16_FN float spb_bf16_to_float(spb_bf16 h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

SPB_BF16_FN spb_bf16 spb_bf16_from_float(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu)) /* NaN: keep it a (quiet) NaN */
        return (spb_bf16)((bits >> 16) | 0x0040u);
    /* Adding 0x7fff plus the lowest kept bit rounds half to even; a carry
     * into the exponent is the correct rounding up (to infinity at the top). */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (spb_bf16)(bits >> 16);
}

/* Round toward zero (drop the low 16 bits): the wrong rounding, for tests
 * that must notice an operation which truncates instead of rounding. */
SPB_BF16_FN spb_bf16 spb_bf16_truncate(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return (spb_bf16)(bits >> 16);
}

/* f rounded to the nearest bf16, as a float. */
SPB_BF16_FN float spb_bf16_round(float f) { return spb_bf16_to_float(spb_bf16_from_float(f)); }

#endif
