/* spbench: train a GPT with a sequence-parallel strategy on MPI ranks and
 * report Megatron-style iteration lines and one CSV summary row. */
#define _DEFAULT_SOURCE
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "backend.h"
#include "checkpoint.h"
#include "comm.h"
#include "config.h"
#include "flops.h"
#include "grid.h"
#include "memory_limit.h"
#include "outputs.h"
#include "ops.h"
#include "timer.h"
#include "train.h"
#include "run_summary.h"
#include "spb_version.h"
#ifdef SPB_HAVE_CUDA
#include "../common/cuda/cuda_device.h"
#include "../common/cuda/cuda_trace.h"
#endif
#ifdef SPB_HAVE_NCCL
#include "../common/cuda/nccl_comm.h"
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
    int rc = spb_trainer_save(t, ckpt, 0, err, errlen); /* collective */
    float *grads = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)t->gpt->num_global_params));
    float *local = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)t->gpt->num_params));
    spb_trainer_local_grads(t, local);             /* collective under ZeRO */
    spb_gpt_gather_global(t->gpt, local, grads);   /* collective */
    free(local);
    if (!rc && t->grid->world_rank == 0)
        rc = spb_dump_write(c->dump, c->global_batch_size, c->seq_length, c->vocab_size, in, tg, loss, grads,
                            t->gpt->num_global_params, err, errlen);
    free(grads);
    free(in);
    free(tg);
    return rc;
}

/* The memory a rank can have: the GPU's (shared round-robin by the ranks on
 * the machine) with --device cuda, else physical memory over the ranks on
 * the machine.  Collective.  0 when unknown. */
static double rank_capacity(const spb_config *cfg, char *limit, size_t len)
{
    MPI_Comm node;
    int local_ranks = 1;
    SPB_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    MPI_Comm_size(node, &local_ranks);
    MPI_Comm_free(&node);
    const double gib = 1073741824.0;
#ifdef SPB_HAVE_CUDA
    if (!strcmp(cfg->device, "cuda")) {
        int gpus = spb_cuda_device_count();
        int sharing = gpus > 0 ? (local_ranks + gpus - 1) / gpus : 1;
        double bytes = spb_cuda_current_device_bytes();
        snprintf(limit, len, "the memory a rank can have, %.3f GiB (the GPU's %.1f GiB shared by %d rank%s; "
                 "--memory-budget sets another limit)", bytes / sharing / gib, bytes / gib, sharing,
                 sharing > 1 ? "s" : "");
        return bytes / sharing;
    }
#endif
    (void)cfg;
    double host = spb_host_memory_bytes();
    snprintf(limit, len, "the memory a rank can have, %.3f GiB (%.1f GiB physical / %d rank%s on this machine; "
             "--memory-budget sets another limit)", host / local_ranks / gib, host / gib, local_ranks,
             local_ranks > 1 ? "s" : "");
    return host / local_ranks;
}

/* The host's waits on the device so far (cuda_trace.h); 0 without CUDA. */
static long host_waits_now(void)
{
#ifdef SPB_HAVE_CUDA
    return spb_cuda_host_waits;
#else
    return 0;
#endif
}

int main(int argc, char **argv)
{
    /* Machine-readable option table for the sweep runner: no MPI needed. */
    if (argc == 2 && !strcmp(argv[1], "--list-options")) {
        spb_config_list_options(stdout);
        return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
    }
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
    /* Every output is checked before anything runs; rank 0 writes them. */
    if (agree_on_error(rank == 0 && spb_outputs_check(&cfg, err, sizeof err) != 0, err, rank)) {
        MPI_Finalize();
        return 2;
    }

    /* Bind each rank to its device before anything is allocated there. */
    const int use_nccl = !strcmp(cfg.comm, "nccl");
    int obad = spb_backend_open(spb_backend_for(cfg.device, cfg.precision), MPI_COMM_WORLD, use_nccl, err, sizeof err) != 0;
    if (agree_on_error(obad, err, rank)) {
        MPI_Finalize();
        return 2;
    }
#ifdef SPB_HAVE_CUDA
    /* The Hopper flash kernels where the GPU or the build has no wgmma: the
     * same verdict on every rank, before anything runs */
    if (spb_config_flash_wgmma(&cfg)) {
        int wbad = !spb_cuda_attention_wgmma_available();
        if (wbad)
            snprintf(err, sizeof err, "--flash-fwd/--flash-bwd wgmma needs a GPU of compute capability 9.0 "
                                      "(H100/H200) and a build with sm_90a code (CMAKE_CUDA_ARCHITECTURES with 90a, "
                                      "the default): not both here (docs/GPU.md)");
        if (agree_on_error(wbad, err, rank)) {
            MPI_Finalize();
            return 2;
        }
    }
#endif
    /* The memory model against what a rank can have (an explicit
     * --memory-budget was checked instead, in finalize). */
    if (!cfg.memory_budget[0]) {
        char limit[256];
        double capacity = rank_capacity(&cfg, limit, sizeof limit);
        int mbad = spb_memory_check_capacity(&cfg, world, capacity, limit, err, sizeof err) != 0;
        if (agree_on_error(mbad, err, rank)) {
            MPI_Finalize();
            return 2;
        }
    }
#ifdef SPB_HAVE_NCCL
    /* Collectives on device buffers through NCCL, on the device just bound. */
    if (use_nccl) spb_comm_set_device_ops(spb_nccl_device_ops());
#endif

    spb_grid grid;
    spb_grid_create_nested(&grid, MPI_COMM_WORLD, cfg.sp_degree, cfg.ulysses_degree);
    spb_trainer *tr = spb_trainer_create(&cfg, &grid);
    spb_gpt *g = tr->gpt;
    if (cfg.load[0]) {
        int lbad = spb_trainer_load(tr, cfg.load, err, sizeof err) != 0;
        if (agree_on_error(lbad, err, rank)) {
            MPI_Finalize();
            return 2;
        }
    }

    const double tokens_per_iter = (double)cfg.global_batch_size * cfg.seq_length;
    const double paper_flops = spb_paper_flops_per_iteration(&cfg, cfg.checkpoint_activations);
    const spb_placement placement = grid.placement;
    if (rank == 0 && !cfg.quiet) {
        printf("spbench %s | strategy %s | world %d = D %d x P %d | attention %s%s%s%s | device %s | %s\n",
               SPB_VERSION_COMMIT, cfg.strategy, world, grid.dp_size, grid.sp_size, cfg.attention,
               cfg.attention_auto ? " (default: " : "", cfg.attention_auto ? cfg.attention_why : "",
               cfg.attention_auto ? ")" : "", cfg.device, spb_blas_description());
        printf("model: L %d h %d heads %d ffn %d vocab %d seq %d | %ld parameters | micro %d global %d "
               "(accumulation %d) | data %s\n",
               cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.ffn_hidden_size, cfg.vocab_size, cfg.seq_length,
               g->num_global_params, cfg.micro_batch_size, cfg.global_batch_size, tr->accum_steps,
               cfg.data[0] ? cfg.data : "synthetic");
        if (placement.machines > 1)
            printf("placement: %d machines, up to %d ranks each | an SP group spans %s%d machine%s | a data-parallel "
                   "group spans up to %d%s\n",
                   placement.machines, placement.ranks_per_machine, placement.sp_machines > 1 ? "up to " : "",
                   placement.sp_machines, placement.sp_machines > 1 ? "s" : "", placement.dp_machines,
                   placement.sp_machines > 1 ? " | note: SP exchanges cross machines (the paper keeps each SP group "
                                               "in a node: place consecutive ranks together, docs/CLUSTER.md)"
                                             : "");
#ifdef SPB_HAVE_CUDA
        char gpus[256];
        spb_cuda_describe(gpus, sizeof gpus);
        printf("CUDA build: %s\n", gpus);
#endif
        fflush(stdout);
    }

    /* The results file's columns, before the first iteration. */
    if (agree_on_error(rank == 0 && cfg.results[0] && spb_check_results_file(tr, err, sizeof err) != 0, err, rank)) {
        MPI_Finalize();
        return 2;
    }
    FILE *loss_log = NULL;
    int log_bad = 0;
    if (rank == 0 && cfg.loss_log[0]) {
        errno = 0;
        loss_log = fopen(cfg.loss_log, "w");
        /* the header flushed now: a full disk or /dev/full is found before training */
        log_bad = !loss_log ||
                  fprintf(loss_log, "iteration,loss,lr,grad_norm,time_ms,tokens,loss_scale,skipped\n") < 0 ||
                  fflush(loss_log) != 0;
        if (log_bad)
            snprintf(err, sizeof err, "cannot write --loss-log '%s': %s", cfg.loss_log,
                     errno ? strerror(errno) : "write error");
    }
    if (agree_on_error(log_bad, err, rank)) {
        MPI_Finalize();
        return 2;
    }

    int iters = cfg.train_iters;
    /* grown as iterations complete: --train-iters 2147483647 must not ask
     * for 16 GiB before the first one */
    size_t times_cap = 1024;
    double *times = SPB_CHECK_PTR(calloc(times_cap, sizeof(double)));
    double final_loss = NAN, first_loss = NAN;
    double device_used_peak = -1.0; /* what the driver reports in use, sampled at step boundaries */
    int measured = 0;
    double host_waits = 0.0; /* the step's waits on the device, measured iterations (cuda_trace.h) */
    const int on_cuda = !strcmp(cfg.device, "cuda");
#ifdef SPB_HAVE_CUDA
    if (cfg.kernel_timeline) {
        spb_cuda_timeline_enable(1);
        spb_timer_set_observer(&spb_cuda_timeline_observer);
    }
#endif
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
        long waits = host_waits_now();
        double loss = spb_trainer_gradients(tr);
        waits = host_waits_now() - waits;
        if (i == 0 && cfg.dump[0]) {
            int dbad = write_dump(tr, loss, err, sizeof err) != 0;
            if (agree_on_error(dbad, err, rank)) {
                MPI_Finalize();
                return 2;
            }
        }
        long update_waits = host_waits_now();
        spb_trainer_update(tr);
        waits += host_waits_now() - update_waits;
        spb_trainer_synchronize(tr); /* the step's end: the device wait every step has */
        double dt = spb_now() - t0;
        if (g->be->device_used_bytes) {
            double used = g->be->device_used_bytes();
            device_used_peak = used > device_used_peak ? used : device_used_peak;
        }
        spb_allreduce_max_f64(&dt, 1, MPI_COMM_WORLD, SPB_PHASE_OTHER); /* the slowest rank */
        if (i == 0) first_loss = loss;
        final_loss = loss;
        if (i >= cfg.timing_warmup) {
            if ((size_t)measured == times_cap)
                times = SPB_CHECK_PTR(realloc(times, (times_cap *= 2) * sizeof(double)));
            times[measured++] = dt;
            host_waits += (double)waits;
        }
        if (loss_log && !log_bad)
            log_bad = fprintf(loss_log, "%ld,%.6f,%.6g,%.6g,%.3f,%.0f,%.9g,%d\n", tr->iteration, loss, tr->lr, tr->grad_norm,
                    dt * 1e3, tokens_per_iter * tr->iteration, tr->scaler.loss_scale, tr->skipped) < 0;
        if (!isfinite(loss) && rank == 0) fprintf(stderr, "spbench: warning: loss is %g at iteration %ld\n", loss, tr->iteration);
        if (rank == 0 && !cfg.quiet && (tr->iteration % cfg.log_interval == 0 || i == iters - 1)) {
            printf(" iteration %8ld/%8d | elapsed time per iteration (ms): %.1f | learning rate: %.3E | "
                   "global batch size: %5d | lm loss: %.6E | grad norm: %.3f | tokens/s: %.0f | TFLOPs: %.4f |\n",
                   tr->iteration, iters, dt * 1e3, tr->lr, cfg.global_batch_size, loss, tr->grad_norm,
                   tokens_per_iter / dt, paper_flops / dt / world / 1e12);
            if (tr->scaler.enabled) /* fp16: Megatron's two extra fields */
                printf("   loss scale: %.1f | number of skipped iterations: %ld |\n", tr->scaler.loss_scale,
                       tr->scaler.skipped_steps);
            fflush(stdout);
        }
    }
    int rc = 0;
    if (loss_log) {
        errno = 0;
        log_bad = fclose(loss_log) != 0 || log_bad;
        if (log_bad) { /* rows lost: the run's record is incomplete */
            fprintf(stderr, "spbench: error: cannot write --loss-log '%s': %s\n", cfg.loss_log,
                    errno ? strerror(errno) : "write error");
            rc = 2;
        }
    }

    spb_run_summary sum;
    spb_summarize_run(&sum, tr, times, measured, first_loss, final_loss, device_used_peak); /* collective */
    if (on_cuda && measured > 0) {
        /* the slowest rank's count */
        double per = host_waits / measured;
        spb_allreduce_max_f64(&per, 1, MPI_COMM_WORLD, SPB_PHASE_OTHER);
        sum.host_waits = per;
    }
#ifdef SPB_HAVE_CUDA
    if (cfg.kernel_timeline && measured > 0) {
        spb_kernel_timeline kt;
        spb_cuda_timeline_read(&kt);
        _Static_assert((int)SPB_KT_NUM_PHASES == (int)SPB_RUN_KT_PHASES, "run_summary.h's copy of the phase count");
        sum.kernel_timeline = 1;
        sum.kt_intervals = 0;
        for (int k = 0; k < SPB_KT_NUM_PHASES; k++) {
            sum.kt_wall[k] = kt.wall[k] / measured;
            sum.kt_busy[k] = kt.busy[k] / measured;
            sum.kt_comm_busy[k] = kt.comm_busy[k] / measured;
            sum.kt_comm_hidden[k] = kt.comm_hidden[k] / measured;
            sum.kt_intervals += (double)kt.intervals[k] / measured;
        }
        /* the emulation counts the kernels it ran: every one must lie inside an interval */
        if (rank == 0 && kt.device_launches >= 0)
            printf("kernel timeline (emulated device): %ld kernels run (%ld NCCL's), %ld outside any interval, "
                   "%ld intervals (%ld library calls, %ld NCCL calls), measured iterations\n",
                   kt.device_launches, kt.nccl_launches, kt.launches_outside,
                   kt.intervals[0] + kt.intervals[1] + kt.intervals[2] + kt.intervals[3] + kt.intervals[4],
                   kt.library_calls, kt.comm_calls);
    }
#endif
    if (rank == 0) {
        if (!cfg.quiet) spb_print_summary(&sum, &cfg);
        if (cfg.results[0] && spb_append_results_row(&sum, tr, err, sizeof err)) {
            fprintf(stderr, "spbench: error: %s\n", err);
            rc = 2;
        }
    }
    if (cfg.save[0] && spb_trainer_save(tr, cfg.save, 1, err, sizeof err)) {
        fprintf(stderr, "spbench: error: %s\n", err);
        rc = 2;
    }
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    free(times);
    spb_trainer_destroy(tr);
    spb_grid_destroy(&grid);
#ifdef SPB_HAVE_NCCL
    if (use_nccl) spb_nccl_device_ops_shutdown(); /* NCCL finalizes with its peers, before MPI goes */
#endif
    MPI_Finalize();
    return rc;
}
