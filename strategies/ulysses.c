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
 * weight gradient of the QKV product (common/gpt.c, qkv_backward).
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
#include <string.h>

#include "../common/checks.h"
#include "../common/memory.h"
#include "../common/timer.h"
#include "device_mem.h"
#include "strategy.h"

typedef struct ulysses_dims {
    int P;     /* SP group size */
    int B, T;  /* sequences, local tokens per sequence */
    long N;    /* whole sequence: P·T */
    int Hp, D; /* heads per rank, head dim */
    int Gp;    /* K/V heads per rank (after replication when G < P) */
    long row;  /* floats of one token's Hp heads: Hp·D */
    long qkv;  /* floats of one token's Q, K and V in a block: (Hp + 2·Gp)·D */
} ulysses_dims;

static ulysses_dims dims_of(const spb_attn_ctx *c)
{
    ulysses_dims u;
    u.P = c->grid->sp_size;
    SPB_CHECK(c->heads % u.P == 0);
    u.B = c->batch;
    u.T = c->tokens;
    u.N = (long)u.P * u.T;
    u.Hp = c->heads / u.P;
    u.D = c->head_dim;
    u.row = (long)u.Hp * u.D;
    int kv = c->kv_heads > 0 ? c->kv_heads : c->heads;
    SPB_CHECK(kv % u.P == 0);
    u.Gp = kv / u.P;
    u.qkv = (long)(u.Hp + 2 * u.Gp) * u.D;
    return u;
}

/* Per-layer saved storage, lse last so that the big arrays keep the
 * buffer's alignment (whenever Hp·D and Gp·D are multiples of 16):
 * head-layout QKV [B][N][qkv], head-layout O [B][N][Hp][D], lse [B][Hp][N]. */
static long saved_o_offset(const ulysses_dims *u) { return u->B * u->N * u->qkv; }
static long saved_lse_offset(const ulysses_dims *u) { return u->B * u->N * (u->qkv + u->row); }

static size_t ulysses_saved_floats(const spb_attn_ctx *c)
{
    ulysses_dims u = dims_of(c);
    return (size_t)u.B * u.N * (u.qkv + u.row) + (size_t)u.B * u.Hp * u.N;
}

/* Where K and V start in a token's qkv. */
static long k_at(const ulysses_dims *u) { return u->row; }
static long v_at(const ulysses_dims *u) { return u->row + (long)u->Gp * u->D; }

/* Attention of all N tokens among themselves for this rank's Hp heads, Q/K/V
 * read from the fused head layout. */
static spb_attn_desc head_desc(const ulysses_dims *u, const spb_attn_ctx *c)
{
    spb_attn_desc d = {
        .batch = u->B, .heads = u->Hp, .kv_heads = u->Gp, .head_dim = u->D,
        .q_len = (int)u->N, .k_len = (int)u->N,
        .q_offset = 0, .k_offset = 0,
        .causal = c->causal, .scale = 1.0f / sqrtf((float)u->D),
        .q_token_stride = u->qkv, .q_batch_stride = u->qkv * u->N,
        .k_token_stride = u->qkv, .k_batch_stride = u->qkv * u->N,
        .o_token_stride = u->row, .o_batch_stride = u->row * u->N,
        /* blocked-sparse pattern (docs/SPARSE.md); no cfg (unit tests): dense */
        .sparse_block = c->cfg ? c->cfg->sparse_block : 0, .sparse_local = c->cfg ? c->cfg->sparse_local_blocks : 0,
        .sparse_global = c->cfg ? c->cfg->sparse_global_blocks : 0,
    };
    return d;
}

/* blocks (block i = rank i's T tokens) -> head layout [B][N][tok]. */
static void blocks_to_head(const spb_attn_ctx *c, const float *blocks, float *head, const ulysses_dims *u, long tok)
{
    long seq_chunk = (long)u->T * tok; /* one sequence's T tokens */
    for (int i = 0; i < u->P; i++)
        for (int b = 0; b < u->B; b++)
            spb_dev_copy(c, head + ((long)b * u->P + i) * seq_chunk, blocks + ((long)i * u->B + b) * seq_chunk,
                         seq_chunk);
}

/* Inverse of blocks_to_head: block i = the rows of rank i's tokens. */
static void head_to_blocks(const spb_attn_ctx *c, const float *head, float *blocks, const ulysses_dims *u, long tok)
{
    long seq_chunk = (long)u->T * tok;
    for (int i = 0; i < u->P; i++)
        for (int b = 0; b < u->B; b++)
            spb_dev_copy(c, blocks + ((long)i * u->B + b) * seq_chunk, head + ((long)b * u->P + i) * seq_chunk,
                         seq_chunk);
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
    spb_allgather_f32(in, all, whole, c->grid->sp_comm, c->phase);
    int me = c->grid->sp_rank;
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
    float *staging = u->B > 1 ? spb_dev_cached(c, to_head ? &recv_buf : &send_buf, SPB_MEM_COMM, count * u->P) : NULL;
    spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
    if (to_head) {
        float *blocks = staging ? staging : out;
        if (uses_allgather(c))
            allgather_exchange(c, u, tok, 1, in, blocks);
        else
            spb_alltoall_f32(in, blocks, count, c->grid->sp_comm, c->phase);
        if (staging) blocks_to_head(c, staging, out, u, tok);
    } else {
        if (uses_allgather(c)) /* gathers the head layout itself: no regrouping first */
            allgather_exchange(c, u, tok, 0, in, out);
        else {
            if (staging) head_to_blocks(c, in, staging, u, tok);
            spb_alltoall_f32(staging ? staging : in, out, count, c->grid->sp_comm, c->phase);
        }
    }
    spb_timer_end(timed);
}

static void ulysses_forward(const spb_attn_ctx *c, const float *qkv, float *o, float *saved)
{
    ulysses_dims u = dims_of(c);
    /* The all-to-all stitches rank i's block in at i·T: tokens must be contiguous. */
    SPB_CHECK(u.N == c->seq_length && (!c->positions || c->positions[0] == (long)c->grid->sp_rank * u.T));
    float *qkv_h = saved, *o_h = saved + saved_o_offset(&u), *lse = saved + saved_lse_offset(&u);

    exchange(c, &u, u.qkv, 1, qkv, qkv_h);
    spb_attn_desc d = head_desc(&u, c);
    spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
    c->backend->forward(&d, qkv_h, qkv_h + k_at(&u), qkv_h + v_at(&u), o_h, lse);
    spb_timer_end(timed);
    *c->flops += 4.0 * d.head_dim * spb_attn_visible_pairs(&d);

    exchange(c, &u, u.row, 0, o_h, o);
}

static void ulysses_backward(const spb_attn_ctx *c, const float *qkv, const float *o, const float *saved,
                             const float *dout, float *dqkv)
{
    (void)qkv, (void)o; /* the head-layout copies in `saved` are what attention saw */
    ulysses_dims u = dims_of(c);
    const float *qkv_h = saved, *o_h = saved + saved_o_offset(&u), *lse = saved + saved_lse_offset(&u);
    long head_floats = u.B * u.N * u.row, qkv_floats = u.B * u.N * u.qkv; /* O, and Q/K/V, in head layout */
    float *dout_h = spb_dev_cached(c, &dout_head, SPB_MEM_WORKSPACE, head_floats);
    float *dqkv_h = spb_dev_cached(c, &dqkv_head, SPB_MEM_WORKSPACE, qkv_floats);
    exchange(c, &u, u.row, 1, dout, dout_h);
    spb_attn_desc d = head_desc(&u, c);
    spb_dev_zero(c, dqkv_h, qkv_floats); /* the backend accumulates */
    spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
    c->backend->backward(&d, qkv_h, qkv_h + k_at(&u), qkv_h + v_at(&u), o_h, lse, dout_h, dqkv_h, dqkv_h + k_at(&u),
                         dqkv_h + v_at(&u));
    spb_timer_end(timed);
    *c->flops += 10.0 * d.head_dim * spb_attn_visible_pairs(&d);

    /* dQ, dK, dV go back together: every head block of every local token
     * arrives, so dqkv is overwritten in full. */
    exchange(c, &u, u.qkv, 0, dqkv_h, dqkv);
}

static int ulysses_validate(const spb_config *cfg, int world_size, char *err, size_t errlen)
{
    (void)world_size;
    if (cfg->sp_degree > 0 && cfg->num_heads % cfg->sp_degree != 0) {
        snprintf(err, errlen,
                 "--num-attention-heads %d is not divisible by --sp-degree %d (Ulysses gives each rank H/P heads)",
                 cfg->num_heads, cfg->sp_degree);
        return -1;
    }
    /* K/V heads: split like the query heads (G >= P), or one per rank,
     * replicated (G < P): each rank's query heads must read one K/V head. */
    int G = cfg->num_query_groups > 0 ? cfg->num_query_groups : cfg->num_heads, P = cfg->sp_degree;
    if (P > 0 && (G >= P ? G % P : P % G)) {
        snprintf(err, errlen,
                 "--num-query-groups %d and --sp-degree %d: Ulysses needs G divisible by P (K/V heads split like "
                 "query heads) or P divisible by G (each K/V head replicated on P/G ranks)", G, P);
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
 * With G = H this is 3h again. */
static spb_comm_volume ulysses_comm_volume(const spb_config *cfg, int sp_degree)
{
    const int H = cfg->num_heads, D = cfg->hidden_size / H;
    const int G = cfg->num_query_groups > 0 ? cfg->num_query_groups : H;
    const double qkv_width = (double)(H + 2 * (G > sp_degree ? G : sp_degree)) * D; /* floats per token */
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
    .attn_saved_floats = ulysses_saved_floats,
    .attention_forward = ulysses_forward,
    .attention_backward = ulysses_backward,
    .comm_volume = ulysses_comm_volume,
};
