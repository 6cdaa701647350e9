/* Host-side helpers of the GPU checks (plain C, no CUDA, no MPI): bf16
 * rounding on the host, the error metric and the tolerance bounds, medians,
 * and the CSV writer.  Tested on any machine by tests/gpu/test_gpu_util.c. */
#ifndef SPB_GPU_UTIL_H
#define SPB_GPU_UTIL_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* bf16: 8 significant bits (7 stored + the implicit one), so the spacing in
 * [1, 2) is 2^-7 and round to nearest even has a relative error of at most
 * u = 2^-8 ~ 3.9e-3 (the unit roundoff). */
#define SPB_BF16_U (1.0 / 256.0)
#define SPB_F32_U (1.0 / 16777216.0) /* 2^-24 */

uint16_t spb_bf16_from_f32(float x); /* round to nearest even; NaN stays NaN */
float spb_bf16_to_f32(uint16_t h);
float spb_bf16_round(float x); /* x rounded to bf16 and back */

/* max_i |got_i - want_i| / max_i |want_i|  (1 when want is all zero and got is
 * not, 0 when both are; equal infinities count as no error, unequal as +inf,
 * a NaN as +inf). */
double spb_max_rel_err(const float *got, const float *want, long n);

/* Tolerances, as bounds on spb_max_rel_err (see docs/GPU.md):
 *  - one final rounding to bf16, fp32 arithmetic before it:
 *    u + 16·2^-24 (the fp32 difference before rounding)
 *  - a K-term fp32 sum of exact products (inputs identical on both sides):
 *    rounding errors of the partial sums add up like a random walk, so
 *    relative to the sum (itself ~ sqrt(K) x a term for random signs) they
 *    grow ~ sqrt(K) 2^-24; 16 sqrt(K) 2^-24 leaves room for the max over
 *    many outputs and for the smaller outputs of a row.
 *  - the same, rounded to bf16 at the end:                        u + that
 *  - attention forward, tensor cores: P rounded to bf16 before P·V (u/2 per
 *    term, independent, so ~ u/2 relative to the weighted mean) and O rounded
 *    (u/2):                                                        4u
 *  - attention backward: dS (and P for dV) rounded to bf16 once per term;
 *    Σ_j dS_ij = 0 makes dQ, dK sums with cancellation whose size is again
 *    ~ sqrt(K) x a term for random inputs, the errors ~ sqrt(K) u/2 x a term: 8u
 *  - permutes and conversions: exact (0). */
double spb_tol_bf16_out(void);
double spb_tol_f32_sum(long K);
double spb_tol_bf16_sum(long K);
double spb_tol_attn_forward(void);
double spb_tol_attn_backward(void);

/* Median of n values (sorts a copy; n <= 64). */
double spb_median(const double *x, int n);

/* CSV: a field quoted when it holds a comma, quote or newline (quotes
 * doubled).  spb_csv_open makes the directory (and its parents), and writes
 * the header when the file is new or empty; append mode. */
void spb_csv_field(FILE *f, const char *s, int last);
FILE *spb_csv_open(const char *dir, const char *name, const char *header);
int spb_mkdir_p(const char *dir);

#ifdef __cplusplus
}
#endif

#endif
