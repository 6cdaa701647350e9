/* What the GPU check programs share at start: find the GPU, record its
 * name, driver and runtime for every CSV row, print the banner, and decide
 * whether this GPU can run the checks (sm_80+ for the bf16 tensor-core
 * kernels); and how both time a region.  CUDA C, header-only: included by
 * gpu_check.cu and gpu_layer.cu. */
#ifndef SPB_GPU_ENV_H
#define SPB_GPU_ENV_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "cuda_check.h"
#include "cuda_device.h"
#include "gpu_util.h"
#include "spb_cuda.h"

/* The commit every CSV row names (the generated header in the CMake build). */
#ifndef SPB_GIT_COMMIT
#if __has_include("spb_version.h")
#include "spb_version.h"
#define SPB_GIT_COMMIT SPB_VERSION_COMMIT
#else
#define SPB_GIT_COMMIT "unknown"
#endif
#endif

struct env_info {
    char gpu[256], driver[32], runtime[32];
};

/* 0 when the checks can run; 77 (ctest's skip code) when there is no GPU or
 * it is older than sm_80.  `program` names the banner. */
static int gpu_env_open(env_info *e, const char *program, const char *commit)
{
    if (spb_cuda_device_count() == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    SPB_CUDA_CHECK(cudaSetDevice(0));
    cudaDeviceProp prop;
    SPB_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv), cudaRuntimeGetVersion(&rt);
    snprintf(e->gpu, sizeof e->gpu, "%s", prop.name);
    snprintf(e->driver, sizeof e->driver, "%d.%d", drv / 1000, (drv % 1000) / 10);
    snprintf(e->runtime, sizeof e->runtime, "%d.%d", rt / 1000, (rt % 1000) / 10);
    char desc[256];
    spb_cuda_describe(desc, sizeof desc);
    printf("%s: %s; CUDA driver API %s, runtime %s; commit %s\n", program, desc, e->driver, e->runtime, commit);
    if (prop.major < 8) {
        printf("compute capability %d.%d < 8.0: bf16 tensor-core kernels need sm_80+: skipped\n", prop.major,
               prop.minor);
        return 77;
    }
    return 0;
}

/* The model shape of the timings: the paper's 7B layer (hidden 4096, 32
 * heads of 128, ffn 16384), or with --smoke a small one that only walks the
 * timing code (allocation, timing, FLOP accounting, CSV) where a product at
 * the 7B shape would take minutes: the CPU emulation's test of the script
 * (docs/EMULATION.md).  A smoke figure is no figure: its rows say "smoke". */
struct timing_model {
    long C, F, H, Dh; /* hidden, ffn, heads, head dim */
    long square;      /* the peak-reference GEMM's size */
    const char *name;
    bool smoke;       /* the code path only: no figure, no target verdict */
};
static const timing_model kTiming7B = {4096, 16384, 32, 128, 8192, "7B", false};
static const timing_model kTimingSmoke = {1024, 4096, 16, 64, 256, "smoke", true}; /* P = 8 divides it as the layer needs */
static timing_model timing = kTiming7B;

/* "4096,8192,..." -> tokens; 0 on a malformed list. */
static int gpu_parse_tokens(char *list, std::vector<long> &tokens)
{
    tokens.clear();
    for (char *s = list; *s;) {
        long n = strtol(s, &s, 10);
        if (n <= 0) return 0;
        tokens.push_back(n);
        if (*s == ',') s++;
        else if (*s) return 0;
    }
    return 1;
}

/* A pair of CUDA events for one timed region. */
struct timer_ev {
    cudaEvent_t a, b;
    timer_ev()
    {
        SPB_CUDA_CHECK(cudaEventCreate(&a));
        SPB_CUDA_CHECK(cudaEventCreate(&b));
    }
    ~timer_ev() { cudaEventDestroy(a), cudaEventDestroy(b); }
};

/* Median milliseconds of `reps` runs of f after one warm-up (which also
 * picks and caches the cuBLASLt algorithms); 3 runs when one takes over a
 * second (the script's 8-minute budget).  *used (may be NULL): the runs
 * taken. */
template <typename F> static double time_ms(F f, int reps, int *used = nullptr)
{
    timer_ev ev;
    double ms[64];
    SPB_CUDA_CHECK(cudaEventRecord(ev.a, 0));
    f();
    SPB_CUDA_CHECK(cudaEventRecord(ev.b, 0));
    SPB_CUDA_CHECK(cudaEventSynchronize(ev.b));
    float first = 0.0f;
    SPB_CUDA_CHECK(cudaEventElapsedTime(&first, ev.a, ev.b));
    if (first > 1000.0f && reps > 3) reps = 3;
    if (reps > 64) reps = 64;
    for (int r = 0; r < reps; r++) {
        SPB_CUDA_CHECK(cudaEventRecord(ev.a, 0));
        f();
        SPB_CUDA_CHECK(cudaEventRecord(ev.b, 0));
        SPB_CUDA_CHECK(cudaEventSynchronize(ev.b));
        float t = 0.0f;
        SPB_CUDA_CHECK(cudaEventElapsedTime(&t, ev.a, ev.b));
        ms[r] = t;
    }
    if (used) *used = reps;
    return spb_median(ms, reps);
}

#endif
