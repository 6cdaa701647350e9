#include "comm.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "timer.h"

static spb_comm_record records[SPB_NUM_OPS][SPB_NUM_PHASES];

/* The host-staged path: NULL when buffers are host memory. */
static const spb_comm_staging *staging;
void spb_comm_set_staging(const spb_comm_staging *s) { staging = s; }

/* A collective's start time.  Staged, the device's queued work is waited
 * for first: the first copy would wait for it inside the timed region. */
static double start_time(void)
{
    if (staging && staging->synchronize) staging->synchronize();
    return spb_now();
}

/* The device path: NULL when collectives go through MPI. */
static const spb_comm_device_ops *device;

/* Bytes per element of the buffer a collective sends (comm.h): what a
 * device-aware library moves, on either path. */
static double element_bytes(const void *buf)
{
    return staging && staging->element_bytes ? staging->element_bytes(buf) : 4.0;
}

static long device_fallbacks;
long spb_comm_device_fallbacks(void) { return device_fallbacks; }

/* A collective's buffers as the device table takes them: as given (fp32
 * device memory), or the storage the staging's device_span resolves; 0 when
 * there is no table, or a buffer does not resolve or the types differ (the
 * call then takes the staged MPI path).  send may be NULL (in place). */
static int device_buffers(const void *send, long ns, void *recv, long nr, const void **s, void **r,
                          spb_comm_dtype *t)
{
    if (!device) return 0;
    *s = send, *r = recv, *t = SPB_COMM_F32;
    if (!staging || !staging->device_span) return 1;
    void *ss = NULL;
    spb_comm_dtype ts = SPB_COMM_F32;
    int ok = staging->device_span(recv, nr, 1, r, t);
    if (ok && send) ok = staging->device_span(send, ns, 0, &ss, &ts) && ts == *t;
    if (!ok) {
        device_fallbacks++;
        return 0;
    }
    *s = ss;
    return 1;
}

/* Device calls whose seconds have not arrived yet, by ticket.  Tickets are
 * issued in order; [first_open, next_ticket) holds every call not yet
 * reported plus those reported out of order after the oldest open one,
 * in slot ticket % calls_cap. */
enum time_use { TIME_RECORD, TIME_REPLAY, TIME_DROP };
typedef struct device_call {
    unsigned char op, phase, use, arrived;
} device_call;
static device_call *calls_out;
static long calls_cap, first_open, next_ticket;
static double replay_seconds; /* spb_comm_replay_alltoalls' calls */

/* Two host buffers that grow to the largest collective seen. */
static float *stage_buffer(int which, long n)
{
    static float *buf[2];
    static long cap[2];
    if (n > cap[which]) {
        free(buf[which]);
        buf[which] = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)n));
        cap[which] = n;
    }
    return buf[which];
}

/* send (device, n floats) -> host staging buffer 0; returns what MPI sends. */
static const float *stage_out(const float *send, long n)
{
    if (!staging) return send;
    float *h = stage_buffer(0, n);
    staging->to_host(h, send, sizeof(float) * (size_t)n);
    return h;
}

/* Where MPI receives n floats: the device buffer itself or host buffer 1. */
static float *stage_in(float *recv, long n) { return staging ? stage_buffer(1, n) : recv; }

static void stage_back(float *recv, const float *host, long n)
{
    if (staging) staging->to_device(recv, host, sizeof(float) * (size_t)n);
}

/* Log of all-to-all calls for spb_comm_replay_alltoalls. */
enum { ALLTOALL_LOG_MAX = 1 << 16 };
static struct alltoall_call {
    long count;
    MPI_Comm comm;
    long *v; /* per-rank counts (spb_alltoallv_f32): send counts, send displs, recv counts, recv displs; else NULL */
} alltoall_log[ALLTOALL_LOG_MAX];
static int alltoall_logged;
/* Log of host-path sendrecvs for spb_comm_replay_sendrecvs. */
enum { SENDRECV_LOG_MAX = 1 << 16 };
static struct sendrecv_call {
    long count, recv_count;
    MPI_Comm comm;
    int dest, src;
} sendrecv_log[SENDRECV_LOG_MAX];
static int sendrecv_logged;

double spb_comm_bus_factor(spb_comm_op op, int n)
{
    if (n <= 1) return 0.0;
    switch (op) {
    case SPB_OP_ALLREDUCE: return 2.0 * (n - 1) / n;
    case SPB_OP_ALLGATHER:
    case SPB_OP_REDUCE_SCATTER:
    case SPB_OP_ALLTOALL: return (double)(n - 1) / n;
    case SPB_OP_SENDRECV: return 1.0;
    default: return 0.0;
    }
}

/* Calls, payload and link bytes: the same on both paths. */
static void account(spb_comm_op op, spb_comm_phase phase, MPI_Comm comm, double payload)
{
    int n = 1;
    MPI_Comm_size(comm, &n);
    spb_comm_record *r = &records[op][phase];
    r->calls++;
    r->payload_bytes += payload;
    r->link_bytes += payload * spb_comm_bus_factor(op, n);
}

static void record(spb_comm_op op, spb_comm_phase phase, MPI_Comm comm, double payload, double seconds)
{
    account(op, phase, comm, payload);
    records[op][phase].seconds += seconds;
    spb_timer_add(SPB_T_COMM, seconds);
}

static long issue_ticket(spb_comm_op op, spb_comm_phase phase, enum time_use use)
{
    if (next_ticket - first_open == calls_cap) { /* full: double, keeping each open ticket's slot rule */
        long cap = calls_cap ? 2 * calls_cap : 256;
        device_call *grown = SPB_CHECK_PTR(malloc(sizeof *grown * (size_t)cap));
        for (long t = first_open; t < next_ticket; t++) grown[t % cap] = calls_out[t % calls_cap];
        free(calls_out);
        calls_out = grown, calls_cap = cap;
    }
    calls_out[next_ticket % calls_cap] = (device_call){(unsigned char)op, (unsigned char)phase, (unsigned char)use, 0};
    return next_ticket++;
}

void spb_comm_device_time(long ticket, double seconds)
{
    if (ticket < first_open || ticket >= next_ticket || calls_out[ticket % calls_cap].arrived)
        SPB_DIE("device time for collective %ld, which is not pending (reported twice, or never issued)", ticket);
    device_call *c = &calls_out[ticket % calls_cap];
    c->arrived = 1;
    if (c->use == TIME_RECORD) {
        records[c->op][c->phase].seconds += seconds;
        spb_timer_add(SPB_T_COMM, seconds);
    } else if (c->use == TIME_REPLAY) {
        replay_seconds += seconds;
    }
    while (first_open < next_ticket && calls_out[first_open % calls_cap].arrived) first_open++;
}

void spb_comm_flush(void)
{
    if (!device || first_open == next_ticket) return;
    device->flush_times();
    if (first_open != next_ticket)
        SPB_DIE("device collectives %s: %ld calls' times still pending after flush_times", device->name,
                next_ticket - first_open);
}

void spb_comm_forget(MPI_Comm comm)
{
    if (device && device->forget) device->forget(comm);
}

void spb_comm_set_device_ops(const spb_comm_device_ops *ops)
{
    spb_comm_flush(); /* the old table's times, before it goes */
    device = ops;
}

void spb_allreduce_sum_f32(float *buf, long n, MPI_Comm comm, spb_comm_phase phase)
{
    const void *ds;
    void *dr;
    spb_comm_dtype dt;
    if (device_buffers(NULL, 0, buf, n, &ds, &dr, &dt)) {
        device->allreduce_sum(dr, n, dt, comm, issue_ticket(SPB_OP_ALLREDUCE, phase, TIME_RECORD));
        account(SPB_OP_ALLREDUCE, phase, comm, element_bytes(buf) * (double)n);
        return;
    }
    double t0 = start_time();
    float *work = staging ? (float *)stage_out(buf, n) : buf;
    /* MPI counts are int: reduce in chunks. */
    const long chunk = 1L << 30;
    for (long off = 0; off < n; off += chunk) {
        int cnt = (int)(n - off < chunk ? n - off : chunk);
        SPB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, work + off, cnt, MPI_FLOAT, MPI_SUM, comm));
    }
    stage_back(buf, work, n);
    record(SPB_OP_ALLREDUCE, phase, comm, element_bytes(buf) * (double)n, spb_now() - t0);
}

static void allreduce_f64(double *buf, int n, MPI_Op mop, MPI_Comm comm, spb_comm_phase phase)
{
    double t0 = spb_now();
    SPB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, mop, comm));
    record(SPB_OP_ALLREDUCE, phase, comm, 8.0 * n, spb_now() - t0);
}

void spb_allreduce_sum_f64(double *buf, int n, MPI_Comm comm, spb_comm_phase phase)
{
    allreduce_f64(buf, n, MPI_SUM, comm, phase);
}

void spb_allreduce_max_f64(double *buf, int n, MPI_Comm comm, spb_comm_phase phase)
{
    allreduce_f64(buf, n, MPI_MAX, comm, phase);
}

static int count_as_int(long count)
{
    if (count < 0 || count > INT_MAX) SPB_DIE("collective block of %ld floats exceeds MPI's int count", count);
    return (int)count;
}

static int group_size(MPI_Comm comm)
{
    int n = 1;
    SPB_MPI_CHECK(MPI_Comm_size(comm, &n));
    return n;
}

static void log_alltoall(long count, MPI_Comm comm)
{
    if (alltoall_logged < ALLTOALL_LOG_MAX) alltoall_log[alltoall_logged++] = (struct alltoall_call){count, comm, NULL};
}

void spb_alltoall_f32(const float *send, float *recv, long count, MPI_Comm comm, spb_comm_phase phase)
{
    const void *ds;
    void *dr;
    spb_comm_dtype dt;
    long whole = count * group_size(comm);
    if (device_buffers(send, whole, recv, whole, &ds, &dr, &dt)) {
        device->alltoall(ds, dr, count, dt, comm, issue_ticket(SPB_OP_ALLTOALL, phase, TIME_RECORD));
        account(SPB_OP_ALLTOALL, phase, comm, element_bytes(send) * (double)count * group_size(comm));
        log_alltoall(count, comm);
        return;
    }
    double t0 = start_time();
    int c = count_as_int(count), n = group_size(comm);
    const float *s = stage_out(send, count * n);
    float *r = stage_in(recv, count * n);
    SPB_MPI_CHECK(MPI_Alltoall(s, c, MPI_FLOAT, r, c, MPI_FLOAT, comm));
    stage_back(recv, r, count * n);
    record(SPB_OP_ALLTOALL, phase, comm, element_bytes(send) * (double)count * group_size(comm), spb_now() - t0);
    log_alltoall(count, comm);
}

/* A tag of its own: several may be in flight on one communicator, matched
 * pair by pair in the order every rank posts them. */
enum { ALLTOALL_START_TAG = 7 };

void spb_alltoall_start(spb_alltoall_req *r, const float *send, float *recv, long count, MPI_Comm comm,
                        spb_comm_phase phase)
{
    int n = group_size(comm), me;
    SPB_MPI_CHECK(MPI_Comm_rank(comm, &me));
    long whole = count * n;
    *r = (spb_alltoall_req){.count = count, .comm = comm, .phase = phase, .ranks = n};
    /* Accounted at the start on every path: records and the replay log in
     * the order of the starts, which every rank shares. */
    account(SPB_OP_ALLTOALL, phase, comm, element_bytes(send) * (double)whole);
    log_alltoall(count, comm);
    const void *ds;
    void *dr;
    spb_comm_dtype dt;
    if (device_buffers(send, whole, recv, whole, &ds, &dr, &dt)) {
        r->device_path = 1;
        long ticket = issue_ticket(SPB_OP_ALLTOALL, phase, TIME_RECORD);
        if (device->alltoall_start) {
            r->transfer = device->alltoall_start(ds, dr, count, dt, comm, ticket);
            SPB_CHECK(r->transfer);
        } else {
            device->alltoall(ds, dr, count, dt, comm, ticket);
        }
        return;
    }
    double t0 = start_time();
    int c = count_as_int(count);
    if (staging) { /* host buffers of its own: several transfers may be in flight */
        r->host_send = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(whole + 1)));
        r->host_recv = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(whole + 1)));
        r->device_recv = recv;
        staging->to_host(r->host_send, send, sizeof(float) * (size_t)whole);
        send = r->host_send, recv = r->host_recv;
    }
    /* Point-to-point messages (the pairwise all-to-all), so that the
     * built-in shm MPI runs it too; my own block is copied. */
    r->req = SPB_CHECK_PTR(malloc(sizeof(MPI_Request) * (size_t)(2 * n)));
    int k = 0;
    for (int j = 0; j < n; j++)
        if (j != me) SPB_MPI_CHECK(MPI_Irecv(recv + j * count, c, MPI_FLOAT, j, ALLTOALL_START_TAG, comm, &r->req[k++]));
    for (int j = 0; j < n; j++)
        if (j != me)
            SPB_MPI_CHECK(MPI_Isend(send + j * count, c, MPI_FLOAT, j, ALLTOALL_START_TAG, comm, &r->req[k++]));
    memcpy(recv + me * count, send + me * count, sizeof(float) * (size_t)count);
    r->blocked = spb_now() - t0;
}

void spb_alltoall_wait(spb_alltoall_req *r)
{
    if (r->device_path) { /* its time comes with its ticket */
        if (r->transfer) device->sendrecv_wait(r->transfer);
        r->transfer = NULL;
        return;
    }
    double t0 = start_time();
    SPB_MPI_CHECK(MPI_Waitall(2 * (r->ranks - 1), r->req, MPI_STATUSES_IGNORE));
    free(r->req);
    r->req = NULL;
    if (r->host_recv) {
        staging->to_device(r->device_recv, r->host_recv, sizeof(float) * (size_t)(r->count * r->ranks));
        free(r->host_send);
        free(r->host_recv);
        r->host_send = r->host_recv = NULL;
    }
    r->blocked += spb_now() - t0;
    records[SPB_OP_ALLTOALL][r->phase].seconds += r->blocked;
    spb_timer_add(SPB_T_COMM, r->blocked);
}

/* A tag of its own, apart from the shaped exchange's and the rings' (the
 * per-rank-count collectives are blocking: one tag serves all three). */
enum { ALLTOALLV_TAG = 8 };

/* Records a call whose link bytes are counted exactly (per-rank counts). */
static void account_exact(spb_comm_op op, spb_comm_phase phase, double payload, double link)
{
    spb_comm_record *rec = &records[op][phase];
    rec->calls++;
    rec->payload_bytes += payload;
    rec->link_bytes += link;
}

static void record_exact(spb_comm_op op, spb_comm_phase phase, double payload, double link, double seconds)
{
    account_exact(op, phase, payload, link);
    records[op][phase].seconds += seconds;
    spb_timer_add(SPB_T_COMM, seconds);
}

/* Elements from a buffer's start to the end of its last block. */
static long blocks_extent(const long *counts, const long *displs, int n)
{
    long end = 0;
    for (int i = 0; i < n; i++)
        if (counts[i] > 0 && displs[i] + counts[i] > end) end = displs[i] + counts[i];
    return end;
}

/* A per-rank-count call's buffers for the device table: 0 (the staged MPI
 * path then) without a table, or when the table lacks the entry (counted
 * as a fallback), or when device_buffers does not resolve them. */
static int device_v_buffers(int has_entry, const void *send, long ns, void *recv, long nr, const void **s, void **r,
                            spb_comm_dtype *t)
{
    if (!device) return 0;
    if (!has_entry) {
        device_fallbacks++;
        return 0;
    }
    return device_buffers(send, ns, recv, nr, s, r, t);
}

/* Host copies of device blocks for the staged path, in host buffer 0: block
 * i of counts[i] elements at displs[i], copied one by one (nothing between
 * blocks is read or written).  Without staging the buffer itself. */
static const float *stage_blocks_out(const float *dev, const long *counts, const long *displs, int n, long extent)
{
    if (!staging) return dev;
    float *h = stage_buffer(0, extent + 1);
    for (int i = 0; i < n; i++)
        if (counts[i] > 0) staging->to_host(h + displs[i], dev + displs[i], sizeof(float) * (size_t)counts[i]);
    return h;
}

static void stage_blocks_back(float *dev, const float *host, const long *counts, const long *displs, int n)
{
    if (!staging) return;
    for (int i = 0; i < n; i++)
        if (counts[i] > 0) staging->to_device(dev + displs[i], host + displs[i], sizeof(float) * (size_t)counts[i]);
}

/* The all-to-all with per-rank counts on host buffers: point-to-point
 * messages (any MPI, the built-in one included), this rank's block copied.
 * The allgather and reduce-scatter with per-rank counts are this exchange
 * with other counts (below). */
static void alltoallv_host(const float *s, const long *send_counts, const long *send_displs, float *r,
                           const long *recv_counts, const long *recv_displs, MPI_Comm comm)
{
    int n = group_size(comm), me;
    SPB_MPI_CHECK(MPI_Comm_rank(comm, &me));
    MPI_Request *req = SPB_CHECK_PTR(malloc(sizeof(MPI_Request) * (size_t)(2 * n)));
    int k = 0;
    for (int j = 0; j < n; j++)
        if (j != me)
            SPB_MPI_CHECK(MPI_Irecv(r + recv_displs[j], count_as_int(recv_counts[j]), MPI_FLOAT, j, ALLTOALLV_TAG, comm,
                                    &req[k++]));
    for (int j = 0; j < n; j++)
        if (j != me)
            SPB_MPI_CHECK(MPI_Isend(s + send_displs[j], count_as_int(send_counts[j]), MPI_FLOAT, j, ALLTOALLV_TAG, comm,
                                    &req[k++]));
    memcpy(r + recv_displs[me], s + send_displs[me], sizeof(float) * (size_t)send_counts[me]);
    SPB_MPI_CHECK(MPI_Waitall(k, req, MPI_STATUSES_IGNORE));
    free(req);
}

/* Logs a call with per-rank counts for the replay (a copy of its counts). */
static void log_alltoallv(const long *send_counts, const long *send_displs, const long *recv_counts,
                          const long *recv_displs, int n, MPI_Comm comm)
{
    if (alltoall_logged >= ALLTOALL_LOG_MAX) return;
    long *v = SPB_CHECK_PTR(malloc(sizeof(long) * 4 * (size_t)n));
    memcpy(v, send_counts, sizeof(long) * (size_t)n);
    memcpy(v + n, send_displs, sizeof(long) * (size_t)n);
    memcpy(v + 2 * n, recv_counts, sizeof(long) * (size_t)n);
    memcpy(v + 3 * n, recv_displs, sizeof(long) * (size_t)n);
    alltoall_log[alltoall_logged++] = (struct alltoall_call){0, comm, v};
}

void spb_alltoallv_f32(const float *send, const long *send_counts, const long *send_displs, float *recv,
                       const long *recv_counts, const long *recv_displs, MPI_Comm comm, spb_comm_phase phase)
{
    int n = group_size(comm), me;
    SPB_MPI_CHECK(MPI_Comm_rank(comm, &me));
    SPB_CHECK(send_counts[me] == recv_counts[me]);
    double eb = element_bytes(send), sent_all = 0, sent_others = 0;
    for (int j = 0; j < n; j++) sent_all += (double)send_counts[j], sent_others += j == me ? 0 : (double)send_counts[j];
    long send_extent = blocks_extent(send_counts, send_displs, n), recv_extent = blocks_extent(recv_counts, recv_displs, n);
    const void *ds;
    void *dr;
    spb_comm_dtype dt;
    if (device_v_buffers(device && device->alltoallv, send, send_extent, recv, recv_extent, &ds, &dr, &dt)) {
        device->alltoallv(ds, send_counts, send_displs, dr, recv_counts, recv_displs, dt, comm,
                          issue_ticket(SPB_OP_ALLTOALL, phase, TIME_RECORD));
        account_exact(SPB_OP_ALLTOALL, phase, eb * sent_all, eb * sent_others);
        log_alltoallv(send_counts, send_displs, recv_counts, recv_displs, n, comm);
        return;
    }
    double t0 = start_time();
    const float *s = stage_blocks_out(send, send_counts, send_displs, n, send_extent);
    float *r = staging ? stage_buffer(1, recv_extent + 1) : recv;
    alltoallv_host(s, send_counts, send_displs, r, recv_counts, recv_displs, comm);
    stage_blocks_back(recv, r, recv_counts, recv_displs, n);
    record_exact(SPB_OP_ALLTOALL, phase, eb * sent_all, eb * sent_others, spb_now() - t0);
    log_alltoallv(send_counts, send_displs, recv_counts, recv_displs, n, comm);
}

void spb_allgatherv_f32(const float *send, float *recv, const long *counts, const long *displs, MPI_Comm comm,
                        spb_comm_phase phase)
{
    int n = group_size(comm), me;
    SPB_MPI_CHECK(MPI_Comm_rank(comm, &me));
    double eb = element_bytes(send), total = 0;
    for (int j = 0; j < n; j++) total += (double)counts[j];
    long extent = blocks_extent(counts, displs, n);
    const void *ds;
    void *dr;
    spb_comm_dtype dt;
    if (device_v_buffers(device && device->allgatherv, send, counts[me], recv, extent, &ds, &dr, &dt)) {
        device->allgatherv(ds, dr, counts, displs, dt, comm, issue_ticket(SPB_OP_ALLGATHER, phase, TIME_RECORD));
        account_exact(SPB_OP_ALLGATHER, phase, eb * total, eb * (double)counts[me] * (n - 1));
        return;
    }
    double t0 = start_time();
    const float *s = stage_out(send, counts[me]);
    float *r = staging ? stage_buffer(1, extent + 1) : recv;
    long *mine = SPB_CHECK_PTR(calloc(2 * (size_t)n, sizeof(long))); /* counts[me] to every rank, from offset 0 */
    for (int j = 0; j < n; j++) mine[j] = counts[me];
    alltoallv_host(s, mine, mine + n, r, counts, displs, comm);
    free(mine);
    stage_blocks_back(recv, r, counts, displs, n);
    record_exact(SPB_OP_ALLGATHER, phase, eb * total, eb * (double)counts[me] * (n - 1), spb_now() - t0);
}

void spb_reduce_scatterv_f32(const float *send, const long *counts, const long *displs, float *recv, MPI_Comm comm,
                             spb_comm_phase phase)
{
    int n = group_size(comm), me;
    SPB_MPI_CHECK(MPI_Comm_rank(comm, &me));
    long mine = counts[me];
    double eb = element_bytes(send), total = 0;
    for (int j = 0; j < n; j++) total += (double)counts[j];
    long extent = blocks_extent(counts, displs, n);
    const void *ds;
    void *dr;
    spb_comm_dtype dt;
    if (device_v_buffers(device && device->reduce_scatterv, send, extent, recv, mine, &ds, &dr, &dt)) {
        device->reduce_scatterv(ds, counts, displs, dr, dt, comm,
                                issue_ticket(SPB_OP_REDUCE_SCATTER, phase, TIME_RECORD));
        account_exact(SPB_OP_REDUCE_SCATTER, phase, eb * total, eb * (total - (double)mine));
        return;
    }
    double t0 = start_time();
    const float *s = stage_blocks_out(send, counts, displs, n, extent);
    float *parts = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(mine * n + 1))); /* part i: rank i's block me */
    long *part = SPB_CHECK_PTR(malloc(sizeof(long) * 2 * (size_t)n)); /* mine floats from each, at i·mine */
    for (int i = 0; i < n; i++) part[i] = mine, part[n + i] = i * mine;
    alltoallv_host(s, counts, displs, parts, part, part + n, comm);
    free(part);
    float *r = staging ? stage_buffer(1, mine + 1) : recv;
    for (long x = 0; x < mine; x++) { /* in rank order: the same sum on every run and path */
        float sum = 0.0f;
        for (int i = 0; i < n; i++) sum += parts[i * mine + x];
        r[x] = sum;
    }
    stage_back(recv, r, mine);
    free(parts);
    record_exact(SPB_OP_REDUCE_SCATTER, phase, eb * total, eb * (total - (double)mine), spb_now() - t0);
}

/* The replay through the device table: the calls' device seconds. */
static double replay_on_device(long most)
{
    if (!device->scratch_alloc || !device->scratch_free) return 0.0;
    float *send = device->scratch_alloc(most + 1), *recv = device->scratch_alloc(most + 1);
    spb_comm_flush();
    replay_seconds = 0.0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < alltoall_logged; i++) {
        const struct alltoall_call *a = &alltoall_log[i];
        if (!a->v) {
            device->alltoall(send, recv, a->count, SPB_COMM_F32, a->comm,
                             issue_ticket(SPB_OP_ALLTOALL, SPB_PHASE_OTHER, TIME_REPLAY));
        } else if (device->alltoallv) { /* a table without it ran the call staged: no device time to replay */
            int n = group_size(a->comm);
            device->alltoallv(send, a->v, a->v + n, recv, a->v + 2 * n, a->v + 3 * n, SPB_COMM_F32, a->comm,
                              issue_ticket(SPB_OP_ALLTOALL, SPB_PHASE_OTHER, TIME_REPLAY));
        }
    }
    spb_comm_flush();
    device->scratch_free(send);
    device->scratch_free(recv);
    return replay_seconds;
}

double spb_comm_replay_alltoalls(void)
{
    long most = 0;
    for (int i = 0; i < alltoall_logged; i++) {
        const struct alltoall_call *a = &alltoall_log[i];
        int n = group_size(a->comm);
        long need = a->count * n;
        if (a->v) { /* the larger of the two sides' extents */
            long send_extent = blocks_extent(a->v, a->v + n, n), recv_extent = blocks_extent(a->v + 2 * n, a->v + 3 * n, n);
            need = send_extent > recv_extent ? send_extent : recv_extent;
        }
        most = need > most ? need : most;
    }
    if (device) return replay_on_device(most);
    float *send = SPB_CHECK_PTR(calloc((size_t)most + 1, sizeof(float)));
    float *recv = SPB_CHECK_PTR(calloc((size_t)most + 1, sizeof(float)));
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = spb_now();
    for (int i = 0; i < alltoall_logged; i++) {
        const struct alltoall_call *a = &alltoall_log[i];
        if (a->v) { /* the run's own exchange with per-rank counts (no plainer call moves them) */
            int n = group_size(a->comm);
            alltoallv_host(send, a->v, a->v + n, recv, a->v + 2 * n, a->v + 3 * n, a->comm);
            continue;
        }
        int c = count_as_int(a->count);
        SPB_MPI_CHECK(MPI_Alltoall(send, c, MPI_FLOAT, recv, c, MPI_FLOAT, a->comm));
    }
    double t = spb_now() - t0;
    free(send);
    free(recv);
    return t;
}

double spb_comm_replay_sendrecvs(void)
{
    long most = 0;
    for (int i = 0; i < sendrecv_logged; i++) {
        most = sendrecv_log[i].count > most ? sendrecv_log[i].count : most;
        most = sendrecv_log[i].recv_count > most ? sendrecv_log[i].recv_count : most;
    }
    float *send = SPB_CHECK_PTR(calloc((size_t)most + 1, sizeof(float)));
    float *recv = SPB_CHECK_PTR(calloc((size_t)most + 1, sizeof(float)));
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = spb_now();
    for (int i = 0; i < sendrecv_logged; i++) {
        const struct sendrecv_call *k = &sendrecv_log[i];
        int c = count_as_int(k->count);
        MPI_Request req[2]; /* Irecv + Isend: what the shm MPI offers too */
        SPB_MPI_CHECK(MPI_Irecv(recv, count_as_int(k->recv_count), MPI_FLOAT, k->src, 0, k->comm, &req[0]));
        SPB_MPI_CHECK(MPI_Isend(send, c, MPI_FLOAT, k->dest, 0, k->comm, &req[1]));
        SPB_MPI_CHECK(MPI_Waitall(2, req, MPI_STATUSES_IGNORE));
    }
    double t = spb_now() - t0;
    free(send);
    free(recv);
    return t;
}

void spb_allgather_f32(const float *send, float *recv, long count, MPI_Comm comm, spb_comm_phase phase)
{
    const void *ds;
    void *dr;
    spb_comm_dtype dt;
    if (device_buffers(send, count, recv, count * group_size(comm), &ds, &dr, &dt)) {
        device->allgather(ds, dr, count, dt, comm, issue_ticket(SPB_OP_ALLGATHER, phase, TIME_RECORD));
        account(SPB_OP_ALLGATHER, phase, comm, element_bytes(send) * (double)count * group_size(comm));
        return;
    }
    double t0 = start_time();
    int c = count_as_int(count), n = group_size(comm);
    const float *s = stage_out(send, count);
    float *r = stage_in(recv, count * n);
    SPB_MPI_CHECK(MPI_Allgather(s, c, MPI_FLOAT, r, c, MPI_FLOAT, comm));
    stage_back(recv, r, count * n);
    record(SPB_OP_ALLGATHER, phase, comm, element_bytes(send) * (double)count * group_size(comm), spb_now() - t0);
}

void spb_reduce_scatter_f32(const float *send, float *recv, long count, MPI_Comm comm, spb_comm_phase phase)
{
    const void *ds;
    void *dr;
    spb_comm_dtype dt;
    if (device_buffers(send, count * group_size(comm), recv, count, &ds, &dr, &dt)) {
        device->reduce_scatter(ds, dr, count, dt, comm, issue_ticket(SPB_OP_REDUCE_SCATTER, phase, TIME_RECORD));
        account(SPB_OP_REDUCE_SCATTER, phase, comm, element_bytes(send) * (double)count * group_size(comm));
        return;
    }
    double t0 = start_time();
    int c = count_as_int(count), n = group_size(comm);
    const float *s = stage_out(send, count * n);
    float *r = stage_in(recv, count);
    SPB_MPI_CHECK(MPI_Reduce_scatter_block(s, r, c, MPI_FLOAT, MPI_SUM, comm));
    stage_back(recv, r, count);
    record(SPB_OP_REDUCE_SCATTER, phase, comm, element_bytes(send) * (double)count * group_size(comm), spb_now() - t0);
}

void spb_sendrecv_start(spb_sendrecv *r, const float *send, int dest, float *recv, int src, long count,
                        MPI_Comm comm, spb_comm_phase phase)
{
    spb_sendrecv_start_v(r, send, count, dest, recv, count, src, comm, phase);
}

void spb_sendrecv_start_v(spb_sendrecv *r, const float *send, long count, int dest, float *recv, long recv_count,
                          int src, MPI_Comm comm, spb_comm_phase phase)
{
    r->count = count;
    r->recv_count = recv_count;
    r->element_bytes = element_bytes(send);
    r->comm = comm;
    r->phase = phase;
    r->host_send = r->host_recv = r->device_recv = NULL;
    r->transfer = NULL;
    r->blocked = 0.0;
    const void *ds;
    void *dr;
    spb_comm_dtype dt;
    if (device_buffers(send, count, recv, recv_count, &ds, &dr, &dt)) { /* accounted at the wait, as below */
        r->transfer = device->sendrecv_start(ds, dest, dr, src, count, recv_count, dt, comm,
                                             issue_ticket(SPB_OP_SENDRECV, phase, TIME_RECORD));
        SPB_CHECK(r->transfer);
        return;
    }
    double t0 = start_time();
    int c = count_as_int(count);
    if (staging) { /* buffers of its own: exchanges may overlap */
        r->host_send = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(count ? count : 1)));
        r->host_recv = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(recv_count ? recv_count : 1)));
        r->device_recv = recv;
        staging->to_host(r->host_send, send, sizeof(float) * (size_t)count);
        send = r->host_send, recv = r->host_recv;
    }
    if (sendrecv_logged < SENDRECV_LOG_MAX)
        sendrecv_log[sendrecv_logged++] = (struct sendrecv_call){count, recv_count, comm, dest, src};
    SPB_MPI_CHECK(MPI_Irecv(recv, count_as_int(recv_count), MPI_FLOAT, src, 0, comm, &r->req[0]));
    SPB_MPI_CHECK(MPI_Isend(send, c, MPI_FLOAT, dest, 0, comm, &r->req[1]));
    r->blocked = spb_now() - t0;
}

void spb_sendrecv_wait(spb_sendrecv *r)
{
    if (r->transfer) {
        SPB_CHECK(device);
        device->sendrecv_wait(r->transfer);
        r->transfer = NULL;
        account(SPB_OP_SENDRECV, r->phase, r->comm, r->element_bytes * (double)r->count);
        return;
    }
    double t0 = start_time();
    SPB_MPI_CHECK(MPI_Waitall(2, r->req, MPI_STATUSES_IGNORE));
    if (r->host_recv) {
        staging->to_device(r->device_recv, r->host_recv, sizeof(float) * (size_t)r->recv_count);
        free(r->host_send);
        free(r->host_recv);
        r->host_send = r->host_recv = NULL;
    }
    r->blocked += spb_now() - t0;
    record(SPB_OP_SENDRECV, r->phase, r->comm, r->element_bytes * (double)r->count, r->blocked);
}

const spb_comm_record *spb_comm_record_get(spb_comm_op op, spb_comm_phase phase)
{
    spb_comm_flush();
    return &records[op][phase];
}

void spb_comm_reset(void)
{
    for (int i = 0; i < alltoall_logged; i++) free(alltoall_log[i].v);
    alltoall_logged = 0;
    sendrecv_logged = 0;
    for (long t = first_open; t < next_ticket; t++) calls_out[t % calls_cap].use = TIME_DROP;
    for (int o = 0; o < SPB_NUM_OPS; o++)
        for (int p = 0; p < SPB_NUM_PHASES; p++) records[o][p] = (spb_comm_record){0};
}

const char *spb_comm_op_name(spb_comm_op op)
{
    static const char *names[SPB_NUM_OPS] = {"allreduce", "allgather", "reduce_scatter", "alltoall", "sendrecv"};
    return names[op];
}

const char *spb_comm_phase_name(spb_comm_phase phase)
{
    static const char *names[SPB_NUM_PHASES] = {"forward", "backward", "recompute", "zero", "grad_reduce", "other"};
    return names[phase];
}
