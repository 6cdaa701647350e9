/* Megatron-SP with fewer K/V heads than tensor-parallel ranks (G < TP, G |
 * TP): each K/V head's rows of qkv_w and qkv_b are replicated on the R =
 * TP/G consecutive TP ranks whose query heads read it (gpt.h,
 * kv_replicas).  Each replica's backward sees only its own query heads'
 * share of dK and dV, so the weight gradient of those rows is the sum over
 * the R replicas: one all-reduce over the replica group (g->kv_comm), as
 * Megatron-LM sums the sequence-parallel LayerNorm weights over its TP
 * group.  After it the replicas hold equal gradients and, from equal
 * initial values, take equal updates.
 *
 * When: once per iteration on the whole gradient vector (ZeRO 0-1), or on
 * each layer's gradient buffer after its backward, every micro-step
 * (ZeRO 2-3, before the buffer is reduce-scattered).  Recorded under phase
 * "grad_reduce"; spb_zero_comm_items predicts it (group "sp", size R). */
#ifndef SPB_KV_REPLICAS_H
#define SPB_KV_REPLICAS_H

#include "gpt.h"

/* The replicated rows of tensor t as local elements [*lo, *lo + *n) of the
 * tensor (its k and v rows, after the q rows); returns 0 (and *n = 0) when
 * t has no replicas. */
int spb_kv_replica_span(const spb_param_tensor *t, int tp, long *lo, long *n);
/* Sums tensor k's replicated rows over the replica group; grad points at
 * the tensor's gradient (whichever buffer holds it). */
void spb_kv_replicas_reduce(const spb_gpt *g, int k, float *grad);
/* The same for every tensor of the whole local gradient vector g->grads. */
void spb_kv_replicas_reduce_all(const spb_gpt *g);
/* Whether this rank counts the replicated rows in the gradient norm (one
 * replica of each group does: the first). */
int spb_kv_replicas_count_here(const spb_gpt *g);

#endif
