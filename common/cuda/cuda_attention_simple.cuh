/* Part of cuda_attention.cu (its first comment describes every kernel family):
 * The SIMPLE kernels (one thread per row; the reference the fast ones are
 * checked against on the GPU): forward, delta, dQ, dK/dV.
 * Split off for length, not an interface: included once, by
 * cuda_attention.cu only, in the order there, and it uses what the parts
 * before it define (one translation unit; the CUDA emulation's
 * translate.py inlines it). */
/* ========================== SIMPLE ========================================== */
#define ST 64 /* rows per block and per staged tile */

/* Keys [0, n) of the block visible to query row i (attention.h). */
__device__ __forceinline__ int visible_keys(const spb_attn_desc &d, long i)
{
    if (!d.causal) return d.k_len;
    long last = d.q_offset + i - d.k_offset;
    if (last < 0) return 0;
    return last >= d.k_len ? d.k_len : (int)(last + 1);
}

/* Causal: the first query tile (of TILE rows) with a row that sees key j0
 * of the block, or of a block of keys from j0; 0 without the mask. */
template <int TILE> __device__ __forceinline__ int first_query_tile(const spb_attn_desc &d, long j0)
{
    long i_first = d.causal ? d.k_offset + j0 - d.q_offset : 0;
    return i_first <= 0 ? 0 : (int)((i_first > d.q_len ? d.q_len : i_first) / TILE * TILE);
}

/* Rows [first, first + ST) of one head of a [batch][token][head][D] tensor
 * into shared memory (rows at or past `limit` as zeros), by the block's ST
 * threads; base = batch offset + head offset. */
template <typename T, int D>
__device__ __forceinline__ void stage_rows(T (*dst)[D], const spb_bf16 *src, long base, long token_stride,
                                           int first, int limit)
{
    for (int e = threadIdx.x; e < ST * D; e += ST) {
        int r = e / D, x = e % D;
        dst[r][x] = first + r < limit ? ((const T *)src)[base + (long)(first + r) * token_stride + x]
                                      : elem<T>::from_f(0.0f);
    }
}

/* Grouped-query attention: the K/V head query head h reads (attention.h's
 * spb_attn_kv_head, host code there) and the K/V heads per token. */
__device__ __forceinline__ int kv_head_of(const spb_attn_desc &d, int h)
{
    return d.kv_heads > 0 ? h / (d.heads / d.kv_heads) : h;
}
__device__ __forceinline__ int kv_heads_of(const spb_attn_desc &d) { return d.kv_heads > 0 ? d.kv_heads : d.heads; }

template <typename T, int D>
__global__ void __launch_bounds__(ST) fwd_simple(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                 const spb_bf16 *v, spb_bf16 *o, float *lse)
{
    __shared__ T Ks[ST][D], Vs[ST][D];
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * ST + threadIdx.x;
    const bool live = i < d.q_len;
    const int n = live ? visible_keys(d, i) : 0;
    const int i_last = min(blockIdx.x * ST + ST - 1, d.q_len - 1);
    const int n_block = visible_keys(d, i_last); /* the block's widest row (causal: its last) */
    float qr[D], acc[D], m = -INFINITY, l = 0.0f;
    const float c = d.scale * LOG2E;
    for (int x = 0; x < D; x++) {
        qr[x] = live ? c * ld<T>(q, b * d.q_batch_stride + (long)i * d.q_token_stride + (long)h * D + x) : 0.0f;
        acc[x] = 0.0f;
    }
    for (int j0 = 0; j0 < n_block; j0 += ST) {
        __syncthreads();
        stage_rows<T, D>(Ks, k, b * d.k_batch_stride + (long)kv_head_of(d, h) * D, d.k_token_stride, j0, d.k_len);
        stage_rows<T, D>(Vs, v, b * d.k_batch_stride + (long)kv_head_of(d, h) * D, d.k_token_stride, j0, d.k_len);
        __syncthreads();
        for (int r = 0; r < ST && j0 + r < n; r++) {
            float s = 0.0f;
            for (int x = 0; x < D; x++) s += qr[x] * elem<T>::to_f(Ks[r][x]);
            if (s > m) { /* new maximum: rescale what was summed so far */
                float corr = exp2f(m - s);
                l *= corr;
                for (int x = 0; x < D; x++) acc[x] *= corr;
                m = s;
            }
            float p = exp2f(s - m);
            l += p;
            for (int x = 0; x < D; x++) acc[x] += p * elem<T>::to_f(Vs[r][x]);
        }
    }
    if (!live) return;
    T *orow = (T *)o + b * d.o_batch_stride + (long)i * d.o_token_stride + (long)h * D;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int x = 0; x < D; x++) orow[x] = elem<T>::from_f(acc[x] * inv);
    lse[((long)b * d.heads + h) * d.q_len + i] = l > 0.0f ? (m + log2f(l)) * LN2 : -INFINITY;
}

/* D_i = dO_i . O_i, fp32, [B][H][q_len] */
template <typename T>
__global__ void attn_delta(spb_attn_desc d, const spb_bf16 *o, const spb_bf16 *dout, float *delta)
{
    long idx = blockIdx.x * (long)blockDim.x + threadIdx.x;
    long total = (long)d.batch * d.heads * d.q_len;
    if (idx >= total) return;
    int i = (int)(idx % d.q_len), h = (int)((idx / d.q_len) % d.heads), b = (int)(idx / ((long)d.q_len * d.heads));
    long off = b * d.o_batch_stride + (long)i * d.o_token_stride + (long)h * d.head_dim;
    float s = 0.0f;
    for (int x = 0; x < d.head_dim; x++) s += ld<T>(o, off + x) * ld<T>(dout, off + x);
    delta[idx] = s;
}

template <typename T, int D>
__global__ void __launch_bounds__(ST) dq_simple(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                const spb_bf16 *v, const float *lse, const float *delta,
                                                const spb_bf16 *dout, float *dq)
{
    __shared__ T Ks[ST][D], Vs[ST][D];
    const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * ST + threadIdx.x;
    const long row = ((long)b * d.heads + h) * d.q_len + i;
    const bool live = i < d.q_len && lse[i < d.q_len ? row : 0] > -INFINITY;
    const int n = live ? visible_keys(d, i) : 0;
    const int n_block = visible_keys(d, min(blockIdx.x * ST + ST - 1, d.q_len - 1));
    float qr[D], dor[D], acc[D];
    const float L = live ? lse[row] : 0.0f, Di = live ? delta[row] : 0.0f;
    const long qoff = b * d.q_batch_stride + (long)i * d.q_token_stride + (long)h * D;
    const long ooff = b * d.o_batch_stride + (long)i * d.o_token_stride + (long)h * D;
    for (int x = 0; x < D; x++) {
        qr[x] = live ? ld<T>(q, qoff + x) : 0.0f;
        dor[x] = live ? ld<T>(dout, ooff + x) : 0.0f;
        acc[x] = 0.0f;
    }
    for (int j0 = 0; j0 < n_block; j0 += ST) {
        __syncthreads();
        stage_rows<T, D>(Ks, k, b * d.k_batch_stride + (long)kv_head_of(d, h) * D, d.k_token_stride, j0, d.k_len);
        stage_rows<T, D>(Vs, v, b * d.k_batch_stride + (long)kv_head_of(d, h) * D, d.k_token_stride, j0, d.k_len);
        __syncthreads();
        for (int r = 0; r < ST && j0 + r < n; r++) {
            float s = 0.0f, dp = 0.0f;
            for (int x = 0; x < D; x++) {
                s += qr[x] * elem<T>::to_f(Ks[r][x]);
                dp += dor[x] * elem<T>::to_f(Vs[r][x]);
            }
            float p = expf(d.scale * s - L), ds = p * (dp - Di);
            for (int x = 0; x < D; x++) acc[x] += ds * elem<T>::to_f(Ks[r][x]);
        }
    }
    if (!live) return;
    for (int x = 0; x < D; x++) dq[qoff + x] += d.scale * acc[x];
}

template <typename T, int D>
__global__ void __launch_bounds__(ST) dkv_simple(spb_attn_desc d, const spb_bf16 *q, const spb_bf16 *k,
                                                 const spb_bf16 *v, const float *lse, const float *delta,
                                                 const spb_bf16 *dout, float *dk, float *dv)
{
    __shared__ T Qs[ST][D], dOs[ST][D];
    __shared__ float Ls[ST], Ds[ST];
    /* blockIdx.y: the K/V head g; the query heads that read it (all
     * heads / kv_heads of them) add into one key row: one writer */
    const int b = blockIdx.z, g = blockIdx.y, j = blockIdx.x * ST + threadIdx.x, group = d.heads / kv_heads_of(d);
    const bool live = j < d.k_len;
    const long koff = b * d.k_batch_stride + (long)j * d.k_token_stride + (long)g * D;
    float kr[D], vr[D], dka[D], dva[D];
    for (int x = 0; x < D; x++) {
        kr[x] = live ? ld<T>(k, koff + x) : 0.0f;
        vr[x] = live ? ld<T>(v, koff + x) : 0.0f;
        dka[x] = dva[x] = 0.0f;
    }
    for (int h = g * group; h < (g + 1) * group; h++) {
        for (int i0 = first_query_tile<ST>(d, (long)blockIdx.x * ST); i0 < d.q_len; i0 += ST) {
            __syncthreads();
            stage_rows<T, D>(Qs, q, b * d.q_batch_stride + (long)h * D, d.q_token_stride, i0, d.q_len);
            stage_rows<T, D>(dOs, dout, b * d.o_batch_stride + (long)h * D, d.o_token_stride, i0, d.q_len);
            if (i0 + (int)threadIdx.x < d.q_len) {
                long row = ((long)b * d.heads + h) * d.q_len + i0 + threadIdx.x;
                Ls[threadIdx.x] = lse[row];
                Ds[threadIdx.x] = delta[row];
            } else {
                Ls[threadIdx.x] = -INFINITY;
                Ds[threadIdx.x] = 0.0f;
            }
            __syncthreads();
            if (!live) continue;
            for (int r = 0; r < ST && i0 + r < d.q_len; r++) {
                if (d.causal && d.k_offset + j > d.q_offset + i0 + r) continue;
                if (!(Ls[r] > -INFINITY)) continue;
                float s = 0.0f, dp = 0.0f;
                for (int x = 0; x < D; x++) {
                    s += kr[x] * elem<T>::to_f(Qs[r][x]);
                    dp += vr[x] * elem<T>::to_f(dOs[r][x]);
                }
                float p = expf(d.scale * s - Ls[r]), ds = p * (dp - Ds[r]);
                for (int x = 0; x < D; x++) {
                    dva[x] += p * elem<T>::to_f(dOs[r][x]);
                    dka[x] += ds * elem<T>::to_f(Qs[r][x]);
                }
            }
        }
    }
    if (!live) return;
    for (int x = 0; x < D; x++) {
        dk[koff + x] += d.scale * dka[x];
        dv[koff + x] += dva[x];
    }
}
