/* The bf16 tables' entries beyond the arithmetic (bf16_ops.h): allocation by
 * role, memory operations (direct under --bf16-kernels fast where the
 * destination has no masters: bf16_direct.h), staging and AdamW on the
 * masters.  Storage placement by category is described in
 * backend_bf16_cpu.c; every transfer goes through the handle storage, so
 * these serve the CPU and the CUDA instance alike. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bf16_frame.h"
#include "bf16_ops.h"
#include "checks.h"
#include "device_handles.h"

static int zero_stage; /* what the core told the table (configure) */

void spb_bf16_configure(const spb_config *cfg)
{
    zero_stage = cfg->zero_stage;
    const int fp16 = !strcmp(cfg->precision, "fp16");
    spb_handles_set_half_format(fp16 ? SPB_HALF_FP16 : SPB_HALF_BF16);
    /* fp16 takes the direct kernels too, except attention (bf16_direct.h) */
    spb_bf16_select_kernels(cfg->bf16_kernels[0] ? cfg->bf16_kernels : "reference");
    char err[256];
    int kinds = spb_bf16_direct_parse_kinds(cfg->bf16_direct, err, sizeof err);
    spb_bf16_direct_set_kinds(kinds < 0 ? SPB_DIRECT_ALL : kinds); /* config.c refused a bad list */
}

float *spb_bf16_alloc_role(spb_mem_category cat, long n, spb_buffer_role role)
{
    /* ZeRO 0 and 3 update whole parameter buffers: their masters sit beside
     * them; ZeRO 1 and 2 update slices of them: beside each first moment. */
    const int whole_updates = zero_stage == 0 || zero_stage == 3;
    spb_dtype type = SPB_DTYPE_HALF;
    int masters = 0;
    if (cat == SPB_MEM_PARAMS) {
        masters = whole_updates;
    } else if (cat == SPB_MEM_OPTIMIZER) {
        type = SPB_DTYPE_F32;
        masters = !whole_updates && role == SPB_BUF_FIRST_MOMENT;
    } else if (role == SPB_BUF_FP32) {
        type = SPB_DTYPE_F32;
    }
    float *p = spb_handle_alloc(cat, n, type);
    if (masters && n > 0) {
        spb_handle *h = spb_handle_find(p, NULL);
        spb_handle_add_shadow(h, SPB_MEM_OPTIMIZER);
        if (cat == SPB_MEM_PARAMS) spb_handle_bind_masters(h, 0, n, h, 0);
    }
    return p;
}

float *spb_bf16_alloc(spb_mem_category cat, long n) { return spb_bf16_alloc_role(cat, n, SPB_BUF_PLAIN); }

int *spb_bf16_alloc_ints(spb_mem_category cat, long n) { return spb_handle_alloc_ints(cat, n); }

/* --- memory operations on storage ------------------------------------------ */

/* The values come from the inner table's fill on scratch, then one write
 * (masters follow it, as any write's). */
void spb_bf16_fill(float *x, long n, float value)
{
    if (n <= 0 || spb_bf16_direct_fill(x, n, value)) return;
    long i = 0;
    spb_handle *h = spb_handle_at(x, n, &i, "fill");
    const spb_handle_storage *st = spb_handles_storage();
    float *v = st->scratch_alloc(sizeof(float) * (size_t)n);
    spb_bf16_inner()->fill(v, n, value);
    spb_bf16_write(h, i, n, v);
    st->scratch_free(v);
}

void spb_bf16_zero(float *x, long n) { spb_bf16_fill(x, n, 0.0f); }

void spb_bf16_copy(float *dst, const float *src, long n)
{
    if (n <= 0 || spb_bf16_direct_copy_rows(dst, n, src, n, 1, n)) return;
    long di = 0, si = 0;
    spb_handle *d = spb_handle_at(dst, n, &di, "copy (dst)");
    const spb_handle *s = spb_handle_at(src, n, &si, "copy (src)");
    const spb_handle_storage *st = spb_handles_storage();
    float *v = st->scratch_alloc(sizeof(float) * (size_t)n);
    spb_bf16_read(s, si, n, v);
    spb_bf16_write(d, di, n, v);
    st->scratch_free(v);
}

void spb_bf16_copy_rows(float *dst, long dst_stride, const float *src, long src_stride, long rows, long width)
{
    long dn = spb_strided_extent(rows, dst_stride, width), sn = spb_strided_extent(rows, src_stride, width);
    if (dn <= 0 || spb_bf16_direct_copy_rows(dst, dst_stride, src, src_stride, rows, width)) return;
    spb_frame f = {0};
    spb_frame_out(&f, &dst, dn, "copy_rows (dst)");
    spb_frame_in(&f, &src, sn, "copy_rows (src)");
    spb_frame_load(&f);
    spb_bf16_inner()->copy_rows(dst, dst_stride, src, src_stride, rows, width);
    spb_frame_store(&f);
}

void spb_bf16_ints_to_device(int *dst, const int *host, long n)
{
    if (n <= 0) return;
    int *store = (int *)spb_bf16_ints(dst, n, "ints_to_device");
    spb_handles_storage()->from_host(store, host, sizeof(int) * (size_t)n);
    spb_bf16_tokens_uploaded(store, host, n); /* the embedding reads them here, not back from the device */
}

/* --- staging: host fp32 <-> storage (comm.h), masters for parameters -------- */

void spb_bf16_to_host(void *host, const void *device, size_t bytes)
{
    SPB_CHECK(bytes % 4 == 0);
    long n = (long)(bytes / 4), i = 0;
    if (!n) return;
    const spb_handle *h = spb_handle_at(device, n, &i, "staging to host");
    if (h->ints)
        spb_handles_storage()->to_host(host, (const int *)h->hi + i, bytes);
    else
        spb_bf16_read_masters(h, i, n, host);
}

void spb_bf16_to_device(void *device, const void *host, size_t bytes)
{
    SPB_CHECK(bytes % 4 == 0);
    long n = (long)(bytes / 4), i = 0;
    if (!n) return;
    spb_handle *h = spb_handle_at(device, n, &i, "staging to device");
    if (h->ints) {
        spb_handles_storage()->from_host((int *)h->hi + i, host, bytes);
        spb_bf16_tokens_forget((const int *)h->hi + i, n);
    }
    else
        spb_bf16_write_masters(h, i, n, host);
}

/* comm.h's device_span: one handle, one storage type over the span, and,
 * when a collective writes it, no fp32 masters bound there (a write must
 * move them: only staging's spb_bf16_write does).  A read of a span with
 * masters sends the stored values, which are the masters rounded once
 * (every write keeps them so): what the staged path's receivers store. */
int spb_bf16_device_span(const void *p, long n, int written, void **storage, spb_comm_dtype *type)
{
    long i = 0;
    spb_handle *h = p && n > 0 ? spb_handle_find(p, &i) : NULL;
    if (!h || h->ints || i + n > h->n) return 0;
    spb_dtype t = spb_handle_dtype(h, i);
    if (spb_handle_dtype(h, i + n - 1) != t) return 0;
    if (written && spb_handle_has_masters(h, i, n)) return 0;
    *storage = spb_handle_resolve(p, NULL);
    *type = t == SPB_DTYPE_F32 ? SPB_COMM_F32
                               : spb_handles_half_format() == SPB_HALF_FP16 ? SPB_COMM_F16 : SPB_COMM_BF16;
    return 1;
}

/* Stored bytes of the element at device (comm.h): what a device-aware
 * library would move for it.  Not a handle (an empty collective): fp32. */
double spb_bf16_element_bytes(const void *device)
{
    long i = 0;
    const spb_handle *h = spb_handle_find(device, &i);
    return h && !h->ints && i < h->split ? 2.0 : 4.0;
}

/* --- AdamW on the masters ------------------------------------------------------ */

/* The masters of p[0, n): bound already, or (ZeRO 1-2) the first moment's
 * shadow, bound now and taken from the parameters' bf16 values. */
static float *masters_of(spb_handle *ph, long pi, const float *m, long n)
{
    float *masters = spb_handle_masters(ph, pi, n);
    if (masters) return masters;
    long mi = 0;
    spb_handle *mh = spb_handle_at(m, n, &mi, "adamw_apply (m)");
    if (!mh->shadow) return NULL;
    spb_bf16_read(ph, pi, n, mh->shadow + mi);
    spb_handle_bind_masters(ph, pi, n, mh, mi);
    return mh->shadow + mi;
}

void spb_bf16_bind_masters(float *p, const float *m, long n)
{
    if (n <= 0) return;
    long pi = 0;
    spb_handle *h = spb_handle_at(p, n, &pi, "bind_masters (p)"); /* sets pi: its own statement */
    masters_of(h, pi, m, n);
}

/* The inner table's AdamW on the fp32 masters (storage-side: they are
 * where the table computes), then their bf16 copy into p. */
void spb_bf16_adamw_apply(float *p, const float *grad, float *m, float *v, long n, float grad_scale,
                          float weight_decay, const spb_config *cfg, long step, double lr)
{
    if (n <= 0) return;
    long pi = 0;
    spb_handle *ph = spb_handle_at(p, n, &pi, "adamw_apply (p)");
    float *masters = masters_of(ph, pi, m, n);
    if (spb_bf16_direct_adamw(masters, p, grad, m, v, n, grad_scale, weight_decay, cfg, step, lr)) return;
    spb_frame f = {0};
    spb_frame_in(&f, &grad, n, "adamw_apply (grad)");
    spb_frame_out(&f, &m, n, "adamw_apply (m)");
    spb_frame_out(&f, &v, n, "adamw_apply (v)");
    if (!masters) spb_frame_out(&f, &p, n, "adamw_apply (p)"); /* no master: the update rounds into p */
    spb_frame_load(&f);
    spb_bf16_inner()->adamw_apply(masters ? masters : p, grad, m, v, n, grad_scale, weight_decay, cfg, step, lr);
    spb_frame_store(&f);
    if (masters) spb_bf16_write(ph, pi, n, masters); /* the bf16 copy of the updated masters */
}
