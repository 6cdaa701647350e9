/* The communication accounting layer: every collective of the job goes
 * through here and is recorded by operation and phase (calls, bytes this
 * rank sends on its links under the standard ring/pairwise algorithm, time).
 * Bandwidths follow nccl-tests: algbw = payload / time, busbw = algbw x the
 * operation's bus factor (all-reduce 2(n-1)/n, allgather and reduce-scatter
 * (n-1)/n, all-to-all (n-1)/n). */
#ifndef SPB_COMM_H
#define SPB_COMM_H

#include <mpi.h>
#include <stddef.h>

typedef enum spb_comm_phase {
    SPB_PHASE_FORWARD = 0,
    SPB_PHASE_BACKWARD,
    SPB_PHASE_RECOMPUTE,
    SPB_PHASE_ZERO,
    SPB_PHASE_GRAD_REDUCE,
    SPB_PHASE_OTHER, /* loss and norm reductions, set-up */
    SPB_NUM_PHASES
} spb_comm_phase;

typedef enum spb_comm_op {
    SPB_OP_ALLREDUCE = 0,
    SPB_OP_ALLGATHER,
    SPB_OP_REDUCE_SCATTER,
    SPB_OP_ALLTOALL,
    SPB_OP_SENDRECV,
    SPB_NUM_OPS
} spb_comm_op;

typedef struct spb_comm_record {
    long calls;
    double payload_bytes; /* the buffer size the caller passed (nccl-tests "size") */
    double link_bytes;    /* bytes this rank sends under the standard algorithm */
    double seconds;
} spb_comm_record;

/* Collectives over a group of n ranks.  `count` is the number of floats
 * per rank-block: all-to-all sends count floats to each rank (block j of
 * send goes to rank j, block i of recv comes from rank i); allgather sends
 * count and receives n x count; reduce-scatter sends n x count and receives
 * the sum of block `rank`.  Recorded payload is nccl-tests' "size": the
 * n x count buffer; link bytes = payload x bus factor = what this rank's
 * link carries under the ring / pairwise algorithm. */
void spb_alltoall_f32(const float *send, float *recv, long count, MPI_Comm comm, spb_comm_phase phase);
void spb_allgather_f32(const float *send, float *recv, long count, MPI_Comm comm, spb_comm_phase phase);
void spb_reduce_scatter_f32(const float *send, float *recv, long count, MPI_Comm comm, spb_comm_phase phase);

/* Point-to-point exchange for rings: post the receive from `src` and the
 * send to `dest` now, compute, then wait.  Recorded time is what the caller
 * is blocked (start + wait), i.e. the exposed part of the transfer. */
typedef struct spb_sendrecv {
    MPI_Request req[2];
    long count;
    float *host_send, *host_recv, *device_recv; /* the host-staged path's */
    MPI_Comm comm;
    spb_comm_phase phase;
    double blocked;
} spb_sendrecv;
void spb_sendrecv_start(spb_sendrecv *r, const float *send, int dest, float *recv, int src, long count,
                        MPI_Comm comm, spb_comm_phase phase);
void spb_sendrecv_wait(spb_sendrecv *r);

/* In-place sum over comm; fp32 buffers may exceed INT_MAX elements. */
void spb_allreduce_sum_f32(float *buf, long n, MPI_Comm comm, spb_comm_phase phase);
void spb_allreduce_sum_f64(double *buf, int n, MPI_Comm comm, spb_comm_phase phase);
void spb_allreduce_max_f64(double *buf, int n, MPI_Comm comm, spb_comm_phase phase);

/* Replays the all-to-alls since the last spb_comm_reset (up to a bounded
 * log): plain MPI_Alltoall of the same counts on the same communicators, in
 * the same order, back to back after a barrier, on scratch buffers; returns
 * the seconds.  Against it, a strategy's exchange cost without the waiting
 * for other ranks that in-run timings include.  Collective. */
double spb_comm_replay_alltoalls(void);

/* Device buffers without a device-aware MPI: with a staging interface set,
 * every float collective copies what it sends to host memory, runs MPI on
 * host buffers and copies what it receives back (the host-staged path, so
 * several ranks can share one GPU).  The copies count in the collective's
 * recorded time: that is what this path costs.  NULL (the default): the
 * buffers are host memory.  The f64 reductions always take host scalars. */
typedef struct spb_comm_staging {
    void (*to_host)(void *host, const void *device, size_t bytes);
    void (*to_device)(void *device, const void *host, size_t bytes);
} spb_comm_staging;
void spb_comm_set_staging(const spb_comm_staging *staging);

const spb_comm_record *spb_comm_record_get(spb_comm_op op, spb_comm_phase phase);
void spb_comm_reset(void);
double spb_comm_bus_factor(spb_comm_op op, int ranks);
const char *spb_comm_op_name(spb_comm_op op);
const char *spb_comm_phase_name(spb_comm_phase phase);

#endif
