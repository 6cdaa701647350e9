/* The fp32 CUDA kernels of Llama-style layers (cuda_llama_ops.h), written
 * as cuda_backend.cu's LayerNorm and GELU are: the obviously-right version
 * of common/core/ops_llama_cpu.c, in its order where that is cheap.
 *   - RMSNorm: one thread per row forward and for dinp (the CPU's serial
 *     loops, float accumulators); dw one thread per column, rows in order;
 *   - SwiGLU: one thread per element (expf where the CPU has spb_expf: a
 *     few ulp apart);
 *   - RoPE: one thread per rotated pair, angles from a table the host
 *     computes with the CPU's own double formula, so that a token's
 *     rotation has the CPU's bits at its global position on every rank. */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_llama_ops.h"
#include "cuda_trace.h"
#include "ops.h"
#include "spb_cuda.h"


namespace {

const int kThreads = 256;

unsigned blocks_for(long n) { return (unsigned)((n + kThreads - 1) / kThreads); }

/* ----------------------------------------------------------- RMSNorm -- */
__global__ void k_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int rows, int C)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float *x = inp + (long)r * C;
    float *y = out + (long)r * C;
    float ms = 0.0f;
    for (int i = 0; i < C; i++) ms += x[i] * x[i];
    ms /= (float)C;
    float s = 1.0f / sqrtf(ms + SPB_RMSNORM_EPS);
    for (int i = 0; i < C; i++) y[i] = x[i] * s * w[i];
    rstd[r] = s;
}

/* dw += sum_r dy xhat, xhat = x s; one thread a column, rows in order */
__global__ void k_rmsnorm_backward_cols(float *dw, const float *dout, const float *inp, const float *rstd, int rows,
                                        int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C) return;
    float aw = dw[i];
    for (int r = 0; r < rows; r++) aw += dout[(long)r * C + i] * (inp[(long)r * C + i] * rstd[r]);
    dw[i] = aw;
}

/* dinp += s (g - xhat mean(g xhat)), g = dy w; one thread a row */
__global__ void k_rmsnorm_backward_rows(float *dinp, const float *dout, const float *inp, const float *w,
                                        const float *rstd, int rows, int C)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float *dy = dout + (long)r * C;
    const float *x = inp + (long)r * C;
    float *dx = dinp + (long)r * C;
    float s = rstd[r];
    float sum_gx = 0.0f;
    for (int i = 0; i < C; i++) sum_gx += dy[i] * w[i] * (x[i] * s);
    sum_gx /= (float)C;
    for (int i = 0; i < C; i++) dx[i] += s * (dy[i] * w[i] - x[i] * s * sum_gx);
}

/* ------------------------------------------------------------ SwiGLU -- */
__device__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

/* out[r][i] = silu(gate) up, rows of inp [gate F | up F] */
__global__ void k_swiglu_forward(float *out, const float *inp, int rows, int F)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)rows * F) return;
    long r = idx / F, i = idx % F;
    float a = inp[r * 2 * F + i], up = inp[r * 2 * F + F + i];
    out[idx] = a * sigmoid(a) * up;
}

__global__ void k_swiglu_backward(float *dinp, const float *inp, const float *dout, int rows, int F)
{
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)rows * F) return;
    long r = idx / F, i = idx % F;
    float a = inp[r * 2 * F + i], up = inp[r * 2 * F + F + i], dy = dout[idx];
    float s = sigmoid(a), silu = a * s;
    dinp[r * 2 * F + F + i] = dy * silu;
    dinp[r * 2 * F + i] = dy * up * (s + silu * (1.0f - s));
}

/* -------------------------------------------------------------- RoPE -- */
/* cos and sin of every (token, pair) angle, [tokens][half] each, for the
 * last positions/head_dim/base asked: the core passes the same global
 * positions on every call of a run, so the host computes the table once and
 * later calls compare T longs.  A growing device buffer (no cudaFree per
 * call); the upload on the legacy stream waits for the kernels that read
 * the old table. */
struct rope_table {
    long *positions = nullptr; /* host copy of the positions it was made for */
    int tokens = 0, head_dim = 0;
    double base = 0.0;
    void *dev = nullptr; /* float cos[tokens][half], then sin[tokens][half] */
    size_t cap = 0;
};
rope_table table;

const float *rope_angles(const long *positions, int tokens, int head_dim, double base)
{
    const int half = head_dim / 2;
    if (table.positions && table.tokens == tokens && table.head_dim == head_dim && table.base == base &&
        !memcmp(table.positions, positions, sizeof(long) * (size_t)tokens))
        return (const float *)table.dev;
    size_t n = (size_t)tokens * (size_t)half;
    float *host = (float *)malloc(sizeof(float) * 2 * (n ? n : 1));
    long *pos = (long *)realloc(table.positions, sizeof(long) * (size_t)(tokens > 0 ? tokens : 1));
    SPB_CHECK(host && pos);
    table.positions = pos;
    for (int t = 0; t < tokens; t++)
        for (int i = 0; i < half; i++) {
            double angle = spb_rope_angle(positions[t], i, head_dim, base); /* the CPU's, bit for bit */
            host[(size_t)t * half + i] = (float)cos(angle);
            host[n + (size_t)t * half + i] = (float)sin(angle);
        }
    float *dev = (float *)spb_cuda_grow(&table.dev, &table.cap, SPB_MEM_WORKSPACE, sizeof(float) * 2 * (n ? n : 1));
    SPB_CUDA_CHECK(cudaMemcpy(dev, host, sizeof(float) * 2 * n, cudaMemcpyHostToDevice));
    free(host);
    memcpy(table.positions, positions, sizeof(long) * (size_t)tokens);
    table.tokens = tokens, table.head_dim = head_dim, table.base = base;
    return dev;
}

/* One thread per (batch, token, head, pair i): rotate-half pairs (i, i + D/2). */
__global__ void k_rope(float *x, const float *cosines, const float *sines, int batch, int tokens, long token_stride,
                       long batch_stride, int heads, int head_dim, int inverse)
{
    const int half = head_dim / 2;
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)batch * tokens * heads * half) return;
    int i = (int)(idx % half), h = (int)(idx / half % heads), t = (int)(idx / half / heads % tokens);
    int b = (int)(idx / half / heads / tokens);
    float c = cosines[(long)t * half + i], s = sines[(long)t * half + i];
    if (inverse) s = -s;
    float *v = x + b * batch_stride + t * token_stride + (long)h * head_dim;
    float lo = v[i], hi = v[i + half];
    v[i] = lo * c - hi * s;
    v[i + half] = hi * c + lo * s;
}

} // namespace

extern "C" void spb_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int rows, int C)
{
    if (rows <= 0) return;
    SPB_KT_BEGIN(0);
    k_rmsnorm_forward<<<blocks_for(rows), kThreads>>>(out, rstd, inp, w, rows, C);
    SPB_LAUNCH_CHECK();
}

extern "C" void spb_cuda_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                                          const float *rstd, int rows, int C)
{
    if (rows <= 0 || C <= 0) return;
    /* the columns first: dout may alias dinp per element, as in LayerNorm's */
    SPB_KT_BEGIN(0);
    k_rmsnorm_backward_cols<<<blocks_for(C), kThreads>>>(dw, dout, inp, rstd, rows, C);
    SPB_LAUNCH_CHECK();
    SPB_KT_BEGIN(0);
    k_rmsnorm_backward_rows<<<blocks_for(rows), kThreads>>>(dinp, dout, inp, w, rstd, rows, C);
    SPB_LAUNCH_CHECK();
}

extern "C" void spb_cuda_swiglu_forward(float *out, const float *inp, int rows, int F)
{
    long n = (long)rows * F;
    if (n <= 0) return;
    SPB_KT_BEGIN(0);
    k_swiglu_forward<<<blocks_for(n), kThreads>>>(out, inp, rows, F);
    SPB_LAUNCH_CHECK();
}

extern "C" void spb_cuda_swiglu_backward(float *dinp, const float *inp, const float *dout, int rows, int F)
{
    long n = (long)rows * F;
    if (n <= 0) return;
    SPB_KT_BEGIN(0);
    k_swiglu_backward<<<blocks_for(n), kThreads>>>(dinp, inp, dout, rows, F);
    SPB_LAUNCH_CHECK();
}

extern "C" void spb_cuda_rope_apply(float *x, const long *positions, int batch, int tokens, long token_stride,
                                    long batch_stride, int heads, int head_dim, double base, int inverse)
{
    long n = (long)batch * tokens * heads * (head_dim / 2);
    if (n <= 0) return;
    const float *angles = rope_angles(positions, tokens, head_dim, base);
    const long half_table = (long)tokens * (head_dim / 2);
    SPB_KT_BEGIN(0);
    k_rope<<<blocks_for(n), kThreads>>>(x, angles, angles + half_table, batch, tokens, token_stride, batch_stride,
                                        heads, head_dim, inverse);
    SPB_LAUNCH_CHECK();
}
