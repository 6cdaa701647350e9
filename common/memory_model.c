#include "memory_model.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Parameter counts of the model, split into what every rank of a replica
 * group holds whole and what tensor parallelism shards. */
static void parameter_counts(const spb_config *c, double *replicated, double *shardable)
{
    double C = c->hidden_size, F = c->ffn_hidden_size, L = c->num_layers;
    /* wte, wpe, per layer: ln1, ln2 (weight and bias), proj_b, fcproj_b; lnf */
    *replicated = (double)c->vocab_size * C + (double)c->max_position_embeddings * C + L * 6.0 * C + 2.0 * C;
    /* per layer: qkv_w, qkv_b, proj_w, fc_w, fc_b, fcproj_w */
    *shardable = L * (3.0 * C * C + 3.0 * C + C * C + F * C + F + C * F);
}

static int tp_degree(const spb_config *c) { return !strcmp(c->strategy, "megatron") ? c->sp_degree : 1; }

static double ceil_div(double a, double b) { return (double)(((long)a + (long)b - 1) / (long)b); }

/* Elements a rank owns under ZeRO (common/zero.c): one slice of every
 * tensor of a replica class, each tensor cut into `ranks` padded slices. */
static double owned_under_zero(const spb_config *c, int tp, int D, int P)
{
    double C = c->hidden_size, F = c->ffn_hidden_size;
    const double whole[] = {(double)c->vocab_size * C, (double)c->max_position_embeddings * C, C, C};
    const double layer_whole[] = {C, C, C, C, C, C}; /* ln1 w/b, proj_b, ln2 w/b, fcproj_b */
    const double layer_shard[] = {3 * C * C / tp, 3 * C / tp, C * C / tp, F * C / tp, F / tp, C * F / tp};
    double rep_ranks = (double)D * P, shard_ranks = tp > 1 ? D : rep_ranks, owned = 0;
    for (int k = 0; k < 4; k++) owned += ceil_div(whole[k], rep_ranks);
    for (int l = 0; l < c->num_layers; l++) {
        for (int k = 0; k < 6; k++) owned += ceil_div(layer_whole[k], rep_ranks);
        for (int k = 0; k < 6; k++) owned += ceil_div(layer_shard[k], shard_ranks);
    }
    return owned;
}

void spb_memory_model(const spb_config *c, int world_size, spb_precision precision, spb_memory_prediction *out)
{
    memset(out, 0, sizeof *out);
    const int P = c->sp_degree, D = world_size / P, tp = tp_degree(c);
    double rep, shard;
    parameter_counts(c, &rep, &shard);
    double local = rep + shard / tp; /* parameters this rank holds */

    const double pbytes = precision == SPB_FP32 ? 4.0 : 2.0;
    out->bytes[SPB_MEM_PARAMS] = pbytes * local;
    out->bytes[SPB_MEM_GRADS] = pbytes * local;
    /* AdamW: m and v in fp32, plus fp32 master weights under mixed
     * precision; ZeRO >= 1 keeps them for the rank's slices only, and the
     * reduced gradient of those slices in fp32 beside the full local one. */
    double per_param = precision == SPB_FP32 ? 8.0 : 12.0;
    double held = c->zero_stage >= 1 ? owned_under_zero(c, tp, D, P) : local;
    out->bytes[SPB_MEM_OPTIMIZER] = per_param * held;
    if (c->zero_stage >= 1) out->bytes[SPB_MEM_GRADS] += 4.0 * held;

    /* Activations saved for backward (common/gpt.c allocates exactly these). */
    const double B = c->micro_batch_size, N = c->seq_length, T = N / P, C = c->hidden_size;
    const double Ttp = T * tp, Ca = C / tp, Fl = (double)c->ffn_hidden_size / tp, H = c->num_heads;
    const double D_head = C / H, Hl = H / tp, BT = B * T, BR = B * Ttp;
    double saved; /* the strategy's attention state per layer */
    if (!strcmp(c->strategy, "ulysses")) {
        double Hp = Hl / P;
        saved = B * N * 4.0 * Hp * D_head + B * Hp * N; /* head-layout QKV and O, log-sum-exp */
    } else {
        saved = B * Hl * Ttp; /* log-sum-exp */
    }
    double per_layer = BT * C + 2 * BT      /* ln1 out, mean, rstd */
                       + BR * 3 * Ca + BR * Ca /* qkv, attention output */
                       + saved + BT * C        /* residual after attention */
                       + BT * C + 2 * BT       /* ln2 */
                       + 2 * BR * Fl;          /* fc before and after GELU */
    double layers = c->checkpoint_activations ? 1 : c->num_layers;
    double floats = layers * per_layer + (c->num_layers + 1.0) * BT * C /* residual streams */
                    + BT * C + 2 * BT                                  /* final LayerNorm */
                    + BT * c->vocab_size;                              /* probabilities */
    double abytes = precision == SPB_FP32 ? 4.0 : 2.0;
    out->bytes[SPB_MEM_ACTIVATIONS] = abytes * floats + 4.0 * 2 * BT; /* + input and target tokens */

    for (int k = 0; k < SPB_MEM_NUM_CATEGORIES; k++) out->total += out->bytes[k];
}

double spb_parse_bytes(const char *text)
{
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || v < 0) return -1;
    static const struct { const char *suffix; double scale; } units[] = {
        {"", 1.0}, {"B", 1.0}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
        {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++)
        if (!strcasecmp(end, units[k].suffix)) return v * units[k].scale;
    return -1;
}
