/* The CUDA bf16 table's direct kernels (bf16_direct.h, --bf16-kernels
 * fast): products through cuBLASLt on the bf16 storage (tensor cores, fp32
 * accumulation, C rounded once: spb_cuda_gemm_bf16), attention through
 * the bf16 flash kernel (spb_cuda_attention_*, FAST: mma.sync where the
 * strides allow, else its simple version) and GELU through the bf16 GELU
 * kernels (vector loads where aligned).  Everything on the legacy
 * default stream, where the storage's widen/narrow and the fp32 CUDA table
 * run, so the direct calls stay ordered with the frames around them.
 * Never run on a GPU yet: experiments/gpu-strategies holds it against the
 * CPU's single-rank run (docs/GPU.md). */
#include <cuda_runtime.h>

#include "cuda_bf16_storage.h"
#include "cuda_check.h"
#include "spb_cuda.h"

#define SPB_LAUNCH_CHECK() SPB_CUDA_CHECK(cudaGetLastError())

namespace {

const cudaStream_t kStream = 0; /* the legacy default stream */
const int kThreads = 256;

unsigned blocks_for(long n)
{
    long b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b < 65535 ? (b > 0 ? b : 1) : 65535); /* grid-stride loops cover the rest */
}

/* One cuBLASLt handle and workspace for the process (32 MiB: the
 * heuristics' preferred size for large bf16 products on Hopper). */
spb_cuda_gemm *products(void)
{
    static spb_cuda_gemm *g = nullptr;
    if (!g) g = spb_cuda_gemm_create((size_t)32 << 20);
    return g;
}

void gemm(int transA, int transB, int m, int n, int k, const spb_bf16 *A, int lda, const spb_bf16 *B, int ldb,
          float beta, void *C, spb_dtype c_type, int ldc)
{
    spb_cuda_gemm_bf16(products(), transA, transB, m, n, k, 1.0f, A, lda, B, ldb, beta, C, ldc,
                       c_type == SPB_DTYPE_F32, kStream);
}

__global__ void k_broadcast_rows(void *C, int c_f32, int ldc, const spb_bf16 *b, int rows, int n)
{
    long total = (long)rows * n;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        long r = i / n, j = i % n;
        if (c_f32)
            ((float *)C)[r * ldc + j] = spb_bf16_to_float(b[j]);
        else
            ((spb_bf16 *)C)[r * ldc + j] = b[j];
    }
}

void broadcast_rows(void *C, spb_dtype c_type, int ldc, const spb_bf16 *b, int rows, int n)
{
    if (rows <= 0 || n <= 0) return;
    k_broadcast_rows<<<blocks_for((long)rows * n), kThreads, 0, kStream>>>(C, c_type == SPB_DTYPE_F32, ldc, b, rows,
                                                                            n);
    SPB_LAUNCH_CHECK();
}

__global__ void k_ones(spb_bf16 *x, long n)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = spb_bf16_from_float(1.0f);
}

void ones(spb_bf16 *x, long n)
{
    if (n <= 0) return;
    k_ones<<<blocks_for(n), kThreads, 0, kStream>>>(x, n);
    SPB_LAUNCH_CHECK();
}

void gelu_forward(spb_bf16 *out, const spb_bf16 *inp, long n)
{
    spb_cuda_gelu_forward(out, inp, n, SPB_CUDA_FAST, kStream);
}

void gelu_backward(spb_bf16 *dinp, const spb_bf16 *inp, const spb_bf16 *dout, long n)
{
    spb_cuda_gelu_backward(dinp, inp, dout, n, SPB_CUDA_FAST, kStream);
}

void attention_forward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v, spb_bf16 *o,
                       float *lse)
{
    spb_cuda_attention_forward(d, q, k, v, o, lse, SPB_CUDA_FAST, kStream);
}

void attention_backward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                        const spb_bf16 *o, const float *lse, const spb_bf16 *dout, float *dq, float *dk, float *dv)
{
    float *ws = spb_cuda_attention_workspace((long)d->batch * d->heads * d->q_len);
    spb_cuda_attention_backward(d, q, k, v, o, lse, dout, dq, dk, dv, ws, SPB_CUDA_FAST, kStream);
}

} // namespace

extern "C" const spb_bf16_direct spb_bf16_direct_cuda = {
    "cuda (cuBLASLt, bf16 flash attention, bf16 GELU)", gemm, broadcast_rows, ones, gelu_forward, gelu_backward,
    attention_forward, attention_backward,
};
