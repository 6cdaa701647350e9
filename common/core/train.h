/* One training iteration over the grid: gradient accumulation over
 * micro-steps, the strategy's gradient reduction, clipping, AdamW.  Used by
 * the spbench program and by the tests. */
#ifndef SPB_TRAIN_H
#define SPB_TRAIN_H

#include "config.h"
#include "data.h"
#include "gpt.h"
#include "grid.h"
#include "optimizer.h"
#include "zero.h"

typedef struct spb_trainer {
    spb_config cfg;
    const spb_grid *grid;
    spb_gpt *gpt;
    spb_adamw *opt;   /* ZeRO stage 0 */
    spb_zero *zero;   /* ZeRO stages 1-3 (partitioned state) */
    spb_data *data;
    int accum_steps;
    long iteration; /* iterations completed */
    int *seq;       /* T+1 tokens of one sequence */
    int *inputs, *targets; /* [B][local T] */
    /* of the last iteration (grad_norm: of the unscaled gradients; inf or
     * NaN when an fp16 step overflowed and was skipped) */
    double loss, grad_norm, lr;
    int skipped; /* the last update was skipped (fp16 overflow) */
    /* fp16 loss scaling (cfg: --loss-scale, --initial-loss-scale ...): the
     * backward starts from loss_scale x the loss, the update divides it out
     * of the gradients; an overflow (a gradient norm that is not finite)
     * skips the update and, dynamic, halves the scale; loss_scale_window
     * clean steps double it.  Other precisions: loss_scale = 1, never
     * changes. */
    struct {
        int enabled, dynamic;
        double loss_scale;
        long clean_steps, skipped_steps;
    } scaler;
} spb_trainer;

/* Builds the model (initialised from cfg->seed), optimizer and data. */
spb_trainer *spb_trainer_create(const spb_config *cfg, const spb_grid *grid);
void spb_trainer_destroy(spb_trainer *t);

/* Forward and backward over the whole global batch of iteration
 * t->iteration, gradients reduced; returns the global mean loss.  Leaves the
 * parameters untouched (spbench --dump stops here). */
double spb_trainer_gradients(spb_trainer *t);
/* Clips and applies the update for the gradients computed above. */
void spb_trainer_update(spb_trainer *t);
/* gradients + update; returns the loss. */
double spb_trainer_step(spb_trainer *t);
/* The step boundary: waits for the device's queued work and folds the
 * device-timed regions into the phase timers (a no-op on the host). */
void spb_trainer_synchronize(spb_trainer *t);

/* Checkpoints of the model and optimizer state whatever the ZeRO stage
 * (partitioned state is gathered to whole local vectors first).  Both are
 * collective; load sets the iteration to the saved step.  The optimizer
 * state is written when with_optimizer (a dump's checkpoint has none). */
int spb_trainer_save(const spb_trainer *t, const char *path, int with_optimizer, char *err, size_t errlen);
int spb_trainer_load(spb_trainer *t, const char *path, char *err, size_t errlen);
/* This rank's reduced gradients as a whole local vector (after
 * spb_trainer_gradients; collective under ZeRO), unscaled: d loss/d params
 * whatever fp16's loss scale. */
void spb_trainer_local_grads(const spb_trainer *t, float *local);
/* This rank's parameters as a whole local vector (collective under ZeRO 1-3:
 * under ZeRO 1-2 each slice comes from the rank that updates it, with its
 * fp32 master under bf16). */
void spb_trainer_local_params(const spb_trainer *t, float *local);

/* Global sample index of local micro-step a, local sequence j. */
long spb_trainer_sample_index(const spb_trainer *t, int a, int j);

#endif
