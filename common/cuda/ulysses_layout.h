/* Index maps of the Ulysses exchange layouts (strategies/ulysses.c), shared
 * by the host (tests, checks) and the device permute kernels.  C11 and CUDA.
 *
 *   natural local  [B][T][w][P·Hp][D]    what a QKV product of all H = P·Hp
 *                                         heads writes for T local tokens
 *   send blocks    [P][B][T][w][Hp][D]    block j = heads [j·Hp, (j+1)·Hp):
 *                                         ulysses.c's "local" head blocks, the
 *                                         all-to-all's send layout
 *   received blocks [P][B][T][w][Hp][D]   block i = rank i's T tokens of my heads
 *   head           [B][N][w][Hp][D]       N = P·T, rank i's tokens at i·T
 *                                         (ulysses.c's blocks_to_head)
 * Every map is a bijection on [0, P·B·T·w·Hp·D). */
#ifndef SPB_ULYSSES_LAYOUT_H
#define SPB_ULYSSES_LAYOUT_H

#ifdef __CUDACC__
#define SPB_HD __host__ __device__ __forceinline__
#else
#define SPB_HD static inline
#endif

typedef struct spb_ulysses_layout {
    int P, B, T, w, Hp, D;
} spb_ulysses_layout;

SPB_HD long spb_ulysses_numel(spb_ulysses_layout u) { return (long)u.P * u.B * u.T * u.w * u.Hp * u.D; }

/* natural index -> send-block index */
SPB_HD long spb_ulysses_pack_index(spb_ulysses_layout u, long src)
{
    long d = src % u.D;
    long r = src / u.D;
    long hh = r % ((long)u.P * u.Hp); /* head 0..H-1 */
    r /= (long)u.P * u.Hp;
    long wi = r % u.w;
    r /= u.w;
    long t = r % u.T;
    long b = r / u.T;
    long j = hh / u.Hp, h = hh % u.Hp;
    return ((((j * u.B + b) * u.T + t) * u.w + wi) * u.Hp + h) * u.D + d;
}

/* received-block index -> head-layout index: block i, sequence b, element e
 * of that sequence's chunk of T·w·Hp·D goes to sequence b, tokens at i·T. */
SPB_HD long spb_ulysses_head_index(spb_ulysses_layout u, long src)
{
    long chunk = (long)u.T * u.w * u.Hp * u.D;
    long e = src % chunk;
    long r = src / chunk;
    long b = r % u.B, i = r / u.B;
    return (b * u.P + i) * chunk + e;
}

#endif
