/* Flash attention on the GPU (spb_cuda.h): attention.h's descriptor, strides,
 * position offsets and log-sum-exp, bf16 (or fp16) Q/K/V/O/dO, fp32
 * accumulation.  Every kernel is a template on the element type T: the
 * same code for both 16-bit formats, only the conversions and the
 * tensor-core instruction differ (elem<T> below).
 *
 * SIMPLE kernels: one thread per query row (forward, dQ) or key row (dK, dV);
 * K/V (or Q/dO) tiles of 64 rows staged through shared memory; the online
 * softmax updated key by key in fp32 registers.  Nothing is rounded to the
 * 16-bit type except O.
 *
 * FAST kernels (FlashAttention-2's structure, written for this project):
 * W warps per block (8 by default, 4 selectable), 16 resident rows each;
 * the other sequence streamed in tiles of 64 rows, copied global -> shared
 * by cp.async into a double buffer (tile j + 1 in flight while tile j is
 * multiplied); products on tensor cores with mma.sync.m16n8k16 bf16 (f16)
 * -> fp32, operands loaded from shared memory by ldmatrix (warp_ptx.cuh).
 * Fragment layouts of m16n8k16 (g = lane / 4, t = lane % 4):
 *   A 16x16 (row-major): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
 *   B 16x8  (k x n):     b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8..2t+9, n = g)
 *   C 16x8  fp32:        c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..2t+1)
 * so an S accumulator (two n-tiles of 8 keys) becomes, rounded to T, the A
 * operand of P·V with no shuffle.  ldmatrix gives each lane (g, 2t..2t+1)
 * of an 8x8 matrix: A's four matrices and B from a tile stored [n][k] (K for
 * Q·Kᵀ) load as they are; B from a tile stored [k][n] (V for P·V, K for
 * dS·K, Q and dO for dK and dV) loads with .trans, which hands out
 * (2t..2t+1, g): no transposed copy in shared memory.  Rows are padded by 8
 * elements (16 bytes), so the 8 rows an ldmatrix reads, and the 16-byte
 * copies of a warp, fall in distinct banks.
 *   forward: S = Q Kᵀ, online softmax in registers, O += P V
 *   dQ     : query tile resident: S, P = exp(S - lse), dP = dO Vᵀ,
 *            dS = P (dP - D), dQ += dS K          (no atomics)
 *   dK, dV : key tile resident: Sᵀ = K Qᵀ, Pᵀ, dPᵀ = V dOᵀ, dSᵀ,
 *            dV += Pᵀ dO, dK += dSᵀ Q               (no atomics)
 * (dQ in its own kernel recomputes S and dP: 7 products per pair instead of
 * 5, in exchange for no fp32 atomics; the FLOP counts reported are the
 * conventional 10·D per visible pair.  dkvq_exchange, selectable, is the
 * backward in one kernel on FlashAttention-2's tiling: text at the kernel.)
 * Causal: tiles entirely above the diagonal (in global positions, with the
 * offsets) are skipped, and so is a tile for a warp none of whose rows sees
 * it; only tiles that cross the diagonal or the sequence's end are masked
 * per element.  Query tiles that see more keys are launched first. */
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "cuda_check.h"
#include "spb_cuda.h"
#include "warp_ptx.cuh"
#include "tma_ptx.cuh"
#include "warpgroup_ptx.cuh"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* What differs between the element types: conversions (round to nearest
 * even), packing two fp32 values into one 32-bit operand register, and the
 * m16n8k16 tensor-core product with fp32 accumulators. */
template <typename T> struct elem;
template <> struct elem<__nv_bfloat16> {
    static constexpr int is_fp16 = 0;
    static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
    {
        spb_mma_m16n8k16<0>(c, a, b0, b1);
    }
};
template <> struct elem<__half> {
    static constexpr int is_fp16 = 1;
    static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __half2 v = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
    {
        spb_mma_m16n8k16<1>(c, a, b0, b1);
    }
};

template <typename T> __device__ __forceinline__ float ld(const spb_bf16 *p, long i)
{
    return elem<T>::to_f(((const T *)p)[i]);
}

/* ========================== SIMPLE ========================================== */
#define ST 64 /* rows per block and per staged tile */

/* Keys [0, n) of the block visible to query row i (attention.h). */
__device__ __forceinline__ int visible_keys(const spb_attn_desc &d, long i)
{
    if (!d.causal) return d.k_len;
    long last = d.q_offset + i - d.k_offset;
    if (last < 0) return 0;
    return last >= d.k_len ? d.k_len : (int)(last + 1);
}

/* Causal: the first query tile (of TILE rows) with a row that sees key j0
 * of the block, or of a block of keys from j0; 0 without the mask. */
template <int TILE> __device__ __forceinline__ int first_query_tile(const spb_attn_desc &d, long j0)
{
    long i_first = d.causal ? d.k_offset + j0 - d.q_offset : 0;
    return i_first <= 0 ? 0 : (int)((i_first > d.q_len ? d.q_len : i_first) / TILE * TILE);
}

/* Rows [first, first + ST) of one head of a [batch][token][head][D] tensor
 * into shared memory (rows at or past `limit` as zeros), by the block's ST
 * threads; base = batch offset + head offset. */
template <typename T, int D>
__device__ __forceinline__ void stage_rows(T (*dst)[D], const spb_bf16 *src, long base, long token_stride,
                                           int first, int limit)
{
    for (int e = threadIdx.x; e < ST * D; e += ST) {
        int r = e / D, x = e % D;
        dst[r][x] = first + r < limit ? ((const T *)src)[base + (long)(first + r) * token_stride + x]
                                      : elem<T>::from_f(0.0f);
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(ST) fwd_simple(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                 const spb_bf16 *v, spb_bf16 *o, float *lse)
{
    __shared__ T Ks[ST][D], Vs[ST][D];
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * ST + threadIdx.x;
    const bool live = i < d.q_len;
    const int n = live ? visible_keys(d, i) : 0;
    const int i_last = min(blockIdx.x * ST + ST - 1, d.q_len - 1);
    const int n_block = visible_keys(d, i_last); /* the block's widest row (causal: its last) */
    float qr[D], acc[D], m = -INFINITY, l = 0.0f;
    const float c = d.scale * LOG2E;
    for (int x = 0; x < D; x++) {
        qr[x] = live ? c * ld<T>(q, b * d.q_batch_stride + (long)i * d.q_token_stride + (long)h * D + x) : 0.0f;
        acc[x] = 0.0f;
    }
    for (int j0 = 0; j0 < n_block; j0 += ST) {
        __syncthreads();
        stage_rows<T, D>(Ks, k, b * d.k_batch_stride + (long)h * D, d.k_token_stride, j0, d.k_len);
        stage_rows<T, D>(Vs, v, b * d.k_batch_stride + (long)h * D, d.k_token_stride, j0, d.k_len);
        __syncthreads();
        for (int r = 0; r < ST && j0 + r < n; r++) {
            float s = 0.0f;
            for (int x = 0; x < D; x++) s += qr[x] * elem<T>::to_f(Ks[r][x]);
            if (s > m) { /* new maximum: rescale what was summed so far */
                float corr = exp2f(m - s);
                l *= corr;
                for (int x = 0; x < D; x++) acc[x] *= corr;
                m = s;
            }
            float p = exp2f(s - m);
            l += p;
            for (int x = 0; x < D; x++) acc[x] += p * elem<T>::to_f(Vs[r][x]);
        }
    }
    if (!live) return;
    T *orow = (T *)o + b * d.o_batch_stride + (long)i * d.o_token_stride + (long)h * D;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int x = 0; x < D; x++) orow[x] = elem<T>::from_f(acc[x] * inv);
    lse[((long)b * d.heads + h) * d.q_len + i] = l > 0.0f ? (m + log2f(l)) * LN2 : -INFINITY;
}

/* D_i = dO_i . O_i, fp32, [B][H][q_len] */
template <typename T>
__global__ void attn_delta(spb_attn_desc d, const spb_bf16 *o, const spb_bf16 *dout, float *delta)
{
    long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
    long total = (long)d.batch * d.heads * d.q_len;
    if (idx >= total) return;
    int i = (int)(idx % d.q_len), h = (int)((idx / d.q_len) % d.heads), b = (int)(idx / ((long)d.q_len * d.heads));
    long off = b * d.o_batch_stride + (long)i * d.o_token_stride + (long)h * d.head_dim;
    float s = 0.0f;
    for (int x = 0; x < d.head_dim; x++) s += ld<T>(o, off + x) * ld<T>(dout, off + x);
    delta[idx] = s;
}

template <typename T, int D>
__global__ void __launch_bounds__(ST) dq_simple(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                const spb_bf16 *v, const float *lse, const float *delta,
                                                const spb_bf16 *dout, float *dq)
{
    __shared__ T Ks[ST][D], Vs[ST][D];
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * ST + threadIdx.x;
    const long row = ((long)b * d.heads + h) * d.q_len + i;
    const bool live = i < d.q_len && lse[i < d.q_len ? row : 0] > -INFINITY;
    const int n = live ? visible_keys(d, i) : 0;
    const int n_block = visible_keys(d, min(blockIdx.x * ST + ST - 1, d.q_len - 1));
    float qr[D], dor[D], acc[D];
    const float L = live ? lse[row] : 0.0f, Di = live ? delta[row] : 0.0f;
    const long qoff = b * d.q_batch_stride + (long)i * d.q_token_stride + (long)h * D;
    const long ooff = b * d.o_batch_stride + (long)i * d.o_token_stride + (long)h * D;
    for (int x = 0; x < D; x++) {
        qr[x] = live ? ld<T>(q, qoff + x) : 0.0f;
        dor[x] = live ? ld<T>(dout, ooff + x) : 0.0f;
        acc[x] = 0.0f;
    }
    for (int j0 = 0; j0 < n_block; j0 += ST) {
        __syncthreads();
        stage_rows<T, D>(Ks, k, b * d.k_batch_stride + (long)h * D, d.k_token_stride, j0, d.k_len);
        stage_rows<T, D>(Vs, v, b * d.k_batch_stride + (long)h * D, d.k_token_stride, j0, d.k_len);
        __syncthreads();
        for (int r = 0; r < ST && j0 + r < n; r++) {
            float s = 0.0f, dp = 0.0f;
            for (int x = 0; x < D; x++) {
                s += qr[x] * elem<T>::to_f(Ks[r][x]);
                dp += dor[x] * elem<T>::to_f(Vs[r][x]);
            }
            float p = expf(d.scale * s - L), ds = p * (dp - Di);
            for (int x = 0; x < D; x++) acc[x] += ds * elem<T>::to_f(Ks[r][x]);
        }
    }
    if (!live) return;
    for (int x = 0; x < D; x++) dq[qoff + x] += d.scale * acc[x];
}

template <typename T, int D>
__global__ void __launch_bounds__(ST) dkv_simple(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                 const spb_bf16 *v, const float *lse, const float *delta,
                                                 const spb_bf16 *dout, float *dk, float *dv)
{
    __shared__ T Qs[ST][D], dOs[ST][D];
    __shared__ float Ls[ST], Ds[ST];
    const int b = blockIdx.z, h = blockIdx.y, j = blockIdx.x * ST + threadIdx.x;
    const bool live = j < d.k_len;
    const long koff = b * d.k_batch_stride + (long)j * d.k_token_stride + (long)h * D;
    float kr[D], vr[D], dka[D], dva[D];
    for (int x = 0; x < D; x++) {
        kr[x] = live ? ld<T>(k, koff + x) : 0.0f;
        vr[x] = live ? ld<T>(v, koff + x) : 0.0f;
        dka[x] = dva[x] = 0.0f;
    }
    for (int i0 = first_query_tile<ST>(d, (long)blockIdx.x * ST); i0 < d.q_len; i0 += ST) {
        __syncthreads();
        stage_rows<T, D>(Qs, q, b * d.q_batch_stride + (long)h * D, d.q_token_stride, i0, d.q_len);
        stage_rows<T, D>(dOs, dout, b * d.o_batch_stride + (long)h * D, d.o_token_stride, i0, d.q_len);
        if (i0 + (int)threadIdx.x < d.q_len) {
            long row = ((long)b * d.heads + h) * d.q_len + i0 + threadIdx.x;
            Ls[threadIdx.x] = lse[row];
            Ds[threadIdx.x] = delta[row];
        } else {
            Ls[threadIdx.x] = -INFINITY;
            Ds[threadIdx.x] = 0.0f;
        }
        __syncthreads();
        if (!live) continue;
        for (int r = 0; r < ST && i0 + r < d.q_len; r++) {
            if (d.causal && d.k_offset + j > d.q_offset + i0 + r) continue;
            if (!(Ls[r] > -INFINITY)) continue;
            float s = 0.0f, dp = 0.0f;
            for (int x = 0; x < D; x++) {
                s += kr[x] * elem<T>::to_f(Qs[r][x]);
                dp += vr[x] * elem<T>::to_f(dOs[r][x]);
            }
            float p = expf(d.scale * s - Ls[r]), ds = p * (dp - Ds[r]);
            for (int x = 0; x < D; x++) {
                dva[x] += p * elem<T>::to_f(dOs[r][x]);
                dka[x] += ds * elem<T>::to_f(Qs[r][x]);
            }
        }
    }
    if (!live) return;
    for (int x = 0; x < D; x++) {
        dk[koff + x] += d.scale * dka[x];
        dv[koff + x] += dva[x];
    }
}

/* ========================== FAST (tensor cores) ================================= */
/* W warps per block, 16 rows each: 16 W resident rows, queries (forward,
 * dQ) or keys (dK, dV); W = 8 by default, 4 selectable
 * (spb_cuda_attention_set_block_rows) so that a GPU run can time both. */
#define BC 64                  /* streamed tile along the other sequence, double-buffered */
#define PAD 8                  /* row padding, in elements (text above) */

/* rows [r0, r0 + n) of one head (base: batch and head offset) into S (row
 * stride D + PAD) by cp.async, 16 bytes per copy; rows at or past len as
 * zeros (their source is row r0, never read).  The caller commits.  Each
 * thread copies the same 16-byte column of every (32 W / (D / 8))-th row:
 * its addresses are worked out once, not per copy (the copy loop was a
 * fifth of the forward's instructions per tile). */
template <int n, int D, int W>
__device__ __forceinline__ void load_rows_async(void *S, const spb_bf16 *g, long base, long stride, int r0, int len)
{
    constexpr int CHUNKS = D / 8, STEP = 32 * W / CHUNKS;
    static_assert(32 * W % CHUNKS == 0 && n % STEP == 0, "whole passes of the block over the rows");
    const int r = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
    const spb_bf16 *first = g + base + (long)r0 * stride + c * 8, *src = first + (long)r * stride;
    uint16_t *dst = (uint16_t *)S + r * (D + PAD) + c * 8;
    const long step = (long)STEP * stride;
    for (int i = 0; i < n / STEP; i++) {
        bool in = r0 + r + i * STEP < len;
        spb_cp_async16(dst + i * STEP * (D + PAD), in ? src + i * step : first, in ? 16 : 0);
    }
}

/* Fragments by ldmatrix from a tile with rows of LD elements (lane l names
 * row l % 8 of matrix l / 8; the m16n8k16 layouts are in the text above). */
/* A: rows [r, r + 16), columns [k0, k0 + 16) */
template <int LD> __device__ __forceinline__ void ldm_a(uint32_t a[4], const uint16_t *S, int r, int k0, int lane)
{
    int m = lane / 8;
    spb_ldmatrix_x4(a, S + (r + (m & 1) * 8 + lane % 8) * LD + k0 + (m >> 1) * 8);
}
/* B of two n-tiles, n in [n0, n0 + 16), k in [k0, k0 + 16), from a tile
 * stored [n][k] (K for Q·Kᵀ): b[0], b[1] for n0; b[2], b[3] for n0 + 8 */
template <int LD> __device__ __forceinline__ void ldm_b_nk(uint32_t b[4], const uint16_t *S, int n0, int k0, int lane)
{
    int m = lane / 8;
    spb_ldmatrix_x4(b, S + (n0 + (m >> 1) * 8 + lane % 8) * LD + k0 + (m & 1) * 8);
}
/* the same from a tile stored [k][n] (V for P·V), transposed on the way */
template <int LD> __device__ __forceinline__ void ldm_b_kn(uint32_t b[4], const uint16_t *S, int k0, int n0, int lane)
{
    int m = lane / 8;
    spb_ldmatrix_x4_trans(b, S + (k0 + (m & 1) * 8 + lane % 8) * LD + n0 + (m >> 1) * 8);
}

/* acc[g][2 NP][4] (RG groups of 16 rows: rows r + 16 g .. of Sa, x 16 NP
 * columns) = A · B(Sb rows 0..16 NP - 1)ᵀ over D.  Each B fragment is loaded
 * once for the RG groups: with RG = 2 a warp reads half the shared memory
 * per product. */
template <typename T, int D, int RG, int NP = 4>
__device__ __forceinline__ void mma_groups_rowsT(float (*acc)[2 * NP][4], const uint16_t *Sa, int r,
                                                 const uint16_t *Sb, int lane)
{
    SPB_UNROLL
    for (int kc = 0; kc < D / 16; kc++) {
        uint32_t a[RG][4];
        SPB_UNROLL
        for (int g = 0; g < RG; g++) ldm_a<D + PAD>(a[g], Sa, r + 16 * g, kc * 16, lane);
        SPB_UNROLL
        for (int np = 0; np < NP; np++) {
            uint32_t bf[4];
            ldm_b_nk<D + PAD>(bf, Sb, np * 16, kc * 16, lane);
            SPB_UNROLL
        for (int g = 0; g < RG; g++) {
                elem<T>::mma(acc[g][2 * np], a[g], bf[0], bf[1]);
                elem<T>::mma(acc[g][2 * np + 1], a[g], bf[2], bf[3]);
            }
        }
    }
}
/* out[g][D/8][4] (RG groups of 16 rows x D) += P(g: 16 x 64, C fragments,
 * rounded to T) · M(64 x D), M stored [64][D + PAD]; B loaded once per groups */
template <typename T, int D, int RG>
__device__ __forceinline__ void mma_groups_p_m(float (*out)[D / 8][4], const float (*p)[8][4], const uint16_t *M,
                                               int lane)
{
    SPB_UNROLL
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[RG][4];
        SPB_UNROLL
        for (int g = 0; g < RG; g++) {
            a[g][0] = elem<T>::pack2(p[g][2 * kk][0], p[g][2 * kk][1]);
            a[g][1] = elem<T>::pack2(p[g][2 * kk][2], p[g][2 * kk][3]);
            a[g][2] = elem<T>::pack2(p[g][2 * kk + 1][0], p[g][2 * kk + 1][1]);
            a[g][3] = elem<T>::pack2(p[g][2 * kk + 1][2], p[g][2 * kk + 1][3]);
        }
        SPB_UNROLL
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t bf[4];
            ldm_b_kn<D + PAD>(bf, M, kk * 16, dp * 16, lane);
            SPB_UNROLL
        for (int g = 0; g < RG; g++) {
                elem<T>::mma(out[g][2 * dp], a[g], bf[0], bf[1]);
                elem<T>::mma(out[g][2 * dp + 1], a[g], bf[2], bf[3]);
            }
        }
    }
}
/* one group: acc[8][4] (this warp's 16 rows x 64 columns) = A(rows r.. of Sa) · B(Sb rows 0..63)ᵀ over D */
template <typename T, int D>
__device__ __forceinline__ void mma_rows_rowsT(float acc[8][4], const uint16_t *Sa, int r, const uint16_t *Sb,
                                               int lane)
{
    mma_groups_rowsT<T, D, 1>((float (*)[8][4])acc, Sa, r, Sb, lane);
}
/* one group: out[D/8][4] (16 rows x D) += P(16 x 64) · M(64 x D) */
template <typename T, int D>
__device__ __forceinline__ void mma_p_m(float out[D / 8][4], const float p[8][4], const uint16_t *M, int lane)
{
    mma_groups_p_m<T, D, 1>((float (*)[D / 8][4])out, (const float (*)[8][4])p, M, lane);
}

/* ---- the per-tile elementwise steps, shared by the mma.sync and wgmma
 * kernels: both hold a warp's 16 rows x 64 columns in mma.sync's C layout
 * (this lane: rows g, g + 8; columns 8 nt + 2t, + 1). ---------------------- */
/* The forward's online softmax of one key tile (keys j0..j0 + 8 NT - 1), as in
 * FlashAttention-2: s (raw products) becomes P = exp2(S·c - m) in place, m
 * (in the scaled log2 units of S·c) and l of the lane's two rows move on,
 * and O's rows are rescaled by corr (online_softmax_tile; the pipelined
 * forward rescales later, rescale_rows).  The row maximum is taken over raw S (c > 0:
 * the same element wins), so each probability is one fused multiply-add
 * and one ex2.  MASKED: the tile crosses the sequence's end or the
 * diagonal (per-element masks); a separate body, so that the other tiles
 * carry no selects. */
template <int NT, bool MASKED>
__device__ __forceinline__ void softmax_stats_body(float (*s)[4], float m[2], float l[2], float corr[2],
                                                   const spb_attn_desc &d, int j0, const long qpos[2], float c, int t)
{
    float mx[2] = {-INFINITY, -INFINITY};
    for (int nt = 0; nt < NT; nt++)
        for (int e = 0; e < 4; e++) {
            if (MASKED) {
                int j = j0 + nt * 8 + 2 * t + (e & 1);
                if (!(j < d.k_len && (!d.causal || d.k_offset + j <= qpos[e >> 1]))) s[nt][e] = -INFINITY;
            }
            mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
        }
    float base[2];
    for (int x = 0; x < 2; x++) {
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
        mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
        float mn = fmaxf(m[x], mx[x] * c);
        base[x] = mn == -INFINITY ? 0.0f : mn; /* a row with nothing visible yet */
        corr[x] = spb_ex2(m[x] - base[x]);
        m[x] = mn;
        l[x] *= corr[x];
    }
    for (int nt = 0; nt < NT; nt++)
        for (int e = 0; e < 4; e++) {
            s[nt][e] = spb_ex2(fmaf(s[nt][e], c, -base[e >> 1]));
            l[e >> 1] += s[nt][e];
        }
}
/* ... without O: P, m and l move on, corr is the factor O's rows take
 * (rescale_rows) once no product still adds to O */
template <int NT = 8>
__device__ __forceinline__ void softmax_stats_tile(float (*s)[4], float m[2], float l[2], float corr[2],
                                                   const spb_attn_desc &d, int j0, bool masked, const long qpos[2],
                                                   float c, int t)
{
    if (masked)
        softmax_stats_body<NT, true>(s, m, l, corr, d, j0, qpos, c, t);
    else
        softmax_stats_body<NT, false>(s, m, l, corr, d, j0, qpos, c, t);
}
template <int D> __device__ __forceinline__ void rescale_rows(float oacc[D / 8][4], const float corr[2])
{
    for (int dn = 0; dn < D / 8; dn++) {
        oacc[dn][0] *= corr[0], oacc[dn][1] *= corr[0];
        oacc[dn][2] *= corr[1], oacc[dn][3] *= corr[1];
    }
}
template <int D, int NT = 8>
__device__ __forceinline__ void online_softmax_tile(float (*s)[4], float m[2], float l[2], float oacc[D / 8][4],
                                                    const spb_attn_desc &d, int j0, bool masked, const long qpos[2],
                                                    float c, int t)
{
    float corr[2];
    softmax_stats_tile<NT>(s, m, l, corr, d, j0, masked, qpos, c, t);
    rescale_rows<D>(oacc, corr);
}

/* After the last tile: O = oacc / l (rounded to T) and lse of query rows
 * row0 + g, row0 + g + 8 (those below q_len) */
template <typename T, int D>
__device__ __forceinline__ void store_o_lse(const spb_attn_desc &d, spb_bf16 *o, float *lse, const float oacc[D / 8][4],
                                            const float m[2], float l[2], int b, int h, int row0, int g, int t)
{
    for (int x = 0; x < 2; x++) {
        l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
        l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
    }
    for (int x = 0; x < 2; x++) {
        int i = row0 + g + 8 * x;
        if (i >= d.q_len) continue;
        float inv = l[x] > 0.0f ? 1.0f / l[x] : 0.0f;
        T *orow = (T *)o + b * d.o_batch_stride + (long)i * d.o_token_stride + (long)h * D;
        for (int dn = 0; dn < D / 8; dn++)
            *(uint32_t *)(orow + dn * 8 + 2 * t) = elem<T>::pack2(oacc[dn][2 * x] * inv, oacc[dn][2 * x + 1] * inv);
        if (t == 0) lse[((long)b * d.heads + h) * d.q_len + i] = l[x] > 0.0f ? (m[x] + log2f(l[x])) * LN2 : -INFINITY;
    }
}

/* dQ's statistics of query rows row0 + g (+ 8): lse as log2 (+inf where the
 * row sees nothing: P = 0), D_i, and the rows' positions */
__device__ __forceinline__ void query_row_stats(const spb_attn_desc &d, const float *lse, const float *delta, int b,
                                                int h, int row0, int g, float L2[2], float Dl[2], long qpos[2])
{
    for (int x = 0; x < 2; x++) {
        int i = row0 + g + 8 * x;
        long row = ((long)b * d.heads + h) * d.q_len + i;
        float L = i < d.q_len ? lse[row] : -INFINITY;
        L2[x] = L > -INFINITY ? L * LOG2E : INFINITY;
        Dl[x] = i < d.q_len ? delta[row] : 0.0f;
        qpos[x] = d.q_offset + i;
    }
}

/* dQ: s (raw S of query rows x keys j0..) becomes dS = P (dP - D); MASKED
 * as in softmax_stats_body (a separate body for the masked tiles) */
template <bool MASKED>
__device__ __forceinline__ void ds_of_rows_body(float s[8][4], const float dp[8][4], const spb_attn_desc &d, int j0,
                                                const long qpos[2], const float L2[2], const float Dl[2], float c,
                                                int t)
{
    for (int nt = 0; nt < 8; nt++)
        for (int e = 0; e < 4; e++) {
            int x = e >> 1;
            float p = spb_ex2(fmaf(s[nt][e], c, -L2[x]));
            if (MASKED) {
                int j = j0 + nt * 8 + 2 * t + (e & 1);
                if (!(j < d.k_len && (!d.causal || d.k_offset + j <= qpos[x]))) p = 0.0f;
            }
            s[nt][e] = p * (dp[nt][e] - Dl[x]);
        }
}
__device__ __forceinline__ void ds_of_rows(float s[8][4], const float dp[8][4], const spb_attn_desc &d, int j0,
                                           bool masked, const long qpos[2], const float L2[2], const float Dl[2],
                                           float c, int t)
{
    if (masked)
        ds_of_rows_body<true>(s, dp, d, j0, qpos, L2, Dl, c, t);
    else
        ds_of_rows_body<false>(s, dp, d, j0, qpos, L2, Dl, c, t);
}

/* dK/dV, transposed (rows: keys kpos; columns: queries i0..): element e of
 * n-tile nt of Pᵀ from its score s (MASKED: zero outside the keys, the
 * queries and the causal triangle); Lc: the query tile's lse (log2) */
template <bool MASKED>
__device__ __forceinline__ float pt_of_key(float s, const spb_attn_desc &d, int i0, const long kpos[2],
                                           const bool kin[2], const float *Lc, float c, int col, int x)
{
    float p = spb_ex2(fmaf(s, c, -Lc[col]));
    if (MASKED) {
        int i = i0 + col;
        if (!(kin[x] && i < d.q_len && (!d.causal || kpos[x] <= d.q_offset + i))) p = 0.0f;
    }
    return p;
}
/* s becomes Pᵀ and dp (dPᵀ) becomes dSᵀ, in one pass; Dc: the tile's D */
template <bool MASKED>
__device__ __forceinline__ void pt_dst_of_keys_body(float s[8][4], float dp[8][4], const spb_attn_desc &d, int i0,
                                                    const long kpos[2], const bool kin[2], const float *Lc,
                                                    const float *Dc, float c, int t)
{
    for (int nt = 0; nt < 8; nt++)
        for (int e = 0; e < 4; e++) {
            int col = nt * 8 + 2 * t + (e & 1);
            float p = pt_of_key<MASKED>(s[nt][e], d, i0, kpos, kin, Lc, c, col, e >> 1);
            s[nt][e] = p;
            dp[nt][e] = p * (dp[nt][e] - Dc[col]);
        }
}
__device__ __forceinline__ void pt_dst_of_keys(float s[8][4], float dp[8][4], const spb_attn_desc &d, int i0,
                                               bool masked, const long kpos[2], const bool kin[2], const float *Lc,
                                               const float *Dc, float c, int t)
{
    if (masked)
        pt_dst_of_keys_body<true>(s, dp, d, i0, kpos, kin, Lc, Dc, c, t);
    else
        pt_dst_of_keys_body<false>(s, dp, d, i0, kpos, kin, Lc, Dc, c, t);
}

/* the same in two passes, for a schedule that computes Pᵀ while the dPᵀ
 * product runs: s becomes Pᵀ, then (dst_of_keys) dp becomes dSᵀ */
template <bool MASKED>
__device__ __forceinline__ void pt_of_keys_body(float s[8][4], const spb_attn_desc &d, int i0, const long kpos[2],
                                                const bool kin[2], const float *Lc, float c, int t)
{
    for (int nt = 0; nt < 8; nt++)
        for (int e = 0; e < 4; e++)
            s[nt][e] = pt_of_key<MASKED>(s[nt][e], d, i0, kpos, kin, Lc, c, nt * 8 + 2 * t + (e & 1), e >> 1);
}
__device__ __forceinline__ void dst_of_keys(const float pt[8][4], float dp[8][4], const float *Dc, int t)
{
    for (int nt = 0; nt < 8; nt++)
        for (int e = 0; e < 4; e++) dp[nt][e] = pt[nt][e] * (dp[nt][e] - Dc[nt * 8 + 2 * t + (e & 1)]);
}

/* fp32 rows row0 + g (+ 8) below `len` of a [token][...] tensor at base
 * (token stride `stride`) += scale · acc */
template <int D>
__device__ __forceinline__ void add_rows(float *base, long stride, int row0, int len, const float acc[D / 8][4],
                                         float scale, int g, int t)
{
    for (int x = 0; x < 2; x++) {
        int i = row0 + g + 8 * x;
        if (i >= len) continue;
        float *row = base + (long)i * stride;
        for (int dn = 0; dn < D / 8; dn++) {
            row[dn * 8 + 2 * t] += scale * acc[dn][2 * x];
            row[dn * 8 + 2 * t + 1] += scale * acc[dn][2 * x + 1];
        }
    }
}

/* query rows [i0, i0 + 16 W) see key indices < keys_for_rows(i0) */
template <int W> __device__ __forceinline__ int keys_for_rows(const spb_attn_desc &d, int i0)
{
    return visible_keys(d, min(i0 + 16 * W - 1, d.q_len - 1));
}

/* The causal diagonal's tiles go last and the longest rows first: a tile
 * of query rows that sees more keys is launched earlier (the grid's tail
 * then holds short blocks). */
template <int W> __device__ __forceinline__ int query_tile_first(const spb_attn_desc &d)
{
    return (d.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * 16 * W;
}

/* MINB: blocks per SM the registers must allow (__launch_bounds__).  1: as
 * many registers as the kernel wants (about 175 at head dim 128: one block
 * of 8 warps per SM, 8 warps per SM at 4 too, by registers or shared
 * memory); 2 with 8 warps: 128 registers, so that two blocks (16 warps)
 * share an SM, Q's fragments read from shared memory at every tile instead
 * of held (their 32 registers).
 * RG: groups of 16 rows per warp.  1: 16 rows (the layout above); 2: 32
 * rows per warp, FlashAttention-2's forward tiling on A100/H100 (4 warps,
 * 128 rows, 2 blocks per SM): every K and V fragment a warp loads feeds two
 * products instead of one, and the two groups' chains of products, shuffles
 * and exponentials interleave in one instruction stream, where RG = 1 has
 * only the other warps of the scheduler to hide them behind; Q is read from
 * shared memory per tile (S and O of two groups hold 192 registers at head
 * dim 128). */
template <typename T, int D, int W, int MINB, int RG = 1>
__global__ void __launch_bounds__(32 * W, MINB) fwd_fast(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                    const spb_bf16 *v, spb_bf16 *o, float *lse)
{
    constexpr int LD = D + PAD, R = 16 * RG; /* rows per warp */
    extern __shared__ __align__(16) unsigned char smem[];
    uint16_t *Qs = (uint16_t *)smem, *Ks = Qs + R * W * LD, *Vs = Ks + 2 * BC * LD; /* K, V: two stages each */
    const int b = blockIdx.z, h = blockIdx.y, i0 = query_tile_first<W * RG>(d);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, r = warp * R;
    const long qb = b * d.q_batch_stride + (long)h * D, kb = b * d.k_batch_stride + (long)h * D;
    const float c = d.scale * LOG2E;
    const int n_tiles = (keys_for_rows<W * RG>(d, i0) + BC - 1) / BC;

    load_rows_async<R * W, D, W>(Qs, q, qb, d.q_token_stride, i0, d.q_len);
    if (n_tiles > 0) {
        load_rows_async<BC, D, W>(Ks, k, kb, d.k_token_stride, 0, d.k_len);
        load_rows_async<BC, D, W>(Vs, v, kb, d.k_token_stride, 0, d.k_len);
    }
    spb_cp_async_commit();
    spb_cp_async_wait<0>();
    __syncthreads();
    constexpr bool QREG = MINB == 1 && RG == 1; /* Q's fragments in registers */
    uint32_t qf[QREG ? D / 16 : 1][4];
    if constexpr (QREG)
        for (int kc = 0; kc < D / 16; kc++) ldm_a<LD>(qf[kc], Qs, r, kc * 16, lane);

    float oacc[RG][D / 8][4];
    SPB_UNROLL
    for (int x = 0; x < RG; x++)
        for (int dn = 0; dn < D / 8; dn++) oacc[x][dn][0] = oacc[x][dn][1] = oacc[x][dn][2] = oacc[x][dn][3] = 0.0f;
    float m[RG][2], l[RG][2];
    long qpos[RG][2];
    SPB_UNROLL
    for (int x = 0; x < RG; x++) {
        m[x][0] = m[x][1] = -INFINITY, l[x][0] = l[x][1] = 0.0f;
        qpos[x][0] = d.q_offset + i0 + r + 16 * x + g, qpos[x][1] = qpos[x][0] + 8;
    }
    const long warp_first_q = d.q_offset + i0 + r, warp_last_q = warp_first_q + R - 1;

    for (int it = 0; it < n_tiles; it++) {
        const int j0 = it * BC, st = it & 1;
        __syncthreads(); /* every warp is done with the other stage (tile it - 1) */
        if (it + 1 < n_tiles) {
            load_rows_async<BC, D, W>(Ks + (st ^ 1) * BC * LD, k, kb, d.k_token_stride, j0 + BC, d.k_len);
            load_rows_async<BC, D, W>(Vs + (st ^ 1) * BC * LD, v, kb, d.k_token_stride, j0 + BC, d.k_len);
        }
        spb_cp_async_commit(); /* possibly empty: one group per tile keeps the count */
        spb_cp_async_wait<1>(); /* tile it has landed, tile it + 1 may still fly */
        __syncthreads();
        if (d.causal && d.k_offset + j0 > warp_last_q) continue; /* nothing visible to this warp's rows */
        const uint16_t *Kc = Ks + st * BC * LD, *Vc = Vs + st * BC * LD;
        float s[RG][8][4];
        SPB_UNROLL
    for (int x = 0; x < RG; x++)
            for (int nt = 0; nt < 8; nt++) s[x][nt][0] = s[x][nt][1] = s[x][nt][2] = s[x][nt][3] = 0.0f;
        if constexpr (QREG) {
            for (int kc = 0; kc < D / 16; kc++)
                for (int np = 0; np < 4; np++) {
                    uint32_t bf[4];
                    ldm_b_nk<LD>(bf, Kc, np * 16, kc * 16, lane);
                    elem<T>::mma(s[0][2 * np], qf[kc], bf[0], bf[1]);
                    elem<T>::mma(s[0][2 * np + 1], qf[kc], bf[2], bf[3]);
                }
        } else {
            mma_groups_rowsT<T, D, RG>(s, Qs, r, Kc, lane);
        }
        /* per-element masks only where the tile crosses the sequence's end or
         * the diagonal of a group's rows (a group none of whose rows sees the
         * tile takes the masked body: P = 0, its m, l and O unchanged) */
        SPB_UNROLL
    for (int x = 0; x < RG; x++) {
            const bool masked = j0 + BC > d.k_len || (d.causal && d.k_offset + j0 + BC - 1 > warp_first_q + 16 * x);
            online_softmax_tile<D>(s[x], m[x], l[x], oacc[x], d, j0, masked, qpos[x], c, t);
        }
        mma_groups_p_m<T, D, RG>(oacc, s, Vc, lane);
    }
    SPB_UNROLL
    for (int x = 0; x < RG; x++) store_o_lse<T, D>(d, o, lse, oacc[x], m[x], l[x], b, h, i0 + r + 16 * x, g, t);
}

template <typename T, int D, int W>
__global__ void __launch_bounds__(32 * W) dq_fast(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                   const spb_bf16 *v, const float *lse, const float *delta,
                                                   const spb_bf16 *dout, float *dq)
{
    constexpr int LD = D + PAD;
    extern __shared__ __align__(16) unsigned char smem[];
    uint16_t *Qs = (uint16_t *)smem, *dOs = Qs + 16 * W * LD, *Ks = dOs + 16 * W * LD, *Vs = Ks + 2 * BC * LD;
    const int b = blockIdx.z, h = blockIdx.y, i0 = query_tile_first<W>(d);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, r = warp * 16;
    const long qb = b * d.q_batch_stride + (long)h * D, kb = b * d.k_batch_stride + (long)h * D,
               ob = b * d.o_batch_stride + (long)h * D;
    const float c = d.scale * LOG2E;
    const int n_tiles = (keys_for_rows<W>(d, i0) + BC - 1) / BC;
    load_rows_async<16 * W, D, W>(Qs, q, qb, d.q_token_stride, i0, d.q_len);
    load_rows_async<16 * W, D, W>(dOs, dout, ob, d.o_token_stride, i0, d.q_len);
    if (n_tiles > 0) {
        load_rows_async<BC, D, W>(Ks, k, kb, d.k_token_stride, 0, d.k_len);
        load_rows_async<BC, D, W>(Vs, v, kb, d.k_token_stride, 0, d.k_len);
    }
    spb_cp_async_commit();
    float L2[2], Dl[2];
    long qpos[2];
    query_row_stats(d, lse, delta, b, h, i0 + r, g, L2, Dl, qpos);
    const long warp_first_q = d.q_offset + i0 + r, warp_last_q = warp_first_q + 15;
    float acc[D / 8][4];
    for (int dn = 0; dn < D / 8; dn++) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
    spb_cp_async_wait<0>();
    for (int it = 0; it < n_tiles; it++) {
        const int j0 = it * BC, st = it & 1;
        __syncthreads(); /* the other stage is free; at it = 0, Q and dO are visible after the next one */
        if (it + 1 < n_tiles) {
            load_rows_async<BC, D, W>(Ks + (st ^ 1) * BC * LD, k, kb, d.k_token_stride, j0 + BC, d.k_len);
            load_rows_async<BC, D, W>(Vs + (st ^ 1) * BC * LD, v, kb, d.k_token_stride, j0 + BC, d.k_len);
        }
        spb_cp_async_commit();
        spb_cp_async_wait<1>();
        __syncthreads();
        if (d.causal && d.k_offset + j0 > warp_last_q) continue;
        const uint16_t *Kc = Ks + st * BC * LD, *Vc = Vs + st * BC * LD;
        float s[8][4], dp[8][4];
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
        mma_rows_rowsT<T, D>(s, Qs, r, Kc, lane);
        mma_rows_rowsT<T, D>(dp, dOs, r, Vc, lane);
        const bool masked = j0 + BC > d.k_len || (d.causal && d.k_offset + j0 + BC - 1 > warp_first_q);
        ds_of_rows(s, dp, d, j0, masked, qpos, L2, Dl, c, t); /* s: dS */
        mma_p_m<T, D>(acc, s, Kc, lane);
    }
    add_rows<D>(dq + qb, d.q_token_stride, i0 + r, d.q_len, acc, d.scale, g, t);
}

/* lse (as log2, +inf for a row that sees nothing: P = 0) and delta of query
 * rows [i0, i0 + BC) into Ls, Ds, by thread tid of 32 W; rows past q_len see nothing */
template <int W>
__device__ __forceinline__ void load_row_stats(float *Ls, float *Ds, const spb_attn_desc &d, const float *lse,
                                               const float *delta, long rows_base, int i0, int tid)
{
    for (int e = tid; e < BC; e += 32 * W) {
        int i = i0 + e;
        float L = i < d.q_len ? lse[rows_base + i] : -INFINITY;
        Ls[e] = L > -INFINITY ? L * LOG2E : INFINITY;
        Ds[e] = i < d.q_len ? delta[rows_base + i] : 0.0f;
    }
}

/* The backward's query tile at i0 into one stage: Q and dO rows by cp.async
 * (the caller commits), their lse and D (load_row_stats) */
template <int D, int W>
__device__ __forceinline__ void load_query_tile(uint16_t *Qst, uint16_t *dOst, float *Lst, float *Dst,
                                                const spb_attn_desc &d, const spb_bf16 *q, const spb_bf16 *dout,
                                                const float *lse, const float *delta, long qb, long ob,
                                                long rows_base, int i0)
{
    load_rows_async<BC, D, W>(Qst, q, qb, d.q_token_stride, i0, d.q_len);
    load_rows_async<BC, D, W>(dOst, dout, ob, d.o_token_stride, i0, d.q_len);
    load_row_stats<W>(Lst, Dst, d, lse, delta, rows_base, i0, threadIdx.x);
}

/* A operand (16 x 16): rows (m) [m0, m0 + 16), k [k0, k0 + 16) of a tile stored
 * [k][m] (dSᵀ for dS·K), transposed on the way */
template <int LD> __device__ __forceinline__ void ldm_a_km(uint32_t a[4], const uint16_t *S, int m0, int k0, int lane)
{
    int m = lane / 8;
    spb_ldmatrix_x4_trans(a, S + (k0 + (m >> 1) * 8 + lane % 8) * LD + m0 + (m & 1) * 8);
}

/* dkv_fast's FUSED step, after every warp has written its dSᵀ rows: dQ of
 * query rows [i0, i0 + 64) += scale · dS · K over the block's keys */
template <typename T, int D, int W>
__device__ __forceinline__ void dq_from_dst(const spb_attn_desc &d, float *dq, long qb, int i0, const uint16_t *dSt,
                                            const uint16_t *Ks, int warp, int lane)
{
    constexpr int NT = D / (2 * W); /* this warp's n-tiles of 8 columns: 4/W of D */
    static_assert(NT % 2 == 0, "a warp's share of D is whole pairs of n-tiles");
    __syncthreads(); /* every warp's dSᵀ rows are written */
    const int m0 = 16 * (warp % 4), c0 = (warp / 4) * 8 * NT, g = lane / 4, t = lane % 4;
    float acc[NT][4];
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    for (int kc = 0; kc < W; kc++) { /* the block's 16 W keys, 16 at a time */
        uint32_t a[4];
        ldm_a_km<BC + PAD>(a, dSt, m0, kc * 16, lane);
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bf[4];
            ldm_b_kn<D + PAD>(bf, Ks, kc * 16, c0 + np * 16, lane);
            elem<T>::mma(acc[2 * np], a, bf[0], bf[1]);
            elem<T>::mma(acc[2 * np + 1], a, bf[2], bf[3]);
        }
    }
    for (int x = 0; x < 2; x++) {
        int i = i0 + m0 + g + 8 * x;
        if (i >= d.q_len) continue;
        float *row = dq + qb + (long)i * d.q_token_stride + c0;
        for (int nt = 0; nt < NT; nt++)
            spb_red_add_f32x2(row + nt * 8 + 2 * t, d.scale * acc[nt][2 * x], d.scale * acc[nt][2 * x + 1]);
    }
}

/* FUSED: dQ too, FlashAttention-2's way, instead of dq_fast's second pass:
 * each warp's dSᵀ (its 16 keys x 64 queries, rounded to T) goes to shared
 * memory; then the block's warps share dQ(64 queries x D) += dS · K(16 W
 * keys), warp w taking queries 16 (w % 4).. and a 4/W share of D, and add
 * it to dq with fp32 atomics (5 products per pair instead of 7; the sum's
 * order, hence its last bits, then varies from run to run). */
template <typename T, int D, int W, bool FUSED>
__global__ void __launch_bounds__(32 * W) dkv_fast(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                    const spb_bf16 *v, const float *lse, const float *delta,
                                                    const spb_bf16 *dout, float *dk, float *dv, float *dq)
{
    constexpr int LD = D + PAD;
    extern __shared__ __align__(16) unsigned char smem[];
    uint16_t *Ks = (uint16_t *)smem, *Vs = Ks + 16 * W * LD, *Qs = Vs + 16 * W * LD, *dOs = Qs + 2 * BC * LD;
    float *Ls = (float *)(dOs + 2 * BC * LD), *Ds = Ls + 2 * BC; /* two stages each */
    uint16_t *dSt = (uint16_t *)(Ds + 2 * BC);                   /* FUSED: [16 W keys][BC + PAD] */
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * 16 * W;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, r = warp * 16;
    const long qb = b * d.q_batch_stride + (long)h * D, kb = b * d.k_batch_stride + (long)h * D,
               ob = b * d.o_batch_stride + (long)h * D, rows_base = ((long)b * d.heads + h) * d.q_len;
    const float c = d.scale * LOG2E;
    const long kpos[2] = {d.k_offset + j0 + r + g, d.k_offset + j0 + r + g + 8};
    const bool kin[2] = {j0 + r + g < d.k_len, j0 + r + g + 8 < d.k_len};
    const long warp_first_k = d.k_offset + j0 + r;
    const int i_start = first_query_tile<BC>(d, j0);
    const int n_tiles = (d.q_len - i_start + BC - 1) / BC;

    load_rows_async<16 * W, D, W>(Ks, k, kb, d.k_token_stride, j0, d.k_len);
    load_rows_async<16 * W, D, W>(Vs, v, kb, d.k_token_stride, j0, d.k_len);
    if (n_tiles > 0) load_query_tile<D, W>(Qs, dOs, Ls, Ds, d, q, dout, lse, delta, qb, ob, rows_base, i_start);
    spb_cp_async_commit();
    float dka[D / 8][4], dva[D / 8][4];
    for (int dn = 0; dn < D / 8; dn++)
        for (int e = 0; e < 4; e++) dka[dn][e] = dva[dn][e] = 0.0f;
    spb_cp_async_wait<0>();
    for (int it = 0; it < n_tiles; it++) {
        const int i0 = i_start + it * BC, st = it & 1;
        __syncthreads(); /* the other stage is free */
        if (it + 1 < n_tiles)
            load_query_tile<D, W>(Qs + (st ^ 1) * BC * LD, dOs + (st ^ 1) * BC * LD, Ls + (st ^ 1) * BC,
                                  Ds + (st ^ 1) * BC, d, q, dout, lse, delta, qb, ob, rows_base, i0 + BC);
        spb_cp_async_commit();
        spb_cp_async_wait<1>();
        __syncthreads();
        const bool none = d.causal && d.q_offset + i0 + BC - 1 < warp_first_k; /* no query here sees these keys */
        if (none && !FUSED) continue;
        const uint16_t *Qc = Qs + st * BC * LD, *dOc = dOs + st * BC * LD;
        const float *Lc = Ls + st * BC, *Dc = Ds + st * BC;
        if (!none) {
            float s[8][4], dp[8][4]; /* transposed: rows = this warp's 16 keys, columns = 64 queries */
            for (int nt = 0; nt < 8; nt++)
                for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
            mma_rows_rowsT<T, D>(s, Ks, r, Qc, lane);
            mma_rows_rowsT<T, D>(dp, Vs, r, dOc, lane);
            const bool masked = !kin[1] || i0 + BC > d.q_len || (d.causal && d.q_offset + i0 < warp_first_k + 15);
            pt_dst_of_keys(s, dp, d, i0, masked, kpos, kin, Lc, Dc, c, t); /* s: Pᵀ, dp: dSᵀ */
            mma_p_m<T, D>(dva, s, dOc, lane);
            mma_p_m<T, D>(dka, dp, Qc, lane);
            if (FUSED)
                for (int nt = 0; nt < 8; nt++)
                    for (int x = 0; x < 2; x++)
                        *(uint32_t *)(dSt + (r + g + 8 * x) * (BC + PAD) + nt * 8 + 2 * t) =
                            elem<T>::pack2(dp[nt][2 * x], dp[nt][2 * x + 1]);
        } else { /* FUSED: this warp's rows of dSᵀ are zeros, and the block's dQ step needs them */
            for (int e = lane; e < 16 * BC / 2; e += 32)
                *(uint32_t *)(dSt + (r + e / (BC / 2)) * (BC + PAD) + 2 * (e % (BC / 2))) = 0u;
        }
        if (FUSED) dq_from_dst<T, D, W>(d, dq, qb, i0, dSt, Ks, warp, lane);
    }
    add_rows<D>(dk + kb, d.k_token_stride, j0 + r, d.k_len, dka, d.scale, g, t);
    add_rows<D>(dv + kb, d.k_token_stride, j0 + r, d.k_len, dva, 1.0f, g, t);
}

/* ---- the backward on FlashAttention-2's tiling ---------------------------------
 * dkvq_exchange: one block of 8 warps holds XK = 128 keys (K, V resident)
 * and streams the query rows in tiles of BC = 64 (Q, dO, lse, D in two
 * stages).  Per tile, three steps, each with the warp layout that suits its
 * product, P and dS passing between them through shared memory (dkv_fast
 * keeps a warp's Sᵀ rows in its registers instead, which ties every
 * product of that warp to 16 keys x the whole width):
 *   S, dP (64 x 128)  warps 2 (queries) x 4 (keys), 32 x 32 each;
 *                     P = exp(S - lse) and dS = P (dP - D), rounded to T,
 *                     into Ps and dSs ([query][key])
 *   dV, dK (128 x D)  warps 4 (keys) x 2 (halves of D), 32 x D/2 each:
 *                     dV += Pᵀ dO, dK += dSᵀ Q, held over the tiles
 *   dQ (64 x D)       warps 2 (queries) x 4 (quarters of D), 32 x D/4
 *                     each: dQ += scale · dS K, added by 8-byte fp32
 *                     reductions, or with BULK (FlashAttention-3's way, sm_90)
 *                     written to a stage in shared memory and added a row
 *                     at a time by the copy engine (cp.reduce.async.bulk):
 *                     warp 0 issues the tile's 64 rows after the next
 *                     tile's first barrier and waits for their read before
 *                     its third, so BULK adds no barrier per tile
 * 5 products per pair, as dkv_fast's FUSED.  At head dim 128 a warp loads
 * 144 ldmatrix.x4 per tile for its 320 products (FUSED dkv_fast: 184), and
 * S and dP take 32 registers each where dkv_fast's take 64 each (its
 * 255 registers spill).  Causal: query tiles that see none of the block's
 * keys are skipped; the other tiles' S steps mask per element where a
 * warp's 32 x 32 crosses the diagonal or the keys' end. */
#define XK 128 /* keys per block of dkvq_exchange */

/* acc[x][NT][4] (2 groups of 16 rows: rows m0 + 16 x .. of A, x 8 NT
 * columns n0.. of B) += A · B over KS of k; B stored [k][n] (row stride
 * LDB); A stored [m][k] (A_KM false) or [k][m] (true: Pᵀ, dSᵀ from P and
 * dS as they lie), row stride LDA */
template <typename T, int LDA, bool A_KM, int LDB, int KS, int NT>
__device__ __forceinline__ void mma_two_groups_b_kn(float (*acc)[NT][4], const uint16_t *A, int m0, const uint16_t *B,
                                                    int n0, int lane)
{
    static_assert(NT % 2 == 0, "whole pairs of n-tiles");
    SPB_UNROLL
    for (int kk = 0; kk < KS / 16; kk++) {
        uint32_t a[2][4];
        SPB_UNROLL
        for (int x = 0; x < 2; x++) {
            if (A_KM)
                ldm_a_km<LDA>(a[x], A, m0 + 16 * x, kk * 16, lane);
            else
                ldm_a<LDA>(a[x], A, m0 + 16 * x, kk * 16, lane);
        }
        SPB_UNROLL
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bf[4];
            ldm_b_kn<LDB>(bf, B, kk * 16, n0 + 16 * np, lane);
            SPB_UNROLL
            for (int x = 0; x < 2; x++) {
                elem<T>::mma(acc[x][2 * np], a[x], bf[0], bf[1]);
                elem<T>::mma(acc[x][2 * np + 1], a[x], bf[2], bf[3]);
            }
        }
    }
}

/* The S step's elementwise part: this warp's S and dP (query rows sq.. of
 * the tile at i0, keys sk.. of the block at j0; C layout) become P and
 * dS = P (dP - D), rounded to T, at their places in Ps and dSs.  Lc, Dc:
 * the tile's lse (log2; +inf past q_len: P = 0) and D.  MASKED: keys past
 * k_len and, causal, keys after the row's position get P = 0. */
template <typename T, bool MASKED>
__device__ __forceinline__ void p_ds_to_shared_body(const float (*s)[4][4], const float (*dp)[4][4], uint16_t *Ps,
                                                    uint16_t *dSs, const spb_attn_desc &d, int i0, int j0, int sq,
                                                    int sk, const float *Lc, const float *Dc, float c, int g, int t)
{
    constexpr int LDP = XK + PAD;
    SPB_UNROLL
    for (int x = 0; x < 2; x++)
        SPB_UNROLL
        for (int y = 0; y < 2; y++) {
            const int row = sq + 16 * x + g + 8 * y;
            const float L2 = Lc[row], Dl = Dc[row];
            const long qpos = d.q_offset + i0 + row;
            SPB_UNROLL
            for (int nt = 0; nt < 4; nt++) {
                const int col = sk + 8 * nt + 2 * t;
                float p[2], ds[2];
                for (int e = 0; e < 2; e++) {
                    p[e] = spb_ex2(fmaf(s[x][nt][2 * y + e], c, -L2));
                    if (MASKED) {
                        const int j = j0 + col + e;
                        if (!(j < d.k_len && (!d.causal || d.k_offset + j <= qpos))) p[e] = 0.0f;
                    }
                    ds[e] = p[e] * (dp[x][nt][2 * y + e] - Dl);
                }
                *(uint32_t *)(Ps + row * LDP + col) = elem<T>::pack2(p[0], p[1]);
                *(uint32_t *)(dSs + row * LDP + col) = elem<T>::pack2(ds[0], ds[1]);
            }
        }
}

/* How write_two_groups puts a value: added, added by an 8-byte fp32
 * reduction (dQ: every key block adds to the same rows), or stored */
enum rows_op { ROWS_ADD, ROWS_REDUCE, ROWS_STORE };

/* fp32 rows row0 + 16 x + g (+ 8) (x < X) below len, columns col0.. (NT
 * n-tiles), of a [token][...] tensor at base (token stride `stride`)
 * (OP)= scale · acc */
template <int NT, rows_op OP, int X = 2>
__device__ __forceinline__ void write_two_groups(float *base, long stride, int row0, int len, int col0,
                                                 const float (*acc)[NT][4], float scale, int g, int t)
{
    SPB_UNROLL
    for (int x = 0; x < X; x++)
        for (int y = 0; y < 2; y++) {
            const int i = row0 + 16 * x + g + 8 * y;
            if (i >= len) continue;
            float *row = base + (long)i * stride + col0 + 2 * t;
            SPB_UNROLL
            for (int nt = 0; nt < NT; nt++) {
                const float a = scale * acc[x][nt][2 * y], b = scale * acc[x][nt][2 * y + 1];
                if (OP == ROWS_REDUCE) {
                    spb_red_add_f32x2(row + 8 * nt, a, b);
                } else if (OP == ROWS_STORE) {
                    *(float2 *)(row + 8 * nt) = make_float2(a, b);
                } else {
                    row[8 * nt] += a;
                    row[8 * nt + 1] += b;
                }
            }
        }
}

/* BULK's dQ tile in shared memory: rows of D fp32 padded by 8, so that the
 * fragment stores of a warp's 8 rows fall in distinct banks (two passes of
 * 32 lanes x 8 bytes) and every row starts 16-byte aligned for the copy
 * engine */
template <int D> __host__ __device__ constexpr int dq_stage_ld() { return D + 8; }

/* warp 0 of the block hands the staged tile's rows [i0, i0 + BC) below
 * q_len to the copy engine (dq += Qd), two rows a lane, and commits them
 * as the lane's group; after a barrier that follows every warp's stores
 * and fence */
template <int D>
__device__ __forceinline__ void dq_stage_issue(const spb_attn_desc &d, float *dq, long qb, int i0, const float *Qd,
                                               int lane)
{
    constexpr int LDQ = dq_stage_ld<D>();
    for (int r = lane; r < BC; r += 32)
        if (i0 + r < d.q_len) spb_bulk_reduce_add_f32(dq + qb + (long)(i0 + r) * d.q_token_stride, Qd + r * LDQ, 4 * D);
    spb_bulk_commit();
}

/* A warp's share of a tile's dQ (rows row0 + 16 x + g (+ 8), x < X, of
 * the tile at i0; columns col0.., NT n-tiles) times the scale: BULK into
 * the stage Qd (rows of the tile), fenced for the copy engine's
 * (async-proxy) read; else added to dq by 8-byte reductions */
template <int D, int NT, int X, bool BULK>
__device__ __forceinline__ void write_dq_share(const spb_attn_desc &d, float *dq, long qb, int i0, float *Qd,
                                               int row0, int col0, const float (*acc)[NT][4], int g, int t)
{
    if (BULK) {
        write_two_groups<NT, ROWS_STORE, X>(Qd, dq_stage_ld<D>(), row0, BC, col0, acc, d.scale, g, t);
        spb_fence_proxy_async();
    } else {
        write_two_groups<NT, ROWS_REDUCE, X>(dq + qb, d.q_token_stride, i0 + row0, d.q_len, col0, acc, d.scale, g,
                                             t);
    }
}

/* BULK, after the last tile (at i_last): once every warp has staged its
 * share, warp 0 hands the tile to the copy engine and waits for it before
 * the block, and its shared memory, ends */
template <int D>
__device__ __forceinline__ void dq_stage_flush_last(const spb_attn_desc &d, float *dq, long qb, int i_last,
                                                    const float *Qd, int warp, int lane)
{
    __syncthreads();
    if (warp == 0) {
        dq_stage_issue<D>(d, dq, qb, i_last, Qd, lane);
        spb_bulk_wait<0>();
    }
}

template <typename T, int D, bool BULK>
__global__ void __launch_bounds__(256) dkvq_exchange(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                     const spb_bf16 *v, const float *lse, const float *delta,
                                                     const spb_bf16 *dout, float *dk, float *dv, float *dq)
{
    constexpr int W = 8, LD = D + PAD, LDP = XK + PAD;
    constexpr int NV = D / 16, NQ = D / 32; /* n-tiles of a warp's half (dV, dK) and quarter (dQ) of D */
    extern __shared__ __align__(16) unsigned char smem[];
    /* K, V of the block's keys; Q, dO in two stages; P, dS of one tile */
    uint16_t *Ks = (uint16_t *)smem, *Vs = Ks + XK * LD, *Qs = Vs + XK * LD, *dOs = Qs + 2 * BC * LD;
    uint16_t *Ps = dOs + 2 * BC * LD, *dSs = Ps + BC * LDP;
    float *Ls = (float *)(dSs + BC * LDP), *Ds = Ls + 2 * BC; /* two stages each */
    float *Qd = Ds + 2 * BC;                                   /* BULK: the tile's dQ (dq_stage_ld) */
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * XK;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int sq = 32 * (warp / 4), sk = 32 * (warp % 4);       /* S step: queries sq.., keys sk.. */
    const int vk = 32 * (warp % 4), vc = (D / 2) * (warp / 4);  /* dV, dK step: keys vk.., columns vc.. */
    const int qq = 32 * (warp % 2), qc = (D / 4) * (warp / 2);  /* dQ step: queries qq.., columns qc.. */
    const long qb = b * d.q_batch_stride + (long)h * D, kb = b * d.k_batch_stride + (long)h * D,
               ob = b * d.o_batch_stride + (long)h * D, rows_base = ((long)b * d.heads + h) * d.q_len;
    const float c = d.scale * LOG2E;
    const int i_start = first_query_tile<BC>(d, j0);
    const int n_tiles = (d.q_len - i_start + BC - 1) / BC;

    load_rows_async<XK, D, W>(Ks, k, kb, d.k_token_stride, j0, d.k_len);
    load_rows_async<XK, D, W>(Vs, v, kb, d.k_token_stride, j0, d.k_len);
    if (n_tiles > 0) load_query_tile<D, W>(Qs, dOs, Ls, Ds, d, q, dout, lse, delta, qb, ob, rows_base, i_start);
    spb_cp_async_commit();
    float dka[2][NV][4], dva[2][NV][4];
    SPB_UNROLL
    for (int x = 0; x < 2; x++)
        for (int nt = 0; nt < NV; nt++)
            for (int e = 0; e < 4; e++) dka[x][nt][e] = dva[x][nt][e] = 0.0f;
    spb_cp_async_wait<0>();
    for (int it = 0; it < n_tiles; it++) {
        const int i0 = i_start + it * BC, st = it & 1;
        __syncthreads(); /* the other stage, Ps and dSs are free; BULK: the last tile's dQ is staged */
        if (BULK && it > 0 && warp == 0) dq_stage_issue<D>(d, dq, qb, i0 - BC, Qd, lane);
        if (it + 1 < n_tiles)
            load_query_tile<D, W>(Qs + (st ^ 1) * BC * LD, dOs + (st ^ 1) * BC * LD, Ls + (st ^ 1) * BC,
                                  Ds + (st ^ 1) * BC, d, q, dout, lse, delta, qb, ob, rows_base, i0 + BC);
        spb_cp_async_commit();
        spb_cp_async_wait<1>();
        __syncthreads();
        const uint16_t *Qc = Qs + st * BC * LD, *dOc = dOs + st * BC * LD;
        {
            float s[2][4][4], dp[2][4][4];
            SPB_UNROLL
            for (int x = 0; x < 2; x++)
                for (int nt = 0; nt < 4; nt++)
                    for (int e = 0; e < 4; e++) s[x][nt][e] = dp[x][nt][e] = 0.0f;
            mma_groups_rowsT<T, D, 2, 2>(s, Qc, sq, Ks + sk * LD, lane);
            mma_groups_rowsT<T, D, 2, 2>(dp, dOc, sq, Vs + sk * LD, lane);
            /* keys past k_len are zero rows (their P reaches only dK, dV rows never
             * stored, and dQ through a zero K row); masked anyway, so P holds no stray values */
            const bool masked =
                j0 + sk + 32 > d.k_len || (d.causal && d.k_offset + j0 + sk + 31 > d.q_offset + i0 + sq);
            if (masked)
                p_ds_to_shared_body<T, true>(s, dp, Ps, dSs, d, i0, j0, sq, sk, Ls + st * BC, Ds + st * BC, c, g, t);
            else
                p_ds_to_shared_body<T, false>(s, dp, Ps, dSs, d, i0, j0, sq, sk, Ls + st * BC, Ds + st * BC, c, g, t);
        }
        /* BULK: the engine has read the last tile's dQ before anyone writes this one's */
        if (BULK && warp == 0) spb_bulk_wait_read<0>();
        __syncthreads(); /* the tile's P and dS are whole */
        mma_two_groups_b_kn<T, LDP, true, LD, BC, NV>(dva, Ps, vk, dOc, vc, lane);
        mma_two_groups_b_kn<T, LDP, true, LD, BC, NV>(dka, dSs, vk, Qc, vc, lane);
        float qa[2][NQ][4];
        SPB_UNROLL
        for (int x = 0; x < 2; x++)
            for (int nt = 0; nt < NQ; nt++)
                for (int e = 0; e < 4; e++) qa[x][nt][e] = 0.0f;
        mma_two_groups_b_kn<T, LDP, false, LD, XK, NQ>(qa, dSs, qq, Ks, qc, lane);
        write_dq_share<D, NQ, 2, BULK>(d, dq, qb, i0, Qd, qq, qc, qa, g, t);
    }
    if (BULK && n_tiles > 0) dq_stage_flush_last<D>(d, dq, qb, i_start + (n_tiles - 1) * BC, Qd, warp, lane);
    write_two_groups<NV, ROWS_ADD>(dk + kb, d.k_token_stride, j0 + vk, d.k_len, vc, dka, d.scale, g, t);
    write_two_groups<NV, ROWS_ADD>(dv + kb, d.k_token_stride, j0 + vk, d.k_len, vc, dva, 1.0f, g, t);
}

/* ========================== HOPPER forward (wgmma) ================================ */
/* The forward of FAST with Hopper's warpgroup products (warpgroup_ptx.cuh)
 * in place of mma.sync: WG warpgroups per block (2 by default, 1 with 64
 * block rows), 64 query rows each; K and V streamed in tiles of BC = 64
 * rows by cp.async into two stages, as above.  Per tile and warpgroup:
 *   S (64 x 64)  = Q Kᵀ   wgmma m64n64k16, Q and K from shared memory (K-major)
 *   softmax       in registers: S's fragments are mma.sync's C layout, so
 *                 the code is FAST's, row for row
 *   O (64 x D)  += P V    wgmma m64nDk16, P from registers (rounded to T),
 *                 V from shared memory as it lies (MN-major: no transpose)
 * Shared tiles are laid out in core matrices (8 rows x 16 bytes, 128
 * contiguous bytes): the 16-byte chunk (row r, columns 8c..8c+7) of an
 * R-row tile at 16 (r % 8) + 128 (r / 8) + c (16 R + 16).  The 16 bytes
 * after each column of core matrices turn the bank group of chunk c of a
 * row by one, so the 8 chunks a quarter-warp copies land in 8 different
 * bank groups; wgmma reads whole core matrices, conflict-free anyway.
 * One descriptor per operand: K-major Q and K have LBO = 16 R + 16 (the
 * next 8 columns) and SBO = 128 (the next 8 rows); V, read MN-major, has
 * LBO = 128 (the next 8 keys) and SBO = 16 BC + 16 (the next 8 columns).
 * Each product waits for its own (no overlap of one warpgroup's softmax
 * with its next product: the two warpgroups of a block, and blocks sharing
 * an SM, interleave instead).  The backward on the same pieces is below. */
template <int R> __host__ __device__ constexpr int cm_stride() { return 16 * R + 16; }

template <int R, int D, int NT>
__device__ __forceinline__ void load_rows_cm(unsigned char *S, const spb_bf16 *g, long base, long stride, int r0,
                                             int len)
{
    constexpr int CHUNKS = D / 8, STEP = NT / CHUNKS; /* as load_rows_async: fixed column, every STEP-th row */
    static_assert(NT % CHUNKS == 0 && R % STEP == 0 && STEP % 8 == 0, "whole passes of whole core matrices");
    const int r = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
    const spb_bf16 *first = g + base + (long)r0 * stride + c * 8, *src = first + (long)r * stride;
    unsigned char *dst = S + 16 * (r % 8) + 128 * (r / 8) + c * cm_stride<R>();
    const long step = (long)STEP * stride;
    for (int i = 0; i < R / STEP; i++) {
        bool in = r0 + r + i * STEP < len;
        spb_cp_async16(dst + 16 * i * STEP, in ? src + i * step : first, in ? 16 : 0);
    }
}

/* KK k16 A fragments (rounded to T) from a 16 KK-column C accumulator */
template <typename T, int KK = 4> __device__ __forceinline__ void c_to_a(uint32_t (*a)[4], const float (*c)[4])
{
    for (int kk = 0; kk < KK; kk++) {
        a[kk][0] = elem<T>::pack2(c[2 * kk][0], c[2 * kk][1]);
        a[kk][1] = elem<T>::pack2(c[2 * kk][2], c[2 * kk][3]);
        a[kk][2] = elem<T>::pack2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
        a[kk][3] = elem<T>::pack2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
    }
}

/* acc (64 x D) += A (64 x R, registers) · M (R rows x D, a core-matrix tile
 * read MN-major), one committed group: acc, a and M stay untouched until a
 * wait covers it */
template <int FP16, int D, int R = BC>
__device__ __forceinline__ void wgmma_a_regs_times_tile_issue(float *acc, const uint32_t (*a)[4],
                                                              const unsigned char *M)
{
    const uint64_t desc = spb_wgmma_desc(M, 128, cm_stride<R>());
    spb_wgmma_fence();
    for (int kk = 0; kk < R / 16; kk++) spb_wgmma_m64nN_rs_mn<FP16, D>(acc, a[kk], spb_wgmma_desc_add(desc, 2 * kk * 128));
    spb_wgmma_commit();
}
/* ... and waited */
template <int FP16, int D, int R = BC>
__device__ __forceinline__ void wgmma_a_regs_times_tile(float *acc, const uint32_t (*a)[4], const unsigned char *M)
{
    wgmma_a_regs_times_tile_issue<FP16, D, R>(acc, a, M);
    spb_wgmma_wait<0>();
}

/* s = A(rows of a) · B(64 rows)ᵀ and t = C · E(64 rows)ᵀ over D, four
 * K-major operands (descriptors at their first rows); one batch, waited */
template <int FP16, int D, int RA>
__device__ __forceinline__ void wgmma_two_rows_rowsT(float s[8][4], float t[8][4], const unsigned char *A,
                                                     const unsigned char *B, const unsigned char *C,
                                                     const unsigned char *E)
{
    for (int nt = 0; nt < 8; nt++)
        for (int e = 0; e < 4; e++) s[nt][e] = t[nt][e] = 0.0f;
    const uint64_t da = spb_wgmma_desc(A, cm_stride<RA>(), 128), db = spb_wgmma_desc(B, cm_stride<BC>(), 128),
                   dc = spb_wgmma_desc(C, cm_stride<RA>(), 128), de = spb_wgmma_desc(E, cm_stride<BC>(), 128);
    spb_wgmma_fence();
    for (int kc = 0; kc < D / 16; kc++) {
        spb_wgmma_m64n64_ss<FP16>(&s[0][0], spb_wgmma_desc_add(da, 2 * kc * cm_stride<RA>()),
                                  spb_wgmma_desc_add(db, 2 * kc * cm_stride<BC>()), kc > 0);
        spb_wgmma_m64n64_ss<FP16>(&t[0][0], spb_wgmma_desc_add(dc, 2 * kc * cm_stride<RA>()),
                                  spb_wgmma_desc_add(de, 2 * kc * cm_stride<BC>()), kc > 0);
    }
    spb_wgmma_commit();
    spb_wgmma_wait<0>();
}

/* MINB as in fwd_fast: 2 (with WG = 2, 64-key tiles) caps the registers at
 * 128 so that two blocks, four warpgroups, share an SM. */
template <typename T, int D, int WG, int KN, int MINB>
__global__ void __launch_bounds__(128 * WG, MINB) fwd_wgmma(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                       const spb_bf16 *v, spb_bf16 *o, float *lse)
{
#ifdef SPB_WGMMA_HERE
    constexpr int RQ = 64 * WG, NT = 128 * WG, FP16 = elem<T>::is_fp16;
    constexpr int QB = D / 8 * cm_stride<RQ>(), KB = D / 8 * cm_stride<KN>();
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char *Qs = smem, *Ks = Qs + QB, *Vs = Ks + 2 * KB; /* K, V: two stages each */
    const int b = blockIdx.z, h = blockIdx.y, i0 = query_tile_first<4 * WG>(d);
    const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r = 64 * wg + 16 * (threadIdx.x / 32 % 4); /* this warp's first row */
    const long qb = b * d.q_batch_stride + (long)h * D, kb = b * d.k_batch_stride + (long)h * D;
    const float c = d.scale * LOG2E;
    const int n_tiles = (keys_for_rows<4 * WG>(d, i0) + KN - 1) / KN;

    load_rows_cm<RQ, D, NT>(Qs, q, qb, d.q_token_stride, i0, d.q_len);
    if (n_tiles > 0) {
        load_rows_cm<KN, D, NT>(Ks, k, kb, d.k_token_stride, 0, d.k_len);
        load_rows_cm<KN, D, NT>(Vs, v, kb, d.k_token_stride, 0, d.k_len);
    }
    spb_cp_async_commit();
    spb_cp_async_wait<0>();
    spb_fence_proxy_async(); /* the copies, before the warpgroups' products read them */
    __syncthreads();
    const uint64_t qdesc = spb_wgmma_desc(Qs + 1024 * wg, cm_stride<RQ>(), 128);

    float oacc[D / 8][4];
    for (int dn = 0; dn < D / 8; dn++) oacc[dn][0] = oacc[dn][1] = oacc[dn][2] = oacc[dn][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const long qpos[2] = {d.q_offset + i0 + r + g, d.q_offset + i0 + r + g + 8};
    const long warp_first_q = d.q_offset + i0 + r, group_last_q = d.q_offset + i0 + 64 * wg + 63;

    for (int it = 0; it < n_tiles; it++) {
        const int j0 = it * KN, st = it & 1;
        __syncthreads(); /* every warpgroup's products on the other stage (tile it - 1) are complete */
        if (it + 1 < n_tiles) {
            load_rows_cm<KN, D, NT>(Ks + (st ^ 1) * KB, k, kb, d.k_token_stride, j0 + KN, d.k_len);
            load_rows_cm<KN, D, NT>(Vs + (st ^ 1) * KB, v, kb, d.k_token_stride, j0 + KN, d.k_len);
        }
        spb_cp_async_commit(); /* possibly empty: one group per tile keeps the count */
        spb_cp_async_wait<1>(); /* tile it has landed, tile it + 1 may still fly */
        spb_fence_proxy_async();
        __syncthreads();
        /* nothing visible to any row of this warpgroup (the whole group issues a wgmma, or none) */
        if (d.causal && d.k_offset + j0 > group_last_q) continue;
        const unsigned char *Kc = Ks + st * KB, *Vc = Vs + st * KB;
        /* S = Q·Kᵀ, 64 keys per product: KN / 64 accumulators of 8 column tiles */
        float s[KN / 8][4];
        for (int nt = 0; nt < KN / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        const uint64_t kdesc = spb_wgmma_desc(Kc, cm_stride<KN>(), 128);
        spb_wgmma_fence();
        for (int kc = 0; kc < D / 16; kc++)
            for (int kh = 0; kh < KN / 64; kh++) /* keys 64 kh.. start 1024 kh bytes on (8 rows of 128) */
                spb_wgmma_m64n64_ss<FP16>(&s[8 * kh][0], spb_wgmma_desc_add(qdesc, 2 * kc * cm_stride<RQ>()),
                                          spb_wgmma_desc_add(kdesc, 1024 * kh + 2 * kc * cm_stride<KN>()), kc > 0);
        spb_wgmma_commit();
        spb_wgmma_wait<0>();
        /* per-element masks only where the tile crosses the sequence's end or the diagonal */
        const bool masked = j0 + KN > d.k_len || (d.causal && d.k_offset + j0 + KN - 1 > warp_first_q);
        online_softmax_tile<D, KN / 8>(s, m, l, oacc, d, j0, masked, qpos, c, t);
        /* P as four k16 A fragments, all rounded before the fence (ordinary
         * code between two wgmmas of a batch would make ptxas add fences) */
        uint32_t pa[KN / 16][4];
        c_to_a<T, KN / 16>(pa, s);
        wgmma_a_regs_times_tile<FP16, D, KN>(&oacc[0][0], pa, Vc);
    }
    store_o_lse<T, D>(d, o, lse, oacc, m, l, b, h, i0 + r, g, t);
#else
    (void)d, (void)q, (void)k, (void)v, (void)o, (void)lse;
    __trap(); /* never launched: spb_cuda_attention_wgmma_available() said no */
#endif
}

/* One iteration of FlashAttention-3's overlap inside a warpgroup
 * (fwd_wgmma_pipe, fwd_wgmma_tma): S_it = Q·K_itᵀ issued with
 * P_{it-1}·V_{it-1} (do_s, do_pv: which of the two this warpgroup has at
 * this iteration), the softmax of S_it between the two waits, then O's
 * rescale and P_it rounded into pa.  Straight-line code for each case and
 * mask (ptxas serialises products in flight across a branch it cannot
 * prove uniform), the mask decided per warpgroup.  Hooks: issued() once
 * the products are issued, s_done() once S_it is complete, pv_done() once
 * P·V is. */
template <typename T, int D, int KN, typename IS, typename IP, typename H0, typename H1, typename H2>
__device__ __forceinline__ void overlapped_tile(bool do_s, bool do_pv, bool masked, float (*s)[4], uint32_t (*pa)[4],
                                                float (*oacc)[4], float m[2], float l[2], volatile float *anchor,
                                                const spb_attn_desc &d, int j0, const long qpos[2], float c, int t,
                                                IS issue_s, IP issue_pv, H0 issued, H1 s_done, H2 pv_done)
{
    auto both = [&](auto masked_tag) {
        float corr[2];
        issue_s();
        issue_pv();
        issued();
        spb_wgmma_wait<1>(); /* S_it done; P_{it-1}·V_{it-1} may still run */
        s_done();
        softmax_stats_body<KN / 8, decltype(masked_tag)::value>(s, m, l, corr, d, j0, qpos, c, t);
        /* The row sums (which need every exponential) to this thread's
         * scratch word before the wait: ptxas keeps a shared store ahead of
         * the wait, and so the softmax between the waits.  Without it ptxas
         * moved the exponentials past the second wait (the SASS showed it),
         * and the overlap with them. */
        anchor[threadIdx.x] = l[0] + l[1];
        spb_wgmma_wait<0>(); /* O and pa are free again */
        pv_done();
        rescale_rows<D>(oacc, corr);
        c_to_a<T, KN / 16>(pa, s);
    };
    if (do_s && do_pv) {
        if (masked)
            both(std::true_type());
        else
            both(std::false_type());
    } else if (do_s) { /* the first tile: nothing to add yet */
        float corr[2];
        issue_s();
        issued();
        spb_wgmma_wait<0>();
        s_done();
        softmax_stats_tile<KN / 8>(s, m, l, corr, d, j0, masked, qpos, c, t);
        rescale_rows<D>(oacc, corr);
        c_to_a<T, KN / 16>(pa, s);
    } else if (do_pv) { /* after the warpgroup's last tile: its P·V */
        issue_pv();
        issued();
        spb_wgmma_wait<0>();
        pv_done();
    } else {
        issued();
    }
}

/* fwd_wgmma with FlashAttention-3's overlap inside a warpgroup
 * (Shah et al. 2024, "intra-warpgroup pipelining"): at tile j the
 * warpgroup issues S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1} together, waits
 * for S_j only, and computes P_j's softmax while the P·V product runs; O's
 * rescale by P_j's correction waits for that product.  So K runs one tile
 * ahead of V: iteration j copies K_{j+1} and V_j, reads K_j and V_{j-1}
 * (two stages each, as in fwd_wgmma), and one more iteration adds the
 * last P·V; after the tiles, a word of shared memory per thread (the
 * softmax's anchor, below).  64-key tiles; WG warpgroups of 64 rows; MINB
 * as in fwd_wgmma (1 only: with 128 registers ptxas spills and serialises
 * the products).
 * A warpgroup past its last visible causal tile issues nothing more (its
 * tiles are a prefix: `mine`). */
template <typename T, int D, int WG, int MINB>
__global__ void __launch_bounds__(128 * WG, MINB) fwd_wgmma_pipe(spb_attn_desc d, const spb_bf16 *q,
                                                                  const spb_bf16 *k, const spb_bf16 *v, spb_bf16 *o,
                                                                  float *lse)
{
#ifdef SPB_WGMMA_HERE
    constexpr int KN = BC, RQ = 64 * WG, NT = 128 * WG, FP16 = elem<T>::is_fp16;
    constexpr int QB = D / 8 * cm_stride<RQ>(), KB = D / 8 * cm_stride<KN>();
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char *Qs = smem, *Ks = Qs + QB, *Vs = Ks + 2 * KB; /* K, V: two stages each */
    volatile float *anchor = (volatile float *)(Vs + 2 * KB);  /* one word per thread (below) */
    const int b = blockIdx.z, h = blockIdx.y, i0 = query_tile_first<4 * WG>(d);
    /* the warpgroup's index through a broadcast, so that the compiler
     * knows every branch on it below is uniform over the warp (products in
     * flight across a branch it cannot prove uniform get serialised) */
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r = 64 * wg + 16 * (threadIdx.x / 32 % 4); /* this warp's first row */
    const long qb = b * d.q_batch_stride + (long)h * D, kb = b * d.k_batch_stride + (long)h * D;
    const float c = d.scale * LOG2E;
    const int n_tiles = (keys_for_rows<4 * WG>(d, i0) + KN - 1) / KN;
    /* the tiles this warpgroup sees: all, or (causal) those starting at or before its last row */
    int mine = n_tiles;
    if (d.causal) {
        const long lim = d.q_offset + i0 + 64 * wg + 63 - d.k_offset;
        mine = lim < 0 ? 0 : (int)min((long)n_tiles, lim / KN + 1);
    }

    load_rows_cm<RQ, D, NT>(Qs, q, qb, d.q_token_stride, i0, d.q_len);
    if (n_tiles > 0) load_rows_cm<KN, D, NT>(Ks, k, kb, d.k_token_stride, 0, d.k_len);
    spb_cp_async_commit();
    const uint64_t qdesc = spb_wgmma_desc(Qs + 1024 * wg, cm_stride<RQ>(), 128);

    float oacc[D / 8][4];
    for (int dn = 0; dn < D / 8; dn++) oacc[dn][0] = oacc[dn][1] = oacc[dn][2] = oacc[dn][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const long qpos[2] = {d.q_offset + i0 + r + g, d.q_offset + i0 + r + g + 8};
    const long group_first_q = d.q_offset + i0 + 64 * wg;
    float s[KN / 8][4];
    uint32_t pa[KN / 16][4]; /* P_{j-1} as A fragments, read by the P·V product in flight */

    for (int it = 0; it <= n_tiles; it++) {
        const int j0 = it * KN;
        /* every warpgroup's products on the stages about to be refilled
         * (K_{it-1}, V_{it-2}) were waited for in the previous iteration */
        __syncthreads();
        if (it + 1 < n_tiles)
            load_rows_cm<KN, D, NT>(Ks + ((it + 1) & 1) * KB, k, kb, d.k_token_stride, j0 + KN, d.k_len);
        if (it < n_tiles) load_rows_cm<KN, D, NT>(Vs + (it & 1) * KB, v, kb, d.k_token_stride, j0, d.k_len);
        spb_cp_async_commit(); /* possibly empty: one group per iteration keeps the count */
        spb_cp_async_wait<1>(); /* K_it and V_{it-1} have landed */
        spb_fence_proxy_async();
        __syncthreads();
        const bool do_s = it < mine, do_pv = it >= 1 && it - 1 < mine; /* uniform over the warpgroup */
        const uint64_t kdesc = spb_wgmma_desc(Ks + (it & 1) * KB, cm_stride<KN>(), 128);
        const unsigned char *Vp = Vs + ((it - 1) & 1) * KB;
        auto issue_s = [&] {
            for (int nt = 0; nt < KN / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            spb_wgmma_fence();
            for (int kc = 0; kc < D / 16; kc++)
                spb_wgmma_m64n64_ss<FP16>(&s[0][0], spb_wgmma_desc_add(qdesc, 2 * kc * cm_stride<RQ>()),
                                          spb_wgmma_desc_add(kdesc, 2 * kc * cm_stride<KN>()), kc > 0);
            spb_wgmma_commit();
        };
        const bool masked = j0 + KN > d.k_len || (d.causal && d.k_offset + j0 + KN - 1 > group_first_q);
        auto none = [] {};
        overlapped_tile<T, D, KN>(
            do_s, do_pv, masked, s, pa, oacc, m, l, anchor, d, j0, qpos, c, t, issue_s,
            [&] { wgmma_a_regs_times_tile_issue<FP16, D, KN>(&oacc[0][0], pa, Vp); }, none, none, none);
    }
    store_o_lse<T, D>(d, o, lse, oacc, m, l, b, h, i0 + r, g, t);
#else
    (void)d, (void)q, (void)k, (void)v, (void)o, (void)lse;
    __trap(); /* never launched: spb_cuda_attention_wgmma_available() said no */
#endif
}

/* FlashAttention-3's forward structure: a producer warp feeds the tiles by
 * the copy engine (TMA) through mbarriers, and two consumer warpgroups of
 * 64 query rows each only compute, so that no consumer instruction works
 * out a copy's address or waits at a block barrier.  Block: warpgroups 0
 * and 1 (the consumers, 128 query rows), warp 8 (the producer: one lane
 * issues every copy).  Shared memory, from a 1024-byte boundary, in
 * wgmma's 128-byte-swizzled layout (tma_ptx.cuh): Q as D/64 halves of 128
 * rows x 128 bytes; K and V, two stages each, as D/64 halves of KN rows x
 * 128 bytes; the barriers; a word per consumer thread (SCHED > 0).
 *   q_full                  Q has landed (one phase)
 *   k_full[s], v_full[s]    stage s's K (V) of the current round has landed
 *   k_empty[s], v_empty[s]  every consumer warp is done with it (8 arrivals)
 * Round r of stage s (tile 2r + s) waits for the phase of parity r & 1; the
 * producer refills a stage after the phase of parity (r & 1) ^ 1 of its
 * empty barrier (the first round passes at once), K one tile ahead of V.
 * A warpgroup whose rows see nothing of a causal tile still waits for its
 * K and V before it arrives on their empty barriers, so that its arrivals
 * stay in that tile's phase.  Rows past the sequence's end arrive as zeros
 * (the tensor map's bounds) and are masked as in fwd_wgmma.
 * SCHED, the consumers' schedule:
 *   0  fwd_wgmma's: S = Q·Kᵀ, wait, softmax, O += P·V, wait;
 *   1  fwd_wgmma_pipe's overlap inside the warpgroup: S_j issued with
 *      P_{j-1}·V_{j-1}, the softmax of S_j while that product runs;
 *   2  1 and FlashAttention-3's ping-pong between the two warpgroups:
 *      each issues its products only in its turn (named barrier 1 + wg,
 *      256 threads) and hands the turn over once they are issued, so that
 *      one warpgroup's softmax runs while the other's products do.  Every
 *      iteration takes a turn, with products or without, and warpgroup 1
 *      gives the first: warpgroup 0 takes one more turn after the loop
 *      (warpgroup 1's last hand-over), so the arrivals balance. */
struct tma_maps {
    CUtensorMap q, k, v;
};
template <int D, int KN> struct tma_fwd_layout {
    static constexpr int QB = D / 64 * 128 * 128, KB = D / 64 * KN * 128; /* bytes of Q, of one stage of K or V */
    static constexpr int BARS = QB + 4 * KB, ANCHOR = BARS + 128;         /* the barriers', the words' offsets */
    static constexpr size_t SMEM = 1024 + ANCHOR + 4 * 256;               /* 1024: the alignment's slack */
};
template <typename T, int D, int KN, int SCHED>
__global__ void __launch_bounds__(384, 1) fwd_wgmma_tma(spb_attn_desc d, const __grid_constant__ tma_maps maps,
                                                        spb_bf16 *o, float *lse)
{
#ifdef SPB_WGMMA_HERE
    typedef tma_fwd_layout<D, KN> L;
    constexpr int FP16 = elem<T>::is_fp16, HALF_Q = 128 * 128, HALF_K = KN * 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (spb_smem_offset(smem_raw) & 1023)) & 1023);
    unsigned char *Qs = smem, *Ks = Qs + L::QB, *Vs = Ks + 2 * L::KB;
    uint64_t *bars = (uint64_t *)(smem + L::BARS), *q_full = bars, *k_full = bars + 1, *v_full = bars + 3,
             *k_empty = bars + 5, *v_empty = bars + 7;
    volatile float *anchor = (volatile float *)(smem + L::ANCHOR); /* fwd_wgmma_pipe's */
    const int b = blockIdx.z, h = blockIdx.y, i0 = query_tile_first<8>(d);
    const int n_tiles = (keys_for_rows<8>(d, i0) + KN - 1) / KN;
    if (threadIdx.x == 0) {
        spb_mbarrier_init(q_full, 1);
        for (int x = 0; x < 2; x++) {
            spb_mbarrier_init(k_full + x, 1), spb_mbarrier_init(v_full + x, 1);
            spb_mbarrier_init(k_empty + x, 8), spb_mbarrier_init(v_empty + x, 8);
        }
        spb_fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x >= 256) { /* the producer warpgroup */
        spb_setmaxnreg<24, false>();
        if (threadIdx.x != 256 || n_tiles == 0) return;
        auto load = [&](unsigned char *S, const CUtensorMap *map, uint64_t *full, uint64_t *empty, int it) {
            const int st = it & 1;
            spb_mbarrier_wait(empty + st, ((it >> 1) & 1) ^ 1);
            spb_mbarrier_arrive_expect_tx(full + st, L::KB);
            for (int x = 0; x < D / 64; x++)
                spb_tma_load_4d(S + st * L::KB + x * HALF_K, map, 64 * x, h, it * KN, b, full + st);
        };
        spb_mbarrier_arrive_expect_tx(q_full, L::QB);
        for (int x = 0; x < D / 64; x++) spb_tma_load_4d(Qs + x * HALF_Q, &maps.q, 64 * x, h, i0, b, q_full);
        load(Ks, &maps.k, k_full, k_empty, 0);
        for (int it = 0; it < n_tiles; it++) {
            if (it + 1 < n_tiles) load(Ks, &maps.k, k_full, k_empty, it + 1);
            load(Vs, &maps.v, v_full, v_empty, it);
        }
        return;
    }
    spb_setmaxnreg<240, true>();
    /* the warpgroup through a broadcast, so that the compiler knows every
     * branch on it is uniform over the warp (fwd_wgmma_pipe) */
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r = 64 * wg + 16 * (threadIdx.x / 32 % 4); /* this warp's first row */
    const float c = d.scale * LOG2E;
    float oacc[D / 8][4];
    for (int dn = 0; dn < D / 8; dn++) oacc[dn][0] = oacc[dn][1] = oacc[dn][2] = oacc[dn][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const long qpos[2] = {d.q_offset + i0 + r + g, d.q_offset + i0 + r + g + 8};
    const long warp_first_q = d.q_offset + i0 + r, group_first_q = d.q_offset + i0 + 64 * wg;
    /* the tiles this warpgroup sees: all, or (causal) those starting at or before its last row */
    int mine = n_tiles;
    if (d.causal) {
        const long lim = group_first_q + 63 - d.k_offset;
        mine = lim < 0 ? 0 : (int)min((long)n_tiles, lim / KN + 1);
    }
    /* S = Q·Kᵀ of tile it: k16 step kc reads 32 bytes into row halves kc / 4 */
    float s[KN / 8][4];
    auto issue_s = [&](int it) {
        for (int nt = 0; nt < KN / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        spb_wgmma_fence();
        for (int kc = 0; kc < D / 16; kc++) {
            const int half = kc / 4, col = 32 * (kc % 4);
            const uint64_t qd = spb_wgmma_desc_sw128(Qs + half * HALF_Q + 8192 * wg + col, 16, 1024);
            for (int kh = 0; kh < KN / 64; kh++)
                spb_wgmma_m64n64_ss<FP16>(
                    &s[8 * kh][0], qd,
                    spb_wgmma_desc_sw128(Ks + (it & 1) * L::KB + half * HALF_K + 8192 * kh + col, 16, 1024), kc > 0);
        }
        spb_wgmma_commit();
    };
    /* O += P·V of tile it: V MN-major, 16 keys (2048 bytes) per k16 step, D's halves HALF_K apart */
    uint32_t pa[KN / 16][4];
    auto issue_pv = [&](int it) {
        spb_wgmma_fence();
        for (int kk = 0; kk < KN / 16; kk++)
            spb_wgmma_m64nN_rs_mn<FP16, D>(&oacc[0][0], pa[kk],
                                           spb_wgmma_desc_sw128(Vs + (it & 1) * L::KB + 2048 * kk, HALF_K, 1024));
        spb_wgmma_commit();
    };
    auto wait_tile = [&](uint64_t *full, int it) { spb_mbarrier_wait(full + (it & 1), (it >> 1) & 1); };
    auto release = [&](uint64_t *empty, int it) {
        if (lane == 0) spb_mbarrier_arrive(empty + (it & 1));
    };
    /* a tile this warpgroup does not see: waited for, released */
    auto pass_tile = [&](int it) {
        wait_tile(k_full, it), release(k_empty, it);
        wait_tile(v_full, it), release(v_empty, it);
    };
    if (n_tiles > 0) spb_mbarrier_wait(q_full, 0);
    if (SCHED == 0) {
        for (int it = 0; it < n_tiles; it++) {
            const int j0 = it * KN;
            if (it >= mine) {
                pass_tile(it);
                continue;
            }
            wait_tile(k_full, it);
            issue_s(it);
            spb_wgmma_wait<0>();
            release(k_empty, it);
            const bool masked = j0 + KN > d.k_len || (d.causal && d.k_offset + j0 + KN - 1 > warp_first_q);
            online_softmax_tile<D, KN / 8>(s, m, l, oacc, d, j0, masked, qpos, c, t);
            c_to_a<T, KN / 16>(pa, s);
            wait_tile(v_full, it);
            issue_pv(it);
            spb_wgmma_wait<0>();
            release(v_empty, it);
        }
    } else {
        constexpr bool PING = SCHED == 2;
        auto hand_over = [&] {
            if (PING) spb_named_barrier<false>(2 - wg, 256);
        };
        if (PING && wg == 1) spb_named_barrier<false>(1, 256); /* warpgroup 0 goes first */
        for (int it = 0; it <= n_tiles; it++) {
            const int j0 = it * KN;
            const bool do_s = it < mine, do_pv = it >= 1 && it - 1 < mine; /* uniform over the warpgroup */
            if (do_s) wait_tile(k_full, it);
            if (do_pv) wait_tile(v_full, it - 1);
            if (PING) spb_named_barrier<true>(1 + wg, 256); /* this warpgroup's turn */
            const bool masked = j0 + KN > d.k_len || (d.causal && d.k_offset + j0 + KN - 1 > group_first_q);
            overlapped_tile<T, D, KN>(
                do_s, do_pv, masked, s, pa, oacc, m, l, anchor, d, j0, qpos, c, t, [&] { issue_s(it); },
                [&] { issue_pv(it - 1); }, hand_over, [&] { release(k_empty, it); },
                [&] { release(v_empty, it - 1); });
            if (it < n_tiles && !do_s) pass_tile(it);
        }
        if (PING && wg == 0) spb_named_barrier<true>(1, 256); /* warpgroup 1's last hand-over */
    }
    store_o_lse<T, D>(d, o, lse, oacc, m, l, b, h, i0 + r, g, t);
#else
    (void)d, (void)maps, (void)o, (void)lse;
    __trap(); /* never launched: spb_cuda_attention_wgmma_available() said no */
#endif
}

/* ========================== HOPPER backward (wgmma) =============================== */
/* dq_fast and dkv_fast (split dQ) on warpgroup products, as fwd_wgmma is
 * fwd_fast: WG warpgroups of 64 resident rows, the other sequence streamed
 * in 64-row tiles, shared tiles in core matrices (cm_stride).  Every
 * product fits the forward's two shapes:
 *   dQ  : S = Q Kᵀ, dP = dO Vᵀ      m64n64k16, both operands K-major in shared memory
 *         dQ += dS K                m64nDk16, dS from registers, K MN-major
 *   dKdV: Sᵀ = K Qᵀ, dPᵀ = V dOᵀ    m64n64k16, both operands K-major in shared memory
 *         dV += Pᵀ dO, dK += dSᵀ Q  m64nDk16, Pᵀ and dSᵀ from registers, dO and Q MN-major
 * The elementwise steps are dq_fast's and dkv_fast's, row for row (the
 * accumulators are mma.sync's C layout).  No fused-dQ variant. */

template <typename T, int D, int WG>
__global__ void __launch_bounds__(128 * WG) dq_wgmma(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                      const spb_bf16 *v, const float *lse, const float *delta,
                                                      const spb_bf16 *dout, float *dq)
{
#ifdef SPB_WGMMA_HERE
    constexpr int RQ = 64 * WG, NT = 128 * WG, FP16 = elem<T>::is_fp16;
    constexpr int QB = D / 8 * cm_stride<RQ>(), KB = D / 8 * cm_stride<BC>();
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char *Qs = smem, *dOs = Qs + QB, *Ks = dOs + QB, *Vs = Ks + 2 * KB;
    const int b = blockIdx.z, h = blockIdx.y, i0 = query_tile_first<4 * WG>(d);
    const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r = 64 * wg + 16 * (threadIdx.x / 32 % 4); /* this warp's first row */
    const long qb = b * d.q_batch_stride + (long)h * D, kb = b * d.k_batch_stride + (long)h * D,
               ob = b * d.o_batch_stride + (long)h * D;
    const float c = d.scale * LOG2E;
    const int n_tiles = (keys_for_rows<4 * WG>(d, i0) + BC - 1) / BC;
    load_rows_cm<RQ, D, NT>(Qs, q, qb, d.q_token_stride, i0, d.q_len);
    load_rows_cm<RQ, D, NT>(dOs, dout, ob, d.o_token_stride, i0, d.q_len);
    if (n_tiles > 0) {
        load_rows_cm<BC, D, NT>(Ks, k, kb, d.k_token_stride, 0, d.k_len);
        load_rows_cm<BC, D, NT>(Vs, v, kb, d.k_token_stride, 0, d.k_len);
    }
    spb_cp_async_commit();
    float L2[2], Dl[2];
    long qpos[2];
    query_row_stats(d, lse, delta, b, h, i0 + r, g, L2, Dl, qpos);
    const long warp_first_q = d.q_offset + i0 + r, group_last_q = d.q_offset + i0 + 64 * wg + 63;
    float acc[D / 8][4];
    for (int dn = 0; dn < D / 8; dn++) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
    spb_cp_async_wait<0>();
    for (int it = 0; it < n_tiles; it++) {
        const int j0 = it * BC, st = it & 1;
        __syncthreads(); /* the other stage is free: every warpgroup waited for its products */
        if (it + 1 < n_tiles) {
            load_rows_cm<BC, D, NT>(Ks + (st ^ 1) * KB, k, kb, d.k_token_stride, j0 + BC, d.k_len);
            load_rows_cm<BC, D, NT>(Vs + (st ^ 1) * KB, v, kb, d.k_token_stride, j0 + BC, d.k_len);
        }
        spb_cp_async_commit();
        spb_cp_async_wait<1>();
        spb_fence_proxy_async();
        __syncthreads();
        if (d.causal && d.k_offset + j0 > group_last_q) continue; /* the whole warpgroup, or none of it */
        const unsigned char *Kc = Ks + st * KB, *Vc = Vs + st * KB;
        float s[8][4], dp[8][4];
        wgmma_two_rows_rowsT<FP16, D, RQ>(s, dp, Qs + 1024 * wg, Kc, dOs + 1024 * wg, Vc);
        const bool masked = j0 + BC > d.k_len || (d.causal && d.k_offset + j0 + BC - 1 > warp_first_q);
        ds_of_rows(s, dp, d, j0, masked, qpos, L2, Dl, c, t); /* s: dS */
        uint32_t a[4][4];
        c_to_a<T>(a, s);
        wgmma_a_regs_times_tile<FP16, D>(&acc[0][0], a, Kc);
    }
    add_rows<D>(dq + qb, d.q_token_stride, i0 + r, d.q_len, acc, d.scale, g, t);
#else
    (void)d, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)dout, (void)dq;
    __trap(); /* never launched: spb_cuda_attention_wgmma_available() said no */
#endif
}

/* dkv_wgmma's dQ (DQ): 0, none (dq_wgmma computes it: the split
 * backward), or, with WG = 2, the backward in one kernel as
 * FlashAttention-3 computes it (without its producer warp): 1, dQ added by
 * 8-byte reductions from registers; 2, through a staged fp32 tile and the
 * copy engine, a row per reduction, which warp 0 issues at the next tile's
 * first barrier (dq_stage_issue).  With dQ, each warpgroup also writes its
 * dSᵀ, rounded to T, into shared memory as dS (a K-major tile of 64
 * queries x 128 keys); after a block barrier warpgroup w computes dQ's
 * columns [w D/2, (w + 1) D/2) of the tile over all 128 keys:
 *   dQ (64 x D/2) = dS · K    wgmma m64n{32,64}k16, dS K-major, K MN-major
 * (K read in place, as V in the forward's P·V), issued behind dV and dK,
 * one wait for the three.  5 products per visible pair where dq_wgmma +
 * dkv_wgmma compute 7; dQ's last bits vary from run to run (the order in
 * which the key blocks add). */
enum wgmma_dq { WGMMA_DQ_SPLIT, WGMMA_DQ_REDUCE, WGMMA_DQ_BULK };

template <typename T, int D, int WG, int DQ>
__global__ void __launch_bounds__(128 * WG) dkv_wgmma(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                       const spb_bf16 *v, const float *lse, const float *delta,
                                                       const spb_bf16 *dout, float *dk, float *dv, float *dq)
{
#ifdef SPB_WGMMA_HERE
    static_assert(DQ == WGMMA_DQ_SPLIT || WG == 2, "dQ in the dK/dV kernel: two warpgroups, 128 keys");
    constexpr int RK = 64 * WG, NT = 128 * WG, FP16 = elem<T>::is_fp16, NQ = D / 16; /* dQ: n-tiles of D/2 */
    constexpr int KB = D / 8 * cm_stride<RK>(), QB = D / 8 * cm_stride<BC>(), SB = RK / 8 * cm_stride<BC>();
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char *Ks = smem, *Vs = Ks + KB, *Qs = Vs + KB, *dOs = Qs + 2 * QB;
    float *Ls = (float *)(dOs + 2 * QB), *Ds = Ls + 2 * BC; /* two stages each */
    unsigned char *dSs = (unsigned char *)(Ds + 2 * BC);     /* DQ: the tile's dS */
    float *Qd = (float *)(dSs + SB);                         /* DQ_BULK: the tile's dQ (dq_stage_ld) */
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * RK;
    const int wg = threadIdx.x / 128, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    /* this warp's first key row; in the dQ step its first query row is 16 (warp % 4) */
    const int r = 64 * wg + 16 * (warp % 4);
    const long qb = b * d.q_batch_stride + (long)h * D, kb = b * d.k_batch_stride + (long)h * D,
               ob = b * d.o_batch_stride + (long)h * D, rows_base = ((long)b * d.heads + h) * d.q_len;
    const float c = d.scale * LOG2E;
    const long kpos[2] = {d.k_offset + j0 + r + g, d.k_offset + j0 + r + g + 8};
    const bool kin[2] = {j0 + r + g < d.k_len, j0 + r + g + 8 < d.k_len};
    const long warp_first_k = d.k_offset + j0 + r, group_first_k = d.k_offset + j0 + 64 * wg;
    const int i_start = first_query_tile<BC>(d, j0);
    const int n_tiles = (d.q_len - i_start + BC - 1) / BC;

    load_rows_cm<RK, D, NT>(Ks, k, kb, d.k_token_stride, j0, d.k_len);
    load_rows_cm<RK, D, NT>(Vs, v, kb, d.k_token_stride, j0, d.k_len);
    if (n_tiles > 0) {
        load_rows_cm<BC, D, NT>(Qs, q, qb, d.q_token_stride, i_start, d.q_len);
        load_rows_cm<BC, D, NT>(dOs, dout, ob, d.o_token_stride, i_start, d.q_len);
        load_row_stats<4 * WG>(Ls, Ds, d, lse, delta, rows_base, i_start, threadIdx.x);
    }
    spb_cp_async_commit();
    float dka[D / 8][4], dva[D / 8][4];
    for (int dn = 0; dn < D / 8; dn++)
        for (int e = 0; e < 4; e++) dka[dn][e] = dva[dn][e] = 0.0f;
    /* DQ: dS's chunk of 8 keys that holds this thread's key r + g, at its row g */
    unsigned char *ds_col = dSs + (r / 8) * cm_stride<BC>() + 2 * g;
    const uint64_t ds_desc = spb_wgmma_desc(dSs, cm_stride<BC>(), 128),
                   kq_desc = spb_wgmma_desc(Ks + wg * (D / 16) * cm_stride<RK>(), 128, cm_stride<RK>());
    spb_cp_async_wait<0>();
    for (int it = 0; it < n_tiles; it++) {
        const int i0 = i_start + it * BC, st = it & 1;
        /* the other stage (and dS) is free: every warpgroup waited for its products; DQ_BULK: the last tile's
         * dQ is staged */
        __syncthreads();
        if (DQ == WGMMA_DQ_BULK && it > 0 && warp == 0) dq_stage_issue<D>(d, dq, qb, i0 - BC, Qd, lane);
        if (it + 1 < n_tiles) {
            load_rows_cm<BC, D, NT>(Qs + (st ^ 1) * QB, q, qb, d.q_token_stride, i0 + BC, d.q_len);
            load_rows_cm<BC, D, NT>(dOs + (st ^ 1) * QB, dout, ob, d.o_token_stride, i0 + BC, d.q_len);
            load_row_stats<4 * WG>(Ls + (st ^ 1) * BC, Ds + (st ^ 1) * BC, d, lse, delta, rows_base, i0 + BC,
                                      threadIdx.x);
        }
        spb_cp_async_commit();
        spb_cp_async_wait<1>();
        spb_fence_proxy_async();
        __syncthreads();
        /* no query here sees these keys; with dQ every warpgroup takes part (the mask zeroes its P and dS) */
        if (!DQ && d.causal && d.q_offset + i0 + BC - 1 < group_first_k) continue;
        const unsigned char *Qc = Qs + st * QB, *dOc = dOs + st * QB;
        const float *Lc = Ls + st * BC, *Dc = Ds + st * BC;
        float s[8][4], dp[8][4]; /* transposed: rows = this warp's 16 keys, columns = 64 queries */
        wgmma_two_rows_rowsT<FP16, D, RK>(s, dp, Ks + 1024 * wg, Qc, Vs + 1024 * wg, dOc);
        const bool masked = !kin[1] || i0 + BC > d.q_len || (d.causal && d.q_offset + i0 < warp_first_k + 15);
        pt_dst_of_keys(s, dp, d, i0, masked, kpos, kin, Lc, Dc, c, t); /* s: Pᵀ, dp: dSᵀ */
        if (!DQ) {
            uint32_t a[4][4];
            c_to_a<T>(a, s);
            wgmma_a_regs_times_tile<FP16, D>(&dva[0][0], a, dOc);
            c_to_a<T>(a, dp);
            wgmma_a_regs_times_tile<FP16, D>(&dka[0][0], a, Qc);
            continue;
        }
        uint32_t ap[4][4], ads[4][4];
        c_to_a<T>(ap, s);
        wgmma_a_regs_times_tile_issue<FP16, D>(&dva[0][0], ap, dOc);
        c_to_a<T>(ads, dp);
        wgmma_a_regs_times_tile_issue<FP16, D>(&dka[0][0], ads, Qc);
        /* dS (query m, key k) at 16 (m % 8) + 128 (m / 8) + cm_stride (k / 8) + 2 (k % 8): this thread's
         * (m, k) pairs are (8 nt + 2 t + (e & 1), r + g + 8 (e / 2)), the values of ads */
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                const int m = 8 * nt + 2 * t + (e & 1);
                *(T *)(ds_col + (e >> 1) * cm_stride<BC>() + 16 * (m % 8) + 128 * (m / 8)) =
                    elem<T>::from_f(dp[nt][e]);
            }
        spb_fence_proxy_async(); /* dS, for the other warpgroup's wgmma too */
        /* DQ_BULK: the engine has read the last tile's dQ before anyone writes this one's */
        if (DQ == WGMMA_DQ_BULK && warp == 0) spb_bulk_wait_read<0>();
        __syncthreads(); /* dS is whole */
        float qa[NQ][4];
        spb_wgmma_fence();
        for (int kk = 0; kk < RK / 16; kk++)
            spb_wgmma_m64nN_ss_mn<FP16, D / 2>(&qa[0][0], spb_wgmma_desc_add(ds_desc, 2 * kk * cm_stride<BC>()),
                                               spb_wgmma_desc_add(kq_desc, 2 * kk * 128), kk > 0);
        spb_wgmma_commit();
        spb_wgmma_wait<0>(); /* dV, dK and dQ */
        write_dq_share<D, NQ, 1, DQ == WGMMA_DQ_BULK>(d, dq, qb, i0, Qd, 16 * (warp % 4), wg * (D / 2), &qa, g, t);
    }
    if (DQ == WGMMA_DQ_BULK && n_tiles > 0)
        dq_stage_flush_last<D>(d, dq, qb, i_start + (n_tiles - 1) * BC, Qd, warp, lane);
    add_rows<D>(dk + kb, d.k_token_stride, j0 + r, d.k_len, dka, d.scale, g, t);
    add_rows<D>(dv + kb, d.k_token_stride, j0 + r, d.k_len, dva, 1.0f, g, t);
#else
    (void)d, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)dout, (void)dk, (void)dv, (void)dq;
    __trap(); /* never launched: spb_cuda_attention_wgmma_available() said no */
#endif
}

/* dkv_wgmma's fused backward (DQ: WGMMA_DQ_REDUCE or WGMMA_DQ_BULK) fed
 * as FlashAttention-3 feeds its backward: 384 threads, two consumer
 * warpgroups of 64 keys each (threads 0-255) and a producer warpgroup.
 *   - Warp 8 copies K and V of the block's 128 keys once, then per tile Q
 *     and dO (64 rows) by the copy engine (128-byte-swizzled boxes of 64
 *     columns, rows past the sequence's end as zeros) into two stages, and
 *     its 32 lanes load the tile's lse and D into the stage with ordinary
 *     loads; the stage's "full" mbarrier expects the copies' bytes and 33
 *     arrivals (the copy's lane and every lane after its statistics).
 *   - The consumers wait for a stage's "full" phase and release it on its
 *     "empty" one (a lane of each of the 8 warps, after the wait that
 *     covers the stage's last product): no block barrier in the loop.  The
 *     products are dkv_wgmma's, on the swizzled tiles: Sᵀ = K·Qᵀ and
 *     dPᵀ = V·dOᵀ (both operands K-major), dV += Pᵀ·dO and dK += dSᵀ·Q (dO
 *     and Q read MN-major where they landed), dQ = dS·K (K MN-major).  The
 *     two warpgroups meet once per tile, at a named barrier (id 1, 256
 *     threads) after both wrote their half of dS; dS has two buffers, so a
 *     warpgroup that runs ahead writes the other one (it cannot reach the
 *     first again before the slower one passed the next barrier, after its
 *     dQ product was waited for).
 *   - SCHED, the consumers' order of products: 1, the fused kernel's (Sᵀ
 *     and dPᵀ as one batch, waited; then dV and dK); 2, FlashAttention-3's
 *     overlap inside the warpgroup: Sᵀ and dPᵀ committed as two groups,
 *     Pᵀ's exponentials computed once Sᵀ is in (wait_group 1) while dPᵀ
 *     runs, dV += Pᵀ·dO issued, dSᵀ computed once dPᵀ is in (wait_group 1
 *     again) while dV runs, then dK += dSᵀ·Q.
 *   - DQ_BULK: warp 9 hands the staged fp32 dQ tile to the copy engine
 *     (dq_stage_issue) once the 256 consumer threads arrived on "dq full"
 *     (each after its share and its proxy fence), waits for the engine's
 *     read and arrives on "dq empty" (32 lanes), which the consumers wait
 *     for before they stage the next tile.  So the consumers never wait
 *     for the engine's read at a barrier of their own, as dkv_wgmma's warp
 *     0 does.
 * At head dim 64 warpgroup w's dQ columns [32 w, 32 w + 32) start 64 bytes
 * into K's swizzled 128-byte rows (the swizzle applies to the address). */
struct tma_bwd_maps {
    CUtensorMap q, k, v, dout;
};
template <int D, int DQ> struct tma_bwd_layout {
    static constexpr int KB = D / 64 * 128 * 128, QB = D / 64 * 64 * 128; /* K or V; one stage of Q or dO */
    static constexpr int SB = 16 * cm_stride<BC>();                       /* one buffer of dS (128 keys) */
    static constexpr int V = KB, Q = 2 * KB, DO = Q + 2 * QB, L = DO + 2 * QB, DS = L + 4 * BC * 4, QD = DS + 2 * SB;
    static constexpr int BARS = QD + (DQ == WGMMA_DQ_BULK ? BC * dq_stage_ld<D>() * 4 : 0);
    static constexpr size_t SMEM = 1024 + BARS + 64; /* 1024: the alignment's slack */
};
template <typename T, int D, int DQ, int SCHED>
__global__ void __launch_bounds__(384, 1) dkv_wgmma_tma(spb_attn_desc d, const __grid_constant__ tma_bwd_maps maps,
                                                        const float *lse, const float *delta, float *dk, float *dv,
                                                        float *dq)
{
#ifdef SPB_WGMMA_HERE
    static_assert(DQ == WGMMA_DQ_REDUCE || DQ == WGMMA_DQ_BULK, "the fused backward's two dQ paths");
    typedef tma_bwd_layout<D, DQ> L;
    constexpr int FP16 = elem<T>::is_fp16, NQ = D / 16, HALF_K = 128 * 128, HALF_Q = 64 * 128;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024 - (spb_smem_offset(smem_raw) & 1023)) & 1023);
    unsigned char *Ks = smem, *Vs = smem + L::V, *Qs = smem + L::Q, *dOs = smem + L::DO, *dSs = smem + L::DS;
    float *Ls = (float *)(smem + L::L), *Ds = Ls + 2 * BC, *Qd = (float *)(smem + L::QD);
    uint64_t *bars = (uint64_t *)(smem + L::BARS), *kv_full = bars, *q_full = bars + 1, *q_empty = bars + 3,
             *dq_full = bars + 5, *dq_empty = bars + 6;
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * 128;
    const long qb = b * d.q_batch_stride + (long)h * D, rows_base = ((long)b * d.heads + h) * d.q_len;
    const int i_start = first_query_tile<BC>(d, j0);
    const int n_tiles = (d.q_len - i_start + BC - 1) / BC;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        spb_mbarrier_init(kv_full, 1);
        for (int x = 0; x < 2; x++) spb_mbarrier_init(q_full + x, 33), spb_mbarrier_init(q_empty + x, 8);
        spb_mbarrier_init(dq_full, 256), spb_mbarrier_init(dq_empty, 32);
        spb_fence_mbarrier_init();
    }
    __syncthreads();
    if (warp >= 8) { /* the producer warpgroup */
        spb_setmaxnreg<24, false>();
        if (warp == 8 && n_tiles > 0) {
            if (lane == 0) {
                spb_mbarrier_arrive_expect_tx(kv_full, 2 * L::KB);
                for (int x = 0; x < D / 64; x++) {
                    spb_tma_load_4d(Ks + x * HALF_K, &maps.k, 64 * x, h, j0, b, kv_full);
                    spb_tma_load_4d(Vs + x * HALF_K, &maps.v, 64 * x, h, j0, b, kv_full);
                }
            }
            for (int it = 0; it < n_tiles; it++) {
                const int st = it & 1, i0 = i_start + it * BC;
                spb_mbarrier_wait(q_empty + st, ((it >> 1) & 1) ^ 1);
                if (lane == 0) {
                    spb_mbarrier_arrive_expect_tx(q_full + st, 2 * L::QB);
                    for (int x = 0; x < D / 64; x++) {
                        spb_tma_load_4d(Qs + st * L::QB + x * HALF_Q, &maps.q, 64 * x, h, i0, b, q_full + st);
                        spb_tma_load_4d(dOs + st * L::QB + x * HALF_Q, &maps.dout, 64 * x, h, i0, b, q_full + st);
                    }
                }
                load_row_stats<1>(Ls + st * BC, Ds + st * BC, d, lse, delta, rows_base, i0, lane);
                spb_mbarrier_arrive(q_full + st);
            }
        } else if (DQ == WGMMA_DQ_BULK && warp == 9) {
            for (int it = 0; it < n_tiles; it++) {
                spb_mbarrier_wait(dq_full, it & 1);
                dq_stage_issue<D>(d, dq, qb, i_start + it * BC, Qd, lane);
                spb_bulk_wait_read<0>();
                spb_mbarrier_arrive(dq_empty);
            }
            spb_bulk_wait<0>(); /* the last reductions are done before the block ends */
        }
        return;
    }
    spb_setmaxnreg<240, true>();
    const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); /* uniform, as in fwd_wgmma_tma */
    const int g = lane / 4, t = lane % 4;
    const int r = 64 * wg + 16 * (warp % 4); /* this warp's first key row; in the dQ step its first query row */
    const long kb = b * d.k_batch_stride + (long)h * D;
    const float c = d.scale * LOG2E;
    const long kpos[2] = {d.k_offset + j0 + r + g, d.k_offset + j0 + r + g + 8};
    const bool kin[2] = {j0 + r + g < d.k_len, j0 + r + g + 8 < d.k_len};
    const long warp_first_k = d.k_offset + j0 + r;
    float dka[D / 8][4], dva[D / 8][4];
    for (int dn = 0; dn < D / 8; dn++)
        for (int e = 0; e < 4; e++) dka[dn][e] = dva[dn][e] = 0.0f;
    /* K's columns of this warpgroup's dQ, MN-major: a box each at head dim 128, half a row at 64 */
    const unsigned char *k_cols = Ks + (D == 128 ? wg * HALF_K : 64 * wg);
    if (n_tiles > 0) spb_mbarrier_wait(kv_full, 0);
    for (int it = 0; it < n_tiles; it++) {
        const int i0 = i_start + it * BC, st = it & 1;
        unsigned char *dSb = dSs + st * L::SB;
        const unsigned char *Qc = Qs + st * L::QB, *dOc = dOs + st * L::QB;
        spb_mbarrier_wait(q_full + st, (it >> 1) & 1);
        /* Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ: rows = this warp's 16 keys, columns = the tile's 64 queries */
        float s[8][4], dp[8][4];
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
        /* the k16 step kc of Sᵀ (or, with V and dO, dPᵀ): K-major rows of 128 bytes, 32 bytes a step */
        auto rows_t = [&](float *acc, const unsigned char *A, const unsigned char *B, int kc) {
            const int half = kc / 4, col = 32 * (kc % 4);
            spb_wgmma_m64n64_ss<FP16>(acc, spb_wgmma_desc_sw128(A + half * HALF_K + 8192 * wg + col, 16, 1024),
                                      spb_wgmma_desc_sw128(B + half * HALF_Q + col, 16, 1024), kc > 0);
        };
        /* acc += A (registers) · M, M read MN-major: 16 queries (2048 bytes) per k16 step, D's boxes HALF_Q apart */
        auto times_rows = [&](float *acc, const uint32_t (*a)[4], const unsigned char *M) {
            for (int kk = 0; kk < 4; kk++)
                spb_wgmma_m64nN_rs_mn<FP16, D>(acc, a[kk], spb_wgmma_desc_sw128(M + 2048 * kk, HALF_Q, 1024));
        };
        const bool masked = !kin[1] || i0 + BC > d.q_len || (d.causal && d.q_offset + i0 < warp_first_k + 15);
        const float *Lc = Ls + st * BC, *Dc = Ds + st * BC;
        uint32_t ap[4][4], ads[4][4];
        spb_wgmma_fence();
        if (SCHED == 1) { /* one batch; then dV and dK as the other */
            for (int kc = 0; kc < D / 16; kc++) rows_t(&s[0][0], Ks, Qc, kc), rows_t(&dp[0][0], Vs, dOc, kc);
            spb_wgmma_commit();
            spb_wgmma_wait<0>();
            pt_dst_of_keys(s, dp, d, i0, masked, kpos, kin, Lc, Dc, c, t); /* s: Pᵀ, dp: dSᵀ */
            c_to_a<T>(ap, s);
            c_to_a<T>(ads, dp);
            spb_wgmma_fence();
            times_rows(&dva[0][0], ap, dOc);
            times_rows(&dka[0][0], ads, Qc);
            spb_wgmma_commit();
        } else { /* Sᵀ, then dPᵀ; Pᵀ while dPᵀ runs, dSᵀ while dV += Pᵀ·dO runs */
            for (int kc = 0; kc < D / 16; kc++) rows_t(&s[0][0], Ks, Qc, kc);
            spb_wgmma_commit();
            for (int kc = 0; kc < D / 16; kc++) rows_t(&dp[0][0], Vs, dOc, kc);
            spb_wgmma_commit();
            spb_wgmma_wait<1>(); /* Sᵀ */
            if (masked)
                pt_of_keys_body<true>(s, d, i0, kpos, kin, Lc, c, t);
            else
                pt_of_keys_body<false>(s, d, i0, kpos, kin, Lc, c, t);
            c_to_a<T>(ap, s);
            spb_wgmma_fence();
            times_rows(&dva[0][0], ap, dOc);
            spb_wgmma_commit();
            spb_wgmma_wait<1>(); /* dPᵀ */
            dst_of_keys(s, dp, Dc, t);
            c_to_a<T>(ads, dp);
            spb_wgmma_fence();
            times_rows(&dka[0][0], ads, Qc);
            spb_wgmma_commit();
        }
        /* dS into its buffer as dkv_wgmma writes it (K-major, core matrices) */
        unsigned char *ds_col = dSb + (r / 8) * cm_stride<BC>() + 2 * g;
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                const int m = 8 * nt + 2 * t + (e & 1);
                *(T *)(ds_col + (e >> 1) * cm_stride<BC>() + 16 * (m % 8) + 128 * (m / 8)) =
                    elem<T>::from_f(dp[nt][e]);
            }
        spb_fence_proxy_async();        /* dS, for the other warpgroup's wgmma too */
        spb_named_barrier<true>(1, 256); /* dS is whole */
        /* dQ (64 queries x D/2) = dS · K over the 128 keys, K MN-major: 16 keys (2048 bytes) per k16 step */
        float qa[NQ][4];
        const uint64_t ds_desc = spb_wgmma_desc(dSb, cm_stride<BC>(), 128);
        spb_wgmma_fence();
        for (int kk = 0; kk < 8; kk++)
            spb_wgmma_m64nN_ss_mn<FP16, D / 2>(&qa[0][0], spb_wgmma_desc_add(ds_desc, 2 * kk * cm_stride<BC>()),
                                               spb_wgmma_desc_sw128(k_cols + 2048 * kk, HALF_K, 1024), kk > 0);
        spb_wgmma_commit();
        spb_wgmma_wait<0>(); /* dV, dK and dQ: the stage is read */
        if (lane == 0) spb_mbarrier_arrive(q_empty + st);
        if (DQ == WGMMA_DQ_BULK && it > 0) spb_mbarrier_wait(dq_empty, (it - 1) & 1); /* the last tile was read */
        write_dq_share<D, NQ, 1, DQ == WGMMA_DQ_BULK>(d, dq, qb, i0, Qd, 16 * (warp % 4), wg * (D / 2), &qa, g, t);
        if (DQ == WGMMA_DQ_BULK) spb_mbarrier_arrive(dq_full);
    }
    add_rows<D>(dk + kb, d.k_token_stride, j0 + r, d.k_len, dka, d.scale, g, t);
    add_rows<D>(dv + kb, d.k_token_stride, j0 + r, d.k_len, dva, 1.0f, g, t);
#else
    (void)d, (void)maps, (void)lse, (void)delta, (void)dk, (void)dv, (void)dq;
    __trap(); /* never launched: spb_cuda_attention_wgmma_available() said no */
#endif
}

/* 1 where this compilation of the device code has wgmma (sm_90a, or the emulation) */
__global__ void wgmma_probe(int *out)
{
#ifdef SPB_WGMMA_HERE
    *out = 1;
#else
    *out = 0;
#endif
}

/* ========================== launchers ============================================= */
/* Rows per block of the fast kernels (16 per warp): 128 unless a caller
 * asks for 64 (spb_cuda_attention_set_block_rows). */
static int fast_block_rows = 128;

extern "C" int spb_cuda_attention_set_block_rows(int rows)
{
    if (rows != 64 && rows != 128) SPB_DIE("CUDA attention: %d rows per block (64 or 128)", rows);
    int old = fast_block_rows;
    fast_block_rows = rows;
    return old;
}

/* dQ from the dK/dV kernel with atomics (dkv_fast's FUSED) instead of
 * dq_fast's own pass: off unless a caller asks (it makes dQ's last bits
 * vary from run to run). */
static bool fast_fused_dq = false;

extern "C" int spb_cuda_attention_set_fused_dq(int on)
{
    int old = fast_fused_dq;
    fast_fused_dq = on != 0;
    return old;
}

/* The FAST forward on Hopper's wgmma (fwd_wgmma) instead of mma.sync: off
 * unless a caller asks, and only where spb_cuda_attention_wgmma_available. */
static bool fast_fwd_wgmma = false;

extern "C" int spb_cuda_attention_wgmma_available(void)
{
    static int known = -1;
    if (known < 0) {
        /* sm_90a code runs on 9.0 only; the probe says whether the build has it */
        int dev = 0;
        cudaDeviceProp p;
        SPB_CUDA_CHECK(cudaGetDevice(&dev));
        SPB_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
        if (p.major != 9 || p.minor != 0) return known = 0;
        int *flag = (int *)spb_cuda_alloc(SPB_MEM_WORKSPACE, sizeof(int)), h = 0;
        wgmma_probe<<<1, 1>>>(flag);
        SPB_CUDA_CHECK(cudaGetLastError());
        SPB_CUDA_CHECK(cudaMemcpy(&h, flag, sizeof h, cudaMemcpyDeviceToHost));
        spb_cuda_free(flag);
        known = h;
    }
    return known;
}

/* The FAST backward on wgmma (dq_wgmma and dkv_wgmma; with the fused dQ
 * switch, dkv_wgmma with dQ in it) instead of mma.sync: off unless a caller asks. */
static bool fast_bwd_wgmma = false;

/* sets one of the two switches; the previous setting */
static int set_wgmma(bool *flag, int on, const char *pass)
{
    if (on && !spb_cuda_attention_wgmma_available())
        SPB_DIE("CUDA attention: the wgmma %s needs a GPU of compute capability 9.0 (H100/H200) and a build with "
                "sm_90a code (CMAKE_CUDA_ARCHITECTURES with 90a, the default); this one has neither or not both",
                pass);
    int old = *flag;
    *flag = on != 0;
    return old;
}
extern "C" int spb_cuda_attention_set_fwd_wgmma(int on) { return set_wgmma(&fast_fwd_wgmma, on, "forward"); }

/* Keys per streamed tile of the wgmma forward: 64 (the default, as every
 * other fast kernel) or 128 (S as two 64-key products per k-step, half the
 * block barriers, softmax reductions and O rescales per key; 165 KB of
 * shared memory at head dim 128 and 128 rows). */
static int fast_fwd_keys = BC;
extern "C" int spb_cuda_attention_set_fwd_key_block(int keys)
{
    if (keys != 64 && keys != 128) SPB_DIE("CUDA attention: %d keys per tile of the wgmma forward (64 or 128)", keys);
    int old = fast_fwd_keys;
    fast_fwd_keys = keys;
    return old;
}
extern "C" int spb_cuda_attention_set_bwd_wgmma(int on) { return set_wgmma(&fast_bwd_wgmma, on, "backward"); }

/* Blocks per SM the fast forward is compiled for (MINB of fwd_fast and
 * fwd_wgmma): 1 (the default) or 2, which needs 128-row blocks and, on
 * wgmma, 64-key tiles (two blocks of the other shapes do not fit in shared
 * memory, or fit already). */
static int fast_fwd_blocks = 1;
extern "C" int spb_cuda_attention_set_fwd_blocks_per_sm(int blocks)
{
    if (blocks != 1 && blocks != 2) SPB_DIE("CUDA attention: %d blocks per SM for the forward (1 or 2)", blocks);
    int old = fast_fwd_blocks;
    fast_fwd_blocks = blocks;
    return old;
}
/* The wgmma forward with FlashAttention-3's overlap of the softmax and
 * the P·V product (fwd_wgmma_pipe): off unless a caller asks; 64-key
 * tiles, one block per SM. */
static bool fast_fwd_pipe = false;
extern "C" int spb_cuda_attention_set_fwd_pipelined(int on)
{
    int old = fast_fwd_pipe;
    fast_fwd_pipe = on != 0;
    return old;
}
/* The wgmma forward fed by a producer warp through the copy engine
 * (fwd_wgmma_tma): 0 (off, the default), 1 (its consumers on fwd_wgmma's
 * schedule), 2 (with the overlap inside the warpgroup) or 3 (and the
 * ping-pong between the two); only where spb_cuda_attention_wgmma_available
 * (the tensor copies are sm_90's); 128-row blocks, one per SM, 64- or
 * 128-key tiles (the key-block switch). */
static int fast_fwd_tma = 0;
extern "C" int spb_cuda_attention_set_fwd_tma(int schedule)
{
    if (schedule < 0 || schedule > 3)
        SPB_DIE("CUDA attention: TMA forward schedule %d (0 off, 1 plain, 2 pipelined, 3 pipelined and ping-pong)",
                schedule);
    if (schedule && !spb_cuda_attention_wgmma_available())
        SPB_DIE("CUDA attention: the TMA forward needs a GPU of compute capability 9.0 (H100/H200) and a build with "
                "sm_90a code; this one has neither or not both");
    int old = fast_fwd_tma;
    fast_fwd_tma = schedule;
    return old;
}
/* Rows per warp of the mma.sync forward: 16 (the default) or 32
 * (FlashAttention-2's tiling: 4 warps of 32 rows, 128-row blocks, two
 * blocks per SM by its launch bounds). */
static int fast_fwd_rows_per_warp = 16;
extern "C" int spb_cuda_attention_set_fwd_rows_per_warp(int rows)
{
    if (rows != 16 && rows != 32) SPB_DIE("CUDA attention: %d rows per warp for the forward (16 or 32)", rows);
    int old = fast_fwd_rows_per_warp;
    fast_fwd_rows_per_warp = rows;
    return old;
}

/* The mma.sync backward on FlashAttention-2's tiling (dkvq_exchange: 128
 * keys per block, P and dS through shared memory, dQ by reductions) instead of
 * dq_fast + dkv_fast: off unless a caller asks. */
static bool fast_bwd_exchange = false;
extern "C" int spb_cuda_attention_set_bwd_exchange(int on)
{
    int old = fast_bwd_exchange;
    fast_bwd_exchange = on != 0;
    return old;
}
/* The fused dQ of the exchange or the wgmma backward added a row at a time
 * by the copy engine from a tile staged in shared memory
 * (cp.reduce.async.bulk, sm_90) instead of 8-byte reductions from
 * registers: off unless a caller asks, and only where
 * spb_cuda_attention_wgmma_available (the same build and GPU). */
static bool fast_bwd_dq_bulk = false;
extern "C" int spb_cuda_attention_set_bwd_dq_bulk(int on)
{
    if (on && !spb_cuda_attention_wgmma_available())
        SPB_DIE("CUDA attention: the bulk dQ (cp.reduce.async.bulk) needs a GPU of compute capability 9.0 "
                "(H100/H200) and a build with sm_90a code; this one has neither or not both");
    int old = fast_bwd_dq_bulk;
    fast_bwd_dq_bulk = on != 0;
    return old;
}
/* The fused wgmma backward fed by a producer warp through the copy engine
 * and mbarriers (dkv_wgmma_tma): 0 (off, the default), 1 (the fused
 * kernel's order of products) or 2 (Pᵀ and dSᵀ computed while products
 * run); only where spb_cuda_attention_wgmma_available (the tensor copies
 * are sm_90's). */
static int fast_bwd_tma = 0;
extern "C" int spb_cuda_attention_set_bwd_tma(int schedule)
{
    if (schedule < 0 || schedule > 2)
        SPB_DIE("CUDA attention: TMA backward schedule %d (0 off, 1 plain, 2 overlapped)", schedule);
    if (schedule && !spb_cuda_attention_wgmma_available())
        SPB_DIE("CUDA attention: the TMA backward needs a GPU of compute capability 9.0 (H100/H200) and a build "
                "with sm_90a code; this one has neither or not both");
    int old = fast_bwd_tma;
    fast_bwd_tma = schedule;
    return old;
}
/* why the backward's switches cannot be launched together, or NULL */
static const char *bwd_switches_clash(void)
{
    if (fast_bwd_tma && !(fast_bwd_wgmma && fast_fused_dq))
        return "the TMA backward is the fused wgmma backward's (the wgmma backward and the fused dQ switch on)";
    if (fast_bwd_wgmma && fast_fused_dq && fast_block_rows != 128)
        return "the wgmma backward's fused dQ holds 128 keys per block (--flash-block-rows 128)";
    if (fast_bwd_dq_bulk && !fast_bwd_exchange && !(fast_bwd_wgmma && fast_fused_dq))
        return "the bulk dQ is the fused dQ's of the exchange or the wgmma backward (their switches on)";
    if (!fast_bwd_exchange) return nullptr;
    if (fast_bwd_wgmma) return "the exchange backward is an mma.sync backward (--flash-bwd mma)";
    if (fast_block_rows != 128) return "the exchange backward holds 128 keys per block (--flash-block-rows 128)";
    if (!fast_fused_dq) return "the exchange backward adds dQ by atomics: it needs the fused dQ switch on";
    return nullptr;
}

/* why the current switches cannot be launched together, or NULL */
static const char *fwd_switches_clash(void)
{
    if (fast_fwd_tma) {
        if (!fast_fwd_wgmma) return "the TMA forward is a wgmma forward (--flash-fwd wgmma)";
        if (fast_fwd_pipe) return "the TMA forward has its own pipelined schedule (TMA schedule 2)";
        if (fast_block_rows != 128) return "the TMA forward holds 128 query rows per block";
        if (fast_fwd_blocks != 1) return "the TMA forward runs one block per SM";
    }
    if (fast_fwd_pipe && !fast_fwd_wgmma) return "the pipelined forward is a wgmma forward (--flash-fwd wgmma)";
    if (fast_fwd_pipe && fast_fwd_keys != BC) return "the pipelined forward takes 64-key tiles";
    /* two products' registers in flight: capped at 128 it spills and ptxas serialises the products */
    if (fast_fwd_pipe && fast_fwd_blocks != 1) return "the pipelined forward runs one block per SM";
    if (fast_fwd_rows_per_warp == 32) {
        if (fast_fwd_wgmma) return "32 rows per warp is an mma.sync forward (--flash-fwd mma)";
        if (fast_block_rows != 128) return "32 rows per warp make 128-row blocks (--flash-block-rows 128)";
        if (fast_fwd_blocks != 1) return "32 rows per warp run two blocks per SM by their own launch bounds";
    }
    if (fast_fwd_blocks == 1) return nullptr;
    if (fast_block_rows != 128) return "2 blocks per SM need 128-row blocks (--flash-block-rows 128)";
    if (fast_fwd_wgmma && fast_fwd_keys != BC) return "2 blocks per SM need the wgmma forward's 64-key tiles";
    return nullptr;
}

/* What the CUDA runtime says of one kernel at this block size and shared
 * memory (the GPU check prints it beside the kernel's time); zeros under
 * the CPU emulation, which knows no registers. */
template <typename K>
static void occupancy_of(spb_cuda_occupancy *o, K kernel, int threads, size_t smem)
{
    memset(o, 0, sizeof *o);
#ifndef SPB_CUDA_EMU
    int blocks = 0;
    cudaFuncAttributes fa;
    SPB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
    SPB_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
    o->blocks_per_sm = blocks, o->warps_per_sm = blocks * threads / 32, o->registers = fa.numRegs;
    o->smem_bytes = (long)smem, o->local_bytes = (long)fa.localSizeBytes;
#else
    (void)kernel, (void)threads, (void)smem;
#endif
}

static int fast_ok(const spb_attn_desc *d, const void *const *ptrs, int nptr)
{
    if (d->head_dim != 64 && d->head_dim != 128) return 0;
    long strides[6] = {d->q_token_stride, d->q_batch_stride, d->k_token_stride,
                       d->k_batch_stride, d->o_token_stride, d->o_batch_stride};
    for (int x = 0; x < 6; x++)
        if (strides[x] % 8) return 0;
    for (int x = 0; x < nptr; x++)
        if ((uintptr_t)ptrs[x] % 16) return 0;
    return 1;
}

/* The opt-in above 48 KiB; the launchers below make it once per kernel
 * (the process's one device), not at every call. */
template <typename K>
static bool allow_smem(K kernel, size_t bytes)
{
    SPB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return true;
}

/* One buffer that only grows (spb_cuda_grow): a cudaFree would stall the
 * host behind a ring transfer in flight on the communication stream. */
extern "C" float *spb_cuda_attention_workspace(long n)
{
    static void *buf = nullptr;
    static size_t cap = 0;
    return (float *)spb_cuda_grow(&buf, &cap, SPB_MEM_WORKSPACE, sizeof(float) * (size_t)n);
}

/* The fast kernels' launches.  Shared memory: 16-bit tiles of rows padded
 * to D + PAD (the 16 W resident rows, two stages of each streamed tile),
 * and dK/dV's row statistics (two stages). */
template <typename T, int D, int W, int MINB, int RG = 1>
static void fwd_fast_launch(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                            spb_bf16 *o, float *lse, cudaStream_t s, spb_cuda_occupancy *query = nullptr)
{
    constexpr int rows = 16 * RG * W;
    const size_t sm = 2 * (size_t)(rows + 4 * BC) * (D + PAD);
    static const bool allowed = allow_smem(fwd_fast<T, D, W, MINB, RG>, sm);
    (void)allowed;
    if (query) return occupancy_of(query, fwd_fast<T, D, W, MINB, RG>, 32 * W, sm);
    dim3 grid((d->q_len + rows - 1) / rows, d->heads, d->batch);
    fwd_fast<T, D, W, MINB, RG><<<grid, 32 * W, sm, s>>>(*d, q, k, v, o, lse);
}
template <typename T, int D, int W>
static void bwd_fast_launch(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                            const float *lse, const float *delta, const spb_bf16 *dout, float *dq, float *dk, float *dv,
                            bool fused, cudaStream_t s)
{
    const size_t sq = 2 * (size_t)(2 * 16 * W + 4 * BC) * (D + PAD), sk = sq + 4 * sizeof(float) * BC,
                 sk_fused = sk + 2 * (size_t)16 * W * (BC + PAD); /* and dSᵀ */
    dim3 gq((d->q_len + 16 * W - 1) / (16 * W), d->heads, d->batch),
        gk((d->k_len + 16 * W - 1) / (16 * W), d->heads, d->batch);
    if (fused) {
        static const bool allowed = allow_smem(dkv_fast<T, D, W, true>, sk_fused);
        (void)allowed;
        dkv_fast<T, D, W, true><<<gk, 32 * W, sk_fused, s>>>(*d, q, k, v, lse, delta, dout, dk, dv, dq);
        return;
    }
    static const bool allowed = allow_smem(dq_fast<T, D, W>, sq) && allow_smem(dkv_fast<T, D, W, false>, sk);
    (void)allowed;
    dq_fast<T, D, W><<<gq, 32 * W, sq, s>>>(*d, q, k, v, lse, delta, dout, dq);
    SPB_CUDA_CHECK(cudaGetLastError());
    dkv_fast<T, D, W, false><<<gk, 32 * W, sk, s>>>(*d, q, k, v, lse, delta, dout, dk, dv, dq);
}

/* Shared memory: K and V of the block's keys, two stages of Q and dO, P and
 * dS of one tile, two stages of the query rows' statistics; BULK: the
 * tile's dQ in fp32 (at head dim 128: 205 KB in all, else 171). */
template <typename T, int D, bool BULK>
static void bwd_exchange_launch(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                const float *lse, const float *delta, const spb_bf16 *dout, float *dq, float *dk,
                                float *dv, cudaStream_t s)
{
    const size_t sm = 2 * ((size_t)(2 * XK + 4 * BC) * (D + PAD) + 2 * (size_t)BC * (XK + PAD)) +
                      4 * sizeof(float) * BC + (BULK ? sizeof(float) * BC * dq_stage_ld<D>() : 0);
    static const bool allowed = allow_smem(dkvq_exchange<T, D, BULK>, sm);
    (void)allowed;
    dim3 grid((d->k_len + XK - 1) / XK, d->heads, d->batch);
    dkvq_exchange<T, D, BULK><<<grid, 256, sm, s>>>(*d, q, k, v, lse, delta, dout, dk, dv, dq);
}

/* Shared memory: the resident query rows and two stages of K and V, in
 * core-matrix tiles (cm_stride). */
template <typename T, int D, int WG, int KN, int MINB>
static void fwd_wgmma_launch(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                             spb_bf16 *o, float *lse, cudaStream_t s, spb_cuda_occupancy *query = nullptr)
{
    const size_t sm = (size_t)(D / 8) * (cm_stride<64 * WG>() + 4 * cm_stride<KN>());
    static const bool allowed = allow_smem(fwd_wgmma<T, D, WG, KN, MINB>, sm);
    (void)allowed;
    if (query) return occupancy_of(query, fwd_wgmma<T, D, WG, KN, MINB>, 128 * WG, sm);
    dim3 grid((d->q_len + 64 * WG - 1) / (64 * WG), d->heads, d->batch);
    fwd_wgmma<T, D, WG, KN, MINB><<<grid, 128 * WG, sm, s>>>(*d, q, k, v, o, lse);
}

/* The tensor copies' maps: rows of one head of a [batch][token][head][D]
 * tensor as a 4-dimensional tensor (D, heads, tokens, batch), boxes of 64
 * columns (128 bytes, the swizzle's row) x `rows` tokens.  The driver's
 * encoder comes through the runtime (no -lcuda); the emulation has its own. */
typedef CUresult (*tensor_map_encoder)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                       const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                       CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                       CUtensorMapFloatOOBfill);
static tensor_map_encoder tensor_map_encode(void)
{
    static tensor_map_encoder fn = nullptr;
    if (!fn) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        SPB_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                                        &found));
        if (found != cudaDriverEntryPointSuccess || !p)
            SPB_DIE("CUDA attention: the driver has no cuTensorMapEncodeTiled (the TMA forward needs CUDA 12+)");
        fn = (tensor_map_encoder)p;
    }
    return fn;
}
static void head_rows_map(CUtensorMap *map, const spb_bf16 *base, int fp16, const spb_attn_desc *d, int len,
                          long token_stride, long batch_stride, int rows)
{
    const long e = 2; /* bytes per element */
    cuuint64_t dims[4] = {(cuuint64_t)d->head_dim, (cuuint64_t)d->heads, (cuuint64_t)len, (cuuint64_t)d->batch};
    cuuint64_t strides[3] = {(cuuint64_t)(e * d->head_dim), (cuuint64_t)(e * token_stride),
                             (cuuint64_t)(d->batch > 1 ? e * batch_stride : e * token_stride * len)};
    cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, step[4] = {1, 1, 1, 1};
    CUresult r = tensor_map_encode()(map, fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
                                     (void *)base, dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        SPB_DIE("CUDA attention: cuTensorMapEncodeTiled refused a map of %d tokens x %d heads x %d (token stride %ld, "
                "batch stride %ld): error %d",
                len, d->heads, d->head_dim, token_stride, batch_stride, (int)r);
}

template <typename T, int D, int KN, int SCHED>
static void fwd_wgmma_tma_launch(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                 spb_bf16 *o, float *lse, cudaStream_t s, spb_cuda_occupancy *query)
{
    const size_t sm = tma_fwd_layout<D, KN>::SMEM;
    static const bool allowed = allow_smem(fwd_wgmma_tma<T, D, KN, SCHED>, sm);
    (void)allowed;
    if (query) return occupancy_of(query, fwd_wgmma_tma<T, D, KN, SCHED>, 384, sm);
    tma_maps maps;
    const int fp16 = elem<T>::is_fp16;
    head_rows_map(&maps.q, q, fp16, d, d->q_len, d->q_token_stride, d->q_batch_stride, 128);
    head_rows_map(&maps.k, k, fp16, d, d->k_len, d->k_token_stride, d->k_batch_stride, KN);
    head_rows_map(&maps.v, v, fp16, d, d->k_len, d->k_token_stride, d->k_batch_stride, KN);
    dim3 grid((d->q_len + 127) / 128, d->heads, d->batch);
    fwd_wgmma_tma<T, D, KN, SCHED><<<grid, 384, sm, s>>>(*d, maps, o, lse);
}

template <typename T, int D, int WG, int MINB>
static void fwd_wgmma_pipe_launch(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                  spb_bf16 *o, float *lse, cudaStream_t s, spb_cuda_occupancy *query)
{
    const size_t sm = (size_t)(D / 8) * (cm_stride<64 * WG>() + 4 * cm_stride<BC>()) + sizeof(float) * 128 * WG;
    static const bool allowed = allow_smem(fwd_wgmma_pipe<T, D, WG, MINB>, sm);
    (void)allowed;
    if (query) return occupancy_of(query, fwd_wgmma_pipe<T, D, WG, MINB>, 128 * WG, sm);
    dim3 grid((d->q_len + 64 * WG - 1) / (64 * WG), d->heads, d->batch);
    fwd_wgmma_pipe<T, D, WG, MINB><<<grid, 128 * WG, sm, s>>>(*d, q, k, v, o, lse);
}

template <typename T, int D>
static void fwd_tma_pick(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                         spb_bf16 *o, float *lse, cudaStream_t s, spb_cuda_occupancy *query)
{
    const bool wide = fast_fwd_keys == 128;
    if (fast_fwd_tma == 1)
        wide ? fwd_wgmma_tma_launch<T, D, 128, 0>(d, q, k, v, o, lse, s, query)
             : fwd_wgmma_tma_launch<T, D, BC, 0>(d, q, k, v, o, lse, s, query);
    else if (fast_fwd_tma == 2)
        wide ? fwd_wgmma_tma_launch<T, D, 128, 1>(d, q, k, v, o, lse, s, query)
             : fwd_wgmma_tma_launch<T, D, BC, 1>(d, q, k, v, o, lse, s, query);
    else
        wide ? fwd_wgmma_tma_launch<T, D, 128, 2>(d, q, k, v, o, lse, s, query)
             : fwd_wgmma_tma_launch<T, D, BC, 2>(d, q, k, v, o, lse, s, query);
}

/* The fast forward the switches pick (fast_fwd_wgmma, fast_block_rows,
 * fast_fwd_keys, fast_fwd_blocks, fast_fwd_pipe, fast_fwd_rows_per_warp)
 * for d's head dim:
 * launched, or with query only its residency filled in (d's head dim is
 * all that is read then). */
template <typename T, int D>
static void fwd_fast_pick(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                          spb_bf16 *o, float *lse, cudaStream_t s, spb_cuda_occupancy *query)
{
    const bool wide = fast_block_rows == 128;
    if (!fast_fwd_wgmma) {
        if (fast_fwd_rows_per_warp == 32)
            fwd_fast_launch<T, D, 4, 2, 2>(d, q, k, v, o, lse, s, query);
        else if (fast_fwd_blocks == 2)
            fwd_fast_launch<T, D, 8, 2>(d, q, k, v, o, lse, s, query);
        else
            wide ? fwd_fast_launch<T, D, 8, 1>(d, q, k, v, o, lse, s, query)
                 : fwd_fast_launch<T, D, 4, 1>(d, q, k, v, o, lse, s, query);
    } else if (fast_fwd_tma) {
        fwd_tma_pick<T, D>(d, q, k, v, o, lse, s, query);
    } else if (fast_fwd_pipe) {
        wide ? fwd_wgmma_pipe_launch<T, D, 2, 1>(d, q, k, v, o, lse, s, query)
             : fwd_wgmma_pipe_launch<T, D, 1, 1>(d, q, k, v, o, lse, s, query);
    } else if (fast_fwd_blocks == 2) {
        fwd_wgmma_launch<T, D, 2, BC, 2>(d, q, k, v, o, lse, s, query);
    } else if (fast_fwd_keys == 128) {
        wide ? fwd_wgmma_launch<T, D, 2, 128, 1>(d, q, k, v, o, lse, s, query)
             : fwd_wgmma_launch<T, D, 1, 128, 1>(d, q, k, v, o, lse, s, query);
    } else {
        wide ? fwd_wgmma_launch<T, D, 2, BC, 1>(d, q, k, v, o, lse, s, query)
             : fwd_wgmma_launch<T, D, 1, BC, 1>(d, q, k, v, o, lse, s, query);
    }
}
template <typename T>
static void fwd_fast_dispatch(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                              spb_bf16 *o, float *lse, cudaStream_t s, spb_cuda_occupancy *query = nullptr)
{
    const char *why = fwd_switches_clash();
    if (why) SPB_DIE("CUDA attention: the forward's switches: %s", why);
    if (d->head_dim == 64)
        fwd_fast_pick<T, 64>(d, q, k, v, o, lse, s, query);
    else
        fwd_fast_pick<T, 128>(d, q, k, v, o, lse, s, query);
}

/* The residency of the fast forward the switches pick for this head dim
 * and element type (no launch) */
extern "C" spb_cuda_occupancy spb_cuda_attention_fwd_occupancy(int head_dim, int fp16)
{
    if (head_dim != 64 && head_dim != 128) SPB_DIE("CUDA attention: head_dim %d (64 or 128)", head_dim);
    spb_attn_desc d;
    memset(&d, 0, sizeof d);
    d.head_dim = head_dim;
    spb_cuda_occupancy o;
    if (fp16)
        fwd_fast_dispatch<__half>(&d, nullptr, nullptr, nullptr, nullptr, nullptr, 0, &o);
    else
        fwd_fast_dispatch<__nv_bfloat16>(&d, nullptr, nullptr, nullptr, nullptr, nullptr, 0, &o);
    return o;
}

/* Shared memory: the two resident tiles, two stages of the two streamed
 * ones, and (dK/dV) two stages of the query rows' statistics. */
template <typename T, int D, int WG>
static void bwd_wgmma_launch(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                             const float *lse, const float *delta, const spb_bf16 *dout, float *dq, float *dk,
                             float *dv, cudaStream_t s)
{
    const size_t sq = (size_t)(D / 8) * (2 * cm_stride<64 * WG>() + 4 * cm_stride<BC>()),
                 sk = sq + 4 * sizeof(float) * BC;
    static const bool allowed =
        allow_smem(dq_wgmma<T, D, WG>, sq) && allow_smem(dkv_wgmma<T, D, WG, WGMMA_DQ_SPLIT>, sk);
    (void)allowed;
    dim3 gq((d->q_len + 64 * WG - 1) / (64 * WG), d->heads, d->batch),
        gk((d->k_len + 64 * WG - 1) / (64 * WG), d->heads, d->batch);
    dq_wgmma<T, D, WG><<<gq, 128 * WG, sq, s>>>(*d, q, k, v, lse, delta, dout, dq);
    SPB_CUDA_CHECK(cudaGetLastError());
    dkv_wgmma<T, D, WG, WGMMA_DQ_SPLIT><<<gk, 128 * WG, sk, s>>>(*d, q, k, v, lse, delta, dout, dk, dv, nullptr);
}

/* Shared memory: K and V of the block's 128 keys, two stages of Q, dO and
 * the query rows' statistics, dS of one tile; DQ_BULK: the tile's dQ in
 * fp32 (at head dim 128: 147 KB, with the bulk dQ 181 KB). */
template <typename T, int D, int DQ>
static void bwd_wgmma_fused_launch(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                   const float *lse, const float *delta, const spb_bf16 *dout, float *dq, float *dk,
                                   float *dv, cudaStream_t s)
{
    const size_t sm = (size_t)(D / 8) * (2 * cm_stride<128>() + 4 * cm_stride<BC>()) + 4 * sizeof(float) * BC +
                      16 * cm_stride<BC>() + (DQ == WGMMA_DQ_BULK ? sizeof(float) * BC * dq_stage_ld<D>() : 0);
    static const bool allowed = allow_smem(dkv_wgmma<T, D, 2, DQ>, sm);
    (void)allowed;
    dim3 grid((d->k_len + 127) / 128, d->heads, d->batch);
    dkv_wgmma<T, D, 2, DQ><<<grid, 256, sm, s>>>(*d, q, k, v, lse, delta, dout, dk, dv, dq);
}

/* Shared memory (tma_bwd_layout): K and V of 128 keys, two stages of Q,
 * dO and their statistics, two buffers of dS; DQ_BULK: the tile's dQ in
 * fp32 (at head dim 128: 163 KB, with the bulk dQ 197 KB). */
template <typename T, int D, int DQ, int SCHED>
static void bwd_wgmma_tma_launch(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                 const float *lse, const float *delta, const spb_bf16 *dout, float *dq, float *dk,
                                 float *dv, cudaStream_t s)
{
    const size_t sm = tma_bwd_layout<D, DQ>::SMEM;
    static const bool allowed = allow_smem(dkv_wgmma_tma<T, D, DQ, SCHED>, sm);
    (void)allowed;
    tma_bwd_maps maps;
    const int fp16 = elem<T>::is_fp16;
    head_rows_map(&maps.q, q, fp16, d, d->q_len, d->q_token_stride, d->q_batch_stride, BC);
    head_rows_map(&maps.dout, dout, fp16, d, d->q_len, d->o_token_stride, d->o_batch_stride, BC);
    head_rows_map(&maps.k, k, fp16, d, d->k_len, d->k_token_stride, d->k_batch_stride, 128);
    head_rows_map(&maps.v, v, fp16, d, d->k_len, d->k_token_stride, d->k_batch_stride, 128);
    dim3 grid((d->k_len + 127) / 128, d->heads, d->batch);
    dkv_wgmma_tma<T, D, DQ, SCHED><<<grid, 384, sm, s>>>(*d, maps, lse, delta, dk, dv, dq);
}
template <typename T, int D>
static void bwd_wgmma_fused_pick(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                 const float *lse, const float *delta, const spb_bf16 *dout, float *dq, float *dk,
                                 float *dv, cudaStream_t s)
{
    constexpr int R = WGMMA_DQ_REDUCE, B = WGMMA_DQ_BULK;
    if (fast_bwd_tma == 1)
        fast_bwd_dq_bulk ? bwd_wgmma_tma_launch<T, D, B, 1>(d, q, k, v, lse, delta, dout, dq, dk, dv, s)
                         : bwd_wgmma_tma_launch<T, D, R, 1>(d, q, k, v, lse, delta, dout, dq, dk, dv, s);
    else if (fast_bwd_tma == 2)
        fast_bwd_dq_bulk ? bwd_wgmma_tma_launch<T, D, B, 2>(d, q, k, v, lse, delta, dout, dq, dk, dv, s)
                         : bwd_wgmma_tma_launch<T, D, R, 2>(d, q, k, v, lse, delta, dout, dq, dk, dv, s);
    else
        fast_bwd_dq_bulk ? bwd_wgmma_fused_launch<T, D, B>(d, q, k, v, lse, delta, dout, dq, dk, dv, s)
                         : bwd_wgmma_fused_launch<T, D, R>(d, q, k, v, lse, delta, dout, dq, dk, dv, s);
}

/* The launchers, for either element type (both are 2 bytes: the shared
 * memory sizes above hold for both). */
template <typename T>
static int attention_forward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                             spb_bf16 *o, float *lse, spb_cuda_impl impl, cudaStream_t s)
{
    if (d->head_dim != 64 && d->head_dim != 128) SPB_DIE("CUDA attention: head_dim %d (64 or 128)", d->head_dim);
    if (d->q_len <= 0 || d->batch <= 0 || d->heads <= 0) return impl == SPB_CUDA_FAST;
    const void *ptrs[4] = {q, k, v, o};
    int fast = impl == SPB_CUDA_FAST && fast_ok(d, ptrs, 4);
    if (fast) {
        fwd_fast_dispatch<T>(d, q, k, v, o, lse, s);
    } else {
        dim3 grid((d->q_len + ST - 1) / ST, d->heads, d->batch);
        if (d->head_dim == 64)
            fwd_simple<T, 64><<<grid, ST, 0, s>>>(*d, q, k, v, o, lse);
        else
            fwd_simple<T, 128><<<grid, ST, 0, s>>>(*d, q, k, v, o, lse);
    }
    SPB_CUDA_CHECK(cudaGetLastError());
    return fast;
}

template <typename T>
static int attention_backward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                              const spb_bf16 *o, const float *lse, const spb_bf16 *dout, float *dq, float *dk,
                              float *dv, float *workspace, spb_cuda_impl impl, cudaStream_t s)
{
    if (d->head_dim != 64 && d->head_dim != 128) SPB_DIE("CUDA attention: head_dim %d (64 or 128)", d->head_dim);
    if (d->q_len <= 0 || d->k_len <= 0 || d->batch <= 0 || d->heads <= 0) return impl == SPB_CUDA_FAST;
    long rows = (long)d->batch * d->heads * d->q_len;
    attn_delta<T><<<(unsigned)((rows + 255) / 256), 256, 0, s>>>(*d, o, dout, workspace);
    SPB_CUDA_CHECK(cudaGetLastError());
    /* dq too: the fused dQ's 8-byte reductions and the bulk dQ's 16-byte rows */
    const void *ptrs[6] = {q, k, v, o, dout, dq};
    int fast = impl == SPB_CUDA_FAST && fast_ok(d, ptrs, 6), wide = fast_block_rows == 128;
    const char *why = fast ? bwd_switches_clash() : nullptr;
    if (why) SPB_DIE("CUDA attention: the backward's switches: %s", why);
    if (fast && fast_bwd_exchange) {
        if (fast_bwd_dq_bulk) { /* 16-byte aligned rows (fast_ok) for the copy engine */
            d->head_dim == 64 ? bwd_exchange_launch<T, 64, true>(d, q, k, v, lse, workspace, dout, dq, dk, dv, s)
                              : bwd_exchange_launch<T, 128, true>(d, q, k, v, lse, workspace, dout, dq, dk, dv, s);
        } else {
            d->head_dim == 64 ? bwd_exchange_launch<T, 64, false>(d, q, k, v, lse, workspace, dout, dq, dk, dv, s)
                              : bwd_exchange_launch<T, 128, false>(d, q, k, v, lse, workspace, dout, dq, dk, dv, s);
        }
    } else if (fast && fast_bwd_wgmma && fast_fused_dq) {
        d->head_dim == 64 ? bwd_wgmma_fused_pick<T, 64>(d, q, k, v, lse, workspace, dout, dq, dk, dv, s)
                          : bwd_wgmma_fused_pick<T, 128>(d, q, k, v, lse, workspace, dout, dq, dk, dv, s);
    } else if (fast && fast_bwd_wgmma) {
        if (d->head_dim == 64)
            wide ? bwd_wgmma_launch<T, 64, 2>(d, q, k, v, lse, workspace, dout, dq, dk, dv, s)
                 : bwd_wgmma_launch<T, 64, 1>(d, q, k, v, lse, workspace, dout, dq, dk, dv, s);
        else
            wide ? bwd_wgmma_launch<T, 128, 2>(d, q, k, v, lse, workspace, dout, dq, dk, dv, s)
                 : bwd_wgmma_launch<T, 128, 1>(d, q, k, v, lse, workspace, dout, dq, dk, dv, s);
    } else if (fast) {
        if (d->head_dim == 64)
            wide ? bwd_fast_launch<T, 64, 8>(d, q, k, v, lse, workspace, dout, dq, dk, dv, fast_fused_dq, s)
                 : bwd_fast_launch<T, 64, 4>(d, q, k, v, lse, workspace, dout, dq, dk, dv, fast_fused_dq, s);
        else
            wide ? bwd_fast_launch<T, 128, 8>(d, q, k, v, lse, workspace, dout, dq, dk, dv, fast_fused_dq, s)
                 : bwd_fast_launch<T, 128, 4>(d, q, k, v, lse, workspace, dout, dq, dk, dv, fast_fused_dq, s);
    } else {
        dim3 gq((d->q_len + ST - 1) / ST, d->heads, d->batch), gk((d->k_len + ST - 1) / ST, d->heads, d->batch);
        if (d->head_dim == 64) {
            dq_simple<T, 64><<<gq, ST, 0, s>>>(*d, q, k, v, lse, workspace, dout, dq);
            SPB_CUDA_CHECK(cudaGetLastError());
            dkv_simple<T, 64><<<gk, ST, 0, s>>>(*d, q, k, v, lse, workspace, dout, dk, dv);
        } else {
            dq_simple<T, 128><<<gq, ST, 0, s>>>(*d, q, k, v, lse, workspace, dout, dq);
            SPB_CUDA_CHECK(cudaGetLastError());
            dkv_simple<T, 128><<<gk, ST, 0, s>>>(*d, q, k, v, lse, workspace, dout, dk, dv);
        }
    }
    SPB_CUDA_CHECK(cudaGetLastError());
    return fast;
}

extern "C" int spb_cuda_attention_forward_half(const spb_attn_desc *d, int fp16, const spb_bf16 *q, const spb_bf16 *k,
                                               const spb_bf16 *v, spb_bf16 *o, float *lse, spb_cuda_impl impl,
                                               cudaStream_t s)
{
    return fp16 ? attention_forward<__half>(d, q, k, v, o, lse, impl, s)
                : attention_forward<__nv_bfloat16>(d, q, k, v, o, lse, impl, s);
}

extern "C" int spb_cuda_attention_backward_half(const spb_attn_desc *d, int fp16, const spb_bf16 *q,
                                                const spb_bf16 *k, const spb_bf16 *v, const spb_bf16 *o,
                                                const float *lse, const spb_bf16 *dout, float *dq, float *dk,
                                                float *dv, float *workspace, spb_cuda_impl impl, cudaStream_t s)
{
    return fp16 ? attention_backward<__half>(d, q, k, v, o, lse, dout, dq, dk, dv, workspace, impl, s)
                : attention_backward<__nv_bfloat16>(d, q, k, v, o, lse, dout, dq, dk, dv, workspace, impl, s);
}

extern "C" int spb_cuda_attention_forward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k,
                                          const spb_bf16 *v, spb_bf16 *o, float *lse, spb_cuda_impl impl,
                                          cudaStream_t s)
{
    return spb_cuda_attention_forward_half(d, 0, q, k, v, o, lse, impl, s);
}

extern "C" int spb_cuda_attention_backward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k,
                                           const spb_bf16 *v, const spb_bf16 *o, const float *lse,
                                           const spb_bf16 *dout, float *dq, float *dk, float *dv, float *workspace,
                                           spb_cuda_impl impl, cudaStream_t s)
{
    return spb_cuda_attention_backward_half(d, 0, q, k, v, o, lse, dout, dq, dk, dv, workspace, impl, s);
}
