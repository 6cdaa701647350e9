/* Host-to-device uploads that do not wait for the device (cuda_memory.cu).
 * A cudaMemcpy from pageable host memory first waits for the stream's queued
 * work; in the step that stalls the host at every token-id or position
 * upload (the embedding's backward comes last in the backward, so its upload
 * waited for the whole backward).  spb_cuda_upload copies `host` into a
 * page-locked staging buffer at once (the caller may reuse `host` on return)
 * and queues the copy to `dst` on `stream`, ordered after the kernels queued
 * there before it, as the synchronous copy was.  Staging buffers are reused
 * once their copy is done (an event each). */
#ifndef SPB_CUDA_UPLOAD_H
#define SPB_CUDA_UPLOAD_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

void spb_cuda_upload(void *dst, const void *host, size_t bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
