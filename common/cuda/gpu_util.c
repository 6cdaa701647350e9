#define _POSIX_C_SOURCE 200809L
#include "gpu_util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

uint16_t spb_bf16_from_f32(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round half to even */
    return (uint16_t)(u >> 16);
}

float spb_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

float spb_bf16_round(float x) { return spb_bf16_to_f32(spb_bf16_from_f32(x)); }

double spb_max_rel_err(const float *got, const float *want, long n)
{
    double maxref = 0.0, maxerr = 0.0;
    for (long i = 0; i < n; i++) {
        double w = want[i], g = got[i];
        if (isnan(w) || isnan(g)) return INFINITY;
        if (isinf(w) || isinf(g)) {
            if (w != g) return INFINITY;
            continue;
        }
        if (fabs(w) > maxref) maxref = fabs(w);
        if (fabs(g - w) > maxerr) maxerr = fabs(g - w);
    }
    if (maxref == 0.0) return maxerr == 0.0 ? 0.0 : 1.0;
    return maxerr / maxref;
}

double spb_tol_bf16_out(void) { return SPB_BF16_U + 16.0 * SPB_F32_U; }
double spb_tol_f32_sum(long K) { return 16.0 * sqrt((double)(K < 1 ? 1 : K)) * SPB_F32_U; }
double spb_tol_bf16_sum(long K) { return spb_tol_bf16_out() + spb_tol_f32_sum(K); }
double spb_tol_attn_forward(void) { return 4.0 * SPB_BF16_U; }
double spb_tol_attn_backward(void) { return 8.0 * SPB_BF16_U; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double spb_median(const double *x, int n)
{
    double tmp[64];
    if (n <= 0) return NAN;
    if (n > 64) n = 64;
    memcpy(tmp, x, sizeof(double) * (size_t)n);
    qsort(tmp, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

void spb_csv_field(FILE *f, const char *s, int last)
{
    if (!s) s = "";
    if (strpbrk(s, ",\"\n\r")) {
        fputc('"', f);
        for (const char *p = s; *p; p++) {
            if (*p == '"') fputc('"', f);
            fputc(*p, f);
        }
        fputc('"', f);
    } else {
        fputs(s, f);
    }
    fputc(last ? '\n' : ',', f);
}

int spb_mkdir_p(const char *dir)
{
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) return -1;
    memcpy(path, dir, n + 1);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(path, 0777) != 0 && errno != EEXIST) return -1;
    return 0;
}

FILE *spb_csv_open(const char *dir, const char *name, const char *header)
{
    char path[4096];
    if (spb_mkdir_p(dir) != 0) return NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "a");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    if (ftell(f) == 0) fprintf(f, "%s\n", header);
    fflush(f); /* a process that ends early (a watchdog, a fault) leaves a whole header */
    return f;
}
