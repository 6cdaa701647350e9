/* The shm MPI's life cycle (init, finalize, abort), communicators, error
 * reporting and the waiting that everything else is built on.
 *
 * Synchronisation: every rank r has, per communicator id c, a monotonic
 * counter of its barrier arrivals (counters[r][c]).  A barrier on a
 * communicator is: bump my counter to my next epoch e, then wait until every
 * member's counter is >= e.  Collectives are rounds of "stage into my slot;
 * barrier; read the others' slots; barrier".  Waiting spins briefly, then
 * sleeps on a futex (the rank's doorbell), which whoever publishes rings. */
#define _GNU_SOURCE
#include "shm_internal.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

spb_shm_header *spb_shm;
int spb_shm_me;
struct spb_shm_comm spb_shm_comm_world = {.ctx = 0, .size = 1, .rank = 0, .builtin = 1,
                                          .errhandler = MPI_ERRORS_ARE_FATAL};
struct spb_shm_comm spb_shm_comm_self = {.ctx = -1, .size = 1, .rank = 0, .builtin = 1,
                                         .errhandler = MPI_ERRORS_ARE_FATAL};
static int self_world_of[1];
static int initialized, finalized;
static pid_t rank_pid; /* a child this rank forks must not act for it */

/* ---- errors ------------------------------------------------------------ */

_Noreturn static void abort_job(int code)
{
    if (spb_shm && getpid() == rank_pid) {
        int none = -1;
        atomic_compare_exchange_strong(&spb_shm->abort_rank, &none, spb_shm_me);
        atomic_store(&spb_shm_rank_of(spb_shm, spb_shm_me)->state, SPB_RANK_ABORTED);
        spb_shm_raise_abort(spb_shm, code);
    }
    fflush(NULL);
    _exit(code ? code & 255 : 1);
}

int spb_shm_error(MPI_Comm comm, int code, const char *file, int line, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "shm MPI: rank %d: %s:%d: %s\n", spb_shm_me, file, line, msg);
    fflush(stderr);
    if (comm && comm->errhandler == MPI_ERRORS_RETURN) return code;
    abort_job(1);
}

int spb_shm_enter(MPI_Comm comm, const char *fn, const char *file, int line)
{
    if (!initialized || finalized)
        return spb_shm_error(NULL, MPI_ERR_OTHER, file, line, "%s called %s", fn,
                             finalized ? "after MPI_Finalize" : "before MPI_Init");
    if (comm == MPI_COMM_NULL) return spb_shm_error(NULL, MPI_ERR_COMM, file, line, "%s on MPI_COMM_NULL", fn);
    spb_shm_check_abort();
    return MPI_SUCCESS;
}

int MPI_Error_string(int errorcode, char *string, int *resultlen)
{
    static const char *text[MPI_ERR_LASTCODE] = {
        "MPI_SUCCESS: no error", "MPI_ERR_COMM: invalid communicator", "MPI_ERR_COUNT: invalid count",
        "MPI_ERR_TYPE: invalid datatype", "MPI_ERR_OP: invalid reduction", "MPI_ERR_ARG: invalid argument",
        "MPI_ERR_RANK: invalid rank", "MPI_ERR_ROOT: invalid root",
        "MPI_ERR_TRUNCATE: message longer than the receive buffer", "MPI_ERR_REQUEST: invalid request",
        "MPI_ERR_OTHER: other error (see the message above)", "MPI_ERR_INTERN: internal error of the shm MPI"};
    const char *t = errorcode >= 0 && errorcode < MPI_ERR_LASTCODE ? text[errorcode] : "unknown error code";
    snprintf(string, MPI_MAX_ERROR_STRING, "%s", t);
    *resultlen = (int)strlen(string);
    return MPI_SUCCESS;
}

size_t spb_shm_type_size(MPI_Datatype t)
{
    struct double_int { double d; int i; };
    switch (t) {
    case MPI_BYTE:
    case MPI_CHAR: return 1;
    case MPI_INT: return sizeof(int);
    case MPI_LONG: return sizeof(long);
    case MPI_LONG_LONG: return sizeof(long long);
    case MPI_UNSIGNED_LONG: return sizeof(unsigned long);
    case MPI_FLOAT: return sizeof(float);
    case MPI_DOUBLE: return sizeof(double);
    case MPI_DOUBLE_INT: return sizeof(struct double_int);
    case MPI_2INT: return 2 * sizeof(int);
    default: return 0;
    }
}

/* ---- waiting ------------------------------------------------------------ */

void spb_shm_check_abort(void)
{
    if (!spb_shm || !atomic_load_explicit(&spb_shm->abort_flag, memory_order_acquire)) return;
    /* Another rank failed: leave without a word (the launcher says why). */
    fflush(NULL);
    _exit(atomic_load(&spb_shm->abort_code) & 255 ? atomic_load(&spb_shm->abort_code) & 255 : 1);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

enum { SPIN_CHECKS = 200, YIELDS = 4 };

void spb_shm_wait(int (*ready)(void *), void *arg)
{
    spb_shm_rank *me = spb_shm_rank_of(spb_shm, spb_shm_me);
    for (unsigned i = 0;; i++) {
        if (ready(arg)) return;
        spb_shm_check_abort();
        if (i < SPIN_CHECKS) {
            cpu_relax();
            continue;
        }
        if (i < SPIN_CHECKS + YIELDS) {
            sched_yield();
            continue;
        }
        /* Sleep on the doorbell.  Publishers bump it after publishing and
         * wake us if `sleeping` is set: either we see their update in
         * ready() below, or the bell has moved and FUTEX_WAIT returns. */
        atomic_store(&me->sleeping, 1);
        uint32_t bell = atomic_load(&me->bell);
        if (!ready(arg) && !atomic_load(&spb_shm->abort_flag)) {
            struct timespec limit = {0, 100 * 1000 * 1000}; /* a backstop only */
            syscall(SYS_futex, (uint32_t *)&me->bell, FUTEX_WAIT, bell, &limit, NULL, 0);
        }
        atomic_store(&me->sleeping, 0);
    }
}

/* ---- barrier ------------------------------------------------------------ */

uint64_t spb_shm_arrive(MPI_Comm c)
{
    uint64_t e = ++c->epoch;
    if (c->ctx < 0) return e;
    atomic_store_explicit(spb_shm_counter(spb_shm, spb_shm_me, c->ctx), e, memory_order_release);
    for (int m = 0; m < c->size; m++)
        if (m != c->rank) spb_shm_ring(spb_shm, c->world_of[m]);
    return e;
}

int spb_shm_all_arrived(MPI_Comm c, uint64_t epoch)
{
    if (c->ctx < 0) return 1;
    for (int m = 0; m < c->size; m++)
        if (atomic_load_explicit(spb_shm_counter(spb_shm, c->world_of[m], c->ctx), memory_order_acquire) < epoch)
            return 0;
    return 1;
}

struct arrival { MPI_Comm c; uint64_t epoch; };
static int arrived(void *p)
{
    struct arrival *a = p;
    return spb_shm_all_arrived(a->c, a->epoch);
}

void spb_shm_sync(MPI_Comm c)
{
    if (c->size == 1) return;
    struct arrival a = {c, spb_shm_arrive(c)};
    spb_shm_wait(arrived, &a);
}

/* ---- life cycle ---------------------------------------------------------- */

static int parse_env_int(const char *name, int *out)
{
    const char *s = getenv(name);
    if (!s) return 0;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end || v < 0 || v > INT_MAX) return -1;
    *out = (int)v;
    return 1;
}

/* A world of one: a private segment with the same layout. */
static int map_private(void)
{
    uint64_t slot = 64 * 1024, chan = 64 * 1024;
    uint64_t bytes = spb_shm_total_bytes(1, slot, chan);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* forks get copies */
    if (p == MAP_FAILED) return SHM_FAIL(NULL, MPI_ERR_OTHER, "MPI_Init: mmap of %llu bytes: %s",
                                         (unsigned long long)bytes, strerror(errno));
    spb_shm = p;
    spb_shm_layout(spb_shm, 1, slot, chan);
    spb_shm_me = 0;
    return MPI_SUCCESS;
}

/* Maps the segment spbrun passed down. */
static int map_shared(int fd, int rank)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(spb_shm_header))
        return SHM_FAIL(NULL, MPI_ERR_OTHER, "MPI_Init: %s=%d is not spbrun's segment", SPB_SHM_ENV_FD, fd);
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return SHM_FAIL(NULL, MPI_ERR_OTHER, "MPI_Init: mmap of spbrun's segment: %s", strerror(errno));
    close(fd); /* the mapping stays; programs this rank starts need not see it */
    spb_shm_header *h = p;
    if (h->magic != SPB_SHM_MAGIC || h->total_bytes != (uint64_t)st.st_size || rank >= h->nranks)
        return SHM_FAIL(NULL, MPI_ERR_OTHER, "MPI_Init: spbrun's segment is not one this library understands "
                                             "(rank %d, built from another version?)", rank);
    spb_shm = h;
    spb_shm_me = rank;
    return MPI_SUCCESS;
}

int MPI_Init(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    if (initialized) return SHM_FAIL(NULL, MPI_ERR_OTHER, "MPI_Init called twice");
    int fd = -1, rank = -1, rc;
    int has_fd = parse_env_int(SPB_SHM_ENV_FD, &fd), has_rank = parse_env_int(SPB_SHM_ENV_RANK, &rank);
    if (has_fd < 0 || has_rank < 0 || has_fd != has_rank)
        return SHM_FAIL(NULL, MPI_ERR_OTHER, "MPI_Init: bad %s/%s in the environment", SPB_SHM_ENV_FD,
                        SPB_SHM_ENV_RANK);
    if (!has_fd) {
        /* Started by another launcher, this program would run as n separate
         * worlds of one: refuse. */
        const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"};
        for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
            const char *v = getenv(vars[i]);
            if (v && atoi(v) > 1)
                return SHM_FAIL(NULL, MPI_ERR_OTHER, "MPI_Init: this program is built with the shm MPI and %s=%s "
                                                     "says another MPI launched it: run it with spbrun", vars[i], v);
        }
        rc = map_private();
    } else {
        rc = map_shared(fd, rank);
    }
    if (rc != MPI_SUCCESS) return rc;

    int n = spb_shm->nranks;
    spb_shm_comm_world.size = n;
    spb_shm_comm_world.rank = spb_shm_me;
    spb_shm_comm_world.world_of = malloc(sizeof(int) * (size_t)n);
    if (!spb_shm_comm_world.world_of) return SHM_FAIL(NULL, MPI_ERR_OTHER, "MPI_Init: out of memory");
    for (int r = 0; r < n; r++) spb_shm_comm_world.world_of[r] = r;
    self_world_of[0] = spb_shm_me;
    spb_shm_comm_self.world_of = self_world_of;
    spb_shm_rank *me = spb_shm_rank_of(spb_shm, spb_shm_me);
    rank_pid = getpid();
    me->pid = (int32_t)rank_pid;
    atomic_store(&me->state, SPB_RANK_INITIALIZED);
    initialized = 1;
    return MPI_SUCCESS;
}

int MPI_Initialized(int *flag)
{
    *flag = initialized;
    return MPI_SUCCESS;
}

int MPI_Finalized(int *flag)
{
    *flag = finalized;
    return MPI_SUCCESS;
}

int MPI_Finalize(void)
{
    SHM_ENTER(MPI_COMM_WORLD, "MPI_Finalize");
    if (spb_shm_p2p_pending())
        SHM_FAIL(MPI_COMM_WORLD, MPI_ERR_REQUEST, "MPI_Finalize with point-to-point requests not completed");
    /* Like MPI_Finalize elsewhere, ranks leave together: then a rank that
     * exits without finalizing is a failure the launcher can tell. */
    spb_shm_sync(MPI_COMM_WORLD);
    atomic_store(&spb_shm_rank_of(spb_shm, spb_shm_me)->state, SPB_RANK_FINALIZED);
    finalized = 1;
    free(spb_shm_comm_world.world_of);
    spb_shm_comm_world.world_of = NULL;
    return MPI_SUCCESS;
}

int MPI_Abort(MPI_Comm comm, int errorcode)
{
    (void)comm; /* the whole job, as most MPIs do */
    abort_job(errorcode);
}

double MPI_Wtime(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- communicators ------------------------------------------------------- */

int MPI_Comm_rank(MPI_Comm comm, int *rank)
{
    SHM_ENTER(comm, "MPI_Comm_rank");
    *rank = comm->rank;
    return MPI_SUCCESS;
}

int MPI_Comm_size(MPI_Comm comm, int *size)
{
    SHM_ENTER(comm, "MPI_Comm_size");
    *size = comm->size;
    return MPI_SUCCESS;
}

int MPI_Comm_set_errhandler(MPI_Comm comm, MPI_Errhandler errhandler)
{
    SHM_ENTER(comm, "MPI_Comm_set_errhandler");
    if (errhandler != MPI_ERRORS_ARE_FATAL && errhandler != MPI_ERRORS_RETURN)
        return SHM_FAIL(comm, MPI_ERR_ARG, "MPI_Comm_set_errhandler: unknown handler %d", errhandler);
    comm->errhandler = errhandler;
    return MPI_SUCCESS;
}

static void ctx_lock(void)
{
    for (unsigned i = 0; atomic_exchange_explicit(&spb_shm->ctx_lock, 1, memory_order_acquire); i++) {
        spb_shm_check_abort(); /* a holder killed mid-way: the job is ending anyway */
        if (i > 100) sched_yield();
    }
}

static void ctx_unlock(void) { atomic_store_explicit(&spb_shm->ctx_lock, 0, memory_order_release); }

/* A free communicator id for these members, their counters reset; -1 when
 * all are taken. */
static int ctx_alloc(const int *world_of, int size)
{
    ctx_lock();
    int ctx = -1;
    for (int c = 1; c < SPB_SHM_MAX_CTX && ctx < 0; c++)
        if (atomic_load(&spb_shm->ctx_refs[c]) == 0) ctx = c;
    if (ctx >= 0) {
        atomic_store(&spb_shm->ctx_refs[ctx], size);
        for (int m = 0; m < size; m++) atomic_store(spb_shm_counter(spb_shm, world_of[m], ctx), 0);
    }
    ctx_unlock();
    return ctx;
}

static void ctx_release(int ctx)
{
    if (ctx <= 0) return;
    ctx_lock();
    atomic_fetch_sub(&spb_shm->ctx_refs[ctx], 1);
    ctx_unlock();
}

struct split_entry { int color, key; };

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *newcomm)
{
    SHM_ENTER(comm, "MPI_Comm_split");
    if (color < 0 && color != MPI_UNDEFINED)
        return SHM_FAIL(comm, MPI_ERR_ARG, "MPI_Comm_split: colour %d (must be >= 0 or MPI_UNDEFINED)", color);
    int n = comm->size;
    struct split_entry mine = {color, key}, *all = malloc(sizeof *all * (size_t)n);
    int *members = malloc(sizeof(int) * (size_t)n), *ctxs = malloc(sizeof(int) * (size_t)n);
    if (!all || !members || !ctxs) return SHM_FAIL(comm, MPI_ERR_OTHER, "MPI_Comm_split: out of memory");
    int rc = spb_shm_allgather_bytes(comm, &mine, sizeof mine, all);
    if (rc) return rc;

    /* My group: same colour, ordered by (key, rank in comm) — insertion sort. */
    int size = 0, my_index = -1;
    if (color != MPI_UNDEFINED)
        for (int r = 0; r < n; r++) {
            if (all[r].color != color) continue;
            int at = size++;
            while (at > 0 && all[members[at - 1]].key > all[r].key) {
                members[at] = members[at - 1];
                at--;
            }
            members[at] = r;
        }
    for (int i = 0; i < size; i++)
        if (members[i] == comm->rank) my_index = i;

    /* The group's first member allocates its id; a second exchange hands it
     * to the others, and doubles as the barrier that orders the counters'
     * reset before anyone uses them. */
    int *world_of = size ? malloc(sizeof(int) * (size_t)size) : NULL;
    for (int i = 0; i < size; i++) world_of[i] = comm->world_of[members[i]];
    int my_ctx = -1, failed = 0;
    if (my_index == 0 && size > 1) {
        my_ctx = ctx_alloc(world_of, size);
        if (my_ctx < 0) failed = 1;
    }
    int mine_out = failed ? -2 : my_ctx;
    if ((rc = spb_shm_allgather_bytes(comm, &mine_out, sizeof mine_out, ctxs))) return rc;
    int ctx = size > 1 ? ctxs[members[0]] : -1;
    for (int r = 0; r < n; r++) failed |= ctxs[r] == -2; /* every rank fails alike */
    free(all);
    free(members);
    free(ctxs);
    if (failed) {
        if (ctx >= 0) ctx_release(ctx);
        free(world_of);
        return SHM_FAIL(comm, MPI_ERR_INTERN, "MPI_Comm_split: more than %d communicators alive "
                                              "(are some never freed?)", SPB_SHM_MAX_CTX - 1);
    }
    if (color == MPI_UNDEFINED) {
        *newcomm = MPI_COMM_NULL;
        return MPI_SUCCESS;
    }
    struct spb_shm_comm *c = calloc(1, sizeof *c);
    if (!c) return SHM_FAIL(comm, MPI_ERR_OTHER, "MPI_Comm_split: out of memory");
    *c = (struct spb_shm_comm){.ctx = ctx, .size = size, .rank = my_index, .world_of = world_of,
                               .epoch = 0, .errhandler = comm->errhandler, .builtin = 0};
    *newcomm = c;
    return MPI_SUCCESS;
}

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *newcomm)
{
    SHM_ENTER(comm, "MPI_Comm_dup");
    return MPI_Comm_split(comm, 0, comm->rank, newcomm);
}

int MPI_Comm_split_type(MPI_Comm comm, int split_type, int key, MPI_Info info, MPI_Comm *newcomm)
{
    (void)info;
    SHM_ENTER(comm, "MPI_Comm_split_type");
    if (split_type != MPI_COMM_TYPE_SHARED && split_type != MPI_UNDEFINED)
        return SHM_FAIL(comm, MPI_ERR_ARG, "MPI_Comm_split_type: type %d (only MPI_COMM_TYPE_SHARED)", split_type);
    /* Every rank shares this machine's memory. */
    return MPI_Comm_split(comm, split_type == MPI_UNDEFINED ? MPI_UNDEFINED : 0, key, newcomm);
}

int MPI_Comm_free(MPI_Comm *comm)
{
    SHM_ENTER(comm ? *comm : MPI_COMM_NULL, "MPI_Comm_free");
    MPI_Comm c = *comm;
    if (c->builtin) return SHM_FAIL(c, MPI_ERR_COMM, "MPI_Comm_free of MPI_COMM_WORLD or MPI_COMM_SELF");
    ctx_release(c->ctx);
    free(c->world_of);
    free(c);
    *comm = MPI_COMM_NULL;
    return MPI_SUCCESS;
}
