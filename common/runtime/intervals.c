/* Interval unions and intersections; see intervals.h. */
#include "intervals.h"

#include <stdlib.h>

static int by_begin(const void *x, const void *y)
{
    const spb_interval *a = x, *b = y;
    return (a->begin > b->begin) - (a->begin < b->begin);
}

int spb_intervals_merge(spb_interval *iv, int n)
{
    if (n <= 0) return 0;
    qsort(iv, (size_t)n, sizeof *iv, by_begin);
    int out = 0;
    for (int i = 0; i < n; i++) {
        if (!(iv[i].end > iv[i].begin)) continue; /* empty (or NaN) */
        if (out > 0 && iv[i].begin <= iv[out - 1].end) {
            if (iv[i].end > iv[out - 1].end) iv[out - 1].end = iv[i].end;
        } else {
            iv[out++] = iv[i];
        }
    }
    return out;
}

double spb_intervals_union_length(spb_interval *iv, int n)
{
    n = spb_intervals_merge(iv, n);
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += iv[i].end - iv[i].begin;
    return sum;
}

double spb_intervals_overlap_length(spb_interval *a, int na, spb_interval *b, int nb)
{
    na = spb_intervals_merge(a, na);
    nb = spb_intervals_merge(b, nb);
    /* two disjoint sorted lists: walk both, advancing the one that ends first */
    double sum = 0.0;
    int i = 0, j = 0;
    while (i < na && j < nb) {
        double lo = a[i].begin > b[j].begin ? a[i].begin : b[j].begin;
        double hi = a[i].end < b[j].end ? a[i].end : b[j].end;
        if (hi > lo) sum += hi - lo;
        if (a[i].end < b[j].end) i++;
        else j++;
    }
    return sum;
}
