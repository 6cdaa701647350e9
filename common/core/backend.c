/* Which device table a run uses (--device, --precision), and binding a rank to its device. */
#include <stdio.h>
#include <stdlib.h>
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

/* Two ranks of this machine that hold the same device, from every local
 * rank's identity ("" where its open failed): -1 with a message naming
 * them, the same on each rank of the machine. */
static int devices_distinct(const spb_backend *be, MPI_Comm node, int rc, char *err, size_t errlen)
{
    enum { ID_LEN = 96 };
    int local_size = 1;
    SPB_MPI_CHECK(MPI_Comm_size(node, &local_size));
    char mine[ID_LEN] = "";
    if (rc == 0) be->device_identity(mine, sizeof mine);
    char *all = malloc((size_t)local_size * ID_LEN);
    SPB_CHECK(all != NULL);
    SPB_MPI_CHECK(MPI_Allgather(mine, ID_LEN, MPI_CHAR, all, ID_LEN, MPI_CHAR, node));
    int clash = 0;
    for (int i = 0; i < local_size && !clash; i++)
        for (int j = i + 1; j < local_size && !clash; j++) {
            const char *a = all + (size_t)i * ID_LEN, *b = all + (size_t)j * ID_LEN;
            if (!a[0] || strncmp(a, b, ID_LEN)) continue;
            clash = 1;
            if (rc == 0)
                snprintf(err, errlen,
                         "--comm nccl: local ranks %d and %d of this machine are both bound to %.*s; NCCL needs a "
                         "GPU per rank (one rank per GPU on each machine, or a launcher that gives each rank its "
                         "own: docs/CLUSTER.md; --comm mpi lets ranks share a GPU)",
                         i, j, ID_LEN, a);
        }
    free(all);
    return clash ? -1 : rc;
}

int spb_backend_open(const spb_backend *be, MPI_Comm world, int exclusive, char *err, size_t errlen)
{
    if (!be->open) return 0;
    /* The rank among those on its machine: devices are shared out by it. */
    MPI_Comm node;
    int local_rank = 0;
    SPB_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    SPB_MPI_CHECK(MPI_Comm_rank(node, &local_rank));
    int rc = be->open(local_rank, err, errlen);
    if (exclusive && be->device_identity) rc = devices_distinct(be, node, rc, err, errlen);
    SPB_MPI_CHECK(MPI_Comm_free(&node));
    return rc;
}
