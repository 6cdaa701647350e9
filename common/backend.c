/* Which device table a run uses (--device, --precision), and binding a rank to its device. */
#include <string.h>

#include "backend.h"
#include "checks.h"
#ifdef SPB_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

static const spb_backend *test_table;

void spb_backend_register_for_tests(const spb_backend *table) { test_table = table; }

const spb_backend *spb_backend_for(const char *device, const char *precision)
{
    if (test_table) return test_table;
    int fp32 = !precision[0] || !strcmp(precision, "fp32"), bf16 = !strcmp(precision, "bf16");
    int fp16 = !strcmp(precision, "fp16");
    if (!strcmp(device, "cpu"))
        return fp32 ? &spb_backend_cpu : bf16 ? &spb_backend_cpu_bf16 : fp16 ? &spb_backend_cpu_fp16 : NULL;
#ifdef SPB_HAVE_CUDA
    if (!strcmp(device, "cuda"))
        return fp32 ? &spb_backend_cuda : bf16 ? &spb_backend_cuda_bf16 : fp16 ? &spb_backend_cuda_fp16 : NULL;
#endif
    return NULL;
}

const spb_backend *spb_backend_by_name(const char *device) { return spb_backend_for(device, "fp32"); }

void spb_backend_to_host(const spb_backend *be, float *host, const float *dev, long n)
{
    if (be->host_memory)
        memcpy(host, dev, sizeof(float) * (size_t)n);
    else
        be->staging.to_host(host, dev, sizeof(float) * (size_t)n);
}

void spb_backend_to_device(const spb_backend *be, float *dev, const float *host, long n)
{
    if (be->host_memory)
        memcpy(dev, host, sizeof(float) * (size_t)n);
    else
        be->staging.to_device(dev, host, sizeof(float) * (size_t)n);
}

float *spb_backend_alloc(const spb_backend *be, spb_mem_category cat, long n, spb_buffer_role role)
{
    return be->alloc_role ? be->alloc_role(cat, n, role) : be->alloc(cat, n);
}

int spb_backend_available(const char *device)
{
#ifdef SPB_HAVE_CUDA
    if (!strcmp(device, "cuda")) return 1;
#endif
    return !strcmp(device, "cpu");
}

int spb_backend_open(const spb_backend *be, MPI_Comm world, int exclusive, char *err, size_t errlen)
{
    if (!be->open) return 0;
    /* The rank among those on its machine: devices are shared out by it. */
    MPI_Comm node;
    int local_rank = 0, local_size = 1;
    SPB_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    SPB_MPI_CHECK(MPI_Comm_rank(node, &local_rank));
    SPB_MPI_CHECK(MPI_Comm_size(node, &local_size));
    SPB_MPI_CHECK(MPI_Comm_free(&node));
    return be->open(local_rank, local_size, exclusive, err, errlen);
}
