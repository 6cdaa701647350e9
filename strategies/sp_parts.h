/* Pieces of the sequence-parallel strategies that compose: Ulysses' head
 * exchange around any attention on the head side (ulysses.c), ring
 * attention over any group of ranks (ring.c), and the token layouts of a
 * ring (contiguous, zigzag).  The hybrid strategy (hybrid.c) is Ulysses
 * over the grid's Ulysses groups with ring attention over its ring groups
 * on the head side; plain Ulysses and ring are the same pieces over the
 * whole SP group. */
#ifndef SPB_STRATEGIES_SP_PARTS_H
#define SPB_STRATEGIES_SP_PARTS_H

#include "strategy.h"

/* A group of ranks one piece runs over: its communicator, size and this
 * rank's place in it. */
typedef struct spb_rank_group {
    MPI_Comm comm;
    int size, rank;
} spb_rank_group;

static inline spb_rank_group spb_sp_group(const spb_grid *g)
{
    return (spb_rank_group){g->sp_comm, g->sp_size, g->sp_rank};
}

/* ---- ring layouts (ring.c) ---- */
enum { SPB_RING_MAX_RUNS = 2 };

/* Rows [row, row + len) of a block sit at global positions [pos, pos + len). */
typedef struct spb_ring_run {
    int row, len;
    long pos;
} spb_ring_run;

/* The runs of `owner`'s block among `size` owners: contiguous (one run,
 * split.h's share owner of seq_length over size) or zigzag (chunks owner
 * and 2·size−1−owner of split.h's shares over 2·size; an empty chunk gives
 * no run); returns how many. */
int spb_ring_layout_runs(int zigzag, long seq_length, int size, int owner, spb_ring_run runs[SPB_RING_MAX_RUNS]);
/* Tokens of owner's block (its runs' lengths), and the largest over owners
 * (⌈seq_length / size⌉ in both layouts; not always owner 0's for zigzag). */
long spb_ring_owner_tokens(int zigzag, long seq_length, int size, int owner);
long spb_ring_max_tokens(int zigzag, long seq_length, int size);
int spb_ring_is_zigzag(const spb_config *cfg);
/* ring's token counts and positions, shared by the strategies that lay
 * tokens out as ring does (allgather-kv) */
int spb_ring_local_tokens(const spb_grid *grid, const spb_config *cfg);
void spb_ring_local_positions(const spb_grid *grid, const spb_config *cfg, long *positions);

/* Ring attention of the ctx's tokens (a [B][tokens][heads + 2·kv][D] block:
 * Q, then the kv = ctx kv_heads K and V heads (0: heads), tokens = the
 * group rank's spb_ring_owner_tokens, laid out by cfg->ring_layout) with the
 * blocks of the other ranks of `group`: o [B][tokens][heads][D] and the
 * log-sum-exp [B][heads][tokens]; backward overwrites dqkv. */
void spb_ring_attention_forward(const spb_attn_ctx *c, spb_rank_group group, const float *qkv, float *o, float *lse);
void spb_ring_attention_backward(const spb_attn_ctx *c, spb_rank_group group, const float *qkv, const float *o,
                                 const float *lse, const float *dout, float *dqkv);

/* ---- Ulysses' head exchange (ulysses.c) ---- */
/* Attention on the head side of the exchange: `head` describes the
 * [B][tokens][heads + 2·kv_heads][D] buffer the exchange built (tokens: the
 * U local blocks of the group, heads: H/U query heads, kv_heads: the K/V
 * heads they read, max(G, U)/U; cfg, grid, backend, device, causal,
 * phase and flops as the caller's).  Forward writes o and the log-sum-exp
 * [B][heads][tokens]; backward overwrites dqkv. */
typedef struct spb_head_side {
    void (*forward)(const spb_attn_ctx *head, const float *qkv, float *o, float *lse);
    void (*backward)(const spb_attn_ctx *head, const float *qkv, const float *o, const float *lse, const float *dout,
                     float *dqkv);
} spb_head_side;

/* Ulysses over `group` (U ranks; the core hands qkv and takes o in U head
 * blocks): all-to-all to the head side, `inner` there, all-to-all back.
 * saved: spb_ulysses_saved_floats floats. */
size_t spb_ulysses_saved_floats(const spb_attn_ctx *c, spb_rank_group group);
void spb_ulysses_forward(const spb_attn_ctx *c, spb_rank_group group, const spb_head_side *inner, const float *qkv,
                         float *o, float *saved);
void spb_ulysses_backward(const spb_attn_ctx *c, spb_rank_group group, const spb_head_side *inner, const float *saved,
                          const float *dout, float *dqkv);

/* --ulysses-overlap K against an exchange over group_size ranks: K must
 * divide the H/group_size heads of a rank; 0 or -1 with a message. */
int spb_ulysses_validate_overlap(const spb_config *cfg, int group_size, char *err, size_t errlen);

#endif
