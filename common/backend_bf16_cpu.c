/* Mixed precision emulated on the CPU ("cpu-bf16", --device cpu --precision
 * bf16): the GPT core runs unchanged while its buffers hold what a bf16 GPU
 * run holds, so the memory model's SPB_BF16_MIXED figures and the numerical
 * effect of bf16 storage can be checked without a GPU.
 *
 * Buffers are handles (device_handles.h): the core cannot touch them, and
 * every operation resolves them, computes in fp32 (ops_cpu.c, the attention
 * kernels) and rounds its outputs once (bf16_ops.c).  Storage by category,
 * as memory_model.c counts it:
 *
 *   parameters     bf16, with fp32 masters (counted as optimizer state):
 *                  ZeRO 0 and 3 beside each parameter buffer (which is then
 *                  exactly what the optimizer updates); ZeRO 1 and 2, whose
 *                  whole parameter vector is updated slice by slice, beside
 *                  each first-moment buffer, bound to the parameter slice its
 *                  first update names and taken from that slice's bf16 values
 *                  (as Megatron-LM and DeepSpeed build their masters from the
 *                  bf16 model; the role SPB_BUF_FIRST_MOMENT names it)
 *   gradients      bf16; ZeRO's reduced slices fp32 (they accumulate over
 *                  micro-steps and feed the optimizer; zero.c allocates them
 *                  with the role SPB_BUF_FP32)
 *   optimizer      fp32 (AdamW moments, masters)
 *   activations,   bf16, except values that must stay fp32: buffers
 *   workspace,     allocated with the role SPB_BUF_FP32 (ring attention's
 *   communication  log-sum-exp, ZeRO's checkpoint gathers), and LayerNorm
 *                  means and reciprocal deviations and attention log-sum-exp,
 *                  outputs the operations' contracts make fp32: they turn
 *                  their buffer's tail fp32 when first written (Ulysses'
 *                  saved buffer: bf16 QKV and O, then an fp32 log-sum-exp)
 *
 * host_memory = 0: collectives stage through host fp32 (comm.h), so MPI sums
 * in fp32 and each result is rounded once into its buffer.  Staging reads a
 * parameter's master where it has one and writes masters exactly, so
 * checkpoints carry fp32 parameters. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bf16_frame.h"
#include "bf16_ops.h"
#include "checks.h"
#include "device_handles.h"
#include "optimizer.h"

static int zero_stage; /* what the core told the table (configure) */

static void bf_configure(const spb_config *cfg) { zero_stage = cfg->zero_stage; }

static float *bf_alloc_role(spb_mem_category cat, long n, spb_buffer_role role)
{
    /* ZeRO 0 and 3 update whole parameter buffers: their masters sit beside
     * them; ZeRO 1 and 2 update slices of them: beside each first moment. */
    const int whole_updates = zero_stage == 0 || zero_stage == 3;
    spb_dtype type = SPB_DTYPE_BF16;
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

static float *bf_alloc(spb_mem_category cat, long n) { return bf_alloc_role(cat, n, SPB_BUF_PLAIN); }

static int *bf_alloc_ints(spb_mem_category cat, long n) { return spb_handle_alloc_ints(cat, n); }

/* --- memory operations on storage ------------------------------------------ */

static void bf_fill(float *x, long n, float value)
{
    if (n <= 0) return;
    long i = 0;
    spb_handle *h = spb_handle_at(x, n, &i, "fill");
    float *v = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)n));
    for (long k = 0; k < n; k++) v[k] = value;
    spb_bf16_write(h, i, n, v);
    free(v);
}

static void bf_zero(float *x, long n) { bf_fill(x, n, 0.0f); }

static void bf_copy(float *dst, const float *src, long n)
{
    if (n <= 0) return;
    long di = 0, si = 0;
    spb_handle *d = spb_handle_at(dst, n, &di, "copy (dst)");
    const spb_handle *s = spb_handle_at(src, n, &si, "copy (src)");
    float *v = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)n));
    spb_bf16_read(s, si, n, v);
    spb_bf16_write(d, di, n, v);
    free(v);
}

static void bf_copy_rows(float *dst, long dst_stride, const float *src, long src_stride, long rows, long width)
{
    long dn = spb_strided_extent(rows, dst_stride, width), sn = spb_strided_extent(rows, src_stride, width);
    if (dn <= 0) return;
    spb_frame f = {0};
    spb_frame_out(&f, &dst, dn, "copy_rows (dst)");
    spb_frame_in(&f, &src, sn, "copy_rows (src)");
    spb_frame_load(&f);
    for (long r = 0; r < rows; r++) memmove(dst + r * dst_stride, src + r * src_stride, sizeof(float) * (size_t)width);
    spb_frame_store(&f);
}

static void bf_ints_to_device(int *dst, const int *host, long n)
{
    if (n <= 0) return;
    int *store = (int *)spb_bf16_ints(dst, n, "ints_to_device");
    memcpy(store, host, sizeof(int) * (size_t)n);
    spb_handle_find(dst, NULL)->written = 1;
}

/* --- staging: host fp32 <-> storage (comm.h), masters for parameters -------- */

static void bf_to_host(void *host, const void *device, size_t bytes)
{
    SPB_CHECK(bytes % 4 == 0);
    long n = (long)(bytes / 4), i = 0;
    if (!n) return;
    const spb_handle *h = spb_handle_at(device, n, &i, "staging to host");
    if (h->ints)
        memcpy(host, (const int *)h->hi + i, bytes);
    else
        spb_bf16_read_masters(h, i, n, host);
}

static void bf_to_device(void *device, const void *host, size_t bytes)
{
    SPB_CHECK(bytes % 4 == 0);
    long n = (long)(bytes / 4), i = 0;
    if (!n) return;
    spb_handle *h = spb_handle_at(device, n, &i, "staging to device");
    if (h->ints) {
        memcpy((int *)h->hi + i, host, bytes);
        h->written = 1;
    } else {
        spb_bf16_write_masters(h, i, n, host);
    }
}

/* Stored bytes of the element at device (comm.h): what a device-aware
 * library would move for it.  Not a handle (an empty collective): fp32. */
static double bf_element_bytes(const void *device)
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

static void bf_adamw_apply(float *p, const float *grad, float *m, float *v, long n, float grad_scale,
                           float weight_decay, const spb_config *cfg, long step, double lr)
{
    if (n <= 0) return;
    long pi = 0;
    spb_handle *ph = spb_handle_at(p, n, &pi, "adamw_apply (p)");
    float *masters = masters_of(ph, pi, m, n);
    spb_frame f = {0};
    spb_frame_in(&f, &grad, n, "adamw_apply (grad)");
    spb_frame_out(&f, &m, n, "adamw_apply (m)");
    spb_frame_out(&f, &v, n, "adamw_apply (v)");
    if (!masters) spb_frame_out(&f, &p, n, "adamw_apply (p)"); /* no master: the update rounds into p */
    spb_frame_load(&f);
    spb_adamw_apply(masters ? masters : p, grad, m, v, n, grad_scale, weight_decay, cfg, step, lr);
    spb_frame_store(&f);
    if (masters) spb_bf16_write(ph, pi, n, masters); /* the bf16 copy of the updated masters */
}

const spb_backend spb_backend_cpu_bf16 = {
    .name = "cpu-bf16",
    .host_memory = 0,
    .staging = {.to_host = bf_to_host, .to_device = bf_to_device, .element_bytes = bf_element_bytes},
    .mem_stats = spb_mem_get_stats,
    .mem_reset_peaks = spb_mem_reset_peaks,
    .configure = bf_configure,
    .attention = spb_bf16_attention,
    .alloc = bf_alloc,
    .alloc_role = bf_alloc_role,
    .alloc_ints = bf_alloc_ints,
    .free = spb_handle_free,
    .zero = bf_zero,
    .copy = bf_copy,
    .copy_rows = bf_copy_rows,
    .fill = bf_fill,
    .ints_to_device = bf_ints_to_device,
    .matmul_forward = spb_bf16_matmul_forward,
    .matmul_backward = spb_bf16_matmul_backward,
    .matmul_forward_ld = spb_bf16_matmul_forward_ld,
    .matmul_backward_ld = spb_bf16_matmul_backward_ld,
    .layernorm_forward = spb_bf16_layernorm_forward,
    .layernorm_backward = spb_bf16_layernorm_backward,
    .gelu_forward = spb_bf16_gelu_forward,
    .gelu_backward = spb_bf16_gelu_backward,
    .embedding_forward = spb_bf16_embedding_forward,
    .embedding_backward = spb_bf16_embedding_backward,
    .softmax_xent_forward = spb_bf16_softmax_xent_forward,
    .softmax_xent_backward = spb_bf16_softmax_xent_backward,
    .add_inplace = spb_bf16_add_inplace,
    .add_bias_rows = spb_bf16_add_bias_rows,
    .bias_grad_rows = spb_bf16_bias_grad_rows,
    .adamw_apply = bf_adamw_apply,
    .sum_squares = spb_bf16_sum_squares,
    .attn_merge = spb_bf16_attn_merge,
};
