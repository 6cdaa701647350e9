/* spbrun: the launcher of the shm MPI.
 *
 *   spbrun -np N [mpiexec-style options] PROGRAM [ARGS...]
 *
 * Creates the shared segment (a memfd, inherited by the ranks, its number in
 * SPBRUN_FD), starts N copies of PROGRAM with SPBRUN_RANK = 0..N-1 and
 * waits.  When a rank fails (killed by a signal, MPI_Abort, a non-zero exit,
 * or an exit without MPI_Finalize) it raises the abort flag in the segment:
 * ranks waiting in MPI calls leave at once, and any still running after a
 * short grace are killed, so no rank waits forever.  Exit status: 0 when
 * every rank exits 0, else the first failure's (128 + signal for a signal).
 * Options Open MPI's mpiexec takes and that mean nothing here
 * (--oversubscribe, --bind-to X, --mca K V, ...) are accepted and ignored. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shm_segment.h"

enum { GRACE_MS = 2000 }; /* after a failure, how long the others get to leave */

#define DIE(...)                                                                                                       \
    do {                                                                                                               \
        fprintf(stderr, "spbrun: " __VA_ARGS__);                                                                       \
        fputc('\n', stderr);                                                                                           \
        exit(2);                                                                                                       \
    } while (0)
#define CHECK_SYS(call)                                                                                                \
    do {                                                                                                               \
        if ((call) < 0) DIE("%s:%d: %s: %s", __FILE__, __LINE__, #call, strerror(errno));                              \
    } while (0)

static void usage(FILE *f)
{
    fprintf(f, "usage: spbrun -np N [options] PROGRAM [ARGS...]\n"
               "  -np N, -n N, --np N, -c N   number of ranks (processes on this machine)\n"
               "  -x VAR[=VALUE]              set VAR in the ranks' environment (VAR alone: already exported)\n"
               "  --wdir DIR                  working directory of the ranks\n"
               "  accepted and ignored, as Open MPI's mpiexec spells them: --oversubscribe, --allow-run-as-root,\n"
               "  --tag-output, --report-bindings, -q/--quiet, --bind-to X, --map-by X, --rank-by X,\n"
               "  --mca K V, --gmca K V\n"
               "environment: SPBRUN_SLOT_BYTES (collective staging per rank, default 16 MiB),\n"
               "  SPBRUN_CHANNEL_BYTES (point-to-point ring per pair of ranks, default 4 MiB)\n");
}

struct options {
    int np;
    const char *wdir;
    char **argv; /* PROGRAM ARGS... */
};

static int parse_count(const char *s)
{
    char *end = NULL;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || v < 1 || v > SPB_SHM_MAX_RANKS) DIE("-np %s: want 1 to %d ranks", s ? s : "(missing)",
                                                                SPB_SHM_MAX_RANKS);
    return (int)v;
}

static int one_of(const char *a, const char *const *list)
{
    for (; *list; list++)
        if (!strcmp(a, *list)) return 1;
    return 0;
}

static struct options parse(int argc, char **argv)
{
    static const char *const count_opts[] = {"-np", "-n", "--np", "--n", "-c", NULL};
    static const char *const flags[] = {"--oversubscribe", "-oversubscribe", "--allow-run-as-root", "--tag-output",
                                        "--timestamp-output", "--report-bindings", "-q", "--quiet", "-v", "--verbose",
                                        "--use-hwthread-cpus", "--display-map", "--nooversubscribe", NULL};
    static const char *const one_arg[] = {"--bind-to", "-bind-to", "--map-by", "-map-by", "--rank-by", "-rank-by",
                                          "--hostfile", "-hostfile", "--machinefile", "--host", "-H", NULL};
    static const char *const two_args[] = {"--mca", "-mca", "--gmca", "-gmca", NULL};
    struct options o = {0};
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (one_of(a, count_opts)) {
            if (++i >= argc) DIE("%s needs a number of ranks", a);
            o.np = parse_count(argv[i]);
        } else if (!strncmp(a, "-np=", 4) || !strncmp(a, "--np=", 5)) {
            o.np = parse_count(strchr(a, '=') + 1);
        } else if (one_of(a, flags)) {
        } else if (one_of(a, one_arg)) {
            if (++i >= argc) DIE("%s needs a value", a);
        } else if (one_of(a, two_args)) {
            if ((i += 2) >= argc) DIE("%s needs a key and a value", a);
        } else if (!strcmp(a, "-x")) {
            if (++i >= argc) DIE("-x needs VAR or VAR=VALUE");
            char *eq = strchr(argv[i], '=');
            if (eq) {
                *eq = '\0';
                CHECK_SYS(setenv(argv[i], eq + 1, 1));
            }
        } else if (!strcmp(a, "--wdir") || !strcmp(a, "-wdir") || !strcmp(a, "--wd")) {
            if (++i >= argc) DIE("%s needs a directory", a);
            o.wdir = argv[i];
        } else {
            DIE("unknown option %s (spbrun --help lists the options)", a);
        }
    }
    if (i >= argc) DIE("no program to run (spbrun --help)");
    if (!o.np) DIE("-np N is required (spbrun --help)");
    o.argv = argv + i;
    return o;
}

/* The segment, mapped here too: the launcher raises the abort in it. */
static spb_shm_header *create_segment(int np, int *fd_out)
{
    uint64_t slot, chan;
    char err[256];
    if (spb_shm_sizes(np, &slot, &chan, err, sizeof err)) DIE("%s", err);
    uint64_t bytes = spb_shm_total_bytes(np, slot, chan);
    int fd = memfd_create("spbrun", 0); /* no MFD_CLOEXEC: the ranks inherit it */
    CHECK_SYS(fd);
    CHECK_SYS(ftruncate(fd, (off_t)bytes));
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) DIE("mmap of %llu bytes: %s", (unsigned long long)bytes, strerror(errno));
    spb_shm_layout(p, np, slot, chan);
    *fd_out = fd;
    return p;
}

static pid_t start_rank(const struct options *o, int rank, int fd, const sigset_t *old_mask, pid_t launcher)
{
    pid_t pid = fork();
    CHECK_SYS(pid);
    if (pid > 0) return pid;
    /* The rank dies with the launcher, whatever kills it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher) _exit(128 + SIGKILL);
    sigprocmask(SIG_SETMASK, old_mask, NULL);
    char buf[32];
    snprintf(buf, sizeof buf, "%d", fd);
    setenv(SPB_SHM_ENV_FD, buf, 1);
    snprintf(buf, sizeof buf, "%d", rank);
    setenv(SPB_SHM_ENV_RANK, buf, 1);
    snprintf(buf, sizeof buf, "%d", o->np);
    setenv(SPB_SHM_ENV_SIZE, buf, 1);
    if (o->wdir && chdir(o->wdir) != 0) {
        fprintf(stderr, "spbrun: rank %d: cannot enter %s: %s\n", rank, o->wdir, strerror(errno));
        _exit(127);
    }
    execvp(o->argv[0], o->argv);
    fprintf(stderr, "spbrun: rank %d: cannot run %s: %s\n", rank, o->argv[0], strerror(errno));
    _exit(127);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

struct job {
    int np, running, failed, status; /* status: the first failure's */
    pid_t *pid;                      /* 0 once reaped */
    spb_shm_header *shm;
    double deadline_ms;              /* when the stragglers are killed */
};

static void fail(struct job *j, int status)
{
    if (j->failed) return;
    j->failed = 1;
    j->status = status;
    spb_shm_raise_abort(j->shm, status);
    j->deadline_ms = now_ms() + GRACE_MS;
}

/* What one rank's end means for the job.  Once the job is failing, ranks
 * that leave are its consequence: nothing more is said. */
static void rank_ended(struct job *j, int r, int wstatus)
{
    int state = atomic_load(&spb_shm_rank_of(j->shm, r)->state);
    if (j->failed) return;
    if (atomic_load(&j->shm->abort_flag)) {
        /* A rank raised the abort itself (MPI_Abort, or a fatal error of the
         * shm MPI): this end may be its own or a rank that followed it. */
        int who = atomic_load(&j->shm->abort_rank), code = atomic_load(&j->shm->abort_code);
        fprintf(stderr, "spbrun: rank %d aborted the job (MPI_Abort or a fatal MPI error, code %d): stopping the "
                        "other ranks\n", who, code);
        fail(j, code);
        return;
    }
    if (WIFSIGNALED(wstatus)) {
        int sig = WTERMSIG(wstatus);
        fprintf(stderr, "spbrun: rank %d (pid %d) killed by signal %d (%s): stopping the other ranks\n", r,
                (int)j->pid[r], sig, strsignal(sig));
        fail(j, 128 + sig);
    } else if (WEXITSTATUS(wstatus) != 0) {
        fprintf(stderr, "spbrun: rank %d exited with status %d: stopping the other ranks\n", r, WEXITSTATUS(wstatus));
        fail(j, WEXITSTATUS(wstatus));
    } else if (state == SPB_RANK_INITIALIZED) {
        fprintf(stderr, "spbrun: rank %d exited without calling MPI_Finalize: stopping the other ranks\n", r);
        fail(j, 1);
    }
}

static void kill_all(struct job *j, int sig)
{
    for (int r = 0; r < j->np; r++)
        if (j->pid[r]) kill(j->pid[r], sig);
}

int main(int argc, char **argv)
{
    struct options o = parse(argc, argv);
    struct job j = {.np = o.np, .running = o.np};
    int fd;
    j.shm = create_segment(o.np, &fd);
    j.pid = calloc((size_t)o.np, sizeof *j.pid);
    if (!j.pid) DIE("out of memory");

    /* Children's ends and the signals that stop the job arrive through
     * sigtimedwait: no handler races. */
    sigset_t events, old_mask;
    sigemptyset(&events);
    sigaddset(&events, SIGCHLD);
    sigaddset(&events, SIGINT);
    sigaddset(&events, SIGTERM);
    sigaddset(&events, SIGHUP);
    CHECK_SYS(sigprocmask(SIG_BLOCK, &events, &old_mask));
    pid_t self = getpid();
    for (int r = 0; r < o.np; r++) j.pid[r] = start_rank(&o, r, fd, &old_mask, self);
    close(fd);

    int stopped_by = 0;
    while (j.running > 0) {
        int wstatus;
        pid_t pid;
        while (j.running > 0 && (pid = waitpid(-1, &wstatus, WNOHANG)) > 0) {
            for (int r = 0; r < o.np; r++)
                if (j.pid[r] == pid) {
                    rank_ended(&j, r, wstatus);
                    j.pid[r] = 0;
                    j.running--;
                }
        }
        if (j.running == 0) break;
        if (j.failed && now_ms() >= j.deadline_ms) kill_all(&j, SIGKILL);
        struct timespec tick = {0, 100 * 1000 * 1000};
        siginfo_t info;
        int sig = sigtimedwait(&events, &info, &tick);
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
            if (!stopped_by) fprintf(stderr, "spbrun: %s: stopping the ranks\n", strsignal(sig));
            stopped_by = sig;
            fail(&j, 128 + sig);
            kill_all(&j, sig);
        }
    }
    free(j.pid);
    if (stopped_by) return 128 + stopped_by;
    return j.failed ? j.status : 0;
}
