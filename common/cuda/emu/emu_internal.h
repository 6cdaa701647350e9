/* What the CPU emulation's own files share (not seen by the translated
 * sources, which see spb_emu.h). */
#ifndef SPB_EMU_INTERNAL_H
#define SPB_EMU_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "emu_stream_hooks.h"

/* the error cudaGetLastError returns next (a launch the device refuses) */
void spb_emu_set_error(cudaError_t e);
/* the emulated device's compute capability, 10 major + minor (90 unless
 * SPB_EMU_COMPUTE_CAPABILITY says otherwise) */
int spb_emu_compute_capability(void);
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
/* Blocks the calling thread (fiber) until ready(arg) holds: asked at once,
 * then each time the scheduler comes back to it; `what` names the wait in a
 * deadlock report ("thread N waits in <what>").  Whatever can make ready()
 * hold must call spb_emu_note_progress, or the scheduler, seeing a pass in
 * which nothing moved, reports a deadlock. */
void spb_emu_block_until(bool (*ready)(void *), void *arg, const char *what);
void spb_emu_note_progress(void);
/* the calling thread waits two of the scheduler's passes: every other warp
 * runs as far as it can first (after an mbarrier arrival, emu_tma.cc) */
void spb_emu_let_others_run(const char *what);
/* The mbarriers and tensor copies of a block (emu_tma.cc): its start (eager:
 * copies land at issue, else at a wait on their barrier) and its end (all
 * threads done: a copy that never landed is refused). */
void spb_emu_tma_block_begin(bool eager);
void spb_emu_tma_block_end(void);
/* The driver functions cudaGetDriverEntryPointByVersion gives (emu_tma.cc:
 * cuTensorMapEncodeTiled), or null. */
void *spb_emu_driver_entry_point(const char *symbol);

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
/* wait_group's rule, for a thread's queue of asynchronous operations (the
 * cp.async copies, the wgmma products): all but the last `groups_left`
 * committed groups complete, done(item) on each, oldest first; items after
 * the last commit belong to no group and stay. */
template <typename T, typename F>
void spb_emu_complete_groups(std::vector<T> &items, std::vector<size_t> &group_end, int groups_left, F done)
{
    size_t groups = group_end.size();
    if (groups <= (size_t)groups_left) return;
    size_t done_groups = groups - (size_t)groups_left, n = group_end[done_groups - 1];
    for (size_t i = 0; i < n; i++) done(items[i]);
    items.erase(items.begin(), items.begin() + (long)n);
    group_end.erase(group_end.begin(), group_end.begin() + (long)done_groups);
    for (size_t &e : group_end) e -= n;
}
/* completes every copy still queued (a thread's end: a GPU finishes them) */
void spb_emu_copies_finish(spb_emu_copy_queue *q);

/* The bulk reductions (cp.reduce.async.bulk ... add.f32) a thread has
 * issued and not yet completed (emu_bulk_copy.cc), and where its committed
 * bulk groups end. */
struct spb_emu_bulk_op {
    float *dst;
    const float *src;
    unsigned bytes;
    const void *pc;
};
struct spb_emu_bulk_queue {
    std::vector<spb_emu_bulk_op> ops;
    std::vector<size_t> group_end;
    bool eager = false; /* done at issue (else at the wait that covers them) */
};
spb_emu_bulk_queue *spb_emu_thread_bulk(void);
/* a thread's end with bulk operations not waited for: refused (their
 * source is the block's shared memory, gone with the block) */
void spb_emu_bulk_finish(spb_emu_bulk_queue *q);

/* The wgmma.mma_async operations a thread has issued and not yet
 * completed (emu_wgmma.cc), and where its committed groups end. */
struct spb_emu_wgmma_op {
    float *d;                  /* the issuing thread's accumulators */
    int n, fp16, accumulate, trans_b, a_in_regs;
    uint32_t a_regs[32][4];    /* the warp's A registers at issue */
    uint64_t a_desc, b_desc;
    const void *pc;
};
struct spb_emu_wgmma_queue {
    std::vector<spb_emu_wgmma_op> ops;
    std::vector<size_t> group_end;
    bool need_fence = true; /* no wgmma.fence since the thread began or last waited */
};
spb_emu_wgmma_queue *spb_emu_thread_wgmma(void);
/* the value of a 16-bit element held in half of a 32-bit register */
float spb_emu_half_value(uint32_t reg, int high, int fp16);
/* A[row][k] of a 16x16 A operand held by a warp's 32 lanes, four registers
 * each, in mma.m16n8k16's layout (wgmma's register A per warp too) */
float spb_emu_a_fragment(const uint32_t (*regs)[4], int row, int k, int fp16);

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
    int threads;              /* the block's */
};
int spb_emu_sync_point_now(spb_emu_sync_point *s);
/* The order mbarriers and named barriers give (a GPU's release at an
 * arrival, acquire at the wait that sees the phase complete), for the race
 * check of shared memory, which the generations above cannot express: a
 * vector clock per barrier phase.  An arrival joins the calling thread's
 * clock into the phase's (release); a thread that saw the phase complete
 * joins the phase's clock into its own (acquire).  Nothing outside race
 * builds. */
typedef std::vector<uint32_t> spb_emu_clock;
void spb_emu_race_release(spb_emu_clock *phase);
void spb_emu_race_acquire(const spb_emu_clock *phase);
/* the block's clocks start (at its first mbarrier.init: accesses before
 * them have no clock, and order only by the generations) */
void spb_emu_race_clocks_begin(void);

#endif
