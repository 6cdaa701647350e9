/* What the MPI test suites share: rank-0 reporting and running a Check
 * suite in no-fork mode (MPI does not survive fork).  Every rank runs every
 * test and asserts; only rank 0 prints. */
#ifndef SPB_TESTS_MPI_CHECK_H
#define SPB_TESTS_MPI_CHECK_H

#include <check.h>
#include <mpi.h>
#include <stdio.h>

#include "check_run.h"
#include "checks.h"

#define say(...)                                                                                                       \
    do {                                                                                                               \
        if (spb_world_rank() == 0) printf(__VA_ARGS__);                                                               \
    } while (0)

/* Runs the suite (no fork), finalizes MPI, returns the process exit code. */
static inline int spb_run_suite_and_finalize(Suite *s)
{
    int rc = spb_run_suite(s, CK_NOFORK);
    MPI_Finalize();
    return rc;
}

#endif
