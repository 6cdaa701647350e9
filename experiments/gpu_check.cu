/* Over 700 lines: one program: every kernel's checks and timings on a GPU run (one device lease). */
/* spbench-gpu-check: the CUDA kernels against the CPU fp32 reference, then
 * timings at the paper's 7B shape (docs/GPU.md).
 *
 *   spbench-gpu-check [--check-only] [--out DIR] [--reps N] [--tokens 4096,8192,...] [--smoke] [--no-wgmma]
 *                     [--profile] [--part K[-L]/N] [--lean-fp16] [--watchdog SECONDS]
 *
 * --part K/N: the K-th of N shares of the checks (every N-th unit), for N
 * processes side by side; K-L/N: shares K to L (unequal processes: one
 * that has more to do besides); the timings, if run, are all of them.
 * With --out, a part also writes part.csv (its shares, the units counted
 * and run, its checks), which tests/emu/gpu_check_parts.py holds against
 * the other parts' to show that together they ran every check once.
 * --check-only: no timings; checks.csv only if --out is given.
 * --timings-only: no checks (an earlier --check-only pass ran them and
 * wrote checks.csv, which this pass leaves as it is); timings.csv and
 * occupancy.csv.
 * --profile: no checks and no timings; each flash variant's forward and
 * backward and cuDNN's once, causal, at the first --tokens, each call
 * named on stdout in order (for Nsight Compute: experiments/gpu-check).
 * --smoke: the timings at a small shape (gpu_env.h), the code path only.
 * --lean-fp16: the fp16 attention checks on one case (the emulated device's
 * tests: see lean_fp16).
 * --no-wgmma: leave the Hopper (wgmma) attention kernels out, checks and
 * timings (experiments/gpu-check reruns with it if a run dies: a kernel
 * fault ends the process's CUDA context, and with it every later row).
 * --watchdog SECONDS: end the process (exit 5) after that long without a
 * check reported or a timing row written: a kernel that never finishes
 * (gpu_watchdog.h; default 60, 0 off; off on the emulated device and under
 * --profile).  experiments/gpu-check reruns with --no-wgmma then too.
 * Exit codes: 0 all checks passed, 1 a check failed, 2 usage, 5 the
 * watchdog, 77 no CUDA device (ctest's skip code).  Each check runs the GPU kernel and the CPU
 * reference (common/core/ops_cpu.c, attention_naive.c, optimizer.c's AdamW) on the
 * same inputs, those the GPU sees in bf16 rounded to bf16 for the CPU too, so
 * the difference is the GPU's own rounding and summation order; it is held
 * against a bound from gpu_util.h (stated there and in docs/GPU.md). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <chrono>
#include <string>
#include <vector>

#include "cuda_bf16_storage.h"
#include "cuda_check.h"
#include "cuda_device.h"
#include "cuda_llama_ops.h"
#include "cuda_attention_gqa.h"
#include "cudnn_attention.h"
#include "gpu_env.h"
#include "gpu_util.h"
#include "gpu_watchdog.h"
#include "spb_cuda.h"
#include "ulysses_layout.h"

extern "C" {
#include "attention.h"
#include "config.h"
#include "fp16.h"
#include "ops.h"
}

#ifdef SPB_GPU_CHECK_HAVE_CORE
/* the fp32 CUDA table's attention (cuda_backend.cu; its header needs MPI) */
extern "C" const spb_attn_backend spb_attn_cuda_simple;
/* --attention cudnn's fp32 table and direct-path entries (cuda_attention_cudnn.cu) */
extern "C" const spb_attn_backend *spb_cuda_cudnn_attention(void);
extern "C" int spb_cuda_cudnn_direct_forward(const spb_attn_desc *d, const uint16_t *q, const uint16_t *k,
                                             const uint16_t *v, uint16_t *o, float *lse);
extern "C" int spb_cuda_cudnn_direct_backward(const spb_attn_desc *d, const uint16_t *q, const uint16_t *k,
                                              const uint16_t *v, const uint16_t *o, const float *lse,
                                              const uint16_t *dout, float *dq, float *dk, float *dv);
extern "C" void spb_adamw_apply(float *p, const float *grad, float *m, float *v, long n, float grad_scale,
                                float weight_decay, const spb_config *cfg, long step, double lr);
#endif

/* ---------------------------------------------------------------- helpers -- */
static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static std::vector<float> randv(long n, float scale, bool bf16_exact)
{
    std::vector<float> v((size_t)n);
    for (auto &x : v) x = bf16_exact ? spb_bf16_round(scale * frand()) : scale * frand();
    return v;
}
template <typename T> static T *dev(const std::vector<T> &h)
{
    T *d = (T *)spb_cuda_alloc(SPB_MEM_WORKSPACE, sizeof(T) * h.size());
    SPB_CUDA_CHECK(cudaMemcpy(d, h.data(), sizeof(T) * h.size(), cudaMemcpyHostToDevice));
    return d;
}
static spb_bf16 *dev_bf16(const std::vector<float> &h)
{
    std::vector<spb_bf16> b(h.size());
    for (size_t i = 0; i < h.size(); i++) b[i] = spb_bf16_from_f32(h[i]);
    return dev(b);
}
static std::vector<float> host_f32(const float *d, long n)
{
    std::vector<float> h((size_t)n);
    SPB_CUDA_CHECK(cudaMemcpy(h.data(), d, sizeof(float) * n, cudaMemcpyDeviceToHost));
    return h;
}
static std::vector<float> host_bf16(const spb_bf16 *d, long n)
{
    std::vector<spb_bf16> b((size_t)n);
    SPB_CUDA_CHECK(cudaMemcpy(b.data(), d, sizeof(spb_bf16) * n, cudaMemcpyDeviceToHost));
    std::vector<float> h((size_t)n);
    for (long i = 0; i < n; i++) h[i] = spb_bf16_to_f32(b[i]);
    return h;
}
static void rnd(std::vector<float> &v) { for (auto &x : v) x = spb_bf16_round(x); }

static env_info envi;
static FILE *check_csv, *time_csv;
static int failures, checks_run;

/* --part K/N: this process runs every N-th unit of checking work (a kernel's
 * checks, or one case of an attention check), starting at the K-th, so that
 * N processes share the checks (the emulated device's tests on a machine of
 * few cores, each process on one).  The switches between units run in
 * every part.  A unit opened inside a unit this part runs is part of it:
 * every part counts the same units whatever it skips. */
static int part_index = 0, part_last = 0, part_count = 1, part_depth = 0;
static int part_units = 0, part_units_run = 0; /* units counted, and of them run here (outermost only) */
struct check_unit {
    const bool taken;
    check_unit() : taken(part_depth > 0 || take_next()) { part_depth++; }
    ~check_unit() { part_depth--; }
    static bool take_next()
    {
        const int share = part_units++ % part_count;
        const bool mine = share >= part_index && share <= part_last;
        part_units_run += mine;
        return mine;
    }
};

static void report(const char *kernel, spb_cuda_impl impl, const char *shape, double err, double tol)
{
    bool pass = err <= tol;
    checks_run++;
    if (!pass) failures++;
    printf("%-28s %-6s %-34s max_rel_err %-10.3e tol %-9.2e %s\n", kernel, spb_cuda_impl_name(impl), shape, err,
           tol, pass ? "PASS" : "FAIL");
    if (check_csv) {
        char e[32], t[32];
        snprintf(e, sizeof e, "%.4e", err);
        snprintf(t, sizeof t, "%.4e", tol);
        const char *f[] = {envi.gpu, envi.driver, envi.runtime, SPB_GIT_COMMIT, kernel, spb_cuda_impl_name(impl),
                           shape, e, t, pass ? "PASS" : "FAIL"};
        for (int i = 0; i < 10; i++) spb_csv_field(check_csv, f[i], i == 9);
        fflush(check_csv); /* rows before a hang or a fault stay */
    }
    gpu_watchdog_progress("the check '%s' %s %s", kernel, spb_cuda_impl_name(impl), shape);
}
static void check(const char *kernel, spb_cuda_impl impl, const char *shape, const std::vector<float> &got,
                  const std::vector<float> &want, double tol)
{
    report(kernel, impl, shape, spb_max_rel_err(got.data(), want.data(), (long)want.size()), tol);
}

/* ------------------------------------------------------------ the checks -- */
/* n = 4099: one at a time; 4096: four at a time (the vector path) */
static void check_convert()
{
    const check_unit unit;
    if (!unit.taken) return;
    for (long n : {4099L, 4096L}) {
        auto x = randv(n, 100.0f, false);
        float *dx = dev(x);
        spb_bf16 *db = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 2 * n);
        spb_cuda_f32_to_bf16(db, dx, n, 0);
        auto got = host_bf16(db, n), want = x;
        rnd(want);
        check("convert f32->bf16", SPB_CUDA_SIMPLE, n == 4096 ? "n=4096" : "n=4099", got, want, 0.0);
        spb_cuda_free(dx), spb_cuda_free(db);
    }
}

static void check_gemm(spb_cuda_gemm *g, spb_cuda_impl impl)
{
    const check_unit unit;
    if (!unit.taken) return;
    const int rows = 136, in = 200, outf = 264;
    char shape[64];
    snprintf(shape, sizeof shape, "rows=%d in=%d out=%d", rows, in, outf);
    auto x = randv((long)rows * in, 1.0f, true), W = randv((long)outf * in, 0.1f, true), b = randv(outf, 0.5f, false);
    auto dy = randv((long)rows * outf, 1.0f, true), dx0 = randv((long)rows * in, 1.0f, true);
    auto dW0 = randv((long)outf * in, 1.0f, false), db0 = randv(outf, 1.0f, false);
    spb_bf16 *dxb = dev_bf16(x), *dWb = dev_bf16(W), *ddy = dev_bf16(dy);
    float *dbias = dev(b);
    /* forward, fp32 and bf16 out */
    std::vector<float> ref((size_t)rows * outf);
    spb_matmul_forward(ref.data(), x.data(), W.data(), b.data(), rows, in, outf);
    float *yf = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4L * rows * outf);
    spb_bf16 *yb = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2L * rows * outf);
    spb_cuda_matmul_forward(g, yf, 1, dxb, dWb, dbias, rows, in, outf, 0);
    check("matmul fwd (fp32 out)", impl, shape, host_f32(yf, (long)rows * outf), ref, spb_tol_f32_sum(in));
    spb_cuda_matmul_forward(g, yb, 0, dxb, dWb, dbias, rows, in, outf, 0);
    /* bias added to the bf16 product: two roundings */
    check("matmul fwd (bf16 out)", impl, shape, host_bf16(yb, (long)rows * outf), ref, 2 * spb_tol_bf16_sum(in));
    /* backward: dinp accumulated onto dx0, dW and db accumulated */
    for (int acc = 0; acc < 2; acc++) {
        std::vector<float> rdx = dx0, rdW = dW0, rdb = db0;
        spb_matmul_backward(rdx.data(), rdW.data(), rdb.data(), dy.data(), x.data(), W.data(), rows, in, outf, acc);
        spb_bf16 *gdx = dev_bf16(dx0);
        float *gdW = dev(dW0), *gdb = dev(db0);
        spb_cuda_matmul_backward(g, gdx, gdW, gdb, ddy, dxb, dWb, rows, in, outf, acc, impl, 0);
        check(acc ? "matmul bwd dinp (+=)" : "matmul bwd dinp (=)", impl, shape, host_bf16(gdx, (long)rows * in), rdx,
              (acc ? 2 : 1) * spb_tol_bf16_sum(outf));
        /* dW and db accumulate in both passes: the shape names the pass */
        char pass[96];
        snprintf(pass, sizeof pass, "%s, dinp %s", shape, acc ? "+=" : "=");
        check("matmul bwd dW (+=, fp32)", impl, pass, host_f32(gdW, (long)outf * in), rdW, spb_tol_f32_sum(rows));
        check("matmul bwd db (+=, fp32)", impl, pass, host_f32(gdb, outf), rdb, spb_tol_f32_sum(rows));
        spb_cuda_free(gdx), spb_cuda_free(gdW), spb_cuda_free(gdb);
    }
    /* fp32 reference product vs the CPU's sgemm (both fp32 end to end) */
    if (impl == SPB_CUDA_SIMPLE) {
        float *dxf = dev(x), *dWf = dev(W);
        float *out = (float *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 4L * rows * outf);
        spb_cuda_sgemm_simple(0, 1, rows, outf, in, 1.0f, dxf, in, dWf, in, 0.0f, out, outf, 0);
        std::vector<float> r2((size_t)rows * outf);
        spb_matmul_forward(r2.data(), x.data(), W.data(), NULL, rows, in, outf);
        check("sgemm fp32 reference", impl, shape, host_f32(out, (long)rows * outf), r2, spb_tol_f32_sum(in));
        spb_cuda_free(dxf), spb_cuda_free(dWf), spb_cuda_free(out);
    }
    /* an empty inner dimension (a rank without rows): C = beta·C, C not
     * read when beta = 0 (NaN there must not survive) */
    if (impl == SPB_CUDA_FAST) {
        std::vector<float> nan_c((size_t)rows * outf, NAN), zero((size_t)rows * outf, 0.0f);
        float *c = dev(nan_c);
        spb_cuda_gemm_bf16(g, 0, 1, rows, outf, 0, 1.0f, dxb, in, dWb, in, 0.0f, c, outf, 1, 0);
        check("gemm k=0, beta=0 (fp32 C)", impl, shape, host_f32(c, (long)rows * outf), zero, 0.0);
        std::vector<float> before = host_f32(yf, (long)rows * outf);
        spb_cuda_gemm_bf16(g, 0, 1, rows, outf, 0, 1.0f, dxb, in, dWb, in, 1.0f, yf, outf, 1, 0);
        check("gemm k=0, beta=1 (unchanged)", impl, shape, host_f32(yf, (long)rows * outf), before, 0.0);
        spb_cuda_free(c);
        /* cuBLASLt's bias epilogue (spb_cuda_gemm_epilogue, the device layer's
         * fused path): the bias of D's type; C read from one buffer and D
         * written to another */
        std::vector<float> b16 = b, ref16((size_t)rows * outf);
        rnd(b16);
        spb_matmul_forward(ref16.data(), x.data(), W.data(), b16.data(), rows, in, outf);
        spb_bf16 *db16 = dev_bf16(b16);
        spb_cuda_gemm_epilogue(g, 0, 0, 1, rows, outf, in, 1.0f, dxb, in, dWb, in, 0.0f, NULL, yb, outf, 0, db16, 0);
        check("gemm + bias epilogue (bf16 out)", impl, shape, host_bf16(yb, (long)rows * outf), ref16,
              spb_tol_bf16_sum(in));
        auto c0 = randv((long)rows * outf, 1.0f, false);
        std::vector<float> refc = ref;
        for (size_t i = 0; i < refc.size(); i++) refc[i] += c0[i];
        float *dc0 = dev(c0);
        spb_cuda_gemm_epilogue(g, 0, 0, 1, rows, outf, in, 1.0f, dxb, in, dWb, in, 1.0f, dc0, yf, outf, 1, dbias, 0);
        check("gemm + C + bias epilogue (fp32, C != D)", impl, shape, host_f32(yf, (long)rows * outf), refc,
              spb_tol_f32_sum(in + 2));
        check("gemm + C + bias epilogue: C unchanged", impl, shape, host_f32(dc0, (long)rows * outf), c0, 0.0);
        /* k = 0: D = bias (C, NaN, not read with beta = 0) */
        std::vector<float> bias_rows((size_t)rows * outf);
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < outf; j++) bias_rows[(size_t)r * outf + j] = b[j];
        float *cn = dev(nan_c);
        spb_cuda_gemm_epilogue(g, 0, 0, 1, rows, outf, 0, 1.0f, dxb, in, dWb, in, 0.0f, cn, yf, outf, 1, dbias, 0);
        check("gemm k=0 + bias epilogue (D = bias)", impl, shape, host_f32(yf, (long)rows * outf), bias_rows, 0.0);
        spb_cuda_free(db16), spb_cuda_free(dc0), spb_cuda_free(cn);
    }
    spb_cuda_free(dxb), spb_cuda_free(dWb), spb_cuda_free(ddy), spb_cuda_free(dbias), spb_cuda_free(yf),
        spb_cuda_free(yb);
}

/* LayerNorm: fp32 input, bf16 output; forward, then the backward's dinp,
 * dw, db accumulated (+=) */
static void check_layernorm(spb_cuda_impl impl, int rows, int C, const char *shape)
{
    const check_unit unit; /* within check_rowwise: its unit */
    if (!unit.taken) return;
    auto x = randv((long)rows * C, 2.0f, false), w = randv(C, 1.0f, false), bb = randv(C, 1.0f, false);
    for (int r = 0; r < rows; r++) x[(size_t)r * C] += 3.0f; /* a non-zero mean */
    std::vector<float> ry((size_t)rows * C), rm(rows), rs(rows);
    spb_layernorm_forward(ry.data(), rm.data(), rs.data(), x.data(), w.data(), bb.data(), rows, C);
    float *dx = dev(x), *dw = dev(w), *dbb = dev(bb);
    float *dm = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4L * rows),
          *ds = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4L * rows);
    spb_bf16 *dy = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2L * rows * C);
    spb_cuda_layernorm_forward(dy, dm, ds, dx, dw, dbb, rows, C, impl, 0);
    check("layernorm fwd out", impl, shape, host_bf16(dy, (long)rows * C), ry, spb_tol_bf16_sum(C));
    check("layernorm fwd mean", impl, shape, host_f32(dm, rows), rm, spb_tol_f32_sum(C));
    check("layernorm fwd rstd", impl, shape, host_f32(ds, rows), rs, spb_tol_f32_sum(C));
    {
        auto g = randv((long)rows * C, 1.0f, true), dxin = randv((long)rows * C, 1.0f, false),
             gw = randv(C, 1.0f, false), gb = randv(C, 1.0f, false);
        auto rdx = dxin, rgw = gw, rgb = gb;
        spb_layernorm_backward(rdx.data(), rgw.data(), rgb.data(), g.data(), x.data(), w.data(), rm.data(), rs.data(),
                               rows, C);
        float *gdx = dev(dxin), *ggw = dev(gw), *ggb = dev(gb), *grm = dev(rm), *grs = dev(rs);
        spb_bf16 *gg = dev_bf16(g);
        spb_cuda_layernorm_backward(gdx, ggw, ggb, gg, dx, dw, grm, grs, rows, C, impl, 0);
        check("layernorm bwd dinp (+=)", impl, shape, host_f32(gdx, (long)rows * C), rdx, spb_tol_f32_sum(C));
        check("layernorm bwd dw (+=)", impl, shape, host_f32(ggw, C), rgw, spb_tol_f32_sum(rows));
        check("layernorm bwd db (+=)", impl, shape, host_f32(ggb, C), rgb, spb_tol_f32_sum(rows));
        spb_cuda_free(gdx), spb_cuda_free(ggw), spb_cuda_free(ggb), spb_cuda_free(grm), spb_cuda_free(grs),
            spb_cuda_free(gg);
    }
    spb_cuda_free(dx), spb_cuda_free(dw), spb_cuda_free(dbb), spb_cuda_free(dm), spb_cuda_free(ds), spb_cuda_free(dy);
}

static void check_rowwise(spb_cuda_impl impl)
{
    const check_unit unit;
    if (!unit.taken) return;
    const int B = 3, T = 40, rows = B * T, C = 264, V = 1000;
    char shape[64];
    snprintf(shape, sizeof shape, "rows=%d C=%d", rows, C);
    /* embedding */
    std::vector<int> tok(rows);
    std::vector<long> pos(T);
    for (int r = 0; r < rows; r++) tok[r] = (r * 37) % 50; /* repeats: atomics */
    for (int t = 0; t < T; t++) pos[t] = 17 + (t * 7) % T; /* a permutation of positions */
    auto wte = randv(50L * C, 1.0f, true), wpe = randv((17L + T) * C, 1.0f, true);
    int *dtok = dev(tok);
    long *dpos = dev(pos);
    spb_bf16 *dwte = dev_bf16(wte), *dwpe = dev_bf16(wpe);
    std::vector<float> ref((size_t)rows * C);
    spb_embedding_forward(ref.data(), tok.data(), wte.data(), wpe.data(), pos.data(), rows, T, C);
    float *out = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4L * rows * C);
    spb_cuda_embedding_forward(out, dtok, dwte, dwpe, dpos, rows, T, C, impl, 0);
    check("embedding fwd", impl, shape, host_f32(out, (long)rows * C), ref, 2 * SPB_F32_U);
    auto dout = randv((long)rows * C, 1.0f, false), gte = randv(50L * C, 1.0f, false),
         gpe = randv((17L + T) * C, 1.0f, false);
    {
        auto rte = gte, rpe = gpe;
        spb_embedding_backward(rte.data(), rpe.data(), dout.data(), tok.data(), pos.data(), rows, T, C);
        float *ddout = dev(dout), *dgte = dev(gte), *dgpe = dev(gpe);
        spb_cuda_embedding_backward(dgte, dgpe, ddout, dtok, dpos, rows, T, C, impl, 0);
        check("embedding bwd dwte", impl, shape, host_f32(dgte, 50L * C), rte, spb_tol_f32_sum(rows));
        check("embedding bwd dwpe", impl, shape, host_f32(dgpe, (17L + T) * C), rpe, spb_tol_f32_sum(rows));
        spb_cuda_free(ddout), spb_cuda_free(dgte), spb_cuda_free(dgpe);
    }
    check_layernorm(impl, rows, C, shape);
    /* GELU, residual add, bias grad (n a multiple of 8 -> the vector path) */
    {
        long n = (long)rows * C;
        auto a = randv(n, 3.0f, true), g = randv(n, 1.0f, true);
        std::vector<float> rf((size_t)n), rb((size_t)n);
        spb_gelu_forward(rf.data(), a.data(), n);
        spb_gelu_backward(rb.data(), a.data(), g.data(), n);
        spb_bf16 *da = dev_bf16(a), *dg = dev_bf16(g), *o = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * n);
        spb_cuda_gelu_forward(o, da, n, impl, 0);
        check("gelu fwd", impl, shape, host_bf16(o, n), rf, spb_tol_bf16_out());
        spb_cuda_gelu_backward(o, da, dg, n, impl, 0);
        check("gelu bwd", impl, shape, host_bf16(o, n), rb, spb_tol_bf16_out());
        auto acc = randv(n, 1.0f, false), racc = acc;
        spb_add_inplace(racc.data(), g.data(), n);
        float *dacc = dev(acc);
        spb_cuda_residual_add(dacc, dg, n, impl, 0);
        check("residual add", impl, shape, host_f32(dacc, n), racc, SPB_F32_U);
        auto db0 = randv(C, 1.0f, false);
        std::vector<float> rdb = db0;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < C; c++) rdb[c] += g[(size_t)r * C + c];
        float *ddb = dev(db0);
        spb_cuda_bias_grad(ddb, dg, rows, C, impl, 0);
        check("bias grad (+=)", impl, shape, host_f32(ddb, C), rdb, spb_tol_f32_sum(rows));
        /* GELU backward with the bias gradient of its (bf16) output summed in
         * the same pass, in place as the layer calls it */
        {
            spb_bf16 *dgi = dev_bf16(g);
            float *dgb = dev(db0);
            spb_cuda_gelu_backward_bias_grad(dgi, da, dgi, dgb, rows, C, impl, 0);
            std::vector<float> got = host_bf16(dgi, n), rgb = db0;
            check("gelu bwd + bias grad: dinp", impl, shape, got, rb, spb_tol_bf16_out());
            /* db against the sums of the dinp it wrote: a CPU reference
             * rounded on its own could differ from the GPU's by an ulp of
             * bf16 in a few elements (tanhf's last fp32 bit) */
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < C; c++) rgb[c] += got[(size_t)r * C + c];
            check("gelu bwd + bias grad: db (+=)", impl, shape, host_f32(dgb, C), rgb, spb_tol_f32_sum(rows));
            spb_cuda_free(dgi), spb_cuda_free(dgb);
        }
        spb_cuda_free(da), spb_cuda_free(dg), spb_cuda_free(o), spb_cuda_free(dacc), spb_cuda_free(ddb);
    }
    /* softmax cross-entropy */
    {
        char sh[64];
        snprintf(sh, sizeof sh, "rows=%d V=%d", rows, V);
        auto lg = randv((long)rows * V, 8.0f, true);
        std::vector<int> tg(rows);
        for (int r = 0; r < rows; r++) tg[r] = (r * 131) % V;
        std::vector<float> probs = lg, rl(rows);
        for (int r = 0; r < rows; r++) /* per-row losses from the batch function */
            rl[r] = (float)spb_softmax_xent_forward(probs.data() + (size_t)r * V, tg.data() + r, 1, V);
        float scale = 1.0f / rows;
        spb_softmax_xent_backward(probs.data(), tg.data(), rows, V, scale);
        spb_bf16 *dl = dev_bf16(lg), *dd = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2L * rows * V);
        int *dtg = dev(tg);
        float *dloss = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4L * rows);
        spb_cuda_softmax_xent_forward(dloss, dl, dtg, rows, V, impl, 0);
        check("softmax xent fwd loss", impl, sh, host_f32(dloss, rows), rl, spb_tol_f32_sum(V));
        spb_cuda_softmax_xent_backward(dd, dl, dtg, rows, V, scale, impl, 0);
        check("softmax xent bwd dlogits", impl, sh, host_bf16(dd, (long)rows * V), probs, spb_tol_bf16_sum(V));
        spb_cuda_free(dl), spb_cuda_free(dd), spb_cuda_free(dtg), spb_cuda_free(dloss);
    }
    spb_cuda_free(dtok), spb_cuda_free(dpos), spb_cuda_free(dwte), spb_cuda_free(dwpe), spb_cuda_free(out);
}

static void ref_adamw(float *p, const float *g, float *m, float *v, long n, float gs, float wd, float b1, float b2,
                      float eps, long step, float lr)
{
#ifdef SPB_GPU_CHECK_HAVE_CORE
    spb_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.adam_beta1 = b1, cfg.adam_beta2 = b2, cfg.adam_eps = eps;
    spb_adamw_apply(p, g, m, v, n, gs, wd, &cfg, step, lr);
#else /* standalone build without optimizer.c: its arithmetic, line for line */
    const float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
    for (long i = 0; i < n; i++) {
        float gi = g[i] * gs;
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        float mhat = m[i] / bc1, vhat = v[i] / bc2;
        p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
    }
#endif
}

/* The direct table's embedding (bf16_direct.h; the core's --bf16-kernels
 * fast): bf16 tables into an fp32 and a bf16 output, and the backward onto
 * bf16 and fp32 gradients from an fp32 and a bf16 dout, the rows grouped
 * as the dispatch groups them (tokens repeating, one position twice).  Its
 * sums are the CPU's on the same values in the same order, rounded once:
 * bit for bit, so the bound is 0. */
static void check_direct_embedding()
{
    const check_unit unit;
    if (!unit.taken) return;
    const int B = 3, T = 40, rows = B * T, C = 264, V = 50, P = 17 + T;
    spb_handles_set_half_format(SPB_HALF_BF16); /* the direct kernels' 16-bit format */
    char shape[96];
    auto named = [&](const char *what) { /* the shape, and the operands' types */
        snprintf(shape, sizeof shape, "rows=%d C=%d, %s", rows, C, what);
        return shape;
    };
    std::vector<int> tok(rows), pos_key(rows);
    std::vector<long> pos(T);
    for (int r = 0; r < rows; r++) tok[r] = (r * 37) % V;
    for (int t = 0; t < T; t++) pos[t] = 17 + (t * 7) % T;
    pos[T - 1] = pos[0];
    for (int r = 0; r < rows; r++) pos_key[r] = (int)pos[r % T];
    auto wte = randv((long)V * C, 1.0f, true), wpe = randv((long)P * C, 1.0f, true);
    int *dtok = dev(tok);
    spb_bf16 *dwte = dev_bf16(wte), *dwpe = dev_bf16(wpe);
    const spb_bf16_direct *d = &spb_bf16_direct_cuda;
    std::vector<float> ref((size_t)rows * C);
    spb_embedding_forward(ref.data(), tok.data(), wte.data(), wpe.data(), pos.data(), rows, T, C);
    float *out = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4L * rows * C);
    spb_bf16 *outb = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2L * rows * C);
    d->embedding_forward({out, SPB_DTYPE_F32}, dtok, dwte, dwpe, pos.data(), rows, T, C);
    d->embedding_forward({outb, SPB_DTYPE_HALF}, dtok, dwte, dwpe, pos.data(), rows, T, C);
    check("direct embedding fwd", SPB_CUDA_FAST, named("fp32 out"), host_f32(out, (long)rows * C), ref, 0.0);
    rnd(ref);
    check("direct embedding fwd", SPB_CUDA_FAST, named("bf16 out"), host_bf16(outb, (long)rows * C), ref, 0.0);
    /* backward: dwte bf16 from an fp32 dout, then dwte fp32 from a bf16 one; dwpe bf16 both times */
    auto dout = randv((long)rows * C, 1.0f, false), doutb = randv((long)rows * C, 1.0f, true);
    auto gte = randv((long)V * C, 1.0f, true), gtef = randv((long)V * C, 1.0f, false);
    auto gpe = randv((long)P * C, 1.0f, true);
    auto rte = gte, rtef = gtef, rpe = gpe;
    spb_embedding_backward(rte.data(), rpe.data(), dout.data(), tok.data(), pos.data(), rows, T, C);
    rnd(rte), rnd(rpe);
    spb_embedding_backward(rtef.data(), rpe.data(), doutb.data(), tok.data(), pos.data(), rows, T, C);
    rnd(rpe);
    float *ddout = dev(dout), *dgtef = dev(gtef);
    spb_bf16 *ddoutb = dev_bf16(doutb), *dgte = dev_bf16(gte), *dgpe = dev_bf16(gpe);
    spb_row_groups by_token = spb_row_groups_of(tok.data(), rows, V);
    spb_row_groups by_pos = spb_row_groups_of(pos_key.data(), rows, P);
    auto add_rows = [&](spb_stored table, spb_stored g, const spb_row_groups &k) {
        d->embedding_backward_rows(table, g, C, k.groups, k.keys, k.starts, k.order);
    };
    add_rows({dgte, SPB_DTYPE_HALF}, {ddout, SPB_DTYPE_F32}, by_token);
    add_rows({dgpe, SPB_DTYPE_HALF}, {ddout, SPB_DTYPE_F32}, by_pos);
    add_rows({dgtef, SPB_DTYPE_F32}, {ddoutb, SPB_DTYPE_HALF}, by_token);
    add_rows({dgpe, SPB_DTYPE_HALF}, {ddoutb, SPB_DTYPE_HALF}, by_pos);
    check("direct embedding bwd dwte", SPB_CUDA_FAST, named("bf16 += fp32 dout"), host_bf16(dgte, (long)V * C), rte,
          0.0);
    check("direct embedding bwd dwte", SPB_CUDA_FAST, named("fp32 += bf16 dout"), host_f32(dgtef, (long)V * C), rtef,
          0.0);
    check("direct embedding bwd dwpe", SPB_CUDA_FAST, named("bf16 += both"), host_bf16(dgpe, (long)P * C), rpe, 0.0);
    spb_row_groups_free(&by_token), spb_row_groups_free(&by_pos);
    spb_cuda_free(dtok), spb_cuda_free(dwte), spb_cuda_free(dwpe), spb_cuda_free(out), spb_cuda_free(outb);
    spb_cuda_free(ddout), spb_cuda_free(dgtef), spb_cuda_free(ddoutb), spb_cuda_free(dgte), spb_cuda_free(dgpe);
}

/* The direct table's row biases and ring merges (bf16_direct.h).  The
 * biases added: the CPU's sums of the same values, rounded once (bound 0).
 * Their gradients: the GPU sums in strips of rows, the CPU row by row, so
 * the bounds are those of a rows-term fp32 sum (rounded to bf16 for a bf16
 * gradient); rows = 1000 makes 16 strips, the last partial.  The merges:
 * expf and log1pf of the device against the host's (an ulp or two each),
 * then O rounded once: bf16's rounding bound for a bf16 O, 16 fp32 ulps for
 * an fp32 one and for the log-sum-exps; the rows that saw no key (-inf on
 * either side) must come out exactly. */
static void check_direct_bias_merge()
{
    const check_unit unit;
    if (!unit.taken) return;
    spb_handles_set_half_format(SPB_HALF_BF16);
    const spb_bf16_direct *d = &spb_bf16_direct_cuda;
    char shape[96];
    {
        const int rows = 1000, C = 264;
        const long n = (long)rows * C;
        auto named = [&](const char *what) {
            snprintf(shape, sizeof shape, "rows=%d C=%d, %s", rows, C, what);
            return shape;
        };
        auto x = randv(n, 1.0f, true), xf = randv(n, 1.0f, false), b = randv(C, 1.0f, true);
        auto rx = x, rxf = xf;
        for (long i = 0; i < n; i++) rx[i] = spb_bf16_round(x[i] + b[i % C]), rxf[i] = xf[i] + b[i % C];
        spb_bf16 *dx = dev_bf16(x), *db16 = dev_bf16(b);
        float *dxf = dev(xf);
        d->add_bias_rows({dx, SPB_DTYPE_HALF}, {db16, SPB_DTYPE_HALF}, rows, C);
        d->add_bias_rows({dxf, SPB_DTYPE_F32}, {db16, SPB_DTYPE_HALF}, rows, C);
        check("direct bias rows", SPB_CUDA_FAST, named("bf16 x"), host_bf16(dx, n), rx, 0.0);
        check("direct bias rows", SPB_CUDA_FAST, named("fp32 x"), host_f32(dxf, n), rxf, 0.0);
        auto dy = randv(n, 1.0f, false), dyb = randv(n, 1.0f, true);
        auto g = randv(C, 1.0f, true), gf = randv(C, 1.0f, false);
        auto rg = g, rgf = gf;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < C; c++) rg[c] += dy[(size_t)r * C + c], rgf[c] += dyb[(size_t)r * C + c];
        rnd(rg);
        float *ddy = dev(dy), *dgf = dev(gf);
        spb_bf16 *ddyb = dev_bf16(dyb), *dg = dev_bf16(g);
        d->bias_grad_rows({dg, SPB_DTYPE_HALF}, {ddy, SPB_DTYPE_F32}, rows, C);
        d->bias_grad_rows({dgf, SPB_DTYPE_F32}, {ddyb, SPB_DTYPE_HALF}, rows, C);
        check("direct bias grad rows", SPB_CUDA_FAST, named("bf16 db += fp32 dy"), host_bf16(dg, C), rg,
              spb_tol_bf16_sum(rows));
        check("direct bias grad rows", SPB_CUDA_FAST, named("fp32 db += bf16 dy"), host_f32(dgf, C), rgf,
              spb_tol_f32_sum(rows));
        spb_cuda_free(dx), spb_cuda_free(db16), spb_cuda_free(dxf), spb_cuda_free(ddy), spb_cuda_free(dgf);
        spb_cuda_free(ddyb), spb_cuda_free(dg);
    }
    {
        const int B = 2, H = 3, D = 64, T = 40, row = 8, len = 20;
        const long on = (long)B * T * H * D, ln = (long)B * H * T;
        auto named = [&](const char *what) {
            snprintf(shape, sizeof shape, "B=%d H=%d D=%d T=%d, %s", B, H, D, T, what);
            return shape;
        };
        auto oa = randv(on, 1.0f, true), oaf = randv(on, 1.0f, false), ob = randv(on, 1.0f, true);
        auto la = randv(ln, 4.0f, false), lb = randv(ln, 4.0f, false);
        for (long i = 0; i < ln; i += 7) la[i] = -INFINITY; /* rows with no key yet */
        for (long i = 3; i < ln; i += 11) lb[i] = -INFINITY; /* rows whose pair saw none */
        la[(long)(1 * H + 2) * T + row + 3] = lb[(long)(1 * H + 2) * len + 3] = -INFINITY; /* both */
        auto la2 = la;
        /* bf16 O over rows [row, row + len); fp32 O from the same bf16 pair over every row */
        auto roa = oa, rla = la, roaf = oaf, rla2 = la2;
        spb_attn_merge_rows(roa.data(), rla.data(), ob.data(), lb.data(), B, H, D, T, row, len);
        rnd(roa);
        spb_attn_merge_rows(roaf.data(), rla2.data(), ob.data(), lb.data(), B, H, D, T, 0, T);
        spb_bf16 *doa = dev_bf16(oa), *dob = dev_bf16(ob);
        float *doaf = dev(oaf), *dla = dev(la), *dla2 = dev(la2), *dlb = dev(lb);
        d->attn_merge({doa, SPB_DTYPE_HALF}, dla, {dob, SPB_DTYPE_HALF}, dlb, B, H, D, T, row, len);
        d->attn_merge({doaf, SPB_DTYPE_F32}, dla2, {dob, SPB_DTYPE_HALF}, dlb, B, H, D, T, 0, T);
        check("direct attn merge O", SPB_CUDA_FAST, named("bf16, rows 8-27"), host_bf16(doa, on), roa,
              spb_tol_bf16_out());
        check("direct attn merge lse", SPB_CUDA_FAST, named("rows 8-27"), host_f32(dla, ln), rla, 16 * SPB_F32_U);
        check("direct attn merge O", SPB_CUDA_FAST, named("fp32, every row"), host_f32(doaf, on), roaf,
              16 * SPB_F32_U);
        check("direct attn merge lse", SPB_CUDA_FAST, named("every row"), host_f32(dla2, ln), rla2, 16 * SPB_F32_U);
        spb_cuda_free(doa), spb_cuda_free(dob), spb_cuda_free(doaf), spb_cuda_free(dla), spb_cuda_free(dla2);
        spb_cuda_free(dlb);
    }
}

static void check_adamw(spb_cuda_impl impl)
{
    const check_unit unit;
    if (!unit.taken) return;
    const long n = 10000;
    auto p = randv(n, 1.0f, false), g = randv(n, 0.1f, false), m = randv(n, 0.01f, false), v = randv(n, 0.001f, false);
    for (auto &x : v) x = fabsf(x);
    float *dp = dev(p), *dg = dev(g), *dm = dev(m), *dv = dev(v);
    spb_bf16 *pb = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_PARAMS, 2 * n);
    for (long step = 1; step <= 3; step++) {
        ref_adamw(p.data(), g.data(), m.data(), v.data(), n, 0.7f, 0.1f, 0.9f, 0.95f, 1e-8f, step, 3e-4f);
        spb_cuda_adamw(dp, pb, dg, dm, dv, n, 0.7f, 0.1f, 0.9f, 0.95f, 1e-8f, step, 3e-4f, impl, 0);
    }
    /* fp32 elementwise: a few roundings (and an FMA) per step */
    check("adamw params (fp32)", impl, "n=10000 3 steps", host_f32(dp, n), p, 64 * SPB_F32_U);
    check("adamw m", impl, "n=10000 3 steps", host_f32(dm, n), m, 64 * SPB_F32_U);
    check("adamw v", impl, "n=10000 3 steps", host_f32(dv, n), v, 64 * SPB_F32_U);
    check("adamw params (bf16 copy)", impl, "n=10000 3 steps", host_bf16(pb, n), p, spb_tol_bf16_out());
    spb_cuda_free(dp), spb_cuda_free(dg), spb_cuda_free(dm), spb_cuda_free(dv), spb_cuda_free(pb);
}

static void check_ulysses(spb_cuda_impl impl)
{
    const check_unit unit;
    if (!unit.taken) return;
    spb_ulysses_layout u = {4, 2, 6, 3, 2, 64};
    long n = spb_ulysses_numel(u);
    auto x = randv(n, 1.0f, true);
    spb_bf16 *dx = dev_bf16(x), *d1 = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_COMM, 2 * n),
             *d2 = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_COMM, 2 * n);
    std::vector<float> want((size_t)n);
    const char *shape = "P=4 B=2 T=6 w=3 Hp=2 D=64";
    for (long i = 0; i < n; i++) want[spb_ulysses_pack_index(u, i)] = x[i];
    spb_cuda_ulysses_pack(d1, dx, u.P, u.B, u.T, u.w, u.Hp, u.D, impl, 0);
    check("ulysses pack", impl, shape, host_bf16(d1, n), want, 0.0);
    spb_cuda_ulysses_unpack(d2, d1, u.P, u.B, u.T, u.w, u.Hp, u.D, impl, 0);
    check("ulysses unpack (round trip)", impl, shape, host_bf16(d2, n), x, 0.0);
    for (long i = 0; i < n; i++) want[spb_ulysses_head_index(u, i)] = x[i];
    spb_cuda_ulysses_blocks_to_head(d1, dx, u.P, u.B, u.T, u.w, u.Hp, u.D, impl, 0);
    check("ulysses blocks_to_head", impl, shape, host_bf16(d1, n), want, 0.0);
    spb_cuda_ulysses_head_to_blocks(d2, d1, u.P, u.B, u.T, u.w, u.Hp, u.D, impl, 0);
    check("ulysses head_to_blocks (trip)", impl, shape, host_bf16(d2, n), x, 0.0);
    spb_cuda_free(dx), spb_cuda_free(d1), spb_cuda_free(d2);
}

/* Self-attention of T tokens on a fused QKV buffer [B][T][3][H][D] (the
 * core's layout), O and dO [B][T][H][D]. */
static spb_attn_desc fused_qkv_desc(int B, int H, int D, int T, int causal, long q_offset, long k_offset)
{
    spb_attn_desc d;
    memset(&d, 0, sizeof d);
    d.batch = B, d.heads = H, d.head_dim = D, d.q_len = T, d.k_len = T;
    d.q_offset = q_offset, d.k_offset = k_offset, d.causal = causal, d.scale = 1.0f / sqrtf((float)D);
    d.q_token_stride = d.k_token_stride = 3L * H * D;
    d.q_batch_stride = d.k_batch_stride = 3L * H * D * T;
    d.o_token_stride = (long)H * D, d.o_batch_stride = (long)H * D * T;
    return d;
}

/* 16-bit operands of either format (bf16, or fp16 where fp16 != 0): upload,
 * read back, round on the host. */
static float half_round(int fp16, float x)
{
    return fp16 ? spb_fp16_to_float(spb_fp16_from_float(x)) : spb_bf16_round(x);
}
static spb_bf16 *dev_half(int fp16, const std::vector<float> &h)
{
    if (!fp16) return dev_bf16(h);
    std::vector<spb_bf16> b(h.size());
    for (size_t i = 0; i < h.size(); i++) b[i] = spb_fp16_from_float(h[i]);
    return dev(b);
}
static std::vector<float> host_half(int fp16, const spb_bf16 *d, long n)
{
    if (!fp16) return host_bf16(d, n);
    std::vector<spb_bf16> b((size_t)n);
    SPB_CUDA_CHECK(cudaMemcpy(b.data(), d, sizeof(spb_bf16) * n, cudaMemcpyDeviceToHost));
    std::vector<float> h((size_t)n);
    for (long i = 0; i < n; i++) h[i] = spb_fp16_to_float(b[i]);
    return h;
}

/* One attention case: T tokens, causal or not, the blocks' global offsets. */
struct attn_case {
    const char *name;
    int len, causal;
    long qoff, koff;
};
#define RING_BLOCK_Q_AFTER_K "ring block q>k"
#define ATTN_SHARED_CASES                                                                                              \
    {"self causal", 200, 1, 0, 0}, {"self full", 200, 0, 0, 0}, { RING_BLOCK_Q_AFTER_K, 192, 1, 256, 128 }

/* --no-wgmma; else the Hopper kernels where the GPU and build run them */
static bool no_wgmma = false;
static bool use_wgmma(void) { return !no_wgmma && spb_cuda_attention_wgmma_available(); }
/* --lean-fp16: fp16 attention on the ring block q>k case only (masked,
 * partly masked and open tiles, with offsets).  fp16 and bf16 are one
 * template; what differs (the mma type, the conversions) runs in any case,
 * and the cases' masks and offsets are the same code in both types.  For
 * the emulated device, where each case costs seconds; a GPU runs them all. */
static bool lean_fp16 = false;
static attn_case lean_fp16_case(const std::vector<attn_case> &cases)
{
    for (const attn_case &c : cases)
        if (!strcmp(c.name, RING_BLOCK_Q_AFTER_K)) return c;
    fprintf(stderr, "%s:%d: --lean-fp16: no case named \"%s\"\n", __FILE__, __LINE__, RING_BLOCK_Q_AFTER_K);
    exit(2);
}

/* Attention on a fused QKV buffer [B][T][3][H][D] (the core's layout), O and
 * dO [B][T][H][D]; dQKV fp32 in the fused layout, accumulated onto random
 * values.  Cases: self causal, self full, a ring block below the diagonal
 * (offsets, partly masked), and a block above it where early rows see no key.
 * split_diagonal adds a block whose diagonal starts at query row 16: a
 * kernel with 32 rows per warp then has a tile its first 16 rows see
 * nothing of and its next 16 do (the other cases never split a warp so). */
/* fwd_only: a forward variant (the backward it would check is the one checked already) */
static void check_attention(spb_cuda_impl impl, int D, int fp16, const char *variant = "", bool split_diagonal = false,
                            bool fwd_only = false)
{
    std::vector<attn_case> cases = {ATTN_SHARED_CASES, {"ring block rows w/o keys", 160, 1, 0, 100}};
    if (split_diagonal) cases.push_back({"diagonal at row 16", 160, 1, 0, 16});
    if (fp16 && lean_fp16) cases = {lean_fp16_case(cases)};
    const int B = 2, H = 3;
    for (const attn_case &c : cases) {
        const check_unit unit;
        if (!unit.taken) continue;
        gpu_watchdog_progress("the start of the attention check%s, %s, D %d%s, case '%s'", variant,
                              spb_cuda_impl_name(impl), D, fp16 ? " fp16" : "", c.name);
        const int T = c.len;
        long nq = (long)B * T * 3 * H * D, no = (long)B * T * H * D, nl = (long)B * H * T;
        auto qkv = randv(nq, 1.0f, true), dout = randv(no, 1.0f, true), dqkv0 = randv(nq, 0.1f, false);
        for (auto *v : {&qkv, &dout})
            for (auto &x : *v) x = half_round(fp16, x); /* exact in either format */
        spb_attn_desc d = fused_qkv_desc(B, H, D, T, c.causal, c.qoff, c.koff);
        const long qo = 0, ko = (long)H * D, vo = 2L * H * D;
        std::vector<float> ro((size_t)no), rl((size_t)nl);
        spb_attn_naive.forward(&d, qkv.data() + qo, qkv.data() + ko, qkv.data() + vo, ro.data(), rl.data());
        spb_bf16 *gqkv = dev_half(fp16, qkv), *go = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * no);
        float *gl = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * nl);
        int ran_fast = spb_cuda_attention_forward_half(&d, fp16, gqkv + qo, gqkv + ko, gqkv + vo, go, gl, impl, 0);
        char shape[96], kname[64];
        snprintf(shape, sizeof shape, "%s %s D=%d B=%d H=%d T=%d%s", c.name, fp16 ? "fp16" : "bf16", D, B, H, T,
                 variant);
        if (impl == SPB_CUDA_FAST && !ran_fast) report("attention fast path taken", impl, shape, 1.0, 0.0);
        snprintf(kname, sizeof kname, "flash fwd O");
        check(kname, impl, shape, host_half(fp16, go, no), ro, spb_tol_attn_forward());
        check("flash fwd lse", impl, shape, host_f32(gl, nl), rl, spb_tol_f32_sum(T) * 8);
        if (fwd_only) {
            spb_cuda_free(gqkv), spb_cuda_free(go), spb_cuda_free(gl);
            continue;
        }
        /* backward from the same O (rounded to the 16-bit format, as the GPU stores it) and lse */
        std::vector<float> ob = ro;
        for (auto &x : ob) x = half_round(fp16, x);
        std::vector<float> rd = dqkv0;
        spb_attn_naive.backward(&d, qkv.data() + qo, qkv.data() + ko, qkv.data() + vo, ob.data(), rl.data(),
                                dout.data(), rd.data() + qo, rd.data() + ko, rd.data() + vo);
        spb_bf16 *gob = dev_half(fp16, ob), *gdo = dev_half(fp16, dout);
        float *glr = dev(rl), *gd = dev(dqkv0), *ws = (float *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 4 * nl);
        spb_cuda_attention_backward_half(&d, fp16, gqkv + qo, gqkv + ko, gqkv + vo, gob, glr, gdo, gd + qo, gd + ko,
                                         gd + vo, ws, impl, 0);
        check("flash bwd dQ,dK,dV (+=)", impl, shape, host_f32(gd, nq), rd, spb_tol_attn_backward());
        spb_cuda_free(gqkv), spb_cuda_free(go), spb_cuda_free(gl), spb_cuda_free(gob), spb_cuda_free(gdo);
        spb_cuda_free(glr), spb_cuda_free(gd), spb_cuda_free(ws);
    }
}

/* The fp32 CUDA table's Llama-style operations (cuda_llama_ops.cu) against
 * ops_llama_cpu.c on the same fp32 inputs: RMSNorm (one thread a row, the
 * CPU's loop: sums of C terms), SwiGLU (element-wise; expf against the
 * CPU's spb_expf, a few ulp), RoPE at scattered global positions in a
 * fused-QKV-like row (strides larger than the rotated heads; the angles are
 * the CPU's bits, so only the two products and the sum round, perhaps
 * contracted to an FMA on the device: a few ulp of the largest element,
 * where a wrong position is off by O(1)), and RoPE then its inverse (the
 * backward) back to the input. */
static void check_llama_ops()
{
    const check_unit unit;
    if (!unit.taken) return;
    const int rows = 120, C = 264, F = 200;
    char shape[64];
    snprintf(shape, sizeof shape, "rows=%d C=%d F=%d", rows, C, F);
    { /* RMSNorm */
        auto x = randv((long)rows * C, 2.0f, false), w = randv(C, 1.0f, false), dy = randv((long)rows * C, 1.0f, false);
        auto dx0 = randv((long)rows * C, 0.1f, false), dw0 = randv(C, 0.1f, false);
        std::vector<float> ry((size_t)rows * C), rs(rows), rdx = dx0, rdw = dw0;
        spb_rmsnorm_forward(ry.data(), rs.data(), x.data(), w.data(), rows, C);
        spb_rmsnorm_backward(rdx.data(), rdw.data(), dy.data(), x.data(), w.data(), rs.data(), rows, C);
        float *gx = dev(x), *gw = dev(w), *gdy = dev(dy), *gdx = dev(dx0), *gdw = dev(dw0);
        float *gy = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4L * rows * C), *gs = dev(std::vector<float>(rows));
        spb_cuda_rmsnorm_forward(gy, gs, gx, gw, rows, C);
        check("rmsnorm fwd out", SPB_CUDA_SIMPLE, shape, host_f32(gy, (long)rows * C), ry, spb_tol_f32_sum(C));
        check("rmsnorm fwd rstd", SPB_CUDA_SIMPLE, shape, host_f32(gs, rows), rs, spb_tol_f32_sum(C));
        float *grs = dev(rs); /* the backward from the CPU's rstd: its own differences only */
        spb_cuda_rmsnorm_backward(gdx, gdw, gdy, gx, gw, grs, rows, C);
        check("rmsnorm bwd dinp (+=)", SPB_CUDA_SIMPLE, shape, host_f32(gdx, (long)rows * C), rdx, spb_tol_f32_sum(C));
        check("rmsnorm bwd dw (+=)", SPB_CUDA_SIMPLE, shape, host_f32(gdw, C), rdw, spb_tol_f32_sum(rows));
        for (float *p : {gx, gw, gdy, gdx, gdw, gy, gs, grs}) spb_cuda_free(p);
    }
    { /* SwiGLU: rows of [gate F | up F] */
        auto in = randv(2L * rows * F, 4.0f, false), dy = randv((long)rows * F, 1.0f, false);
        std::vector<float> ry((size_t)rows * F), rd((size_t)2 * rows * F);
        spb_swiglu_forward(ry.data(), in.data(), rows, F);
        spb_swiglu_backward(rd.data(), in.data(), dy.data(), rows, F);
        float *gin = dev(in), *gdy = dev(dy), *gy = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4L * rows * F);
        float *gd = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 8L * rows * F);
        spb_cuda_swiglu_forward(gy, gin, rows, F);
        spb_cuda_swiglu_backward(gd, gin, gdy, rows, F);
        check("swiglu fwd", SPB_CUDA_SIMPLE, shape, host_f32(gy, (long)rows * F), ry, 8 * SPB_F32_U);
        check("swiglu bwd d[gate|up]", SPB_CUDA_SIMPLE, shape, host_f32(gd, 2L * rows * F), rd, 8 * SPB_F32_U);
        for (float *p : {gin, gdy, gy, gd}) spb_cuda_free(p);
    }
    { /* RoPE on 3 of 5 heads of each token row (a fused QKV's Q and K), B = 2,
       * positions scattered (a zigzag block's) and large (angles of many turns) */
        const int B = 2, T = 48, heads = 3, D = 16, width = 5 * D;
        std::vector<long> pos(T);
        for (int t = 0; t < T; t++) pos[t] = t < T / 2 ? 1000 + t : 70000 - t;
        auto x = randv((long)B * T * width, 1.0f, false);
        std::vector<float> r = x;
        spb_rope_apply(r.data(), pos.data(), B, T, width, (long)T * width, heads, D, 10000.0, 0);
        float *gx = dev(x);
        SPB_CUDA_CHECK(cudaDeviceSynchronize());
        const double held_before = (double)spb_cuda_mem_stats()->current[SPB_MEM_WORKSPACE];
        spb_cuda_rope_apply(gx, pos.data(), B, T, width, (long)T * width, heads, D, 10000.0, 0);
        snprintf(shape, sizeof shape, "B=%d T=%d heads=%d/5 D=%d", B, T, heads, D);
        check("rope fwd", SPB_CUDA_SIMPLE, shape, host_f32(gx, (long)B * T * width), r, 8 * SPB_F32_U);
        /* its angle table (the process's first RoPE call: the table grows
         * from nothing), by the device allocator, against the memory model's
         * count: fp32 cos and sin, T x D floats (memory_model.c) */
        const double table = (double)spb_cuda_mem_stats()->current[SPB_MEM_WORKSPACE] - held_before,
                     model = 4.0 * T * D;
        report("rope table workspace", SPB_CUDA_SIMPLE, shape, fabs(table - model) / model, 0.0);
        spb_rope_apply(r.data(), pos.data(), B, T, width, (long)T * width, heads, D, 10000.0, 1);
        spb_cuda_rope_apply(gx, pos.data(), B, T, width, (long)T * width, heads, D, 10000.0, 1);
        check("rope inverse (bwd)", SPB_CUDA_SIMPLE, shape, host_f32(gx, (long)B * T * width), r, 8 * SPB_F32_U);
        check("rope inverse = input", SPB_CUDA_SIMPLE, shape, host_f32(gx, (long)B * T * width), x, 16 * SPB_F32_U);
        spb_cuda_free(gx);
    }
}

/* The grouped-query checks' call: a fused row [H query | G K | G V heads]
 * per token, T queries against T keys; causal with a ring block's offsets
 * (queries at 2T, keys at k_offset), else full. */
static spb_attn_desc gqa_desc(int B, int H, int G, int D, int T, int causal, long k_offset)
{
    const long width = (long)(H + 2 * G) * D;
    spb_attn_desc d;
    memset(&d, 0, sizeof d);
    d.batch = B, d.heads = H, d.kv_heads = G, d.head_dim = D, d.q_len = T, d.k_len = T;
    d.causal = causal, d.q_offset = causal ? 2L * T : 0, d.k_offset = causal ? k_offset : 0;
    d.scale = 1.0f / sqrtf((float)D);
    d.q_token_stride = d.k_token_stride = width, d.q_batch_stride = d.k_batch_stride = width * T;
    d.o_token_stride = (long)H * D, d.o_batch_stride = (long)H * D * T;
    return d;
}

/* A grouped-query check's inputs (gqa_desc's call; Q, K, V and dO random,
 * bf16-exact where asked; d0 the gradients' nonzero start, onto which the
 * backends add), the CPU forward (ro, rl) and, from an O as the device's
 * forward stored it, the CPU gradients. */
struct gqa_case {
    spb_attn_desc d;
    long nq, no, nl, qo, ko, vo;
    std::vector<float> qkv, dout, d0, ro, rl;
    gqa_case(int B, int H, int G, int D, int T, int causal, long k_offset, bool bf16_values)
        : d(gqa_desc(B, H, G, D, T, causal, k_offset)), nq((long)B * T * (H + 2 * G) * D), no((long)B * T * H * D),
          nl((long)B * H * T), qo(0), ko((long)H * D), vo((long)(H + G) * D), qkv(randv(nq, 1.0f, bf16_values)),
          dout(randv(no, 1.0f, bf16_values)), d0(randv(nq, 0.1f, false)), ro((size_t)no), rl((size_t)nl)
    {
        spb_attn_naive.forward(&d, qkv.data() + qo, qkv.data() + ko, qkv.data() + vo, ro.data(), rl.data());
    }
    std::vector<float> backward(const std::vector<float> &o) const
    {
        std::vector<float> rd = d0;
        spb_attn_naive.backward(&d, qkv.data() + qo, qkv.data() + ko, qkv.data() + vo, o.data(), rl.data(),
                                dout.data(), rd.data() + qo, rd.data() + ko, rd.data() + vo);
        return rd;
    }
};

#ifdef SPB_GPU_CHECK_HAVE_CORE
/* Grouped-query attention in the fp32 CUDA table's kernels (cuda_backend.cu)
 * against attention_naive.c: a fused row [H query heads | G K heads | G V
 * heads] per token, G in {1, 2, H} (H = 4), causal with a ring block's
 * offsets and full; fp32 both sides, sums of T terms. */
static void check_gqa_attention_f32()
{
    const int B = 2, H = 4, D = 16, T = 72;
    const int groups[] = {1, 2, H};
    for (int G : groups)
        for (int causal = 0; causal < 2; causal++) {
            const check_unit unit;
            if (!unit.taken) continue;
            const gqa_case k(B, H, G, D, T, causal, T, false);
            const spb_attn_desc &d = k.d;
            const long nq = k.nq, no = k.no, nl = k.nl, qo = k.qo, ko = k.ko, vo = k.vo;
            const std::vector<float> &qkv = k.qkv, &dout = k.dout, &d0 = k.d0, &ro = k.ro, &rl = k.rl;
            const std::vector<float> rd = k.backward(ro);
            float *g = dev(qkv), *gdo = dev(dout), *gd = dev(d0);
            float *go = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * no), *gl = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * nl);
            spb_attn_cuda_simple.forward(&d, g + qo, g + ko, g + vo, go, gl);
            char shape[96];
            snprintf(shape, sizeof shape, "%s fp32 D=%d B=%d H=%d G=%d T=%d", causal ? "ring block causal" : "full", D,
                     B, H, G, T);
            check("gqa attn fwd O", SPB_CUDA_SIMPLE, shape, host_f32(go, no), ro, spb_tol_f32_sum(T) * 8);
            check("gqa attn fwd lse", SPB_CUDA_SIMPLE, shape, host_f32(gl, nl), rl, spb_tol_f32_sum(T) * 8);
            /* backward from the CPU's O and lse: the kernels' own differences only */
            float *gro = dev(ro), *grl = dev(rl);
            spb_attn_cuda_simple.backward(&d, g + qo, g + ko, g + vo, gro, grl, gdo, gd + qo, gd + ko, gd + vo);
            check("gqa attn bwd dQ,dK,dV (+=)", SPB_CUDA_SIMPLE, shape, host_f32(gd, nq), rd, spb_tol_f32_sum(T * H) * 8);
            for (float *p : {g, gdo, gd, go, gl, gro, grl}) spb_cuda_free(p);
        }
}
#endif

/* Grouped-query attention in the 16-bit flash kernels: the simple ones map
 * query head h to K/V head h / (H/G); the fast families take G = H only and
 * must decline (fast_ok), leaving the call to the simple ones.  bf16, D = 64,
 * H = 4, G in {1, 2}, a fused row [H query | G K | G V heads] per token; the
 * bounds of check_attention. */
static void check_gqa_attention_half(spb_cuda_impl impl)
{
    const int B = 2, H = 4, D = 64, T = 96;
    const int groups[] = {1, 2};
    for (int G : groups)
        for (int causal = 0; causal < 2; causal++) {
            const check_unit unit;
            if (!unit.taken) continue;
            const gqa_case k(B, H, G, D, T, causal, T + 40, true);
            const spb_attn_desc &d = k.d;
            const long nq = k.nq, no = k.no, nl = k.nl, qo = k.qo, ko = k.ko, vo = k.vo;
            const std::vector<float> &qkv = k.qkv, &dout = k.dout, &d0 = k.d0, &ro = k.ro, &rl = k.rl;
            spb_bf16 *g = dev_bf16(qkv), *go = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * no);
            float *gl = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * nl);
            char shape[96];
            snprintf(shape, sizeof shape, "%s bf16 D=%d B=%d H=%d G=%d T=%d", causal ? "ring block causal" : "full", D,
                     B, H, G, T);
            int ran_fast = spb_cuda_attention_forward_half(&d, 0, g + qo, g + ko, g + vo, go, gl, impl, 0);
            if (ran_fast) report("gqa: fast path declined", impl, shape, 1.0, 0.0);
            check("gqa flash fwd O", impl, shape, host_bf16(go, no), ro, spb_tol_attn_forward());
            check("gqa flash fwd lse", impl, shape, host_f32(gl, nl), rl, spb_tol_f32_sum(T) * 8);
            std::vector<float> ob = ro;
            rnd(ob);
            const std::vector<float> rd = k.backward(ob);
            spb_bf16 *gob = dev_bf16(ob), *gdo = dev_bf16(dout);
            float *glr = dev(rl), *gd = dev(d0), *ws = (float *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 4 * nl);
            ran_fast = spb_cuda_attention_backward_half(&d, 0, g + qo, g + ko, g + vo, gob, glr, gdo, gd + qo, gd + ko,
                                                        gd + vo, ws, impl, 0);
            if (ran_fast) report("gqa: fast path declined", impl, shape, 1.0, 0.0);
            check("gqa flash bwd dQ,dK,dV (+=)", impl, shape, host_f32(gd, nq), rd, spb_tol_attn_backward());
            spb_cuda_free(g), spb_cuda_free(go), spb_cuda_free(gl), spb_cuda_free(gob), spb_cuda_free(gdo);
            spb_cuda_free(glr), spb_cuda_free(gd), spb_cuda_free(ws);
        }
}

/* The backward on FlashAttention-2's tiling (128 keys per block, P and dS
 * through shared memory; its switches on for the checks, then off): both
 * head dims in bf16, fp16 once, with the diagonal at row 16 (inside a
 * warp's 32 x 32 tile of S) */
static void check_exchange_backward(const char *variant)
{
    spb_cuda_attention_set_fused_dq(1);
    spb_cuda_attention_set_bwd_exchange(1);
    check_attention(SPB_CUDA_FAST, 64, 0, variant, true);
    check_attention(SPB_CUDA_FAST, 128, 0, variant, true);
    check_attention(SPB_CUDA_FAST, 128, 1, variant, true);
    spb_cuda_attention_set_bwd_exchange(0);
    spb_cuda_attention_set_fused_dq(0);
}

/* cuDNN's fused attention (--attention cudnn) on the same layouts and cases
 * as the flash kernel, bf16 and fp16 (at the bf16 bounds); its dQ, dK, dV are 16-bit and overwritten, so the
 * reference starts from zero.  A query block behind its key block (rows
 * with no key) must be refused, not computed. */
static void check_cudnn_attention(int D, spb_cudnn_half type)
{
    if (!spb_cudnn_attention_built()) {
        printf("%-28s %-6s skipped: %s\n", "cudnn attention", "-", spb_cudnn_attention_version());
        return;
    }
    const char *fmt_name = type == SPB_CUDNN_FP16 ? "fp16" : "bf16";
    const attn_case cases[] = {ATTN_SHARED_CASES, {"shifted diagonal", 192, 1, 64, 0}};
    const int B = 2, H = 3;
    char why[512], shape[96];
    for (const attn_case &c : cases) {
        const check_unit unit;
        if (!unit.taken) continue;
        gpu_watchdog_progress("the start of the cuDNN attention check, %s, D %d, case '%s'", fmt_name, D, c.name);
        const int T = c.len;
        long nq = (long)B * T * 3 * H * D, no = (long)B * T * H * D, nl = (long)B * H * T;
        auto qkv = randv(nq, 1.0f, true), dout = randv(no, 1.0f, true);
        for (auto *v : {&qkv, &dout})
            for (auto &x : *v) x = half_round(type == SPB_CUDNN_FP16, x); /* exact in either format */
        spb_attn_desc d = fused_qkv_desc(B, H, D, T, c.causal, c.qoff, c.koff);
        const long qo = 0, ko = (long)H * D, vo = 2L * H * D;
        snprintf(shape, sizeof shape, "%s %s D=%d B=%d H=%d T=%d", c.name, fmt_name, D, B, H, T);
        std::vector<float> ro((size_t)no), rl((size_t)nl);
        spb_attn_naive.forward(&d, qkv.data() + qo, qkv.data() + ko, qkv.data() + vo, ro.data(), rl.data());
        spb_bf16 *gqkv = dev_half(type == SPB_CUDNN_FP16, qkv),
                 *go = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * no);
        float *gl = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * nl);
        if (spb_cudnn_attention_forward(&d, type, gqkv + qo, gqkv + ko, gqkv + vo, go, gl, 0, why, sizeof why)) {
            printf("  cudnn fwd: %s\n", why);
            report("cudnn fwd ran", SPB_CUDA_FAST, shape, 1.0, 0.0);
        } else {
            check("cudnn fwd O", SPB_CUDA_FAST, shape, host_half(type == SPB_CUDNN_FP16, go, no), ro,
                  spb_tol_attn_forward());
            check("cudnn fwd lse", SPB_CUDA_FAST, shape, host_f32(gl, nl), rl, spb_tol_f32_sum(T) * 8);
        }
        std::vector<float> ob = ro, rd((size_t)nq, 0.0f);
        for (auto &x : ob) x = half_round(type == SPB_CUDNN_FP16, x);
        spb_attn_naive.backward(&d, qkv.data() + qo, qkv.data() + ko, qkv.data() + vo, ob.data(), rl.data(),
                                dout.data(), rd.data() + qo, rd.data() + ko, rd.data() + vo);
        spb_bf16 *gob = dev_half(type == SPB_CUDNN_FP16, ob), *gdo = dev_half(type == SPB_CUDNN_FP16, dout),
                 *gd = dev_half(type == SPB_CUDNN_FP16, std::vector<float>((size_t)nq, 0.0f));
        float *glr = dev(rl);
        if (spb_cudnn_attention_backward(&d, type, gqkv + qo, gqkv + ko, gqkv + vo, gob, glr, gdo, gd + qo, gd + ko,
                                         gd + vo, 0, why, sizeof why)) {
            printf("  cudnn bwd: %s\n", why);
            report("cudnn bwd ran", SPB_CUDA_FAST, shape, 1.0, 0.0);
        } else {
            /* the flash bound plus one rounding of the bf16 outputs */
            check("cudnn bwd dQ,dK,dV", SPB_CUDA_FAST, shape, host_half(type == SPB_CUDNN_FP16, gd, nq), rd,
                  spb_tol_attn_backward() + spb_tol_bf16_out());
        }
        spb_cuda_free(gqkv), spb_cuda_free(go), spb_cuda_free(gl), spb_cuda_free(gob), spb_cuda_free(gdo);
        spb_cuda_free(gd), spb_cuda_free(glr);
    }
    const check_unit unit;
    if (!unit.taken) return;
    spb_attn_desc behind;
    memset(&behind, 0, sizeof behind);
    behind.batch = 1, behind.heads = 1, behind.head_dim = D, behind.q_len = behind.k_len = 64, behind.causal = 1;
    behind.k_offset = 32, behind.q_token_stride = behind.k_token_stride = behind.o_token_stride = D;
    behind.q_batch_stride = behind.k_batch_stride = behind.o_batch_stride = 64L * D;
    snprintf(shape, sizeof shape, "rows w/o keys D=%d", D);
    report("cudnn refuses", SPB_CUDA_FAST, shape, spb_cudnn_attention_supported(&behind, why, sizeof why) ? 1.0 : 0.0,
           0.0);
}

#ifdef SPB_GPU_CHECK_HAVE_CORE
/* The 16-bit simple kernels on the direct path's contract: the H-head
 * backend of the expansion's checks where there is no cuDNN. */
static int simple_half_forward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                               spb_bf16 *o, float *lse)
{
    spb_cuda_attention_forward_half(d, 0, q, k, v, o, lse, SPB_CUDA_SIMPLE, 0);
    return 0;
}

static int simple_half_backward(const spb_attn_desc *d, const spb_bf16 *q, const spb_bf16 *k, const spb_bf16 *v,
                                const spb_bf16 *o, const float *lse, const spb_bf16 *dout, float *dq, float *dk,
                                float *dv)
{
    float *ws = spb_cuda_attention_workspace((long)d->batch * d->heads * d->q_len);
    spb_cuda_attention_backward_half(d, 0, q, k, v, o, lse, dout, dq, dk, dv, ws, SPB_CUDA_SIMPLE, 0);
    return 0;
}

/* Grouped-query attention through an H-head backend (cuda_attention_gqa.h):
 * K and V copied to every query head, the copies' dK, dV summed back per
 * group, against attention_naive.c on the grouped call itself.  The H-head
 * backend: spbench's simple kernels (everywhere, the emulation included:
 * the copies and the group sums checked without cuDNN), or cuDNN through
 * --attention cudnn's own entries (the fp32 table's and the direct path's,
 * which expand when G < H; a lent GPU, skipped where the build has none).
 * fp32 (the fp32 table's contract; cuDNN narrows to bf16 there, so its
 * operands are bf16 values) and bf16 (the direct path's), G in {1, 2, H},
 * causal with a ring block's offsets and full; dQ, dK, dV accumulate onto a
 * nonzero start.  Bounds: those of the grouped checks above (fp32, bf16);
 * cuDNN adds the 16-bit rounding of each copy's dK, dV before the sum. */
static void check_gqa_expanded(bool cudnn, bool half)
{
    const char *kernel = cudnn ? "expand-kv cudnn" : "expand-kv simple"; /* + " fwd O" etc.: 28 columns */
    const spb_cuda_impl impl = cudnn ? SPB_CUDA_FAST : SPB_CUDA_SIMPLE;
    if (cudnn && !spb_cudnn_attention_built()) {
        printf("%-28s %-6s skipped: %s\n", kernel, "-", spb_cudnn_attention_version());
        return;
    }
    const int B = 2, H = 4, D = half ? 64 : 16, T = half ? 64 : 48;
    const int groups[] = {1, 2, H};
    const bool bf16_values = half || cudnn;
    for (int G : groups)
        for (int causal = 0; causal < 2; causal++) {
            const check_unit unit;
            if (!unit.taken) continue;
            const gqa_case k(B, H, G, D, T, causal, T + 8, bf16_values);
            const spb_attn_desc &d = k.d;
            const long nq = k.nq, no = k.no, nl = k.nl, qo = k.qo, ko = k.ko, vo = k.vo;
            const std::vector<float> &qkv = k.qkv, &dout = k.dout, &d0 = k.d0, &ro = k.ro, &rl = k.rl;
            std::vector<float> ob = ro;
            if (bf16_values) rnd(ob); /* the backward's O: what a 16-bit forward stored */
            const std::vector<float> rd = k.backward(ob);
            char shape[96];
            snprintf(shape, sizeof shape, "%s %s D=%d B=%d H=%d G=%d T=%d", causal ? "ring block causal" : "full",
                     half ? "bf16" : "fp32", D, B, H, G, T);
            float *gl = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * nl), *glr = dev(rl), *gd = dev(d0);
            const double fwd_tol = bf16_values ? spb_tol_attn_forward() : spb_tol_f32_sum(T) * 8;
            double bwd_tol = half ? spb_tol_attn_backward() : spb_tol_f32_sum(T * H) * 8;
            if (cudnn) bwd_tol = spb_tol_attn_backward() + spb_tol_bf16_out();
            int rc_fwd = 0, rc_bwd = 0;
            std::vector<float> got_o;
            if (half) {
                spb_bf16 *g = dev_bf16(qkv), *go = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * no);
                spb_bf16 *gob = dev_bf16(ob), *gdo = dev_bf16(dout);
                rc_fwd = cudnn ? spb_cuda_cudnn_direct_forward(&d, g + qo, g + ko, g + vo, go, gl)
                               : spb_cuda_gqa_half_forward(simple_half_forward, &d, g + qo, g + ko, g + vo, go, gl);
                got_o = host_bf16(go, no);
                rc_bwd = cudnn ? spb_cuda_cudnn_direct_backward(&d, g + qo, g + ko, g + vo, gob, glr, gdo, gd + qo,
                                                                gd + ko, gd + vo)
                               : spb_cuda_gqa_half_backward(simple_half_backward, &d, g + qo, g + ko, g + vo, gob, glr,
                                                            gdo, gd + qo, gd + ko, gd + vo);
                for (spb_bf16 *p : {g, go, gob, gdo}) spb_cuda_free(p);
            } else {
                const spb_attn_backend *cudnn_table = spb_cuda_cudnn_attention();
                float *g = dev(qkv), *go = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * no), *gob = dev(ob),
                      *gdo = dev(dout);
                if (cudnn)
                    cudnn_table->forward(&d, g + qo, g + ko, g + vo, go, gl);
                else
                    spb_cuda_gqa_forward(&spb_attn_cuda_simple, &d, g + qo, g + ko, g + vo, go, gl);
                got_o = host_f32(go, no);
                if (cudnn)
                    cudnn_table->backward(&d, g + qo, g + ko, g + vo, gob, glr, gdo, gd + qo, gd + ko, gd + vo);
                else
                    spb_cuda_gqa_backward(&spb_attn_cuda_simple, &d, g + qo, g + ko, g + vo, gob, glr, gdo, gd + qo,
                                          gd + ko, gd + vo);
                for (float *p : {g, go, gob, gdo}) spb_cuda_free(p);
            }
            if (rc_fwd) report("expand-kv: fwd declined", impl, shape, 1.0, 0.0);
            check((std::string(kernel) + " fwd O").c_str(), impl, shape, got_o, ro, fwd_tol);
            check((std::string(kernel) + " fwd lse").c_str(), impl, shape, host_f32(gl, nl), rl,
                  spb_tol_f32_sum(T) * 8);
            if (rc_bwd) report("expand-kv: bwd declined", impl, shape, 1.0, 0.0);
            check((std::string(kernel) + " bwd dQ,dK,dV").c_str(), impl, shape, host_f32(gd, nq), rd, bwd_tol);
            for (float *p : {gl, glr, gd}) spb_cuda_free(p);
        }
    if (cudnn || half) return;
    /* What the wrapper holds, measured by the device allocator: the copies
     * and their gradients of one fp32 backward from nothing held, as the
     * memory model counts them (spb_attn_gqa_workspace_bytes) */
    const check_unit unit;
    if (!unit.taken) return;
    spb_attn_desc d = gqa_desc(B, H, 1, D, T, 1, T);
    const long width = (long)(H + 2) * D, nq = (long)B * T * width, no = (long)B * T * H * D, nl = (long)B * H * T;
    float *g = dev(randv(nq, 1.0f, false)), *gd = dev(std::vector<float>((size_t)nq, 0.0f));
    float *go = dev(randv(no, 1.0f, false)), *gl = dev(std::vector<float>((size_t)nl, 0.0f));
    spb_cuda_attention_workspace(nl); /* the kernels' own row workspace, held before */
    spb_cuda_gqa_release();
    SPB_CUDA_CHECK(cudaDeviceSynchronize());
    const double before = (double)spb_cuda_mem_stats()->current[SPB_MEM_WORKSPACE];
    spb_cuda_gqa_backward(&spb_attn_cuda_simple, &d, g, g + (long)H * D, g + (long)(H + 1) * D, go, gl, go, gd,
                          gd + (long)H * D, gd + (long)(H + 1) * D);
    const double held = (double)spb_cuda_mem_stats()->current[SPB_MEM_WORKSPACE] - before,
                 model = spb_attn_gqa_workspace_bytes(&d, 4, 1);
    char shape[96];
    snprintf(shape, sizeof shape, "fp32 D=%d B=%d H=%d G=1 T=%d: %.0f B", D, B, H, T, model);
    report("expand-kv workspace", SPB_CUDA_SIMPLE, shape, fabs(held - model) / model, 0.0);
    for (float *p : {g, gd, go, gl}) spb_cuda_free(p);
}
#endif

/* A forward variant the caller switched on, in both block shapes and head
 * dims in bf16 and in fp16 once (only the element conversions differ);
 * the shape column ends in tag, after " rows=64" for 64-row blocks.
 * Leaves 128-row blocks. */
static void check_fwd_variant(const char *tag)
{
    char tag64[64];
    snprintf(tag64, sizeof tag64, " rows=64%s", tag);
    for (int rows = 128; rows >= 64; rows /= 2) {
        spb_cuda_attention_set_block_rows(rows);
        check_attention(SPB_CUDA_FAST, 64, 0, rows == 64 ? tag64 : tag);
        check_attention(SPB_CUDA_FAST, 128, 0, rows == 64 ? tag64 : tag);
    }
    spb_cuda_attention_set_block_rows(128);
    check_attention(SPB_CUDA_FAST, 128, 1, tag);
}

/* ------------------------------------------------------------ the timings -- */

static double peak_tflops;
/* Which of the flash kernels' variants a training run should take (spbench
 * --flash-fwd, --flash-bwd, --flash-block-rows, --flash-dq): forward +
 * backward of one block shape, each summed over the shapes just timed (the
 * longest sequences weigh most). */
static void print_flash_variants(const double fwd_sum[2][2], const double bwd_sum[4][2], bool wgmma)
{
    static const char *bwd_name[4] = {"mma, split dQ", "mma, fused dQ", "wgmma, split dQ", "wgmma, fused dQ"};
    int best_f = 0, best_b = 0, best_r = 0;
    auto total = [&](int f, int b, int r) { return fwd_sum[f][r] + bwd_sum[b][r]; };
    printf("flash variants, fwd + bwd summed over the shapes above (ms):\n");
    for (int f = 0; f < (wgmma ? 2 : 1); f++)
        for (int b = 0; b < (wgmma ? 4 : 2); b++)
            for (int r = 0; r < 2; r++) {
                if (b == 3 && r == 1) continue; /* the fused wgmma backward holds 128 keys */
                printf("  fwd %-5s bwd %-15s %3d rows: %.3f\n", f ? "wgmma" : "mma", bwd_name[b], r ? 64 : 128,
                       total(f, b, r));
                if (total(f, b, r) < total(best_f, best_b, best_r)) best_f = f, best_b = b, best_r = r;
            }
    printf("fastest: spbench --flash-fwd %s --flash-bwd %s --flash-block-rows %d --flash-dq %s (%.2fx the default's "
           "time)%s\n",
           best_f ? "wgmma" : "mma", best_b >= 2 ? "wgmma" : "mma", best_r ? 64 : 128, best_b % 2 ? "fused" : "split",
           total(best_f, best_b, best_r) / total(0, 0, 0),
           timing.smoke ? "; smoke shape: the code path only, not a figure" : "");
}

/* heads: the (sequence, head) pairs of an attention call; 0 for a product */
static void timing_row(const char *kind, const char *name, long tokens, long m, long n, long k, int causal, int reps,
                       double ms, double flops, long heads = 0)
{
    double tf = flops / (ms * 1e-3) / 1e12;
    double pct = peak_tflops > 0 ? 100.0 * tf / peak_tflops : 0.0;
    printf("%-10s %-22s %6ld %6ld %6ld %6ld %-6s %9.3f %8.1f %6.1f%%\n", kind, name, tokens, m, n, k,
           causal < 0 ? "-" : (causal ? "yes" : "no"), ms, tf, pct);
    if (time_csv) {
        char f[10][32];
        snprintf(f[0], 32, "%ld", tokens), snprintf(f[1], 32, "%ld", m), snprintf(f[2], 32, "%ld", n);
        snprintf(f[3], 32, "%ld", k), snprintf(f[4], 32, "%s", causal < 0 ? "" : (causal ? "1" : "0"));
        snprintf(f[5], 32, "%d", reps), snprintf(f[6], 32, "%.4f", ms), snprintf(f[7], 32, "%.6g", tf);
        snprintf(f[8], 32, "%.2f", pct);
        if (heads > 0) snprintf(f[9], 32, "%ld", heads);
        else f[9][0] = 0;
        const char *row[] = {envi.gpu, envi.driver, envi.runtime, SPB_GIT_COMMIT, kind, name, f[0], f[1],
                             f[2],     f[3],        f[4],         f[5],           f[6], f[7], f[8], f[9]};
        for (int i = 0; i < 16; i++) spb_csv_field(time_csv, row[i], i == 15);
        fflush(time_csv);
    }
    gpu_watchdog_progress("the timing row '%s' %s %ld tokens", kind, name, tokens);
}

static void fill_bf16(spb_bf16 *d, long n)
{
    float *tmp = (float *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 4 * n);
    std::vector<float> h((size_t)(n < (1 << 20) ? n : (1 << 20)));
    for (auto &x : h) x = 0.5f * frand();
    for (long o = 0; o < n; o += (long)h.size()) {
        long c = n - o < (long)h.size() ? n - o : (long)h.size();
        SPB_CUDA_CHECK(cudaMemcpy(tmp + o, h.data(), 4 * c, cudaMemcpyHostToDevice));
    }
    spb_cuda_f32_to_bf16(d, tmp, n, 0);
    SPB_CUDA_CHECK(cudaDeviceSynchronize());
    spb_cuda_free(tmp);
}

/* n random fp16 values in [-0.5, 0.5), made on the host (a 1M pattern repeated). */
static void fill_fp16(spb_bf16 *d, long n)
{
    std::vector<spb_bf16> h((size_t)(n < (1 << 20) ? n : (1 << 20)));
    for (auto &x : h) x = spb_fp16_from_float(0.5f * frand());
    for (long o = 0; o < n; o += (long)h.size()) {
        long c = n - o < (long)h.size() ? n - o : (long)h.size();
        SPB_CUDA_CHECK(cudaMemcpy(d + o, h.data(), 2 * c, cudaMemcpyHostToDevice));
    }
}

/* The flash kernels' variants, timed side by side and profiled: the
 * default kernels, then the other block shape (64 rows), dQ from the dK/dV
 * kernel by atomics, and both passes on wgmma: fwd/bwd 1 = mma, 2 = wgmma,
 * 0 = not run. */
struct flash_variant {
    int rows, fused, fwd, bwd;
    const char *suffix;
    int keys;   /* keys per tile of the wgmma forward (spb_cuda_attention_set_fwd_key_block) */
    int blocks; /* blocks per SM the forward is built for (spb_cuda_attention_set_fwd_blocks_per_sm) */
    int pipe;   /* the wgmma forward with the softmax overlapping P·V (spb_cuda_attention_set_fwd_pipelined) */
    int rpw;    /* rows per warp of the mma.sync forward (spb_cuda_attention_set_fwd_rows_per_warp) */
    int xchg = 0; /* the backward on FlashAttention-2's tiling (spb_cuda_attention_set_bwd_exchange);
                   * 2: with its dQ added by the copy engine (spb_cuda_attention_set_bwd_dq_bulk) */
    int tma = 0;  /* the wgmma forward fed by a TMA producer warp: its schedule (spb_cuda_attention_set_fwd_tma) */
    int bulk = 0; /* the fused wgmma backward's dQ added by the copy engine (spb_cuda_attention_set_bwd_dq_bulk) */
    int btma = 0; /* the fused wgmma backward fed by a TMA producer warp: its schedule (set_bwd_tma) */
};
static const flash_variant flash_variants[] = {
    {128, 0, 1, 1, "mma", 64, 1, 0, 16},
    {64, 0, 1, 1, "mma, 64 rows", 64, 1, 0, 16},
    {64, 1, 0, 1, "mma, 64 rows, fused dQ", 64, 1, 0, 16},
    {128, 1, 0, 1, "mma, fused dQ", 64, 1, 0, 16},
    {128, 0, 2, 2, "wgmma", 64, 1, 0, 16},
    {64, 0, 2, 2, "wgmma, 64 rows", 64, 1, 0, 16},
    /* the wgmma forward on 128-key tiles, both forwards with registers
     * capped for two blocks per SM (not spbench options until timed) */
    {128, 0, 2, 0, "wgmma, 128 keys", 128, 1, 0, 16},
    {64, 0, 2, 0, "wgmma, 64 rows, 128 keys", 128, 1, 0, 16},
    {128, 0, 1, 0, "mma, 2 blocks/SM", 64, 2, 0, 16},
    {128, 0, 2, 0, "wgmma, 2 blocks/SM", 64, 2, 0, 16},
    /* and the wgmma forward with the softmax overlapping the P·V product */
    {128, 0, 2, 0, "wgmma, pipelined", 64, 1, 1, 16},
    {64, 0, 2, 0, "wgmma, 64 rows, pipelined", 64, 1, 1, 16},
    /* the mma.sync forward on FlashAttention-2's tiling: 4 warps of 32 rows */
    {128, 0, 1, 0, "mma, 32 rows/warp", 64, 1, 0, 32},
    /* the mma.sync backward on FlashAttention-2's tiling: S and dP in 32 x 32
     * warp tiles, P and dS through shared memory, dQ by 8-byte reductions */
    {128, 1, 0, 1, "mma, exchange", 64, 1, 0, 16, 1},
    /* and its dQ staged in shared memory, added a row at a time by the copy
     * engine (sm_90: where the wgmma kernels are) */
    {128, 1, 0, 1, "mma, exchange, bulk dQ", 64, 1, 0, 16, 2},
    /* the wgmma forward as FlashAttention-3 feeds it: a producer warp, the
     * copy engine's 128-byte-swizzled tiles, mbarriers (sm_90) */
    {128, 0, 2, 0, "wgmma, TMA producer", 64, 1, 0, 16, 0, 1},
    {128, 0, 2, 0, "wgmma, TMA producer, 128 keys", 128, 1, 0, 16, 0, 1},
    /* and its consumers with the overlap inside the warpgroup, then with
     * FlashAttention-3's ping-pong between the two as well */
    {128, 0, 2, 0, "wgmma, TMA, pipelined", 64, 1, 0, 16, 0, 2},
    {128, 0, 2, 0, "wgmma, TMA, pipelined, 128 keys", 128, 1, 0, 16, 0, 2},
    {128, 0, 2, 0, "wgmma, TMA, ping-pong", 64, 1, 0, 16, 0, 3},
    {128, 0, 2, 0, "wgmma, TMA, ping-pong, 128 keys", 128, 1, 0, 16, 0, 3},
    /* the wgmma backward in one kernel (FlashAttention-3's products): dQ
     * from dS in shared memory by 8-byte reductions, then by the copy engine */
    {128, 1, 0, 2, "wgmma, fused dQ", 64, 1, 0, 16},
    {128, 1, 0, 2, "wgmma, fused, bulk dQ", 64, 1, 0, 16, 0, 0, 1},
    /* and fed as FlashAttention-3 feeds it: a producer warp, the copy
     * engine's swizzled tiles, mbarriers, no block barrier in the loop */
    {128, 1, 0, 2, "wgmma, TMA, fused dQ", 64, 1, 0, 16, 0, 0, 0, 1},
    {128, 1, 0, 2, "wgmma, TMA, fused, bulk dQ", 64, 1, 0, 16, 0, 0, 1, 1},
    /* and its consumers computing P and dS while their products run */
    {128, 1, 0, 2, "wgmma, TMA, overlapped, fused dQ", 64, 1, 0, 16, 0, 0, 0, 2},
    {128, 1, 0, 2, "wgmma, TMA, overlapped, bulk dQ", 64, 1, 0, 16, 0, 0, 1, 2}};

/* Sets the kernels' switches to vr; false (nothing set) for a wgmma variant where there is none. */
static bool select_flash_variant(const flash_variant &vr, bool wgmma)
{
    if ((vr.fwd == 2 || vr.bwd == 2 || vr.xchg == 2 || vr.bulk || vr.btma) && !wgmma) return false;
    spb_cuda_attention_set_block_rows(vr.rows);
    spb_cuda_attention_set_fused_dq(vr.fused);
    spb_cuda_attention_set_fwd_key_block(vr.keys);
    spb_cuda_attention_set_fwd_blocks_per_sm(vr.blocks);
    spb_cuda_attention_set_fwd_pipelined(vr.pipe);
    spb_cuda_attention_set_fwd_rows_per_warp(vr.rpw);
    spb_cuda_attention_set_bwd_exchange(vr.xchg != 0);
    spb_cuda_attention_set_bwd_dq_bulk(vr.xchg == 2 || vr.bulk);
    if (wgmma) {
        spb_cuda_attention_set_fwd_wgmma(vr.fwd == 2), spb_cuda_attention_set_bwd_wgmma(vr.bwd == 2);
        spb_cuda_attention_set_fwd_tma(vr.tma);
        spb_cuda_attention_set_bwd_tma(vr.btma);
    }
    return true;
}

/* The attention operands of n tokens of the timings' shape: Q, K, V, dO
 * random bf16, O, fp32 dQ, dK, dV zeroed, lse and the workspace; freed
 * with the object. */
struct attn_buffers {
    long nq;
    spb_bf16 *q, *k, *v, *o, *dout;
    float *dq, *dk, *dv, *lse, *ws;
    explicit attn_buffers(long n) : nq(n * timing.H * timing.Dh)
    {
        q = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * nq), k = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * nq);
        v = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * nq), o = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * nq);
        dout = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * nq);
        dq = (float *)spb_cuda_alloc(SPB_MEM_GRADS, 4 * nq), dk = (float *)spb_cuda_alloc(SPB_MEM_GRADS, 4 * nq);
        dv = (float *)spb_cuda_alloc(SPB_MEM_GRADS, 4 * nq);
        lse = (float *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 4 * n * timing.H);
        ws = (float *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 4 * n * timing.H);
        fill_bf16(q, nq), fill_bf16(k, nq), fill_bf16(v, nq), fill_bf16(dout, nq);
        zero_grads();
    }
    void zero_grads()
    {
        SPB_CUDA_CHECK(cudaMemset(dq, 0, 4 * nq));
        SPB_CUDA_CHECK(cudaMemset(dk, 0, 4 * nq));
        SPB_CUDA_CHECK(cudaMemset(dv, 0, 4 * nq));
    }
    ~attn_buffers()
    {
        spb_cuda_free(q), spb_cuda_free(k), spb_cuda_free(v), spb_cuda_free(o), spb_cuda_free(dout);
        spb_cuda_free(dq), spb_cuda_free(dk), spb_cuda_free(dv), spb_cuda_free(lse), spb_cuda_free(ws);
    }
    attn_buffers(const attn_buffers &) = delete;
    attn_buffers &operator=(const attn_buffers &) = delete;
};

/* One causal sequence of N tokens, 32 heads of 128 (the timings' shape). */
static spb_attn_desc timing_desc(long N, int causal)
{
    spb_attn_desc d;
    memset(&d, 0, sizeof d);
    d.batch = 1, d.heads = (int)timing.H, d.head_dim = (int)timing.Dh, d.q_len = d.k_len = (int)N, d.causal = causal;
    d.scale = 1.0f / sqrtf((float)timing.Dh);
    d.q_token_stride = d.k_token_stride = d.o_token_stride = timing.H * timing.Dh;
    d.q_batch_stride = d.k_batch_stride = d.o_batch_stride = N * timing.H * timing.Dh;
    return d;
}

/* How many blocks and warps of each flash forward variant an SM holds, by
 * the CUDA runtime (registers and shared memory of the compiled kernel):
 * by their ptxas report the kernels of the first GPU run held 8 warps per
 * SM, which looks too few to hide one warp's chain of products, softmax
 * and products (docs/GPU.md, an inference to be checked).  One row per
 * variant and head dim; printed and to csv. */
static void report_fwd_occupancy(FILE *csv)
{
    const bool wgmma = use_wgmma();
    printf("\n%-36s %4s %7s %6s %5s %8s %6s\n", "forward kernel", "D", "blocks", "warps", "regs", "smem", "local");
    for (const auto &vr : flash_variants) {
        if (!vr.fwd || !select_flash_variant(vr, wgmma)) continue;
        for (int D = 64; D <= 128; D *= 2) {
            spb_cuda_occupancy o = spb_cuda_attention_fwd_occupancy(D, 0);
            char nm[64];
            snprintf(nm, sizeof nm, "flash fwd (%s)", vr.suffix);
            printf("%-36s %4d %7d %6d %5d %8ld %6ld\n", nm, D, o.blocks_per_sm, o.warps_per_sm, o.registers,
                   o.smem_bytes, o.local_bytes);
            if (!csv) continue;
            char f[6][24];
            snprintf(f[0], 24, "%d", D), snprintf(f[1], 24, "%d", o.blocks_per_sm);
            snprintf(f[2], 24, "%d", o.warps_per_sm), snprintf(f[3], 24, "%d", o.registers);
            snprintf(f[4], 24, "%ld", o.smem_bytes), snprintf(f[5], 24, "%ld", o.local_bytes);
            const char *row[] = {envi.gpu, envi.driver, envi.runtime, SPB_GIT_COMMIT, nm, f[0], f[1], f[2], f[3],
                                 f[4], f[5]};
            for (int i = 0; i < 11; i++) spb_csv_field(csv, row[i], i == 10);
        }
    }
    select_flash_variant(flash_variants[0], wgmma);
}

/* --profile: each flash variant's forward and backward, then cuDNN's, once
 * each, causal, at the first of tokens, with a line naming every call in
 * order: for a profiler (experiments/gpu-check runs Nsight Compute over it),
 * whose kernel rows come in the same order.  No checks, no timings. */
static void run_attention_profile(long N)
{
    attn_buffers bu(N);
    spb_bf16 *q = bu.q, *k = bu.k, *v = bu.v, *o = bu.o, *dout = bu.dout;
    float *dq = bu.dq, *dk = bu.dk, *dv = bu.dv, *lse = bu.lse, *ws = bu.ws;
    const spb_attn_desc d = timing_desc(N, 1);
    const bool wgmma = use_wgmma();
    int call = 0;
    for (const auto &vr : flash_variants) {
        if (!select_flash_variant(vr, wgmma)) continue;
        /* a variant without a forward of its own takes the last one's O and lse */
        if (vr.fwd) {
            printf("profile call %d: flash fwd (%s) N=%ld causal\n", ++call, vr.suffix, N);
            spb_cuda_attention_forward(&d, q, k, v, o, lse, SPB_CUDA_FAST, 0);
        }
        if (vr.bwd) {
            printf("profile call %d: flash bwd (%s) N=%ld causal\n", ++call, vr.suffix, N);
            spb_cuda_attention_backward(&d, q, k, v, o, lse, dout, dq, dk, dv, ws, SPB_CUDA_FAST, 0);
        }
        SPB_CUDA_CHECK(cudaDeviceSynchronize());
    }
    select_flash_variant(flash_variants[0], wgmma);
    char why[512];
    if (spb_cudnn_attention_built()) {
        spb_bf16 *dqb = (spb_bf16 *)dq, *dkb = (spb_bf16 *)dk, *dvb = (spb_bf16 *)dv;
        printf("profile call %d: cudnn fwd N=%ld causal\n", ++call, N);
        if (spb_cudnn_attention_forward(&d, SPB_CUDNN_BF16, q, k, v, o, lse, 0, why, sizeof why))
            printf("profile: cudnn: %s\n", why);
        printf("profile call %d: cudnn bwd N=%ld causal\n", ++call, N);
        if (spb_cudnn_attention_backward(&d, SPB_CUDNN_BF16, q, k, v, o, lse, dout, dqb, dkb, dvb, 0, why, sizeof why))
            printf("profile: cudnn: %s\n", why);
    }
    SPB_CUDA_CHECK(cudaDeviceSynchronize());
    printf("profile: %d calls\n", call);
}

static void run_timings(spb_cuda_gemm *g, const std::vector<long> &tokens, int reps)
{
    const long C = timing.C, F = timing.F, H = timing.H, Dh = timing.Dh;
    if (timing.smoke)
        printf("\ntimings at the %s shape (hidden %ld, %ld heads x %ld): the code path only, not a figure\n",
               timing.name, C, H, Dh);
    printf("\n%-10s %-22s %6s %6s %6s %6s %-6s %9s %8s %7s\n", "kind", "name", "tokens", "m", "n", "k", "causal",
           "median_ms", "TFLOP/s", "of_peak");
    /* the reference rate: a large square bf16 GEMM */
    {
        const long S = timing.square;
        spb_bf16 *a = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 2 * S * S),
                 *b = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 2 * S * S),
                 *c = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_WORKSPACE, 2 * S * S);
        fill_bf16(a, S * S), fill_bf16(b, S * S);
        double ms = time_ms([&] { spb_cuda_gemm_bf16(g, 0, 1, S, S, S, 1.0f, a, S, b, S, 0.0f, c, S, 0, 0); }, reps);
        double flops = 2.0 * S * S * S;
        peak_tflops = flops / (ms * 1e-3) / 1e12;
        char nm[48];
        snprintf(nm, sizeof nm, "square %ld (peak ref)", S);
        timing_row("gemm", nm, 0, S, S, S, -1, reps, ms, flops);
        spb_cuda_free(a), spb_cuda_free(b), spb_cuda_free(c);
    }
    long maxN = 0;
    for (long n : tokens) maxN = n > maxN ? n : maxN;
    /* buffers for the largest shape, reused */
    spb_bf16 *X = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * maxN * F),
             *Y = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_ACTIVATIONS, 2 * maxN * F),
             *W = (spb_bf16 *)spb_cuda_alloc(SPB_MEM_PARAMS, 2 * F * C);
    float *dW = (float *)spb_cuda_alloc(SPB_MEM_GRADS, 4 * F * C);
    fill_bf16(X, maxN * F), fill_bf16(Y, maxN * F), fill_bf16(W, F * C);
    SPB_CUDA_CHECK(cudaMemset(dW, 0, 4 * F * C));
    /* The layer's products, then the same at one rank's share for P = 8 (the
     * layer timings' P): Megatron-SP's sharded widths on all N rows, and
     * Ulysses' and ring's N/8 rows at full width.  The model prices a
     * strategy's products with these (scripts/gpu-profile): without them it
     * would rest on an assumed ramp below the layer's shapes. */
    const long P8 = 8;
    struct lin {
        const char *name, *share; /* share: "" for the layer's, else the strategy it stands for */
        long in, out, rows_div;
    } layers[] = {{"qkv", "", C, 3 * C, 1},           {"proj", "", C, C, 1},
                  {"fc", "", C, F, 1},                {"fcproj", "", F, C, 1},
                  {"qkv", "megatron-sp P=8", C, 3 * C / P8, 1}, {"proj", "megatron-sp P=8", C / P8, C, 1},
                  {"fc", "megatron-sp P=8", C, F / P8, 1},      {"fcproj", "megatron-sp P=8", F / P8, C, 1},
                  {"qkv", "rows/8 P=8", C, 3 * C, P8},          {"proj", "rows/8 P=8", C, C, P8},
                  {"fc", "rows/8 P=8", C, F, P8},               {"fcproj", "rows/8 P=8", F, C, P8}};
    for (long Nl : tokens) {
        for (const lin &L : layers) {
            char nm[64];
            const long N = Nl / L.rows_div;
            double flops = 2.0 * N * L.in * L.out;
            auto named = [&](const char *op) {
                if (L.share[0]) snprintf(nm, sizeof nm, "%s %s (%s)", L.name, op, L.share);
                else snprintf(nm, sizeof nm, "%s %s", L.name, op);
            };
            named("fwd"); /* Y[N][out] = X[N][in] W[out][in]ᵀ */
            double ms = time_ms([&] { spb_cuda_gemm_bf16(g, 0, 1, N, L.out, L.in, 1.0f, X, L.in, W, L.in, 0.0f, Y,
                                                         L.out, 0, 0); }, reps);
            timing_row("gemm", nm, Nl, N, L.out, L.in, -1, reps, ms, flops);
            named("bwd dinp"); /* dX[N][in] = dY[N][out] W[out][in] */
            ms = time_ms([&] { spb_cuda_gemm_bf16(g, 0, 0, N, L.in, L.out, 1.0f, Y, L.out, W, L.in, 0.0f, X, L.in, 0,
                                                  0); }, reps);
            timing_row("gemm", nm, Nl, N, L.in, L.out, -1, reps, ms, flops);
            named("bwd dW"); /* dW[out][in] += dY[N][out]ᵀ X[N][in], fp32 */
            ms = time_ms([&] { spb_cuda_gemm_bf16(g, 1, 0, L.out, L.in, N, 1.0f, Y, L.out, X, L.in, 1.0f, dW, L.in, 1,
                                                  0); }, reps);
            timing_row("gemm", nm, Nl, L.out, L.in, N, -1, reps, ms, flops);
        }
    }
    spb_cuda_free(X), spb_cuda_free(Y), spb_cuda_free(W), spb_cuda_free(dW);

    /* flash attention, one sequence of N tokens, 32 heads of 128 */
    attn_buffers bu(maxN);
    const long nq = bu.nq;
    spb_bf16 *q = bu.q, *k = bu.k, *v = bu.v, *o = bu.o, *dout = bu.dout;
    float *dq = bu.dq, *dk = bu.dk, *dv = bu.dv, *lse = bu.lse, *ws = bu.ws;
    double cudnn_setup_s = 0.0;
    const bool wgmma = use_wgmma();
    /* each variant's forward and backward, summed over the shapes timed:
     * fwd [mma, wgmma][128, 64 rows]; bwd [mma split dQ, mma fused dQ, wgmma split dQ, wgmma fused dQ]
     * [128, 64 rows] (the fused wgmma backward: 128 rows only) */
    double fwd_sum[2][2] = {{0, 0}, {0, 0}}, bwd_sum[4][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
    /* cuDNN's fused attention on the same operands as d's flash rows; dQ dK
     * dV bf16.  The first calls of a shape build its plans (heuristics and
     * run-time compilation): past a minute of that, the rest of the cuDNN
     * rows are left out so the script keeps its budget.  share: "" for the
     * layer's call, else the one rank's share it stands for. */
    auto time_cudnn = [&](const spb_attn_desc &d, long Nl, const char *share) {
        if (!spb_cudnn_attention_built() || cudnn_setup_s > 60.0) return;
        char why[512], nf[64], nb[64];
        spb_bf16 *dqb = (spb_bf16 *)dq, *dkb = (spb_bf16 *)dk, *dvb = (spb_bf16 *)dv;
        std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
        int rc = spb_cudnn_attention_forward(&d, SPB_CUDNN_BF16, q, k, v, o, lse, 0, why, sizeof why) ||
                 spb_cudnn_attention_backward(&d, SPB_CUDNN_BF16, q, k, v, o, lse, dout, dqb, dkb, dvb, 0, why,
                                              sizeof why);
        SPB_CUDA_CHECK(cudaDeviceSynchronize());
        cudnn_setup_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rc) {
            printf("attention  cudnn: %s\n", why);
            return;
        }
        if (cudnn_setup_s > 60.0) printf("attention  cudnn: plans took %.0f s, later sizes left out\n", cudnn_setup_s);
        const double pairs = spb_attn_visible_pairs(&d);
        const long bh = (long)d.batch * d.heads;
        snprintf(nf, sizeof nf, "cudnn fwd%s%s%s", share[0] ? " (" : "", share, share[0] ? ")" : "");
        snprintf(nb, sizeof nb, "cudnn bwd%s%s%s", share[0] ? " (" : "", share, share[0] ? ")" : "");
        double ms = time_ms([&] { spb_cudnn_attention_forward(&d, SPB_CUDNN_BF16, q, k, v, o, lse, 0, why,
                                                              sizeof why); }, reps);
        timing_row("attention", nf, Nl, d.q_len, d.k_len, Dh, d.causal, reps, ms, 4.0 * Dh * pairs, bh);
        ms = time_ms([&] { spb_cudnn_attention_backward(&d, SPB_CUDNN_BF16, q, k, v, o, lse, dout, dqb, dkb, dvb, 0,
                                                        why, sizeof why); }, reps);
        timing_row("attention", nb, Nl, d.q_len, d.k_len, Dh, d.causal, reps, ms, 10.0 * Dh * pairs, bh);
    };
    for (long N : tokens)
        for (int causal = 1; causal >= 0; causal--) {
            spb_attn_desc d = timing_desc(N, causal);
            double pairs = spb_attn_visible_pairs(&d);
            auto fwd = [&] { spb_cuda_attention_forward(&d, q, k, v, o, lse, SPB_CUDA_FAST, 0); };
            auto bwd = [&] {
                spb_cuda_attention_backward(&d, q, k, v, o, lse, dout, dq, dk, dv, ws, SPB_CUDA_FAST, 0);
            };
            for (const auto &vr : flash_variants) {
                if (!select_flash_variant(vr, wgmma)) continue;
                char nm[64];
                double ms;
                if (vr.fwd) {
                    snprintf(nm, sizeof nm, "flash fwd (%s)", vr.suffix);
                    gpu_watchdog_progress("the start of timing %s, %ld tokens, causal %d", nm, N, causal);
                    ms = time_ms(fwd, reps);
                    timing_row("attention", nm, N, N, N, Dh, causal, reps, ms, 4.0 * Dh * pairs, H);
                    if (vr.keys == 64 && vr.blocks == 1 && !vr.pipe && vr.rpw == 16 && !vr.tma) /* spbench's options */
                        fwd_sum[vr.fwd == 2][vr.rows == 64] += ms;
                }
                if (!vr.bwd) continue;
                snprintf(nm, sizeof nm, "flash bwd (%s)", vr.suffix);
                gpu_watchdog_progress("the start of timing %s, %ld tokens, causal %d", nm, N, causal);
                fwd(); /* O and lse from this variant's forward */
                ms = time_ms(bwd, reps);
                if (!vr.xchg && !vr.bulk && !vr.btma) /* spbench's options */
                    bwd_sum[(vr.bwd == 2 ? 2 : 0) + vr.fused][vr.rows == 64] += ms;
                timing_row("attention", nm, N, N, N, Dh, causal, reps, ms, 10.0 * Dh * pairs, H);
            }
            select_flash_variant(flash_variants[0], wgmma);
            time_cudnn(d, N, "");
        }
    print_flash_variants(fwd_sum, bwd_sum, wgmma);
    /* One rank's attention at P = 8 (the layer timings' P), for the model
     * (scripts/gpu-profile): Ulysses' and Megatron-SP's calls hold all N
     * tokens of H/8 heads ("heads/8 P=8"); ring's blocks hold N/8 tokens of
     * all H heads ("rows/8 P=8"; the diagonal block causal, the others
     * full, which costs what an offset block does).  Few heads or short
     * blocks leave SMs without query tiles: the layer's 32-head rates
     * would flatter them.  spbench's default kernels and cuDNN, and the
     * default's 64-row blocks (twice the blocks: the run says whether the
     * strategies' calls should take them). */
    for (long Nl : tokens)
        for (int rows_share = 0; rows_share < 2; rows_share++)
            for (int causal = 1; causal >= 0; causal--) {
                const long N = rows_share ? Nl / P8 : Nl;
                spb_attn_desc d = timing_desc(N, causal);
                if (!rows_share) {
                    d.heads = (int)(H / P8);
                    d.q_token_stride = d.k_token_stride = d.o_token_stride = d.heads * Dh;
                    d.q_batch_stride = d.k_batch_stride = d.o_batch_stride = N * d.heads * Dh;
                }
                const char *share = rows_share ? "rows/8 P=8" : "heads/8 P=8";
                const double pairs = spb_attn_visible_pairs(&d);
                for (int vi = 1; vi >= 0; vi--) { /* 64 rows, then the default: its O and lse stay for cuDNN */
                    const flash_variant &vr = flash_variants[vi];
                    select_flash_variant(vr, wgmma);
                    char nm[80];
                    snprintf(nm, sizeof nm, "flash fwd (%s) (%s)", vr.suffix, share);
                    gpu_watchdog_progress("the start of timing %s, %ld tokens, causal %d", nm, Nl, causal);
                    double ms =
                        time_ms([&] { spb_cuda_attention_forward(&d, q, k, v, o, lse, SPB_CUDA_FAST, 0); }, reps);
                    timing_row("attention", nm, Nl, N, N, Dh, causal, reps, ms, 4.0 * Dh * pairs, d.heads);
                    snprintf(nm, sizeof nm, "flash bwd (%s) (%s)", vr.suffix, share);
                    gpu_watchdog_progress("the start of timing %s, %ld tokens, causal %d", nm, Nl, causal);
                    ms = time_ms([&] { spb_cuda_attention_backward(&d, q, k, v, o, lse, dout, dq, dk, dv, ws,
                                                                   SPB_CUDA_FAST, 0); }, reps);
                    timing_row("attention", nm, Nl, N, N, Dh, causal, reps, ms, 10.0 * Dh * pairs, d.heads);
                }
                time_cudnn(d, Nl, share);
            }
    /* The same kernels on fp16 (the paper's runs' precision; --precision
     * fp16's attention): the flash rows again, causal, from fp16 operands. */
    fill_fp16(q, nq), fill_fp16(k, nq), fill_fp16(v, nq), fill_fp16(dout, nq);
    bu.zero_grads(); /* the cuDNN rows left bf16 bits there */
    for (long N : tokens) {
        spb_attn_desc d = timing_desc(N, 1);
        double pairs = spb_attn_visible_pairs(&d);
        spb_cuda_attention_forward_half(&d, 1, q, k, v, o, lse, SPB_CUDA_FAST, 0);
        double ms = time_ms([&] { spb_cuda_attention_forward_half(&d, 1, q, k, v, o, lse, SPB_CUDA_FAST, 0); }, reps);
        timing_row("attention", "flash fwd (mma, fp16)", N, N, N, Dh, 1, reps, ms, 4.0 * Dh * pairs, H);
        ms = time_ms([&] { spb_cuda_attention_backward_half(&d, 1, q, k, v, o, lse, dout, dq, dk, dv, ws,
                                                            SPB_CUDA_FAST, 0); }, reps);
        timing_row("attention", "flash bwd (mma, fp16)", N, N, N, Dh, 1, reps, ms, 10.0 * Dh * pairs, H);
    }
}

/* ------------------------------------------------------------------ main -- */
static void usage(void)
{
    fprintf(stderr, "usage: spbench-gpu-check [--check-only | --timings-only] [--out DIR] [--reps N] [--tokens N,N,...] [--smoke] "
                    "[--no-wgmma] [--profile] [--part K[-L]/N] [--lean-fp16] [--watchdog SECONDS]\n");
}

int main(int argc, char **argv)
{
    int check_only = 0, timings_only = 0, profile = 0, reps = 7;
    double watchdog = kGpuWatchdogDefault;
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
        else if (!strcmp(argv[i], "--no-wgmma"))
            no_wgmma = true;
        else if (!strcmp(argv[i], "--lean-fp16"))
            lean_fp16 = true;
        else if (!strcmp(argv[i], "--profile"))
            profile = 1;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i], out_given = true;
        else if (!strcmp(argv[i], "--part") && i + 1 < argc) {
            char end = 0;
            const char *a = argv[++i];
            int n = sscanf(a, "%d-%d/%d%c", &part_index, &part_last, &part_count, &end);
            if (n != 3) {
                n = sscanf(a, "%d/%d%c", &part_index, &part_count, &end) == 2 ? 3 : 0;
                part_last = part_index;
            }
            if (n != 3 || part_count < 1 || part_index < 1 || part_index > part_last || part_last > part_count) {
                fprintf(stderr, "spbench-gpu-check: --part wants K/N or K-L/N with 1 <= K <= L <= N, not %s\n", a);
                return usage(), 2;
            }
            part_index--, part_last--;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
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
    if (check_only && timings_only) {
        fprintf(stderr, "spbench-gpu-check: --check-only and --timings-only exclude each other\n");
        return usage(), 2;
    }
    if (int skip = gpu_env_open(&envi, "spbench-gpu-check", SPB_GIT_COMMIT)) return skip;
    if (profile) { /* unwatched: Nsight Compute replays each kernel many times, and the script bounds it */
        run_attention_profile(tokens[0]);
        return 0;
    }
    gpu_watchdog_start("spbench-gpu-check", watchdog);
    const bool write_csv = !timings_only && (!check_only || out_given);
    check_csv = write_csv ? spb_csv_open(out, "checks.csv",
                                         "gpu,driver,cuda_runtime,git_commit,kernel,impl,shape,max_rel_err,tolerance,"
                                         "result")
                          : NULL;
    if (write_csv && !check_csv) fprintf(stderr, "cannot write %s/checks.csv\n", out);
    /* opened (and emptied of an earlier run's row) now, its row written once
     * the checks are done: a part that dies leaves no row */
    FILE *part_csv = part_count > 1 && check_csv
                         ? spb_csv_open(out, "part.csv", "git_commit,first_share,last_share,shares,units,units_run,"
                                                         "checks,failed")
                         : NULL;

    spb_cuda_gemm *g = spb_cuda_gemm_create(32u << 20);
    /* --timings-only: the checks ran in an earlier pass (experiments/gpu-check
     * runs every check first, then the timings, each pass writing its CSV)
     */
    if (!timings_only) {
        printf("\n%-28s %-6s %-34s\n", "kernel", "impl", "shape");
        check_convert();
        for (int impl = 0; impl < 2; impl++) {
            spb_cuda_impl im = (spb_cuda_impl)impl;
            check_gemm(g, im);
            check_rowwise(im);
            check_adamw(im);
            check_ulysses(im);
            for (int fp16 = 0; fp16 < 2; fp16++) {
                check_attention(im, 64, fp16);
                check_attention(im, 128, fp16);
            }
        }
        check_direct_embedding();
        check_direct_bias_merge();
        check_llama_ops();
        check_gqa_attention_half(SPB_CUDA_SIMPLE);
        check_gqa_attention_half(SPB_CUDA_FAST);
#ifdef SPB_GPU_CHECK_HAVE_CORE
        check_gqa_attention_f32();
#endif
        /* FAST LayerNorm in row blocks (256 threads per row, C = 256·{4, 8, 16, 32};
         * C = 264 above takes the warp-per-row kernels) */
        check_layernorm(SPB_CUDA_FAST, 24, 1024, "rows=24 C=1024 row blocks");
        check_layernorm(SPB_CUDA_FAST, 40, 4096, "rows=40 C=4096 row blocks");
        check_layernorm(SPB_CUDA_FAST, 3, 8192, "rows=3 C=8192 row blocks");
        /* the fast kernels' other block shape (4 warps, 64 rows), which the timings compare */
        spb_cuda_attention_set_block_rows(64);
        for (int fp16 = 0; fp16 < 2; fp16++) {
            check_attention(SPB_CUDA_FAST, 64, fp16, " rows=64");
            check_attention(SPB_CUDA_FAST, 128, fp16, " rows=64");
        }
        /* and dQ inside the dK/dV kernel (atomics), in both block shapes; bf16
         * (the element type changes nothing of that step's indexing) */
        spb_cuda_attention_set_fused_dq(1);
        for (int rows = 128; rows >= 64; rows /= 2) {
            spb_cuda_attention_set_block_rows(rows);
            check_attention(SPB_CUDA_FAST, 64, 0, rows == 64 ? " rows=64 fused dQ" : " fused dQ");
            check_attention(SPB_CUDA_FAST, 128, 0, rows == 64 ? " rows=64 fused dQ" : " fused dQ");
        }
        spb_cuda_attention_set_fused_dq(0);
        spb_cuda_attention_set_block_rows(128);
        /* the forward with registers capped for two blocks per SM (Q's
         * fragments from shared memory): bf16, both head dims */
        spb_cuda_attention_set_fwd_blocks_per_sm(2);
        check_attention(SPB_CUDA_FAST, 64, 0, " blocks=2");
        check_attention(SPB_CUDA_FAST, 128, 0, " blocks=2");
        spb_cuda_attention_set_fwd_blocks_per_sm(1);
        /* the forward on FlashAttention-2's tiling (32 rows per warp, two row
         * groups per warp): both head dims in bf16, fp16 once */
        spb_cuda_attention_set_fwd_rows_per_warp(32);
        check_attention(SPB_CUDA_FAST, 64, 0, " rpw=32", true);
        check_attention(SPB_CUDA_FAST, 128, 0, " rpw=32", true);
        check_attention(SPB_CUDA_FAST, 128, 1, " rpw=32", true);
        spb_cuda_attention_set_fwd_rows_per_warp(16);
        /* the backward on FlashAttention-2's tiling, dQ by 8-byte reductions */
        check_exchange_backward(" exchange");
        printf("%s\n", spb_cudnn_attention_version());
        for (int t = 0; t < 2; t++) {
            check_cudnn_attention(64, t ? SPB_CUDNN_FP16 : SPB_CUDNN_BF16);
            check_cudnn_attention(128, t ? SPB_CUDNN_FP16 : SPB_CUDNN_BF16);
        }
        /* the forward and backward on Hopper's warpgroup products (wgmma),
         * both block shapes, where this GPU and build have them; last, so that
         * a fault there (a descriptor the hardware reads otherwise than the
         * emulation) leaves every other row written */
        if (use_wgmma()) {
            spb_cuda_attention_set_fwd_wgmma(1);
            spb_cuda_attention_set_bwd_wgmma(1);
            for (int rows = 128; rows >= 64; rows /= 2) {
                spb_cuda_attention_set_block_rows(rows);
                for (int fp16 = 0; fp16 < 2; fp16++) {
                    check_attention(SPB_CUDA_FAST, 64, fp16, rows == 64 ? " rows=64 wgmma" : " wgmma");
                    check_attention(SPB_CUDA_FAST, 128, fp16, rows == 64 ? " rows=64 wgmma" : " wgmma");
                }
            }
            /* the forward on 128-key tiles */
            spb_cuda_attention_set_fwd_key_block(128);
            check_fwd_variant(" wgmma keys=128");
            spb_cuda_attention_set_fwd_key_block(64);
            spb_cuda_attention_set_fwd_blocks_per_sm(2);
            check_attention(SPB_CUDA_FAST, 64, 0, " wgmma blocks=2");
            check_attention(SPB_CUDA_FAST, 128, 0, " wgmma blocks=2");
            spb_cuda_attention_set_fwd_blocks_per_sm(1);
            /* the pipelined forward (products in flight across the softmax) */
            spb_cuda_attention_set_fwd_pipelined(1);
            check_fwd_variant(" wgmma pipelined");
            spb_cuda_attention_set_fwd_pipelined(0);
            /* the forward fed by a TMA producer warp through mbarriers (128-row
             * blocks only), forward checks only (the backward is the one above):
             * each consumer schedule in both head dims and tile widths between
             * them, fp16 twice */
            spb_cuda_attention_set_block_rows(128);
            struct {
                int sched, D, keys, fp16;
            } tma_checks[] = {{1, 64, 64, 0},  {1, 128, 64, 0},  {1, 128, 128, 0}, {1, 128, 128, 1}, {2, 128, 64, 0},
                              {2, 64, 128, 0}, {3, 64, 64, 0},   {3, 128, 128, 0}, {3, 128, 64, 1}};
            for (const auto &tc : tma_checks) {
                char tag[48];
                snprintf(tag, sizeof tag, " wgmma tma=%d keys=%d", tc.sched, tc.keys);
                spb_cuda_attention_set_fwd_tma(tc.sched);
                spb_cuda_attention_set_fwd_key_block(tc.keys);
                check_attention(SPB_CUDA_FAST, tc.D, tc.fp16, tag, !tc.fp16, true);
            }
            spb_cuda_attention_set_fwd_key_block(64);
            spb_cuda_attention_set_fwd_tma(0);
            /* the wgmma backward in one kernel, dQ by 8-byte reductions, then by
             * the copy engine: both head dims in bf16, fp16 once, with the
             * diagonal at row 16 */
            spb_cuda_attention_set_fused_dq(1);
            for (int bulk = 0; bulk < 2; bulk++) {
                const char *tag = bulk ? " wgmma fused bulk dQ" : " wgmma fused dQ";
                spb_cuda_attention_set_bwd_dq_bulk(bulk);
                check_attention(SPB_CUDA_FAST, 64, 0, tag, true);
                check_attention(SPB_CUDA_FAST, 128, 0, tag, true);
                check_attention(SPB_CUDA_FAST, 128, 1, tag, true);
            }
            /* and fed by a TMA producer warp through mbarriers: the same checks,
             * in both consumer schedules (fp16 once each) */
            for (int sched = 1; sched <= 2; sched++) {
                spb_cuda_attention_set_bwd_tma(sched);
                for (int bulk = 0; bulk < 2; bulk++) {
                    char tag[48];
                    snprintf(tag, sizeof tag, " wgmma tma=%d fused%s dQ", sched, bulk ? " bulk" : "");
                    spb_cuda_attention_set_bwd_dq_bulk(bulk);
                    check_attention(SPB_CUDA_FAST, 64, 0, tag, true);
                    check_attention(SPB_CUDA_FAST, 128, 0, tag, true);
                    if (bulk == sched - 1) check_attention(SPB_CUDA_FAST, 128, 1, tag, true);
                }
            }
            spb_cuda_attention_set_bwd_tma(0);
            spb_cuda_attention_set_bwd_dq_bulk(0);
            spb_cuda_attention_set_fused_dq(0);
            spb_cuda_attention_set_fwd_wgmma(0);
            spb_cuda_attention_set_bwd_wgmma(0);
            spb_cuda_attention_set_block_rows(128);
            /* and with its dQ added by the copy engine (sm_90, as wgmma) */
            spb_cuda_attention_set_bwd_dq_bulk(1);
            check_exchange_backward(" exchange bulk dQ");
            spb_cuda_attention_set_bwd_dq_bulk(0);
        } else {
            printf("%-28s %-6s skipped: %s\n", "flash (wgmma)", "fast",
                   no_wgmma ? "--no-wgmma" : "no wgmma here (compute capability 9.0 and an sm_90a build)");
        }
#ifdef SPB_GPU_CHECK_HAVE_CORE
        /* grouped-query attention through H-head backends (cuda_attention_gqa.h);
         * last, so that the units before keep their numbers (gpu_watchdog.sh's) */
        for (int cudnn = 0; cudnn < 2; cudnn++)
            for (int half = 0; half < 2; half++) check_gqa_expanded(cudnn, half);
#endif
        SPB_CUDA_CHECK(cudaDeviceSynchronize());
        if (part_count > 1) {
            const int mine = part_units_run;
            if (part_last > part_index)
                printf("\npart %d-%d/%d of the checks (%d of %d units)", part_index + 1, part_last + 1, part_count, mine,
                       part_units);
            else
                printf("\npart %d/%d of the checks (%d of %d units)", part_index + 1, part_count, mine, part_units);
            if (part_csv) {
                fprintf(part_csv, "%s,%d,%d,%d,%d,%d,%d,%d\n", SPB_GIT_COMMIT, part_index + 1, part_last + 1, part_count,
                        part_units, mine, checks_run, failures);
                fclose(part_csv);
            }
        }
        printf("\n%d checks, %d failed: %s\n", checks_run, failures, failures ? "FAIL" : "PASS");
        const spb_mem_stats *ms = spb_cuda_mem_stats();
        printf("device memory: peak %.1f MiB, now %.1f MiB (tracked)\n", ms->peak_total / 1048576.0,
               ms->current_total / 1048576.0);
        if (check_csv) fclose(check_csv);
    }

    if (!check_only) {
        time_csv = spb_csv_open(out, "timings.csv",
                                "gpu,driver,cuda_runtime,git_commit,kind,name,tokens,m,n,k,causal,reps,median_ms,"
                                "tflops,pct_of_peak,heads");
        FILE *occ = spb_csv_open(out, "occupancy.csv",
                                 "gpu,driver,cuda_runtime,git_commit,kernel,head_dim,blocks_per_sm,warps_per_sm,"
                                 "registers,smem_bytes,local_bytes");
        report_fwd_occupancy(occ);
        if (occ) fclose(occ);
        run_timings(g, tokens, reps);
        if (time_csv) fclose(time_csv);
        if (timings_only)
            printf("\nCSV: %s/timings.csv, %s/occupancy.csv\n", out, out);
        else
            printf("\nCSV: %s/checks.csv, %s/timings.csv, %s/occupancy.csv\n", out, out, out);
    }
    spb_cuda_gemm_destroy(g);
    return failures ? 1 : 0;
}
