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
    int heads;          /* query heads (= kv heads for now) */
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

/* Keys of the block that query row i may see: always a prefix 0..n-1 of the
 * block (all of it when not causal). */
static inline int spb_attn_visible_keys(const spb_attn_desc *d, long i)
{
    if (!d->causal) return d->k_len;
    long last = d->q_offset + i - d->k_offset; /* last visible key index */
    if (last < 0) return 0;
    return last >= d->k_len ? d->k_len : (int)(last + 1);
}

/* Visible (unmasked) query-key pairs of one call, over batch and heads:
 * the counted FLOPs are 4·D per pair forward (QKᵀ, PV) and 10·D backward
 * (flash recomputes the scores: QKᵀ, dV, dP, dQ, dK). */
static inline double spb_attn_visible_pairs(const spb_attn_desc *d)
{
    double per_head = 0.0;
    for (long i = 0; i < d->q_len; i++) per_head += spb_attn_visible_keys(d, i);
    return per_head * d->batch * d->heads;
}

extern const spb_attn_backend spb_attn_naive;  /* reference, materialises scores row by row */
extern const spb_attn_backend spb_attn_flash;  /* tiled, online softmax, skips masked blocks */

/* Look up a backend by name ("naive", "flash"); NULL if unknown. */
const spb_attn_backend *spb_attn_backend_by_name(const char *name);

#endif
