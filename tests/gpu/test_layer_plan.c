/* Host arithmetic of the device layer's timings (common/cuda/layer_plan.h),
 * tested without a GPU:
 *  - the paper's per-layer FLOPs: the closed form, Megatron's factored form
 *    24·B·s·h²·(1 + s/(6h)), and the executed count of a full-attention
 *    layer with F = 4h (which must coincide with it);
 *  - visible query-key pairs of a block in closed form against attention.h's
 *    per-row spb_attn_visible_keys;
 *  - the strategy shapes at P = 8 (tokens, heads, ffn columns, ring rank)
 *    and that the per-rank work adds up to the layer's: Megatron-SP and
 *    Ulysses split it exactly P ways, ring's ranks together cover every
 *    causal pair once;
 *  - the data-sheet peak table. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../check_run.h"
#include "attention.h"
#include "layer_plan.h"

static int close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * fmax(fabs(a), fabs(b)); }

START_TEST(test_paper_flops)
{
    const double s = 32768, h = 4096;
    double fwd = spb_layer_paper_flops_fwd(1, s, h);
    ck_assert(close_rel(fwd, 24.0 * s * h * h * (1.0 + s / (6.0 * h)), 1e-14));
    ck_assert(close_rel(fwd, 24.0 * s * h * h + 4.0 * s * s * h, 1e-14));
    ck_assert(close_rel(spb_layer_paper_flops_fwd_bwd(2, s, h), 6.0 * fwd, 1e-14));
    /* the 7B layer at 32K tokens: 1.319e13 (products) + 1.759e13 (attention) */
    ck_assert(close_rel(fwd, 3.0786e13, 1e-4));
    /* executed, full attention, F = 4h: the same count */
    spb_cuda_layer_shape sh;
    ck_assert_int_eq(spb_layer_strategy_shape("layer", 8, 4096, 1, 4096, 32, 128, 16384, 0, &sh), 0);
    ck_assert(close_rel(spb_layer_exec_flops_fwd(&sh), spb_layer_paper_flops_fwd(1, 4096, 4096), 1e-12));
    ck_assert(close_rel(spb_layer_exec_flops_fwd_bwd(&sh), spb_layer_paper_flops_fwd_bwd(1, 4096, 4096), 1e-12));
    /* causal: the attention part halves (plus the diagonal) */
    ck_assert_int_eq(spb_layer_strategy_shape("layer", 8, 4096, 1, 4096, 32, 128, 16384, 1, &sh), 0);
    double prod = 24.0 * 4096.0 * 4096.0 * 4096.0, attn = 4.0 * 128 * 32 * (4096.0 * 4097.0 / 2.0);
    ck_assert(close_rel(spb_layer_exec_flops_fwd(&sh), prod + attn, 1e-12));
}
END_TEST

START_TEST(test_block_pairs_match_attention_h)
{
    const long qs[] = {1, 7, 64, 100};
    const long offs[] = {0, 3, 64, 100, 250};
    for (int causal = 0; causal < 2; causal++)
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 4; b++)
                for (size_t c = 0; c < 5; c++)
                    for (size_t e = 0; e < 5; e++) {
                        spb_attn_desc d = {0};
                        d.batch = 1, d.heads = 1, d.q_len = (int)qs[a], d.k_len = (int)qs[b];
                        d.q_offset = offs[c], d.k_offset = offs[e], d.causal = causal;
                        double want = spb_attn_visible_pairs(&d);
                        double got = spb_layer_block_pairs(qs[a], offs[c], qs[b], offs[e], causal);
                        ck_assert_msg(got == want, "q=%ld@%ld k=%ld@%ld causal=%d: %g != %g", qs[a], offs[c], qs[b],
                                      offs[e], causal, got, want);
                    }
}
END_TEST

START_TEST(test_strategy_shapes_p8)
{
    spb_cuda_layer_shape s;
    const long N = 32768;
    ck_assert_int_eq(spb_layer_strategy_shape("megatron-sp", 8, N, 1, 4096, 32, 128, 16384, 1, &s), 0);
    ck_assert_int_eq(s.T, 32768); ck_assert_int_eq(s.H, 4); ck_assert_int_eq(s.F, 2048);
    ck_assert_int_eq(s.attn, SPB_LAYER_ATTN_LOCAL); ck_assert_int_eq(spb_layer_attn_heads(&s), 4);
    ck_assert_int_eq(spb_layer_strategy_shape("ulysses", 8, N, 1, 4096, 32, 128, 16384, 1, &s), 0);
    ck_assert_int_eq(s.T, 4096); ck_assert_int_eq(s.H, 32); ck_assert_int_eq(s.F, 16384);
    ck_assert_int_eq(s.attn, SPB_LAYER_ATTN_ULYSSES); ck_assert_int_eq(s.P, 8);
    ck_assert_int_eq(spb_layer_attn_heads(&s), 4);
    ck_assert(spb_layer_attn_pairs(&s) == 32768.0 * 32769.0 / 2.0);
    ck_assert_int_eq(spb_layer_strategy_shape("ring", 8, N, 1, 4096, 32, 128, 16384, 1, &s), 0);
    ck_assert_int_eq(s.T, 4096); ck_assert_int_eq(s.attn, SPB_LAYER_ATTN_RING); ck_assert_int_eq(s.ring_rank, 7);
    /* the busiest rank: 7 full blocks and the diagonal */
    ck_assert(spb_layer_attn_pairs(&s) == 7.0 * 4096 * 4096 + 4096.0 * 4097.0 / 2.0);
    ck_assert_int_eq(spb_layer_strategy_shape("ring-zigzag", 8, N, 1, 4096, 32, 128, 16384, 1, &s), 0);
    ck_assert_int_eq(s.T, 4096); ck_assert_int_eq(s.attn, SPB_LAYER_ATTN_RING_ZIGZAG); ck_assert_int_eq(s.P, 8);
    /* chunks of 2048: rank 7 holds chunks 7 and 8; key block j chunks j and
     * 15 - j.  Chunk 7 sees chunks 0..6 whole and itself as the diagonal;
     * chunk 8 sees 0..7 whole and itself: 15 whole chunks, 2 diagonals,
     * which is an eighth of the layer's N(N+1)/2 */
    ck_assert(spb_layer_attn_pairs(&s) == 15.0 * 2048 * 2048 + 2.0 * 2048.0 * 2049.0 / 2.0);
    ck_assert(spb_layer_attn_pairs(&s) == 32768.0 * 32769.0 / 2.0 / 8.0);
    /* refusals */
    ck_assert_int_eq(spb_layer_strategy_shape("ring-zigzag", 8, 32768 + 8, 1, 4096, 32, 128, 16384, 1, &s), -1);
    ck_assert_int_eq(spb_layer_strategy_shape("ulysses", 8, 4100, 1, 4096, 32, 128, 16384, 1, &s), -1);
    ck_assert_int_eq(spb_layer_strategy_shape("ulysses", 64, 32768, 1, 4096, 32, 128, 16384, 1, &s), -1);
    ck_assert_int_eq(spb_layer_strategy_shape("megatron-sp", 3, 32768, 1, 4096, 32, 128, 16384, 1, &s), -1);
    ck_assert_int_eq(spb_layer_strategy_shape("zigzag", 8, 32768, 1, 4096, 32, 128, 16384, 1, &s), -1);
}
END_TEST

START_TEST(test_per_rank_work_adds_up)
{
    const int P = 8;
    for (int causal = 0; causal < 2; causal++)
        for (long N = 4096; N <= 32768; N *= 2) {
            spb_cuda_layer_shape L, s;
            ck_assert_int_eq(spb_layer_strategy_shape("layer", P, N, 1, 4096, 32, 128, 16384, causal, &L), 0);
            double whole = spb_layer_exec_flops_fwd(&L);
            ck_assert_int_eq(spb_layer_strategy_shape("megatron-sp", P, N, 1, 4096, 32, 128, 16384, causal, &s), 0);
            ck_assert(close_rel(P * spb_layer_exec_flops_fwd(&s), whole, 1e-12));
            ck_assert_int_eq(spb_layer_strategy_shape("ulysses", P, N, 1, 4096, 32, 128, 16384, causal, &s), 0);
            ck_assert(close_rel(P * spb_layer_exec_flops_fwd(&s), whole, 1e-12));
            /* ring: every rank's blocks together are the layer's pairs */
            ck_assert_int_eq(spb_layer_strategy_shape("ring", P, N, 1, 4096, 32, 128, 16384, causal, &s), 0);
            double pairs = 0.0;
            for (int r = 0; r < P; r++) {
                s.ring_rank = r;
                pairs += spb_layer_attn_pairs(&s);
            }
            ck_assert(pairs == spb_layer_attn_pairs(&L));
            s.ring_rank = P - 1;
            if (!causal) ck_assert(close_rel(P * spb_layer_exec_flops_fwd(&s), whole, 1e-12));
            else ck_assert(P * spb_layer_exec_flops_fwd(&s) > whole); /* the last rank works more than 1/P */
            /* zigzag: the ranks' blocks cover the layer's pairs, each rank an
             * equal share (the layout's point), so any rank's work x P is the layer's */
            ck_assert_int_eq(spb_layer_strategy_shape("ring-zigzag", P, N, 1, 4096, 32, 128, 16384, causal, &s), 0);
            pairs = 0.0;
            for (int r = 0; r < P; r++) {
                s.ring_rank = r;
                pairs += spb_layer_attn_pairs(&s);
                ck_assert(P * spb_layer_attn_pairs(&s) == spb_layer_attn_pairs(&L));
            }
            ck_assert(pairs == spb_layer_attn_pairs(&L));
            ck_assert(close_rel(P * spb_layer_exec_flops_fwd(&s), whole, 1e-12));
        }
}
END_TEST

START_TEST(test_peak_table)
{
    ck_assert(spb_gpu_dense_bf16_peak_tflops("NVIDIA H200") == 989.4);
    ck_assert(spb_gpu_dense_bf16_peak_tflops("NVIDIA H200 NVL") == 835.5);
    ck_assert(spb_gpu_dense_bf16_peak_tflops("NVIDIA H100 80GB HBM3") == 989.4);
    ck_assert(spb_gpu_dense_bf16_peak_tflops("NVIDIA H100 PCIe") == 756.0);
    ck_assert(spb_gpu_dense_bf16_peak_tflops("NVIDIA H100 NVL") == 835.5);
    ck_assert(spb_gpu_dense_bf16_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0);
    ck_assert(spb_gpu_dense_bf16_peak_tflops("Tesla V100-SXM2-16GB") == 0.0);
    ck_assert(spb_gpu_dense_bf16_peak_tflops(NULL) == 0.0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("layer_plan");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_paper_flops);
    tcase_add_test(tc, test_block_pairs_match_attention_h);
    tcase_add_test(tc, test_strategy_shapes_p8);
    tcase_add_test(tc, test_per_rank_work_adds_up);
    tcase_add_test(tc, test_peak_table);
    suite_add_tcase(s, tc);
    return spb_run_suite(s, CK_NOFORK);
}
