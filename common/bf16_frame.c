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
    long k = 0;
    for (; k < n && i + k < h->split; k++) out[k] = spb_bf16_to_float(h->lo[i + k]);
    if (k < n) memcpy(out + k, f32_at(h, i + k), sizeof(float) * (size_t)(n - k));
}

/* Storage only, no masters. */
static void write_storage(spb_handle *h, long i, long n, const float *in)
{
    SPB_CHECK(!h->ints && i >= 0 && n >= 0 && i + n <= h->n);
    long k = 0;
    if (truncating)
        for (; k < n && i + k < h->split; k++) h->lo[i + k] = spb_bf16_truncate(in[k]);
    else
        for (; k < n && i + k < h->split; k++) h->lo[i + k] = spb_bf16_from_float(in[k]);
    if (k < n) memcpy(f32_at(h, i + k), in + k, sizeof(float) * (size_t)(n - k));
    h->written = 1;
}

/* Masters of a range written through the compute path: those whose stored
 * value changed take the written value (spb_bf16_write's rule). */
typedef struct master_sync {
    const spb_handle *h;
    long first;
    const float *in;
    const spb_bf16 *before;
} master_sync;

static void sync_masters(void *ctx, long at, long len, float *masters)
{
    const master_sync *s = ctx;
    for (long k = 0; k < len; k++) {
        long e = at + k;
        if (e >= s->h->split) { /* an fp32 element is its own master */
            masters[k] = s->in[e - s->first];
            continue;
        }
        if (s->h->lo[e] != s->before[e - s->first]) masters[k] = s->in[e - s->first];
    }
}

void spb_bf16_write(spb_handle *h, long i, long n, const float *in)
{
    if (n <= 0) return;
    if (!h->num_masters) {
        write_storage(h, i, n, in);
        return;
    }
    /* The bf16 values before, to see which elements the write changes. */
    long nb = i + n <= h->split ? n : h->split > i ? h->split - i : 0;
    spb_bf16 *before = SPB_CHECK_PTR(malloc(sizeof(spb_bf16) * (size_t)(n + 1)));
    memcpy(before, h->lo + i, sizeof(spb_bf16) * (size_t)nb);
    write_storage(h, i, n, in);
    master_sync s = {h, i, in, before};
    spb_handle_each_master(h, i, n, sync_masters, &s);
    free(before);
}

/* The staging views' walk over bound masters: out gets them, or in gives them. */
typedef struct master_copy {
    float *out;
    const float *in;
    long first;
} master_copy;

static void overlay_masters(void *ctx, long at, long len, float *masters)
{
    const master_copy *c = ctx;
    memcpy(c->out + (at - c->first), masters, sizeof(float) * (size_t)len);
}

void spb_bf16_read_masters(const spb_handle *h, long i, long n, float *out)
{
    spb_bf16_read(h, i, n, out);
    master_copy c = {.out = out, .first = i};
    spb_handle_each_master(h, i, n, overlay_masters, &c);
}

static void take_masters(void *ctx, long at, long len, float *masters)
{
    const master_copy *c = ctx;
    memcpy(masters, c->in + (at - c->first), sizeof(float) * (size_t)len);
}

void spb_bf16_write_masters(spb_handle *h, long i, long n, const float *in)
{
    if (n <= 0) return;
    write_storage(h, i, n, in);
    master_copy c = {.in = in, .first = i};
    spb_handle_each_master(h, i, n, take_masters, &c);
}

const int *spb_bf16_ints(const int *p, long len, const char *what)
{
    long i = 0;
    spb_handle *h = spb_handle_at(p, len, &i, what);
    if (!h->ints) SPB_DIE("%s: a float buffer where tokens (ints) were expected", what);
    return (const int *)h->hi + i;
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

void spb_frame_load(spb_frame *f)
{
    for (int s = 0; s < f->num_spans; s++) {
        spb_frame_span *sp = &f->span[s];
        sp->copy = SPB_CHECK_PTR(malloc(sizeof(float) * (size_t)(sp->hi - sp->lo)));
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
        free(sp->copy);
        sp->copy = NULL;
    }
}
