/* Reference attention backend (common/attention/attention.h): plain loops, one query
 * row at a time, double accumulation.  Clarity over speed; it is the oracle
 * the tiled backend is tested against.
 *
 * Forward, per (batch, head, query row i):
 *   s_j = scale q_i.k_j  for visible j (spb_attn_visible, tested element by
 *   element: causal k_offset+j <= q_offset+i, and the blocked-sparse
 *   pattern when the descriptor has one),
 *   lse_i = max_j s_j + log sum_j exp(s_j - max),  o_i = sum_j p_j v_j / sum_j p_j.
 * Backward, with P_ij = exp(s_ij - lse_i) and D_i = dO_i.O_i:
 *   dV_j += sum_i P_ij dO_i,   dP_ij = dO_i.V_j,   dS_ij = P_ij (dP_ij - D_i),
 *   dQ_i += scale sum_j dS_ij K_j,   dK_j += scale sum_i dS_ij Q_i.
 * Rows with no visible key: O = 0, lse = -INFINITY, no gradient.
 */
#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void naive_forward(const spb_attn_desc *d, const float *q, const float *k,
                          const float *v, float *o, float *lse)
{
    const int D = d->head_dim;
    double *s = malloc(sizeof(double) * (size_t)(d->k_len > 0 ? d->k_len : 1));
    double *acc = malloc(sizeof(double) * (size_t)(D > 0 ? D : 1));
    if (!s || !acc) {
        free(s);
        free(acc);
        abort();
    }
    for (int b = 0; b < d->batch; b++) {
        for (int h = 0; h < d->heads; h++) {
            for (int i = 0; i < d->q_len; i++) {
                const float *qi = q + b * d->q_batch_stride + i * d->q_token_stride + (long)h * D;
                float *oi = o + b * d->o_batch_stride + i * d->o_token_stride + (long)h * D;
                float *li = lse + ((long)b * d->heads + h) * d->q_len + i;
                int n = spb_attn_dense_keys(d, i); /* keys past n are masked */
                int any = 0;
                double mx = -INFINITY;
                for (int j = 0; j < n; j++) {
                    if (!spb_attn_visible(d, i, j))
                        continue;
                    any = 1;
                    const float *kj = k + b * d->k_batch_stride + j * d->k_token_stride + (long)spb_attn_kv_head(d, h) * D;
                    double dot = 0.0;
                    for (int c = 0; c < D; c++)
                        dot += (double)qi[c] * kj[c];
                    s[j] = (double)d->scale * dot;
                    if (s[j] > mx)
                        mx = s[j];
                }
                if (!any) {
                    for (int c = 0; c < D; c++)
                        oi[c] = 0.0f;
                    *li = -INFINITY;
                    continue;
                }
                double sum = 0.0;
                for (int c = 0; c < D; c++)
                    acc[c] = 0.0;
                for (int j = 0; j < n; j++) {
                    if (!spb_attn_visible(d, i, j))
                        continue;
                    const float *vj = v + b * d->k_batch_stride + j * d->k_token_stride + (long)spb_attn_kv_head(d, h) * D;
                    double p = exp(s[j] - mx);
                    sum += p;
                    for (int c = 0; c < D; c++)
                        acc[c] += p * vj[c];
                }
                for (int c = 0; c < D; c++)
                    oi[c] = (float)(acc[c] / sum);
                *li = (float)(mx + log(sum));
            }
        }
    }
    free(s);
    free(acc);
}

static void naive_backward(const spb_attn_desc *d, const float *q, const float *k,
                           const float *v, const float *o, const float *lse,
                           const float *dout, float *dq, float *dk, float *dv)
{
    const int D = d->head_dim;
    const size_t kd = (size_t)(d->k_len > 0 ? d->k_len : 1) * (size_t)(D > 0 ? D : 1);
    double *dqi = malloc(sizeof(double) * (size_t)(D > 0 ? D : 1));
    double *dka = malloc(sizeof(double) * kd); /* dK of this (b, h), double */
    double *dva = malloc(sizeof(double) * kd);
    if (!dqi || !dka || !dva) {
        free(dqi);
        free(dka);
        free(dva);
        abort();
    }
    for (int b = 0; b < d->batch; b++) {
        for (int h = 0; h < d->heads; h++) {
            memset(dka, 0, sizeof(double) * kd);
            memset(dva, 0, sizeof(double) * kd);
            for (int i = 0; i < d->q_len; i++) {
                const long qoff = b * d->q_batch_stride + i * d->q_token_stride + (long)h * D;
                const long ooff = b * d->o_batch_stride + i * d->o_token_stride + (long)h * D;
                const float *qi = q + qoff;
                const float *oi = o + ooff;
                const float *doi = dout + ooff;
                float *dqo = dq + qoff; /* dQ has Q's layout */
                double l = lse[((long)b * d->heads + h) * d->q_len + i];
                int n = spb_attn_dense_keys(d, i); /* keys past n are masked */
                if (n == 0 || !(l > -INFINITY))
                    continue; /* no visible key: contributes nothing */
                double Di = 0.0;
                for (int c = 0; c < D; c++) {
                    Di += (double)doi[c] * oi[c];
                    dqi[c] = 0.0;
                }
                for (int j = 0; j < n; j++) {
                    if (!spb_attn_visible(d, i, j))
                        continue;
                    const long koff = b * d->k_batch_stride + j * d->k_token_stride + (long)spb_attn_kv_head(d, h) * D;
                    const float *kj = k + koff;
                    const float *vj = v + koff;
                    double dot = 0.0, dp = 0.0;
                    for (int c = 0; c < D; c++) {
                        dot += (double)qi[c] * kj[c];
                        dp += (double)doi[c] * vj[c];
                    }
                    double p = exp((double)d->scale * dot - l);
                    double ds = p * (dp - Di);
                    double *dkj = dka + (size_t)j * D;
                    double *dvj = dva + (size_t)j * D;
                    for (int c = 0; c < D; c++) {
                        dvj[c] += p * doi[c];
                        dqi[c] += ds * kj[c];
                        dkj[c] += ds * qi[c];
                    }
                }
                for (int c = 0; c < D; c++)
                    dqo[c] += (float)((double)d->scale * dqi[c]);
            }
            for (int j = 0; j < d->k_len; j++) {
                const long koff = b * d->k_batch_stride + j * d->k_token_stride + (long)spb_attn_kv_head(d, h) * D;
                for (int c = 0; c < D; c++) {
                    dk[koff + c] += (float)((double)d->scale * dka[(size_t)j * D + c]);
                    dv[koff + c] += (float)dva[(size_t)j * D + c];
                }
            }
        }
    }
    free(dqi);
    free(dka);
    free(dva);
}

const spb_attn_backend spb_attn_naive = {
    "naive",
    naive_forward,
    naive_backward,
};

const spb_attn_backend *spb_attn_backend_by_name(const char *name)
{
    if (!name)
        return NULL;
    if (strcmp(name, "naive") == 0)
        return &spb_attn_naive;
    if (strcmp(name, "flash") == 0)
        return &spb_attn_flash;
    return NULL;
}
