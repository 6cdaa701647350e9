#define _POSIX_C_SOURCE 200809L
#include "timer.h"

#include <stdlib.h>
#include <time.h>

#include <stdio.h>

static double totals[SPB_NUM_TIMERS];
static const spb_timer_clock *device_clock;

/* Device regions ended but not yet read: (id, begin mark, end mark). */
static struct pending_region {
    spb_timer_id id;
    int from, to;
} *pending;
static long npending, cap_pending;
static int open_regions; /* begun, not ended: their marks must not be reused yet */
static const spb_timer_observer *observer;

static int top_level(spb_timer_id id) { return id >= SPB_T_FORWARD && id <= SPB_T_OPTIMIZER; }

void spb_timer_set_observer(const spb_timer_observer *o) { observer = o; }

double spb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void spb_timer_add(spb_timer_id id, double seconds) { totals[id] += seconds; }

void spb_timer_flush(void)
{
    for (long i = 0; i < npending; i++)
        totals[pending[i].id] += device_clock->elapsed(pending[i].from, pending[i].to);
    npending = 0;
    if (device_clock && !open_regions) device_clock->release();
    if (observer) observer->flush();
}

double spb_timer_get(spb_timer_id id)
{
    spb_timer_flush();
    return totals[id];
}

void spb_timer_reset_all(void)
{
    /* Regions still pending belong to the interval being discarded. */
    npending = 0;
    if (device_clock && !open_regions) device_clock->release();
    for (int i = 0; i < SPB_NUM_TIMERS; i++) totals[i] = 0.0;
    if (observer) observer->reset();
}

void spb_timer_set_clock(const spb_timer_clock *clock)
{
    spb_timer_flush();
    device_clock = clock;
}

spb_timer_region spb_timer_begin(spb_timer_id id)
{
    spb_timer_region r = {id, 0.0, -1};
    if (observer && top_level(id)) observer->region(id, 1);
    if (device_clock) {
        r.mark = device_clock->mark();
        open_regions++;
    } else
        r.t0 = spb_now();
    return r;
}

void spb_timer_end(spb_timer_region r)
{
    if (observer && top_level(r.id)) observer->region(r.id, 0);
    if (r.mark < 0 || !device_clock) {
        totals[r.id] += spb_now() - r.t0;
        return;
    }
    open_regions--;
    if (npending == cap_pending) {
        cap_pending = cap_pending ? 2 * cap_pending : 256;
        pending = realloc(pending, sizeof *pending * (size_t)cap_pending);
        if (!pending) { /* checks.h would pull mpi.h into the GPU check's MPI-free build */
            fprintf(stderr, "spbench: %s:%d: out of memory for %ld timer regions\n", __FILE__, __LINE__, cap_pending);
            abort();
        }
    }
    pending[npending++] = (struct pending_region){r.id, r.mark, device_clock->mark()};
}

const char *spb_timer_name(spb_timer_id id)
{
    static const char *names[SPB_NUM_TIMERS] = {"data", "forward", "backward", "grad_reduce",
                                                "optimizer", "gemm", "attention", "comm", "exchange"};
    return names[id];
}
