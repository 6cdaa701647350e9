/* Lengths of unions and intersections of time intervals [begin, end): the
 * kernel timeline's arithmetic (common/cuda/cuda_trace.cu), kept apart from
 * the CUDA code so that it builds and is tested without a device
 * (tests/test_intervals.c).  A set of intervals stands for its union:
 * overlapping members (kernels on two streams at once) count once. */
#ifndef SPB_RUNTIME_INTERVALS_H
#define SPB_RUNTIME_INTERVALS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spb_interval {
    double begin, end;
} spb_interval;

/* Sorts iv by begin and merges overlapping or touching members in place;
 * empty ones (end <= begin) are dropped.  Returns how many disjoint
 * intervals remain, in iv[0 .. that). */
int spb_intervals_merge(spb_interval *iv, int n);

/* |∪ iv|.  Reorders iv. */
double spb_intervals_union_length(spb_interval *iv, int n);

/* |(∪ a) ∩ (∪ b)|: the time both sets cover (an NCCL transfer beside
 * compute: the transfer's hidden part).  Reorders a and b. */
double spb_intervals_overlap_length(spb_interval *a, int na, spb_interval *b, int nb);

#ifdef __cplusplus
}
#endif

#endif
