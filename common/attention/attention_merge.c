/* Merging attention over key blocks (ring attention): one block's (O_b,
 * lse_b) for query rows [row, row + len) folded into the running (O, lse),
 * in fp32:
 *   lse = max + log(exp(lse_a - max) + exp(lse_b - max))
 *   O   = O_a exp(lse_a - lse) + O_b exp(lse_b - lse)
 * A row with no visible key so far (lse -inf) takes the other side as is.
 * The CPU's implementation; a device table brings its own. */
#include <math.h>
#include <string.h>

#include "attention.h"

void spb_attn_merge_rows(float *o_acc, float *lse_acc, const float *o_pair, const float *lse_pair, int batch,
                         int heads, int head_dim, int T, int row, int len)
{
    const int H = heads, D = head_dim;
    const long W = (long)H * D;
    for (int b = 0; b < batch; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < len; i++) {
                float lb = lse_pair[((long)b * H + h) * len + i];
                if (!(lb > -INFINITY)) continue;
                float *la = &lse_acc[((long)b * H + h) * T + row + i];
                long at = ((long)b * T + row + i) * W + (long)h * D;
                float *oa = o_acc + at;
                const float *ob = o_pair + at;
                if (!(*la > -INFINITY)) {
                    memcpy(oa, ob, sizeof(float) * (size_t)D);
                    *la = lb;
                    continue;
                }
                float hi = fmaxf(*la, lb), lo = fminf(*la, lb);
                float lse = hi + log1pf(expf(lo - hi));
                float wa = expf(*la - lse), wb = expf(lb - lse);
                for (int e = 0; e < D; e++) oa[e] = oa[e] * wa + ob[e] * wb;
                *la = lse;
            }
}
