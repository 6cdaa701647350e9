/* Over 700 lines: the switches, launchers and dispatch of every kernel family, which share its statics; the kernels are in its cuda_attention_*.cuh parts. */
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

/* The kernel families, one file each, in the order they build on each other. */
#include "cuda_attention_common.cuh"
#include "cuda_attention_simple.cuh"
#include "cuda_attention_tiles.cuh"
#include "cuda_attention_fast.cuh"
#include "cuda_attention_exchange.cuh"
#include "cuda_attention_wgmma_fwd.cuh"
#include "cuda_attention_tma_fwd.cuh"
#include "cuda_attention_wgmma_bwd.cuh"
#include "cuda_attention_tma_bwd.cuh"

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
    /* grouped-query attention: the fast families (mma, wgmma, TMA, the
     * exchange backward) take as many K/V heads as query heads; the simple
     * kernels map each query head to its K/V head */
    if (spb_attn_kv_heads(d) != d->heads) return 0;
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
        dim3 gq((d->q_len + ST - 1) / ST, d->heads, d->batch),
            gk((d->k_len + ST - 1) / ST, spb_attn_kv_heads(d), d->batch); /* dK, dV: one block row per K/V head */
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
