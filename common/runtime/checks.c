#include "checks.h"

#include <stdarg.h>
#include <stdlib.h>

int spb_world_rank(void)
{
    int inited = 0, finalized = 0, rank = -1;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

void spb_die(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "spbench: rank %d: %s:%d: ", spb_world_rank(), file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, 3);
    exit(3);
}

void *spb_check_ptr(void *p, const char *expr, const char *file, int line)
{
    if (!p) spb_die(file, line, "call returned NULL: %s", expr);
    return p;
}
