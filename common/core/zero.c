#include "zero.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "checks.h"
#include "kv_replicas.h"
#include "memory.h"
#include "ops.h"
#include "optimizer.h"

/* Each tensor of a replica class is cut into `size` equal slices (the last
 * padded); a rank owns slice `rank` of every tensor.  Working tensor by
 * tensor keeps staging at one padded tensor instead of a copy of the class. */
static long slice_of(long numel, int size) { return (numel + size - 1) / size; }

/* The slices and unit buffers live on the model's device (backend.h);
 * checkpoints and initialisation cross to and from host memory. */
/* The class of a tensor: replicated ones over D x P, shards over D. */
static int class_of(const spb_param_tensor *t) { return t->split != SPB_REPLICATED; }

static void build_class(spb_zero *z, int cls, const spb_gpt *g, MPI_Comm comm)
{
    spb_zero_class *c = &z->cls[cls];
    c->comm = comm;
    MPI_Comm_size(comm, &c->size);
    MPI_Comm_rank(comm, &c->rank);
    c->tensors = SPB_CHECK_PTR(malloc(sizeof(int) * (size_t)g->num_tensors));
    c->segments = SPB_CHECK_PTR(calloc((size_t)g->num_tensors, sizeof *c->segments));
    long owned = 0, largest = 0;
    for (int k = 0; k < g->num_tensors; k++) {
        const spb_param_tensor *t = &g->tensors[k];
        if (class_of(t) != cls) continue;
        long slice = slice_of(t->numel, c->size), lo = (long)c->rank * slice;
        long n = lo >= t->numel ? 0 : (lo + slice <= t->numel ? slice : t->numel - lo);
        z->tensor_class[k] = cls;
        z->tensor_segment[k] = c->num_tensors;
        c->tensors[c->num_tensors] = k;
        c->segments[c->num_tensors] =
            (spb_zero_segment){.packed_lo = owned, .n = n, .param_offset = t->offset + lo, .decay = t->decay};
        /* The part of the slice in the K/V replica rows, on the replicas
         * that leave them to the first one in the norm. */
        long span_lo, span_n;
        if (n > 0 && spb_kv_replica_span(t, g->tp, &span_lo, &span_n) && !spb_kv_replicas_count_here(g)) {
            long a = span_lo > lo ? span_lo : lo, b = span_lo + span_n < lo + n ? span_lo + span_n : lo + n;
            if (b > a) c->segments[c->num_tensors].uncounted_lo = a - lo, c->segments[c->num_tensors].uncounted_n = b - a;
        }
        c->num_tensors++;
        c->n += t->numel;
        owned += slice;
        largest = slice * c->size > largest ? slice * c->size : largest;
    }
    c->slice = owned;
    const spb_backend *be = z->be;
    if (z->stage <= 2 && c->size > 1) c->packed = be->alloc(SPB_MEM_COMM, largest);
    if (z->stage == 3) c->p = be->alloc(SPB_MEM_PARAMS, owned);
    c->m = spb_backend_alloc(be, SPB_MEM_OPTIMIZER, owned, SPB_BUF_FIRST_MOMENT);
    c->v = spb_backend_alloc(be, SPB_MEM_OPTIMIZER, owned, SPB_BUF_SECOND_MOMENT);
    c->grad = spb_backend_alloc(be, SPB_MEM_GRADS, owned, SPB_BUF_FP32); /* reduced, accumulated: fp32 */
    if (z->stage >= 2 && c->size > 1) c->reduced = be->alloc(SPB_MEM_COMM, largest / c->size);
}

/* The tensors of a unit: a layer's, or the globals (gpt.h). */
static int unit_tensors(const spb_gpt *g, int unit, int *ks) { return spb_gpt_unit_tensors(g, unit, ks); }

static long padded_of(const spb_zero *z, const spb_gpt *g, int k)
{
    const spb_zero_class *c = &z->cls[z->tensor_class[k]];
    return slice_of(g->tensors[k].numel, c->size) * c->size;
}

/* Stage 3: allgather a unit's slices into one padded buffer (workspace). */
static float *gather_unit(spb_zero *z, spb_gpt *g, int unit, long elems)
{
    int ks[SPB_TENSORS_PER_LAYER], n = unit_tensors(g, unit, ks);
    float *buf = z->be->alloc(SPB_MEM_WORKSPACE, elems);
    for (int i = 0; i < n; i++) {
        int k = ks[i];
        const spb_zero_class *c = &z->cls[z->tensor_class[k]];
        const spb_zero_segment *sg = &c->segments[z->tensor_segment[k]];
        float *dst = buf + z->work_offset[k];
        if (c->size == 1)
            z->be->copy(dst, c->p + sg->packed_lo, g->tensors[k].numel);
        else
            spb_allgather_f32(c->p + sg->packed_lo, dst, slice_of(g->tensors[k].numel, c->size), c->comm,
                              SPB_PHASE_ZERO);
        spb_gpt_point_tensor(g, k, dst, NULL);
    }
    return buf;
}

/* Stages 2-3: reduce-scatter a unit's gradient buffer into the owned
 * slices, adding to what earlier micro-steps left there. */
static void reduce_unit(spb_zero *z, spb_gpt *g, int unit, const float *buf)
{
    int ks[SPB_TENSORS_PER_LAYER], n = unit_tensors(g, unit, ks);
    for (int i = 0; i < n; i++) {
        int k = ks[i];
        spb_zero_class *c = &z->cls[z->tensor_class[k]];
        const spb_zero_segment *sg = &c->segments[z->tensor_segment[k]];
        const float *src = buf + z->work_offset[k];
        if (c->size > 1) {
            spb_reduce_scatter_f32(src, c->reduced, slice_of(g->tensors[k].numel, c->size), c->comm, SPB_PHASE_ZERO);
            src = c->reduced;
        }
        z->be->add_inplace(c->grad + sg->packed_lo, src, sg->n);
    }
}

static void zero_unit_before(void *ctx, spb_gpt *g, int unit, spb_comm_phase phase)
{
    spb_zero *z = ctx;
    int global = unit == SPB_UNIT_GLOBALS;
    long elems = global ? z->global_elems : z->layer_elems;
    float **params = global ? &z->global_params : &z->layer_params;
    if (z->stage == 3 && !*params) *params = gather_unit(z, g, unit, elems);
    if (phase == SPB_PHASE_BACKWARD && z->stage >= 2) {
        float **grads = global ? &z->global_grads : &z->layer_grads;
        SPB_CHECK(*grads == NULL);
        *grads = z->be->alloc(SPB_MEM_GRADS, elems);
        int ks[SPB_TENSORS_PER_LAYER], n = unit_tensors(g, unit, ks);
        for (int i = 0; i < n; i++) spb_gpt_point_tensor(g, ks[i], NULL, *grads + z->work_offset[ks[i]]);
    }
}

static void zero_unit_after(void *ctx, spb_gpt *g, int unit, spb_comm_phase phase)
{
    spb_zero *z = ctx;
    int global = unit == SPB_UNIT_GLOBALS;
    if (phase == SPB_PHASE_BACKWARD && z->stage >= 2) {
        float **grads = global ? &z->global_grads : &z->layer_grads;
        /* This micro-step's share of the K/V replicas' rows, summed before
         * the buffer is reduce-scattered (kv_replicas.h). */
        int ks[SPB_TENSORS_PER_LAYER], n = unit_tensors(g, unit, ks);
        for (int i = 0; i < n; i++) spb_kv_replicas_reduce(g, ks[i], *grads + z->work_offset[ks[i]]);
        reduce_unit(z, g, unit, *grads);
        z->be->free(*grads);
        *grads = NULL;
    }
    /* The globals stay from the start of forward to the end of backward. */
    if (z->stage == 3 && (phase == SPB_PHASE_BACKWARD || !global)) {
        float **params = global ? &z->global_params : &z->layer_params;
        z->be->free(*params);
        *params = NULL;
    }
}

/* Stage 3: each owner initialises its slices, one tensor at a time. */
static void init_slices(spb_zero *z, const spb_gpt *g, uint64_t seed)
{
    long largest = 0;
    for (int k = 0; k < g->num_tensors; k++) largest = g->tensors[k].numel > largest ? g->tensors[k].numel : largest;
    float *whole = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)largest)); /* host */
    for (int k = 0; k < g->num_tensors; k++) {
        spb_zero_class *c = &z->cls[z->tensor_class[k]];
        const spb_zero_segment *sg = &c->segments[z->tensor_segment[k]];
        spb_gpt_init_tensor(g, k, seed, whole);
        spb_backend_to_device(z->be, c->p + sg->packed_lo, whole + (sg->param_offset - g->tensors[k].offset), sg->n);
    }
    free(whole);
}

spb_zero *spb_zero_create(spb_gpt *g, const spb_grid *grid, int stage, uint64_t seed)
{
    SPB_CHECK(stage >= 1 && stage <= 3);
    spb_zero *z = SPB_CHECK_PTR(calloc(1, sizeof *z));
    z->stage = stage;
    z->be = g->be;
    z->tensor_class = SPB_CHECK_PTR(calloc((size_t)g->num_tensors, sizeof(int)));
    z->tensor_segment = SPB_CHECK_PTR(calloc((size_t)g->num_tensors, sizeof(int)));
    z->work_offset = SPB_CHECK_PTR(calloc((size_t)g->num_tensors, sizeof(long)));
    build_class(z, z->num_classes++, g, grid->dpsp_comm);
    if (g->any_split) build_class(z, z->num_classes++, g, grid->dp_comm);
    /* Unit buffers: each tensor padded to its class's slices, so that the
     * allgather lands and the reduce-scatter starts in place. */
    for (int unit = SPB_UNIT_GLOBALS; unit < g->L; unit++) {
        int ks[SPB_TENSORS_PER_LAYER], n = unit_tensors(g, unit, ks);
        long off = 0;
        for (int i = 0; i < n; i++) {
            z->work_offset[ks[i]] = off;
            off += padded_of(z, g, ks[i]);
        }
        if (unit == SPB_UNIT_GLOBALS) z->global_elems = off;
        else z->layer_elems = off;
    }
    if (stage == 3) init_slices(z, g, seed);
    if (stage >= 2) g->hooks = (spb_param_hooks){.ctx = z, .before = zero_unit_before, .after = zero_unit_after};
    return z;
}

void spb_zero_destroy(spb_zero *z)
{
    if (!z) return;
    for (int k = 0; k < z->num_classes; k++) {
        spb_zero_class *c = &z->cls[k];
        float *bufs[] = {c->packed, c->p, c->m, c->v, c->grad, c->reduced};
        for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++) z->be->free(bufs[b]);
        free(c->tensors);
        free(c->segments);
    }
    float *units[] = {z->layer_params, z->global_params, z->layer_grads, z->global_grads};
    for (size_t b = 0; b < sizeof units / sizeof units[0]; b++) z->be->free(units[b]);
    free(z->tensor_class);
    free(z->tensor_segment);
    free(z->work_offset);
    free(z);
}

void spb_zero_begin_gradients(spb_zero *z)
{
    if (z->stage < 2) return; /* stage 1 overwrites its slices */
    for (int k = 0; k < z->num_classes; k++)
        z->be->zero(z->cls[k].grad, z->cls[k].slice);
}

void spb_zero_reduce_gradients(spb_zero *z, const spb_gpt *g)
{
    if (z->stage >= 2) return; /* reduce-scattered unit by unit in backward */
    for (int k = 0; k < z->num_classes; k++) {
        spb_zero_class *c = &z->cls[k];
        for (int i = 0; i < c->num_tensors; i++) {
            const spb_param_tensor *t = &g->tensors[c->tensors[i]];
            const spb_zero_segment *sg = &c->segments[i];
            long slice = slice_of(t->numel, c->size);
            float *mine = c->grad + sg->packed_lo;
            if (c->size == 1) {
                z->be->copy(mine, g->grads + t->offset, t->numel);
                continue;
            }
            /* Padded copy of the tensor's gradient (padding reduces to 0). */
            z->be->copy(c->packed, g->grads + t->offset, t->numel);
            z->be->zero(c->packed + t->numel, slice * c->size - t->numel);
            spb_allreduce_sum_f32(c->packed, slice * c->size, c->comm, SPB_PHASE_GRAD_REDUCE);
            z->be->copy(mine, c->packed + (long)c->rank * slice, slice);
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
        for (int s = 0; s < c->num_tensors; s++) {
            const spb_zero_segment *sg = &c->segments[s];
            const float *grad = c->grad + sg->packed_lo;
            long after = sg->uncounted_lo + sg->uncounted_n; /* uncounted_n = 0: the whole slice */
            sum += z->be->sum_squares(grad, sg->uncounted_n ? sg->uncounted_lo : sg->n);
            if (sg->uncounted_n) sum += z->be->sum_squares(grad + after, sg->n - after);
        }
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
            float *p = z->stage == 3 ? c->p + sg->packed_lo : g->params + sg->param_offset;
            z->be->adamw_apply(p, c->grad + sg->packed_lo, c->m + sg->packed_lo, c->v + sg->packed_lo, sg->n,
                            grad_scale, sg->decay ? (float)cfg->weight_decay : 0.0f, cfg, z->step, lr);
            if (z->stage == 3 || c->size == 1) continue; /* stage 3 gathers before use */
            /* Everyone's updated slice of this tensor to everyone. */
            long slice = slice_of(t->numel, c->size);
            float *send = c->packed + (long)c->rank * slice;
            z->be->zero(send, slice);
            z->be->copy(send, g->params + sg->param_offset, sg->n);
            spb_allgather_f32(send, c->packed, slice, c->comm, SPB_PHASE_ZERO);
            z->be->copy(g->params + t->offset, c->packed, t->numel);
        }
    }
}

static float *state_of(const spb_zero_class *c, spb_zero_state which)
{
    switch (which) {
    case SPB_ZERO_PARAMS: return c->p;
    case SPB_ZERO_M: return c->m;
    case SPB_ZERO_V: return c->v;
    case SPB_ZERO_GRAD: return c->grad;
    }
    return NULL;
}

/* ZeRO 1-2 parameters: every rank holds them whole, but a bf16 table keeps
 * the fp32 masters of a slice only on the rank that updates it (beside its
 * first moment): each slice is read (staging gives the master) on its owner
 * and allgathered in host memory, so a checkpoint carries every master.
 * Plain MPI on host buffers: a checkpoint's transfer, outside the step's
 * accounting. */
static void gather_params_from_owners(const spb_zero *z, const spb_gpt *g, float *local)
{
    spb_backend_to_host(z->be, local, g->params, g->num_params); /* tensors no class holds */
    for (int k = 0; k < z->num_classes; k++) {
        const spb_zero_class *c = &z->cls[k];
        for (int i = 0; i < c->num_tensors; i++) {
            const spb_param_tensor *t = &g->tensors[c->tensors[i]];
            const spb_zero_segment *sg = &c->segments[i];
            long slice = slice_of(t->numel, c->size);
            float *mine = SPB_CHECK_PTR(calloc((size_t)slice, sizeof(float)));
            float *all = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(slice * c->size)));
            if (sg->n > 0) spb_backend_to_host(z->be, mine, g->params + sg->param_offset, sg->n);
            SPB_CHECK(slice <= INT_MAX);
            MPI_Allgather(mine, (int)slice, MPI_FLOAT, all, (int)slice, MPI_FLOAT, c->comm);
            memcpy(local + t->offset, all, sizeof(float) * (size_t)t->numel);
            free(mine);
            free(all);
        }
    }
}

void spb_zero_gather_local(const spb_zero *z, const spb_gpt *g, spb_zero_state which, float *local)
{
    if (which == SPB_ZERO_PARAMS && z->stage < 3) {
        if (z->stage == 0)
            spb_backend_to_host(z->be, local, g->params, g->num_params);
        else
            gather_params_from_owners(z, g, local);
        return;
    }
    for (int k = 0; k < z->num_classes; k++) {
        const spb_zero_class *c = &z->cls[k];
        const float *src = state_of(c, which);
        for (int i = 0; i < c->num_tensors; i++) {
            const spb_param_tensor *t = &g->tensors[c->tensors[i]];
            const spb_zero_segment *sg = &c->segments[i];
            long slice = slice_of(t->numel, c->size);
            /* fp32 whatever the precision: what is gathered is the state itself
             * (under bf16, the parameters' fp32 masters), for checkpoints. */
            float *all = spb_backend_alloc(z->be, SPB_MEM_WORKSPACE, slice * c->size, SPB_BUF_FP32);
            if (c->size > 1)
                spb_allgather_f32(src + sg->packed_lo, all, slice, c->comm, SPB_PHASE_OTHER);
            else
                z->be->copy(all, src + sg->packed_lo, slice);
            spb_backend_to_host(z->be, local + t->offset, all, t->numel);
            z->be->free(all);
        }
    }
}

void spb_zero_scatter_local(spb_zero *z, spb_gpt *g, spb_zero_state which, const float *local)
{
    if (which == SPB_ZERO_PARAMS && z->stage < 3) {
        /* ZeRO 1-2 under bf16: the owned slices' masters are bound beside
         * their first moments at the first update, from the bf16 values;
         * bound now, they take the checkpoint's fp32 values exactly. */
        for (int k = 0; z->stage > 0 && z->be->bind_masters && k < z->num_classes; k++) {
            spb_zero_class *c = &z->cls[k];
            for (int i = 0; i < c->num_tensors; i++) {
                const spb_zero_segment *sg = &c->segments[i];
                z->be->bind_masters(g->params + sg->param_offset, c->m + sg->packed_lo, sg->n);
            }
        }
        spb_backend_to_device(z->be, g->params, local, g->num_params);
        return;
    }
    for (int k = 0; k < z->num_classes; k++) {
        spb_zero_class *c = &z->cls[k];
        float *dst = state_of(c, which);
        for (int i = 0; i < c->num_tensors; i++) {
            const spb_zero_segment *sg = &c->segments[i];
            spb_backend_to_device(z->be, dst + sg->packed_lo, local + sg->param_offset, sg->n);
        }
    }
}

/* --- from the configuration alone ---------------------------------------- */

typedef struct zero_shape {
    int num_tensors;
    spb_param_tensor *tensors;
    int size[2]; /* group sizes of the two classes: D x P, D */
} zero_shape;

static void shape_of(const spb_config *cfg, int world_size, zero_shape *s)
{
    int tp = spb_gpt_config_tp(cfg), P = cfg->sp_degree, D = world_size / P;
    long local, global;
    s->num_tensors = spb_gpt_tensor_table(cfg, tp, NULL, &local, &global);
    s->tensors = SPB_CHECK_PTR(calloc((size_t)s->num_tensors, sizeof *s->tensors));
    spb_gpt_tensor_table(cfg, tp, s->tensors, &local, &global);
    s->size[0] = D * P, s->size[1] = D;
}

void spb_zero_sizes_of(const spb_config *cfg, int world_size, spb_zero_sizes *out)
{
    zero_shape s;
    shape_of(cfg, world_size, &s);
    memset(out, 0, sizeof *out);
    for (int k = 0; k < s.num_tensors; k++) {
        const spb_param_tensor *t = &s.tensors[k];
        int size = s.size[class_of(t)];
        double slice = (double)slice_of(t->numel, size), padded = slice * size;
        out->local += (double)t->numel;
        out->owned += slice;
        if (t->layer == 0) out->layer_elems += padded;
        if (t->layer < 0) out->global_elems += padded;
        if (padded > out->largest_padded_tensor) out->largest_padded_tensor = padded;
        if (slice > out->largest_slice) out->largest_slice = slice;
    }
    free(s.tensors);
}

static void add_item(spb_comm_item *items, int *n, spb_comm_op op, spb_comm_phase phase, spb_group_kind group,
                     int size, double calls, double payload)
{
    if (size <= 1 || calls == 0) return;
    for (int i = 0; i < *n; i++)
        if (items[i].op == op && items[i].phase == phase && items[i].group == group) {
            items[i].calls += calls;
            items[i].payload_bytes += payload;
            items[i].link_bytes += payload * spb_comm_bus_factor(op, size);
            return;
        }
    SPB_CHECK(*n < SPB_ZERO_MAX_ITEMS);
    items[(*n)++] = (spb_comm_item){.op = op, .phase = phase, .group = group, .group_size = size, .calls = calls,
                                    .payload_bytes = payload,
                                    .link_bytes = payload * spb_comm_bus_factor(op, size)};
}

int spb_zero_comm_items(const spb_config *cfg, int world_size, spb_comm_item *items)
{
    zero_shape s;
    shape_of(cfg, world_size, &s);
    const double A = spb_config_accum_steps(cfg, world_size);
    int n = 0;
    for (int k = 0; k < s.num_tensors;) {
        const spb_param_tensor *t = &s.tensors[k];
        int cls = class_of(t), size = s.size[cls];
        spb_group_kind group = cls ? SPB_GROUP_DP : SPB_GROUP_DPSP;
        if (cfg->zero_stage == 0) {
            /* common/core/train.c: consecutive tensors of one class, one all-reduce. */
            int end = k;
            double elems = 0;
            while (end < s.num_tensors && class_of(&s.tensors[end]) == cls) elems += (double)s.tensors[end++].numel;
            add_item(items, &n, SPB_OP_ALLREDUCE, SPB_PHASE_GRAD_REDUCE, group, size, 1, 4.0 * elems);
            k = end;
            continue;
        }
        double padded = 4.0 * (double)slice_of(t->numel, size) * size;
        switch (cfg->zero_stage) {
        case 1:
            add_item(items, &n, SPB_OP_ALLREDUCE, SPB_PHASE_GRAD_REDUCE, group, size, 1, padded);
            add_item(items, &n, SPB_OP_ALLGATHER, SPB_PHASE_ZERO, group, size, 1, padded);
            break;
        case 2:
            add_item(items, &n, SPB_OP_REDUCE_SCATTER, SPB_PHASE_ZERO, group, size, A, A * padded);
            add_item(items, &n, SPB_OP_ALLGATHER, SPB_PHASE_ZERO, group, size, 1, padded);
            break;
        default: {
            /* Layers are gathered for forward and again for backward, the
             * globals once per micro-step. */
            double gathers = (t->layer >= 0 ? 2.0 : 1.0) * A;
            add_item(items, &n, SPB_OP_REDUCE_SCATTER, SPB_PHASE_ZERO, group, size, A, A * padded);
            add_item(items, &n, SPB_OP_ALLGATHER, SPB_PHASE_ZERO, group, size, gathers, gathers * padded);
        }
        }
        k++;
    }
    /* Megatron-SP's K/V replicas (kv_replicas.h): each replicated tensor's
     * k and v rows, all-reduced over its R = TP/G replicas, once per
     * iteration (stages 0-1) or after each micro-step's backward (2-3).
     * Per layer that is 2·D·h floats of qkv_w (+ 2·D of qkv_b), each
     * rank's link carrying 2(R−1)/R of them (docs/STRATEGIES.md). */
    int tp = spb_gpt_config_tp(cfg);
    for (int k = 0; k < s.num_tensors; k++) {
        long lo, span;
        if (!spb_kv_replica_span(&s.tensors[k], tp, &lo, &span)) continue;
        double calls = cfg->zero_stage >= 2 ? A : 1;
        add_item(items, &n, SPB_OP_ALLREDUCE, SPB_PHASE_GRAD_REDUCE, SPB_GROUP_SP, s.tensors[k].kv_replicas, calls,
                 calls * 4.0 * (double)span);
    }
    free(s.tensors);
    return n;
}
