/* cp.async for the CPU emulation (spb_emu.h): the PTX ISA's asynchronous
 * copy from global to shared memory, cp.async.cg with 16 bytes, its
 * zero fill (src-size), commit_group and wait_group.
 *
 * On a GPU a copy lands at some time between its issue and the wait_group
 * that covers its group.  Here it lands at one of the two ends, so that a
 * race shows as wrong numbers instead of passing by luck:
 *   - in the first block run, and every other one after it, at the latest
 *     moment: queued at issue, copied when a wait_group of the issuing
 *     thread covers its group (or when the thread ends).  A kernel that
 *     reads a tile before waiting for it, or reads another thread's copy
 *     without a __syncthreads after that thread's wait, sees the bytes that
 *     were there before (NaN, for fresh shared memory);
 *   - in the blocks between, at the earliest: copied at issue.  A kernel
 *     that starts filling a buffer before every thread is done reading it
 *     (a missing __syncthreads before the prefetch of a double buffer)
 *     overwrites what they read.
 * Copies a thread issued after its last commit_group belong to no group:
 * no wait_group covers them. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_internal.h"
#include "spb_emu.h"

namespace {
[[noreturn]] void refuse(const char *why, const void *dst, const void *src)
{
    fprintf(stderr, "spbench CUDA emulation: kernel %s: cp.async to %p from %p: %s\n", spb_emu_kernel_name(), dst,
            src, why);
    abort();
}

/* in the issuing thread: its write of shared memory lands now (race check:
 * kind 4) */
void complete(const spb_emu_copy &c)
{
    spb_emu_race_access(c.dst, 16, 4, c.pc);
    if (c.src_bytes) memcpy(c.dst, c.src, (size_t)c.src_bytes);
    memset((char *)c.dst + c.src_bytes, 0, 16 - (size_t)c.src_bytes);
}
} // namespace

void spb_emu_cp_async16(void *dst, const void *src, int src_bytes)
{
    if (src_bytes < 0 || src_bytes > 16) refuse("src-size outside 0..16", dst, src);
    if ((uintptr_t)dst % 16 || !spb_emu_in_dynamic_shared(dst, 16))
        refuse("the destination is not 16 aligned bytes of the launch's dynamic shared memory", dst, src);
    if (src_bytes && (uintptr_t)src % 16) refuse("the source is not 16-byte aligned", dst, src);
    const void *pc = __builtin_return_address(0);
    spb_emu_race_access(src, (size_t)src_bytes, 0, pc); /* another block's bytes? */
    spb_emu_copy_queue *q = spb_emu_thread_copies();
    if (q->eager) {
        complete(spb_emu_copy{dst, src, src_bytes, pc});
    } else {
        spb_emu_race_access(dst, 16, 3, pc); /* in flight until a wait: nobody may touch it */
        q->copies.push_back(spb_emu_copy{dst, src, src_bytes, pc});
    }
}

void spb_emu_cp_async_commit(void)
{
    spb_emu_copy_queue *q = spb_emu_thread_copies();
    q->group_end.push_back(q->copies.size());
}

void spb_emu_cp_async_wait(int groups_left)
{
    spb_emu_copy_queue *q = spb_emu_thread_copies();
    if (groups_left < 0) refuse("wait_group with a negative count", nullptr, nullptr);
    spb_emu_complete_groups(q->copies, q->group_end, groups_left, complete);
}

void spb_emu_copies_finish(spb_emu_copy_queue *q)
{
    for (const spb_emu_copy &c : q->copies) complete(c);
    q->copies.clear();
    q->group_end.clear();
}
