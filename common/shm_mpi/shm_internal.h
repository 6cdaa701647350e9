/* What the parts of the shm MPI share: the communicator, the mapping, error
 * reporting, waiting and the barrier that every collective is built from. */
#ifndef SPB_SHM_INTERNAL_H
#define SPB_SHM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "mpi.h"
#include "shm_segment.h"

struct spb_shm_comm {
    int ctx;          /* row of the barrier counters; -1: one rank, nothing shared */
    int size, rank;   /* members, and my index among them */
    int *world_of;    /* world rank of each member */
    uint64_t epoch;   /* my barrier arrivals on ctx so far */
    MPI_Errhandler errhandler;
    int builtin;      /* MPI_COMM_WORLD or MPI_COMM_SELF: never freed */
};

extern spb_shm_header *spb_shm; /* the segment (a private one for a world of one) */
extern int spb_shm_me;          /* my world rank */

/* Reports a failed call as one line "shm MPI: rank R: file:line: what";
 * returns code under MPI_ERRORS_RETURN, otherwise ends the job. */
int spb_shm_error(MPI_Comm comm, int code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
#define SHM_FAIL(comm, code, ...) spb_shm_error((comm), (code), __FILE__, __LINE__, __VA_ARGS__)

/* Entry checks of every call on a communicator: MPI is up, comm is real. */
int spb_shm_enter(MPI_Comm comm, const char *fn, const char *file, int line);
#define SHM_ENTER(comm, fn)                                                                                            \
    do {                                                                                                               \
        int shm_rc_ = spb_shm_enter((comm), (fn), __FILE__, __LINE__);                                                 \
        if (shm_rc_ != MPI_SUCCESS) return shm_rc_;                                                                    \
    } while (0)

/* Bytes of one element, 0 for an unknown type. */
size_t spb_shm_type_size(MPI_Datatype t);

/* Leaves quietly (with the first failure's status) once the job is aborting. */
void spb_shm_check_abort(void);

/* Blocks until ready(arg) returns non-zero: spins briefly, then sleeps on
 * this rank's doorbell (ranks share cores: a waiting rank must not take
 * them from the ones computing). */
void spb_shm_wait(int (*ready)(void *), void *arg);

/* Barrier arrival, its test, and the whole barrier, on communicator c. */
uint64_t spb_shm_arrive(MPI_Comm c);
int spb_shm_all_arrived(MPI_Comm c, uint64_t epoch);
void spb_shm_sync(MPI_Comm c);

/* Gathers bytes from every member into recv (member order), for
 * MPI_Comm_split; the same path as MPI_Allgather. */
int spb_shm_allgather_bytes(MPI_Comm c, const void *send, size_t bytes, void *recv);

/* Progress of pending point-to-point requests (shm_p2p.c); non-zero when
 * something moved. */
int spb_shm_p2p_progress(void);
int spb_shm_p2p_pending(void);

#endif
