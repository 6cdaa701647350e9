/* The shared GPT core (docs/FORMATS.md has the model and parameter order):
 * forward and backward over this rank's tokens of each sequence, on the CPU
 * in fp32.  Attention, the tensor-parallel region boundaries and the token
 * layout come from the strategy; the core never asks which strategy it runs.
 *
 * Parameters are held as this rank's shards: with tensor-parallel degree
 * TP > 1 (Megatron-style), qkv and fc are split by output rows (heads, ffn
 * columns) and proj and fcproj by input columns; everything else is
 * replicated.  Each local element knows its index in the global tensor, so
 * initialisation, checkpoints and dumps are the same for every split. */
#ifndef SPB_GPT_H
#define SPB_GPT_H

#include <stdint.h>

#include "strategy.h"
#include "attention.h"
#include "config.h"
#include "grid.h"

/* At most this many tensors per layer (GPT's 12; --disable-bias-linear and
 * --normalization rmsnorm leave some out) and per unit (the globals: at
 * most wte, wpe, lnf_w, lnf_b, lm_head). */
enum { SPB_TENSORS_PER_LAYER = 12 };

typedef enum spb_split {
    SPB_REPLICATED = 0,
    SPB_SPLIT_QKV_ROWS, /* [out, in] in row blocks (q, k, v; or SwiGLU's gate, up):
                           this rank's share of each block (block_rows) */
    SPB_SPLIT_ROWS,     /* [out, in]: a contiguous block of output rows */
    SPB_SPLIT_COLS,     /* [out, in]: a contiguous block of input columns */
} spb_split;

typedef struct spb_param_tensor {
    char name[32];
    long offset;      /* into this rank's flat parameter vector */
    long numel;       /* local elements */
    int rows, cols;   /* local shape; cols = 1 for vectors */
    long goffset;     /* into the global flat vector (docs/FORMATS.md) */
    int grows, gcols; /* global shape */
    spb_split split;
    int layer;        /* -1 outside the blocks */
    int decay;        /* AdamW weight decay applies (matrices, embeddings) */
    int slot;         /* its view: a field of spb_layer_params (0-11), or SPB_SLOT_* */
    int block_rows[3]; /* SPB_SPLIT_QKV_ROWS: global rows of each block (0: none) */
    /* SPB_SPLIT_QKV_ROWS of qkv with fewer K/V heads than TP ranks
     * (Megatron-SP, G < TP): each K/V head's rows (blocks 1 and 2) sit on
     * kv_replicas = TP/G consecutive TP ranks, whose gradients are summed
     * over those ranks (kv_replicas.h).  1: no replicas. */
    int kv_replicas;
} spb_param_tensor;

/* The views of the tensors outside the layers. */
enum { SPB_SLOT_WTE = 100, SPB_SLOT_WPE, SPB_SLOT_LNF_W, SPB_SLOT_LNF_B, SPB_SLOT_LM_HEAD };

/* A tensor the configuration leaves out (a bias under
 * --disable-bias-linear, a norm bias under rmsnorm) has a NULL view. */
typedef struct spb_layer_params {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
} spb_layer_params;

typedef struct spb_layer_acts {
    float *ln1_out, *ln1_mean, *ln1_rstd; /* local tokens */
    float *qkv, *atto;                    /* TP region tokens, local heads (qkv: qkv_width per token) */
    float *attn_saved;                    /* the strategy's (log-sum-exp, ...) */
    float *res_mid;                       /* residual after attention, local */
    float *ln2_out, *ln2_mean, *ln2_rstd;
    float *fc_pre, *fc_act;               /* TP region tokens, local ffn columns (fc_pre: 2 Fl under SwiGLU) */
} spb_layer_acts;

/* Where a unit of parameters lives for the duration of its use: ZeRO-3
 * gathers a layer's parameters before its forward and again before its
 * backward and frees them after; ZeRO-2/3 give each unit a gradient buffer
 * for its backward and reduce-scatter it after.  unit is a layer index or
 * SPB_UNIT_GLOBALS (embeddings and final LayerNorm: before forward, kept
 * until the end of backward).  phase: SPB_PHASE_FORWARD or _BACKWARD.  The
 * hooks point the core's views at their buffers (spb_gpt_point_tensor). */
enum { SPB_UNIT_GLOBALS = -1 };
struct spb_gpt;
typedef struct spb_param_hooks {
    void *ctx;
    void (*before)(void *ctx, struct spb_gpt *g, int unit, spb_comm_phase phase);
    void (*after)(void *ctx, struct spb_gpt *g, int unit, spb_comm_phase phase);
} spb_param_hooks;

typedef struct spb_gpt {
    int L, C, H, D, F, V, maxpos;
    int B, T;          /* micro-batch sequences, local tokens per sequence */
    int seq_length;    /* global N */
    int causal;
    int tp, tp_rank;   /* tensor-parallel degree and rank (over the SP group) */
    int Hl, Ca, Fl;    /* local heads, attention width H/TP·D, ffn width F/TP */
    int Ttp;           /* tokens per sequence inside a TP region (N when TP > 1, else T) */
    int head_blocks;   /* qkv and atto in this many head blocks (strategy.h) */
    int G;             /* K/V heads (--num-query-groups) */
    int Gl;            /* K/V heads of this rank's weight shard: G/TP, or 1 replicated when G < TP */
    int kv_replicas;   /* TP ranks holding each K/V head's rows: TP/G when G < TP, else 1 */
    MPI_Comm kv_comm;  /* those ranks (kv_replicas > 1; else MPI_COMM_NULL) */
    int kv_block;      /* K/V heads in each head block: Gl/head_blocks, at least 1 (replicated) */
    int qkv_width;     /* floats of one token's qkv: head_blocks·(Hl/head_blocks + 2·kv_block)·D (3·Hl·D without GQA,
                          head blocks even or not) */
    int rope, rmsnorm, swiglu, untied, bias; /* the model's variant (config.h) */
    double rotary_base;
    int checkpoint;    /* activation checkpointing: keep layer inputs, recompute */
    long *positions;   /* [T] global positions of the local tokens */
    long *positions_tp; /* [Ttp] positions of the TP-region tokens */
    double init_std;
    spb_config cfg; /* a copy: strategies read their options from it */
    const spb_grid *grid;
    const spb_strategy *strategy;
    const spb_attn_backend *attn;
    const struct spb_backend *be; /* the device's operations (backend.h) */

    long num_params;   /* local */
    long num_global_params;
    int num_tensors;
    spb_param_tensor *tensors;
    int any_split;     /* some tensor is sharded */
    float *params, *grads; /* whole local vectors; NULL when ZeRO-3 (params)
                              or ZeRO-2/3 (grads) keep only slices */
    spb_param_hooks hooks;
    /* views into params / grads, or into the hooks' buffers */
    float *wte, *wpe, *lnf_w, *lnf_b, *lm_head; /* NULL: not in this model */
    float *dwte, *dwpe, *dlnf_w, *dlnf_b, *dlm_head;
    spb_layer_params *layer, *dlayer;

    /* activations of the last forward (the backward needs them) */
    int *inputs, *targets; /* [B*T] */
    float **x;             /* L+1 residual streams [B*T][C]; x[0] = embeddings */
    spb_layer_acts *acts; /* per layer; one shared set under checkpointing */
    float *lnf_out, *lnf_mean, *lnf_rstd, *probs;
    /* scratch */
    float *dx, *dtmp, *datto, *dqkv, *dfc;
    float *dact; /* d of the MLP activation: dfc itself, or its own buffer under SwiGLU */
    float *region_in, *region_out; /* [B*Ttp][C] TP-region buffers (TP > 1) */
    float *recompute_out;          /* [B*T][C] a recomputed layer's output (discarded) */

    double attn_flops; /* counted attention FLOPs so far */
} spb_gpt;

/* Allocates this rank's parameter shards, gradients and activations for
 * cfg's micro-batch and this rank's share of the sequence. */
spb_gpt *spb_gpt_create(const spb_config *cfg, const spb_grid *grid);
void spb_gpt_destroy(spb_gpt *g);

/* Counter-based initialisation: element i of global tensor t from
 * (seed, t, i), whatever the split.  init_tensor writes tensor k's local
 * elements to out (for owners of slices). */
void spb_gpt_init_params(spb_gpt *g, uint64_t seed);
void spb_gpt_init_tensor(const spb_gpt *g, int k, uint64_t seed, float *out);

/* The tensor table of a configuration with tensor-parallel degree tp (t may
 * be NULL to count); returns the number of tensors. */
int spb_gpt_tensor_table(const spb_config *cfg, int tp, spb_param_tensor *t, long *num_local, long *num_global);
/* The tensor-parallel degree the configuration's strategy uses at P ranks. */
int spb_gpt_config_tp(const spb_config *cfg);
/* Points the core's view of tensor k at param and/or grad (NULL: unchanged). */
void spb_gpt_point_tensor(spb_gpt *g, int k, float *param, float *grad);
/* The tensor indices of a unit (a layer, or SPB_UNIT_GLOBALS: those
 * outside the layers, at both ends of the table) into ks (room for
 * SPB_TENSORS_PER_LAYER); returns how many. */
int spb_gpt_unit_tensors(const spb_gpt *g, int unit, int *ks);

/* Parameter count of a configuration, unsharded (no allocation). */
long spb_gpt_count_params(const spb_config *cfg);

/* Index in the global flat vector of local element i of tensor t. */
long spb_gpt_global_index(const spb_gpt *g, const spb_param_tensor *t, long i);
/* local (this rank's shards, e.g. params or grads) -> global flat vector on
 * every rank (collective over the SP group when sharded). */
void spb_gpt_gather_global(const spb_gpt *g, const float *local, float *global);
/* global flat vector -> this rank's shards. */
void spb_gpt_scatter_global(const spb_gpt *g, const float *global, float *local);

/* inputs, targets: [B][T] tokens at this rank's positions.  Returns the sum
 * over these B·T tokens of -log p(target). */
double spb_gpt_forward(spb_gpt *g, const int *inputs, const int *targets);
/* Adds d(loss_scale · sum of token losses)/d(params) to grads. */
void spb_gpt_backward(spb_gpt *g, float loss_scale);
void spb_gpt_zero_grads(spb_gpt *g);

#endif
