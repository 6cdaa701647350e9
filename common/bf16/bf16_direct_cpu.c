/* The direct kernels' contracts (bf16_direct.h) on host storage: what the
 * CUDA instance computes with cuBLASLt and its 16-bit kernels, computed here
 * with cblas, the CPU flash kernel, ops_cpu.c's GELU, LayerNorm, adds and
 * cross-entropy, attention_merge.c's merge and optimizer.c's AdamW on exact
 * fp32 copies of the stored operands.  Not faster than the frames (it
 * copies as much); it exists so that the dispatch, the mapping of every
 * product onto one gemm and the attention path through it run in the CPU
 * tests. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_direct.h"
#include "bf16_frame.h"
#include "checks.h"
#include "ops.h"
#include "optimizer.h"

/* 16-bit storage in the process's format (bf16, or fp16 for --precision
 * fp16), rounded to nearest even as the frames round. */
static float half_to_float(spb_bf16 x)
{
    return spb_handles_half_format() == SPB_HALF_FP16 ? spb_fp16_to_float(x) : spb_bf16_to_float(x);
}
static spb_bf16 half_from_float(float v)
{
    return spb_handles_half_format() == SPB_HALF_FP16 ? spb_fp16_from_float(v) : spb_bf16_from_float(v);
}

static float *widened(const spb_bf16 *x, long n)
{
    float *w = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(n > 0 ? n : 1)));
    for (long i = 0; i < n; i++) w[i] = half_to_float(x[i]);
    return w;
}


static void cpu_gemm(int transA, int transB, int m, int n, int k, const spb_bf16 *A, int lda, const spb_bf16 *B,
                     int ldb, float beta, void *C, spb_dtype c_type, int ldc)
{
    float *a = widened(A, transA ? spb_strided_extent(k, lda, m) : spb_strided_extent(m, lda, k));
    float *b = widened(B, transB ? spb_strided_extent(n, ldb, k) : spb_strided_extent(k, ldb, n));
    long cx = spb_strided_extent(m, ldc, n);
    float *c = c_type == SPB_DTYPE_HALF ? widened(C, cx) : C;
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, m, n, k, 1.0f,
                a, lda, b, ldb, beta, c, ldc);
    if (c_type == SPB_DTYPE_HALF) {
        spb_bf16 *out = C;
        for (long r = 0; r < m; r++)
            for (long j = 0; j < n; j++) out[r * ldc + j] = half_from_float(c[r * ldc + j]);
        free(c);
    }
    free(a);
    free(b);
}

static void cpu_broadcast_rows(void *C, spb_dtype c_type, int ldc, const spb_bf16 *b, int rows, int n)
{
    for (long r = 0; r < rows; r++)
        for (long j = 0; j < n; j++) {
            if (c_type == SPB_DTYPE_HALF)
                ((spb_bf16 *)C)[r * ldc + j] = b[j];
            else
                ((float *)C)[r * ldc + j] = half_to_float(b[j]);
        }
}

static void narrowed(spb_bf16 *out, const float *x, long n)
{
    for (long i = 0; i < n; i++) out[i] = half_from_float(x[i]);
}

static void cpu_gelu_forward(spb_bf16 *out, const spb_bf16 *inp, long n)
{
    float *x = widened(inp, n), *y = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)n));
    spb_gelu_forward(y, x, n);
    narrowed(out, y, n);
    free(x), free(y);
}

static void cpu_gelu_backward(spb_bf16 *dinp, const spb_bf16 *inp, const spb_bf16 *dout, long n)
{
    float *x = widened(inp, n), *g = widened(dout, n);
    spb_gelu_backward(g, x, g, n);
    narrowed(dinp, g, n);
    free(x), free(g);
}

/* An operand of either type as an fp32 copy, and back. */
static float *widened_stored(spb_stored s, long n)
{
    if (s.type == SPB_DTYPE_HALF) return widened(s.p, n);
    float *w = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(n > 0 ? n : 1)));
    memcpy(w, s.p, sizeof(float) * (size_t)n);
    return w;
}

static void store_back(spb_stored s, const float *x, long n)
{
    if (s.type == SPB_DTYPE_HALF)
        narrowed(s.p, x, n);
    else
        memcpy(s.p, x, sizeof(float) * (size_t)n);
}

static void cpu_layernorm_forward(spb_stored out, float *mean, float *rstd, spb_stored inp, spb_stored w,
                                  spb_stored b, int rows, int C)
{
    long n = (long)rows * C;
    float *x = widened_stored(inp, n), *w32 = widened_stored(w, C), *b32 = widened_stored(b, C);
    float *y = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)n));
    spb_layernorm_forward(y, mean, rstd, x, w32, b32, rows, C);
    store_back(out, y, n);
    free(x), free(w32), free(b32), free(y);
}

static void cpu_layernorm_backward(spb_stored dinp, spb_stored dw, spb_stored db, spb_stored dout, spb_stored inp,
                                   spb_stored w, const float *mean, const float *rstd, int rows, int C)
{
    long n = (long)rows * C;
    float *dx = widened_stored(dinp, n), *dw32 = widened_stored(dw, C), *db32 = widened_stored(db, C);
    float *dy = dout.p == dinp.p ? dx : widened_stored(dout, n); /* one copy when dinp is dout, as a frame */
    float *x = widened_stored(inp, n), *w32 = widened_stored(w, C);
    spb_layernorm_backward(dx, dw32, db32, dy, x, w32, mean, rstd, rows, C);
    store_back(dinp, dx, n);
    store_back(dw, dw32, C);
    store_back(db, db32, C);
    if (dy != dx) free(dy);
    free(dx), free(dw32), free(db32), free(x), free(w32);
}

static void cpu_add_inplace(spb_stored a, spb_stored b, long n)
{
    float *x = widened_stored(a, n), *y = a.p == b.p ? x : widened_stored(b, n);
    spb_add_inplace(x, y, n);
    store_back(a, x, n);
    if (y != x) free(y);
    free(x);
}

static void cpu_add_bias_rows(spb_stored x, spb_stored b, long rows, int C)
{
    float *y = widened_stored(x, rows * C), *b32 = widened_stored(b, C);
    for (long r = 0; r < rows; r++) spb_add_inplace(y + r * C, b32, C);
    store_back(x, y, rows * C);
    free(y), free(b32);
}

/* row by row, as the frames sum */
static void cpu_bias_grad_rows(spb_stored db, spb_stored dy, long rows, int C)
{
    float *g = widened_stored(db, C), *y = widened_stored(dy, rows * C);
    for (long r = 0; r < rows; r++) spb_add_inplace(g, y + r * C, C);
    store_back(db, g, C);
    free(g), free(y);
}

static void cpu_attn_merge(spb_stored o_acc, float *lse_acc, spb_stored o_pair, const float *lse_pair, int batch,
                           int heads, int head_dim, int T, int row, int len)
{
    const long n = (long)batch * T * heads * head_dim;
    float *oa = widened_stored(o_acc, n), *ob = widened_stored(o_pair, n);
    spb_attn_merge_rows(oa, lse_acc, ob, lse_pair, batch, heads, head_dim, T, row, len);
    store_back(o_acc, oa, n); /* rows outside [row, row + len) come back as they were */
    free(oa), free(ob);
}

static void cpu_copy_rows(spb_stored dst, long dst_stride, spb_stored src, long src_stride, long rows, long width)
{
    for (long r = 0; r < rows; r++) {
        spb_stored d = dst, s = src;
        long es_d = dst.type == SPB_DTYPE_HALF ? 2 : 4, es_s = src.type == SPB_DTYPE_HALF ? 2 : 4;
        d.p = (char *)dst.p + r * dst_stride * es_d;
        s.p = (char *)src.p + r * src_stride * es_s;
        float *v = widened_stored(s, width);
        store_back(d, v, width);
        free(v);
    }
}

static void cpu_fill(spb_stored x, long n, float value)
{
    float *v = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)n));
    for (long i = 0; i < n; i++) v[i] = value;
    store_back(x, v, n);
    free(v);
}

static void cpu_adamw_apply(float *masters, spb_stored p, spb_stored grad, spb_stored m, spb_stored v, long n,
                            float grad_scale, float weight_decay, const spb_config *cfg, long step, double lr)
{
    float *g = widened_stored(grad, n), *m32 = widened_stored(m, n), *v32 = widened_stored(v, n);
    spb_adamw_apply(masters, g, m32, v32, n, grad_scale, weight_decay, cfg, step, lr);
    store_back(m, m32, n);
    store_back(v, v32, n);
    store_back(p, masters, n);
    free(g), free(m32), free(v32);
}

static double cpu_sum_squares(spb_stored x, long n)
{
    float *x32 = widened_stored(x, n);
    double s = spb_sum_squares(x32, n);
    free(x32);
    return s;
}

static void cpu_embedding_forward(spb_stored out, const int *tokens, const spb_bf16 *wte, const spb_bf16 *wpe,
                                  const long *positions, int rows, int T, int C)
{
    float *y = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)C));
    for (int r = 0; r < rows; r++) {
        const spb_bf16 *e = wte + (long)tokens[r] * C, *p = wpe + positions[r % T] * C;
        for (int i = 0; i < C; i++) y[i] = half_to_float(e[i]) + half_to_float(p[i]);
        spb_stored row = out;
        row.p = (char *)out.p + (long)r * C * (out.type == SPB_DTYPE_HALF ? 2 : 4);
        store_back(row, y, C);
    }
    free(y);
}

static void cpu_embedding_backward_rows(spb_stored table, spb_stored dout, int C, int groups, const int *keys,
                                        const int *starts, const int *order)
{
    const long es_t = table.type == SPB_DTYPE_HALF ? 2 : 4, es_d = dout.type == SPB_DTYPE_HALF ? 2 : 4;
    for (int g = 0; g < groups; g++) {
        spb_stored row = table;
        row.p = (char *)table.p + (long)keys[g] * C * es_t;
        float *acc = widened_stored(row, C);
        for (int k = starts[g]; k < starts[g + 1]; k++) {
            spb_stored d = dout;
            d.p = (char *)dout.p + (long)order[k] * C * es_d;
            float *x = widened_stored(d, C);
            for (int i = 0; i < C; i++) acc[i] += x[i];
            free(x);
        }
        store_back(row, acc, C);
        free(acc);
    }
}

static double cpu_softmax_xent_forward(spb_stored probs, const int *targets, int rows, int V)
{
    long n = (long)rows * V;
    float *p = widened_stored(probs, n);
    double loss = spb_softmax_xent_forward(p, targets, rows, V);
    store_back(probs, p, n);
    free(p);
    return loss;
}

static void cpu_softmax_xent_backward(spb_stored probs, const int *targets, int rows, int V, float scale)
{
    long n = (long)rows * V;
    float *p = widened_stored(probs, n);
    spb_softmax_xent_backward(p, targets, rows, V, scale);
    store_back(probs, p, n);
    free(p);
}

static void cpu_attention_forward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                  spb_bf16 *o, float *lse)
{
    long qx = spb_attn_operand_extent(d, d->q_len, d->q_token_stride, d->q_batch_stride);
    long kx = spb_attn_kv_extent(d);
    long ox = spb_attn_operand_extent(d, d->q_len, d->o_token_stride, d->o_batch_stride);
    float *q32 = widened(q, qx), *k32 = widened(k, kx), *v32 = widened(v, kx), *o32 = widened(o, ox);
    spb_attn_flash.forward(d, q32, k32, v32, o32, lse);
    /* Back over the whole extent: elements between the rows were widened
     * exactly, so they come back unchanged. */
    narrowed(o, o32, ox);
    free(q32), free(k32), free(v32), free(o32);
}

static void cpu_attention_backward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                   const spb_bf16 *o, const float *lse, const spb_bf16 *dout, float *dq, float *dk,
                                   float *dv)
{
    long qx = spb_attn_operand_extent(d, d->q_len, d->q_token_stride, d->q_batch_stride);
    long kx = spb_attn_kv_extent(d);
    long ox = spb_attn_operand_extent(d, d->q_len, d->o_token_stride, d->o_batch_stride);
    float *q32 = widened(q, qx), *k32 = widened(k, kx), *v32 = widened(v, kx);
    float *o32 = widened(o, ox), *g32 = widened(dout, ox);
    spb_attn_flash.backward(d, q32, k32, v32, o32, lse, g32, dq, dk, dv);
    free(q32), free(k32), free(v32), free(o32), free(g32);
}

const spb_bf16_direct spb_bf16_direct_cpu = {
    .name = "cpu emulation",
    .gemm = cpu_gemm,
    .broadcast_rows = cpu_broadcast_rows,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .add_inplace = cpu_add_inplace,
    .copy_rows = cpu_copy_rows,
    .fill = cpu_fill,
    .adamw_apply = cpu_adamw_apply,
    .sum_squares = cpu_sum_squares,
    .softmax_xent_forward = cpu_softmax_xent_forward,
    .softmax_xent_backward = cpu_softmax_xent_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward_rows = cpu_embedding_backward_rows,
    .add_bias_rows = cpu_add_bias_rows,
    .bias_grad_rows = cpu_bias_grad_rows,
    .attn_merge = cpu_attn_merge,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
};
