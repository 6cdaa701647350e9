/* How N tokens (or H heads) fall on P ranks when P does not divide N: the
 * first N mod P ranks hold one more, rank i holds [offset(i), offset(i) +
 * count(i)).  This is torch.tensor_split's and numpy.array_split's rule,
 * so a PyTorch reference cut the same way holds the same tokens; the
 * largest share (ceil(N/P)) is rank 0's, which the memory model sizes;
 * and under a causal mask with contiguous chunks the ranks with the most
 * visible keys (the last) get the fewer queries, a little less imbalance
 * than the other way round.  With P | N it is the even split. */
#ifndef SPB_RUNTIME_SPLIT_H
#define SPB_RUNTIME_SPLIT_H

static inline long spb_split_count(long n, int parts, int i) { return n / parts + (i < n % parts ? 1 : 0); }

static inline long spb_split_offset(long n, int parts, int i)
{
    long rem = n % parts;
    return (long)i * (n / parts) + (i < rem ? i : rem);
}

/* The largest share: rank 0's. */
static inline long spb_split_max(long n, int parts) { return spb_split_count(n, parts, 0); }

static inline int spb_split_is_even(long n, int parts) { return n % parts == 0; }

#endif
