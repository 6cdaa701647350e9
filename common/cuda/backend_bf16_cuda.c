/* Mixed precision on the GPU ("cuda-bf16", --device cuda --precision bf16):
 * the CPU emulation's design (backend_bf16_cpu.c: handles, storage by
 * category, masters, fp32 staging) with the storage in device memory
 * (cuda_bf16.cu) and the fp32 CUDA table (cuda_backend.cu) as the inner
 * table: each operation widens its bf16 operands into fp32 device scratch,
 * runs the fp32 CUDA kernel or cuBLAS product on them and rounds its
 * outputs once back into bf16 device storage (bf16_ops.c, bf16_table.c).
 *
 * That frame path (--bf16-kernels reference) is the correctness path:
 * products are fp32 (no tensor cores) and every operation pays a widen and
 * a narrow.  The default, --bf16-kernels fast, runs the matrix products and
 * flash attention straight on the bf16 storage (cuda_bf16_direct.cu:
 * cuBLASLt on tensor cores, the bf16 flash kernel) and every other
 * operation of the core through typed kernels there.  Either way the device
 * holds what a bf16 run holds (parameters, activations, gradients in bf16;
 * masters and moments fp32, device memory tracked by category).  Both paths
 * ran on an H200 on 2026-11-30 (results/gpu/strategies.csv, docs/BF16.md).
 *
 * C, not CUDA C: the table is the shared C entries plus the fp32 CUDA
 * table's device entries (open, clock, memory readings), read through
 * spb_backend_cuda at call time (that table is built during C++ dynamic
 * initialisation, so its members are no constants here). */
#include <string.h>

#include "backend.h"
#include "bf16_ops.h"
#include "cuda_backend.h"
#include "cuda_bf16_storage.h"
#include "cuda_scalars.h"
#include "spb_cuda.h"

static void use_device(void)
{
    spb_bf16_use(&spb_backend_cuda, spb_cuda_bf16_storage(), &spb_bf16_direct_cuda);
}

/* The rank's GPU first, then this instance: frames on the device. */
static int cb_open(int local_rank, char *err, size_t errlen)
{
    int rc = spb_backend_cuda.open(local_rank, err, errlen);
    if (rc == 0) use_device();
    return rc;
}
static void cb_device_identity(char *buf, size_t len) { spb_backend_cuda.device_identity(buf, len); }

static void cb_configure(const spb_config *cfg)
{
    use_device();
    spb_bf16_configure(cfg);
    /* the flash kernels' variant (--flash-block-rows, --flash-dq, --flash-fwd, --flash-bwd;
     * a wgmma forward this GPU or build cannot run stops here, on every rank) */
    spb_cuda_attention_set_block_rows(spb_config_flash_block_rows(cfg));
    spb_cuda_attention_set_fused_dq(!strcmp(spb_config_flash_dq(cfg), "fused"));
    spb_cuda_attention_set_fwd_wgmma(!strcmp(spb_config_flash_fwd(cfg), "wgmma"));
    spb_cuda_attention_set_bwd_wgmma(!strcmp(spb_config_flash_bwd(cfg), "wgmma"));
}

static void cb_synchronize(void) { spb_backend_cuda.synchronize(); }
static void cb_staging_synchronize(void) { spb_backend_cuda.staging.synchronize(); }
static const spb_mem_stats *cb_mem_stats(void) { return spb_backend_cuda.mem_stats(); }
static void cb_mem_reset_peaks(void) { spb_backend_cuda.mem_reset_peaks(); }
static double cb_device_used_bytes(void) { return spb_backend_cuda.device_used_bytes(); }

static int cb_clock_mark(void) { return spb_backend_cuda.clock->mark(); }
static double cb_clock_elapsed(int from, int to) { return spb_backend_cuda.clock->elapsed(from, to); }
static void cb_clock_release(void) { spb_backend_cuda.clock->release(); }
static const spb_timer_clock cb_clock = {cb_clock_mark, cb_clock_elapsed, cb_clock_release};

#define CUDA_HALF_TABLE(table_name)                                                                                  \
    {                                                                                                                  \
        .name = table_name, .host_memory = 0,                                                                          \
        .staging = {.to_host = spb_bf16_to_host,                                                                       \
                    .to_device = spb_bf16_to_device,                                                                   \
                    .synchronize = cb_staging_synchronize,                                                             \
                    .element_bytes = spb_bf16_element_bytes,                                                          \
                    .device_span = spb_bf16_device_span},                                                          \
        .open = cb_open, .device_identity = cb_device_identity, .synchronize = cb_synchronize,                        \
        .mem_stats = cb_mem_stats,                                                                                     \
        .mem_reset_peaks = cb_mem_reset_peaks, .device_used_bytes = cb_device_used_bytes, .clock = &cb_clock,          \
        .configure = cb_configure, SPB_BF16_TABLE_OPS,                                                                 \
        .scalar_defer = spb_cuda_scalar_defer, .scalars_take = spb_cuda_scalars_take,                                  \
        .clip_on_device = spb_cuda_clip_on_device,                                                                     \
    }

/* One design, two 16-bit formats: spb_bf16_configure takes the format from
 * --precision (fp16 without the direct kernels, which are bf16's). */
const spb_backend spb_backend_cuda_bf16 = CUDA_HALF_TABLE("cuda-bf16");
const spb_backend spb_backend_cuda_fp16 = CUDA_HALF_TABLE("cuda-fp16");
