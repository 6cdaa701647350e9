/* Checkpoints and gradient dumps (formats in docs/FORMATS.md). */
#ifndef SPB_CHECKPOINT_H
#define SPB_CHECKPOINT_H

#include <stddef.h>

#include "config.h"
#include "gpt.h"
#include "optimizer.h"

/* The training state besides the vectors: AdamW's own step count (an fp16
 * run skips the update of an overflowing iteration, so it can trail the
 * iteration) and the loss scaler's state.  Files written before these
 * existed read as optimizer_step = the saved step, loss_scale = 0 (none). */
typedef struct spb_checkpoint_state {
    long optimizer_step;
    double loss_scale;   /* 0: not saved */
    long clean_steps;    /* since the scale last changed */
    long skipped_steps;  /* updates skipped for overflow, in total */
} spb_checkpoint_state;

/* params, m, v: this rank's whole local vectors (g->params' layout; ZeRO
 * gathers its slices into them first, common/core/train.c).  Collective over
 * g's grid (tensor-parallel shards are gathered); world rank 0 writes,
 * atomically (temporary file, then rename).  m and v may be NULL (no
 * optimizer state).  The return value is the writer's; others return 0. */
int spb_checkpoint_save(const char *path, const spb_config *cfg, const spb_gpt *g, const float *params,
                        const float *m, const float *v, long step, const spb_checkpoint_state *state, char *err,
                        size_t errlen);
/* Checks the header against cfg; fills this rank's local params (and m, v
 * when the file has optimizer state and they are not NULL; *has_optimizer
 * says whether it had); *step gets the saved step, *state the rest.  Every
 * rank reads it. */
int spb_checkpoint_load(const char *path, const spb_config *cfg, const spb_gpt *g, float *params, float *m,
                        float *v, long *step, int *has_optimizer, spb_checkpoint_state *state, char *err,
                        size_t errlen);

/* inputs, targets: [B][T] of the whole global batch. */
int spb_dump_write(const char *path, int B, int T, int V, const int *inputs, const int *targets, double loss,
                   const float *grads, long num_params, char *err, size_t errlen);

/* Readers for tools (spbench-dump-compare): 0, or -1 with a message.
 * A dump's contents: tokens holds the inputs then the targets. */
typedef struct spb_dump {
    long B, T, V, num_params;
    double loss;
    int *tokens; /* 2·B·T */
    float *grads;
} spb_dump;
int spb_dump_read(const char *path, spb_dump *d, char *err, size_t errlen);
void spb_dump_free(spb_dump *d);
/* The model's shape in a checkpoint's header into cfg's model fields
 * (num_layers ... seq_length; everything else spb_config_defaults'). */
int spb_checkpoint_read_model(const char *path, spb_config *cfg, char *err, size_t errlen);

#endif
