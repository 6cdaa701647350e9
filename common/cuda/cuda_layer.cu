/* Over 700 lines: one device transformer layer, forward and backward, whose passes share its plan and buffers. */
/* The device transformer layer and the small device GPT (cuda_layer.h): the
 * CPU core's layer_forward and the layer loop of spb_gpt_backward
 * (common/core/gpt.c, TP = 1, one head block) call for call, on the kernels of
 * spb_cuda.h.  Two small kernels of its own: "y = x + b" (the residual plus
 * the bias, onto which the proj/fcproj products accumulate in fp32) and the
 * fp32 column sums of the residual gradient (the proj/fcproj bias
 * gradients), and the log-sum-exp merge of ring attention's blocks.
 *
 * Fusion (spb_cuda_layer_set_fusion, on by default, FAST kernels only): the
 * biases and the residual go into the products' cuBLASLt epilogue (D = A·Bᵀ
 * + C + bias, C the residual stream) instead of passes of their own, and
 * the residual gradient's column sums and its bf16 copy share one read, and
 * so do the fc bias gradient and GELU's backward.  At 32K tokens of the 7B
 * shape that removes about 8 GB of memory traffic per step (docs/GPU.md,
 * which adds the LayerNorm's row blocks).  The SIMPLE kernels keep the separate passes: the
 * plain path the layer check compares both against the CPU. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_launch.cuh"
#include "cuda_layer.h"
#include "cudnn_attention.h"

/* ------------------------------------------------------------ kernels -- */
/* y[r][c] = x[r][c] + b[c] (fp32); blockIdx.y walks the rows */
__global__ void k_bias_residual(float *y, const float *x, const float *b, int rows, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float bc = b[c];
    for (int r = blockIdx.y; r < rows; r += gridDim.y) y[(long)r * C + c] = x[(long)r * C + c] + bc;
}

/* db[c] += sum_r d[r][c] (fp32): 32 columns x 8 row lanes per block, a strip
 * of 256 rows per block row, one atomic per column and strip. */
__global__ void k_colsum_f32(float *db, const float *d, int rows, int C)
{
    __shared__ float part[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * 256;
    int r1 = r0 + 256 < rows ? r0 + 256 : rows;
    float acc = 0.0f;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) acc += d[(long)r * C + c];
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0.0f;
        for (int k = 0; k < 8; k++) s += part[k][threadIdx.x];
        atomicAdd(&db[c], s);
    }
}

/* Ring merge: (o_acc, lse_acc) <- the log-sum-exp combination of itself
 * and a block's (o_blk, lse_blk), for tokens [t0, t0 + len) of T (a run of
 * the zigzag layout; all T for the contiguous one).  o [B][T][H][D] (acc
 * fp32, blk bf16), lse of the run [B][H][len].  One warp per (b, t, h) row. */
__global__ void k_lse_merge(float *o_acc, float *lse_acc, const __nv_bfloat16 *o_blk, const float *lse_blk, int B,
                            int T, int H, int D, int t0, int len)
{
    long row = (blockIdx.x * (long)blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (row >= (long)B * len * H) return;
    int h = (int)(row % H);
    long bt = row / H;
    int t = (int)(bt % len), b = (int)(bt / len);
    long li = ((long)b * H + h) * len + t;
    float la = lse_acc[li], lb = lse_blk[li];
    if (lb == -INFINITY) return; /* the block has no visible key for this row */
    float m = la > lb ? la : lb;
    float lse = m + logf(expf(la - m) + expf(lb - m)); /* la = -inf: expf(-inf) = 0 */
    float wa = expf(la - lse), wb = expf(lb - lse);
    long oi = (((long)b * T + t0 + t) * H + h) * D;
    float *oa = o_acc + oi;
    const __nv_bfloat16 *ob = o_blk + oi;
    for (int e = lane; e < D; e += 32) oa[e] = oa[e] * wa + __bfloat162float(ob[e]) * wb;
    __syncwarp();
    if (lane == 0) lse_acc[li] = lse;
}

__global__ void k_fill_f32(float *p, float v, long n)
{
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

/* dy = bf16(d) and db[c] += sum_r d[r][c] (fp32) in one read of d: 128
 * columns (4 per lane, 16-byte loads) x 8 row lanes per block, a strip of 256
 * rows per block row, one atomic per column and strip (the order of
 * k_colsum_f32's sums).  C % 4 == 0, d and dy 16- and 8-byte aligned. */
__global__ void k_colsum_to_bf16(float *db, __nv_bfloat16 *dy, const float *d, int rows, int C)
{
    __shared__ float4 part[8][32];
    int c = 4 * (blockIdx.x * 32 + threadIdx.x);
    int r0 = blockIdx.y * 256;
    int r1 = r0 + 256 < rows ? r0 + 256 : rows;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            long i = (long)r * C + c;
            float4 v = *(const float4 *)(d + i);
            acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
            *(uint2 *)(dy + i) = spb_bf16x4_pack(v.x, v.y, v.z, v.w);
        }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int k = 0; k < 8; k++) {
            float4 q = part[k][threadIdx.x];
            t.x += q.x, t.y += q.y, t.z += q.z, t.w += q.w;
        }
        atomicAdd(&db[c], t.x), atomicAdd(&db[c + 1], t.y), atomicAdd(&db[c + 2], t.z), atomicAdd(&db[c + 3], t.w);
    }
}

static unsigned blocks_for(long n, int per) { return (unsigned)((n + per - 1) / per); }

static void bias_residual(float *y, const float *x, const float *b, int rows, int C, cudaStream_t s)
{
    if (rows <= 0) return;
    dim3 grid((unsigned)((C + 255) / 256), (unsigned)(rows < 4096 ? rows : 4096));
    k_bias_residual<<<grid, 256, 0, s>>>(y, x, b, rows, C);
    SPB_CUDA_CHECK(cudaGetLastError());
}

static void colsum_f32(float *db, const float *d, int rows, int C, cudaStream_t s)
{
    dim3 block(32, 8), grid((unsigned)((C + 31) / 32), (unsigned)((rows + 255) / 256));
    k_colsum_f32<<<grid, block, 0, s>>>(db, d, rows, C);
    SPB_CUDA_CHECK(cudaGetLastError());
}

/* db += column sums of d, dy = bf16(d): one pass where fused, else two */
static void colsum_and_bf16(float *db, spb_bf16 *dy, const float *d, int rows, int C, int fused, cudaStream_t s)
{
    if (fused && C % 4 == 0 && (uintptr_t)d % 16 == 0 && (uintptr_t)dy % 8 == 0) {
        dim3 block(32, 8), grid((unsigned)((C + 127) / 128), (unsigned)((rows + 255) / 256));
        k_colsum_to_bf16<<<grid, block, 0, s>>>(db, (__nv_bfloat16 *)dy, d, rows, C);
        SPB_CUDA_CHECK(cudaGetLastError());
        return;
    }
    colsum_f32(db, d, rows, C, s);
    spb_cuda_f32_to_bf16(dy, d, (long)rows * C, s);
}

/* -------------------------------------------------------------- layer -- */
enum { T_LN1_W, T_LN1_B, T_QKV_W, T_QKV_B, T_PROJ_W, T_PROJ_B, T_LN2_W, T_LN2_B, T_FC_W, T_FC_B, T_FCPROJ_W,
       T_FCPROJ_B };

extern "C" long spb_cuda_layer_numel(const spb_cuda_layer_shape *s, long offsets[SPB_CUDA_LAYER_TENSORS],
                                     long sizes[SPB_CUDA_LAYER_TENSORS])
{
    long C = s->C, Ca = (long)s->H * s->D, F = s->F;
    const long n[SPB_CUDA_LAYER_TENSORS] = {C, C, 3 * Ca * C, 3 * Ca, C * Ca, C, C, C, F * C, F, C * F, C};
    long off = 0;
    for (int k = 0; k < SPB_CUDA_LAYER_TENSORS; k++) {
        if (offsets) offsets[k] = off;
        if (sizes) sizes[k] = n[k];
        off += n[k];
    }
    return off;
}

struct spb_cuda_layer {
    spb_cuda_layer_shape s;
    spb_cuda_gemm *g;
    spb_cuda_impl impl;
    long off[SPB_CUDA_LAYER_TENSORS], numel;
    float *p, *gr;
    spb_bf16 *pb;
    int own_p, own_pb, own_gr;
    size_t bytes;
    /* saved by forward */
    const float *x;
    spb_bf16 *ln1_out, *qkv, *atto, *ln2_out, *fc_pre, *fc_act;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse, *res_mid;
    /* Ulysses: head-layout q/k/v, O and lse (saved), permute scratch */
    spb_bf16 *qkv_h, *o_h, *blocks, *do_h, *dqkv_h;
    float *lse_h;
    /* ring: merged O in fp32, a block's O and lse */
    float *o_acc, *lse_blk;
    spb_bf16 *o_blk;
    /* backward scratch */
    spb_bf16 *dy, *dfc, *datto, *dqkv, *dln;
    float *dqkv32, *attn_ws;
    int cudnn;  /* attention through cuDNN's fused kernels (spb_cuda_layer_set_attention_cudnn) */
    int fusion; /* epilogue fusion (spb_cuda_layer_set_fusion); in effect with the FAST kernels only */
    /* per-phase timing (spb_cuda_layer_set_phase_timing): an event before
     * the forward's first kernel and after each phase of forward and backward */
    int phase_on, phases;
    const char *phase_name[SPB_CUDA_LAYER_PHASES_MAX];
    cudaEvent_t phase_ev[SPB_CUDA_LAYER_PHASES_MAX + 1];
};

static void *lalloc(spb_cuda_layer *L, spb_mem_category cat, size_t bytes)
{
    L->bytes += bytes;
    return spb_cuda_alloc(cat, bytes);
}

extern "C" spb_cuda_layer *spb_cuda_layer_create(const spb_cuda_layer_shape *s, spb_cuda_gemm *g, spb_cuda_impl impl,
                                                 float *params, spb_bf16 *params_bf16, float *grads)
{
    SPB_CHECK(s->B > 0 && s->T > 0 && s->H > 0 && s->F > 0 && s->P >= 1);
    SPB_CHECK(s->D == 64 || s->D == 128);
    /* Every tensor of the flat vectors, and every activation row, starts on
     * a 256-byte boundary (cuBLASLt's default alignment assumption). */
    SPB_CHECK(s->C % 128 == 0 && ((long)s->H * s->D) % 128 == 0 && s->F % 128 == 0);
    if (s->attn == SPB_LAYER_ATTN_ULYSSES) SPB_CHECK(s->H % s->P == 0);
    if (spb_layer_is_ring(s)) SPB_CHECK(s->ring_rank >= 0 && s->ring_rank < s->P);
    if (s->attn == SPB_LAYER_ATTN_RING_ZIGZAG) SPB_CHECK(s->T % 2 == 0);
    spb_cuda_layer *L = (spb_cuda_layer *)calloc(1, sizeof *L);
    SPB_CHECK(L);
    L->s = *s;
    L->g = g;
    L->impl = impl;
    L->fusion = 1;
    L->numel = spb_cuda_layer_numel(s, L->off, NULL);
    L->p = params, L->pb = params_bf16, L->gr = grads;
    if (!L->p) L->p = (float *)lalloc(L, SPB_MEM_PARAMS, 4 * (size_t)L->numel), L->own_p = 1;
    if (!L->pb) L->pb = (spb_bf16 *)lalloc(L, SPB_MEM_PARAMS, 2 * (size_t)L->numel), L->own_pb = 1;
    if (!L->gr) {
        L->gr = (float *)lalloc(L, SPB_MEM_GRADS, 4 * (size_t)L->numel), L->own_gr = 1;
        SPB_CUDA_CHECK(cudaMemset(L->gr, 0, 4 * (size_t)L->numel));
    }
    const size_t rows = (size_t)s->B * s->T, C = (size_t)s->C, Ca = (size_t)s->H * s->D, F = (size_t)s->F;
    const size_t lse_n = (size_t)s->B * s->H * s->T; /* [B][H][T] (Ulysses: [B][H/P][P·T], the same count) */
    L->ln1_out = (spb_bf16 *)lalloc(L, SPB_MEM_ACTIVATIONS, 2 * rows * C);
    L->ln1_mean = (float *)lalloc(L, SPB_MEM_ACTIVATIONS, 4 * rows);
    L->ln1_rstd = (float *)lalloc(L, SPB_MEM_ACTIVATIONS, 4 * rows);
    L->qkv = (spb_bf16 *)lalloc(L, SPB_MEM_ACTIVATIONS, 2 * rows * 3 * Ca);
    L->atto = (spb_bf16 *)lalloc(L, SPB_MEM_ACTIVATIONS, 2 * rows * Ca);
    L->lse = (float *)lalloc(L, SPB_MEM_ACTIVATIONS, 4 * lse_n);
    L->res_mid = (float *)lalloc(L, SPB_MEM_ACTIVATIONS, 4 * rows * C);
    L->ln2_out = (spb_bf16 *)lalloc(L, SPB_MEM_ACTIVATIONS, 2 * rows * C);
    L->ln2_mean = (float *)lalloc(L, SPB_MEM_ACTIVATIONS, 4 * rows);
    L->ln2_rstd = (float *)lalloc(L, SPB_MEM_ACTIVATIONS, 4 * rows);
    L->fc_pre = (spb_bf16 *)lalloc(L, SPB_MEM_ACTIVATIONS, 2 * rows * F);
    L->fc_act = (spb_bf16 *)lalloc(L, SPB_MEM_ACTIVATIONS, 2 * rows * F);
    if (s->attn == SPB_LAYER_ATTN_ULYSSES) {
        L->qkv_h = (spb_bf16 *)lalloc(L, SPB_MEM_ACTIVATIONS, 2 * rows * 3 * Ca);
        L->o_h = (spb_bf16 *)lalloc(L, SPB_MEM_ACTIVATIONS, 2 * rows * Ca);
        L->lse_h = (float *)lalloc(L, SPB_MEM_ACTIVATIONS, 4 * lse_n);
        L->blocks = (spb_bf16 *)lalloc(L, SPB_MEM_COMM, 2 * rows * 3 * Ca);
        L->do_h = (spb_bf16 *)lalloc(L, SPB_MEM_WORKSPACE, 2 * rows * Ca);
        L->dqkv_h = (spb_bf16 *)lalloc(L, SPB_MEM_WORKSPACE, 2 * rows * 3 * Ca);
    }
    if (spb_layer_is_ring(s)) {
        L->o_acc = (float *)lalloc(L, SPB_MEM_WORKSPACE, 4 * rows * Ca);
        L->o_blk = (spb_bf16 *)lalloc(L, SPB_MEM_WORKSPACE, 2 * rows * Ca);
        L->lse_blk = (float *)lalloc(L, SPB_MEM_WORKSPACE, 4 * lse_n);
    }
    L->dy = (spb_bf16 *)lalloc(L, SPB_MEM_WORKSPACE, 2 * rows * C);
    L->dfc = (spb_bf16 *)lalloc(L, SPB_MEM_WORKSPACE, 2 * rows * F);
    L->datto = (spb_bf16 *)lalloc(L, SPB_MEM_WORKSPACE, 2 * rows * Ca);
    L->dqkv = (spb_bf16 *)lalloc(L, SPB_MEM_WORKSPACE, 2 * rows * 3 * Ca);
    L->dln = (spb_bf16 *)lalloc(L, SPB_MEM_WORKSPACE, 2 * rows * C);
    L->dqkv32 = (float *)lalloc(L, SPB_MEM_WORKSPACE, 4 * rows * 3 * Ca);
    L->attn_ws = (float *)lalloc(L, SPB_MEM_WORKSPACE, 4 * lse_n);
    return L;
}

extern "C" void spb_cuda_layer_destroy(spb_cuda_layer *L)
{
    if (!L) return;
    void *bufs[] = {L->ln1_out, L->ln1_mean, L->ln1_rstd, L->qkv,    L->atto,  L->lse,    L->res_mid, L->ln2_out,
                    L->ln2_mean, L->ln2_rstd, L->fc_pre,  L->fc_act, L->qkv_h, L->o_h,    L->lse_h,   L->blocks,
                    L->do_h,     L->dqkv_h,   L->o_acc,   L->o_blk,  L->lse_blk, L->dy,   L->dfc,     L->datto,
                    L->dqkv,     L->dln,      L->dqkv32,  L->attn_ws};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) spb_cuda_free(bufs[k]);
    if (L->own_p) spb_cuda_free(L->p);
    if (L->own_pb) spb_cuda_free(L->pb);
    if (L->own_gr) spb_cuda_free(L->gr);
    if (L->phase_ev[0])
        for (int i = 0; i <= SPB_CUDA_LAYER_PHASES_MAX; i++) SPB_CUDA_CHECK(cudaEventDestroy(L->phase_ev[i]));
    free(L);
}

extern "C" float *spb_cuda_layer_params(spb_cuda_layer *L) { return L->p; }
extern "C" spb_bf16 *spb_cuda_layer_params_bf16(spb_cuda_layer *L) { return L->pb; }
extern "C" float *spb_cuda_layer_grads(spb_cuda_layer *L) { return L->gr; }
extern "C" const spb_cuda_layer_shape *spb_cuda_layer_get_shape(const spb_cuda_layer *L) { return &L->s; }
extern "C" void spb_cuda_layer_set_impl(spb_cuda_layer *L, spb_cuda_impl impl) { L->impl = impl; }
extern "C" int spb_cuda_layer_set_fusion(spb_cuda_layer *L, int on)
{
    int was = L->fusion;
    L->fusion = on != 0;
    return was;
}
static int fused(const spb_cuda_layer *L) { return L->fusion && L->impl == SPB_CUDA_FAST; }

extern "C" void spb_cuda_layer_set_phase_timing(spb_cuda_layer *L, int on)
{
    if (on && !L->phase_ev[0])
        for (int i = 0; i <= SPB_CUDA_LAYER_PHASES_MAX; i++) SPB_CUDA_CHECK(cudaEventCreate(&L->phase_ev[i]));
    L->phase_on = on != 0;
    L->phases = 0;
}

/* the end of one phase (the forward's first call also marks the start) */
static void phase_mark(spb_cuda_layer *L, const char *name, cudaStream_t st)
{
    if (!L->phase_on || L->phases >= SPB_CUDA_LAYER_PHASES_MAX) return;
    L->phase_name[L->phases] = name;
    SPB_CUDA_CHECK(cudaEventRecord(L->phase_ev[++L->phases], st));
}
static void phase_start(spb_cuda_layer *L, cudaStream_t st)
{
    if (!L->phase_on) return;
    L->phases = 0;
    SPB_CUDA_CHECK(cudaEventRecord(L->phase_ev[0], st));
}

extern "C" int spb_cuda_layer_phase_times(spb_cuda_layer *L, const char **names, float *ms, int max)
{
    if (!L->phase_on || L->phases == 0) return 0;
    SPB_CUDA_CHECK(cudaEventSynchronize(L->phase_ev[L->phases]));
    int n = L->phases < max ? L->phases : max;
    for (int i = 0; i < n; i++) {
        names[i] = L->phase_name[i];
        SPB_CUDA_CHECK(cudaEventElapsedTime(&ms[i], L->phase_ev[i], L->phase_ev[i + 1]));
    }
    return n;
}

extern "C" int spb_cuda_layer_set_attention_cudnn(spb_cuda_layer *L, int on, char *why, size_t n)
{
    if (on && !spb_cudnn_attention_built()) {
        snprintf(why, n, "this build has no cuDNN (%s)", spb_cudnn_attention_version());
        return -1;
    }
    if (on && L->s.attn != SPB_LAYER_ATTN_LOCAL) {
        /* the layer check (against the CPU layer) covers local layers only */
        snprintf(why, n, "Ulysses and ring layers keep the flash kernels");
        return -1;
    }
    L->cudnn = on != 0;
    return 0;
}

/* One cuDNN call's failure ends the run with its reason (the layer has no
 * error path: its callers are timing and check programs). */
#define LAYER_CUDNN(call)                                                                                             \
    do {                                                                                                              \
        char why_[512];                                                                                               \
        if ((call) != 0) SPB_DIE("layer: cuDNN attention: %s", why_);                                               \
    } while (0)
extern "C" size_t spb_cuda_layer_bytes(const spb_cuda_layer *L) { return L->bytes; }

extern "C" void spb_cuda_layer_sync_params(spb_cuda_layer *L, cudaStream_t s)
{
    spb_cuda_f32_to_bf16(L->pb, L->p, L->numel, s);
}

/* The attention descriptor over a fused [B][len][3][heads][D] buffer. */
static spb_attn_desc qkv_desc(int B, int heads, int D, int q_len, long q_off, int k_len, long k_off, int causal)
{
    spb_attn_desc d;
    memset(&d, 0, sizeof d);
    long W = (long)heads * D;
    d.batch = B, d.heads = heads, d.head_dim = D, d.q_len = q_len, d.k_len = k_len;
    d.q_offset = q_off, d.k_offset = k_off, d.causal = causal, d.scale = 1.0f / sqrtf((float)D);
    d.q_token_stride = d.k_token_stride = 3 * W;
    d.q_batch_stride = 3 * W * q_len, d.k_batch_stride = 3 * W * k_len;
    d.o_token_stride = W, d.o_batch_stride = W * q_len;
    return d;
}

/* Ring attention's pieces: key block j (0..P-1) of run b against this
 * rank's query run a.  Contiguous: one run of T tokens, queries at r·T,
 * keys at j·T.  Zigzag: runs 0 and 1 of c = T/2 tokens, the rank's at
 * chunks r and 2P-1-r, block j's at chunks j and 2P-1-j.  The keys' data
 * are this rank's own runs (the shape of the compute, not its values). */
static int ring_piece_visible(const spb_cuda_layer_shape *s, int a, int j, int b)
{
    return !s->causal || spb_layer_ring_run_start(s, j, b) <= spb_layer_ring_run_start(s, s->ring_rank, a);
}
/* the piece's descriptor: Q, K, V runs of the fused [B][T][3][H][D] buffer,
 * O and dO runs of [B][T][H][D] (the callers offset the pointers by the
 * runs' first tokens), lse of the query run [B][H][T / runs] */
static spb_attn_desc ring_desc(const spb_cuda_layer_shape *s, int a, int j, int b)
{
    const int len = s->T / spb_layer_ring_runs(s);
    const long W = (long)s->H * s->D;
    spb_attn_desc d = qkv_desc(s->B, s->H, s->D, len, spb_layer_ring_run_start(s, s->ring_rank, a), len,
                               spb_layer_ring_run_start(s, j, b), s->causal);
    d.q_batch_stride = d.k_batch_stride = 3 * W * s->T;
    d.o_batch_stride = W * s->T;
    return d;
}

static void attention_forward(spb_cuda_layer *L, cudaStream_t st)
{
    const spb_cuda_layer_shape *s = &L->s;
    const long W = (long)s->H * s->D;
    if (s->attn == SPB_LAYER_ATTN_LOCAL) {
        spb_attn_desc d = qkv_desc(s->B, s->H, s->D, s->T, 0, s->T, 0, s->causal);
        if (L->cudnn)
            LAYER_CUDNN(spb_cudnn_attention_forward(&d, SPB_CUDNN_BF16, L->qkv, L->qkv + W, L->qkv + 2 * W, L->atto,
                                                    L->lse, st, why_, sizeof why_));
        else
            spb_cuda_attention_forward(&d, L->qkv, L->qkv + W, L->qkv + 2 * W, L->atto, L->lse, L->impl, st);
    } else if (s->attn == SPB_LAYER_ATTN_ULYSSES) {
        const int P = s->P, Hp = s->H / P, N = P * s->T;
        /* natural [B][T][3][H][D] -> send blocks -> (all-to-all: identity) -> head [B][N][3][Hp][D] */
        spb_cuda_ulysses_pack(L->blocks, L->qkv, P, s->B, s->T, 3, Hp, s->D, L->impl, st);
        spb_cuda_ulysses_blocks_to_head(L->qkv_h, L->blocks, P, s->B, s->T, 3, Hp, s->D, L->impl, st);
        spb_attn_desc d = qkv_desc(s->B, Hp, s->D, N, 0, N, 0, s->causal);
        const long Wh = (long)Hp * s->D;
        spb_cuda_attention_forward(&d, L->qkv_h, L->qkv_h + Wh, L->qkv_h + 2 * Wh, L->o_h, L->lse_h, L->impl, st);
        /* head [B][N][1][Hp][D] -> blocks -> (all-to-all) -> natural [B][T][H][D] */
        spb_cuda_ulysses_head_to_blocks(L->blocks, L->o_h, P, s->B, s->T, 1, Hp, s->D, L->impl, st);
        spb_cuda_ulysses_unpack(L->atto, L->blocks, P, s->B, s->T, 1, Hp, s->D, L->impl, st);
    } else {
        const long rows = (long)s->B * s->T, lse_n = (long)s->B * s->H * s->T;
        const int runs = spb_layer_ring_runs(s), len = s->T / runs;
        const long lse_run = lse_n / runs; /* L->lse and lse_blk: [runs][B][H][len] */
        SPB_CUDA_CHECK(cudaMemsetAsync(L->o_acc, 0, sizeof(float) * rows * W, st));
        k_fill_f32<<<blocks_for(lse_n, 256), 256, 0, st>>>(L->lse, -INFINITY, lse_n);
        SPB_CUDA_CHECK(cudaGetLastError());
        for (int j = 0; j < s->P; j++)
            for (int a = 0; a < runs; a++)
                for (int b = 0; b < runs; b++) {
                    if (!ring_piece_visible(s, a, j, b)) continue;
                    spb_attn_desc d = ring_desc(s, a, j, b);
                    const spb_bf16 *qa = L->qkv + (long)a * len * 3 * W, *kb = L->qkv + (long)b * len * 3 * W + W;
                    spb_bf16 *oa = L->o_blk + (long)a * len * W;
                    spb_cuda_attention_forward(&d, qa, kb, kb + W, oa, L->lse_blk + a * lse_run, L->impl, st);
                    long nrows = (long)s->B * len * s->H;
                    k_lse_merge<<<blocks_for(nrows * 32, 256), 256, 0, st>>>(
                        L->o_acc, L->lse + a * lse_run, (const __nv_bfloat16 *)L->o_blk, L->lse_blk + a * lse_run,
                        s->B, s->T, s->H, s->D, a * len, len);
                    SPB_CUDA_CHECK(cudaGetLastError());
                }
        spb_cuda_f32_to_bf16(L->atto, L->o_acc, rows * W, st);
    }
}

/* datto -> dqkv (bf16, natural layout). */
static void attention_backward(spb_cuda_layer *L, cudaStream_t st)
{
    const spb_cuda_layer_shape *s = &L->s;
    const long W = (long)s->H * s->D, rows = (long)s->B * s->T;
    if (L->cudnn) { /* a local layer (spb_cuda_layer_set_attention_cudnn) */
        /* cuDNN writes the 16-bit dQ, dK, dV at Q's and K's strides: straight
         * into the fused bf16 gradient, no fp32 pass */
        spb_attn_desc d = qkv_desc(s->B, s->H, s->D, s->T, 0, s->T, 0, s->causal);
        LAYER_CUDNN(spb_cudnn_attention_backward(&d, SPB_CUDNN_BF16, L->qkv, L->qkv + W, L->qkv + 2 * W, L->atto,
                                                 L->lse, L->datto, L->dqkv, L->dqkv + W, L->dqkv + 2 * W, st, why_,
                                                 sizeof why_));
        return;
    }
    SPB_CUDA_CHECK(cudaMemsetAsync(L->dqkv32, 0, sizeof(float) * rows * 3 * W, st));
    if (s->attn == SPB_LAYER_ATTN_LOCAL) {
        spb_attn_desc d = qkv_desc(s->B, s->H, s->D, s->T, 0, s->T, 0, s->causal);
        spb_cuda_attention_backward(&d, L->qkv, L->qkv + W, L->qkv + 2 * W, L->atto, L->lse, L->datto, L->dqkv32,
                                    L->dqkv32 + W, L->dqkv32 + 2 * W, L->attn_ws, L->impl, st);
        spb_cuda_f32_to_bf16(L->dqkv, L->dqkv32, rows * 3 * W, st);
    } else if (s->attn == SPB_LAYER_ATTN_ULYSSES) {
        const int P = s->P, Hp = s->H / P, N = P * s->T;
        const long Wh = (long)Hp * s->D;
        spb_cuda_ulysses_pack(L->blocks, L->datto, P, s->B, s->T, 1, Hp, s->D, L->impl, st);
        spb_cuda_ulysses_blocks_to_head(L->do_h, L->blocks, P, s->B, s->T, 1, Hp, s->D, L->impl, st);
        spb_attn_desc d = qkv_desc(s->B, Hp, s->D, N, 0, N, 0, s->causal);
        spb_cuda_attention_backward(&d, L->qkv_h, L->qkv_h + Wh, L->qkv_h + 2 * Wh, L->o_h, L->lse_h, L->do_h,
                                    L->dqkv32, L->dqkv32 + Wh, L->dqkv32 + 2 * Wh, L->attn_ws, L->impl, st);
        spb_cuda_f32_to_bf16(L->dqkv_h, L->dqkv32, rows * 3 * W, st);
        spb_cuda_ulysses_head_to_blocks(L->blocks, L->dqkv_h, P, s->B, s->T, 3, Hp, s->D, L->impl, st);
        spb_cuda_ulysses_unpack(L->dqkv, L->blocks, P, s->B, s->T, 3, Hp, s->D, L->impl, st);
    } else {
        /* Every block's dK/dV accumulate into this rank's own (in a ring run
         * they travel with their block: the same kernels, plus the transfers). */
        const int runs = spb_layer_ring_runs(s), len = s->T / runs;
        const long lse_run = (long)s->B * s->H * len;
        for (int j = 0; j < s->P; j++)
            for (int a = 0; a < runs; a++)
                for (int b = 0; b < runs; b++) {
                    if (!ring_piece_visible(s, a, j, b)) continue;
                    spb_attn_desc d = ring_desc(s, a, j, b);
                    const long qa = (long)a * len * 3 * W, kb = (long)b * len * 3 * W + W, oa = (long)a * len * W;
                    spb_cuda_attention_backward(&d, L->qkv + qa, L->qkv + kb, L->qkv + kb + W, L->atto + oa,
                                                L->lse + a * lse_run, L->datto + oa, L->dqkv32 + qa, L->dqkv32 + kb,
                                                L->dqkv32 + kb + W, L->attn_ws, L->impl, st);
                }
        spb_cuda_f32_to_bf16(L->dqkv, L->dqkv32, rows * 3 * W, st);
    }
}

/* out (bf16) [rows][n] = inp [rows][in] · W[n][in]ᵀ + b, tensors tw and tb:
 * fused, the bias in cuBLASLt's epilogue (from the bf16 copy: it takes a
 * bias of D's type); else the fp32 bias in a pass of its own. */
static void product_bias(spb_cuda_layer *L, spb_bf16 *out, const spb_bf16 *inp, int in, int n, int tw, int tb,
                         cudaStream_t st)
{
    const int rows = L->s.B * L->s.T;
    const spb_bf16 *W = L->pb + L->off[tw];
    if (fused(L))
        spb_cuda_gemm_epilogue(L->g, 0, 0, 1, rows, n, in, 1.0f, inp, in, W, in, 0.0f, NULL, out, n, 0,
                               L->pb + L->off[tb], st);
    else
        spb_cuda_matmul_forward(L->g, out, 0, inp, W, L->p + L->off[tb], rows, in, n, st);
}

/* y (fp32) [rows][C] = resid + b + act [rows][in] · W[C][in]ᵀ, accumulated in
 * fp32 (the residual stream never rounded to bf16): fused, one cuBLASLt call
 * (C = resid, D = y, the bias in the epilogue); else y = resid + b in a pass,
 * then the product accumulated onto it. */
static void product_onto_residual(spb_cuda_layer *L, float *y, const float *resid, const spb_bf16 *act, int in,
                                  int tw, int tb, cudaStream_t st)
{
    const int rows = L->s.B * L->s.T, C = L->s.C;
    const spb_bf16 *W = L->pb + L->off[tw];
    const float *b = L->p + L->off[tb];
    if (fused(L)) {
        spb_cuda_gemm_epilogue(L->g, 0, 0, 1, rows, C, in, 1.0f, act, in, W, in, 1.0f, resid, y, C, 1, b, st);
    } else {
        bias_residual(y, resid, b, rows, C, st);
        spb_cuda_gemm_bf16(L->g, 0, 1, rows, C, in, 1.0f, act, in, W, in, 1.0f, y, C, 1, st);
    }
}

extern "C" void spb_cuda_layer_forward(spb_cuda_layer *L, const float *x, float *y, cudaStream_t st)
{
    const spb_cuda_layer_shape *s = &L->s;
    const int rows = s->B * s->T, C = s->C, Ca = s->H * s->D, F = s->F;
    const float *p = L->p;
    const long *o = L->off;
    L->x = x;
    phase_start(L, st);
    /* attention block */
    spb_cuda_layernorm_forward(L->ln1_out, L->ln1_mean, L->ln1_rstd, x, p + o[T_LN1_W], p + o[T_LN1_B], rows, C,
                               L->impl, st);
    phase_mark(L, "fwd ln1", st);
    product_bias(L, L->qkv, L->ln1_out, C, 3 * Ca, T_QKV_W, T_QKV_B, st);
    phase_mark(L, "fwd qkv product + bias", st);
    attention_forward(L, st);
    phase_mark(L, "fwd attention", st);
    product_onto_residual(L, L->res_mid, x, L->atto, Ca, T_PROJ_W, T_PROJ_B, st);
    phase_mark(L, "fwd proj product + bias + residual", st);
    /* MLP block */
    spb_cuda_layernorm_forward(L->ln2_out, L->ln2_mean, L->ln2_rstd, L->res_mid, p + o[T_LN2_W], p + o[T_LN2_B],
                               rows, C, L->impl, st);
    phase_mark(L, "fwd ln2", st);
    product_bias(L, L->fc_pre, L->ln2_out, C, F, T_FC_W, T_FC_B, st);
    phase_mark(L, "fwd fc product + bias", st);
    spb_cuda_gelu_forward(L->fc_act, L->fc_pre, (long)rows * F, L->impl, st);
    phase_mark(L, "fwd gelu", st);
    product_onto_residual(L, y, L->res_mid, L->fc_act, F, T_FCPROJ_W, T_FCPROJ_B, st);
    phase_mark(L, "fwd fcproj product + bias + residual", st);
}

extern "C" void spb_cuda_layer_backward(spb_cuda_layer *L, float *dx, cudaStream_t st)
{
    const spb_cuda_layer_shape *s = &L->s;
    const int rows = s->B * s->T, C = s->C, Ca = s->H * s->D, F = s->F;
    const float *p = L->p;
    const spb_bf16 *pb = L->pb;
    float *gr = L->gr;
    const long *o = L->off;
    SPB_CHECK(L->x);
    /* a backward without the forward's start mark (a caller that timed
     * only the backward) starts its own */
    if (L->phase_on && L->phases == 0) phase_start(L, st);
    /* MLP block: dx = d y */
    colsum_and_bf16(gr + o[T_FCPROJ_B], L->dy, dx, rows, C, fused(L), st);
    phase_mark(L, "bwd fcproj bias grad + dy to bf16", st);
    spb_cuda_matmul_backward(L->g, L->dfc, gr + o[T_FCPROJ_W], NULL, L->dy, L->fc_act, pb + o[T_FCPROJ_W], rows, F,
                             C, 0, L->impl, st);
    phase_mark(L, "bwd fcproj products", st);
    if (fused(L)) { /* the fc bias gradient summed as GELU's backward writes dfc */
        spb_cuda_gelu_backward_bias_grad(L->dfc, L->fc_pre, L->dfc, gr + o[T_FC_B], rows, F, L->impl, st);
    } else {
        spb_cuda_gelu_backward(L->dfc, L->fc_pre, L->dfc, (long)rows * F, L->impl, st);
        spb_cuda_bias_grad(gr + o[T_FC_B], L->dfc, rows, F, L->impl, st);
    }
    phase_mark(L, "bwd gelu + fc bias grad", st);
    spb_cuda_matmul_backward(L->g, L->dln, gr + o[T_FC_W], NULL, L->dfc, L->ln2_out, pb + o[T_FC_W], rows, C, F, 0,
                             L->impl, st);
    phase_mark(L, "bwd fc products", st);
    /* dx += LN2's input gradient: dx = d res_mid */
    spb_cuda_layernorm_backward(dx, gr + o[T_LN2_W], gr + o[T_LN2_B], L->dln, L->res_mid, p + o[T_LN2_W],
                                L->ln2_mean, L->ln2_rstd, rows, C, L->impl, st);
    phase_mark(L, "bwd ln2", st);
    /* attention block */
    colsum_and_bf16(gr + o[T_PROJ_B], L->dy, dx, rows, C, fused(L), st);
    phase_mark(L, "bwd proj bias grad + dy to bf16", st);
    spb_cuda_matmul_backward(L->g, L->datto, gr + o[T_PROJ_W], NULL, L->dy, L->atto, pb + o[T_PROJ_W], rows, Ca, C,
                             0, L->impl, st);
    phase_mark(L, "bwd proj products", st);
    attention_backward(L, st);
    phase_mark(L, "bwd attention", st);
    spb_cuda_matmul_backward(L->g, L->dln, gr + o[T_QKV_W], gr + o[T_QKV_B], L->dqkv, L->ln1_out, pb + o[T_QKV_W],
                             rows, C, 3 * Ca, 0, L->impl, st);
    phase_mark(L, "bwd qkv products + bias grad", st);
    /* dx += LN1's input gradient: dx = d x */
    spb_cuda_layernorm_backward(dx, gr + o[T_LN1_W], gr + o[T_LN1_B], L->dln, L->x, p + o[T_LN1_W], L->ln1_mean,
                                L->ln1_rstd, rows, C, L->impl, st);
    phase_mark(L, "bwd ln1", st);
}

/* ---------------------------------------------------------------- GPT -- */
struct spb_cuda_gpt {
    int L, C, H, D, F, V, maxpos, B, T, causal;
    spb_cuda_gemm *g;
    spb_cuda_impl impl;
    long numel, off_wte, off_wpe, off_lnf_w, off_lnf_b;
    float *p, *gr;
    spb_bf16 *pb;
    spb_cuda_layer **layers;
    float **x; /* L + 1 residual streams */
    int *tokens, *targets;
    long *positions;
    spb_bf16 *lnf_out, *logits, *dlnf;
    float *lnf_mean, *lnf_rstd, *losses, *dx;
};

extern "C" spb_cuda_gpt *spb_cuda_gpt_create(int L, int C, int H, int F, int V, int maxpos, int B, int T, int causal,
                                             spb_cuda_gemm *g, spb_cuda_impl impl)
{
    SPB_CHECK(L >= 1 && H >= 1 && C % H == 0 && T <= maxpos);
    spb_cuda_gpt *m = (spb_cuda_gpt *)calloc(1, sizeof *m);
    SPB_CHECK(m);
    m->L = L, m->C = C, m->H = H, m->D = C / H, m->F = F, m->V = V, m->maxpos = maxpos, m->B = B, m->T = T;
    m->causal = causal, m->g = g, m->impl = impl;
    spb_cuda_layer_shape s;
    memset(&s, 0, sizeof s);
    s.B = B, s.T = T, s.C = C, s.H = H, s.D = C / H, s.F = F, s.causal = causal, s.attn = SPB_LAYER_ATTN_LOCAL;
    s.P = 1;
    long per_layer = spb_cuda_layer_numel(&s, NULL, NULL);
    m->off_wte = 0;
    m->off_wpe = (long)V * C;
    long off = m->off_wpe + (long)maxpos * C;
    long first_layer = off;
    off += per_layer * L;
    m->off_lnf_w = off;
    m->off_lnf_b = off + C;
    m->numel = off + 2L * C;
    m->p = (float *)spb_cuda_alloc(SPB_MEM_PARAMS, 4 * (size_t)m->numel);
    m->pb = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_PARAMS, 2 * (size_t)m->numel);
    m->gr = (float *)spb_cuda_alloc(SPB_MEM_GRADS, 4 * (size_t)m->numel);
    SPB_CUDA_CHECK(cudaMemset(m->gr, 0, 4 * (size_t)m->numel));
    m->layers = (spb_cuda_layer **)calloc((size_t)L, sizeof *m->layers);
    m->x = (float **)calloc((size_t)L + 1, sizeof *m->x);
    SPB_CHECK(m->layers && m->x);
    for (int l = 0; l < L; l++) {
        long o = first_layer + per_layer * l;
        m->layers[l] = spb_cuda_layer_create(&s, g, impl, m->p + o, m->pb + o, m->gr + o);
    }
    const size_t rows = (size_t)B * T;
    for (int l = 0; l <= L; l++) m->x[l] = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * rows * C);
    m->tokens = (int *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, sizeof(int) * rows);
    m->targets = (int *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, sizeof(int) * rows);
    m->positions = (long *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, sizeof(long) * (size_t)T);
    long *pos = (long *)malloc(sizeof(long) * (size_t)T);
    SPB_CHECK(pos);
    for (int t = 0; t < T; t++) pos[t] = t;
    SPB_CUDA_CHECK(cudaMemcpy(m->positions, pos, sizeof(long) * (size_t)T, cudaMemcpyHostToDevice));
    free(pos);
    m->lnf_out = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * rows * C);
    m->lnf_mean = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * rows);
    m->lnf_rstd = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * rows);
    m->logits = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * rows * V);
    m->losses = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * rows);
    m->dlnf = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 2 * rows * C);
    m->dx = (float *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 4 * rows * C);
    return m;
}

extern "C" void spb_cuda_gpt_destroy(spb_cuda_gpt *m)
{
    if (!m) return;
    for (int l = 0; l < m->L; l++) spb_cuda_layer_destroy(m->layers[l]);
    for (int l = 0; l <= m->L; l++) spb_cuda_free(m->x[l]);
    void *bufs[] = {m->p,        m->pb,       m->gr,     m->tokens, m->targets, m->positions, m->lnf_out,
                    m->lnf_mean, m->lnf_rstd, m->logits, m->losses, m->dlnf,    m->dx};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) spb_cuda_free(bufs[k]);
    free(m->layers);
    free(m->x);
    free(m);
}

extern "C" long spb_cuda_gpt_numel(const spb_cuda_gpt *m) { return m->numel; }

extern "C" void spb_cuda_gpt_set_params(spb_cuda_gpt *m, const float *host_params)
{
    SPB_CUDA_CHECK(cudaMemcpy(m->p, host_params, 4 * (size_t)m->numel, cudaMemcpyHostToDevice));
    spb_cuda_f32_to_bf16(m->pb, m->p, m->numel, 0);
    SPB_CUDA_CHECK(cudaDeviceSynchronize());
}

extern "C" void spb_cuda_gpt_get_grads(const spb_cuda_gpt *m, float *host_grads)
{
    SPB_CUDA_CHECK(cudaDeviceSynchronize());
    SPB_CUDA_CHECK(cudaMemcpy(host_grads, m->gr, 4 * (size_t)m->numel, cudaMemcpyDeviceToHost));
}

extern "C" void spb_cuda_gpt_zero_grads(spb_cuda_gpt *m)
{
    SPB_CUDA_CHECK(cudaMemset(m->gr, 0, 4 * (size_t)m->numel));
}

extern "C" double spb_cuda_gpt_forward(spb_cuda_gpt *m, const int *inputs, const int *targets)
{
    const int rows = m->B * m->T, C = m->C;
    cudaStream_t st = 0;
    SPB_CUDA_CHECK(cudaMemcpy(m->tokens, inputs, sizeof(int) * (size_t)rows, cudaMemcpyHostToDevice));
    SPB_CUDA_CHECK(cudaMemcpy(m->targets, targets, sizeof(int) * (size_t)rows, cudaMemcpyHostToDevice));
    spb_cuda_embedding_forward(m->x[0], m->tokens, m->pb + m->off_wte, m->pb + m->off_wpe, m->positions, rows, m->T,
                               C, m->impl, st);
    for (int l = 0; l < m->L; l++) spb_cuda_layer_forward(m->layers[l], m->x[l], m->x[l + 1], st);
    spb_cuda_layernorm_forward(m->lnf_out, m->lnf_mean, m->lnf_rstd, m->x[m->L], m->p + m->off_lnf_w,
                               m->p + m->off_lnf_b, rows, C, m->impl, st);
    /* tied LM head: logits = lnf_out · wteᵀ (bf16) */
    spb_cuda_matmul_forward(m->g, m->logits, 0, m->lnf_out, m->pb + m->off_wte, NULL, rows, C, m->V, st);
    spb_cuda_softmax_xent_forward(m->losses, m->logits, m->targets, rows, m->V, m->impl, st);
    float *h = (float *)malloc(sizeof(float) * (size_t)rows);
    SPB_CHECK(h);
    SPB_CUDA_CHECK(cudaMemcpy(h, m->losses, sizeof(float) * (size_t)rows, cudaMemcpyDeviceToHost));
    double sum = 0.0;
    for (int r = 0; r < rows; r++) sum += h[r];
    free(h);
    return sum;
}

extern "C" void spb_cuda_gpt_backward(spb_cuda_gpt *m, float loss_scale)
{
    const int rows = m->B * m->T, C = m->C;
    cudaStream_t st = 0;
    /* dlogits in place of the logits */
    spb_cuda_softmax_xent_backward(m->logits, m->logits, m->targets, rows, m->V, loss_scale, m->impl, st);
    spb_cuda_matmul_backward(m->g, m->dlnf, m->gr + m->off_wte, NULL, m->logits, m->lnf_out, m->pb + m->off_wte,
                             rows, C, m->V, 0, m->impl, st);
    SPB_CUDA_CHECK(cudaMemsetAsync(m->dx, 0, sizeof(float) * (size_t)rows * C, st));
    spb_cuda_layernorm_backward(m->dx, m->gr + m->off_lnf_w, m->gr + m->off_lnf_b, m->dlnf, m->x[m->L],
                                m->p + m->off_lnf_w, m->lnf_mean, m->lnf_rstd, rows, C, m->impl, st);
    for (int l = m->L - 1; l >= 0; l--) spb_cuda_layer_backward(m->layers[l], m->dx, st);
    spb_cuda_embedding_backward(m->gr + m->off_wte, m->gr + m->off_wpe, m->dx, m->tokens, m->positions, rows, m->T, C,
                                m->impl, st);
}
