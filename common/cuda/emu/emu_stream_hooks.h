/* The stream-order checker's entry points (emu_streams.cc), in one place
 * for the emulator's files and the translated sources.  Declared weak: the
 * cuBLAS and NCCL stand-ins also build on their own, for their tests,
 * where the checker is absent (null) and nothing is tracked. */
#ifndef SPB_EMU_STREAM_HOOKS_H
#define SPB_EMU_STREAM_HOOKS_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include <initializer_list>

/* An operation issued on stream s, then what it touches (bytes 0: where an
 * operand starts, its extent unknown), then its end. */
void spb_emu_stream_op(cudaStream_t s, const char *what) __attribute__((weak));
void spb_emu_stream_access(const void *p, size_t bytes, int write) __attribute__((weak));
void spb_emu_stream_op_end(void) __attribute__((weak));

struct spb_emu_touch {
    const void *p; /* null: nothing */
    size_t bytes;
    int write;
};
/* One operation that runs at once here but, on a GPU, would run on stream
 * s touching `touches`: its place in the streams' order is checked. */
static inline void spb_emu_stream_track(cudaStream_t s, const char *what, std::initializer_list<spb_emu_touch> touches)
{
    if (!spb_emu_stream_op) return;
    spb_emu_stream_op(s, what);
    for (const spb_emu_touch &t : touches)
        if (t.p) spb_emu_stream_access(t.p, t.bytes, t.write);
    spb_emu_stream_op_end();
}

#endif
