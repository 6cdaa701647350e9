/* What the CPU emulation's own files share (not seen by the translated
 * sources, which see spb_emu.h). */
#ifndef SPB_EMU_INTERNAL_H
#define SPB_EMU_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include <vector>

#include "emu_stream_hooks.h"

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
/* Whether [p, p + bytes) lies in the running launch's dynamic shared memory. */
int spb_emu_in_dynamic_shared(const void *p, size_t bytes);
/* The kernel running now, for error reports. */
const char *spb_emu_kernel_name(void);

/* The cp.async copies a thread has issued and not yet completed, in issue
 * order, and where its committed groups end (emu_async_copy.cc). */
struct spb_emu_copy {
    void *dst;
    const void *src;
    int src_bytes;
    const void *pc; /* where it was issued (race check) */
};
struct spb_emu_copy_queue {
    std::vector<spb_emu_copy> copies;
    std::vector<size_t> group_end; /* copies[0, group_end[i]) belong to groups 0..i */
    bool eager = false;            /* copies land at issue (else at the wait that covers them) */
};
/* the calling thread's queue */
spb_emu_copy_queue *spb_emu_thread_copies(void);
/* completes every copy still queued (a thread's end: a GPU finishes them) */
void spb_emu_copies_finish(spb_emu_copy_queue *q);

/* Stream ordering (emu_streams.cc; the operations' entry points are in
 * emu_stream_hooks.h): the runtime's hooks. */
void spb_emu_streams_alloc(const void *p, size_t bytes);
void spb_emu_streams_free(const void *p);
void spb_emu_streams_created(cudaStream_t s, int blocking);
void spb_emu_streams_destroyed(cudaStream_t s);
void spb_emu_streams_record(cudaEvent_t e, cudaStream_t s);
void spb_emu_streams_wait(cudaStream_t s, cudaEvent_t e);
void spb_emu_streams_event_destroyed(cudaEvent_t e);
void spb_emu_streams_host_waits_stream(cudaStream_t s);
void spb_emu_streams_host_waits_event(cudaEvent_t e);
void spb_emu_streams_host_waits_all(void);

/* Races between the blocks of a launch (emu_race.cc): the runtime's and
 * the launches' hooks (its accesses come from spb_emu_race_access and,
 * in SPB_EMU_RACECHECK builds, from the compiler's instrumentation). */
void spb_emu_race_alloc(const void *p, size_t bytes);
void spb_emu_race_free(const void *p);
void spb_emu_race_launch(void);
/* Where the calling thread stands in its block's synchronisation, for the
 * race check of shared memory: 0 outside a kernel. */
struct spb_emu_sync_point {
    long block_serial;        /* counts the blocks run so far (shared memory is per block) */
    int thread, warp;         /* in the block */
    unsigned long block_gen;  /* __syncthreads completed in this block so far */
    unsigned long warp_gen;   /* warp operations (__syncwarp, shuffles, mma, ldmatrix) its warp completed */
};
int spb_emu_sync_point_now(spb_emu_sync_point *s);

#endif
