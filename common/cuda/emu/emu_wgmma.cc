/* wgmma for the CPU emulation (warpgroup_ptx.cuh): Hopper's warpgroup
 * tensor-core product wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16},
 * its fence, commit_group and wait_group, from the PTX ISA's sections on
 * asynchronous warpgroup matrix instructions:
 *   - D fragments: warp w of the warpgroup (warps 4q..4q+3 of the block)
 *     holds rows 16w..16w+15 of the 64; register 4i + e of a lane holds
 *     (row 16w + g + 8 (e >= 2), column 8i + 2t + (e & 1)), g = lane / 4,
 *     t = lane % 4 (the ISA's "register fragment layout for accumulator D");
 *   - A from registers: warp w's lanes hold rows 16w.. in mma.m16n8k16's A
 *     layout (emu_mma.cc);
 *   - A and B from shared memory through a matrix descriptor, in the
 *     ISA's canonical layouts (T = 8 elements of 16 bits), without swizzle
 *     (K-major: ((8,m),(T,2k)):((1T,SBO),(1,LBO)); MN-major:
 *     ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))) as warpgroup_ptx.cuh writes
 *     them out, or with the 128-byte swizzle (layout type 1: K-major
 *     ((8,m),(T,2k)):((8T,SBO),(1,T)), element (m, k) at start + 128 (m % 8)
 *     + SBO (m / 8) + 2 k, LBO unused; MN-major ((T,8,m),(8,k)):
 *     ((1,T,LBO),(8T,SBO)), element (k, n) at start + 2 (n % 64) +
 *     LBO (n / 64) + 128 (k % 8) + SBO (k / 8)), that offset a in the
 *     dynamic shared memory then swizzled, a ^ ((a >> 7) & 7) << 4, as a
 *     tensor copy with the 128-byte swizzle lays a tile out (emu_tma.cc).
 *     Refused: the 64- and 32-byte swizzles, a base offset, a K-major
 *     swizzled start whose k16 slice (32 bytes) crosses its 128-byte row.
 *
 * Asynchrony.  A wgmma is queued at issue and computed when a wait_group
 * of the issuing thread covers its group: the latest moment a GPU allows.
 * So shared memory is read at the wait (a tile overwritten before the wait
 * gives wrong numbers), and accumulators read before the wait hold what
 * they held before the wgmma.  The race-check build also records the
 * operand reads as in flight from the issue to the wait (reads by the
 * warpgroup's first thread), so a write to them in between is reported as
 * a race, barriers or not, even where the numbers would agree.
 *
 * Checked here: the issuing thread's warpgroup is whole (a block may have
 * more threads, a producer warp, that issue no wgmma); the
 * lanes of a warp issue the same descriptors; a wgmma.fence precedes the
 * first wgmma and the first one after every wait_group (the ISA asks for a
 * fence wherever ordinary code touched the accumulators or A registers in
 * between, which this cannot see; CUTLASS fences before every batch, and
 * so must the kernels here); operands lie in the launch's dynamic shared
 * memory.  Not modelled: fence.proxy.async (a no-op here: the emulation has
 * one proxy), the hardware's summation order. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"
#include "spb_emu.h"

namespace {
[[noreturn]] void refuse(const char *what)
{
    fprintf(stderr, "spbench CUDA emulation: kernel %s: wgmma: %s\n", spb_emu_kernel_name(), what);
    abort();
}

struct desc_fields {
    uint32_t start, lbo, sbo;
    bool swizzle128; /* layout type 1 (bits 62-63) */
};
desc_fields decode(uint64_t desc)
{
    unsigned layout = (unsigned)(desc >> 62);
    if (layout == 2 || layout == 3)
        refuse("a descriptor with the 64- or 32-byte swizzle (no swizzle and the 128-byte swizzle are modelled)");
    if ((desc >> 49) & 7u) refuse("a descriptor with a matrix base offset (not modelled)");
    return desc_fields{(uint32_t)(desc & 0x3FFFu) << 4, (uint32_t)(desc >> 16 & 0x3FFFu) << 4,
                       (uint32_t)(desc >> 32 & 0x3FFFu) << 4, layout == 1};
}
/* a K-major 128-byte-swizzled operand's k16 slice (32 bytes of each
 * 128-byte row) must not cross its row */
void check_k_slice(const desc_fields &f)
{
    if (f.swizzle128 && f.start % 128 + 32 > 128)
        refuse("a K-major 128-byte-swizzled descriptor whose start puts its k16 slice (32 bytes) across a 128-byte "
               "row");
}

/* a 16-bit element of the launch's dynamic shared memory at byte offset `at` */
float smem_elem(uint32_t at, int fp16)
{
    const unsigned char *p = (const unsigned char *)spb_emu_dynamic_shared() + at;
    if (!spb_emu_in_dynamic_shared(p, 2)) refuse("an operand element outside the launch's dynamic shared memory");
    uint16_t bits;
    memcpy(&bits, p, 2);
    return spb_emu_half_value(bits, 0, fp16);
}

/* the 128-byte swizzle of a shared-memory offset: the 16-byte chunk's index
 * in its 128-byte row XORed with the row's index in its 1024-byte atom */
uint32_t swizzle128(uint32_t a) { return a ^ ((a >> 7) & 7u) << 4; }

/* byte offsets of an element, the canonical layouts (T = 8 elements):
 * no swizzle, K-major ((8,m),(T,2k)):((1T,SBO),(1,LBO)), MN-major
 * ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)); 128-byte swizzle, K-major
 * ((8,m),(T,2k)):((8T,SBO),(1,T)) (LBO unused: a k16 slice lies in one
 * 128-byte row), MN-major ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)), then the
 * address swizzled */
uint32_t k_major(const desc_fields &f, int row, int k)
{
    if (f.swizzle128) return swizzle128(f.start + 128u * (row % 8) + f.sbo * (row / 8) + 2u * k);
    return f.start + 16u * (row % 8) + f.sbo * (row / 8) + 2u * (k % 8) + f.lbo * (k / 8);
}
uint32_t mn_major(const desc_fields &f, int k, int n)
{
    if (f.swizzle128) return swizzle128(f.start + 2u * (n % 64) + f.lbo * (n / 64) + 128u * (k % 8) + f.sbo * (k / 8));
    return f.start + 2u * (n % 8) + f.sbo * (n / 8) + 16u * (k % 8) + f.lbo * (k / 8);
}

int thread_in_block(void)
{
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

/* The race check: the operands' bytes, read by the warpgroup (recorded as
 * its first thread) from the issue (kind 5) to the wait that covers it
 * (kind 6): a write in between is a race, barrier or not. */
void record_reads(const spb_emu_wgmma_op &op, int kind)
{
    if (thread_in_block() % 128) return;
    char *base = (char *)spb_emu_dynamic_shared();
    if (!op.a_in_regs) {
        desc_fields a = decode(op.a_desc);
        for (int m = 0; m < 64; m++)
            for (int kc = 0; kc < 2; kc++) spb_emu_race_access(base + k_major(a, m, 8 * kc), 16, kind, op.pc);
    }
    desc_fields b = decode(op.b_desc);
    for (int n = 0; n < op.n; n += op.trans_b ? 8 : 1)
        for (int k = 0; k < 16; k += op.trans_b ? 1 : 8)
            spb_emu_race_access(base + (op.trans_b ? mn_major(b, k, n) : k_major(b, n, k)), 16, kind, op.pc);
}

/* this thread's share of D */
void execute(const spb_emu_wgmma_op &op)
{
    record_reads(op, 6);
    int t_in_block = thread_in_block(), w = (t_in_block / 32) % 4, lane = t_in_block % 32, g = lane / 4, t = lane % 4;
    desc_fields a = op.a_in_regs ? desc_fields{0, 0, 0, false} : decode(op.a_desc), b = decode(op.b_desc);
    for (int i = 0; i < op.n / 8; i++)
        for (int e = 0; e < 4; e++) {
            int row = g + (e >= 2 ? 8 : 0), m = 16 * w + row, col = 8 * i + 2 * t + (e & 1);
            float sum = 0.0f;
            for (int k = 0; k < 16; k++) {
                float av = op.a_in_regs ? spb_emu_a_fragment(op.a_regs, row, k, op.fp16) : smem_elem(k_major(a, m, k), op.fp16);
                float bv = smem_elem(op.trans_b ? mn_major(b, k, col) : k_major(b, col, k), op.fp16);
                sum += av * bv;
            }
            op.d[4 * i + e] = (op.accumulate ? op.d[4 * i + e] : 0.0f) + sum;
        }
}

/* the calling thread's warpgroup (threads 128 q .. 128 q + 127 of the
 * block) must be whole: other threads (a producer warp) may be in the
 * block as long as they issue no warpgroup instruction */
void check_warpgroups(void)
{
    if (spb_emu_compute_capability() != 90) refuse("the emulated device is not of compute capability 9.0");
    if ((unsigned)(thread_in_block() / 128 * 128 + 128) > blockDim.x * blockDim.y * blockDim.z)
        refuse("the calling thread's warpgroup is not whole (the block's threads end inside it)");
}

struct lane_issue {
    uint32_t a[4];
    uint64_t a_desc, b_desc;
    int n, accumulate;
};
} // namespace

void spb_emu_wgmma(int fp16, int n, float *d, const uint32_t *a, uint64_t a_desc, uint64_t b_desc, int accumulate,
                   int trans_b)
{
    check_warpgroups();
    if (n % 8 || n < 8 || n > 256) refuse("N outside 8..256 in steps of 8");
    spb_emu_wgmma_queue *q = spb_emu_thread_wgmma();
    if (q->need_fence) refuse("no wgmma.fence before the first wgmma of the thread or since its last wait_group");
    lane_issue mine, all[32];
    memset(&mine, 0, sizeof mine);
    if (a) memcpy(mine.a, a, sizeof mine.a);
    mine.a_desc = a_desc, mine.b_desc = b_desc, mine.n = n, mine.accumulate = accumulate != 0;
    static_assert(sizeof(lane_issue) <= 64, "a warp gather slot");
    spb_emu_warp_gather(0xffffffffu, &mine, sizeof mine, all, "wgmma.mma_async");
    for (int l = 0; l < 32; l++)
        if (all[l].a_desc != a_desc || all[l].b_desc != b_desc || all[l].n != n || all[l].accumulate != mine.accumulate)
            refuse("the lanes of a warp issued different descriptors, shapes or scale-d");
    spb_emu_wgmma_op op;
    op.d = d, op.n = n, op.fp16 = fp16, op.accumulate = mine.accumulate, op.trans_b = trans_b, op.a_in_regs = a != nullptr;
    for (int l = 0; l < 32; l++) memcpy(op.a_regs[l], all[l].a, sizeof op.a_regs[l]);
    op.a_desc = a_desc, op.b_desc = b_desc;
    op.pc = __builtin_return_address(0);
    if (!op.a_in_regs) check_k_slice(decode(a_desc)); /* a descriptor it cannot read is refused at issue */
    if (!trans_b) check_k_slice(decode(b_desc));
    decode(b_desc);
    record_reads(op, 5);
    q->ops.push_back(op);
}

void spb_emu_wgmma_fence(void)
{
    check_warpgroups();
    spb_emu_thread_wgmma()->need_fence = false;
    __syncwarp();
}

void spb_emu_wgmma_commit(void)
{
    spb_emu_wgmma_queue *q = spb_emu_thread_wgmma();
    q->group_end.push_back(q->ops.size());
    __syncwarp();
}

void spb_emu_wgmma_wait(int groups_left)
{
    spb_emu_wgmma_queue *q = spb_emu_thread_wgmma();
    if (groups_left < 0 || groups_left > 7) refuse("wait_group with a count outside 0..7");
    spb_emu_complete_groups(q->ops, q->group_end, groups_left, execute);
    q->need_fence = true;
    __syncwarp();
}

void spb_emu_fence_proxy_async(void) {}
