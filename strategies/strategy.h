/* The sequence-parallel strategy interface (docs/DESIGN.md, "One training
 * step, as data").  The GPT core calls these hooks and never tests which
 * strategy it runs; a new strategy is one file plus one line in
 * strategies/registry.c.
 *
 * Inside one SP group of P ranks, rank r holds the tokens at positions
 * positions[0..T) of every sequence of its micro-batch (T = N/P; contiguous
 * [r·N/P, (r+1)·N/P) unless the strategy lays them out otherwise, e.g. ring
 * zigzag; when P does not divide N, T and the offsets are rank r's share of
 * common/runtime/split.h, for the strategies with uneven_tokens).  A layer is
 *
 *     a = LN1(x)                                  local tokens, all features
 *     h = enter_tp(a)                             TP region: T_tp tokens
 *     qkv = h · Wqkvᵀ[shard]                      H/TP heads
 *     o = attention(qkv)                          the strategy's collective(s)
 *     y = exit_tp(o · Wprojᵀ[shard]) + b          back to local tokens
 *     x = x + y ;  same enter/exit around the MLP (F/TP columns)
 *
 * For strategies without tensor parallelism (TP degree 1) the enter/exit
 * hooks are NULL and the core uses the local buffers directly. */
#ifndef SPB_STRATEGY_H
#define SPB_STRATEGY_H

#include <stddef.h>

#include "attention.h"
#include "comm.h"
#include "config.h"
#include "grid.h"

/* What a strategy's hooks see of one layer's call. */
typedef struct spb_attn_ctx {
    const spb_config *cfg; /* the run's configuration (strategy options) */
    const spb_grid *grid;
    const spb_attn_backend *backend;
    const struct spb_backend *device; /* where the buffers live (common/core/backend.h); NULL: host */
    int batch;           /* sequences in the micro-batch */
    int heads;           /* heads this rank computes QKV for (H / TP degree) */
    /* K/V heads in this rank's QKV (grouped-query attention; 0 = heads): in
     * head blocks, each block's query heads and the K/V heads they read,
     * replicated where there are fewer K/V heads than blocks.  Each token's
     * qkv row is [q: heads·D | k: kv_heads·D | v: kv_heads·D] (per block
     * when head_blocks > 1: [q: heads/G_b | k: kv/G_b | v: kv/G_b]·D). */
    int kv_heads;
    int head_dim;
    int tokens;          /* tokens per sequence in this rank's QKV (T, or N inside a TP region) */
    const long *positions; /* global position of each of those tokens */
    int seq_length;      /* global N */
    int causal;
    int layer;
    spb_comm_phase phase; /* forward, backward, recompute */
    double *flops;       /* counted attention FLOPs are added here */
} spb_attn_ctx;

/* Analytic communication of one layer for one micro-batch (b sequences of N
 * tokens, hidden h), in bytes per link: what one rank's link carries,
 * nccl-tests' convention.  Beside each strategy's formula is its derivation. */
typedef struct spb_comm_volume {
    double forward_bytes;
    double backward_bytes;
} spb_comm_volume;

typedef struct spb_strategy {
    const char *name;
    const char *summary;
    /* Extra configuration checks (e.g. heads divisible by P); 0 or -1 with a
     * one-line message.  Runs before anything is allocated. */
    int (*validate)(const spb_config *cfg, int world_size, char *err, size_t errlen);
    /* 1: takes --seq-length not divisible by P, ranks holding the uneven
     * shares of common/runtime/split.h (its validate refuses the variants
     * that cannot); 0: config.c refuses such lengths. */
    int uneven_tokens;

    /* Tensor-parallel degree over the SP group (1 when NULL).  With degree
     * T > 1, QKV and fc are column-parallel and proj and fcproj
     * row-parallel, sharded T ways over the SP group. */
    int (*tp_degree)(const spb_grid *grid);
    /* Head-block layout of the attention's input and output (1 when NULL):
     * with G > 1 the core's QKV product writes qkv as [G][B][tokens][3][H/G][D]
     * (block j = heads [j·H/G, (j+1)·H/G)) and the output projection reads o
     * as [G][B][tokens][H/G][D], so an all-to-all over G ranks needs no pack. */
    int (*head_blocks)(const spb_grid *grid);
    /* This rank's T tokens per sequence (NULL: split.h's share of N over
     * the SP group; ring's layouts give zigzag's chunk pair, split.h's
     * shares over 2P; the hybrid splits N over its ring groups, then each
     * group's share over its Ulysses ranks). */
    int (*local_tokens)(const spb_grid *grid, const spb_config *cfg);
    /* Global positions of this rank's T local tokens (NULL: contiguous). */
    void (*local_positions)(const spb_grid *grid, const spb_config *cfg, long *positions);

    /* Floats of per-layer storage the attention keeps from forward for
     * backward (log-sum-exp included); the core allocates it (activations). */
    size_t (*attn_saved_floats)(const spb_attn_ctx *ctx);
    /* qkv: [B][tokens][heads + 2·kv_heads][D] (q, then k, then v); o:
     * [B][tokens][heads][D] (in head blocks when head_blocks says so). */
    void (*attention_forward)(const spb_attn_ctx *ctx, const float *qkv, float *o, float *saved);
    /* dqkv is overwritten. */
    void (*attention_backward)(const spb_attn_ctx *ctx, const float *qkv, const float *o, const float *saved,
                               const float *dout, float *dqkv);

    /* TP region hooks on [B][tokens][C] activations (NULL when TP degree 1).
     * enter: local [B][T][C] -> region [B][T_tp][C]; its backward sums the
     * region gradient back to local tokens (overwrites din).  exit: partial
     * region sums [B][T_tp][C] -> local [B][T][C] (summed); its backward
     * spreads the local gradient over the region. */
    void (*enter_tp)(const spb_attn_ctx *ctx, const float *in, float *out);
    void (*enter_tp_backward)(const spb_attn_ctx *ctx, const float *dout, float *din);
    void (*exit_tp)(const spb_attn_ctx *ctx, const float *in, float *out);
    void (*exit_tp_backward)(const spb_attn_ctx *ctx, const float *dout, float *din);

    /* Analytic bytes per link of one layer (forward and backward) for a
     * micro-batch of cfg; the accounting layer's measured bytes must equal it. */
    spb_comm_volume (*comm_volume)(const spb_config *cfg, int sp_degree);
} spb_strategy;

const spb_strategy *spb_strategy_by_name(const char *name);
/* Comma-separated list of registered strategy names. */
void spb_strategy_names(char *buf, size_t len);



extern const spb_strategy spb_strategy_none;
extern const spb_strategy spb_strategy_megatron;
extern const spb_strategy spb_strategy_ulysses;
extern const spb_strategy spb_strategy_ring;
extern const spb_strategy spb_strategy_hybrid;
/* The hybrid's bytes in parts (fp32, per rank, per direction of one layer):
 * the payload of its two exchanges over U ranks (Q, K, V and O; link bytes
 * = payload x the collective's bus factor) and one ring hop's K/V block.
 * comm_volume and the performance model both build on them. */
void spb_hybrid_volume_parts(const spb_config *cfg, int sp_degree, double *exchange_payload, double *ring_block);
/* Uneven shares (P ∤ N, either layout) or heads (U ∤ H): what rank u of ring group g sends in
 * one layer (fp32 bytes): its exchange's link bytes and payload (the
 * per-rank-count all-to-all's: every block, its own included) and its
 * ring hops' bytes, per direction.  The hybrid's comm_volume takes each
 * phase's busiest rank of their sums; the performance model prices that
 * rank's parts on their two groups. */
typedef struct spb_hybrid_rank_bytes {
    double exchange_link[2], exchange_payload[2], ring[2]; /* [0] forward, [1] backward */
} spb_hybrid_rank_bytes;
spb_hybrid_rank_bytes spb_hybrid_uneven_rank_bytes(const spb_config *cfg, int sp_degree, int g, int u);
extern const spb_strategy spb_strategy_allgather_kv;

#endif
