/* Results rows: a CSV file with a header line, one row per run, each row
 * written whole with a single append under an exclusive lock, so concurrent
 * or interrupted runs never leave a torn row. */
#ifndef SPB_REPORT_H
#define SPB_REPORT_H

#include <stddef.h>

enum { SPB_ROW_MAX_COLUMNS = 160 };

typedef struct spb_row {
    int n;
    char key[SPB_ROW_MAX_COLUMNS][40];
    char value[SPB_ROW_MAX_COLUMNS][160];
} spb_row;

void spb_row_add(spb_row *r, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Appends r to path, writing the header first if the file is new or empty.
 * Fails (without writing) if the file's header has other columns. */
int spb_row_append_csv(const spb_row *r, const char *path, char *err, size_t errlen);
/* Whether r could be appended to path: 0 if the file is absent, empty or
 * has r's header; -1 with a message otherwise.  Writes nothing. */
int spb_row_check_csv(const spb_row *r, const char *path, char *err, size_t errlen);

#endif
