/* NCCL communication for one process group (an SP group, a DP group, ...):
 * the communicator is bootstrapped over MPI (ncclGetUniqueId on group rank 0,
 * MPI_Bcast over the group), collectives run on a dedicated non-blocking
 * stream, each call is timed with a pair of CUDA events on it, and the
 * times are read back without blocking as calls finish (at each new call)
 * or by waiting (spb_nccl_sync), per call to a time sink with the caller's
 * tag.
 * Buffers are device pointers; counts are elements (per peer for the
 * all-to-all, per rank for allgather/reduce-scatter).  NCCL wants one GPU
 * per rank of a group: ranks sharing a GPU fail at creation. */
#ifndef SPB_NCCL_COMM_H
#define SPB_NCCL_COMM_H

#include <mpi.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum spb_nccl_dtype { SPB_NCCL_F32 = 0, SPB_NCCL_BF16 = 1, SPB_NCCL_F16 = 2 } spb_nccl_dtype;

typedef enum spb_nccl_op {
    SPB_NCCL_ALLTOALL = 0,
    SPB_NCCL_ALLGATHER,
    SPB_NCCL_REDUCE_SCATTER,
    SPB_NCCL_ALLREDUCE,
    SPB_NCCL_SENDRECV,
    SPB_NCCL_NUM_OPS
} spb_nccl_op;

typedef struct spb_nccl_comm spb_nccl_comm;

/* Collective over `group`; uses the calling rank's current CUDA device. */
spb_nccl_comm *spb_nccl_create(MPI_Comm group);
/* Waits for the comm stream and reads the pending times first.  Collective
 * over the group (NCCL finalises the communicator with its peers); destroy
 * communicators in the same order on every rank. */
void spb_nccl_destroy(spb_nccl_comm *c);
int spb_nccl_rank(const spb_nccl_comm *c);
int spb_nccl_size(const spb_nccl_comm *c);
/* The dedicated stream every collective runs on. */
cudaStream_t spb_nccl_stream(const spb_nccl_comm *c);

/* Each call's time, once, as it is read: ctx as set, the operation, the
 * caller's tag, the seconds between the call's events on the comm stream
 * (from when its inputs were ready, including waiting for its peers). */
typedef void (*spb_nccl_time_sink)(void *ctx, spb_nccl_op op, long tag, double seconds);
void spb_nccl_set_time_sink(spb_nccl_comm *c, spb_nccl_time_sink sink, void *ctx);

/* Each call first makes the communication stream wait for the work queued
 * so far on `after` (the producer's stream; 0 for none: pass
 * cudaStreamLegacy, not 0, for the legacy default stream), then issues the
 * collective and returns (asynchronous).  `tag` names the call to the time
 * sink (any value when there is none). */
void spb_nccl_alltoall(spb_nccl_comm *c, const void *send, void *recv, size_t count_per_peer, spb_nccl_dtype t,
                       cudaStream_t after, long tag);
void spb_nccl_allgather(spb_nccl_comm *c, const void *send, void *recv, size_t count, spb_nccl_dtype t,
                        cudaStream_t after, long tag);
void spb_nccl_reduce_scatter(spb_nccl_comm *c, const void *send, void *recv, size_t recv_count, spb_nccl_dtype t,
                             cudaStream_t after, long tag);
/* in-place sum */
void spb_nccl_allreduce(spb_nccl_comm *c, void *buf, size_t count, spb_nccl_dtype t, cudaStream_t after, long tag);
/* send count elements to group rank `dst` and receive recv_count from
 * `src` (ring attention's rotation; the counts differ under uneven shares) */
void spb_nccl_sendrecv(spb_nccl_comm *c, const void *send, int dst, void *recv, int src, size_t count,
                       size_t recv_count, spb_nccl_dtype t, cudaStream_t after, long tag);
/* Per-rank counts (uneven shares), in elements; grouped send/receive
 * pairs, this rank's own block included.  alltoallv: send_counts[j] from
 * send + send_displs[j] to rank j, recv_counts[i] from rank i at recv +
 * recv_displs[i].  allgatherv: this rank's counts[rank] elements to every
 * rank, rank i's at recv + displs[i].  reduce_scatterv: block j (counts[j]
 * at displs[j]) to rank j, then this rank's n received blocks added in
 * rank order in fp32 and rounded once into recv (counts[rank] elements):
 * the same bits as comm.c's host path, which NCCL's own reductions (in the
 * element type, in an order of their own) would not give.  The received
 * blocks wait in a scratch buffer of the communicator's, grown on demand
 * (growing waits for its stream) and outside the memory categories, as
 * NCCL's own buffers are.  Counted as SPB_NCCL_ALLTOALL, ALLGATHER and
 * REDUCE_SCATTER. */
void spb_nccl_alltoallv(spb_nccl_comm *c, const void *send, const long *send_counts, const long *send_displs,
                        void *recv, const long *recv_counts, const long *recv_displs, spb_nccl_dtype t,
                        cudaStream_t after, long tag);
void spb_nccl_allgatherv(spb_nccl_comm *c, const void *send, void *recv, const long *counts, const long *displs,
                         spb_nccl_dtype t, cudaStream_t after, long tag);
void spb_nccl_reduce_scatterv(spb_nccl_comm *c, const void *send, const long *counts, const long *displs, void *recv,
                              spb_nccl_dtype t, cudaStream_t after, long tag);

/* Make `stream` wait for everything issued so far on the comm stream
 * (cudaStreamLegacy for the legacy default stream). */
void spb_nccl_join(spb_nccl_comm *c, cudaStream_t stream);
/* Wait for the comm stream, then read every pending time into the sink (the
 * calls finished earlier are read at each new call, without blocking). */
void spb_nccl_sync(spb_nccl_comm *c);
const char *spb_nccl_op_name(spb_nccl_op op);

/* comm.h's device-collective table on NCCL (nccl_device_comm.cu): one
 * NCCL communicator per MPI communicator it is handed, created at the
 * first collective on it (every member reaches that together) and
 * destroyed by spb_comm_forget, which must precede freeing the MPI
 * communicator; fp32 buffers; ordered after, and joined back into, the
 * legacy default stream that the fp32 CUDA table (cuda_backend.cu)
 * computes on.  Use: after choosing the device,
 * spb_comm_set_device_ops(spb_nccl_device_ops()); one GPU per rank. */
const spb_comm_device_ops *spb_nccl_device_ops(void);
/* Folds pending times and destroys every communicator it still holds, in
 * creation order; collective (every rank calls it, before MPI_Finalize). */
void spb_nccl_device_ops_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif
