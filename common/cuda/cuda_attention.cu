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
 * 4 warps, 64 rows per block (16 per warp), tiles of 64 along the other
 * sequence, products on tensor cores with mma.sync.m16n8k16 bf16 (f16) -> fp32.
 * Fragment layouts of m16n8k16 (g = lane / 4, t = lane % 4):
 *   A 16x16 (row-major): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
 *   B 16x8  (k x n):     b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8..2t+9, n = g)
 *   C 16x8  fp32:        c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..2t+1)
 * so an S accumulator (two n-tiles of 8 keys) becomes, rounded to T, the A
 * operand of P·V with no shuffle.  Operands whose k index runs along memory
 * rows (Vᵀ for P·V, Kᵀ for dS·K, Qᵀ and dOᵀ for dK, dV) are staged transposed
 * in shared memory; all rows padded by 8 elements so that the 8 row groups of a
 * fragment load hit distinct banks.
 *   forward: S = Q Kᵀ, online softmax in registers, O += P V
 *   dQ     : query tile resident: S, P = exp(S - lse), dP = dO Vᵀ,
 *            dS = P (dP - D), dQ += dS K          (no atomics)
 *   dK, dV : key tile resident: Sᵀ = K Qᵀ, Pᵀ, dPᵀ = V dOᵀ, dSᵀ,
 *            dV += Pᵀ dO, dK += dSᵀ Q               (no atomics)
 * (dQ in its own kernel recomputes S and dP: 7 products per pair instead of
 * 5, in exchange for no fp32 atomics; the FLOP counts reported are the
 * conventional 10·D per visible pair.)
 * Causal: tiles entirely above the diagonal (in global positions, with the
 * offsets) are skipped; partially visible tiles are masked per element. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "cuda_check.h"
#include "spb_cuda.h"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* What differs between the element types: conversions (round to nearest
 * even), packing two fp32 values into one 32-bit operand register, and the
 * m16n8k16 tensor-core product with fp32 accumulators. */
template <typename T> struct elem;
template <> struct elem<__nv_bfloat16> {
    static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
    {
#ifdef SPB_CUDA_EMU /* the CPU emulation's warp collective (common/cuda/emu) */
        spb_emu_mma_m16n8k16(0, c, a, b0, b1);
#else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
    }
};
template <> struct elem<__half> {
    static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __half2 v = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
    {
#ifdef SPB_CUDA_EMU /* the CPU emulation's warp collective (common/cuda/emu) */
        spb_emu_mma_m16n8k16(1, c, a, b0, b1);
#else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
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
    /* first query row that sees the block's first key */
    long i_first = d.causal ? d.k_offset + (long)blockIdx.x * ST - d.q_offset : 0;
    int i0 = i_first <= 0 ? 0 : (int)((i_first > d.q_len ? d.q_len : i_first) / ST * ST);
    for (; i0 < d.q_len; i0 += ST) {
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
#define BR 64  /* rows per block: 4 warps x 16 */
#define BC 64  /* tile along the other sequence */
#define PAD 8

template <typename T> __device__ __forceinline__ uint32_t lds32(const T *p) { return *(const uint32_t *)p; }

/* rows [r0, r0+64) of a [len][.. stride ..] tensor into S[64][D+PAD], zeros past len */
template <typename T, int D>
__device__ __forceinline__ void stage_rows(T *S, const spb_bf16 *g, long base, long stride, int r0, int len)
{
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int e = threadIdx.x; e < BR * D / 8; e += blockDim.x) {
        int r = e / (D / 8), c8 = e % (D / 8);
        uint4 val = r0 + r < len ? *(const uint4 *)(g + base + (long)(r0 + r) * stride + c8 * 8) : zero;
        *(uint4 *)(S + r * (D + PAD) + c8 * 8) = val;
    }
}
/* the same rows transposed: St[D][64+PAD] */
template <typename T, int D>
__device__ __forceinline__ void stage_rows_t(T *St, const spb_bf16 *g, long base, long stride, int r0, int len)
{
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int e = threadIdx.x; e < BR * D / 8; e += blockDim.x) {
        int r = e / (D / 8), c8 = e % (D / 8);
        uint4 val = r0 + r < len ? *(const uint4 *)(g + base + (long)(r0 + r) * stride + c8 * 8) : zero;
        const T *vh = (const T *)&val;
        for (int x = 0; x < 8; x++) St[(c8 * 8 + x) * (BC + PAD) + r] = vh[x];
    }
}
/* A fragment of rows [r, r+16), k columns [kc*16, +16) of a padded row-major tile */
template <int LD, typename T>
__device__ __forceinline__ void load_a(uint32_t a[4], const T *S, int r, int kc, int g, int t)
{
    a[0] = lds32(S + (r + g) * LD + kc * 16 + 2 * t);
    a[1] = lds32(S + (r + g + 8) * LD + kc * 16 + 2 * t);
    a[2] = lds32(S + (r + g) * LD + kc * 16 + 2 * t + 8);
    a[3] = lds32(S + (r + g + 8) * LD + kc * 16 + 2 * t + 8);
}
/* acc[8][4] (16 rows x 64 cols) += A-rows(Sa, rows r..r+15) · B-rows(Sb, rows 0..63)ᵀ over D */
template <typename T, int D>
__device__ __forceinline__ void mma_rows_rowsT(float acc[8][4], const T *Sa, int r, const T *Sb, int g, int t)
{
    for (int kc = 0; kc < D / 16; kc++) {
        uint32_t a[4];
        load_a<D + PAD>(a, Sa, r, kc, g, t);
        for (int nt = 0; nt < 8; nt++) {
            const T *p = Sb + (nt * 8 + g) * (D + PAD) + kc * 16 + 2 * t;
            elem<T>::mma(acc[nt], a, lds32(p), lds32(p + 8));
        }
    }
}
/* out[D/8][4] (16 rows x D) += P(16 x 64, as C fragments) · M(64 x D) with M
 * staged transposed Mt[D][64+PAD] */
template <typename T, int D>
__device__ __forceinline__ void mma_p_mt(float out[D / 8][4], const float p[8][4], const T *Mt, int g, int t)
{
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4] = {elem<T>::pack2(p[2 * kk][0], p[2 * kk][1]), elem<T>::pack2(p[2 * kk][2], p[2 * kk][3]),
                         elem<T>::pack2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                         elem<T>::pack2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        for (int dn = 0; dn < D / 8; dn++) {
            const T *q = Mt + (dn * 8 + g) * (BC + PAD) + kk * 16 + 2 * t;
            elem<T>::mma(out[dn], a, lds32(q), lds32(q + 8));
        }
    }
}

/* query tiles [i0, i0+64) see key indices < n_block_keys(i0) */
__device__ __forceinline__ int keys_for_tile(const spb_attn_desc &d, int i0)
{
    return visible_keys(d, min(i0 + BR - 1, d.q_len - 1));
}

template <typename T, int D>
__global__ void __launch_bounds__(128) fwd_fast(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                const spb_bf16 *v, spb_bf16 *o, float *lse)
{
    extern __shared__ __align__(16) unsigned char smem[];
    T *Qs = (T *)smem, *Ks = Qs + BR * (D + PAD), *Vt = Ks + BC * (D + PAD);
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * BR;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, r = warp * 16;
    const long qb = b * d.q_batch_stride + (long)h * D, kb = b * d.k_batch_stride + (long)h * D;
    const float c = d.scale * LOG2E;

    stage_rows<T, D>(Qs, q, qb, d.q_token_stride, i0, d.q_len);
    __syncthreads();
    uint32_t qf[D / 16][4];
    for (int kc = 0; kc < D / 16; kc++) load_a<D + PAD>(qf[kc], Qs, r, kc, g, t);

    float oacc[D / 8][4];
    for (int dn = 0; dn < D / 8; dn++) oacc[dn][0] = oacc[dn][1] = oacc[dn][2] = oacc[dn][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const long qpos[2] = {d.q_offset + i0 + r + g, d.q_offset + i0 + r + g + 8};
    const int n_keys = keys_for_tile(d, i0);

    for (int j0 = 0; j0 < n_keys; j0 += BC) {
        __syncthreads();
        stage_rows<T, D>(Ks, k, kb, d.k_token_stride, j0, d.k_len);
        stage_rows_t<T, D>(Vt, v, kb, d.k_token_stride, j0, d.k_len);
        __syncthreads();
        float s[8][4];
        for (int nt = 0; nt < 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        for (int kc = 0; kc < D / 16; kc++)
            for (int nt = 0; nt < 8; nt++) {
                const T *p = Ks + (nt * 8 + g) * (D + PAD) + kc * 16 + 2 * t;
                elem<T>::mma(s[nt], qf[kc], lds32(p), lds32(p + 8));
            }
        float mx[2] = {-INFINITY, -INFINITY};
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                int j = j0 + nt * 8 + 2 * t + (e & 1);
                bool vis = j < d.k_len && (!d.causal || d.k_offset + j <= qpos[e >> 1]);
                s[nt][e] = vis ? s[nt][e] * c : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
            }
        float corr[2], base[2];
        for (int x = 0; x < 2; x++) {
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
            float mn = fmaxf(m[x], mx[x]);
            base[x] = mn == -INFINITY ? 0.0f : mn; /* a row with nothing visible yet */
            corr[x] = exp2f(m[x] - base[x]);
            m[x] = mn;
            l[x] *= corr[x];
        }
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                s[nt][e] = exp2f(s[nt][e] - base[e >> 1]);
                l[e >> 1] += s[nt][e];
            }
        for (int dn = 0; dn < D / 8; dn++) {
            oacc[dn][0] *= corr[0], oacc[dn][1] *= corr[0];
            oacc[dn][2] *= corr[1], oacc[dn][3] *= corr[1];
        }
        mma_p_mt<T, D>(oacc, s, Vt, g, t);
    }
    for (int x = 0; x < 2; x++) {
        l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
        l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
    }
    for (int x = 0; x < 2; x++) {
        int i = i0 + r + g + 8 * x;
        if (i >= d.q_len) continue;
        float inv = l[x] > 0.0f ? 1.0f / l[x] : 0.0f;
        T *orow = (T *)o + b * d.o_batch_stride + (long)i * d.o_token_stride + (long)h * D;
        for (int dn = 0; dn < D / 8; dn++)
            *(uint32_t *)(orow + dn * 8 + 2 * t) = elem<T>::pack2(oacc[dn][2 * x] * inv, oacc[dn][2 * x + 1] * inv);
        if (t == 0) lse[((long)b * d.heads + h) * d.q_len + i] = l[x] > 0.0f ? (m[x] + log2f(l[x])) * LN2 : -INFINITY;
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(128) dq_fast(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                               const spb_bf16 *v, const float *lse, const float *delta,
                                               const spb_bf16 *dout, float *dq)
{
    extern __shared__ __align__(16) unsigned char smem[];
    T *Qs = (T *)smem, *dOs = Qs + BR * (D + PAD), *Ks = dOs + BR * (D + PAD), *Vs = Ks + BC * (D + PAD),
         *Kt = Vs + BC * (D + PAD);
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * BR;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, r = warp * 16;
    const long qb = b * d.q_batch_stride + (long)h * D, kb = b * d.k_batch_stride + (long)h * D,
               ob = b * d.o_batch_stride + (long)h * D;
    const float c = d.scale * LOG2E;
    stage_rows<T, D>(Qs, q, qb, d.q_token_stride, i0, d.q_len);
    stage_rows<T, D>(dOs, dout, ob, d.o_token_stride, i0, d.q_len);
    float L2[2], Dl[2];
    long qpos[2];
    for (int x = 0; x < 2; x++) {
        int i = i0 + r + g + 8 * x;
        long row = ((long)b * d.heads + h) * d.q_len + i;
        float L = i < d.q_len ? lse[row] : -INFINITY;
        L2[x] = L > -INFINITY ? L * LOG2E : INFINITY; /* no visible key: P = 0 */
        Dl[x] = i < d.q_len ? delta[row] : 0.0f;
        qpos[x] = d.q_offset + i;
    }
    float acc[D / 8][4];
    for (int dn = 0; dn < D / 8; dn++) acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
    const int n_keys = keys_for_tile(d, i0);
    for (int j0 = 0; j0 < n_keys; j0 += BC) {
        __syncthreads();
        stage_rows<T, D>(Ks, k, kb, d.k_token_stride, j0, d.k_len);
        stage_rows<T, D>(Vs, v, kb, d.k_token_stride, j0, d.k_len);
        stage_rows_t<T, D>(Kt, k, kb, d.k_token_stride, j0, d.k_len);
        __syncthreads();
        float s[8][4], dp[8][4];
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
        mma_rows_rowsT<T, D>(s, Qs, r, Ks, g, t);
        mma_rows_rowsT<T, D>(dp, dOs, r, Vs, g, t);
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                int j = j0 + nt * 8 + 2 * t + (e & 1), x = e >> 1;
                bool vis = j < d.k_len && (!d.causal || d.k_offset + j <= qpos[x]);
                float p = vis ? exp2f(s[nt][e] * c - L2[x]) : 0.0f;
                s[nt][e] = p * (dp[nt][e] - Dl[x]); /* dS */
            }
        mma_p_mt<T, D>(acc, s, Kt, g, t);
    }
    for (int x = 0; x < 2; x++) {
        int i = i0 + r + g + 8 * x;
        if (i >= d.q_len) continue;
        float *row = dq + qb + (long)i * d.q_token_stride;
        for (int dn = 0; dn < D / 8; dn++) {
            row[dn * 8 + 2 * t] += d.scale * acc[dn][2 * x];
            row[dn * 8 + 2 * t + 1] += d.scale * acc[dn][2 * x + 1];
        }
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(128) dkv_fast(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                const spb_bf16 *v, const float *lse, const float *delta,
                                                const spb_bf16 *dout, float *dk, float *dv)
{
    extern __shared__ __align__(16) unsigned char smem[];
    T *Ks = (T *)smem, *Vs = Ks + BR * (D + PAD), *Qs = Vs + BR * (D + PAD), *dOs = Qs + BC * (D + PAD),
         *Qt = dOs + BC * (D + PAD), *dOt = Qt + D * (BC + PAD);
    float *Ls = (float *)(dOt + D * (BC + PAD)), *Ds = Ls + BC;
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * BR;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, r = warp * 16;
    const long qb = b * d.q_batch_stride + (long)h * D, kb = b * d.k_batch_stride + (long)h * D,
               ob = b * d.o_batch_stride + (long)h * D;
    const float c = d.scale * LOG2E;
    stage_rows<T, D>(Ks, k, kb, d.k_token_stride, j0, d.k_len);
    stage_rows<T, D>(Vs, v, kb, d.k_token_stride, j0, d.k_len);
    const long kpos[2] = {d.k_offset + j0 + r + g, d.k_offset + j0 + r + g + 8};
    const bool kin[2] = {j0 + r + g < d.k_len, j0 + r + g + 8 < d.k_len};
    float dka[D / 8][4], dva[D / 8][4];
    for (int dn = 0; dn < D / 8; dn++)
        for (int e = 0; e < 4; e++) dka[dn][e] = dva[dn][e] = 0.0f;
    long i_first = d.causal ? d.k_offset + j0 - d.q_offset : 0;
    int i0 = i_first <= 0 ? 0 : (int)((i_first > d.q_len ? d.q_len : i_first) / BC * BC);
    for (; i0 < d.q_len; i0 += BC) {
        __syncthreads();
        stage_rows<T, D>(Qs, q, qb, d.q_token_stride, i0, d.q_len);
        stage_rows<T, D>(dOs, dout, ob, d.o_token_stride, i0, d.q_len);
        stage_rows_t<T, D>(Qt, q, qb, d.q_token_stride, i0, d.q_len);
        stage_rows_t<T, D>(dOt, dout, ob, d.o_token_stride, i0, d.q_len);
        for (int e = threadIdx.x; e < BC; e += blockDim.x) {
            int i = i0 + e;
            long row = ((long)b * d.heads + h) * d.q_len + i;
            float L = i < d.q_len ? lse[row] : -INFINITY;
            Ls[e] = L > -INFINITY ? L * LOG2E : INFINITY;
            Ds[e] = i < d.q_len ? delta[row] : 0.0f;
        }
        __syncthreads();
        float s[8][4], dp[8][4]; /* transposed: rows = this warp's 16 keys, cols = 64 queries */
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
        mma_rows_rowsT<T, D>(s, Ks, r, Qs, g, t);
        mma_rows_rowsT<T, D>(dp, Vs, r, dOs, g, t);
        for (int nt = 0; nt < 8; nt++)
            for (int e = 0; e < 4; e++) {
                int col = nt * 8 + 2 * t + (e & 1), i = i0 + col, x = e >> 1;
                bool vis = kin[x] && i < d.q_len && (!d.causal || kpos[x] <= d.q_offset + i);
                float p = vis ? exp2f(s[nt][e] * c - Ls[col]) : 0.0f;
                s[nt][e] = p;                        /* Pᵀ */
                dp[nt][e] = p * (dp[nt][e] - Ds[col]); /* dSᵀ */
            }
        mma_p_mt<T, D>(dva, s, dOt, g, t);
        mma_p_mt<T, D>(dka, dp, Qt, g, t);
    }
    for (int x = 0; x < 2; x++) {
        int j = j0 + r + g + 8 * x;
        if (j >= d.k_len) continue;
        float *krow = dk + kb + (long)j * d.k_token_stride, *vrow = dv + kb + (long)j * d.k_token_stride;
        for (int dn = 0; dn < D / 8; dn++) {
            krow[dn * 8 + 2 * t] += d.scale * dka[dn][2 * x];
            krow[dn * 8 + 2 * t + 1] += d.scale * dka[dn][2 * x + 1];
            vrow[dn * 8 + 2 * t] += dva[dn][2 * x];
            vrow[dn * 8 + 2 * t + 1] += dva[dn][2 * x + 1];
        }
    }
}

/* ========================== launchers ============================================= */
/* Shared memory of the fast kernels, in elements of 2 bytes (bf16 and fp16). */
static size_t fwd_smem(int D) { return 2 * (size_t)(BR * (D + PAD) + BC * (D + PAD) + D * (BC + PAD)); }
static size_t dq_smem(int D) { return 2 * (size_t)(2 * BR * (D + PAD) + 2 * BC * (D + PAD) + D * (BC + PAD)); }
static size_t dkv_smem(int D)
{
    return 2 * (size_t)(2 * BR * (D + PAD) + 2 * BC * (D + PAD) + 2 * D * (BC + PAD)) + 2 * sizeof(float) * BC;
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

template <typename K>
static void allow_smem(K kernel, size_t bytes)
{
    SPB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

/* One buffer that only grows (spb_cuda_grow): a cudaFree would stall the
 * host behind a ring transfer in flight on the communication stream. */
extern "C" float *spb_cuda_attention_workspace(long n)
{
    static void *buf = nullptr;
    static size_t cap = 0;
    return (float *)spb_cuda_grow(&buf, &cap, SPB_MEM_WORKSPACE, sizeof(float) * (size_t)n);
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
    dim3 grid((d->q_len + BR - 1) / BR, d->heads, d->batch);
    if (fast) {
        size_t sm = fwd_smem(d->head_dim);
        if (d->head_dim == 64) {
            allow_smem(fwd_fast<T, 64>, sm);
            fwd_fast<T, 64><<<grid, 128, sm, s>>>(*d, q, k, v, o, lse);
        } else {
            allow_smem(fwd_fast<T, 128>, sm);
            fwd_fast<T, 128><<<grid, 128, sm, s>>>(*d, q, k, v, o, lse);
        }
    } else if (d->head_dim == 64) {
        fwd_simple<T, 64><<<grid, ST, 0, s>>>(*d, q, k, v, o, lse);
    } else {
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
    const void *ptrs[5] = {q, k, v, o, dout};
    int fast = impl == SPB_CUDA_FAST && fast_ok(d, ptrs, 5);
    dim3 gq((d->q_len + BR - 1) / BR, d->heads, d->batch), gk((d->k_len + BR - 1) / BR, d->heads, d->batch);
    if (fast) {
        size_t sq = dq_smem(d->head_dim), sk = dkv_smem(d->head_dim);
        if (d->head_dim == 64) {
            allow_smem(dq_fast<T, 64>, sq);
            allow_smem(dkv_fast<T, 64>, sk);
            dq_fast<T, 64><<<gq, 128, sq, s>>>(*d, q, k, v, lse, workspace, dout, dq);
            SPB_CUDA_CHECK(cudaGetLastError());
            dkv_fast<T, 64><<<gk, 128, sk, s>>>(*d, q, k, v, lse, workspace, dout, dk, dv);
        } else {
            allow_smem(dq_fast<T, 128>, sq);
            allow_smem(dkv_fast<T, 128>, sk);
            dq_fast<T, 128><<<gq, 128, sq, s>>>(*d, q, k, v, lse, workspace, dout, dq);
            SPB_CUDA_CHECK(cudaGetLastError());
            dkv_fast<T, 128><<<gk, 128, sk, s>>>(*d, q, k, v, lse, workspace, dout, dk, dv);
        }
    } else if (d->head_dim == 64) {
        dq_simple<T, 64><<<gq, ST, 0, s>>>(*d, q, k, v, lse, workspace, dout, dq);
        SPB_CUDA_CHECK(cudaGetLastError());
        dkv_simple<T, 64><<<gk, ST, 0, s>>>(*d, q, k, v, lse, workspace, dout, dk, dv);
    } else {
        dq_simple<T, 128><<<gq, ST, 0, s>>>(*d, q, k, v, lse, workspace, dout, dq);
        SPB_CUDA_CHECK(cudaGetLastError());
        dkv_simple<T, 128><<<gk, ST, 0, s>>>(*d, q, k, v, lse, workspace, dout, dk, dv);
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
