/* --attention cudnn on the CUDA tables: attention.h's fp32 contract over
 * cuDNN's fused attention (cudnn_attention.h), which takes bf16 or fp16.
 *
 * The core hands this table fp32 buffers; with --precision bf16 or fp16 (the
 * precisions config.c allows with cudnn) they are the frames' fp32 copies of
 * values of the run's 16-bit format, so narrowing them to that format again
 * is exact.  Each operand's span (its
 * first to its last element at its strides, gaps included) is narrowed into
 * its own scratch buffer at the same strides: every scratch operand starts
 * 16-byte aligned whatever the core's offsets are.  O is written back and
 * dQ, dK, dV are ADDED back row by row at their strides (the gaps belong to
 * other tensors of the fused QKV buffer and are never touched).  The lse
 * goes through an aligned scratch copy too.  Calls cuDNN cannot take end
 * the run with its reason (the user asked for this backend by name).
 *
 * Under --bf16-kernels fast the direct path calls cuDNN on the stored
 * operands instead (spb_cuda_cudnn_direct_*, below): no narrowing; a call it
 * cannot take there (an operand not 16-byte aligned, say) comes back here
 * through the frames, and the first such call says why on stderr.
 *
 * Grouped-query calls (fewer K/V heads than query heads), on either path,
 * run cuDNN on H-head copies of K and V and sum the copies' dK, dV back per
 * group (cuda_attention_gqa.h): the graph itself takes H K/V heads. */
#define OMPI_SKIP_MPICXX 1 /* backend.h -> comm.h -> mpi.h: the C API only */
#define MPICH_SKIP_MPICXX 1
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "cuda_attention_gqa.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "cuda_trace.h"
#include "cuda_bf16_storage.h"
#include "cuda_launch.cuh"
#include "cudnn_attention.h"
#include "spb_cuda.h"

namespace {

enum { Q, K, V, O, DOUT, DQ, DK, DV, N_SCRATCH };
void *scratch[N_SCRATCH], *lse_scratch;
size_t scratch_cap[N_SCRATCH], lse_cap;

/* The run's 16-bit format (device_handles.h: one per process). */
spb_half_format run_format() { return spb_handles_half_format(); }
spb_cudnn_half cudnn_half() { return run_format() == SPB_HALF_FP16 ? SPB_CUDNN_FP16 : SPB_CUDNN_BF16; }

spb_bf16 *narrowed(int slot, const float *x, long extent)
{
    spb_bf16 *b = (spb_bf16 *)spb_cuda_grow(&scratch[slot], &scratch_cap[slot], SPB_MEM_WORKSPACE,
                                            sizeof(spb_bf16) * (size_t)extent);
    if (x) spb_cuda_bf16_storage()->narrow(b, x, extent, NULL, 0, run_format());
    return b;
}

float *lse_copy(const spb_attn_desc *d, const float *lse)
{
    size_t bytes = sizeof(float) * (size_t)d->batch * d->heads * d->q_len;
    float *l = (float *)spb_cuda_grow(&lse_scratch, &lse_cap, SPB_MEM_WORKSPACE, bytes);
    if (lse) SPB_CUDA_CHECK(cudaMemcpyAsync(l, lse, bytes, cudaMemcpyDeviceToDevice, 0));
    return l;
}

/* dst[b][t][0..width) (=, or += when accumulate) src at the same strides. */
__global__ void k_widen_rows(float *dst, const spb_bf16 *src, int batch, int tokens, int width, long token_stride,
                             long batch_stride, int accumulate, int fp16)
{
    long n = (long)batch * tokens * width;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long c = i % width, t = i / width % tokens, b = i / width / tokens;
        long at = b * batch_stride + t * token_stride + c;
        float x = fp16 ? spb_fp16_to_float(src[at]) : __uint_as_float((unsigned)src[at] << 16);
        dst[at] = accumulate ? dst[at] + x : x;
    }
}

/* own_interval: the launch is a kernel-timeline interval of its own (the
 * fp32 table's calls); 0 inside the direct path's, which spans the whole
 * cuDNN call (cuda_bf16_direct.cu), and intervals do not nest. */
void widen_rows(float *dst, const spb_bf16 *src, const spb_attn_desc *d, int tokens, long token_stride,
                long batch_stride, int accumulate, int own_interval)
{
    int width = d->heads * d->head_dim;
    long n = (long)d->batch * tokens * width;
    if (own_interval) SPB_KT_BEGIN(0);
    k_widen_rows<<<spb_grid_stride_blocks(n, 256), 256>>>(dst, src, d->batch, tokens, width, token_stride,
                                                         batch_stride, accumulate, run_format() == SPB_HALF_FP16);
    SPB_CUDA_CHECK(cudaGetLastError());
    if (own_interval) SPB_KT_END();
}

/* dQ, dK, dV (fp32, at Q's and K's strides) += cuDNN's 16-bit ones. */
void add_back(const spb_attn_desc *d, float *dq, float *dk, float *dv, const spb_bf16 *bdq, const spb_bf16 *bdk,
              const spb_bf16 *bdv, int own_intervals)
{
    widen_rows(dq, bdq, d, d->q_len, d->q_token_stride, d->q_batch_stride, 1, own_intervals);
    widen_rows(dk, bdk, d, d->k_len, d->k_token_stride, d->k_batch_stride, 1, own_intervals);
    widen_rows(dv, bdv, d, d->k_len, d->k_token_stride, d->k_batch_stride, 1, own_intervals);
}

void cudnn_forward(const spb_attn_desc *d, const float *q, const float *k, const float *v, float *o, float *lse)
{
    long qx = spb_attn_operand_extent(d, d->q_len, d->q_token_stride, d->q_batch_stride);
    long kx = spb_attn_operand_extent(d, d->k_len, d->k_token_stride, d->k_batch_stride);
    long ox = spb_attn_operand_extent(d, d->q_len, d->o_token_stride, d->o_batch_stride);
    spb_bf16 *bq = narrowed(Q, q, qx), *bk = narrowed(K, k, kx), *bv = narrowed(V, v, kx), *bo = narrowed(O, NULL, ox);
    float *l = lse_copy(d, NULL);
    char why[512];
    SPB_KT_BEGIN_LIBRARY(0); /* the kernel timeline: cuDNN's kernels, one interval */
    int rc = spb_cudnn_attention_forward(d, cudnn_half(), bq, bk, bv, bo, l, 0, why, sizeof why);
    SPB_KT_END();
    if (rc) SPB_DIE("--attention cudnn, forward: %s", why);
    widen_rows(o, bo, d, d->q_len, d->o_token_stride, d->o_batch_stride, 0, 1);
    SPB_CUDA_CHECK(cudaMemcpyAsync(lse, l, sizeof(float) * (size_t)d->batch * d->heads * d->q_len,
                                   cudaMemcpyDeviceToDevice, 0));
}

void cudnn_backward(const spb_attn_desc *d, const float *q, const float *k, const float *v, const float *o,
                    const float *lse, const float *dout, float *dq, float *dk, float *dv)
{
    if (d->batch <= 0 || d->heads <= 0 || d->q_len <= 0 || d->k_len <= 0) return; /* no pairs: nothing to add */
    long qx = spb_attn_operand_extent(d, d->q_len, d->q_token_stride, d->q_batch_stride);
    long kx = spb_attn_operand_extent(d, d->k_len, d->k_token_stride, d->k_batch_stride);
    long ox = spb_attn_operand_extent(d, d->q_len, d->o_token_stride, d->o_batch_stride);
    spb_bf16 *bq = narrowed(Q, q, qx), *bk = narrowed(K, k, kx), *bv = narrowed(V, v, kx), *bo = narrowed(O, o, ox),
             *bdo = narrowed(DOUT, dout, ox), *bdq = narrowed(DQ, NULL, qx), *bdk = narrowed(DK, NULL, kx),
             *bdv = narrowed(DV, NULL, kx);
    char why[512];
    float *l = lse_copy(d, lse);
    SPB_KT_BEGIN_LIBRARY(0);
    int rc = spb_cudnn_attention_backward(d, cudnn_half(), bq, bk, bv, bo, l, bdo, bdq, bdk, bdv, 0, why, sizeof why);
    SPB_KT_END();
    if (rc) SPB_DIE("--attention cudnn, backward: %s", why);
    add_back(d, dq, dk, dv, bdq, bdk, bdv, 1);
}

/* cuDNN's graph here takes as many K/V heads as query heads: a call with
 * fewer (grouped-query attention) runs on H-head copies of K and V, its
 * copies' dK, dV summed back per group (cuda_attention_gqa.h). */
const spb_attn_backend cudnn_mha = {"cudnn", cudnn_forward, cudnn_backward};

int grouped(const spb_attn_desc *d) { return spb_attn_kv_heads(d) != d->heads; }

void cudnn_any_forward(const spb_attn_desc *d, const float *q, const float *k, const float *v, float *o, float *lse)
{
    if (grouped(d))
        spb_cuda_gqa_forward(&cudnn_mha, d, q, k, v, o, lse);
    else
        cudnn_forward(d, q, k, v, o, lse);
}

void cudnn_any_backward(const spb_attn_desc *d, const float *q, const float *k, const float *v, const float *o,
                        const float *lse, const float *dout, float *dq, float *dk, float *dv)
{
    if (grouped(d))
        spb_cuda_gqa_backward(&cudnn_mha, d, q, k, v, o, lse, dout, dq, dk, dv);
    else
        cudnn_backward(d, q, k, v, o, lse, dout, dq, dk, dv);
}

const spb_attn_backend cudnn_backend = {"cudnn", cudnn_any_forward, cudnn_any_backward};

/* Why the direct path declined a call, said once per process (the call
 * then takes the frames through cudnn_forward/backward above). */
void declined(const char *why)
{
    static int said = 0;
    if (!said) fprintf(stderr, "spbench: --attention cudnn: a direct call went through the frames: %s\n", why);
    said = 1;
}

} // namespace

/* The direct path's entries (bf16_direct.h): the operands in their own
 * 16-bit storage, no narrowing; dQ, dK, dV into 16-bit scratch at Q's and
 * K's strides, then added row by row to the fp32 frames the dispatch holds. */
static int direct_mha_forward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                              spb_bf16 *o, float *lse)
{
    char why[512];
    if (!spb_cudnn_attention_forward(d, cudnn_half(), q, k, v, o, lse, 0, why, sizeof why)) return 0;
    declined(why);
    return -1;
}

static int direct_mha_backward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                               const spb_bf16 *o, const float *lse, const spb_bf16 *dout, float *dq, float *dk,
                               float *dv)
{
    if (d->batch <= 0 || d->heads <= 0 || d->q_len <= 0 || d->k_len <= 0) return 0; /* no pairs: nothing to add */
    long qx = spb_attn_operand_extent(d, d->q_len, d->q_token_stride, d->q_batch_stride);
    long kx = spb_attn_operand_extent(d, d->k_len, d->k_token_stride, d->k_batch_stride);
    spb_bf16 *bdq = narrowed(DQ, NULL, qx), *bdk = narrowed(DK, NULL, kx), *bdv = narrowed(DV, NULL, kx);
    char why[512];
    if (spb_cudnn_attention_backward(d, cudnn_half(), q, k, v, o, lse, dout, bdq, bdk, bdv, 0, why, sizeof why)) {
        declined(why);
        return -1;
    }
    add_back(d, dq, dk, dv, bdq, bdk, bdv, 0); /* inside the caller's interval */
    return 0;
}

/* Grouped-query calls on H-head copies of K and V (cuda_attention_gqa.h). */
extern "C" int spb_cuda_cudnn_direct_forward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k,
                                             const spb_bf16 *v, spb_bf16 *o, float *lse)
{
    return grouped(d) ? spb_cuda_gqa_half_forward(direct_mha_forward, d, q, k, v, o, lse)
                      : direct_mha_forward(d, q, k, v, o, lse);
}

extern "C" int spb_cuda_cudnn_direct_backward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k,
                                              const spb_bf16 *v, const spb_bf16 *o, const float *lse,
                                              const spb_bf16 *dout, float *dq, float *dk, float *dv)
{
    return grouped(d) ? spb_cuda_gqa_half_backward(direct_mha_backward, d, q, k, v, o, lse, dout, dq, dk, dv)
                      : direct_mha_backward(d, q, k, v, o, lse, dout, dq, dk, dv);
}

extern "C" const spb_attn_backend *spb_cuda_cudnn_attention(void)
{
    return spb_cudnn_attention_built() ? &cudnn_backend : nullptr;
}
