#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "checkpoint.h"
#include "checks.h"
#include "kv_replicas.h"
#include "memory.h"
#include "comm.h"
#include "timer.h"

spb_trainer *spb_trainer_create(const spb_config *cfg, const spb_grid *grid)
{
    spb_trainer *t = SPB_CHECK_PTR(calloc(1, sizeof *t));
    t->cfg = *cfg;
    t->grid = grid;
    t->gpt = spb_gpt_create(cfg, grid);
    spb_gpt_init_params(t->gpt, cfg->seed);
    if (cfg->zero_stage == 0)
        t->opt = spb_adamw_create(t->gpt);
    else
        t->zero = spb_zero_create(t->gpt, grid, cfg->zero_stage, cfg->seed);
    t->data = spb_data_open(cfg);
    t->accum_steps = spb_config_accum_steps(cfg, grid->world_size);
    t->scaler.enabled = !strcmp(cfg->precision, "fp16");
    t->scaler.dynamic = t->scaler.enabled && cfg->loss_scale == 0;
    t->scaler.loss_scale = !t->scaler.enabled ? 1.0 : t->scaler.dynamic ? cfg->initial_loss_scale : cfg->loss_scale;
    t->seq = SPB_CHECK_PTR(malloc(sizeof(int) * ((size_t)cfg->seq_length + 1)));
    size_t bt = (size_t)t->gpt->B * t->gpt->T;
    t->inputs = SPB_CHECK_PTR(malloc(sizeof(int) * bt));
    t->targets = SPB_CHECK_PTR(malloc(sizeof(int) * bt));
    return t;
}

void spb_trainer_destroy(spb_trainer *t)
{
    if (!t) return;
    spb_gpt_destroy(t->gpt);
    spb_adamw_destroy(t->opt);
    spb_zero_destroy(t->zero);
    spb_data_close(t->data);
    free(t->seq);
    free(t->inputs);
    free(t->targets);
    free(t);
}

long spb_trainer_sample_index(const spb_trainer *t, int a, int j)
{
    const spb_grid *g = t->grid;
    return ((long)a * g->dp_size + g->dp_rank) * t->cfg.micro_batch_size + j;
}

/* This rank's tokens (at g->positions) of each sequence of micro-step a. */
static void load_micro_batch(spb_trainer *t, int a)
{
    spb_gpt *g = t->gpt;
    for (int j = 0; j < g->B; j++) {
        spb_data_sequence(t->data, t->iteration, spb_trainer_sample_index(t, a, j), t->cfg.seq_length, t->seq);
        for (int k = 0; k < g->T; k++) {
            t->inputs[(long)j * g->T + k] = t->seq[g->positions[k]];
            t->targets[(long)j * g->T + k] = t->seq[g->positions[k] + 1];
        }
    }
}

/* Gradients of replicated tensors are partial sums over the data and
 * sequence ranks (each saw other tokens): summed over D x P.  Shards of a
 * tensor-parallel split are summed over the data-parallel replicas only.
 * Consecutive tensors of the same kind are reduced in place as one run. */
static void reduce_gradients(spb_trainer *t)
{
    spb_gpt *g = t->gpt;
    const spb_grid *grid = t->grid;
    for (int k = 0; k < g->num_tensors;) {
        int replicated = g->tensors[k].split == SPB_REPLICATED, end = k;
        while (end < g->num_tensors && (g->tensors[end].split == SPB_REPLICATED) == replicated) end++;
        MPI_Comm comm = replicated ? grid->dpsp_comm : grid->dp_comm;
        int size;
        MPI_Comm_size(comm, &size);
        long first = g->tensors[k].offset, n = g->tensors[end - 1].offset + g->tensors[end - 1].numel - first;
        if (size > 1) spb_allreduce_sum_f32(g->grads + first, n, comm, SPB_PHASE_GRAD_REDUCE);
        k = end;
    }
}

/* Global gradient norm: replicated tensors count once, shards summed over
 * the tensor-parallel group. */
static void grad_sums_of_squares(const spb_trainer *t, double sums[2])
{
    const spb_gpt *g = t->gpt;
    const spb_backend *be = g->be;
    sums[0] = sums[1] = 0.0; /* replicated, split */
    for (int k = 0; k < g->num_tensors; k++) {
        const spb_param_tensor *pt = &g->tensors[k];
        int split = pt->split != SPB_REPLICATED;
        long numel = pt->numel, lo, n;
        /* Megatron-SP's replicated K/V rows count on one replica only (the rest of the tensor as a split one) */
        if (spb_kv_replica_span(pt, g->tp, &lo, &n) && !spb_kv_replicas_count_here(g)) split = 1, numel = lo;
        /* a device table adds each onto its accumulator (the same additions) instead of reading it back */
        if (be->scalar_defer) be->scalar_defer(split ? SPB_SCALAR_SQ_SPLIT : SPB_SCALAR_SQ_REPLICATED);
        sums[split] += be->sum_squares(g->grads + pt->offset, numel);
    }
    if (be->scalar_defer) be->scalar_defer(-1);
}

/* The sums of squares on the device can make AdamW's clipping scale there,
 * unread: where no fp16 overflow check and no reduction over ranks needs
 * them on the host first. */
static int clip_on_device(const spb_trainer *t)
{
    return t->gpt->be->clip_on_device && !t->zero && !t->scaler.enabled && !t->gpt->any_split;
}

static double global_grad_norm(const spb_trainer *t)
{
    const spb_gpt *g = t->gpt;
    double sums[2];
    grad_sums_of_squares(t, sums);
    if (g->be->scalar_defer) g->be->scalars_take(SPB_SCALAR_SQ_REPLICATED, 2, sums);
    if (g->any_split) spb_allreduce_sum_f64(&sums[1], 1, t->grid->sp_comm, SPB_PHASE_OTHER);
    return sqrt(sums[0] + sums[1]);
}

double spb_trainer_gradients(spb_trainer *t)
{
    spb_gpt *g = t->gpt;
    const double tokens = (double)t->cfg.global_batch_size * t->cfg.seq_length;
    spb_gpt_zero_grads(g);
    if (t->zero) spb_zero_begin_gradients(t->zero);
    double loss_sum = 0.0;
    const int loss_on_device = g->be->scalar_defer != NULL;
    for (int a = 0; a < t->accum_steps; a++) {
        /* Host work only: timed on the host clock (a device clock's two
         * marks would enclose none of it). */
        double t0 = spb_now();
        load_micro_batch(t, a);
        spb_timer_add(SPB_T_DATA, spb_now() - t0);
        /* a device table adds the loss onto its accumulator: no wait in the forward */
        if (loss_on_device) g->be->scalar_defer(SPB_SCALAR_LOSS);
        loss_sum += spb_gpt_forward(g, t->inputs, t->targets);
        if (loss_on_device) g->be->scalar_defer(-1);
        /* The loss is the mean over every token of the global batch, so each
         * token's gradient is scaled by 1/(G·N) whatever the split; fp16
         * multiplies in the loss scale (1 otherwise). */
        spb_gpt_backward(g, (float)(t->scaler.loss_scale / tokens));
    }
    spb_timer_region timed = spb_timer_begin(SPB_T_GRAD_REDUCE);
    /* Megatron-SP's replicated K/V rows, once per iteration while the whole
     * gradient vector exists (ZeRO 2-3 sum them per layer: zero.c). */
    if (!t->zero || t->zero->stage < 2) spb_kv_replicas_reduce_all(g);
    if (t->zero)
        spb_zero_reduce_gradients(t->zero, g);
    else
        reduce_gradients(t);
    spb_timer_end(timed);
    /* the loss was copied out as it was made: this waits for the forward's end only */
    if (loss_on_device) g->be->scalars_take(SPB_SCALAR_LOSS, 1, &loss_sum);
    spb_allreduce_sum_f64(&loss_sum, 1, t->grid->world, SPB_PHASE_OTHER);
    t->loss = loss_sum / tokens;
    return t->loss;
}

void spb_trainer_update(spb_trainer *t)
{
    spb_timer_region timed = spb_timer_begin(SPB_T_OPTIMIZER);
    spb_gpt *g = t->gpt;
    t->lr = spb_lr_at(&t->cfg, t->iteration);
    if (clip_on_device(t)) {
        /* the norm, the clipping and AdamW on the device, then one read of
         * the norm behind AdamW's kernels: the step waits for nothing it
         * has not queued */
        double sums[2];
        grad_sums_of_squares(t, sums);
        g->be->clip_on_device(t->cfg.clip_grad, t->scaler.loss_scale);
        spb_adamw_update(t->opt, g, &t->cfg, t->lr, 1.0f /* ignored: the device's scale */);
        g->be->scalars_take(SPB_SCALAR_SQ_REPLICATED, 2, sums);
        t->grad_norm = sqrt(sums[0] + sums[1]) / t->scaler.loss_scale;
        t->skipped = 0;
        t->iteration++;
        spb_timer_end(timed);
        return;
    }
    const double scaled_norm = t->zero ? spb_zero_grad_norm(t->zero, t->grid->world) : global_grad_norm(t);
    t->skipped = t->scaler.enabled && !isfinite(scaled_norm);
    if (t->skipped) {
        /* An fp16 gradient overflowed: no update (AdamW's step count stays),
         * a smaller scale for the next iteration.  Every rank saw the same
         * norm (it is reduced), so every rank skips. */
        t->grad_norm = scaled_norm;
        t->scaler.skipped_steps++;
        t->scaler.clean_steps = 0;
        if (t->scaler.dynamic) t->scaler.loss_scale = fmax(t->scaler.loss_scale / 2, t->cfg.min_loss_scale);
        t->iteration++;
        spb_timer_end(timed);
        return;
    }
    t->grad_norm = scaled_norm / t->scaler.loss_scale;
    double clip = 1.0;
    if (t->cfg.clip_grad > 0 && t->grad_norm > t->cfg.clip_grad) clip = t->cfg.clip_grad / t->grad_norm;
    const float scale = (float)(clip / t->scaler.loss_scale); /* AdamW's grad_scale: clipping, unscaling */
    if (t->zero)
        spb_zero_update(t->zero, g, &t->cfg, t->lr, scale);
    else
        spb_adamw_update(t->opt, g, &t->cfg, t->lr, scale);
    if (t->scaler.dynamic && ++t->scaler.clean_steps >= t->cfg.loss_scale_window) {
        t->scaler.loss_scale *= 2;
        t->scaler.clean_steps = 0;
    }
    t->iteration++;
    spb_timer_end(timed);
}

void spb_trainer_synchronize(spb_trainer *t)
{
    if (t->gpt->be->synchronize) t->gpt->be->synchronize();
    spb_timer_flush();
    spb_comm_flush(); /* device collectives' event times (--comm nccl) */
}

double spb_trainer_step(spb_trainer *t)
{
    double loss = spb_trainer_gradients(t);
    spb_trainer_update(t);
    return loss;
}

static float *local_vector(const spb_trainer *t)
{
    return spb_mem_alloc(SPB_MEM_WORKSPACE, sizeof(float) * (size_t)t->gpt->num_params);
}

/* A whole local vector of the model's device into host memory and back. */
static void to_host(const spb_trainer *t, float *host, const float *dev)
{
    spb_backend_to_host(t->gpt->be, host, dev, t->gpt->num_params);
}

static void to_device(const spb_trainer *t, float *dev, const float *host)
{
    spb_backend_to_device(t->gpt->be, dev, host, t->gpt->num_params);
}

void spb_trainer_local_params(const spb_trainer *t, float *local)
{
    if (t->zero)
        spb_zero_gather_local(t->zero, t->gpt, SPB_ZERO_PARAMS, local);
    else
        to_host(t, local, t->gpt->params);
}

void spb_trainer_local_grads(const spb_trainer *t, float *local)
{
    if (t->zero)
        spb_zero_gather_local(t->zero, t->gpt, SPB_ZERO_GRAD, local);
    else
        to_host(t, local, t->gpt->grads);
    /* fp16: the buffers hold loss_scale x the gradients */
    if (t->scaler.loss_scale != 1.0)
        for (long i = 0; i < t->gpt->num_params; i++) local[i] = (float)(local[i] / t->scaler.loss_scale);
}

int spb_trainer_save(const spb_trainer *t, const char *path, int with_optimizer, char *err, size_t errlen)
{
    float *p = local_vector(t), *m = NULL, *v = NULL;
    spb_trainer_local_params(t, p);
    if (with_optimizer) {
        m = local_vector(t), v = local_vector(t);
        if (t->zero) {
            spb_zero_gather_local(t->zero, t->gpt, SPB_ZERO_M, m);
            spb_zero_gather_local(t->zero, t->gpt, SPB_ZERO_V, v);
        } else {
            to_host(t, m, t->opt->m);
            to_host(t, v, t->opt->v);
        }
    }
    spb_checkpoint_state state = {t->zero ? t->zero->step : t->opt->step, t->scaler.loss_scale,
                                  t->scaler.clean_steps, t->scaler.skipped_steps};
    int rc = spb_checkpoint_save(path, &t->cfg, t->gpt, p, m, v, t->iteration, &state, err, errlen);
    spb_mem_free(p);
    spb_mem_free(m);
    spb_mem_free(v);
    return rc;
}

int spb_trainer_load(spb_trainer *t, const char *path, char *err, size_t errlen)
{
    long step = 0;
    int has_optimizer = 0;
    /* Whole local vectors in host memory, then to the model's device (or
     * to the ZeRO slices). */
    float *p = local_vector(t), *m = local_vector(t), *v = local_vector(t);
    spb_checkpoint_state state;
    int rc = spb_checkpoint_load(path, &t->cfg, t->gpt, p, m, v, &step, &has_optimizer, &state, err, errlen);
    if (!rc && state.loss_scale > 0 && t->scaler.enabled) { /* fp16: the scaler goes on where it was */
        t->scaler.loss_scale = state.loss_scale;
        t->scaler.clean_steps = state.clean_steps;
        t->scaler.skipped_steps = state.skipped_steps;
    }
    if (!rc && t->zero) {
        spb_zero_scatter_local(t->zero, t->gpt, SPB_ZERO_PARAMS, p);
        if (has_optimizer) {
            spb_zero_scatter_local(t->zero, t->gpt, SPB_ZERO_M, m);
            spb_zero_scatter_local(t->zero, t->gpt, SPB_ZERO_V, v);
            t->zero->step = state.optimizer_step;
        }
    } else if (!rc) {
        to_device(t, t->gpt->params, p);
        if (has_optimizer) {
            to_device(t, t->opt->m, m);
            to_device(t, t->opt->v, v);
            t->opt->step = state.optimizer_step;
        }
    }
    spb_mem_free(p);
    spb_mem_free(m);
    spb_mem_free(v);
    if (!rc) t->iteration = step;
    return rc;
}
