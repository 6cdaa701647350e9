/* NCCL communication layer (nccl_comm.h). */
#define OMPI_SKIP_MPICXX 1 /* mpi.h: the C API only */
#define MPICH_SKIP_MPICXX 1
#include <string.h>
#include <unistd.h>

#include <deque>
#include <vector>

#include "bf16.h"
#include "cuda_launch.cuh"
#include "cuda_trace.h"
#include "fp16.h"
#include "nccl_check.h"
#include "nccl_comm.h"

namespace {
/* A call issued on the comm stream whose time has not been read yet. */
struct pending {
    cudaEvent_t start, stop;
    spb_nccl_op op;
    long tag;
};
} // namespace

struct spb_nccl_comm {
    ncclComm_t comm;
    int rank, size;
    cudaStream_t stream;
    cudaEvent_t ready;              /* `after`'s work so far (reused: a wait uses its state when issued) */
    cudaEvent_t joined;             /* the comm stream's work so far, for spb_nccl_join (same) */
    std::deque<pending> pend;       /* in issue order, so they finish in this order */
    std::vector<cudaEvent_t> spare; /* timing events free for reuse */
    spb_nccl_time_sink sink;
    void *sink_ctx;
    void *scratch; /* reduce_scatterv's received blocks (nccl_comm.h) */
    size_t scratch_bytes;
};

static ncclDataType_t nccl_type(spb_nccl_dtype t)
{
    return t == SPB_NCCL_BF16 ? ncclBfloat16 : t == SPB_NCCL_F16 ? ncclFloat16 : ncclFloat32;
}
static size_t type_bytes(spb_nccl_dtype t) { return t == SPB_NCCL_F32 ? 4 : 2; }

extern "C" spb_nccl_comm *spb_nccl_create(MPI_Comm group)
{
    spb_nccl_comm *c = new spb_nccl_comm();
    SPB_MPI_CALL(MPI_Comm_rank(group, &c->rank));
    SPB_MPI_CALL(MPI_Comm_size(group, &c->size));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0) SPB_NCCL_CHECK(ncclGetUniqueId(&id));
    SPB_MPI_CALL(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, group));
    SPB_NCCL_CHECK(ncclCommInitRank(&c->comm, c->size, id, c->rank));
    /* Non-blocking: no implicit synchronisation with the legacy default
     * stream, so a transfer can overlap the compute queued there (with a
     * blocking stream every kernel on stream 0 would wait for it).  Hence
     * every dependency is explicit: `after` below and spb_nccl_join. */
    SPB_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    SPB_CUDA_CHECK(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming));
    SPB_CUDA_CHECK(cudaEventCreateWithFlags(&c->joined, cudaEventDisableTiming));
    return c;
}

extern "C" void spb_nccl_destroy(spb_nccl_comm *c)
{
    if (!c) return;
    spb_nccl_sync(c);
    for (cudaEvent_t e : c->spare) SPB_CUDA_CHECK(cudaEventDestroy(e));
    SPB_CUDA_CHECK(cudaEventDestroy(c->ready));
    SPB_CUDA_CHECK(cudaEventDestroy(c->joined));
    if (c->scratch) SPB_CUDA_CHECK(cudaFree(c->scratch));
    SPB_CUDA_CHECK(cudaStreamDestroy(c->stream));
    SPB_NCCL_CHECK(ncclCommDestroy(c->comm));
    delete c;
}

extern "C" int spb_nccl_rank(const spb_nccl_comm *c) { return c->rank; }
extern "C" int spb_nccl_size(const spb_nccl_comm *c) { return c->size; }
extern "C" cudaStream_t spb_nccl_stream(const spb_nccl_comm *c) { return c->stream; }

extern "C" void spb_nccl_set_time_sink(spb_nccl_comm *c, spb_nccl_time_sink sink, void *ctx)
{
    c->sink = sink;
    c->sink_ctx = ctx;
}

static cudaEvent_t timing_event(spb_nccl_comm *c)
{
    cudaEvent_t e;
    if (!c->spare.empty()) {
        e = c->spare.back();
        c->spare.pop_back();
    } else {
        SPB_CUDA_CHECK(cudaEventCreate(&e));
    }
    return e;
}

/* 1 when the event has been reached, 0 when not yet. */
static int event_done(cudaEvent_t e)
{
    cudaError_t rc = cudaEventQuery(e);
    if (rc == cudaSuccess) return 1;
    /* a failure here is sticky: often a kernel or copy queued earlier, not NCCL */
    if (rc != cudaErrorNotReady)
        SPB_DIE("CUDA error seen while polling a collective's completion (cudaEventQuery; the failing work may be "
                "any kernel or copy queued before it): %s", cudaGetErrorString(rc));
    /* "Not ready" is no error; should the runtime have kept it as the last
     * error, clear it, so that the next launch check does not see it. */
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    return 0;
}

/* Read the times of the leading finished calls (all of them after a wait). */
static void read_times(spb_nccl_comm *c, int all_done)
{
    while (!c->pend.empty() && (all_done || event_done(c->pend.front().stop))) {
        pending p = c->pend.front();
        c->pend.pop_front();
        float ms = 0.0f;
        SPB_CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
        double s = ms * 1e-3;
        c->spare.push_back(p.start);
        c->spare.push_back(p.stop);
        if (c->sink) c->sink(c->sink_ctx, p.op, p.tag, s);
    }
}

/* Start of a timed call: wait for the producer, record the start event.
 * The finished calls' times are read first, so the pending list (and the
 * event pool) stay as long as the calls in flight, without a wait. */
static pending begin(spb_nccl_comm *c, spb_nccl_op op, cudaStream_t after, long tag)
{
    read_times(c, 0);
    if (after) {
        SPB_CUDA_CHECK(cudaEventRecord(c->ready, after));
        SPB_CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->ready, 0));
    }
    pending p;
    p.start = timing_event(c);
    p.stop = timing_event(c);
    p.op = op;
    p.tag = tag;
    /* Recorded after the wait: the time starts when the inputs are ready.
     * The kernel timeline's interval (cuda_trace.h) starts there too. */
    SPB_KT_BEGIN_COMM(c->stream);
    SPB_CUDA_CHECK(cudaEventRecord(p.start, c->stream));
    return p;
}

static void end(spb_nccl_comm *c, const pending &p)
{
    SPB_CUDA_CHECK(cudaEventRecord(p.stop, c->stream));
    SPB_KT_END();
    c->pend.push_back(p);
}

extern "C" void spb_nccl_alltoall(spb_nccl_comm *c, const void *send, void *recv, size_t count, spb_nccl_dtype t,
                                  cudaStream_t after, long tag)
{
    size_t eb = type_bytes(t);
    pending p = begin(c, SPB_NCCL_ALLTOALL, after, tag);
    SPB_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        SPB_NCCL_CHECK(ncclSend((const char *)send + r * count * eb, count, nccl_type(t), r, c->comm, c->stream));
        SPB_NCCL_CHECK(ncclRecv((char *)recv + r * count * eb, count, nccl_type(t), r, c->comm, c->stream));
    }
    SPB_NCCL_CHECK(ncclGroupEnd());
    end(c, p);
}

extern "C" void spb_nccl_allgather(spb_nccl_comm *c, const void *send, void *recv, size_t count, spb_nccl_dtype t,
                                   cudaStream_t after, long tag)
{
    pending p = begin(c, SPB_NCCL_ALLGATHER, after, tag);
    SPB_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(t), c->comm, c->stream));
    end(c, p);
}

extern "C" void spb_nccl_reduce_scatter(spb_nccl_comm *c, const void *send, void *recv, size_t recv_count,
                                        spb_nccl_dtype t, cudaStream_t after, long tag)
{
    pending p = begin(c, SPB_NCCL_REDUCE_SCATTER, after, tag);
    SPB_NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type(t), ncclSum, c->comm, c->stream));
    end(c, p);
}

extern "C" void spb_nccl_allreduce(spb_nccl_comm *c, void *buf, size_t count, spb_nccl_dtype t, cudaStream_t after,
                                   long tag)
{
    pending p = begin(c, SPB_NCCL_ALLREDUCE, after, tag);
    SPB_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, c->comm, c->stream));
    end(c, p);
}

extern "C" void spb_nccl_sendrecv(spb_nccl_comm *c, const void *send, int dst, void *recv, int src, size_t count,
                                  size_t recv_count, spb_nccl_dtype t, cudaStream_t after, long tag)
{
    pending p = begin(c, SPB_NCCL_SENDRECV, after, tag);
    SPB_NCCL_CHECK(ncclGroupStart());
    SPB_NCCL_CHECK(ncclSend(send, count, nccl_type(t), dst, c->comm, c->stream));
    SPB_NCCL_CHECK(ncclRecv(recv, recv_count, nccl_type(t), src, c->comm, c->stream));
    SPB_NCCL_CHECK(ncclGroupEnd());
    end(c, p);
}

/* ---- per-rank counts (uneven shares) ---- */

static size_t count_of(long n)
{
    if (n < 0) SPB_DIE("collective block of %ld elements", n);
    return (size_t)n;
}

static const char *at(const void *p, long elements, size_t eb) { return (const char *)p + (size_t)elements * eb; }

extern "C" void spb_nccl_alltoallv(spb_nccl_comm *c, const void *send, const long *send_counts, const long *send_displs,
                                   void *recv, const long *recv_counts, const long *recv_displs, spb_nccl_dtype t,
                                   cudaStream_t after, long tag)
{
    size_t eb = type_bytes(t);
    pending p = begin(c, SPB_NCCL_ALLTOALL, after, tag);
    SPB_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        SPB_NCCL_CHECK(ncclSend(at(send, send_displs[r], eb), count_of(send_counts[r]), nccl_type(t), r, c->comm,
                                c->stream));
        SPB_NCCL_CHECK(ncclRecv((void *)at(recv, recv_displs[r], eb), count_of(recv_counts[r]), nccl_type(t), r,
                                c->comm, c->stream));
    }
    SPB_NCCL_CHECK(ncclGroupEnd());
    end(c, p);
}

extern "C" void spb_nccl_allgatherv(spb_nccl_comm *c, const void *send, void *recv, const long *counts,
                                    const long *displs, spb_nccl_dtype t, cudaStream_t after, long tag)
{
    size_t eb = type_bytes(t);
    pending p = begin(c, SPB_NCCL_ALLGATHER, after, tag);
    SPB_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        SPB_NCCL_CHECK(ncclSend(send, count_of(counts[c->rank]), nccl_type(t), r, c->comm, c->stream));
        SPB_NCCL_CHECK(ncclRecv((void *)at(recv, displs[r], eb), count_of(counts[r]), nccl_type(t), r, c->comm,
                                c->stream));
    }
    SPB_NCCL_CHECK(ncclGroupEnd());
    end(c, p);
}

/* Element i of the stored type t, widened; and stored back, rounded to
 * nearest even by common/bf16's own functions (the host path's rounding). */
static __device__ __forceinline__ float load_elem(const void *p, long i, int t)
{
    return t == SPB_NCCL_F32 ? ((const float *)p)[i]
           : t == SPB_NCCL_BF16 ? spb_bf16_to_float(((const spb_bf16 *)p)[i])
                                : spb_fp16_to_float(((const spb_fp16 *)p)[i]);
}

static __device__ __forceinline__ void store_elem(void *p, long i, int t, float v)
{
    if (t == SPB_NCCL_F32)
        ((float *)p)[i] = v;
    else if (t == SPB_NCCL_BF16)
        ((spb_bf16 *)p)[i] = spb_bf16_from_float(v);
    else
        ((spb_fp16 *)p)[i] = spb_fp16_from_float(v);
}

/* out[i] = the n parts' element i added in rank order in fp32, rounded once. */
__global__ void k_sum_parts(void *out, const void *parts, int n, long count, int t)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (long)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (int r = 0; r < n; r++) sum += load_elem(parts, (long)r * count + i, t);
        store_elem(out, i, t, sum);
    }
}

/* The scratch grown to `bytes`; growing waits for the comm stream, the
 * scratch's only user, so nothing in flight reads the old one. */
static void *scratch_of(spb_nccl_comm *c, size_t bytes)
{
    if (bytes > c->scratch_bytes) {
        if (c->scratch) {
            SPB_CUDA_HOST_WAIT(cudaStreamSynchronize(c->stream));
            SPB_CUDA_CHECK(cudaFree(c->scratch));
        }
        c->scratch = nullptr;
        SPB_CUDA_CHECK(cudaMalloc(&c->scratch, bytes));
        c->scratch_bytes = bytes;
    }
    return c->scratch;
}

extern "C" void spb_nccl_reduce_scatterv(spb_nccl_comm *c, const void *send, const long *counts, const long *displs,
                                         void *recv, spb_nccl_dtype t, cudaStream_t after, long tag)
{
    size_t eb = type_bytes(t), mine = count_of(counts[c->rank]);
    void *parts = scratch_of(c, eb * mine * (size_t)c->size + 1);
    pending p = begin(c, SPB_NCCL_REDUCE_SCATTER, after, tag);
    SPB_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        SPB_NCCL_CHECK(ncclSend(at(send, displs[r], eb), count_of(counts[r]), nccl_type(t), r, c->comm, c->stream));
        SPB_NCCL_CHECK(ncclRecv((void *)at(parts, (long)(mine * (size_t)r), eb), mine, nccl_type(t), r, c->comm,
                                c->stream));
    }
    SPB_NCCL_CHECK(ncclGroupEnd());
    if (mine) { /* inside the call's interval of the kernel timeline: no interval of its own */
        const int threads = 256;
        k_sum_parts<<<spb_grid_stride_blocks((long)mine, threads), threads, 0, c->stream>>>(recv, parts, c->size,
                                                                                          (long)mine, (int)t);
        SPB_CUDA_CHECK(cudaGetLastError());
    }
    end(c, p);
}

extern "C" void spb_nccl_join(spb_nccl_comm *c, cudaStream_t stream)
{
    SPB_CUDA_CHECK(cudaEventRecord(c->joined, c->stream));
    SPB_CUDA_CHECK(cudaStreamWaitEvent(stream, c->joined, 0));
}

/* Waits for the communicator's stream, asking NCCL for an asynchronous
 * error meanwhile: a peer that died or a broken network ends the job with
 * NCCL's reason, where cudaStreamSynchronize would wait for ever. */
static void wait_stream(spb_nccl_comm *c)
{
    spb_cuda_host_waits++; /* a host wait (cuda_trace.h), though a polling one */
    for (;;) {
        cudaError_t rc = cudaStreamQuery(c->stream);
        if (rc == cudaSuccess) return;
        if (rc != cudaErrorNotReady) SPB_DIE("CUDA call failed: cudaStreamQuery(NCCL stream): %s", cudaGetErrorString(rc));
        if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
        ncclResult_t async = ncclSuccess;
        SPB_NCCL_CHECK(ncclCommGetAsyncError(c->comm, &async));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
        if (async == ncclInProgress) async = ncclSuccess; /* a non-blocking communicator still initialising */
#endif
        if (async != ncclSuccess) {
            ncclCommAbort(c->comm);
            SPB_DIE("NCCL: asynchronous error on a communicator (rank %d of %d): %s", c->rank, c->size,
                    ncclGetErrorString(async));
        }
        usleep(50);
    }
}

extern "C" void spb_nccl_sync(spb_nccl_comm *c)
{
    wait_stream(c);
    read_times(c, 1);
}

extern "C" const char *spb_nccl_op_name(spb_nccl_op op)
{
    static const char *names[] = {"alltoall", "allgather", "reduce_scatter", "allreduce", "sendrecv"};
    return op >= 0 && op < SPB_NCCL_NUM_OPS ? names[op] : "?";
}
