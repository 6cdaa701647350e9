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
 * keep it from exiting.  CUDA C++, header-only: included by gpu_check.cu and
 * gpu_layer.cu. */
#ifndef SPB_GPU_WATCHDOG_H
#define SPB_GPU_WATCHDOG_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

static const int kGpuWatchdogExit = 5;

/* Seconds without progress before the watchdog ends the process, unless
 * --watchdog says otherwise.  The first H200 run took 49 s for every kernel
 * check and timing together, 17 s for the layer's checks; a unit's longest
 * gap (a 32K-token timing, cuDNN building a plan) is seconds.  Off on the
 * emulated device, whose kernels run on the CPU (a unit can take minutes). */
#ifdef SPB_EMU_H
static const double kGpuWatchdogDefault = 0.0;
#else
static const double kGpuWatchdogDefault = 60.0;
#endif

struct gpu_watchdog_state {
    std::mutex mu;
    char last[192] = "the program's start";
    std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
    std::atomic<bool> on{false};
    double limit = 0.0;
    const char *program = "";
};

static gpu_watchdog_state &gpu_watchdog()
{
    static gpu_watchdog_state s;
    return s;
}

/* Progress, and what it was (printf's format): a check reported, a timing
 * row written, a timing begun (so that a hang names its kernel). */
__attribute__((format(printf, 1, 2))) static void gpu_watchdog_progress(const char *fmt, ...)
{
    gpu_watchdog_state &w = gpu_watchdog();
    if (!w.on.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> lock(w.mu);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w.last, sizeof w.last, fmt, ap);
    va_end(ap);
    w.at = std::chrono::steady_clock::now();
}

static void gpu_watchdog_expire(gpu_watchdog_state &w, double idle)
{
    char line[512];
    int n = snprintf(line, sizeof line,
                     "\n%s: watchdog: no progress for %.0f s (--watchdog %.0f) after %s: a kernel that does not "
                     "finish? exiting with code %d\n",
                     w.program, idle, w.limit, w.last, kGpuWatchdogExit);
    if (ftrylockfile(stdout) == 0) { /* what the log has buffered, unless the main thread is inside stdout */
        fflush_unlocked(stdout);
        funlockfile(stdout);
    }
    if (n > 0 && write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0) {
        /* nowhere left to say it; the exit code still does */
    }
    _exit(kGpuWatchdogExit);
}

/* Starts the watchdog thread (limit <= 0: none). */
static void gpu_watchdog_start(const char *program, double limit)
{
    if (limit <= 0) return;
    gpu_watchdog_state &w = gpu_watchdog();
    w.program = program, w.limit = limit;
    w.at = std::chrono::steady_clock::now();
    try {
        std::thread([&w] {
            for (;;) {
                std::this_thread::sleep_for(std::chrono::milliseconds(250));
                std::lock_guard<std::mutex> lock(w.mu);
                double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - w.at).count();
                if (idle > w.limit) gpu_watchdog_expire(w, idle);
            }
        }).detach();
    } catch (const std::exception &e) { /* no threads (a link without them): run on, unwatched, and say so */
        fprintf(stderr, "%s: warning: no watchdog (%s): a kernel that does not finish holds the run to its "
                        "outer limit\n", program, e.what());
        return;
    }
    w.on.store(true);
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
