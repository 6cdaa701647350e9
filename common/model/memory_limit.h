/* The memory a rank can have, and the memory model consulted against it
 * before anything is allocated (issue 39: a run that cannot fit is refused
 * with the predicted figure instead of running until an allocation fails). */
#ifndef SPB_MEMORY_LIMIT_H
#define SPB_MEMORY_LIMIT_H

#include <stddef.h>

#include "config.h"

/* Physical memory of this machine in bytes (0 if unknown). */
double spb_host_memory_bytes(void);

/* Refuses (-1 with a message naming the predicted figure) a run whose
 * predicted peak per rank (memory model: parameters, gradients, optimizer
 * state, activations) exceeds capacity bytes; `limit` names it in the
 * message ("--memory-budget 1GiB", "the memory a rank can have, 11.7 GiB
 * (...)").  A lower bound of the parameters alone is checked first, so
 * absurd sizes never reach the model's tables.  0 when it fits or capacity
 * is unknown (<= 0). */
int spb_memory_check_capacity(const spb_config *cfg, int world_size, double capacity, const char *limit, char *err,
                              size_t errlen);

#endif
