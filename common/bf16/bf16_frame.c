#include "bf16_frame.h"

#include <stdlib.h>
#include <string.h>

#include "checks.h"

static int truncating; /* tests only */

void spb_bf16_set_truncation_for_tests(int on) { truncating = on; }

static float *f32_at(const spb_handle *h, long i) { return (float *)h->hi + (i - h->split); }

void spb_bf16_read(const spb_handle *h, long i, long n, float *out)
{
    SPB_CHECK(!h->ints && i >= 0 && n >= 0 && i + n <= h->n);
    const spb_handle_storage *st = spb_handles_storage();
    long nb = i < h->split ? (i + n < h->split ? n : h->split - i) : 0;
    if (nb) st->widen(out, h->lo + i, nb, spb_handles_half_format());
    if (nb < n) st->copy(out + nb, f32_at(h, i + nb), sizeof(float) * (size_t)(n - nb));
}

/* [i, i + n) of h from `in`; masters non-NULL (the range's own): the
 * write's rule for them (bf16 elements whose value changes, and every fp32
 * element, take the written value). */
static void store_range(spb_handle *h, long i, long n, const float *in, float *masters)
{
    const spb_handle_storage *st = spb_handles_storage();
    long nb = i < h->split ? (i + n < h->split ? n : h->split - i) : 0;
    if (nb) st->narrow(h->lo + i, in, nb, masters, truncating, spb_handles_half_format());
    if (nb < n) {
        size_t bytes = sizeof(float) * (size_t)(n - nb);
        st->copy(f32_at(h, i + nb), in + nb, bytes);
        if (masters) st->copy(masters + nb, in + nb, bytes);
    }
}

/* Storage only, no masters. */
static void write_storage(spb_handle *h, long i, long n, const float *in)
{
    SPB_CHECK(!h->ints && i >= 0 && n >= 0 && i + n <= h->n);
    store_range(h, i, n, in, NULL);
}

/* A write walked range by range: bound masters' ranges (in order) with
 * their masters, the gaps between them without. */
typedef struct master_walk {
    spb_handle *h;
    long first, done; /* the write's first element; elements before `done` are stored */
    const float *in;
} master_walk;

static void store_with_masters(void *ctx, long at, long len, float *masters)
{
    master_walk *w = ctx;
    if (at > w->done) store_range(w->h, w->done, at - w->done, w->in + (w->done - w->first), NULL);
    store_range(w->h, at, len, w->in + (at - w->first), masters);
    w->done = at + len;
}

void spb_bf16_write(spb_handle *h, long i, long n, const float *in)
{
    if (n <= 0) return;
    SPB_CHECK(!h->ints && i >= 0 && i + n <= h->n);
    master_walk w = {h, i, i, in};
    spb_handle_each_master(h, i, n, store_with_masters, &w);
    if (w.done < i + n) store_range(h, w.done, i + n - w.done, in + (w.done - i), NULL);
}

/* The staging views' walk over bound masters: out gets them, or in gives them
 * (both storage-side: scratch). */
typedef struct master_copy {
    float *out;
    const float *in;
    long first;
} master_copy;

static void overlay_masters(void *ctx, long at, long len, float *masters)
{
    const master_copy *c = ctx;
    spb_handles_storage()->copy(c->out + (at - c->first), masters, sizeof(float) * (size_t)len);
}

void spb_bf16_read_masters(const spb_handle *h, long i, long n, float *host)
{
    if (n <= 0) return;
    const spb_handle_storage *st = spb_handles_storage();
    float *out = st->scratch_alloc(sizeof(float) * (size_t)n);
    spb_bf16_read(h, i, n, out);
    master_copy c = {.out = out, .first = i};
    spb_handle_each_master(h, i, n, overlay_masters, &c);
    st->to_host(host, out, sizeof(float) * (size_t)n);
    st->scratch_free(out);
}

static void take_masters(void *ctx, long at, long len, float *masters)
{
    const master_copy *c = ctx;
    spb_handles_storage()->copy(masters, c->in + (at - c->first), sizeof(float) * (size_t)len);
}

void spb_bf16_write_masters(spb_handle *h, long i, long n, const float *host)
{
    if (n <= 0) return;
    const spb_handle_storage *st = spb_handles_storage();
    float *in = st->scratch_alloc(sizeof(float) * (size_t)n);
    st->from_host(in, host, sizeof(float) * (size_t)n);
    write_storage(h, i, n, in);
    master_copy c = {.in = in, .first = i};
    spb_handle_each_master(h, i, n, take_masters, &c);
    st->scratch_free(in);
}

const int *spb_bf16_ints(const int *p, long len, const char *what)
{
    long i = 0;
    spb_handle *h = spb_handle_at(p, len, &i, what);
    if (!h->ints) SPB_DIE("%s: a float buffer where tokens (ints) were expected", what);
    return (const int *)h->hi + i;
}

/* Host copies of the token ids last uploaded into storage: the embedding's
 * entries read them here instead of back from the device, a read that
 * waits for all the work queued (on a GPU, at the backward's end, the whole
 * backward).  Ids are written only by uploads, which replace (or, for other
 * writers, spb_bf16_tokens_forget) the copy. */
enum { SPB_TOKEN_SHADOWS = 4 };
static struct token_shadow {
    const int *stored;
    long n;
    int *host;
} shadows[SPB_TOKEN_SHADOWS];
static int next_shadow;

static int overlaps(const struct token_shadow *s, const int *p, long n)
{
    return s->host && p < s->stored + s->n && s->stored < p + n;
}

void spb_bf16_tokens_forget(const int *stored, long n)
{
    for (int k = 0; k < SPB_TOKEN_SHADOWS; k++)
        if (overlaps(&shadows[k], stored, n)) {
            free(shadows[k].host);
            shadows[k] = (struct token_shadow){0};
        }
}

void spb_bf16_tokens_uploaded(const int *stored, const int *host, long n)
{
    spb_bf16_tokens_forget(stored, n);
    struct token_shadow *s = &shadows[next_shadow];
    next_shadow = (next_shadow + 1) % SPB_TOKEN_SHADOWS;
    free(s->host);
    s->host = SPB_CHECK_PTR(malloc(sizeof(int) * (size_t)n));
    memcpy(s->host, host, sizeof(int) * (size_t)n);
    s->stored = stored, s->n = n;
}

int *spb_bf16_tokens_on_host(const int *stored, long n, long *reach)
{
    int *t = SPB_CHECK_PTR(malloc(sizeof(int) * (size_t)(n > 0 ? n : 1)));
    const struct token_shadow *shadow = NULL;
    for (int k = 0; k < SPB_TOKEN_SHADOWS && n > 0; k++)
        if (shadows[k].host && stored >= shadows[k].stored && stored + n <= shadows[k].stored + shadows[k].n)
            shadow = &shadows[k];
    if (shadow)
        memcpy(t, shadow->host + (stored - shadow->stored), sizeof(int) * (size_t)n);
    else if (n > 0)
        spb_handles_storage()->to_host(t, stored, sizeof(int) * (size_t)n);
    long top = -1;
    for (long i = 0; i < n; i++) {
        if (t[i] < 0) SPB_DIE("embedding: token %d at row %ld is negative", t[i], i);
        top = t[i] > top ? t[i] : top;
    }
    *reach = top + 1;
    return t;
}

long spb_positions_reach(const long *positions, int rows, int T)
{
    long top = -1;
    for (int r = 0; r < rows && r < T; r++) {
        if (positions[r] < 0) SPB_DIE("embedding: position %ld at row %d is negative", positions[r], r);
        top = positions[r] > top ? positions[r] : top;
    }
    return top + 1;
}

/* --- frames ---------------------------------------------------------------- */

static void add(spb_frame *f, void *where, const float *p, long len, int out, const char *what)
{
    if (!p || len <= 0) return;
    SPB_CHECK(f->num_args < SPB_FRAME_MAX);
    long i = 0;
    spb_handle *h = spb_handle_at(p, len, &i, what);
    if (h->ints) SPB_DIE("%s: a token (int) buffer where floats were expected", what);
    int s = 0;
    while (s < f->num_spans && f->span[s].h != h) s++;
    if (s == f->num_spans) {
        SPB_CHECK(f->num_spans < SPB_FRAME_MAX);
        f->span[s] = (spb_frame_span){.h = h, .lo = i, .hi = i + len};
        f->num_spans++;
    }
    spb_frame_span *sp = &f->span[s];
    if (i < sp->lo) sp->lo = i;
    if (i + len > sp->hi) sp->hi = i + len;
    sp->written |= out;
    f->arg[f->num_args].where = where;
    f->arg[f->num_args].span = s;
    f->arg[f->num_args].index = i;
    f->num_args++;
}

void spb_frame_in(spb_frame *f, const float **p, long len, const char *what) { add(f, p, *p, len, 0, what); }
void spb_frame_out(spb_frame *f, float **p, long len, const char *what) { add(f, p, *p, len, 1, what); }

void spb_frame_out_f32(spb_frame *f, float **p, long len, const char *what)
{
    if (!*p || len <= 0) return;
    long i = 0;
    spb_handle *h = spb_handle_at(*p, len, &i, what);
    spb_handle_retype_tail(h, i);
    add(f, p, *p, len, 1, what);
}

/* One scratch block holds every span's copy (a device's scratch pool hands
 * out one block per operation). */
void spb_frame_load(spb_frame *f)
{
    long total = 0;
    for (int s = 0; s < f->num_spans; s++) total += f->span[s].hi - f->span[s].lo;
    if (!f->num_spans) return;
    f->block = spb_handles_storage()->scratch_alloc(sizeof(float) * (size_t)total);
    long at = 0;
    for (int s = 0; s < f->num_spans; s++) {
        spb_frame_span *sp = &f->span[s];
        sp->copy = f->block + at;
        at += sp->hi - sp->lo;
        spb_bf16_read(sp->h, sp->lo, sp->hi - sp->lo, sp->copy);
    }
    for (int a = 0; a < f->num_args; a++) {
        const spb_frame_span *sp = &f->span[f->arg[a].span];
        *(float **)f->arg[a].where = sp->copy + (f->arg[a].index - sp->lo);
    }
}

void spb_frame_store(spb_frame *f)
{
    for (int s = 0; s < f->num_spans; s++) {
        spb_frame_span *sp = &f->span[s];
        if (sp->written) spb_bf16_write(sp->h, sp->lo, sp->hi - sp->lo, sp->copy);
        sp->copy = NULL;
    }
    if (f->block) spb_handles_storage()->scratch_free(f->block);
    f->block = NULL;
}
