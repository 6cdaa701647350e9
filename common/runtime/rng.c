#include "rng.h"

#include <math.h>

/* splitmix64's finaliser: a bijective mixer with full avalanche. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t spb_rng_bits(uint64_t seed, uint64_t stream, uint64_t index)
{
    /* Chain the three keys through the mixer so that nearby (stream, index)
     * pairs give unrelated outputs. */
    uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);
    h = mix64(h ^ (stream + 0x632be59bd9b4e019ull));
    return mix64(h ^ (index * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull));
}

double spb_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    return (double)(spb_rng_bits(seed, stream, index) >> 11) * 0x1.0p-53;
}

double spb_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t b = spb_rng_bits(seed, stream, index);
    uint64_t c = mix64(b ^ 0xd1b54a32d192ed03ull);
    double u1 = ((double)(b >> 11) + 0.5) * 0x1.0p-53; /* (0, 1) */
    double u2 = (double)(c >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t spb_rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n)
{
    /* Multiply-shift: unbiased enough for n far below 2^64. */
    return (uint64_t)(((unsigned __int128)spb_rng_bits(seed, stream, index) * n) >> 64);
}
