/* Mixed precision emulated on the CPU ("cpu-bf16", --device cpu --precision
 * bf16): the GPT core runs unchanged while its buffers hold what a bf16 GPU
 * run holds, so the memory model's SPB_BF16_MIXED figures and the numerical
 * effect of bf16 storage can be checked without a GPU.
 *
 * Buffers are handles (device_handles.h): the core cannot touch them, and
 * every operation resolves them, computes in fp32 through the inner table
 * spb_backend_cpu (ops_cpu.c, the attention kernels) and rounds its outputs
 * once (bf16_ops.c; the other entries are bf16_table.c's, shared with the
 * CUDA instance, common/cuda/backend_bf16_cuda.c).  Storage by category,
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
#include "backend.h"
#include "bf16_ops.h"

/* This instance: the CPU's fp32 table on host storage; its direct kernels
 * (--bf16-kernels fast) emulate the GPU's (bf16_direct_cpu.c). */
static void cpu_bf16_configure(const spb_config *cfg)
{
    spb_bf16_use(&spb_backend_cpu, NULL, &spb_bf16_direct_cpu);
    spb_bf16_configure(cfg);
}

#define CPU_HALF_TABLE(table_name)                                                                                   \
    {                                                                                                                  \
        .name = table_name, .host_memory = 0,                                                                          \
        .staging = {.to_host = spb_bf16_to_host,                                                                       \
                    .to_device = spb_bf16_to_device,                                                                   \
                    .element_bytes = spb_bf16_element_bytes,                                                          \
                    .device_span = spb_bf16_device_span},                                                          \
        .mem_stats = spb_mem_get_stats, .mem_reset_peaks = spb_mem_reset_peaks, .configure = cpu_bf16_configure,       \
        SPB_BF16_TABLE_OPS,                                                                                            \
    }

/* One design, two 16-bit formats: spb_bf16_configure takes the format from
 * --precision. */
const spb_backend spb_backend_cpu_bf16 = CPU_HALF_TABLE("cpu-bf16");
const spb_backend spb_backend_cpu_fp16 = CPU_HALF_TABLE("cpu-fp16");
