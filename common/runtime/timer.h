/* Phase timers: seconds accumulated per phase of a training step.  On the
 * host the seconds are wall-clock; where a device clock is set (the CUDA
 * table's events on its compute stream), a region's begin and end are marks
 * on the device's timeline, read back later (spb_timer_get, spb_timer_flush)
 * so that no region forces a device synchronisation. */
#ifndef SPB_TIMER_H
#define SPB_TIMER_H

typedef enum spb_timer_id {
    SPB_T_DATA = 0,
    SPB_T_FORWARD,
    SPB_T_BACKWARD,
    SPB_T_GRAD_REDUCE,
    SPB_T_OPTIMIZER,
    SPB_T_GEMM,      /* nested inside forward/backward: all matrix products */
    SPB_T_ATTENTION, /* nested inside forward/backward: attention kernels */
    SPB_T_COMM,      /* nested: time inside collectives */
    SPB_T_EXCHANGE,  /* nested: a strategy's whole exchange, pack + collective + unpack */
    SPB_NUM_TIMERS
} spb_timer_id;

double spb_now(void); /* monotonic seconds */
void spb_timer_add(spb_timer_id id, double seconds);
double spb_timer_get(spb_timer_id id);
void spb_timer_reset_all(void);
const char *spb_timer_name(spb_timer_id id);

/* A device's clock: mark() records a point on the stream the device
 * computes on and returns its handle; elapsed(a, b) waits for mark b and
 * returns the seconds from a to b; release() makes every handle reusable
 * (called once all pending regions are read). */
typedef struct spb_timer_clock {
    int (*mark)(void);
    double (*elapsed)(int from, int to);
    void (*release)(void);
} spb_timer_clock;
/* NULL: the host clock (the default). */
void spb_timer_set_clock(const spb_timer_clock *clock);

typedef struct spb_timer_region {
    spb_timer_id id;
    double t0; /* host clock */
    int mark;  /* device clock */
} spb_timer_region;
spb_timer_region spb_timer_begin(spb_timer_id id);
void spb_timer_end(spb_timer_region r);
/* Folds the device regions ended so far into the totals (waits for them). */
void spb_timer_flush(void);

/* Told of the top-level phases' regions (forward, backward, grad_reduce,
 * optimizer: begin 1 at spb_timer_begin, 0 at spb_timer_end), of every flush
 * and of reset_all: the CUDA kernel timeline (cuda_trace.h) marks its phases
 * with it.  NULL (the default): none. */
typedef struct spb_timer_observer {
    void (*region)(spb_timer_id id, int begin);
    void (*flush)(void);
    void (*reset)(void);
} spb_timer_observer;
void spb_timer_set_observer(const spb_timer_observer *observer);

#endif
