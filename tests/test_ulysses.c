/* Tests for the DeepSpeed-Ulysses strategy (strategies/ulysses.c), run under
 * mpiexec -np 4 (Check in no-fork mode: MPI does not survive fork).
 *
 * For P = 1, 2, 4 (world split into 4/P SP groups) every rank generates the
 * same random Q/K/V and dO for whole sequences, takes its N/P-token slice,
 * runs Ulysses forward and backward, and compares O and dQ/dK/dV of its slice
 * with spb_local_attention_* run on the whole sequence by one rank (all H
 * heads).  Tolerance: max |ulysses - reference| <= 1e-5 · max |reference|
 * per tensor.  Both sides call the same backend on the same rows in the same
 * order of keys (Ulysses only moves heads between ranks), so the results
 * agree to rounding (observed: bitwise equal, error 0); the tolerance only
 * leaves room for a kernel whose summation order depends on the head count,
 * while an indexing error in the all-to-all packing gives errors of order 1.
 *
 * The communication test checks that the accounting layer's recorded link
 * bytes for one layer equal comm_volume() exactly, the closed form
 * 16·b·N·h·(P−1)/P² bytes, and that doubling P at fixed N halves the payload
 * and scales link bytes by ((P₂−1)/P₂²)/((P₁−1)/P₁²).
 *
 * Each case runs Ulysses twice: the strategy reuses its buffers from call to
 * call, so the second call must allocate nothing and give the same bits
 * (stale contents, e.g. an unzeroed gradient accumulator, would show).
 *
 * Every pass/fail value is reduced over the world first, so all ranks take
 * the same branch and none is left waiting in a collective.
 * Set SPB_TEST_VERBOSE=1 to print the measured errors.
 */
#define _POSIX_C_SOURCE 200809L

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "comm.h"
#include "config.h"
#include "grid.h"
#include "local_attention.h"
#include "memory.h"
#include "rng.h"
#include "strategy.h"
#include "timer.h"

extern const spb_strategy spb_strategy_ulysses;

enum { BATCH = 2, HEADS = 8, HEAD_DIM = 16, SEQ = 96 };
#define REL_TOL 1e-5
#define SENTINEL 1234.5f
#define SEED 20230914u

static int world_rank, world_size;

static int verbose(void)
{
    const char *e = getenv("SPB_TEST_VERBOSE");
    return e && *e && strcmp(e, "0") != 0 && world_rank == 0;
}

static float *falloc(long n) { return spb_mem_alloc(SPB_MEM_WORKSPACE, sizeof(float) * (size_t)n); }

static void fill_normal(float *x, long n, uint64_t stream)
{
    for (long i = 0; i < n; i++) x[i] = (float)spb_rng_normal(SEED, stream, (uint64_t)i);
}

/* local[b][t][0..width) = full[b][first + t][0..width) for t < T. */
static void take_slice(const float *full, float *local, int N, int T, long first, long width)
{
    for (int b = 0; b < BATCH; b++)
        memcpy(local + (long)b * T * width, full + ((long)b * N + first) * width,
               sizeof(float) * (size_t)(T * width));
}

/* max |got - ref| / max |ref| over part s of [rows][parts][width] arrays. */
static double rel_err_part(const float *got, const float *ref, long rows, int parts, int s, long width)
{
    double max_diff = 0.0, max_ref = 0.0;
    for (long r = 0; r < rows; r++)
        for (long k = 0; k < width; k++) {
            long i = (r * parts + s) * width + k;
            double diff = fabs((double)got[i] - ref[i]);
            if (!(diff <= max_diff)) max_diff = diff; /* NaN propagates */
            if (fabs((double)ref[i]) > max_ref) max_ref = fabs((double)ref[i]);
        }
    return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

typedef struct case_result {
    double err_o, err_dqkv[3];            /* world max */
    double fwd_link, bwd_link;            /* recorded all-to-all bytes per link */
    double fwd_payload, bwd_payload;
    double fwd_calls, bwd_calls;
    double flops_fwd, flops_bwd;          /* this rank's counted FLOPs */
    double ref_flops_fwd, ref_flops_bwd;  /* whole sequence, all heads */
    double saved_floats;
    double exchange_s, alltoall_s;        /* SPB_T_EXCHANGE and the all-to-alls' own seconds */
    double rerun_allocated;               /* bytes a second identical call left allocated */
    double rerun_differs;                 /* 1 if the second call's O or dQKV bits differ */
} case_result;

/* The core hands Ulysses its local Q, K, V and takes O in P head blocks
 * (strategy.h, head_blocks): [B·T][w][H][D] <-> [P][B·T][w][H/P][D]. */
static void std_to_blocks(const float *std, float *blk, long rows, int w, int P, long row, int back)
{
    for (int j = 0; j < P; j++)
        for (long r = 0; r < rows; r++)
            for (int s = 0; s < w; s++) {
                float *b = blk + ((long)j * rows * w + r * w + s) * row;
                float *a = (float *)std + (r * w + s) * P * row + (long)j * row;
                if (back)
                    memcpy(a, b, sizeof(float) * (size_t)row);
                else
                    memcpy(b, a, sizeof(float) * (size_t)row);
            }
}

static case_result run_case(int N, int P, int causal, const spb_attn_backend *backend)
{
    case_result res = {0};
    spb_grid grid;
    spb_grid_create(&grid, MPI_COMM_WORLD, P);
    const int T = N / P;
    const long W = (long)HEADS * HEAD_DIM, first = (long)grid.sp_rank * T;

    /* Whole sequences, the same on every rank. */
    float *qkv_full = falloc((long)BATCH * N * 3 * W), *dout_full = falloc((long)BATCH * N * W);
    fill_normal(qkv_full, (long)BATCH * N * 3 * W, 1);
    fill_normal(dout_full, (long)BATCH * N * W, 2);

    /* Reference: one rank's view of the whole sequence. */
    long *ref_pos = malloc(sizeof(long) * (size_t)N);
    for (int t = 0; t < N; t++) ref_pos[t] = t;
    spb_attn_ctx ref = {.grid = &grid, .backend = backend, .batch = BATCH, .heads = HEADS,
                        .head_dim = HEAD_DIM, .tokens = N, .positions = ref_pos, .seq_length = N,
                        .causal = causal, .layer = 0, .phase = SPB_PHASE_FORWARD, .flops = &res.ref_flops_fwd};
    float *o_ref = falloc((long)BATCH * N * W), *dqkv_ref = falloc((long)BATCH * N * 3 * W);
    float *lse_ref = falloc((long)spb_local_attention_saved_floats(&ref));
    spb_local_attention_forward(&ref, qkv_full, o_ref, lse_ref);
    ref.phase = SPB_PHASE_BACKWARD;
    ref.flops = &res.ref_flops_bwd;
    spb_local_attention_backward(&ref, qkv_full, o_ref, lse_ref, dout_full, dqkv_ref);

    /* This rank's slice. */
    long *pos = malloc(sizeof(long) * (size_t)T);
    for (int t = 0; t < T; t++) pos[t] = first + t;
    float *qkv = falloc((long)BATCH * T * 3 * W), *dout = falloc((long)BATCH * T * W);
    {
        float *std = falloc((long)BATCH * T * 3 * W);
        take_slice(qkv_full, std, N, T, first, 3 * W);
        std_to_blocks(std, qkv, (long)BATCH * T, 3, P, W / P, 0);
        take_slice(dout_full, std, N, T, first, W);
        std_to_blocks(std, dout, (long)BATCH * T, 1, P, W / P, 0);
        spb_mem_free(std);
    }
    float *o_ref_slice = falloc((long)BATCH * T * W), *dqkv_ref_slice = falloc((long)BATCH * T * 3 * W);
    take_slice(o_ref, o_ref_slice, N, T, first, W);
    take_slice(dqkv_ref, dqkv_ref_slice, N, T, first, 3 * W);

    spb_config cfg; /* the strategy reads --ulysses-comm from it: the default, all-to-all */
    spb_config_defaults(&cfg);
    spb_attn_ctx ctx = {.cfg = &cfg, .grid = &grid, .backend = backend, .batch = BATCH, .heads = HEADS,
                        .head_dim = HEAD_DIM, .tokens = T, .positions = pos, .seq_length = N,
                        .causal = causal, .layer = 0, .phase = SPB_PHASE_FORWARD, .flops = NULL};
    size_t saved_n = spb_strategy_ulysses.attn_saved_floats(&ctx);
    res.saved_floats = (double)saved_n;
    float *saved = spb_mem_alloc(SPB_MEM_ACTIVATIONS, sizeof(float) * saved_n);

    /* Twice: the first call may size the strategy's reused buffers, the
     * second must allocate nothing and, starting from the first call's
     * leftovers in them, give the same bits. */
    float *o[2], *dqkv[2];
    double errs[4] = {0};
    size_t mem_before = 0;
    for (int run = 0; run < 2; run++) {
        o[run] = falloc((long)BATCH * T * W), dqkv[run] = falloc((long)BATCH * T * 3 * W);
        for (long i = 0; i < (long)BATCH * T * W; i++) o[run][i] = SENTINEL;
        for (long i = 0; i < (long)BATCH * T * 3 * W; i++) dqkv[run][i] = SENTINEL; /* must be overwritten */
        mem_before = spb_mem_get_stats()->current_total;
        double exchange_before = spb_timer_get(SPB_T_EXCHANGE);

        spb_comm_reset();
        ctx.phase = SPB_PHASE_FORWARD;
        ctx.flops = &res.flops_fwd;
        spb_strategy_ulysses.attention_forward(&ctx, qkv, o[run], saved);
        ctx.phase = SPB_PHASE_BACKWARD;
        ctx.flops = &res.flops_bwd;
        spb_strategy_ulysses.attention_backward(&ctx, qkv, o[run], saved, dout, dqkv[run]);

        const spb_comm_record *f = spb_comm_record_get(SPB_OP_ALLTOALL, SPB_PHASE_FORWARD);
        const spb_comm_record *b = spb_comm_record_get(SPB_OP_ALLTOALL, SPB_PHASE_BACKWARD);
        res.fwd_link = f->link_bytes, res.fwd_payload = f->payload_bytes, res.fwd_calls = (double)f->calls;
        res.bwd_link = b->link_bytes, res.bwd_payload = b->payload_bytes, res.bwd_calls = (double)b->calls;
        /* The exchange timer wraps the collectives' own timing. */
        res.exchange_s = spb_timer_get(SPB_T_EXCHANGE) - exchange_before;
        res.alltoall_s = f->seconds + b->seconds;
        if (run == 0) res.flops_fwd = res.flops_bwd = 0.0; /* keep one call's count */

        /* Back to [B·T][w][H][D], then compare with the reference rows of
         * this rank's tokens. */
        float *std = falloc((long)BATCH * T * 3 * W);
        std_to_blocks(std, o[run], (long)BATCH * T, 1, P, W / P, 1);
        memcpy(o[run], std, sizeof(float) * (size_t)(BATCH * T * W));
        std_to_blocks(std, dqkv[run], (long)BATCH * T, 3, P, W / P, 1);
        memcpy(dqkv[run], std, sizeof(float) * (size_t)(BATCH * T * 3 * W));
        spb_mem_free(std);
        double e = rel_err_part(o[run], o_ref_slice, (long)BATCH * T, 1, 0, W);
        if (!(e <= errs[0])) errs[0] = e;
        for (int s = 0; s < 3; s++) {
            e = rel_err_part(dqkv[run], dqkv_ref_slice, (long)BATCH * T, 3, s, W);
            if (!(e <= errs[1 + s])) errs[1 + s] = e;
        }
    }
    double rerun[2] = {
        (double)(spb_mem_get_stats()->current_total - mem_before),
        memcmp(o[0], o[1], sizeof(float) * (size_t)(BATCH * T * W)) ||
            memcmp(dqkv[0], dqkv[1], sizeof(float) * (size_t)(BATCH * T * 3 * W)),
    };
    spb_allreduce_max_f64(errs, 4, MPI_COMM_WORLD, SPB_PHASE_OTHER);
    spb_allreduce_max_f64(rerun, 2, MPI_COMM_WORLD, SPB_PHASE_OTHER);
    res.err_o = errs[0];
    for (int s = 0; s < 3; s++) res.err_dqkv[s] = errs[1 + s];
    res.rerun_allocated = rerun[0];
    res.rerun_differs = rerun[1];

    float *bufs[] = {qkv_full, dout_full, o_ref, dqkv_ref, lse_ref, qkv, dout, o[0], o[1], dqkv[0], dqkv[1],
                     saved, o_ref_slice, dqkv_ref_slice};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) spb_mem_free(bufs[i]);
    free(ref_pos);
    free(pos);
    spb_grid_destroy(&grid);
    return res;
}

static const int degrees[] = {1, 2, 4};
enum { NUM_DEGREES = sizeof degrees / sizeof degrees[0] };

static void check_against_reference(int N)
{
    const spb_attn_backend *backends[] = {&spb_attn_flash, &spb_attn_naive};
    for (int k = 0; k < NUM_DEGREES; k++) {
        int P = degrees[k];
        if (world_size % P) continue;
        for (int bi = 0; bi < 2; bi++)
            for (int causal = 0; causal <= 1; causal++) {
                case_result r = run_case(N, P, causal, backends[bi]);
                if (verbose())
                    printf("N=%d P=%d %s %s: O %.2e dQ %.2e dK %.2e dV %.2e\n", N, P, backends[bi]->name,
                           causal ? "causal" : "full", r.err_o, r.err_dqkv[0], r.err_dqkv[1], r.err_dqkv[2]);
                ck_assert_msg(r.err_o <= REL_TOL, "O: N=%d P=%d %s causal=%d rel err %g", N, P,
                              backends[bi]->name, causal, r.err_o);
                for (int s = 0; s < 3; s++)
                    ck_assert_msg(r.err_dqkv[s] <= REL_TOL, "d%c: N=%d P=%d %s causal=%d rel err %g", "QKV"[s],
                                  N, P, backends[bi]->name, causal, r.err_dqkv[s]);

                long Hp = HEADS / P;
                ck_assert(r.saved_floats ==
                          (double)BATCH * N * 4 * Hp * HEAD_DIM + (double)BATCH * Hp * N);
                /* Each rank counts its H/P heads over the whole sequence: P ranks = one reference. */
                ck_assert(r.flops_fwd * P == r.ref_flops_fwd && r.flops_fwd > 0);
                ck_assert(r.flops_bwd * P == r.ref_flops_bwd && r.flops_bwd > 0);
                ck_assert_msg(r.rerun_allocated == 0.0, "a repeated call allocated %g bytes", r.rerun_allocated);
                ck_assert_msg(r.rerun_differs == 0.0, "a repeated call gave other results");
                ck_assert(r.exchange_s > 0.0 && r.exchange_s >= r.alltoall_s - 1e-9); /* accumulator rounding */
            }
    }
}

START_TEST(test_matches_reference) { check_against_reference(SEQ); }
END_TEST

/* 60: T = 15 at P = 4, odd local lengths and flash tiles that do not divide N. */
START_TEST(test_matches_reference_odd_length) { check_against_reference(60); }
END_TEST

START_TEST(test_comm_bytes)
{
    spb_config cfg;
    spb_config_defaults(&cfg);
    cfg.micro_batch_size = BATCH;
    cfg.seq_length = SEQ;
    cfg.num_heads = HEADS;
    cfg.hidden_size = HEADS * HEAD_DIM;
    double link[NUM_DEGREES] = {0}, payload[NUM_DEGREES] = {0};
    for (int k = 0; k < NUM_DEGREES; k++) {
        int P = degrees[k];
        if (world_size % P) continue;
        cfg.sp_degree = P;
        case_result r = run_case(SEQ, P, 1, &spb_attn_flash);
        spb_comm_volume v = spb_strategy_ulysses.comm_volume(&cfg, P);
        if (verbose())
            printf("P=%d link bytes fwd %.0f bwd %.0f, analytic %.0f %.0f\n", P, r.fwd_link, r.bwd_link,
                   v.forward_bytes, v.backward_bytes);
        ck_assert_msg(r.fwd_link == v.forward_bytes, "P=%d forward: recorded %.17g, analytic %.17g", P,
                      r.fwd_link, v.forward_bytes);
        ck_assert_msg(r.bwd_link == v.backward_bytes, "P=%d backward: recorded %.17g, analytic %.17g", P,
                      r.bwd_link, v.backward_bytes);
        ck_assert(r.fwd_calls == 2 && r.bwd_calls == 2); /* QKV + O; dO + dQKV */
        /* The closed form: 16·b·N·h·(P−1)/P² bytes each way. */
        double closed = 16.0 * BATCH * SEQ * cfg.hidden_size * (P - 1) / ((double)P * P);
        ck_assert_msg(fabs(v.forward_bytes - closed) <= 1e-12 * closed, "P=%d: %.17g vs closed form %.17g", P,
                      v.forward_bytes, closed);
        ck_assert(v.backward_bytes == v.forward_bytes);
        link[k] = r.fwd_link + r.bwd_link;
        payload[k] = r.fwd_payload + r.bwd_payload;
    }
    ck_assert(link[0] == 0.0); /* P = 1: a local copy */
    if (world_size % 4 == 0) {
        /* P = 2 -> 4 at fixed N: each rank's buffer halves; the share it
         * sends grows from 1/2 to 3/4, so link bytes scale by 3/4. */
        ck_assert(payload[2] * 2.0 == payload[1]);
        double expected = (3.0 / 16.0) / (1.0 / 4.0);
        ck_assert_msg(fabs(link[2] / link[1] - expected) <= 1e-15, "P=4/P=2 link bytes %.17g, expected %.17g",
                      link[2] / link[1], expected);
    }
}
END_TEST

START_TEST(test_validate)
{
    spb_config cfg;
    spb_config_defaults(&cfg);
    char err[256] = "";
    cfg.num_heads = 3;
    cfg.sp_degree = 4;
    ck_assert_int_eq(spb_strategy_ulysses.validate(&cfg, 4, err, sizeof err), -1);
    ck_assert_str_eq(err, "--num-attention-heads 3 is not divisible by --sp-degree 4 and fewer: Ulysses gives "
                          "every rank at least one head");
    cfg.num_heads = 6; /* uneven head groups (2, 2, 1, 1): taken without GQA, refused with it */
    ck_assert_int_eq(spb_strategy_ulysses.validate(&cfg, 4, err, sizeof err), 0);
    cfg.num_query_groups = 2;
    ck_assert_int_eq(spb_strategy_ulysses.validate(&cfg, 4, err, sizeof err), -1);
    cfg.num_query_groups = 0;
    cfg.num_heads = 8;
    ck_assert_int_eq(spb_strategy_ulysses.validate(&cfg, 4, err, sizeof err), 0);
    cfg.sp_degree = 1;
    ck_assert_int_eq(spb_strategy_ulysses.validate(&cfg, 4, err, sizeof err), 0);
    ck_assert_str_eq(spb_strategy_ulysses.name, "ulysses");
    ck_assert(spb_strategy_ulysses.tp_degree == NULL && spb_strategy_ulysses.local_positions == NULL);
    ck_assert(spb_strategy_ulysses.enter_tp == NULL && spb_strategy_ulysses.exit_tp == NULL);
}
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);

    Suite *s = suite_create("ulysses");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_validate);
    tcase_add_test(tc, test_matches_reference);
    tcase_add_test(tc, test_matches_reference_odd_length);
    tcase_add_test(tc, test_comm_bytes);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* MPI does not survive fork */
    srunner_run_all(sr, world_rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);

    /* A failure on any rank fails every rank's exit status. */
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
