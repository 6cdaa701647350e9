/* Hopper's warpgroup tensor-core instructions (sm_90a), each behind one
 * small function as warp_ptx.cuh does for mma.sync: wgmma.mma_async with
 * its fence, commit and wait, the shared-memory matrix descriptor, the
 * async-proxy fence, and the bulk reduction from shared to global memory
 * with its commit and waits (sm_90; built where wgmma is, so that one
 * probe answers for both).  Under the CPU emulation (SPB_CUDA_EMU) each calls the
 * emulator's model, written from the PTX ISA (emu_wgmma.cc).  Compiled for
 * another target (sm_80, or sm_90 without the "a"), the functions trap: the
 * launcher asks spb_wgmma_built() first.
 *
 * wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}: the 128 threads of
 * a warpgroup (warps 4w..4w+3 of the block) compute D(64xN) = A(64x16) ·
 * B(16xN) + D.  D is N/2 fp32 registers per thread laid out as mma.sync's
 * C fragments: warp w of the group holds rows 16w..16w+15 and register
 * 4i + e holds (row 16w + g + 8(e >= 2), column 8i + 2t + (e & 1)),
 * g = lane / 4, t = lane % 4.  A comes from shared memory (a descriptor) or
 * from four registers per thread in mma.sync's A layout (warp w: rows
 * 16w..); B always from shared memory.
 *
 * A shared-memory operand is made of core matrices of 8 rows x 16 bytes
 * (8 elements), each 128 contiguous bytes, row r of it at byte 16 r.  The
 * descriptor (no swizzle, the only mode used here) names the first core
 * matrix and two strides, in the ISA's canonical layouts:
 *   K-major (A, or B with trans-b 0): element (row m, k) at
 *     start + 16 (m % 8) + SBO (m / 8) + 2 (k % 8) + LBO (k / 8)
 *   MN-major (B with trans-b 1): element (k, n) at
 *     start + 2 (n % 8) + SBO (n / 8) + 16 (k % 8) + LBO (k / 8)
 * Bits: 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 62-63 swizzle (0).
 *
 * Ordering (PTX ISA, "Async Proxy" and wgmma.fence): wgmma reads shared
 * memory in the async proxy, so writes to its operands are followed by
 * fence.proxy.async before the barrier that publishes them; wgmma.fence
 * before the first wgmma of a batch whose accumulators or A registers
 * ordinary code touched; the accumulators are read only after a
 * wait_group that covers the wgmma; its shared operands are overwritten
 * only after that wait too. */
#ifndef SPB_WARPGROUP_PTX_CUH
#define SPB_WARPGROUP_PTX_CUH

#include <stdint.h>

#if defined(SPB_CUDA_EMU) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SPB_WGMMA_HERE 1 /* this compilation has the instructions */
#endif

/* where p lies in the block's shared memory window (bytes) */
__device__ __forceinline__ uint32_t spb_smem_offset(const void *p)
{
#ifdef SPB_CUDA_EMU
    return (uint32_t)((const unsigned char *)p - (const unsigned char *)spb_emu_dynamic_shared());
#else
    return (uint32_t)__cvta_generic_to_shared(p);
#endif
}

/* the descriptor of a no-swizzle operand starting at p (16-byte aligned) */
__device__ __forceinline__ uint64_t spb_wgmma_desc(const void *p, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((spb_smem_offset(p) & 0x3FFFFu) >> 4) | (uint64_t)((lbo & 0x3FFFFu) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFFu) >> 4) << 32;
}
/* the same descriptor moved on by `bytes` (a multiple of 16; the start
 * field does not carry into the next) */
__device__ __forceinline__ uint64_t spb_wgmma_desc_add(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

__device__ __forceinline__ void spb_wgmma_fence(void)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_wgmma_fence();
#elif defined(SPB_WGMMA_HERE)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void spb_wgmma_commit(void)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_wgmma_commit();
#elif defined(SPB_WGMMA_HERE)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}
/* at most N of this warpgroup's committed groups still in flight */
template <int N> __device__ __forceinline__ void spb_wgmma_wait(void)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_wgmma_wait(N);
#elif defined(SPB_WGMMA_HERE)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
    __trap();
#endif
}
/* this thread's generic-proxy writes to shared memory, ordered before
 * later async-proxy reads (wgmma, the bulk reduction) */
__device__ __forceinline__ void spb_fence_proxy_async(void)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_fence_proxy_async();
#elif defined(SPB_WGMMA_HERE)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* dst (global) += src (this block's shared memory), `bytes` of fp32 (a
 * multiple of 16, both addresses 16-byte aligned), added at L2 by the
 * bulk-copy engine (cp.reduce.async.bulk, sm_90): FlashAttention-3's dQ
 * accumulation, one instruction per row instead of an atomic per element.
 * The engine reads src in the async proxy: the threads that wrote it issue
 * spb_fence_proxy_async before the barrier that precedes the issue; src is
 * overwritten only after a spb_bulk_wait_read that covers the operation,
 * and the thread waits (spb_bulk_wait) before it ends. */
__device__ __forceinline__ void spb_bulk_reduce_add_f32(float *dst, const float *src, uint32_t bytes)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_bulk_reduce_add_f32(dst, src, bytes);
#elif defined(SPB_WGMMA_HERE)
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(spb_smem_offset(src)), "r"(bytes)
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes;
    __trap();
#endif
}
/* closes this thread's group of bulk operations */
__device__ __forceinline__ void spb_bulk_commit(void)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_bulk_commit();
#elif defined(SPB_WGMMA_HERE)
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#else
    __trap();
#endif
}
/* at most N of this thread's bulk groups may still read their source */
template <int N> __device__ __forceinline__ void spb_bulk_wait_read(void)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_bulk_wait(N, 1);
#elif defined(SPB_WGMMA_HERE)
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#else
    __trap();
#endif
}
/* at most N of this thread's bulk groups unfinished */
template <int N> __device__ __forceinline__ void spb_bulk_wait(void)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_bulk_wait(N, 0);
#elif defined(SPB_WGMMA_HERE)
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#else
    __trap();
#endif
}

#define SPB_F4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define SPB_F16(d, i) SPB_F4(d, i), SPB_F4(d, i + 4), SPB_F4(d, i + 8), SPB_F4(d, i + 12)
#define SPB_F32(d, i) SPB_F16(d, i), SPB_F16(d, i + 16)
#define SPB_R16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define SPB_R32                                                                                                       \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%" \
    "30,%31}"
#define SPB_R64                                                                                                       \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%" \
    "30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%" \
    "58,%59,%60,%61,%62,%63}"

/* d[32] (m64n64, fp32) = A · B (+ d when accumulate), both from shared
 * memory, both K-major */
template <int FP16>
__device__ __forceinline__ void spb_wgmma_m64n64_ss(float *d, uint64_t a_desc, uint64_t b_desc, int accumulate)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_wgmma(FP16, 64, d, nullptr, a_desc, b_desc, accumulate, 0);
#elif defined(SPB_WGMMA_HERE)
#define SPB_WGMMA_SS(TY)                                                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                         \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " SPB_R32 ", %32, %33, p, 1, 1, 0, 0;\n}\n" \
                 : SPB_F32(d, 0)                                                                                      \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate))
    if (FP16)
        SPB_WGMMA_SS("f16");
    else
        SPB_WGMMA_SS("bf16");
#undef SPB_WGMMA_SS
#else
    (void)d, (void)a_desc, (void)b_desc, (void)accumulate;
    __trap();
#endif
}

/* d[N/2] (m64nN, fp32, N = 32 or 64) = A · B (+ d when accumulate), both
 * from shared memory: A K-major, B MN-major (trans-b) */
template <int FP16, int N>
__device__ __forceinline__ void spb_wgmma_m64nN_ss_mn(float *d, uint64_t a_desc, uint64_t b_desc, int accumulate)
{
    static_assert(N == 32 || N == 64, "wgmma m64nNk16 with N = 32 or 64 here");
#if defined(SPB_CUDA_EMU)
    spb_emu_wgmma(FP16, N, d, nullptr, a_desc, b_desc, accumulate, 1);
#elif defined(SPB_WGMMA_HERE)
#define SPB_WGMMA_SS32(TY)                                                                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                         \
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " " SPB_R16 ", %16, %17, p, 1, 1, 0, 1;\n}\n" \
                 : SPB_F16(d, 0)                                                                                      \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate))
#define SPB_WGMMA_SS64(TY)                                                                                            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                         \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " SPB_R32 ", %32, %33, p, 1, 1, 0, 1;\n}\n" \
                 : SPB_F32(d, 0)                                                                                      \
                 : "l"(a_desc), "l"(b_desc), "r"(accumulate))
    if (N == 32) {
        if (FP16)
            SPB_WGMMA_SS32("f16");
        else
            SPB_WGMMA_SS32("bf16");
    } else {
        if (FP16)
            SPB_WGMMA_SS64("f16");
        else
            SPB_WGMMA_SS64("bf16");
    }
#undef SPB_WGMMA_SS32
#undef SPB_WGMMA_SS64
#else
    (void)d, (void)a_desc, (void)b_desc, (void)accumulate;
    __trap();
#endif
}

/* d[N/2] (m64nN, fp32, N = 64 or 128) += A · B, A from four registers per
 * thread, B from shared memory, MN-major (trans-b) */
template <int FP16, int N>
__device__ __forceinline__ void spb_wgmma_m64nN_rs_mn(float *d, const uint32_t a[4], uint64_t b_desc)
{
    static_assert(N == 64 || N == 128, "wgmma m64nNk16 with N = 64 or 128 here");
#if defined(SPB_CUDA_EMU)
    spb_emu_wgmma(FP16, N, d, a, 0, b_desc, 1, 1);
#elif defined(SPB_WGMMA_HERE)
#define SPB_WGMMA_RS64(TY)                                                                                            \
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " SPB_R32                                  \
                 ", {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n"                                                            \
                 : SPB_F32(d, 0)                                                                                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc))
#define SPB_WGMMA_RS128(TY)                                                                                           \
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " SPB_R64                                 \
                 ", {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"                                                            \
                 : SPB_F32(d, 0), SPB_F32(d, 32)                                                                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc))
    if (N == 64) {
        if (FP16)
            SPB_WGMMA_RS64("f16");
        else
            SPB_WGMMA_RS64("bf16");
    } else {
        if (FP16)
            SPB_WGMMA_RS128("f16");
        else
            SPB_WGMMA_RS128("bf16");
    }
#undef SPB_WGMMA_RS64
#undef SPB_WGMMA_RS128
#else
    (void)d, (void)a, (void)b_desc;
    __trap();
#endif
}

#endif
