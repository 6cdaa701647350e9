/* The kernel timeline's interval arithmetic (common/runtime/intervals.h),
 * on hand-made intervals: the union of a set (overlapping members count
 * once) and the overlap of two sets, |(∪ a) ∩ (∪ b)|, which the timeline
 * reports as the NCCL time hidden behind compute.  Cases: disjoint,
 * nested, partial, touching, empty members, unsorted input, and a "two
 * streams" picture (compute on one stream, transfers on another, a second
 * compute stream overlapping the first).  Every expected figure is worked
 * out in the comment beside it. */
#include <check.h>
#include <math.h>

#include "check_run.h"
#include "intervals.h"

#define EQ(a, b) ck_assert_msg(fabs((a) - (b)) <= 1e-12, "%s = %.15g, expected %.15g", #a, (double)(a), (double)(b))

enum { MAX = 16 };

/* copies, since the functions reorder their input */
static double union_of(const spb_interval *iv, int n)
{
    spb_interval c[MAX];
    for (int i = 0; i < n; i++) c[i] = iv[i];
    return spb_intervals_union_length(c, n);
}
static double overlap_of(const spb_interval *a, int na, const spb_interval *b, int nb)
{
    spb_interval ca[MAX], cb[MAX];
    for (int i = 0; i < na; i++) ca[i] = a[i];
    for (int i = 0; i < nb; i++) cb[i] = b[i];
    return spb_intervals_overlap_length(ca, na, cb, nb);
}

START_TEST(unions)
{
    const spb_interval disjoint[] = {{5, 6}, {0, 1}, {2, 4}}; /* 1 + 1 + 2 */
    EQ(union_of(disjoint, 3), 4);
    const spb_interval nested[] = {{0, 10}, {2, 3}, {4, 9}}; /* inside [0, 10) */
    EQ(union_of(nested, 3), 10);
    const spb_interval partial[] = {{3, 8}, {0, 4}}; /* [0, 8) */
    EQ(union_of(partial, 2), 8);
    const spb_interval touching[] = {{1, 2}, {0, 1}, {2, 3.5}}; /* [0, 3.5) */
    EQ(union_of(touching, 3), 3.5);
    const spb_interval empty[] = {{4, 4}, {6, 5}, {0, 1}}; /* zero and negative lengths add nothing */
    EQ(union_of(empty, 3), 1);
    EQ(union_of(NULL, 0), 0);
    spb_interval m[] = {{7, 9}, {0, 2}, {1, 3}, {8, 8.5}, {3, 4}};
    ck_assert_int_eq(spb_intervals_merge(m, 5), 2); /* [0, 4) and [7, 9) */
    EQ(m[0].begin, 0), EQ(m[0].end, 4), EQ(m[1].begin, 7), EQ(m[1].end, 9);
}
END_TEST

START_TEST(overlaps)
{
    /* disjoint sets: nothing hidden */
    const spb_interval comp1[] = {{0, 1}, {2, 3}}, comm1[] = {{1, 2}, {3, 4}};
    EQ(overlap_of(comm1, 2, comp1, 2), 0);
    /* a transfer nested inside compute: all of it hidden */
    const spb_interval comp2[] = {{0, 10}}, comm2[] = {{2, 5}};
    EQ(overlap_of(comm2, 1, comp2, 1), 3);
    /* compute nested inside a transfer: the compute's length */
    EQ(overlap_of(comp2, 1, (const spb_interval[]){{-1, 12}}, 1), 10);
    /* partial: [4, 6) of the transfer [4, 9) lies under compute [0, 6) */
    const spb_interval comp3[] = {{0, 6}}, comm3[] = {{4, 9}};
    EQ(overlap_of(comm3, 1, comp3, 1), 2);
    EQ(overlap_of(comp3, 1, comm3, 1), 2); /* symmetric */
    /* several intervals each side, unsorted: compute [0,2) [3,5) [6,9),
     * transfers [1,4) [4.5,7) [8,10): 1 + 1 + 0.5 + 1 + 1 = 4.5 */
    const spb_interval comp4[] = {{6, 9}, {0, 2}, {3, 5}}, comm4[] = {{8, 10}, {1, 4}, {4.5, 7}};
    EQ(overlap_of(comm4, 3, comp4, 3), 4.5);
    /* two compute streams overlapping each other count once: [0,4) and
     * [2,6) cover [0,6); transfers [1,3) [5,8): 2 + 1 = 3 (summed stream
     * by stream, 2 + 1 + 0 + 1 = 4: [2,3) counted twice) */
    const spb_interval comp5[] = {{0, 4}, {2, 6}}, comm5[] = {{1, 3}, {5, 8}};
    EQ(overlap_of(comm5, 2, comp5, 2), 3);
    /* one long transfer beside two overlapping compute streams, [1,5) and
     * [2,6): their union [1,6), 5 hidden (pair by pair 4 + 4 = 8) */
    const spb_interval comp7[] = {{2, 6}, {1, 5}}, comm7[] = {{0, 10}};
    EQ(overlap_of(comm7, 1, comp7, 2), 5);
    EQ(overlap_of(comp7, 2, comm7, 1), 5);
    /* two transfer streams overlapping each other: [1,5) and [3,7) cover
     * [1,7); compute [0,2) [6,9): 1 + 1 = 2 */
    const spb_interval comp6[] = {{0, 2}, {6, 9}}, comm6[] = {{1, 5}, {3, 7}};
    EQ(overlap_of(comm6, 2, comp6, 2), 2);
    /* identity: |a ∩ b| = |a| + |b| − |a ∪ b| on the last case */
    spb_interval both[4] = {comp6[0], comp6[1], comm6[0], comm6[1]};
    EQ(overlap_of(comm6, 2, comp6, 2), union_of(comp6, 2) + union_of(comm6, 2) - union_of(both, 4));
    /* hidden never exceeds either set's union */
    ck_assert(overlap_of(comm4, 3, comp4, 3) <= union_of(comm4, 3) && overlap_of(comm4, 3, comp4, 3) <= union_of(comp4, 3));
    /* empty sides */
    EQ(overlap_of(comm4, 3, NULL, 0), 0);
    EQ(overlap_of(NULL, 0, comp4, 3), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("intervals");
    TCase *tc = tcase_create("arithmetic");
    tcase_add_test(tc, unions);
    tcase_add_test(tc, overlaps);
    suite_add_tcase(s, tc);
    return spb_run_suite(s, CK_NOFORK);
}
