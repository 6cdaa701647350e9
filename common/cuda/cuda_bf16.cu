/* Device storage of the CUDA bf16 table (cuda_bf16_storage.h). */
#include <cuda_runtime.h>

#include "cuda_bf16_storage.h"
#include "cuda_check.h"
#include "cuda_launch.cuh"
#include "cuda_trace.h"
#include "cuda_upload.h"
#include "spb_cuda.h"

/* Each launch on the legacy stream: SPB_KT_BEGIN(0) before, SPB_LAUNCH_CHECK (cuda_trace.h) after. */

namespace {

const int kThreads = 256;
unsigned blocks_for(long n) { return spb_grid_stride_blocks(n, kThreads); }

/* Rounding: common/bf16/bf16.h's and fp16.h's own functions (host and device
 * under nvcc), so the device rounds exactly as the CPU instance does. */

__global__ void k_widen(float *dst, const spb_bf16 *src, long n, int fp16)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] = fp16 ? spb_fp16_to_float(src[i]) : spb_bf16_to_float(src[i]);
}

/* One thread per element reads its old value before writing the new one, so
 * the masters' rule needs no copy of the range (masters may alias src:
 * each element is read before it is written, by the same thread). */
__global__ void k_narrow(spb_bf16 *dst, const float *src, long n, float *masters, int truncate, int fp16)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float v = src[i];
        spb_bf16 b = fp16 ? spb_fp16_from_float(v) : truncate ? spb_bf16_truncate(v) : spb_bf16_from_float(v);
        if (masters && b != dst[i]) masters[i] = v;
        dst[i] = b;
    }
}

void widen(float *dst, const spb_bf16 *src, long n, spb_half_format fmt)
{
    if (n <= 0) return;
    SPB_KT_BEGIN(0);
    k_widen<<<blocks_for(n), kThreads>>>(dst, src, n, fmt == SPB_HALF_FP16);
    SPB_LAUNCH_CHECK();
}

void narrow(spb_bf16 *dst, const float *src, long n, float *masters, int truncate, spb_half_format fmt)
{
    if (n <= 0) return;
    SPB_KT_BEGIN(0);
    k_narrow<<<blocks_for(n), kThreads>>>(dst, src, n, masters, truncate, fmt == SPB_HALF_FP16);
    SPB_LAUNCH_CHECK();
}

/* ------------------------------------------------------------ storage -- */
void *storage_alloc(spb_mem_category cat, size_t bytes)
{
    void *p = spb_cuda_alloc(cat, bytes);
    if (bytes) SPB_CUDA_CHECK(cudaMemset(p, 0, bytes));
    return p;
}

void storage_free(void *p) { spb_cuda_free(p); }

/* Storage to storage: queued on the default stream like every kernel. */
void copy(void *dst, const void *src, size_t bytes)
{
    if (bytes) SPB_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

void to_host(void *host, const void *src, size_t bytes)
{
    if (bytes) SPB_CUDA_HOST_WAIT(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost));
}

void from_host(void *dst, const void *host, size_t bytes)
{
    spb_cuda_upload(dst, host, bytes, 0); /* staged through pinned memory: no wait (cuda_upload.h) */
}

/* ------------------------------------------------------- scratch pool -- */
/* Frames take one block each, freed in reverse order (a stack).  The pool
 * only grows, and only while empty: cudaFree synchronises the device, and a
 * frame per operation must not.  A block that does not fit beside blocks
 * still out gets an allocation of its own (freed, with its wait, when it
 * is given back).  Untracked, like the CPU instance's malloc'd copies: the
 * categories count what the model stores, the pool is the emulation's
 * working memory (cudaMemGetInfo, device_used_bytes, does see it). */
char *pool;
size_t pool_bytes, pool_used;
size_t pool_starts[16]; /* offsets of the blocks out, in order */
int pool_blocks;

const size_t kAlign = 256;

void *scratch_alloc(size_t bytes)
{
    bytes = (bytes + kAlign - 1) / kAlign * kAlign;
    if (!bytes) bytes = kAlign;
    if (!pool_used && bytes > pool_bytes) {
        size_t grown = pool_bytes * 2 > bytes ? pool_bytes * 2 : bytes;
        if (pool) SPB_CUDA_HOST_WAIT(cudaFree(pool));
        SPB_CUDA_CHECK(cudaMalloc((void **)&pool, grown));
        pool_bytes = grown;
    }
    if (pool_used + bytes <= pool_bytes && pool_blocks < 16) {
        pool_starts[pool_blocks++] = pool_used;
        void *p = pool + pool_used;
        pool_used += bytes;
        return p;
    }
    void *own = nullptr;
    SPB_CUDA_CHECK(cudaMalloc(&own, bytes));
    return own;
}

void scratch_free(void *p)
{
    if (!p) return;
    char *c = (char *)p;
    if (pool && c >= pool && c < pool + pool_bytes) {
        /* given back in reverse order */
        SPB_CHECK(pool_blocks > 0 && pool_starts[pool_blocks - 1] == (size_t)(c - pool));
        pool_used = pool_starts[--pool_blocks];
        return;
    }
    SPB_CUDA_HOST_WAIT(cudaFree(p));
}

const spb_handle_storage device_storage = {
    storage_alloc, storage_free, scratch_alloc, scratch_free, widen, narrow, copy, to_host, from_host,
};

} // namespace

extern "C" const spb_handle_storage *spb_cuda_bf16_storage(void) { return &device_storage; }
