/* `ring`: ring attention (Liu et al., "Ring Attention with Blockwise
 * Transformers"), flash style.  Q stays on its rank; the K/V blocks of the
 * SP group travel around the ring (rank r sends to r+1, receives from r-1),
 * one hop per step, the transfer of the next block overlapping the attention
 * on the current one.  Each step's partial attention (O_b, lse_b) is merged
 * into the running (O, lse) with the log-sum-exp rule, so the result is the
 * exact softmax attention over the whole sequence.
 *
 * Layouts (cfg->ring_layout):
 *   contiguous  rank r holds positions [r·T, (r+1)·T), T = N/P.  Under a
 *               causal mask rank r sees r+1 of the P blocks: rank P-1 does
 *               about twice the average work.
 *   zigzag      the sequence is cut into 2P chunks of c = N/(2P) tokens;
 *               rank r holds chunk r then chunk 2P-1-r (zhuzilin/
 *               ring-flash-attention).  Every rank then sees 2P-1 whole
 *               chunk pairs plus 2 diagonal ones: causal work is balanced.
 *               With 2P ∤ N the chunks are split.h's shares of N over 2P
 *               (the first N mod 2P one token more, torch.tensor_split's
 *               cut), so rank r holds c_r + c_{2P-1-r} tokens: ⌊N/P⌋ or
 *               ⌈N/P⌉, N/P whenever P | N, but not always the most on
 *               rank 0 (N = 2999, P = 2: 1499 and 1500).
 *
 * A block is a list of "runs" (1 for contiguous, 2 for zigzag) of rows at
 * consecutive global positions; the backend is called once per (query run,
 * key run) pair with that pair's offsets, and skipped when the causal mask
 * hides every key of the pair from every query of it. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "checks.h"
#include "memory.h"
#include "timer.h"
#include "device_mem.h"
#include "sp_parts.h"
#include "split.h"
#include "strategy.h"

enum { RING_MAX_RUNS = SPB_RING_MAX_RUNS };
typedef spb_ring_run ring_run;

/* Zigzag: the sequence in 2·size chunks of split.h's shares (the first
 * N mod 2·size one token more, as torch.tensor_split and ring-flash-
 * attention cut it), owner o holding chunks o and 2·size−1−o.  Empty
 * chunks (N < 2·size) give no run. */
int spb_ring_layout_runs(int zigzag, long seq_length, int sp_size, int owner, ring_run runs[RING_MAX_RUNS])
{
    if (!zigzag) { /* the owner's share, uneven when sp_size does not divide seq_length (split.h) */
        runs[0] = (ring_run){.row = 0, .len = (int)spb_split_count(seq_length, sp_size, owner),
                             .pos = spb_split_offset(seq_length, sp_size, owner)};
        return 1;
    }
    int chunks = 2 * sp_size, n = 0, row = 0;
    const int mine[2] = {owner, chunks - 1 - owner};
    for (int k = 0; k < 2; k++) {
        int len = (int)spb_split_count(seq_length, chunks, mine[k]);
        if (!len) continue;
        runs[n++] = (ring_run){.row = row, .len = len, .pos = spb_split_offset(seq_length, chunks, mine[k])};
        row += len;
    }
    return n;
}

long spb_ring_owner_tokens(int zigzag, long seq_length, int sp_size, int owner)
{
    if (!zigzag) return spb_split_count(seq_length, sp_size, owner);
    int chunks = 2 * sp_size;
    return spb_split_count(seq_length, chunks, owner) + spb_split_count(seq_length, chunks, chunks - 1 - owner);
}

long spb_ring_max_tokens(int zigzag, long seq_length, int sp_size)
{
    long most = 0;
    for (int o = 0; o < sp_size; o++) {
        long t = spb_ring_owner_tokens(zigzag, seq_length, sp_size, o);
        most = t > most ? t : most;
    }
    return most;
}

int spb_ring_is_zigzag(const spb_config *cfg) { return !strcmp(cfg->ring_layout, "zigzag"); }

int spb_ring_local_tokens(const spb_grid *grid, const spb_config *cfg)
{
    return (int)spb_ring_owner_tokens(spb_ring_is_zigzag(cfg), cfg->seq_length, grid->sp_size, grid->sp_rank);
}

void spb_ring_local_positions(const spb_grid *grid, const spb_config *cfg, long *positions)
{
    ring_run runs[RING_MAX_RUNS];
    int n = spb_ring_layout_runs(spb_ring_is_zigzag(cfg), cfg->seq_length, grid->sp_size, grid->sp_rank, runs);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < runs[k].len; i++) positions[runs[k].row + i] = runs[k].pos + i;
}

/* The layout the run was configured with (local_positions laid the tokens
 * out by it; every owner uses the same one): contiguous shares or zigzag
 * chunk pairs, even or not (split.h). */
static int ctx_layout_is_zigzag(const spb_attn_ctx *c, spb_rank_group group)
{
    SPB_CHECK(c->cfg);
    int zigzag = spb_ring_is_zigzag(c->cfg);
    SPB_CHECK(c->tokens == spb_ring_owner_tokens(zigzag, c->seq_length, group.size, group.rank));
    return zigzag;
}

/* Tokens of owner's block (the length of its runs). */
static long owner_tokens(int zigzag, long seq_length, int size, int owner)
{
    return spb_ring_owner_tokens(zigzag, seq_length, size, owner);
}

/* Causal and every key of the pair after every query of it: nothing visible. */
static int pair_hidden(const spb_attn_ctx *c, const ring_run *q, const ring_run *k)
{
    return c->causal && k->pos > q->pos + q->len - 1;
}

/* Widths of one token's rows: Q (and O) H·D, K or V G·D (grouped-query
 * attention: only the G K/V heads travel), the fused qkv H·D + 2·G·D. */
static int kv_heads_of(const spb_attn_ctx *c) { return c->kv_heads > 0 ? c->kv_heads : c->heads; }
static long q_row(const spb_attn_ctx *c) { return (long)c->heads * c->head_dim; }
static long kv_row(const spb_attn_ctx *c) { return (long)kv_heads_of(c) * c->head_dim; }
static long qkv_row(const spb_attn_ctx *c) { return q_row(c) + 2 * kv_row(c); }

/* Q (and dQ) read from the fused [B][T][H + 2G][D] buffer, K/V (and dK/dV)
 * from a travelling [B][Tk][2][G][D] block (Tk: its owner's tokens), O/dO
 * from [B][T][H][D]. */
static spb_attn_desc pair_desc(const spb_attn_ctx *c, const ring_run *q, const ring_run *k, long Tk)
{
    long W = q_row(c), KV = kv_row(c), QKV = qkv_row(c), T = c->tokens;
    spb_attn_desc d = {
        .batch = c->batch, .heads = c->heads, .kv_heads = kv_heads_of(c), .head_dim = c->head_dim,
        .q_len = q->len, .k_len = k->len,
        .q_offset = q->pos, .k_offset = k->pos,
        .causal = c->causal, .scale = 1.0f / sqrtf((float)c->head_dim),
        .q_token_stride = QKV, .q_batch_stride = QKV * T,
        .k_token_stride = 2 * KV, .k_batch_stride = 2 * KV * Tk,
        .o_token_stride = W, .o_batch_stride = W * T,
        /* blocked-sparse pattern (docs/SPARSE.md); no cfg (unit tests): dense */
        .sparse_block = c->cfg ? c->cfg->sparse_block : 0, .sparse_local = c->cfg ? c->cfg->sparse_local_blocks : 0,
        .sparse_global = c->cfg ? c->cfg->sparse_global_blocks : 0,
    };
    return d;
}

/* Copy K and V of the local qkv into a [B][T][2][G][D] block. */
static void pack_kv(const spb_attn_ctx *c, const float *qkv, float *block)
{
    long BT = (long)c->batch * c->tokens;
    spb_dev_copy_rows(c, block, 2 * kv_row(c), qkv + q_row(c), qkv_row(c), BT, 2 * kv_row(c));
}

static size_t ring_saved_floats(const spb_attn_ctx *c)
{
    return (size_t)c->batch * c->heads * c->tokens; /* final log-sum-exp [B][H][T] */
}

void spb_ring_attention_forward(const spb_attn_ctx *c, spb_rank_group group, const float *qkv, float *o, float *saved)
{
    int P = group.size, r = group.rank, next = (r + 1) % P, prev = (r + P - 1) % P;
    long W = q_row(c), KV = kv_row(c), QKV = qkv_row(c), BT = (long)c->batch * c->tokens;
    long lse_floats = BT * c->heads;
    int zigzag = ctx_layout_is_zigzag(c, group);
    ring_run q_runs[RING_MAX_RUNS];
    int n_q = spb_ring_layout_runs(zigzag, c->seq_length, P, r, q_runs);
    /* floats of an owner's K/V block; the buffers hold the largest (owner 0's
     * when contiguous, not always when zigzag: N = 7, P = 2 gives 3 and 4) */
    long per_token = (long)c->batch * 2 * KV;
#define BLOCK_OF(owner) (per_token * owner_tokens(zigzag, c->seq_length, P, (owner)))
    long block_floats = per_token * spb_ring_max_tokens(zigzag, c->seq_length, P);

    float *kv[2] = {spb_dev_alloc(c, SPB_MEM_COMM, block_floats),
                    P > 1 ? spb_dev_alloc(c, SPB_MEM_COMM, block_floats) : NULL};
    float *o_pair = spb_dev_alloc(c, SPB_MEM_WORKSPACE, BT * W);
    float *lse_pair = spb_dev_alloc_role(c, SPB_MEM_WORKSPACE, lse_floats, SPB_BUF_FP32);
    pack_kv(c, qkv, kv[0]);

    /* The running (O, lse) accumulate in place in o and saved. */
    spb_dev_zero(c, o, BT * W);
    spb_dev_fill(c, saved, lse_floats, -INFINITY);

    for (int step = 0; step < P; step++) {
        int owner = (r - step + P) % P;
        float *cur = kv[step % 2];
        /* Post the next block's transfer first so it overlaps this step's compute. */
        spb_sendrecv xfer;
        int more = step < P - 1;
        if (more) /* owner's block on, owner - 1's in */
            spb_sendrecv_start_v(&xfer, cur, BLOCK_OF(owner), next, kv[(step + 1) % 2], BLOCK_OF((owner + P - 1) % P),
                                 prev, group.comm, c->phase);

        ring_run k_runs[RING_MAX_RUNS];
        int n_k = spb_ring_layout_runs(zigzag, c->seq_length, P, owner, k_runs);
        long Tk = owner_tokens(zigzag, c->seq_length, P, owner);
        spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
        for (int qi = 0; qi < n_q; qi++)
            for (int ki = 0; ki < n_k; ki++) {
                const ring_run *q = &q_runs[qi], *k = &k_runs[ki];
                if (pair_hidden(c, q, k)) continue;
                spb_attn_desc d = pair_desc(c, q, k, Tk);
                const float *k_rows = cur + (long)k->row * 2 * KV;
                c->backend->forward(&d, qkv + (long)q->row * QKV, k_rows, k_rows + KV, o_pair + (long)q->row * W,
                                    lse_pair);
                *c->flops += 4.0 * d.head_dim * spb_attn_visible_pairs(&d);
                /* fold this pair into the running (O, lse): attention.h */
                spb_dev_attn_merge(c, o, saved, o_pair, lse_pair, q->row, q->len);
            }
        spb_timer_end(timed);
        if (more) spb_sendrecv_wait(&xfer);
    }

    spb_dev_free(c, kv[0]);
    spb_dev_free(c, kv[1]);
    spb_dev_free(c, o_pair);
    spb_dev_free(c, lse_pair);
}

/* Backward.  dQ accumulates in place in dqkv.  K/V travel the ring again
 * exactly as in forward (posted before compute, double buffered).  The dK/dV
 * of a block travel one step behind it: at step s the rank computes the
 * contribution of its queries to block owner(s) = r - s into a zeroed buffer
 * while receiving, from r-1, the dK/dV of that block accumulated so far
 * (r-1 finished it at step s-1) and sending to r+1 its own accumulation for
 * owner(s-1); after the wait it adds the received part.  So both transfers of
 * a step are posted before its compute and overlap it.  After the last step
 * the accumulation for owner(P-1) = r+1 is complete and goes home with one
 * more transfer, and r receives its own complete dK/dV from r-1.
 * Both transfers of a step go r-1 -> r on the same communicator and tag, and
 * every rank posts K/V before dK/dV: MPI's non-overtaking order matches them. */
void spb_ring_attention_backward(const spb_attn_ctx *c, spb_rank_group group, const float *qkv, const float *o,
                                 const float *saved, const float *dout, float *dqkv)
{
    int P = group.size, r = group.rank, next = (r + 1) % P, prev = (r + P - 1) % P;
    int H = c->heads, T = c->tokens;
    long W = q_row(c), KV = kv_row(c), QKV = qkv_row(c), BT = (long)c->batch * T;
    int zigzag = ctx_layout_is_zigzag(c, group);
    ring_run q_runs[RING_MAX_RUNS];
    int n_q = spb_ring_layout_runs(zigzag, c->seq_length, P, r, q_runs);
    long per_token = (long)c->batch * 2 * KV;
    /* the largest block; each transfer moves its owner's */
    long block_floats = per_token * spb_ring_max_tokens(zigzag, c->seq_length, P);

    spb_dev_zero(c, dqkv, BT * QKV);
    float *kv[2] = {spb_dev_alloc(c, SPB_MEM_COMM, block_floats),
                    P > 1 ? spb_dev_alloc(c, SPB_MEM_COMM, block_floats) : NULL};
    /* dK/dV blocks ([B][T][2][G][D]): computed this step, sent this step
     * (previous owner's accumulation), received this step. */
    float *grad_work = spb_dev_alloc(c, SPB_MEM_COMM, block_floats);
    float *grad_out = P > 1 ? spb_dev_alloc(c, SPB_MEM_COMM, block_floats) : NULL;
    float *grad_in = P > 1 ? spb_dev_alloc(c, SPB_MEM_COMM, block_floats) : NULL;
    pack_kv(c, qkv, kv[0]);

    /* The backend wants the final lse of a query run contiguous per
     * (batch, head): [B][H][len]; copy each run's rows out of saved once. */
    float *lse_runs[RING_MAX_RUNS] = {NULL, NULL};
    for (int qi = 0; qi < n_q; qi++) {
        const ring_run *q = &q_runs[qi];
        lse_runs[qi] = spb_dev_alloc_role(c, SPB_MEM_WORKSPACE, (long)c->batch * H * q->len, SPB_BUF_FP32);
        spb_dev_copy_rows(c, lse_runs[qi], q->len, saved + q->row, T, (long)c->batch * H, q->len);
    }

    for (int step = 0; step < P; step++) {
        int owner = (r - step + P) % P;
        float *cur = kv[step % 2];
        spb_sendrecv kv_xfer, grad_xfer;
        int more_kv = step < P - 1, grad_arrives = step > 0;
        long owner_block = BLOCK_OF(owner);
        if (more_kv)
            spb_sendrecv_start_v(&kv_xfer, cur, owner_block, next, kv[(step + 1) % 2], BLOCK_OF((owner + P - 1) % P),
                                 prev, group.comm, c->phase);
        if (grad_arrives) /* owner + 1's accumulation on, owner's in */
            spb_sendrecv_start_v(&grad_xfer, grad_out, BLOCK_OF((owner + 1) % P), next, grad_in, owner_block, prev,
                                 group.comm, c->phase);

        ring_run k_runs[RING_MAX_RUNS];
        int n_k = spb_ring_layout_runs(zigzag, c->seq_length, P, owner, k_runs);
        long Tk = owner_tokens(zigzag, c->seq_length, P, owner);
        spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
        spb_dev_zero(c, grad_work, owner_block);
        for (int qi = 0; qi < n_q; qi++)
            for (int ki = 0; ki < n_k; ki++) {
                const ring_run *q = &q_runs[qi], *k = &k_runs[ki];
                if (pair_hidden(c, q, k)) continue;
                spb_attn_desc d = pair_desc(c, q, k, Tk);
                long q_at = (long)q->row * QKV, o_at = (long)q->row * W, k_at = (long)k->row * 2 * KV;
                c->backend->backward(&d, qkv + q_at, cur + k_at, cur + k_at + KV, o + o_at, lse_runs[qi],
                                     dout + o_at, dqkv + q_at, grad_work + k_at, grad_work + k_at + KV);
                *c->flops += 10.0 * d.head_dim * spb_attn_visible_pairs(&d);
            }
        spb_timer_end(timed);

        if (more_kv) spb_sendrecv_wait(&kv_xfer);
        if (grad_arrives) {
            spb_sendrecv_wait(&grad_xfer);
            spb_dev_add(c, grad_work, grad_in, owner_block);
        }
        /* grad_work now holds owner's accumulation: it is next step's send. */
        if (P > 1) {
            float *sent = grad_out;
            grad_out = grad_work;
            grad_work = sent;
        }
    }

    /* Home run: owner(P-1) = r+1 gets its dK/dV, r receives its own. */
    const float *own_grad = grad_work;
    if (P > 1) {
        spb_sendrecv home;
        spb_sendrecv_start_v(&home, grad_out, BLOCK_OF(next), next, grad_in, BLOCK_OF(r), prev, group.comm, c->phase);
        spb_sendrecv_wait(&home);
        own_grad = grad_in;
    }
    spb_dev_copy_rows(c, dqkv + W, QKV, own_grad, 2 * KV, BT, 2 * KV);

    for (int qi = 0; qi < n_q; qi++) spb_dev_free(c, lse_runs[qi]);
    spb_dev_free(c, kv[0]);
    spb_dev_free(c, kv[1]);
    spb_dev_free(c, grad_work);
    spb_dev_free(c, grad_out);
    spb_dev_free(c, grad_in);
}
#undef BLOCK_OF

static void ring_forward(const spb_attn_ctx *c, const float *qkv, float *o, float *saved)
{
    spb_ring_attention_forward(c, spb_sp_group(c->grid), qkv, o, saved);
}

static void ring_backward(const spb_attn_ctx *c, const float *qkv, const float *o, const float *saved,
                          const float *dout, float *dqkv)
{
    spb_ring_attention_backward(c, spb_sp_group(c->grid), qkv, o, saved, dout, dqkv);
}

/* Bytes per link, one layer, one micro-batch of b sequences, hidden h,
 * T = N/P tokens per rank, G K/V heads of D (grouped-query attention; G·D
 * = h without it).  Every transfer is one spb_sendrecv of a [b][T][2][G·D]
 * block (K and V, or dK and dV): only K/V heads travel, so h below reads
 * G·D: count = 2·b·T·G·D floats,
 * recorded as payload = link bytes = 4·count (bus factor 1).
 *   forward:  P-1 K/V hops                      = (P-1)·4·2bTh
 *             = 4·2·b·N·h·(P-1)/P
 *   backward: P-1 K/V hops, P-1 dK/dV hops one step behind them, 1 home run
 *             of dK/dV                          = (2P-1)·4·2bTh
 *             = 4·(2·b·N·h·(P-1)/P + 2·b·N·h)
 * Blocks travel even when a causal mask hides them from the receiver (the
 * next rank may need them), so the mask does not change the volume.
 * P = 1: no transfers.
 *
 * Uneven shares (P ∤ N, contiguous; split.h): each hop moves its owner's
 * block, 4·2·b·T_o·G·D bytes for owner o.  Rank r sends, forward, every
 * block but owner r+1's (the one it only receives last): N − T_{r+1}
 * tokens' worth; backward, those K/V blocks again, the dK/dV
 * accumulations of the same owners, and owner r+1's dK/dV home:
 * 2N − T_{r+1}.  The busiest link is a rank whose successor holds the
 * smallest share ⌊N/P⌋ (the last rank, whose successor is rank 0, only
 * when every share is equal), and that is what this returns:
 *   forward  4·2·b·G·D·(N − ⌊N/P⌋),  backward 4·2·b·G·D·(2N − ⌊N/P⌋),
 * which for P | N are the two lines above.
 *
 * Zigzag with 2P ∤ N: owner o's block is its two chunks, c_o + c_{2P−1−o}
 * tokens of split.h's shares of N over 2P.  With N = 2P·q + m the chunks
 * below m hold q + 1; rank o < P gets [o < m] + [2P−1−o < m] extra tokens:
 * for m < P ranks below m get one, the rest none (shares 2q, 2q+1); for
 * m = P every rank one (N/P each); for m > P every rank one and the ranks
 * from 2P−m on two (2q+1, 2q+2).  So the shares are again ⌊N/P⌋ and
 * ⌈N/P⌉, equal exactly when P | N, the smallest ⌊N/P⌋: the same two
 * formulas (only which rank sends them differs). */
static spb_comm_volume ring_comm_volume(const spb_config *cfg, int sp_degree)
{
    if (sp_degree <= 1) return (spb_comm_volume){0.0, 0.0};
    const int G = cfg->num_query_groups > 0 ? cfg->num_query_groups : cfg->num_heads;
    const double kv_width = (double)G * (cfg->hidden_size / cfg->num_heads); /* G·D floats per token */
    if (!spb_split_is_even(cfg->seq_length, sp_degree)) {
        double token_bytes = 4.0 * 2.0 * cfg->micro_batch_size * kv_width;
        double N = cfg->seq_length, least = (double)(cfg->seq_length / sp_degree);
        return (spb_comm_volume){.forward_bytes = token_bytes * (N - least),
                                 .backward_bytes = token_bytes * (2.0 * N - least)};
    }
    double block_bytes = 4.0 * 2.0 * cfg->micro_batch_size * (double)(cfg->seq_length / sp_degree) * kv_width;
    return (spb_comm_volume){
        .forward_bytes = (sp_degree - 1) * block_bytes,
        .backward_bytes = (2.0 * sp_degree - 1) * block_bytes,
    };
}

const spb_strategy spb_strategy_ring = {
    .name = "ring",
    .summary = "ring attention: K/V blocks circulate, online-softmax merge (layout contiguous or zigzag)",
    .uneven_tokens = 1, /* contiguous shares or zigzag's chunk pairs (split.h over P or 2P) */
    .local_tokens = spb_ring_local_tokens,
    .local_positions = spb_ring_local_positions,
    .attn_saved_floats = ring_saved_floats,
    .attention_forward = ring_forward,
    .attention_backward = ring_backward,
    .comm_volume = ring_comm_volume,
};
