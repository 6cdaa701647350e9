/* The sequence-parallel strategy interface (shared/DESIGN.md, "One training
 * step, as data").  The GPT core calls these hooks and never tests which
 * strategy it runs; a new strategy is one file plus one line in
 * strategies/registry.c.  This first version carries the hooks the
 * single-sequence-rank core needs (attention and gradient reduction); the
 * tensor-parallel enter/exit hooks and weight sharding come with the
 * strategies that need them. */
#ifndef SPB_STRATEGY_H
#define SPB_STRATEGY_H

#include <stddef.h>

#include "../common/attention.h"
#include "../common/config.h"
#include "../common/grid.h"

/* What a strategy's attention sees of one layer's call. */
typedef struct spb_attn_ctx {
    const spb_grid *grid;
    const spb_attn_backend *backend;
    int batch;          /* sequences in the micro-batch */
    int heads, head_dim;
    int local_tokens;   /* tokens of each sequence held by this rank */
    long token_offset;  /* global position of this rank's first token */
    int seq_length;     /* global N */
    int layer;
    double *flops;      /* counted attention FLOPs are added here */
} spb_attn_ctx;

typedef struct spb_strategy {
    const char *name;
    const char *summary;
    /* Extra configuration checks (e.g. heads divisible by P); 0 or -1 with a
     * one-line message.  Runs before anything is allocated. */
    int (*validate)(const spb_config *cfg, int world_size, char *err, size_t errlen);
    /* Elements of the per-layer log-sum-exp buffer the strategy needs. */
    size_t (*lse_elements)(const spb_attn_ctx *ctx);
    /* qkv: [B][local tokens][3][H][D] (q | k | v); o: [B][local tokens][H][D]. */
    void (*attention_forward)(const spb_attn_ctx *ctx, const float *qkv, float *o, float *lse);
    /* dqkv is overwritten. */
    void (*attention_backward)(const spb_attn_ctx *ctx, const float *qkv, const float *o, const float *lse,
                               const float *dout, float *dqkv);
    /* Sum the gradients of replicated parameters over the ranks that hold
     * replicas, after the last micro-step of an iteration. */
    void (*reduce_gradients)(const spb_grid *grid, float *grads, long n);
} spb_strategy;

const spb_strategy *spb_strategy_by_name(const char *name);
/* Comma-separated list of registered strategy names. */
void spb_strategy_names(char *buf, size_t len);

/* Counted attention FLOPs of one backend call from its descriptor: the
 * visible (unmasked) query-key pairs times 4·D for forward; backward counts
 * 10·D per pair (flash recomputes the scores: QKᵀ, dV, dP, dQ, dK). */
double spb_attn_visible_pairs(const spb_attn_desc *d);

extern const spb_strategy spb_strategy_none;

#endif
