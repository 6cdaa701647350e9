/* NCCL communication for one process group (an SP group, a DP group, ...):
 * the communicator is bootstrapped over MPI (ncclGetUniqueId on group rank 0,
 * MPI_Bcast over the group), collectives run on a dedicated stream, each
 * call is timed with a pair of CUDA events, and the times are gathered per
 * operation when the caller synchronises (spb_nccl_sync).
 * Buffers are device pointers; counts are elements (per peer for the
 * all-to-all, per rank for allgather/reduce-scatter). */
#ifndef SPB_NCCL_COMM_H
#define SPB_NCCL_COMM_H

#include <mpi.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum spb_nccl_dtype { SPB_NCCL_F32 = 0, SPB_NCCL_BF16 = 1 } spb_nccl_dtype;

typedef enum spb_nccl_op {
    SPB_NCCL_ALLTOALL = 0,
    SPB_NCCL_ALLGATHER,
    SPB_NCCL_REDUCE_SCATTER,
    SPB_NCCL_ALLREDUCE,
    SPB_NCCL_SENDRECV,
    SPB_NCCL_NUM_OPS
} spb_nccl_op;

typedef struct spb_nccl_stats {
    long calls;
    double bytes;   /* payload: what this rank sends (all-to-all: all blocks but its own) */
    double seconds; /* CUDA-event time on the communication stream */
} spb_nccl_stats;

typedef struct spb_nccl_comm spb_nccl_comm;

/* Collective over `group`; uses the calling rank's current CUDA device. */
spb_nccl_comm *spb_nccl_create(MPI_Comm group);
void spb_nccl_destroy(spb_nccl_comm *c);
int spb_nccl_rank(const spb_nccl_comm *c);
int spb_nccl_size(const spb_nccl_comm *c);
/* The dedicated stream every collective runs on. */
cudaStream_t spb_nccl_stream(const spb_nccl_comm *c);

/* Each call first makes the communication stream wait for `after` (the
 * producer's stream; 0 for none).  Returns immediately (asynchronous). */
void spb_nccl_alltoall(spb_nccl_comm *c, const void *send, void *recv, size_t count_per_peer, spb_nccl_dtype t,
                       cudaStream_t after);
void spb_nccl_allgather(spb_nccl_comm *c, const void *send, void *recv, size_t count, spb_nccl_dtype t,
                        cudaStream_t after);
void spb_nccl_reduce_scatter(spb_nccl_comm *c, const void *send, void *recv, size_t recv_count, spb_nccl_dtype t,
                             cudaStream_t after);
void spb_nccl_allreduce(spb_nccl_comm *c, void *buf, size_t count, spb_nccl_dtype t, cudaStream_t after);
/* send to group rank `dst` and receive from `src` (ring attention's rotation) */
void spb_nccl_sendrecv(spb_nccl_comm *c, const void *send, int dst, void *recv, int src, size_t count,
                       spb_nccl_dtype t, cudaStream_t after);

/* Make `stream` wait for everything issued so far on the comm stream. */
void spb_nccl_join(spb_nccl_comm *c, cudaStream_t stream);
/* Wait for the comm stream and fold the pending event times into the stats. */
void spb_nccl_sync(spb_nccl_comm *c);
const spb_nccl_stats *spb_nccl_get_stats(spb_nccl_comm *c, spb_nccl_op op); /* syncs first */
const char *spb_nccl_op_name(spb_nccl_op op);

#ifdef __cplusplus
}
#endif

#endif
