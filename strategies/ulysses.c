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
 *   local    qkv [B][T][3][H][D], o [B][T][H][D]         (what the core holds)
 *   blocks   P blocks of [B][T][w][Hp][D]                (all-to-all buffers;
 *            w = 3 for fused QKV, 1 for O and dO)
 *   head     [B][N][w][Hp][D], rank i's tokens at i·T    (what attention reads)
 * The pack into blocks and the unpack out of them are the only passes over
 * memory besides the collectives: attention reads Q/K/V straight out of the
 * fused head layout through the backend's strides; with micro-batch 1 the
 * head side of each exchange is the block layout itself and is not copied. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../common/checks.h"
#include "../common/memory.h"
#include "../common/timer.h"
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
    };
    return d;
}

/* local [B][T][w][H][D] -> blocks: block j = heads [j·Hp, (j+1)·Hp). */
static void local_to_blocks(const float *local, float *blocks, const ulysses_dims *u, int w)
{
    long rows = (long)u->B * u->T * w, block = rows * u->row;
    size_t bytes = sizeof(float) * (size_t)u->row;
    for (long r = 0; r < rows; r++)
        for (int j = 0; j < u->P; j++)
            memcpy(blocks + j * block + r * u->row, local + (r * u->P + j) * u->row, bytes);
}

/* Inverse of local_to_blocks: block j holds heads [j·Hp, (j+1)·Hp). */
static void blocks_to_local(const float *blocks, float *local, const ulysses_dims *u, int w)
{
    long rows = (long)u->B * u->T * w, block = rows * u->row;
    size_t bytes = sizeof(float) * (size_t)u->row;
    for (long r = 0; r < rows; r++)
        for (int j = 0; j < u->P; j++)
            memcpy(local + (r * u->P + j) * u->row, blocks + j * block + r * u->row, bytes);
}

/* blocks (block i = rank i's T tokens) -> head layout [B][N][w][Hp][D]. */
static void blocks_to_head(const float *blocks, float *head, const ulysses_dims *u, int w)
{
    long seq_chunk = (long)u->T * w * u->row; /* one sequence's T tokens */
    size_t bytes = sizeof(float) * (size_t)seq_chunk;
    for (int i = 0; i < u->P; i++)
        for (int b = 0; b < u->B; b++)
            memcpy(head + ((long)b * u->P + i) * seq_chunk, blocks + ((long)i * u->B + b) * seq_chunk, bytes);
}

/* Inverse of blocks_to_head: block i = the rows of rank i's tokens. */
static void head_to_blocks(const float *head, float *blocks, const ulysses_dims *u, int w)
{
    long seq_chunk = (long)u->T * w * u->row;
    size_t bytes = sizeof(float) * (size_t)seq_chunk;
    for (int i = 0; i < u->P; i++)
        for (int b = 0; b < u->B; b++)
            memcpy(blocks + ((long)i * u->B + b) * seq_chunk, head + ((long)b * u->P + i) * seq_chunk, bytes);
}

/* Buffers kept from call to call, grown when a call needs more: a fresh
 * spb_mem_alloc zeroes its block, a pass over memory the exchange does not
 * need.  They live until the process ends: each category's peak is what
 * per-call allocation would reach, but they stay counted as current. */
static float *send_buf, *recv_buf; /* all-to-all blocks, SPB_MEM_COMM */
static float *dout_head, *dqkv_head; /* backward's head-layout dO and dQKV, SPB_MEM_WORKSPACE */

static float *cached(float **slot, spb_mem_category cat, long floats)
{
    size_t bytes = sizeof(float) * (size_t)floats;
    if (!*slot || spb_mem_size(*slot) < bytes) {
        spb_mem_free(*slot);
        *slot = spb_mem_alloc(cat, bytes);
    }
    return *slot;
}

typedef void (*repack_fn)(const float *from, float *to, const ulysses_dims *u, int w);

/* With one sequence per micro-batch (the paper's runs) the block layout of
 * the all-to-all (rank i's tokens as block i) IS the head layout [N][w][Hp][D],
 * so the head side of each exchange needs no copy: receive into it, or send
 * from it, directly.  (Describing the strided local side to MPI as a derived
 * datatype instead of packing it was measured slower with Open MPI 4.1.) */
static int is_identity(repack_fn f, const ulysses_dims *u)
{
    return u->B == 1 && (f == blocks_to_head || f == head_to_blocks);
}

/* One exchange of w·Hp·D floats per token and rank: pack, all-to-all over
 * the SP group, unpack; timed whole as SPB_T_EXCHANGE. */
static void exchange(const spb_attn_ctx *c, const ulysses_dims *u, int w, repack_fn pack, const float *in,
                     repack_fn unpack, float *out)
{
    long count = (long)u->B * u->T * w * u->row; /* floats per block */
    float *send = is_identity(pack, u) ? NULL : cached(&send_buf, SPB_MEM_COMM, count * u->P);
    float *recv = is_identity(unpack, u) ? out : cached(&recv_buf, SPB_MEM_COMM, count * u->P);
    double t0 = spb_now();
    if (send) pack(in, send, u, w);
    spb_alltoall_f32(send ? send : in, recv, count, c->grid->sp_comm, c->phase);
    if (recv != out) unpack(recv, out, u, w);
    spb_timer_add(SPB_T_EXCHANGE, spb_now() - t0);
}

static void ulysses_forward(const spb_attn_ctx *c, const float *qkv, float *o, float *saved)
{
    ulysses_dims u = dims_of(c);
    /* The all-to-all stitches rank i's block in at i·T: tokens must be contiguous. */
    SPB_CHECK(u.N == c->seq_length && (!c->positions || c->positions[0] == (long)c->grid->sp_rank * u.T));
    float *qkv_h = saved, *o_h = saved + saved_o_offset(&u), *lse = saved + saved_lse_offset(&u);

    exchange(c, &u, 3, local_to_blocks, qkv, blocks_to_head, qkv_h);

    spb_attn_desc d = head_desc(&u, c);
    double t0 = spb_now();
    c->backend->forward(&d, qkv_h, qkv_h + u.row, qkv_h + 2 * u.row, o_h, lse);
    spb_timer_add(SPB_T_ATTENTION, spb_now() - t0);
    *c->flops += 4.0 * d.head_dim * spb_attn_visible_pairs(&d);

    exchange(c, &u, 1, head_to_blocks, o_h, blocks_to_local, o);
}

static void ulysses_backward(const spb_attn_ctx *c, const float *qkv, const float *o, const float *saved,
                             const float *dout, float *dqkv)
{
    (void)qkv, (void)o; /* the head-layout copies in `saved` are what attention saw */
    ulysses_dims u = dims_of(c);
    const float *qkv_h = saved, *o_h = saved + saved_o_offset(&u), *lse = saved + saved_lse_offset(&u);
    long head_floats = u.B * u.N * u.row; /* one of Q, K, V, O in head layout */
    float *dout_h = cached(&dout_head, SPB_MEM_WORKSPACE, head_floats);
    float *dqkv_h = cached(&dqkv_head, SPB_MEM_WORKSPACE, 3 * head_floats);

    exchange(c, &u, 1, local_to_blocks, dout, blocks_to_head, dout_h);

    spb_attn_desc d = head_desc(&u, c);
    memset(dqkv_h, 0, sizeof(float) * (size_t)(3 * head_floats)); /* the backend accumulates */
    double t0 = spb_now();
    c->backend->backward(&d, qkv_h, qkv_h + u.row, qkv_h + 2 * u.row, o_h, lse, dout_h, dqkv_h, dqkv_h + u.row,
                         dqkv_h + 2 * u.row);
    spb_timer_add(SPB_T_ATTENTION, spb_now() - t0);
    *c->flops += 10.0 * d.head_dim * spb_attn_visible_pairs(&d);

    /* dQ, dK, dV go back together: every head block of every local token
     * arrives, so dqkv is overwritten in full. */
    exchange(c, &u, 3, head_to_blocks, dqkv_h, blocks_to_local, dqkv);
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
    double link_share = spb_comm_bus_factor(SPB_OP_ALLTOALL, sp_degree);
    double local_floats = (double)cfg->micro_batch_size * (cfg->seq_length / sp_degree) * cfg->hidden_size;
    double qkv_payload = 4.0 * 3.0 * local_floats, o_payload = 4.0 * local_floats;
    spb_comm_volume v;
    v.forward_bytes = qkv_payload * link_share + o_payload * link_share;
    v.backward_bytes = o_payload * link_share + qkv_payload * link_share;
    return v;
}

const spb_strategy spb_strategy_ulysses = {
    .name = "ulysses",
    .summary = "DeepSpeed-Ulysses: all-to-all to H/P heads of the whole sequence around local attention",
    .validate = ulysses_validate,
    .attn_saved_floats = ulysses_saved_floats,
    .attention_forward = ulysses_forward,
    .attention_backward = ulysses_backward,
    .comm_volume = ulysses_comm_volume,
};
