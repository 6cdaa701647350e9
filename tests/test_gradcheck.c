/* Gradient check: every parameter tensor's analytic fp32 gradient from the
 * GPT core against central finite differences of an independent
 * double-precision forward written here from docs/FORMATS.md. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"
#include "grid.h"
#include "rng.h"
#include "mpi_check.h"

enum { B = 2 };

/* The independent reference: plain loops in double, nothing shared with the
 * core but the documented parameter order. */
typedef struct ref_model {
    const spb_gpt *g; /* shapes and tensor table only */
    const double *p;
} ref_model;

static const double *tensor(const ref_model *m, int t) { return m->p + m->g->tensors[t].offset; }

/* The tensor of that name (h<l>.<kind> in a layer), NULL when the model's
 * variant has none (a bias under --disable-bias-linear, ...). */
static const double *named(const ref_model *m, int layer, const char *kind)
{
    char name[32];
    if (layer >= 0)
        snprintf(name, sizeof name, "h%d.%s", layer, kind);
    else
        snprintf(name, sizeof name, "%s", kind);
    for (int t = 0; t < m->g->num_tensors; t++)
        if (!strcmp(m->g->tensors[t].name, name)) return tensor(m, t);
    return NULL;
}

/* LayerNorm, or RMSNorm when the model has no norm bias (b NULL). */
static void ref_norm(double *y, const double *x, const double *w, const double *b, int C, int rms)
{
    double mean = 0, var = 0;
    if (!rms) {
        for (int i = 0; i < C; i++) mean += x[i];
        mean /= C;
    }
    for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= C;
    for (int i = 0; i < C; i++) y[i] = (x[i] - mean) / sqrt(var + 1e-5) * w[i] + (b ? b[i] : 0.0);
}

static void ref_linear(double *y, const double *x, const double *W, const double *b, int in, int out)
{
    for (int o = 0; o < out; o++) {
        double s = b ? b[o] : 0.0;
        for (int i = 0; i < in; i++) s += W[(long)o * in + i] * x[i];
        y[o] = s;
    }
}

/* Rotary embedding of one head at position pos: pairs (i, i + D/2) turned
 * by pos · base^(-2i/D) (Llama's rotate_half). */
static void ref_rope(double *v, int D, long pos, double base)
{
    for (int i = 0; i < D / 2; i++) {
        double a = pos * pow(base, -2.0 * i / D), lo = v[i], hi = v[i + D / 2];
        v[i] = lo * cos(a) - hi * sin(a);
        v[i + D / 2] = hi * cos(a) + lo * sin(a);
    }
}

/* The model of docs/FORMATS.md: GPT-2 (learned positions, LayerNorm, GELU,
 * tied head, biases) or its Llama variants (RoPE, RMSNorm, SwiGLU, untied
 * head, no biases, grouped-query attention: query head h reads K/V head
 * h / (H/G)). */
static double ref_loss(const ref_model *m, const int *in, const int *tg, int T)
{
    const spb_gpt *g = m->g;
    int C = g->C, H = g->H, D = g->D, F = g->F, V = g->V, L = g->L, G = g->G, W = (H + 2 * G) * D;
    const int rms = g->rmsnorm;
    double *x = calloc((size_t)T * C, sizeof(double)), *a = calloc((size_t)T * C, sizeof(double));
    double *qkv = calloc((size_t)T * W, sizeof(double)), *o = calloc((size_t)T * C, sizeof(double));
    double *u = calloc((size_t)2 * F, sizeof(double)), *y = calloc((size_t)C, sizeof(double));
    double *logits = calloc((size_t)V, sizeof(double)), *s = calloc((size_t)T, sizeof(double));
    const double *wpe = named(m, -1, "wpe"), *head = named(m, -1, "lm_head");
    double loss = 0;
    for (int b = 0; b < B; b++) {
        const int *tok = in + b * T, *tgt = tg + b * T;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++) x[t * C + i] = named(m, -1, "wte")[tok[t] * C + i] + (wpe ? wpe[t * C + i] : 0);
        for (int l = 0; l < L; l++) {
            for (int t = 0; t < T; t++) {
                ref_norm(a + t * C, x + t * C, named(m, l, "ln1_w"), named(m, l, "ln1_b"), C, rms);
                ref_linear(qkv + t * W, a + t * C, named(m, l, "qkv_w"), named(m, l, "qkv_b"), C, W);
                if (g->rope)
                    for (int h = 0; h < H + G; h++) ref_rope(qkv + t * W + h * D, D, t, g->rotary_base);
            }
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    const double *q = qkv + t * W + h * D;
                    const int kv = h / (H / G);
                    double mx = -INFINITY, sum = 0;
                    for (int j = 0; j <= t; j++) {
                        const double *k = qkv + j * W + H * D + kv * D;
                        double dot = 0;
                        for (int d = 0; d < D; d++) dot += q[d] * k[d];
                        s[j] = dot / sqrt((double)D);
                        if (s[j] > mx) mx = s[j];
                    }
                    for (int j = 0; j <= t; j++) sum += (s[j] = exp(s[j] - mx));
                    for (int d = 0; d < D; d++) {
                        double acc = 0;
                        for (int j = 0; j <= t; j++) acc += s[j] * qkv[j * W + (H + G) * D + kv * D + d];
                        o[t * C + h * D + d] = acc / sum;
                    }
                }
            for (int t = 0; t < T; t++) {
                ref_linear(y, o + t * C, named(m, l, "proj_w"), named(m, l, "proj_b"), C, C);
                for (int i = 0; i < C; i++) x[t * C + i] += y[i];
                ref_norm(a + t * C, x + t * C, named(m, l, "ln2_w"), named(m, l, "ln2_b"), C, rms);
                ref_linear(u, a + t * C, named(m, l, "fc_w"), named(m, l, "fc_b"), C, g->swiglu ? 2 * F : F);
                for (int f = 0; f < F; f++)
                    u[f] = g->swiglu ? u[f] / (1 + exp(-u[f])) * u[F + f]
                                     : 0.5 * u[f] * (1 + tanh(sqrt(2 / 3.14159265358979323846) *
                                                              (u[f] + 0.044715 * u[f] * u[f] * u[f])));
                ref_linear(y, u, named(m, l, "fcproj_w"), named(m, l, "fcproj_b"), F, C);
                for (int i = 0; i < C; i++) x[t * C + i] += y[i];
            }
        }
        for (int t = 0; t < T; t++) {
            ref_norm(a + t * C, x + t * C, named(m, -1, "lnf_w"), named(m, -1, "lnf_b"), C, rms);
            ref_linear(logits, a + t * C, head ? head : named(m, -1, "wte"), NULL, C, V);
            double mx = -INFINITY, sum = 0;
            for (int v = 0; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
            for (int v = 0; v < V; v++) sum += exp(logits[v] - mx);
            loss += log(sum) + mx - logits[tgt[t]];
        }
    }
    free(x), free(a), free(qkv), free(o), free(u), free(y), free(logits), free(s);
    return loss / (B * T);
}

/* model: "gpt" or "llama" (with G K/V heads; the MLP 24 wide). */
static void run_gradcheck(const char *attention, int T, int layers, const char *model, int G)
{
    spb_config cfg;
    spb_config_defaults(&cfg);
    cfg.num_layers = layers, cfg.hidden_size = 16, cfg.num_heads = 4, cfg.seq_length = T, cfg.vocab_size = 32;
    cfg.micro_batch_size = B;
    snprintf(cfg.model, sizeof cfg.model, "%s", model);
    cfg.num_query_groups = G;
    if (!strcmp(model, "llama")) cfg.ffn_hidden_size = 24;
    snprintf(cfg.attention, sizeof cfg.attention, "%s", attention);
    char err[256];
    ck_assert_msg(spb_config_finalize(&cfg, 1, err, sizeof err) == 0, "%s", err);
    spb_grid grid;
    spb_grid_create(&grid, MPI_COMM_SELF, 1);
    spb_gpt *g = spb_gpt_create(&cfg, &grid);
    /* Random values everywhere (LayerNorm gains and biases included), larger
     * than GPT-2's init so that every nonlinearity is exercised. */
    for (long i = 0; i < g->num_params; i++) g->params[i] = (float)(0.3 * spb_rng_normal(7, 99, (uint64_t)i));
    int in[B * 128], tg[B * 128];
    for (int i = 0; i < B * T; i++) {
        in[i] = (int)spb_rng_below(7, 1, (uint64_t)i, 32);
        tg[i] = (int)spb_rng_below(7, 2, (uint64_t)i, 32);
    }
    spb_gpt_zero_grads(g);
    double loss32 = spb_gpt_forward(g, in, tg) / (B * T);
    spb_gpt_backward(g, 1.0f / (B * T));

    double *p = malloc(sizeof(double) * (size_t)g->num_params);
    for (long i = 0; i < g->num_params; i++) p[i] = g->params[i];
    ref_model m = {g, p};
    double loss64 = ref_loss(&m, in, tg, T);
    printf("[%s %s G=%d T=%d] loss fp32 %.9f reference fp64 %.9f rel %.2e\n", model, attention, g->G, T, loss32, loss64,
           fabs(loss32 - loss64) / fabs(loss64));
    ck_assert_double_le(fabs(loss32 - loss64) / fabs(loss64), 1e-5);

    /* eps = 1e-5 in double: truncation O(eps²) ~ 1e-10, rounding ~ 1e-16/eps
     * ~ 1e-11, both far below the 1e-4 bound, which is then a test of the
     * fp32 analytic gradient alone. */
    const double eps = 1e-5;
    double worst = 0;
    for (int t = 0; t < g->num_tensors; t++) {
        const spb_param_tensor *pt = &g->tensors[t];
        double diff2 = 0, ref2 = 0;
        for (long i = pt->offset; i < pt->offset + pt->numel; i++) {
            double keep = p[i];
            p[i] = keep + eps;
            double lp = ref_loss(&m, in, tg, T);
            p[i] = keep - eps;
            double lm = ref_loss(&m, in, tg, T);
            p[i] = keep;
            double fd = (lp - lm) / (2 * eps), an = g->grads[i];
            diff2 += (an - fd) * (an - fd);
            ref2 += fd * fd;
        }
        double rel = sqrt(diff2) / fmax(sqrt(ref2), 1e-30);
        printf("  %-12s %6ld  |g| %.3e  rel err %.2e\n", pt->name, pt->numel, sqrt(ref2), rel);
        ck_assert_msg(ref2 > 0, "%s: finite differences give a zero gradient: the check would be vacuous", pt->name);
        ck_assert_msg(rel <= 1e-4, "%s: relative error %.3e > 1e-4", pt->name, rel);
        if (rel > worst) worst = rel;
    }
    printf("[%s %s G=%d T=%d] worst per-tensor relative error %.2e (bound 1e-4)\n", model, attention, g->G, T, worst);
    free(p);
    spb_gpt_destroy(g);
    spb_grid_destroy(&grid);
}

START_TEST(gradcheck_naive) { run_gradcheck("naive", 8, 2, "gpt", 0); }
END_TEST

START_TEST(gradcheck_flash) { run_gradcheck("flash", 8, 2, "gpt", 0); }
END_TEST

/* Longer than one 64-row flash tile, not a multiple of it.  One layer: each
 * layer runs the same code, and the gradient's way from one layer into the
 * one below is checked by the two cases above (with both backends); a
 * second layer here doubled the test's time for no other path. */
START_TEST(gradcheck_flash_multi_tile) { run_gradcheck("flash", 70, 1, "gpt", 0); }
END_TEST

/* The Llama variant: RoPE, RMSNorm, SwiGLU, untied head, no biases, with
 * two K/V groups and multi-query attention (GPT with grouped queries and
 * biases: tests/torch_check.sh's gpt-gqa-rope-ring). */
START_TEST(gradcheck_llama_gqa) { run_gradcheck("flash", 8, 2, "llama", 2); }
END_TEST

START_TEST(gradcheck_llama_mqa) { run_gradcheck("naive", 8, 2, "llama", 1); }
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("gradcheck");
    TCase *tc = tcase_create("finite_differences");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, gradcheck_naive);
    tcase_add_test(tc, gradcheck_flash);
    tcase_add_test(tc, gradcheck_flash_multi_tile);
    tcase_add_test(tc, gradcheck_llama_gqa);
    tcase_add_test(tc, gradcheck_llama_mqa);
    suite_add_tcase(s, tc);
    return spb_run_suite_and_finalize(s);
}
