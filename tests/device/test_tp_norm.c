/* test_tp_norm.c — the all-reduce fused with the residual add and the RMSNorm
 * (sf_comm_all_reduce_norm_buf) on 2 GPUs, two rank processes over the NCCL communicator:
 *  - every shape of rows 1..256 x cols 64..8192 (and widths the kernel refuses, which take the
 *    all-reduce + rmsnorm fallback), with and without the residual, against a host reference:
 *    the summed stream exact (the values are multiples of 1/4), the normed rows within 1/32
 *    relative (a few bf16 steps: the order of the fp32 sum of squares differs);
 *  - a burst of calls of changing sizes without a host sync (stale flags or buffers show);
 *    all of it twice: the kernel launched with programmatic dependent launch and its local loads
 *    overlapping its waits (opt-in), then launched plainly, its loads in sequence (the default);
 *  - the time per call at decode sizes of those and of PDL alone, against the all-reduce then
 *    the rmsnorm kernel (lines `ARNORM rows cols default_us pdl_us plain_us unfused_us` for
 *    bench/device/tp.sh).
 * The parent forks the ranks before anything touches CUDA; each rank uses GPU `rank`. */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <sys/wait.h>

#include "../../common/sf.h"
#include "../../hal/comm.h"
#include "../../hal/hal.h"
#include "../test.h"
#include "tp_ranks.h"

#ifdef SF_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define RANKS 2
#define MAX_ROWS 256
#define MAX_COLS 8192

typedef struct rank_ctx {
    int rank;
    sf_backend *b;
    sf_comm *c;
    sf_buf *x, *out; /* [MAX_ROWS, width] */
    int width;
    float *hx, *hres, *hout, *want_h, *want_out;
    int bad; /* failed checks on this rank */
} rank_ctx;

/* r->x and r->out as [MAX_ROWS, cols] (the op takes buffers exactly as wide as the norm). */
static int set_width(rank_ctx *r, int cols, sf_error *err)
{
    if (r->width == cols) return SF_OK;
    if (r->x) r->b->ops->buf_free(r->b, r->x);
    if (r->out) r->b->ops->buf_free(r->b, r->out);
    r->x = r->out = NULL;
    r->width = 0;
    int rc = r->b->ops->buf_new(r->b, MAX_ROWS, cols, &r->x, err);
    if (!rc) rc = r->b->ops->buf_new(r->b, MAX_ROWS, cols, &r->out, err);
    if (!rc) r->width = cols;
    return rc;
}

static float val(int rank, int64_t row, int64_t i, int it)
{
    return (float)((row * 5 + i * 7 + rank * 13 + it * 3) % 17 - 8) * 0.25f;
}

static float bfr(float f) { return sf_bf16_to_f32(sf_f32_to_bf16(f)); }

static int make_weight(rank_ctx *r, int cols, sf_weight **w, sf_error *err)
{
    uint16_t *h = malloc((size_t)cols * 2);
    if (!h) return sf_err(err, SF_ENOMEM, "out of memory");
    for (int i = 0; i < cols; i++) h[i] = sf_f32_to_bf16(0.5f + (float)(i % 7) * 0.125f);
    sf_weight_desc d = { .n_parts = 1 };
    d.part[0] = (sf_view){ .data = h, .dtype = SF_DT_BF16, .rows = 1, .cols = cols };
    int rc = r->b->ops->weight_new(r->b, &d, w, err);
    free(h);
    return rc;
}

/* One call of rows x cols (buffers cols wide), checked against the host reference. */
static void check_case(rank_ctx *r, int rows, int cols, int with_res, int it)
{
    const struct sf_backend_ops *o = r->b->ops;
    sf_error err = { 0 };
    sf_weight *w = NULL;
    sf_buf *x = NULL, *res = NULL, *out = NULL;
    int rc = make_weight(r, cols, &w, &err);
    if (!rc) rc = o->buf_new(r->b, rows, cols, &x, &err);
    if (!rc) rc = o->buf_new(r->b, rows, cols, &res, &err);
    if (!rc) rc = o->buf_new(r->b, rows, cols, &out, &err);
    for (int64_t i = 0; !rc && i < (int64_t)rows * cols; i++) {
        int64_t row = i / cols, c = i % cols;
        r->hx[i] = val(r->rank, row, c, it);
        r->hres[i] = val(7, row, c, it + 1);
    }
    for (int64_t i = 0; !rc && i < (int64_t)rows * cols; i++) r->hout[i] = NAN; /* poison: a row not written fails */
    if (!rc && ((rc = o->write_f32(r->b, x, rows, r->hx)) || (rc = o->write_f32(r->b, res, rows, r->hres)) ||
                (rc = o->write_f32(r->b, out, rows, r->hout))))
        sf_err(&err, rc, "write_f32 failed");
    if (!rc) rc = sf_comm_all_reduce_norm_buf(r->c, r->b, x, with_res ? res : NULL, w, 1e-5f, rows, cols, out, &err);
    if (!rc && ((rc = o->read_f32(r->b, with_res ? res : x, rows, r->hx)) || (rc = o->read_f32(r->b, out, rows, r->hout))))
        sf_err(&err, rc, "read_f32 failed");
    if (rc) {
        printf("      rank %d: %d x %d (residual %d): %s\n", r->rank, rows, cols, with_res, err.msg);
        r->bad++;
        goto out;
    }
    double worst = 0;
    for (int row = 0; row < rows; row++) {
        double ss = 0;
        for (int c = 0; c < cols; c++) {
            float s = 0;
            for (int k = 0; k < RANKS; k++) s += val(k, row, c, it);
            float v = bfr(s);
            if (with_res) v = bfr(val(7, row, c, it + 1) + v);
            r->want_h[c] = v;
            ss += (double)v * v;
        }
        float inv = 1.0f / sqrtf((float)(ss / cols) + 1e-5f);
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)row * cols + c;
            float want = bfr(bfr(r->want_h[c] * inv) * (0.5f + (float)(c % 7) * 0.125f));
            double d = fabs((double)r->hout[i] - want);
            worst = fmax(worst, d / fmax(fabs(want), 1e-3));
            if (r->hx[i] != r->want_h[c] || !(d <= fabs(want) * (1.0 / 32) + 1e-6)) { /* NaN fails */
                printf("      rank %d: %d x %d (residual %d, round %d): row %d col %d: stream %g (want %g), normed %g "
                       "(want %g)\n", r->rank, rows, cols, with_res, it, row, c, r->hx[i], r->want_h[c], r->hout[i], want);
                r->bad++;
                goto out;
            }
        }
    }
    if (r->rank == 0 && rows >= 64)
        printf("      %3d x %4d residual %d: %s, worst relative error of the normed rows %.1e\n", rows, cols, with_res,
               sf_comm_takes_norm(r->c, r->b, rows, cols) ? "fused kernel" : "all-reduce + rmsnorm", worst);
out:
    if (x) o->buf_free(r->b, x);
    if (res) o->buf_free(r->b, res);
    if (out) o->buf_free(r->b, out);
    if (w) o->weight_free(r->b, w);
}

/* Back to back without a host sync: x summed in place by calls of changing row counts. */
static void check_burst(rank_ctx *r, int cols)
{
    static const int rows_of[] = { 256, 3, 64, 1, 200, 2, 128, 17 };
    const int n = (int)SF_ARRAY_LEN(rows_of);
    const struct sf_backend_ops *o = r->b->ops;
    sf_error err = { 0 };
    sf_weight *w = NULL;
    int count[MAX_ROWS] = { 0 }, rc = make_weight(r, cols, &w, &err);
    if (!rc) rc = set_width(r, cols, &err);
    for (int64_t i = 0; i < (int64_t)MAX_ROWS * cols; i++) r->hx[i] = val(r->rank, i / cols, i % cols, 11);
    if (!rc) rc = o->write_f32(r->b, r->x, MAX_ROWS, r->hx);
    for (int k = 0; k < n && !rc; k++) {
        rc = sf_comm_all_reduce_norm_buf(r->c, r->b, r->x, NULL, w, 1e-5f, rows_of[k], cols, r->out, &err);
        for (int row = 0; row < rows_of[k]; row++) count[row]++;
    }
    if (!rc) rc = o->read_f32(r->b, r->x, MAX_ROWS, r->hx);
    for (int row = 0; row < MAX_ROWS && !rc; row++)
        for (int c = 0; c < cols; c++) {
            float s = 0;
            for (int k = 0; k < RANKS; k++) s += val(k, row, c, 11);
            float want = count[row] ? s * powf(RANKS, (float)(count[row] - 1)) : val(r->rank, row, c, 11);
            if (r->hx[(size_t)row * cols + c] != want) {
                printf("      rank %d: burst of %d calls, %d wide: row %d (summed %d times) col %d is %g, want %g\n",
                       r->rank, n, cols, row, count[row], c, r->hx[(size_t)row * cols + c], want);
                r->bad++;
                goto out;
            }
        }
    if (rc) {
        printf("      rank %d: burst, %d wide: %s\n", r->rank, cols, err.msg[0] ? err.msg : "a backend op failed");
        r->bad++;
    }
out:
    if (w) o->weight_free(r->b, w);
}

/* µs per call, wall time of `iters` calls back to back after a barrier and 5 untimed ones. */
static double time_calls(rank_ctx *r, int rows, int cols, sf_weight *w, int iters, sf_error *err)
{
    int rc = r->c->ops->barrier(r->c, err);
    double t0 = 0;
    for (int k = 0; k < 5 + iters && !rc; k++) {
        if (k == 5) {
            if ((rc = r->b->ops->sync(r->b))) break;
            t0 = sf_now_s();
        }
        rc = sf_comm_all_reduce_norm_buf(r->c, r->b, r->x, NULL, w, 1e-5f, rows, cols, r->out, err);
    }
    if (!rc) rc = r->b->ops->sync(r->b);
    return rc ? -1 : (sf_now_s() - t0) * 1e6 / iters;
}

/* Per size: the fused kernel with PDL and early loads, with PDL alone, with neither, and the
 * all-reduce then the rmsnorm; one line `ARNORM rows cols default pdl plain unfused` (µs) from
 * rank 0. */
static void time_sizes(rank_ctx *r)
{
    static const int rows_of[] = { 2, 16, 32, 64, 128, 192, 256 }, cols_of[] = { 4096, 8192 };
    sf_error err = { 0 };
    size_t keep = r->c->norm_max_bytes;
    int keep_pdl = r->c->norm_pdl, keep_early = r->c->norm_early;
    for (int ci = 0; ci < 2; ci++) {
        sf_weight *w = NULL;
        if (make_weight(r, cols_of[ci], &w, &err) || set_width(r, cols_of[ci], &err)) {
            printf("      rank %d: %s\n", r->rank, err.msg);
            r->bad++;
            if (w) r->b->ops->weight_free(r->b, w);
            return;
        }
        for (int ri = 0; ri < (int)SF_ARRAY_LEN(rows_of); ri++) {
            int rows = rows_of[ri], cols = cols_of[ci];
            size_t bytes = (size_t)rows * cols * 2;
            if (bytes > keep) continue;
            double us[4] = { 0, 0, 0, 0 };
            for (int v = 0; v < 4; v++) { /* the same order on every rank */
                r->c->norm_max_bytes = v < 3 ? keep : 0;
                r->c->norm_pdl = v < 2;
                r->c->norm_early = v == 0;
                us[v] = time_calls(r, rows, cols, w, 50, &err);
                if (us[v] < 0) {
                    printf("      rank %d: timing %d x %d: %s\n", r->rank, rows, cols, err.msg);
                    r->bad++;
                }
            }
            r->c->norm_max_bytes = keep;
            r->c->norm_pdl = keep_pdl;
            r->c->norm_early = keep_early;
            if (r->rank == 0) printf("ARNORM %d %d %.1f %.1f %.1f %.1f\n", rows, cols, us[0], us[1], us[2], us[3]);
        }
        r->b->ops->weight_free(r->b, w);
    }
}

/* A rank: 0 all checks passed, 1 a check failed, 77 fewer than 2 GPUs. */
static int rank_main(int rank, const char *boot)
{
#ifdef SF_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < RANKS) return 77;
#else
    return 77;
#endif
    rank_ctx r = { .rank = rank };
    sf_error err = { 0 };
    sf_backend_opts bo = { .name = "cuda", .device = rank };
    sf_comm_opts co = { .rank = rank, .size = RANKS, .backend = "cuda", .bootstrap = boot, .device = rank,
                        .timeout_ms = 30000 };
    size_t all = (size_t)MAX_ROWS * MAX_COLS;
    int rc = sf_backend_open(&bo, &r.b, &err);
    if (!rc) rc = sf_comm_open(&co, &r.c, &err);
    r.hx = malloc(all * 4);
    r.hres = malloc(all * 4);
    r.hout = malloc(all * 4);
    r.want_h = malloc(MAX_COLS * 4);
    if (rc || !r.hx || !r.hres || !r.hout || !r.want_h) {
        printf("      rank %d: setup: %s\n", rank, rc ? err.msg : "out of memory");
        return 1;
    }
    if (rank == 0)
        printf("      fused kernel up to %zu bytes, %d columns, from %d rows (0 bytes: off), PDL %s, early loads "
               "%s; checked and timed here from 2 rows\n", r.c->norm_max_bytes, r.c->norm_max_cols,
               r.c->norm_min_rows, r.c->norm_pdl ? "on" : "off", r.c->norm_early ? "on" : "off");
    r.c->norm_min_rows = 2; /* the kernel at every size it takes (the same on both ranks) */
    if (!r.c->norm_max_bytes) {
        printf("      rank %d: the fused kernel is off (no peer memory, or SEMFLOW_TP_ARNORM=0)\n", rank);
        r.bad++;
    }
    static const int rows_of[] = { 1, 2, 3, 17, 64, 100, 128, 192, 255, 256 };
    static const int cols_of[] = { 64, 1000, 1004, 4096, 5120, 8192 }; /* 1004: refused, the fallback */
    int it = 0;
    int keep_pdl = r.c->norm_pdl, keep_early = r.c->norm_early;
    for (int pass = 0; pass < 2 && !r.bad; pass++) { /* PDL + early loads, then plainly in sequence */
        r.c->norm_pdl = r.c->norm_early = !pass;
        if (rank == 0) printf("      %s\n", pass ? "launched plainly, loads in sequence" : "PDL, early loads");
        for (int ci = 0; ci < (int)SF_ARRAY_LEN(cols_of) && !r.bad; ci++)
            for (int ri = 0; ri < (int)SF_ARRAY_LEN(rows_of) && !r.bad; ri++)
                for (int with_res = 0; with_res < 2 && !r.bad; with_res++)
                    check_case(&r, rows_of[ri], cols_of[ci], with_res, it++);
        if (!r.bad) check_burst(&r, 4096);
        if (!r.bad) check_burst(&r, 8192);
    }
    r.c->norm_pdl = keep_pdl;
    r.c->norm_early = keep_early;
    if (!r.bad && rank == 0) printf("      %d shapes and 4 bursts exact (stream) and within 1/32 (norm)\n", it);
    if (!r.bad) time_sizes(&r);
    if (r.x) r.b->ops->buf_free(r.b, r.x);
    if (r.out) r.b->ops->buf_free(r.b, r.out);
    sf_comm_free(r.c);
    sf_backend_close(r.b);
    free(r.hx);
    free(r.hres);
    free(r.hout);
    free(r.want_h);
    return r.bad ? 1 : 0;
}

static int skipped;

TEST(tp_all_reduce_norm)
{
    int codes[RANKS];
    REQUIRE(!tp_fork_ranks(RANKS, 31000 + (int)(getpid() % 2000), rank_main, codes), "fork failed");
    if (codes[0] == 77 && codes[1] == 77) {
        skipped = 1;
        return;
    }
    for (int k = 0; k < RANKS; k++) CHECK_MSG(codes[k] == 0, "rank %d exited with %d (see above)", k, codes[k]);
}

int main(void)
{
    int n = tp_count_gpus();
    if (n < RANKS) {
        printf("      %d GPU(s): the fused all-reduce needs %d; nothing checked\n", n, RANKS);
        return test_summary();
    }
    RUN(tp_all_reduce_norm);
    if (skipped) printf("      CUDA sees fewer than %d GPUs: nothing checked\n", RANKS);
    return test_summary();
}
