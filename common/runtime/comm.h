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

#ifdef __cplusplus
extern "C" { /* the device tables in common/cuda are CUDA C++ */
#endif

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

/* All-to-all with per-rank counts (MPI_Alltoallv's arguments in floats):
 * send_counts[j] floats from send + send_displs[j] go to rank j, and
 * recv_counts[i] floats from rank i land at recv + recv_displs[i]; every
 * rank's send_counts[j] must equal rank j's recv_counts of it.  For uneven
 * sequence shares (common/runtime/split.h).  Runs as point-to-point
 * messages (any MPI, the built-in one included).  Recorded as an
 * all-to-all: payload = every element this rank sends (its own block
 * included, as the even call's n x count), link bytes = the elements it
 * sends to the others, exactly (no bus factor: the blocks differ), at
 * their stored size.  Device buffers go through the device table's
 * alltoallv or, staged, block by block through host memory.  Logged for
 * spb_comm_replay_alltoalls, which replays it with the same counts. */
void spb_alltoallv_f32(const float *send, const long *send_counts, const long *send_displs, float *recv,
                       const long *recv_counts, const long *recv_displs, MPI_Comm comm, spb_comm_phase phase);

/* Allgather and reduce-scatter with per-rank counts, for uneven sequence
 * shares too: rank i's block is counts[i] floats at displs[i] of the
 * n-block buffer (recv of the allgather, send of the reduce-scatter); the
 * allgather sends this rank's counts[me] floats, the reduce-scatter
 * receives the sum of block me.  Point-to-point messages (any MPI, the
 * built-in one included); the reduce-scatter adds the blocks in rank order
 * (the same bits on every run).  Recorded as allgather / reduce-scatter:
 * payload = the n-block buffer's floats, link bytes = what this rank sends
 * (allgather: its block to each of the n − 1 others; reduce-scatter: every
 * block but its own to its owner), at the stored size.  Device buffers
 * as spb_alltoallv_f32's; every path sums in fp32 in rank order and rounds
 * once to the stored type, so all of them give the same bits. */
void spb_allgatherv_f32(const float *send, float *recv, const long *counts, const long *displs, MPI_Comm comm,
                        spb_comm_phase phase);
void spb_reduce_scatterv_f32(const float *send, const long *counts, const long *displs, float *recv, MPI_Comm comm,
                             spb_comm_phase phase);

/* Point-to-point exchange for rings: post the receive from `src` and the
 * send to `dest` now, compute, then wait.  Recorded time is what the caller
 * is blocked (start + wait), i.e. the exposed part of the transfer; on the
 * device path (spb_comm_set_device_ops) it is the transfer's own time on
 * the communication stream, overlapped or not. */
typedef struct spb_sendrecv {
    MPI_Request req[2];
    long count;      /* floats sent */
    long recv_count; /* floats received */
    double element_bytes;                       /* stored bytes per element sent */
    float *host_send, *host_recv, *device_recv; /* the host-staged path's */
    void *transfer;                             /* the device path's handle, else NULL */
    MPI_Comm comm;
    spb_comm_phase phase;
    double blocked;
} spb_sendrecv;
void spb_sendrecv_start(spb_sendrecv *r, const float *send, int dest, float *recv, int src, long count,
                        MPI_Comm comm, spb_comm_phase phase);
void spb_sendrecv_wait(spb_sendrecv *r);
/* The same with a receive of another size (ring blocks of uneven shares):
 * recorded bytes are what is sent. */
void spb_sendrecv_start_v(spb_sendrecv *r, const float *send, long send_count, int dest, float *recv,
                          long recv_count, int src, MPI_Comm comm, spb_comm_phase phase);

/* Non-blocking all-to-all (spb_alltoall_f32's blocks: count floats to and
 * from each rank), for exchanges split into pieces that overlap compute
 * (Ulysses' --ulysses-overlap): start, compute, wait.  Buffers belong to
 * the transfer until the wait.  On host buffers it runs as point-to-point
 * messages to every peer (so any MPI, the built-in one included, runs it);
 * host-staged, start copies send to a host buffer of its own and wait
 * copies what arrived to the device; with a device table, its
 * alltoall_start issues it on the communication stream after the compute
 * queued so far and the wait makes compute queued afterwards wait for it
 * (a table without alltoall_start runs its blocking alltoall at the
 * start).  Accounted at the start as an all-to-all of count floats per
 * block (so calls, bytes and the replay log follow the order of the
 * starts); its recorded time is what the caller is blocked (start +
 * wait: the exposed part), or on the device path the transfer's own time. */
typedef struct spb_alltoall_req {
    MPI_Request *req;                           /* 2 (n - 1) on the MPI paths */
    float *host_send, *host_recv, *device_recv; /* the host-staged path's */
    void *transfer;                             /* the device path's handle, else NULL */
    int device_path;                            /* issued through the device table */
    long count;                                 /* floats per block */
    int ranks;
    MPI_Comm comm;
    spb_comm_phase phase;
    double blocked;
} spb_alltoall_req;
void spb_alltoall_start(spb_alltoall_req *r, const float *send, float *recv, long count, MPI_Comm comm,
                        spb_comm_phase phase);
void spb_alltoall_wait(spb_alltoall_req *r);

/* In-place sum over comm; fp32 buffers may exceed INT_MAX elements. */
void spb_allreduce_sum_f32(float *buf, long n, MPI_Comm comm, spb_comm_phase phase);
void spb_allreduce_sum_f64(double *buf, int n, MPI_Comm comm, spb_comm_phase phase);
void spb_allreduce_max_f64(double *buf, int n, MPI_Comm comm, spb_comm_phase phase);

/* Replays the all-to-alls since the last spb_comm_reset (up to a bounded
 * log): plain MPI_Alltoall of the same counts on the same communicators
 * (those with per-rank counts as the same point-to-point exchange), in
 * the same order, back to back after a barrier, on scratch buffers; returns
 * the seconds.  Against it, a strategy's exchange cost without the waiting
 * for other ranks that in-run timings include.  Collective.  On the device
 * path the replay goes through the device table on its scratch buffers and
 * the seconds are the sum of the calls' device times (what the in-run
 * records hold there too); 0 when the table has no scratch buffers. */
double spb_comm_replay_alltoalls(void);
/* The same for the ring's point-to-point exchanges since the last reset:
 * MPI_Sendrecv of the same counts between the same ranks, in the same
 * order, back to back after a barrier; host path only (0 when the
 * exchanges went through a device table). */
double spb_comm_replay_sendrecvs(void);

/* Device buffers without a device-aware MPI: with a staging interface set,
 * every float collective copies what it sends to host memory, runs MPI on
 * host buffers and copies what it receives back (the host-staged path, so
 * several ranks can share one GPU).  The copies count in the collective's
 * recorded time: that is what this path costs.  NULL (the default): the
 * buffers are host memory.  The f64 reductions always take host scalars. */
/* The element type of a device collective's buffers (spb_comm_device_ops). */
typedef enum spb_comm_dtype { SPB_COMM_F32 = 0, SPB_COMM_BF16, SPB_COMM_F16 } spb_comm_dtype;

typedef struct spb_comm_staging {
    void (*to_host)(void *host, const void *device, size_t bytes);
    void (*to_device)(void *device, const void *host, size_t bytes);
    /* Optional (NULL: none): waits for the device's queued work.  Called
     * before each staged collective (and before each half of a sendrecv)
     * takes its start time, so that kernels still queued before it are not
     * counted as its time (the first copy would wait for them inside). */
    void (*synchronize)(void);
    /* Optional (NULL: 4, fp32): the bytes the device stores per element at
     * `device` (2 for a bf16 buffer).  The recorded payload and link bytes
     * are what a device-aware library would move: the send buffer's
     * elements at their stored size (MPI itself moves the staged fp32). */
    double (*element_bytes)(const void *device);
    /* Optional (NULL: the buffers are plain fp32 device memory, which a
     * device-collective table takes as they are): the storage behind the n
     * elements at p and their type, when they are one run of one type that
     * a device collective may read or, with `written`, overwrite directly
     * (nothing else, such as fp32 masters, kept in step with them); 0
     * otherwise, and that call takes the staged MPI path instead. */
    int (*device_span)(const void *p, long n, int written, void **storage, spb_comm_dtype *type);
} spb_comm_staging;
void spb_comm_set_staging(const spb_comm_staging *staging);

/* Collectives on device buffers through a device's own library (NCCL):
 * with a table set, every float collective above (allreduce_sum_f32,
 * alltoall, allgather, reduce_scatter, sendrecv) goes through it instead
 * of MPI and instead of staging, except one whose buffers the staging's
 * device_span does not resolve (then the staged MPI path runs it, counted
 * by spb_comm_device_fallbacks); the f64 reductions stay on MPI (host
 * scalars).  Calls, payload and link bytes are recorded exactly as on the
 * MPI path.
 *
 * Ordering: a collective is issued after the work the caller has queued on
 * its compute stream so far and returns without waiting; work queued on
 * the compute stream afterwards (kernels, copies to the host) sees its
 * result.  sendrecv_start issues the transfer the same way and returns a
 * non-NULL handle; sendrecv_wait makes compute queued afterwards wait for
 * it, so compute queued between the two overlaps the transfer.  Buffers
 * belong to the collective until then, as on the MPI path.
 *
 * Time: each call carries a ticket; the table measures the call on the
 * device and hands its seconds back later through spb_comm_device_time,
 * exactly once per ticket, whenever it learns them (it may poll finished
 * calls at any time), and for every call issued so far when flush_times
 * is called (which may wait for the device).  comm.c folds them into the
 * call's record and SPB_T_COMM as they arrive; spb_comm_flush,
 * spb_comm_record_get and spb_comm_replay_alltoalls ask the table for the
 * rest.  So no collective forces a device wait of its own. */
typedef struct spb_comm_device_ops {
    const char *name;
    /* Buffers are storage of type t (counts in its elements; reductions
     * sum in that type): fp32 device buffers as given, or what the
     * staging's device_span resolved (16-bit tables). */
    void (*allreduce_sum)(void *buf, long n, spb_comm_dtype t, MPI_Comm comm, long ticket);
    void (*alltoall)(const void *send, void *recv, long count, spb_comm_dtype t, MPI_Comm comm, long ticket);
    void (*allgather)(const void *send, void *recv, long count, spb_comm_dtype t, MPI_Comm comm, long ticket);
    void (*reduce_scatter)(const void *send, void *recv, long count, spb_comm_dtype t, MPI_Comm comm, long ticket);
    /* count elements sent to dest, recv_count received from src (they
     * differ for the ring blocks of uneven shares) */
    void *(*sendrecv_start)(const void *send, int dest, void *recv, int src, long count, long recv_count,
                            spb_comm_dtype t, MPI_Comm comm, long ticket);
    void (*sendrecv_wait)(void *transfer);
    /* Optional (NULL: spb_alltoall_start runs `alltoall`): alltoall issued
     * as sendrecv_start issues its transfer; the handle is waited with
     * sendrecv_wait. */
    void *(*alltoall_start)(const void *send, void *recv, long count, spb_comm_dtype t, MPI_Comm comm, long ticket);
    /* Optional (NULL: such calls take the staged MPI path, counted by
     * spb_comm_device_fallbacks): the per-rank-count collectives of uneven
     * shares, with spb_alltoallv_f32's, spb_allgatherv_f32's and
     * spb_reduce_scatterv_f32's counts and displacements in elements of t.
     * reduce_scatterv adds the n blocks in rank order in fp32 and rounds
     * once to t (the host path's bits). */
    void (*alltoallv)(const void *send, const long *send_counts, const long *send_displs, void *recv,
                      const long *recv_counts, const long *recv_displs, spb_comm_dtype t, MPI_Comm comm, long ticket);
    void (*allgatherv)(const void *send, void *recv, const long *counts, const long *displs, spb_comm_dtype t,
                       MPI_Comm comm, long ticket);
    void (*reduce_scatterv)(const void *send, const long *counts, const long *displs, void *recv, spb_comm_dtype t,
                            MPI_Comm comm, long ticket);
    void (*flush_times)(void);
    /* Optional: drops what the table keeps for comm (spb_comm_forget). */
    void (*forget)(MPI_Comm comm);
    /* Optional (NULL: spb_comm_replay_alltoalls skips): n floats of device
     * memory for the replay, and its release. */
    float *(*scratch_alloc)(long n);
    void (*scratch_free)(float *p);
} spb_comm_device_ops;
/* NULL (the default): MPI, staged or not.  Replacing a table first folds
 * the old one's pending times. */
void spb_comm_set_device_ops(const spb_comm_device_ops *ops);
/* Collectives that a device table was set for but took the staged MPI path
 * (a buffer the staging's device_span did not resolve), since the start. */
long spb_comm_device_fallbacks(void);
/* Before freeing a communicator that collectives have used: the device
 * table releases what it holds for it (NCCL: its communicator, destroyed
 * with its peers), so that a later communicator reusing the handle starts
 * afresh.  Collective over comm; a no-op without a device table. */
void spb_comm_forget(MPI_Comm comm);
/* For device tables: the seconds of the call issued with `ticket`. */
void spb_comm_device_time(long ticket, double seconds);
/* Folds every pending device time into the records and SPB_T_COMM (waits
 * for the device's collectives); the trainer calls it at the step boundary.
 * A no-op without a device table or with nothing pending. */
void spb_comm_flush(void);

/* Folds pending device times first (spb_comm_flush). */
const spb_comm_record *spb_comm_record_get(spb_comm_op op, spb_comm_phase phase);
/* Zeroes the records; device times still pending belong to the interval
 * being discarded and are dropped when they arrive (as spb_timer_reset_all
 * drops pending regions). */
void spb_comm_reset(void);
double spb_comm_bus_factor(spb_comm_op op, int ranks);
const char *spb_comm_op_name(spb_comm_op op);
const char *spb_comm_phase_name(spb_comm_phase phase);

#ifdef __cplusplus
}
#endif

#endif
