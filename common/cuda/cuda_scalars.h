/* The step's scalars kept on the device (backend.h's scalar_defer and
 * scalars_take; SPB_SCALAR_* slots): the loss and the gradients' sums of
 * squares are added onto device accumulators instead of read back by each
 * call, and the clipping scale for AdamW is made from them there, so the
 * step does not wait for them (docs/GPU.md, "Host waits in the step").
 * Usable from C and CUDA C. */
#ifndef SPB_CUDA_SCALARS_H
#define SPB_CUDA_SCALARS_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* backend.h's entries */
void spb_cuda_scalar_defer(int slot);
void spb_cuda_scalars_take(int first, int n, double *out);
void spb_cuda_clip_on_device(double clip_grad, double loss_scale);

/* The slot the table's softmax_xent_forward and sum_squares add onto (-1:
 * none, they return their value as before). */
int spb_cuda_scalar_target(void);
/* slot += (0 + part[0] + ... + part[n-1]) in that order, on `stream`: the
 * host's double additions, so the value is the host's to the bit; the loss
 * slot is then copied to pinned memory behind an event (taking it waits for
 * that point only, not for the work queued after it). */
void spb_cuda_scalar_add_ordered(const double *part, long n, cudaStream_t stream);
/* While clipping on the device is on (spb_cuda_clip_on_device, until the
 * next scalars_take): AdamW's gradient scale, on the device; else NULL. */
const float *spb_cuda_device_grad_scale(void);

#ifdef __cplusplus
}
#endif

#endif
