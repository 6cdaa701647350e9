/* The memory model against the tracked allocator, under mpiexec -np 4:
 * parameters, gradients, optimizer state and activations per rank, predicted
 * from the configuration alone, equal the bytes the run allocates, over a
 * grid of strategies x ZeRO stages x P x N x checkpointing; and the scaling
 * the paper's argument rests on holds. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "checks.h"
#include "memory_model.h"
#include "train.h"
#include "mpi_check.h"


static const spb_mem_category predicted[] = {SPB_MEM_PARAMS, SPB_MEM_GRADS, SPB_MEM_OPTIMIZER, SPB_MEM_ACTIVATIONS};

/* Builds the trainer on groups of `world` ranks, takes one step and returns
 * the peak bytes per category over it (the measured side; ZeRO-2/3's
 * gradient and gathered buffers live only inside the step) and the
 * model's prediction. */
/* The model variant of a measurement: "gpt" or "llama", with G K/V heads
 * (0: as many as heads). */
typedef struct variant_spec {
    const char *model;
    int G;
} variant_spec;
static const variant_spec gpt_variant = {"gpt", 0};

static void measure_variant(int world, const char *strategy, int U, int P, int zero, int N, int ckpt,
                            const variant_spec *v, double measured[4], double model[4])
{
    spb_config c;
    spb_config_defaults(&c);
    c.num_layers = 2, c.hidden_size = 32, c.num_heads = 4, c.vocab_size = 64, c.seq_length = N;
    c.micro_batch_size = 2, c.sp_degree = P, c.zero_stage = zero, c.checkpoint_activations = ckpt;
    snprintf(c.model, sizeof c.model, "%s", v->model);
    c.num_query_groups = v->G;
    if (!strcmp(v->model, "llama")) c.ffn_hidden_size = 96;
    snprintf(c.strategy, sizeof c.strategy, "%s", strategy);
    c.ulysses_degree = U; /* hybrid only; 0: P */
    char err[256];
    ck_assert_msg(spb_config_finalize(&c, world, err, sizeof err) == 0, "%s", err);
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, spb_world_rank() / world, 0, &comm);
    size_t before[SPB_MEM_NUM_CATEGORIES];
    memcpy(before, spb_mem_get_stats()->current, sizeof before);
    spb_mem_reset_peaks();
    spb_grid g;
    spb_grid_create_nested(&g, comm, P, U);
    spb_trainer *t = spb_trainer_create(&c, &g);
    spb_trainer_step(t);
    spb_memory_prediction pred;
    spb_memory_model(&c, world, SPB_FP32, &pred);
    for (int k = 0; k < 4; k++) {
        measured[k] = (double)(spb_mem_get_stats()->peak[predicted[k]] - before[predicted[k]]);
        model[k] = pred.bytes[predicted[k]];
    }
    spb_trainer_destroy(t);
    spb_grid_destroy(&g);
    MPI_Comm_free(&comm);
}

static void measure_on(int world, const char *strategy, int P, int zero, int N, int ckpt, double measured[4],
                       double model[4])
{
    measure_variant(world, strategy, 0, P, zero, N, ckpt, &gpt_variant, measured, model);
}

static void measure(const char *strategy, int P, int zero, int N, int ckpt, double measured[4], double model[4])
{
    measure_on(4, strategy, P, zero, N, ckpt, measured, model);
}

START_TEST(model_equals_allocator)
{
    const char *strategies[] = {"none", "ulysses", "megatron", "ring"};
    int cases = 0;
    for (int s = 0; s < 4; s++)
        for (int P = 1; P <= 4; P *= 2) {
            if ((s == 0) != (P == 1)) continue; /* none: P = 1 only; the others P = 2, 4 */
            for (int zero = 0; zero <= 3; zero++)
                for (int N = 64; N <= 96; N += 32)
                    for (int ckpt = 0; ckpt <= 1; ckpt++) {
                        double m[4], p[4];
                        measure(strategies[s], P, zero, N, ckpt, m, p);
                        for (int k = 0; k < 4; k++)
                            ck_assert_msg(m[k] == p[k], "%s P=%d ZeRO-%d N=%d ckpt=%d: %s measured %.0f, model %.0f",
                                          strategies[s], P, zero, N, ckpt,
                                          spb_mem_category_name(predicted[k]), m[k], p[k]);
                        cases++;
                    }
        }
    say("memory model = allocator (params, grads, optimizer, activations) in %d configurations\n", cases);
    ck_assert_int_ge(cases, 20);
}
END_TEST

/* The hybrid (every U dividing P = 4) and all-gather-KV: their attention
 * state (head-side copies and log-sum-exp of the Ulysses groups' N/R
 * tokens; the log-sum-exp of local queries) is modelled exactly too. */
START_TEST(new_strategies_modelled)
{
    static const struct { const char *strategy; int U; } runs[] = {
        {"hybrid", 1}, {"hybrid", 2}, {"hybrid", 4}, {"allgather-kv", 0}};
    for (int k = 0; k < 4; k++)
        for (int zero = 0; zero <= 3; zero += 3)
            for (int ckpt = 0; ckpt <= 1; ckpt++) {
                double m[4], p[4];
                measure_variant(4, runs[k].strategy, runs[k].U, 4, zero, 96, ckpt, &gpt_variant, m, p);
                for (int i = 0; i < 4; i++)
                    ck_assert_msg(m[i] == p[i], "%s U=%d ZeRO-%d ckpt=%d: %s measured %.0f, model %.0f",
                                  runs[k].strategy, runs[k].U, zero, ckpt, spb_mem_category_name(predicted[i]), m[i],
                                  p[i]);
                say("%s U=%d ZeRO-%d ckpt=%d: activations/rank %.0f = model\n", runs[k].strategy, runs[k].U, zero,
                    ckpt, m[3]);
            }
}
END_TEST

/* The Llama preset (SwiGLU's wider pre-activation, no biases, an untied
 * head) with G = 1, 2, 4 K/V heads: Ulysses' and the hybrid's replicated
 * K/V heads (G < P, G < U) and Megatron-SP's K/V shards (replicated on
 * P/G ranks when G < P) are counted as allocated. */
START_TEST(llama_model_equals_allocator)
{
    /* the hybrid with U = 2 (G = 1 < U replicates K/V heads in its groups) */
    const char *strategies[] = {"ulysses", "megatron", "ring", "hybrid", "allgather-kv"};
    int cases = 0;
    for (int s = 0; s < 5; s++)
        for (int P = 2; P <= 4; P *= 2)
            for (int G = 1; G <= 4; G *= 2)
                for (int zero = 0; zero <= 3; zero += strcmp(strategies[s], "megatron") ? 3 : 1) {
                    variant_spec v = {"llama", G};
                    double m[4], p[4];
                    measure_variant(4, strategies[s], !strcmp(strategies[s], "hybrid") ? 2 : 0, P, zero, 64, 0, &v, m,
                                    p);
                    for (int k = 0; k < 4; k++)
                        ck_assert_msg(m[k] == p[k], "llama %s P=%d G=%d ZeRO-%d: %s measured %.0f, model %.0f",
                                      strategies[s], P, G, zero, spb_mem_category_name(predicted[k]), m[k], p[k]);
                    cases++;
                }
    say("memory model = allocator for the Llama preset in %d configurations (G = 1, 2, 4)\n", cases);
}
END_TEST

START_TEST(scaling)
{
    double m2[4], m4[4], p[4], z0[4], z2[4];
    /* Ulysses' activations per rank scale as 1/P at fixed N. */
    measure("ulysses", 2, 0, 96, 0, m2, p);
    measure("ulysses", 4, 0, 96, 0, m4, p);
    say("ulysses activations/rank: P=2 %.0f, P=4 %.0f (x%.3f)\n", m2[3], m4[3], m4[3] / m2[3]);
    ck_assert_double_eq_tol(m4[3] / m2[3], 0.5, 1e-12);
    /* Megatron-SP shards its weights P ways without ZeRO: the sharded part
     * halves from P = 2 to 4 (embeddings and LayerNorms stay whole). */
    measure("megatron", 2, 0, 96, 0, m2, p);
    measure("megatron", 4, 0, 96, 0, m4, p);
    double C = 32, F = 128, L = 2, whole = 64 * C + 96 * C + L * 6 * C + 2 * C;
    double sharded2 = m2[0] / 4 - whole, sharded4 = m4[0] / 4 - whole;
    say("megatron parameter floats/rank: P=2 %.0f, P=4 %.0f; sharded part x%.3f\n", m2[0] / 4, m4[0] / 4,
        sharded4 / sharded2);
    ck_assert_double_eq_tol(sharded4 / sharded2, 0.5, 1e-12);
    ck_assert_double_eq(sharded2, L * (3 * C * C + 3 * C + C * C + 2 * F * C + F) / 2);
    /* ZeRO partitions the optimizer state over D x P = 4 ranks. */
    measure("ulysses", 2, 0, 96, 0, z0, p);
    measure("ulysses", 2, 2, 96, 0, z2, p);
    say("ulysses optimizer bytes/rank: ZeRO-0 %.0f, ZeRO-2 %.0f (x%.4f)\n", z0[2], z2[2], z2[2] / z0[2]);
    ck_assert_double_le(z2[2] / z0[2], 0.25 + 1e-3);
    /* ZeRO-3 partitions the parameters too: bytes per rank scale as
     * 1/(D x P), from 2 ranks to 4, for each strategy without shards (up
     * to the padding of the last slice of each tensor). */
    const char *replicating[] = {"none", "ulysses", "ring"};
    for (int s = 0; s < 3; s++) {
        int P2 = s == 0 ? 1 : 2, P4 = s == 0 ? 1 : 4;
        double w2[4], w4[4], full[4];
        measure_on(2, replicating[s], P2, 3, 96, 0, w2, p);
        measure_on(4, replicating[s], P4, 3, 96, 0, w4, p);
        measure_on(4, replicating[s], P4, 0, 96, 0, full, p);
        say("%-8s ZeRO-3 parameter bytes/rank: D x P = 2: %.0f, 4: %.0f (x%.4f); ZeRO-0 %.0f (x%.4f)\n", replicating[s],
            w2[0], w4[0], w4[0] / w2[0], full[0], w4[0] / full[0]);
        ck_assert_double_eq_tol(w4[0] / w2[0], 0.5, 2e-3);
        ck_assert_double_eq_tol(w4[0] / full[0], 0.25, 2e-3);
        ck_assert_double_eq_tol(w2[0] / full[0], 0.5, 2e-3);
    }
}
END_TEST

START_TEST(mixed_precision_is_modelled)
{
    /* 2 + 2 + 12 bytes per parameter (bf16 weights and gradients, fp32
     * master weights and moments), activations at 2 bytes. */
    spb_config c;
    spb_config_defaults(&c);
    char err[256];
    ck_assert_int_eq(spb_config_finalize(&c, 1, err, sizeof err), 0);
    spb_memory_prediction f, b;
    spb_memory_model(&c, 1, SPB_FP32, &f);
    spb_memory_model(&c, 1, SPB_BF16_MIXED, &b);
    double params = f.bytes[SPB_MEM_PARAMS] / 4;
    ck_assert_double_eq(b.bytes[SPB_MEM_PARAMS] + b.bytes[SPB_MEM_GRADS] + b.bytes[SPB_MEM_OPTIMIZER], 16 * params);
    ck_assert_double_lt(b.bytes[SPB_MEM_ACTIVATIONS], 0.51 * f.bytes[SPB_MEM_ACTIVATIONS]);
    ck_assert_double_eq(spb_parse_bytes("80GiB"), 80.0 * 1073741824.0);
    ck_assert_double_eq(spb_parse_bytes("512MiB"), 512.0 * 1048576.0);
    ck_assert_double_eq(spb_parse_bytes("1e9"), 1e9);
    ck_assert_double_eq(spb_parse_bytes("12 parsecs"), -1);
}
END_TEST

/* --device cuda adds the workspaces the configuration fixes: RoPE's angle
 * table (fp32 cos and sin: tokens x head dim floats) and, for --attention
 * cudnn with G < H, the K/V copies of the largest attention call and their
 * fp32 gradients (common/cuda/cuda_attention_gqa.h; the GPU check measures
 * one call's against the device allocator: "expand-kv workspace").  Set on
 * a finalized CPU configuration: this build may have no cuDNN. */
START_TEST(device_workspaces_modelled)
{
    spb_config c;
    spb_config_defaults(&c);
    c.num_layers = 2, c.hidden_size = 64, c.num_heads = 8, c.vocab_size = 64, c.seq_length = 128;
    c.micro_batch_size = 2, c.sp_degree = 2, c.num_query_groups = 2, c.ffn_hidden_size = 96;
    snprintf(c.model, sizeof c.model, "llama");
    snprintf(c.strategy, sizeof c.strategy, "ulysses");
    snprintf(c.precision, sizeof c.precision, "bf16");
    char err[256];
    ck_assert_msg(spb_config_finalize(&c, 2, err, sizeof err) == 0, "%s", err);
    const double B = 2, N = 128, T = 64, H = 8, D = 8, P = 2;
    spb_memory_prediction cpu, cuda;
    spb_memory_model(&c, 2, SPB_BF16_MIXED, &cpu);
    snprintf(c.device, sizeof c.device, "cuda");
    snprintf(c.attention, sizeof c.attention, "flash");
    spb_memory_model(&c, 2, SPB_BF16_MIXED, &cuda);
    const double rope = 4 * T * D; /* the sequence layout's T tokens */
    ck_assert_double_eq(cuda.bytes[SPB_MEM_WORKSPACE] - cpu.bytes[SPB_MEM_WORKSPACE], rope);
    ck_assert_double_eq(cuda.total - cpu.total, rope);
    snprintf(c.attention, sizeof c.attention, "cudnn");
    snprintf(c.bf16_kernels, sizeof c.bf16_kernels, "fast"); /* bf16 copies */
    spb_memory_model(&c, 2, SPB_BF16_MIXED, &cuda);
    /* Ulysses: H/P heads of all N keys; 2 bf16 copies + 2 fp32 gradients */
    ck_assert_double_eq(cuda.bytes[SPB_MEM_WORKSPACE] - cpu.bytes[SPB_MEM_WORKSPACE],
                        rope + (2 * 2 + 8) * B * N * (H / P) * D);
    snprintf(c.bf16_kernels, sizeof c.bf16_kernels, "reference"); /* fp32 copies in the frames */
    spb_memory_model(&c, 2, SPB_BF16_MIXED, &cuda);
    ck_assert_double_eq(cuda.bytes[SPB_MEM_WORKSPACE] - cpu.bytes[SPB_MEM_WORKSPACE],
                        rope + (2 * 4 + 8) * B * N * (H / P) * D);
    snprintf(c.strategy, sizeof c.strategy, "ring"); /* H heads against a block of T keys */
    snprintf(c.device, sizeof c.device, "cpu");
    spb_memory_model(&c, 2, SPB_BF16_MIXED, &cpu);
    snprintf(c.device, sizeof c.device, "cuda");
    spb_memory_model(&c, 2, SPB_BF16_MIXED, &cuda);
    ck_assert_double_eq(cuda.bytes[SPB_MEM_WORKSPACE] - cpu.bytes[SPB_MEM_WORKSPACE],
                        rope + (2 * 4 + 8) * B * T * H * D);
    c.num_query_groups = 8; /* G = H: cuDNN on the call itself, no copies */
    spb_memory_model(&c, 2, SPB_BF16_MIXED, &cuda);
    snprintf(c.device, sizeof c.device, "cpu");
    spb_memory_model(&c, 2, SPB_BF16_MIXED, &cpu);
    ck_assert_double_eq(cuda.bytes[SPB_MEM_WORKSPACE] - cpu.bytes[SPB_MEM_WORKSPACE], rope);
    c.rope = 0; /* learned positions: no table */
    snprintf(c.device, sizeof c.device, "cuda");
    spb_memory_model(&c, 2, SPB_BF16_MIXED, &cuda);
    ck_assert_double_eq(cuda.bytes[SPB_MEM_WORKSPACE], cpu.bytes[SPB_MEM_WORKSPACE]);
}
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("memory_model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, model_equals_allocator);
    tcase_add_test(tc, new_strategies_modelled);
    tcase_add_test(tc, llama_model_equals_allocator);
    tcase_add_test(tc, scaling);
    tcase_add_test(tc, mixed_precision_is_modelled);
    tcase_add_test(tc, device_workspaces_modelled);
    suite_add_tcase(s, tc);
    return spb_run_suite_and_finalize(s);
}
