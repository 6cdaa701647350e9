/* Launch sizes, warp and block reductions and the 4 x bf16 packing the
 * device kernels share (CUDA C: for the .cu files only). */
#ifndef SPB_CUDA_LAUNCH_CUH
#define SPB_CUDA_LAUNCH_CUH

#include <cuda_bf16.h>

/* Blocks of `threads` for a grid-stride loop over n elements: at least one,
 * at most 65535 (the loop covers the rest). */
static inline unsigned spb_grid_stride_blocks(long n, int threads)
{
    long b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

/* The sum (maximum) of x over the 32 lanes of a warp, in every lane. */
__device__ __forceinline__ float spb_warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float spb_warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* The sum (maximum) of x over a block of THREADS threads, in every thread:
 * each thread adds the warps' partials in the same order, so all agree to
 * the bit.  shared: THREADS / 32 floats; it may be passed again at once. */
template <int THREADS> __device__ __forceinline__ float spb_block_reduce(float x, bool is_max, float *shared)
{
    x = is_max ? spb_warp_max(x) : spb_warp_sum(x);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* shared may still be read from the last call */
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = shared[0];
    for (int w = 1; w < THREADS / 32; w++) x = is_max ? fmaxf(x, shared[w]) : x + shared[w];
    return x;
}

/* Four bf16 values in 8 bytes (one uint2): the vector access of kernels
 * that read fp32 four at a time and write bf16, or back. */
__device__ __forceinline__ uint2 spb_bf16x4_pack(float a, float b, float c, float d)
{
    uint2 u;
    __nv_bfloat16 *h = (__nv_bfloat16 *)&u;
    h[0] = __float2bfloat16_rn(a), h[1] = __float2bfloat16_rn(b);
    h[2] = __float2bfloat16_rn(c), h[3] = __float2bfloat16_rn(d);
    return u;
}
__device__ __forceinline__ void spb_bf16x4_unpack(uint2 u, float v[4])
{
    const __nv_bfloat16 *h = (const __nv_bfloat16 *)&u;
    for (int j = 0; j < 4; j++) v[j] = __bfloat162float(h[j]);
}

#endif
