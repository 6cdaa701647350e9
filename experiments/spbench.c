/* spbench: train a GPT with a sequence-parallel strategy on MPI ranks and
 * report Megatron-style iteration lines and one CSV summary row. */
#define _DEFAULT_SOURCE
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/checks.h"
#include "../common/checkpoint.h"
#include "../common/comm.h"
#include "../common/config.h"
#include "../common/flops.h"
#include "../common/grid.h"
#include "../common/memory.h"
#include "../common/ops.h"
#include "../common/report.h"
#include "../common/timer.h"
#include "../common/train.h"
#include "spb_version.h"
#ifdef SPB_HAVE_CUDA
#include "../common/cuda/cuda_device.h"
#endif

/* Every rank reaches the same verdict: rank 0 prints it, all exit 2. */
static int agree_on_error(int local_failed, const char *msg, int rank)
{
    int any = 0;
    MPI_Allreduce(&local_failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!any) return 0;
    /* The message of the lowest failing rank, so exactly one line is printed. */
    int first = local_failed ? rank : 1 << 30, lowest = 0;
    MPI_Allreduce(&first, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == lowest) {
        fprintf(stderr, "spbench: error: %s\n", msg);
        fflush(stderr);
    }
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The whole global batch of iteration `it`, for the dump. */
static void global_batch(const spb_trainer *t, long it, int *inputs, int *targets)
{
    int T = t->cfg.seq_length;
    for (long s = 0; s < t->cfg.global_batch_size; s++) {
        spb_data_sequence(t->data, it, s, T, t->seq);
        for (int k = 0; k < T; k++) {
            inputs[s * T + k] = t->seq[k];
            targets[s * T + k] = t->seq[k + 1];
        }
    }
}

static int write_dump(spb_trainer *t, double loss, char *err, size_t errlen)
{
    const spb_config *c = &t->cfg;
    size_t bt = (size_t)c->global_batch_size * c->seq_length;
    int *in = SPB_CHECK_PTR(malloc(bt * sizeof(int))), *tg = SPB_CHECK_PTR(malloc(bt * sizeof(int)));
    global_batch(t, t->iteration, in, tg);
    char ckpt[SPB_PATH_MAX + 8];
    snprintf(ckpt, sizeof ckpt, "%s.ckpt", c->dump);
    int rc = spb_checkpoint_save(ckpt, c, t->gpt, NULL, t->iteration, err, errlen); /* collective */
    float *grads = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)t->gpt->num_global_params));
    spb_gpt_gather_global(t->gpt, t->gpt->grads, grads); /* collective */
    if (!rc && t->grid->world_rank == 0)
        rc = spb_dump_write(c->dump, c->global_batch_size, c->seq_length, c->vocab_size, in, tg, loss, grads,
                            t->gpt->num_global_params, err, errlen);
    free(grads);
    free(in);
    free(tg);
    return rc;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);

    spb_config cfg;
    spb_config_defaults(&cfg);
    char err[2048] = "";
    int prc = spb_config_parse(argc, argv, &cfg, err, sizeof err);
    if (prc == 1) {
        if (rank == 0) spb_config_usage(stdout);
        MPI_Finalize();
        return 0;
    }
    int bad = prc != 0 || spb_config_finalize(&cfg, world, err, sizeof err) != 0;
    if (agree_on_error(bad, err, rank)) {
        MPI_Finalize();
        return 2;
    }

    spb_grid grid;
    spb_grid_create(&grid, MPI_COMM_WORLD, cfg.sp_degree);
    spb_trainer *tr = spb_trainer_create(&cfg, &grid);
    spb_gpt *g = tr->gpt;
    if (cfg.load[0]) {
        long step = 0;
        int lbad = spb_checkpoint_load(cfg.load, &cfg, g, tr->opt, &step, err, sizeof err) != 0;
        if (agree_on_error(lbad, err, rank)) {
            MPI_Finalize();
            return 2;
        }
        tr->iteration = step;
    }

    const double tokens_per_iter = (double)cfg.global_batch_size * cfg.seq_length;
    const double paper_flops = spb_paper_flops_per_iteration(&cfg, 0);
    if (rank == 0 && !cfg.quiet) {
        printf("spbench %s | strategy %s | world %d = D %d x P %d | attention %s | device %s | %s\n",
               SPB_VERSION_COMMIT, cfg.strategy, world, grid.dp_size, grid.sp_size, cfg.attention, cfg.device,
               spb_blas_description());
        printf("model: L %d h %d heads %d ffn %d vocab %d seq %d | %ld parameters | micro %d global %d "
               "(accumulation %d) | data %s\n",
               cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.ffn_hidden_size, cfg.vocab_size, cfg.seq_length,
               g->num_global_params, cfg.micro_batch_size, cfg.global_batch_size, tr->accum_steps,
               cfg.data[0] ? cfg.data : "synthetic");
#ifdef SPB_HAVE_CUDA
        char gpus[256];
        spb_cuda_describe(gpus, sizeof gpus);
        printf("CUDA build: %s\n", gpus);
#endif
        fflush(stdout);
    }

    FILE *loss_log = NULL;
    if (rank == 0 && cfg.loss_log[0]) {
        loss_log = fopen(cfg.loss_log, "w");
        if (!loss_log) snprintf(err, sizeof err, "cannot create --loss-log '%s'", cfg.loss_log);
    }
    if (agree_on_error(rank == 0 && cfg.loss_log[0] && !loss_log, err, rank)) {
        MPI_Finalize();
        return 2;
    }
    if (loss_log) fprintf(loss_log, "iteration,loss,lr,grad_norm,time_ms,tokens\n");

    int iters = cfg.train_iters;
    double *times = SPB_CHECK_PTR(calloc((size_t)iters + 1, sizeof(double)));
    double measured_gemm_flops = 0, measured_attn_flops = 0, final_loss = NAN, first_loss = NAN;
    int measured = 0;
    for (int i = 0; i < iters; i++) {
        if (i == cfg.timing_warmup) {
            /* Statistics cover the iterations after warm-up only. */
            spb_timer_reset_all();
            spb_comm_reset();
            spb_gemm_flops_reset();
            g->attn_flops = 0;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = spb_now();
        double loss = spb_trainer_gradients(tr);
        if (i == 0 && cfg.dump[0]) {
            int dbad = write_dump(tr, loss, err, sizeof err) != 0;
            if (agree_on_error(dbad, err, rank)) {
                MPI_Finalize();
                return 2;
            }
        }
        spb_trainer_update(tr);
        double dt = spb_now() - t0;
        spb_allreduce_max_f64(&dt, 1, MPI_COMM_WORLD, SPB_PHASE_OTHER); /* the slowest rank */
        if (i == 0) first_loss = loss;
        final_loss = loss;
        if (i >= cfg.timing_warmup) times[measured++] = dt;
        if (loss_log)
            fprintf(loss_log, "%ld,%.6f,%.6g,%.6g,%.3f,%.0f\n", tr->iteration, loss, tr->lr, tr->grad_norm, dt * 1e3,
                    tokens_per_iter * tr->iteration);
        if (!isfinite(loss) && rank == 0) fprintf(stderr, "spbench: warning: loss is %g at iteration %ld\n", loss, tr->iteration);
        if (rank == 0 && !cfg.quiet && (tr->iteration % cfg.log_interval == 0 || i == iters - 1)) {
            printf(" iteration %8ld/%8d | elapsed time per iteration (ms): %.1f | learning rate: %.3E | "
                   "global batch size: %5d | lm loss: %.6E | grad norm: %.3f | tokens/s: %.0f | TFLOPs: %.4f |\n",
                   tr->iteration, iters, dt * 1e3, tr->lr, cfg.global_batch_size, loss, tr->grad_norm,
                   tokens_per_iter / dt, paper_flops / dt / world / 1e12);
            fflush(stdout);
        }
    }
    if (loss_log) fclose(loss_log);
    measured_gemm_flops = spb_gemm_flops();
    measured_attn_flops = g->attn_flops;

    /* Summary over ranks. */
    double t_med = NAN, t_min = NAN, t_max = NAN;
    if (measured > 0) {
        qsort(times, (size_t)measured, sizeof(double), cmp_double);
        t_med = measured % 2 ? times[measured / 2] : 0.5 * (times[measured / 2 - 1] + times[measured / 2]);
        t_min = times[0];
        t_max = times[measured - 1];
    }
    double counted[2] = {measured_gemm_flops, measured_attn_flops};
    spb_allreduce_sum_f64(counted, 2, MPI_COMM_WORLD, SPB_PHASE_OTHER);
    const spb_mem_stats *ms = spb_mem_get_stats();
    double peaks[SPB_MEM_NUM_CATEGORIES + 1];
    for (int c = 0; c < SPB_MEM_NUM_CATEGORIES; c++) peaks[c] = (double)ms->peak[c];
    peaks[SPB_MEM_NUM_CATEGORIES] = (double)ms->peak_total;
    spb_allreduce_max_f64(peaks, SPB_MEM_NUM_CATEGORIES + 1, MPI_COMM_WORLD, SPB_PHASE_OTHER);
    /* The breakdown of the slowest rank (by time in forward, backward,
     * reduction and optimizer), whole, so that its parts add up. */
    double timers[SPB_NUM_TIMERS + 1]; /* + communication inside forward/backward */
    for (int k = 0; k < SPB_NUM_TIMERS; k++) timers[k] = spb_timer_get((spb_timer_id)k) / (measured ? measured : 1);
    timers[SPB_NUM_TIMERS] = 0;
    for (int o = 0; o < SPB_NUM_OPS; o++)
        for (int p = SPB_PHASE_FORWARD; p <= SPB_PHASE_RECOMPUTE; p++)
            timers[SPB_NUM_TIMERS] += spb_comm_record_get((spb_comm_op)o, (spb_comm_phase)p)->seconds /
                                      (measured ? measured : 1);
    struct { double busy; int rank; } mine = {timers[SPB_T_FORWARD] + timers[SPB_T_BACKWARD] +
                                                  timers[SPB_T_GRAD_REDUCE] + timers[SPB_T_OPTIMIZER], rank},
                                      slowest;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
    MPI_Bcast(timers, SPB_NUM_TIMERS + 1, MPI_DOUBLE, slowest.rank, MPI_COMM_WORLD);

    /* Communication per iteration: calls, payload, link bytes, seconds per
     * (op, phase); bytes are the same on every rank of a strategy, time is
     * the slowest rank's. */
    enum { NREC = SPB_NUM_OPS * SPB_NUM_PHASES };
    double comm[4][NREC];
    for (int o = 0; o < SPB_NUM_OPS; o++)
        for (int p = 0; p < SPB_NUM_PHASES; p++) {
            const spb_comm_record *rec = spb_comm_record_get((spb_comm_op)o, (spb_comm_phase)p);
            int k = o * SPB_NUM_PHASES + p;
            double per = measured ? 1.0 / measured : 0.0;
            comm[0][k] = rec->calls * per, comm[1][k] = rec->payload_bytes * per;
            comm[2][k] = rec->link_bytes * per, comm[3][k] = rec->seconds * per;
        }
    spb_allreduce_max_f64(&comm[0][0], 4 * NREC, MPI_COMM_WORLD, SPB_PHASE_OTHER);
    double comm_total_s = 0, comm_total_link = 0;
    for (int k = 0; k < NREC; k++) comm_total_s += comm[3][k], comm_total_link += comm[2][k];

    /* Pack/unpack overhead: the strategy's exchanges against plain
     * MPI_Alltoall of the same counts, same run. */
    double plain_a2a = 0, exchange = 0;
    long a2a_calls = 0;
    for (int p = 0; p < SPB_NUM_PHASES; p++) a2a_calls += spb_comm_record_get(SPB_OP_ALLTOALL, (spb_comm_phase)p)->calls;
    if (cfg.compare_alltoall && a2a_calls > 0) {
        plain_a2a = spb_comm_replay_alltoalls() / (measured ? measured : 1);
        spb_allreduce_max_f64(&plain_a2a, 1, MPI_COMM_WORLD, SPB_PHASE_OTHER);
        exchange = timers[SPB_T_EXCHANGE];
    }
    /* The exchange time less the time inside the all-to-alls themselves
     * (slowest rank's) is what packing and unpacking cost. */
    double a2a_inside = 0;
    for (int p = 0; p < SPB_NUM_PHASES; p++)
        a2a_inside += spb_comm_record_get(SPB_OP_ALLTOALL, (spb_comm_phase)p)->seconds / (measured ? measured : 1);
    double pack_unpack = spb_timer_get(SPB_T_EXCHANGE) / (measured ? measured : 1) - a2a_inside;
    spb_allreduce_max_f64(&pack_unpack, 1, MPI_COMM_WORLD, SPB_PHASE_OTHER);

    double per_iter_counted = measured ? (counted[0] + counted[1]) / measured : NAN;
    double tflops_paper = paper_flops / t_med / world / 1e12;
    double tflops_counted = per_iter_counted / t_med / world / 1e12;
    double compute = timers[SPB_T_FORWARD] + timers[SPB_T_BACKWARD];
    double gemm_share = compute > 0 ? timers[SPB_T_GEMM] / compute : NAN;
    double gemm_gflops = timers[SPB_T_GEMM] > 0 && measured ? counted[0] / measured / world / timers[SPB_T_GEMM] / 1e9 : NAN;

    int rc = 0;
    if (rank == 0) {
        if (!cfg.quiet) {
            printf("summary: %d measured iterations | iteration time median %.2f ms (min %.2f, max %.2f) | "
                   "tokens/s %.0f | TFLOPs/rank paper %.4f counted %.4f | loss %.4f -> %.4f\n",
                   measured, t_med * 1e3, t_min * 1e3, t_max * 1e3, tokens_per_iter / t_med, tflops_paper,
                   tflops_counted, first_loss, final_loss);
            printf("time/iteration (ms, slowest rank):");
            for (int k = 0; k < SPB_NUM_TIMERS; k++) printf(" %s %.2f", spb_timer_name((spb_timer_id)k), timers[k] * 1e3);
            printf(" | gemm share of compute %.1f%% at %.2f GFLOP/s per rank\n", 100 * gemm_share, gemm_gflops);
            double layer_comm = timers[SPB_NUM_TIMERS];
            double other = compute - timers[SPB_T_GEMM] - timers[SPB_T_ATTENTION] - layer_comm;
            printf("step breakdown of the slowest rank (ms/iteration): matrix products %.2f | attention %.2f | other "
                   "compute %.2f | communication in layers %.2f | gradient reduction %.2f | optimizer %.2f | all "
                   "communication %.1f%% of the step\n",
                   timers[SPB_T_GEMM] * 1e3, timers[SPB_T_ATTENTION] * 1e3, other * 1e3, layer_comm * 1e3,
                   timers[SPB_T_GRAD_REDUCE] * 1e3, timers[SPB_T_OPTIMIZER] * 1e3,
                   100 * timers[SPB_T_COMM] / t_med);
            if (comm_total_s > 0) {
                printf("  %-15s %-12s %7s %14s %14s %10s %11s %11s\n", "collective", "phase", "calls", "payload MiB",
                       "MiB/link", "time ms", "algbw GB/s", "busbw GB/s");
                for (int o = 0; o < SPB_NUM_OPS; o++)
                    for (int p = 0; p < SPB_NUM_PHASES; p++) {
                        int k = o * SPB_NUM_PHASES + p;
                        if (comm[0][k] == 0) continue;
                        double sec = comm[3][k];
                        printf("  %-15s %-12s %7.0f %14.3f %14.3f %10.3f %11.3f %11.3f\n",
                               spb_comm_op_name((spb_comm_op)o), spb_comm_phase_name((spb_comm_phase)p), comm[0][k],
                               comm[1][k] / 1048576.0, comm[2][k] / 1048576.0, sec * 1e3,
                               sec > 0 ? comm[1][k] / sec / 1e9 : 0.0, sec > 0 ? comm[2][k] / sec / 1e9 : 0.0);
                    }
            }
            if (cfg.compare_alltoall && plain_a2a > 0)
                printf("all-to-all (ms/iteration): plain MPI_Alltoall of the run's counts, replayed back to back "
                       "%.3f | the strategy's pack + unpack %.3f | (plain + pack/unpack) / plain = %.3f | in-run "
                       "exchanges %.3f (include waiting for other ranks)\n",
                       plain_a2a * 1e3, pack_unpack * 1e3, (plain_a2a + pack_unpack) / plain_a2a, exchange * 1e3);
            printf("peak memory/rank (MiB):");
            for (int c = 0; c < SPB_MEM_NUM_CATEGORIES; c++)
                printf(" %s %.2f", spb_mem_category_name((spb_mem_category)c), peaks[c] / 1048576.0);
            printf(" | total %.2f\n", peaks[SPB_MEM_NUM_CATEGORIES] / 1048576.0);
            fflush(stdout);
        }
        if (cfg.results[0]) {
            spb_row r = {0};
            char host[128] = "unknown", date[32];
            gethostname(host, sizeof host);
            time_t now = time(NULL);
            strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
            spb_row_add(&r, "run_name", "%s", cfg.run_name);
            spb_row_add(&r, "status", "%s", "ok");
            spb_row_add(&r, "strategy", "%s", cfg.strategy);
            spb_row_add(&r, "device", "%s", cfg.device);
            spb_row_add(&r, "attention", "%s", cfg.attention);
            spb_row_add(&r, "world_size", "%d", world);
            spb_row_add(&r, "dp", "%d", grid.dp_size);
            spb_row_add(&r, "sp", "%d", grid.sp_size);
            spb_row_add(&r, "zero_stage", "%d", cfg.zero_stage);
            spb_row_add(&r, "ring_layout", "%s", cfg.ring_layout);
            spb_row_add(&r, "attention_mask", "%s", cfg.attention_mask);
            spb_row_add(&r, "num_layers", "%d", cfg.num_layers);
            spb_row_add(&r, "hidden_size", "%d", cfg.hidden_size);
            spb_row_add(&r, "num_heads", "%d", cfg.num_heads);
            spb_row_add(&r, "ffn_hidden_size", "%d", cfg.ffn_hidden_size);
            spb_row_add(&r, "vocab_size", "%d", cfg.vocab_size);
            spb_row_add(&r, "seq_length", "%d", cfg.seq_length);
            spb_row_add(&r, "micro_batch_size", "%d", cfg.micro_batch_size);
            spb_row_add(&r, "global_batch_size", "%d", cfg.global_batch_size);
            spb_row_add(&r, "num_params", "%ld", g->num_global_params);
            spb_row_add(&r, "train_iters", "%d", iters);
            spb_row_add(&r, "measured_iters", "%d", measured);
            spb_row_add(&r, "iter_time_median_s", "%.6g", t_med);
            spb_row_add(&r, "iter_time_min_s", "%.6g", t_min);
            spb_row_add(&r, "iter_time_max_s", "%.6g", t_max);
            spb_row_add(&r, "tokens_per_s", "%.6g", tokens_per_iter / t_med);
            spb_row_add(&r, "tflops_paper_per_rank", "%.6g", tflops_paper);
            spb_row_add(&r, "tflops_counted_per_rank", "%.6g", tflops_counted);
            spb_row_add(&r, "first_loss", "%.6f", first_loss);
            spb_row_add(&r, "final_loss", "%.6f", final_loss);
            for (int k = 0; k < SPB_NUM_TIMERS; k++) {
                char key[40];
                snprintf(key, sizeof key, "time_%s_s", spb_timer_name((spb_timer_id)k));
                spb_row_add(&r, key, "%.6g", timers[k]);
            }
            for (int c = 0; c < SPB_MEM_NUM_CATEGORIES; c++) {
                char key[40];
                snprintf(key, sizeof key, "peak_mem_%s_bytes", spb_mem_category_name((spb_mem_category)c));
                spb_row_add(&r, key, "%.0f", peaks[c]);
            }
            spb_row_add(&r, "peak_mem_total_bytes", "%.0f", peaks[SPB_MEM_NUM_CATEGORIES]);
            spb_row_add(&r, "layer_comm_s", "%.6g", timers[SPB_NUM_TIMERS]);
            spb_row_add(&r, "other_compute_s", "%.6g",
                        timers[SPB_T_FORWARD] + timers[SPB_T_BACKWARD] - timers[SPB_T_GEMM] -
                            timers[SPB_T_ATTENTION] - timers[SPB_NUM_TIMERS]);
            spb_row_add(&r, "comm_time_s", "%.6g", timers[SPB_T_COMM]);
            spb_row_add(&r, "comm_fraction", "%.6g", timers[SPB_T_COMM] / t_med);
            spb_row_add(&r, "comm_link_bytes", "%.0f", comm_total_link);
            spb_row_add(&r, "alltoall_pack_unpack_s", "%.6g", pack_unpack);
            spb_row_add(&r, "alltoall_plain_s", "%.6g", plain_a2a > 0 ? plain_a2a : NAN);
            spb_row_add(&r, "alltoall_overhead_ratio", "%.6g", plain_a2a > 0 ? (plain_a2a + pack_unpack) / plain_a2a : NAN);
            for (int o = 0; o < SPB_NUM_OPS; o++) {
                double link = 0, sec = 0;
                for (int p = 0; p < SPB_NUM_PHASES; p++)
                    link += comm[2][o * SPB_NUM_PHASES + p], sec += comm[3][o * SPB_NUM_PHASES + p];
                char key[40];
                snprintf(key, sizeof key, "%s_link_bytes", spb_comm_op_name((spb_comm_op)o));
                spb_row_add(&r, key, "%.0f", link);
                snprintf(key, sizeof key, "%s_s", spb_comm_op_name((spb_comm_op)o));
                spb_row_add(&r, key, "%.6g", sec);
            }
            for (int p = 0; p < SPB_NUM_PHASES; p++) {
                double link = 0, sec = 0;
                for (int o = 0; o < SPB_NUM_OPS; o++)
                    link += comm[2][o * SPB_NUM_PHASES + p], sec += comm[3][o * SPB_NUM_PHASES + p];
                char key[40];
                snprintf(key, sizeof key, "%s_link_bytes", spb_comm_phase_name((spb_comm_phase)p));
                spb_row_add(&r, key, "%.0f", link);
                snprintf(key, sizeof key, "%s_comm_s", spb_comm_phase_name((spb_comm_phase)p));
                spb_row_add(&r, key, "%.6g", sec);
            }
            spb_row_add(&r, "machine", "%s/%ldcores", host, sysconf(_SC_NPROCESSORS_ONLN));
            spb_row_add(&r, "blas", "%s", spb_blas_description());
            spb_row_add(&r, "commit", "%s", SPB_VERSION_COMMIT);
            spb_row_add(&r, "date", "%s", date);
            if (spb_row_append_csv(&r, cfg.results, err, sizeof err)) {
                fprintf(stderr, "spbench: error: %s\n", err);
                rc = 2;
            }
        }
    }
    if (cfg.save[0] && spb_checkpoint_save(cfg.save, &cfg, g, tr->opt, tr->iteration, err, sizeof err)) {
        fprintf(stderr, "spbench: error: %s\n", err);
        rc = 2;
    }
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    free(times);
    spb_trainer_destroy(tr);
    spb_grid_destroy(&grid);
    MPI_Finalize();
    return rc;
}
