/* Phase timers: wall seconds accumulated per phase of a training step. */
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

#endif
