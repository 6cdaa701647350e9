/* Part of cuda_attention.cu (its first comment describes every kernel family):
 * The FAST kernels on mma.sync: forward, dQ, dK/dV (split or with dQ fused).
 * Split off for length, not an interface: included once, by
 * cuda_attention.cu only, in the order there, and it uses what the parts
 * before it define (one translation unit; the CUDA emulation's
 * translate.py inlines it). */
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
