/* Uneven sequence shares (common/runtime/split.h: --seq-length N not
 * divisible by --sp-degree P, the first N mod P ranks one token more)
 * against the single-rank fp32 reference.  Run under mpiexec with 4 ranks
 * (P = 2 with D = 2, P = 4) and with 6 (P = 2 with D = 3, P = 3 with
 * D = 2, P = 6):
 *   - the all-to-all, allgather and reduce-scatter with per-rank counts
 *     move (and sum) what they are told and record the floats each rank
 *     sends;
 *   - Ulysses, ring and allgather-kv (contiguous), Megatron-SP (its
 *     tensor-parallel region gathers every rank's share) and the hybrid
 *     (every U dividing P; nested shares, also at N = 4P + P/2 with U = 2
 *     where they differ from the flat ones) at N = 4P + 1 and 5P − 1,
 *     causal and full, GPT (learned positions) and the Llama preset (RoPE at
 *     global positions, GQA): the loss and every gradient of one step equal
 *     one rank running `none` on the whole global batch; the busiest link's
 *     bytes per layer (the largest over ranks) equal comm_volume; the
 *     memory model's activations equal the allocator's on rank 0 (the
 *     largest share) and bound every other rank's;
 *   - Ulysses with 7 heads (not divisible by any P: uneven head groups
 *     through the same all-to-all), equal and uneven token shares, GPT and
 *     the Llama preset with G = H: the same checks;
 *   - ring, allgather-kv and the hybrid with --ring-layout zigzag and 2P ∤ N
 *     (chunks of split.h's shares over 2P, the hybrid's over 2R; at 6P − 1
 *     rank 0 holds the fewer tokens), and the hybrid with 7 heads over
 *     every U ∤ 7 (uneven head groups inside its Ulysses groups): the same
 *     checks, the memory model against the largest rank;
 *   - on 4 ranks, ZeRO 0-3 at D x P = 2 x 2 give the reference's
 *     parameters after 2 steps.
 * SPB_UNEVEN_MATRIX=1 (uneven_matrix_mpi4/6, label full) runs instead the
 * whole zigzag / uneven-heads matrix: every length, both masks, the Llama
 * preset, N = P + 1 (empty zigzag chunks), and ring-flash-attention #39's
 * N = 2999.
 * Shapes are tiny (12 heads of dimension 4, so that P in {2, 3, 4, 6}
 * divides the heads): the program takes seconds. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "comm.h"
#include "memory.h"
#include "memory_model.h"
#include "mpi_check.h"
#include "split.h"
#include "strategy_check.h"
#include "train.h"

enum { HEADS = 12, ODD_HEADS = 7, MAX_CASES = 256 };

typedef struct ucase {
    const char *strategy;
    int P, N, causal, zero;
    int G; /* K/V heads with the Llama preset (RoPE, RMSNorm, SwiGLU); 0: GPT */
    int heads; /* 0: HEADS; else ODD_HEADS (not divisible by any P here: uneven head groups) */
    int U;     /* hybrid's --ulysses-degree */
    int zigzag; /* ring, allgather-kv, hybrid: --ring-layout zigzag (chunks of split.h's shares over 2P, or 2R) */
} ucase;

static ucase cases[MAX_CASES];
static int num_cases;

static int world_size(void)
{
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

static void config(spb_config *c, const ucase *k, int P, int global)
{
    spb_config_defaults(c);
    const int heads = k->heads ? k->heads : HEADS;
    c->num_layers = 2, c->hidden_size = 4 * heads, c->num_heads = heads, c->vocab_size = 64, c->seq_length = k->N;
    c->global_batch_size = global, c->micro_batch_size = P == 1 ? global : global / (world_size() / P);
    c->lr = 1e-2, c->weight_decay = 0.1, c->clip_grad = 0.5, c->adam_eps = 1e-4; /* as test_strategies.c */
    c->sp_degree = P;
    snprintf(c->strategy, sizeof c->strategy, "%s", P == 1 ? "none" : k->strategy);
    snprintf(c->attention_mask, sizeof c->attention_mask, "%s", k->causal ? "causal" : "full");
    if (P > 1) c->zero_stage = k->zero;
    if (P > 1 && k->U) c->ulysses_degree = k->U;
    if (k->zigzag) snprintf(c->ring_layout, sizeof c->ring_layout, "zigzag");
    if (k->G) {
        snprintf(c->model, sizeof c->model, "llama");
        c->num_query_groups = k->G;
        /* Megatron-SP splits the MLP P ways; the SwiGLU width rule's 128
         * does not divide by 3 or 6 */
        if (!strcmp(k->strategy, "megatron")) c->ffn_hidden_size = 120;
    }
}

/* The largest over ranks of this rank's per-phase link bytes, per layer. */
static double busiest_link(spb_comm_phase phase, int layers)
{
    double sum = 0;
    for (int op = 0; op < SPB_NUM_OPS; op++) sum += spb_comm_record_get((spb_comm_op)op, phase)->link_bytes;
    sum /= layers;
    MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return sum;
}

/* Rank i sends (i + 1)·(j + 2) + j floats to rank j, each the value
 * 1000·i + j + its index; received blocks land packed in rank order. */
START_TEST(alltoallv_moves_counts)
{
    int n = world_size(), me = spb_world_rank();
    long send_counts[16], send_displs[16], recv_counts[16], recv_displs[16], total_send = 0, total_recv = 0;
    ck_assert_int_le(n, 16);
    for (int j = 0; j < n; j++) {
        send_counts[j] = (long)(me + 1) * (j + 2) + j, send_displs[j] = total_send, total_send += send_counts[j];
        recv_counts[j] = (long)(j + 1) * (me + 2) + me, recv_displs[j] = total_recv, total_recv += recv_counts[j];
    }
    float *send = malloc(sizeof(float) * (size_t)total_send), *recv = malloc(sizeof(float) * (size_t)total_recv);
    for (int j = 0; j < n; j++)
        for (long x = 0; x < send_counts[j]; x++) send[send_displs[j] + x] = (float)(1000 * me + j + x);
    spb_comm_reset();
    spb_alltoallv_f32(send, send_counts, send_displs, recv, recv_counts, recv_displs, MPI_COMM_WORLD,
                      SPB_PHASE_OTHER);
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (long x = 0; x < recv_counts[i]; x++) bad += recv[recv_displs[i] + x] != (float)(1000 * i + me + x);
    const spb_comm_record *r = spb_comm_record_get(SPB_OP_ALLTOALL, SPB_PHASE_OTHER);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(r->calls, 1);
    ck_assert_double_eq(r->payload_bytes, 4.0 * total_send);
    ck_assert_double_eq(r->link_bytes, 4.0 * (total_send - send_counts[me]));
    free(send);
    free(recv);
    spb_comm_reset();
}
END_TEST

/* Rank i's block is 3 + 2i floats; allgatherv assembles every block in rank
 * order; reduce-scatterv sums block me over the ranks (each rank sends
 * j + 10·i + x for block j). */
START_TEST(allgatherv_and_reduce_scatterv)
{
    int n = world_size(), me = spb_world_rank();
    long counts[16], displs[16], total = 0;
    ck_assert_int_le(n, 16);
    for (int j = 0; j < n; j++) counts[j] = 3 + 2 * j, displs[j] = total, total += counts[j];
    float *mine = malloc(sizeof(float) * (size_t)counts[me]), *all = malloc(sizeof(float) * (size_t)total);
    for (long x = 0; x < counts[me]; x++) mine[x] = (float)(100 * me + x);
    spb_comm_reset();
    spb_allgatherv_f32(mine, all, counts, displs, MPI_COMM_WORLD, SPB_PHASE_OTHER);
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (long x = 0; x < counts[i]; x++) bad += all[displs[i] + x] != (float)(100 * i + x);
    ck_assert_int_eq(bad, 0);
    const spb_comm_record *g = spb_comm_record_get(SPB_OP_ALLGATHER, SPB_PHASE_OTHER);
    ck_assert_double_eq(g->payload_bytes, 4.0 * total);
    ck_assert_double_eq(g->link_bytes, 4.0 * counts[me] * (n - 1));
    for (int j = 0; j < n; j++)
        for (long x = 0; x < counts[j]; x++) all[displs[j] + x] = (float)(j + 10 * me + x);
    spb_reduce_scatterv_f32(all, counts, displs, mine, MPI_COMM_WORLD, SPB_PHASE_OTHER);
    for (long x = 0; x < counts[me]; x++) bad += mine[x] != (float)(n * (me + x) + 10 * n * (n - 1) / 2);
    ck_assert_int_eq(bad, 0);
    const spb_comm_record *r = spb_comm_record_get(SPB_OP_REDUCE_SCATTER, SPB_PHASE_OTHER);
    ck_assert_double_eq(r->payload_bytes, 4.0 * total);
    ck_assert_double_eq(r->link_bytes, 4.0 * (total - counts[me]));
    free(mine);
    free(all);
    spb_comm_reset();
}
END_TEST

START_TEST(split_shares)
{
    /* 4P + 1 tokens on P = 4: 5, 4, 4, 4 at 0, 5, 9, 13; shares sum to N */
    ck_assert_int_eq(spb_split_count(17, 4, 0), 5);
    ck_assert_int_eq(spb_split_count(17, 4, 1), 4);
    ck_assert_int_eq(spb_split_offset(17, 4, 1), 5);
    ck_assert_int_eq(spb_split_offset(17, 4, 3), 13);
    ck_assert_int_eq(spb_split_max(17, 4), 5);
    for (int P = 1; P <= 7; P++)
        for (long N = P; N < 40; N++) {
            long sum = 0;
            for (int i = 0; i < P; i++) {
                ck_assert_int_eq(spb_split_offset(N, P, i), sum);
                sum += spb_split_count(N, P, i);
            }
            ck_assert_int_eq(sum, N);
        }
}
END_TEST

START_TEST(equals_single_rank)
{
    const ucase *k = &cases[_i];
    int world = world_size(), D = world / k->P;
    spb_config rc, dc;
    spb_grid rg, dg;
    config(&rc, k, 1, world);
    config(&dc, k, k->P, world);
    size_t before = spb_mem_get_stats()->current[SPB_MEM_ACTIVATIONS];
    spb_mem_reset_peaks();
    spb_trainer *dist = make(&dc, MPI_COMM_WORLD, &dg);
    spb_comm_reset();
    double ld = spb_trainer_gradients(dist);
    double act = (double)(spb_mem_get_stats()->peak[SPB_MEM_ACTIVATIONS] - before);
    double fwd = busiest_link(SPB_PHASE_FORWARD, dc.num_layers), bwd = busiest_link(SPB_PHASE_BACKWARD, dc.num_layers);
    spb_comm_volume vol = dist->gpt->strategy->comm_volume(&dc, k->P);
    spb_memory_prediction pred;
    spb_memory_model(&dc, world, spb_memory_precision(&dc), &pred);
    /* the model sizes the largest rank (most tokens, most heads): rank 0
     * when contiguous, a zigzag rank with chunks c_r + c_{2P-1-r} = ⌈N/P⌉
     * otherwise; the largest over ranks must equal it */
    double act_most = act;
    MPI_Allreduce(MPI_IN_PLACE, &act_most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int most = (int)spb_split_max(k->N, k->P);
    spb_trainer *ref = make(&rc, MPI_COMM_SELF, &rg);
    double lr = spb_trainer_gradients(ref);
    float *global = global_grads(dist);
    const char *where = "";
    double gerr = worst_tensor_error(ref->gpt, global, ref->gpt->grads, &where);
    say("%-8s %-6s U=%d H=%-2d G=%-2d P=%d D=%d N=%-4d (shares %ld..%d) %-6s loss %.9f vs %.9f | worst gradient %-10s "
        "%.2e | busiest link/layer fwd %.0f (formula %.0f) bwd %.0f (formula %.0f) | activations largest %.0f model "
        "%.0f\n",
        k->strategy, k->zigzag ? "zigzag" : "contig", k->U, dc.num_heads, k->G, k->P, D, k->N, (long)k->N / k->P, most,
        k->causal ? "causal" : "full", ld, lr, where, gerr, fwd, vol.forward_bytes, bwd, vol.backward_bytes, act_most,
        pred.bytes[SPB_MEM_ACTIVATIONS]);
    ck_assert_msg(fabs(ld - lr) / lr <= 1e-6, "%s P=%d N=%d: loss %.9f vs %.9f", k->strategy, k->P, k->N, ld, lr);
    /* fp32 on both sides, sums in other orders: measured ~1e-7 (test_strategies.c) */
    ck_assert_msg(gerr <= 1e-5, "%s P=%d N=%d G=%d: gradient of %s off by %.3e", k->strategy, k->P, k->N, k->G, where,
                  gerr);
    ck_assert_msg(fwd == vol.forward_bytes && bwd == vol.backward_bytes,
                  "%s P=%d N=%d: busiest link %.17g/%.17g, formula %.17g/%.17g", k->strategy, k->P, k->N, fwd, bwd,
                  vol.forward_bytes, vol.backward_bytes);
    /* the model sizes the largest share: equal there, a bound elsewhere */
    ck_assert_msg(act_most == pred.bytes[SPB_MEM_ACTIVATIONS], "%s P=%d N=%d: largest activations %.0f, model %.0f",
                  k->strategy, k->P, k->N, act_most, pred.bytes[SPB_MEM_ACTIVATIONS]);
    ck_assert(act <= pred.bytes[SPB_MEM_ACTIVATIONS]);
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
    const ucase *k = &cases[_i];
    int world = world_size();
    spb_config rc, dc;
    spb_grid rg, dg;
    config(&rc, k, 1, world);
    config(&dc, k, k->P, world);
    spb_trainer *dist = make(&dc, MPI_COMM_WORLD, &dg);
    spb_trainer *ref = make(&rc, MPI_COMM_SELF, &rg);
    for (int s = 0; s < 2; s++) {
        double a = spb_trainer_step(ref), b = spb_trainer_step(dist);
        ck_assert_double_le(fabs(a - b) / a, 1e-5);
    }
    const char *where = "";
    double perr = params_error(ref, dist, &where);
    say("%-8s %-6s U=%d H=%-2d G=%-2d P=%d D=%d N=%d ZeRO-%d params after 2 steps %-10s %.2e\n", k->strategy,
        k->zigzag ? "zigzag" : "contig", k->U, dc.num_heads, k->G, k->P, world / k->P, k->N, k->zero, where, perr);
    ck_assert_msg(perr <= 1e-5, "%s ZeRO-%d: parameters of %s off by %.3e", k->strategy, k->zero, where, perr);
    spb_trainer_destroy(ref);
    spb_trainer_destroy(dist);
    spb_grid_destroy(&rg);
    spb_grid_destroy(&dg);
}
END_TEST

static void add(ucase k)
{
    SPB_CHECK(num_cases < MAX_CASES);
    cases[num_cases++] = k;
}

/* Zigzag with 2P ∤ N (chunks of split.h's shares over 2P; the hybrid's over
 * 2R) and uneven heads in the hybrid's Ulysses groups (7 heads, U ∤ 7) at
 * SP degree P.  Lengths: 4P+1 (N mod 2P = 1: rank 0 alone one token more),
 * 6P−1 (N mod 2P = 2P−1 > P: ranks 1..P−1 hold ⌈N/P⌉, rank 0 ⌊N/P⌋, as
 * ring-flash-attention #39's 750/750/750/749 on P = 2), 5P (P | N, 2P ∤ N:
 * equal shares of unequal chunks).  The quick set takes one or two of each
 * kind; the matrix (SPB_UNEVEN_MATRIX=1, scripts/test --full) every length,
 * both masks and the Llama preset. */
static void add_zigzag_and_head_cases(int P, int matrix)
{
    const int lengths[3] = {4 * P + 1, 6 * P - 1, 5 * P};
    const int G = P % 3 == 0 ? 3 : 2; /* as the contiguous cases */
    static const char *const rings[] = {"ring", "allgather-kv"};
    for (int s = 0; s < 2; s++) {
        if (matrix) {
            for (int li = 0; li < 3; li++) {
                for (int causal = 0; causal < 2; causal++)
                    add((ucase){rings[s], P, lengths[li], causal, 0, 0, 0, 0, 1});
                add((ucase){rings[s], P, lengths[li], 1, 0, G, 0, 0, 1}); /* RoPE at zigzag's positions, GQA */
            }
            /* N = P + 1 < 2P: chunks 2P − 1 − r are empty on the ranks below P − 1 (no run) */
            add((ucase){rings[s], P, P + 1, 1, 0, 0, 0, 0, 1});
        } else {
            add((ucase){rings[s], P, lengths[0], s, 0, 0, 0, 0, 1});
            add((ucase){rings[s], P, lengths[1], 1, 0, s ? 0 : G, 0, 0, 1});
        }
    }
    for (int U = 1; U <= P; U++) {
        if (P % U) continue;
        const int Gh = U % 2 == 0 ? 2 : U % 3 == 0 ? 3 : 2;
        if (matrix) {
            for (int li = 0; li < 3; li++) {
                for (int causal = 0; causal < 2; causal++) add((ucase){"hybrid", P, lengths[li], causal, 0, 0, 0, U, 1});
                add((ucase){"hybrid", P, lengths[li], 1, 0, Gh, 0, U, 1});
            }
            add((ucase){"hybrid", P, P + 1, 1, 0, 0, 0, U, 1});
        } else {
            add((ucase){"hybrid", P, lengths[U % 2], 1, 0, 0, 0, U, 1});
        }
        if (ODD_HEADS % U == 0) continue;
        /* 7 heads in groups of U: ⌈7/U⌉ on the first 7 mod U ranks of each group */
        if (matrix) {
            for (int zz = 0; zz < 2; zz++)
                for (int li = 0; li < 3; li++)
                    for (int causal = 0; causal < 2; causal++)
                        add((ucase){"hybrid", P, zz || li ? lengths[li] : 4 * P, causal, 0, 0, ODD_HEADS, U, zz});
            add((ucase){"hybrid", P, lengths[1], 1, 0, ODD_HEADS, ODD_HEADS, U, 1}); /* Llama preset, G = H */
        } else {
            add((ucase){"hybrid", P, 4 * P, 0, 0, 0, ODD_HEADS, U, 0});
            add((ucase){"hybrid", P, lengths[1], 1, 0, ODD_HEADS, ODD_HEADS, U, 1});
        }
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int world = world_size();
    const char *matrix_env = getenv("SPB_UNEVEN_MATRIX");
    if (matrix_env && !strcmp(matrix_env, "1")) { /* the whole zigzag / uneven-heads matrix only */
        for (int P = 2; P <= world; P++)
            if (world % P == 0) add_zigzag_and_head_cases(P, 1);
        /* ring-flash-attention #39's shape itself (the quick set has its
         * pattern at N = 11: chunks 3/3/3/2): N = 2999 on P = 2, zigzag
         * chunks 750/750/750/749 (rank 0 1499 tokens, rank 1 1500) */
        if (world == 4) add((ucase){"ring", 2, 2999, 1, 0, 0, 0, 0, 1});
        int n_equal = num_cases;
        if (world == 4)
            for (int zero = 0; zero <= 3; zero++) {
                add((ucase){"ring", 2, 11, 0, zero, 0, 0, 0, 1});
                add((ucase){"allgather-kv", 2, 9, 0, zero, 0, 0, 0, 1});
                add((ucase){"hybrid", 2, 10, 0, zero, 0, ODD_HEADS, 2, 1});
            }
        Suite *su = suite_create("uneven_matrix");
        TCase *tc = tcase_create("zigzag_and_uneven_heads");
        tcase_set_timeout(tc, 1800);
        tcase_add_loop_test(tc, equals_single_rank, 0, n_equal);
        tcase_add_loop_test(tc, zero_after_two_steps, n_equal, num_cases);
        suite_add_tcase(su, tc);
        return spb_run_suite_and_finalize(su);
    }
    /* ring's layout: contiguous; megatron: the TP region's allgathers and reduce-scatters with per-rank counts */
    static const char *const strategies[] = {"ulysses", "ring", "allgather-kv", "megatron"};
    enum { NUM_STRATEGIES = sizeof strategies / sizeof strategies[0] };
    for (int P = 2; P <= world; P++) {
        if (world % P) continue;
        /* one token over: rank 0 alone holds the extra; P - 1 over: all but the last */
        const int lengths[2] = {4 * P + 1, 5 * P - 1};
        /* K/V heads Ulysses takes at this P (G | P or P | G); G | P for
         * Megatron-SP (replicated K/V heads) */
        const int G = P % 3 == 0 ? 3 : 2;
        for (int s = 0; s < NUM_STRATEGIES; s++) {
            for (int li = 0; li < (P > 2 ? 2 : 1); li++)
                for (int causal = 0; causal < 2; causal++)
                    add((ucase){strategies[s], P, lengths[li], causal, 0, 0, 0, 0, 0});
            add((ucase){strategies[s], P, lengths[0], 1, 0, G, 0, 0, 0}); /* RoPE at global positions, GQA */
        }
        /* uneven head groups (7 heads), with equal and uneven token shares, and with RoPE */
        for (int causal = 0; causal < 2; causal++) {
            add((ucase){"ulysses", P, 4 * P, causal, 0, 0, ODD_HEADS, 0, 0});
            add((ucase){"ulysses", P, 4 * P + 1, causal, 0, 0, ODD_HEADS, 0, 0});
        }
        add((ucase){"ulysses", P, 5 * P - 1, 1, 0, ODD_HEADS, ODD_HEADS, 0, 0}); /* Llama preset, G = H */
        /* hybrid, every U dividing P: N over the R = P/U ring groups, each
         * group's share over its U ranks; with the Llama preset G = 2 or 3
         * (G >= U split, G < U replicated) */
        for (int U = 1; U <= P; U++) {
            if (P % U) continue;
            const int Gh = U % 2 == 0 ? 2 : U % 3 == 0 ? 3 : 2;
            for (int li = 0; li < (P > 2 ? 2 : 1); li++)
                for (int causal = 0; causal < 2; causal++)
                    add((ucase){"hybrid", P, lengths[li], causal, 0, 0, 0, U, 0});
            add((ucase){"hybrid", P, lengths[1], 1, 0, Gh, 0, U, 0});
        }
        /* N mod P = P/2 with U = 2: the nested shares are not the flat ones
         * (P = 4, N = 18: 5, 4, 5, 4 instead of 5, 5, 4, 4) */
        if (P >= 4 && P % 2 == 0)
            for (int causal = 0; causal < 2; causal++) add((ucase){"hybrid", P, 4 * P + P / 2, causal, 0, 0, 0, 2, 0});
        add_zigzag_and_head_cases(P, 0);
    }
    int n_equal = num_cases;
    if (world == 4)
        for (int zero = 0; zero <= 3; zero++)
            for (int s = 0; s <= NUM_STRATEGIES; s++) /* every strategy, and ulysses with 7 heads */
                add((ucase){strategies[s % NUM_STRATEGIES], 2, 9, 1, zero, 0, s == NUM_STRATEGIES ? ODD_HEADS : 0, 0, 0});
    if (world == 4)
        for (int zero = 0; zero <= 3; zero++)
            for (int U = 1; U <= 2; U++) add((ucase){"hybrid", 2, 9, 1, zero, 0, 0, U, 0});
    /* zigzag with 2P ∤ N (N = 11: chunks 3, 3, 3, 2) for the three
     * strategies, and 7 heads over the hybrid's U = 2 */
    if (world == 4)
        for (int zero = 0; zero <= 3; zero++) {
            add((ucase){"ring", 2, 11, 1, zero, 0, 0, 0, 1});
            add((ucase){"allgather-kv", 2, 11, 1, zero, 0, 0, 0, 1});
            add((ucase){"hybrid", 2, 11, 1, zero, 0, 0, 1, 1});
            add((ucase){"hybrid", 2, 9, 1, zero, 0, ODD_HEADS, 2, 1});
        }
    Suite *su = suite_create("uneven");
    TCase *tc = tcase_create("uneven_shares");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, split_shares);
    tcase_add_test(tc, alltoallv_moves_counts);
    tcase_add_test(tc, allgatherv_and_reduce_scatterv);
    tcase_add_loop_test(tc, equals_single_rank, 0, n_equal);
    tcase_add_loop_test(tc, zero_after_two_steps, n_equal, num_cases);
    suite_add_tcase(su, tc);
    return spb_run_suite_and_finalize(su);
}
