/* The kernel timeline's fold (cuda_trace.cu) where an interval outlives its
 * phase: an NCCL transfer issued inside the forward, on its communicator's
 * stream, still running when the forward's end event is recorded on the
 * compute stream (a GPU case the emulation's spbench runs never show: there
 * every operation completes before its call returns).  Its busy time must be
 * clipped to the phase, so busy <= wall, and it counts as NCCL busy too.  The
 * emulated events take the host's clock, so host sleeps place them:
 *   forward begins at 0, the transfer starts at ~20 ms, the forward ends at
 *   ~40 ms, the transfer ends at ~100 ms.
 * Unclipped, busy would be ~80 ms against a wall of ~40 ms. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <time.h>

#include "cuda_trace.h"
#include "timer.h"

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

int main(void)
{
    int fails = 0;
    cudaStream_t comm;
    SPB_CUDA_CHECK(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking));
    spb_cuda_timeline_enable(1);
    spb_timer_set_observer(&spb_cuda_timeline_observer);

    spb_timer_region fwd = spb_timer_begin(SPB_T_FORWARD);
    sleep_ms(20);
    spb_cuda_timeline_begin(comm, SPB_KT_COMM);
    sleep_ms(20);
    spb_timer_end(fwd); /* the transfer is still running */
    sleep_ms(60);
    spb_cuda_timeline_end();
    spb_timer_flush();

    spb_kernel_timeline kt;
    spb_cuda_timeline_read(&kt);
    const double wall = kt.wall[SPB_KT_FORWARD], busy = kt.busy[SPB_KT_FORWARD], comm_busy = kt.comm_busy[SPB_KT_FORWARD];
    printf("forward: wall %.1f ms, busy %.1f ms, NCCL busy %.1f ms, %ld interval(s), %ld NCCL call(s)\n", wall * 1e3,
           busy * 1e3, comm_busy * 1e3, kt.intervals[SPB_KT_FORWARD], kt.comm_calls);
#define CHECK(cond, what)                                                                                              \
    do {                                                                                                               \
        printf("%s %s\n", (cond) ? "ok  " : "FAIL", what);                                                             \
        fails += !(cond);                                                                                              \
    } while (0)
    CHECK(wall >= 0.035, "the forward's wall time is its own events' (~40 ms)");
    CHECK(busy <= wall + 1e-6, "busy <= wall: the transfer's part after the forward's end is not counted");
    CHECK(busy >= 0.015 && busy <= wall - 0.015,
          "busy is the transfer's part inside the forward (~20 ms; the first ~20 ms idle)");
    CHECK(comm_busy == busy, "all of it NCCL busy");
    CHECK(kt.intervals[SPB_KT_FORWARD] == 1 && kt.comm_calls == 1, "one NCCL interval, in the forward");
    SPB_CUDA_CHECK(cudaStreamDestroy(comm));
    return fails ? 1 : 0;
}
