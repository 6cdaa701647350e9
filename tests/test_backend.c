/* The GPT core computes only through its device table (common/core/backend.h):
 * a wrapper table that counts every call and forwards to the CPU's gives
 * the same loss and gradients bit for bit, and every operation of the
 * table is used by a forward and backward (with tensor parallelism and
 * checkpointing, so the region and recompute paths are covered).  A core
 * that bypassed the table for some operation would leave its counter at 0
 * here, and a CUDA table would then miss it. */
#include <check.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "checks.h"
#include "gpt.h"
#include "optimizer.h"
#include "train.h"
#include "mpi_check.h"
#include "strategy_check.h"

enum { OP_ALLOC, OP_ALLOC_INTS, OP_FREE, OP_ZERO, OP_INTS, OP_MM_F, OP_MM_B, OP_MM_FLD, OP_MM_BLD, OP_LN_F, OP_LN_B,
       OP_GELU_F, OP_GELU_B, OP_EMB_F, OP_EMB_B, OP_XENT_F, OP_XENT_B, OP_ADD, OP_BIAS, OP_BIAS_GRAD, NUM_OPS };
static const char *op_names[NUM_OPS] = {
    "alloc", "alloc_ints", "free", "zero", "ints_to_device", "matmul_forward", "matmul_backward",
    "matmul_forward_ld", "matmul_backward_ld", "layernorm_forward", "layernorm_backward", "gelu_forward",
    "gelu_backward", "embedding_forward", "embedding_backward", "softmax_xent_forward", "softmax_xent_backward",
    "add_inplace", "add_bias_rows", "bias_grad_rows"};
static long calls[NUM_OPS];
static const spb_backend *cpu = &spb_backend_cpu;

static float *w_alloc(spb_mem_category c, long n) { calls[OP_ALLOC]++; return cpu->alloc(c, n); }
static int *w_alloc_ints(spb_mem_category c, long n) { calls[OP_ALLOC_INTS]++; return cpu->alloc_ints(c, n); }
static void w_free(void *p) { calls[OP_FREE]++; cpu->free(p); }
static void w_zero(float *x, long n) { calls[OP_ZERO]++; cpu->zero(x, n); }
static void w_ints(int *d, const int *h, long n) { calls[OP_INTS]++; cpu->ints_to_device(d, h, n); }
static void w_mm_f(float *o, const float *i, const float *W, const float *b, int r, int in, int out)
{
    calls[OP_MM_F]++;
    cpu->matmul_forward(o, i, W, b, r, in, out);
}
static void w_mm_b(float *di, float *dW, float *db, const float *dout, const float *i, const float *W, int r, int in,
                   int out, int acc)
{
    calls[OP_MM_B]++;
    cpu->matmul_backward(di, dW, db, dout, i, W, r, in, out, acc);
}
static void w_mm_fld(float *o, int ldo, const float *i, int ldi, const float *W, int ldw, const float *b, int r,
                     int in, int out, int acc)
{
    calls[OP_MM_FLD]++;
    cpu->matmul_forward_ld(o, ldo, i, ldi, W, ldw, b, r, in, out, acc);
}
static void w_mm_bld(float *di, int lddi, float *dW, int lddw, float *db, const float *dout, int ldo, const float *i,
                     int ldi, const float *W, int ldw, int r, int in, int out, int acc)
{
    calls[OP_MM_BLD]++;
    cpu->matmul_backward_ld(di, lddi, dW, lddw, db, dout, ldo, i, ldi, W, ldw, r, in, out, acc);
}
static void w_ln_f(float *o, float *m, float *s, const float *i, const float *w, const float *b, int r, int C)
{
    calls[OP_LN_F]++;
    cpu->layernorm_forward(o, m, s, i, w, b, r, C);
}
static void w_ln_b(float *di, float *dw, float *db, const float *dout, const float *i, const float *w, const float *m,
                   const float *s, int r, int C)
{
    calls[OP_LN_B]++;
    cpu->layernorm_backward(di, dw, db, dout, i, w, m, s, r, C);
}
static void w_gelu_f(float *o, const float *i, long n) { calls[OP_GELU_F]++; cpu->gelu_forward(o, i, n); }
static void w_gelu_b(float *di, const float *i, const float *dout, long n)
{
    calls[OP_GELU_B]++;
    cpu->gelu_backward(di, i, dout, n);
}
static void w_emb_f(float *o, const int *t, const float *wte, const float *wpe, const long *pos, int r, int T, int C)
{
    calls[OP_EMB_F]++;
    cpu->embedding_forward(o, t, wte, wpe, pos, r, T, C);
}
static void w_emb_b(float *dwte, float *dwpe, const float *dout, const int *t, const long *pos, int r, int T, int C)
{
    calls[OP_EMB_B]++;
    cpu->embedding_backward(dwte, dwpe, dout, t, pos, r, T, C);
}
static double w_xent_f(float *p, const int *t, int r, int V)
{
    calls[OP_XENT_F]++;
    return cpu->softmax_xent_forward(p, t, r, V);
}
static void w_xent_b(float *p, const int *t, int r, int V, float s)
{
    calls[OP_XENT_B]++;
    cpu->softmax_xent_backward(p, t, r, V, s);
}
static void w_add(float *a, const float *b, long n) { calls[OP_ADD]++; cpu->add_inplace(a, b, n); }
static void w_bias(float *x, const float *b, long r, int C) { calls[OP_BIAS]++; cpu->add_bias_rows(x, b, r, C); }
static void w_bias_grad(float *db, const float *dy, long r, int C)
{
    calls[OP_BIAS_GRAD]++;
    cpu->bias_grad_rows(db, dy, r, C);
}

static void w_copy(float *d, const float *s, long n) { cpu->copy(d, s, n); }

static const spb_backend counting = {
    .name = "counting-cpu", .host_memory = 1, .copy = w_copy, .adamw_apply = spb_adamw_apply,
    .sum_squares = spb_sum_squares, .attention = spb_attn_backend_by_name, .alloc = w_alloc, .alloc_ints = w_alloc_ints, .free = w_free, .zero = w_zero,
    .ints_to_device = w_ints, .matmul_forward = w_mm_f, .matmul_backward = w_mm_b, .matmul_forward_ld = w_mm_fld,
    .matmul_backward_ld = w_mm_bld, .layernorm_forward = w_ln_f, .layernorm_backward = w_ln_b,
    .gelu_forward = w_gelu_f, .gelu_backward = w_gelu_b, .embedding_forward = w_emb_f,
    .embedding_backward = w_emb_b, .softmax_xent_forward = w_xent_f, .softmax_xent_backward = w_xent_b,
    .add_inplace = w_add, .add_bias_rows = w_bias, .bias_grad_rows = w_bias_grad};

/* One forward and backward of a Megatron-SP model (TP over 2 ranks) with
 * checkpointing; returns the loss, gradients in g->grads. */
static double step(spb_gpt *g, const spb_config *c, const spb_grid *grid)
{
    int BT = g->B * g->T;
    int *in = malloc(sizeof(int) * (size_t)BT), *tg = malloc(sizeof(int) * (size_t)BT);
    for (int i = 0; i < BT; i++) in[i] = (7 * i + 3 * grid->sp_rank) % c->vocab_size, tg[i] = (5 * i + 1) % c->vocab_size;
    spb_gpt_zero_grads(g);
    double loss = spb_gpt_forward(g, in, tg);
    spb_gpt_backward(g, 1.0f / BT);
    free(in);
    free(tg);
    return loss;
}

START_TEST(core_computes_through_its_table)
{
    spb_config c;
    spb_config_defaults(&c);
    c.num_layers = 2, c.hidden_size = 32, c.num_heads = 4, c.vocab_size = 64, c.seq_length = 32;
    c.micro_batch_size = 2, c.sp_degree = 2, c.checkpoint_activations = 1;
    snprintf(c.strategy, sizeof c.strategy, "%s", "megatron");
    char err[256];
    ck_assert_msg(spb_config_finalize(&c, 2, err, sizeof err) == 0, "%s", err);
    spb_grid grid;
    spb_grid_create(&grid, MPI_COMM_WORLD, 2);

    spb_gpt *plain = spb_gpt_create(&c, &grid);
    spb_gpt_init_params(plain, c.seed);
    double loss_plain = step(plain, &c, &grid);

    /* The same model through the counting table, from creation on. */
    memset(calls, 0, sizeof calls);
    spb_backend_register_for_tests(&counting);
    spb_gpt *wrapped = spb_gpt_create(&c, &grid);
    spb_backend_register_for_tests(NULL);
    ck_assert_ptr_eq(wrapped->be, &counting);
    spb_gpt_init_params(wrapped, c.seed);
    double loss_wrapped = step(wrapped, &c, &grid);

    ck_assert(loss_plain == loss_wrapped);
    ck_assert_int_eq(memcmp(plain->grads, wrapped->grads, sizeof(float) * (size_t)plain->num_params), 0);
    spb_gpt_destroy(wrapped);
    for (int k = 0; k < NUM_OPS; k++) {
        say("%-22s %ld calls\n", op_names[k], calls[k]);
        ck_assert_msg(calls[k] > 0, "the core never called %s through its table", op_names[k]);
    }
    ck_assert_int_eq(calls[OP_FREE], calls[OP_ALLOC] + calls[OP_ALLOC_INTS]); /* everything it made, it freed */
    spb_gpt_destroy(plain);
    spb_grid_destroy(&grid);
}
END_TEST

/* The host-staged path (comm.h): a table that says its memory is not the
 * host's makes every float collective copy out, run MPI on host buffers and
 * copy back.  Here the "device" is host memory and the copies are memcpy,
 * so every strategy must give bit for bit what it gives without staging;
 * a staged collective that sent a stale buffer, copied back the wrong
 * size or skipped the copy back changes the result. */
static double staged_bytes[2];
static void to_host(void *h, const void *d, size_t n) { staged_bytes[0] += (double)n; memcpy(h, d, n); }
static void to_device(void *d, const void *h, size_t n) { staged_bytes[1] += (double)n; memcpy(d, h, n); }

START_TEST(host_staged_path_is_exact)
{
    static const small_case cases[] = {
        {"none", "alltoall", "contiguous", 2, 0, 1, 0},     {"ulysses", "alltoall", "contiguous", 1, 0, 2, 0},
        {"ulysses", "alltoall", "contiguous", 2, 0, 2, 0},  {"ulysses", "allgather", "contiguous", 1, 0, 2, 0},
        {"megatron", "alltoall", "contiguous", 2, 0, 2, 0}, {"ring", "alltoall", "zigzag", 2, 0, 2, 0},
        {"ring", "alltoall", "contiguous", 1, 0, 2, 0},     {"none", "alltoall", "contiguous", 1, 1, 1, 0},
        {"ulysses", "alltoall", "contiguous", 1, 2, 2, 0},  {"ulysses", "alltoall", "contiguous", 1, 3, 2, 0},
        {"megatron", "alltoall", "contiguous", 1, 3, 2, 0}, {"ring", "alltoall", "zigzag", 1, 3, 2, 0},
    };
    spb_backend staged = spb_backend_cpu;
    staged.name = "staged-cpu";
    staged.host_memory = 0;
    staged.staging = (spb_comm_staging){.to_host = to_host, .to_device = to_device};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        spb_config c;
        small_case_config(&c, &cases[k]);
        spb_grid grid;
        double plain_loss[2], staged_loss[2];
        spb_trainer *a = make(&c, MPI_COMM_WORLD, &grid);
        for (int i = 0; i < 2; i++) plain_loss[i] = spb_trainer_step(a);
        staged_bytes[0] = staged_bytes[1] = 0;
        spb_backend_register_for_tests(&staged);
        spb_trainer *b = spb_trainer_create(&c, &grid);
        spb_backend_register_for_tests(NULL);
        for (int i = 0; i < 2; i++) staged_loss[i] = spb_trainer_step(b);
        spb_comm_set_staging(NULL);
        say("%-8s %-9s %-10s micro %d ZeRO-%d: staged %.0f bytes out, %.0f back; losses %s\n", cases[k].strategy,
            cases[k].comm, cases[k].layout, cases[k].micro, cases[k].zero, staged_bytes[0], staged_bytes[1],
            memcmp(plain_loss, staged_loss, sizeof plain_loss) ? "DIFFER" : "bit-identical");
        ck_assert_int_eq(memcmp(plain_loss, staged_loss, sizeof plain_loss), 0);
        ck_assert(same_local_params(a, b));
        ck_assert(staged_bytes[0] > 0 && staged_bytes[1] > 0);
        spb_trainer_destroy(a);
        spb_trainer_destroy(b);
        spb_grid_destroy(&grid);
    }
}
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, core_computes_through_its_table);
    tcase_add_test(tc, host_staged_path_is_exact);
    suite_add_tcase(s, tc);
    return spb_run_suite_and_finalize(s);
}
