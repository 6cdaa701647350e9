/* Over 700 lines: one test program: every emulated instruction against the PTX ISA, and the races it must stop. */
/* The CPU emulation of a CUDA device (common/cuda/emu) on its own: that it
 * runs CUDA C as a GPU would where the project's kernels depend on it, and
 * that it exposes the mistakes a GPU would punish (a missing barrier, a
 * barrier some threads skip, a launch a GPU refuses).  ldmatrix and cp.async
 * (common/cuda/warp_ptx.cuh) are checked against values written here from
 * the PTX ISA's definitions, not from the emulator's code.  CUDA C, translated
 * and built like the project's .cu files in the emulation build; a plain
 * program: exit 0 when every check passes. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "../../common/cuda/warp_ptx.cuh"
#include "../../common/cuda/warpgroup_ptx.cuh"

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

/* f() in a child process (stderr silenced): its wait status */
template <typename F> static int in_child(F f)
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
    return st;
}
/* 1 when f() ends the process with SIGABRT (the emulation's verdict) */
template <typename F> static int aborts(F f)
{
    int st = in_child(f);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}
/* 1 when f() runs to its end */
template <typename F> static int completes(F f)
{
    int st = in_child(f);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
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

/* ---- ldmatrix -------------------------------------------------------------------
 * From the PTX ISA (ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16): lanes
 * 8i..8i+7 give the addresses of rows 0..7 of matrix i (16 bytes each);
 * register i of every lane holds a fragment of matrix i; a group of four
 * lanes holds a whole row, lane l the elements (row l/4, columns 2(l%4) and
 * 2(l%4)+1), the lower column in the low 16 bits.  With .trans the matrix is
 * read column-major: lane l gets (rows 2(l%4) and 2(l%4)+1, column l/4) of
 * the matrix as its rows lie in memory. */
template <int TRANS> __global__ void ldmatrix_rows(const uint16_t *img, int n, const int *row_off, uint32_t *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    uint16_t *s = (uint16_t *)dyn;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = img[i];
    __syncthreads();
    uint32_t r[4] = {0, 0, 0, 0};
    if (TRANS)
        spb_ldmatrix_x4_trans(r, s + row_off[threadIdx.x]);
    else
        spb_ldmatrix_x4(r, s + row_off[threadIdx.x]);
    /* the warp reads as one: a lane's store after the ldmatrix (to the row
     * it addressed, which other lanes' registers come from) is too late to
     * change anyone's registers */
    for (int c = 0; c < 8; c++) s[row_off[threadIdx.x] + c] = 0xdead;
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = r[i];
}

/* ldmatrix feeding mma.m16n8k16: A 16x16 [m][k]; B 16x16 (two n-tiles of 8),
 * stored [n][k] (k contiguous, plain ldmatrix) or [k][n] (.trans); rows of
 * 24 elements in shared memory (48 bytes: padded, still 16-byte aligned) */
template <int FP16, int TRANS> __global__ void ldmatrix_mma(const uint16_t *A, const uint16_t *B, float *D)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    const int LD = 24;
    uint16_t *sA = (uint16_t *)dyn, *sB = sA + 16 * LD;
    int l = threadIdx.x;
    for (int i = l; i < 256; i += 32) {
        sA[i / 16 * LD + i % 16] = A[i];
        sB[i / 16 * LD + i % 16] = B[i];
    }
    __syncthreads();
    uint32_t a[4], b[4];
    /* A's fragment (ISA, m16n8k16 16-bit): a0a1 (row g, k 2t..), a2a3 (g+8, 2t..),
     * a4a5 (g, 2t+8..), a6a7 (g+8, 2t+8..): matrices [0:8][0:8], [8:16][0:8],
     * [0:8][8:16], [8:16][8:16] */
    spb_ldmatrix_x4(a, sA + (l % 16) * LD + (l / 16) * 8);
    /* B's fragment: b0b1 (k 2t, 2t+1; n g), b2b3 (k 2t+8, 2t+9; n g); registers
     * 0,1 for n 0..7 and 2,3 for n 8..15 */
    if (TRANS) /* sB is [k][n]: matrix i covers k ((i&1)*8..), n ((i>>1)*8..) */
        spb_ldmatrix_x4_trans(b, sB + (((l / 8) & 1) * 8 + l % 8) * LD + (l / 16) * 8);
    else /* sB is [n][k]: matrix i covers n ((i>>1)*8..), k ((i&1)*8..) */
        spb_ldmatrix_x4(b, sB + ((l / 16) * 8 + l % 8) * LD + ((l / 8) & 1) * 8);
    int g = l / 4, t = l % 4;
    for (int nt = 0; nt < 2; nt++) {
        float c[4] = {0.5f, 0.5f, 0.5f, 0.5f};
        spb_mma_m16n8k16<FP16>(c, a, b[2 * nt], b[2 * nt + 1]);
        for (int i = 0; i < 4; i++) D[(g + (i >= 2 ? 8 : 0)) * 16 + nt * 8 + 2 * t + (i & 1)] = c[i];
    }
}

static uint16_t bits16(float v, int fp16)
{
    uint16_t u;
    if (fp16) {
        __half h = __float2half_rn(v);
        memcpy(&u, &h, 2);
    } else {
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        memcpy(&u, &h, 2);
    }
    return u;
}

template <int FP16, int TRANS> static int ldmatrix_mma_wrong(void)
{
    std::vector<float> A(256), B(256); /* B[k][n] */
    for (int i = 0; i < 256; i++) A[i] = (float)((i * 7 + 3) % 9) - 4.0f;
    for (int i = 0; i < 256; i++) B[i] = (float)((i * 5 + 1) % 7) - 3.0f;
    std::vector<uint16_t> hA(256), hB(256);
    for (int i = 0; i < 256; i++) hA[i] = bits16(A[i], FP16);
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 16; n++) hB[TRANS ? k * 16 + n : n * 16 + k] = bits16(B[k * 16 + n], FP16);
    uint16_t *dA = device_array<uint16_t>(256), *dB = device_array<uint16_t>(256);
    float *dD = device_array<float>(256);
    cudaMemcpy(dA, hA.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, hB.data(), 512, cudaMemcpyHostToDevice);
    ldmatrix_mma<FP16, TRANS><<<1, 32, 2 * 16 * 24 * 2>>>(dA, dB, dD);
    EXPECT(cudaGetLastError() == cudaSuccess, "launch");
    std::vector<float> D = to_host(dD, 256);
    int bad = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float want = 0.5f; /* small integers: exact in any order */
            for (int k = 0; k < 16; k++) want += A[m * 16 + k] * B[k * 16 + n];
            bad += D[m * 16 + n] != want;
        }
    cudaFree(dA), cudaFree(dB), cudaFree(dD);
    return bad;
}

static void check_ldmatrix(void)
{
    /* Two warps, each loading four 8x8 matrices of distinct values
     * 1000 * (4 * warp + matrix) + 10 * row + column from a shared image of
     * 64 rows of 24 elements (48 bytes): each matrix in its own block of 8
     * rows, blocks in a shuffled order, at column 0, 8 or 16, and its rows in
     * a shuffled order inside the block, so that only each lane's own
     * address finds its row.  Everything else holds 0xbeef. */
    const int LD = 24, ROWS = 64, N = ROWS * LD;
    const int block_of[8] = {5, 2, 7, 0, 3, 6, 1, 4}, col_of[8] = {8, 0, 16, 8, 16, 0, 8, 16};
    const int row_perm[8] = {3, 6, 0, 5, 1, 7, 4, 2};
    std::vector<uint16_t> img(N, 0xbeef);
    std::vector<int> off(64);
    for (int w = 0; w < 2; w++)
        for (int l = 0; l < 32; l++) {
            int m = 4 * w + l / 8, r = l % 8;
            off[w * 32 + l] = (block_of[m] * 8 + row_perm[(r + 3 * w) % 8]) * LD + col_of[m];
            for (int c = 0; c < 8; c++) img[off[w * 32 + l] + c] = (uint16_t)(1000 * m + 10 * r + c);
        }
    uint16_t *dimg = device_array<uint16_t>(N);
    int *doff = device_array<int>(64);
    uint32_t *dout = device_array<uint32_t>(64 * 4);
    cudaMemcpy(dimg, img.data(), N * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(doff, off.data(), 64 * sizeof(int), cudaMemcpyHostToDevice);
    for (int trans = 0; trans < 2; trans++) {
        cudaMemset(dout, 0, 64 * 4 * sizeof(uint32_t));
        if (trans)
            ldmatrix_rows<1><<<1, 64, N * 2>>>(dimg, N, doff, dout);
        else
            ldmatrix_rows<0><<<1, 64, N * 2>>>(dimg, N, doff, dout);
        EXPECT(cudaGetLastError() == cudaSuccess, "launch");
        std::vector<uint32_t> out = to_host(dout, 64 * 4);
        int bad = 0, shown = 0;
        for (int w = 0; w < 2; w++)
            for (int l = 0; l < 32; l++)
                for (int i = 0; i < 4; i++) {
                    int m = 4 * w + i, row0, col0, row1, col1; /* the ISA's element for each half */
                    if (!trans)
                        row0 = row1 = l / 4, col0 = 2 * (l % 4), col1 = col0 + 1;
                    else
                        row0 = 2 * (l % 4), row1 = row0 + 1, col0 = col1 = l / 4;
                    uint32_t want = (uint32_t)(1000 * m + 10 * row0 + col0) |
                                    (uint32_t)(1000 * m + 10 * row1 + col1) << 16;
                    uint32_t got = out[(w * 32 + l) * 4 + i];
                    if (got != want) {
                        bad++;
                        if (shown++ < 4)
                            printf("  ldmatrix%s: warp %d lane %d register %d: got %u|%u<<16, want %u|%u<<16\n",
                                   trans ? ".trans" : "", w, l, i, got & 0xffff, got >> 16, want & 0xffff, want >> 16);
                    }
                }
        EXPECT(bad == 0, "ldmatrix.x4%s: %d of 256 registers not as the ISA lays them out", trans ? ".trans" : "", bad);
    }
    cudaFree(dimg), cudaFree(doff), cudaFree(dout);

    /* composed with the tensor-core product, against a plain product (a
     * permutation of k applied alike to A and B, such as swapped halves in
     * both, leaves any product unchanged: the direct checks above see it) */
    int bad = ldmatrix_mma_wrong<0, 0>();
    EXPECT(bad == 0, "bf16: A and B ([n][k]) by ldmatrix, mma: %d of 256 elements wrong", bad);
    bad = ldmatrix_mma_wrong<0, 1>();
    EXPECT(bad == 0, "bf16: A by ldmatrix, B ([k][n]) by ldmatrix.trans, mma: %d of 256 elements wrong", bad);
    bad = ldmatrix_mma_wrong<1, 0>();
    EXPECT(bad == 0, "fp16: A and B ([n][k]) by ldmatrix, mma: %d of 256 elements wrong", bad);
    bad = ldmatrix_mma_wrong<1, 1>();
    EXPECT(bad == 0, "fp16: A by ldmatrix, B ([k][n]) by ldmatrix.trans, mma: %d of 256 elements wrong", bad);
}

/* ---- cp.async ---------------------------------------------------------------------
 * From the PTX ISA (cp.async.cg.shared.global [dst], [src], 16, src-size;
 * commit_group; wait_group N): the copy is asynchronous, bytes past src-size
 * are zeros (src-size 0: src is not read); commit_group closes the thread's
 * pending copies into a group; wait_group N returns when at most the N most
 * recent groups of the thread are pending and all earlier ones are done; the
 * writes are then visible to the waiting thread, and to others only through
 * a barrier after it.  A read before the wait may see old or new bytes on a
 * GPU; the emulation copies at the wait in the first block it runs (and
 * every other one), so such a read sees the old ones, and at the issue in
 * the blocks between (emu_async_copy.cc).  These kernels run one block,
 * the first, except (e). */

/* (a) a block fills 128 chunks (16 bytes) of dynamic shared memory, two per thread */
__global__ void cp_async_fill(const uint32_t *src, uint32_t *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    uint32_t *s = (uint32_t *)dyn;
    int t = threadIdx.x, n = blockDim.x;
    spb_cp_async16(s + 4 * t, src + 4 * t, 16);
    spb_cp_async16(s + 4 * (2 * n - 1 - t), src + 4 * (2 * n - 1 - t), 16);
    spb_cp_async_commit();
    spb_cp_async_wait<0>();
    __syncthreads();
    for (int i = t; i < 8 * n; i += n) out[i] = s[i];
}
/* (b) chunk t with src_bytes 0 for even t (zeros, src not read) and 16 for
 * odd t; with `partial`, src_bytes 4, 8 or 12 instead (the ISA allows any up
 * to 16; the project uses 0 and 16) */
__global__ void cp_async_sized(const uint32_t *src, uint32_t *out, int partial)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    uint32_t *s = (uint32_t *)dyn;
    int t = threadIdx.x, n = blockDim.x;
    for (int i = 0; i < 4; i++) s[4 * t + i] = 0x5a5a0000u + 4 * t + i;
    __syncthreads();
    spb_cp_async16(s + 4 * t, src + 4 * t, partial ? 4 * (1 + t % 3) : t % 2 ? 16 : 0);
    spb_cp_async_commit();
    spb_cp_async_wait<0>();
    __syncthreads();
    for (int i = t; i < 4 * n; i += n) out[i] = s[i];
}
/* (c) three groups, waited for one at a time; each thread looks at its own
 * chunks in regions A, B, C (pre-filled) after each wait */
__global__ void cp_async_groups(const uint32_t *src, uint32_t *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    uint32_t *s = (uint32_t *)dyn;
    int t = threadIdx.x, n = blockDim.x;
    for (int i = t; i < 12 * n; i += n) s[i] = 0x77000000u + i;
    __syncthreads();
    for (int g = 0; g < 3; g++) {
        spb_cp_async16(s + 4 * (g * n + t), src + 4 * (g * n + t), 16);
        spb_cp_async_commit();
    }
    int k = 0; /* out: snapshot k (0..5), thread t, 4 words */
    spb_cp_async_wait<2>();
    for (int g = 0; g < 3; g++, k++)
        for (int i = 0; i < 4; i++) out[(k * n + t) * 4 + i] = s[4 * (g * n + t) + i];
    spb_cp_async_wait<1>();
    for (int g = 1; g < 3; g++, k++)
        for (int i = 0; i < 4; i++) out[(k * n + t) * 4 + i] = s[4 * (g * n + t) + i];
    spb_cp_async_wait<0>();
    for (int i = 0; i < 4; i++) out[(k * n + t) * 4 + i] = s[4 * (2 * n + t) + i];
}
/* a copy not committed to a group: wait_group 0 does not cover it */
__global__ void cp_async_uncommitted(const uint32_t *src, uint32_t *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    uint32_t *s = (uint32_t *)dyn;
    int t = threadIdx.x;
    for (int i = 0; i < 4; i++) s[4 * t + i] = 0x66000000u + 4 * t + i;
    __syncthreads();
    spb_cp_async16(s + 4 * t, src + 4 * t, 16);
    spb_cp_async_wait<0>();
    for (int i = 0; i < 4; i++) out[4 * t + i] = s[4 * t + i];
    spb_cp_async_commit();
    spb_cp_async_wait<0>();
    for (int i = 0; i < 4; i++) out[4 * (blockDim.x + t) + i] = s[4 * t + i];
}
/* (d) thread t copies chunk t, waits, reads chunk t+1: without a barrier
 * after the waits it races with thread t+1's copy */
template <int BARRIER> __global__ void cp_async_neighbour(const uint32_t *src, uint32_t *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    uint32_t *s = (uint32_t *)dyn;
    int t = threadIdx.x, n = blockDim.x, u = (t + 1) % n;
    for (int i = 0; i < 4; i++) s[4 * t + i] = 0x33000000u + 4 * t + i;
    __syncthreads();
    spb_cp_async16(s + 4 * t, src + 4 * t, 16);
    spb_cp_async_commit();
    spb_cp_async_wait<0>();
    if (BARRIER) __syncthreads();
    for (int i = 0; i < 4; i++) out[4 * t + i] = s[4 * u + i];
}

/* (e) thread t reads chunk t+1, then copies over chunk t: without a barrier
 * between, thread t+1's copy may overwrite the chunk before thread t reads
 * it (the prefetch into a double buffer that others still read).  Each
 * block's threads report what they read. */
template <int BARRIER> __global__ void cp_async_overwrite(const uint32_t *src, uint32_t *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    uint32_t *s = (uint32_t *)dyn;
    int t = threadIdx.x, n = blockDim.x, u = (t + 1) % n;
    for (int i = 0; i < 4; i++) s[4 * t + i] = 0x44000000u + 4 * t + i;
    __syncthreads();
    uint32_t seen[4];
    for (int i = 0; i < 4; i++) seen[i] = s[4 * u + i];
    if (BARRIER) __syncthreads();
    spb_cp_async16(s + 4 * t, src + 4 * t, 16);
    spb_cp_async_commit();
    spb_cp_async_wait<0>();
    __syncthreads();
    for (int i = 0; i < 4; i++) out[(blockIdx.x * n + t) * 4 + i] = seen[i];
}
/* (f) when a copy lands: thread 0 of each block reads its destination
 * before any wait, then after one */
__global__ void cp_async_landing(const uint32_t *src, uint32_t *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    uint32_t *s = (uint32_t *)dyn;
    s[0] = 0x55000000u;
    spb_cp_async16(s, src, 16);
    spb_cp_async_commit();
    out[2 * blockIdx.x] = s[0];
    spb_cp_async_wait<0>();
    out[2 * blockIdx.x + 1] = s[0];
}

static void check_cp_async(void)
{
    const int T = 64, W = 12 * T; /* words */
    std::vector<uint32_t> src(W);
    for (int i = 0; i < W; i++) src[i] = 0xc0de0000u + (uint32_t)i * 2654435761u % 65536u;
    uint32_t *dsrc = device_array<uint32_t>(W), *dout = device_array<uint32_t>(6 * 4 * T);
    cudaMemcpy(dsrc, src.data(), W * 4, cudaMemcpyHostToDevice);

    /* (a) */
    cp_async_fill<<<1, T, 8 * T * 4>>>(dsrc, dout);
    EXPECT(cudaGetLastError() == cudaSuccess, "launch");
    std::vector<uint32_t> o = to_host(dout, 8 * T);
    int bad = 0;
    for (int i = 0; i < 8 * T; i++) bad += o[i] != src[i];
    EXPECT(bad == 0, "cp.async fill: %d of %d words differ from the source", bad, 8 * T);

    /* (b) */
    cp_async_sized<<<1, T, 4 * T * 4>>>(dsrc, dout, 0);
    o = to_host(dout, 4 * T);
    int bad_zero = 0, bad_copy = 0;
    for (int i = 0; i < 4 * T; i++)
        if (i / 4 % 2)
            bad_copy += o[i] != src[i];
        else
            bad_zero += o[i] != 0;
    EXPECT(bad_zero == 0, "cp.async src_bytes 0: %d of %d words not zero", bad_zero, 2 * T);
    EXPECT(bad_copy == 0, "cp.async src_bytes 16 beside src_bytes 0: %d of %d words wrong", bad_copy, 2 * T);

    /* src-size 4, 8, 12: the ISA's zero fill of the rest, or a refusal (the
     * wrapper promises only 0 and 16) */
    {
        int st = in_child([&] {
            cp_async_sized<<<1, T, 4 * T * 4>>>(dsrc, dout, 1);
            std::vector<uint32_t> p = to_host(dout, 4 * T);
            int wrong = 0;
            for (int t = 0; t < T; t++)
                for (int i = 0; i < 4; i++) wrong += p[4 * t + i] != (i < 1 + t % 3 ? src[4 * t + i] : 0u);
            _exit(wrong ? 3 : 0);
        });
        int exact = WIFEXITED(st) && WEXITSTATUS(st) == 0, refused = WIFSIGNALED(st);
        printf("  cp.async src_bytes 4/8/12: %s\n", exact ? "zero-filled as the ISA says" : refused ? "refused" : "WRONG");
        EXPECT(exact || refused, "cp.async with src_bytes 4, 8, 12 neither zero-fills the rest nor is refused");
    }

    /* (c) wait_group N: the N most recent groups may still be pending.
     * These kernels read copies in flight on purpose, to see where they
     * land; the race-check build stops at such reads (check_block_races). */
#ifndef SPB_EMU_RACECHECK
    cp_async_groups<<<1, T, 12 * T * 4>>>(dsrc, dout);
    o = to_host(dout, 6 * 4 * T);
    const int snap_group[6] = {0, 1, 2, 1, 2, 2}, snap_done[6] = {1, 0, 0, 1, 0, 1};
    const char *snap_name[6] = {"A after wait<2>", "B after wait<2>", "C after wait<2>",
                                "B after wait<1>", "C after wait<1>", "C after wait<0>"};
    for (int k = 0; k < 6; k++) {
        bad = 0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < 4; i++) {
                int w = 4 * (snap_group[k] * T + t) + i;
                bad += o[(k * T + t) * 4 + i] != (snap_done[k] ? src[w] : 0x77000000u + (uint32_t)w);
            }
        EXPECT(bad == 0, "cp.async groups: %s: %d of %d words are not the %s", snap_name[k], bad, 4 * T,
               snap_done[k] ? "copy" : "earlier contents");
    }

    /* a copy outside any group is not covered by wait_group 0 (the ISA's
     * wait_all is commit_group + wait_group 0) */
    cp_async_uncommitted<<<1, T, 4 * T * 4>>>(dsrc, dout);
    o = to_host(dout, 2 * 4 * T);
    int stale = 0;
    bad = 0;
    for (int i = 0; i < 4 * T; i++) {
        stale += o[i] == 0x66000000u + (uint32_t)i;
        bad += o[4 * T + i] != src[i];
    }
    EXPECT(stale == 4 * T, "an uncommitted copy landed at wait_group 0 (%d of %d words stale)", stale, 4 * T);
    EXPECT(bad == 0, "commit + wait_group 0 after an uncommitted copy: %d of %d words wrong", bad, 4 * T);
#endif

    /* (d) the emulation exposes a missing barrier after the waits: a GPU's
     * copies may well have landed by then and hide the race (the
     * race-check build stops at it: check_block_races) */
#ifndef SPB_EMU_RACECHECK
    cp_async_neighbour<0><<<1, T, 4 * T * 4>>>(dsrc, dout);
    o = to_host(dout, 4 * T);
    int chunks_stale = 0, garbage = 0;
    for (int t = 0; t < T; t++) {
        int u = (t + 1) % T, old = 1, copied = 1;
        for (int i = 0; i < 4; i++) {
            old &= o[4 * t + i] == 0x33000000u + (uint32_t)(4 * u + i);
            copied &= o[4 * t + i] == src[4 * u + i];
        }
        chunks_stale += old;
        garbage += !old && !copied;
    }
    EXPECT(chunks_stale > 0, "a read of another thread's cp.async without a barrier went unnoticed");
    EXPECT(garbage == 0, "%d chunks neither the old contents nor the copy", garbage);
#endif
    cp_async_neighbour<1><<<1, T, 4 * T * 4>>>(dsrc, dout);
    o = to_host(dout, 4 * T);
    bad = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < 4; i++) bad += o[4 * t + i] != src[4 * ((t + 1) % T) + i];
    EXPECT(bad == 0, "with a barrier after the waits, %d of %d words of other threads' copies wrong", bad, 4 * T);

    /* (e) over 4 blocks: an overwrite before the others have read shows in
     * the blocks whose copies land at issue, and never with the barrier */
    const int B = 4;
    uint32_t *dover = device_array<uint32_t>(B * 4 * T);
#ifdef SPB_EMU_RACECHECK
    for (int barrier = 1; barrier < 2; barrier++) { /* without: check_block_races */
#else
    for (int barrier = 0; barrier < 2; barrier++) {
#endif
        if (barrier)
            cp_async_overwrite<1><<<B, T, 4 * T * 4>>>(dsrc, dover);
        else
            cp_async_overwrite<0><<<B, T, 4 * T * 4>>>(dsrc, dover);
        o = to_host(dover, B * 4 * T);
        int overwritten = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                overwritten += o[(b * T + t) * 4] != 0x44000000u + 4 * (uint32_t)((t + 1) % T);
        if (barrier)
            EXPECT(overwritten == 0, "with a barrier before the copies, %d reads saw them", overwritten);
        else
            EXPECT(overwritten > 0, "a copy over what another thread had not read yet went unnoticed");
    }
    cudaFree(dover);

    /* (f) both ends of the window: half the blocks see the copy before the wait */
#ifndef SPB_EMU_RACECHECK
    cp_async_landing<<<B, 1, 16>>>(dsrc, dout);
    o = to_host(dout, 2 * B);
    int early = 0, late = 0;
    for (int b = 0; b < B; b++) {
        early += o[2 * b] == src[0];
        late += o[2 * b] == 0x55000000u;
        EXPECT(o[2 * b + 1] == src[0], "block %d: the copy had not landed after wait_group 0", b);
    }
    EXPECT(early == B / 2 && late == B / 2, "%d blocks saw the copy land at issue, %d at the wait (of %d)", early,
           late, B);
#endif
    cudaFree(dsrc), cudaFree(dout);
}

/* ---- what the emulator refuses of ldmatrix and cp.async ------------------------ */
__global__ void ldmatrix_misaligned(uint32_t *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    uint32_t r[4];
    int l = threadIdx.x;
    for (int i = l; i < 1024; i += 32) dyn[i] = (unsigned char)i;
    __syncthreads();
    spb_ldmatrix_x4(r, dyn + 16 * l + (l == 5 ? 8 : 0)); /* lane 5: 8-byte aligned only */
    out[l] = r[0];
}
__global__ void ldmatrix_static_shared(uint32_t *out)
{
    __shared__ __align__(16) unsigned char st[1024];
    uint32_t r[4];
    int l = threadIdx.x;
    for (int i = l; i < 1024; i += 32) st[i] = (unsigned char)i;
    __syncthreads();
    spb_ldmatrix_x4(r, st + 16 * l);
    out[l] = r[0];
}
__global__ void ldmatrix_past_dynamic(uint32_t *out, int bytes)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    uint32_t r[4];
    int l = threadIdx.x;
    spb_ldmatrix_x4(r, dyn + (l == 31 ? bytes : 16 * l)); /* lane 31: just past the end */
    out[l] = r[0];
}
__global__ void cp_async_to_static_shared(const uint32_t *src, uint32_t *out)
{
    __shared__ __align__(16) uint32_t st[4 * 32];
    int t = threadIdx.x;
    spb_cp_async16(st + 4 * t, src + 4 * t, 16);
    spb_cp_async_commit();
    spb_cp_async_wait<0>();
    out[t] = st[4 * t];
}
__global__ void cp_async_to_global(const uint32_t *src, uint32_t *dst)
{
    int t = threadIdx.x;
    spb_cp_async16(dst + 4 * t, src + 4 * t, 16);
    spb_cp_async_commit();
    spb_cp_async_wait<0>();
}
__global__ void cp_async_misaligned(const uint32_t *src, uint32_t *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    int t = threadIdx.x;
    spb_cp_async16(dyn + 16 * t + (t == 7 ? 8 : 0), src + 4 * t, 16);
    spb_cp_async_commit();
    spb_cp_async_wait<0>();
    out[t] = dyn[16 * t];
}

/* 1 when f() ends the process as a refusal of the emulator's: killed
 * (SIGABRT) or a non-zero exit, with a message that is not
 * AddressSanitizer's (and that says `needle`, where given); prints the
 * message */
template <typename F> static int refused_saying(const char *what, const char *needle, F f)
{
    fflush(stdout);
    fflush(stderr);
    int fd[2];
    if (pipe(fd) != 0) return 0;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        close(fd[1]);
        f();
        cudaDeviceSynchronize();
        _exit(0);
    }
    close(fd[1]);
    std::string msg;
    char buf[512];
    ssize_t k;
    while ((k = read(fd[0], buf, sizeof buf)) > 0) msg.append(buf, (size_t)k);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    int died = WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0);
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    for (size_t p = 0; (p = msg.find('\n', p)) != std::string::npos; p += 5) msg.replace(p, 1, "\n    ");
    printf("  %s: %s\n    %s\n", what, died ? (WIFSIGNALED(st) ? "killed by a signal" : "non-zero exit") : "NOT refused",
           msg.empty() ? "(no message)" : msg.c_str());
    return died && !msg.empty() && msg.find("AddressSanitizer") == std::string::npos &&
           (!needle || msg.find(needle) != std::string::npos);
}
template <typename F> static int refused(const char *what, F f) { return refused_saying(what, nullptr, f); }

static void check_ptx_refusals(void)
{
    uint32_t *out = device_array<uint32_t>(1024), *src = device_array<uint32_t>(1024);
    cudaMemset(src, 0, 4096);
    EXPECT(refused("ldmatrix, a row 8-byte aligned", [&] { ldmatrix_misaligned<<<1, 32, 1024>>>(out); }),
           "ldmatrix from a misaligned row not refused");
    EXPECT(refused("ldmatrix from static shared memory", [&] { ldmatrix_static_shared<<<1, 32>>>(out); }),
           "ldmatrix outside the dynamic shared memory not refused");
    EXPECT(refused("ldmatrix, a row past the dynamic shared memory",
                   [&] { ldmatrix_past_dynamic<<<1, 32, 512>>>(out, 512); }),
           "ldmatrix past the launch's dynamic shared memory not refused");
    EXPECT(refused("cp.async to static shared memory", [&] { cp_async_to_static_shared<<<1, 32>>>(src, out); }),
           "cp.async into static shared memory not refused");
    EXPECT(refused("cp.async to global memory", [&] { cp_async_to_global<<<1, 32>>>(src, out); }),
           "cp.async into global memory not refused");
    EXPECT(refused("cp.async, a destination 8-byte aligned", [&] { cp_async_misaligned<<<1, 32, 512>>>(src, out); }),
           "cp.async to a misaligned destination not refused");
    cudaFree(out), cudaFree(src);
}


/* ---- the bulk reduction and the 8-byte reduction (warpgroup_ptx.cuh, warp_ptx.cuh,
 * emu_bulk_copy.cc) --------------------------------------------------------------
 * Every block stages ROWS rows of 16 floats (row r, column c: 100 r + c +
 * block) in shared memory, one element per thread, and after a barrier
 * thread 0 adds each row to row r of dst with one bulk reduction, commits
 * and waits: dst ends as its first value plus the sum over the blocks. */
constexpr int kBulkRows = 4;
__global__ void bulk_rows(float *dst, int ld)
{
    extern __shared__ __align__(16) float stage[];
    const int t = threadIdx.x;
    stage[t] = (float)(100 * (t / 16) + t % 16 + (int)blockIdx.x);
    spb_fence_proxy_async();
    __syncthreads();
    if (t == 0) {
        for (int r = 0; r < kBulkRows; r++) spb_bulk_reduce_add_f32(dst + r * ld, stage + 16 * r, 64);
        spb_bulk_commit();
        spb_bulk_wait_read<0>();
        spb_bulk_wait<0>();
    }
}
/* the source overwritten after the issue, before the wait: the add takes
 * the old value in the blocks where it happens at issue, the new in the
 * others (out[block]) */
__global__ void bulk_overwritten(float *out)
{
    extern __shared__ __align__(16) float stage[];
    for (int i = 0; i < 4; i++) stage[i] = 1.0f;
    spb_bulk_reduce_add_f32(out + 4 * blockIdx.x, stage, 16);
    spb_bulk_commit();
    stage[0] = 2.0f; /* the race this kernel exists for */
    spb_bulk_wait<0>();
}
/* refusals: a size that is not a multiple of 16, a misaligned destination,
 * a source in static shared memory, a thread that ends without waiting
 * (committed or not) */
__global__ void bulk_bad(float *dst, int what)
{
    extern __shared__ __align__(16) float stage[];
    __shared__ __align__(16) float st[16];
    for (int i = 0; i < 16; i++) stage[i] = st[i] = 0.0f;
    if (what == 0) spb_bulk_reduce_add_f32(dst, stage, 24);
    if (what == 1) spb_bulk_reduce_add_f32(dst + 2, stage, 16);
    if (what == 2) spb_bulk_reduce_add_f32(dst, st, 16);
    if (what >= 3) spb_bulk_reduce_add_f32(dst, stage, 16);
    if (what != 4) spb_bulk_commit();
    if (what < 3) spb_bulk_wait<0>();
    if (what == 4) spb_bulk_wait<0>(); /* covers no group: still in flight at the end */
}
/* the 8-byte reduction: every thread of every block adds (1, 2) to pair
 * t % 4 of out; at p = out + 1, misaligned */
__global__ void red_pairs(float *out, int misaligned)
{
    spb_red_add_f32x2(out + 2 * (threadIdx.x % 4) + misaligned, 1.0f, 2.0f);
}
/* a write to the staged rows before the wait that covers their read */
__global__ void bulk_early_write(float *dst)
{
    extern __shared__ __align__(16) float stage[];
    const int t = threadIdx.x;
    stage[t] = 1.0f;
    spb_fence_proxy_async();
    __syncthreads();
    if (t == 0) {
        spb_bulk_reduce_add_f32(dst, stage, 4 * 32);
        spb_bulk_commit();
    }
    __syncthreads();
    stage[t] = 2.0f; /* thread 0 has not waited: the engine may still read it */
    __syncthreads();
    if (t == 0) spb_bulk_wait<0>();
}

static void check_bulk_reduce(void)
{
    const int B = 4, ld = 20; /* rows 80 bytes apart: 16-byte aligned, not contiguous */
    float *dst = device_array<float>(kBulkRows * ld);
    std::vector<float> first(kBulkRows * ld);
    for (int i = 0; i < kBulkRows * ld; i++) first[i] = 0.5f * (float)i;
    cudaMemcpy(dst, first.data(), first.size() * sizeof(float), cudaMemcpyHostToDevice);
    bulk_rows<<<B, 16 * kBulkRows, 4 * 16 * kBulkRows>>>(dst, ld);
    std::vector<float> h = to_host(dst, kBulkRows * ld);
    int bad = 0;
    for (int r = 0; r < kBulkRows; r++)
        for (int c = 0; c < ld; c++) {
            float want = first[r * ld + c] + (c < 16 ? (float)(B * (100 * r + c) + B * (B - 1) / 2) : 0.0f);
            bad += h[r * ld + c] != want;
        }
    EXPECT(bad == 0, "%d of %d elements wrong after the bulk reductions of %d blocks", bad, kBulkRows * ld, B);

    float *out = device_array<float>(8);
    cudaMemset(out, 0, 8 * sizeof(float));
    red_pairs<<<3, 64>>>(out, 0);
    std::vector<float> p = to_host(out, 8);
    bad = 0;
    for (int i = 0; i < 8; i++) bad += p[i] != (i % 2 ? 96.0f : 48.0f);
    EXPECT(bad == 0, "%d of 8 sums wrong after 192 8-byte reductions", bad);
    EXPECT(refused("red.global.add.v2.f32, 4-byte aligned", [&] { red_pairs<<<1, 32>>>(out, 1); }),
           "an 8-byte reduction at a misaligned address not refused");

#ifndef SPB_EMU_RACECHECK
    float *ov = device_array<float>(4 * B);
    cudaMemset(ov, 0, 4 * B * sizeof(float));
    bulk_overwritten<<<B, 1, 16>>>(ov);
    std::vector<float> o = to_host(ov, 4 * B);
    int early = 0, late = 0;
    for (int b = 0; b < B; b++) early += o[4 * b] == 1.0f, late += o[4 * b] == 2.0f;
    EXPECT(early == B / 2 && late == B / 2, "%d blocks added the source as at the issue, %d as at the wait (of %d)",
           early, late, B);
    cudaFree(ov);
#else
    EXPECT(refused("a staged row written before the wait", [&] { bulk_early_write<<<1, 32, 128>>>(dst); }),
           "a write to a bulk reduction's source before its wait not reported");
#endif
    EXPECT(refused("bulk reduction of 24 bytes", [&] { bulk_bad<<<1, 1, 64>>>(dst, 0); }),
           "a bulk reduction of 24 bytes not refused");
    EXPECT(refused("bulk reduction to an 8-byte aligned address", [&] { bulk_bad<<<1, 1, 64>>>(dst, 1); }),
           "a bulk reduction to a misaligned destination not refused");
    EXPECT(refused("bulk reduction from static shared memory", [&] { bulk_bad<<<1, 1, 64>>>(dst, 2); }),
           "a bulk reduction from static shared memory not refused");
    EXPECT(refused("a thread that ends before its wait", [&] { bulk_bad<<<1, 1, 64>>>(dst, 3); }),
           "a thread ending with a bulk reduction in flight not refused");
    EXPECT(refused("a thread whose wait covers no group", [&] { bulk_bad<<<1, 1, 64>>>(dst, 4); }),
           "an uncommitted bulk reduction left at the thread's end not refused");
    cudaFree(dst), cudaFree(out);
}

/* ---- wgmma (warpgroup_ptx.cuh, emu_wgmma.cc) ---------------------------------------
 * Operands laid out here from the PTX ISA's text, not from the emulator's
 * code: the canonical no-swizzle layouts (K-major: element (row m, k) at
 * byte 16 (m % 8) + SBO (m / 8) + 2 (k % 8) + LBO (k / 8); MN-major:
 * (k, n) at 2 (n % 8) + SBO (n / 8) + 16 (k % 8) + LBO (k / 8)), D in the
 * "register fragment layout for accumulator D" (warp w of the group: rows
 * 16w + g, 16w + g + 8; register 4i + e at column 8i + 2t + (e & 1)), and
 * A from registers in mma.m16n8k16's A layout.  Strides with gaps, so a
 * model that assumed dense tiles would read the wrong bytes. */
static uint32_t km_byte(int m, int k, uint32_t lbo, uint32_t sbo)
{
    return 16u * (m % 8) + sbo * (m / 8) + 2u * (k % 8) + lbo * (k / 8);
}
static uint32_t mn_byte(int k, int n, uint32_t lbo, uint32_t sbo)
{
    return 2u * (n % 8) + sbo * (n / 8) + 16u * (k % 8) + lbo * (k / 8);
}
struct wg_layout {
    uint32_t a_off, a_lbo, a_sbo, b_off, b_lbo, b_sbo, bytes;
};
/* the D fragment of this thread (n/2 values) to out[64][n] */
__device__ void store_d(float *out, const float *d, int n)
{
    int w = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int i = 0; i < n / 8; i++)
        for (int e = 0; e < 4; e++) out[(16 * w + g + 8 * (e >= 2)) * n + 8 * i + 2 * t + (e & 1)] = d[4 * i + e];
}
/* D = A B (SS: both K-major from shared memory), over WG warpgroups (each the same product) */
template <int FP16> __global__ void wgmma_ss(const unsigned char *img, wg_layout L, float *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    for (uint32_t i = threadIdx.x; i < L.bytes; i += blockDim.x) dyn[i] = img[i];
    spb_fence_proxy_async();
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 1e30f; /* accumulate = 0: never read */
    spb_wgmma_fence();
    spb_wgmma_m64n64_ss<FP16>(d, spb_wgmma_desc(dyn + L.a_off, L.a_lbo, L.a_sbo),
                              spb_wgmma_desc(dyn + L.b_off, L.b_lbo, L.b_sbo), 0);
    spb_wgmma_commit();
    spb_wgmma_wait<0>();
    store_d(out + threadIdx.x / 128 * 64 * 64, d, 64);
}
/* D = C + A B, A (64 x 16, row-major in global memory) into registers in
 * mma's A layout, B MN-major from shared memory */
template <int FP16, int N>
__global__ void wgmma_rs(const uint16_t *A, const float *C, const unsigned char *img, wg_layout L, float *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    for (uint32_t i = threadIdx.x; i < L.bytes; i += blockDim.x) dyn[i] = img[i];
    spb_fence_proxy_async();
    __syncthreads();
    int w = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    uint32_t a[4];
    for (int j = 0; j < 4; j++) { /* register j: elements 2j (low half), 2j + 1 */
        uint16_t e[2];
        for (int h = 0; h < 2; h++) {
            int i = 2 * j + h, row = 16 * w + g + 8 * ((i / 2) % 2), col = 2 * t + (i % 2) + 8 * (i / 4);
            e[h] = A[row * 16 + col];
        }
        a[j] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
    float d[N / 2];
    for (int i = 0; i < N / 8; i++)
        for (int e = 0; e < 4; e++) d[4 * i + e] = C[(16 * w + g + 8 * (e >= 2)) * N + 8 * i + 2 * t + (e & 1)];
    spb_wgmma_fence();
    spb_wgmma_m64nN_rs_mn<FP16, N>(d, a, spb_wgmma_desc(dyn + L.b_off, L.b_lbo, L.b_sbo));
    spb_wgmma_commit();
    spb_wgmma_wait<0>();
    store_d(out, d, N);
}
/* the operand overwritten by another warpgroup after the product's issue
 * and before its wait (behind a barrier): the product is computed from
 * what is there at the wait */
__global__ void wgmma_overwritten_in_flight(const unsigned char *img, wg_layout L, float *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    for (uint32_t i = threadIdx.x; i < L.bytes; i += blockDim.x) dyn[i] = img[i];
    spb_fence_proxy_async();
    __syncthreads();
    float d[32];
    if (threadIdx.x < 128) {
        spb_wgmma_fence();
        spb_wgmma_m64n64_ss<0>(d, spb_wgmma_desc(dyn + L.a_off, L.a_lbo, L.a_sbo),
                               spb_wgmma_desc(dyn + L.b_off, L.b_lbo, L.b_sbo), 0);
        spb_wgmma_commit();
    }
    __syncthreads();
    if (threadIdx.x >= 128) /* the second warpgroup zeroes B: a GPU may or may not have read it yet */
        for (uint32_t i = threadIdx.x - 128; i < L.bytes - L.b_off; i += 128) dyn[L.b_off + i] = 0;
    __syncthreads();
    if (threadIdx.x < 128) {
        spb_wgmma_wait<0>();
        store_d(out, d, 64);
    }
}
__global__ void wgmma_without_fence(float *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    float d[32] = {0};
    spb_wgmma_m64n64_ss<0>(d, spb_wgmma_desc(dyn, 128, 256), spb_wgmma_desc(dyn, 128, 256), 0);
    spb_wgmma_commit();
    spb_wgmma_wait<0>();
    out[threadIdx.x] = d[0];
}
__global__ void wgmma_operand(float *out, uint64_t extra_bits, int start)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    float d[32] = {0};
    spb_wgmma_fence();
    spb_wgmma_m64n64_ss<0>(d, spb_wgmma_desc(dyn, 128, 256), spb_wgmma_desc(dyn + start, 128, 256) | extra_bits, 0);
    spb_wgmma_commit();
    spb_wgmma_wait<0>();
    out[threadIdx.x] = d[0];
}

/* only the first warpgroup of the block issues */
__global__ void wgmma_first_group(float *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    for (int i = threadIdx.x; i < 4096; i += blockDim.x) dyn[i] = 0;
    __syncthreads();
    if (threadIdx.x >= 128) return;
    float d[32];
    spb_wgmma_fence();
    spb_wgmma_m64n64_ss<0>(d, spb_wgmma_desc(dyn, 128, 256), spb_wgmma_desc(dyn, 128, 256), 0);
    spb_wgmma_commit();
    spb_wgmma_wait<0>();
    out[threadIdx.x] = d[0];
}

static uint16_t half_bits(float v, int fp16)
{
    uint16_t b;
    if (fp16) {
        __half h = __float2half_rn(v);
        memcpy(&b, &h, 2);
    } else {
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        memcpy(&b, &h, 2);
    }
    return b;
}
static float small_value(int i, int mod) { return (float)((i * 7 + 3) % mod) - (float)(mod / 2); }

template <int FP16> static void check_wgmma_ss(void)
{
    /* A 64x16 then B 64x16 (B[n][k]: N = 64 rows), K-major, padded strides */
    wg_layout L;
    L.a_off = 0, L.a_sbo = 144, L.a_lbo = 8 * 144 + 32;      /* 8-row groups 144 B apart, then the next 8 columns */
    L.b_off = 2 * L.a_lbo + 64, L.b_sbo = 128 + 16 * 3, L.b_lbo = 8 * L.b_sbo + 16;
    L.bytes = L.b_off + 2 * L.b_lbo;
    std::vector<unsigned char> img(L.bytes, 0xff); /* gaps: NaN either way */
    std::vector<float> A(64 * 16), B(64 * 16);
    for (int m = 0; m < 64; m++)
        for (int k = 0; k < 16; k++) {
            A[m * 16 + k] = small_value(m * 16 + k, 9), B[m * 16 + k] = small_value(m * 31 + k * 5, 7);
            uint16_t a = half_bits(A[m * 16 + k], FP16), b = half_bits(B[m * 16 + k], FP16);
            memcpy(&img[L.a_off + km_byte(m, k, L.a_lbo, L.a_sbo)], &a, 2);
            memcpy(&img[L.b_off + km_byte(m, k, L.b_lbo, L.b_sbo)], &b, 2);
        }
    unsigned char *dimg = device_array<unsigned char>(L.bytes);
    float *dout = device_array<float>(2 * 64 * 64);
    cudaMemcpy(dimg, img.data(), L.bytes, cudaMemcpyHostToDevice);
    wgmma_ss<FP16><<<1, 256, L.bytes>>>(dimg, L, dout); /* two warpgroups, the same product */
    std::vector<float> D = to_host(dout, 2 * 64 * 64);
    int bad = 0;
    for (int q = 0; q < 2; q++)
        for (int m = 0; m < 64; m++)
            for (int n = 0; n < 64; n++) {
                float want = 0.0f;
                for (int k = 0; k < 16; k++) want += A[m * 16 + k] * B[n * 16 + k];
                bad += D[q * 4096 + m * 64 + n] != want;
            }
    EXPECT(bad == 0, "%s wgmma m64n64k16, A and B K-major from shared memory: %d of 8192 elements wrong",
           FP16 ? "fp16" : "bf16", bad);
    cudaFree(dimg), cudaFree(dout);
}

template <int FP16, int N> static void check_wgmma_rs(void)
{
    /* B (16 x N) MN-major: 8-column groups SBO apart, 8-key groups LBO apart */
    wg_layout L;
    L.a_off = L.a_lbo = L.a_sbo = 0;
    L.b_off = 32, L.b_sbo = 128 + 16, L.b_lbo = (N / 8) * L.b_sbo + 48;
    L.bytes = L.b_off + 2 * L.b_lbo;
    std::vector<unsigned char> img(L.bytes, 0xff);
    std::vector<float> A(64 * 16), B(16 * N), C(64 * N);
    std::vector<uint16_t> Abits(64 * 16);
    for (int i = 0; i < 64 * 16; i++) A[i] = small_value(i, 11), Abits[i] = half_bits(A[i], FP16);
    for (int i = 0; i < 64 * N; i++) C[i] = small_value(i, 13);
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < N; n++) {
            B[k * N + n] = small_value(k * 17 + n * 3, 5);
            uint16_t b = half_bits(B[k * N + n], FP16);
            memcpy(&img[L.b_off + mn_byte(k, n, L.b_lbo, L.b_sbo)], &b, 2);
        }
    unsigned char *dimg = device_array<unsigned char>(L.bytes);
    uint16_t *dA = device_array<uint16_t>(64 * 16);
    float *dC = device_array<float>(64 * N), *dout = device_array<float>(64 * N);
    cudaMemcpy(dimg, img.data(), L.bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(dA, Abits.data(), 2 * 64 * 16, cudaMemcpyHostToDevice);
    cudaMemcpy(dC, C.data(), 4 * 64 * N, cudaMemcpyHostToDevice);
    wgmma_rs<FP16, N><<<1, 128, L.bytes>>>(dA, dC, dimg, L, dout);
    std::vector<float> D = to_host(dout, (size_t)64 * N);
    int bad = 0;
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < N; n++) {
            float want = C[m * N + n];
            for (int k = 0; k < 16; k++) want += A[m * 16 + k] * B[k * N + n];
            bad += D[m * N + n] != want;
        }
    EXPECT(bad == 0, "%s wgmma m64n%dk16, A from registers, B MN-major, D += : %d of %d elements wrong",
           FP16 ? "fp16" : "bf16", N, bad, 64 * N);
    cudaFree(dimg), cudaFree(dA), cudaFree(dC), cudaFree(dout);
}

static void check_wgmma(void)
{
    check_wgmma_ss<0>();
    check_wgmma_ss<1>();
    check_wgmma_rs<0, 64>();
    check_wgmma_rs<1, 64>();
    check_wgmma_rs<0, 128>();
    check_wgmma_rs<1, 128>();
    /* the product reads its operands at the wait: B overwritten in flight gives A·0 */
    wg_layout L;
    L.a_off = 0, L.a_sbo = 128, L.a_lbo = 1024, L.b_off = 2048, L.b_sbo = 128, L.b_lbo = 1024, L.bytes = 4096;
    std::vector<unsigned char> img(L.bytes);
    for (uint32_t i = 0; i < L.bytes; i += 2) {
        uint16_t one = half_bits(1.0f, 0);
        memcpy(&img[i], &one, 2);
    }
    unsigned char *dimg = device_array<unsigned char>(L.bytes);
    float *dout = device_array<float>(64 * 64);
    cudaMemcpy(dimg, img.data(), L.bytes, cudaMemcpyHostToDevice);
#ifdef SPB_EMU_RACECHECK
    EXPECT(refused("wgmma operand overwritten before the wait",
                   [&] { wgmma_overwritten_in_flight<<<1, 256, L.bytes>>>(dimg, L, dout); }),
           "a wgmma operand overwritten in flight not reported as a race");
#else
    wgmma_overwritten_in_flight<<<1, 256, L.bytes>>>(dimg, L, dout);
    std::vector<float> D = to_host(dout, 64 * 64);
    EXPECT(D[0] == 0.0f && D[64 * 64 - 1] == 0.0f,
           "an operand overwritten before the wait: D[0] = %g (16 if read at issue, 0 at the wait)", D[0]);
#endif
    cudaFree(dimg), cudaFree(dout);
    float *out = device_array<float>(256);
    EXPECT(refused("wgmma without wgmma.fence", [&] { wgmma_without_fence<<<1, 128, 4096>>>(out); }),
           "a wgmma with no wgmma.fence before it not refused");
    EXPECT(refused("wgmma in a block of 96 threads", [&] { wgmma_operand<<<1, 96, 4096>>>(out, 0, 0); }),
           "a wgmma from a block that is not whole warpgroups not refused");
    EXPECT(refused("wgmma from the partial warpgroup of a block of 160 threads",
                   [&] { wgmma_operand<<<1, 160, 4096>>>(out, 0, 0); }),
           "a wgmma from threads 128..159 of a block of 160 (a partial warpgroup) not refused");
    EXPECT(completes([&] { wgmma_first_group<<<1, 160, 4096>>>(out); }),
           "a wgmma from the whole first warpgroup of a block of 160 threads refused");
    EXPECT(refused("wgmma, a 64-byte swizzled descriptor",
                   [&] { wgmma_operand<<<1, 128, 4096>>>(out, (uint64_t)2 << 62, 0); }),
           "a 64-byte swizzled descriptor not refused (no swizzle and 128 bytes are modelled)");
    EXPECT(refused("wgmma, a descriptor with a base offset",
                   [&] { wgmma_operand<<<1, 128, 4096>>>(out, (uint64_t)1 << 62 | (uint64_t)1 << 49, 0); }),
           "a descriptor with a base offset not refused");
    EXPECT(refused("wgmma, a K-major 128-byte-swizzled k16 slice across its row",
                   [&] { wgmma_operand<<<1, 128, 4096>>>(out, (uint64_t)1 << 62, 112); }),
           "a 128-byte-swizzled K-major descriptor starting 112 bytes into a row not refused");
    EXPECT(refused("wgmma, an operand past the dynamic shared memory",
                   [&] { wgmma_operand<<<1, 128, 4096>>>(out, 0, 3072); }),
           "a wgmma operand past the launch's dynamic shared memory not refused");
    cudaFree(out);
}

/* ---- stream order (emu_streams.cc) ------------------------------------------------
 * Everything still runs at its call; what is checked is the order a GPU
 * would guarantee: two operations on different streams that touch the same
 * bytes, one of them writing, with neither an event wait nor a host
 * synchronisation between them, must stop the program. */
__global__ void fill_ints(int *out, int v)
{
    out[threadIdx.x] = v;
}
__global__ void sum_ints(const int *in, int *total)
{
    if (threadIdx.x == 0) {
        int t = 0;
        for (int i = 0; i < 32; i++) t += in[i];
        *total = t;
    }
}

static void check_stream_order(void)
{
    int *buf = device_array<int>(32), *other = device_array<int>(32), *total = device_array<int>(1);
    int host[32];
    cudaStream_t comm, blocking, third;
    cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&third, cudaStreamNonBlocking);
    cudaStreamCreate(&blocking);
    cudaEvent_t ev, ev2;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&ev2, cudaEventDisableTiming);
    cudaDeviceSynchronize();

    /* a kernel writes on the default stream; a copy on a non-blocking stream reads */
    EXPECT(aborts([&] {
               fill_ints<<<1, 32>>>(buf, 1);
               cudaMemcpyAsync(other, buf, 128, cudaMemcpyDeviceToDevice, comm);
           }),
           "a read on another stream with no event wait after the write is not reported");
    EXPECT(completes([&] {
               fill_ints<<<1, 32>>>(buf, 1);
               cudaEventRecord(ev, 0);
               cudaStreamWaitEvent(comm, ev, 0);
               cudaMemcpyAsync(other, buf, 128, cudaMemcpyDeviceToDevice, comm);
           }),
           "a read ordered by an event is reported as a race");
    /* the other way: a write on the other stream, then a kernel's const read */
    EXPECT(aborts([&] {
               cudaMemsetAsync(buf, 0, 128, comm);
               sum_ints<<<1, 32>>>(buf, total);
           }),
           "a kernel reading what another stream writes, unordered, is not reported");
    EXPECT(completes([&] {
               cudaMemsetAsync(buf, 0, 128, comm);
               cudaStreamSynchronize(comm);
               sum_ints<<<1, 32>>>(buf, total);
           }),
           "a read after the host waited for the writing stream is reported");
    /* overwriting what another stream still reads (a send buffer reused too early) */
    EXPECT(aborts([&] {
               cudaMemcpyAsync(other, buf, 128, cudaMemcpyDeviceToDevice, comm);
               fill_ints<<<1, 32>>>(buf, 2);
           }),
           "an overwrite of what another stream reads, unordered, is not reported");
    /* only overlapping bytes conflict, and reads never conflict with reads */
    EXPECT(completes([&] {
               cudaMemsetAsync(buf, 0, 64, comm);
               cudaMemsetAsync(buf + 16, 0, 64, 0);
               cudaMemcpyAsync(host, other, 128, cudaMemcpyDeviceToHost, comm);
               sum_ints<<<1, 32>>>(other, total);
           }),
           "disjoint writes, or two reads, on two streams are reported");
    /* order is transitive through events: comm -> third -> default */
    EXPECT(completes([&] {
               cudaMemsetAsync(buf, 0, 128, comm);
               cudaEventRecord(ev, comm);
               cudaStreamWaitEvent(third, ev, 0);
               cudaEventRecord(ev2, third);
               cudaStreamWaitEvent(0, ev2, 0);
               sum_ints<<<1, 32>>>(buf, total);
           }),
           "an order through two events is not followed");
    /* a wait placed before the record does not order what follows it */
    EXPECT(aborts([&] {
               cudaEventRecord(ev, comm);
               cudaStreamWaitEvent(0, ev, 0);
               cudaMemsetAsync(buf, 0, 128, comm);
               sum_ints<<<1, 32>>>(buf, total);
           }),
           "work recorded after the event is taken as ordered");
    /* the legacy default stream and a blocking stream order each other */
    EXPECT(completes([&] {
               cudaMemsetAsync(buf, 0, 128, blocking);
               sum_ints<<<1, 32>>>(buf, total);
               fill_ints<<<1, 32>>>(other, 3);
               cudaMemsetAsync(other, 0, 128, blocking);
           }),
           "the implicit order of the default and blocking streams is not followed");
    /* a synchronous copy waits for the default stream only */
    EXPECT(aborts([&] {
               cudaMemsetAsync(buf, 0, 128, comm);
               cudaMemcpy(host, buf, 128, cudaMemcpyDeviceToHost);
           }),
           "a synchronous copy of what a non-blocking stream writes is not reported");
    EXPECT(completes([&] {
               cudaMemsetAsync(buf, 0, 128, comm);
               cudaDeviceSynchronize();
               cudaMemcpy(host, buf, 128, cudaMemcpyDeviceToHost);
           }),
           "a copy after cudaDeviceSynchronize is reported");
    cudaEventDestroy(ev), cudaEventDestroy(ev2);
    cudaStreamDestroy(comm), cudaStreamDestroy(blocking), cudaStreamDestroy(third);
    cudaFree(buf), cudaFree(other), cudaFree(total);
}

/* ---- races between the blocks of a launch (SPB_EMU_RACECHECK builds) ------ */
/* each block writes its own elements (adjacent bf16 values: distinct bytes) */
__global__ void own_elements(__nv_bfloat16 *out)
{
    out[blockIdx.x * blockDim.x + threadIdx.x] = __float2bfloat16((float)blockIdx.x);
}
/* every block writes element 0 */
__global__ void all_write_first(int *out) { if (threadIdx.x == 0) out[0] = (int)blockIdx.x; }
/* block b reads what block b - 1 writes in the same launch */
__global__ void read_neighbour_block(int *buf, int *out)
{
    if (threadIdx.x) return;
    buf[blockIdx.x] = (int)blockIdx.x;
    if (blockIdx.x > 0) out[blockIdx.x] = buf[blockIdx.x - 1];
}
/* block b writes what block b + 1 reads, in place: reads first, then writes */
__global__ void shift_in_place(int *buf)
{
    if (threadIdx.x) return;
    int next = blockIdx.x + 1 < gridDim.x ? buf[blockIdx.x + 1] : 0;
    buf[blockIdx.x] = next;
}
/* dynamic shared memory: thread t reads what thread t + 32 (another warp) wrote */
template <int BARRIER> __global__ void dyn_neighbour(int *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    int *s = (int *)dyn, t = threadIdx.x;
    s[t] = t;
    if (BARRIER) __syncthreads();
    out[blockIdx.x * blockDim.x + t] = s[(t + 32) % blockDim.x];
}
/* thread t reads word t + 32, then (no barrier) every thread writes its own */
__global__ void dyn_overwrite(int *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    int *s = (int *)dyn, t = threadIdx.x;
    s[t] = t;
    __syncthreads();
    int seen = s[(t + 32) % blockDim.x];
    s[t] = seen + 1;
    __syncthreads();
    out[t] = s[t];
}
/* every thread writes word 0 */
__global__ void dyn_same_word(int *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    int *s = (int *)dyn;
    s[0] = (int)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[0];
}
/* lane 0 of each warp writes a word its lane 1 then reads */
template <int SYNCWARP> __global__ void dyn_warp_handoff(int *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    int *s = (int *)dyn, t = threadIdx.x;
    if (t % 32 == 0) s[t] = 7;
    if (SYNCWARP) __syncwarp();
    if (t % 32 == 1) out[t] = s[t - 1];
}
/* every thread adds into one shared word with atomics */
__global__ void dyn_shared_atomics(int *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    int *s = (int *)dyn;
    if (threadIdx.x == 0) s[0] = 0;
    __syncthreads();
    atomicAdd(&s[0], 1);
    __syncthreads();
    if (threadIdx.x == 0) out[0] = s[0];
}
/* out[from, from + n) = 7, and nothing else of out */
__global__ void fill_tail(int *out, int from, int n)
{
    if ((int)threadIdx.x < n) out[from + threadIdx.x] = 7;
}
/* every block reads all of in[0, 32) (what an earlier launch wrote) */
__global__ void each_block_sums(const int *in, int *out)
{
    if (threadIdx.x) return;
    int t = 0;
    for (int i = 0; i < 32; i++) t += in[i];
    out[blockIdx.x] = t;
}
/* every block adds into one sum: atomics, no race */
__global__ void atomic_sum(const float *in, float *sum)
{
    atomicAdd(sum, in[blockIdx.x * blockDim.x + threadIdx.x]);
}
/* the same, and block 0 reads the sum (other blocks' atomics unordered with it) */
__global__ void atomic_sum_then_read(const float *in, float *sum, float *out)
{
    atomicAdd(sum, in[blockIdx.x * blockDim.x + threadIdx.x]);
    if (blockIdx.x == 0 && threadIdx.x == 0) *out = *sum;
}
/* the same sum with a plain read-modify-write: lost updates on a GPU */
__global__ void plain_sum(const float *in, float *sum)
{
    if (threadIdx.x == 0) *sum += in[blockIdx.x * blockDim.x];
}
/* a block's own write, then its own read (a barrier between): no race */
__global__ void write_then_read_own(int *buf, int *out)
{
    buf[blockIdx.x * blockDim.x + threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = buf[blockIdx.x * blockDim.x + (threadIdx.x + 1) % blockDim.x];
}
/* cp.async from what another block writes */
__global__ void cp_async_from_neighbour(uint32_t *buf, uint32_t *out)
{
    extern __shared__ __align__(16) unsigned char dyn[];
    buf[4 * blockIdx.x + threadIdx.x] = blockIdx.x;
    __syncthreads();
    if (threadIdx.x == 0 && blockIdx.x > 0) {
        spb_cp_async16(dyn, buf + 4 * (blockIdx.x - 1), 16);
        spb_cp_async_commit();
        spb_cp_async_wait<0>();
        out[blockIdx.x] = ((uint32_t *)dyn)[0];
    }
}

static void check_block_races(void)
{
#ifdef SPB_EMU_RACECHECK
    __nv_bfloat16 *h = device_array<__nv_bfloat16>(4 * 33);
    int *buf = device_array<int>(64), *iout = device_array<int>(128); /* dyn_neighbour: 2 blocks of 64 */
    float *in = device_array<float>(4 * 32), *sum = device_array<float>(1), *fout = device_array<float>(1);
    uint32_t *ubuf = device_array<uint32_t>(256), *uout = device_array<uint32_t>(256);
    cudaMemset(in, 0, 4 * 32 * sizeof(float));
    cudaMemset(buf, 0, 64 * sizeof(int));
    cudaMemset(ubuf, 0, 256 * sizeof(uint32_t));
    EXPECT(completes([&] { own_elements<<<4, 33>>>(h); }), "blocks writing neighbouring bf16 values reported");
    EXPECT(completes([&] { atomic_sum<<<4, 32>>>(in, sum); }), "atomics from every block reported");
    EXPECT(completes([&] { write_then_read_own<<<2, 32>>>(buf, iout); }), "a block reading its own writes reported");
    EXPECT(completes([&] {
               all_write_first<<<1, 32>>>(iout);
               all_write_first<<<1, 32>>>(iout);
               read_neighbour_block<<<1, 32>>>(buf, iout);
           }),
           "one block per launch reported (launches are ordered)");
    EXPECT(completes([&] {
               fill_ints<<<1, 32>>>(buf, 1);
               each_block_sums<<<4, 32>>>(buf, iout);
           }),
           "blocks reading what an earlier launch wrote reported");
    EXPECT(refused("two blocks write one element", [&] { all_write_first<<<3, 32>>>(iout); }),
           "two blocks writing one element not reported");
    EXPECT(refused("a block reads what another writes", [&] { read_neighbour_block<<<4, 32>>>(buf, iout); }),
           "a read of another block's write not reported");
    EXPECT(refused("a block overwrites what another reads", [&] { shift_in_place<<<4, 32>>>(buf); }),
           "a write over another block's read not reported");
    EXPECT(refused("a plain sum over blocks", [&] { plain_sum<<<4, 32>>>(in, sum); }),
           "a plain read-modify-write from several blocks not reported");
    EXPECT(refused("a read of an atomic sum in its launch", [&] { atomic_sum_then_read<<<4, 32>>>(in, sum, fout); }),
           "a read of what other blocks update atomically not reported");
    EXPECT(refused("cp.async from another block's write",
                   [&] { cp_async_from_neighbour<<<4, 4, 64>>>(ubuf, uout); }),
           "cp.async from what another block writes not reported");

    /* shared memory: races between a block's threads */
    EXPECT(completes([&] { dyn_neighbour<1><<<2, 64, 256>>>(iout); }), "a read after __syncthreads reported");
    EXPECT(refused("a read of another warp's write, no barrier", [&] { dyn_neighbour<0><<<1, 64, 256>>>(iout); }),
           "a shared-memory read of another thread's write without a barrier not reported");
    EXPECT(refused("an overwrite of what another warp read, no barrier", [&] { dyn_overwrite<<<1, 64, 256>>>(iout); }),
           "a shared-memory write over another thread's read without a barrier not reported");
    EXPECT(refused("two threads write one shared word", [&] { dyn_same_word<<<1, 64, 256>>>(iout); }),
           "two threads writing one shared word in one interval not reported");
    EXPECT(completes([&] { dyn_warp_handoff<1><<<1, 64, 256>>>(iout); }), "a hand-off within a warp after __syncwarp reported");
    EXPECT(refused("a hand-off within a warp, no __syncwarp", [&] { dyn_warp_handoff<0><<<1, 64, 256>>>(iout); }),
           "a hand-off within a warp without __syncwarp not reported");
    EXPECT(completes([&] { dyn_shared_atomics<<<1, 64, 256>>>(iout); }), "shared-memory atomics reported");
    EXPECT(refused("cp.async: another thread's chunk read, no barrier after the waits",
                   [&] { cp_async_neighbour<0><<<1, 64, 4 * 64 * 4>>>(ubuf, uout); }),
           "a read of another thread's cp.async without a barrier not reported");
    EXPECT(refused("cp.async: its own destination read before the wait",
                   [&] { cp_async_landing<<<2, 1, 16>>>(ubuf, uout); }),
           "a read of a cp.async destination before its wait not reported");
    EXPECT(refused("cp.async: a group read after wait_group 1 left it in flight",
                   [&] { cp_async_groups<<<1, 16, 12 * 16 * 4>>>(ubuf, uout); }),
           "a read of a copy wait_group 1 left in flight not reported");
    EXPECT(refused("cp.async over what another thread has not read",
                   [&] { cp_async_overwrite<0><<<1, 64, 4 * 64 * 4>>>(ubuf, uout); }),
           "a cp.async over another thread's unread chunk not reported");

    /* stream order, with the bytes a kernel touches known exactly */
    cudaStream_t comm;
    cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking);
    cudaDeviceSynchronize(); /* after the memsets above */
    int host[16];
    EXPECT(aborts([&] {
               fill_tail<<<1, 32>>>(buf, 32, 16);
               cudaMemcpyAsync(host, buf + 40, 16, cudaMemcpyDeviceToHost, comm);
           }),
           "a race away from a kernel operand's first byte not reported");
    EXPECT(completes([&] {
               fill_tail<<<1, 32>>>(buf, 32, 16);
               cudaMemcpyAsync(host, buf, 16, cudaMemcpyDeviceToHost, comm);
           }),
           "a copy of bytes the kernel does not touch reported");
    cudaStreamDestroy(comm);
    cudaFree(h), cudaFree(buf), cudaFree(iout), cudaFree(in), cudaFree(sum), cudaFree(fout), cudaFree(ubuf),
        cudaFree(uout);
#else
    printf("  races between blocks: not checked (an SPB_EMU_RACECHECK build checks them)\n");
#endif
}

/* ---- mbarrier and the tensor copy (emu_tma.cc) ------------------------------------
 * From the PTX ISA (mbarrier, cp.async.bulk.tensor) and the driver's
 * cuTensorMapEncodeTiled: a box of the tensor lands in shared memory dim 0
 * fastest, zero where a coordinate lies outside the tensor; with the
 * 128-byte swizzle the byte at shared offset o lies at o ^ ((o >> 7) & 7) << 4;
 * the box's bytes complete on the barrier's transaction count, and a wait
 * for parity p returns once the phase of parity p has completed.  The
 * swizzled wgmma operands are read by the ISA's canonical 128-byte layouts
 * (K-major: (m, k) at start + 128 (m % 8) + SBO (m / 8) + 2 k; MN-major:
 * (k, n) at start + 2 (n % 64) + LBO (n / 64) + 128 (k % 8) + SBO (k / 8)),
 * the address then swizzled.  Written here from those definitions. */
typedef CUresult (*tma_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static tma_encode_fn tma_encoder(void)
{
    void *f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        return nullptr;
    return (tma_encode_fn)f;
}
static CUresult tma_encode(CUtensorMap *m, CUtensorMapDataType type, int rank, void *addr, const cuuint64_t *dims,
                           const cuuint64_t *strides, const cuuint32_t *box, int swizzle128)
{
    const cuuint32_t ones[5] = {1, 1, 1, 1, 1};
    tma_encode_fn enc = tma_encoder();
    if (!enc) return CUDA_ERROR_NOT_FOUND;
    return enc(m, type, (cuuint32_t)rank, addr, dims, strides, box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE,
               swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
static size_t swz128(size_t o) { return o ^ ((o >> 7) & 7) << 4; }
/* the (B, N, H, D) = (2, 100, 3, 128) bf16 tensor's element bits: never 0 */
static uint16_t bnhd_bits(size_t i) { return (uint16_t)(0x100 + (i * 37 + 11) % 0x3e00); }

/* the first key row of block (h, b)'s box: past the tensor's end, or before its start */
__device__ __host__ static int tma_row0(int h) { return h == 1 ? -8 : 64; }

/* warp 8 lane 0 loads (h, b)'s 64 rows x 128 d as two 64-column boxes into two
 * 8 KB halves; the two warpgroups wait (EARLY: read first, the mutation)
 * and copy the 16 KB out as they lie in shared memory */
template <int EARLY> __global__ void tma_box(const __grid_constant__ CUtensorMap map, unsigned char *out)
{
    extern __shared__ __align__(1024) unsigned char dyn[];
    uint64_t *bar = (uint64_t *)dyn;
    unsigned char *buf = dyn + 1024;
    int h = (int)blockIdx.x, b = (int)blockIdx.y, j0 = tma_row0(h);
    unsigned char *o = out + (size_t)(blockIdx.x + gridDim.x * blockIdx.y) * 16384;
    if (threadIdx.x == 0) spb_emu_mbarrier_init(bar, 1);
    __syncthreads();
    if (threadIdx.x == 256) {
        spb_emu_mbarrier_arrive_expect_tx(bar, 2 * 8192);
        int c0[4] = {0, h, j0, b}, c1[4] = {64, h, j0, b};
        spb_emu_tma_load(buf, &map, c0, 4, bar);
        spb_emu_tma_load(buf + 8192, &map, c1, 4, bar);
    }
    if (EARLY) __syncthreads(); /* after the issue, but no wait */
    if (threadIdx.x < 256) {
        if (!EARLY) spb_emu_mbarrier_wait(bar, 0);
        for (int i = threadIdx.x; i < 16384; i += 256) o[i] = buf[i];
        if (EARLY) spb_emu_mbarrier_wait(bar, 0);
    }
}

/* a 2-stage ring: warp 8 lane 0 fills stage t % 2 with tile t once the
 * eight consumer warps have released it (empty), the consumers sum it once
 * it is full; partial[tile][warp] */
__global__ void tma_ring(const __grid_constant__ CUtensorMap map, int tiles, float *partial)
{
    extern __shared__ __align__(1024) unsigned char dyn[];
    uint64_t *full = (uint64_t *)dyn, *empty = full + 2;
    const float *stage = (const float *)(dyn + 1024);
    if (threadIdx.x == 0)
        for (int s = 0; s < 2; s++) spb_emu_mbarrier_init(&full[s], 1), spb_emu_mbarrier_init(&empty[s], 8);
    __syncthreads();
    int first = (int)blockIdx.x * tiles;
    if (threadIdx.x == 256) {
        for (int t = 0; t < tiles; t++) {
            int s = t % 2;
            unsigned phase = (unsigned)(t / 2) & 1u;
            spb_emu_mbarrier_wait(&empty[s], phase ^ 1u); /* the first round passes at once */
            spb_emu_mbarrier_arrive_expect_tx(&full[s], 4096);
            int c[2] = {0, 32 * (first + t)};
            spb_emu_tma_load((void *)(stage + 1024 * s), &map, c, 2, &full[s]);
        }
    } else if (threadIdx.x < 256) {
        int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        for (int t = 0; t < tiles; t++) {
            int s = t % 2;
            spb_emu_mbarrier_wait(&full[s], (unsigned)(t / 2) & 1u);
            float v = 0.0f;
            for (int i = warp * 128 + lane; i < warp * 128 + 128; i += 32) v += stage[1024 * s + i];
            for (int d = 16; d; d /= 2) v += __shfl_xor_sync(0xffffffffu, v, d);
            if (lane == 0) {
                partial[(first + t) * 8 + warp] = v;
                spb_emu_mbarrier_arrive(&empty[s]);
            }
        }
    }
}

/* a no-swizzle (LBO 16) or 128-byte-swizzle descriptor */
__device__ static uint64_t sw128_desc(const void *p, uint32_t lbo, uint32_t sbo)
{
    return spb_wgmma_desc(p, lbo, sbo) | (uint64_t)1 << 62;
}
/* Q, K, V (64 x 128 bf16 each, rows 0, 64, 128 of one tensor) loaded by
 * warp 4 as 64-column boxes with the 128-byte swizzle; the warpgroup
 * computes S = Q Kᵀ (SS, K-major, eight k16 steps), then O = P V with P
 * (64 x 64) from registers and V MN-major (RS, trans-b): n128 over all of
 * V's columns and n64 over its second 64 */
__global__ void tma_wgmma(const __grid_constant__ CUtensorMap map, const uint16_t *P, float *out)
{
    extern __shared__ __align__(1024) unsigned char dyn[];
    uint64_t *bar = (uint64_t *)dyn;
    unsigned char *Q = dyn + 1024, *K = Q + 16384, *V = K + 16384;
    float *o = out + (size_t)blockIdx.x * (64 * 64 + 64 * 128 + 64 * 64);
    if (threadIdx.x == 0) spb_emu_mbarrier_init(bar, 1);
    __syncthreads();
    if (threadIdx.x == 128) {
        spb_emu_mbarrier_arrive_expect_tx(bar, 6 * 8192);
        for (int t = 0; t < 3; t++)
            for (int half = 0; half < 2; half++) {
                int c[2] = {64 * half, 64 * t};
                spb_emu_tma_load(Q + 16384 * t + 8192 * half, &map, c, 2, bar);
            }
    }
    if (threadIdx.x >= 128) return;
    spb_emu_mbarrier_wait(bar, 0);
    float s[32];
    spb_wgmma_fence();
    for (int j = 0; j < 8; j++) {
        uint32_t at = 8192u * (j / 4) + 32u * (j % 4);
        spb_wgmma_m64n64_ss<0>(s, sw128_desc(Q + at, 16, 1024), sw128_desc(K + at, 16, 1024), j > 0);
    }
    spb_wgmma_commit();
    spb_wgmma_wait<0>();
    store_d(o, s, 64);
    int w = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float d128[64], d64[32];
    for (int i = 0; i < 64; i++) d128[i] = 0.0f;
    for (int i = 0; i < 32; i++) d64[i] = 0.0f;
    spb_wgmma_fence();
    for (int j = 0; j < 4; j++) {
        uint32_t a[4];
        for (int r = 0; r < 4; r++) { /* mma's A layout over P's columns 16j.. */
            uint16_t e[2];
            for (int hh = 0; hh < 2; hh++) {
                int i = 2 * r + hh, row = 16 * w + g + 8 * ((i / 2) % 2), col = 16 * j + 2 * t + (i % 2) + 8 * (i / 4);
                e[hh] = P[row * 64 + col];
            }
            a[r] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
        }
        spb_wgmma_m64nN_rs_mn<0, 128>(d128, a, sw128_desc(V + 2048 * j, 8192, 1024));
        spb_wgmma_m64nN_rs_mn<0, 64>(d64, a, sw128_desc(V + 8192 + 2048 * j, 8192, 1024));
    }
    spb_wgmma_commit();
    spb_wgmma_wait<0>();
    store_d(o + 64 * 64, d128, 128);
    store_d(o + 64 * 64 + 64 * 128, d64, 64);
}

/* what the emulation must refuse */
__global__ void tma_bad(const __grid_constant__ CUtensorMap map, int what)
{
    extern __shared__ __align__(1024) unsigned char dyn[];
    uint64_t *bar = (uint64_t *)dyn;
    int c[4] = {0, 0, 0, 0};
    if (threadIdx.x == 0) {
        if (what == 0) spb_emu_mbarrier_wait(bar, 0); /* never initialised */
        if (what == 1) {                              /* over-arrival: the copy's bytes not yet in */
            spb_emu_mbarrier_init(bar, 1);
            spb_emu_mbarrier_arrive_expect_tx(bar, 8192);
            spb_emu_mbarrier_arrive(bar);
        }
        if (what == 2) spb_emu_mbarrier_init(bar, 0);
        if (what == 3) {
            spb_emu_mbarrier_init(bar, 1);
            spb_emu_mbarrier_wait(bar, 2);
        }
        if (what == 4) spb_emu_mbarrier_init((uint64_t *)(dyn + 4), 1);
        if (what >= 5 && what <= 9) {
            spb_emu_mbarrier_init(bar, 1);
            spb_emu_mbarrier_arrive_expect_tx(bar, 8192);
        }
        if (what == 5) spb_emu_tma_load(dyn + 1024 + 128, &map, c, 4, bar); /* swizzled: 1024 aligned */
        if (what == 6) spb_emu_tma_load(dyn + 1024, &map, c, 4, bar);       /* nobody waits */
        if (what == 7) spb_emu_tma_load(dyn + 1024, &map, c, 2, bar);       /* rank 2, the map's 4 */
        if (what == 8) {
            CUtensorMap zero;
            memset(&zero, 0, sizeof zero);
            spb_emu_tma_load(dyn + 1024, &zero, c, 4, bar);
        }
        if (what == 9) spb_emu_tma_load(dyn + 4096, &map, c, 4, bar); /* past the dynamic shared memory */
    }
    if (what == 10) { /* a phase that never completes: two arrivals expected, one made */
        if (threadIdx.x == 0) spb_emu_mbarrier_init(bar, 2);
        __syncthreads();
        if (threadIdx.x == 0) spb_emu_mbarrier_arrive(bar);
        spb_emu_mbarrier_wait(bar, 0);
    }
}

/* a tensor copy over the bytes a wgmma issued before it still reads (its
 * wait_group comes after the copy's wait) */
__global__ void tma_over_wgmma(const __grid_constant__ CUtensorMap map)
{
    extern __shared__ __align__(1024) unsigned char dyn[];
    uint64_t *bar = (uint64_t *)dyn;
    unsigned char *Q = dyn + 1024, *K = Q + 16384;
    if (threadIdx.x == 0) spb_emu_mbarrier_init(&bar[0], 1), spb_emu_mbarrier_init(&bar[1], 1);
    __syncthreads();
    if (threadIdx.x == 128) {
        spb_emu_mbarrier_arrive_expect_tx(&bar[0], 2 * 8192);
        for (int t = 0; t < 2; t++) {
            int c[2] = {0, 64 * t};
            spb_emu_tma_load(Q + 16384 * t, &map, c, 2, &bar[0]);
        }
    }
    float s[32];
    if (threadIdx.x < 128) {
        spb_emu_mbarrier_wait(&bar[0], 0);
        spb_wgmma_fence();
        spb_wgmma_m64n64_ss<0>(s, sw128_desc(Q, 16, 1024), sw128_desc(K, 16, 1024), 0);
        spb_wgmma_commit();
    }
    __syncthreads();
    if (threadIdx.x == 128) { /* the next K tile over the one in use */
        spb_emu_mbarrier_arrive_expect_tx(&bar[1], 8192);
        int c[2] = {0, 128};
        spb_emu_tma_load(K, &map, c, 2, &bar[1]);
    }
    if (threadIdx.x < 128) {
        spb_emu_mbarrier_wait(&bar[1], 0);
        spb_wgmma_wait<0>();
    }
}

/* Named barriers as FlashAttention-3's ping-pong uses them: two groups of
 * 64 threads take turns (bar.sync on its own barrier, bar.arrive on the
 * other's); group 1 gives the first turn, group 0 takes the last hand-over
 * unless `unbalanced`. */
__global__ void ping_pong_turns(int *log, int *next, int rounds, int unbalanced)
{
    const int group = threadIdx.x / 64;
    if (group == 1) spb_emu_named_barrier(1, 128, 0);
    for (int i = 0; i < rounds; i++) {
        spb_emu_named_barrier(1 + group, 128, 1);
        if (threadIdx.x % 64 == 0) log[atomicAdd(next, 1)] = group;
        spb_emu_named_barrier(2 - group, 128, 0);
    }
    if (group == 0 && !unbalanced) spb_emu_named_barrier(1, 128, 1);
}
__global__ void named_barrier_bad_count(void) { spb_emu_named_barrier(1, 48, 1); }

static void check_named_barriers(void)
{
    int *log = device_array<int>(16), *next = device_array<int>(1);
    cudaMemset(next, 0, sizeof(int));
    ping_pong_turns<<<2, 128>>>(log, next, 4, 0);
    int h[16] = {0}, n = 0;
    cudaMemcpy(&n, next, sizeof n, cudaMemcpyDeviceToHost);
    cudaMemcpy(h, log, sizeof h, cudaMemcpyDeviceToHost);
    EXPECT(n == 16, "%d turns logged, 16 expected", n);
    bool alternate = true;
    for (int i = 0; i < 8; i++) alternate = alternate && h[i] == i % 2 && h[8 + i] == i % 2;
    EXPECT(alternate, "the two groups' turns do not alternate 0, 1, 0, 1, ... in each block");
    EXPECT(aborts([&] { ping_pong_turns<<<1, 128>>>(log, next, 2, 1); }),
           "a block ending with a hand-over no bar.sync took is not refused");
    EXPECT(aborts([&] { named_barrier_bad_count<<<1, 64>>>(); }), "a named barrier count of 48 is not refused");
    cudaFree(log), cudaFree(next);
}

static void check_tma(void)
{
    /* (a) a 4D box, swizzled, across the tensor's end and start */
    const int B = 2, N = 100, H = 3, D = 128;
    std::vector<uint16_t> T((size_t)B * N * H * D);
    for (size_t i = 0; i < T.size(); i++) T[i] = bnhd_bits(i);
    uint16_t *dT = device_array<uint16_t>(T.size());
    cudaMemcpy(dT, T.data(), T.size() * 2, cudaMemcpyHostToDevice);
    CUtensorMap map4;
    const cuuint64_t dims4[4] = {128, 3, 100, 2}, strides4[3] = {256, 768, 76800};
    const cuuint32_t box4[4] = {64, 1, 64, 1};
    EXPECT(tma_encode(&map4, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, dT, dims4, strides4, box4, 1) == CUDA_SUCCESS,
           "cuTensorMapEncodeTiled of the (2, 100, 3, 128) bf16 tensor failed");
    unsigned char *dout = device_array<unsigned char>(6 * 16384);
    tma_box<0><<<dim3(3, 2), 288, 1024 + 16384>>>(map4, dout);
    EXPECT(cudaGetLastError() == cudaSuccess, "the tensor-copy launch failed");
    std::vector<unsigned char> got = to_host(dout, 6 * 16384);
    int bad = 0, zeros = 0;
    auto expected = [&](int blk, size_t o) { /* the 2 bytes the box puts at unswizzled offset o */
        int h = blk % 3, b = blk / 3, half = (int)(o / 8192), r = (int)(o % 8192 / 128), c = (int)(o % 128 / 2);
        int j = tma_row0(h) + r;
        if (j < 0 || j >= N) return (uint16_t)0;
        return T[(((size_t)b * N + j) * H + h) * D + 64 * half + c];
    };
    for (int blk = 0; blk < 6; blk++)
        for (size_t o = 0; o < 16384; o += 2) {
            uint16_t want = expected(blk, o), have;
            memcpy(&have, &got[(size_t)blk * 16384 + swz128(1024 + o) - 1024], 2);
            bad += have != want;
            zeros += want == 0;
        }
    EXPECT(bad == 0 && zeros == (4 * 28 + 2 * 8) * 128, /* rows 100..127 of four blocks, -8..-1 of two */
           "a 4D swizzled box (zero rows past the end and before the start): %d of %d elements wrong, %d zero",
           bad, 6 * 8192, zeros);

    /* (e) the mutation: consumers that read before they wait see the old
     * bytes in the blocks whose copies land at the wait */
    tma_box<1><<<dim3(3, 2), 288, 1024 + 16384>>>(map4, dout);
    got = to_host(dout, 6 * 16384);
    int wrong_blocks = 0;
    for (int blk = 0; blk < 6; blk++) {
        int wrong = 0;
        for (size_t o = 0; o < 16384; o += 2) {
            uint16_t have;
            memcpy(&have, &got[(size_t)blk * 16384 + swz128(1024 + o) - 1024], 2);
            wrong += have != expected(blk, o);
        }
        wrong_blocks += wrong > 0;
    }
    printf("  tensor copy read before the wait: %d of 6 blocks read wrong bytes\n", wrong_blocks);
    EXPECT(wrong_blocks >= 1 && wrong_blocks < 6,
           "a consumer reading before its mbarrier wait: %d of 6 blocks wrong (some must be, in the blocks whose "
           "copies land at the wait; not all: the others land at issue)",
           wrong_blocks);

    /* (b) a 2-stage producer/consumer ring, fp32, no swizzle, a partial last tile */
    const int blocks = 4, tiles = 5, rows = 630;
    std::vector<float> X((size_t)rows * 32);
    for (size_t i = 0; i < X.size(); i++) X[i] = (float)((i * 5 + 1) % 7) - 3.0f;
    float *dX = device_array<float>(X.size()), *dpart = device_array<float>(blocks * tiles * 8);
    cudaMemcpy(dX, X.data(), X.size() * 4, cudaMemcpyHostToDevice);
    CUtensorMap map2;
    const cuuint64_t dims2[2] = {32, (cuuint64_t)rows}, strides2[1] = {128};
    const cuuint32_t box2[2] = {32, 32};
    EXPECT(tma_encode(&map2, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, dX, dims2, strides2, box2, 0) == CUDA_SUCCESS,
           "cuTensorMapEncodeTiled of a 2D fp32 tensor failed");
    tma_ring<<<blocks, 288, 1024 + 2 * 4096>>>(map2, tiles, dpart);
    std::vector<float> part = to_host(dpart, blocks * tiles * 8);
    bad = 0;
    for (int t = 0; t < blocks * tiles; t++) {
        float want = 0.0f, have = 0.0f;
        for (int r = 32 * t; r < 32 * t + 32 && r < rows; r++)
            for (int c = 0; c < 32; c++) want += X[(size_t)r * 32 + c];
        for (int w = 0; w < 8; w++) have += part[t * 8 + w];
        bad += have != want;
    }
    EXPECT(bad == 0, "a 2-stage full/empty mbarrier ring: %d of %d tile sums wrong", bad, blocks * tiles);

    /* (c) wgmma on swizzled tiles the copy laid out */
    std::vector<float> qkv(192 * 128), Pf(64 * 64);
    std::vector<uint16_t> qkv_bits(192 * 128), P_bits(64 * 64);
    auto scrambled = [](uint32_t i, int mod) { /* no period a permutation of columns could match */
        i = (i ^ 61u) * 2654435761u;
        return (float)((i >> 15) % (uint32_t)mod) - (float)(mod / 2);
    };
    for (int i = 0; i < 192 * 128; i++) qkv[i] = scrambled((uint32_t)i, 9), qkv_bits[i] = half_bits(qkv[i], 0);
    for (int i = 0; i < 64 * 64; i++) Pf[i] = scrambled((uint32_t)i + 7777u, 7), P_bits[i] = half_bits(Pf[i], 0);
    uint16_t *dqkv = device_array<uint16_t>(192 * 128), *dP = device_array<uint16_t>(64 * 64);
    const int per_block = 64 * 64 + 64 * 128 + 64 * 64;
    float *dres = device_array<float>(2 * per_block);
    cudaMemcpy(dqkv, qkv_bits.data(), qkv_bits.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dP, P_bits.data(), P_bits.size() * 2, cudaMemcpyHostToDevice);
    CUtensorMap mapq;
    const cuuint64_t dimsq[2] = {128, 192}, stridesq[1] = {256};
    const cuuint32_t boxq[2] = {64, 64};
    EXPECT(tma_encode(&mapq, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, dqkv, dimsq, stridesq, boxq, 1) == CUDA_SUCCESS,
           "cuTensorMapEncodeTiled of the Q/K/V tensor failed");
    const int wg_shared = 1024 + 3 * 16384;
    cudaFuncSetAttribute(tma_wgmma, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_shared);
    tma_wgmma<<<2, 160, wg_shared>>>(mapq, dP, dres);
    EXPECT(cudaGetLastError() == cudaSuccess, "the wgmma launch failed");
    std::vector<float> res = to_host(dres, 2 * per_block);
    int bad_s = 0, bad_o128 = 0, bad_o64 = 0;
    for (int blk = 0; blk < 2; blk++) {
        const float *r = res.data() + (size_t)blk * per_block;
        for (int m = 0; m < 64; m++)
            for (int n = 0; n < 64; n++) {
                float want = 0.0f;
                for (int k = 0; k < 128; k++) want += qkv[m * 128 + k] * qkv[(64 + n) * 128 + k];
                bad_s += r[m * 64 + n] != want;
            }
        for (int m = 0; m < 64; m++)
            for (int n = 0; n < 128; n++) {
                float want = 0.0f;
                for (int k = 0; k < 64; k++) want += Pf[m * 64 + k] * qkv[(128 + k) * 128 + n];
                bad_o128 += r[64 * 64 + m * 128 + n] != want;
                if (n >= 64) bad_o64 += r[64 * 64 + 64 * 128 + m * 64 + n - 64] != want;
            }
    }
    EXPECT(bad_s == 0, "S = Q Kᵀ by wgmma SS from 128-byte-swizzled K-major tiles: %d of 8192 wrong", bad_s);
    EXPECT(bad_o128 == 0, "O = P V by wgmma RS n128 from a 128-byte-swizzled MN-major tile: %d of 16384 wrong",
           bad_o128);
    EXPECT(bad_o64 == 0, "O = P V by wgmma RS n64 (V's second 64 columns), swizzled MN-major: %d of 8192 wrong",
           bad_o64);

    /* (d) refusals */
    auto bad_launch = [&](int what, int shared) {
        return [&, what, shared] { tma_bad<<<1, 32, shared>>>(map4, what); };
    };
    EXPECT(refused_saying("mbarrier wait on a barrier never initialised", "no mbarrier.init", bad_launch(0, 17408)),
           "a wait on an uninitialised mbarrier not refused");
    EXPECT(refused_saying("mbarrier over-arrival", "no arrival pending", bad_launch(1, 17408)),
           "an arrival beyond the barrier's count not refused");
    EXPECT(refused("mbarrier.init with count 0", bad_launch(2, 17408)), "an mbarrier count of 0 not refused");
    EXPECT(refused("mbarrier wait with parity 2", bad_launch(3, 17408)), "a wait with parity 2 not refused");
    EXPECT(refused("mbarrier 4-byte aligned", bad_launch(4, 17408)), "a misaligned mbarrier not refused");
    EXPECT(refused_saying("tensor copy, swizzled, to a 128-byte aligned destination", "1024-byte aligned",
                          bad_launch(5, 17408)),
           "a 128-byte swizzled copy to a destination not 1024-byte aligned not refused");
    EXPECT(refused_saying("tensor copy nobody waits for", "never completed", bad_launch(6, 17408)),
           "a block ending with a tensor copy that never landed not refused");
    EXPECT(refused("tensor copy of rank 2 with a 4D map", bad_launch(7, 17408)), "a rank mismatch not refused");
    EXPECT(refused("tensor copy with a map not encoded", bad_launch(8, 17408)),
           "a tensor copy from a map cuTensorMapEncodeTiled did not write not refused");
    EXPECT(refused("tensor copy past the dynamic shared memory", bad_launch(9, 8192)),
           "a tensor copy past the launch's dynamic shared memory not refused");
    EXPECT(refused_saying("an mbarrier phase that never completes", "waits in mbarrier wait", bad_launch(10, 17408)),
           "a wait on a phase that never completes not reported as a deadlock");

    /* the driver's refusals: an error, not an abort */
    CUtensorMap m;
    const cuuint32_t box_wide[4] = {128, 1, 64, 1};
    const cuuint64_t strides_odd[3] = {256, 776, 76800};
    fflush(stdout);
    EXPECT(tma_encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, dT, dims4, strides4, box_wide, 1) ==
               CUDA_ERROR_INVALID_VALUE,
           "a 256-byte inner box with the 128-byte swizzle accepted");
    EXPECT(tma_encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, dT, dims4, strides_odd, box4, 1) ==
               CUDA_ERROR_INVALID_VALUE,
           "a stride that is not a multiple of 16 accepted");
    EXPECT(tma_encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (char *)dT + 8, dims4, strides4, box4, 1) ==
               CUDA_ERROR_INVALID_VALUE,
           "a global address not 16-byte aligned accepted");
    void *fn = (void *)1;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
    EXPECT(cudaGetDriverEntryPointByVersion("cuNoSuchFunction", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
               fn == nullptr && q == cudaDriverEntryPointSymbolNotFound,
           "an unknown driver symbol: not cudaSuccess with a null pointer and SymbolNotFound");

#ifdef SPB_EMU_RACECHECK
    cudaFuncSetAttribute(tma_over_wgmma, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024 + 2 * 16384);
    EXPECT(refused_saying("a tensor copy over a wgmma operand in flight", "tensor copy",
                          [&] { tma_over_wgmma<<<1, 160, 1024 + 2 * 16384>>>(mapq); }),
           "a tensor copy landing over bytes a wgmma still reads not reported as a race");
#endif
    cudaFree(dT), cudaFree(dout), cudaFree(dX), cudaFree(dpart), cudaFree(dqkv), cudaFree(dP), cudaFree(dres);
}

int main(void)
{
    check_barriers();
    check_shuffles();
    check_mma();
    check_refusals();
    check_ldmatrix();
    check_cp_async();
    check_ptx_refusals();
    check_wgmma();
    check_bulk_reduce();
    check_named_barriers();
    check_stream_order();
    check_block_races();
    check_tma();
    printf("CUDA emulation: %d checks, %d failed: %s\n", checks, failures, failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
}
