/* Over 700 lines: the tables' row-wise kernels, each short and each beside its simple version, sharing launch helpers. */
/* Row-wise and elementwise kernels of the GPT core (spb_cuda.h), each in a
 * SIMPLE version (serial loops as in ops_cpu.c, one thread per row/column/
 * element) and, where it matters, a FAST one (warp per row, vector loads,
 * block reductions). */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "cuda_check.h"
#include "cuda_launch.cuh"
#include "gelu.cuh"
#include "spb_cuda.h"
#include "ulysses_layout.h"


typedef __nv_bfloat16 bf16;

static inline unsigned blocks_for(long n, int threads)
{
    long b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : (b > 2147483647L ? 2147483647L : b));
}
#define LAUNCH_CHECK() SPB_CUDA_CHECK(cudaGetLastError())

__device__ __forceinline__ float ld(const spb_bf16 *p, long i) { return __bfloat162float(((const bf16 *)p)[i]); }
__device__ __forceinline__ void st(spb_bf16 *p, long i, float x) { ((bf16 *)p)[i] = __float2bfloat16_rn(x); }


/* ---- conversions ---------------------------------------------------------- */
__global__ void k_f32_to_bf16(spb_bf16 *out, const float *in, long n)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        st(out, i, in[i]);
}
__global__ void k_bf16_to_f32(float *out, const spb_bf16 *in, long n)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        out[i] = ld(in, i);
}
/* four at a time: 16-byte loads, 8-byte stores */
__global__ void k_f32_to_bf16_x4(uint2 *out, const float4 *in, long n4)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        const float4 v = in[i];
        out[i] = spb_bf16x4_pack(v.x, v.y, v.z, v.w);
    }
}
static unsigned grid_stride_blocks(long n) { unsigned b = blocks_for(n, 256); return b > 65535u * 8 ? 65535u * 8 : b; }

extern "C" void spb_cuda_f32_to_bf16(spb_bf16 *out, const float *in, long n, cudaStream_t s)
{
    if (n <= 0) return;
    if (n % 4 == 0 && (uintptr_t)in % 16 == 0 && (uintptr_t)out % 8 == 0)
        k_f32_to_bf16_x4<<<grid_stride_blocks(n / 4), 256, 0, s>>>((uint2 *)out, (const float4 *)in, n / 4);
    else
        k_f32_to_bf16<<<grid_stride_blocks(n), 256, 0, s>>>(out, in, n);
    LAUNCH_CHECK();
}
extern "C" void spb_cuda_bf16_to_f32(float *out, const spb_bf16 *in, long n, cudaStream_t s)
{
    if (n <= 0) return;
    k_bf16_to_f32<<<grid_stride_blocks(n), 256, 0, s>>>(out, in, n);
    LAUNCH_CHECK();
}

/* ---- embedding ---------------------------------------------------------------- */
__global__ void k_embed_fwd_simple(float *out, const int *tokens, const spb_bf16 *wte, const spb_bf16 *wpe,
                                   const long *pos, int rows, int T, int C)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= (long)rows * C) return;
    int r = (int)(i / C), c = (int)(i % C);
    out[i] = ld(wte, (long)tokens[r] * C + c) + ld(wpe, pos[r % T] * C + c);
}
/* one block per row, 8 bf16 per 16-byte load (C % 8 == 0) */
__global__ void k_embed_fwd_fast(float *out, const int *tokens, const spb_bf16 *wte, const spb_bf16 *wpe,
                                 const long *pos, int T, int C)
{
    int r = blockIdx.x;
    const uint4 *e = (const uint4 *)(wte + (long)tokens[r] * C);
    const uint4 *p = (const uint4 *)(wpe + pos[r % T] * C);
    float4 *y = (float4 *)(out + (long)r * C);
    for (int c = threadIdx.x; c < C / 8; c += blockDim.x) {
        uint4 a = e[c], b = p[c];
        const bf16 *ah = (const bf16 *)&a, *bh = (const bf16 *)&b;
        float v[8];
        for (int j = 0; j < 8; j++) v[j] = __bfloat162float(ah[j]) + __bfloat162float(bh[j]);
        y[2 * c] = make_float4(v[0], v[1], v[2], v[3]);
        y[2 * c + 1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}
extern "C" void spb_cuda_embedding_forward(float *out, const int *tokens, const spb_bf16 *wte, const spb_bf16 *wpe,
                                           const long *positions, int rows, int T, int C, spb_cuda_impl impl,
                                           cudaStream_t s)
{
    if (impl == SPB_CUDA_FAST && C % 8 == 0)
        k_embed_fwd_fast<<<rows, 128, 0, s>>>(out, tokens, wte, wpe, positions, T, C);
    else
        k_embed_fwd_simple<<<blocks_for((long)rows * C, 256), 256, 0, s>>>(out, tokens, wte, wpe, positions, rows, T,
                                                                            C);
    LAUNCH_CHECK();
}

__global__ void k_embed_bwd_simple(float *dwte, float *dwpe, const float *dout, const int *tokens, const long *pos,
                                   int rows, int T, int C)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= (long)rows * C) return;
    int r = (int)(i / C), c = (int)(i % C);
    atomicAdd(dwte + (long)tokens[r] * C + c, dout[i]);
    atomicAdd(dwpe + pos[r % T] * C + c, dout[i]);
}
/* Positions repeat every T rows: the wpe gradient of position row t sums B
 * rows without atomics (one thread per (t, c)); wte keeps atomics (tokens
 * repeat arbitrarily). */
__global__ void k_embed_bwd_wpe(float *dwpe, const float *dout, const long *pos, int rows, int T, int C)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= (long)T * C) return;
    int t = (int)(i / C), c = (int)(i % C);
    float acc = 0.0f;
    for (int r = t; r < rows; r += T) acc += dout[(long)r * C + c];
    dwpe[pos[t] * C + c] += acc;
}
__global__ void k_embed_bwd_wte(float *dwte, const float *dout, const int *tokens, int rows, int C)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= (long)rows * C) return;
    int r = (int)(i / C), c = (int)(i % C);
    atomicAdd(dwte + (long)tokens[r] * C + c, dout[i]);
}
extern "C" void spb_cuda_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                                            const long *positions, int rows, int T, int C, spb_cuda_impl impl,
                                            cudaStream_t s)
{
    long n = (long)rows * C;
    if (impl == SPB_CUDA_FAST) {
        /* positions[t] distinct within a sequence (a permutation of positions) */
        k_embed_bwd_wpe<<<blocks_for((long)T * C, 256), 256, 0, s>>>(dwpe, dout, positions, rows, T, C);
        LAUNCH_CHECK();
        k_embed_bwd_wte<<<blocks_for(n, 256), 256, 0, s>>>(dwte, dout, tokens, rows, C);
    } else {
        k_embed_bwd_simple<<<blocks_for(n, 256), 256, 0, s>>>(dwte, dwpe, dout, tokens, positions, rows, T, C);
    }
    LAUNCH_CHECK();
}

/* ---- LayerNorm ------------------------------------------------------------------ */
__global__ void k_ln_fwd_simple(spb_bf16 *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, int rows, int C)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float *x = inp + (long)r * C;
    float m = 0.0f;
    for (int i = 0; i < C; i++) m += x[i];
    m /= (float)C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    v /= (float)C;
    float sd = 1.0f / sqrtf(v + 1e-5f);
    for (int i = 0; i < C; i++) st(out, (long)r * C + i, (x[i] - m) * sd * w[i] + b[i]);
    mean[r] = m;
    rstd[r] = sd;
}
/* one warp per row, two passes over the row (it stays in L1/L2) */
__global__ void k_ln_fwd_fast(spb_bf16 *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *b, int rows, int C)
{
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows) return;
    const float *x = inp + (long)r * C;
    float m = 0.0f;
    for (int i = lane; i < C; i += 32) m += x[i];
    m = spb_warp_sum(m) / (float)C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) v += (x[i] - m) * (x[i] - m);
    v = spb_warp_sum(v) / (float)C;
    float sd = rsqrtf(v + 1e-5f);
    for (int i = lane; i < C; i += 32) st(out, (long)r * C + i, (x[i] - m) * sd * w[i] + b[i]);
    if (lane == 0) {
        mean[r] = m;
        rstd[r] = sd;
    }
}
/* Row blocks: 256 threads share a row, each holding VPT = C/256 of its
 * values in registers (16-byte loads), so the row is read from memory once.
 * The warp-per-row kernels above read it two or three times, from L2 in the
 * best case; at the 7B shape (C = 4096) an SM holds 64 rows of 16 KB in
 * flight, 135 MB over an H200, nearly three times its L2, so the re-reads
 * go to memory.  C = 1024, 2048, 4096, 8192 (VPT 4, 8, 16, 32); other widths
 * take the warp kernels. */
#define LN_BLOCK 256
static bool ln_row_blocks = true;
extern "C" int spb_cuda_layernorm_set_row_blocks(int on)
{
    int was = ln_row_blocks;
    ln_row_blocks = on != 0;
    return was;
}
/* the three fp32 vectors 16-byte aligned, the bf16 one 8 (the row blocks'
 * vector accesses) */
static int ln_block_vpt(int C, const float *f1, const float *f2, const float *f3, const spb_bf16 *h)
{
    const uintptr_t f = (uintptr_t)f1 | (uintptr_t)f2 | (uintptr_t)f3;
    if (!ln_row_blocks || C % (4 * LN_BLOCK) || f % 16 || (uintptr_t)h % 8) return 0;
    int vpt = C / LN_BLOCK;
    return vpt == 4 || vpt == 8 || vpt == 16 || vpt == 32 ? vpt : 0;
}
/* column of value k of this thread: 4 consecutive per 16-byte chunk */
__device__ __forceinline__ int ln_col(int k) { return 4 * ((int)threadIdx.x + LN_BLOCK * (k / 4)) + k % 4; }
__device__ __forceinline__ void ln_load4(float *v, const float *p, long i)
{
    const float4 q = *(const float4 *)(p + i);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}

template <int VPT>
__global__ void __launch_bounds__(LN_BLOCK) k_ln_fwd_block(spb_bf16 *out, float *mean, float *rstd,
                                                           const float *inp, const float *w, const float *b, int C)
{
    __shared__ float red[LN_BLOCK / 32];
    const int r = blockIdx.x;
    const long o = (long)r * C;
    float v[VPT];
    for (int k = 0; k < VPT; k += 4) ln_load4(&v[k], inp, o + ln_col(k));
    float m = 0.0f;
    for (int k = 0; k < VPT; k++) m += v[k];
    m = spb_block_reduce<LN_BLOCK>(m, false, red) / (float)C;
    float var = 0.0f;
    for (int k = 0; k < VPT; k++) var += (v[k] - m) * (v[k] - m);
    var = spb_block_reduce<LN_BLOCK>(var, false, red);
    const float sd = rsqrtf(var / (float)C + 1e-5f);
    for (int k = 0; k < VPT; k += 4) {
        const int c = ln_col(k);
        const float4 wk = *(const float4 *)(w + c), bk = *(const float4 *)(b + c);
        *(uint2 *)((bf16 *)out + o + c) =
            spb_bf16x4_pack((v[k] - m) * sd * wk.x + bk.x, (v[k + 1] - m) * sd * wk.y + bk.y,
                            (v[k + 2] - m) * sd * wk.z + bk.z, (v[k + 3] - m) * sd * wk.w + bk.w);
    }
    if (threadIdx.x == 0) mean[r] = m, rstd[r] = sd;
}

extern "C" void spb_cuda_layernorm_forward(spb_bf16 *out, float *mean, float *rstd, const float *inp, const float *w,
                                           const float *b, int rows, int C, spb_cuda_impl impl, cudaStream_t s)
{
    if (rows <= 0) return;
    const int vpt = impl == SPB_CUDA_FAST ? ln_block_vpt(C, inp, w, b, out) : 0;
    if (vpt == 4) k_ln_fwd_block<4><<<rows, LN_BLOCK, 0, s>>>(out, mean, rstd, inp, w, b, C);
    else if (vpt == 8) k_ln_fwd_block<8><<<rows, LN_BLOCK, 0, s>>>(out, mean, rstd, inp, w, b, C);
    else if (vpt == 16) k_ln_fwd_block<16><<<rows, LN_BLOCK, 0, s>>>(out, mean, rstd, inp, w, b, C);
    else if (vpt == 32) k_ln_fwd_block<32><<<rows, LN_BLOCK, 0, s>>>(out, mean, rstd, inp, w, b, C);
    else if (impl == SPB_CUDA_FAST)
        k_ln_fwd_fast<<<blocks_for(rows, 8), 256, 0, s>>>(out, mean, rstd, inp, w, b, rows, C);
    else
        k_ln_fwd_simple<<<blocks_for(rows, 128), 128, 0, s>>>(out, mean, rstd, inp, w, b, rows, C);
    LAUNCH_CHECK();
}

__global__ void k_ln_bwd_dx_simple(float *dinp, const spb_bf16 *dout, const float *inp, const float *w,
                                   const float *mean, const float *rstd, int rows, int C)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float *x = inp + (long)r * C;
    float m = mean[r], sd = rstd[r], sum_g = 0.0f, sum_gx = 0.0f;
    for (int i = 0; i < C; i++) {
        float g = ld(dout, (long)r * C + i) * w[i];
        sum_g += g;
        sum_gx += g * (x[i] - m) * sd;
    }
    sum_g /= (float)C;
    sum_gx /= (float)C;
    for (int i = 0; i < C; i++) {
        float xhat = (x[i] - m) * sd;
        dinp[(long)r * C + i] += sd * (ld(dout, (long)r * C + i) * w[i] - sum_g - xhat * sum_gx);
    }
}
__global__ void k_ln_bwd_dwdb_simple(float *dw, float *db, const spb_bf16 *dout, const float *inp, const float *mean,
                                     const float *rstd, int rows, int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int r = 0; r < rows; r++) {
        float dy = ld(dout, (long)r * C + i);
        sb += dy;
        sw += dy * (inp[(long)r * C + i] - mean[r]) * rstd[r];
    }
    dw[i] += sw;
    db[i] += sb;
}
/* dx: warp per row.  dw, db: each block takes a strip of rows, every thread
 * a column at a time, then one atomicAdd per column per block. */
__global__ void k_ln_bwd_dx_fast(float *dinp, const spb_bf16 *dout, const float *inp, const float *w,
                                 const float *mean, const float *rstd, int rows, int C)
{
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows) return;
    const float *x = inp + (long)r * C;
    const long o = (long)r * C;
    float m = mean[r], sd = rstd[r], sum_g = 0.0f, sum_gx = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float g = ld(dout, o + i) * w[i];
        sum_g += g;
        sum_gx += g * (x[i] - m) * sd;
    }
    sum_g = spb_warp_sum(sum_g) / (float)C;
    sum_gx = spb_warp_sum(sum_gx) / (float)C;
    for (int i = lane; i < C; i += 32) {
        float xhat = (x[i] - m) * sd;
        dinp[o + i] += sd * (ld(dout, o + i) * w[i] - sum_g - xhat * sum_gx);
    }
}
#define LN_ROWS_PER_BLOCK 64
__global__ void k_ln_bwd_dwdb_fast(float *dw, float *db, const spb_bf16 *dout, const float *inp, const float *mean,
                                   const float *rstd, int rows, int C)
{
    int r0 = blockIdx.y * LN_ROWS_PER_BLOCK, r1 = min(rows, r0 + LN_ROWS_PER_BLOCK);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < C; i += gridDim.x * blockDim.x) {
        float sw = 0.0f, sb = 0.0f;
        for (int r = r0; r < r1; r++) {
            float dy = ld(dout, (long)r * C + i);
            sb += dy;
            sw += dy * (inp[(long)r * C + i] - mean[r]) * rstd[r];
        }
        atomicAdd(dw + i, sw);
        atomicAdd(db + i, sb);
    }
}
/* The backward in row blocks, dx and dw/db in one kernel: a block walks a
 * strip of rows, each thread on the same VPT columns throughout, so dout
 * and x are read once per row (the kernels above read them three times)
 * and the weight and bias gradients are summed per thread over the strip,
 * then one atomicAdd per column per block. */
#define LN_BWD_ROWS 32
template <int VPT>
__global__ void __launch_bounds__(LN_BLOCK) k_ln_bwd_block(float *dinp, float *dw, float *db, const spb_bf16 *dout,
                                                           const float *inp, const float *w, const float *mean,
                                                           const float *rstd, int rows, int C)
{
    __shared__ float red[LN_BLOCK / 32];
    float wv[VPT], gw[VPT], gb[VPT];
    for (int k = 0; k < VPT; k += 4) ln_load4(&wv[k], w, ln_col(k));
    for (int k = 0; k < VPT; k++) gw[k] = 0.0f, gb[k] = 0.0f;
    const int r0 = blockIdx.x * LN_BWD_ROWS, r1 = min(rows, r0 + LN_BWD_ROWS);
    for (int r = r0; r < r1; r++) {
        const long o = (long)r * C;
        const float m = mean[r], sd = rstd[r];
        float dy[VPT], xh[VPT];
        for (int k = 0; k < VPT; k += 4) {
            spb_bf16x4_unpack(*(const uint2 *)((const bf16 *)dout + o + ln_col(k)), &dy[k]);
            ln_load4(&xh[k], inp, o + ln_col(k));
        }
        float sum_g = 0.0f, sum_gx = 0.0f;
        for (int k = 0; k < VPT; k++) {
            xh[k] = (xh[k] - m) * sd;
            const float g = dy[k] * wv[k];
            sum_g += g, sum_gx += g * xh[k];
            gb[k] += dy[k], gw[k] += dy[k] * xh[k];
        }
        sum_g = spb_block_reduce<LN_BLOCK>(sum_g, false, red) / (float)C;
        sum_gx = spb_block_reduce<LN_BLOCK>(sum_gx, false, red) / (float)C;
        for (int k = 0; k < VPT; k += 4) {
            float4 *d = (float4 *)(dinp + o + ln_col(k));
            float4 a = *d;
            a.x += sd * (dy[k] * wv[k] - sum_g - xh[k] * sum_gx);
            a.y += sd * (dy[k + 1] * wv[k + 1] - sum_g - xh[k + 1] * sum_gx);
            a.z += sd * (dy[k + 2] * wv[k + 2] - sum_g - xh[k + 2] * sum_gx);
            a.w += sd * (dy[k + 3] * wv[k + 3] - sum_g - xh[k + 3] * sum_gx);
            *d = a;
        }
    }
    for (int k = 0; k < VPT; k++) atomicAdd(dw + ln_col(k), gw[k]), atomicAdd(db + ln_col(k), gb[k]);
}

extern "C" void spb_cuda_layernorm_backward(float *dinp, float *dw, float *db, const spb_bf16 *dout, const float *inp,
                                            const float *w, const float *mean, const float *rstd, int rows, int C,
                                            spb_cuda_impl impl, cudaStream_t s)
{
    if (rows <= 0) return;
    const int vpt = impl == SPB_CUDA_FAST ? ln_block_vpt(C, dinp, inp, w, dout) : 0;
    if (vpt) {
        const unsigned grid = (unsigned)((rows + LN_BWD_ROWS - 1) / LN_BWD_ROWS);
        if (vpt == 4) k_ln_bwd_block<4><<<grid, LN_BLOCK, 0, s>>>(dinp, dw, db, dout, inp, w, mean, rstd, rows, C);
        else if (vpt == 8) k_ln_bwd_block<8><<<grid, LN_BLOCK, 0, s>>>(dinp, dw, db, dout, inp, w, mean, rstd, rows, C);
        else if (vpt == 16)
            k_ln_bwd_block<16><<<grid, LN_BLOCK, 0, s>>>(dinp, dw, db, dout, inp, w, mean, rstd, rows, C);
        else k_ln_bwd_block<32><<<grid, LN_BLOCK, 0, s>>>(dinp, dw, db, dout, inp, w, mean, rstd, rows, C);
    } else if (impl == SPB_CUDA_FAST) {
        k_ln_bwd_dx_fast<<<blocks_for(rows, 8), 256, 0, s>>>(dinp, dout, inp, w, mean, rstd, rows, C);
        LAUNCH_CHECK();
        dim3 grid(blocks_for(C, 256), (rows + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
        k_ln_bwd_dwdb_fast<<<grid, 256, 0, s>>>(dw, db, dout, inp, mean, rstd, rows, C);
    } else {
        k_ln_bwd_dx_simple<<<blocks_for(rows, 128), 128, 0, s>>>(dinp, dout, inp, w, mean, rstd, rows, C);
        LAUNCH_CHECK();
        k_ln_bwd_dwdb_simple<<<blocks_for(C, 128), 128, 0, s>>>(dw, db, dout, inp, mean, rstd, rows, C);
    }
    LAUNCH_CHECK();
}

/* ---- GELU, residual add (elementwise; FAST = 8 bf16 per 16-byte access) ---- */
__global__ void k_gelu_fwd_simple(spb_bf16 *out, const spb_bf16 *inp, long n)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) st(out, i, spb_gelu_value(ld(inp, i)));
}
__global__ void k_gelu_bwd_simple(spb_bf16 *dinp, const spb_bf16 *inp, const spb_bf16 *dout, long n)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) st(dinp, i, ld(dout, i) * spb_gelu_slope(ld(inp, i)));
}
__global__ void k_gelu_fwd_fast(uint4 *out, const uint4 *inp, long n8)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n8; i += (long)gridDim.x * blockDim.x) {
        uint4 a = inp[i], y;
        const bf16 *ah = (const bf16 *)&a;
        bf16 *yh = (bf16 *)&y;
        for (int j = 0; j < 8; j++) yh[j] = __float2bfloat16_rn(spb_gelu_value(__bfloat162float(ah[j])));
        out[i] = y;
    }
}
__global__ void k_gelu_bwd_fast(uint4 *dinp, const uint4 *inp, const uint4 *dout, long n8)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n8; i += (long)gridDim.x * blockDim.x) {
        uint4 a = inp[i], g = dout[i], y;
        const bf16 *ah = (const bf16 *)&a, *gh = (const bf16 *)&g;
        bf16 *yh = (bf16 *)&y;
        for (int j = 0; j < 8; j++)
            yh[j] = __float2bfloat16_rn(__bfloat162float(gh[j]) * spb_gelu_slope(__bfloat162float(ah[j])));
        dinp[i] = y;
    }
}
static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

extern "C" void spb_cuda_gelu_forward(spb_bf16 *out, const spb_bf16 *inp, long n, spb_cuda_impl impl, cudaStream_t s)
{
    if (n <= 0) return;
    if (impl == SPB_CUDA_FAST && n % 8 == 0 && aligned16(out) && aligned16(inp))
        k_gelu_fwd_fast<<<grid_stride_blocks(n / 8), 256, 0, s>>>((uint4 *)out, (const uint4 *)inp, n / 8);
    else
        k_gelu_fwd_simple<<<blocks_for(n, 256), 256, 0, s>>>(out, inp, n);
    LAUNCH_CHECK();
}
extern "C" void spb_cuda_gelu_backward(spb_bf16 *dinp, const spb_bf16 *inp, const spb_bf16 *dout, long n,
                                       spb_cuda_impl impl, cudaStream_t s)
{
    if (n <= 0) return;
    if (impl == SPB_CUDA_FAST && n % 8 == 0 && aligned16(dinp) && aligned16(inp) && aligned16(dout))
        k_gelu_bwd_fast<<<grid_stride_blocks(n / 8), 256, 0, s>>>((uint4 *)dinp, (const uint4 *)inp,
                                                                   (const uint4 *)dout, n / 8);
    else
        k_gelu_bwd_simple<<<blocks_for(n, 256), 256, 0, s>>>(dinp, inp, dout, n);
    LAUNCH_CHECK();
}

/* GELU backward and the bias gradient of its output in one pass: dinp =
 * dout·gelu'(inp) (bf16), db[c] += sum_r dinp[r][c] over the rounded values
 * (what spb_cuda_bias_grad would read back).  A block: 32 lanes x 8 columns
 * (16-byte accesses) by 8 row lanes, a strip of 256 rows, one atomicAdd per
 * column per strip.  n % 8 == 0, the three matrices 16-byte aligned. */
#define GB_ROWS 256
__global__ void __launch_bounds__(256) k_gelu_bwd_bias_grad(uint4 *dinp, const uint4 *inp, const uint4 *dout,
                                                            float *db, int rows, int n)
{
    __shared__ float part[8][32 * 8 + 1];
    const int n8 = n / 8, c8 = blockIdx.x * 32 + threadIdx.x;
    const int r0 = blockIdx.y * GB_ROWS, r1 = min(rows, r0 + GB_ROWS);
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (c8 < n8)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            const long i = (long)r * n8 + c8;
            uint4 a = inp[i], g = dout[i], y;
            const bf16 *ah = (const bf16 *)&a, *gh = (const bf16 *)&g;
            bf16 *yh = (bf16 *)&y;
            for (int j = 0; j < 8; j++) {
                yh[j] = __float2bfloat16_rn(__bfloat162float(gh[j]) * spb_gelu_slope(__bfloat162float(ah[j])));
                acc[j] += __bfloat162float(yh[j]);
            }
            dinp[i] = y;
        }
    for (int j = 0; j < 8; j++) part[threadIdx.y][threadIdx.x * 8 + j] = acc[j];
    __syncthreads();
    if (threadIdx.y == 0 && c8 < n8)
        for (int j = 0; j < 8; j++) {
            float t = 0.0f;
            for (int k = 0; k < 8; k++) t += part[k][threadIdx.x * 8 + j];
            atomicAdd(db + 8 * c8 + j, t);
        }
}
extern "C" void spb_cuda_gelu_backward_bias_grad(spb_bf16 *dinp, const spb_bf16 *inp, const spb_bf16 *dout,
                                                 float *db, int rows, int n, spb_cuda_impl impl, cudaStream_t s)
{
    if (rows <= 0 || n <= 0) return;
    if (impl == SPB_CUDA_FAST && n % 8 == 0 && aligned16(dinp) && aligned16(inp) && aligned16(dout)) {
        dim3 grid((unsigned)((n / 8 + 31) / 32), (unsigned)((rows + GB_ROWS - 1) / GB_ROWS)), block(32, 8);
        k_gelu_bwd_bias_grad<<<grid, block, 0, s>>>((uint4 *)dinp, (const uint4 *)inp, (const uint4 *)dout, db, rows,
                                                    n);
        LAUNCH_CHECK();
        return;
    }
    spb_cuda_gelu_backward(dinp, inp, dout, (long)rows * n, impl, s);
    spb_cuda_bias_grad(db, dinp, rows, n, impl, s);
}

__global__ void k_residual_simple(float *a, const spb_bf16 *b, long n)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) a[i] += ld(b, i);
}
__global__ void k_residual_fast(float4 *a, const uint4 *b, long n8)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n8; i += (long)gridDim.x * blockDim.x) {
        uint4 v = b[i];
        const bf16 *h = (const bf16 *)&v;
        float4 x0 = a[2 * i], x1 = a[2 * i + 1];
        x0.x += __bfloat162float(h[0]), x0.y += __bfloat162float(h[1]);
        x0.z += __bfloat162float(h[2]), x0.w += __bfloat162float(h[3]);
        x1.x += __bfloat162float(h[4]), x1.y += __bfloat162float(h[5]);
        x1.z += __bfloat162float(h[6]), x1.w += __bfloat162float(h[7]);
        a[2 * i] = x0, a[2 * i + 1] = x1;
    }
}
extern "C" void spb_cuda_residual_add(float *a, const spb_bf16 *b, long n, spb_cuda_impl impl, cudaStream_t s)
{
    if (n <= 0) return;
    if (impl == SPB_CUDA_FAST && n % 8 == 0 && aligned16(a) && aligned16(b))
        k_residual_fast<<<grid_stride_blocks(n / 8), 256, 0, s>>>((float4 *)a, (const uint4 *)b, n / 8);
    else
        k_residual_simple<<<blocks_for(n, 256), 256, 0, s>>>(a, b, n);
    LAUNCH_CHECK();
}

/* ---- bias gradient -------------------------------------------------------------- */
__global__ void k_bias_grad_simple(float *db, const spb_bf16 *dout, int rows, int n)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float acc = 0.0f;
    for (int r = 0; r < rows; r++) acc += ld(dout, (long)r * n + c);
    db[c] += acc;
}
/* block (32 columns x 8 row lanes) over a strip of rows; smem reduce; one
 * atomicAdd per column per strip. */
#define BG_ROWS 256
__global__ void k_bias_grad_fast(float *db, const spb_bf16 *dout, int rows, int n)
{
    __shared__ float part[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * BG_ROWS, r1 = min(rows, r0 + BG_ROWS);
    float acc = 0.0f;
    if (c < n)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) acc += ld(dout, (long)r * n + c);
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < n) {
        float t = 0.0f;
        for (int j = 0; j < 8; j++) t += part[j][threadIdx.x];
        atomicAdd(db + c, t);
    }
}
extern "C" void spb_cuda_bias_grad(float *db, const spb_bf16 *dout, int rows, int n, spb_cuda_impl impl,
                                   cudaStream_t s)
{
    if (impl == SPB_CUDA_FAST) {
        dim3 grid((n + 31) / 32, (rows + BG_ROWS - 1) / BG_ROWS), block(32, 8);
        k_bias_grad_fast<<<grid, block, 0, s>>>(db, dout, rows, n);
    } else {
        k_bias_grad_simple<<<blocks_for(n, 128), 128, 0, s>>>(db, dout, rows, n);
    }
    LAUNCH_CHECK();
}

/* ---- softmax cross-entropy -------------------------------------------------------- */
__global__ void k_xent_fwd_simple(float *losses, const spb_bf16 *logits, const int *targets, int rows, int V)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const long o = (long)r * V;
    float mx = ld(logits, o);
    for (int v = 1; v < V; v++) mx = fmaxf(mx, ld(logits, o + v));
    float sum = 0.0f;
    for (int v = 0; v < V; v++) sum += expf(ld(logits, o + v) - mx);
    losses[r] = logf(sum) - (ld(logits, o + targets[r]) - mx);
}
__global__ void k_xent_bwd_simple(spb_bf16 *dlogits, const spb_bf16 *logits, const int *targets, int rows, int V,
                                  float scale)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const long o = (long)r * V;
    float mx = ld(logits, o);
    for (int v = 1; v < V; v++) mx = fmaxf(mx, ld(logits, o + v));
    float sum = 0.0f;
    for (int v = 0; v < V; v++) sum += expf(ld(logits, o + v) - mx);
    for (int v = 0; v < V; v++) {
        float p = expf(ld(logits, o + v) - mx) / sum;
        st(dlogits, o + v, scale * (p - (v == targets[r] ? 1.0f : 0.0f)));
    }
}
/* block per row: one pass for the online (max, sum), block-reduced */
__device__ void row_max_sum(const spb_bf16 *row, int V, float *mx_out, float *sum_out)
{
    __shared__ float sm[32], ss[32];
    float m = -INFINITY, s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float x = ld(row, v);
        if (x > m) {
            s = s * expf(m - x) + 1.0f;
            m = x;
        } else {
            s += expf(x - m);
        }
    }
    /* warp merge of (m, s) pairs */
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        float mm = fmaxf(m, m2);
        s = (m == -INFINITY ? 0.0f : s * expf(m - mm)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mm));
        m = mm;
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    if (lane == 0) sm[warp] = m, ss[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = sm[0], S = ss[0];
        for (int j = 1; j < nw; j++) {
            float mm = fmaxf(M, sm[j]);
            S = (M == -INFINITY ? 0.0f : S * expf(M - mm)) + (sm[j] == -INFINITY ? 0.0f : ss[j] * expf(sm[j] - mm));
            M = mm;
        }
        sm[0] = M, ss[0] = S;
    }
    __syncthreads();
    *mx_out = sm[0];
    *sum_out = ss[0];
}
__global__ void k_xent_fwd_fast(float *losses, const spb_bf16 *logits, const int *targets, int V)
{
    int r = blockIdx.x;
    const spb_bf16 *row = logits + (long)r * V;
    float mx, sum;
    row_max_sum(row, V, &mx, &sum);
    if (threadIdx.x == 0) losses[r] = logf(sum) - (ld(row, targets[r]) - mx);
}
__global__ void k_xent_bwd_fast(spb_bf16 *dlogits, const spb_bf16 *logits, const int *targets, int V, float scale)
{
    int r = blockIdx.x;
    const spb_bf16 *row = logits + (long)r * V;
    float mx, sum;
    row_max_sum(row, V, &mx, &sum);
    float inv = 1.0f / sum;
    int t = targets[r];
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float p = expf(ld(row, v) - mx) * inv;
        st(dlogits + (long)r * V, v, scale * (p - (v == t ? 1.0f : 0.0f)));
    }
}
extern "C" void spb_cuda_softmax_xent_forward(float *losses, const spb_bf16 *logits, const int *targets, int rows,
                                              int V, spb_cuda_impl impl, cudaStream_t s)
{
    if (impl == SPB_CUDA_FAST)
        k_xent_fwd_fast<<<rows, 512, 0, s>>>(losses, logits, targets, V);
    else
        k_xent_fwd_simple<<<blocks_for(rows, 64), 64, 0, s>>>(losses, logits, targets, rows, V);
    LAUNCH_CHECK();
}
extern "C" void spb_cuda_softmax_xent_backward(spb_bf16 *dlogits, const spb_bf16 *logits, const int *targets,
                                               int rows, int V, float scale, spb_cuda_impl impl, cudaStream_t s)
{
    if (impl == SPB_CUDA_FAST)
        k_xent_bwd_fast<<<rows, 512, 0, s>>>(dlogits, logits, targets, V, scale);
    else
        k_xent_bwd_simple<<<blocks_for(rows, 64), 64, 0, s>>>(dlogits, logits, targets, rows, V, scale);
    LAUNCH_CHECK();
}

/* ---- AdamW (optimizer.c's spb_adamw_apply, element for element) ------------------- */
struct adam_args {
    float b1, b2, eps, bc1, bc2, lr, wd, gs;
};
__device__ __forceinline__ float adam_one(float &p, float g, float &m, float &v, const adam_args &a)
{
    g *= a.gs;
    m = a.b1 * m + (1.0f - a.b1) * g;
    v = a.b2 * v + (1.0f - a.b2) * g * g;
    float mhat = m / a.bc1, vhat = v / a.bc2;
    p -= a.lr * (mhat / (sqrtf(vhat) + a.eps) + a.wd * p);
    return p;
}
__global__ void k_adamw_simple(float *p, spb_bf16 *pb, const float *g, float *m, float *v, long n, adam_args a)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float pi = p[i], mi = m[i], vi = v[i];
    adam_one(pi, g[i], mi, vi, a);
    p[i] = pi, m[i] = mi, v[i] = vi;
    if (pb) st(pb, i, pi);
}
__global__ void k_adamw_fast(float4 *p, uint2 *pb, const float4 *g, float4 *m, float4 *v, long n4, adam_args a)
{
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        float4 P = p[i], G = g[i], M = m[i], Vv = v[i];
        adam_one(P.x, G.x, M.x, Vv.x, a);
        adam_one(P.y, G.y, M.y, Vv.y, a);
        adam_one(P.z, G.z, M.z, Vv.z, a);
        adam_one(P.w, G.w, M.w, Vv.w, a);
        p[i] = P, m[i] = M, v[i] = Vv;
        if (pb) {
            __nv_bfloat162 lo = __floats2bfloat162_rn(P.x, P.y), hi = __floats2bfloat162_rn(P.z, P.w);
            uint2 o;
            o.x = *(unsigned *)&lo;
            o.y = *(unsigned *)&hi;
            pb[i] = o;
        }
    }
}
extern "C" void spb_cuda_adamw(float *p, spb_bf16 *p_bf16, const float *grad, float *m, float *v, long n,
                               float grad_scale, float weight_decay, float beta1, float beta2, float eps, long step,
                               float lr, spb_cuda_impl impl, cudaStream_t s)
{
    if (n <= 0) return;
    adam_args a;
    a.b1 = beta1, a.b2 = beta2, a.eps = eps, a.lr = lr, a.wd = weight_decay, a.gs = grad_scale;
    a.bc1 = 1.0f - powf(beta1, (float)step); /* on the host, as optimizer.c */
    a.bc2 = 1.0f - powf(beta2, (float)step);
    if (impl == SPB_CUDA_FAST && n % 4 == 0 && aligned16(p) && aligned16(grad) && aligned16(m) && aligned16(v) &&
        ((uintptr_t)p_bf16 & 7) == 0)
        k_adamw_fast<<<grid_stride_blocks(n / 4), 256, 0, s>>>((float4 *)p, (uint2 *)p_bf16, (const float4 *)grad,
                                                                (float4 *)m, (float4 *)v, n / 4, a);
    else
        k_adamw_simple<<<blocks_for(n, 256), 256, 0, s>>>(p, p_bf16, grad, m, v, n, a);
    LAUNCH_CHECK();
}

/* ---- Ulysses permutes -------------------------------------------------------------- */
/* SIMPLE: one thread per element through the index maps (ulysses_layout.h).
 * FAST: one thread per contiguous run of D (pack) or 8 elements (head). */
__global__ void k_perm_simple(spb_bf16 *dst, const spb_bf16 *src, spb_ulysses_layout u, int which, int inverse)
{
    long n = spb_ulysses_numel(u);
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long j = which == 0 ? spb_ulysses_pack_index(u, i) : spb_ulysses_head_index(u, i);
        if (inverse)
            dst[i] = src[j];
        else
            dst[j] = src[i];
    }
}
/* vectors of 8 bf16: D % 8 == 0 keeps every 8-run inside one head row, and the
 * maps move whole head rows (pack) / whole chunks (head) */
__global__ void k_perm_fast(uint4 *dst, const uint4 *src, spb_ulysses_layout u, int which, int inverse)
{
    long n8 = spb_ulysses_numel(u) / 8;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n8; i += (long)gridDim.x * blockDim.x) {
        long e = i * 8;
        long j = (which == 0 ? spb_ulysses_pack_index(u, e) : spb_ulysses_head_index(u, e)) / 8;
        if (inverse)
            dst[i] = src[j];
        else
            dst[j] = src[i];
    }
}
static void permute(spb_bf16 *dst, const spb_bf16 *src, spb_ulysses_layout u, int which, int inverse,
                    spb_cuda_impl impl, cudaStream_t s)
{
    long n = spb_ulysses_numel(u);
    if (n <= 0) return;
    if (impl == SPB_CUDA_FAST && u.D % 8 == 0 && aligned16(dst) && aligned16(src))
        k_perm_fast<<<grid_stride_blocks(n / 8), 256, 0, s>>>((uint4 *)dst, (const uint4 *)src, u, which, inverse);
    else
        k_perm_simple<<<grid_stride_blocks(n), 256, 0, s>>>(dst, src, u, which, inverse);
    LAUNCH_CHECK();
}
static spb_ulysses_layout lay(int P, int B, int T, int w, int Hp, int D)
{
    spb_ulysses_layout u;
    u.P = P, u.B = B, u.T = T, u.w = w, u.Hp = Hp, u.D = D;
    return u;
}
extern "C" void spb_cuda_ulysses_pack(spb_bf16 *blocks, const spb_bf16 *natural, int P, int B, int T, int w, int Hp,
                                      int D, spb_cuda_impl impl, cudaStream_t s)
{
    permute(blocks, natural, lay(P, B, T, w, Hp, D), 0, 0, impl, s);
}
extern "C" void spb_cuda_ulysses_unpack(spb_bf16 *natural, const spb_bf16 *blocks, int P, int B, int T, int w, int Hp,
                                        int D, spb_cuda_impl impl, cudaStream_t s)
{
    permute(natural, blocks, lay(P, B, T, w, Hp, D), 0, 1, impl, s);
}
extern "C" void spb_cuda_ulysses_blocks_to_head(spb_bf16 *head, const spb_bf16 *blocks, int P, int B, int T, int w,
                                                int Hp, int D, spb_cuda_impl impl, cudaStream_t s)
{
    permute(head, blocks, lay(P, B, T, w, Hp, D), 1, 0, impl, s);
}
extern "C" void spb_cuda_ulysses_head_to_blocks(spb_bf16 *blocks, const spb_bf16 *head, int P, int B, int T, int w,
                                                int Hp, int D, spb_cuda_impl impl, cudaStream_t s)
{
    permute(blocks, head, lay(P, B, T, w, Hp, D), 1, 1, impl, s);
}
