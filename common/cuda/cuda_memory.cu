/* Device memory with per-category accounting (memory.h's categories, device
 * counters of their own).  Plain cudaMalloc: no managed memory. */
#include <mutex>
#include <string.h>
#include <vector>
#include <unordered_map>

#include "cuda_check.h"
#include "cuda_trace.h"
#include "cuda_upload.h"
#include "spb_cuda.h"

namespace {
struct entry {
    spb_mem_category cat;
    size_t bytes;
};
std::mutex lock;
std::unordered_map<const void *, entry> live;
spb_mem_stats stats;
} // namespace

extern "C" void *spb_cuda_alloc(spb_mem_category cat, size_t bytes)
{
    SPB_CHECK(cat >= 0 && cat < SPB_MEM_NUM_CATEGORIES);
    void *p = nullptr;
    cudaError_t rc = cudaMalloc(&p, bytes ? bytes : 1);
    if (rc != cudaSuccess)
        SPB_DIE("cudaMalloc of %zu bytes (%s) failed: %s", bytes, spb_mem_category_name(cat), cudaGetErrorString(rc));
    std::lock_guard<std::mutex> g(lock);
    live[p] = entry{cat, bytes};
    stats.current[cat] += bytes;
    stats.current_total += bytes;
    if (stats.current[cat] > stats.peak[cat]) stats.peak[cat] = stats.current[cat];
    if (stats.current_total > stats.peak_total) stats.peak_total = stats.current_total;
    return p;
}

extern "C" void spb_cuda_free(void *p)
{
    if (!p) return;
    {
        std::lock_guard<std::mutex> g(lock);
        auto it = live.find(p);
        SPB_CHECK(it != live.end());
        stats.current[it->second.cat] -= it->second.bytes;
        stats.current_total -= it->second.bytes;
        live.erase(it);
    }
    SPB_CUDA_HOST_WAIT(cudaFree(p)); /* cudaFree waits for the device */
}

extern "C" size_t spb_cuda_size(const void *p)
{
    std::lock_guard<std::mutex> g(lock);
    auto it = live.find(p);
    return it == live.end() ? 0 : it->second.bytes;
}

extern "C" const spb_mem_stats *spb_cuda_mem_stats(void) { return &stats; }

extern "C" void spb_cuda_mem_reset_peaks(void)
{
    std::lock_guard<std::mutex> g(lock);
    for (int c = 0; c < SPB_MEM_NUM_CATEGORIES; c++) stats.peak[c] = stats.current[c];
    stats.peak_total = stats.current_total;
}

extern "C" const char *spb_cuda_impl_name(spb_cuda_impl impl) { return impl == SPB_CUDA_FAST ? "fast" : "simple"; }

extern "C" void *spb_cuda_grow(void **buf, size_t *cap, spb_mem_category cat, size_t bytes)
{
    if (bytes > *cap) {
        spb_cuda_free(*buf);
        *buf = spb_cuda_alloc(cat, bytes);
        *cap = bytes;
    }
    return *buf;
}

/* ---- uploads through page-locked staging (cuda_upload.h) ---- */
namespace {
struct staging {
    void *pinned;
    size_t cap;
    cudaEvent_t done; /* recorded after its last copy */
};
std::vector<staging> stagings;
} // namespace

extern "C" void spb_cuda_upload(void *dst, const void *host, size_t bytes, cudaStream_t stream)
{
    if (!bytes) return;
    std::lock_guard<std::mutex> g(lock);
    staging *free_one = nullptr;
    for (staging &s : stagings) {
        cudaError_t rc = cudaEventQuery(s.done); /* done: its copy has left the buffer */
        if (rc == cudaErrorNotReady) continue;
        SPB_CUDA_CHECK(rc);
        if (!free_one || s.cap > free_one->cap) free_one = &s;
        if (s.cap >= bytes) {
            free_one = &s;
            break;
        }
    }
    if (!free_one) {
        stagings.push_back(staging{nullptr, 0, nullptr});
        free_one = &stagings.back();
        SPB_CUDA_CHECK(cudaEventCreateWithFlags(&free_one->done, cudaEventDisableTiming));
    }
    if (free_one->cap < bytes) { /* grown while free: its last copy is done, nothing waits */
        if (free_one->pinned) SPB_CUDA_HOST_WAIT(cudaFreeHost(free_one->pinned));
        size_t cap = bytes > 2 * free_one->cap ? bytes : 2 * free_one->cap;
        SPB_CUDA_CHECK(cudaMallocHost(&free_one->pinned, cap));
        free_one->cap = cap;
    }
    memcpy(free_one->pinned, host, bytes);
    SPB_CUDA_CHECK(cudaMemcpyAsync(dst, free_one->pinned, bytes, cudaMemcpyHostToDevice, stream));
    SPB_CUDA_CHECK(cudaEventRecord(free_one->done, stream));
}
