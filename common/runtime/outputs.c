#define _POSIX_C_SOURCE 200809L
#include "outputs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The directory part of path ("." when it has none). */
static void directory_of(const char *path, char *dir, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, len, ".");
    else if (slash == path) snprintf(dir, len, "/");
    else snprintf(dir, len, "%.*s", (int)(slash - path), path);
}

static int directory_writable(const char *option, const char *path, char *err, size_t errlen)
{
    char dir[SPB_PATH_MAX];
    struct stat st;
    directory_of(path, dir, sizeof dir);
    if (stat(dir, &st) != 0) {
        snprintf(err, errlen, "--%s '%s': directory '%s': %s", option, path, dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "--%s '%s': '%s' is not a directory", option, path, dir);
        return -1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, errlen, "--%s '%s': directory '%s' is not writable: %s", option, path, dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* Whether the regular file at path starts as a file of `kind` does. */
static int is_kind(const char *path, spb_output_kind kind)
{
    static const char *starts[] = {[SPB_OUT_CHECKPOINT] = "SPBCKPT", [SPB_OUT_DUMP] = "SPBDUMP",
                                   [SPB_OUT_LOSS_LOG] = "iteration,loss,"};
    const char *want = starts[kind];
    size_t n = strlen(want) + (kind == SPB_OUT_LOSS_LOG ? 0 : 1); /* the magic's NUL too */
    char got[32] = {0};
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return 0;
    ssize_t r = read(fd, got, n);
    close(fd);
    return r == (ssize_t)n && memcmp(got, want, n) == 0;
}

int spb_output_check(const char *option, const char *path, spb_output_kind kind, int overwrite, char *err,
                     size_t errlen)
{
    static const char *names[] = {[SPB_OUT_CHECKPOINT] = "checkpoint", [SPB_OUT_DUMP] = "dump",
                                  [SPB_OUT_LOSS_LOG] = "loss log"};
    if (!path[0]) {
        snprintf(err, errlen, "--%s: empty path", option);
        return -1;
    }
    if (directory_writable(option, path, err, errlen)) return -1;
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "--%s '%s': %s", option, path, strerror(errno));
        return -1;
    }
    if (kind == SPB_OUT_LOSS_LOG && S_ISCHR(st.st_mode)) return 0; /* /dev/null, a terminal: written in place */
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "--%s '%s' exists and is not a regular file (%s): spbench never replaces one", option,
                 path, S_ISDIR(st.st_mode) ? "a directory" : S_ISLNK(st.st_mode) ? "a symbolic link" : "a device, "
                 "pipe or socket");
        return -1;
    }
    if (!overwrite && st.st_size > 0 && !is_kind(path, kind)) {
        snprintf(err, errlen, "--%s '%s' exists and is not a spbench %s: not replaced (remove it, choose another "
                 "path, or give --overwrite)", option, path, names[kind]);
        return -1;
    }
    return 0;
}

/* The results CSV is appended to: its directory must exist, and a file there
 * must be regular and end with a newline (else the row would be glued to a
 * torn last line).  Its columns are checked once the run's row is known. */
static int results_check(const char *path, char *err, size_t errlen)
{
    if (directory_writable("results", path, err, errlen)) return -1;
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        snprintf(err, errlen, "--results '%s': %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "--results '%s' is not a regular file", path);
        return -1;
    }
    if (access(path, W_OK) != 0) {
        snprintf(err, errlen, "--results '%s': %s", path, strerror(errno));
        return -1;
    }
    if (st.st_size > 0) {
        char last = 0;
        int fd = open(path, O_RDONLY);
        ssize_t r = fd >= 0 ? pread(fd, &last, 1, st.st_size - 1) : -1;
        if (fd >= 0) close(fd);
        if (r != 1 || last != '\n') {
            snprintf(err, errlen, "results file '%s' does not end with a newline (a torn last row?): repair it or "
                     "use a new file", path);
            return -1;
        }
    }
    return 0;
}

int spb_outputs_check(const spb_config *c, char *err, size_t errlen)
{
    if (c->save[0] && spb_output_check("save", c->save, SPB_OUT_CHECKPOINT, c->overwrite, err, errlen)) return -1;
    if (c->dump[0]) {
        char ckpt[SPB_PATH_MAX + 8];
        snprintf(ckpt, sizeof ckpt, "%s.ckpt", c->dump);
        if (spb_output_check("dump", c->dump, SPB_OUT_DUMP, c->overwrite, err, errlen) ||
            spb_output_check("dump", ckpt, SPB_OUT_CHECKPOINT, c->overwrite, err, errlen))
            return -1;
    }
    if (c->loss_log[0] && spb_output_check("loss-log", c->loss_log, SPB_OUT_LOSS_LOG, c->overwrite, err, errlen))
        return -1;
    if (c->results[0] && results_check(c->results, err, errlen)) return -1;
    /* one file, two outputs: the second would overwrite the first */
    const char *paths[] = {c->save, c->dump, c->loss_log, c->results, c->load};
    const char *names[] = {"save", "dump", "loss-log", "results", "load"};
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 5; b++)
            if (paths[a][0] && !strcmp(paths[a], paths[b]) && !(a == 0 && b == 4)) {
                snprintf(err, errlen, "--%s and --%s name the same file '%s'", names[a], names[b], paths[a]);
                return -1;
            }
    return 0;
}
