/* The shared segment of the shm MPI: one memfd mapping that spbrun creates
 * and every rank maps (its descriptor number travels in SPBRUN_FD).  Only
 * offsets are stored in it, since each process maps it at its own address.
 *
 *   header        sizes, offsets, the abort flag and code, the table of
 *                 communicator ids (reference counts) and its lock
 *   ranks[n]      per rank: a doorbell (futex word) and whether it sleeps on
 *                 it, its life state, its pid, the descriptor of the
 *                 collective it is in (to catch mismatched calls)
 *   counters[n][SPB_SHM_MAX_CTX]
 *                 barrier arrivals of rank r on communicator id c
 *   channels[n][n] head/tail byte counts of the one-way byte ring src -> dst
 *   channel data [n][n][channel_bytes]
 *   slots[n][slot_bytes]
 *                 where rank r stages its part of a collective
 *
 * Shared by the library (shm_mpi.c, ...) and the launcher (spbrun.c). */
#ifndef SPB_SHM_SEGMENT_H
#define SPB_SHM_SEGMENT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SPB_SHM_MAGIC 0x53504253484d3031ULL /* "SPBSHM01" */
#define SPB_SHM_MAX_RANKS 256
#define SPB_SHM_MAX_CTX 4096 /* communicators with more than one rank alive at once */
#define SPB_SHM_LINE 64

/* Environment from spbrun to its ranks. */
#define SPB_SHM_ENV_FD "SPBRUN_FD"
#define SPB_SHM_ENV_RANK "SPBRUN_RANK"
#define SPB_SHM_ENV_SIZE "SPBRUN_SIZE"

enum spb_shm_state { SPB_RANK_STARTED = 0, SPB_RANK_INITIALIZED = 1, SPB_RANK_FINALIZED = 2, SPB_RANK_ABORTED = 3 };

/* What a rank is doing in its current collective; members compare. */
typedef struct {
    int32_t kind, ctx, root, op;
    uint64_t bytes;
} spb_shm_coll_desc;

typedef struct {
    _Alignas(SPB_SHM_LINE) _Atomic uint32_t bell; /* bumped whenever this rank may proceed */
    _Atomic int32_t sleeping;                      /* 1 while in futex_wait on bell */
    _Atomic int32_t state;                         /* enum spb_shm_state */
    int32_t pid;
    spb_shm_coll_desc desc;
} spb_shm_rank;

typedef struct {
    _Alignas(SPB_SHM_LINE) _Atomic uint64_t head; /* bytes written by the sender */
    _Alignas(SPB_SHM_LINE) _Atomic uint64_t tail; /* bytes consumed by the receiver */
} spb_shm_channel;

typedef struct {
    uint64_t magic;
    int32_t nranks, pad;
    uint64_t slot_bytes, channel_bytes, total_bytes;
    uint64_t off_ranks, off_counters, off_channels, off_channel_data, off_slots;
    _Alignas(SPB_SHM_LINE) _Atomic int32_t abort_flag;
    _Atomic int32_t abort_code; /* exit status of the first failure */
    _Atomic int32_t abort_rank; /* rank that called MPI_Abort, -1 if none */
    _Alignas(SPB_SHM_LINE) _Atomic int32_t ctx_lock;
    _Atomic int32_t ctx_refs[SPB_SHM_MAX_CTX]; /* members still holding id c; 0 = free */
} spb_shm_header;

/* Sizes that fit n ranks: env SPBRUN_SLOT_BYTES / SPBRUN_CHANNEL_BYTES
 * override the defaults (tests use small ones to force chunking).
 * Returns 0, or -1 with a message in err. */
int spb_shm_sizes(int nranks, uint64_t *slot_bytes, uint64_t *channel_bytes, char *err, size_t errlen);

/* Bytes of the segment, and its layout written into a zeroed mapping. */
uint64_t spb_shm_total_bytes(int nranks, uint64_t slot_bytes, uint64_t channel_bytes);
void spb_shm_layout(spb_shm_header *h, int nranks, uint64_t slot_bytes, uint64_t channel_bytes);

static inline spb_shm_rank *spb_shm_rank_of(spb_shm_header *h, int r)
{
    return (spb_shm_rank *)((char *)h + h->off_ranks) + r;
}
static inline _Atomic uint64_t *spb_shm_counter(spb_shm_header *h, int r, int ctx)
{
    return (_Atomic uint64_t *)((char *)h + h->off_counters) + (size_t)r * SPB_SHM_MAX_CTX + ctx;
}
static inline spb_shm_channel *spb_shm_channel_of(spb_shm_header *h, int src, int dst)
{
    return (spb_shm_channel *)((char *)h + h->off_channels) + (size_t)src * h->nranks + dst;
}
static inline char *spb_shm_channel_data(spb_shm_header *h, int src, int dst)
{
    return (char *)h + h->off_channel_data + ((size_t)src * h->nranks + dst) * h->channel_bytes;
}
static inline char *spb_shm_slot(spb_shm_header *h, int r)
{
    return (char *)h + h->off_slots + (size_t)r * h->slot_bytes;
}

/* Wakes rank r if it sleeps on its doorbell (call after publishing). */
void spb_shm_ring(spb_shm_header *h, int r);

/* Records the first failure (exit status) and tells every rank. */
void spb_shm_raise_abort(spb_shm_header *h, int code);

#endif
