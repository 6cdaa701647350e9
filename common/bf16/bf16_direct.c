/* Dispatch of the bf16 tables' direct path (bf16_direct.h): which calls may
 * skip the fp32 frames, and how ops.h's products map onto one gemm. */
#include "bf16_direct.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_frame.h"
#include "checks.h"
#include "ops.h"
#include "timer.h"

static const spb_bf16_direct *in_use;
static int kinds = SPB_DIRECT_ALL;
static spb_bf16_direct_counts counts;

/* The direct kernels take calls of this kind. */
#define DIRECT(kind) (in_use && (kinds & (kind)))

static const struct {
    const char *name;
    int bit;
} kind_names[] = {{"products", SPB_DIRECT_PRODUCTS}, {"attention", SPB_DIRECT_ATTENTION},
                  {"gelu", SPB_DIRECT_GELU},         {"layernorm", SPB_DIRECT_LAYERNORM},
                  {"residual", SPB_DIRECT_RESIDUAL}, {"cross-entropy", SPB_DIRECT_CROSS_ENTROPY},
                  {"memory", SPB_DIRECT_MEMORY},     {"optimizer", SPB_DIRECT_OPTIMIZER},
                  {"embedding", SPB_DIRECT_EMBEDDING}, {"bias", SPB_DIRECT_BIAS},
                  {"merge", SPB_DIRECT_MERGE}};

int spb_bf16_direct_parse_kinds(const char *list, char *err, size_t errlen)
{
    if (!list || !list[0] || !strcmp(list, "all")) return SPB_DIRECT_ALL;
    if (!strcmp(list, "none")) return 0;
    int mask = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        int found = 0;
        for (size_t k = 0; k < sizeof kind_names / sizeof kind_names[0]; k++)
            if (strlen(kind_names[k].name) == len && !strncmp(p, kind_names[k].name, len)) {
                mask |= kind_names[k].bit;
                found = 1;
            }
        if (!found) {
            snprintf(err, errlen,
                     "unknown kind '%.*s' in --bf16-direct (all, none, or a list of products, attention, gelu, "
                     "layernorm, residual, cross-entropy, memory, optimizer, embedding, bias, merge)",
                     (int)len, p);
            return -1;
        }
        p += len;
        if (*p == ',') p++;
    }
    return mask;
}

void spb_bf16_direct_set_kinds(int mask) { kinds = mask; }

void spb_bf16_use_direct(const spb_bf16_direct *direct) { in_use = direct; }
const spb_bf16_direct *spb_bf16_direct_in_use(void) { return in_use; }
spb_bf16_direct_counts spb_bf16_direct_get_counts(void) { return counts; }
void spb_bf16_direct_reset_counts(void) { counts = (spb_bf16_direct_counts){0}; }

int spb_bf16_direct_attention_supported(const spb_attn_desc *d)
{
    /* grouped-query attention too: the CUDA fast kernels decline it and the
     * simple ones map each query head to its K/V head (cuda_attention.cu);
     * the CPU emulation's attention_flash.c takes it */
    return (d->head_dim == 64 || d->head_dim == 128) && d->sparse_block <= 0 && d->batch > 0 && d->heads > 0 &&
           d->q_len > 0 && d->k_len > 0;
}

/* One operand: elements [index, index + len) of handle h, all of one
 * storage type.  Its storage address is taken only when the call runs
 * (after any retyping, which moves storage). */
typedef struct operand {
    const float *p;
    spb_handle *h;
    long index, len;
    spb_dtype type;
} operand;

static int operand_of(const float *p, long len, operand *o)
{
    long i = 0;
    spb_handle *h = p && len > 0 ? spb_handle_find(p, &i) : NULL;
    if (!h || h->ints || i + len > h->n) return 0;
    spb_dtype t = spb_handle_dtype(h, i);
    if (spb_handle_dtype(h, i + len - 1) != t) return 0;
    *o = (operand){p, h, i, len, t};
    return 1;
}

static int bf16_operand(const float *p, long len, operand *o)
{
    return operand_of(p, len, o) && o->type == SPB_DTYPE_HALF;
}

/* An output: no fp32 masters bound to it (their rule is spb_bf16_write's,
 * which only the frames keep). */
static int output_operand(float *p, long len, operand *o)
{
    return operand_of(p, len, o) && !spb_handle_has_masters(o->h, o->index, o->len);
}

static int overlap(const operand *a, const operand *b)
{
    return a->h == b->h && a->index < b->index + b->len && b->index < a->index + a->len;
}

static void *storage(const operand *o) { return spb_handle_resolve(o->p, NULL); }

/* A product on the direct kernels, timed and counted like ops_cpu.c's. */
static void product(int transA, int transB, int m, int n, int k, const operand *A, int lda, const operand *B, int ldb,
                    float beta, const operand *C, int ldc)
{
    spb_timer_region timed = spb_timer_begin(SPB_T_GEMM);
    in_use->gemm(transA, transB, m, n, k, storage(A), lda, storage(B), ldb, beta, storage(C), C->type, ldc);
    spb_timer_end(timed);
    spb_gemm_flops_add(2.0 * m * n * k);
}

int spb_bf16_direct_matmul_forward(float *out, int ldo, const float *inp, int ldi, const float *W, int ldw,
                                   const float *b, int rows, int in, int out_f, int accumulate)
{
    operand o, x, w, bias;
    int ok = DIRECT(SPB_DIRECT_PRODUCTS) && rows > 0 && in > 0 && out_f > 0 &&
             output_operand(out, spb_strided_extent(rows, ldo, out_f), &o) &&
             bf16_operand(inp, spb_strided_extent(rows, ldi, in), &x) &&
             bf16_operand(W, spb_strided_extent(out_f, ldw, in), &w) && !overlap(&o, &x) && !overlap(&o, &w);
    const int with_bias = b && !accumulate; /* ops.h: accumulating products add no bias */
    if (ok && with_bias) ok = bf16_operand(b, out_f, &bias) && !overlap(&o, &bias);
    if (!ok) {
        counts.matmul_frames++;
        return 0;
    }
    /* out = round(inp·Wᵀ + b): the bias (bf16, so exact in out) is laid in
     * out first and the product added to it in fp32 (beta = 1). */
    if (with_bias) in_use->broadcast_rows(storage(&o), o.type, ldo, storage(&bias), rows, out_f);
    product(0, 1, rows, out_f, in, &x, ldi, &w, ldw, with_bias || accumulate ? 1.0f : 0.0f, &o, ldo);
    counts.matmul_direct++;
    return 1;
}

int spb_bf16_direct_matmul_backward(float *dinp, int lddi, float *dW, int lddw, float *db, const float *dout, int ldo,
                                    const float *inp, int ldi, const float *W, int ldw, int rows, int in, int out_f,
                                    int accumulate_dinp)
{
    operand go, x, w, gi, gw, gb;
    int ok = DIRECT(SPB_DIRECT_PRODUCTS) && rows > 0 && in > 0 && out_f > 0 &&
             bf16_operand(dout, spb_strided_extent(rows, ldo, out_f), &go);
    if (ok && dinp)
        ok = bf16_operand(W, spb_strided_extent(out_f, ldw, in), &w) &&
             output_operand(dinp, spb_strided_extent(rows, lddi, in), &gi) && !overlap(&gi, &go) && !overlap(&gi, &w);
    if (ok && dW)
        ok = bf16_operand(inp, spb_strided_extent(rows, ldi, in), &x) &&
             output_operand(dW, spb_strided_extent(out_f, lddw, in), &gw) && !overlap(&gw, &go) &&
             !overlap(&gw, &x) && !(dinp && (overlap(&gw, &w) || overlap(&gw, &gi)));
    if (ok && dinp && dW) ok = !overlap(&gi, &x);
    if (ok && db)
        ok = output_operand(db, out_f, &gb) && !overlap(&gb, &go) && !(dinp && overlap(&gb, &gi)) &&
             !(dW && overlap(&gb, &gw));
    if (!ok) {
        counts.matmul_frames++;
        return 0;
    }
    /* dinp (=|+=) dout·W;  dW += doutᵀ·inp;  db += 1ᵀ·dout (column sums as
     * a product with a vector of ones: fp32 sums, one rounding). */
    if (dinp) product(0, 0, rows, in, out_f, &go, ldo, &w, ldw, accumulate_dinp ? 1.0f : 0.0f, &gi, lddi);
    if (dW) product(1, 0, out_f, in, rows, &go, ldo, &x, ldi, 1.0f, &gw, lddw);
    if (db) {
        const spb_handle_storage *st = spb_handles_storage();
        spb_bf16 *ones = st->scratch_alloc(sizeof(spb_bf16) * (size_t)rows);
        in_use->fill((spb_stored){ones, SPB_DTYPE_HALF}, rows, 1.0f);
        spb_timer_region timed = spb_timer_begin(SPB_T_GEMM);
        in_use->gemm(0, 0, 1, out_f, rows, ones, rows, storage(&go), ldo, 1.0f, storage(&gb), gb.type, out_f);
        spb_timer_end(timed);
        st->scratch_free(ones);
    }
    counts.matmul_direct++;
    return 1;
}

/* Elementwise: an output may be exactly one of its inputs (each element is
 * read before it is written), never overlap one otherwise. */
static int elementwise_ok(const operand *out, const operand *in)
{
    return (out->h == in->h && out->index == in->index) || !overlap(out, in);
}

int spb_bf16_direct_gelu_forward(float *out, const float *inp, long n)
{
    operand o, x;
    int ok = DIRECT(SPB_DIRECT_GELU) && n > 0 && output_operand(out, n, &o) && o.type == SPB_DTYPE_HALF &&
             bf16_operand(inp, n, &x) && elementwise_ok(&o, &x);
    if (!ok) {
        counts.rowwise_frames++;
        return 0;
    }
    in_use->gelu_forward(storage(&o), storage(&x), n);
    counts.rowwise_direct++;
    return 1;
}

int spb_bf16_direct_gelu_backward(float *dinp, const float *inp, const float *dout, long n)
{
    operand gi, x, go;
    int ok = DIRECT(SPB_DIRECT_GELU) && n > 0 && output_operand(dinp, n, &gi) && gi.type == SPB_DTYPE_HALF &&
             bf16_operand(inp, n, &x) && bf16_operand(dout, n, &go) && elementwise_ok(&gi, &x) &&
             elementwise_ok(&gi, &go);
    if (!ok) {
        counts.rowwise_frames++;
        return 0;
    }
    in_use->gelu_backward(storage(&gi), storage(&x), storage(&go), n);
    counts.rowwise_direct++;
    return 1;
}

static spb_stored stored(const operand *o) { return (spb_stored){storage(o), o->type}; }

/* An fp32 output by contract (LayerNorm statistics, attention's
 * log-sum-exp): its buffer's tail turns fp32 from it on, as the frames'
 * spb_frame_out_f32 would turn it (so it makes no difference which path then
 * runs the call).  Before any operand is looked at: retyping moves the
 * handle's storage. */
static void make_fp32_tail(float *p, long len)
{
    long i = 0;
    spb_handle *h = p && len > 0 ? spb_handle_find(p, &i) : NULL;
    if (h && !h->ints && i + len <= h->n) spb_handle_retype_tail(h, i);
}

int spb_bf16_direct_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                      const float *b, int rows, int C)
{
    long n = (long)rows * C;
    if (DIRECT(SPB_DIRECT_LAYERNORM) && rows > 0 && C > 0) {
        make_fp32_tail(mean, rows);
        make_fp32_tail(rstd, rows);
    }
    operand o, x, ow, ob, om, os;
    int ok = DIRECT(SPB_DIRECT_LAYERNORM) && rows > 0 && C > 0 && output_operand(out, n, &o) &&
             operand_of(inp, n, &x) && operand_of(w, C, &ow) && operand_of(b, C, &ob) &&
             output_operand(mean, rows, &om) && output_operand(rstd, rows, &os) && om.type == SPB_DTYPE_F32 &&
             os.type == SPB_DTYPE_F32 && !overlap(&o, &x) && !overlap(&o, &ow) && !overlap(&o, &ob) &&
             !overlap(&o, &om) && !overlap(&o, &os) && !overlap(&om, &os) && !overlap(&om, &x) && !overlap(&os, &x);
    if (!ok) {
        counts.rowwise_frames++;
        return 0;
    }
    in_use->layernorm_forward(stored(&o), storage(&om), storage(&os), stored(&x), stored(&ow), stored(&ob), rows, C);
    counts.rowwise_direct++;
    return 1;
}

int spb_bf16_direct_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                       const float *w, const float *mean, const float *rstd, int rows, int C)
{
    long n = (long)rows * C;
    operand gi, gw, gb, go, x, ow, om, os;
    int ok = DIRECT(SPB_DIRECT_LAYERNORM) && rows > 0 && C > 0 && output_operand(dinp, n, &gi) &&
             output_operand(dw, C, &gw) && output_operand(db, C, &gb) && operand_of(dout, n, &go) &&
             operand_of(inp, n, &x) && operand_of(w, C, &ow) && operand_of(mean, rows, &om) &&
             operand_of(rstd, rows, &os) && om.type == SPB_DTYPE_F32 && os.type == SPB_DTYPE_F32;
    /* outputs apart from each other and from the inputs; dinp may be dout */
    const operand *outs[] = {&gi, &gw, &gb}, *ins[] = {&go, &x, &ow, &om, &os};
    for (int a = 0; ok && a < 3; a++) {
        for (int b2 = a + 1; ok && b2 < 3; b2++) ok = !overlap(outs[a], outs[b2]);
        for (int c = 0; ok && c < 5; c++)
            ok = (a == 0 && c == 0) ? elementwise_ok(outs[a], ins[c]) : !overlap(outs[a], ins[c]);
    }
    if (!ok) {
        counts.rowwise_frames++;
        return 0;
    }
    in_use->layernorm_backward(stored(&gi), stored(&gw), stored(&gb), stored(&go), stored(&x), stored(&ow),
                               storage(&om), storage(&os), rows, C);
    counts.rowwise_direct++;
    return 1;
}

int spb_bf16_direct_add_inplace(float *a, const float *b, long n)
{
    operand oa, ob;
    int ok = DIRECT(SPB_DIRECT_RESIDUAL) && n > 0 && output_operand(a, n, &oa) && operand_of(b, n, &ob) &&
             elementwise_ok(&oa, &ob);
    if (!ok) {
        counts.rowwise_frames++;
        return 0;
    }
    in_use->add_inplace(stored(&oa), stored(&ob), n);
    counts.rowwise_direct++;
    return 1;
}

int spb_bf16_direct_fill(float *x, long n, float value)
{
    operand o;
    int ok = DIRECT(SPB_DIRECT_MEMORY) && n > 0 && output_operand(x, n, &o);
    if (!ok) {
        counts.memory_frames++;
        return 0;
    }
    in_use->fill(stored(&o), n, value);
    counts.memory_direct++;
    return 1;
}

int spb_bf16_direct_copy_rows(float *dst, long dst_stride, const float *src, long src_stride, long rows, long width)
{
    operand d, s;
    long dn = spb_strided_extent(rows, dst_stride, width), sn = spb_strided_extent(rows, src_stride, width);
    int ok = DIRECT(SPB_DIRECT_MEMORY) && dn > 0 && output_operand(dst, dn, &d) && operand_of(src, sn, &s) &&
             !overlap(&d, &s);
    if (!ok) {
        counts.memory_frames++;
        return 0;
    }
    in_use->copy_rows(stored(&d), dst_stride, stored(&s), src_stride, rows, width);
    counts.memory_direct++;
    return 1;
}

int spb_bf16_direct_adamw(float *masters, float *p, const float *grad, float *m, float *v, long n, float grad_scale,
                          float weight_decay, const spb_config *cfg, long step, double lr)
{
    /* p carries the masters (that is the point): an operand, not an output */
    operand op, og, om, ov;
    int ok = DIRECT(SPB_DIRECT_OPTIMIZER) && masters && n > 0 && operand_of(p, n, &op) && operand_of(grad, n, &og) &&
             output_operand(m, n, &om) && output_operand(v, n, &ov) && !overlap(&om, &ov) && !overlap(&om, &og) &&
             !overlap(&ov, &og) && !overlap(&op, &og) && !overlap(&op, &om) && !overlap(&op, &ov);
    if (!ok) {
        counts.optimizer_frames++;
        return 0;
    }
    in_use->adamw_apply(masters, stored(&op), stored(&og), stored(&om), stored(&ov), n, grad_scale, weight_decay, cfg,
                        step, lr);
    counts.optimizer_direct++;
    return 1;
}

int spb_bf16_direct_sum_squares(const float *x, long n, double *sum)
{
    operand o;
    int ok = DIRECT(SPB_DIRECT_OPTIMIZER) && n > 0 && operand_of(x, n, &o);
    if (!ok) {
        counts.optimizer_frames++;
        return 0;
    }
    *sum = in_use->sum_squares(stored(&o), n);
    counts.optimizer_direct++;
    return 1;
}

int spb_bf16_direct_softmax_xent_forward(float *probs, const int *targets, int rows, int V, double *loss)
{
    operand op;
    int ok = DIRECT(SPB_DIRECT_CROSS_ENTROPY) && rows > 0 && V > 0 && output_operand(probs, (long)rows * V, &op);
    if (!ok) {
        counts.rowwise_frames++;
        return 0;
    }
    const int *tg = spb_bf16_ints(targets, rows, "softmax_xent_forward (targets)");
    *loss = in_use->softmax_xent_forward(stored(&op), tg, rows, V);
    counts.rowwise_direct++;
    return 1;
}

int spb_bf16_direct_softmax_xent_backward(float *probs, const int *targets, int rows, int V, float scale)
{
    operand op;
    int ok = DIRECT(SPB_DIRECT_CROSS_ENTROPY) && rows > 0 && V > 0 && output_operand(probs, (long)rows * V, &op);
    if (!ok) {
        counts.rowwise_frames++;
        return 0;
    }
    const int *tg = spb_bf16_ints(targets, rows, "softmax_xent_backward (targets)");
    in_use->softmax_xent_backward(stored(&op), tg, rows, V, scale);
    counts.rowwise_direct++;
    return 1;
}

/* --- row biases and ring's merge ------------------------------------------------------ */

int spb_bf16_direct_add_bias_rows(float *x, const float *b, long rows, int C)
{
    operand ox, ob;
    int ok = DIRECT(SPB_DIRECT_BIAS) && rows > 0 && C > 0 && output_operand(x, rows * C, &ox) &&
             operand_of(b, C, &ob) && !overlap(&ox, &ob);
    if (!ok) {
        counts.bias_frames++;
        return 0;
    }
    in_use->add_bias_rows(stored(&ox), stored(&ob), rows, C);
    counts.bias_direct++;
    return 1;
}

int spb_bf16_direct_bias_grad_rows(float *db, const float *dy, long rows, int C)
{
    operand od, oy;
    int ok = DIRECT(SPB_DIRECT_BIAS) && rows > 0 && C > 0 && output_operand(db, C, &od) &&
             operand_of(dy, rows * C, &oy) && !overlap(&od, &oy);
    if (!ok) {
        counts.bias_frames++;
        return 0;
    }
    in_use->bias_grad_rows(stored(&od), stored(&oy), rows, C);
    counts.bias_direct++;
    return 1;
}

int spb_bf16_direct_attn_merge(float *o_acc, float *lse_acc, const float *o_pair, const float *lse_pair, int batch,
                               int heads, int head_dim, int T, int row, int len)
{
    const long on = (long)batch * T * heads * head_dim, ln = (long)batch * heads * T;
    int ok = DIRECT(SPB_DIRECT_MERGE) && batch > 0 && heads > 0 && head_dim > 0 && len > 0 && row >= 0 &&
             row + len <= T;
    if (ok) make_fp32_tail(lse_acc, ln); /* fp32 by contract, as the frames make it */
    operand oo, ol, po, pl;
    ok = ok && output_operand(o_acc, on, &oo) && output_operand(lse_acc, ln, &ol) && ol.type == SPB_DTYPE_F32 &&
         operand_of(o_pair, on, &po) && operand_of(lse_pair, (long)batch * heads * len, &pl) &&
         pl.type == SPB_DTYPE_F32 && !overlap(&oo, &ol) && !overlap(&oo, &po) && !overlap(&oo, &pl) &&
         !overlap(&ol, &po) && !overlap(&ol, &pl);
    if (!ok) {
        counts.merge_frames++;
        return 0;
    }
    in_use->attn_merge(stored(&oo), storage(&ol), stored(&po), storage(&pl), batch, heads, head_dim, T, row, len);
    counts.merge_direct++;
    return 1;
}

/* --- embedding ----------------------------------------------------------------------- */

int spb_bf16_direct_embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                                      const long *positions, int rows, int T, int C)
{
    operand o, e, p;
    long tok_reach = 0, pos_reach = 0;
    int ok = DIRECT(SPB_DIRECT_EMBEDDING) && rows > 0 && T > 0 && C > 0;
    if (ok) {
        free(spb_bf16_tokens_on_host(tokens, rows, &tok_reach));
        pos_reach = spb_positions_reach(positions, rows, T);
    }
    ok = ok && output_operand(out, (long)rows * C, &o) &&
         bf16_operand(wte, tok_reach * C, &e) && bf16_operand(wpe, pos_reach * C, &p) && !overlap(&o, &e) &&
         !overlap(&o, &p);
    if (!ok) {
        counts.embedding_frames++;
        return 0;
    }
    in_use->embedding_forward(stored(&o), tokens, storage(&e), storage(&p), positions, rows, T, C);
    counts.embedding_direct++;
    return 1;
}

spb_row_groups spb_row_groups_of(const int *key, int rows, long reach)
{
    spb_row_groups g = {0, NULL, NULL, NULL};
    int *first = SPB_CHECK_PTR(calloc((size_t)reach + 1, sizeof(int)));
    for (int r = 0; r < rows; r++) first[key[r] + 1]++;
    g.keys = SPB_CHECK_PTR(malloc(sizeof(int) * (size_t)rows));
    g.starts = SPB_CHECK_PTR(malloc(sizeof(int) * ((size_t)rows + 1)));
    g.order = SPB_CHECK_PTR(malloc(sizeof(int) * (size_t)rows));
    for (long k = 0; k < reach; k++) {
        if (first[k + 1]) g.keys[g.groups] = (int)k, g.starts[g.groups++] = first[k];
        first[k + 1] += first[k]; /* first[k]: where key k's rows begin */
    }
    g.starts[g.groups] = rows;
    for (int r = 0; r < rows; r++) g.order[first[key[r]]++] = r;
    free(first);
    return g;
}

void spb_row_groups_free(spb_row_groups *g)
{
    free(g->keys), free(g->starts), free(g->order);
    *g = (spb_row_groups){0, NULL, NULL, NULL};
}

static void add_rows(const operand *table, const operand *dout, int C, const int *key, int rows, long reach)
{
    spb_row_groups g = spb_row_groups_of(key, rows, reach);
    in_use->embedding_backward_rows(stored(table), stored(dout), C, g.groups, g.keys, g.starts, g.order);
    spb_row_groups_free(&g);
}

int spb_bf16_direct_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                                       const long *positions, int rows, int T, int C)
{
    operand ge, gp, go;
    long tok_reach = 0, pos_reach = 0;
    int *tok = NULL;
    int ok = DIRECT(SPB_DIRECT_EMBEDDING) && rows > 0 && T > 0 && C > 0;
    if (ok) {
        tok = spb_bf16_tokens_on_host(tokens, rows, &tok_reach);
        pos_reach = spb_positions_reach(positions, rows, T);
    }
    ok = ok && pos_reach <= INT_MAX && operand_of(dout, (long)rows * C, &go) &&
         output_operand(dwte, tok_reach * C, &ge) && output_operand(dwpe, pos_reach * C, &gp) &&
         !overlap(&ge, &gp) && !overlap(&ge, &go) && !overlap(&gp, &go);
    if (!ok) {
        free(tok);
        counts.embedding_frames++;
        return 0;
    }
    add_rows(&ge, &go, C, tok, rows, tok_reach);
    int *pos = SPB_CHECK_PTR(malloc(sizeof(int) * (size_t)rows));
    for (int r = 0; r < rows; r++) pos[r] = (int)positions[r % T];
    add_rows(&gp, &go, C, pos, rows, pos_reach);
    free(pos), free(tok);
    counts.embedding_direct++;
    return 1;
}

/* q, k, v (and o, dout) as bf16 operands of d; 0 when one is not. */
static int attention_inputs(const spb_attn_desc *d, const float *q, const float *k, const float *v, operand *oq,
                            operand *ok, operand *ov)
{
    long qx = spb_attn_operand_extent(d, d->q_len, d->q_token_stride, d->q_batch_stride);
    long kx = spb_attn_kv_extent(d);
    return bf16_operand(q, qx, oq) && bf16_operand(k, kx, ok) && bf16_operand(v, kx, ov);
}

int spb_bf16_direct_attention_forward(spb_direct_attention kernel, const spb_attn_desc *d, const float *q,
                                      const float *k, const float *v, float *o, float *lse)
{
    const int cudnn = kernel == SPB_DIRECT_CUDNN;
    long ox = spb_attn_operand_extent(d, d->q_len, d->o_token_stride, d->o_batch_stride);
    long lx = (long)d->batch * d->heads * d->q_len;
    int ok = DIRECT(SPB_DIRECT_ATTENTION) &&
             (cudnn ? in_use->cudnn_attention_forward != NULL : spb_bf16_direct_attention_supported(d));
    if (ok) make_fp32_tail(lse, lx); /* the log-sum-exp is fp32 by contract */
    operand oq, ok_, ov, oo, ol;
    ok = ok && attention_inputs(d, q, k, v, &oq, &ok_, &ov) && output_operand(o, ox, &oo) &&
         oo.type == SPB_DTYPE_HALF && output_operand(lse, lx, &ol) && ol.type == SPB_DTYPE_F32 && !overlap(&oo, &oq) &&
         !overlap(&oo, &ok_) && !overlap(&oo, &ov) && !overlap(&ol, &oo) && !overlap(&ol, &oq) && !overlap(&ol, &ok_) &&
         !overlap(&ol, &ov);
    if (ok && cudnn)
        ok = in_use->cudnn_attention_forward(d, storage(&oq), storage(&ok_), storage(&ov), storage(&oo),
                                             storage(&ol)) == 0;
    else if (ok)
        in_use->attention_forward(d, storage(&oq), storage(&ok_), storage(&ov), storage(&oo), storage(&ol));
    if (!ok) {
        counts.attention_frames++;
        return 0;
    }
    counts.attention_direct++;
    return 1;
}

int spb_bf16_direct_attention_backward(spb_direct_attention kernel, const spb_attn_desc *d, const float *q,
                                       const float *k, const float *v, const float *o, const float *lse,
                                       const float *dout, float *dq, float *dk, float *dv)
{
    const int cudnn = kernel == SPB_DIRECT_CUDNN;
    operand oq, ok_, ov, oo, ol, og;
    long qx = spb_attn_operand_extent(d, d->q_len, d->q_token_stride, d->q_batch_stride);
    long kx = spb_attn_kv_extent(d);
    long ox = spb_attn_operand_extent(d, d->q_len, d->o_token_stride, d->o_batch_stride);
    int ok = DIRECT(SPB_DIRECT_ATTENTION) &&
             (cudnn ? in_use->cudnn_attention_backward != NULL : spb_bf16_direct_attention_supported(d)) &&
             attention_inputs(d, q, k, v, &oq, &ok_, &ov) && bf16_operand(o, ox, &oo) && bf16_operand(dout, ox, &og) &&
             operand_of(lse, (long)d->batch * d->heads * d->q_len, &ol) && ol.type == SPB_DTYPE_F32;
    if (!ok) {
        counts.attention_frames++;
        return 0;
    }
    /* dQ, dK, dV accumulate in fp32 (the kernel's contract): they are a
     * frame, read once and rounded once, like the reference path's. */
    spb_frame f = {0};
    spb_frame_out(&f, &dq, qx, "attention backward (dq)");
    spb_frame_out(&f, &dk, kx, "attention backward (dk)");
    spb_frame_out(&f, &dv, kx, "attention backward (dv)");
    spb_frame_load(&f);
    if (cudnn)
        ok = in_use->cudnn_attention_backward(d, storage(&oq), storage(&ok_), storage(&ov), storage(&oo),
                                              storage(&ol), storage(&og), dq, dk, dv) == 0;
    else
        in_use->attention_backward(d, storage(&oq), storage(&ok_), storage(&ov), storage(&oo), storage(&ol),
                                   storage(&og), dq, dk, dv);
    spb_frame_store(&f); /* unchanged values when cuDNN declined: each rounds back to itself */
    if (!ok) {
        counts.attention_frames++;
        return 0;
    }
    counts.attention_direct++;
    return 1;
}
