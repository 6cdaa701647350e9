/* The formulas' side of the communication columns: what the strategies'
 * comm_volume and ZeRO's collectives (spb_zero_comm_items) predict a rank
 * sends per link, written beside the measured bytes. */
#ifndef SPB_PREDICTED_BYTES_H
#define SPB_PREDICTED_BYTES_H

#include "config.h"

/* The formulas' view of one iteration's traffic, per rank: the strategy's
 * comm_volume of one layer and micro-batch, that times layers, micro-steps
 * and passes (the recompute repeats the forward), and spb_zero_comm_items.
 * spbench writes them beside what it measured, spbench-model beside what
 * it predicts, under the same column names (spb_row_add_predicted_bytes). */
typedef struct spb_predicted_bytes {
    double layer_forward, layer_backward; /* bytes per link, one layer, one micro-batch */
    double strategy, zero_and_reduce;     /* bytes per link, one iteration */
} spb_predicted_bytes;
void spb_predicted_link_bytes(const spb_config *cfg, int world_size, spb_predicted_bytes *out);
struct spb_row;
void spb_row_add_predicted_bytes(struct spb_row *r, const spb_predicted_bytes *p);

#endif
