/* Stand-in for <cblas.h> in the standalone build of spbench-gpu-check
 * (experiments/gpu-check), used only where OpenBLAS is not installed: the
 * build's fallback header, common/blas_fallback/cblas.h (its sgemm comes in
 * through experiments/gpu_check_standalone.c). */
#include "../../common/blas_fallback/cblas.h"
