/* Tests for ring attention (strategies/ring.c), run under mpiexec with a
 * world of 4 ranks (any multiple of 4 works): for P in {1, 2, 4}, both
 * layouts, causal and full masks, the flash and naive backends, each rank's
 * O, log-sum-exp and dQKV against attention over the whole sequence
 * (spb_local_attention_*, same backend) at that rank's positions; the
 * recorded link bytes against comm_volume; the summed attention FLOPs against
 * the whole-sequence count; zigzag's causal load balance.
 *
 * Tolerance: max |ring - reference| <= 1e-5 * max |reference| per tensor
 * (floored at 0.1).  The ring result differs from the reference only by the
 * fp32 log-sum-exp merge of up to 2P partial results (a few roundings per
 * element, ~1e-7 relative) and by summing dK/dV contributions in another
 * order; an indexing, offset or rescaling bug gives errors of order 1e-2.
 *
 * Every rank checks its own tokens; the errors are reduced over the world
 * before asserting, so all ranks fail together (no-fork mode: a rank that
 * left a test early would leave the others waiting in a collective).
 * Set SPB_TEST_VERBOSE=1 to print the measured errors. */
#define _POSIX_C_SOURCE 200809L

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "grid.h"
#include "local_attention.h"
#include "rng.h"
#include "sp_parts.h"
#include "strategy.h"

extern const spb_strategy spb_strategy_ring;

enum { SEQ = 96, HEADS = 4, HEAD_DIM = 16, BATCH = 2, WIDTH = HEADS * HEAD_DIM };
#define REL_TOL 1e-5
#define REF_FLOOR 0.1
#define LSE_TOL 1e-5
#define SENTINEL 1234.5f
#define SEED 20240611u

static const spb_strategy *const ring = &spb_strategy_ring;

static int verbose(void)
{
    const char *e = getenv("SPB_TEST_VERBOSE");
    return e && *e && strcmp(e, "0") != 0;
}

static int world_rank(void)
{
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

static double world_max(double v)
{
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return v;
}

static void ring_config(spb_config *cfg, int P, const char *layout)
{
    spb_config_defaults(cfg);
    cfg->seq_length = SEQ;
    cfg->sp_degree = P;
    cfg->micro_batch_size = BATCH;
    cfg->num_heads = HEADS;
    cfg->hidden_size = WIDTH;
    snprintf(cfg->ring_layout, sizeof cfg->ring_layout, "%s", layout);
}

/* Full-sequence tensors, identical on every rank: values keyed by index. */
static float *random_tensor(long n, uint64_t stream)
{
    float *x = malloc(sizeof(float) * (size_t)n);
    for (long i = 0; i < n; i++) x[i] = (float)spb_rng_normal(SEED, stream, (uint64_t)i);
    return x;
}

/* Rows [B][N][width] -> this rank's rows [B][T][width] at positions. */
static void gather_rows(const float *full, float *local, long width, int T, const long *positions)
{
    for (int b = 0; b < BATCH; b++)
        for (int t = 0; t < T; t++)
            memcpy(local + ((long)b * T + t) * width, full + ((long)b * SEQ + positions[t]) * width,
                   sizeof(float) * (size_t)width);
}

/* max |got - ref| / max(max |ref|, floor) over rows [B][T] of `width`
 * elements starting at column col, `cols` of them; ref rows at positions. */
static double rel_err_rows(const float *got, long got_width, const float *ref, long ref_width, long col, long cols,
                           int T, const long *positions)
{
    double max_err = 0.0, max_ref = REF_FLOOR;
    for (int b = 0; b < BATCH; b++)
        for (int t = 0; t < T; t++)
            for (long e = 0; e < cols; e++) {
                double g = got[((long)b * T + t) * got_width + col + e];
                double x = ref[((long)b * SEQ + positions[t]) * ref_width + col + e];
                double err = fabs(g - x);
                if (!(err <= max_err)) max_err = isnan(err) ? INFINITY : err;
                if (fabs(x) > max_ref) max_ref = fabs(x);
            }
    return max_err / max_ref;
}

/* max |lse - ref| over [B][H][T] against the whole sequence's [B][H][N]. */
static double lse_err(const float *got, const float *ref, int T, const long *positions)
{
    double max_err = 0.0;
    for (int bh = 0; bh < BATCH * HEADS; bh++)
        for (int t = 0; t < T; t++) {
            double err = fabs((double)got[(long)bh * T + t] - ref[(long)bh * SEQ + positions[t]]);
            if (!(err <= max_err)) max_err = isnan(err) ? INFINITY : err;
        }
    return max_err;
}

typedef struct ring_result {
    double err_o, err_lse, err_dq, err_dk, err_dv;
    int bytes_ok;            /* recorded link bytes == comm_volume, both phases */
    double flops_fwd, flops_bwd; /* counted on this rank */
} ring_result;

/* One ring forward/backward on this rank's tokens against the whole-sequence
 * reference; errors are this rank's (not reduced). */
static ring_result run_ring(const spb_grid *grid, int P, const char *layout, int causal,
                            const spb_attn_backend *backend)
{
    ring_result res = {0};
    spb_config cfg;
    ring_config(&cfg, P, layout);
    ck_assert(!ring->validate); /* any N >= P, either layout, every device */

    /* Reference: the whole sequence on one rank. */
    float *qkv_full = random_tensor((long)BATCH * SEQ * 3 * WIDTH, 1);
    float *dout_full = random_tensor((long)BATCH * SEQ * WIDTH, 2);
    float *o_full = malloc(sizeof(float) * BATCH * SEQ * WIDTH);
    float *dqkv_full = malloc(sizeof(float) * BATCH * SEQ * 3 * WIDTH);
    long positions_full[SEQ];
    for (int t = 0; t < SEQ; t++) positions_full[t] = t;
    double ref_flops = 0.0;
    spb_attn_ctx full = {.grid = grid, .backend = backend, .batch = BATCH, .heads = HEADS, .head_dim = HEAD_DIM,
                         .tokens = SEQ, .positions = positions_full, .seq_length = SEQ, .causal = causal,
                         .phase = SPB_PHASE_FORWARD, .flops = &ref_flops};
    float *lse_full = malloc(sizeof(float) * spb_local_attention_saved_floats(&full));
    spb_local_attention_forward(&full, qkv_full, o_full, lse_full);
    double ref_flops_fwd = ref_flops;
    full.phase = SPB_PHASE_BACKWARD;
    spb_local_attention_backward(&full, qkv_full, o_full, lse_full, dout_full, dqkv_full);
    double ref_flops_bwd = ref_flops - ref_flops_fwd;

    /* This rank's tokens. */
    int T = SEQ / P;
    long *positions = malloc(sizeof(long) * (size_t)T);
    ring->local_positions(grid, &cfg, positions);
    float *qkv = malloc(sizeof(float) * (size_t)BATCH * T * 3 * WIDTH);
    float *dout = malloc(sizeof(float) * (size_t)BATCH * T * WIDTH);
    float *o = malloc(sizeof(float) * (size_t)BATCH * T * WIDTH);
    float *dqkv = malloc(sizeof(float) * (size_t)BATCH * T * 3 * WIDTH);
    gather_rows(qkv_full, qkv, 3 * WIDTH, T, positions);
    gather_rows(dout_full, dout, WIDTH, T, positions);
    /* Sentinels: both outputs must be overwritten entirely. */
    for (long i = 0; i < (long)BATCH * T * WIDTH; i++) o[i] = SENTINEL;
    for (long i = 0; i < (long)BATCH * T * 3 * WIDTH; i++) dqkv[i] = SENTINEL;

    spb_attn_ctx ctx = {.cfg = &cfg, .grid = grid, .backend = backend, .batch = BATCH, .heads = HEADS, .head_dim = HEAD_DIM,
                        .tokens = T, .positions = positions, .seq_length = SEQ, .causal = causal,
                        .phase = SPB_PHASE_FORWARD, .flops = &res.flops_fwd};
    float *saved = malloc(sizeof(float) * ring->attn_saved_floats(&ctx));
    spb_comm_reset();
    ring->attention_forward(&ctx, qkv, o, saved);
    ctx.phase = SPB_PHASE_BACKWARD;
    ctx.flops = &res.flops_bwd;
    ring->attention_backward(&ctx, qkv, o, saved, dout, dqkv);

    spb_comm_volume vol = ring->comm_volume(&cfg, P);
    double fwd_bytes = spb_comm_record_get(SPB_OP_SENDRECV, SPB_PHASE_FORWARD)->link_bytes;
    double bwd_bytes = spb_comm_record_get(SPB_OP_SENDRECV, SPB_PHASE_BACKWARD)->link_bytes;
    res.bytes_ok = fwd_bytes == vol.forward_bytes && bwd_bytes == vol.backward_bytes;
    if (!res.bytes_ok)
        fprintf(stderr, "rank %d P=%d %s: link bytes forward %.0f (model %.0f), backward %.0f (model %.0f)\n",
                grid->world_rank, P, layout, fwd_bytes, vol.forward_bytes, bwd_bytes, vol.backward_bytes);

    res.err_o = rel_err_rows(o, WIDTH, o_full, WIDTH, 0, WIDTH, T, positions);
    res.err_lse = lse_err(saved, lse_full, T, positions);
    res.err_dq = rel_err_rows(dqkv, 3 * WIDTH, dqkv_full, 3 * WIDTH, 0, WIDTH, T, positions);
    res.err_dk = rel_err_rows(dqkv, 3 * WIDTH, dqkv_full, 3 * WIDTH, WIDTH, WIDTH, T, positions);
    res.err_dv = rel_err_rows(dqkv, 3 * WIDTH, dqkv_full, 3 * WIDTH, 2 * WIDTH, WIDTH, T, positions);

    /* The SP group's counted FLOPs add up to the whole sequence's. */
    double group_flops[2] = {res.flops_fwd, res.flops_bwd};
    MPI_Allreduce(MPI_IN_PLACE, group_flops, 2, MPI_DOUBLE, MPI_SUM, grid->sp_comm);
    double flops_off = fabs(group_flops[0] - ref_flops_fwd) + fabs(group_flops[1] - ref_flops_bwd);
    ck_assert_msg(world_max(flops_off) == 0.0, "P=%d %s causal=%d: group FLOPs %.0f/%.0f, whole sequence %.0f/%.0f",
                  P, layout, causal, group_flops[0], group_flops[1], ref_flops_fwd, ref_flops_bwd);

    free(saved);
    free(dqkv);
    free(o);
    free(dout);
    free(qkv);
    free(positions);
    free(lse_full);
    free(dqkv_full);
    free(o_full);
    free(dout_full);
    free(qkv_full);
    return res;
}

static void check_matches_whole_sequence(const spb_attn_backend *backend)
{
    static const int degrees[] = {1, 2, 4};
    static const char *const layouts[] = {"contiguous", "zigzag"};
    for (int pi = 0; pi < 3; pi++)
        for (int li = 0; li < 2; li++)
            for (int causal = 0; causal <= 1; causal++) {
                int P = degrees[pi];
                spb_grid grid;
                spb_grid_create(&grid, MPI_COMM_WORLD, P);
                ring_result res = run_ring(&grid, P, layouts[li], causal, backend);
                double e_o = world_max(res.err_o), e_lse = world_max(res.err_lse);
                double e_dq = world_max(res.err_dq), e_dk = world_max(res.err_dk), e_dv = world_max(res.err_dv);
                int bytes_ok = (int)-world_max(-(double)res.bytes_ok);
                if (verbose() && world_rank() == 0)
                    printf("%s P=%d %-10s causal=%d: O %.2e lse %.2e dQ %.2e dK %.2e dV %.2e\n", backend->name, P,
                           layouts[li], causal, e_o, e_lse, e_dq, e_dk, e_dv);
                spb_grid_destroy(&grid);
                const char *what = layouts[li];
                ck_assert_msg(e_o <= REL_TOL, "%s P=%d %s causal=%d: O error %g", backend->name, P, what, causal, e_o);
                ck_assert_msg(e_lse <= LSE_TOL, "%s P=%d %s causal=%d: lse error %g", backend->name, P, what, causal,
                              e_lse);
                ck_assert_msg(e_dq <= REL_TOL, "%s P=%d %s causal=%d: dQ error %g", backend->name, P, what, causal,
                              e_dq);
                ck_assert_msg(e_dk <= REL_TOL, "%s P=%d %s causal=%d: dK error %g", backend->name, P, what, causal,
                              e_dk);
                ck_assert_msg(e_dv <= REL_TOL, "%s P=%d %s causal=%d: dV error %g", backend->name, P, what, causal,
                              e_dv);
                ck_assert_msg(bytes_ok, "%s P=%d %s causal=%d: recorded link bytes differ from comm_volume",
                              backend->name, P, what, causal);
            }
}

START_TEST(flash_matches_whole_sequence) { check_matches_whole_sequence(&spb_attn_flash); }
END_TEST

START_TEST(naive_matches_whole_sequence) { check_matches_whole_sequence(&spb_attn_naive); }
END_TEST

/* Causal, P = 4: the busiest rank counts fewer attention FLOPs with zigzag. */
START_TEST(zigzag_balances_causal_work)
{
    const int P = 4;
    spb_grid grid;
    spb_grid_create(&grid, MPI_COMM_WORLD, P);
    ring_result contiguous = run_ring(&grid, P, "contiguous", 1, &spb_attn_flash);
    ring_result zigzag = run_ring(&grid, P, "zigzag", 1, &spb_attn_flash);
    double max_contiguous = world_max(contiguous.flops_fwd + contiguous.flops_bwd);
    double max_zigzag = world_max(zigzag.flops_fwd + zigzag.flops_bwd);
    double min_zigzag = -world_max(-(zigzag.flops_fwd + zigzag.flops_bwd));
    if (verbose() && world_rank() == 0)
        printf("causal P=4 max FLOPs per rank: contiguous %.0f, zigzag %.0f (min %.0f)\n", max_contiguous, max_zigzag,
               min_zigzag);
    spb_grid_destroy(&grid);
    ck_assert_msg(max_zigzag < max_contiguous, "zigzag max %.0f >= contiguous max %.0f", max_zigzag, max_contiguous);
    /* Zigzag is exactly balanced: every rank sees 2P-1 whole chunk pairs and 2 diagonal ones. */
    ck_assert_msg(min_zigzag == max_zigzag, "zigzag FLOPs range %.0f..%.0f", min_zigzag, max_zigzag);
}
END_TEST

START_TEST(zigzag_positions)
{
    /* N = 16, P = 4: c = 2; rank r holds chunks r and 7 - r. */
    const int P = 4, N = 16, T = N / P;
    spb_grid grid;
    spb_grid_create(&grid, MPI_COMM_WORLD, P);
    spb_config cfg;
    ring_config(&cfg, P, "zigzag");
    cfg.seq_length = N;
    long positions[4];
    ring->local_positions(&grid, &cfg, positions);
    int r = grid.sp_rank;
    long expected[4] = {2L * r, 2L * r + 1, 2L * (7 - r), 2L * (7 - r) + 1};
    int ok = !memcmp(positions, expected, sizeof expected);
    /* Contiguous: [r T, (r+1) T). */
    snprintf(cfg.ring_layout, sizeof cfg.ring_layout, "contiguous");
    ring->local_positions(&grid, &cfg, positions);
    for (int t = 0; t < T; t++) ok &= positions[t] == (long)r * T + t;
    spb_grid_destroy(&grid);
    ck_assert_msg(-world_max(-(double)ok) == 1.0, "wrong positions");
}
END_TEST

START_TEST(zigzag_uneven_positions)
{
    /* N = 23, P = 4: 8 chunks of split.h's shares, 3 3 3 3 3 3 3 2; rank r
     * holds chunks r and 7 - r, so rank 0 holds 5 tokens (3 + 2) and the
     * others 6: the largest share is not rank 0's. */
    const int P = 4, N = 23;
    spb_grid grid;
    spb_grid_create(&grid, MPI_COMM_WORLD, P);
    spb_config cfg;
    ring_config(&cfg, P, "zigzag");
    cfg.seq_length = N;
    static const long expected[4][6] = {
        {0, 1, 2, 21, 22}, {3, 4, 5, 18, 19, 20}, {6, 7, 8, 15, 16, 17}, {9, 10, 11, 12, 13, 14}};
    int r = grid.sp_rank, T = ring->local_tokens(&grid, &cfg);
    long positions[6];
    ring->local_positions(&grid, &cfg, positions);
    int ok = T == (r ? 6 : 5) && !memcmp(positions, expected[r], sizeof(long) * (size_t)T);
    ok &= spb_ring_max_tokens(1, N, P) == 6 && spb_ring_owner_tokens(1, N, P, 0) == 5;
    spb_grid_destroy(&grid);
    ck_assert_msg(-world_max(-(double)ok) == 1.0, "wrong uneven zigzag positions");
}
END_TEST

START_TEST(comm_volume_formula)
{
    spb_config cfg;
    ring_config(&cfg, 4, "contiguous");
    /* b = 2, N = 96, h = 64, P = 4: one block = 2·2·24·64 floats = 24576 bytes. */
    spb_comm_volume v = ring->comm_volume(&cfg, 4);
    ck_assert(v.forward_bytes == 3 * 24576.0);
    ck_assert(v.backward_bytes == 7 * 24576.0);
    v = ring->comm_volume(&cfg, 1);
    ck_assert(v.forward_bytes == 0.0 && v.backward_bytes == 0.0);
}
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size % 4) {
        if (world_rank() == 0) fprintf(stderr, "test_ring needs a multiple of 4 ranks (got %d)\n", size);
        MPI_Finalize();
        return 1;
    }
    Suite *s = suite_create("ring");
    TCase *tc = tcase_create("ring attention");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, zigzag_uneven_positions);
    tcase_add_test(tc, comm_volume_formula);
    tcase_add_test(tc, zigzag_positions);
    tcase_add_test(tc, flash_matches_whole_sequence);
    tcase_add_test(tc, naive_matches_whole_sequence);
    tcase_add_test(tc, zigzag_balances_causal_work);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, world_rank() == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
