/* Stand-in for <cblas.h> in the standalone build of spbench-gpu-check
 * (experiments/gpu-check), used only where OpenBLAS is not installed: the
 * single-precision GEMM that ops_cpu.c and attention_flash.c call, as plain
 * loops in experiments/gpu_check_standalone.c (the check shapes are small). */
#ifndef SPB_STUB_CBLAS_H
#define SPB_STUB_CBLAS_H

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int n, int k,
                 float alpha, const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
char *openblas_get_corename(void);
int openblas_get_num_threads(void);

#endif
