/* Matrix products: cuBLASLt, bf16 (or fp16) inputs, fp32 compute, 16-bit or fp32 output,
 * optionally C read from one buffer and D written to another with a bias
 * vector added in the epilogue (no extra pass over the output), the
 * heuristic's first algorithm cached per (shape, strides, types, beta,
 * epilogue, alignments).
 * Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: cuBLASLt gets
 * B as its "A" and A as its "B", with m and n swapped. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <vector>

#include "cuda_check.h"
#include "spb_cuda.h"

#define SPB_LT_CHECK(call)                                                                                             \
    do {                                                                                                               \
        cublasStatus_t st_ = (call);                                                                                   \
        if (st_ != CUBLAS_STATUS_SUCCESS) SPB_DIE("cuBLASLt call failed: %s: status %d", #call, (int)st_);             \
    } while (0)

namespace {
struct plan_key {
    int ta, tb, m, n, k, lda, ldb, ldc, c_f32, beta_zero;
    unsigned align_a, align_b, align_c, align_d; /* bytes the pointers are aligned to (<= 256) */
    int fp16;                                    /* the 16-bit operands: fp16, else bf16 */
    unsigned align_bias;                         /* 0: no bias epilogue */
    bool operator==(const plan_key &o) const
    {
        return fp16 == o.fp16 && ta == o.ta && tb == o.tb && m == o.m && n == o.n && k == o.k && lda == o.lda &&
               ldb == o.ldb && ldc == o.ldc && c_f32 == o.c_f32 && beta_zero == o.beta_zero && align_a == o.align_a &&
               align_b == o.align_b && align_c == o.align_c && align_d == o.align_d && align_bias == o.align_bias;
    }
};

/* The largest power of two up to 256 that divides the address.  cuBLASLt's
 * heuristic assumes 256-byte aligned operands unless told otherwise, and
 * column blocks of larger matrices (Megatron-SP's and Ulysses' head blocks,
 * the core's strided products) start anywhere on a bf16 boundary. */
unsigned alignment_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && a % al) al >>= 1;
    return al;
}
struct plan {
    plan_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};
} // namespace

struct spb_cuda_gemm {
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    std::vector<plan> plans;
};

extern "C" spb_cuda_gemm *spb_cuda_gemm_create(size_t workspace_bytes)
{
    spb_cuda_gemm *g = new spb_cuda_gemm;
    SPB_LT_CHECK(cublasLtCreate(&g->lt));
    g->workspace_bytes = workspace_bytes;
    g->workspace = workspace_bytes ? spb_cuda_alloc(SPB_MEM_WORKSPACE, workspace_bytes) : nullptr;
    return g;
}

extern "C" void spb_cuda_gemm_destroy(spb_cuda_gemm *g)
{
    if (!g) return;
    for (plan &p : g->plans) {
        cublasLtMatrixLayoutDestroy(p.a);
        cublasLtMatrixLayoutDestroy(p.b);
        cublasLtMatrixLayoutDestroy(p.c);
        cublasLtMatmulDescDestroy(p.op);
    }
    spb_cuda_free(g->workspace);
    cublasLtDestroy(g->lt);
    delete g;
}

/* bias: the epilogue's bias vector (k.align_bias != 0); the heuristic reads
 * its address for the alignment it may assume. */
static const plan &get_plan(spb_cuda_gemm *g, const plan_key &k, const void *bias)
{
    for (const plan &p : g->plans)
        if (p.key == k) return p;
    plan p;
    p.key = k;
    /* column-major problem: C'[n][m] (ld ldc) = op'(B) op'(A) */
    cublasOperation_t opA = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* applies to B (cuBLASLt's A) */
    cublasOperation_t opB = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* applies to A (cuBLASLt's B) */
    SPB_LT_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    SPB_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof opA));
    SPB_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof opB));
    if (k.align_bias) {
        /* bias of D's type (the header's rule outside fp8), one per row of
         * the column-major D: one per column n of our row-major output */
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        SPB_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        SPB_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    /* Lt-A = row-major B: stored column-major as [cols of B row][rows]: if
     * row-major B is [k][n] (tb = 0) it is column-major n x k with ld ldb. */
    const cudaDataType_t half = k.fp16 ? CUDA_R_16F : CUDA_R_16BF;
    SPB_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, half, k.tb ? k.k : k.n, k.tb ? k.n : k.k, k.ldb));
    SPB_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, half, k.ta ? k.m : k.k, k.ta ? k.k : k.m, k.lda));
    SPB_LT_CHECK(cublasLtMatrixLayoutCreate(&p.c, k.c_f32 ? CUDA_R_32F : half, k.n, k.m, k.ldc));
    cublasLtMatmulPreference_t pref;
    SPB_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = g->workspace_bytes;
    SPB_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* Lt's A is our B, its B our A; C and D are both our C. */
    const uint32_t align[4] = {k.align_b, k.align_a, k.align_c, k.align_d};
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        SPB_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    SPB_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(g->lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found < 1)
        SPB_DIE("cuBLASLt: no algorithm for m=%d n=%d k=%d ta=%d tb=%d c_f32=%d fp16=%d bias=%d (alignment "
                "%u/%u/%u/%u bytes)",
                k.m, k.n, k.k, k.ta, k.tb, k.c_f32, k.fp16, k.align_bias != 0, k.align_a, k.align_b, k.align_c,
                k.align_d);
    p.algo = res.algo;
    g->plans.push_back(p);
    return g->plans.back();
}

/* D[m][n] (row-major, ld ldc) = beta·C (+ bias[j]): a product with an empty
 * inner dimension (a rank without rows), which cuBLASLt's documentation does
 * not promise to take.  beta = 0 does not read C. */
template <typename E> __device__ __forceinline__ float to_f32(E v) { return (float)v; }
template <> __device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
template <typename E> __device__ __forceinline__ E from_f32(float v) { return (E)v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f32(float v) { return __float2half_rn(v); }
template <typename E>
__global__ void k_scale_c(const E *C, E *D, const E *bias, int m, int n, int ldc, float beta)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (j >= n) return;
    long at = (long)i * ldc + j;
    float v = beta == 0.0f ? 0.0f : beta * to_f32(C[at]);
    if (bias) v += to_f32(bias[j]);
    D[at] = from_f32<E>(v);
}
template <typename E>
static void scale_c(const void *C, void *D, const void *bias, int m, int n, int ldc, float beta, cudaStream_t s)
{
    for (int i0 = 0; i0 < m; i0 += 65535) { /* gridDim.y's limit */
        int rows = m - i0 < 65535 ? m - i0 : 65535;
        dim3 grid((unsigned)((n + 255) / 256), (unsigned)rows);
        const E *c = C ? (const E *)C + (long)i0 * ldc : nullptr;
        k_scale_c<E><<<grid, 256, 0, s>>>(c, (E *)D + (long)i0 * ldc, (const E *)bias, rows, n, ldc, beta);
        SPB_CUDA_CHECK(cudaGetLastError());
    }
}

extern "C" void spb_cuda_gemm_epilogue(spb_cuda_gemm *g, int fp16, int transA, int transB, int m, int n, int k,
                                       float alpha, const spb_bf16 *A, int lda, const spb_bf16 *B, int ldb,
                                       float beta, const void *C, void *D, int ldc, int c_f32, const void *bias,
                                       cudaStream_t s)
{
    if (m <= 0 || n <= 0) return;
    SPB_CHECK(C || beta == 0.0f);
    if (k <= 0) {
        if (beta == 1.0f && C == D && !bias) return;
        if (c_f32) scale_c<float>(C, D, bias, m, n, ldc, beta, s);
        else if (fp16) scale_c<__half>(C, D, bias, m, n, ldc, beta, s);
        else scale_c<__nv_bfloat16>(C, D, bias, m, n, ldc, beta, s);
        return;
    }
    if (!C) C = D; /* beta = 0: not read; cuBLASLt then gets the usual in-place call */
    plan_key key = {transA ? 1 : 0,  transB ? 1 : 0,  m, n, k, lda, ldb, ldc, c_f32 ? 1 : 0, beta == 0.0f,
                    alignment_of(A), alignment_of(B), alignment_of(C), alignment_of(D),
                    fp16 ? 1 : 0,    bias ? alignment_of(bias) : 0u};
    const plan &p = get_plan(g, key, bias);
    if (bias) /* the plan's descriptor is shared by every call of its key */
        SPB_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    SPB_LT_CHECK(cublasLtMatmul(g->lt, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, D, p.c, &p.algo, g->workspace,
                                g->workspace_bytes, s));
}

extern "C" void spb_cuda_gemm_half(spb_cuda_gemm *g, int fp16, int transA, int transB, int m, int n, int k,
                                   float alpha, const spb_bf16 *A, int lda, const spb_bf16 *B, int ldb, float beta,
                                   void *C, int ldc, int c_f32, cudaStream_t s)
{
    spb_cuda_gemm_epilogue(g, fp16, transA, transB, m, n, k, alpha, A, lda, B, ldb, beta, C, C, ldc, c_f32, NULL, s);
}

extern "C" void spb_cuda_gemm_bf16(spb_cuda_gemm *g, int transA, int transB, int m, int n, int k, float alpha,
                                   const spb_bf16 *A, int lda, const spb_bf16 *B, int ldb, float beta, void *C,
                                   int ldc, int c_f32, cudaStream_t s)
{
    spb_cuda_gemm_half(g, 0, transA, transB, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, c_f32, s);
}

/* ---- fp32 reference product: one thread per output, a plain loop over k ---- */
__global__ void k_sgemm_simple(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda,
                               const float *B, int ldb, float beta, float *C, int ldc)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= m || j >= n) return;
    float acc = 0.0f;
    for (int l = 0; l < k; l++) {
        float a = ta ? A[(long)l * lda + i] : A[(long)i * lda + l];
        float b = tb ? B[(long)j * ldb + l] : B[(long)l * ldb + j];
        acc += a * b;
    }
    float *c = C + (long)i * ldc + j;
    *c = alpha * acc + (beta == 0.0f ? 0.0f : beta * *c);
}

extern "C" void spb_cuda_sgemm_simple(int transA, int transB, int m, int n, int k, float alpha, const float *A,
                                      int lda, const float *B, int ldb, float beta, float *C, int ldc, cudaStream_t s)
{
    if (m <= 0 || n <= 0) return;
    dim3 block(16, 16), grid((n + 15) / 16, (m + 15) / 16);
    k_sgemm_simple<<<grid, block, 0, s>>>(transA, transB, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    SPB_CUDA_CHECK(cudaGetLastError());
}

/* ---- ops.h's matmul conventions --------------------------------------------- */
/* out[r][j] += b[j]: blockIdx.y walks the rows (no 64-bit division per element) */
__global__ void k_add_bias_f32(float *out, const float *b, int rows, int n)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float bj = b[j];
    for (int r = blockIdx.y; r < rows; r += gridDim.y) out[(long)r * n + j] += bj;
}
__global__ void k_add_bias_bf16(__nv_bfloat16 *out, const float *b, int rows, int n)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float bj = b[j];
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        long i = (long)r * n + j;
        out[i] = __float2bfloat16_rn(__bfloat162float(out[i]) + bj);
    }
}

extern "C" void spb_cuda_matmul_forward(spb_cuda_gemm *g, void *out, int out_f32, const spb_bf16 *inp,
                                        const spb_bf16 *W, const float *b, int rows, int in, int out_f, cudaStream_t s)
{
    /* out[rows][out_f] = inp[rows][in] · W[out_f][in]ᵀ.  The fp32 bias is a
     * second pass (bf16 out: rounded twice): the plain path.  cuBLASLt's
     * bias epilogue takes a bias of the output's type only, so the device
     * layer's fast path calls spb_cuda_gemm_epilogue with the bf16 copy. */
    spb_cuda_gemm_bf16(g, 0, 1, rows, out_f, in, 1.0f, inp, in, W, in, 0.0f, out, out_f, out_f32, s);
    if (b && rows > 0) {
        dim3 grid((unsigned)((out_f + 255) / 256), (unsigned)(rows < 4096 ? rows : 4096));
        if (out_f32)
            k_add_bias_f32<<<grid, 256, 0, s>>>((float *)out, b, rows, out_f);
        else
            k_add_bias_bf16<<<grid, 256, 0, s>>>((__nv_bfloat16 *)out, b, rows, out_f);
        SPB_CUDA_CHECK(cudaGetLastError());
    }
}

extern "C" void spb_cuda_matmul_backward(spb_cuda_gemm *g, spb_bf16 *dinp, float *dW, float *db,
                                         const spb_bf16 *dout, const spb_bf16 *inp, const spb_bf16 *W, int rows,
                                         int in, int out_f, int accumulate_dinp, spb_cuda_impl impl, cudaStream_t s)
{
    /* dinp[rows][in] (=|+=) dout[rows][out_f] · W[out_f][in] */
    if (dinp)
        spb_cuda_gemm_bf16(g, 0, 0, rows, in, out_f, 1.0f, dout, out_f, W, in, accumulate_dinp ? 1.0f : 0.0f, dinp,
                           in, 0, s);
    /* dW[out_f][in] += dout[rows][out_f]ᵀ · inp[rows][in], fp32 */
    spb_cuda_gemm_bf16(g, 1, 0, out_f, in, rows, 1.0f, dout, out_f, inp, in, 1.0f, dW, in, 1, s);
    if (db) spb_cuda_bias_grad(db, dout, rows, out_f, impl, s);
}
