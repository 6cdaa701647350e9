#include "grid.h"

#include "checks.h"
#include "comm.h"

void spb_grid_create(spb_grid *g, MPI_Comm base, int sp_degree)
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
}

void spb_grid_destroy(spb_grid *g)
{
    /* A device-collective table may hold communicators built on these. */
    spb_comm_forget(g->sp_comm);
    spb_comm_forget(g->dp_comm);
    spb_comm_forget(g->dpsp_comm);
    MPI_Comm_free(&g->sp_comm);
    MPI_Comm_free(&g->dp_comm);
    MPI_Comm_free(&g->dpsp_comm);
}
