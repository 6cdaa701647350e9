#include "gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "memory.h"
#include "ops.h"
#include "rng.h"
#include "timer.h"

static const char *layer_tensor_names[SPB_TENSORS_PER_LAYER] = {
    "ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w", "proj_b",
    "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b"};

/* Fills the tensor table in the documented order; returns the count. */
static int build_tensor_table(spb_param_tensor *t, int L, int C, int F, int V, int maxpos, long *num_params)
{
    int n = 0;
    long off = 0;
#define ADD(nm, layer_, r, c, dec)                                                         \
    do {                                                                                   \
        if (t) {                                                                           \
            snprintf(t[n].name, sizeof t[n].name, "%s", nm);                               \
            t[n].offset = off; t[n].numel = (long)(r) * (c); t[n].rows = (r); t[n].cols = (c); \
            t[n].layer = (layer_); t[n].decay = (dec);                                     \
        }                                                                                  \
        off += (long)(r) * (c);                                                            \
        n++;                                                                               \
    } while (0)
    ADD("wte", -1, V, C, 1);
    ADD("wpe", -1, maxpos, C, 1);
    for (int l = 0; l < L; l++) {
        int rows[SPB_TENSORS_PER_LAYER] = {C, C, 3 * C, 3 * C, C, C, C, C, F, F, C, C};
        int cols[SPB_TENSORS_PER_LAYER] = {1, 1, C, 1, C, 1, 1, 1, C, 1, F, 1};
        for (int k = 0; k < SPB_TENSORS_PER_LAYER; k++) {
            char nm[32];
            snprintf(nm, sizeof nm, "h%d.%s", l, layer_tensor_names[k]);
            ADD(nm, l, rows[k], cols[k], cols[k] > 1);
        }
    }
    ADD("lnf_w", -1, C, 1, 0);
    ADD("lnf_b", -1, C, 1, 0);
#undef ADD
    *num_params = off;
    return n;
}

long spb_gpt_count_params(const spb_config *c)
{
    long n = 0;
    build_tensor_table(NULL, c->num_layers, c->hidden_size, c->ffn_hidden_size, c->vocab_size,
                       c->max_position_embeddings, &n);
    return n;
}

static void set_views(spb_gpt *g, float *base, float **wte, float **wpe, float **lnf_w, float **lnf_b,
                      spb_layer_params *lp)
{
    spb_param_tensor *t = g->tensors;
    *wte = base + t[0].offset;
    *wpe = base + t[1].offset;
    for (int l = 0; l < g->L; l++) {
        float *p[SPB_TENSORS_PER_LAYER];
        for (int k = 0; k < SPB_TENSORS_PER_LAYER; k++) p[k] = base + t[2 + SPB_TENSORS_PER_LAYER * l + k].offset;
        lp[l] = (spb_layer_params){p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]};
    }
    *lnf_w = base + t[g->num_tensors - 2].offset;
    *lnf_b = base + t[g->num_tensors - 1].offset;
}

static float *act(long n) { return spb_mem_alloc(SPB_MEM_ACTIVATIONS, sizeof(float) * (size_t)n); }
static float *scratch(long n) { return spb_mem_alloc(SPB_MEM_WORKSPACE, sizeof(float) * (size_t)n); }

spb_gpt *spb_gpt_create(const spb_config *cfg, const spb_grid *grid)
{
    spb_gpt *g = SPB_CHECK_PTR(calloc(1, sizeof *g));
    g->L = cfg->num_layers;
    g->C = cfg->hidden_size;
    g->H = cfg->num_heads;
    g->D = g->C / g->H;
    g->F = cfg->ffn_hidden_size;
    g->V = cfg->vocab_size;
    g->maxpos = cfg->max_position_embeddings;
    g->seq_length = cfg->seq_length;
    g->init_std = cfg->init_std;
    g->B = cfg->micro_batch_size;
    g->T = cfg->seq_length / grid->sp_size;
    g->t_offset = (long)grid->sp_rank * g->T;
    g->grid = grid;
    g->strategy = spb_strategy_by_name(cfg->strategy);
    g->attn = spb_attn_backend_by_name(cfg->attention);
    SPB_CHECK(g->strategy && g->attn);

    g->num_tensors = build_tensor_table(NULL, g->L, g->C, g->F, g->V, g->maxpos, &g->num_params);
    g->tensors = SPB_CHECK_PTR(calloc((size_t)g->num_tensors, sizeof *g->tensors));
    build_tensor_table(g->tensors, g->L, g->C, g->F, g->V, g->maxpos, &g->num_params);
    g->params = spb_mem_alloc(SPB_MEM_PARAMS, sizeof(float) * (size_t)g->num_params);
    g->grads = spb_mem_alloc(SPB_MEM_GRADS, sizeof(float) * (size_t)g->num_params);
    g->layer = SPB_CHECK_PTR(calloc((size_t)g->L, sizeof *g->layer));
    g->dlayer = SPB_CHECK_PTR(calloc((size_t)g->L, sizeof *g->dlayer));
    set_views(g, g->params, &g->wte, &g->wpe, &g->lnf_w, &g->lnf_b, g->layer);
    set_views(g, g->grads, &g->dwte, &g->dwpe, &g->dlnf_w, &g->dlnf_b, g->dlayer);

    long BT = (long)g->B * g->T, C = g->C, F = g->F;
    spb_attn_ctx probe = {.grid = grid, .batch = g->B, .heads = g->H, .head_dim = g->D,
                          .local_tokens = g->T, .token_offset = g->t_offset, .seq_length = g->seq_length};
    long lse_n = (long)g->strategy->lse_elements(&probe);
    g->inputs = spb_mem_alloc(SPB_MEM_ACTIVATIONS, sizeof(int) * (size_t)BT);
    g->targets = spb_mem_alloc(SPB_MEM_ACTIVATIONS, sizeof(int) * (size_t)BT);
    g->x = SPB_CHECK_PTR(calloc((size_t)g->L + 1, sizeof *g->x));
    g->acts = SPB_CHECK_PTR(calloc((size_t)g->L, sizeof *g->acts));
    for (int l = 0; l <= g->L; l++) g->x[l] = act(BT * C);
    for (int l = 0; l < g->L; l++) {
        spb_layer_acts *a = &g->acts[l];
        a->ln1_out = act(BT * C);
        a->ln1_mean = act(BT);
        a->ln1_rstd = act(BT);
        a->qkv = act(BT * 3 * C);
        a->atto = act(BT * C);
        a->lse = act(lse_n);
        a->res_mid = act(BT * C);
        a->ln2_out = act(BT * C);
        a->ln2_mean = act(BT);
        a->ln2_rstd = act(BT);
        a->fc_pre = act(BT * F);
        a->fc_act = act(BT * F);
    }
    g->lnf_out = act(BT * C);
    g->lnf_mean = act(BT);
    g->lnf_rstd = act(BT);
    g->probs = act(BT * g->V);
    g->dx = scratch(BT * C);
    g->dtmp = scratch(BT * C);
    g->datto = scratch(BT * C);
    g->dqkv = scratch(BT * 3 * C);
    g->dfc = scratch(BT * F);
    return g;
}

void spb_gpt_destroy(spb_gpt *g)
{
    if (!g) return;
    for (int l = 0; l < g->L; l++) {
        spb_layer_acts *a = &g->acts[l];
        float *bufs[] = {a->ln1_out, a->ln1_mean, a->ln1_rstd, a->qkv, a->atto, a->lse,
                         a->res_mid, a->ln2_out, a->ln2_mean, a->ln2_rstd, a->fc_pre, a->fc_act};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) spb_mem_free(bufs[k]);
    }
    for (int l = 0; l <= g->L; l++) spb_mem_free(g->x[l]);
    float *bufs[] = {g->lnf_out, g->lnf_mean, g->lnf_rstd, g->probs, g->dx, g->dtmp, g->datto, g->dqkv, g->dfc,
                     g->params, g->grads};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) spb_mem_free(bufs[k]);
    spb_mem_free(g->inputs);
    spb_mem_free(g->targets);
    free(g->x);
    free(g->acts);
    free(g->layer);
    free(g->dlayer);
    free(g->tensors);
    free(g);
}

void spb_gpt_init_params(spb_gpt *g, uint64_t seed)
{
    const double std = g->init_std, proj_std = g->init_std / sqrt(2.0 * g->L);
    for (int t = 0; t < g->num_tensors; t++) {
        const spb_param_tensor *pt = &g->tensors[t];
        float *p = g->params + pt->offset;
        const char *kind = strchr(pt->name, '.') ? strchr(pt->name, '.') + 1 : pt->name;
        int is_ln_weight = !strcmp(kind, "ln1_w") || !strcmp(kind, "ln2_w") || !strcmp(kind, "lnf_w");
        if (is_ln_weight) {
            for (long i = 0; i < pt->numel; i++) p[i] = 1.0f;
        } else if (pt->cols == 1) {
            memset(p, 0, sizeof(float) * (size_t)pt->numel); /* biases, LayerNorm biases */
        } else {
            double s = (!strcmp(kind, "proj_w") || !strcmp(kind, "fcproj_w")) ? proj_std : std;
            for (long i = 0; i < pt->numel; i++) p[i] = (float)(s * spb_rng_normal(seed, (uint64_t)t, (uint64_t)i));
        }
    }
}

void spb_gpt_zero_grads(spb_gpt *g) { memset(g->grads, 0, sizeof(float) * (size_t)g->num_params); }

static spb_attn_ctx attn_ctx(spb_gpt *g, int layer)
{
    return (spb_attn_ctx){.grid = g->grid, .backend = g->attn, .batch = g->B, .heads = g->H, .head_dim = g->D,
                          .local_tokens = g->T, .token_offset = g->t_offset, .seq_length = g->seq_length,
                          .layer = layer, .flops = &g->attn_flops};
}

double spb_gpt_forward(spb_gpt *g, const int *inputs, const int *targets)
{
    double t0 = spb_now();
    const int BT = g->B * g->T, C = g->C, F = g->F;
    memcpy(g->inputs, inputs, sizeof(int) * (size_t)BT);
    memcpy(g->targets, targets, sizeof(int) * (size_t)BT);
    spb_embedding_forward(g->x[0], inputs, g->wte, g->wpe, BT, g->T, g->t_offset, C);
    for (int l = 0; l < g->L; l++) {
        const spb_layer_params *p = &g->layer[l];
        spb_layer_acts *a = &g->acts[l];
        float *x = g->x[l];
        spb_layernorm_forward(a->ln1_out, a->ln1_mean, a->ln1_rstd, x, p->ln1_w, p->ln1_b, BT, C);
        spb_matmul_forward(a->qkv, a->ln1_out, p->qkv_w, p->qkv_b, BT, C, 3 * C);
        spb_attn_ctx ctx = attn_ctx(g, l);
        g->strategy->attention_forward(&ctx, a->qkv, a->atto, a->lse);
        spb_matmul_forward(a->res_mid, a->atto, p->proj_w, p->proj_b, BT, C, C);
        spb_add_inplace(a->res_mid, x, (long)BT * C);
        spb_layernorm_forward(a->ln2_out, a->ln2_mean, a->ln2_rstd, a->res_mid, p->ln2_w, p->ln2_b, BT, C);
        spb_matmul_forward(a->fc_pre, a->ln2_out, p->fc_w, p->fc_b, BT, C, F);
        spb_gelu_forward(a->fc_act, a->fc_pre, (long)BT * F);
        spb_matmul_forward(g->x[l + 1], a->fc_act, p->fcproj_w, p->fcproj_b, BT, F, C);
        spb_add_inplace(g->x[l + 1], a->res_mid, (long)BT * C);
    }
    spb_layernorm_forward(g->lnf_out, g->lnf_mean, g->lnf_rstd, g->x[g->L], g->lnf_w, g->lnf_b, BT, C);
    spb_matmul_forward(g->probs, g->lnf_out, g->wte, NULL, BT, C, g->V);
    double loss_sum = spb_softmax_xent_forward(g->probs, targets, BT, g->V);
    spb_timer_add(SPB_T_FORWARD, spb_now() - t0);
    return loss_sum;
}

void spb_gpt_backward(spb_gpt *g, float loss_scale)
{
    double t0 = spb_now();
    const int BT = g->B * g->T, C = g->C, F = g->F;
    spb_softmax_xent_backward(g->probs, g->targets, BT, g->V, loss_scale);
    /* LM head (tied): dlnf_out = dlogits · wte, dwte += dlogitsᵀ · lnf_out */
    spb_matmul_backward(g->dtmp, g->dwte, NULL, g->probs, g->lnf_out, g->wte, BT, C, g->V, 0);
    memset(g->dx, 0, sizeof(float) * (size_t)BT * C);
    spb_layernorm_backward(g->dx, g->dlnf_w, g->dlnf_b, g->dtmp, g->x[g->L], g->lnf_w, g->lnf_mean, g->lnf_rstd,
                           BT, C);
    /* g->dx holds d loss / d x[l+1] on entry to each layer, d x[l] on exit. */
    for (int l = g->L - 1; l >= 0; l--) {
        const spb_layer_params *p = &g->layer[l];
        spb_layer_params *dp = &g->dlayer[l];
        spb_layer_acts *a = &g->acts[l];
        spb_matmul_backward(g->dfc, dp->fcproj_w, dp->fcproj_b, g->dx, a->fc_act, p->fcproj_w, BT, F, C, 0);
        spb_gelu_backward(g->dfc, a->fc_pre, g->dfc, (long)BT * F);
        spb_matmul_backward(g->dtmp, dp->fc_w, dp->fc_b, g->dfc, a->ln2_out, p->fc_w, BT, C, F, 0);
        spb_layernorm_backward(g->dx, dp->ln2_w, dp->ln2_b, g->dtmp, a->res_mid, p->ln2_w, a->ln2_mean,
                               a->ln2_rstd, BT, C);
        spb_matmul_backward(g->datto, dp->proj_w, dp->proj_b, g->dx, a->atto, p->proj_w, BT, C, C, 0);
        spb_attn_ctx ctx = attn_ctx(g, l);
        g->strategy->attention_backward(&ctx, a->qkv, a->atto, a->lse, g->datto, g->dqkv);
        spb_matmul_backward(g->dtmp, dp->qkv_w, dp->qkv_b, g->dqkv, a->ln1_out, p->qkv_w, BT, C, 3 * C, 0);
        spb_layernorm_backward(g->dx, dp->ln1_w, dp->ln1_b, g->dtmp, g->x[l], p->ln1_w, a->ln1_mean, a->ln1_rstd,
                               BT, C);
    }
    spb_embedding_backward(g->dwte, g->dwpe, g->dx, g->inputs, BT, g->T, g->t_offset, C);
    spb_timer_add(SPB_T_BACKWARD, spb_now() - t0);
}
