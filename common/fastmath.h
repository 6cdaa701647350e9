/* Branch-free expf and tanhf that compilers vectorise (libm's are scalar
 * calls).  Cody-Waite range reduction and a degree-6 polynomial: relative
 * error below 2e-7 over the float range, deterministic. */
#ifndef SPB_FASTMATH_H
#define SPB_FASTMATH_H

#include <stdint.h>
#include <string.h>

static inline float spb_expf(float x)
{
    /* Clamp: below -87.3 the result is (flushed to) zero, above 88.7 inf. */
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.7f ? 88.7f : x;
    float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
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
