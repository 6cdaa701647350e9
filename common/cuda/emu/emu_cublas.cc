/* Over 700 lines: the cuBLAS/cuBLASLt stand-in, one entry per call the project makes, each with what it refuses. */
/* CPU stand-in for the part of cuBLAS (v2) and cuBLASLt that spbench calls.
 *
 * Part of the CPU emulation of a CUDA device (common/cuda/emu): "device
 * memory" is ordinary host memory there, so every pointer handed to these
 * functions is dereferenced directly.  Streams are ignored: each call has
 * finished when it returns.  Compiled with g++ against NVIDIA's own headers
 * (cublasLt.h, cublas_v2.h), which declare every function below extern "C";
 * the definitions take exactly the declared signatures, so a project source
 * links against this file instead of libcublas / libcublasLt.  No CUDA
 * runtime function is called (the 16-bit conversions of cuda_bf16.h and
 * cuda_fp16.h are inline host code under g++).
 *
 * Semantics (cuBLAS documentation): column-major storage, element (i, j) of
 * a matrix with leading dimension ld at i + j*ld;
 *   cublasLtMatmul:  D = alpha op(A) op(B) + beta C (+ bias[i] with the BIAS
 *                    epilogue), op(A) m x k, op(B) k x n, C and D m x n; the
 *                    layouts describe A and B as stored (before op);
 *   cublasSgemm:     C = alpha op(A) op(B) + beta C.
 * beta == 0: C is not read (it may hold NaN, or be NULL in cublasLtMatmul).
 * alpha == 0 or k == 0: A and B are not read, D = beta C.  C and D may be the
 * same memory: each output block is computed into a temporary from C and the
 * packed operands before anything of D is written.
 *
 * Arithmetic: 16-bit inputs are widened to float exactly; the products are
 * accumulated in float, in order of increasing k (one sequential sum per
 * output), then v = alpha*acc (+ beta*C) (+ bias) in float and one rounding
 * to D's type (round to nearest even for bf16/fp16).  Float and not double,
 * because CUBLAS_COMPUTE_32F and cublasSgemm accumulate in fp32 on the
 * device: an emulated run then shows the size of rounding error the GPU
 * will show, and tolerance checks that pass here are not passing only
 * because a double accumulator hid the error.  (The GPU's summation order
 * differs, so results agree to rounding, not bitwise; integer-valued tests
 * are exact either way.)
 *
 * Kept simple on purpose (an oracle for layout bugs, not a fast GEMM): the
 * operands are packed so that the k loop runs over contiguous floats, then a
 * plain triple loop.
 *
 * What is supported, and what is refused (never silently ignored), is listed
 * at each function; the summary:
 *   types     A = B in CUDA_R_16BF, CUDA_R_16F or CUDA_R_32F; C = D in A's
 *             type or CUDA_R_32F (fp32 A/B: fp32 C/D only); scale type
 *             CUDA_R_32F; compute CUBLAS_COMPUTE_32F, _32F_PEDANTIC, and
 *             _32F_FAST_16BF / _32F_FAST_16F when A/B already are that type;
 *   layouts   column order only; strided batches;
 *   epilogue  DEFAULT, BIAS (bias of D's type, one per row of D);
 *   algos     the heuristic returns one algorithm (workspace 0) for a
 *             supported, consistent problem and none otherwise; the
 *             algorithm records the types and the pointer alignments it was
 *             asked for, and cublasLtMatmul refuses it for other types or
 *             for less aligned pointers, as an algorithm chosen for 256-byte
 *             aligned operands may fail on the GPU. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "emu_stream_hooks.h"

/* The handles are pointers to structures the headers leave incomplete. */
struct cublasLtContext {
    uint32_t magic;
};
struct cublasContext {
    uint32_t magic;
    cublasPointerMode_t pointer_mode;
    cublasMath_t math_mode;
    cudaStream_t stream;
};

namespace {

const uint32_t kMagicLt = 0x4c544d45u;     /* "EMTL" */
const uint32_t kMagicBlas = 0x53414c42u;   /* "BLAS" */
const uint32_t kMagicDesc = 0x43534544u;   /* "DESC" */
const uint32_t kMagicLayout = 0x54594c4cu; /* "LLYT" */
const uint32_t kMagicPref = 0x46455250u;   /* "PREF" */
const uint64_t kMagicAlgo = 0x4f474c4155424d45ull;

/* Descriptors: our own structures, handed out through the headers' opaque
 * pointer types (the caller never looks inside). */
struct EmuDesc {
    uint32_t magic;
    int32_t compute_type; /* cublasComputeType_t */
    int32_t scale_type;   /* cudaDataType_t */
    int32_t pointer_mode; /* cublasLtPointerMode_t: HOST or DEVICE */
    int32_t transa, transb;
    uint32_t epilogue; /* DEFAULT or BIAS */
    const void *bias;
    int64_t bias_batch_stride;
    int32_t bias_type; /* -1: D's type */
};

struct EmuLayout {
    uint32_t magic;
    int32_t type; /* cudaDataType_t */
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch_count;
    int64_t batch_stride; /* elements */
};

struct EmuPref {
    uint32_t magic;
    uint64_t max_workspace;
    uint32_t align[4]; /* minimum alignment of A, B, C, D in bytes */
};

EmuDesc *desc_of(cublasLtMatmulDesc_t d)
{
    EmuDesc *e = reinterpret_cast<EmuDesc *>(d);
    return e && e->magic == kMagicDesc ? e : nullptr;
}
EmuLayout *layout_of(cublasLtMatrixLayout_t l)
{
    EmuLayout *e = reinterpret_cast<EmuLayout *>(l);
    return e && e->magic == kMagicLayout ? e : nullptr;
}
EmuPref *pref_of(cublasLtMatmulPreference_t p)
{
    EmuPref *e = reinterpret_cast<EmuPref *>(p);
    return e && e->magic == kMagicPref ? e : nullptr;
}
bool lt_handle_ok(cublasLtHandle_t h) { return h && h->magic == kMagicLt; }
bool blas_handle_ok(cublasHandle_t h) { return h && h->magic == kMagicBlas; }

/* ------------------------------------------------------------- elements -- */
size_t elem_size(int t)
{
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    default: return 0;
    }
}

inline float load(int t, const void *p, int64_t i)
{
    switch (t) {
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    case CUDA_R_16F: return __half2float(static_cast<const __half *>(p)[i]);
    default: return static_cast<const float *>(p)[i];
    }
}

inline void store(int t, void *p, int64_t i, float v)
{
    switch (t) {
    case CUDA_R_16BF: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v); break;
    case CUDA_R_16F: static_cast<__half *>(p)[i] = __float2half_rn(v); break;
    default: static_cast<float *>(p)[i] = v; break;
    }
}

/* The largest power of two up to 256 dividing the address. */
uint32_t alignment_of(const void *p)
{
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    uint32_t al = 256;
    while (al > 1 && a % al) al >>= 1;
    return al;
}

bool is_trans(int op) { return op == CUBLAS_OP_T || op == CUBLAS_OP_C; } /* real data: C == T */
bool valid_op(int op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

/* ----------------------------------------------------------------- core -- */
struct Operand {
    int type;
    const void *p;
    int64_t ld;
};

/* One product, column-major: D = alpha op(A) op(B) + beta C (+ bias[i]).
 * C.p may be NULL when beta == 0 (not read); bias may be NULL (none). */
cublasStatus_t gemm_core(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, Operand A, Operand B,
                         float beta, Operand C, int d_type, void *D, int64_t ldd, const void *bias, int bias_type)
{
    if (m <= 0 || n <= 0) return CUBLAS_STATUS_SUCCESS;
    const bool product = alpha != 0.0f && k > 0; /* else A and B are not read */
    try {
        /* ap[i*k + l] = op(A)(i, l), bp[j*k + l] = op(B)(l, j): the k loop
         * runs over contiguous memory in both. */
        std::vector<float> ap, bp;
        if (product) {
            ap.resize((size_t)(m * k));
            bp.resize((size_t)(n * k));
            for (int64_t i = 0; i < m; i++)
                for (int64_t l = 0; l < k; l++)
                    ap[(size_t)(i * k + l)] = ta ? load(A.type, A.p, l + i * A.ld) : load(A.type, A.p, i + l * A.ld);
            for (int64_t j = 0; j < n; j++)
                for (int64_t l = 0; l < k; l++)
                    bp[(size_t)(j * k + l)] = tb ? load(B.type, B.p, j + l * B.ld) : load(B.type, B.p, l + j * B.ld);
        }
        /* Every output from C (and the packed operands) before D is written:
         * C and D may be the same memory. */
        std::vector<float> out((size_t)(m * n));
        for (int64_t j = 0; j < n; j++) {
            for (int64_t i = 0; i < m; i++) {
                float v = 0.0f;
                if (product) {
                    const float *a = &ap[(size_t)(i * k)], *b = &bp[(size_t)(j * k)];
                    float acc = 0.0f;
                    for (int64_t l = 0; l < k; l++) acc += a[l] * b[l];
                    v = alpha * acc;
                }
                if (beta != 0.0f) v += beta * load(C.type, C.p, i + j * C.ld);
                if (bias) v += load(bias_type, bias, i);
                out[(size_t)(i + j * m)] = v;
            }
        }
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) store(d_type, D, i + j * ldd, out[(size_t)(i + j * m)]);
    } catch (const std::bad_alloc &) {
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------------------------ Lt problem check -- */
struct Problem {
    int64_t m, n, k;
    int batch;
    bool ta, tb;
};

bool layout_valid(const EmuLayout *l)
{
    const uint64_t max32 = 0x7fffffffu;
    if (l->rows > max32 || l->cols > max32) return false;
    if (l->ld < 0 || (uint64_t)l->ld < l->rows) return false; /* column order: ld >= rows */
    if (l->batch_count < 1) return false;
    return true;
}

bool compute_ok(int compute, int ab_type)
{
    if (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC) return true;
    if (compute == CUBLAS_COMPUTE_32F_FAST_16BF) return ab_type == CUDA_R_16BF;
    if (compute == CUBLAS_COMPUTE_32F_FAST_16F) return ab_type == CUDA_R_16F;
    return false;
}

/* INVALID_VALUE: missing descriptors, dimensions that do not agree,
 * ld < rows, batch counts that differ; NOT_SUPPORTED: types, compute type,
 * scale type, pointer mode or epilogue outside what the stand-in does. */
cublasStatus_t check_problem(const EmuDesc *d, const EmuLayout *a, const EmuLayout *b, const EmuLayout *c,
                             const EmuLayout *dd, Problem *pr)
{
    if (!d || !a || !b || !c || !dd) return CUBLAS_STATUS_INVALID_VALUE;
    for (const EmuLayout *l : {a, b, c, dd})
        if (!layout_valid(l)) return CUBLAS_STATUS_INVALID_VALUE;
    const bool ta = is_trans(d->transa), tb = is_trans(d->transb);
    const int64_t m = (int64_t)(ta ? a->cols : a->rows), ka = (int64_t)(ta ? a->rows : a->cols);
    const int64_t kb = (int64_t)(tb ? b->cols : b->rows), n = (int64_t)(tb ? b->rows : b->cols);
    if (ka != kb) return CUBLAS_STATUS_INVALID_VALUE;
    if ((int64_t)c->rows != m || (int64_t)c->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    if ((int64_t)dd->rows != m || (int64_t)dd->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    if (a->batch_count != dd->batch_count || b->batch_count != dd->batch_count ||
        c->batch_count != dd->batch_count)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (c->type != dd->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a->type != b->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    const int ab = a->type, cd = c->type;
    if (ab == CUDA_R_32F) {
        if (cd != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    } else if (ab == CUDA_R_16BF || ab == CUDA_R_16F) {
        if (cd != ab && cd != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    } else {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (d->scale_type != CUDA_R_32F || !compute_ok(d->compute_type, ab)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST && d->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d->epilogue == CUBLASLT_EPILOGUE_BIAS) {
        if (d->bias_type != -1 && d->bias_type != dd->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    } else if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    pr->m = m;
    pr->n = n;
    pr->k = ka;
    pr->batch = dd->batch_count;
    pr->ta = ta;
    pr->tb = tb;
    return CUBLAS_STATUS_SUCCESS;
}

/* The algorithm records the types it was chosen for and the alignments the
 * preference promised. */
uint64_t type_fingerprint(const EmuDesc *d, const EmuLayout *a, const EmuLayout *c)
{
    return ((uint64_t)(uint32_t)d->compute_type << 40) | ((uint64_t)(uint32_t)d->scale_type << 32) |
           ((uint64_t)(uint32_t)a->type << 16) | (uint64_t)(uint32_t)c->type;
}

template <typename T> cublasStatus_t get_attr(const void *buf, size_t size, T *out)
{
    if (!buf || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(out, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

/* ================================================================ cuBLASLt */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtContext *h = new (std::nothrow) cublasLtContext;
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = kMagicLt;
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    if (!lt_handle_ok(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    lightHandle->magic = 0;
    delete lightHandle;
    return CUBLAS_STATUS_SUCCESS;
}

/* Any compute and scale type is stored; the supported ones are checked when
 * the descriptor is used (heuristic, matmul). */
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType)
{
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    EmuDesc *d = new (std::nothrow) EmuDesc;
    if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
    d->magic = kMagicDesc;
    d->compute_type = computeType;
    d->scale_type = scaleType;
    d->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    d->transa = d->transb = CUBLAS_OP_N;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias = nullptr;
    d->bias_batch_stride = 0;
    d->bias_type = -1;
    *matmulDesc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    if (!matmulDesc) return CUBLAS_STATUS_SUCCESS;
    EmuDesc *d = desc_of(matmulDesc);
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    d->magic = 0;
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

/* Supported: COMPUTE_TYPE, SCALE_TYPE, POINTER_MODE (HOST, DEVICE), TRANSA,
 * TRANSB (N, T, C), TRANSC (N only), FILL_MODE (FULL only), EPILOGUE
 * (DEFAULT, BIAS), BIAS_POINTER, BIAS_BATCH_STRIDE, BIAS_DATA_TYPE (checked
 * at use: D's type).  Every other attribute: NOT_SUPPORTED.  A wrong size
 * or NULL buf: INVALID_VALUE (as documented). */
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes)
{
    EmuDesc *d = desc_of(matmulDesc);
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
        if ((st = get_attr(buf, sizeInBytes, &i32)) != CUBLAS_STATUS_SUCCESS) return st;
        d->compute_type = i32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
        if ((st = get_attr(buf, sizeInBytes, &i32)) != CUBLAS_STATUS_SUCCESS) return st;
        d->scale_type = i32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
        if ((st = get_attr(buf, sizeInBytes, &i32)) != CUBLAS_STATUS_SUCCESS) return st;
        if (i32 != CUBLASLT_POINTER_MODE_HOST && i32 != CUBLASLT_POINTER_MODE_DEVICE)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        d->pointer_mode = i32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if ((st = get_attr(buf, sizeInBytes, &i32)) != CUBLAS_STATUS_SUCCESS) return st;
        if (!valid_op(i32)) return CUBLAS_STATUS_INVALID_VALUE;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = i32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSC:
        if ((st = get_attr(buf, sizeInBytes, &i32)) != CUBLAS_STATUS_SUCCESS) return st;
        return i32 == CUBLAS_OP_N ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLASLT_MATMUL_DESC_FILL_MODE:
        if ((st = get_attr(buf, sizeInBytes, &i32)) != CUBLAS_STATUS_SUCCESS) return st;
        return i32 == CUBLAS_FILL_MODE_FULL ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if ((st = get_attr(buf, sizeInBytes, &u32)) != CUBLAS_STATUS_SUCCESS) return st;
        if (u32 != CUBLASLT_EPILOGUE_DEFAULT && u32 != CUBLASLT_EPILOGUE_BIAS) return CUBLAS_STATUS_NOT_SUPPORTED;
        d->epilogue = u32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: {
        const void *p;
        if ((st = get_attr(buf, sizeInBytes, &p)) != CUBLAS_STATUS_SUCCESS) return st;
        d->bias = p;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
        if ((st = get_attr(buf, sizeInBytes, &i64)) != CUBLAS_STATUS_SUCCESS) return st;
        d->bias_batch_stride = i64;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        if ((st = get_attr(buf, sizeInBytes, &i32)) != CUBLAS_STATUS_SUCCESS) return st;
        d->bias_type = i32;
        return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

/* Any type is stored; the supported ones are checked at use. */
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld)
{
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    EmuLayout *l = new (std::nothrow) EmuLayout;
    if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
    l->magic = kMagicLayout;
    l->type = type;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    l->batch_count = 1;
    l->batch_stride = 0;
    *matLayout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    if (!matLayout) return CUBLAS_STATUS_SUCCESS;
    EmuLayout *l = layout_of(matLayout);
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    l->magic = 0;
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

/* Supported: TYPE, ORDER (CUBLASLT_ORDER_COL only), ROWS, COLS, LD,
 * BATCH_COUNT, STRIDED_BATCH_OFFSET, PLANE_OFFSET (0 only), BATCH_MODE
 * (STRIDED only).  Other values or attributes: NOT_SUPPORTED. */
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes)
{
    EmuLayout *l = layout_of(matLayout);
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st;
    int32_t i32;
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
        if ((st = get_attr(buf, sizeInBytes, &u32)) != CUBLAS_STATUS_SUCCESS) return st;
        l->type = (int32_t)u32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
        if ((st = get_attr(buf, sizeInBytes, &i32)) != CUBLAS_STATUS_SUCCESS) return st;
        return i32 == CUBLASLT_ORDER_COL ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
    case CUBLASLT_MATRIX_LAYOUT_COLS:
        if ((st = get_attr(buf, sizeInBytes, &u64)) != CUBLAS_STATUS_SUCCESS) return st;
        (attr == CUBLASLT_MATRIX_LAYOUT_ROWS ? l->rows : l->cols) = u64;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATRIX_LAYOUT_LD:
        if ((st = get_attr(buf, sizeInBytes, &i64)) != CUBLAS_STATUS_SUCCESS) return st;
        l->ld = i64;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
        if ((st = get_attr(buf, sizeInBytes, &i32)) != CUBLAS_STATUS_SUCCESS) return st;
        if (i32 < 1) return CUBLAS_STATUS_INVALID_VALUE;
        l->batch_count = i32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        if ((st = get_attr(buf, sizeInBytes, &i64)) != CUBLAS_STATUS_SUCCESS) return st;
        l->batch_stride = i64;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET:
        if ((st = get_attr(buf, sizeInBytes, &i64)) != CUBLAS_STATUS_SUCCESS) return st;
        return i64 == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE:
        if ((st = get_attr(buf, sizeInBytes, &u32)) != CUBLAS_STATUS_SUCCESS) return st;
        return u32 == CUBLASLT_BATCH_MODE_STRIDED ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    EmuPref *p = new (std::nothrow) EmuPref;
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    p->magic = kMagicPref;
    p->max_workspace = 0;
    for (uint32_t &a : p->align) a = 256; /* the documented default */
    *pref = reinterpret_cast<cublasLtMatmulPreference_t>(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    if (!pref) return CUBLAS_STATUS_SUCCESS;
    EmuPref *p = pref_of(pref);
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    p->magic = 0;
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

/* Supported: SEARCH_MODE (BEST_FIT only), MAX_WORKSPACE_BYTES (stored; the
 * stand-in needs none), MIN_ALIGNMENT_{A,B,C,D}_BYTES (stored, recorded in
 * the algorithm).  Others: NOT_SUPPORTED. */
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t sizeInBytes)
{
    EmuPref *p = pref_of(pref);
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st;
    uint32_t u32;
    uint64_t u64;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
        if ((st = get_attr(buf, sizeInBytes, &u32)) != CUBLAS_STATUS_SUCCESS) return st;
        return u32 == CUBLASLT_SEARCH_BEST_FIT ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        if ((st = get_attr(buf, sizeInBytes, &u64)) != CUBLAS_STATUS_SUCCESS) return st;
        p->max_workspace = u64;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        if ((st = get_attr(buf, sizeInBytes, &u32)) != CUBLAS_STATUS_SUCCESS) return st;
        p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = u32;
        return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

/* One result (workspace 0, state SUCCESS) for a supported, consistent
 * problem.  None (*returnAlgoCount = 0) otherwise, with status
 * INVALID_VALUE for an inconsistent problem (dimensions, ld, batch counts)
 * and NOT_SUPPORTED for one the stand-in does not do (types, epilogue, a
 * minimum alignment that is not a power of two or is below the element
 * size). */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount)
{
    if (!lt_handle_ok(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount) return CUBLAS_STATUS_INVALID_VALUE;
    *returnAlgoCount = 0;
    const EmuPref *pref = pref_of(preference);
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    const EmuDesc *d = desc_of(operationDesc);
    const EmuLayout *a = layout_of(Adesc), *b = layout_of(Bdesc), *c = layout_of(Cdesc), *dd = layout_of(Ddesc);
    Problem pr;
    cublasStatus_t st = check_problem(d, a, b, c, dd, &pr);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const int types[4] = {a->type, b->type, c->type, dd->type};
    for (int i = 0; i < 4; i++) {
        uint32_t al = pref->align[i];
        if (al == 0 || (al & (al - 1)) || al < elem_size(types[i])) return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    cublasLtMatmulHeuristicResult_t &r = heuristicResultsArray[0];
    std::memset(&r, 0, sizeof r);
    r.algo.data[0] = kMagicAlgo;
    r.algo.data[1] = type_fingerprint(d, a, c);
    for (int i = 0; i < 4; i++) r.algo.data[2 + i] = pref->align[i];
    r.workspaceSize = 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* D = alpha op(A) op(B) + beta C (+ bias).  algo: NULL, or one from the
 * heuristic for the same types, and the pointers at least as aligned as
 * that heuristic's preference said.  In place (C == D) needs the same
 * layout for C and D.  Refused: NULL handle (NOT_INITIALIZED); NULL
 * descriptors, alpha, beta, A/B (when read), D, bias (BIAS epilogue), a
 * foreign or mismatched algo, misaligned pointers, workspace size > 0 with
 * no workspace (INVALID_VALUE); plus check_problem's refusals. */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream)
{
    if (!lt_handle_ok(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    const EmuDesc *d = desc_of(computeDesc);
    const void *bias_read = d && d->epilogue == CUBLASLT_EPILOGUE_BIAS ? d->bias : nullptr;
    spb_emu_stream_track(stream, "cublasLtMatmul",
                         {{A, 0, 0}, {B, 0, 0}, {C != D ? C : nullptr, 0, 0}, {bias_read, 0, 0}, {D, 0, 1}});
    const EmuLayout *a = layout_of(Adesc), *b = layout_of(Bdesc), *c = layout_of(Cdesc), *dd = layout_of(Ddesc);
    Problem pr;
    cublasStatus_t st = check_problem(d, a, b, c, dd, &pr);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    if (workspaceSizeInBytes > 0 && !workspace) return CUBLAS_STATUS_INVALID_VALUE;
    /* Host and device pointer mode read the same way here. */
    const float al = *static_cast<const float *>(alpha), be = *static_cast<const float *>(beta);
    const bool empty = pr.m == 0 || pr.n == 0;
    const bool reads_ab = !empty && pr.k > 0 && al != 0.0f;
    const bool reads_c = !empty && be != 0.0f;
    if (!empty && !D) return CUBLAS_STATUS_INVALID_VALUE;
    if (reads_ab && (!A || !B)) return CUBLAS_STATUS_INVALID_VALUE;
    if (reads_c && !C) return CUBLAS_STATUS_INVALID_VALUE;
    const bool bias_on = d->epilogue == CUBLASLT_EPILOGUE_BIAS;
    if (bias_on && !empty && !d->bias) return CUBLAS_STATUS_INVALID_VALUE;
    if (C && C == D) { /* in place: Cdesc and Ddesc must describe the same matrix */
        if (c->ld != dd->ld || c->batch_stride != dd->batch_stride) return CUBLAS_STATUS_INVALID_VALUE;
    }
    /* Alignment: at least the element size, and at least what the
     * algorithm's preference promised. */
    const void *ptrs[4] = {A, B, C, D};
    const int types[4] = {a->type, b->type, c->type, dd->type};
    if (algo) {
        if (algo->data[0] != kMagicAlgo || algo->data[1] != type_fingerprint(d, a, c))
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (int i = 0; i < 4; i++) {
        if (!ptrs[i]) continue;
        uint32_t need = (uint32_t)elem_size(types[i]);
        if (algo && algo->data[2 + i] > need) need = (uint32_t)algo->data[2 + i];
        if (alignment_of(ptrs[i]) < need) return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (empty) return CUBLAS_STATUS_SUCCESS;
    const int bias_type = d->bias_type == -1 ? dd->type : d->bias_type;
    for (int bt = 0; bt < pr.batch; bt++) {
        const size_t ea = elem_size(a->type), eb = elem_size(b->type), ec = elem_size(c->type),
                     ed = elem_size(dd->type), ebias = elem_size(bias_type);
        Operand oa = {a->type, A ? static_cast<const char *>(A) + (int64_t)ea * bt * a->batch_stride : nullptr, a->ld};
        Operand ob = {b->type, B ? static_cast<const char *>(B) + (int64_t)eb * bt * b->batch_stride : nullptr, b->ld};
        Operand oc = {c->type, C ? static_cast<const char *>(C) + (int64_t)ec * bt * c->batch_stride : nullptr, c->ld};
        void *pd = static_cast<char *>(D) + (int64_t)ed * bt * dd->batch_stride;
        const void *pbias =
            bias_on ? static_cast<const char *>(d->bias) + (int64_t)ebias * bt * d->bias_batch_stride : nullptr;
        st = gemm_core(pr.ta, pr.tb, pr.m, pr.n, pr.k, al, oa, ob, be, oc, dd->type, pd, dd->ld, pbias, bias_type);
        if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ============================================================= cuBLAS v2 */

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    cublasContext *h = new (std::nothrow) cublasContext;
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = kMagicBlas;
    h->pointer_mode = CUBLAS_POINTER_MODE_HOST;
    h->math_mode = CUBLAS_DEFAULT_MATH;
    h->stream = nullptr;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    if (!blas_handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

/* Stored, otherwise ignored: every call is synchronous. */
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
{
    if (!blas_handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = streamId;
    return CUBLAS_STATUS_SUCCESS;
}

/* HOST and DEVICE (device memory is host memory here: both dereferenced). */
cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode)
{
    if (!blas_handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) return CUBLAS_STATUS_INVALID_VALUE;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* CUBLAS_DEFAULT_MATH and CUBLAS_PEDANTIC_MATH (fp32 stays fp32), with or
 * without CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION.  TF32, BF16x9,
 * the deprecated TENSOR_OP_MATH and the fp64 emulation change the fp32
 * results on the device, which the stand-in does not model: NOT_SUPPORTED. */
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!blas_handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    const unsigned base = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_PEDANTIC_MATH) return CUBLAS_STATUS_NOT_SUPPORTED;
    handle->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

/* Column-major fp32 GEMM, reference BLAS argument rules: INVALID_VALUE for
 * a bad op, m/n/k < 0, lda < max(1, rows of A as stored), ldb likewise,
 * ldc < max(1, m), NULL alpha/beta (or NULL matrices that would be read). */
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                              const float *beta, float *C, int ldc)
{
    if (!blas_handle_ok(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!valid_op(transa) || !valid_op(transb)) return CUBLAS_STATUS_INVALID_VALUE;
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    spb_emu_stream_track(handle->stream, "cublasSgemm", {{A, 0, 0}, {B, 0, 0}, {C, 0, 1}});
    const bool ta = is_trans(transa), tb = is_trans(transb);
    const int rows_a = ta ? k : m, rows_b = tb ? n : k;
    if (lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    const float al = *alpha, be = *beta; /* host or device pointer mode: same memory here */
    if (!C) return CUBLAS_STATUS_INVALID_VALUE;
    if (k > 0 && al != 0.0f && (!A || !B)) return CUBLAS_STATUS_INVALID_VALUE;
    Operand oa = {CUDA_R_32F, A, lda}, ob = {CUDA_R_32F, B, ldb}, oc = {CUDA_R_32F, C, ldc};
    return gemm_core(ta, tb, m, n, k, al, oa, ob, be, oc, CUDA_R_32F, C, ldc, nullptr, CUDA_R_32F);
}
