/* `none`: one rank holds whole sequences (P = 1); plain data parallelism
 * over the world.  The reference every sequence-parallel strategy must
 * reproduce. */
#include <stdio.h>

#include "local_attention.h"
#include "strategy.h"

static int none_validate(const spb_config *cfg, int world_size, char *err, size_t errlen)
{
    (void)world_size;
    if (cfg->sp_degree != 1) {
        snprintf(err, errlen, "--strategy none needs --sp-degree 1 (got %d)", cfg->sp_degree);
        return -1;
    }
    return 0;
}

/* No communication inside a layer. */
static spb_comm_volume none_comm_volume(const spb_config *cfg, int sp_degree)
{
    (void)cfg, (void)sp_degree;
    return (spb_comm_volume){0.0, 0.0};
}

const spb_strategy spb_strategy_none = {
    .name = "none",
    .summary = "whole sequences per rank, data parallelism only (the reference)",
    .validate = none_validate,
    .attn_saved_floats = spb_local_attention_saved_floats,
    .attention_forward = spb_local_attention_forward,
    .attention_backward = spb_local_attention_backward,
    .comm_volume = none_comm_volume,
};
