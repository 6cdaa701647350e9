/* Check macros: a failing MPI/BLAS/CUDA/system call prints the rank,
 * file:line and the call, then aborts the whole job with MPI_Abort so no
 * rank is left waiting in a collective. */
#ifndef SPB_CHECKS_H
#define SPB_CHECKS_H

#include <mpi.h>
#include <stdio.h>

/* The world rank, or -1 before MPI_Init. */
int spb_world_rank(void);

_Noreturn void spb_die(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define SPB_DIE(...) spb_die(__FILE__, __LINE__, __VA_ARGS__)

/* Internal invariant (not user input: that goes through config validation). */
#define SPB_CHECK(cond)                                                        \
    do {                                                                       \
        if (!(cond)) SPB_DIE("check failed: %s", #cond);                       \
    } while (0)

#define SPB_MPI_CHECK(call)                                                    \
    do {                                                                       \
        int spb_mpi_rc_ = (call);                                              \
        if (spb_mpi_rc_ != MPI_SUCCESS) {                                      \
            char spb_msg_[MPI_MAX_ERROR_STRING];                               \
            int spb_len_ = 0;                                                  \
            MPI_Error_string(spb_mpi_rc_, spb_msg_, &spb_len_);                \
            SPB_DIE("MPI call failed: %s: %s", #call, spb_msg_);               \
        }                                                                      \
    } while (0)

/* For calls that return non-NULL on success (malloc, fopen, ...). */
void *spb_check_ptr(void *p, const char *expr, const char *file, int line);
#define SPB_CHECK_PTR(expr) spb_check_ptr((expr), #expr, __FILE__, __LINE__)

#endif
