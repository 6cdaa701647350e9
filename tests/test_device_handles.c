/* The handle registry (common/bf16/device_handles.h) and bf16 rounding
 * (common/bf16/bf16.h), without MPI: the death and fault checks run in forked
 * children, which an MPI process should not make.  Handles resolve at their
 * base, middle and end; pointers off every handle and ranges past an end
 * kill the job with a message; the categories count storage, never the
 * reservation; touching a handle faults; retyping a tail keeps values and
 * moves bytes; masters bind, resolve and unbind with their owner. */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bf16.h"
#include "check_run.h"
#include "device_handles.h"
#include "memory.h"

static size_t bytes_in(spb_mem_category cat) { return spb_mem_get_stats()->current[cat]; }

START_TEST(rounding_is_nearest_even)
{
    /* 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: even is 1. */
    ck_assert(spb_bf16_round(1.0f + 0x1p-8f) == 1.0f);
    /* 1 + 3·2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even). */
    ck_assert(spb_bf16_round(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
    ck_assert(spb_bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f); /* above half: up */
    ck_assert(spb_bf16_round(-(1.0f + 0x1p-8f + 0x1p-20f)) == -(1.0f + 0x1p-7f));
    ck_assert(spb_bf16_truncate(1.0f + 0x1p-7f - 0x1p-20f) == spb_bf16_from_float(1.0f));
    float largest = spb_bf16_to_float(0x7f7f); /* bf16's largest finite */
    ck_assert(spb_bf16_round(largest) == largest);
    ck_assert(spb_bf16_round(3.4e38f) > 3.4e38f);        /* past bf16's largest: infinity */
    ck_assert(spb_bf16_round(-0.0f) == 0.0f && signbit(spb_bf16_round(-0.0f)));
    ck_assert(isnan(spb_bf16_round(nanf(""))));
    ck_assert(isinf(spb_bf16_round(INFINITY)) && spb_bf16_round(-INFINITY) < 0);
    /* Every bf16 widens and narrows back to itself. */
    for (unsigned b = 0; b < 65536; b++) {
        float f = spb_bf16_to_float((spb_bf16)b);
        if (!isnan(f)) ck_assert_uint_eq(spb_bf16_from_float(f), b);
    }
}
END_TEST

START_TEST(resolve_base_middle_end)
{
    long n = 1000;
    float *h = spb_handle_alloc(SPB_MEM_ACTIVATIONS, n, SPB_DTYPE_HALF);
    spb_handle *e = spb_handle_find(h, NULL);
    ck_assert_ptr_nonnull(e);
    spb_dtype t;
    ck_assert_ptr_eq(spb_handle_resolve(h, &t), e->lo);
    ck_assert_int_eq(t, SPB_DTYPE_HALF);
    ck_assert_ptr_eq(spb_handle_resolve(h + 500, NULL), e->lo + 500);
    ck_assert_ptr_eq(spb_handle_resolve(h + n - 1, NULL), e->lo + n - 1);
    long i = -1;
    ck_assert_ptr_eq(spb_handle_find(h + 777, &i), e);
    ck_assert_int_eq(i, 777);
    ck_assert_ptr_null(spb_handle_find(h + n, NULL));          /* one past the end */
    ck_assert_ptr_null(spb_handle_find((char *)h + 2, NULL)); /* between elements */
    float host = 0;
    ck_assert_ptr_null(spb_handle_find(&host, NULL));

    float *g = spb_handle_alloc(SPB_MEM_GRADS, 10, SPB_DTYPE_F32);
    int *k = spb_handle_alloc_ints(SPB_MEM_ACTIVATIONS, 7);
    ck_assert_ptr_eq(spb_handle_resolve(g + 9, &t), (float *)spb_handle_find(g, NULL)->hi + 9);
    ck_assert_int_eq(t, SPB_DTYPE_F32);
    ck_assert_ptr_eq(spb_handle_resolve(k + 3, &t), (int *)spb_handle_find(k, NULL)->hi + 3);
    ck_assert_int_eq(t, SPB_DTYPE_I32);
    ck_assert_ptr_eq(spb_handle_at(h + 10, 990, &i, "test"), e); /* a range to the last element */
    ck_assert_int_eq(spb_handles_live(), 3);
    spb_handle_free(h);
    spb_handle_free(g);
    spb_handle_free(k);
    spb_handle_free(NULL);
    ck_assert_int_eq(spb_handles_live(), 0);
}
END_TEST

/* Runs fn in a child with stderr in a pipe; returns the wait status and
 * what the child printed. */
static int in_child(void (*fn)(void), char *out, size_t outlen)
{
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        fn();
        _exit(0);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < outlen && (r = read(fd[0], out + got, outlen - 1 - got)) > 0) got += (size_t)r;
    out[got] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

static void resolve_past_end(void)
{
    float *h = spb_handle_alloc(SPB_MEM_ACTIVATIONS, 16, SPB_DTYPE_HALF);
    spb_handle_resolve(h + 16, NULL);
}
static void range_past_end(void)
{
    float *h = spb_handle_alloc(SPB_MEM_ACTIVATIONS, 16, SPB_DTYPE_HALF);
    spb_handle_at(h + 8, 9, NULL, "an operation");
}
static void host_pointer(void)
{
    float host[4] = {0};
    spb_handle_at(host, 4, NULL, "an operation");
}
static void freed_handle(void)
{
    float *h = spb_handle_alloc(SPB_MEM_ACTIVATIONS, 16, SPB_DTYPE_HALF);
    spb_handle_free(h);
    spb_handle_resolve(h, NULL);
}
static void read_handle(void)
{
    float *h = spb_handle_alloc(SPB_MEM_ACTIVATIONS, 16, SPB_DTYPE_F32);
    volatile float x = h[3]; /* the core must never do this */
    (void)x;
}
static void write_handle(void)
{
    float *h = spb_handle_alloc(SPB_MEM_PARAMS, 1 << 20, SPB_DTYPE_HALF);
    h[(1 << 20) - 1] = 1.0f;
}

START_TEST(bad_pointers_die_with_a_message)
{
    static const struct {
        void (*fn)(void);
        const char *says;
    } cases[] = {
        {resolve_past_end, "in no device buffer"},
        {range_past_end, "an operation: elements [8, 17) of a device buffer of 16 elements (activations)"},
        {host_pointer, "an operation: "},
        {freed_handle, "in no device buffer"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char out[1024];
        int status = in_child(cases[k].fn, out, sizeof out);
        printf("dies: %s", out);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 3, "case %zu: status %d", k, status);
        ck_assert_msg(strstr(out, cases[k].says) && strstr(out, "device_handles.c:"), "case %zu said: %s", k, out);
    }
}
END_TEST

START_TEST(touching_a_handle_faults)
{
    void (*fns[])(void) = {read_handle, write_handle};
    for (size_t k = 0; k < 2; k++) {
        char out[256];
        int status = in_child(fns[k], out, sizeof out);
        ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "case %zu: status %d", k, status);
    }
}
END_TEST

START_TEST(categories_count_storage)
{
    size_t a0 = bytes_in(SPB_MEM_ACTIVATIONS), p0 = bytes_in(SPB_MEM_PARAMS), o0 = bytes_in(SPB_MEM_OPTIMIZER);
    /* A million elements reserve 4 MB of address space; bf16 stores 2 MB. */
    float *a = spb_handle_alloc(SPB_MEM_ACTIVATIONS, 1000001, SPB_DTYPE_HALF);
    ck_assert_uint_eq(bytes_in(SPB_MEM_ACTIVATIONS) - a0, 2 * 1000001);
    float *f = spb_handle_alloc(SPB_MEM_ACTIVATIONS, 3, SPB_DTYPE_F32);
    int *t = spb_handle_alloc_ints(SPB_MEM_ACTIVATIONS, 5);
    ck_assert_uint_eq(bytes_in(SPB_MEM_ACTIVATIONS) - a0, 2 * 1000001 + 12 + 20);
    float *p = spb_handle_alloc(SPB_MEM_PARAMS, 100, SPB_DTYPE_HALF);
    spb_handle_add_shadow(spb_handle_find(p, NULL), SPB_MEM_OPTIMIZER);
    ck_assert_uint_eq(bytes_in(SPB_MEM_PARAMS) - p0, 200);
    ck_assert_uint_eq(bytes_in(SPB_MEM_OPTIMIZER) - o0, 400);
    float *empty = spb_handle_alloc(SPB_MEM_ACTIVATIONS, 0, SPB_DTYPE_HALF);
    ck_assert_ptr_nonnull(empty);
    spb_handle_free(empty);
    spb_handle_free(a);
    spb_handle_free(f);
    spb_handle_free(t);
    spb_handle_free(p);
    ck_assert_uint_eq(bytes_in(SPB_MEM_ACTIVATIONS), a0);
    ck_assert_uint_eq(bytes_in(SPB_MEM_PARAMS), p0);
    ck_assert_uint_eq(bytes_in(SPB_MEM_OPTIMIZER), o0);
}
END_TEST

START_TEST(retyping_keeps_values_and_moves_bytes)
{
    size_t a0 = bytes_in(SPB_MEM_WORKSPACE);
    long n = 10;
    float *h = spb_handle_alloc(SPB_MEM_WORKSPACE, n, SPB_DTYPE_HALF);
    spb_handle *e = spb_handle_find(h, NULL);
    for (long i = 0; i < n; i++) e->lo[i] = spb_bf16_from_float(1.5f * (float)i - 3.0f);
    spb_handle_retype_tail(e, 6);
    ck_assert_int_eq(e->split, 6);
    ck_assert_uint_eq(bytes_in(SPB_MEM_WORKSPACE) - a0, 2 * 6 + 4 * 4);
    for (long i = 0; i < n; i++) {
        spb_dtype t;
        void *at = spb_handle_resolve(h + i, &t);
        float v = t == SPB_DTYPE_HALF ? spb_bf16_to_float(*(spb_bf16 *)at) : *(float *)at;
        ck_assert_int_eq(t, i < 6 ? SPB_DTYPE_HALF : SPB_DTYPE_F32);
        ck_assert(v == 1.5f * (float)i - 3.0f);
    }
    spb_handle_retype_tail(e, 8); /* already fp32 there */
    ck_assert_int_eq(e->split, 6);
    spb_handle_retype_tail(e, 0);
    ck_assert_uint_eq(bytes_in(SPB_MEM_WORKSPACE) - a0, 4 * 10);
    ck_assert(*(float *)spb_handle_resolve(h + 2, NULL) == 0.0f);
    spb_handle_free(h);
    ck_assert_uint_eq(bytes_in(SPB_MEM_WORKSPACE), a0);
}
END_TEST

START_TEST(masters_bind_and_unbind)
{
    float *p = spb_handle_alloc(SPB_MEM_PARAMS, 100, SPB_DTYPE_HALF);
    float *m = spb_handle_alloc(SPB_MEM_OPTIMIZER, 30, SPB_DTYPE_F32);
    spb_handle *ph = spb_handle_find(p, NULL), *mh = spb_handle_find(m, NULL);
    spb_handle_add_shadow(mh, SPB_MEM_OPTIMIZER);
    spb_handle_bind_masters(ph, 40, 20, mh, 10); /* p[40, 60) -> m's shadow [10, 30) */
    spb_handle_bind_masters(ph, 0, 10, mh, 0);
    ck_assert_ptr_eq(spb_handle_masters(ph, 40, 20), mh->shadow + 10);
    ck_assert_ptr_eq(spb_handle_masters(ph, 45, 5), mh->shadow + 15);
    ck_assert_ptr_eq(spb_handle_masters(ph, 0, 10), mh->shadow);
    ck_assert_ptr_null(spb_handle_masters(ph, 10, 30));
    ck_assert_int_eq(ph->num_masters, 2);
    ck_assert_int_eq(ph->masters[0].first, 0); /* kept in order */
    spb_handle_free(m);                          /* the owner goes: its ranges are forgotten */
    ck_assert_int_eq(ph->num_masters, 0);
    ck_assert_ptr_null(spb_handle_masters(ph, 40, 20));
    spb_handle_free(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("device_handles");
    TCase *tc = tcase_create("registry");
    tcase_add_test(tc, rounding_is_nearest_even);
    tcase_add_test(tc, resolve_base_middle_end);
    tcase_add_test(tc, bad_pointers_die_with_a_message);
    tcase_add_test(tc, touching_a_handle_faults);
    tcase_add_test(tc, categories_count_storage);
    tcase_add_test(tc, retyping_keeps_values_and_moves_bytes);
    tcase_add_test(tc, masters_bind_and_unbind);
    suite_add_tcase(s, tc);
    return spb_run_suite(s, CK_FORK_GETENV); /* its death and fault checks fork */
}
