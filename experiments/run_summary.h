/* The end of a run: statistics over ranks (iteration time, FLOPs, memory,
 * the slowest rank's step breakdown, communication per collective and
 * phase), printed as spbench's summary and written as one results row. */
#ifndef SPB_RUN_SUMMARY_H
#define SPB_RUN_SUMMARY_H

#include <stddef.h>

#include "comm.h"
#include "config.h"
#include "memory.h"
#include "timer.h"
#include "train.h"

enum { SPB_COMM_SLOTS = SPB_NUM_OPS * SPB_NUM_PHASES, SPB_T_LAYER_COMM = SPB_NUM_TIMERS };
enum { SPB_RUN_KT_PHASES = 5 }; /* cuda_trace.h's SPB_KT_NUM_PHASES */

typedef struct spb_run_summary {
    int world, measured;
    double t_med, t_min, t_max;          /* iteration time, slowest rank, measured iterations */
    double t_mean;                       /* their mean: what the per-iteration timers below average over */
    double tokens_per_iter, paper_flops; /* per iteration */
    double counted_gemm, counted_attn;   /* FLOPs per iteration, all ranks */
    double first_loss, final_loss;
    double peaks[SPB_MEM_NUM_CATEGORIES + 1]; /* bytes, max over ranks; last = total */
    /* The device driver's bytes in use (cudaMemGetInfo), max over ranks and
     * step boundaries; -1 on the host.  Includes the CUDA context and, when
     * ranks share a GPU, all of them. */
    double device_used_peak;
    /* Per iteration, the slowest rank's (its parts add up); the extra slot
     * SPB_T_LAYER_COMM is communication inside forward/backward. */
    double timers[SPB_NUM_TIMERS + 1];
    /* Per iteration and (op, phase) slot o·SPB_NUM_PHASES + p: calls,
     * payload bytes, link bytes, seconds (max over ranks). */
    double calls[SPB_COMM_SLOTS], payload[SPB_COMM_SLOTS], link[SPB_COMM_SLOTS], seconds[SPB_COMM_SLOTS];
    double link_total;
    /* Per iteration and phase: the largest over ranks of a rank's link bytes
     * summed over operations (the busiest link, comm_volume's figure); with
     * uneven shares ranks differ, and the largest per (op, phase) slot may
     * come from different ranks. */
    double phase_link[SPB_NUM_PHASES];
    /* --compare-alltoall: plain MPI_Alltoall of the run's counts, replayed;
     * the strategy's own copies; its in-run exchanges (with waiting). */
    double plain_alltoall, pack_unpack, exchange;
    /* Layer communication exposed vs hidden behind compute (with
     * --compare-alltoall): the time ranks were blocked in the layers'
     * all-to-alls and sendrecvs, against the same transfers replayed alone
     * (plain_alltoall, plain_sendrecv); hidden = replayed − exposed, at
     * least 0. */
    double plain_sendrecv, exposed_alltoall, exposed_sendrecv;
    /* --device cuda: the host's waits on the device inside the step
     * (spb_trainer_gradients + spb_trainer_update, cuda_trace.h), per
     * iteration, this rank; -1 elsewhere.  Filled by the caller. */
    double host_waits;
    /* With a device-collective table (--comm nccl): the collectives that took
     * the staged MPI path instead (comm.h's spb_comm_device_fallbacks), the
     * most on any rank, over the whole run; -1 without a table. */
    double staged_fallbacks;
    /* --kernel-timeline (cuda_trace.h), rank 0's, per iteration: each phase's
     * wall and busy seconds (forward, backward, grad_reduce, optimizer, then
     * work launched outside them: busy only), of busy the NCCL calls' part
     * (kt_comm_busy: the union of their intervals on the communicators'
     * streams), of that the part with compute running beside it
     * (kt_comm_hidden: |NCCL ∩ compute|, the communication hidden behind
     * compute; kt_comm_busy − kt_comm_hidden is exposed) and intervals;
     * kernel_timeline 0: not measured.  Filled by the caller. */
    int kernel_timeline;
    double kt_wall[SPB_RUN_KT_PHASES], kt_busy[SPB_RUN_KT_PHASES], kt_comm_busy[SPB_RUN_KT_PHASES],
        kt_comm_hidden[SPB_RUN_KT_PHASES], kt_intervals;
} spb_run_summary;

/* Collective over the trainer's world: every rank calls, every rank gets
 * the same summary.  times: the measured iterations' times (sorted here);
 * device_used_peak: this rank's sampled driver reading (-1: none). */
void spb_summarize_run(spb_run_summary *s, const spb_trainer *tr, double *times, int measured, double first_loss,
                       double final_loss, double device_used_peak);
void spb_print_summary(const spb_run_summary *s, const spb_config *cfg);
/* Appends the results row to cfg->results; 0 or -1 with a message. */
int spb_append_results_row(const spb_run_summary *s, const spb_trainer *tr, char *err, size_t errlen);
/* Before the first iteration: whether the row could be appended to
 * cfg->results (its header, if the file has one, has the row's columns). */
int spb_check_results_file(const spb_trainer *tr, char *err, size_t errlen);

#endif
