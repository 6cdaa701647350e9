/* Over 700 lines: the NCCL stand-in: every collective, group and communicator call over MPI. */
/* A CPU stand-in for the part of NCCL that spbench calls (nccl_comm.cu,
 * nccl_device_comm.cu), implemented over MPI, for the CUDA emulation in
 * which "device memory" is host memory and every operation completes
 * before its call returns (each operation's stream and buffers go to the
 * emulation's stream-order checker, emu_streams.cc, where linked).  Compiled
 * with any C++17 compiler against NVIDIA's own nccl.h (declarations, types,
 * enums); links in place of libnccl and needs neither libnccl nor libcudart
 * (cuda_fp16.h's host conversions are header-only).
 *
 * LIMITATION - communicator creation is collective over MPI_COMM_WORLD.
 * The stand-in cannot see the MPI group that the caller bootstraps an id
 * over, so ncclCommInitRank builds its communicator with
 * MPI_Comm_split(MPI_COMM_WORLD, color from the id, key = rank).  Hence
 * EVERY rank of MPI_COMM_WORLD must call ncclCommInitRank (for its own
 * group) the same number of times, in the same order (spbench does: each
 * rank creates its SP, DP, ... communicators in the same sequence).  A rank
 * that skips a creation others make hangs them in the split; ranks whose
 * creations are paired with different groups' creations get a communicator
 * of the wrong size, which is detected: ncclInvalidUsage on the ranks
 * concerned, with a message (stderr and ncclGetLastError).  The color is
 * (world rank of the id's creator) * K + (that process's id counter), with
 * K = INT_MAX / world size, so two different ids never share a color.
 *
 * What it supports:
 *   ncclGetUniqueId, ncclCommInitRank, ncclCommInitRankConfig (config
 *   ignored), ncclCommFinalize (no-op), ncclCommDestroy, ncclCommAbort,
 *   ncclCommCount, ncclCommUserRank, ncclCommGetAsyncError (always
 *   success), ncclGetErrorString, ncclGetLastError, ncclGetVersion,
 *   ncclGroupStart/End (nesting), ncclSend, ncclRecv, ncclAllReduce,
 *   ncclAllGather, ncclReduceScatter, ncclBroadcast, ncclBcast.
 *   Types: every ncclDataType_t for data movement (send/recv, all-gather,
 *   broadcast; fp8 included); for reductions int8, uint8, int32, uint32,
 *   int64, uint64, fp16, bf16, fp32, fp64 with ncclSum, ncclProd, ncclMax,
 *   ncclMin.  Refused (ncclInvalidArgument): ncclAvg and user-created
 *   operators, fp8 reductions.
 *
 * Reductions.  fp32/fp64/int32/int64/uint64 with sum/max/min use MPI's own
 * reduction (MPI_Allreduce, MPI_Reduce_scatter_block).  Everything else
 * (16-bit floats, 8-bit and uint32 integers, products) gathers every rank's
 * contribution (MPI_Allgather / MPI_Alltoall of bytes) and reduces locally
 * in rank order 0, 1, ..., n-1, rounding to the element type after every
 * step (16-bit floats: computed in float, rounded to nearest even), so
 * every rank gets the same bits.  Only MPI calls that spbench's built-in
 * shm MPI (common/shm_mpi/mpi.h) also has are used, and no user-defined
 * MPI_Op or MPI datatype, so the file builds against either MPI.
 * Real NCCL sums in its own (ring/tree) order: results whose rounding
 * depends on the order may differ from it in the last bit; max/min
 * propagate NaN.
 *
 * Groups.  ncclGroupStart/End nest (a per-thread depth); every operation
 * issued inside a group (send, recv and collectives) is queued and runs at
 * the outermost ncclGroupEnd, reading its buffers then, as NCCL starts
 * nothing before ncclGroupEnd: first all sends and receives at once (every
 * MPI_Irecv, every MPI_Isend, one MPI_Waitall, so the all-to-all written as
 * send/recv pairs, self included, cannot deadlock; sends to one peer match
 * that peer's receives in issue order), then the collectives, in issue
 * order (blocking MPI collectives: ranks must issue them in the same order,
 * as they must on NCCL).  An argument error inside a group returns at once
 * and also makes the outermost ncclGroupEnd return it and drop the whole
 * group (as NCCL does).  ncclSend/ncclRecv outside a group run as a group
 * of one: they return once the message has been delivered (a send may
 * return earlier where MPI buffers it).
 *
 * Traffic.  Each communicator is its own MPI communicator (from the split),
 * so no message of the stand-in can match one of the program's own.  MPI
 * errors on it are returned (MPI_ERRORS_RETURN) as ncclSystemError.
 *
 * Sizes.  Counts are elements (size_t).  Transfers larger than INT_MAX
 * bytes are split into chunks; spb_emu_nccl_set_max_message_bytes (not an
 * NCCL call, for tests) lowers that limit.  Collectives on zero elements
 * return at once; zero-element sends/receives are still matched.
 *
 * In-place forms (NCCL's): all-reduce and broadcast with sendbuff ==
 * recvbuff; all-gather with sendbuff == recvbuff + rank*sendcount;
 * reduce-scatter with recvbuff == sendbuff + rank*recvcount (the other
 * blocks of sendbuff are left as they were).  Other overlaps of the send
 * and receive buffers work too (the input is copied first).
 *
 * Errors set a message for ncclGetLastError (per thread); with NCCL_DEBUG
 * set they are also printed to stderr, as are creation mismatches and MPI
 * failures always. */
#define OMPI_SKIP_MPICXX 1 /* mpi.h: the C API only */
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <climits>
#include <functional>
#include <type_traits>
#include <vector>

#include "emu_stream_hooks.h"

static_assert(sizeof(int) == 4, "ncclInt32 is reduced as MPI_INT");

struct ncclComm {
    uint32_t magic;
    MPI_Comm mpi;
    int rank, size;
};

namespace
{

constexpr uint32_t kCommMagic = 0x4e43434cu; /* "NCCL" */
constexpr uint32_t kDeadMagic = 0xdeadc0deu;
constexpr int kTag = 0x5bcc;
constexpr char kIdMagic[8] = {'s', 'p', 'b', 'e', 'm', 'u', 'i', 'd'};

/* What ncclGetUniqueId writes into ncclUniqueId::internal. */
struct emu_id {
    char magic[8];
    int32_t root_world_rank;
    int32_t world_size;
    uint32_t counter;
};
static_assert(sizeof(emu_id) <= NCCL_UNIQUE_ID_BYTES, "id fits");

std::atomic<uint32_t> id_counter{0};
std::atomic<size_t> max_message_bytes{(size_t)INT_MAX};

/* ---- errors --------------------------------------------------------------- */

thread_local char last_error[1024];

bool debug_enabled()
{
    const char *e = getenv("NCCL_DEBUG");
    return e && *e;
}

int world_rank_or_minus1()
{
    int init = 0, fin = 0, r = -1;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin)
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

/* Records (and maybe prints) a message; returns rc. */
__attribute__((format(printf, 3, 4))) ncclResult_t fail(ncclResult_t rc, bool always_print, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(last_error, sizeof last_error, "emu_nccl: %s", msg);
    if (always_print || debug_enabled())
        fprintf(stderr, "emu_nccl (world rank %d): %s: %s\n", world_rank_or_minus1(), ncclGetErrorString(rc), msg);
    return rc;
}

ncclResult_t mpi_fail(int mpi_rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING + 1] = "";
    int len = 0;
    if (MPI_Error_string(mpi_rc, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", mpi_rc);
    return fail(ncclSystemError, true, "%s failed: %s", what, s);
}

#define EMU_MPI(call)                                                                                                  \
    do {                                                                                                               \
        int emu_rc_ = (call);                                                                                          \
        if (emu_rc_ != MPI_SUCCESS)                                                                                    \
            return mpi_fail(emu_rc_, #call);                                                                           \
    } while (0)
#define EMU_TRY(call)                                                                                                  \
    do {                                                                                                               \
        ncclResult_t emu_r_ = (call);                                                                                  \
        if (emu_r_ != ncclSuccess)                                                                                     \
            return emu_r_;                                                                                             \
    } while (0)

bool mpi_usable()
{
    int init = 0, fin = 0;
    if (MPI_Initialized(&init) != MPI_SUCCESS || !init)
        return false;
    if (MPI_Finalized(&fin) != MPI_SUCCESS || fin)
        return false;
    return true;
}

ncclResult_t check_comm(const ncclComm *c, const char *fn)
{
    if (!c)
        return fail(ncclInvalidArgument, false, "%s: comm is NULL", fn);
    if (c->magic != kCommMagic)
        return fail(ncclInvalidArgument, false, "%s: comm %p is not a live communicator (destroyed or garbage)", fn,
                    (const void *)c);
    if (!mpi_usable())
        return fail(ncclInvalidUsage, true, "%s: MPI is not initialised or already finalised", fn);
    return ncclSuccess;
}

/* ---- types and reductions ---------------------------------------------- */

enum class Kind { I8, U8, I32, U32, I64, U64, F16, BF16, F32, F64, F8 };

struct TypeInfo {
    Kind kind;
    size_t size;
    const char *name;
};

ncclResult_t type_info(ncclDataType_t t, TypeInfo *ti, const char *fn)
{
    switch (t) {
    case ncclInt8:
        *ti = {Kind::I8, 1, "int8"};
        return ncclSuccess;
    case ncclUint8:
        *ti = {Kind::U8, 1, "uint8"};
        return ncclSuccess;
    case ncclInt32:
        *ti = {Kind::I32, 4, "int32"};
        return ncclSuccess;
    case ncclUint32:
        *ti = {Kind::U32, 4, "uint32"};
        return ncclSuccess;
    case ncclInt64:
        *ti = {Kind::I64, 8, "int64"};
        return ncclSuccess;
    case ncclUint64:
        *ti = {Kind::U64, 8, "uint64"};
        return ncclSuccess;
    case ncclFloat16:
        *ti = {Kind::F16, 2, "float16"};
        return ncclSuccess;
    case ncclBfloat16:
        *ti = {Kind::BF16, 2, "bfloat16"};
        return ncclSuccess;
    case ncclFloat32:
        *ti = {Kind::F32, 4, "float32"};
        return ncclSuccess;
    case ncclFloat64:
        *ti = {Kind::F64, 8, "float64"};
        return ncclSuccess;
    case ncclFloat8e4m3:
        *ti = {Kind::F8, 1, "float8e4m3"};
        return ncclSuccess;
    case ncclFloat8e5m2:
        *ti = {Kind::F8, 1, "float8e5m2"};
        return ncclSuccess;
    default:
        break;
    }
    return fail(ncclInvalidArgument, false, "%s: unknown datatype %d", fn, (int)t);
}

const char *op_name(ncclRedOp_t op)
{
    switch (op) {
    case ncclSum:
        return "sum";
    case ncclProd:
        return "prod";
    case ncclMax:
        return "max";
    case ncclMin:
        return "min";
    case ncclAvg:
        return "avg";
    default:
        return "user-defined";
    }
}

ncclResult_t check_reduction(const TypeInfo &ti, ncclRedOp_t op, const char *fn)
{
    if (op != ncclSum && op != ncclProd && op != ncclMax && op != ncclMin)
        return fail(ncclInvalidArgument, false, "%s: reduction operator %d (%s) is not supported by the emulation", fn,
                    (int)op, op_name(op));
    if (ti.kind == Kind::F8)
        return fail(ncclInvalidArgument, false, "%s: reductions on %s are not supported by the emulation", fn, ti.name);
    return ncclSuccess;
}

/* MPI's own reduction serves this type and operator (in every MPI spbench
 * builds with); otherwise the gather-and-reduce path. */
bool native_reduction(const TypeInfo &ti, ncclRedOp_t op, MPI_Datatype *dt, MPI_Op *mop)
{
    if (op == ncclProd)
        return false;
    switch (ti.kind) {
    case Kind::F32:
        *dt = MPI_FLOAT;
        break;
    case Kind::F64:
        *dt = MPI_DOUBLE;
        break;
    case Kind::I32:
        *dt = MPI_INT;
        break;
    case Kind::I64:
        *dt = MPI_INT64_T;
        break;
    case Kind::U64:
        *dt = MPI_UINT64_T;
        break;
    default:
        return false;
    }
    *mop = op == ncclSum ? MPI_SUM : op == ncclMax ? MPI_MAX : MPI_MIN;
    return true;
}

/* cuda_bf16.h / cuda_fp16.h's host conversions: round to nearest even, as
 * NCCL's device arithmetic does */
float bf16_to_float(uint16_t h)
{
    __nv_bfloat16_raw r;
    r.x = h;
    return __bfloat162float(__nv_bfloat16(r));
}

uint16_t float_to_bf16(float f)
{
    __nv_bfloat16_raw r = __float2bfloat16_rn(f);
    return r.x;
}

float f16_to_float(uint16_t h)
{
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
}

uint16_t float_to_f16(float f)
{
    __half_raw r = __float2half_rn(f);
    return r.x;
}

template <class F> F combine_float(F a, F b, ncclRedOp_t op)
{
    switch (op) {
    case ncclSum:
        return a + b;
    case ncclProd:
        return a * b;
    case ncclMax:
        return (a != a || a > b) ? a : b; /* NaN propagates */
    default:
        return (a != a || a < b) ? a : b;
    }
}

template <class T> T combine_int(T a, T b, ncclRedOp_t op)
{
    using U = typename std::make_unsigned<T>::type;
    switch (op) {
    case ncclSum:
        return (T)(U)((uintmax_t)(U)a + (uintmax_t)(U)b); /* wraps, no signed overflow */
    case ncclProd:
        return (T)(U)((uintmax_t)(U)a * (uintmax_t)(U)b);
    case ncclMax:
        return a > b ? a : b;
    default:
        return a < b ? a : b;
    }
}

template <class T> void fold_int(void *acc, const void *in, size_t n, ncclRedOp_t op)
{
    for (size_t i = 0; i < n; i++) {
        T a, b;
        memcpy(&a, (const char *)acc + i * sizeof(T), sizeof(T));
        memcpy(&b, (const char *)in + i * sizeof(T), sizeof(T));
        a = combine_int<T>(a, b, op);
        memcpy((char *)acc + i * sizeof(T), &a, sizeof(T));
    }
}

template <class F> void fold_float(void *acc, const void *in, size_t n, ncclRedOp_t op)
{
    for (size_t i = 0; i < n; i++) {
        F a, b;
        memcpy(&a, (const char *)acc + i * sizeof(F), sizeof(F));
        memcpy(&b, (const char *)in + i * sizeof(F), sizeof(F));
        a = combine_float<F>(a, b, op);
        memcpy((char *)acc + i * sizeof(F), &a, sizeof(F));
    }
}

/* 16-bit floats: each step computed in float (exact for the sum or product
 * of two 16-bit values up to the final rounding), rounded back at once. */
template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void fold_half(void *acc, const void *in, size_t n, ncclRedOp_t op)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t a, b;
        memcpy(&a, (const char *)acc + 2 * i, 2);
        memcpy(&b, (const char *)in + 2 * i, 2);
        uint16_t r = Store(combine_float<float>(Load(a), Load(b), op));
        memcpy((char *)acc + 2 * i, &r, 2);
    }
}

/* acc[i] = acc[i] op in[i] for n elements. */
void fold(Kind k, void *acc, const void *in, size_t n, ncclRedOp_t op)
{
    switch (k) {
    case Kind::I8:
        fold_int<int8_t>(acc, in, n, op);
        break;
    case Kind::U8:
        fold_int<uint8_t>(acc, in, n, op);
        break;
    case Kind::I32:
        fold_int<int32_t>(acc, in, n, op);
        break;
    case Kind::U32:
        fold_int<uint32_t>(acc, in, n, op);
        break;
    case Kind::I64:
        fold_int<int64_t>(acc, in, n, op);
        break;
    case Kind::U64:
        fold_int<uint64_t>(acc, in, n, op);
        break;
    case Kind::F16:
        fold_half<f16_to_float, float_to_f16>(acc, in, n, op);
        break;
    case Kind::BF16:
        fold_half<bf16_to_float, float_to_bf16>(acc, in, n, op);
        break;
    case Kind::F32:
        fold_float<float>(acc, in, n, op);
        break;
    case Kind::F64:
        fold_float<double>(acc, in, n, op);
        break;
    case Kind::F8:
        break; /* refused earlier */
    }
}

/* out = block 0 op block 1 op ... op block n-1 (in rank order), each block
 * len elements of `blocks`. */
void reduce_blocks(const TypeInfo &ti, void *out, const char *blocks, int nblocks, size_t len, ncclRedOp_t op)
{
    size_t bytes = len * ti.size;
    memcpy(out, blocks, bytes);
    for (int r = 1; r < nblocks; r++)
        fold(ti.kind, out, blocks + (size_t)r * bytes, len, op);
}

/* ---- buffers and chunks ------------------------------------------------- */

bool overlap(const void *a, size_t abytes, const void *b, size_t bbytes)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return abytes && bbytes && x < y + bbytes && y < x + abytes;
}

/* Elements per transfer so that `factor` x elements x size bytes stay
 * within the message limit (at least 1). */
size_t chunk_elems(size_t elem_size, size_t factor)
{
    size_t lim = max_message_bytes.load();
    size_t per = elem_size * factor;
    size_t n = per ? lim / per : lim;
    return n ? n : 1;
}

/* Checks count x factor x size fits size_t. */
ncclResult_t check_size(size_t count, size_t factor, size_t size, const char *fn)
{
    if (count && (factor > SIZE_MAX / count || size > SIZE_MAX / (count * factor)))
        return fail(ncclInvalidArgument, false, "%s: count %zu is too large", fn, count);
    return ncclSuccess;
}

ncclResult_t check_buffer(const void *p, size_t count, const char *what, const char *fn)
{
    if (count && !p)
        return fail(ncclInvalidArgument, false, "%s: %s is NULL with count %zu", fn, what, count);
    return ncclSuccess;
}

/* ---- collectives (run now) ------------------------------------------------ */

ncclResult_t run_allreduce(const void *send, void *recv, size_t count, TypeInfo ti, ncclRedOp_t op, ncclComm *c)
{
    if (count == 0)
        return ncclSuccess;
    size_t bytes = count * ti.size;
    std::vector<char> copy;
    bool in_place = send == recv;
    if (!in_place && overlap(send, bytes, recv, bytes)) {
        copy.assign((const char *)send, (const char *)send + bytes);
        send = copy.data();
    }
    MPI_Datatype dt;
    MPI_Op mop;
    if (native_reduction(ti, op, &dt, &mop)) {
        size_t step = chunk_elems(ti.size, 1);
        for (size_t off = 0; off < count; off += step) {
            size_t len = count - off < step ? count - off : step;
            char *out = (char *)recv + off * ti.size;
            const void *in = in_place ? MPI_IN_PLACE : (const void *)((const char *)send + off * ti.size);
            EMU_MPI(MPI_Allreduce(in, out, (int)len, dt, mop, c->mpi));
        }
        return ncclSuccess;
    }
    size_t step = chunk_elems(ti.size, (size_t)c->size);
    std::vector<char> all(step < count ? step * ti.size * c->size : bytes * c->size);
    for (size_t off = 0; off < count; off += step) {
        size_t len = count - off < step ? count - off : step;
        const char *in = (const char *)send + off * ti.size;
        EMU_MPI(MPI_Allgather(in, (int)(len * ti.size), MPI_BYTE, all.data(), (int)(len * ti.size), MPI_BYTE, c->mpi));
        reduce_blocks(ti, (char *)recv + off * ti.size, all.data(), c->size, len, op);
    }
    return ncclSuccess;
}

ncclResult_t run_allgather(const void *send, void *recv, size_t count, TypeInfo ti, ncclComm *c)
{
    if (count == 0)
        return ncclSuccess;
    size_t bytes = count * ti.size, n = (size_t)c->size;
    char *own = (char *)recv + (size_t)c->rank * bytes;
    bool in_place = send == own;
    std::vector<char> copy;
    if (!in_place && overlap(send, bytes, recv, bytes * n)) {
        copy.assign((const char *)send, (const char *)send + bytes);
        send = copy.data();
    }
    size_t step = chunk_elems(ti.size, n);
    if (step >= count) {
        if (in_place)
            EMU_MPI(MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->mpi));
        else
            EMU_MPI(MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->mpi));
        return ncclSuccess;
    }
    /* Chunks: gather piece [off, off+len) of every rank's block, then place
     * them.  In place, the piece written into our own block is the one just
     * sent (identical bytes), and later pieces are still untouched. */
    std::vector<char> all(step * ti.size * n);
    for (size_t off = 0; off < count; off += step) {
        size_t len = count - off < step ? count - off : step, lb = len * ti.size;
        const char *in = (const char *)send + off * ti.size;
        EMU_MPI(MPI_Allgather(in, (int)lb, MPI_BYTE, all.data(), (int)lb, MPI_BYTE, c->mpi));
        for (size_t r = 0; r < n; r++)
            memmove((char *)recv + r * bytes + off * ti.size, all.data() + r * lb, lb);
    }
    return ncclSuccess;
}

ncclResult_t run_reduce_scatter(const void *send, void *recv, size_t count, TypeInfo ti, ncclRedOp_t op, ncclComm *c)
{
    if (count == 0)
        return ncclSuccess;
    size_t bytes = count * ti.size, n = (size_t)c->size;
    size_t step = chunk_elems(ti.size, n);
    bool chunked = step < count;
    /* In place (recv = send + rank*count) or any other overlap: every piece
     * is packed into a fresh buffer before the MPI call, so MPI never sees
     * aliased buffers; what the piece's result overwrites has been read. */
    bool aliased = overlap(send, bytes * n, recv, bytes);
    std::vector<char> copy;
    if (aliased && (const char *)recv != (const char *)send + (size_t)c->rank * bytes) {
        copy.assign((const char *)send, (const char *)send + bytes * n);
        send = copy.data();
    }
    bool pack = chunked || aliased;
    MPI_Datatype dt;
    MPI_Op mop;
    bool native = native_reduction(ti, op, &dt, &mop);
    size_t len_max = chunked ? step : count;
    std::vector<char> packed(pack ? len_max * ti.size * n : 0);
    std::vector<char> all(native ? 0 : len_max * ti.size * n);
    for (size_t off = 0; off < count; off += len_max) {
        size_t len = count - off < len_max ? count - off : len_max, lb = len * ti.size;
        const char *in = (const char *)send;
        if (pack) {
            for (size_t r = 0; r < n; r++)
                memcpy(packed.data() + r * lb, (const char *)send + r * bytes + off * ti.size, lb);
            in = packed.data();
        }
        char *out = (char *)recv + off * ti.size;
        if (native) {
            EMU_MPI(MPI_Reduce_scatter_block(in, out, (int)len, dt, mop, c->mpi));
        } else {
            EMU_MPI(MPI_Alltoall(in, (int)lb, MPI_BYTE, all.data(), (int)lb, MPI_BYTE, c->mpi));
            reduce_blocks(ti, out, all.data(), c->size, len, op);
        }
    }
    return ncclSuccess;
}

ncclResult_t run_broadcast(const void *send, void *recv, size_t count, TypeInfo ti, int root, ncclComm *c)
{
    if (count == 0)
        return ncclSuccess;
    size_t bytes = count * ti.size;
    if (c->rank == root && send != recv)
        memmove(recv, send, bytes);
    size_t step = chunk_elems(ti.size, 1);
    for (size_t off = 0; off < count; off += step) {
        size_t len = count - off < step ? count - off : step;
        EMU_MPI(MPI_Bcast((char *)recv + off * ti.size, (int)(len * ti.size), MPI_BYTE, root, c->mpi));
    }
    return ncclSuccess;
}

/* ---- groups ---------------------------------------------------------------- */

struct P2p {
    bool send;
    void *buf;
    size_t count;
    TypeInfo ti;
    int peer;
    ncclComm *comm;
};

struct GroupState {
    int depth = 0;
    ncclResult_t error = ncclSuccess; /* first argument error inside the group */
    std::vector<P2p> p2p;
    std::vector<std::function<ncclResult_t()>> colls;
};
thread_local GroupState group;
/* What a GPU would launch: one kernel per outermost group that runs
 * anything, one per operation outside a group (spb_emu_nccl_launch_count). */
long launches;

ncclResult_t run_p2p(const std::vector<P2p> &ops)
{
    if (ops.empty())
        return ncclSuccess;
    std::vector<MPI_Request> reqs;
    static char dummy;
    /* Receives first, then sends, all non-blocking; messages larger than the
     * limit go as consecutive chunks, matched in order on both sides. */
    for (int pass = 0; pass < 2; pass++) {
        bool sends = pass == 1;
        for (const P2p &p : ops) {
            if (p.send != sends)
                continue;
            size_t step = chunk_elems(p.ti.size, 1);
            size_t off = 0;
            do {
                size_t len = p.count - off < step ? p.count - off : step;
                char *b = p.count ? (char *)p.buf + off * p.ti.size : &dummy;
                MPI_Request rq;
                if (sends)
                    EMU_MPI(MPI_Isend(b, (int)(len * p.ti.size), MPI_BYTE, p.peer, kTag, p.comm->mpi, &rq));
                else
                    EMU_MPI(MPI_Irecv(b, (int)(len * p.ti.size), MPI_BYTE, p.peer, kTag, p.comm->mpi, &rq));
                reqs.push_back(rq);
                off += len;
            } while (off < p.count);
        }
    }
    EMU_MPI(MPI_Waitall((int)reqs.size(), reqs.data(), MPI_STATUSES_IGNORE));
    return ncclSuccess;
}

ncclResult_t run_group(GroupState &g)
{
    std::vector<P2p> p2p;
    std::vector<std::function<ncclResult_t()>> colls;
    p2p.swap(g.p2p);
    colls.swap(g.colls);
    ncclResult_t err = g.error;
    g.error = ncclSuccess;
    if (err != ncclSuccess)
        return err; /* dropped, as NCCL drops a failed group */
    if (!p2p.empty() || !colls.empty()) launches++;
    EMU_TRY(run_p2p(p2p));
    for (auto &f : colls)
        EMU_TRY(f());
    return ncclSuccess;
}

/* Inside a group: remember an argument error for ncclGroupEnd. */
ncclResult_t note(ncclResult_t rc)
{
    if (rc != ncclSuccess && group.depth > 0 && group.error == ncclSuccess)
        group.error = rc;
    return rc;
}

/* Runs a collective now, or at the outermost ncclGroupEnd. */
ncclResult_t issue(std::function<ncclResult_t()> f)
{
    if (group.depth > 0) {
        group.colls.push_back(std::move(f));
        return ncclSuccess;
    }
    launches++;
    return f();
}

/* An operation's place in the streams' order (emu_stream_hooks.h): it runs
 * at once, but a GPU would run it on `s`, reading `send` and writing `recv`
 * there (an empty buffer touches nothing). */
void track(cudaStream_t s, const char *fn, const void *send, size_t send_bytes, const void *recv, size_t recv_bytes)
{
    spb_emu_stream_track(s, fn, {{send_bytes ? send : nullptr, send_bytes, 0}, {recv_bytes ? recv : nullptr, recv_bytes, 1}});
}

ncclResult_t p2p(bool send, void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, const char *fn,
                 cudaStream_t stream)
{
    TypeInfo ti;
    EMU_TRY(note(check_comm(comm, fn)));
    EMU_TRY(note(type_info(t, &ti, fn)));
    if (peer < 0 || peer >= comm->size)
        return note(fail(ncclInvalidArgument, false, "%s: peer %d out of range (communicator of %d ranks)", fn, peer,
                         comm->size));
    EMU_TRY(note(check_buffer(buf, count, send ? "sendbuff" : "recvbuff", fn)));
    EMU_TRY(note(check_size(count, 1, ti.size, fn)));
    track(stream, fn, send ? buf : nullptr, send ? count * ti.size : 0, send ? nullptr : buf,
          send ? 0 : count * ti.size);
    P2p op = {send, buf, count, ti, peer, comm};
    if (group.depth > 0) {
        group.p2p.push_back(op);
        return ncclSuccess;
    }
    launches++;
    return run_p2p(std::vector<P2p>{op});
}

} // namespace

/* ---- the NCCL API ----------------------------------------------------------- */

extern "C" {

/* Not an NCCL call: the NCCL kernels a GPU would have launched so far (the
 * kernel timeline's check that each lies inside an interval, cuda_trace.cu). */
long spb_emu_nccl_launch_count(void) { return launches; }

/* Not an NCCL call: the largest message (bytes) the stand-in hands MPI in
 * one call before splitting it into chunks (default and maximum INT_MAX).
 * For tests of the chunked paths; 0 restores the default. */
void spb_emu_nccl_set_max_message_bytes(size_t bytes)
{
    max_message_bytes.store(bytes == 0 || bytes > (size_t)INT_MAX ? (size_t)INT_MAX : bytes);
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error";
    case ncclSystemError:
        return "unhandled system error (MPI failure in the NCCL emulation)";
    case ncclInternalError:
        return "internal error";
    case ncclInvalidArgument:
        return "invalid argument";
    case ncclInvalidUsage:
        return "invalid usage";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_error;
}

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return fail(ncclInvalidArgument, false, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return fail(ncclInvalidArgument, false, "ncclGetUniqueId: uniqueId is NULL");
    if (!mpi_usable())
        return fail(ncclInvalidUsage, true, "ncclGetUniqueId: MPI must be initialised (the emulation runs over MPI)");
    int wr = 0, ws = 0;
    EMU_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &wr));
    EMU_MPI(MPI_Comm_size(MPI_COMM_WORLD, &ws));
    uint32_t k = (uint32_t)(INT_MAX / ws);
    uint32_t n = id_counter.fetch_add(1);
    if (n >= k)
        return fail(ncclInternalError, true,
                    "ncclGetUniqueId: this process has made %u ids, the most the emulation's "
                    "colors allow with %d ranks",
                    n, ws);
    emu_id e;
    memcpy(e.magic, kIdMagic, sizeof e.magic);
    e.root_world_rank = wr;
    e.world_size = ws;
    e.counter = n;
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &e, sizeof e);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    const char *fn = "ncclCommInitRank";
    if (!mpi_usable())
        return fail(ncclInvalidUsage, true, "%s: MPI must be initialised (the emulation runs over MPI)", fn);
    int wr = 0, ws = 0;
    EMU_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &wr));
    EMU_MPI(MPI_Comm_size(MPI_COMM_WORLD, &ws));
    emu_id e;
    memcpy(&e, commId.internal, sizeof e);
    int k = INT_MAX / ws;
    /* An argument error must still take part in the split (with no color),
     * or the other ranks of the world would wait for this one forever. */
    ncclResult_t err = ncclSuccess;
    if (!comm)
        err = fail(ncclInvalidArgument, false, "%s: comm is NULL", fn);
    else if (nranks < 1 || rank < 0 || rank >= nranks)
        err = fail(ncclInvalidArgument, false, "%s: rank %d of %d ranks", fn, rank, nranks);
    else if (memcmp(e.magic, kIdMagic, sizeof e.magic) != 0)
        err = fail(ncclInvalidArgument, false, "%s: the id does not come from this emulation's ncclGetUniqueId", fn);
    else if (e.world_size != ws || e.root_world_rank < 0 || e.root_world_rank >= ws || e.counter >= (uint32_t)k)
        err = fail(ncclInvalidArgument, false, "%s: corrupt id (creator %d of %d, counter %u; world of %d)", fn,
                   (int)e.root_world_rank, (int)e.world_size, (unsigned)e.counter, ws);
    int color = err == ncclSuccess ? (int)e.root_world_rank * k + (int)e.counter : MPI_UNDEFINED;
    MPI_Comm sub = MPI_COMM_NULL;
    EMU_MPI(MPI_Comm_split(MPI_COMM_WORLD, color, rank, &sub));
    if (err != ncclSuccess) {
        if (sub != MPI_COMM_NULL)
            MPI_Comm_free(&sub);
        return err;
    }
    int got_rank = -1, got_size = -1;
    EMU_MPI(MPI_Comm_rank(sub, &got_rank));
    EMU_MPI(MPI_Comm_size(sub, &got_size));
    if (got_size != nranks || got_rank != rank) {
        MPI_Comm_free(&sub);
        return fail(ncclInvalidUsage, true,
                    "%s: expected rank %d of %d but the ranks holding this id (made by world rank %d) form a group "
                    "of %d where this one is rank %d.  The emulation creates communicators with "
                    "MPI_Comm_split(MPI_COMM_WORLD): every world rank must call ncclCommInitRank the same number of "
                    "times in the same order, and the ranks of one id must pass distinct ranks 0..nranks-1",
                    fn, rank, nranks, (int)e.root_world_rank, got_size, got_rank);
    }
    EMU_MPI(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN));
    ncclComm *c = new ncclComm;
    c->magic = kCommMagic;
    c->mpi = sub;
    c->rank = rank;
    c->size = nranks;
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config)
{
    (void)config; /* blocking, CTAs, names...: nothing to configure on the CPU */
    return ncclCommInitRank(comm, nranks, commId, rank);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    return check_comm(comm, "ncclCommFinalize");
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return fail(ncclInvalidArgument, false, "ncclCommDestroy: comm is NULL");
    if (comm->magic != kCommMagic)
        return fail(ncclInvalidArgument, false, "ncclCommDestroy: comm %p is not a live communicator",
                    (const void *)comm);
    ncclResult_t rc = ncclSuccess;
    if (mpi_usable()) { /* after MPI_Finalize there is nothing left to free */
        int mrc = MPI_Comm_free(&comm->mpi);
        if (mrc != MPI_SUCCESS)
            rc = mpi_fail(mrc, "MPI_Comm_free");
    }
    comm->magic = kDeadMagic;
    delete comm;
    return rc;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess; /* NCCL accepts a NULL communicator here */
    return ncclCommDestroy(comm);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    EMU_TRY(check_comm(comm, "ncclCommGetAsyncError"));
    if (!asyncError)
        return fail(ncclInvalidArgument, false, "ncclCommGetAsyncError: asyncError is NULL");
    *asyncError = ncclSuccess; /* everything completes inside its call */
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    EMU_TRY(check_comm(comm, "ncclCommCount"));
    if (!count)
        return fail(ncclInvalidArgument, false, "ncclCommCount: count is NULL");
    *count = comm->size;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    EMU_TRY(check_comm(comm, "ncclCommUserRank"));
    if (!rank)
        return fail(ncclInvalidArgument, false, "ncclCommUserRank: rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart()
{
    group.depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd()
{
    if (group.depth == 0)
        return fail(ncclInvalidUsage, false, "ncclGroupEnd: not inside ncclGroupStart");
    if (--group.depth > 0)
        return ncclSuccess;
    return run_group(group);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return p2p(true, const_cast<void *>(sendbuff), count, datatype, peer, comm, "ncclSend", stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return p2p(false, recvbuff, count, datatype, peer, comm, "ncclRecv", stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream)
{
    const char *fn = "ncclAllReduce";
    TypeInfo ti;
    EMU_TRY(note(check_comm(comm, fn)));
    EMU_TRY(note(type_info(datatype, &ti, fn)));
    EMU_TRY(note(check_reduction(ti, op, fn)));
    EMU_TRY(note(check_buffer(sendbuff, count, "sendbuff", fn)));
    EMU_TRY(note(check_buffer(recvbuff, count, "recvbuff", fn)));
    EMU_TRY(note(check_size(count, (size_t)comm->size, ti.size, fn)));
    track(stream, fn, sendbuff, count * ti.size, recvbuff, count * ti.size);
    return issue([=] { return run_allreduce(sendbuff, recvbuff, count, ti, op, comm); });
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream)
{
    const char *fn = "ncclAllGather";
    TypeInfo ti;
    EMU_TRY(note(check_comm(comm, fn)));
    EMU_TRY(note(type_info(datatype, &ti, fn)));
    EMU_TRY(note(check_buffer(sendbuff, sendcount, "sendbuff", fn)));
    EMU_TRY(note(check_buffer(recvbuff, sendcount, "recvbuff", fn)));
    EMU_TRY(note(check_size(sendcount, (size_t)comm->size, ti.size, fn)));
    track(stream, fn, sendbuff, sendcount * ti.size, recvbuff, sendcount * comm->size * ti.size);
    return issue([=] { return run_allgather(sendbuff, recvbuff, sendcount, ti, comm); });
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    const char *fn = "ncclReduceScatter";
    TypeInfo ti;
    EMU_TRY(note(check_comm(comm, fn)));
    EMU_TRY(note(type_info(datatype, &ti, fn)));
    EMU_TRY(note(check_reduction(ti, op, fn)));
    EMU_TRY(note(check_buffer(sendbuff, recvcount, "sendbuff", fn)));
    EMU_TRY(note(check_buffer(recvbuff, recvcount, "recvbuff", fn)));
    EMU_TRY(note(check_size(recvcount, (size_t)comm->size, ti.size, fn)));
    track(stream, fn, sendbuff, recvcount * comm->size * ti.size, recvbuff, recvcount * ti.size);
    return issue([=] { return run_reduce_scatter(sendbuff, recvbuff, recvcount, ti, op, comm); });
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream)
{
    const char *fn = "ncclBroadcast";
    TypeInfo ti;
    EMU_TRY(note(check_comm(comm, fn)));
    EMU_TRY(note(type_info(datatype, &ti, fn)));
    if (root < 0 || root >= comm->size)
        return note(fail(ncclInvalidArgument, false, "%s: root %d out of range (communicator of %d ranks)", fn, root,
                         comm->size));
    if (comm->rank == root)
        EMU_TRY(note(check_buffer(sendbuff, count, "sendbuff", fn)));
    EMU_TRY(note(check_buffer(recvbuff, count, "recvbuff", fn)));
    EMU_TRY(note(check_size(count, 1, ti.size, fn)));
    track(stream, fn, comm->rank == root ? sendbuff : nullptr, comm->rank == root ? count * ti.size : 0, recvbuff,
          count * ti.size);
    return issue([=] { return run_broadcast(sendbuff, recvbuff, count, ti, root, comm); });
}

ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream)
{
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

} // extern "C"
