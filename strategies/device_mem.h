/* Memory operations of the strategies on the buffers the core hands them:
 * through the core's device table (common/core/backend.h) when the context
 * names one, else on host memory (unit tests build contexts by hand). */
#ifndef SPB_STRATEGIES_DEVICE_MEM_H
#define SPB_STRATEGIES_DEVICE_MEM_H

#include <string.h>

#include "backend.h"
#include "memory.h"
#include "strategy.h"

static inline float *spb_dev_alloc(const spb_attn_ctx *c, spb_mem_category cat, long n)
{
    return c->device ? c->device->alloc(cat, n) : spb_mem_alloc(cat, sizeof(float) * (size_t)n);
}

/* A buffer of a role (backend.h): log-sum-exp buffers are SPB_BUF_FP32. */
static inline float *spb_dev_alloc_role(const spb_attn_ctx *c, spb_mem_category cat, long n, spb_buffer_role role)
{
    return c->device ? spb_backend_alloc(c->device, cat, n, role) : spb_mem_alloc(cat, sizeof(float) * (size_t)n);
}

static inline void spb_dev_free(const spb_attn_ctx *c, float *p)
{
    if (c->device)
        c->device->free(p);
    else
        spb_mem_free(p);
}

static inline void spb_dev_copy(const spb_attn_ctx *c, float *dst, const float *src, long n)
{
    if (c->device)
        c->device->copy(dst, src, n);
    else
        memcpy(dst, src, sizeof(float) * (size_t)n);
}

static inline void spb_dev_zero(const spb_attn_ctx *c, float *x, long n)
{
    if (c->device)
        c->device->zero(x, n);
    else
        memset(x, 0, sizeof(float) * (size_t)n);
}

static inline void spb_dev_copy_rows(const spb_attn_ctx *c, float *dst, long dst_stride, const float *src,
                                     long src_stride, long rows, long width)
{
    if (c->device) {
        c->device->copy_rows(dst, dst_stride, src, src_stride, rows, width);
        return;
    }
    for (long r = 0; r < rows; r++) memcpy(dst + r * dst_stride, src + r * src_stride, sizeof(float) * (size_t)width);
}

static inline void spb_dev_fill(const spb_attn_ctx *c, float *x, long n, float value)
{
    if (c->device) {
        c->device->fill(x, n, value);
        return;
    }
    for (long i = 0; i < n; i++) x[i] = value;
}

static inline void spb_dev_add(const spb_attn_ctx *c, float *a, const float *b, long n)
{
    if (c->device) {
        c->device->add_inplace(a, b, n);
        return;
    }
    for (long i = 0; i < n; i++) a[i] += b[i];
}

static inline void spb_dev_attn_merge(const spb_attn_ctx *c, float *o_acc, float *lse_acc, const float *o_pair,
                                      const float *lse_pair, int row, int len)
{
    (c->device ? c->device->attn_merge : spb_attn_merge_rows)(o_acc, lse_acc, o_pair, lse_pair, c->batch, c->heads,
                                                               c->head_dim, c->tokens, row, len);
}

/* A buffer kept from call to call on one device, grown when a call needs
 * more (a fresh allocation zeroes its block, a pass the caller does not
 * need); reallocated when the device changes. */
typedef struct spb_dev_cache {
    float *p;
    long cap;
    const struct spb_backend *device;
} spb_dev_cache;

static inline float *spb_dev_cached(const spb_attn_ctx *c, spb_dev_cache *slot, spb_mem_category cat, long n)
{
    if (!slot->p || slot->cap < n || slot->device != c->device) {
        if (slot->p) {
            spb_attn_ctx owner = *c;
            owner.device = slot->device;
            spb_dev_free(&owner, slot->p);
        }
        slot->p = spb_dev_alloc(c, cat, n);
        slot->cap = n;
        slot->device = c->device;
    }
    return slot->p;
}

#endif
