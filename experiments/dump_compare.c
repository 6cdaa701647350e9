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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/config.h"
#include "../common/gpt.h"

enum { HEADER_BYTES = 256 };

typedef struct dump_file {
    int64_t B, T, V, n;
    double loss;
    int32_t *tokens; /* inputs then targets, 2·B·T */
    float *grad;
} dump_file;

static int fail(const char *fmt, const char *path)
{
    fprintf(stderr, "spbench-dump-compare: error: ");
    fprintf(stderr, fmt, path);
    fputc('\n', stderr);
    return -1;
}

static int read_header(FILE *f, const char *magic, unsigned char *h, const char *path)
{
    if (fread(h, 1, HEADER_BYTES, f) != HEADER_BYTES) return fail("%s: shorter than its 256-byte header", path);
    if (memcmp(h, magic, 8)) return fail("%s: wrong magic (not the file kind expected)", path);
    uint32_t version, hb;
    memcpy(&version, h + 8, 4);
    memcpy(&hb, h + 12, 4);
    if (version != 1 || hb != HEADER_BYTES) return fail("%s: unknown version or header size", path);
    return 0;
}

static int read_dump(const char *path, dump_file *d)
{
    FILE *f = fopen(path, "rb");
    if (!f) return fail("cannot open %s", path);
    unsigned char h[HEADER_BYTES];
    int rc = read_header(f, "SPBDUMP\0", h, path);
    if (!rc) {
        int64_t v[4];
        memcpy(v, h + 16, sizeof v);
        memcpy(&d->loss, h + 48, 8);
        d->B = v[0], d->T = v[1], d->V = v[2], d->n = v[3];
        if (d->B <= 0 || d->T <= 0 || d->V <= 0 || d->n <= 0 || d->B * d->T > (1L << 34) || d->n > (1L << 36))
            rc = fail("%s: implausible sizes in the header", path);
    }
    if (!rc) {
        size_t bt = (size_t)(2 * d->B * d->T);
        d->tokens = malloc(bt * sizeof(int32_t));
        d->grad = malloc((size_t)d->n * sizeof(float));
        if (!d->tokens || !d->grad) rc = fail("%s: out of memory", path);
        else if (fread(d->tokens, sizeof(int32_t), bt, f) != bt ||
                 fread(d->grad, sizeof(float), (size_t)d->n, f) != (size_t)d->n || fgetc(f) != EOF)
            rc = fail("%s: size does not match its header", path);
    }
    fclose(f);
    return rc;
}

/* The model's shape from the dump's checkpoint (the parameters the step used). */
static int read_model(const char *dump_path, spb_config *cfg)
{
    char path[SPB_PATH_MAX + 8];
    snprintf(path, sizeof path, "%s.ckpt", dump_path);
    FILE *f = fopen(path, "rb");
    if (!f) return fail("cannot open %s (written beside every --dump)", path);
    unsigned char h[HEADER_BYTES];
    int rc = read_header(f, "SPBCKPT\0", h, path);
    fclose(f);
    if (rc) return rc;
    int64_t v[10];
    memcpy(v, h + 16, sizeof v);
    for (int i = 0; i < 7; i++)
        if (v[i] <= 0 || v[i] > (1 << 24)) return fail("%s: implausible model sizes in the header", path);
    spb_config_defaults(cfg);
    cfg->num_layers = (int)v[0], cfg->hidden_size = (int)v[1], cfg->num_heads = (int)v[2];
    cfg->ffn_hidden_size = (int)v[3], cfg->vocab_size = (int)v[4], cfg->max_position_embeddings = (int)v[5];
    cfg->seq_length = (int)v[6];
    return 0;
}

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

    dump_file run = {0}, ref = {0};
    spb_config cfg;
    if (read_dump(paths[0], &run) || read_dump(paths[1], &ref) || read_model(paths[0], &cfg)) return 2;
    if (run.B != ref.B || run.T != ref.T || run.V != ref.V || run.n != ref.n) {
        fprintf(stderr, "spbench-dump-compare: error: %s and %s have other shapes (B, T, V or parameters)\n", paths[0],
                paths[1]);
        return 2;
    }
    if (memcmp(run.tokens, ref.tokens, sizeof(int32_t) * (size_t)(2 * run.B * run.T))) {
        fprintf(stderr, "spbench-dump-compare: error: %s and %s saw other batches (inputs or targets differ)\n",
                paths[0], paths[1]);
        return 2;
    }
    long num_local = 0, num_global = 0;
    int nt = spb_gpt_tensor_table(&cfg, 1, NULL, &num_local, &num_global);
    if (num_global != run.n) {
        fprintf(stderr, "spbench-dump-compare: error: %s.ckpt's model has %ld parameters, the dump %lld\n", paths[0],
                num_global, (long long)run.n);
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
            double d = (double)run.grad[i] - ref.grad[i];
            d2 += d * d, r2 += (double)ref.grad[i] * ref.grad[i];
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
    free(run.tokens), free(run.grad), free(ref.tokens), free(ref.grad);
    return failed ? 1 : 0;
}
