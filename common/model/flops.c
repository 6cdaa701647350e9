#include "flops.h"

double spb_paper_flops_per_iteration(const spb_config *c, int activation_checkpointing)
{
    double B = c->global_batch_size, s = c->seq_length, L = c->num_layers, h = c->hidden_size,
           V = c->vocab_size;
    double factor = activation_checkpointing ? 4.0 : 3.0;
    /* The "1" is the layer's products per token, 24h² FLOPs forward for GPT:
     * QKV 2h²(1 + 2G/H), projection 2h², MLP 4hF (GELU) or 6hF (SwiGLU's gate,
     * Megatron-LM's 3/2 factor), F = 4h.  Grouped-query attention and SwiGLU
     * change those terms (as Megatron-LM's num_floating_point_operations
     * does); for GPT they sum to 24h² exactly, the paper's formula. */
    double H = c->num_heads, G = c->num_query_groups > 0 ? c->num_query_groups : H;
    double F = c->ffn_hidden_size > 0 ? c->ffn_hidden_size : 4.0 * h;
    double products = (2.0 * (1.0 + 2.0 * G / H) + 2.0 + (c->swiglu ? 6.0 : 4.0) * F / h) / 24.0;
    return 24.0 * factor * B * s * L * h * h * (products + s / (6.0 * h) + V / (16.0 * L * h));
}
