/* Grouped-query attention (G K/V heads < H query heads) through an
 * attention backend that takes as many K/V heads as query heads: cuDNN's
 * graph here (cudnn_attention.h).  What HF's repeat_kv does, on the device:
 *
 *   forward   K and V are copied to H heads, query head h's copy being K/V
 *             head h / (H/G) (attention.h's spb_attn_kv_head), into a
 *             workspace [B][k_len][H][D] (contiguous); the H-head backend
 *             runs on the copies (spb_attn_gqa_expanded_desc).
 *   backward  the same copies; the backend's dK, dV of the copies go to a
 *             zeroed fp32 workspace of the same layout, then each K/V head's
 *             gradient, the sum of its H/G copies' in head order, is ADDED
 *             (+=) to the caller's dK, dV at their strides: the backends'
 *             accumulating contract (attention.h), whatever the inner
 *             backend does with its own (cuDNN overwrites its 16-bit ones;
 *             cuda_attention_cudnn.cu adds them to the fp32 it is given).
 *
 * Correct by construction around any backend on these contracts, so the
 * same wrapper runs around spbench's own kernels where cuDNN is absent (the
 * emulation: gpu-check's "gqa expanded" checks) and around cuDNN on a GPU.
 * The price: the copies (2·B·k_len·H·D elements of the operands' type) and
 * in the backward their fp32 gradients (8·B·k_len·H·D bytes), all
 * SPB_MEM_WORKSPACE (growing buffers, spb_cuda_grow), against a native GQA
 * graph's none.  Calls run on the legacy stream 0, like the cuDNN table's. */
#ifndef SPB_CUDA_ATTENTION_GQA_H
#define SPB_CUDA_ATTENTION_GQA_H

#include "spb_cuda.h" /* attention.h, spb_bf16 */

/* The descriptor of the expanded call: kv_heads = heads, K and V (dK, dV)
 * contiguous [B][k_len][H][D]; Q, O and the mask as d's.   Host code, so the
 * CPU tests can hand it to cuDNN's descriptor checks (test_cudnn_graph.c). */
static inline spb_attn_desc spb_attn_gqa_expanded_desc(const spb_attn_desc *d)
{
    spb_attn_desc e = *d;
    e.kv_heads = d->heads;
    e.k_token_stride = (long)d->heads * d->head_dim;
    e.k_batch_stride = (long)d->k_len * e.k_token_stride;
    return e;
}

/* Elements of one expanded copy (K or V): B·k_len·H·D. */
static inline long spb_attn_gqa_expanded_elems(const spb_attn_desc *d)
{
    return d->batch > 0 && d->k_len > 0 ? (long)d->batch * d->k_len * d->heads * d->head_dim : 0;
}

/* Workspace bytes the wrapper holds after a call of d with elem_bytes
 * copies (forward: the copies; backward: and their fp32 gradients), from
 * nothing held before; the memory model's count (memory_model.c). */
static inline double spb_attn_gqa_workspace_bytes(const spb_attn_desc *d, int elem_bytes, int backward)
{
    return (double)spb_attn_gqa_expanded_elems(d) * (2.0 * elem_bytes + (backward ? 8.0 : 0.0));
}

#ifdef __cplusplus
extern "C" {
#endif

/* Frees the wrapper's workspaces (the next call allocates them again): the
 * GPU check's measurement of what a call holds starts from nothing. */
void spb_cuda_gqa_release(void);

/* ek, ev [B][k_len][H][D] = K, V of d (kv_heads heads at d's strides),
 * elem_bytes 4 (fp32) or 2 (bf16/fp16 bits).  own_interval: the launch is a
 * kernel-timeline interval of its own; 0 inside a caller's (no nesting). */
void spb_cuda_gqa_expand_kv(const spb_attn_desc *d, const void *k, const void *v, void *ek, void *ev, int elem_bytes,
                            int own_interval);
/* dK, dV of d (+=, at d's strides) the group sums of edk, edv
 * ([B][k_len][H][D] fp32): K/V head g gets copies g·H/G .. (g+1)·H/G − 1,
 * added in that order. */
void spb_cuda_gqa_sum_groups(const spb_attn_desc *d, const float *edk, const float *edv, float *dk, float *dv,
                             int own_interval);

/* The fp32 table's contract (attention.h) through mha, an H-head backend. */
void spb_cuda_gqa_forward(const spb_attn_backend *mha, const spb_attn_desc *d, const float *q, const float *k,
                          const float *v, float *o, float *lse);
void spb_cuda_gqa_backward(const spb_attn_backend *mha, const spb_attn_desc *d, const float *q, const float *k,
                           const float *v, const float *o, const float *lse, const float *dout, float *dq, float *dk,
                           float *dv);

/* The direct path's contract (bf16_direct.h's cudnn_attention_*): 16-bit
 * operands, fp32 dQ, dK, dV accumulated; 0 when mha ran, its -1 when it
 * declined (nothing written then).  Inside the caller's timeline interval. */
typedef int (*spb_gqa_half_forward_fn)(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k,
                                       const spb_bf16 *v, spb_bf16 *o, float *lse);
typedef int (*spb_gqa_half_backward_fn)(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k,
                                        const spb_bf16 *v, const spb_bf16 *o, const float *lse, const spb_bf16 *dout,
                                        float *dq, float *dk, float *dv);
int spb_cuda_gqa_half_forward(spb_gqa_half_forward_fn mha, const spb_attn_desc *d, const spb_bf16 *q,
                              const spb_bf16 *k, const spb_bf16 *v, spb_bf16 *o, float *lse);
int spb_cuda_gqa_half_backward(spb_gqa_half_backward_fn mha, const spb_attn_desc *d, const spb_bf16 *q,
                               const spb_bf16 *k, const spb_bf16 *v, const spb_bf16 *o, const float *lse,
                               const spb_bf16 *dout, float *dq, float *dk, float *dv);

#ifdef __cplusplus
}
#endif

#endif
