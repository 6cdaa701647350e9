/* Over 700 lines: one test program: every attention case (grids of shapes, offsets, masks, sparsity, finite differences). */
/* Tests for the attention backends (common/attention/attention.h): the tiled "flash"
 * kernel against the "naive" reference, forward (O, lse) and backward
 * (dQ, dK, dV), in strided layouts, with offsets, masks, merged blocks; and
 * the naive backward against central finite differences of a
 * double-precision attention written here.
 *
 * Tolerance for flash vs naive: max |flash - naive| <= 1e-5 * max |naive|
 * per output tensor (max |naive| floored at 0.1, see rel_err).  The naive kernel accumulates in double, the flash one
 * in fp32 (sgemm dot products of head_dim <= 64 terms, softmax sums and the
 * P V / dS K / dS^T Q sums over <= 257 keys or queries, a polynomial exp with
 * relative error < 1e-7).  Each fp32 addition or product rounds with relative
 * error <= 2^-24 ~ 6e-8; a sum of n terms has a worst-case error bound of
 * n * 6e-8 relative to the sum of absolute values (~1.5e-5 for n = 257), but
 * the errors are random and partially cancel, so the typical error grows like
 * sqrt(n) * 6e-8 (~1e-6 for 257 terms), and the sums of absolute values stay
 * within a small factor of the largest output element because the inputs are
 * O(1) and the softmax weights sum to one.  1e-5 therefore leaves a margin
 * of about 10x over what is expected and observed (6e-8 to 1e-6 with
 * scores of O(1); 3.3e-6 for the case with 4x larger Q and K, where the
 * scores reach ~20 and their fp32 rounding is amplified by exp), while any
 * indexing, masking or rescaling bug gives errors of order 1e-2 or more.
 *
 * Set SPB_TEST_VERBOSE=1 to print the measured errors.
 */
#define _POSIX_C_SOURCE 200809L

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "check_run.h"

#define REL_TOL 1e-5
#define SENTINEL 1234.5f
#define REF_FLOOR 0.1

static int verbose(void)
{
    const char *e = getenv("SPB_TEST_VERBOSE");
    return e && *e && strcmp(e, "0") != 0;
}

/* ------------------------------------------------------------------------ */
/* Seeded RNG (splitmix64), uniform in [-1, 1). */

static uint64_t rng_state;

static void rng_seed(uint64_t s) { rng_state = s; }

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_uniform(void)
{
    return (float)((double)(rng_next() >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* ------------------------------------------------------------------------ */
/* A test problem: descriptor plus buffers laid out according to it. */

typedef struct cfg {
    int B, H, D, Tq, Tk;
    long qoff, koff;
    int causal;
    int fused; /* Q/K/V (and dK/dV) inside [B][T][3][H][D]; needs Tq == Tk */
    float amp; /* amplitude of Q and K entries */
    int sb, sl, sg; /* blocked-sparse pattern: block, local blocks, global blocks (sb = 0: dense) */
} cfg;

typedef struct problem {
    cfg c;
    spb_attn_desc d;
    /* inputs */
    float *qbuf, *kbuf, *vbuf; /* fused: all three = the QKV buffer */
    size_t qn, kn;             /* elements of qbuf, of kbuf / vbuf */
    const float *q, *k, *v;
    float *dout;
    size_t on; /* elements of an O-layout buffer */
    /* validity masks: 1 where an element belongs to the tensor */
    unsigned char *omask; /* O layout */
    unsigned char *qmask; /* Q layout (dQ has Q's layout; fused: slot 0) */
    unsigned char *kmask; /* K layout (dK in fused: slot 1; non-fused: the whole tensor) */
    unsigned char *vmask; /* V layout slot (fused: slot 2) */
    size_t ln;            /* lse elements */
} problem;

typedef struct outputs {
    float *o, *lse, *dq, *dkbuf, *dvbuf; /* fused: dkbuf == dvbuf */
    float *dk, *dv;
} outputs;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

static void fill_random(float *p, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++)
        p[i] = amp * rng_uniform();
}

static void fill_value(float *p, size_t n, float x)
{
    for (size_t i = 0; i < n; i++)
        p[i] = x;
}

static void mark(unsigned char *m, int B, int T, long bs, long ts, long base, int HD)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < HD; c++)
                m[b * bs + t * ts + base + c] = 1;
}

static void problem_init(problem *p, const cfg *c, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    p->c = *c;
    const int HD = c->H * c->D;
    spb_attn_desc *d = &p->d;
    d->batch = c->B;
    d->heads = c->H;
    d->head_dim = c->D;
    d->q_len = c->Tq;
    d->k_len = c->Tk;
    d->q_offset = c->qoff;
    d->k_offset = c->koff;
    d->causal = c->causal;
    d->scale = (float)(1.0 / sqrt((double)c->D));
    d->sparse_block = c->sb;
    d->sparse_local = c->sl;
    d->sparse_global = c->sg;
    rng_seed(seed);
    if (c->fused) {
        ck_assert_int_eq(c->Tq, c->Tk);
        d->q_token_stride = d->k_token_stride = 3L * HD;
        d->q_batch_stride = d->k_batch_stride = (long)c->Tq * 3 * HD;
        p->qn = p->kn = (size_t)c->B * c->Tq * 3 * HD;
        p->qbuf = p->kbuf = p->vbuf = xmalloc(sizeof(float) * p->qn);
        fill_random(p->qbuf, p->qn, 1.0f);
        /* Q and K slots get amplitude amp */
        for (int b = 0; b < c->B; b++)
            for (int t = 0; t < c->Tq; t++)
                for (int i = 0; i < 2 * HD; i++)
                    p->qbuf[(size_t)b * d->q_batch_stride + (size_t)t * d->q_token_stride + i] *= c->amp;
        p->q = p->qbuf;
        p->k = p->qbuf + HD;
        p->v = p->qbuf + 2 * HD;
        p->kmask = calloc(p->kn, 1);
        p->vmask = calloc(p->kn, 1);
        p->qmask = calloc(p->qn, 1);
        mark(p->qmask, c->B, c->Tq, d->q_batch_stride, d->q_token_stride, 0, HD);
        mark(p->kmask, c->B, c->Tk, d->k_batch_stride, d->k_token_stride, HD, HD);
        mark(p->vmask, c->B, c->Tk, d->k_batch_stride, d->k_token_stride, 2 * HD, HD);
    } else {
        /* padded, non-packed strides */
        d->q_token_stride = HD + 3;
        d->q_batch_stride = (long)c->Tq * d->q_token_stride + 5;
        d->k_token_stride = HD + 1;
        d->k_batch_stride = (long)c->Tk * d->k_token_stride + 2;
        p->qn = (size_t)c->B * d->q_batch_stride;
        p->kn = (size_t)c->B * d->k_batch_stride;
        p->qbuf = xmalloc(sizeof(float) * p->qn);
        p->kbuf = xmalloc(sizeof(float) * p->kn);
        p->vbuf = xmalloc(sizeof(float) * p->kn);
        fill_random(p->qbuf, p->qn, c->amp);
        fill_random(p->kbuf, p->kn, c->amp);
        fill_random(p->vbuf, p->kn, 1.0f);
        p->q = p->qbuf;
        p->k = p->kbuf;
        p->v = p->vbuf;
        p->kmask = calloc(p->kn, 1);
        p->vmask = calloc(p->kn, 1);
        p->qmask = calloc(p->qn, 1);
        mark(p->qmask, c->B, c->Tq, d->q_batch_stride, d->q_token_stride, 0, HD);
        mark(p->kmask, c->B, c->Tk, d->k_batch_stride, d->k_token_stride, 0, HD);
        mark(p->vmask, c->B, c->Tk, d->k_batch_stride, d->k_token_stride, 0, HD);
    }
    d->o_token_stride = HD + 2;
    d->o_batch_stride = (long)c->Tq * d->o_token_stride + 3;
    p->on = (size_t)c->B * d->o_batch_stride;
    p->dout = xmalloc(sizeof(float) * p->on);
    fill_random(p->dout, p->on, 1.0f);
    p->omask = calloc(p->on, 1);
    ck_assert_ptr_nonnull(p->kmask);
    ck_assert_ptr_nonnull(p->vmask);
    ck_assert_ptr_nonnull(p->omask);
    mark(p->omask, c->B, c->Tq, d->o_batch_stride, d->o_token_stride, 0, HD);
    p->ln = (size_t)c->B * c->H * c->Tq;
}

static void problem_free(problem *p)
{
    free(p->qbuf);
    if (!p->c.fused) {
        free(p->kbuf);
        free(p->vbuf);
    }
    free(p->dout);
    free(p->omask);
    free(p->qmask);
    free(p->kmask);
    free(p->vmask);
}

static void outputs_init(outputs *out, const problem *p)
{
    const int HD = p->c.H * p->c.D;
    out->o = xmalloc(sizeof(float) * p->on);
    out->dq = xmalloc(sizeof(float) * p->qn);
    out->lse = xmalloc(sizeof(float) * p->ln);
    fill_value(out->o, p->on, SENTINEL);
    fill_value(out->lse, p->ln, SENTINEL);
    /* gradients: zero where valid (callers zero them), sentinel in the gaps */
    for (size_t i = 0; i < p->qn; i++)
        out->dq[i] = p->qmask[i] ? 0.0f : SENTINEL;
    out->dkbuf = xmalloc(sizeof(float) * p->kn);
    if (p->c.fused) {
        out->dvbuf = out->dkbuf;
        out->dk = out->dkbuf + HD;
        out->dv = out->dkbuf + 2 * HD;
        for (size_t i = 0; i < p->kn; i++)
            out->dkbuf[i] = (p->kmask[i] || p->vmask[i]) ? 0.0f : SENTINEL;
    } else {
        out->dvbuf = xmalloc(sizeof(float) * p->kn);
        out->dk = out->dkbuf;
        out->dv = out->dvbuf;
        for (size_t i = 0; i < p->kn; i++) {
            out->dkbuf[i] = p->kmask[i] ? 0.0f : SENTINEL;
            out->dvbuf[i] = p->vmask[i] ? 0.0f : SENTINEL;
        }
    }
}

static void outputs_free(outputs *out, const problem *p)
{
    free(out->o);
    free(out->dq);
    free(out->lse);
    free(out->dkbuf);
    if (!p->c.fused)
        free(out->dvbuf);
}

static void run_forward(const spb_attn_backend *be, const problem *p, outputs *out)
{
    be->forward(&p->d, p->q, p->k, p->v, out->o, out->lse);
}

static void run_backward(const spb_attn_backend *be, const problem *p, outputs *out)
{
    be->backward(&p->d, p->q, p->k, p->v, out->o, out->lse, p->dout, out->dq, out->dk, out->dv);
}

/* max |a - r| / max |r| over elements where mask is set (mask NULL: all);
 * NaN if an element of a is NaN.  Both -inf at the same place count as equal;
 * -inf against finite is an infinite error. */
static double rel_err(const float *a, const float *r, size_t n, const unsigned char *mask)
{
    double emax = 0.0, rmax = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (mask && !mask[i])
            continue;
        if (isnan(a[i]) || isnan(r[i]))
            return NAN;
        if (isinf(a[i]) || isinf(r[i])) {
            if (a[i] != r[i])
                return INFINITY;
            continue;
        }
        double e = fabs((double)a[i] - r[i]);
        if (e > emax)
            emax = e;
        if (fabs(r[i]) > rmax)
            rmax = fabs(r[i]);
    }
    /* Absolute floor: a reference that is exactly zero (e.g. dQ when each
     * row sees a single key, where softmax is constant) is compared
     * absolutely, against the O(1) scale of the inputs. */
    if (rmax < REF_FLOOR)
        rmax = REF_FLOOR;
    return emax / rmax;
}

/* Elements outside the tensors must still hold the sentinel. */
static int gaps_intact(const float *a, size_t n, const unsigned char *m1, const unsigned char *m2)
{
    for (size_t i = 0; i < n; i++) {
        if ((m1 && m1[i]) || (m2 && m2[i]))
            continue;
        if (a[i] != SENTINEL)
            return 0;
    }
    return 1;
}

static void describe(char *buf, size_t n, const cfg *c)
{
    snprintf(buf, n, "B=%d H=%d D=%d Tq=%d Tk=%d qoff=%ld koff=%ld causal=%d fused=%d amp=%g sparse=%d/%d/%d",
             c->B, c->H, c->D, c->Tq, c->Tk, c->qoff, c->koff, c->causal, c->fused,
             (double)c->amp, c->sb, c->sl, c->sg);
}

/* The test's own statement of the mask (docs/SPARSE.md), on global
 * positions: dense causal, then the blocked-sparse local window and global
 * blocks.  Independent of attention.h's span arithmetic. */
static int ref_visible(const cfg *c, long qpos, long kpos)
{
    if (c->causal && kpos > qpos)
        return 0;
    if (c->sb == 0)
        return 1;
    long bq = qpos / c->sb, bk = kpos / c->sb;
    long dist = bq > bk ? bq - bk : bk - bq;
    return dist < c->sl || bk < c->sg;
}

/* Flash vs naive on one configuration: forward O, lse; backward dQ, dK, dV
 * (each backend's backward fed with its own forward's O and lse, as in
 * training); buffer gaps untouched. */
static void compare_backends(const cfg *c, uint64_t seed, double tol)
{
    problem p;
    outputs rn, rf;
    char what[256];
    describe(what, sizeof what, c);
    problem_init(&p, c, seed);
    outputs_init(&rn, &p);
    outputs_init(&rf, &p);

    run_forward(&spb_attn_naive, &p, &rn);
    run_forward(&spb_attn_flash, &p, &rf);
    run_backward(&spb_attn_naive, &p, &rn);
    run_backward(&spb_attn_flash, &p, &rf);

    double eo = rel_err(rf.o, rn.o, p.on, p.omask);
    double el = rel_err(rf.lse, rn.lse, p.ln, NULL);
    double eq = rel_err(rf.dq, rn.dq, p.qn, p.qmask);
    /* dK / dV compared through the buffers and the masks of their slots */
    double ek = rel_err(rf.dkbuf, rn.dkbuf, p.kn, p.kmask);
    double ev = rel_err(rf.dvbuf, rn.dvbuf, p.kn, p.vmask);
    if (verbose())
        printf("%s: O %.2e lse %.2e dQ %.2e dK %.2e dV %.2e\n", what, eo, el, eq, ek, ev);
    ck_assert_msg(eo <= tol, "%s: O rel err %g", what, eo);
    ck_assert_msg(el <= tol, "%s: lse rel err %g", what, el);
    ck_assert_msg(eq <= tol, "%s: dQ rel err %g", what, eq);
    ck_assert_msg(ek <= tol, "%s: dK rel err %g", what, ek);
    ck_assert_msg(ev <= tol, "%s: dV rel err %g", what, ev);

    /* rows without a visible key: exactly O = 0, lse = -inf in both */
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < c->Tq; i++) {
                int vis = 0;
                for (int j = 0; j < c->Tk && !vis; j++)
                    vis = ref_visible(c, c->qoff + i, c->koff + j);
                size_t li = ((size_t)b * c->H + h) * c->Tq + i;
                const float *orow = rf.o + b * p.d.o_batch_stride + i * p.d.o_token_stride + h * c->D;
                const float *nrow = rn.o + b * p.d.o_batch_stride + i * p.d.o_token_stride + h * c->D;
                if (vis) {
                    ck_assert_msg(isfinite(rf.lse[li]), "%s: lse not finite", what);
                    continue;
                }
                ck_assert_msg(isinf(rf.lse[li]) && rf.lse[li] < 0, "%s: flash lse != -inf", what);
                ck_assert_msg(isinf(rn.lse[li]) && rn.lse[li] < 0, "%s: naive lse != -inf", what);
                for (int x = 0; x < c->D; x++) {
                    ck_assert_msg(orow[x] == 0.0f, "%s: flash O != 0 on invisible row", what);
                    ck_assert_msg(nrow[x] == 0.0f, "%s: naive O != 0 on invisible row", what);
                }
            }

    ck_assert_msg(gaps_intact(rf.o, p.on, p.omask, NULL), "%s: flash wrote outside O", what);
    ck_assert_msg(gaps_intact(rn.o, p.on, p.omask, NULL), "%s: naive wrote outside O", what);
    ck_assert_msg(gaps_intact(rf.dq, p.qn, p.qmask, NULL), "%s: flash wrote outside dQ", what);
    ck_assert_msg(gaps_intact(rn.dq, p.qn, p.qmask, NULL), "%s: naive wrote outside dQ", what);
    if (p.c.fused) {
        ck_assert_msg(gaps_intact(rf.dkbuf, p.kn, p.kmask, p.vmask), "%s: flash wrote outside dK/dV", what);
        ck_assert_msg(gaps_intact(rn.dkbuf, p.kn, p.kmask, p.vmask), "%s: naive wrote outside dK/dV", what);
    } else {
        ck_assert_msg(gaps_intact(rf.dkbuf, p.kn, p.kmask, NULL), "%s: flash wrote outside dK", what);
        ck_assert_msg(gaps_intact(rf.dvbuf, p.kn, p.vmask, NULL), "%s: flash wrote outside dV", what);
        ck_assert_msg(gaps_intact(rn.dkbuf, p.kn, p.kmask, NULL), "%s: naive wrote outside dK", what);
        ck_assert_msg(gaps_intact(rn.dvbuf, p.kn, p.vmask, NULL), "%s: naive wrote outside dV", what);
    }

    outputs_free(&rn, &p);
    outputs_free(&rf, &p);
    problem_free(&p);
}

/* ------------------------------------------------------------------------ */
/* Grid: lengths x head_dim x causal, fused QKV layout, B = 2, H = 3.
 * Lengths reach every path of the 64 x 64 tiles: one partial tile, one
 * just under, exactly, just over a tile, and 130: two full tiles and a
 * partial one (causal: tiles skipped above the diagonal, fully visible
 * below it, masked across it).  257 (four full tiles and one row) took
 * three quarters of the grid's time and reached no other path; it stays in
 * the offset cases below. */

static const int grid_len[] = {1, 7, 63, 64, 65, 130};
static const int grid_dim[] = {16, 32, 64};
#define N_LEN ((int)(sizeof grid_len / sizeof grid_len[0]))
#define N_DIM ((int)(sizeof grid_dim / sizeof grid_dim[0]))
#define N_GRID (N_LEN * N_DIM * 2)

START_TEST(test_grid_fused)
{
    int causal = _i % 2;
    int di = (_i / 2) % N_DIM;
    int li = _i / (2 * N_DIM);
    cfg c = {2, 3, grid_dim[di], grid_len[li], grid_len[li], 0, 0, causal, 1, 2.0f, 0, 0, 0};
    compare_backends(&c, 1000u + (uint64_t)_i, REL_TOL);
}
END_TEST

/* Same grid with padded separate buffers and both blocks at a common
 * nonzero offset (a diagonal block of ring attention). */
START_TEST(test_grid_strided_offset)
{
    int causal = _i % 2;
    int di = (_i / 2) % N_DIM;
    int li = _i / (2 * N_DIM);
    cfg c = {2, 3, grid_dim[di], grid_len[li], grid_len[li], 300, 300, causal, 0, 2.0f, 0, 0, 0};
    compare_backends(&c, 5000u + (uint64_t)_i, REL_TOL);
}
END_TEST

/* q_len != k_len, nonzero offsets, as in ring attention. */
static const cfg offset_cases[] = {
    /* query block at 128 against key block at 0 (fully visible when causal) */
    {2, 3, 32, 100, 128, 128, 0, 1, 0, 2.0f, 0, 0, 0},
    /* ... against key block at 64: straddles the diagonal */
    {2, 3, 32, 100, 130, 128, 64, 1, 0, 2.0f, 0, 0, 0},
    {2, 3, 64, 64, 64, 128, 64, 1, 0, 2.0f, 0, 0, 0},
    {2, 3, 16, 65, 257, 128, 0, 1, 0, 2.0f, 0, 0, 0},
    /* key block starting inside the query block: leading rows see nothing */
    {2, 3, 32, 100, 64, 128, 200, 1, 0, 2.0f, 0, 0, 0},
    {2, 3, 16, 130, 7, 0, 129, 1, 0, 2.0f, 0, 0, 0},
    /* non-causal with offsets: offsets must not matter */
    {2, 3, 32, 100, 130, 128, 64, 0, 0, 2.0f, 0, 0, 0},
    {2, 3, 64, 7, 257, 0, 999, 0, 0, 2.0f, 0, 0, 0},
    /* larger scores: stresses the running-max rescaling */
    {2, 3, 64, 257, 257, 0, 0, 1, 1, 4.0f, 0, 0, 0},
};
#define N_OFFSET ((int)(sizeof offset_cases / sizeof offset_cases[0]))

START_TEST(test_offsets)
{
    compare_backends(&offset_cases[_i], 9000u + (uint64_t)_i, REL_TOL);
}
END_TEST

/* A causal block entirely above the diagonal: every row invisible.  Both
 * backends: O = 0, lse = -inf, gradients untouched. */
START_TEST(test_fully_masked)
{
    const spb_attn_backend *bes[2] = {&spb_attn_naive, &spb_attn_flash};
    cfg c = {2, 3, 32, 64, 70, 0, 64, 1, 0, 2.0f, 0, 0, 0};
    for (int bi = 0; bi < 2; bi++) {
        problem p;
        outputs out;
        problem_init(&p, &c, 77);
        outputs_init(&out, &p);
        run_forward(bes[bi], &p, &out);
        for (size_t i = 0; i < p.ln; i++)
            ck_assert_msg(isinf(out.lse[i]) && out.lse[i] < 0, "%s: lse[%zu] = %g", bes[bi]->name,
                          i, (double)out.lse[i]);
        for (size_t i = 0; i < p.on; i++)
            ck_assert_msg(p.omask[i] ? out.o[i] == 0.0f : out.o[i] == SENTINEL,
                          "%s: O[%zu] = %g", bes[bi]->name, i, (double)out.o[i]);
        /* gradients prefilled with a nonzero value must stay as they are */
        for (size_t i = 0; i < p.qn; i++)
            if (p.qmask[i])
                out.dq[i] = 0.25f;
        for (size_t i = 0; i < p.kn; i++) {
            if (p.kmask[i])
                out.dk[i] = 0.5f;
            if (p.vmask[i])
                out.dv[i] = 0.75f;
        }
        run_backward(bes[bi], &p, &out);
        for (size_t i = 0; i < p.qn; i++)
            ck_assert(p.qmask[i] ? out.dq[i] == 0.25f : out.dq[i] == SENTINEL);
        for (size_t i = 0; i < p.kn; i++) {
            ck_assert(p.kmask[i] ? out.dk[i] == 0.5f : out.dk[i] == SENTINEL);
            ck_assert(p.vmask[i] ? out.dv[i] == 0.75f : out.dv[i] == SENTINEL);
        }
        outputs_free(&out, &p);
        problem_free(&p);
    }
    /* and against each other (exercises the -inf comparison path) */
    compare_backends(&c, 78, REL_TOL);
}
END_TEST

/* The backward accumulates: a second call adds the same contribution. */
START_TEST(test_accumulates)
{
    const spb_attn_backend *bes[2] = {&spb_attn_naive, &spb_attn_flash};
    cfg c = {2, 3, 32, 130, 130, 0, 0, 1, 1, 2.0f, 0, 0, 0};
    for (int bi = 0; bi < 2; bi++) {
        problem p;
        outputs a, b2;
        problem_init(&p, &c, 4242);
        outputs_init(&a, &p);
        outputs_init(&b2, &p);
        run_forward(bes[bi], &p, &a);
        run_backward(bes[bi], &p, &a);
        memcpy(b2.o, a.o, sizeof(float) * p.on);
        memcpy(b2.lse, a.lse, sizeof(float) * p.ln);
        run_backward(bes[bi], &p, &b2);
        run_backward(bes[bi], &p, &b2);
        /* halve the twice-accumulated gradients (exact in binary) */
        for (size_t i = 0; i < p.qn; i++)
            if (p.qmask[i])
                b2.dq[i] *= 0.5f;
        for (size_t i = 0; i < p.kn; i++)
            if (p.kmask[i] || p.vmask[i])
                b2.dkbuf[i] *= 0.5f;
        double eq = rel_err(b2.dq, a.dq, p.qn, p.qmask);
        double ek = rel_err(b2.dkbuf, a.dkbuf, p.kn, p.kmask);
        double ev = rel_err(b2.dkbuf, a.dkbuf, p.kn, p.vmask);
        if (verbose())
            printf("accumulate %s: dQ %.2e dK %.2e dV %.2e\n", bes[bi]->name, eq, ek, ev);
        /* not bit-exact: sgemm with beta = 1 rounds (g + t1) + t2 ... */
        ck_assert_msg(eq <= 1e-6 && ek <= 1e-6 && ev <= 1e-6, "%s: 2x backward != 2 x dQ/dK/dV",
                      bes[bi]->name);
        double z = 0.0;
        for (size_t i = 0; i < p.qn; i++)
            if (p.qmask[i])
                z += fabs(a.dq[i]);
        ck_assert(z > 0.0);
        outputs_free(&a, &p);
        outputs_free(&b2, &p);
        problem_free(&p);
    }
}
END_TEST

/* Ring attention use: forward over two key blocks merged by log-sum-exp
 * equals the forward over the whole key range, and the per-block backwards
 * fed the merged O and lse sum to the whole backward. */
START_TEST(test_merge_blocks)
{
    const int B = 2, H = 3, D = 32, T = 200, split = 77;
    const int HD = H * D;
    const long ts = HD;
    const spb_attn_backend *be = &spb_attn_flash;
    size_t n = (size_t)B * T * HD;
    float *q = xmalloc(sizeof(float) * n), *k = xmalloc(sizeof(float) * n);
    float *v = xmalloc(sizeof(float) * n), *dout = xmalloc(sizeof(float) * n);
    rng_seed(31337);
    fill_random(q, n, 2.0f);
    fill_random(k, n, 2.0f);
    fill_random(v, n, 1.0f);
    fill_random(dout, n, 1.0f);
    spb_attn_desc full = {B, H, D, T, T, 0, 0, 1, (float)(1.0 / sqrt((double)D)),
                          ts, T * ts, ts, T * ts, ts, T * ts, 0, 0, 0, 0};
    spb_attn_desc b1 = full, b2 = full;
    b1.k_len = split;
    b2.k_len = T - split;
    b2.k_offset = split;
    float *o = xmalloc(sizeof(float) * n), *o1 = xmalloc(sizeof(float) * n);
    float *o2 = xmalloc(sizeof(float) * n), *om = xmalloc(sizeof(float) * n);
    size_t ln = (size_t)B * H * T;
    float *l = xmalloc(sizeof(float) * ln), *l1 = xmalloc(sizeof(float) * ln);
    float *l2 = xmalloc(sizeof(float) * ln), *lm = xmalloc(sizeof(float) * ln);
    be->forward(&full, q, k, v, o, l);
    be->forward(&b1, q, k, v, o1, l1);
    be->forward(&b2, q, k + split * ts, v + split * ts, o2, l2);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                size_t li = ((size_t)b * H + h) * T + i;
                double a1 = l1[li], a2 = l2[li];
                double m = a1 > a2 ? a1 : a2; /* a1 is always finite here */
                double lse = m + log(exp(a1 - m) + (isinf(a2) ? 0.0 : exp(a2 - m)));
                double w1 = exp(a1 - lse), w2 = isinf(a2) ? 0.0 : exp(a2 - lse);
                lm[li] = (float)lse;
                for (int x = 0; x < D; x++) {
                    size_t oi = (size_t)b * T * ts + (size_t)i * ts + (size_t)h * D + x;
                    om[oi] = (float)(w1 * o1[oi] + w2 * o2[oi]);
                }
            }
    double eo = rel_err(om, o, n, NULL), el = rel_err(lm, l, ln, NULL);
    ck_assert_msg(eo <= REL_TOL && el <= REL_TOL, "merged forward: O %g lse %g", eo, el);

    float *dq = calloc(n, sizeof(float)), *dk = calloc(n, sizeof(float)), *dv = calloc(n, sizeof(float));
    float *dqm = calloc(n, sizeof(float)), *dkm = calloc(n, sizeof(float)), *dvm = calloc(n, sizeof(float));
    ck_assert(dq && dk && dv && dqm && dkm && dvm);
    be->backward(&full, q, k, v, o, l, dout, dq, dk, dv);
    be->backward(&b1, q, k, v, om, lm, dout, dqm, dkm, dvm);
    be->backward(&b2, q, k + split * ts, v + split * ts, om, lm, dout, dqm, dkm + split * ts,
                 dvm + split * ts);
    double eq = rel_err(dqm, dq, n, NULL), ek = rel_err(dkm, dk, n, NULL);
    double ev = rel_err(dvm, dv, n, NULL);
    if (verbose())
        printf("merge: O %.2e lse %.2e dQ %.2e dK %.2e dV %.2e\n", eo, el, eq, ek, ev);
    ck_assert_msg(eq <= REL_TOL && ek <= REL_TOL && ev <= REL_TOL,
                  "merged backward: dQ %g dK %g dV %g", eq, ek, ev);
    free(q); free(k); free(v); free(dout);
    free(o); free(o1); free(o2); free(om);
    free(l); free(l1); free(l2); free(lm);
    free(dq); free(dk); free(dv); free(dqm); free(dkm); free(dvm);
}
END_TEST

START_TEST(test_by_name)
{
    ck_assert_ptr_eq(spb_attn_backend_by_name("naive"), &spb_attn_naive);
    ck_assert_ptr_eq(spb_attn_backend_by_name("flash"), &spb_attn_flash);
    ck_assert_ptr_null(spb_attn_backend_by_name("nope"));
    ck_assert_ptr_null(spb_attn_backend_by_name(""));
    ck_assert_str_eq(spb_attn_naive.name, "naive");
    ck_assert_str_eq(spb_attn_flash.name, "flash");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Finite differences.  A self-contained double-precision attention on packed
 * [B][T][H][D] arrays gives loss = sum(O o W); its central differences
 * (eps = 1e-4: truncation error ~ eps^2 ~ 1e-8, rounding ~ 1e-16 / eps)
 * are compared to the backends' backward with dO = W. */

typedef struct fd_cfg {
    int B, H, D, Tq, Tk;
    long qoff, koff;
    int causal;
} fd_cfg;

static double fd_loss(const fd_cfg *c, const double *q, const double *k, const double *v,
                      const double *w)
{
    const int HD = c->H * c->D;
    const double scale = 1.0 / sqrt((double)c->D);
    double loss = 0.0;
    double s[64];
    ck_assert_int_le(c->Tk, 64);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < c->Tq; i++) {
                const double *qi = q + ((size_t)b * c->Tq + i) * HD + h * c->D;
                const double *wi = w + ((size_t)b * c->Tq + i) * HD + h * c->D;
                double m = -INFINITY;
                int any = 0;
                for (int j = 0; j < c->Tk; j++) {
                    s[j] = -INFINITY;
                    if (c->causal && c->koff + j > c->qoff + i)
                        continue;
                    const double *kj = k + ((size_t)b * c->Tk + j) * HD + h * c->D;
                    double dot = 0.0;
                    for (int x = 0; x < c->D; x++)
                        dot += qi[x] * kj[x];
                    s[j] = scale * dot;
                    if (s[j] > m)
                        m = s[j];
                    any = 1;
                }
                if (!any)
                    continue; /* O = 0 */
                double sum = 0.0;
                for (int j = 0; j < c->Tk; j++)
                    sum += isinf(s[j]) ? 0.0 : exp(s[j] - m);
                for (int j = 0; j < c->Tk; j++) {
                    if (isinf(s[j]))
                        continue;
                    const double *vj = v + ((size_t)b * c->Tk + j) * HD + h * c->D;
                    double p = exp(s[j] - m) / sum, dotw = 0.0;
                    for (int x = 0; x < c->D; x++)
                        dotw += vj[x] * wi[x];
                    loss += p * dotw;
                }
            }
    return loss;
}

static double fd_grad_err(const fd_cfg *c, double *x, size_t nx, const float *g, const double *q,
                          const double *k, const double *v, const double *w)
{
    const double eps = 1e-4;
    double emax = 0.0, rmax = 0.0;
    for (size_t i = 0; i < nx; i++) {
        double x0 = x[i];
        x[i] = x0 + eps;
        double lp = fd_loss(c, q, k, v, w);
        x[i] = x0 - eps;
        double lm = fd_loss(c, q, k, v, w);
        x[i] = x0;
        double fd = (lp - lm) / (2 * eps);
        double e = fabs(fd - g[i]);
        if (e > emax)
            emax = e;
        if (fabs(fd) > rmax)
            rmax = fabs(fd);
    }
    return rmax > 0 ? emax / rmax : emax;
}

static const fd_cfg fd_cases[] = {
    {2, 2, 8, 5, 7, 0, 0, 0},  /* full */
    {2, 2, 8, 6, 6, 0, 0, 1},  /* causal diagonal block */
    {1, 2, 8, 5, 7, 2, 4, 1},  /* causal, first rows invisible, q_len != k_len */
    {1, 2, 8, 4, 9, 10, 0, 1}, /* causal, key block fully visible except tail */
};
#define N_FD ((int)(sizeof fd_cases / sizeof fd_cases[0]))

START_TEST(test_finite_differences)
{
    const fd_cfg *c = &fd_cases[_i];
    const int HD = c->H * c->D;
    size_t nq = (size_t)c->B * c->Tq * HD, nk = (size_t)c->B * c->Tk * HD;
    float *qf = xmalloc(sizeof(float) * nq), *kf = xmalloc(sizeof(float) * nk);
    float *vf = xmalloc(sizeof(float) * nk), *wf = xmalloc(sizeof(float) * nq);
    double *q = xmalloc(sizeof(double) * nq), *k = xmalloc(sizeof(double) * nk);
    double *v = xmalloc(sizeof(double) * nk), *w = xmalloc(sizeof(double) * nq);
    rng_seed(2024u + (uint64_t)_i);
    fill_random(qf, nq, 2.0f);
    fill_random(kf, nk, 2.0f);
    fill_random(vf, nk, 1.0f);
    fill_random(wf, nq, 1.0f);
    for (size_t i = 0; i < nq; i++) {
        q[i] = qf[i];
        w[i] = wf[i];
    }
    for (size_t i = 0; i < nk; i++) {
        k[i] = kf[i];
        v[i] = vf[i];
    }
    spb_attn_desc d = {c->B, c->H, c->D, c->Tq, c->Tk, c->qoff, c->koff, c->causal,
                       (float)(1.0 / sqrt((double)c->D)),
                       HD, (long)c->Tq * HD, HD, (long)c->Tk * HD, HD, (long)c->Tq * HD, 0, 0, 0, 0};
    const spb_attn_backend *bes[2] = {&spb_attn_naive, &spb_attn_flash};
    for (int bi = 0; bi < 2; bi++) {
        float *o = xmalloc(sizeof(float) * nq), *lse = xmalloc(sizeof(float) * (size_t)c->B * c->H * c->Tq);
        float *dq = calloc(nq, sizeof(float)), *dk = calloc(nk, sizeof(float));
        float *dv = calloc(nk, sizeof(float));
        ck_assert(dq && dk && dv);
        bes[bi]->forward(&d, qf, kf, vf, o, lse);
        bes[bi]->backward(&d, qf, kf, vf, o, lse, wf, dq, dk, dv);
        double eq = fd_grad_err(c, q, nq, dq, q, k, v, w);
        double ek = fd_grad_err(c, k, nk, dk, q, k, v, w);
        double ev = fd_grad_err(c, v, nk, dv, q, k, v, w);
        if (verbose())
            printf("finite differences %d %s: dQ %.2e dK %.2e dV %.2e\n", _i, bes[bi]->name, eq,
                   ek, ev);
        ck_assert_msg(eq <= 1e-4 && ek <= 1e-4 && ev <= 1e-4,
                      "case %d %s: fd rel err dQ %g dK %g dV %g", _i, bes[bi]->name, eq, ek, ev);
        free(o); free(lse); free(dq); free(dk); free(dv);
    }
    free(qf); free(kf); free(vf); free(wf);
    free(q); free(k); free(v); free(w);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Grouped-query attention: kv_heads = G < heads must equal multi-head
 * attention on K/V heads repeated so that query head h reads K/V head
 * h / (H/G) (PyTorch's repeat_interleave, Llama's repeat_kv).  O, lse and dQ
 * are the same computation, so the same bits; dK and dV of a shared head
 * are the sums of the repeated heads' (in another order: 1e-6).  Causal
 * and full, offsets, a sparse pattern, both backends. */
typedef struct gqa_case {
    int B, H, G, D, Tq, Tk;
    long qoff, koff;
    int causal, sparse_block;
} gqa_case;
static const gqa_case gqa_cases[] = {
    {2, 4, 1, 16, 33, 33, 0, 0, 1, 0},   /* multi-query, causal */
    {2, 4, 2, 16, 33, 33, 0, 0, 0, 0},   /* two groups, full */
    {1, 6, 3, 8, 70, 90, 90, 0, 1, 0},   /* ring pair below the diagonal */
    {2, 4, 2, 16, 80, 80, 0, 0, 1, 16},  /* blocked-sparse */
};
#define N_GQA ((int)(sizeof gqa_cases / sizeof gqa_cases[0]))

START_TEST(test_gqa_equals_repeated_kv)
{
    const gqa_case *c = &gqa_cases[_i];
    const int H = c->H, G = c->G, D = c->D, group = H / G;
    size_t nq = (size_t)c->B * c->Tq * H * D, nk = (size_t)c->B * c->Tk * G * D, nkr = (size_t)c->B * c->Tk * H * D;
    float *q = xmalloc(sizeof(float) * nq), *k = xmalloc(sizeof(float) * nk), *v = xmalloc(sizeof(float) * nk);
    float *kr = xmalloc(sizeof(float) * nkr), *vr = xmalloc(sizeof(float) * nkr), *dout = xmalloc(sizeof(float) * nq);
    rng_seed(31000u + (uint64_t)_i);
    fill_random(q, nq, 2.0f);
    fill_random(k, nk, 2.0f);
    fill_random(v, nk, 1.0f);
    fill_random(dout, nq, 1.0f);
    for (long t = 0; t < (long)c->B * c->Tk; t++)
        for (int h = 0; h < H; h++)
            for (int e = 0; e < D; e++) {
                kr[(t * H + h) * D + e] = k[(t * G + h / group) * D + e];
                vr[(t * H + h) * D + e] = v[(t * G + h / group) * D + e];
            }
    spb_attn_desc base = {.batch = c->B, .heads = H, .head_dim = D, .q_len = c->Tq, .k_len = c->Tk,
                          .q_offset = c->qoff, .k_offset = c->koff, .causal = c->causal,
                          .scale = 1.0f / sqrtf((float)D), .q_token_stride = (long)H * D,
                          .q_batch_stride = (long)c->Tq * H * D, .o_token_stride = (long)H * D,
                          .o_batch_stride = (long)c->Tq * H * D, .sparse_block = c->sparse_block,
                          .sparse_local = c->sparse_block ? 2 : 0, .sparse_global = c->sparse_block ? 1 : 0};
    spb_attn_desc mha = base, gqa = base;
    mha.k_token_stride = (long)H * D, mha.k_batch_stride = (long)c->Tk * H * D;
    gqa.k_token_stride = (long)G * D, gqa.k_batch_stride = (long)c->Tk * G * D, gqa.kv_heads = G;
    const spb_attn_backend *bes[2] = {&spb_attn_naive, &spb_attn_flash};
    for (int bi = 0; bi < 2; bi++) {
        size_t nl = (size_t)c->B * H * c->Tq;
        float *o1 = xmalloc(sizeof(float) * nq), *o2 = xmalloc(sizeof(float) * nq);
        float *l1 = xmalloc(sizeof(float) * nl), *l2 = xmalloc(sizeof(float) * nl);
        float *dq1 = calloc(nq, sizeof(float)), *dq2 = calloc(nq, sizeof(float));
        float *dk1 = calloc(nkr, sizeof(float)), *dv1 = calloc(nkr, sizeof(float));
        float *dk2 = calloc(nk, sizeof(float)), *dv2 = calloc(nk, sizeof(float));
        ck_assert(dq1 && dq2 && dk1 && dv1 && dk2 && dv2);
        bes[bi]->forward(&mha, q, kr, vr, o1, l1);
        bes[bi]->forward(&gqa, q, k, v, o2, l2);
        ck_assert_msg(!memcmp(o1, o2, sizeof(float) * nq), "case %d %s: O differs", _i, bes[bi]->name);
        ck_assert_msg(!memcmp(l1, l2, sizeof(float) * nl), "case %d %s: lse differs", _i, bes[bi]->name);
        bes[bi]->backward(&mha, q, kr, vr, o1, l1, dout, dq1, dk1, dv1);
        bes[bi]->backward(&gqa, q, k, v, o2, l2, dout, dq2, dk2, dv2);
        ck_assert_msg(!memcmp(dq1, dq2, sizeof(float) * nq), "case %d %s: dQ differs", _i, bes[bi]->name);
        double num = 0, den = 0;
        for (long t = 0; t < (long)c->B * c->Tk; t++)
            for (int g = 0; g < G; g++)
                for (int e = 0; e < D; e++) {
                    double sk = 0, sv = 0;
                    for (int h = g * group; h < (g + 1) * group; h++)
                        sk += dk1[(t * H + h) * D + e], sv += dv1[(t * H + h) * D + e];
                    double ek = sk - dk2[(t * G + g) * D + e], ev = sv - dv2[(t * G + g) * D + e];
                    num += ek * ek + ev * ev, den += sk * sk + sv * sv;
                }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (verbose()) printf("gqa %d %s H=%d G=%d: dK/dV vs summed repeats %.2e\n", _i, bes[bi]->name, H, G, rel);
        ck_assert_msg(den > 0 && rel <= 1e-6, "case %d %s: dK/dV off by %g", _i, bes[bi]->name, rel);
        free(o1); free(o2); free(l1); free(l2); free(dq1); free(dq2); free(dk1); free(dv1); free(dk2); free(dv2);
    }
    free(q); free(k); free(v); free(kr); free(vr); free(dout);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Blocked-sparse attention (docs/SPARSE.md). */

/* Flash vs naive under the sparse pattern: self blocks, offset blocks as in
 * ring attention (zigzag puts any two chunks together), causal and full,
 * blocks smaller than, equal to and not dividing the 64 x 64 tiles (so key
 * tiles are skipped, run unmasked, and masked with holes between the global
 * and the local span), lengths not multiple of the tile, and blocks whose
 * rows partly or entirely see no key. */
static const cfg sparse_cases[] = {
    /* B H  D   Tq   Tk  qoff koff causal fused amp  sb sl sg */
    {2, 3, 32, 257, 257, 0, 0, 1, 1, 2.0f, 16, 2, 1},   /* holes inside tiles */
    {2, 3, 32, 257, 257, 0, 0, 0, 1, 2.0f, 16, 2, 1},   /* full: symmetric window */
    {1, 2, 64, 300, 300, 0, 0, 1, 1, 2.0f, 64, 4, 1},   /* the sweeps' pattern, tile-aligned */
    {1, 2, 64, 320, 320, 0, 0, 1, 1, 4.0f, 64, 1, 0},   /* block-diagonal, larger scores */
    {2, 3, 16, 130, 200, 300, 100, 1, 0, 2.0f, 32, 3, 2}, /* ring pair below the diagonal */
    {2, 3, 32, 100, 130, 128, 64, 0, 0, 2.0f, 8, 1, 0},  /* full with offsets, no global */
    {2, 3, 32, 65, 257, 500, 0, 1, 0, 2.0f, 24, 2, 1},  /* global + window in one key block */
    {2, 3, 32, 130, 130, 300, 300, 1, 0, 2.0f, 48, 2, 3}, /* diagonal pair at an offset */
    {2, 3, 32, 100, 64, 96, 64, 1, 0, 2.0f, 32, 1, 1},  /* only the first query rows see keys */
    {2, 3, 32, 64, 64, 640, 128, 1, 0, 2.0f, 64, 2, 1}, /* no row sees any key */
    {2, 3, 32, 70, 70, 0, 1000, 0, 0, 2.0f, 100, 2, 1}, /* full, far apart: nothing visible */
    {2, 3, 64, 257, 257, 0, 0, 1, 1, 2.0f, 7, 3, 2},    /* odd block size */
};
#define N_SPARSE ((int)(sizeof sparse_cases / sizeof sparse_cases[0]))

START_TEST(test_sparse_flash_vs_naive)
{
    compare_backends(&sparse_cases[_i], 13000u + (uint64_t)_i, REL_TOL);
}
END_TEST

/* spb_attn_visible_keys / key_end / row_spans / visible_pairs (used for the
 * counted FLOPs and the flash tile walk) against counting ref_visible
 * element by element, over many shapes and patterns.  The element checks
 * are plain comparisons, asserted once per shape with the first mismatch
 * named: a ck_assert per element (about 15 million) spent most of this
 * test's time reporting its location to Check's parent process. */
#define VISIBLE_EXPECT(cond, ...)                                                                                 \
    do {                                                                                                        \
        if (!(cond) && !bad++) snprintf(first, sizeof first, __VA_ARGS__);                                      \
    } while (0)
START_TEST(test_sparse_visible_counts)
{
    const int lens[] = {1, 13, 64, 100};
    const long offs[] = {0, 5, 64, 130};
    const int pats[][3] = {{0, 0, 0}, {4, 1, 0}, {4, 2, 1}, {8, 3, 2}, {16, 1, 5}, {7, 2, 1}};
    long checked = 0;
    for (int causal = 0; causal < 2; causal++)
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++)
                for (int e = 0; e < 4; e++)
                    for (int f = 0; f < 4; f++)
                        for (int pi = 0; pi < 6; pi++) {
                            cfg c = {1, 1, 8, lens[a], lens[b], offs[e], offs[f], causal, 0, 1.0f,
                                     pats[pi][0], pats[pi][1], pats[pi][2]};
                            spb_attn_desc d = {0};
                            d.batch = 2, d.heads = 3, d.head_dim = 8, d.q_len = c.Tq, d.k_len = c.Tk;
                            d.q_offset = c.qoff, d.k_offset = c.koff, d.causal = causal;
                            d.sparse_block = c.sb, d.sparse_local = c.sl, d.sparse_global = c.sg;
                            double pairs = 0;
                            long bad = 0;
                            char first[160] = "";
                            for (int i = 0; i < c.Tq; i++) {
                                int n = 0, end = 0;
                                for (int j = 0; j < c.Tk; j++) {
                                    int v = ref_visible(&c, c.qoff + i, c.koff + j);
                                    VISIBLE_EXPECT(spb_attn_visible(&d, i, j) == v, "visible(%d, %d) != %d", i, j, v);
                                    n += v;
                                    if (v)
                                        end = j + 1;
                                }
                                VISIBLE_EXPECT(spb_attn_visible_keys(&d, i) == n, "visible_keys(%d) != %d", i, n);
                                VISIBLE_EXPECT(spb_attn_key_end(&d, i) == end, "key_end(%d) != %d", i, end);
                                int span[4], ns = spb_attn_row_spans(&d, i, span);
                                for (int j = 0; j < c.Tk; j++) {
                                    int in = 0;
                                    for (int s2 = 0; s2 < ns; s2++)
                                        in |= j >= span[2 * s2] && j < span[2 * s2 + 1];
                                    VISIBLE_EXPECT(in == ref_visible(&c, c.qoff + i, c.koff + j),
                                                   "row_spans(%d) wrong at key %d", i, j);
                                }
                                pairs += n;
                                checked++;
                            }
                            ck_assert_msg(bad == 0,
                                          "Tq %d Tk %d offsets %ld %ld causal %d sparse %d/%d/%d: %ld mismatches, first %s",
                                          c.Tq, c.Tk, c.qoff, c.koff, causal, c.sb, c.sl, c.sg, bad, first);
                            ck_assert(spb_attn_visible_pairs(&d) == pairs * 6);
                        }
    if (verbose())
        printf("sparse visible counts: %ld rows checked\n", checked);
}
END_TEST
#undef VISIBLE_EXPECT

/* Naive (and flash) sparse attention against a brute force written here:
 * the mask materialised as a matrix from ref_visible, a dense softmax of the
 * whole score row with masked scores at -inf, and the backward from the
 * dense matrices P, dP, dS.  Tiny shapes, double precision. */
enum { BF_MAX = 32 };

static const cfg brute_cases[] = {
    {1, 2, 8, 24, 24, 0, 0, 1, 0, 2.0f, 4, 2, 1},  /* causal self block */
    {1, 2, 8, 24, 24, 0, 0, 0, 0, 2.0f, 4, 2, 1},  /* full self block */
    {1, 2, 8, 20, 30, 40, 6, 1, 0, 2.0f, 4, 1, 2}, /* only the global keys 6, 7 are visible */
    {1, 2, 8, 24, 16, 20, 12, 1, 0, 2.0f, 4, 2, 0}, /* later query rows see no key */
    {2, 1, 8, 32, 32, 0, 0, 1, 0, 2.0f, 8, 1, 0},  /* block-diagonal */
};
#define N_BRUTE ((int)(sizeof brute_cases / sizeof brute_cases[0]))

START_TEST(test_sparse_brute_force)
{
    const cfg *c = &brute_cases[_i];
    char what[256];
    describe(what, sizeof what, c);
    ck_assert(c->Tq <= BF_MAX && c->Tk <= BF_MAX);
    problem p;
    problem_init(&p, c, 17000u + (uint64_t)_i);
    const spb_attn_desc *d = &p.d;
    const int D = c->D;
    outputs ref;
    outputs_init(&ref, &p);
    unsigned char M[BF_MAX][BF_MAX];
    int masked = 0, empty_rows = 0;
    for (int i = 0; i < c->Tq; i++) {
        int any = 0;
        for (int j = 0; j < c->Tk; j++) {
            M[i][j] = (unsigned char)ref_visible(c, c->qoff + i, c->koff + j);
            masked += !M[i][j];
            any |= M[i][j];
        }
        empty_rows += !any;
    }
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++) {
            double P[BF_MAX][BF_MAX], dP[BF_MAX][BF_MAX];
#define QP(i) (p.q + b * d->q_batch_stride + (long)(i) * d->q_token_stride + h * D)
#define KP(j) (p.k + b * d->k_batch_stride + (long)(j) * d->k_token_stride + h * D)
#define VP(j) (p.v + b * d->k_batch_stride + (long)(j) * d->k_token_stride + h * D)
#define OOFF(i) (b * d->o_batch_stride + (long)(i) * d->o_token_stride + h * D)
            for (int i = 0; i < c->Tq; i++) {
                double S[BF_MAX], mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < c->Tk; j++) {
                    double dot = 0.0;
                    for (int x = 0; x < D; x++)
                        dot += (double)QP(i)[x] * KP(j)[x];
                    S[j] = M[i][j] ? (double)d->scale * dot : -INFINITY;
                    if (S[j] > mx)
                        mx = S[j];
                }
                float *orow = ref.o + OOFF(i);
                float *lrow = ref.lse + ((size_t)b * c->H + h) * c->Tq + i;
                if (mx == -INFINITY) { /* no visible key */
                    for (int j = 0; j < c->Tk; j++)
                        P[i][j] = 0.0;
                    for (int x = 0; x < D; x++)
                        orow[x] = 0.0f;
                    *lrow = -INFINITY;
                    continue;
                }
                for (int j = 0; j < c->Tk; j++)
                    sum += exp(S[j] - mx); /* exp(-inf) = 0 */
                for (int j = 0; j < c->Tk; j++)
                    P[i][j] = exp(S[j] - mx) / sum;
                for (int x = 0; x < D; x++) {
                    double o = 0.0;
                    for (int j = 0; j < c->Tk; j++)
                        o += P[i][j] * VP(j)[x];
                    orow[x] = (float)o;
                }
                *lrow = (float)(mx + log(sum));
            }
            /* backward: dP = dO V^T, dS = P o (dP - rowsum(P o dP)) */
            double dS[BF_MAX][BF_MAX];
            for (int i = 0; i < c->Tq; i++) {
                double Di = 0.0;
                for (int j = 0; j < c->Tk; j++) {
                    double t = 0.0;
                    for (int x = 0; x < D; x++)
                        t += (double)p.dout[OOFF(i) + x] * VP(j)[x];
                    dP[i][j] = t;
                    Di += P[i][j] * t;
                }
                for (int j = 0; j < c->Tk; j++)
                    dS[i][j] = P[i][j] * (dP[i][j] - Di);
            }
            for (int x = 0; x < D; x++) {
                for (int i = 0; i < c->Tq; i++) {
                    double g = 0.0;
                    for (int j = 0; j < c->Tk; j++)
                        g += dS[i][j] * KP(j)[x];
                    ref.dq[b * d->q_batch_stride + (long)i * d->q_token_stride + h * D + x] =
                        (float)(d->scale * g);
                }
                for (int j = 0; j < c->Tk; j++) {
                    double gk = 0.0, gv = 0.0;
                    for (int i = 0; i < c->Tq; i++) {
                        gk += dS[i][j] * QP(i)[x];
                        gv += P[i][j] * p.dout[OOFF(i) + x];
                    }
                    long ko = b * d->k_batch_stride + (long)j * d->k_token_stride + h * D + x;
                    ref.dk[ko] = (float)(d->scale * gk);
                    ref.dv[ko] = (float)gv;
                }
            }
#undef QP
#undef KP
#undef VP
#undef OOFF
        }
    ck_assert_msg(masked > 0, "%s: the pattern masks nothing", what);
    const spb_attn_backend *bes[2] = {&spb_attn_naive, &spb_attn_flash};
    for (int bi = 0; bi < 2; bi++) {
        outputs out;
        outputs_init(&out, &p);
        run_forward(bes[bi], &p, &out);
        run_backward(bes[bi], &p, &out);
        double eo = rel_err(out.o, ref.o, p.on, p.omask), el = rel_err(out.lse, ref.lse, p.ln, NULL);
        double eq = rel_err(out.dq, ref.dq, p.qn, p.qmask);
        double ek = rel_err(out.dkbuf, ref.dkbuf, p.kn, p.kmask);
        double ev = rel_err(out.dvbuf, ref.dvbuf, p.kn, p.vmask);
        if (verbose())
            printf("brute force %s %s (%d masked pairs, %d empty rows): O %.2e lse %.2e dQ %.2e dK %.2e dV %.2e\n",
                   bes[bi]->name, what, masked, empty_rows, eo, el, eq, ek, ev);
        ck_assert_msg(eo <= REL_TOL && el <= REL_TOL && eq <= REL_TOL && ek <= REL_TOL && ev <= REL_TOL,
                      "%s %s vs brute force: O %g lse %g dQ %g dK %g dV %g", bes[bi]->name, what, eo, el, eq,
                      ek, ev);
        outputs_free(&out, &p);
    }
    outputs_free(&ref, &p);
    problem_free(&p);
}
END_TEST

/* The pattern is applied: a sparse run differs from the dense one on the
 * same inputs, and a pattern whose window covers everything equals dense. */
START_TEST(test_sparse_changes_result)
{
    cfg sparse = {2, 3, 32, 130, 130, 0, 0, 1, 1, 2.0f, 16, 2, 1};
    cfg dense = sparse, wide = sparse;
    dense.sb = dense.sl = dense.sg = 0;
    wide.sl = 1000; /* window wider than the sequence */
    problem ps, pd, pw;
    outputs os, od, ow;
    problem_init(&ps, &sparse, 99);
    problem_init(&pd, &dense, 99);
    problem_init(&pw, &wide, 99);
    outputs_init(&os, &ps);
    outputs_init(&od, &pd);
    outputs_init(&ow, &pw);
    run_forward(&spb_attn_flash, &ps, &os);
    run_forward(&spb_attn_flash, &pd, &od);
    run_forward(&spb_attn_flash, &pw, &ow);
    double diff = rel_err(os.o, od.o, ps.on, ps.omask), same = rel_err(ow.o, od.o, pw.on, pw.omask);
    if (verbose())
        printf("sparse vs dense O: %.2e; window wider than the sequence vs dense: %.2e\n", diff, same);
    ck_assert_msg(diff > 1e-2, "sparse pattern changed nothing (%g)", diff);
    ck_assert_msg(same == 0.0, "an all-covering window differs from dense (%g)", same);
    outputs_free(&os, &ps);
    outputs_free(&od, &pd);
    outputs_free(&ow, &pw);
    problem_free(&ps);
    problem_free(&pd);
    problem_free(&pw);
}
END_TEST

static Suite *attention_suite(void)
{
    Suite *s = suite_create("attention");
    TCase *tc = tcase_create("flash_vs_naive");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_grid_fused, 0, N_GRID);
    tcase_add_loop_test(tc, test_grid_strided_offset, 0, N_GRID);
    tcase_add_loop_test(tc, test_offsets, 0, N_OFFSET);
    tcase_add_test(tc, test_fully_masked);
    tcase_add_test(tc, test_merge_blocks);
    suite_add_tcase(s, tc);

    TCase *tb = tcase_create("contract");
    tcase_add_test(tb, test_accumulates);
    tcase_add_test(tb, test_by_name);
    suite_add_tcase(s, tb);

    TCase *ts = tcase_create("sparse");
    tcase_set_timeout(ts, 120);
    tcase_add_loop_test(ts, test_sparse_flash_vs_naive, 0, N_SPARSE);
    tcase_add_test(ts, test_sparse_visible_counts);
    tcase_add_loop_test(ts, test_sparse_brute_force, 0, N_BRUTE);
    tcase_add_test(ts, test_sparse_changes_result);
    suite_add_tcase(s, ts);

    TCase *tf = tcase_create("finite_differences");
    tcase_set_timeout(tf, 120);
    tcase_add_loop_test(tf, test_finite_differences, 0, N_FD);
    suite_add_tcase(s, tf);

    TCase *tg = tcase_create("grouped_query");
    tcase_add_loop_test(tg, test_gqa_equals_repeated_kv, 0, N_GQA);
    suite_add_tcase(s, tg);
    return s;
}

int main(void)
{
    return spb_run_suite(attention_suite(), CK_FORK_GETENV);
}
