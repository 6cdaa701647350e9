/* Attention backends: one interface, several kernels (shared/DESIGN.md,
 * "Attention is a plug-in").  A backend computes causal or full softmax
 * attention for a block of queries against a block of keys and returns the
 * per-row log-sum-exp, so that callers (ring attention) can merge blocks.
 *
 * Layout: Q, K, V, O, dO, dQ, dK, dV are [batch][token][head][head_dim] with
 * an explicit token stride (elements between consecutive tokens of one
 * sequence) and batch stride, so Q/K/V can point straight into a fused QKV
 * buffer [B][T][3][H][D] with no permute.  Head h of token t of sequence b is
 * at  p + b*batch_stride + t*token_stride + h*head_dim.
 * The log-sum-exp is [batch][head][query] contiguous, fp32, natural log, of
 * the *scaled* scores (scale * q.k).
 */
#ifndef SPB_ATTENTION_H
#define SPB_ATTENTION_H

#include <stddef.h>

typedef struct spb_attn_desc {
    int batch;          /* sequences */
    int heads;          /* query heads (kv_heads below) */
    int head_dim;
    int q_len, k_len;   /* rows of this query block, of this key block */
    long q_offset;      /* global position of query row 0 */
    long k_offset;      /* global position of key row 0 */
    int causal;         /* mask key positions > query position */
    float scale;        /* usually 1/sqrt(head_dim) */
    /* strides, in elements */
    long q_token_stride, q_batch_stride;  /* shared by Q and dQ */
    long k_token_stride, k_batch_stride;  /* shared by K and V, dK and dV */
    long o_token_stride, o_batch_stride;  /* shared by O and dO */
    /* Blocked-sparse pattern (docs/SPARSE.md), on GLOBAL positions so that
     * every strategy's blocks see the same mask.  sparse_block = 0: dense.
     * Otherwise, with blk(p) = p / sparse_block, key k is visible to query q
     * iff the dense mask allows it (causal: k <= q) and
     *     |blk(k) - blk(q)| < sparse_local   (a sliding window of blocks;
     *                                         causal: the query's own block
     *                                         and sparse_local - 1 before it)
     *  or blk(k) < sparse_global             (leading "global" key blocks).
     * DeepSpeed's "fixed" block-sparse family (local + global blocks), with
     * a sliding rather than aligned local window and the global blocks at
     * the start (the shape of its BSLongformer configuration); applied per
     * token, no block layout table, no code taken from there.
     * Zero-initialised descriptors are dense. */
    int sparse_block;   /* tokens per block; 0 = dense */
    int sparse_local;   /* window half-width in blocks, own block included (>= 1) */
    int sparse_global;  /* leading key blocks every query sees */
    /* Last, so that positional initialisers stay valid.  K/V heads (grouped-query attention, 0: = heads): query head h reads
     * K/V head h / (heads / kv_heads) (spb_attn_kv_head); K, V, dK, dV hold
     * kv_heads heads per token.  heads must be a multiple of it. */
    int kv_heads;
} spb_attn_desc;

typedef struct spb_attn_backend {
    const char *name;
    /* O = softmax(scale Q K^T [masked]) V, lse = log sum exp of the masked,
     * scaled scores per query row.  Rows with no visible key (possible
     * only with offsets) get O = 0 and lse = -INFINITY. */
    void (*forward)(const spb_attn_desc *d, const float *q, const float *k,
                    const float *v, float *o, float *lse);
    /* Given dO and the final O and lse of these query rows (which may have
     * been merged over several key blocks), ACCUMULATE this key block's
     * contribution into dQ (+=), dK (+=), dV (+=).  Callers zero them first. */
    void (*backward)(const spb_attn_desc *d, const float *q, const float *k,
                     const float *v, const float *o, const float *lse,
                     const float *dout, float *dq, float *dk, float *dv);
} spb_attn_backend;

/* The K/V head query head h reads (consecutive query heads share one). */
static inline int spb_attn_kv_head(const spb_attn_desc *d, int h)
{
    return d->kv_heads > 0 ? h / (d->heads / d->kv_heads) : h;
}
static inline int spb_attn_kv_heads(const spb_attn_desc *d) { return d->kv_heads > 0 ? d->kv_heads : d->heads; }

/* Whether key j of the block is visible to query row i of the block: the
 * per-element definition (the naive backend's mask and the tests' oracle). */
static inline int spb_attn_visible(const spb_attn_desc *d, long i, long j)
{
    long qp = d->q_offset + i, kp = d->k_offset + j;
    if (d->causal && kp > qp) return 0;
    if (d->sparse_block <= 0) return 1;
    long bq = qp / d->sparse_block, bk = kp / d->sparse_block;
    return (bk > bq - d->sparse_local && bk < bq + d->sparse_local) || bk < d->sparse_global;
}

/* Dense part of the mask: keys 0..n-1 of the block (all of them when not
 * causal) may be seen by query row i, before any sparsity. */
static inline int spb_attn_dense_keys(const spb_attn_desc *d, long i)
{
    if (!d->causal) return d->k_len;
    long last = d->q_offset + i - d->k_offset; /* last visible key index */
    if (last < 0) return 0;
    return last >= d->k_len ? d->k_len : (int)(last + 1);
}

static inline long spb_attn_clamp_(long x, long lo, long hi) { return x < lo ? lo : x > hi ? hi : x; }

/* The keys of the block that query row i sees, as at most two disjoint
 * half-open spans of block indices, in increasing order:
 * span[0..1] and span[2..3].  Dense: the prefix [0, dense_keys).  Sparse:
 * [global keys) U [local window), each cut to the dense prefix, merged when
 * they touch.  Returns the number of non-empty spans (0, 1 or 2). */
static inline int spb_attn_row_spans(const spb_attn_desc *d, long i, int span[4])
{
    long dend = spb_attn_dense_keys(d, i);
    span[0] = span[1] = span[2] = span[3] = 0;
    if (d->sparse_block <= 0) {
        span[1] = (int)dend;
        return dend > 0;
    }
    long bs = d->sparse_block, bq = (d->q_offset + i) / bs;
    long ga = spb_attn_clamp_(-d->k_offset, 0, dend);
    long gb = spb_attn_clamp_((long)d->sparse_global * bs - d->k_offset, 0, dend);
    long la = spb_attn_clamp_((bq - d->sparse_local + 1) * bs - d->k_offset, 0, dend);
    long lb = spb_attn_clamp_((bq + d->sparse_local) * bs - d->k_offset, 0, dend);
    int n = 0;
    if (ga < gb && la < lb && gb >= la) { /* touching: one span */
        span[0] = (int)(ga < la ? ga : la);
        span[1] = (int)(gb > lb ? gb : lb);
        return 1;
    }
    if (ga < gb) span[2 * n] = (int)ga, span[2 * n + 1] = (int)gb, n++;
    if (la < lb) span[2 * n] = (int)la, span[2 * n + 1] = (int)lb, n++;
    return n;
}

/* Number of keys of the block that query row i may see.  With a sparse
 * pattern the visible keys are no longer a prefix: see spb_attn_row_spans. */
static inline int spb_attn_visible_keys(const spb_attn_desc *d, long i)
{
    int span[4];
    int n = spb_attn_row_spans(d, i, span);
    int count = 0;
    for (int s = 0; s < n; s++) count += span[2 * s + 1] - span[2 * s];
    return count;
}

/* One past the last key of the block that query row i sees (0 if none).
 * Not monotonic in i under a sparse pattern (the local window moves past the
 * block), so a tile of rows takes the maximum over its rows. */
static inline int spb_attn_key_end(const spb_attn_desc *d, long i)
{
    int span[4];
    int n = spb_attn_row_spans(d, i, span);
    return n ? span[2 * n - 1] : 0;
}

/* Visible (unmasked) query-key pairs of one call, over batch and heads:
 * the counted FLOPs are 4·D per pair forward (QKᵀ, PV) and 10·D backward
 * (flash recomputes the scores: QKᵀ, dV, dP, dQ, dK).  Counts only the
 * pairs the sparse pattern keeps. */
static inline double spb_attn_visible_pairs(const spb_attn_desc *d)
{
    double per_head = 0.0;
    for (long i = 0; i < d->q_len; i++) per_head += spb_attn_visible_keys(d, i);
    return per_head * d->batch * d->heads;
}

/* Elements a [batch][token][head][dim] operand of d spans at its strides
 * (from its first element to one past its last). */
static inline long spb_attn_operand_extent(const spb_attn_desc *d, int tokens, long token_stride, long batch_stride)
{
    if (d->batch <= 0 || tokens <= 0) return 0;
    return (long)(d->batch - 1) * batch_stride + (long)(tokens - 1) * token_stride + (long)d->heads * d->head_dim;
}

/* The same for K and V (and dK, dV): kv_heads heads per token. */
static inline long spb_attn_kv_extent(const spb_attn_desc *d)
{
    if (d->batch <= 0 || d->k_len <= 0) return 0;
    return (long)(d->batch - 1) * d->k_batch_stride + (long)(d->k_len - 1) * d->k_token_stride +
           (long)spb_attn_kv_heads(d) * d->head_dim;
}

extern const spb_attn_backend spb_attn_naive;  /* reference, materialises scores row by row */
extern const spb_attn_backend spb_attn_flash;  /* tiled, online softmax, skips masked blocks */

/* Look up a backend by name ("naive", "flash"); NULL if unknown. */
const spb_attn_backend *spb_attn_backend_by_name(const char *name);

/* Ring attention's merge (common/attention/attention_merge.c): fold one key block's
 * (O_b, lse_b) for query rows [row, row + len) into the running (O, lse).
 * o_acc, o_pair: [batch][T][heads][head_dim]; lse_acc: [batch][heads][T];
 * lse_pair: [batch][heads][len]. */
void spb_attn_merge_rows(float *o_acc, float *lse_acc, const float *o_pair, const float *lse_pair, int batch,
                         int heads, int head_dim, int T, int row, int len);

#endif
