#define _DEFAULT_SOURCE
#include "memory_limit.h"

#include <stdio.h>
#include <unistd.h>

#include "memory_model.h"

/* "3.750 GiB", "176.000 KiB": a figure that stays readable for tiny budgets. */
static const char *human(double bytes, char *buf, size_t len)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 5) bytes /= 1024.0, u++;
    snprintf(buf, len, "%.3f %s", bytes, units[u]);
    return buf;
}

double spb_host_memory_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (double)pages * (double)page : 0.0;
}

int spb_memory_check_capacity(const spb_config *c, int world_size, double capacity, const char *limit, char *err,
                              size_t errlen)
{
    if (!(capacity > 0)) return 0;
    char b0[32], b1[32], b2[32], b3[32], b4[32];
    /* Every parameter is held by some rank in at least 2 bytes: the whole
     * model over the world is a floor on the largest rank's share (ZeRO-3
     * and tensor-parallel splits included). */
    double params = ((double)c->vocab_size + c->max_position_embeddings) * c->hidden_size +
                    (double)c->num_layers * c->hidden_size * (4.0 * c->hidden_size + 2.0 * c->ffn_hidden_size);
    double floor_bytes = 2.0 * params / (world_size > 0 ? world_size : 1);
    if (floor_bytes > capacity) {
        snprintf(err, errlen, "predicted more than %s per rank (the parameters alone, %.3g of them, over %d ranks; "
                 "%s) exceeds %s", human(floor_bytes, b0, sizeof b0), params, world_size, c->precision, limit);
        return -1;
    }
    spb_memory_prediction pred;
    spb_memory_model(c, world_size, spb_memory_precision(c), &pred);
    /* --dump: rank 0 also holds the global batch's tokens (inputs and
     * targets) and the whole gradient twice (common/checkpoint.c's writer) */
    double dump_bytes = c->dump[0] ? 8.0 * c->global_batch_size * (double)c->seq_length + 8.0 * params : 0.0;
    if (dump_bytes > 0 && pred.total + dump_bytes > capacity) {
        snprintf(err, errlen, "predicted %s per rank and %s more for --dump (the global batch's tokens and the "
                 "whole gradient; %s) exceeds %s", human(pred.total, b0, sizeof b0),
                 human(dump_bytes, b1, sizeof b1), c->precision, limit);
        return -1;
    }
    if (pred.total > capacity) {
        snprintf(err, errlen, "predicted %s per rank (parameters %s, gradients %s, optimizer %s, activations %s; %s) "
                 "exceeds %s", human(pred.total, b0, sizeof b0), human(pred.bytes[SPB_MEM_PARAMS], b1, sizeof b1),
                 human(pred.bytes[SPB_MEM_GRADS], b2, sizeof b2), human(pred.bytes[SPB_MEM_OPTIMIZER], b3, sizeof b3),
                 human(pred.bytes[SPB_MEM_ACTIVATIONS], b4, sizeof b4), c->precision, limit);
        return -1;
    }
    return 0;
}
