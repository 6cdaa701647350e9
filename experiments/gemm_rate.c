/* OpenBLAS's own sgemm rate on the matrix products of one GPT training step
 * (forward, dinput, dweight of QKV, projection, both MLP layers and the LM
 * head), the yardstick for spbench's GEMM share.
 * Usage: gemm_rate ROWS HIDDEN FFN VOCAB [REPEATS] */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: gemm_rate ROWS HIDDEN FFN VOCAB [REPEATS]\n");
        return 2;
    }
    int R = atoi(argv[1]), C = atoi(argv[2]), F = atoi(argv[3]), V = atoi(argv[4]);
    int reps = argc > 5 ? atoi(argv[5]) : 5;
    if (R <= 0 || C <= 0 || F <= 0 || V <= 0 || reps <= 0) {
        fprintf(stderr, "gemm_rate: sizes must be positive\n");
        return 2;
    }
    /* (name, out features, in features): y[R][out] = x[R][in] W[out][in]^T */
    struct {
        const char *name;
        int out, in;
    } layers[] = {{"qkv", 3 * C, C}, {"proj", C, C}, {"fc", F, C}, {"fcproj", C, F}, {"lm_head", V, C}};
    int big = F > V ? F : V;
    if (3 * C > big)
        big = 3 * C;
    size_t n = (size_t)R * big + (size_t)big * big;
    float *A = calloc(n, 4), *B = calloc(n, 4), *Cm = calloc(n, 4);
    for (size_t i = 0; i < n; i++)
        A[i] = B[i] = (float)((i % 13) * 0.01);
    double total_flops = 0, total_time = 0;
    /* Pass 0 warms caches, pages and the clock; pass 1 is reported. */
    for (int pass = 0; pass < 2; pass++) {
        total_flops = total_time = 0;
        if (pass)
            printf("%-8s %-3s %6s %6s %6s %10s\n", "layer", "op", "m", "n", "k", "GFLOP/s");
        for (size_t l = 0; l < sizeof layers / sizeof layers[0]; l++) {
            int o = layers[l].out, in = layers[l].in;
            for (int op = 0; op < 3; op++) {
                int m, nn, k;
                double t[64];
                for (int r = 0; r < reps && r < 64; r++) {
                    double t0 = now();
                    if (op == 0) { /* forward: x W^T */
                        m = R, nn = o, k = in;
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nn, k, 1, A, k, B, k, 0, Cm, nn);
                    } else if (op == 1) { /* dinput: dy W */
                        m = R, nn = in, k = o;
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, nn, k, 1, A, k, B, nn, 0, Cm, nn);
                    } else { /* dweight: dy^T x */
                        m = o, nn = in, k = R;
                        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, nn, k, 1, A, m, B, nn, 1, Cm, nn);
                    }
                    t[r] = now() - t0;
                }
                int used = reps < 64 ? reps : 64;
                qsort(t, (size_t)used, sizeof(double), cmp);
                double med = t[used / 2], flops = 2.0 * m * nn * k;
                if (pass)
                    printf("%-8s %-3s %6d %6d %6d %10.2f\n", layers[l].name,
                           op == 0   ? "fwd"
                           : op == 1 ? "dx"
                                     : "dw",
                           m, nn, k, flops / med / 1e9);
                total_flops += flops;
                total_time += med;
            }
        }
    }
    printf("gemm_rate_gflops %.2f\n", total_flops / total_time / 1e9);
    free(A), free(B), free(Cm);
    return 0;
}
