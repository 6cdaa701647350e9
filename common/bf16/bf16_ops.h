/* The bf16 tables' operations (backend.h's contracts, ops.h's arithmetic),
 * shared by every instance: each loads its arguments' storage as fp32
 * copies (exact, bf16_frame.h), runs the instance's INNER fp32 table's entry
 * on them (fp32 accumulation in every sum and product: ops_cpu.c for
 * cpu-bf16, the fp32 CUDA table for cuda-bf16) and rounds what it wrote
 * once, to the storage's type.  An instance is an inner table plus the
 * handle storage its frames live in (device_handles.h); one is in use per
 * process, as the handle registry is one per process. */
#ifndef SPB_BF16_OPS_H
#define SPB_BF16_OPS_H

#include "attention.h"
#include "backend.h"
#include "bf16_direct.h"
#include "device_handles.h"

/* Selects the instance: fp32_table computes, storage holds (NULL: host),
 * direct are its direct kernels (bf16_direct.h; NULL: none).  Dies when the
 * storage changes while buffers are alive.  The default is cpu-bf16's:
 * spb_backend_cpu on host storage, spb_bf16_direct_cpu. */
void spb_bf16_use(const spb_backend *fp32_table, const spb_handle_storage *storage, const spb_bf16_direct *direct);
/* --bf16-kernels: "fast" turns the instance's direct kernels on, anything
 * else ("reference") leaves every operation to the frames. */
void spb_bf16_select_kernels(const char *kernels);
const spb_backend *spb_bf16_inner(void);

/* --- table entries beyond the arithmetic (bf16_table.c) --- */
/* Remembers the ZeRO stage (where masters live) from the run's configuration. */
void spb_bf16_configure(const spb_config *cfg);
float *spb_bf16_alloc_role(spb_mem_category cat, long n, spb_buffer_role role);
float *spb_bf16_alloc(spb_mem_category cat, long n);
int *spb_bf16_alloc_ints(spb_mem_category cat, long n);
void spb_bf16_fill(float *x, long n, float value);
void spb_bf16_zero(float *x, long n);
void spb_bf16_copy(float *dst, const float *src, long n);
void spb_bf16_copy_rows(float *dst, long dst_stride, const float *src, long src_stride, long rows, long width);
void spb_bf16_ints_to_device(int *dst, const int *host, long n);
/* comm.h's staging hooks: host fp32 <-> storage, masters for parameters */
void spb_bf16_to_host(void *host, const void *device, size_t bytes);
void spb_bf16_to_device(void *device, const void *host, size_t bytes);
double spb_bf16_element_bytes(const void *device);
int spb_bf16_device_span(const void *p, long n, int written, void **storage, spb_comm_dtype *type);
void spb_bf16_adamw_apply(float *p, const float *grad, float *m, float *v, long n, float grad_scale,
                          float weight_decay, const spb_config *cfg, long step, double lr);
void spb_bf16_bind_masters(float *p, const float *m, long n);

/* --- arithmetic (bf16_ops.c) --- */

void spb_bf16_matmul_forward(float *out, const float *inp, const float *W, const float *b, int rows, int in,
                             int out_f);
void spb_bf16_matmul_backward(float *dinp, float *dW, float *db, const float *dout, const float *inp,
                              const float *W, int rows, int in, int out_f, int accumulate_dinp);
void spb_bf16_matmul_forward_ld(float *out, int ldo, const float *inp, int ldi, const float *W, int ldw,
                                const float *b, int rows, int in, int out_f, int accumulate);
void spb_bf16_matmul_backward_ld(float *dinp, int lddi, float *dW, int lddw, float *db, const float *dout, int ldo,
                                 const float *inp, int ldi, const float *W, int ldw, int rows, int in, int out_f,
                                 int accumulate_dinp);
void spb_bf16_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                const float *b, int rows, int C);
void spb_bf16_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, const float *mean, const float *rstd, int rows, int C);
void spb_bf16_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int rows, int C);
void spb_bf16_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                               const float *rstd, int rows, int C);
void spb_bf16_swiglu_forward(float *out, const float *inp, int rows, int F);
void spb_bf16_swiglu_backward(float *dinp, const float *inp, const float *dout, int rows, int F);
void spb_bf16_rope_apply(float *x, const long *positions, int batch, int tokens, long token_stride,
                         long batch_stride, int heads, int head_dim, double base, int inverse);
void spb_bf16_gelu_forward(float *out, const float *inp, long n);
void spb_bf16_gelu_backward(float *dinp, const float *inp, const float *dout, long n);
void spb_bf16_embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                                const long *positions, int rows, int T, int C);
void spb_bf16_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                                 const long *positions, int rows, int T, int C);
double spb_bf16_softmax_xent_forward(float *probs, const int *targets, int rows, int V);
void spb_bf16_softmax_xent_backward(float *probs, const int *targets, int rows, int V, float scale);
void spb_bf16_add_inplace(float *a, const float *b, long n);
void spb_bf16_add_bias_rows(float *x, const float *b, long rows, int C);
void spb_bf16_bias_grad_rows(float *db, const float *dy, long rows, int C);
double spb_bf16_sum_squares(const float *x, long n);
void spb_bf16_attn_merge(float *o_acc, float *lse_acc, const float *o_pair, const float *lse_pair, int batch,
                         int heads, int head_dim, int T, int row, int len);
/* The inner table's attention kernel of that name behind handle resolution
 * (its log-sum-exp output stays fp32), or NULL. */
const spb_attn_backend *spb_bf16_attention(const char *name);

/* The entries every bf16 table shares (designated initialisers for a
 * `const spb_backend`): each instance adds its name, staging, device and
 * configure entries (backend_bf16_cpu.c, cuda/backend_bf16_cuda.c). */
#define SPB_BF16_TABLE_OPS                                                                                             \
    .attention = spb_bf16_attention, .alloc = spb_bf16_alloc, .alloc_role = spb_bf16_alloc_role,                       \
    .alloc_ints = spb_bf16_alloc_ints, .free = spb_handle_free, .zero = spb_bf16_zero, .copy = spb_bf16_copy,          \
    .copy_rows = spb_bf16_copy_rows, .fill = spb_bf16_fill, .ints_to_device = spb_bf16_ints_to_device,                 \
    .matmul_forward = spb_bf16_matmul_forward, .matmul_backward = spb_bf16_matmul_backward,                            \
    .matmul_forward_ld = spb_bf16_matmul_forward_ld, .matmul_backward_ld = spb_bf16_matmul_backward_ld,                \
    .layernorm_forward = spb_bf16_layernorm_forward, .layernorm_backward = spb_bf16_layernorm_backward,                \
    .rmsnorm_forward = spb_bf16_rmsnorm_forward, .rmsnorm_backward = spb_bf16_rmsnorm_backward,                        \
    .swiglu_forward = spb_bf16_swiglu_forward, .swiglu_backward = spb_bf16_swiglu_backward,                            \
    .rope_apply = spb_bf16_rope_apply,                                                                                 \
    .gelu_forward = spb_bf16_gelu_forward, .gelu_backward = spb_bf16_gelu_backward,                                    \
    .embedding_forward = spb_bf16_embedding_forward, .embedding_backward = spb_bf16_embedding_backward,                \
    .softmax_xent_forward = spb_bf16_softmax_xent_forward, .softmax_xent_backward = spb_bf16_softmax_xent_backward,    \
    .add_inplace = spb_bf16_add_inplace, .add_bias_rows = spb_bf16_add_bias_rows,                                      \
    .bias_grad_rows = spb_bf16_bias_grad_rows, .adamw_apply = spb_bf16_adamw_apply,                                    \
    .bind_masters = spb_bf16_bind_masters,                                                                             \
    .sum_squares = spb_bf16_sum_squares, .attn_merge = spb_bf16_attn_merge

#endif
