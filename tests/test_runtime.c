/* Unit tests of the runtime: configuration parsing and validation, tracked
 * allocator, counter-based RNG, results CSV, learning-rate schedule. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "gpt.h"
#include "grid.h"
#include "memory.h"
#include "optimizer.h"
#include "report.h"
#include "rng.h"
#include "timer.h"
#include "mpi_check.h"

static int parse_and_finalize(int world, char *err, size_t errlen, spb_config *c, ...)
{
    char *argv[64] = {"spbench"};
    int argc = 1;
    va_list ap;
    va_start(ap, c);
    for (char *a; (a = va_arg(ap, char *));) argv[argc++] = a;
    va_end(ap);
    spb_config_defaults(c);
    int rc = spb_config_parse(argc, argv, c, err, errlen);
    if (rc) return rc;
    return spb_config_finalize(c, world, err, errlen);
}

START_TEST(config_parses_megatron_options)
{
    spb_config c;
    char err[256] = "";
    int rc = parse_and_finalize(2, err, sizeof err, &c, "--num-layers", "3", "--hidden-size=48",
                                "--num-attention-heads", "6", "--seq-length", "32", "--micro-batch-size", "2",
                                "--global-batch-size", "8", "--lr", "3e-4", "--seed", "77", NULL);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_int_eq(c.num_layers, 3);
    ck_assert_int_eq(c.hidden_size, 48);
    ck_assert_int_eq(c.ffn_hidden_size, 4 * 48);
    ck_assert_int_eq(c.max_position_embeddings, 32);
    ck_assert_int_eq(c.vocab_size, 256);
    ck_assert_uint_eq(c.seed, 77);
    ck_assert_double_eq_tol(c.lr, 3e-4, 1e-15);
    ck_assert_int_eq(spb_config_dp_degree(&c, 2), 2);
    ck_assert_int_eq(spb_config_accum_steps(&c, 2), 2);
}
END_TEST

START_TEST(config_rejects_bad_values)
{
    struct { const char *why; const char *args[4]; const char *expect; } cases[] = {
        {"zero layers", {"--num-layers", "0"}, "num-layers"},
        {"negative hidden", {"--hidden-size", "-4"}, "hidden-size"},
        {"heads do not divide", {"--hidden-size", "30", "--num-attention-heads", "4"}, "divisible"},
        {"not a number", {"--seq-length", "12x"}, "not an integer"},
        {"unknown option", {"--frobnicate", "1"}, "unknown option"},
        {"unknown strategy", {"--strategy", "zigzag"}, "unknown --strategy"},
        {"missing file", {"--data", "/nonexistent/file"}, "--data"},
        {"past position table", {"--seq-length", "65", "--max-position-embeddings", "64"}, "position table"},
        {"batch not divisible", {"--global-batch-size", "6"}, "multiple"},
        {"sp does not divide world", {"--sp-degree", "3"}, "divisible"},
        {"bad zero stage", {"--zero-stage", "4"}, "zero-stage"},
        {"missing value", {"--lr"}, "needs a value"},
        {"unknown attention", {"--attention", "magic"}, "attention"},
        {"infinite lr", {"--lr", "inf"}, "finite"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        spb_config c;
        char err[256] = "";
        int rc = parse_and_finalize(2, err, sizeof err, &c, cases[k].args[0], cases[k].args[1], cases[k].args[2],
                                    cases[k].args[3], NULL);
        ck_assert_msg(rc == -1, "%s: accepted", cases[k].why);
        ck_assert_msg(strstr(err, cases[k].expect) != NULL, "%s: message '%s' lacks '%s'", cases[k].why, err,
                      cases[k].expect);
        ck_assert_msg(strchr(err, '\n') == NULL, "%s: message is not one line", cases[k].why);
    }
}
END_TEST

/* --attention cudnn with grouped-query attention: taken (cuDNN's graph takes
 * G = H, so K and V are copied to every query head first:
 * common/cuda/cuda_attention_gqa.h) when asked for (auto keeps flash until a GPU
 * has run it), on a stand-in table
 * that says it has cuDNN (this build may have none; the check is config.c's). */
static const spb_attn_backend *any_attention(const char *name) { return name ? &spb_attn_naive : NULL; }

START_TEST(cudnn_takes_grouped_query_attention)
{
    if (!spb_backend_available("cuda")) return; /* a build without CUDA refuses --device cuda first */
    spb_backend with_cudnn = spb_backend_cpu;
    with_cudnn.attention = any_attention;
    spb_backend_register_for_tests(&with_cudnn);
    spb_config c;
    char err[256] = "";
    int rc = parse_and_finalize(1, err, sizeof err, &c, "--device", "cuda", "--precision", "bf16", "--attention",
                                "cudnn", "--model", "llama", "--num-query-groups", "2", NULL);
    ck_assert_msg(rc == 0, "%s", err); /* on K/V copied to every query head (cuda_attention_gqa.h) */
    rc = parse_and_finalize(1, err, sizeof err, &c, "--device", "cuda", "--precision", "bf16", "--attention", "cudnn",
                            "--model", "llama", NULL); /* G = H */
    ck_assert_msg(rc == 0, "%s", err);
    rc = parse_and_finalize(1, err, sizeof err, &c, "--device", "cuda", "--precision", "bf16", "--model", "llama",
                            "--num-query-groups", "1", NULL); /* auto: flash until the copies have run on a GPU */
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_str_eq(c.attention, "flash");
    spb_backend_register_for_tests(NULL);
}
END_TEST

/* The attention a run gets without --attention: cuDNN's on a CUDA device
 * where the build has cuDNN 9 (the build's flag is the second argument, so
 * both builds are checked here, on the CPU), the flash kernels wherever
 * cuDNN's graph does not take the run; and on this build, through the
 * command line, the CPU keeps flash and says it was the default. */
START_TEST(default_attention_is_the_fastest_the_build_has)
{
    spb_config c;
    spb_config_defaults(&c);
    strcpy(c.device, "cuda"), strcpy(c.precision, "bf16");
    c.hidden_size = 4096, c.num_heads = 32;
    const char *why = NULL;
    ck_assert_str_eq(spb_config_default_attention(&c, 1, &why), "cudnn");
    ck_assert_ptr_nonnull(why);
    ck_assert_str_eq(spb_config_default_attention(&c, 0, &why), "flash"); /* no cuDNN in the build */
    ck_assert_msg(strstr(why, "no cuDNN") != NULL, "%s", why);
    strcpy(c.precision, "fp16");
    ck_assert_str_eq(spb_config_default_attention(&c, 1, NULL), "cudnn");
    strcpy(c.precision, "fp32"); /* cuDNN's graph takes 16-bit operands */
    ck_assert_str_eq(spb_config_default_attention(&c, 1, NULL), "flash");
    strcpy(c.precision, "bf16");
    c.sparse_block = 64; /* dense masks only */
    ck_assert_str_eq(spb_config_default_attention(&c, 1, NULL), "flash");
    c.sparse_block = 0;
    c.num_heads = 16; /* head dim 256 */
    ck_assert_str_eq(spb_config_default_attention(&c, 1, NULL), "flash");
    c.hidden_size = 36, c.num_heads = 3; /* head dim 12, not a multiple of 8 */
    ck_assert_str_eq(spb_config_default_attention(&c, 1, NULL), "flash");
    c.hidden_size = 4096, c.num_heads = 32;
    strcpy(c.flash_fwd, "wgmma"); /* a flash variant asked for */
    ck_assert_str_eq(spb_config_default_attention(&c, 1, NULL), "flash");
    c.flash_fwd[0] = 0;
    c.num_query_groups = 8; /* grouped-query attention: cuDNN on K/V copies only when asked for */
    ck_assert_str_eq(spb_config_default_attention(&c, 1, &why), "flash");
    ck_assert_msg(strstr(why, "grouped-query") != NULL, "%s", why);
    c.num_query_groups = 32; /* G = H: cuDNN's */
    ck_assert_str_eq(spb_config_default_attention(&c, 1, NULL), "cudnn");
    c.num_query_groups = 0;
    strcpy(c.device, "cpu"), strcpy(c.precision, "bf16");
    ck_assert_str_eq(spb_config_default_attention(&c, 1, NULL), "flash");

    char err[256] = "";
    ck_assert_msg(parse_and_finalize(2, err, sizeof err, &c, NULL) == 0, "%s", err);
    ck_assert_str_eq(c.attention, "flash");
    ck_assert_int_eq(c.attention_auto, 1);
    ck_assert_ptr_nonnull(c.attention_why);
    ck_assert_msg(parse_and_finalize(2, err, sizeof err, &c, "--attention", "auto", NULL) == 0, "%s", err);
    ck_assert_str_eq(c.attention, "flash");
    ck_assert_msg(parse_and_finalize(2, err, sizeof err, &c, "--attention", "naive", NULL) == 0, "%s", err);
    ck_assert_str_eq(c.attention, "naive");
    ck_assert_int_eq(c.attention_auto, 0);
    spb_config_defaults(&c); /* a configuration built in code keeps flash */
    ck_assert_msg(spb_config_finalize(&c, 1, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.attention, "flash");
    ck_assert_int_eq(c.attention_auto, 0);
}
END_TEST

START_TEST(allocator_tracks_current_and_peak)
{
    const spb_mem_stats *s = spb_mem_get_stats();
    size_t base_act = s->current[SPB_MEM_ACTIVATIONS], base_total = s->current_total;
    spb_mem_reset_peaks();
    float *a = spb_mem_alloc(SPB_MEM_ACTIVATIONS, 1000);
    float *b = spb_mem_alloc(SPB_MEM_ACTIVATIONS, 3000);
    float *w = spb_mem_alloc(SPB_MEM_WORKSPACE, 500);
    ck_assert_uint_eq((uintptr_t)a % 64, 0);
    ck_assert_float_eq(a[249], 0.0f); /* zeroed */
    ck_assert_uint_eq(s->current[SPB_MEM_ACTIVATIONS], base_act + 4000);
    spb_mem_free(b);
    ck_assert_uint_eq(s->current[SPB_MEM_ACTIVATIONS], base_act + 1000);
    ck_assert_uint_eq(s->peak[SPB_MEM_ACTIVATIONS], base_act + 4000);
    ck_assert_uint_eq(s->peak_total, base_total + 4500);
    ck_assert_uint_eq(spb_mem_size(w), 500);
    spb_mem_free(a);
    spb_mem_free(w);
    ck_assert_uint_eq(s->current_total, base_total);
}
END_TEST

START_TEST(model_memory_is_accounted)
{
    spb_config c;
    char err[256];
    ck_assert_int_eq(parse_and_finalize(1, err, sizeof err, &c, NULL), 0);
    size_t before = spb_mem_get_stats()->current[SPB_MEM_PARAMS];
    spb_grid g;
    spb_grid_create(&g, MPI_COMM_SELF, 1);
    spb_gpt *m = spb_gpt_create(&c, &g);
    ck_assert_int_eq(m->num_params, spb_gpt_count_params(&c));
    ck_assert_uint_eq(spb_mem_get_stats()->current[SPB_MEM_PARAMS] - before, 4 * (size_t)m->num_params);
    ck_assert_uint_eq(spb_mem_get_stats()->current[SPB_MEM_GRADS], 4 * (size_t)m->num_params);
    spb_gpt_destroy(m);
    spb_grid_destroy(&g);
    ck_assert_uint_eq(spb_mem_get_stats()->current[SPB_MEM_PARAMS], before);
}
END_TEST

START_TEST(rng_is_counter_based)
{
    /* Same key, same value, whatever was drawn before. */
    double a = spb_rng_normal(5, 3, 1000);
    for (int i = 0; i < 100; i++) spb_rng_normal(5, 3, (uint64_t)i);
    ck_assert(spb_rng_normal(5, 3, 1000) == a);
    ck_assert(spb_rng_normal(6, 3, 1000) != a);
    ck_assert(spb_rng_normal(5, 4, 1000) != a);
    /* Moments of 200k normals: mean 0 +- 5 sigma/sqrt(n), variance 1 +- 5 sqrt(2/n). */
    const int n = 200000;
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        double x = spb_rng_normal(1, 0, (uint64_t)i);
        s += x, s2 += x * x;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    ck_assert_double_le(fabs(mean), 5 / sqrt(n));
    ck_assert_double_le(fabs(var - 1), 5 * sqrt(2.0 / n));
    long below[10] = {0};
    for (int i = 0; i < n; i++) below[spb_rng_below(2, 0, (uint64_t)i, 10)]++;
    for (int k = 0; k < 10; k++) ck_assert_int_le(labs(below[k] - n / 10), 5 * (long)sqrt(n * 0.09));
}
END_TEST

START_TEST(init_does_not_depend_on_the_model_object)
{
    /* Two models of the same shape get the same values; element values are
     * keyed by (seed, tensor, index). */
    spb_config c;
    char err[256];
    ck_assert_int_eq(parse_and_finalize(1, err, sizeof err, &c, NULL), 0);
    spb_grid g;
    spb_grid_create(&g, MPI_COMM_SELF, 1);
    spb_gpt *a = spb_gpt_create(&c, &g), *b = spb_gpt_create(&c, &g);
    spb_gpt_init_params(a, 11);
    spb_gpt_init_params(b, 11);
    ck_assert_int_eq(memcmp(a->params, b->params, sizeof(float) * (size_t)a->num_params), 0);
    ck_assert_float_eq(a->params[a->tensors[0].offset + 17], (float)(0.02 * spb_rng_normal(11, 0, 17)));
    ck_assert_float_eq(a->layer[0].ln1_w[3], 1.0f);
    ck_assert_float_eq(a->layer[1].fc_b[3], 0.0f);
    spb_gpt_destroy(a);
    spb_gpt_destroy(b);
    spb_grid_destroy(&g);
}
END_TEST

START_TEST(results_rows_are_whole_and_headers_checked)
{
    char path[64], err[256], line[4096];
    snprintf(path, sizeof path, "/tmp/spb_test_rows_%d.csv", (int)getpid());
    remove(path);
    spb_row r = {0};
    spb_row_add(&r, "a", "%d", 1);
    spb_row_add(&r, "b", "%s", "x,y"); /* separator inside a value is replaced */
    ck_assert_int_eq(spb_row_append_csv(&r, path, err, sizeof err), 0);
    ck_assert_int_eq(spb_row_append_csv(&r, path, err, sizeof err), 0);
    FILE *f = fopen(path, "r");
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        lines++;
        ck_assert_str_eq(line, lines == 1 ? "a,b\n" : "1,x;y\n");
    }
    fclose(f);
    ck_assert_int_eq(lines, 3);
    spb_row other = {0};
    spb_row_add(&other, "c", "2");
    ck_assert_int_ne(spb_row_append_csv(&other, path, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(err, "other columns"));
    remove(path);
}
END_TEST

/* A fake device clock: marks are points on a simulated timeline (the
 * stream's time when the mark is reached), readable only after release has
 * not reset them. */
static double fake_timeline[64];
static int fake_used, fake_reads, fake_releases;
static double fake_now;
static int fake_mark(void)
{
    ck_assert_int_lt(fake_used, 64);
    fake_timeline[fake_used] = fake_now;
    return fake_used++;
}
static double fake_elapsed(int a, int b)
{
    ck_assert(a >= 0 && b > a && b < fake_used); /* a released mark would be out of range */
    fake_reads++;
    return fake_timeline[b] - fake_timeline[a];
}
static void fake_release(void)
{
    fake_releases++;
    fake_used = 0;
}
static const spb_timer_clock fake_clock = {fake_mark, fake_elapsed, fake_release};

START_TEST(device_timer_regions_fold_once)
{
    spb_timer_set_clock(&fake_clock);
    spb_timer_reset_all();
    fake_now = 0.0, fake_reads = 0;
    spb_timer_region fwd = spb_timer_begin(SPB_T_FORWARD);
    fake_now = 1.0;
    spb_timer_region gemm = spb_timer_begin(SPB_T_GEMM);
    fake_now = 3.5;
    spb_timer_end(gemm);
    /* A read inside the open forward region folds the GEMM but must not
     * reuse the forward region's begin mark. */
    ck_assert_double_eq(spb_timer_get(SPB_T_GEMM), 2.5);
    ck_assert_int_eq(fake_used, 3);
    fake_now = 6.0;
    spb_timer_end(fwd);
    spb_timer_flush();
    ck_assert_double_eq(spb_timer_get(SPB_T_FORWARD), 6.0);
    ck_assert_double_eq(spb_timer_get(SPB_T_GEMM), 2.5); /* folded once, not again */
    ck_assert_int_eq(fake_reads, 2);
    ck_assert_int_eq(fake_used, 0); /* everything read: marks reusable */
    /* Host-clock additions (the collectives) go straight in beside them. */
    spb_timer_add(SPB_T_COMM, 0.25);
    ck_assert_double_eq(spb_timer_get(SPB_T_COMM), 0.25);
    /* Regions pending at a reset belong to the discarded interval. */
    spb_timer_region b = spb_timer_begin(SPB_T_BACKWARD);
    fake_now = 9.0;
    spb_timer_end(b);
    spb_timer_reset_all();
    ck_assert_double_eq(spb_timer_get(SPB_T_BACKWARD), 0.0);
    spb_timer_set_clock(NULL);
    /* Back on the host clock: regions add wall seconds. */
    spb_timer_region h = spb_timer_begin(SPB_T_DATA);
    spb_timer_end(h);
    ck_assert(spb_timer_get(SPB_T_DATA) >= 0.0 && spb_timer_get(SPB_T_DATA) < 1.0);
    spb_timer_reset_all();
}
END_TEST

/* The observer (the CUDA kernel timeline's phase marks): told of the
 * top-level regions only, in order, and of flushes and resets. */
static char observed[64];
static int observed_flushes, observed_resets;
static void observe_region(spb_timer_id id, int begin)
{
    size_t n = strlen(observed);
    if (n + 3 < sizeof observed) snprintf(observed + n, sizeof observed - n, "%c%d", begin ? '+' : '-', (int)id);
}
static void observe_flush(void) { observed_flushes++; }
static void observe_reset(void) { observed_resets++; }
static const spb_timer_observer test_observer = {observe_region, observe_flush, observe_reset};

START_TEST(timer_observer_sees_top_level_phases)
{
    spb_timer_set_clock(&fake_clock);
    spb_timer_reset_all();
    observed[0] = 0, observed_flushes = observed_resets = 0;
    spb_timer_set_observer(&test_observer);
    spb_timer_region fwd = spb_timer_begin(SPB_T_FORWARD);
    spb_timer_end(spb_timer_begin(SPB_T_GEMM)); /* nested: not a phase */
    spb_timer_end(fwd);
    spb_timer_end(spb_timer_begin(SPB_T_OPTIMIZER));
    spb_timer_flush();
    spb_timer_reset_all();
    spb_timer_set_observer(NULL);
    spb_timer_end(spb_timer_begin(SPB_T_BACKWARD)); /* none set: nothing told */
    ck_assert_str_eq(observed, "+1-1+4-4");
    ck_assert_int_ge(observed_flushes, 1);
    ck_assert_int_eq(observed_resets, 1);
    spb_timer_set_clock(NULL);
    spb_timer_reset_all();
}
END_TEST

START_TEST(lr_schedule)
{
    spb_config c;
    spb_config_defaults(&c);
    c.lr = 1.0, c.min_lr = 0.1, c.train_iters = 110, c.lr_warmup_iters = 10;
    strcpy(c.lr_decay_style, "cosine");
    ck_assert_double_eq_tol(spb_lr_at(&c, 0), 0.1, 1e-12);
    ck_assert_double_eq_tol(spb_lr_at(&c, 9), 1.0, 1e-12);
    ck_assert_double_eq_tol(spb_lr_at(&c, 10), 1.0, 1e-12);
    ck_assert_double_eq_tol(spb_lr_at(&c, 60), 0.55, 1e-12);
    ck_assert_double_eq_tol(spb_lr_at(&c, 110), 0.1, 1e-12);
    strcpy(c.lr_decay_style, "linear");
    ck_assert_double_eq_tol(spb_lr_at(&c, 60), 0.55, 1e-12);
    strcpy(c.lr_decay_style, "constant");
    ck_assert_double_eq_tol(spb_lr_at(&c, 100), 1.0, 1e-12);
}
END_TEST

/* The machines an SP or data-parallel group spans, from a machine map. */
START_TEST(placement_counts_machines_per_group)
{
    int map[16];
    spb_placement pl;
    /* 2 machines of 8, consecutive ranks together (mpirun's default by slot) */
    for (int r = 0; r < 16; r++) map[r] = r / 8 * 100;
    spb_placement_count(map, 16, 8, &pl);
    ck_assert_int_eq(pl.machines, 2); ck_assert_int_eq(pl.ranks_per_machine, 8);
    ck_assert_int_eq(pl.sp_machines, 1); ck_assert_int_eq(pl.dp_machines, 2);
    spb_placement_count(map, 16, 4, &pl); /* D = 4: two groups a machine */
    ck_assert_int_eq(pl.sp_machines, 1); ck_assert_int_eq(pl.dp_machines, 2);
    spb_placement_count(map, 16, 16, &pl); /* one SP group over both */
    ck_assert_int_eq(pl.sp_machines, 2); ck_assert_int_eq(pl.dp_machines, 1);
    /* dealt out machine by machine (--map-by node): every SP group splits */
    for (int r = 0; r < 16; r++) map[r] = r % 2;
    spb_placement_count(map, 16, 8, &pl);
    ck_assert_int_eq(pl.machines, 2); ck_assert_int_eq(pl.sp_machines, 2); ck_assert_int_eq(pl.dp_machines, 1);
    /* 4 machines of 3, 12 ranks, P = 4: groups straddle machines unevenly */
    for (int r = 0; r < 12; r++) map[r] = r / 3;
    spb_placement_count(map, 12, 4, &pl);
    ck_assert_int_eq(pl.machines, 4); ck_assert_int_eq(pl.ranks_per_machine, 3);
    ck_assert_int_eq(pl.sp_machines, 2); ck_assert_int_eq(pl.dp_machines, 3);
    /* this process alone: one machine */
    spb_grid g;
    spb_grid_create(&g, MPI_COMM_WORLD, 1);
    pl = g.placement;
    ck_assert_int_eq(pl.machines, 1); ck_assert_int_eq(pl.sp_machines, 1); ck_assert_int_eq(pl.dp_machines, 1);
    spb_grid_destroy(&g);
}
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    Suite *s = suite_create("runtime");
    TCase *tc = tcase_create("units");
    tcase_add_test(tc, config_parses_megatron_options);
    tcase_add_test(tc, config_rejects_bad_values);
    tcase_add_test(tc, default_attention_is_the_fastest_the_build_has);
    tcase_add_test(tc, cudnn_takes_grouped_query_attention);
    tcase_add_test(tc, allocator_tracks_current_and_peak);
    tcase_add_test(tc, model_memory_is_accounted);
    tcase_add_test(tc, rng_is_counter_based);
    tcase_add_test(tc, init_does_not_depend_on_the_model_object);
    tcase_add_test(tc, results_rows_are_whole_and_headers_checked);
    tcase_add_test(tc, lr_schedule);
    tcase_add_test(tc, device_timer_regions_fold_once);
    tcase_add_test(tc, timer_observer_sees_top_level_phases);
    tcase_add_test(tc, placement_counts_machines_per_group);
    suite_add_tcase(s, tc);
    return spb_run_suite_and_finalize(s);
}
