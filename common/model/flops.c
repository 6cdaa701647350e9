#include "flops.h"

double spb_paper_flops_per_iteration(const spb_config *c, int activation_checkpointing)
{
    double B = c->global_batch_size, s = c->seq_length, L = c->num_layers, h = c->hidden_size,
           V = c->vocab_size;
    double factor = activation_checkpointing ? 4.0 : 3.0;
    return 24.0 * factor * B * s * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h));
}
