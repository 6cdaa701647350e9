/* comm.h's device-collective table on the NCCL layer (nccl_comm.h:
 * spb_nccl_device_ops).
 *
 * Streams.  The fp32 CUDA table (cuda_backend.cu) computes on the legacy
 * default stream: kernels launched without a stream, cuBLAS on its default
 * NULL stream, cudaMemcpy/cudaMemset (the build has no --default-stream
 * per-thread).  Each NCCL communicator has its own non-blocking stream,
 * which the legacy stream does not synchronise with implicitly; so both
 * directions are explicit:
 *   - before a collective, its stream waits for the compute queued so far
 *     (`after`): its inputs are written, and the buffers it overwrites are
 *     no longer read by earlier kernels;
 *   - after it, the compute stream waits for it (spb_nccl_join): later
 *     kernels, and the synchronous cudaMemcpy that bring results to the
 *     host, see its output, and nothing overwrites its inputs while it
 *     reads them.  The host never waits here.
 * The ring's sendrecv and the overlapped Ulysses all-to-all defer the
 * second step to the wait: the compute queued between start and wait runs
 * beside the transfer.  While a
 * transfer is in flight the strategies issue no other collective; should
 * one come on another communicator all the same, its stream first waits
 * for the transfers in flight (serialised below), so at most one
 * communicator's operation runs at a time besides compute (NCCL can
 * deadlock on concurrent operations of different communicators). */
#define OMPI_SKIP_MPICXX 1 /* mpi.h: the C API only */
#define MPICH_SKIP_MPICXX 1
#include <cuda_runtime.h>

#include <vector>

/* Stream 0 below and in every compute kernel is the legacy stream; with
 * per-thread default streams it would not be, and the waits here would
 * order nothing. */
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "the NCCL table assumes the legacy default stream (no --default-stream per-thread)"
#endif

#include "cuda_trace.h"
#include "nccl_check.h"
#include "nccl_comm.h"

namespace {

/* The fp32 table's compute stream.  Named cudaStreamLegacy, not 0: the
 * NCCL layer reads `after` = 0 as "no producer". */
const cudaStream_t kCompute = cudaStreamLegacy;

/* One NCCL communicator per MPI communicator, keyed by its handle, in
 * creation order.  (Only calls that every MPI here has, the built-in shm
 * MPI included: no attribute caching.)  A handle stays valid until its MPI
 * communicator is freed, which spb_comm_forget must precede (it destroys
 * ours); a handle freed without it and reused for another group would find
 * a stale entry: caught below when the rank or size differs. */
struct cached {
    MPI_Comm mpi;
    spb_nccl_comm *nccl;
};
std::vector<cached> live;
std::vector<cudaEvent_t> spare_transfers; /* sendrecv completion events to reuse */
struct in_flight {
    spb_nccl_comm *comm;
    cudaEvent_t done;
};
std::vector<in_flight> transfers; /* started, not yet waited */

/* Before an operation on c: its stream waits for the transfers in flight on
 * other communicators, so that no two communicators' NCCL kernels run at once. */
void after_transfers(spb_nccl_comm *c)
{
    for (const in_flight &t : transfers)
        if (t.comm != c) SPB_CUDA_CHECK(cudaStreamWaitEvent(spb_nccl_stream(c), t.done, 0));
}

void time_to_comm(void *, spb_nccl_op, long ticket, double seconds) { spb_comm_device_time(ticket, seconds); }

/* The NCCL communicator of `mpi`, created at the first collective on it:
 * every member reaches that collective, so creation (MPI_Bcast of the id,
 * ncclCommInitRank) is collective-safe. */
spb_nccl_comm *nccl_for(MPI_Comm mpi)
{
    int rank = 0, size = 0;
    SPB_MPI_CALL(MPI_Comm_rank(mpi, &rank));
    SPB_MPI_CALL(MPI_Comm_size(mpi, &size));
    for (const cached &e : live)
        if (e.mpi == mpi) {
            if (spb_nccl_rank(e.nccl) != rank || spb_nccl_size(e.nccl) != size)
                SPB_DIE("an MPI communicator was freed without spb_comm_forget and its handle reused (rank %d of %d, "
                        "its NCCL communicator's %d of %d)",
                        rank, size, spb_nccl_rank(e.nccl), spb_nccl_size(e.nccl));
            return e.nccl;
        }
    spb_nccl_comm *c = spb_nccl_create(mpi);
    spb_nccl_set_time_sink(c, time_to_comm, nullptr);
    live.push_back({mpi, c});
    return c;
}

/* Destroys the NCCL communicator of `mpi`, if any; its pending times go to
 * comm.c first (spb_nccl_destroy syncs).  Collective over mpi. */
void forget(MPI_Comm mpi)
{
    for (size_t i = 0; i < live.size(); i++)
        if (live[i].mpi == mpi) {
            spb_nccl_comm *c = live[i].nccl;
            for (const in_flight &t : transfers)
                if (t.comm == c) SPB_DIE("a communicator freed with a send/receive in flight (never waited)");
            live.erase(live.begin() + (long)i);
            spb_nccl_destroy(c);
            return;
        }
}

size_t elems(long n)
{
    if (n < 0) SPB_DIE("collective of %ld floats", n);
    return (size_t)n;
}

/* comm.h's element types are NCCL's, in the same order. */
spb_nccl_dtype nccl_dtype(spb_comm_dtype t)
{
    return t == SPB_COMM_BF16 ? SPB_NCCL_BF16 : t == SPB_COMM_F16 ? SPB_NCCL_F16 : SPB_NCCL_F32;
}

void allreduce_sum(void *buf, long n, spb_comm_dtype t, MPI_Comm comm, long ticket)
{
    spb_nccl_comm *c = nccl_for(comm);
    after_transfers(c);
    spb_nccl_allreduce(c, buf, elems(n), nccl_dtype(t), kCompute, ticket);
    spb_nccl_join(c, kCompute);
}

void alltoall(const void *send, void *recv, long count, spb_comm_dtype t, MPI_Comm comm, long ticket)
{
    spb_nccl_comm *c = nccl_for(comm);
    after_transfers(c);
    spb_nccl_alltoall(c, send, recv, elems(count), nccl_dtype(t), kCompute, ticket);
    spb_nccl_join(c, kCompute);
}

void allgather(const void *send, void *recv, long count, spb_comm_dtype t, MPI_Comm comm, long ticket)
{
    spb_nccl_comm *c = nccl_for(comm);
    after_transfers(c);
    spb_nccl_allgather(c, send, recv, elems(count), nccl_dtype(t), kCompute, ticket);
    spb_nccl_join(c, kCompute);
}

void reduce_scatter(const void *send, void *recv, long count, spb_comm_dtype t, MPI_Comm comm, long ticket)
{
    spb_nccl_comm *c = nccl_for(comm);
    after_transfers(c);
    spb_nccl_reduce_scatter(c, send, recv, elems(count), nccl_dtype(t), kCompute, ticket);
    spb_nccl_join(c, kCompute);
}

/* Per-rank counts (uneven shares): blocking, as the even collectives. */
void alltoallv(const void *send, const long *send_counts, const long *send_displs, void *recv, const long *recv_counts,
               const long *recv_displs, spb_comm_dtype t, MPI_Comm comm, long ticket)
{
    spb_nccl_comm *c = nccl_for(comm);
    after_transfers(c);
    spb_nccl_alltoallv(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, nccl_dtype(t), kCompute,
                       ticket);
    spb_nccl_join(c, kCompute);
}

void allgatherv(const void *send, void *recv, const long *counts, const long *displs, spb_comm_dtype t, MPI_Comm comm,
                long ticket)
{
    spb_nccl_comm *c = nccl_for(comm);
    after_transfers(c);
    spb_nccl_allgatherv(c, send, recv, counts, displs, nccl_dtype(t), kCompute, ticket);
    spb_nccl_join(c, kCompute);
}

void reduce_scatterv(const void *send, const long *counts, const long *displs, void *recv, spb_comm_dtype t,
                     MPI_Comm comm, long ticket)
{
    spb_nccl_comm *c = nccl_for(comm);
    after_transfers(c);
    spb_nccl_reduce_scatterv(c, send, counts, displs, recv, nccl_dtype(t), kCompute, ticket);
    spb_nccl_join(c, kCompute);
}

/* A transfer issued on c's stream, not yet joined: its completion event,
 * which sendrecv_wait makes the compute stream wait for. */
void *in_flight_on(spb_nccl_comm *c)
{
    cudaEvent_t done;
    if (!spare_transfers.empty()) {
        done = spare_transfers.back();
        spare_transfers.pop_back();
    } else {
        SPB_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    }
    SPB_CUDA_CHECK(cudaEventRecord(done, spb_nccl_stream(c)));
    transfers.push_back({c, done});
    return (void *)done;
}

void *sendrecv_start(const void *send, int dest, void *recv, int src, long count, long recv_count, spb_comm_dtype t,
                     MPI_Comm comm, long ticket)
{
    spb_nccl_comm *c = nccl_for(comm);
    after_transfers(c);
    spb_nccl_sendrecv(c, send, dest, recv, src, elems(count), elems(recv_count), nccl_dtype(t), kCompute, ticket);
    return in_flight_on(c);
}

/* Ulysses' overlapped groups: group k+1's all-to-all on the comm stream
 * (after the packing queued on the compute stream) while group k's
 * attention runs on the compute stream; waited as a sendrecv. */
void *alltoall_start(const void *send, void *recv, long count, spb_comm_dtype t, MPI_Comm comm, long ticket)
{
    spb_nccl_comm *c = nccl_for(comm);
    after_transfers(c);
    spb_nccl_alltoall(c, send, recv, elems(count), nccl_dtype(t), kCompute, ticket);
    return in_flight_on(c);
}

void sendrecv_wait(void *transfer)
{
    cudaEvent_t done = (cudaEvent_t)transfer;
    SPB_CUDA_CHECK(cudaStreamWaitEvent(kCompute, done, 0));
    for (size_t i = 0; i < transfers.size(); i++)
        if (transfers[i].done == done) {
            transfers.erase(transfers.begin() + (long)i);
            break;
        }
    spare_transfers.push_back(done); /* reusable at once: the wait took its state now */
}

/* At the step boundary (and around the all-to-all replay): every
 * communicator's calls finished and timed (waits that poll NCCL for a dead
 * peer), then the compute queued after them, so that a barrier after the
 * flush starts the ranks together (a replayed call's time would otherwise
 * include its peers' unfinished compute). */
void flush_times(void)
{
    for (const cached &e : live) spb_nccl_sync(e.nccl); /* each a host wait (nccl_comm.cu counts it) */
    SPB_CUDA_HOST_WAIT(cudaDeviceSynchronize());
}

/* Replay buffers: plain cudaMalloc, outside the memory categories (they
 * are no part of the model's memory). */
float *scratch_alloc(long n)
{
    float *p = nullptr;
    SPB_CUDA_CHECK(cudaMalloc((void **)&p, sizeof(float) * elems(n)));
    SPB_CUDA_CHECK(cudaMemset(p, 0, sizeof(float) * elems(n)));
    return p;
}

void scratch_free(float *p) { SPB_CUDA_CHECK(cudaFree(p)); }

spb_comm_device_ops make_ops(void)
{
    spb_comm_device_ops t = {};
    t.name = "nccl";
    t.allreduce_sum = allreduce_sum;
    t.alltoall = alltoall;
    t.allgather = allgather;
    t.reduce_scatter = reduce_scatter;
    t.sendrecv_start = sendrecv_start;
    t.sendrecv_wait = sendrecv_wait;
    t.alltoall_start = alltoall_start;
    t.alltoallv = alltoallv;
    t.allgatherv = allgatherv;
    t.reduce_scatterv = reduce_scatterv;
    t.flush_times = flush_times;
    t.forget = forget;
    t.scratch_alloc = scratch_alloc;
    t.scratch_free = scratch_free;
    return t;
}

const spb_comm_device_ops ops = make_ops();

} // namespace

extern "C" const spb_comm_device_ops *spb_nccl_device_ops(void) { return &ops; }

extern "C" void spb_nccl_device_ops_shutdown(void)
{
    /* In creation order, the same on every rank (NCCL finalises each
     * communicator with its peers). */
    while (!live.empty()) forget(live.front().mpi);
    for (cudaEvent_t e : spare_transfers) SPB_CUDA_CHECK(cudaEventDestroy(e));
    spare_transfers.clear();
}
