/* The CUDA runtime calls the project makes, for the CPU emulation: one
 * device whose memory is host memory, synchronous streams, events that read
 * the host clock.  Declarations are NVIDIA's (cuda_runtime_api.h); the
 * definitions here replace libcudart in the emulation build.
 *
 * Device allocations are tracked, so a cudaFree or cudaMemcpy naming memory
 * that is not (or not all) device memory where the call says it is fails as
 * it would on a GPU, instead of working because everything is host memory. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <map>

#include "emu_internal.h"

namespace {
cudaError_t last_error = cudaSuccess;
long launches = 0;
const size_t kTotalMemory = (size_t)64 << 30; /* what cudaMemGetInfo reports as the device's size */
const size_t kSharedOptin = 227 << 10;        /* sm_90's opt-in shared memory per block */

std::map<const char *, size_t> allocations; /* start -> bytes */
size_t allocated = 0;

struct event_state {
    double ms;
    bool timing, recorded;
};
struct stream_state {
    unsigned flags;
};

double now_ms()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

cudaError_t fail(cudaError_t e)
{
    last_error = e;
    return e;
}

/* Is [p, p + n) inside one device allocation? */
bool on_device(const void *p, size_t n)
{
    const char *c = (const char *)p;
    auto it = allocations.upper_bound(c);
    if (it == allocations.begin()) return false;
    --it;
    return c >= it->first && c + n <= it->first + it->second;
}

bool any_device(const void *p)
{
    const char *c = (const char *)p;
    auto it = allocations.upper_bound(c);
    if (it == allocations.begin()) return false;
    --it;
    return c < it->first + it->second;
}

/* The direction a copy names must match where its pointers are. */
cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *call)
{
    if (n == 0) return cudaSuccess;
    bool dst_dev = any_device(dst), src_dev = any_device(src);
    bool ok = true;
    switch (kind) {
    case cudaMemcpyHostToDevice: ok = dst_dev && on_device(dst, n) && !src_dev; break;
    case cudaMemcpyDeviceToHost: ok = src_dev && on_device(src, n) && !dst_dev; break;
    case cudaMemcpyDeviceToDevice: ok = on_device(dst, n) && on_device(src, n); break;
    case cudaMemcpyHostToHost: ok = !dst_dev && !src_dev; break;
    case cudaMemcpyDefault:
        ok = (!dst_dev || on_device(dst, n)) && (!src_dev || on_device(src, n));
        break;
    default: ok = false;
    }
    if (!ok) {
        fprintf(stderr,
                "spbench CUDA emulation: %s of %zu bytes, kind %d, from %s %p to %s %p: the pointers are not where "
                "the kind says (or run past their allocation)\n",
                call, n, (int)kind, src_dev ? "device" : "host", src, dst_dev ? "device" : "host", dst);
        return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
} // namespace

void spb_emu_set_error(cudaError_t e) { last_error = e; }
size_t spb_emu_max_shared_optin(void) { return kSharedOptin; }
void spb_emu_count_launch(void) { launches++; }

/* 90 (an H100's 9.0), or SPB_EMU_COMPUTE_CAPABILITY (e.g. 8.0 or 80: an
 * A100's), so that the paths for GPUs without Hopper's instructions run
 * too; wgmma refuses to run on less than 9.0 (emu_wgmma.cc). */
int spb_emu_compute_capability(void)
{
    const char *e = getenv("SPB_EMU_COMPUTE_CAPABILITY");
    if (!e || !*e) return 90;
    int major = 0, minor = 0;
    if (strchr(e, '.') ? sscanf(e, "%d.%d", &major, &minor) != 2 : sscanf(e, "%d", &major) != 1) return 90;
    if (!strchr(e, '.')) minor = major % 10, major /= 10;
    return major >= 7 && major <= 12 && minor >= 0 && minor <= 9 ? 10 * major + minor : 90;
}

extern "C" {

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (CPU emulation)";
    case cudaErrorMemoryAllocation: return "out of memory (CPU emulation)";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (CPU emulation)";
    case cudaErrorInvalidDevice: return "invalid device ordinal (CPU emulation)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (CPU emulation)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle (CPU emulation)";
    case cudaErrorNotReady: return "device not ready (CPU emulation)";
    default: return "error (CPU emulation)";
    }
}
const char *cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }

/* One device, or SPB_EMU_DEVICES of them (a node with a GPU per rank, for
 * --comm nccl): each process emulates the one it sets, in its own memory.
 * CUDA_VISIBLE_DEVICES as the runtime reads it (indices only): where set,
 * the process sees the listed devices up to the first entry that names
 * none (so "" hides every device), in that order, and device d of the
 * process is the node's device visible[d]: what a launcher binding a GPU
 * per task (Slurm's --gpus-per-task) looks like to spbench. */
static int node_devices(void)
{
    const char *e = getenv("SPB_EMU_DEVICES");
    int n = e ? atoi(e) : 1;
    return n < 1 ? 1 : n > 64 ? 64 : n;
}
static int visible[64];
static int device_count(void)
{
    const int node = node_devices();
    const char *e = getenv("CUDA_VISIBLE_DEVICES");
    if (!e) {
        for (int i = 0; i < node; i++) visible[i] = i;
        return node;
    }
    int n = 0;
    while (n < node && *e) {
        char *end = NULL;
        long v = strtol(e, &end, 10);
        if (end == e || (*end && *end != ',') || v < 0 || v >= node) break;
        visible[n++] = (int)v;
        e = *end ? end + 1 : end;
    }
    return n;
}
static int device_now = 0;

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = device_count();
    return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    device_now = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d)
{
    *d = device_now;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CPU emulation of a CUDA device (no GPU)");
    int cc = spb_emu_compute_capability();
    p->major = cc / 10, p->minor = cc % 10;
    p->totalGlobalMem = kTotalMemory;
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = kSharedOptin;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->multiProcessorCount = 1;
    p->l2CacheSize = 0;
    /* which of the node's devices this is, where a real one has its PCI
     * address and UUID */
    const int phys = visible[d];
    p->pciDomainID = 0, p->pciBusID = 0x10 + phys, p->pciDeviceID = 0;
    for (int i = 0; i < 16; i++) p->uuid.bytes[i] = (char)(i == 15 ? phys : 0x5e);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void)
{
    spb_emu_streams_host_waits_all();
    return cudaSuccess;
}
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value)
{
    if (!func) return fail(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > kSharedOptin) return fail(cudaErrorInvalidValue);
        spb_emu_set_max_dynamic_shared(func, value);
    }
    return cudaSuccess;
}

/* ---- memory ----------------------------------------------------------------- */
cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = nullptr;
    if (allocated + n > kTotalMemory) return fail(cudaErrorMemoryAllocation);
    /* the size asked for, not rounded up: under AddressSanitizer a kernel
     * that runs past its allocation is caught at the first byte */
    void *m = nullptr;
    if (posix_memalign(&m, 256, n ? n : 1) != 0) return fail(cudaErrorMemoryAllocation);
    memset(m, 0xff, n); /* NaN bytes: a read of what nobody wrote shows */
    allocations[(const char *)m] = n;
    allocated += n;
    spb_emu_streams_alloc(m, n);
    spb_emu_race_alloc(m, n);
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    auto it = allocations.find((const char *)p);
    if (it == allocations.end()) {
        fprintf(stderr, "spbench CUDA emulation: cudaFree(%p): not the start of a device allocation\n", p);
        return fail(cudaErrorInvalidValue);
    }
    allocated -= it->second;
    allocations.erase(it);
    spb_emu_streams_free(p);
    spb_emu_race_free(p);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void *p)
{
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    *total = kTotalMemory;
    *free_bytes = kTotalMemory - allocated;
    return cudaSuccess;
}

/* Synchronous: on the legacy default stream, and the host waits for it. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    cudaError_t e = check_copy(dst, src, n, kind, "cudaMemcpy");
    if (e != cudaSuccess) return e;
    if (n) spb_emu_stream_track(0, "cudaMemcpy", {{src, n, 0}, {dst, n, 1}});
    spb_emu_streams_host_waits_stream(0);
    if (n) memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s)
{
    cudaError_t e = check_copy(dst, src, n, kind, "cudaMemcpyAsync");
    if (e != cudaSuccess) return e;
    if (n) spb_emu_stream_track(s, "cudaMemcpyAsync", {{src, n, 0}, {dst, n, 1}});
    if (n) memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind)
{
    if (width > dpitch || width > spitch) return fail(cudaErrorInvalidPitchValue);
    if (height == 0 || width == 0) return cudaSuccess;
    for (size_t r = 0; r < height; r++) {
        cudaError_t e = check_copy((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind, "cudaMemcpy2D (a row)");
        if (e != cudaSuccess) return e;
    }
    /* synchronous, on the legacy default stream, as cudaMemcpy */
    spb_emu_stream_op(0, "cudaMemcpy2D");
    for (size_t r = 0; r < height; r++) {
        spb_emu_stream_access((const char *)src + r * spitch, width, 0);
        spb_emu_stream_access((char *)dst + r * dpitch, width, 1);
    }
    spb_emu_stream_op_end();
    spb_emu_streams_host_waits_stream(0);
    for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}
static cudaError_t memset_on(cudaStream_t s, const char *what, void *p, int v, size_t n)
{
    if (n && !on_device(p, n)) {
        fprintf(stderr, "spbench CUDA emulation: %s of %zu bytes at %p: not device memory\n", what, n, p);
        return fail(cudaErrorInvalidValue);
    }
    if (n) spb_emu_stream_track(s, what, {{p, n, 1}});
    memset(p, v, n);
    return cudaSuccess;
}
/* asynchronous to the host for device memory, on the legacy default stream */
cudaError_t cudaMemset(void *p, int v, size_t n) { return memset_on(0, "cudaMemset", p, v, n); }
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) { return memset_on(s, "cudaMemsetAsync", p, v, n); }

/* ---- streams and events: everything has finished when its call returns;
 * emu_streams.cc keeps the order a GPU would guarantee, and checks it --- */
cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    *s = (cudaStream_t) new stream_state{0};
    spb_emu_streams_created(*s, 1);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    *s = (cudaStream_t) new stream_state{flags};
    spb_emu_streams_created(*s, !(flags & cudaStreamNonBlocking));
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) return fail(cudaErrorInvalidResourceHandle);
    spb_emu_streams_destroyed(s);
    delete (stream_state *)s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    spb_emu_streams_host_waits_stream(s);
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s)
{
    spb_emu_streams_host_waits_stream(s); /* done: the host may rely on it */
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned)
{
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    spb_emu_streams_wait(s, e);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = (cudaEvent_t) new event_state{0.0, true, false};
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    *e = (cudaEvent_t) new event_state{0.0, !(flags & cudaEventDisableTiming), false};
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    spb_emu_streams_event_destroyed(e);
    delete (event_state *)e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    spb_emu_streams_record(e, s);
    event_state *ev = (event_state *)e;
    ev->ms = now_ms();
    ev->recorded = true;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    spb_emu_streams_host_waits_event(e);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    spb_emu_streams_host_waits_event(e); /* done: the host may rely on it */
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    event_state *x = (event_state *)a, *y = (event_state *)b;
    if (!x || !y || !x->timing || !y->timing) return fail(cudaErrorInvalidResourceHandle);
    if (!x->recorded || !y->recorded) return fail(cudaErrorInvalidResourceHandle);
    *ms = (float)(y->ms - x->ms);
    return cudaSuccess;
}

/* the driver's functions the emulation has (emu_tma.cc); any other is not
 * found, which the real runtime also reports with cudaSuccess */
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags, cudaDriverEntryPointQueryResult *driverStatus)
{
    (void)cudaVersion, (void)flags;
    if (!symbol || !funcPtr) return fail(cudaErrorInvalidValue);
    *funcPtr = spb_emu_driver_entry_point(symbol);
    if (driverStatus) *driverStatus = *funcPtr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

} /* extern "C" */
