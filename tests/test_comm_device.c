/* Over 700 lines: one test program: the device-collective table against plain MPI for every strategy and ZeRO stage. */
/* comm.h's device-collective path, on the CPU: a fake device table that
 * runs each collective with host MPI on host memory but reports its
 * seconds late (some at later calls, out of order, the rest only when
 * asked to flush), registered with spb_comm_set_device_ops.  Shown, under
 * mpiexec -np 4:
 *   - every strategy with ZeRO 0-3 trains bit for bit as on the plain MPI
 *     path, and the records' calls, payload and link bytes are identical;
 *   - each deferred second is folded exactly once into its (op, phase)
 *     record and into SPB_T_COMM (not lost, not counted twice), none after
 *     a reset, and the all-to-all replay goes through the table;
 *   - ring attention starts each transfer before the compute that overlaps
 *     it and waits after it;
 * and the host-staged path calls the staging's synchronize hook before
 * each staged collective, once per collective and once per half of a
 * sendrecv. */
#include <check.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bf16.h"
#include "fp16.h"
#include "checks.h"
#include "comm.h"
#include "timer.h"
#include "train.h"
#include "mpi_check.h"
#include "strategy_check.h"

/* A small case (strategy_check.h) with its own token and head counts for
 * uneven shares (0: the small case's 32 tokens, 4 heads; head dim 8). */
typedef struct sized_case {
    small_case k;
    int seq_length, heads;
} sized_case;

static void sized_case_config(spb_config *c, const sized_case *s)
{
    small_case_config(c, &s->k);
    if (s->seq_length) c->seq_length = s->seq_length;
    if (s->heads) c->num_heads = s->heads, c->hidden_size = 8 * s->heads;
    if (!strcmp(s->k.strategy, "hybrid")) c->ulysses_degree = 2;
}

/* ------------------------------------------------------ the fake table -- */

/* Seconds the fake "measures" for a call: multiples of 2^-10, so that any
 * sum of them is exact and a lost or doubled report shows as a difference. */
static double fake_seconds_of(long ticket) { return (double)(ticket % 5 + 1) / 1024.0; }

enum { HELD_MAX = 1 << 16, EARLY_AT = 8 };
static struct held_time {
    long ticket;
    spb_comm_op op;
} held[HELD_MAX]; /* issued, not yet reported */
static int nheld;

static struct fake_stats {
    long issued[SPB_NUM_OPS];
    double reported[SPB_NUM_OPS]; /* seconds handed to comm.c */
    long flushes;
    spb_comm_op issue_log[4096]; /* op of each call, in issue order */
    double issue_seconds[4096];
    long nlog;
} fake;

static void report(int i)
{
    fake.reported[held[i].op] += fake_seconds_of(held[i].ticket);
    spb_comm_device_time(held[i].ticket, fake_seconds_of(held[i].ticket));
}

/* A call issued: held back.  Once EARLY_AT are held, the even-numbered of
 * them are reported (out of order, leaving gaps), as a table that polls
 * its finished calls would. */
static void issued(spb_comm_op op, long ticket)
{
    ck_assert_int_lt(nheld, HELD_MAX);
    if (fake.nlog < (long)(sizeof fake.issue_log / sizeof fake.issue_log[0])) {
        fake.issue_log[fake.nlog] = op;
        fake.issue_seconds[fake.nlog++] = fake_seconds_of(ticket);
    }
    fake.issued[op]++;
    held[nheld++] = (struct held_time){ticket, op};
    if (nheld < EARLY_AT) return;
    int kept = 0;
    for (int i = 0; i < nheld; i++) {
        if (i % 2 == 0)
            report(i);
        else
            held[kept++] = held[i];
    }
    nheld = kept;
}

/* Everything held, newest first. */
static void fake_flush_times(void)
{
    fake.flushes++;
    for (int i = nheld - 1; i >= 0; i--) report(i);
    nheld = 0;
}

/* The fake on host storage of any element type: fp32 as it is; 16-bit
 * elements moved as 2-byte words, and summed as the staged path sums them
 * (widened, added in fp32 by MPI, rounded once), so a 16-bit run through
 * the fake equals the staged one bit for bit. */
static long typed_calls[3]; /* by spb_comm_dtype */
static MPI_Datatype mpi_type(spb_comm_dtype t) { return t == SPB_COMM_F32 ? MPI_FLOAT : MPI_UINT16_T; }
static float *widened_copy(const void *p, long n, spb_comm_dtype t)
{
    float *w = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(n > 0 ? n : 1)));
    for (long i = 0; i < n; i++) {
        uint16_t x = ((const uint16_t *)p)[i];
        w[i] = t == SPB_COMM_F16 ? spb_fp16_to_float(x) : spb_bf16_to_float(x);
    }
    return w;
}
static void narrow_into(void *p, const float *w, long n, spb_comm_dtype t)
{
    for (long i = 0; i < n; i++)
        ((uint16_t *)p)[i] = t == SPB_COMM_F16 ? spb_fp16_from_float(w[i]) : spb_bf16_from_float(w[i]);
}

static void fake_allreduce(void *buf, long n, spb_comm_dtype t, MPI_Comm comm, long ticket)
{
    typed_calls[t]++;
    if (t == SPB_COMM_F32) {
        SPB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, comm));
    } else {
        float *w = widened_copy(buf, n, t);
        SPB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, w, (int)n, MPI_FLOAT, MPI_SUM, comm));
        narrow_into(buf, w, n, t);
        free(w);
    }
    issued(SPB_OP_ALLREDUCE, ticket);
}

static void fake_alltoall(const void *send, void *recv, long count, spb_comm_dtype t, MPI_Comm comm, long ticket)
{
    typed_calls[t]++;
    SPB_MPI_CHECK(MPI_Alltoall(send, (int)count, mpi_type(t), recv, (int)count, mpi_type(t), comm));
    issued(SPB_OP_ALLTOALL, ticket);
}

static void fake_allgather(const void *send, void *recv, long count, spb_comm_dtype t, MPI_Comm comm, long ticket)
{
    typed_calls[t]++;
    SPB_MPI_CHECK(MPI_Allgather(send, (int)count, mpi_type(t), recv, (int)count, mpi_type(t), comm));
    issued(SPB_OP_ALLGATHER, ticket);
}

static void fake_reduce_scatter(const void *send, void *recv, long count, spb_comm_dtype t, MPI_Comm comm,
                                long ticket)
{
    typed_calls[t]++;
    if (t == SPB_COMM_F32) {
        SPB_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, comm));
    } else {
        int n = 1;
        MPI_Comm_size(comm, &n);
        float *w = widened_copy(send, count * n, t), *r = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)count));
        SPB_MPI_CHECK(MPI_Reduce_scatter_block(w, r, (int)count, MPI_FLOAT, MPI_SUM, comm));
        narrow_into(recv, r, count, t);
        free(w), free(r);
    }
    issued(SPB_OP_REDUCE_SCATTER, ticket);
}

/* The ring's order: attention calls (forward, backward, merge) and
 * zeroing count as compute; a transfer overlaps compute when some ran
 * between its start and its wait. */
static long compute_calls;
static struct transfer_stats {
    long started, waited, overlapped;
} xfers;

typedef struct fake_transfer {
    MPI_Request req[2];
    long compute_at_start;
    int waited;
} fake_transfer;

static void *fake_sendrecv_start(const void *send, int dest, void *recv, int src, long count, long recv_count,
                                 spb_comm_dtype type, MPI_Comm comm, long ticket)
{
    typed_calls[type]++;
    fake_transfer *t = SPB_CHECK_PTR(calloc(1, sizeof *t));
    SPB_MPI_CHECK(MPI_Irecv(recv, (int)recv_count, mpi_type(type), src, 0, comm, &t->req[0]));
    SPB_MPI_CHECK(MPI_Isend(send, (int)count, mpi_type(type), dest, 0, comm, &t->req[1]));
    t->compute_at_start = compute_calls;
    xfers.started++;
    issued(SPB_OP_SENDRECV, ticket);
    return t;
}

static void fake_sendrecv_wait(void *handle)
{
    fake_transfer *t = handle;
    ck_assert(!t->waited);
    t->waited = 1;
    SPB_MPI_CHECK(MPI_Waitall(2, t->req, MPI_STATUSES_IGNORE));
    xfers.waited++;
    if (compute_calls > t->compute_at_start) xfers.overlapped++;
    free(t);
}

/* The per-rank-count collectives of uneven shares, on host MPI; the
 * reduce-scatter adds rank by rank in fp32 and rounds once (comm.h). */
static long v_calls, alltoallv_calls;
static int *int_copy(const long *v, int n)
{
    int *c = SPB_CHECK_PTR(malloc(sizeof(int) * (size_t)n));
    for (int i = 0; i < n; i++) c[i] = (int)v[i];
    return c;
}
static int comm_size(MPI_Comm comm)
{
    int n = 1;
    SPB_MPI_CHECK(MPI_Comm_size(comm, &n));
    return n;
}

static void fake_alltoallv(const void *send, const long *send_counts, const long *send_displs, void *recv,
                           const long *recv_counts, const long *recv_displs, spb_comm_dtype t, MPI_Comm comm,
                           long ticket)
{
    typed_calls[t]++, v_calls++, alltoallv_calls++;
    int n = comm_size(comm);
    int *sc = int_copy(send_counts, n), *sd = int_copy(send_displs, n), *rc = int_copy(recv_counts, n),
        *rd = int_copy(recv_displs, n);
    SPB_MPI_CHECK(MPI_Alltoallv(send, sc, sd, mpi_type(t), recv, rc, rd, mpi_type(t), comm));
    free(sc), free(sd), free(rc), free(rd);
    issued(SPB_OP_ALLTOALL, ticket);
}

static void fake_allgatherv(const void *send, void *recv, const long *counts, const long *displs, spb_comm_dtype t,
                            MPI_Comm comm, long ticket)
{
    typed_calls[t]++, v_calls++;
    int n = comm_size(comm), me;
    SPB_MPI_CHECK(MPI_Comm_rank(comm, &me));
    int *c = int_copy(counts, n), *d = int_copy(displs, n);
    SPB_MPI_CHECK(MPI_Allgatherv(send, c[me], mpi_type(t), recv, c, d, mpi_type(t), comm));
    free(c), free(d);
    issued(SPB_OP_ALLGATHER, ticket);
}

static void fake_reduce_scatterv(const void *send, const long *counts, const long *displs, void *recv,
                                 spb_comm_dtype t, MPI_Comm comm, long ticket)
{
    typed_calls[t]++, v_calls++;
    int n = comm_size(comm), me;
    SPB_MPI_CHECK(MPI_Comm_rank(comm, &me));
    long mine = counts[me], extent = 0;
    for (int j = 0; j < n; j++) extent = displs[j] + counts[j] > extent ? displs[j] + counts[j] : extent;
    float *w = t == SPB_COMM_F32 ? (float *)send : widened_copy(send, extent, t);
    float *parts = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(mine * n + 1)));
    int *sc = int_copy(counts, n), *sd = int_copy(displs, n), *rc = SPB_CHECK_PTR(malloc(sizeof(int) * (size_t)n)),
        *rd = SPB_CHECK_PTR(malloc(sizeof(int) * (size_t)n));
    for (int i = 0; i < n; i++) rc[i] = (int)mine, rd[i] = (int)(i * mine);
    SPB_MPI_CHECK(MPI_Alltoallv(w, sc, sd, MPI_FLOAT, parts, rc, rd, MPI_FLOAT, comm));
    float *sum = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(mine + 1)));
    for (long x = 0; x < mine; x++) {
        float v = 0.0f;
        for (int i = 0; i < n; i++) v += parts[i * mine + x];
        sum[x] = v;
    }
    if (t == SPB_COMM_F32)
        memcpy(recv, sum, sizeof(float) * (size_t)mine);
    else
        narrow_into(recv, sum, mine, t);
    if (w != send) free(w);
    free(parts), free(sum), free(sc), free(sd), free(rc), free(rd);
    issued(SPB_OP_REDUCE_SCATTER, ticket);
}

static long forgotten;
static void fake_forget(MPI_Comm comm)
{
    (void)comm;
    forgotten++;
}

static float *fake_scratch_alloc(long n) { return SPB_CHECK_PTR(calloc((size_t)n, sizeof(float))); }
static void fake_scratch_free(float *p) { free(p); }

static const spb_comm_device_ops fake_ops = {
    .name = "fake-deferred",
    .allreduce_sum = fake_allreduce,
    .alltoall = fake_alltoall,
    .allgather = fake_allgather,
    .reduce_scatter = fake_reduce_scatter,
    .sendrecv_start = fake_sendrecv_start,
    .sendrecv_wait = fake_sendrecv_wait,
    .alltoallv = fake_alltoallv,
    .allgatherv = fake_allgatherv,
    .reduce_scatterv = fake_reduce_scatterv,
    .flush_times = fake_flush_times,
    .forget = fake_forget,
    .scratch_alloc = fake_scratch_alloc,
    .scratch_free = fake_scratch_free,
};

static void fake_reset(void)
{
    memset(&fake, 0, sizeof fake);
    memset(&xfers, 0, sizeof xfers);
    nheld = 0;
    compute_calls = 0;
}

/* The CPU table with its attention counted as compute. */
static const spb_attn_backend *attn_inner;
static void counted_forward(const spb_attn_desc *d, const float *q, const float *k, const float *v, float *o,
                            float *lse)
{
    compute_calls++;
    attn_inner->forward(d, q, k, v, o, lse);
}
static void counted_backward(const spb_attn_desc *d, const float *q, const float *k, const float *v, const float *o,
                             const float *lse, const float *dout, float *dq, float *dk, float *dv)
{
    compute_calls++;
    attn_inner->backward(d, q, k, v, o, lse, dout, dq, dk, dv);
}
static spb_attn_backend counted_attn = {"counted", counted_forward, counted_backward};
static const spb_attn_backend *counted_attention(const char *name)
{
    attn_inner = spb_backend_cpu.attention(name);
    counted_attn.name = attn_inner->name;
    return &counted_attn;
}
static void counted_merge(float *o_acc, float *lse_acc, const float *o_pair, const float *lse_pair, int batch,
                          int heads, int head_dim, int T, int row, int len)
{
    compute_calls++;
    spb_backend_cpu.attn_merge(o_acc, lse_acc, o_pair, lse_pair, batch, heads, head_dim, T, row, len);
}

static void counted_zero(float *x, long n)
{
    compute_calls++;
    spb_backend_cpu.zero(x, n);
}

/* ------------------------------------------------------------- records -- */

typedef struct comm_snapshot {
    spb_comm_record rec[SPB_NUM_OPS][SPB_NUM_PHASES];
} comm_snapshot;

static comm_snapshot snapshot(void)
{
    comm_snapshot s;
    for (int o = 0; o < SPB_NUM_OPS; o++)
        for (int p = 0; p < SPB_NUM_PHASES; p++) s.rec[o][p] = *spb_comm_record_get((spb_comm_op)o, (spb_comm_phase)p);
    return s;
}

/* Calls, payload and link bytes equal, op by op and phase by phase. */
static void assert_same_volumes(const comm_snapshot *a, const comm_snapshot *b)
{
    for (int o = 0; o < SPB_NUM_OPS; o++)
        for (int p = 0; p < SPB_NUM_PHASES; p++) {
            const spb_comm_record *x = &a->rec[o][p], *y = &b->rec[o][p];
            ck_assert_msg(x->calls == y->calls && x->payload_bytes == y->payload_bytes &&
                              x->link_bytes == y->link_bytes,
                          "%s/%s: %ld calls %.0f payload %.0f link vs %ld %.0f %.0f",
                          spb_comm_op_name((spb_comm_op)o), spb_comm_phase_name((spb_comm_phase)p), x->calls,
                          x->payload_bytes, x->link_bytes, y->calls, y->payload_bytes, y->link_bytes);
        }
}

static double op_seconds(const comm_snapshot *s, spb_comm_op op)
{
    double t = 0;
    for (int p = 0; p < SPB_NUM_PHASES; p++) t += s->rec[op][p].seconds;
    return t;
}

static double all_seconds(const comm_snapshot *s)
{
    double t = 0;
    for (int o = 0; o < SPB_NUM_OPS; o++) t += op_seconds(s, (spb_comm_op)o);
    return t;
}

/* ------------------------------------------------------ training cases -- */

enum { STEPS = 2 };

static void train(spb_trainer *t, double *losses)
{
    for (int i = 0; i < STEPS; i++) losses[i] = spb_trainer_step(t);
}

/* The same configuration trained twice, STEPS steps each: a on the plain
 * path (MPI, staged where the table's memory is not the host's), b through
 * the fake device table (its trainer made with `table` registered, when
 * given); each run's losses and records. */
typedef struct twin_runs {
    spb_trainer *a, *b;
    double plain_loss[STEPS], device_loss[STEPS];
    comm_snapshot plain, dev;
} twin_runs;

static void train_twice(spb_config *c, spb_grid *grid, const spb_backend *table, twin_runs *r)
{
    spb_comm_reset();
    r->a = make(c, MPI_COMM_WORLD, grid);
    train(r->a, r->plain_loss);
    r->plain = snapshot();
    spb_comm_reset();
    spb_timer_reset_all();
    fake_reset();
    spb_comm_set_device_ops(&fake_ops);
    if (table) spb_backend_register_for_tests(table);
    r->b = spb_trainer_create(c, grid);
    spb_backend_register_for_tests(NULL);
    train(r->b, r->device_loss);
    spb_comm_flush();
    r->dev = snapshot();
}

START_TEST(device_path_trains_like_mpi)
{
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    ck_assert_msg(world == 4, "run with 4 ranks");
    static const small_case cases[] = {
        {"none", "alltoall", "contiguous", 1, 0, 1, 0},     {"none", "alltoall", "contiguous", 1, 1, 1, 0},
        {"none", "alltoall", "contiguous", 1, 2, 1, 0},     {"none", "alltoall", "contiguous", 1, 3, 1, 0},
        {"ulysses", "alltoall", "contiguous", 1, 0, 2, 0},  {"ulysses", "alltoall", "contiguous", 2, 1, 2, 0},
        {"ulysses", "alltoall", "contiguous", 1, 2, 2, 0},  {"ulysses", "alltoall", "contiguous", 1, 3, 4, 0},
        {"ulysses", "allgather", "contiguous", 1, 0, 4, 0}, {"megatron", "alltoall", "contiguous", 2, 0, 2, 0},
        {"megatron", "alltoall", "contiguous", 1, 1, 4, 0}, {"megatron", "alltoall", "contiguous", 1, 2, 2, 1},
        {"megatron", "alltoall", "contiguous", 1, 3, 2, 0}, {"ring", "alltoall", "contiguous", 1, 0, 2, 0},
        {"ring", "alltoall", "zigzag", 2, 1, 2, 0},         {"ring", "alltoall", "zigzag", 1, 2, 4, 1},
        {"ring", "alltoall", "zigzag", 1, 3, 4, 0},
    };
    /* static: strategies keep buffers by the table that made them (and free
     * them through it) beyond this test */
    static spb_backend counted;
    counted = spb_backend_cpu;
    counted.name = "counted-cpu";
    counted.attention = counted_attention;
    counted.attn_merge = counted_merge;
    counted.zero = counted_zero;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const small_case *kc = &cases[k];
        spb_config c;
        small_case_config(&c, kc);
        spb_grid grid;
        twin_runs r;
        train_twice(&c, &grid, &counted, &r);
        spb_trainer *a = r.a, *b = r.b;
        double *plain_loss = r.plain_loss, *device_loss = r.device_loss;
        comm_snapshot plain = r.plain, dev = r.dev;
        double comm_timer = spb_timer_get(SPB_T_COMM);

        say("%-8s %-9s %-10s micro %d ZeRO-%d P %d%s: %ld device calls (%ld sendrecv, %ld overlapping compute), "
            "%.4f s reported; losses %s\n",
            kc->strategy, kc->comm, kc->layout, kc->micro, kc->zero, kc->sp, kc->checkpoint ? " ckpt" : "",
            fake.issued[0] + fake.issued[1] + fake.issued[2] + fake.issued[3] + fake.issued[4], xfers.started,
            xfers.overlapped, all_seconds(&dev),
            memcmp(plain_loss, device_loss, sizeof r.plain_loss) ? "DIFFER" : "bit-identical");
        /* (a) the same training, bit for bit (the parameters: below, as
         * reading them issues collectives of its own under ZeRO-3) */
        ck_assert_int_eq(memcmp(plain_loss, device_loss, sizeof r.plain_loss), 0);
        /* (b) the same accounting: every float collective went through the table */
        assert_same_volumes(&plain, &dev);
        for (int o = SPB_OP_ALLGATHER; o < SPB_NUM_OPS; o++) {
            long calls = 0;
            for (int p = 0; p < SPB_NUM_PHASES; p++) calls += dev.rec[o][p].calls;
            ck_assert_int_eq(calls, fake.issued[o]);
        }
        /* (c) the deferred seconds arrived, all of them, once: the f32
         * operations' records hold exactly what the table reported (the
         * all-reduce records also hold the host f64 reductions' time), and
         * SPB_T_COMM holds what the records hold */
        ck_assert_int_eq(nheld, 0);
        for (int o = SPB_OP_ALLGATHER; o < SPB_NUM_OPS; o++)
            ck_assert_msg(op_seconds(&dev, (spb_comm_op)o) == fake.reported[o], "%s: %.9f s recorded, %.9f reported",
                          spb_comm_op_name((spb_comm_op)o), op_seconds(&dev, (spb_comm_op)o), fake.reported[o]);
        ck_assert(op_seconds(&dev, SPB_OP_ALLREDUCE) >= fake.reported[SPB_OP_ALLREDUCE]);
        ck_assert_double_eq_tol(comm_timer, all_seconds(&dev), 1e-9 * (1 + comm_timer));
        /* (d) ring: every transfer started, then waited once; all but the
         * backward's last (dK/dV home, nothing left to compute) overlap
         * compute: per layer and micro-step P-1 in forward (again in
         * recompute) and 2(P-1) in backward.  (Zigzag gives every step
         * visible pairs; contiguous at P = 2 has the diagonal forward and
         * the zeroing of dK/dV backward.) */
        ck_assert_int_eq(xfers.started, xfers.waited);
        if (!strcmp(kc->strategy, "ring")) {
            int D = world / kc->sp;
            long micro_steps = (long)STEPS * (c.global_batch_size / (kc->micro * D));
            long layer_passes = (long)c.num_layers * micro_steps, P = kc->sp;
            ck_assert_int_eq(xfers.started, layer_passes * ((P - 1) * (3 + kc->checkpoint) + 1));
            ck_assert_int_eq(xfers.overlapped, layer_passes * (P - 1) * (3 + kc->checkpoint));
        } else {
            ck_assert_int_eq(xfers.started, 0);
        }
        ck_assert(same_local_params(a, b));
        spb_comm_set_device_ops(NULL);
        spb_trainer_destroy(a);
        spb_trainer_destroy(b);
        spb_grid_destroy(&grid);
    }
    spb_comm_reset();
}
END_TEST

/* Uneven shares (N or H not divisible by P) through the device table: the
 * per-rank-count entries (alltoallv, allgatherv, reduce_scatterv) and ring
 * blocks of two sizes (sendrecv_start's recv_count) train bit for bit as
 * the host path, with the same accounting and no call left to the staged
 * fallback. */
START_TEST(uneven_device_path_trains_like_mpi)
{
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    ck_assert_msg(world == 4, "run with 4 ranks");
    static const sized_case cases[] = {
        {{"ulysses", "alltoall", "contiguous", 1, 0, 4, 0}, 30, 0},      /* uneven tokens */
        {{"ulysses", "alltoall", "contiguous", 1, 1, 4, 0}, 32, 6},      /* uneven heads */
        {{"ulysses", "alltoall", "contiguous", 1, 3, 2, 0}, 31, 0},      /* D = 2, ZeRO-3 */
        {{"megatron", "alltoall", "contiguous", 1, 2, 4, 0}, 30, 0},     /* allgatherv / reduce_scatterv */
        {{"megatron", "alltoall", "contiguous", 2, 3, 2, 1}, 31, 0},     /* recompute */
        {{"ring", "alltoall", "contiguous", 1, 0, 4, 0}, 30, 0},         /* blocks of 8 and 7 tokens */
        {{"allgather-kv", "alltoall", "contiguous", 1, 1, 4, 0}, 30, 0}, /* K/V gathered, dK/dV scattered */
        {{"hybrid", "alltoall", "contiguous", 1, 0, 4, 0}, 29, 0},       /* U = 2: nested shares */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const small_case *kc = &cases[k].k;
        spb_config c;
        sized_case_config(&c, &cases[k]);
        spb_grid grid;
        twin_runs r;
        v_calls = alltoallv_calls = 0;
        long fallbacks0 = spb_comm_device_fallbacks();
        train_twice(&c, &grid, NULL, &r);
        long fallbacks = spb_comm_device_fallbacks() - fallbacks0;
        /* --compare-alltoall's replay: the run's per-rank-count exchanges
         * again, each once, through the table */
        long in_run = alltoallv_calls;
        spb_comm_replay_alltoalls();
        ck_assert_int_eq(alltoallv_calls - in_run, in_run);
        say("uneven %-12s N %d H %d ZeRO-%d P %d%s: %ld per-rank-count calls through the table, %ld sendrecv, %ld "
            "staged; losses %s\n",
            kc->strategy, c.seq_length, c.num_heads, kc->zero, kc->sp, kc->checkpoint ? " ckpt" : "", v_calls,
            xfers.started, fallbacks, memcmp(r.plain_loss, r.device_loss, sizeof r.plain_loss) ? "DIFFER" : "bit-identical");
        ck_assert_int_eq(memcmp(r.plain_loss, r.device_loss, sizeof r.plain_loss), 0);
        assert_same_volumes(&r.plain, &r.dev);
        ck_assert_int_eq(fallbacks, 0);
        /* over the ranks: a hybrid group whose share is even (29 tokens:
         * groups of 15 and 14) exchanges equal blocks on its own ranks */
        long v_all = v_calls;
        SPB_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &v_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
        ck_assert_int_eq(xfers.started, xfers.waited);
        if (!strcmp(kc->strategy, "ring"))
            ck_assert(xfers.started > 0);
        else
            ck_assert_msg(v_all > 0, "no per-rank-count collective reached the table");
        ck_assert(same_local_params(r.a, r.b));
        spb_comm_set_device_ops(NULL);
        spb_trainer_destroy(r.a);
        spb_trainer_destroy(r.b);
        spb_grid_destroy(&grid);
    }
    spb_comm_reset();
}
END_TEST

/* ------------------------------------------- the timing, call by call -- */

enum { N = 6 }; /* floats per rank-block */

/* A fixed sequence of every float collective on host buffers, in several
 * phases; returns how many calls it made and their (op, phase) in order. */
static int run_sequence(float *out, spb_comm_op *ops, spb_comm_phase *phases)
{
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    float *send = malloc(sizeof(float) * N * (size_t)size), *recv = malloc(sizeof(float) * N * (size_t)size);
    for (int i = 0; i < N * size; i++) send[i] = (float)(rank * 100 + i) / 7.0f;
    int n = 0, at = 0;
    for (int round = 0; round < 3; round++) {
        spb_comm_phase ph = (spb_comm_phase)(round % SPB_NUM_PHASES);
        spb_allreduce_sum_f32(send, N, MPI_COMM_WORLD, ph);
        ops[n] = SPB_OP_ALLREDUCE, phases[n++] = ph;
        spb_alltoall_f32(send, recv, N, MPI_COMM_WORLD, SPB_PHASE_BACKWARD);
        ops[n] = SPB_OP_ALLTOALL, phases[n++] = SPB_PHASE_BACKWARD;
        memcpy(out + at, recv, sizeof(float) * N * (size_t)size), at += N * size;
        spb_allgather_f32(send, recv, N, MPI_COMM_WORLD, SPB_PHASE_ZERO);
        ops[n] = SPB_OP_ALLGATHER, phases[n++] = SPB_PHASE_ZERO;
        memcpy(out + at, recv, sizeof(float) * N * (size_t)size), at += N * size;
        spb_reduce_scatter_f32(send, recv, N, MPI_COMM_WORLD, ph);
        ops[n] = SPB_OP_REDUCE_SCATTER, phases[n++] = ph;
        memcpy(out + at, recv, sizeof(float) * N), at += N;
        spb_sendrecv x;
        spb_sendrecv_start(&x, send, (rank + 1) % size, recv, (rank + size - 1) % size, N, MPI_COMM_WORLD,
                           SPB_PHASE_FORWARD);
        spb_sendrecv_wait(&x);
        ops[n] = SPB_OP_SENDRECV, phases[n++] = SPB_PHASE_FORWARD;
        memcpy(out + at, recv, sizeof(float) * N), at += N;
    }
    memcpy(out + at, send, sizeof(float) * N), at += N;
    free(send);
    free(recv);
    return n;
}

/* --precision bf16/fp16 with a device table (--comm nccl's path): the 16-bit
 * tables' staging resolves each buffer to its storage (comm.h's
 * device_span), so the table moves the stored 16-bit elements; a buffer it
 * may not write directly (fp32 masters bound there) takes the staged path.
 * The fake sums 16-bit elements as the staged path does, so the run must
 * equal the staged one bit for bit, with the same accounting (2-byte
 * elements on both paths), and 16-bit calls must have reached the table. */
static void half_precision_device_runs(const char *precision)
{
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    ck_assert_msg(world == 4, "run with 4 ranks");
    static const sized_case cases[] = {
        {{"none", "alltoall", "contiguous", 1, 1, 1, 0}, 0, 0},
        {{"none", "alltoall", "contiguous", 1, 3, 1, 0}, 0, 0},
        {{"ulysses", "alltoall", "contiguous", 2, 2, 2, 0}, 0, 0},
        {{"ulysses", "alltoall", "contiguous", 1, 0, 4, 1}, 0, 0},
        {{"megatron", "alltoall", "contiguous", 1, 3, 2, 0}, 0, 0},
        {{"ring", "alltoall", "zigzag", 1, 1, 4, 0}, 0, 0},
        {{"ring", "alltoall", "contiguous", 1, 3, 2, 1}, 0, 0},
        /* uneven shares: the staged per-rank-count path against the table's */
        {{"ulysses", "alltoall", "contiguous", 1, 0, 4, 0}, 30, 6},
        {{"megatron", "alltoall", "contiguous", 1, 3, 2, 0}, 31, 0},
        {{"ring", "alltoall", "contiguous", 1, 1, 4, 0}, 30, 0},
        {{"allgather-kv", "alltoall", "contiguous", 1, 2, 4, 0}, 30, 0},
    };
    const spb_comm_dtype half = strcmp(precision, "fp16") ? SPB_COMM_BF16 : SPB_COMM_F16;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const small_case *kc = &cases[k].k;
        spb_config c;
        sized_case_config(&c, &cases[k]);
        snprintf(c.precision, sizeof c.precision, "%s", precision);
        spb_grid grid;
        twin_runs r;
        memset(typed_calls, 0, sizeof typed_calls);
        long fallbacks0 = spb_comm_device_fallbacks();
        train_twice(&c, &grid, NULL, &r);
        spb_trainer *a = r.a, *b = r.b;
        double *plain_loss = r.plain_loss, *device_loss = r.device_loss;
        comm_snapshot plain = r.plain, dev = r.dev;
        long fallbacks = spb_comm_device_fallbacks() - fallbacks0;

        say("%s %-8s micro %d ZeRO-%d P %d%s: device calls %ld in 16 bits, %ld in fp32; %ld staged (masters on "
            "the output); losses %s\n",
            precision, kc->strategy, kc->micro, kc->zero, kc->sp, kc->checkpoint ? " ckpt" : "", typed_calls[half],
            typed_calls[SPB_COMM_F32], fallbacks, memcmp(plain_loss, device_loss, sizeof r.plain_loss) ? "DIFFER" : "bit-identical");
        ck_assert_int_eq(memcmp(plain_loss, device_loss, sizeof r.plain_loss), 0);
        assert_same_volumes(&plain, &dev);
        if (kc->sp > 1 || kc->zero > 0) ck_assert_msg(typed_calls[half] > 0, "no 16-bit collective reached the table");
        ck_assert_int_eq(typed_calls[half == SPB_COMM_BF16 ? SPB_COMM_F16 : SPB_COMM_BF16], 0);
        ck_assert_int_eq(xfers.started, xfers.waited);
        ck_assert(same_local_params(a, b));
        spb_comm_set_device_ops(NULL);
        spb_trainer_destroy(a);
        spb_trainer_destroy(b);
        spb_grid_destroy(&grid);
    }
    spb_comm_reset();
}

/* The span rule on its own (no run of the core writes a span with masters
 * through a collective today): a span with fp32 masters bound takes the
 * staged path when a collective writes it, counted as a fallback, and keeps
 * its masters in step; reading it, and plain spans, go to the table.  Spans
 * across two buffers, or of no buffer, are not resolved. */
START_TEST(bf16_written_spans_with_masters_are_staged)
{
    const spb_backend *be = &spb_backend_cpu_bf16;
    spb_config c;
    spb_config_defaults(&c);
    snprintf(c.precision, sizeof c.precision, "bf16");
    c.zero_stage = 0; /* whole-buffer updates: parameters carry their masters */
    be->configure(&c);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const long n = 40;
    float *p = spb_backend_alloc(be, SPB_MEM_PARAMS, n, SPB_BUF_PLAIN);
    float *g = spb_backend_alloc(be, SPB_MEM_GRADS, n, SPB_BUF_PLAIN);
    be->fill(p, n, (float)(rank + 1) + 1.0f / 1024); /* the masters hold what bf16 cannot */
    be->fill(g, n, (float)(rank + 1));
    void *storage;
    spb_comm_dtype t;
    ck_assert_int_eq(be->staging.device_span(p, n, 0, &storage, &t), 1);
    ck_assert_int_eq(t, SPB_COMM_BF16);
    ck_assert_int_eq(be->staging.device_span(p, n, 1, &storage, &t), 0);
    ck_assert_int_eq(be->staging.device_span(g, n, 1, &storage, &t), 1);
    ck_assert_int_eq(be->staging.device_span(g + n - 4, 8, 0, &storage, &t), 0); /* past its buffer */
    float plain = 0;
    ck_assert_int_eq(be->staging.device_span(&plain, 1, 0, &storage, &t), 0); /* not a handle */

    spb_comm_set_staging(&be->staging);
    spb_comm_set_device_ops(&fake_ops);
    memset(typed_calls, 0, sizeof typed_calls);
    long fallbacks0 = spb_comm_device_fallbacks();
    spb_allreduce_sum_f32(g, n, MPI_COMM_WORLD, SPB_PHASE_OTHER);
    spb_allreduce_sum_f32(p, n, MPI_COMM_WORLD, SPB_PHASE_OTHER);
    spb_comm_flush();
    spb_comm_set_device_ops(NULL);
    ck_assert_int_eq(typed_calls[SPB_COMM_BF16], 1);
    ck_assert_int_eq(spb_comm_device_fallbacks() - fallbacks0, 1);
    float gh[40], ph[40];
    be->staging.to_host(gh, g, sizeof gh);
    be->staging.to_host(ph, p, sizeof ph); /* through the masters */
    for (long i = 0; i < n; i++) {
        ck_assert_float_eq(gh[i], 10.0f);
        ck_assert_float_eq(ph[i], 10.0f + 4.0f / 1024);
    }
    spb_comm_set_staging(NULL);
    be->free(p);
    be->free(g);
    spb_comm_reset();
}
END_TEST

START_TEST(bf16_device_path_trains_like_staged) { half_precision_device_runs("bf16"); }
END_TEST

START_TEST(fp16_device_path_trains_like_staged) { half_precision_device_runs("fp16"); }
END_TEST

START_TEST(deferred_times_fold_exactly_once)
{
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    enum { MAX_CALLS = 64 };
    size_t out_floats = 3 * (2 * N * (size_t)size + 2 * N) + N;
    float *plain_out = calloc(out_floats, sizeof(float)), *dev_out = calloc(out_floats, sizeof(float));
    spb_comm_op ops[MAX_CALLS];
    spb_comm_phase phases[MAX_CALLS];

    /* The plain MPI path first: the volumes to match. */
    spb_comm_reset();
    int ncalls = run_sequence(plain_out, ops, phases);
    comm_snapshot plain = snapshot();

    spb_comm_reset();
    spb_timer_reset_all();
    fake_reset();
    spb_comm_set_device_ops(&fake_ops);
    ck_assert_int_eq(run_sequence(dev_out, ops, phases), ncalls);
    ck_assert_int_eq(memcmp(plain_out, dev_out, sizeof(float) * out_floats), 0);
    ck_assert_int_eq(fake.nlog, ncalls);

    /* Before any flush: volumes already there, and only the seconds the
     * table reported early (EARLY_AT at a time), in SPB_T_COMM too. */
    double early = 0;
    for (int o = 0; o < SPB_NUM_OPS; o++) early += fake.reported[o];
    ck_assert(early > 0 && nheld > 0);
    ck_assert_double_eq(spb_timer_get(SPB_T_COMM), early);

    /* Reading a record folds the rest: each (op, phase) gets exactly the
     * seconds of its own calls. */
    comm_snapshot dev = snapshot();
    ck_assert_int_eq(fake.flushes, 1);
    ck_assert_int_eq(nheld, 0);
    assert_same_volumes(&plain, &dev);
    double want[SPB_NUM_OPS][SPB_NUM_PHASES] = {{0}}, total = 0;
    for (int i = 0; i < ncalls; i++) {
        ck_assert_int_eq(fake.issue_log[i], ops[i]);
        want[ops[i]][phases[i]] += fake.issue_seconds[i];
        total += fake.issue_seconds[i];
    }
    for (int o = 0; o < SPB_NUM_OPS; o++)
        for (int p = 0; p < SPB_NUM_PHASES; p++) ck_assert(dev.rec[o][p].seconds == want[o][p]);
    ck_assert(spb_timer_get(SPB_T_COMM) == total);

    /* Flushing again, reading again: nothing more (no double count), and
     * the table is not asked when nothing is pending. */
    spb_comm_flush();
    comm_snapshot again = snapshot();
    ck_assert_int_eq(memcmp(&again, &dev, sizeof dev), 0);
    ck_assert(spb_timer_get(SPB_T_COMM) == total);
    ck_assert_int_eq(fake.flushes, 1);

    /* The replay goes through the table: its seconds are its calls', and
     * they stay out of the records. */
    double replay = spb_comm_replay_alltoalls(), replay_want = 0;
    for (long i = ncalls; i < fake.nlog; i++) {
        ck_assert_int_eq(fake.issue_log[i], SPB_OP_ALLTOALL);
        replay_want += fake.issue_seconds[i];
    }
    ck_assert_int_eq(fake.nlog - ncalls, 3);
    ck_assert(replay == replay_want && replay > 0);
    again = snapshot();
    ck_assert_int_eq(memcmp(&again, &dev, sizeof dev), 0);
    ck_assert(spb_timer_get(SPB_T_COMM) == total);

    /* Calls still pending at a reset belong to the discarded interval:
     * their seconds are dropped when they arrive. */
    run_sequence(dev_out, ops, phases);
    spb_comm_reset();
    spb_timer_reset_all();
    ck_assert(nheld > 0);
    comm_snapshot after_reset = snapshot();
    ck_assert_int_eq(nheld, 0);
    for (int o = 0; o < SPB_NUM_OPS; o++)
        for (int p = 0; p < SPB_NUM_PHASES; p++) {
            ck_assert_int_eq(after_reset.rec[o][p].calls, 0);
            ck_assert(after_reset.rec[o][p].seconds == 0.0);
        }
    ck_assert(spb_timer_get(SPB_T_COMM) == 0.0);

    /* Forgetting a communicator reaches the table (not without one). */
    spb_comm_forget(MPI_COMM_WORLD);
    ck_assert_int_eq(forgotten, 1);

    /* Taking the table away folds what it still holds. */
    run_sequence(dev_out, ops, phases);
    ck_assert(nheld > 0);
    long flushes = fake.flushes;
    spb_comm_set_device_ops(NULL);
    ck_assert_int_eq(fake.flushes, flushes + 1);
    ck_assert_int_eq(nheld, 0);
    comm_snapshot last = snapshot();
    double sum = all_seconds(&last);
    ck_assert(sum > 0 && spb_timer_get(SPB_T_COMM) == sum);
    spb_comm_forget(MPI_COMM_WORLD);
    ck_assert_int_eq(forgotten, 1);
    spb_comm_reset();
    free(plain_out);
    free(dev_out);
}
END_TEST

/* -------------------------------------------- the staged path's hook -- */

static char stage_log[1024];
static int nstage_log;
static void log_stage(char what)
{
    if (nstage_log < (int)sizeof stage_log - 1) stage_log[nstage_log++] = what;
}
static void log_to_host(void *h, const void *d, size_t n) { log_stage('H'), memcpy(h, d, n); }
static void log_to_device(void *d, const void *h, size_t n) { log_stage('D'), memcpy(d, h, n); }
static void log_synchronize(void) { log_stage('S'); }

START_TEST(staged_collectives_synchronize_first)
{
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t out_floats = 3 * (2 * N * (size_t)size + 2 * N) + N;
    float *plain_out = calloc(out_floats, sizeof(float)), *staged_out = calloc(out_floats, sizeof(float));
    spb_comm_op ops[64];
    spb_comm_phase phases[64];
    spb_comm_reset();
    int ncalls = run_sequence(plain_out, ops, phases);

    static const spb_comm_staging logged = {.to_host = log_to_host, .to_device = log_to_device, .synchronize = log_synchronize};
    spb_comm_set_staging(&logged);
    nstage_log = 0;
    ck_assert_int_eq(run_sequence(staged_out, ops, phases), ncalls);
    double f64 = 1.0;
    spb_allreduce_sum_f64(&f64, 1, MPI_COMM_WORLD, SPB_PHASE_OTHER); /* host scalars: not staged, no wait */
    spb_comm_set_staging(NULL);
    stage_log[nstage_log] = '\0';
    ck_assert_int_eq(memcmp(plain_out, staged_out, sizeof(float) * out_floats), 0);

    /* Each collective: wait, copy out, copy back; a sendrecv: wait, copy
     * out (start) and wait, copy back (wait). */
    char want[1024] = "";
    for (int i = 0; i < ncalls; i++) strcat(want, ops[i] == SPB_OP_SENDRECV ? "SHSD" : "SHD");
    say("staged log: %s\n", stage_log);
    ck_assert_str_eq(stage_log, want);
    spb_comm_reset();
    free(plain_out);
    free(staged_out);
}
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("comm_device");
    TCase *tc = tcase_create("device");
    tcase_add_test(tc, deferred_times_fold_exactly_once);
    tcase_add_test(tc, staged_collectives_synchronize_first);
    tcase_add_test(tc, device_path_trains_like_mpi);
    tcase_add_test(tc, uneven_device_path_trains_like_mpi);
    tcase_add_test(tc, bf16_device_path_trains_like_staged);
    tcase_add_test(tc, bf16_written_spans_with_masters_are_staged);
    suite_add_tcase(s, tc);
    /* one 16-bit format per process: fp16 in a case (and ctest entry) of its own */
    TCase *fp16 = tcase_create("fp16");
    tcase_add_test(fp16, fp16_device_path_trains_like_staged);
    suite_add_tcase(s, fp16);
    return spb_run_suite_and_finalize(s);
}
