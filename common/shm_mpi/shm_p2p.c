/* Non-blocking point-to-point messages and MPI_Ibarrier of the shm MPI.
 *
 * Each ordered pair of ranks (src, dst) has a one-way byte ring of
 * channel_bytes in the shared segment: src alone advances its head, dst alone
 * its tail.  A message is a 16-byte header (size, communicator id, tag)
 * followed by the payload; messages larger than the ring stream through it
 * while both sides progress.  Requests are progressed, in the order they
 * were posted, whenever this rank is inside MPI_Isend/Irecv/Test/Wait*: a
 * send moves only after the earlier sends to the same rank, a receive after
 * the earlier receives from it, so messages between two ranks match in the
 * order they were sent.  That serves the ring exchange (Irecv from the
 * previous rank, Isend to the next, work, Waitall) with any number of
 * exchanges in flight, without deadlock: nobody waits for a receive to be
 * posted before sending. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "shm_internal.h"

typedef struct {
    uint64_t bytes;
    int32_t ctx, tag;
} msg_header;

enum req_kind { REQ_SEND, REQ_RECV, REQ_BARRIER };

struct spb_shm_request {
    enum req_kind kind;
    MPI_Comm comm;
    int peer;        /* world rank of the other side */
    int peer_rank;   /* its rank in comm */
    int tag;
    char *buf;
    size_t bytes;    /* payload; for a receive, its room until the header comes */
    size_t moved;    /* bytes of header + payload through the ring so far */
    msg_header hdr;
    uint64_t epoch;  /* barrier: the arrival to wait for */
    int complete, error;
    struct spb_shm_request *next;
};

static struct spb_shm_request *pending, **pending_end = &pending;

static void enqueue(struct spb_shm_request *r)
{
    r->next = NULL;
    *pending_end = r;
    pending_end = &r->next;
}

static void release(struct spb_shm_request *r)
{
    struct spb_shm_request **p = &pending;
    while (*p && *p != r) p = &(*p)->next;
    if (*p) *p = r->next;
    if (pending_end == &r->next) pending_end = p;
    free(r);
}

int spb_shm_p2p_pending(void) { return pending != NULL; }

/* Copies n bytes in or out of a ring of q bytes at stream position at. */
static void ring_put(char *ring, uint64_t q, uint64_t at, const char *src, size_t n)
{
    size_t pos = (size_t)(at % q), first = n < q - pos ? n : (size_t)(q - pos);
    memcpy(ring + pos, src, first);
    memcpy(ring, src + first, n - first);
}

static void ring_get(const char *ring, uint64_t q, uint64_t at, char *dst, size_t n)
{
    size_t pos = (size_t)(at % q), first = n < q - pos ? n : (size_t)(q - pos);
    memcpy(dst, ring + pos, first);
    memcpy(dst + first, ring, n - first);
}

/* Moves what fits of a send into its ring; non-zero when bytes moved. */
static int push(struct spb_shm_request *r)
{
    spb_shm_channel *ch = spb_shm_channel_of(spb_shm, spb_shm_me, r->peer);
    char *ring = spb_shm_channel_data(spb_shm, spb_shm_me, r->peer);
    const uint64_t q = spb_shm->channel_bytes;
    uint64_t head = atomic_load_explicit(&ch->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_acquire);
    size_t room = (size_t)(q - (head - tail)), start = room;
    if (r->moved < sizeof r->hdr) {
        size_t n = sizeof r->hdr - r->moved;
        if (n > room) n = room;
        ring_put(ring, q, head, (const char *)&r->hdr + r->moved, n);
        head += n, room -= n, r->moved += n;
    }
    if (r->moved >= sizeof r->hdr) {
        size_t done = r->moved - sizeof r->hdr, n = r->bytes - done;
        if (n > room) n = room;
        ring_put(ring, q, head, r->buf + done, n);
        head += n, room -= n, r->moved += n;
        r->complete = r->moved == sizeof r->hdr + r->bytes;
    }
    if (room == start) return 0;
    atomic_store_explicit(&ch->head, head, memory_order_release);
    spb_shm_ring(spb_shm, r->peer);
    return 1;
}

/* The header of a receive's message: does it fit what was posted? */
static void check_header(struct spb_shm_request *r)
{
    const msg_header *h = &r->hdr;
    if (h->ctx != r->comm->ctx || (r->tag != MPI_ANY_TAG && h->tag != r->tag))
        r->error = SHM_FAIL(r->comm, MPI_ERR_OTHER,
                            "MPI_Irecv from rank %d (tag %d): the next message from it has tag %d%s; the shm MPI "
                            "matches messages between two ranks in the order they were sent",
                            r->peer_rank, r->tag, h->tag, h->ctx != r->comm->ctx ? " on another communicator" : "");
    else if (h->bytes > r->bytes)
        r->error = SHM_FAIL(r->comm, MPI_ERR_TRUNCATE, "MPI_Irecv from rank %d: message of %llu bytes, room for %zu",
                            r->peer_rank, (unsigned long long)h->bytes, r->bytes);
    else
        r->bytes = (size_t)h->bytes;
}

/* Takes what has arrived of a receive; non-zero when bytes moved. */
static int pull(struct spb_shm_request *r)
{
    spb_shm_channel *ch = spb_shm_channel_of(spb_shm, r->peer, spb_shm_me);
    const char *ring = spb_shm_channel_data(spb_shm, r->peer, spb_shm_me);
    const uint64_t q = spb_shm->channel_bytes;
    uint64_t head = atomic_load_explicit(&ch->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&ch->tail, memory_order_relaxed);
    size_t avail = (size_t)(head - tail), start = avail;
    if (r->moved == 0) { /* the header whole, or nothing */
        if (avail < sizeof r->hdr) return 0;
        ring_get(ring, q, tail, (char *)&r->hdr, sizeof r->hdr);
        tail += sizeof r->hdr, avail -= sizeof r->hdr, r->moved = sizeof r->hdr;
        check_header(r);
        if (r->error) {
            r->complete = 1;
            return 1;
        }
    }
    size_t done = r->moved - sizeof r->hdr, n = r->bytes - done;
    if (n > avail) n = avail;
    ring_get(ring, q, tail, r->buf + done, n);
    tail += n, avail -= n, r->moved += n;
    r->complete = r->moved == sizeof r->hdr + r->bytes;
    if (avail == start) return 0;
    atomic_store_explicit(&ch->tail, tail, memory_order_release);
    spb_shm_ring(spb_shm, r->peer);
    return 1;
}

int spb_shm_p2p_progress(void)
{
    static unsigned char *blocked; /* [0, n): a send to r waits; [n, 2n): a receive from r waits */
    const int n = spb_shm->nranks;
    if (!blocked && !(blocked = malloc(2 * (size_t)n))) return 0;
    memset(blocked, 0, 2 * (size_t)n);
    int moved = 0;
    for (struct spb_shm_request *r = pending; r; r = r->next) {
        if (r->complete) continue;
        if (r->kind == REQ_BARRIER) {
            if ((r->complete = spb_shm_all_arrived(r->comm, r->epoch))) moved = 1;
            continue;
        }
        unsigned char *b = &blocked[r->kind == REQ_SEND ? r->peer : n + r->peer];
        if (*b) continue;
        moved |= r->kind == REQ_SEND ? push(r) : pull(r);
        if (!r->complete) *b = 1;
    }
    return moved;
}

static int post(enum req_kind kind, void *buf, int count, MPI_Datatype t, int peer, int tag, MPI_Comm c,
                MPI_Request *request, const char *fn)
{
    size_t e = spb_shm_type_size(t);
    if (count < 0 || !e) return SHM_FAIL(c, MPI_ERR_COUNT, "%s: count %d, datatype %d", fn, count, t);
    if (peer < 0 || peer >= c->size)
        return SHM_FAIL(c, MPI_ERR_RANK, "%s: rank %d of a communicator of %d (MPI_ANY_SOURCE is not supported)", fn,
                        peer, c->size);
    if (tag < 0 && !(kind == REQ_RECV && tag == MPI_ANY_TAG))
        return SHM_FAIL(c, MPI_ERR_ARG, "%s: tag %d", fn, tag);
    struct spb_shm_request *r = calloc(1, sizeof *r);
    if (!r) return SHM_FAIL(c, MPI_ERR_OTHER, "%s: out of memory", fn);
    *r = (struct spb_shm_request){.kind = kind, .comm = c, .peer = c->world_of[peer], .peer_rank = peer,
                                  .tag = tag, .buf = buf, .bytes = (size_t)count * e};
    if (kind == REQ_SEND) r->hdr = (msg_header){.bytes = r->bytes, .ctx = c->ctx, .tag = tag};
    enqueue(r);
    *request = r;
    spb_shm_p2p_progress();
    return MPI_SUCCESS;
}

int MPI_Isend(const void *buf, int count, MPI_Datatype t, int dest, int tag, MPI_Comm c, MPI_Request *request)
{
    SHM_ENTER(c, "MPI_Isend");
    return post(REQ_SEND, (void *)buf, count, t, dest, tag, c, request, "MPI_Isend");
}

int MPI_Irecv(void *buf, int count, MPI_Datatype t, int source, int tag, MPI_Comm c, MPI_Request *request)
{
    SHM_ENTER(c, "MPI_Irecv");
    return post(REQ_RECV, buf, count, t, source, tag, c, request, "MPI_Irecv");
}

int MPI_Ibarrier(MPI_Comm c, MPI_Request *request)
{
    SHM_ENTER(c, "MPI_Ibarrier");
    struct spb_shm_request *r = calloc(1, sizeof *r);
    if (!r) return SHM_FAIL(c, MPI_ERR_OTHER, "MPI_Ibarrier: out of memory");
    r->kind = REQ_BARRIER;
    r->comm = c;
    r->epoch = spb_shm_arrive(c); /* arriving never blocks; completion is everyone having arrived */
    r->complete = spb_shm_all_arrived(c, r->epoch);
    enqueue(r);
    *request = r;
    return MPI_SUCCESS;
}

/* Hands a completed request back to the caller: status, error, freed. */
static int finish(MPI_Request *request, MPI_Status *status)
{
    struct spb_shm_request *r = *request;
    int err = r->error;
    if (status) {
        status->MPI_SOURCE = r->kind == REQ_BARRIER ? 0 : r->peer_rank;
        status->MPI_TAG = r->kind == REQ_RECV ? r->hdr.tag : r->tag;
        status->MPI_ERROR = err;
        status->count_bytes = (int)r->bytes;
    }
    release(r);
    *request = MPI_REQUEST_NULL;
    return err;
}

struct wait_set { MPI_Request *reqs; int n; };

static int all_complete(void *p)
{
    struct wait_set *w = p;
    spb_shm_p2p_progress();
    for (int i = 0; i < w->n; i++)
        if (w->reqs[i] && !w->reqs[i]->complete) return 0;
    return 1;
}

int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[])
{
    SHM_ENTER(MPI_COMM_WORLD, "MPI_Waitall");
    struct wait_set w = {requests, count};
    spb_shm_wait(all_complete, &w);
    int rc = MPI_SUCCESS;
    for (int i = 0; i < count; i++) {
        if (!requests[i]) continue;
        int err = finish(&requests[i], statuses ? &statuses[i] : NULL);
        if (err) rc = err;
    }
    return rc;
}

int MPI_Wait(MPI_Request *request, MPI_Status *status)
{
    SHM_ENTER(MPI_COMM_WORLD, "MPI_Wait");
    if (!*request) return MPI_SUCCESS;
    struct wait_set w = {request, 1};
    spb_shm_wait(all_complete, &w);
    return finish(request, status);
}

int MPI_Test(MPI_Request *request, int *flag, MPI_Status *status)
{
    SHM_ENTER(MPI_COMM_WORLD, "MPI_Test");
    *flag = 1;
    if (!*request) return MPI_SUCCESS;
    spb_shm_p2p_progress();
    if (!(*request)->complete) {
        *flag = 0;
        return MPI_SUCCESS;
    }
    return finish(request, status);
}
