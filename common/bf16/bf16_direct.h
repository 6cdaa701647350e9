/* The 16-bit tables' direct path (--bf16-kernels fast; bf16 and fp16 runs,
 * 16-bit storage in the process's format): matrix products,
 * attention, GELU, LayerNorm, residual adds, the softmax cross-entropy,
 * fills, copies and AdamW computed straight from their
 * storage (bf16, or fp32 where a buffer is), with no fp32 frame around
 * them; and the embedding, whose frames would widen the whole token table
 * (and its gradient) every step.  On the GPU that is what makes mixed precision fast: cuBLASLt
 * products on tensor cores (bf16 in, fp32 accumulate, rounded once), the
 * bf16 flash-attention and GELU kernels, and LayerNorm, residual and
 * cross-entropy, bias-row and merge kernels that read and write each operand
 * in its own type (common/cuda/cuda_bf16_direct.cu).  The frame path
 * (bf16_ops.c: widen every operand, run the fp32 table, round once) is the
 * reference beside it (--bf16-kernels reference).
 *
 * Both paths compute the same thing: every output is computed in fp32 from
 * the stored operands and rounded once to its buffer's type, so they differ
 * only by the order of fp32 additions (at most an ulp of the stored result,
 * now and then).
 *
 * Dispatch (bf16_direct.c) takes an operation direct only when each operand
 * is one contiguous run of one handle in one storage type, no output
 * carries fp32 masters, no output overlaps an input (elementwise outputs
 * may be exactly their input) and the kernel supports the shape; otherwise the frame path runs it.  Counters
 * say which path each call took, so tests can show that a run of the core
 * went direct where the device would.
 *
 * An instance supplies the kernels on its storage: the CPU emulation
 * (bf16_direct_cpu.c, the contracts below computed with cblas, the CPU
 * flash kernel and ops_cpu.c on exact fp32 copies, so the dispatch is
 * tested without a GPU) or the CUDA one. */
#ifndef SPB_BF16_DIRECT_H
#define SPB_BF16_DIRECT_H

#include "attention.h"
#include "config.h"
#include "device_handles.h"

/* An operand's storage and its element type (bf16 or fp32): LayerNorm and
 * residual operands are of either, buffer by buffer. */
typedef struct spb_stored {
    void *p;
    spb_dtype type;
} spb_stored;

typedef struct spb_bf16_direct {
    const char *name;
    /* Row-major C[m][n] = op(A)[m][k] op(B)[k][n] + beta C, beta 0 or 1;
     * A and B bf16 storage, C bf16 or fp32 storage (c_type); the sum in
     * fp32, C rounded once.  op(A) = A, or Aᵀ when transA (A stored [k][m]). */
    void (*gemm)(int transA, int transB, int m, int n, int k, const spb_bf16 *A, int lda, const spb_bf16 *B, int ldb,
                 float beta, void *C, spb_dtype c_type, int ldc);
    /* C[r][j] = b[j] for r < rows, j < n (b bf16 storage, so exact in C). */
    void (*broadcast_rows)(void *C, spb_dtype c_type, int ldc, const spb_bf16 *b, int rows, int n);
    /* ops.h's tanh GELU on bf16 storage, each output rounded once; out may
     * be inp, dinp may be dout (elementwise: each element is read before
     * it is written). */
    void (*gelu_forward)(spb_bf16 *out, const spb_bf16 *inp, long n);
    void (*gelu_backward)(spb_bf16 *dinp, const spb_bf16 *inp, const spb_bf16 *dout, long n);
    /* ops.h's LayerNorm, each output rounded once into its type (mean and
     * rstd fp32); backward adds into dinp, dw and db (dinp may be dout). */
    void (*layernorm_forward)(spb_stored out, float *mean, float *rstd, spb_stored inp, spb_stored w, spb_stored b,
                              int rows, int C);
    void (*layernorm_backward)(spb_stored dinp, spb_stored dw, spb_stored db, spb_stored dout, spb_stored inp,
                               spb_stored w, const float *mean, const float *rstd, int rows, int C);
    /* a += b, rounded once into a's type (a may be b). */
    void (*add_inplace)(spb_stored a, spb_stored b, long n);
    /* Memory operations between operands of either type: rows of `width`
     * elements from src (row stride src_stride) to dst (dst_stride), each
     * value rounded once into dst's type; x[0, n) = value, rounded once. */
    void (*copy_rows)(spb_stored dst, long dst_stride, spb_stored src, long src_stride, long rows, long width);
    void (*fill)(spb_stored x, long n, float value);
    /* optimizer.h's AdamW on the fp32 masters (storage-side, updated in
     * place) with grad, m, v of either type; p, the stored parameters,
     * gets each master rounded once.  And spb_sum_squares in double. */
    void (*adamw_apply)(float *masters, spb_stored p, spb_stored grad, spb_stored m, spb_stored v, long n,
                        float grad_scale, float weight_decay, const spb_config *cfg, long step, double lr);
    double (*sum_squares)(spb_stored x, long n);
    /* ops.h's softmax cross-entropy in place on logits of either type (targets:
     * int32 storage): returns the sum over rows, in row order, of the loss
     * from the fp32 logits; the probabilities rounded once.  Backward:
     * probs = scale (probs - onehot), rounded once. */
    double (*softmax_xent_forward)(spb_stored probs, const int *targets, int rows, int V);
    /* ops.h's embedding on storage: out[r] = wte[tokens[r]] + wpe[positions[r % T]], the two 16-bit rows
     * summed in fp32 and rounded once into out's type (tokens: int32 storage; positions: host memory). */
    void (*embedding_forward)(spb_stored out, const int *tokens, const spb_bf16 *wte, const spb_bf16 *wpe,
                              const long *positions, int rows, int T, int C);
    /* Its backward, one table at a time: table row keys[g] (C wide) gets, in fp32 from its stored
     * value, dout's rows order[starts[g]], ..., order[starts[g + 1] - 1] in that order, and is rounded
     * once into its type: the frames' sums in the frames' order (row order), so bit for bit theirs.
     * keys, starts (groups + 1 of them) and order: host memory. */
    void (*embedding_backward_rows)(spb_stored table, spb_stored dout, int C, int groups, const int *keys,
                                    const int *starts, const int *order);
    void (*softmax_xent_backward)(spb_stored probs, const int *targets, int rows, int V, float scale);
    /* The row biases of the products whose outputs are reduced (backend.h): x[r][j] += b[j] for r < rows,
     * j < C, in fp32 from the stored values, rounded once into x's type (the frames' result bit for bit);
     * db += the column sums of dy, in fp32 from db's stored value, rounded once (the order of the sums is
     * the instance's: the CPU's row by row, as the frames; the GPU's in strips of rows). */
    void (*add_bias_rows)(spb_stored x, spb_stored b, long rows, int C);
    void (*bias_grad_rows)(spb_stored db, spb_stored dy, long rows, int C);
    /* attention.h's spb_attn_merge_rows (ring attention) with O of either type: each element of o_acc
     * computed in fp32 from the stored values and rounded once into its type; the log-sum-exps fp32. */
    void (*attn_merge)(spb_stored o_acc, float *lse_acc, spb_stored o_pair, const float *lse_pair, int batch,
                       int heads, int head_dim, int T, int row, int len);
    /* attention.h's contracts on storage: q k v o dout bf16, lse fp32, o
     * rounded once; dq dk dv fp32 (the frame's copies), accumulated. */
    void (*attention_forward)(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                              spb_bf16 *o, float *lse);
    void (*attention_backward)(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                               const spb_bf16 *o, const float *lse, const spb_bf16 *dout, float *dq, float *dk,
                               float *dv);
    /* Optional (NULL where the instance has none): cuDNN's fused attention
     * (--attention cudnn) on the same contracts; 0 when it ran, -1 when it
     * could not take the call (then nothing was written and the caller
     * takes the frames). */
    int (*cudnn_attention_forward)(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                   spb_bf16 *o, float *lse);
    int (*cudnn_attention_backward)(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                    const spb_bf16 *o, const float *lse, const spb_bf16 *dout, float *dq, float *dk,
                                    float *dv);
} spb_bf16_direct;

/* Kinds of call the direct path takes (--bf16-direct, default all): a
 * first GPU run that fails under fast can turn them on one at a time and
 * tell which kernel is wrong. */
enum {
    SPB_DIRECT_PRODUCTS = 1 << 0,
    SPB_DIRECT_ATTENTION = 1 << 1,
    SPB_DIRECT_GELU = 1 << 2,
    SPB_DIRECT_LAYERNORM = 1 << 3,
    SPB_DIRECT_RESIDUAL = 1 << 4,
    SPB_DIRECT_CROSS_ENTROPY = 1 << 5,
    SPB_DIRECT_MEMORY = 1 << 6,    /* fill, zero, copy, copy_rows */
    SPB_DIRECT_OPTIMIZER = 1 << 7, /* AdamW, sums of squares */
    SPB_DIRECT_EMBEDDING = 1 << 8, /* the token and position tables, both ways */
    SPB_DIRECT_BIAS = 1 << 9,      /* the row biases: added forward, summed backward */
    SPB_DIRECT_MERGE = 1 << 10,    /* ring attention's log-sum-exp merges */
    SPB_DIRECT_ALL = (1 << 11) - 1,
};
/* "all", "none" or a comma-separated list of products, attention, gelu,
 * layernorm, residual, cross-entropy, memory, optimizer, embedding, bias, merge: the mask, or -1
 * with a message naming the unknown word. */
int spb_bf16_direct_parse_kinds(const char *list, char *err, size_t errlen);
void spb_bf16_direct_set_kinds(int mask);

/* The kernels of the instance in use, or NULL: every operation through the
 * frames (the default). */
void spb_bf16_use_direct(const spb_bf16_direct *direct);
const spb_bf16_direct *spb_bf16_direct_in_use(void);
extern const spb_bf16_direct spb_bf16_direct_cpu;

/* The shapes the device's flash kernel takes (spb_cuda.h, bf16 or fp16):
 * head dim 64 or 128, dense masks (no blocked-sparse pattern).  Every instance applies it,
 * so a CPU run falls back exactly where a GPU run would. */
int spb_bf16_direct_attention_supported(const spb_attn_desc *d);

/* Dispatch: 1 when the call ran direct, 0 when the caller must run it
 * through the frames (nothing was touched then). */
int spb_bf16_direct_matmul_forward(float *out, int ldo, const float *inp, int ldi, const float *W, int ldw,
                                   const float *b, int rows, int in, int out_f, int accumulate);
int spb_bf16_direct_matmul_backward(float *dinp, int lddi, float *dW, int lddw, float *db, const float *dout, int ldo,
                                    const float *inp, int ldi, const float *W, int ldw, int rows, int in, int out_f,
                                    int accumulate_dinp);
int spb_bf16_direct_gelu_forward(float *out, const float *inp, long n);
int spb_bf16_direct_gelu_backward(float *dinp, const float *inp, const float *dout, long n);
int spb_bf16_direct_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                      const float *b, int rows, int C);
int spb_bf16_direct_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                       const float *w, const float *mean, const float *rstd, int rows, int C);
int spb_bf16_direct_add_inplace(float *a, const float *b, long n);
/* Whole-buffer operations: fill (zero), copy, copy_rows.  Outputs carrying
 * masters stay on the frames (a write there moves the masters it changes). */
int spb_bf16_direct_fill(float *x, long n, float value);
int spb_bf16_direct_copy_rows(float *dst, long dst_stride, const float *src, long src_stride, long rows, long width);
/* AdamW where the parameters' masters are known (bf16_table.c binds them);
 * the sum of squares into *sum. */
int spb_bf16_direct_adamw(float *masters, float *p, const float *grad, float *m, float *v, long n, float grad_scale,
                          float weight_decay, const spb_config *cfg, long step, double lr);
int spb_bf16_direct_sum_squares(const float *x, long n, double *sum);
/* The embedding (tokens: int32 storage, as the frames take them; positions: host memory). */
int spb_bf16_direct_embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                                      const long *positions, int rows, int T, int C);
int spb_bf16_direct_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                                       const long *positions, int rows, int T, int C);
/* The backward's grouping: rows by the table row key[r] (0 <= key < reach)
 * they add into, each group in row order (a stable counting sort on the
 * host): embedding_backward_rows' keys, starts and order. */
typedef struct spb_row_groups {
    int groups, *keys, *starts, *order;
} spb_row_groups;
spb_row_groups spb_row_groups_of(const int *key, int rows, long reach);
void spb_row_groups_free(spb_row_groups *g);
/* The row biases (x and db: outputs; b and dy: inputs of either type) and ring's merge. */
int spb_bf16_direct_add_bias_rows(float *x, const float *b, long rows, int C);
int spb_bf16_direct_bias_grad_rows(float *db, const float *dy, long rows, int C);
int spb_bf16_direct_attn_merge(float *o_acc, float *lse_acc, const float *o_pair, const float *lse_pair, int batch,
                               int heads, int head_dim, int T, int row, int len);
/* *loss: the forward's return value, when it ran direct. */
int spb_bf16_direct_softmax_xent_forward(float *probs, const int *targets, int rows, int V, double *loss);
int spb_bf16_direct_softmax_xent_backward(float *probs, const int *targets, int rows, int V, float scale);
/* Attention on the direct kernels: the flash kernel, or cuDNN's entries
 * (--attention cudnn), which may decline a call. */
typedef enum spb_direct_attention { SPB_DIRECT_FLASH = 0, SPB_DIRECT_CUDNN } spb_direct_attention;
int spb_bf16_direct_attention_forward(spb_direct_attention kernel, const spb_attn_desc *d, const float *q,
                                      const float *k, const float *v, float *o, float *lse);
int spb_bf16_direct_attention_backward(spb_direct_attention kernel, const spb_attn_desc *d, const float *q,
                                       const float *k, const float *v, const float *o, const float *lse,
                                       const float *dout, float *dq, float *dk, float *dv);

/* Calls per path since the last reset (the process's). */
typedef struct spb_bf16_direct_counts {
    long matmul_direct, matmul_frames;
    long attention_direct, attention_frames;
    long rowwise_direct, rowwise_frames; /* GELU, LayerNorm, residual adds, cross-entropy */
    long memory_direct, memory_frames;   /* fill, zero, copy, copy_rows */
    long optimizer_direct, optimizer_frames; /* AdamW, sum of squares */
    long embedding_direct, embedding_frames; /* forward, backward */
    long bias_direct, bias_frames;           /* add_bias_rows, bias_grad_rows */
    long merge_direct, merge_frames;         /* attn_merge */
} spb_bf16_direct_counts;
spb_bf16_direct_counts spb_bf16_direct_get_counts(void);
void spb_bf16_direct_reset_counts(void);

#endif
