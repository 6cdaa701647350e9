#include "grid.h"

#include <stdlib.h>

#include "checks.h"
#include "comm.h"

/* distinct values among n ints (n is a group's size: small) */
static int distinct(const int *v, int n)
{
    int d = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = v[j] == v[i];
        d += !seen;
    }
    return d;
}

void spb_placement_count(const int *machine_of, int world_size, int sp_degree, spb_placement *pl)
{
    const int dp = world_size / sp_degree;
    int *group = malloc(sizeof(int) * (size_t)(world_size > 0 ? world_size : 1));
    SPB_CHECK(group != NULL && sp_degree > 0 && world_size % sp_degree == 0);
    pl->machines = distinct(machine_of, world_size);
    pl->ranks_per_machine = pl->sp_machines = pl->dp_machines = 0;
    for (int r = 0; r < world_size; r++) {
        int same = 0;
        for (int q = 0; q < world_size; q++) same += machine_of[q] == machine_of[r];
        if (same > pl->ranks_per_machine) pl->ranks_per_machine = same;
    }
    for (int d = 0; d < dp; d++) { /* SP group d: ranks d*P .. d*P + P - 1 */
        for (int s = 0; s < sp_degree; s++) group[s] = machine_of[d * sp_degree + s];
        int m = distinct(group, sp_degree);
        if (m > pl->sp_machines) pl->sp_machines = m;
    }
    for (int s = 0; s < sp_degree; s++) { /* DP group s: ranks s, s + P, ... */
        for (int d = 0; d < dp; d++) group[d] = machine_of[d * sp_degree + s];
        int m = distinct(group, dp);
        if (m > pl->dp_machines) pl->dp_machines = m;
    }
    free(group);
}

static void grid_placement(const spb_grid *g, spb_placement *pl)
{
    /* a machine's id: the world rank of its first rank */
    MPI_Comm node;
    int id = g->world_rank;
    SPB_MPI_CHECK(MPI_Comm_split_type(g->world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    SPB_MPI_CHECK(MPI_Bcast(&id, 1, MPI_INT, 0, node));
    SPB_MPI_CHECK(MPI_Comm_free(&node));
    int *machine_of = malloc(sizeof(int) * (size_t)g->world_size);
    SPB_CHECK(machine_of != NULL);
    SPB_MPI_CHECK(MPI_Allgather(&id, 1, MPI_INT, machine_of, 1, MPI_INT, g->world));
    spb_placement_count(machine_of, g->world_size, g->sp_size, pl);
    free(machine_of);
}

void spb_grid_create(spb_grid *g, MPI_Comm base, int sp_degree) { spb_grid_create_nested(g, base, sp_degree, 0); }

void spb_grid_create_nested(spb_grid *g, MPI_Comm base, int sp_degree, int ulysses_degree)
{
    SPB_MPI_CHECK(MPI_Comm_rank(base, &g->world_rank));
    SPB_MPI_CHECK(MPI_Comm_size(base, &g->world_size));
    SPB_CHECK(sp_degree > 0 && g->world_size % sp_degree == 0);
    g->sp_size = sp_degree;
    g->dp_size = g->world_size / sp_degree;
    g->sp_rank = g->world_rank % sp_degree;
    g->dp_rank = g->world_rank / sp_degree;
    g->world = base;
    SPB_MPI_CHECK(MPI_Comm_split(base, g->dp_rank, g->sp_rank, &g->sp_comm));
    SPB_MPI_CHECK(MPI_Comm_split(base, g->sp_rank, g->dp_rank, &g->dp_comm));
    SPB_MPI_CHECK(MPI_Comm_dup(base, &g->dpsp_comm));
    g->ulysses_size = ulysses_degree > 0 ? ulysses_degree : sp_degree;
    SPB_CHECK(sp_degree % g->ulysses_size == 0);
    g->ring_size = sp_degree / g->ulysses_size;
    g->ulysses_rank = g->sp_rank % g->ulysses_size;
    g->ring_rank = g->sp_rank / g->ulysses_size;
    SPB_MPI_CHECK(MPI_Comm_split(g->sp_comm, g->ring_rank, g->ulysses_rank, &g->ulysses_comm));
    SPB_MPI_CHECK(MPI_Comm_split(g->sp_comm, g->ulysses_rank, g->ring_rank, &g->ring_comm));
    grid_placement(g, &g->placement);
}

void spb_grid_destroy(spb_grid *g)
{
    /* A device-collective table may hold communicators built on these. */
    spb_comm_forget(g->sp_comm);
    spb_comm_forget(g->dp_comm);
    spb_comm_forget(g->dpsp_comm);
    spb_comm_forget(g->ulysses_comm);
    spb_comm_forget(g->ring_comm);
    MPI_Comm_free(&g->ulysses_comm);
    MPI_Comm_free(&g->ring_comm);
    MPI_Comm_free(&g->sp_comm);
    MPI_Comm_free(&g->dp_comm);
    MPI_Comm_free(&g->dpsp_comm);
}
