/* Part of cuda_attention.cu (its first comment describes every kernel family):
 * The backward in one kernel on FlashAttention-2's tiling (dkvq_exchange),
 * with dQ added by 8-byte reductions or by the copy engine (BULK).
 * Split off for length, not an interface: included once, by
 * cuda_attention.cu only, in the order there, and it uses what the parts
 * before it define (one translation unit; the CUDA emulation's
 * translate.py inlines it). */
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
