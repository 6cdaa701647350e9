/* Over 700 lines: one test program: every direct bf16 call against the frames, then training. */
/* The bf16 tables' direct path (common/bf16/bf16_direct.h, --bf16-kernels fast)
 * on the CPU emulation of the device's direct kernels, under mpiexec -np 4:
 *   - each product (forward with and without bias, accumulating, strided
 *     column blocks, backward with dinp, dW and db, fp32 outputs), GELU
 *     (forward, backward in place and into its own buffer), LayerNorm and
 *     residual adds (bf16 and fp32 operands, in place), the softmax
 *     cross-entropy (bf16 and fp32 logits, and its loss), fills and copies
 *     across types, AdamW on the masters, sums of squares, the embedding
 *     (repeated tokens and positions, bf16 and fp32 outputs and gradients:
 *     bit for bit the frames), and each
 *     attention call (fused QKV, Ulysses' shared saved buffer, a ring block
 *     with offsets, accumulated backward) against the frame path on the same
 *     data: within one bf16 ulp per element (the paths differ only in the
 *     order of fp32 additions; on the CPU they come out bit-identical), and
 *     the dispatch took the path it should;
 *   - the cases the device cannot take (outputs carrying masters, an operand
 *     that straddles a storage type, overlapping outputs, LayerNorm
 *     statistics stored bf16, head dim 32, a sparse mask, the naive kernel,
 *     --bf16-kernels reference) go through the frames, bit for bit;
 *   - a direct table that loses the bias is caught by the same comparison;
 *   - training: every strategy with --bf16-kernels fast at head dim 64
 *     takes every product, attention, GELU, LayerNorm, residual,
 *     cross-entropy, embedding, AdamW and norm call direct (fills and copies too, but
 *     ZeRO 1-2's parameter allgathers), and tracks fp32 and the reference
 *     path within test_bf16.c's bounds, through an update and a second
 *     step. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "backend.h"
#include "bf16_direct.h"
#include "bf16_ops.h"
#include "device_handles.h"
#include "mpi_check.h"
#include "rng.h"
#include "strategy_check.h"
#include "train.h"

static const spb_backend *bf = &spb_backend_cpu_bf16;
static int world_rank;

/* --- buffers ----------------------------------------------------------------- */

/* n values ~ scale·N(0, 1) from stream `id`, rounded into a table buffer
 * of that role: the same id gives the same buffer. */
static float *buffer(spb_mem_category cat, spb_buffer_role role, long n, float scale, uint64_t id)
{
    float *h = spb_backend_alloc(bf, cat, n, role);
    float *v = malloc(sizeof(float) * (size_t)n);
    for (long i = 0; i < n; i++) v[i] = scale * (float)spb_rng_normal(91, id, (uint64_t)i);
    bf->staging.to_device(h, v, sizeof(float) * (size_t)n);
    free(v);
    return h;
}

static float *host_copy(const float *h, long n)
{
    float *v = malloc(sizeof(float) * (size_t)n);
    bf->staging.to_host(v, h, sizeof(float) * (size_t)n);
    return v;
}

/* bf16 ulps between two values that are each a bf16 (or fp32) value. */
static long ulps(float a, float b)
{
    uint32_t ua, ub;
    memcpy(&ua, &a, 4), memcpy(&ub, &b, 4);
    long ia = (ua & 0x80000000u) ? -(long)(ua & 0x7fffffffu) : (long)ua;
    long ib = (ub & 0x80000000u) ? -(long)(ub & 0x7fffffffu) : (long)ub;
    return labs(ia - ib) >> 16; /* bf16 is fp32's top 16 bits */
}

/* Worst ulp distance between two buffers' contents, and how many differ. */
typedef struct distance {
    long worst, differ;
} distance;

static distance compare(const float *a, const float *b, long n)
{
    float *x = host_copy(a, n), *y = host_copy(b, n);
    distance d = {0, 0};
    for (long i = 0; i < n; i++) {
        long u = ulps(x[i], y[i]);
        d.worst = u > d.worst ? u : d.worst;
        d.differ += memcmp(&x[i], &y[i], 4) != 0;
    }
    free(x), free(y);
    return d;
}

/* Runs fn on two twin sets of buffers, once through the frames and once
 * with the direct kernels `direct` (NULL: frames both times), and returns
 * how far apart the outputs came out; *went_direct: the second run's calls
 * that went direct (any kind). */
typedef struct twin_set twin_set;
typedef void (*op_fn)(twin_set *s);
struct twin_set {
    float *buf[12];
    long len[12];
    int nbuf, outputs[12], noutputs;
};

static distance run_twins(void (*make)(twin_set *), op_fn op, const spb_bf16_direct *direct, long *went_direct)
{
    twin_set a = {0}, b = {0};
    make(&a), make(&b);
    spb_bf16_use_direct(NULL);
    spb_bf16_direct_reset_counts();
    op(&a);
    spb_bf16_direct_counts ca = spb_bf16_direct_get_counts();
    ck_assert_int_eq(ca.matmul_direct + ca.attention_direct + ca.rowwise_direct + ca.memory_direct +
                         ca.optimizer_direct + ca.embedding_direct + ca.bias_direct + ca.merge_direct,
                     0);
    spb_bf16_use_direct(direct);
    spb_bf16_direct_reset_counts();
    op(&b);
    spb_bf16_direct_counts c = spb_bf16_direct_get_counts();
    spb_bf16_use_direct(NULL);
    *went_direct = c.matmul_direct + c.attention_direct + c.rowwise_direct + c.memory_direct + c.optimizer_direct +
                   c.embedding_direct + c.bias_direct + c.merge_direct;
    distance worst = {0, 0};
    for (int k = 0; k < a.noutputs; k++) {
        int i = a.outputs[k];
        distance d = compare(b.buf[i], a.buf[i], a.len[i]);
        worst.worst = d.worst > worst.worst ? d.worst : worst.worst;
        worst.differ += d.differ;
    }
    for (int i = 0; i < a.nbuf; i++) bf->free(a.buf[i]), bf->free(b.buf[i]);
    return worst;
}

static int add(twin_set *s, float *p, long n, int output)
{
    s->buf[s->nbuf] = p, s->len[s->nbuf] = n;
    if (output) s->outputs[s->noutputs++] = s->nbuf;
    return s->nbuf++;
}

/* --- products ------------------------------------------------------------------ */

enum { ROWS = 24, IN = 64, OUT = 48, LDO = 80, LDI = 72, LDW = 70 };

/* x [ROWS][LDI], W [OUT][LDW] (parameters: masters bound), b [OUT], out
 * [ROWS][LDO], dx [ROWS][LDI], dW [OUT][LDW], db [OUT]. */
static void make_product(twin_set *s)
{
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, ROWS * LDI, 1, 1), ROWS * LDI, 0);
    add(s, buffer(SPB_MEM_PARAMS, SPB_BUF_PLAIN, OUT * LDW, 0.2f, 2), OUT * LDW, 0);
    add(s, buffer(SPB_MEM_PARAMS, SPB_BUF_PLAIN, OUT, 0.5f, 3), OUT, 0);
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, ROWS * LDO, 1, 4), ROWS * LDO, 1);
    add(s, buffer(SPB_MEM_WORKSPACE, SPB_BUF_PLAIN, ROWS * LDI, 1, 5), ROWS * LDI, 1);
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_PLAIN, OUT * LDW, 1, 6), OUT * LDW, 1);
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_PLAIN, OUT, 1, 7), OUT, 1);
    /* fp32 outputs (ZeRO's reduced gradient slices are such buffers) */
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_FP32, ROWS * LDO, 1, 8), ROWS * LDO, 1);
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_FP32, OUT * LDW, 1, 9), OUT * LDW, 1);
}
enum { X, W, B, O, DX, DW, DB, O32, DW32 };

static void forward_bias(twin_set *s)
{
    float **p = s->buf;
    bf->matmul_forward(p[O], p[X], p[W], p[B], ROWS, 40, OUT); /* dense [ROWS][40] x [OUT][40] */
}
static void forward_no_bias(twin_set *s) { bf->matmul_forward(s->buf[O], s->buf[X], s->buf[W], NULL, ROWS, 40, OUT); }
static void forward_blocks(twin_set *s)
{
    float **p = s->buf; /* column blocks, accumulated (Megatron's and Ulysses' head blocks) */
    bf->matmul_forward_ld(p[O] + 5, LDO, p[X] + 3, LDI, p[W] + 2, LDW, p[B], ROWS, IN, OUT, 1);
    bf->matmul_forward_ld(p[O] + 7, LDO, p[X], LDI, p[W], LDW, p[B], ROWS, IN, 20, 0);
}
static void forward_fp32_out(twin_set *s)
{
    float **p = s->buf;
    bf->matmul_forward_ld(p[O32], LDO, p[X], LDI, p[W], LDW, p[B], ROWS, IN, OUT, 0);
    bf->matmul_forward_ld(p[O32] + 1, LDO, p[X], LDI, p[W], LDW, NULL, ROWS, IN, OUT, 1);
}
static void backward_all(twin_set *s)
{
    float **p = s->buf;
    bf->matmul_backward(p[DX], p[DW], p[DB], p[O], p[X], p[W], ROWS, 40, OUT, 0);
    bf->matmul_backward(p[DX], p[DW], p[DB], p[O], p[X], p[W], ROWS, 40, OUT, 1);
}
static void backward_blocks(twin_set *s)
{
    float **p = s->buf;
    bf->matmul_backward_ld(p[DX] + 1, LDI, p[DW] + 3, LDW, p[DB], p[O] + 2, LDO, p[X] + 1, LDI, p[W] + 3, LDW, ROWS,
                           60, 40, 1);
    bf->matmul_backward_ld(NULL, 0, p[DW32], LDW, NULL, p[O], LDO, p[X], LDI, NULL, 0, ROWS, IN, OUT, 0);
}
/* Same handle, disjoint ranges: allowed direct (out after inp in one buffer). */
static void forward_same_buffer(twin_set *s)
{
    float **p = s->buf;
    bf->matmul_forward(p[DX] + ROWS * 32, p[DX], p[W], p[B], ROWS, 32, 16);
}

/* Cases the direct kernels must leave to the frames. */
static void output_with_masters(twin_set *s)
{
    float **p = s->buf; /* a parameter buffer (masters bound) as the output */
    bf->matmul_forward(p[W], p[X], p[DW], NULL, ROWS, 40, 40);
}
static void straddling_input(twin_set *s)
{
    float **p = s->buf; /* x's tail turned fp32: the input spans two types */
    spb_handle *h = spb_handle_find(p[X], NULL);
    spb_handle_retype_tail(h, ROWS * LDI - 100);
    bf->matmul_forward_ld(p[O], LDO, p[X], LDI, p[W], LDW, p[B], ROWS, IN, OUT, 0);
}

/* GELU: forward, backward in place (as the core calls it) and into its own
 * buffer; an output overlapping its input off by one element (frames). */
static void gelu_both(twin_set *s)
{
    float **p = s->buf;
    bf->gelu_forward(p[O], p[X], ROWS * 64);
    bf->gelu_backward(p[DX], p[X], p[DX], ROWS * 64);
    bf->gelu_backward(p[DW], p[X], p[O], ROWS * 64);
}
static void gelu_shifted_alias(twin_set *s)
{
    float **p = s->buf;
    bf->gelu_backward(p[DX] + 1, p[X], p[DX], ROWS * 64);
}

/* LayerNorm and residual adds: operands of either type. */
enum { LC = 64 };
static void make_rowwise(twin_set *s)
{
    long n = (long)ROWS * LC;
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, n, 1.5f, 21), n, 0);  /* X */
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_FP32, n, 1.5f, 22), n, 0);   /* XF */
    add(s, buffer(SPB_MEM_PARAMS, SPB_BUF_PLAIN, LC, 0.3f, 23), LC, 0);     /* LW */
    add(s, buffer(SPB_MEM_PARAMS, SPB_BUF_PLAIN, LC, 0.3f, 24), LC, 0);     /* LB */
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, n, 1, 25), n, 1);     /* Y */
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_FP32, n, 1, 26), n, 1);      /* YF */
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, ROWS, 0, 27), ROWS, 1); /* MEAN */
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, ROWS, 0, 28), ROWS, 1); /* RSTD */
    add(s, buffer(SPB_MEM_WORKSPACE, SPB_BUF_PLAIN, n, 1, 29), n, 1);       /* GY */
    add(s, buffer(SPB_MEM_WORKSPACE, SPB_BUF_PLAIN, n, 1, 30), n, 1);       /* GX */
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_PLAIN, LC, 1, 31), LC, 1);         /* GW */
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_PLAIN, LC, 1, 32), LC, 1);         /* GB */
}
enum { RX, RXF, LW, LB, RY, RYF, MEAN, RSTD, GY, GX, GW, GB };

static void layernorm_forward_both(twin_set *s)
{
    float **p = s->buf; /* bf16 in and out; fp32 in and out */
    bf->layernorm_forward(p[RY], p[MEAN], p[RSTD], p[RX], p[LW], p[LB], ROWS, LC);
    bf->layernorm_forward(p[RYF], p[MEAN], p[RSTD], p[RXF], p[LW], p[LB], ROWS, LC);
}
static void layernorm_backward_both(twin_set *s)
{
    float **p = s->buf; /* after its forward; then in place (dinp = dout) */
    bf->layernorm_forward(p[RY], p[MEAN], p[RSTD], p[RX], p[LW], p[LB], ROWS, LC);
    bf->layernorm_backward(p[GX], p[GW], p[GB], p[GY], p[RX], p[LW], p[MEAN], p[RSTD], ROWS, LC);
    bf->layernorm_backward(p[GY], p[GW], p[GB], p[GY], p[RX], p[LW], p[MEAN], p[RSTD], ROWS, LC);
}
static void residual_adds(twin_set *s)
{
    float **p = s->buf;
    long n = (long)ROWS * LC;
    bf->add_inplace(p[RY], p[RX], n);
    bf->add_inplace(p[RYF], p[RX], n);
    bf->add_inplace(p[GX], p[GX], n);
}
static void layernorm_bf16_statistics(twin_set *s)
{
    float **p = s->buf; /* statistics never made fp32 by a forward: frames */
    bf->layernorm_backward(p[GX], p[GW], p[GB], p[GY], p[RX], p[LW], p[MEAN], p[RSTD], ROWS, LC);
}

/* Softmax cross-entropy in place, on bf16 and on fp32 logits; the two
 * runs' losses are kept to be compared too. */
enum { XV = 50 };
static double xent_loss[2][2];
static int xent_run;
static void make_xent(twin_set *s)
{
    static const int picks[ROWS] = {3, 0, 49, 7, 7, 12, 33, 1, 0, 48, 25, 25, 2, 9, 40, 41, 5, 6, 17, 30, 44, 13, 21, 8};
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, (long)ROWS * XV, 3, 41), (long)ROWS * XV, 1);
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_FP32, (long)ROWS * XV, 3, 42), (long)ROWS * XV, 1);
    int *tg = bf->alloc_ints(SPB_MEM_ACTIVATIONS, ROWS);
    bf->ints_to_device(tg, picks, ROWS);
    add(s, (float *)tg, 0, 0);
}
static void cross_entropy(twin_set *s)
{
    float **p = s->buf;
    const int *tg = (const int *)p[2];
    for (int k = 0; k < 2; k++) {
        xent_loss[xent_run][k] = bf->softmax_xent_forward(p[k], tg, ROWS, XV);
        bf->softmax_xent_backward(p[k], tg, ROWS, XV, 0.125f);
    }
    xent_run = !xent_run;
}

/* Fills and copies between buffers of either type (in make_rowwise's set). */
static void memory_ops(twin_set *s)
{
    float **p = s->buf;
    long n = (long)ROWS * LC;
    bf->fill(p[RY], n, 0.3f);           /* rounded into bf16 */
    bf->zero(p[GX], n);
    bf->copy(p[RYF], p[RX], n);         /* bf16 -> fp32 */
    bf->copy(p[GY], p[RXF], n);         /* fp32 -> bf16, rounded */
    bf->copy_rows(p[GX] + 3, LC, p[RXF] + 1, LC, ROWS - 1, LC - 8); /* strided */
}
static void memory_ops_on_frames(twin_set *s)
{
    float **p = s->buf;
    bf->fill(p[LW], LC, 0.5f);                /* a parameter: masters bound */
    bf->copy(p[RX] + 5, p[RX], (long)ROWS * LC - 5); /* overlapping */
}

/* AdamW (two steps) on a parameter buffer with its masters, bf16
 * gradients and fp32 moments; the sum of squares of a bf16 and an fp32
 * buffer (kept to be compared, like the cross-entropy's losses). */
enum { AN = 300 };
static double sums[2][2];
static int sums_run;
static void make_adamw(twin_set *s)
{
    add(s, buffer(SPB_MEM_PARAMS, SPB_BUF_PLAIN, AN, 0.5f, 51), AN, 1);
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_PLAIN, AN, 0.01f, 52), AN, 0);
    add(s, buffer(SPB_MEM_OPTIMIZER, SPB_BUF_FIRST_MOMENT, AN, 0.001f, 53), AN, 1);
    add(s, buffer(SPB_MEM_OPTIMIZER, SPB_BUF_SECOND_MOMENT, AN, 0, 54), AN, 1);
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_FP32, AN, 2, 55), AN, 0);
}
static void optimizer_ops(twin_set *s)
{
    float **p = s->buf;
    spb_config c;
    spb_config_defaults(&c);
    bf->adamw_apply(p[0], p[1], p[2], p[3], AN, 0.5f, 0.1f, &c, 1, 1e-2);
    bf->adamw_apply(p[0], p[1], p[2], p[3], AN, 0.5f, 0.1f, &c, 2, 1e-2);
    sums[sums_run][0] = bf->sum_squares(p[1], AN);
    sums[sums_run][1] = bf->sum_squares(p[4], AN);
    sums_run = !sums_run;
}

/* The embedding: a token table of EV rows and a position table of ET
 * (parameters: masters bound), 24 rows of 2 sequences of T = 12 whose
 * tokens repeat (one three times, across the sequences) and whose
 * positions repeat once within a sequence; outputs bf16 and fp32, and
 * gradients accumulated onto nonzero values from an fp32 and a bf16 dout. */
enum { EV = 40, ET = 16, EC = 64, ESEQ = 12 };
static const long embed_positions[ESEQ] = {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 5};
static void make_embedding(twin_set *s)
{
    static const int picks[ROWS] = {3, 0, 39, 7, 7, 12, 33, 1, 0, 38, 25, 25, 2, 9, 7, 30, 5, 6, 17, 30, 0, 13, 21, 8};
    add(s, buffer(SPB_MEM_PARAMS, SPB_BUF_PLAIN, EV * EC, 0.5f, 61), EV * EC, 0);        /* WTE */
    add(s, buffer(SPB_MEM_PARAMS, SPB_BUF_PLAIN, ET * EC, 0.5f, 62), ET * EC, 0);        /* WPE */
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, ROWS * EC, 1, 63), ROWS * EC, 1);  /* EOUT */
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_FP32, ROWS * EC, 1, 64), ROWS * EC, 1);   /* EOUTF */
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_PLAIN, EV * EC, 0.1f, 65), EV * EC, 1);         /* DWTE */
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_PLAIN, ET * EC, 0.1f, 66), ET * EC, 1);         /* DWPE */
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_FP32, EV * EC, 0.1f, 67), EV * EC, 1);          /* DWTEF */
    add(s, buffer(SPB_MEM_WORKSPACE, SPB_BUF_FP32, ROWS * EC, 1, 68), ROWS * EC, 0);     /* EDOUTF */
    add(s, buffer(SPB_MEM_WORKSPACE, SPB_BUF_PLAIN, ROWS * EC, 1, 69), ROWS * EC, 0);    /* EDOUT */
    int *tok = bf->alloc_ints(SPB_MEM_ACTIVATIONS, ROWS);
    bf->ints_to_device(tok, picks, ROWS);
    add(s, (float *)tok, 0, 0);
}
enum { WTE, WPE, EOUT, EOUTF, DWTE, DWPE, DWTEF, EDOUTF, EDOUT, ETOK };
static void embedding_both(twin_set *s)
{
    float **p = s->buf;
    const int *tok = (const int *)p[ETOK];
    bf->embedding_forward(p[EOUT], tok, p[WTE], p[WPE], embed_positions, ROWS, ESEQ, EC);
    bf->embedding_forward(p[EOUTF], tok, p[WTE], p[WPE], embed_positions, ROWS, ESEQ, EC);
    bf->embedding_backward(p[DWTE], p[DWPE], p[EDOUTF], tok, embed_positions, ROWS, ESEQ, EC);
    bf->embedding_backward(p[DWTEF], p[DWPE], p[EDOUT], tok, embed_positions, ROWS, ESEQ, EC);
}
static void embedding_on_frames(twin_set *s)
{
    float **p = s->buf; /* outputs carrying masters (a parameter written) */
    const int *tok = (const int *)p[ETOK];
    bf->embedding_forward(p[WTE], tok, p[DWTE], p[WPE], embed_positions, ROWS, ESEQ, EC);
    bf->embedding_backward(p[WTE], p[DWPE], p[EDOUT], tok, embed_positions, ROWS, ESEQ, EC);
}

/* The row biases: BR rows (more than a GPU strip of 64, the last strip
 * partial) of x in bf16 and fp32 take a bf16 and an fp32 bias; a bf16 and
 * an fp32 gradient take the column sums of an fp32 and a bf16 dy. */
enum { BR = 150 };
static void make_bias(twin_set *s)
{
    const long n = (long)BR * LC;
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, n, 1, 71), n, 1);   /* BX */
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_FP32, n, 1, 72), n, 1);    /* BXF */
    add(s, buffer(SPB_MEM_PARAMS, SPB_BUF_PLAIN, LC, 0.5f, 73), LC, 0);   /* BB: masters bound */
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_FP32, LC, 0.5f, 74), LC, 0); /* BBF */
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_PLAIN, LC, 0.3f, 75), LC, 1);    /* BDB */
    add(s, buffer(SPB_MEM_GRADS, SPB_BUF_FP32, LC, 0.3f, 76), LC, 1);     /* BDBF */
    add(s, buffer(SPB_MEM_WORKSPACE, SPB_BUF_PLAIN, n, 1, 77), n, 1);     /* BDY */
    add(s, buffer(SPB_MEM_WORKSPACE, SPB_BUF_FP32, n, 1, 78), n, 0);      /* BDYF */
}
enum { BX, BXF, BB, BBF, BDB, BDBF, BDY, BDYF };
static void bias_both(twin_set *s)
{
    float **p = s->buf;
    bf->add_bias_rows(p[BX], p[BB], BR, LC);
    bf->add_bias_rows(p[BXF], p[BBF], BR, LC);
    bf->bias_grad_rows(p[BDB], p[BDYF], BR, LC);
    bf->bias_grad_rows(p[BDBF], p[BDY], BR, LC);
}
static void bias_on_frames(twin_set *s)
{
    float **p = s->buf; /* a parameter written (masters), a gradient overlapping its dy */
    bf->add_bias_rows(p[BB], p[BBF], 1, LC);
    bf->bias_grad_rows(p[BDY] + 5, p[BDY] + LC, 2, LC);
}

/* Ring attention's merge: O [MB][MT][MH][MD] in bf16 and fp32, the running
 * log-sum-exps fp32 with rows that saw no key yet (-inf), the pair's with
 * rows that saw none (-inf); merged over rows [2, 7), then over all rows. */
enum { MB = 2, MH = 2, MD = 64, MT = 12, MO_N = MB * MT * MH * MD, ML_N = MB * MH * MT };
static float *lse_buffer(spb_buffer_role role, uint64_t id, const int *minus_inf, int count)
{
    float v[ML_N];
    for (int i = 0; i < ML_N; i++) v[i] = 2.0f * (float)spb_rng_normal(91, id, (uint64_t)i);
    for (int k = 0; k < count; k++) v[minus_inf[k]] = -INFINITY;
    float *h = spb_backend_alloc(bf, SPB_MEM_WORKSPACE, ML_N, role);
    bf->staging.to_device(h, v, sizeof v);
    return h;
}
static void make_merge(twin_set *s)
{
    static const int acc_empty[] = {0, 5, 3 * MT + 3}, pair_empty[] = {1, 7, 30};
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, MO_N, 1, 81), MO_N, 1);         /* MO */
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_FP32, MO_N, 1, 82), MO_N, 1);          /* MOF */
    add(s, buffer(SPB_MEM_WORKSPACE, SPB_BUF_PLAIN, MO_N, 1, 83), MO_N, 0);           /* MP */
    add(s, buffer(SPB_MEM_WORKSPACE, SPB_BUF_FP32, MO_N, 1, 84), MO_N, 0);            /* MPF */
    add(s, lse_buffer(SPB_BUF_FP32, 85, acc_empty, 3), ML_N, 1);                      /* MLA */
    add(s, lse_buffer(SPB_BUF_FP32, 86, acc_empty, 3), ML_N, 1);                      /* MLA2 */
    add(s, lse_buffer(SPB_BUF_FP32, 87, pair_empty, 3), ML_N, 0);                     /* MLP */
    add(s, lse_buffer(SPB_BUF_PLAIN, 88, pair_empty, 3), ML_N, 0);                    /* MLPB */
}
enum { MO, MOF, MP, MPF, MLA, MLA2, MLP, MLPB };
static void merge_both(twin_set *s)
{
    float **p = s->buf; /* the pair's lse of rows [2, 7) is its first 5 per (batch, head) */
    bf->attn_merge(p[MO], p[MLA], p[MP], p[MLP], MB, MH, MD, MT, 2, 5);
    bf->attn_merge(p[MO], p[MLA], p[MPF], p[MLP], MB, MH, MD, MT, 0, MT);
    bf->attn_merge(p[MOF], p[MLA2], p[MP], p[MLP], MB, MH, MD, MT, 0, MT);
}
static void merge_on_frames(twin_set *s)
{
    float **p = s->buf; /* the pair's lse stored bf16 */
    bf->attn_merge(p[MO], p[MLA], p[MP], p[MLPB], MB, MH, MD, MT, 0, MT);
}

typedef struct product_case {
    const char *name;
    op_fn op;
    long direct_calls; /* how many calls should go direct */
    void (*make)(twin_set *); /* NULL: make_product */
} product_case;

static const product_case product_cases[] = {
    {"forward, bias", forward_bias, 1, NULL},
    {"forward, no bias", forward_no_bias, 1, NULL},
    {"forward_ld, column blocks, accumulate", forward_blocks, 2, NULL},
    {"forward_ld, fp32 output", forward_fp32_out, 2, NULL},
    {"backward, dinp = and +=", backward_all, 2, NULL},
    {"backward_ld, blocks, no dinp, fp32 dW", backward_blocks, 2, NULL},
    {"forward, output beside the input", forward_same_buffer, 1, NULL},
    {"output carrying masters (frames)", output_with_masters, 0, NULL},
    {"input straddling bf16 and fp32 (frames)", straddling_input, 0, NULL},
    {"GELU forward, backward in place and not", gelu_both, 3, NULL},
    {"GELU output one element off its input (frames)", gelu_shifted_alias, 0, NULL},
    {"LayerNorm forward, bf16 and fp32 operands", layernorm_forward_both, 2, make_rowwise},
    {"LayerNorm backward, and in place", layernorm_backward_both, 3, make_rowwise},
    {"residual adds, bf16 and fp32, a += a", residual_adds, 3, make_rowwise},
    {"LayerNorm statistics stored bf16 (frames)", layernorm_bf16_statistics, 0, make_rowwise},
    {"cross-entropy on bf16 and fp32 logits", cross_entropy, 4, make_xent},
    {"fill, zero, copy and copy_rows across types", memory_ops, 5, make_rowwise},
    {"fill of a parameter, overlapping copy (frames)", memory_ops_on_frames, 0, make_rowwise},
    {"AdamW on the masters, sums of squares", optimizer_ops, 4, make_adamw},
    {"embedding forward and backward, repeated rows", embedding_both, 4, make_embedding},
    {"embedding outputs carrying masters (frames)", embedding_on_frames, 0, make_embedding},
    {"bias rows added and summed, bf16 and fp32", bias_both, 4, make_bias},
    {"bias into a parameter, overlapping dy (frames)", bias_on_frames, 0, make_bias},
    {"ring merges, bf16 and fp32 O, empty rows", merge_both, 3, make_merge},
    {"ring merge of a bf16 log-sum-exp (frames)", merge_on_frames, 0, make_merge},
};

START_TEST(products_match_the_frames)
{
    for (size_t c = 0; c < sizeof product_cases / sizeof product_cases[0]; c++) {
        const product_case *k = &product_cases[c];
        long direct = 0;
        distance d = run_twins(k->make ? k->make : make_product, k->op, &spb_bf16_direct_cpu, &direct);
        if (!world_rank)
            printf("%-50s direct calls %ld, worst %ld ulp, %ld elements differ\n", k->name, direct, d.worst,
                   d.differ);
        ck_assert_msg(direct == k->direct_calls, "%s: %ld calls went direct, want %ld", k->name, direct,
                      k->direct_calls);
        ck_assert_msg(d.worst <= 1, "%s: %ld ulp from the frames", k->name, d.worst);
        if (!k->direct_calls) ck_assert_msg(d.differ == 0, "%s: the frames differ from themselves", k->name);
        /* the embedding's sums, the biases' and the merges run in the frames' order: bit for bit theirs */
        if (k->op == embedding_both || k->op == bias_both || k->op == merge_both)
            ck_assert_msg(d.differ == 0, "%s: %ld elements differ from the frames", k->name, d.differ);
    }
    for (int k = 0; k < 2; k++)
        ck_assert_msg(sums[1][k] == sums[0][k], "sum of squares %.17g (direct) against %.17g (frames)", sums[1][k],
                      sums[0][k]);
    /* the cross-entropy's losses, from the fp32 logits either way */
    for (int k = 0; k < 2; k++)
        ck_assert_msg(fabs(xent_loss[1][k] - xent_loss[0][k]) <= 1e-6 * fabs(xent_loss[0][k]),
                      "cross-entropy loss %.9g (direct) against %.9g (frames)", xent_loss[1][k], xent_loss[0][k]);
    ck_assert_int_eq(spb_handles_live(), 0);
}
END_TEST

/* A direct table whose products forget C (beta): the bias is lost. */
static void gemm_without_beta(int ta, int tb, int m, int n, int k, const spb_bf16 *A, int lda, const spb_bf16 *B,
                              int ldb, float beta, void *C, spb_dtype ct, int ldc)
{
    (void)beta;
    spb_bf16_direct_cpu.gemm(ta, tb, m, n, k, A, lda, B, ldb, 0.0f, C, ct, ldc);
}

START_TEST(a_direct_table_that_loses_the_bias_is_caught)
{
    spb_bf16_direct broken = spb_bf16_direct_cpu;
    broken.gemm = gemm_without_beta;
    long direct = 0;
    distance d = run_twins(make_product, forward_bias, &broken, &direct);
    ck_assert_int_eq(direct, 1);
    ck_assert_msg(d.worst > 1000, "a lost bias came out %ld ulp away", d.worst);
    d = run_twins(make_product, backward_all, &broken, &direct);
    ck_assert_msg(d.worst > 1000, "a lost accumulation came out %ld ulp away", d.worst);
}
END_TEST

/* --- attention ------------------------------------------------------------------ */

enum { AB = 2, AH = 2, AT = 32 };
static int head_dim = 64, sparse = 0;

/* [B][T][3][H][D] fused QKV, O, lse, dQKV, dO; and a "saved" buffer holding
 * QKV, then O, then lse, as Ulysses keeps them. */
static long qkv_len(void) { return (long)AB * AT * 3 * AH * head_dim; }
static long o_len(void) { return (long)AB * AT * AH * head_dim; }
static void make_attention(twin_set *s)
{
    long nq = qkv_len(), no = o_len(), nl = (long)AB * AH * AT;
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, nq, 1, 11), nq, 0);
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, no, 1, 12), no, 1);
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_FP32, nl, 0, 13), nl, 1);
    add(s, buffer(SPB_MEM_WORKSPACE, SPB_BUF_PLAIN, nq, 0, 14), nq, 1);
    add(s, buffer(SPB_MEM_WORKSPACE, SPB_BUF_PLAIN, no, 1, 15), no, 0);
    add(s, buffer(SPB_MEM_ACTIVATIONS, SPB_BUF_PLAIN, nq + no + nl, 1, 16), nq + no + nl, 1);
}
enum { QKV, AO, LSE, DQKV, DO, SAVED };

static spb_attn_desc desc(int q_len, int k_len, long q_off, long k_off)
{
    spb_attn_desc d = {0};
    long W = (long)AH * head_dim;
    d.batch = AB, d.heads = AH, d.head_dim = head_dim, d.q_len = q_len, d.k_len = k_len;
    d.q_offset = q_off, d.k_offset = k_off, d.causal = 1, d.scale = 1.0f / sqrtf((float)head_dim);
    d.q_token_stride = d.k_token_stride = 3 * W, d.q_batch_stride = d.k_batch_stride = AT * 3 * W;
    d.o_token_stride = W, d.o_batch_stride = AT * W;
    if (sparse) d.sparse_block = 8, d.sparse_local = 1, d.sparse_global = 1;
    return d;
}

static const spb_attn_backend *flash(void) { return bf->attention("flash"); }

static void attention_fused(twin_set *s)
{
    float **p = s->buf;
    long W = (long)AH * head_dim;
    spb_attn_desc d = desc(AT, AT, 0, 0);
    flash()->forward(&d, p[QKV], p[QKV] + W, p[QKV] + 2 * W, p[AO], p[LSE]);
    flash()->backward(&d, p[QKV], p[QKV] + W, p[QKV] + 2 * W, p[AO], p[LSE], p[DO], p[DQKV], p[DQKV] + W,
                      p[DQKV] + 2 * W);
}

/* Ulysses' saved buffer: O and then the log-sum-exp behind QKV in one
 * handle (the forward turns the lse tail fp32 and must still go direct). */
static void attention_saved_buffer(twin_set *s)
{
    float **p = s->buf;
    long W = (long)AH * head_dim;
    float *qkv = p[SAVED], *o = p[SAVED] + qkv_len(), *lse = o + o_len();
    spb_attn_desc d = desc(AT, AT, 0, 0);
    flash()->forward(&d, qkv, qkv + W, qkv + 2 * W, o, lse);
    flash()->backward(&d, qkv, qkv + W, qkv + 2 * W, o, lse, p[DO], p[DQKV], p[DQKV] + W, p[DQKV] + 2 * W);
}

/* A ring step: the second half of the queries against the first half of
 * the keys (all visible), then the diagonal block; dQKV accumulates. */
static void attention_ring_blocks(twin_set *s)
{
    float **p = s->buf;
    long W = (long)AH * head_dim, half = (long)(AT / 2) * 3 * W;
    spb_attn_desc off = desc(AT / 2, AT / 2, AT / 2, 0), diag = desc(AT / 2, AT / 2, AT / 2, AT / 2);
    float *q = p[QKV] + half, *o = p[AO] + (long)(AT / 2) * W, *dq = p[DQKV] + half;
    flash()->forward(&off, q, p[QKV] + W, p[QKV] + 2 * W, o, p[LSE]);
    flash()->backward(&off, q, p[QKV] + W, p[QKV] + 2 * W, o, p[LSE], p[DO], dq, p[DQKV] + W, p[DQKV] + 2 * W);
    flash()->backward(&diag, q, q + W, q + 2 * W, o, p[LSE], p[DO], dq, dq + W, dq + 2 * W);
}

static void attention_naive(twin_set *s)
{
    float **p = s->buf;
    long W = (long)AH * head_dim;
    spb_attn_desc d = desc(AT, AT, 0, 0);
    bf->attention("naive")->forward(&d, p[QKV], p[QKV] + W, p[QKV] + 2 * W, p[AO], p[LSE]);
}

START_TEST(attention_matches_the_frames)
{
    static const struct {
        const char *name;
        op_fn op;
        int head_dim, sparse;
        long direct_calls;
    } cases[] = {
        {"fused QKV, causal, D=64", attention_fused, 64, 0, 2},
        {"fused QKV, causal, D=128", attention_fused, 128, 0, 2},
        {"Ulysses' saved buffer", attention_saved_buffer, 64, 0, 2},
        {"ring blocks with offsets", attention_ring_blocks, 64, 0, 3},
        {"head dim 32 (frames)", attention_fused, 32, 0, 0},
        {"blocked-sparse mask (frames)", attention_fused, 64, 1, 0},
        {"naive kernel (frames)", attention_naive, 64, 0, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        head_dim = cases[c].head_dim, sparse = cases[c].sparse;
        long direct = 0;
        distance d = run_twins(make_attention, cases[c].op, &spb_bf16_direct_cpu, &direct);
        if (!world_rank)
            printf("attention %-30s direct calls %ld, worst %ld ulp, %ld elements differ\n", cases[c].name, direct,
                   d.worst, d.differ);
        ck_assert_msg(direct == cases[c].direct_calls, "%s: %ld calls went direct, want %ld", cases[c].name, direct,
                      cases[c].direct_calls);
        ck_assert_msg(d.worst <= 1, "%s: %ld ulp from the frames", cases[c].name, d.worst);
    }
    head_dim = 64, sparse = 0;
    ck_assert_int_eq(spb_handles_live(), 0);
}
END_TEST

/* --attention cudnn's direct dispatch (bf16_direct.c), without cuDNN: a
 * table whose cuDNN entries run the flash emulation (accepting every call)
 * or decline every call.  Accepted calls go direct through the entries and
 * equal the frames; declined ones leave nothing written (the backward's
 * dQ/dK/dV frame is stored back unchanged) and the caller's fallback gives
 * the frames' result; a table without the entries never goes direct. */
static int decline_cudnn;
static long cudnn_ran, cudnn_declined;
static int fake_cudnn_forward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                              spb_bf16 *o, float *lse)
{
    if (decline_cudnn) return cudnn_declined++, -1;
    cudnn_ran++;
    spb_bf16_direct_cpu.attention_forward(d, q, k, v, o, lse);
    return 0;
}
static int fake_cudnn_backward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                               const spb_bf16 *o, const float *lse, const spb_bf16 *dout, float *dq, float *dk,
                               float *dv)
{
    if (decline_cudnn) return cudnn_declined++, -1;
    cudnn_ran++;
    spb_bf16_direct_cpu.attention_backward(d, q, k, v, o, lse, dout, dq, dk, dv);
    return 0;
}

/* The cudnn wrapper's order (bf16_ops.c): the direct entry, else the
 * frames (here the flash kernel's, which the CPU table has). */
static void cudnn_forward(const spb_attn_desc *d, const float *q, const float *k, const float *v, float *o, float *lse)
{
    if (!spb_bf16_direct_attention_forward(SPB_DIRECT_CUDNN, d, q, k, v, o, lse)) flash()->forward(d, q, k, v, o, lse);
}
static void cudnn_backward(const spb_attn_desc *d, const float *q, const float *k, const float *v, const float *o,
                           const float *lse, const float *dout, float *dq, float *dk, float *dv)
{
    if (!spb_bf16_direct_attention_backward(SPB_DIRECT_CUDNN, d, q, k, v, o, lse, dout, dq, dk, dv))
        flash()->backward(d, q, k, v, o, lse, dout, dq, dk, dv);
}

/* attention_ring_blocks' calls through the cudnn order: offsets, and dQKV
 * accumulated over two blocks. */
static void attention_cudnn_ring_blocks(twin_set *s)
{
    float **p = s->buf;
    long W = (long)AH * head_dim, half = (long)(AT / 2) * 3 * W;
    spb_attn_desc off = desc(AT / 2, AT / 2, AT / 2, 0), diag = desc(AT / 2, AT / 2, AT / 2, AT / 2);
    float *q = p[QKV] + half, *o = p[AO] + (long)(AT / 2) * W, *dq = p[DQKV] + half;
    cudnn_forward(&off, q, p[QKV] + W, p[QKV] + 2 * W, o, p[LSE]);
    cudnn_backward(&off, q, p[QKV] + W, p[QKV] + 2 * W, o, p[LSE], p[DO], dq, p[DQKV] + W, p[DQKV] + 2 * W);
    cudnn_backward(&diag, q, q + W, q + 2 * W, o, p[LSE], p[DO], dq, dq + W, dq + 2 * W);
}

START_TEST(cudnn_attention_dispatch)
{
    spb_bf16_direct with_cudnn = spb_bf16_direct_cpu;
    with_cudnn.cudnn_attention_forward = fake_cudnn_forward;
    with_cudnn.cudnn_attention_backward = fake_cudnn_backward;
    static const struct {
        const char *name;
        int has_entries, decline;
        long direct_calls, entry_calls, declines, frames_calls;
    } cases[] = {
        {"cudnn entries take every call", 1, 0, 3, 3, 0, 0},
        {"cudnn entries decline every call", 1, 1, 3, 0, 3, 3}, /* the fallback's flash calls go direct */
        {"no cudnn entries", 0, 0, 3, 0, 0, 3},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        decline_cudnn = cases[c].decline, cudnn_ran = cudnn_declined = 0;
        long direct = 0;
        distance d = run_twins(make_attention, attention_cudnn_ring_blocks,
                               cases[c].has_entries ? &with_cudnn : &spb_bf16_direct_cpu, &direct);
        spb_bf16_direct_counts n = spb_bf16_direct_get_counts();
        if (!world_rank)
            printf("attention %-34s direct %ld (entries %ld, declined %ld), frames %ld, worst %ld ulp\n",
                   cases[c].name, direct, cudnn_ran, cudnn_declined, n.attention_frames, d.worst);
        ck_assert_msg(direct == cases[c].direct_calls && cudnn_ran == cases[c].entry_calls &&
                          cudnn_declined == cases[c].declines && n.attention_frames == cases[c].frames_calls,
                      "%s: direct %ld, entries %ld, declined %ld, frames %ld", cases[c].name, direct, cudnn_ran,
                      cudnn_declined, n.attention_frames);
        ck_assert_msg(d.worst <= 1, "%s: %ld ulp from the frames", cases[c].name, d.worst);
    }
    ck_assert_int_eq(spb_handles_live(), 0);
}
END_TEST

/* --- training ---------------------------------------------------------------------- */

enum { GLOBAL_BATCH = 4, TRAIN_LAYERS = 2 };

typedef struct train_case {
    const char *strategy, *layout;
    int P, zero, checkpoint;
} train_case;

static void train_config(spb_config *c, const train_case *k, const char *precision, const char *kernels)
{
    spb_config_defaults(c);
    /* head dim 64: a size the device's flash kernel takes */
    c->num_layers = TRAIN_LAYERS, c->hidden_size = 256, c->num_heads = 4, c->vocab_size = 64, c->seq_length = 64;
    c->micro_batch_size = GLOBAL_BATCH / (4 / k->P), c->global_batch_size = GLOBAL_BATCH;
    c->lr = 1e-2, c->weight_decay = 0.1, c->clip_grad = 0.5, c->adam_eps = 1e-4;
    c->sp_degree = k->P, c->zero_stage = k->zero, c->checkpoint_activations = k->checkpoint;
    snprintf(c->strategy, sizeof c->strategy, "%s", k->strategy);
    snprintf(c->ring_layout, sizeof c->ring_layout, "%s", k->layout);
    snprintf(c->precision, sizeof c->precision, "%s", precision);
    if (kernels) snprintf(c->bf16_kernels, sizeof c->bf16_kernels, "%s", kernels);
}

/* Step-1 loss and global gradients of a run; counts of the step. */
static float *train(const train_case *k, const char *precision, const char *kernels, double *loss, const spb_gpt **shape,
                    spb_trainer **keep, spb_bf16_direct_counts *counts)
{
    spb_config c;
    train_config(&c, k, precision, kernels);
    spb_grid *g = malloc(sizeof *g);
    spb_trainer *t = make(&c, MPI_COMM_WORLD, g);
    spb_bf16_direct_reset_counts();
    *loss = spb_trainer_gradients(t);
    *counts = spb_bf16_direct_get_counts();
    *keep = t, *shape = t->gpt;
    return global_grads(t);
}

/* The optimizer's update (AdamW on the masters, ZeRO's parameter
 * allgathers) and the next step's loss. */
static double later_loss(spb_trainer *t)
{
    spb_trainer_update(t);
    return spb_trainer_step(t);
}

static void drop(spb_trainer *t)
{
    spb_grid *g = (spb_grid *)t->grid;
    spb_trainer_destroy(t);
    spb_grid_destroy(g);
    free(g);
}

/* test_bf16.c's bounds at L = 2: 2 x 1.66e-3 x sqrt(24 + 8L) = 2.1e-2 per
 * gradient tensor, 1e-4 on the loss.  Against the reference path the
 * emulation comes out within a few fp32 ulps (the same cblas calls on the
 * same values: only the order of some sums differs); the device's products
 * sum in other orders, so the bound for it is bf16's, not fp32's. */
static const double LOSS_BOUND = 1e-4, LATER_LOSS_BOUND = 2e-4;
static double gradient_bound(int layers) { return 2.0 * 1.66e-3 * sqrt(24.0 + 8.0 * layers); }

/* A step under fast: every product, attention and row-wise call direct;
 * an update: every AdamW and norm call direct. */
static void assert_step_direct(const char *precision, const train_case *k, spb_bf16_direct_counts c)
{
    ck_assert_msg(c.matmul_frames == 0 && c.attention_frames == 0 && c.rowwise_frames == 0 && c.matmul_direct > 0 &&
                      c.attention_direct > 0 && c.rowwise_direct > 0,
                  "%s %s P=%d: %ld products, %ld attention and %ld row-wise calls went through the frames", precision,
                  k->strategy, k->P, c.matmul_frames, c.attention_frames, c.rowwise_frames);
    ck_assert_msg(c.embedding_frames == 0 && c.embedding_direct == 2,
                  "%s %s P=%d ZeRO-%d: embedding direct %ld, frames %ld (want 2 direct: forward, backward)", precision,
                  k->strategy, k->P, k->zero, c.embedding_direct, c.embedding_frames);
    /* two biases a layer forward (again when recomputed), their two gradients backward */
    const long biases = TRAIN_LAYERS * (k->checkpoint ? 6 : 4);
    ck_assert_msg(c.bias_frames == 0 && c.bias_direct == biases,
                  "%s %s P=%d ZeRO-%d ckpt=%d: bias rows direct %ld, frames %ld (want %ld direct)", precision,
                  k->strategy, k->P, k->zero, k->checkpoint, c.bias_direct, c.bias_frames, biases);
    const int ring = !strcmp(k->strategy, "ring");
    ck_assert_msg(c.merge_frames == 0 && (ring ? c.merge_direct > 0 : c.merge_direct == 0),
                  "%s %s P=%d: ring merges direct %ld, frames %ld", precision, k->strategy, k->P, c.merge_direct,
                  c.merge_frames);
}
static void assert_update_direct(const char *precision, const train_case *k, spb_bf16_direct_counts c)
{
    ck_assert_msg(c.optimizer_direct > 0 && c.optimizer_frames == 0,
                  "%s %s P=%d ZeRO-%d: %ld AdamW or norm calls went through the frames", precision, k->strategy, k->P,
                  k->zero, c.optimizer_frames);
}

START_TEST(training_goes_direct_and_tracks_fp32)
{
    static const train_case cases[] = {
        {"none", "contiguous", 1, 0, 0},    {"none", "contiguous", 1, 3, 1},   {"ulysses", "contiguous", 4, 0, 0},
        {"ulysses", "contiguous", 2, 2, 1}, {"megatron", "contiguous", 2, 1, 0}, {"megatron", "contiguous", 4, 3, 0},
        {"ring", "zigzag", 4, 0, 0},        {"ring", "contiguous", 2, 3, 1},
    };
    double worst_fp32 = 0, worst_ref = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const train_case *k = &cases[i];
        double l32, lref, lfast;
        const spb_gpt *shape;
        spb_trainer *t32, *tref, *tfast;
        spb_bf16_direct_counts c32, cref, cfast;
        float *g32 = train(k, "fp32", NULL, &l32, &shape, &t32, &c32);
        drop(t32);
        float *gref = train(k, "bf16", "reference", &lref, &shape, &tref, &cref);
        double lref2 = later_loss(tref);
        drop(tref);
        float *gfast = train(k, "bf16", "fast", &lfast, &shape, &tfast, &cfast);
        const char *w32 = "", *wref = "";
        double e32 = worst_tensor_error(shape, gfast, g32, &w32), eref = worst_tensor_error(shape, gfast, gref, &wref);
        double le = fabs(lfast - l32) / fabs(l32);
        if (!world_rank)
            printf("%-8s P=%d ZeRO-%d ckpt=%d | direct: %ld products, %ld attention, %ld row-wise, %ld memory, %ld "
                   "bias, %ld merges; frames: %ld, %ld, %ld, %ld, %ld, %ld | fast vs fp32: loss %.2e grad %.2e (%s) | "
                   "fast vs reference: grad %.2e (%s)\n",
                   k->strategy, k->P, k->zero, k->checkpoint, cfast.matmul_direct, cfast.attention_direct,
                   cfast.rowwise_direct, cfast.memory_direct, cfast.bias_direct, cfast.merge_direct,
                   cfast.matmul_frames, cfast.attention_frames, cfast.rowwise_frames, cfast.memory_frames,
                   cfast.bias_frames, cfast.merge_frames, le, e32, w32, eref, wref);
        /* The reference path never goes direct; the fast one always does. */
        ck_assert_int_eq(cref.matmul_direct + cref.attention_direct + cref.rowwise_direct + cref.memory_direct +
                             cref.bias_direct + cref.merge_direct,
                         0);
        /* Fills and copies go direct unless they write parameters whose
         * masters are bound (ZeRO 1-2's allgathered parameters): some may
         * stay on the frames, by design. */
        ck_assert_msg(cfast.memory_direct > 0, "%s P=%d: no fill or copy went direct", k->strategy, k->P);
        assert_step_direct("bf16", k, cfast);
        ck_assert_msg(e32 <= gradient_bound(2) && eref <= gradient_bound(2), "%s P=%d ZeRO-%d: gradient %s off by %.2e/%.2e",
                      k->strategy, k->P, k->zero, w32, e32, eref);
        ck_assert_msg(le <= LOSS_BOUND, "%s P=%d: loss off by %.2e", k->strategy, k->P, le);
        worst_fp32 = fmax(worst_fp32, e32), worst_ref = fmax(worst_ref, eref);
        spb_bf16_direct_reset_counts();
        double lfast2 = later_loss(tfast);
        spb_bf16_direct_counts cupd = spb_bf16_direct_get_counts();
        double le2 = fabs(lfast2 - lref2) / fabs(lref2);
        if (!world_rank)
            printf("         update and step 2: fast vs reference loss %.2e; fills and copies direct %ld, frames %ld; "
                   "AdamW and norms direct %ld, frames %ld\n",
                   le2, cupd.memory_direct, cupd.memory_frames, cupd.optimizer_direct, cupd.optimizer_frames);
        assert_update_direct("bf16", k, cupd);
        ck_assert_msg(le2 <= LATER_LOSS_BOUND, "%s P=%d ZeRO-%d: step-2 loss off by %.2e", k->strategy, k->P, k->zero,
                      le2);
        drop(tfast);
        free(g32), free(gref), free(gfast);
    }
    if (!world_rank)
        printf("worst gradient tensor: fast vs fp32 %.2e, fast vs reference %.2e (bound %.2e)\n", worst_fp32, worst_ref,
               gradient_bound(2));
}
END_TEST

/* --precision fp16 on the same kernels: the direct table reads and writes
 * the process's 16-bit format, so fp16 runs go direct too, attention
 * included (the device's flash kernels are templates on the element type).
 * On the CPU the emulation computes what the frames compute, from
 * the same fp16 values, so fast and reference differ only by the order of
 * some fp32 sums: a few fp32 ulps, far under one fp16 ulp (2^-11 = 4.9e-4);
 * the bound below is 1e-5 per tensor.  A kernel that read fp16 storage as
 * bf16 (or rounded to bf16) would be off by 1e-2 or more.  Its own case
 * and process (ctest bf16_direct_fp16_mpi4: CK_RUN_CASE=fp16): the 16-bit
 * format is one per process, and the strategies keep 16-bit buffers from
 * the bf16 runs of the other case until the process ends. */
START_TEST(fp16_training_goes_direct)
{
    static const train_case cases[] = {
        {"none", "contiguous", 1, 0, 0},
        {"ulysses", "contiguous", 2, 2, 1},
        {"megatron", "contiguous", 2, 3, 0},
        {"ring", "zigzag", 4, 1, 0},
    };
    const double bound = 1e-5;
    double worst = 0, worst_loss = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const train_case *k = &cases[i];
        double lref, lfast;
        const spb_gpt *shape;
        spb_trainer *tref, *tfast;
        spb_bf16_direct_counts cref, cfast;
        float *gref = train(k, "fp16", "reference", &lref, &shape, &tref, &cref);
        double lref2 = later_loss(tref);
        drop(tref);
        float *gfast = train(k, "fp16", "fast", &lfast, &shape, &tfast, &cfast);
        const char *w = "";
        double e = worst_tensor_error(shape, gfast, gref, &w), le = fabs(lfast - lref) / fabs(lref);
        spb_bf16_direct_reset_counts();
        double lfast2 = later_loss(tfast);
        spb_bf16_direct_counts cupd = spb_bf16_direct_get_counts();
        double le2 = fabs(lfast2 - lref2) / fabs(lref2);
        if (!world_rank)
            printf("fp16 %-8s P=%d ZeRO-%d ckpt=%d | direct: %ld products, %ld attention, %ld row-wise; frames: %ld, "
                   "%ld, %ld | fast vs reference: loss %.2e, grad %.2e (%s), step-2 loss %.2e\n",
                   k->strategy, k->P, k->zero, k->checkpoint, cfast.matmul_direct, cfast.attention_direct,
                   cfast.rowwise_direct, cfast.matmul_frames, cfast.attention_frames, cfast.rowwise_frames, le, e, w,
                   le2);
        ck_assert_int_eq(cref.matmul_direct + cref.attention_direct + cref.rowwise_direct + cref.memory_direct, 0);
        assert_step_direct("fp16", k, cfast);
        assert_update_direct("fp16", k, cupd);
        ck_assert_msg(e <= bound && le <= bound && le2 <= bound, "fp16 %s P=%d ZeRO-%d: %s off by %.2e, loss %.2e/%.2e",
                      k->strategy, k->P, k->zero, w, e, le, le2);
        worst = fmax(worst, e), worst_loss = fmax(worst_loss, fmax(le, le2));
        drop(tfast);
        free(gref), free(gfast);
    }
    if (!world_rank)
        printf("fp16 worst: gradient tensor %.2e, loss %.2e (bound %.0e)\n", worst, worst_loss, bound);
}
END_TEST

START_TEST(bf16_kernels_option)
{
    spb_config c;
    char err[256];
    spb_config_defaults(&c);
    snprintf(c.precision, sizeof c.precision, "bf16");
    ck_assert_int_eq(spb_config_finalize(&c, 1, err, sizeof err), 0);
    ck_assert_str_eq(c.bf16_kernels, "reference"); /* the CPU's default: the frames */
    if (spb_backend_available("cuda")) {
        spb_config_defaults(&c);
        snprintf(c.precision, sizeof c.precision, "bf16");
        snprintf(c.device, sizeof c.device, "cuda");
        ck_assert_msg(spb_config_finalize(&c, 1, err, sizeof err) == 0, "%s", err);
        ck_assert_str_eq(c.bf16_kernels, "fast"); /* the device's default */
    }
    spb_config_defaults(&c);
    char *fast[] = {"spbench", "--precision", "bf16", "--bf16-kernels", "fast", NULL};
    ck_assert_int_eq(spb_config_parse(5, fast, &c, err, sizeof err), 0);
    ck_assert_int_eq(spb_config_finalize(&c, 1, err, sizeof err), 0);
    ck_assert_str_eq(c.bf16_kernels, "fast");
    spb_config_defaults(&c);
    char *bogus[] = {"spbench", "--precision", "bf16", "--bf16-kernels", "turbo", NULL};
    ck_assert_int_eq(spb_config_parse(5, bogus, &c, err, sizeof err), 0);
    ck_assert_int_eq(spb_config_finalize(&c, 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "unknown --bf16-kernels 'turbo' (fast, reference)"), "%s", err);
    spb_config_defaults(&c);
    char *fp32[] = {"spbench", "--bf16-kernels", "fast", NULL};
    ck_assert_int_eq(spb_config_parse(3, fp32, &c, err, sizeof err), 0);
    ck_assert_int_eq(spb_config_finalize(&c, 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "applies to --precision bf16 and fp16 only"), "%s", err);
    /* --bf16-direct: kinds, with fast only */
    spb_config_defaults(&c);
    char *kinds[] = {"spbench", "--precision", "bf16", "--bf16-kernels", "fast", "--bf16-direct", "products,gelu", NULL};
    ck_assert_int_eq(spb_config_parse(7, kinds, &c, err, sizeof err), 0);
    ck_assert_msg(spb_config_finalize(&c, 1, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(spb_bf16_direct_parse_kinds(c.bf16_direct, err, sizeof err),
                     SPB_DIRECT_PRODUCTS | SPB_DIRECT_GELU);
    ck_assert_int_eq(spb_bf16_direct_parse_kinds("none", err, sizeof err), 0);
    ck_assert_int_eq(spb_bf16_direct_parse_kinds("", err, sizeof err), SPB_DIRECT_ALL);
    snprintf(c.bf16_direct, sizeof c.bf16_direct, "products,softmax");
    ck_assert_int_eq(spb_config_finalize(&c, 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "unknown kind 'softmax' in --bf16-direct"), "%s", err);
    spb_config_defaults(&c);
    snprintf(c.precision, sizeof c.precision, "bf16");
    snprintf(c.bf16_direct, sizeof c.bf16_direct, "attention");
    ck_assert_int_eq(spb_config_finalize(&c, 1, err, sizeof err), -1); /* the CPU's default is reference */
    ck_assert_msg(strstr(err, "--bf16-direct attention: needs --bf16-kernels fast"), "%s", err);
    /* The table takes the choice when a model is configured on it. */
    spb_config_defaults(&c);
    snprintf(c.precision, sizeof c.precision, "bf16");
    snprintf(c.bf16_kernels, sizeof c.bf16_kernels, "fast");
    bf->configure(&c);
    ck_assert_ptr_eq(spb_bf16_direct_in_use(), &spb_bf16_direct_cpu);
    snprintf(c.bf16_kernels, sizeof c.bf16_kernels, "reference");
    bf->configure(&c);
    ck_assert_ptr_null(spb_bf16_direct_in_use());
}
END_TEST

/* --bf16-direct picks the kinds: with attention and layernorm only, those go
 * direct and every other call through the frames, with the same gradients
 * (on the CPU the paths agree to fp32 rounding). */
START_TEST(direct_kinds_choose_what_goes_direct)
{
    train_case k = {"ulysses", "contiguous", 2, 1, 0};
    double lref, lpart;
    const spb_gpt *shape;
    spb_trainer *tref, *tpart;
    spb_bf16_direct_counts cref, cpart;
    float *gref = train(&k, "bf16", "reference", &lref, &shape, &tref, &cref);
    drop(tref);
    spb_config c;
    train_config(&c, &k, "bf16", "fast");
    snprintf(c.bf16_direct, sizeof c.bf16_direct, "attention,layernorm");
    spb_grid *g = malloc(sizeof *g);
    tpart = make(&c, MPI_COMM_WORLD, g);
    spb_bf16_direct_reset_counts();
    lpart = spb_trainer_gradients(tpart);
    cpart = spb_bf16_direct_get_counts();
    float *gpart = global_grads(tpart);
    const char *where = "";
    double err = worst_tensor_error(tpart->gpt, gpart, gref, &where);
    if (!world_rank)
        printf("--bf16-direct attention,layernorm: direct %ld products, %ld attention, %ld row-wise; frames %ld, %ld, "
               "%ld; against the reference path: loss %.2e, gradient %.2e\n",
               cpart.matmul_direct, cpart.attention_direct, cpart.rowwise_direct, cpart.matmul_frames,
               cpart.attention_frames, cpart.rowwise_frames, fabs(lpart - lref) / lref, err);
    ck_assert(cpart.matmul_direct == 0 && cpart.matmul_frames > 0);
    ck_assert(cpart.attention_direct > 0 && cpart.attention_frames == 0);
    ck_assert(cpart.rowwise_direct > 0 && cpart.rowwise_frames > 0); /* LayerNorm direct, GELU and the rest not */
    ck_assert(cpart.memory_direct == 0);
    ck_assert(cpart.bias_direct == 0 && cpart.bias_frames > 0 && cpart.embedding_direct == 0);
    ck_assert_double_le(err, gradient_bound(2));
    drop(tpart);
    free(gref), free(gpart);
}
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    Suite *s = suite_create("bf16_direct");
    TCase *tc = tcase_create("direct");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, bf16_kernels_option);
    tcase_add_test(tc, products_match_the_frames);
    tcase_add_test(tc, a_direct_table_that_loses_the_bias_is_caught);
    tcase_add_test(tc, attention_matches_the_frames);
    tcase_add_test(tc, cudnn_attention_dispatch);
    tcase_add_test(tc, training_goes_direct_and_tracks_fp32);
    tcase_add_test(tc, direct_kinds_choose_what_goes_direct);
    suite_add_tcase(s, tc);
    TCase *fp16 = tcase_create("fp16"); /* a process of its own: CK_RUN_CASE=fp16 */
    tcase_set_timeout(fp16, 900);
    tcase_add_test(fp16, fp16_training_goes_direct);
    suite_add_tcase(s, fp16);
    return spb_run_suite_and_finalize(s);
}
