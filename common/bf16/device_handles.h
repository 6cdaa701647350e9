/* Handle-translated device storage.  The GPT core treats every device
 * buffer as `float *` and does pointer arithmetic in floats; a table whose
 * elements are not 4-byte floats (bf16) hands out *handles* instead: the base
 * of a reserved, inaccessible address range of 4·n bytes (PROT_NONE, nothing
 * committed), so that base + i names element i and any direct dereference
 * by the core faults at once.  A registry maps each range to its storage,
 * which the table reads and writes:
 *
 *   floats  elements [0, split) bf16 (2 bytes), [split, n) fp32 (4 bytes);
 *           split = n is all bf16, split = 0 all fp32.  A tail can turn fp32
 *           later (spb_handle_retype_tail: a buffer found to hold values
 *           that must stay fp32, e.g. attention log-sum-exp);
 *   ints    int32 (tokens);
 *   shadow  optionally n fp32 more, tracked under a category of their own
 *           (fp32 master weights), and `masters`: ranges of this handle whose
 *           fp32 masters sit in some handle's shadow (its own, or an
 *           optimizer buffer's).
 *
 * Storage is allocated through spb_handle_storage (memory.h's tracked host
 * allocator by default; a device table passes its own), so the categories
 * count the bytes stored, never the reservation.  Host C with no CUDA in it:
 * the CUDA bf16 table (common/cuda/backend_bf16_cuda.c) keeps this registry
 * on the host, holding pointers into device memory (storage and shadows). */
#ifndef SPB_DEVICE_HANDLES_H
#define SPB_DEVICE_HANDLES_H

#include <stddef.h>
#include <stdint.h>

#include "bf16.h"
#include "fp16.h"
#include "memory.h"

/* SPB_DTYPE_HALF: the registry's 16-bit format, bf16 or fp16 (one per
 * process, spb_handles_set_half_format). */
typedef enum spb_dtype { SPB_DTYPE_HALF = 0, SPB_DTYPE_F32, SPB_DTYPE_I32 } spb_dtype;
typedef enum spb_half_format { SPB_HALF_BF16 = 0, SPB_HALF_FP16 } spb_half_format;

struct spb_handle;
typedef struct spb_master_ref {
    long first, n;             /* elements [first, first + n) of the handle */
    struct spb_handle *owner;  /* whose shadow holds their masters */
    long owner_first;          /* at this element of owner's shadow */
} spb_master_ref;

typedef struct spb_handle {
    char *base;        /* the reserved range (4·n bytes, at least a page) */
    size_t reserved;   /* bytes reserved */
    long n;            /* elements */
    spb_mem_category cat;
    int ints;          /* int32 elements */
    long split;        /* floats: [0, split) in lo (bf16), [split, n) in hi (fp32); ints: 0 */
    spb_bf16 *lo;
    void *hi;          /* float *, or int32_t * for ints */
    float *shadow;     /* n fp32 masters, or NULL */
    spb_master_ref *masters; /* sorted by first, disjoint */
    int num_masters, cap_masters;
} spb_handle;

/* Where storage comes from and how it is converted: host memory (the
 * default, memory.h's tracked allocator) or a device's (a CUDA instance
 * passes its own; its operations then run on the device, queued in order).
 * "Storage" below is either a handle's storage or scratch: both live where
 * the table computes.
 *   alloc/free      zeroed storage tracked under cat
 *   scratch_alloc   untracked working memory for a frame's fp32 copies (a
 *   /scratch_free   device keeps a pool that only grows: no free per op)
 *   widen           n 16-bit values of format fmt (bf16 or fp16) to fp32,
 *                   storage to storage (exact)
 *   narrow          n fp32 to fmt, storage to storage, to nearest even
 *                   (toward zero when truncate: tests, bf16); masters non-NULL:
 *                   masters[k] = src[k] for each k whose stored bf16 changes
 *                   (spb_bf16_write's rule; masters may alias src)
 *   copy            bytes, storage to storage
 *   to_host         bytes, storage to host memory
 *   from_host       bytes, host memory to storage */
typedef struct spb_handle_storage {
    void *(*alloc)(spb_mem_category cat, size_t bytes);
    void (*free)(void *p);
    void *(*scratch_alloc)(size_t bytes);
    void (*scratch_free)(void *p);
    void (*widen)(float *dst, const spb_bf16 *src, long n, spb_half_format fmt);
    void (*narrow)(spb_bf16 *dst, const float *src, long n, float *masters, int truncate, spb_half_format fmt);
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*to_host)(void *host, const void *src, size_t bytes);
    void (*from_host)(void *dst, const void *host, size_t bytes);
} spb_handle_storage;
/* NULL: host memory through memory.h (the default).  Changing it only while
 * no handle is alive (setting the one in use is always fine): the registry
 * is one per process, so is the storage its handles live in. */
void spb_handles_set_storage(const spb_handle_storage *storage);
const spb_handle_storage *spb_handles_storage(void);
/* The host storage (what NULL selects). */
extern const spb_handle_storage spb_handle_host_storage;
/* The 16-bit elements' format (bf16 by default; fp16 for --precision fp16).
 * Changing it only while no handle is alive, as the storage. */
void spb_handles_set_half_format(spb_half_format fmt);
spb_half_format spb_handles_half_format(void);

/* A handle to n elements of dtype (zeroed storage under cat). */
float *spb_handle_alloc(spb_mem_category cat, long n, spb_dtype dtype);
int *spb_handle_alloc_ints(spb_mem_category cat, long n);
/* Releases the reservation, the storage and the shadow; NULL is fine.
 * Dies unless p is the base of a live handle. */
void spb_handle_free(void *p);

/* The handle whose range holds p, and p's element index; NULL when p lies
 * in none (or off an element boundary). */
spb_handle *spb_handle_find(const void *p, long *index);
/* As find, but [p, p + len) must lie inside one handle (len >= 1), else the
 * job dies naming `what`. */
spb_handle *spb_handle_at(const void *p, long len, long *index, const char *what);
/* Storage address of the element p names, and its dtype (dies off range). */
void *spb_handle_resolve(const void *p, spb_dtype *dtype);
spb_dtype spb_handle_dtype(const spb_handle *h, long index);

/* Elements [from, n) become fp32 (no-op where they are already), values
 * kept exactly; storage is reallocated, so bytes move within h's category. */
void spb_handle_retype_tail(spb_handle *h, long from);

/* n fp32 of shadow storage under cat, zeroed. */
void spb_handle_add_shadow(spb_handle *h, spb_mem_category cat);
/* Elements [first, first + n) of h have their masters at owner's shadow
 * [owner_first, owner_first + n) (owner may be h).  Ranges must not overlap
 * ranges already bound. */
void spb_handle_bind_masters(spb_handle *h, long first, long n, spb_handle *owner, long owner_first);
/* The masters of [first, first + n) when one bound range covers it, else
 * NULL; dies when a bound range covers part of it only. */
float *spb_handle_masters(const spb_handle *h, long first, long n);
/* Calls fn for each bound range meeting [first, first + n), with the
 * overlap's first element and length and its masters. */
void spb_handle_each_master(const spb_handle *h, long first, long n,
                            void (*fn)(void *ctx, long at, long len, float *masters), void *ctx);
/* Whether any bound range meets [first, first + n): a write there must
 * move masters (only spb_bf16_write does). */
int spb_handle_has_masters(const spb_handle *h, long first, long n);

long spb_handles_live(void); /* handles allocated and not freed */

#endif
