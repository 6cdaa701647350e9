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
    /* Two levels inside an SP group (the hybrid strategy): Ulysses groups
     * of U contiguous SP ranks (one node's GPUs on a cluster), and ring
     * groups of the R = P/U ranks at the same place in each Ulysses group.
     * Without a nested split U = P and R = 1. */
    int ulysses_rank, ulysses_size; /* U */
    int ring_rank, ring_size;       /* R: which Ulysses group, how many */
    MPI_Comm ulysses_comm;          /* sp ranks [ring_rank·U, (ring_rank+1)·U) */
    MPI_Comm ring_comm;             /* sp ranks ulysses_rank + k·U, k < R */
    spb_placement placement; /* one machine = MPI_COMM_TYPE_SHARED */
} spb_grid;

/* From machine_of[world rank] (any id per machine) for SP groups of
 * sp_degree contiguous ranks and strided data-parallel groups, as
 * spb_grid_create builds them. */
void spb_placement_count(const int *machine_of, int world_size, int sp_degree, spb_placement *pl);

/* Collective over `base`; sp_degree must divide its size (validated before). */
void spb_grid_create(spb_grid *g, MPI_Comm base, int sp_degree);
/* The same with SP groups split U = ulysses_degree ways inside (0: U = P);
 * U must divide sp_degree (validated before). */
void spb_grid_create_nested(spb_grid *g, MPI_Comm base, int sp_degree, int ulysses_degree);
void spb_grid_destroy(spb_grid *g);

#endif
