/* Run configuration: Megatron-style long options, validated before anything
 * is allocated.  Every rank parses and validates the same argv; rank 0 prints
 * the single error line, every rank exits non-zero. */
#ifndef SPB_CONFIG_H
#define SPB_CONFIG_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

enum { SPB_PATH_MAX = 1024, SPB_NAME_MAX = 32 };
#define SPB_DEFAULT_LOSS_SCALE 65536.0 /* 2^16 */
#define SPB_DEFAULT_LOSS_SCALE_WINDOW 1000

typedef struct spb_config {
    /* model */
    int num_layers;
    int hidden_size;
    int num_heads;
    int ffn_hidden_size;        /* default 4 * hidden */
    int vocab_size;             /* default 256 (bytes) */
    int seq_length;
    int max_position_embeddings; /* default seq_length */
    double init_std;
    /* today's models (issue 35; Megatron-LM's option names).  --model llama
     * presets rope, rmsnorm, swiglu, an untied head and no linear biases. */
    char model[SPB_NAME_MAX];   /* gpt | llama */
    int num_query_groups;       /* K/V heads G (grouped-query attention); default num_heads */
    char position_embedding_type[SPB_NAME_MAX]; /* learned | rope */
    double rotary_base;         /* RoPE theta (10000) */
    char normalization[SPB_NAME_MAX]; /* layernorm | rmsnorm */
    int swiglu;                 /* gated MLP: silu(x·Wgᵀ) * (x·Wuᵀ) */
    int untie_embeddings_and_output_weights; /* an LM head of its own */
    int disable_bias_linear;    /* no biases on the four linear layers */
    int rope, rmsnorm;          /* derived from the two strings */
    /* batch */
    int micro_batch_size;
    int global_batch_size;      /* default micro * data-parallel degree */
    /* optimiser */
    int train_iters;
    double lr, min_lr;
    int lr_warmup_iters;
    char lr_decay_style[SPB_NAME_MAX]; /* constant | cosine | linear */
    double weight_decay, adam_beta1, adam_beta2, adam_eps;
    double clip_grad;           /* 0 = off */
    uint64_t seed;
    /* parallelism */
    int sp_degree;
    char strategy[SPB_NAME_MAX];
    int zero_stage;
    int checkpoint_activations; /* keep each layer's input only, recompute in backward */
    char attention[SPB_NAME_MAX]; /* attention backend; "auto" (spbench's default) until finalize picks one */
    int attention_auto;         /* finalize picked it (spb_config_default_attention): --attention not given */
    const char *attention_why;  /* and why, in a few words (a string literal; NULL unless attention_auto) */
    char attention_mask[SPB_NAME_MAX]; /* causal | full */
    int causal;                 /* derived from attention_mask */
    /* blocked-sparse attention pattern (docs/SPARSE.md; 0 = dense) */
    int sparse_block;           /* tokens per block */
    int sparse_local_blocks;    /* sliding window, in blocks, own block included */
    int sparse_global_blocks;   /* leading key blocks every query sees */
    char ring_layout[SPB_NAME_MAX]; /* contiguous | zigzag */
    char ulysses_comm[SPB_NAME_MAX]; /* alltoall | allgather (ablation) */
    int ulysses_overlap; /* Ulysses/hybrid: exchange in K head groups, each overlapping the previous group's attention (0, 1: off) */
    int ulysses_degree; /* hybrid: all-to-all degree U inside an SP group, ring degree P/U (0 = P) */
    char device[SPB_NAME_MAX];  /* cpu | cuda */
    char comm[SPB_NAME_MAX];    /* mpi (host-staged for device buffers) | nccl (device buffers, --device cuda) */
    char precision[SPB_NAME_MAX]; /* fp32 | bf16 | fp16 (mixed: 16-bit storage, fp32 arithmetic, masters, moments) */
    char bf16_kernels[SPB_NAME_MAX]; /* bf16: fast (direct products, attention) | reference (fp32 frames) */
    char bf16_direct[128];           /* fast: which kinds of call go direct (all; bf16_direct.h) */
    /* the CUDA flash kernels' variant (16-bit, fast, --attention flash): rows
     * per block, 64 or 128 (0: the default, 128); where dQ is summed: split
     * (its own kernel, the default) | fused (atomics in the dK/dV kernel);
     * each pass's tensor-core instruction: mma (the default) | wgmma */
    int flash_block_rows;
    char flash_dq[SPB_NAME_MAX];
    char flash_fwd[SPB_NAME_MAX];
    char flash_bwd[SPB_NAME_MAX];
    /* fp16 loss scaling: static (loss_scale > 0) or dynamic (0): halve on
     * overflow (the step is skipped), double after loss_scale_window clean
     * steps, never below min_loss_scale */
    double loss_scale, initial_loss_scale, min_loss_scale;
    int loss_scale_window;
    /* io */
    char data[SPB_PATH_MAX];    /* byte-level text; empty = synthetic tokens */
    char results[SPB_PATH_MAX]; /* CSV summary row appended */
    char dump[SPB_PATH_MAX];
    char save[SPB_PATH_MAX];
    char load[SPB_PATH_MAX];
    char loss_log[SPB_PATH_MAX]; /* per-iteration CSV: iteration, loss, ... */
    char run_name[SPB_NAME_MAX * 2];
    int log_interval;
    int timing_warmup;          /* iterations excluded from timing statistics */
    int quiet;
    int compare_alltoall;       /* time plain MPI_Alltoall of the same bytes at the end */
    int kernel_timeline;        /* --device cuda: events around every kernel, per-phase busy and idle (cuda_trace.h) */
    char memory_budget[SPB_NAME_MAX]; /* e.g. 80GiB: refuse runs the memory model says cannot fit */
    int overwrite;              /* outputs may replace files that are not spbench files of their kind */
} spb_config;

/* Defaults for everything (a small model). */
void spb_config_defaults(spb_config *cfg);

/* Parse argv.  Returns 0 on success, 1 if --help was asked (usage written to
 * err is not done: call spb_config_usage), -1 on a bad option with a one-line
 * message in err. */
int spb_config_parse(int argc, char **argv, spb_config *cfg, char *err, size_t errlen);

/* Fill defaults that depend on other values and the world size, then check
 * every value.  Returns 0 or -1 with a one-line message in err. */
int spb_config_finalize(spb_config *cfg, int world_size, char *err, size_t errlen);

void spb_config_usage(FILE *out);
/* Every option as JSON (name, kind, choices, default): spbench --list-options,
 * which the sweep runner reads instead of keeping its own copy. */
void spb_config_list_options(FILE *out);
/* Whether the run's attention takes the CUDA flash kernels (--device cuda,
 * 16-bit, --bf16-kernels fast, --attention flash): where --flash-block-rows,
 * --flash-dq, --flash-fwd and --flash-bwd apply.  After finalize (bf16_kernels' default). */
int spb_config_uses_cuda_flash(const spb_config *cfg);
/* Their settings for that run: 64 or 128, "split" or "fused", and the
 * forward's and the backward's tensor-core instruction, "mma" (mma.sync)
 * or "wgmma" (Hopper). */
int spb_config_flash_block_rows(const spb_config *cfg);
const char *spb_config_flash_dq(const spb_config *cfg);
const char *spb_config_flash_fwd(const spb_config *cfg);
const char *spb_config_flash_bwd(const spb_config *cfg);
/* whether either asks for wgmma */
int spb_config_flash_wgmma(const spb_config *cfg);

/* The attention a run takes when --attention is not given (or is "auto"):
 * cuDNN's fused attention on a CUDA device where the build has cuDNN 9
 * (build_has_cudnn: SPB_HAVE_CUDNN at configure time, asked of the CUDA
 * table) and the run is one its graph takes (bf16 or fp16, dense masks,
 * head dim a multiple of 8 up to 128, no --flash-* variant asked for);
 * otherwise the project's flash kernels.  why (may be NULL) gets the
 * reason in a few words.  A function of its arguments only. */
const char *spb_config_default_attention(const spb_config *cfg, int build_has_cudnn, const char **why);

/* Derived quantities (valid after finalize). */
int spb_config_dp_degree(const spb_config *cfg, int world_size);
int spb_config_accum_steps(const spb_config *cfg, int world_size);

#endif
