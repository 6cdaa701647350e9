/* The shm MPI (common/shm_mpi/) against values computed here: every
 * collective (in place and not, sizes that take many rounds), reductions
 * bit-identical to a rank-order sum, sub-communicators whose keys reorder
 * ranks, broadcasts from every root, the ring exchange of Isend/Irecv with
 * two exchanges in flight, Ibarrier, and communicator ids reused past the
 * table's size.  Run by ctest under spbrun with 2 and 4 ranks, with small
 * slots and channels (SPBRUN_SLOT_BYTES, SPBRUN_CHANNEL_BYTES) so that
 * everything goes in many rounds, and with the default sizes and --large.
 *
 *   test_shm_mpi [--large FLOATS]     the checks; exit 0 when all pass
 *   test_shm_mpi --fail MODE          the failure scenarios of
 *                                     tests/shm_mpi_failures.sh
 *
 * Check-free on purpose: it must build where libcheck is missing. */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef SPB_SHM_MPI
#error "test_shm_mpi must be compiled against common/shm_mpi/mpi.h, not the system MPI's"
#endif

static int rank, size, failures;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            if (failures++ < 20) {                                                                                     \
                fprintf(stderr, "test_shm_mpi: rank %d: %s:%d: check failed: %s: ", rank, __FILE__, __LINE__, #cond); \
                fprintf(stderr, __VA_ARGS__);                                                                          \
                fputc('\n', stderr);                                                                                   \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)
#define MPI_OK(call) CHECK((call) == MPI_SUCCESS, "%s", "MPI call returned an error")

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_shm_mpi: %s:%d: out of memory (%zu bytes)\n", __FILE__, __LINE__, n);
        exit(1);
    }
    return p;
}

/* Values that round differently in different summation orders. */
static float fval(int r, size_t i) { return (float)((r + 1) * 0.1234567 + (double)(i % 1013) * 1.37e-3) * (r % 2 ? -1.0f : 1.0f) + 1.0f / (float)(r + 3); }
static double dval(int r, size_t i) { return (r + 1) * 0.7654321 + (double)(i % 977) * 1.1e-7 + 1.0 / (r + 3); }
static int ival(int r, size_t i) { return (int)((r * 7919 + (long)i * 31) % 10007) - 5000; }

static void note(const char *what)
{
    if (rank == 0) printf("  %s\n", what), fflush(stdout);
}

/* ---- reductions ---------------------------------------------------------- */

static void check_allreduce(MPI_Comm c, size_t count, int in_place)
{
    int n, me;
    MPI_Comm_size(c, &n);
    MPI_Comm_rank(c, &me);
    float *f = xmalloc(count * sizeof *f), *fr = xmalloc(count * sizeof *fr);
    double *d = xmalloc(count * sizeof *d);
    int *mx = xmalloc(count * sizeof *mx), *mn = xmalloc(count * sizeof *mn);
    for (size_t i = 0; i < count; i++) f[i] = fval(me, i), d[i] = dval(me, i), mx[i] = mn[i] = ival(me, i);
    if (in_place) {
        MPI_OK(MPI_Allreduce(MPI_IN_PLACE, f, (int)count, MPI_FLOAT, MPI_SUM, c));
        memcpy(fr, f, count * sizeof *f);
    } else {
        MPI_OK(MPI_Allreduce(f, fr, (int)count, MPI_FLOAT, MPI_SUM, c));
    }
    MPI_OK(MPI_Allreduce(MPI_IN_PLACE, d, (int)count, MPI_DOUBLE, MPI_SUM, c));
    MPI_OK(MPI_Allreduce(MPI_IN_PLACE, mx, (int)count, MPI_INT, MPI_MAX, c));
    MPI_OK(MPI_Allreduce(MPI_IN_PLACE, mn, (int)count, MPI_INT, MPI_MIN, c));
    for (size_t i = 0; i < count; i++) {
        float fe = fval(0, i); /* rank order, in float: the same bits */
        double de = dval(0, i);
        int xe = ival(0, i), ne = xe;
        for (int r = 1; r < n; r++) {
            fe += fval(r, i), de += dval(r, i);
            xe = ival(r, i) > xe ? ival(r, i) : xe, ne = ival(r, i) < ne ? ival(r, i) : ne;
        }
        CHECK(fr[i] == fe, "float sum [%zu of %zu]: %.9g, want %.9g (in place %d)", i, count, fr[i], fe, in_place);
        CHECK(d[i] == de, "double sum [%zu of %zu]: %.17g, want %.17g", i, count, d[i], de);
        CHECK(mx[i] == xe && mn[i] == ne, "int max/min [%zu]: %d %d, want %d %d", i, mx[i], mn[i], xe, ne);
        if (failures > 20) break;
    }
    free(f), free(fr), free(d), free(mx), free(mn);
}

static void check_small_reductions(MPI_Comm c)
{
    int n, me;
    MPI_Comm_size(c, &n);
    MPI_Comm_rank(c, &me);
    long l = 1000000000L * (me + 1);
    MPI_OK(MPI_Allreduce(MPI_IN_PLACE, &l, 1, MPI_LONG, MPI_SUM, c));
    CHECK(l == 1000000000L * n * (n + 1) / 2, "long sum %ld", l);
    /* MAXLOC: the largest value, ties to the lowest rank. */
    struct { double v; int i; } mine = {me == n - 1 ? 5.0 : (me % 2 ? 5.0 : 1.0), me}, best;
    MPI_OK(MPI_Allreduce(&mine, &best, 1, MPI_DOUBLE_INT, MPI_MAXLOC, c));
    int want = n == 1 ? 0 : 1;
    CHECK(best.v == 5.0 && best.i == want, "MAXLOC (%g, %d), want (5, %d)", best.v, best.i, want);
    mine.v = -mine.v;
    MPI_OK(MPI_Allreduce(&mine, &best, 1, MPI_DOUBLE_INT, MPI_MINLOC, c));
    CHECK(best.v == -5.0 && best.i == want, "MINLOC (%g, %d)", best.v, best.i);
}

static void check_reduce_scatter(MPI_Comm c, size_t count, int in_place)
{
    int n, me;
    MPI_Comm_size(c, &n);
    MPI_Comm_rank(c, &me);
    float *send = xmalloc((size_t)n * count * sizeof *send), *recv = xmalloc(count * sizeof *recv);
    for (size_t i = 0; i < (size_t)n * count; i++) send[i] = fval(me, i);
    if (in_place) {
        MPI_OK(MPI_Reduce_scatter_block(MPI_IN_PLACE, send, (int)count, MPI_FLOAT, MPI_SUM, c));
        memcpy(recv, send, count * sizeof *recv);
    } else {
        MPI_OK(MPI_Reduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, c));
    }
    for (size_t i = 0; i < count; i++) {
        size_t at = (size_t)me * count + i;
        float e = fval(0, at);
        for (int r = 1; r < n; r++) e += fval(r, at);
        CHECK(recv[i] == e, "reduce_scatter [%zu of %zu]: %.9g, want %.9g (in place %d)", i, count, recv[i], e,
              in_place);
        if (failures > 20) break;
    }
    free(send), free(recv);
}

/* ---- data movement -------------------------------------------------------- */

static int code(int from, int to, size_t i) { return from * 1000003 + to * 10007 + (int)(i % 9973); }

static void check_allgather(MPI_Comm c, size_t count, int in_place)
{
    int n, me;
    MPI_Comm_size(c, &n);
    MPI_Comm_rank(c, &me);
    int *send = xmalloc(count * sizeof *send), *recv = xmalloc((size_t)n * count * sizeof *recv);
    for (size_t i = 0; i < count; i++) send[i] = code(me, 0, i);
    for (size_t i = 0; i < (size_t)n * count; i++) recv[i] = -1;
    if (in_place) {
        memcpy(recv + (size_t)me * count, send, count * sizeof *send);
        MPI_OK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)count, MPI_INT, c));
    } else {
        MPI_OK(MPI_Allgather(send, (int)count, MPI_INT, recv, (int)count, MPI_INT, c));
    }
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            CHECK(recv[(size_t)r * count + i] == code(r, 0, i), "allgather block %d [%zu of %zu] (in place %d)", r, i,
                  count, in_place);
    free(send), free(recv);
}

static void check_alltoall(MPI_Comm c, size_t count, int in_place)
{
    int n, me;
    MPI_Comm_size(c, &n);
    MPI_Comm_rank(c, &me);
    size_t all = (size_t)n * count;
    int *send = xmalloc(all * sizeof *send), *recv = xmalloc(all * sizeof *recv);
    for (int d = 0; d < n; d++)
        for (size_t i = 0; i < count; i++) send[(size_t)d * count + i] = code(me, d, i);
    if (in_place) {
        memcpy(recv, send, all * sizeof *send);
        MPI_OK(MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)count, MPI_INT, c));
    } else {
        /* Bytes on the send side, ints on the receive side: same signature. */
        MPI_OK(MPI_Alltoall(send, (int)(count * sizeof(int)), MPI_BYTE, recv, (int)count, MPI_INT, c));
    }
    int bad = 0;
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++) bad += recv[(size_t)r * count + i] != code(r, me, i);
    CHECK(bad == 0, "alltoall of %zu per rank: %d wrong (in place %d)", count, bad, in_place);
    free(send), free(recv);
}

static void check_bcast(MPI_Comm c, size_t count)
{
    int n, me;
    MPI_Comm_size(c, &n);
    MPI_Comm_rank(c, &me);
    double *buf = xmalloc(count * sizeof *buf);
    for (int root = n - 1; root >= 0; root--) { /* the last root first: non-zero roots matter */
        for (size_t i = 0; i < count; i++) buf[i] = me == root ? dval(root, i) : -1.0;
        MPI_OK(MPI_Bcast(buf, (int)count, MPI_DOUBLE, root, c));
        int bad = 0;
        for (size_t i = 0; i < count; i++) bad += buf[i] != dval(root, i);
        CHECK(bad == 0, "bcast of %zu from root %d: %d wrong", count, root, bad);
    }
    free(buf);
}

static void check_collectives(MPI_Comm c, const size_t *counts, int ncounts)
{
    for (int k = 0; k < ncounts; k++)
        for (int in_place = 0; in_place < 2; in_place++) {
            check_allreduce(c, counts[k], in_place);
            check_reduce_scatter(c, counts[k], in_place);
            check_allgather(c, counts[k], in_place);
            check_alltoall(c, counts[k], in_place);
        }
    for (int k = 0; k < ncounts; k++) check_bcast(c, counts[k]);
    check_small_reductions(c);
}

/* ---- communicators -------------------------------------------------------- */

static void check_split(const size_t *counts, int ncounts)
{
    /* Colours by parity, keys reversing the world order. */
    MPI_Comm sub;
    MPI_OK(MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &sub));
    int n, me, want_n = (size - rank % 2 + 1) / 2;
    MPI_Comm_size(sub, &n);
    MPI_Comm_rank(sub, &me);
    int want_me = 0; /* same-parity ranks above me come first */
    for (int r = rank + 2; r < size; r += 2) want_me++;
    CHECK(n == want_n && me == want_me, "split: size %d rank %d, want %d %d", n, me, want_n, want_me);
    int *world = xmalloc(sizeof(int) * (size_t)n);
    MPI_OK(MPI_Allgather(&rank, 1, MPI_INT, world, 1, MPI_INT, sub));
    for (int i = 0; i < n; i++)
        CHECK(world[i] == (size - 1 - (size - 1 - rank % 2) % 2) - 2 * i, "split member %d is world rank %d", i,
              world[i]);
    free(world);
    /* The two halves run their collectives at the same time. */
    check_collectives(sub, counts, ncounts);

    /* A split of the split, and a dup of it. */
    MPI_Comm subsub, dup;
    MPI_OK(MPI_Comm_split(sub, me == 0, me, &subsub));
    MPI_OK(MPI_Comm_dup(sub, &dup));
    int a = rank, b = rank;
    MPI_OK(MPI_Allreduce(MPI_IN_PLACE, &a, 1, MPI_INT, MPI_SUM, subsub));
    MPI_OK(MPI_Allreduce(MPI_IN_PLACE, &b, 1, MPI_INT, MPI_SUM, dup));
    int want_b = 0;
    for (int r = rank % 2; r < size; r += 2) want_b += r;
    CHECK(b == want_b, "dup of split: sum %d, want %d", b, want_b);
    int want_a = me == 0 ? rank : want_b - (size - 1 - (size - 1 - rank % 2) % 2);
    CHECK(a == want_a, "split of split: sum %d, want %d", a, want_a);
    MPI_OK(MPI_Comm_free(&subsub));
    MPI_OK(MPI_Comm_free(&dup));
    MPI_OK(MPI_Comm_free(&sub));
    CHECK(sub == MPI_COMM_NULL, "%s", "freed communicator not MPI_COMM_NULL");

    /* MPI_UNDEFINED: no communicator. */
    MPI_Comm none;
    MPI_OK(MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? 0 : MPI_UNDEFINED, 0, &none));
    CHECK((rank == 0) == (none != MPI_COMM_NULL), "%s", "MPI_UNDEFINED colour");
    if (none != MPI_COMM_NULL) MPI_OK(MPI_Comm_free(&none));

    /* Shared-memory split: everyone is local. */
    MPI_Comm local;
    MPI_OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local));
    MPI_Comm_size(local, &n);
    MPI_Comm_rank(local, &me);
    CHECK(n == size && me == rank, "split_type: %d of %d", me, n);
    MPI_OK(MPI_Comm_free(&local));

    /* MPI_COMM_SELF and its dup: one rank, collectives are copies. */
    float x = 3.0f, y = 0.0f;
    MPI_OK(MPI_Allreduce(&x, &y, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_SELF));
    MPI_Comm self;
    MPI_OK(MPI_Comm_dup(MPI_COMM_SELF, &self));
    MPI_Comm_size(self, &n);
    CHECK(y == 3.0f && n == 1, "COMM_SELF: %g, size %d", y, n);
    MPI_OK(MPI_Comm_free(&self));
}

/* More communicators created and freed than the table holds: ids reused. */
static void check_comm_churn(int times)
{
    for (int i = 0; i < times; i++) {
        MPI_Comm c;
        MPI_OK(MPI_Comm_dup(MPI_COMM_WORLD, &c));
        int v = 1;
        MPI_OK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_SUM, c));
        CHECK(v == size, "churn %d: %d", i, v);
        MPI_OK(MPI_Comm_free(&c));
        if (failures > 20) break;
    }
}

/* ---- point to point -------------------------------------------------------- */

/* The ring exchange (common/runtime/comm.c's spb_sendrecv): Irecv from the previous
 * rank, Isend to the next, two exchanges in flight, then wait. */
static void check_ring(MPI_Comm c, size_t count)
{
    int n, me;
    MPI_Comm_size(c, &n);
    MPI_Comm_rank(c, &me);
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    float *kv = xmalloc(count * sizeof(float)), *kv_in = xmalloc(count * sizeof(float));
    float *g = xmalloc(count * sizeof(float)), *g_in = xmalloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) kv[i] = fval(me, i), g[i] = fval(me + 100, i), kv_in[i] = g_in[i] = -1.0f;
    MPI_Request a[2], b[2];
    MPI_OK(MPI_Irecv(kv_in, (int)count, MPI_FLOAT, prev, 0, c, &a[0]));
    MPI_OK(MPI_Isend(kv, (int)count, MPI_FLOAT, next, 0, c, &a[1]));
    MPI_OK(MPI_Irecv(g_in, (int)count, MPI_FLOAT, prev, 0, c, &b[0]));
    MPI_OK(MPI_Isend(g, (int)count, MPI_FLOAT, next, 0, c, &b[1]));
    MPI_OK(MPI_Waitall(2, a, MPI_STATUSES_IGNORE));
    CHECK(a[0] == MPI_REQUEST_NULL && a[1] == MPI_REQUEST_NULL, "%s", "Waitall leaves MPI_REQUEST_NULL");
    /* The second exchange by Test, then Wait. */
    int done = 0;
    for (int spins = 0; !done && spins < 1000; spins++) MPI_OK(MPI_Test(&b[0], &done, MPI_STATUS_IGNORE));
    MPI_Status st;
    MPI_OK(MPI_Wait(&b[0], &st));
    MPI_OK(MPI_Wait(&b[1], MPI_STATUS_IGNORE));
    CHECK(done || st.MPI_SOURCE == prev, "status source %d, want %d", st.MPI_SOURCE, prev);
    int bad = 0;
    for (size_t i = 0; i < count; i++) bad += kv_in[i] != fval(prev, i) || g_in[i] != fval(prev + 100, i);
    CHECK(bad == 0, "ring of %zu floats: %d wrong", count, bad);
    free(kv), free(kv_in), free(g), free(g_in);
}

static void check_ibarrier(void)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL);
    MPI_Request req;
    MPI_OK(MPI_Ibarrier(MPI_COMM_WORLD, &req));
    int done = 0;
    MPI_OK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    CHECK(size == 1 || rank == 0 || !done, "%s", "Ibarrier complete before rank 0 arrived");
    while (!done) {
        MPI_OK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (!done) nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    }
    CHECK(req == MPI_REQUEST_NULL, "%s", "Test leaves MPI_REQUEST_NULL");
}

/* ---- failure scenarios (tests/shm_mpi_failures.sh) ------------------------ */

static int run_failure(const char *mode)
{
    float *buf = xmalloc(sizeof(float) << 20);
    memset(buf, 0, sizeof(float) << 20);
    if (!strcmp(mode, "kill")) { /* rank 1 dies while the others wait in a collective */
        for (int i = 0;; i++) {
            if (rank == 1 && i == 20) raise(SIGKILL);
            MPI_Allreduce(MPI_IN_PLACE, buf, 1 << 20, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
    }
    if (!strcmp(mode, "spin")) { /* collectives until killed from outside; pid files first */
        const char *dir = getenv("SHM_TEST_PIDDIR");
        if (dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s/rank%d.pid", dir, rank);
            FILE *f = fopen(path, "w");
            if (f) fprintf(f, "%d\n", (int)getpid()), fclose(f);
        }
        for (;;) {
            MPI_Allreduce(MPI_IN_PLACE, buf, 1 << 20, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (1 << 20) / size, MPI_FLOAT, MPI_COMM_WORLD);
        }
    }
    if (!strcmp(mode, "abort")) { /* MPI_Abort while the others wait */
        if (rank == 1) {
            nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
            MPI_Abort(MPI_COMM_WORLD, 5);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        return 0;
    }
    if (!strcmp(mode, "exit2")) { /* the normal error path: all finalize, all exit 2 */
        MPI_Finalize();
        return 2;
    }
    if (!strcmp(mode, "exit3-one")) { /* one rank leaves with 3, the others wait in a barrier */
        if (rank == 1) exit(3);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Finalize();
        return 0;
    }
    if (!strcmp(mode, "no-finalize")) { /* rank 1 leaves "successfully" without finalizing */
        if (rank == 1) exit(0);
        MPI_Finalize();
        return 0;
    }
    if (!strcmp(mode, "mismatch")) { /* collectives of different sizes: reported, not a hang */
        MPI_Allreduce(MPI_IN_PLACE, buf, rank == 0 ? 10 : 11, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Finalize();
        return 0;
    }
    if (!strcmp(mode, "env")) { /* spbrun -x FOO=bar reached the ranks */
        const char *v = getenv("SHM_TEST_FOO");
        int ok = v && !strcmp(v, "bar");
        MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Finalize();
        return ok ? 0 : 1;
    }
    fprintf(stderr, "test_shm_mpi: unknown --fail mode %s\n", mode);
    MPI_Finalize();
    return 2;
}

int main(int argc, char **argv)
{
    MPI_OK(MPI_Init(&argc, &argv));
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc == 3 && !strcmp(argv[1], "--fail")) return run_failure(argv[2]);
    size_t large = argc == 3 && !strcmp(argv[1], "--large") ? (size_t)atol(argv[2]) : 0;

    int flag = 0;
    MPI_Initialized(&flag);
    CHECK(flag == 1, "%s", "MPI_Initialized");
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(MPI_ERR_TRUNCATE, msg, &len);
    CHECK(len > 0 && strstr(msg, "TRUNCATE"), "MPI_Error_string: %s", msg);
    double t0 = MPI_Wtime();

    /* Sizes around the round sizes of small slots (a few KiB) and above. */
    const size_t counts[] = {0, 1, 7, 1000, 3000, 50000};
    const int ncounts = large ? 2 : (int)(sizeof counts / sizeof *counts);
    note("collectives on MPI_COMM_WORLD");
    check_collectives(MPI_COMM_WORLD, counts, ncounts);
    note("Comm_split (colours, reversing keys), nested split, dup, MPI_UNDEFINED, split_type, COMM_SELF");
    check_split(counts, ncounts);
    note("ring Isend/Irecv, two exchanges in flight");
    for (int k = 0; k < ncounts; k++) check_ring(MPI_COMM_WORLD, counts[k]);
    check_ring(MPI_COMM_WORLD, 300000); /* more than a small channel */
    check_ring(MPI_COMM_SELF, 1000);
    note("Ibarrier and Test");
    check_ibarrier();
    if (large) {
        note("large messages (many rounds of the default slot)");
        size_t per = large / (size_t)size;
        check_allreduce(MPI_COMM_WORLD, large, 1);
        check_reduce_scatter(MPI_COMM_WORLD, per, 0);
        check_allgather(MPI_COMM_WORLD, per, 1);
        check_alltoall(MPI_COMM_WORLD, per, 0);
        check_bcast(MPI_COMM_WORLD, large / 2);
        check_ring(MPI_COMM_WORLD, large / 2);
    } else {
        note("communicator ids reused past the table (4096)");
        check_comm_churn(4200);
    }
    CHECK(MPI_Wtime() >= t0, "%s", "MPI_Wtime goes forward");

    int total = failures;
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("test_shm_mpi: %d ranks: %s (%d failed checks)\n", size, total ? "FAIL" : "ok", total);
    MPI_Finalize();
    MPI_Finalized(&flag);
    return total || !flag ? 1 : 0;
}
