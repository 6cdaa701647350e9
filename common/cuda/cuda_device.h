/* What the CUDA build sees of the machine's GPUs (C interface). */
#ifndef SPB_CUDA_DEVICE_H
#define SPB_CUDA_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of visible CUDA devices; 0 when there is no GPU or no driver (not an
 * error: CPU runs go on). */
int spb_cuda_device_count(void);
/* One line: "N x NAME (cc X.Y, G GiB), driver D, runtime R" or why none. */
void spb_cuda_describe(char *buf, size_t len);
/* 1 where the running GPU executes this build's wgmma code, the Hopper
 * flash kernels' (compute capability 9.0 and sm_90a in the build; the
 * CPU emulation of a 9.0 device too); asks the device once. */
int spb_cuda_attention_wgmma_available(void);
/* Total memory of the device this rank is bound to, in bytes (0: unknown). */
double spb_cuda_current_device_bytes(void);

#ifdef __cplusplus
}
#endif

#endif
