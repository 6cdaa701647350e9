/* Every device table this build has carries every entry the core calls
 * (no GPU needed: the tables are plain structs of function pointers, so a
 * CUDA table missing an entry is caught here, not as a NULL call on the
 * first GPU run).  The list below is the core's side of backend.h: an entry
 * added there is added here, for every table. */
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "bf16_direct.h"
#ifdef SPB_HAVE_CUDA
#include "cuda/cuda_backend.h"
#include "cuda/cuda_bf16_storage.h"
#endif

static int failures;

static void expect(int ok, const char *table, const char *entry)
{
    if (ok) return;
    printf("FAIL %s: entry %s is missing\n", table, entry);
    failures++;
}

#define NEED(t, entry) expect((t)->entry != NULL, (t)->name, #entry)

static void check_table(const spb_backend *t, int device)
{
    NEED(t, alloc), NEED(t, alloc_ints), NEED(t, free), NEED(t, zero), NEED(t, copy), NEED(t, copy_rows);
    NEED(t, fill), NEED(t, ints_to_device), NEED(t, matmul_forward), NEED(t, matmul_backward);
    NEED(t, matmul_forward_ld), NEED(t, matmul_backward_ld), NEED(t, layernorm_forward), NEED(t, layernorm_backward);
    NEED(t, gelu_forward), NEED(t, gelu_backward), NEED(t, embedding_forward), NEED(t, embedding_backward);
    NEED(t, softmax_xent_forward), NEED(t, softmax_xent_backward), NEED(t, add_inplace), NEED(t, add_bias_rows);
    NEED(t, bias_grad_rows), NEED(t, adamw_apply), NEED(t, sum_squares), NEED(t, attn_merge), NEED(t, attention);
    NEED(t, mem_stats), NEED(t, mem_reset_peaks);
    /* Collectives on its buffers copy through host memory unless they are host memory. */
    if (!t->host_memory) {
        expect(t->staging.to_host != NULL, t->name, "staging.to_host");
        expect(t->staging.to_device != NULL, t->name, "staging.to_device");
    }
    /* A real device: bound per rank, waited for at the step end, timed on its stream, read by its driver. */
    if (device) {
        NEED(t, open), NEED(t, synchronize), NEED(t, clock), NEED(t, device_used_bytes);
        expect(t->staging.synchronize != NULL, t->name, "staging.synchronize");
        if (t->clock) {
            expect(t->clock->mark && t->clock->elapsed && t->clock->release, t->name, "clock's functions");
        }
    }
    /* --attention flash and naive (the defaults the options accept). */
    static const char *kernels[] = {"flash", "naive"};
    for (int k = 0; k < 2 && t->attention; k++) {
        const spb_attn_backend *a = t->attention(kernels[k]);
        expect(a && a->forward && a->backward, t->name, kernels[k]);
    }
    if (t->attention) expect(t->attention("no-such-kernel") == NULL, t->name, "attention(unknown) == NULL");
}

/* The bf16 tables' direct kernels (--bf16-kernels fast). */
static void check_direct(const spb_bf16_direct *d)
{
    expect(d->gemm != NULL, d->name, "gemm");
    expect(d->broadcast_rows != NULL, d->name, "broadcast_rows");
    expect(d->copy_rows != NULL, d->name, "copy_rows");
    expect(d->fill != NULL, d->name, "fill");
    expect(d->adamw_apply != NULL, d->name, "adamw_apply");
    expect(d->sum_squares != NULL, d->name, "sum_squares");
    expect(d->gelu_forward != NULL, d->name, "gelu_forward");
    expect(d->gelu_backward != NULL, d->name, "gelu_backward");
    expect(d->layernorm_forward != NULL, d->name, "layernorm_forward");
    expect(d->layernorm_backward != NULL, d->name, "layernorm_backward");
    expect(d->add_inplace != NULL, d->name, "add_inplace");
    expect(d->softmax_xent_forward != NULL, d->name, "softmax_xent_forward");
    expect(d->softmax_xent_backward != NULL, d->name, "softmax_xent_backward");
    expect(d->embedding_forward != NULL, d->name, "embedding_forward");
    expect(d->embedding_backward_rows != NULL, d->name, "embedding_backward_rows");
    expect(d->add_bias_rows != NULL, d->name, "add_bias_rows");
    expect(d->bias_grad_rows != NULL, d->name, "bias_grad_rows");
    expect(d->attn_merge != NULL, d->name, "attn_merge");
    expect(d->attention_forward != NULL, d->name, "attention_forward");
    expect(d->attention_backward != NULL, d->name, "attention_backward");
}

int main(void)
{
    check_direct(&spb_bf16_direct_cpu);
    check_table(&spb_backend_cpu, 0);
    check_table(&spb_backend_cpu_bf16, 0);
    check_table(&spb_backend_cpu_fp16, 0);
    expect(spb_backend_for("cpu", "fp32") == &spb_backend_cpu, "lookup", "cpu fp32");
    expect(spb_backend_for("cpu", "bf16") == &spb_backend_cpu_bf16, "lookup", "cpu bf16");
    expect(spb_backend_for("cpu", "fp16") == &spb_backend_cpu_fp16, "lookup", "cpu fp16");
    expect(spb_backend_for("tpu", "fp32") == NULL, "lookup", "unknown device");
#ifdef SPB_HAVE_CUDA
    check_table(&spb_backend_cuda, 1);
    check_table(&spb_backend_cuda_bf16, 1);
    check_table(&spb_backend_cuda_fp16, 1);
    check_direct(&spb_bf16_direct_cuda);
    expect(spb_backend_for("cuda", "fp32") == &spb_backend_cuda, "lookup", "cuda fp32");
    expect(spb_backend_for("cuda", "bf16") == &spb_backend_cuda_bf16, "lookup", "cuda bf16");
    expect(spb_backend_for("cuda", "fp16") == &spb_backend_cuda_fp16, "lookup", "cuda fp16");
    printf("checked: cpu, cpu-bf16, cpu-fp16, cuda, cuda-bf16, cuda-fp16\n");
#else
    printf("checked: cpu, cpu-bf16, cpu-fp16 (no CUDA in this build)\n");
#endif
    printf("%d missing\n", failures);
    return failures ? 1 : 0;
}
