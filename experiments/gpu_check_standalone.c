/* What spbench-gpu-check needs from the rest of the runtime when it is built
 * without MPI (experiments/gpu-check on a GPU machine with no MPI, OpenBLAS or
 * Check): the abort path and the category names that common/runtime/checks.c and
 * common/runtime/memory.c provide in the full build, and, with
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
/* The build's own fallback sgemm (common/blas_fallback), compiled here so
 * that experiments/gpu-check's list of sources stays as it is. */
#include "../common/blas_fallback/sgemm.c"
#endif
