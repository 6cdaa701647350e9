/* The fp32 CUDA operations of Llama-style layers (issue 35): RMSNorm,
 * SwiGLU and rotary position embedding, with common/core/ops.h's contracts
 * (spb_rmsnorm_*, spb_swiglu_*, spb_rope_apply; pointers are device
 * buffers except rope's positions, the core's host array).  Entries of the
 * fp32 CUDA table (cuda_backend.cu); the 16-bit tables run them on fp32
 * copies through it (bf16_ops.c). */
#ifndef SPB_CUDA_LLAMA_OPS_H
#define SPB_CUDA_LLAMA_OPS_H

#ifdef __cplusplus
extern "C" {
#endif

void spb_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int rows, int C);
void spb_cuda_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                               const float *rstd, int rows, int C);
void spb_cuda_swiglu_forward(float *out, const float *inp, int rows, int F);
void spb_cuda_swiglu_backward(float *dinp, const float *inp, const float *dout, int rows, int F);
void spb_cuda_rope_apply(float *x, const long *positions, int batch, int tokens, long token_stride,
                         long batch_stride, int heads, int head_dim, double base, int inverse);

#ifdef __cplusplus
}
#endif

#endif
