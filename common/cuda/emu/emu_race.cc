/* Races the emulation's order of execution would hide, for the CPU
 * emulation (SPB_EMU_RACECHECK builds; docs/EMULATION.md).
 *
 * On a GPU the blocks of a launch run in any order and at the same time;
 * the only ordering between them is what atomics give.  Here they run one
 * after another, so a kernel in which one block reads what another writes,
 * or two blocks write the same bytes, still computes something, and only a
 * wrong number (if any) would show it.  Inside a block, threads that touch
 * the same shared memory are ordered only by a __syncthreads (or, in one
 * warp, a warp operation); here the scheduler's order makes most missing
 * barriers give wrong numbers in some block, not all.
 *
 * This file sees every load and store of the translated sources (the
 * compiler's ThreadSanitizer instrumentation calls the __tsan_* entry
 * points at the end of this file instead of a sanitizer's runtime) and
 * keeps, per byte:
 *   - of device memory, which block of the running launch wrote it and
 *     which read it, and stops at the first byte two blocks touch, one of
 *     them writing, unless both used atomics;
 *   - of the launch's dynamic shared memory, which thread wrote it and
 *     which read it, with the block's and the warp's synchronisation counts
 *     at the time, and stops at two threads' accesses, one writing, with
 *     no synchronisation between them.
 * Bytes, not words: two blocks that write neighbouring bf16 values do not
 * race.  The report names the kernel, both blocks or threads, the byte and
 * both accesses' source lines (addr2line).  Static __shared__ arrays and a
 * thread's locals are not tracked; launches that follow one another are
 * ordered (stream order is emu_streams.cc's). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <string>
#include <vector>

#include "emu_internal.h"
#include "spb_emu.h"

#ifndef SPB_EMU_RACECHECK
/* Without the instrumentation only atomics and cp.async would report here:
 * nothing to check. */
void spb_emu_race_alloc(const void *, size_t) {}
void spb_emu_race_free(const void *) {}
void spb_emu_race_launch(void) {}
void spb_emu_race_access(const void *, size_t, int, const void *) {}
void spb_emu_race_release(spb_emu_clock *) {}
void spb_emu_race_acquire(const spb_emu_clock *) {}
void spb_emu_race_clocks_begin(void) {}
#else
namespace {
const int32_t kNone = -1;
const int32_t kMany = -2;       /* readers: two blocks or more */
const int32_t kAtomicMany = -3; /* atomics from two blocks or more */
/* an atomic writer, block b: -(b + 4) */
int32_t atomic_of(int32_t b) { return -(b + 4); }
bool is_atomic(int32_t w) { return w <= kAtomicMany; }

struct cell {
    uint32_t epoch;                /* the launch this byte was last touched in */
    int32_t writer;                /* block, atomic_of(block), kAtomicMany or kNone */
    int32_t reader;                /* block, kMany or kNone */
    uint32_t writer_pc, reader_pc; /* code offsets, for the report */
};
struct region {
    size_t bytes;
    std::vector<cell> shadow; /* made when a kernel first touches the allocation */
    uint32_t touched_epoch;   /* the last launch that touched it, and where: */
    size_t touched_lo, touched_hi;
};

std::map<uintptr_t, region> regions;
uintptr_t last_lo = 0, last_hi = 0; /* the allocation found last */
region *last = nullptr;
uint32_t epoch = 0;                                      /* the running launch's */
std::vector<std::pair<uintptr_t, region *>> touched_now; /* the allocations it has touched */
uintptr_t code_base = 0;

region *find(uintptr_t p, uintptr_t *lo)
{
    if (p >= last_lo && p < last_hi) {
        *lo = last_lo;
        return last;
    }
    auto it = regions.upper_bound(p);
    if (it == regions.begin()) return nullptr;
    --it;
    if (p >= it->first + it->second.bytes) return nullptr;
    last_lo = it->first;
    last_hi = it->first + it->second.bytes;
    last = &it->second;
    *lo = last_lo;
    return last;
}

int32_t running_block(void)
{
    const spb_emu_where *w = spb_emu_here;
    long b = (long)w->block.x + (long)w->grid_dim.x * ((long)w->block.y + (long)w->grid_dim.y * w->block.z);
    return (int32_t)b;
}

void block_name(int32_t b, char *buf, size_t n)
{
    const spb_emu_where *w = spb_emu_here;
    long gx = w->grid_dim.x, gy = w->grid_dim.y;
    snprintf(buf, n, "(%ld,%ld,%ld)", b % gx, b / gx % gy, b / (gx * gy));
}

/* "file.cu:123" for a code offset, through addr2line where it is installed;
 * "warp_ptx.cuh:50 < cuda_attention.cu:412" where it was inlined */
std::string source_line(uint32_t off)
{
    Dl_info info;
    char cmd[1024], line[512];
    if (!off || !dladdr((void *)(code_base + off), &info) || !info.dli_fname) return "?";
    snprintf(cmd, sizeof cmd, "addr2line -i -e '%s' 0x%lx 2>/dev/null", info.dli_fname,
             (unsigned long)(code_base + off - 1 - (uintptr_t)info.dli_fbase)); /* - 1: inside the call */
    std::string out;
    if (FILE *f = popen(cmd, "r")) {
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            if (char *extra = strstr(line, " (discriminator")) *extra = 0;
            const char *slash = strrchr(line, '/');
            out += (out.empty() ? "" : " < ") + std::string(slash ? slash + 1 : line);
        }
        pclose(f);
    }
    return out.empty() ? "?" : out;
}

/* kinds of access: spb_emu_race_access's 0-2, a cp.async's two ends, an
 * asynchronous read's (wgmma's operands, a bulk reduction's source: issue,
 * and the wait that covers it), and a tensor copy landing (emu_tma.cc) */
const int kCopyIssued = 3, kCopyLands = 4, kAsyncReadIssued = 5, kAsyncReadDone = 6, kTensorCopyLands = 7;
const char *kind_name(int kind)
{
    return kind == 0 || kind == kAsyncReadIssued || kind == kAsyncReadDone ? "reads"
           : kind == 2                                                    ? "atomically updates"
           : kind == kCopyIssued                                          ? "issues a cp.async to"
           : kind == kTensorCopyLands ? "has a tensor copy (the copy engine) write"
                                      : "writes";
}

[[noreturn]] void report(uintptr_t lo, const region &r, size_t byte, int kind, uint32_t pc, int32_t other,
                         const char *other_did, uint32_t other_pc)
{
    char me[64], them[64];
    int32_t b = running_block();
    block_name(b, me, sizeof me);
    if (other >= 0)
        block_name(other, them, sizeof them);
    else if (other == kMany || other == kAtomicMany)
        snprintf(them, sizeof them, "(several)");
    else
        block_name(-other - 4, them, sizeof them); /* atomic_of(block) */
    const spb_emu_where *w = spb_emu_here;
    fprintf(stderr,
            "spbench CUDA emulation: race between blocks in kernel %s: block %s thread (%u,%u,%u) %s byte %zu of a "
            "device allocation of %zu at %p (%s), which block %s %s earlier in the same launch (%s), with no "
            "atomics ordering the two (docs/EMULATION.md)\n",
            spb_emu_kernel_name(), me, w->thread.x, w->thread.y, w->thread.z, kind_name(kind), byte, r.bytes,
            (void *)lo, source_line(pc).c_str(), them, other_did, source_line(other_pc).c_str());
    abort();
}

/* ---- the launch's dynamic shared memory: races between a block's threads.
 * Two accesses of one byte by different threads, one writing (atomics
 * aside), are ordered only by a __syncthreads between them or, in one
 * warp, by a warp operation (__syncwarp, a shuffle, mma, ldmatrix). */
struct scell {
    long serial;                 /* the block this byte was last touched in */
    int32_t writer, writer_warp; /* thread, or kNone */
    uint32_t w_gen, w_wgen;      /* its block and warp generations */
    int32_t reader, reader_warp; /* thread, kMany or kNone; the readers' warp, or -1: several */
    uint32_t r_gen, r_wgen;      /* their block generation; the latest warp generation */
    uint32_t writer_pc, reader_pc;
    bool atomic;     /* the write was an atomic */
    int32_t pending; /* a thread whose cp.async to it has not landed, or kNone */
    uint32_t pending_pc;
    uint32_t async_reads; /* wgmma reads of it issued and not yet waited for */
    int32_t async_reader; /* the last one's thread (its warpgroup's first) */
    uint32_t async_pc;
    /* the barrier clocks' view (clocks_*): the writer's clock at the
     * write (0: none known), and the reads since the write or since a read
     * that came after all others: up to 4 (thread, clock), else in
     * many_reads; reads_unknown: one of them came before the clocks began */
    uint32_t w_clk;
    uint8_t n_reads;
    bool reads_in_map, reads_unknown;
    int32_t read_thread[4];
    uint32_t read_clk[4];
};
std::vector<scell> shared_shadow;

/* ---- the order mbarriers and named barriers give (spb_emu_race_release,
 * spb_emu_race_acquire): a vector clock per thread of the block, for the
 * blocks that use either (the others pay nothing); row t holds what thread
 * t has seen of each thread's clock.  An access u is ordered before thread
 * me's if me has seen u's clock at the access.  The clocks begin at the
 * block's first mbarrier.init (or arrival): accesses before that have
 * none.  Joined at arrivals and waits only: not at __syncthreads or warp
 * operations, which the generations above already order, so a chain that
 * mixes the two (a write, a warp operation, another lane's arrival) is
 * reported, never missed. */
long clocks_block = -1; /* the block_serial the clocks belong to */
int clock_threads = 0;
std::vector<uint32_t> clocks;                       /* clock_threads x clock_threads */
std::map<size_t, std::vector<uint32_t>> many_reads; /* a byte's reads beyond 4: clock per thread */

bool clocks_on(const spb_emu_sync_point &me) { return clocks_block == me.block_serial; }
uint32_t *clock_row(int thread) { return &clocks[(size_t)thread * (size_t)clock_threads]; }
uint32_t own_clock(const spb_emu_sync_point &me) { return clocks_on(me) ? clock_row(me.thread)[me.thread] : 0; }
void clocks_begin(const spb_emu_sync_point &me)
{
    if (clocks_on(me)) return;
    clocks_block = me.block_serial, clock_threads = me.threads;
    clocks.assign((size_t)clock_threads * (size_t)clock_threads, 0);
    for (int t = 0; t < clock_threads; t++) clock_row(t)[t] = 1;
    many_reads.clear();
}
bool clock_ordered(int32_t u, uint32_t u_clk, const spb_emu_sync_point &me)
{
    return u_clk != 0 && u >= 0 && clocks_on(me) && clock_row(me.thread)[u] >= u_clk;
}
bool reads_clock_ordered(const scell &c, size_t byte, const spb_emu_sync_point &me)
{
    if (c.reads_unknown || !clocks_on(me)) return false;
    const uint32_t *row = clock_row(me.thread);
    if (c.reads_in_map) {
        const std::vector<uint32_t> &v = many_reads[byte];
        for (int t = 0; t < clock_threads; t++)
            if (v[(size_t)t] > row[t]) return false;
        return true;
    }
    for (int j = 0; j < c.n_reads; j++)
        if (row[c.read_thread[j]] < c.read_clk[j]) return false;
    return true;
}
void forget_read_clocks(scell &c, size_t byte)
{
    if (c.reads_in_map) many_reads.erase(byte);
    c.n_reads = 0, c.reads_in_map = false, c.reads_unknown = false;
}
/* a read by me: after every recorded one (fresh) or beside them */
void note_read_clock(scell &c, size_t byte, bool fresh, const spb_emu_sync_point &me)
{
    if (fresh) forget_read_clocks(c, byte);
    const uint32_t clk = own_clock(me);
    if (!clk) {
        c.reads_unknown = true;
        return;
    }
    if (c.reads_in_map) {
        uint32_t &v = many_reads[byte][(size_t)me.thread];
        v = v > clk ? v : clk;
        return;
    }
    for (int j = 0; j < c.n_reads; j++)
        if (c.read_thread[j] == me.thread) {
            c.read_clk[j] = clk;
            return;
        }
    if (c.n_reads < 4) {
        c.read_thread[c.n_reads] = me.thread, c.read_clk[c.n_reads] = clk, c.n_reads++;
        return;
    }
    std::vector<uint32_t> &v = many_reads[byte];
    v.assign((size_t)clock_threads, 0);
    for (int j = 0; j < 4; j++) v[(size_t)c.read_thread[j]] = c.read_clk[j];
    v[(size_t)me.thread] = clk;
    c.reads_in_map = true;
}

bool ordered(int32_t u, int32_t u_warp, uint32_t u_gen, uint32_t u_wgen, const spb_emu_sync_point &me)
{
    return u == me.thread || u_gen != (uint32_t)me.block_gen || (u_warp == me.warp && u_wgen != (uint32_t)me.warp_gen);
}

/* The first half of every report of a race in shared memory: who touched
 * which byte where ("thread 3 (warp 0) writes byte 96 ... (file:line), ");
 * the caller says with what it races, then aborts. */
void shared_race_begins(size_t byte, int kind, uint32_t pc, const spb_emu_sync_point &me)
{
    const spb_emu_where *w = spb_emu_here;
    fprintf(stderr,
            "spbench CUDA emulation: race in shared memory in kernel %s, block (%u,%u,%u): thread %d (warp %d) %s "
            "byte %zu of the dynamic shared memory (%s), ",
            spb_emu_kernel_name(), w->block.x, w->block.y, w->block.z, me.thread, me.warp, kind_name(kind), byte,
            source_line(pc).c_str());
}

[[noreturn]] void report_shared(size_t byte, int kind, uint32_t pc, const spb_emu_sync_point &me, int32_t other,
                                const char *other_did, uint32_t other_pc)
{
    char them[48];
    if (other >= 0)
        snprintf(them, sizeof them, "thread %d", other);
    else
        snprintf(them, sizeof them, "other threads");
    shared_race_begins(byte, kind, pc, me);
    fprintf(stderr,
            "which %s %s earlier with no __syncthreads between (nor, in one warp, a warp operation) (%s) "
            "(docs/EMULATION.md)\n",
            them, other_did, source_line(other_pc).c_str());
    abort();
}

[[noreturn]] void report_pending(size_t byte, int kind, uint32_t pc, const spb_emu_sync_point &me, int32_t issuer,
                                 uint32_t issued_pc)
{
    shared_race_begins(byte, kind, pc, me);
    fprintf(stderr,
            "the destination of thread %d's cp.async (%s), which has not landed: no cp.async.wait_group of that "
            "thread covers it yet (docs/EMULATION.md)\n",
            issuer, source_line(issued_pc).c_str());
    abort();
}

[[noreturn]] void report_async_read(size_t byte, int kind, uint32_t pc, const spb_emu_sync_point &me,
                                    const scell &c)
{
    shared_race_begins(byte, kind, pc, me);
    fprintf(stderr,
            "read asynchronously (a wgmma operand, issued by the warpgroup of thread %d, or a bulk copy's source, "
            "by that thread; %s) and no wait_group has covered that read yet: the tensor cores or the copy engine "
            "may still read it (docs/EMULATION.md)\n",
            c.async_reader, source_line(c.async_pc).c_str());
    abort();
}

void touch_shared(size_t first, size_t n, int kind, uint32_t pc)
{
    spb_emu_sync_point me;
    if (!spb_emu_sync_point_now(&me)) return;
    if (shared_shadow.empty()) shared_shadow.assign(spb_emu_max_shared_optin() + 1024, scell{});
    const uint32_t gen = (uint32_t)me.block_gen, wgen = (uint32_t)me.warp_gen;
    for (size_t i = first; i < first + n && i < shared_shadow.size(); i++) {
        scell &c = shared_shadow[i];
        if (c.serial != me.block_serial) {
            c = scell{};
            c.serial = me.block_serial, c.writer = c.reader = c.pending = c.async_reader = kNone;
        }
        int k = kind;
        if (k == kAsyncReadIssued) {
            c.async_reads++, c.async_reader = me.thread, c.async_pc = pc;
            k = 0;
        } else if (k == kAsyncReadDone) {
            if (c.async_reads) c.async_reads--;
            k = 0;
        } else if (k != 0 && c.async_reads) {
            report_async_read(i, k, pc, me, c);
        }
        if (k == kCopyLands) {
            c.pending = kNone;
            k = 1;
        } else if (c.pending != kNone) {
            report_pending(i, k, pc, me, c.pending, c.pending_pc);
        }
        /* A tensor copy lands (the copy engine writes): a race with an
         * asynchronous read or a cp.async still in flight (above), but no
         * writer is recorded and no thread's access is checked against it:
         * what orders it is an mbarrier (the producer's wait on the "empty"
         * barrier the consumers arrived on, the consumers' wait on the
         * "full" one the copy completes), which the generations of
         * __syncthreads and warp operations cannot see.  The bytes start
         * afresh: no writer, no readers. */
        if (k == kTensorCopyLands) {
            c.writer = c.reader = kNone;
            c.w_clk = 0;
            forget_read_clocks(c, i);
            continue;
        }
        if (k == kCopyIssued) { /* checked as the write it will be, where it is issued */
            c.pending = me.thread, c.pending_pc = pc;
            k = 1;
        }
        if (c.writer != kNone && !ordered(c.writer, c.writer_warp, c.w_gen, c.w_wgen, me) && !(k == 2 && c.atomic) &&
            !clock_ordered(c.writer, c.w_clk, me))
            report_shared(i, k, pc, me, c.writer, c.atomic ? "atomically updated" : "wrote", c.writer_pc);
        /* the earlier readers, all ordered before this access? */
        bool readers_before = c.reader == kNone || c.r_gen != gen ||
                              (c.reader >= 0 && ordered(c.reader, c.reader_warp, c.r_gen, c.r_wgen, me)) ||
                              (c.reader == kMany && c.reader_warp == me.warp && c.r_wgen != wgen) ||
                              reads_clock_ordered(c, i, me);
        if (k == 0) {
            if (readers_before)
                c.reader = me.thread, c.reader_warp = me.warp, c.r_gen = gen, c.r_wgen = wgen, c.reader_pc = pc;
            else if (c.reader != me.thread)
                c.reader_warp = c.reader_warp == me.warp ? me.warp : -1, c.reader = kMany, c.r_wgen = wgen;
            note_read_clock(c, i, readers_before, me);
            continue;
        }
        if (!readers_before) report_shared(i, k, pc, me, c.reader, "read", c.reader_pc);
        c.writer = me.thread, c.writer_warp = me.warp, c.w_gen = gen, c.w_wgen = wgen, c.writer_pc = pc;
        c.w_clk = own_clock(me);
        c.atomic = k == 2;
        c.reader = kNone; /* every earlier read comes before this write */
        forget_read_clocks(c, i);
    }
}

/* ---- device memory: races between the blocks of a launch ---------------- */
void touch_device(region *r, uintptr_t lo, size_t first, size_t n, int kind, uint32_t pc)
{
    const int32_t b = running_block();
    size_t end = first + n;
    if (end > r->bytes) end = r->bytes; /* past its end: the ASan build's business */
    if (r->shadow.empty()) r->shadow.assign(r->bytes, cell{0, kNone, kNone, 0, 0});
    if (r->touched_epoch != epoch) {
        r->touched_epoch = epoch, r->touched_lo = first, r->touched_hi = end;
        touched_now.push_back({lo, r});
    } else {
        if (first < r->touched_lo) r->touched_lo = first;
        if (end > r->touched_hi) r->touched_hi = end;
    }
    for (size_t i = first; i < end; i++) {
        cell &c = r->shadow[i];
        if (c.epoch != epoch) c = cell{epoch, kNone, kNone, 0, 0};
        const bool other_wrote = c.writer != kNone && c.writer != b && c.writer != atomic_of(b);
        const bool other_read = c.reader != kNone && c.reader != b;
        const char *wrote = is_atomic(c.writer) ? "atomically updated" : "wrote";
        if (kind == 0) { /* read */
            if (other_wrote) report(lo, *r, i, kind, pc, c.writer, wrote, c.writer_pc);
            if (c.reader == kNone)
                c.reader = b, c.reader_pc = pc;
            else if (c.reader != b)
                c.reader = kMany;
        } else if (kind == 1) { /* write */
            if (other_wrote) report(lo, *r, i, kind, pc, c.writer, wrote, c.writer_pc);
            if (other_read) report(lo, *r, i, kind, pc, c.reader, "read", c.reader_pc);
            c.writer = b, c.writer_pc = pc;
        } else { /* atomic: ordered with other atomics, not with plain accesses */
            if (c.writer >= 0 && c.writer != b) report(lo, *r, i, kind, pc, c.writer, "wrote", c.writer_pc);
            if (other_read) report(lo, *r, i, kind, pc, c.reader, "read", c.reader_pc);
            if (c.writer == kNone || c.writer == atomic_of(b))
                c.writer = atomic_of(b);
            else if (c.writer != b) /* a plain write of its own stays one */
                c.writer = kAtomicMany;
            c.writer_pc = pc;
        }
    }
}

void touch(const void *p, size_t n, int kind, const void *caller)
{
    if (!spb_emu_here || !n) return; /* host code, or between a launch's blocks */
    if (!code_base) {
        Dl_info info;
        code_base = dladdr(caller, &info) ? (uintptr_t)info.dli_fbase : 1;
    }
    const uint32_t pc = (uint32_t)((uintptr_t)caller - code_base);
    uintptr_t lo;
    if (region *r = find((uintptr_t)p, &lo))
        touch_device(r, lo, (uintptr_t)p - lo, n, kind >= kAsyncReadIssued ? 0 : kind, pc); /* 7: not here */
    else if (spb_emu_in_dynamic_shared(p, 1))
        touch_shared((size_t)((const char *)p - (const char *)spb_emu_dynamic_shared()), n, kind, pc);
    /* else a thread's locals, static shared memory */
}
} // namespace

void spb_emu_race_alloc(const void *p, size_t bytes)
{
    regions[(uintptr_t)p] = region{bytes, {}, 0, 0, 0};
    last_lo = last_hi = 0;
}

void spb_emu_race_free(const void *p)
{
    regions.erase((uintptr_t)p);
    last_lo = last_hi = 0;
    last = nullptr;
}

void spb_emu_race_launch(void)
{
    epoch++;
    touched_now.clear();
}

/* The launch just run, as the stream-order checker's operation: the byte
 * ranges it wrote (or updated atomically) and those it only read, exactly,
 * where without this build's instrumentation only its pointer arguments'
 * first bytes are known. */
void spb_emu_race_stream_accesses(void)
{
    for (const auto &t : touched_now) {
        const region &r = *t.second;
        size_t i = r.touched_lo;
        while (i < r.touched_hi) {
            const cell &c = r.shadow[i];
            if (c.epoch != epoch) {
                i++;
                continue;
            }
            bool wrote = c.writer != kNone;
            size_t j = i + 1;
            while (j < r.touched_hi && r.shadow[j].epoch == epoch && (r.shadow[j].writer != kNone) == wrote)
                j++;
            spb_emu_stream_access((const void *)(t.first + i), j - i, wrote);
            i = j;
        }
    }
}

void spb_emu_race_access(const void *p, size_t bytes, int kind, const void *pc)
{
    touch(p, bytes, kind, pc ? pc : __builtin_return_address(0));
}

void spb_emu_race_clocks_begin(void)
{
    spb_emu_sync_point me;
    if (spb_emu_sync_point_now(&me)) clocks_begin(me);
}

void spb_emu_race_release(spb_emu_clock *phase)
{
    spb_emu_sync_point me;
    if (!spb_emu_sync_point_now(&me)) return;
    clocks_begin(me);
    uint32_t *row = clock_row(me.thread);
    if (phase->size() != (size_t)clock_threads) phase->assign((size_t)clock_threads, 0);
    for (int t = 0; t < clock_threads; t++)
        if ((*phase)[(size_t)t] < row[t]) (*phase)[(size_t)t] = row[t];
    row[me.thread]++; /* what this thread does next is not released yet */
}

void spb_emu_race_acquire(const spb_emu_clock *phase)
{
    spb_emu_sync_point me;
    if (!spb_emu_sync_point_now(&me) || phase->empty()) return;
    clocks_begin(me);
    if (phase->size() != (size_t)clock_threads) return; /* another block's (a barrier never re-initialised) */
    uint32_t *row = clock_row(me.thread);
    for (int t = 0; t < clock_threads; t++)
        if (row[t] < (*phase)[(size_t)t]) row[t] = (*phase)[(size_t)t];
}

/* The instrumentation's entry points: gcc -fsanitize=thread's calls
 * (cmake/cuda_emu.cmake), answered here instead of by ThreadSanitizer's
 * runtime.  Its instrumentation, unlike AddressSanitizer's, keeps a store
 * to an address it has just seen loaded (x += y is two accesses). */
#define SPB_EMU_RACE_SIZED(n)                                                                                          \
    extern "C" void __tsan_read##n(void *p) { touch(p, n, 0, __builtin_return_address(0)); }                          \
    extern "C" void __tsan_write##n(void *p) { touch(p, n, 1, __builtin_return_address(0)); }                         \
    extern "C" void __tsan_unaligned_read##n(void *p) { touch(p, n, 0, __builtin_return_address(0)); }                \
    extern "C" void __tsan_unaligned_write##n(void *p) { touch(p, n, 1, __builtin_return_address(0)); }
SPB_EMU_RACE_SIZED(1)
SPB_EMU_RACE_SIZED(2)
SPB_EMU_RACE_SIZED(4)
SPB_EMU_RACE_SIZED(8)
SPB_EMU_RACE_SIZED(16)
extern "C" void __tsan_read_range(void *p, size_t n) { touch(p, n, 0, __builtin_return_address(0)); }
extern "C" void __tsan_write_range(void *p, size_t n) { touch(p, n, 1, __builtin_return_address(0)); }
/* a function-local static's guard (the translated sources' only atomics) */
extern "C" char __tsan_atomic8_load(const volatile char *a, int) { return __atomic_load_n(a, __ATOMIC_ACQUIRE); }
extern "C" void __tsan_init(void) {}
extern "C" void __tsan_func_entry(void *) {}
extern "C" void __tsan_func_exit(void) {}
#endif
