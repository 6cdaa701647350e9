/* `allgather-kv`: context parallelism as Llama 3 was trained with it
 * (Llama Team, "The Llama 3 Herd of Models", arXiv 2407.21783, §3.3.2).
 *
 * Queries stay on their rank; K and V of the SP group are all-gathered, so
 * each rank attends its own T = N/P queries to all N keys in one call per
 * query run, and the backward reduce-scatters dK and dV to the ranks that
 * own those tokens.  The token layout is ring attention's (--ring-layout):
 * zigzag pairs chunks r and 2P−1−r of N/(2P) tokens on rank r, which
 * balances the causal work (Llama 3's "2·CP chunks" split); contiguous
 * leaves rank P−1 with the most.  With P ∤ N (or 2P ∤ N for zigzag) the
 * shares and chunks are split.h's, and the collectives take per-rank counts.
 *
 * Unlike ring attention the exchange is one collective, not overlapped
 * with compute, and every rank holds all of K and V while it attends
 * (B·N·2h floats of workspace per layer); Llama 3 chose it because GQA's
 * few K/V heads make that small and because it takes any mask.  The K/V
 * gather is repeated in backward rather than kept (memory over bytes; the
 * formula below counts it).  With grouped-query attention only the G K/V
 * heads are gathered and reduce-scattered: both collectives shrink by G/H.
 *
 * Layouts (W = H·D query row, KV = G·D, the core's qkv row W + 2·KV): the
 * local K/V block [B][T][2][G][D] packed from qkv; the gathered blocks
 * [P][B][T][2][G][D] (owner-major: the collectives' order); the sequence
 * [B][N][2][G][D] at global positions (what attention reads, and dK/dV
 * accumulate into before going back to owner order). */
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

/* Widths of one token's rows: Q (and O) H·D, K or V G·D, the fused qkv. */
static int kv_heads_of(const spb_attn_ctx *c) { return c->kv_heads > 0 ? c->kv_heads : c->heads; }
static long q_row(const spb_attn_ctx *c) { return (long)c->heads * c->head_dim; }
static long kv_row(const spb_attn_ctx *c) { return (long)kv_heads_of(c) * c->head_dim; }
static long qkv_row(const spb_attn_ctx *c) { return q_row(c) + 2 * kv_row(c); }

/* Its layout is ring's (zigzag: chunks r and 2P-1-r, of any sizes):
 * spb_ring_local_tokens, spb_ring_local_positions (sp_parts.h). */

/* Uneven shares with up to SPB_AGKV_MAX_RANKS ranks (the per-rank count
 * arrays live on the stack). */
enum { SPB_AGKV_MAX_RANKS = 1024 };
static int agkv_validate(const spb_config *cfg, int world_size, char *err, size_t errlen)
{
    (void)world_size;
    if (cfg->sp_degree > SPB_AGKV_MAX_RANKS && cfg->seq_length % cfg->sp_degree) {
        snprintf(err, errlen, "--strategy allgather-kv with --seq-length %d not divisible by --sp-degree %d: uneven "
                              "shares take at most %d ranks", cfg->seq_length, cfg->sp_degree, SPB_AGKV_MAX_RANKS);
        return -1;
    }
    return 0;
}

static size_t agkv_saved_floats(const spb_attn_ctx *c)
{
    return (size_t)c->batch * c->heads * c->tokens; /* log-sum-exp [B][H][T] */
}

/* Owner o's tokens (its share of the ring layout: contiguous, or zigzag's
 * chunk pair, split.h's shares either way) and where its block starts
 * among the owner-major blocks, in tokens x B: the owners before it. */
static long owner_tokens(const spb_attn_ctx *c, int owner)
{
    return spb_ring_owner_tokens(spb_ring_is_zigzag(c->cfg), c->seq_length, c->grid->sp_size, owner);
}
static long owner_first(const spb_attn_ctx *c, int owner)
{
    if (!spb_ring_is_zigzag(c->cfg)) return spb_split_offset(c->seq_length, c->grid->sp_size, owner);
    long first = 0;
    for (int o = 0; o < owner; o++) first += owner_tokens(c, o);
    return first;
}
/* P ∤ N: shares differ (zigzag's too: strategies/ring.c); P | N: all N/P. */
static int uneven(const spb_attn_ctx *c) { return !spb_split_is_even(c->seq_length, c->grid->sp_size); }

/* Per-rank counts and displacements (floats) of the owner-major blocks. */
static void block_counts(const spb_attn_ctx *c, long *counts, long *displs)
{
    long per_token = (long)c->batch * 2 * kv_row(c);
    for (int o = 0; o < c->grid->sp_size; o++)
        counts[o] = per_token * owner_tokens(c, o), displs[o] = per_token * owner_first(c, o);
}

/* Owner-major blocks <-> the sequence at global positions. */
static void owners_to_sequence(const spb_attn_ctx *c, int zigzag, const float *blocks, float *seq, int to_seq)
{
    int P = c->grid->sp_size;
    long KV = kv_row(c), N = c->seq_length;
    for (int owner = 0; owner < P; owner++) {
        spb_ring_run runs[SPB_RING_MAX_RUNS];
        int n = spb_ring_layout_runs(zigzag, N, P, owner, runs);
        long T = owner_tokens(c, owner), first = (long)c->batch * owner_first(c, owner);
        for (int k = 0; k < n; k++)
            for (int b = 0; b < c->batch; b++) {
                float *in_seq = seq + ((long)b * N + runs[k].pos) * 2 * KV;
                float *in_blocks = (float *)blocks + (first + (long)b * T + runs[k].row) * 2 * KV;
                if (to_seq)
                    spb_dev_copy(c, in_seq, in_blocks, runs[k].len * 2 * KV);
                else
                    spb_dev_copy(c, in_blocks, in_seq, runs[k].len * 2 * KV);
            }
    }
}

/* Every rank's K and V at their global positions, [B][N][2][G][D]. */
static float *gather_kv(const spb_attn_ctx *c, int zigzag, const float *qkv)
{
    long KV = kv_row(c), BT = (long)c->batch * c->tokens, all = (long)c->batch * c->seq_length * 2 * KV;
    float *local = spb_dev_alloc(c, SPB_MEM_COMM, BT * 2 * KV);
    float *blocks = spb_dev_alloc(c, SPB_MEM_COMM, all);
    float *seq = spb_dev_alloc(c, SPB_MEM_WORKSPACE, all);
    spb_dev_copy_rows(c, local, 2 * KV, qkv + q_row(c), qkv_row(c), BT, 2 * KV);
    spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
    if (uneven(c)) {
        long counts[SPB_AGKV_MAX_RANKS], displs[SPB_AGKV_MAX_RANKS];
        block_counts(c, counts, displs);
        spb_allgatherv_f32(local, blocks, counts, displs, c->grid->sp_comm, c->phase);
    } else {
        spb_allgather_f32(local, blocks, BT * 2 * KV, c->grid->sp_comm, c->phase);
    }
    spb_timer_end(timed);
    owners_to_sequence(c, zigzag, blocks, seq, 1);
    spb_dev_free(c, local);
    spb_dev_free(c, blocks);
    return seq;
}

/* One query run against the keys it can see: all N, or under a causal
 * mask those up to its last position (the rest would be masked whole). */
static spb_attn_desc run_desc(const spb_attn_ctx *c, const spb_ring_run *q)
{
    long W = q_row(c), KV = kv_row(c), QKV = qkv_row(c), T = c->tokens, N = c->seq_length;
    spb_attn_desc d = {
        .batch = c->batch, .heads = c->heads, .kv_heads = kv_heads_of(c), .head_dim = c->head_dim,
        .q_len = q->len, .k_len = (int)(c->causal ? q->pos + q->len : N),
        .q_offset = q->pos, .k_offset = 0,
        .causal = c->causal, .scale = 1.0f / sqrtf((float)c->head_dim),
        .q_token_stride = QKV, .q_batch_stride = QKV * T,
        .k_token_stride = 2 * KV, .k_batch_stride = 2 * KV * N,
        .o_token_stride = W, .o_batch_stride = W * T,
        /* blocked-sparse pattern (docs/SPARSE.md); no cfg (unit tests): dense */
        .sparse_block = c->cfg ? c->cfg->sparse_block : 0, .sparse_local = c->cfg ? c->cfg->sparse_local_blocks : 0,
        .sparse_global = c->cfg ? c->cfg->sparse_global_blocks : 0,
    };
    return d;
}

static void agkv_forward(const spb_attn_ctx *c, const float *qkv, float *o, float *saved)
{
    SPB_CHECK(c->cfg && c->tokens == owner_tokens(c, c->grid->sp_rank));
    int zigzag = spb_ring_is_zigzag(c->cfg), T = c->tokens;
    long W = q_row(c), KV = kv_row(c), QKV = qkv_row(c), BH = (long)c->batch * c->heads;
    spb_ring_run q_runs[SPB_RING_MAX_RUNS];
    int n_q = spb_ring_layout_runs(zigzag, c->seq_length, c->grid->sp_size, c->grid->sp_rank, q_runs);
    float *kv = gather_kv(c, zigzag, qkv);
    for (int qi = 0; qi < n_q; qi++) {
        const spb_ring_run *q = &q_runs[qi];
        spb_attn_desc d = run_desc(c, q);
        /* the backend writes a run's lse as [B][H][len]; saved is [B][H][T] */
        float *lse = n_q == 1 ? saved : spb_dev_alloc_role(c, SPB_MEM_WORKSPACE, BH * q->len, SPB_BUF_FP32);
        spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
        c->backend->forward(&d, qkv + (long)q->row * QKV, kv, kv + KV, o + (long)q->row * W, lse);
        spb_timer_end(timed);
        *c->flops += 4.0 * d.head_dim * spb_attn_visible_pairs(&d);
        if (lse != saved) {
            spb_dev_copy_rows(c, saved + q->row, T, lse, q->len, BH, q->len);
            spb_dev_free(c, lse);
        }
    }
    spb_dev_free(c, kv);
}

static void agkv_backward(const spb_attn_ctx *c, const float *qkv, const float *o, const float *saved,
                          const float *dout, float *dqkv)
{
    int P = c->grid->sp_size, zigzag = spb_ring_is_zigzag(c->cfg), T = c->tokens;
    long W = q_row(c), KV = kv_row(c), QKV = qkv_row(c), BT = (long)c->batch * T, BH = (long)c->batch * c->heads;
    long seq_floats = (long)c->batch * c->seq_length * 2 * KV;
    spb_ring_run q_runs[SPB_RING_MAX_RUNS];
    int n_q = spb_ring_layout_runs(zigzag, c->seq_length, P, c->grid->sp_rank, q_runs);
    float *kv = gather_kv(c, zigzag, qkv);
    float *dkv = spb_dev_alloc(c, SPB_MEM_WORKSPACE, seq_floats);
    spb_dev_zero(c, dkv, seq_floats); /* the backend accumulates */
    spb_dev_zero(c, dqkv, BT * QKV);
    for (int qi = 0; qi < n_q; qi++) {
        const spb_ring_run *q = &q_runs[qi];
        spb_attn_desc d = run_desc(c, q);
        float *lse = spb_dev_alloc_role(c, SPB_MEM_WORKSPACE, BH * q->len, SPB_BUF_FP32);
        spb_dev_copy_rows(c, lse, q->len, saved + q->row, T, BH, q->len);
        long q_at = (long)q->row * QKV, o_at = (long)q->row * W;
        spb_timer_region timed = spb_timer_begin(SPB_T_ATTENTION);
        c->backend->backward(&d, qkv + q_at, kv, kv + KV, o + o_at, lse, dout + o_at, dqkv + q_at, dkv, dkv + KV);
        spb_timer_end(timed);
        *c->flops += 10.0 * d.head_dim * spb_attn_visible_pairs(&d);
        spb_dev_free(c, lse);
    }
    spb_dev_free(c, kv);
    /* Every rank's contribution to every token's dK/dV, summed at the owner. */
    float *blocks = spb_dev_alloc(c, SPB_MEM_COMM, seq_floats);
    float *own = spb_dev_alloc(c, SPB_MEM_COMM, BT * 2 * KV);
    owners_to_sequence(c, zigzag, blocks, dkv, 0);
    spb_dev_free(c, dkv);
    spb_timer_region timed = spb_timer_begin(SPB_T_EXCHANGE);
    if (uneven(c)) {
        long counts[SPB_AGKV_MAX_RANKS], displs[SPB_AGKV_MAX_RANKS];
        block_counts(c, counts, displs);
        spb_reduce_scatterv_f32(blocks, counts, displs, own, c->grid->sp_comm, c->phase);
    } else {
        spb_reduce_scatter_f32(blocks, own, BT * 2 * KV, c->grid->sp_comm, c->phase);
    }
    spb_timer_end(timed);
    spb_dev_copy_rows(c, dqkv + W, QKV, own, 2 * KV, BT, 2 * KV);
    spb_dev_free(c, blocks);
    spb_dev_free(c, own);
}

/* Bytes per link of one layer, micro-batch of b sequences of N tokens,
 * hidden h = H·D, G K/V heads (G = H without grouped-query attention),
 * T = N/P tokens per rank.  A rank's K/V block holds 2·b·T·G·D floats;
 * the allgather of it records payload P·4·2·b·T·G·D = 8·b·N·G·D bytes and
 * link bytes (P−1)/P of that, and the reduce-scatter of the P blocks of
 * dK/dV the same:
 *   forward:  allgather of K, V                     8·b·N·G·D·(P−1)/P
 *   backward: allgather again + reduce-scatter     16·b·N·G·D·(P−1)/P
 * (G = H: 8·b·N·h·(P−1)/P and 16·b·N·h·(P−1)/P.)  Ring attention's
 * forward moves the same bytes (P−1 hops of a 2·b·T·G·D block) spread over
 * P steps behind compute; here they are one collective that nothing
 * overlaps.  Its backward moves 8·b·T·G·D·(2P−1), about as much as this
 * one's 16·b·N·G·D·(P−1)/P. */
static spb_comm_volume agkv_comm_volume(const spb_config *cfg, int sp_degree)
{
    const int H = cfg->num_heads, G = cfg->num_query_groups > 0 ? cfg->num_query_groups : H;
    const double kv_width = (double)G * (cfg->hidden_size / H); /* G·D floats per token */
    if (sp_degree > 1 && !spb_split_is_even(cfg->seq_length, sp_degree)) {
        /* uneven shares (split.h; zigzag's chunk pairs are ⌊N/P⌋ or ⌈N/P⌉
         * tokens too, strategies/ring.c): rank r's allgather sends its
         * T_r tokens' block to each of the P − 1 others, its reduce-scatter
         * every block but its own, N − T_r tokens; both grow with T_r (P ≥ 2),
         * so the busiest link is the largest share's, T_max = ⌈N/P⌉ (rank
         * 0's when contiguous):
         *   forward  4·2·b·G·D·T_max·(P−1)
         *   backward 4·2·b·G·D·(T_max·(P−1) + N − T_max) */
        const double token = 4.0 * 2.0 * cfg->micro_batch_size * kv_width, P = sp_degree, N = cfg->seq_length;
        const double most = (double)spb_split_max(cfg->seq_length, sp_degree);
        return (spb_comm_volume){.forward_bytes = token * most * (P - 1),
                                 .backward_bytes = token * (most * (P - 1) + N - most)};
    }
    double block_floats = 2.0 * cfg->micro_batch_size * (cfg->seq_length / sp_degree) * kv_width;
    double payload = 4.0 * block_floats * sp_degree;
    double gather = payload * spb_comm_bus_factor(SPB_OP_ALLGATHER, sp_degree);
    double scatter = payload * spb_comm_bus_factor(SPB_OP_REDUCE_SCATTER, sp_degree);
    return (spb_comm_volume){.forward_bytes = gather, .backward_bytes = gather + scatter};
}

const spb_strategy spb_strategy_allgather_kv = {
    .name = "allgather-kv",
    .summary = "Llama 3 context parallelism: K/V all-gathered, queries local, dK/dV reduce-scattered (layout "
               "contiguous or zigzag)",
    .validate = agkv_validate,
    .uneven_tokens = 1, /* through allgatherv / reduce-scatterv, contiguous or zigzag (ring's layout) */
    .local_tokens = spb_ring_local_tokens,
    .local_positions = spb_ring_local_positions,
    .attn_saved_floats = agkv_saved_floats,
    .attention_forward = agkv_forward,
    .attention_backward = agkv_backward,
    .comm_volume = agkv_comm_volume,
};
