#include <stdio.h>
#include <string.h>

#include "strategy.h"

/* One line per strategy. */
static const spb_strategy *const registry[] = {
    &spb_strategy_none,
    &spb_strategy_ulysses,
    &spb_strategy_megatron,
    &spb_strategy_ring,
    &spb_strategy_hybrid,
    &spb_strategy_allgather_kv,
};
enum { NUM_STRATEGIES = sizeof(registry) / sizeof(registry[0]) };

const spb_strategy *spb_strategy_by_name(const char *name)
{
    for (int i = 0; i < NUM_STRATEGIES; i++)
        if (!strcmp(registry[i]->name, name)) return registry[i];
    return NULL;
}

void spb_strategy_names(char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < NUM_STRATEGIES && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", registry[i]->name);
}
