/* Part of cuda_attention.cu (its first comment describes every kernel family):
 * Hopper's forward on warpgroup products (fwd_wgmma, the pipelined
 * fwd_wgmma_pipe), their core-matrix tiles, and the probe that says whether
 * this compilation has wgmma.
 * Split off for length, not an interface: included once, by
 * cuda_attention.cu only, in the order there, and it uses what the parts
 * before it define (one translation unit; the CUDA emulation's
 * translate.py inlines it). */
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

/* 1 where this compilation of the device code has wgmma (sm_90a, or the emulation) */
__global__ void wgmma_probe(int *out)
{
#ifdef SPB_WGMMA_HERE
    *out = 1;
#else
    *out = 0;
#endif
}
