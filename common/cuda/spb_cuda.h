/* CUDA backend of the GPT core: device memory, bf16 storage with fp32
 * accumulation, matrix products through cuBLASLt, the elementwise and
 * row-wise kernels, flash attention and the Ulysses layout permutes.
 * C interface (C11 callers; the CUDA C implementation is in the .cu files here).
 *
 * Data types (one choice per tensor, as a bf16 training step would use them):
 *   parameters: fp32 master (optimizer) + bf16 copy (products, embedding)
 *   parameter gradients: fp32, accumulated (+=) like the CPU core
 *   residual stream x and its gradient: fp32 (embedding out, LN in, residual add)
 *   every other activation and activation gradient: bf16
 *   LayerNorm mean/rstd, attention log-sum-exp, losses: fp32
 * Layouts and conventions are the CPU core's (ops.h, attention.h).
 *
 * Most kernels come twice, selected by spb_cuda_impl: SIMPLE, written to be
 * obviously right (one thread per element/row/column, serial loops like
 * ops_cpu.c), and FAST (warp/block cooperation, vector loads, tensor cores).
 * The check program (experiments/gpu_check.cu) holds both against the CPU. */
#ifndef SPB_CUDA_H
#define SPB_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "attention.h" /* C headers without their own extern "C" */
#include "memory.h"
#include "cuda_device.h"

typedef uint16_t spb_bf16; /* bits of a bfloat16 (same as __nv_bfloat16) */

typedef enum spb_cuda_impl { SPB_CUDA_SIMPLE = 0, SPB_CUDA_FAST = 1 } spb_cuda_impl;
const char *spb_cuda_impl_name(spb_cuda_impl impl);

/* ---- device memory: cudaMalloc with per-category accounting ------------- */
/* No managed memory.  Aborts (SPB_DIE) when cudaMalloc fails.  Not zeroed. */
void *spb_cuda_alloc(spb_mem_category cat, size_t bytes);
void spb_cuda_free(void *p); /* NULL is fine */
size_t spb_cuda_size(const void *p);
/* A buffer that only grows: *buf holds at least `bytes` on return (the old
 * contents are not kept), reallocated under cat when it was smaller.
 * Workspaces used on every step keep one, because cudaFree synchronises the
 * device (and would stall the host behind a transfer in flight). */
void *spb_cuda_grow(void **buf, size_t *cap, spb_mem_category cat, size_t bytes);
/* Device-side current/peak bytes per category (the host allocator's
 * categories, separate counters). */
const spb_mem_stats *spb_cuda_mem_stats(void);
void spb_cuda_mem_reset_peaks(void);

/* ---- bf16 conversions ---------------------------------------------------- */
void spb_cuda_f32_to_bf16(spb_bf16 *out, const float *in, long n, cudaStream_t s); /* round to nearest even */
void spb_cuda_bf16_to_f32(float *out, const spb_bf16 *in, long n, cudaStream_t s);

/* ---- matrix products -------------------------------------------------------
 * Row-major C[m][n] = alpha op(A)[m][k] op(B)[k][n] + beta C, A and B bf16,
 * fp32 compute, C bf16 (c_f32 = 0) or fp32 (c_f32 = 1).  cuBLASLt, with the
 * heuristic's algorithm cached per (shape, layout, types). */
typedef struct spb_cuda_gemm spb_cuda_gemm;
spb_cuda_gemm *spb_cuda_gemm_create(size_t workspace_bytes);
void spb_cuda_gemm_destroy(spb_cuda_gemm *g);
void spb_cuda_gemm_bf16(spb_cuda_gemm *g, int transA, int transB, int m, int n, int k, float alpha,
                        const spb_bf16 *A, int lda, const spb_bf16 *B, int ldb, float beta, void *C, int ldc,
                        int c_f32, cudaStream_t s);
/* The same with fp16 operands (and fp16 C when !c_f32) where fp16 != 0:
 * --precision fp16's products (CUDA_R_16F, fp32 compute). */
void spb_cuda_gemm_half(spb_cuda_gemm *g, int fp16, int transA, int transB, int m, int n, int k, float alpha,
                        const spb_bf16 *A, int lda, const spb_bf16 *B, int ldb, float beta, void *C, int ldc,
                        int c_f32, cudaStream_t s);
/* D[m][n] = alpha op(A) op(B) + beta C (+ bias[j] for every row), C read
 * from one buffer (not read when beta = 0; may be NULL then) and D written
 * to another, or the same: one pass over the output, the bias added in
 * cuBLASLt's epilogue.  C, D and bias share D's type (the header's rule
 * for the bias): fp32 where c_f32, else the 16-bit operand type.  bias NULL:
 * no epilogue. */
void spb_cuda_gemm_epilogue(spb_cuda_gemm *g, int fp16, int transA, int transB, int m, int n, int k, float alpha,
                            const spb_bf16 *A, int lda, const spb_bf16 *B, int ldb, float beta, const void *C,
                            void *D, int ldc, int c_f32, const void *bias, cudaStream_t s);
/* The fp32 reference product (simple kernel, one thread per output, fp32
 * everything); same row-major convention. */
void spb_cuda_sgemm_simple(int transA, int transB, int m, int n, int k, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc, cudaStream_t s);

/* ops.h's conventions: out[r][o] = sum_i inp[r][i] W[o][i] + b[o] (b fp32,
 * may be NULL), out bf16 or fp32. */
void spb_cuda_matmul_forward(spb_cuda_gemm *g, void *out, int out_f32, const spb_bf16 *inp, const spb_bf16 *W,
                             const float *b, int rows, int in, int out_f, cudaStream_t s);
/* dinp (bf16) = or += dout·W (may be NULL);  dW (fp32) += doutᵀ·inp;
 * db (fp32) += column sums of dout (may be NULL). */
void spb_cuda_matmul_backward(spb_cuda_gemm *g, spb_bf16 *dinp, float *dW, float *db, const spb_bf16 *dout,
                              const spb_bf16 *inp, const spb_bf16 *W, int rows, int in, int out_f,
                              int accumulate_dinp, spb_cuda_impl impl, cudaStream_t s);

/* ---- row-wise and elementwise kernels ------------------------------------ */
/* out (fp32) [rows][C] = wte[tokens[r]] + wpe[positions[r % T]]  (bf16 tables;
 * tokens, positions on the device: int32 and int64). */
void spb_cuda_embedding_forward(float *out, const int *tokens, const spb_bf16 *wte, const spb_bf16 *wpe,
                                const long *positions, int rows, int T, int C, spb_cuda_impl impl, cudaStream_t s);
/* dwte += , dwpe +=  (fp32, atomics: rows may share a token). */
void spb_cuda_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                                 const long *positions, int rows, int T, int C, spb_cuda_impl impl, cudaStream_t s);
/* out bf16 = (x - mean) rstd w + b, inp fp32, w b fp32; mean rstd fp32 saved. */
void spb_cuda_layernorm_forward(spb_bf16 *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, int rows, int C, spb_cuda_impl impl, cudaStream_t s);
/* dinp (fp32) +=, dw += , db +=  (dout bf16). */
void spb_cuda_layernorm_backward(float *dinp, float *dw, float *db, const spb_bf16 *dout, const float *inp,
                                 const float *w, const float *mean, const float *rstd, int rows, int C,
                                 spb_cuda_impl impl, cudaStream_t s);
/* FAST LayerNorm in row blocks (on by default): 256 threads per row, the row
 * in registers, read once; the backward's dx and dw/db in one kernel.  For
 * C = 1024, 2048, 4096, 8192 with 16-byte aligned fp32 vectors; other
 * shapes, and off, take the warp-per-row kernels.  Returns the previous
 * setting (process-wide, like the attention switches). */
int spb_cuda_layernorm_set_row_blocks(int on);
/* tanh GELU, bf16 in and out; backward: dinp = dout gelu'(inp) (may alias dout). */
void spb_cuda_gelu_forward(spb_bf16 *out, const spb_bf16 *inp, long n, spb_cuda_impl impl, cudaStream_t s);
void spb_cuda_gelu_backward(spb_bf16 *dinp, const spb_bf16 *inp, const spb_bf16 *dout, long n, spb_cuda_impl impl,
                            cudaStream_t s);
/* The same (dinp [rows][n], in place allowed) and db (fp32) += the column
 * sums of the bf16 dinp it wrote, in one pass (FAST; else the two calls). */
void spb_cuda_gelu_backward_bias_grad(spb_bf16 *dinp, const spb_bf16 *inp, const spb_bf16 *dout, float *db, int rows,
                                      int n, spb_cuda_impl impl, cudaStream_t s);
/* a (fp32) += b (bf16): the residual add. */
void spb_cuda_residual_add(float *a, const spb_bf16 *b, long n, spb_cuda_impl impl, cudaStream_t s);
/* db (fp32) += column sums of dout (bf16) [rows][n]. */
void spb_cuda_bias_grad(float *db, const spb_bf16 *dout, int rows, int n, spb_cuda_impl impl, cudaStream_t s);
/* losses[r] = -log softmax(logits[r])[targets[r]] (fp32); logits bf16 [rows][V]. */
void spb_cuda_softmax_xent_forward(float *losses, const spb_bf16 *logits, const int *targets, int rows, int V,
                                   spb_cuda_impl impl, cudaStream_t s);
/* dlogits (bf16, may alias logits) = scale (softmax(logits) - onehot(target)). */
void spb_cuda_softmax_xent_backward(spb_bf16 *dlogits, const spb_bf16 *logits, const int *targets, int rows, int V,
                                    float scale, spb_cuda_impl impl, cudaStream_t s);
/* AdamW, optimizer.c's spb_adamw_apply arithmetic on fp32 master p, grad, m,
 * v; writes the bf16 copy p_bf16 (may be NULL).  step >= 1. */
void spb_cuda_adamw(float *p, spb_bf16 *p_bf16, const float *grad, float *m, float *v, long n, float grad_scale,
                    float weight_decay, float beta1, float beta2, float eps, long step, float lr,
                    spb_cuda_impl impl, cudaStream_t s);

/* ---- Ulysses layouts (ulysses_layout.h for the index maps) --------------- */
/* natural local [B][T][w][P·Hp][D] -> send blocks [P][B][T][w][Hp][D] and back. */
void spb_cuda_ulysses_pack(spb_bf16 *blocks, const spb_bf16 *natural, int P, int B, int T, int w, int Hp, int D,
                           spb_cuda_impl impl, cudaStream_t s);
void spb_cuda_ulysses_unpack(spb_bf16 *natural, const spb_bf16 *blocks, int P, int B, int T, int w, int Hp, int D,
                             spb_cuda_impl impl, cudaStream_t s);
/* received blocks [P][B][T·w·Hp·D] -> head layout [B][N][w][Hp][D] (ulysses.c's
 * blocks_to_head) and back (head_to_blocks). */
void spb_cuda_ulysses_blocks_to_head(spb_bf16 *head, const spb_bf16 *blocks, int P, int B, int T, int w, int Hp,
                                     int D, spb_cuda_impl impl, cudaStream_t s);
void spb_cuda_ulysses_head_to_blocks(spb_bf16 *blocks, const spb_bf16 *head, int P, int B, int T, int w, int Hp,
                                     int D, spb_cuda_impl impl, cudaStream_t s);

/* ---- flash attention ----------------------------------------------------------
 * attention.h's descriptor, strides and semantics; q k v o dout bf16, lse fp32
 * [B][H][q_len], dq dk dv fp32 ACCUMULATED (+=) with Q's and K's strides.
 * Head dim 64 or 128.  FAST = tensor cores (mma.sync m16n8k16 bf16, ldmatrix,
 * cp.async; sm_80+):
 * needs token strides and batch strides that are multiples of 8 elements and
 * 16-byte aligned pointers (q k v o, and dout and dq in the backward);
 * otherwise it falls back to SIMPLE (returns 0 then, 1 when the fast kernel
 * ran). */
int spb_cuda_attention_forward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                               spb_bf16 *o, float *lse, spb_cuda_impl impl, cudaStream_t s);
/* workspace: fp32 [B][H][q_len] for D_i = dO_i·O_i (caller's, spb_cuda_alloc). */
int spb_cuda_attention_backward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                const spb_bf16 *o, const float *lse, const spb_bf16 *dout, float *dq, float *dk,
                                float *dv, float *workspace, spb_cuda_impl impl, cudaStream_t s);
/* The same kernels on fp16 storage where fp16 != 0 (q k v o dout fp16;
 * the tensor-core instruction is mma.sync m16n8k16 f16). */
int spb_cuda_attention_forward_half(const spb_attn_desc *d, int fp16, const spb_bf16 *q, const spb_bf16 *k,
                                    const spb_bf16 *v, spb_bf16 *o, float *lse, spb_cuda_impl impl, cudaStream_t s);
int spb_cuda_attention_backward_half(const spb_attn_desc *d, int fp16, const spb_bf16 *q, const spb_bf16 *k,
                                     const spb_bf16 *v, const spb_bf16 *o, const float *lse, const spb_bf16 *dout,
                                     float *dq, float *dk, float *dv, float *workspace, spb_cuda_impl impl,
                                     cudaStream_t s);
/* Rows per block of the FAST kernels: 128 (8 warps, the default) or 64 (4
 * warps), for the GPU check to time both; returns the previous value. */
int spb_cuda_attention_set_block_rows(int rows);
/* FAST backward: dQ inside the dK/dV kernel with fp32 reductions (on != 0;
 * FlashAttention-2's way, 5 products per pair, dQ's rounding order varies
 * between runs) or in its own kernel (0, the default: 7 products,
 * deterministic); returns the previous setting. */
int spb_cuda_attention_set_fused_dq(int on);
/* FAST forward on Hopper's warpgroup products (wgmma, sm_90a) instead of
 * mma.sync, in the same block shapes (2 warpgroups for 128 rows, 1 for 64);
 * the backward has its own switch (below).  Dies where unavailable;
 * returns the previous setting. */
int spb_cuda_attention_set_fwd_wgmma(int on);
/* Keys per streamed tile of the wgmma forward: 64 (the default) or 128;
 * the mma.sync kernels and the backward keep 64.  Returns the previous value. */
int spb_cuda_attention_set_fwd_key_block(int keys);
/* FAST backward on warpgroup products too: dQ in its own kernel, as the
 * default, or with set_fused_dq one kernel of 128 keys per block
 * (FlashAttention-3's five products: dS through shared memory to dQ, added
 * by 8-byte reductions or, with set_bwd_dq_bulk, by the copy engine; the
 * backward dies if it is on with 64-row blocks).  Dies where unavailable;
 * returns the previous setting. */
int spb_cuda_attention_set_bwd_wgmma(int on);
/* Blocks per SM the FAST forward (mma.sync or wgmma) is compiled for: 1
 * (the default: as many registers as it takes, 8 warps per SM at head dim
 * 128) or 2 (registers capped at 128 so that two 128-row blocks share an
 * SM; needs 128-row blocks and, on wgmma, 64-key tiles, else the forward
 * dies).  Returns the previous value. */
int spb_cuda_attention_set_fwd_blocks_per_sm(int blocks);
/* The wgmma forward with FlashAttention-3's intra-warpgroup overlap (the
 * next tile's S = Q·Kᵀ and this tile's P·V issued together, the softmax
 * computed while P·V runs), on != 0; needs the wgmma forward, 64-key
 * tiles and one block per SM, else the forward dies; either block shape.
 * Returns the previous setting. */
int spb_cuda_attention_set_fwd_pipelined(int on);
/* The wgmma forward as FlashAttention-3 feeds it (on != 0): a producer warp
 * copies Q, K and V by the copy engine (TMA, 128-byte-swizzled tiles)
 * through mbarriers into two stages, and two consumer warpgroups only
 * compute; 128-row blocks, one per SM, the key-block switch's 64 or 128
 * keys per tile.  Dies unless spb_cuda_attention_wgmma_available; the
 * forward dies if it is on without the wgmma forward, with the pipelined
 * one, 64-row blocks or 2 blocks per SM.  Returns the previous setting. */
int spb_cuda_attention_set_fwd_tma(int on);
/* Rows per warp of the mma.sync FAST forward: 16 (the default) or 32
 * (FlashAttention-2's forward tiling: 4 warps of 32 rows per 128-row
 * block, registers for two blocks per SM, each K/V fragment feeding two
 * products); needs the mma.sync forward, 128-row blocks and the blocks
 * switch at 1, else the forward dies.  Returns the previous value. */
int spb_cuda_attention_set_fwd_rows_per_warp(int rows);
/* The mma.sync FAST backward on FlashAttention-2's tiling (on != 0): one
 * kernel, 8 warps holding 128 keys, per 64-query tile S and dP in 32 x 32
 * warp tiles, P and dS through shared memory to the dV, dK and dQ products
 * in their own warp layouts, dQ by 8-byte fp32 reductions; needs 128-row
 * blocks, the fused dQ switch on and the mma.sync backward, else the
 * backward dies.  Returns the previous setting. */
int spb_cuda_attention_set_bwd_exchange(int on);
/* The fused dQ of the exchange or the wgmma backward as FlashAttention-3
 * adds it (on != 0): each tile staged in shared memory and added to dq a
 * row at a time by the copy engine (cp.reduce.async.bulk), one instruction
 * per row instead of a reduction per pair.  Dies unless
 * spb_cuda_attention_wgmma_available (a 9.0 GPU and sm_90a code); the
 * backward dies if it is on without the exchange switch or the wgmma
 * backward with the fused dQ.  Returns the previous setting. */
int spb_cuda_attention_set_bwd_dq_bulk(int on);
/* The fused wgmma backward as FlashAttention-3 feeds it: a producer warp
 * copies K and V once and Q and dO per tile by the copy engine (TMA,
 * 128-byte-swizzled tiles) through mbarriers into two stages, and two
 * consumer warpgroups only compute, meeting once per tile at a named
 * barrier; with set_bwd_dq_bulk a second producer warp hands dQ to the
 * copy engine.  schedule: 0 off, 1 the fused kernel's order of products,
 * 2 FlashAttention-3's overlap of the exponentials and dS with the
 * products inside a warpgroup.  Dies unless
 * spb_cuda_attention_wgmma_available; the backward dies if it is on
 * without the wgmma backward and the fused dQ (which hold 128-row blocks).
 * Returns the previous setting. */
int spb_cuda_attention_set_bwd_tma(int schedule);
/* What the CUDA runtime says of a kernel's residency on one SM. */
typedef struct {
    int blocks_per_sm, warps_per_sm, registers; /* registers per thread */
    long smem_bytes, local_bytes;               /* dynamic shared memory per block; local (spill) per thread */
} spb_cuda_occupancy;
/* ... of the FAST forward kernel the switches above pick for this head dim
 * and element type (no launch; zeros under the CPU emulation). */
spb_cuda_occupancy spb_cuda_attention_fwd_occupancy(int head_dim, int fp16);
/* A workspace for n row dots (fp32, tracked as SPB_MEM_WORKSPACE), shared
 * by the attention backward of every caller; grows, never shrinks. */
float *spb_cuda_attention_workspace(long n);

#ifdef __cplusplus
}
#endif

#endif
