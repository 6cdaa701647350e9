/* spbench-dump-compare: one gradient dump (--dump) against a reference dump,
 * tensor by tensor: the GPU check's verdict on a strategy run on the CUDA
 * table against the single-rank CPU fp32 run (experiments/gpu-strategies),
 * and a tool for any two runs of one configuration.
 *
 *   spbench-dump-compare [--tol T] [--loss-tol T] RUN.dump REFERENCE.dump
 *
 * The tensor layout comes from RUN.dump.ckpt's header through the core's
 * own tensor table (docs/FORMATS.md).  Error per tensor: relative L2,
 * |run - ref| / |ref|; loss: relative.  Exit 0 when every error is within
 * its tolerance, 1 when some is not, 2 when the files cannot be compared
 * (unreadable, other shapes, other batches). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "config.h"
#include "gpt.h"

static double rel_err(double diff2, double ref2) { return sqrt(diff2) / fmax(sqrt(ref2), 1e-30); }

int main(int argc, char **argv)
{
    double tol = 1e-5, loss_tol = -1.0;
    const char *paths[2] = {NULL, NULL};
    int npaths = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tol") && i + 1 < argc)
            tol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--loss-tol") && i + 1 < argc)
            loss_tol = atof(argv[++i]);
        else if (argv[i][0] == '-' || npaths == 2) {
            fprintf(stderr, "usage: spbench-dump-compare [--tol T] [--loss-tol T] RUN.dump REFERENCE.dump\n");
            return 2;
        } else
            paths[npaths++] = argv[i];
    }
    if (npaths != 2 || !(tol > 0)) {
        fprintf(stderr, "usage: spbench-dump-compare [--tol T>0] [--loss-tol T] RUN.dump REFERENCE.dump\n");
        return 2;
    }
    if (loss_tol < 0) loss_tol = tol;

    spb_dump run, ref;
    spb_config cfg;
    char err[SPB_PATH_MAX + 128], model_path[SPB_PATH_MAX + 8];
    snprintf(model_path, sizeof model_path, "%s.ckpt", paths[0]); /* written beside every --dump */
    if (spb_dump_read(paths[0], &run, err, sizeof err) || spb_dump_read(paths[1], &ref, err, sizeof err) ||
        spb_checkpoint_read_model(model_path, &cfg, err, sizeof err)) {
        fprintf(stderr, "spbench-dump-compare: error: %s\n", err);
        return 2;
    }
    if (run.B != ref.B || run.T != ref.T || run.V != ref.V || run.num_params != ref.num_params) {
        fprintf(stderr, "spbench-dump-compare: error: %s and %s have other shapes (B, T, V or parameters)\n", paths[0],
                paths[1]);
        return 2;
    }
    if (memcmp(run.tokens, ref.tokens, sizeof(int) * (size_t)(2 * run.B * run.T))) {
        fprintf(stderr, "spbench-dump-compare: error: %s and %s saw other batches (inputs or targets differ)\n",
                paths[0], paths[1]);
        return 2;
    }
    long num_local = 0, num_global = 0;
    int nt = spb_gpt_tensor_table(&cfg, 1, NULL, &num_local, &num_global);
    if (num_global != run.num_params) {
        fprintf(stderr, "spbench-dump-compare: error: %s.ckpt's model has %ld parameters, the dump %lld\n", paths[0],
                num_global, (long long)run.num_params);
        return 2;
    }
    spb_param_tensor *t = calloc((size_t)nt, sizeof *t);
    spb_gpt_tensor_table(&cfg, 1, t, &num_local, &num_global);

    double loss_err = fabs(run.loss - ref.loss) / fmax(fabs(ref.loss), 1e-30);
    int failed = !(loss_err <= loss_tol);
    printf("%-12s %14s %12s %12s  %s\n", "tensor", "|ref|", "rel_l2_err", "max_abs_err", "status");
    printf("%-12s %14.6e %12.3e %12.3e  %s   (run %.9g, reference %.9g)\n", "loss", fabs(ref.loss), loss_err,
           fabs(run.loss - ref.loss), loss_err <= loss_tol ? "ok" : "FAIL", run.loss, ref.loss);
    double worst = -1.0, all_d2 = 0.0, all_r2 = 0.0;
    const char *worst_name = "";
    for (int k = 0; k < nt; k++) {
        double d2 = 0.0, r2 = 0.0, max_abs = 0.0;
        for (long i = t[k].goffset; i < t[k].goffset + (long)t[k].grows * t[k].gcols; i++) {
            double d = (double)run.grads[i] - ref.grads[i];
            d2 += d * d, r2 += (double)ref.grads[i] * ref.grads[i];
            max_abs = fabs(d) > max_abs || isnan(d) ? fabs(d) : max_abs;
        }
        all_d2 += d2, all_r2 += r2;
        double e = rel_err(d2, r2);
        int ok = e <= tol; /* NaN fails */
        failed |= !ok;
        if (!(e <= worst)) worst = e, worst_name = t[k].name;
        printf("%-12s %14.6e %12.3e %12.3e  %s\n", t[k].name, sqrt(r2), e, max_abs, ok ? "ok" : "FAIL");
    }
    printf("worst gradient: %s rel_err %.3e; all gradients rel_err %.3e; loss rel_err %.3e; tol %.1e (loss %.1e): %s\n",
           worst_name, worst, rel_err(all_d2, all_r2), loss_err, tol, loss_tol, failed ? "FAIL" : "PASS");
    free(t);
    spb_dump_free(&run), spb_dump_free(&ref);
    return failed ? 1 : 0;
}
