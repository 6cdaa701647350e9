/* The fp32 CPU operations of Llama-style layers (issue 35): RMSNorm,
 * SwiGLU and rotary position embedding.  Contracts in ops.h, the same
 * conventions as LayerNorm and GELU there (backward accumulates into dinp
 * where LayerNorm's does). */
#include <math.h>

#include "fastmath.h"
#include "ops.h"

void spb_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int rows, int C)
{
    for (int r = 0; r < rows; r++) {
        const float *x = inp + (long)r * C;
        float *y = out + (long)r * C;
        float ms = 0.0f;
        for (int i = 0; i < C; i++) ms += x[i] * x[i];
        ms /= (float)C;
        float s = 1.0f / sqrtf(ms + SPB_RMSNORM_EPS);
        for (int i = 0; i < C; i++) y[i] = x[i] * s * w[i];
        rstd[r] = s;
    }
}

void spb_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                          const float *rstd, int rows, int C)
{
    for (int r = 0; r < rows; r++) {
        const float *dy = dout + (long)r * C;
        const float *x = inp + (long)r * C;
        float *dx = dinp + (long)r * C;
        float s = rstd[r];
        /* y = x s w, s = (mean(x²) + eps)^-1/2:  dx = s (g - xhat mean(g xhat)), g = dy w */
        float sum_gx = 0.0f;
        for (int i = 0; i < C; i++) {
            float xhat = x[i] * s;
            sum_gx += dy[i] * w[i] * xhat;
            dw[i] += dy[i] * xhat;
        }
        sum_gx /= (float)C;
        for (int i = 0; i < C; i++) dx[i] += s * (dy[i] * w[i] - x[i] * s * sum_gx);
    }
}

/* silu(a) = a·σ(a) */
static float sigmoid(float a) { return 1.0f / (1.0f + spb_expf(-a)); }

void spb_swiglu_forward(float *out, const float *inp, int rows, int F)
{
    for (int r = 0; r < rows; r++) {
        const float *gate = inp + (long)r * 2 * F, *up = gate + F;
        float *y = out + (long)r * F;
        for (int i = 0; i < F; i++) y[i] = gate[i] * sigmoid(gate[i]) * up[i];
    }
}

void spb_swiglu_backward(float *dinp, const float *inp, const float *dout, int rows, int F)
{
    for (int r = 0; r < rows; r++) {
        const float *gate = inp + (long)r * 2 * F, *up = gate + F, *dy = dout + (long)r * F;
        float *dgate = dinp + (long)r * 2 * F, *dup = dgate + F;
        for (int i = 0; i < F; i++) {
            float a = gate[i], s = sigmoid(a), silu = a * s;
            dup[i] = dy[i] * silu;
            dgate[i] = dy[i] * up[i] * (s + silu * (1.0f - s));
        }
    }
}

/* The angle of pair i at position p: p · base^(-2i/D), in double so that
 * every rank gets the same bits for the same global position. */
void spb_rope_apply(float *x, const long *positions, int batch, int tokens, long token_stride, long batch_stride,
                    int heads, int head_dim, double base, int inverse)
{
    const int half = head_dim / 2;
    for (int t = 0; t < tokens; t++)
        for (int i = 0; i < half; i++) {
            double angle = spb_rope_angle(positions[t], i, head_dim, base);
            float c = (float)cos(angle), s = (float)(inverse ? -sin(angle) : sin(angle));
            for (int b = 0; b < batch; b++) {
                float *row = x + b * batch_stride + t * token_stride;
                for (int h = 0; h < heads; h++) {
                    float *v = row + (long)h * head_dim;
                    float lo = v[i], hi = v[i + half]; /* rotate_half pairs (i, i + D/2) */
                    v[i] = lo * c - hi * s;
                    v[i + half] = hi * c + lo * s;
                }
            }
        }
}
