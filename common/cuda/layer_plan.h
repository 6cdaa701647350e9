/* Host-side arithmetic of the device layer's checks and timings (plain C,
 * header-only, no CUDA): the shape a device transformer layer runs for a
 * strategy's per-rank compute at sequence-parallel degree P, the FLOP
 * counts, and the dense bf16 peak of known GPUs.  Tested on any machine by
 * tests/gpu/test_layer_plan.c; used by experiments/gpu_layer.cu.
 *
 * FLOPs (docs/GPU.md, "Layer timings"):
 *   paper   one layer, forward: 24·B·s·h² + 4·B·s²·h  (Megatron's count: the
 *           four products 2·s·h·(3h + h + 4h + 4h) = 24·s·h² with F = 4h, and
 *           QKᵀ and P·V as 2·s²·h each over ALL s² pairs, causal or not);
 *           forward + backward = 3 x forward.  No LM head, no recomputation.
 *           A strategy's per-rank share at degree P is that divided by P.
 *   executed  what the kernels are asked to do: 2·rows·in·out per product
 *           (x3 for fwd+bwd) for the shape's actual widths (3·H·D, H·D, F),
 *           and 4·D per visible query-key pair forward, 8·D backward (x3:
 *           the conventional 2x, not counting the flash recomputation of
 *           the scores), over the attention blocks the shape computes. */
#ifndef SPB_LAYER_PLAN_H
#define SPB_LAYER_PLAN_H

#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum spb_layer_attn_mode {
    SPB_LAYER_ATTN_LOCAL = 0, /* attention over the layer's own T tokens and H heads */
    SPB_LAYER_ATTN_ULYSSES,   /* products for T tokens x H heads; attention for P·T tokens x H/P heads
                                 (all-to-all replaced by the identity: the per-rank compute and layout
                                 permutes of Ulysses, no communication) */
    SPB_LAYER_ATTN_RING,      /* products for T tokens; attention as P key blocks of T tokens each at
                                 offsets j·T, queries at ring_rank·T, merged by log-sum-exp (the K/V
                                 blocks are this rank's own: no communication) */
    SPB_LAYER_ATTN_RING_ZIGZAG, /* ring on the zigzag layout (strategies/ring.c): the T tokens are
                                 chunks ring_rank and 2P-1-ring_rank of c = T/2 tokens; key block j is
                                 chunks j and 2P-1-j (this rank's own two chunks' K/V again) */
} spb_layer_attn_mode;

/* One device layer's shape.  H heads of D go through the QKV product and
 * the output projection (H·D may differ from C: Megatron-SP's H/P heads),
 * F ffn columns through the MLP. */
typedef struct spb_cuda_layer_shape {
    int B, T;       /* sequences, tokens per sequence in the products */
    int C, H, D, F; /* hidden, heads, head dim, ffn columns (all computed here) */
    int causal;
    spb_layer_attn_mode attn;
    int P;          /* ULYSSES, RING: sequence-parallel degree; 1 otherwise */
    int ring_rank;  /* RING, RING_ZIGZAG: this rank (0..P-1) */
} spb_cuda_layer_shape;

/* The per-rank compute of a strategy at degree P for global N tokens per
 * sequence of a model (C, H, D, F), as a device layer shape:
 *   "layer"        the whole layer on one GPU: N tokens, all heads (P ignored)
 *   "megatron-sp"  N tokens, H/P heads, F/P ffn columns (the sharded products;
 *                  LayerNorm, biases and residual adds here run on all N
 *                  tokens where Megatron-SP runs them on N/P: memory-bound,
 *                  well under 1% of the products at the 7B shape)
 *   "ulysses"      products on N/P tokens with all heads; attention on N
 *                  tokens with H/P heads (SPB_LAYER_ATTN_ULYSSES)
 *   "ring"         products on N/P tokens; attention as P blocks of N/P
 *                  queries x N/P keys; ring_rank = P - 1, the busiest rank of
 *                  the contiguous layout under a causal mask (P - 1 full
 *                  blocks and the diagonal one); every rank is alike without
 *                  the mask.
 *   "ring-zigzag"  the same on the zigzag layout (N divisible by 2P): every
 *                  rank sees the same number of pairs, causal or not
 *                  (ring_rank = P - 1, as for "ring").
 * Returns 0, or -1 when P does not divide N (or H, F) or a name is unknown. */
static inline int spb_layer_strategy_shape(const char *strategy, int P, long N, int B, int C, int H, int D, int F,
                                           int causal, spb_cuda_layer_shape *out)
{
    spb_cuda_layer_shape s;
    memset(&s, 0, sizeof s);
    s.B = B, s.C = C, s.H = H, s.D = D, s.F = F, s.causal = causal, s.attn = SPB_LAYER_ATTN_LOCAL, s.P = 1;
    if (N <= 0 || P <= 0 || B <= 0) return -1;
    if (!strcmp(strategy, "layer")) {
        s.T = (int)N;
    } else if (!strcmp(strategy, "megatron-sp")) {
        if (H % P || F % P) return -1;
        s.T = (int)N, s.H = H / P, s.F = F / P;
    } else if (!strcmp(strategy, "ulysses")) {
        if (N % P || H % P) return -1;
        s.T = (int)(N / P), s.attn = SPB_LAYER_ATTN_ULYSSES, s.P = P;
    } else if (!strcmp(strategy, "ring")) {
        if (N % P) return -1;
        s.T = (int)(N / P), s.attn = SPB_LAYER_ATTN_RING, s.P = P, s.ring_rank = P - 1;
    } else if (!strcmp(strategy, "ring-zigzag")) {
        if (N % (2L * P)) return -1;
        s.T = (int)(N / P), s.attn = SPB_LAYER_ATTN_RING_ZIGZAG, s.P = P, s.ring_rank = P - 1;
    } else {
        return -1;
    }
    *out = s;
    return 0;
}

/* The paper's count for one layer of B sequences of s tokens, hidden h:
 * forward 24·B·s·h² + 4·B·s²·h, x3 for forward + backward. */
static inline double spb_layer_paper_flops_fwd(double B, double s, double h)
{
    return 24.0 * B * s * h * h + 4.0 * B * s * s * h;
}
static inline double spb_layer_paper_flops_fwd_bwd(double B, double s, double h)
{
    return 3.0 * spb_layer_paper_flops_fwd(B, s, h);
}

/* Visible query-key pairs per (sequence, head) of a block of q queries at
 * q_off against k keys at k_off (attention.h's spb_attn_visible_keys summed
 * in closed form). */
static inline double spb_layer_block_pairs(long q, long q_off, long k, long k_off, int causal)
{
    if (!causal) return (double)q * (double)k;
    double sum = 0.0;
    /* query i sees keys 0..min(k-1, q_off + i - k_off): a clamped ramp */
    long lo = k_off - q_off;         /* first i with >= 1 visible key */
    long full = k_off + k - 1 - q_off; /* first i with all k visible */
    for (long i = lo < 0 ? 0 : lo; i < q; i++) {
        if (i >= full) {
            sum += (double)k * (double)(q - i);
            break;
        }
        sum += (double)(q_off + i - k_off + 1);
    }
    return sum;
}

/* The zigzag layout's chunk (of 2P) that holds run `run` (0 or 1) of rank r */
static inline long spb_layer_zigzag_chunk(int P, int r, int run) { return run ? 2L * P - 1 - r : r; }

/* Ring layers: runs of a rank's T tokens (1 contiguous, 2 zigzag) and the
 * global position of run `run` of rank `rank` (the same for its queries
 * and, as block `rank`, for its keys). */
static inline int spb_layer_is_ring(const spb_cuda_layer_shape *s)
{
    return s->attn == SPB_LAYER_ATTN_RING || s->attn == SPB_LAYER_ATTN_RING_ZIGZAG;
}
static inline int spb_layer_ring_runs(const spb_cuda_layer_shape *s)
{
    return s->attn == SPB_LAYER_ATTN_RING_ZIGZAG ? 2 : 1;
}
static inline long spb_layer_ring_run_start(const spb_cuda_layer_shape *s, int rank, int run)
{
    if (s->attn == SPB_LAYER_ATTN_RING_ZIGZAG) return spb_layer_zigzag_chunk(s->P, rank, run) * (s->T / 2);
    return (long)rank * s->T;
}

/* Visible pairs per sequence and head of the attention a shape computes
 * (its own T tokens; or P·T tokens; or its P ring blocks). */
static inline double spb_layer_attn_pairs(const spb_cuda_layer_shape *s)
{
    long T = s->T;
    switch (s->attn) {
    case SPB_LAYER_ATTN_ULYSSES: return spb_layer_block_pairs((long)s->P * T, 0, (long)s->P * T, 0, s->causal);
    case SPB_LAYER_ATTN_RING:
    case SPB_LAYER_ATTN_RING_ZIGZAG: {
        double sum = 0.0;
        const int runs = spb_layer_ring_runs(s);
        const long len = T / runs;
        for (int j = 0; j < s->P; j++)
            for (int a = 0; a < runs; a++)
                for (int b = 0; b < runs; b++)
                    sum += spb_layer_block_pairs(len, spb_layer_ring_run_start(s, s->ring_rank, a), len,
                                                 spb_layer_ring_run_start(s, j, b), s->causal);
        return sum;
    }
    default: return spb_layer_block_pairs(T, 0, T, 0, s->causal);
    }
}

/* Heads the attention of a shape runs per sequence. */
static inline int spb_layer_attn_heads(const spb_cuda_layer_shape *s)
{
    return s->attn == SPB_LAYER_ATTN_ULYSSES ? s->H / s->P : s->H;
}

/* Executed FLOPs of a shape's forward, and of forward + backward (x3). */
static inline double spb_layer_exec_flops_fwd(const spb_cuda_layer_shape *s)
{
    double rows = (double)s->B * s->T, Ca = (double)s->H * s->D;
    double prod = 2.0 * rows * ((double)s->C * 3.0 * Ca + Ca * s->C + 2.0 * (double)s->C * s->F);
    double attn = 4.0 * s->D * spb_layer_attn_pairs(s) * (double)s->B * spb_layer_attn_heads(s);
    return prod + attn;
}
static inline double spb_layer_exec_flops_fwd_bwd(const spb_cuda_layer_shape *s)
{
    return 3.0 * spb_layer_exec_flops_fwd(s);
}

/* Dense (no sparsity) bf16 tensor-core peak in TFLOP/s of a GPU by its CUDA
 * device name (vendor data sheets); 0 when unknown.  The more specific names
 * come first (H100 NVL and PCIe before H100 SXM's "H100"). */
static inline double spb_gpu_dense_bf16_peak_tflops(const char *name)
{
    static const struct {
        const char *key;
        double tflops;
    } table[] = {{"H200 NVL", 835.5}, {"H200", 989.4}, {"H100 NVL", 835.5}, {"H100 PCIe", 756.0},
                 {"GH200", 989.4},    {"H100", 989.4}, {"H800", 989.4},     {"A100", 312.0},
                 {"A800", 312.0}};
    if (!name) return 0.0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strstr(name, table[i].key)) return table[i].tflops;
    return 0.0;
}

#ifdef __cplusplus
}
#endif

#endif
