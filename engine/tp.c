/* tp.c — tensor-parallel rank processes: the leader's side (group, followers, step plans)
 * and the followers' loop. See tp.h.
 *
 * Wire format of a step plan (two broadcasts from rank 0): a fixed tp_hdr, then for TP_STEP
 * the batch's int32 arrays back to back — tokens[T], pos[T], slot[T], seq_start[S+1],
 * seq_ctx[S], block_table[S*max_blocks], logit_rows[L] — then, with has_src, src_row[T], and
 * with draw, the sampler rows (sf_sample_row[L]) and penalty entries (sf_sample_pen[n_pen]) as
 * raw bytes. A drawn step with forms' allow masks (masks_later) sends them after the plan, in two
 * more broadcasts once every rank has queued the step's forward pass: an int32 count n (-1: this
 * step is not drawn on the ranks' samplers), then the row of each (int32[n]) and the masks
 * (uint32[n x mask_words], vocab bits each; the rows' own pointers mean nothing on another rank,
 * and rows asking for logprobs draw there without them). The follower waits for the header
 * without a timeout (the server may be idle) but notices a dead leader.
 *
 * Swap (engine/swap.h): TP_SWAP_INIT gives every follower a swap space of rank 0's slot count
 * for its own share of a block; TP_KV_COPY (int32 blocks[n], then slots[n]) has it copy those
 * blocks out to or in from those slots, in its order among the step plans, before rank 0 copies
 * its own share.
 *
 * Async scheduling (sf_tp_defer): rank 0 queues step N+1 before the ids of step N reach its
 * host, N+1's tokens taken from N's draw on the device (sf_batch.src_row). Every rank then
 * draws: the followers run the same sampler with the same rows on the same gathered logits
 * (the draw is a function of seed, step and logits), so each has N's ids on its own device for
 * N+1's tokens, and no ids cross between the ranks. A follower keeps at most two draws queued
 * and takes the oldest (watching the peers) before it queues a third. A step planned ahead with
 * a form's rows sends its masks after the plan (masks_later): rank 0 makes them from the ids of
 * the step before, which it takes while every rank runs the step's forward pass. */
#include "tp.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shard.h"
#include "swap.h"

#define TP_MAGIC 0x53465431u /* "SFT1" */
#define TP_SLOT_BYTES ((size_t)4 << 20)
#define TP_LOAD_TIMEOUT_MS 900000 /* ranks load their shards in parallel; a 70B dummy takes a while */

enum { TP_STEP = 1, TP_KV_INIT = 2, TP_STOP = 3, TP_BENCH_ALLREDUCE = 4, TP_CHECK_ALLREDUCE = 5, TP_SWAP_INIT = 6,
       TP_KV_COPY = 7 };

typedef struct tp_hdr {
    uint32_t magic;
    int32_t cmd;
    int32_t T, S, max_blocks, L;
    int32_t kv_layers, kv_blocks, kv_block_size, kv_heads, kv_head_dim, kv_dtype, kv_group;
    uint32_t payload; /* int32 values that follow */
    int64_t bench_n;  /* TP_BENCH_ALLREDUCE: elements and iterations */
    int32_t bench_iters;
    int32_t bench_path; /* sf_comm_path */
    int32_t draw;       /* TP_STEP: every rank draws (async scheduling; n_pen penalty entries) */
    int32_t n_pen;
    int32_t has_src;    /* TP_STEP: the batch has src_row */
    int32_t masks_later; /* TP_STEP with draw: forms' masks follow the forward pass (see the top) */
    int32_t mask_words;  /* their length, (vocab + 31) / 32 */
    int32_t swap_slots;  /* TP_SWAP_INIT: the swap space's slots (rank 0's count) */
    int32_t copy_n;      /* TP_KV_COPY: blocks, then as many slots, as payload; copy_d2h: out */
    int32_t copy_d2h;
} tp_hdr;

struct sf_tp {
    sf_tp_rank_opts o;
    sf_comm *comm;
    sf_shard shard;
    sf_forward *fwd;
    sf_backend *b;
    pid_t pids[SF_COMM_MAX_RANKS];
    int n_pids;
    int32_t *payload;
    size_t payload_cap;
    int dead;
    char dead_msg[512];
    double last_send_s; /* leader: time the last step plan took to send */
    int32_t *mpay;      /* the masks sent after a plan (masks_later) */
    size_t mpay_cap;
    int deferred;       /* sf_tp_defer: async scheduling, every rank draws */
};

/* Follower: where a rank's time goes between plans, summed over steps and logged when it stops
 * (the leader's side is in the engine's stats). */
typedef struct tp_clock {
    uint64_t steps;
    double idle_s;    /* waiting for the next plan's header */
    double recv_s;    /* receiving the plan's arrays */
    double step_s;    /* the forward step: enqueue, the device, the gather */
    double enqueue_s; /* of which the backend's host time queuing the step (CUDA) */
} tp_clock;

static void tp_clock_log(const sf_tp_rank_opts *o, const tp_clock *k)
{
    if (!k->steps) return;
    double n = (double)k->steps;
    SF_LOGI("rank %d: %llu steps; per step %.3f ms waiting for the plan, %.3f ms receiving it, %.3f ms in the "
            "forward step (%.3f ms of it enqueuing)", o->rank, (unsigned long long)k->steps, 1e3 * k->idle_s / n,
            1e3 * k->recv_s / n, 1e3 * k->step_s / n, 1e3 * k->enqueue_s / n);
}

/* ---- shared by both sides ----------------------------------------------------------------- */
static int grow(int32_t **p, size_t *cap, size_t n)
{
    if (n <= *cap) return SF_OK;
    int32_t *q = realloc(*p, n * sizeof *q);
    if (!q) return SF_ENOMEM;
    *p = q;
    *cap = n;
    return SF_OK;
}

static size_t rows_ints(int L) { return ((size_t)L * sizeof(sf_sample_row) + 3) / 4; }
static size_t pen_ints(int n) { return ((size_t)n * sizeof(sf_sample_pen) + 3) / 4; }

static size_t batch_ints(const tp_hdr *h)
{
    return (size_t)3 * h->T + (size_t)(h->S + 1) + h->S + (size_t)h->S * h->max_blocks + h->L;
}

static int count_masks(const sf_sample_row *rows, int L)
{
    int n = 0;
    for (int i = 0; i < L; i++) n += rows[i].allow != NULL;
    return n;
}

/* The rows' masks laid out at p: the row of each, then the masks (count_masks of L rows) */
static void pack_masks(int32_t *p, const sf_sample_row *rows, int L, int words)
{
    uint32_t *m = (uint32_t *)(p + count_masks(rows, L));
    for (int i = 0; i < L; i++) {
        if (!rows[i].allow) continue;
        *p++ = i;
        memcpy(m, rows[i].allow, (size_t)words * sizeof *m);
        m += words;
    }
}

/* Follower: n masks laid out at p (pack_masks) pointed to by their rows where they lie (the
 * buffer is kept until the next plan; the sampler copies the masks when the draw is queued) */
static int unpack_masks(const sf_tp_rank_opts *o, const int32_t *p, int n, int words, sf_sample_row *rows, int L,
                        sf_error *err)
{
    const uint32_t *masks = (const uint32_t *)(p + n);
    for (int m = 0; m < n; m++) {
        if (p[m] < 0 || p[m] >= L)
            return sf_err(err, SF_EFORMAT, "rank %d: a form's mask for row %d of %d", o->rank, p[m], L);
        rows[p[m]].allow = masks + (size_t)m * words;
    }
    return SF_OK;
}

static size_t payload_ints(const tp_hdr *h)
{
    return batch_ints(h) + (h->has_src ? (size_t)h->T : 0) +
           (h->draw ? rows_ints(h->L) + pen_ints(h->n_pen) : 0);
}

/* Points the batch's arrays into the payload. */
static void batch_from(const tp_hdr *h, int32_t *p, sf_batch *b)
{
    memset(b, 0, sizeof *b);
    b->n_tokens = h->T;
    b->n_seqs = h->S;
    b->max_blocks = h->max_blocks;
    b->n_logits = h->L;
    b->tokens = p; p += h->T;
    b->pos = p; p += h->T;
    b->slot = p; p += h->T;
    b->seq_start = p; p += h->S + 1;
    b->seq_ctx = p; p += h->S;
    b->block_table = p; p += (size_t)h->S * h->max_blocks;
    b->logit_rows = p; p += h->L;
    if (h->has_src) b->src_row = p;
}

static int join(sf_tp *t, sf_error *err)
{
    const sf_tp_rank_opts *o = &t->o;
    sf_comm_opts co = { .rank = o->rank, .size = o->size, .backend = o->backend, .shm_fd = o->shm_fd,
                        .bootstrap = o->bootstrap, .device = o->device, .timeout_ms = o->timeout_ms };
    return sf_comm_open(&co, &t->comm, err);
}

/* Shards the model and builds the forward pass on t->b, then waits (long timeout: the others
 * may still be loading) until every rank is ready. */
static int build(sf_tp *t, const sf_model *m, sf_error *err)
{
    const sf_tp_rank_opts *o = &t->o;
    int rc;
    if ((rc = sf_shard_make(m, o->rank, o->size, &t->shard, err)) ||
        (rc = sf_forward_new_tp(t->b, &t->shard, t->comm, o->max_tokens, o->max_logits, &t->fwd, err))) {
        sf_err_wrap(err, "rank %d", o->rank);
        t->comm->ops->abort(t->comm, err ? err->msg : "setup failed");
        return rc;
    }
    int keep = t->comm->timeout_ms;
    t->comm->timeout_ms = SF_MAX(keep, TP_LOAD_TIMEOUT_MS);
    rc = t->comm->ops->barrier(t->comm, err);
    t->comm->timeout_ms = keep;
    if (rc) return sf_err_wrap(err, "waiting for every rank to load its shard");
    return SF_OK;
}

static const char *path_name(sf_comm_path p)
{
    return p == SF_COMM_PATH_CUSTOM ? "own" : p == SF_COMM_PATH_NCCL ? "base" : p == SF_COMM_PATH_ONESHOT ? "one-shot"
         : p == SF_COMM_PATH_LL ? "LL" : "auto";
}

/* Every rank: iters all-reduces of an n-element buffer, then a sync and a barrier. *us: wall
 * time per all-reduce of the timed part on this rank. */
static int bench_all_reduce(sf_tp *t, int64_t n, int iters, sf_comm_path path, double *us, sf_error *err)
{
    sf_buf *buf = NULL;
    sf_comm_path keep = t->comm->path;
    if (path < SF_COMM_PATH_AUTO || path > SF_COMM_PATH_LL)
        return sf_err(err, SF_EINVAL, "rank %d: all-reduce bench: unknown path %d", t->o.rank, (int)path);
    int rc = t->b->ops->buf_new(t->b, 1, n, &buf, err);
    if (rc) return rc;
    t->comm->path = path;
    int warm = iters / 10 + 1;
    double t0 = 0;
    for (int i = 0; i < warm + iters && !rc; i++) {
        if (i == warm) {
            if ((rc = t->b->ops->sync(t->b))) break;
            t0 = sf_now_s();
        }
        rc = sf_comm_all_reduce_buf(t->comm, t->b, buf, 1, n, err);
    }
    if (!rc && (rc = t->b->ops->sync(t->b))) sf_err(err, rc, "rank %d: sync after the all-reduces failed", t->o.rank);
    if (!rc) *us = (sf_now_s() - t0) * 1e6 / iters;
    t->comm->path = keep;
    t->b->ops->buf_free(t->b, buf);
    if (!rc) rc = t->comm->ops->barrier(t->comm, err);
    return rc;
}

/* Value of element i on `rank` in round `it` of the all-reduce check: a multiple of 1/4 in
 * [-2, 2], so any sum over up to 64 ranks is exact in fp32 and in bf16. */
static float check_val(int rank, int64_t i, int it)
{
    return (float)((i * 7 + rank * 13 + it * 5) % 17 - 8) * 0.25f;
}

/* Every rank: `iters` rounds over message sizes that change every round (stale flags or
 * buffers of an earlier round show up as wrong sums), each checked against the exact sum, then
 * a burst of 8 all-reduces back to back without a host sync (x <- sum x: the values scale by
 * the rank count). A wrong value fails this rank with the first bad element. *worst: the
 * largest relative error seen. */
static int check_all_reduce(sf_tp *t, int64_t max_n, int iters, sf_comm_path path, double *worst, sf_error *err)
{
    static const int64_t sizes[] = { 1, 7, 8, 1000, 4096, 8192, 65539, 262144, 524288, 1048576, 2097152 };
    int N = t->o.size, rc = SF_OK, cpu = !strcmp(t->b->ops->name, "cpu");
    sf_buf *buf = NULL;
    float *h = malloc((size_t)max_n * sizeof *h), *want = malloc((size_t)max_n * sizeof *want);
    sf_comm_path keep = t->comm->path;
    *worst = 0;
    if (!h || !want) {
        rc = sf_err(err, SF_ENOMEM, "rank %d: all-reduce check: out of memory", t->o.rank);
        goto out;
    }
    if ((rc = t->b->ops->buf_new(t->b, 1, max_n, &buf, err))) goto out;
    t->comm->path = path;
    for (int it = 0; it <= iters && !rc; it++) {
        int64_t n = SF_MIN(max_n, sizes[it % SF_ARRAY_LEN(sizes)]);
        int burst = it == iters; /* the last round: 8 back to back */
        for (int64_t i = 0; i < n; i++) {
            h[i] = check_val(t->o.rank, i, it);
            float w = 0;
            for (int r = 0; r < N; r++) w += check_val(r, i, it);
            want[i] = w;
        }
        if (burst)
            for (int64_t i = 0; i < n; i++) want[i] *= (float)pow(N, 7);
        if ((rc = t->b->ops->write_f32(t->b, buf, 1, h))) break;
        for (int k = 0; k < (burst ? 8 : 1) && !rc; k++) rc = sf_comm_all_reduce_buf(t->comm, t->b, buf, 1, n, err);
        if (rc || (rc = t->b->ops->read_f32(t->b, buf, 1, h))) break;
        /* bf16 on the device: exact until the burst scales past 8 significant bits */
        double tol = cpu || !burst || !(N & (N - 1)) ? 0 : 1e-2;
        for (int64_t i = 0; i < n; i++) {
            double d = fabs((double)h[i] - want[i]) / fmax(1.0, fabs(want[i]));
            *worst = fmax(*worst, d);
            if (d > tol) {
                rc = sf_err(err, SF_ERROR, "rank %d: all-reduce check (%s path), round %d, %lld values: element %lld "
                            "is %g, the sum is %g", t->o.rank, path_name(path), it, (long long)n, (long long)i, h[i],
                            want[i]);
                break;
            }
        }
    }
    if (rc && !err->msg[0]) sf_err(err, rc, "rank %d: all-reduce check: a backend op failed (logged above)", t->o.rank);
    if (!rc) rc = t->comm->ops->barrier(t->comm, err);
out:
    t->comm->path = keep;
    if (buf) t->b->ops->buf_free(t->b, buf);
    free(h);
    free(want);
    return rc;
}

/* ---- follower -------------------------------------------------------------------------------- */
/* A follower's draws under async scheduling: ids land in ring[k] (valid until taken); the rows
 * and penalty entries are copied out of the payload (8-byte aligned). */
typedef struct fol_draws {
    int on, queued, k;
    int32_t *ring[2];
    sf_sample_row *rows;
    sf_sample_pen *pen;
    size_t rows_cap, pen_cap;
    int32_t *mrecv;             /* masks sent after the plan, as received */
    size_t mrecv_cap;
} fol_draws;

static void fol_draws_free(fol_draws *d)
{
    free(d->ring[0]);
    free(d->ring[1]);
    free(d->rows);
    free(d->pen);
    free(d->mrecv);
}

/* Follower, a step planned ahead with forms' rows (masks_later): the masks rank 0 sends once it
 * has the ids they follow; called between the forward pass and the draw
 * (sf_forward_sample.prepare). A count of -1: not drawn on the samplers (SF_EUNSUPPORTED, as
 * when rank 0's sampler declines). */
typedef struct fol_masks {
    sf_tp *t;
    const tp_hdr *h;
    fol_draws *d;
    sf_error *err;
} fol_masks;

static int follower_masks(void *arg)
{
    fol_masks *q = arg;
    sf_tp *t = q->t;
    const sf_tp_rank_opts *o = &t->o;
    int32_t n = 0;
    int rc = t->comm->ops->broadcast(t->comm, &n, sizeof n, 0, 0, q->err);
    if (rc) return rc;
    if (n == -1) return SF_EUNSUPPORTED;
    if (n < 0 || n > q->h->L) return sf_err(q->err, SF_EFORMAT, "rank %d: %d forms' masks for %d rows", o->rank, n, q->h->L);
    const size_t ints = (size_t)n * (1 + (size_t)q->h->mask_words);
    if (grow(&q->d->mrecv, &q->d->mrecv_cap, ints ? ints : 1))
        return sf_err(q->err, SF_ENOMEM, "rank %d: out of memory for the forms' masks", o->rank);
    if (ints && (rc = t->comm->ops->broadcast(t->comm, q->d->mrecv, ints * sizeof(int32_t), 0, 0, q->err))) return rc;
    return unpack_masks(o, q->d->mrecv, n, q->h->mask_words, q->d->rows, q->h->L, q->err);
}

/* The step as rank 0 runs it, drawing as rank 0 does (see the top): at most two draws queued. */
static int follower_draw(sf_tp *t, const tp_hdr *h, int32_t *payload, const sf_batch *b, fol_draws *d, sf_error *err)
{
    const sf_tp_rank_opts *o = &t->o;
    int rc;
    if (!d->on) {
        for (int i = 0; i < 2; i++)
            if (!d->ring[i] && !(d->ring[i] = malloc((size_t)SF_MAX(o->max_logits, 1) * sizeof(int32_t))))
                return sf_err(err, SF_ENOMEM, "rank %d: out of memory for the drawn ids", o->rank);
        if ((rc = sf_forward_defer(t->fwd, 1, err))) return sf_err_wrap(err, "rank %d", o->rank);
        d->on = 1;
    }
    if (h->L > o->max_logits)
        return sf_err(err, SF_EFORMAT, "rank %d: a step plan draws %d rows (this rank takes up to %d)", o->rank, h->L,
                      o->max_logits);
    if ((size_t)h->L > d->rows_cap) {
        sf_sample_row *r = realloc(d->rows, (size_t)h->L * sizeof *r);
        if (!r) return sf_err(err, SF_ENOMEM, "rank %d: out of memory for the sampler rows", o->rank);
        d->rows = r;
        d->rows_cap = (size_t)h->L;
    }
    if ((size_t)h->n_pen > d->pen_cap) {
        sf_sample_pen *q = realloc(d->pen, (size_t)h->n_pen * sizeof *q);
        if (!q) return sf_err(err, SF_ENOMEM, "rank %d: out of memory for the penalty entries", o->rank);
        d->pen = q;
        d->pen_cap = (size_t)h->n_pen;
    }
    /* no penalty entries (or rows): nothing to copy, and d->pen may still be NULL (memcpy with a
     * null pointer is undefined even for 0 bytes; UBSan stops the rank there) */
    const int32_t *p = payload + batch_ints(h) + (h->has_src ? h->T : 0);
    if (h->L) memcpy(d->rows, p, (size_t)h->L * sizeof *d->rows);
    if (h->n_pen) memcpy(d->pen, p + rows_ints(h->L), (size_t)h->n_pen * sizeof *d->pen);
    /* the rows' mask pointers are rank 0's: each row gets this rank's copy, or none; logprobs
     * are rank 0's to report (the draw does not depend on them) */
    for (int i = 0; i < h->L; i++) {
        d->rows[i].allow = NULL;
        d->rows[i].logprobs = 0;
    }
    if (d->queued == 2) { /* the oldest first: the backend keeps two */
        if ((rc = sf_forward_take(t->fwd, err))) return rc;
        d->queued--;
    }
    fol_masks fm = { .t = t, .h = h, .d = d, .err = err };
    sf_forward_sample smp = { .rows = d->rows, .pen = d->pen, .n_pen = h->n_pen, .ids = d->ring[d->k],
                              .prepare = h->masks_later ? follower_masks : NULL, .prepare_arg = &fm };
    rc = sf_forward_launch_sample(t->fwd, b, &smp, err);
    if (rc == SF_EUNSUPPORTED) return SF_OK; /* rank 0's sampler declined the same sizes: no draw here either */
    if (!rc) rc = sf_forward_wait_sample(t->fwd, err);
    if (rc) return rc;
    d->queued++;
    d->k ^= 1;
    return SF_OK;
}

/* Follower, TP_KV_COPY: its share of the blocks to or from its own slots (the same ids as rank
 * 0's), behind the steps it has queued. */
static int follower_kv_copy(sf_tp *t, const tp_hdr *h, sf_swap *sw, sf_error *err)
{
    const int n = h->copy_n;
    if (n < 1 || h->payload != 2 * (uint32_t)n || !sw->n_slots)
        return sf_err(err, SF_EFORMAT, "rank %d: a KV copy of %d blocks (%u values) %s", t->o.rank, n, h->payload,
                      sw->n_slots ? "malformed" : "without a swap space");
    int rc = grow(&t->payload, &t->payload_cap, h->payload);
    if (rc) return sf_err(err, rc, "rank %d: out of memory for a KV copy of %d blocks", t->o.rank, n);
    if ((rc = t->comm->ops->broadcast(t->comm, t->payload, h->payload * sizeof(int32_t), 0, 0, err))) return rc;
    const int32_t *blocks = t->payload, *slots = t->payload + n;
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= sw->n_slots)
            return sf_err(err, SF_EFORMAT, "rank %d: swap slot %d out of range [0, %d)", t->o.rank, slots[i], sw->n_slots);
    rc = sf_swap_copy_blocks(t->b, sw->mem, sw->block_bytes, blocks, slots, n, h->copy_d2h, &sw->batched_off, err);
    return rc ? sf_err_wrap(err, "rank %d", t->o.rank) : SF_OK;
}

int sf_tp_follower_run(const sf_tp_rank_opts *o, sf_error *err)
{
    sf_model *m = NULL;
    sf_tp t;
    tp_clock clk = { 0 };
    fol_draws dr = { 0 };
    sf_kv_config kc = { 0 }; /* this rank's KV cache (TP_KV_INIT) */
    sf_swap sw = { 0 };      /* and its swap space (TP_SWAP_INIT) */
    memset(&t, 0, sizeof t);
    t.o = *o;
    int rc;
    if (o->rank < 1 || o->rank >= o->size) return sf_err(err, SF_EINVAL, "rank %d of %d is not a follower", o->rank, o->size);
    sf_load_opts lo = { .dummy = o->load_dummy, .dummy_format = o->dummy_format,
                        .seed = o->seed, .shard_rank = o->rank, .shard_size = o->size };
    sf_backend_opts bo = { .name = o->backend, .n_threads = o->n_threads, .device = o->device };
    if ((rc = join(&t, err)) || (rc = sf_model_load(o->model, &lo, &m, err)) ||
        (rc = sf_backend_open(&bo, &t.b, err)) || (rc = build(&t, m, err)))
        goto out;
    for (;;) {
        tp_hdr h;
        double t0 = sf_now_s();
        if ((rc = t.comm->ops->broadcast(t.comm, &h, sizeof h, 0, 1, err))) goto out;
        double t1 = sf_now_s();
        if (h.magic != TP_MAGIC) {
            rc = sf_err(err, SF_EFORMAT, "rank %d: a step plan with a bad magic (a different semflow build as leader?)",
                        o->rank);
            goto out;
        }
        if (h.cmd == TP_STOP) break;
        if (h.cmd == TP_CHECK_ALLREDUCE) {
            double worst;
            if ((rc = check_all_reduce(&t, h.bench_n, h.bench_iters, (sf_comm_path)h.bench_path, &worst, err))) goto out;
            continue;
        }
        if (h.cmd == TP_BENCH_ALLREDUCE) {
            double us;
            if ((rc = bench_all_reduce(&t, h.bench_n, h.bench_iters, (sf_comm_path)h.bench_path, &us, err))) goto out;
            continue;
        }
        if (h.cmd == TP_KV_INIT) {
            kc = (sf_kv_config){ .n_layers = h.kv_layers, .n_blocks = h.kv_blocks, .block_size = h.kv_block_size,
                                 .n_kv_heads = h.kv_heads, .head_dim = h.kv_head_dim, .dtype = (sf_dtype)h.kv_dtype,
                                 .group = h.kv_group };
            int lrc = t.b->ops->kv_init(t.b, &kc, err);
            /* every rank reports through a barrier-like all-reduce-free step: a failing rank aborts */
            if (lrc) {
                rc = lrc;
                goto out;
            }
            if ((rc = t.comm->ops->barrier(t.comm, err))) goto out;
            continue;
        }
        if (h.cmd == TP_SWAP_INIT) {
            sf_swap_free(&sw);
            if (!kc.n_blocks || h.swap_slots < 1 || !t.b->ops->kv_copy_out || !t.b->ops->kv_copy_in)
                rc = sf_err(err, SF_EFORMAT, "rank %d: a swap space of %d slots before the KV cache, or on a backend "
                            "that cannot copy KV blocks", o->rank, h.swap_slots);
            else rc = sf_swap_init_slots(&sw, t.b, t.b->ops->kv_block_bytes(t.b, &kc), h.swap_slots, err);
            if (rc || (rc = t.comm->ops->barrier(t.comm, err))) goto out;
            continue;
        }
        if (h.cmd == TP_KV_COPY) {
            if ((rc = follower_kv_copy(&t, &h, &sw, err))) goto out;
            continue;
        }
        if (h.cmd != TP_STEP || h.T < 1 || h.S < 1 || h.L < 0 || h.max_blocks < 0 || h.n_pen < 0 ||
            (h.masks_later && (!h.draw || h.mask_words != (t.shard.m.cfg.vocab_size + 31) / 32)) ||
            (h.has_src && !h.draw) || payload_ints(&h) != h.payload) {
            rc = sf_err(err, SF_EFORMAT, "rank %d: malformed step plan (command %d, %d tokens, %d sequences)", o->rank,
                        h.cmd, h.T, h.S);
            goto out;
        }
        if (grow(&t.payload, &t.payload_cap, h.payload)) {
            rc = sf_err(err, SF_ENOMEM, "rank %d: out of memory for a step plan of %u values", o->rank, h.payload);
            goto out;
        }
        if ((rc = t.comm->ops->broadcast(t.comm, t.payload, h.payload * sizeof(int32_t), 0, 0, err))) goto out;
        double t2 = sf_now_s();
        sf_batch b;
        batch_from(&h, t.payload, &b);
        if ((rc = h.draw ? follower_draw(&t, &h, t.payload, &b, &dr, err) : sf_forward_step(t.fwd, &b, NULL, err)))
            goto out;
        sf_backend_stats bs;
        clk.steps++;
        clk.idle_s += t1 - t0;
        clk.recv_s += t2 - t1;
        clk.step_s += sf_now_s() - t2;
        if (sf_backend_cuda_stats(t.b, &bs) == SF_OK) clk.enqueue_s += bs.last_step_host_us * 1e-6;
    }
out:
    while (dr.queued-- > 0) { /* the draws still queued: their steps complete before the teardown */
        sf_error e2 = { 0 };
        if (!rc && (rc = sf_forward_take(t.fwd, &e2)) && err) *err = e2;
    }
    fol_draws_free(&dr);
    sf_swap_free(&sw);
    tp_clock_log(o, &clk); /* also when the group failed: where the time went until then */
    /* graphs holding NCCL calls first: NCCL's destroy and abort wait for them to go */
    if (t.b && t.b->ops->graphs_release) t.b->ops->graphs_release(t.b);
    if (rc && t.comm) t.comm->ops->abort(t.comm, err ? err->msg : "follower failed");
    sf_forward_free(t.fwd);
    sf_shard_free(&t.shard);
    sf_comm_free(t.comm);
    if (t.b) sf_backend_close(t.b);
    sf_model_free(m);
    free(t.payload);
    return rc;
}

/* ---- leader ------------------------------------------------------------------------------------ */
int sf_tp_group_create(sf_tp_rank_opts *o, sf_error *err)
{
    if (!strcmp(o->backend, "cpu"))
        return sf_comm_cpu_create(o->size, TP_SLOT_BYTES, &o->shm_fd, err);
    if (o->bootstrap) return SF_OK;
    /* one host: a free loopback port for the NCCL bootstrap */
    static char addr[64];
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &len)) {
        int e = errno;
        if (s >= 0) close(s);
        return sf_err(err, SF_EIO, "tensor parallelism: no free loopback port for the NCCL bootstrap: %s", strerror(e));
    }
    close(s);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
    o->bootstrap = addr;
    return SF_OK;
}

int sf_tp_leader_new(const sf_tp_rank_opts *o, const sf_model *m, sf_backend *b, const pid_t *pids, sf_tp **out,
                     sf_error *err)
{
    *out = NULL;
    if (o->rank != 0) return sf_err(err, SF_EINVAL, "tensor parallelism: the leader is rank 0, not %d", o->rank);
    sf_tp *t = calloc(1, sizeof *t);
    if (!t) return sf_err(err, SF_ENOMEM, "tensor parallelism: out of memory");
    t->o = *o;
    t->b = b;
    for (int i = 0; pids && i < o->size - 1; i++) t->pids[t->n_pids++] = pids[i];
    int rc = join(t, err);
    if (!rc) rc = build(t, m, err);
    if (rc) {
        sf_tp_free(t);
        return rc;
    }
    *out = t;
    return SF_OK;
}

int sf_tp_follower_argv(const sf_tp_rank_opts *o, int rank, const char *exe, char *buf, size_t n, char **argv,
                        int max_args)
{
    int k = 0;
    size_t used = 0;
#define ARG(...)                                                                            \
    do {                                                                                    \
        int w_ = snprintf(buf + used, n - used, __VA_ARGS__);                               \
        if (w_ < 0 || (size_t)w_ >= n - used || k + 2 > max_args) return SF_EINVAL;        \
        argv[k++] = buf + used;                                                             \
        used += (size_t)w_ + 1;                                                             \
    } while (0)
    ARG("%s", exe);
    ARG("rank");
    ARG("--rank"); ARG("%d", rank);
    ARG("--size"); ARG("%d", o->size);
    ARG("--model"); ARG("%s", o->model);
    ARG("--backend"); ARG("%s", o->backend);
    ARG("--threads"); ARG("%d", o->n_threads);
    ARG("--device"); ARG("%d", o->device + rank);
    ARG("--max-tokens"); ARG("%d", o->max_tokens);
    ARG("--max-logits"); ARG("%d", o->max_logits);
    ARG("--seed"); ARG("%llu", (unsigned long long)o->seed);
    ARG("--timeout-ms"); ARG("%d", o->timeout_ms);
    if (o->load_dummy) ARG("--load-dummy");
    if (o->dummy_format) { ARG("--dummy-format"); ARG("%s", o->dummy_format); }
    if (o->shm_fd >= 0) { ARG("--shm-fd"); ARG("%d", o->shm_fd); }
    if (o->bootstrap) { ARG("--bootstrap"); ARG("%s", o->bootstrap); }
#undef ARG
    argv[k] = NULL;
    return k;
}

int sf_tp_parse_rank_args(int argc, char **argv, sf_tp_rank_opts *o, sf_error *err)
{
    memset(o, 0, sizeof *o);
    o->shm_fd = -1;
    o->backend = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--load-dummy")) { o->load_dummy = 1; continue; }
        if (i + 1 >= argc) return sf_err(err, SF_EINVAL, "semflow rank: %s needs a value", a);
        const char *v = argv[++i];
        char *end = NULL;
        long long n = strtoll(v, &end, 10);
        int num = end && *end == 0 && end != v;
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--bootstrap")) o->bootstrap = v;
        else if (!strcmp(a, "--dummy-format")) o->dummy_format = v;
        else if (!num) return sf_err(err, SF_EINVAL, "semflow rank: unknown option %s or '%s' is not a number", a, v);
        else if (!strcmp(a, "--rank")) o->rank = (int)n;
        else if (!strcmp(a, "--size")) o->size = (int)n;
        else if (!strcmp(a, "--threads")) o->n_threads = (int)n;
        else if (!strcmp(a, "--device")) o->device = (int)n;
        else if (!strcmp(a, "--max-tokens")) o->max_tokens = (int)n;
        else if (!strcmp(a, "--max-logits")) o->max_logits = (int)n;
        else if (!strcmp(a, "--seed")) o->seed = (uint64_t)n;
        else if (!strcmp(a, "--timeout-ms")) o->timeout_ms = (int)n;
        else if (!strcmp(a, "--shm-fd")) o->shm_fd = (int)n;
        else return sf_err(err, SF_EINVAL, "semflow rank: unknown option %s", a);
    }
    if (!o->model || o->size < 2 || o->rank < 1 || o->rank >= o->size || o->max_tokens < 1 || o->max_logits < 1)
        return sf_err(err, SF_EINVAL, "semflow rank: needs --model, --size >= 2, --rank in [1, size), --max-tokens and "
                      "--max-logits (it is started by the leader of --tensor-parallel-size, not by hand)");
    return SF_OK;
}

int sf_tp_start(const sf_tp_rank_opts *o_in, const char *exe, const sf_model *m, sf_backend *b, sf_tp **out,
                sf_error *err)
{
    *out = NULL;
    sf_tp_rank_opts o = *o_in;
    o.shm_fd = -1;
    pid_t pids[SF_COMM_MAX_RANKS];
    int n = 0, rc;
    if (o.size < 2 || o.size > SF_COMM_MAX_RANKS)
        return sf_err(err, SF_EINVAL, "--tensor-parallel-size %d: use 2..%d (1 runs without it)", o.size,
                      SF_COMM_MAX_RANKS);
    if ((rc = sf_shard_check(&m->cfg, o.size, err))) return rc;
    if ((rc = sf_tp_group_create(&o, err))) return rc;
    if (!exe) exe = "/proc/self/exe";
    for (int r = 1; r < o.size; r++) {
        char buf[4096], *argv[40];
        if (sf_tp_follower_argv(&o, r, exe, buf, sizeof buf, argv, 40) < 0) {
            rc = sf_err(err, SF_EINVAL, "tensor parallelism: the follower command line is too long (model path?)");
            goto fail;
        }
        pid_t pid = fork();
        if (pid < 0) {
            rc = sf_err(err, SF_ERROR, "tensor parallelism: fork of rank %d: %s", r, strerror(errno));
            goto fail;
        }
        if (pid == 0) {
            /* No PR_SET_PDEATHSIG: it fires when the forking *thread* exits (a loader thread
             * would take the followers with it). A follower notices a dead leader at its next
             * wait instead (comm liveness checks). The rank starts with no signal blocked:
             * the forking thread blocks SIGTERM and friends (sf_thread_create). */
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            execv(exe, argv);
            fprintf(stderr, "semflow rank %d: exec %s: %s\n", r, exe, strerror(errno));
            _exit(127);
        }
        pids[n++] = pid;
    }
    rc = sf_tp_leader_new(&o, m, b, pids, out, err);
    n = 0; /* the leader owns them now (and reaped them on failure) */
fail:
    for (int i = 0; i < n; i++) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], NULL, 0);
    }
    if (o.shm_fd >= 0) close(o.shm_fd); /* the mappings stay */
    return rc;
}

int sf_tp_kv_heads(const sf_tp *t) { return t->shard.m.cfg.n_kv_heads; }

sf_forward *sf_tp_forward(sf_tp *t) { return t->fwd; }

const sf_model *sf_tp_model(const sf_tp *t) { return &t->shard.m; }

/* Leader: how the followers it started that are gone ended ("rank 1 exited with status 1",
 * "rank 2 was killed by signal 11 (Segmentation fault)"), joined by "; " into buf; "" when none
 * is gone. The status stays to be reaped (WNOWAIT): sf_tp_free waits for the followers. A rank
 * that dies without an error of its own (a crash, a sanitizer's report) leaves only this and its
 * stderr, which it shares with the leader. */
static void exits_str(const sf_tp *t, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < t->n_pids && used < n; i++) {
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)t->pids[i], &si, WEXITED | WNOHANG | WNOWAIT) || si.si_pid != t->pids[i]) continue;
        int w = si.si_code == CLD_EXITED
                    ? snprintf(buf + used, n - used, "%srank %d exited with status %d", used ? "; " : "", i + 1,
                               si.si_status)
                    : snprintf(buf + used, n - used, "%srank %d was killed by signal %d (%s)", used ? "; " : "", i + 1,
                               si.si_status, strsignal(si.si_status));
        if (w < 0) break;
        used += (size_t)w;
    }
}

static int dead(sf_tp *t, int rc, sf_error *err)
{
    if (!t->dead) {
        char ex[160];
        t->dead = 1;
        exits_str(t, ex, sizeof ex);
        snprintf(t->dead_msg, sizeof t->dead_msg, "tensor-parallel group of %d ranks failed%s%s%s: %s", t->o.size,
                 ex[0] ? " (" : "", ex, ex[0] ? "; why is on its stderr, which it shares with this process" : "",
                 err ? err->msg : sf_status_str(rc));
        t->comm->ops->abort(t->comm, t->dead_msg);
        SF_LOGE("%s", t->dead_msg);
    }
    return sf_err(err, SF_ENODEV, "%s", t->dead_msg);
}

static int send_hdr(sf_tp *t, tp_hdr *h, sf_error *err)
{
    h->magic = TP_MAGIC;
    return t->comm->ops->broadcast(t->comm, h, sizeof *h, 0, 0, err);
}

int sf_tp_kv_init(sf_tp *t, const sf_kv_config *kc, sf_error *err)
{
    if (t->dead) return sf_err(err, SF_ENODEV, "%s", t->dead_msg);
    tp_hdr h = { .cmd = TP_KV_INIT, .kv_layers = kc->n_layers, .kv_blocks = kc->n_blocks,
                 .kv_block_size = kc->block_size, .kv_heads = kc->n_kv_heads, .kv_head_dim = kc->head_dim,
                 .kv_dtype = kc->dtype, .kv_group = kc->group };
    int rc = send_hdr(t, &h, err);
    if (!rc && (rc = t->b->ops->kv_init(t->b, kc, err))) return dead(t, rc, err);
    if (!rc) rc = t->comm->ops->barrier(t->comm, err);
    return rc ? dead(t, rc, err) : SF_OK;
}

int sf_tp_swap_init(sf_tp *t, int n_slots, sf_error *err)
{
    if (t->dead) return sf_err(err, SF_ENODEV, "%s", t->dead_msg);
    if (n_slots < 1) return sf_err(err, SF_EINVAL, "tensor parallelism: a swap space of %d slots", n_slots);
    tp_hdr h = { .cmd = TP_SWAP_INIT, .swap_slots = n_slots };
    int rc = send_hdr(t, &h, err);
    if (!rc) rc = t->comm->ops->barrier(t->comm, err);
    return rc ? dead(t, sf_err_wrap(err, "the followers' swap space"), err) : SF_OK;
}

int sf_tp_kv_copy(sf_tp *t, const int32_t *blocks, const int32_t *slots, int n, int d2h, sf_error *err)
{
    if (t->dead) return sf_err(err, SF_ENODEV, "%s", t->dead_msg);
    if (n < 1) return SF_OK;
    int rc = grow(&t->payload, &t->payload_cap, 2 * (size_t)n);
    if (rc) return sf_err(err, rc, "tensor parallelism: out of memory for a KV copy of %d blocks", n);
    memcpy(t->payload, blocks, (size_t)n * sizeof *blocks);
    memcpy(t->payload + n, slots, (size_t)n * sizeof *slots);
    tp_hdr h = { .cmd = TP_KV_COPY, .copy_n = n, .copy_d2h = d2h, .payload = 2 * (uint32_t)n };
    if (!(rc = send_hdr(t, &h, err)))
        rc = t->comm->ops->broadcast(t->comm, t->payload, h.payload * sizeof(int32_t), 0, 0, err);
    return rc ? dead(t, rc, err) : SF_OK;
}

/* Rank 0, a drawn step with forms' masks (masks_later): the caller's prepare, when it has one,
 * makes them (from the ids of the step before), then they go to every rank (see the top); when
 * it fails, a count of -1 tells the followers not to draw. */
typedef struct lead_masks {
    sf_tp *t;
    const sf_forward_sample *smp;
    int L;
    sf_error *err;
} lead_masks;

static int leader_masks(void *arg)
{
    lead_masks *q = arg;
    sf_tp *t = q->t;
    const int words = (t->shard.m.cfg.vocab_size + 31) / 32;
    int rc = q->smp->prepare ? q->smp->prepare(q->smp->prepare_arg) : SF_OK;
    int32_t n = rc ? -1 : count_masks(q->smp->rows, q->L);
    const size_t ints = n > 0 ? (size_t)n * (1 + (size_t)words) : 0;
    int brc = grow(&t->mpay, &t->mpay_cap, ints ? ints : 1);
    if (brc) n = -1; /* the followers skip the draw; so does this rank */
    else if (ints) pack_masks(t->mpay, q->smp->rows, q->L, words);
    if ((brc = t->comm->ops->broadcast(t->comm, &n, sizeof n, 0, 0, q->err)) ||
        (n > 0 && (brc = t->comm->ops->broadcast(t->comm, t->mpay, ints * sizeof(int32_t), 0, 0, q->err))))
        return brc;
    return rc ? rc : n < 0 ? SF_EUNSUPPORTED : SF_OK;
}

/* The step plan to every rank, then this rank's step: logits to host memory, or sampled on
 * rank 0's device (smp; launch: queued, sf_tp_wait_sample waits for the ids). A draw with
 * forms' masks, given in its rows or made in smp->prepare, sends them after the plan
 * (masks_later). */
static int step(sf_tp *t, const sf_batch *b, float *logits, const sf_forward_sample *smp, int launch, sf_error *err)
{
    if (t->dead) return sf_err(err, SF_ENODEV, "%s", t->dead_msg);
    tp_hdr h = { .cmd = TP_STEP, .T = b->n_tokens, .S = b->n_seqs, .max_blocks = b->max_blocks, .L = b->n_logits,
                 .draw = smp && launch && t->deferred, .has_src = b->src_row != NULL };
    h.n_pen = h.draw ? smp->n_pen : 0;
    h.mask_words = (t->shard.m.cfg.vocab_size + 31) / 32;
    h.masks_later = h.draw && (smp->prepare || count_masks(smp->rows, h.L));
    if (h.has_src && !h.draw)
        return sf_err(err, SF_EINVAL, "tensor parallelism: a step takes tokens from a draw (src_row) that the "
                      "followers did not make (async scheduling needs sf_tp_defer and sf_tp_launch_sample)");
    size_t n = payload_ints(&h);
    if (h.T < 1 || h.S < 1 || grow(&t->payload, &t->payload_cap, n))
        return sf_err(err, h.T < 1 || h.S < 1 ? SF_EINVAL : SF_ENOMEM, "tensor parallelism: step of %d tokens in %d "
                      "sequences (empty, or out of memory)", h.T, h.S);
    h.payload = (uint32_t)n;
    int32_t *p = t->payload;
#define PUT(src, cnt) do { memcpy(p, (src), (size_t)(cnt) * sizeof(int32_t)); p += (cnt); } while (0)
    PUT(b->tokens, h.T);
    PUT(b->pos, h.T);
    PUT(b->slot, h.T);
    PUT(b->seq_start, h.S + 1);
    PUT(b->seq_ctx, h.S);
    PUT(b->block_table, (size_t)h.S * h.max_blocks);
    PUT(b->logit_rows, h.L);
    if (h.has_src) PUT(b->src_row, h.T);
    if (h.draw) {
        if (h.L) memcpy(p, smp->rows, (size_t)h.L * sizeof *smp->rows);
        p += rows_ints(h.L);
        if (h.n_pen) memcpy(p, smp->pen, (size_t)h.n_pen * sizeof *smp->pen);
        p += pen_ints(h.n_pen);
    }
#undef PUT
    int rc;
    double t0 = sf_now_s();
    if ((rc = send_hdr(t, &h, err)) ||
        (rc = t->comm->ops->broadcast(t->comm, t->payload, n * sizeof(int32_t), 0, 0, err)))
        return dead(t, rc, err);
    t->last_send_s = sf_now_s() - t0;
    lead_masks lm = { .t = t, .smp = smp, .L = h.L, .err = err };
    sf_forward_sample later;
    if (h.masks_later) {
        later = *smp;
        later.prepare = leader_masks;
        later.prepare_arg = &lm;
        smp = &later;
    }
    rc = !smp ? sf_forward_step(t->fwd, b, logits, err)
         : launch ? sf_forward_launch_sample(t->fwd, b, smp, err) : sf_forward_step_sample(t->fwd, b, smp, err);
    /* a sampler that declined these sizes is no failure of the group: the step ran on every
     * rank, and the caller samples on the host from sf_forward_read_logits */
    if (rc == SF_EUNSUPPORTED && smp) return rc;
    return rc ? dead(t, rc, err) : SF_OK;
}

int sf_tp_step(sf_tp *t, const sf_batch *b, float *logits, sf_error *err)
{
    return step(t, b, logits, NULL, 0, err);
}

int sf_tp_step_sample(sf_tp *t, const sf_batch *b, const sf_forward_sample *smp, sf_error *err)
{
    if (!sf_forward_can_sample(t->fwd))
        return sf_err(err, SF_EUNSUPPORTED, "tensor parallelism: rank 0's backend cannot sample (sample on the host)");
    return step(t, b, NULL, smp, 0, err);
}

int sf_tp_launch_sample(sf_tp *t, const sf_batch *b, const sf_forward_sample *smp, sf_error *err)
{
    if (!sf_forward_can_sample(t->fwd))
        return sf_err(err, SF_EUNSUPPORTED, "tensor parallelism: rank 0's backend cannot sample (sample on the host)");
    return step(t, b, NULL, smp, 1, err);
}

int sf_tp_wait_sample(sf_tp *t, sf_error *err)
{
    if (t->dead) return sf_err(err, SF_ENODEV, "%s", t->dead_msg);
    int rc = sf_forward_wait_sample(t->fwd, err);
    return rc ? dead(t, rc, err) : SF_OK;
}

int sf_tp_defer(sf_tp *t, int on, sf_error *err)
{
    if (t->dead) return sf_err(err, SF_ENODEV, "%s", t->dead_msg);
    int rc = sf_forward_defer(t->fwd, on, err);
    if (!rc) t->deferred = on != 0;
    return rc;
}

int sf_tp_take(sf_tp *t, sf_error *err)
{
    if (t->dead) return sf_err(err, SF_ENODEV, "%s", t->dead_msg);
    int rc = sf_forward_take(t->fwd, err);
    return rc ? dead(t, rc, err) : SF_OK;
}

double sf_tp_last_send_s(const sf_tp *t) { return t->last_send_s; }

int sf_tp_bench_all_reduce_path(sf_tp *t, int64_t n, int iters, sf_comm_path path, double *us, sf_error *err)
{
    if (t->dead) return sf_err(err, SF_ENODEV, "%s", t->dead_msg);
    if (n < 1 || iters < 1) return sf_err(err, SF_EINVAL, "all-reduce bench: %lld elements x %d", (long long)n, iters);
    if (path < SF_COMM_PATH_AUTO || path > SF_COMM_PATH_LL)
        return sf_err(err, SF_EINVAL, "all-reduce bench: unknown path %d", (int)path);
    tp_hdr h = { .cmd = TP_BENCH_ALLREDUCE, .bench_n = n, .bench_iters = iters, .bench_path = path };
    int rc = send_hdr(t, &h, err);
    if (!rc) rc = bench_all_reduce(t, n, iters, path, us, err);
    return rc ? dead(t, rc, err) : SF_OK;
}

int sf_tp_bench_all_reduce(sf_tp *t, int64_t n, int iters, double *us, sf_error *err)
{
    return sf_tp_bench_all_reduce_path(t, n, iters, SF_COMM_PATH_AUTO, us, err);
}

int sf_tp_check_all_reduce(sf_tp *t, int64_t max_n, int iters, sf_comm_path path, double *worst, sf_error *err)
{
    if (t->dead) return sf_err(err, SF_ENODEV, "%s", t->dead_msg);
    if (max_n < 1 || iters < 1 || path < SF_COMM_PATH_AUTO || path > SF_COMM_PATH_LL)
        return sf_err(err, SF_EINVAL, "all-reduce check: %lld values, %d rounds, path %d", (long long)max_n, iters,
                      (int)path);
    tp_hdr h = { .cmd = TP_CHECK_ALLREDUCE, .bench_n = max_n, .bench_iters = iters, .bench_path = path };
    int rc = send_hdr(t, &h, err);
    if (!rc) rc = check_all_reduce(t, max_n, iters, path, worst, err);
    return rc ? dead(t, rc, err) : SF_OK;
}

const sf_comm *sf_tp_comm(const sf_tp *t) { return t->comm; }

void sf_tp_free(sf_tp *t)
{
    if (!t) return;
    if (t->comm && !t->dead) {
        tp_hdr h = { .cmd = TP_STOP };
        sf_error e = { 0 };
        if (send_hdr(t, &h, &e)) SF_LOGW("tensor parallelism: stopping the followers: %s", e.msg);
    }
    double t0 = sf_now_s();
    for (int i = 0; i < t->n_pids; i++) { /* up to 5 s in all for clean exits, then SIGKILL */
        while (waitpid(t->pids[i], NULL, WNOHANG) == 0) {
            if (sf_now_s() - t0 > 5.0) {
                kill(t->pids[i], SIGKILL);
                waitpid(t->pids[i], NULL, 0);
                break;
            }
            usleep(10000);
        }
    }
    if (t->b && t->b->ops->graphs_release) t->b->ops->graphs_release(t->b); /* see the follower's exit */
    sf_forward_free(t->fwd);
    sf_shard_free(&t->shard);
    sf_comm_free(t->comm);
    free(t->payload);
    free(t->mpay);
    free(t);
}
