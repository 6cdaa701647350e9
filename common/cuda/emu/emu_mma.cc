/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 for the
 * CPU emulation: D = A·B + C with A 16x16, B 16x8, C and D 16x8 fp32, held
 * across the 32 lanes of a warp as the PTX ISA's "Matrix Fragments for
 * mma.m16n8k16 with floating point type" lays them out (g = lane / 4,
 * t = lane % 4; register j of a lane holds elements 2j (low 16 bits) and
 * 2j + 1 (high 16 bits)):
 *   A: element i of a lane is at row g (i in 0,1,4,5) or g + 8 (i in 2,3,6,7),
 *      column 2t + (i & 1) (i < 4) or 2t + (i & 1) + 8 (i >= 4)
 *   B: element i is at row (k) 2t + (i & 1) (i < 2) or 2t + (i & 1) + 8
 *      (i >= 2), column (n) g
 *   C, D: element i is at row g (i < 2) or g + 8, column 2t + (i & 1)
 * The products of two 16-bit values are exact in fp32; the sum runs over k
 * in order in fp32 (the hardware's order and internal width differ: the
 * checks' tolerances cover that, docs/EMULATION.md).
 *
 * ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16, from the ISA's
 * description of ldmatrix: lane l gives the address of row l % 8 of matrix
 * l / 8 (16 bytes, 16-byte aligned, in shared memory); each lane's
 * register i holds two 16-bit elements of matrix i, the pair at row l / 4,
 * columns 2(l % 4) and 2(l % 4) + 1 (low half first), or with .trans the
 * pair at rows 2(l % 4) and 2(l % 4) + 1, column l / 4. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"
#include "spb_emu.h"

namespace {
struct lane_operands {
    uint32_t a[4], b[2];
};

/* B[k][n] from the lanes' registers */
float b_elem(const lane_operands *L, int k, int n, int fp16)
{
    int t = (k % 8) / 2;
    int i = (k % 2) + (k >= 8 ? 2 : 0); /* element index 0..3 */
    return spb_emu_half_value(L[4 * n + t].b[i / 2], i % 2, fp16);
}
} // namespace

float spb_emu_half_value(uint32_t reg, int high, int fp16)
{
    uint16_t bits = (uint16_t)(high ? reg >> 16 : reg & 0xffffu);
    if (fp16) {
        __half_raw h;
        h.x = bits;
        return __half2float(__half(h));
    }
    __nv_bfloat16_raw b;
    b.x = bits;
    return __bfloat162float(__nv_bfloat16(b));
}

float spb_emu_a_fragment(const uint32_t (*regs)[4], int row, int k, int fp16)
{
    int g = row % 8, t = (k % 8) / 2;
    int i = (k % 2) + (row >= 8 ? 2 : 0) + (k >= 8 ? 4 : 0); /* element index 0..7 */
    return spb_emu_half_value(regs[4 * g + t][i / 2], i % 2, fp16);
}

void spb_emu_mma_m16n8k16(int fp16, float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    lane_operands mine, all[32];
    memcpy(mine.a, a, sizeof mine.a);
    mine.b[0] = b0, mine.b[1] = b1;
    spb_emu_warp_gather(0xffffffffu, &mine, sizeof mine, all, "mma.sync.m16n8k16");
    uint32_t a_regs[32][4];
    for (int l = 0; l < 32; l++) memcpy(a_regs[l], all[l].a, sizeof a_regs[l]);
    int lane = spb_emu_lane(), g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float sum = 0.0f;
        for (int k = 0; k < 16; k++) sum += spb_emu_a_fragment(a_regs, row, k, fp16) * b_elem(all, k, col, fp16);
        c[i] += sum;
    }
}

void spb_emu_ldmatrix_x4(uint32_t r[4], const void *row, int trans)
{
    const unsigned char *rows[32];
    const char *what = trans ? "ldmatrix.m8n8.x4.trans" : "ldmatrix.m8n8.x4";
    /* the row this lane names, read before the warp meets (race check) */
    spb_emu_race_access(row, 16, 0, __builtin_return_address(0));
    spb_emu_warp_gather(0xffffffffu, &row, sizeof row, rows, what);
    for (int l = 0; l < 32; l++)
        if ((uintptr_t)rows[l] % 16 || !spb_emu_in_dynamic_shared(rows[l], 16)) {
            fprintf(stderr,
                    "spbench CUDA emulation: kernel %s: %s: lane %d's row %p is not 16 aligned bytes of the "
                    "launch's dynamic shared memory\n",
                    spb_emu_kernel_name(), what, l, (const void *)rows[l]);
            abort();
        }
    int lane = spb_emu_lane(), q = lane / 4, p = lane % 4;
    for (int i = 0; i < 4; i++) {
        uint16_t lo, hi;
        if (trans) { /* column q of rows 2p, 2p + 1 */
            memcpy(&lo, rows[8 * i + 2 * p] + 2 * q, 2);
            memcpy(&hi, rows[8 * i + 2 * p + 1] + 2 * q, 2);
        } else { /* row q, columns 2p, 2p + 1 */
            memcpy(&lo, rows[8 * i + q] + 4 * p, 2);
            memcpy(&hi, rows[8 * i + q] + 4 * p + 2, 2);
        }
        r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    /* the warp reads together: no lane goes on (and writes over a row)
     * before every lane has read */
    __syncwarp();
}
