/* Layout of the shared segment and the two operations both the launcher and
 * the ranks perform on it: ringing a rank's doorbell and raising the abort. */
#define _GNU_SOURCE
#include "shm_segment.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* A byte count from the environment; 0 when unset. */
static int env_bytes(const char *name, uint64_t *out, char *err, size_t errlen)
{
    const char *s = getenv(name);
    *out = 0;
    if (!s || !*s) return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < 4096 || v > (1ULL << 34)) {
        snprintf(err, errlen, "%s=%s: want a byte count from 4096 to 16 GiB", name, s);
        return -1;
    }
    *out = round_up(v, SPB_SHM_LINE);
    return 0;
}

int spb_shm_sizes(int nranks, uint64_t *slot_bytes, uint64_t *channel_bytes, char *err, size_t errlen)
{
    if (nranks < 1 || nranks > SPB_SHM_MAX_RANKS) {
        snprintf(err, errlen, "%d ranks: the shm MPI runs 1 to %d", nranks, SPB_SHM_MAX_RANKS);
        return -1;
    }
    if (env_bytes("SPBRUN_SLOT_BYTES", slot_bytes, err, errlen) ||
        env_bytes("SPBRUN_CHANNEL_BYTES", channel_bytes, err, errlen))
        return -1;
    /* Pages are only backed once touched: slots fill when collectives are
     * large, channels only between ranks that exchange messages. */
    const uint64_t mib = 1ULL << 20;
    if (!*slot_bytes) *slot_bytes = nranks <= 32 ? 16 * mib : (512 * mib / (uint64_t)nranks);
    if (!*channel_bytes) {
        uint64_t c = 256 * mib / ((uint64_t)nranks * (uint64_t)nranks);
        *channel_bytes = c > 4 * mib ? 4 * mib : c < 64 * 1024 ? 64 * 1024 : round_up(c, SPB_SHM_LINE);
    }
    *slot_bytes = round_up(*slot_bytes, 4096);
    return 0;
}

/* Offsets of each part, in the order of the header comment. */
static void offsets(int n, uint64_t slot_bytes, uint64_t channel_bytes, uint64_t off[6])
{
    uint64_t at = round_up(sizeof(spb_shm_header), 4096);
    off[0] = at; /* ranks */
    at = round_up(at + (uint64_t)n * sizeof(spb_shm_rank), 4096);
    off[1] = at; /* counters */
    at = round_up(at + (uint64_t)n * SPB_SHM_MAX_CTX * sizeof(uint64_t), 4096);
    off[2] = at; /* channels */
    at = round_up(at + (uint64_t)n * n * sizeof(spb_shm_channel), 4096);
    off[3] = at; /* channel data */
    at = round_up(at + (uint64_t)n * n * channel_bytes, 4096);
    off[4] = at; /* slots */
    off[5] = round_up(at + (uint64_t)n * slot_bytes, 4096);
}

uint64_t spb_shm_total_bytes(int nranks, uint64_t slot_bytes, uint64_t channel_bytes)
{
    uint64_t off[6];
    offsets(nranks, slot_bytes, channel_bytes, off);
    return off[5];
}

void spb_shm_layout(spb_shm_header *h, int nranks, uint64_t slot_bytes, uint64_t channel_bytes)
{
    uint64_t off[6];
    offsets(nranks, slot_bytes, channel_bytes, off);
    h->nranks = nranks;
    h->slot_bytes = slot_bytes;
    h->channel_bytes = channel_bytes;
    h->off_ranks = off[0];
    h->off_counters = off[1];
    h->off_channels = off[2];
    h->off_channel_data = off[3];
    h->off_slots = off[4];
    h->total_bytes = off[5];
    atomic_store(&h->abort_rank, -1);
    atomic_store(&h->ctx_refs[0], nranks); /* id 0 is MPI_COMM_WORLD, never freed */
    atomic_store(&h->ctx_lock, 0);
    h->magic = SPB_SHM_MAGIC; /* last: a rank that sees it sees the rest */
}

void spb_shm_ring(spb_shm_header *h, int r)
{
    spb_shm_rank *rk = spb_shm_rank_of(h, r);
    atomic_fetch_add(&rk->bell, 1);
    if (atomic_load(&rk->sleeping))
        syscall(SYS_futex, (uint32_t *)&rk->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void spb_shm_raise_abort(spb_shm_header *h, int code)
{
    int expected = 0;
    atomic_compare_exchange_strong(&h->abort_code, &expected, code ? code : 1);
    atomic_store(&h->abort_flag, 1);
    for (int r = 0; r < h->nranks; r++) spb_shm_ring(h, r);
}
