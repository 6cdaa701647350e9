#include "gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "checks.h"
#include "memory.h"
#include "ops.h"
#include "rng.h"
#include "split.h"
#include "timer.h"

static const char *layer_tensor_names[SPB_TENSORS_PER_LAYER] = {
    "ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w", "proj_b",
    "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b"};

/* Fills the tensor table in the documented order (docs/FORMATS.md; t may
 * be NULL to count); tp > 1 shards qkv/fc by rows and proj/fcproj by
 * columns.  The configuration's variant leaves tensors out (no position
 * table under RoPE, no norm biases under RMSNorm, no linear biases under
 * --disable-bias-linear) or adds one (the untied LM head, last), and sizes
 * qkv by the K/V heads and fc by SwiGLU's gate. */
/* Rows of a tensor on one rank: 1/tp of them when split by rows; by row
 * blocks, 1/tp of each, or of a replicated K/V block 1/G (rep = tp/G). */
static int local_rows(int rows, int split, const int *blocks, int tp, int rep)
{
    if (split == SPB_SPLIT_ROWS) return rows / tp;
    if (split != SPB_SPLIT_QKV_ROWS) return rows;
    int local = 0;
    for (int b = 0; b < 3; b++) local += blocks[b] * (b ? rep : 1) / tp;
    return local;
}

static int build_tensor_table(spb_param_tensor *t, const spb_config *c, int tp, long *num_local, long *num_global)
{
    const int L = c->num_layers, C = c->hidden_size, F = c->ffn_hidden_size, V = c->vocab_size;
    const int D = C / c->num_heads, G = c->num_query_groups > 0 ? c->num_query_groups : c->num_heads;
    const int rope = !strcmp(c->position_embedding_type, "rope"), rms = !strcmp(c->normalization, "rmsnorm");
    const int bias = !c->disable_bias_linear, gated = c->swiglu;
    int n = 0;
    long off = 0, goff = 0;
    const int split_rows[SPB_TENSORS_PER_LAYER] = {0, 0, SPB_SPLIT_QKV_ROWS, SPB_SPLIT_QKV_ROWS, SPB_SPLIT_COLS, 0,
                                                   0, 0, SPB_SPLIT_ROWS, SPB_SPLIT_ROWS, SPB_SPLIT_COLS, 0};
    /* row blocks of qkv ([q | k | v]) and of SwiGLU's fc ([gate | up]) */
    const int qkv_blocks[3] = {c->num_heads * D, G * D, G * D}, fc_blocks[3] = {F, F, 0};
    /* Fewer K/V heads than TP ranks (Megatron-SP, G | TP): rank r holds K/V
     * head r / (TP/G), the one its query heads read, so its k and v blocks
     * are D rows each: 1/G of the block instead of 1/TP. */
    const int kv_rep = tp > 1 && G < tp ? tp / G : 1;
#define ADD(nm, layer_, r, c_, split_, dec, slot_, blocks_, rep_)                                                      \
    do {                                                                                                               \
        int s_ = tp > 1 ? (split_) : SPB_REPLICATED;                                                                   \
        int lr_ = local_rows(r, s_, blocks_, tp, rep_);                                                                \
        int lc_ = s_ == SPB_SPLIT_COLS ? (c_) / tp : (c_);                                                             \
        if (t) {                                                                                                       \
            snprintf(t[n].name, sizeof t[n].name, "%s", nm);                                                           \
            t[n].offset = off, t[n].numel = (long)lr_ * lc_, t[n].rows = lr_, t[n].cols = lc_;                         \
            t[n].goffset = goff, t[n].grows = (r), t[n].gcols = (c_), t[n].split = (spb_split)s_;                      \
            t[n].layer = (layer_), t[n].decay = (dec), t[n].slot = (slot_);                                            \
            t[n].kv_replicas = s_ == SPB_SPLIT_QKV_ROWS ? (rep_) : 1;                                                  \
            const int *b_ = (blocks_);                                                                                 \
            for (int i_ = 0; i_ < 3; i_++) t[n].block_rows[i_] = b_ ? b_[i_] : 0;                                      \
        }                                                                                                              \
        off += (long)lr_ * lc_;                                                                                        \
        goff += (long)(r) * (c_);                                                                                      \
        n++;                                                                                                           \
    } while (0)
    ADD("wte", -1, V, C, SPB_REPLICATED, 1, SPB_SLOT_WTE, NULL, 1);
    if (!rope) ADD("wpe", -1, c->max_position_embeddings, C, SPB_REPLICATED, 1, SPB_SLOT_WPE, NULL, 1);
    for (int l = 0; l < L; l++) {
        const int qkv_rows = (c->num_heads + 2 * G) * D, fc_rows = gated ? 2 * F : F;
        const int rows[SPB_TENSORS_PER_LAYER] = {C, C, qkv_rows, qkv_rows, C, C, C, C, fc_rows, fc_rows, C, C};
        const int cols[SPB_TENSORS_PER_LAYER] = {1, 1, C, 1, C, 1, 1, 1, C, 1, F, 1};
        /* which of the 12 this variant has: norm biases (1, 7), linear biases (3, 5, 9, 11) */
        const int present[SPB_TENSORS_PER_LAYER] = {1, !rms, 1, bias, 1, bias, 1, !rms, 1, bias, 1, bias};
        for (int k = 0; k < SPB_TENSORS_PER_LAYER; k++) {
            if (!present[k]) continue;
            char nm[32];
            snprintf(nm, sizeof nm, "h%d.%s", l, layer_tensor_names[k]);
            /* Column splits apply to the [C, C] and [C, F] matrices only. */
            int split = split_rows[k] == SPB_SPLIT_COLS && cols[k] == 1 ? SPB_REPLICATED : split_rows[k];
            const int *blocks = k == 2 || k == 3 ? qkv_blocks : NULL;
            if ((k == 8 || k == 9) && gated) split = SPB_SPLIT_QKV_ROWS, blocks = fc_blocks;
            ADD(nm, l, rows[k], cols[k], split, cols[k] > 1, k, blocks, k == 2 || k == 3 ? kv_rep : 1);
        }
    }
    ADD("lnf_w", -1, C, 1, SPB_REPLICATED, 0, SPB_SLOT_LNF_W, NULL, 1);
    if (!rms) ADD("lnf_b", -1, C, 1, SPB_REPLICATED, 0, SPB_SLOT_LNF_B, NULL, 1);
    if (c->untie_embeddings_and_output_weights) ADD("lm_head", -1, V, C, SPB_REPLICATED, 1, SPB_SLOT_LM_HEAD, NULL, 1);
#undef ADD
    *num_local = off;
    *num_global = goff;
    return n;
}

long spb_gpt_count_params(const spb_config *c)
{
    long local = 0, global = 0;
    spb_gpt_tensor_table(c, 1, NULL, &local, &global);
    return global;
}

int spb_gpt_tensor_table(const spb_config *c, int tp, spb_param_tensor *t, long *num_local, long *num_global)
{
    return build_tensor_table(t, c, tp, num_local, num_global);
}

int spb_gpt_config_tp(const spb_config *cfg)
{
    const spb_strategy *s = spb_strategy_by_name(cfg->strategy);
    /* The hook reads the group sizes only. */
    spb_grid shape = {.sp_size = cfg->sp_degree, .dp_size = 1, .world_size = cfg->sp_degree};
    return s && s->tp_degree ? s->tp_degree(&shape) : 1;
}

/* The views of tensor k: one of the globals or a field of a layer's
 * parameter struct (12 pointers in the GPT table order), by its slot. */
_Static_assert(sizeof(spb_layer_params) == SPB_TENSORS_PER_LAYER * sizeof(float *), "layer views in table order");
static float **view_of(spb_gpt *g, int k, int grad)
{
    const spb_param_tensor *t = &g->tensors[k];
    switch (t->slot) {
    case SPB_SLOT_WTE: return grad ? &g->dwte : &g->wte;
    case SPB_SLOT_WPE: return grad ? &g->dwpe : &g->wpe;
    case SPB_SLOT_LNF_W: return grad ? &g->dlnf_w : &g->lnf_w;
    case SPB_SLOT_LNF_B: return grad ? &g->dlnf_b : &g->lnf_b;
    case SPB_SLOT_LM_HEAD: return grad ? &g->dlm_head : &g->lm_head;
    default: return (float **)(grad ? &g->dlayer[t->layer] : &g->layer[t->layer]) + t->slot;
    }
}

void spb_gpt_point_tensor(spb_gpt *g, int k, float *param, float *grad)
{
    if (param) *view_of(g, k, 0) = param;
    if (grad) *view_of(g, k, 1) = grad;
}

int spb_gpt_unit_tensors(const spb_gpt *g, int unit, int *ks)
{
    SPB_CHECK(unit == SPB_UNIT_GLOBALS || (unit >= 0 && unit < g->L));
    int n = 0;
    for (int k = 0; k < g->num_tensors; k++)
        if (g->tensors[k].layer == (unit == SPB_UNIT_GLOBALS ? -1 : unit)) {
            SPB_CHECK(n < SPB_TENSORS_PER_LAYER);
            ks[n++] = k;
        }
    return n;
}

long spb_gpt_global_index(const spb_gpt *g, const spb_param_tensor *t, long i)
{
    long r = i / t->cols, c = i % t->cols;
    switch (t->split) {
    case SPB_REPLICATED: break;
    case SPB_SPLIT_ROWS: r += (long)g->tp_rank * t->rows; break;
    case SPB_SPLIT_QKV_ROWS: { /* local rows: this rank's 1/TP of each row block, in block order; K/V
                                  blocks with replicas: 1/G of them, K/V head tp_rank / replicas */
        long first = 0; /* the block's first global row */
        for (int b = 0; b < 3 && t->block_rows[b]; b++) {
            int rep = b ? t->kv_replicas : 1;
            long per = (long)t->block_rows[b] * rep / g->tp;
            if (r < per) {
                r = first + (long)(g->tp_rank / rep) * per + r;
                break;
            }
            r -= per, first += t->block_rows[b];
        }
        break;
    }
    case SPB_SPLIT_COLS: c += (long)g->tp_rank * t->cols; break;
    }
    return t->goffset + r * t->gcols + c;
}

void spb_gpt_gather_global(const spb_gpt *g, const float *local, float *global)
{
    float *all = g->any_split ? SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)g->num_params * g->tp)) : NULL;
    /* One allgather of the whole local vector; shard k of rank j sits at
     * all[j * num_params + offset]. */
    if (all) SPB_MPI_CHECK(MPI_Allgather(local, (int)g->num_params, MPI_FLOAT, all, (int)g->num_params, MPI_FLOAT,
                                          g->grid->sp_comm));
    spb_gpt tmp = *g;
    for (int k = 0; k < g->num_tensors; k++) {
        const spb_param_tensor *t = &g->tensors[k];
        int owners = t->split == SPB_REPLICATED ? 1 : g->tp;
        for (int j = 0; j < owners; j++) {
            tmp.tp_rank = t->split == SPB_REPLICATED ? 0 : j;
            const float *src = t->split == SPB_REPLICATED ? local : all + (long)j * g->num_params;
            for (long i = 0; i < t->numel; i++) global[spb_gpt_global_index(&tmp, t, i)] = src[t->offset + i];
        }
    }
    free(all);
}

void spb_gpt_scatter_global(const spb_gpt *g, const float *global, float *local)
{
    for (int k = 0; k < g->num_tensors; k++) {
        const spb_param_tensor *t = &g->tensors[k];
        for (long i = 0; i < t->numel; i++) local[t->offset + i] = global[spb_gpt_global_index(g, t, i)];
    }
}

/* Points every view at its tensor in base (params or grads). */
static void set_views(spb_gpt *g, float *base, int grad)
{
    for (int k = 0; k < g->num_tensors; k++) *view_of(g, k, grad) = base + g->tensors[k].offset;
}

static float *act(const spb_gpt *g, long n) { return g->be->alloc(SPB_MEM_ACTIVATIONS, n); }
static float *scratch(const spb_gpt *g, long n) { return g->be->alloc(SPB_MEM_WORKSPACE, n); }

static spb_attn_ctx region_ctx(spb_gpt *g, int layer, spb_comm_phase phase)
{
    return (spb_attn_ctx){.cfg = &g->cfg, .grid = g->grid, .backend = g->attn, .device = g->be, .batch = g->B, .heads = g->Hl,
                          .kv_heads = (g->qkv_width / g->D - g->Hl) / 2, .head_dim = g->D, .tokens = g->Ttp, .positions = g->positions_tp,
                          .seq_length = g->seq_length, .causal = g->causal, .layer = layer, .phase = phase,
                          .flops = &g->attn_flops};
}

spb_gpt *spb_gpt_create(const spb_config *cfg, const spb_grid *grid)
{
    spb_gpt *g = SPB_CHECK_PTR(calloc(1, sizeof *g));
    g->cfg = *cfg;
    g->L = cfg->num_layers;
    g->C = cfg->hidden_size;
    g->H = cfg->num_heads;
    g->D = g->C / g->H;
    g->F = cfg->ffn_hidden_size;
    g->V = cfg->vocab_size;
    g->maxpos = cfg->max_position_embeddings;
    g->seq_length = cfg->seq_length;
    g->causal = cfg->causal;
    g->init_std = cfg->init_std;
    g->B = cfg->micro_batch_size;
    /* This rank's share of the sequence: N/P, or with P not dividing N the
     * uneven share of common/runtime/split.h (config.c allowed it for the
     * strategies that take it; their local_positions lay it out). */
    g->T = (int)spb_split_count(cfg->seq_length, grid->sp_size, grid->sp_rank);
    g->grid = grid;
    const spb_strategy *layout = spb_strategy_by_name(cfg->strategy);
    if (layout && layout->local_tokens) g->T = layout->local_tokens(grid, cfg); /* e.g. the hybrid's nested shares */
    g->be = spb_backend_for(cfg->device, cfg->precision);
    SPB_CHECK(g->be);
    if (g->be->configure) g->be->configure(cfg);
    /* Collectives on device buffers go through host memory unless the
     * buffers are host memory already. */
    spb_comm_set_staging(g->be->host_memory ? NULL : &g->be->staging);
    spb_timer_set_clock(g->be->clock);
    g->strategy = spb_strategy_by_name(cfg->strategy);
    g->attn = g->be->attention(cfg->attention);
    SPB_CHECK(g->strategy && g->attn);
    g->tp = g->strategy->tp_degree ? g->strategy->tp_degree(grid) : 1;
    g->tp_rank = g->tp > 1 ? grid->sp_rank : 0;
    SPB_CHECK(g->H % g->tp == 0 && g->F % g->tp == 0);
    g->Hl = g->H / g->tp;
    g->Ca = g->Hl * g->D;
    g->Fl = g->F / g->tp;
    /* A TP region (Megatron-SP, TP = P) holds the whole sequence: every
     * rank's share, equal or not (split.h). */
    SPB_CHECK(g->tp == 1 || g->tp == grid->sp_size);
    g->Ttp = g->tp > 1 ? cfg->seq_length : g->T;
    g->head_blocks = g->strategy->head_blocks ? g->strategy->head_blocks(grid) : 1;
    /* Equal head blocks, or without grouped-query attention the uneven
     * shares of split.h (Ulysses with H mod P != 0: its validate allowed it). */
    SPB_CHECK(g->Hl >= g->head_blocks);
    /* Grouped-query attention: each head block gets the K/V heads its query
     * heads read; fewer K/V heads than blocks replicate one per block (the
     * same weight rows: the blocks' weight gradients add up in
     * qkv_backward).  config.c and the strategies' validate made these
     * divide. */
    g->G = cfg->num_query_groups > 0 ? cfg->num_query_groups : g->H;
    /* Tensor parallelism over more ranks than K/V heads (Megatron-SP, G |
     * TP): each K/V head's weight rows are replicated on TP/G consecutive
     * ranks, whose query heads all read it (kv_replicas.h sums their
     * gradients). */
    SPB_CHECK(g->G >= g->tp ? g->G % g->tp == 0 : g->tp % g->G == 0);
    g->kv_replicas = g->G >= g->tp ? 1 : g->tp / g->G;
    g->Gl = g->G >= g->tp ? g->G / g->tp : 1;
    g->kv_comm = MPI_COMM_NULL;
    if (g->kv_replicas > 1)
        SPB_MPI_CHECK(MPI_Comm_split(grid->sp_comm, g->tp_rank / g->kv_replicas, g->tp_rank, &g->kv_comm));
    g->kv_block = g->Gl >= g->head_blocks ? g->Gl / g->head_blocks : 1;
    if (g->Gl == g->Hl) { /* K/V heads = query heads: blocks of any share */
        g->qkv_width = 3 * g->Hl * g->D;
    } else {
        SPB_CHECK(g->Hl % g->head_blocks == 0);
        SPB_CHECK(g->Gl >= g->head_blocks ? g->Gl % g->head_blocks == 0 : g->head_blocks % g->Gl == 0);
        g->qkv_width = g->head_blocks * (g->Hl / g->head_blocks + 2 * g->kv_block) * g->D;
    }
    g->rope = cfg->rope, g->rmsnorm = cfg->rmsnorm, g->swiglu = cfg->swiglu;
    g->untied = cfg->untie_embeddings_and_output_weights, g->bias = !cfg->disable_bias_linear;
    g->rotary_base = cfg->rotary_base;
    SPB_CHECK(!(g->rope || g->rmsnorm || g->swiglu) ||
              (g->be->rope_apply && g->be->rmsnorm_forward && g->be->swiglu_forward)); /* config.c refused */

    g->positions = SPB_CHECK_PTR(malloc(sizeof(long) * (size_t)g->T));
    if (g->strategy->local_positions) {
        g->strategy->local_positions(grid, cfg, g->positions);
    } else {
        long first = spb_split_offset(cfg->seq_length, grid->sp_size, grid->sp_rank);
        for (int t = 0; t < g->T; t++) g->positions[t] = first + t;
    }
    /* A TP region gathers the SP group's tokens in rank order: positions of
     * rank j's block follow rank j's layout, which is contiguous here. */
    g->positions_tp = SPB_CHECK_PTR(malloc(sizeof(long) * (size_t)g->Ttp));
    for (int t = 0; t < g->Ttp; t++)
        g->positions_tp[t] = g->tp > 1 ? t : g->positions[t];

    g->num_tensors = build_tensor_table(NULL, cfg, g->tp, &g->num_params, &g->num_global_params);
    g->tensors = SPB_CHECK_PTR(calloc((size_t)g->num_tensors, sizeof *g->tensors));
    build_tensor_table(g->tensors, cfg, g->tp, &g->num_params, &g->num_global_params);
    for (int k = 0; k < g->num_tensors; k++) g->any_split |= g->tensors[k].split != SPB_REPLICATED;
    /* ZeRO-3 keeps parameter slices and ZeRO-2/3 gradient slices (common/
     * zero.c); their hooks point the views at gathered or per-unit buffers. */
    g->layer = SPB_CHECK_PTR(calloc((size_t)g->L, sizeof *g->layer));
    g->dlayer = SPB_CHECK_PTR(calloc((size_t)g->L, sizeof *g->dlayer));
    if (cfg->zero_stage < 3) {
        g->params = g->be->alloc(SPB_MEM_PARAMS, g->num_params);
        set_views(g, g->params, 0);
    }
    if (cfg->zero_stage < 2) {
        g->grads = g->be->alloc(SPB_MEM_GRADS, g->num_params);
        set_views(g, g->grads, 1);
    }

    long BT = (long)g->B * g->T, BR = (long)g->B * g->Ttp, C = g->C;
    spb_attn_ctx probe = region_ctx(g, 0, SPB_PHASE_FORWARD);
    long saved_n = (long)g->strategy->attn_saved_floats(&probe);
    g->inputs = g->be->alloc_ints(SPB_MEM_ACTIVATIONS, BT);
    g->targets = g->be->alloc_ints(SPB_MEM_ACTIVATIONS, BT);
    g->x = SPB_CHECK_PTR(calloc((size_t)g->L + 1, sizeof *g->x));
    g->acts = SPB_CHECK_PTR(calloc((size_t)g->L, sizeof *g->acts));
    for (int l = 0; l <= g->L; l++) g->x[l] = act(g, BT * C);
    g->checkpoint = cfg->checkpoint_activations;
    for (int l = 0; l < (g->checkpoint ? 1 : g->L); l++) {
        spb_layer_acts *a = &g->acts[l];
        a->ln1_out = act(g, BT * C);
        a->ln1_mean = act(g, BT);
        a->ln1_rstd = act(g, BT);
        a->qkv = act(g, BR * g->qkv_width);
        a->atto = act(g, BR * g->Ca);
        a->attn_saved = act(g, saved_n);
        a->res_mid = act(g, BT * C);
        a->ln2_out = act(g, BT * C);
        a->ln2_mean = act(g, BT);
        a->ln2_rstd = act(g, BT);
        a->fc_pre = act(g, BR * g->Fl * (g->swiglu ? 2 : 1));
        a->fc_act = act(g, BR * g->Fl);
    }
    g->lnf_out = act(g, BT * C);
    g->lnf_mean = act(g, BT);
    g->lnf_rstd = act(g, BT);
    g->probs = act(g, BT * g->V);
    g->dx = scratch(g, BT * C);
    g->dtmp = scratch(g, BR * C);
    g->datto = scratch(g, BR * g->Ca);
    g->dqkv = scratch(g, BR * g->qkv_width);
    g->dfc = scratch(g, BR * g->Fl * (g->swiglu ? 2 : 1));
    g->dact = g->swiglu ? scratch(g, BR * g->Fl) : g->dfc;
    if (g->checkpoint) g->recompute_out = scratch(g, BT * C);
    if (g->tp > 1) {
        g->region_in = scratch(g, BR * C);
        g->region_out = scratch(g, BR * C);
    }
    return g;
}

void spb_gpt_destroy(spb_gpt *g)
{
    if (!g) return;
    for (int l = 0; l < (g->checkpoint ? 1 : g->L); l++) {
        spb_layer_acts *a = &g->acts[l];
        float *bufs[] = {a->ln1_out, a->ln1_mean, a->ln1_rstd, a->qkv, a->atto, a->attn_saved,
                         a->res_mid, a->ln2_out, a->ln2_mean, a->ln2_rstd, a->fc_pre, a->fc_act};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) g->be->free(bufs[k]);
    }
    for (int l = 0; l <= g->L; l++) g->be->free(g->x[l]);
    float *bufs[] = {g->lnf_out, g->lnf_mean, g->lnf_rstd, g->probs, g->dx, g->dtmp, g->datto, g->dqkv, g->dfc,
                     g->region_in, g->region_out, g->recompute_out, g->params, g->grads};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) g->be->free(bufs[k]);
    if (g->swiglu) g->be->free(g->dact); /* its own buffer only under SwiGLU */
    g->be->free(g->inputs);
    g->be->free(g->targets);
    free(g->positions);
    free(g->positions_tp);
    free(g->x);
    free(g->acts);
    free(g->layer);
    free(g->dlayer);
    free(g->tensors);
    if (g->kv_comm != MPI_COMM_NULL) MPI_Comm_free(&g->kv_comm);
    free(g);
}

void spb_gpt_init_tensor(const spb_gpt *g, int t, uint64_t seed, float *p)
{
    const double std = g->init_std, proj_std = g->init_std / sqrt(2.0 * g->L);
    const spb_param_tensor *pt = &g->tensors[t];
    const char *kind = strchr(pt->name, '.') ? strchr(pt->name, '.') + 1 : pt->name;
    int is_ln_weight = !strcmp(kind, "ln1_w") || !strcmp(kind, "ln2_w") || !strcmp(kind, "lnf_w");
    if (is_ln_weight) {
        for (long i = 0; i < pt->numel; i++) p[i] = 1.0f;
    } else if (pt->cols == 1) {
        memset(p, 0, sizeof(float) * (size_t)pt->numel); /* biases, LayerNorm biases */
    } else {
        double s = (!strcmp(kind, "proj_w") || !strcmp(kind, "fcproj_w")) ? proj_std : std;
        /* Keyed by the element's place in the global tensor. */
        for (long i = 0; i < pt->numel; i++)
            p[i] = (float)(s * spb_rng_normal(seed, (uint64_t)t,
                                              (uint64_t)(spb_gpt_global_index(g, pt, i) - pt->goffset)));
    }
}

void spb_gpt_init_params(spb_gpt *g, uint64_t seed)
{
    if (!g->params) return; /* ZeRO-3: the slices' owners initialise them */
    if (g->be->host_memory) {
        for (int t = 0; t < g->num_tensors; t++) spb_gpt_init_tensor(g, t, seed, g->params + g->tensors[t].offset);
        return;
    }
    /* Device memory: each tensor made on the host, then copied over. */
    long largest = 0;
    for (int t = 0; t < g->num_tensors; t++) largest = g->tensors[t].numel > largest ? g->tensors[t].numel : largest;
    float *host = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)largest));
    for (int t = 0; t < g->num_tensors; t++) {
        spb_gpt_init_tensor(g, t, seed, host);
        spb_backend_to_device(g->be, g->params + g->tensors[t].offset, host, g->tensors[t].numel);
    }
    free(host);
}

void spb_gpt_zero_grads(spb_gpt *g)
{
    if (g->grads) g->be->zero(g->grads, g->num_params);
}

static void unit_before(spb_gpt *g, int unit, spb_comm_phase phase)
{
    if (g->hooks.before) g->hooks.before(g->hooks.ctx, g, unit, phase);
}

static void unit_after(spb_gpt *g, int unit, spb_comm_phase phase)
{
    if (g->hooks.after) g->hooks.after(g->hooks.ctx, g, unit, phase);
}

/* Local [B*T][C] -> region [B*Ttp][C] (the same buffer when TP = 1). */
static const float *enter_region(spb_gpt *g, int layer, const float *local, spb_comm_phase phase)
{
    if (g->tp == 1) return local;
    spb_attn_ctx ctx = region_ctx(g, layer, phase);
    g->strategy->enter_tp(&ctx, local, g->region_in);
    return g->region_in;
}

/* The QKV product and the output projection, in head blocks when the
 * strategy asks (strategy.h, head_blocks): block j holds its query heads
 * [j·qb, (j+1)·qb) and the K/V heads they read, kv_block of them from K/V
 * head j·Gl/G_b (replicated over blocks when Gl < G_b), each from its rows
 * of qkv_w ([q: Hl·D | k: Gl·D | v: Gl·D] rows); the projection sums the
 * blocks' products with the matching column blocks of proj_w.  One block
 * is one plain product: its layout is the weight's row order. */
typedef struct qkv_part {
    long w0;       /* first weight row */
    int rows;      /* rows (= output columns) */
    long dst;      /* offset in qkv of its first column */
} qkv_part;

/* Head block j: its query heads [q0, q0 + q), its K/V heads [kv0, kv0 +
 * kv), its floats per token (width) and where it starts in qkv and atto.
 * Blocks are equal (Hl / G_b heads) except without grouped-query attention
 * under uneven head shares (split.h: the first Hl mod G_b blocks one head
 * more; K/V heads = query heads). */
typedef struct head_block {
    int q, q0, kv, kv0;
    long width, qkv_at, o_at;
} head_block;

static head_block head_block_of(const spb_gpt *g, int j)
{
    const int nb = g->head_blocks, D = g->D;
    const long rows = (long)g->B * g->Ttp;
    head_block b;
    b.q = (int)spb_split_count(g->Hl, nb, j), b.q0 = (int)spb_split_offset(g->Hl, nb, j);
    if (g->Gl == g->Hl)
        b.kv = b.q, b.kv0 = b.q0;
    else
        b.kv = g->kv_block, b.kv0 = (int)((long)j * g->Gl / nb);
    b.width = (long)(b.q + 2 * b.kv) * D;
    b.qkv_at = rows * (g->Gl == g->Hl ? 3L * b.q0 * D : j * b.width); /* the blocks before: equal, or 3 rows per head */
    b.o_at = rows * b.q0 * D;
    return b;
}

static qkv_part qkv_part_of(const spb_gpt *g, int j, int s)
{
    const int D = g->D;
    head_block b = head_block_of(g, j);
    if (s == 0) return (qkv_part){(long)b.q0 * D, b.q * D, b.qkv_at};
    long k_rows = (long)g->Hl * D + (s == 2 ? (long)g->Gl * D : 0);
    return (qkv_part){k_rows + (long)b.kv0 * D, b.kv * D, b.qkv_at + (long)(b.q + (s == 2 ? b.kv : 0)) * D};
}

/* RoPE on the Q and K heads of every block (they are adjacent in each
 * token's row), at the region tokens' global positions; inverse: the
 * backward, on dQ and dK. */
static void rope_blocks(spb_gpt *g, float *qkv, int inverse)
{
    if (!g->rope) return;
    for (int j = 0; j < g->head_blocks; j++) {
        head_block b = head_block_of(g, j);
        g->be->rope_apply(qkv + b.qkv_at, g->positions_tp, g->B, g->Ttp, (int)b.width, (long)g->Ttp * b.width,
                          b.q + b.kv, g->D, g->rotary_base, inverse);
    }
}

static void qkv_forward(spb_gpt *g, float *qkv, const float *h, const spb_layer_params *p)
{
    const int G = g->head_blocks, BR = g->B * g->Ttp, C = g->C;
    if (G == 1) {
        g->be->matmul_forward(qkv, h, p->qkv_w, p->qkv_b, BR, C, g->qkv_width);
    } else {
        for (int j = 0; j < G; j++)
            for (int s = 0; s < 3; s++) {
                qkv_part q = qkv_part_of(g, j, s);
                const int bw = (int)head_block_of(g, j).width;
                g->be->matmul_forward_ld(qkv + q.dst, bw, h, C, p->qkv_w + q.w0 * C, C, p->qkv_b ? p->qkv_b + q.w0 : NULL,
                                         BR, C, q.rows, 0);
            }
    }
    rope_blocks(g, qkv, 0);
}

/* dh = d(qkv) · W (overwritten), dW and db accumulated (replicated K/V
 * blocks add into the same rows).  dqkv is after the inverse RoPE. */
static void qkv_backward(spb_gpt *g, float *dh, spb_layer_params *dp, const float *dqkv, const float *h,
                         const spb_layer_params *p)
{
    const int G = g->head_blocks, BR = g->B * g->Ttp, C = g->C;
    if (G == 1) {
        g->be->matmul_backward(dh, dp->qkv_w, dp->qkv_b, dqkv, h, p->qkv_w, BR, C, g->qkv_width, 0);
        return;
    }
    for (int j = 0; j < G; j++)
        for (int s = 0; s < 3; s++) {
            qkv_part q = qkv_part_of(g, j, s);
            const int bw = (int)head_block_of(g, j).width;
            g->be->matmul_backward_ld(dh, C, dp->qkv_w + q.w0 * C, C, dp->qkv_b ? dp->qkv_b + q.w0 : NULL,
                                      dqkv + q.dst, bw, h, C, p->qkv_w + q.w0 * C, C, BR, C, q.rows, j > 0 || s > 0);
        }
}

static void proj_forward(spb_gpt *g, float *out, const float *atto, const spb_layer_params *p)
{
    const int G = g->head_blocks, BR = g->B * g->Ttp, C = g->C;
    for (int j = 0; j < G; j++) {
        head_block b = head_block_of(g, j);
        const int row = b.q * g->D;
        g->be->matmul_forward_ld(out, C, atto + b.o_at, row, p->proj_w + (long)b.q0 * g->D, g->Ca, NULL, BR, row, C,
                                 j > 0);
    }
}

static void proj_backward(spb_gpt *g, float *datto, spb_layer_params *dp, const float *dy, const float *atto,
                          const spb_layer_params *p)
{
    const int G = g->head_blocks, BR = g->B * g->Ttp, C = g->C;
    for (int j = 0; j < G; j++) {
        head_block b = head_block_of(g, j);
        const int row = b.q * g->D;
        const long col = (long)b.q0 * g->D;
        g->be->matmul_backward_ld(datto + b.o_at, row, dp->proj_w + col, g->Ca, NULL, dy, C, atto + b.o_at, row,
                                  p->proj_w + col, g->Ca, BR, row, C, 0);
    }
}

/* LayerNorm or RMSNorm (mean and b unused by RMSNorm; b NULL there). */
static void norm_forward(spb_gpt *g, float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int rows)
{
    if (g->rmsnorm)
        g->be->rmsnorm_forward(out, rstd, inp, w, rows, g->C);
    else
        g->be->layernorm_forward(out, mean, rstd, inp, w, b, rows, g->C);
}

static void norm_backward(spb_gpt *g, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, const float *mean, const float *rstd, int rows)
{
    if (g->rmsnorm)
        g->be->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, rows, g->C);
    else
        g->be->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, rows, g->C);
}

/* GELU, or SwiGLU on fc_pre's [gate | up] halves of each row. */
static void activation_forward(spb_gpt *g, float *act_out, const float *pre, int rows)
{
    if (g->swiglu)
        g->be->swiglu_forward(act_out, pre, rows, g->Fl);
    else
        g->be->gelu_forward(act_out, pre, (long)rows * g->Fl);
}

/* d(act) -> d(pre) in dfc: GELU in place (dact = dfc); SwiGLU's d(pre)
 * is twice as wide, so its d(act) is in a buffer of its own (g->dact). */
static void activation_backward(spb_gpt *g, float *dfc, const float *dact, const float *pre, int rows)
{
    if (g->swiglu)
        g->be->swiglu_backward(dfc, pre, dact, rows, g->Fl);
    else
        g->be->gelu_backward(dfc, pre, dact, (long)rows * g->Fl);
}

static void add_bias(spb_gpt *g, float *x, const float *b, long rows)
{
    if (b) g->be->add_bias_rows(x, b, rows, g->C);
}

static void bias_grad(spb_gpt *g, float *db, const float *dy, long rows)
{
    if (db) g->be->bias_grad_rows(db, dy, rows, g->C);
}

/* Row-parallel output: the product is written to `out` directly when TP = 1;
 * with TP > 1 it goes to region_out as partial sums and exit_tp reduces it
 * into `out`. */
static float *region_product_target(spb_gpt *g, float *out) { return g->tp > 1 ? g->region_out : out; }

static void exit_region(spb_gpt *g, int layer, float *out, spb_comm_phase phase)
{
    if (g->tp == 1) return;
    spb_attn_ctx ctx = region_ctx(g, layer, phase);
    g->strategy->exit_tp(&ctx, g->region_out, out);
}

/* Layer l from its input x to its output x_out, keeping what its backward
 * needs in `a`; phase is forward, or recompute under activation
 * checkpointing (its communication is recorded under that phase). */
static void layer_forward(spb_gpt *g, int l, spb_layer_acts *a, const float *x, float *x_out, spb_comm_phase phase)
{
    const int BT = g->B * g->T, BR = g->B * g->Ttp, C = g->C;
    const spb_layer_params *p = &g->layer[l];
    /* attention block */
    norm_forward(g, a->ln1_out, a->ln1_mean, a->ln1_rstd, x, p->ln1_w, p->ln1_b, BT);
    const float *h = enter_region(g, l, a->ln1_out, phase);
    qkv_forward(g, a->qkv, h, p);
    spb_attn_ctx ctx = region_ctx(g, l, phase);
    g->strategy->attention_forward(&ctx, a->qkv, a->atto, a->attn_saved);
    proj_forward(g, region_product_target(g, a->res_mid), a->atto, p);
    exit_region(g, l, a->res_mid, phase);
    add_bias(g, a->res_mid, p->proj_b, BT);
    g->be->add_inplace(a->res_mid, x, (long)BT * C);
    /* MLP block */
    norm_forward(g, a->ln2_out, a->ln2_mean, a->ln2_rstd, a->res_mid, p->ln2_w, p->ln2_b, BT);
    h = enter_region(g, l, a->ln2_out, phase);
    g->be->matmul_forward(a->fc_pre, h, p->fc_w, p->fc_b, BR, C, g->Fl * (g->swiglu ? 2 : 1));
    activation_forward(g, a->fc_act, a->fc_pre, BR);
    g->be->matmul_forward(region_product_target(g, x_out), a->fc_act, p->fcproj_w, NULL, BR, g->Fl, C);
    exit_region(g, l, x_out, phase);
    add_bias(g, x_out, p->fcproj_b, BT);
    g->be->add_inplace(x_out, a->res_mid, (long)BT * C);
}

/* Under activation checkpointing every layer shares one set of activations
 * (acts[0]); only the layer inputs x[l] are kept. */
static spb_layer_acts *layer_acts(spb_gpt *g, int l) { return &g->acts[g->checkpoint ? 0 : l]; }

double spb_gpt_forward(spb_gpt *g, const int *inputs, const int *targets)
{
    spb_timer_region timed = spb_timer_begin(SPB_T_FORWARD);
    const int BT = g->B * g->T, C = g->C;
    g->be->ints_to_device(g->inputs, inputs, BT);
    g->be->ints_to_device(g->targets, targets, BT);
    unit_before(g, SPB_UNIT_GLOBALS, SPB_PHASE_FORWARD);
    g->be->embedding_forward(g->x[0], g->inputs, g->wte, g->wpe, g->positions, BT, g->T, C);
    for (int l = 0; l < g->L; l++) {
        unit_before(g, l, SPB_PHASE_FORWARD);
        layer_forward(g, l, layer_acts(g, l), g->x[l], g->x[l + 1], SPB_PHASE_FORWARD);
        unit_after(g, l, SPB_PHASE_FORWARD);
    }
    norm_forward(g, g->lnf_out, g->lnf_mean, g->lnf_rstd, g->x[g->L], g->lnf_w, g->lnf_b, BT);
    /* the LM head: the token embedding (tied) or its own matrix */
    g->be->matmul_forward(g->probs, g->lnf_out, g->untied ? g->lm_head : g->wte, NULL, BT, C, g->V);
    double loss_sum = g->be->softmax_xent_forward(g->probs, g->targets, BT, g->V);
    unit_after(g, SPB_UNIT_GLOBALS, SPB_PHASE_FORWARD);
    spb_timer_end(timed);
    return loss_sum;
}

/* d(local output rows) -> d(region rows) for the row-parallel product. */
static const float *exit_region_backward(spb_gpt *g, int layer, const float *dlocal)
{
    if (g->tp == 1) return dlocal;
    spb_attn_ctx ctx = region_ctx(g, layer, SPB_PHASE_BACKWARD);
    g->strategy->exit_tp_backward(&ctx, dlocal, g->region_out);
    return g->region_out;
}

/* d(region input rows) -> d(local rows) (into dlocal when TP > 1). */
static const float *enter_region_backward(spb_gpt *g, int layer, const float *dregion, float *dlocal)
{
    if (g->tp == 1) return dregion;
    spb_attn_ctx ctx = region_ctx(g, layer, SPB_PHASE_BACKWARD);
    g->strategy->enter_tp_backward(&ctx, dregion, dlocal);
    return dlocal;
}

void spb_gpt_backward(spb_gpt *g, float loss_scale)
{
    spb_timer_region timed = spb_timer_begin(SPB_T_BACKWARD);
    const int BT = g->B * g->T, BR = g->B * g->Ttp, C = g->C;
    unit_before(g, SPB_UNIT_GLOBALS, SPB_PHASE_BACKWARD);
    g->be->softmax_xent_backward(g->probs, g->targets, BT, g->V, loss_scale);
    /* LM head: dlnf_out = dlogits · W, dW += dlogitsᵀ · lnf_out, W = wte (tied) or lm_head */
    g->be->matmul_backward(g->dtmp, g->untied ? g->dlm_head : g->dwte, NULL, g->probs, g->lnf_out,
                           g->untied ? g->lm_head : g->wte, BT, C, g->V, 0);
    g->be->zero(g->dx, (long)BT * C);
    norm_backward(g, g->dx, g->dlnf_w, g->dlnf_b, g->dtmp, g->x[g->L], g->lnf_w, g->lnf_mean, g->lnf_rstd, BT);
    /* Local rows of a region-input gradient when TP > 1.  region_in is free
     * by then: the gathered LN output it held has been used. */
    float *dlocal = g->region_in;
    /* g->dx holds d loss / d x[l+1] on entry to each layer, d x[l] on exit. */
    for (int l = g->L - 1; l >= 0; l--) {
        unit_before(g, l, SPB_PHASE_BACKWARD);
        const spb_layer_params *p = &g->layer[l];
        spb_layer_params *dp = &g->dlayer[l];
        spb_layer_acts *a = layer_acts(g, l);
        /* The output goes to scratch: x[l+1] holds it already, and the
         * recomputation gives the same bits. */
        if (g->checkpoint) layer_forward(g, l, a, g->x[l], g->recompute_out, SPB_PHASE_RECOMPUTE);
        /* MLP block */
        bias_grad(g, dp->fcproj_b, g->dx, BT);
        const float *dy = exit_region_backward(g, l, g->dx);
        g->be->matmul_backward(g->dact, dp->fcproj_w, NULL, dy, a->fc_act, p->fcproj_w, BR, g->Fl, C, 0);
        activation_backward(g, g->dfc, g->dact, a->fc_pre, BR);
        /* Megatron-SP keeps only local LN outputs and gathers them again here. */
        const float *h = enter_region(g, l, a->ln2_out, SPB_PHASE_BACKWARD);
        g->be->matmul_backward(g->dtmp, dp->fc_w, dp->fc_b, g->dfc, h, p->fc_w, BR, C, g->Fl * (g->swiglu ? 2 : 1), 0);
        const float *dln = enter_region_backward(g, l, g->dtmp, dlocal);
        norm_backward(g, g->dx, dp->ln2_w, dp->ln2_b, dln, a->res_mid, p->ln2_w, a->ln2_mean, a->ln2_rstd, BT);
        /* attention block */
        bias_grad(g, dp->proj_b, g->dx, BT);
        dy = exit_region_backward(g, l, g->dx);
        proj_backward(g, g->datto, dp, dy, a->atto, p);
        spb_attn_ctx ctx = region_ctx(g, l, SPB_PHASE_BACKWARD);
        g->strategy->attention_backward(&ctx, a->qkv, a->atto, a->attn_saved, g->datto, g->dqkv);
        rope_blocks(g, g->dqkv, 1); /* d(rotated) -> d(unrotated): the rotation's transpose */
        h = enter_region(g, l, a->ln1_out, SPB_PHASE_BACKWARD);
        qkv_backward(g, g->dtmp, dp, g->dqkv, h, p);
        dln = enter_region_backward(g, l, g->dtmp, dlocal);
        norm_backward(g, g->dx, dp->ln1_w, dp->ln1_b, dln, g->x[l], p->ln1_w, a->ln1_mean, a->ln1_rstd, BT);
        unit_after(g, l, SPB_PHASE_BACKWARD);
    }
    g->be->embedding_backward(g->dwte, g->dwpe, g->dx, g->inputs, g->positions, BT, g->T, C);
    unit_after(g, SPB_UNIT_GLOBALS, SPB_PHASE_BACKWARD);
    spb_timer_end(timed);
}
