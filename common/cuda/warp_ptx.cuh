/* The warp-level PTX instructions the fast attention kernels use, each
 * behind one small function, and nowhere else as inline assembly: the
 * tensor-core product, ldmatrix (shared memory to operand fragments),
 * cp.async (global to shared memory without a trip through registers) and
 * ex2.approx (2^x on the special-function unit) and the 8-byte fp32
 * reduction to global memory.
 * Under the CPU emulation (SPB_CUDA_EMU, common/cuda/emu) each calls the
 * emulator's model of the instruction instead, written from the PTX ISA.
 *
 * ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l supplies the
 * address of row l % 8 of matrix l / 8 (16 contiguous bytes, 16-byte
 * aligned); register i of every lane receives from matrix i the elements
 * (row l / 4, columns 2(l % 4), 2(l % 4) + 1), or with .trans the elements
 * (rows 2(l % 4), 2(l % 4) + 1, column l / 4): the transpose, for an
 * operand whose k index runs down the rows in memory.
 *
 * cp.async.cg.shared.global [dst], [src], 16, src_bytes: 16 bytes, the
 * last 16 - src_bytes of them zeros (src_bytes 0: nothing is read).  The
 * copies a thread issued since its last commit_group form a group;
 * wait_group N waits until at most N of the thread's groups are still in
 * flight.  The waiting thread sees its own copies; other threads see them
 * after a __syncthreads that follows the wait. */
#ifndef SPB_WARP_PTX_CUH
#define SPB_WARP_PTX_CUH

#include <stdint.h>

/* Before a loop over the index of a register array whose body is too big
 * for nvcc's unrolling heuristics: unrolled, the array stays in registers;
 * rolled, it goes to local memory (ptxas's "stack frame").  Nothing under
 * the CPU emulation, whose compiler does not know the pragma. */
#ifdef SPB_CUDA_EMU
#define SPB_UNROLL
#else
#define SPB_UNROLL _Pragma("unroll")
#endif

/* D = A·B + D, m16n8k16, 16-bit inputs (fp16 when `fp16`, else bf16), fp32 accumulators */
template <int fp16>
__device__ __forceinline__ void spb_mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
#ifdef SPB_CUDA_EMU
    spb_emu_mma_m16n8k16(fp16, c, a, b0, b1);
#else
    if (fp16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* Four 8x8 matrices of 16-bit elements; `row` is this lane's row address. */
__device__ __forceinline__ void spb_ldmatrix_x4(uint32_t r[4], const void *row)
{
#ifdef SPB_CUDA_EMU
    spb_emu_ldmatrix_x4(r, row, 0);
#else
    unsigned s = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#endif
}
__device__ __forceinline__ void spb_ldmatrix_x4_trans(uint32_t r[4], const void *row)
{
#ifdef SPB_CUDA_EMU
    spb_emu_ldmatrix_x4(r, row, 1);
#else
    unsigned s = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
#endif
}

/* 16 bytes from global `src` to shared `dst`; only the first `src_bytes`
 * (0 or 16 here) are read, the rest are zeros */
__device__ __forceinline__ void spb_cp_async16(void *dst, const void *src, int src_bytes)
{
#ifdef SPB_CUDA_EMU
    spb_emu_cp_async16(dst, src, src_bytes);
#else
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(src_bytes) : "memory");
#endif
}
__device__ __forceinline__ void spb_cp_async_commit(void)
{
#ifdef SPB_CUDA_EMU
    spb_emu_cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/* at most N of this thread's committed groups still in flight */
template <int N> __device__ __forceinline__ void spb_cp_async_wait(void)
{
#ifdef SPB_CUDA_EMU
    spb_emu_cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* p[0] += a, p[1] += b in global memory (p 8-byte aligned), nothing read
 * back: one 8-byte reduction (red.global.add.v2.f32, sm_90) where the
 * target has it, else two atomicAdd.  The fused dQ's adds: a warp's
 * fragment pairs are adjacent columns, so half the instructions and one L2
 * request per 32-byte sector instead of two. */
__device__ __forceinline__ void spb_red_add_f32x2(float *p, float a, float b)
{
#if defined(SPB_CUDA_EMU)
    spb_emu_red_add_f32x2(p, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
#endif
}

/* 2^x on the special-function unit alone (ex2.approx.ftz.f32: an error of
 * a few units in the last place, results under 2^-126 flushed to zero,
 * -inf -> 0).
 * exp2f() without --use_fast_math wraps the same instruction in a range
 * test and two multiplies for subnormal results, which a softmax
 * probability never needs: about 100 instructions of the forward's tile
 * (docs/GPU.md, "After the first run"). */
__device__ __forceinline__ float spb_ex2(float x)
{
#ifdef SPB_CUDA_EMU
    float r = exp2f(x);
    return r < 1.17549435e-38f ? 0.0f : r;
#else
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
#endif
}

#endif
