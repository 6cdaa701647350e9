/* Stand-in for <cblas.h> where OpenBLAS is not installed (SPB_BLAS=FALLBACK,
 * or AUTO without OpenBLAS; docs/BUILD.md): the single-precision GEMM that
 * ops_cpu.c and attention_flash.c call, and the two OpenBLAS queries that
 * spb_blas_description uses, as plain C loops in sgemm.c.  Correct, slow.
 * Also the header of experiments/gpu-check's standalone build (through
 * experiments/gpu_check_stubs/cblas.h). */
#ifndef SPB_FALLBACK_CBLAS_H
#define SPB_FALLBACK_CBLAS_H

#define SPB_CBLAS_IS_FALLBACK 1 /* spb_blas_description says so */

#ifdef __cplusplus
extern "C" {
#endif

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n, int k,
                 float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
char *openblas_get_corename(void);
int openblas_get_num_threads(void);

#ifdef __cplusplus
}
#endif

#endif
