#include "memory_model.h"

#include "gpt.h"
#include "split.h"
#include "zero.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void spb_memory_model(const spb_config *c, int world_size, spb_precision precision, spb_memory_prediction *out)
{
    memset(out, 0, sizeof *out);
    const int P = c->sp_degree, tp = spb_gpt_config_tp(c);
    /* From the core's own tensor table (common/core/gpt.c, zero.c). */
    spb_zero_sizes z;
    spb_zero_sizes_of(c, world_size, &z);
    const double local = z.local; /* parameters this rank holds whole */

    /* fp32 everywhere (--precision fp32); under mixed precision bf16
     * parameters and gradients, fp32 master weights with the AdamW moments
     * (12 bytes per owned element: ZeRO-1/2 partition the masters with the
     * moments, as DeepSpeed does) and fp32 reduced gradient slices. */
    const double pbytes = precision == SPB_FP32 ? 4.0 : 2.0, per_param = precision == SPB_FP32 ? 8.0 : 12.0;
    const int stage = c->zero_stage;
    /* Stage 3 keeps only the owned parameter slices. */
    out->bytes[SPB_MEM_PARAMS] = pbytes * (stage == 3 ? z.owned : local);
    /* Stages 0-1 keep the whole local gradient (stage 1 plus its reduced
     * slices); stages 2-3 the reduced slices plus, at the peak of backward,
     * the globals' gradient buffer and one layer's (common/core/zero.c). */
    if (stage <= 1)
        out->bytes[SPB_MEM_GRADS] = pbytes * local + (stage == 1 ? 4.0 * z.owned : 0.0);
    else
        out->bytes[SPB_MEM_GRADS] = 4.0 * z.owned + pbytes * (z.global_elems + z.layer_elems);
    out->bytes[SPB_MEM_OPTIMIZER] = per_param * (stage >= 1 ? z.owned : local);
    /* Workspace: only ZeRO-3's gathered parameters (the globals for the
     * whole step, one layer at a time) are predicted; scratch is measured. */
    if (stage == 3) out->bytes[SPB_MEM_WORKSPACE] = pbytes * (z.global_elems + z.layer_elems);

    /* Activations saved for backward (common/core/gpt.c allocates exactly these). */
    /* T: the largest rank's share, ⌈N/P⌉ when P does not divide N
     * (common/runtime/split.h; rank 0's when contiguous, a zigzag rank
     * r's c_r + c_{2P-1-r} chunks reach it too: strategies/ring.c), so the
     * prediction is that rank's and bounds every other. */
    const double B = c->micro_batch_size, N = c->seq_length, T = (double)spb_split_max(c->seq_length, P),
                 C = c->hidden_size;
    /* A TP region (Megatron-SP) holds all N tokens, equal shares or not. */
    const double Ttp = tp > 1 ? N : T, Ca = C / tp, Fl = (double)c->ffn_hidden_size / tp, H = c->num_heads;
    const double D_head = C / H, Hl = H / tp, BT = B * T, BR = B * Ttp;
    /* The strategy's attention state per layer: its log-sum-exp, and for
     * Ulysses the head-layout QKV and O before it: H/U query heads of the
     * U·T tokens of its all-to-all group (U = P: all N; the hybrid's groups
     * of --ulysses-degree U hold N/R, R = P/U, and their ring keeps the
     * log-sum-exp of those).  allgather-kv keeps the log-sum-exp of its
     * own queries, as ring does. */
    /* K/V heads in a rank's qkv (common/core/gpt.c): G/TP, or 1 replicated
     * head when G < TP (Megatron-SP), and under Ulysses and the hybrid
     * max(G, U) (one replica per rank of the group when G < U). */
    const int hybrid = !strcmp(c->strategy, "hybrid");
    const int ulysses = !strcmp(c->strategy, "ulysses") || hybrid;
    const double U = hybrid && c->ulysses_degree > 0 ? c->ulysses_degree : P;
    const double G = c->num_query_groups > 0 ? c->num_query_groups : H;
    const double Gq = ulysses ? (G > U ? G : U) : G >= tp ? G / tp : 1;
    const double fc_width = c->swiglu ? 3 * Fl : 2 * Fl; /* pre-activation ([gate | up] under SwiGLU) and after */
    double lse, head_copies = 0;
    if (ulysses) {
        /* the head side: all N for plain Ulysses; the hybrid's largest
         * ring block is ⌈N/R⌉ (N/R when equal; group 0's when contiguous,
         * a zigzag group's chunk pair otherwise), and that group's rank
         * u = 0 holds the largest T too, as ⌈⌈N/R⌉/U⌉ = ⌈N/P⌉, and the
         * most heads */
        double Ng = U == P ? N : (double)spb_split_max(c->seq_length, (int)(P / U));
        /* heads of the largest rank: H/U, or ⌈H/P⌉ under uneven head groups
         * (no GQA there: its K/V heads are its query heads) */
        const int uneven_heads = (long)Hl % (long)U != 0;
        double Hp = uneven_heads ? (double)spb_split_max((long)Hl, (int)U) : Hl / U;
        double kvp = uneven_heads ? Hp : Gq / U;
        head_copies = B * Ng * (2.0 * Hp + 2.0 * kvp) * D_head; /* Q/K/V and O, head layout */
        lse = B * Hp * Ng;
    } else {
        lse = B * Hl * Ttp;
    }
    /* Values: what mixed precision keeps in bf16.  Statistics: LayerNorm
     * means and reciprocal deviations and the log-sum-exp, which stay fp32
     * (a bf16 log-sum-exp of a few units errs by ~1e-2 absolute, scaling
     * every recomputed softmax row by that much). */
    double per_layer = BT * C                  /* ln1 out */
                       + BR * (Hl + 2 * Gq) * D_head + BR * Ca /* qkv, attention output */
                       + head_copies + BT * C  /* residual after attention */
                       + BT * C                /* ln2 out */
                       + BR * fc_width;        /* fc before and after the activation */
    double stats_per_layer = 2 * BT + 2 * BT + lse; /* ln1, ln2 mean and rstd; log-sum-exp */
    double layers = c->checkpoint_activations ? 1 : c->num_layers;
    double values = layers * per_layer + (c->num_layers + 1.0) * BT * C /* residual streams */
                    + BT * C                                           /* final LayerNorm out */
                    + BT * c->vocab_size;                              /* probabilities */
    double stats = layers * stats_per_layer + 2 * BT;                 /* + final LayerNorm's */
    double vbytes = precision == SPB_FP32 ? 4.0 : 2.0;
    out->bytes[SPB_MEM_ACTIVATIONS] = vbytes * values + 4.0 * stats + 4.0 * 2 * BT; /* + input and target tokens */

    /* The device's fixed-size workspaces (growing buffers held for the run;
     * other scratch stays measured only). */
    if (!strcmp(c->device, "cuda")) {
        /* RoPE's angle table (common/cuda/cuda_llama_ops.cu): fp32 cos and
         * sin of the Ttp tokens' D/2 angles, the core's calls' tokens. */
        if (c->rope) out->bytes[SPB_MEM_WORKSPACE] += 4.0 * Ttp * D_head;
        /* --attention cudnn with G < H: K and V copied to the call's query
         * heads, [B][keys][heads][D] each, in the operands' type (2 bytes on
         * the direct path, --bf16-kernels fast; 4 through the fp32 frames),
         * and the copies' fp32 dK, dV (common/cuda/cuda_attention_gqa.h),
         * for the largest call: Ulysses' and the hybrid's Hp heads against
         * all keys of their head layout (Ng), ring's H heads against a block
         * of T keys (zigzag's calls are no larger), Megatron-SP's H/TP heads
         * and every other strategy's H heads against all N. */
        if (!strcmp(c->attention, "cudnn") && G < H) {
            const int ring = !strcmp(c->strategy, "ring");
            double call_heads = Hl, call_keys = ring ? T : N;
            if (ulysses) {
                const int uneven_heads = (long)Hl % (long)U != 0;
                call_heads = uneven_heads ? (double)spb_split_max((long)Hl, (int)U) : Hl / U;
                call_keys = U == P ? N : (double)spb_split_max(c->seq_length, (int)(P / U));
            }
            const double copy_bytes = precision != SPB_FP32 && !strcmp(c->bf16_kernels, "fast") ? 2.0 : 4.0;
            out->bytes[SPB_MEM_WORKSPACE] += (2.0 * copy_bytes + 8.0) * B * call_keys * call_heads * D_head;
        }
    }

    for (int k = 0; k < SPB_MEM_NUM_CATEGORIES; k++) out->total += out->bytes[k];
}

spb_precision spb_memory_precision(const spb_config *c)
{
    /* fp16 stores what bf16 stores: 2-byte elements, fp32 masters and moments */
    return !strcmp(c->precision, "bf16") || !strcmp(c->precision, "fp16") ? SPB_BF16_MIXED : SPB_FP32;
}

double spb_parse_bytes(const char *text)
{
    /* A decimal number only: strtod alone would take blanks, hexadecimal,
     * inf and nan ("--memory-budget nan" must not mean "no budget"). */
    const char *p = text;
    int digits = 0;
    while (isdigit((unsigned char)*p)) p++, digits++;
    if (*p == '.')
        for (p++; isdigit((unsigned char)*p); p++) digits++;
    if (!digits) return -1;
    if ((*p == 'e' || *p == 'E') && isdigit((unsigned char)p[1 + (p[1] == '-' || p[1] == '+')])) {
        p += 1 + (p[1] == '-' || p[1] == '+');
        while (isdigit((unsigned char)*p)) p++;
    }
    char *end = NULL;
    double v = strtod(text, &end);
    if (end != p || !isfinite(v) || v < 0) return -1;
    static const struct { const char *suffix; double scale; } units[] = {
        {"", 1.0}, {"B", 1.0}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
        {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++)
        if (!strcasecmp(end, units[k].suffix)) return v * units[k].scale;
    return -1;
}
