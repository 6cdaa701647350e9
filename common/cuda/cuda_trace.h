/* What the device does inside a training step, seen from the host:
 *   - the kernel timeline (spbench --kernel-timeline, off by default): a
 *     CUDA event before and after each kernel launch and library call of the
 *     core's device tables, folded at the step's end into each phase's busy
 *     time (the union of those intervals) beside its wall time (the phase's
 *     own events), so wall - busy is the time the GPU sat idle between
 *     kernels inside the phase (host launch gaps, waits); with --comm nccl
 *     each NCCL call is an interval on its communicator's stream too
 *     (busy: the union over both streams; comm_busy: the NCCL ones alone;
 *     comm_hidden: the part of comm_busy with compute running beside it);
 *   - the host's waits on the device (always on, one counter add): every
 *     call that blocks the host until queued device work is done
 *     (synchronous copies to or from host memory, cudaFree, synchronize).
 * Usable from C (spbench) and CUDA C. */
#ifndef SPB_CUDA_TRACE_H
#define SPB_CUDA_TRACE_H

#include <cuda_runtime_api.h>

#include "cuda_check.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- host waits ---- */
extern long spb_cuda_host_waits; /* since the process started */
#define SPB_CUDA_HOST_WAIT(call)                                                                                       \
    do {                                                                                                               \
        spb_cuda_host_waits++;                                                                                         \
        SPB_CUDA_CHECK(call);                                                                                          \
    } while (0)

/* ---- the kernel timeline ---- */
/* one of ours / a cuBLAS(Lt), cuDNN call / an NCCL call (on its communicator's stream) */
enum { SPB_KT_KERNEL = 0, SPB_KT_LIBRARY = 1, SPB_KT_COMM = 2 };
/* The step's top-level phases the intervals are attributed to (timer.h's
 * forward .. optimizer); SPB_KT_OUTSIDE: launched outside every phase. */
enum { SPB_KT_FORWARD, SPB_KT_BACKWARD, SPB_KT_GRAD_REDUCE, SPB_KT_OPTIMIZER, SPB_KT_OUTSIDE, SPB_KT_NUM_PHASES };

extern int spb_cuda_timeline_on; /* read at every launch: the default path pays one branch */
void spb_cuda_timeline_enable(int on);
/* An interval: begin just before the launch (or library call) on the
 * stream it runs on, end just after it; they must pair (no nesting). */
void spb_cuda_timeline_begin(cudaStream_t stream, int kind);
void spb_cuda_timeline_end(void);
#define SPB_KT_BEGIN(stream)                                                                                           \
    do {                                                                                                               \
        if (spb_cuda_timeline_on) spb_cuda_timeline_begin((stream), SPB_KT_KERNEL);                                    \
    } while (0)
#define SPB_KT_BEGIN_LIBRARY(stream)                                                                                   \
    do {                                                                                                               \
        if (spb_cuda_timeline_on) spb_cuda_timeline_begin((stream), SPB_KT_LIBRARY);                                   \
    } while (0)
#define SPB_KT_BEGIN_COMM(stream)                                                                                      \
    do {                                                                                                               \
        if (spb_cuda_timeline_on) spb_cuda_timeline_begin((stream), SPB_KT_COMM);                                      \
    } while (0)
#define SPB_KT_END()                                                                                                   \
    do {                                                                                                               \
        if (spb_cuda_timeline_on) spb_cuda_timeline_end();                                                             \
    } while (0)
/* After each kernel launch that SPB_KT_BEGIN opened: the launch's error, then
 * the interval's end (the including file has cuda_check.h). */
#define SPB_LAUNCH_CHECK()                                                                                             \
    do {                                                                                                               \
        SPB_CUDA_CHECK(cudaGetLastError());                                                                            \
        SPB_KT_END();                                                                                                  \
    } while (0)

/* Totals since the last reset, over the steps folded so far (seconds). */
typedef struct spb_kernel_timeline {
    double wall[SPB_KT_NUM_PHASES]; /* the phases' own events; 0 for OUTSIDE */
    double busy[SPB_KT_NUM_PHASES]; /* union of the intervals launched inside the phase, every stream */
    double comm_busy[SPB_KT_NUM_PHASES]; /* union of its NCCL intervals alone (part of busy) */
    /* of comm_busy, the time compute ran beside it: |NCCL union ∩ kernel and
     * library union| (intervals.h), the communication hidden behind compute;
     * comm_busy − comm_hidden is the exposed part */
    double comm_hidden[SPB_KT_NUM_PHASES];
    long intervals[SPB_KT_NUM_PHASES];
    long library_calls;            /* of those intervals, cuBLAS(Lt)/cuDNN calls */
    long comm_calls;               /* of those intervals, NCCL calls */
    long device_launches;          /* the emulator's own count of kernels run in the window; -1 on a GPU */
    long nccl_launches;            /* of those, NCCL's (one per group or ungrouped call; emulator; -1 on a GPU) */
    long launches_outside;         /* of those, launched outside every interval (emulator; -1 on a GPU) */
} spb_kernel_timeline;

/* timer.h's observer: phase begin/end marks, folding and reset. */
struct spb_timer_observer;
extern const struct spb_timer_observer spb_cuda_timeline_observer;
void spb_cuda_timeline_read(spb_kernel_timeline *out);

#ifdef __cplusplus
}
#endif

#endif
