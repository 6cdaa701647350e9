/* (Not named cuda_bf16.h: common/cuda is on the include path, and that
 * name would hide the CUDA toolkit's <cuda_bf16.h>.) */
/* Device storage for the bf16 handles (device_handles.h) of the CUDA bf16
 * table (backend_bf16_cuda.c): cudaMalloc through spb_cuda_alloc (tracked
 * per category on the device), a scratch pool for the frames' fp32 copies,
 * and kernels that widen, narrow (round to nearest even, as common/bf16/bf16.h)
 * and keep the masters' rule of spb_bf16_write; and the direct kernels.  Everything runs on the
 * legacy default stream, where the fp32 CUDA table computes, so a frame's
 * loads, the inner operation and its stores are ordered without waits. */
#ifndef SPB_CUDA_BF16_STORAGE_H
#define SPB_CUDA_BF16_STORAGE_H

#ifdef __cplusplus
extern "C" {
#endif

#include "bf16_direct.h" /* C headers without their own extern "C" */
#include "device_handles.h"

const spb_handle_storage *spb_cuda_bf16_storage(void);
/* Its direct kernels (--bf16-kernels fast): cuda_bf16_direct.cu. */
extern const spb_bf16_direct spb_bf16_direct_cuda;

#ifdef __cplusplus
}
#endif

#endif
