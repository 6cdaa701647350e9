/* spbench-model: the performance model (docs/MODEL.md) for one
 * configuration, without running it.  Takes spbench's options plus
 *   --profile FILE      hardware profile (profiles/NAME.profile), required
 *   --world-size N      ranks (GPUs) the configuration runs on (default 1)
 *   --precision P       fp32 | bf16 (default: the profile's)
 *   --attn-density F    fraction of attention blocks computed (blocked sparse), default 1
 *   --attn-backend NAME whose measured attention rates (the profile's attn_point lines)
 *                       price the attention, default --attention's (flash); e.g. cudnn
 *                       with a profile measured on a GPU (scripts/gpu-profile)
 *   --max-seq           also search the largest sequence length that fits
 * --device and --memory-budget are the model's (not checked as spbench
 * would: the device is the profile's; the budget overrides the profile's
 * memory).  Prints a table; with --results appends one CSV row whose
 * column names are spbench's for the quantities it predicts, with status
 * "modelled". */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"
#include "config.h"
#include "flops.h"
#include "memory.h"
#include "memory_model.h"
#include "perf_model.h"
#include "predicted_bytes.h"
#include "report.h"
#include "zero.h"
#include "spb_version.h"

static void usage(void)
{
    printf("usage: spbench-model [spbench options] --profile FILE [--world-size N] [--precision fp32|bf16]\n"
           "                     [--attn-density F] [--attn-backend NAME] [--max-seq] [--results CSV]\n"
           "                     [--pipeline-parallel P [--virtual-pipeline V]] [--tp-no-sp] [--selective-recompute]\n"
           "                     [--dropout] [--overlap-dp] [--fused-kernels] [--ablate TERM,...]\n"
           "  predicts iteration time (compute by kind, communication by operation and phase), TFLOPs per\n"
           "  rank by the paper's formula, memory per category, whether it fits and (--max-seq) the longest\n"
           "  sequence that fits.  spbench's options:\n");
    spb_config_usage(stdout);
}

static int die(const char *msg)
{
    fprintf(stderr, "spbench-model: error: %s\n", msg);
    return 2;
}

/* Largest N (a multiple of the layout's granularity) whose predicted
 * memory fits, other things equal; 0 if even the smallest does not. */
static long max_seq_that_fits(const spb_config *base, int world, spb_precision prec, double budget, double reserved)
{
    long P = base->sp_degree, unit = P * ((1024 + P - 1) / P);
    if (!strcmp(base->strategy, "ring") && !strcmp(base->ring_layout, "zigzag") && unit % (2 * P)) unit *= 2;
    spb_config c = *base;
    spb_memory_prediction m;
#define FITS(n) (c.seq_length = (int)(n), c.max_position_embeddings = (int)(n), \
                 spb_memory_model(&c, world, prec, &m), m.total + reserved <= budget)
    if (!FITS(unit)) return 0;
    long lo = 1, hi = 2; /* in units */
    while (hi * unit < (1L << 30) && FITS(hi * unit)) lo = hi, hi *= 2;
    if (hi * unit >= (1L << 30)) return lo * unit;
    while (hi - lo > 1) {
        long mid = (lo + hi) / 2;
        if (FITS(mid * unit)) lo = mid;
        else hi = mid;
    }
#undef FITS
    return lo * unit;
}

int main(int argc, char **argv)
{
    char profile_path[SPB_PATH_MAX] = "", budget_text[64] = "", attn_backend[16] = "", err[1024] = "";
    int world = 1, max_seq = 0, precision_set = 0;
    int pp = 1, vpp = 1, tp_no_sp = 0, selective = 0, dropout = 0, overlap_dp = 0, fused = 0;
    unsigned ablate = 0;
    double attn_density = 1.0;
    spb_precision precision = SPB_FP32;
    if (argc == 2 && !strcmp(argv[1], "--list-options")) { /* spbench's table, which the model takes too */
        spb_config_list_options(stdout);
        return fflush(stdout) == 0 ? 0 : 1;
    }
    /* Take the model's own options out; the rest is spbench's. */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0;
    rest[nrest++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
#define TAKE(name)                                                                          \
    (!strcmp(a, name) ? (i + 1 < argc ? (val = argv[++i], 1) : -1)                         \
                      : (!strncmp(a, name "=", strlen(name) + 1) ? (val = a + strlen(name) + 1, 1) : 0))
        int r;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else if ((r = TAKE("--profile"))) {
            if (r < 0) return die("--profile needs a value");
            snprintf(profile_path, sizeof profile_path, "%s", val);
        } else if ((r = TAKE("--world-size"))) {
            if (r < 0) return die("--world-size needs a value");
            char *end;
            world = (int)strtol(val, &end, 10);
            if (*end || world <= 0) return die("--world-size must be a positive integer");
        } else if ((r = TAKE("--precision"))) {
            if (r < 0) return die("--precision needs a value");
            if (!strcmp(val, "fp32")) precision = SPB_FP32;
            else if (!strcmp(val, "bf16") || !strcmp(val, "fp16")) precision = SPB_BF16_MIXED;
            else return die("--precision must be fp32 or bf16");
            precision_set = 1;
        } else if ((r = TAKE("--attn-density"))) {
            if (r < 0) return die("--attn-density needs a value");
            attn_density = strtod(val, NULL);
            if (!(attn_density > 0 && attn_density <= 1)) return die("--attn-density must be in (0, 1]");
        } else if ((r = TAKE("--attn-backend"))) {
            if (r < 0) return die("--attn-backend needs a value");
            if (!val[0] || strlen(val) >= sizeof attn_backend) return die("--attn-backend: a backend name");
            snprintf(attn_backend, sizeof attn_backend, "%s", val);
        } else if ((r = TAKE("--memory-budget"))) {
            if (r < 0) return die("--memory-budget needs a value");
            snprintf(budget_text, sizeof budget_text, "%s", val);
        } else if ((r = TAKE("--device"))) {
            if (r < 0) return die("--device needs a value");
        } else if ((r = TAKE("--pipeline-parallel")) || (r = TAKE("--virtual-pipeline"))) {
            if (r < 0) return die("--pipeline-parallel / --virtual-pipeline need a value");
            char *end;
            long v = strtol(val, &end, 10);
            if (*end || v < 1 || v > 4096) return die("--pipeline-parallel / --virtual-pipeline: a positive integer");
            if (!strncmp(a, "--pipeline-parallel", 19)) pp = (int)v;
            else vpp = (int)v;
        } else if ((r = TAKE("--ablate"))) {
            if (r < 0) return die("--ablate needs a value");
            char list[256];
            snprintf(list, sizeof list, "%s", val);
            for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
                int k;
                for (k = 0; k < SPB_TERM_NUM; k++)
                    if (!strcmp(t, spb_term_name(k))) break;
                if (k == SPB_TERM_NUM) {
                    char msg[320];
                    snprintf(msg, sizeof msg, "--ablate: unknown term '%s' (elemwise, optimizer, layer_comm, dp_comm, "
                             "bubble, p2p, launch, softmax, recompute, latency)", t);
                    return die(msg);
                }
                ablate |= 1u << k;
            }
        } else if (!strcmp(a, "--tp-no-sp")) {
            tp_no_sp = 1;
        } else if (!strcmp(a, "--selective-recompute")) {
            selective = 1;
        } else if (!strcmp(a, "--dropout")) {
            dropout = 1;
        } else if (!strcmp(a, "--overlap-dp")) {
            overlap_dp = 1;
        } else if (!strcmp(a, "--fused-kernels")) {
            fused = 1;
        } else if (!strcmp(a, "--max-seq")) {
            max_seq = 1;
        } else {
            rest[nrest++] = argv[i];
        }
#undef TAKE
    }
    if (!profile_path[0]) return die("--profile FILE is required (profiles/NAME.profile)");

    spb_config cfg;
    spb_config_defaults(&cfg);
    int prc = spb_config_parse(nrest, rest, &cfg, err, sizeof err);
    if (prc == 1) {
        usage();
        return 0;
    }
    if (prc) return die(err);
    /* Pipeline parallelism (published layouts; spbench does not run it): the
     * model prices one stage — its layers on its world / pp ranks — and adds
     * the bubble and the transfers (docs/MODEL.md, "Published layouts"). */
    if (world % pp) return die("--world-size must be a multiple of --pipeline-parallel");
    if (vpp > 1 && pp == 1) return die("--virtual-pipeline needs --pipeline-parallel > 1");
    const int layers_total = cfg.num_layers, world_total = world;
    if (pp > 1) {
        if (cfg.num_layers < pp * vpp) return die("--pipeline-parallel x --virtual-pipeline exceeds --num-layers");
        cfg.num_layers = (cfg.num_layers + pp - 1) / pp; /* the slowest stage: ceil(L / pp) layers and the head */
        world /= pp;
    }
    if (tp_no_sp && strcmp(cfg.strategy, "megatron")) return die("--tp-no-sp needs --strategy megatron");
    if (spb_config_finalize(&cfg, world, err, sizeof err)) return die(err);

    spb_profile *prof = calloc(1, sizeof *prof);
    if (spb_profile_load(profile_path, prof, err, sizeof err)) return die(err);
    if (!precision_set) precision = prof->precision;
    /* The configuration carries it too: the predicted-bytes columns scale by it. */
    snprintf(cfg.precision, sizeof cfg.precision, "%s", precision == SPB_FP32 ? "fp32" : "bf16");
    if (budget_text[0]) {
        double b = spb_parse_bytes(budget_text);
        if (b <= 0) return die("--memory-budget is not a size (e.g. 80GiB)");
        prof->memory_bytes = b;
    }

    if (attn_backend[0]) { /* only a backend the profile measured: anything else would price nothing differently */
        int have = !strcmp(attn_backend, "unfused") || !strcmp(attn_backend, "torch");
        for (int i = 0; i < prof->n_attn; i++) have |= !strcmp(prof->attn[i].backend, attn_backend);
        for (int i = 0; i < prof->n_attn_sw; i++) have |= !strcmp(prof->attn_sw[i].name, attn_backend);
        if (!have) {
            char msg[512];
            snprintf(msg, sizeof msg, "--attn-backend %s: the profile %s has no attn_point or attn_backend for it%s",
                     attn_backend,
                     profile_path, prof->n_attn ? "" : " (it has no measured attention at all)");
            return die(msg);
        }
    }
    /* the profile's software defaults (its framework's overlap and fused kernels) */
    if (prof->overlap_dp_min_stage > 0 && cfg.zero_stage >= prof->overlap_dp_min_stage) overlap_dp = 1;
    if (prof->fused_kernels) fused = 1;
    spb_perf_options opt = {.precision = precision, .attn_density = attn_density, .pp = pp, .vpp = vpp,
                            .tp_no_sp = tp_no_sp, .selective_recompute = selective, .dropout = dropout,
                            .overlap_dp = overlap_dp, .fused = fused, .ablate = ablate};
    /* the model prices the profile's flash rates unless asked otherwise: the
     * default the build would run (cfg.attention) says nothing of the
     * machine the profile describes */
    snprintf(opt.backend, sizeof opt.backend, "%.15s",
             attn_backend[0] ? attn_backend : cfg.attention_auto ? "flash" : cfg.attention);
    spb_perf_prediction pr;
    if (spb_perf_predict(&cfg, world, prof, &opt, &pr, err, sizeof err)) return die(err);
    if (pp > 1) {
        /* the whole model's work over all GPUs, by the paper's formula */
        spb_config whole = cfg;
        whole.num_layers = layers_total;
        pr.tflops_paper_per_rank =
            spb_paper_flops_per_iteration(&whole, whole.checkpoint_activations) / pr.iter_time / world_total / 1e12;
        pr.tflops_counted_per_rank = (pr.gemm_flops + pr.attn_flops) / pr.iter_time / 1e12;
    }
    /* Honest output: a counted rate above the device's peak is impossible —
     * for the whole step, and for the products and the attention apart */
    const double peak = prof->gemm_peak > 0 ? prof->gemm_peak : 0;
    const double apeak = prof->attn_peak > 0 ? prof->attn_peak : peak;
    const double rates[3][2] = {{pr.tflops_counted_per_rank * 1e12, peak},
                                {pr.t_gemm > 0 ? pr.gemm_flops / pr.t_gemm : 0, peak},
                                {pr.t_attn > 0 ? pr.attn_flops / pr.t_attn : 0, apeak}};
    const char *what[3] = {"the step's", "the matrix products'", "the attention's"};
    for (int k = 0; k < 3; k++)
        if (rates[k][1] > 0 && rates[k][0] > rates[k][1] * 1.0000001) {
            char msg[256];
            snprintf(msg, sizeof msg, "refused: counted rate of %s %.1f TFLOPs per GPU exceeds the device peak %.1f",
                     what[k], rates[k][0] / 1e12, rates[k][1] / 1e12);
            return die(msg);
        }
    const int over90 = peak > 0 && pr.tflops_paper_per_rank * 1e12 > 0.9 * peak;
    /* the band: the same prediction at the slow and the fast end of the profile's calibration spread */
    double band_time[2] = {0, 0}, band_tflops[2] = {0, 0};
    if (prof->has_band) {
        spb_profile *bp = malloc(sizeof *bp);
        if (!bp) return die("out of memory");
        for (int e = 0; e < 2; e++) {
            spb_perf_prediction bpr;
            spb_profile_band(prof, e, bp);
            if (spb_perf_predict(&cfg, world, bp, &opt, &bpr, err, sizeof err)) return die(err);
            band_time[e] = bpr.iter_time;
            band_tflops[e] = pr.tflops_paper_per_rank * pr.iter_time / bpr.iter_time;
        }
        free(bp);
    }
    long seq_fit = -1;
    if (max_seq)
        seq_fit = prof->memory_bytes > 0
                      ? max_seq_that_fits(&cfg, world, precision, prof->memory_bytes, prof->memory_reserved)
                      : -1;

    const int P = cfg.sp_degree, D = world / P;
    printf("spbench-model (MODELLED, profile %s, %s) | strategy %s | world %d = D %d x P %d | ZeRO %d%s | %s%s | "
           "attention %s\n",
           prof->name, precision == SPB_FP32 ? "fp32" : "bf16 mixed", cfg.strategy, world, D, P, cfg.zero_stage,
           cfg.checkpoint_activations ? " | checkpointing" : "", cfg.attention_mask,
           attn_density < 1 ? " | blocked sparse" : "", opt.backend);
    printf("model: L %d h %d heads %d ffn %d vocab %d seq %d | micro %d global %d (accumulation %d)\n", cfg.num_layers,
           cfg.hidden_size, cfg.num_heads, cfg.ffn_hidden_size, cfg.vocab_size, cfg.seq_length, cfg.micro_batch_size,
           cfg.global_batch_size, spb_config_accum_steps(&cfg, world));
    printf("iteration time %.6g s | tokens/s %.6g | TFLOPs/rank paper %.4g counted %.4g%s%s\n", pr.iter_time,
           pr.tokens_per_s, pr.tflops_paper_per_rank, pr.tflops_counted_per_rank,
           pr.compute_scale < 1 ? " | ranks share cores" : "",
           over90 ? " | FLAG: paper-formula rate above 90% of the device's peak" : "");
    if (prof->has_band)
        printf("band (calibration spread): iteration %.6g - %.6g s, TFLOPs/rank paper %.4g - %.4g\n", band_time[1],
               band_time[0], band_tflops[0], band_tflops[1]);
    if (pp > 1)
        printf("pipeline: %d stages x %d virtual, one stage priced (%d of %d layers, %d of %d ranks) + bubble + "
               "transfers\n", pp, vpp, cfg.num_layers, layers_total, world, world_total);
    printf("  %-34s %12s %7s\n", "part (s/iteration)", "seconds", "share");
    struct { const char *name; double v; } parts[] = {
        {"compute: matrix products", pr.t_gemm}, {"compute: attention", pr.t_attn},
        {"compute: other (element-wise)", pr.t_other}, {"optimizer arithmetic", pr.t_adam},
        {"communication, exposed", pr.comm_exposed_total}, {"pipeline bubble", pr.t_bubble},
        {"pipeline transfers", pr.t_p2p}, {"kernel gaps", pr.t_launch}};
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++)
        printf("  %-34s %12.6g %6.1f%%\n", parts[k].name, parts[k].v, 100 * parts[k].v / pr.iter_time);
    printf("  %-15s %-12s %8s %14s %14s %12s %12s\n", "collective", "phase", "calls", "payload MiB", "MiB/link",
           "exposed s", "overlapped s");
    for (int o = 0; o < SPB_NUM_OPS; o++)
        for (int p = 0; p < SPB_NUM_PHASES; p++) {
            if (pr.plan.calls[o][p] == 0 && pr.comm_exposed[o][p] == 0) continue;
            printf("  %-15s %-12s %8.0f %14.3f %14.3f %12.6g %12.6g\n", spb_comm_op_name((spb_comm_op)o),
                   spb_comm_phase_name((spb_comm_phase)p), pr.plan.calls[o][p], pr.plan.payload[o][p] / 1048576.0,
                   pr.plan.link[o][p] / 1048576.0, pr.comm_exposed[o][p], pr.comm_overlapped[o][p]);
        }
    printf("memory/rank (MiB, memory model):");
    for (int c = 0; c < SPB_MEM_NUM_CATEGORIES; c++)
        if (pr.mem.bytes[c] > 0) printf(" %s %.1f", spb_mem_category_name((spb_mem_category)c), pr.mem.bytes[c] / 1048576.0);
    printf(" | total %.1f + reserved %.1f", pr.mem.total / 1048576.0, prof->memory_reserved / 1048576.0);
    if (prof->memory_bytes > 0)
        printf(" | %s %.1f GiB\n", pr.fits ? "fits" : "DOES NOT FIT", prof->memory_bytes / 1073741824.0);
    else
        printf("\n");
    if (max_seq) {
        if (seq_fit >= 0) printf("largest sequence length that fits: %ld\n", seq_fit);
        else printf("largest sequence length that fits: no memory limit in the profile\n");
    }

    int rc = 0;
    if (cfg.results[0]) {
        spb_row r = {0};
        char key[40], date[32];
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        const double t = pr.iter_time;
        spb_row_add(&r, "run_name", "%s", cfg.run_name);
        spb_row_add(&r, "status", "%s", "modelled");
        spb_row_add(&r, "strategy", "%s", cfg.strategy);
        spb_row_add(&r, "device", "%s", prof->device);
        spb_row_add(&r, "attention", "%s", attn_density < 1 ? "blocked-sparse" : opt.backend);
        spb_row_add(&r, "world_size", "%d", world);
        spb_row_add(&r, "dp", "%d", D);
        spb_row_add(&r, "sp", "%d", P);
        spb_row_add(&r, "zero_stage", "%d", cfg.zero_stage);
        spb_row_add(&r, "checkpoint_activations", "%d", cfg.checkpoint_activations);
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
        spb_row_add(&r, "iter_time_median_s", "%.6g", t);
        spb_row_add(&r, "tokens_per_s", "%.6g", pr.tokens_per_s);
        spb_row_add(&r, "tflops_paper_per_rank", "%.6g", pr.tflops_paper_per_rank);
        spb_row_add(&r, "tflops_counted_per_rank", "%.6g", pr.tflops_counted_per_rank);
        spb_row_add(&r, "time_forward_s", "%.6g", pr.t_forward);
        spb_row_add(&r, "time_backward_s", "%.6g", pr.t_backward);
        spb_row_add(&r, "time_grad_reduce_s", "%.6g", pr.t_grad_reduce);
        spb_row_add(&r, "time_optimizer_s", "%.6g", pr.t_optimizer);
        spb_row_add(&r, "time_gemm_s", "%.6g", pr.t_gemm);
        spb_row_add(&r, "time_attention_s", "%.6g", pr.t_attn);
        spb_row_add(&r, "time_comm_s", "%.6g", pr.comm_exposed_total);
        for (int k = 0; k < SPB_MEM_NUM_CATEGORIES; k++) {
            snprintf(key, sizeof key, "peak_mem_%s_bytes", spb_mem_category_name((spb_mem_category)k));
            spb_row_add(&r, key, "%.0f", pr.mem.bytes[k]);
        }
        spb_row_add(&r, "peak_mem_total_bytes", "%.0f", pr.mem.total);
        spb_row_add(&r, "layer_comm_s", "%.6g", pr.layer_comm);
        spb_row_add(&r, "other_compute_s", "%.6g", pr.t_other);
        spb_row_add(&r, "comm_time_s", "%.6g", pr.comm_exposed_total);
        spb_row_add(&r, "comm_fraction", "%.6g", pr.comm_exposed_total / t);
        double link_total = 0, overlapped = 0;
        for (int o = 0; o < SPB_NUM_OPS; o++)
            for (int p = 0; p < SPB_NUM_PHASES; p++) link_total += pr.plan.link[o][p], overlapped += pr.comm_overlapped[o][p];
        spb_row_add(&r, "comm_link_bytes", "%.0f", link_total);
        for (int o = 0; o < SPB_NUM_OPS; o++) {
            double link = 0, sec = 0;
            for (int p = 0; p < SPB_NUM_PHASES; p++) link += pr.plan.link[o][p], sec += pr.comm_exposed[o][p];
            snprintf(key, sizeof key, "%s_link_bytes", spb_comm_op_name((spb_comm_op)o));
            spb_row_add(&r, key, "%.0f", link);
            snprintf(key, sizeof key, "%s_s", spb_comm_op_name((spb_comm_op)o));
            spb_row_add(&r, key, "%.6g", sec);
        }
        for (int p = 0; p < SPB_NUM_PHASES; p++) {
            double link = 0, sec = 0;
            for (int o = 0; o < SPB_NUM_OPS; o++) link += pr.plan.link[o][p], sec += pr.comm_exposed[o][p];
            snprintf(key, sizeof key, "%s_link_bytes", spb_comm_phase_name((spb_comm_phase)p));
            spb_row_add(&r, key, "%.0f", link);
            snprintf(key, sizeof key, "%s_comm_s", spb_comm_phase_name((spb_comm_phase)p));
            spb_row_add(&r, key, "%.6g", sec);
        }
        spb_predicted_bytes predicted; /* the same formulas spbench writes beside its measurement */
        spb_predicted_link_bytes(&cfg, world, &predicted);
        spb_row_add_predicted_bytes(&r, &predicted);
        spb_row_add(&r, "machine", "%s", prof->name);
        spb_row_add(&r, "commit", "%s", SPB_VERSION_COMMIT);
        spb_row_add(&r, "date", "%s", date);
        /* the model's own columns */
        spb_row_add(&r, "precision", "%s", precision == SPB_FP32 ? "fp32" : "bf16");
        spb_row_add(&r, "attn_density", "%.6g", attn_density);
        spb_row_add(&r, "sendrecv_overlapped_s", "%.6g", overlapped);
        spb_row_add(&r, "zero_comm_s", "%.6g",
                    pr.comm_exposed[SPB_OP_ALLGATHER][SPB_PHASE_ZERO] + pr.comm_exposed[SPB_OP_REDUCE_SCATTER][SPB_PHASE_ZERO] +
                        pr.comm_exposed[SPB_OP_ALLREDUCE][SPB_PHASE_ZERO]);
        spb_row_add(&r, "optimizer_compute_s", "%.6g", pr.t_adam);
        spb_row_add(&r, "memory_needed_bytes", "%.0f", pr.mem_needed);
        spb_row_add(&r, "memory_capacity_bytes", "%.0f", prof->memory_bytes);
        spb_row_add(&r, "fits", "%d", pr.fits);
        spb_row_add(&r, "max_seq_length_fits", "%ld", seq_fit);
        spb_row_add(&r, "profile", "%s", profile_path);
        spb_row_add(&r, "pipeline_parallel", "%d", pp);
        spb_row_add(&r, "virtual_pipeline", "%d", vpp);
        spb_row_add(&r, "bubble_s", "%.6g", pr.t_bubble);
        spb_row_add(&r, "p2p_s", "%.6g", pr.t_p2p);
        spb_row_add(&r, "launch_s", "%.6g", pr.t_launch);
        spb_row_add(&r, "recompute_s", "%.6g", pr.t_recompute);
        spb_row_add(&r, "softmax_s", "%.6g", pr.t_softmax);
        spb_row_add(&r, "dp_comm_hidden_s", "%.6g", pr.dp_comm_hidden);
        spb_row_add(&r, "paper_rate_over_90pct_peak", "%d", over90);
        spb_row_add(&r, "iter_time_low_s", "%.6g", band_time[1]);   /* fast end: shortest time */
        spb_row_add(&r, "iter_time_high_s", "%.6g", band_time[0]);
        spb_row_add(&r, "tflops_paper_low", "%.6g", band_tflops[0]);
        spb_row_add(&r, "tflops_paper_high", "%.6g", band_tflops[1]);
        if (spb_row_append_csv(&r, cfg.results, err, sizeof err)) rc = die(err);
    }
    free(prof);
    free(rest);
    return rc;
}
