/* The step's scalars on the device (cuda_scalars.h). */
#define OMPI_SKIP_MPICXX 1 /* backend.h -> comm.h -> mpi.h: the C API only */
#define MPICH_SKIP_MPICXX 1
#include <math.h>

#include "cuda_scalars.h"
#include "cuda_trace.h"

extern "C" {
#include "backend.h" /* SPB_SCALAR_* */
}

namespace {

double *slots;        /* device: SPB_NUM_SCALARS accumulators */
float *grad_scale;    /* device: AdamW's scale while clipping on the device */
double *pinned;       /* host, page-locked: the slots' copies */
cudaEvent_t loss_ready;
int loss_published, clip_on, target = -1;

void ensure(void)
{
    if (slots) return;
    /* a few bytes, outside the tracked categories (no phase holds them) */
    SPB_CUDA_CHECK(cudaMalloc((void **)&slots, sizeof(double) * SPB_NUM_SCALARS));
    SPB_CUDA_CHECK(cudaMemset(slots, 0, sizeof(double) * SPB_NUM_SCALARS));
    SPB_CUDA_CHECK(cudaMalloc((void **)&grad_scale, sizeof(float)));
    SPB_CUDA_CHECK(cudaMallocHost((void **)&pinned, sizeof(double) * SPB_NUM_SCALARS));
    SPB_CUDA_CHECK(cudaEventCreateWithFlags(&loss_ready, cudaEventDisableTiming));
}

__global__ void k_add_ordered(double *slot, const double *part, long n)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double s = 0.0;
    for (long i = 0; i < n; i++) s += part[i];
    *slot += s;
}

/* train.c's clipping, the same double arithmetic: norm = sqrt(replicated +
 * split) / loss_scale; clip = clip_grad / norm where that is below 1. */
__global__ void k_clip_scale(float *scale, const double *sums, double clip_grad, double loss_scale)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double norm = sqrt(sums[SPB_SCALAR_SQ_REPLICATED] + sums[SPB_SCALAR_SQ_SPLIT]) / loss_scale;
    double clip = 1.0;
    if (clip_grad > 0 && norm > clip_grad) clip = clip_grad / norm;
    *scale = (float)(clip / loss_scale);
}

} // namespace

extern "C" void spb_cuda_scalar_defer(int slot)
{
    SPB_CHECK(slot >= -1 && slot < SPB_NUM_SCALARS);
    ensure();
    target = slot;
}

extern "C" int spb_cuda_scalar_target(void) { return target; }

extern "C" void spb_cuda_scalar_add_ordered(const double *part, long n, cudaStream_t stream)
{
    SPB_CHECK(target >= 0);
    SPB_KT_BEGIN(stream);
    k_add_ordered<<<1, 32, 0, stream>>>(slots + target, part, n);
    SPB_CUDA_CHECK(cudaGetLastError());
    SPB_KT_END();
    if (target == SPB_SCALAR_LOSS) {
        SPB_CUDA_CHECK(cudaMemcpyAsync(pinned + target, slots + target, sizeof(double), cudaMemcpyDeviceToHost,
                                       stream));
        SPB_CUDA_CHECK(cudaEventRecord(loss_ready, stream));
        loss_published = 1;
    }
}

extern "C" void spb_cuda_clip_on_device(double clip_grad, double loss_scale)
{
    ensure();
    SPB_KT_BEGIN(0);
    k_clip_scale<<<1, 32>>>(grad_scale, slots, clip_grad, loss_scale);
    SPB_CUDA_CHECK(cudaGetLastError());
    SPB_KT_END();
    clip_on = 1;
}

extern "C" const float *spb_cuda_device_grad_scale(void) { return clip_on ? grad_scale : nullptr; }

extern "C" void spb_cuda_scalars_take(int first, int n, double *out)
{
    SPB_CHECK(first >= 0 && n > 0 && first + n <= SPB_NUM_SCALARS);
    ensure();
    if (first == SPB_SCALAR_LOSS && n == 1 && loss_published) {
        /* copied when it was made: wait for that point, not for the backward queued since */
        SPB_CUDA_HOST_WAIT(cudaEventSynchronize(loss_ready));
        loss_published = 0;
    } else {
        SPB_CUDA_CHECK(cudaMemcpyAsync(pinned + first, slots + first, sizeof(double) * (size_t)n,
                                       cudaMemcpyDeviceToHost, 0));
        SPB_CUDA_HOST_WAIT(cudaStreamSynchronize(0));
    }
    for (int i = 0; i < n; i++) out[i] = pinned[first + i];
    /* zeroed behind everything queued: the next step's additions come after */
    SPB_CUDA_CHECK(cudaMemsetAsync(slots + first, 0, sizeof(double) * (size_t)n, 0));
    clip_on = 0;
}
