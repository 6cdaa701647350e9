/* What the strategy suites share: building a trainer on a communicator and
 * the per-tensor comparison of global vectors. */
#ifndef SPB_TESTS_STRATEGY_CHECK_H
#define SPB_TESTS_STRATEGY_CHECK_H

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memory.h"
#include "memory_model.h"
#include "train.h"

static inline spb_trainer *make(spb_config *c, MPI_Comm comm, spb_grid *grid)
{
    int size;
    MPI_Comm_size(comm, &size);
    char err[256];
    ck_assert_msg(spb_config_finalize(c, size, err, sizeof err) == 0, "%s", err);
    spb_grid_create_nested(grid, comm, c->sp_degree, c->ulysses_degree);
    return spb_trainer_create(c, grid);
}

/* A trainer's reduced gradients as one global vector (collective; the
 * caller frees it). */
static inline float *global_grads(const spb_trainer *t)
{
    float *local = malloc(sizeof(float) * (size_t)t->gpt->num_params);
    float *global = malloc(sizeof(float) * (size_t)t->gpt->num_global_params);
    spb_trainer_local_grads(t, local);
    spb_gpt_gather_global(t->gpt, local, global);
    free(local);
    return global;
}

/* The categories the memory model predicts, in the order below. */
static const spb_mem_category spb_modelled_categories[4] = {SPB_MEM_PARAMS, SPB_MEM_GRADS, SPB_MEM_OPTIMIZER,
                                                            SPB_MEM_ACTIVATIONS};

/* One step of a trainer made from c on 4 ranks of world: the allocator's
 * peak per modelled category (above what was allocated before) and the
 * memory model's figure at c's precision. */
static inline void step_peaks_and_model(spb_config *c, double measured[4], double model[4])
{
    size_t before[SPB_MEM_NUM_CATEGORIES];
    memcpy(before, spb_mem_get_stats()->current, sizeof before);
    spb_mem_reset_peaks();
    spb_grid g;
    spb_trainer *t = make(c, MPI_COMM_WORLD, &g);
    spb_trainer_step(t);
    spb_memory_prediction pred;
    spb_memory_model(c, 4, spb_memory_precision(c), &pred);
    for (int i = 0; i < 4; i++) {
        spb_mem_category k = spb_modelled_categories[i];
        measured[i] = (double)(spb_mem_get_stats()->peak[k] - before[k]);
        model[i] = pred.bytes[k];
    }
    spb_trainer_destroy(t);
    spb_grid_destroy(&g);
}

/* Worst per-tensor ||a - b|| / ||b|| over the global tensors. */
static inline double worst_tensor_error(const spb_gpt *ref, const float *a, const float *b, const char **worst_name)
{
    double worst = 0;
    for (int k = 0; k < ref->num_tensors; k++) {
        const spb_param_tensor *t = &ref->tensors[k];
        double num = 0, den = 0;
        for (long i = t->goffset; i < t->goffset + t->numel; i++) {
            num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
            den += (double)b[i] * b[i];
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        if (rel > worst) worst = rel, *worst_name = t->name;
    }
    return worst;
}

/* The distributed trainer's parameters gathered to the global layout, against
 * the reference's: the worst relative tensor error and its tensor (collective). */
static inline double params_error(const spb_trainer *ref, const spb_trainer *dist, const char **where)
{
    float *local = malloc(sizeof(float) * (size_t)dist->gpt->num_params);
    float *global = malloc(sizeof(float) * (size_t)ref->gpt->num_global_params);
    spb_trainer_local_params(dist, local);
    spb_gpt_gather_global(dist->gpt, local, global);
    double err = worst_tensor_error(ref->gpt, global, ref->gpt->params, where);
    free(local);
    free(global);
    return err;
}

/* A small training run of one strategy: its variant options (Ulysses'
 * collective, ring's layout), micro-batch, ZeRO stage, sequence-parallel
 * degree P and activation checkpointing. */
typedef struct small_case {
    const char *strategy, *comm, *layout;
    int micro, zero, sp, checkpoint;
} small_case;

/* The case on 2 layers, hidden 32, 4 heads, vocab 64, 32 tokens, global
 * batch 4 (not yet finalized). */
static inline void small_case_config(spb_config *c, const small_case *k)
{
    spb_config_defaults(c);
    c->num_layers = 2, c->hidden_size = 32, c->num_heads = 4, c->vocab_size = 64, c->seq_length = 32;
    c->micro_batch_size = k->micro, c->global_batch_size = 4, c->zero_stage = k->zero;
    c->sp_degree = k->sp, c->checkpoint_activations = k->checkpoint;
    snprintf(c->strategy, sizeof c->strategy, "%s", k->strategy);
    snprintf(c->ulysses_comm, sizeof c->ulysses_comm, "%s", k->comm);
    snprintf(c->ring_layout, sizeof c->ring_layout, "%s", k->layout);
}

/* 1 when the two trainers hold the same local parameters, bit for bit
 * (collective under ZeRO-3). */
static inline int same_local_params(const spb_trainer *a, const spb_trainer *b)
{
    long n = a->gpt->num_params;
    if (b->gpt->num_params != n) return 0;
    float *pa = malloc(sizeof(float) * (size_t)n), *pb = malloc(sizeof(float) * (size_t)n);
    ck_assert(pa && pb);
    spb_trainer_local_params(a, pa);
    spb_trainer_local_params(b, pb);
    int same = memcmp(pa, pb, sizeof(float) * (size_t)n) == 0;
    free(pa);
    free(pb);
    return same;
}

#endif
