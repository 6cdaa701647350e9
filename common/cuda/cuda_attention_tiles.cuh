/* Part of cuda_attention.cu (its first comment describes every kernel family):
 * The FAST kernels' building blocks: cp.async row loads, ldmatrix operands,
 * mma.sync groups, the online softmax and the backward's elementwise steps per
 * tile, shared by the mma.sync and the wgmma kernels.
 * Split off for length, not an interface: included once, by
 * cuda_attention.cu only, in the order there, and it uses what the parts
 * before it define (one translation unit; the CUDA emulation's
 * translate.py inlines it). */
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
