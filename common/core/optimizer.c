#include "optimizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "checks.h"
#include "memory.h"

spb_adamw *spb_adamw_create(const spb_gpt *g)
{
    spb_adamw *o = SPB_CHECK_PTR(calloc(1, sizeof *o));
    o->be = g->be;
    o->n = g->num_params;
    o->m = spb_backend_alloc(o->be, SPB_MEM_OPTIMIZER, o->n, SPB_BUF_FIRST_MOMENT);
    o->v = spb_backend_alloc(o->be, SPB_MEM_OPTIMIZER, o->n, SPB_BUF_SECOND_MOMENT);
    return o;
}

void spb_adamw_destroy(spb_adamw *o)
{
    if (!o) return;
    o->be->free(o->m);
    o->be->free(o->v);
    free(o);
}

double spb_lr_at(const spb_config *c, long it)
{
    if (c->lr_warmup_iters > 0 && it < c->lr_warmup_iters) return c->lr * (double)(it + 1) / c->lr_warmup_iters;
    long decay_iters = c->train_iters - c->lr_warmup_iters;
    if (!strcmp(c->lr_decay_style, "constant") || decay_iters <= 0) return c->lr;
    double frac = (double)(it - c->lr_warmup_iters) / (double)decay_iters;
    if (frac > 1.0) frac = 1.0;
    double coeff = !strcmp(c->lr_decay_style, "linear") ? 1.0 - frac : 0.5 * (1.0 + cos(3.14159265358979323846 * frac));
    return c->min_lr + coeff * (c->lr - c->min_lr);
}

double spb_sum_squares(const float *x, long n)
{
    double s = 0.0;
    for (long i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

void spb_adamw_apply(float *p, const float *grad, float *m, float *v, long n, float grad_scale, float weight_decay,
                     const spb_config *cfg, long step, double lr)
{
    const float b1 = (float)cfg->adam_beta1, b2 = (float)cfg->adam_beta2, eps = (float)cfg->adam_eps;
    const float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
    const float flr = (float)lr;
    for (long i = 0; i < n; i++) {
        float gi = grad[i] * grad_scale;
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        float mhat = m[i] / bc1, vhat = v[i] / bc2;
        p[i] -= flr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p[i]);
    }
}

void spb_adamw_update(spb_adamw *o, spb_gpt *g, const spb_config *cfg, double lr, float grad_scale)
{
    SPB_CHECK(o->n == g->num_params);
    o->step++;
    for (int t = 0; t < g->num_tensors; t++) {
        const spb_param_tensor *pt = &g->tensors[t];
        o->be->adamw_apply(g->params + pt->offset, g->grads + pt->offset, o->m + pt->offset, o->v + pt->offset,
                           pt->numel, grad_scale, pt->decay ? (float)cfg->weight_decay : 0.0f, cfg, o->step, lr);
    }
}
