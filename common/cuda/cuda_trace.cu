/* The kernel timeline and the host-wait counter (cuda_trace.h).
 *
 * Why events and not CUPTI: CUPTI's activity records would see every kernel,
 * library ones included, without touching a launch site, but the emulation
 * (docs/EMULATION.md) has no CUPTI, so the path a GPU session relies on could
 * not be tested before it; and a prebuilt lease machine may lack libcupti.
 * Events around each launch use only the runtime calls the emulation has,
 * cost nothing when off (one branch per launch), and measure what the issue
 * asks: when the stream is idle between the end of one of our calls and the
 * start of the next.  A library call (cuBLASLt, cuDNN) is one interval: the
 * gaps between its own kernels count as busy.  An NCCL call is one interval
 * on its communicator's stream, from when its inputs are ready (after the
 * stream's wait for the compute stream) to its end, time spent waiting for
 * peers inside NCCL's kernels included: the GPU is running NCCL then. */
#include <algorithm>
#include <vector>

#include "cuda_trace.h"
#include "intervals.h"

extern "C" {
#include "timer.h"
}

#ifdef SPB_CUDA_EMU
extern "C" long spb_emu_launch_count(void); /* emu_launch.cc: kernels run so far */
#ifdef SPB_HAVE_NCCL
extern "C" long spb_emu_nccl_launch_count(void); /* emu_nccl.cc: NCCL kernels a GPU would have run */
static long nccl_launch_count(void) { return spb_emu_nccl_launch_count(); }
#else
static long nccl_launch_count(void) { return 0; }
#endif
/* NCCL's kernels included: each must lie inside an interval too */
static long device_launch_count(void) { return spb_emu_launch_count() + nccl_launch_count(); }
#else
static long nccl_launch_count(void) { return -1; }
static long device_launch_count(void) { return -1; }
#endif

long spb_cuda_host_waits;
int spb_cuda_timeline_on;

namespace {

struct interval {
    int begin, end; /* event indices */
    int phase, kind;
    int span; /* index into spans of the phase it was launched in; -1 outside every phase */
};
struct phase_span {
    int phase, begin, end; /* end -1 while open */
};

std::vector<cudaEvent_t> pool; /* events, reused after each fold */
size_t used;
std::vector<interval> intervals;
std::vector<phase_span> spans;
std::vector<int> phase_stack; /* indices into spans of the open phases (a recompute may nest forward in backward) */
int open_begin = -1, open_phase, open_kind, open_span;
cudaStream_t open_stream;
long launches_at_begin, covered, covered_at_fold, launches_at_fold, nccl_at_fold;
spb_kernel_timeline totals;

int record(cudaStream_t s)
{
    if (used == pool.size()) {
        cudaEvent_t e;
        SPB_CUDA_CHECK(cudaEventCreate(&e));
        pool.push_back(e);
    }
    SPB_CUDA_CHECK(cudaEventRecord(pool[used], s));
    return (int)used++;
}

int current_phase(void) { return phase_stack.empty() ? SPB_KT_OUTSIDE : spans[(size_t)phase_stack.back()].phase; }
int current_span(void) { return phase_stack.empty() ? -1 : phase_stack.back(); }

void region(spb_timer_id id, int begin)
{
    if (!spb_cuda_timeline_on) return;
    const int phase = (int)id - (int)SPB_T_FORWARD;
    if (begin) {
        /* phases are marked on the legacy stream, where the core's work is queued */
        spans.push_back(phase_span{phase, record(0), -1});
        phase_stack.push_back((int)spans.size() - 1);
        return;
    }
    SPB_CHECK(!phase_stack.empty() && spans[(size_t)phase_stack.back()].phase == phase);
    spans[(size_t)phase_stack.back()].end = record(0);
    phase_stack.pop_back();
}

double seconds(int from, int to)
{
    float ms = 0.0f;
    SPB_CUDA_CHECK(cudaEventElapsedTime(&ms, pool[(size_t)from], pool[(size_t)to]));
    return 1e-3 * ms;
}

/* The length of the union of a set of intervals (intervals.h): overlapping
 * ones (other streams: compute beside an NCCL transfer) count once.  A copy:
 * the arithmetic merges in place. */
double union_length(std::vector<spb_interval> iv)
{
    return iv.empty() ? 0.0 : spb_intervals_union_length(iv.data(), (int)iv.size());
}

/* Folds every closed phase and interval into the totals once nothing is
 * open (a flush in mid-step waits for the step's end). */
void fold(void)
{
    if (!phase_stack.empty() || open_begin >= 0 || used == 0) return;
    SPB_CUDA_CHECK(cudaEventSynchronize(pool[used - 1])); /* the step's end: the device is idle already */
    for (size_t i = 0; i < used; i++) SPB_CUDA_CHECK(cudaEventSynchronize(pool[i])); /* other streams' too */
    for (const phase_span &p : spans) totals.wall[p.phase] += seconds(p.begin, p.end);
    for (int ph = 0; ph < SPB_KT_NUM_PHASES; ph++) {
        std::vector<spb_interval> all, comm, compute;
        for (const interval &k : intervals) {
            if (k.phase != ph) continue;
            double b = seconds(0, k.begin), e = seconds(0, k.end);
            if (k.span >= 0) {
                /* An interval on another stream (an NCCL transfer not joined
                 * before the phase's end) may run past the phase: only its
                 * part inside the phase's own events counts, so busy <= wall. */
                const phase_span &p = spans[(size_t)k.span];
                b = std::max(b, seconds(0, p.begin));
                e = std::min(e, seconds(0, p.end));
            }
            totals.intervals[ph]++;
            if (e <= b) continue;
            all.push_back({b, e});
            (k.kind == SPB_KT_COMM ? comm : compute).push_back({b, e});
        }
        totals.busy[ph] += union_length(all);
        /* the transfers' time with a kernel or library call running beside them */
        totals.comm_busy[ph] += union_length(comm);
        if (!comm.empty() && !compute.empty())
            totals.comm_hidden[ph] +=
                spb_intervals_overlap_length(comm.data(), (int)comm.size(), compute.data(), (int)compute.size());
    }
    for (const interval &k : intervals) {
        totals.library_calls += k.kind == SPB_KT_LIBRARY;
        totals.comm_calls += k.kind == SPB_KT_COMM;
    }
    const long now = device_launch_count();
    if (now >= 0) {
        totals.device_launches += now - launches_at_fold;
        totals.launches_outside += (now - launches_at_fold) - (covered - covered_at_fold);
        totals.nccl_launches += nccl_launch_count() - nccl_at_fold;
        launches_at_fold = now, covered_at_fold = covered, nccl_at_fold = nccl_launch_count();
    }
    intervals.clear();
    spans.clear();
    used = 0;
}

void reset(void)
{
    if (open_begin < 0 && phase_stack.empty()) intervals.clear(), spans.clear(), used = 0;
    totals = spb_kernel_timeline{};
    const long now = device_launch_count();
    totals.device_launches = totals.launches_outside = totals.nccl_launches = now >= 0 ? 0 : -1;
    launches_at_fold = now, covered_at_fold = covered, nccl_at_fold = nccl_launch_count();
}

} // namespace

extern "C" const spb_timer_observer spb_cuda_timeline_observer = {region, fold, reset};

extern "C" void spb_cuda_timeline_enable(int on)
{
    spb_cuda_timeline_on = on;
    reset();
}

extern "C" void spb_cuda_timeline_begin(cudaStream_t stream, int kind)
{
    if (open_begin >= 0) SPB_DIE("kernel timeline: an interval begins inside another (a launch site without its end)");
    open_stream = stream, open_kind = kind, open_phase = current_phase(), open_span = current_span();
    launches_at_begin = device_launch_count();
    open_begin = record(stream);
}

extern "C" void spb_cuda_timeline_end(void)
{
    if (open_begin < 0) SPB_DIE("kernel timeline: an interval ends that never began (a launch site without its begin)");
    intervals.push_back(interval{open_begin, record(open_stream), open_phase, open_kind, open_span});
    if (launches_at_begin >= 0) covered += device_launch_count() - launches_at_begin;
    open_begin = -1;
}

extern "C" void spb_cuda_timeline_read(spb_kernel_timeline *out)
{
    fold();
    *out = totals;
}
