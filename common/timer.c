#define _POSIX_C_SOURCE 200809L
#include "timer.h"

#include <time.h>

static double totals[SPB_NUM_TIMERS];

double spb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void spb_timer_add(spb_timer_id id, double seconds) { totals[id] += seconds; }
double spb_timer_get(spb_timer_id id) { return totals[id]; }

void spb_timer_reset_all(void)
{
    for (int i = 0; i < SPB_NUM_TIMERS; i++) totals[i] = 0.0;
}

const char *spb_timer_name(spb_timer_id id)
{
    static const char *names[SPB_NUM_TIMERS] = {"data", "forward", "backward", "grad_reduce",
                                                "optimizer", "gemm", "attention", "comm", "exchange"};
    return names[id];
}
