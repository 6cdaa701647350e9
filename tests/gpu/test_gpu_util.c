/* Host logic of the CUDA backend, tested without a GPU:
 *  - the Ulysses index maps (common/cuda/ulysses_layout.h) that the device
 *    permute kernels use, against strategies/ulysses.c's layouts: its
 *    blocks_to_head / head_to_blocks memcpy loops (re-stated here, they are
 *    static there) and the head-block send layout documented there
 *    (block j = heads [j·Hp, (j+1)·Hp) of every local token);
 *  - bf16 rounding on the host (round to nearest even, NaN, overflow);
 *  - the error metric and the tolerance bounds;
 *  - the median and the CSV writer (quoting, header once, directories). */
#define _POSIX_C_SOURCE 200809L

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check_run.h"
#include "gpu_util.h"
#include "ulysses_layout.h"

/* ulysses.c's blocks_to_head, element type float, as it is written there */
static void ref_blocks_to_head(const float *blocks, float *head, int P, int B, int T, int w, int Hp, int D)
{
    long seq_chunk = (long)T * w * Hp * D;
    size_t bytes = sizeof(float) * (size_t)seq_chunk;
    for (int i = 0; i < P; i++)
        for (int b = 0; b < B; b++)
            memcpy(head + ((long)b * P + i) * seq_chunk, blocks + ((long)i * B + b) * seq_chunk, bytes);
}

START_TEST(test_head_index_matches_ulysses)
{
    const spb_ulysses_layout shapes[] = {{2, 1, 3, 3, 2, 4}, {4, 2, 5, 3, 1, 8}, {3, 3, 2, 1, 2, 2}, {1, 2, 4, 3, 3, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        spb_ulysses_layout u = shapes[s];
        long n = spb_ulysses_numel(u);
        float *src = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
        char *seen = calloc((size_t)n, 1);
        for (long i = 0; i < n; i++) src[i] = (float)i;
        ref_blocks_to_head(src, ref, u.P, u.B, u.T, u.w, u.Hp, u.D);
        for (long i = 0; i < n; i++) {
            long j = spb_ulysses_head_index(u, i);
            ck_assert(j >= 0 && j < n);
            ck_assert_msg(!seen[j], "head index not a bijection");
            seen[j] = 1;
            got[j] = src[i];
        }
        ck_assert(memcmp(got, ref, sizeof(float) * n) == 0);
        free(src), free(ref), free(got), free(seen);
    }
}
END_TEST

START_TEST(test_pack_index_head_blocks)
{
    spb_ulysses_layout u = {4, 2, 3, 3, 2, 4}; /* H = 8 heads, w = 3 (q, k, v) */
    long n = spb_ulysses_numel(u);
    char *seen = calloc((size_t)n, 1);
    long H = (long)u.P * u.Hp;
    for (int b = 0; b < u.B; b++)
        for (int t = 0; t < u.T; t++)
            for (int wi = 0; wi < u.w; wi++)
                for (long hh = 0; hh < H; hh++)
                    for (int d = 0; d < u.D; d++) {
                        long src = ((((long)b * u.T + t) * u.w + wi) * H + hh) * u.D + d; /* natural */
                        long j = hh / u.Hp, h = hh % u.Hp;
                        /* block j holds [B][T][w][Hp][D] of heads j·Hp.. */
                        long want = j * ((long)u.B * u.T * u.w * u.Hp * u.D) +
                                    ((((long)b * u.T + t) * u.w + wi) * u.Hp + h) * u.D + d;
                        long got = spb_ulysses_pack_index(u, src);
                        ck_assert_int_eq(got, want);
                        ck_assert(!seen[got]);
                        seen[got] = 1;
                    }
    free(seen);
}
END_TEST

START_TEST(test_pack_then_head_is_alltoall)
{
    /* Simulate the whole exchange for P ranks: each rank packs its natural
     * QKV into head blocks, the all-to-all sends block j to rank j (rank r
     * receives block r of every rank i at position i), then blocks_to_head.
     * Rank r must end with heads [r·Hp, (r+1)·Hp) of all N tokens, token
     * i·T + t coming from rank i's local token t. */
    const int P = 3, B = 2, T = 2, w = 3, Hp = 2, D = 2, H = P * Hp;
    spb_ulysses_layout u = {P, B, T, w, Hp, D};
    long n = spb_ulysses_numel(u), blk = n / P;
    float *natural[3], *packed[3];
    for (int i = 0; i < P; i++) {
        natural[i] = malloc(sizeof(float) * n);
        packed[i] = malloc(sizeof(float) * n);
        for (long e = 0; e < n; e++) natural[i][e] = (float)(i * 100000 + e);
        for (long e = 0; e < n; e++) packed[i][spb_ulysses_pack_index(u, e)] = natural[i][e];
    }
    float *recv = malloc(sizeof(float) * n), *head = malloc(sizeof(float) * n);
    for (int r = 0; r < P; r++) {
        for (int i = 0; i < P; i++) memcpy(recv + i * blk, packed[i] + r * blk, sizeof(float) * blk);
        for (long e = 0; e < n; e++) head[spb_ulysses_head_index(u, e)] = recv[e];
        for (int b = 0; b < B; b++)
            for (int i = 0; i < P; i++)
                for (int t = 0; t < T; t++)
                    for (int wi = 0; wi < w; wi++)
                        for (int h = 0; h < Hp; h++)
                            for (int d = 0; d < D; d++) {
                                long tok = (long)i * T + t; /* global token of sequence b */
                                float got = head[((((long)b * P * T + tok) * w + wi) * Hp + h) * D + d];
                                float want = natural[i][((((long)b * T + t) * w + wi) * H + (r * Hp + h)) * D + d];
                                ck_assert(got == want);
                            }
    }
    for (int i = 0; i < P; i++) free(natural[i]), free(packed[i]);
    free(recv), free(head);
}
END_TEST

START_TEST(test_bf16_rounding)
{
    ck_assert(spb_bf16_round(1.0f) == 1.0f);
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0) */
    ck_assert(spb_bf16_round(1.0f + 1.0f / 256) == 1.0f);
    /* 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6) */
    ck_assert(spb_bf16_round(1.0f + 3.0f / 256) == 1.0f + 1.0f / 64);
    ck_assert(spb_bf16_round(1.0f + 1.0f / 256 + 1.0f / 4096) == 1.0f + 1.0f / 128);
    ck_assert(spb_bf16_from_f32(-2.0f) == 0xc000);
    ck_assert(isnan(spb_bf16_round(NAN)));
    ck_assert(isinf(spb_bf16_round(INFINITY)));
    ck_assert(isinf(spb_bf16_round(3.4e38f))); /* rounds past the largest bf16 */
    /* relative error of the rounding <= u = 2^-8 over many values */
    double worst = 0;
    for (int i = 1; i < 200000; i++) {
        float x = (float)i * 0.001234567f;
        double e = fabs((double)spb_bf16_round(x) - x) / x;
        if (e > worst) worst = e;
    }
    ck_assert(worst <= SPB_BF16_U);
    ck_assert(worst > SPB_BF16_U * 0.99); /* and the bound is reached */
}
END_TEST

START_TEST(test_error_metric_and_bounds)
{
    float want[4] = {1, -2, 4, 0}, got[4] = {1, -2, 4.04f, 0.02f};
    ck_assert(fabs(spb_max_rel_err(got, want, 4) - 0.01) < 1e-6);
    ck_assert(spb_max_rel_err(want, want, 4) == 0.0);
    float z[2] = {0, 0}, nz[2] = {0, 1e-3f};
    ck_assert(spb_max_rel_err(z, z, 2) == 0.0);
    ck_assert(spb_max_rel_err(nz, z, 2) == 1.0);
    float a[2] = {-INFINITY, 1}, b[2] = {-INFINITY, 1}, c[2] = {0, 1}, d[2] = {NAN, 1};
    ck_assert(spb_max_rel_err(a, b, 2) == 0.0);
    ck_assert(isinf(spb_max_rel_err(c, b, 2)));
    ck_assert(isinf(spb_max_rel_err(d, b, 2)));
    /* bounds: ordered, growing like sqrt(K), bf16 ones above u */
    ck_assert(spb_tol_bf16_out() > SPB_BF16_U && spb_tol_bf16_out() < 1.001 * SPB_BF16_U);
    ck_assert(fabs(spb_tol_f32_sum(400) / spb_tol_f32_sum(100) - 2.0) < 1e-12);
    ck_assert(spb_tol_f32_sum(16384) < SPB_BF16_U / 10); /* fp32 accumulation never dominates */
    ck_assert(spb_tol_bf16_sum(4096) > SPB_BF16_U && spb_tol_bf16_sum(4096) < 2 * SPB_BF16_U);
    ck_assert(spb_tol_attn_forward() < spb_tol_attn_backward());
    ck_assert(spb_tol_attn_backward() <= 0.05); /* an indexing bug gives O(1) */
}
END_TEST

START_TEST(test_median)
{
    double x[5] = {5, 1, 4, 2, 3}, y[4] = {4, 1, 3, 2};
    ck_assert(spb_median(x, 5) == 3.0);
    ck_assert(spb_median(y, 4) == 2.5);
    ck_assert(spb_median(x, 1) == 5.0);
    ck_assert(x[0] == 5 && x[1] == 1); /* input untouched */
}
END_TEST

START_TEST(test_csv)
{
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/spb_gpu_util_%d/a/b", (int)getpid());
    for (int pass = 0; pass < 2; pass++) {
        FILE *f = spb_csv_open(dir, "t.csv", "x,y,z");
        ck_assert_ptr_nonnull(f);
        spb_csv_field(f, "plain", 0);
        spb_csv_field(f, "with,comma", 0);
        spb_csv_field(f, "say \"hi\"", 1);
        fclose(f);
    }
    char path[512], buf[512];
    snprintf(path, sizeof path, "%s/t.csv", dir);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    ck_assert_str_eq(buf, "x,y,z\nplain,\"with,comma\",\"say \"\"hi\"\"\"\nplain,\"with,comma\",\"say \"\"hi\"\"\"\n");
    unlink(path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gpu_util");
    TCase *tc = tcase_create("host");
    tcase_add_test(tc, test_head_index_matches_ulysses);
    tcase_add_test(tc, test_pack_index_head_blocks);
    tcase_add_test(tc, test_pack_then_head_is_alltoall);
    tcase_add_test(tc, test_bf16_rounding);
    tcase_add_test(tc, test_error_metric_and_bounds);
    tcase_add_test(tc, test_median);
    tcase_add_test(tc, test_csv);
    suite_add_tcase(s, tc);
    return spb_run_suite(s, CK_NOFORK);
}
