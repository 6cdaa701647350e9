/* cuDNN's fused flash attention, a second attention backend beside
 * spbench's own kernels (issue: "strategies are attention-agnostic", and a
 * vendor reference).  Built through cuDNN 9's C graph API (the backend
 * descriptors), with the operation graph that cuDNN's fused SDPA engines
 * recognise: Q·Kᵀ, scale, causal mask, softmax with its statistics, ·V
 * forward; the recomputing backward with an fp32 dQ accumulator.
 *
 * Contract: attention.h's descriptor and strides, on 16-bit storage (bf16,
 * or fp16 for --precision fp16 runs: one type per call):
 *   q k v o dout  bf16/fp16 at the descriptor's strides;
 *   lse           fp32 [B][H][q_len], natural log of the scaled scores
 *                 (cuDNN's "Stats" are exactly that);
 *   dq dk dv      bf16/fp16, OVERWRITTEN (cuDNN writes, it does not add), at Q's
 *                 and K's strides.  Callers that accumulate add them.
 * The backward takes O and lse as given, so ring attention's merged O and
 * lse work as with the flash kernel.
 *
 * What the graph covers (spb_cudnn_attention_supported says why not):
 * as many K/V heads as query heads (grouped-query calls are expanded first:
 * cuda_attention_gqa.h), dense masks (no blocked-sparse pattern), head dim a multiple of 8 up to
 * 128, strides multiples of 8 elements with 16-byte aligned pointers, and a
 * causal mask whose rows all see key 0 (q_offset >= k_offset: every block
 * the strategies call; a query block behind its key block would leave rows
 * with no key).  Causal offsets become a shifted diagonal (row + shift >=
 * col); blocks entirely below the diagonal run unmasked.
 *
 * Plans (operation graph, heuristics' engine, execution plan) are cached per
 * shape, strides and mask; the workspace only grows.  Calls run on stream s.
 * A forward with no query rows, or a backward with no rows or no keys,
 * returns 0 at once and writes nothing (there is nothing to add).
 * Every function returns 0 on success and -1 with a reason in why (the
 * cuDNN call, its status and file:line) otherwise; only running out of device
 * memory aborts (spb_cuda_grow), as everywhere in the project. */
#ifndef SPB_CUDNN_ATTENTION_H
#define SPB_CUDNN_ATTENTION_H

#include <stddef.h>

#include "spb_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The 16-bit type of a call's operands. */
typedef enum spb_cudnn_half { SPB_CUDNN_BF16 = 0, SPB_CUDNN_FP16 = 1 } spb_cudnn_half;

/* Whether this build has cuDNN (SPB_HAVE_CUDNN at configure time). */
int spb_cudnn_attention_built(void);
/* Host-only: 1 if the graph covers d, else 0 with the reason in why. */
int spb_cudnn_attention_supported(const spb_attn_desc *d, char *why, size_t n);

int spb_cudnn_attention_forward(const spb_attn_desc *d, spb_cudnn_half type, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                spb_bf16 *o, float *lse, cudaStream_t s, char *why, size_t n);
int spb_cudnn_attention_backward(const spb_attn_desc *d, spb_cudnn_half type, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                 const spb_bf16 *o, const float *lse, const spb_bf16 *dout, spb_bf16 *dq, spb_bf16 *dk,
                                 spb_bf16 *dv, cudaStream_t s, char *why, size_t n);

/* Builds and finalizes every tensor and operation descriptor of the
 * forward (backward = 0) or backward graph of d, without a handle or a GPU
 * (the operation graph, the engine and the plan need one).  Returns the
 * number of operations, or -1 with why.  The CPU tests' hold on the graph. */
int spb_cudnn_attention_describe(const spb_attn_desc *d, spb_cudnn_half type, int backward, char *why, size_t n);

/* "cuDNN 9.19.0 (headers 9.19.0)", or why it is not available. */
const char *spb_cudnn_attention_version(void);

#ifdef __cplusplus
}
#endif

#endif
