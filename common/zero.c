#include "zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "comm.h"
#include "memory.h"
#include "optimizer.h"

/* Copies the class's tensors of `vec` into or out of its packed order. */
static void pack(const spb_zero_class *c, const spb_gpt *g, float *vec, int into_packed)
{
    long at = 0;
    for (int k = 0; k < c->num_tensors; k++) {
        const spb_param_tensor *t = &g->tensors[c->tensors[k]];
        size_t bytes = sizeof(float) * (size_t)t->numel;
        if (into_packed)
            memcpy(c->packed + at, vec + t->offset, bytes);
        else
            memcpy(vec + t->offset, c->packed + at, bytes);
        at += t->numel;
    }
}

static void build_class(spb_zero_class *c, const spb_gpt *g, MPI_Comm comm, int replicated)
{
    c->comm = comm;
    MPI_Comm_size(comm, &c->size);
    MPI_Comm_rank(comm, &c->rank);
    c->tensors = SPB_CHECK_PTR(malloc(sizeof(int) * (size_t)g->num_tensors));
    for (int k = 0; k < g->num_tensors; k++)
        if ((g->tensors[k].split == SPB_REPLICATED) == replicated) {
            c->tensors[c->num_tensors++] = k;
            c->n += g->tensors[k].numel;
        }
    c->slice = (c->n + c->size - 1) / c->size;
    c->packed = spb_mem_alloc(SPB_MEM_COMM, sizeof(float) * (size_t)(c->slice * c->size));
    c->m = spb_mem_alloc(SPB_MEM_OPTIMIZER, sizeof(float) * (size_t)c->slice);
    c->v = spb_mem_alloc(SPB_MEM_OPTIMIZER, sizeof(float) * (size_t)c->slice);
    /* The owned range [lo, hi) cut at tensor boundaries (weight decay is per
     * tensor). */
    long lo = (long)c->rank * c->slice, hi = lo + c->slice < c->n ? lo + c->slice : c->n, at = 0;
    c->segments = SPB_CHECK_PTR(calloc((size_t)c->num_tensors + 1, sizeof *c->segments));
    for (int k = 0; k < c->num_tensors; k++) {
        const spb_param_tensor *t = &g->tensors[c->tensors[k]];
        long a = at > lo ? at : lo, b = at + t->numel < hi ? at + t->numel : hi;
        if (a < b)
            c->segments[c->num_segments++] =
                (spb_zero_segment){.packed_lo = a, .n = b - a, .param_offset = t->offset + (a - at), .decay = t->decay};
        at += t->numel;
    }
}

spb_zero *spb_zero_create(const spb_gpt *g, const spb_grid *grid, int stage)
{
    SPB_CHECK(stage == 1 || stage == 2);
    spb_zero *z = SPB_CHECK_PTR(calloc(1, sizeof *z));
    z->stage = stage;
    build_class(&z->cls[z->num_classes++], g, grid->dpsp_comm, 1);
    if (g->any_split) build_class(&z->cls[z->num_classes++], g, grid->dp_comm, 0);
    return z;
}

void spb_zero_destroy(spb_zero *z)
{
    if (!z) return;
    for (int k = 0; k < z->num_classes; k++) {
        spb_zero_class *c = &z->cls[k];
        spb_mem_free(c->packed);
        spb_mem_free(c->m);
        spb_mem_free(c->v);
        free(c->tensors);
        free(c->segments);
    }
    free(z);
}

void spb_zero_reduce_gradients(spb_zero *z, const spb_gpt *g)
{
    for (int k = 0; k < z->num_classes; k++) {
        spb_zero_class *c = &z->cls[k];
        memset(c->packed + c->n, 0, sizeof(float) * (size_t)(c->slice * c->size - c->n)); /* padding */
        pack(c, g, g->grads, 1);
        if (c->size == 1) continue;
        if (z->stage == 1) {
            spb_allreduce_sum_f32(c->packed, c->slice * c->size, c->comm, SPB_PHASE_GRAD_REDUCE);
        } else {
            /* In place: this rank's slice lands where it sits in the packed vector. */
            float *mine = c->packed + (long)c->rank * c->slice;
            float *sum = spb_mem_alloc(SPB_MEM_COMM, sizeof(float) * (size_t)c->slice);
            spb_reduce_scatter_f32(c->packed, sum, c->slice, c->comm, SPB_PHASE_ZERO);
            memcpy(mine, sum, sizeof(float) * (size_t)c->slice);
            spb_mem_free(sum);
        }
    }
}

double spb_zero_grad_norm(const spb_zero *z, MPI_Comm world)
{
    /* Every owned slice is disjoint and together they cover each class once
     * per replica group; shard classes differ across sequence ranks, so a
     * sum over the world counts every distinct element exactly once. */
    double sum = 0;
    for (int k = 0; k < z->num_classes; k++) {
        const spb_zero_class *c = &z->cls[k];
        for (int s = 0; s < c->num_segments; s++)
            sum += spb_sum_squares(c->packed + c->segments[s].packed_lo, c->segments[s].n);
    }
    spb_allreduce_sum_f64(&sum, 1, world, SPB_PHASE_OTHER);
    return sqrt(sum);
}

void spb_zero_update(spb_zero *z, spb_gpt *g, const spb_config *cfg, double lr, float grad_scale)
{
    z->step++;
    for (int k = 0; k < z->num_classes; k++) {
        spb_zero_class *c = &z->cls[k];
        long base = (long)c->rank * c->slice;
        for (int s = 0; s < c->num_segments; s++) {
            const spb_zero_segment *sg = &c->segments[s];
            /* The slice's gradient is in packed; the parameters are the
             * rank's own copy; moments are indexed from the slice start. */
            spb_adamw_apply(g->params + sg->param_offset, c->packed + sg->packed_lo, c->m + (sg->packed_lo - base),
                            c->v + (sg->packed_lo - base), sg->n, grad_scale,
                            sg->decay ? (float)cfg->weight_decay : 0.0f, cfg, z->step, lr);
        }
        if (c->size == 1) continue;
        /* Everyone's updated slice to everyone: pack my slice, allgather. */
        pack(c, g, g->params, 1);
        float *mine = spb_mem_alloc(SPB_MEM_COMM, sizeof(float) * (size_t)c->slice);
        memcpy(mine, c->packed + base, sizeof(float) * (size_t)c->slice);
        spb_allgather_f32(mine, c->packed, c->slice, c->comm, SPB_PHASE_ZERO);
        spb_mem_free(mine);
        pack(c, g, g->params, 0);
    }
}
