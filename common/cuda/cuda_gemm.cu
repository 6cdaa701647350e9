/* Matrix products: cuBLASLt, bf16 (or fp16) inputs, fp32 compute, 16-bit or fp32 output,
 * the heuristic's first algorithm cached per (shape, strides, types, beta).
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
    unsigned align_a, align_b, align_c; /* bytes the pointers are aligned to (<= 256) */
    int fp16;                           /* the 16-bit operands: fp16, else bf16 */
    bool operator==(const plan_key &o) const
    {
        return fp16 == o.fp16 && ta == o.ta && tb == o.tb && m == o.m && n == o.n && k == o.k && lda == o.lda &&
               ldb == o.ldb && ldc == o.ldc && c_f32 == o.c_f32 && beta_zero == o.beta_zero && align_a == o.align_a &&
               align_b == o.align_b && align_c == o.align_c;
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

static const plan &get_plan(spb_cuda_gemm *g, const plan_key &k)
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
    const uint32_t align[4] = {k.align_b, k.align_a, k.align_c, k.align_c};
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
        SPB_DIE("cuBLASLt: no algorithm for m=%d n=%d k=%d ta=%d tb=%d c_f32=%d fp16=%d (alignment %u/%u/%u bytes)",
                k.m, k.n, k.k, k.ta, k.tb, k.c_f32, k.fp16, k.align_a, k.align_b, k.align_c);
    p.algo = res.algo;
    g->plans.push_back(p);
    return g->plans.back();
}

/* C[m][n] (row-major, ld ldc) = beta·C: a product with an empty inner
 * dimension (a rank without rows), which cuBLASLt's documentation does
 * not promise to take.  beta = 0 writes zeros without reading C. */
__global__ void k_scale_c(void *C, int m, int n, int ldc, float beta, int c_f32, int fp16)
{
    long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (idx >= (long)m * n) return;
    long at = idx / n * ldc + idx % n;
    if (c_f32) {
        float *c = (float *)C + at;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    } else if (fp16) {
        __half *c = (__half *)C + at;
        *c = __float2half_rn(beta == 0.0f ? 0.0f : beta * __half2float(*c));
    } else {
        __nv_bfloat16 *c = (__nv_bfloat16 *)C + at;
        *c = __float2bfloat16_rn(beta == 0.0f ? 0.0f : beta * __bfloat162float(*c));
    }
}

extern "C" void spb_cuda_gemm_half(spb_cuda_gemm *g, int fp16, int transA, int transB, int m, int n, int k,
                                   float alpha, const spb_bf16 *A, int lda, const spb_bf16 *B, int ldb, float beta,
                                   void *C, int ldc, int c_f32, cudaStream_t s)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        if (beta == 1.0f) return;
        long mn = (long)m * n;
        k_scale_c<<<(unsigned)((mn + 255) / 256), 256, 0, s>>>(C, m, n, ldc, beta, c_f32, fp16);
        SPB_CUDA_CHECK(cudaGetLastError());
        return;
    }
    plan_key key = {transA ? 1 : 0,  transB ? 1 : 0,  m, n, k, lda, ldb, ldc, c_f32 ? 1 : 0, beta == 0.0f,
                    alignment_of(A), alignment_of(B), alignment_of(C), fp16 ? 1 : 0};
    const plan &p = get_plan(g, key);
    SPB_LT_CHECK(cublasLtMatmul(g->lt, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo, g->workspace,
                                g->workspace_bytes, s));
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
__global__ void k_add_bias_f32(float *out, const float *b, int rows, int n)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < (long)rows * n) out[i] += b[i % n];
}
__global__ void k_add_bias_bf16(__nv_bfloat16 *out, const float *b, int rows, int n)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < (long)rows * n) out[i] = __float2bfloat16_rn(__bfloat162float(out[i]) + b[i % n]);
}

extern "C" void spb_cuda_matmul_forward(spb_cuda_gemm *g, void *out, int out_f32, const spb_bf16 *inp,
                                        const spb_bf16 *W, const float *b, int rows, int in, int out_f, cudaStream_t s)
{
    /* out[rows][out_f] = inp[rows][in] · W[out_f][in]ᵀ.  The bias is a second
     * pass (bf16 out: rounded twice; a cuBLASLt bias epilogue is the next step). */
    spb_cuda_gemm_bf16(g, 0, 1, rows, out_f, in, 1.0f, inp, in, W, in, 0.0f, out, out_f, out_f32, s);
    if (b) {
        long n = (long)rows * out_f;
        unsigned blocks = (unsigned)((n + 255) / 256);
        if (out_f32)
            k_add_bias_f32<<<blocks, 256, 0, s>>>((float *)out, b, rows, out_f);
        else
            k_add_bias_bf16<<<blocks, 256, 0, s>>>((__nv_bfloat16 *)out, b, rows, out_f);
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
