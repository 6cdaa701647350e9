/* Device memory with per-category accounting (memory.h's categories, device
 * counters of their own).  Plain cudaMalloc: no managed memory.
 *
 * Freed blocks are kept, by exact size, for the next request of that size
 * instead of going back through cudaFree, which waits for the whole device:
 * the strategies allocate and free the same workspaces in every layer, and
 * ring attention's per-layer frees made the step wait on the host some 20
 * times (issue 37).  Reuse is safe in stream order: every table works on the
 * legacy default stream, and the communication stream waits for it before a
 * transfer and is waited on before its buffers are freed.  The accounting
 * (stats) counts live blocks only, as before; cached blocks are returned to
 * the device when a cudaMalloc fails, and then the request is retried. */
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
std::unordered_multimap<size_t, void *> cached; /* freed blocks by size, for reuse */
spb_mem_stats stats;

size_t block_bytes(size_t bytes) { return bytes ? bytes : 1; }

/* Every cached block back to the device (the caller holds the lock). */
void release_cached(void)
{
    for (auto &kv : cached) SPB_CUDA_HOST_WAIT(cudaFree(kv.second)); /* cudaFree waits for the device */
    cached.clear();
}
} // namespace

extern "C" void *spb_cuda_alloc(spb_mem_category cat, size_t bytes)
{
    SPB_CHECK(cat >= 0 && cat < SPB_MEM_NUM_CATEGORIES);
    void *p = nullptr;
    std::lock_guard<std::mutex> g(lock);
    auto hit = cached.find(block_bytes(bytes));
    if (hit != cached.end()) {
        p = hit->second;
        cached.erase(hit);
    } else {
        cudaError_t rc = cudaMalloc(&p, block_bytes(bytes));
        if (rc != cudaSuccess && !cached.empty()) { /* the cache holds the memory: give it back, once */
            (void)cudaGetLastError();
            release_cached();
            rc = cudaMalloc(&p, block_bytes(bytes));
        }
        if (rc != cudaSuccess)
            SPB_DIE("cudaMalloc of %zu bytes (%s) failed: %s", bytes, spb_mem_category_name(cat),
                    cudaGetErrorString(rc));
    }
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
    std::lock_guard<std::mutex> g(lock);
    auto it = live.find(p);
    SPB_CHECK(it != live.end());
    stats.current[it->second.cat] -= it->second.bytes;
    stats.current_total -= it->second.bytes;
    cached.emplace(block_bytes(it->second.bytes), p); /* no cudaFree: see the top of this file */
    live.erase(it);
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
