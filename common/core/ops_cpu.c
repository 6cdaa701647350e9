#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fastmath.h"
#include "ops.h"
#include "timer.h"

static double gemm_flops;

const char *spb_blas_description(void)
{
#ifdef SPB_CBLAS_IS_FALLBACK /* common/blas_fallback/cblas.h: no OpenBLAS in this build */
    return "fallback sgemm (slow)";
#else
    static char text[96];
    snprintf(text, sizeof text, "OpenBLAS %s x%d", openblas_get_corename(), openblas_get_num_threads());
    return text;
#endif
}

double spb_gemm_flops(void) { return gemm_flops; }
void spb_gemm_flops_reset(void) { gemm_flops = 0.0; }
void spb_gemm_flops_add(double flops) { gemm_flops += flops; }

/* Row-major C[m][n] = alpha op(A) op(B) + beta C, timed and counted. */
static void sgemm(int transA, int transB, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc)
{
    spb_timer_region timed = spb_timer_begin(SPB_T_GEMM);
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, m, n, k,
                alpha, A, lda, B, ldb, beta, C, ldc);
    spb_timer_end(timed);
    gemm_flops += 2.0 * m * n * k;
}

void spb_matmul_forward_ld(float *out, int ldo, const float *inp, int ldi, const float *W, int ldw, const float *b,
                           int rows, int in, int out_f, int accumulate)
{
    float beta = accumulate ? 1.0f : 0.0f;
    if (b && !accumulate) {
        for (int r = 0; r < rows; r++) memcpy(out + (long)r * ldo, b, sizeof(float) * out_f);
        beta = 1.0f;
    }
    sgemm(0, 1, rows, out_f, in, 1.0f, inp, ldi, W, ldw, beta, out, ldo);
}

void spb_matmul_forward(float *out, const float *inp, const float *W, const float *b, int rows, int in, int out_f)
{
    spb_matmul_forward_ld(out, out_f, inp, in, W, in, b, rows, in, out_f, 0);
}

void spb_matmul_backward_ld(float *dinp, int lddi, float *dW, int lddw, float *db, const float *dout, int ldo,
                            const float *inp, int ldi, const float *W, int ldw, int rows, int in, int out_f,
                            int accumulate_dinp)
{
    if (dinp) sgemm(0, 0, rows, in, out_f, 1.0f, dout, ldo, W, ldw, accumulate_dinp ? 1.0f : 0.0f, dinp, lddi);
    sgemm(1, 0, out_f, in, rows, 1.0f, dout, ldo, inp, ldi, 1.0f, dW, lddw);
    if (db)
        for (int r = 0; r < rows; r++) {
            const float *d = dout + (long)r * ldo;
            for (int o = 0; o < out_f; o++) db[o] += d[o];
        }
}

void spb_matmul_backward(float *dinp, float *dW, float *db, const float *dout, const float *inp, const float *W,
                         int rows, int in, int out_f, int accumulate_dinp)
{
    spb_matmul_backward_ld(dinp, in, dW, in, db, dout, out_f, inp, in, W, in, rows, in, out_f, accumulate_dinp);
}

void spb_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                           int rows, int C)
{
    const float eps = 1e-5f;
    for (int r = 0; r < rows; r++) {
        const float *x = inp + (long)r * C;
        float *y = out + (long)r * C;
        float m = 0.0f;
        for (int i = 0; i < C; i++) m += x[i];
        m /= (float)C;
        float v = 0.0f;
        for (int i = 0; i < C; i++) {
            float d = x[i] - m;
            v += d * d;
        }
        v /= (float)C;
        float s = 1.0f / sqrtf(v + eps);
        for (int i = 0; i < C; i++) y[i] = (x[i] - m) * s * w[i] + b[i];
        mean[r] = m;
        rstd[r] = s;
    }
}

void spb_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                            const float *mean, const float *rstd, int rows, int C)
{
    for (int r = 0; r < rows; r++) {
        const float *dy = dout + (long)r * C;
        const float *x = inp + (long)r * C;
        float *dx = dinp + (long)r * C;
        float m = mean[r], s = rstd[r];
        /* dx = s (g - mean(g) - xhat mean(g xhat)), g = dy * w */
        float sum_g = 0.0f, sum_gx = 0.0f;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s;
            float g = dy[i] * w[i];
            sum_g += g;
            sum_gx += g * xhat;
            db[i] += dy[i];
            dw[i] += dy[i] * xhat;
        }
        sum_g /= (float)C;
        sum_gx /= (float)C;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s;
            dx[i] += s * (dy[i] * w[i] - sum_g - xhat * sum_gx);
        }
    }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

void spb_gelu_forward(float *out, const float *inp, long n)
{
    for (long i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + spb_tanhf(u));
    }
}

void spb_gelu_backward(float *dinp, const float *inp, const float *dout, long n)
{
    for (long i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float t = spb_tanhf(u);
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        float g = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
        dinp[i] = dout[i] * g;
    }
}

void spb_embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe, const long *positions,
                           int rows, int T, int C)
{
    for (int r = 0; r < rows; r++) {
        const float *e = wte + (long)tokens[r] * C;
        float *y = out + (long)r * C;
        if (!wpe) { /* no position table (rotary positions) */
            for (int i = 0; i < C; i++) y[i] = e[i];
            continue;
        }
        const float *p = wpe + positions[r % T] * C;
        for (int i = 0; i < C; i++) y[i] = e[i] + p[i];
    }
}

void spb_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens, const long *positions,
                            int rows, int T, int C)
{
    for (int r = 0; r < rows; r++) {
        const float *d = dout + (long)r * C;
        float *de = dwte + (long)tokens[r] * C;
        for (int i = 0; i < C; i++) de[i] += d[i];
        if (!dwpe) continue; /* no position table */
        float *dp = dwpe + positions[r % T] * C;
        for (int i = 0; i < C; i++) dp[i] += d[i];
    }
}

double spb_softmax_xent_forward(float *probs, const int *targets, int rows, int V)
{
    double loss = 0.0;
    for (int r = 0; r < rows; r++) {
        float *p = probs + (long)r * V;
        float mx = p[0];
        for (int v = 1; v < V; v++) mx = p[v] > mx ? p[v] : mx;
        float target_logit = p[targets[r]];
        for (int v = 0; v < V; v++) p[v] = spb_expf(p[v] - mx); /* vectorised */
        float sum = 0.0f;
        for (int v = 0; v < V; v++) sum += p[v];
        float inv = 1.0f / sum;
        /* -log p[target] = log(sum) - (logit - max), from the logit so that a
         * tiny probability does not underflow. */
        loss += (double)logf(sum) - (double)(target_logit - mx);
        for (int v = 0; v < V; v++) p[v] *= inv;
    }
    return loss;
}

void spb_softmax_xent_backward(float *probs, const int *targets, int rows, int V, float scale)
{
    for (int r = 0; r < rows; r++) {
        float *p = probs + (long)r * V;
        for (int v = 0; v < V; v++) p[v] *= scale;
        p[targets[r]] -= scale;
    }
}

void spb_add_inplace(float *a, const float *b, long n)
{
    for (long i = 0; i < n; i++) a[i] += b[i];
}
