#define _DEFAULT_SOURCE
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "outputs.h"

enum { HEADER_BYTES = 256, FORMAT_VERSION = 1, NUM_CKPT_FIELDS = 10 };

/* The files are little-endian; so is every machine spbench builds on. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "spbench file formats assume little-endian hosts");

static int failf(char *err, size_t errlen, const char *what, const char *path)
{
    snprintf(err, errlen, "%s '%s': %s", what, path, errno ? strerror(errno) : "bad file");
    return -1;
}

static int write_all(FILE *f, const void *p, size_t bytes) { return fwrite(p, 1, bytes, f) == bytes ? 0 : -1; }
static int read_all(FILE *f, void *p, size_t bytes) { return fread(p, 1, bytes, f) == bytes ? 0 : -1; }

static void header_start(unsigned char *h, const char magic[8])
{
    memset(h, 0, HEADER_BYTES);
    memcpy(h, magic, 8);
    uint32_t version = FORMAT_VERSION, hb = HEADER_BYTES;
    memcpy(h + 8, &version, 4);
    memcpy(h + 12, &hb, 4);
}

/* The first HEADER_BYTES of f, checked: the magic, this version and header
 * size.  0, or -1 with a message. */
static int read_header(FILE *f, const char magic[8], unsigned char *h, const char *path, char *err, size_t errlen)
{
    uint32_t version = 0, hb = 0;
    if (read_all(f, h, HEADER_BYTES) || memcmp(h, magic, 8)) {
        snprintf(err, errlen, "'%s' is not an spbench %s file", path, !strcmp(magic, "SPBDUMP") ? "dump" : "checkpoint");
        return -1;
    }
    memcpy(&version, h + 8, 4);
    memcpy(&hb, h + 12, 4);
    if (version != FORMAT_VERSION || hb != HEADER_BYTES) {
        snprintf(err, errlen, "'%s': version %u (header %u bytes), this build reads %d (%d)", path, version, hb,
                 FORMAT_VERSION, HEADER_BYTES);
        return -1;
    }
    return 0;
}

/* Writes go to PATH.tmp.<pid>.<rank> and are renamed into place, so a
 * reader never sees half a file and two runs saving to one path never
 * write into each other's temporary.  While one is open, SIGINT, SIGTERM
 * and SIGHUP remove it before the process dies; a temporary left by a
 * process killed outright (SIGKILL) is removed by the next save to that
 * path once its pid is gone. */
static char pending_tmp[SPB_PATH_MAX + 64];
static struct sigaction saved_actions[3];
static const int cleanup_signals[3] = {SIGINT, SIGTERM, SIGHUP};

static void remove_pending_and_die(int sig)
{
    if (pending_tmp[0]) unlink(pending_tmp); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Temporaries PATH.tmp.<pid>.<rank> of processes that no longer exist. */
static void remove_stale_tmps(const char *path)
{
    char dir[SPB_PATH_MAX], prefix[SPB_PATH_MAX + 8];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - path) + (slash == path), path);
    else snprintf(dir, sizeof dir, ".");
    snprintf(prefix, sizeof prefix, "%s.tmp.", base);
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
        char *end = NULL;
        long pid = strtol(e->d_name + strlen(prefix), &end, 10);
        if (pid <= 0 || *end != '.' || (kill((pid_t)pid, 0) != 0 && errno == ESRCH)) {
            char stale[SPB_PATH_MAX * 2 + 2];
            snprintf(stale, sizeof stale, "%s/%s", dir, e->d_name);
            if (pid > 0) unlink(stale); /* only names of the form we write, of dead processes */
        }
    }
    closedir(d);
}

static FILE *open_tmp(const char *path, int rank, char *tmp, size_t tmplen)
{
    remove_stale_tmps(path);
    snprintf(tmp, tmplen, "%s.tmp.%ld.%d", path, (long)getpid(), rank);
    snprintf(pending_tmp, sizeof pending_tmp, "%s", tmp);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = remove_pending_and_die;
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < 3; k++) sigaction(cleanup_signals[k], &sa, &saved_actions[k]);
    /* O_EXCL: never write through whatever else holds the name */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f && fd >= 0) close(fd);
    if (!f) {
        pending_tmp[0] = '\0';
        for (int k = 0; k < 3; k++) sigaction(cleanup_signals[k], &saved_actions[k], NULL);
    }
    return f;
}

static int finish_tmp(FILE *f, const char *tmp, const char *path, int write_failed, char *err, size_t errlen)
{
    errno = 0;
    int rc = 0;
    struct stat st;
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) write_failed = 1;
    if (fclose(f) != 0 || write_failed) {
        rc = failf(err, errlen, "cannot write", path);
    } else if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "'%s' is not a regular file: not replaced", path);
        rc = -1;
    } else if (rename(tmp, path) != 0) {
        rc = failf(err, errlen, "cannot rename into", path);
    }
    if (rc) unlink(tmp);
    pending_tmp[0] = '\0';
    for (int k = 0; k < 3; k++) sigaction(cleanup_signals[k], &saved_actions[k], NULL);
    return rc;
}

/* Whether all n values are finite (and >= 0 where nonneg). */
static int all_finite(const float *x, size_t n, int nonneg)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (nonneg && x[i] < 0)) return 0;
    return 1;
}

/* The training state at header bytes 104..135 (zero in files written
 * before it: read as "not saved"). */
enum { STATE_AT = 104 };

/* The model's variant at bytes 136..159 (docs/FORMATS.md; zero in files
 * written before it: GPT with as many K/V heads as heads): K/V heads, flags,
 * RoPE base. */
enum { VARIANT_AT = 136 };
enum { VARIANT_ROPE = 1, VARIANT_RMSNORM = 2, VARIANT_SWIGLU = 4, VARIANT_UNTIED = 8, VARIANT_NO_BIAS = 16 };

static int64_t variant_flags(const spb_gpt *g)
{
    return (g->rope ? VARIANT_ROPE : 0) | (g->rmsnorm ? VARIANT_RMSNORM : 0) | (g->swiglu ? VARIANT_SWIGLU : 0) |
           (g->untied ? VARIANT_UNTIED : 0) | (g->bias ? 0 : VARIANT_NO_BIAS);
}

int spb_checkpoint_save(const char *path, const spb_config *cfg, const spb_gpt *g, const float *params,
                        const float *m, const float *v, long step, const spb_checkpoint_state *state, char *err,
                        size_t errlen)
{
    unsigned char h[HEADER_BYTES];
    header_start(h, "SPBCKPT");
    int64_t f[NUM_CKPT_FIELDS] = {g->L, g->C, g->H, g->F, g->V, g->maxpos, cfg->seq_length, step,
                                  g->num_global_params, m != NULL && v != NULL};
    memcpy(h + 16, f, sizeof f);
    uint64_t seed = cfg->seed;
    memcpy(h + 96, &seed, 8);
    int64_t variant[2] = {g->G, variant_flags(g)};
    double base = g->rope ? g->rotary_base : 0.0;
    memcpy(h + VARIANT_AT, variant, sizeof variant);
    memcpy(h + VARIANT_AT + 16, &base, 8);
    if (state) {
        double scale = state->loss_scale;
        int64_t counts[3] = {state->optimizer_step, state->clean_steps, state->skipped_steps};
        memcpy(h + STATE_AT, &scale, 8);
        memcpy(h + STATE_AT + 8, counts, sizeof counts);
    }
    size_t n = (size_t)g->num_global_params;
    float *global = SPB_CHECK_PTR(malloc(n * sizeof(float)));
    const float *parts[3] = {params, m && v ? m : NULL, m && v ? v : NULL};
    int rc = 0, writer = g->grid->world_rank == 0;
    FILE *fp = NULL;
    /* checked again at the write: the path may have changed since the start */
    if (writer && spb_output_check("save", path, SPB_OUT_CHECKPOINT, cfg->overwrite, err, errlen)) rc = -1, writer = 0;
    char tmp[SPB_PATH_MAX + 64];
    if (writer) {
        errno = 0;
        fp = open_tmp(path, g->grid->world_rank, tmp, sizeof tmp);
        if (!fp) rc = failf(err, errlen, "cannot create", tmp);
    }
    int bad = fp ? write_all(fp, h, sizeof h) : 0;
    for (int k = 0; k < 3 && parts[k]; k++) {
        spb_gpt_gather_global(g, parts[k], global); /* collective: every rank takes part */
        if (fp) bad = bad || write_all(fp, global, n * sizeof(float));
    }
    free(global);
    if (fp) rc = finish_tmp(fp, tmp, path, bad, err, errlen);
    return rc;
}

int spb_checkpoint_load(const char *path, const spb_config *cfg, const spb_gpt *g, float *params, float *m,
                        float *v, long *step, int *has_optimizer, spb_checkpoint_state *state, char *err,
                        size_t errlen)
{
    errno = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return failf(err, errlen, "cannot open checkpoint", path);
    unsigned char h[HEADER_BYTES];
    int rc = -1;
    float *global = NULL;
    int64_t f[NUM_CKPT_FIELDS];
    if (read_header(fp, "SPBCKPT", h, path, err, errlen)) goto out;
    memcpy(f, h + 16, sizeof f);
    int64_t want[7] = {g->L, g->C, g->H, g->F, g->V, g->maxpos, g->num_global_params};
    int64_t got[7] = {f[0], f[1], f[2], f[3], f[4], f[5], f[8]};
    static const char *names[7] = {"num-layers", "hidden-size", "num-attention-heads", "ffn-hidden-size",
                                   "vocab-size", "max-position-embeddings", "parameter count"};
    for (int i = 0; i < 7; i++)
        if (want[i] != got[i]) {
            snprintf(err, errlen, "checkpoint '%s' has %s %lld, the run has %lld", path, names[i], (long long)got[i],
                     (long long)want[i]);
            goto out;
        }
    (void)cfg;
    int64_t variant[2];
    double base;
    memcpy(variant, h + VARIANT_AT, sizeof variant);
    memcpy(&base, h + VARIANT_AT + 16, 8);
    if (variant[0] == 0) variant[0] = g->H; /* written before the field: G = H */
    if (variant[0] != g->G || variant[1] != variant_flags(g) || (g->rope && base != g->rotary_base)) {
        snprintf(err, errlen,
                 "checkpoint '%s' is a different model variant (K/V heads %lld, flags %lld, rotary base %g; the run "
                 "has %d, %lld, %g: see docs/FORMATS.md)",
                 path, (long long)variant[0], (long long)variant[1], base, g->G, (long long)variant_flags(g),
                 g->rope ? g->rotary_base : 0.0);
        goto out;
    }
    size_t n = (size_t)g->num_global_params;
    /* The header's counters and the file's length, before any tensor is read:
     * a hand-edited or torn file is refused, not half loaded. */
    if (f[7] < 0 || f[7] > INT_MAX || (f[9] != 0 && f[9] != 1)) {
        snprintf(err, errlen, "checkpoint '%s': step %lld or optimizer flag %lld out of range", path, (long long)f[7],
                 (long long)f[9]);
        goto out;
    }
    {
        struct stat st;
        double want_bytes = HEADER_BYTES + (double)n * sizeof(float) * (f[9] ? 3 : 1);
        if (fstat(fileno(fp), &st) != 0 || (double)st.st_size != want_bytes) {
            snprintf(err, errlen, "checkpoint '%s' has %lld bytes, its header says %.0f (truncated or trailing bytes)",
                     path, (long long)st.st_size, want_bytes);
            goto out;
        }
        double scale = 0;
        int64_t counts[3];
        memcpy(&scale, h + STATE_AT, 8);
        memcpy(counts, h + STATE_AT + 8, sizeof counts);
        if (!isfinite(scale) || scale < 0 || counts[0] < 0 || counts[0] > f[7] || counts[1] < 0 || counts[2] < 0 ||
            counts[2] > f[7]) {
            snprintf(err, errlen, "checkpoint '%s': training state out of range (loss scale %g, steps %lld, %lld, %lld)",
                     path, scale, (long long)counts[0], (long long)counts[1], (long long)counts[2]);
            goto out;
        }
    }
    global = SPB_CHECK_PTR(malloc(n * sizeof(float)));
    if (read_all(fp, global, n * sizeof(float))) {
        snprintf(err, errlen, "checkpoint '%s' is truncated", path);
        goto out;
    }
    if (!all_finite(global, n, 0)) {
        snprintf(err, errlen, "checkpoint '%s' holds non-finite parameters", path);
        goto out;
    }
    spb_gpt_scatter_global(g, global, params);
    *has_optimizer = f[9] != 0;
    if (m && v && f[9]) {
        float *dst[2] = {m, v};
        for (int k = 0; k < 2; k++) {
            if (read_all(fp, global, n * sizeof(float))) {
                snprintf(err, errlen, "checkpoint '%s' is truncated in its optimizer state", path);
                goto out;
            }
            if (!all_finite(global, n, k == 1)) {
                snprintf(err, errlen, "checkpoint '%s' holds non-finite (or negative second) AdamW moments", path);
                goto out;
            }
            spb_gpt_scatter_global(g, global, dst[k]);
        }
    }
    *step = f[7];
    if (state) {
        double scale = 0;
        int64_t counts[3];
        memcpy(&scale, h + STATE_AT, 8);
        memcpy(counts, h + STATE_AT + 8, sizeof counts);
        *state = scale > 0 ? (spb_checkpoint_state){counts[0], scale, counts[1], counts[2]}
                           : (spb_checkpoint_state){f[7], 0.0, 0, 0};
    }
    rc = 0;
out:
    free(global);
    fclose(fp);
    return rc;
}

int spb_dump_write(const char *path, int B, int T, int V, const int *inputs, const int *targets, double loss,
                   const float *grads, long num_params, char *err, size_t errlen)
{
    unsigned char h[HEADER_BYTES];
    header_start(h, "SPBDUMP");
    int64_t f[4] = {B, T, V, num_params};
    memcpy(h + 16, f, sizeof f);
    memcpy(h + 48, &loss, 8);
    char tmp[SPB_PATH_MAX + 64];
    errno = 0;
    FILE *fp = open_tmp(path, 0, tmp, sizeof tmp); /* rank 0 writes the dump */
    if (!fp) return failf(err, errlen, "cannot create", tmp);
    size_t bt = (size_t)B * T;
    _Static_assert(sizeof(int) == 4, "int32 tokens");
    int bad = write_all(fp, h, sizeof h) || write_all(fp, inputs, bt * 4) || write_all(fp, targets, bt * 4) ||
              write_all(fp, grads, (size_t)num_params * sizeof(float));
    return finish_tmp(fp, tmp, path, bad, err, errlen);
}

int spb_dump_read(const char *path, spb_dump *d, char *err, size_t errlen)
{
    *d = (spb_dump){0};
    errno = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return failf(err, errlen, "cannot open", path);
    unsigned char h[HEADER_BYTES];
    int rc = read_header(fp, "SPBDUMP", h, path, err, errlen);
    if (!rc) {
        int64_t v[4];
        memcpy(v, h + 16, sizeof v);
        memcpy(&d->loss, h + 48, 8);
        d->B = v[0], d->T = v[1], d->V = v[2], d->num_params = v[3];
        if (d->B <= 0 || d->T <= 0 || d->V <= 0 || d->num_params <= 0 || d->B * d->T > (1L << 34) ||
            d->num_params > (1L << 36)) {
            snprintf(err, errlen, "'%s': implausible sizes in the header", path);
            rc = -1;
        }
    }
    if (!rc) {
        size_t bt = (size_t)(2 * d->B * d->T), n = (size_t)d->num_params;
        d->tokens = SPB_CHECK_PTR(malloc(bt * sizeof(int)));
        d->grads = SPB_CHECK_PTR(malloc(n * sizeof(float)));
        if (read_all(fp, d->tokens, bt * sizeof(int)) || read_all(fp, d->grads, n * sizeof(float)) ||
            fgetc(fp) != EOF) {
            snprintf(err, errlen, "'%s': size does not match its header", path);
            rc = -1;
        }
    }
    fclose(fp);
    if (rc) spb_dump_free(d);
    return rc;
}

void spb_dump_free(spb_dump *d)
{
    free(d->tokens);
    free(d->grads);
    d->tokens = NULL, d->grads = NULL;
}

int spb_checkpoint_read_model(const char *path, spb_config *cfg, char *err, size_t errlen)
{
    errno = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return failf(err, errlen, "cannot open", path);
    unsigned char h[HEADER_BYTES];
    int rc = read_header(fp, "SPBCKPT", h, path, err, errlen);
    fclose(fp);
    if (rc) return rc;
    int64_t f[NUM_CKPT_FIELDS];
    memcpy(f, h + 16, sizeof f);
    for (int i = 0; i < 7; i++)
        if (f[i] <= 0 || f[i] > (1 << 24)) {
            snprintf(err, errlen, "'%s': implausible model sizes in the header", path);
            return -1;
        }
    spb_config_defaults(cfg);
    cfg->num_layers = (int)f[0], cfg->hidden_size = (int)f[1], cfg->num_heads = (int)f[2];
    cfg->ffn_hidden_size = (int)f[3], cfg->vocab_size = (int)f[4], cfg->max_position_embeddings = (int)f[5];
    cfg->seq_length = (int)f[6];
    int64_t variant[2];
    memcpy(variant, h + VARIANT_AT, sizeof variant);
    memcpy(&cfg->rotary_base, h + VARIANT_AT + 16, 8);
    cfg->num_query_groups = (int)variant[0];
    strcpy(cfg->position_embedding_type, variant[1] & VARIANT_ROPE ? "rope" : "learned");
    strcpy(cfg->normalization, variant[1] & VARIANT_RMSNORM ? "rmsnorm" : "layernorm");
    cfg->swiglu = (variant[1] & VARIANT_SWIGLU) != 0;
    cfg->untie_embeddings_and_output_weights = (variant[1] & VARIANT_UNTIED) != 0;
    cfg->disable_bias_linear = (variant[1] & VARIANT_NO_BIAS) != 0;
    return 0;
}
