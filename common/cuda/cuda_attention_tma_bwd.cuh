/* Part of cuda_attention.cu (its first comment describes every kernel family):
 * The fused wgmma backward fed as FlashAttention-3 feeds it: a producer
 * warpgroup, the copy engine and mbarriers (dkv_wgmma_tma).
 * Split off for length, not an interface: included once, by
 * cuda_attention.cu only, in the order there, and it uses what the parts
 * before it define (one translation unit; the CUDA emulation's
 * translate.py inlines it). */
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
