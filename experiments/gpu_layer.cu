/* Over 700 lines: one program: the device layer's and GPT step's checks and timings on a GPU run (one device lease). */
/* spbench-gpu-layer: the device transformer layer (common/cuda/cuda_layer.h)
 * against the CPU fp32 reference, a 2-layer GPT step against the GPT core
 * itself, the GPT core itself run through the CUDA device table
 * (common/cuda/cuda_backend.h, "core-step") against the same core on the
 * CPU table, then layer timings at the paper's 7B shape (docs/GPU.md, "The
 * layer check", "The core step").
 *
 *   spbench-gpu-layer [--check-only | --timings-only] [--out DIR] [--reps N] [--tokens 4096,...]
 *                     [--sp 8] [--peak-tflops X] [--watchdog SECONDS]
 *
 * --check-only: no timings; layer_checks.csv only if --out is given.
 * --core-only: of the checks, only the core step's (GPT and Llama models).
 * --timings-only: no checks (an earlier --check-only pass wrote
 * layer_checks.csv, left as it is); the timings' CSVs.
 * --watchdog: end the process (exit 5) after SECONDS without a check
 * reported or a timing row written (gpu_watchdog.h; default 60, 0 off; off
 * on the emulated device).
 * Exit codes: 0 all checks passed, 1 a check failed, 2 usage, 5 the
 * watchdog, 77 no CUDA device (ctest's skip code).
 *
 * Metric: norm-wise relative error ||gpu - cpu||₂ / ||cpu||₂ per tensor (the
 * loss: |gpu - cpu| / |cpu|).  Tolerances: see tol_chain() below and
 * docs/GPU.md. */
#ifdef SPB_GPU_CHECK_HAVE_CORE
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "cuda_check.h"
#include "cuda_device.h"
#include "gpu_env.h"
#include "cuda_layer.h"
#include "cudnn_attention.h"
#include "gpu_util.h"
#include "gpu_watchdog.h"
#include "layer_plan.h"
#include "spb_cuda.h"

extern "C" {
#include "attention.h"
#include "ops.h"
#ifdef SPB_GPU_CHECK_HAVE_CORE
#include "backend.h"
#include "config.h"
#include "gpt.h"
#include "grid.h"
#include "rng.h"
#endif
}
#ifdef SPB_GPU_CHECK_HAVE_CORE
#include "cuda_backend.h" /* spb_backend_cuda (needs MPI: CMake build only) */
#endif

/* ---------------------------------------------------------------- helpers -- */
static unsigned long long rng_state = 0x2545F4914F6CDD1Dull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static std::vector<float> host_f32(const float *d, long n)
{
    std::vector<float> h((size_t)n);
    SPB_CUDA_CHECK(cudaMemcpy(h.data(), d, sizeof(float) * n, cudaMemcpyDeviceToHost));
    return h;
}
static float *dev_f32(const std::vector<float> &h)
{
    float *d = (float *)spb_cuda_alloc(SPB_MEM_WORKSPACE, sizeof(float) * h.size());
    SPB_CUDA_CHECK(cudaMemcpy(d, h.data(), sizeof(float) * h.size(), cudaMemcpyHostToDevice));
    return d;
}
/* ||a - b|| / ||b|| (0 when both are zero, 1 when only b is; NaN -> inf) */
static double norm_rel_err(const float *a, const float *b, long n)
{
    double d2 = 0.0, r2 = 0.0;
    for (long i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        d2 += d * d, r2 += (double)b[i] * b[i];
    }
    if (!(d2 == d2)) return INFINITY;
    if (r2 == 0.0) return d2 == 0.0 ? 0.0 : 1.0;
    return sqrt(d2 / r2);
}

/* Tolerance of a result reached through d bf16 roundings in series (the
 * activations and activation gradients the GPU stores in bf16, and the
 * roundings inside the tensor-core attention: P before P·V, dS and P in the
 * backward).  One round to nearest leaves a relative error uniform within
 * half a unit in the last place: RMS ~ 0.43u per element (u = 2^-8), i.e.
 * ~0.43u norm-wise, and independent roundings add in quadrature:
 * ~0.43u·sqrt(d).  The bound is 4u·sqrt(d), ~9x that, for the
 * amplification through LayerNorm (1/sigma), softmax and GELU derivatives
 * and the cancelling sums (sum_j dS_ij = 0, the zero gradient of the key
 * bias).  Bugs (an index, a mask, a missing term, a factor) give errors of
 * order 0.3-1. */
static double tol_chain(int d) { return 4.0 * SPB_BF16_U * sqrt((double)d); }
/* Roundings on the longest path (docs/GPU.md counts them): one layer's
 * forward to y: ln1_out, qkv (product, bias), P, O, ln2_out, fc_pre
 * (product, bias), fc_act = 9; its backward to dx and the first-layer
 * parameter gradients: dy, dfc, GELU', dln, dy, datto, dS and P, dqkv, dln =
 * 10 more.  The GPT step: 2 layers (38) + lnf_out, logits, dlogits, dlnf. */
enum { DEPTH_LAYER_FWD = 9, DEPTH_LAYER = 19, DEPTH_GPT = 42 };
/* The loss is a mean over the B·T tokens of log-sum-exp minus the target
 * logit: each token's error is a few u times its logits (|logit| < 1 at the
 * check's initialisation) against a loss of ln V ~ 6, and the mean averages
 * the tokens' independent errors: u is a wide bound. */
#ifdef SPB_GPU_CHECK_HAVE_CORE
static double tol_loss(void) { return SPB_BF16_U; }
#endif

static env_info envi;
static FILE *check_csv, *time_csv, *phase_csv;
static int failures, checks_run;

static void report_as(const char *check, const char *impl, const char *shape, const char *tensor, double err,
                      double tol)
{
    bool pass = err <= tol;
    checks_run++;
    if (!pass) failures++;
    printf("%-10s %-6s %-40s %-14s rel_err %-10.3e tol %-9.2e %s\n", check, impl, shape, tensor, err, tol,
           pass ? "PASS" : "FAIL");
    if (check_csv) {
        char e[32], t[32];
        snprintf(e, sizeof e, "%.4e", err);
        snprintf(t, sizeof t, "%.4e", tol);
        char kname[96];
        snprintf(kname, sizeof kname, "%s %s", check, tensor);
        const char *f[] = {envi.gpu, envi.driver, envi.runtime, SPB_GIT_COMMIT, kname, impl,
                           shape, e, t, pass ? "PASS" : "FAIL"};
        for (int i = 0; i < 10; i++) spb_csv_field(check_csv, f[i], i == 9);
        fflush(check_csv);
    }
    gpu_watchdog_progress("the check '%s' %s %s %s", check, impl, shape, tensor);
}

static void report(const char *check, spb_cuda_impl impl, const char *shape, const char *tensor, double err,
                   double tol)
{
    report_as(check, spb_cuda_impl_name(impl), shape, tensor, err, tol);
}

/* ---------------------------------------------- the CPU reference layer -- */
/* common/core/gpt.c's layer_forward and the layer loop of spb_gpt_backward at
 * TP = 1, one head block, on ops_cpu.c and the naive attention backend. */
static const char *tensor_names[SPB_CUDA_LAYER_TENSORS] = {"ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w", "proj_b",
                                                           "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b"};
struct cpu_layer {
    spb_cuda_layer_shape s;
    long off[SPB_CUDA_LAYER_TENSORS], numel;
    std::vector<float> p, g;
    std::vector<float> ln1_out, m1, r1, qkv, atto, lse, res_mid, ln2_out, m2, r2, fc_pre, fc_act;
    const float *x;
    const float *P(int k) const { return p.data() + off[k]; }
    float *G(int k) { return g.data() + off[k]; }
};
static spb_attn_desc cpu_desc(const spb_cuda_layer_shape &s)
{
    spb_attn_desc d;
    memset(&d, 0, sizeof d);
    long W = (long)s.H * s.D;
    d.batch = s.B, d.heads = s.H, d.head_dim = s.D, d.q_len = d.k_len = s.T, d.causal = s.causal;
    d.scale = 1.0f / sqrtf((float)s.D);
    d.q_token_stride = d.k_token_stride = 3 * W, d.q_batch_stride = d.k_batch_stride = 3 * W * s.T;
    d.o_token_stride = W, d.o_batch_stride = W * s.T;
    return d;
}
/* Ring layers (the device layer's RING and RING_ZIGZAG): the keys this
 * rank's queries see, at their global positions 0..P·T-1, are its own K and
 * V again at every block's positions (the device layer's blocks carry no
 * other rank's data).  The reference lays them out so, [B][P·T][H][D], and
 * runs the naive attention once per query run against all of them; the
 * backward folds the laid-out dK, dV back onto the rank's own tokens. */
static bool is_ring(const spb_cuda_layer_shape &s) { return spb_layer_is_ring(&s); }
static int ring_runs(const spb_cuda_layer_shape &s) { return spb_layer_ring_runs(&s); }
/* the rank's own token that holds global key position x */
static long ring_key_source(const spb_cuda_layer_shape &s, long x)
{
    if (s.attn == SPB_LAYER_ATTN_RING) return x % s.T;
    long c = s.T / 2, chunk = x / c; /* chunks 0..P-1 are blocks' run 0, P..2P-1 their run 1 */
    return (chunk < s.P ? 0 : c) + x % c;
}
/* written out again here, not taken from layer_plan.h (the device layer's):
 * the reference places the queries on its own */
static long ring_query_start(const spb_cuda_layer_shape &s, int run)
{
    if (s.attn == SPB_LAYER_ATTN_RING) return (long)s.ring_rank * s.T;
    return (run ? 2L * s.P - 1 - s.ring_rank : s.ring_rank) * (s.T / 2);
}
/* query run a of the fused qkv against the laid-out keys kx, vx */
static spb_attn_desc ring_ref_desc(const spb_cuda_layer_shape &s, int a)
{
    spb_attn_desc d = cpu_desc(s);
    const long W = (long)s.H * s.D, keys = (long)s.P * s.T;
    d.q_len = s.T / ring_runs(s), d.q_offset = ring_query_start(s, a);
    d.k_len = (int)keys, d.k_offset = 0;
    d.k_token_stride = W, d.k_batch_stride = W * keys;
    return d;
}
static void ring_lay_out_keys(const spb_cuda_layer_shape &s, const float *qkv, std::vector<float> &kx,
                              std::vector<float> &vx)
{
    const long W = (long)s.H * s.D, keys = (long)s.P * s.T;
    kx.resize((size_t)(s.B * keys * W)), vx.resize(kx.size());
    for (long b = 0; b < s.B; b++)
        for (long x = 0; x < keys; x++) {
            const float *src = qkv + (b * s.T + ring_key_source(s, x)) * 3 * W;
            memcpy(&kx[(size_t)((b * keys + x) * W)], src + W, sizeof(float) * W);
            memcpy(&vx[(size_t)((b * keys + x) * W)], src + 2 * W, sizeof(float) * W);
        }
}

/* Ulysses layers (the device layer's ULYSSES: the all-to-all is the
 * identity there): block i of the head layout is this rank's own T tokens
 * with heads [i·Hp, (i+1)·Hp), so head-layout position i·T + t, head hh
 * holds its token t, head i·Hp + hh (ulysses_layout.h without the
 * exchange).  The reference permutes so, runs the naive attention on
 * N = P·T tokens of Hp heads and permutes back. */
static void ulysses_permute(const spb_cuda_layer_shape &s, int w, const float *src, float *dst, bool to_head)
{
    const int P = s.P, Hp = s.H / P, T = s.T, D = s.D;
    const long N = (long)P * T;
    for (long b = 0; b < s.B; b++)
        for (int i = 0; i < P; i++)
            for (long t = 0; t < T; t++)
                for (int wi = 0; wi < w; wi++)
                    for (int hh = 0; hh < Hp; hh++) {
                        long nat = (((b * T + t) * w + wi) * s.H + (long)i * Hp + hh) * D;
                        long head = (((b * N + (long)i * T + t) * w + wi) * Hp + hh) * D;
                        if (to_head) memcpy(dst + head, src + nat, sizeof(float) * D);
                        else memcpy(dst + nat, src + head, sizeof(float) * D);
                    }
}
/* the head layout's attention: N tokens, Hp heads, fused [B][N][3][Hp][D] */
static spb_attn_desc ulysses_ref_desc(const spb_cuda_layer_shape &s)
{
    spb_cuda_layer_shape h = s;
    h.T = s.P * s.T, h.H = s.H / s.P;
    return cpu_desc(h);
}

/* The layer's attention: qkv -> atto, lse (local, Ulysses or ring as above) */
static void cpu_attention_forward(cpu_layer &L)
{
    const spb_cuda_layer_shape &s = L.s;
    const long W = (long)s.H * s.D;
    spb_attn_desc d = cpu_desc(s);
    if (s.attn == SPB_LAYER_ATTN_ULYSSES) {
        const long Wh = W / s.P;
        std::vector<float> qkv_h(L.qkv.size()), o_h(L.atto.size());
        ulysses_permute(s, 3, L.qkv.data(), qkv_h.data(), true);
        d = ulysses_ref_desc(s);
        spb_attn_naive.forward(&d, qkv_h.data(), qkv_h.data() + Wh, qkv_h.data() + 2 * Wh, o_h.data(), L.lse.data());
        ulysses_permute(s, 1, o_h.data(), L.atto.data(), false);
        return;
    }
    if (!is_ring(s)) {
        spb_attn_naive.forward(&d, L.qkv.data(), L.qkv.data() + W, L.qkv.data() + 2 * W, L.atto.data(), L.lse.data());
        return;
    }
    std::vector<float> kx, vx;
    ring_lay_out_keys(s, L.qkv.data(), kx, vx);
    const int runs = ring_runs(s), len = s.T / runs;
    for (int a = 0; a < runs; a++) {
        d = ring_ref_desc(s, a);
        spb_attn_naive.forward(&d, L.qkv.data() + (long)a * len * 3 * W, kx.data(), vx.data(),
                               L.atto.data() + (long)a * len * W, L.lse.data() + (long)a * s.B * s.H * len);
    }
}
/* datto -> dqkv (+=) */
static void cpu_attention_backward(cpu_layer &L, const float *datto, float *dqkv)
{
    const spb_cuda_layer_shape &s = L.s;
    const long W = (long)s.H * s.D;
    spb_attn_desc d = cpu_desc(s);
    if (s.attn == SPB_LAYER_ATTN_ULYSSES) {
        const long Wh = W / s.P;
        std::vector<float> qkv_h(L.qkv.size()), o_h(L.atto.size()), do_h(L.atto.size()),
            dqkv_h(L.qkv.size(), 0.0f), dnat(L.qkv.size());
        ulysses_permute(s, 3, L.qkv.data(), qkv_h.data(), true);
        ulysses_permute(s, 1, L.atto.data(), o_h.data(), true);
        ulysses_permute(s, 1, datto, do_h.data(), true);
        d = ulysses_ref_desc(s);
        spb_attn_naive.backward(&d, qkv_h.data(), qkv_h.data() + Wh, qkv_h.data() + 2 * Wh, o_h.data(), L.lse.data(),
                                do_h.data(), dqkv_h.data(), dqkv_h.data() + Wh, dqkv_h.data() + 2 * Wh);
        ulysses_permute(s, 3, dqkv_h.data(), dnat.data(), false);
        spb_add_inplace(dqkv, dnat.data(), (long)dnat.size());
        return;
    }
    if (!is_ring(s)) {
        spb_attn_naive.backward(&d, L.qkv.data(), L.qkv.data() + W, L.qkv.data() + 2 * W, L.atto.data(),
                                L.lse.data(), datto, dqkv, dqkv + W, dqkv + 2 * W);
        return;
    }
    std::vector<float> kx, vx;
    ring_lay_out_keys(s, L.qkv.data(), kx, vx);
    std::vector<float> dkx(kx.size(), 0.0f), dvx(vx.size(), 0.0f);
    const int runs = ring_runs(s), len = s.T / runs;
    for (int a = 0; a < runs; a++) {
        d = ring_ref_desc(s, a);
        const long qa = (long)a * len * 3 * W, oa = (long)a * len * W;
        spb_attn_naive.backward(&d, L.qkv.data() + qa, kx.data(), vx.data(), L.atto.data() + oa,
                                L.lse.data() + (long)a * s.B * s.H * len, datto + oa, dqkv + qa, dkx.data(),
                                dvx.data());
    }
    const long keys = (long)s.P * s.T;
    for (long b = 0; b < s.B; b++)
        for (long x = 0; x < keys; x++) {
            float *dst = dqkv + (b * s.T + ring_key_source(s, x)) * 3 * W;
            spb_add_inplace(dst + W, &dkx[(size_t)((b * keys + x) * W)], W);
            spb_add_inplace(dst + 2 * W, &dvx[(size_t)((b * keys + x) * W)], W);
        }
}

static void cpu_forward(cpu_layer &L, const float *x, float *y)
{
    const spb_cuda_layer_shape &s = L.s;
    const int rows = s.B * s.T, C = s.C, Ca = s.H * s.D, F = s.F;
    L.x = x;
    L.ln1_out.resize((size_t)rows * C), L.m1.resize(rows), L.r1.resize(rows), L.qkv.resize((size_t)rows * 3 * Ca);
    L.atto.resize((size_t)rows * Ca), L.lse.resize((size_t)s.B * s.H * s.T), L.res_mid.resize((size_t)rows * C);
    L.ln2_out.resize((size_t)rows * C), L.m2.resize(rows), L.r2.resize(rows), L.fc_pre.resize((size_t)rows * F);
    L.fc_act.resize((size_t)rows * F);
    spb_layernorm_forward(L.ln1_out.data(), L.m1.data(), L.r1.data(), x, L.P(0), L.P(1), rows, C);
    spb_matmul_forward(L.qkv.data(), L.ln1_out.data(), L.P(2), L.P(3), rows, C, 3 * Ca);
    cpu_attention_forward(L);
    spb_matmul_forward(L.res_mid.data(), L.atto.data(), L.P(4), NULL, rows, Ca, C);
    for (long r = 0; r < rows; r++) spb_add_inplace(L.res_mid.data() + r * C, L.P(5), C);
    spb_add_inplace(L.res_mid.data(), x, (long)rows * C);
    spb_layernorm_forward(L.ln2_out.data(), L.m2.data(), L.r2.data(), L.res_mid.data(), L.P(6), L.P(7), rows, C);
    spb_matmul_forward(L.fc_pre.data(), L.ln2_out.data(), L.P(8), L.P(9), rows, C, F);
    spb_gelu_forward(L.fc_act.data(), L.fc_pre.data(), (long)rows * F);
    spb_matmul_forward(y, L.fc_act.data(), L.P(10), NULL, rows, F, C);
    for (long r = 0; r < rows; r++) spb_add_inplace(y + r * C, L.P(11), C);
    spb_add_inplace(y, L.res_mid.data(), (long)rows * C);
}
static void cpu_backward(cpu_layer &L, float *dx)
{
    const spb_cuda_layer_shape &s = L.s;
    const int rows = s.B * s.T, C = s.C, Ca = s.H * s.D, F = s.F;
    std::vector<float> dfc((size_t)rows * F), dtmp((size_t)rows * C), datto((size_t)rows * Ca),
        dqkv((size_t)rows * 3 * Ca, 0.0f);
    for (long r = 0; r < rows; r++) spb_add_inplace(L.G(11), dx + r * C, C);
    spb_matmul_backward(dfc.data(), L.G(10), NULL, dx, L.fc_act.data(), L.P(10), rows, F, C, 0);
    spb_gelu_backward(dfc.data(), L.fc_pre.data(), dfc.data(), (long)rows * F);
    spb_matmul_backward(dtmp.data(), L.G(8), L.G(9), dfc.data(), L.ln2_out.data(), L.P(8), rows, C, F, 0);
    spb_layernorm_backward(dx, L.G(6), L.G(7), dtmp.data(), L.res_mid.data(), L.P(6), L.m2.data(), L.r2.data(), rows,
                           C);
    for (long r = 0; r < rows; r++) spb_add_inplace(L.G(5), dx + r * C, C);
    spb_matmul_backward(datto.data(), L.G(4), NULL, dx, L.atto.data(), L.P(4), rows, Ca, C, 0);
    cpu_attention_backward(L, datto.data(), dqkv.data());
    spb_matmul_backward(dtmp.data(), L.G(2), L.G(3), dqkv.data(), L.ln1_out.data(), L.P(2), rows, C, 3 * Ca, 0);
    spb_layernorm_backward(dx, L.G(0), L.G(1), dtmp.data(), L.x, L.P(0), L.m1.data(), L.r1.data(), rows, C);
}

/* Random layer parameters: matrices ~ U(-1,1)·sqrt(3)/2/sqrt(in) (std
 * 0.5/sqrt(in)), rounded to bf16 (the GPU's products read bf16 weights; the
 * CPU gets the same values, so the check measures the GPU's arithmetic, not
 * the weight rounding); LayerNorm gains 1 ± 0.2, biases ± 0.2 (fp32). */
static void random_layer_params(const spb_cuda_layer_shape &s, const long *off, float *p)
{
    const long C = s.C, Ca = (long)s.H * s.D, F = s.F;
    const long in[SPB_CUDA_LAYER_TENSORS] = {0, 0, C, 0, Ca, 0, 0, 0, C, 0, F, 0};
    long sizes[SPB_CUDA_LAYER_TENSORS];
    spb_cuda_layer_numel(&s, NULL, sizes);
    for (int k = 0; k < SPB_CUDA_LAYER_TENSORS; k++) {
        float *t = p + off[k];
        for (long i = 0; i < sizes[k]; i++) {
            if (in[k]) t[i] = spb_bf16_round(frand() * 0.866f / sqrtf((float)in[k]));
            else if (k == 0 || k == 6) t[i] = 1.0f + 0.2f * frand();
            else t[i] = 0.2f * frand();
        }
    }
}

/* cudnn: the layer's attention through cuDNN; fusion: the FAST layer's
 * epilogue fusion (spb_cuda_layer_set_fusion; the shape says where off) */
static void check_layer(spb_cuda_gemm *g, const spb_cuda_layer_shape &s, spb_cuda_impl impl, int cudnn = 0,
                        int fusion = 1)
{
    char shape[112], mode[48] = "";
    if (is_ring(s))
        snprintf(mode, sizeof mode, " %s P=%d r=%d", s.attn == SPB_LAYER_ATTN_RING ? "ring" : "zigzag", s.P,
                 s.ring_rank);
    else if (s.attn == SPB_LAYER_ATTN_ULYSSES)
        snprintf(mode, sizeof mode, " ulysses P=%d", s.P);
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d H=%d D=%d F=%d %s%s%s%s", s.B, s.T, s.C, s.H, s.D, s.F,
             s.causal ? "causal" : "full", mode, cudnn ? " cudnn" : "",
             impl == SPB_CUDA_FAST && !fusion ? " unfused" : "");
    /* a ring layer rounds each block's O to bf16 before the merge: one rounding more in series */
    const int ring_depth = is_ring(s) ? 1 : 0;
    cpu_layer L;
    L.s = s;
    L.numel = spb_cuda_layer_numel(&s, L.off, NULL);
    L.p.assign((size_t)L.numel, 0.0f);
    L.g.assign((size_t)L.numel, 0.0f);
    random_layer_params(s, L.off, L.p.data());
    /* gradients start non-zero on both sides: the GPU must accumulate */
    for (auto &v : L.g) v = 0.01f * frand();
    const long n = (long)s.B * s.T * s.C;
    std::vector<float> x((size_t)n), dy((size_t)n), y((size_t)n);
    for (long i = 0; i < n; i++) x[i] = frand() + (i % s.C == 0 ? 2.0f : 0.0f); /* a non-zero row mean */
    for (long i = 0; i < n; i++) dy[i] = frand() / sqrtf((float)n);
    std::vector<float> g0 = L.g;

    spb_cuda_layer *D = spb_cuda_layer_create(&s, g, impl, NULL, NULL, NULL);
    spb_cuda_layer_set_fusion(D, fusion);
    char why[256];
    if (cudnn && spb_cuda_layer_set_attention_cudnn(D, 1, why, sizeof why) != 0) {
        printf("%-10s %-6s %-40s skipped: %s\n", "layer", spb_cuda_impl_name(impl), shape, why);
        spb_cuda_layer_destroy(D);
        return;
    }
    SPB_CUDA_CHECK(cudaMemcpy(spb_cuda_layer_params(D), L.p.data(), 4 * L.p.size(), cudaMemcpyHostToDevice));
    SPB_CUDA_CHECK(cudaMemcpy(spb_cuda_layer_grads(D), g0.data(), 4 * g0.size(), cudaMemcpyHostToDevice));
    spb_cuda_layer_sync_params(D, 0);
    float *dxin = dev_f32(x), *ddx = dev_f32(dy), *dyo = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * n);
    spb_cuda_layer_forward(D, dxin, dyo, 0);
    spb_cuda_layer_backward(D, ddx, 0);
    SPB_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> gy = host_f32(dyo, n), gdx = host_f32(ddx, n), gg = host_f32(spb_cuda_layer_grads(D), L.numel);

    std::vector<float> rdx = dy;
    cpu_forward(L, x.data(), y.data());
    cpu_backward(L, rdx.data());
    /* outputs: the residual stream itself and its branch part (y - x, dx - dy:
     * what the layer adds, where an error cannot hide behind the identity) */
    std::vector<float> by(y), bgy(gy), bdx(rdx), bgdx(gdx);
    for (long i = 0; i < n; i++) by[i] -= x[i], bgy[i] -= x[i], bdx[i] -= dy[i], bgdx[i] -= dy[i];
    const double tol_fwd = tol_chain(DEPTH_LAYER_FWD + ring_depth), tol = tol_chain(DEPTH_LAYER + ring_depth);
    report("layer", impl, shape, "y", norm_rel_err(gy.data(), y.data(), n), tol_fwd);
    report("layer", impl, shape, "y - x", norm_rel_err(bgy.data(), by.data(), n), tol_fwd);
    report("layer", impl, shape, "dx", norm_rel_err(gdx.data(), rdx.data(), n), tol);
    report("layer", impl, shape, "dx - dy", norm_rel_err(bgdx.data(), bdx.data(), n), tol);
    long sizes[SPB_CUDA_LAYER_TENSORS];
    spb_cuda_layer_numel(&s, NULL, sizes);
    for (int k = 0; k < SPB_CUDA_LAYER_TENSORS; k++) {
        /* the accumulated part only (the starting values are exact on both sides) */
        std::vector<float> a(sizes[k]), b(sizes[k]);
        for (long i = 0; i < sizes[k]; i++) {
            a[i] = gg[L.off[k] + i] - g0[L.off[k] + i];
            b[i] = L.g[L.off[k] + i] - g0[L.off[k] + i];
        }
        char nm[32];
        snprintf(nm, sizeof nm, "d%s", tensor_names[k]);
        report("layer", impl, shape, nm, norm_rel_err(a.data(), b.data(), sizes[k]), tol);
    }
    spb_cuda_free(dxin), spb_cuda_free(ddx), spb_cuda_free(dyo);
    spb_cuda_layer_destroy(D);
}

/* ------------------------------------------------- the 2-layer GPT step -- */
#ifdef SPB_GPU_CHECK_HAVE_CORE
/* The reference IS the project's core: spb_gpt (strategy none, one rank on
 * MPI_COMM_SELF), its own initialisation (std 0.02), then LayerNorm gains
 * 1 ± 0.1 and every bias ± 0.05 so that their gradients are distinct, and
 * the matrices (embeddings included) rounded to bf16 in place: the device
 * gets the same fp32 vector, its bf16 copy is then exact. */
static void check_gpt_step(spb_cuda_gemm *g, spb_cuda_impl impl)
{
    spb_config cfg;
    spb_config_defaults(&cfg);
    cfg.num_layers = 2, cfg.hidden_size = 256, cfg.num_heads = 4, cfg.seq_length = 128, cfg.vocab_size = 512;
    cfg.micro_batch_size = 2;
    snprintf(cfg.strategy, sizeof cfg.strategy, "none");
    snprintf(cfg.attention, sizeof cfg.attention, "naive");
    char err[256];
    if (spb_config_finalize(&cfg, 1, err, sizeof err) != 0) SPB_DIE("gpt step config: %s", err);
    spb_grid grid;
    spb_grid_create(&grid, MPI_COMM_SELF, 1);
    spb_gpt *m = spb_gpt_create(&cfg, &grid);
    spb_gpt_init_params(m, 1234);
    for (int k = 0; k < m->num_tensors; k++) {
        const spb_param_tensor *t = &m->tensors[k];
        float *p = m->params + t->offset;
        const char *kind = strchr(t->name, '.') ? strchr(t->name, '.') + 1 : t->name;
        int ln_w = !strcmp(kind, "ln1_w") || !strcmp(kind, "ln2_w") || !strcmp(kind, "lnf_w");
        for (long i = 0; i < t->numel; i++) {
            if (t->cols > 1) p[i] = spb_bf16_round(p[i]);
            else p[i] = ln_w ? 1.0f + 0.1f * frand() : 0.05f * frand();
        }
    }
    const int B = m->B, T = m->T, rows = B * T;
    std::vector<int> in(rows), tg(rows);
    for (int i = 0; i < rows; i++) {
        in[i] = (int)spb_rng_below(11, 1, (uint64_t)i, (uint64_t)m->V);
        tg[i] = (int)spb_rng_below(11, 2, (uint64_t)i, (uint64_t)m->V);
    }
    char shape[96];
    snprintf(shape, sizeof shape, "L=%d B=%d T=%d C=%d H=%d F=%d V=%d", m->L, B, T, m->C, m->H, m->F, m->V);
    spb_gpt_zero_grads(m);
    double loss_cpu = spb_gpt_forward(m, in.data(), tg.data()) / rows;
    spb_gpt_backward(m, 1.0f / rows);

    spb_cuda_gpt *dm = spb_cuda_gpt_create(m->L, m->C, m->H, m->F, m->V, m->maxpos, B, T, m->causal, g, impl);
    SPB_CHECK(spb_cuda_gpt_numel(dm) == m->num_params);
    spb_cuda_gpt_set_params(dm, m->params);
    spb_cuda_gpt_zero_grads(dm);
    double loss_gpu = spb_cuda_gpt_forward(dm, in.data(), tg.data()) / rows;
    spb_cuda_gpt_backward(dm, 1.0f / rows);
    std::vector<float> gg((size_t)m->num_params);
    spb_cuda_gpt_get_grads(dm, gg.data());
    printf("gpt step %s: loss cpu %.6f gpu %.6f\n", spb_cuda_impl_name(impl), loss_cpu, loss_gpu);
    report("gpt-step", impl, shape, "loss", fabs(loss_gpu - loss_cpu) / fabs(loss_cpu), tol_loss());
    for (int k = 0; k < m->num_tensors; k++) {
        const spb_param_tensor *t = &m->tensors[k];
        report("gpt-step", impl, shape, t->name, norm_rel_err(gg.data() + t->offset, m->grads + t->offset, t->numel),
               tol_chain(DEPTH_GPT));
    }
    spb_cuda_gpt_destroy(dm);
    spb_gpt_destroy(m);
    spb_grid_destroy(&grid);
}
#endif

/* ------------------------------------------------------------ the timings -- */

static void fill_f32(float *d, long n, float scale)
{
    std::vector<float> h((size_t)(n < (1 << 20) ? n : (1 << 20)));
    for (auto &x : h) x = scale * frand();
    for (long o = 0; o < n; o += (long)h.size()) {
        long c = n - o < (long)h.size() ? n - o : (long)h.size();
        SPB_CUDA_CHECK(cudaMemcpy(d + o, h.data(), 4 * c, cudaMemcpyHostToDevice));
    }
}

/* ------------------------------------------ the core through the device -- */
#ifdef SPB_GPU_CHECK_HAVE_CORE
/* core-step: the project's own GPT core (common/core/gpt.c) run twice, once on
 * the CPU table and once on the CUDA device table (spb_backend_cuda, fp32
 * storage, cuBLAS fp32 products: common/cuda/cuda_backend.cu), same config,
 * same parameters, same tokens; the loss and every tensor's gradient
 * compared.  Both sides compute in fp32 and differ only in summation order
 * (OpenBLAS against cuBLAS blocking, flash's online softmax against the
 * device's two-pass one, atomics in the embedding backward) and in expf/tanhf
 * (fastmath.h's polynomials, rel. error < 2e-7, against CUDA's, <= 2 ulp).
 * A K-term fp32 sum carries a relative error ~ sqrt(K)·2^-24 (random walk;
 * K <= 512 here: ~1.3e-6); some 40 operations in series, with LayerNorm's
 * 1/sigma and the softmax derivatives, grow that to ~1e-6..1e-5 norm-wise.
 * The bounds (1e-4 per tensor, 1e-5 for the mean loss) leave a factor of
 * 10-100 over that; a wrong index, mask, missing term or factor gives
 * 1e-2..1. */
static const double kCoreTolGrad = 1e-4, kCoreTolLoss = 1e-5;

/* llama_groups > 0: --model llama (RoPE, RMSNorm, SwiGLU, no biases, untied
 * head) with that many K/V heads (--num-query-groups). */
static void core_config(spb_config *cfg, int L, int C, int H, int V, int T, int B, int checkpoint, int llama_groups)
{
    spb_config_defaults(cfg);
    if (llama_groups > 0) {
        snprintf(cfg->model, sizeof cfg->model, "llama");
        cfg->num_query_groups = llama_groups;
    }
    cfg->num_layers = L, cfg->hidden_size = C, cfg->num_heads = H, cfg->vocab_size = V, cfg->seq_length = T;
    cfg->micro_batch_size = B;
    cfg->checkpoint_activations = checkpoint;
    snprintf(cfg->strategy, sizeof cfg->strategy, "none");
    snprintf(cfg->attention, sizeof cfg->attention, "flash"); /* the device table's for any of its names */
    char err[256];
    if (spb_config_finalize(cfg, 1, err, sizeof err) != 0) SPB_DIE("core-step config: %s", err);
}

/* A GPT core whose buffers live on the device: the test hook makes
 * spb_backend_by_name return the CUDA table while the core is created. */
static spb_gpt *device_gpt(const spb_config *cfg, const spb_grid *grid)
{
    spb_backend_register_for_tests(&spb_backend_cuda);
    spb_gpt *g = spb_gpt_create(cfg, grid);
    spb_backend_register_for_tests(NULL);
    SPB_CHECK(g->be == &spb_backend_cuda);
    return g;
}

static void check_core_step(int checkpoint, int llama_groups)
{
    spb_config cfg;
    core_config(&cfg, 2, 128, 4, 256, 64, 2, checkpoint, llama_groups);
    spb_grid grid;
    spb_grid_create(&grid, MPI_COMM_SELF, 1);
    spb_gpt *m = spb_gpt_create(&cfg, &grid);
    spb_gpt_init_params(m, 1234);
    /* LayerNorm gains 1 ± 0.1 and biases ± 0.05 (the core's init: 1 and 0),
     * so that every gradient is distinct and non-trivial. */
    for (int k = 0; k < m->num_tensors; k++) {
        const spb_param_tensor *t = &m->tensors[k];
        if (t->cols > 1) continue;
        const char *kind = strchr(t->name, '.') ? strchr(t->name, '.') + 1 : t->name;
        int ln_w = !strcmp(kind, "ln1_w") || !strcmp(kind, "ln2_w") || !strcmp(kind, "lnf_w");
        for (long i = 0; i < t->numel; i++) m->params[t->offset + i] = ln_w ? 1.0f + 0.1f * frand() : 0.05f * frand();
    }
    spb_gpt *dm = device_gpt(&cfg, &grid);
    SPB_CHECK(dm->num_params == m->num_params && dm->num_tensors == m->num_tensors);
    SPB_CUDA_CHECK(cudaMemcpy(dm->params, m->params, sizeof(float) * m->num_params, cudaMemcpyHostToDevice));

    const int B = m->B, T = m->T, rows = B * T;
    std::vector<int> in(rows), tg(rows);
    for (int i = 0; i < rows; i++) {
        in[i] = (int)spb_rng_below(13, 1, (uint64_t)i, (uint64_t)m->V);
        tg[i] = (int)spb_rng_below(13, 2, (uint64_t)i, (uint64_t)m->V);
    }
    spb_gpt_zero_grads(m);
    double loss_cpu = spb_gpt_forward(m, in.data(), tg.data()) / rows;
    spb_gpt_backward(m, 1.0f / rows);
    spb_gpt_zero_grads(dm);
    double loss_gpu = spb_gpt_forward(dm, in.data(), tg.data()) / rows;
    spb_gpt_backward(dm, 1.0f / rows);
    SPB_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> gg = host_f32(dm->grads, m->num_params);

    const char *check = llama_groups ? (checkpoint ? "core-llama-ckpt" : "core-llama")
                                     : (checkpoint ? "core-ckpt" : "core-step");
    char shape[128], model[32] = "";
    if (llama_groups) snprintf(model, sizeof model, " llama G=%d", llama_groups);
    snprintf(shape, sizeof shape, "L=%d B=%d T=%d C=%d H=%d F=%d V=%d%s%s", m->L, B, T, m->C, m->H, m->F, m->V,
             checkpoint ? " ckpt" : "", model);
    printf("%s: loss cpu %.8f gpu %.8f\n", check, loss_cpu, loss_gpu);
    report_as(check, "fp32", shape, "loss", fabs(loss_gpu - loss_cpu) / fabs(loss_cpu), kCoreTolLoss);
    for (int k = 0; k < m->num_tensors; k++) {
        const spb_param_tensor *t = &m->tensors[k];
        report_as(check, "fp32", shape, t->name,
                  norm_rel_err(gg.data() + t->offset, m->grads + t->offset, t->numel), kCoreTolGrad);
    }
    spb_gpt_destroy(dm);
    spb_gpt_destroy(m);
    spb_grid_destroy(&grid);
}

/* For information only: forward + backward of the core on the device table
 * at a larger shape (median of reps after one warm-up; parameters uniform
 * in ±0.02).  Not a check, not in any CSV. */
static void time_core_step(int reps)
{
    const bool small = timing.smoke;
    const int L = 2, C = small ? 256 : 1024, H = small ? 4 : 8, V = small ? 512 : 8192, T = small ? 128 : 2048, B = 1;
    spb_config cfg;
    core_config(&cfg, L, C, H, V, T, B, 0, 0);
    spb_grid grid;
    spb_grid_create(&grid, MPI_COMM_SELF, 1);
    spb_gpt *dm = device_gpt(&cfg, &grid);
    fill_f32(dm->params, dm->num_params, 0.02f);
    std::vector<int> in((size_t)B * T), tg((size_t)B * T);
    for (int i = 0; i < B * T; i++) {
        in[(size_t)i] = (int)spb_rng_below(17, 1, (uint64_t)i, (uint64_t)V);
        tg[(size_t)i] = (int)spb_rng_below(17, 2, (uint64_t)i, (uint64_t)V);
    }
    double loss = 0.0;
    int r = reps < 3 ? reps : 3;
    double ms = time_ms(
        [&] {
            spb_gpt_zero_grads(dm);
            loss = spb_gpt_forward(dm, in.data(), tg.data()) / (B * T);
            spb_gpt_backward(dm, 1.0f / (B * T));
        },
        r, &r);
    printf("core-step timing (information only; fp32 device table, simple kernels): L=%d B=%d T=%d C=%d H=%d "
           "V=%d: forward+backward median %.1f ms over %d runs (loss %.4f)\n",
           L, B, T, C, H, V, ms, r, loss);
    spb_gpt_destroy(dm);
    spb_grid_destroy(&grid);
}
#endif

static double peak_tflops;
static const char *peak_source = "";

static void timing_row(const char *strategy, int P, const char *what, long N, const spb_cuda_layer_shape &s,
                       int reps, double ms, double paper_flops, double exec_flops, double layer_ms)
{
    double tf = paper_flops / (ms * 1e-3) / 1e12, etf = exec_flops / (ms * 1e-3) / 1e12;
    double pct = peak_tflops > 0 ? 100.0 * tf / peak_tflops : 0.0;
    /* the strategy's per-rank time against a perfect 1/P split of the layer */
    double vs = layer_ms > 0 ? ms / (layer_ms / P) : 0.0;
    char vsb[16] = "-";
    if (vs > 0) snprintf(vsb, sizeof vsb, "%.3f", vs);
    printf("%-12s %2d %-8s %6ld %6d %4d %6d %-6s %9.3f %8.1f %6.1f%% %8.1f %7s\n", strategy, P, what, N, s.T,
           spb_layer_attn_heads(&s), s.F, s.causal ? "yes" : "no", ms, tf, pct, etf, vsb);
    if (time_csv) {
        char f[16][48];
        snprintf(f[0], 48, "%d", P), snprintf(f[1], 48, "%ld", N), snprintf(f[2], 48, "%d", s.T);
        snprintf(f[3], 48, "%d", s.H), snprintf(f[4], 48, "%d", spb_layer_attn_heads(&s));
        snprintf(f[5], 48, "%d", s.F), snprintf(f[6], 48, "%d", s.causal), snprintf(f[7], 48, "%d", reps);
        snprintf(f[8], 48, "%.4f", ms), snprintf(f[9], 48, "%.6e", paper_flops), snprintf(f[10], 48, "%.6g", tf);
        snprintf(f[11], 48, "%.2f", pct), snprintf(f[12], 48, "%.6e", exec_flops), snprintf(f[13], 48, "%.6g", etf);
        snprintf(f[14], 48, "%.2f", peak_tflops);
        if (vs > 0) snprintf(f[15], 48, "%.4f", vs);
        else f[15][0] = 0;
        const char *row[] = {envi.gpu, envi.driver, envi.runtime, SPB_GIT_COMMIT, strategy, what, f[0], f[1], f[2],
                             f[3],     f[4],        f[5],         f[6],           f[7],     f[8], f[9], f[10], f[11],
                             f[12],    f[13],       f[14],        peak_source,    f[15]};
        const int nf = (int)(sizeof row / sizeof row[0]);
        for (int i = 0; i < nf; i++) spb_csv_field(time_csv, row[i], i == nf - 1);
        fflush(time_csv);
    }
    gpu_watchdog_progress("the timing row '%s' %s, %ld tokens", strategy, what, N);
}

/* Device bytes a layer of this shape allocates (its own parameters, fp32
 * gradients, activations and scratch) plus the caller's x, y, dx. */
static size_t layer_bytes_estimate(const spb_cuda_layer_shape &s)
{
    double rows = (double)s.B * s.T, C = s.C, Ca = (double)s.H * s.D, F = s.F;
    double params = (double)spb_cuda_layer_numel(&s, NULL, NULL) * 10.0; /* fp32 + bf16 + fp32 grads */
    double acts = rows * (2 * C + 4 * C + 2 * 3 * Ca + 2 * Ca + 4 * C + 2 * C + 4 * F) + 16.0 * rows;
    double scratch = rows * (2 * C + 2 * F + 2 * Ca + 2 * 3 * Ca + 2 * C + 4 * 3 * Ca) + 8.0 * s.H * rows;
    double extra = s.attn == SPB_LAYER_ATTN_ULYSSES ? rows * (2 * 3 * Ca * 3 + 2 * Ca * 2) + 4.0 * s.H * rows
                   : spb_layer_is_ring(&s) ? rows * (4 * Ca + 2 * Ca) + 4.0 * s.H * rows
                                                   : 0.0;
    double io = 3.0 * 4.0 * rows * C;
    return (size_t)(params + acts + scratch + extra + io);
}

/* Where one forward + backward step of the layer spends its time: CUDA
 * events between its phases (spb_cuda_layer_set_phase_timing), one
 * warm-up step and then the median of 3 per phase; printed and to
 * layer_phases.csv.  The events add a little to the step; the shares are
 * of the phases' sum. */
template <typename F> static void phase_breakdown(spb_cuda_layer *L, const char *label, long N, F step)
{
    spb_cuda_layer_set_phase_timing(L, 1);
    const char *names[SPB_CUDA_LAYER_PHASES_MAX];
    float runs[3][SPB_CUDA_LAYER_PHASES_MAX];
    int n = 0;
    step();
    for (int r = 0; r < 3; r++) {
        step();
        n = spb_cuda_layer_phase_times(L, names, runs[r], SPB_CUDA_LAYER_PHASES_MAX);
    }
    spb_cuda_layer_set_phase_timing(L, 0);
    double med[SPB_CUDA_LAYER_PHASES_MAX], total = 0.0;
    for (int i = 0; i < n; i++) {
        const double three[3] = {runs[0][i], runs[1][i], runs[2][i]};
        med[i] = spb_median(three, 3);
        total += med[i];
    }
    printf("\n%s at %ld tokens, by phase (median of 3 steps%s):\n", label, N,
           timing.smoke ? "; smoke shape: the code path only" : "");
    for (int i = 0; i < n; i++) {
        printf("  %-36s %9.3f ms %5.1f%%\n", names[i], med[i], total > 0 ? 100.0 * med[i] / total : 0.0);
        if (!phase_csv) continue;
        char f[3][32];
        snprintf(f[0], 32, "%ld", N), snprintf(f[1], 32, "%.4f", med[i]);
        snprintf(f[2], 32, "%.4f", total > 0 ? med[i] / total : 0.0);
        const char *row[] = {envi.gpu, envi.driver, envi.runtime, SPB_GIT_COMMIT, label, f[0], names[i], f[1], f[2]};
        for (int k = 0; k < 9; k++) spb_csv_field(phase_csv, row[k], k == 8);
    }
    printf("  %-36s %9.3f ms\n", "sum", total);
    if (phase_csv) fflush(phase_csv);
}

static void run_timings(spb_cuda_gemm *g, const std::vector<long> &tokens, int reps_req, int P)
{
    const int C = (int)timing.C, H = (int)timing.H, Dh = (int)timing.Dh, F = (int)timing.F, causal = 1;
    printf("\n%s layer (hidden %d, %d heads x %d, ffn %d), one sequence, causal; peak %.1f TFLOP/s (%s)%s\n",
           timing.name, C, H, Dh, F, peak_tflops, peak_source,
           timing.smoke ? ": the code path only, not a figure" : "");
    printf("%-12s %2s %-8s %6s %6s %4s %6s %-6s %9s %8s %7s %8s %7s\n", "strategy", "P", "pass", "N", "T_rank", "ah",
           "ffn", "causal", "median_ms", "TF/s_pp", "of_peak", "TF/s_ex", "vs_L/P");
    const char *strategies[] = {"layer", "megatron-sp", "ulysses", "ring", "ring-zigzag"};
    for (long N : tokens) {
        double layer_ms = 0.0;
        for (const char *st : strategies) {
            spb_cuda_layer_shape s;
            if (spb_layer_strategy_shape(st, P, N, 1, C, H, Dh, F, causal, &s) != 0) {
                printf("%-12s %2d N=%ld: P does not divide the shape: skipped\n", st, P, N);
                continue;
            }
            size_t need = layer_bytes_estimate(s), free_b = 0, total_b = 0;
            SPB_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
            if ((double)need > 0.9 * (double)free_b) {
                printf("%-12s %2d N=%ld: needs ~%.1f GiB, %.1f GiB free: skipped\n", st, P, N, need / 1073741824.0,
                       free_b / 1073741824.0);
                continue;
            }
            gpu_watchdog_progress("the start of timing %s at %ld tokens", st, N);
            spb_cuda_layer *L = spb_cuda_layer_create(&s, g, SPB_CUDA_FAST, NULL, NULL, NULL);
            long np = spb_cuda_layer_numel(&s, NULL, NULL), n = (long)s.B * s.T * s.C;
            fill_f32(spb_cuda_layer_params(L), np, 0.02f);
            spb_cuda_layer_sync_params(L, 0);
            float *x = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * (size_t)n),
                  *y = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * (size_t)n),
                  *dx = (float *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 4 * (size_t)n),
                  *dy = (float *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 4 * (size_t)n);
            fill_f32(x, n, 1.0f), fill_f32(dy, n, 1e-3f);
            SPB_CUDA_CHECK(cudaDeviceSynchronize());
            double paper = spb_layer_paper_flops_fwd(1, (double)N, C) / (strcmp(st, "layer") ? P : 1);
            double exec = spb_layer_exec_flops_fwd(&s);
            int Pr = strcmp(st, "layer") ? P : 1;
            int reps = reps_req;
            double ms = time_ms([&] { spb_cuda_layer_forward(L, x, y, 0); }, reps, &reps);
            timing_row(st, Pr, "fwd", N, s, reps, ms, paper, exec, 0.0);
            /* dx starts as d loss/d y each time (the backward works in place);
             * the copy is ~0.1% of a step */
            auto step = [&] {
                spb_cuda_layer_forward(L, x, y, 0);
                SPB_CUDA_CHECK(cudaMemcpyAsync(dx, dy, 4 * (size_t)n, cudaMemcpyDeviceToDevice, 0));
                spb_cuda_layer_backward(L, dx, 0);
            };
            auto verdict = [&](const char *which, double step_ms) {
                if (strcmp(st, "layer") || N != tokens.back() || peak_tflops <= 0 || timing.smoke) return;
                double pct = 100.0 * 3.0 * paper / (step_ms * 1e-3) / 1e12 / peak_tflops;
                printf("%12s target (issue 6): 7B layer fwd+bwd%s at %ld tokens >= 45%% of peak: %.1f%% -> %s\n", "",
                       which, N, pct, pct >= 45.0 ? "MET" : "NOT MET");
            };
            reps = reps_req;
            ms = time_ms(step, reps, &reps);
            if (!strcmp(st, "layer")) layer_ms = ms;
            timing_row(st, Pr, "fwd+bwd", N, s, reps, ms, 3.0 * paper, 3.0 * exec, strcmp(st, "layer") ? layer_ms : 0.0);
            verdict("", ms);
            if (!strcmp(st, "layer")) { /* the attention backward with dQ fused in (atomics), side by side */
                int was = spb_cuda_attention_set_fused_dq(1);
                reps = reps_req;
                double fms = time_ms(step, reps, &reps);
                spb_cuda_attention_set_fused_dq(was);
                timing_row("layer-fdq", 1, "fwd+bwd", N, s, reps, fms, 3.0 * paper, 3.0 * exec, 0.0);
                verdict(" (fused dQ)", fms);
                if (N == tokens.back()) phase_breakdown(L, "layer", N, step);
                /* a variant of the whole layer: its forward and its step, two rows */
                auto variant_rows = [&](const char *label) {
                    reps = reps_req;
                    double vms = time_ms([&] { spb_cuda_layer_forward(L, x, y, 0); }, reps, &reps);
                    timing_row(label, 1, "fwd", N, s, reps, vms, paper, exec, 0.0);
                    reps = reps_req;
                    vms = time_ms(step, reps, &reps);
                    timing_row(label, 1, "fwd+bwd", N, s, reps, vms, 3.0 * paper, 3.0 * exec, 0.0);
                    return vms;
                };
                /* outside the attention as the first GPU run had it (a pass per
                 * bias and residual, LayerNorm a warp per row), side by side */
                int fusion_was = spb_cuda_layer_set_fusion(L, 0), ln_was = spb_cuda_layernorm_set_row_blocks(0);
                variant_rows("layer-unfused");
                spb_cuda_layer_set_fusion(L, fusion_was), spb_cuda_layernorm_set_row_blocks(ln_was);
                /* and with cuDNN's fused attention (the vendor reference), where built */
                char why[256];
                if (spb_cuda_layer_set_attention_cudnn(L, 1, why, sizeof why) == 0) {
                    verdict(" (cuDNN attention)", variant_rows("layer-cudnn"));
                    if (N == tokens.back()) phase_breakdown(L, "layer-cudnn", N, step);
                    spb_cuda_layer_set_attention_cudnn(L, 0, why, sizeof why);
                } else {
                    printf("%-12s  1 N=%ld: skipped: %s\n", "layer-cudnn", N, why);
                }
                /* and with the wgmma backward in one kernel (dkv_wgmma with dQ: --flash-bwd wgmma --flash-dq
                 * fused), where the GPU and build run wgmma; last, as the check program runs them */
                if (spb_cuda_attention_wgmma_available()) {
                    int bwd_was = spb_cuda_attention_set_bwd_wgmma(1), fdq_was = spb_cuda_attention_set_fused_dq(1);
                    verdict(" (wgmma backward, fused dQ)", variant_rows("layer-wgmma-fdq"));
                    spb_cuda_attention_set_bwd_wgmma(bwd_was), spb_cuda_attention_set_fused_dq(fdq_was);
                } else {
                    printf("%-12s  1 N=%ld: skipped: no wgmma here\n", "layer-wgmma-fdq", N);
                }
            }
            spb_cuda_free(x), spb_cuda_free(y), spb_cuda_free(dx), spb_cuda_free(dy);
            spb_cuda_layer_destroy(L);
        }
    }
}

/* The best bf16 GEMM rate of this run: the peak reference when the GPU's
 * data-sheet peak is not known (or --peak-tflops not given). */
static double measured_gemm_tflops(spb_cuda_gemm *g)
{
    const long S = timing.square;
    spb_bf16 *a = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 2 * S * S),
             *b = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 2 * S * S),
             *c = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 2 * S * S);
    SPB_CUDA_CHECK(cudaMemset(a, 0, 2 * S * S));
    SPB_CUDA_CHECK(cudaMemset(b, 0, 2 * S * S));
    int reps = 5;
    double ms = time_ms([&] { spb_cuda_gemm_bf16(g, 0, 1, S, S, S, 1.0f, a, S, b, S, 0.0f, c, S, 0, 0); }, reps);
    spb_cuda_free(a), spb_cuda_free(b), spb_cuda_free(c);
    return 2.0 * S * S * S / (ms * 1e-3) / 1e12;
}

/* ------------------------------------------------------------------ main -- */
static void usage(void)
{
    fprintf(stderr, "usage: spbench-gpu-layer [--check-only | --timings-only] [--out DIR] [--reps N] [--tokens N,N,...] [--sp P] "
                    "[--peak-tflops X] [--smoke] [--lean-checks] [--core-only] [--watchdog SECONDS]\n");
}

int main(int argc, char **argv)
{
    int check_only = 0, timings_only = 0, reps = 5, P = 8;
    /* --lean-checks: the CUDA emulation's smoke test (scripts/test): the
     * layer at its first shape with both kernel sets, the GPT step, the core
     * step without checkpointing; every other shape only without it */
    bool lean = false;
    /* --core-only: only the core-step checks (the GPT core on the device
     * table, the Llama preset's included): a change to the table checked alone */
    bool core_only = false;
    double peak_arg = 0.0, watchdog = kGpuWatchdogDefault;
    const char *out = "results/gpu";
    bool out_given = false;
    std::vector<long> tokens = {4096, 8192, 16384, 32768};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check-only"))
            check_only = 1;
        else if (!strcmp(argv[i], "--timings-only"))
            timings_only = 1;
        else if (!strcmp(argv[i], "--smoke"))
            timing = kTimingSmoke;
        else if (!strcmp(argv[i], "--lean-checks"))
            lean = true;
        else if (!strcmp(argv[i], "--core-only"))
            core_only = true;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i], out_given = true;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sp") && i + 1 < argc)
            P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--peak-tflops") && i + 1 < argc)
            peak_arg = atof(argv[++i]);
        else if (!strcmp(argv[i], "--watchdog") && i + 1 < argc) {
            if (!gpu_watchdog_parse(argv[++i], &watchdog)) return usage(), 2;
        } else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
            if (!gpu_parse_tokens(argv[++i], tokens)) return usage(), 2;
        } else {
            usage();
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (P < 1) return usage(), 2;
    if (check_only && timings_only) {
        fprintf(stderr, "spbench-gpu-layer: --check-only and --timings-only exclude each other\n");
        return usage(), 2;
    }
    if (int skip = gpu_env_open(&envi, "spbench-gpu-layer", SPB_GIT_COMMIT)) return skip;
    gpu_watchdog_start("spbench-gpu-layer", watchdog);
#ifdef SPB_GPU_CHECK_HAVE_CORE
    MPI_Init(&argc, &argv);
#endif
    /* written unless --check-only without --out, or --timings-only (the
     * checks' pass wrote it) */
    check_csv = (check_only && !out_given) || timings_only
                    ? NULL
                    : spb_csv_open(out, "layer_checks.csv",
                                          "gpu,driver,cuda_runtime,git_commit,check,impl,shape,norm_rel_err,tolerance,"
                                          "result");
    spb_cuda_gemm *g = spb_cuda_gemm_create(32u << 20);
    /* --timings-only: an earlier --check-only pass ran the checks */
    if (!timings_only) {
        printf("\nmetric: ||gpu - cpu|| / ||cpu|| per tensor; tolerance 4u·sqrt(d), u = 2^-8, d = bf16 roundings in "
               "series (layer fwd %d, layer %d, GPT step %d); loss: u\n",
               DEPTH_LAYER_FWD, DEPTH_LAYER, DEPTH_GPT);
        const spb_cuda_layer_shape shapes[] = {
            {2, 64, 128, 2, 64, 512, 1, SPB_LAYER_ATTN_LOCAL, 1, 0},
            {1, 256, 256, 4, 64, 1024, 1, SPB_LAYER_ATTN_LOCAL, 1, 0},
            {2, 192, 256, 2, 128, 1024, 0, SPB_LAYER_ATTN_LOCAL, 1, 0},
        };
        for (int impl = 0; impl < 2 && !core_only; impl++)
            for (const auto &s : shapes) {
                check_layer(g, s, (spb_cuda_impl)impl);
                if (lean) break;
            }
        if (!lean && !core_only) {
        /* the FAST kernels with a pass per bias and residual (the fusion's
         * side-by-side timing row), on the first and the non-causal shape */
        check_layer(g, shapes[0], SPB_CUDA_FAST, 0, 0);
        check_layer(g, shapes[2], SPB_CUDA_FAST, 0, 0);
        /* the timings' per-rank Ulysses and ring compute against the CPU layer
         * on the same data (docs/GPU.md): Ulysses' head layout at P = 2 (two
         * heads a rank, causal; one head of 128, full); ring with the keys
         * laid out at the blocks' positions: the contiguous layout's busiest
         * rank, zigzag on a middle rank and, not causal, on rank 0 of 3; both
         * kernel sets */
        const spb_cuda_layer_shape per_rank[] = {
            {1, 128, 256, 4, 64, 1024, 1, SPB_LAYER_ATTN_ULYSSES, 2, 0},
            {2, 64, 256, 2, 128, 1024, 0, SPB_LAYER_ATTN_ULYSSES, 2, 0},
            {2, 64, 128, 2, 64, 512, 1, SPB_LAYER_ATTN_RING, 2, 1},
            {2, 64, 128, 2, 64, 512, 1, SPB_LAYER_ATTN_RING_ZIGZAG, 2, 1},
            {1, 96, 256, 2, 128, 512, 0, SPB_LAYER_ATTN_RING_ZIGZAG, 3, 0},
        };
        for (int impl = 0; impl < 2; impl++)
            for (const auto &s : per_rank) check_layer(g, s, (spb_cuda_impl)impl);
        /* the layer with cuDNN's attention (the timings' vendor reference row),
         * where the build has cuDNN: the same bounds (cuDNN rounds dQ, dK, dV
         * to bf16 once, as the flash path's conversion does) */
        if (spb_cudnn_attention_built())
            for (const auto &s : shapes) check_layer(g, s, SPB_CUDA_FAST, 1);
        else
            printf("layer (cudnn attention): skipped: %s\n", spb_cudnn_attention_version());
        } /* !lean */
#ifdef SPB_GPU_CHECK_HAVE_CORE
        for (int impl = 0; impl < 2 && !core_only; impl++) check_gpt_step(g, (spb_cuda_impl)impl);
        printf("\ncore-step: the GPT core (common/core/gpt.c) on the CUDA device table against the CPU table; metric as "
               "above, tolerance %.0e per tensor, %.0e for the loss (fp32 both sides)\n",
               kCoreTolGrad, kCoreTolLoss);
        for (int ckpt = 0; ckpt < (lean ? 1 : 2); ckpt++) check_core_step(ckpt, 0);
        /* the Llama preset (RoPE at global positions, RMSNorm, SwiGLU, no
         * biases, untied head) with G = 1, 2 and H = 4 K/V heads */
        for (int groups : {1, 2, 4})
            if (!lean || groups == 2) check_core_step(0, groups);
        if (!lean) check_core_step(1, 1);
#else
        printf("gpt-step, core-step: skipped (standalone build without the MPI GPT core; the CMake build runs them)\n");
#endif
        SPB_CUDA_CHECK(cudaDeviceSynchronize());
        printf("\n%d layer checks, %d failed: %s\n", checks_run, failures, failures ? "FAIL" : "PASS");
        if (check_csv) fclose(check_csv);
    }

    if (!check_only) {
        if (peak_arg > 0) {
            peak_tflops = peak_arg, peak_source = "--peak-tflops";
        } else if ((peak_tflops = spb_gpu_dense_bf16_peak_tflops(envi.gpu)) > 0) {
            peak_source = "data sheet, dense bf16";
        } else {
            peak_tflops = measured_gemm_tflops(g);
            peak_source = timing.smoke ? "measured smoke-size bf16 GEMM (not a peak)"
                                       : "measured 8192^3 bf16 GEMM (GPU not in the data-sheet table)";
        }
        time_csv = spb_csv_open(out, "layer_timings.csv",
                                "gpu,driver,cuda_runtime,git_commit,strategy,pass,P,tokens,rank_tokens,heads,"
                                "attn_heads,ffn,causal,reps,median_ms,paper_flops,paper_tflops,pct_of_peak,exec_flops,"
                                "exec_tflops,peak_tflops,peak_source,vs_layer_over_P");
        phase_csv = spb_csv_open(out, "layer_phases.csv",
                                 "gpu,driver,cuda_runtime,git_commit,layer,tokens,phase,ms,share_of_step");
        run_timings(g, tokens, reps, P);
        if (time_csv) fclose(time_csv);
        if (phase_csv) fclose(phase_csv);
#ifdef SPB_GPU_CHECK_HAVE_CORE
        time_core_step(reps);
#endif
        printf("\nCSV: %s/layer_checks.csv, %s/layer_timings.csv, %s/layer_phases.csv\n", out, out, out);
    }
    spb_cuda_gemm_destroy(g);
#ifdef SPB_GPU_CHECK_HAVE_CORE
    MPI_Finalize();
#endif
    return failures ? 1 : 0;
}
