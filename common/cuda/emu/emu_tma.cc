/* The mbarrier and the tensor copy for the CPU emulation (tma_ptx.cuh), from
 * the PTX ISA's sections on mbarrier and cp.async.bulk.tensor, and the
 * driver's cuTensorMapEncodeTiled (cuda.h) that describes the copies:
 *   - mbarrier.init.shared::cta.b64 [bar], count: phase 0 running, count
 *     (1..2^20-1) arrivals pending, transaction count 0;
 *   - mbarrier.arrive (.expect_tx bytes): the transaction count goes up by
 *     `bytes` first, then one arrival; the phase completes when no arrival
 *     is pending and the transaction count is 0: the parity flips, the
 *     pending count starts again at `count`;
 *   - mbarrier.try_wait.parity (in a loop, as tma_ptx.cuh issues it): the
 *     thread goes on once the phase of that parity has completed, i.e.
 *     when the barrier's current parity differs from it (a fresh barrier's
 *     phase 0 is running: parity 1 passes at once, parity 0 waits);
 *   - cp.async.bulk.tensor.Nd.shared::cluster.global.tile
 *     .mbarrier::complete_tx::bytes [dst], [map, {coords}], [bar]: one box
 *     of the map, dim 0 fastest, packed densely at dst (zero where a
 *     coordinate lies outside the tensor), then the box's bytes (all of
 *     them, the zero fill included) completed on the barrier's transaction
 *     count.  With the map's 128-byte swizzle the byte at offset o of the
 *     dynamic shared memory goes to o ^ ((o >> 7) & 7) << 4 (the 16-byte
 *     chunk's index within its 128-byte row XORed with the row's index
 *     within its 1024-byte atom), and dst must be 1024-aligned.
 * A barrier's state is kept here, keyed by its offset in the launch's
 * dynamic shared memory, and starts afresh with every block.
 *
 * When a copy lands.  On a GPU the copy engine writes the box some time
 * between the issue and the phase completion a waiter sees.  Here it lands
 * at one end of that window, alternately by block as cp.async's copies do
 * (emu_async_copy.cc): at the issue (the global bytes read then), or at the
 * first wait of any thread on its barrier (read then: a consumer that reads
 * the tile before it waits sees the bytes that were there before; a
 * producer that refills a stage before its consumers are done, at issue,
 * overwrites what they read).  In the race-check build the landing is a
 * write by the copy engine (emu_race.cc: a race with a wgmma or bulk read
 * still in flight or a cp.async not landed over those bytes) and its
 * global reads are the block's reads (races between blocks).
 *
 * Refused (abort, with the kernel's name): a barrier that is not 8 aligned
 * bytes of the launch's dynamic shared memory or not initialised in this
 * block, an init count outside 1..2^20-1, an arrival when none is pending
 * (over-arrival: undefined in the ISA), a transaction count past 2^20-1,
 * a wait parity other than 0 or 1, a copy from something
 * cuTensorMapEncodeTiled did not write, of another rank, or to a
 * destination misaligned or outside the dynamic shared memory, and a block
 * that ends with a copy that never landed (no thread waited on its
 * barrier).  A barrier phase that never completes ends in the scheduler's
 * deadlock report.  cuTensorMapEncodeTiled returns CUDA_ERROR_INVALID_VALUE
 * (and says why on stderr) for what the driver's documentation forbids and
 * for what is not modelled: data types other than bf16, fp16 and fp32,
 * interleaved layouts, element strides other than 1, swizzles other than
 * none and 128 bytes (a 128-byte swizzle only with rows of 128 bytes), the
 * NaN out-of-bounds fill.  Not modelled: clusters and multicast, the async
 * proxy (fence.proxy.async is nothing here), mbarrier.try_wait's time
 * limit, tensor stores. */
#include <cuda.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <vector>

#include "emu_internal.h"
#include "spb_emu.h"

namespace {
const uint32_t kMagic = 0x54706253u;     /* "SbpT": written by cuTensorMapEncodeTiled here */
const long kMaxCount = (1l << 20) - 1;   /* the ISA's limit on arrival and transaction counts */

/* what cuTensorMapEncodeTiled keeps in the 128 opaque bytes of a CUtensorMap */
struct tensor_map {
    uint32_t magic, rank, elem, swizzle128;
    uint64_t addr;
    uint64_t dim[5], stride[5]; /* stride in bytes; stride[0] = elem */
    uint32_t box[5];
};
static_assert(sizeof(tensor_map) <= sizeof(CUtensorMap), "a tensor map's fields fit the opaque bytes");

struct tma_copy {
    tensor_map map;
    int coords[5];
    unsigned char *dst;
    const void *pc; /* where it was issued (race check) */
};
struct mbarrier {
    unsigned parity = 0, expected = 0, pending = 0;
    long tx = 0;
    std::vector<tma_copy> in_flight; /* copies that land at a wait on it (not eager blocks) */
    spb_emu_clock arrivals, completed[2]; /* the race check's: this phase's, the last complete one of each parity */
    char what[96] = "";              /* its wait, for the deadlock report */
};
std::map<size_t, mbarrier> barriers; /* this block's, by offset in the dynamic shared memory */
bool eager_now = false;              /* this block's copies land at issue */

[[noreturn]] __attribute__((format(printf, 1, 2))) void refuse(const char *fmt, ...)
{
    fprintf(stderr, "spbench CUDA emulation: kernel %s: ", spb_emu_kernel_name());
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

unsigned char *shared_base(void) { return (unsigned char *)spb_emu_dynamic_shared(); }

size_t offset_of(const uint64_t *bar, const char *op)
{
    if ((uintptr_t)bar % 8 || !spb_emu_in_dynamic_shared(bar, 8))
        refuse("%s on %p, which is not 8 aligned bytes of the launch's dynamic shared memory", op, (const void *)bar);
    return (size_t)((const unsigned char *)bar - shared_base());
}

mbarrier &find(const uint64_t *bar, const char *op)
{
    size_t off = offset_of(bar, op);
    auto it = barriers.find(off);
    if (it == barriers.end())
        refuse("%s on the mbarrier at byte %zu of the dynamic shared memory, which no mbarrier.init of this block "
               "initialised",
               op, off);
    return it->second;
}

void phase_check(mbarrier &b)
{
    if (b.pending == 0 && b.tx == 0) {
        b.completed[b.parity].swap(b.arrivals);
        b.arrivals.clear();
        b.parity ^= 1u;
        b.pending = b.expected;
    }
}

void arrive(mbarrier &b, size_t off, const char *op)
{
    if (b.pending == 0)
        refuse("%s on the mbarrier at byte %zu of the dynamic shared memory, whose phase has no arrival pending "
               "(more arrivals than its count, before the transactions completed)",
               op, off);
    spb_emu_race_release(&b.arrivals);
    b.pending--;
    phase_check(b);
    spb_emu_note_progress();
}

size_t box_bytes(const tensor_map &m)
{
    size_t n = m.elem;
    for (uint32_t i = 0; i < m.rank; i++) n *= m.box[i];
    return n;
}

size_t swizzled(size_t o, const tensor_map &m) { return m.swizzle128 ? o ^ ((o >> 7) & 7) << 4 : o; }

/* the copy engine's work: the box into shared memory, then its bytes
 * completed on the barrier */
void land(const tma_copy &c, mbarrier &b)
{
    const tensor_map &m = c.map;
    const size_t bytes = box_bytes(m), row = (size_t)m.box[0] * m.elem, rows = bytes / row;
    const size_t at = (size_t)(c.dst - shared_base());
    unsigned char *smem = shared_base();
    const unsigned char *g = (const unsigned char *)(uintptr_t)m.addr;
    spb_emu_race_access(c.dst, bytes, 7, c.pc); /* the swizzle permutes bytes within the box's rows */
    for (size_t r = 0; r < rows; r++) {
        bool inside = true;
        uint64_t src = 0;
        size_t rest = r;
        for (uint32_t i = 1; i < m.rank; i++) {
            long long x = (long long)c.coords[i] + (long long)(rest % m.box[i]);
            rest /= m.box[i];
            if (x < 0 || x >= (long long)m.dim[i])
                inside = false;
            else
                src += (uint64_t)x * m.stride[i];
        }
        long long lo = c.coords[0], hi = lo + m.box[0]; /* dim 0's elements, those inside: [lo, hi) */
        if (lo < 0) lo = 0;
        if (hi > (long long)m.dim[0]) hi = (long long)m.dim[0];
        if (inside && lo < hi) /* the block reads them (races between blocks) */
            spb_emu_race_access(g + src + (uint64_t)lo * m.elem, (size_t)(hi - lo) * m.elem, 0, c.pc);
        for (uint32_t e = 0; e < m.box[0]; e++) {
            long long x = (long long)c.coords[0] + e;
            unsigned char *to = smem + swizzled(at + r * row + (size_t)e * m.elem, m);
            if (inside && x >= lo && x < hi)
                memcpy(to, g + src + (uint64_t)x * m.elem, m.elem);
            else
                memset(to, 0, m.elem);
        }
    }
    b.tx -= (long)bytes;
    phase_check(b);
    spb_emu_note_progress();
}

void land_in_flight(mbarrier &b)
{
    if (b.in_flight.empty()) return;
    std::vector<tma_copy> copies;
    copies.swap(b.in_flight);
    for (const tma_copy &c : copies) land(c, b);
}

struct waiter {
    mbarrier *b;
    unsigned parity;
};
bool phase_done(void *arg)
{
    waiter *w = (waiter *)arg;
    land_in_flight(*w->b);
    return w->b->parity != w->parity;
}
} // namespace

/* ---- the block's barriers ------------------------------------------------- */
void spb_emu_tma_block_begin(bool eager)
{
    barriers.clear();
    eager_now = eager;
}

void spb_emu_tma_block_end(void)
{
    for (auto &kv : barriers)
        if (!kv.second.in_flight.empty())
            refuse("the block ended with a tensor copy that never completed (no thread waited on its mbarrier, at "
                   "byte %zu of the dynamic shared memory)",
                   kv.first);
    barriers.clear();
}

void spb_emu_mbarrier_init(uint64_t *bar, unsigned count)
{
    size_t off = offset_of(bar, "mbarrier.init");
    spb_emu_race_clocks_begin();
    if (count == 0 || count > kMaxCount) refuse("mbarrier.init with count %u, outside 1..2^20-1", count);
    mbarrier &b = barriers[off];
    if (!b.in_flight.empty()) refuse("mbarrier.init of the barrier at byte %zu with a tensor copy in flight", off);
    b.parity = 0, b.expected = b.pending = count, b.tx = 0;
    b.arrivals.clear(), b.completed[0].clear(), b.completed[1].clear();
    snprintf(b.what, sizeof b.what, "mbarrier wait (the barrier at byte %zu of the dynamic shared memory)", off);
    *bar = 0; /* the bytes are the barrier's: a GPU keeps its state there */
    spb_emu_note_progress();
}

void spb_emu_mbarrier_arrive(uint64_t *bar)
{
    mbarrier &b = find(bar, "mbarrier.arrive");
    arrive(b, offset_of(bar, "mbarrier.arrive"), "mbarrier.arrive");
    /* A consumer's arrival releases what it read: before it goes on, the
     * producer (every other warp) runs as far as it can, so that a release
     * ahead of the last read of the stage (a wgmma not yet waited for: its
     * operands are read at the wait here) gets the refilled bytes. */
    spb_emu_let_others_run("after mbarrier.arrive");
}

void spb_emu_mbarrier_arrive_expect_tx(uint64_t *bar, unsigned bytes)
{
    const char *op = "mbarrier.arrive.expect_tx";
    mbarrier &b = find(bar, op);
    if (b.tx + (long)bytes > kMaxCount) refuse("%s of %u bytes: the transaction count passes 2^20-1", op, bytes);
    b.tx += (long)bytes;
    arrive(b, offset_of(bar, op), op);
}

void spb_emu_mbarrier_wait(uint64_t *bar, unsigned parity)
{
    mbarrier &b = find(bar, "mbarrier.try_wait.parity");
    if (parity > 1) refuse("mbarrier.try_wait.parity with parity %u (0 or 1)", parity);
    waiter w{&b, parity};
    spb_emu_block_until(phase_done, &w, b.what);
    spb_emu_race_acquire(&b.completed[parity]);
}

void spb_emu_tma_load(void *dst, const void *map, const int *coords, int rank, uint64_t *bar)
{
    const char *op = "cp.async.bulk.tensor";
    const tensor_map *m = (const tensor_map *)map;
    if (!m || m->magic != kMagic) refuse("%s with a tensor map cuTensorMapEncodeTiled did not write", op);
    if (rank != (int)m->rank) refuse("%s.%dd with a tensor map of rank %u", op, rank, m->rank);
    mbarrier &b = find(bar, op);
    unsigned char *d = (unsigned char *)dst;
    const size_t bytes = box_bytes(*m), align = m->swizzle128 ? 1024 : 16;
    if (!spb_emu_in_dynamic_shared(d, bytes))
        refuse("%s of a %zu-byte box to %p, which is not inside the launch's dynamic shared memory", op, bytes, dst);
    if ((size_t)(d - shared_base()) % align)
        refuse("%s to byte %zu of the dynamic shared memory, which is not %zu-byte aligned (%s)", op,
               (size_t)(d - shared_base()), align, m->swizzle128 ? "the 128-byte swizzle's atom" : "16 bytes");
    tma_copy c;
    c.map = *m;
    for (int i = 0; i < 5; i++) c.coords[i] = i < rank ? coords[i] : 0;
    c.dst = d;
    c.pc = __builtin_return_address(0);
    if (eager_now) {
        land(c, b);
    } else {
        b.in_flight.push_back(c);
        spb_emu_note_progress();
    }
}

/* ---- the driver's tensor map ---------------------------------------------- */
namespace {
CUresult invalid(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
CUresult invalid(const char *fmt, ...)
{
    fprintf(stderr, "spbench CUDA emulation: cuTensorMapEncodeTiled: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    return CUDA_ERROR_INVALID_VALUE;
}
} // namespace

CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                        cuuint32_t tensorRank, void *globalAddress, const cuuint64_t *globalDim,
                                        const cuuint64_t *globalStrides, const cuuint32_t *boxDim,
                                        const cuuint32_t *elementStrides, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                        CUtensorMapFloatOOBfill oobFill)
{
    if (!tensorMap || (uintptr_t)tensorMap % 64) return invalid("the tensor map is not 64-byte aligned");
    tensor_map m;
    memset(&m, 0, sizeof m);
    m.magic = kMagic;
    if (tensorDataType == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 || tensorDataType == CU_TENSOR_MAP_DATA_TYPE_FLOAT16)
        m.elem = 2;
    else if (tensorDataType == CU_TENSOR_MAP_DATA_TYPE_FLOAT32)
        m.elem = 4;
    else
        return invalid("data type %d is not modelled (bf16, fp16 and fp32 are)", (int)tensorDataType);
    if (tensorRank < 1 || tensorRank > 5) return invalid("rank %u outside 1..5", tensorRank);
    m.rank = tensorRank;
    if (!globalAddress || (uintptr_t)globalAddress % 16) return invalid("the global address is not 16-byte aligned");
    m.addr = (uint64_t)(uintptr_t)globalAddress;
    if (!globalDim || !boxDim || !elementStrides || (tensorRank > 1 && !globalStrides))
        return invalid("a null array");
    for (uint32_t i = 0; i < tensorRank; i++) {
        if (globalDim[i] < 1 || globalDim[i] > (1ull << 32))
            return invalid("dimension %u is %llu, outside 1..2^32", i, (unsigned long long)globalDim[i]);
        m.dim[i] = globalDim[i];
        if (i > 0) {
            cuuint64_t s = globalStrides[i - 1];
            if (s % 16 || s >= (1ull << 40))
                return invalid("the stride of dimension %u is %llu bytes: not a multiple of 16 below 2^40", i,
                               (unsigned long long)s);
            m.stride[i] = s;
        }
        if (boxDim[i] < 1 || boxDim[i] > 256) return invalid("box dimension %u is %u, outside 1..256", i, boxDim[i]);
        m.box[i] = boxDim[i];
        if (elementStrides[i] < 1 || elementStrides[i] > 8)
            return invalid("element stride %u is %u, outside 1..8", i, elementStrides[i]);
        if (i > 0 && elementStrides[i] != 1)
            return invalid("element stride %u is %u: only 1 is modelled", i, elementStrides[i]);
    }
    m.stride[0] = m.elem;
    if (interleave != CU_TENSOR_MAP_INTERLEAVE_NONE) return invalid("interleaved layouts are not modelled");
    const uint32_t inner = boxDim[0] * m.elem;
    if (inner % 16) return invalid("the box's inner dimension is %u bytes, not a multiple of 16", inner);
    if (swizzle == CU_TENSOR_MAP_SWIZZLE_128B) {
        if (inner > 128) return invalid("the box's inner dimension is %u bytes, over the 128-byte swizzle", inner);
        if (inner != 128)
            return invalid("the 128-byte swizzle with a %u-byte inner box dimension is not modelled (128 is)", inner);
        m.swizzle128 = 1;
    } else if (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE) {
        return invalid("swizzle mode %d is not modelled (none and 128 bytes are)", (int)swizzle);
    }
    if ((int)l2Promotion < 0 || l2Promotion > CU_TENSOR_MAP_L2_PROMOTION_L2_256B)
        return invalid("L2 promotion %d is not one of CUtensorMapL2promotion's", (int)l2Promotion);
    if (oobFill != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        return invalid("the NaN out-of-bounds fill is not modelled (zero fill is)");
    memset(tensorMap, 0, sizeof *tensorMap);
    memcpy(tensorMap, &m, sizeof m);
    return CUDA_SUCCESS;
}

void *spb_emu_driver_entry_point(const char *symbol)
{
    if (symbol && !strcmp(symbol, "cuTensorMapEncodeTiled")) return (void *)&cuTensorMapEncodeTiled;
    return nullptr;
}
