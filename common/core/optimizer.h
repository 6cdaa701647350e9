/* AdamW with decoupled weight decay, global-norm gradient clipping and the
 * learning-rate schedule (Megatron's: linear warm-up, then constant, linear
 * or cosine decay to --min-lr over the remaining iterations). */
#ifndef SPB_OPTIMIZER_H
#define SPB_OPTIMIZER_H

#include "config.h"
#include "gpt.h"

typedef struct spb_adamw {
    const struct spb_backend *be; /* where m and v live: the model's device */
    long n;
    long step; /* updates taken */
    float *m, *v;
} spb_adamw;

/* Moments for g's parameters, on g's device. */
spb_adamw *spb_adamw_create(const spb_gpt *g);
void spb_adamw_destroy(spb_adamw *o);

/* Learning rate of iteration `it` (0-based). */
double spb_lr_at(const spb_config *cfg, long it);

/* Sum of squares of n gradients (in double). */
double spb_sum_squares(const float *x, long n);

/* The AdamW arithmetic on one contiguous run of elements (shared by the
 * plain optimizer and ZeRO's partitioned one, so both give the same bits).
 * step is the update count after this update (>= 1). */
void spb_adamw_apply(float *p, const float *grad, float *m, float *v, long n, float grad_scale, float weight_decay,
                     const spb_config *cfg, long step, double lr);

/* One update of g's parameters from g's gradients times grad_scale (the
 * clipping factor).  Weight decay only on tensors marked decay. */
void spb_adamw_update(spb_adamw *o, spb_gpt *g, const spb_config *cfg, double lr, float grad_scale);

#endif
