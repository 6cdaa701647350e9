/* The bulk reduction for the CPU emulation (spb_emu.h), from the PTX ISA's
 * sections on cp.reduce.async.bulk and the bulk async-groups:
 *   cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [dst], [src], size
 * adds `size` bytes of fp32 in the block's shared memory, element by
 * element, to global memory (both 16-byte aligned, size a multiple of 16);
 * cp.async.bulk.commit_group closes the thread's group of them;
 * cp.async.bulk.wait_group.read N waits until at most N of its groups may
 * still read their source, cp.async.bulk.wait_group N until at most N are
 * unfinished.
 *
 * On a GPU the engine reads the source some time between the issue and the
 * wait that covers it.  Here the whole operation happens at one end of
 * that window, alternately by block, as cp.async's copies do
 * (emu_async_copy.cc):
 *   - in the first block run and every other one, at the covering wait: a
 *     row overwritten before that wait (the next tile's values written over
 *     a row the engine has not read yet) is added twice, the first lost;
 *   - in the blocks between, at the issue: a row issued before every warp
 *     has written its part (no barrier between the writes and the issue)
 *     adds what was there before.
 * In the race-check build the source counts as read by the issuing thread
 * from the issue to the covering wait (a write in between is a race,
 * barrier or not) and the destination as updated atomically.  Refused: a
 * size or address the ISA does not allow, a source outside the launch's
 * dynamic shared memory, and a thread that ends with an operation it never
 * waited for (committed or not: its source is the block's shared memory).
 * Not modelled: the async proxy (fence.proxy.async is nothing here), the
 * order of the adds.  Also here: red.global.add.v2.f32, the 8-byte
 * reduction from registers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "emu_internal.h"
#include "spb_emu.h"

namespace {
[[noreturn]] void refuse(const char *why, const void *dst, const void *src)
{
    fprintf(stderr, "spbench CUDA emulation: kernel %s: cp.reduce.async.bulk to %p from %p: %s\n",
            spb_emu_kernel_name(), dst, src, why);
    abort();
}

/* the adds, by the issuing thread (the destination: atomic updates) */
void add(const spb_emu_bulk_op &op)
{
    spb_emu_race_access(op.dst, op.bytes, 2, op.pc);
    for (unsigned i = 0; i < op.bytes / 4; i++) op.dst[i] += op.src[i];
}
/* kind 6 (spb_emu_race_access): the asynchronous read of src is over */
void close_read(const spb_emu_bulk_op &op) { spb_emu_race_access(op.src, op.bytes, 6, op.pc); }
/* at the wait, in the blocks where the adds happen there */
void complete(const spb_emu_bulk_op &op)
{
    close_read(op);
    add(op);
}
} // namespace

/* red.global.add.v2.f32: atomic as the atomics of spb_emu.h are (one OS
 * thread runs every fiber, switched only at synchronisation points) */
void spb_emu_red_add_f32x2(float *p, float a, float b)
{
    if ((uintptr_t)p % 8) {
        fprintf(stderr, "spbench CUDA emulation: kernel %s: red.global.add.v2.f32 at %p, which is not 8-byte aligned\n",
                spb_emu_kernel_name(), (void *)p);
        abort();
    }
    spb_emu_race_access(p, 8, 2, __builtin_return_address(0));
    p[0] += a;
    p[1] += b;
}

void spb_emu_bulk_reduce_add_f32(float *dst, const float *src, unsigned bytes)
{
    if (bytes == 0 || bytes % 16) refuse("the size is not a positive multiple of 16 bytes", dst, src);
    if ((uintptr_t)dst % 16) refuse("the destination is not 16-byte aligned", dst, src);
    if ((uintptr_t)src % 16 || !spb_emu_in_dynamic_shared(src, bytes))
        refuse("the source is not 16-byte aligned bytes of the launch's dynamic shared memory", dst, src);
    const spb_emu_bulk_op op{dst, src, bytes, __builtin_return_address(0)};
    spb_emu_race_access(src, bytes, 5, op.pc); /* read until a wait covers it */
    spb_emu_bulk_queue *q = spb_emu_thread_bulk();
    if (q->eager) add(op); /* the race check's read stays open until the wait */
    q->ops.push_back(op);
}

void spb_emu_bulk_commit(void)
{
    spb_emu_bulk_queue *q = spb_emu_thread_bulk();
    q->group_end.push_back(q->ops.size());
}

void spb_emu_bulk_wait(int groups_left, int read_only)
{
    (void)read_only; /* the source read and the adds end together here */
    if (groups_left < 0) refuse("wait_group with a negative count", nullptr, nullptr);
    spb_emu_bulk_queue *q = spb_emu_thread_bulk();
    if (q->eager)
        spb_emu_complete_groups(q->ops, q->group_end, groups_left, close_read);
    else
        spb_emu_complete_groups(q->ops, q->group_end, groups_left, complete);
}

void spb_emu_bulk_finish(spb_emu_bulk_queue *q)
{
    if (!q->ops.empty())
        refuse("the thread ended with bulk reductions it never waited for (cp.async.bulk.wait_group)",
               q->ops.front().dst, q->ops.front().src);
}
