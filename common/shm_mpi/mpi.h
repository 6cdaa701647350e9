/* The shm MPI: the part of the MPI C API that spbench uses, for ranks that
 * are processes on one machine sharing memory, started by spbrun
 * (common/shm_mpi/spbrun.c).  Names, signatures and semantics are MPI-3's
 * for everything declared here; anything else is absent, so a new use of it
 * fails to compile instead of misbehaving.  Differences worth knowing:
 *  - reductions add in rank order 0..n-1, so every rank gets the same bits
 *    and the result does not depend on timing;
 *  - point-to-point messages between two ranks are matched in the order they
 *    were sent (no MPI_ANY_SOURCE, no reordering by tag);
 *  - a program started without spbrun is a world of one rank.
 * Design and limits: docs/BUILD.md. */
#ifndef SPB_SHM_MPI_H
#define SPB_SHM_MPI_H

#define SPB_SHM_MPI 1 /* code can tell which MPI it was compiled against */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spb_shm_comm *MPI_Comm;
typedef struct spb_shm_request *MPI_Request;
typedef int MPI_Datatype;
typedef int MPI_Op;
typedef int MPI_Errhandler;
typedef int MPI_Info;
typedef struct {
    int MPI_SOURCE, MPI_TAG, MPI_ERROR;
    int count_bytes; /* what MPI_Get_count would derive from */
} MPI_Status;

extern struct spb_shm_comm spb_shm_comm_world, spb_shm_comm_self;
#define MPI_COMM_WORLD (&spb_shm_comm_world)
#define MPI_COMM_SELF (&spb_shm_comm_self)
#define MPI_COMM_NULL ((MPI_Comm)0)
#define MPI_REQUEST_NULL ((MPI_Request)0)
#define MPI_STATUS_IGNORE ((MPI_Status *)0)
#define MPI_STATUSES_IGNORE ((MPI_Status *)0)
#define MPI_IN_PLACE ((void *)1)
#define MPI_INFO_NULL 0
#define MPI_UNDEFINED (-32766)
#define MPI_COMM_TYPE_SHARED 1
#define MPI_ANY_TAG (-1)
#define MPI_MAX_ERROR_STRING 256

/* Datatypes (values index a size table in shm_mpi.c). */
#define MPI_DATATYPE_NULL 0
#define MPI_BYTE 1
#define MPI_CHAR 2
#define MPI_INT 3
#define MPI_LONG 4
#define MPI_LONG_LONG 5
#define MPI_UNSIGNED_LONG 6
#define MPI_FLOAT 7
#define MPI_DOUBLE 8
#define MPI_DOUBLE_INT 9 /* struct { double; int; } for MPI_MAXLOC / MPI_MINLOC */
#define MPI_2INT 10
#define MPI_INT64_T MPI_LONG_LONG
#define MPI_UINT64_T MPI_UNSIGNED_LONG

#define MPI_OP_NULL 0
#define MPI_SUM 1
#define MPI_MAX 2
#define MPI_MIN 3
#define MPI_MAXLOC 4
#define MPI_MINLOC 5

#define MPI_ERRORS_ARE_FATAL 1
#define MPI_ERRORS_RETURN 2

#define MPI_SUCCESS 0
#define MPI_ERR_COMM 1
#define MPI_ERR_COUNT 2
#define MPI_ERR_TYPE 3
#define MPI_ERR_OP 4
#define MPI_ERR_ARG 5
#define MPI_ERR_RANK 6
#define MPI_ERR_ROOT 7
#define MPI_ERR_TRUNCATE 8
#define MPI_ERR_REQUEST 9
#define MPI_ERR_OTHER 10
#define MPI_ERR_INTERN 11
#define MPI_ERR_LASTCODE 12

int MPI_Init(int *argc, char ***argv);
int MPI_Initialized(int *flag);
int MPI_Finalize(void);
int MPI_Finalized(int *flag);
int MPI_Abort(MPI_Comm comm, int errorcode);
double MPI_Wtime(void);
int MPI_Error_string(int errorcode, char *string, int *resultlen);

int MPI_Comm_rank(MPI_Comm comm, int *rank);
int MPI_Comm_size(MPI_Comm comm, int *size);
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm);
int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm *newcomm);
int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *newcomm);
int MPI_Comm_free(MPI_Comm *comm);
int MPI_Comm_set_errhandler(MPI_Comm comm, MPI_Errhandler errhandler);

int MPI_Barrier(MPI_Comm comm);
int MPI_Ibarrier(MPI_Comm comm, MPI_Request *request);
int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm);
int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm);
int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm);
int MPI_Alltoall(const void *sendbuf, int sendcount, MPI_Datatype sendtype, void *recvbuf, int recvcount,
                 MPI_Datatype recvtype, MPI_Comm comm);
int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount, MPI_Datatype datatype, MPI_Op op,
                             MPI_Comm comm);

int MPI_Isend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag, MPI_Comm comm,
              MPI_Request *request);
int MPI_Irecv(void *buf, int count, MPI_Datatype datatype, int source, int tag, MPI_Comm comm,
              MPI_Request *request);
int MPI_Wait(MPI_Request *request, MPI_Status *status);
int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]);
int MPI_Test(MPI_Request *request, int *flag, MPI_Status *status);

#ifdef __cplusplus
}
#endif

#endif
