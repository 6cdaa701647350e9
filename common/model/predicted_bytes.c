#include "predicted_bytes.h"

#include "checks.h"
#include "memory_model.h"
#include "report.h"
#include "strategy.h"
#include "zero.h"

void spb_predicted_link_bytes(const spb_config *c, int world_size, spb_predicted_bytes *out)
{
    const spb_strategy *st = spb_strategy_by_name(c->strategy);
    SPB_CHECK(st);
    spb_comm_volume vol = st->comm_volume(c, c->sp_degree);
    /* The formulas count fp32 elements; under bf16 every buffer sent holds
     * 2-byte elements (comm.h's element_bytes). */
    const double scale = spb_memory_precision(c) == SPB_BF16_MIXED ? 0.5 : 1.0;
    double passes = vol.forward_bytes * (c->checkpoint_activations ? 2 : 1) + vol.backward_bytes;
    *out = (spb_predicted_bytes){.layer_forward = scale * vol.forward_bytes,
                                 .layer_backward = scale * vol.backward_bytes,
                                 .strategy = scale * spb_config_accum_steps(c, world_size) * c->num_layers * passes};
    spb_comm_item items[SPB_ZERO_MAX_ITEMS];
    int n = spb_zero_comm_items(c, world_size, items);
    for (int k = 0; k < n; k++) out->zero_and_reduce += scale * items[k].link_bytes;
}

void spb_row_add_predicted_bytes(struct spb_row *r, const spb_predicted_bytes *p)
{
    spb_row_add(r, "predicted_layer_forward_link_bytes", "%.0f", p->layer_forward);
    spb_row_add(r, "predicted_layer_backward_link_bytes", "%.0f", p->layer_backward);
    spb_row_add(r, "predicted_strategy_link_bytes", "%.0f", p->strategy);
    spb_row_add(r, "predicted_zero_and_reduce_link_bytes", "%.0f", p->zero_and_reduce);
}
