/* Check macro for CUDA runtime calls: prints rank, file:line and the call,
 * then aborts the whole job like every other failed call (checks.h).
 * Usable from C and from CUDA C++ (checks.h itself is C-only: _Noreturn, and
 * it pulls in mpi.h, which the CUDA sources do not need). */
#ifndef SPB_CUDA_CHECK_H
#define SPB_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" [[noreturn]] void spb_die(const char *file, int line, const char *fmt, ...);
#define SPB_DIE(...) spb_die(__FILE__, __LINE__, __VA_ARGS__)
#define SPB_CHECK(cond)                                                                                                \
    do {                                                                                                               \
        if (!(cond)) SPB_DIE("check failed: %s", #cond);                                                               \
    } while (0)
#else
#include "checks.h"
#endif

#define SPB_CUDA_CHECK(call)                                                                                           \
    do {                                                                                                               \
        cudaError_t spb_cuda_rc_ = (call);                                                                             \
        if (spb_cuda_rc_ != cudaSuccess) SPB_DIE("CUDA call failed: %s: %s", #call, cudaGetErrorString(spb_cuda_rc_)); \
    } while (0)

#endif
