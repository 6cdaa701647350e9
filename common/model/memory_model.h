/* The memory model: peak bytes per category per rank predicted from the
 * configuration alone (shape, N, micro-batch, D, P, strategy, ZeRO stage,
 * checkpointing, precision), without allocating anything.  The runner uses
 * it to skip configurations over a memory budget and the performance model
 * at paper scale; tests hold it against the tracked allocator.
 *
 * It predicts the categories whose size the configuration fixes:
 * parameters, gradients, optimizer state and activations saved for
 * backward, and under ZeRO-3 the gathered parameters (workspace); on
 * --device cuda the workspaces whose size the configuration fixes: RoPE's
 * angle table and, for --attention cudnn with G < H K/V heads, the K/V
 * copies and their gradients.  Other workspace and communication buffers
 * are transient and reported measured only. */
#ifndef SPB_MEMORY_MODEL_H
#define SPB_MEMORY_MODEL_H

#include "config.h"
#include "memory.h"

typedef enum spb_precision {
    SPB_FP32 = 0,    /* --precision fp32 (the default): everything fp32 */
    SPB_BF16_MIXED,  /* --precision bf16 (the GPU path; emulated on the CPU by
                        common/bf16/backend_bf16_cpu.c): bf16 parameters, gradients
                        and activations; fp32 master weights and AdamW moments,
                        ZeRO's reduced gradient slices, LayerNorm statistics
                        and attention log-sum-exp */
} spb_precision;

/* The precision a finalized configuration runs at (--precision). */
spb_precision spb_memory_precision(const spb_config *cfg);

typedef struct spb_memory_prediction {
    double bytes[SPB_MEM_NUM_CATEGORIES];
    double total;
} spb_memory_prediction;

/* cfg must be finalized for world_size ranks. */
void spb_memory_model(const spb_config *cfg, int world_size, spb_precision precision, spb_memory_prediction *out);

/* "80GiB", "512MiB", "1e9" -> bytes; -1 if malformed. */
double spb_parse_bytes(const char *text);

#endif
