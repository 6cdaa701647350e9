/* Part of cuda_attention.cu (its first comment describes every kernel family):
 * FlashAttention-3's forward: a producer warp feeding two consumer warpgroups
 * through the copy engine (TMA) and mbarriers (fwd_wgmma_tma).
 * Split off for length, not an interface: included once, by
 * cuda_attention.cu only, in the order there, and it uses what the parts
 * before it define (one translation unit; the CUDA emulation's
 * translate.py inlines it). */
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
