/* ZeRO stages 1-3 over the ranks that hold replicas of a parameter:
 * tensors replicated over the sequence and data ranks form one class
 * (group D x P, the paper's extension), tensor-parallel shards another
 * (group D).  Each tensor of a class is cut into one padded slice per rank
 * of its group; a rank owns slice `rank` of every tensor of the class.
 *
 *   stage 1  AdamW moments for the owned slices only; gradients all-reduced
 *            after the last micro-step (as stage 0), parameters allgathered
 *            after the update.
 *   stage 2  + no whole gradient vector: each unit (a layer, or the
 *            embeddings with the final LayerNorm) gets a gradient buffer for
 *            its backward, reduce-scattered into the owned slices right
 *            after it, every micro-step.
 *   stage 3  + no whole parameter vector: a rank keeps its parameter slices;
 *            a layer's parameters are allgathered before its forward and
 *            again before its backward (which also serves the recompute
 *            under activation checkpointing) and freed after each; the
 *            globals are gathered before forward and freed after backward.
 *
 * ZeRO's own traffic (reduce-scatters, parameter allgathers) is recorded
 * under phase "zero"; stage 1's all-reduce under "grad_reduce". */
#ifndef SPB_ZERO_H
#define SPB_ZERO_H

#include <stdint.h>

#include "comm.h"
#include "config.h"
#include "gpt.h"
#include "grid.h"

typedef struct spb_zero_segment {
    long packed_lo;    /* where this tensor's slice starts in the rank's slice vectors */
    long n;            /* elements of the slice that exist (the last slice is shorter) */
    long param_offset; /* where they sit in the rank's whole parameter vector */
    /* Elements [uncounted_lo, uncounted_lo + uncounted_n) of the slice are
     * Megatron-SP K/V replicas another rank counts in the gradient norm
     * (kv_replicas.h); 0 elsewhere. */
    long uncounted_lo, uncounted_n;
    int decay;
} spb_zero_segment;

typedef struct spb_zero_class {
    MPI_Comm comm;
    int size, rank;
    int num_tensors, *tensors; /* indices into the gpt's tensor table, in order */
    long n;                    /* elements of the class */
    long slice;                /* this rank's owned elements, padding included */
    float *packed;             /* stages 1-2: one tensor, padded to a multiple of size */
    float *p;                  /* stage 3: [slice] the owned parameter slices */
    float *m, *v, *grad;       /* [slice] AdamW moments and reduced gradient of the owned slices */
    float *reduced;            /* stages 2-3: one tensor's reduce-scattered slice */
    spb_zero_segment *segments; /* one per tensor of the class */
} spb_zero_class;

typedef struct spb_zero {
    const struct spb_backend *be; /* the model's device: slices and buffers live there */
    int stage;
    long step;
    int num_classes;
    spb_zero_class cls[2];
    int *tensor_class, *tensor_segment; /* per gpt tensor */
    long *work_offset;  /* per gpt tensor: where it sits in its unit's padded buffer */
    long layer_elems, global_elems; /* padded size of a layer's and of the globals' buffer */
    float *layer_params, *global_params; /* stage 3: the gathered units (NULL when freed) */
    float *layer_grads, *global_grads;   /* stages 2-3: the units' gradient buffers */
} spb_zero;

/* Stage 3 initialises the owned parameter slices from seed (the whole
 * vector does not exist); stages 2-3 install the gpt's unit hooks. */
spb_zero *spb_zero_create(spb_gpt *g, const spb_grid *grid, int stage, uint64_t seed);
void spb_zero_destroy(spb_zero *z);
/* Before the first micro-step of an iteration (stages 2-3 accumulate the
 * reduced slices over micro-steps). */
void spb_zero_begin_gradients(spb_zero *z);
/* After the last micro-step: stage 1 all-reduces the whole gradient and
 * keeps its slices; stages 2-3 have reduced already. */
void spb_zero_reduce_gradients(spb_zero *z, const spb_gpt *g);
/* Global gradient norm from the owned slices (one reduction over world). */
double spb_zero_grad_norm(const spb_zero *z, MPI_Comm world);
/* AdamW on the owned slices; stages 1-2 then allgather the parameters. */
void spb_zero_update(spb_zero *z, spb_gpt *g, const spb_config *cfg, double lr, float grad_scale);

/* Partitioned state <-> this rank's whole local vector (the layout of
 * g->params), for checkpoints, dumps and tests.  gather is collective over
 * each class's group (phase "other"); scatter keeps the owned slices. */
typedef enum spb_zero_state { SPB_ZERO_PARAMS, SPB_ZERO_M, SPB_ZERO_V, SPB_ZERO_GRAD } spb_zero_state;
void spb_zero_gather_local(const spb_zero *z, const spb_gpt *g, spb_zero_state which, float *local);
void spb_zero_scatter_local(spb_zero *z, spb_gpt *g, spb_zero_state which, const float *local);

/* The gradient reduction's and ZeRO's own collectives of one iteration
 * (accumulation included), from the configuration alone: what the
 * accounting layer records under phases "grad_reduce" and "zero".  Tests
 * hold it against measured bytes; the performance model prices it.  One
 * item per (operation, phase, group); all figures per iteration, per rank. */
typedef enum spb_group_kind { SPB_GROUP_DPSP = 0, SPB_GROUP_DP, SPB_GROUP_SP } spb_group_kind;
typedef struct spb_comm_item {
    spb_comm_op op;
    spb_comm_phase phase;
    spb_group_kind group;
    int group_size;
    double calls;         /* collective calls per iteration */
    double payload_bytes; /* sum over calls of nccl-tests' "size" */
    double link_bytes;    /* sum over calls of payload x bus factor */
} spb_comm_item;
enum { SPB_ZERO_MAX_ITEMS = 8 };
/* Fills items (at most SPB_ZERO_MAX_ITEMS) and returns how many.  cfg must
 * be finalized for world_size ranks. */
int spb_zero_comm_items(const spb_config *cfg, int world_size, spb_comm_item *items);

/* Padded elements a rank owns per class and the padded sizes of the unit
 * buffers, from the configuration alone (the memory model's view). */
typedef struct spb_zero_sizes {
    double local;        /* elements this rank holds whole without ZeRO (its TP shards) */
    double owned;        /* elements of owned slices, both classes */
    double layer_elems;  /* a layer's padded buffer */
    double global_elems; /* the globals' padded buffer */
    double largest_padded_tensor, largest_slice;
} spb_zero_sizes;
void spb_zero_sizes_of(const spb_config *cfg, int world_size, spb_zero_sizes *out);

#endif
