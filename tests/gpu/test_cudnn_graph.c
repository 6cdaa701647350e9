/* cuDNN attention's graphs (common/cuda/cudnn_attention.c), checked without
 * a GPU: every tensor and operation descriptor of the forward and backward
 * graph finalizes in the cuDNN library of this build (cuDNN checks data
 * types, attribute kinds and the products' dimensions there: a product whose
 * inner dimensions disagree is refused), for the descriptors the strategies
 * produce (fused QKV strides, ring's blocks on and below the diagonal, a
 * shifted diagonal, full masks, head dims 64 and 128; bf16 and fp16), no
 * two of a graph's tensors share a uid (cuDNN refuses that only when a GPU
 * finalizes the graph; the scale once had two); the graphs have the
 * operations the mask calls for; what the graph does not cover is refused
 * with its reason; grouped-query calls are refused and their expanded
 * calls (common/cuda/cuda_attention_gqa.h) finalize.  The operation graph, engine and plan need a GPU:
 * spbench-gpu-check runs them against the CPU reference. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "../check_run.h"
#include "cuda_attention_gqa.h"
#include "cudnn_attention.h"

/* describe() allocates nothing; the device allocator is not linked here. */
void *spb_cuda_grow(void **buf, size_t *cap, spb_mem_category cat, size_t bytes)
{
    (void)buf, (void)cap, (void)cat, (void)bytes;
    abort();
}

/* Self-attention over a fused [B][T][3][H][D] buffer, as gpt.c lays it out. */
static spb_attn_desc fused(int D, int T, int causal, long q_offset, long k_offset)
{
    const int B = 2, H = 4;
    long W = (long)H * D;
    spb_attn_desc d;
    memset(&d, 0, sizeof d);
    d.batch = B, d.heads = H, d.head_dim = D, d.q_len = T, d.k_len = T, d.causal = causal;
    d.q_offset = q_offset, d.k_offset = k_offset, d.scale = 0.125f;
    d.q_token_stride = 3 * W, d.q_batch_stride = 3 * W * T;
    d.k_token_stride = 2 * W, d.k_batch_stride = 2 * W * T; /* ring's travelling K/V block */
    d.o_token_stride = W, d.o_batch_stride = W * T;
    return d;
}

/* Operations per graph: the unmasked graph, + 4 for the causal mask (two
 * index generators, the comparison, the select), + 1 for a shifted diagonal. */
enum { FWD_PLAIN = 10, BWD_PLAIN = 18, MASK_OPS = 4, SHIFT_OPS = 1 };

START_TEST(test_graphs_finalize)
{
    char why[512];
    const int dims[] = {64, 128};
    for (int i = 0; i < 2; i++) {
        int D = dims[i];
        struct {
            spb_attn_desc d;
            int extra;
        } cases[] = {
            {fused(D, 128, 1, 0, 0), MASK_OPS},                /* own block, on the diagonal */
            {fused(D, 128, 1, 384, 128), 0},                   /* ring block wholly below it */
            {fused(D, 128, 1, 64, 0), MASK_OPS + SHIFT_OPS},   /* a shifted diagonal */
            {fused(D, 128, 1, 127, 0), 0},                     /* shift = k_len - 1: all visible */
            {fused(D, 128, 0, 0, 0), 0},                       /* full mask */
            {fused(D, 100, 1, 0, 0), MASK_OPS},                /* length off any tile size */
            {fused(D, 128, 0, 0, 0), 0},                       /* 128 queries, 64 keys (below) */
            {fused(D, 128, 1, 32, 0), MASK_OPS + SHIFT_OPS},   /* the same, causal, shifted */
        };
        /* Non-square blocks: a product with its operands the wrong way round
         * or untransposed has mismatched inner dimensions and is refused. */
        for (int c = 6; c < 8; c++) cases[c].d.k_len = 64;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int t = 0; t < 2; t++) { /* bf16, fp16 */
                spb_cudnn_half type = t ? SPB_CUDNN_FP16 : SPB_CUDNN_BF16;
                int fwd = spb_cudnn_attention_describe(&cases[c].d, type, 0, why, sizeof why);
                ck_assert_msg(fwd == FWD_PLAIN + cases[c].extra, "D=%d case %zu type %d forward: %d (%s)", D, c, t,
                              fwd, fwd < 0 ? why : "");
                int bwd = spb_cudnn_attention_describe(&cases[c].d, type, 1, why, sizeof why);
                ck_assert_msg(bwd == BWD_PLAIN + cases[c].extra, "D=%d case %zu type %d backward: %d (%s)", D, c, t,
                              bwd, bwd < 0 ? why : "");
            }
    }
}
END_TEST

START_TEST(test_refusals_say_why)
{
    char why[512];
    struct {
        spb_attn_desc d;
        const char *word;
    } cases[] = {{fused(64, 64, 1, 0, 0), "sparse"}, {fused(36, 64, 1, 0, 0), "head dim"},
                 {fused(256, 64, 1, 0, 0), "head dim"}, {fused(64, 64, 1, 0, 64), "without a visible key"},
                 {fused(64, 64, 1, 0, 0), "multiple of 8"}};
    cases[0].d.sparse_block = 16, cases[0].d.sparse_local = 1;
    cases[4].d.o_token_stride += 4;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ck_assert_int_eq(spb_cudnn_attention_supported(&cases[c].d, why, sizeof why), 0);
        ck_assert_msg(strstr(why, cases[c].word), "case %zu: '%s' lacks '%s'", c, why, cases[c].word);
        ck_assert_int_eq(spb_cudnn_attention_describe(&cases[c].d, SPB_CUDNN_BF16, 0, why, sizeof why), -1);
        ck_assert_int_eq(spb_cudnn_attention_describe(&cases[c].d, SPB_CUDNN_BF16, 1, why, sizeof why), -1);
    }
    /* the causal block below the diagonal is accepted */
    spb_attn_desc ok = fused(64, 64, 1, 64, 0);
    ck_assert_int_eq(spb_cudnn_attention_supported(&ok, why, sizeof why), 1);
}
END_TEST

/* Grouped-query attention (G K/V heads < H): the graph takes H K/V heads,
 * so the call itself is refused and the expanded call that
 * cuda_attention_gqa.h makes (K, V copied to [B][k_len][H][D]) finalizes
 * with the operations of the H-head call on the same mask; Q, O and the
 * mask are the call's own. */
START_TEST(test_grouped_query_expanded_graphs_finalize)
{
    char why[512];
    const int dims[] = {64, 128}, groups[] = {1, 2};
    for (int i = 0; i < 2; i++)
        for (int g = 0; g < 2; g++) {
            const int D = dims[i], G = groups[g], T = 96;
            struct {
                spb_attn_desc d;
                int extra;
            } cases[] = {{fused(D, T, 1, 0, 0), MASK_OPS},
                         {fused(D, T, 1, 2 * T, T), 0}, /* a ring block below the diagonal */
                         {fused(D, T, 1, 32, 0), MASK_OPS + SHIFT_OPS},
                         {fused(D, T, 0, 0, 0), 0}};
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
                spb_attn_desc *d = &cases[c].d;
                const long W = (long)(d->heads + 2 * G) * D; /* a fused row [H Q | G K | G V] */
                d->kv_heads = G;
                d->q_token_stride = d->k_token_stride = W, d->q_batch_stride = d->k_batch_stride = W * T;
                ck_assert_int_eq(spb_cudnn_attention_supported(d, why, sizeof why), 0);
                ck_assert_msg(strstr(why, "K/V heads"), "G=%d case %zu: '%s'", G, c, why);
                const spb_attn_desc e = spb_attn_gqa_expanded_desc(d);
                ck_assert_int_eq(e.kv_heads, d->heads);
                ck_assert_int_eq(e.k_token_stride, (long)d->heads * D);
                ck_assert_int_eq(e.k_batch_stride, (long)T * d->heads * D);
                ck_assert(e.q_token_stride == d->q_token_stride && e.o_batch_stride == d->o_batch_stride &&
                          e.causal == d->causal && e.q_offset == d->q_offset && e.k_offset == d->k_offset);
                ck_assert_int_eq(spb_attn_gqa_expanded_elems(d), 2L * T * d->heads * D);
                for (int t = 0; t < 2; t++) {
                    spb_cudnn_half type = t ? SPB_CUDNN_FP16 : SPB_CUDNN_BF16;
                    int fwd = spb_cudnn_attention_describe(&e, type, 0, why, sizeof why);
                    ck_assert_msg(fwd == FWD_PLAIN + cases[c].extra, "D=%d G=%d case %zu type %d forward: %d (%s)",
                                  D, G, c, t, fwd, fwd < 0 ? why : "");
                    int bwd = spb_cudnn_attention_describe(&e, type, 1, why, sizeof why);
                    ck_assert_msg(bwd == BWD_PLAIN + cases[c].extra, "D=%d G=%d case %zu type %d backward: %d (%s)",
                                  D, G, c, t, bwd, bwd < 0 ? why : "");
                }
            }
        }
}
END_TEST

START_TEST(test_version_names_cudnn_9)
{
    ck_assert_int_eq(spb_cudnn_attention_built(), 1);
    ck_assert_ptr_nonnull(strstr(spb_cudnn_attention_version(), "cuDNN 9."));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cudnn_graph");
    TCase *tc = tcase_create("host");
    tcase_add_test(tc, test_graphs_finalize);
    tcase_add_test(tc, test_refusals_say_why);
    tcase_add_test(tc, test_grouped_query_expanded_graphs_finalize);
    tcase_add_test(tc, test_version_names_cudnn_9);
    suite_add_tcase(s, tc);
    return spb_run_suite(s, CK_NOFORK);
}
