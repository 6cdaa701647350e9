/* The strategies built from the pieces of Ulysses and ring (hybrid, with
 * every Ulysses degree U dividing P) and all-gather-KV context parallelism,
 * against the single-rank fp32 reference.  Run under mpiexec with 4 ranks
 * (P = 2 with D = 2, P = 4) and with 6 (P = 2 with D = 3, P = 3 with D = 2,
 * P = 6): for causal and full attention and both token layouts, the loss
 * and every gradient of one step equal one rank running `none` on the
 * whole global batch, and the link bytes the accounting layer records for a
 * layer equal the strategy's comm_volume; on 4 ranks, ZeRO stages 0-3 at
 * D x P = 2 x 2 give the reference's parameters after 2 steps; and
 * --ulysses-overlap K gives Ulysses' (and the hybrid's) results bit for
 * bit, with the same bytes in K times the all-to-alls.
 *
 * Shapes are tiny (12 heads of dimension 4 so that U in {1, 2, 3, 4, 6}
 * divides them; 24 tokens = 2 x 12 so that zigzag's 2P chunks are whole
 * for every P) and each case is one or two steps: the whole program takes
 * seconds. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "comm.h"
#include "memory.h"
#include "mpi_check.h"
#include "strategy_check.h"
#include "train.h"

enum { SEQ = 24, HEADS = 12, MAX_CASES = 160 };

typedef struct hcase {
    const char *strategy, *layout, *comm;
    int P, U, causal, zero;
    int overlap; /* --ulysses-overlap K (0: off) */
    int G;       /* K/V heads, with the Llama preset (RoPE, RMSNorm, SwiGLU); 0: GPT, G = heads */
} hcase;

static hcase cases[MAX_CASES];
static int num_cases;

static int world_size(void)
{
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

static void config(spb_config *c, const hcase *k, int P, int global)
{
    spb_config_defaults(c);
    c->num_layers = 2, c->hidden_size = 4 * HEADS, c->num_heads = HEADS, c->vocab_size = 64, c->seq_length = SEQ;
    c->global_batch_size = global, c->micro_batch_size = global / (world_size() / P);
    if (P == 1) c->micro_batch_size = global; /* the reference: one rank, whole batch */
    c->lr = 1e-2, c->weight_decay = 0.1, c->clip_grad = 0.5, c->adam_eps = 1e-4; /* as test_strategies.c */
    c->sp_degree = P;
    snprintf(c->strategy, sizeof c->strategy, "%s", k ? k->strategy : "none");
    snprintf(c->ring_layout, sizeof c->ring_layout, "%s", k ? k->layout : "contiguous");
    snprintf(c->ulysses_comm, sizeof c->ulysses_comm, "%s", k && k->comm ? k->comm : "alltoall");
    snprintf(c->attention_mask, sizeof c->attention_mask, "%s", !k || k->causal ? "causal" : "full");
    if (k && !strcmp(k->strategy, "hybrid")) c->ulysses_degree = k->U;
    if (k) c->zero_stage = k->zero, c->ulysses_overlap = k->overlap;
}

/* The model of a case, on the distributed run and the reference alike. */
static void model(spb_config *c, const hcase *k)
{
    if (!k->G) return;
    snprintf(c->model, sizeof c->model, "llama");
    c->num_query_groups = k->G;
}

/* Per-phase link bytes over every operation, per layer. */
static double phase_bytes(spb_comm_phase phase, int layers)
{
    double sum = 0;
    for (int op = 0; op < SPB_NUM_OPS; op++) sum += spb_comm_record_get((spb_comm_op)op, phase)->link_bytes;
    return sum / layers;
}

/* Equal, or within 1e-12 relative where a bus factor (U−1)/U is not a
 * binary fraction and the sum's rounding depends on the order. */
static int bytes_match(double measured, double formula)
{
    return measured == formula || fabs(measured - formula) <= 1e-12 * fabs(formula);
}

START_TEST(equals_single_rank)
{
    const hcase *k = &cases[_i];
    int world = world_size(), D = world / k->P;
    spb_config rc, dc;
    spb_grid rg, dg;
    config(&rc, NULL, 1, world);
    rc.causal = k->causal;
    snprintf(rc.attention_mask, sizeof rc.attention_mask, "%s", k->causal ? "causal" : "full");
    config(&dc, k, k->P, world);
    model(&rc, k);
    model(&dc, k);
    spb_trainer *dist = make(&dc, MPI_COMM_WORLD, &dg);
    spb_comm_reset();
    double ld = spb_trainer_gradients(dist);
    double fwd = phase_bytes(SPB_PHASE_FORWARD, dc.num_layers), bwd = phase_bytes(SPB_PHASE_BACKWARD, dc.num_layers);
    spb_comm_volume vol = dist->gpt->strategy->comm_volume(&dc, k->P);
    spb_trainer *ref = make(&rc, MPI_COMM_SELF, &rg);
    double lr = spb_trainer_gradients(ref);
    long n = ref->gpt->num_global_params;
    float *global = global_grads(dist);
    const char *where = "";
    double gerr = worst_tensor_error(ref->gpt, global, ref->gpt->grads, &where);
    say("%-12s U=%d K=%d G=%-2d %-10s %-9s P=%d D=%d %-6s ZeRO-%d loss %.9f vs %.9f | worst gradient %-10s %.2e | "
        "bytes/link/layer fwd %.0f (formula %.0f) bwd %.0f (formula %.0f)\n",
        k->strategy, k->U, k->overlap, k->G, k->layout, k->comm ? k->comm : "", k->P, D, k->causal ? "causal" : "full",
        k->zero, ld, lr,
        where, gerr, fwd, vol.forward_bytes, bwd, vol.backward_bytes);
    ck_assert_double_le(fabs(ld - lr) / lr, 1e-6);
    /* fp32 on both sides, sums in other orders: measured ~1e-7 (test_strategies.c) */
    ck_assert_msg(gerr <= 1e-5, "%s U=%d P=%d G=%d: gradient of %s off by %.3e", k->strategy, k->U, k->P, k->G, where,
                  gerr);
    ck_assert_msg(bytes_match(fwd, vol.forward_bytes) && bytes_match(bwd, vol.backward_bytes),
                  "%s U=%d P=%d: link bytes %.17g/%.17g, formula %.17g/%.17g", k->strategy, k->U, k->P, fwd, bwd,
                  vol.forward_bytes, vol.backward_bytes);
    if (k->P > 1 && !(k->U == 1 && !strcmp(k->strategy, "hybrid") && k->P == 1)) ck_assert(fwd > 0);
    (void)n;
    free(global);
    spb_trainer_destroy(ref);
    spb_trainer_destroy(dist);
    spb_grid_destroy(&rg);
    spb_grid_destroy(&dg);
}
END_TEST

/* Parameters after 2 steps (ZeRO stage k->zero) against the reference. */
START_TEST(zero_after_two_steps)
{
    const hcase *k = &cases[_i];
    int world = world_size();
    spb_config rc, dc;
    spb_grid rg, dg;
    config(&rc, NULL, 1, world);
    config(&dc, k, k->P, world);
    model(&rc, k);
    model(&dc, k);
    spb_trainer *dist = make(&dc, MPI_COMM_WORLD, &dg);
    spb_trainer *ref = make(&rc, MPI_COMM_SELF, &rg);
    for (int s = 0; s < 2; s++) {
        double a = spb_trainer_step(ref), b = spb_trainer_step(dist);
        ck_assert_double_le(fabs(a - b) / a, 1e-5);
    }
    const char *where = "";
    double perr = params_error(ref, dist, &where);
    say("%-12s U=%d G=%-2d %-10s P=%d D=%d ZeRO-%d params after 2 steps %-10s %.2e\n", k->strategy, k->U, k->G,
        k->layout, k->P, world / k->P, k->zero, where, perr);
    ck_assert_msg(perr <= 1e-5, "%s ZeRO-%d: parameters of %s off by %.3e", k->strategy, k->zero, where, perr);
    spb_trainer_destroy(ref);
    spb_trainer_destroy(dist);
    spb_grid_destroy(&rg);
    spb_grid_destroy(&dg);
}
END_TEST

/* --ulysses-overlap K against the same strategy without it: the same
 * arithmetic on the same values per head (the exchange only moves them
 * in pieces), so the loss and every gradient are bit-identical; and the
 * same bytes per link (K all-to-alls of 1/K each). */
START_TEST(overlap_is_identical)
{
    const hcase *k = &cases[_i];
    int world = world_size();
    hcase plain = *k;
    plain.overlap = 0;
    spb_config oc, pc;
    spb_grid og, pg;
    config(&oc, k, k->P, world);
    config(&pc, &plain, k->P, world);
    model(&oc, k);
    model(&pc, &plain);
    spb_trainer *a = make(&oc, MPI_COMM_WORLD, &og);
    spb_comm_reset();
    double la = spb_trainer_gradients(a);
    double fa = phase_bytes(SPB_PHASE_FORWARD, oc.num_layers), ba = phase_bytes(SPB_PHASE_BACKWARD, oc.num_layers);
    long calls = spb_comm_record_get(SPB_OP_ALLTOALL, SPB_PHASE_FORWARD)->calls;
    spb_trainer *b = make(&pc, MPI_COMM_WORLD, &pg);
    spb_comm_reset();
    double lb = spb_trainer_gradients(b);
    double fb = phase_bytes(SPB_PHASE_FORWARD, pc.num_layers), bb = phase_bytes(SPB_PHASE_BACKWARD, pc.num_layers);
    long plain_calls = spb_comm_record_get(SPB_OP_ALLTOALL, SPB_PHASE_FORWARD)->calls;
    float *ga = global_grads(a), *gb = global_grads(b);
    long n = a->gpt->num_global_params;
    int same = memcmp(ga, gb, sizeof(float) * (size_t)n) == 0;
    say("%-8s U=%d P=%d K=%d G=%-2d %-6s overlapped vs plain: loss %.9g vs %.9g, gradients %s | all-to-alls forward "
        "%ld vs %ld, bytes/link/layer %.0f/%.0f vs %.0f/%.0f\n",
        k->strategy, k->U, k->P, k->overlap, k->G, k->causal ? "causal" : "full", la, lb,
        same ? "bit-identical" : "DIFFER", calls, plain_calls, fa, ba, fb, bb);
    ck_assert(la == lb);
    ck_assert_msg(same, "%s P=%d K=%d G=%d: gradients differ from plain", k->strategy, k->P, k->overlap, k->G);
    ck_assert_int_eq(calls, k->overlap * plain_calls);
    ck_assert(bytes_match(fa, fb) && bytes_match(ba, bb));
    free(ga);
    free(gb);
    spb_trainer_destroy(a);
    spb_trainer_destroy(b);
    spb_grid_destroy(&og);
    spb_grid_destroy(&pg);
}
END_TEST

/* The replays behind the exposed-vs-hidden breakdown: after one step of
 * the hybrid with both parts (U = 2, R = P/2), the run's all-to-alls and
 * sendrecvs replay alone without deadlock and take time; with nothing
 * logged they take none. */
START_TEST(replays_run)
{
    int world = world_size();
    hcase k = {"hybrid", "zigzag", NULL, world, 2, 1, 0, 0, 0};
    spb_config c;
    spb_grid g;
    config(&c, &k, world, world);
    spb_trainer *t = make(&c, MPI_COMM_WORLD, &g);
    spb_comm_reset();
    spb_trainer_gradients(t);
    double a2a = spb_comm_replay_alltoalls(), p2p = spb_comm_replay_sendrecvs();
    spb_comm_reset();
    double none = spb_comm_replay_sendrecvs();
    say("replays after one hybrid U=2 P=%d step: all-to-alls %.3f ms, sendrecvs %.3f ms alone\n", world, a2a * 1e3,
        p2p * 1e3);
    ck_assert(a2a > 0 && p2p > 0);
    ck_assert(none < p2p);
    spb_trainer_destroy(t);
    spb_grid_destroy(&g);
}
END_TEST

static void add(hcase k)
{
    SPB_CHECK(num_cases < MAX_CASES);
    cases[num_cases++] = k;
}

/* G K/V heads over an exchange of U ranks with K head groups: what
 * Ulysses takes (G | U or U | G) and the overlap (ulysses.c: the K/V heads
 * per rank, max(G, U)/U, and K dividing one another; K | H/U). */
static int overlap_takes(int G, int U, int K)
{
    int Gp = (G > U ? G : U) / U;
    return (G >= U ? G % U : U % G) == 0 && (HEADS / U) % K == 0 && (Gp % K == 0 || K % Gp == 0);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int world = world_size();
    static const char *const layouts[] = {"contiguous", "zigzag"};
    for (int P = 2; P <= world; P++) {
        if (world % P) continue;
        for (int l = 0; l < 2; l++)
            for (int causal = 0; causal < 2; causal++) {
                for (int U = 1; U <= P; U++)
                    if (P % U == 0) add((hcase){"hybrid", layouts[l], NULL, P, U, causal, 0, 0, 0});
                add((hcase){"allgather-kv", layouts[l], NULL, P, P, causal, 0, 0, 0});
            }
    }
    /* Grouped-query attention with the Llama preset (RoPE at the hybrid's
     * and zigzag's global positions): G = 1, 2 and heads K/V heads, the
     * hybrid at every U with G | U or U | G (G < U replicates K/V heads in
     * the Ulysses groups), allgather-kv gathering only the K/V heads. */
    static const int kv_groups[] = {1, 2, HEADS};
    for (int P = 2; P <= world; P++) {
        if (world % P) continue;
        for (int gi = 0; gi < 3; gi++) {
            int G = kv_groups[gi];
            for (int U = 1; U <= P; U++)
                if (P % U == 0 && (G >= U ? G % U == 0 : U % G == 0))
                    add((hcase){"hybrid", "zigzag", NULL, P, U, 1, 0, 0, G});
            add((hcase){"allgather-kv", gi == 1 ? "contiguous" : "zigzag", NULL, P, P, gi != 1, 0, 0, G});
        }
    }
    /* Ulysses' allgather ablation inside the hybrid's groups */
    if (world % 4 == 0) add((hcase){"hybrid", "zigzag", "allgather", 4, 2, 1, 0, 0, 0});
    /* --ulysses-overlap against the reference: Ulysses at every P (K = the
     * heads per rank's smallest factor > 1), the hybrid's groups */
    for (int P = 2; P <= world; P++)
        if (world % P == 0 && (HEADS / P) > 1)
            for (int causal = 0; causal < 2; causal++) {
                int K = 2;
                while ((HEADS / P) % K) K++;
                add((hcase){"ulysses", "contiguous", NULL, P, P, causal, 0, K, 0});
            }
    if (world % 4 == 0) add((hcase){"hybrid", "zigzag", NULL, 4, 2, 1, 0, 3, 0});
    if (world % 6 == 0) add((hcase){"hybrid", "zigzag", NULL, 6, 3, 1, 0, 4, 0});
    /* ... with grouped-query attention (the Llama preset): groups sharing a
     * replicated K/V head (G = 1), sharing one of their own (G = 2 at
     * P = 2), each with K/V heads of its own (the hybrid, G = 4 over U = 2) */
    for (int P = 2; P <= world; P++)
        if (world % P == 0)
            for (int G = 1; G <= 2; G++) {
                int K = 2;
                while (K <= HEADS / P && !overlap_takes(G, P, K)) K++;
                if (K <= HEADS / P) add((hcase){"ulysses", "contiguous", NULL, P, P, G == 1, 0, K, G});
            }
    if (world % 4 == 0) add((hcase){"hybrid", "zigzag", NULL, 4, 2, 1, 0, 2, 4});
    int n_equal = num_cases;
    if (world == 4)
        for (int zero = 0; zero <= 3; zero++) {
            add((hcase){"hybrid", "zigzag", NULL, 2, 2, 1, zero, 0, 0}); /* U = 2 of P = 2: Ulysses groups, R = 1 */
            add((hcase){"hybrid", "contiguous", NULL, 2, 1, 1, zero, 0, 0});
            add((hcase){"allgather-kv", "zigzag", NULL, 2, 2, 1, zero, 0, 0});
        }
    if (world == 4) { /* K/V replicas (G = 1 < U = 2) and gathered K/V heads under ZeRO-3 */
        add((hcase){"hybrid", "zigzag", NULL, 2, 2, 1, 3, 0, 1});
        add((hcase){"allgather-kv", "zigzag", NULL, 2, 2, 1, 3, 0, 2});
    }
    if (world == 6)
        for (int zero = 1; zero <= 3; zero += 2) add((hcase){"hybrid", "zigzag", NULL, 6, 3, 1, zero, 0, 0});
    int n_zero = num_cases;
    /* overlapped = plain, bit for bit: every K dividing the heads per rank */
    for (int P = 2; P <= world; P++)
        if (world % P == 0)
            for (int K = 2; K <= HEADS / P; K++)
                if ((HEADS / P) % K == 0) add((hcase){"ulysses", "contiguous", NULL, P, P, 1, 0, K, 0});
    if (world % 4 == 0) add((hcase){"hybrid", "zigzag", NULL, 4, 2, 0, 0, 2, 0});
    /* ... and with G K/V heads, every K the overlap takes: shared K/V
     * heads must add their gradients in the plain call's order */
    static const int gqa[] = {1, 2, 4};
    for (int P = 2; P <= world; P++)
        if (world % P == 0)
            for (int gi = 0; gi < 3; gi++)
                for (int K = 2; K <= HEADS / P; K++)
                    if (overlap_takes(gqa[gi], P, K)) add((hcase){"ulysses", "contiguous", NULL, P, P, 1, 0, K, gqa[gi]});
    if (world % 4 == 0) add((hcase){"hybrid", "zigzag", NULL, 4, 2, 1, 0, 2, 4});

    Suite *s = suite_create("hybrid_strategies");
    TCase *tc = tcase_create("reproduce_single_rank");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, equals_single_rank, 0, n_equal);
    tcase_add_loop_test(tc, zero_after_two_steps, n_equal, n_zero);
    tcase_add_loop_test(tc, overlap_is_identical, n_zero, num_cases);
    if (world % 2 == 0 && world >= 4) tcase_add_test(tc, replays_run); /* R = P/2 > 1 */
    suite_add_tcase(s, tc);
    return spb_run_suite_and_finalize(s);
}
