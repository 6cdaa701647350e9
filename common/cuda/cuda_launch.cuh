/* Launch sizes and warp reductions the device kernels share (CUDA C: for
 * the .cu files only). */
#ifndef SPB_CUDA_LAUNCH_CUH
#define SPB_CUDA_LAUNCH_CUH

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

#endif
