/* ops_cpu.c's tanh GELU and its derivative for the device kernels (CUDA C:
 * for the .cu files only), one definition for every table. */
#ifndef SPB_GELU_CUH
#define SPB_GELU_CUH

#define SPB_GELU_SCALE 0.7978845608028654f /* sqrt(2/pi), as ops_cpu.c */

__device__ __forceinline__ float spb_gelu_value(float x)
{
    float u = SPB_GELU_SCALE * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

/* d gelu(x) / dx */
__device__ __forceinline__ float spb_gelu_slope(float x)
{
    float u = SPB_GELU_SCALE * (x + 0.044715f * x * x * x);
    float t = tanhf(u);
    float du = SPB_GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

#endif
