#include "data.h"

#include <stdio.h>
#include <stdlib.h>

#include "checks.h"
#include "rng.h"

/* Streams of the counter-based generator that data uses (initialisation
 * uses the tensor index as its stream). */
#define DATA_STREAM 0x64617461ull /* "data" */

spb_data *spb_data_open(const spb_config *cfg)
{
    spb_data *d = SPB_CHECK_PTR(calloc(1, sizeof *d));
    d->vocab = cfg->vocab_size;
    d->seed = cfg->seed;
    if (!cfg->data[0]) return d;
    FILE *f = fopen(cfg->data, "rb");
    if (!f) SPB_DIE("cannot open --data '%s'", cfg->data);
    if (fseek(f, 0, SEEK_END) != 0) SPB_DIE("cannot seek --data '%s'", cfg->data);
    d->nbytes = ftell(f);
    rewind(f);
    d->bytes = SPB_CHECK_PTR(malloc((size_t)d->nbytes));
    if (fread(d->bytes, 1, (size_t)d->nbytes, f) != (size_t)d->nbytes) SPB_DIE("short read of --data '%s'", cfg->data);
    fclose(f);
    return d;
}

void spb_data_close(spb_data *d)
{
    if (!d) return;
    free(d->bytes);
    free(d);
}

void spb_data_sequence(const spb_data *d, long it, long sample, int T, int *tokens)
{
    if (d->bytes) {
        long start = (long)spb_rng_below(d->seed ^ DATA_STREAM, (uint64_t)it, (uint64_t)sample,
                                         (uint64_t)(d->nbytes - T));
        for (int t = 0; t <= T; t++) tokens[t] = d->bytes[start + t];
    } else {
        uint64_t stream = ((uint64_t)it << 32) ^ (uint64_t)sample;
        for (int t = 0; t <= T; t++)
            tokens[t] = (int)spb_rng_below(d->seed ^ DATA_STREAM, stream, (uint64_t)t, (uint64_t)d->vocab);
    }
}
