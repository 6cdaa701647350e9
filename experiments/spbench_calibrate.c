/* spbench-calibrate: measures this machine for the performance model and
 * writes a profile (docs/MODEL.md), by default profiles/local-cpu.profile.
 *
 *   mpiexec -np W build/spbench-calibrate [--output FILE] [--quick]
 *
 * Rank 0 measures, while the other ranks sleep (so they take no core):
 *   - sgemm rate by shape through the project's own timed path
 *     (spb_matmul_forward / spb_matmul_backward, common/core/ops_cpu.c), for the
 *     three products of a linear layer;
 *   - attention rate (counted FLOPs, common/attention/attention.h) of the flash and
 *     naive backends by length and head dimension, causal and full;
 *   - seconds per element of the element-wise kernels (LayerNorm, GELU,
 *     softmax cross-entropy, add, copy, AdamW, sum of squares).
 * Then every rank: alpha (latency) and beta (link bytes per second) of each
 * collective through common/runtime/comm.h's wrappers, for every group size that
 * divides W (the world cut into contiguous groups, all busy at once, as
 * spbench's groups are).  Communication points of other world sizes already
 * in the file are kept, so running it at -np 2 and -np 4 builds one profile. */
#define _DEFAULT_SOURCE
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attention.h"
#include "comm.h"
#include "config.h"
#include "ops.h"
#include "optimizer.h"
#include "perf_model.h"
#include "timer.h"
#include "spb_version.h"

static int quick;

static float *buffer(size_t n)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    if (!p) {
        fprintf(stderr, "spbench-calibrate: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 7919 % 1000) * 1e-3 - 0.5);
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Best time of fn over repetitions: at least 3, until ~budget seconds.  The
 * minimum, not the median: the machine may be shared, and another process's
 * burst is not this machine's rate (spbench's runs are then compared at
 * their median over iterations; docs/MODEL.md). */
typedef void (*bench_fn)(void *ctx);
static double best_time(bench_fn fn, void *ctx, double budget)
{
    double t[64];
    int n = 0;
    double start = spb_now();
    fn(ctx); /* warm */
    while (n < 64 && (n < 3 || spb_now() - start < budget)) {
        double t0 = spb_now();
        fn(ctx);
        t[n++] = spb_now() - t0;
    }
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[0];
}

/* ---------------------------------------------------------------- GEMM */

typedef struct gemm_ctx {
    int rows, in, out, op;
    float *x, *w, *y, *dx, *dw;
} gemm_ctx;

static void gemm_run(void *p)
{
    gemm_ctx *g = p;
    if (g->op == 0) spb_matmul_forward(g->y, g->x, g->w, NULL, g->rows, g->in, g->out);
    else if (g->op == 2) spb_matmul_backward(NULL, g->dw, NULL, g->y, g->x, g->w, g->rows, g->in, g->out, 0);
    else spb_matmul_backward(g->dx, g->dw, NULL, g->y, g->x, g->w, g->rows, g->in, g->out, 0);
}

static void measure_gemm(FILE *out)
{
    const int rows[] = {64, 256, 1024, 4096}, dims[] = {32, 128, 512, 2048};
    const double max_flops = quick ? 5e8 : 3e9;
    fprintf(out, "# matrix products through spb_matmul_* (common/core/ops_cpu.c), 1 BLAS thread:\n"
                 "# gemm_point = rows in out  forward  d_input  d_weight   (FLOP/s)\n");
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 4; c++) {
                gemm_ctx g = {rows[a], dims[b], dims[c], 0, NULL, NULL, NULL, NULL, NULL};
                double flops = 2.0 * g.rows * g.in * g.out;
                if (flops > max_flops) continue;
                g.x = buffer((size_t)g.rows * g.in), g.w = buffer((size_t)g.out * g.in);
                g.y = buffer((size_t)g.rows * g.out), g.dx = buffer((size_t)g.rows * g.in);
                g.dw = buffer((size_t)g.out * g.in);
                double budget = quick ? 0.02 : 0.08;
                g.op = 0;
                double t0 = best_time(gemm_run, &g, budget);
                g.op = 2;
                double t2 = best_time(gemm_run, &g, budget);
                g.op = 1; /* d input and d weight together; d input = difference */
                double t12 = best_time(gemm_run, &g, budget);
                double t1 = t12 - t2 > 0.2 * t2 ? t12 - t2 : 0.2 * t2;
                fprintf(out, "gemm_point = %d %d %d %.4g %.4g %.4g\n", g.rows, g.in, g.out, flops / t0, flops / t1,
                        flops / t2);
                free(g.x), free(g.w), free(g.y), free(g.dx), free(g.dw);
            }
}

/* ---------------------------------------------------------------- attention */

typedef struct attn_ctx {
    const spb_attn_backend *be;
    spb_attn_desc d;
    float *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    int backward;
} attn_ctx;

static void attn_run(void *p)
{
    attn_ctx *a = p;
    if (!a->backward) {
        a->be->forward(&a->d, a->q, a->k, a->v, a->o, a->lse);
    } else {
        size_t n = (size_t)a->d.batch * a->d.q_len * a->d.heads * a->d.head_dim;
        memset(a->dq, 0, n * sizeof(float)), memset(a->dk, 0, n * sizeof(float)), memset(a->dv, 0, n * sizeof(float));
        a->be->backward(&a->d, a->q, a->k, a->v, a->o, a->lse, a->dout, a->dq, a->dk, a->dv);
    }
}

static void measure_attention(FILE *out)
{
    const int lens[] = {64, 128, 256, 512, 1024, 2048, 4096}, hds[] = {16, 32, 64};
    const char *backends[] = {"flash", "naive"};
    const int heads = 4;
    fprintf(out, "# attention (common/attention/attention.h), batch 1, %d heads, q_len = k_len = len:\n"
                 "# attn_point = backend mask len head_dim forward backward   (counted FLOP/s: 4·D and 10·D per "
                 "visible pair)\n", heads);
    for (int be = 0; be < 2; be++)
        for (int causal = 1; causal >= 0; causal--)
            for (int h = 0; h < 3; h++)
                for (int l = 0; l < 7; l++) {
                    int len = lens[l], hd = hds[h];
                    double pairs = (causal ? (double)len * (len + 1) / 2 : (double)len * len) * heads;
                    double limit = (be == 1 ? 4e8 : 3e9) * (quick ? 0.2 : 1.0);
                    if (14.0 * hd * pairs > limit) continue;
                    attn_ctx a = {.be = spb_attn_backend_by_name(backends[be])};
                    long W = (long)heads * hd;
                    a.d = (spb_attn_desc){.batch = 1, .heads = heads, .head_dim = hd, .q_len = len, .k_len = len,
                                          .causal = causal, .scale = 1.0f / sqrtf((float)hd),
                                          .q_token_stride = W, .q_batch_stride = W * len,
                                          .k_token_stride = W, .k_batch_stride = W * len,
                                          .o_token_stride = W, .o_batch_stride = W * len};
                    size_t n = (size_t)len * W;
                    a.q = buffer(n), a.k = buffer(n), a.v = buffer(n), a.o = buffer(n), a.dout = buffer(n);
                    a.dq = buffer(n), a.dk = buffer(n), a.dv = buffer(n), a.lse = buffer((size_t)heads * len);
                    double vis = spb_attn_visible_pairs(&a.d);
                    double budget = quick ? 0.02 : 0.08;
                    a.backward = 0;
                    double tf = best_time(attn_run, &a, budget);
                    a.backward = 1;
                    double tb = best_time(attn_run, &a, budget);
                    fprintf(out, "attn_point = %s %s %d %d %.4g %.4g\n", backends[be], causal ? "causal" : "full", len,
                            hd, 4.0 * hd * vis / tf, 10.0 * hd * vis / tb);
                    free(a.q), free(a.k), free(a.v), free(a.o), free(a.dout), free(a.dq), free(a.dk), free(a.dv),
                        free(a.lse);
                }
}

/* ---------------------------------------------------------------- element-wise */

typedef struct elem_ctx {
    int kind;
    long n;
    int rows, C;
    float *a, *b, *c, *d, *w, *bias, *mean, *rstd;
    int *targets;
    spb_config cfg;
} elem_ctx;

static void elem_run(void *p)
{
    elem_ctx *e = p;
    switch (e->kind) {
    case SPB_ELEM_LN_FWD: spb_layernorm_forward(e->b, e->mean, e->rstd, e->a, e->w, e->bias, e->rows, e->C); break;
    case SPB_ELEM_LN_BWD:
        spb_layernorm_backward(e->c, e->d, e->d + e->C, e->b, e->a, e->w, e->mean, e->rstd, e->rows, e->C);
        break;
    case SPB_ELEM_GELU_FWD: spb_gelu_forward(e->b, e->a, e->n); break;
    case SPB_ELEM_GELU_BWD: spb_gelu_backward(e->c, e->a, e->b, e->n); break;
    case SPB_ELEM_XENT_FWD:
        memcpy(e->b, e->a, sizeof(float) * (size_t)e->n); /* logits are overwritten; the copy is subtracted */
        spb_softmax_xent_forward(e->b, e->targets, e->rows, e->C);
        break;
    case SPB_ELEM_XENT_BWD: spb_softmax_xent_backward(e->b, e->targets, e->rows, e->C, 1e-3f); break;
    case SPB_ELEM_ADD: spb_add_inplace(e->b, e->a, e->n); break;
    case SPB_ELEM_COPY: memcpy(e->b, e->a, sizeof(float) * (size_t)e->n); break;
    case SPB_ELEM_ADAM: spb_adamw_apply(e->a, e->b, e->c, e->d, e->n, 1.0f, 0.0f, &e->cfg, 3, 1e-4); break;
    case SPB_ELEM_SUMSQ: {
        volatile double s = spb_sum_squares(e->a, e->n);
        (void)s;
        break;
    }
    }
}

static void measure_elementwise(FILE *out)
{
    const int rows = 1024, C = 256;
    const long n = (long)rows * C;
    /* The optimizer's kernels run over the whole parameter vector, out of
     * cache: they are measured on 4M elements, the rest on one activation
     * buffer of rows x C. */
    const long big = 4L << 20;
    elem_ctx e = {.n = n, .rows = rows, .C = C};
    e.a = buffer((size_t)big), e.b = buffer((size_t)big), e.c = buffer((size_t)big), e.d = buffer((size_t)big);
    e.w = buffer((size_t)C), e.bias = buffer((size_t)C), e.mean = buffer(rows), e.rstd = buffer(rows);
    for (long i = 0; i < big; i++) e.c[i] = fabsf(e.c[i]), e.d[i] = fabsf(e.d[i]);
    e.targets = malloc(sizeof(int) * rows);
    for (int r = 0; r < rows; r++) e.targets[r] = (r * 37) % C;
    spb_config_defaults(&e.cfg);
    fprintf(out, "# element-wise kernels (common/core/ops_cpu.c, optimizer.c) on %d x %d floats (adam, sumsq: %ld): "
                 "seconds per element\n", rows, C, big);
    double copy = 0;
    for (int k = SPB_ELEM_NUM - 1; k >= 0; k--) { /* copy before xent_fwd, which subtracts it */
        e.kind = k;
        if (k == SPB_ELEM_LN_BWD || k == SPB_ELEM_XENT_BWD) { /* their inputs: a forward first */
            e.kind = k == SPB_ELEM_LN_BWD ? SPB_ELEM_LN_FWD : SPB_ELEM_XENT_FWD;
            elem_run(&e);
            e.kind = k;
        }
        e.n = (k == SPB_ELEM_ADAM || k == SPB_ELEM_SUMSQ) ? big : n;
        double t = best_time(elem_run, &e, quick ? 0.02 : 0.1) / (double)e.n;
        if (k == SPB_ELEM_COPY) copy = t;
        if (k == SPB_ELEM_XENT_FWD) t = t - copy > 0.2 * t ? t - copy : 0.2 * t;
        fprintf(out, "elem_%s = %.4g\n", spb_elem_name((spb_elem_kind)k), t);
    }
    free(e.a), free(e.b), free(e.c), free(e.d), free(e.w), free(e.bias), free(e.mean), free(e.rstd), free(e.targets);
}

/* ---------------------------------------------------------------- collectives */

static void measure_comm(int world, int rank, char *lines, size_t cap)
{
    size_t used = 0;
    lines[0] = '\0';
    const long floats[] = {256, 4096, 65536, 524288, 2097152};
    const int nsizes = quick ? 4 : 5;
    for (int g = 2; g <= world; g *= 2) {
        if (world % g) continue;
        MPI_Comm comm;
        MPI_Comm_split(MPI_COMM_WORLD, rank / g, rank, &comm);
        int gr;
        MPI_Comm_rank(comm, &gr);
        for (int op = 0; op < SPB_NUM_OPS; op++) {
            double x[8], y[8];
            for (int s = 0; s < nsizes; s++) {
                long cnt = floats[s]; /* floats per rank-block (allgather, alltoall, reduce-scatter) */
                long total = op == SPB_OP_ALLREDUCE || op == SPB_OP_SENDRECV ? cnt : cnt * g;
                float *send = buffer((size_t)(op == SPB_OP_ALLGATHER ? cnt : total));
                float *recv = buffer((size_t)total);
                int reps = cnt >= 524288 ? 5 : 20;
                double t[32];
                for (int r = 0; r < reps + 1; r++) {
                    MPI_Barrier(MPI_COMM_WORLD);
                    double t0 = spb_now();
                    switch (op) {
                    case SPB_OP_ALLREDUCE: spb_allreduce_sum_f32(recv, cnt, comm, SPB_PHASE_OTHER); break;
                    case SPB_OP_ALLGATHER: spb_allgather_f32(send, recv, cnt, comm, SPB_PHASE_OTHER); break;
                    case SPB_OP_REDUCE_SCATTER: spb_reduce_scatter_f32(recv, send, cnt, comm, SPB_PHASE_OTHER); break;
                    case SPB_OP_ALLTOALL: spb_alltoall_f32(send, recv, cnt, comm, SPB_PHASE_OTHER); break;
                    default: {
                        spb_sendrecv x;
                        spb_sendrecv_start(&x, send, (gr + 1) % g, recv, (gr + g - 1) % g, cnt, comm, SPB_PHASE_OTHER);
                        spb_sendrecv_wait(&x);
                    }
                    }
                    double dt = spb_now() - t0;
                    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                    if (r > 0) t[r - 1] = dt;
                }
                qsort(t, (size_t)reps, sizeof(double), cmp_double);
                /* link bytes as the accounting layer records them */
                double payload = 4.0 * (double)(op == SPB_OP_SENDRECV ? cnt : total);
                x[s] = payload * spb_comm_bus_factor((spb_comm_op)op, g);
                y[s] = t[reps / 2];
                free(send), free(recv);
            }
            /* least squares y = alpha + x / beta */
            double mx = 0, my = 0, sxx = 0, sxy = 0;
            for (int s = 0; s < nsizes; s++) mx += x[s] / nsizes, my += y[s] / nsizes;
            for (int s = 0; s < nsizes; s++) sxx += (x[s] - mx) * (x[s] - mx), sxy += (x[s] - mx) * (y[s] - my);
            double slope = sxy / sxx, alpha = my - slope * mx;
            if (slope <= 0) slope = y[nsizes - 1] / x[nsizes - 1];
            if (alpha < 0) alpha = y[0] > 0 ? fmin(y[0], 5e-6) : 0;
            if (rank == 0 && used < cap)
                used += (size_t)snprintf(lines + used, cap - used, "comm_point = %s %d %d %.4g %.4g\n",
                                         spb_comm_op_name((spb_comm_op)op), world, g, alpha, 1.0 / slope);
        }
        MPI_Comm_free(&comm);
    }
}

/* Others sleep until rank 0 is done, without taking a core. */
static void wait_for_rank0(void)
{
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    int done = 0;
    while (!done) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) usleep(2000);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const char *path = "profiles/local-cpu.profile";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--output") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else {
            if (rank == 0) fprintf(stderr, "usage: mpiexec -np W spbench-calibrate [--output FILE] [--quick]\n");
            MPI_Finalize();
            return 2;
        }
    }
    char *compute = NULL;
    size_t compute_len = 0;
    if (rank == 0) {
        FILE *mem = open_memstream(&compute, &compute_len);
        double t0 = spb_now();
        measure_gemm(mem);
        measure_attention(mem);
        measure_elementwise(mem);
        fclose(mem);
        fprintf(stderr, "spbench-calibrate: compute measured in %.1f s\n", spb_now() - t0);
        MPI_Request req;
        MPI_Ibarrier(MPI_COMM_WORLD, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
    } else {
        wait_for_rank0();
    }
    enum { CAP = 1 << 16 };
    char *comm = calloc(CAP, 1);
    double t0 = spb_now();
    if (world > 1) measure_comm(world, rank, comm, CAP);
    if (rank == 0) {
        fprintf(stderr, "spbench-calibrate: collectives measured in %.1f s\n", spb_now() - t0);
        /* keep other world sizes' communication points */
        char *kept = calloc(CAP, 1);
        size_t kl = 0;
        FILE *old = fopen(path, "r");
        if (old) {
            char line[512];
            while (fgets(line, sizeof line, old)) {
                int w;
                char op[32];
                if (sscanf(line, "comm_point = %31s %d", op, &w) == 2 && w != world && kl + strlen(line) < CAP) {
                    strcpy(kept + kl, line);
                    kl += strlen(line);
                }
            }
            fclose(old);
        }
        FILE *f = fopen(path, "w");
        if (!f) {
            fprintf(stderr, "spbench-calibrate: cannot write %s\n", path);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        char host[128] = "unknown", date[32], cpu[256] = "unknown";
        gethostname(host, sizeof host);
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        FILE *ci = fopen("/proc/cpuinfo", "r");
        if (ci) {
            char line[512];
            while (fgets(line, sizeof line, ci))
                if (!strncmp(line, "model name", 10)) {
                    char *c = strchr(line, ':');
                    if (c) snprintf(cpu, sizeof cpu, "%s", c + 2);
                    cpu[strcspn(cpu, "\n")] = '\0';
                    break;
                }
            fclose(ci);
        }
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        fprintf(f, "# Local CPU machine, MEASURED by spbench-calibrate (experiments/spbench_calibrate.c).\n"
                   "# Format: docs/MODEL.md.  Regenerate: mpiexec -np 2 build/spbench-calibrate; mpiexec -np 4 ...\n");
        fprintf(f, "name = local-cpu\ndevice = cpu\nprecision = fp32\n");
        fprintf(f, "description = %s, %ld cores, host %s, %s\n", cpu, cores, host, spb_blas_description());
        fprintf(f, "measured = %s (commit %s, last run at -np %d%s)\n", date, SPB_VERSION_COMMIT, world,
                quick ? ", --quick" : "");
        fprintf(f, "# ranks share the cores: compute rates scale by cores/ranks when ranks > cores\n");
        fprintf(f, "cores = %ld\nranks_per_node = 0\nmemory = %.0f\nmemory_reserved = 0\n", cores, ram);
        fputs(compute, f);
        fprintf(f, "# collectives through common/runtime/comm.h, all groups busy at once; time = alpha + link_bytes / beta\n"
                   "# comm_point = op world group alpha_s beta_bytes_per_s\n");
        fputs(kept, f);
        fputs(comm, f);
        fclose(f);
        printf("spbench-calibrate: wrote %s\n", path);
        free(kept);
    }
    free(comm);
    free(compute);
    MPI_Finalize();
    return 0;
}
