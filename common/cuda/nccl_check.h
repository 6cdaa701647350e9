/* Check macros of the NCCL sources (CUDA C++, where checks.h's C-only
 * SPB_MPI_CHECK is not available): print file:line and the failing call,
 * then abort the job (cuda_check.h's SPB_DIE). */
#ifndef SPB_NCCL_CHECK_H
#define SPB_NCCL_CHECK_H

#include <nccl.h>

#include "cuda_check.h"

/* ncclBfloat16 (the 16-bit collectives) came with NCCL 2.10. */
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 10, 0)
#error "spbench's NCCL path needs NCCL 2.10 or newer (ncclBfloat16)"
#endif

/* NCCL's own account of the failure (e.g. "Duplicate GPU detected"). */
static inline const char *spb_nccl_last_error(void)
{
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
    return ncclGetLastError(NULL);
#else
    return "";
#endif
}

#define SPB_NCCL_CHECK(call)                                                                                           \
    do {                                                                                                               \
        ncclResult_t spb_nccl_rc_ = (call);                                                                            \
        if (spb_nccl_rc_ != ncclSuccess)                                                                               \
            SPB_DIE("NCCL call failed: %s: %s (%s)", #call, ncclGetErrorString(spb_nccl_rc_), spb_nccl_last_error());  \
    } while (0)
#define SPB_MPI_CALL(call)                                                                                             \
    do {                                                                                                               \
        if ((call) != MPI_SUCCESS) SPB_DIE("MPI call failed: %s", #call);                                              \
    } while (0)

#endif
