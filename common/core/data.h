/* Training data: synthetic tokens or a file read as bytes.  Sequence s of
 * iteration i is a pure function of (seed, i, s), so any split of the global
 * batch over ranks sees the same tokens. */
#ifndef SPB_DATA_H
#define SPB_DATA_H

#include <stdint.h>

#include "config.h"

typedef struct spb_data {
    int vocab;
    uint64_t seed;
    unsigned char *bytes; /* NULL: synthetic */
    long nbytes;
} spb_data;

spb_data *spb_data_open(const spb_config *cfg); /* aborts on I/O error (validated before) */
void spb_data_close(spb_data *d);

/* The T+1 tokens of global sample `sample` of iteration `it`:
 * inputs are tokens[0..T), targets tokens[1..T]. */
void spb_data_sequence(const spb_data *d, long it, long sample, int T, int *tokens);

#endif
