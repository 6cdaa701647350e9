#define _DEFAULT_SOURCE
#include "run_summary.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "bf16_direct.h"
#include "flops.h"
#include "memory_model.h"
#include "ops.h"
#include "predicted_bytes.h"
#include "report.h"
#include "zero.h"
#include "spb_version.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void spb_summarize_run(spb_run_summary *s, const spb_trainer *tr, double *times, int measured, double first_loss,
                       double final_loss, double device_used_peak)
{
    const spb_config *cfg = &tr->cfg;
    MPI_Comm world_comm = tr->grid->world;
    const double per = measured ? 1.0 / measured : 0.0;
    *s = (spb_run_summary){.world = tr->grid->world_size, .measured = measured, .first_loss = first_loss,
                           .final_loss = final_loss, .t_med = NAN, .t_min = NAN, .t_max = NAN,
                           .t_mean = measured > 0 ? 0.0 : NAN, .host_waits = -1, .staged_fallbacks = -1};
    if (!strcmp(cfg->comm, "nccl")) {
        s->staged_fallbacks = (double)spb_comm_device_fallbacks();
        spb_allreduce_max_f64(&s->staged_fallbacks, 1, world_comm, SPB_PHASE_OTHER);
    }
    s->tokens_per_iter = (double)cfg->global_batch_size * cfg->seq_length;
    s->paper_flops = spb_paper_flops_per_iteration(cfg, cfg->checkpoint_activations);
    if (measured > 0) {
        qsort(times, (size_t)measured, sizeof(double), cmp_double);
        s->t_med = measured % 2 ? times[measured / 2] : 0.5 * (times[measured / 2 - 1] + times[measured / 2]);
        s->t_min = times[0];
        s->t_max = times[measured - 1];
        for (int i = 0; i < measured; i++) s->t_mean += times[i] / measured;
    }
    double counted[2] = {spb_gemm_flops() * per, tr->gpt->attn_flops * per};
    spb_allreduce_sum_f64(counted, 2, world_comm, SPB_PHASE_OTHER);
    s->counted_gemm = counted[0], s->counted_attn = counted[1];

    /* The tracker of the device the model lives on (the GPU's for --device cuda). */
    const spb_mem_stats *ms = tr->gpt->be->mem_stats();
    for (int c = 0; c < SPB_MEM_NUM_CATEGORIES; c++) s->peaks[c] = (double)ms->peak[c];
    s->peaks[SPB_MEM_NUM_CATEGORIES] = (double)ms->peak_total;
    spb_allreduce_max_f64(s->peaks, SPB_MEM_NUM_CATEGORIES + 1, world_comm, SPB_PHASE_OTHER);
    s->device_used_peak = device_used_peak;
    spb_allreduce_max_f64(&s->device_used_peak, 1, world_comm, SPB_PHASE_OTHER);

    /* The breakdown of the slowest rank (by time in forward, backward,
     * reduction and optimizer), whole, so that its parts add up. */
    for (int k = 0; k < SPB_NUM_TIMERS; k++) s->timers[k] = spb_timer_get((spb_timer_id)k) * per;
    for (int o = 0; o < SPB_NUM_OPS; o++)
        for (int p = SPB_PHASE_FORWARD; p <= SPB_PHASE_RECOMPUTE; p++)
            s->timers[SPB_T_LAYER_COMM] += spb_comm_record_get((spb_comm_op)o, (spb_comm_phase)p)->seconds * per;
    struct { double busy; int rank; } mine = {s->timers[SPB_T_FORWARD] + s->timers[SPB_T_BACKWARD] +
                                                  s->timers[SPB_T_GRAD_REDUCE] + s->timers[SPB_T_OPTIMIZER],
                                              tr->grid->world_rank},
                                      slowest;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE_INT, MPI_MAXLOC, world_comm);
    MPI_Bcast(s->timers, SPB_NUM_TIMERS + 1, MPI_DOUBLE, slowest.rank, world_comm);

    /* Communication per (op, phase): bytes are the same on every rank of a
     * strategy with equal shares (uneven ones: the largest), time is the
     * slowest rank's.  Per phase, the busiest rank's total. */
    for (int p = 0; p < SPB_NUM_PHASES; p++) s->phase_link[p] = 0;
    for (int k = 0; k < SPB_COMM_SLOTS; k++) {
        const spb_comm_record *rec = spb_comm_record_get((spb_comm_op)(k / SPB_NUM_PHASES),
                                                         (spb_comm_phase)(k % SPB_NUM_PHASES));
        s->calls[k] = rec->calls * per, s->payload[k] = rec->payload_bytes * per;
        s->link[k] = rec->link_bytes * per, s->seconds[k] = rec->seconds * per;
        s->phase_link[k % SPB_NUM_PHASES] += s->link[k];
    }
    spb_allreduce_max_f64(s->phase_link, SPB_NUM_PHASES, world_comm, SPB_PHASE_OTHER);
    /* One reduction for the four arrays, which lie side by side. */
    _Static_assert(offsetof(spb_run_summary, seconds) == offsetof(spb_run_summary, calls) + 3 * sizeof s->calls,
                   "calls, payload, link and seconds must be contiguous");
    spb_allreduce_max_f64(s->calls, 4 * SPB_COMM_SLOTS, world_comm, SPB_PHASE_OTHER);
    for (int k = 0; k < SPB_COMM_SLOTS; k++) s->link_total += s->link[k];

    /* Pack/unpack overhead: the exchange time less the time inside the
     * all-to-alls themselves is what the strategy's own copies cost; the
     * yardstick is plain MPI_Alltoall of the same counts, replayed. */
    double a2a_calls = 0, a2a_inside = 0;
    for (int p = 0; p < SPB_NUM_PHASES; p++) {
        const spb_comm_record *rec = spb_comm_record_get(SPB_OP_ALLTOALL, (spb_comm_phase)p);
        a2a_calls += (double)rec->calls, a2a_inside += rec->seconds * per;
    }
    double p2p_calls = 0;
    for (int p = 0; p < SPB_NUM_PHASES; p++) p2p_calls += (double)spb_comm_record_get(SPB_OP_SENDRECV, (spb_comm_phase)p)->calls;
    double local[3] = {spb_timer_get(SPB_T_EXCHANGE) * per - a2a_inside, 0.0, 0.0};
    if (cfg->compare_alltoall && a2a_calls > 0) local[1] = spb_comm_replay_alltoalls() * per;
    if (cfg->compare_alltoall && p2p_calls > 0) local[2] = spb_comm_replay_sendrecvs() * per;
    spb_allreduce_max_f64(local, 3, world_comm, SPB_PHASE_OTHER);
    s->pack_unpack = local[0], s->plain_alltoall = local[1], s->plain_sendrecv = local[2];
    /* exposed: the slowest rank's blocked time in the layers' exchanges */
    s->exposed_alltoall = s->exposed_sendrecv = 0;
    static const spb_comm_phase layer_phases[] = {SPB_PHASE_FORWARD, SPB_PHASE_BACKWARD, SPB_PHASE_RECOMPUTE};
    for (int i = 0; i < 3; i++) {
        s->exposed_alltoall += s->seconds[SPB_OP_ALLTOALL * SPB_NUM_PHASES + layer_phases[i]];
        s->exposed_sendrecv += s->seconds[SPB_OP_SENDRECV * SPB_NUM_PHASES + layer_phases[i]];
    }
    s->exchange = s->timers[SPB_T_EXCHANGE];
}

/* The part of the transfers' own time that did not block the rank. */
static double hidden(double alone, double exposed) { return alone > exposed ? alone - exposed : 0.0; }

static double other_compute(const spb_run_summary *s)
{
    return s->timers[SPB_T_FORWARD] + s->timers[SPB_T_BACKWARD] - s->timers[SPB_T_GEMM] -
           s->timers[SPB_T_ATTENTION] - s->timers[SPB_T_LAYER_COMM];
}

/* The step's wall time outside every top-level phase's timed region, per
 * iteration.  On a GPU the phases are regions of the device's timeline
 * (events on its stream): this is where the GPU sat idle between them
 * (waiting for the host to enqueue the next phase, or drained by a
 * synchronisation at a phase boundary), plus the host's time before the
 * step's first kernel.  Idle time between kernels inside a phase is not
 * separated here.  On the CPU it is the step's untimed host code. */
static double between_phases(const spb_run_summary *s)
{
    return s->t_mean - (s->timers[SPB_T_DATA] + s->timers[SPB_T_FORWARD] + s->timers[SPB_T_BACKWARD] +
                        s->timers[SPB_T_GRAD_REDUCE] + s->timers[SPB_T_OPTIMIZER]);
}

/* --kernel-timeline: the time the GPU sat idle between kernels inside the
 * step's phases (each phase's wall time less the union of its kernels). */
static double kt_idle_in_phases(const spb_run_summary *s)
{
    double idle = 0.0;
    for (int k = 0; k < SPB_RUN_KT_PHASES - 1; k++) idle += s->kt_wall[k] - s->kt_busy[k];
    return idle;
}

/* ... and the share of the step it sat idle: inside the phases, and between
 * them less the kernels launched there (the gradients' zeroing before the
 * forward, for one). */
static double kt_idle_share(const spb_run_summary *s)
{
    double between = between_phases(s) - s->kt_busy[SPB_RUN_KT_PHASES - 1];
    return (kt_idle_in_phases(s) + (between > 0 ? between : 0.0)) / s->t_mean;
}

/* Peak memory by category (measured) and the memory model's figures for both precisions. */
static void print_memory(const spb_run_summary *s, const spb_config *cfg)
{
    printf("peak memory/rank (MiB):");
    for (int c = 0; c < SPB_MEM_NUM_CATEGORIES; c++)
        printf(" %s %.2f", spb_mem_category_name((spb_mem_category)c), s->peaks[c] / 1048576.0);
    printf(" | total %.2f", s->peaks[SPB_MEM_NUM_CATEGORIES] / 1048576.0);
    if (s->device_used_peak >= 0) /* the driver's view beside the tracker's */
        printf(" | device in use (driver, sampled at step ends; context and ranks sharing the GPU included) %.2f",
               s->device_used_peak / 1048576.0);
    printf("\n");
    /* The model covers what the configuration fixes (not workspace or
     * communication buffers); the measured peaks above match the line of the
     * run's --precision, the other is what that precision would hold. */
    spb_memory_prediction fp32, bf16;
    spb_memory_model(cfg, s->world, SPB_FP32, &fp32);
    spb_memory_model(cfg, s->world, SPB_BF16_MIXED, &bf16);
    static const spb_mem_category shown[] = {SPB_MEM_PARAMS, SPB_MEM_GRADS, SPB_MEM_OPTIMIZER, SPB_MEM_ACTIVATIONS};
    const int bf16_run = spb_memory_precision(cfg) == SPB_BF16_MIXED;
    printf("memory model (MiB/rank): fp32%s", bf16_run ? "" : " (this run)");
    for (int k = 0; k < 4; k++) printf(" %s %.2f", spb_mem_category_name(shown[k]), fp32.bytes[shown[k]] / 1048576.0);
    /* fp16 holds what bf16 holds (2-byte elements, fp32 masters and moments) */
    printf(" | %s mixed precision%s", strcmp(cfg->precision, "fp16") ? "bf16" : "fp16", bf16_run ? " (this run)" : "");
    for (int k = 0; k < 4; k++) printf(" %s %.2f", spb_mem_category_name(shown[k]), bf16.bytes[shown[k]] / 1048576.0);
    printf("\n");
}

/* The measured iterations: time, rate, the step's breakdown and the traffic per collective. */
static void print_timings(const spb_run_summary *s, const spb_config *cfg)
{
    const double *t = s->timers;
    double compute = t[SPB_T_FORWARD] + t[SPB_T_BACKWARD];
    printf("summary: %d measured iterations | iteration time median %.2f ms (min %.2f, max %.2f) | tokens/s %.0f | "
           "TFLOPs/rank paper %.4f counted %.4f | loss %.4f -> %.4f\n",
           s->measured, s->t_med * 1e3, s->t_min * 1e3, s->t_max * 1e3, s->tokens_per_iter / s->t_med,
           s->paper_flops / s->t_med / s->world / 1e12,
           (s->counted_gemm + s->counted_attn) / s->t_med / s->world / 1e12, s->first_loss, s->final_loss);
    printf("time/iteration (ms, slowest rank):");
    for (int k = 0; k < SPB_NUM_TIMERS; k++) printf(" %s %.2f", spb_timer_name((spb_timer_id)k), t[k] * 1e3);
    printf(" | gemm share of compute %.1f%% at %.2f GFLOP/s per rank\n",
           compute > 0 ? 100 * t[SPB_T_GEMM] / compute : NAN,
           t[SPB_T_GEMM] > 0 ? s->counted_gemm / s->world / t[SPB_T_GEMM] / 1e9 : NAN);
    printf("step breakdown of the slowest rank (ms/iteration): matrix products %.2f | attention %.2f | other compute "
           "%.2f | communication in layers %.2f | gradient reduction %.2f | optimizer %.2f | all communication "
           "%.1f%% of the step | between phases %.2f (%.1f%% of the mean step: %s)\n",
           t[SPB_T_GEMM] * 1e3, t[SPB_T_ATTENTION] * 1e3, other_compute(s) * 1e3, t[SPB_T_LAYER_COMM] * 1e3,
           t[SPB_T_GRAD_REDUCE] * 1e3, t[SPB_T_OPTIMIZER] * 1e3, 100 * t[SPB_T_COMM] / s->t_med,
           between_phases(s) * 1e3, 100 * between_phases(s) / s->t_mean,
           strcmp(cfg->device, "cpu") ? "the device idle between phases, host gaps and synchronisations"
                                      : "untimed host code");
    if (s->kernel_timeline)
        printf("kernel timeline (ms/iteration, rank 0): GPU busy / idle between kernels: forward %.3f / %.3f | "
               "backward %.3f / %.3f | grad_reduce %.3f / %.3f | optimizer %.3f / %.3f | outside the phases busy "
               "%.3f | idle in phases %.3f + between phases %.3f less the busy outside them = %.1f%% of the mean step | "
               "%.1f intervals\n",
               s->kt_busy[0] * 1e3, (s->kt_wall[0] - s->kt_busy[0]) * 1e3, s->kt_busy[1] * 1e3,
               (s->kt_wall[1] - s->kt_busy[1]) * 1e3, s->kt_busy[2] * 1e3, (s->kt_wall[2] - s->kt_busy[2]) * 1e3,
               s->kt_busy[3] * 1e3, (s->kt_wall[3] - s->kt_busy[3]) * 1e3, s->kt_busy[4] * 1e3,
               kt_idle_in_phases(s) * 1e3, between_phases(s) * 1e3,
               100 * kt_idle_share(s), s->kt_intervals);
    if (s->kernel_timeline && s->kt_comm_busy[0] + s->kt_comm_busy[1] + s->kt_comm_busy[2] + s->kt_comm_busy[3] +
                                      s->kt_comm_busy[4] > 0) {
        printf("kernel timeline: of the busy time, NCCL's (ms/iteration), of that hidden behind compute: forward "
               "%.3f, %.3f | backward %.3f, %.3f | grad_reduce %.3f, %.3f | optimizer %.3f, %.3f | outside %.3f, %.3f\n",
               s->kt_comm_busy[0] * 1e3, s->kt_comm_hidden[0] * 1e3, s->kt_comm_busy[1] * 1e3,
               s->kt_comm_hidden[1] * 1e3, s->kt_comm_busy[2] * 1e3, s->kt_comm_hidden[2] * 1e3,
               s->kt_comm_busy[3] * 1e3, s->kt_comm_hidden[3] * 1e3, s->kt_comm_busy[4] * 1e3,
               s->kt_comm_hidden[4] * 1e3);
        /* the layers' communication through NCCL, measured: the transfers'
         * time on their stream (busy), the part with compute beside it
         * (hidden), the rest exposed (the replay below cannot tell them
         * apart through NCCL: docs/STRATEGIES.md) */
        const double busy = s->kt_comm_busy[0] + s->kt_comm_busy[1], hid = s->kt_comm_hidden[0] + s->kt_comm_hidden[1];
        if (busy > 0)
            printf("layer communication exposed vs hidden behind compute, measured on the kernel timeline "
                   "(ms/iteration, rank 0, the NCCL calls of the forward and backward phases, ZeRO-3's gathers if any "
                   "included): exposed %.3f, hidden %.3f of %.3f on the communication stream (%.1f%% hidden) | "
                   "forward exposed %.3f, hidden %.3f | backward exposed %.3f, hidden %.3f\n",
                   (busy - hid) * 1e3, hid * 1e3, busy * 1e3, 100 * hid / busy,
                   (s->kt_comm_busy[0] - s->kt_comm_hidden[0]) * 1e3, s->kt_comm_hidden[0] * 1e3,
                   (s->kt_comm_busy[1] - s->kt_comm_hidden[1]) * 1e3, s->kt_comm_hidden[1] * 1e3);
    }
    if (s->host_waits >= 0) printf("host waits on the device inside the step: %.1f per iteration\n", s->host_waits);
    if (s->staged_fallbacks > 0)
        printf("collectives that took the host-staged path instead of the device table: %.0f (most on one rank)\n",
               s->staged_fallbacks);
    if (s->link_total > 0 || t[SPB_T_COMM] > 0) {
        printf("  %-15s %-12s %7s %14s %14s %10s %11s %11s\n", "collective", "phase", "calls", "payload MiB",
               "MiB/link", "time ms", "algbw GB/s", "busbw GB/s");
        for (int k = 0; k < SPB_COMM_SLOTS; k++) {
            if (s->calls[k] == 0) continue;
            double sec = s->seconds[k];
            printf("  %-15s %-12s %7.0f %14.3f %14.3f %10.3f %11.3f %11.3f\n",
                   spb_comm_op_name((spb_comm_op)(k / SPB_NUM_PHASES)),
                   spb_comm_phase_name((spb_comm_phase)(k % SPB_NUM_PHASES)), s->calls[k], s->payload[k] / 1048576.0,
                   s->link[k] / 1048576.0, sec * 1e3, sec > 0 ? s->payload[k] / sec / 1e9 : 0.0,
                   sec > 0 ? s->link[k] / sec / 1e9 : 0.0);
        }
    }
    if (cfg->compare_alltoall && s->plain_alltoall > 0)
        printf("all-to-all (ms/iteration): plain MPI_Alltoall of the run's counts, replayed back to back %.3f | the "
               "strategy's pack + unpack %.3f | (plain + pack/unpack) / plain = %.3f | in-run exchanges %.3f (include "
               "waiting for other ranks)\n",
               s->plain_alltoall * 1e3, s->pack_unpack * 1e3, (s->plain_alltoall + s->pack_unpack) / s->plain_alltoall,
               s->exchange * 1e3);
    if (cfg->compare_alltoall && (s->plain_alltoall > 0 || s->plain_sendrecv > 0))
        printf("layer communication exposed vs hidden behind compute (ms/iteration): all-to-all exposed %.3f of %.3f "
               "alone, hidden %.3f | sendrecv exposed %.3f of %.3f alone, hidden %.3f (alone: the same transfers "
               "replayed back to back; exposed includes waiting for slower ranks)\n",
               s->exposed_alltoall * 1e3, s->plain_alltoall * 1e3, hidden(s->plain_alltoall, s->exposed_alltoall) * 1e3,
               s->exposed_sendrecv * 1e3, s->plain_sendrecv * 1e3, hidden(s->plain_sendrecv, s->exposed_sendrecv) * 1e3);
    if (cfg->compare_alltoall && (s->plain_alltoall > 0 || s->plain_sendrecv > 0) && s->kernel_timeline &&
        s->kt_comm_busy[0] + s->kt_comm_busy[1] > 0)
        printf("  (through NCCL the replay's exposed is each transfer's own time on its stream and its hidden reads 0; "
               "the kernel timeline's measured split is the line \"layer communication exposed vs hidden behind "
               "compute, measured on the kernel timeline\" above)\n");
}

/* Which path the 16-bit operations took (bf16_direct.h): under fast a call
 * left on the frames is one the direct kernels could not take (a shape, an
 * alignment, cuDNN declining), worth knowing on a GPU. */
static void print_16bit_paths(const spb_config *cfg)
{
    if (!strcmp(cfg->precision, "fp32")) return;
    spb_bf16_direct_counts n = spb_bf16_direct_get_counts();
    printf("16-bit operations, rank 0, whole run (--bf16-kernels %s): direct: products %ld, attention %ld, "
           "row-wise %ld, memory %ld, optimizer %ld, embedding %ld, bias %ld, merge %ld | frames: products %ld, "
           "attention %ld, row-wise %ld, memory %ld, optimizer %ld, embedding %ld, bias %ld, merge %ld\n",
           cfg->bf16_kernels, n.matmul_direct, n.attention_direct, n.rowwise_direct, n.memory_direct,
           n.optimizer_direct, n.embedding_direct, n.bias_direct, n.merge_direct, n.matmul_frames,
           n.attention_frames, n.rowwise_frames, n.memory_frames, n.optimizer_frames, n.embedding_frames,
           n.bias_frames, n.merge_frames);
    if (spb_config_uses_cuda_flash(cfg))
        printf("flash kernels: %d query rows per block, dQ %s, forward on %s, backward on %s (--flash-block-rows, "
               "--flash-dq, --flash-fwd, --flash-bwd)\n",
               spb_config_flash_block_rows(cfg), spb_config_flash_dq(cfg), spb_config_flash_fwd(cfg),
               spb_config_flash_bwd(cfg));
}

void spb_print_summary(const spb_run_summary *s, const spb_config *cfg)
{
    if (s->measured > 0)
        print_timings(s, cfg);
    else /* every iteration was warm-up: nan and zeros would read as figures */
        printf("summary: no measured iterations (--train-iters %d, the first %d excluded by --timing-warmup): no "
               "time, rate or traffic to report; run more iterations than --timing-warmup | loss %.4f -> %.4f\n",
               cfg->train_iters, cfg->timing_warmup, s->first_loss, s->final_loss);
    print_16bit_paths(cfg);
    print_memory(s, cfg);
    fflush(stdout);
}

/* Link bytes and seconds summed over the slots of one op (phase < 0) or of
 * one phase (op < 0). */
static void comm_sum(const spb_run_summary *s, int op, int phase, double *link, double *sec)
{
    *link = *sec = 0;
    for (int k = 0; k < SPB_COMM_SLOTS; k++)
        if ((op < 0 || k / SPB_NUM_PHASES == op) && (phase < 0 || k % SPB_NUM_PHASES == phase))
            *link += s->link[k], *sec += s->seconds[k];
}

/* The row, appended to cfg->results, or (check_only) only compared with
 * the file's header. */
static int results_row(const spb_run_summary *s, const spb_trainer *tr, int check_only, char *err, size_t errlen)
{
    const spb_config *c = &tr->cfg;
    const spb_grid *g = tr->grid;
    spb_row r = {0};
    char host[128] = "unknown", date[32], key[40];
    gethostname(host, sizeof host);
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    spb_row_add(&r, "run_name", "%s", c->run_name);
    spb_row_add(&r, "status", "%s", "ok");
    spb_row_add(&r, "strategy", "%s", c->strategy);
    spb_row_add(&r, "device", "%s", c->device);
    spb_row_add(&r, "comm", "%s", c->comm);
    spb_row_add(&r, "precision", "%s", c->precision);
    spb_row_add(&r, "bf16_kernels", "%s", c->bf16_kernels);
    spb_row_add(&r, "attention", "%s", c->attention);
    if (spb_config_uses_cuda_flash(c)) {
        spb_row_add(&r, "flash_block_rows", "%d", spb_config_flash_block_rows(c));
        spb_row_add(&r, "flash_dq", "%s", spb_config_flash_dq(c));
        spb_row_add(&r, "flash_fwd", "%s", spb_config_flash_fwd(c));
        spb_row_add(&r, "flash_bwd", "%s", spb_config_flash_bwd(c));
    } else { /* no flash kernels in this run: empty, as bf16_kernels for fp32 */
        spb_row_add(&r, "flash_block_rows", "%s", "");
        spb_row_add(&r, "flash_dq", "%s", "");
        spb_row_add(&r, "flash_fwd", "%s", "");
        spb_row_add(&r, "flash_bwd", "%s", "");
    }
    spb_row_add(&r, "world_size", "%d", g->world_size);
    spb_row_add(&r, "dp", "%d", g->dp_size);
    spb_row_add(&r, "sp", "%d", g->sp_size);
    spb_row_add(&r, "zero_stage", "%d", c->zero_stage);
    spb_row_add(&r, "checkpoint_activations", "%d", c->checkpoint_activations);
    spb_row_add(&r, "ring_layout", "%s", c->ring_layout);
    spb_row_add(&r, "ulysses_comm", "%s", c->ulysses_comm);
    spb_row_add(&r, "memory_budget_bytes", "%.0f", c->memory_budget[0] ? spb_parse_bytes(c->memory_budget) : 0.0);
    spb_row_add(&r, "attention_mask", "%s", c->attention_mask);
    spb_row_add(&r, "sparse_block", "%d", c->sparse_block);
    spb_row_add(&r, "sparse_local_blocks", "%d", c->sparse_local_blocks);
    spb_row_add(&r, "sparse_global_blocks", "%d", c->sparse_global_blocks);
    spb_row_add(&r, "num_layers", "%d", c->num_layers);
    spb_row_add(&r, "hidden_size", "%d", c->hidden_size);
    spb_row_add(&r, "num_heads", "%d", c->num_heads);
    spb_row_add(&r, "ffn_hidden_size", "%d", c->ffn_hidden_size);
    spb_row_add(&r, "vocab_size", "%d", c->vocab_size);
    spb_row_add(&r, "seq_length", "%d", c->seq_length);
    spb_row_add(&r, "micro_batch_size", "%d", c->micro_batch_size);
    spb_row_add(&r, "global_batch_size", "%d", c->global_batch_size);
    spb_row_add(&r, "num_params", "%ld", tr->gpt->num_global_params);
    spb_row_add(&r, "train_iters", "%d", c->train_iters);
    spb_row_add(&r, "measured_iters", "%d", s->measured);
    spb_row_add(&r, "iter_time_median_s", "%.6g", s->t_med);
    spb_row_add(&r, "iter_time_min_s", "%.6g", s->t_min);
    spb_row_add(&r, "iter_time_max_s", "%.6g", s->t_max);
    spb_row_add(&r, "tokens_per_s", "%.6g", s->tokens_per_iter / s->t_med);
    spb_row_add(&r, "tflops_paper_per_rank", "%.6g", s->paper_flops / s->t_med / s->world / 1e12);
    spb_row_add(&r, "tflops_counted_per_rank", "%.6g",
                (s->counted_gemm + s->counted_attn) / s->t_med / s->world / 1e12);
    spb_row_add(&r, "gemm_gflops_per_rank", "%.6g",
                s->timers[SPB_T_GEMM] > 0 ? s->counted_gemm / s->world / s->timers[SPB_T_GEMM] / 1e9 : NAN);
    spb_row_add(&r, "first_loss", "%.6f", s->first_loss);
    spb_row_add(&r, "final_loss", "%.6f", s->final_loss);
    for (int k = 0; k < SPB_NUM_TIMERS; k++) {
        snprintf(key, sizeof key, "time_%s_s", spb_timer_name((spb_timer_id)k));
        spb_row_add(&r, key, "%.6g", s->timers[k]);
    }
    for (int k = 0; k < SPB_MEM_NUM_CATEGORIES; k++) {
        snprintf(key, sizeof key, "peak_mem_%s_bytes", spb_mem_category_name((spb_mem_category)k));
        spb_row_add(&r, key, "%.0f", s->peaks[k]);
    }
    spb_row_add(&r, "peak_mem_total_bytes", "%.0f", s->peaks[SPB_MEM_NUM_CATEGORIES]);
    if (s->device_used_peak >= 0)
        spb_row_add(&r, "device_used_peak_bytes", "%.0f", s->device_used_peak);
    else
        spb_row_add(&r, "device_used_peak_bytes", "%s", "");
    spb_memory_prediction model;
    spb_memory_model(c, g->world_size, SPB_FP32, &model);
    spb_row_add(&r, "model_fp32_bytes", "%.0f", model.total);
    spb_memory_model(c, g->world_size, SPB_BF16_MIXED, &model);
    spb_row_add(&r, "modelled_bf16_bytes", "%.0f", model.total);
    spb_row_add(&r, "layer_comm_s", "%.6g", s->timers[SPB_T_LAYER_COMM]);
    spb_row_add(&r, "other_compute_s", "%.6g", other_compute(s));
    spb_row_add(&r, "time_between_phases_s", "%.6g", between_phases(s));
    if (s->host_waits >= 0)
        spb_row_add(&r, "host_waits_per_iter", "%.6g", s->host_waits);
    else
        spb_row_add(&r, "host_waits_per_iter", "%s", "");
    static const char *kt_names[SPB_RUN_KT_PHASES] = {"forward", "backward", "grad_reduce", "optimizer", "outside"};
    spb_row_add(&r, "kernel_timeline", "%d", s->kernel_timeline);
    for (int k = 0; k < SPB_RUN_KT_PHASES; k++) {
        snprintf(key, sizeof key, "gpu_busy_%s_s", kt_names[k]);
        if (s->kernel_timeline)
            spb_row_add(&r, key, "%.6g", s->kt_busy[k]);
        else
            spb_row_add(&r, key, "%s", "");
        if (k == SPB_RUN_KT_PHASES - 1) break; /* outside the phases: no wall time of its own */
        snprintf(key, sizeof key, "gpu_idle_%s_s", kt_names[k]);
        if (s->kernel_timeline)
            spb_row_add(&r, key, "%.6g", s->kt_wall[k] - s->kt_busy[k]);
        else
            spb_row_add(&r, key, "%s", "");
    }
    if (s->kernel_timeline) {
        spb_row_add(&r, "gpu_idle_in_phases_s", "%.6g", kt_idle_in_phases(s));
        spb_row_add(&r, "gpu_idle_share", "%.6g", kt_idle_share(s));
        spb_row_add(&r, "kernel_intervals_per_iter", "%.6g", s->kt_intervals);
    } else {
        spb_row_add(&r, "gpu_idle_in_phases_s", "%s", "");
        spb_row_add(&r, "gpu_idle_share", "%s", "");
        spb_row_add(&r, "kernel_intervals_per_iter", "%s", "");
    }
    for (int k = 0; k < SPB_RUN_KT_PHASES; k++) { /* the NCCL calls' part of gpu_busy_<phase>_s */
        snprintf(key, sizeof key, "gpu_comm_busy_%s_s", kt_names[k]);
        if (s->kernel_timeline)
            spb_row_add(&r, key, "%.6g", s->kt_comm_busy[k]);
        else
            spb_row_add(&r, key, "%s", "");
    }
    for (int k = 0; k < SPB_RUN_KT_PHASES; k++) { /* of that, the part with compute beside it */
        snprintf(key, sizeof key, "gpu_comm_hidden_%s_s", kt_names[k]);
        if (s->kernel_timeline)
            spb_row_add(&r, key, "%.6g", s->kt_comm_hidden[k]);
        else
            spb_row_add(&r, key, "%s", "");
    }
    spb_row_add(&r, "comm_time_s", "%.6g", s->timers[SPB_T_COMM]);
    spb_row_add(&r, "comm_fraction", "%.6g", s->timers[SPB_T_COMM] / s->t_med);
    spb_row_add(&r, "comm_link_bytes", "%.0f", s->link_total);
    if (s->staged_fallbacks >= 0)
        spb_row_add(&r, "comm_staged_fallbacks", "%.0f", s->staged_fallbacks);
    else
        spb_row_add(&r, "comm_staged_fallbacks", "%s", "");
    spb_row_add(&r, "alltoall_pack_unpack_s", "%.6g", s->pack_unpack);
    spb_row_add(&r, "alltoall_plain_s", "%.6g", s->plain_alltoall > 0 ? s->plain_alltoall : NAN);
    spb_row_add(&r, "alltoall_overhead_ratio", "%.6g",
                s->plain_alltoall > 0 ? (s->plain_alltoall + s->pack_unpack) / s->plain_alltoall : NAN);
    spb_row_add(&r, "alltoall_exposed_s", "%.6g", s->exposed_alltoall);
    spb_row_add(&r, "alltoall_hidden_s", "%.6g", s->plain_alltoall > 0 ? hidden(s->plain_alltoall, s->exposed_alltoall) : NAN);
    spb_row_add(&r, "sendrecv_exposed_s", "%.6g", s->exposed_sendrecv);
    spb_row_add(&r, "sendrecv_plain_s", "%.6g", s->plain_sendrecv > 0 ? s->plain_sendrecv : NAN);
    spb_row_add(&r, "sendrecv_hidden_s", "%.6g", s->plain_sendrecv > 0 ? hidden(s->plain_sendrecv, s->exposed_sendrecv) : NAN);
    double link, sec;
    for (int o = 0; o < SPB_NUM_OPS; o++) {
        comm_sum(s, o, -1, &link, &sec);
        snprintf(key, sizeof key, "%s_link_bytes", spb_comm_op_name((spb_comm_op)o));
        spb_row_add(&r, key, "%.0f", link);
        snprintf(key, sizeof key, "%s_s", spb_comm_op_name((spb_comm_op)o));
        spb_row_add(&r, key, "%.6g", sec);
    }
    for (int p = 0; p < SPB_NUM_PHASES; p++) {
        comm_sum(s, -1, p, &link, &sec);
        snprintf(key, sizeof key, "%s_link_bytes", spb_comm_phase_name((spb_comm_phase)p));
        spb_row_add(&r, key, "%.0f", s->phase_link[p]); /* the busiest rank's */
        snprintf(key, sizeof key, "%s_comm_s", spb_comm_phase_name((spb_comm_phase)p));
        spb_row_add(&r, key, "%.6g", sec);
    }
    /* The main collectives by phase (the strategy's own traffic). */
    const spb_comm_op main_ops[] = {SPB_OP_ALLTOALL, SPB_OP_ALLGATHER, SPB_OP_REDUCE_SCATTER, SPB_OP_SENDRECV};
    const spb_comm_phase layer_phases[] = {SPB_PHASE_FORWARD, SPB_PHASE_BACKWARD, SPB_PHASE_RECOMPUTE};
    for (int o = 0; o < 4; o++)
        for (int p = 0; p < 3; p++) {
            comm_sum(s, main_ops[o], layer_phases[p], &link, &sec);
            snprintf(key, sizeof key, "%s_%s_link_bytes", spb_comm_op_name(main_ops[o]),
                     spb_comm_phase_name(layer_phases[p]));
            spb_row_add(&r, key, "%.0f", link);
        }
    /* The formulas beside the measurement (common/core/zero.h). */
    spb_predicted_bytes predicted;
    spb_predicted_link_bytes(c, g->world_size, &predicted);
    spb_row_add_predicted_bytes(&r, &predicted);
    spb_row_add(&r, "machine", "%s/%ldcores", host, sysconf(_SC_NPROCESSORS_ONLN));
    spb_row_add(&r, "machines", "%d", g->placement.machines);
    spb_row_add(&r, "sp_group_machines", "%d", g->placement.sp_machines);
    spb_row_add(&r, "dp_group_machines", "%d", g->placement.dp_machines);
    spb_row_add(&r, "blas", "%s", spb_blas_description());
    spb_row_add(&r, "commit", "%s", SPB_VERSION_COMMIT);
    spb_row_add(&r, "date", "%s", date);
    return check_only ? spb_row_check_csv(&r, c->results, err, errlen) : spb_row_append_csv(&r, c->results, err, errlen);
}

int spb_append_results_row(const spb_run_summary *s, const spb_trainer *tr, char *err, size_t errlen)
{
    return results_row(s, tr, 0, err, errlen);
}

int spb_check_results_file(const spb_trainer *tr, char *err, size_t errlen)
{
    spb_run_summary zero;
    memset(&zero, 0, sizeof zero); /* only the columns' names are compared */
    return results_row(&zero, tr, 1, err, errlen);
}
