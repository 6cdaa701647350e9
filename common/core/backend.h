/* The device operations the GPT core calls, one table per device (the
 * spirit of nccl-tests' per-collective modules and llm.c's kernels: the
 * core says what to compute, a table says where).  The CPU's table is
 * common/core/ops_cpu.c's fp32 functions; a CUDA table will sit beside it with
 * the same contracts (common/cuda/ holds its kernels, checked by
 * spbench-gpu-check).  Buffers passed to a table's operations live on its
 * device and are allocated through it, tracked by category.  Contracts are
 * ops.h's. */
#ifndef SPB_BACKEND_H
#define SPB_BACKEND_H

#include "attention.h"
#include "comm.h"
#include "config.h"
#include "memory.h"
#include "timer.h"

/* What a buffer holds, for tables whose storage depends on it (the bf16
 * table keeps some buffers fp32 and the parameters' fp32 masters beside
 * AdamW's first moment); tables without alloc_role store every role alike. */
typedef enum spb_buffer_role {
    SPB_BUF_PLAIN = 0,     /* stored at the table's precision */
    SPB_BUF_FP32,          /* values that stay fp32: ZeRO's reduced gradient slices */
    SPB_BUF_FIRST_MOMENT,  /* AdamW's m (fp32) */
    SPB_BUF_SECOND_MOMENT, /* AdamW's v (fp32) */
} spb_buffer_role;

/* The step's scalars a device table keeps on the device (scalar_defer). */
enum { SPB_SCALAR_LOSS, SPB_SCALAR_SQ_REPLICATED, SPB_SCALAR_SQ_SPLIT, SPB_NUM_SCALARS };

typedef struct spb_backend {
    const char *name;
    /* 1 when buffers are host memory; 0: MPI goes through `staging`
     * (comm.h's host-staged path), set up by the core when it is created. */
    int host_memory;
    spb_comm_staging staging;
    /* Binds this rank to one of the devices it sees (local ranks share
     * them round-robin, so several ranks may share one GPU); 0, or -1 with
     * a message.  NULL: nothing to open (the host). */
    int (*open)(int local_rank, char *err, size_t errlen);
    /* Optional: names the physical device open() bound this rank to, the
     * same string in every process that holds it whatever the process sees
     * (a GPU's UUID and PCI address, not its index, which
     * CUDA_VISIBLE_DEVICES renumbers per process).  How spb_backend_open
     * finds two ranks on one device where each needs its own. */
    void (*device_identity)(char *buf, size_t len);
    /* Waits for the work queued on the device (NULL: work is never queued). */
    void (*synchronize)(void);
    /* The tracker that holds this table's buffers (memory.h's on the host). */
    const spb_mem_stats *(*mem_stats)(void);
    void (*mem_reset_peaks)(void);
    /* Bytes in use as the device's driver reports them (CUDA: total - free,
     * the context and other processes on the device included); NULL where
     * there is no such reading. */
    double (*device_used_bytes)(void);
    /* The phase timers' clock on the stream the table computes on (NULL:
     * the host clock). */
    const spb_timer_clock *clock;
    /* Optional (NULL: nothing to learn): told the run's configuration when a
     * model is created on the table, before the model allocates anything.
     * A table whose storage depends on how the core uses a buffer (the
     * bf16 table: where fp32 master weights live under each ZeRO stage)
     * reads it here. */
    void (*configure)(const spb_config *cfg);
    /* Optional (NULL: the table keeps no fp32 masters apart from the
     * parameters): parameters p[0, n) are those AdamW updates beside the
     * first moment m (ZeRO 1-2's owned slices); bind their masters there
     * now, as the first update would, so that a checkpoint's fp32 values
     * written into p next reach the masters exactly. */
    void (*bind_masters)(float *p, const float *m, long n);
    /* The device's attention kernel of that name (--attention), or NULL. */
    const spb_attn_backend *(*attention)(const char *name);
    /* n elements, zeroed, tracked under cat; free takes NULL. */
    float *(*alloc)(spb_mem_category cat, long n);
    int *(*alloc_ints)(spb_mem_category cat, long n);
    /* alloc for a buffer of that role (NULL: alloc; spb_backend_alloc). */
    float *(*alloc_role)(spb_mem_category cat, long n, spb_buffer_role role);
    void (*free)(void *p);
    void (*zero)(float *x, long n);
    void (*copy)(float *dst, const float *src, long n); /* device to device */
    /* rows of `width` floats from src (row stride src_stride) to dst (dst_stride) */
    void (*copy_rows)(float *dst, long dst_stride, const float *src, long src_stride, long rows, long width);
    void (*fill)(float *x, long n, float value);
    /* host ints (tokens) into a device buffer */
    void (*ints_to_device)(int *dst, const int *host, long n);

    void (*matmul_forward)(float *out, const float *inp, const float *W, const float *b, int rows, int in,
                           int out_f);
    void (*matmul_backward)(float *dinp, float *dW, float *db, const float *dout, const float *inp, const float *W,
                            int rows, int in, int out_f, int accumulate_dinp);
    void (*matmul_forward_ld)(float *out, int ldo, const float *inp, int ldi, const float *W, int ldw,
                              const float *b, int rows, int in, int out_f, int accumulate);
    void (*matmul_backward_ld)(float *dinp, int lddi, float *dW, int lddw, float *db, const float *dout, int ldo,
                               const float *inp, int ldi, const float *W, int ldw, int rows, int in, int out_f,
                               int accumulate_dinp);
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *b, int rows, int C);
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int rows, int C);
    /* Llama-style layers (ops.h's contracts; wpe = NULL in the embedding
     * means no position table).  NULL in tables that lack them: config.c
     * refuses those options there. */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w, int rows, int C);
    void (*rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                             const float *rstd, int rows, int C);
    void (*swiglu_forward)(float *out, const float *inp, int rows, int F);
    void (*swiglu_backward)(float *dinp, const float *inp, const float *dout, int rows, int F);
    void (*rope_apply)(float *x, const long *positions, int batch, int tokens, long token_stride, long batch_stride,
                       int heads, int head_dim, double base, int inverse);
    void (*gelu_forward)(float *out, const float *inp, long n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, long n);
    void (*embedding_forward)(float *out, const int *tokens, const float *wte, const float *wpe,
                              const long *positions, int rows, int T, int C);
    void (*embedding_backward)(float *dwte, float *dwpe, const float *dout, const int *tokens,
                               const long *positions, int rows, int T, int C);
    double (*softmax_xent_forward)(float *probs_inplace, const int *targets, int rows, int V);
    void (*softmax_xent_backward)(float *probs_inplace, const int *targets, int rows, int V, float scale);
    void (*add_inplace)(float *a, const float *b, long n);
    /* x[r] += b and db += sum over rows of dy, for rows of width C */
    void (*add_bias_rows)(float *x, const float *b, long rows, int C);
    void (*bias_grad_rows)(float *db, const float *dy, long rows, int C);
    /* optimizer.h's spb_adamw_apply and spb_sum_squares on device buffers */
    void (*adamw_apply)(float *p, const float *grad, float *m, float *v, long n, float grad_scale,
                        float weight_decay, const spb_config *cfg, long step, double lr);
    double (*sum_squares)(const float *x, long n);
    /* Optional (device tables; NULL: the values above are read back by
     * each call).  scalar_defer(slot): until scalar_defer(-1), the table's
     * softmax_xent_forward and sum_squares add their value onto device
     * accumulator `slot` (SPB_SCALAR_*: the same double additions as the
     * host's `acc += returned value`) and return 0.  scalars_take copies
     * slots [first, first + n) to out and zeroes them: the loss slot alone
     * waits only for the kernel that last added to it, any other range for
     * the work queued.  clip_on_device(clip_grad, loss_scale): AdamW's
     * gradient scale made on the device from the two sum-of-squares slots
     * (train.c's clipping arithmetic); adamw_apply then ignores its
     * grad_scale argument until the next scalars_take. */
    void (*scalar_defer)(int slot);
    void (*scalars_take)(int first, int n, double *out);
    void (*clip_on_device)(double clip_grad, double loss_scale);
    /* attention.h's spb_attn_merge_rows (ring attention) */
    void (*attn_merge)(float *o_acc, float *lse_acc, const float *o_pair, const float *lse_pair, int batch, int heads,
                       int head_dim, int T, int row, int len);
} spb_backend;

extern const spb_backend spb_backend_cpu;
/* Mixed precision emulated on the CPU (common/bf16/backend_bf16_cpu.c): bf16
 * storage behind handles, fp32 arithmetic, fp32 masters and moments. */
extern const spb_backend spb_backend_cpu_bf16;
/* The same with fp16 storage (--precision fp16; loss scaling in train.c). */
extern const spb_backend spb_backend_cpu_fp16;
/* The same over the fp32 CUDA table, storage on the GPU: cuda/cuda_backend.h's
 * spb_backend_cuda_bf16 (CUDA builds). */

/* The table for --device and --precision (fp32, bf16; "" is fp32), NULL
 * when this build has none. */
const spb_backend *spb_backend_for(const char *device, const char *precision);
/* The fp32 table for --device (spb_backend_for(device, "fp32")). */
const spb_backend *spb_backend_by_name(const char *device);
/* n floats of a device buffer into host memory and back: a copy where the
 * table's buffers are host memory, else through its staging hooks. */
void spb_backend_to_host(const spb_backend *be, float *host, const float *dev, long n);
void spb_backend_to_device(const spb_backend *be, float *dev, const float *host, long n);
/* be->alloc_role where the table has one, else be->alloc. */
float *spb_backend_alloc(const spb_backend *be, spb_mem_category cat, long n, spb_buffer_role role);
/* 1 when this build has a table for --device (config.c's check). */
int spb_backend_available(const char *device);
/* Binds the calling rank to its device (be->open with its rank on the
 * machine); 0, or -1 with a message.  exclusive: each rank needs a device of
 * its own (NCCL refuses two ranks on one device): two ranks of a machine
 * bound to one device (be->device_identity) are an error on both.
 * Collective over world. */
int spb_backend_open(const spb_backend *be, MPI_Comm world, int exclusive, char *err, size_t errlen);
/* Tests: make spb_backend_for and spb_backend_by_name return this table
 * (NULL: back to normal). */
void spb_backend_register_for_tests(const spb_backend *table);

#endif
