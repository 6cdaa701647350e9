/* Checkpoints and gradient dumps (formats in docs/FORMATS.md). */
#ifndef SPB_CHECKPOINT_H
#define SPB_CHECKPOINT_H

#include <stddef.h>

#include "config.h"
#include "gpt.h"
#include "optimizer.h"

/* params, m, v: this rank's whole local vectors (g->params' layout; ZeRO
 * gathers its slices into them first, common/train.c).  Collective over
 * g's grid (tensor-parallel shards are gathered); world rank 0 writes,
 * atomically (temporary file, then rename).  m and v may be NULL (no
 * optimizer state).  The return value is the writer's; others return 0. */
int spb_checkpoint_save(const char *path, const spb_config *cfg, const spb_gpt *g, const float *params,
                        const float *m, const float *v, long step, char *err, size_t errlen);
/* Checks the header against cfg; fills this rank's local params (and m, v
 * when the file has optimizer state and they are not NULL; *has_optimizer
 * says whether it had); *step gets the saved step.  Every rank reads it. */
int spb_checkpoint_load(const char *path, const spb_config *cfg, const spb_gpt *g, float *params, float *m,
                        float *v, long *step, int *has_optimizer, char *err, size_t errlen);

/* inputs, targets: [B][T] of the whole global batch. */
int spb_dump_write(const char *path, int B, int T, int V, const int *inputs, const int *targets, double loss,
                   const float *grads, long num_params, char *err, size_t errlen);

#endif
