/* What the strategy suites share: building a trainer on a communicator and
 * the per-tensor comparison of global vectors. */
#ifndef SPB_TESTS_STRATEGY_CHECK_H
#define SPB_TESTS_STRATEGY_CHECK_H

#include <check.h>
#include <math.h>
#include <mpi.h>

#include "train.h"

static inline spb_trainer *make(spb_config *c, MPI_Comm comm, spb_grid *grid)
{
    int size;
    MPI_Comm_size(comm, &size);
    char err[256];
    ck_assert_msg(spb_config_finalize(c, size, err, sizeof err) == 0, "%s", err);
    spb_grid_create(grid, comm, c->sp_degree);
    return spb_trainer_create(c, grid);
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

#endif
