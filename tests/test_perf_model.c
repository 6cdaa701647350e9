/* The performance model (common/model/perf_model.c), under mpiexec -np 4.
 *
 * bytes_equal_measured: for every strategy (Ulysses with all-to-all and
 * with allgather, Megatron-SP, ring contiguous and zigzag, hybrid with U in
 * {1, 2, 4} dividing P, none), P in
 * {1, 2, 4} (D = 4/P), ZeRO stages 0-3, with and without activation
 * checkpointing, gradient accumulation 2: one real training iteration
 * through common/core/train.h on a tiny model, and the accounting layer's
 * records (spb_comm_record_get) for every operation and phase (forward,
 * backward, recompute, zero, grad_reduce) equal the model's calls, payload
 * and bytes per link — which the model takes from the strategies'
 * comm_volume and spb_zero_comm_items.
 *
 * The other tests hold the model's own arithmetic: the parts add up to the
 * iteration, ring's exposed transfer never exceeds the transfer, a group
 * across nodes is slower than one inside, the paper's FLOPs formula, and
 * every profile in the directory given as argv[1] loads. */
#define _DEFAULT_SOURCE
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "flops.h"
#include "grid.h"
#include "mpi_check.h"
#include "perf_model.h"
#include "strategy.h"
#include "train.h"

static const char *profiles_dir = "profiles";

typedef struct variant {
    const char *strategy, *ring_layout, *ulysses_comm;
    int ulysses_degree; /* hybrid: U */
} variant;

static const variant variants[] = {
    {"none", "contiguous", "alltoall", 0},    {"ulysses", "contiguous", "alltoall", 0},
    {"ulysses", "contiguous", "allgather", 0}, {"megatron", "contiguous", "alltoall", 0},
    {"ring", "contiguous", "alltoall", 0},    {"ring", "zigzag", "alltoall", 0},
    {"hybrid", "zigzag", "alltoall", 1},   {"hybrid", "zigzag", "alltoall", 2},
    {"hybrid", "contiguous", "allgather", 2}, {"hybrid", "contiguous", "alltoall", 4},
};
enum { NUM_VARIANTS = sizeof variants / sizeof variants[0], WORLD = 4 };
static const int degrees[] = {1, 2, 4};

/* G > 0: the Llama preset with G K/V heads (FFN 96); 0: GPT. */
static int make_model_config(spb_config *c, const variant *v, int P, int zero, int ckpt, int G)
{
    spb_config_defaults(c);
    c->num_layers = 2, c->hidden_size = 32, c->num_heads = 4, c->vocab_size = 64, c->seq_length = 48;
    c->sp_degree = P, c->zero_stage = zero, c->checkpoint_activations = ckpt;
    c->micro_batch_size = 1, c->global_batch_size = 2 * (WORLD / P); /* accumulation 2 */
    snprintf(c->strategy, sizeof c->strategy, "%s", v->strategy);
    snprintf(c->ring_layout, sizeof c->ring_layout, "%s", v->ring_layout);
    snprintf(c->ulysses_comm, sizeof c->ulysses_comm, "%s", v->ulysses_comm);
    c->ulysses_degree = v->ulysses_degree;
    if (G > 0) {
        snprintf(c->model, sizeof c->model, "llama");
        c->num_query_groups = G, c->ffn_hidden_size = 96;
    }
    char err[512];
    return spb_config_finalize(c, WORLD, err, sizeof err);
}


static int close_enough(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(a) + fabs(b)) + 1e-9; }

/* The model's collectives, call by call, equal the recorded ones (G > 0:
 * the Llama preset with G K/V heads). */
static void check_bytes(int _i, int G)
{
    const variant *v = &variants[_i % NUM_VARIANTS];
    const int P = degrees[(_i / NUM_VARIANTS) % 3], zero = (_i / NUM_VARIANTS / 3) % 4,
              ckpt = _i / NUM_VARIANTS / 12;
    spb_config c;
    if ((!strcmp(v->strategy, "none")) != (P == 1) || P % (v->ulysses_degree > 0 ? v->ulysses_degree : 1) ||
        make_model_config(&c, v, P, zero, ckpt, G))
        return;
    spb_grid grid;
    if (v->ulysses_degree > 0) spb_grid_create_nested(&grid, MPI_COMM_WORLD, P, v->ulysses_degree);
    else spb_grid_create(&grid, MPI_COMM_WORLD, P);
    spb_trainer *t = spb_trainer_create(&c, &grid);
    spb_trainer_step(t); /* warm-up iteration, then one recorded */
    spb_comm_reset();
    spb_trainer_step(t);
    spb_comm_plan plan;
    ck_assert_int_eq(spb_perf_comm_plan(&c, WORLD, 4.0, 4.0, &plan), 0);
    int checked = 0;
    for (int op = 0; op < SPB_NUM_OPS; op++)
        for (int ph = SPB_PHASE_FORWARD; ph <= SPB_PHASE_GRAD_REDUCE; ph++) {
            const spb_comm_record *r = spb_comm_record_get((spb_comm_op)op, (spb_comm_phase)ph);
            /* ranks agree on bytes; check on every rank */
            if (!close_enough(r->link_bytes, plan.link[op][ph]) || !close_enough(r->payload_bytes, plan.payload[op][ph]) ||
                !close_enough((double)r->calls, plan.calls[op][ph]))
                ck_abort_msg("%s %s U=%d P=%d ZeRO %d ckpt %d: %s/%s measured calls %ld payload %.0f link %.0f, model "
                             "calls %.0f payload %.0f link %.0f",
                             v->strategy, !strcmp(v->strategy, "ring") ? v->ring_layout : v->ulysses_comm,
                             v->ulysses_degree, P, zero, ckpt, spb_comm_op_name((spb_comm_op)op), spb_comm_phase_name((spb_comm_phase)ph),
                             r->calls, r->payload_bytes, r->link_bytes, plan.calls[op][ph], plan.payload[op][ph],
                             plan.link[op][ph]);
            checked += r->calls > 0;
        }
    if (P > 1 || zero > 0) ck_assert_int_gt(checked, 0);
    say("  bytes %-8s %-10s U=%d P=%d ZeRO %d ckpt %d %s G=%d: %d (op, phase) slots equal\n", v->strategy,
        !strcmp(v->strategy, "ring") ? v->ring_layout : v->ulysses_comm, v->ulysses_degree, P, zero, ckpt,
        G ? "llama" : "gpt", G ? G : c.num_heads, checked);
    spb_trainer_destroy(t);
    spb_grid_destroy(&grid);
}

START_TEST(bytes_equal_measured) { check_bytes(_i, 0); }
END_TEST

/* The Llama preset with one K/V head (Ulysses replicates it) and with two,
 * without checkpointing. */
START_TEST(llama_bytes_equal_measured) { check_bytes(_i % (NUM_VARIANTS * 12), _i < NUM_VARIANTS * 12 ? 1 : 2); }
END_TEST

static void load(const char *name, spb_profile *p)
{
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s", profiles_dir, name);
    if (spb_profile_load(path, p, err, sizeof err)) ck_abort_msg("%s", err);
}

static void seven_b(spb_config *c, const char *strategy, int P, int N, int world)
{
    spb_config_defaults(c);
    c->num_layers = 32, c->hidden_size = 4096, c->num_heads = 32, c->vocab_size = 50257, c->seq_length = N;
    c->sp_degree = P, c->micro_batch_size = 1, c->checkpoint_activations = 1, c->zero_stage = 3;
    snprintf(c->strategy, sizeof c->strategy, "%s", strategy);
    char err[512];
    ck_assert_msg(spb_config_finalize(c, world, err, sizeof err) == 0, "%s", err);
}

START_TEST(parts_add_up_and_topology)
{
    spb_profile *p = malloc(sizeof *p);
    load("A100-80GB-DGX.profile", p);
    const char *strategies[] = {"ulysses", "megatron", "ring"};
    for (int s = 0; s < 3; s++) {
        spb_config c;
        seven_b(&c, strategies[s], 8, 65536, 32);
        spb_perf_prediction pr;
        char err[512];
        ck_assert_int_eq(spb_perf_predict(&c, 32, p, NULL, &pr, err, sizeof err), 0);
        double sum = pr.t_gemm + pr.t_attn + pr.t_other + pr.t_adam + pr.comm_exposed_total + pr.t_launch +
                     pr.t_bubble + pr.t_p2p;
        ck_assert_msg(fabs(sum - pr.iter_time) <= 1e-9 * pr.iter_time, "%s: parts %.6g vs iteration %.6g",
                      strategies[s], sum, pr.iter_time);
        ck_assert_msg(fabs(pr.tflops_paper_per_rank * 1e12 * pr.iter_time * 32 -
                           spb_paper_flops_per_iteration(&c, 1)) <= 1e-6 * spb_paper_flops_per_iteration(&c, 1),
                      "paper formula");
        ck_assert(pr.tflops_paper_per_rank > 0 && pr.tflops_paper_per_rank < 312);
        for (int o = 0; o < SPB_NUM_OPS; o++)
            for (int ph = 0; ph < SPB_NUM_PHASES; ph++) ck_assert(pr.comm_overlapped[o][ph] >= 0);
    }
    /* Ulysses: same bytes per link at P = 8 (one node) and P = 16 (two
     * nodes) with N/P fixed, but the all-to-all across nodes is slower. */
    spb_config in, across;
    seven_b(&in, "ulysses", 8, 65536, 32);
    seven_b(&across, "ulysses", 16, 131072, 32);
    spb_perf_prediction a, b;
    char err[512];
    spb_perf_predict(&in, 32, p, NULL, &a, err, sizeof err);
    spb_perf_predict(&across, 32, p, NULL, &b, err, sizeof err);
    double la = a.plan.link[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD], lb = b.plan.link[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD];
    ck_assert_msg(fabs(lb / la - (15.0 / 16) / (7.0 / 8)) < 1e-9, "link bytes ratio %.6f", lb / la);
    ck_assert_msg(b.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD] > 3 * a.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD],
                  "all-to-all across nodes %.4g s vs inside %.4g s",
                  b.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD], a.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD]);
    /* ring: exposed transfer <= transfer; long blocks hide it entirely */
    spb_config r;
    seven_b(&r, "ring", 8, 262144, 32);
    spb_perf_prediction rp;
    spb_perf_predict(&r, 32, p, NULL, &rp, err, sizeof err);
    ck_assert(rp.comm_overlapped[SPB_OP_SENDRECV][SPB_PHASE_FORWARD] > 0);
    say("  A100-80GB 7B: Ulysses a2a fwd P=8 %.4g s, P=16 %.4g s; ring N=256K fwd exposed %.4g s, hidden %.4g s\n",
        a.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD], b.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD],
        rp.comm_exposed[SPB_OP_SENDRECV][SPB_PHASE_FORWARD], rp.comm_overlapped[SPB_OP_SENDRECV][SPB_PHASE_FORWARD]);
    free(p);
}
END_TEST

/* The tile model of a GPU's attention (perf_model.h), by cases worked by
 * hand, and how it carries measured rates to other head counts and
 * shorter calls. */
START_TEST(attention_tile_model)
{
    spb_profile *p = calloc(1, sizeof *p);
    p->sms = 132, p->attn_tile_rows = 128, p->attn_blocks_per_sm = 1, p->attn_half_len = 1024;
    /* 4 heads x 32 causal tiles = 128 tiles for 132 slots: the longest
     * (4096 keys) sets the time, the mean is 528/32 x 128 keys: 0.5 */
    ck_assert_double_eq_tol(spb_perf_attn_occupancy(p, 4, 4096, 1), 0.5, 1e-12);
    /* full mask, equal tiles: 33 heads x 8 = 264 = 2 whole waves; 34 heads: 272 tiles in 3 waves */
    ck_assert_double_eq_tol(spb_perf_attn_occupancy(p, 33, 1024, 0), 1.0, 1e-12);
    ck_assert_double_eq_tol(spb_perf_attn_occupancy(p, 34, 1024, 0), 272.0 / (3 * 132), 1e-12);
    /* many tiles: the slots stay full */
    ck_assert(spb_perf_attn_occupancy(p, 32, 32768, 1) > 0.999);
    /* longest first by hand, 1-row tiles of 4 keys causal (work 4, 3, 2, 1):
     * 2 slots {4+1, 3+2}: 10/(2 x 5) = 1; 3 slots {4, 3, 2+1}: 10/(3 x 4) */
    p->attn_tile_rows = 1, p->sms = 2;
    ck_assert_double_eq_tol(spb_perf_attn_occupancy(p, 1, 4, 1), 1.0, 1e-12);
    p->sms = 3;
    ck_assert_double_eq_tol(spb_perf_attn_occupancy(p, 1, 4, 1), 10.0 / 12, 1e-12);
    /* blocks per SM are slots too */
    p->sms = 1, p->attn_blocks_per_sm = 3;
    ck_assert_double_eq_tol(spb_perf_attn_occupancy(p, 1, 4, 1), 10.0 / 12, 1e-12);
    p->sms = 132, p->attn_tile_rows = 128, p->attn_blocks_per_sm = 1;

    /* measured points at 32 heads, 4K and 8K causal: a call of a measured
     * shape takes its rate; 4 heads take it times the tile model's ratio;
     * 2K tokens the 4K rate down the ramp (2048/3072 over 4096/5120) */
    p->n_attn = 2;
    p->attn[0] = (spb_attn_point){"flash", 1, 4096, 128, 32, 1.5e14, 1.1e14};
    p->attn[1] = (spb_attn_point){"flash", 1, 8192, 128, 32, 1.7e14, 1.3e14};
    const double occ32 = spb_perf_attn_occupancy(p, 32, 4096, 1), occ4 = spb_perf_attn_occupancy(p, 4, 4096, 1);
    ck_assert_double_eq_tol(spb_perf_attn_rate(p, "flash", 1, 4096, 128, 32, 0), 1.5e14, 1e3);
    ck_assert_double_eq_tol(spb_perf_attn_rate(p, "flash", 1, 8192, 128, 32, 1), 1.3e14, 1e3);
    ck_assert_double_eq_tol(spb_perf_attn_rate(p, "flash", 1, 4096, 128, 4, 0), 1.5e14 * occ4 / occ32, 1e3);
    ck_assert_double_eq_tol(spb_perf_attn_rate(p, "flash", 1, 2048, 128, 32, 0),
                            1.5e14 / occ32 * spb_perf_attn_occupancy(p, 32, 2048, 1) * (2048.0 / 3072) /
                                (4096.0 / 5120),
                            1e3);
    /* a point measured at 4 heads is priced by itself, not by the tile model */
    p->n_attn = 3;
    p->attn[2] = (spb_attn_point){"flash", 1, 4096, 128, 4, 0.6e14, 0.4e14};
    ck_assert_double_eq_tol(spb_perf_attn_rate(p, "flash", 1, 4096, 128, 4, 0), 0.6e14, 1e3);
    ck_assert_double_eq_tol(spb_perf_attn_rate(p, "flash", 1, 4096, 128, 32, 0), 1.5e14, 1e3);
    /* no SM count (a CPU profile): no tile model, no ramp below the shortest */
    p->sms = 0;
    ck_assert_double_eq(spb_perf_attn_occupancy(p, 1, 4096, 1), 1.0);
    ck_assert_double_eq_tol(spb_perf_attn_rate(p, "flash", 1, 4096, 128, 32, 0), 1.5e14, 1e3);
    ck_assert(spb_perf_attn_rate(p, "flash", 1, 2048, 128, 32, 0) > 1.4e14);
    say("  tile model: 4 heads x 4K causal %.3f of the GPU, 32 heads %.4f\n", occ4, occ32);
    free(p);
}
END_TEST

START_TEST(every_profile_loads)
{
    DIR *d = opendir(profiles_dir);
    ck_assert_msg(d != NULL, "no directory %s", profiles_dir);
    struct dirent *e;
    int n = 0;
    spb_profile *p = malloc(sizeof *p);
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 9 || strcmp(e->d_name + len - 8, ".profile")) continue;
        load(e->d_name, p);
        n++;
    }
    closedir(d);
    free(p);
    ck_assert_int_ge(n, 4);
}
END_TEST


/* ---- the terms of published layouts and software (docs/MODEL.md), each on a
 * case computed by hand */

/* A small GPT on one A100 profile: strategy, P, world, layers, sequence. */
static void small(spb_config *c, const char *strategy, int P, int world, int L, int N)
{
    spb_config_defaults(c);
    c->num_layers = L, c->hidden_size = 1024, c->num_heads = 8, c->vocab_size = 1000, c->seq_length = N;
    c->max_position_embeddings = N, c->sp_degree = P, c->micro_batch_size = 1, c->global_batch_size = world / P;
    snprintf(c->strategy, sizeof c->strategy, "%s", strategy);
    char err[512];
    ck_assert_msg(spb_config_finalize(c, world, err, sizeof err) == 0, "%s", err);
}

static spb_perf_prediction predict_with(const spb_config *c, int world, const spb_profile *p, spb_perf_options o)
{
    spb_perf_prediction pr;
    char err[512];
    ck_assert_msg(spb_perf_predict(c, world, p, &o, &pr, err, sizeof err) == 0, "%s", err);
    return pr;
}

#define CLOSE(a, b) ck_assert_msg(fabs((a) - (b)) <= 1e-9 * fabs(b) + 1e-15, "%s = %.12g, expected %.12g", #a, (double)(a), (double)(b))

START_TEST(pipeline_terms_by_hand)
{
    double bubble, p2p;
    /* 8 stages, 64 micro-steps of 0.2 s, 1 ms transfers: bubble 7 x 0.2; transfers (2 x 64 + 2 x 7) x 1 ms */
    spb_perf_pipeline_terms(8, 1, 64, 0.2, 1e-3, &bubble, &p2p);
    CLOSE(bubble, 1.4);
    CLOSE(p2p, 0.142);
    /* interleaved, 2 virtual stages: half the bubble, twice the steady-state transfers */
    spb_perf_pipeline_terms(8, 2, 64, 0.2, 1e-3, &bubble, &p2p);
    CLOSE(bubble, 0.7);
    CLOSE(p2p, 0.270);
    spb_perf_pipeline_terms(1, 1, 64, 0.2, 1e-3, &bubble, &p2p);
    ck_assert(bubble == 0 && p2p == 0);

    /* through the model: a 2-stage pipeline adds (pp - 1) x one micro-step's forward + backward */
    spb_profile *p = malloc(sizeof *p);
    load("A100-80GB-DGX.profile", p);
    spb_config c;
    small(&c, "none", 1, 1, 2, 1024);
    c.global_batch_size = 4;
    spb_perf_options o = {.precision = SPB_BF16_MIXED, .attn_density = 1, .pp = 2, .vpp = 1};
    spb_perf_prediction pr = predict_with(&c, 1, p, o);
    double accum = 4;
    CLOSE(pr.t_bubble, (pr.t_forward + pr.t_backward) / accum);
    double msg = 1024.0 * 1024 * 2; /* B N C x 2 bytes, one rank per stage: inside the node */
    CLOSE(pr.t_p2p, (2 * accum + 2) * (p->intra_alpha + msg / p->intra_bw));
    CLOSE(pr.iter_time, pr.t_forward + pr.t_backward + pr.t_grad_reduce + pr.t_optimizer + pr.t_bubble + pr.t_p2p);
    free(p);
}
END_TEST

START_TEST(unfused_attention_by_hand)
{
    /* bytes per score element: fused softmax 4 / 6, eager fallback 36 / 40, PyTorch 10 / 6, dropout + 5 */
    ck_assert(spb_perf_unfused_score_bytes(0, 0, SPB_SCORES_MEGATRON_FUSED) == 4);
    ck_assert(spb_perf_unfused_score_bytes(1, 0, SPB_SCORES_MEGATRON_FUSED) == 6);
    ck_assert(spb_perf_unfused_score_bytes(0, 1, SPB_SCORES_MEGATRON_FUSED) == 9);
    ck_assert(spb_perf_unfused_score_bytes(0, 0, SPB_SCORES_MEGATRON_EAGER) == 36);
    ck_assert(spb_perf_unfused_score_bytes(1, 1, SPB_SCORES_MEGATRON_EAGER) == 45);
    ck_assert(spb_perf_unfused_score_bytes(0, 0, SPB_SCORES_TORCH) == 10);
    ck_assert(spb_perf_unfused_score_bytes(1, 0, SPB_SCORES_TORCH) == 6);

    spb_profile *p = malloc(sizeof *p);
    load("A100-80GB-DGX.profile", p);
    spb_config c;
    small(&c, "none", 1, 1, 2, 1024);
    spb_perf_options o = {.precision = SPB_BF16_MIXED, .attn_density = 1};
    snprintf(o.backend, sizeof o.backend, "unfused");
    spb_perf_prediction pr = predict_with(&c, 1, p, o);
    /* 2 layers x 8 heads x 1024^2 scores x (4 + 6) bytes / mem_bw (1024 <= softmax_fused_max_len) */
    const double scores = 2.0 * 8 * 1024 * 1024;
    CLOSE(pr.t_softmax, scores * 10 / p->mem_bw);
    /* the products: full 1024 x 1024 scores, head dim 128: 6 products of 2 x 1024 x 1024 x 128 per head */
    CLOSE(pr.attn_flops, 2.0 * 8 * 6 * 2 * 1024.0 * 1024 * 128);
    double gem = 0;
    for (int k = 0; k < 2; k++) /* forward: S = Q K^T, O = P V */
        gem += 2.0 * 1024 * 1024 * 128 / spb_perf_gemm_rate(p, 1024, k ? 1024 : 128, k ? 128 : 1024, 0);
    gem += 2.0 * 1024 * 1024 * 128 / spb_perf_gemm_rate(p, 1024, 1024, 128, 2);
    gem += 2.0 * 1024 * 1024 * 128 / spb_perf_gemm_rate(p, 1024, 128, 1024, 1);
    gem += 2.0 * 1024 * 1024 * 128 / spb_perf_gemm_rate(p, 1024, 1024, 128, 1);
    gem += 2.0 * 1024 * 1024 * 128 / spb_perf_gemm_rate(p, 1024, 1024, 128, 2);
    CLOSE(pr.t_attn, 2.0 * 8 * gem + pr.t_softmax);
    /* beyond the fused kernel's keys: the eager path, 36 + 40 bytes */
    p->softmax_fused_max_len = 512;
    pr = predict_with(&c, 1, p, o);
    CLOSE(pr.t_softmax, scores * 76 / p->mem_bw);
    /* the software profiles: FlashAttention 1 at its own published rate */
    p->softmax_fused_max_len = 4096;
    snprintf(o.backend, sizeof o.backend, "fa1");
    ck_assert(spb_perf_attn_rate(p, "fa1", 1, 1024, 128, 8, 0) < spb_perf_attn_rate(p, "fa2", 1, 1024, 128, 8, 0));
    CLOSE(spb_perf_attn_rate(p, "fa1", 1, 1e9, 128, 1e6, 0) / spb_perf_attn_rate(p, "fa2", 1, 1e9, 128, 1e6, 0),
          0.35 / 0.65);
    free(p);
}
END_TEST

START_TEST(layout_terms_by_hand)
{
    spb_profile *p = malloc(sizeof *p);
    load("A100-80GB-DGX.profile", p);
    const double bw = p->mem_bw;
    spb_config c;
    /* tensor parallelism without sequence parallelism: LayerNorm (4 + 8 bytes) and residual adds
     * (6 + 6 bytes), 2 and 4 a layer, on all N rows instead of N/8 */
    small(&c, "megatron", 8, 8, 2, 2048);
    spb_perf_options o = {.precision = SPB_BF16_MIXED, .attn_density = 1};
    spb_perf_prediction sp = predict_with(&c, 8, p, o);
    o.tp_no_sp = 1;
    spb_perf_prediction nosp = predict_with(&c, 8, p, o);
    CLOSE(nosp.t_other - sp.t_other, 2 * (2048 - 256) * 1024.0 * (2 * 4 + 2 * 8 + 4 * 6 + 4 * 6) / bw);
    /* hidden dropout: 2 a layer, 5 bytes an element, each way */
    o.tp_no_sp = 0, o.dropout = 1;
    spb_perf_prediction drop = predict_with(&c, 8, p, o);
    CLOSE(drop.t_other - sp.t_other, 2 * 2 * 2 * 256 * 1024.0 * 5 / bw);
    /* fused kernels: no bias copies (3C/8 + F/8 per row, 4 bytes) and no region copies (4 + 6 rows of C) */
    o.dropout = 0, o.fused = 1;
    spb_perf_prediction fused = predict_with(&c, 8, p, o);
    CLOSE(sp.t_other - fused.t_other, 2 * 2048 * (3 * 128 + 512 + 10 * 1024.0) * 4 / bw);
    /* selective recomputation: the forward attention once more per layer */
    o.fused = 0, o.selective_recompute = 1;
    spb_perf_prediction sel = predict_with(&c, 8, p, o);
    CLOSE(sel.t_attn - sp.t_attn, sel.t_recompute);
    CLOSE(sel.t_gemm, sp.t_gemm);
    ck_assert(sel.t_recompute > 0);
    /* kernel gaps: 12 kernels a layer forward, 24 backward, head 4 + 8, one micro-step */
    o.selective_recompute = 0;
    spb_perf_prediction gaps = predict_with(&c, 8, p, o);
    CLOSE(gaps.t_launch, p->kernel_gap * (2 * (12 + 24) + 12));
    o.ablate = SPB_TERM_LAUNCH;
    spb_perf_prediction nogap = predict_with(&c, 8, p, o);
    CLOSE(gaps.iter_time - nogap.iter_time, gaps.t_launch);
    /* overlapped data-parallel traffic: what exceeds the compute, at least one layer's share */
    small(&c, "none", 1, 16, 2, 1024);
    c.zero_stage = 3;
    char err[512];
    ck_assert(spb_config_finalize(&c, 16, err, sizeof err) == 0);
    o.ablate = 0;
    spb_perf_prediction exp = predict_with(&c, 16, p, o);
    o.overlap_dp = 1;
    spb_perf_prediction ovl = predict_with(&c, 16, p, o);
    double dp = exp.t_grad_reduce + exp.comm_exposed[SPB_OP_ALLGATHER][SPB_PHASE_ZERO] +
                exp.comm_exposed[SPB_OP_REDUCE_SCATTER][SPB_PHASE_ZERO] - exp.comm_exposed[SPB_OP_REDUCE_SCATTER][SPB_PHASE_ZERO];
    (void)dp;
    double dp_all = 0;
    for (int op = 0; op < SPB_NUM_OPS; op++)
        dp_all += exp.comm_exposed[op][SPB_PHASE_ZERO] + exp.comm_exposed[op][SPB_PHASE_GRAD_REDUCE];
    double busy = exp.t_forward + exp.t_backward;
    CLOSE(ovl.dp_comm_hidden, dp_all - fmax(dp_all / 2, dp_all - busy));
    CLOSE(exp.iter_time - ovl.iter_time, ovl.dp_comm_hidden);
    double parts = ovl.t_gemm + ovl.t_attn + ovl.t_other + ovl.t_adam + ovl.comm_exposed_total + ovl.t_launch;
    CLOSE(parts, ovl.iter_time);
    double per_op = 0;
    for (int op = 0; op < SPB_NUM_OPS; op++)
        for (int ph = 0; ph < SPB_NUM_PHASES; ph++) per_op += ovl.comm_exposed[op][ph];
    CLOSE(per_op, ovl.comm_exposed_total);

    /* the band: the profile's slow and fast ends (A100-80GB-DGX: GEMM 0.70 / 0.85, attention x 0.80 / 1.12,
     * HBM x 0.90 / 1.10, NVSwitch 200 / 260 GB/s, InfiniBand 18 / 24 GB/s, kernel gaps 4 / 1 us) */
    spb_profile *slow = malloc(sizeof *slow), *fast = malloc(sizeof *fast);
    ck_assert(spb_profile_band(p, 0, slow) == 0 && spb_profile_band(p, 1, fast) == 0);
    CLOSE(slow->gemm_eff, 0.70);
    CLOSE(fast->gemm_eff, 0.85);
    CLOSE(slow->attn_fwd_eff, 0.65 * 0.80);
    CLOSE(fast->attn_bwd_eff, 0.50 * 1.12);
    CLOSE(slow->mem_bw, p->mem_bw * 0.90);
    CLOSE(fast->inter_bw, 24e9);
    CLOSE(slow->kernel_gap, 4e-6);
    small(&c, "megatron", 8, 8, 2, 2048);
    o = (spb_perf_options){.precision = SPB_BF16_MIXED, .attn_density = 1};
    double ts = predict_with(&c, 8, slow, o).iter_time, tn = predict_with(&c, 8, p, o).iter_time,
           tf = predict_with(&c, 8, fast, o).iter_time;
    ck_assert_msg(ts > tn && tn > tf, "band %.6g > %.6g > %.6g", ts, tn, tf);
    spb_profile_load("/dev/null", slow, err, sizeof err); /* a profile without bands has no band */
    ck_assert(spb_profile_band(slow, 0, fast) == -1);
    free(slow), free(fast);
    free(p);
}
END_TEST

/* The 7B shape as a hybrid of P = U x R ranks (world = P, 8 GPUs a node). */
static void seven_b_hybrid(spb_config *c, int P, int U, int N, const char *layout)
{
    spb_config_defaults(c);
    c->num_layers = 32, c->hidden_size = 4096, c->num_heads = 32, c->vocab_size = 50257, c->seq_length = N;
    c->sp_degree = P, c->micro_batch_size = 1, c->checkpoint_activations = 1, c->zero_stage = 3;
    c->ulysses_degree = U;
    snprintf(c->strategy, sizeof c->strategy, "hybrid");
    snprintf(c->ring_layout, sizeof c->ring_layout, "%s", layout);
    char err[512];
    ck_assert_msg(spb_config_finalize(c, P, err, sizeof err) == 0, "%s", err);
}

static void same_prediction(const spb_perf_prediction *a, const spb_perf_prediction *b, const char *what, int exact)
{
    ck_assert_msg(fabs(a->iter_time - b->iter_time) <= 1e-12 * b->iter_time, "%s: iteration %.12g vs %.12g", what,
                  a->iter_time, b->iter_time);
    if (exact) ck_assert_msg(a->mem.total == b->mem.total, "%s: memory", what);
    for (int op = 0; op < SPB_NUM_OPS; op++)
        for (int ph = 0; ph < SPB_NUM_PHASES; ph++)
            ck_assert_msg(fabs(a->comm_exposed[op][ph] - b->comm_exposed[op][ph]) <= 1e-12 * a->iter_time &&
                              fabs(a->comm_overlapped[op][ph] - b->comm_overlapped[op][ph]) <= 1e-12 * a->iter_time &&
                              close_enough(a->plan.link[op][ph], b->plan.link[op][ph]) &&
                              (!exact || a->plan.calls[op][ph] == b->plan.calls[op][ph]),
                          "%s: %s/%s differs", what, spb_comm_op_name((spb_comm_op)op),
                          spb_comm_phase_name((spb_comm_phase)ph));
}

/* The hybrid's ends are Ulysses (U = P) and ring (U = 1; memory aside), and its two
 * groups are priced by where they run, by hand: on 8-GPU nodes,
 * A100-80GB-DGX (NVSwitch 240 GB/s + 10 us, InfiniBand 22.5 GB/s + 25 us),
 * bf16 (2 bytes), 7B (h = 4096, 32 layers, checkpointing: forward and
 * recompute move the same), b = 1. */
START_TEST(hybrid_groups_by_hand)
{
    spb_profile *p = malloc(sizeof *p);
    load("A100-80GB-DGX.profile", p);
    char err[512];
    spb_config c, ref;
    spb_perf_prediction h, r;
    /* U = P = 8: Ulysses' prediction; U = 1: ring's, both layouts */
    seven_b_hybrid(&c, 8, 8, 65536, "contiguous");
    seven_b(&ref, "ulysses", 8, 65536, 8);
    ck_assert_int_eq(spb_perf_predict(&c, 8, p, NULL, &h, err, sizeof err), 0);
    ck_assert_int_eq(spb_perf_predict(&ref, 8, p, NULL, &r, err, sizeof err), 0);
    same_prediction(&h, &r, "hybrid U = P = 8 vs ulysses", 1);
    const char *layouts[] = {"contiguous", "zigzag"};
    for (int k = 0; k < 2; k++) {
        seven_b_hybrid(&c, 16, 1, 262144, layouts[k]);
        ref = c;
        snprintf(ref.strategy, sizeof ref.strategy, "ring");
        ref.ulysses_degree = 0;
        ck_assert_int_eq(spb_perf_predict(&c, 16, p, NULL, &h, err, sizeof err), 0);
        ck_assert_int_eq(spb_perf_predict(&ref, 16, p, NULL, &r, err, sizeof err), 0);
        /* time and bytes; not memory nor calls: the hybrid keeps the exchange's
         * head-side copies and its all-to-alls even over one rank (no bytes, no
         * time; strategies/hybrid.c) */
        same_prediction(&h, &r, layouts[k], 0);
        if (k == 0)
            say("  hybrid U = 1 vs ring, 7B P=16 N=256K: memory %.3f vs %.3f GiB per rank\n", h.mem.total / 1073741824.0,
                r.mem.total / 1073741824.0);
    }

    /* P = 16 = U 8 x R 2, N = 256K: T = 16384 tokens a rank.  The all-to-all
     * stays in the node: 2 calls a layer forward, QKV (3 T h) and O (T h)
     * elements of 2 bytes, 7/8 of each on the links, at 10 us + bytes / 240
     * GB/s.  The ring's 2 ranks are 8 apart, on two nodes: 1 hop forward of
     * K and V (2 T h x 2 bytes) at 25 us + bytes / 22.5 GB/s, hidden or not. */
    const double T = 16384, hdim = 4096, L = 32;
    seven_b_hybrid(&c, 16, 8, 262144, "zigzag");
    ck_assert_int_eq(spb_perf_predict(&c, 16, p, NULL, &h, err, sizeof err), 0);
    const double qkv = 3 * T * hdim * 2 * 7 / 8, o = T * hdim * 2 * 7 / 8;
    CLOSE(h.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD], L * (2 * 10e-6 + (qkv + o) / 240e9));
    CLOSE(h.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_RECOMPUTE], L * (2 * 10e-6 + (qkv + o) / 240e9));
    ck_assert_int_eq(h.plan.group[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD], 8);
    ck_assert_int_eq(h.plan.group[SPB_OP_SENDRECV][SPB_PHASE_FORWARD], 2);
    ck_assert(h.plan.strided[SPB_OP_SENDRECV][SPB_PHASE_FORWARD]);
    const double block = 2 * T * hdim * 2;
    CLOSE(h.plan.link[SPB_OP_SENDRECV][SPB_PHASE_FORWARD], L * block);
    CLOSE(h.comm_exposed[SPB_OP_SENDRECV][SPB_PHASE_FORWARD] + h.comm_overlapped[SPB_OP_SENDRECV][SPB_PHASE_FORWARD],
          L * (25e-6 + block / 22.5e9));
    /* backward, R = 2: K/V out, dK/dV back, the home run: 3 hops across nodes */
    CLOSE(h.comm_exposed[SPB_OP_SENDRECV][SPB_PHASE_BACKWARD] + h.comm_overlapped[SPB_OP_SENDRECV][SPB_PHASE_BACKWARD],
          L * 3 * (25e-6 + block / 22.5e9));
    say("  hybrid 7B P=16 U=8 N=256K: a2a fwd %.4g s (NVSwitch); ring fwd %.4g s exposed, %.4g s hidden (InfiniBand)\n",
        h.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD], h.comm_exposed[SPB_OP_SENDRECV][SPB_PHASE_FORWARD],
        h.comm_overlapped[SPB_OP_SENDRECV][SPB_PHASE_FORWARD]);

    /* P = 8 = U 2 x R 4 on one node: the ring inside it too, at NVSwitch rates (N = 64K: T = 8192) */
    seven_b_hybrid(&c, 8, 2, 65536, "contiguous");
    ck_assert_int_eq(spb_perf_predict(&c, 8, p, NULL, &h, err, sizeof err), 0);
    const double b8 = 2 * 8192 * hdim * 2;
    CLOSE(h.comm_exposed[SPB_OP_SENDRECV][SPB_PHASE_FORWARD] + h.comm_overlapped[SPB_OP_SENDRECV][SPB_PHASE_FORWARD],
          L * 3 * (10e-6 + b8 / 240e9));
    CLOSE(h.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD], L * (2 * 10e-6 + 4 * 8192 * hdim * 2 / 2 / 240e9));

    /* P = 32 = U 16 x R 2: the all-to-all spans two nodes: each rank's payload,
     * 8/16 of it off the node through its NIC while 7/16 stays on NVSwitch
     * (N = 256K: T = 8192) */
    seven_b_hybrid(&c, 32, 16, 262144, "zigzag");
    ck_assert_int_eq(spb_perf_predict(&c, 32, p, NULL, &h, err, sizeof err), 0);
    const double pay = 4 * 8192 * hdim * 2;
    CLOSE(h.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD],
          L * (2 * 25e-6 + fmax(pay * 8 / 16 / 22.5e9, pay * 7 / 16 / 240e9)));
    free(p);
}
END_TEST

/* allgather-kv's attention, by hand: each rank's query runs (ring's layout)
 * against the keys they can see, priced for the slowest rank.  Causal, 7B,
 * P = 8, N = 64K, T = N/P: zigzag gives every rank N(N+1)/(2P) pairs a head,
 * as zigzag ring does; contiguous leaves the last rank T(N-T) + T(T+1)/2.
 * (The model once priced all N x N pairs on every rank: P times too many.) */
START_TEST(allgather_kv_attention_by_hand)
{
    spb_profile *p = malloc(sizeof *p);
    load("A100-80GB-DGX.profile", p);
    char err[512];
    const int P = 8, N = 65536;
    const double T = N / P;
    spb_config c;
    spb_perf_prediction zz, ring_zz, contig;
    seven_b(&c, "allgather-kv", P, N, P);
    ck_assert(c.causal);
    snprintf(c.ring_layout, sizeof c.ring_layout, "zigzag");
    ck_assert_int_eq(spb_perf_predict(&c, P, p, NULL, &zz, err, sizeof err), 0);
    snprintf(c.strategy, sizeof c.strategy, "ring");
    ck_assert_int_eq(spb_perf_predict(&c, P, p, NULL, &ring_zz, err, sizeof err), 0);
    CLOSE(zz.attn_flops, ring_zz.attn_flops);
    snprintf(c.strategy, sizeof c.strategy, "allgather-kv");
    snprintf(c.ring_layout, sizeof c.ring_layout, "contiguous");
    ck_assert_int_eq(spb_perf_predict(&c, P, p, NULL, &contig, err, sizeof err), 0);
    const double balanced = (double)N * (N + 1) / (2.0 * P), last = T * (N - T) + T * (T + 1) / 2;
    CLOSE(contig.attn_flops / zz.attn_flops, last / balanced);
    say("  allgather-kv 7B P=8 N=64K causal: attention %.4g s zigzag, %.4g s contiguous (ring zigzag %.4g s)\n",
        zz.t_attn, contig.t_attn, ring_zz.t_attn);
    free(p);
}
END_TEST

/* A 7B-like shape with C hidden and H heads (head dimension C/H), contiguous. */
static void shape(spb_config *c, const char *strategy, int P, int U, int N, int C, int H)
{
    spb_config_defaults(c);
    c->num_layers = 32, c->hidden_size = C, c->num_heads = H, c->vocab_size = 50257, c->seq_length = N;
    c->sp_degree = P, c->micro_batch_size = 1, c->checkpoint_activations = 1, c->zero_stage = 3;
    c->ulysses_degree = U;
    snprintf(c->strategy, sizeof c->strategy, "%s", strategy);
    char err[512];
    ck_assert_msg(spb_config_finalize(c, P, err, sizeof err) == 0, "%s", err);
}

static void predict(const spb_config *c, const spb_profile *p, spb_perf_prediction *out)
{
    char err[512];
    ck_assert_msg(spb_perf_predict(c, c->sp_degree, p, NULL, out, err, sizeof err) == 0, "%s", err);
}

/* Uneven splits, by hand: the step waits for the busiest rank.
 * Ulysses with H = 32 heads on P = 6 ranks (split.h: ranks 0 and 1 attend
 * 6 heads, the others 5), head dimension d = 128, N = 6·8192 (T = 8192):
 * - attention: 6 heads over all N tokens on every rank's clock, causal,
 *   forward + recompute + backward = (4 + 4 + 10)·d·6·N(N+1)/2 FLOPs a layer,
 *   the time of an even run with 6 heads of 128 (H = 48, C = 6144, P = 8);
 *   H/P = 5.33 heads would be 11% short;
 * - the all-to-all at the busiest link (ulysses.c's comm_volume): forward
 *   rank r sends T·3d·(H − H_r) + (N − T)·H_r·d floats, 108·T·d at H_r = 6
 *   (106 at 5); backward T·d·(H − H_r) + (N − T)·3·H_r·d, 116·T·d at 6;
 *   bf16 (2 bytes), inside one node: 2 calls of 10 us + bytes / 240 GB/s.
 * Uneven tokens (P ∤ N) are priced at ⌈N/P⌉ a rank: Ulysses' products at
 * N = 6·8192 + 1 cost what N = 6·8193 costs (T = 8193 both); ring's blocks
 * (contiguous, P = 8) at N = 8·8192 + 1 what N = 8·8193 costs; the
 * hybrid's (U = 2, R = 4) ring blocks of ⌈N/R⌉ = 16385 at N = 65537 what
 * N = 65540 costs, and its bytes are the busiest rank's of comm_volume's
 * uneven formula (the model once priced ⌊N/P⌋ tokens' even formula). */
START_TEST(uneven_shares_by_hand)
{
    spb_profile *p = malloc(sizeof *p);
    load("A100-80GB-DGX.profile", p);
    spb_config c, ref;
    spb_perf_prediction u, r;
    const double T = 8192, d = 128, N = 6 * T, L = 32;
    shape(&c, "ulysses", 6, 0, (int)N, 4096, 32);
    shape(&ref, "ulysses", 8, 0, (int)N, 6144, 48);
    predict(&c, p, &u);
    predict(&ref, p, &r);
    const double accum = spb_config_accum_steps(&c, 6);
    CLOSE(u.attn_flops, L * accum * 18 * d * 6 * N * (N + 1) / 2);
    CLOSE(u.t_attn, r.t_attn * accum / spb_config_accum_steps(&ref, 8));
    const double fwd = 108 * T * d * 2, bwd = 116 * T * d * 2;
    CLOSE(u.plan.link[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD], L * accum * fwd);
    CLOSE(u.plan.link[SPB_OP_ALLTOALL][SPB_PHASE_BACKWARD], L * accum * bwd);
    CLOSE(u.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD], L * accum * (2 * 10e-6 + fwd / 240e9));
    CLOSE(u.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_RECOMPUTE], L * accum * (2 * 10e-6 + fwd / 240e9));
    CLOSE(u.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_BACKWARD], L * accum * (2 * 10e-6 + bwd / 240e9));
    say("  ulysses 7B H=32 P=6 N=48K: attention %.4g s (6 heads a rank), all-to-all fwd %.4g s\n", u.t_attn,
        u.comm_exposed[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD]);

    /* uneven tokens: the largest share's work */
    shape(&c, "ulysses", 6, 0, 6 * 8192 + 1, 4096, 32);
    shape(&ref, "ulysses", 6, 0, 6 * 8193, 4096, 32);
    predict(&c, p, &u);
    predict(&ref, p, &r);
    CLOSE(u.t_gemm, r.t_gemm);
    CLOSE(u.gemm_flops, r.gemm_flops);
    const char *strategies[] = {"ring", "hybrid"};
    const int n_uneven[] = {8 * 8192 + 1, 65537}, n_even[] = {8 * 8193, 65540}, degree[] = {0, 2};
    for (int k = 0; k < 2; k++) {
        shape(&c, strategies[k], 8, degree[k], n_uneven[k], 4096, 32);
        shape(&ref, strategies[k], 8, degree[k], n_even[k], 4096, 32);
        predict(&c, p, &u);
        predict(&ref, p, &r);
        CLOSE(u.t_attn, r.t_attn);
        CLOSE(u.attn_flops, r.attn_flops);
        CLOSE(u.t_gemm, r.t_gemm);
        /* bytes: the busiest rank's, each phase (bf16: half the fp32 formula) */
        const spb_comm_volume v = spb_strategy_by_name(strategies[k])->comm_volume(&c, 8);
        const double per = L * spb_config_accum_steps(&c, 8) / 2;
        CLOSE(u.plan.link[SPB_OP_ALLTOALL][SPB_PHASE_FORWARD] + u.plan.link[SPB_OP_SENDRECV][SPB_PHASE_FORWARD],
              per * v.forward_bytes);
        CLOSE(u.plan.link[SPB_OP_ALLTOALL][SPB_PHASE_BACKWARD] + u.plan.link[SPB_OP_SENDRECV][SPB_PHASE_BACKWARD],
              per * v.backward_bytes);
        say("  %s 7B P=8 N=%d: attention %.4g s, as N=%d; busiest link fwd %.4g MB a layer\n", strategies[k],
            n_uneven[k], u.t_attn, n_even[k], v.forward_bytes / 2 / 1e6);
    }
    free(p);
}
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (argc > 1) profiles_dir = argv[1];
    Suite *s = suite_create("perf_model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, bytes_equal_measured, 0, NUM_VARIANTS * 3 * 4 * 2);
    tcase_add_loop_test(tc, llama_bytes_equal_measured, 0, NUM_VARIANTS * 12 * 2);
    tcase_add_test(tc, parts_add_up_and_topology);
    tcase_add_test(tc, attention_tile_model);
    tcase_add_test(tc, every_profile_loads);
    tcase_add_test(tc, pipeline_terms_by_hand);
    tcase_add_test(tc, unfused_attention_by_hand);
    tcase_add_test(tc, layout_terms_by_hand);
    tcase_add_test(tc, hybrid_groups_by_hand);
    tcase_add_test(tc, allgather_kv_attention_by_hand);
    tcase_add_test(tc, uneven_shares_by_hand);
    suite_add_tcase(s, tc);
    return spb_run_suite_and_finalize(s);
}
