/* Stream ordering for the CPU emulation: a race detector.  Every operation
 * still runs when it is issued (the emulation's streams complete at once),
 * but each one is placed in the partial order a GPU guarantees, and two
 * operations that touch the same device bytes, at least one of them
 * writing, with no order between them, stop the program with both named.
 * So a missing cudaStreamWaitEvent between the compute stream and a
 * communication stream fails here, although the emulated run would have
 * read the right data.
 *
 * The order (CUDA's stream semantics), kept as one vector clock per stream
 * (a count of each stream's operations that this stream is known to come
 * after):
 *   - operations on one stream run in issue order;
 *   - cudaEventRecord takes the stream's clock; cudaStreamWaitEvent orders
 *     the stream after it;
 *   - the legacy default stream (0) and the blocking streams order each
 *     other (a stream created with cudaStreamNonBlocking does not);
 *   - what the host has waited for (cudaStreamSynchronize,
 *     cudaEventSynchronize, a successful query, cudaDeviceSynchronize, a
 *     synchronous copy, cudaFree) comes before everything it issues later.
 *
 * What an operation touches: copies and memsets their byte ranges, NCCL
 * its send and receive buffers, cuBLAS its D (written) and A, B, C (read),
 * a kernel each pointer argument into device memory (written unless it
 * points to const).  Kernels and cuBLAS give only where an operand starts,
 * so for them the first byte stands for the operand: a race on a part of a
 * buffer away from its start can go unseen, never a false one.  Accesses
 * are kept per allocation; the ones every stream is known to come after
 * are dropped. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <map>
#include <vector>

#include "emu_internal.h"

namespace {
typedef std::vector<unsigned long> vclock; /* per stream id: how many of its operations come before */

void join(vclock &a, const vclock &b)
{
    if (a.size() < b.size()) a.resize(b.size(), 0);
    for (size_t i = 0; i < b.size(); i++)
        if (b[i] > a[i]) a[i] = b[i];
}
unsigned long at(const vclock &c, int i) { return (size_t)i < c.size() ? c[(size_t)i] : 0; }

struct stream_state {
    int id;
    bool blocking;
    vclock clock;
};
struct access {
    int stream;
    unsigned long time;
    uintptr_t lo, hi;
    bool write;
    const char *what;
};
struct allocation {
    size_t bytes;
    std::vector<access> accesses;
};

std::map<cudaStream_t, stream_state> streams; /* stream 0, the legacy default, made on first use */
std::map<cudaEvent_t, vclock> events;
std::map<uintptr_t, allocation> allocations;
vclock host;     /* what the host has waited for */
int next_id = 0;
stream_state *current = nullptr; /* the operation being issued */
const char *current_what = "";

stream_state &stream(cudaStream_t s)
{
    if (streams.empty() && s != 0) stream(0); /* id 0 is the legacy default stream's */
    auto it = streams.find(s);
    if (it == streams.end()) {
        stream_state st{next_id++, true, vclock()};
        it = streams.emplace(s, st).first;
    }
    return it->second;
}

allocation *find_allocation(uintptr_t p, uintptr_t *base)
{
    auto it = allocations.upper_bound(p);
    if (it == allocations.begin()) return nullptr;
    --it;
    if (p >= it->first + it->second.bytes) return nullptr;
    *base = it->first;
    return &it->second;
}

/* "the default stream" or "stream 3" (ids in order of first use) */
const char *stream_name(int id, char *buf, size_t n)
{
    if (id == 0) return "the default stream";
    snprintf(buf, n, "stream %d", id);
    return buf;
}
} // namespace

void spb_emu_streams_alloc(const void *p, size_t bytes) { allocations[(uintptr_t)p] = allocation{bytes, {}}; }

void spb_emu_streams_free(const void *p)
{
    spb_emu_streams_host_waits_all(); /* cudaFree synchronises the device */
    allocations.erase((uintptr_t)p);
}

void spb_emu_streams_created(cudaStream_t s, int blocking)
{
    stream_state &st = stream(s);
    st.blocking = blocking != 0;
    join(st.clock, host);
}

/* Its id is not reused: events recorded on it keep its counts, and a new
 * stream at the same address starts afresh. */
void spb_emu_streams_destroyed(cudaStream_t s)
{
    if (s) streams.erase(s);
}

void spb_emu_stream_op(cudaStream_t s, const char *what)
{
    stream_state &st = stream(s);
    join(st.clock, host);
    /* the legacy default stream and the blocking streams wait for each other */
    if (st.id == 0) {
        for (auto &kv : streams)
            if (kv.second.blocking && kv.second.id != 0) join(st.clock, kv.second.clock);
    } else if (st.blocking) {
        join(st.clock, stream(0).clock);
    }
    if (st.clock.size() <= (size_t)st.id) st.clock.resize((size_t)st.id + 1, 0);
    st.clock[(size_t)st.id]++;
    current = &st;
    current_what = what;
}

void spb_emu_stream_access(const void *p, size_t bytes, int write)
{
    if (!current || !p) return;
    uintptr_t base, lo = (uintptr_t)p, hi = lo + (bytes ? bytes : 1);
    allocation *a = find_allocation(lo, &base);
    if (!a) return; /* host memory */
    const stream_state &st = *current;
    std::vector<access> kept;
    for (const access &x : a->accesses) {
        bool overlap = x.lo < hi && lo < x.hi;
        bool ordered = x.stream == st.id || at(st.clock, x.stream) >= x.time;
        if (overlap && (write || x.write) && !ordered) {
            char n1[32], n2[32];
            fprintf(stderr,
                    "spbench CUDA emulation: stream race on device memory %p (bytes %zu..%zu of an allocation of "
                    "%zu): %s %s it on %s, and %s, earlier on %s, %s it with no event wait or synchronisation "
                    "ordering the two (docs/EMULATION.md)\n",
                    p, (size_t)(lo - base), (size_t)(hi - base), a->bytes, current_what,
                    write ? "writes" : "reads", stream_name(st.id, n1, sizeof n1), x.what,
                    stream_name(x.stream, n2, sizeof n2),
                    x.write ? "wrote" : "read");
            abort();
        }
        /* what every stream comes after, and what this access covers on
         * its own stream, need not be kept */
        bool known = at(host, x.stream) >= x.time;
        bool covered = x.stream == st.id && lo <= x.lo && x.hi <= hi && (write || !x.write);
        if (!known && !covered) kept.push_back(x);
    }
    kept.push_back(access{st.id, st.clock[(size_t)st.id], lo, hi, write != 0, current_what});
    a->accesses.swap(kept);
}

void spb_emu_stream_op_end(void) { current = nullptr; }

void spb_emu_streams_record(cudaEvent_t e, cudaStream_t s)
{
    spb_emu_stream_op(s, "cudaEventRecord");
    events[e] = current->clock;
    current = nullptr;
}

void spb_emu_streams_wait(cudaStream_t s, cudaEvent_t e)
{
    auto it = events.find(e);
    if (it == events.end()) return; /* never recorded: no wait (CUDA's rule) */
    join(stream(s).clock, it->second);
}

void spb_emu_streams_host_waits_stream(cudaStream_t s) { join(host, stream(s).clock); }

void spb_emu_streams_host_waits_event(cudaEvent_t e)
{
    auto it = events.find(e);
    if (it != events.end()) join(host, it->second);
}

void spb_emu_streams_host_waits_all(void)
{
    for (auto &kv : streams) join(host, kv.second.clock);
}

void spb_emu_streams_event_destroyed(cudaEvent_t e) { events.erase(e); }
