/* DeepSpeed-Ulysses (arXiv 2309.14509): sequence parallelism by all-to-all.
 *
 * Each of the P ranks of an SP group holds N/P contiguous tokens with all H
 * heads.  One all-to-all regroups Q, K and V so that each rank holds all N
 * tokens of H/P heads; attention then runs locally on whole sequences (any
 * backend, no change to the kernel) and a second all-to-all returns the
 * output to the token split.  The backward mirrors it: all-to-all of dO,
 * local backward, all-to-all of dQ, dK, dV together.
 *
 * Layouts (T = N/P local tokens, Hp = H/P heads per rank, row = Hp·D):
 *   local    P head blocks of [B][T][w][Hp][D]: qkv (w = 3), o and dO (w = 1),
 *            as the core's products write and read them (head_blocks = P);
 *            block j is what goes to rank j: the all-to-all's send layout
 *   head     [B][N][w][Hp][D], rank i's tokens at i·T    (what attention reads)
 * With micro-batch 1 the collectives are the only passes over memory:
 * attention reads Q/K/V straight out of the received blocks through the
 * backend's strides. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "checks.h"
#include "memory.h"
#include "timer.h"
#include "device_mem.h"
#include "strategy.h"

typedef struct ulysses_dims {
    int P;     /* SP group size */
    int B, T;  /* sequences, local tokens per sequence */
    long N;    /* whole sequence: P·T */
    int Hp, D; /* heads per rank, head dim */
    long row;  /* floats of one token's Hp heads: Hp·D */
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
    return u;
}

/* Per-layer saved storage, lse last so that the big arrays keep the
 * buffer's alignment (whenever Hp·D is a multiple of 16):
 * head-layout QKV [B][N][3][Hp][D], head-layout O [B][N][Hp][D], lse [B][Hp][N]. */
static long saved_o_offset(const ulysses_dims *u) { return u->B * u->N * 3 * u->row; }
static long saved_lse_offset(const ulysses_dims *u) { return u->B * u->N * 4 * u->row; }

static size_t ulysses_saved_floats(const spb_attn_ctx *c)
{
    ulysses_dims u = dims_of(c);
    return (size_t)u.B * u.N * 4 * u.row + (size_t)u.B * u.Hp * u.N;
}

/* Attention of all N tokens among themselves for this rank's Hp heads, Q/K/V
 * read from the fused head layout. */
static spb_attn_desc head_desc(const ulysses_dims *u, const spb_attn_ctx *c)
{
    spb_attn_desc d = {
        .batch = u->B, .heads = u->Hp, .head_dim = u->D,
        .q_len = (int)u->N, .k_len = (int)u->N,
        .q_offset = 0, .k_offset = 0,
        .causal = c->causal, .scale = 1.0f / sqrtf((float)u->D),
        .q_token_stride = 3 * u->row, .q_batch_stride = 3 * u->row * u->N,
        .k_token_stride = 3 * u->row, .k_batch_stride = 3 * u->row * u->N,
        .o_token_stride = u->row, .o_batch_stride = u->row * u->N,
        /* blocked-sparse pattern (docs/SPARSE.md); no cfg (unit tests): dense */
        .sparse_block = c->cfg ? c->cfg->sparse_block : 0, .sparse_local = c->cfg ? c->cfg->sparse_local_blocks : 0,
        .sparse_global = c->cfg ? c->cfg->sparse_global_blocks : 0,
    };
    return d;
}

/* blocks (block i = rank i's T tokens) -> head layout [B][N][w][Hp][D]. */
static void blocks_to_head(const spb_attn_ctx *c, const float *blocks, float *head, const ulysses_dims *u, int w)
{
    long seq_chunk = (long)u->T * w * u->row; /* one sequence's T tokens */
    for (int i = 0; i < u->P; i++)
        for (int b = 0; b < u->B; b++)
            spb_dev_copy(c, head + ((long)b * u->P + i) * seq_chunk, blocks + ((long)i * u->B + b) * seq_chunk,
                         seq_chunk);
}

/* Inverse of blocks_to_head: block i = the rows of rank i's tokens. */
static void head_to_blocks(const spb_attn_ctx *c, const float *head, float *blocks, const ulysses_dims *u, int w)
{
    long seq_chunk = (long)u->T * w * u->row;
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
static void allgather_exchange(const spb_attn_ctx *c, const ulysses_dims *u, int w, int to_head, const float *in,
                               float *blocks)
{
    long count = (long)u->B * u->T * w * u->row, whole = count * u->P; /* floats per block, per rank */
    float *all = spb_dev_cached(c, &gather_buf, SPB_MEM_COMM, whole * u->P);
    spb_allgather_f32(in, all, whole, c->grid->sp_comm, c->phase);
    int me = c->grid->sp_rank;
    long seq_chunk = (long)u->T * w * u->row;
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

static void exchange(const spb_attn_ctx *c, const ulysses_dims *u, int w, int to_head, const float *in, float *out)
{
    long count = (long)u->B * u->T * w * u->row; /* floats per block */
    float *staging = u->B > 1 ? spb_dev_cached(c, to_head ? &recv_buf : &send_buf, SPB_MEM_COMM, count * u->P) : NULL;
    spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
    if (to_head) {
        float *blocks = staging ? staging : out;
        if (uses_allgather(c))
            allgather_exchange(c, u, w, 1, in, blocks);
        else
            spb_alltoall_f32(in, blocks, count, c->grid->sp_comm, c->phase);
        if (staging) blocks_to_head(c, staging, out, u, w);
    } else {
        if (uses_allgather(c)) /* gathers the head layout itself: no regrouping first */
            allgather_exchange(c, u, w, 0, in, out);
        else {
            if (staging) head_to_blocks(c, in, staging, u, w);
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

    exchange(c, &u, 3, 1, qkv, qkv_h);

    spb_attn_desc d = head_desc(&u, c);
    spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
    c->backend->forward(&d, qkv_h, qkv_h + u.row, qkv_h + 2 * u.row, o_h, lse);
    spb_timer_end(timed);
    *c->flops += 4.0 * d.head_dim * spb_attn_visible_pairs(&d);

    exchange(c, &u, 1, 0, o_h, o);
}

static void ulysses_backward(const spb_attn_ctx *c, const float *qkv, const float *o, const float *saved,
                             const float *dout, float *dqkv)
{
    (void)qkv, (void)o; /* the head-layout copies in `saved` are what attention saw */
    ulysses_dims u = dims_of(c);
    const float *qkv_h = saved, *o_h = saved + saved_o_offset(&u), *lse = saved + saved_lse_offset(&u);
    long head_floats = u.B * u.N * u.row; /* one of Q, K, V, O in head layout */
    float *dout_h = spb_dev_cached(c, &dout_head, SPB_MEM_WORKSPACE, head_floats);
    float *dqkv_h = spb_dev_cached(c, &dqkv_head, SPB_MEM_WORKSPACE, 3 * head_floats);

    exchange(c, &u, 1, 1, dout, dout_h);

    spb_attn_desc d = head_desc(&u, c);
    spb_dev_zero(c, dqkv_h, 3 * head_floats); /* the backend accumulates */
    spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
    c->backend->backward(&d, qkv_h, qkv_h + u.row, qkv_h + 2 * u.row, o_h, lse, dout_h, dqkv_h, dqkv_h + u.row,
                         dqkv_h + 2 * u.row);
    spb_timer_end(timed);
    *c->flops += 10.0 * d.head_dim * spb_attn_visible_pairs(&d);

    /* dQ, dK, dV go back together: every head block of every local token
     * arrives, so dqkv is overwritten in full. */
    exchange(c, &u, 3, 0, dqkv_h, dqkv);
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
static spb_comm_volume ulysses_comm_volume(const spb_config *cfg, int sp_degree)
{
    double local_floats = (double)cfg->micro_batch_size * (cfg->seq_length / sp_degree) * cfg->hidden_size;
    spb_comm_volume v;
    if (!strcmp(cfg->ulysses_comm, "allgather")) {
        /* The ablation: each exchange allgathers a rank's whole buffer, P·S
         * floats for a block of S = b·(N/P)·w·h/P, i.e. b·(N/P)·w·h; the
         * recorded payload is P times that and the link carries (P−1)/P of
         * it: 4·b·N·h·(P−1)/P floats per direction for w = 3 + 1, P times
         * the all-to-all's. */
        double link_share = spb_comm_bus_factor(SPB_OP_ALLGATHER, sp_degree);
        double qkv_payload = 4.0 * (3.0 * local_floats) * sp_degree, o_payload = 4.0 * local_floats * sp_degree;
        v.forward_bytes = qkv_payload * link_share + o_payload * link_share;
        v.backward_bytes = o_payload * link_share + qkv_payload * link_share;
        return v;
    }
    double link_share = spb_comm_bus_factor(SPB_OP_ALLTOALL, sp_degree);
    double qkv_payload = 4.0 * 3.0 * local_floats, o_payload = 4.0 * local_floats;
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
