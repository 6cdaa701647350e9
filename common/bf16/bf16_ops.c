#include "bf16_ops.h"

#include <stdlib.h>
#include <string.h>

#include "bf16_direct.h"
#include "bf16_frame.h"
#include "checks.h"

/* The instance in use: the fp32 table computing on the frames' copies (its
 * storage is the handle registry's, spb_handles_storage). */
static const spb_backend *inner = &spb_backend_cpu;
static const spb_bf16_direct *instance_direct = &spb_bf16_direct_cpu;

void spb_bf16_use(const spb_backend *fp32_table, const spb_handle_storage *storage, const spb_bf16_direct *direct)
{
    spb_handles_set_storage(storage);
    inner = fp32_table;
    instance_direct = direct;
}

void spb_bf16_select_kernels(const char *kernels)
{
    spb_bf16_use_direct(kernels && !strcmp(kernels, "fast") ? instance_direct : NULL);
}

const spb_backend *spb_bf16_inner(void) { return inner; }

/* --- matrix products: fp32 products of bf16 operands, rounded once ---------- */

void spb_bf16_matmul_forward(float *out, const float *inp, const float *W, const float *b, int rows, int in,
                             int out_f)
{
    spb_bf16_matmul_forward_ld(out, out_f, inp, in, W, in, b, rows, in, out_f, 0);
}

void spb_bf16_matmul_backward(float *dinp, float *dW, float *db, const float *dout, const float *inp,
                              const float *W, int rows, int in, int out_f, int accumulate_dinp)
{
    spb_bf16_matmul_backward_ld(dinp, in, dW, in, db, dout, out_f, inp, in, W, in, rows, in, out_f, accumulate_dinp);
}

void spb_bf16_matmul_forward_ld(float *out, int ldo, const float *inp, int ldi, const float *W, int ldw,
                                const float *b, int rows, int in, int out_f, int accumulate)
{
    if (spb_bf16_direct_matmul_forward(out, ldo, inp, ldi, W, ldw, b, rows, in, out_f, accumulate)) return;
    spb_frame f = {0};
    spb_frame_out(&f, &out, spb_strided_extent(rows, ldo, out_f), "matmul_forward (out)");
    spb_frame_in(&f, &inp, spb_strided_extent(rows, ldi, in), "matmul_forward (inp)");
    spb_frame_in(&f, &W, spb_strided_extent(out_f, ldw, in), "matmul_forward (W)");
    spb_frame_in(&f, &b, out_f, "matmul_forward (b)");
    spb_frame_load(&f);
    inner->matmul_forward_ld(out, ldo, inp, ldi, W, ldw, b, rows, in, out_f, accumulate);
    spb_frame_store(&f);
}

void spb_bf16_matmul_backward_ld(float *dinp, int lddi, float *dW, int lddw, float *db, const float *dout, int ldo,
                                 const float *inp, int ldi, const float *W, int ldw, int rows, int in, int out_f,
                                 int accumulate_dinp)
{
    if (spb_bf16_direct_matmul_backward(dinp, lddi, dW, lddw, db, dout, ldo, inp, ldi, W, ldw, rows, in, out_f,
                                        accumulate_dinp))
        return;
    spb_frame f = {0};
    spb_frame_out(&f, &dinp, spb_strided_extent(rows, lddi, in), "matmul_backward (dinp)");
    spb_frame_out(&f, &dW, spb_strided_extent(out_f, lddw, in), "matmul_backward (dW)");
    spb_frame_out(&f, &db, out_f, "matmul_backward (db)");
    spb_frame_in(&f, &dout, spb_strided_extent(rows, ldo, out_f), "matmul_backward (dout)");
    spb_frame_in(&f, &inp, spb_strided_extent(rows, ldi, in), "matmul_backward (inp)");
    spb_frame_in(&f, &W, spb_strided_extent(out_f, ldw, in), "matmul_backward (W)");
    spb_frame_load(&f);
    inner->matmul_backward_ld(dinp, lddi, dW, lddw, db, dout, ldo, inp, ldi, W, ldw, rows, in, out_f, accumulate_dinp);
    spb_frame_store(&f);
}

/* --- row-wise operations --------------------------------------------------- */

void spb_bf16_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, int rows, int C)
{
    if (spb_bf16_direct_layernorm_forward(out, mean, rstd, inp, w, b, rows, C)) return;
    spb_frame f = {0};
    spb_frame_out(&f, &out, (long)rows * C, "layernorm_forward (out)");
    spb_frame_out_f32(&f, &mean, rows, "layernorm_forward (mean)");
    spb_frame_out_f32(&f, &rstd, rows, "layernorm_forward (rstd)");
    spb_frame_in(&f, &inp, (long)rows * C, "layernorm_forward (inp)");
    spb_frame_in(&f, &w, C, "layernorm_forward (w)");
    spb_frame_in(&f, &b, C, "layernorm_forward (b)");
    spb_frame_load(&f);
    inner->layernorm_forward(out, mean, rstd, inp, w, b, rows, C);
    spb_frame_store(&f);
}

void spb_bf16_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, const float *mean, const float *rstd, int rows, int C)
{
    if (spb_bf16_direct_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, rows, C)) return;
    spb_frame f = {0};
    spb_frame_out(&f, &dinp, (long)rows * C, "layernorm_backward (dinp)");
    spb_frame_out(&f, &dw, C, "layernorm_backward (dw)");
    spb_frame_out(&f, &db, C, "layernorm_backward (db)");
    spb_frame_in(&f, &dout, (long)rows * C, "layernorm_backward (dout)");
    spb_frame_in(&f, &inp, (long)rows * C, "layernorm_backward (inp)");
    spb_frame_in(&f, &w, C, "layernorm_backward (w)");
    spb_frame_in(&f, &mean, rows, "layernorm_backward (mean)");
    spb_frame_in(&f, &rstd, rows, "layernorm_backward (rstd)");
    spb_frame_load(&f);
    inner->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, rows, C);
    spb_frame_store(&f);
}

/* The Llama-style operations (ops.h) on fp32 copies through the inner
 * table, rounded once per output; no direct kernels.  Only tables whose
 * inner table has them get here (config.c). */
static const spb_backend *inner_with(const void *entry, const char *what)
{
    if (!entry) SPB_DIE("%s: the %s table has no such operation", what, inner->name);
    return inner;
}

void spb_bf16_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int rows, int C)
{
    const spb_backend *in = inner_with((const void *)inner->rmsnorm_forward, "rmsnorm_forward");
    spb_frame f = {0};
    spb_frame_out(&f, &out, (long)rows * C, "rmsnorm_forward (out)");
    spb_frame_out_f32(&f, &rstd, rows, "rmsnorm_forward (rstd)");
    spb_frame_in(&f, &inp, (long)rows * C, "rmsnorm_forward (inp)");
    spb_frame_in(&f, &w, C, "rmsnorm_forward (w)");
    spb_frame_load(&f);
    in->rmsnorm_forward(out, rstd, inp, w, rows, C);
    spb_frame_store(&f);
}

void spb_bf16_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                               const float *rstd, int rows, int C)
{
    const spb_backend *in = inner_with((const void *)inner->rmsnorm_backward, "rmsnorm_backward");
    spb_frame f = {0};
    spb_frame_out(&f, &dinp, (long)rows * C, "rmsnorm_backward (dinp)");
    spb_frame_out(&f, &dw, C, "rmsnorm_backward (dw)");
    spb_frame_in(&f, &dout, (long)rows * C, "rmsnorm_backward (dout)");
    spb_frame_in(&f, &inp, (long)rows * C, "rmsnorm_backward (inp)");
    spb_frame_in(&f, &w, C, "rmsnorm_backward (w)");
    spb_frame_in(&f, &rstd, rows, "rmsnorm_backward (rstd)");
    spb_frame_load(&f);
    in->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, rows, C);
    spb_frame_store(&f);
}

void spb_bf16_swiglu_forward(float *out, const float *inp, int rows, int F)
{
    const spb_backend *in = inner_with((const void *)inner->swiglu_forward, "swiglu_forward");
    spb_frame f = {0};
    spb_frame_out(&f, &out, (long)rows * F, "swiglu_forward (out)");
    spb_frame_in(&f, &inp, (long)rows * 2 * F, "swiglu_forward (inp)");
    spb_frame_load(&f);
    in->swiglu_forward(out, inp, rows, F);
    spb_frame_store(&f);
}

void spb_bf16_swiglu_backward(float *dinp, const float *inp, const float *dout, int rows, int F)
{
    const spb_backend *in = inner_with((const void *)inner->swiglu_backward, "swiglu_backward");
    spb_frame f = {0};
    spb_frame_out(&f, &dinp, (long)rows * 2 * F, "swiglu_backward (dinp)");
    spb_frame_in(&f, &inp, (long)rows * 2 * F, "swiglu_backward (inp)");
    spb_frame_in(&f, &dout, (long)rows * F, "swiglu_backward (dout)");
    spb_frame_load(&f);
    in->swiglu_backward(dinp, inp, dout, rows, F);
    spb_frame_store(&f);
}

void spb_bf16_rope_apply(float *x, const long *positions, int batch, int tokens, long token_stride,
                         long batch_stride, int heads, int head_dim, double base, int inverse)
{
    const spb_backend *in = inner_with((const void *)inner->rope_apply, "rope_apply");
    if (batch <= 0 || tokens <= 0) return;
    spb_frame f = {0};
    long extent = (long)(batch - 1) * batch_stride + (long)(tokens - 1) * token_stride + (long)heads * head_dim;
    spb_frame_out(&f, &x, extent, "rope_apply (x)"); /* in place: read and written */
    spb_frame_load(&f);
    in->rope_apply(x, positions, batch, tokens, token_stride, batch_stride, heads, head_dim, base, inverse);
    spb_frame_store(&f);
}

void spb_bf16_gelu_forward(float *out, const float *inp, long n)
{
    if (spb_bf16_direct_gelu_forward(out, inp, n)) return;
    spb_frame f = {0};
    spb_frame_out(&f, &out, n, "gelu_forward (out)");
    spb_frame_in(&f, &inp, n, "gelu_forward (inp)");
    spb_frame_load(&f);
    inner->gelu_forward(out, inp, n);
    spb_frame_store(&f);
}

void spb_bf16_gelu_backward(float *dinp, const float *inp, const float *dout, long n)
{
    if (spb_bf16_direct_gelu_backward(dinp, inp, dout, n)) return;
    spb_frame f = {0};
    spb_frame_out(&f, &dinp, n, "gelu_backward (dinp)");
    spb_frame_in(&f, &inp, n, "gelu_backward (inp)");
    spb_frame_in(&f, &dout, n, "gelu_backward (dout)");
    spb_frame_load(&f);
    inner->gelu_backward(dinp, inp, dout, n);
    spb_frame_store(&f);
}

/* Rows of the token table the lookups reach (the tokens read from storage). */
static long rows_reached_ints(const int *stored, long n)
{
    long reach = 0;
    free(spb_bf16_tokens_on_host(stored, n, &reach));
    return reach;
}

void spb_bf16_embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                                const long *positions, int rows, int T, int C)
{
    const int *tok = spb_bf16_ints(tokens, rows, "embedding_forward (tokens)");
    if (spb_bf16_direct_embedding_forward(out, tok, wte, wpe, positions, rows, T, C)) return;
    spb_frame f = {0};
    spb_frame_out(&f, &out, (long)rows * C, "embedding_forward (out)");
    spb_frame_in(&f, &wte, rows_reached_ints(tok, rows) * C, "embedding_forward (wte)");
    spb_frame_in(&f, &wpe, spb_positions_reach(positions, rows, T) * C, "embedding_forward (wpe)");
    spb_frame_load(&f);
    inner->embedding_forward(out, tok, wte, wpe, positions, rows, T, C);
    spb_frame_store(&f);
}

void spb_bf16_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                                 const long *positions, int rows, int T, int C)
{
    const int *tok = spb_bf16_ints(tokens, rows, "embedding_backward (tokens)");
    if (spb_bf16_direct_embedding_backward(dwte, dwpe, dout, tok, positions, rows, T, C)) return;
    spb_frame f = {0};
    spb_frame_out(&f, &dwte, rows_reached_ints(tok, rows) * C, "embedding_backward (dwte)");
    spb_frame_out(&f, &dwpe, spb_positions_reach(positions, rows, T) * C, "embedding_backward (dwpe)");
    spb_frame_in(&f, &dout, (long)rows * C, "embedding_backward (dout)");
    spb_frame_load(&f);
    inner->embedding_backward(dwte, dwpe, dout, tok, positions, rows, T, C);
    spb_frame_store(&f);
}

/* The loss comes from the fp32 logits before the probabilities are rounded. */
double spb_bf16_softmax_xent_forward(float *probs, const int *targets, int rows, int V)
{
    double direct_loss = 0.0;
    if (spb_bf16_direct_softmax_xent_forward(probs, targets, rows, V, &direct_loss)) return direct_loss;
    const int *tg = spb_bf16_ints(targets, rows, "softmax_xent_forward (targets)");
    spb_frame f = {0};
    spb_frame_out(&f, &probs, (long)rows * V, "softmax_xent_forward (probs)");
    spb_frame_load(&f);
    double loss = inner->softmax_xent_forward(probs, tg, rows, V);
    spb_frame_store(&f);
    return loss;
}

void spb_bf16_softmax_xent_backward(float *probs, const int *targets, int rows, int V, float scale)
{
    if (spb_bf16_direct_softmax_xent_backward(probs, targets, rows, V, scale)) return;
    const int *tg = spb_bf16_ints(targets, rows, "softmax_xent_backward (targets)");
    spb_frame f = {0};
    spb_frame_out(&f, &probs, (long)rows * V, "softmax_xent_backward (probs)");
    spb_frame_load(&f);
    inner->softmax_xent_backward(probs, tg, rows, V, scale);
    spb_frame_store(&f);
}

void spb_bf16_add_inplace(float *a, const float *b, long n)
{
    if (spb_bf16_direct_add_inplace(a, b, n)) return;
    spb_frame f = {0};
    spb_frame_out(&f, &a, n, "add_inplace (a)");
    spb_frame_in(&f, &b, n, "add_inplace (b)");
    spb_frame_load(&f);
    inner->add_inplace(a, b, n);
    spb_frame_store(&f);
}

void spb_bf16_add_bias_rows(float *x, const float *b, long rows, int C)
{
    if (spb_bf16_direct_add_bias_rows(x, b, rows, C)) return;
    spb_frame f = {0};
    spb_frame_out(&f, &x, rows * C, "add_bias_rows (x)");
    spb_frame_in(&f, &b, C, "add_bias_rows (b)");
    spb_frame_load(&f);
    inner->add_bias_rows(x, b, rows, C);
    spb_frame_store(&f);
}

/* The column sums accumulate in fp32 over every row, then round once. */
void spb_bf16_bias_grad_rows(float *db, const float *dy, long rows, int C)
{
    if (spb_bf16_direct_bias_grad_rows(db, dy, rows, C)) return;
    spb_frame f = {0};
    spb_frame_out(&f, &db, C, "bias_grad_rows (db)");
    spb_frame_in(&f, &dy, rows * C, "bias_grad_rows (dy)");
    spb_frame_load(&f);
    inner->bias_grad_rows(db, dy, rows, C);
    spb_frame_store(&f);
}

double spb_bf16_sum_squares(const float *x, long n)
{
    double direct_sum = 0.0;
    if (spb_bf16_direct_sum_squares(x, n, &direct_sum)) return direct_sum;
    spb_frame f = {0};
    spb_frame_in(&f, &x, n, "sum_squares");
    spb_frame_load(&f);
    double s = n > 0 ? inner->sum_squares(x, n) : 0.0;
    spb_frame_store(&f);
    return s;
}

/* --- attention ------------------------------------------------------------- */

void spb_bf16_attn_merge(float *o_acc, float *lse_acc, const float *o_pair, const float *lse_pair, int batch,
                         int heads, int head_dim, int T, int row, int len)
{
    if (spb_bf16_direct_attn_merge(o_acc, lse_acc, o_pair, lse_pair, batch, heads, head_dim, T, row, len)) return;
    long rows = (long)batch * T * heads * head_dim;
    spb_frame f = {0};
    spb_frame_out(&f, &o_acc, rows, "attn_merge (o_acc)");
    spb_frame_out_f32(&f, &lse_acc, (long)batch * heads * T, "attn_merge (lse_acc)");
    spb_frame_in(&f, &o_pair, rows, "attn_merge (o_pair)");
    spb_frame_in(&f, &lse_pair, (long)batch * heads * len, "attn_merge (lse_pair)");
    spb_frame_load(&f);
    inner->attn_merge(o_acc, lse_acc, o_pair, lse_pair, batch, heads, head_dim, T, row, len);
    spb_frame_store(&f);
}

/* The inner table's kernel of that name (the bf16 wrapper exists only for
 * names the inner table knows). */
static const spb_attn_backend *inner_kernel(const char *name)
{
    const spb_attn_backend *k = inner->attention ? inner->attention(name) : NULL;
    if (!k) SPB_DIE("attention '%s': the %s table has no such kernel", name, inner->name);
    return k;
}

static void attention_forward(const spb_attn_backend *kernel, const spb_attn_desc *d, const float *q,
                              const float *k, const float *v, float *o, float *lse)
{
    long qx = spb_attn_operand_extent(d, d->q_len, d->q_token_stride, d->q_batch_stride);
    long kx = spb_attn_kv_extent(d);
    spb_frame f = {0};
    spb_frame_out(&f, &o, spb_attn_operand_extent(d, d->q_len, d->o_token_stride, d->o_batch_stride), "attention (o)");
    spb_frame_out_f32(&f, &lse, (long)d->batch * d->heads * d->q_len, "attention (lse)");
    spb_frame_in(&f, &q, qx, "attention (q)");
    spb_frame_in(&f, &k, kx, "attention (k)");
    spb_frame_in(&f, &v, kx, "attention (v)");
    spb_frame_load(&f);
    kernel->forward(d, q, k, v, o, lse);
    spb_frame_store(&f);
}

static void attention_backward(const spb_attn_backend *kernel, const spb_attn_desc *d, const float *q,
                               const float *k, const float *v, const float *o, const float *lse, const float *dout,
                               float *dq, float *dk, float *dv)
{
    long qx = spb_attn_operand_extent(d, d->q_len, d->q_token_stride, d->q_batch_stride);
    long kx = spb_attn_kv_extent(d);
    long ox = spb_attn_operand_extent(d, d->q_len, d->o_token_stride, d->o_batch_stride);
    spb_frame f = {0};
    spb_frame_out(&f, &dq, qx, "attention backward (dq)");
    spb_frame_out(&f, &dk, kx, "attention backward (dk)");
    spb_frame_out(&f, &dv, kx, "attention backward (dv)");
    spb_frame_in(&f, &q, qx, "attention backward (q)");
    spb_frame_in(&f, &k, kx, "attention backward (k)");
    spb_frame_in(&f, &v, kx, "attention backward (v)");
    spb_frame_in(&f, &o, ox, "attention backward (o)");
    spb_frame_in(&f, &lse, (long)d->batch * d->heads * d->q_len, "attention backward (lse)");
    spb_frame_in(&f, &dout, ox, "attention backward (dout)");
    spb_frame_load(&f);
    kernel->backward(d, q, k, v, o, lse, dout, dq, dk, dv);
    spb_frame_store(&f);
}

/* One wrapper per kernel name (a C function pointer carries no state); each
 * calls the inner table's kernel of that name.  Flash and cuDNN try their
 * direct kernels first (bf16_direct.h); naive, the reference, never does
 * (direct < 0). */
#define SPB_BF16_ATTENTION(label, direct)                                                                        \
    static void label##_forward(const spb_attn_desc *d, const float *q, const float *k, const float *v, float *o, \
                                float *lse)                                                                      \
    {                                                                                                            \
        if ((direct) >= 0 && spb_bf16_direct_attention_forward((spb_direct_attention)(direct), d, q, k, v, o, lse)) \
            return;                                                                                              \
        attention_forward(inner_kernel(#label), d, q, k, v, o, lse);                                             \
    }                                                                                                            \
    static void label##_backward(const spb_attn_desc *d, const float *q, const float *k, const float *v,         \
                                 const float *o, const float *lse, const float *dout, float *dq, float *dk,      \
                                 float *dv)                                                                      \
    {                                                                                                            \
        if ((direct) >= 0 && spb_bf16_direct_attention_backward((spb_direct_attention)(direct), d, q, k, v, o, lse, \
                                                                dout, dq, dk, dv))                               \
            return;                                                                                              \
        attention_backward(inner_kernel(#label), d, q, k, v, o, lse, dout, dq, dk, dv);                          \
    }                                                                                                            \
    static const spb_attn_backend label = {#label, label##_forward, label##_backward};

SPB_BF16_ATTENTION(naive, -1)
SPB_BF16_ATTENTION(flash, SPB_DIRECT_FLASH)
/* direct on cuDNN's entries where the instance has them; else the device
 * table narrows the frames' copies for cuDNN */
SPB_BF16_ATTENTION(cudnn, SPB_DIRECT_CUDNN)
#undef SPB_BF16_ATTENTION

const spb_attn_backend *spb_bf16_attention(const char *name)
{
    if (!name || !inner->attention || !inner->attention(name)) return NULL;
    if (!strcmp(name, "naive")) return &naive;
    if (!strcmp(name, "flash")) return &flash;
    if (!strcmp(name, "cudnn")) return &cudnn;
    return NULL;
}
