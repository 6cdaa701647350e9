/* Counter-based random numbers: a value depends only on (seed, stream,
 * index), never on call order, so a parameter's initial value is the same
 * however the model is split over ranks. */
#ifndef SPB_RNG_H
#define SPB_RNG_H

#include <stdint.h>

/* 64 well-mixed bits for (seed, stream, index). */
uint64_t spb_rng_bits(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in [0, 1). */
double spb_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Standard normal (Box-Muller on two independent uniforms of this index). */
double spb_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform integer in [0, n). */
uint64_t spb_rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n);

#endif
