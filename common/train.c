#include "train.h"

#include <math.h>
#include <stdlib.h>

#include "checks.h"
#include "comm.h"
#include "memory.h"
#include "timer.h"

spb_trainer *spb_trainer_create(const spb_config *cfg, const spb_grid *grid)
{
    spb_trainer *t = SPB_CHECK_PTR(calloc(1, sizeof *t));
    t->cfg = *cfg;
    t->grid = grid;
    t->gpt = spb_gpt_create(cfg, grid);
    spb_gpt_init_params(t->gpt, cfg->seed);
    t->opt = spb_adamw_create(t->gpt->num_params);
    t->data = spb_data_open(cfg);
    t->accum_steps = spb_config_accum_steps(cfg, grid->world_size);
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

/* This rank's slice [t_offset, t_offset + T) of each sequence of micro-step a. */
static void load_micro_batch(spb_trainer *t, int a)
{
    spb_gpt *g = t->gpt;
    for (int j = 0; j < g->B; j++) {
        spb_data_sequence(t->data, t->iteration, spb_trainer_sample_index(t, a, j), t->cfg.seq_length, t->seq);
        for (int k = 0; k < g->T; k++) {
            t->inputs[(long)j * g->T + k] = t->seq[g->t_offset + k];
            t->targets[(long)j * g->T + k] = t->seq[g->t_offset + k + 1];
        }
    }
}

double spb_trainer_gradients(spb_trainer *t)
{
    spb_gpt *g = t->gpt;
    const double tokens = (double)t->cfg.global_batch_size * t->cfg.seq_length;
    spb_gpt_zero_grads(g);
    double loss_sum = 0.0;
    for (int a = 0; a < t->accum_steps; a++) {
        double t0 = spb_now();
        load_micro_batch(t, a);
        spb_timer_add(SPB_T_DATA, spb_now() - t0);
        loss_sum += spb_gpt_forward(g, t->inputs, t->targets);
        /* The loss is the mean over every token of the global batch, so each
         * token's gradient is scaled by 1/(G·N) whatever the split. */
        spb_gpt_backward(g, (float)(1.0 / tokens));
    }
    double t0 = spb_now();
    g->strategy->reduce_gradients(t->grid, g->grads, g->num_params);
    spb_timer_add(SPB_T_GRAD_REDUCE, spb_now() - t0);
    spb_allreduce_sum_f64(&loss_sum, 1, t->grid->world, SPB_PHASE_OTHER);
    t->loss = loss_sum / tokens;
    return t->loss;
}

void spb_trainer_update(spb_trainer *t)
{
    double t0 = spb_now();
    spb_gpt *g = t->gpt;
    /* Gradients are replicated after the reduction, so the norm is local. */
    t->grad_norm = sqrt(spb_sum_squares(g->grads, g->num_params));
    float scale = 1.0f;
    if (t->cfg.clip_grad > 0 && t->grad_norm > t->cfg.clip_grad) scale = (float)(t->cfg.clip_grad / t->grad_norm);
    t->lr = spb_lr_at(&t->cfg, t->iteration);
    spb_adamw_update(t->opt, g, &t->cfg, t->lr, scale);
    t->iteration++;
    spb_timer_add(SPB_T_OPTIMIZER, spb_now() - t0);
}

double spb_trainer_step(spb_trainer *t)
{
    double loss = spb_trainer_gradients(t);
    spb_trainer_update(t);
    return loss;
}
