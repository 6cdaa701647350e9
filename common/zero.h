/* ZeRO stages 1 and 2 over the ranks that hold replicas of a parameter:
 * tensors replicated over the sequence and data ranks form one class
 * (group D x P, the paper's extension), tensor-parallel shards another
 * (group D).  Each class is packed in parameter order and cut into one
 * contiguous slice per rank of its group; a rank keeps AdamW moments for its
 * slice only, updates it, and the group allgathers the parameters.
 * Stage 1 all-reduces gradients (as stage 0); stage 2 reduce-scatters them
 * so a rank receives only its slice's sum.  ZeRO's own traffic (the
 * reduce-scatter and the parameter allgather) is recorded under phase
 * "zero".  Stage 3 (partitioned parameters) is not here yet. */
#ifndef SPB_ZERO_H
#define SPB_ZERO_H

#include "config.h"
#include "gpt.h"
#include "grid.h"

typedef struct spb_zero_segment {
    long packed_lo;    /* where this tensor's slice starts in the rank's moments and gradient slices */
    long n;            /* elements of the slice that exist (the last slice is shorter) */
    long param_offset; /* where they sit in the rank's parameter vector */
    int decay;
} spb_zero_segment;

typedef struct spb_zero_class {
    MPI_Comm comm;
    int size, rank;
    int num_tensors, *tensors; /* indices into the gpt's tensor table, in order */
    long n;                    /* elements of the class */
    long slice;                /* this rank's owned elements, padding included */
    float *packed;             /* staging: one tensor, padded to a multiple of size */
    float *m, *v, *grad;       /* [slice] AdamW moments and reduced gradient of the owned slices */
    int num_segments;
    spb_zero_segment *segments;
} spb_zero_class;

typedef struct spb_zero {
    int stage;
    long step;
    int num_classes;
    spb_zero_class cls[2];
} spb_zero;

spb_zero *spb_zero_create(const spb_gpt *g, const spb_grid *grid, int stage);
void spb_zero_destroy(spb_zero *z);
/* After backward: sum gradients over each class's group (stage 1:
 * all-reduce, stage 2: reduce-scatter); leaves each rank its slice. */
void spb_zero_reduce_gradients(spb_zero *z, const spb_gpt *g);
/* Global gradient norm from the owned slices (one reduction over world). */
double spb_zero_grad_norm(const spb_zero *z, MPI_Comm world);
/* AdamW on the owned slices, then the parameters are allgathered. */
void spb_zero_update(spb_zero *z, spb_gpt *g, const spb_config *cfg, double lr, float grad_scale);

#endif
