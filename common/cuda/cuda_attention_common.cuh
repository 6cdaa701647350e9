/* Part of cuda_attention.cu (its first comment describes every kernel family):
 * What differs between the element types (elem<T>) and the loads every family
 * shares.
 * Split off for length, not an interface: included once, by
 * cuda_attention.cu only, in the order there, and it uses what the parts
 * before it define (one translation unit; the CUDA emulation's
 * translate.py inlines it). */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* What differs between the element types: conversions (round to nearest
 * even), packing two fp32 values into one 32-bit operand register, and the
 * m16n8k16 tensor-core product with fp32 accumulators. */
template <typename T> struct elem;
template <> struct elem<__nv_bfloat16> {
    static constexpr int is_fp16 = 0;
    static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
    {
        spb_mma_m16n8k16<0>(c, a, b0, b1);
    }
};
template <> struct elem<__half> {
    static constexpr int is_fp16 = 1;
    static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
    static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
    {
        __half2 v = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
    {
        spb_mma_m16n8k16<1>(c, a, b0, b1);
    }
};

template <typename T> __device__ __forceinline__ float ld(const spb_bf16 *p, long i)
{
    return elem<T>::to_f(((const T *)p)[i]);
}
