/* `none`: one rank holds whole sequences (P = 1); plain data parallelism
 * over the world.  The reference every sequence-parallel strategy must
 * reproduce. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../common/comm.h"
#include "../common/timer.h"
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

static size_t none_lse_elements(const spb_attn_ctx *c)
{
    return (size_t)c->batch * c->heads * c->local_tokens;
}

static spb_attn_desc local_desc(const spb_attn_ctx *c)
{
    long C = (long)c->heads * c->head_dim;
    spb_attn_desc d = {
        .batch = c->batch, .heads = c->heads, .head_dim = c->head_dim,
        .q_len = c->local_tokens, .k_len = c->local_tokens,
        .q_offset = c->token_offset, .k_offset = c->token_offset,
        .causal = 1, .scale = 1.0f / sqrtf((float)c->head_dim),
        .q_token_stride = 3 * C, .q_batch_stride = 3 * C * c->local_tokens,
        .k_token_stride = 3 * C, .k_batch_stride = 3 * C * c->local_tokens,
        .o_token_stride = C, .o_batch_stride = C * c->local_tokens,
    };
    return d;
}

static void none_attention_forward(const spb_attn_ctx *c, const float *qkv, float *o, float *lse)
{
    spb_attn_desc d = local_desc(c);
    long C = (long)c->heads * c->head_dim;
    double t0 = spb_now();
    c->backend->forward(&d, qkv, qkv + C, qkv + 2 * C, o, lse);
    spb_timer_add(SPB_T_ATTENTION, spb_now() - t0);
    *c->flops += 4.0 * d.head_dim * spb_attn_visible_pairs(&d);
}

static void none_attention_backward(const spb_attn_ctx *c, const float *qkv, const float *o, const float *lse,
                                    const float *dout, float *dqkv)
{
    spb_attn_desc d = local_desc(c);
    long C = (long)c->heads * c->head_dim;
    memset(dqkv, 0, sizeof(float) * (size_t)c->batch * c->local_tokens * 3 * C);
    double t0 = spb_now();
    c->backend->backward(&d, qkv, qkv + C, qkv + 2 * C, o, lse, dout, dqkv, dqkv + C, dqkv + 2 * C);
    spb_timer_add(SPB_T_ATTENTION, spb_now() - t0);
    *c->flops += 10.0 * d.head_dim * spb_attn_visible_pairs(&d);
}

static void none_reduce_gradients(const spb_grid *g, float *grads, long n)
{
    if (g->dp_size > 1) spb_allreduce_sum_f32(grads, n, g->dp_comm, SPB_PHASE_GRAD_REDUCE);
}

const spb_strategy spb_strategy_none = {
    .name = "none",
    .summary = "whole sequences per rank, data parallelism only (the reference)",
    .validate = none_validate,
    .lse_elements = none_lse_elements,
    .attention_forward = none_attention_forward,
    .attention_backward = none_attention_backward,
    .reduce_gradients = none_reduce_gradients,
};
