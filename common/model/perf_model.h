/* The performance model (docs/MODEL.md): iteration time, throughput and
 * memory of a configuration on a hardware profile, without running it.
 *
 * Bytes come from the code the tests hold against measured bytes: each
 * strategy's comm_volume hook (strategies/strategy.h) for the layers and
 * spb_zero_comm_items (common/core/zero.h) for the gradient reduction and ZeRO.
 * Times are bytes and FLOPs priced by a profile (profiles/NAME.profile): GEMM
 * and attention rates by shape, element-wise costs, and per-collective
 * latency + bytes / bandwidth with the topology (NVSwitch inside a node,
 * per-GPU network bandwidth across nodes), or, for the local CPU machine,
 * measured alpha/beta per collective, world and group size
 * (spbench-calibrate).  Memory is spb_memory_model's. */
#ifndef SPB_PERF_MODEL_H
#define SPB_PERF_MODEL_H

#include <stddef.h>

#include "comm.h"
#include "config.h"
#include "memory_model.h"

/* Element-wise kernels the model prices per element (CPU: measured seconds
 * per element; GPU: bytes per element over the memory bandwidth). */
typedef enum spb_elem_kind {
    SPB_ELEM_LN_FWD = 0, /* LayerNorm forward, per element of [rows][C] */
    SPB_ELEM_LN_BWD,
    SPB_ELEM_GELU_FWD,
    SPB_ELEM_GELU_BWD,
    SPB_ELEM_XENT_FWD,   /* softmax + cross-entropy, per logit */
    SPB_ELEM_XENT_BWD,
    SPB_ELEM_ADD,        /* a += b */
    SPB_ELEM_COPY,       /* memcpy / memset, per float */
    SPB_ELEM_ADAM,       /* AdamW update, per parameter */
    SPB_ELEM_SUMSQ,      /* sum of squares (gradient norm), per element */
    SPB_ELEM_NUM
} spb_elem_kind;
const char *spb_elem_name(spb_elem_kind k);

enum { SPB_PROFILE_MAX_POINTS = 512 };

/* A GEMM measurement: y[rows][out] = x[rows][in] W[out][in]^T and its two
 * backward products; rates in FLOP/s for op 0 (forward), 1 (d input), 2 (d
 * weight). */
typedef struct spb_gemm_point {
    double rows, in, out, rate[3];
} spb_gemm_point;

/* An attention measurement: one call of a backend with q_len = k_len =
 * len, head dim hd, causal or not, over `heads` (sequence, head) pairs;
 * counted FLOP/s forward and backward.  heads 0: not recorded (the point
 * stands for any count), as in profiles older than the field. */
typedef struct spb_attn_point {
    char backend[16]; /* flash, naive */
    int causal;
    double len, hd, heads, fwd, bwd;
} spb_attn_point;

/* A collective measurement: time = alpha + link_bytes / beta for op on a
 * group of `group` ranks of a world of `world` ranks (all groups busy). */
typedef struct spb_comm_point {
    int op, world, group;
    double alpha, beta;
} spb_comm_point;

typedef struct spb_profile {
    char name[64];
    char device[32];       /* "cpu" or "gpu" */
    spb_precision precision;
    int ranks_per_node;    /* GPUs per node; CPU: 0 = every rank on this one machine */
    int cores;             /* CPU cores the ranks share (0: one device per rank) */
    double memory_bytes;   /* per rank (0: not limited) */
    double memory_reserved; /* per rank, kept out of the budget (runtime, workspace, fragmentation) */
    /* matrix products: measured points, or peak · eff · Π d/(d + half) */
    double gemm_peak, gemm_eff, gemm_half;
    int n_gemm;
    spb_gemm_point gemm[SPB_PROFILE_MAX_POINTS];
    /* attention: measured points, or peak · eff · len/(len + half) */
    double attn_peak, attn_fwd_eff, attn_bwd_eff, attn_half_len, sparse_eff_ratio;
    /* a GPU's attention tiles: SMs (0: no tile model, as on a CPU), query
     * rows per block, blocks resident per SM */
    int sms, attn_blocks_per_sm;
    double attn_tile_rows;
    int n_attn;
    spb_attn_point attn[SPB_PROFILE_MAX_POINTS];
    /* element-wise: seconds per element (measured) or bytes over mem_bw */
    double mem_bw;
    double elem_seconds[SPB_ELEM_NUM];
    /* communication: measured points, or the topology */
    double intra_bw, intra_alpha; /* per GPU, inside a node (NVLink/NVSwitch), one direction */
    double inter_bw, inter_alpha; /* per GPU, across nodes (its NIC), one direction */
    int n_comm;
    spb_comm_point comm[SPB_PROFILE_MAX_POINTS];
    /* software profiles of the attention kernel: `attn_backend = NAME fwd_eff
     * bwd_eff` lines (FlashAttention 1 vs 2, Triton, ...), each a published
     * kernel rate as a fraction of attn_peak, used in place of
     * attn_fwd_eff/attn_bwd_eff when --attn-backend names it.  The backend
     * "unfused" (Megatron-LM before FlashAttention) is built in: two batched
     * products at the GEMM rate plus the score matrix through HBM. */
    int n_attn_sw;
    struct { char name[16]; double fwd_eff, bwd_eff; } attn_sw[16];
    double kernel_gap;     /* seconds between dependent kernels on the stream (0: not modelled) */
    double softmax_fused_max_len; /* unfused attention: longest key length of the fused softmax kernel (0: any) */
    /* the framework's defaults (software profile): spbench-model applies them unless told otherwise */
    int overlap_dp_min_stage; /* data-parallel traffic overlaps compute from this ZeRO stage up (0: never);
                                 DeepSpeed: 3 (overlap_comm defaults to true for stage 3 only) */
    int fused_kernels;        /* 1: the framework's fused kernels (spb_perf_options.fused) */
    /* the calibration's spread, `band_<key> = slow fast` lines: [0] the slow end, [1] the fast end */
    int has_band;
    double band_gemm_eff[2], band_attn_scale[2], band_mem_bw_frac[2], band_intra_bw[2], band_inter_bw[2],
        band_kernel_gap[2];
} spb_profile;

/* Reads a profile (key = value lines, '#' comments; docs/MODEL.md).
 * Returns 0, or -1 with a message. */
int spb_profile_load(const char *path, spb_profile *p, char *err, size_t errlen);

/* The profile at one end of its calibration's spread (fast = 0: the slow
 * end, 1: the fast end): GEMM efficiency (formula profiles), every attention
 * rate scaled, memory and link bandwidths, kernel gaps, from its band_*
 * lines; a key without a band keeps its value.  Returns 0, or -1 when the
 * profile has no band. */
int spb_profile_band(const spb_profile *p, int fast, spb_profile *out);

/* Communication of one iteration per rank, by operation and phase. */
typedef struct spb_comm_plan {
    double calls[SPB_NUM_OPS][SPB_NUM_PHASES];
    double payload[SPB_NUM_OPS][SPB_NUM_PHASES]; /* bytes, nccl-tests "size", summed over calls */
    double link[SPB_NUM_OPS][SPB_NUM_PHASES];    /* bytes per link */
    int group[SPB_NUM_OPS][SPB_NUM_PHASES];      /* ranks in the collective's group */
    int strided[SPB_NUM_OPS][SPB_NUM_PHASES];    /* the group is strided (data parallel / D x P) */
} spb_comm_plan;

/* Bytes the layers and the gradient reduction/ZeRO move in one iteration
 * (accumulation included), per rank, from the strategies' comm_volume and
 * spb_zero_comm_items.  elem_bytes: bytes of one activation element on the
 * wire (4 on the CPU path, 2 for bf16/fp16) — the fp32 formulas are scaled
 * by elem_bytes/4; the gradient/ZeRO items likewise by grad_bytes/4.
 * Phase "other" (loss, norm and timing reductions) is left out.  cfg
 * finalized for world_size.  Returns 0 or -1 (unknown strategy). */
int spb_perf_comm_plan(const spb_config *cfg, int world_size, double elem_bytes, double grad_bytes,
                       spb_comm_plan *plan);

typedef struct spb_perf_prediction {
    /* per iteration, seconds, the slowest rank */
    double iter_time;
    double t_gemm, t_attn, t_other;        /* compute by kind (forward + backward + recompute) */
    double t_forward, t_backward;          /* compute and exposed layer communication */
    double t_grad_reduce, t_optimizer;     /* incl. their communication */
    double t_adam;                         /* optimizer arithmetic */
    double comm_exposed[SPB_NUM_OPS][SPB_NUM_PHASES];
    double comm_overlapped[SPB_NUM_OPS][SPB_NUM_PHASES]; /* ring: transfer hidden behind block compute */
    double comm_exposed_total, layer_comm;
    spb_comm_plan plan;
    /* FLOPs per rank per iteration (counted: executed products and visible attention pairs) */
    double gemm_flops, attn_flops;
    double tokens_per_s, tflops_paper_per_rank, tflops_counted_per_rank;
    double compute_scale;                  /* rate factor for ranks sharing cores (1 otherwise) */
    /* the layouts and costs of published runs (spb_perf_options' fields; 0 when off) */
    double t_bubble;                       /* pipeline fill and drain: (pp - 1) / vpp micro-steps */
    double t_p2p;                          /* pipeline stage-to-stage transfers, exposed */
    double t_launch;                       /* kernel gaps: kernels x profile kernel_gap */
    double t_recompute;                    /* recomputed forward (full or selective), included above */
    double t_softmax;                      /* unfused attention's score matrix through HBM, included in t_attn */
    double dp_comm_hidden;                 /* gradient/ZeRO traffic hidden behind compute (overlap_dp) */
    spb_memory_prediction mem;
    double mem_needed;                     /* mem.total + profile reserve */
    int fits;                              /* mem_needed <= profile memory (1 when unlimited) */
} spb_perf_prediction;

/* Terms the model can leave out (spb_perf_options.ablate), to measure each
 * term's share of the error on the published validation set. */
enum {
    SPB_TERM_ELEMWISE = 1 << 0,  /* LayerNorm, GELU, residual/bias adds, copies, cross-entropy */
    SPB_TERM_OPTIMIZER = 1 << 1, /* AdamW, gradient norm, zeroing, ZeRO staging copies */
    SPB_TERM_LAYER_COMM = 1 << 2, /* tensor/sequence-parallel collectives inside the layers */
    SPB_TERM_DP_COMM = 1 << 3,   /* gradient reduction and ZeRO gathers/reduce-scatters */
    SPB_TERM_BUBBLE = 1 << 4,    /* pipeline fill/drain */
    SPB_TERM_P2P = 1 << 5,       /* pipeline transfers */
    SPB_TERM_LAUNCH = 1 << 6,    /* kernel gaps */
    SPB_TERM_SOFTMAX = 1 << 7,   /* unfused attention's score matrix */
    SPB_TERM_RECOMPUTE = 1 << 8, /* activation recomputation */
    SPB_TERM_LATENCY = 1 << 9,   /* per-call collective latency (alpha) */
    SPB_TERM_NUM = 10
};
const char *spb_term_name(int bit_index);

typedef struct spb_perf_options {
    spb_precision precision;
    double attn_density; /* fraction of attention blocks computed (blocked sparse); 1 = dense */
    char backend[16];    /* attention backend whose measured rates apply ("": cfg->attention) */
    /* Layouts of published runs that spbench itself does not run, priced
     * analytically (docs/MODEL.md, "Published layouts"); 0 = off. */
    int pp, vpp;         /* pipeline stages, virtual stages per rank (interleaved 1F1B); cfg is ONE stage:
                            its layers and its tp x dp ranks; the slowest (last) stage, with the head */
    int tp_no_sp;        /* Megatron tensor parallelism without sequence parallelism: LayerNorm, dropout
                            and residuals run on the whole sequence on every tensor-parallel rank */
    int selective_recompute; /* recompute only the attention core (Korthikanti et al. 2022) */
    int dropout;         /* hidden dropout (2 per layer) and, unfused, attention dropout */
    int overlap_dp;      /* gradient reduction and ZeRO traffic overlap compute (DDP buckets, FSDP prefetch) */
    int fused;           /* a framework's fused kernels: bias in the GEMM/GELU/dropout-add kernels and no
                            staging copies between the tensor-parallel region and the sequence blocks
                            (spbench's own copies priced otherwise) */
    unsigned ablate;     /* SPB_TERM_* bits left out */
} spb_perf_options;

/* Bytes per attention-score element an unfused attention moves through
 * HBM (SPB_SCORES_*: Megatron-LM's fused softmax kernel, its eager fallback,
 * plain PyTorch), forward or backward, with or without attention dropout. */
enum { SPB_SCORES_MEGATRON_FUSED = 0, SPB_SCORES_MEGATRON_EAGER = 1, SPB_SCORES_TORCH = 2 };
double spb_perf_unfused_score_bytes(int backward, int dropout, int impl);

/* Pipeline terms of one iteration: the bubble, (pp - 1) / vpp micro-steps
 * of t_micro seconds, and the exposed stage-to-stage transfers, 2 per
 * micro-step and virtual stage plus 2 (pp - 1) for fill and drain, each
 * t_msg seconds. */
void spb_perf_pipeline_terms(int pp, int vpp, double micro_steps, double t_micro, double t_msg, double *bubble,
                             double *p2p);

/* cfg finalized for world_size.  Returns 0 or -1 with a message. */
int spb_perf_predict(const spb_config *cfg, int world_size, const spb_profile *prof, const spb_perf_options *opt,
                     spb_perf_prediction *out, char *err, size_t errlen);

/* Time of one collective of op with `link_bytes` per link over `group`
 * ranks (strided or contiguous) in a world of world_size ranks. */
double spb_perf_collective_time(const spb_profile *prof, spb_comm_op op, double link_bytes, double payload_bytes,
                                int group, int strided, int world_size);

/* GEMM rate (FLOP/s, one rank, before core sharing) of y[rows][out] =
 * x[rows][in] W^T, op 0/1/2 = forward / d input / d weight. */
double spb_perf_gemm_rate(const spb_profile *prof, double rows, double in, double out, int op);
/* Attention rate (counted FLOP/s) of one call over len keys, head dim hd,
 * heads (sequence, head) pairs: a GPU's rate falls when few pairs leave
 * its SMs short of query tiles (Ulysses' and Megatron-SP's H/P heads). */
double spb_perf_attn_rate(const spb_profile *prof, const char *backend, int causal, double len, double hd,
                          double heads, int backward);
/* The share of a full GPU one attention call keeps: its heads x
 * ceil(len / attn_tile_rows) query tiles (causal ones shorter) placed
 * longest first on sms x attn_blocks_per_sm slots, total work over slots x
 * the longest slot.  1 where the profile has no sms. */
double spb_perf_attn_occupancy(const spb_profile *prof, double heads, double len, int causal);

#endif
