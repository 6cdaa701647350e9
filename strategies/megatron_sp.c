/* Megatron-LM sequence parallelism (Korthikanti et al. 2022): tensor
 * parallelism of degree P over the SP group.  QKV and fc are column-parallel
 * (this rank's H/P heads with G/P K/V heads, or one replicated K/V head when
 * G < P; F/P ffn columns), proj and fcproj row-parallel; the
 * LayerNorm/residual regions stay split over the sequence.  An allgather over
 * the sequence enters each tensor-parallel region and a reduce-scatter
 * leaves it; backward swaps them.  As in Megatron-LM, only the local
 * LayerNorm output is kept and it is gathered again in backward for the
 * weight gradient (memory for communication). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "memory.h"
#include "device_mem.h"
#include "local_attention.h"
#include "split.h"
#include "strategy.h"

static int megatron_validate(const spb_config *cfg, int world_size, char *err, size_t errlen)
{
    (void)world_size;
    int P = cfg->sp_degree;
    if (cfg->num_heads % P) {
        snprintf(err, errlen, "--num-attention-heads %d is not divisible by --sp-degree %d (Megatron-SP splits heads)",
                 cfg->num_heads, P);
        return -1;
    }
    /* K/V heads over the tensor-parallel ranks: G/P whole heads each when P
     * divides G (Megatron-LM's own rule); when G divides P, each K/V head's
     * weight rows are replicated on the P/G ranks whose query heads read it,
     * and their gradients summed over those ranks (common/core/
     * kv_replicas.h).  Anything else would split a K/V head or give one
     * rank's query heads two of them. */
    int G = cfg->num_query_groups > 0 ? cfg->num_query_groups : cfg->num_heads;
    if (G % P && P % G) {
        snprintf(err, errlen,
                 "--num-query-groups %d and --sp-degree %d: one must divide the other (Megatron-SP shards K/V heads "
                 "over its tensor-parallel ranks, or replicates each on P/G of them)", G, P);
        return -1;
    }
    if (cfg->ffn_hidden_size % P) {
        snprintf(err, errlen, "--ffn-hidden-size %d is not divisible by --sp-degree %d (Megatron-SP splits the MLP)",
                 cfg->ffn_hidden_size, P);
        return -1;
    }
    return 0;
}

static int megatron_tp_degree(const spb_grid *grid) { return grid->sp_size; }

/* The region [B][N][C] (sequence order) <-> rank-major blocks [P][B][T_j][C]
 * (the layout the allgather and reduce-scatter use): block j holds rank j's
 * T_j tokens of every sequence, starting at its first position (split.h;
 * T_j = N/P when P divides N). */
typedef struct region_split {
    long *counts, *displs; /* floats of block j and where it starts */
    long *first, *tokens;  /* rank j's share: its first position and token count */
} region_split;

static void split_region(const spb_attn_ctx *c, long C, region_split *s)
{
    int P = c->grid->sp_size;
    long *all = SPB_CHECK_PTR(malloc(sizeof(long) * 4 * (size_t)P));
    s->counts = all, s->displs = all + P, s->first = all + 2 * P, s->tokens = all + 3 * P;
    long at = 0;
    for (int j = 0; j < P; j++) {
        s->tokens[j] = spb_split_count(c->tokens, P, j), s->first[j] = spb_split_offset(c->tokens, P, j);
        s->counts[j] = (long)c->batch * s->tokens[j] * C, s->displs[j] = at, at += s->counts[j];
    }
}

static void region_to_blocks(const spb_attn_ctx *c, const region_split *s, const float *region, float *blocks, long C)
{
    for (int j = 0; j < c->grid->sp_size; j++)
        for (int b = 0; b < c->batch; b++)
            spb_dev_copy(c, blocks + s->displs[j] + b * s->tokens[j] * C,
                         region + ((long)b * c->tokens + s->first[j]) * C, s->tokens[j] * C);
}

static void blocks_to_region(const spb_attn_ctx *c, const region_split *s, const float *blocks, float *region, long C)
{
    for (int j = 0; j < c->grid->sp_size; j++)
        for (int b = 0; b < c->batch; b++)
            spb_dev_copy(c, region + ((long)b * c->tokens + s->first[j]) * C,
                         blocks + s->displs[j] + b * s->tokens[j] * C, s->tokens[j] * C);
}

/* Local [B][T_r][C] -> region [B][N][C].  ctx->tokens is the region's N. */
static void gather_sequence(const spb_attn_ctx *c, const float *local, float *region)
{
    int P = c->grid->sp_size, me = c->grid->sp_rank;
    long C = (long)c->heads * c->head_dim * P, N = c->tokens;
    region_split s;
    split_region(c, C, &s);
    float *blocks = spb_dev_alloc(c, SPB_MEM_COMM, (long)c->batch * N * C);
    if (spb_split_is_even(N, P))
        spb_allgather_f32(local, blocks, s.counts[me], c->grid->sp_comm, c->phase);
    else /* uneven shares (CPU only: config.c) */
        spb_allgatherv_f32(local, blocks, s.counts, s.displs, c->grid->sp_comm, c->phase);
    blocks_to_region(c, &s, blocks, region, C);
    spb_dev_free(c, blocks);
    free(s.counts);
}

/* Region [B][N][C] partial sums -> local [B][T_r][C] sums. */
static void reduce_scatter_sequence(const spb_attn_ctx *c, const float *region, float *local)
{
    int P = c->grid->sp_size, me = c->grid->sp_rank;
    long C = (long)c->heads * c->head_dim * P, N = c->tokens;
    region_split s;
    split_region(c, C, &s);
    float *blocks = spb_dev_alloc(c, SPB_MEM_COMM, (long)c->batch * N * C);
    region_to_blocks(c, &s, region, blocks, C);
    if (spb_split_is_even(N, P))
        spb_reduce_scatter_f32(blocks, local, s.counts[me], c->grid->sp_comm, c->phase);
    else
        spb_reduce_scatterv_f32(blocks, s.counts, s.displs, local, c->grid->sp_comm, c->phase);
    spb_dev_free(c, blocks);
    free(s.counts);
}

/* The exchanges move [b][N][h] activations, never Q, K or V: grouped-query
 * attention (fewer K/V heads) and the other Llama options change the
 * product shapes but not these bytes.  With G < P the replicated K/V
 * weight rows add one gradient all-reduce per layer over the R = P/G
 * replicas, 2·(h/H)·h (+ 2·h/H bias) floats, each link carrying 2(R−1)/R of
 * it; it runs once per iteration with the gradient reduction, not per
 * micro-batch and layer pass, so it is counted there (spb_zero_comm_items,
 * phase grad_reduce), not here.
 * Bytes per link of one allgather or reduce-scatter of the region
 * [b][N][h] over P ranks: nccl-tests' size is the whole region (b·N·h
 * floats) and each rank's link carries (P−1)/P of it.
 *   forward:  allgather (enter attention) + reduce-scatter (exit attention)
 *           + allgather (enter MLP) + reduce-scatter (exit MLP)   = 4 regions
 *   backward: allgather of the output gradient at each exit (2), reduce-scatter
 *             of the input gradient at each entry (2), and the re-gather of
 *             each LayerNorm output for the weight gradient (2) = 6 regions
 * So forward = 4·b·N·h·(P−1)/P floats: the paper's "4Nh per link whatever P"
 * (up to the (P−1)/P that leaves the rank).
 *
 * Uneven shares (P does not divide N; rank r holds T_r tokens, split.h):
 * the collectives take per-rank counts (comm.c's allgatherv and
 * reduce-scatterv) and record exactly what a rank sends.  Rank r's
 * allgather sends its b·T_r·h block to each of the P − 1 others, its
 * reduce-scatter every block but its own, b·(N − T_r)·h.  Per phase, in
 * floats:
 *   forward  (2 allgathers, 2 reduce-scatters):  b·h·[2·T_r·(P−1) + 2·(N − T_r)]
 *                                              = b·h·[2·T_r·(P−2) + 2·N]
 *   backward (4 allgathers, 2 reduce-scatters):  b·h·[4·T_r·(P−1) + 2·(N − T_r)]
 *                                              = b·h·[T_r·(4P−6) + 2·N]
 * Both grow with T_r (P ≥ 2; at P = 2 the forward is 2·b·h·N on every
 * rank), so the busiest link is rank 0's, T_0 = ⌈N/P⌉.  With T_r = N/P they
 * are 4 and 6 regions of b·N·h·(P−1)/P, the even formula. */
static spb_comm_volume megatron_comm_volume(const spb_config *cfg, int P)
{
    const double b = cfg->micro_batch_size, N = cfg->seq_length, h = cfg->hidden_size;
    if (P > 1 && !spb_split_is_even(cfg->seq_length, P)) {
        const double most = (double)spb_split_max(cfg->seq_length, P);
        return (spb_comm_volume){.forward_bytes = 4.0 * b * h * (2.0 * most * (P - 1) + 2.0 * (N - most)),
                                 .backward_bytes = 4.0 * b * h * (4.0 * most * (P - 1) + 2.0 * (N - most))};
    }
    double region = 4.0 * b * N * h * (P - 1) / P;
    return (spb_comm_volume){4.0 * region, 6.0 * region};
}

const spb_strategy spb_strategy_megatron = {
    .name = "megatron",
    .summary = "Megatron-LM sequence parallelism: tensor parallel over the SP group, allgather/reduce-scatter",
    .validate = megatron_validate,
    .uneven_tokens = 1, /* the region's allgathers and reduce-scatters take per-rank counts */
    .tp_degree = megatron_tp_degree,
    .attn_saved_floats = spb_local_attention_saved_floats,
    .attention_forward = spb_local_attention_forward,
    .attention_backward = spb_local_attention_backward,
    .enter_tp = gather_sequence,
    .enter_tp_backward = reduce_scatter_sequence,
    .exit_tp = reduce_scatter_sequence,
    .exit_tp_backward = gather_sequence,
    .comm_volume = megatron_comm_volume,
};
