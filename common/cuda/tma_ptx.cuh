/* Hopper's copy engine for tiles (the Tensor Memory Accelerator) and the
 * shared-memory barriers it completes, each behind one small function as
 * warpgroup_ptx.cuh does for wgmma (sm_90; built where wgmma is, so that
 * one probe answers for all).  Under the CPU emulation (SPB_CUDA_EMU) each
 * calls the emulator's model (emu_tma.cc); compiled for another target the
 * functions trap.
 *
 * mbarrier (PTX ISA, "Parallel Synchronization and Communication
 * Instructions: mbarrier"): 8 bytes of shared memory holding a phase, a
 * count of arrivals still expected in it and a transaction count in bytes.
 * A phase completes when every expected thread has arrived and every byte
 * announced by arrive.expect_tx has been delivered; a thread waits for the
 * phase of a given parity (0, 1, 0, ...) to complete.  A fresh barrier is in
 * phase 0, so a wait for parity 1 passes at once: that is how a producer
 * takes the first round of empty stages without an arrival.
 *
 * The tensor copy (cp.async.bulk.tensor.4d.shared::cluster.global.tile.
 * mbarrier::complete_tx::bytes): one box of a tensor map (a __grid_constant__
 * kernel parameter, made on the host by cuTensorMapEncodeTiled; rows past
 * the tensor's end arrive as zeros) lands in shared memory and counts its
 * bytes on the barrier.  With the 128-byte swizzle the destination is 1024
 * bytes aligned and holds rows of 128 bytes whose 16-byte chunk c of row r
 * lies at chunk c ^ (r % 8): wgmma's 128-byte-swizzled operand layout
 * (spb_wgmma_desc_sw128). */
#ifndef SPB_TMA_PTX_CUH
#define SPB_TMA_PTX_CUH

#include <stdint.h>

#include "warpgroup_ptx.cuh"

__device__ __forceinline__ void spb_mbarrier_init(uint64_t *bar, unsigned count)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_mbarrier_init(bar, count);
#elif defined(SPB_WGMMA_HERE)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(spb_smem_offset(bar)), "r"(count) : "memory");
#else
    (void)bar, (void)count;
    __trap();
#endif
}
/* the barriers' initialisation, visible to the copy engine (then a
 * __syncthreads publishes it to the block) */
__device__ __forceinline__ void spb_fence_mbarrier_init(void)
{
#if defined(SPB_WGMMA_HERE) && !defined(SPB_CUDA_EMU)
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void spb_mbarrier_arrive(uint64_t *bar)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_mbarrier_arrive(bar);
#elif defined(SPB_WGMMA_HERE)
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(spb_smem_offset(bar)) : "memory");
#else
    (void)bar;
    __trap();
#endif
}
/* announces `bytes` of tensor copies on the barrier, and arrives */
__device__ __forceinline__ void spb_mbarrier_arrive_expect_tx(uint64_t *bar, unsigned bytes)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_mbarrier_arrive_expect_tx(bar, bytes);
#elif defined(SPB_WGMMA_HERE)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(spb_smem_offset(bar)), "r"(bytes)
                 : "memory");
#else
    (void)bar, (void)bytes;
    __trap();
#endif
}
/* until the barrier's phase of this parity has completed */
__device__ __forceinline__ void spb_mbarrier_wait(uint64_t *bar, unsigned parity)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_mbarrier_wait(bar, parity);
#elif defined(SPB_WGMMA_HERE)
    asm volatile("{\n.reg .pred done;\n"
                 "spb_mbarrier_wait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra spb_mbarrier_wait_%=;\n}\n" ::"r"(spb_smem_offset(bar)),
                 "r"(parity)
                 : "memory");
#else
    (void)bar, (void)parity;
    __trap();
#endif
}

/* box (c0, c1, c2, c3) of the 4-dimensional tensor map into dst (shared),
 * its bytes counted on bar */
__device__ __forceinline__ void spb_tma_load_4d(void *dst, const void *map, int c0, int c1, int c2, int c3,
                                                uint64_t *bar)
{
#if defined(SPB_CUDA_EMU)
    const int coords[4] = {c0, c1, c2, c3};
    spb_emu_tma_load(dst, map, coords, 4, bar);
#elif defined(SPB_WGMMA_HERE)
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3, %4, %5}], [%6];\n" ::"r"(spb_smem_offset(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(spb_smem_offset(bar))
                 : "memory");
#else
    (void)dst, (void)map, (void)c0, (void)c1, (void)c2, (void)c3, (void)bar;
    __trap();
#endif
}

/* Named barriers (bar.sync / bar.arrive with an id and a thread count, a
 * multiple of 32): `count` threads meet at barrier `id` (1..15; 0 is
 * __syncthreads'); SYNC waits for the others, else the thread only
 * arrives.  The consumers' ping-pong (FlashAttention-3): a warpgroup syncs
 * on its own barrier before it issues its products, arrives on the
 * other's after. */
template <bool SYNC> __device__ __forceinline__ void spb_named_barrier(int id, int count)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_named_barrier(id, count, SYNC);
#else
    if (SYNC)
        asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
    else
        asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
#endif
}

/* setmaxnreg: every warp of a warpgroup takes registers from the block's
 * pool (TAKE: the consumers, so that they hold more than the launch
 * bounds' even share) or gives them back (the producer) to N per thread; a
 * hint the emulation has no use for */
template <int N, bool TAKE> __device__ __forceinline__ void spb_setmaxnreg(void)
{
#if defined(SPB_WGMMA_HERE) && !defined(SPB_CUDA_EMU)
    if (TAKE)
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
    else
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

/* The descriptor of a 128-byte-swizzled operand (bits 62-63: 1) at p:
 * K-major, rows of 128 bytes, 8-row groups SBO bytes apart (LBO unused),
 * p moved on 32 bytes per k16 step inside the row; MN-major, 64 elements
 * of N per 128-byte row, the next 64 LBO bytes on, 8 rows of K SBO bytes
 * apart.  The swizzle applies to the address bits (p's 1024-byte atom). */
__device__ __forceinline__ uint64_t spb_wgmma_desc_sw128(const void *p, uint32_t lbo, uint32_t sbo)
{
    return spb_wgmma_desc(p, lbo, sbo) | (uint64_t)1 << 62;
}

#endif
