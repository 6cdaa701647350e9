/* FLOPs per iteration by the formula behind the paper's TFLOPs figures. */
#ifndef SPB_FLOPS_H
#define SPB_FLOPS_H

#include "config.h"

/* Megatron-DeepSpeed's throughput calculator (Narayanan et al. 2021,
 * "Efficient Large-Scale Language Model Training on GPU Clusters", appendix):
 *   24 · c · B · s · L · h² · (1 + s/(6h) + V/(16·L·h))
 * with c = 4 under activation checkpointing (forward recomputed), 3
 * otherwise; B the global batch, s the sequence length.  It counts the full
 * (non-causal) attention matrix.  Counted FLOPs are reported beside it.
 * For the Llama variants the 1 becomes the products' share with G K/V heads
 * and SwiGLU's third matrix (flops.c); GPT's value is unchanged. */
double spb_paper_flops_per_iteration(const spb_config *cfg, int activation_checkpointing);

#endif
