#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include "device_handles.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bf16_frame.h"
#include "checks.h"

/* --- storage ------------------------------------------------------------- */

static void *host_alloc(spb_mem_category cat, size_t bytes) { return spb_mem_alloc(cat, bytes); }
static void *host_scratch_alloc(size_t bytes) { return SPB_CHECK_PTR(malloc(bytes ? bytes : 1)); }
static void host_widen(float *dst, const spb_bf16 *src, long n, spb_half_format fmt)
{
    if (fmt == SPB_HALF_FP16)
        for (long i = 0; i < n; i++) dst[i] = spb_fp16_to_float(src[i]);
    else
        for (long i = 0; i < n; i++) dst[i] = spb_bf16_to_float(src[i]);
}
static void host_narrow(spb_bf16 *dst, const float *src, long n, float *masters, int truncate, spb_half_format fmt)
{
    SPB_CHECK(!truncate || fmt == SPB_HALF_BF16);
    for (long i = 0; i < n; i++) {
        float v = src[i];
        spb_bf16 b = fmt == SPB_HALF_FP16 ? spb_fp16_from_float(v)
                     : truncate           ? spb_bf16_truncate(v)
                                          : spb_bf16_from_float(v);
        if (masters && b != dst[i]) masters[i] = v;
        dst[i] = b;
    }
}
static void host_copy(void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }

const spb_handle_storage spb_handle_host_storage = {
    .alloc = host_alloc,
    .free = spb_mem_free,
    .scratch_alloc = host_scratch_alloc,
    .scratch_free = free,
    .widen = host_widen,
    .narrow = host_narrow,
    .copy = host_copy,
    .to_host = host_copy,
    .from_host = host_copy,
};
static const spb_handle_storage *storage = &spb_handle_host_storage;

/* --- the registry: live handles sorted by base --------------------------- */

static spb_handle **live;
static long num_live, cap_live;

void spb_handles_set_storage(const spb_handle_storage *s)
{
    if (!s) s = &spb_handle_host_storage;
    if (s == storage) return;
    if (num_live) SPB_DIE("device buffers of one bf16 table are alive while another one starts (one per process)");
    storage = s;
}

const spb_handle_storage *spb_handles_storage(void) { return storage; }

static spb_half_format half_format = SPB_HALF_BF16;

void spb_handles_set_half_format(spb_half_format fmt)
{
    if (fmt == half_format) return;
    if (num_live) SPB_DIE("16-bit buffers of one format are alive while a table of the other starts (one per process)");
    half_format = fmt;
}

spb_half_format spb_handles_half_format(void) { return half_format; }

long spb_handles_live(void) { return num_live; }

/* Index of the last handle whose base is <= p, or -1. */
static long last_at_or_below(const void *p)
{
    long lo = 0, hi = num_live - 1, found = -1;
    while (lo <= hi) {
        long mid = lo + (hi - lo) / 2;
        if ((const char *)live[mid]->base <= (const char *)p) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

static void insert(spb_handle *h)
{
    if (num_live == cap_live) {
        cap_live = cap_live ? 2 * cap_live : 64;
        live = SPB_CHECK_PTR(realloc(live, sizeof *live * (size_t)cap_live));
    }
    long at = last_at_or_below(h->base) + 1;
    memmove(live + at + 1, live + at, sizeof *live * (size_t)(num_live - at));
    live[at] = h;
    num_live++;
}

spb_handle *spb_handle_find(const void *p, long *index)
{
    long k = last_at_or_below(p);
    if (k < 0) return NULL;
    spb_handle *h = live[k];
    size_t off = (size_t)((const char *)p - h->base);
    if (off >= 4 * (size_t)h->n || off % 4) return NULL;
    if (index) *index = (long)(off / 4);
    return h;
}

spb_handle *spb_handle_at(const void *p, long len, long *index, const char *what)
{
    long i = 0;
    spb_handle *h = spb_handle_find(p, &i);
    if (!h)
        SPB_DIE("%s: %p is in no device buffer (a host pointer given to a device operation, a buffer used after "
                "free, or past its end)", what, p);
    if (len < 1 || len > h->n - i)
        SPB_DIE("%s: elements [%ld, %ld) of a device buffer of %ld elements (%s)", what, i, i + len, h->n,
                spb_mem_category_name(h->cat));
    if (index) *index = i;
    return h;
}

/* --- allocation ---------------------------------------------------------- */

static size_t page_bytes(void)
{
    static size_t page;
    if (!page) page = (size_t)sysconf(_SC_PAGESIZE);
    return page;
}

static spb_handle *reserve(spb_mem_category cat, long n)
{
    SPB_CHECK(n >= 0 && (int)cat >= 0 && cat < SPB_MEM_NUM_CATEGORIES);
    spb_handle *h = SPB_CHECK_PTR(calloc(1, sizeof *h));
    size_t page = page_bytes(), want = 4 * (size_t)n;
    h->reserved = want < page ? page : (want + page - 1) / page * page;
    /* Address space only: PROT_NONE and no swap reserved, so nothing is
     * committed however large the buffer is. */
    void *base = mmap(NULL, h->reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) SPB_DIE("mmap of %zu bytes of address space for a device buffer failed", h->reserved);
    h->base = base;
    h->n = n;
    h->cat = cat;
    return h;
}

static void *store_alloc(spb_mem_category cat, size_t bytes)
{
    return bytes ? SPB_CHECK_PTR(storage->alloc(cat, bytes)) : NULL;
}

float *spb_handle_alloc(spb_mem_category cat, long n, spb_dtype dtype)
{
    SPB_CHECK(dtype == SPB_DTYPE_HALF || dtype == SPB_DTYPE_F32);
    spb_handle *h = reserve(cat, n);
    h->split = dtype == SPB_DTYPE_HALF ? n : 0;
    h->lo = store_alloc(cat, 2 * (size_t)h->split);
    h->hi = store_alloc(cat, 4 * (size_t)(n - h->split));
    insert(h);
    return (float *)h->base;
}

int *spb_handle_alloc_ints(spb_mem_category cat, long n)
{
    spb_handle *h = reserve(cat, n);
    h->ints = 1;
    h->hi = store_alloc(cat, 4 * (size_t)n);
    insert(h);
    return (int *)h->base;
}

/* Forget every bound range whose masters live in `owner`'s shadow. */
static void unbind_owner(const spb_handle *owner)
{
    for (long k = 0; k < num_live; k++) {
        spb_handle *h = live[k];
        int kept = 0;
        for (int r = 0; r < h->num_masters; r++)
            if (h->masters[r].owner != owner) h->masters[kept++] = h->masters[r];
        h->num_masters = kept;
    }
}

void spb_handle_free(void *p)
{
    if (!p) return;
    long k = last_at_or_below(p);
    if (k < 0 || live[k]->base != (char *)p) SPB_DIE("free of %p, which is not the start of a device buffer", p);
    spb_handle *h = live[k];
    memmove(live + k, live + k + 1, sizeof *live * (size_t)(num_live - k - 1));
    num_live--;
    if (h->shadow) unbind_owner(h);
    if (h->ints && h->hi) spb_bf16_tokens_forget((const int *)h->hi, h->n); /* its host copy goes with it */
    if (h->lo) storage->free(h->lo);
    if (h->hi) storage->free(h->hi);
    if (h->shadow) storage->free(h->shadow);
    free(h->masters);
    SPB_CHECK(munmap(h->base, h->reserved) == 0);
    free(h);
}

/* --- element types and storage addresses ---------------------------------- */

spb_dtype spb_handle_dtype(const spb_handle *h, long index)
{
    if (h->ints) return SPB_DTYPE_I32;
    return index < h->split ? SPB_DTYPE_HALF : SPB_DTYPE_F32;
}

void *spb_handle_resolve(const void *p, spb_dtype *dtype)
{
    long i = 0;
    spb_handle *h = spb_handle_at(p, 1, &i, "resolve");
    spb_dtype t = spb_handle_dtype(h, i);
    if (dtype) *dtype = t;
    if (t == SPB_DTYPE_HALF) return h->lo + i;
    return (char *)h->hi + 4 * (size_t)(i - h->split);
}

void spb_handle_retype_tail(spb_handle *h, long from)
{
    SPB_CHECK(!h->ints && from >= 0 && from <= h->n);
    if (from >= h->split) return;
    long n = h->n, old = h->split;
    /* Through host memory, the old blocks freed before the new ones are
     * made: the retyping is this table's way of learning a buffer's type
     * late, and a device that knew it from the start would never hold both,
     * so the category's peak must not show them together. */
    spb_bf16 *head = SPB_CHECK_PTR(malloc(2 * (size_t)from + 1));
    float *tail = SPB_CHECK_PTR(malloc(4 * (size_t)(n - from)));
    float *wide = storage->scratch_alloc(4 * (size_t)(n - from));
    if (from) storage->to_host(head, h->lo, 2 * (size_t)from);
    storage->widen(wide, h->lo + from, old - from, half_format);
    if (n > old) storage->copy(wide + (old - from), h->hi, 4 * (size_t)(n - old));
    storage->to_host(tail, wide, 4 * (size_t)(n - from));
    storage->scratch_free(wide);
    if (h->lo) storage->free(h->lo);
    if (h->hi) storage->free(h->hi);
    h->lo = store_alloc(h->cat, 2 * (size_t)from);
    h->hi = store_alloc(h->cat, 4 * (size_t)(n - from));
    if (from) storage->from_host(h->lo, head, 2 * (size_t)from);
    storage->from_host(h->hi, tail, 4 * (size_t)(n - from));
    free(head);
    free(tail);
    h->split = from;
}

/* --- masters ---------------------------------------------------------------- */

void spb_handle_add_shadow(spb_handle *h, spb_mem_category cat)
{
    SPB_CHECK(!h->ints && !h->shadow);
    h->shadow = store_alloc(cat, 4 * (size_t)h->n);
}

void spb_handle_bind_masters(spb_handle *h, long first, long n, spb_handle *owner, long owner_first)
{
    SPB_CHECK(first >= 0 && n >= 1 && first + n <= h->n);
    SPB_CHECK(owner->shadow && owner_first >= 0 && owner_first + n <= owner->n);
    int at = 0;
    while (at < h->num_masters && h->masters[at].first < first) at++;
    if (at > 0) SPB_CHECK(h->masters[at - 1].first + h->masters[at - 1].n <= first);
    if (at < h->num_masters) SPB_CHECK(first + n <= h->masters[at].first);
    if (h->num_masters == h->cap_masters) {
        h->cap_masters = h->cap_masters ? 2 * h->cap_masters : 8;
        h->masters = SPB_CHECK_PTR(realloc(h->masters, sizeof *h->masters * (size_t)h->cap_masters));
    }
    memmove(h->masters + at + 1, h->masters + at, sizeof *h->masters * (size_t)(h->num_masters - at));
    h->masters[at] = (spb_master_ref){first, n, owner, owner_first};
    h->num_masters++;
}

static float *values_of(const spb_master_ref *r, long at) { return r->owner->shadow + r->owner_first + (at - r->first); }

float *spb_handle_masters(const spb_handle *h, long first, long n)
{
    for (int k = 0; k < h->num_masters; k++) {
        const spb_master_ref *r = &h->masters[k];
        if (r->first + r->n <= first || first + n <= r->first) continue;
        if (r->first <= first && first + n <= r->first + r->n) return values_of(r, first);
        SPB_DIE("elements [%ld, %ld) of a parameter buffer straddle the edge of their masters' range [%ld, %ld)",
                first, first + n, r->first, r->first + r->n);
    }
    return NULL;
}

void spb_handle_each_master(const spb_handle *h, long first, long n,
                            void (*fn)(void *ctx, long at, long len, float *masters), void *ctx)
{
    for (int k = 0; k < h->num_masters; k++) {
        const spb_master_ref *r = &h->masters[k];
        long a = r->first > first ? r->first : first;
        long b = r->first + r->n < first + n ? r->first + r->n : first + n;
        if (a < b) fn(ctx, a, b - a, values_of(r, a));
    }
}

int spb_handle_has_masters(const spb_handle *h, long first, long n)
{
    for (int k = 0; k < h->num_masters; k++) {
        const spb_master_ref *r = &h->masters[k];
        if (r->first < first + n && first < r->first + r->n) return 1;
    }
    return 0;
}
