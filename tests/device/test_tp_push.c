/* test_tp_push.c — the batch-1 link (kernels/cuda/allreduce.h, gemv_ar.cu) on 2 GPUs, two rank
 * processes over the NCCL communicator's peer memory:
 *  - chains of N layers' worth of link kernels without a host sync, as the forward pass queues
 *    them: O push (channel 0; from the second layer on, rank 0 completes its stream from
 *    channel 1), norm + gate/up + SiLU over channel 0's sum, down push (channel 1), and one sum
 *    after the last; the residual stream at the end exact against a host emulation of every
 *    rounding (the values are multiples of 1/4, so the GEMV sums are exact in fp32 in any
 *    order), on every rank; every layer's gated output (its own buffer, poisoned with NaN
 *    first) within a few bf16 steps of the host reference (the norm's sum of squares and the
 *    gate/up sums run in another order);
 *  - widths 64 (odd sizes), 4096 and 8192 with the shard shapes of Llama-3-8B and -70B at TP=2;
 *  - the time of each push alone at those shapes by ring stages (lines `PUSHTIME d k auto 2 3 4
 *    ideal`, µs; ideal: the weight at 4.25 TB/s) for bench/device/tp.sh.
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

#include "../../kernels/cuda/allreduce.h"
#endif

#define RANKS 2
#define LAYERS 6

static float bfr(float f) { return sf_bf16_to_f32(sf_f32_to_bf16(f)); }

/* Sparse weights of -1, 0, 1 (about one in 32 nonzero), rank- and matrix-specific. */
static float wval(int rank, int which, int64_t i, int64_t j)
{
    return (i * 13 + j * 7 + rank * 5 + which * 3) % 32 ? 0.0f : ((i + j) % 2 ? 1.0f : -1.0f);
}
/* sum over j < k of wval(rank, which, i, j) * x[j]: the nonzero j are one residue mod 32 (7 * 23 = 1 mod 32) */
static float sparse_dot(int rank, int which, int64_t i, int64_t k, const float *x)
{
    int64_t j0 = ((-(i * 13 + rank * 5 + which * 3) * 23) % 32 + 32) % 32;
    float acc = 0;
    for (int64_t j = j0; j < k; j += 32) acc += wval(rank, which, i, j) * x[j];
    return acc;
}
static float xval(int rank, int it, int64_t j) { return (float)((j * 7 + rank * 3 + it * 5) % 5 - 2) * 0.25f; }
static float resval(int64_t j) { return (float)(j % 9 - 4) * 0.5f; }
static float nwval(int64_t j) { return 0.5f + (float)(j % 7) * 0.125f; }

#ifdef SF_HAVE_CUDA
typedef struct shape {
    int d, ko, kd, f; /* residual width, inner sizes of the O and down pushes, gated outputs */
} shape;

static int kin(const shape *s, int which) { return which ? s->kd : s->ko; }

/* Host emulation of the chain: the stream after LAYERS layers and every layer's gated output
 * [LAYERS][f] (the same on every rank). */
static void reference(const shape *s, float *stream, float *y)
{
    int d = s->d, f = s->f, kmax = SF_MAX(s->ko, s->kd);
    float *z = malloc((size_t)d * 4), *xr = malloc((size_t)kmax * 4), *p[RANKS];
    for (int r = 0; r < RANKS; r++) p[r] = malloc((size_t)d * 4);
    for (int j = 0; j < d; j++) stream[j] = bfr(resval(j));
    for (int it = 0; it < LAYERS; it++) {
        for (int which = 0; which < 2; which++) { /* 0: O, 1: down */
            int k = kin(s, which);
            for (int r = 0; r < RANKS; r++) {
                for (int j = 0; j < k; j++) xr[j] = xval(r, it * 2 + which, j);
                for (int i = 0; i < d; i++) p[r][i] = bfr(sparse_dot(r, which, i, k, xr));
            }
            for (int i = 0; i < d; i++) {
                float v0 = bfr(stream[i] + p[0][i]), sum = 0.0f;
                for (int r = 0; r < RANKS; r++) sum += r ? p[r][i] : v0;
                stream[i] = bfr(sum);
            }
            if (which) continue;
            double ss = 0;
            for (int j = 0; j < d; j++) ss += (double)stream[j] * stream[j];
            float inv = 1.0f / sqrtf((float)(ss / d) + 1e-5f);
            for (int j = 0; j < d; j++) z[j] = bfr(bfr(stream[j] * inv) * nwval(j));
            for (int u = 0; u < f; u++) {
                float g = bfr(sparse_dot(0, 2, u, d, z)), up = bfr(sparse_dot(0, 2, u + f, d, z));
                y[(size_t)it * f + u] = bfr(bfr(g / (1.0f + expf(-g))) * up);
            }
        }
    }
    free(z);
    free(xr);
    for (int r = 0; r < RANKS; r++) free(p[r]);
}

/* Device bf16 [rows, cols] of value(i, j), built on the host a slab at a time. */
static uint16_t *device_matrix(int64_t rows, int64_t cols, float (*value)(int, int, int64_t, int64_t), int rank,
                               int which)
{
    const int64_t slab = SF_MAX(1, (1 << 22) / cols);
    uint16_t *h = malloc((size_t)SF_MIN(slab, rows) * cols * 2), *d = NULL;
    if (!h) return NULL;
    if (cudaMalloc((void **)&d, (size_t)rows * cols * 2) != cudaSuccess) d = NULL;
    for (int64_t r0 = 0; d && r0 < rows; r0 += slab) {
        int64_t n = SF_MIN(slab, rows - r0);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < cols; j++) h[i * cols + j] = sf_f32_to_bf16(value(rank, which, r0 + i, j));
        if (cudaMemcpy(d + r0 * cols, h, (size_t)n * cols * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
            cudaFree(d);
            d = NULL;
        }
    }
    free(h);
    return d;
}
static float xmat(int rank, int unused, int64_t it, int64_t j) { (void)unused; return xval(rank, (int)it, j); }
static float resmat(int rank, int unused, int64_t i, int64_t j) { (void)rank; (void)unused; (void)i; return resval(j); }
static float nwmat(int rank, int unused, int64_t i, int64_t j) { (void)rank; (void)unused; (void)i; return nwval(j); }
static float gmat(int rank, int unused, int64_t i, int64_t j) { (void)rank; (void)unused; return wval(0, 2, i, j); }

/* µs per push alone (20 back to back) of [d, k] with `stages` ring stages (0: picked by shape). */
static double time_push(const sf_k_tpl *l, sf_k_tp a, int stages, cudaStream_t st)
{
    cudaEvent_t e0, e1;
    float ms = -1;
    a.stages = stages;
    a.ch = 0;
    a.prev = -1;
    int rc = sf_k_gemv_tp(&a, l, st); /* untimed: the first launch sets the kernel up */
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, st);
    for (int i = 0; i < 20 && !rc; i++) rc = sf_k_gemv_tp(&a, l, st);
    cudaEventRecord(e1, st);
    if (!rc && cudaEventSynchronize(e1) == cudaSuccess) cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return rc ? -1 : 1e3 * ms / 20;
}

/* One rank's chain of one shape, then the pushes timed alone; returns failed checks (printed). */
static int run_shape(int rank, const sf_k_tpl *l, const shape *s, cudaStream_t st)
{
    int d = s->d, f = s->f, bad = 0, kmax = SF_MAX(s->ko, s->kd);
    float *want = malloc((size_t)d * 4), *ywant = malloc((size_t)LAYERS * f * 4);
    uint16_t *hb = malloc((size_t)SF_MAX(d, LAYERS * f) * 2);
    uint16_t *w[2], *wg, *x, *h, *nw, *y = NULL;
    w[0] = device_matrix(d, s->ko, wval, rank, 0);
    w[1] = device_matrix(d, s->kd, wval, rank, 1);
    wg = device_matrix(2 * (int64_t)f, d, gmat, 0, 0);
    x = device_matrix(2 * LAYERS, kmax, xmat, rank, 0); /* row it: the input of push it */
    h = device_matrix(1, d, resmat, 0, 0);
    nw = device_matrix(1, d, nwmat, 0, 0);
    if (!want || !ywant || !hb || !w[0] || !w[1] || !wg || !x || !h || !nw ||
        cudaMalloc((void **)&y, (size_t)LAYERS * f * 2) != cudaSuccess) {
        printf("      rank %d: %d x %d/%d: setup failed (memory)\n", rank, d, s->ko, s->kd);
        bad = 1;
        goto out;
    }
    reference(s, want, ywant);
    sf_k_tp a;
    for (int share = 0; share < 2 && !bad; share++) { /* the normed row shared through the scratch or not */
        cudaFree(h);
        if (!(h = device_matrix(1, d, resmat, 0, 0))) { bad = 1; break; }
        cudaMemset(y, 0xff, (size_t)LAYERS * f * 2); /* NaN in every output */
        memset(&a, 0, sizeof a);
        a.eps = 1e-5f;
        a.h = h;
        a.share = share;
        int krc = 0;
        for (int it = 0; it < LAYERS && !krc; it++) {
            for (int which = 0; which < 2 && !krc; which++) {
                a.mode = SF_TPK_PUSH; a.ch = which; a.prev = which ? 0 : it ? 1 : -1;
                a.x = x + (size_t)(it * 2 + which) * kmax; a.w = w[which]; a.m = d; a.k = kin(s, which);
                a.nw = NULL; a.y = NULL;
                krc = sf_k_gemv_tp(&a, l, st);
                if (which || krc) continue;
                a.mode = SF_TPK_GLU; a.ch = 0; a.prev = -1; a.x = NULL; a.w = wg; a.m = 2 * f; a.k = d; a.nw = nw;
                a.y = y + (size_t)it * f;
                krc = sf_k_gemv_tp(&a, l, st);
            }
        }
        a.mode = SF_TPK_SUM; a.ch = 1; a.prev = -1; a.k = d; a.m = 0; a.w = NULL;
        if (!krc) krc = sf_k_gemv_tp(&a, l, st);
        cudaError_t ce = krc ? (cudaError_t)krc : cudaStreamSynchronize(st);
        if (ce != cudaSuccess) {
            printf("      rank %d: %d x %d/%d (share %d): %s\n", rank, d, s->ko, s->kd, share, cudaGetErrorString(ce));
            bad = 1;
            break;
        }
        cudaMemcpy(hb, h, (size_t)d * 2, cudaMemcpyDeviceToHost); /* the stream: exact, every rank */
        for (int j = 0; j < d && !bad; j++)
            if (sf_bf16_to_f32(hb[j]) != want[j]) {
                printf("      rank %d: %d x %d/%d (share %d): stream[%d] = %g, want %g\n", rank, d, s->ko, s->kd,
                       share, j, sf_bf16_to_f32(hb[j]), want[j]);
                bad = 1;
            }
        cudaMemcpy(hb, y, (size_t)LAYERS * f * 2, cudaMemcpyDeviceToHost); /* gated: a few bf16 steps */
        double worst = 0;
        for (int it = 0; it < LAYERS && !bad; it++) {
            float scale = 0;
            for (int u = 0; u < f; u++) scale = fmaxf(scale, fabsf(ywant[(size_t)it * f + u]));
            for (int u = 0; u < f && !bad; u++) {
                float g = sf_bf16_to_f32(hb[(size_t)it * f + u]), wnt = ywant[(size_t)it * f + u];
                double dd = fabs((double)g - wnt);
                worst = fmax(worst, dd / fmax(scale, 1e-6));
                if (!(dd <= fabs(wnt) / 16 + scale / 64 + 1e-6)) { /* NaN fails here too */
                    printf("      rank %d: %d x %d/%d (share %d): layer %d gated[%d] = %g, want %g (scale %g)\n", rank,
                           d, s->ko, s->kd, share, it, u, g, wnt, scale);
                    bad = 1;
                }
            }
        }
        if (!bad && rank == 0)
            printf("      %5d x %5d/%5d (f %5d, share %d): stream exact after %d layers, gated outputs within %.1e of "
                   "their scale\n", d, s->ko, s->kd, f, share, LAYERS, worst);
    }
    /* the pushes alone, by ring stages (the same calls on both ranks) */
    for (int which = 0; which < 2 && !bad && d >= 4096; which++) {
        a.mode = SF_TPK_PUSH; a.x = x; a.w = w[which]; a.m = d; a.k = kin(s, which); a.nw = NULL; a.y = NULL;
        double us[4];
        for (int v = 0; v < 4; v++) us[v] = time_push(l, a, v ? v + 1 : 0, st);
        if (rank == 0)
            printf("PUSHTIME %d %d %.1f %.1f %.1f %.1f %.0f\n", d, a.k, us[0], us[1], us[2], us[3],
                   (double)d * a.k * 2 / 4.25e3); /* last: µs at 4.25 TB/s */
    }
out:
    cudaFree(w[0]); cudaFree(w[1]); cudaFree(wg); cudaFree(x); cudaFree(h); cudaFree(nw); cudaFree(y);
    free(want); free(ywant); free(hb);
    return bad;
}
#endif

/* A rank: 0 all checks passed, 1 a check failed, 77 fewer than 2 GPUs. */
static int rank_main(int rank, const char *boot)
{
#ifdef SF_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < RANKS) return 77;
    sf_error err = { 0 };
    int bad = 0;
    cudaStream_t st = NULL;
    if (cudaSetDevice(rank) != cudaSuccess || cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
        printf("      rank %d: cannot use GPU %d\n", rank, rank);
        return 1;
    }
    /* a channel's producers keep one width for the link's life: one communicator per width */
    /* Llama-3-8B and -70B at TP=2: O 4096 x 2048, down 4096 x 7168; O 8192 x 4096, down 8192 x 14336 */
    static const shape shapes[] = { { 64, 64, 64, 64 }, { 64, 1024, 256, 96 }, { 4096, 2048, 7168, 7168 },
                                    { 8192, 4096, 14336, 14336 } };
    sf_comm *c = NULL;
    const sf_k_tpl *l = NULL;
    for (int i = 0; i < (int)SF_ARRAY_LEN(shapes) && !bad; i++) {
        if (!i || shapes[i].d != shapes[i - 1].d) {
            char bs[64];
            snprintf(bs, sizeof bs, "%s%d", boot, i);
            sf_comm_opts co = { .rank = rank, .size = RANKS, .backend = "cuda", .bootstrap = bs, .device = rank,
                                .timeout_ms = 20000 };
            sf_comm_free(c);
            if (sf_comm_open(&co, &c, &err)) {
                printf("      rank %d: communicator: %s\n", rank, err.msg);
                c = NULL;
                bad = 1;
                break;
            }
            l = c->ops->tp_link ? c->ops->tp_link(c) : NULL;
            if (!l) {
                printf("      rank %d: no batch-1 link (no peer memory between the GPUs?)\n", rank);
                bad = 1;
                break;
            }
        }
        if (c->ops->barrier(c, &err)) { printf("      rank %d: barrier: %s\n", rank, err.msg); bad = 1; break; }
        bad += run_shape(rank, l, &shapes[i], st);
    }
    if (st) cudaStreamDestroy(st);
    sf_comm_free(c);
    return bad ? 1 : 0;
#else
    (void)rank;
    (void)boot;
    return 77;
#endif
}

static int skipped;

TEST(tp_push_chain)
{
    int codes[RANKS];
    REQUIRE(!tp_fork_ranks(RANKS, 3300 + (int)(getpid() % 200), rank_main, codes), "fork failed");
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
        printf("      %d GPU(s): the batch-1 link needs %d; nothing checked\n", n, RANKS);
        return test_summary();
    }
    RUN(tp_push_chain);
    if (skipped) printf("      CUDA sees fewer than %d GPUs: nothing checked\n", RANKS);
    return test_summary();
}
