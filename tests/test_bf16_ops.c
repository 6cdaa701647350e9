/* Every operation of the emulated bf16 table (common/bf16/backend_bf16_cpu.c)
 * against its definition: the CPU's fp32 operation on the widened bf16
 * inputs, each output rounded once to nearest even into its buffer's type
 * (fp32 for log-sum-exp and LayerNorm statistics).  Compared bit for bit,
 * so an operation that forgets to round, rounds twice, truncates, or
 * rounds an fp32 statistic shows up; and with the table switched to
 * truncation the same comparison must fail (the check can see a wrong
 * rounding at all).  And the same again through a device-like storage
 * (the handle storage interface the CUDA instance implements): every
 * conversion through it, scratch given back in reverse order as the CUDA
 * pool requires, scratch poisoned when handed out and when given back.
 * No MPI. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "backend.h"
#include "bf16_frame.h"
#include "bf16_ops.h"
#include "check_run.h"
#include "config.h"
#include "device_handles.h"
#include "ops.h"
#include "optimizer.h"
#include "rng.h"

static const spb_backend *bf = &spb_backend_cpu_bf16;
static uint64_t stream;

/* A table buffer of n values ~ scale·N(0, 1), rounded into its storage. */
static float *random_buffer(spb_mem_category cat, long n, float scale)
{
    float *h = bf->alloc(cat, n);
    float *v = malloc(sizeof(float) * (size_t)n);
    stream++;
    for (long i = 0; i < n; i++) v[i] = scale * (float)spb_rng_normal(77, stream, (uint64_t)i);
    bf->staging.to_device(h, v, sizeof(float) * (size_t)n);
    free(v);
    return h;
}

/* The storage of h[0, n) as fp32: an operation's inputs as it sees them. */
static float *widened(const float *h, long n)
{
    long i = 0;
    spb_handle *e = spb_handle_at(h, n, &i, "test");
    float *v = malloc(sizeof(float) * (size_t)n);
    spb_bf16_read(e, i, n, v);
    return v;
}

/* Elements of h[0, n) whose storage is not `want` rounded once to its type. */
static long mismatches(const float *h, const float *want, long n)
{
    long i = 0, bad = 0;
    spb_handle *e = spb_handle_at(h, n, &i, "test");
    float *got = widened(h, n);
    for (long k = 0; k < n; k++) {
        float w = spb_handle_dtype(e, i + k) == SPB_DTYPE_HALF ? spb_bf16_round(want[k]) : want[k];
        bad += memcmp(&got[k], &w, sizeof w) != 0;
    }
    free(got);
    return bad;
}

static long total, per_op[32];
static const char *op_names[32];
static int num_ops;

static void tally(const char *op, long bad)
{
    int k = 0;
    while (k < num_ops && strcmp(op_names[k], op)) k++;
    if (k == num_ops) op_names[num_ops++] = op;
    per_op[k] += bad;
    total += bad;
}

static void check_products(void)
{
    const int rows = 5, in = 7, out_f = 6;
    float *out = random_buffer(SPB_MEM_ACTIVATIONS, rows * out_f, 1), *x = random_buffer(SPB_MEM_ACTIVATIONS, rows * in, 1);
    float *W = random_buffer(SPB_MEM_PARAMS, out_f * in, 0.3f), *b = random_buffer(SPB_MEM_PARAMS, out_f, 0.1f);
    float *rx = widened(x, rows * in), *rW = widened(W, out_f * in), *rb = widened(b, out_f);
    float *rout = widened(out, rows * out_f);
    spb_matmul_forward(rout, rx, rW, rb, rows, in, out_f);
    bf->matmul_forward(out, x, W, b, rows, in, out_f);
    tally("matmul_forward", mismatches(out, rout, rows * out_f));

    float *dx = random_buffer(SPB_MEM_WORKSPACE, rows * in, 1), *dW = random_buffer(SPB_MEM_GRADS, out_f * in, 1);
    float *db = random_buffer(SPB_MEM_GRADS, out_f, 1);
    float *rdx = widened(dx, rows * in), *rdW = widened(dW, out_f * in), *rdb = widened(db, out_f);
    float *rdy = widened(out, rows * out_f);
    spb_matmul_backward(rdx, rdW, rdb, rdy, rx, rW, rows, in, out_f, 1);
    bf->matmul_backward(dx, dW, db, out, x, W, rows, in, out_f, 1);
    tally("matmul_backward", mismatches(dx, rdx, rows * in) + mismatches(dW, rdW, out_f * in) + mismatches(db, rdb, out_f));

    /* Column blocks of larger matrices (the head-block products). */
    const int ldo = 10, ldi = 9, ldw = 8, n_out = rows * ldo, n_in = rows * ldi, n_w = out_f * ldw;
    float *O = random_buffer(SPB_MEM_ACTIVATIONS, n_out, 1), *X = random_buffer(SPB_MEM_ACTIVATIONS, n_in, 1);
    float *WW = random_buffer(SPB_MEM_PARAMS, n_w, 0.3f);
    float *rO = widened(O, n_out), *rX = widened(X, n_in), *rWW = widened(WW, n_w);
    spb_matmul_forward_ld(rO + 3, ldo, rX + 1, ldi, rWW + 1, ldw, NULL, rows, 7, 4, 1);
    bf->matmul_forward_ld(O + 3, ldo, X + 1, ldi, WW + 1, ldw, NULL, rows, 7, 4, 1);
    tally("matmul_forward_ld", mismatches(O, rO, n_out));
    float *DX = random_buffer(SPB_MEM_WORKSPACE, n_in, 1), *DW = random_buffer(SPB_MEM_GRADS, n_w, 1);
    /* The reference starts from what the table holds now (rounded). */
    float *rDX = widened(DX, n_in), *rDW = widened(DW, n_w), *rdb2 = widened(db, out_f), *rdO = widened(O, n_out);
    spb_matmul_backward_ld(rDX + 1, ldi, rDW + 1, ldw, rdb2, rdO + 3, ldo, rX + 1, ldi, rWW + 1, ldw, rows, 7, 4, 0);
    bf->matmul_backward_ld(DX + 1, ldi, DW + 1, ldw, db, O + 3, ldo, X + 1, ldi, WW + 1, ldw, rows, 7, 4, 0);
    tally("matmul_backward_ld", mismatches(DX, rDX, n_in) + mismatches(DW, rDW, n_w) + mismatches(db, rdb2, out_f));

    float *bufs[] = {out, x, W, b, dx, dW, db, O, X, WW, DX, DW};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) bf->free(bufs[k]);
    float *hosts[] = {rx, rW, rb, rout, rdx, rdW, rdb, rdy, rO, rX, rWW, rDX, rDW, rdb2, rdO};
    for (size_t k = 0; k < sizeof hosts / sizeof hosts[0]; k++) free(hosts[k]);
}

static void check_rowwise(void)
{
    const int rows = 6, C = 10;
    const long n = rows * C;
    float *x = random_buffer(SPB_MEM_ACTIVATIONS, n, 2), *y = random_buffer(SPB_MEM_ACTIVATIONS, n, 1);
    float *mean = bf->alloc(SPB_MEM_ACTIVATIONS, rows), *rstd = bf->alloc(SPB_MEM_ACTIVATIONS, rows);
    float *w = random_buffer(SPB_MEM_PARAMS, C, 1), *b = random_buffer(SPB_MEM_PARAMS, C, 0.2f);
    float *rx = widened(x, n), *rw = widened(w, C), *rb = widened(b, C);
    float *ry = malloc(sizeof(float) * n), rmean[6], rrstd[6];
    spb_layernorm_forward(ry, rmean, rrstd, rx, rw, rb, rows, C);
    bf->layernorm_forward(y, mean, rstd, x, w, b, rows, C);
    tally("layernorm_forward", mismatches(y, ry, n) + mismatches(mean, rmean, rows) + mismatches(rstd, rrstd, rows));
    ck_assert_int_eq(spb_handle_dtype(spb_handle_find(mean, NULL), 0), SPB_DTYPE_F32); /* statistics stay fp32 */

    float *dx = random_buffer(SPB_MEM_WORKSPACE, n, 1), *dw = random_buffer(SPB_MEM_GRADS, C, 1);
    float *db = random_buffer(SPB_MEM_GRADS, C, 1);
    float *rdx = widened(dx, n), *rdw = widened(dw, C), *rdb = widened(db, C), *rdy = widened(y, n);
    spb_layernorm_backward(rdx, rdw, rdb, rdy, rx, rw, rmean, rrstd, rows, C);
    bf->layernorm_backward(dx, dw, db, y, x, w, mean, rstd, rows, C);
    tally("layernorm_backward", mismatches(dx, rdx, n) + mismatches(dw, rdw, C) + mismatches(db, rdb, C));

    float *g = bf->alloc(SPB_MEM_ACTIVATIONS, n), *rg = malloc(sizeof(float) * n);
    spb_gelu_forward(rg, rx, n);
    bf->gelu_forward(g, x, n);
    tally("gelu_forward", mismatches(g, rg, n));
    float *rd = widened(dx, n);
    spb_gelu_backward(rd, rx, rd, n); /* in place, as the core calls it */
    bf->gelu_backward(dx, x, dx, n);
    tally("gelu_backward", mismatches(dx, rd, n));

    float *ra = widened(y, n);
    spb_add_inplace(ra, rx, n);
    bf->add_inplace(y, x, n);
    tally("add_inplace", mismatches(y, ra, n));
    float *rr = widened(y, n);
    for (int r = 0; r < rows; r++) spb_add_inplace(rr + (long)r * C, rb, C);
    bf->add_bias_rows(y, b, rows, C);
    tally("add_bias_rows", mismatches(y, rr, n));
    float *rdb2 = widened(db, C);
    for (int r = 0; r < rows; r++) spb_add_inplace(rdb2, rx + (long)r * C, C);
    bf->bias_grad_rows(db, x, rows, C);
    tally("bias_grad_rows", mismatches(db, rdb2, C));
    double s = bf->sum_squares(x, n);
    tally("sum_squares", s != spb_sum_squares(rx, n));

    float *bufs[] = {x, y, mean, rstd, w, b, dx, dw, db, g};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) bf->free(bufs[k]);
    float *hosts[] = {rx, rw, rb, ry, rdx, rdw, rdb, rdy, rg, rd, ra, rr, rdb2};
    for (size_t k = 0; k < sizeof hosts / sizeof hosts[0]; k++) free(hosts[k]);
}

static void check_embedding_and_loss(void)
{
    const int rows = 8, T = 4, C = 6, V = 11, maxpos = 9;
    int tokens[8] = {3, 0, 10, 3, 7, 1, 1, 9};
    long positions[4] = {5, 6, 7, 8};
    int *tok = bf->alloc_ints(SPB_MEM_ACTIVATIONS, rows);
    bf->ints_to_device(tok, tokens, rows);
    float *wte = random_buffer(SPB_MEM_PARAMS, V * C, 1), *wpe = random_buffer(SPB_MEM_PARAMS, maxpos * C, 1);
    float *out = bf->alloc(SPB_MEM_ACTIVATIONS, rows * C);
    float *rwte = widened(wte, V * C), *rwpe = widened(wpe, maxpos * C), *rout = malloc(sizeof(float) * rows * C);
    spb_embedding_forward(rout, tokens, rwte, rwpe, positions, rows, T, C);
    bf->embedding_forward(out, tok, wte, wpe, positions, rows, T, C);
    tally("embedding_forward", mismatches(out, rout, rows * C));
    float *dwte = random_buffer(SPB_MEM_GRADS, V * C, 1), *dwpe = random_buffer(SPB_MEM_GRADS, maxpos * C, 1);
    float *rdwte = widened(dwte, V * C), *rdwpe = widened(dwpe, maxpos * C), *rdout = widened(out, rows * C);
    spb_embedding_backward(rdwte, rdwpe, rdout, tokens, positions, rows, T, C);
    bf->embedding_backward(dwte, dwpe, out, tok, positions, rows, T, C);
    tally("embedding_backward", mismatches(dwte, rdwte, V * C) + mismatches(dwpe, rdwpe, maxpos * C));

    float *logits = random_buffer(SPB_MEM_ACTIVATIONS, rows * V, 3), *rp = widened(logits, rows * V);
    double want = spb_softmax_xent_forward(rp, tokens, rows, V);
    double got = bf->softmax_xent_forward(logits, tok, rows, V);
    tally("softmax_xent_forward", mismatches(logits, rp, rows * V) + (got != want));
    float *rq = widened(logits, rows * V);
    spb_softmax_xent_backward(rq, tokens, rows, V, 0.125f);
    bf->softmax_xent_backward(logits, tok, rows, V, 0.125f);
    tally("softmax_xent_backward", mismatches(logits, rq, rows * V));

    float *bufs[] = {wte, wpe, out, dwte, dwpe, logits};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) bf->free(bufs[k]);
    bf->free(tok);
    float *hosts[] = {rwte, rwpe, rout, rdwte, rdwpe, rdout, rp, rq};
    for (size_t k = 0; k < sizeof hosts / sizeof hosts[0]; k++) free(hosts[k]);
}

/* Attention on a fused [B][T][3][H][D] buffer, both kernels; the merge. */
static void check_attention(const char *name)
{
    const int B = 2, T = 9, H = 2, D = 4;
    const long W = H * D, nqkv = (long)B * T * 3 * W, no = (long)B * T * W, nl = (long)B * H * T;
    spb_attn_desc d = {.batch = B, .heads = H, .head_dim = D, .q_len = T, .k_len = T, .causal = 1, .scale = 0.5f,
                       .q_token_stride = 3 * W, .q_batch_stride = 3 * W * T, .k_token_stride = 3 * W,
                       .k_batch_stride = 3 * W * T, .o_token_stride = W, .o_batch_stride = W * T};
    const spb_attn_backend *cpu = spb_attn_backend_by_name(name), *dev = bf->attention(name);
    ck_assert_ptr_nonnull(dev);
    float *qkv = random_buffer(SPB_MEM_ACTIVATIONS, nqkv, 1), *o = bf->alloc(SPB_MEM_ACTIVATIONS, no);
    float *lse = bf->alloc(SPB_MEM_ACTIVATIONS, nl);
    float *rqkv = widened(qkv, nqkv), *ro = malloc(sizeof(float) * no), *rl = malloc(sizeof(float) * nl);
    cpu->forward(&d, rqkv, rqkv + W, rqkv + 2 * W, ro, rl);
    dev->forward(&d, qkv, qkv + W, qkv + 2 * W, o, lse);
    tally("attention_forward", mismatches(o, ro, no) + mismatches(lse, rl, nl));

    float *dout = random_buffer(SPB_MEM_WORKSPACE, no, 1), *dqkv = random_buffer(SPB_MEM_WORKSPACE, nqkv, 0.1f);
    float *rdo = widened(dout, no), *rdq = widened(dqkv, nqkv), *rob = widened(o, no), *rlb = widened(lse, nl);
    cpu->backward(&d, rqkv, rqkv + W, rqkv + 2 * W, rob, rlb, rdo, rdq, rdq + W, rdq + 2 * W);
    dev->backward(&d, qkv, qkv + W, qkv + 2 * W, o, lse, dout, dqkv, dqkv + W, dqkv + 2 * W);
    tally("attention_backward", mismatches(dqkv, rdq, nqkv));

    /* Fold rows [3, 8) of a second block into (o, lse). */
    const int row = 3, len = 5;
    float *op = random_buffer(SPB_MEM_WORKSPACE, no, 1), *lp = random_buffer(SPB_MEM_WORKSPACE, (long)B * H * len, 1);
    float *rop = widened(op, no), *rlp = widened(lp, (long)B * H * len), *rom = widened(o, no), *rlm = widened(lse, nl);
    spb_attn_merge_rows(rom, rlm, rop, rlp, B, H, D, T, row, len);
    bf->attn_merge(o, lse, op, lp, B, H, D, T, row, len);
    tally("attn_merge", mismatches(o, rom, no) + mismatches(lse, rlm, nl));

    float *bufs[] = {qkv, o, lse, dout, dqkv, op, lp};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) bf->free(bufs[k]);
    float *hosts[] = {rqkv, ro, rl, rdo, rdq, rob, rlb, rop, rlp, rom, rlm};
    for (size_t k = 0; k < sizeof hosts / sizeof hosts[0]; k++) free(hosts[k]);
}

/* Copies move values (rounding fp32 into bf16); fill and zero; AdamW
 * updates the fp32 master and rounds the parameter from it. */
static void check_memory_ops_and_adamw(void)
{
    const long n = 40;
    float *a = random_buffer(SPB_MEM_ACTIVATIONS, n, 1), *b = bf->alloc(SPB_MEM_ACTIVATIONS, n);
    float *m = random_buffer(SPB_MEM_OPTIMIZER, n, 1); /* fp32 storage */
    bf->zero(b, n);
    float *ra = widened(a, n), *rm = widened(m, n);
    bf->copy(b, a, n);
    tally("copy", mismatches(b, ra, n));
    bf->copy(b + 5, m, 20);
    float *want = widened(b, n);
    memcpy(want + 5, rm, sizeof(float) * 20);
    tally("copy", mismatches(b, want, n));
    bf->copy_rows(b, 8, a + 1, 10, 4, 3);
    float *rows = widened(b, n);
    for (int r = 0; r < 4; r++) memcpy(want + r * 8, ra + 1 + r * 10, sizeof(float) * 3);
    for (long k = 0; k < n; k++)
        if (k % 8 >= 3) want[k] = rows[k];
    tally("copy_rows", mismatches(b, want, n));
    bf->fill(b, n, 1.0f / 3.0f);
    for (long k = 0; k < n; k++) want[k] = 1.0f / 3.0f;
    tally("fill", mismatches(b, want, n));
    bf->zero(b + 2, 7);
    for (long k = 2; k < 9; k++) want[k] = 0.0f;
    tally("zero", mismatches(b, want, n));

    spb_config cfg;
    spb_config_defaults(&cfg);
    float *p = bf->alloc(SPB_MEM_PARAMS, n), *g = random_buffer(SPB_MEM_GRADS, n, 1);
    float *v = bf->alloc(SPB_MEM_OPTIMIZER, n), *mom = bf->alloc(SPB_MEM_OPTIMIZER, n);
    float *master = malloc(sizeof(float) * n), *rg = widened(g, n), *rmom = calloc(n, sizeof(float));
    float *rv = calloc(n, sizeof(float)), *back = malloc(sizeof(float) * n);
    for (long k = 0; k < n; k++) master[k] = 0.02f * (float)spb_rng_normal(5, 1, (uint64_t)k);
    bf->staging.to_device(p, master, sizeof(float) * n); /* the master takes the fp32 values */
    for (long step = 1; step <= 3; step++) {
        spb_adamw_apply(master, rg, rmom, rv, n, 0.5f, 0.1f, &cfg, step, 1e-2);
        bf->adamw_apply(p, g, mom, v, n, 0.5f, 0.1f, &cfg, step, 1e-2);
    }
    bf->staging.to_host(back, p, sizeof(float) * n);
    tally("adamw_apply", mismatches(p, master, n) + mismatches(mom, rmom, n) + mismatches(v, rv, n) +
                             (memcmp(back, master, sizeof(float) * n) != 0));

    float *bufs[] = {a, b, m, p, g, v, mom};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) bf->free(bufs[k]);
    float *hosts[] = {ra, rm, want, rows, master, rg, rmom, rv, back};
    for (size_t k = 0; k < sizeof hosts / sizeof hosts[0]; k++) free(hosts[k]);
}

static long run_all(void)
{
    total = 0, num_ops = 0;
    memset(per_op, 0, sizeof per_op);
    check_products();
    check_rowwise();
    check_embedding_and_loss();
    check_attention("naive");
    check_attention("flash");
    check_memory_ops_and_adamw();
    return total;
}

START_TEST(every_operation_rounds_once_to_nearest_even)
{
    long bad = run_all();
    for (int k = 0; k < num_ops; k++) {
        printf("%-22s %ld elements off\n", op_names[k], per_op[k]);
        ck_assert_msg(per_op[k] == 0, "%s: %ld elements differ from round(fp32 op)", op_names[k], per_op[k]);
    }
    ck_assert_int_eq(bad, 0);
    ck_assert_int_ge(num_ops, 21);
    ck_assert_int_eq(spb_handles_live(), 0); /* everything made was freed */
}
END_TEST

START_TEST(a_truncating_table_is_caught)
{
    spb_bf16_set_truncation_for_tests(1);
    long bad = run_all();
    spb_bf16_set_truncation_for_tests(0);
    int caught = 0;
    for (int k = 0; k < num_ops; k++) caught += per_op[k] > 0;
    printf("truncating instead of rounding: %ld elements off, in %d of %d operations\n", bad, caught, num_ops);
    /* sum_squares writes nothing, and fill/zero write exact values. */
    ck_assert_int_ge(caught, num_ops - 3);
}
END_TEST

/* Host storage behaving like the CUDA instance's (cuda_bf16.cu): scratch is
 * a stack (a block given back out of order fails), never zeroed (NaN bytes
 * when handed out and when given back, so reading a copy that was not
 * loaded, or one already freed, shows), and the conversions are counted. */
static const spb_handle_storage *host;
static void *scratch_stack[16];
static size_t scratch_bytes[16];
static int scratch_depth;
static long widens, narrows, scratch_blocks;

static void *strict_scratch_alloc(size_t bytes)
{
    ck_assert_int_lt(scratch_depth, 16);
    void *p = host->scratch_alloc(bytes);
    memset(p, 0xff, bytes);
    scratch_stack[scratch_depth] = p, scratch_bytes[scratch_depth] = bytes;
    scratch_depth++, scratch_blocks++;
    return p;
}

static void strict_scratch_free(void *p)
{
    ck_assert_msg(scratch_depth > 0 && scratch_stack[scratch_depth - 1] == p, "scratch given back out of order");
    scratch_depth--;
    memset(p, 0xff, scratch_bytes[scratch_depth]);
    host->scratch_free(p);
}

static void counted_widen(float *dst, const spb_bf16 *src, long n, spb_half_format fmt)
{
    widens++;
    host->widen(dst, src, n, fmt);
}

static void counted_narrow(spb_bf16 *dst, const float *src, long n, float *masters, int truncate,
                           spb_half_format fmt)
{
    narrows++;
    host->narrow(dst, src, n, masters, truncate, fmt);
}

START_TEST(a_device_like_storage_gives_the_same)
{
    host = &spb_handle_host_storage;
    spb_handle_storage strict = *host;
    strict.scratch_alloc = strict_scratch_alloc, strict.scratch_free = strict_scratch_free;
    strict.widen = counted_widen, strict.narrow = counted_narrow;
    spb_bf16_use(&spb_backend_cpu, &strict, &spb_bf16_direct_cpu);
    long bad = run_all();
    spb_bf16_use(&spb_backend_cpu, NULL, &spb_bf16_direct_cpu);
    printf("device-like storage: %ld elements off; %ld widens, %ld narrows, %ld scratch blocks\n", bad, widens,
           narrows, scratch_blocks);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(scratch_depth, 0);
    ck_assert(widens > 0 && narrows > 0 && scratch_blocks > 0);
    ck_assert_int_eq(spb_handles_live(), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bf16_ops");
    TCase *tc = tcase_create("ops");
    tcase_add_test(tc, every_operation_rounds_once_to_nearest_even);
    tcase_add_test(tc, a_truncating_table_is_caught);
    tcase_add_test(tc, a_device_like_storage_gives_the_same);
    suite_add_tcase(s, tc);
    return spb_run_suite(s, CK_NOFORK);
}
