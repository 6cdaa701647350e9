/* DeepSpeed-Ulysses (arXiv 2309.14509): sequence parallelism by all-to-all.
 *
 * Each of the P ranks of an SP group holds N/P contiguous tokens with all H
 * heads.  One all-to-all regroups Q, K and V so that each rank holds all N
 * tokens of H/P heads; attention then runs locally on whole sequences (any
 * backend, no change to the kernel) and a second all-to-all returns the
 * output to the token split.  The backward mirrors it: all-to-all of dO,
 * local backward, all-to-all of dQ, dK, dV together.
 *
 * Grouped-query attention (G K/V heads): block j carries rank j's Hp query
 * heads and the K/V heads they read, Gp = G/P of them when G >= P; when
 * G < P each block carries the one K/V head its query heads read, so P/G
 * ranks receive copies of each K/V head (DeepSpeed's replication for
 * G < P).  The core computes each copy from the same weight rows, so the
 * copies' gradients, coming back in the dQKV exchange, add up in the
 * weight gradient of the QKV product (common/core/gpt.c, qkv_backward).
 *
 * Layouts (T = N/P local tokens, Hp = H/P heads per rank, row = Hp·D,
 * qkv = (Hp + 2·Gp)·D floats per token and block):
 *   local    P head blocks of [B][T][tok]: qkv (tok = qkv), o and dO (tok = row),
 *            as the core's products write and read them (head_blocks = P);
 *            block j is what goes to rank j: the all-to-all's send layout
 *   head     [B][N][tok], rank i's tokens at i·T    (what attention reads)
 * With micro-batch 1 the collectives are the only passes over memory:
 * attention reads Q/K/V straight out of the received blocks through the
 * backend's strides. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "memory.h"
#include "timer.h"
#include "device_mem.h"
#include "sp_parts.h"
#include "split.h"
#include "strategy.h"

typedef struct ulysses_dims {
    int P;     /* ranks of the exchange (the SP group; a Ulysses group in hybrid) */
    int rank;  /* this rank's place among them */
    MPI_Comm comm;
    int B, T;  /* sequences, local tokens per sequence */
    long N;    /* the group's tokens per sequence: P·T (the whole sequence for plain Ulysses) */
    int uneven; /* P does not divide N or H: exchanged with per-rank counts (exchange_uneven) */
    int H;     /* the heads of the exchange (the core's head blocks: heads_of(j) each) */
    int uneven_heads; /* P does not divide H: rank j attends heads_of(j) (split.h); no GQA then */
    int Hp, D; /* heads per rank (this rank's share), head dim */
    int Gp;    /* K/V heads per rank (after replication when G < P) */
    long row;  /* floats of one token's Hp heads: Hp·D */
    long qkv;  /* floats of one token's Q, K and V in a block: (Hp + 2·Gp)·D */
} ulysses_dims;

static ulysses_dims dims_of(const spb_attn_ctx *c, spb_rank_group group)
{
    ulysses_dims u;
    u.P = group.size;
    u.rank = group.rank;
    u.comm = group.comm;
    u.H = c->heads;
    u.uneven_heads = !spb_split_is_even(u.H, u.P);
    u.B = c->batch;
    u.T = c->tokens;
    /* Plain Ulysses' group is the SP group and holds the whole sequence,
     * in even or uneven shares; a hybrid group g holds its ring block, the
     * ring layout's share g over the R groups (contiguous or zigzag chunk
     * pair, strategies/ring.c; N/R when equal). */
    if (!c->grid || group.comm == c->grid->sp_comm)
        u.N = c->grid ? c->seq_length : (long)u.P * u.T;
    else
        u.N = spb_ring_owner_tokens(c->cfg && spb_ring_is_zigzag(c->cfg), c->seq_length, c->grid->ring_size,
                                    c->grid->ring_rank);
    u.uneven = !spb_split_is_even(u.N, u.P) || u.uneven_heads;
    SPB_CHECK(u.T == spb_split_count(u.N, u.P, u.rank));
    u.Hp = (int)spb_split_count(u.H, u.P, u.rank);
    u.D = c->head_dim;
    u.row = (long)u.Hp * u.D;
    int kv = c->kv_heads > 0 ? c->kv_heads : c->heads;
    SPB_CHECK(u.uneven_heads ? kv == u.H && u.Hp > 0 : kv % u.P == 0); /* validate */
    u.Gp = u.uneven_heads ? u.Hp : kv / u.P;
    u.qkv = (long)(u.Hp + 2 * u.Gp) * u.D;
    return u;
}

/* The head side as a context of its own: N tokens, Hp query heads, Gp K/V heads. */
static spb_attn_ctx head_ctx(const spb_attn_ctx *c, const ulysses_dims *u)
{
    spb_attn_ctx h = *c;
    h.heads = u->Hp;
    h.kv_heads = u->Gp;
    h.tokens = (int)u->N;
    h.positions = NULL;
    return h;
}

/* Per-layer saved storage, lse last so that the big arrays keep the
 * buffer's alignment (whenever Hp·D and Gp·D are multiples of 16):
 * head-layout QKV [B][N][qkv], head-layout O [B][N][Hp][D], lse [B][Hp][N]. */
static long saved_o_offset(const ulysses_dims *u) { return u->B * u->N * u->qkv; }
static long saved_lse_offset(const ulysses_dims *u) { return u->B * u->N * (u->qkv + u->row); }

size_t spb_ulysses_saved_floats(const spb_attn_ctx *c, spb_rank_group group)
{
    ulysses_dims u = dims_of(c, group);
    return (size_t)u.B * u.N * (u.qkv + u.row) + (size_t)u.B * u.Hp * u.N;
}

static size_t ulysses_saved_floats(const spb_attn_ctx *c) { return spb_ulysses_saved_floats(c, spb_sp_group(c->grid)); }

/* Widths of one token on the head side: Q (and O) heads·D, K or V
 * kv_heads·D (0: as many as heads), the fused qkv row. */
static long head_q_row(const spb_attn_ctx *h) { return (long)h->heads * h->head_dim; }
static long head_kv_row(const spb_attn_ctx *h) { return (long)(h->kv_heads > 0 ? h->kv_heads : h->heads) * h->head_dim; }
static long head_qkv_row(const spb_attn_ctx *h) { return head_q_row(h) + 2 * head_kv_row(h); }

/* Plain Ulysses' head side: attention of all N tokens among themselves for
 * this rank's Hp query heads and the K/V heads they read, Q/K/V read from
 * the fused head layout. */
static spb_attn_desc head_desc(const spb_attn_ctx *h)
{
    long row = head_q_row(h), qkv = head_qkv_row(h), N = h->tokens;
    spb_attn_desc d = {
        .batch = h->batch, .heads = h->heads, .kv_heads = (int)(head_kv_row(h) / h->head_dim), .head_dim = h->head_dim,
        .q_len = h->tokens, .k_len = h->tokens,
        .q_offset = 0, .k_offset = 0,
        .causal = h->causal, .scale = 1.0f / sqrtf((float)h->head_dim),
        .q_token_stride = qkv, .q_batch_stride = qkv * N,
        .k_token_stride = qkv, .k_batch_stride = qkv * N,
        .o_token_stride = row, .o_batch_stride = row * N,
        /* blocked-sparse pattern (docs/SPARSE.md); no cfg (unit tests): dense */
        .sparse_block = h->cfg ? h->cfg->sparse_block : 0, .sparse_local = h->cfg ? h->cfg->sparse_local_blocks : 0,
        .sparse_global = h->cfg ? h->cfg->sparse_global_blocks : 0,
    };
    return d;
}

static void whole_sequence_forward(const spb_attn_ctx *h, const float *qkv_h, float *o_h, float *lse)
{
    long row = head_q_row(h), kv = head_kv_row(h);
    spb_attn_desc d = head_desc(h);
    spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
    h->backend->forward(&d, qkv_h, qkv_h + row, qkv_h + row + kv, o_h, lse);
    spb_timer_end(timed);
    *h->flops += 4.0 * d.head_dim * spb_attn_visible_pairs(&d);
}

static void whole_sequence_backward(const spb_attn_ctx *h, const float *qkv_h, const float *o_h, const float *lse,
                                    const float *dout_h, float *dqkv_h)
{
    long row = head_q_row(h), kv = head_kv_row(h);
    spb_attn_desc d = head_desc(h);
    spb_dev_zero(h, dqkv_h, (long)h->batch * h->tokens * head_qkv_row(h)); /* the backend accumulates */
    spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
    h->backend->backward(&d, qkv_h, qkv_h + row, qkv_h + row + kv, o_h, lse, dout_h, dqkv_h, dqkv_h + row,
                         dqkv_h + row + kv);
    spb_timer_end(timed);
    *h->flops += 10.0 * d.head_dim * spb_attn_visible_pairs(&d);
}

static const spb_head_side whole_sequence = {whole_sequence_forward, whole_sequence_backward};

/* Rank i's tokens of each sequence and the first of them (split.h; i·T
 * and T when the shares are equal). */
static long tokens_of(const ulysses_dims *u, int i) { return spb_split_count(u->N, u->P, i); }
static long first_of(const ulysses_dims *u, int i) { return spb_split_offset(u->N, u->P, i); }

/* blocks (block i = rank i's [B][T_i] tokens, at B·first_i) -> head layout [B][N][tok]. */
static void blocks_to_head(const spb_attn_ctx *c, const float *blocks, float *head, const ulysses_dims *u, long tok)
{
    for (int i = 0; i < u->P; i++) {
        long seq_chunk = tokens_of(u, i) * tok; /* one sequence's T_i tokens */
        for (int b = 0; b < u->B; b++)
            spb_dev_copy(c, head + ((long)b * u->N + first_of(u, i)) * tok,
                         blocks + ((long)u->B * first_of(u, i) + (long)b * tokens_of(u, i)) * tok, seq_chunk);
    }
}

/* Inverse of blocks_to_head: block i = the rows of rank i's tokens. */
static void head_to_blocks(const spb_attn_ctx *c, const float *head, float *blocks, const ulysses_dims *u, long tok)
{
    for (int i = 0; i < u->P; i++) {
        long seq_chunk = tokens_of(u, i) * tok;
        for (int b = 0; b < u->B; b++)
            spb_dev_copy(c, blocks + ((long)u->B * first_of(u, i) + (long)b * tokens_of(u, i)) * tok,
                         head + ((long)b * u->N + first_of(u, i)) * tok, seq_chunk);
    }
}

/* Rank j's heads (split.h; H/P when equal). */
static long heads_of(const ulysses_dims *u, int j) { return spb_split_count(u->H, u->P, j); }

/* Uneven shares: the all-to-all with per-rank counts.  Local side: P head
 * blocks of this rank's B·T tokens, block j (rank j's heads_of(j) heads,
 * tok_j floats per token) after blocks 0..j-1 (the core's layout); head
 * side: rank i's B·T_i tokens at B·first_i·tok, which with one sequence
 * is the head layout itself (blocks_to_head regroups B > 1).  tok is this
 * rank's floats per token (u->qkv or u->row), tok_j the same for rank j's
 * heads. */
static void exchange_uneven(const ulysses_dims *u, long tok, int to_head, const float *in, float *out,
                            spb_comm_phase phase)
{
    enum { MAX_STACK = 64 };
    long stack[4 * MAX_STACK], *v = u->P <= MAX_STACK ? stack : SPB_CHECK_PTR(malloc(sizeof(long) * 4 * (size_t)u->P));
    long *local_counts = v, *local_displs = v + u->P, *head_counts = v + 2 * u->P, *head_displs = v + 3 * u->P;
    long floats_per_head = tok / u->Hp; /* 3·D (Q, K, V) or D (O); no GQA under uneven heads */
    for (int i = 0; i < u->P; i++) {
        long tok_i = u->uneven_heads ? floats_per_head * heads_of(u, i) : tok;
        local_counts[i] = (long)u->B * u->T * tok_i;
        local_displs[i] = i ? local_displs[i - 1] + local_counts[i - 1] : 0;
        head_counts[i] = (long)u->B * tokens_of(u, i) * tok, head_displs[i] = (long)u->B * first_of(u, i) * tok;
    }
    if (to_head)
        spb_alltoallv_f32(in, local_counts, local_displs, out, head_counts, head_displs, u->comm, phase);
    else
        spb_alltoallv_f32(in, head_counts, head_displs, out, local_counts, local_displs, u->comm, phase);
    if (v != stack) free(v);
}

/* Buffers kept from call to call, grown when a call needs more: a fresh
 * allocation zeroes its block, a pass over memory the exchange does not
 * need.  They live until the process ends: each category's peak is what
 * per-call allocation would reach, but they stay counted as current. */
static spb_dev_cache send_buf, recv_buf; /* regrouping staging for B > 1, SPB_MEM_COMM */
static spb_dev_cache gather_buf;         /* the allgather variant's P x whole buffers, SPB_MEM_COMM */
static spb_dev_cache dout_head, dqkv_head; /* backward's head-layout dO and dQKV, SPB_MEM_WORKSPACE */

/* Local side: the core hands Q, K, V and takes O in head blocks (block j =
 * heads [j·Hp, (j+1)·Hp) of all local tokens, the head_blocks hook), which is
 * the all-to-all's own block order: no pack, no unpack.  Head side: with one
 * sequence per micro-batch (the paper's runs) the blocks (rank i's tokens as
 * block i) are the head layout [N][w][Hp][D] itself; with B > 1 one
 * regrouping pass per exchange remains. */
static int uses_allgather(const spb_attn_ctx *c)
{
    SPB_CHECK(c->cfg);
    return !strcmp(c->cfg->ulysses_comm, "allgather");
}

/* The ablation's exchange (--ulysses-comm allgather): every rank gathers the
 * whole buffer of every other rank and keeps its slice, reaching the same
 * layouts as the all-to-all with P times the bytes.  Blocks are the
 * all-to-all's: the result in `blocks` is what spb_alltoall_f32 would have
 * received. */
static void allgather_exchange(const spb_attn_ctx *c, const ulysses_dims *u, long tok, int to_head, const float *in,
                               float *blocks)
{
    long count = (long)u->B * u->T * tok, whole = count * u->P; /* floats per block, per rank */
    float *all = spb_dev_cached(c, &gather_buf, SPB_MEM_COMM, whole * u->P);
    spb_allgather_f32(in, all, whole, u->comm, c->phase);
    int me = u->rank;
    long seq_chunk = (long)u->T * tok;
    for (int i = 0; i < u->P; i++) {
        if (to_head) { /* rank i's local blocks: keep block `me` (my heads of its tokens) */
            spb_dev_copy(c, blocks + i * count, all + i * whole + me * count, count);
        } else { /* rank i's head layout [B][N][w][Hp][D]: keep my tokens of its heads */
            for (int b = 0; b < u->B; b++)
                spb_dev_copy(c, blocks + i * count + b * seq_chunk, all + i * whole + ((long)b * u->P + me) * seq_chunk,
                             seq_chunk);
        }
    }
}

/* tok: floats per token and block (u->qkv for Q/K/V, u->row for O). */
static void exchange(const spb_attn_ctx *c, const ulysses_dims *u, long tok, int to_head, const float *in, float *out)
{
    long count = (long)u->B * u->T * tok; /* floats per block */
    /* staging holds the head side's blocks: B·N tokens (P·count when even) */
    float *staging = u->B > 1 ? spb_dev_cached(c, to_head ? &recv_buf : &send_buf, SPB_MEM_COMM, u->B * u->N * tok)
                              : NULL;
    spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
    if (to_head) {
        float *blocks = staging ? staging : out;
        if (u->uneven)
            exchange_uneven(u, tok, 1, in, blocks, c->phase);
        else if (uses_allgather(c))
            allgather_exchange(c, u, tok, 1, in, blocks);
        else
            spb_alltoall_f32(in, blocks, count, u->comm, c->phase);
        if (staging) blocks_to_head(c, staging, out, u, tok);
    } else {
        if (uses_allgather(c)) /* gathers the head layout itself: no regrouping first */
            allgather_exchange(c, u, tok, 0, in, out);
        else {
            if (staging) head_to_blocks(c, in, staging, u, tok);
            if (u->uneven)
                exchange_uneven(u, tok, 0, staging ? staging : in, out, c->phase);
            else
                spb_alltoall_f32(staging ? staging : in, out, count, u->comm, c->phase);
        }
    }
    spb_timer_end(timed);
}

/* --ulysses-overlap K: the exchanges in K head groups of Hk = Hp/K query
 * heads, group k+1's all-to-all in flight while group k's attention runs,
 * group k's output on its way back during group k+1's (DeepSpeed's
 * sp_stream, yunchang's async all-to-all); backward likewise with dO and
 * dQKV.  Each exchange is one non-blocking all-to-all of contiguous blocks
 * (comm.c: point-to-point on the host, host-staged, or the device table's
 * transfer on its communication stream); the group's slice is packed out
 * of the core's head blocks and unpacked into them with strided copies
 * (the device's copy_rows on the compute stream, so the device orders
 * them against the transfers by its events).
 *
 * K/V heads (grouped-query attention, Gp per rank after Ulysses'
 * replication): group k's query heads read the K/V heads kv_lo(k) ..
 * + Gk - 1.  Gp divisible by K: Gk = Gp/K heads of its own.  K divisible
 * by Gp: m = K/Gp consecutive groups read one K/V head (Gk = 1).  Each K/V
 * head is exchanged once, by the first group that reads it (its "sender"):
 * a sender's block per token is [Q Hk][K Gk][V Gk] heads, the others' [Q
 * Hk]; the later readers' attention reads K and V from the sender's head
 * layout.  So the bytes are plain Ulysses' exactly (every Q and K/V head
 * crosses once; comm_volume below), where exchanging a shared head with
 * each reader would send it m times and need its m gradients summed.  In
 * backward the readers accumulate into one dK/dV (the sender's), in
 * query-head order as the plain backward's single call does, and the
 * sender's dQKV returns after its last reader: the results are plain
 * Ulysses' bit for bit.  The shared dK/dV need the head side's call to
 * accumulate, which the backend does and the hybrid's ring does not
 * promise: there each group must have K/V heads of its own (validated).
 * Other pairs (neither divides the other) would give a group query heads
 * that read K/V heads in a ratio the backend's head mapping cannot take
 * (validated). */
static int overlap_groups(const spb_attn_ctx *c)
{
    return c->cfg && c->cfg->ulysses_overlap > 1 ? c->cfg->ulysses_overlap : 1;
}

enum { ULYSSES_MAX_OVERLAP = 64 };

/* The groups' shapes, in floats. */
typedef struct overlap_plan {
    int K, Hk, Gk, m;                       /* groups, query and K/V heads a group reads, groups per K/V head */
    long q;                                 /* one token's Q of a group: Hk·D */
    long width[ULYSSES_MAX_OVERLAP];        /* one token's floats in group k's block: q (+ 2·Gk·D for a sender) */
    long offset[ULYSSES_MAX_OVERLAP];       /* group k's head layout in the saved QKV: B·N·(sum of earlier widths) */
} overlap_plan;

static overlap_plan plan_of(const ulysses_dims *u, int K)
{
    SPB_CHECK(K <= ULYSSES_MAX_OVERLAP && u->Hp % K == 0 && (u->Gp % K == 0 || K % u->Gp == 0)); /* validated */
    overlap_plan p = {.K = K, .Hk = u->Hp / K};
    p.Gk = u->Gp >= K ? u->Gp / K : 1;
    p.m = u->Gp >= K ? 1 : K / u->Gp;
    p.q = (long)p.Hk * u->D;
    long at = 0;
    for (int k = 0; k < K; k++) {
        p.width[k] = p.q + (k % p.m == 0 ? 2L * p.Gk * u->D : 0);
        p.offset[k] = at;
        at += (long)u->B * u->N * p.width[k];
    }
    return p;
}

static int sender_of(const overlap_plan *p, int k) { return k - k % p->m; }
static int kv_lo(const overlap_plan *p, int k) { return p->m > 1 ? k / p->m : k * p->Gk; }

/* Group k's attention on the head side: Q (and dQ) in its own head layout,
 * K and V (and dK, dV) in its sender's.  With the whole-sequence head side
 * (plain Ulysses) one backend call per group through explicit strides;
 * with another (the hybrid's ring) its fused-buffer call, each group a
 * sender of its own (validated). */
static spb_attn_desc group_desc(const spb_attn_ctx *h, long q_width, long kv_width)
{
    spb_attn_desc d = head_desc(h);
    long N = h->tokens;
    d.q_token_stride = q_width, d.q_batch_stride = q_width * N;
    d.k_token_stride = kv_width, d.k_batch_stride = kv_width * N;
    return d;
}

static void group_forward(const spb_attn_ctx *h, const spb_head_side *inner, const overlap_plan *p, const float *qg,
                          long qw, const float *kvg, long kvw, float *o, float *lse)
{
    if (inner != &whole_sequence) {
        SPB_CHECK(qg == kvg && p->m == 1);
        inner->forward(h, qg, o, lse);
        return;
    }
    spb_attn_desc d = group_desc(h, qw, kvw);
    const float *k = kvg + p->q, *v = k + (long)p->Gk * h->head_dim;
    spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
    h->backend->forward(&d, qg, k, v, o, lse);
    spb_timer_end(timed);
    *h->flops += 4.0 * d.head_dim * spb_attn_visible_pairs(&d);
}

/* dqg and dkvg as qg and kvg.  The backend accumulates: group k's own
 * block (dQ, and dK, dV for a sender) starts at 0; a later reader adds to
 * its sender's dK, dV, zeroed at the sender's turn (the first reader). */
static void group_backward(const spb_attn_ctx *h, const spb_head_side *inner, const overlap_plan *p, const float *qg,
                           long qw, const float *kvg, long kvw, const float *o, const float *lse, const float *dout,
                           float *dqg, float *dkvg)
{
    if (inner != &whole_sequence) {
        SPB_CHECK(qg == kvg && p->m == 1);
        inner->backward(h, qg, o, lse, dout, dqg);
        return;
    }
    spb_attn_desc d = group_desc(h, qw, kvw);
    long gkv = (long)p->Gk * h->head_dim;
    spb_dev_zero(h, dqg, (long)h->batch * h->tokens * qw);
    const float *k = kvg + p->q, *v = k + gkv;
    float *dk = dkvg + p->q, *dv = dk + gkv;
    spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
    h->backend->backward(&d, qg, k, v, o, lse, dout, dqg, dk, dv);
    spb_timer_end(timed);
    *h->flops += 10.0 * d.head_dim * spb_attn_visible_pairs(&d);
}
/* Group k's slice of the core's head blocks (P·B·T rows of u->qkv floats:
 * Q at k·q, and for a sender its K and V heads) <-> [P][B][T][width[k]]. */
static void move_qkv_slice(const spb_attn_ctx *c, const ulysses_dims *u, const overlap_plan *p, int k, float *core,
                           float *packed, int pack)
{
    long rows = (long)u->P * u->B * u->T, w = p->width[k], gkv = (long)p->Gk * u->D;
    long kq = (long)k * p->q, kk = (long)(u->Hp + kv_lo(p, k)) * u->D, kv = kk + (long)u->Gp * u->D;
    long at[3] = {kq, kk, kv}, in[3] = {0, p->q, p->q + gkv}, len[3] = {p->q, gkv, gkv};
    for (int part = 0; part < (w > p->q ? 3 : 1); part++) {
        if (pack)
            spb_dev_copy_rows(c, packed + in[part], w, core + at[part], u->qkv, rows, len[part]);
        else
            spb_dev_copy_rows(c, core + at[part], u->qkv, packed + in[part], w, rows, len[part]);
    }
}

/* Exchanges are timed as exchange (packing and unpacking included): the
 * step breakdown's exposed part. */
static void start_timed(spb_alltoall_req *r, const float *send, float *recv, long count, const ulysses_dims *u,
                        spb_comm_phase phase)
{
    spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
    spb_alltoall_start(r, send, recv, count, u->comm, phase);
    spb_timer_end(timed);
}

/* The groups' blocks, SPB_MEM_COMM.  Transfers send from and receive into
 * these only, never the saved or workspace buffers that attention reads
 * and writes meanwhile: a 16-bit table works on fp32 frames of whole spans
 * of one buffer (every argument of a call in one buffer merged), which
 * would read or write back a group's region while its transfer is in
 * flight.  (On the host the copies were there anyway: the blocks are not
 * the head layout, except for a one-sequence micro-batch.) */
static spb_dev_cache ov_send, ov_recv, ov_out_send, ov_out_recv;

/* What arrived in blocks [P][B][T][w] into the head layout [B][N][w]. */
static void settle(const spb_attn_ctx *c, const ulysses_dims *u, spb_alltoall_req *r, float *blocks, float *head,
                   long w)
{
    spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
    spb_alltoall_wait(r);
    blocks_to_head(c, blocks, head, u, w);
    spb_timer_end(timed);
}

static void overlapped_forward(const spb_attn_ctx *c, const ulysses_dims *u, const spb_head_side *inner, int K,
                               const float *qkv, float *o, float *saved)
{
    overlap_plan p = plan_of(u, K);
    long BN = (long)u->B * u->N, BT = (long)u->B * u->T, all = BN * u->qkv;
    spb_attn_ctx h = head_ctx(c, u);
    h.heads = p.Hk, h.kv_heads = p.Gk;
    float *send = spb_dev_cached(c, &ov_send, SPB_MEM_COMM, all);
    float *recv = spb_dev_cached(c, &ov_recv, SPB_MEM_COMM, all);
    float *o_send = spb_dev_cached(c, &ov_out_send, SPB_MEM_COMM, BN * u->row);
    float *o_recv = spb_dev_cached(c, &ov_out_recv, SPB_MEM_COMM, BN * u->row);
    float *qkv_g = saved, *o_g = saved + saved_o_offset(u), *lse_g = saved + saved_lse_offset(u);
    spb_alltoall_req in[ULYSSES_MAX_OVERLAP], out[ULYSSES_MAX_OVERLAP];
    for (int k = 0; k <= K; k++) {
        if (k < K) { /* group k's Q/K/V out: in flight during group k-1's attention */
            spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
            move_qkv_slice(c, u, &p, k, (float *)qkv, send + p.offset[k], 1);
            spb_timer_end(timed);
            start_timed(&in[k], send + p.offset[k], recv + p.offset[k], BT * p.width[k], u, c->phase);
        }
        if (k == 0) continue;
        int g = k - 1, s = sender_of(&p, g);
        settle(c, u, &in[g], recv + p.offset[g], qkv_g + p.offset[g], p.width[g]);
        float *og = o_g + g * BN * p.q;
        group_forward(&h, inner, &p, qkv_g + p.offset[g], p.width[g], qkv_g + p.offset[s], p.width[s], og,
                      lse_g + g * BN * p.Hk);
        spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
        head_to_blocks(c, og, o_send + g * BN * p.q, u, p.q);
        spb_timer_end(timed);
        start_timed(&out[g], o_send + g * BN * p.q, o_recv + g * BN * p.q, BT * p.q, u, c->phase);
    }
    for (int g = 0; g < K; g++) {
        spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
        spb_alltoall_wait(&out[g]);
        spb_dev_copy_rows(c, o + g * p.q, u->row, o_recv + g * BN * p.q, p.q, (long)u->P * BT, p.q);
        spb_timer_end(timed);
    }
}

/* dout_h, dqkv_h: the head-side workspaces (B·N·row and B·N·qkv floats):
 * group k's dO at k·B·N·q, its dQKV at offset[k]. */
static void overlapped_backward(const spb_attn_ctx *c, const ulysses_dims *u, const spb_head_side *inner, int K,
                                const float *saved, const float *dout, float *dout_h, float *dqkv_h, float *dqkv)
{
    overlap_plan p = plan_of(u, K);
    long BN = (long)u->B * u->N, BT = (long)u->B * u->T, all = BN * u->qkv;
    spb_attn_ctx h = head_ctx(c, u);
    h.heads = p.Hk, h.kv_heads = p.Gk;
    float *d_send = spb_dev_cached(c, &ov_out_send, SPB_MEM_COMM, BN * u->row);
    float *d_recv = spb_dev_cached(c, &ov_out_recv, SPB_MEM_COMM, BN * u->row);
    float *g_send = spb_dev_cached(c, &ov_send, SPB_MEM_COMM, all);
    float *g_recv = spb_dev_cached(c, &ov_recv, SPB_MEM_COMM, all);
    const float *qkv_g = saved, *o_g = saved + saved_o_offset(u), *lse_g = saved + saved_lse_offset(u);
    spb_alltoall_req in[ULYSSES_MAX_OVERLAP], out[ULYSSES_MAX_OVERLAP];
    int returned[ULYSSES_MAX_OVERLAP], n_out = 0;
    for (int k = 0; k <= K; k++) {
        if (k < K) { /* group k's dO out */
            spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
            spb_dev_copy_rows(c, d_send + k * BN * p.q, p.q, dout + k * p.q, u->row, (long)u->P * BT, p.q);
            spb_timer_end(timed);
            start_timed(&in[k], d_send + k * BN * p.q, d_recv + k * BN * p.q, BT * p.q, u, c->phase);
        }
        if (k == 0) continue;
        int g = k - 1, s = sender_of(&p, g);
        settle(c, u, &in[g], d_recv + g * BN * p.q, dout_h + g * BN * p.q, p.q);
        group_backward(&h, inner, &p, qkv_g + p.offset[g], p.width[g], qkv_g + p.offset[s], p.width[s],
                       o_g + g * BN * p.q, lse_g + g * BN * p.Hk, dout_h + g * BN * p.q, dqkv_h + p.offset[g],
                       dqkv_h + p.offset[s]);
        /* back: this group's dQ (a non-sender's whole block), and its
         * sender's block once its last reader (this group) is done */
        int ready[2], n_ready = 0;
        if (g != s) ready[n_ready++] = g;
        if (g % p.m == p.m - 1) ready[n_ready++] = s;
        for (int i = 0; i < n_ready; i++) {
            int j = ready[i];
            float *block = dqkv_h + p.offset[j];
            spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
            head_to_blocks(c, block, g_send + p.offset[j], u, p.width[j]);
            spb_timer_end(timed);
            start_timed(&out[n_out], g_send + p.offset[j], g_recv + p.offset[j], BT * p.width[j], u, c->phase);
            returned[n_out++] = j;
        }
    }
    SPB_CHECK(n_out == K);
    /* every Q slice and every K/V head arrives once: dqkv is overwritten in full */
    for (int i = 0; i < K; i++) {
        spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
        spb_alltoall_wait(&out[i]);
        move_qkv_slice(c, u, &p, returned[i], dqkv, g_recv + p.offset[returned[i]], 0);
        spb_timer_end(timed);
    }
}

void spb_ulysses_forward(const spb_attn_ctx *c, spb_rank_group group, const spb_head_side *inner, const float *qkv,
                         float *o, float *saved)
{
    ulysses_dims u = dims_of(c, group);
    if (overlap_groups(c) > 1) {
        overlapped_forward(c, &u, inner, overlap_groups(c), qkv, o, saved);
        return;
    }
    float *qkv_h = saved, *o_h = saved + saved_o_offset(&u), *lse = saved + saved_lse_offset(&u);
    spb_attn_ctx h = head_ctx(c, &u);

    exchange(c, &u, u.qkv, 1, qkv, qkv_h);
    inner->forward(&h, qkv_h, o_h, lse);
    exchange(c, &u, u.row, 0, o_h, o);
}

void spb_ulysses_backward(const spb_attn_ctx *c, spb_rank_group group, const spb_head_side *inner, const float *saved,
                          const float *dout, float *dqkv)
{
    ulysses_dims u = dims_of(c, group);
    const float *qkv_h = saved, *o_h = saved + saved_o_offset(&u), *lse = saved + saved_lse_offset(&u);
    long head_floats = u.B * u.N * u.row, qkv_floats = u.B * u.N * u.qkv; /* O, and Q/K/V, in head layout */
    float *dout_h = spb_dev_cached(c, &dout_head, SPB_MEM_WORKSPACE, head_floats);
    float *dqkv_h = spb_dev_cached(c, &dqkv_head, SPB_MEM_WORKSPACE, qkv_floats);
    if (overlap_groups(c) > 1) {
        overlapped_backward(c, &u, inner, overlap_groups(c), saved, dout, dout_h, dqkv_h, dqkv);
        return;
    }
    spb_attn_ctx h = head_ctx(c, &u);

    exchange(c, &u, u.row, 1, dout, dout_h);
    inner->backward(&h, qkv_h, o_h, lse, dout_h, dqkv_h);
    /* dQ, dK, dV go back together: every head block of every local token
     * arrives, so dqkv is overwritten in full. */
    exchange(c, &u, u.qkv, 0, dqkv_h, dqkv);
}

static void ulysses_forward(const spb_attn_ctx *c, const float *qkv, float *o, float *saved)
{
    /* The all-to-all stitches rank i's block in at its first token (i·T for
     * equal shares): tokens must be contiguous, in split.h's shares. */
    SPB_CHECK(c->tokens == spb_split_count(c->seq_length, c->grid->sp_size, c->grid->sp_rank) &&
              (!c->positions ||
               c->positions[0] == spb_split_offset(c->seq_length, c->grid->sp_size, c->grid->sp_rank)));
    spb_ulysses_forward(c, spb_sp_group(c->grid), &whole_sequence, qkv, o, saved);
}

static void ulysses_backward(const spb_attn_ctx *c, const float *qkv, const float *o, const float *saved,
                             const float *dout, float *dqkv)
{
    (void)qkv, (void)o; /* the head-layout copies in `saved` are what attention saw */
    spb_ulysses_backward(c, spb_sp_group(c->grid), &whole_sequence, saved, dout, dqkv);
}

static int ulysses_validate(const spb_config *cfg, int world_size, char *err, size_t errlen)
{
    (void)world_size;
    int H = cfg->num_heads, P = cfg->sp_degree;
    int G = cfg->num_query_groups > 0 ? cfg->num_query_groups : H;
    int uneven_heads = P > 0 && H % P != 0, uneven_tokens = P > 0 && cfg->seq_length % P != 0;
    if (uneven_heads) {
        /* uneven head groups (split.h: the first H mod P ranks one head
         * more), as DeepSpeed's uneven-heads all-to-all: each rank needs a
         * head, and its K/V heads are its query heads' own */
        if (H < P) {
            snprintf(err, errlen, "--num-attention-heads %d is not divisible by --sp-degree %d and fewer: Ulysses "
                                  "gives every rank at least one head", H, P);
            return -1;
        }
        if (G != H) {
            snprintf(err, errlen, "--num-attention-heads %d not divisible by --sp-degree %d with --num-query-groups "
                                  "%d: uneven head groups take K/V heads = query heads (no grouped-query attention)",
                     H, P, G);
            return -1;
        }
    } else if (P > 0 && (G >= P ? G % P : P % G)) {
        /* K/V heads: split like the query heads (G >= P), or one per rank,
         * replicated (G < P): each rank's query heads must read one K/V head. */
        snprintf(err, errlen,
                 "--num-query-groups %d and --sp-degree %d: Ulysses needs G divisible by P (K/V heads split like "
                 "query heads) or P divisible by G (each K/V head replicated on P/G ranks)", G, P);
        return -1;
    }
    if (uneven_heads || uneven_tokens) {
        /* uneven shares go through the all-to-all with per-rank counts only */
        char what[96];
        if (uneven_heads)
            snprintf(what, sizeof what, "--num-attention-heads %d not divisible by --sp-degree %d", H, P);
        else
            snprintf(what, sizeof what, "--seq-length %d not divisible by --sp-degree %d", cfg->seq_length, P);
        if (cfg->ulysses_overlap > 1) {
            snprintf(err, errlen, "--ulysses-overlap %d with %s: the overlapped exchange moves equal blocks; use "
                                  "equal shares or no overlap", cfg->ulysses_overlap, what);
            return -1;
        }
        if (!strcmp(cfg->ulysses_comm, "allgather")) {
            snprintf(err, errlen, "--ulysses-comm allgather with %s: the ablation gathers equal blocks; use "
                                  "--ulysses-comm alltoall", what);
            return -1;
        }
        return 0;
    }
    return spb_ulysses_validate_overlap(cfg, cfg->sp_degree, err, errlen);
}

int spb_ulysses_validate_overlap(const spb_config *cfg, int group_size, char *err, size_t errlen)
{
    int K = cfg->ulysses_overlap;
    if (K <= 1) return 0;
    if (K > ULYSSES_MAX_OVERLAP || group_size <= 0 || (cfg->num_heads / group_size) % K) {
        snprintf(err, errlen,
                 "--ulysses-overlap %d must divide the %d heads each rank attends (H / %d) and be at most %d", K,
                 group_size > 0 ? cfg->num_heads / group_size : 0, group_size, ULYSSES_MAX_OVERLAP);
        return -1;
    }
    /* K/V heads per rank after Ulysses' replication: max(G, U)/U (overlap_plan) */
    int G = cfg->num_query_groups > 0 ? cfg->num_query_groups : cfg->num_heads;
    int Gp = (G > group_size ? G : group_size) / group_size;
    if (Gp % K && K % Gp) {
        snprintf(err, errlen,
                 "--ulysses-overlap %d with %d K/V heads per rank (--num-query-groups %d over %d ranks): each head "
                 "group must read whole K/V heads of its own (K dividing them) or share one (them dividing K)",
                 K, Gp, G, group_size);
        return -1;
    }
    if (Gp < K && !strcmp(cfg->strategy, "hybrid")) {
        snprintf(err, errlen,
                 "--ulysses-overlap %d with --strategy hybrid and %d K/V heads per rank (--num-query-groups %d, "
                 "--ulysses-degree %d): the ring on the head side needs each head group's K/V heads of its own, "
                 "so K must divide them", K, Gp, G, group_size);
        return -1;
    }
    return 0;
}

/* Bytes per link of one layer, micro-batch of b sequences of N tokens,
 * hidden h, over P ranks.  An all-to-all whose per-rank buffer holds S
 * floats records payload 4·S bytes and link bytes 4·S·(P−1)/P (a rank keeps
 * its own 1/P and sends the rest).
 *   forward:  QKV, S = b·(N/P)·3h   +   O, S = b·(N/P)·h
 *   backward: dO,  S = b·(N/P)·h    +   dQKV, S = b·(N/P)·3h
 * each = 4·b·N·h/P·(P−1)/P floats = 16·b·N·h·(P−1)/P² bytes.
 * Evaluated as the accounting layer does (payload × bus factor, summed call
 * by call in call order) so that measured and analytic bytes match exactly,
 * also when (P−1)/P is not a binary fraction. */
/*
 * Grouped-query attention: the Q/K/V exchange carries, per local token,
 * H query heads and 2·max(G, P) K/V heads of D (G >= P: every K/V head once;
 * G < P: one per block, P blocks, the replicas included), so its S is
 * b·(N/P)·(H + 2·max(G, P))·D instead of b·(N/P)·3h; O and dO are unchanged.
 * With G = H this is 3h again.
 *
 * --ulysses-overlap K moves the same floats in K all-to-alls per exchange:
 * group k's QKV block per token is Hk·D query floats, plus 2·Gk·D for the
 * group that sends its K/V heads (each K/V head once, by its first
 * reader), and the K blocks add up to (Hp + 2·Gp)·D, i.e. the
 * (H + 2·max(G, P))·D/P above; O, dO and dQKV likewise.  So the formula
 * is the overlap's too: the K calls' link bytes sum to it (the test holds
 * it to 1e-12 relative where (P−1)/P is not a binary fraction and the sum
 * of K terms rounds differently from one). */
/*
 * Uneven shares (P ∤ N; split.h, rank r holds T_r tokens): each exchange
 * goes through the all-to-all with per-rank counts, recorded with the
 * floats a rank sends to the others exactly.  Into the head side rank r
 * sends its T_r tokens' blocks to P − 1 ranks; out of it, the other ranks'
 * N − T_r tokens of its heads.  With w = qkv width / P per token (the
 * Q/K/V block, H/P + 2·max(G, P)/P heads of D) and h/P (O):
 *   forward_r  = 4·b·[T_r·w·(P−1) + (N − T_r)·h/P]
 *   backward_r = 4·b·[T_r·(h/P)·(P−1) + (N − T_r)·w]
 * (for P | N both are the lines above).  This returns each phase's
 * busiest link, the largest over r: forward_r grows with T_r (w·(P−1) >
 * h/P, since w > h/P), so it is rank 0's (T_0 = ⌈N/P⌉); backward_r grows
 * with T_r when (h/P)·(P−1) ≥ w (P ≥ 4 without GQA) and falls otherwise.
 * Uneven heads (P ∤ H, no GQA; rank j attends H_j heads, split.h): the
 * blocks to rank j carry 3·H_j·D (Q/K/V) or H_j·D (O) floats per token:
 *   forward_r  = 4·b·[T_r·3·D·(H − H_r) + (N − T_r)·H_r·D]
 *   backward_r = 4·b·[T_r·D·(H − H_r) + (N − T_r)·3·H_r·D]
 */
static spb_comm_volume ulysses_comm_volume(const spb_config *cfg, int sp_degree)
{
    const int H = cfg->num_heads, D = cfg->hidden_size / H;
    const int G = cfg->num_query_groups > 0 ? cfg->num_query_groups : H;
    const double qkv_width = (double)(H + 2 * (G > sp_degree ? G : sp_degree)) * D; /* floats per token */
    if (sp_degree > 1 && (!spb_split_is_even(cfg->seq_length, sp_degree) || !spb_split_is_even(H, sp_degree))) {
        /* per rank r, with qkv_j and o_j the floats per token of rank j's
         * heads (3·H_j·D and H_j·D under uneven heads; else the equal
         * qkv_width/P and h/P): the busiest link of each phase */
        const int P = sp_degree, heads_uneven = !spb_split_is_even(H, P);
        const double b = cfg->micro_batch_size, N = cfg->seq_length;
        double all_qkv = 0, all_o = 0;
        for (int j = 0; j < P; j++) {
            all_qkv += heads_uneven ? 3.0 * D * spb_split_count(H, P, j) : qkv_width / P;
            all_o += heads_uneven ? (double)D * spb_split_count(H, P, j) : (double)cfg->hidden_size / P;
        }
        spb_comm_volume v = {0, 0};
        for (int r = 0; r < P; r++) {
            double T = (double)spb_split_count(cfg->seq_length, P, r);
            double qkv_r = heads_uneven ? 3.0 * D * spb_split_count(H, P, r) : qkv_width / P;
            double o_r = heads_uneven ? (double)D * spb_split_count(H, P, r) : (double)cfg->hidden_size / P;
            double fwd = 4.0 * b * (T * (all_qkv - qkv_r) + (N - T) * o_r);
            double bwd = 4.0 * b * (T * (all_o - o_r) + (N - T) * qkv_r);
            v.forward_bytes = fwd > v.forward_bytes ? fwd : v.forward_bytes;
            v.backward_bytes = bwd > v.backward_bytes ? bwd : v.backward_bytes;
        }
        return v;
    }
    double local_floats = (double)cfg->micro_batch_size * (cfg->seq_length / sp_degree) * cfg->hidden_size;
    double local_tokens = (double)cfg->micro_batch_size * (cfg->seq_length / sp_degree);
    spb_comm_volume v;
    if (!strcmp(cfg->ulysses_comm, "allgather")) {
        /* The ablation: each exchange allgathers a rank's whole buffer, P·S
         * floats for a block of S = b·(N/P)·w·h/P, i.e. b·(N/P)·w·h; the
         * recorded payload is P times that and the link carries (P−1)/P of
         * it: 4·b·N·h·(P−1)/P floats per direction for w = 3 + 1, P times
         * the all-to-all's. */
        double link_share = spb_comm_bus_factor(SPB_OP_ALLGATHER, sp_degree);
        double qkv_payload = 4.0 * (local_tokens * qkv_width) * sp_degree, o_payload = 4.0 * local_floats * sp_degree;
        v.forward_bytes = qkv_payload * link_share + o_payload * link_share;
        v.backward_bytes = o_payload * link_share + qkv_payload * link_share;
        return v;
    }
    double link_share = spb_comm_bus_factor(SPB_OP_ALLTOALL, sp_degree);
    double qkv_payload = 4.0 * local_tokens * qkv_width, o_payload = 4.0 * local_floats;
    v.forward_bytes = qkv_payload * link_share + o_payload * link_share;
    v.backward_bytes = o_payload * link_share + qkv_payload * link_share;
    return v;
}

static int ulysses_head_blocks(const spb_grid *grid) { return grid->sp_size; }

const spb_strategy spb_strategy_ulysses = {
    .name = "ulysses",
    .head_blocks = ulysses_head_blocks,
    .summary = "DeepSpeed-Ulysses: all-to-all to H/P heads of the whole sequence around local attention",
    .validate = ulysses_validate,
    .uneven_tokens = 1, /* the all-to-all with per-rank counts (exchange_uneven) */
    .attn_saved_floats = ulysses_saved_floats,
    .attention_forward = ulysses_forward,
    .attention_backward = ulysses_backward,
    .comm_volume = ulysses_comm_volume,
};
