/* Tracked allocator: every buffer of the model is allocated here with a
 * category, so the job can report current and peak bytes per category per
 * rank (and later compare them with the memory model). */
#ifndef SPB_MEMORY_H
#define SPB_MEMORY_H

#include <stddef.h>

typedef enum spb_mem_category {
    SPB_MEM_PARAMS = 0,
    SPB_MEM_GRADS,
    SPB_MEM_OPTIMIZER,
    SPB_MEM_ACTIVATIONS, /* saved for backward */
    SPB_MEM_WORKSPACE,   /* scratch: attention tiles, gathered parameters */
    SPB_MEM_COMM,        /* communication buffers */
    SPB_MEM_NUM_CATEGORIES
} spb_mem_category;

typedef struct spb_mem_stats {
    size_t current[SPB_MEM_NUM_CATEGORIES];
    size_t peak[SPB_MEM_NUM_CATEGORIES];
    size_t current_total, peak_total;
} spb_mem_stats;

/* Zeroed, 64-byte aligned; aborts the job if the system has no memory. */
void *spb_mem_alloc(spb_mem_category cat, size_t bytes);
void spb_mem_free(void *p); /* NULL is fine */
size_t spb_mem_size(const void *p);

const spb_mem_stats *spb_mem_get_stats(void);
void spb_mem_reset_peaks(void); /* peaks := current */
const char *spb_mem_category_name(spb_mem_category cat);

#endif
