/* What the CPU emulation's own files share (not seen by the translated
 * sources, which see spb_emu.h). */
#ifndef SPB_EMU_INTERNAL_H
#define SPB_EMU_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stddef.h>

/* the error cudaGetLastError returns next (a launch the device refuses) */
void spb_emu_set_error(cudaError_t e);
/* dynamic shared memory a kernel may opt into (sm_90: 227 KiB) */
size_t spb_emu_max_shared_optin(void);
/* cudaFuncSetAttribute(MaxDynamicSharedMemorySize) for one kernel */
void spb_emu_set_max_dynamic_shared(const void *kernel, int bytes);
void spb_emu_count_launch(void);
/* Every running lane of the calling thread's warp deposits `bytes` (<= 64)
 * and receives all 32 lanes' deposits in all[32][bytes] (lanes not
 * running: stale).  `what` names the operation in error reports. */
void spb_emu_warp_gather(unsigned mask, const void *mine, size_t bytes, void *all, const char *what);

#endif
