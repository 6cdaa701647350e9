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
#include <string.h>

#include "memory.h"
#include "device_mem.h"
#include "local_attention.h"
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

/* [B][P·T][C] (sequence order) <-> [P][B][T][C] (rank-major blocks, the
 * layout MPI's allgather and reduce-scatter use). */
static void region_to_blocks(const spb_attn_ctx *c, const float *region, float *blocks, int B, int T, int C, int P)
{
    long row = (long)T * C;
    for (int j = 0; j < P; j++)
        for (int b = 0; b < B; b++)
            spb_dev_copy(c, blocks + ((long)j * B + b) * row, region + ((long)b * P + j) * row, row);
}

static void blocks_to_region(const spb_attn_ctx *c, const float *blocks, float *region, int B, int T, int C, int P)
{
    long row = (long)T * C;
    for (int j = 0; j < P; j++)
        for (int b = 0; b < B; b++)
            spb_dev_copy(c, region + ((long)b * P + j) * row, blocks + ((long)j * B + b) * row, row);
}

/* Local [B][T][C] -> region [B][N][C]. */
static void gather_sequence(const spb_attn_ctx *c, const float *local, float *region)
{
    int P = c->grid->sp_size, T = c->tokens / P, C = c->heads * c->head_dim * P;
    long n = (long)c->batch * T * C;
    float *blocks = spb_dev_alloc(c, SPB_MEM_COMM, (long)n * P);
    spb_allgather_f32(local, blocks, n, c->grid->sp_comm, c->phase);
    blocks_to_region(c, blocks, region, c->batch, T, C, P);
    spb_dev_free(c, blocks);
}

/* Region [B][N][C] partial sums -> local [B][T][C] sums. */
static void reduce_scatter_sequence(const spb_attn_ctx *c, const float *region, float *local)
{
    int P = c->grid->sp_size, T = c->tokens / P, C = c->heads * c->head_dim * P;
    long n = (long)c->batch * T * C;
    float *blocks = spb_dev_alloc(c, SPB_MEM_COMM, (long)n * P);
    region_to_blocks(c, region, blocks, c->batch, T, C, P);
    spb_reduce_scatter_f32(blocks, local, n, c->grid->sp_comm, c->phase);
    spb_dev_free(c, blocks);
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
 * (up to the (P−1)/P that leaves the rank). */
static spb_comm_volume megatron_comm_volume(const spb_config *cfg, int P)
{
    double region = 4.0 * cfg->micro_batch_size * cfg->seq_length * cfg->hidden_size * (P - 1) / P;
    return (spb_comm_volume){4.0 * region, 6.0 * region};
}

const spb_strategy spb_strategy_megatron = {
    .name = "megatron",
    .summary = "Megatron-LM sequence parallelism: tensor parallel over the SP group, allgather/reduce-scatter",
    .validate = megatron_validate,
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
