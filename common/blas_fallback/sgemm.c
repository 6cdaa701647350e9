/* cblas_sgemm in plain C for builds without OpenBLAS (cblas.h beside it).
 * C = alpha op(A) op(B) + beta C, loops ordered so the innermost one walks
 * memory contiguously where the layout allows: rows of B scaled into rows of
 * C when B is not transposed, dot products of rows when it is.  A few GFLOP/s
 * at best: enough for checks and small runs, not for timings. */
#include "cblas.h"

#include <stddef.h>

/* Row-major C[m][n]; at/bt: A, B transposed. */
static void sgemm_rows(int at, int bt, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc)
{
    for (int i = 0; i < m; i++) {
        float *c = C + (ptrdiff_t)i * ldc;
        for (int j = 0; j < n; j++) c[j] = beta == 0.0f ? 0.0f : beta * c[j]; /* beta 0: C may hold NaN */
        if (alpha == 0.0f) continue;
        if (!bt) {
            for (int l = 0; l < k; l++) {
                float a = alpha * (at ? A[(ptrdiff_t)l * lda + i] : A[(ptrdiff_t)i * lda + l]);
                const float *b = B + (ptrdiff_t)l * ldb;
                for (int j = 0; j < n; j++) c[j] += a * b[j];
            }
        } else {
            for (int j = 0; j < n; j++) {
                const float *b = B + (ptrdiff_t)j * ldb;
                float acc = 0.0f;
                if (!at) {
                    const float *a = A + (ptrdiff_t)i * lda;
                    for (int l = 0; l < k; l++) acc += a[l] * b[l];
                } else {
                    for (int l = 0; l < k; l++) acc += A[(ptrdiff_t)l * lda + i] * b[l];
                }
                c[j] += alpha * acc;
            }
        }
    }
}

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n, int k,
                 float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    int at = ta == CblasTrans, bt = tb == CblasTrans;
    if (order == CblasRowMajor)
        sgemm_rows(at, bt, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    else /* column-major C is row-major C^T = op(B)^T op(A)^T */
        sgemm_rows(bt, at, n, m, k, alpha, B, ldb, A, lda, beta, C, ldc);
}

char *openblas_get_corename(void) { return (char *)"fallback sgemm (slow)"; }
int openblas_get_num_threads(void) { return 1; }
