/* `hybrid`: Ulysses inside groups, ring attention across them (yunchang's
 * USP, Fang and Zhao 2024, arXiv 2405.07719; Megatron-LM's hierarchical
 * a2a+p2p context parallelism).
 *
 * The SP group of P ranks is split by the grid into R = P/U Ulysses groups
 * of U contiguous ranks (one node's GPUs on a cluster: the all-to-all stays
 * on the fast links) and U ring groups of the R ranks at the same place in
 * each Ulysses group (the ring's point-to-point crosses nodes).  Ulysses
 * group g holds ring block g of N/R tokens, laid out over the R blocks as
 * ring attention lays them out (contiguous, or zigzag: chunks g and 2R−1−g
 * of N/(2R)); inside the group, rank u holds rows [u·T, (u+1)·T) of that
 * block, T = N/P.  With P ∤ N (or 2R ∤ N for zigzag) the shares nest:
 * block g is the ring layout's share g over R (split.h's share g of N, or
 * zigzag's chunks g and 2R−1−g of split.h's shares over 2R), rank u's
 * rows its share u of that block over U (hybrid_local_tokens).
 *
 * A layer's attention is Ulysses' exchange over the Ulysses group (U head
 * blocks of all H heads of T tokens -> H/U heads of the group's N/R
 * tokens) with ring attention over the ring group on its head side: ranks
 * with the same u hold the same H/U heads, so their ring is plain ring
 * attention on blocks of N/R tokens.  Both pieces are the ones `ulysses`
 * and `ring` run (strategies/sp_parts.h).  U = P is Ulysses (R = 1: no ring
 * step), U = 1 is ring (the all-to-all over one rank moves nothing).
 * Heads need not divide by P, only by U: the point of the hybrid; and
 * without grouped-query attention not even by U (uneven head groups of
 * split.h, as plain Ulysses: rank u attends ⌈H/U⌉ or ⌊H/U⌋ heads, and so
 * does its whole ring group).
 *
 * Grouped-query attention (G K/V heads): the Ulysses part treats them as
 * `ulysses` does over its U ranks (G >= U: G/U K/V heads per rank; G < U:
 * the one K/V head a rank's query heads read, replicated on U/G ranks of
 * the group, the replicas' gradients adding in the core's QKV product),
 * and the ring part moves only the head side's K/V heads. */
#include <stdio.h>
#include <string.h>

#include "checks.h"
#include "sp_parts.h"
#include "split.h"
#include "strategy.h"

static int ulysses_degree(const spb_config *cfg) { return cfg->ulysses_degree > 0 ? cfg->ulysses_degree : cfg->sp_degree; }

static spb_rank_group ulysses_group(const spb_grid *g)
{
    return (spb_rank_group){g->ulysses_comm, g->ulysses_size, g->ulysses_rank};
}

static spb_rank_group ring_group(const spb_grid *g) { return (spb_rank_group){g->ring_comm, g->ring_size, g->ring_rank}; }

static int hybrid_validate(const spb_config *cfg, int world_size, char *err, size_t errlen)
{
    (void)world_size;
    int P = cfg->sp_degree, U = ulysses_degree(cfg);
    if (P % U) {
        snprintf(err, errlen, "--ulysses-degree %d does not divide --sp-degree %d (hybrid: P = U x R)", U, P);
        return -1;
    }
    int H = cfg->num_heads, G = cfg->num_query_groups > 0 ? cfg->num_query_groups : H;
    int uneven_heads = H % U != 0;
    if (uneven_heads) {
        /* uneven head groups inside the Ulysses groups, as plain Ulysses
         * takes them (strategies/ulysses.c): rank u attends split.h's share
         * u of the H heads; its ring group (same u) holds the same heads */
        if (H < U) {
            snprintf(err, errlen, "--num-attention-heads %d is not divisible by --ulysses-degree %d and fewer: "
                                  "hybrid gives every rank of a Ulysses group at least one head", H, U);
            return -1;
        }
        if (G != H) {
            snprintf(err, errlen, "--num-attention-heads %d not divisible by --ulysses-degree %d with "
                                  "--num-query-groups %d: uneven head groups take K/V heads = query heads (no "
                                  "grouped-query attention)", H, U, G);
            return -1;
        }
    } else if (G >= U ? G % U : U % G) {
        snprintf(err, errlen,
                 "--num-query-groups %d and --ulysses-degree %d: hybrid needs G divisible by U (K/V heads split like "
                 "query heads) or U divisible by G (each K/V head replicated on U/G ranks of a Ulysses group)", G, U);
        return -1;
    }
    if (cfg->seq_length % P || uneven_heads) {
        /* uneven shares: the Ulysses exchange with per-rank counts and the
         * ring's owner-sized blocks (strategies/ulysses.c, ring.c) */
        char what[96];
        if (uneven_heads)
            snprintf(what, sizeof what, "--num-attention-heads %d not divisible by --ulysses-degree %d", H, U);
        else
            snprintf(what, sizeof what, "--seq-length %d not divisible by --sp-degree %d", cfg->seq_length, P);
        const char *option = cfg->ulysses_overlap > 1 ? "--ulysses-overlap (its shaped blocks are equal)"
                             : !strcmp(cfg->ulysses_comm, "allgather") ? "--ulysses-comm allgather (it gathers equal blocks)"
                                                                        : NULL;
        if (option) {
            snprintf(err, errlen, "hybrid with %s: not with %s", what, option);
            return -1;
        }
    } else if (spb_ulysses_validate_overlap(cfg, U, err, errlen)) {
        return -1;
    }
    return 0;
}

/* Ring block g is the ring layout's share g over the R groups (contiguous:
 * split.h's share g of N; zigzag: chunks g and 2R−1−g of split.h's shares
 * over 2R), and rank u of the group holds split.h's share u of that block
 * over the U ranks (what the Ulysses exchange stitches together).  Equal
 * shares: N/P. */
static long group_tokens(const spb_grid *grid, const spb_config *cfg)
{
    return spb_ring_owner_tokens(spb_ring_is_zigzag(cfg), cfg->seq_length, grid->ring_size, grid->ring_rank);
}

static int hybrid_local_tokens(const spb_grid *grid, const spb_config *cfg)
{
    return (int)spb_split_count(group_tokens(grid, cfg), grid->ulysses_size, grid->ulysses_rank);
}

/* This rank's rows of ring block g under the ring layout over R blocks. */
static void hybrid_local_positions(const spb_grid *grid, const spb_config *cfg, long *positions)
{
    SPB_CHECK(grid->ulysses_size == ulysses_degree(cfg));
    spb_ring_run runs[SPB_RING_MAX_RUNS];
    int n = spb_ring_layout_runs(spb_ring_is_zigzag(cfg), cfg->seq_length, grid->ring_size, grid->ring_rank, runs);
    long block = group_tokens(grid, cfg);
    int T = hybrid_local_tokens(grid, cfg), first = (int)spb_split_offset(block, grid->ulysses_size, grid->ulysses_rank);
    for (int t = 0; t < T; t++) {
        int row = first + t, k = 0;
        while (k < n - 1 && row >= runs[k].row + runs[k].len) k++;
        positions[t] = runs[k].pos + (row - runs[k].row);
    }
}

static int hybrid_head_blocks(const spb_grid *grid) { return grid->ulysses_size; }

static size_t hybrid_saved_floats(const spb_attn_ctx *c)
{
    /* Ulysses' head-side Q, K, V, O and the log-sum-exp [B][H/U][N/R],
     * which is what ring attention keeps on that side. */
    return spb_ulysses_saved_floats(c, ulysses_group(c->grid));
}

/* The head side: ring attention over the ring group. */
static void ring_side_forward(const spb_attn_ctx *h, const float *qkv, float *o, float *lse)
{
    spb_ring_attention_forward(h, ring_group(h->grid), qkv, o, lse);
}

static void ring_side_backward(const spb_attn_ctx *h, const float *qkv, const float *o, const float *lse,
                               const float *dout, float *dqkv)
{
    spb_ring_attention_backward(h, ring_group(h->grid), qkv, o, lse, dout, dqkv);
}

static const spb_head_side ring_side = {ring_side_forward, ring_side_backward};

static void hybrid_forward(const spb_attn_ctx *c, const float *qkv, float *o, float *saved)
{
    /* the grid was built with this run's U (spb_grid_create_nested) */
    SPB_CHECK(c->cfg && c->grid->ulysses_size == ulysses_degree(c->cfg));
    spb_ulysses_forward(c, ulysses_group(c->grid), &ring_side, qkv, o, saved);
}

static void hybrid_backward(const spb_attn_ctx *c, const float *qkv, const float *o, const float *saved,
                            const float *dout, float *dqkv)
{
    (void)qkv, (void)o; /* the head-side copies in `saved` are what attention saw */
    spb_ulysses_backward(c, ulysses_group(c->grid), &ring_side, saved, dout, dqkv);
}

/* Bytes per link of one layer, micro-batch of b sequences of N tokens,
 * hidden h = H·D, P = U·R ranks, T = N/P tokens per rank, G K/V heads
 * (G = H without grouped-query attention) and Gu = max(G, U) K/V heads in
 * a rank's U head blocks (G < U: one replica per block).
 *   Ulysses part, over U ranks: an all-to-all whose per-rank buffer holds
 *     S floats records payload 4·S and link bytes 4·S·(U−1)/U;
 *     forward  QKV (S = b·T·(H + 2·Gu)·D) then O (S = b·T·h),
 *     backward dO  (S = b·T·h)   then dQKV (S = b·T·(H + 2·Gu)·D):
 *     with G = H each direction is 16·b·T·h·(U−1)/U = 16·b·N·h·(U−1)/(U·P).
 *     (--ulysses-comm allgather: payload U·4·S each, U times that.)
 *   Ring part, over R ranks on the head side: a block is K and V of the
 *     group's N/R = U·T tokens for the head side's Gu/U K/V heads,
 *     2·b·U·T·(Gu/U)·D = 2·b·T·Gu·D floats (G = H: 2·b·T·h, plain ring's
 *     block at degree P); forward R−1 hops, backward R−1 K/V hops, R−1
 *     dK/dV hops and the home run:
 *     forward 8·b·T·Gu·D·(R−1), backward 8·b·T·Gu·D·(2R−1) bytes (R = 1: 0).
 * U = P gives Ulysses' formula, U = 1 ring's (Gu = G).  Summed here in the
 * order the accounting layer's tests add them (all-to-alls, then sendrecvs). */
void spb_hybrid_volume_parts(const spb_config *cfg, int sp_degree, double *exchange_payload, double *ring_block)
{
    int U = cfg->ulysses_degree > 0 ? cfg->ulysses_degree : sp_degree;
    const int H = cfg->num_heads, D = cfg->hidden_size / H;
    const int G = cfg->num_query_groups > 0 ? cfg->num_query_groups : H, Gu = G > U ? G : U;
    double local_tokens = (double)cfg->micro_batch_size * (cfg->seq_length / sp_degree);
    double local_floats = local_tokens * cfg->hidden_size;
    int gather = !strcmp(cfg->ulysses_comm, "allgather");
    double qkv_payload = 4.0 * local_tokens * (double)(H + 2 * Gu) * D * (gather ? U : 1);
    double o_payload = 4.0 * local_floats * (gather ? U : 1);
    *exchange_payload = qkv_payload + o_payload;
    *ring_block = 4.0 * 2.0 * local_tokens * (double)Gu * D;
}

/* Uneven shares (P ∤ N, contiguous or zigzag) or uneven heads (U ∤ H,
 * no GQA there): group g holds N_g tokens, the ring layout's share g over
 * R (split.h's share g of N, or zigzag's chunks g and 2R−1−g of N over
 * 2R), its rank u T = split.h's share u of N_g over U, and attends H_u
 * heads (split.h's share u of H over U; H/U when U | H).  Per token, the
 * Q/K/V block bound for rank j carries q_j floats and the O block o_j:
 * q_j = (H + 2·Gu)·D/U and o_j = h/U when the heads divide, else
 * q_j = 3·H_j·D and o_j = H_j·D; the head side's K/V block k_u = 2·Gu/U·D
 * floats per token (2·H_u·D under uneven heads).  With Σq = Σ_j q_j and
 * Σo = Σ_j o_j, rank (g, u) sends, as ulysses' and ring's uneven
 * formulas over U and R ranks:
 *   Ulysses part  forward  4·b·[T·(Σq − q_u) + (N_g − T)·o_u]
 *                 backward 4·b·[T·(Σo − o_u) + (N_g − T)·q_u]
 *   ring part     forward  4·b·k_u·(N − N_{g+1}),  backward 4·b·k_u·(2N − N_{g+1})
 * (N_{g+1}: the next group's block, g+1 mod R; no ring part when R = 1).
 * (spb_hybrid_uneven_rank_bytes: rank (g, u)'s parts).  Which rank is
 * busiest depends on both parts, so hybrid_uneven_volume evaluates every
 * rank and returns each phase's largest; with P | N and U | H every rank
 * sends the even formula's bytes. */
spb_hybrid_rank_bytes spb_hybrid_uneven_rank_bytes(const spb_config *cfg, int P, int g, int u)
{
    const int U = cfg->ulysses_degree > 0 ? cfg->ulysses_degree : P, R = P / U, H = cfg->num_heads,
              D = cfg->hidden_size / H, zigzag = spb_ring_is_zigzag(cfg);
    const int G = cfg->num_query_groups > 0 ? cfg->num_query_groups : H, Gu = G > U ? G : U;
    const int uneven_heads = H % U != 0;
    const double b = cfg->micro_batch_size, N = cfg->seq_length;
    double all_q = 0, all_o = 0;
    for (int j = 0; j < U; j++) {
        all_q += uneven_heads ? 3.0 * D * spb_split_count(H, U, j) : (double)(H + 2 * Gu) * D / U;
        all_o += uneven_heads ? (double)D * spb_split_count(H, U, j) : (double)cfg->hidden_size / U;
    }
    const double Ng = (double)spb_ring_owner_tokens(zigzag, cfg->seq_length, R, g);
    const double next = (double)spb_ring_owner_tokens(zigzag, cfg->seq_length, R, (g + 1) % R);
    const double T = (double)spb_split_count((long)Ng, U, u), Hu = (double)spb_split_count(H, U, u);
    const double q = uneven_heads ? 3.0 * Hu * D : (double)(H + 2 * Gu) * D / U;
    const double o = uneven_heads ? Hu * D : (double)cfg->hidden_size / U;
    const double k = uneven_heads ? 2.0 * Hu * D : 2.0 * (Gu / U) * D;
    spb_hybrid_rank_bytes r;
    r.exchange_link[0] = 4.0 * b * (T * (all_q - q) + (Ng - T) * o);
    r.exchange_link[1] = 4.0 * b * (T * (all_o - o) + (Ng - T) * q);
    /* payload: forward Q/K/V blocks of its T tokens to all U (q_j to rank j),
     * then O of every group rank's tokens for its heads (o_u each); backward
     * the reverse */
    r.exchange_payload[0] = 4.0 * b * (T * all_q + Ng * o);
    r.exchange_payload[1] = 4.0 * b * (T * all_o + Ng * q);
    r.ring[0] = R > 1 ? 4.0 * b * k * (N - next) : 0.0;
    r.ring[1] = R > 1 ? 4.0 * b * k * (2.0 * N - next) : 0.0;
    return r;
}

static spb_comm_volume hybrid_uneven_volume(const spb_config *cfg, int P, int U)
{
    const int R = P / U;
    spb_comm_volume v = {0, 0};
    for (int g = 0; g < R; g++)
        for (int u = 0; u < U; u++) {
            spb_hybrid_rank_bytes r = spb_hybrid_uneven_rank_bytes(cfg, P, g, u);
            double fwd = r.exchange_link[0] + r.ring[0], bwd = r.exchange_link[1] + r.ring[1];
            v.forward_bytes = fwd > v.forward_bytes ? fwd : v.forward_bytes;
            v.backward_bytes = bwd > v.backward_bytes ? bwd : v.backward_bytes;
        }
    return v;
}

static spb_comm_volume hybrid_comm_volume(const spb_config *cfg, int sp_degree)
{
    int U = cfg->ulysses_degree > 0 ? cfg->ulysses_degree : sp_degree, R = sp_degree / U;
    if (sp_degree > 1 && (!spb_split_is_even(cfg->seq_length, sp_degree) || cfg->num_heads % U))
        return hybrid_uneven_volume(cfg, sp_degree, U);
    double payload, block_bytes;
    spb_hybrid_volume_parts(cfg, sp_degree, &payload, &block_bytes);
    double share = spb_comm_bus_factor(!strcmp(cfg->ulysses_comm, "allgather") ? SPB_OP_ALLGATHER : SPB_OP_ALLTOALL, U);
    spb_comm_volume v;
    v.forward_bytes = payload * share;
    v.backward_bytes = payload * share;
    if (R > 1) {
        v.forward_bytes += (R - 1) * block_bytes;
        v.backward_bytes += (2.0 * R - 1) * block_bytes;
    }
    return v;
}

const spb_strategy spb_strategy_hybrid = {
    .name = "hybrid",
    .summary = "Ulysses x ring (USP): all-to-all inside groups of --ulysses-degree U ranks, ring attention across the "
               "P/U groups",
    .validate = hybrid_validate,
    .uneven_tokens = 1, /* nested shares: the ring layout's over the R groups, then each group's over U */
    .head_blocks = hybrid_head_blocks,
    .local_tokens = hybrid_local_tokens,
    .local_positions = hybrid_local_positions,
    .attn_saved_floats = hybrid_saved_floats,
    .attention_forward = hybrid_forward,
    .attention_backward = hybrid_backward,
    .comm_volume = hybrid_comm_volume,
};
