/* What spbench-gpu-check needs from the rest of the runtime when it is built
 * without MPI (experiments/gpu-check on a GPU machine with no MPI, OpenBLAS or
 * Check): the abort path and the category names that common/checks.c and
 * common/memory.c provide in the full build, and, with
 * SPB_STANDALONE_CBLAS, a loop GEMM in place of OpenBLAS. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "memory.h"

_Noreturn void spb_die(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "spbench-gpu-check: %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

const char *spb_mem_category_name(spb_mem_category cat)
{
    static const char *names[] = {"params", "grads", "optimizer", "activations", "workspace", "comm"};
    return cat >= 0 && cat < SPB_MEM_NUM_CATEGORIES ? names[cat] : "?";
}

#ifdef SPB_STANDALONE_CBLAS
#include "cblas.h"

/* Row-major only (all the callers use it). */
void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n, int k,
                 float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (order != CblasRowMajor) abort();
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int l = 0; l < k; l++) {
                float a = ta == CblasTrans ? A[(long)l * lda + i] : A[(long)i * lda + l];
                float b = tb == CblasTrans ? B[(long)j * ldb + l] : B[(long)l * ldb + j];
                acc += a * b;
            }
            float *c = C + (long)i * ldc + j;
            *c = alpha * acc + (beta == 0.0f ? 0.0f : beta * *c);
        }
}
char *openblas_get_corename(void) { return (char *)"loops (no OpenBLAS)"; }
int openblas_get_num_threads(void) { return 1; }
#endif
