#define _DEFAULT_SOURCE
#include "report.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checks.h"

void spb_row_add(spb_row *r, const char *key, const char *fmt, ...)
{
    SPB_CHECK(r->n < SPB_ROW_MAX_COLUMNS);
    snprintf(r->key[r->n], sizeof r->key[0], "%s", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->value[r->n], sizeof r->value[0], fmt, ap);
    va_end(ap);
    /* Values never contain the separator or line breaks. */
    for (char *c = r->value[r->n]; *c; c++)
        if (*c == ',' || *c == '\n' || *c == '\r') *c = ';';
    r->n++;
}

static size_t join(const spb_row *r, int keys, char *buf, size_t len)
{
    size_t used = 0;
    for (int i = 0; i < r->n && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? "," : "", keys ? r->key[i] : r->value[i]);
    if (used < len) used += (size_t)snprintf(buf + used, len - used, "\n");
    return used;
}

int spb_row_check_csv(const spb_row *r, const char *path, char *err, size_t errlen)
{
    enum { LINE_MAX_BYTES = SPB_ROW_MAX_COLUMNS * 200 };
    char *header = SPB_CHECK_PTR(malloc(LINE_MAX_BYTES)), *existing = SPB_CHECK_PTR(calloc(1, LINE_MAX_BYTES + 1));
    size_t hlen = join(r, 1, header, LINE_MAX_BYTES);
    int rc = 0;
    FILE *f = fopen(path, "rb");
    if (f) { /* absent or empty: the header will be written */
        size_t got = fread(existing, 1, hlen, f);
        if (got > 0 && (got != hlen || memcmp(existing, header, hlen) != 0)) {
            snprintf(err, errlen, "results file '%s' has other columns than this spbench writes; use a new file", path);
            rc = -1;
        }
        fclose(f);
    }
    free(header);
    free(existing);
    return rc;
}

int spb_row_append_csv(const spb_row *r, const char *path, char *err, size_t errlen)
{
    enum { LINE_MAX_BYTES = SPB_ROW_MAX_COLUMNS * 200 };
    char *header = SPB_CHECK_PTR(malloc(LINE_MAX_BYTES)), *line = SPB_CHECK_PTR(malloc(LINE_MAX_BYTES));
    size_t hlen = join(r, 1, header, LINE_MAX_BYTES), llen = join(r, 0, line, LINE_MAX_BYTES);
    int rc = -1;
    int fd = open(path, O_RDWR | O_APPEND | O_CREAT, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open results file '%s': %s", path, strerror(errno));
        goto out;
    }
    flock(fd, LOCK_EX);
    struct stat st;
    fstat(fd, &st);
    char last = '\n';
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "results file '%s' is not a regular file", path);
        goto unlock;
    }
    if (st.st_size > 0 && (pread(fd, &last, 1, st.st_size - 1) != 1 || last != '\n')) {
        /* a row appended here would be glued to the torn last line */
        snprintf(err, errlen, "results file '%s' does not end with a newline (a torn last row?): repair it or use "
                 "a new file", path);
        goto unlock;
    }
    if (st.st_size == 0) {
        if (write(fd, header, hlen) != (ssize_t)hlen) goto io_error;
    } else {
        char *existing = SPB_CHECK_PTR(calloc(1, hlen + 1));
        ssize_t got = pread(fd, existing, hlen, 0);
        int same = got == (ssize_t)hlen && memcmp(existing, header, hlen) == 0;
        free(existing);
        if (!same) {
            snprintf(err, errlen, "results file '%s' has other columns than this spbench writes; use a new file", path);
            goto unlock;
        }
    }
    if (write(fd, line, llen) != (ssize_t)llen) goto io_error;
    rc = 0;
    goto unlock;
io_error:
    snprintf(err, errlen, "cannot write results file '%s': %s", path, strerror(errno));
unlock:
    flock(fd, LOCK_UN);
    close(fd);
out:
    free(header);
    free(line);
    return rc;
}
