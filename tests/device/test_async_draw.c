/* test_async_draw.c — the backend side of async scheduling (hal.h sample_defer / sample_take,
 * sf_batch.src_row) on the CUDA backend with stories260K: a step whose tokens are taken on the
 * device from the draw before it, queued before that draw's ids reach the host, gives the same
 * ids as the same step fed those ids from the host (rows reordered, and four steps in row order,
 * whose tokens the draw writes into their slots itself); the ids of the two queued draws come
 * back in order, each to its own array; a third draw queued before one is taken, and a token
 * taken from a row the last draw did not have, are refused. Exits 77 without a GPU. */
#include <stdlib.h>
#include <string.h>

#include "../../engine/forward.h"
#include "../../engine/model.h"
#include "../../hal/hal.h"
#include "../test.h"

#define S 8   /* sequences */
#define BS 16 /* KV block size */

static sf_model *M;

typedef struct runner {
    sf_backend *b;
    sf_forward *f;
} runner;

static int runner_open(runner *r, sf_error *err)
{
    memset(r, 0, sizeof *r);
    sf_backend_opts o = { .name = "cuda" };
    int rc = sf_backend_open(&o, &r->b, err);
    if (rc) return rc;
    const sf_model_config *c = &M->cfg;
    sf_kv_config kc = { .n_layers = c->n_layers, .n_blocks = 2 * S, .block_size = BS, .n_kv_heads = c->n_kv_heads,
                        .head_dim = c->head_dim, .dtype = SF_DT_BF16, .group = c->n_heads / c->n_kv_heads };
    if ((rc = r->b->ops->kv_init(r->b, &kc, err))) return rc;
    return sf_forward_new(r->b, M, 64, 64, &r->f, err);
}

static void runner_close(runner *r)
{
    sf_forward_free(r->f);
    sf_backend_close(r->b);
}

/* The batch of one token for each of the first n of the S sequences at position pos, sequence
 * order[i] in row i (sequence s owns KV block 2 s + 1). */
typedef struct step_meta {
    int32_t tok[S], pos[S], slot[S], start[S + 1], ctx[S], table[S * 2], rows[S], src[S];
} step_meta;

static sf_batch make_batch_n(step_meta *m, int n, const int *order, int pos, const int32_t *tok, const int32_t *src)
{
    for (int i = 0; i < n; i++) {
        int s = order[i];
        m->tok[i] = tok ? tok[i] : 0;
        m->pos[i] = pos;
        m->slot[i] = (2 * s + 1) * BS + pos;
        m->start[i] = i;
        m->ctx[i] = pos + 1;
        m->table[2 * i] = 2 * s + 1;
        m->table[2 * i + 1] = 0;
        m->rows[i] = i;
        m->src[i] = src ? src[i] : -1;
    }
    m->start[n] = n;
    return (sf_batch){ .n_tokens = n, .n_seqs = n, .tokens = m->tok, .pos = m->pos, .slot = m->slot,
                       .seq_start = m->start, .seq_ctx = m->ctx, .block_table = m->table, .max_blocks = 2,
                       .logit_rows = m->rows, .n_logits = n, .src_row = src ? m->src : NULL };
}

static sf_batch make_batch(step_meta *m, const int *order, int pos, const int32_t *tok, const int32_t *src)
{
    return make_batch_n(m, S, order, pos, tok, src);
}

/* Greedy rows and seeded draws at temperature 0.8, draw `step`. */
static void sample_rows(sf_sample_row *rows, int step)
{
    for (int i = 0; i < S; i++)
        rows[i] = (sf_sample_row){ .temperature = i % 2 ? 0.8f : 0, .top_p = 1, .repetition_penalty = 1,
                                   .seed = 77 + (uint64_t)i, .step = (uint64_t)step };
}

static const int ORDER_A[S] = { 0, 1, 2, 3, 4, 5, 6, 7 };
/* step B's rows: runs of consecutive rows of A and single ones, so the device copies several runs */
static const int ORDER_B[S] = { 0, 1, 2, 3, 7, 6, 4, 5 };

TEST(step_from_queued_draw_equals_host_tokens)
{
    sf_error err = { 0 };
    runner r;
    REQUIRE(runner_open(&r, &err) == SF_OK, "%s", err.msg);
    const struct sf_backend_ops *o = r.b->ops;
    REQUIRE(o->sample_defer && o->sample_take, "the CUDA backend has sample_defer and sample_take");
    int32_t first[S], ids_a[S], ids_b[S], ref_a[S], ref_b[S], tok_b[S], src_b[S];
    sf_sample_row rows_a[S], rows_b[S];
    for (int i = 0; i < S; i++) first[i] = 2 + 37 * i % (M->cfg.vocab_size - 2);
    sample_rows(rows_a, 0);
    sample_rows(rows_b, 1);
    step_meta ma, mb;

    /* deferred: A, then B with its tokens from A's draw, queued before A's ids are taken */
    REQUIRE(o->sample_defer(r.b, 1) == SF_OK, "sample_defer on");
    for (int i = 0; i < S; i++) ids_a[i] = ids_b[i] = -7;
    sf_batch ba = make_batch(&ma, ORDER_A, 0, first, NULL);
    sf_forward_sample sa = { .rows = rows_a, .ids = ids_a };
    REQUIRE(sf_forward_launch_sample(r.f, &ba, &sa, &err) == SF_OK, "step A: %s", err.msg);
    REQUIRE(sf_forward_wait_sample(r.f, &err) == SF_OK, "deferred wait of A: %s", err.msg);
    CHECK_MSG(ids_a[0] == -7, "a deferred sample_wait leaves the ids to sample_take (got %d)", ids_a[0]);
    for (int i = 0; i < S; i++) src_b[i] = ORDER_B[i]; /* row i of B is sequence ORDER_B[i]: A's row ORDER_B[i] */
    sf_batch bb = make_batch(&mb, ORDER_B, 1, NULL, src_b);
    sf_forward_sample sb = { .rows = rows_b, .ids = ids_b };
    REQUIRE(sf_forward_launch_sample(r.f, &bb, &sb, &err) == SF_OK, "step B: %s", err.msg);
    REQUIRE(sf_forward_wait_sample(r.f, &err) == SF_OK, "deferred wait of B: %s", err.msg);
    /* a third draw before one is taken is refused (its step runs; its K/V lands at position 2) */
    {
        step_meta mc;
        sf_batch bc = make_batch(&mc, ORDER_A, 2, first, NULL);
        int32_t ids_c[S];
        sf_forward_sample sc = { .rows = rows_b, .ids = ids_c };
        CHECK(sf_forward_launch_sample(r.f, &bc, &sc, &err) == SF_EINVAL);
        printf("      refused: %s\n", err.msg);
    }
    REQUIRE(o->sample_take(r.b) == SF_OK, "take A");
    CHECK_MSG(ids_b[0] == -7, "taking the oldest draw writes only its ids (B's: %d)", ids_b[0]);
    REQUIRE(o->sample_take(r.b) == SF_OK, "take B");
    CHECK(o->sample_take(r.b) == SF_OK); /* none queued */
    REQUIRE(o->sample_defer(r.b, 0) == SF_OK, "sample_defer off");

    /* the reference: the same two steps, B fed A's ids from the host */
    sf_batch ra = make_batch(&ma, ORDER_A, 0, first, NULL);
    sf_forward_sample sra = { .rows = rows_a, .ids = ref_a };
    REQUIRE(sf_forward_step_sample(r.f, &ra, &sra, &err) == SF_OK, "reference A: %s", err.msg);
    for (int i = 0; i < S; i++) tok_b[i] = ref_a[ORDER_B[i]];
    sf_batch rb = make_batch(&mb, ORDER_B, 1, tok_b, NULL);
    sf_forward_sample srb = { .rows = rows_b, .ids = ref_b };
    REQUIRE(sf_forward_step_sample(r.f, &rb, &srb, &err) == SF_OK, "reference B: %s", err.msg);
    int same_a = 0, same_b = 0;
    for (int i = 0; i < S; i++) {
        same_a += ids_a[i] == ref_a[i];
        same_b += ids_b[i] == ref_b[i];
    }
    printf("      A %d/%d, B %d/%d ids equal (A[0..3] %d %d %d %d, B[0..3] %d %d %d %d)\n", same_a, S, same_b, S, ids_a[0],
           ids_a[1], ids_a[2], ids_a[3], ids_b[0], ids_b[1], ids_b[2], ids_b[3]);
    CHECK_MSG(same_a == S && same_b == S, "A %d/%d, B %d/%d equal", same_a, S, same_b, S);
    runner_close(&r);
}

/* Decode steps whose tokens are the draw's rows in order (the common case): the draw also wrote
 * its ids into the token slots, and the step copies its metadata past them, beside the draw
 * when it has as many tokens as the draw had rows, after it when fewer (two sequences leave).
 * Four steps queued two deep, against the same steps fed their tokens from the host. */
TEST(steps_in_row_order_from_the_draw)
{
    sf_error err = { 0 };
    runner r;
    REQUIRE(runner_open(&r, &err) == SF_OK, "%s", err.msg);
    const struct sf_backend_ops *o = r.b->ops;
    enum { N = 4 };
    static const int n_of[N] = { S, S, S - 2, S - 2 };
    int32_t first[S], ids[N][S], ref[N][S], tok[S], src[S];
    sf_sample_row rows[N][S];
    step_meta m[N];
    for (int i = 0; i < S; i++) first[i] = 3 + 29 * i % (M->cfg.vocab_size - 3), src[i] = i;
    for (int k = 0; k < N; k++) {
        sample_rows(rows[k], k);
        for (int i = 0; i < S; i++) ids[k][i] = ref[k][i] = -7;
    }
    REQUIRE(o->sample_defer(r.b, 1) == SF_OK, "sample_defer on");
    for (int k = 0; k < N; k++) {
        sf_batch b = make_batch_n(&m[k], n_of[k], ORDER_A, k, k ? NULL : first, k ? src : NULL);
        sf_forward_sample sk = { .rows = rows[k], .ids = ids[k] };
        REQUIRE(sf_forward_launch_sample(r.f, &b, &sk, &err) == SF_OK, "step %d: %s", k, err.msg);
        REQUIRE(sf_forward_wait_sample(r.f, &err) == SF_OK, "deferred wait of step %d: %s", k, err.msg);
        if (k) REQUIRE(o->sample_take(r.b) == SF_OK, "take step %d", k - 1);
    }
    REQUIRE(o->sample_take(r.b) == SF_OK, "take step %d", N - 1);
    REQUIRE(o->sample_defer(r.b, 0) == SF_OK, "sample_defer off");
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < n_of[k]; i++) tok[i] = k ? ref[k - 1][i] : first[i];
        sf_batch b = make_batch_n(&m[k], n_of[k], ORDER_A, k, tok, NULL);
        sf_forward_sample sk = { .rows = rows[k], .ids = ref[k] };
        REQUIRE(sf_forward_step_sample(r.f, &b, &sk, &err) == SF_OK, "reference step %d: %s", k, err.msg);
    }
    int same = 0, total = 0;
    for (int k = 0; k < N; k++)
        for (int i = 0; i < n_of[k]; i++) same += ids[k][i] == ref[k][i], total++;
    printf("      %d/%d ids equal (step 3: %d %d %d %d)\n", same, total, ids[3][0], ids[3][1], ids[3][2], ids[3][3]);
    CHECK_MSG(same == total, "%d/%d ids equal", same, total);
    runner_close(&r);
}

/* One sequence, one row a step drawn greedily or at a temperature alone (sf_batch.draw_row): the
 * lm_head draws it and the step's graph writes the id (head_draws counts them), run directly,
 * captured and replayed, deferred (both pinned halves) and not; each greedy id is the host's
 * rule over the step's logits (the largest value, the smaller id on ties). Two steps draw
 * through the sampler (top-p; a greedy row asking for logprobs); SEMFLOW_CUDA_HEAD_DRAW=0 takes
 * every row there, with the same ids, drawn ones included. */
static int host_greedy(const float *l, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (l[i] == l[i] && (best < 0 || l[i] > l[best])) best = i;
    return best < 0 ? 0 : best;
}

static void head_run(int head, int32_t *out, int *n_out, long *heads)
{
    sf_error err = { 0 };
    if (!head) setenv("SEMFLOW_CUDA_HEAD_DRAW", "0", 1);
    runner r;
    int rc = runner_open(&r, &err);
    unsetenv("SEMFLOW_CUDA_HEAD_DRAW");
    REQUIRE(rc == SF_OK, "%s", err.msg);
    const struct sf_backend_ops *o = r.b->ops;
    const int V = M->cfg.vocab_size;
    enum { N = 24 };
    float *logits = malloc((size_t)V * sizeof *logits);
    REQUIRE(logits, "out of memory");
    sf_backend_stats st0, st1;
    sf_backend_cuda_stats(r.b, &st0);
    int32_t tok = 11, same = 0, n = 0, fused = 0;
    for (int k = 0; k < N; k++) {
        /* 0 greedy, 1 temperature alone, 2 greedy with logprobs, 3 top-p */
        const int kind = k == 13 ? 2 : k == 9 ? 3 : k % 4 == 1 ? 1 : 0;
        const int defer = k >= 16; /* steps 16.. deferred, one at a time: the two pinned halves in turn */
        sf_sample_row row = { .temperature = kind & 1 ? 0.8f : 0, .top_p = kind == 3 ? 0.9f : 1,
                              .repetition_penalty = 1, .seed = 5, .step = (uint64_t)k, .logprobs = kind == 2 ? 2 : 0 };
        sf_sample_lp lp;
        int32_t id = -7;
        step_meta m;
        int order[1] = { 0 };
        sf_batch b = make_batch_n(&m, 1, order, k, &tok, NULL);
        m.table[1] = 2; /* positions 16..: the sequence's second block */
        sf_forward_sample smp = { .rows = &row, .ids = &id, .lp = kind == 2 ? &lp : NULL };
        if (defer && k == 16) REQUIRE(o->sample_defer(r.b, 1) == SF_OK, "sample_defer on");
        if (defer) {
            REQUIRE(sf_forward_launch_sample(r.f, &b, &smp, &err) == SF_OK, "step %d: %s", k, err.msg);
            REQUIRE(sf_forward_wait_sample(r.f, &err) == SF_OK, "step %d: %s", k, err.msg);
            REQUIRE(o->sample_take(r.b) == SF_OK, "take step %d", k);
        } else {
            REQUIRE(sf_forward_step_sample(r.f, &b, &smp, &err) == SF_OK, "step %d: %s", k, err.msg);
        }
        REQUIRE(sf_forward_read_logits(r.f, 1, logits, &err) == SF_OK, "step %d: reading the logits: %s", k, err.msg);
        const int ref = host_greedy(logits, V);
        if (!(kind & 1)) same += id == ref, n++;
        out[k] = id;
        tok = id;
    }
    REQUIRE(o->sample_defer(r.b, 0) == SF_OK, "sample_defer off");
    sf_backend_cuda_stats(r.b, &st1);
    fused = (int)(st1.head_draws - st0.head_draws);
    printf("      HEAD_DRAW=%d: %d/%d greedy ids the host's rule over the logits; %d drawn with the lm_head; "
           "graphs %ld captured, %ld replays\n", head, same, n, fused, st1.graphs_captured, st1.graph_replays);
    CHECK_MSG(same == n, "%d/%d greedy ids equal the host's argmax", same, n);
    *n_out = N;
    *heads = fused;
    free(logits);
    runner_close(&r);
}

TEST(row_drawn_with_the_lm_head)
{
    int32_t a[32], b[32];
    int na = 0, nb = 0;
    long ha = -1, hb = -1;
    head_run(1, a, &na, &ha);
    head_run(0, b, &nb, &hb);
    CHECK_MSG(ha == na - 2 && hb == 0, "lm_head draws: %ld of %d steps (want %d), %ld with the switch off", ha, na,
              na - 2, hb);
    CHECK_MSG(na == nb && !memcmp(a, b, (size_t)na * sizeof *a), "the ids differ with SEMFLOW_CUDA_HEAD_DRAW=0");
}

TEST(token_from_a_row_the_draw_did_not_have)
{
    sf_error err = { 0 };
    runner r;
    REQUIRE(runner_open(&r, &err) == SF_OK, "%s", err.msg);
    int32_t first[S], ids[S], src[S];
    sf_sample_row rows[S];
    for (int i = 0; i < S; i++) first[i] = 5 + i, src[i] = i == 3 ? S : i; /* row S: past the draw's */
    sample_rows(rows, 0);
    step_meta m;
    sf_batch a = make_batch(&m, ORDER_A, 0, first, NULL);
    sf_forward_sample sa = { .rows = rows, .ids = ids };
    REQUIRE(sf_forward_step_sample(r.f, &a, &sa, &err) == SF_OK, "step A: %s", err.msg);
    sf_batch b = make_batch(&m, ORDER_A, 1, NULL, src);
    CHECK(sf_forward_step_sample(r.f, &b, &sa, &err) == SF_EINVAL);
    printf("      refused: %s\n", err.msg);
    runner_close(&r);
}

int main(void)
{
    if (!sf_hal_cuda_available()) {
        printf("test_async_draw: no CUDA device: skipped\n");
        return 77;
    }
    sf_error err = { 0 };
    sf_load_opts lo = { 0 };
    if (sf_model_load(test_data("stories260K/stories260K.gguf"), &lo, &M, &err) != SF_OK) {
        printf("FAIL: loading stories260K: %s\n", err.msg);
        return 1;
    }
    RUN(step_from_queued_draw_equals_host_tokens);
    RUN(steps_in_row_order_from_the_draw);
    RUN(token_from_a_row_the_draw_did_not_have);
    RUN(row_drawn_with_the_lm_head);
    sf_model_free(M);
    return test_summary();
}
