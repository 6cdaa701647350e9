/* CPU fp32 operations of the GPT core.  Activations are [rows][features]
 * row-major where rows = sequences x local tokens; weights are [out][in].
 * Matrix products go through cblas_sgemm and are timed and FLOP-counted. */
#ifndef SPB_OPS_H
#define SPB_OPS_H

#include <math.h>

/* The BLAS in use, e.g. "OpenBLAS Prescott x2 threads", for provenance. */
const char *spb_blas_description(void);

/* FLOPs executed by all matrix products so far (2mnk each). */
double spb_gemm_flops(void);
void spb_gemm_flops_reset(void);
void spb_gemm_flops_add(double flops); /* a device table's products count here too */

/* out[r][o] = sum_i inp[r][i] W[o][i] + b[o]   (b may be NULL) */
void spb_matmul_forward(float *out, const float *inp, const float *W, const float *b, int rows, int in, int out_f);
/* dinp = dout · W   (overwrite if accumulate_dinp is 0, else +=; dinp may be NULL)
 * dW  += doutᵀ · inp;  db += column sums of dout   (db may be NULL) */
void spb_matmul_backward(float *dinp, float *dW, float *db, const float *dout, const float *inp, const float *W,
                         int rows, int in, int out_f, int accumulate_dinp);

/* The same with explicit row strides (out: ldo, inp: ldi, W: ldw, dinp:
 * lddi, dW: lddw), for products on column blocks of larger matrices.
 * accumulate: out += instead of = (the bias is then not added). */
void spb_matmul_forward_ld(float *out, int ldo, const float *inp, int ldi, const float *W, int ldw, const float *b,
                           int rows, int in, int out_f, int accumulate);
void spb_matmul_backward_ld(float *dinp, int lddi, float *dW, int lddw, float *db, const float *dout, int ldo,
                            const float *inp, int ldi, const float *W, int ldw, int rows, int in, int out_f,
                            int accumulate_dinp);

/* y = (x - mean) * rstd * w + b per row; keeps mean and rstd for backward. */
void spb_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                           int rows, int C);
/* dinp += ..., dw += ..., db += ... */
void spb_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                            const float *mean, const float *rstd, int rows, int C);

/* RMSNorm (common/core/ops_llama_cpu.c): y = x · rstd · w, rstd = (mean(x²) + eps)^-1/2
 * per row; backward: dinp +=, dw += (as LayerNorm's).  eps: LayerNorm's, Megatron-LM's
 * --norm-epsilon default; the CUDA kernels (cuda_llama_ops.cu) take the same. */
#define SPB_RMSNORM_EPS 1e-5f
void spb_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int rows, int C);
void spb_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                          const float *rstd, int rows, int C);
/* SwiGLU: inp rows are [gate F | up F]; out = silu(gate) * up, [rows][F].
 * Backward writes d[gate | up] (dinp must not alias dout). */
void spb_swiglu_forward(float *out, const float *inp, int rows, int F);
void spb_swiglu_backward(float *dinp, const float *inp, const float *dout, int rows, int F);
/* Rotary position embedding in place on `heads` consecutive heads of each
 * token row (rotate-half pairs (i, i + D/2), angle pos · base^(-2i/D));
 * token t of each sequence sits at global position positions[t].
 * inverse: rotate back (the transpose: the backward of the rotation). */
void spb_rope_apply(float *x, const long *positions, int batch, int tokens, long token_stride, long batch_stride,
                    int heads, int head_dim, double base, int inverse);
/* The angle of pair i at a global position, in double so that every rank and
 * the device's table (cuda_llama_ops.cu) get the same bits. */
static inline double spb_rope_angle(long position, int pair, int head_dim, double base)
{
    return (double)position * pow(base, -2.0 * pair / head_dim);
}

void spb_gelu_forward(float *out, const float *inp, long n);
/* dinp = dout * gelu'(inp)  (dinp may alias dout) */
void spb_gelu_backward(float *dinp, const float *inp, const float *dout, long n);

/* out[r] = wte[tokens[r]] + wpe[positions[r % T]]: row r is local token
 * r % T of its sequence. */
void spb_embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe, const long *positions,
                           int rows, int T, int C);
void spb_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, const long *positions,
                            int rows, int T, int C);

/* logits -> probabilities in place; returns the sum of -log p[target]. */
double spb_softmax_xent_forward(float *probs_inplace, const int *targets, int rows, int V);
/* probs -> dlogits = scale (probs - onehot(target)) in place. */
void spb_softmax_xent_backward(float *probs_inplace, const int *targets, int rows, int V, float scale);

void spb_add_inplace(float *a, const float *b, long n); /* a += b */

#endif
