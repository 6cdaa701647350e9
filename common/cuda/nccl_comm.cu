/* NCCL communication layer (nccl_comm.h). */
#include <nccl.h>
#include <string.h>

#include "cuda_check.h"
#include "nccl_comm.h"

#define SPB_NCCL_CHECK(call)                                                                                           \
    do {                                                                                                               \
        ncclResult_t r_ = (call);                                                                                      \
        if (r_ != ncclSuccess) SPB_DIE("NCCL call failed: %s: %s", #call, ncclGetErrorString(r_));                     \
    } while (0)
#define SPB_MPI_CALL(call)                                                                                             \
    do {                                                                                                               \
        if ((call) != MPI_SUCCESS) SPB_DIE("MPI call failed: %s", #call);                                              \
    } while (0)

#define PENDING_MAX 256

namespace {
struct pending {
    cudaEvent_t start, stop;
    spb_nccl_op op;
};
} // namespace

struct spb_nccl_comm {
    ncclComm_t comm;
    int rank, size;
    cudaStream_t stream;
    pending pend[PENDING_MAX];
    int npend;
    spb_nccl_stats stats[SPB_NCCL_NUM_OPS];
};

static ncclDataType_t nccl_type(spb_nccl_dtype t) { return t == SPB_NCCL_BF16 ? ncclBfloat16 : ncclFloat32; }
static size_t type_bytes(spb_nccl_dtype t) { return t == SPB_NCCL_BF16 ? 2 : 4; }

extern "C" spb_nccl_comm *spb_nccl_create(MPI_Comm group)
{
    spb_nccl_comm *c = new spb_nccl_comm();
    SPB_MPI_CALL(MPI_Comm_rank(group, &c->rank));
    SPB_MPI_CALL(MPI_Comm_size(group, &c->size));
    ncclUniqueId id;
    if (c->rank == 0) SPB_NCCL_CHECK(ncclGetUniqueId(&id));
    SPB_MPI_CALL(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, group));
    SPB_NCCL_CHECK(ncclCommInitRank(&c->comm, c->size, id, c->rank));
    SPB_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    for (int i = 0; i < PENDING_MAX; i++) {
        SPB_CUDA_CHECK(cudaEventCreate(&c->pend[i].start));
        SPB_CUDA_CHECK(cudaEventCreate(&c->pend[i].stop));
    }
    return c;
}

extern "C" void spb_nccl_destroy(spb_nccl_comm *c)
{
    if (!c) return;
    spb_nccl_sync(c);
    for (int i = 0; i < PENDING_MAX; i++) {
        cudaEventDestroy(c->pend[i].start);
        cudaEventDestroy(c->pend[i].stop);
    }
    cudaStreamDestroy(c->stream);
    ncclCommDestroy(c->comm);
    delete c;
}

extern "C" int spb_nccl_rank(const spb_nccl_comm *c) { return c->rank; }
extern "C" int spb_nccl_size(const spb_nccl_comm *c) { return c->size; }
extern "C" cudaStream_t spb_nccl_stream(const spb_nccl_comm *c) { return c->stream; }

/* Start of a timed call: wait for the producer, record the start event. */
static pending *begin(spb_nccl_comm *c, spb_nccl_op op, double bytes, cudaStream_t after)
{
    if (c->npend == PENDING_MAX) spb_nccl_sync(c);
    if (after) {
        cudaEvent_t ready;
        SPB_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
        SPB_CUDA_CHECK(cudaEventRecord(ready, after));
        SPB_CUDA_CHECK(cudaStreamWaitEvent(c->stream, ready, 0));
        SPB_CUDA_CHECK(cudaEventDestroy(ready)); /* released once the wait is satisfied */
    }
    pending *p = &c->pend[c->npend++];
    p->op = op;
    c->stats[op].calls++;
    c->stats[op].bytes += bytes;
    SPB_CUDA_CHECK(cudaEventRecord(p->start, c->stream));
    return p;
}
static void end(spb_nccl_comm *c, pending *p) { SPB_CUDA_CHECK(cudaEventRecord(p->stop, c->stream)); }

extern "C" void spb_nccl_alltoall(spb_nccl_comm *c, const void *send, void *recv, size_t count, spb_nccl_dtype t,
                                  cudaStream_t after)
{
    size_t eb = type_bytes(t);
    pending *p = begin(c, SPB_NCCL_ALLTOALL, (double)count * eb * (c->size - 1), after);
    SPB_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        SPB_NCCL_CHECK(ncclSend((const char *)send + r * count * eb, count, nccl_type(t), r, c->comm, c->stream));
        SPB_NCCL_CHECK(ncclRecv((char *)recv + r * count * eb, count, nccl_type(t), r, c->comm, c->stream));
    }
    SPB_NCCL_CHECK(ncclGroupEnd());
    end(c, p);
}

extern "C" void spb_nccl_allgather(spb_nccl_comm *c, const void *send, void *recv, size_t count, spb_nccl_dtype t,
                                   cudaStream_t after)
{
    pending *p = begin(c, SPB_NCCL_ALLGATHER, (double)count * type_bytes(t), after);
    SPB_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(t), c->comm, c->stream));
    end(c, p);
}

extern "C" void spb_nccl_reduce_scatter(spb_nccl_comm *c, const void *send, void *recv, size_t recv_count,
                                        spb_nccl_dtype t, cudaStream_t after)
{
    pending *p = begin(c, SPB_NCCL_REDUCE_SCATTER, (double)recv_count * c->size * type_bytes(t), after);
    SPB_NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type(t), ncclSum, c->comm, c->stream));
    end(c, p);
}

extern "C" void spb_nccl_allreduce(spb_nccl_comm *c, void *buf, size_t count, spb_nccl_dtype t, cudaStream_t after)
{
    pending *p = begin(c, SPB_NCCL_ALLREDUCE, (double)count * type_bytes(t), after);
    SPB_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, c->comm, c->stream));
    end(c, p);
}

extern "C" void spb_nccl_sendrecv(spb_nccl_comm *c, const void *send, int dst, void *recv, int src, size_t count,
                                  spb_nccl_dtype t, cudaStream_t after)
{
    pending *p = begin(c, SPB_NCCL_SENDRECV, (double)count * type_bytes(t), after);
    SPB_NCCL_CHECK(ncclGroupStart());
    SPB_NCCL_CHECK(ncclSend(send, count, nccl_type(t), dst, c->comm, c->stream));
    SPB_NCCL_CHECK(ncclRecv(recv, count, nccl_type(t), src, c->comm, c->stream));
    SPB_NCCL_CHECK(ncclGroupEnd());
    end(c, p);
}

extern "C" void spb_nccl_join(spb_nccl_comm *c, cudaStream_t stream)
{
    cudaEvent_t done;
    SPB_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    SPB_CUDA_CHECK(cudaEventRecord(done, c->stream));
    SPB_CUDA_CHECK(cudaStreamWaitEvent(stream, done, 0));
    SPB_CUDA_CHECK(cudaEventDestroy(done));
}

extern "C" void spb_nccl_sync(spb_nccl_comm *c)
{
    SPB_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (int i = 0; i < c->npend; i++) {
        float ms = 0.0f;
        SPB_CUDA_CHECK(cudaEventElapsedTime(&ms, c->pend[i].start, c->pend[i].stop));
        c->stats[c->pend[i].op].seconds += ms * 1e-3;
    }
    c->npend = 0;
}

extern "C" const spb_nccl_stats *spb_nccl_get_stats(spb_nccl_comm *c, spb_nccl_op op)
{
    spb_nccl_sync(c);
    return &c->stats[op];
}

extern "C" const char *spb_nccl_op_name(spb_nccl_op op)
{
    static const char *names[] = {"alltoall", "allgather", "reduce_scatter", "allreduce", "sendrecv"};
    return op >= 0 && op < SPB_NCCL_NUM_OPS ? names[op] : "?";
}
