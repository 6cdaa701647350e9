/* Process grid over MPI_COMM_WORLD: world = D (data-parallel) x P
 * (sequence-parallel).  SP groups are contiguous ranks (inside a node on a
 * real cluster); data-parallel groups are strided. */
#ifndef SPB_GRID_H
#define SPB_GRID_H

#include <mpi.h>

typedef struct spb_grid {
    int world_rank, world_size;
    int dp_rank, dp_size; /* D */
    int sp_rank, sp_size; /* P */
    MPI_Comm world;       /* the communicator the grid was built on */
    MPI_Comm sp_comm;     /* ranks holding pieces of the same sequences */
    MPI_Comm dp_comm;     /* ranks at the same sequence position, other data */
    MPI_Comm dpsp_comm;   /* all D x P ranks (ZeRO over data x sequence) */
} spb_grid;

/* Collective over `base`; sp_degree must divide its size (validated before). */
void spb_grid_create(spb_grid *g, MPI_Comm base, int sp_degree);
void spb_grid_destroy(spb_grid *g);

#endif
