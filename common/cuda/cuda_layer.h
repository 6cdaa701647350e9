/* A pre-LN GPT transformer block on the device, and a small GPT (embedding,
 * blocks, final LayerNorm, tied LM head, softmax cross-entropy) built from
 * it, with exactly the CPU core's math and parameter layout (common/core/gpt.c,
 * docs/FORMATS.md):
 *
 *   h = LN1(x);  qkv = h·qkv_wᵀ + qkv_b   [B][T][3][H][D]
 *   a = attention(qkv)  (causal or full, scale 1/sqrt(D))
 *   m = x + a·proj_wᵀ + proj_b
 *   u = GELU_tanh(LN2(m)·fc_wᵀ + fc_b);  y = m + u·fcproj_wᵀ + fcproj_b
 *
 * Types (spb_cuda.h): parameters fp32 master + bf16 copy of the matrices;
 * gradients fp32 accumulated (+=); the residual stream x, m, y and its
 * gradient fp32 (the proj and fcproj products are accumulated in fp32 onto
 * x + bias, so the branch outputs are never rounded to bf16); every other
 * activation and activation gradient bf16; LayerNorm mean/rstd, log-sum-exp
 * and losses fp32.
 *
 * Parameter order of one layer (one flat fp32 vector): ln1_w [C], ln1_b [C],
 * qkv_w [3·H·D][C], qkv_b [3·H·D], proj_w [C][H·D], proj_b [C], ln2_w [C],
 * ln2_b [C], fc_w [F][C], fc_b [F], fcproj_w [C][F], fcproj_b [C] — with
 * H·D = C and F the model's values this is FORMATS.md's layer; with fewer
 * heads or ffn columns (Megatron-SP's shards) the same order at local shapes.
 * The GPT's flat vector is wte [V][C], wpe [maxpos][C], the layers, lnf_w,
 * lnf_b: the CPU core's (global, unsharded) vector, so a copy of
 * spb_gpt.params is a valid device parameter vector.
 *
 * Kernels: the FAST versions (spb_cuda_impl) by default, SIMPLE selectable
 * per layer; the products are cuBLASLt either way. */
#ifndef SPB_CUDA_LAYER_H
#define SPB_CUDA_LAYER_H

#include <stddef.h>

#include "layer_plan.h"
#include "spb_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { SPB_CUDA_LAYER_TENSORS = 12 };

/* Elements of one layer's flat vector for a shape, and each tensor's offset
 * and size (offsets, sizes may be NULL).  Plain host arithmetic. */
long spb_cuda_layer_numel(const spb_cuda_layer_shape *s, long offsets[SPB_CUDA_LAYER_TENSORS],
                          long sizes[SPB_CUDA_LAYER_TENSORS]);

typedef struct spb_cuda_layer spb_cuda_layer;

/* A layer on the current device.  params (fp32 master), params_bf16 (bf16
 * copy, same indexing) and grads (fp32) are device vectors of
 * spb_cuda_layer_numel elements owned by the caller, or NULL: then the layer
 * allocates its own (params not initialised, grads zeroed).  Activations and
 * scratch are allocated here for the shape (spb_cuda_alloc; aborts when the
 * device runs out).  Attention needs D = 64 or 128. */
spb_cuda_layer *spb_cuda_layer_create(const spb_cuda_layer_shape *s, spb_cuda_gemm *g, spb_cuda_impl impl,
                                      float *params, spb_bf16 *params_bf16, float *grads);
void spb_cuda_layer_destroy(spb_cuda_layer *L);
float *spb_cuda_layer_params(spb_cuda_layer *L);
spb_bf16 *spb_cuda_layer_params_bf16(spb_cuda_layer *L);
float *spb_cuda_layer_grads(spb_cuda_layer *L);
const spb_cuda_layer_shape *spb_cuda_layer_get_shape(const spb_cuda_layer *L);
void spb_cuda_layer_set_impl(spb_cuda_layer *L, spb_cuda_impl impl);
/* Epilogue fusion (on by default; in effect with the FAST kernels): the
 * products' biases and the residual adds in cuBLASLt's epilogue (the bias
 * of qkv and fc from the bf16 parameter copy), the residual gradient's
 * column sums and bf16 copy in one pass.  Off: a pass per operation, as
 * the SIMPLE kernels always do.  Returns the previous setting. */
int spb_cuda_layer_set_fusion(spb_cuda_layer *L, int on);
/* Attention through cuDNN's fused kernels (cudnn_attention.h) instead of
 * the flash kernels (on != 0), for a local layer (SPB_LAYER_ATTN_LOCAL):
 * the vendor reference for the layer's time.  -1 with the reason in why
 * where this build has no cuDNN or the layer is not local; 0 otherwise.  A cuDNN
 * call that fails later ends the run with its reason. */
int spb_cuda_layer_set_attention_cudnn(spb_cuda_layer *L, int on, char *why, size_t n);
/* Per-phase timing (on != 0): CUDA events between the layer's phases
 * (LayerNorms, products, attention, GELU, bias and residual passes), from
 * the start of each forward through the backward that follows; off by
 * default (an event per phase).  spb_cuda_layer_phase_times waits for the
 * last event and gives up to max (name, ms) pairs, in order; 0 when off or
 * nothing ran. */
enum { SPB_CUDA_LAYER_PHASES_MAX = 32 };
void spb_cuda_layer_set_phase_timing(spb_cuda_layer *L, int on);
int spb_cuda_layer_phase_times(spb_cuda_layer *L, const char **names, float *ms, int max);
/* Device bytes the layer allocated itself (activations, scratch, and its
 * own parameter vectors if any). */
size_t spb_cuda_layer_bytes(const spb_cuda_layer *L);
/* Refreshes the bf16 copy from the fp32 master (after an upload or update). */
void spb_cuda_layer_sync_params(spb_cuda_layer *L, cudaStream_t s);

/* x, y: fp32 [B][T][C] device.  Keeps what backward needs, including the
 * pointer x (x must stay unchanged until the backward). */
void spb_cuda_layer_forward(spb_cuda_layer *L, const float *x, float *y, cudaStream_t s);
/* dx: on entry d loss/d y, on exit d loss/d x (fp32, in place); every
 * parameter gradient accumulated (+=). */
void spb_cuda_layer_backward(spb_cuda_layer *L, float *dx, cudaStream_t s);

/* ---- a small GPT: the CPU core's model, whole sequences (P = 1) ---------- */
typedef struct spb_cuda_gpt spb_cuda_gpt;
/* L layers of (C, H heads of C/H, F), vocabulary V, maxpos positions; B
 * sequences of T tokens (T <= maxpos; positions 0..T-1). */
spb_cuda_gpt *spb_cuda_gpt_create(int L, int C, int H, int F, int V, int maxpos, int B, int T, int causal,
                                  spb_cuda_gemm *g, spb_cuda_impl impl);
void spb_cuda_gpt_destroy(spb_cuda_gpt *m);
long spb_cuda_gpt_numel(const spb_cuda_gpt *m);
/* Uploads the fp32 flat vector (host, spb_cuda_gpt_numel elements) and
 * refreshes the bf16 copies. */
void spb_cuda_gpt_set_params(spb_cuda_gpt *m, const float *host_params);
/* Downloads the fp32 gradients (host). */
void spb_cuda_gpt_get_grads(const spb_cuda_gpt *m, float *host_grads);
void spb_cuda_gpt_zero_grads(spb_cuda_gpt *m);
/* inputs, targets: host [B][T].  Returns the sum over the B·T tokens of
 * -log p(target) (like spb_gpt_forward); synchronises. */
double spb_cuda_gpt_forward(spb_cuda_gpt *m, const int *inputs, const int *targets);
/* Adds d(loss_scale · sum of token losses)/d(params) to the gradients. */
void spb_cuda_gpt_backward(spb_cuda_gpt *m, float loss_scale);

#ifdef __cplusplus
}
#endif

#endif
