/* Part of cuda_attention.cu (its first comment describes every kernel family):
 * Hopper's backward on warpgroup products: dq_wgmma, dkv_wgmma (split, or
 * with dQ fused).
 * Split off for length, not an interface: included once, by
 * cuda_attention.cu only, in the order there, and it uses what the parts
 * before it define (one translation unit; the CUDA emulation's
 * translate.py inlines it). */
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
