#include "zero.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "comm.h"
#include "memory.h"
#include "optimizer.h"

/* Each tensor of a replica class is cut into `size` equal slices (the last
 * padded); a rank owns slice `rank` of every tensor.  Working tensor by
 * tensor keeps the staging buffer at one padded tensor instead of a packed
 * copy of the whole class. */
static long slice_of(long numel, int size) { return (numel + size - 1) / size; }

static void build_class(spb_zero_class *c, const spb_gpt *g, MPI_Comm comm, int replicated)
{
    c->comm = comm;
    MPI_Comm_size(comm, &c->size);
    MPI_Comm_rank(comm, &c->rank);
    c->tensors = SPB_CHECK_PTR(malloc(sizeof(int) * (size_t)g->num_tensors));
    c->segments = SPB_CHECK_PTR(calloc((size_t)g->num_tensors, sizeof *c->segments));
    long owned = 0, largest = 0;
    for (int k = 0; k < g->num_tensors; k++) {
        const spb_param_tensor *t = &g->tensors[k];
        if ((t->split == SPB_REPLICATED) != replicated) continue;
        long slice = slice_of(t->numel, c->size), lo = (long)c->rank * slice;
        long n = lo >= t->numel ? 0 : (lo + slice <= t->numel ? slice : t->numel - lo);
        c->tensors[c->num_tensors] = k;
        /* packed_lo: where this tensor's slice starts in the rank's moments */
        c->segments[c->num_tensors] =
            (spb_zero_segment){.packed_lo = owned, .n = n, .param_offset = t->offset + lo, .decay = t->decay};
        c->num_tensors++;
        c->n += t->numel;
        owned += slice;
        largest = slice * c->size > largest ? slice * c->size : largest;
    }
    c->num_segments = c->num_tensors;
    c->slice = owned; /* moments per rank: one padded slice per tensor */
    c->packed = spb_mem_alloc(SPB_MEM_COMM, sizeof(float) * (size_t)largest);
    c->m = spb_mem_alloc(SPB_MEM_OPTIMIZER, sizeof(float) * (size_t)owned);
    c->v = spb_mem_alloc(SPB_MEM_OPTIMIZER, sizeof(float) * (size_t)owned);
    c->grad = spb_mem_alloc(SPB_MEM_GRADS, sizeof(float) * (size_t)owned);
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
        spb_mem_free(c->grad);
        free(c->tensors);
        free(c->segments);
    }
    free(z);
}

void spb_zero_reduce_gradients(spb_zero *z, const spb_gpt *g)
{
    for (int k = 0; k < z->num_classes; k++) {
        spb_zero_class *c = &z->cls[k];
        for (int i = 0; i < c->num_tensors; i++) {
            const spb_param_tensor *t = &g->tensors[c->tensors[i]];
            const spb_zero_segment *sg = &c->segments[i];
            long slice = slice_of(t->numel, c->size);
            float *mine = c->grad + sg->packed_lo;
            if (c->size == 1) {
                memcpy(mine, g->grads + t->offset, sizeof(float) * (size_t)t->numel);
                continue;
            }
            /* Padded copy of the tensor's gradient (padding reduces to 0). */
            memcpy(c->packed, g->grads + t->offset, sizeof(float) * (size_t)t->numel);
            memset(c->packed + t->numel, 0, sizeof(float) * (size_t)(slice * c->size - t->numel));
            if (z->stage == 1) {
                spb_allreduce_sum_f32(c->packed, slice * c->size, c->comm, SPB_PHASE_GRAD_REDUCE);
                memcpy(mine, c->packed + (long)c->rank * slice, sizeof(float) * (size_t)slice);
            } else {
                spb_reduce_scatter_f32(c->packed, mine, slice, c->comm, SPB_PHASE_ZERO);
            }
        }
    }
}

double spb_zero_grad_norm(const spb_zero *z, MPI_Comm world)
{
    /* The owned slices are disjoint and cover each class once per replica
     * group; shard classes differ across sequence ranks, so a sum over the
     * world counts every distinct element exactly once. */
    double sum = 0;
    for (int k = 0; k < z->num_classes; k++) {
        const spb_zero_class *c = &z->cls[k];
        for (int s = 0; s < c->num_segments; s++)
            sum += spb_sum_squares(c->grad + c->segments[s].packed_lo, c->segments[s].n);
    }
    spb_allreduce_sum_f64(&sum, 1, world, SPB_PHASE_OTHER);
    return sqrt(sum);
}

void spb_zero_update(spb_zero *z, spb_gpt *g, const spb_config *cfg, double lr, float grad_scale)
{
    z->step++;
    for (int k = 0; k < z->num_classes; k++) {
        spb_zero_class *c = &z->cls[k];
        for (int i = 0; i < c->num_tensors; i++) {
            const spb_param_tensor *t = &g->tensors[c->tensors[i]];
            const spb_zero_segment *sg = &c->segments[i];
            long slice = slice_of(t->numel, c->size);
            spb_adamw_apply(g->params + sg->param_offset, c->grad + sg->packed_lo, c->m + sg->packed_lo,
                            c->v + sg->packed_lo, sg->n, grad_scale, sg->decay ? (float)cfg->weight_decay : 0.0f,
                            cfg, z->step, lr);
            if (c->size == 1) continue;
            /* Everyone's updated slice of this tensor to everyone. */
            float *send = c->packed + (long)c->rank * slice;
            memset(send, 0, sizeof(float) * (size_t)slice);
            memcpy(send, g->params + sg->param_offset, sizeof(float) * (size_t)sg->n);
            spb_allgather_f32(send, c->packed, slice, c->comm, SPB_PHASE_ZERO);
            memcpy(g->params + t->offset, c->packed, sizeof(float) * (size_t)t->numel);
        }
    }
}
