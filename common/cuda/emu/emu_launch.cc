/* The CPU emulation's launches (spb_emu.h): blocks one after another, the
 * threads of a block as fibers on the calling OS thread (a stack switch of
 * six registers on x86-64; ucontext elsewhere, which costs a system call
 * per switch).
 *
 * A fiber runs until it reaches __syncthreads, a warp operation or its end.
 * The scheduler then runs the next fiber of its warp, and keeps running that
 * warp's fibers until they all wait at a __syncthreads (or have ended)
 * before it starts the next warp; passes over the block alternate
 * direction, and blocks run in a scrambled order, so that a missing barrier
 * (a read of shared memory another thread has not written yet, or a write
 * over what another has not read yet) and an order dependence between
 * blocks show up as wrong results instead of passing by luck.  A pass in
 * which no fiber gets further is a deadlock (a barrier some threads never
 * reach, an mbarrier phase that never completes): reported with the
 * kernel's name, never a hang.  A thread waiting on an mbarrier
 * (emu_tma.cc) yields as one at a __syncthreads does: the other warps run
 * on, and an arrival or a tensor copy's completion counts as progress.
 *
 * What a GPU refuses is refused here too, as a launch error that
 * cudaGetLastError returns: more than 1024 threads, a grid over its limits,
 * dynamic shared memory over 48 KiB without cudaFuncSetAttribute's opt-in
 * or over the opt-in limit. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>

/* A fiber's execution context.  x86-64: the stack pointer, the callee-saved
 * registers pushed on the stack it leaves (the System V ABI's: everything
 * else is the caller's to save).  A new stack is laid out as if its fiber had
 * switched away just before entering fiber_start. */
#if defined(__x86_64__) && !defined(SPB_EMU_UCONTEXT)
#define SPB_EMU_STACK_SWITCH 1
extern "C" void spb_emu_switch(void **save_sp, void *next_sp);
asm(".text\n"
    ".globl spb_emu_switch\n"
    ".type spb_emu_switch, @function\n"
    "spb_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size spb_emu_switch, .-spb_emu_switch\n");
struct context {
    void *sp;
    const void *stack_bottom = nullptr; /* for AddressSanitizer (below) */
    size_t stack_size = 0;
};
#else
struct context {
    ucontext_t uc;
    const void *stack_bottom = nullptr;
    size_t stack_size = 0;
};
#endif

/* Under AddressSanitizer (device memory is host memory, so it sees a kernel
 * read or write past an allocation) every switch is announced, so that it
 * follows the fibers' stacks. */
#if defined(__SANITIZE_ADDRESS__)
#define SPB_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPB_EMU_ASAN 1
#endif
#endif
#ifdef SPB_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#include <map>
#include <vector>

#include "emu_internal.h"
#include "spb_emu.h"

thread_local spb_emu_where *spb_emu_here = nullptr;

namespace {

const size_t kStackBytes = 256 << 10; /* a kernel's locals: D=128 rows of floats, fragments */
const size_t kDynamicShared = 228 << 10;

struct fiber {
    context ctx;
    char *stack = nullptr;
    spb_emu_where where;
    int warp = 0, lane = 0;
    bool done = false;
    const char *waiting = nullptr; /* what it waits in, for a deadlock report */
    spb_emu_copy_queue copies;     /* its cp.async copies in flight */
    spb_emu_wgmma_queue wgmma;     /* its wgmma operations in flight */
    spb_emu_bulk_queue bulk;       /* its bulk reductions in flight */
};

struct warp_state {
    int alive = 0, arrived = 0;
    unsigned long gen = 0;
    unsigned long lane_gen[32]; /* the generation each lane last arrived in */
    unsigned mask = 0;          /* the operation's lanes (all arrivals name the same) */
    const char *what = "";
    unsigned char slot[32][64]; /* each lane's deposit for a gather */
};

struct block_run {
    std::vector<fiber> fibers;
    int alive = 0, arrived = 0;
    unsigned long gen = 0;
    std::vector<warp_state> warps;
    const char *barrier_file = nullptr; /* where the threads waiting at the barrier called it */
    int barrier_line = 0;
    const std::function<void()> *body = nullptr;
    context sched;
    fiber *cur = nullptr;
    bool progress = false;
    const char *kernel = "?";
    size_t shared_bytes = 0; /* the launch's dynamic shared memory */
    unsigned long pass = 0;  /* the scheduler's passes over the block's warps so far */
    int delayed = 0;         /* threads waiting for a later pass (spb_emu_let_others_run): not a deadlock */
    struct named_barrier {
        int count = 0, arrived = 0;
        unsigned long gen = 0;
        spb_emu_clock arrivals, completed; /* the race check's clocks: this phase's, the last complete one's */
    } named[16]; /* bar.sync / bar.arrive id, count (id 0 is __syncthreads') */
};

block_run *run_now = nullptr; /* the launch in progress (one at a time) */
long blocks_run = 0;          /* every block of every launch so far */
std::vector<char *> stacks;   /* kept between launches */
alignas(256) unsigned char dynamic_shared[kDynamicShared];
std::map<const void *, int> max_dynamic_shared; /* cudaFuncSetAttribute's opt-ins */

/* Suspends the running context into *save and resumes *next; returns when
 * something switches back to *save. */
void switch_to(context *save, context *next)
{
#ifdef SPB_EMU_ASAN
    void *fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, next->stack_bottom, next->stack_size);
#endif
#ifdef SPB_EMU_STACK_SWITCH
    spb_emu_switch(&save->sp, next->sp);
#else
    swapcontext(&save->uc, &next->uc);
#endif
#ifdef SPB_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
}

void yield(fiber *f) { switch_to(&f->ctx, &run_now->sched); }

/* A warp operation is complete: every lane its mask names must have taken
 * part (not exited: a GPU leaves that undefined, and may hang). */
void complete_warp_op(block_run *r, int warp)
{
    warp_state &w = r->warps[warp];
    for (int l = 0; l < 32; l++)
        if ((w.mask >> l & 1u) && w.lane_gen[l] != w.gen) {
            fprintf(stderr,
                    "spbench CUDA emulation: kernel %s: %s with mask 0x%08x, but lane %d of warp %d did not take "
                    "part (exited or elsewhere)\n",
                    r->kernel, w.what, w.mask, l, warp);
            abort();
        }
    w.arrived = 0;
    w.gen++;
}

void release_if_complete(block_run *r)
{
    if (r->arrived > 0 && r->arrived == r->alive) {
        r->arrived = 0;
        r->gen++;
    }
    for (size_t w = 0; w < r->warps.size(); w++)
        if (r->warps[w].arrived > 0 && r->warps[w].arrived == r->warps[w].alive) complete_warp_op(r, (int)w);
}

void fiber_main()
{
    block_run *r = run_now;
    fiber *f = r->cur;
    (*r->body)();
    spb_emu_copies_finish(&f->copies);
    spb_emu_bulk_finish(&f->bulk);
    f->done = true;
    r->alive--;
    r->warps[f->warp].alive--;
    r->progress = true;
    release_if_complete(r); /* the others may wait for this thread alone */
}

/* A fiber's first instruction: its thread's body, then back to the
 * scheduler for good. */
void fiber_start()
{
#ifdef SPB_EMU_ASAN
    /* the stack we came from is the scheduler's */
    __sanitizer_finish_switch_fiber(nullptr, &run_now->sched.stack_bottom, &run_now->sched.stack_size);
#endif
    fiber_main();
#ifdef SPB_EMU_ASAN
    __sanitizer_start_switch_fiber(nullptr, run_now->sched.stack_bottom, run_now->sched.stack_size); /* for good */
#endif
#ifdef SPB_EMU_STACK_SWITCH
    fiber *f = run_now->cur;
    spb_emu_switch(&f->ctx.sp, run_now->sched.sp);
    abort(); /* a finished fiber is never resumed */
#endif
    /* ucontext: returning resumes uc_link, the scheduler */
}

void start_context(fiber &f, block_run &r)
{
    f.ctx.stack_bottom = f.stack;
    f.ctx.stack_size = kStackBytes;
#ifdef SPB_EMU_STACK_SWITCH
    (void)r;
    uintptr_t top = ((uintptr_t)f.stack + kStackBytes) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = nullptr;                    /* padding: the return slot 16-aligned, as after a call */
    *--sp = (void *)fiber_start;        /* where spb_emu_switch's ret goes */
    for (int i = 0; i < 6; i++) *--sp = nullptr; /* rbp rbx r12 r13 r14 r15 */
    f.ctx.sp = sp;
#else
    getcontext(&f.ctx.uc);
    f.ctx.uc.uc_stack.ss_sp = f.stack;
    f.ctx.uc.uc_stack.ss_size = kStackBytes;
    f.ctx.uc.uc_link = &r.sched.uc;
    makecontext(&f.ctx.uc, fiber_start, 0);
#endif
}

fiber *current(const char *what)
{
    if (!run_now || !run_now->cur) {
        fprintf(stderr, "spbench CUDA emulation: %s outside a kernel\n", what);
        abort();
    }
    return run_now->cur;
}

[[noreturn]] void deadlock(block_run *r)
{
    fprintf(stderr,
            "spbench CUDA emulation: deadlock in kernel %s, block (%u,%u,%u): no thread can go on "
            "(a barrier or warp operation that not every thread reaches, or an mbarrier phase that never "
            "completes)\n",
            r->kernel, r->fibers[0].where.block.x, r->fibers[0].where.block.y, r->fibers[0].where.block.z);
    int shown = 0;
    for (size_t i = 0; i < r->fibers.size() && shown < 8; i++)
        if (!r->fibers[i].done) {
            fprintf(stderr, "  thread %zu waits in %s\n", i, r->fibers[i].waiting ? r->fibers[i].waiting : "?");
            shown++;
        }
    abort();
}

/* The blocks' order: a stride coprime with their count, so each runs once. */
long block_stride(long total)
{
    long s = (long)(total * 0.618) | 1;
    while (s > 1) {
        long a = s, b = total;
        while (b) {
            long t = a % b;
            a = b;
            b = t;
        }
        if (a == 1) break;
        s += 2;
        if (s >= total) s = 1;
    }
    return s < 1 ? 1 : s;
}

} // namespace

/* ---- the primitives the kernels call ---------------------------------------- */
/* A GPU's barrier counts arrivals, wherever they come from: threads at two
 * different __syncthreads would release each other.  The programming guide
 * leaves that undefined; here it is an error. */
void spb_emu_syncthreads(const char *file, int line)
{
    fiber *f = current("__syncthreads");
    block_run *r = run_now;
    if (r->arrived == 0) {
        r->barrier_file = file;
        r->barrier_line = line;
    } else if (line != r->barrier_line || strcmp(file, r->barrier_file)) {
        fprintf(stderr,
                "spbench CUDA emulation: kernel %s: threads wait at two different __syncthreads (%s:%d and %s:%d: "
                "a divergent barrier) in block (%u,%u,%u)\n",
                r->kernel, r->barrier_file, r->barrier_line, file, line, f->where.block.x, f->where.block.y,
                f->where.block.z);
        abort();
    }
    unsigned long g = r->gen;
    r->progress = true;
    if (++r->arrived == r->alive) {
        r->arrived = 0;
        r->gen++;
        return;
    }
    f->waiting = "__syncthreads";
    while (r->gen == g) yield(f);
    f->waiting = nullptr;
}

/* Waits for the warp's running lanes (complete_warp_op checks the mask). */
static void warp_barrier(fiber *f, unsigned mask, const char *what)
{
    block_run *r = run_now;
    warp_state &w = r->warps[f->warp];
    unsigned long g = w.gen;
    w.lane_gen[f->lane] = g;
    w.mask = mask;
    w.what = what;
    r->progress = true;
    if (++w.arrived == w.alive) {
        complete_warp_op(r, f->warp);
        return;
    }
    f->waiting = what;
    while (w.gen == g) yield(f);
    f->waiting = nullptr;
}

/* The calling lane must be one the mask names (whether every named lane
 * takes part is complete_warp_op's check). */
static void check_mask(fiber *f, unsigned mask, const char *what)
{
    if (!(mask >> f->lane & 1u)) {
        fprintf(stderr, "spbench CUDA emulation: kernel %s: %s with mask 0x%08x called by lane %d, not in it\n",
                run_now->kernel, what, mask, f->lane);
        abort();
    }
}

void __syncwarp(unsigned mask)
{
    fiber *f = current("__syncwarp");
    check_mask(f, mask, "__syncwarp");
    warp_barrier(f, mask, "__syncwarp");
}

int spb_emu_lane(void) { return current("a warp operation")->lane; }

void spb_emu_warp_gather(unsigned mask, const void *mine, size_t bytes, void *all, const char *what)
{
    fiber *f = current(what);
    check_mask(f, mask, what);
    if (bytes > sizeof(warp_state::slot[0])) {
        fprintf(stderr, "spbench CUDA emulation: warp gather of %zu bytes\n", bytes);
        abort();
    }
    warp_state &w = run_now->warps[f->warp];
    memcpy(w.slot[f->lane], mine, bytes);
    warp_barrier(f, mask, what);
    for (int l = 0; l < 32; l++) memcpy((char *)all + l * bytes, w.slot[l], bytes);
    warp_barrier(f, mask, what); /* nobody deposits again before everyone has read */
}

uint64_t spb_emu_warp_exchange(unsigned mask, uint64_t mine, int src)
{
    uint64_t all[32];
    spb_emu_warp_gather(mask, &mine, sizeof mine, all, "a warp shuffle");
    return all[src & 31];
}

void *spb_emu_dynamic_shared(void) { return dynamic_shared; }

int spb_emu_in_dynamic_shared(const void *p, size_t bytes)
{
    const unsigned char *c = (const unsigned char *)p;
    return run_now && c >= dynamic_shared && c + bytes <= dynamic_shared + run_now->shared_bytes;
}

const char *spb_emu_kernel_name(void) { return run_now ? run_now->kernel : "(none)"; }

int spb_emu_sync_point_now(spb_emu_sync_point *s)
{
    if (!run_now || !run_now->cur) return 0;
    const fiber *f = run_now->cur;
    s->block_serial = blocks_run;
    s->thread = (int)(f - run_now->fibers.data());
    s->warp = f->warp;
    s->block_gen = run_now->gen;
    s->warp_gen = run_now->warps[(size_t)f->warp].gen;
    s->threads = (int)run_now->fibers.size();
    return 1;
}

void spb_emu_block_until(bool (*ready)(void *), void *arg, const char *what)
{
    fiber *f = current(what);
    if (ready(arg)) return;
    f->waiting = what;
    do
        yield(f);
    while (!ready(arg));
    f->waiting = nullptr;
    run_now->progress = true; /* this thread got past the wait */
}

/* bar.sync / bar.arrive: the barrier completes when `count` threads have
 * arrived, syncing or not; its arrivals must all name the same count. */
void spb_emu_named_barrier(int id, int count, int wait)
{
    fiber *f = current(wait ? "bar.sync" : "bar.arrive");
    block_run *r = run_now;
    const int threads = (int)r->fibers.size();
    if (id < 1 || id > 15 || count <= 0 || count % 32 || count > threads) {
        fprintf(stderr,
                "spbench CUDA emulation: kernel %s: %s %d, %d (ids 1..15 here, a thread count that is a positive "
                "multiple of 32 and at most the block's %d)\n",
                r->kernel, wait ? "bar.sync" : "bar.arrive", id, count, threads);
        abort();
    }
    block_run::named_barrier &b = r->named[id];
    if (b.arrived == 0) {
        b.count = count;
    } else if (b.count != count) {
        fprintf(stderr, "spbench CUDA emulation: kernel %s: named barrier %d awaited with counts %d and %d\n",
                r->kernel, id, b.count, count);
        abort();
    }
    r->progress = true;
    const unsigned long g = b.gen;
    spb_emu_race_release(&b.arrivals);
    if (++b.arrived == b.count) {
        b.arrived = 0;
        b.gen++;
        b.completed.swap(b.arrivals);
        b.arrivals.clear();
        if (wait) spb_emu_race_acquire(&b.completed);
        return;
    }
    if (!wait) return;
    f->waiting = "bar.sync (a named barrier)";
    while (b.gen == g) yield(f);
    f->waiting = nullptr;
    /* the next phase cannot complete before this thread arrives again */
    spb_emu_race_acquire(&b.completed);
}

/* The calling thread goes on only two passes of the scheduler later: one
 * whole pass (whichever its direction) in which every other warp runs as
 * far as it can first: what a GPU may do between two of this thread's
 * instructions (an mbarrier arrival and what follows it). */
static bool pass_moved_on(void *arg) { return run_now->pass >= *(const unsigned long *)arg + 2; }
void spb_emu_let_others_run(const char *what)
{
    (void)current(what);
    unsigned long now = run_now->pass;
    run_now->delayed++;
    spb_emu_block_until(pass_moved_on, &now, what);
    run_now->delayed--;
}

void spb_emu_note_progress(void)
{
    if (run_now) run_now->progress = true;
}

spb_emu_copy_queue *spb_emu_thread_copies(void) { return &current("cp.async")->copies; }
spb_emu_wgmma_queue *spb_emu_thread_wgmma(void) { return &current("wgmma")->wgmma; }
spb_emu_bulk_queue *spb_emu_thread_bulk(void) { return &current("cp.reduce.async.bulk")->bulk; }

/* ---- launches --------------------------------------------------------------- */
void spb_emu_set_max_dynamic_shared(const void *kernel, int bytes) { max_dynamic_shared[kernel] = bytes; }

/* Kernels launched so far: the kernel timeline's tests hold its intervals
 * against it (cuda_trace.cu). */
static long launch_count;
extern "C" long spb_emu_launch_count(void) { return launch_count; }

void spb_emu_run(const void *kernel, const char *name, const spb_emu_launch_config &c,
                 const std::function<void()> &body)
{
    launch_count++;
    long threads = (long)c.block.x * c.block.y * c.block.z;
    long blocks = (long)c.grid.x * c.grid.y * c.grid.z;
    if (threads < 1 || threads > 1024 || c.block.z > 64 || blocks < 1 || c.grid.y > 65535 || c.grid.z > 65535 ||
        c.grid.x > 2147483647u) {
        fprintf(stderr, "spbench CUDA emulation: kernel %s: grid (%u,%u,%u) of blocks (%u,%u,%u) is not launchable\n",
                name, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z);
        spb_emu_set_error(cudaErrorInvalidConfiguration);
        return;
    }
    if (c.shared > 48 * 1024) {
        auto it = max_dynamic_shared.find(kernel);
        int allowed = it == max_dynamic_shared.end() ? 48 * 1024 : it->second;
        if ((long)c.shared > allowed || c.shared > spb_emu_max_shared_optin()) {
            fprintf(stderr,
                    "spbench CUDA emulation: kernel %s: %zu bytes of dynamic shared memory, %d allowed "
                    "(cudaFuncSetAttribute) and %zu the device's opt-in limit\n",
                    name, c.shared, allowed, spb_emu_max_shared_optin());
            spb_emu_set_error(cudaErrorInvalidValue);
            return;
        }
    }
    if (run_now) {
        fprintf(stderr, "spbench CUDA emulation: kernel %s launched from inside kernel %s\n", name, run_now->kernel);
        abort();
    }
    block_run r;
    r.body = &body;
    r.kernel = name;
    r.shared_bytes = c.shared;
    r.fibers.resize(threads);
    r.warps.resize((threads + 31) / 32);
    while ((long)stacks.size() < threads) {
        void *s = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                       0);
        if (s == MAP_FAILED) {
            perror("spbench CUDA emulation: fiber stack");
            abort();
        }
        stacks.push_back((char *)s);
    }
    run_now = &r;
    spb_emu_race_launch();
    long stride = block_stride(blocks);
    for (long n = 0; n < blocks; n++) {
        long b = (n * stride) % blocks;
        uint3 bi = {(unsigned)(b % c.grid.x), (unsigned)(b / c.grid.x % c.grid.y),
                    (unsigned)(b / ((long)c.grid.x * c.grid.y))};
        /* shared memory starts as NaN bytes: a read of what nobody wrote shows */
        if (c.shared) memset(dynamic_shared, 0xff, c.shared);
        blocks_run++;
        r.alive = (int)threads;
        r.arrived = 0;
        for (size_t w = 0; w < r.warps.size(); w++) {
            r.warps[w].alive = (int)(threads - 32 * (long)w < 32 ? threads - 32 * (long)w : 32);
            r.warps[w].arrived = 0;
            for (int l = 0; l < 32; l++) r.warps[w].lane_gen[l] = ~0ul;
        }
        for (long t = 0; t < threads; t++) {
            fiber &f = r.fibers[t];
            f.where.thread = {(unsigned)(t % c.block.x), (unsigned)(t / c.block.x % c.block.y),
                              (unsigned)(t / ((long)c.block.x * c.block.y))};
            f.where.block = bi;
            f.where.block_dim = c.block;
            f.where.grid_dim = c.grid;
            f.warp = (int)(t / 32);
            f.lane = (int)(t % 32);
            f.done = false;
            f.waiting = nullptr;
            f.copies.copies.clear();
            f.copies.group_end.clear();
            f.copies.eager = n % 2 == 1; /* emu_async_copy.cc */
            f.wgmma = spb_emu_wgmma_queue();
            f.bulk = spb_emu_bulk_queue();
            f.bulk.eager = n % 2 == 1; /* emu_bulk_copy.cc */
            f.stack = stacks[t];
            start_context(f, r);
        }
        spb_emu_tma_block_begin(n % 2 == 1); /* emu_tma.cc */
        /* A pass takes the warps one at a time and runs each as far as it
         * gets (to a __syncthreads, or its end) before the next starts: the
         * most one warp can run ahead of another on a GPU, so that a race
         * between warps shows. */
        const long n_warps = (long)r.warps.size();
        for (int pass = 0; r.alive > 0; pass++) {
            r.pass = (unsigned long)pass;
            bool up = (pass + n) % 2 == 0, any = false;
            for (long wx = 0; wx < n_warps; wx++) {
                long w = up ? wx : n_warps - 1 - wx, first = 32 * w, count = threads - first < 32 ? threads - first : 32;
                do {
                    r.progress = false;
                    for (long x = 0; x < count; x++) {
                        fiber &f = r.fibers[first + (up ? x : count - 1 - x)];
                        if (f.done) continue;
                        r.cur = &f;
                        spb_emu_here = &f.where;
                        switch_to(&r.sched, &f.ctx);
                    }
                    any = any || r.progress;
                } while (r.progress);
            }
            r.cur = nullptr;
            spb_emu_here = nullptr;
            if (!any && r.alive > 0 && !r.delayed) deadlock(&r);
        }
        spb_emu_tma_block_end();
        for (int id = 1; id < 16; id++) {
            if (r.named[id].arrived) {
                fprintf(stderr,
                        "spbench CUDA emulation: kernel %s: the block ended with %d of %d arrivals at named barrier %d "
                        "(a bar.arrive no bar.sync took, or a bar.sync short of arrivals)\n",
                        name, r.named[id].arrived, r.named[id].count, id);
                abort();
            }
            r.named[id] = block_run::named_barrier();
        }
    }
    run_now = nullptr;
    spb_emu_count_launch();
}
