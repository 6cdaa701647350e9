/* Tiled, flash-style CPU attention backend (common/attention/attention.h).
 *
 * Never materialises the q_len x k_len score matrix.  For each (batch, head)
 * and each query tile of SPB_FA_BR rows it walks the key tiles of SPB_FA_BC
 * keys:
 *   S = scale Q_t K_t^T                        (cblas_sgemm, strided, no copies)
 *   online softmax: running max m, running sum l, accumulator rescaled by
 *   exp(m_old - m_new)
 *   O_acc += P V_t                             (cblas_sgemm)
 * and finishes with O = O_acc / l, lse = m + log l.
 *
 * Causal masking: key tiles whose first key lies after the tile's last query
 * are skipped (the loop stops there), and the per-row mask is only applied to
 * tiles that straddle the diagonal.  A masked element is never represented
 * as -INFINITY: each row simply has a count of visible keys, the exponentials
 * are computed for those only and the rest of the row is set to 0, so no
 * (-inf) - (-inf) can arise.
 *
 * Blocked-sparse masking (docs/SPARSE.md; attention.h, spb_attn_row_spans):
 * each query row sees at most two spans of keys.  Per query tile the spans of
 * its rows are computed once; a key tile that no row of the query tile sees
 * is skipped (no sgemm at all), one that every row sees entirely runs
 * unmasked, and a partially visible one is masked after S = QK^T: the row's
 * count of visible keys becomes one past its last visible key in the tile,
 * and the masked keys before that are set to -INFINITY in S.  Such a row has
 * at least one visible key in the tile, so its maximum is finite and
 * exp(-inf - finite) gives exactly 0 (the polynomial exp flushes anything
 * below -87.3 to 0); still no (-inf) - (-inf).  A dense (causal) mask is a
 * prefix, so it never writes -INFINITY.
 *
 * Backward (per query tile, D_i = rowsum(dO_i o O_i) computed once, then per
 * key tile): S recomputed, P = exp(S - lse), dV += P^T dO, dP = dO V^T,
 * dS = P o (dP - D), dQ += scale dS K, dK += scale dS^T Q; the last three and
 * dV accumulate straight into the strided outputs with beta = 1.
 *
 * The element-wise row work (max, exp, sums, dS) uses GCC/Clang vector
 * extensions with an inline polynomial exp (Cephes expf; measured max
 * relative error 8.1e-8 against double exp over [-87.3, 0.5], 8.4e-8 with
 * FMA contraction).  On x86 the row kernels are compiled three times (SSE2
 * baseline, AVX2+FMA, AVX-512F+FMA) and picked at run time with
 * __builtin_cpu_supports.  The AVX2/AVX-512 variants are built with GCC's
 * fp-contract=fast (the polynomial becomes FMAs: ~1.7x faster exp, ~5-9%
 * of the whole kernel), so they may differ from the SSE2/scalar variants in
 * the last bit of P; the lane-wise partial sums of l also differ in order.
 * (OpenBLAS picks its kernels per CPU anyway, so bitwise reproducibility
 * across machines was never on offer.)
 * Compile-time switches: SPB_ATTN_NO_SIMD (plain scalar code),
 * SPB_ATTN_NO_MULTIVERSION (baseline vector code only), SPB_ATTN_NO_AVX512
 * (at most AVX2); SPB_FA_BR / SPB_FA_BC set the tile sizes (64 x 64: tried
 * 32..256, the differences were within noise except 128 query rows with 32
 * keys, which was slower).
 *
 * Parallelism: with OpenMP (only if compiled with -fopenmp) the forward
 * distributes (batch, head, query tile) triples and the backward
 * (batch, head) pairs, so no two threads ever write the same output element.
 */
#include "attention.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef SPB_FA_BR
#define SPB_FA_BR 64 /* query rows per tile */
#endif
#ifndef SPB_FA_BC
#define SPB_FA_BC 64 /* keys per tile */
#endif

/* ------------------------------------------------------------------------ */
/* exp approximation (Cephes expf): x = n ln2 + r, |r| <= ln2/2,
 * e^r = 1 + r + r^2 P(r), 2^n put into the exponent field.  Inputs below
 * -87.33654 (including -inf) give exactly 0; inputs above 88 are clamped to
 * 88 (never reached here: arguments are always <= ~0). */
#define SPB_EXP_LO (-87.33654f)
#define SPB_EXP_HI 88.0f
#define SPB_LOG2E 1.44269504088896341f
#define SPB_MAGIC 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer */
#define SPB_LN2_HI 0.693359375f
#define SPB_LN2_LO (-2.12194440e-4f)
#define SPB_P0 1.9875691500e-4f
#define SPB_P1 1.3981999507e-3f
#define SPB_P2 8.3334519073e-3f
#define SPB_P3 4.1665795894e-2f
#define SPB_P4 1.6666665459e-1f
#define SPB_P5 5.0000001201e-1f

static inline float spb_exp_scalar(float x)
{
    if (x < SPB_EXP_LO)
        return 0.0f;
    if (x != x)
        return x; /* NaN */
    if (x > SPB_EXP_HI)
        x = SPB_EXP_HI;
    float t = x * SPB_LOG2E + SPB_MAGIC;
    float n = t - SPB_MAGIC;
    uint32_t ti, mi;
    float magic = SPB_MAGIC;
    memcpy(&ti, &t, sizeof ti);
    memcpy(&mi, &magic, sizeof mi);
    uint32_t ni = ti - mi; /* n as a two's complement integer, -126..127 */
    float r = x - n * SPB_LN2_HI;
    r = r - n * SPB_LN2_LO;
    float z = r * r;
    float y = SPB_P0;
    y = y * r + SPB_P1;
    y = y * r + SPB_P2;
    y = y * r + SPB_P3;
    y = y * r + SPB_P4;
    y = y * r + SPB_P5;
    y = y * z + r + 1.0f;
    uint32_t si = (ni + 127u) << 23;
    float sc;
    memcpy(&sc, &si, sizeof sc);
    return y * sc;
}

/* ------------------------------------------------------------------------ */
/* Row kernels.  The scalar versions double as the tails of the vector ones. */

static inline float rowmax_tail(const float *s, int j, int n, float m)
{
    for (; j < n; j++)
        if (s[j] > m)
            m = s[j];
    return m;
}

static inline float expsum_tail(float *s, int j, int n, float m, float sum)
{
    for (; j < n; j++) {
        float e = spb_exp_scalar(s[j] - m);
        s[j] = e;
        sum += e;
    }
    return sum;
}

static inline void expsub_tail(float *s, int j, int n, float m)
{
    for (; j < n; j++)
        s[j] = spb_exp_scalar(s[j] - m);
}

static inline void ds_tail(const float *p, float *dp, int j, int n, float di)
{
    for (; j < n; j++)
        dp[j] = p[j] * (dp[j] - di);
}

static inline void scale_tail(float *o, int j, int n, float a)
{
    for (; j < n; j++)
        o[j] *= a;
}

/* Tile-level operations, written once as a template over the row kernels
 * RMAX, EXPSUM, EXPSUB, DS, SCALE (suffix SFX, attributes ATTR). */

/* Forward: S (mr x nc, leading dim ld) holds scaled scores; nvis[r] visible
 * leading columns of row r (NULL: all nc).  Updates m, l, rescales the
 * accumulator rows (mr x D, leading dim D) and leaves P in S (0 where
 * masked). */
#define SPB_DEFINE_TILES(SFX, ATTR, RMAX, EXPSUM, EXPSUB, DS, SCALE)                     \
    ATTR static void fwd_tile_##SFX(float *S, int ld, int mr, int nc, const int *nvis,   \
                                    float *m, float *l, float *acc, int D)               \
    {                                                                                    \
        for (int r = 0; r < mr; r++) {                                                   \
            float *s = S + (size_t)r * ld;                                               \
            int n = nvis ? nvis[r] : nc;                                                 \
            if (n <= 0) {                                                                \
                memset(s, 0, sizeof(float) * (size_t)nc);                                \
                continue;                                                                \
            }                                                                            \
            float mx = RMAX(s, n);                                                       \
            float mold = m[r];                                                           \
            float mnew = mx > mold ? mx : mold;                                          \
            float sum = EXPSUM(s, n, mnew);                                              \
            if (n < nc)                                                                  \
                memset(s + n, 0, sizeof(float) * (size_t)(nc - n));                      \
            if (mnew != mold) {                                                          \
                /* mold == -inf only before the first visible key, when the          \
                 * accumulator and l are still 0: alpha = 0 is then harmless. */     \
                float alpha = spb_exp_scalar(mold - mnew);                               \
                l[r] = l[r] * alpha + sum;                                               \
                SCALE(acc + (size_t)r * D, D, alpha);                                    \
            } else {                                                                     \
                l[r] += sum;                                                             \
            }                                                                            \
            m[r] = mnew;                                                                 \
        }                                                                                \
    }                                                                                    \
    /* Backward: S -> P = exp(S - lse) on visible columns, 0 elsewhere. */              \
    ATTR static void bwd_p_tile_##SFX(float *S, int ld, int mr, int nc, const int *nvis, \
                                      const float *lse)                                  \
    {                                                                                    \
        for (int r = 0; r < mr; r++) {                                                   \
            float *s = S + (size_t)r * ld;                                               \
            int n = nvis ? nvis[r] : nc;                                                 \
            if (n < 0 || !(lse[r] > -INFINITY))                                          \
                n = 0;                                                                   \
            if (n > 0)                                                                   \
                EXPSUB(s, n, lse[r]);                                                    \
            if (n < nc)                                                                  \
                memset(s + n, 0, sizeof(float) * (size_t)(nc - n));                      \
        }                                                                                \
    }                                                                                    \
    /* Backward: dP <- P o (dP - D_r). */                                                \
    ATTR static void bwd_ds_tile_##SFX(const float *P, float *dP, int ld, int mr, int nc, \
                                       const float *Di)                                  \
    {                                                                                    \
        for (int r = 0; r < mr; r++)                                                     \
            DS(P + (size_t)r * ld, dP + (size_t)r * ld, nc, Di[r]);                      \
    }

typedef struct spb_fa_kernels {
    void (*fwd_tile)(float *S, int ld, int mr, int nc, const int *nvis, float *m, float *l,
                     float *acc, int D);
    void (*bwd_p_tile)(float *S, int ld, int mr, int nc, const int *nvis, const float *lse);
    void (*bwd_ds_tile)(const float *P, float *dP, int ld, int mr, int nc, const float *Di);
} spb_fa_kernels;

/* Scalar instantiation (always available). */
static inline float rmax_sc(const float *s, int n) { return rowmax_tail(s, 0, n, -INFINITY); }
static inline float expsum_sc(float *s, int n, float m) { return expsum_tail(s, 0, n, m, 0.0f); }
static inline void expsub_sc(float *s, int n, float m) { expsub_tail(s, 0, n, m); }
static inline void ds_sc(const float *p, float *dp, int n, float di) { ds_tail(p, dp, 0, n, di); }
static inline void scale_sc(float *o, int n, float a) { scale_tail(o, 0, n, a); }
SPB_DEFINE_TILES(sc, , rmax_sc, expsum_sc, expsub_sc, ds_sc, scale_sc)

#if defined(__GNUC__) && !defined(SPB_ATTN_NO_SIMD)
#define SPB_FA_SIMD 1

/* Vector row kernels for vector type VF (W floats) and mask type VI.  The
 * exp is the same sequence of operations as spb_exp_scalar, lane-wise. */
#define SPB_DEFINE_ROWOPS(SFX, ATTR, VF, VI, VU, W)                                      \
    typedef float VF __attribute__((vector_size(4 * (W))));                              \
    typedef int32_t VI __attribute__((vector_size(4 * (W))));                            \
    typedef uint32_t VU __attribute__((vector_size(4 * (W))));                           \
    ATTR static float rmax_##SFX(const float *s, int n)                                  \
    {                                                                                    \
        int j = 0;                                                                       \
        float m = -INFINITY;                                                             \
        if (n >= (W)) {                                                                  \
            VF vm, x;                                                                    \
            memcpy(&vm, s, sizeof vm);                                                   \
            for (j = (W); j + (W) <= n; j += (W)) {                                      \
                memcpy(&x, s + j, sizeof x);                                             \
                VI gt = x > vm;                                                          \
                vm = (VF)(((VI)x & gt) | ((VI)vm & ~gt));                                \
            }                                                                            \
            for (int k = 0; k < (W); k++)                                                \
                if (vm[k] > m)                                                           \
                    m = vm[k];                                                           \
        }                                                                                \
        return rowmax_tail(s, j, n, m);                                                  \
    }                                                                                    \
    ATTR static void expsub_core_##SFX(float *s, int n, float m, int want_sum, float *out) \
    {                                                                                    \
        const VF zero = {0};                                                             \
        const VF lo = zero + SPB_EXP_LO, hi = zero + SPB_EXP_HI;                         \
        const VF magic = zero + SPB_MAGIC;                                               \
        VF vsum = zero;                                                                  \
        int j = 0;                                                                       \
        for (; j + (W) <= n; j += (W)) {                                                 \
            VF x;                                                                        \
            memcpy(&x, s + j, sizeof x);                                                 \
            x = x - m;                                                                   \
            VI under = x < lo;                                                           \
            VI over = x > hi;                                                            \
            x = (VF)(((VI)x & ~under) | ((VI)lo & under));                               \
            x = (VF)(((VI)x & ~over) | ((VI)hi & over));                                 \
            VF t = x * SPB_LOG2E + magic;                                                \
            VF nf = t - magic;                                                           \
            VU ni = (VU)t - (VU)magic;                                                   \
            VF r = x - nf * SPB_LN2_HI;                                                  \
            r = r - nf * SPB_LN2_LO;                                                     \
            VF z = r * r;                                                                \
            VF y = zero + SPB_P0;                                                        \
            y = y * r + SPB_P1;                                                          \
            y = y * r + SPB_P2;                                                          \
            y = y * r + SPB_P3;                                                          \
            y = y * r + SPB_P4;                                                          \
            y = y * r + SPB_P5;                                                          \
            y = y * z + r + 1.0f;                                                        \
            VF sc = (VF)((ni + 127u) << 23);                                             \
            y = y * sc;                                                                  \
            y = (VF)((VI)y & ~under);                                                    \
            memcpy(s + j, &y, sizeof y);                                                 \
            vsum += y;                                                                   \
        }                                                                                \
        if (want_sum) {                                                                  \
            float sum = 0.0f;                                                            \
            for (int k = 0; k < (W); k++)                                                \
                sum += vsum[k];                                                          \
            *out = expsum_tail(s, j, n, m, sum);                                         \
        } else {                                                                         \
            expsub_tail(s, j, n, m);                                                     \
        }                                                                                \
    }                                                                                    \
    ATTR static float expsum_##SFX(float *s, int n, float m)                             \
    {                                                                                    \
        float sum;                                                                       \
        expsub_core_##SFX(s, n, m, 1, &sum);                                             \
        return sum;                                                                      \
    }                                                                                    \
    ATTR static void expsub_##SFX(float *s, int n, float m)                              \
    {                                                                                    \
        expsub_core_##SFX(s, n, m, 0, NULL);                                             \
    }                                                                                    \
    ATTR static void ds_##SFX(const float *p, float *dp, int n, float di)                \
    {                                                                                    \
        int j = 0;                                                                       \
        for (; j + (W) <= n; j += (W)) {                                                 \
            VF a, b;                                                                     \
            memcpy(&a, p + j, sizeof a);                                                 \
            memcpy(&b, dp + j, sizeof b);                                                \
            b = a * (b - di);                                                            \
            memcpy(dp + j, &b, sizeof b);                                                \
        }                                                                                \
        ds_tail(p, dp, j, n, di);                                                        \
    }                                                                                    \
    ATTR static void scale_##SFX(float *o, int n, float a)                               \
    {                                                                                    \
        int j = 0;                                                                       \
        for (; j + (W) <= n; j += (W)) {                                                 \
            VF x;                                                                        \
            memcpy(&x, o + j, sizeof x);                                                 \
            x = x * a;                                                                   \
            memcpy(o + j, &x, sizeof x);                                                 \
        }                                                                                \
        scale_tail(o, j, n, a);                                                          \
    }                                                                                    \
    SPB_DEFINE_TILES(SFX, ATTR, rmax_##SFX, expsum_##SFX, expsub_##SFX, ds_##SFX, scale_##SFX)

SPB_DEFINE_ROWOPS(v4, , spb_v4f, spb_v4i, spb_v4u, 4)

#if (defined(__x86_64__) || defined(__i386__)) && !defined(SPB_ATTN_NO_MULTIVERSION)
#define SPB_FA_X86 1
/* 256- and 512-bit variants: vector types wider than the baseline ISA are
 * only used inside these target functions and never passed by value across
 * a non-inlined call, so the ABI is not affected; silence GCC's note about
 * it anyway. */
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#endif
SPB_DEFINE_ROWOPS(v8, __attribute__((target("avx2,fma"))), spb_v8f, spb_v8i, spb_v8u, 8)
#ifndef SPB_ATTN_NO_AVX512
SPB_DEFINE_ROWOPS(v16, __attribute__((target("avx512f,fma"))), spb_v16f, spb_v16i, spb_v16u, 16)
#endif
#if !defined(__clang__)
#pragma GCC pop_options
#pragma GCC diagnostic pop
#endif
#endif
#endif /* __GNUC__ */

static spb_fa_kernels spb_fa_pick(void)
{
    spb_fa_kernels k = {fwd_tile_sc, bwd_p_tile_sc, bwd_ds_tile_sc};
#ifdef SPB_FA_SIMD
    k.fwd_tile = fwd_tile_v4;
    k.bwd_p_tile = bwd_p_tile_v4;
    k.bwd_ds_tile = bwd_ds_tile_v4;
#ifdef SPB_FA_X86
#ifndef SPB_ATTN_NO_AVX512
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) {
        k.fwd_tile = fwd_tile_v16;
        k.bwd_p_tile = bwd_p_tile_v16;
        k.bwd_ds_tile = bwd_ds_tile_v16;
        return k;
    }
#endif
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        k.fwd_tile = fwd_tile_v8;
        k.bwd_p_tile = bwd_p_tile_v8;
        k.bwd_ds_tile = bwd_ds_tile_v8;
    }
#endif
#endif
    return k;
}

/* ------------------------------------------------------------------------ */
/* Masking geometry. */

/* The visible key spans of the rows of one query tile (spb_attn_row_spans). */
typedef struct fa_rows {
    int n[SPB_FA_BR];
    int span[SPB_FA_BR][4];
} fa_rows;

/* Fills rs for rows [i0, i0+mr); returns one past the last key any of them
 * sees (0: none).  Not simply the last row's end: under a sparse pattern the
 * local window of later rows may have moved past this key block. */
static int fa_rows_init(const spb_attn_desc *d, int i0, int mr, fa_rows *rs)
{
    int kend = 0;
    for (int r = 0; r < mr; r++) {
        int n = rs->n[r] = spb_attn_row_spans(d, i0 + r, rs->span[r]);
        if (n && rs->span[r][2 * n - 1] > kend)
            kend = rs->span[r][2 * n - 1];
    }
    return kend;
}

enum { FA_NONE, FA_ALL, FA_PART };

/* Which of the query tile's rows [i0, i0+mr) see which of the key tile's
 * columns [j0, j0+nc): none at all, all of them, or some. */
static int fa_tile_class(const spb_attn_desc *d, const fa_rows *rs, int i0, int mr, int j0, int nc)
{
    if (d->sparse_block <= 0) {
        if (!d->causal || d->k_offset + j0 + nc - 1 <= d->q_offset + i0)
            return FA_ALL;
        if (d->k_offset + j0 > d->q_offset + i0 + mr - 1)
            return FA_NONE;
        return FA_PART;
    }
    long vis = 0;
    for (int r = 0; r < mr; r++)
        for (int s = 0; s < rs->n[r]; s++) {
            int a = rs->span[r][2 * s] > j0 ? rs->span[r][2 * s] : j0;
            int b = rs->span[r][2 * s + 1] < j0 + nc ? rs->span[r][2 * s + 1] : j0 + nc;
            if (b > a)
                vis += b - a;
        }
    return vis == 0 ? FA_NONE : vis == (long)mr * nc ? FA_ALL : FA_PART;
}

/* For a key tile of class FA_PART, once S (leading dim ld) holds the
 * scores: nvis[r] = one past row r's last visible column of the tile (0:
 * none), and masked columns before it set to -INFINITY in S (only sparse
 * masks have such holes).  Returns nvis. */
static const int *fa_tile_mask(const fa_rows *rs, int mr, int j0, int nc, float *S, int ld,
                               int *nvis)
{
    for (int r = 0; r < mr; r++) {
        float *row = S + (size_t)r * ld;
        int c = 0; /* columns before c are handled */
        nvis[r] = 0;
        for (int s = 0; s < rs->n[r]; s++) {
            int a = (rs->span[r][2 * s] > j0 ? rs->span[r][2 * s] : j0) - j0;
            int b = (rs->span[r][2 * s + 1] < j0 + nc ? rs->span[r][2 * s + 1] : j0 + nc) - j0;
            if (b <= a)
                continue;
            for (; c < a; c++)
                row[c] = -INFINITY;
            c = b;
            nvis[r] = b;
        }
    }
    return nvis;
}

/* ------------------------------------------------------------------------ */

static void fa_forward_tile(const spb_attn_desc *d, const spb_fa_kernels *kern, int b, int h,
                            int i0, const float *q, const float *k, const float *v, float *o,
                            float *lse, float *S, float *acc, float *m, float *l, int *nvis,
                            fa_rows *rs)
{
    const int D = d->head_dim;
    const int mr = d->q_len - i0 < SPB_FA_BR ? d->q_len - i0 : SPB_FA_BR;
    const float *qt = q + b * d->q_batch_stride + i0 * d->q_token_stride + (long)h * D;
    const float *kb = k + b * d->k_batch_stride + (long)spb_attn_kv_head(d, h) * D;
    const float *vb = v + b * d->k_batch_stride + (long)spb_attn_kv_head(d, h) * D;
    /* keys beyond kend are masked for every row of this tile */
    const int kend = fa_rows_init(d, i0, mr, rs);

    for (int r = 0; r < mr; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * (size_t)mr * D);

    for (int j0 = 0; j0 < kend; j0 += SPB_FA_BC) {
        const int nc = kend - j0 < SPB_FA_BC ? kend - j0 : SPB_FA_BC;
        const int cls = fa_tile_class(d, rs, i0, mr, j0, nc);
        if (cls == FA_NONE)
            continue;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mr, nc, D, d->scale, qt,
                    (int)d->q_token_stride, kb + j0 * d->k_token_stride, (int)d->k_token_stride,
                    0.0f, S, SPB_FA_BC);
        const int *mask = cls == FA_ALL ? NULL : fa_tile_mask(rs, mr, j0, nc, S, SPB_FA_BC, nvis);
        kern->fwd_tile(S, SPB_FA_BC, mr, nc, mask, m, l, acc, D);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mr, D, nc, 1.0f, S, SPB_FA_BC,
                    vb + j0 * d->k_token_stride, (int)d->k_token_stride, 1.0f, acc, D);
    }

    float *lt = lse + ((long)b * d->heads + h) * d->q_len + i0;
    for (int r = 0; r < mr; r++) {
        float *orow = o + b * d->o_batch_stride + (long)(i0 + r) * d->o_token_stride + (long)h * D;
        const float *arow = acc + (size_t)r * D;
        if (l[r] > 0.0f) {
            const float inv = 1.0f / l[r];
            for (int c = 0; c < D; c++)
                orow[c] = arow[c] * inv;
            lt[r] = m[r] + logf(l[r]);
        } else {
            for (int c = 0; c < D; c++)
                orow[c] = 0.0f;
            lt[r] = -INFINITY;
        }
    }
}

static void flash_forward(const spb_attn_desc *d, const float *q, const float *k,
                          const float *v, float *o, float *lse)
{
    if (d->batch <= 0 || d->heads <= 0 || d->q_len <= 0 || d->head_dim <= 0)
        return;
    const spb_fa_kernels kern = spb_fa_pick();
    const int D = d->head_dim;
    const int ntiles = (d->q_len + SPB_FA_BR - 1) / SPB_FA_BR;
    const long nwork = (long)d->batch * d->heads * ntiles;
    int failed = 0;

#ifdef _OPENMP
#pragma omp parallel if (nwork > 1) reduction(| : failed)
#endif
    {
        float *S = malloc(sizeof(float) * (size_t)SPB_FA_BR * SPB_FA_BC);
        float *acc = malloc(sizeof(float) * (size_t)SPB_FA_BR * D);
        float m[SPB_FA_BR], l[SPB_FA_BR];
        int nvis[SPB_FA_BR];
        fa_rows rs;
        if (!S || !acc)
            failed = 1;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (long w = 0; w < nwork; w++) {
            if (!S || !acc)
                continue;
            /* the longest (last, under a causal mask) query tiles first */
            const int t = ntiles - 1 - (int)(w % ntiles);
            const long bh = w / ntiles;
            fa_forward_tile(d, &kern, (int)(bh / d->heads), (int)(bh % d->heads),
                            t * SPB_FA_BR, q, k, v, o, lse, S, acc, m, l, nvis, &rs);
        }
        free(S);
        free(acc);
    }
    if (failed)
        abort();
}

static void fa_backward_head(const spb_attn_desc *d, const spb_fa_kernels *kern, int b, int h,
                             const float *q, const float *k, const float *v, const float *o,
                             const float *lse, const float *dout, float *dq, float *dk,
                             float *dv, float *S, float *dP, float *Di, int *nvis, fa_rows *rs)
{
    const int D = d->head_dim;
    const float *qb = q + b * d->q_batch_stride + (long)h * D;
    const float *kb = k + b * d->k_batch_stride + (long)spb_attn_kv_head(d, h) * D;
    const float *vb = v + b * d->k_batch_stride + (long)spb_attn_kv_head(d, h) * D;
    const long obase = b * d->o_batch_stride + (long)h * D;
    float *dqb = dq + b * d->q_batch_stride + (long)h * D; /* dQ has Q's layout */
    float *dkb = dk + b * d->k_batch_stride + (long)spb_attn_kv_head(d, h) * D;
    float *dvb = dv + b * d->k_batch_stride + (long)spb_attn_kv_head(d, h) * D;
    const float *lb = lse + ((long)b * d->heads + h) * d->q_len;
    const int qts = (int)d->q_token_stride, kts = (int)d->k_token_stride;
    const int ots = (int)d->o_token_stride;

    for (int i0 = 0; i0 < d->q_len; i0 += SPB_FA_BR) {
        const int mr = d->q_len - i0 < SPB_FA_BR ? d->q_len - i0 : SPB_FA_BR;
        const int kend = fa_rows_init(d, i0, mr, rs);
        if (kend <= 0)
            continue;
        const float *qt = qb + i0 * d->q_token_stride;
        const float *dot = dout + obase + i0 * d->o_token_stride;
        float *dqt = dqb + i0 * d->q_token_stride;
        const float *lt = lb + i0;
        int any = 0;
        for (int r = 0; r < mr; r++) {
            const float *orow = o + obase + (long)(i0 + r) * d->o_token_stride;
            const float *drow = dot + (long)r * d->o_token_stride;
            double acc = 0.0;
            for (int c = 0; c < D; c++)
                acc += (double)drow[c] * orow[c];
            Di[r] = (float)acc;
            any |= lt[r] > -INFINITY;
        }
        if (!any)
            continue; /* no row of this tile sees any key */

        for (int j0 = 0; j0 < kend; j0 += SPB_FA_BC) {
            const int nc = kend - j0 < SPB_FA_BC ? kend - j0 : SPB_FA_BC;
            const int cls = fa_tile_class(d, rs, i0, mr, j0, nc);
            if (cls == FA_NONE)
                continue;
            const float *kt = kb + j0 * d->k_token_stride;
            const float *vt = vb + j0 * d->k_token_stride;
            /* S = scale Q K^T, then P = exp(S - lse) (masked) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mr, nc, D, d->scale, qt, qts,
                        kt, kts, 0.0f, S, SPB_FA_BC);
            const int *mask = cls == FA_ALL ? NULL : fa_tile_mask(rs, mr, j0, nc, S, SPB_FA_BC, nvis);
            kern->bwd_p_tile(S, SPB_FA_BC, mr, nc, mask, lt);
            /* dV += P^T dO */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, D, mr, 1.0f, S, SPB_FA_BC,
                        dot, ots, 1.0f, dvb + j0 * d->k_token_stride, kts);
            /* dP = dO V^T, then dS = P o (dP - D) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mr, nc, D, 1.0f, dot, ots, vt,
                        kts, 0.0f, dP, SPB_FA_BC);
            kern->bwd_ds_tile(S, dP, SPB_FA_BC, mr, nc, Di);
            /* dQ += scale dS K;  dK += scale dS^T Q */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mr, D, nc, d->scale, dP,
                        SPB_FA_BC, kt, kts, 1.0f, dqt, qts);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, D, mr, d->scale, dP,
                        SPB_FA_BC, qt, qts, 1.0f, dkb + j0 * d->k_token_stride, kts);
        }
    }
}

static void flash_backward(const spb_attn_desc *d, const float *q, const float *k,
                           const float *v, const float *o, const float *lse,
                           const float *dout, float *dq, float *dk, float *dv)
{
    if (d->batch <= 0 || d->heads <= 0 || d->q_len <= 0 || d->k_len <= 0 || d->head_dim <= 0)
        return;
    const spb_fa_kernels kern = spb_fa_pick();
    /* One work item per (sequence, K/V head): the query heads that share a
     * K/V head accumulate into its dK and dV, so they run in one item. */
    const int kvh = spb_attn_kv_heads(d), group = d->heads / kvh;
    const long nwork = (long)d->batch * kvh;
    int failed = 0;

#ifdef _OPENMP
#pragma omp parallel if (nwork > 1) reduction(| : failed)
#endif
    {
        float *S = malloc(sizeof(float) * (size_t)SPB_FA_BR * SPB_FA_BC);
        float *dP = malloc(sizeof(float) * (size_t)SPB_FA_BR * SPB_FA_BC);
        float Di[SPB_FA_BR];
        int nvis[SPB_FA_BR];
        fa_rows rs;
        if (!S || !dP)
            failed = 1;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (long w = 0; w < nwork; w++) {
            if (!S || !dP)
                continue;
            for (int h = (int)(w % kvh) * group; h < (int)(w % kvh + 1) * group; h++)
                fa_backward_head(d, &kern, (int)(w / kvh), h, q, k, v, o, lse, dout, dq, dk, dv, S, dP, Di,
                                 nvis, &rs);
        }
        free(S);
        free(dP);
    }
    if (failed)
        abort();
}

const spb_attn_backend spb_attn_flash = {
    "flash",
    flash_forward,
    flash_backward,
};
