/* The CPU's table of device operations: ops_cpu.c's fp32 functions and the
 * tracked host allocator. */
#include <string.h>

#include "attention.h"
#include "backend.h"
#include "ops.h"
#include "optimizer.h"

static float *cpu_alloc(spb_mem_category cat, long n) { return spb_mem_alloc(cat, sizeof(float) * (size_t)n); }
static int *cpu_alloc_ints(spb_mem_category cat, long n) { return spb_mem_alloc(cat, sizeof(int) * (size_t)n); }
static void cpu_zero(float *x, long n) { memset(x, 0, sizeof(float) * (size_t)n); }
static void cpu_copy(float *dst, const float *src, long n) { memcpy(dst, src, sizeof(float) * (size_t)n); }
static void cpu_copy_rows(float *dst, long dst_stride, const float *src, long src_stride, long rows, long width)
{
    for (long r = 0; r < rows; r++) memcpy(dst + r * dst_stride, src + r * src_stride, sizeof(float) * (size_t)width);
}
static void cpu_fill(float *x, long n, float value)
{
    for (long i = 0; i < n; i++) x[i] = value;
}
static void cpu_ints_to_device(int *dst, const int *host, long n) { memcpy(dst, host, sizeof(int) * (size_t)n); }

static void cpu_add_bias_rows(float *x, const float *b, long rows, int C)
{
    for (long r = 0; r < rows; r++) spb_add_inplace(x + r * C, b, C);
}

static void cpu_bias_grad_rows(float *db, const float *dy, long rows, int C)
{
    for (long r = 0; r < rows; r++) spb_add_inplace(db, dy + r * C, C);
}

const spb_backend spb_backend_cpu = {
    .name = "cpu",
    .host_memory = 1,
    .mem_stats = spb_mem_get_stats,
    .mem_reset_peaks = spb_mem_reset_peaks,
    .attention = spb_attn_backend_by_name,
    .alloc = cpu_alloc,
    .alloc_ints = cpu_alloc_ints,
    .free = spb_mem_free,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .copy_rows = cpu_copy_rows,
    .fill = cpu_fill,
    .ints_to_device = cpu_ints_to_device,
    .matmul_forward = spb_matmul_forward,
    .matmul_backward = spb_matmul_backward,
    .matmul_forward_ld = spb_matmul_forward_ld,
    .matmul_backward_ld = spb_matmul_backward_ld,
    .layernorm_forward = spb_layernorm_forward,
    .layernorm_backward = spb_layernorm_backward,
    .rmsnorm_forward = spb_rmsnorm_forward,
    .rmsnorm_backward = spb_rmsnorm_backward,
    .swiglu_forward = spb_swiglu_forward,
    .swiglu_backward = spb_swiglu_backward,
    .rope_apply = spb_rope_apply,
    .gelu_forward = spb_gelu_forward,
    .gelu_backward = spb_gelu_backward,
    .embedding_forward = spb_embedding_forward,
    .embedding_backward = spb_embedding_backward,
    .softmax_xent_forward = spb_softmax_xent_forward,
    .softmax_xent_backward = spb_softmax_xent_backward,
    .add_inplace = spb_add_inplace,
    .add_bias_rows = cpu_add_bias_rows,
    .bias_grad_rows = cpu_bias_grad_rows,
    .adamw_apply = spb_adamw_apply,
    .sum_squares = spb_sum_squares,
    .attn_merge = spb_attn_merge_rows,
};
