#include "kv_replicas.h"

#include "comm.h"

int spb_kv_replica_span(const spb_param_tensor *t, int tp, long *lo, long *n)
{
    *lo = *n = 0;
    if (t->split != SPB_SPLIT_QKV_ROWS || t->kv_replicas <= 1) return 0;
    *lo = (long)(t->block_rows[0] / tp) * t->cols; /* the q rows come first */
    *n = t->numel - *lo;
    return 1;
}

void spb_kv_replicas_reduce(const spb_gpt *g, int k, float *grad)
{
    long lo, n;
    if (!spb_kv_replica_span(&g->tensors[k], g->tp, &lo, &n)) return;
    spb_allreduce_sum_f32(grad + lo, n, g->kv_comm, SPB_PHASE_GRAD_REDUCE);
}

void spb_kv_replicas_reduce_all(const spb_gpt *g)
{
    if (g->kv_replicas <= 1) return;
    for (int k = 0; k < g->num_tensors; k++) spb_kv_replicas_reduce(g, k, g->grads + g->tensors[k].offset);
}

int spb_kv_replicas_count_here(const spb_gpt *g) { return g->tp_rank % g->kv_replicas == 0; }
