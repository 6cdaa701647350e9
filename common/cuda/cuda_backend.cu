/* Over 700 lines: the whole fp32 CUDA device table, one entry per operation of backend.h. */
/* The CUDA device table of the GPT core: fp32 on the device, every entry
 * written to do exactly what common/core/ops_cpu.c (and attention_naive.c) does,
 * in the same order where the order is cheap to keep:
 *   - products: cuBLAS cublasSgemm in fp32 (CUBLAS_DEFAULT_MATH: no TF32);
 *     only the summation order inside a product differs from OpenBLAS;
 *   - LayerNorm, softmax/cross-entropy: one thread per row, the CPU's serial
 *     loops and float accumulators; the parameter gradients of LayerNorm and
 *     the bias gradients one thread per column, rows in order (as the CPU);
 *   - GELU, embedding, adds: one thread per element; embedding backward
 *     with atomicAdd (rows may share a token);
 *   - attention: one thread per (batch, head, query row) forward (two
 *     passes: max, then sum and P·V), backward one thread per query row for
 *     dQ and one per key row for dK, dV (no atomics, deterministic).
 * Functions and semantics: common/core/ops.h, common/attention/attention.h. */
#define OMPI_SKIP_MPICXX 1 /* backend.h -> comm.h -> mpi.h: the C API only */
#define MPICH_SKIP_MPICXX 1
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda_backend.h"
#include "cuda_check.h"
#include "cuda_device.h"
#include "cuda_llama_ops.h"
#include "cuda_scalars.h"
#include "cuda_trace.h"
#include "cuda_upload.h"
#include "gelu.cuh"
#include "spb_cuda.h"

extern "C" {
#include "ops.h" /* spb_gemm_flops_add: C headers without their own extern "C" */
}

#define SPB_CUBLAS_CHECK(call)                                                                                         \
    do {                                                                                                               \
        cublasStatus_t spb_cublas_rc_ = (call);                                                                        \
        if (spb_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                                                   \
            SPB_DIE("cuBLAS call failed: %s: status %d", #call, (int)spb_cublas_rc_);                                  \
    } while (0)

/* Every launch here is on the legacy stream: SPB_KT_BEGIN(0) just before,
 * SPB_LAUNCH_CHECK (cuda_trace.h) after. */

namespace {

const int kThreads = 256;

unsigned blocks_for(long n) { return (unsigned)((n + kThreads - 1) / kThreads); }

/* ------------------------------------------------------------ memory -- */
float *dev_alloc(spb_mem_category cat, long n)
{
    size_t bytes = sizeof(float) * (size_t)(n > 0 ? n : 0);
    float *p = (float *)spb_cuda_alloc(cat, bytes);
    if (bytes) SPB_CUDA_CHECK(cudaMemset(p, 0, bytes));
    return p;
}

int *dev_alloc_ints(spb_mem_category cat, long n)
{
    size_t bytes = sizeof(int) * (size_t)(n > 0 ? n : 0);
    int *p = (int *)spb_cuda_alloc(cat, bytes);
    if (bytes) SPB_CUDA_CHECK(cudaMemset(p, 0, bytes));
    return p;
}

void dev_free(void *p) { spb_cuda_free(p); }

void dev_zero(float *x, long n)
{
    if (n > 0) SPB_CUDA_CHECK(cudaMemset(x, 0, sizeof(float) * (size_t)n));
}

void dev_ints_to_device(int *dst, const int *host, long n)
{
    if (n > 0) spb_cuda_upload(dst, host, sizeof(int) * (size_t)n, 0); /* no wait (cuda_upload.h) */
}

/* ----------------------------------------------------------- products -- */
cublasHandle_t blas(void)
{
    static cublasHandle_t h = nullptr;
    if (!h) {
        SPB_CUBLAS_CHECK(cublasCreate(&h));
        SPB_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH)); /* fp32 FMA, no TF32 */
        SPB_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    }
    return h;
}

/* Row-major C[m][n] = alpha op(A)[m][k] op(B)[k][n] + beta C (ops_cpu.c's
 * sgemm).  A row-major matrix with row stride ld is, read column-major with
 * the same ld, its transpose; so the row-major product is the column-major
 * Cᵀ[n][m] = op(B)ᵀ op(A)ᵀ: swap the operands and the sizes m and n; each
 * operand keeps its own transpose flag. */
void sgemm_rm(int transA, int transB, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc)
{
    if (m <= 0 || n <= 0) return;
    spb_timer_region timed = spb_timer_begin(SPB_T_GEMM); /* events on the default stream: no wait */
    cublasHandle_t h = blas();
    SPB_KT_BEGIN_LIBRARY(0);
    SPB_CUBLAS_CHECK(cublasSgemm(h, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                                 &alpha, B, ldb, A, lda, &beta, C, ldc));
    SPB_KT_END();
    spb_timer_end(timed);
    spb_gemm_flops_add(2.0 * m * n * k);
}

/* out[r][o] = b[o] for rows of stride ldo */
__global__ void k_bias_fill(float *out, int ldo, const float *b, int rows, int out_f)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)rows * out_f) return;
    long r = idx / out_f;
    int o = (int)(idx % out_f);
    out[r * ldo + o] = b[o];
}

/* db[o] += dout[r][o] for r = 0, 1, ... in order (the CPU's order). */
__global__ void k_col_sums(float *db, const float *dout, int ldo, long rows, int out_f)
{
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= out_f) return;
    float acc = db[o];
    for (long r = 0; r < rows; r++) acc += dout[r * ldo + o];
    db[o] = acc;
}

void dev_matmul_forward_ld(float *out, int ldo, const float *inp, int ldi, const float *W, int ldw, const float *b,
                           int rows, int in, int out_f, int accumulate)
{
    float beta = accumulate ? 1.0f : 0.0f;
    if (b && !accumulate) {
        if ((long)rows * out_f > 0) {
            SPB_KT_BEGIN(0);
            k_bias_fill<<<blocks_for((long)rows * out_f), kThreads>>>(out, ldo, b, rows, out_f);
            SPB_LAUNCH_CHECK();
        }
        beta = 1.0f;
    }
    sgemm_rm(0, 1, rows, out_f, in, 1.0f, inp, ldi, W, ldw, beta, out, ldo);
}

void dev_matmul_forward(float *out, const float *inp, const float *W, const float *b, int rows, int in, int out_f)
{
    dev_matmul_forward_ld(out, out_f, inp, in, W, in, b, rows, in, out_f, 0);
}

void dev_matmul_backward_ld(float *dinp, int lddi, float *dW, int lddw, float *db, const float *dout, int ldo,
                            const float *inp, int ldi, const float *W, int ldw, int rows, int in, int out_f,
                            int accumulate_dinp)
{
    if (dinp) sgemm_rm(0, 0, rows, in, out_f, 1.0f, dout, ldo, W, ldw, accumulate_dinp ? 1.0f : 0.0f, dinp, lddi);
    sgemm_rm(1, 0, out_f, in, rows, 1.0f, dout, ldo, inp, ldi, 1.0f, dW, lddw);
    if (db && out_f > 0) {
        SPB_KT_BEGIN(0);
        k_col_sums<<<blocks_for(out_f), kThreads>>>(db, dout, ldo, rows, out_f);
        SPB_LAUNCH_CHECK();
    }
}

void dev_matmul_backward(float *dinp, float *dW, float *db, const float *dout, const float *inp, const float *W,
                         int rows, int in, int out_f, int accumulate_dinp)
{
    dev_matmul_backward_ld(dinp, in, dW, in, db, dout, out_f, inp, in, W, in, rows, in, out_f, accumulate_dinp);
}

/* --------------------------------------------------------- LayerNorm -- */
__global__ void k_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                    const float *b, int rows, int C)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float eps = 1e-5f;
    const float *x = inp + (long)r * C;
    float *y = out + (long)r * C;
    float m = 0.0f;
    for (int i = 0; i < C; i++) m += x[i];
    m /= (float)C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) {
        float d = x[i] - m;
        v += d * d;
    }
    v /= (float)C;
    float s = 1.0f / sqrtf(v + eps);
    for (int i = 0; i < C; i++) y[i] = (x[i] - m) * s * w[i] + b[i];
    mean[r] = m;
    rstd[r] = s;
}

/* dinp += s (g - mean(g) - xhat mean(g xhat)), g = dy w; one thread a row */
__global__ void k_layernorm_backward_rows(float *dinp, const float *dout, const float *inp, const float *w,
                                          const float *mean, const float *rstd, int rows, int C)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float *dy = dout + (long)r * C;
    const float *x = inp + (long)r * C;
    float *dx = dinp + (long)r * C;
    float m = mean[r], s = rstd[r];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int i = 0; i < C; i++) {
        float xhat = (x[i] - m) * s;
        float g = dy[i] * w[i];
        sum_g += g;
        sum_gx += g * xhat;
    }
    sum_g /= (float)C;
    sum_gx /= (float)C;
    for (int i = 0; i < C; i++) {
        float xhat = (x[i] - m) * s;
        dx[i] += s * (dy[i] * w[i] - sum_g - xhat * sum_gx);
    }
}

/* dw += sum_r dy xhat, db += sum_r dy; one thread a column, rows in order */
__global__ void k_layernorm_backward_cols(float *dw, float *db, const float *dout, const float *inp,
                                          const float *mean, const float *rstd, int rows, int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C) return;
    float aw = dw[i], ab = db[i];
    for (int r = 0; r < rows; r++) {
        float dy = dout[(long)r * C + i];
        float xhat = (inp[(long)r * C + i] - mean[r]) * rstd[r];
        ab += dy;
        aw += dy * xhat;
    }
    dw[i] = aw;
    db[i] = ab;
}

void dev_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                           int rows, int C)
{
    if (rows <= 0) return;
    SPB_KT_BEGIN(0);
    k_layernorm_forward<<<blocks_for(rows), kThreads>>>(out, mean, rstd, inp, w, b, rows, C);
    SPB_LAUNCH_CHECK();
}

void dev_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                            const float *mean, const float *rstd, int rows, int C)
{
    if (rows <= 0 || C <= 0) return;
    /* The columns first: they read dout, which the contract lets alias dinp
     * per element (the CPU reads a row's dy before it updates its dx). */
    SPB_KT_BEGIN(0);
    k_layernorm_backward_cols<<<blocks_for(C), kThreads>>>(dw, db, dout, inp, mean, rstd, rows, C);
    SPB_LAUNCH_CHECK();
    SPB_KT_BEGIN(0);
    k_layernorm_backward_rows<<<blocks_for(rows), kThreads>>>(dinp, dout, inp, w, mean, rstd, rows, C);
    SPB_LAUNCH_CHECK();
}

/* -------------------------------------------------------------- GELU -- */
__global__ void k_gelu_forward(float *out, const float *inp, long n)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = spb_gelu_value(inp[i]);
}

__global__ void k_gelu_backward(float *dinp, const float *inp, const float *dout, long n)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    dinp[i] = dout[i] * spb_gelu_slope(inp[i]); /* dinp may alias dout: each thread reads then writes its own element */
}

void dev_gelu_forward(float *out, const float *inp, long n)
{
    if (n <= 0) return;
    SPB_KT_BEGIN(0);
    k_gelu_forward<<<blocks_for(n), kThreads>>>(out, inp, n);
    SPB_LAUNCH_CHECK();
}

void dev_gelu_backward(float *dinp, const float *inp, const float *dout, long n)
{
    if (n <= 0) return;
    SPB_KT_BEGIN(0);
    k_gelu_backward<<<blocks_for(n), kThreads>>>(dinp, inp, dout, n);
    SPB_LAUNCH_CHECK();
}

/* --------------------------------------------------------- embedding -- */
/* The positions array is the core's HOST array of length T: copied to a
 * device buffer (kept for the next call). */
long *positions_to_device(const long *positions, int T)
{
    /* A buffer that only grows (a cudaFree per call would synchronise the
     * device); the copy, queued on the legacy stream, lands after the
     * kernels that read it last. */
    static void *buf = nullptr;
    static size_t cap = 0;
    long *d = (long *)spb_cuda_grow(&buf, &cap, SPB_MEM_WORKSPACE, sizeof(long) * (size_t)T);
    spb_cuda_upload(d, positions, sizeof(long) * (size_t)T, 0); /* no wait (cuda_upload.h) */
    return d;
}

__global__ void k_embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                                    const long *positions, int rows, int T, int C)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)rows * C) return;
    int r = (int)(idx / C), i = (int)(idx % C);
    out[idx] = wte[(long)tokens[r] * C + i] + (wpe ? wpe[positions[r % T] * C + i] : 0.0f); /* RoPE: no table */
}

__global__ void k_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                                     const long *positions, int rows, int T, int C)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)rows * C) return;
    int r = (int)(idx / C), i = (int)(idx % C);
    float d = dout[idx];
    atomicAdd(dwte + (long)tokens[r] * C + i, d);
    if (dwpe) atomicAdd(dwpe + positions[r % T] * C + i, d);
}

void dev_embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe, const long *positions,
                           int rows, int T, int C)
{
    if ((long)rows * C <= 0 || T <= 0) return;
    long *pos = positions_to_device(positions, T);
    SPB_KT_BEGIN(0);
    k_embedding_forward<<<blocks_for((long)rows * C), kThreads>>>(out, tokens, wte, wpe, pos, rows, T, C);
    SPB_LAUNCH_CHECK();
}

void dev_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, const long *positions,
                            int rows, int T, int C)
{
    if ((long)rows * C <= 0 || T <= 0) return;
    long *pos = positions_to_device(positions, T);
    SPB_KT_BEGIN(0);
    k_embedding_backward<<<blocks_for((long)rows * C), kThreads>>>(dwte, dwpe, dout, tokens, pos, rows, T, C);
    SPB_LAUNCH_CHECK();
}

/* -------------------------------------------- softmax, cross-entropy -- */
/* logits -> probabilities in place; loss[r] = log(sum) - (logit_t - max) */
__global__ void k_softmax_xent_forward(float *probs, double *loss, const int *targets, int rows, int V)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float *p = probs + (long)r * V;
    float mx = p[0];
    for (int v = 1; v < V; v++) mx = p[v] > mx ? p[v] : mx;
    float target_logit = p[targets[r]];
    for (int v = 0; v < V; v++) p[v] = expf(p[v] - mx);
    float sum = 0.0f;
    for (int v = 0; v < V; v++) sum += p[v];
    float inv = 1.0f / sum;
    loss[r] = (double)logf(sum) - (double)(target_logit - mx);
    for (int v = 0; v < V; v++) p[v] *= inv;
}

__global__ void k_softmax_xent_backward(float *probs, const int *targets, int rows, int V, float scale)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)rows * V) return;
    int r = (int)(idx / V), v = (int)(idx % V);
    float p = probs[idx] * scale;
    if (v == targets[r]) p -= scale;
    probs[idx] = p;
}

double dev_softmax_xent_forward(float *probs, const int *targets, int rows, int V)
{
    if (rows <= 0) return 0.0;
    if (spb_cuda_scalar_target() >= 0) {
        /* kept on the device (backend.h's scalar_defer): a buffer that only
         * grows, no readback, no cudaFree (each waits for the device) */
        static void *buf = nullptr;
        static size_t cap = 0;
        double *loss = (double *)spb_cuda_grow(&buf, &cap, SPB_MEM_WORKSPACE, sizeof(double) * (size_t)rows);
        SPB_KT_BEGIN(0);
        k_softmax_xent_forward<<<blocks_for(rows), kThreads>>>(probs, loss, targets, rows, V);
        SPB_LAUNCH_CHECK();
        spb_cuda_scalar_add_ordered(loss, rows, 0); /* rows in order, as below */
        return 0.0;
    }
    double *loss = (double *)spb_cuda_alloc(SPB_MEM_WORKSPACE, sizeof(double) * (size_t)rows);
    SPB_KT_BEGIN(0);
    k_softmax_xent_forward<<<blocks_for(rows), kThreads>>>(probs, loss, targets, rows, V);
    SPB_LAUNCH_CHECK();
    std::vector<double> h((size_t)rows);
    SPB_CUDA_HOST_WAIT(cudaMemcpy(h.data(), loss, sizeof(double) * (size_t)rows, cudaMemcpyDeviceToHost));
    spb_cuda_free(loss);
    double sum = 0.0; /* rows in order, as ops_cpu.c */
    for (int r = 0; r < rows; r++) sum += h[(size_t)r];
    return sum;
}

void dev_softmax_xent_backward(float *probs, const int *targets, int rows, int V, float scale)
{
    if ((long)rows * V <= 0) return;
    SPB_KT_BEGIN(0);
    k_softmax_xent_backward<<<blocks_for((long)rows * V), kThreads>>>(probs, targets, rows, V, scale);
    SPB_LAUNCH_CHECK();
}

/* -------------------------------------------------------------- adds -- */
__global__ void k_add_inplace(float *a, const float *b, long n)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i];
}

__global__ void k_add_bias_rows(float *x, const float *b, long rows, int C)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < rows * C) x[idx] += b[idx % C];
}

void dev_add_inplace(float *a, const float *b, long n)
{
    if (n <= 0) return;
    SPB_KT_BEGIN(0);
    k_add_inplace<<<blocks_for(n), kThreads>>>(a, b, n);
    SPB_LAUNCH_CHECK();
}

void dev_add_bias_rows(float *x, const float *b, long rows, int C)
{
    if (rows * C <= 0) return;
    SPB_KT_BEGIN(0);
    k_add_bias_rows<<<blocks_for(rows * C), kThreads>>>(x, b, rows, C);
    SPB_LAUNCH_CHECK();
}

void dev_bias_grad_rows(float *db, const float *dy, long rows, int C)
{
    if (C <= 0) return;
    SPB_KT_BEGIN(0);
    k_col_sums<<<blocks_for(C), kThreads>>>(db, dy, C, rows, C);
    SPB_LAUNCH_CHECK();
}

/* --------------------------------------------------------- attention -- */
/* attention.h's spb_attn_visible, restated for the device (the header's
 * static inline functions are host-only under nvcc). */
__device__ bool visible(const spb_attn_desc &d, long i, long j)
{
    long qp = d.q_offset + i, kp = d.k_offset + j;
    if (d.causal && kp > qp) return false;
    if (d.sparse_block <= 0) return true;
    long bq = qp / d.sparse_block, bk = kp / d.sparse_block;
    return (bk > bq - d.sparse_local && bk < bq + d.sparse_local) || bk < d.sparse_global;
}

/* Grouped-query attention: the K/V head query head h reads (attention.h's
 * spb_attn_kv_head, which is host code) and the K/V heads per token. */
__device__ int kv_head(const spb_attn_desc &d, int h) { return d.kv_heads > 0 ? h / (d.heads / d.kv_heads) : h; }
__device__ int kv_heads(const spb_attn_desc &d) { return d.kv_heads > 0 ? d.kv_heads : d.heads; }

__device__ float dot(const float *a, const float *b, int D)
{
    float s = 0.0f;
    for (int c = 0; c < D; c++) s += a[c] * b[c];
    return s;
}

/* One thread per (b, h, i), i fastest (neighbouring threads read the same
 * key row).  Pass 1: max of the visible scaled scores; pass 2: sum of
 * exp(s - max) and O += p V in place; then O /= sum, lse = max + log sum. */
__global__ void k_attn_forward(spb_attn_desc d, const float *q, const float *k, const float *v, float *o, float *lse)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)d.batch * d.heads * d.q_len) return;
    const int i = (int)(idx % d.q_len), h = (int)(idx / d.q_len % d.heads), b = (int)(idx / d.q_len / d.heads);
    const int D = d.head_dim;
    const float *qi = q + b * d.q_batch_stride + i * d.q_token_stride + (long)h * D;
    float *oi = o + b * d.o_batch_stride + i * d.o_token_stride + (long)h * D;
    for (int c = 0; c < D; c++) oi[c] = 0.0f;
    float mx = -INFINITY;
    bool any = false;
    for (int j = 0; j < d.k_len; j++) {
        if (!visible(d, i, j)) continue;
        const float *kj = k + b * d.k_batch_stride + j * d.k_token_stride + (long)kv_head(d, h) * D;
        float s = d.scale * dot(qi, kj, D);
        mx = s > mx ? s : mx;
        any = true;
    }
    float *li = lse + ((long)b * d.heads + h) * d.q_len + i;
    if (!any) {
        *li = -INFINITY;
        return;
    }
    float sum = 0.0f;
    for (int j = 0; j < d.k_len; j++) {
        if (!visible(d, i, j)) continue;
        const long koff = b * d.k_batch_stride + j * d.k_token_stride + (long)kv_head(d, h) * D;
        float p = expf(d.scale * dot(qi, k + koff, D) - mx);
        sum += p;
        const float *vj = v + koff;
        for (int c = 0; c < D; c++) oi[c] += p * vj[c];
    }
    float inv = 1.0f / sum;
    for (int c = 0; c < D; c++) oi[c] *= inv;
    *li = mx + logf(sum);
}

/* Di = dO_i · O_i into ws [B][H][q_len] */
__global__ void k_attn_rowdot(spb_attn_desc d, const float *o, const float *dout, float *ws)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)d.batch * d.heads * d.q_len) return;
    const int i = (int)(idx % d.q_len), h = (int)(idx / d.q_len % d.heads), b = (int)(idx / d.q_len / d.heads);
    const long ooff = b * d.o_batch_stride + i * d.o_token_stride + (long)h * d.head_dim;
    ws[idx] = dot(dout + ooff, o + ooff, d.head_dim);
}

/* dQ_i += scale sum_j dS_ij K_j, dS_ij = P_ij (dO_i·V_j - D_i),
 * P_ij = exp(scale q_i·k_j - lse_i); one thread per (b, h, i). */
__global__ void k_attn_backward_dq(spb_attn_desc d, const float *q, const float *k, const float *v,
                                   const float *lse, const float *dout, const float *ws, float *dq)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)d.batch * d.heads * d.q_len) return;
    const int i = (int)(idx % d.q_len), h = (int)(idx / d.q_len % d.heads), b = (int)(idx / d.q_len / d.heads);
    const int D = d.head_dim;
    const float l = lse[idx];
    if (!(l > -INFINITY)) return; /* no visible key: no gradient */
    const long qoff = b * d.q_batch_stride + i * d.q_token_stride + (long)h * D;
    const long ooff = b * d.o_batch_stride + i * d.o_token_stride + (long)h * D;
    const float *qi = q + qoff, *doi = dout + ooff;
    float *dqi = dq + qoff;
    const float Di = ws[idx];
    for (int j = 0; j < d.k_len; j++) {
        if (!visible(d, i, j)) continue;
        const long koff = b * d.k_batch_stride + j * d.k_token_stride + (long)kv_head(d, h) * D;
        float p = expf(d.scale * dot(qi, k + koff, D) - l);
        float ds = p * (dot(doi, v + koff, D) - Di);
        const float *kj = k + koff;
        for (int c = 0; c < D; c++) dqi[c] += d.scale * ds * kj[c];
    }
}

/* dK_j += scale sum_i dS_ij Q_i, dV_j += sum_i P_ij dO_i; one thread per
 * (b, K/V head g, j), over the query heads that read g (grouped-query
 * attention: heads / kv_heads of them): each key row has one writer. */
__global__ void k_attn_backward_dkdv(spb_attn_desc d, const float *q, const float *k, const float *v,
                                     const float *lse, const float *dout, const float *ws, float *dk, float *dv)
{
    const int G = kv_heads(d), group = d.heads / G;
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)d.batch * G * d.k_len) return;
    const int j = (int)(idx % d.k_len), g = (int)(idx / d.k_len % G), b = (int)(idx / d.k_len / G);
    const int D = d.head_dim;
    const long koff = b * d.k_batch_stride + j * d.k_token_stride + (long)g * D;
    const float *kj = k + koff, *vj = v + koff;
    float *dkj = dk + koff, *dvj = dv + koff;
    for (int h = g * group; h < (g + 1) * group; h++) {
        const long row0 = ((long)b * d.heads + h) * d.q_len;
        for (int i = 0; i < d.q_len; i++) {
            const float l = lse[row0 + i];
            if (!(l > -INFINITY) || !visible(d, i, j)) continue;
            const long qoff = b * d.q_batch_stride + i * d.q_token_stride + (long)h * D;
            const long ooff = b * d.o_batch_stride + i * d.o_token_stride + (long)h * D;
            const float *qi = q + qoff, *doi = dout + ooff;
            float p = expf(d.scale * dot(qi, kj, D) - l);
            float ds = p * (dot(doi, vj, D) - ws[row0 + i]);
            for (int c = 0; c < D; c++) {
                dkj[c] += d.scale * ds * qi[c];
                dvj[c] += p * doi[c];
            }
        }
    }
}

void attn_forward(const spb_attn_desc *d, const float *q, const float *k, const float *v, float *o, float *lse)
{
    long n = (long)d->batch * d->heads * d->q_len;
    if (n <= 0) return;
    SPB_KT_BEGIN(0);
    k_attn_forward<<<blocks_for(n), kThreads>>>(*d, q, k, v, o, lse);
    SPB_LAUNCH_CHECK();
}

void attn_backward(const spb_attn_desc *d, const float *q, const float *k, const float *v, const float *o,
                   const float *lse, const float *dout, float *dq, float *dk, float *dv)
{
    long nq = (long)d->batch * d->heads * d->q_len, nk = (long)d->batch * spb_attn_kv_heads(d) * d->k_len;
    if (nq <= 0 || nk <= 0) return;
    float *ws = spb_cuda_attention_workspace(nq);
    SPB_KT_BEGIN(0);
    k_attn_rowdot<<<blocks_for(nq), kThreads>>>(*d, o, dout, ws);
    SPB_LAUNCH_CHECK();
    SPB_KT_BEGIN(0);
    k_attn_backward_dq<<<blocks_for(nq), kThreads>>>(*d, q, k, v, lse, dout, ws, dq);
    SPB_LAUNCH_CHECK();
    SPB_KT_BEGIN(0);
    k_attn_backward_dkdv<<<blocks_for(nk), kThreads>>>(*d, q, k, v, lse, dout, ws, dk, dv);
    SPB_LAUNCH_CHECK();
}

const spb_attn_backend *dev_attention(const char *name)
{
    if (!name) return nullptr;
    if (!strcmp(name, "naive") || !strcmp(name, "flash")) return &spb_attn_cuda_simple;
    if (!strcmp(name, "cudnn")) return spb_cuda_cudnn_attention();
    return nullptr;
}

/* ------------------------------------ copies, optimizer, host staging -- */
void dev_copy(float *dst, const float *src, long n)
{
    if (n > 0) SPB_CUDA_CHECK(cudaMemcpy(dst, src, sizeof(float) * (size_t)n, cudaMemcpyDeviceToDevice));
}

void dev_copy_rows(float *dst, long dst_stride, const float *src, long src_stride, long rows, long width)
{
    if (rows <= 0 || width <= 0) return;
    SPB_CUDA_CHECK(cudaMemcpy2D(dst, sizeof(float) * (size_t)dst_stride, src, sizeof(float) * (size_t)src_stride,
                                sizeof(float) * (size_t)width, (size_t)rows, cudaMemcpyDeviceToDevice));
}

__global__ void k_fill(float *x, long n, float value)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}

void dev_fill(float *x, long n, float value)
{
    if (n <= 0) return;
    SPB_KT_BEGIN(0);
    k_fill<<<blocks_for(n), kThreads>>>(x, n, value);
    SPB_LAUNCH_CHECK();
}

/* attention.h's spb_attn_merge_rows, one thread per (batch, head, query
 * row): the same arithmetic in the same order for each row. */
__global__ void k_attn_merge(float *o_acc, float *lse_acc, const float *o_pair, const float *lse_pair, int batch,
                             int H, int D, int T, int row, int len)
{
    long t = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long)batch * H * len) return;
    int i = (int)(t % len), h = (int)((t / len) % H), b = (int)(t / ((long)len * H));
    float lb = lse_pair[((long)b * H + h) * len + i];
    if (!(lb > -INFINITY)) return;
    float *la = &lse_acc[((long)b * H + h) * T + row + i];
    long at = ((long)b * T + row + i) * ((long)H * D) + (long)h * D;
    float *oa = o_acc + at;
    const float *ob = o_pair + at;
    if (!(*la > -INFINITY)) {
        for (int e = 0; e < D; e++) oa[e] = ob[e];
        *la = lb;
        return;
    }
    float hi = fmaxf(*la, lb), lo = fminf(*la, lb);
    float lse = hi + log1pf(expf(lo - hi));
    float wa = expf(*la - lse), wb = expf(lb - lse);
    for (int e = 0; e < D; e++) oa[e] = oa[e] * wa + ob[e] * wb;
    *la = lse;
}

void dev_attn_merge(float *o_acc, float *lse_acc, const float *o_pair, const float *lse_pair, int batch, int heads,
                    int head_dim, int T, int row, int len)
{
    long n = (long)batch * heads * len;
    if (n <= 0) return;
    SPB_KT_BEGIN(0);
    k_attn_merge<<<blocks_for(n), kThreads>>>(o_acc, lse_acc, o_pair, lse_pair, batch, heads, head_dim, T, row, len);
    SPB_LAUNCH_CHECK();
}

void staging_to_host(void *host, const void *device, size_t bytes)
{
    if (bytes) SPB_CUDA_HOST_WAIT(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
}

void staging_to_device(void *device, const void *host, size_t bytes)
{
    if (bytes) SPB_CUDA_HOST_WAIT(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
}

/* optimizer.c's spb_adamw_apply, element by element (b1, b2, eps, bc1, bc2
 * and lr computed on the host as there, in float). */
__global__ void k_adamw(float *p, const float *grad, float *m, float *v, long n, float grad_scale,
                        const float *device_scale, float weight_decay, float b1, float b2, float eps, float bc1,
                        float bc2, float flr)
{
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = grad[i] * (device_scale ? *device_scale : grad_scale); /* clipping made on the device, or the host's */
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi, v[i] = vi;
    float mhat = mi / bc1, vhat = vi / bc2;
    p[i] -= flr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p[i]);
}

void dev_adamw_apply(float *p, const float *grad, float *m, float *v, long n, float grad_scale, float weight_decay,
                     const spb_config *cfg, long step, double lr)
{
    if (n <= 0) return;
    const float b1 = (float)cfg->adam_beta1, b2 = (float)cfg->adam_beta2, eps = (float)cfg->adam_eps;
    const float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
    SPB_KT_BEGIN(0);
    k_adamw<<<blocks_for(n), kThreads>>>(p, grad, m, v, n, grad_scale, spb_cuda_device_grad_scale(), weight_decay,
                                         b1, b2, eps, bc1, bc2, (float)lr);
    SPB_LAUNCH_CHECK();
}

/* sum of squares in double: one thread per chunk (serial, in order), the
 * chunks' partial sums added in order on the host: deterministic. */
const long kSumChunk = 4096;
__global__ void k_sum_squares_chunks(double *part, const float *x, long n, long nchunks)
{
    long c = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= nchunks) return;
    long a = c * kSumChunk, b = a + kSumChunk < n ? a + kSumChunk : n;
    double s = 0.0;
    for (long i = a; i < b; i++) s += (double)x[i] * x[i];
    part[c] = s;
}

double dev_sum_squares(const float *x, long n)
{
    if (n <= 0) return 0.0;
    long nchunks = (n + kSumChunk - 1) / kSumChunk;
    if (spb_cuda_scalar_target() >= 0) { /* kept on the device, as dev_softmax_xent_forward */
        static void *buf = nullptr;
        static size_t cap = 0;
        double *part = (double *)spb_cuda_grow(&buf, &cap, SPB_MEM_WORKSPACE, sizeof(double) * (size_t)nchunks);
        SPB_KT_BEGIN(0);
        k_sum_squares_chunks<<<blocks_for(nchunks), kThreads>>>(part, x, n, nchunks);
        SPB_LAUNCH_CHECK();
        spb_cuda_scalar_add_ordered(part, nchunks, 0); /* the chunks in order, as below */
        return 0.0;
    }
    double *part = (double *)spb_cuda_alloc(SPB_MEM_WORKSPACE, sizeof(double) * (size_t)nchunks);
    SPB_KT_BEGIN(0);
    k_sum_squares_chunks<<<blocks_for(nchunks), kThreads>>>(part, x, n, nchunks);
    SPB_LAUNCH_CHECK();
    std::vector<double> h((size_t)nchunks);
    SPB_CUDA_HOST_WAIT(cudaMemcpy(h.data(), part, sizeof(double) * (size_t)nchunks, cudaMemcpyDeviceToHost));
    spb_cuda_free(part);
    double s = 0.0;
    for (double v : h) s += v;
    return s;
}

/* ------------------------------------- device, clock, memory readings -- */
int dev_open(int local_rank, char *err, size_t errlen)
{
    int n = spb_cuda_device_count();
    if (n == 0) {
        char why[256];
        spb_cuda_describe(why, sizeof why);
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        if (visible)
            snprintf(err, errlen,
                     "--device cuda: no CUDA device visible to this rank (%s; CUDA_VISIBLE_DEVICES=\"%s\")", why,
                     visible);
        else
            snprintf(err, errlen, "--device cuda: no CUDA device on this machine (%s)", why);
        return -1;
    }
    /* Ranks of one machine take the GPUs they see round-robin: P ranks on
     * one GPU is the host-staged check of every strategy (docs/GPU.md); a
     * launcher that gives each rank one GPU (CUDA_VISIBLE_DEVICES per rank)
     * makes that GPU 0 of every rank. */
    cudaError_t rc = cudaSetDevice(local_rank % n);
    if (rc == cudaSuccess) rc = cudaFree(0); /* create the context now, not inside the first timed step */
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "--device cuda: cannot use GPU %d for local rank %d: %s", local_rank % n, local_rank,
                 cudaGetErrorString(rc));
        return -1;
    }
    return 0;
}

/* "GPU-<uuid> (PCI dddd:bb:dd)": the same in every process that holds the
 * device, whatever index CUDA_VISIBLE_DEVICES gives it there. */
void dev_device_identity(char *buf, size_t len)
{
    int dev = 0;
    cudaDeviceProp p;
    SPB_CUDA_CHECK(cudaGetDevice(&dev));
    SPB_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    const unsigned char *u = (const unsigned char *)p.uuid.bytes;
    snprintf(buf, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x (PCI %04x:%02x:%02x)", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15],
             (unsigned)p.pciDomainID, (unsigned)p.pciBusID, (unsigned)p.pciDeviceID);
}

void dev_synchronize(void) { SPB_CUDA_HOST_WAIT(cudaDeviceSynchronize()); }

double dev_used_bytes(void)
{
    size_t free_b = 0, total_b = 0;
    SPB_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return (double)(total_b - free_b);
}

/* The phase timers' marks: a pool of events recorded on the legacy default
 * stream, where every operation of this table runs. */
std::vector<cudaEvent_t> clock_events;
size_t clock_used;

int clock_mark(void)
{
    if (clock_used == clock_events.size()) {
        cudaEvent_t e;
        SPB_CUDA_CHECK(cudaEventCreate(&e));
        clock_events.push_back(e);
    }
    SPB_CUDA_CHECK(cudaEventRecord(clock_events[clock_used], 0));
    return (int)clock_used++;
}

double clock_elapsed(int from, int to)
{
    float ms = 0.0f;
    SPB_CUDA_CHECK(cudaEventSynchronize(clock_events[(size_t)to]));
    SPB_CUDA_CHECK(cudaEventElapsedTime(&ms, clock_events[(size_t)from], clock_events[(size_t)to]));
    return 1e-3 * ms;
}

void clock_release(void) { clock_used = 0; }

const spb_timer_clock device_clock = {clock_mark, clock_elapsed, clock_release};

/* The table, filled by member name (members this file does not know stay
 * zero: a new entry of backend.h shows up as a NULL call, not a shifted
 * one). */
spb_backend make_table(void)
{
    spb_backend t;
    memset(&t, 0, sizeof t);
    t.name = "cuda";
    t.host_memory = 0; /* MPI stages through host memory (comm.h) */
    t.staging.to_host = staging_to_host;
    t.staging.to_device = staging_to_device;
    /* before a staged collective takes its start time, the kernels queued
     * before it finish, not inside its first cudaMemcpy (comm.h) */
    t.staging.synchronize = dev_synchronize;
    t.attention = dev_attention;
    t.alloc = dev_alloc;
    t.alloc_ints = dev_alloc_ints;
    t.free = dev_free;
    t.zero = dev_zero;
    t.copy = dev_copy;
    t.copy_rows = dev_copy_rows;
    t.fill = dev_fill;
    t.attn_merge = dev_attn_merge;
    t.ints_to_device = dev_ints_to_device;
    t.matmul_forward = dev_matmul_forward;
    t.matmul_backward = dev_matmul_backward;
    t.matmul_forward_ld = dev_matmul_forward_ld;
    t.matmul_backward_ld = dev_matmul_backward_ld;
    t.layernorm_forward = dev_layernorm_forward;
    t.layernorm_backward = dev_layernorm_backward;
    t.rmsnorm_forward = spb_cuda_rmsnorm_forward; /* cuda_llama_ops.cu */
    t.rmsnorm_backward = spb_cuda_rmsnorm_backward;
    t.swiglu_forward = spb_cuda_swiglu_forward;
    t.swiglu_backward = spb_cuda_swiglu_backward;
    t.rope_apply = spb_cuda_rope_apply;
    t.gelu_forward = dev_gelu_forward;
    t.gelu_backward = dev_gelu_backward;
    t.embedding_forward = dev_embedding_forward;
    t.embedding_backward = dev_embedding_backward;
    t.softmax_xent_forward = dev_softmax_xent_forward;
    t.softmax_xent_backward = dev_softmax_xent_backward;
    t.add_inplace = dev_add_inplace;
    t.add_bias_rows = dev_add_bias_rows;
    t.bias_grad_rows = dev_bias_grad_rows;
    t.adamw_apply = dev_adamw_apply;
    t.sum_squares = dev_sum_squares;
    t.scalar_defer = spb_cuda_scalar_defer;
    t.scalars_take = spb_cuda_scalars_take;
    t.clip_on_device = spb_cuda_clip_on_device;
    t.open = dev_open;
    t.device_identity = dev_device_identity;
    t.synchronize = dev_synchronize;
    t.mem_stats = spb_cuda_mem_stats;
    t.mem_reset_peaks = spb_cuda_mem_reset_peaks;
    t.device_used_bytes = dev_used_bytes;
    t.clock = &device_clock;
    return t;
}

} // namespace

extern "C" const spb_attn_backend spb_attn_cuda_simple = {
    "cuda-simple",
    attn_forward,
    attn_backward,
};

/* Dynamic initialisation (before main): read only once the core runs. */
extern "C" const spb_backend spb_backend_cuda = make_table();
