/* Grouped-query attention through an H-head backend (cuda_attention_gqa.h):
 * the K/V expansion, the group sum of the copies' gradients, and the two
 * wrappers (the fp32 table's contract and the direct path's 16-bit one). */
#define OMPI_SKIP_MPICXX 1 /* spb_cuda.h -> memory.h: the C API only */
#define MPICH_SKIP_MPICXX 1
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_attention_gqa.h"
#include "cuda_check.h"
#include "cuda_launch.cuh"
#include "cuda_trace.h"
#include "spb_cuda.h"

namespace {

const cudaStream_t kStream = 0; /* the legacy default stream, as the cuDNN table's calls */

/* Growing workspaces (spb_cuda_grow): the copies and their gradients. */
enum { EK, EV, EDK, EDV, N_BUFFERS };
void *buffer[N_BUFFERS];
size_t buffer_cap[N_BUFFERS];

void *workspace(int slot, size_t bytes) { return spb_cuda_grow(&buffer[slot], &buffer_cap[slot], SPB_MEM_WORKSPACE, bytes); }

/* One thread per expanded element i = ((b·k_len + t)·H + h)·D + c: a copy
 * of K/V head h / (H/G) of token t.  Element is float or uint16_t. */
template <typename Element>
__global__ void k_expand_kv(Element *ek, Element *ev, const Element *k, const Element *v, int batch, int tokens,
                            int heads, int kv_heads, int head_dim, long token_stride, long batch_stride)
{
    const long n = (long)batch * tokens * heads * head_dim;
    const int group = heads / kv_heads;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long c = i % head_dim, h = i / head_dim % heads, t = i / head_dim / heads % tokens,
             b = i / head_dim / heads / tokens;
        long at = b * batch_stride + t * token_stride + h / group * head_dim + c;
        ek[i] = k[at];
        ev[i] = v[at];
    }
}

/* One thread per K/V element: dK[g] += sum over the group's copies, in
 * head order (the same sum on every run). */
__global__ void k_sum_groups(float *dk, float *dv, const float *edk, const float *edv, int batch, int tokens,
                             int heads, int kv_heads, int head_dim, long token_stride, long batch_stride)
{
    const long n = (long)batch * tokens * kv_heads * head_dim;
    const int group = heads / kv_heads;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long c = i % head_dim, g = i / head_dim % kv_heads, t = i / head_dim / kv_heads % tokens,
             b = i / head_dim / kv_heads / tokens;
        const long row = ((b * tokens + t) * heads + g * group) * head_dim + c; /* copy g·group of the token */
        float sk = 0.0f, sv = 0.0f;
        for (int r = 0; r < group; r++) sk += edk[row + (long)r * head_dim], sv += edv[row + (long)r * head_dim];
        const long at = b * batch_stride + t * token_stride + g * head_dim + c;
        dk[at] += sk;
        dv[at] += sv;
    }
}

} // namespace

extern "C" void spb_cuda_gqa_release(void)
{
    for (int i = 0; i < N_BUFFERS; i++) spb_cuda_free(buffer[i]), buffer[i] = nullptr, buffer_cap[i] = 0;
}

extern "C" void spb_cuda_gqa_expand_kv(const spb_attn_desc *d, const void *k, const void *v, void *ek, void *ev,
                                       int elem_bytes, int own_interval)
{
    const long n = spb_attn_gqa_expanded_elems(d);
    if (n == 0) return;
    const unsigned blocks = spb_grid_stride_blocks(n, 256);
    const int G = spb_attn_kv_heads(d);
    if (own_interval) SPB_KT_BEGIN(kStream);
    if (elem_bytes == 4)
        k_expand_kv<float><<<blocks, 256, 0, kStream>>>((float *)ek, (float *)ev, (const float *)k, (const float *)v,
                                                        d->batch, d->k_len, d->heads, G, d->head_dim,
                                                        d->k_token_stride, d->k_batch_stride);
    else
        k_expand_kv<uint16_t><<<blocks, 256, 0, kStream>>>((uint16_t *)ek, (uint16_t *)ev, (const uint16_t *)k,
                                                           (const uint16_t *)v, d->batch, d->k_len, d->heads, G,
                                                           d->head_dim, d->k_token_stride, d->k_batch_stride);
    if (own_interval)
        SPB_LAUNCH_CHECK();
    else
        SPB_CUDA_CHECK(cudaGetLastError());
}

extern "C" void spb_cuda_gqa_sum_groups(const spb_attn_desc *d, const float *edk, const float *edv, float *dk,
                                        float *dv, int own_interval)
{
    const int G = spb_attn_kv_heads(d);
    const long n = d->batch > 0 && d->k_len > 0 ? (long)d->batch * d->k_len * G * d->head_dim : 0;
    if (n == 0) return;
    if (own_interval) SPB_KT_BEGIN(kStream);
    k_sum_groups<<<spb_grid_stride_blocks(n, 256), 256, 0, kStream>>>(dk, dv, edk, edv, d->batch, d->k_len,
                                                                      d->heads, G, d->head_dim, d->k_token_stride,
                                                                      d->k_batch_stride);
    if (own_interval)
        SPB_LAUNCH_CHECK();
    else
        SPB_CUDA_CHECK(cudaGetLastError());
}

/* The copies of K and V of d, elem_bytes each, in the workspace. */
static void expanded_kv(const spb_attn_desc *d, const void *k, const void *v, int elem_bytes, int own_interval,
                        void **ek, void **ev)
{
    const size_t bytes = (size_t)elem_bytes * (size_t)spb_attn_gqa_expanded_elems(d);
    *ek = workspace(EK, bytes), *ev = workspace(EV, bytes);
    spb_cuda_gqa_expand_kv(d, k, v, *ek, *ev, elem_bytes, own_interval);
}

/* Zeroed fp32 gradients of the copies. */
static void expanded_grads(const spb_attn_desc *d, float **edk, float **edv)
{
    const size_t bytes = sizeof(float) * (size_t)spb_attn_gqa_expanded_elems(d);
    *edk = (float *)workspace(EDK, bytes), *edv = (float *)workspace(EDV, bytes);
    SPB_CUDA_CHECK(cudaMemsetAsync(*edk, 0, bytes, kStream));
    SPB_CUDA_CHECK(cudaMemsetAsync(*edv, 0, bytes, kStream));
}

extern "C" void spb_cuda_gqa_forward(const spb_attn_backend *mha, const spb_attn_desc *d, const float *q,
                                     const float *k, const float *v, float *o, float *lse)
{
    const spb_attn_desc e = spb_attn_gqa_expanded_desc(d);
    void *ek, *ev;
    expanded_kv(d, k, v, 4, 1, &ek, &ev);
    mha->forward(&e, q, (const float *)ek, (const float *)ev, o, lse);
}

extern "C" void spb_cuda_gqa_backward(const spb_attn_backend *mha, const spb_attn_desc *d, const float *q,
                                      const float *k, const float *v, const float *o, const float *lse,
                                      const float *dout, float *dq, float *dk, float *dv)
{
    if (spb_attn_gqa_expanded_elems(d) == 0 || d->q_len <= 0) return; /* no pairs: nothing to add */
    const spb_attn_desc e = spb_attn_gqa_expanded_desc(d);
    void *ek, *ev;
    float *edk, *edv;
    expanded_kv(d, k, v, 4, 1, &ek, &ev);
    expanded_grads(d, &edk, &edv);
    mha->backward(&e, q, (const float *)ek, (const float *)ev, o, lse, dout, dq, edk, edv);
    spb_cuda_gqa_sum_groups(d, edk, edv, dk, dv, 1);
}

extern "C" int spb_cuda_gqa_half_forward(spb_gqa_half_forward_fn mha, const spb_attn_desc *d, const spb_bf16 *q,
                                         const spb_bf16 *k, const spb_bf16 *v, spb_bf16 *o, float *lse)
{
    const spb_attn_desc e = spb_attn_gqa_expanded_desc(d);
    void *ek, *ev;
    expanded_kv(d, k, v, 2, 0, &ek, &ev);
    return mha(&e, q, (const spb_bf16 *)ek, (const spb_bf16 *)ev, o, lse);
}

extern "C" int spb_cuda_gqa_half_backward(spb_gqa_half_backward_fn mha, const spb_attn_desc *d, const spb_bf16 *q,
                                          const spb_bf16 *k, const spb_bf16 *v, const spb_bf16 *o, const float *lse,
                                          const spb_bf16 *dout, float *dq, float *dk, float *dv)
{
    if (spb_attn_gqa_expanded_elems(d) == 0 || d->q_len <= 0) return 0; /* no pairs: nothing to add */
    const spb_attn_desc e = spb_attn_gqa_expanded_desc(d);
    void *ek, *ev;
    float *edk, *edv;
    expanded_kv(d, k, v, 2, 0, &ek, &ev);
    expanded_grads(d, &edk, &edv);
    const int rc = mha(&e, q, (const spb_bf16 *)ek, (const spb_bf16 *)ev, o, lse, dout, dq, edk, edv);
    if (rc == 0) spb_cuda_gqa_sum_groups(d, edk, edv, dk, dv, 0); /* declined: nothing was written */
    return rc;
}
