/* Running a Check suite from a test's main: the process's exit code. */
#ifndef SPB_TESTS_CHECK_RUN_H
#define SPB_TESTS_CHECK_RUN_H

#include <check.h>

/* fork: CK_NOFORK (MPI, shared state between tests), CK_FORK, or
 * CK_FORK_GETENV (Check's default: the CK_FORK variable decides; tests that
 * expect a process to die need a fork). */
static inline int spb_run_suite(Suite *s, enum fork_status fork)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, fork);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif
