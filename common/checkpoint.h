/* Checkpoints and gradient dumps (formats in docs/FORMATS.md). */
#ifndef SPB_CHECKPOINT_H
#define SPB_CHECKPOINT_H

#include <stddef.h>

#include "config.h"
#include "gpt.h"
#include "optimizer.h"

/* Collective over g's grid (sharded tensors are gathered); world rank 0 of
 * the grid writes, atomically (temporary file, then rename).  opt may be
 * NULL.  The return value is the writer's; other ranks return 0. */
int spb_checkpoint_save(const char *path, const spb_config *cfg, const spb_gpt *g, const spb_adamw *opt,
                        long step, char *err, size_t errlen);
/* Checks the header against cfg; fills this rank's shards of params (and
 * opt if the file has optimizer state and opt is not NULL); *step gets the
 * saved step.  Every rank reads the file. */
int spb_checkpoint_load(const char *path, const spb_config *cfg, spb_gpt *g, spb_adamw *opt, long *step,
                        char *err, size_t errlen);

/* inputs, targets: [B][T] of the whole global batch. */
int spb_dump_write(const char *path, int B, int T, int V, const int *inputs, const int *targets, double loss,
                   const float *grads, long num_params, char *err, size_t errlen);

#endif
