/* The GPU check programs' watchdog: it ends the process when no check has
 * been reported and no timing row written for `limit` seconds.
 *
 * Why: a kernel that never finishes (an mbarrier wait that nothing
 * completes, on hardware that has not run that kernel before) cannot be
 * interrupted from the host.  Without the watchdog it holds the process
 * until experiments/gpu-check's outer limit for the program (minutes of a
 * short GPU lease) and ends it as "ran past its limit", which the script
 * does not retry, so every check and timing after the hang is lost.  The
 * watchdog exits with kGpuWatchdogExit instead, which the script treats as
 * it treats a fault: it runs the program again without the wgmma kernels.
 *
 * The rows written before stay: the programs flush their CSV files after
 * every row.  The watchdog writes its line with write(2) and flushes stdout
 * only if no other thread holds it, so a main thread stuck anywhere cannot
 * keep it from exiting.
 *
 * Plain POSIX threads, a mutex and CLOCK_MONOTONIC, and no sanitizer
 * instrumentation of its own functions: in the emulator's race-check build
 * every instrumented access calls the emulator's hand-written __tsan_*
 * hooks (emu_race.cc), which neither expect a second thread nor define
 * what std::thread and std::atomic would call.  CUDA C++, header-only:
 * included by gpu_check.cu and gpu_layer.cu. */
#ifndef SPB_GPU_WATCHDOG_H
#define SPB_GPU_WATCHDOG_H

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const int kGpuWatchdogExit = 5;

/* Seconds without progress before the watchdog ends the process, unless
 * --watchdog says otherwise.  The first H200 run took 49 s for every kernel
 * check and timing together, 17 s for the layer's checks; a unit's longest
 * gap (a 32K-token timing, cuDNN building a plan) is seconds.  Off on the
 * emulated device, whose kernels run on the CPU (a unit can take minutes). */
#ifdef SPB_EMU_H
static const double kGpuWatchdogDefault = 0.0;
#define SPB_WATCHDOG_UNWATCHED __attribute__((no_sanitize_thread))
#else
static const double kGpuWatchdogDefault = 60.0;
#define SPB_WATCHDOG_UNWATCHED
#endif

/* Every field is read and written under mu, in these functions only. */
static pthread_mutex_t gpu_watchdog_mu = PTHREAD_MUTEX_INITIALIZER;
static char gpu_watchdog_last[192] = "the program's start";
static double gpu_watchdog_at = 0.0, gpu_watchdog_limit = 0.0;
static int gpu_watchdog_on = 0;
static const char *gpu_watchdog_program = "";

SPB_WATCHDOG_UNWATCHED static double gpu_watchdog_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Progress, and what it was (printf's format): a check reported, a timing
 * row written, a timing begun (so that a hang names its kernel). */
SPB_WATCHDOG_UNWATCHED __attribute__((format(printf, 1, 2))) static void gpu_watchdog_progress(const char *fmt, ...)
{
    pthread_mutex_lock(&gpu_watchdog_mu);
    if (gpu_watchdog_on) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(gpu_watchdog_last, sizeof gpu_watchdog_last, fmt, ap);
        va_end(ap);
        gpu_watchdog_at = gpu_watchdog_now();
    }
    pthread_mutex_unlock(&gpu_watchdog_mu);
}

/* Called with mu held; does not return. */
SPB_WATCHDOG_UNWATCHED static void gpu_watchdog_expire(double idle)
{
    char line[512];
    int n = snprintf(line, sizeof line,
                     "\n%s: watchdog: no progress for %.1f s (--watchdog %g) after %s: a kernel that does not "
                     "finish? exiting with code %d\n",
                     gpu_watchdog_program, idle, gpu_watchdog_limit, gpu_watchdog_last, kGpuWatchdogExit);
    if (ftrylockfile(stdout) == 0) { /* what the log has buffered, unless the main thread is inside stdout */
        fflush_unlocked(stdout);
        funlockfile(stdout);
    }
    if (n > 0 && write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0) {
        /* nowhere left to say it; the exit code still does */
    }
    _exit(kGpuWatchdogExit);
}

SPB_WATCHDOG_UNWATCHED static void *gpu_watchdog_thread(void *)
{
    for (;;) {
        struct timespec quarter = {0, 250000000L};
        nanosleep(&quarter, NULL);
        pthread_mutex_lock(&gpu_watchdog_mu);
        double idle = gpu_watchdog_now() - gpu_watchdog_at;
        if (idle > gpu_watchdog_limit) gpu_watchdog_expire(idle);
        pthread_mutex_unlock(&gpu_watchdog_mu);
    }
    return NULL;
}

/* Starts the watchdog thread (limit <= 0: none). */
SPB_WATCHDOG_UNWATCHED static void gpu_watchdog_start(const char *program, double limit)
{
    if (limit <= 0) return;
    pthread_mutex_lock(&gpu_watchdog_mu);
    gpu_watchdog_program = program, gpu_watchdog_limit = limit;
    gpu_watchdog_at = gpu_watchdog_now();
    gpu_watchdog_on = 1;
    pthread_mutex_unlock(&gpu_watchdog_mu);
    pthread_t t;
    int rc = pthread_create(&t, NULL, gpu_watchdog_thread, NULL);
    if (rc != 0) { /* no thread: run on, unwatched, and say so */
        fprintf(stderr, "%s: warning: no watchdog (pthread_create: %s): a kernel that does not finish holds the "
                        "run to its outer limit\n", program, strerror(rc));
        return;
    }
    pthread_detach(t);
}

/* --watchdog SECONDS: a number >= 0 (0: off). */
static bool gpu_watchdog_parse(const char *s, double *limit)
{
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= 0.0)) return false;
    *limit = v;
    return true;
}

#endif
