/* The shared GPT core (docs/FORMATS.md has the model and parameter order):
 * forward and backward over this rank's contiguous range of tokens of each
 * sequence, on the CPU in fp32.  Attention and gradient reduction go through
 * the strategy; the core never asks which strategy it runs. */
#ifndef SPB_GPT_H
#define SPB_GPT_H

#include <stdint.h>

#include "../strategies/strategy.h"
#include "attention.h"
#include "config.h"
#include "grid.h"

enum { SPB_TENSORS_PER_LAYER = 12 };

typedef struct spb_param_tensor {
    char name[32];
    long offset; /* into the flat parameter vector */
    long numel;
    int rows, cols; /* cols = 1 for vectors */
    int layer;      /* -1 outside the blocks */
    int decay;      /* AdamW weight decay applies (matrices, embeddings) */
} spb_param_tensor;

typedef struct spb_layer_params {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    float *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
} spb_layer_params;

typedef struct spb_layer_acts {
    float *ln1_out, *ln1_mean, *ln1_rstd;
    float *qkv, *atto, *lse;
    float *res_mid; /* residual after attention */
    float *ln2_out, *ln2_mean, *ln2_rstd;
    float *fc_pre, *fc_act;
} spb_layer_acts;

typedef struct spb_gpt {
    int L, C, H, D, F, V, maxpos;
    int B, T;         /* micro-batch sequences, local tokens per sequence */
    long t_offset;    /* global position of local token 0 */
    int seq_length;   /* global N */
    double init_std;
    const spb_grid *grid;
    const spb_strategy *strategy;
    const spb_attn_backend *attn;

    long num_params;
    int num_tensors;
    spb_param_tensor *tensors;
    float *params, *grads;
    /* views into params / grads */
    float *wte, *wpe, *lnf_w, *lnf_b;
    float *dwte, *dwpe, *dlnf_w, *dlnf_b;
    spb_layer_params *layer, *dlayer;

    /* activations of the last forward (the backward needs them) */
    int *inputs, *targets; /* copies, [B*T] */
    float **x;             /* L+1 residual streams [B*T][C]; x[0] = embeddings */
    spb_layer_acts *acts;
    float *lnf_out, *lnf_mean, *lnf_rstd, *probs;
    /* backward scratch */
    float *dx, *dtmp, *datto, *dqkv, *dfc;

    double attn_flops; /* counted attention FLOPs so far */
} spb_gpt;

/* Allocates parameters, gradients and activations for cfg's micro-batch and
 * this rank's share of the sequence. */
spb_gpt *spb_gpt_create(const spb_config *cfg, const spb_grid *grid);
void spb_gpt_destroy(spb_gpt *g);

/* Counter-based initialisation: element i of tensor t from (seed, t, i). */
void spb_gpt_init_params(spb_gpt *g, uint64_t seed);

/* Parameter count of a configuration (no allocation). */
long spb_gpt_count_params(const spb_config *cfg);

/* inputs, targets: [B][T] tokens of this rank's slice.  Returns the sum over
 * these B·T tokens of -log p(target). */
double spb_gpt_forward(spb_gpt *g, const int *inputs, const int *targets);
/* Adds d(loss_scale · sum of token losses)/d(params) to grads. */
void spb_gpt_backward(spb_gpt *g, float loss_scale);
void spb_gpt_zero_grads(spb_gpt *g);

#endif
