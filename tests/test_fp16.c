/* --precision fp16 (the cpu-fp16 table: the bf16 tables' design with fp16
 * storage) and its loss scaling (common/core/train.c), under mpiexec -np 4:
 *   - the conversions (common/bf16/fp16.h): every one of the 65536 fp16 values
 *     round-trips; fp32 values round to nearest, ties to even, against a
 *     reference in double arithmetic, over the whole range (subnormals,
 *     overflow to infinity from 65520, ties);
 *   - the table stores fp16: values read back are the fp16 roundings, two
 *     bytes per element, and the allocator's peaks equal the memory model's
 *     16-bit line;
 *   - every strategy at P = 2/4, ZeRO 0-3: the unscaled gradients within
 *     fp16's bound of the fp32 run's (and further than fp32 noise);
 *   - dynamic loss scaling: an overflowing scale skips the update (the
 *     parameters and AdamW's step stay as they were) and halves, on every
 *     rank alike; clean steps double it after the window; a static scale
 *     never moves; a checkpoint carries the scaler and AdamW's own step, so
 *     a resumed run with skipped steps behind it repeats the straight run
 *     bit for bit;
 *   - without scaling (a static scale of 1) fp16 loses small gradients to
 *     zero that the default dynamic scale keeps;
 *   - the options' errors. */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "device_handles.h"
#include "fp16.h"
#include "memory_model.h"
#include "mpi_check.h"
#include "rng.h"
#include "strategy_check.h"
#include "train.h"

static int world_rank;

/* --- conversions ------------------------------------------------------------- */

/* x rounded to the nearest fp16 value, ties to even, in double arithmetic:
 * the spacing of fp16 values around |x| is 2^(e - 10) for |x| in [2^e,
 * 2^(e+1)), e >= -14, and 2^-24 below 2^-14; nearbyint rounds half to even
 * (the default rounding mode). */
static double reference_round(double x)
{
    if (isnan(x)) return x;
    double a = fabs(x);
    if (a >= 65520.0) return copysign(INFINITY, x);
    int e = a > 0 ? ilogb(a) : -30;
    double spacing = e >= -14 ? ldexp(1.0, e - 10) : ldexp(1.0, -24);
    return copysign(nearbyint(a / spacing) * spacing, x);
}

static int same_value(float a, double b) { return (isnan(a) && isnan(b)) || (double)a == b; }

START_TEST(conversions)
{
    long bad_trip = 0, bad_round = 0, checked = 0;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float f = spb_fp16_to_float((spb_fp16)h);
        spb_fp16 back = spb_fp16_from_float(f);
        if (isnan(f) ? !isnan(spb_fp16_to_float(back)) : back != (spb_fp16)h) bad_trip++;
        /* the value itself, by the format's definition */
        uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
        double want = e == 0x1f ? (m ? NAN : INFINITY) : e ? ldexp(1.0 + m / 1024.0, (int)e - 15) : ldexp(m, -24);
        if (!same_value(fabsf(f), want)) bad_trip++;
        /* the midpoint to the next value up must round to the even one */
        if (e < 0x1e || (e == 0x1e && m < 0x3ff)) {
            double next = spb_fp16_to_float((spb_fp16)((h & 0x7fff) + 1)), mid = (fabs((double)f) + next) / 2;
            float midf = (float)mid; /* exact: 12 significant bits */
            if (!same_value(spb_fp16_round(midf), reference_round(mid))) bad_round++;
            checked++;
        }
    }
    /* random fp32 values over the whole range, both signs */
    for (long i = 0; i < 2000000; i++) {
        uint64_t r = spb_rng_bits(5, 1, (uint64_t)i);
        int e = (int)(r % 48) - 30; /* 2^-30 .. 2^17 */
        double x = ldexp(1.0 + (double)((r >> 8) & 0xffffff) / 16777216.0, e) * ((r >> 40) & 1 ? -1 : 1);
        float xf = (float)x;
        if (!same_value(spb_fp16_round(xf), reference_round(xf))) bad_round++;
        checked++;
    }
    const float edges[] = {65504.0f, 65519.99f, 65520.0f, 1e9f, 6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f,
                           2.9802326e-08f, 1e-12f, 0.0f, -0.0f, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        if (!same_value(spb_fp16_round(edges[i]), reference_round(edges[i]))) bad_round++;
    ck_assert(isnan(spb_fp16_round(NAN)));
    ck_assert_int_eq(spb_fp16_from_float(65520.0f), 0x7c00);  /* overflow: infinity */
    ck_assert_int_eq(spb_fp16_from_float(65519.0f), 0x7bff);  /* 65504 */
    ck_assert_int_eq(spb_fp16_from_float(2.9802322e-08f), 0); /* 2^-25: a tie, to zero (even) */
    if (!world_rank)
        printf("fp16 conversions: 65536 values round-trip (%ld off), %ld roundings checked (%ld off)\n", bad_trip,
               checked, bad_round);
    ck_assert_int_eq(bad_trip, 0);
    ck_assert_int_eq(bad_round, 0);
}
END_TEST

/* --- the table ---------------------------------------------------------------- */

static void fp16_config(spb_config *c)
{
    spb_config_defaults(c);
    snprintf(c->precision, sizeof c->precision, "fp16");
}

START_TEST(the_table_stores_fp16)
{
    spb_config c;
    fp16_config(&c);
    char err[256];
    ck_assert_msg(spb_config_finalize(&c, 1, err, sizeof err) == 0, "%s", err);
    const spb_backend *be = spb_backend_for(c.device, c.precision);
    ck_assert_ptr_eq(be, &spb_backend_cpu_fp16);
    ck_assert_int_eq(spb_memory_precision(&c), SPB_BF16_MIXED); /* the same 2-byte storage */
    be->configure(&c);
    ck_assert_int_eq(spb_handles_half_format(), SPB_HALF_FP16);
    enum { N = 1000 };
    size_t before = spb_mem_get_stats()->current[SPB_MEM_ACTIVATIONS];
    float *h = be->alloc(SPB_MEM_ACTIVATIONS, N);
    ck_assert_uint_eq(spb_mem_get_stats()->current[SPB_MEM_ACTIVATIONS] - before, 2 * N);
    float v[N], back[N];
    for (int i = 0; i < N; i++) v[i] = (float)(spb_rng_normal(3, 1, (uint64_t)i) * ldexp(1.0, i % 40 - 25));
    be->staging.to_device(h, v, sizeof v);
    be->staging.to_host(back, h, sizeof back);
    for (int i = 0; i < N; i++)
        ck_assert_msg(same_value(back[i], spb_fp16_round(v[i])), "element %d: %g stored as %g", i, v[i], back[i]);
    be->free(h);
    /* bf16 takes over again once nothing is alive */
    spb_config_defaults(&c);
    snprintf(c.precision, sizeof c.precision, "bf16");
    spb_backend_cpu_bf16.configure(&c);
    ck_assert_int_eq(spb_handles_half_format(), SPB_HALF_BF16);
}
END_TEST

/* --- training -------------------------------------------------------------------- */

enum { GLOBAL_BATCH = 4 };

typedef struct run_case {
    const char *strategy, *layout;
    int P, zero, checkpoint;
} run_case;

static void case_config(spb_config *c, const run_case *k, const char *precision)
{
    spb_config_defaults(c);
    c->num_layers = 2, c->hidden_size = 32, c->num_heads = 4, c->vocab_size = 64, c->seq_length = 64;
    c->micro_batch_size = GLOBAL_BATCH / (4 / k->P), c->global_batch_size = GLOBAL_BATCH;
    c->lr = 1e-2, c->weight_decay = 0.1, c->clip_grad = 0.5, c->adam_eps = 1e-4;
    c->sp_degree = k->P, c->zero_stage = k->zero, c->checkpoint_activations = k->checkpoint;
    snprintf(c->strategy, sizeof c->strategy, "%s", k->strategy);
    snprintf(c->ring_layout, sizeof c->ring_layout, "%s", k->layout);
    snprintf(c->precision, sizeof c->precision, "%s", precision);
}

static void drop(spb_trainer *t, spb_grid *g)
{
    spb_trainer_destroy(t);
    spb_grid_destroy(g);
}

/* fp16's rounding: u = 2^-11, three bits finer than bf16's 2^-8, so
 * test_bf16.c's per-rounding RMS 1.66e-3 becomes 2.08e-4 and its bound
 * 2 x RMS x sqrt(24 + 8L) becomes 2.6e-3 at L = 2.  The loss: 1e-4 as bf16
 * (its errors average over the tokens; fp16's are smaller). */
static const double FP16_RMS = 1.66e-3 / 8.0, LOSS_BOUND = 1e-4, FP16_FLOOR = 1e-5;
static double gradient_bound(int layers) { return 2.0 * FP16_RMS * sqrt(24.0 + 8.0 * layers); }

START_TEST(fp16_tracks_fp32)
{
    static const run_case cases[] = {
        {"none", "contiguous", 1, 0, 0},     {"none", "contiguous", 1, 3, 1},   {"ulysses", "contiguous", 4, 0, 0},
        {"ulysses", "contiguous", 2, 1, 1},  {"ulysses", "contiguous", 2, 2, 0}, {"megatron", "contiguous", 2, 0, 0},
        {"megatron", "contiguous", 4, 3, 0}, {"ring", "zigzag", 4, 0, 1},        {"ring", "contiguous", 2, 3, 0},
    };
    double worst = 0, worst_loss = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float *g[2];
        double loss[2];
        const spb_gpt *shape = NULL;
        spb_trainer *t[2];
        spb_grid grid[2];
        for (int p = 0; p < 2; p++) {
            spb_config c;
            case_config(&c, &cases[i], p ? "fp16" : "fp32");
            t[p] = make(&c, MPI_COMM_WORLD, &grid[p]);
            loss[p] = spb_trainer_gradients(t[p]);
            g[p] = global_grads(t[p]); /* unscaled (spb_trainer_local_grads) */
            shape = t[p]->gpt;
            if (!p) drop(t[p], &grid[p]);
        }
        const char *where = "";
        double err = worst_tensor_error(shape, g[1], g[0], &where), lerr = fabs(loss[1] - loss[0]) / fabs(loss[0]);
        if (!world_rank)
            printf("%-8s P=%d ZeRO-%d ckpt=%d | fp16 vs fp32: loss %.2e grad %.2e (%s) | scale %g\n",
                   cases[i].strategy, cases[i].P, cases[i].zero, cases[i].checkpoint, lerr, err, where,
                   t[1]->scaler.loss_scale);
        ck_assert_msg(err <= gradient_bound(2), "%s P=%d ZeRO-%d: gradient %s off by %.2e", cases[i].strategy,
                      cases[i].P, cases[i].zero, where, err);
        ck_assert_msg(err >= FP16_FLOOR, "%s: fp16 gradients within %.1e of fp32: not rounded?", cases[i].strategy, err);
        ck_assert_double_le(lerr, LOSS_BOUND);
        worst = fmax(worst, err), worst_loss = fmax(worst_loss, lerr);
        drop(t[1], &grid[1]);
        free(g[0]), free(g[1]);
    }
    if (!world_rank)
        printf("worst over %zu cases: loss %.2e, gradient %.2e (bound %.2e)\n", sizeof cases / sizeof cases[0],
               worst_loss, worst, gradient_bound(2));
}
END_TEST

START_TEST(memory_model_equals_the_fp16_allocator)
{
    run_case k = {"ulysses", "contiguous", 2, 1, 0};
    spb_config c;
    case_config(&c, &k, "fp16");
    double measured[4], model[4];
    step_peaks_and_model(&c, measured, model);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(measured[i] == model[i], "%s: allocator %.0f, model %.0f",
                      spb_mem_category_name(spb_modelled_categories[i]), measured[i], model[i]);
}
END_TEST

/* --- loss scaling --------------------------------------------------------------- */

static uint64_t params_hash(const spb_trainer *t)
{
    long n = t->gpt->num_params;
    float *p = malloc(sizeof(float) * (size_t)n);
    spb_trainer_local_params(t, p);
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)p;
    for (long i = 0; i < 4 * n; i++) h = (h ^ b[i]) * 1099511628211ull;
    free(p);
    return h;
}

static long optimizer_step(const spb_trainer *t) { return t->zero ? t->zero->step : t->opt->step; }

START_TEST(overflow_skips_the_update_and_halves_the_scale)
{
    /* 2^40 overflows fp16 (largest 65504) at once; each skipped step halves
     * it until the gradients fit. */
    for (int zero = 0; zero <= 3; zero += 3) {
        run_case k = {"ulysses", "contiguous", 2, zero, 0};
        spb_config c;
        case_config(&c, &k, "fp16");
        c.initial_loss_scale = ldexp(1.0, 40), c.loss_scale_window = 1000;
        spb_grid g;
        spb_trainer *t = make(&c, MPI_COMM_WORLD, &g);
        int skips = 0;
        for (int s = 0; s < 40; s++) {
            uint64_t before = params_hash(t);
            long opt_before = optimizer_step(t);
            double scale_before = t->scaler.loss_scale;
            spb_trainer_step(t);
            uint64_t after = params_hash(t);
            int agree = t->skipped, all = 0;
            MPI_Allreduce(&agree, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
            ck_assert_msg(all == 0 || all == 4, "ranks disagree on skipping step %d", s);
            if (t->skipped) {
                skips++;
                ck_assert_msg(after == before, "ZeRO-%d step %d: skipped, yet the parameters changed", zero, s);
                ck_assert_int_eq(optimizer_step(t), opt_before);
                ck_assert(t->scaler.loss_scale == scale_before / 2);
                ck_assert(!isfinite(t->grad_norm));
            } else {
                ck_assert_msg(after != before, "ZeRO-%d step %d: taken, yet the parameters stayed", zero, s);
                ck_assert_int_eq(optimizer_step(t), opt_before + 1);
                ck_assert(t->scaler.loss_scale == scale_before);
                ck_assert(isfinite(t->grad_norm));
            }
        }
        if (!world_rank)
            printf("ZeRO-%d: from 2^40, %d skipped steps, scale now 2^%d; %ld updates in 40 iterations\n", zero, skips,
                   ilogb(t->scaler.loss_scale), optimizer_step(t));
        ck_assert_int_ge(skips, 20); /* 2^40 down to at most 2^20 */
        ck_assert_int_eq(t->scaler.skipped_steps, skips);
        ck_assert_int_eq(optimizer_step(t) + skips, 40);
        drop(t, &g);
    }
}
END_TEST

START_TEST(clean_steps_double_a_dynamic_scale_a_static_one_stays)
{
    run_case k = {"none", "contiguous", 1, 0, 0};
    spb_config c;
    case_config(&c, &k, "fp16");
    c.initial_loss_scale = 256, c.loss_scale_window = 3;
    spb_grid g;
    spb_trainer *t = make(&c, MPI_COMM_WORLD, &g);
    for (int s = 1; s <= 9; s++) {
        spb_trainer_step(t);
        ck_assert_int_eq(t->skipped, 0);
        ck_assert_msg(t->scaler.loss_scale == 256.0 * (1 << (s / 3)), "step %d: scale %g", s, t->scaler.loss_scale);
    }
    drop(t, &g);
    case_config(&c, &k, "fp16");
    c.loss_scale = 128;
    t = make(&c, MPI_COMM_WORLD, &g);
    for (int s = 0; s < 5; s++) spb_trainer_step(t);
    ck_assert(t->scaler.loss_scale == 128 && !t->scaler.dynamic);
    drop(t, &g);
    /* a static scale that overflows: skipped, and it stays */
    case_config(&c, &k, "fp16");
    c.loss_scale = ldexp(1.0, 40);
    t = make(&c, MPI_COMM_WORLD, &g);
    spb_trainer_step(t);
    ck_assert(t->skipped && t->scaler.loss_scale == ldexp(1.0, 40));
    drop(t, &g);
}
END_TEST

START_TEST(a_checkpoint_carries_the_scaler)
{
    /* From 2^21 the first steps are skipped, so AdamW's step trails the
     * iteration when the checkpoint is written; window 2 makes the scale move
     * after it too.  Straight: 8 steps.  Resumed: 4, save, load, 4. */
    run_case k = {"ulysses", "contiguous", 2, 1, 0};
    spb_config c;
    case_config(&c, &k, "fp16");
    c.initial_loss_scale = ldexp(1.0, 21), c.loss_scale_window = 2;
    char path[64] = "";
    if (!world_rank) snprintf(path, sizeof path, "/tmp/spb-fp16-%ld.ckpt", (long)getpid());
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    double straight[8], resumed[8], scale_straight, scale_resumed;
    spb_grid g;
    spb_trainer *t = make(&c, MPI_COMM_WORLD, &g);
    for (int s = 0; s < 8; s++) straight[s] = spb_trainer_step(t);
    scale_straight = t->scaler.loss_scale;
    long skipped_straight = t->scaler.skipped_steps;
    uint64_t params_straight = params_hash(t);
    drop(t, &g);
    t = make(&c, MPI_COMM_WORLD, &g);
    for (int s = 0; s < 4; s++) resumed[s] = spb_trainer_step(t);
    long iteration = t->iteration, opt = optimizer_step(t);
    char err[256];
    ck_assert_msg(spb_trainer_save(t, path, 1, err, sizeof err) == 0, "%s", err);
    drop(t, &g);
    t = make(&c, MPI_COMM_WORLD, &g);
    ck_assert_msg(spb_trainer_load(t, path, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(t->iteration, iteration);
    ck_assert_int_eq(optimizer_step(t), opt);
    for (int s = 4; s < 8; s++) resumed[s] = spb_trainer_step(t);
    scale_resumed = t->scaler.loss_scale;
    if (!world_rank)
        printf("resume: %ld skipped of 8 (AdamW at step %ld of iteration %ld when saved); scale 2^%d straight, 2^%d "
               "resumed\n",
               skipped_straight, opt, iteration, ilogb(scale_straight), ilogb(scale_resumed));
    ck_assert_msg(opt < iteration, "no step was skipped before the checkpoint: the test shows nothing");
    ck_assert_int_eq(t->scaler.skipped_steps, skipped_straight);
    ck_assert(scale_resumed == scale_straight);
    ck_assert_msg(!memcmp(straight, resumed, sizeof straight), "the resumed losses differ");
    ck_assert_msg(params_hash(t) == params_straight, "the resumed parameters differ");
    drop(t, &g);
    MPI_Barrier(MPI_COMM_WORLD);
    if (!world_rank) remove(path);
}
END_TEST

/* Zero gradient elements of the first step, at a static scale. */
static long zero_gradients(double scale, long *total)
{
    run_case k = {"none", "contiguous", 1, 0, 0};
    spb_config c;
    case_config(&c, &k, "fp16");
    if (scale > 0) c.loss_scale = scale;
    c.num_layers = 4, c.hidden_size = 64; /* deeper and wider: smaller gradients */
    c.seq_length = 128, c.micro_batch_size = 4, c.global_batch_size = 16; /* and 1/2048 per token */
    spb_grid g;
    spb_trainer *t = make(&c, MPI_COMM_WORLD, &g);
    spb_trainer_gradients(t);
    float *grads = global_grads(t);
    long zeros = 0;
    *total = t->gpt->num_global_params;
    for (long i = 0; i < *total; i++) zeros += grads[i] == 0.0f;
    free(grads);
    drop(t, &g);
    return zeros;
}

START_TEST(without_scaling_fp16_loses_small_gradients)
{
    long total = 0;
    long unscaled = zero_gradients(1.0, &total), scaled = zero_gradients(0.0, &total), fp32 = 0;
    {
        run_case k = {"none", "contiguous", 1, 0, 0};
        spb_config c;
        case_config(&c, &k, "fp32");
        c.num_layers = 4, c.hidden_size = 64;
        c.seq_length = 128, c.micro_batch_size = 4, c.global_batch_size = 16;
        spb_grid g;
        spb_trainer *t = make(&c, MPI_COMM_WORLD, &g);
        spb_trainer_gradients(t);
        float *grads = global_grads(t);
        for (long i = 0; i < total; i++) fp32 += grads[i] == 0.0f;
        free(grads);
        drop(t, &g);
    }
    if (!world_rank)
        printf("zero gradient elements of %ld: fp32 %ld, fp16 at scale 1 %ld, fp16 at the default scale %ld\n", total,
               fp32, unscaled, scaled);
    /* measured 199 against 8 (fp32: 0) of 212352 elements; the bound asks for
     * ten times as many zeros and at least 50 */
    ck_assert_msg(unscaled >= 10 * (scaled > 0 ? scaled : 1) && unscaled >= 50,
                  "scale 1 lost %ld gradient elements to zero, the default scale %ld", unscaled, scaled);
}
END_TEST

START_TEST(option_errors)
{
    spb_config c;
    char err[256];
    struct {
        const char *precision, *set, *want;
    } bad[] = {
        {"bf16", "loss-scale", "loss scaling applies to --precision fp16 only"},
        {"fp32", "initial-loss-scale", "loss scaling applies to --precision fp16 only"},
        {"fp16", "negative", "--loss-scale must be >= 0"},
        {"fp16", "window", "--loss-scale-window must be >= 1"},
        {"fp16", "min", "min <= initial"},
        {"fp32", "kernels", "--bf16-kernels fast: applies to --precision bf16 and fp16 only"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        spb_config_defaults(&c);
        snprintf(c.precision, sizeof c.precision, "%s", bad[i].precision);
        if (!strcmp(bad[i].set, "loss-scale")) c.loss_scale = 8;
        if (!strcmp(bad[i].set, "initial-loss-scale")) c.initial_loss_scale = 8;
        if (!strcmp(bad[i].set, "negative")) c.loss_scale = -1;
        if (!strcmp(bad[i].set, "window")) c.loss_scale_window = 0;
        if (!strcmp(bad[i].set, "min")) c.min_loss_scale = 2 * c.initial_loss_scale;
        if (!strcmp(bad[i].set, "kernels")) snprintf(c.bf16_kernels, sizeof c.bf16_kernels, "fast");
        if (!strcmp(bad[i].set, "nccl")) {
            snprintf(c.comm, sizeof c.comm, "nccl");
            snprintf(c.device, sizeof c.device, "cuda");
        }
        int rc = spb_config_finalize(&c, 1, err, sizeof err);
        ck_assert_msg(rc == -1 && strstr(err, bad[i].want), "%s/%s: rc %d, '%s'", bad[i].precision, bad[i].set, rc,
                      err);
    }
    char *argv[] = {"spbench", "--precision", "fp16", "--loss-scale-window", "4", "--initial-loss-scale", "1024", NULL};
    spb_config_defaults(&c);
    ck_assert_int_eq(spb_config_parse(7, argv, &c, err, sizeof err), 0);
    ck_assert_msg(spb_config_finalize(&c, 1, err, sizeof err) == 0, "%s", err);
    ck_assert(c.loss_scale_window == 4 && c.initial_loss_scale == 1024);
}
END_TEST

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    Suite *s = suite_create("fp16");
    TCase *tc = tcase_create("fp16");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, conversions);
    tcase_add_test(tc, option_errors);
    tcase_add_test(tc, the_table_stores_fp16);
    tcase_add_test(tc, fp16_tracks_fp32);
    tcase_add_test(tc, memory_model_equals_the_fp16_allocator);
    tcase_add_test(tc, overflow_skips_the_update_and_halves_the_scale);
    tcase_add_test(tc, clean_steps_double_a_dynamic_scale_a_static_one_stays);
    tcase_add_test(tc, a_checkpoint_carries_the_scaler);
    tcase_add_test(tc, without_scaling_fp16_loses_small_gradients);
    suite_add_tcase(s, tc);
    return spb_run_suite_and_finalize(s);
}
