/* Process grid over MPI_COMM_WORLD: world = D (data-parallel) x P
 * (sequence-parallel).  SP groups are contiguous ranks (inside a node on a
 * real cluster); data-parallel groups are strided. */
#ifndef SPB_GRID_H
#define SPB_GRID_H

#include <mpi.h>

/* How the grid falls on machines: the paper keeps each SP group inside a
 * node (its all-to-alls on NVLink) and lets the data-parallel groups cross
 * nodes; a launcher that deals ranks out machine by machine in turn
 * (mpirun --map-by node) splits SP groups instead. */
typedef struct spb_placement {
    int machines;          /* distinct machines in the world */
    int ranks_per_machine; /* the most ranks on one machine */
    int sp_machines;       /* the most machines one SP group spans */
    int dp_machines;       /* the most machines one data-parallel group spans */
} spb_placement;

typedef struct spb_grid {
    int world_rank, world_size;
    int dp_rank, dp_size; /* D */
    int sp_rank, sp_size; /* P */
    MPI_Comm world;       /* the communicator the grid was built on */
    MPI_Comm sp_comm;     /* ranks holding pieces of the same sequences */
    MPI_Comm dp_comm;     /* ranks at the same sequence position, other data */
    MPI_Comm dpsp_comm;   /* all D x P ranks (ZeRO over data x sequence) */
    spb_placement placement; /* one machine = MPI_COMM_TYPE_SHARED */
} spb_grid;

/* From machine_of[world rank] (any id per machine) for SP groups of
 * sp_degree contiguous ranks and strided data-parallel groups, as
 * spb_grid_create builds them. */
void spb_placement_count(const int *machine_of, int world_size, int sp_degree, spb_placement *pl);

/* Collective over `base`; sp_degree must divide its size (validated before). */
void spb_grid_create(spb_grid *g, MPI_Comm base, int sp_degree);
void spb_grid_destroy(spb_grid *g);

#endif
