/* The CUDA 16-bit tables' direct kernels (bf16_direct.h, --bf16-kernels
 * fast): products through cuBLASLt on the 16-bit storage (tensor cores, fp32
 * accumulation, C rounded once: spb_cuda_gemm_half, bf16 or fp16), attention
 * through the flash kernel of the run's format (spb_cuda_attention_*_half,
 * FAST: mma.sync where the strides allow, else its simple version), GELU
 * through the bf16 GELU kernels (vector loads where aligned) or, in fp16, a
 * typed kernel here, and LayerNorm, residual adds, the softmax
 * cross-entropy, the embedding, the row biases, ring's merges, fills,
 * copies and AdamW through kernels here that load and store every operand
 * in its own type (16-bit or fp32, per buffer).  The 16-bit format is the
 * process's (device_handles.h): a constant the kernels read, set when it
 * changes.  Everything on the legacy default stream, where the storage's
 * widen/narrow and the fp32 CUDA table run, so the direct calls stay
 * ordered with the frames around them.  experiments/gpu-strategies holds
 * it against the CPU's single-rank run and experiments/gpu-core-step
 * times it (docs/GPU.md): on the H200 of 2026-11-30 (results/gpu/); the
 * embedding, bias-row and merge kernels and the cross-entropy's shared
 * block reduction came after that run. */
#define OMPI_SKIP_MPICXX 1 /* cuda_backend.h -> backend.h -> comm.h -> mpi.h: the C API only */
#define MPICH_SKIP_MPICXX 1
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_bf16_storage.h"
#include "cuda_check.h"
#include "cuda_launch.cuh"
#include "cuda_scalars.h"
#include "cuda_trace.h"
#include "cuda_upload.h"
#include "cudnn_attention.h"
#include "gelu.cuh"
#include "spb_cuda.h"

/* Every launch here is on kStream and opens its timeline interval with
 * SPB_KT_BEGIN(kStream) just before; SPB_LAUNCH_CHECK (cuda_trace.h) after. */

namespace {

const cudaStream_t kStream = 0; /* the legacy default stream */
const int kThreads = 256;
unsigned blocks_for(long n) { return spb_grid_stride_blocks(n, kThreads); }

/* One cuBLASLt handle and workspace for the process (32 MiB: the
 * heuristics' preferred size for large bf16 products on Hopper). */
spb_cuda_gemm *products(void)
{
    static spb_cuda_gemm *g = nullptr;
    if (!g) g = spb_cuda_gemm_create((size_t)32 << 20);
    return g;
}

/* The 16-bit format on the device: every kernel's load and store read it
 * (uniform across a launch, so the branch never diverges).  Set before
 * the first launch of each entry whenever the process's format differs
 * from what the device holds (a copy on the legacy stream: ordered). */
__constant__ int c_half_fp16;
int fp16_run() { return spb_handles_half_format() == SPB_HALF_FP16; }
void sync_format()
{
    static int on_device = -1;
    int want = fp16_run();
    if (want != on_device) {
        SPB_CUDA_HOST_WAIT(cudaMemcpyToSymbol(c_half_fp16, &want, sizeof want));
        on_device = want;
    }
}

__device__ __forceinline__ float half_to_float(spb_bf16 x)
{
    return c_half_fp16 ? spb_fp16_to_float(x) : spb_bf16_to_float(x);
}
__device__ __forceinline__ spb_bf16 half_from_float(float v)
{
    return c_half_fp16 ? spb_fp16_from_float(v) : spb_bf16_from_float(v);
}

void gemm(int transA, int transB, int m, int n, int k, const spb_bf16 *A, int lda, const spb_bf16 *B, int ldb,
          float beta, void *C, spb_dtype c_type, int ldc)
{
    spb_cuda_gemm *g = products();
    SPB_KT_BEGIN_LIBRARY(kStream);
    spb_cuda_gemm_half(g, fp16_run(), transA, transB, m, n, k, 1.0f, A, lda, B, ldb, beta, C, ldc,
                       c_type == SPB_DTYPE_F32, kStream);
    SPB_KT_END();
}

__global__ void k_broadcast_rows(void *C, int c_f32, int ldc, const spb_bf16 *b, int rows, int n)
{
    long total = (long)rows * n;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        long r = i / n, j = i % n;
        if (c_f32)
            ((float *)C)[r * ldc + j] = half_to_float(b[j]);
        else
            ((spb_bf16 *)C)[r * ldc + j] = b[j];
    }
}

void broadcast_rows(void *C, spb_dtype c_type, int ldc, const spb_bf16 *b, int rows, int n)
{
    if (rows <= 0 || n <= 0) return;
    sync_format();
    SPB_KT_BEGIN(kStream);
    k_broadcast_rows<<<blocks_for((long)rows * n), kThreads, 0, kStream>>>(C, c_type == SPB_DTYPE_F32, ldc, b, rows,
                                                                            n);
    SPB_LAUNCH_CHECK();
}

/* ---- LayerNorm and residual adds: each operand in its own type ---------- */
/* (spb_stored by value; the type is uniform across a launch, so the branch
 * in a load never diverges.)  The math is ops_cpu.c's, in fp32. */
__device__ __forceinline__ float load(spb_stored s, long i)
{
    return s.type == SPB_DTYPE_HALF ? half_to_float(((const spb_bf16 *)s.p)[i]) : ((const float *)s.p)[i];
}
__device__ __forceinline__ void store(spb_stored s, long i, float v)
{
    if (s.type == SPB_DTYPE_HALF)
        ((spb_bf16 *)s.p)[i] = half_from_float(v);
    else
        ((float *)s.p)[i] = v;
}

/* GELU: bf16 through the vectorised bf16 kernels (cuda_ops.cu), fp16 here
 * (elementwise: out may be inp, dinp may be dout). */
__global__ void k_gelu_forward_fp16(spb_bf16 *out, const spb_bf16 *inp, long n)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        out[i] = half_from_float(spb_gelu_value(half_to_float(inp[i])));
}
__global__ void k_gelu_backward_fp16(spb_bf16 *dinp, const spb_bf16 *inp, const spb_bf16 *dout, long n)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dinp[i] = half_from_float(half_to_float(dout[i]) * spb_gelu_slope(half_to_float(inp[i])));
}

void gelu_forward(spb_bf16 *out, const spb_bf16 *inp, long n)
{
    if (!fp16_run()) {
        SPB_KT_BEGIN(kStream);
        spb_cuda_gelu_forward(out, inp, n, SPB_CUDA_FAST, kStream);
        SPB_KT_END();
        return;
    }
    if (n <= 0) return;
    sync_format();
    SPB_KT_BEGIN(kStream);
    k_gelu_forward_fp16<<<blocks_for(n), kThreads, 0, kStream>>>(out, inp, n);
    SPB_LAUNCH_CHECK();
}

void gelu_backward(spb_bf16 *dinp, const spb_bf16 *inp, const spb_bf16 *dout, long n)
{
    if (!fp16_run()) {
        SPB_KT_BEGIN(kStream);
        spb_cuda_gelu_backward(dinp, inp, dout, n, SPB_CUDA_FAST, kStream);
        SPB_KT_END();
        return;
    }
    if (n <= 0) return;
    sync_format();
    SPB_KT_BEGIN(kStream);
    k_gelu_backward_fp16<<<blocks_for(n), kThreads, 0, kStream>>>(dinp, inp, dout, n);
    SPB_LAUNCH_CHECK();
}

const int kRowsPerBlock = 8; /* warps of 32 per block of 256: a warp per row */

__global__ void k_layernorm_forward(spb_stored out, float *mean, float *rstd, spb_stored inp, spb_stored w,
                                    spb_stored b, int rows, int C)
{
    int r = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows) return;
    const long o = (long)r * C;
    float m = 0.0f;
    for (int i = lane; i < C; i += 32) m += load(inp, o + i);
    m = spb_warp_sum(m) / (float)C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = load(inp, o + i) - m;
        v += d * d;
    }
    v = spb_warp_sum(v) / (float)C;
    float sd = 1.0f / sqrtf(v + 1e-5f);
    for (int i = lane; i < C; i += 32) store(out, o + i, (load(inp, o + i) - m) * sd * load(w, i) + load(b, i));
    if (lane == 0) mean[r] = m, rstd[r] = sd;
}

/* dinp += s (g - mean(g) - xhat mean(g xhat)), g = dy w: a warp per row.
 * Each lane reads dy[i] before it writes dx[i], so dinp may be dout. */
__global__ void k_layernorm_backward_dx(spb_stored dinp, spb_stored dout, spb_stored inp, spb_stored w,
                                        const float *mean, const float *rstd, int rows, int C)
{
    int r = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows) return;
    const long o = (long)r * C;
    float m = mean[r], sd = rstd[r], sum_g = 0.0f, sum_gx = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float g = load(dout, o + i) * load(w, i);
        sum_g += g;
        sum_gx += g * (load(inp, o + i) - m) * sd;
    }
    sum_g = spb_warp_sum(sum_g) / (float)C;
    sum_gx = spb_warp_sum(sum_gx) / (float)C;
    for (int i = lane; i < C; i += 32) {
        float xhat = (load(inp, o + i) - m) * sd;
        store(dinp, o + i, load(dinp, o + i) + sd * (load(dout, o + i) * load(w, i) - sum_g - xhat * sum_gx));
    }
}

/* dw, db: strips of kStripRows rows, a thread per column, partial sums in
 * fp32 [strips][C]; then one thread per column adds its strips in order to
 * the old value and rounds once (no atomics: the same bits every run).  The
 * strips loop over gridDim.y, which caps at 65535 (4M rows). */
const int kStripRows = 64;
const long kMaxGridY = 65535;
unsigned strip_blocks(long strips) { return (unsigned)(strips < kMaxGridY ? strips : kMaxGridY); }
__global__ void k_layernorm_backward_strips(float *part_w, float *part_b, spb_stored dout, spb_stored inp,
                                            const float *mean, const float *rstd, int rows, int C, int strips)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C) return;
    for (int strip = blockIdx.y; strip < strips; strip += gridDim.y) {
        int r0 = strip * kStripRows, r1 = min(rows, r0 + kStripRows);
        float sw = 0.0f, sb = 0.0f;
        for (int r = r0; r < r1; r++) {
            float dy = load(dout, (long)r * C + i);
            sb += dy;
            sw += dy * (load(inp, (long)r * C + i) - mean[r]) * rstd[r];
        }
        part_w[(long)strip * C + i] = sw;
        part_b[(long)strip * C + i] = sb;
    }
}

/* Column i's strips added in order onto its stored value, rounded once. */
__device__ __forceinline__ void add_strips(spb_stored out, const float *part, long strips, int C, int i)
{
    float s = 0.0f;
    for (long k = 0; k < strips; k++) s += part[k * C + i];
    store(out, i, load(out, i) + s);
}

__global__ void k_layernorm_backward_finish(spb_stored dw, spb_stored db, const float *part_w, const float *part_b,
                                            int strips, int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C) return;
    add_strips(dw, part_w, strips, C, i);
    add_strips(db, part_b, strips, C, i);
}

/* fp32 partial sums of the strips (a buffer that only grows). */
float *strip_workspace(long n)
{
    static void *buf = nullptr;
    static size_t cap = 0;
    return (float *)spb_cuda_grow(&buf, &cap, SPB_MEM_WORKSPACE, sizeof(float) * (size_t)n);
}

void layernorm_forward(spb_stored out, float *mean, float *rstd, spb_stored inp, spb_stored w, spb_stored b, int rows,
                       int C)
{
    sync_format();
    unsigned blocks = (unsigned)((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    SPB_KT_BEGIN(kStream);
    k_layernorm_forward<<<blocks, 32 * kRowsPerBlock, 0, kStream>>>(out, mean, rstd, inp, w, b, rows, C);
    SPB_LAUNCH_CHECK();
}

void layernorm_backward(spb_stored dinp, spb_stored dw, spb_stored db, spb_stored dout, spb_stored inp, spb_stored w,
                        const float *mean, const float *rstd, int rows, int C)
{
    sync_format();
    /* dw and db first: they read dout, which dinp may be. */
    int strips = (rows + kStripRows - 1) / kStripRows;
    float *part = strip_workspace(2L * strips * C);
    dim3 grid((unsigned)((C + kThreads - 1) / kThreads), strip_blocks(strips));
    SPB_KT_BEGIN(kStream);
    k_layernorm_backward_strips<<<grid, kThreads, 0, kStream>>>(part, part + (long)strips * C, dout, inp, mean, rstd,
                                                                rows, C, strips);
    SPB_LAUNCH_CHECK();
    SPB_KT_BEGIN(kStream);
    k_layernorm_backward_finish<<<(unsigned)((C + kThreads - 1) / kThreads), kThreads, 0, kStream>>>(
        dw, db, part, part + (long)strips * C, strips, C);
    SPB_LAUNCH_CHECK();
    unsigned blocks = (unsigned)((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    SPB_KT_BEGIN(kStream);
    k_layernorm_backward_dx<<<blocks, 32 * kRowsPerBlock, 0, kStream>>>(dinp, dout, inp, w, mean, rstd, rows, C);
    SPB_LAUNCH_CHECK();
}

__global__ void k_add_inplace(spb_stored a, spb_stored b, long n)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        store(a, i, load(a, i) + load(b, i));
}

void add_inplace(spb_stored a, spb_stored b, long n)
{
    sync_format();
    SPB_KT_BEGIN(kStream);
    k_add_inplace<<<blocks_for(n), kThreads, 0, kStream>>>(a, b, n);
    SPB_LAUNCH_CHECK();
}

/* ---- the row biases of the reduced products ------------------------------ */
__global__ void k_add_bias_rows(spb_stored x, spb_stored b, long rows, int C)
{
    long n = rows * C;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        store(x, i, load(x, i) + load(b, i % C));
}

void add_bias_rows(spb_stored x, spb_stored b, long rows, int C)
{
    sync_format();
    SPB_KT_BEGIN(kStream);
    k_add_bias_rows<<<blocks_for(rows * C), kThreads, 0, kStream>>>(x, b, rows, C);
    SPB_LAUNCH_CHECK();
}

/* db += column sums of dy as LayerNorm's dw, db: strips of kStripRows rows,
 * a thread per column (the rows' reads coalesced across the columns), fp32
 * partial sums [strips][C] added in order onto the old value and rounded
 * once (no atomics: the same bits every run). */
__global__ void k_bias_grad_strips(float *part, spb_stored dy, long rows, int C, long strips)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C) return;
    for (long strip = blockIdx.y; strip < strips; strip += gridDim.y) {
        long r0 = strip * kStripRows, r1 = r0 + kStripRows < rows ? r0 + kStripRows : rows;
        float s = 0.0f;
        for (long r = r0; r < r1; r++) s += load(dy, r * C + i);
        part[strip * C + i] = s;
    }
}

__global__ void k_bias_grad_finish(spb_stored db, const float *part, long strips, int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < C) add_strips(db, part, strips, C, i);
}

void bias_grad_rows(spb_stored db, spb_stored dy, long rows, int C)
{
    sync_format();
    const long strips = (rows + kStripRows - 1) / kStripRows;
    float *part = strip_workspace(strips * C);
    const unsigned cols = (unsigned)((C + kThreads - 1) / kThreads);
    dim3 grid(cols, strip_blocks(strips));
    SPB_KT_BEGIN(kStream);
    k_bias_grad_strips<<<grid, kThreads, 0, kStream>>>(part, dy, rows, C, strips);
    SPB_LAUNCH_CHECK();
    SPB_KT_BEGIN(kStream);
    k_bias_grad_finish<<<cols, kThreads, 0, kStream>>>(db, part, strips, C);
    SPB_LAUNCH_CHECK();
}

/* ---- ring attention's merge ----------------------------------------------- */
/* attention_merge.c's weights for one (batch, head, query row): *keep 0
 * when the pair saw no key (o_acc stays), *take 1 when the running row had
 * none yet (O and lse taken as they are). */
__device__ __forceinline__ void merge_weights(float la, float lb, bool *keep, bool *take, float *wa, float *wb,
                                              float *lse)
{
    *keep = !(lb > -INFINITY);
    *take = !*keep && !(la > -INFINITY);
    if (*keep || *take) return;
    float hi = fmaxf(la, lb), lo = fminf(la, lb);
    *lse = hi + log1pf(expf(lo - hi));
    *wa = expf(la - *lse), *wb = expf(lb - *lse);
}

/* O first, every element a thread, reading the old lse (coalesced over a
 * row's heads and dims); then the lse, in a launch after it. */
__global__ void k_attn_merge_out(spb_stored o_acc, const float *lse_acc, spb_stored o_pair, const float *lse_pair,
                                 int batch, int H, int D, int T, int row, int len)
{
    const long W = (long)H * D, n = (long)batch * len * W;
    for (long t = (long)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (long)gridDim.x * blockDim.x) {
        const long bi = t / W, b = bi / len, i = bi % len;
        const int h = (int)((t % W) / D);
        bool keep, take;
        float wa = 0.0f, wb = 0.0f, lse = 0.0f;
        merge_weights(lse_acc[(b * H + h) * T + row + i], lse_pair[(b * H + h) * len + i], &keep, &take, &wa, &wb,
                      &lse);
        if (keep) continue;
        const long at = (b * T + row + i) * W + t % W;
        store(o_acc, at, take ? load(o_pair, at) : load(o_acc, at) * wa + load(o_pair, at) * wb);
    }
}

__global__ void k_attn_merge_lse(float *lse_acc, const float *lse_pair, int batch, int H, int T, int row, int len)
{
    const long n = (long)batch * H * len;
    for (long t = (long)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (long)gridDim.x * blockDim.x) {
        const long bh = t / len, i = t % len;
        float *la = &lse_acc[bh * T + row + i];
        const float lb = lse_pair[t];
        bool keep, take;
        float wa, wb, lse = 0.0f;
        merge_weights(*la, lb, &keep, &take, &wa, &wb, &lse);
        if (!keep) *la = take ? lb : lse;
    }
}

void attn_merge(spb_stored o_acc, float *lse_acc, spb_stored o_pair, const float *lse_pair, int batch, int heads,
                int head_dim, int T, int row, int len)
{
    sync_format();
    const long n = (long)batch * len * heads * head_dim;
    SPB_KT_BEGIN(kStream);
    k_attn_merge_out<<<blocks_for(n), kThreads, 0, kStream>>>(o_acc, lse_acc, o_pair, lse_pair, batch, heads,
                                                                head_dim, T, row, len);
    SPB_LAUNCH_CHECK();
    SPB_KT_BEGIN(kStream);
    k_attn_merge_lse<<<blocks_for((long)batch * heads * len), kThreads, 0, kStream>>>(lse_acc, lse_pair, batch,
                                                                                       heads, T, row, len);
    SPB_LAUNCH_CHECK();
}

/* ---- fills and copies between operands of either type -------------------- */
__global__ void k_copy_rows(spb_stored dst, long dst_stride, spb_stored src, long src_stride, long rows, long width)
{
    long n = rows * width;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        long r = i / width, c = i % width;
        store(dst, r * dst_stride + c, load(src, r * src_stride + c));
    }
}

void copy_rows(spb_stored dst, long dst_stride, spb_stored src, long src_stride, long rows, long width)
{
    sync_format();
    SPB_KT_BEGIN(kStream);
    k_copy_rows<<<blocks_for(rows * width), kThreads, 0, kStream>>>(dst, dst_stride, src, src_stride, rows, width);
    SPB_LAUNCH_CHECK();
}

__global__ void k_fill(spb_stored x, long n, float value)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        store(x, i, value);
}

void fill(spb_stored x, long n, float value)
{
    sync_format();
    SPB_KT_BEGIN(kStream);
    k_fill<<<blocks_for(n), kThreads, 0, kStream>>>(x, n, value);
    SPB_LAUNCH_CHECK();
}

/* ---- AdamW on the masters, sum of squares ------------------------------- */
/* optimizer.c's spb_adamw_apply element by element (b1, b2, eps, the bias
 * corrections and lr computed on the host as there, in float); the stored
 * parameter takes its master rounded once. */
__global__ void k_adamw(float *masters, spb_stored p, spb_stored grad, spb_stored m, spb_stored v, long n,
                        float grad_scale, const float *device_scale, float weight_decay, float b1, float b2, float eps,
                        float bc1, float bc2, float flr)
{
    if (device_scale) grad_scale = *device_scale; /* clipping made on the device (cuda_scalars.h) */
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float gi = load(grad, i) * grad_scale;
        float mi = b1 * load(m, i) + (1.0f - b1) * gi;
        float vi = b2 * load(v, i) + (1.0f - b2) * gi * gi;
        store(m, i, mi);
        store(v, i, vi);
        float mhat = mi / bc1, vhat = vi / bc2, w = masters[i];
        w -= flr * (mhat / (sqrtf(vhat) + eps) + weight_decay * w);
        masters[i] = w;
        store(p, i, w);
    }
}

void adamw_apply(float *masters, spb_stored p, spb_stored grad, spb_stored m, spb_stored v, long n, float grad_scale,
                 float weight_decay, const spb_config *cfg, long step, double lr)
{
    sync_format();
    const float b1 = (float)cfg->adam_beta1, b2 = (float)cfg->adam_beta2, eps = (float)cfg->adam_eps;
    const float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
    SPB_KT_BEGIN(kStream);
    k_adamw<<<blocks_for(n), kThreads, 0, kStream>>>(masters, p, grad, m, v, n, grad_scale,
                                                       spb_cuda_device_grad_scale(), weight_decay, b1, b2, eps, bc1,
                                                       bc2, (float)lr);
    SPB_LAUNCH_CHECK();
}

/* In double: one thread per chunk of 4096 (serial, in order), the chunks'
 * partial sums added in order on the host: the same bits every run. */
const long kSumChunk = 4096;
__global__ void k_sum_squares(double *part, spb_stored x, long n, long chunks)
{
    long c = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= chunks) return;
    long a = c * kSumChunk, b = a + kSumChunk < n ? a + kSumChunk : n;
    double s = 0.0;
    for (long i = a; i < b; i++) {
        double e = load(x, i);
        s += e * e;
    }
    part[c] = s;
}

double sum_squares(spb_stored x, long n)
{
    sync_format();
    static void *buf = nullptr;
    static size_t cap = 0;
    long chunks = (n + kSumChunk - 1) / kSumChunk;
    double *part = (double *)spb_cuda_grow(&buf, &cap, SPB_MEM_WORKSPACE, sizeof(double) * (size_t)chunks);
    SPB_KT_BEGIN(kStream);
    k_sum_squares<<<(unsigned)((chunks + kThreads - 1) / kThreads), kThreads, 0, kStream>>>(part, x, n, chunks);
    SPB_LAUNCH_CHECK();
    if (spb_cuda_scalar_target() >= 0) { /* kept on the device (backend.h's scalar_defer) */
        spb_cuda_scalar_add_ordered(part, chunks, kStream); /* the chunks in order, as below */
        return 0.0;
    }
    double *host = (double *)malloc(sizeof(double) * (size_t)chunks);
    SPB_CHECK(host != NULL);
    SPB_CUDA_HOST_WAIT(cudaMemcpy(host, part, sizeof(double) * (size_t)chunks, cudaMemcpyDeviceToHost));
    double s = 0.0;
    for (long c = 0; c < chunks; c++) s += host[c];
    free(host);
    return s;
}

/* ---- softmax cross-entropy: a block per row --------------------------- */
const int kXentThreads = 256;


/* logits -> probabilities in place; loss[r] = log(sum) - (logit_t - max),
 * from the fp32 logit (read before any thread writes its row). */
__global__ void k_softmax_xent_forward(spb_stored probs, double *loss, const int *targets, int rows, int V)
{
    __shared__ float shared[kXentThreads / 32];
    int r = blockIdx.x;
    const long o = (long)r * V;
    float target_logit = load(probs, o + targets[r]);
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += kXentThreads) mx = fmaxf(mx, load(probs, o + v));
    mx = spb_block_reduce<kXentThreads>(mx, true, shared);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += kXentThreads) sum += expf(load(probs, o + v) - mx);
    sum = spb_block_reduce<kXentThreads>(sum, false, shared); /* its syncs also order every read above before the writes */
    float inv = 1.0f / sum;
    for (int v = threadIdx.x; v < V; v += kXentThreads) store(probs, o + v, expf(load(probs, o + v) - mx) * inv);
    if (threadIdx.x == 0) loss[r] = (double)logf(sum) - (double)(target_logit - mx);
}

__global__ void k_softmax_xent_backward(spb_stored probs, const int *targets, int rows, int V, float scale)
{
    long n = (long)rows * V;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        int r = (int)(i / V), v = (int)(i % V);
        float p = load(probs, i) * scale;
        if (v == targets[r]) p -= scale;
        store(probs, i, p);
    }
}

double softmax_xent_forward(spb_stored probs, const int *targets, int rows, int V)
{
    sync_format();
    static void *buf = nullptr;
    static size_t cap = 0;
    double *loss = (double *)spb_cuda_grow(&buf, &cap, SPB_MEM_WORKSPACE, sizeof(double) * (size_t)rows);
    SPB_KT_BEGIN(kStream);
    k_softmax_xent_forward<<<(unsigned)rows, kXentThreads, 0, kStream>>>(probs, loss, targets, rows, V);
    SPB_LAUNCH_CHECK();
    if (spb_cuda_scalar_target() >= 0) { /* kept on the device (backend.h's scalar_defer) */
        spb_cuda_scalar_add_ordered(loss, rows, kStream); /* rows in order, as below */
        return 0.0;
    }
    double *host = (double *)malloc(sizeof(double) * (size_t)rows);
    SPB_CHECK(host != NULL);
    SPB_CUDA_HOST_WAIT(cudaMemcpy(host, loss, sizeof(double) * (size_t)rows, cudaMemcpyDeviceToHost));
    double sum = 0.0; /* rows in order, as ops_cpu.c */
    for (int r = 0; r < rows; r++) sum += host[r];
    free(host);
    return sum;
}

void softmax_xent_backward(spb_stored probs, const int *targets, int rows, int V, float scale)
{
    sync_format();
    SPB_KT_BEGIN(kStream);
    k_softmax_xent_backward<<<blocks_for((long)rows * V), kThreads, 0, kStream>>>(probs, targets, rows, V, scale);
    SPB_LAUNCH_CHECK();
}

/* ---- embedding: the 16-bit tables; out and the gradients in their own types ---- */
/* Host memory to a device buffer that only grows, queued on the legacy
 * stream (lands after the kernels that read it last). */
void *to_device(void **buf, size_t *cap, const void *host, size_t bytes)
{
    void *d = spb_cuda_grow(buf, cap, SPB_MEM_WORKSPACE, bytes);
    spb_cuda_upload(d, host, bytes, kStream); /* no wait: staged through pinned memory (cuda_upload.h) */
    return d;
}

/* a block per row */
__global__ void k_embedding_forward(spb_stored out, const int *tokens, const spb_bf16 *wte, const spb_bf16 *wpe,
                                    const long *positions, int T, int C)
{
    const int r = blockIdx.x;
    const spb_bf16 *e = wte + (long)tokens[r] * C, *p = wpe + positions[r % T] * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        store(out, (long)r * C + i, half_to_float(e[i]) + half_to_float(p[i]));
}

void embedding_forward(spb_stored out, const int *tokens, const spb_bf16 *wte, const spb_bf16 *wpe,
                       const long *positions, int rows, int T, int C)
{
    static void *buf = nullptr;
    static size_t cap = 0;
    const long *pos = (const long *)to_device(&buf, &cap, positions, sizeof(long) * (size_t)T);
    sync_format();
    SPB_KT_BEGIN(kStream);
    k_embedding_forward<<<(unsigned)rows, kThreads, 0, kStream>>>(out, tokens, wte, wpe, pos, T, C);
    SPB_LAUNCH_CHECK();
}

/* A block per (group, 256 columns): each thread sums its column of the
 * group's rows in their order onto the stored value, one rounding (no
 * atomics: bf16_direct.h's order, so the frames' result bit for bit). */
__global__ void k_embedding_backward_rows(spb_stored table, spb_stored dout, int C, const int *keys, const int *starts,
                                          const int *order)
{
    const int g = blockIdx.x, i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= C) return;
    const long at = (long)keys[g] * C + i;
    float acc = load(table, at);
    for (int k = starts[g]; k < starts[g + 1]; k++) acc += load(dout, (long)order[k] * C + i);
    store(table, at, acc);
}

void embedding_backward_rows(spb_stored table, spb_stored dout, int C, int groups, const int *keys, const int *starts,
                             const int *order)
{
    if (groups <= 0 || C <= 0) return;
    const int rows = starts[groups];
    /* keys, starts, order: one copy */
    const size_t n = (size_t)groups + (size_t)groups + 1 + (size_t)rows;
    int *host = (int *)malloc(sizeof(int) * n);
    SPB_CHECK(host != NULL);
    memcpy(host, keys, sizeof(int) * (size_t)groups);
    memcpy(host + groups, starts, sizeof(int) * ((size_t)groups + 1));
    memcpy(host + 2 * groups + 1, order, sizeof(int) * (size_t)rows);
    static void *buf = nullptr;
    static size_t cap = 0;
    const int *d = (const int *)to_device(&buf, &cap, host, sizeof(int) * n);
    free(host);
    sync_format();
    dim3 grid((unsigned)groups, (unsigned)((C + kThreads - 1) / kThreads));
    SPB_KT_BEGIN(kStream);
    k_embedding_backward_rows<<<grid, kThreads, 0, kStream>>>(table, dout, C, d, d + groups, d + 2 * groups + 1);
    SPB_LAUNCH_CHECK();
}

void attention_forward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v, spb_bf16 *o,
                       float *lse)
{
    SPB_KT_BEGIN(kStream); /* one interval: the forward's one kernel */
    spb_cuda_attention_forward_half(d, fp16_run(), q, k, v, o, lse, SPB_CUDA_FAST, kStream);
    SPB_KT_END();
}

void attention_backward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                        const spb_bf16 *o, const float *lse, const spb_bf16 *dout, float *dq, float *dk, float *dv)
{
    float *ws = spb_cuda_attention_workspace((long)d->batch * d->heads * d->q_len);
    SPB_KT_BEGIN(kStream); /* one interval: the backward's kernels (delta, dK/dV, dQ) */
    spb_cuda_attention_backward_half(d, fp16_run(), q, k, v, o, lse, dout, dq, dk, dv, ws, SPB_CUDA_FAST, kStream);
    SPB_KT_END();
}

/* cuDNN's fused attention (its kernels and the widening of dQ/dK/dV): one
 * library interval each way */
int cudnn_forward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v, spb_bf16 *o,
                  float *lse)
{
    SPB_KT_BEGIN_LIBRARY(kStream);
    int rc = spb_cuda_cudnn_direct_forward(d, q, k, v, o, lse);
    SPB_KT_END();
    return rc;
}

int cudnn_backward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                   const spb_bf16 *o, const float *lse, const spb_bf16 *dout, float *dq, float *dk, float *dv)
{
    SPB_KT_BEGIN_LIBRARY(kStream);
    int rc = spb_cuda_cudnn_direct_backward(d, q, k, v, o, lse, dout, dq, dk, dv);
    SPB_KT_END();
    return rc;
}

/* Entries assigned by name (C++17 has no designated initialisers): a
 * reordered header cannot shift them.  Dynamic initialisation, like
 * spb_backend_cuda's; callers only take its address before main. */
spb_bf16_direct make_direct(void)
{
    spb_bf16_direct d = {};
    d.name = "cuda (cuBLASLt, flash attention, GELU, typed row-wise kernels; bf16 or fp16)";
    d.gemm = gemm;
    d.broadcast_rows = broadcast_rows;
    d.gelu_forward = gelu_forward;
    d.gelu_backward = gelu_backward;
    d.layernorm_forward = layernorm_forward;
    d.layernorm_backward = layernorm_backward;
    d.add_inplace = add_inplace;
    d.copy_rows = copy_rows;
    d.fill = fill;
    d.adamw_apply = adamw_apply;
    d.sum_squares = sum_squares;
    d.softmax_xent_forward = softmax_xent_forward;
    d.softmax_xent_backward = softmax_xent_backward;
    d.embedding_forward = embedding_forward;
    d.embedding_backward_rows = embedding_backward_rows;
    d.add_bias_rows = add_bias_rows;
    d.bias_grad_rows = bias_grad_rows;
    d.attn_merge = attn_merge;
    d.attention_forward = attention_forward;
    d.attention_backward = attention_backward;
    d.cudnn_attention_forward = spb_cudnn_attention_built() ? cudnn_forward : nullptr;
    d.cudnn_attention_backward = spb_cudnn_attention_built() ? cudnn_backward : nullptr;
    return d;
}

} // namespace

extern "C" const spb_bf16_direct spb_bf16_direct_cuda = make_direct();
