/* Over 700 lines: one model whose terms (compute, each collective by phase, memory, fit) share the profile and the shapes. */
/* The performance model; see perf_model.h and docs/MODEL.md. */
#define _DEFAULT_SOURCE
#include "perf_model.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "strategy.h"
#include "sp_parts.h"
#include "flops.h"
#include "gpt.h"
#include "split.h"
#include "zero.h"

static const char *elem_names[SPB_ELEM_NUM] = {"ln_fwd", "ln_bwd", "gelu_fwd", "gelu_bwd", "xent_fwd",
                                               "xent_bwd", "add", "copy", "adam", "sumsq"};
const char *spb_elem_name(spb_elem_kind k) { return elem_names[k]; }

static const char *term_names[SPB_TERM_NUM] = {"elemwise", "optimizer", "layer_comm", "dp_comm", "bubble",
                                               "p2p", "launch", "softmax", "recompute", "latency"};
const char *spb_term_name(int bit_index)
{
    return bit_index >= 0 && bit_index < SPB_TERM_NUM ? term_names[bit_index] : "?";
}

/* Bytes per element each element-wise kernel moves through device memory
 * under bf16 mixed precision (reads + writes; fp32 master weights and AdamW
 * moments for the update).  Used when a profile gives no measured seconds. */
static const double elem_bytes_bf16[SPB_ELEM_NUM] = {
    4,  /* ln_fwd: read x, write y */
    8,  /* ln_bwd: read x, dy, dx; write dx */
    4,  /* gelu_fwd */
    6,  /* gelu_bwd: read x, dy; write dx */
    6,  /* xent_fwd: read logit, write probability (fp32 accumulate) */
    6,  /* xent_bwd */
    6,  /* add: read a, b; write a */
    4,  /* copy: read, write */
    30, /* adam: fp32 p, m, v read + write, bf16 grad read, bf16 param write */
    2,  /* sumsq */
};

/* ------------------------------------------------------------------ profiles */

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

static int op_by_name(const char *name)
{
    for (int o = 0; o < SPB_NUM_OPS; o++)
        if (!strcmp(name, spb_comm_op_name((spb_comm_op)o))) return o;
    return -1;
}

static int load_file(const char *path, spb_profile *p, char *err, size_t errlen, int depth);
static int check_profile(const char *path, const spb_profile *p, char *err, size_t errlen);

int spb_profile_load(const char *path, spb_profile *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    snprintf(p->device, sizeof p->device, "gpu");
    p->gemm_half = 128;
    p->attn_half_len = 512;
    p->sparse_eff_ratio = 1.0;
    if (load_file(path, p, err, errlen, 0)) return -1;
    return check_profile(path, p, err, errlen);
}

/* One file's keys; `include = OTHER` (relative to this file) reads another
 * profile's keys at that point, so an alias can rename or override. */
static int load_file(const char *path, spb_profile *p, char *err, size_t errlen, int depth)
{
    if (depth > 4) {
        snprintf(err, errlen, "%s: includes nested too deep", path);
        return -1;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--profile '%s': cannot open", path);
        return -1;
    }
    char line[1024];
    int lineno = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *s = trim(line);
        if (!*s) continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected 'key = value'", path, lineno);
            fclose(f);
            return -1;
        }
        *eq = '\0';
        char *key = trim(s), *val = trim(eq + 1);
        double d = strtod(val, NULL);
        int bad = 0;
        if (!strcmp(key, "include")) {
            char inc[2048];
            const char *slash = strrchr(path, '/');
            if (val[0] == '/' || !slash) snprintf(inc, sizeof inc, "%s", val);
            else snprintf(inc, sizeof inc, "%.*s/%s", (int)(slash - path), path, val);
            if (load_file(inc, p, err, errlen, depth + 1)) {
                fclose(f);
                return -1;
            }
        } else if (!strcmp(key, "name")) snprintf(p->name, sizeof p->name, "%s", val);
        else if (!strcmp(key, "device")) snprintf(p->device, sizeof p->device, "%s", val);
        else if (!strcmp(key, "precision")) {
            if (!strcmp(val, "fp32")) p->precision = SPB_FP32;
            else if (!strcmp(val, "bf16") || !strcmp(val, "fp16")) p->precision = SPB_BF16_MIXED;
            else bad = 1;
        } else if (!strcmp(key, "ranks_per_node")) p->ranks_per_node = (int)d;
        else if (!strcmp(key, "cores")) p->cores = (int)d;
        else if (!strcmp(key, "memory")) p->memory_bytes = spb_parse_bytes(val), bad = p->memory_bytes < 0;
        else if (!strcmp(key, "memory_reserved")) p->memory_reserved = spb_parse_bytes(val), bad = p->memory_reserved < 0;
        else if (!strcmp(key, "gemm_peak")) p->gemm_peak = d;
        else if (!strcmp(key, "gemm_eff")) p->gemm_eff = d;
        else if (!strcmp(key, "gemm_half")) p->gemm_half = d;
        else if (!strcmp(key, "attn_peak")) p->attn_peak = d;
        else if (!strcmp(key, "attn_fwd_eff")) p->attn_fwd_eff = d;
        else if (!strcmp(key, "attn_bwd_eff")) p->attn_bwd_eff = d;
        else if (!strcmp(key, "attn_half_len")) p->attn_half_len = d;
        else if (!strcmp(key, "sparse_eff_ratio")) p->sparse_eff_ratio = d;
        else if (!strcmp(key, "sms")) p->sms = (int)d, bad = d < 0 || d != (int)d;
        else if (!strcmp(key, "attn_tile_rows")) p->attn_tile_rows = d, bad = d < 1;
        else if (!strcmp(key, "attn_blocks_per_sm")) p->attn_blocks_per_sm = (int)d, bad = d < 1 || d != (int)d;
        else if (!strcmp(key, "mem_bw")) p->mem_bw = d;
        else if (!strcmp(key, "intra_bw")) p->intra_bw = d;
        else if (!strcmp(key, "intra_alpha")) p->intra_alpha = d;
        else if (!strcmp(key, "inter_bw")) p->inter_bw = d;
        else if (!strcmp(key, "inter_alpha")) p->inter_alpha = d;
        else if (!strcmp(key, "kernel_gap")) p->kernel_gap = d, bad = d < 0;
        else if (!strcmp(key, "softmax_fused_max_len")) p->softmax_fused_max_len = d, bad = d < 0;
        else if (!strcmp(key, "overlap_dp_min_stage")) p->overlap_dp_min_stage = (int)d, bad = d < 0 || d > 3;
        else if (!strcmp(key, "fused_kernels")) p->fused_kernels = (int)d, bad = d != 0 && d != 1;
        else if (!strcmp(key, "attn_backend")) {
            int n = p->n_attn_sw;
            bad = n >= (int)(sizeof p->attn_sw / sizeof p->attn_sw[0]) ||
                  sscanf(val, "%15s %lf %lf", p->attn_sw[n].name, &p->attn_sw[n].fwd_eff, &p->attn_sw[n].bwd_eff) != 3 ||
                  !(p->attn_sw[n].fwd_eff > 0 && p->attn_sw[n].fwd_eff <= 1 && p->attn_sw[n].bwd_eff > 0 &&
                    p->attn_sw[n].bwd_eff <= 1);
            if (!bad) p->n_attn_sw++;
        }
        else if (!strncmp(key, "elem_", 5)) {
            int k;
            for (k = 0; k < SPB_ELEM_NUM; k++)
                if (!strcmp(key + 5, elem_names[k])) break;
            if (k == SPB_ELEM_NUM) bad = 1;
            else p->elem_seconds[k] = d;
        } else if (!strcmp(key, "gemm_point")) {
            spb_gemm_point g;
            bad = p->n_gemm >= SPB_PROFILE_MAX_POINTS ||
                  sscanf(val, "%lf %lf %lf %lf %lf %lf", &g.rows, &g.in, &g.out, &g.rate[0], &g.rate[1], &g.rate[2]) != 6;
            if (!bad) p->gemm[p->n_gemm++] = g;
        } else if (!strcmp(key, "attn_point")) {
            spb_attn_point a;
            char kind[16];
            char extra[2];
            /* an optional 7th field: the (sequence, head) pairs of the call */
            int got = sscanf(val, "%15s %15s %lf %lf %lf %lf %lf %1s", a.backend, kind, &a.len, &a.hd, &a.fwd,
                             &a.bwd, &a.heads, extra);
            if (got == 6) a.heads = 0;
            bad = p->n_attn >= SPB_PROFILE_MAX_POINTS || (got != 6 && got != 7) || (got == 7 && !(a.heads >= 1));
            if (!bad) {
                a.causal = !strcmp(kind, "causal");
                p->attn[p->n_attn++] = a;
            }
        } else if (!strcmp(key, "comm_point")) {
            spb_comm_point c;
            char op[32];
            bad = p->n_comm >= SPB_PROFILE_MAX_POINTS ||
                  sscanf(val, "%31s %d %d %lf %lf", op, &c.world, &c.group, &c.alpha, &c.beta) != 5 ||
                  (c.op = op_by_name(op)) < 0;
            if (!bad) p->comm[p->n_comm++] = c;
        } else if (!strncmp(key, "band_", 5)) {
            /* the calibration's spread: slow end, fast end (spb_profile_band) */
            static const char *names[] = {"gemm_eff", "attn_scale", "mem_bw_frac", "intra_bw", "inter_bw",
                                          "kernel_gap"};
            double *slots[] = {p->band_gemm_eff, p->band_attn_scale, p->band_mem_bw_frac, p->band_intra_bw,
                               p->band_inter_bw, p->band_kernel_gap};
            int k;
            for (k = 0; k < 6; k++)
                if (!strcmp(key + 5, names[k])) break;
            double lo, hi;
            bad = k == 6 || sscanf(val, "%lf %lf", &lo, &hi) != 2 || lo < 0 || hi < 0;
            if (!bad) slots[k][0] = lo, slots[k][1] = hi, p->has_band = 1;
        } else if (!strcmp(key, "source") || !strncmp(key, "source_", 7) || !strcmp(key, "description") ||
                   !strcmp(key, "measured") || !strcmp(key, "command") || !strcmp(key, "date")) {
            /* provenance: kept in the file, not used */
        } else {
            snprintf(err, errlen, "%s:%d: unknown key '%s'", path, lineno, key);
            fclose(f);
            return -1;
        }
        if (bad) {
            snprintf(err, errlen, "%s:%d: bad value for '%s': '%s'", path, lineno, key, val);
            fclose(f);
            return -1;
        }
    }
    fclose(f);
    return 0;
}

static int check_profile(const char *path, const spb_profile *p, char *err, size_t errlen)
{
    if (!p->name[0]) {
        snprintf(err, errlen, "%s: no 'name'", path);
        return -1;
    }
    if (!p->n_gemm && !(p->gemm_peak > 0 && p->gemm_eff > 0)) {
        snprintf(err, errlen, "%s: no GEMM rate (gemm_point lines, or gemm_peak and gemm_eff)", path);
        return -1;
    }
    if (!p->n_attn && !(p->attn_peak > 0 && p->attn_fwd_eff > 0 && p->attn_bwd_eff > 0)) {
        snprintf(err, errlen, "%s: no attention rate (attn_point lines, or attn_peak and attn_*_eff)", path);
        return -1;
    }
    if (!p->n_comm && !(p->intra_bw > 0)) {
        snprintf(err, errlen, "%s: no communication model (comm_point lines, or intra_bw/inter_bw)", path);
        return -1;
    }
    for (int k = 0; k < SPB_ELEM_NUM; k++)
        if (p->elem_seconds[k] <= 0 && !(p->mem_bw > 0)) {
            snprintf(err, errlen, "%s: no elem_%s and no mem_bw", path, elem_names[k]);
            return -1;
        }
    return 0;
}

int spb_profile_band(const spb_profile *p, int fast, spb_profile *o)
{
    if (!p->has_band) return -1;
    *o = *p;
    const int e = fast ? 1 : 0;
    if (p->band_gemm_eff[e] > 0) o->gemm_eff = p->band_gemm_eff[e];
    if (p->band_attn_scale[e] > 0) {
        double f = p->band_attn_scale[e];
        o->attn_fwd_eff = fmin(1.0, p->attn_fwd_eff * f), o->attn_bwd_eff = fmin(1.0, p->attn_bwd_eff * f);
        for (int i = 0; i < o->n_attn_sw; i++)
            o->attn_sw[i].fwd_eff = fmin(1.0, p->attn_sw[i].fwd_eff * f),
            o->attn_sw[i].bwd_eff = fmin(1.0, p->attn_sw[i].bwd_eff * f);
        for (int i = 0; i < o->n_attn; i++) o->attn[i].fwd *= f, o->attn[i].bwd *= f;
    }
    if (p->band_mem_bw_frac[e] > 0) o->mem_bw = p->mem_bw * p->band_mem_bw_frac[e];
    if (p->band_intra_bw[e] > 0) o->intra_bw = p->band_intra_bw[e];
    if (p->band_inter_bw[e] > 0) o->inter_bw = p->band_inter_bw[e];
    if (p->band_kernel_gap[e] > 0) o->kernel_gap = p->band_kernel_gap[e];
    return 0;
}

/* ------------------------------------------------------------------ rates */

/* Inverse-distance weighting in log space (power 4): exact at a measured
 * point, smooth between, the nearest points' value outside the grid. */
static double idw(const double *x, int dims, const double (*pts)[3], const double *vals, int n)
{
    double wsum = 0, vsum = 0;
    for (int i = 0; i < n; i++) {
        double d2 = 0;
        for (int k = 0; k < dims; k++) {
            double d = log(x[k]) - log(pts[i][k]);
            d2 += d * d;
        }
        if (d2 < 1e-12) return vals[i];
        double w = 1.0 / (d2 * d2);
        wsum += w;
        vsum += w * log(vals[i]);
    }
    return wsum > 0 ? exp(vsum / wsum) : 0.0;
}

double spb_perf_gemm_rate(const spb_profile *p, double rows, double in, double out, int op)
{
    if (p->n_gemm) {
        static double pts[SPB_PROFILE_MAX_POINTS][3], vals[SPB_PROFILE_MAX_POINTS];
        for (int i = 0; i < p->n_gemm; i++) {
            pts[i][0] = p->gemm[i].rows, pts[i][1] = p->gemm[i].in, pts[i][2] = p->gemm[i].out;
            vals[i] = p->gemm[i].rate[op];
        }
        double x[3] = {rows, in, out};
        return idw(x, 3, (const double(*)[3])pts, vals, p->n_gemm);
    }
    double h = p->gemm_half;
    return p->gemm_peak * p->gemm_eff * rows / (rows + h) * in / (in + h) * out / (out + h);
}

/* A min-heap of slot loads: the least-loaded slot on top. */
static void heap_sift_down(double *h, int n, int i)
{
    for (;;) {
        int m = i, l = 2 * i + 1, r = l + 1;
        if (l < n && h[l] < h[m]) m = l;
        if (r < n && h[r] < h[m]) m = r;
        if (m == i) return;
        double t = h[i];
        h[i] = h[m], h[m] = t, i = m;
    }
}

double spb_perf_attn_occupancy(const spb_profile *p, double heads, double len, int causal)
{
    if (p->sms <= 0 || heads < 1 || len < 1) return 1.0;
    const double rows = p->attn_tile_rows > 0 ? p->attn_tile_rows : 128;
    const int slots = p->sms * (p->attn_blocks_per_sm > 0 ? p->attn_blocks_per_sm : 1);
    const long per_head = (long)ceil(len / rows), bh = lround(heads), tiles = per_head * bh;
    /* tile i of a head sees min(len, (i + 1) rows) keys (causal) or all len */
    double total = 0.0;
    for (long i = 0; i < per_head; i++) total += causal ? fmin(len, (i + 1) * rows) : len;
    total *= (double)bh;
    double makespan;
    if (!causal) {
        makespan = ceil((double)tiles / slots) * len; /* equal tiles: whole waves */
    } else if (tiles > (1L << 22)) {
        return 1.0; /* millions of tiles: the slots stay full */
    } else {
        /* longest first onto the least-loaded slot (what a heaviest-first
         * launch order and the block scheduler approach) */
        double *h = calloc((size_t)slots, sizeof *h);
        if (!h) return 1.0;
        for (long i = per_head - 1; i >= 0; i--)
            for (long k = 0; k < bh; k++) {
                h[0] += fmin(len, (i + 1) * rows);
                heap_sift_down(h, slots, 0);
            }
        makespan = 0.0;
        for (int k = 0; k < slots; k++) makespan = fmax(makespan, h[k]);
        free(h);
    }
    return total / (slots * makespan);
}

/* The length ramp of the profile's GPU kernels: per-tile set-up and the
 * epilogue weigh more on short key loops. */
static double attn_ramp(const spb_profile *p, double len) { return len / (len + p->attn_half_len); }

/* A point's head count; a point without one stands for any count: the call's. */
static double point_heads(const spb_attn_point *a, double heads) { return a->heads > 0 ? a->heads : heads; }

double spb_perf_attn_rate(const spb_profile *p, const char *backend, int causal, double len, double hd,
                          double heads, int backward)
{
    const double occ = spb_perf_attn_occupancy(p, heads, len, causal);
    if (p->n_attn) {
        static double pts[SPB_PROFILE_MAX_POINTS][3], vals[SPB_PROFILE_MAX_POINTS];
        static char usable[SPB_PROFILE_MAX_POINTS];
        int have_backend = 0, have_mask = 0;
        for (int i = 0; i < p->n_attn; i++) have_backend |= !strcmp(p->attn[i].backend, backend);
        for (int i = 0; i < p->n_attn; i++)
            have_mask |= p->attn[i].causal == causal && (!have_backend || !strcmp(p->attn[i].backend, backend));
        /* the backend's points of the call's mask (only the other mask
         * measured: those), and of them the head count nearest the call's:
         * the tile model carries their rates to the call's heads, where an
         * interpolation across counts would blend lengths too */
        double nearest = INFINITY;
        for (int i = 0; i < p->n_attn; i++) {
            const spb_attn_point *a = &p->attn[i];
            usable[i] = !(have_mask && a->causal != causal) && !(have_backend && strcmp(a->backend, backend));
            if (usable[i]) nearest = fmin(nearest, fabs(log(point_heads(a, heads) / heads)));
        }
        int n = 0;
        double shortest = INFINITY;
        for (int i = 0; i < p->n_attn; i++) {
            const spb_attn_point *a = &p->attn[i];
            if (!usable[i] || fabs(log(point_heads(a, heads) / heads)) > nearest + 1e-9) continue;
            pts[n][0] = a->len, pts[n][1] = a->hd, pts[n][2] = 1;
            /* the rate of a full GPU: what the point's own tile share hid */
            vals[n++] = (backward ? a->bwd : a->fwd) / spb_perf_attn_occupancy(p, point_heads(a, heads), a->len,
                                                                                a->causal);
            shortest = fmin(shortest, a->len);
        }
        /* A GPU profile (sms): a call shorter than any measured takes the
         * shortest's rate down the profile's ramp, not a blend of longer ones */
        const double at = p->sms > 0 ? fmax(len, shortest) : len;
        const double x[3] = {at, hd, 1};
        const double ramp = at > len ? attn_ramp(p, len) / attn_ramp(p, at) : 1.0;
        return idw(x, 2, (const double(*)[3])pts, vals, n) * ramp * occ;
    }
    double eff = backward ? p->attn_bwd_eff : p->attn_fwd_eff;
    for (int i = 0; backend && i < p->n_attn_sw; i++)
        if (!strcmp(p->attn_sw[i].name, backend)) eff = backward ? p->attn_sw[i].bwd_eff : p->attn_sw[i].fwd_eff;
    return p->attn_peak * eff * attn_ramp(p, len) * occ;
}

static double elem_time(const spb_profile *p, spb_elem_kind k, double n, double scale)
{
    if (n <= 0) return 0;
    if (p->elem_seconds[k] > 0) return n * p->elem_seconds[k] / scale;
    return n * elem_bytes_bf16[k] / p->mem_bw;
}

/* ------------------------------------------------------------------ communication */

/* Ranks of a group that share one node: contiguous groups fill nodes,
 * groups strided by `stride` have ranks_per_node / stride ranks per node. */
static int ranks_in_node(const spb_profile *p, int group, int stride, int world)
{
    int R = p->ranks_per_node > 0 ? p->ranks_per_node : world;
    int k = stride >= R ? 1 : R / stride;
    return k < group ? k : group;
}

static const spb_comm_point *nearest_point(const spb_profile *p, int op, int group, int world)
{
    const spb_comm_point *best = NULL;
    double best_d = 1e300;
    for (int i = 0; i < p->n_comm; i++) {
        const spb_comm_point *c = &p->comm[i];
        /* the operation first, then the group size, then the world size */
        double d = (c->op != op) * 1e6 + fabs(log((double)c->group / group)) * 1e3 + fabs(log((double)c->world / world));
        if (d < best_d) best_d = d, best = c;
    }
    return best;
}

double spb_perf_collective_time(const spb_profile *p, spb_comm_op op, double link_bytes, double payload_bytes,
                                int group, int stride, int world)
{
    if (group <= 1) return 0.0;
    if (p->n_comm) {
        const spb_comm_point *c = nearest_point(p, op, group, world);
        return c ? c->alpha + link_bytes / c->beta : 0.0;
    }
    int k = ranks_in_node(p, group, stride, world);
    if (k >= group) return p->intra_alpha + link_bytes / p->intra_bw;
    double inter_bw = p->inter_bw, intra_bw = p->intra_bw;
    switch (op) {
    case SPB_OP_ALLTOALL: {
        /* Each rank sends payload/group to every other rank: (group - k)
         * blocks leave the node through its own NIC, (k - 1) stay on NVSwitch,
         * at the same time. */
        double off = payload_bytes * (group - k) / group, on = payload_bytes * (k - 1) / group;
        double t_off = off / inter_bw, t_on = on / intra_bw;
        return p->inter_alpha + (t_off > t_on ? t_off : t_on);
    }
    case SPB_OP_SENDRECV:
        /* A ring: the rank at a node boundary sends over its NIC. */
        return p->inter_alpha + link_bytes / inter_bw;
    default: {
        /* Ring algorithms (NCCL): one ring per NIC, each crossing every node
         * boundary once; the k ranks of the group in a node share the node's
         * NICs with the other groups running at the same time, so the ring's
         * per-rank bandwidth is min(NVSwitch, k x NIC). */
        double bw = k * inter_bw < intra_bw ? k * inter_bw : intra_bw;
        return p->inter_alpha + link_bytes / bw;
    }
    }
}

/* ------------------------------------------------------------------ bytes */

typedef struct plan_item {
    spb_comm_op op;
    spb_comm_phase phase;
    int group, stride;
    double calls, payload, link;
} plan_item;

enum { MAX_ITEMS = 64 };
typedef struct item_list {
    int n;
    plan_item it[MAX_ITEMS];
} item_list;

/* payload < 0: link bytes over the operation's bus factor (a collective
 * over one rank moves nothing over a link: its payload must be given) */
static void add_item_payload(item_list *l, spb_comm_plan *plan, spb_comm_op op, spb_comm_phase phase, int group,
                             int stride, double calls, double link, double payload)
{
    if (link <= 0 && calls <= 0) return;
    double bf = spb_comm_bus_factor(op, group);
    if (payload < 0) payload = bf > 0 ? link / bf : 0;
    if (l && l->n < MAX_ITEMS) l->it[l->n++] = (plan_item){op, phase, group, stride, calls, payload, link};
    plan->calls[op][phase] += calls;
    plan->payload[op][phase] += payload;
    plan->link[op][phase] += link;
    plan->group[op][phase] = group;
    plan->strided[op][phase] = stride > 1;
}

static void add_item(item_list *l, spb_comm_plan *plan, spb_comm_op op, spb_comm_phase phase, int group, int stride,
                     double calls, double link)
{
    add_item_payload(l, plan, op, phase, group, stride, calls, link, -1);
}

/* How a strategy's per-layer volume splits over operations and calls
 * (strategies/NAME.c: which collectives the hooks issue). */
typedef struct layer_ops {
    int n;
    spb_comm_op op[2];
    double share_fwd[2], share_bwd[2];
    double calls_fwd[2], calls_bwd[2];
} layer_ops;

static int strategy_layer_ops(const spb_config *c, layer_ops *o)
{
    const int P = c->sp_degree;
    memset(o, 0, sizeof *o);
    if (!strcmp(c->strategy, "none")) return 0;
    if (!strcmp(c->strategy, "ulysses")) {
        /* all-to-all (or allgather) of QKV and of O forward; dO and dQKV back */
        o->n = 1;
        o->op[0] = !strcmp(c->ulysses_comm, "allgather") ? SPB_OP_ALLGATHER : SPB_OP_ALLTOALL;
        o->share_fwd[0] = o->share_bwd[0] = 1;
        o->calls_fwd[0] = o->calls_bwd[0] = 2;
        return 0;
    }
    if (!strcmp(c->strategy, "megatron")) {
        /* forward: 2 allgathers + 2 reduce-scatters of one region each;
         * backward: 4 allgathers (2 output gradients, 2 LayerNorm re-gathers)
         * + 2 reduce-scatters (strategies/megatron_sp.c) */
        o->n = 2;
        o->op[0] = SPB_OP_ALLGATHER, o->op[1] = SPB_OP_REDUCE_SCATTER;
        o->share_fwd[0] = o->share_fwd[1] = 0.5;
        o->share_bwd[0] = 4.0 / 6.0, o->share_bwd[1] = 2.0 / 6.0;
        o->calls_fwd[0] = o->calls_fwd[1] = 2;
        o->calls_bwd[0] = 4, o->calls_bwd[1] = 2;
        return 0;
    }
    if (!strcmp(c->strategy, "ring")) {
        /* P-1 K/V hops forward; P-1 K/V + P-1 dK/dV hops + 1 home run back */
        o->n = 1;
        o->op[0] = SPB_OP_SENDRECV;
        o->share_fwd[0] = o->share_bwd[0] = 1;
        o->calls_fwd[0] = P - 1, o->calls_bwd[0] = 2.0 * P - 1;
        return 0;
    }
    if (!strcmp(c->strategy, "allgather-kv")) {
        /* allgather of K/V forward; allgather again + reduce-scatter of
         * dK/dV back, equal halves (strategies/allgather_kv.c) */
        o->n = 2;
        o->op[0] = SPB_OP_ALLGATHER, o->op[1] = SPB_OP_REDUCE_SCATTER;
        o->share_fwd[0] = 1, o->share_fwd[1] = 0;
        o->share_bwd[0] = o->share_bwd[1] = 0.5;
        o->calls_fwd[0] = 1, o->calls_fwd[1] = 0;
        o->calls_bwd[0] = o->calls_bwd[1] = 1;
        return 0;
    }
    /* hybrid: two groups, hybrid_items */
    return -1;
}

/* The hybrid's items (strategies/hybrid.c): per layer and micro-batch, the
 * exchange (2 all-to-alls or allgathers forward, 2 back) over the U
 * contiguous ranks of a Ulysses group, and the ring over the R = P/U ranks
 * strided by U that hold the same heads: R-1 hops forward, 2R-1 back.
 * Bytes from the hooks: the hybrid's ring block (H/U heads of N/R tokens)
 * is plain ring's block at degree P, so ring's comm_volume over its P-1
 * (2P-1) hops gives one hop; the rest of the hybrid's comm_volume is the
 * exchange.  An exchange over one rank (U = 1) still records its calls and
 * payload (Ulysses' per-rank buffer; allgather: U/P of Ulysses' at P). */
static void hybrid_items(const spb_config *c, double scale, double per_iter, spb_comm_plan *plan, item_list *items)
{
    const int P = c->sp_degree, U = c->ulysses_degree > 0 ? c->ulysses_degree : P, R = P / U;
    const int gather = !strcmp(c->ulysses_comm, "allgather");
    const spb_comm_op xop = gather ? SPB_OP_ALLGATHER : SPB_OP_ALLTOALL;
    /* the strategy's own parts (strategies/hybrid.c): exchange payload and ring block, K/V heads included */
    double payload, block;
    spb_hybrid_volume_parts(c, P, &payload, &block);
    const double ring_calls_b = R > 1 ? 2.0 * R - 1 : 0; /* R = 1: no ring, no home run */
    const double ring_f = (R - 1) * block, ring_b = ring_calls_b * block; /* P | N */
    double x_f = payload * spb_comm_bus_factor(xop, U), x_b = x_f;
    double xp_f = payload, xp_b = payload;
    double r_f = ring_f, r_b = ring_b;
    if (P > 1 && (!spb_split_is_even(c->seq_length, P) || c->num_heads % U)) {
        /* uneven shares or heads (as comm_volume decides): each phase's busiest rank (the one comm_volume
         * reports: the largest exchange + ring sum), its two parts each on
         * its own group */
        double best_f = -1, best_b = -1;
        for (int g = 0; g < R; g++)
            for (int u = 0; u < U; u++) {
                spb_hybrid_rank_bytes rb = spb_hybrid_uneven_rank_bytes(c, P, g, u);
                if (rb.exchange_link[0] + rb.ring[0] > best_f)
                    best_f = rb.exchange_link[0] + rb.ring[0], x_f = rb.exchange_link[0],
                    xp_f = rb.exchange_payload[0], r_f = rb.ring[0];
                if (rb.exchange_link[1] + rb.ring[1] > best_b)
                    best_b = rb.exchange_link[1] + rb.ring[1], x_b = rb.exchange_link[1],
                    xp_b = rb.exchange_payload[1], r_b = rb.ring[1];
            }
    }
    const int passes = c->checkpoint_activations ? 3 : 2;
    for (int k = 0; k < passes; k++) {
        const spb_comm_phase ph = k == 0 ? SPB_PHASE_FORWARD : k == 1 ? SPB_PHASE_BACKWARD : SPB_PHASE_RECOMPUTE;
        const int bwd = ph == SPB_PHASE_BACKWARD;
        add_item_payload(items, plan, xop, ph, U, 1, 2 * per_iter, (bwd ? x_b : x_f) * scale * per_iter,
                         (bwd ? xp_b : xp_f) * scale * per_iter);
        add_item(items, plan, SPB_OP_SENDRECV, ph, R, U, (bwd ? ring_calls_b : R - 1) * per_iter,
                 (bwd ? r_b : r_f) * scale * per_iter);
    }
}

static int build_plan(const spb_config *c, int world, double elem_bytes, double grad_bytes, spb_comm_plan *plan,
                      item_list *items)
{
    memset(plan, 0, sizeof *plan);
    if (items) items->n = 0;
    const spb_strategy *s = spb_strategy_by_name(c->strategy);
    layer_ops lo;
    const int hybrid = s && !strcmp(c->strategy, "hybrid");
    if (!s || (strategy_layer_ops(c, &lo) && !hybrid)) return -1;
    const int P = c->sp_degree;
    const double per_iter = (double)c->num_layers * spb_config_accum_steps(c, world);
    if (P > 1 && hybrid) hybrid_items(c, elem_bytes / 4.0, per_iter, plan, items);
    else if (P > 1 && s->comm_volume) {
        spb_comm_volume v = s->comm_volume(c, P);
        const double scale = elem_bytes / 4.0; /* comm_volume is fp32 bytes */
        for (int k = 0; k < lo.n; k++) {
            add_item(items, plan, lo.op[k], SPB_PHASE_FORWARD, P, 1, lo.calls_fwd[k] * per_iter,
                     v.forward_bytes * lo.share_fwd[k] * scale * per_iter);
            add_item(items, plan, lo.op[k], SPB_PHASE_BACKWARD, P, 1, lo.calls_bwd[k] * per_iter,
                     v.backward_bytes * lo.share_bwd[k] * scale * per_iter);
            if (c->checkpoint_activations)
                add_item(items, plan, lo.op[k], SPB_PHASE_RECOMPUTE, P, 1, lo.calls_fwd[k] * per_iter,
                         v.forward_bytes * lo.share_fwd[k] * scale * per_iter);
        }
    }
    spb_comm_item zi[SPB_ZERO_MAX_ITEMS];
    int nz = spb_zero_comm_items(c, world, zi);
    for (int k = 0; k < nz; k++) {
        int stride = zi[k].group == SPB_GROUP_DP ? P : 1;
        double gs = grad_bytes / 4.0;
        if (items && items->n < MAX_ITEMS)
            items->it[items->n++] = (plan_item){zi[k].op, zi[k].phase, zi[k].group_size, stride, zi[k].calls,
                                                zi[k].payload_bytes * gs, zi[k].link_bytes * gs};
        plan->calls[zi[k].op][zi[k].phase] += zi[k].calls;
        plan->payload[zi[k].op][zi[k].phase] += zi[k].payload_bytes * gs;
        plan->link[zi[k].op][zi[k].phase] += zi[k].link_bytes * gs;
        plan->group[zi[k].op][zi[k].phase] = zi[k].group_size;
        plan->strided[zi[k].op][zi[k].phase] = stride > 1;
    }
    return 0;
}

int spb_perf_comm_plan(const spb_config *cfg, int world_size, double elem_bytes, double grad_bytes,
                       spb_comm_plan *plan)
{
    return build_plan(cfg, world_size, elem_bytes, grad_bytes, plan, NULL);
}

/* ------------------------------------------------------------------ compute */

typedef struct compute {
    double gemm, attn, other;    /* seconds */
    double gemm_flops, attn_flops;
    double softmax;              /* seconds of attn that are the unfused score matrix's HBM traffic */
} compute;

static void gemm(compute *c, const spb_profile *p, double scale, double rows, double in, double out, int op,
                 double times)
{
    double flops = 2.0 * rows * in * out * times;
    c->gemm_flops += flops;
    c->gemm += flops / (spb_perf_gemm_rate(p, rows, in, out, op) * scale);
}

/* forward of y = x W^T, or its backward (d input and d weight) */
static void linear(compute *c, const spb_profile *p, double scale, double rows, double in, double out, int backward,
                   double times)
{
    if (!backward) {
        gemm(c, p, scale, rows, in, out, 0, times);
    } else {
        gemm(c, p, scale, rows, in, out, 1, times);
        gemm(c, p, scale, rows, in, out, 2, times);
    }
}

/* one attention call over `heads` (sequence, head) pairs of len queries and keys */
/* Bytes per score element an unfused attention moves through HBM (16-bit
 * scores), by implementation:
 * - SPB_SCORES_MEGATRON_FUSED: Megatron-LM's fused scale-mask-softmax kernel
 *   reads and writes the scores once: forward 2 + 2, backward probabilities,
 *   their gradient and the score gradient 2 + 2 + 2;
 * - SPB_SCORES_MEGATRON_EAGER: its fallback beyond softmax_fused_max_len keys
 *   (megatron/model/fused_softmax.py, forward_torch_softmax): to fp32 (2 + 4),
 *   scale (4 + 4), mask (4 + 4), softmax (4 + 4), back to 16 bits (4 + 2) =
 *   36 forward; through autograd 6 + 12 + 8 + 8 + 6 = 40 backward;
 * - SPB_SCORES_TORCH: PyTorch attention in 16 bits as the FlashAttention
 *   repository's SelfAttention (flash_attn/modules/mha.py) writes it: add
 *   the causal mask (scores 2, mask 2, out 2), softmax (2 + 2) = 10 forward;
 *   softmax backward 2 + 2 + 2 (the add passes its gradient through) = 6.
 * Attention dropout adds, each way, a read, a write and a one-byte mask. */
double spb_perf_unfused_score_bytes(int backward, int dropout, int impl)
{
    static const double fwd[3] = {4, 36, 10}, bwd[3] = {6, 40, 6};
    if (impl < 0 || impl > 2) impl = 0;
    return (backward ? bwd[impl] : fwd[impl]) + (dropout ? 5.0 : 0.0);
}

/* Megatron-LM's attention before FlashAttention: Q K^T and P V as batched
 * products at the GEMM rate of their shapes, over the whole len x len score
 * matrix (a causal mask is applied in the softmax, nothing is skipped), and
 * the score matrix through HBM at mem_bw. */
static void unfused_attn_call(compute *c, const spb_profile *p, double scale, const spb_perf_options *o,
                              double heads, double hd, double len, int backward)
{
    if (!backward) {
        gemm(c, p, scale, len, hd, len, 0, heads); /* S = Q K^T */
        gemm(c, p, scale, len, len, hd, 0, heads); /* O = P V */
    } else {
        gemm(c, p, scale, len, len, hd, 2, heads); /* dV = P^T dO */
        gemm(c, p, scale, len, hd, len, 1, heads); /* dP = dO V^T */
        gemm(c, p, scale, len, len, hd, 1, heads); /* dQ = dS K */
        gemm(c, p, scale, len, len, hd, 2, heads); /* dK = dS^T Q */
    }
    if (!(o->ablate & SPB_TERM_SOFTMAX) && p->mem_bw > 0) {
        int impl = !strcmp(o->backend, "torch") ? SPB_SCORES_TORCH
                   : (p->softmax_fused_max_len <= 0 || len <= p->softmax_fused_max_len) ? SPB_SCORES_MEGATRON_FUSED
                                                                                      : SPB_SCORES_MEGATRON_EAGER;
        double ts = heads * len * len * spb_perf_unfused_score_bytes(backward, o->dropout, impl) / (p->mem_bw * scale);
        c->attn += ts;
        c->softmax += ts;
    }
}

static void attn_call(compute *c, const spb_profile *p, double scale, const spb_perf_options *o, double heads,
                      double pairs_per_head, double hd, int causal, double len, int backward)
{
    if (!strcmp(o->backend, "unfused") || !strcmp(o->backend, "torch")) {
        compute g = {0};
        unfused_attn_call(&g, p, scale, o, heads, hd, len, backward);
        c->attn += g.gemm + g.attn, c->attn_flops += g.gemm_flops, c->softmax += g.softmax;
        return;
    }
    double flops = (backward ? 10.0 : 4.0) * hd * heads * pairs_per_head * o->attn_density;
    double rate = spb_perf_attn_rate(p, o->backend, causal, len, hd, heads, backward) * scale;
    if (o->attn_density < 1.0) rate *= p->sparse_eff_ratio;
    c->attn_flops += flops;
    c->attn += flops / rate;
}

static void elems(compute *c, const spb_profile *p, double scale, spb_elem_kind k, double n)
{
    c->other += elem_time(p, k, n, scale);
}

typedef struct dims {
    double B, N, P, T, C, F, H, hd, V, tp, Ttp, BR, BT, Ca, Fl, Hl, G;
    double U, R, Tr;     /* ring attention's groups: R ranks strided by U (U heads-exchange degree), blocks of
                            Tr = ⌈N/R⌉ tokens (the largest block: split.h) */
    double Hp;           /* query heads the busiest rank attends: Hl over the G head blocks, ⌈Hl/G⌉ when uneven */
    int uneven_heads;    /* Ulysses with G ∤ Hl: blocks of ⌈Hl/G⌉ and ⌊Hl/G⌋ heads (split.h; no GQA then) */
    double Bseq;         /* rows LayerNorm, dropout and residuals run on: BT, or BR without sequence parallelism */
    double kvb;          /* K/V heads per head block (grouped-query attention; common/core/gpt.c's kv_block) */
    double gated;        /* 2 under SwiGLU (fc computes [gate | up]), else 1 */
    double KVw;          /* one token's K/V heads, G·hd (allgather-kv's gathered rows are 2·KVw) */
    int ring, zigzag, causal, dropout, fused, agkv;
} dims;

static dims dims_of(const spb_config *c)
{
    dims d;
    d.B = c->micro_batch_size, d.N = c->seq_length, d.P = c->sp_degree;
    d.T = (double)spb_split_max(c->seq_length, c->sp_degree); /* the largest rank's share (split.h) */
    d.C = c->hidden_size, d.F = c->ffn_hidden_size, d.H = c->num_heads, d.hd = d.C / d.H, d.V = c->vocab_size;
    d.tp = !strcmp(c->strategy, "megatron") ? d.P : 1;
    d.Ttp = d.tp > 1 ? d.N : d.T, d.BR = d.B * d.Ttp, d.BT = d.B * d.T;
    d.Ca = d.C / d.tp, d.Fl = d.F / d.tp, d.Hl = d.H / d.tp;
    d.G = !strcmp(c->strategy, "ulysses") ? d.P : 1;
    d.gated = c->swiglu ? 2 : 1;
    d.ring = !strcmp(c->strategy, "ring");
    d.U = 1, d.R = d.P;
    if (!strcmp(c->strategy, "hybrid")) {
        /* Ulysses over U ranks (U head blocks, H/U heads a rank), ring attention over R = P/U; R = 1 is Ulysses */
        d.U = d.G = c->ulysses_degree > 0 ? c->ulysses_degree : d.P;
        d.R = d.P / d.U;
        d.ring = d.R > 1;
    }
    d.Tr = (double)spb_split_max(c->seq_length, (int)d.R);
    /* uneven head groups (Ulysses, H mod P != 0: strategies/ulysses.c): the
     * first Hl mod G ranks attend one head more, and the step waits for them */
    d.uneven_heads = d.G > 1 && !spb_split_is_even((long)d.Hl, (int)d.G);
    d.Hp = (double)spb_split_max((long)d.Hl, (int)d.G);
    {
        /* this rank's K/V heads, over the G head blocks (Ulysses: P; hybrid: U; set above); at
         * least one: Megatron-SP with fewer K/V heads than ranks holds one replicated head, whose
         * gradient all-reduce comes with spb_zero_comm_items below */
        double kv = (c->num_query_groups > 0 ? c->num_query_groups : c->num_heads) / d.tp;
        d.kvb = kv >= d.G ? kv / d.G : 1;
    }
    d.agkv = !strcmp(c->strategy, "allgather-kv");
    d.KVw = (c->num_query_groups > 0 ? c->num_query_groups : c->num_heads) * d.hd;
    d.zigzag = (d.ring || d.agkv) && !strcmp(c->ring_layout, "zigzag");
    d.causal = c->causal;
    d.Bseq = d.BT, d.dropout = 0, d.fused = 0;
    return d;
}

static double pairs_square(double n, int causal) { return causal ? n * (n + 1) / 2 : n * n; }

/* Matrix products of one layer (forward or backward) for one micro-batch. */
static void layer_gemms(compute *c, const spb_profile *p, double s, const dims *d, int bwd)
{
    const double kv_width = d->kvb * d->hd; /* K or V of a head block */
    if (d->uneven_heads) {
        /* each block its own width: m blocks of ⌈Hl/G⌉ heads, the rest of
         * ⌊Hl/G⌋, Q, K and V of each (K/V heads = query heads) */
        const double m = fmod(d->Hl, d->G), big = d->Hp * d->hd, small = (d->Hp - 1) * d->hd;
        linear(c, p, s, d->BR, d->C, big, bwd, 3 * m);
        linear(c, p, s, d->BR, d->C, small, bwd, 3 * (d->G - m));
        linear(c, p, s, d->BR, big, d->C, bwd, m);
        linear(c, p, s, d->BR, small, d->C, bwd, d->G - m);
    } else if (d->G == 1) {
        linear(c, p, s, d->BR, d->C, d->Ca + 2 * kv_width, bwd, 1);
    } else { /* head blocks (Ulysses): Q, K and V of each block */
        linear(c, p, s, d->BR, d->C, d->Ca / d->G, bwd, d->G);
        linear(c, p, s, d->BR, d->C, kv_width, bwd, 2 * d->G);
    }
    if (!d->uneven_heads) linear(c, p, s, d->BR, d->Ca / d->G, d->C, bwd, d->G);
    linear(c, p, s, d->BR, d->C, d->gated * d->Fl, bwd, 1);
    linear(c, p, s, d->BR, d->Fl, d->C, bwd, 1);
}

/* Ring attention of one layer: per-step compute of the slowest rank, for
 * the overlap with the transfers.  first: step 0 (own block); later: each
 * of the steps 1..P-1. */
static void ring_steps(const spb_profile *p, double s, const spb_perf_options *o, const dims *d, int bwd,
                       compute *first, compute *later)
{
    double BH = d->B * d->Hp; /* ring: all heads; hybrid: H/U on the head side */
    memset(first, 0, sizeof *first);
    memset(later, 0, sizeof *later);
    if (!d->zigzag) {
        double T = d->Tr;
        attn_call(first, p, s, o, BH, pairs_square(T, d->causal), d->hd, d->causal, T, bwd);
        /* steps >= 1: the slowest rank (the last) sees the whole block */
        attn_call(later, p, s, o, BH, T * T, d->hd, 0, T, bwd);
    } else {
        /* each chunk pair a call over BH heads: the factors count the calls */
        double cch = d->Tr / 2;
        if (d->causal) {
            attn_call(first, p, s, o, BH, 2 * pairs_square(cch, 1), d->hd, 1, cch, bwd);
            attn_call(first, p, s, o, BH, cch * cch, d->hd, 0, cch, bwd);
            attn_call(later, p, s, o, BH, 2 * cch * cch, d->hd, 0, cch, bwd);
        } else {
            attn_call(first, p, s, o, BH, 4 * cch * cch, d->hd, 0, cch, bwd);
            attn_call(later, p, s, o, BH, 4 * cch * cch, d->hd, 0, cch, bwd);
        }
    }
}

static void acc(compute *a, const compute *b, double times)
{
    a->gemm += b->gemm * times, a->attn += b->attn * times, a->other += b->other * times;
    a->softmax += b->softmax * times;
    a->gemm_flops += b->gemm_flops * times, a->attn_flops += b->attn_flops * times;
}
static double total(const compute *c) { return c->gemm + c->attn + c->other; }

/* Attention of one layer, forward or backward, one micro-batch, without ring:
 * Ulysses' and Megatron-SP's calls hold H/P heads of every sequence (uneven
 * head groups: the busiest rank's ⌈H/P⌉, whose call the step waits for). */
static void layer_attention(compute *c, const spb_profile *p, double s, const spb_perf_options *o, const dims *d,
                            int bwd)
{
    if (d->agkv) {
        /* allgather-kv (strategies/allgather_kv.c): each of this rank's
         * query runs (ring's layout) in one call over all H heads against
         * the keys it can see (causal: up to its last position); priced for
         * the slowest rank, whose calls bound the step */
        compute worst = {0};
        for (int r = 0; r < (int)d->P; r++) {
            spb_ring_run runs[SPB_RING_MAX_RUNS];
            int n = spb_ring_layout_runs(d->zigzag, (long)d->N, (int)d->P, r, runs);
            compute mine = {0};
            for (int k = 0; k < n; k++) {
                double len = runs[k].len, pos = (double)runs[k].pos;
                double pairs = d->causal ? len * pos + len * (len + 1) / 2 : len * d->N;
                attn_call(&mine, p, s, o, d->B * d->H, pairs, d->hd, d->causal, d->causal ? pos + len : d->N, bwd);
            }
            if (total(&mine) > total(&worst)) worst = mine;
        }
        acc(c, &worst, 1);
        return;
    }
    attn_call(c, p, s, o, d->B * d->Hp, pairs_square(d->N, d->causal), d->hd, d->causal, d->N, bwd);
}

/* Element-wise work of one layer (strategies' copies included). */
static void layer_other(compute *c, const spb_profile *p, double s, const dims *d, int bwd)
{
    double BT = d->BT, BR = d->BR, C = d->C, BS = d->Bseq;
    /* hidden dropout, 2 a layer: read, write and a one-byte mask = 5/4 of a copy */
    if (d->dropout) elems(c, p, s, SPB_ELEM_COPY, 2 * 1.25 * BS * C);
    if (!bwd) {
        elems(c, p, s, SPB_ELEM_LN_FWD, 2 * BS * C);
        elems(c, p, s, SPB_ELEM_ADD, 4 * BS * C);                 /* residuals, row biases */
        if (!d->fused) elems(c, p, s, SPB_ELEM_COPY, BR * (3 * d->Ca + d->Fl));  /* biases into outputs */
        elems(c, p, s, SPB_ELEM_GELU_FWD, BR * d->Fl);
        if (d->tp > 1 && !d->fused) elems(c, p, s, SPB_ELEM_COPY, 4 * BR * C); /* region <-> blocks */
        if (d->agkv) /* pack local K/V; gathered blocks to global positions */
            elems(c, p, s, SPB_ELEM_COPY, 2 * d->KVw * (BT + d->B * d->N));
        if (d->ring) {
            elems(c, p, s, SPB_ELEM_COPY, 3 * BT * C);            /* pack K,V; clear O */
            elems(c, p, s, SPB_ELEM_ADD, 2 * d->R * BT * C);     /* log-sum-exp merges */
        }
    } else {
        elems(c, p, s, SPB_ELEM_LN_BWD, 2 * BS * C);
        elems(c, p, s, SPB_ELEM_GELU_BWD, BR * d->Fl);
        elems(c, p, s, SPB_ELEM_ADD, BR * (3 * d->Ca + d->Fl) + 4 * BS * C); /* bias grads, residual grads */
        if (d->tp > 1 && !d->fused) elems(c, p, s, SPB_ELEM_COPY, 6 * BR * C);
        if (d->agkv) /* the gather again, dK/dV cleared, back to owner order, into dQKV */
            elems(c, p, s, SPB_ELEM_COPY, 2 * d->KVw * (2 * BT + 3 * d->B * d->N));
        if (d->ring) {
            elems(c, p, s, SPB_ELEM_COPY, (7 + 2 * d->R) * BT * C); /* clear dQKV, pack, per-step clears, home copy */
            elems(c, p, s, SPB_ELEM_ADD, 2 * (d->R - 1) * BT * C);  /* received dK/dV */
        }
    }
}

static void head(compute *c, const spb_profile *p, double s, const dims *d, int bwd)
{
    linear(c, p, s, d->BT, d->C, d->V, bwd, 1);
    elems(c, p, s, bwd ? SPB_ELEM_LN_BWD : SPB_ELEM_LN_FWD, d->BT * d->C);
    elems(c, p, s, bwd ? SPB_ELEM_XENT_BWD : SPB_ELEM_XENT_FWD, d->BT * d->V);
    elems(c, p, s, SPB_ELEM_ADD, d->BT * d->C); /* embedding */
    if (bwd) elems(c, p, s, SPB_ELEM_COPY, d->BT * d->C);
}


/* Whether the configuration is one of the Llama variants (docs/FORMATS.md;
 * after spb_config_finalize). */
static int is_variant(const spb_config *c)
{
    return (c->num_query_groups > 0 && c->num_query_groups != c->num_heads) || c->rope || c->rmsnorm || c->swiglu ||
           c->untie_embeddings_and_output_weights || c->disable_bias_linear;
}

/* Parameters this rank holds (before ZeRO) and owns under ZeRO >= 1. */
static void param_counts(const spb_config *c, int world, double *local, double *owned)
{
    double C = c->hidden_size, F = c->ffn_hidden_size, L = c->num_layers;
    double tp = !strcmp(c->strategy, "megatron") ? c->sp_degree : 1;
    double rep = (double)c->vocab_size * C + (double)c->max_position_embeddings * C + L * 6.0 * C + 2.0 * C;
    double shard = L * (3.0 * C * C + 3.0 * C + C * C + F * C + F + C * F);
    if (is_variant(c)) {
        /* the variants' tensors, by the core's own table (common/core/gpt.c): the
         * split ones are the tensor-parallel shards */
        long n_local = 0, n_global = 0;
        int n = spb_gpt_tensor_table(c, 1, NULL, &n_local, &n_global);
        spb_param_tensor *t = calloc((size_t)n, sizeof *t);
        spb_gpt_tensor_table(c, tp > 1 ? (int)tp : 2, t, &n_local, &n_global);
        rep = shard = 0;
        for (int k = 0; k < n; k++) *(t[k].split == SPB_REPLICATED ? &rep : &shard) += (double)t[k].grows * t[k].gcols;
        free(t);
    }
    *local = rep + shard / tp;
    /* replicated tensors are cut over D x P ranks, tensor-parallel shards over D */
    double shard_group = tp > 1 ? world / c->sp_degree : world;
    *owned = c->zero_stage >= 1 ? rep / world + shard / tp / shard_group : *local;
}

void spb_perf_pipeline_terms(int pp, int vpp, double micro_steps, double t_micro, double t_msg, double *bubble,
                             double *p2p)
{
    if (vpp < 1) vpp = 1;
    if (pp <= 1) {
        *bubble = 0, *p2p = 0;
        return;
    }
    *bubble = (double)(pp - 1) / vpp * t_micro;
    *p2p = (2.0 * vpp * micro_steps + 2.0 * (pp - 1)) * t_msg;
}

/* Kernels one layer launches per micro-batch, forward (backward: twice as
 * many): 2 LayerNorms, 4 products, the attention (1 fused; 3 unfused: two
 * batched products and the softmax), GELU, 2 residual adds, 2 bias adds or
 * dropouts, and the head's 4. */
static double kernels_per_layer_fwd(const spb_perf_options *o)
{
    int unfused = !strcmp(o->backend, "unfused") || !strcmp(o->backend, "torch");
    return 12.0 + (unfused ? 2.0 + (o->dropout ? 1.0 : 0.0) : 0.0);
}

int spb_perf_predict(const spb_config *cfg, int world, const spb_profile *prof_in, const spb_perf_options *opt,
                     spb_perf_prediction *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    spb_perf_options o = opt ? *opt : (spb_perf_options){.precision = prof_in->precision, .attn_density = 1.0};
    /* ablating the collectives' latency: a copy of the profile without alpha */
    const spb_profile *prof = prof_in;
    spb_profile *noalpha = NULL;
    if (o.ablate & SPB_TERM_LATENCY) {
        noalpha = malloc(sizeof *noalpha);
        if (!noalpha) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        *noalpha = *prof_in;
        noalpha->intra_alpha = noalpha->inter_alpha = 0;
        for (int i = 0; i < noalpha->n_comm; i++) noalpha->comm[i].alpha = 0;
        prof = noalpha;
    }
    if (!(o.attn_density > 0)) o.attn_density = 1.0;
    if (!o.backend[0]) snprintf(o.backend, sizeof o.backend, "%.15s", cfg->attention);
    const double eb = o.precision == SPB_FP32 ? 4.0 : 2.0;
    item_list items;
    if (build_plan(cfg, world, eb, eb, &out->plan, &items)) {
        snprintf(err, errlen, "the model does not know strategy '%s'", cfg->strategy);
        free(noalpha);
        return -1;
    }
    dims d = dims_of(cfg);
    if (o.tp_no_sp) d.Bseq = d.BR;
    d.dropout = o.dropout, d.fused = o.fused;
    const double accum = spb_config_accum_steps(cfg, world), L = cfg->num_layers;
    /* Ranks sharing cores (CPU): each gets cores/ranks of the machine. */
    double s = 1.0;
    if (prof->cores > 0) {
        int on_node = prof->ranks_per_node > 0 && prof->ranks_per_node < world ? prof->ranks_per_node : world;
        if (on_node > prof->cores) s = (double)prof->cores / on_node;
    }
    out->compute_scale = s;

    /* one micro-batch: layers forward and backward, the head */
    compute lf = {0}, lb = {0}, hf = {0}, hb = {0};
    layer_gemms(&lf, prof, s, &d, 0);
    layer_gemms(&lb, prof, s, &d, 1);
    layer_other(&lf, prof, s, &d, 0);
    layer_other(&lb, prof, s, &d, 1);
    head(&hf, prof, s, &d, 0);
    head(&hb, prof, s, &d, 1);

    /* attention and, for ring, the overlap of transfers with block compute */
    double ring_exposed_f = 0, ring_exposed_b = 0, ring_total_f = 0, ring_total_b = 0;
    if (d.ring && d.R > 1) {
        compute f0, fl, b0, bl;
        ring_steps(prof, s, &o, &d, 0, &f0, &fl);
        ring_steps(prof, s, &o, &d, 1, &b0, &bl);
        acc(&lf, &f0, 1), acc(&lf, &fl, d.R - 1);
        acc(&lb, &b0, 1), acc(&lb, &bl, d.R - 1);
        double block = out->plan.link[SPB_OP_SENDRECV][SPB_PHASE_FORWARD] / (L * accum) / (d.R - 1);
        double t1 = spb_perf_collective_time(prof, SPB_OP_SENDRECV, block, block, (int)d.R, (int)d.U, world);
        double t2 = spb_perf_collective_time(prof, SPB_OP_SENDRECV, 2 * block, 2 * block, (int)d.R, (int)d.U, world);
        /* forward: the transfer posted at step k hides behind step k's blocks */
        ring_exposed_f = fmax(0, t1 - total(&f0)) + (d.R - 2) * fmax(0, t1 - total(&fl));
        ring_total_f = (d.R - 1) * t1;
        /* backward: K/V at step 0, K/V and dK/dV together at steps 1..P-2,
         * dK/dV at step P-1, then the home run, exposed whole */
        if (d.R == 2)
            ring_exposed_b = fmax(0, t1 - total(&b0)) + fmax(0, t1 - total(&bl)) + t1;
        else
            ring_exposed_b = fmax(0, t1 - total(&b0)) + (d.R - 2) * fmax(0, t2 - total(&bl)) +
                             fmax(0, t1 - total(&bl)) + t1;
        ring_total_b = 2 * t1 + (d.R - 2) * t2 + t1;
    } else if (d.ring) {
        compute f0, fl, b0, bl;
        ring_steps(prof, s, &o, &d, 0, &f0, &fl);
        ring_steps(prof, s, &o, &d, 1, &b0, &bl);
        acc(&lf, &f0, 1), acc(&lb, &b0, 1);
    } else {
        layer_attention(&lf, prof, s, &o, &d, 0);
        layer_attention(&lb, prof, s, &o, &d, 1);
    }
    /* what the backward pass recomputes: the whole layer forward
     * (checkpointing) or only the attention core (selective) */
    compute rf = {0};
    if (o.selective_recompute && !d.ring) layer_attention(&rf, prof, s, &o, &d, 0);
    else if (cfg->checkpoint_activations) rf = lf;
    if (o.ablate & SPB_TERM_RECOMPUTE) memset(&rf, 0, sizeof rf);
    if (o.ablate & SPB_TERM_ELEMWISE) lf.other = lb.other = hf.other = hb.other = rf.other = 0;

    /* communication of the plan's items */
    for (int k = 0; k < items.n; k++) {
        const plan_item *it = &items.it[k];
        double t;
        if (it->op == SPB_OP_SENDRECV && d.ring) {
            double per = L * accum;
            t = it->phase == SPB_PHASE_BACKWARD ? ring_exposed_b * per : ring_exposed_f * per;
            double tot = it->phase == SPB_PHASE_BACKWARD ? ring_total_b * per : ring_total_f * per;
            out->comm_overlapped[it->op][it->phase] += fmax(0, tot - t);
        } else {
            double calls = it->calls > 0 ? it->calls : 1;
            t = calls * spb_perf_collective_time(prof, it->op, it->link / calls, it->payload / calls, it->group,
                                                 it->stride, world);
        }
        out->comm_exposed[it->op][it->phase] += t;
    }
    /* phase "other": loss, gradient norm and timing reductions (8 bytes each) */
    out->comm_exposed[SPB_OP_ALLREDUCE][SPB_PHASE_OTHER] +=
        3 * spb_perf_collective_time(prof, SPB_OP_ALLREDUCE, 8, 8, world, 1, world);

    double comm_phase[SPB_NUM_PHASES] = {0};
    for (int op = 0; op < SPB_NUM_OPS; op++)
        for (int ph = 0; ph < SPB_NUM_PHASES; ph++) {
            comm_phase[ph] += out->comm_exposed[op][ph];
            out->comm_exposed_total += out->comm_exposed[op][ph];
        }
    out->layer_comm = comm_phase[SPB_PHASE_FORWARD] + comm_phase[SPB_PHASE_BACKWARD] + comm_phase[SPB_PHASE_RECOMPUTE];

    if (o.ablate & SPB_TERM_LAYER_COMM)
        for (int op = 0; op < SPB_NUM_OPS; op++)
            for (int ph = SPB_PHASE_FORWARD; ph <= SPB_PHASE_RECOMPUTE; ph++)
                if (ph == SPB_PHASE_FORWARD || ph == SPB_PHASE_BACKWARD || ph == SPB_PHASE_RECOMPUTE) {
                    out->comm_exposed_total -= out->comm_exposed[op][ph];
                    comm_phase[ph] -= out->comm_exposed[op][ph];
                    out->layer_comm -= out->comm_exposed[op][ph];
                    out->comm_exposed[op][ph] = 0;
                }
    if (o.ablate & SPB_TERM_DP_COMM)
        for (int op = 0; op < SPB_NUM_OPS; op++)
            for (int ph = 0; ph < SPB_NUM_PHASES; ph++)
                if (ph == SPB_PHASE_ZERO || ph == SPB_PHASE_GRAD_REDUCE) {
                    out->comm_exposed_total -= out->comm_exposed[op][ph];
                    comm_phase[ph] -= out->comm_exposed[op][ph];
                    out->comm_exposed[op][ph] = 0;
                }

    /* iteration: micro-steps, recompute, reduction, update */
    compute all = {0};
    acc(&all, &lf, L * accum);
    acc(&all, &rf, L * accum);
    acc(&all, &lb, L * accum);
    acc(&all, &hf, accum);
    acc(&all, &hb, accum);
    out->t_gemm = all.gemm, out->t_attn = all.attn, out->t_other = all.other;
    out->t_softmax = all.softmax;
    out->t_recompute = L * accum * total(&rf);
    out->gemm_flops = all.gemm_flops, out->attn_flops = all.attn_flops;

    double local, owned;
    param_counts(cfg, world, &local, &owned);
    compute optc = {0};
    elems(&optc, prof, s, SPB_ELEM_COPY, local);      /* zeroing gradients */
    elems(&optc, prof, s, SPB_ELEM_SUMSQ, owned);     /* gradient norm */
    elems(&optc, prof, s, SPB_ELEM_ADAM, owned);
    if (cfg->zero_stage >= 1) elems(&optc, prof, s, SPB_ELEM_COPY, 3 * local); /* staging copies */
    out->t_adam = (o.ablate & SPB_TERM_OPTIMIZER) ? 0 : optc.other;

    double zero_rs = out->comm_exposed[SPB_OP_REDUCE_SCATTER][SPB_PHASE_ZERO];
    double zero_rest = comm_phase[SPB_PHASE_ZERO] - zero_rs;
    /* kernel gaps: every dependent kernel on the stream waits the profile's kernel_gap */
    double kf = kernels_per_layer_fwd(&o), kr = o.selective_recompute ? 3.0 : (cfg->checkpoint_activations ? kf : 0);
    double gap = (o.ablate & SPB_TERM_LAUNCH) ? 0 : prof->kernel_gap;
    double launch_f = gap * accum * (L * kf + 4), launch_b = gap * accum * (L * (2 * kf + kr) + 8);
    out->t_launch = launch_f + launch_b;
    out->t_forward = accum * (L * total(&lf) + total(&hf)) + comm_phase[SPB_PHASE_FORWARD] + launch_f;
    out->t_backward = accum * (L * total(&lb) + total(&hb) + L * total(&rf)) + comm_phase[SPB_PHASE_BACKWARD] +
                      comm_phase[SPB_PHASE_RECOMPUTE] + launch_b;
    out->t_grad_reduce = comm_phase[SPB_PHASE_GRAD_REDUCE] + zero_rs;
    out->t_optimizer = out->t_adam + zero_rest + comm_phase[SPB_PHASE_OTHER];
    if (o.overlap_dp) {
        /* DDP's gradient buckets and FSDP's/ZeRO-3's prefetched gathers run
         * beside the layers' compute: what exceeds the compute stays exposed,
         * and so does one layer's share (the first gather, the last reduction) */
        double dp = comm_phase[SPB_PHASE_GRAD_REDUCE] + comm_phase[SPB_PHASE_ZERO];
        double busy = out->t_forward + out->t_backward;
        double exposed = fmax(dp / (L > 0 ? L : 1), dp - busy);
        if (dp > 0) {
            double keep = exposed / dp;
            out->dp_comm_hidden = dp - exposed;
            out->t_grad_reduce *= keep;
            out->t_optimizer = out->t_adam + zero_rest * keep + comm_phase[SPB_PHASE_OTHER];
            out->comm_exposed_total -= out->dp_comm_hidden;
            for (int op = 0; op < SPB_NUM_OPS; op++) /* each collective's exposed time, as the phases' */
                out->comm_exposed[op][SPB_PHASE_GRAD_REDUCE] *= keep, out->comm_exposed[op][SPB_PHASE_ZERO] *= keep;
        }
    }
    out->iter_time = out->t_forward + out->t_backward + out->t_grad_reduce + out->t_optimizer;
    if (o.pp > 1) {
        /* the stage's activations (sequence-split across its tensor-parallel
         * ranks: Megatron's scatter/gather or sequence parallelism) to the next
         * stage; across nodes once a stage fills a node */
        double msg = d.B * d.N * d.C * eb / d.tp;
        int R = prof->ranks_per_node > 0 ? prof->ranks_per_node : world;
        double t_msg = world >= R ? prof->inter_alpha + msg / prof->inter_bw : prof->intra_alpha + msg / prof->intra_bw;
        if (prof->n_comm) t_msg = spb_perf_collective_time(prof, SPB_OP_SENDRECV, msg, msg, 2, 1, 2);
        double t_micro = (out->t_forward + out->t_backward) / accum;
        spb_perf_pipeline_terms(o.pp, o.vpp, accum, t_micro, t_msg, &out->t_bubble, &out->t_p2p);
        if (o.ablate & SPB_TERM_BUBBLE) out->t_bubble = 0;
        if (o.ablate & SPB_TERM_P2P) out->t_p2p = 0;
        out->iter_time += out->t_bubble + out->t_p2p;
    }

    double tokens = (double)cfg->global_batch_size * cfg->seq_length;
    out->tokens_per_s = tokens / out->iter_time;
    /* the paper's formula counts the whole global batch's work */
    out->tflops_paper_per_rank =
        spb_paper_flops_per_iteration(cfg, cfg->checkpoint_activations) / out->iter_time / world / 1e12;
    out->tflops_counted_per_rank = (out->gemm_flops + out->attn_flops) / out->iter_time / 1e12;

    spb_memory_model(cfg, world, o.precision, &out->mem);
    out->mem_needed = out->mem.total + prof->memory_reserved;
    out->fits = prof->memory_bytes <= 0 || out->mem_needed <= prof->memory_bytes;
    free(noalpha);
    return 0;
}
