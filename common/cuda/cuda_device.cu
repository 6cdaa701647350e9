#include <stdio.h>

#include <cuda_runtime.h>

#include "cuda_device.h"

extern "C" int spb_cuda_device_count(void)
{
    int n = 0;
    /* No driver or no GPU: report zero devices rather than failing. */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" void spb_cuda_describe(char *buf, size_t len)
{
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    int n = spb_cuda_device_count();
    if (n == 0) {
        snprintf(buf, len, "no CUDA device visible (runtime %d, driver %d)", runtime, driver);
        return;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        snprintf(buf, len, "%d CUDA device(s), properties unavailable", n);
        return;
    }
    snprintf(buf, len, "%d x %s (cc %d.%d, %.0f GiB), driver %d, runtime %d", n, p.name, p.major, p.minor,
             (double)p.totalGlobalMem / (1 << 30), driver, runtime);
}

extern "C" double spb_cuda_current_device_bytes(void)
{
    int dev = 0;
    cudaDeviceProp p;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0.0;
    }
    return (double)p.totalGlobalMem;
}
