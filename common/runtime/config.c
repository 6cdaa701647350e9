#define _POSIX_C_SOURCE 200809L
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strategy.h"
#include "attention.h"
#include "backend.h"
#include "bf16_direct.h"
#include "memory_limit.h"
#include "memory_model.h"

/* OPT_SIZE: a string holding bytes ("80GiB"), checked when parsed. */
typedef enum { OPT_INT, OPT_DOUBLE, OPT_U64, OPT_STRING, OPT_FLAG, OPT_SIZE } opt_kind;

typedef struct option_spec {
    const char *name;
    opt_kind kind;
    size_t offset;
    size_t size; /* strings: buffer size */
    const char *help;
    const char *choices; /* the words a value may be, comma-separated (--list-options); NULL: any */
} option_spec;

#define OPT(name, kind, field, help) {name, kind, offsetof(spb_config, field), sizeof(((spb_config *)0)->field), help, NULL}
/* an option whose value is one of a fixed list of words */
#define OPTC(name, kind, field, choices, help)                                                                    \
    {name, kind, offsetof(spb_config, field), sizeof(((spb_config *)0)->field), help, choices}

static const option_spec options[] = {
    OPT("num-layers", OPT_INT, num_layers, "transformer layers L"),
    OPT("hidden-size", OPT_INT, hidden_size, "hidden size h"),
    OPT("num-attention-heads", OPT_INT, num_heads, "attention heads (must divide hidden)"),
    OPT("ffn-hidden-size", OPT_INT, ffn_hidden_size, "MLP width (default 4h)"),
    OPT("vocab-size", OPT_INT, vocab_size, "vocabulary (default 256; --data needs >= 256)"),
    OPT("seq-length", OPT_INT, seq_length, "sequence length N"),
    OPT("max-position-embeddings", OPT_INT, max_position_embeddings, "position table size (default N)"),
    OPT("init-method-std", OPT_DOUBLE, init_std, "std of weight initialisation (0.02)"),
    OPTC("model", OPT_STRING, model, "gpt,llama",
        "gpt (default) | llama: --position-embedding-type rope, --normalization rmsnorm, --swiglu, "
        "--untie-embeddings-and-output-weights, --disable-bias-linear (the two strings still overridable)"),
    OPT("num-query-groups", OPT_INT, num_query_groups,
        "K/V heads G of grouped-query attention (default: --num-attention-heads; 1 = multi-query)"),
    OPTC("position-embedding-type", OPT_STRING, position_embedding_type, "learned,rope",
        "learned (a position table, GPT) | rope (rotary on Q and K at global positions)"),
    OPT("rotary-base", OPT_DOUBLE, rotary_base, "RoPE base theta (10000)"),
    OPTC("normalization", OPT_STRING, normalization, "layernorm,rmsnorm", "layernorm | rmsnorm"),
    OPT("swiglu", OPT_FLAG, swiglu,
        "gated MLP silu(x Wg) * (x Wu); --ffn-hidden-size default int(8h/3 / 64) * 64 (Megatron-LM's rule)"),
    OPT("untie-embeddings-and-output-weights", OPT_FLAG, untie_embeddings_and_output_weights,
        "an output layer of its own instead of the token embedding"),
    OPT("disable-bias-linear", OPT_FLAG, disable_bias_linear, "no biases in the QKV, projection and MLP layers"),
    OPT("micro-batch-size", OPT_INT, micro_batch_size, "sequences per rank per micro-step"),
    OPT("global-batch-size", OPT_INT, global_batch_size, "sequences per iteration (default micro x data-parallel)"),
    OPT("train-iters", OPT_INT, train_iters, "iterations"),
    OPT("lr", OPT_DOUBLE, lr, "peak learning rate"),
    OPT("min-lr", OPT_DOUBLE, min_lr, "final learning rate of the decay"),
    OPT("lr-warmup-iters", OPT_INT, lr_warmup_iters, "linear warm-up iterations"),
    OPTC("lr-decay-style", OPT_STRING, lr_decay_style, "constant,linear,cosine", "constant | linear | cosine"),
    OPT("weight-decay", OPT_DOUBLE, weight_decay, "AdamW decoupled weight decay (matrices and embeddings only)"),
    OPT("adam-beta1", OPT_DOUBLE, adam_beta1, "AdamW beta1"),
    OPT("adam-beta2", OPT_DOUBLE, adam_beta2, "AdamW beta2"),
    OPT("adam-eps", OPT_DOUBLE, adam_eps, "AdamW epsilon"),
    OPT("clip-grad", OPT_DOUBLE, clip_grad, "clip the global gradient norm to this (0 = off)"),
    OPT("seed", OPT_U64, seed, "seed of initialisation and synthetic data"),
    OPT("sp-degree", OPT_INT, sp_degree, "sequence-parallel degree P (world = D x P)"),
    OPT("strategy", OPT_STRING, strategy, "sequence-parallel strategy"),
    OPTC("zero-stage", OPT_INT, zero_stage, "0,1,2,3", "ZeRO stage 0-3"),
    OPT("checkpoint-activations", OPT_FLAG, checkpoint_activations,
        "keep each layer's input only and recompute the layer in backward"),
    OPT("attention", OPT_STRING, attention, "attention backend: auto (the default: cudnn on --device cuda where the "
        "build has cuDNN 9 and the run is bf16/fp16, else flash) | flash | naive | cudnn (--device cuda, bf16 or fp16)"),
    OPTC("attention-mask", OPT_STRING, attention_mask, "causal,full", "causal (GPT) | full (bidirectional, for ablations)"),
    OPT("sparse-block", OPT_INT, sparse_block,
        "blocked-sparse attention: tokens per block (0 = dense; must divide --seq-length; docs/SPARSE.md)"),
    OPT("sparse-local-blocks", OPT_INT, sparse_local_blocks,
        "blocked-sparse: window of key blocks around the query's, own block included (>= 1)"),
    OPT("sparse-global-blocks", OPT_INT, sparse_global_blocks,
        "blocked-sparse: leading key blocks every query sees (0 = none)"),
    OPTC("ulysses-comm", OPT_STRING, ulysses_comm, "alltoall,allgather",
        "Ulysses' collective: alltoall (the paper's) | allgather (full sequence, then a local slice; ablation)"),
    OPTC("ring-layout", OPT_STRING, ring_layout, "contiguous,zigzag", "ring attention token layout: contiguous | zigzag"),
    OPT("ulysses-overlap", OPT_INT, ulysses_overlap,
        "Ulysses, hybrid: split the all-to-alls into K head groups, each group's exchange overlapping the previous "
        "group's attention (non-blocking all-to-alls; on the device the comm stream; 0 or 1 = off)"),
    OPT("ulysses-degree", OPT_INT, ulysses_degree,
        "hybrid: all-to-all degree U inside each SP group (contiguous ranks), ring across the P/U groups (0 = P)"),
    OPTC("device", OPT_STRING, device, "cpu,cuda",
        "cpu | cuda (fp32 CUDA table; ranks on one machine share its GPUs round-robin; docs/GPU.md)"),
    OPTC("comm", OPT_STRING, comm, "mpi,nccl",
        "collectives: mpi (device buffers staged through host memory) | nccl (--device cuda, NCCL on device buffers)"),
    OPTC("precision", OPT_STRING, precision, "fp32,bf16,fp16",
        "fp32 | bf16 | fp16 (mixed precision: 16-bit parameters, activations and gradients, fp32 arithmetic, "
        "masters and AdamW moments; fp16 with loss scaling; --device cpu emulates it)"),
    OPT("bf16-direct", OPT_STRING, bf16_direct,
        "with --bf16-kernels fast: which calls go direct: all (default), none, or a comma list of products, "
        "attention, gelu, layernorm, residual, cross-entropy, memory, optimizer, embedding, bias, merge (to tell a "
        "wrong kernel)"),
    OPT("flash-block-rows", OPT_INT, flash_block_rows,
        "the CUDA flash attention kernels' query rows per block: 128 (8 warps, the default) | 64 (4 warps); "
        "--device cuda, bf16 or fp16, --bf16-kernels fast (docs/GPU.md)"),
    OPTC("flash-dq", OPT_STRING, flash_dq, "split,fused",
        "the CUDA flash backward's dQ: split (its own kernel, deterministic; the default) | fused (fp32 atomics in "
        "the dK/dV kernel, FlashAttention-2's way, last bits vary between runs)"),
    OPTC("flash-fwd", OPT_STRING, flash_fwd, "mma,wgmma",
        "the CUDA flash forward's tensor-core instruction: mma (mma.sync, any GPU from sm_80; the default) | wgmma "
        "(Hopper's warpgroup products: an H100/H200 and a build with sm_90a)"),
    OPTC("flash-bwd", OPT_STRING, flash_bwd, "mma,wgmma",
        "the CUDA flash backward's: mma (the default) | wgmma (Hopper; with --flash-dq fused one kernel of 128 "
        "keys per block, FlashAttention-3's products: not with --flash-block-rows 64)"),
    OPT("loss-scale", OPT_DOUBLE, loss_scale, "fp16: a static loss scale (0 = dynamic, the default)"),
    OPT("initial-loss-scale", OPT_DOUBLE, initial_loss_scale, "fp16, dynamic: the first loss scale (65536)"),
    OPT("min-loss-scale", OPT_DOUBLE, min_loss_scale, "fp16, dynamic: the scale is never halved below this (1)"),
    OPT("loss-scale-window", OPT_INT, loss_scale_window,
        "fp16, dynamic: the scale doubles after this many steps without overflow (1000)"),
    OPTC("bf16-kernels", OPT_STRING, bf16_kernels, "fast,reference",
        "the 16-bit storage's kernels (bf16 and fp16): fast (products, and in bf16 flash attention, straight from "
        "the storage: cuBLASLt tensor cores on the GPU) | reference (every operation on fp32 copies through the "
        "fp32 table); default fast on cuda, reference on cpu (docs/BF16.md)"),
    OPT("data", OPT_STRING, data, "byte-level text file (vocabulary 256); default synthetic tokens"),
    OPT("results", OPT_STRING, results, "append a summary row to this CSV file"),
    OPT("dump", OPT_STRING, dump, "write inputs, loss, gradients of iteration 1 to FILE (and FILE.ckpt)"),
    OPT("save", OPT_STRING, save, "write a checkpoint (parameters + AdamW state) at the end"),
    OPT("load", OPT_STRING, load, "start from this checkpoint"),
    OPT("loss-log", OPT_STRING, loss_log, "write iteration,loss,lr,grad_norm,time_ms per iteration to this CSV"),
    OPT("run-name", OPT_STRING, run_name, "label for the results row"),
    OPT("log-interval", OPT_INT, log_interval, "print every this many iterations"),
    OPT("timing-warmup", OPT_INT, timing_warmup, "iterations excluded from timing statistics"),
    OPT("quiet", OPT_FLAG, quiet, "no per-iteration lines"),
    OPT("memory-budget", OPT_SIZE, memory_budget,
        "bytes per rank (80GiB, 512MiB, ...): refuse a run whose predicted peak does not fit; without it the "
        "limit is the memory a rank can have (physical memory / ranks on the machine; the GPU's with --device "
        "cuda), so a budget above that lets a run try anyway"),
    OPT("overwrite", OPT_FLAG, overwrite,
        "let --save, --dump and --loss-log replace a file that is not a spbench file of their kind"),
    OPT("compare-alltoall", OPT_FLAG, compare_alltoall,
        "at the end, replay the run's all-to-alls (plain MPI_Alltoall) and ring sendrecvs alone: pack/unpack "
        "overhead, and layer communication exposed vs hidden behind compute"),
    OPT("kernel-timeline", OPT_FLAG, kernel_timeline,
        "--device cuda: a CUDA event before and after every kernel and library call of the step, folded into each "
        "phase's busy time and the GPU's idle time between kernels inside it (results columns gpu_busy_*, "
        "gpu_idle_*; docs/FORMATS.md); off by default: the events cost time"),
};
enum { NUM_OPTIONS = sizeof(options) / sizeof(options[0]) };

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

void spb_config_defaults(spb_config *c)
{
    memset(c, 0, sizeof *c);
    c->num_layers = 2;
    c->hidden_size = 64;
    c->num_heads = 4;
    c->vocab_size = 256; /* bytes */
    c->seq_length = 64;
    c->init_std = 0.02;
    c->micro_batch_size = 4;
    c->train_iters = 10;
    c->lr = 1e-3;
    c->min_lr = 0.0;
    strcpy(c->lr_decay_style, "constant");
    c->weight_decay = 0.0;
    c->adam_beta1 = 0.9;
    c->adam_beta2 = 0.95;
    c->adam_eps = 1e-8;
    c->clip_grad = 1.0;
    c->seed = 1234;
    c->sp_degree = 1;
    strcpy(c->strategy, "none");
    strcpy(c->attention, "flash");
    strcpy(c->attention_mask, "causal");
    strcpy(c->ring_layout, "contiguous");
    strcpy(c->ulysses_comm, "alltoall");
    strcpy(c->device, "cpu");
    strcpy(c->comm, "mpi");
    strcpy(c->precision, "fp32");
    c->initial_loss_scale = SPB_DEFAULT_LOSS_SCALE;
    c->min_loss_scale = 1.0;
    c->loss_scale_window = SPB_DEFAULT_LOSS_SCALE_WINDOW;
    c->log_interval = 1;
    c->timing_warmup = 1;
}

/* Decimal numbers only: optional '-', digits, for reals an optional
 * fraction and exponent.  strtol/strtod alone take leading blanks, '+',
 * hexadecimal (0x10), inf and nan, which a typo should not turn into a run. */
static int is_decimal_integer(const char *t)
{
    if (*t == '-') t++;
    if (!isdigit((unsigned char)*t)) return 0;
    while (isdigit((unsigned char)*t)) t++;
    return *t == '\0';
}

/* Length of the decimal real at the start of t (0 if none). */
static size_t decimal_real_length(const char *t)
{
    const char *p = t;
    int digits = 0;
    if (*p == '-') p++;
    while (isdigit((unsigned char)*p)) p++, digits++;
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p)) p++, digits++;
    }
    if (!digits) return 0;
    if (*p == 'e' || *p == 'E') {
        const char *e = p + 1;
        if (*e == '-' || *e == '+') e++;
        if (!isdigit((unsigned char)*e)) return (size_t)(p - t);
        while (isdigit((unsigned char)*e)) e++;
        p = e;
    }
    return (size_t)(p - t);
}

static int is_decimal_real(const char *t) { size_t n = decimal_real_length(t); return n && t[n] == '\0'; }

static int parse_value(const option_spec *o, const char *text, spb_config *cfg, char *err, size_t errlen)
{
    void *field = (char *)cfg + o->offset;
    char *end = NULL;
    errno = 0;
    switch (o->kind) {
    case OPT_INT: {
        long v = is_decimal_integer(text) ? strtol(text, &end, 10) : 0;
        if (!is_decimal_integer(text) || errno || v < INT_MIN || v > INT_MAX)
            return fail(err, errlen, "--%s: '%s' is not an integer", o->name, text);
        *(int *)field = (int)v;
        return 0;
    }
    case OPT_U64: {
        if (text[0] == '-') return fail(err, errlen, "--%s: '%s' must be a non-negative integer", o->name, text);
        unsigned long long v = is_decimal_integer(text) ? strtoull(text, &end, 10) : 0;
        if (!is_decimal_integer(text) || errno)
            return fail(err, errlen, "--%s: '%s' is not a non-negative integer", o->name, text);
        *(uint64_t *)field = (uint64_t)v;
        return 0;
    }
    case OPT_DOUBLE: {
        double v = is_decimal_real(text) ? strtod(text, &end) : NAN;
        if (!is_decimal_real(text) || !isfinite(v))
            return fail(err, errlen, "--%s: '%s' is not a finite decimal number", o->name, text);
        *(double *)field = v;
        return 0;
    }
    case OPT_SIZE:
        if (!(spb_parse_bytes(text) > 0))
            return fail(err, errlen, "--%s: '%s' is not a size of bytes (e.g. 80GiB, 512MiB)", o->name, text);
        /* kept as written */
        /* fall through */
    case OPT_STRING:
        if (strlen(text) >= o->size) return fail(err, errlen, "--%s: value longer than %zu characters", o->name, o->size - 1);
        strcpy((char *)field, text);
        return 0;
    case OPT_FLAG:
        *(int *)field = 1;
        return 0;
    }
    return fail(err, errlen, "internal: bad option kind");
}

int spb_config_parse(int argc, char **argv, spb_config *cfg, char *err, size_t errlen)
{
    unsigned char given[NUM_OPTIONS] = {0}; /* an option twice is a mistake, not "the last wins" */
    /* The command line's default attention is the fastest the build and
     * the run allow (finalize resolves it); configurations built in code
     * keep spb_config_defaults' flash. */
    strcpy(cfg->attention, "auto");
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) return 1;
        if (strncmp(arg, "--", 2) != 0) return fail(err, errlen, "unexpected argument '%s' (options start with --)", arg);
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        int k = 0;
        while (k < NUM_OPTIONS && !(strlen(options[k].name) == name_len && !strncmp(options[k].name, name, name_len))) k++;
        if (k == NUM_OPTIONS) return fail(err, errlen, "unknown option '--%.*s' (see --help)", (int)name_len, name);
        const option_spec *o = &options[k];
        if (given[k]++) return fail(err, errlen, "--%s is given twice (give each option once)", o->name);
        const char *value;
        if (o->kind == OPT_FLAG) {
            if (eq) return fail(err, errlen, "--%s takes no value", o->name);
            value = "";
        } else if (eq) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc) return fail(err, errlen, "--%s needs a value", o->name);
            value = argv[++i];
        }
        if (parse_value(o, value, cfg, err, errlen)) return -1;
    }
    return 0;
}

/* One JSON object per option, in a JSON array: name, kind (int, float, u64,
 * str, flag, size), choices (the words a value may be, or null), default
 * (as spb_config_defaults sets it; for int options 0 often means "derived").
 * The runner reads this (experiments/sweeplib.py) instead of a copy. */
void spb_config_list_options(FILE *out)
{
    static const char *kinds[] = {[OPT_INT] = "int", [OPT_DOUBLE] = "float", [OPT_U64] = "u64",
                                  [OPT_STRING] = "str", [OPT_FLAG] = "flag", [OPT_SIZE] = "size"};
    spb_config d;
    spb_config_defaults(&d);
    fprintf(out, "[\n");
    for (int k = 0; k < NUM_OPTIONS; k++) {
        const option_spec *o = &options[k];
        const void *field = (const char *)&d + o->offset;
        char strategies[256] = "";
        const char *choices = o->choices;
        if (!strcmp(o->name, "strategy")) { /* the strategies this build has */
            spb_strategy_names(strategies, sizeof strategies);
            char *w = strategies; /* "a, b" -> "a,b" */
            for (const char *c = strategies; *c; c++)
                if (*c != ' ') *w++ = *c;
            *w = '\0';
            choices = strategies;
        }
        fprintf(out, "  {\"name\": \"%s\", \"kind\": \"%s\", \"choices\": ", o->name, kinds[o->kind]);
        if (choices) {
            fputc('[', out);
            for (const char *c = choices; *c;) {
                size_t n = strcspn(c, ",");
                fprintf(out, "%s\"%.*s\"", c == choices ? "" : ", ", (int)n, c);
                c += n + (c[n] == ',');
            }
            fputc(']', out);
        } else {
            fputs("null", out);
        }
        fputs(", \"default\": ", out);
        switch (o->kind) {
        case OPT_INT: fprintf(out, "%d", *(const int *)field); break;
        case OPT_FLAG: fputs(*(const int *)field ? "true" : "false", out); break;
        case OPT_U64: fprintf(out, "%llu", (unsigned long long)*(const uint64_t *)field); break;
        case OPT_DOUBLE: fprintf(out, "%.17g", *(const double *)field); break;
        case OPT_STRING:
        case OPT_SIZE: fprintf(out, "\"%s\"", (const char *)field); break; /* defaults hold no quotes */
        }
        fprintf(out, "}%s\n", k + 1 < NUM_OPTIONS ? "," : "");
    }
    fprintf(out, "]\n");
}

void spb_config_usage(FILE *out)
{
    fprintf(out, "usage: spbench [options]   (under mpirun: world = data-parallel D x sequence-parallel P)\n");
    for (int k = 0; k < NUM_OPTIONS; k++)
        fprintf(out, "  --%-26s %s\n", options[k].name, options[k].help);
}

int spb_config_dp_degree(const spb_config *cfg, int world_size) { return world_size / cfg->sp_degree; }

int spb_config_uses_cuda_flash(const spb_config *cfg)
{
    return !strcmp(cfg->device, "cuda") && strcmp(cfg->precision, "fp32") && !strcmp(cfg->bf16_kernels, "fast") &&
           !strcmp(cfg->attention, "flash");
}
int spb_config_flash_block_rows(const spb_config *cfg) { return cfg->flash_block_rows ? cfg->flash_block_rows : 128; }
const char *spb_config_flash_dq(const spb_config *cfg) { return cfg->flash_dq[0] ? cfg->flash_dq : "split"; }
const char *spb_config_flash_fwd(const spb_config *cfg) { return cfg->flash_fwd[0] ? cfg->flash_fwd : "mma"; }
const char *spb_config_flash_bwd(const spb_config *cfg) { return cfg->flash_bwd[0] ? cfg->flash_bwd : "mma"; }
int spb_config_flash_wgmma(const spb_config *cfg)
{
    return spb_config_uses_cuda_flash(cfg) &&
           (!strcmp(spb_config_flash_fwd(cfg), "wgmma") || !strcmp(spb_config_flash_bwd(cfg), "wgmma"));
}

const char *spb_config_default_attention(const spb_config *c, int build_has_cudnn, const char **why)
{
    const char *reason = "the fastest this build has here";
    const char *pick = "flash";
    int head_dim = c->num_heads > 0 ? c->hidden_size / c->num_heads : 0;
    if (strcmp(c->device, "cuda"))
        reason = "not a CUDA device";
    else if (!build_has_cudnn)
        reason = "this build has no cuDNN 9";
    else if (strcmp(c->precision, "bf16") && strcmp(c->precision, "fp16"))
        reason = "cuDNN's fused attention takes bf16 or fp16 operands";
    else if (c->sparse_block > 0)
        reason = "blocked-sparse masks are not in the cuDNN graph";
    else if (head_dim % 8 || head_dim > 128 || head_dim <= 0)
        reason = "cuDNN's graph here takes head dims that are multiples of 8 up to 128";
    else if (c->flash_block_rows || c->flash_dq[0] || c->flash_fwd[0] || c->flash_bwd[0])
        reason = "a --flash-* variant was asked for";
    else if (c->num_query_groups > 0 && c->num_query_groups != c->num_heads)
        reason = "grouped-query attention: cuDNN runs it on K/V copied to every query head, which has not yet run "
                 "on a GPU (--attention cudnn asks for it)";
    else
        pick = "cudnn", reason = "cuDNN 9's fused attention, the fastest this build has";
    if (why) *why = reason;
    return pick;
}

int spb_config_accum_steps(const spb_config *cfg, int world_size)
{
    return cfg->global_batch_size / (cfg->micro_batch_size * spb_config_dp_degree(cfg, world_size));
}

/* Sizes: every product that sizes a buffer or indexes one, in 64-bit
 * arithmetic with overflow checks, bounded so that bytes (4 or 8 per
 * element) and int row/column counts stay representable.  Refused here,
 * before the memory model or any allocation sees them. */
#define SPB_MAX_ELEMENTS ((int64_t)1 << 40)

/* *out = the product of n factors (each >= 0); -1 if it overflows or exceeds limit. */
static int checked_product(int64_t *out, int64_t limit, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    int64_t p = 1;
    int bad = 0;
    for (int k = 0; k < n; k++) {
        int64_t f = va_arg(ap, int64_t);
        if (f < 0 || __builtin_mul_overflow(p, f, &p) || p > limit) bad = 1;
        if (bad) break;
    }
    va_end(ap);
    *out = p;
    return bad ? -1 : 0;
}

static int check_sizes(const spb_config *c, char *err, size_t errlen)
{
    const int64_t L = c->num_layers, C = c->hidden_size, F = c->ffn_hidden_size, V = c->vocab_size,
                  N = c->seq_length, B = c->micro_batch_size, Pmax = c->max_position_embeddings;
    struct { const char *what; int64_t a, b, d; } tensors[] = {
        {"the token embedding (--vocab-size x --hidden-size)", V, C, 1},
        {"the position table (--max-position-embeddings x --hidden-size)", Pmax, C, 1},
        {"the QKV weight (3 x --hidden-size^2)", 3, C, C},
        {"the MLP weight (--hidden-size x --ffn-hidden-size)", C, F, 1},
        {"the activations of a layer (--micro-batch-size x --seq-length x --ffn-hidden-size)", B, N, F},
        {"the activations of a layer (--micro-batch-size x --seq-length x 4 x --hidden-size)", B, N, 4 * C},
        {"the logits (--micro-batch-size x --seq-length x --vocab-size)", B, N, V},
    };
    int64_t elems = 0, total = 0;
    for (size_t k = 0; k < sizeof tensors / sizeof tensors[0]; k++)
        if (checked_product(&elems, SPB_MAX_ELEMENTS, 3, tensors[k].a, tensors[k].b, tensors[k].d))
            return fail(err, errlen, "%s is beyond what spbench addresses (more than 2^40 elements)", tensors[k].what);
    /* parameters: embeddings + L x (4h^2 + 3hF + small): 3hF bounds SwiGLU's three MLP matrices */
    int64_t per_layer = 0, embed = 0;
    if (checked_product(&per_layer, SPB_MAX_ELEMENTS, 2, C, 4 * C + 3 * F + 16) ||
        checked_product(&total, SPB_MAX_ELEMENTS, 2, L, per_layer) ||
        checked_product(&embed, SPB_MAX_ELEMENTS, 2, V + Pmax, C) || total + embed > SPB_MAX_ELEMENTS)
        return fail(err, errlen, "a model of --num-layers %d, --hidden-size %d, --ffn-hidden-size %d, --vocab-size %d "
                                 "has more than 2^40 parameters: beyond what spbench addresses", c->num_layers,
                    c->hidden_size, c->ffn_hidden_size, c->vocab_size);
    if (L > (1 << 24)) /* the tensor table holds ~12 entries per layer, counted in ints */
        return fail(err, errlen, "--num-layers %d is beyond what spbench addresses (at most %d)", c->num_layers, 1 << 24);
    return 0;
}

/* --model's preset and the issue-35 options' checks; fills the defaults
 * that depend on them (before the generic ffn default). */
static int model_options(spb_config *c, char *err, size_t errlen)
{
    if (!c->model[0]) strcpy(c->model, "gpt");
    if (strcmp(c->model, "gpt") && strcmp(c->model, "llama"))
        return fail(err, errlen, "unknown --model '%s' (gpt, llama)", c->model);
    if (!strcmp(c->model, "llama")) {
        if (!c->position_embedding_type[0]) strcpy(c->position_embedding_type, "rope");
        if (!c->normalization[0]) strcpy(c->normalization, "rmsnorm");
        c->swiglu = c->untie_embeddings_and_output_weights = c->disable_bias_linear = 1;
    }
    if (!c->position_embedding_type[0]) strcpy(c->position_embedding_type, "learned");
    if (!c->normalization[0]) strcpy(c->normalization, "layernorm");
    if (strcmp(c->position_embedding_type, "learned") && strcmp(c->position_embedding_type, "rope"))
        return fail(err, errlen, "unknown --position-embedding-type '%s' (learned, rope)", c->position_embedding_type);
    if (strcmp(c->normalization, "layernorm") && strcmp(c->normalization, "rmsnorm"))
        return fail(err, errlen, "unknown --normalization '%s' (layernorm, rmsnorm)", c->normalization);
    c->rope = !strcmp(c->position_embedding_type, "rope");
    c->rmsnorm = !strcmp(c->normalization, "rmsnorm");
    if (c->rotary_base == 0) c->rotary_base = 10000.0;
    if (!(c->rotary_base > 1.0)) return fail(err, errlen, "--rotary-base must be > 1 (got %g)", c->rotary_base);
    if (c->rope && (c->hidden_size / c->num_heads) % 2)
        return fail(err, errlen, "--position-embedding-type rope rotates pairs: head dim %d (hidden / heads) must be "
                                 "even", c->hidden_size / c->num_heads);
    if (c->num_query_groups == 0) c->num_query_groups = c->num_heads;
    if (c->num_query_groups < 0 || c->num_heads % c->num_query_groups)
        return fail(err, errlen, "--num-query-groups %d must divide --num-attention-heads %d", c->num_query_groups,
                    c->num_heads);
    if (c->swiglu && c->ffn_hidden_size == 0) {
        /* Megatron-LM's default for --swiglu: 2/3 of 4h, down to a multiple of 64 */
        c->ffn_hidden_size = (int)(4.0 * c->hidden_size * 2.0 / 3.0 / 64.0) * 64;
        if (c->ffn_hidden_size == 0)
            return fail(err, errlen, "--swiglu with --hidden-size %d: Megatron-LM's default MLP width "
                                     "int(8h/3 / 64)·64 is 0; give --ffn-hidden-size", c->hidden_size);
    }
    /* Every table runs these now: the CPU's fp32 table and the CUDA table
     * (common/cuda/cuda_llama_ops.cu; GQA in its attention kernels), and the
     * 16-bit tables on fp32 copies through them.  cuDNN's graph (--attention
     * cudnn) takes as many K/V heads as query heads: K and V are copied to H
     * heads before it (common/cuda/cuda_attention_gqa.h). */
    return 0;
}

static int check_positive(const char *name, long v, char *err, size_t errlen)
{
    if (v <= 0) return fail(err, errlen, "--%s must be positive (got %ld)", name, v);
    return 0;
}

int spb_config_finalize(spb_config *c, int world_size, char *err, size_t errlen)
{
    struct { const char *name; long v; } positive[] = {
        {"num-layers", c->num_layers}, {"hidden-size", c->hidden_size},
        {"num-attention-heads", c->num_heads}, {"seq-length", c->seq_length},
        {"micro-batch-size", c->micro_batch_size}, {"sp-degree", c->sp_degree},
        {"log-interval", c->log_interval},
    };
    for (size_t k = 0; k < sizeof positive / sizeof positive[0]; k++)
        if (check_positive(positive[k].name, positive[k].v, err, errlen)) return -1;
    if (c->train_iters < 0) return fail(err, errlen, "--train-iters must be >= 0 (got %d)", c->train_iters);
    if (c->timing_warmup < 0) return fail(err, errlen, "--timing-warmup must be >= 0");
    /* A row with no timed iteration would carry nan rates and zero times and bytes, which read as figures. */
    if (c->results[0] && c->train_iters <= c->timing_warmup)
        return fail(err, errlen,
                    "--results records timed iterations: --train-iters %d leaves none after --timing-warmup %d",
                    c->train_iters, c->timing_warmup);
    if (c->hidden_size % c->num_heads)
        return fail(err, errlen, "--hidden-size %d is not divisible by --num-attention-heads %d", c->hidden_size, c->num_heads);

    if (c->hidden_size > INT_MAX / 4) /* 4h below, 3h in the QKV product: ints */
        return fail(err, errlen, "--hidden-size %d is beyond what spbench addresses (at most %d)", c->hidden_size,
                    INT_MAX / 4);
    if (model_options(c, err, errlen)) return -1;
    if (c->ffn_hidden_size == 0) c->ffn_hidden_size = 4 * c->hidden_size;
    if (c->ffn_hidden_size < 0) return fail(err, errlen, "--ffn-hidden-size must be positive (got %d)", c->ffn_hidden_size);
    if (c->vocab_size <= 0) return fail(err, errlen, "--vocab-size must be positive (got %d)", c->vocab_size);
    if (c->max_position_embeddings == 0) c->max_position_embeddings = c->seq_length;
    if (c->max_position_embeddings < 0) return fail(err, errlen, "--max-position-embeddings must be positive");
    if (c->seq_length > c->max_position_embeddings)
        return fail(err, errlen, "--seq-length %d exceeds the position table (--max-position-embeddings %d)",
                    c->seq_length, c->max_position_embeddings);
    if (c->data[0] && c->vocab_size < 256)
        return fail(err, errlen, "--data is read as bytes and needs --vocab-size >= 256 (got %d)", c->vocab_size);

    if (check_sizes(c, err, errlen)) return -1;

    if (c->lr < 0 || c->min_lr < 0) return fail(err, errlen, "--lr and --min-lr must be >= 0");
    if (c->min_lr > c->lr) return fail(err, errlen, "--min-lr %g exceeds --lr %g", c->min_lr, c->lr);
    if (c->lr_warmup_iters < 0) return fail(err, errlen, "--lr-warmup-iters must be >= 0");
    if (strcmp(c->lr_decay_style, "constant") && strcmp(c->lr_decay_style, "linear") && strcmp(c->lr_decay_style, "cosine"))
        return fail(err, errlen, "unknown --lr-decay-style '%s' (constant, linear, cosine)", c->lr_decay_style);
    if (c->weight_decay < 0) return fail(err, errlen, "--weight-decay must be >= 0");
    if (!(c->adam_beta1 >= 0 && c->adam_beta1 < 1) || !(c->adam_beta2 >= 0 && c->adam_beta2 < 1))
        return fail(err, errlen, "--adam-beta1 and --adam-beta2 must be in [0, 1)");
    if (c->adam_eps <= 0) return fail(err, errlen, "--adam-eps must be positive");
    if (c->clip_grad < 0) return fail(err, errlen, "--clip-grad must be >= 0 (0 = off)");
    if (c->init_std <= 0) return fail(err, errlen, "--init-method-std must be positive");

    if (strcmp(c->device, "cpu") && strcmp(c->device, "cuda"))
        return fail(err, errlen, "unknown --device '%s' (cpu, cuda)", c->device);
    if (!spb_backend_available(c->device))
        return fail(err, errlen, "--device %s: not implemented in this build (no CUDA compiler when it was built; "
                                 "docs/GPU.md)", c->device);
    if (strcmp(c->comm, "mpi") && strcmp(c->comm, "nccl"))
        return fail(err, errlen, "unknown --comm '%s' (mpi, nccl)", c->comm);
    if (!strcmp(c->comm, "nccl") && strcmp(c->device, "cuda"))
        return fail(err, errlen, "--comm nccl needs --device cuda (NCCL moves device buffers)");
    if (c->kernel_timeline && strcmp(c->device, "cuda"))
        return fail(err, errlen, "--kernel-timeline needs --device cuda (it times the GPU's kernels)");
#ifndef SPB_HAVE_NCCL
    if (!strcmp(c->comm, "nccl"))
        return fail(err, errlen, "--comm nccl: not implemented in this build (NCCL was not found when it was built)");
#endif
    if (strcmp(c->precision, "fp32") && strcmp(c->precision, "bf16") && strcmp(c->precision, "fp16"))
        return fail(err, errlen, "unknown --precision '%s' (fp32, bf16, fp16)", c->precision);
    const int half = strcmp(c->precision, "fp32") != 0, fp16 = !strcmp(c->precision, "fp16");
    if (half && !spb_backend_for(c->device, c->precision))
        return fail(err, errlen, "--precision %s with --device %s: not implemented (the %s table is fp32; --device "
                                 "cpu --precision %s emulates mixed precision)", c->precision, c->device, c->device,
                    c->precision);
    if (half && !c->bf16_kernels[0]) strcpy(c->bf16_kernels, strcmp(c->device, "cpu") ? "fast" : "reference");
    if (c->bf16_kernels[0] && !half)
        return fail(err, errlen, "--bf16-kernels %s: applies to --precision bf16 and fp16 only (the 16-bit "
                                 "storage's kernels)", c->bf16_kernels);
    if (c->bf16_kernels[0] && strcmp(c->bf16_kernels, "fast") && strcmp(c->bf16_kernels, "reference"))
        return fail(err, errlen, "unknown --bf16-kernels '%s' (fast, reference)", c->bf16_kernels);
    if (c->bf16_direct[0]) {
        if (strcmp(c->bf16_kernels, "fast"))
            return fail(err, errlen, "--bf16-direct %s: needs --bf16-kernels fast", c->bf16_direct);
        if (spb_bf16_direct_parse_kinds(c->bf16_direct, err, errlen) < 0) return -1;
    }
    /* Loss scaling: fp16's range (largest 65504, gradients below 2^-24
     * lost) needs it; bf16 has fp32's range. */
    if (c->loss_scale < 0) return fail(err, errlen, "--loss-scale must be >= 0 (0 = dynamic)");
    if (c->initial_loss_scale <= 0 || c->min_loss_scale <= 0 || c->min_loss_scale > c->initial_loss_scale)
        return fail(err, errlen, "--initial-loss-scale and --min-loss-scale must be > 0, min <= initial (got %g, %g)",
                    c->initial_loss_scale, c->min_loss_scale);
    if (c->loss_scale_window < 1) return fail(err, errlen, "--loss-scale-window must be >= 1");
    if (!fp16 && (c->loss_scale > 0 || c->initial_loss_scale != SPB_DEFAULT_LOSS_SCALE ||
                  c->min_loss_scale != 1.0 || c->loss_scale_window != SPB_DEFAULT_LOSS_SCALE_WINDOW))
        return fail(err, errlen, "loss scaling applies to --precision fp16 only (this run is %s)", c->precision);
    if (strcmp(c->attention_mask, "causal") && strcmp(c->attention_mask, "full"))
        return fail(err, errlen, "unknown --attention-mask '%s' (causal, full)", c->attention_mask);
    c->causal = !strcmp(c->attention_mask, "causal");
    if (c->sparse_block < 0)
        return fail(err, errlen, "--sparse-block must be >= 0 (got %d; 0 = dense attention)", c->sparse_block);
    if (c->sparse_local_blocks < 0)
        return fail(err, errlen, "--sparse-local-blocks must be >= 0 (got %d)", c->sparse_local_blocks);
    if (c->sparse_global_blocks < 0)
        return fail(err, errlen, "--sparse-global-blocks must be >= 0 (got %d)", c->sparse_global_blocks);
    if (c->sparse_block == 0 && (c->sparse_local_blocks || c->sparse_global_blocks))
        return fail(err, errlen, "--sparse-local-blocks and --sparse-global-blocks need --sparse-block > 0");
    if (c->sparse_block > 0 && c->sparse_local_blocks < 1)
        return fail(err, errlen, "--sparse-block %d needs --sparse-local-blocks >= 1 (got %d; the query's own block)",
                    c->sparse_block, c->sparse_local_blocks);
    if (c->sparse_block > 0 && c->seq_length % c->sparse_block)
        return fail(err, errlen, "--sparse-block %d does not divide --seq-length %d", c->sparse_block, c->seq_length);
    if (strcmp(c->ring_layout, "contiguous") && strcmp(c->ring_layout, "zigzag"))
        return fail(err, errlen, "unknown --ring-layout '%s' (contiguous, zigzag)", c->ring_layout);
    if (strcmp(c->ulysses_comm, "alltoall") && strcmp(c->ulysses_comm, "allgather"))
        return fail(err, errlen, "unknown --ulysses-comm '%s' (alltoall, allgather)", c->ulysses_comm);
    if (!strcmp(c->attention, "auto")) {
        const spb_backend *cuda = spb_backend_for("cuda", "fp32");
        int build_has_cudnn = cuda && cuda->attention && cuda->attention("cudnn");
        strcpy(c->attention, spb_config_default_attention(c, build_has_cudnn, &c->attention_why));
        c->attention_auto = 1;
    }
    if (c->ulysses_overlap < 0) return fail(err, errlen, "--ulysses-overlap must be >= 0 (got %d)", c->ulysses_overlap);
    if (c->ulysses_overlap > 1 && strcmp(c->strategy, "ulysses") && strcmp(c->strategy, "hybrid"))
        return fail(err, errlen, "--ulysses-overlap applies to --strategy ulysses and hybrid only (this run is %s)",
                    c->strategy);
    /* the groups are all-to-alls (the allgather ablation has no groups); any device, precision and comm */
    if (c->ulysses_overlap > 1 && strcmp(c->ulysses_comm, "alltoall"))
        return fail(err, errlen, "--ulysses-overlap splits the all-to-alls into head groups: it needs "
                                 "--ulysses-comm alltoall (this run is %s)", c->ulysses_comm);
    if (c->ulysses_degree < 0) return fail(err, errlen, "--ulysses-degree must be >= 0 (got %d; 0 = P)", c->ulysses_degree);
    if (c->ulysses_degree && strcmp(c->strategy, "hybrid"))
        return fail(err, errlen, "--ulysses-degree applies to --strategy hybrid only (this run is %s)", c->strategy);
    if (!strcmp(c->attention, "cudnn")) {
        /* cuDNN's fused attention (common/cuda/cudnn_attention.h) */
        if (strcmp(c->device, "cuda"))
            return fail(err, errlen, "--attention cudnn needs --device cuda (cuDNN's fused attention runs on the GPU)");
        if (strcmp(c->precision, "bf16") && strcmp(c->precision, "fp16"))
            return fail(err, errlen, "--attention cudnn needs --precision bf16 or fp16 (cuDNN's fused attention "
                                     "takes 16-bit operands; got %s)", c->precision);
        const spb_backend *cuda = spb_backend_for("cuda", "fp32");
        if (!cuda || !cuda->attention("cudnn"))
            return fail(err, errlen, "--attention cudnn: this build has no cuDNN (it was not found when spbench was "
                                     "configured; docs/GPU.md)");
        if (c->sparse_block > 0)
            return fail(err, errlen, "--attention cudnn with --sparse-block: the cuDNN graph has dense masks only");
        int head_dim = c->num_heads > 0 ? c->hidden_size / c->num_heads : 0;
        if (head_dim % 8 || head_dim > 128)
            return fail(err, errlen, "--attention cudnn: head dim %d (hidden / heads) must be a multiple of 8 up to "
                                     "128", head_dim);
        /* --num-query-groups G < heads: the graph takes H K/V heads, so K and
         * V are copied to every query head first (cuda_attention_gqa.h) */
    } else if (!spb_attn_backend_by_name(c->attention))
        return fail(err, errlen, "unknown --attention '%s' (auto, flash, naive, cudnn)", c->attention);
    if (c->flash_block_rows || c->flash_dq[0] || c->flash_fwd[0] || c->flash_bwd[0]) {
        /* only the CUDA 16-bit direct path has these kernels: elsewhere the
         * flags would change nothing, silently */
        if (!spb_config_uses_cuda_flash(c))
            return fail(err, errlen, "--flash-block-rows, --flash-dq, --flash-fwd and --flash-bwd choose the CUDA "
                                     "flash kernels' variant: they "
                                     "need --device cuda, --precision bf16 or fp16, --bf16-kernels fast and "
                                     "--attention flash");
        if (c->flash_block_rows && c->flash_block_rows != 64 && c->flash_block_rows != 128)
            return fail(err, errlen, "--flash-block-rows must be 64 or 128 (got %d)", c->flash_block_rows);
        if (c->flash_dq[0] && strcmp(c->flash_dq, "split") && strcmp(c->flash_dq, "fused"))
            return fail(err, errlen, "unknown --flash-dq '%s' (split, fused)", c->flash_dq);
        if (c->flash_fwd[0] && strcmp(c->flash_fwd, "mma") && strcmp(c->flash_fwd, "wgmma"))
            return fail(err, errlen, "unknown --flash-fwd '%s' (mma, wgmma)", c->flash_fwd);
        if (c->flash_bwd[0] && strcmp(c->flash_bwd, "mma") && strcmp(c->flash_bwd, "wgmma"))
            return fail(err, errlen, "unknown --flash-bwd '%s' (mma, wgmma)", c->flash_bwd);
        if (!strcmp(c->flash_bwd, "wgmma") && !strcmp(c->flash_dq, "fused") && c->flash_block_rows == 64)
            return fail(err, errlen, "--flash-bwd wgmma with --flash-dq fused holds 128 keys per block: it does not "
                                     "take --flash-block-rows 64");
    }
    if (c->zero_stage < 0 || c->zero_stage > 3)
        return fail(err, errlen, "--zero-stage must be 0, 1, 2 or 3 (got %d)", c->zero_stage);

    if (world_size % c->sp_degree)
        return fail(err, errlen, "world size %d is not divisible by --sp-degree %d", world_size, c->sp_degree);
    if (c->seq_length < c->sp_degree)
        return fail(err, errlen, "--seq-length %d is shorter than --sp-degree %d: every rank needs a token",
                    c->seq_length, c->sp_degree);
    const spb_strategy *s = spb_strategy_by_name(c->strategy);
    if (!s) {
        char names[256];
        spb_strategy_names(names, sizeof names);
        return fail(err, errlen, "unknown --strategy '%s' (this build has: %s)", c->strategy, names);
    }
    /* Uneven token shares (common/runtime/split.h: the first N mod P ranks
     * hold one token more), on every device: the exchanges take per-rank
     * counts (comm.h's alltoallv, allgatherv, reduce_scatterv). */
    if (c->seq_length % c->sp_degree && !s->uneven_tokens)
        return fail(err, errlen, "--seq-length %d is not divisible by --sp-degree %d, and --strategy %s needs "
                                 "equal shares (uneven shares: ulysses, megatron, ring, allgather-kv, hybrid; any --ring-layout)",
                    c->seq_length, c->sp_degree, c->strategy);
    if (s->validate && s->validate(c, world_size, err, errlen)) return -1;

    int dp = spb_config_dp_degree(c, world_size);
    int64_t step_batch; /* sequences of one micro-step over the data-parallel ranks */
    if (checked_product(&step_batch, (int64_t)INT_MAX, 2, (int64_t)c->micro_batch_size, (int64_t)dp))
        return fail(err, errlen, "--micro-batch-size %d x data-parallel %d sequences per micro-step is beyond what "
                                 "spbench addresses (at most %d)", c->micro_batch_size, dp, INT_MAX);
    if (c->global_batch_size == 0) c->global_batch_size = (int)step_batch;
    if (c->global_batch_size < 0) return fail(err, errlen, "--global-batch-size must be positive");
    int64_t batch_tokens; /* the dump holds the whole global batch's tokens */
    if (checked_product(&batch_tokens, SPB_MAX_ELEMENTS, 2, (int64_t)c->global_batch_size, (int64_t)c->seq_length + 1))
        return fail(err, errlen, "--global-batch-size %d x --seq-length %d tokens per iteration is beyond what spbench "
                                 "addresses", c->global_batch_size, c->seq_length);
    if (c->global_batch_size % step_batch)
        return fail(err, errlen, "--global-batch-size %d is not a multiple of micro-batch %d x data-parallel %d",
                    c->global_batch_size, c->micro_batch_size, dp);

    if (c->data[0]) {
        struct stat st;
        if (stat(c->data, &st) != 0) return fail(err, errlen, "--data '%s': %s", c->data, strerror(errno));
        if (!S_ISREG(st.st_mode)) return fail(err, errlen, "--data '%s' is not a regular file", c->data);
        if (access(c->data, R_OK) != 0) return fail(err, errlen, "--data '%s': %s", c->data, strerror(errno));
        if (st.st_size < (off_t)c->seq_length + 1)
            return fail(err, errlen, "--data '%s' has %lld bytes, fewer than --seq-length + 1 = %d",
                        c->data, (long long)st.st_size, c->seq_length + 1);
    }
    if (c->memory_budget[0]) { /* in place of the machine's memory (spbench.c checks that one) */
        double budget = spb_parse_bytes(c->memory_budget);
        if (!(budget > 0)) return fail(err, errlen, "--memory-budget '%s' is not a size (e.g. 80GiB)", c->memory_budget);
        char limit[SPB_NAME_MAX + 32];
        snprintf(limit, sizeof limit, "--memory-budget %s", c->memory_budget);
        if (spb_memory_check_capacity(c, world_size, budget, limit, err, errlen)) return -1;
    }
    if (c->load[0] && access(c->load, R_OK) != 0)
        return fail(err, errlen, "--load '%s': %s", c->load, strerror(errno));
    struct stat load_st; /* a pipe or device would block or read forever */
    if (c->load[0] && (stat(c->load, &load_st) != 0 || !S_ISREG(load_st.st_mode)))
        return fail(err, errlen, "--load '%s' is not a regular file", c->load);
    return 0;
}
