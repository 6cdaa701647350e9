/* Paper-scale memory from the memory model (MODELLED, not measured): for
 * the DeepSpeed-Ulysses paper's 7B shape on 32 ranks (fig. 4) or 30B on 64
 * (fig. 5), bf16 mixed precision with activation checkpointing, per
 * strategy, sequence-parallel degree and ZeRO stage: bytes per rank at
 * N = 8K ... 256K, and the largest N that fits 40 and 80 GiB.  The model
 * covers parameters, gradients, optimizer state, the activations spbench
 * keeps and, under ZeRO-3, the gathered parameters (the globals and one
 * layer); other workspace and communication buffers are not in it.  The
 * learned position embedding has N rows (max-position-embeddings = N), as
 * in the runs spbench makes.
 * Usage: memory_table [7B|30B] */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "memory_model.h"

static int configure(spb_config *c, int L, int h, int heads, int world, const char *strategy, int P, int zero,
                     long N)
{
    spb_config_defaults(c);
    c->num_layers = L, c->hidden_size = h, c->num_heads = heads, c->vocab_size = 50257;
    c->seq_length = (int)N, c->max_position_embeddings = (int)N, c->micro_batch_size = 1;
    c->sp_degree = P, c->zero_stage = zero, c->checkpoint_activations = 1;
    snprintf(c->strategy, sizeof c->strategy, "%s", strategy);
    char err[512];
    return spb_config_finalize(c, world, err, sizeof err);
}

static double gib(const spb_config *c, int world)
{
    spb_memory_prediction p;
    spb_memory_model(c, world, SPB_BF16_MIXED, &p);
    return p.total / 1073741824.0;
}

/* Largest N (a multiple of 1024·P) whose prediction fits `budget` GiB. */
static long largest_fitting(int L, int h, int heads, int world, const char *s, int P, int zero, double budget)
{
    long step = 1024L * P, best = 0;
    for (long N = step; N <= (1L << 24); N += step) {
        spb_config c;
        if (configure(&c, L, h, heads, world, s, P, zero, N)) break;
        if (gib(&c, world) > budget) break;
        best = N;
    }
    return best;
}

int main(int argc, char **argv)
{
    int big = argc > 1 && !strcmp(argv[1], "30B");
    int L = big ? 64 : 32, h = big ? 6144 : 4096, heads = big ? 64 : 32, world = big ? 64 : 32;
    const char *strategies[] = {"ulysses", "megatron", "ring"};
    const int degrees[] = {8, world};
    const long lengths[] = {8192, 16384, 32768, 65536, 131072, 262144};
    printf("MODELLED (memory model, not measured): %s GPT (L %d, h %d, %d heads, vocab 50257) on %d ranks, "
           "micro-batch 1, bf16 mixed precision (2+2+12 bytes per parameter), activation checkpointing; "
           "GiB per rank for parameters + gradients + optimizer state + kept activations + ZeRO-3's gathered "
           "parameters (no other workspace or communication buffers); learned position embeddings of N rows. "
           "The model equals the allocator of the bf16 table (--precision bf16, emulated on the CPU) in 112 "
           "small configurations (test bf16_mpi4); nothing here was measured on a GPU.\n\n",
           big ? "30B" : "7B", L, h, heads, world);
    printf("| strategy | P | D | ZeRO |");
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) printf(" N=%ldK |", lengths[k] / 1024);
    printf(" largest N in 40 GiB | largest N in 80 GiB |\n|---|---|---|---|");
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0] + 2; k++) printf("---|");
    printf("\n");
    for (int s = 0; s < 3; s++)
        for (int d = 0; d < 2; d++)
            for (int zero = 0; zero <= 3; zero++) {
                int P = degrees[d];
                printf("| %s | %d | %d | %d |", strategies[s], P, world / P, zero);
                for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
                    spb_config c;
                    if (configure(&c, L, h, heads, world, strategies[s], P, zero, lengths[k]))
                        printf(" invalid |");
                    else
                        printf(" %.1f |", gib(&c, world));
                }
                printf(" %ldK | %ldK |\n", largest_fitting(L, h, heads, world, strategies[s], P, zero, 40) / 1024,
                       largest_fitting(L, h, heads, world, strategies[s], P, zero, 80) / 1024);
            }
    return 0;
}
