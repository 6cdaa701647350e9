/* Over 700 lines: one test program: every NCCL stand-in call on 4 ranks. */
/* Test of the CPU NCCL stand-in (common/cuda/emu/emu_nccl.cc), run as an
 * MPI program with several ranks (2, 3 and 4 tested):
 *
 *   mpicxx -std=c++17 -O1 -Wall -I/usr/local/cuda/include \
 *       tests/emu/test_emu_nccl.cc common/cuda/emu/emu_nccl.cc -o /tmp/test_emu_nccl
 *   mpirun -np 4 /tmp/test_emu_nccl
 *
 * Communicators are made the way nccl_comm.cu's spb_nccl_create makes them
 * (group rank 0 gets the id, MPI_Bcast over the group, ncclCommInitRank),
 * for MPI_COMM_WORLD, for the even/odd halves of it and for the world in
 * reversed rank order, in the same order on every rank.  Data are integers
 * (exact in every type) except the cases written to round; every result is
 * checked against a value computed here from the group's world ranks, so a
 * communicator mixing data across groups, or ranks in the wrong order,
 * fails.  The data tests run twice: with the stand-in's default message
 * limit, and with a 40-byte limit that splits every transfer into chunks.
 *
 * On failure every rank exits non-zero after printing what differed; a
 * watchdog (alarm) ends a rank that hangs, and mpirun then ends the rest. */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

/* The stand-in's test hook (not an NCCL call). */
extern "C" void spb_emu_nccl_set_max_message_bytes(size_t bytes);

namespace
{

int wrank = 0, wsize = 1;
long failures = 0;
const char *mode = "default-limit";

__attribute__((format(printf, 2, 3))) void failf(int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL world rank %d [%s] test_emu_nccl.cc:%d: %s\n", wrank, mode, line, msg);
    failures++;
}

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond))                                                                                                   \
            failf(__LINE__, __VA_ARGS__);                                                                              \
    } while (0)

#define NCHECK(call)                                                                                                   \
    do {                                                                                                               \
        ncclResult_t rc_ = (call);                                                                                     \
        if (rc_ != ncclSuccess)                                                                                        \
            failf(__LINE__, "%s returned %d (%s): %s", #call, (int)rc_, ncclGetErrorString(rc_),                       \
                  ncclGetLastError(NULL));                                                                             \
    } while (0)

#define EXPECT_RC(call, want)                                                                                          \
    do {                                                                                                               \
        ncclResult_t rc_ = (call);                                                                                     \
        if (rc_ != (want))                                                                                             \
            failf(__LINE__, "%s returned %d (%s), expected %d (%s)", #call, (int)rc_, ncclGetErrorString(rc_),         \
                  (int)(want), ncclGetErrorString(want));                                                              \
    } while (0)

void on_alarm(int)
{
    const char m[] = "FAIL test_emu_nccl: watchdog: a rank has hung for 60 s (deadlock in the stand-in?)\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(3);
}

/* 16-bit values as bits, through cuda_bf16.h / cuda_fp16.h's host
 * conversions (round to nearest even), independent of the stand-in's own
 * bf16 rounding. */
uint16_t bf(float f)
{
    __nv_bfloat16_raw r = __float2bfloat16_rn(f);
    return r.x;
}
float bff(uint16_t x)
{
    __nv_bfloat16_raw r;
    r.x = x;
    return __bfloat162float(__nv_bfloat16(r));
}
uint16_t hf(float f)
{
    __half_raw r = __float2half_rn(f);
    return r.x;
}
float hff(uint16_t x)
{
    __half_raw r;
    r.x = x;
    return __half2float(__half(r));
}

enum Kind16 { BF16, F16 };
uint16_t to16(Kind16 k, float f)
{
    return k == BF16 ? bf(f) : hf(f);
}
float from16(Kind16 k, uint16_t x)
{
    return k == BF16 ? bff(x) : hff(x);
}
ncclDataType_t nt16(Kind16 k)
{
    return k == BF16 ? ncclBfloat16 : ncclFloat16;
}
const char *name16(Kind16 k)
{
    return k == BF16 ? "bf16" : "fp16";
}

/* Compares element by element; reports the first difference and how many. */
template <class T, class Show>
void expect_buf(int line, const std::string &what, const T *got, const T *want, size_t n, Show show)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0)
            first = i;
    if (bad)
        failf(line, "%s: %zu of %zu elements differ; first at %zu: got %.9g, expected %.9g", what.c_str(), bad, n,
              first, (double)show(got[first]), (double)show(want[first]));
}
#define EXPECT_F32(what, got, want, n) expect_buf(__LINE__, what, got, want, n, [](float v) { return v; })
#define EXPECT_16(what, k, got, want, n)                                                                               \
    do {                                                                                                               \
        const Kind16 k16_ = (k);                                                                                       \
        expect_buf(__LINE__, what, got, want, n, [k16_](uint16_t v) { return from16(k16_, v); });                      \
    } while (0)
#define EXPECT_INT(what, got, want, n) expect_buf(__LINE__, what, got, want, n, [](auto v) { return (double)v; })

/* A test communicator: the NCCL one and the MPI group it was made over. */
struct TComm {
    const char *name;
    MPI_Comm mpi;
    ncclComm_t nc;
    int rank, size;
    std::vector<int> world; /* world rank of each group rank */
};

/* As nccl_comm.cu's spb_nccl_create. */
TComm make_comm(const char *name, MPI_Comm group)
{
    TComm c;
    c.name = name;
    c.mpi = group;
    c.nc = nullptr;
    MPI_Comm_rank(group, &c.rank);
    MPI_Comm_size(group, &c.size);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c.rank == 0)
        NCHECK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, group);
    NCHECK(ncclCommInitRank(&c.nc, c.size, id, c.rank));
    c.world.resize(c.size);
    MPI_Allgather(&wrank, 1, MPI_INT, c.world.data(), 1, MPI_INT, group);
    int n = -1, r = -1;
    NCHECK(ncclCommCount(c.nc, &n));
    NCHECK(ncclCommUserRank(c.nc, &r));
    CHECK(n == c.size && r == c.rank, "%s: ncclCommCount/UserRank say rank %d of %d, the group rank %d of %d", name, r,
          n, c.rank, c.size);
    return c;
}

std::string ctx(const TComm &c, const char *what)
{
    return std::string(c.name) + ": " + what;
}

/* ---- data generators (integers, all exact) --------------------------------- */

float v32(int w, size_t i)
{
    return (float)((w + 1) * 1000 + (int)(i % 97));
}
int small(int w, size_t i, int mod)
{
    return (int)((size_t)(w * 3 + 1) + i) % mod;
}

/* ---- all-reduce ------------------------------------------------------------- */

void test_allreduce_f32(const TComm &c, size_t n)
{
    std::vector<float> send(n), recv(n, -1.0f), want(n, 0.0f);
    for (size_t i = 0; i < n; i++) {
        send[i] = v32(wrank, i);
        for (int m = 0; m < c.size; m++)
            want[i] += v32(c.world[m], i);
    }
    std::vector<float> send0 = send;
    NCHECK(ncclAllReduce(send.data(), recv.data(), n, ncclFloat32, ncclSum, c.nc, nullptr));
    EXPECT_F32(ctx(c, "allreduce f32 sum out of place"), recv.data(), want.data(), n);
    EXPECT_F32(ctx(c, "allreduce f32 out of place leaves sendbuff"), send.data(), send0.data(), n);
    NCHECK(ncclAllReduce(send.data(), send.data(), n, ncclFloat32, ncclSum, c.nc, nullptr));
    EXPECT_F32(ctx(c, "allreduce f32 sum in place"), send.data(), want.data(), n);

    /* max / min */
    std::vector<float> mx(n), mn(n);
    for (size_t i = 0; i < n; i++) {
        send[i] = (float)small(wrank, i, 13);
        mx[i] = -1e30f;
        mn[i] = 1e30f;
        for (int m = 0; m < c.size; m++) {
            mx[i] = std::fmax(mx[i], (float)small(c.world[m], i, 13));
            mn[i] = std::fmin(mn[i], (float)small(c.world[m], i, 13));
        }
    }
    NCHECK(ncclAllReduce(send.data(), recv.data(), n, ncclFloat32, ncclMax, c.nc, nullptr));
    EXPECT_F32(ctx(c, "allreduce f32 max"), recv.data(), mx.data(), n);
    NCHECK(ncclAllReduce(send.data(), recv.data(), n, ncclFloat32, ncclMin, c.nc, nullptr));
    EXPECT_F32(ctx(c, "allreduce f32 min"), recv.data(), mn.data(), n);
}

void test_allreduce_ints(const TComm &c, size_t n)
{
    std::vector<int32_t> s32(n), r32(n), w32(n, 0);
    std::vector<int64_t> s64(n), r64(n), w64(n, 0);
    std::vector<double> sd(n), rd(n), wd(n, 0.0);
    std::vector<int8_t> s8(n), r8(n), w8(n, 0);
    std::vector<uint8_t> su(n), ru(n), wu(n, 0);
    std::vector<int32_t> wp(n, 1);
    for (size_t i = 0; i < n; i++) {
        s32[i] = small(wrank, i, 50) - 20;
        s64[i] = (int64_t)small(wrank, i, 50) * 3000000000LL;
        sd[i] = small(wrank, i, 9) * 0.5;
        s8[i] = (int8_t)(small(wrank, i, 30) - 15);
        su[i] = (uint8_t)small(wrank, i, 200);
        for (int m = 0; m < c.size; m++) {
            int w = c.world[m];
            w32[i] += small(w, i, 50) - 20;
            w64[i] += (int64_t)small(w, i, 50) * 3000000000LL;
            wd[i] += small(w, i, 9) * 0.5;
            w8[i] = (int8_t)(w8[i] + small(w, i, 30) - 15);
            wu[i] = std::max<uint8_t>(wu[i], (uint8_t)small(w, i, 200));
            wp[i] *= 1 + small(w, i, 3);
        }
    }
    NCHECK(ncclAllReduce(s32.data(), r32.data(), n, ncclInt32, ncclSum, c.nc, nullptr));
    EXPECT_INT(ctx(c, "allreduce int32 sum"), r32.data(), w32.data(), n);
    NCHECK(ncclAllReduce(s64.data(), r64.data(), n, ncclInt64, ncclSum, c.nc, nullptr));
    EXPECT_INT(ctx(c, "allreduce int64 sum"), r64.data(), w64.data(), n);
    NCHECK(ncclAllReduce(sd.data(), rd.data(), n, ncclFloat64, ncclSum, c.nc, nullptr));
    EXPECT_INT(ctx(c, "allreduce f64 sum"), rd.data(), wd.data(), n);
    NCHECK(ncclAllReduce(s8.data(), r8.data(), n, ncclInt8, ncclSum, c.nc, nullptr));
    EXPECT_INT(ctx(c, "allreduce int8 sum"), r8.data(), w8.data(), n);
    NCHECK(ncclAllReduce(su.data(), ru.data(), n, ncclUint8, ncclMax, c.nc, nullptr));
    EXPECT_INT(ctx(c, "allreduce uint8 max"), ru.data(), wu.data(), n);
    for (size_t i = 0; i < n; i++)
        s32[i] = 1 + small(wrank, i, 3);
    NCHECK(ncclAllReduce(s32.data(), s32.data(), n, ncclInt32, ncclProd, c.nc, nullptr));
    EXPECT_INT(ctx(c, "allreduce int32 prod in place"), s32.data(), wp.data(), n);
}

/* 16-bit all-reduce: n exact elements, then the rounding cases: group rank
 * 0 contributes a, group rank 1 b, the others 0, so exactly one addition
 * rounds whatever the order of summation, and the result must be the
 * float sum a+b rounded to nearest even. */
struct Round {
    float a, b;
};
const Round bf16_cases[] = {
    {256, 3},   /* 259: tie -> 260 (even); truncation gives 258 */
    {256, 1},   /* 257: tie -> 256 (even) */
    {512, 7},   /* 519 -> 520 (nearest, spacing 4); truncation 516 */
    {512, 5},   /* 517 -> 516 */
    {512, 6},   /* 518: tie -> 520 (even) */
    {512, 2},   /* 514: tie -> 512 (even) */
    {-256, -3}, /* -259 -> -260 */
    {1024, 13}, /* 1037 -> 1040 (spacing 8) */
};
const Round f16_cases[] = {
    {2048, 3},     /* 2051: tie -> 2052 (even); truncation 2050 */
    {2048, 1},     /* 2049: tie -> 2048 */
    {4096, 7},     /* 4103 -> 4104 (spacing 4); truncation 4100 */
    {4096, 5},     /* 4101 -> 4100 */
    {-2048, -3},   /* -2051 -> -2052 */
    {65504, 16},   /* 65520: rounds to +inf */
    {0.5f, 0.25f}, /* 0.75 exact */
};

void test_allreduce_16(const TComm &c, size_t n, Kind16 k)
{
    const Round *cases = k == BF16 ? bf16_cases : f16_cases;
    size_t nc = k == BF16 ? sizeof bf16_cases / sizeof *bf16_cases : sizeof f16_cases / sizeof *f16_cases;
    int mod = k == BF16 ? 8 : 16; /* group sums stay exact: <= 4*7 (bf16), 4*15 (fp16) */
    size_t total = n + nc + 1;
    std::vector<uint16_t> send(total), recv(total, 0xffff), want(total);
    for (size_t i = 0; i < n; i++) {
        send[i] = to16(k, (float)small(wrank, i, mod));
        float s = 0;
        for (int m = 0; m < c.size; m++)
            s += (float)small(c.world[m], i, mod);
        want[i] = to16(k, s);
    }
    for (size_t j = 0; j < nc; j++) {
        float mine = c.rank == 0 ? cases[j].a : c.rank == 1 ? cases[j].b : 0.0f;
        send[n + j] = to16(k, mine);
        want[n + j] = to16(k, c.size >= 2 ? cases[j].a + cases[j].b : cases[j].a);
    }
    /* The last element's sum depends on the order of summation (group rank
     * 0 adds 256, every other rank 1): only agreement across ranks and a
     * plausible value are checked. */
    float odd_base = k == BF16 ? 256.0f : 2048.0f;
    send[total - 1] = to16(k, c.rank == 0 ? odd_base : 1.0f);
    want[total - 1] = 0;
    std::vector<uint16_t> send0 = send;

    std::string what = std::string("allreduce ") + name16(k) + " sum";
    NCHECK(ncclAllReduce(send.data(), recv.data(), total, nt16(k), ncclSum, c.nc, nullptr));
    EXPECT_16(ctx(c, (what + " out of place").c_str()), k, recv.data(), want.data(), total - 1);
    std::vector<uint16_t> inplace = send0;
    NCHECK(ncclAllReduce(inplace.data(), inplace.data(), total, nt16(k), ncclSum, c.nc, nullptr));
    EXPECT_16(ctx(c, (what + " in place").c_str()), k, inplace.data(), want.data(), total - 1);

    std::vector<uint16_t> all(c.size);
    MPI_Allgather(&recv[total - 1], 2, MPI_BYTE, all.data(), 2, MPI_BYTE, c.mpi);
    for (int m = 0; m < c.size; m++)
        CHECK(all[m] == all[0], "%s: order-dependent sum differs across ranks (%g on group rank %d, %g on 0)",
              ctx(c, what.c_str()).c_str(), from16(k, all[m]), m, from16(k, all[0]));
    float got = from16(k, recv[total - 1]), lo = odd_base, hi = odd_base + (float)(c.size - 1) + 1;
    CHECK(got >= lo && got <= hi, "%s: order-dependent sum %g outside [%g, %g]", ctx(c, what.c_str()).c_str(), got, lo,
          hi);

    /* max, min, prod */
    std::vector<uint16_t> mx(n), mn(n), pr(n);
    for (size_t i = 0; i < n; i++) {
        send[i] = to16(k, (float)(small(wrank, i, 7) - 3));
        float a = -1e9f, b = 1e9f, p = 1;
        for (int m = 0; m < c.size; m++) {
            float v = (float)(small(c.world[m], i, 7) - 3);
            a = std::fmax(a, v);
            b = std::fmin(b, v);
            p *= v;
        }
        mx[i] = to16(k, a);
        mn[i] = to16(k, b);
        pr[i] = to16(k, p);
    }
    NCHECK(ncclAllReduce(send.data(), recv.data(), n, nt16(k), ncclMax, c.nc, nullptr));
    EXPECT_16(ctx(c, (std::string("allreduce ") + name16(k) + " max").c_str()), k, recv.data(), mx.data(), n);
    NCHECK(ncclAllReduce(send.data(), recv.data(), n, nt16(k), ncclMin, c.nc, nullptr));
    EXPECT_16(ctx(c, (std::string("allreduce ") + name16(k) + " min").c_str()), k, recv.data(), mn.data(), n);
    NCHECK(ncclAllReduce(send.data(), recv.data(), n, nt16(k), ncclProd, c.nc, nullptr));
    /* -0 and +0 differ in bits but are both right for a product with a 0 */
    for (size_t i = 0; i < n; i++)
        if (from16(k, recv[i]) == 0.0f && from16(k, pr[i]) == 0.0f)
            recv[i] = pr[i];
    EXPECT_16(ctx(c, (std::string("allreduce ") + name16(k) + " prod").c_str()), k, recv.data(), pr.data(), n);
}

/* ---- all-gather ------------------------------------------------------------- */

void test_allgather(const TComm &c, size_t n)
{
    size_t total = n * (size_t)c.size;
    std::vector<float> send(n), recv(total, -1.0f), want(total);
    for (size_t i = 0; i < n; i++)
        send[i] = v32(wrank, i);
    for (int m = 0; m < c.size; m++)
        for (size_t i = 0; i < n; i++)
            want[(size_t)m * n + i] = v32(c.world[m], i);
    NCHECK(ncclAllGather(send.data(), recv.data(), n, ncclFloat32, c.nc, nullptr));
    EXPECT_F32(ctx(c, "allgather f32 out of place"), recv.data(), want.data(), total);

    /* in place: sendbuff == recvbuff + rank*count */
    std::vector<float> buf(total, -7.0f);
    for (size_t i = 0; i < n; i++)
        buf[(size_t)c.rank * n + i] = v32(wrank, i);
    NCHECK(ncclAllGather(buf.data() + (size_t)c.rank * n, buf.data(), n, ncclFloat32, c.nc, nullptr));
    EXPECT_F32(ctx(c, "allgather f32 in place"), buf.data(), want.data(), total);

    /* bf16, in place and out of place */
    std::vector<uint16_t> s16(n), r16(total, 0xffff), w16(total), b16(total, 0x7fc0);
    for (size_t i = 0; i < n; i++)
        s16[i] = bf((float)(wrank * 100 + (int)(i % 50)));
    for (int m = 0; m < c.size; m++)
        for (size_t i = 0; i < n; i++)
            w16[(size_t)m * n + i] = bf((float)(c.world[m] * 100 + (int)(i % 50)));
    NCHECK(ncclAllGather(s16.data(), r16.data(), n, ncclBfloat16, c.nc, nullptr));
    EXPECT_16(ctx(c, "allgather bf16 out of place"), BF16, r16.data(), w16.data(), total);
    memcpy(b16.data() + (size_t)c.rank * n, s16.data(), n * 2);
    NCHECK(ncclAllGather(b16.data() + (size_t)c.rank * n, b16.data(), n, ncclBfloat16, c.nc, nullptr));
    EXPECT_16(ctx(c, "allgather bf16 in place"), BF16, b16.data(), w16.data(), total);

    /* fp8 moves as bytes (no reduction involved) */
    std::vector<uint8_t> s8(n), r8(total), w8(total);
    for (size_t i = 0; i < n; i++)
        s8[i] = (uint8_t)(wrank * 31 + i);
    for (int m = 0; m < c.size; m++)
        for (size_t i = 0; i < n; i++)
            w8[(size_t)m * n + i] = (uint8_t)(c.world[m] * 31 + i);
    NCHECK(ncclAllGather(s8.data(), r8.data(), n, ncclFloat8e4m3, c.nc, nullptr));
    EXPECT_INT(ctx(c, "allgather fp8 bytes"), r8.data(), w8.data(), total);
}

/* ---- reduce-scatter --------------------------------------------------------- */

float u32(int w, int block, size_t i)
{
    return (float)(w * 1000 + block * 100 + (int)(i % 50));
}
int u16v(int w, int block, size_t i)
{
    return (w + 2 * block + (int)i) % 5;
} /* group sums <= 16: exact */

void test_reduce_scatter(const TComm &c, size_t n)
{
    size_t total = n * (size_t)c.size;
    std::vector<float> send(total), recv(n, -1.0f), want(n, 0.0f);
    for (int b = 0; b < c.size; b++)
        for (size_t i = 0; i < n; i++)
            send[(size_t)b * n + i] = u32(wrank, b, i);
    for (size_t i = 0; i < n; i++)
        for (int m = 0; m < c.size; m++)
            want[i] += u32(c.world[m], c.rank, i);
    NCHECK(ncclReduceScatter(send.data(), recv.data(), n, ncclFloat32, ncclSum, c.nc, nullptr));
    EXPECT_F32(ctx(c, "reduce-scatter f32 out of place"), recv.data(), want.data(), n);
    /* in place: recvbuff == sendbuff + rank*recvcount */
    NCHECK(ncclReduceScatter(send.data(), send.data() + (size_t)c.rank * n, n, ncclFloat32, ncclSum, c.nc, nullptr));
    EXPECT_F32(ctx(c, "reduce-scatter f32 in place"), send.data() + (size_t)c.rank * n, want.data(), n);

    std::vector<uint16_t> s16(total), r16(n, 0xffff), w16(n);
    for (int b = 0; b < c.size; b++)
        for (size_t i = 0; i < n; i++)
            s16[(size_t)b * n + i] = bf((float)u16v(wrank, b, i));
    for (size_t i = 0; i < n; i++) {
        float s = 0;
        for (int m = 0; m < c.size; m++)
            s += (float)u16v(c.world[m], c.rank, i);
        w16[i] = bf(s);
    }
    NCHECK(ncclReduceScatter(s16.data(), r16.data(), n, ncclBfloat16, ncclSum, c.nc, nullptr));
    EXPECT_16(ctx(c, "reduce-scatter bf16 out of place"), BF16, r16.data(), w16.data(), n);
    NCHECK(ncclReduceScatter(s16.data(), s16.data() + (size_t)c.rank * n, n, ncclBfloat16, ncclSum, c.nc, nullptr));
    EXPECT_16(ctx(c, "reduce-scatter bf16 in place"), BF16, s16.data() + (size_t)c.rank * n, w16.data(), n);

    /* int32 through MPI's own reduction, fp16 through the gather path */
    std::vector<int32_t> si(total), ri(n), wi(n, 0);
    for (int b = 0; b < c.size; b++)
        for (size_t i = 0; i < n; i++)
            si[(size_t)b * n + i] = u16v(wrank, b, i) - 2;
    for (size_t i = 0; i < n; i++)
        for (int m = 0; m < c.size; m++)
            wi[i] += u16v(c.world[m], c.rank, i) - 2;
    NCHECK(ncclReduceScatter(si.data(), ri.data(), n, ncclInt32, ncclSum, c.nc, nullptr));
    EXPECT_INT(ctx(c, "reduce-scatter int32"), ri.data(), wi.data(), n);
    std::vector<uint16_t> sh(total), rh(n), wh(n);
    for (size_t j = 0; j < total; j++)
        sh[j] = hf((float)(si[j]));
    for (size_t i = 0; i < n; i++)
        wh[i] = hf((float)wi[i]);
    NCHECK(ncclReduceScatter(sh.data(), rh.data(), n, ncclFloat16, ncclSum, c.nc, nullptr));
    EXPECT_16(ctx(c, "reduce-scatter fp16"), F16, rh.data(), wh.data(), n);
}

/* ---- all-to-all, written as nccl_comm.cu's spb_nccl_alltoall --------------- */

float a32(int src, int dst, size_t i)
{
    return (float)(src * 100000 + dst * 1000 + (int)(i % 1000));
}
float a16(int src, int dst, size_t i)
{
    return (float)((src * 16 + dst * 4 + (int)i) % 256);
}

void alltoall_like_spbench(const TComm &c, const void *send, void *recv, size_t count, ncclDataType_t t, size_t eb)
{
    NCHECK(ncclGroupStart());
    for (int r = 0; r < c.size; r++) {
        NCHECK(ncclSend((const char *)send + r * count * eb, count, t, r, c.nc, nullptr));
        NCHECK(ncclRecv((char *)recv + r * count * eb, count, t, r, c.nc, nullptr));
    }
    NCHECK(ncclGroupEnd());
}

void test_alltoall(const TComm &c, size_t n)
{
    size_t total = n * (size_t)c.size;
    std::vector<float> send(total), recv(total, -1.0f), want(total);
    std::vector<uint16_t> s16(total), r16(total, 0xffff), w16(total);
    for (int p = 0; p < c.size; p++)
        for (size_t i = 0; i < n; i++) {
            send[(size_t)p * n + i] = a32(wrank, c.world[p], i);
            want[(size_t)p * n + i] = a32(c.world[p], wrank, i);
            s16[(size_t)p * n + i] = bf(a16(wrank, c.world[p], i));
            w16[(size_t)p * n + i] = bf(a16(c.world[p], wrank, i));
        }
    alltoall_like_spbench(c, send.data(), recv.data(), n, ncclFloat32, 4);
    EXPECT_F32(ctx(c, "all-to-all f32 (send/recv group, self included)"), recv.data(), want.data(), total);
    alltoall_like_spbench(c, s16.data(), r16.data(), n, ncclBfloat16, 2);
    EXPECT_16(ctx(c, "all-to-all bf16 (send/recv group, self included)"), BF16, r16.data(), w16.data(), total);
}

/* ---- ring exchange, nested groups, collectives in a group ------------------ */

void test_ring(const TComm &c, size_t n)
{
    int next = (c.rank + 1) % c.size, prev = (c.rank + c.size - 1) % c.size;
    std::vector<float> send(n), recv(n, -1.0f), want(n);
    for (size_t i = 0; i < n; i++) {
        send[i] = v32(wrank, i);
        want[i] = v32(c.world[prev], i);
    }
    /* The program's own MPI traffic on the group's MPI communicator, with
     * the tag the stand-in uses, is in flight across the exchange: neither
     * may take the other's message. */
    int mine[2] = {wrank, 0x5bcc}, theirs[2] = {-1, -1};
    MPI_Request rq[2];
    MPI_Irecv(theirs, 2, MPI_INT, prev, 0x5bcc, c.mpi, &rq[0]);
    MPI_Isend(mine, 2, MPI_INT, next, 0x5bcc, c.mpi, &rq[1]);

    NCHECK(ncclGroupStart()); /* as nccl_comm.cu's spb_nccl_sendrecv */
    NCHECK(ncclSend(send.data(), n, ncclFloat32, next, c.nc, nullptr));
    NCHECK(ncclRecv(recv.data(), n, ncclFloat32, prev, c.nc, nullptr));
    NCHECK(ncclGroupEnd());
    EXPECT_F32(ctx(c, "ring send/recv"), recv.data(), want.data(), n);

    MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
    CHECK(theirs[0] == c.world[prev] && theirs[1] == 0x5bcc, "%s: the program's own MPI message was disturbed",
          ctx(c, "ring").c_str());

    /* nested groups: nothing runs before the outermost ncclGroupEnd */
    std::fill(recv.begin(), recv.end(), -1.0f);
    NCHECK(ncclGroupStart());
    NCHECK(ncclGroupStart());
    NCHECK(ncclGroupStart());
    NCHECK(ncclSend(send.data(), n, ncclFloat32, next, c.nc, nullptr));
    NCHECK(ncclRecv(recv.data(), n, ncclFloat32, prev, c.nc, nullptr));
    NCHECK(ncclGroupEnd());
    NCHECK(ncclGroupEnd());
    CHECK(recv[0] == -1.0f, "%s: a send/recv pair ran at an inner ncclGroupEnd", ctx(c, "nested groups").c_str());
    NCHECK(ncclGroupEnd());
    EXPECT_F32(ctx(c, "nested groups, pair in the innermost"), recv.data(), want.data(), n);
    std::fill(recv.begin(), recv.end(), -1.0f);
    NCHECK(ncclGroupStart());
    NCHECK(ncclGroupStart());
    NCHECK(ncclSend(send.data(), n, ncclFloat32, next, c.nc, nullptr));
    NCHECK(ncclGroupEnd());
    NCHECK(ncclRecv(recv.data(), n, ncclFloat32, prev, c.nc, nullptr));
    CHECK(recv[0] == -1.0f, "%s: a receive ran before the outermost ncclGroupEnd", ctx(c, "nested groups").c_str());
    NCHECK(ncclGroupEnd());
    EXPECT_F32(ctx(c, "nested groups ring"), recv.data(), want.data(), n);

    /* collectives (and a ring exchange) queued in one group */
    std::vector<float> ar(n, -1.0f), arw(n, 0.0f), ag(n * (size_t)c.size, -1.0f), agw(n * (size_t)c.size);
    for (size_t i = 0; i < n; i++)
        for (int m = 0; m < c.size; m++) {
            arw[i] += v32(c.world[m], i);
            agw[(size_t)m * n + i] = v32(c.world[m], i);
        }
    std::fill(recv.begin(), recv.end(), -1.0f);
    NCHECK(ncclGroupStart());
    NCHECK(ncclAllReduce(send.data(), ar.data(), n, ncclFloat32, ncclSum, c.nc, nullptr));
    NCHECK(ncclAllGather(send.data(), ag.data(), n, ncclFloat32, c.nc, nullptr));
    NCHECK(ncclSend(send.data(), n, ncclFloat32, next, c.nc, nullptr));
    NCHECK(ncclRecv(recv.data(), n, ncclFloat32, prev, c.nc, nullptr));
    CHECK(ar[0] == -1.0f && ag[0] == -1.0f, "%s: a collective ran before ncclGroupEnd",
          ctx(c, "grouped collectives").c_str());
    NCHECK(ncclGroupEnd());
    EXPECT_F32(ctx(c, "grouped allreduce"), ar.data(), arw.data(), n);
    EXPECT_F32(ctx(c, "grouped allgather"), ag.data(), agw.data(), n * (size_t)c.size);
    EXPECT_F32(ctx(c, "grouped ring"), recv.data(), want.data(), n);

    /* send/recv outside a group (each runs alone): even group ranks send to
     * the next odd one */
    std::fill(recv.begin(), recv.end(), -1.0f);
    if (c.rank % 2 == 0 && c.rank + 1 < c.size)
        NCHECK(ncclSend(send.data(), n, ncclFloat32, c.rank + 1, c.nc, nullptr));
    if (c.rank % 2 == 1) {
        NCHECK(ncclRecv(recv.data(), n, ncclFloat32, c.rank - 1, c.nc, nullptr));
        EXPECT_F32(ctx(c, "send/recv outside a group"), recv.data(), want.data(), n);
    }

    /* broadcast from the last group rank, out of place and in place */
    int root = c.size - 1;
    std::vector<float> bw(n), bo(n, -1.0f), bi(n, -1.0f);
    for (size_t i = 0; i < n; i++)
        bw[i] = v32(c.world[root], i);
    if (c.rank == root)
        bi = send;
    NCHECK(ncclBroadcast(send.data(), bo.data(), n, ncclFloat32, root, c.nc, nullptr));
    NCHECK(ncclBroadcast(bi.data(), bi.data(), n, ncclFloat32, root, c.nc, nullptr));
    EXPECT_F32(ctx(c, "broadcast out of place"), bo.data(), bw.data(), n);
    EXPECT_F32(ctx(c, "broadcast in place"), bi.data(), bw.data(), n);
}

/* ---- errors ----------------------------------------------------------------- */

void test_errors(const TComm &c)
{
    float buf[8] = {0}, other[8] = {0};
    EXPECT_RC(ncclSend(buf, 4, ncclFloat32, c.size, c.nc, nullptr), ncclInvalidArgument);
    CHECK(strstr(ncclGetLastError(NULL), "peer") != nullptr, "ncclGetLastError after a bad peer: '%s'",
          ncclGetLastError(NULL));
    EXPECT_RC(ncclRecv(buf, 4, ncclFloat32, -1, c.nc, nullptr), ncclInvalidArgument);
    EXPECT_RC(ncclRecv(nullptr, 4, ncclFloat32, 0, c.nc, nullptr), ncclInvalidArgument);
    EXPECT_RC(ncclSend(buf, 4, ncclFloat32, 0, nullptr, nullptr), ncclInvalidArgument);
    EXPECT_RC(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, nullptr, nullptr), ncclInvalidArgument);
    EXPECT_RC(ncclAllReduce(buf, buf, 4, (ncclDataType_t)99, ncclSum, c.nc, nullptr), ncclInvalidArgument);
    EXPECT_RC(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclAvg, c.nc, nullptr), ncclInvalidArgument);
    EXPECT_RC(ncclAllReduce(buf, buf, 4, ncclFloat8e5m2, ncclSum, c.nc, nullptr), ncclInvalidArgument);
    EXPECT_RC(ncclReduceScatter(buf, nullptr, 1, ncclFloat32, ncclSum, c.nc, nullptr), ncclInvalidArgument);
    EXPECT_RC(ncclAllGather(nullptr, buf, 1, ncclFloat32, c.nc, nullptr), ncclInvalidArgument);
    EXPECT_RC(ncclBroadcast(buf, buf, 1, ncclFloat32, c.size, c.nc, nullptr), ncclInvalidArgument);
    EXPECT_RC(ncclGroupEnd(), ncclInvalidUsage);
    EXPECT_RC(ncclCommDestroy(nullptr), ncclInvalidArgument);
    int v = 0;
    EXPECT_RC(ncclCommCount(nullptr, &v), ncclInvalidArgument);
    /* zero elements: nothing to do, NULL buffers allowed */
    NCHECK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, c.nc, nullptr));
    NCHECK(ncclGroupStart());
    NCHECK(ncclSend(nullptr, 0, ncclFloat32, c.rank, c.nc, nullptr));
    NCHECK(ncclRecv(nullptr, 0, ncclFloat32, c.rank, c.nc, nullptr));
    NCHECK(ncclGroupEnd());

    /* An error inside a group fails the group end and drops the whole group
     * (every rank makes the same mistake, so nobody waits); the next group
     * works. */
    int next = (c.rank + 1) % c.size, prev = (c.rank + c.size - 1) % c.size;
    for (int i = 0; i < 8; i++) {
        buf[i] = (float)(wrank * 10 + i);
        other[i] = -1.0f;
    }
    NCHECK(ncclGroupStart());
    NCHECK(ncclSend(buf, 8, ncclFloat32, next, c.nc, nullptr));
    NCHECK(ncclRecv(other, 8, ncclFloat32, prev, c.nc, nullptr));
    EXPECT_RC(ncclSend(buf, 8, ncclFloat32, c.size + 3, c.nc, nullptr), ncclInvalidArgument);
    EXPECT_RC(ncclGroupEnd(), ncclInvalidArgument);
    CHECK(other[0] == -1.0f, "%s: a failed group still ran", c.name);
    NCHECK(ncclGroupStart());
    NCHECK(ncclSend(buf, 8, ncclFloat32, next, c.nc, nullptr));
    NCHECK(ncclRecv(other, 8, ncclFloat32, prev, c.nc, nullptr));
    NCHECK(ncclGroupEnd());
    CHECK(other[7] == (float)(c.world[prev] * 10 + 7), "%s: group after a failed group: got %g", c.name, other[7]);
}

void test_api_misc()
{
    int v = 0;
    NCHECK(ncclGetVersion(&v));
    CHECK(v == NCCL_VERSION_CODE, "ncclGetVersion %d, header %d", v, NCCL_VERSION_CODE);
    for (int a = 0; a < (int)ncclNumResults; a++) {
        const char *sa = ncclGetErrorString((ncclResult_t)a);
        CHECK(sa && *sa, "ncclGetErrorString(%d) empty", a);
        for (int b = 0; b < a; b++)
            CHECK(strcmp(sa, ncclGetErrorString((ncclResult_t)b)) != 0, "ncclGetErrorString(%d) == (%d)", a, b);
    }
}

/* Creation misuse, collective over the world (every rank makes the same
 * mistake, so none waits): an out-of-range rank, and ids that were not
 * shared (each rank alone but claiming the whole world). */
void test_bad_creation()
{
    ncclUniqueId id;
    NCHECK(ncclGetUniqueId(&id));
    ncclComm_t bad = nullptr;
    EXPECT_RC(ncclCommInitRank(&bad, 2, id, 5), ncclInvalidArgument);
    if (wsize > 1) {
        NCHECK(ncclGetUniqueId(&id));
        if (wrank == 0)
            fprintf(stderr, "(the next %d 'invalid usage' messages are expected)\n", wsize);
        MPI_Barrier(MPI_COMM_WORLD);
        EXPECT_RC(ncclCommInitRank(&bad, wsize, id, wrank), ncclInvalidUsage);
        CHECK(strstr(ncclGetLastError(NULL), "MPI_Comm_split") != nullptr, "creation mismatch message: '%s'",
              ncclGetLastError(NULL));
        MPI_Barrier(MPI_COMM_WORLD);
    }
}

void run_data_tests(const TComm &c, size_t n)
{
    test_allreduce_f32(c, n);
    test_allreduce_ints(c, n);
    test_allreduce_16(c, n, BF16);
    test_allreduce_16(c, n, F16);
    test_allgather(c, n);
    test_reduce_scatter(c, n);
    test_alltoall(c, n);
    test_ring(c, n);
}

} // namespace

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    signal(SIGALRM, on_alarm);
    alarm(60);

    test_api_misc();

    /* The program's groups: the world, its even/odd halves, the world in
     * reversed order.  Created in the same order on every rank. */
    MPI_Comm parity, reversed;
    MPI_Comm_split(MPI_COMM_WORLD, wrank % 2, wrank, &parity);
    MPI_Comm_split(MPI_COMM_WORLD, 0, wsize - wrank, &reversed);
    std::vector<TComm> comms;
    comms.push_back(make_comm("world", MPI_COMM_WORLD));
    comms.push_back(make_comm(wrank % 2 ? "odd ranks" : "even ranks", parity));
    comms.push_back(make_comm("world reversed", reversed));
    CHECK(comms[2].rank == wsize - 1 - wrank, "reversed communicator: rank %d", comms[2].rank);

    if (failures == 0) {
        for (const TComm &c : comms)
            run_data_tests(c, 257);
        test_alltoall(comms[0], 70000); /* messages past MPI's eager limit */
        mode = "40-byte chunks";
        spb_emu_nccl_set_max_message_bytes(40);
        for (const TComm &c : comms)
            run_data_tests(c, 13);
        spb_emu_nccl_set_max_message_bytes(0);
        mode = "default-limit";
        for (const TComm &c : comms)
            test_errors(c);
        test_bad_creation();
    }

    for (TComm &c : comms)
        NCHECK(ncclCommDestroy(c.nc));
    MPI_Comm_free(&parity);
    MPI_Comm_free(&reversed);

    long total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (wrank == 0) {
        if (total)
            fprintf(stderr, "test_emu_nccl: FAILED: %ld check(s) failed over %d ranks\n", total, wsize);
        else
            printf("test_emu_nccl: all checks passed on %d ranks\n", wsize);
    }
    MPI_Finalize();
    return total ? 1 : 0;
}
