/* The emulated bf16 table's compute operations (backend.h's contracts, ops.h's
 * arithmetic): each loads its arguments' storage as fp32 (exact), runs the
 * CPU's fp32 function (fp32 accumulation in every sum and product) and
 * rounds what it wrote once, to the storage's type (bf16_frame.h). */
#ifndef SPB_BF16_OPS_H
#define SPB_BF16_OPS_H

#include "attention.h"

void spb_bf16_matmul_forward(float *out, const float *inp, const float *W, const float *b, int rows, int in,
                             int out_f);
void spb_bf16_matmul_backward(float *dinp, float *dW, float *db, const float *dout, const float *inp,
                              const float *W, int rows, int in, int out_f, int accumulate_dinp);
void spb_bf16_matmul_forward_ld(float *out, int ldo, const float *inp, int ldi, const float *W, int ldw,
                                const float *b, int rows, int in, int out_f, int accumulate);
void spb_bf16_matmul_backward_ld(float *dinp, int lddi, float *dW, int lddw, float *db, const float *dout, int ldo,
                                 const float *inp, int ldi, const float *W, int ldw, int rows, int in, int out_f,
                                 int accumulate_dinp);
void spb_bf16_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, int rows, int C);
void spb_bf16_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, const float *mean, const float *rstd, int rows, int C);
void spb_bf16_gelu_forward(float *out, const float *inp, long n);
void spb_bf16_gelu_backward(float *dinp, const float *inp, const float *dout, long n);
void spb_bf16_embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                                const long *positions, int rows, int T, int C);
void spb_bf16_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                                 const long *positions, int rows, int T, int C);
double spb_bf16_softmax_xent_forward(float *probs, const int *targets, int rows, int V);
void spb_bf16_softmax_xent_backward(float *probs, const int *targets, int rows, int V, float scale);
void spb_bf16_add_inplace(float *a, const float *b, long n);
void spb_bf16_add_bias_rows(float *x, const float *b, long rows, int C);
void spb_bf16_bias_grad_rows(float *db, const float *dy, long rows, int C);
double spb_bf16_sum_squares(const float *x, long n);
void spb_bf16_attn_merge(float *o_acc, float *lse_acc, const float *o_pair, const float *lse_pair, int batch,
                         int heads, int head_dim, int T, int row, int len);
/* The CPU attention kernel of that name behind handle resolution (its
 * log-sum-exp output stays fp32), or NULL. */
const spb_attn_backend *spb_bf16_attention(const char *name);

#endif
