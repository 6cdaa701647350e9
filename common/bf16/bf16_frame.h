/* The bf16 tables' view of their storage (common/bf16/device_handles.h): ranges
 * of handles read as fp32 and written back, bf16 elements rounded to
 * nearest even once per write; and a "frame", the fp32 copies one operation
 * works on.  Reads, writes and copies go through the registry's
 * spb_handle_storage, so they sit where the table computes (host memory for
 * cpu-bf16, device memory for cuda-bf16): "storage-side" below.  A frame takes every pointer argument of an operation
 * with the elements it touches, loads each handle's touched span once (so
 * arguments that share a buffer, like dQ/dK/dV in one dQKV buffer or GELU's
 * in-place backward, share one copy), points the arguments at the copies,
 * and after the fp32 computation writes back the spans of the handles it
 * wrote: their untouched elements go back unchanged (widening and
 * re-rounding a bf16 is exact), the outputs are rounded once. */
#ifndef SPB_BF16_FRAME_H
#define SPB_BF16_FRAME_H

#include "device_handles.h"

/* Storage of [i, i + n) of h as fp32 (bf16 widened exactly) into `out`
 * (storage-side: scratch or another handle's storage). */
void spb_bf16_read(const spb_handle *h, long i, long n, float *out);
/* fp32 values (storage-side) into [i, i + n) of h: bf16 elements rounded to
 * nearest even.
 * Masters bound to the range follow: an element whose bf16 value the write
 * changes takes the written fp32 value as its master; one it leaves as it
 * was keeps its master (bf16(master) = storage always holds). */
void spb_bf16_write(spb_handle *h, long i, long n, const float *in);
/* Staging's view, to and from HOST memory: as read, but elements with a
 * master give the master (the fp32 parameter: checkpoints and dumps carry
 * it); as write, but masters take the values given, exactly. */
void spb_bf16_read_masters(const spb_handle *h, long i, long n, float *host);
void spb_bf16_write_masters(spb_handle *h, long i, long n, const float *host);

/* Tests: round bf16 writes toward zero instead (a table that truncates). */
void spb_bf16_set_truncation_for_tests(int on);

enum { SPB_FRAME_MAX = 12 };
typedef struct spb_frame_span {
    spb_handle *h;
    long lo, hi;  /* elements [lo, hi) of h */
    float *copy;  /* their fp32 copy (in the frame's block) */
    int written;
} spb_frame_span;
typedef struct spb_frame {
    int num_spans, num_args;
    spb_frame_span span[SPB_FRAME_MAX];
    struct {
        void *where; /* the caller's pointer variable (float * or const float *) */
        int span;
        long index;
    } arg[SPB_FRAME_MAX];
    float *block; /* scratch holding every copy, while loaded */
} spb_frame;

/* Arguments: *p names len elements (strided arguments give their extent).
 * NULL pointers and len <= 0 are left alone.  out: the operation writes
 * them.  out_f32: an output that must stay fp32 (log-sum-exp, LayerNorm
 * statistics): its handle is retyped from *p to its end first.  `what`
 * names the operation in error messages. */
void spb_frame_in(spb_frame *f, const float **p, long len, const char *what);
void spb_frame_out(spb_frame *f, float **p, long len, const char *what);
void spb_frame_out_f32(spb_frame *f, float **p, long len, const char *what);
/* Loads the spans and points every argument at its copy. */
void spb_frame_load(spb_frame *f);
/* Writes back the spans with outputs, frees the copies' block. */
void spb_frame_store(spb_frame *f);

/* Elements spanned by `rows` rows of `width` at stride `ld` (0 when empty). */
static inline long spb_strided_extent(long rows, long ld, long width)
{
    return rows > 0 && width > 0 ? (rows - 1) * ld + width : 0;
}

/* The storage of len ints at p (an int handle), storage-side. */
const int *spb_bf16_ints(const int *p, long len, const char *what);
/* The embedding's lookups, for the extent of the tables they reach: n
 * tokens of int32 storage copied to host memory (malloc'd; the caller
 * frees it) with *reach one past the largest, and one past the largest
 * position rows r < min(rows, T) look up.  A negative index stops the run. */
int *spb_bf16_tokens_on_host(const int *stored, long n, long *reach);
/* The host copy spb_bf16_tokens_on_host reads instead of the device: kept
 * by the uploads of token ids (ints_to_device), dropped by any other writer
 * of those ints (staging). */
void spb_bf16_tokens_uploaded(const int *stored, const int *host, long n);
void spb_bf16_tokens_forget(const int *stored, long n);
long spb_positions_reach(const long *positions, int rows, int T);

#endif
