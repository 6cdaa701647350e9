#include "memory.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"

/* A 64-byte header in front of each block keeps size and category, so free
 * needs only the pointer and alignment of the payload is kept. */
typedef struct block_header {
    size_t bytes;
    int category;
    uint32_t magic;
} block_header;

enum { HEADER_BYTES = 64, BLOCK_MAGIC = 0x5350424du };

static spb_mem_stats stats;

static block_header *header_of(const void *p)
{
    block_header *h = (block_header *)((char *)p - HEADER_BYTES);
    SPB_CHECK(h->magic == BLOCK_MAGIC);
    return h;
}

void *spb_mem_alloc(spb_mem_category cat, size_t bytes)
{
    SPB_CHECK((int)cat >= 0 && cat < SPB_MEM_NUM_CATEGORIES);
    size_t total = HEADER_BYTES + ((bytes + 63) / 64) * 64;
    char *raw = aligned_alloc(64, total);
    if (!raw) SPB_DIE("out of memory allocating %zu bytes (%s)", bytes, spb_mem_category_name(cat));
    memset(raw, 0, total);
    block_header *h = (block_header *)raw;
    h->bytes = bytes;
    h->category = (int)cat;
    h->magic = BLOCK_MAGIC;
    stats.current[cat] += bytes;
    stats.current_total += bytes;
    if (stats.current[cat] > stats.peak[cat]) stats.peak[cat] = stats.current[cat];
    if (stats.current_total > stats.peak_total) stats.peak_total = stats.current_total;
    return raw + HEADER_BYTES;
}

void spb_mem_free(void *p)
{
    if (!p) return;
    block_header *h = header_of(p);
    stats.current[h->category] -= h->bytes;
    stats.current_total -= h->bytes;
    h->magic = 0;
    free(h);
}

size_t spb_mem_size(const void *p) { return header_of(p)->bytes; }

const spb_mem_stats *spb_mem_get_stats(void) { return &stats; }

void spb_mem_reset_peaks(void)
{
    for (int c = 0; c < SPB_MEM_NUM_CATEGORIES; c++) stats.peak[c] = stats.current[c];
    stats.peak_total = stats.current_total;
}

const char *spb_mem_category_name(spb_mem_category cat)
{
    static const char *names[SPB_MEM_NUM_CATEGORIES] = {
        "params", "grads", "optimizer", "activations", "workspace", "comm"};
    return ((int)cat >= 0 && cat < SPB_MEM_NUM_CATEGORIES) ? names[cat] : "?";
}
