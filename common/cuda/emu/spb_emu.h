/* The CPU emulation of a CUDA device (docs/EMULATION.md): what a .cu file
 * needs beyond C++ to run its kernels on the host.  g++ force-includes this
 * header (-include) into every translated source (translate.py rewrites the
 * <<<...>>> launches and `extern __shared__` arrays; the rest is here).
 *
 * A launch runs its blocks one after another (in a scrambled order), and
 * the threads of a block as fibers on one OS thread, switched only at
 * __syncthreads, warp shuffles, __syncwarp and tensor-core products: a
 * barrier waits for every live thread of the block, a warp operation for
 * every live lane of the warp.  Device memory is host memory.  What this
 * checks and what it cannot (timing, stream ordering, the hardware's own
 * rounding) is in docs/EMULATION.md. */
#ifndef SPB_EMU_H
#define SPB_EMU_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

/* Qualifiers: device code is host code.  A block's fibers share one copy
 * of a __shared__ array, which is what `static` gives while blocks run one
 * at a time. */
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __constant__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)

/* ---- where the running thread is ----------------------------------------- */
struct spb_emu_where {
    uint3 thread, block;
    dim3 block_dim, grid_dim;
};
extern thread_local spb_emu_where *spb_emu_here;
#define threadIdx (spb_emu_here->thread)
#define blockIdx (spb_emu_here->block)
#define blockDim (spb_emu_here->block_dim)
#define gridDim (spb_emu_here->grid_dim)
#ifndef warpSize
static const int warpSize = 32;
#endif

/* ---- synchronisation ------------------------------------------------------ */
/* The call's place in the source names the barrier: the host compiler may
 * duplicate code around it (it does not know barriers are convergent). */
void spb_emu_syncthreads(const char *file, int line);
#define __syncthreads() spb_emu_syncthreads(__FILE__, __LINE__)
void __syncwarp(unsigned mask = 0xffffffffu);
/* Every live lane of the warp puts 8 bytes in; each gets lane `src`'s back. */
uint64_t spb_emu_warp_exchange(unsigned mask, uint64_t mine, int src);
int spb_emu_lane(void);

template <typename V> static inline V spb_emu_shfl(unsigned mask, V v, int src)
{
    static_assert(sizeof(V) <= 8 && std::is_trivially_copyable<V>::value, "shuffle of a register-sized value");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = spb_emu_warp_exchange(mask, bits, src);
    V r;
    memcpy(&r, &bits, sizeof r);
    return r;
}
/* width: lanes are grouped in segments of `width` (a power of two <= 32) */
template <typename V> static inline V __shfl_sync(unsigned mask, V v, int src, int width = 32)
{
    int lane = spb_emu_lane();
    return spb_emu_shfl(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename V> static inline V __shfl_xor_sync(unsigned mask, V v, int lane_mask, int width = 32)
{
    int lane = spb_emu_lane(), src = lane ^ lane_mask;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return spb_emu_shfl(mask, v, src);
}
template <typename V> static inline V __shfl_down_sync(unsigned mask, V v, unsigned delta, int width = 32)
{
    int lane = spb_emu_lane(), src = lane + (int)delta;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return spb_emu_shfl(mask, v, src);
}

/* ---- atomics: one OS thread runs every fiber, and a fiber is switched
 * only at a synchronisation point, so a read-modify-write is atomic.  The
 * race check (emu_race.cc) is told it is an atomic, and its own accesses
 * are left out of the instrumentation. ------------------------------------ */
/* kind: 0 read, 1 write, 2 atomic; 3 a cp.async issued into it, 4 that
 * copy landing (emu_async_copy.cc); 5 a wgmma's read of it issued, 6 the
 * wait that covers that read (emu_wgmma.cc); 7 a tensor copy landing in
 * shared memory, the copy engine's write (emu_tma.cc) */
void spb_emu_race_access(const void *p, size_t bytes, int kind, const void *pc);
#ifdef SPB_EMU_RACECHECK
#define SPB_EMU_ATOMIC __attribute__((no_sanitize_thread, noinline))
#else
#define SPB_EMU_ATOMIC inline
#endif
template <typename V> static SPB_EMU_ATOMIC V atomicAdd(V *p, V v)
{
    spb_emu_race_access(p, sizeof(V), 2, __builtin_return_address(0));
    V old = *p;
    *p = old + v;
    return old;
}

/* red.global.add.v2.f32 (warp_ptx.cuh; emu_bulk_copy.cc): one 8-byte
 * atomic update, of an 8-byte aligned address */
void spb_emu_red_add_f32x2(float *p, float a, float b);

/* ---- device functions the host library lacks (those the sources use; a
 * kernel that calls another fails to compile here, and it goes here) ----- */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* CUDA's min/max overloads: mixed operands compared in their common type,
 * as CUDA's are (min(unsigned, int) compares as unsigned) */
template <typename A, typename B> static inline typename std::common_type<A, B>::type min(A a, B b)
{
    typedef typename std::common_type<A, B>::type C;
    return (C)a < (C)b ? (C)a : (C)b;
}
template <typename A, typename B> static inline typename std::common_type<A, B>::type max(A a, B b)
{
    typedef typename std::common_type<A, B>::type C;
    return (C)a > (C)b ? (C)a : (C)b;
}

/* ---- tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} ------
 * A warp collective.  Operand registers as the PTX ISA lays them out
 * (emu_mma.cc writes the layout out from the ISA's tables). */
void spb_emu_mma_m16n8k16(int fp16, float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (emu_mma.cc): a warp
 * collective; rows must lie in the launch's dynamic shared memory */
void spb_emu_ldmatrix_x4(uint32_t r[4], const void *row, int trans);
/* cp.async.cg 16 bytes, commit_group, wait_group (emu_async_copy.cc): a
 * copy lands at one end of the window a GPU allows (at the covering wait,
 * or at issue, alternately by block), so that a read the kernel does not
 * order after the copy, or a copy over what is still being read, shows */
void spb_emu_cp_async16(void *dst, const void *src, int src_bytes);
void spb_emu_cp_async_commit(void);
void spb_emu_cp_async_wait(int groups_left);

/* wgmma.mma_async.sync.aligned.m64nNk16.f32 and its fence, commit_group and
 * wait_group (emu_wgmma.cc): a warpgroup's product, computed at the wait
 * that covers it; a = null: A from shared memory through a_desc */
void spb_emu_wgmma(int fp16, int n, float *d, const uint32_t *a, uint64_t a_desc, uint64_t b_desc, int accumulate,
                   int trans_b);
void spb_emu_wgmma_fence(void);
void spb_emu_wgmma_commit(void);
void spb_emu_wgmma_wait(int groups_left);
void spb_emu_fence_proxy_async(void);
/* cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32, and the bulk
 * group's commit and wait (emu_bulk_copy.cc): fp32 adds of a shared-memory
 * row into global memory by the copy engine, done at one end of the window
 * a GPU allows (at the covering wait, or at issue, alternately by block) */
void spb_emu_bulk_reduce_add_f32(float *dst, const float *src, unsigned bytes);
void spb_emu_bulk_commit(void);
void spb_emu_bulk_wait(int groups_left, int read_only);

/* mbarrier and the tensor copy (tma_ptx.cuh; emu_tma.cc): a barrier in the
 * block's dynamic shared memory (8 bytes, 8-aligned) with the ISA's phase,
 * pending-arrival and transaction counts; wait blocks the calling thread
 * until the phase of that parity has completed (a fresh barrier's phase 0
 * is running, so parity 1 passes at once).  The tensor copy moves one box
 * of a tensor map (cuTensorMapEncodeTiled, which the emulated runtime's
 * cudaGetDriverEntryPointByVersion gives) into shared memory, zero outside
 * the tensor, and completes the box's bytes on the barrier: at the wait of
 * a thread on that barrier or at the issue, alternately by block. */
void spb_emu_mbarrier_init(uint64_t *bar, unsigned count);
void spb_emu_mbarrier_arrive(uint64_t *bar);
void spb_emu_mbarrier_arrive_expect_tx(uint64_t *bar, unsigned bytes);
void spb_emu_mbarrier_wait(uint64_t *bar, unsigned parity);
void spb_emu_tma_load(void *dst, const void *tensor_map, const int *coords, int rank, uint64_t *bar);
/* bar.sync / bar.arrive id, count (emu_launch.cc): `count` threads (a
 * multiple of 32) meet at named barrier `id` (1..15); wait: sync, else arrive */
void spb_emu_named_barrier(int id, int count, int wait);
#undef __grid_constant__
#define __grid_constant__

/* cuda_runtime.h's C++ overloads for symbols exist for nvcc only */
template <typename T>
static inline cudaError_t cudaMemcpyToSymbol(const T &symbol, const void *src, size_t count, size_t offset = 0,
                                             cudaMemcpyKind kind = cudaMemcpyHostToDevice)
{
    (void)kind;
    return cudaMemcpy((char *)&symbol + offset, src, count, cudaMemcpyDefault);
}
template <typename T>
static inline cudaError_t cudaMemcpyFromSymbol(void *dst, const T &symbol, size_t count, size_t offset = 0,
                                               cudaMemcpyKind kind = cudaMemcpyDeviceToHost)
{
    (void)kind;
    return cudaMemcpy(dst, (const char *)&symbol + offset, count, cudaMemcpyDefault);
}

template <typename... P>
static inline cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(kernel), attr, value);
}

/* ---- launches ------------------------------------------------------------- */
struct spb_emu_launch_config {
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
};
static inline spb_emu_launch_config spb_emu_config(dim3 grid, dim3 block, size_t shared = 0, cudaStream_t s = 0)
{
    return spb_emu_launch_config{grid, block, shared, s};
}
/* Runs body() once per thread of every block; records a launch error
 * (cudaGetLastError) instead when the configuration is one a GPU refuses. */
void spb_emu_run(const void *kernel, const char *name, const spb_emu_launch_config &c,
                 const std::function<void()> &body);
void *spb_emu_dynamic_shared(void);

/* ---- stream order (emu_streams.cc) ------------------------------------- */
#include "emu_stream_hooks.h"
void spb_emu_race_stream_accesses(void);

/* a kernel argument: a pointer is an operand, written unless it points to const */
template <typename V> static inline void spb_emu_stream_arg(const V &v)
{
    if constexpr (std::is_pointer<V>::value)
        spb_emu_stream_access((const void *)v, 0, !std::is_const<typename std::remove_pointer<V>::type>::value);
}

template <typename... P, typename... A>
static void spb_emu_launch(void (*kernel)(P...), const char *name, const spb_emu_launch_config &c, A &&...a)
{
    /* a launch copies its arguments, converted to the parameter types */
    std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
    spb_emu_stream_op(c.stream, name);
#ifdef SPB_EMU_RACECHECK
    /* the bytes it touched, exactly (emu_race.cc) */
    spb_emu_run(reinterpret_cast<const void *>(kernel), name, c, [&]() { std::apply(kernel, args); });
    spb_emu_race_stream_accesses();
    spb_emu_stream_op_end();
#else
    /* where its operands start */
    std::apply([](const auto &...v) { (spb_emu_stream_arg(v), ...); }, args);
    spb_emu_stream_op_end();
    spb_emu_run(reinterpret_cast<const void *>(kernel), name, c, [&]() { std::apply(kernel, args); });
#endif
}

#endif
