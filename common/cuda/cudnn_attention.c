/* cuDNN's fused flash attention through the C graph API (cudnn_attention.h).
 *
 * The graphs are the ones cuDNN's fused SDPA engines match (the pattern its
 * own frontend builds; written here from the backend API's documentation,
 * in C, with no code taken from there):
 *
 * forward   S = Q·Kᵀ; S *= scale; [mask: S = row + shift >= col ? S : -inf]
 *           M = max_row S; E = exp(S - M); Z = sum_row E;
 *           Stats = M + log Z (fp32 out); P = E / Z (16-bit); O = P·V
 * backward  Dsum = sum_row(dO ∘ O) (fp32, in our workspace);
 *           S = Q·Kᵀ; S *= scale; [mask]; P = exp(S - Stats);
 *           dV = Pᵀ·dO; dP = dO·Vᵀ; dS = P ∘ (dP - Dsum) · scale;
 *           dK = dSᵀ·Q; dQacc = dS·K (fp32, in our workspace); dQ = dQacc
 *
 * Virtual tensors (never in memory) are fp32 unless an operand of a 16-bit
 * product (P, Pᵀ, dSᵀ, K), which take the operands' type (bf16 or fp16).  Scalars (scale, -inf, 1, the diagonal's shift) are
 * passed by value from host memory at execution. */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cudnn_attention.h"

int spb_cudnn_attention_supported(const spb_attn_desc *d, char *why, size_t n)
{
#define NO(...) return snprintf(why, n, __VA_ARGS__), 0
    if (d->batch <= 0 || d->heads <= 0 || d->q_len <= 0 || d->k_len <= 0) NO("an empty attention call");
    if (d->head_dim % 8 || d->head_dim > 128)
        NO("head dim %d: cuDNN's fused attention here takes multiples of 8 up to 128", d->head_dim);
    if (d->sparse_block > 0) NO("blocked-sparse masks are not in the cuDNN graph (dense masks only)");
    if (spb_attn_kv_heads(d) != d->heads)
        NO("grouped-query attention (%d K/V heads for %d query heads): the graph here takes as many K/V heads as "
           "query heads (callers expand K and V first: cuda_attention_gqa.h)",
           spb_attn_kv_heads(d), d->heads);
    if (d->causal && d->q_offset < d->k_offset)
        NO("causal query block at %ld behind its key block at %ld: rows without a visible key", d->q_offset,
           d->k_offset);
    long strides[6] = {d->q_token_stride, d->q_batch_stride, d->k_token_stride,
                       d->k_batch_stride, d->o_token_stride, d->o_batch_stride};
    for (int i = 0; i < 6; i++)
        if (strides[i] % 8) NO("stride %ld is not a multiple of 8 elements (16 bytes)", strides[i]);
    return 1;
#undef NO
}

#ifndef SPB_HAVE_CUDNN

int spb_cudnn_attention_built(void) { return 0; }

static int not_built(char *why, size_t n)
{
    snprintf(why, n, "this build has no cuDNN (cudnn.h and libcudnn were not found at configure time; docs/GPU.md)");
    return -1;
}

int spb_cudnn_attention_forward(const spb_attn_desc *d, spb_cudnn_half type, const spb_bf16 *q, const spb_bf16 *k,
                                const spb_bf16 *v, spb_bf16 *o, float *lse, cudaStream_t s, char *why, size_t n)
{
    (void)d, (void)type, (void)q, (void)k, (void)v, (void)o, (void)lse, (void)s;
    return not_built(why, n);
}

int spb_cudnn_attention_backward(const spb_attn_desc *d, spb_cudnn_half type, const spb_bf16 *q, const spb_bf16 *k,
                                 const spb_bf16 *v, const spb_bf16 *o, const float *lse, const spb_bf16 *dout,
                                 spb_bf16 *dq, spb_bf16 *dk, spb_bf16 *dv, cudaStream_t s, char *why, size_t n)
{
    (void)d, (void)type, (void)q, (void)k, (void)v, (void)o, (void)lse, (void)dout, (void)dq, (void)dk, (void)dv,
        (void)s;
    return not_built(why, n);
}

int spb_cudnn_attention_describe(const spb_attn_desc *d, spb_cudnn_half type, int backward, char *why, size_t n)
{
    (void)d, (void)type, (void)backward;
    return not_built(why, n);
}

const char *spb_cudnn_attention_version(void) { return "not built (no cuDNN at configure time)"; }

#else /* SPB_HAVE_CUDNN */

#include <cudnn.h>

int spb_cudnn_attention_built(void) { return 1; }

enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV, UID_DSUM, UID_DQ_ACCUM,
    UID_SCALE = 20, UID_NEG_INF, UID_ONE, UID_SHIFT,
    UID_VIRTUAL = 100,
};

#define MAX_DESCRIPTORS 160
#define MAX_OPS 40

/* One graph under construction: every descriptor it created (destroyed
 * together), its operations in order, and the first failure. */
typedef struct graph {
    cudnnBackendDescriptor_t all[MAX_DESCRIPTORS];
    int nall;
    cudnnBackendDescriptor_t ops[MAX_OPS];
    int nops;
    int64_t next_virtual;
    cudnnDataType_t half; /* the operands' 16-bit type */
    /* the by-value scalars made so far, by uid - UID_SCALE: one descriptor
     * per uid (a graph with two tensors of one uid is refused) */
    cudnnBackendDescriptor_t scalars[4];
    int64_t uids[MAX_DESCRIPTORS]; /* of every tensor made, in order */
    int ntensors;
    int failed;
    char why[256];
} graph;

static void fail(graph *g, const char *call, cudnnStatus_t st, int line)
{
    if (g->failed) return;
    g->failed = 1;
    snprintf(g->why, sizeof g->why, "%s: %s (common/cuda/cudnn_attention.c:%d)", call, cudnnGetErrorString(st), line);
}

static cudnnBackendDescriptor_t make_(graph *g, cudnnBackendDescriptorType_t type, const char *what, int line)
{
    if (g->failed) return NULL;
    if (g->nall == MAX_DESCRIPTORS) {
        g->failed = 1;
        snprintf(g->why, sizeof g->why, "more than %d descriptors (cudnn_attention.c:%d)", MAX_DESCRIPTORS, line);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) return fail(g, what, st, line), NULL;
    return g->all[g->nall++] = d;
}

static void set_(graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                 cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *what, int line)
{
    if (g->failed) return;
    cudnnStatus_t st = cudnnBackendSetAttribute(d, name, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS) fail(g, what, st, line);
}

static void finalize_(graph *g, cudnnBackendDescriptor_t d, const char *what, int line)
{
    if (g->failed) return;
    cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) fail(g, what, st, line);
}

#define MAKE(g, type) make_(g, type, "cudnnBackendCreateDescriptor(" #type ")", __LINE__)
#define SET(g, d, name, type, count, value) set_(g, d, name, type, count, value, "set " #name, __LINE__)
#define FINALIZE(g, d, what) finalize_(g, d, "finalize " what, __LINE__)

/* ---------------------------------------------------------------- tensors -- */
typedef struct shape4 {
    int64_t dim[4], stride[4];
} shape4;

static cudnnBackendDescriptor_t tensor_(graph *g, cudnnDataType_t type, shape4 s, int64_t uid, int is_virtual,
                                        int by_value)
{
    cudnnBackendDescriptor_t t = MAKE(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    if (t) g->uids[g->ntensors++] = uid;
    int64_t align = 16;
    bool v = is_virtual != 0, bv = by_value != 0;
    SET(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    SET(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, s.dim);
    SET(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, s.stride);
    SET(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    SET(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (v) SET(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    if (bv) SET(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv);
    FINALIZE(g, t, "tensor");
    return t;
}

static cudnnBackendDescriptor_t in_memory(graph *g, cudnnDataType_t type, shape4 s, int64_t uid)
{
    return tensor_(g, type, s, uid, 0, 0);
}

static cudnnBackendDescriptor_t virt(graph *g, cudnnDataType_t type, shape4 s)
{
    return tensor_(g, type, s, UID_VIRTUAL + g->next_virtual++, 1, 0);
}

/* The graph's scalar of that uid (UID_SCALE .. UID_SHIFT), made at its
 * first use: the scale multiplies both the scores and dS. */
static cudnnBackendDescriptor_t scalar(graph *g, cudnnDataType_t type, int64_t uid)
{
    cudnnBackendDescriptor_t *slot = &g->scalars[uid - UID_SCALE];
    if (!*slot) {
        shape4 one = {{1, 1, 1, 1}, {1, 1, 1, 1}};
        *slot = tensor_(g, type, one, uid, 0, 1);
    }
    return *slot;
}

/* ------------------------------------------------------------- operations -- */
static void push_op(graph *g, cudnnBackendDescriptor_t op)
{
    if (g->failed) return;
    if (g->nops == MAX_OPS) {
        g->failed = 1;
        snprintf(g->why, sizeof g->why, "more than %d operations", MAX_OPS);
        return;
    }
    g->ops[g->nops++] = op;
}

/* c = a·b over the last two dimensions, batched over the first two, fp32 sums. */
static void matmul(graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c)
{
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = MAKE(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    SET(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    FINALIZE(g, mm, "matmul descriptor");
    cudnnBackendDescriptor_t op = MAKE(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    FINALIZE(g, op, "matmul operation");
    push_op(g, op);
}

/* y = mode(x [, b [, t]]); axis >= 0 for GEN_INDEX (and the frontend's
 * integer adds).  BINARY_SELECT: y = t ? x : b. */
static void pointwise(graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t precision, int64_t axis,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                      cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t pw = MAKE(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    SET(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    SET(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
    if (axis >= 0) SET(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    FINALIZE(g, pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op = MAKE(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    FINALIZE(g, op, "pointwise operation");
    push_op(g, op);
}

static void unary(graph *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    pointwise(g, mode, CUDNN_DATA_FLOAT, -1, x, NULL, NULL, y);
}

static void binary(graph *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t y)
{
    pointwise(g, mode, CUDNN_DATA_FLOAT, -1, x, b, NULL, y);
}

/* y [B][H][S][1] = reduction of x [B][H][S][K] over its last dimension. */
static void reduce_rows(graph *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = MAKE(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    SET(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    SET(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    FINALIZE(g, rd, "reduction descriptor");
    cudnnBackendDescriptor_t op = MAKE(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    FINALIZE(g, op, "reduction operation");
    push_op(g, op);
}

/* y: the same elements as x seen through other dimensions and strides (a
 * transpose, for the products that take Pᵀ, dSᵀ and K). */
static void reshape(graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op = MAKE(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    SET(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    SET(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    FINALIZE(g, op, "reshape operation");
    push_op(g, op);
}

/* ------------------------------------------------------------ the graphs -- */
/* The causal mask of d: none when every key of the block is visible to
 * every query row (not causal, or the block wholly below the diagonal);
 * else query row i sees key j iff i + shift >= j, shift = q_offset - k_offset. */
static int mask_needed(const spb_attn_desc *d) { return d->causal && d->q_offset - d->k_offset < d->k_len - 1; }
static int32_t mask_shift(const spb_attn_desc *d) { return (int32_t)(d->q_offset - d->k_offset); }

typedef struct shapes {
    shape4 q, kt, k, v, vt, o, stats, score, score_t, qacc;
} shapes;

static shapes shapes_of(const spb_attn_desc *d)
{
    int64_t B = d->batch, H = d->heads, D = d->head_dim, Sq = d->q_len, Sk = d->k_len;
    shapes s = {
        .q = {{B, H, Sq, D}, {d->q_batch_stride, D, d->q_token_stride, 1}},
        .kt = {{B, H, D, Sk}, {d->k_batch_stride, D, 1, d->k_token_stride}},
        .k = {{B, H, Sk, D}, {d->k_batch_stride, D, d->k_token_stride, 1}},
        .v = {{B, H, Sk, D}, {d->k_batch_stride, D, d->k_token_stride, 1}},
        .vt = {{B, H, D, Sk}, {d->k_batch_stride, D, 1, d->k_token_stride}},
        .o = {{B, H, Sq, D}, {d->o_batch_stride, D, d->o_token_stride, 1}},
        .stats = {{B, H, Sq, 1}, {H * Sq, Sq, 1, 1}},
        .score = {{B, H, Sq, Sk}, {H * Sq * Sk, Sq * Sk, Sk, 1}},
        .score_t = {{B, H, Sk, Sq}, {H * Sq * Sk, Sq * Sk, 1, Sk}},
        .qacc = {{B, H, Sq, D}, {H * Sq * D, Sq * D, D, 1}},
    };
    return s;
}

/* The scaled scores with the causal mask applied (or s itself). */
static cudnnBackendDescriptor_t masked(graph *g, const spb_attn_desc *d, const shapes *sh, cudnnBackendDescriptor_t s)
{
    if (!mask_needed(d)) return s;
    cudnnBackendDescriptor_t row = virt(g, CUDNN_DATA_INT32, sh->score), col = virt(g, CUDNN_DATA_INT32, sh->score);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 2, s, NULL, NULL, row);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 3, s, NULL, NULL, col);
    if (mask_shift(d) != 0) {
        cudnnBackendDescriptor_t shifted = virt(g, CUDNN_DATA_INT32, sh->score);
        pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, 3, row, scalar(g, CUDNN_DATA_INT32, UID_SHIFT), NULL,
                  shifted);
        row = shifted;
    }
    cudnnBackendDescriptor_t keep = virt(g, CUDNN_DATA_BOOLEAN, sh->score), out = virt(g, CUDNN_DATA_FLOAT, sh->score);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, scalar(g, CUDNN_DATA_FLOAT, UID_NEG_INF), keep,
              out);
    return out;
}

/* scale · Q·Kᵀ, masked. */
static cudnnBackendDescriptor_t scores(graph *g, const spb_attn_desc *d, const shapes *sh, cudnnBackendDescriptor_t q,
                                       cudnnBackendDescriptor_t kt)
{
    cudnnBackendDescriptor_t s = virt(g, CUDNN_DATA_FLOAT, sh->score), scaled = virt(g, CUDNN_DATA_FLOAT, sh->score);
    matmul(g, q, kt, s);
    binary(g, CUDNN_POINTWISE_MUL, s, scalar(g, CUDNN_DATA_FLOAT, UID_SCALE), scaled);
    return masked(g, d, sh, scaled);
}

static void forward_graph(graph *g, const spb_attn_desc *d)
{
    shapes sh = shapes_of(d);
    cudnnBackendDescriptor_t q = in_memory(g, g->half, sh.q, UID_Q),
                             kt = in_memory(g, g->half, sh.kt, UID_K),
                             v = in_memory(g, g->half, sh.v, UID_V),
                             o = in_memory(g, g->half, sh.o, UID_O),
                             stats = in_memory(g, CUDNN_DATA_FLOAT, sh.stats, UID_STATS);
    cudnnBackendDescriptor_t s = scores(g, d, &sh, q, kt);
    cudnnBackendDescriptor_t m = virt(g, CUDNN_DATA_FLOAT, sh.stats), centred = virt(g, CUDNN_DATA_FLOAT, sh.score),
                             e = virt(g, CUDNN_DATA_FLOAT, sh.score), z = virt(g, CUDNN_DATA_FLOAT, sh.stats),
                             log_z = virt(g, CUDNN_DATA_FLOAT, sh.stats), p = virt(g, g->half, sh.score);
    reduce_rows(g, CUDNN_REDUCE_TENSOR_MAX, s, m);
    binary(g, CUDNN_POINTWISE_SUB, s, m, centred);
    unary(g, CUDNN_POINTWISE_EXP, centred, e);
    reduce_rows(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
    unary(g, CUDNN_POINTWISE_LOG, z, log_z);
    binary(g, CUDNN_POINTWISE_ADD, m, log_z, stats);
    binary(g, CUDNN_POINTWISE_DIV, e, z, p);
    matmul(g, p, v, o);
}

static void backward_graph(graph *g, const spb_attn_desc *d)
{
    shapes sh = shapes_of(d);
    cudnnBackendDescriptor_t q = in_memory(g, g->half, sh.q, UID_Q),
                             kt = in_memory(g, g->half, sh.kt, UID_K),
                             vt = in_memory(g, g->half, sh.vt, UID_V),
                             o = in_memory(g, g->half, sh.o, UID_O),
                             dout = in_memory(g, g->half, sh.o, UID_DO),
                             stats = in_memory(g, CUDNN_DATA_FLOAT, sh.stats, UID_STATS),
                             dq = in_memory(g, g->half, sh.q, UID_DQ),
                             dk = in_memory(g, g->half, sh.k, UID_DK),
                             dv = in_memory(g, g->half, sh.v, UID_DV),
                             dsum = in_memory(g, CUDNN_DATA_FLOAT, sh.stats, UID_DSUM),
                             dq_acc = in_memory(g, CUDNN_DATA_FLOAT, sh.qacc, UID_DQ_ACCUM);
    /* Dsum = rowsum(dO ∘ O), the product in the accumulator's [B][H][Sq][D] layout */
    cudnnBackendDescriptor_t prod = virt(g, CUDNN_DATA_FLOAT, sh.qacc), rows = virt(g, CUDNN_DATA_FLOAT, sh.stats);
    binary(g, CUDNN_POINTWISE_MUL, dout, o, prod);
    reduce_rows(g, CUDNN_REDUCE_TENSOR_ADD, prod, rows);
    binary(g, CUDNN_POINTWISE_MUL, rows, scalar(g, CUDNN_DATA_FLOAT, UID_ONE), dsum);
    /* P = exp(scores - Stats); dV = Pᵀ·dO */
    cudnnBackendDescriptor_t s = scores(g, d, &sh, q, kt);
    cudnnBackendDescriptor_t centred = virt(g, CUDNN_DATA_FLOAT, sh.score), p = virt(g, CUDNN_DATA_FLOAT, sh.score),
                             pt = virt(g, g->half, sh.score_t);
    binary(g, CUDNN_POINTWISE_SUB, s, stats, centred);
    unary(g, CUDNN_POINTWISE_EXP, centred, p);
    reshape(g, p, pt);
    matmul(g, pt, dout, dv);
    /* dS = P ∘ (dO·Vᵀ - Dsum) · scale; dK = dSᵀ·Q; dQ = dS·K */
    cudnnBackendDescriptor_t dp = virt(g, CUDNN_DATA_FLOAT, sh.score), dp_c = virt(g, CUDNN_DATA_FLOAT, sh.score),
                             dp_p = virt(g, CUDNN_DATA_FLOAT, sh.score), ds = virt(g, CUDNN_DATA_FLOAT, sh.score),
                             dst = virt(g, g->half, sh.score_t), k = virt(g, g->half, sh.k);
    matmul(g, dout, vt, dp);
    binary(g, CUDNN_POINTWISE_SUB, dp, dsum, dp_c);
    binary(g, CUDNN_POINTWISE_MUL, dp_c, p, dp_p);
    binary(g, CUDNN_POINTWISE_MUL, dp_p, scalar(g, CUDNN_DATA_FLOAT, UID_SCALE), ds);
    reshape(g, ds, dst);
    matmul(g, dst, q, dk);
    reshape(g, kt, k);
    matmul(g, ds, k, dq_acc);
    unary(g, CUDNN_POINTWISE_IDENTITY, dq_acc, dq);
}

static void build_graph(graph *g, const spb_attn_desc *d, int backward)
{
    if (backward)
        backward_graph(g, d);
    else
        forward_graph(g, d);
}

static void graph_free(graph *g)
{
    for (int i = g->nall - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->all[i]);
    g->nall = g->nops = 0;
}

static cudnnDataType_t cudnn_type(spb_cudnn_half type)
{
    return type == SPB_CUDNN_FP16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

int spb_cudnn_attention_describe(const spb_attn_desc *d, spb_cudnn_half type, int backward, char *why, size_t n)
{
    if (!spb_cudnn_attention_supported(d, why, n)) return -1;
    graph g = {.half = cudnn_type(type)};
    build_graph(&g, d, backward);
    /* uids name tensors: an operation graph with two descriptors of one
     * uid is refused when it is finalized, which needs a GPU; check here */
    for (int i = 0; i < g.ntensors && !g.failed; i++)
        for (int j = i + 1; j < g.ntensors; j++)
            if (g.uids[i] == g.uids[j]) {
                g.failed = 1;
                snprintf(g.why, sizeof g.why, "two tensor descriptors with uid %lld", (long long)g.uids[i]);
                break;
            }
    int ops = g.failed ? -1 : g.nops;
    if (g.failed) snprintf(why, n, "%s", g.why);
    graph_free(&g);
    return ops;
}

/* ------------------------------------------------------- plans and calls -- */
typedef struct plan_key { /* no padding: keys are compared with memcmp */
    int64_t type, backward, batch, heads, head_dim, q_len, k_len, mask, shift;
    int64_t strides[6];
} plan_key;

typedef struct plan {
    plan_key key;
    graph g; /* kept while the plan lives: it was finalized against these */
    cudnnBackendDescriptor_t plan;
    int64_t workspace;
    int64_t engine;
} plan;

enum { MAX_PLANS = 48 };
static plan plans[MAX_PLANS];
static int nplans;
static cudnnHandle_t handle;
static void *workspace, *dsum_buf, *dq_acc_buf;
static size_t workspace_cap, dsum_cap, dq_acc_cap;

static plan_key key_of(const spb_attn_desc *d, spb_cudnn_half type, int backward)
{
    plan_key k = {.type = type,
                  .backward = backward,
                  .batch = d->batch,
                  .heads = d->heads,
                  .head_dim = d->head_dim,
                  .q_len = d->q_len,
                  .k_len = d->k_len,
                  .mask = mask_needed(d),
                  .shift = mask_needed(d) ? mask_shift(d) : 0,
                  .strides = {d->q_token_stride, d->q_batch_stride, d->k_token_stride, d->k_batch_stride,
                              d->o_token_stride, d->o_batch_stride}};
    return k;
}

static int open_handle(char *why, size_t n)
{
    if (handle) return 0;
    size_t v = cudnnGetVersion();
    if (v < 90000) return snprintf(why, n, "cuDNN %zu is older than 9.0 (the graph needs 9)", v), -1;
    if (v == 91000 || v == 91001) /* cuDNN's own frontend refuses these for 16-bit attention */
        return snprintf(why, n, "cuDNN 9.10.0 and 9.10.1 have known bugs in fused 16-bit attention"), -1;
    cudnnStatus_t st = cudnnCreate(&handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        handle = NULL;
        return snprintf(why, n, "cudnnCreate: %s", cudnnGetErrorString(st)), -1;
    }
    return 0;
}

/* The operation graph of g, the heuristics' engine configurations in
 * order, the first whose plan finalizes. */
static int build_plan(graph *g, plan *out, char *why, size_t n)
{
    cudnnBackendDescriptor_t og = MAKE(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    SET(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops);
    SET(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    FINALIZE(g, og, "operation graph");
    cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    char tried[256] = "";
#define TRIED(...)                                                                                                     \
    do {                                                                                                               \
        size_t used_ = strlen(tried);                                                                                  \
        snprintf(tried + used_, sizeof tried - used_, "%s", used_ ? "; " : "");                                        \
        used_ = strlen(tried);                                                                                         \
        snprintf(tried + used_, sizeof tried - used_, __VA_ARGS__);                                                    \
    } while (0)
    /* A mode whose heuristics or plans fail is noted and the next one tried;
     * only a failure to create descriptors (g->failed) ends the search. */
    for (int m = 0; m < 2 && !g->failed; m++) {
        const char *mode = m ? "FALLBACK" : "A";
        cudnnBackendDescriptor_t heur = MAKE(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        if (g->failed) break;
        cudnnStatus_t st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
        if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(heur);
        if (st != CUDNN_STATUS_SUCCESS) {
            TRIED("heuristics %s: %s", mode, cudnnGetErrorString(st));
            continue;
        }
        enum { MAX_CFG = 8 };
        cudnnBackendDescriptor_t cfg[MAX_CFG];
        for (int i = 0; i < MAX_CFG; i++) cfg[i] = MAKE(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (g->failed) break;
        int64_t got = 0;
        st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CFG,
                                      &got, cfg);
        if (st != CUDNN_STATUS_SUCCESS || got == 0) {
            TRIED("heuristics %s: %s", mode, st != CUDNN_STATUS_SUCCESS ? cudnnGetErrorString(st) : "no engine");
            continue;
        }
        for (int64_t i = 0; i < got && i < MAX_CFG; i++) {
            cudnnBackendDescriptor_t p = NULL;
            st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
            if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(p);
            if (st != CUDNN_STATUS_SUCCESS) {
                TRIED("%s config %lld: %s", mode, (long long)i, cudnnGetErrorString(st));
                if (p) cudnnBackendDestroyDescriptor(p);
                continue;
            }
            int64_t ws = 0, got_ws = 0, engine = -1, got_e = 0, ge = 0;
            cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got_ws, &ws);
            cudnnBackendDescriptor_t eng = NULL;
            if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
                if (cudnnBackendGetAttribute(cfg[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                             &ge, &eng) == CUDNN_STATUS_SUCCESS)
                    cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got_e,
                                             &engine);
                cudnnBackendDestroyDescriptor(eng);
            }
            out->plan = p, out->workspace = ws, out->engine = engine;
            return 0;
        }
    }
#undef TRIED
    if (g->failed)
        snprintf(why, n, "%s", g->why);
    else
        snprintf(why, n, "no execution plan for the attention graph (%s)", tried);
    return -1;
}

static plan *plan_for(const spb_attn_desc *d, spb_cudnn_half type, int backward, char *why, size_t n)
{
    plan_key k = key_of(d, type, backward);
    for (int i = 0; i < nplans; i++)
        if (!memcmp(&plans[i].key, &k, sizeof k)) return &plans[i];
    if (open_handle(why, n)) return NULL;
    if (nplans == MAX_PLANS) { /* a new shape every call: start over rather than grow */
        for (int i = 0; i < nplans; i++) cudnnBackendDestroyDescriptor(plans[i].plan), graph_free(&plans[i].g);
        nplans = 0;
    }
    plan *p = &plans[nplans];
    memset(p, 0, sizeof *p);
    p->key = k;
    p->g.half = cudnn_type(type);
    build_graph(&p->g, d, backward);
    int rc = p->g.failed ? (snprintf(why, n, "%s", p->g.why), -1) : build_plan(&p->g, p, why, n);
    if (rc) {
        graph_free(&p->g);
        return NULL;
    }
    return &plans[nplans++];
}

static int aligned(const void *p) { return ((uintptr_t)p & 15) == 0; }

static int execute(plan *p, int nvar, const int64_t *uids, void **ptrs, cudaStream_t s, char *why, size_t n)
{
    for (int i = 0; i < nvar; i++)
        if (uids[i] < UID_SCALE && !aligned(ptrs[i]))
            return snprintf(why, n, "operand %lld is not 16-byte aligned", (long long)uids[i]), -1;
    if (p->workspace > 0) spb_cuda_grow(&workspace, &workspace_cap, SPB_MEM_WORKSPACE, (size_t)p->workspace);
    cudnnStatus_t st = cudnnSetStream(handle, s);
    if (st != CUDNN_STATUS_SUCCESS) return snprintf(why, n, "cudnnSetStream: %s", cudnnGetErrorString(st)), -1;
    cudnnBackendDescriptor_t vp = NULL;
    st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    void *ws = p->workspace > 0 ? workspace : NULL;
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, nvar, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, nvar, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(vp);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(handle, p->plan, vp);
    if (vp) cudnnBackendDestroyDescriptor(vp);
    if (st != CUDNN_STATUS_SUCCESS)
        return snprintf(why, n, "cudnnBackendExecute (engine %lld): %s", (long long)p->engine,
                        cudnnGetErrorString(st)),
               -1;
    return 0;
}

/* By-value scalars live in host memory until the call has been enqueued. */
typedef struct scalars {
    float scale, neg_inf, one;
    int32_t shift;
} scalars;

/* Appends the scalars the graph of d uses (it must name exactly those). */
static int add_scalars(const spb_attn_desc *d, scalars *sc, int backward, int64_t *uids, void **ptrs, int nvar)
{
    /* before 9.10 the fused kernels want the lowest float, not -inf (as
     * cuDNN's frontend passes them): exp(-inf - -inf) in a masked tile */
    sc->scale = d->scale, sc->neg_inf = cudnnGetVersion() < 91000 ? -FLT_MAX : -INFINITY, sc->one = 1.0f;
    sc->shift = mask_shift(d);
    uids[nvar] = UID_SCALE, ptrs[nvar++] = &sc->scale;
    if (backward) uids[nvar] = UID_ONE, ptrs[nvar++] = &sc->one;
    if (mask_needed(d)) {
        uids[nvar] = UID_NEG_INF, ptrs[nvar++] = &sc->neg_inf;
        if (sc->shift != 0) uids[nvar] = UID_SHIFT, ptrs[nvar++] = &sc->shift;
    }
    return nvar;
}

int spb_cudnn_attention_forward(const spb_attn_desc *d, spb_cudnn_half type, const spb_bf16 *q, const spb_bf16 *k,
                                const spb_bf16 *v, spb_bf16 *o, float *lse, cudaStream_t s, char *why, size_t n)
{
    if (d->batch <= 0 || d->heads <= 0 || d->q_len <= 0) return 0; /* no rows: nothing to write */
    if (!spb_cudnn_attention_supported(d, why, n)) return -1;
    plan *p = plan_for(d, type, 0, why, n);
    if (!p) return -1;
    int64_t uids[12] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS};
    void *ptrs[12] = {(void *)q, (void *)k, (void *)v, o, lse};
    scalars sc;
    int nvar = add_scalars(d, &sc, 0, uids, ptrs, 5);
    return execute(p, nvar, uids, ptrs, s, why, n);
}

int spb_cudnn_attention_backward(const spb_attn_desc *d, spb_cudnn_half type, const spb_bf16 *q, const spb_bf16 *k,
                                 const spb_bf16 *v, const spb_bf16 *o, const float *lse, const spb_bf16 *dout,
                                 spb_bf16 *dq, spb_bf16 *dk, spb_bf16 *dv, cudaStream_t s, char *why, size_t n)
{
    if (d->batch <= 0 || d->heads <= 0 || d->q_len <= 0 || d->k_len <= 0) return 0; /* no pairs: nothing to add */
    if (!spb_cudnn_attention_supported(d, why, n)) return -1;
    plan *p = plan_for(d, type, 1, why, n);
    if (!p) return -1;
    size_t rows = (size_t)d->batch * d->heads * d->q_len;
    spb_cuda_grow(&dsum_buf, &dsum_cap, SPB_MEM_WORKSPACE, sizeof(float) * rows);
    spb_cuda_grow(&dq_acc_buf, &dq_acc_cap, SPB_MEM_WORKSPACE, sizeof(float) * rows * (size_t)d->head_dim);
    /* cuDNN before 9.6 expects a zeroed accumulator (later ones zero it) */
    if (cudnnGetVersion() < 90600 &&
        cudaMemsetAsync(dq_acc_buf, 0, sizeof(float) * rows * (size_t)d->head_dim, s) != cudaSuccess)
        return snprintf(why, n, "cudaMemsetAsync of the dQ accumulator failed"), -1;
    int64_t uids[16] = {UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_DQ, UID_DK, UID_DV, UID_DSUM, UID_DQ_ACCUM};
    void *ptrs[16] = {(void *)q, (void *)k, (void *)v, (void *)o, (void *)dout, (void *)lse,
                      dq,        dk,        dv,        dsum_buf,  dq_acc_buf};
    scalars sc;
    int nvar = add_scalars(d, &sc, 1, uids, ptrs, 11);
    return execute(p, nvar, uids, ptrs, s, why, n);
}

const char *spb_cudnn_attention_version(void)
{
    static char text[64];
    size_t v = cudnnGetVersion();
    snprintf(text, sizeof text, "cuDNN %zu.%zu.%zu (headers %d.%d.%d)", v / 10000, v / 100 % 100, v % 100,
             CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL);
    return text;
}

#endif /* SPB_HAVE_CUDNN */
