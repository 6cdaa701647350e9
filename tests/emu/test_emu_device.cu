/* The CPU emulation of a CUDA device (common/cuda/emu) on its own: that it
 * runs CUDA C as a GPU would where the project's kernels depend on it, and
 * that it exposes the mistakes a GPU would punish (a missing barrier, a
 * barrier some threads skip, a launch a GPU refuses).  CUDA C, translated
 * and built like the project's .cu files in the emulation build; a plain
 * program: exit 0 when every check passes. */
#include <cuda_runtime.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

static int failures = 0, checks = 0;
#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        checks++;                                                                                                      \
        if (!(cond)) {                                                                                                 \
            failures++;                                                                                                \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                                     \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
        }                                                                                                              \
    } while (0)

template <typename T> static T *device_array(size_t n)
{
    void *p = nullptr;
    if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) {
        printf("cudaMalloc failed\n");
        exit(1);
    }
    return (T *)p;
}
template <typename T> static std::vector<T> to_host(const T *d, size_t n)
{
    std::vector<T> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
}

/* ---- barriers: each thread reads what its neighbour wrote ------------------ */
__global__ void neighbour_with_barrier(int *out)
{
    __shared__ int s[256];
    s[threadIdx.x] = (int)threadIdx.x * 3 + (int)blockIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
/* the same without the barrier: a race a GPU may or may not show */
__global__ void neighbour_without_barrier(int *out)
{
    __shared__ int s[256];
    s[threadIdx.x] = (int)threadIdx.x * 3 + (int)blockIdx.x + 1000;
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
/* the other race: overwriting a value a neighbour has not read yet */
__global__ void overwrite_without_barrier(int *out, int rounds)
{
    __shared__ int s[256];
    int acc = 0;
    for (int r = 0; r < rounds; r++) {
        s[threadIdx.x] = r * 1000 + (int)threadIdx.x;
        __syncthreads();
        acc += s[(threadIdx.x + 1) % blockDim.x];
        /* missing: __syncthreads() before the next round's write */
    }
    out[threadIdx.x] = acc;
}

static void check_barriers(void)
{
    const int T = 128, B = 3;
    int *out = device_array<int>(T * B);
    neighbour_with_barrier<<<B, T>>>(out);
    EXPECT(cudaGetLastError() == cudaSuccess, "launch");
    std::vector<int> h = to_host(out, T * B);
    int bad = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) bad += h[b * T + t] != ((t + 1) % T) * 3 + b;
    EXPECT(bad == 0, "%d of %d values wrong with the barrier", bad, T * B);

    neighbour_without_barrier<<<B, T>>>(out);
    h = to_host(out, T * B);
    bad = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) bad += h[b * T + t] != ((t + 1) % T) * 3 + b + 1000;
    EXPECT(bad > 0, "a missing barrier before a read went unnoticed");

    overwrite_without_barrier<<<1, T>>>(out, 3);
    h = to_host(out, T);
    bad = 0;
    for (int t = 0; t < T; t++) bad += h[t] != 3000 + 3 * ((t + 1) % T);
    EXPECT(bad > 0, "a missing barrier before an overwrite went unnoticed");
    cudaFree(out);
}

/* ---- warp shuffles ----------------------------------------------------------- */
__global__ void warp_sums(const float *in, float *xor_sum, float *down0, float *seg)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = in[i], x = v;
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    xor_sum[i] = x;
    float d = v;
    for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xffffffffu, d, o);
    down0[i] = d;
    /* segments of 8 lanes: each gets its segment's first lane */
    seg[i] = __shfl_sync(0xffffffffu, v, 0, 8);
}

static void check_shuffles(void)
{
    const int N = 128;
    std::vector<float> h(N);
    for (int i = 0; i < N; i++) h[i] = (float)(i * 7 % 13);
    float *in = device_array<float>(N), *xs = device_array<float>(N), *dn = device_array<float>(N),
          *sg = device_array<float>(N);
    cudaMemcpy(in, h.data(), N * 4, cudaMemcpyHostToDevice);
    warp_sums<<<2, 64>>>(in, xs, dn, sg);
    std::vector<float> X = to_host(xs, N), Dn = to_host(dn, N), S = to_host(sg, N);
    int bad_x = 0, bad_s = 0;
    for (int w = 0; w < N / 32; w++) {
        float sum = 0;
        for (int l = 0; l < 32; l++) sum += h[w * 32 + l];
        for (int l = 0; l < 32; l++) bad_x += X[w * 32 + l] != sum;
        EXPECT(Dn[w * 32] == sum, "warp %d: shfl_down sum %g, want %g", w, Dn[w * 32], sum);
    }
    for (int i = 0; i < N; i++) bad_s += S[i] != h[i / 8 * 8];
    EXPECT(bad_x == 0, "%d xor-butterfly sums wrong", bad_x);
    EXPECT(bad_s == 0, "%d segment broadcasts wrong", bad_s);
    cudaFree(in), cudaFree(xs), cudaFree(dn), cudaFree(sg);
}

/* ---- the tensor-core product ------------------------------------------------
 * Operands loaded the ISA's way round (lane -> elements), which emu_mma.cc
 * inverts (element -> lane): both must agree with a plain product. */
__global__ void one_mma(const __nv_bfloat16 *A, const __nv_bfloat16 *B, float *D)
{
    int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    uint32_t a[4], b[2];
    for (int r = 0; r < 4; r++) { /* a: elements 2r, 2r+1 */
        uint16_t lo, hi;
        int i = 2 * r;
        int row = g + ((i % 4) >= 2 ? 8 : 0), col = 2 * t + (i >= 4 ? 8 : 0);
        memcpy(&lo, &A[row * 16 + col], 2);
        memcpy(&hi, &A[row * 16 + col + 1], 2);
        a[r] = lo | (uint32_t)hi << 16;
    }
    for (int r = 0; r < 2; r++) { /* b: elements 2r, 2r+1 at k = 2t (+8), 2t+1 (+8), n = g */
        uint16_t lo, hi;
        int k = 2 * t + 8 * r;
        memcpy(&lo, &B[k * 8 + g], 2);
        memcpy(&hi, &B[(k + 1) * 8 + g], 2);
        b[r] = lo | (uint32_t)hi << 16;
    }
    float c[4] = {1.0f, 1.0f, 1.0f, 1.0f}; /* D = A B + 1 */
    spb_emu_mma_m16n8k16(0, c, a, b[0], b[1]);
    for (int i = 0; i < 4; i++) D[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)] = c[i];
}

static void check_mma(void)
{
    std::vector<__nv_bfloat16> A(256), B(128);
    for (int i = 0; i < 256; i++) A[i] = __float2bfloat16_rn((float)((i * 5 + 3) % 11) - 5.0f);
    for (int i = 0; i < 128; i++) B[i] = __float2bfloat16_rn((float)((i * 3 + 1) % 7) - 3.0f);
    __nv_bfloat16 *dA = device_array<__nv_bfloat16>(256), *dB = device_array<__nv_bfloat16>(128);
    float *dD = device_array<float>(128);
    cudaMemcpy(dA, A.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B.data(), 256, cudaMemcpyHostToDevice);
    one_mma<<<1, 32>>>(dA, dB, dD);
    std::vector<float> D = to_host(dD, 128);
    int bad = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            float want = 1.0f;
            for (int k = 0; k < 16; k++) want += __bfloat162float(A[m * 16 + k]) * __bfloat162float(B[k * 8 + n]);
            bad += D[m * 8 + n] != want;
        }
    EXPECT(bad == 0, "%d of 128 elements of a 16x8x16 product wrong", bad);
    cudaFree(dA), cudaFree(dB), cudaFree(dD);
}

/* ---- what a GPU refuses or leaves undefined ------------------------------------ */
__global__ void divergent_barrier(int *out)
{
    if (threadIdx.x < 16)
        __syncthreads();
    else
        __syncthreads(); /* a GPU's barrier would count both: undefined */
    out[threadIdx.x] = 1;
}
__global__ void crossed_waits(int *out)
{
    if (threadIdx.x % 32 < 16) __syncwarp(); /* the other half of the warp waits below */
    __syncthreads();
    out[threadIdx.x] = 1;
}
__global__ void partial_warp_shuffle(float *out)
{
    if (threadIdx.x % 32 >= 8) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1); /* lanes 8..31 have exited */
}
__global__ void noop(int *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    dyn[threadIdx.x] = 1;
    if (out) out[threadIdx.x] = dyn[threadIdx.x];
}
__global__ void count_blocks(int *seen)
{
    if (threadIdx.x == 0) atomicAdd(&seen[blockIdx.x + gridDim.x * blockIdx.y], 1);
}

/* 1 when f() ends the process with SIGABRT (the emulation's verdict) */
template <typename F> static int aborts(F f)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        f();
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void check_refusals(void)
{
    int *out = device_array<int>(1024);
    float *fo = device_array<float>(64);
    EXPECT(aborts([&] { divergent_barrier<<<1, 64>>>(out); }), "a divergent barrier is not reported");
    EXPECT(aborts([&] { crossed_waits<<<1, 64>>>(out); }), "a deadlock is not reported");
    EXPECT(aborts([&] { partial_warp_shuffle<<<1, 64>>>(fo); }), "a full-mask shuffle after lanes exited is not reported");

    noop<<<1, 2048>>>(nullptr);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "2048 threads per block accepted");
    noop<<<1, 32, 64 << 10>>>(out);
    EXPECT(cudaGetLastError() != cudaSuccess, "64 KiB of dynamic shared memory accepted without the opt-in");
    EXPECT(cudaFuncSetAttribute(noop, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10) == cudaSuccess, "opt-in");
    noop<<<1, 32, 64 << 10>>>(out);
    EXPECT(cudaGetLastError() == cudaSuccess, "64 KiB refused after the opt-in");
    EXPECT(cudaFuncSetAttribute(noop, cudaFuncAttributeMaxDynamicSharedMemorySize, 300 << 10) != cudaSuccess,
           "an opt-in past the device's shared memory accepted");
    cudaGetLastError();

    /* every block exactly once, whatever the order */
    int *seen = device_array<int>(7 * 5);
    cudaMemset(seen, 0, 7 * 5 * sizeof(int));
    count_blocks<<<dim3(7, 5), 32>>>(seen);
    std::vector<int> s = to_host(seen, 35);
    int bad = 0;
    for (int v : s) bad += v != 1;
    EXPECT(bad == 0, "%d blocks not run exactly once", bad);

    /* fresh device memory reads as NaN, not as convenient zeros */
    float *fresh = device_array<float>(4);
    std::vector<float> f = to_host(fresh, 4);
    EXPECT(isnan(f[0]) && isnan(f[3]), "fresh device memory reads %g", f[0]);

    /* copies whose direction does not match their pointers */
    float host[4] = {0, 0, 0, 0};
    EXPECT(cudaMemcpy(host, fresh, 16, cudaMemcpyHostToDevice) != cudaSuccess, "H2D into host memory accepted");
    EXPECT(cudaMemcpy(fresh, host, 32, cudaMemcpyHostToDevice) != cudaSuccess, "a copy past an allocation accepted");
    EXPECT(cudaFree(fresh + 1) != cudaSuccess, "cudaFree of an interior pointer accepted");
    cudaGetLastError();
    cudaFree(fresh), cudaFree(seen), cudaFree(out), cudaFree(fo);
}

int main(void)
{
    check_barriers();
    check_shuffles();
    check_mma();
    check_refusals();
    printf("CUDA emulation: %d checks, %d failed: %s\n", checks, failures, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
