/* Check macro for CUDA runtime calls: prints rank, file:line and the call,
 * then aborts the whole job like every other failed call (checks.h). */
#ifndef SPB_CUDA_CHECK_H
#define SPB_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "../checks.h"

#define SPB_CUDA_CHECK(call)                                                                                           \
    do {                                                                                                               \
        cudaError_t spb_cuda_rc_ = (call);                                                                             \
        if (spb_cuda_rc_ != cudaSuccess) SPB_DIE("CUDA call failed: %s: %s", #call, cudaGetErrorString(spb_cuda_rc_)); \
    } while (0)

#endif
