/* Attention over a rank's own tokens, for strategies that need no
 * communication around it.  The tokens must be at contiguous positions. */
#ifndef SPB_LOCAL_ATTENTION_H
#define SPB_LOCAL_ATTENTION_H

#include "strategy.h"

/* Descriptor for attention of the ctx's tokens among themselves, Q/K/V read
 * from a fused [B][tokens][3][heads][D] buffer. */
spb_attn_desc spb_attn_local_desc(const spb_attn_ctx *c);
size_t spb_local_attention_saved_floats(const spb_attn_ctx *c);
void spb_local_attention_forward(const spb_attn_ctx *c, const float *qkv, float *o, float *lse);
void spb_local_attention_backward(const spb_attn_ctx *c, const float *qkv, const float *o, const float *lse,
                                  const float *dout, float *dqkv);

#endif
