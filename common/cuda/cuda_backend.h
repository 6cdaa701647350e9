/* The CUDA device table of the GPT core (common/core/backend.h): fp32 storage on
 * the device, the obviously-right version (one thread per row, column or
 * element; fp32 products through cuBLAS cublasSgemm, no TF32).  Same
 * contracts as the CPU table (common/core/ops.h, common/attention/attention.h), checked
 * against it by spbench-gpu-layer's "core-step" (docs/GPU.md).
 *
 * Every operation runs on the legacy default stream and returns with its
 * work queued (softmax_xent_forward and sum_squares wait: they return a
 * number); the phase timers mark that stream with CUDA events and read them
 * at the step boundary (synchronize).  Buffers come from spb_cuda_alloc
 * (device memory, tracked per category, zeroed); cudaMemGetInfo is read
 * beside that tracker.  host_memory = 0 with cudaMemcpy staging hooks, so
 * comm.h's collectives stage device buffers through host memory (--comm
 * mpi).  open() binds a rank to GPU local_rank mod the GPU count.  bf16
 * storage is spb_backend_cuda_bf16, a frame table over this one (fp32
 * arithmetic here; the fast bf16 kernels of common/cuda/ are checked on
 * their own by spbench-gpu-check).  Not yet: the sparse attention pattern
 * (config.c refuses it).  Nothing here has run on a GPU yet: experiments/gpu-check runs
 * core-step and every strategy against the CPU first (docs/GPU.md). */
#ifndef SPB_CUDA_BACKEND_H
#define SPB_CUDA_BACKEND_H

#ifdef __cplusplus
extern "C" {
#endif

#include <stdint.h>

#include "backend.h" /* C header without its own extern "C" */

extern const spb_backend spb_backend_cuda;
/* bf16 storage on the device over this table (backend_bf16_cuda.c). */
extern const spb_backend spb_backend_cuda_bf16;
extern const spb_backend spb_backend_cuda_fp16; /* the same with fp16 storage */

/* The device attention backends (fp32, one thread per query row forward,
 * per query row and per key row backward; no atomics): both "naive" and
 * "flash" name the same kernels here. */
extern const spb_attn_backend spb_attn_cuda_simple;
/* "cudnn": cuDNN's fused attention (cudnn_attention.h) on bf16 copies of the
 * operands, dQ/dK/dV added back in fp32 (cuda_attention_cudnn.cu); NULL
 * where the build has no cuDNN. */
const spb_attn_backend *spb_cuda_cudnn_attention(void);
/* The direct path's cuDNN entries (bf16_direct.h's cudnn_attention_*):
 * operands on their own 16-bit storage; 0 when cuDNN ran, -1 when it
 * declined (nothing written). */
int spb_cuda_cudnn_direct_forward(const spb_attn_desc *d, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                  uint16_t *o, float *lse);
int spb_cuda_cudnn_direct_backward(const spb_attn_desc *d, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                   const uint16_t *o, const float *lse, const uint16_t *dout, float *dq, float *dk,
                                   float *dv);

#ifdef __cplusplus
}
#endif

#endif
