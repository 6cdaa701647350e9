/* Collectives of the shm MPI.  Each moves its data in rounds through the
 * members' slots (slot_bytes each, in the shared segment):
 *
 *   stage my part into my slot; barrier; read what I need from the members'
 *   slots; barrier (after which every slot may be written again)
 *
 * so a message of any size goes through in ceil(bytes / room) rounds.
 * Reductions add in rank order 0..n-1: ((x0 + x1) + x2) + ..., each element
 * computed once (or, for small counts, by every rank in the same order), so
 * every rank gets the same bits whatever the timing.  Every collective makes
 * at least one round, and in it checks that all members called the same
 * collective with the same size and root: a mismatch is reported instead of
 * hanging or corrupting memory. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "shm_internal.h"

enum coll_kind { COLL_BCAST = 1, COLL_ALLREDUCE, COLL_ALLGATHER, COLL_ALLTOALL, COLL_REDUCE_SCATTER };
static const char *const coll_name[] = {"?", "MPI_Bcast", "MPI_Allreduce", "MPI_Allgather", "MPI_Alltoall",
                                        "MPI_Reduce_scatter_block"};

/* Below this many bytes per round, every rank reduces the whole round
 * itself: one barrier less, the same bits. */
enum { SMALL_REDUCE_BYTES = 64 * 1024 };

static char *slot_of(MPI_Comm c, int member) { return spb_shm_slot(spb_shm, c->world_of[member]); }
static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
static size_t rounds_for(size_t total, size_t per) { return total == 0 ? 1 : (total + per - 1) / per; }

/* ---- matching ------------------------------------------------------------ */

static void publish(MPI_Comm c, int kind, int root, int op, size_t bytes)
{
    spb_shm_rank_of(spb_shm, spb_shm_me)->desc =
        (spb_shm_coll_desc){.kind = kind, .ctx = c->ctx, .root = root, .op = op, .bytes = bytes};
}

/* After the first barrier of a collective (descriptors stay until the last
 * one, which no member passes before all have checked). */
static int verify(MPI_Comm c)
{
    const spb_shm_coll_desc *mine = &spb_shm_rank_of(spb_shm, spb_shm_me)->desc;
    for (int m = 0; m < c->size; m++) {
        const spb_shm_coll_desc *o = &spb_shm_rank_of(spb_shm, c->world_of[m])->desc;
        if (o->kind != mine->kind || o->ctx != mine->ctx || o->root != mine->root || o->op != mine->op ||
            o->bytes != mine->bytes)
            return SHM_FAIL(c, MPI_ERR_ARG,
                            "%s (%llu bytes, root %d, op %d) here, but rank %d of this communicator called %s "
                            "(%llu bytes, root %d, op %d): mismatched collectives",
                            coll_name[mine->kind], (unsigned long long)mine->bytes, mine->root, mine->op, m,
                            o->kind > 0 && o->kind <= COLL_REDUCE_SCATTER ? coll_name[o->kind] : "?",
                            (unsigned long long)o->bytes, o->root, o->op);
    }
    return MPI_SUCCESS;
}

/* Round 0's first barrier, with the check. */
static int first_sync(MPI_Comm c, size_t round)
{
    spb_shm_sync(c);
    return round == 0 ? verify(c) : MPI_SUCCESS;
}

/* ---- reductions ---------------------------------------------------------- */

typedef struct { double v; int i; } double_int;
typedef struct { int v, i; } two_int;

static int valid_reduction(MPI_Datatype t, MPI_Op op)
{
    switch (op) {
    case MPI_SUM:
    case MPI_MAX:
    case MPI_MIN:
        return t == MPI_INT || t == MPI_LONG || t == MPI_LONG_LONG || t == MPI_UNSIGNED_LONG || t == MPI_FLOAT ||
               t == MPI_DOUBLE;
    case MPI_MAXLOC:
    case MPI_MINLOC: return t == MPI_DOUBLE_INT || t == MPI_2INT;
    default: return 0;
    }
}

#define REDUCE_ARITH(T)                                                                                                \
    do {                                                                                                               \
        T *a = acc;                                                                                                    \
        const T *b = in;                                                                                               \
        if (op == MPI_SUM)                                                                                             \
            for (size_t i = 0; i < n; i++) a[i] += b[i];                                                               \
        else if (op == MPI_MAX)                                                                                        \
            for (size_t i = 0; i < n; i++) a[i] = b[i] > a[i] ? b[i] : a[i];                                           \
        else                                                                                                           \
            for (size_t i = 0; i < n; i++) a[i] = b[i] < a[i] ? b[i] : a[i];                                           \
    } while (0)

/* MPI's rule: the larger (smaller) value; on a tie, the lower index. */
#define REDUCE_LOC(T)                                                                                                  \
    do {                                                                                                               \
        T *a = acc;                                                                                                    \
        const T *b = in;                                                                                               \
        for (size_t i = 0; i < n; i++) {                                                                               \
            int better = op == MPI_MAXLOC ? b[i].v > a[i].v : b[i].v < a[i].v;                                         \
            if (better || (b[i].v == a[i].v && b[i].i < a[i].i)) a[i] = b[i];                                          \
        }                                                                                                              \
    } while (0)

/* acc[i] = acc[i] op in[i] for n elements. */
static void combine(void *acc, const void *in, size_t n, MPI_Datatype t, MPI_Op op)
{
    switch (t) {
    case MPI_INT: REDUCE_ARITH(int); break;
    case MPI_LONG: REDUCE_ARITH(long); break;
    case MPI_LONG_LONG: REDUCE_ARITH(long long); break;
    case MPI_UNSIGNED_LONG: REDUCE_ARITH(unsigned long); break;
    case MPI_FLOAT: REDUCE_ARITH(float); break;
    case MPI_DOUBLE: REDUCE_ARITH(double); break;
    case MPI_DOUBLE_INT: REDUCE_LOC(double_int); break;
    case MPI_2INT: REDUCE_LOC(two_int); break;
    default: break; /* refused by valid_reduction */
    }
}

/* out = in(member 0) op in(member 1) op ... for n elements at byte offset at
 * of each member's slot. */
static void reduce_members(MPI_Comm c, void *out, size_t at, size_t n, size_t e, MPI_Datatype t, MPI_Op op)
{
    if (n == 0) return;
    memcpy(out, slot_of(c, 0) + at, n * e);
    for (int m = 1; m < c->size; m++) combine(out, slot_of(c, m) + at, n, t, op);
}

static int check_reduce(MPI_Comm c, const char *fn, int count, MPI_Datatype t, MPI_Op op)
{
    if (count < 0) return SHM_FAIL(c, MPI_ERR_COUNT, "%s: count %d", fn, count);
    if (!spb_shm_type_size(t)) return SHM_FAIL(c, MPI_ERR_TYPE, "%s: unknown datatype %d", fn, t);
    if (!valid_reduction(t, op))
        return SHM_FAIL(c, MPI_ERR_OP, "%s: op %d is not defined on datatype %d here", fn, op, t);
    return MPI_SUCCESS;
}

int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype t, MPI_Op op, MPI_Comm c)
{
    SHM_ENTER(c, "MPI_Allreduce");
    int rc = check_reduce(c, "MPI_Allreduce", count, t, op);
    if (rc) return rc;
    const size_t e = spb_shm_type_size(t), total = (size_t)count, n = (size_t)c->size;
    const char *in = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
    char *out = recvbuf;
    if (c->size == 1) {
        if (in != out) memmove(out, in, total * e);
        return MPI_SUCCESS;
    }
    /* Slot halves: inputs, and each member's reduced share of the round. */
    const size_t half = spb_shm->slot_bytes / 2, per = half / e;
    char *mine = spb_shm_slot(spb_shm, spb_shm_me);
    const size_t rounds = rounds_for(total, per);
    for (size_t r = 0, off = 0; r < rounds; r++, off += per) {
        size_t k = min_size(per, total - off);
        memcpy(mine, in + off * e, k * e);
        if (r == 0) publish(c, COLL_ALLREDUCE, 0, op, total * e);
        if ((rc = first_sync(c, r))) return rc;
        if (k * e * n <= SMALL_REDUCE_BYTES) {
            reduce_members(c, out + off * e, 0, k, e, t, op);
        } else {
            size_t lo = k * (size_t)c->rank / n, hi = k * (size_t)(c->rank + 1) / n;
            reduce_members(c, mine + half + lo * e, lo * e, hi - lo, e, t, op);
            spb_shm_sync(c);
            for (size_t j = 0; j < n; j++) {
                size_t jlo = k * j / n, jhi = k * (j + 1) / n;
                memcpy(out + (off + jlo) * e, slot_of(c, (int)j) + half + jlo * e, (jhi - jlo) * e);
            }
        }
        spb_shm_sync(c);
    }
    return MPI_SUCCESS;
}

int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount, MPI_Datatype t, MPI_Op op,
                             MPI_Comm c)
{
    SHM_ENTER(c, "MPI_Reduce_scatter_block");
    int rc = check_reduce(c, "MPI_Reduce_scatter_block", recvcount, t, op);
    if (rc) return rc;
    const size_t e = spb_shm_type_size(t), total = (size_t)recvcount, n = (size_t)c->size;
    /* In place: the input is recvbuf, the result its first block (written
     * only where this round's input was already staged). */
    const char *in = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
    char *out = recvbuf;
    if (c->size == 1) {
        if (in != out) memmove(out, in, total * e);
        return MPI_SUCCESS;
    }
    /* My slot holds one piece of the block for each member. */
    const size_t per = spb_shm->slot_bytes / n / e;
    char *mine = spb_shm_slot(spb_shm, spb_shm_me);
    const size_t rounds = rounds_for(total, per);
    for (size_t r = 0, off = 0; r < rounds; r++, off += per) {
        size_t k = min_size(per, total - off);
        for (size_t d = 0; d < n; d++) memcpy(mine + d * per * e, in + (d * total + off) * e, k * e);
        if (r == 0) publish(c, COLL_REDUCE_SCATTER, 0, op, total * e);
        if ((rc = first_sync(c, r))) return rc;
        reduce_members(c, out + off * e, (size_t)c->rank * per * e, k, e, t, op);
        spb_shm_sync(c);
    }
    return MPI_SUCCESS;
}

/* ---- data movement -------------------------------------------------------- */

/* Bytes per member of an allgather/alltoall, or an error. */
static int block_bytes(MPI_Comm c, const char *fn, const void *sendbuf, int sendcount, MPI_Datatype sendtype,
                       int recvcount, MPI_Datatype recvtype, size_t *bytes)
{
    size_t re = spb_shm_type_size(recvtype);
    if (recvcount < 0 || !re) return SHM_FAIL(c, MPI_ERR_COUNT, "%s: receive count %d, datatype %d", fn, recvcount,
                                              recvtype);
    *bytes = (size_t)recvcount * re;
    if (sendbuf == MPI_IN_PLACE) return MPI_SUCCESS;
    size_t se = spb_shm_type_size(sendtype);
    if (sendcount < 0 || !se) return SHM_FAIL(c, MPI_ERR_COUNT, "%s: send count %d, datatype %d", fn, sendcount,
                                              sendtype);
    if ((size_t)sendcount * se != *bytes)
        return SHM_FAIL(c, MPI_ERR_TRUNCATE, "%s: sends %zu bytes per rank but receives %zu", fn,
                        (size_t)sendcount * se, *bytes);
    return MPI_SUCCESS;
}

int spb_shm_allgather_bytes(MPI_Comm c, const void *send, size_t bytes, void *recv)
{
    char *out = recv;
    const char *in = send == MPI_IN_PLACE ? out + (size_t)c->rank * bytes : send;
    if (c->size == 1) {
        if (in != out) memmove(out, in, bytes);
        return MPI_SUCCESS;
    }
    const size_t per = spb_shm->slot_bytes;
    char *mine = spb_shm_slot(spb_shm, spb_shm_me);
    const size_t rounds = rounds_for(bytes, per);
    for (size_t r = 0, off = 0; r < rounds; r++, off += per) {
        size_t k = min_size(per, bytes - off);
        memcpy(mine, in + off, k);
        if (r == 0) publish(c, COLL_ALLGATHER, 0, 0, bytes);
        int rc = first_sync(c, r);
        if (rc) return rc;
        for (int m = 0; m < c->size; m++) memcpy(out + (size_t)m * bytes + off, slot_of(c, m), k);
        spb_shm_sync(c);
    }
    return MPI_SUCCESS;
}

int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm c)
{
    SHM_ENTER(c, "MPI_Allgather");
    size_t bytes = 0;
    int rc = block_bytes(c, "MPI_Allgather", sendbuf, sendcount, sendtype, recvcount, recvtype, &bytes);
    if (rc) return rc;
    return spb_shm_allgather_bytes(c, sendbuf, bytes, recvbuf);
}

int MPI_Alltoall(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount,
                 MPI_Datatype recvtype, MPI_Comm c)
{
    SHM_ENTER(c, "MPI_Alltoall");
    size_t bytes = 0;
    int rc = block_bytes(c, "MPI_Alltoall", sendbuf, sendcount, sendtype, recvcount, recvtype, &bytes);
    if (rc) return rc;
    /* In place works as it is: a round overwrites only the pieces it staged. */
    const char *in = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
    char *out = recvbuf;
    const size_t n = (size_t)c->size;
    if (n == 1) {
        if (in != out) memmove(out, in, bytes);
        return MPI_SUCCESS;
    }
    /* My slot holds one piece for each destination. */
    size_t per = spb_shm->slot_bytes / n;
    if (per >= SPB_SHM_LINE) per -= per % SPB_SHM_LINE; /* whole cache lines */
    char *mine = spb_shm_slot(spb_shm, spb_shm_me);
    const size_t rounds = rounds_for(bytes, per);
    for (size_t r = 0, off = 0; r < rounds; r++, off += per) {
        size_t k = min_size(per, bytes - off);
        for (size_t d = 0; d < n; d++) memcpy(mine + d * per, in + d * bytes + off, k);
        if (r == 0) publish(c, COLL_ALLTOALL, 0, 0, bytes);
        if ((rc = first_sync(c, r))) return rc;
        for (size_t m = 0; m < n; m++) memcpy(out + m * bytes + off, slot_of(c, (int)m) + (size_t)c->rank * per, k);
        spb_shm_sync(c);
    }
    return MPI_SUCCESS;
}

int MPI_Bcast(void *buffer, int count, MPI_Datatype t, int root, MPI_Comm c)
{
    SHM_ENTER(c, "MPI_Bcast");
    size_t e = spb_shm_type_size(t);
    if (count < 0 || !e) return SHM_FAIL(c, MPI_ERR_COUNT, "MPI_Bcast: count %d, datatype %d", count, t);
    if (root < 0 || root >= c->size)
        return SHM_FAIL(c, MPI_ERR_ROOT, "MPI_Bcast: root %d of a communicator of %d", root, c->size);
    if (c->size == 1) return MPI_SUCCESS;
    const size_t bytes = (size_t)count * e, per = spb_shm->slot_bytes;
    char *buf = buffer, *from = slot_of(c, root);
    const size_t rounds = rounds_for(bytes, per);
    for (size_t r = 0, off = 0; r < rounds; r++, off += per) {
        size_t k = min_size(per, bytes - off);
        if (c->rank == root) memcpy(from, buf + off, k);
        if (r == 0) publish(c, COLL_BCAST, root, 0, bytes);
        int rc = first_sync(c, r);
        if (rc) return rc;
        if (c->rank != root) memcpy(buf + off, from, k);
        spb_shm_sync(c);
    }
    return MPI_SUCCESS;
}

int MPI_Barrier(MPI_Comm c)
{
    SHM_ENTER(c, "MPI_Barrier");
    spb_shm_sync(c);
    return MPI_SUCCESS;
}
