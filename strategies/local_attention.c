/* Attention over the tokens a rank already holds (no communication): what
 * `none` does with whole sequences and Megatron-SP does inside its
 * tensor-parallel region (all N tokens, H/P heads). */
#include <math.h>
#include <string.h>

#include "backend.h"
#include "timer.h"
#include "local_attention.h"

/* K/V heads of the rank's qkv (0 in the context: as many as query heads). */
static int kv_heads(const spb_attn_ctx *c) { return c->kv_heads > 0 ? c->kv_heads : c->heads; }
/* Floats of one token's qkv row: [q: heads | k: kv | v: kv] heads of D. */
static long qkv_row(const spb_attn_ctx *c) { return (long)(c->heads + 2 * kv_heads(c)) * c->head_dim; }
/* Where K and V start in a token's row. */
static long k_at(const spb_attn_ctx *c) { return (long)c->heads * c->head_dim; }
static long v_at(const spb_attn_ctx *c) { return k_at(c) + (long)kv_heads(c) * c->head_dim; }

spb_attn_desc spb_attn_local_desc(const spb_attn_ctx *c)
{
    long W = qkv_row(c);
    spb_attn_desc d = {
        .batch = c->batch, .heads = c->heads, .kv_heads = kv_heads(c), .head_dim = c->head_dim,
        .q_len = c->tokens, .k_len = c->tokens,
        .q_offset = c->positions[0], .k_offset = c->positions[0],
        .causal = c->causal, .scale = 1.0f / sqrtf((float)c->head_dim),
        .q_token_stride = W, .q_batch_stride = W * c->tokens,
        .k_token_stride = W, .k_batch_stride = W * c->tokens,
        .o_token_stride = (long)c->heads * c->head_dim, .o_batch_stride = (long)c->heads * c->head_dim * c->tokens,
        /* blocked-sparse pattern (docs/SPARSE.md); no cfg (unit tests): dense */
        .sparse_block = c->cfg ? c->cfg->sparse_block : 0, .sparse_local = c->cfg ? c->cfg->sparse_local_blocks : 0,
        .sparse_global = c->cfg ? c->cfg->sparse_global_blocks : 0,
    };
    return d;
}

size_t spb_local_attention_saved_floats(const spb_attn_ctx *c)
{
    return (size_t)c->batch * c->heads * c->tokens; /* log-sum-exp */
}

void spb_local_attention_forward(const spb_attn_ctx *c, const float *qkv, float *o, float *lse)
{
    spb_attn_desc d = spb_attn_local_desc(c);
    spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
    c->backend->forward(&d, qkv, qkv + k_at(c), qkv + v_at(c), o, lse);
    spb_timer_end(timed);
    *c->flops += 4.0 * d.head_dim * spb_attn_visible_pairs(&d);
}

void spb_local_attention_backward(const spb_attn_ctx *c, const float *qkv, const float *o, const float *lse,
                                  const float *dout, float *dqkv)
{
    spb_attn_desc d = spb_attn_local_desc(c);
    long n = (long)c->batch * c->tokens * qkv_row(c);
    if (c->device)
        c->device->zero(dqkv, n); /* the buffers are the device's */
    else
        memset(dqkv, 0, sizeof(float) * (size_t)n);
    spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
    c->backend->backward(&d, qkv, qkv + k_at(c), qkv + v_at(c), o, lse, dout, dqkv, dqkv + k_at(c), dqkv + v_at(c));
    spb_timer_end(timed);
    *c->flops += 10.0 * d.head_dim * spb_attn_visible_pairs(&d);
}
