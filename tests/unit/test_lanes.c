/* test_lanes.c — steps split into two lanes (hal.h lanes_plan; $SEMFLOW_LANES=2) give the
 * logits of the same steps run whole, exactly, on the CPU backend (which runs the lanes one
 * after the other through the same kernels): decode steps, mixed prefill + decode steps, uneven
 * splits; and a backend refuses a split that does not match its step. */
#include "engine/forward.h"
#include "engine/kvcache.h"
#include "tests/test.h"

#define BS 4
#define MAXB 40
#define NSEQ 9

/* One backend + forward pass + KV pool, driven like a scheduler. */
typedef struct lrun {
    sf_backend *b;
    sf_forward *f;
    sf_kv_pool pool;
    int32_t bt[NSEQ][MAXB];
    int len[NSEQ];
} lrun;

static int lrun_init(lrun *r, const sf_model *m, int lanes, sf_error *err)
{
    memset(r, 0, sizeof *r);
    sf_backend_opts o = { .name = "cpu", .n_threads = 2 };
    int rc = sf_backend_open(&o, &r->b, err);
    if (rc) return rc;
    sf_kv_config kc = { .n_layers = m->cfg.n_layers, .n_blocks = NSEQ * MAXB + 8, .block_size = BS,
                        .n_kv_heads = m->cfg.n_kv_heads, .head_dim = m->cfg.head_dim, .dtype = SF_DT_F32 };
    if (lanes) {
        setenv("SEMFLOW_LANES", "2", 1);
        setenv("SEMFLOW_LANES_MIN", "2", 1);
    }
    if (!(rc = r->b->ops->kv_init(r->b, &kc, err)) && !(rc = sf_kv_pool_init(&r->pool, kc.n_blocks, BS, err)))
        rc = sf_forward_new(r->b, m, 128, 128, &r->f, err);
    unsetenv("SEMFLOW_LANES");
    unsetenv("SEMFLOW_LANES_MIN");
    return rc;
}

static void lrun_free(lrun *r)
{
    sf_forward_free(r->f);
    sf_kv_pool_free(&r->pool);
    sf_backend_close(r->b);
}

/* Sequences 0..n-1 append cnt[i] tokens each (deterministic ids); logits of every new token. */
static int lrun_step(lrun *r, int n, const int *cnt, int vocab, float *out, int *n_rows, sf_error *err)
{
    int32_t tokens[128], pos[128], slot[128], ss[NSEQ + 1], ctx[NSEQ], bt[NSEQ * MAXB], rows[128];
    int T = 0;
    ss[0] = 0;
    for (int s = 0; s < n; s++) {
        int need = (r->len[s] + cnt[s] + BS - 1) / BS, have = (r->len[s] + BS - 1) / BS;
        if (need > MAXB || (need > have && sf_kv_alloc(&r->pool, need - have, &r->bt[s][have]) != SF_OK))
            return sf_err(err, SF_AGAIN, "test: kv pool exhausted");
        for (int j = 0; j < cnt[s]; j++, T++) {
            int p = r->len[s] + j;
            tokens[T] = (int32_t)((unsigned)(p * 31 + s * 7 + 3) % (unsigned)vocab);
            pos[T] = p;
            slot[T] = r->bt[s][p / BS] * BS + p % BS;
            rows[T] = T;
        }
        memcpy(bt + s * MAXB, r->bt[s], sizeof r->bt[s]);
        r->len[s] += cnt[s];
        ctx[s] = r->len[s];
        ss[s + 1] = T;
    }
    *n_rows = T;
    sf_batch b = { .n_tokens = T, .n_seqs = n, .tokens = tokens, .pos = pos, .slot = slot, .seq_start = ss,
                   .seq_ctx = ctx, .block_table = bt, .max_blocks = MAXB, .logit_rows = rows, .n_logits = T };
    return sf_forward_step(r->f, &b, out, err);
}

static sf_model *load_model(void)
{
    sf_error err = { 0 };
    sf_model *m = NULL;
    sf_load_opts lo = { 0 };
    if (sf_model_load(test_data("stories260K/stories260K.gguf"), &lo, &m, &err)) {
        printf("# loading stories260K: %s\n", err.msg);
        return NULL;
    }
    return m;
}

TEST(split_steps_equal_whole_steps)
{
    sf_model *m = load_model();
    REQUIRE(m, "stories260K loads");
    sf_error err = { 0 };
    lrun whole, split;
    REQUIRE(lrun_init(&whole, m, 0, &err) == SF_OK, "%s", err.msg);
    REQUIRE(lrun_init(&split, m, 1, &err) == SF_OK, "%s", err.msg);
    const int V = m->cfg.vocab_size;
    float *a = malloc(sizeof(float) * 128 * V), *b = malloc(sizeof(float) * 128 * V);
    /* prompts of uneven lengths (one mixed step), then decode steps of all sequences, a step
     * with one sequence prefilling beside decodes, and steps of 2 and 3 sequences */
    static const int plan[][NSEQ] = {
        { 9, 3, 14, 1, 6, 2, 5, 8, 4 }, { 1, 1, 1, 1, 1, 1, 1, 1, 1 }, { 1, 1, 1, 1, 1, 1, 1, 1, 1 },
        { 1, 1, 12, 1, 1, 1, 1, 1, 1 }, { 1, 1, 0 }, { 1, 1, 1, 0 }, { 1, 1, 1, 1, 1, 1, 1, 1, 1 },
    };
    int steps = (int)SF_ARRAY_LEN(plan);
    for (int st = 0; st < steps; st++) {
        int n = 0, na = 0, nb = 0;
        while (n < NSEQ && plan[st][n]) n++;
        int rc = lrun_step(&whole, n, plan[st], V, a, &na, &err);
        REQUIRE(rc == SF_OK, "whole step %d: %s", st, err.msg);
        rc = lrun_step(&split, n, plan[st], V, b, &nb, &err);
        REQUIRE(rc == SF_OK, "split step %d: %s", st, err.msg);
        CHECK_MSG(na == nb && !memcmp(a, b, sizeof(float) * (size_t)na * V),
                  "step %d (%d sequences): the split step's logits differ from the whole step's", st, n);
    }
    CHECK_MSG(sf_forward_lane_steps(split.f) == steps, "%ld of %d steps ran in lanes", sf_forward_lane_steps(split.f),
              steps);
    CHECK(sf_forward_lane_steps(whole.f) == 0);
    free(a);
    free(b);
    lrun_free(&whole);
    lrun_free(&split);
    sf_model_free(m);
}

TEST(small_steps_run_whole)
{
    sf_model *m = load_model();
    REQUIRE(m, "stories260K loads");
    sf_error err = { 0 };
    lrun r;
    setenv("SEMFLOW_LANES_MIN", "2", 1); /* a threshold alone does not switch lanes on */
    REQUIRE(lrun_init(&r, m, 0, &err) == SF_OK, "%s", err.msg);
    unsetenv("SEMFLOW_LANES_MIN");
    const int V = m->cfg.vocab_size;
    float *a = malloc(sizeof(float) * 128 * V);
    int one[NSEQ] = { 1, 1, 1, 1, 1, 1, 1, 1, 1 }, n = 0;
    REQUIRE(lrun_step(&r, NSEQ, one, V, a, &n, &err) == SF_OK, "%s", err.msg);
    CHECK(sf_forward_lane_steps(r.f) == 0); /* lanes off: the default */
    lrun_free(&r);
    setenv("SEMFLOW_LANES", "2", 1); /* on, but 9 tokens are below the default 64 */
    REQUIRE(lrun_init(&r, m, 0, &err) == SF_OK, "%s", err.msg);
    unsetenv("SEMFLOW_LANES");
    REQUIRE(lrun_step(&r, NSEQ, one, V, a, &n, &err) == SF_OK, "%s", err.msg);
    CHECK(sf_forward_lane_steps(r.f) == 0);
    free(a);
    lrun_free(&r);
    sf_model_free(m);
}

TEST(backend_refuses_a_bad_split)
{
    sf_error err = { 0 };
    sf_backend *b = NULL;
    sf_backend_opts o = { .name = "cpu", .n_threads = 1 };
    REQUIRE(sf_backend_open(&o, &b, &err) == SF_OK, "%s", err.msg);
    const struct sf_backend_ops *ops = b->ops;
    sf_kv_config kc = { .n_layers = 1, .n_blocks = 8, .block_size = BS, .n_kv_heads = 1, .head_dim = 8,
                        .dtype = SF_DT_F32 };
    REQUIRE(ops->kv_init(b, &kc, &err) == SF_OK, "%s", err.msg);
    int32_t tok[3] = { 1, 2, 3 }, pos[3] = { 0, 0, 0 }, slot[3] = { 0, 4, 8 }, ss[4] = { 0, 1, 2, 3 },
            ctx[3] = { 1, 1, 1 }, bt[3] = { 0, 1, 2 }, row[1] = { 2 };
    sf_batch whole = { .n_tokens = 3, .n_seqs = 3, .tokens = tok, .pos = pos, .slot = slot, .seq_start = ss,
                       .seq_ctx = ctx, .block_table = bt, .max_blocks = 1, .logit_rows = row, .n_logits = 1 };
    int32_t ss0[2] = { 0, 1 }, ss1[3] = { 0, 1, 2 };
    sf_batch sub[2] = {
        { .n_tokens = 1, .n_seqs = 1, .tokens = tok, .pos = pos, .slot = slot, .seq_start = ss0, .seq_ctx = ctx,
          .block_table = bt, .max_blocks = 1 },
        { .n_tokens = 2, .n_seqs = 2, .tokens = tok + 1, .pos = pos + 1, .slot = slot + 1, .seq_start = ss1,
          .seq_ctx = ctx + 1, .block_table = bt + 1, .max_blocks = 1 },
    };
    CHECK(sf_batch_lanes_check(&whole, 2, sub, &err) == SF_OK);
    CHECK(ops->lanes_plan(b, 2, sub) == SF_OK && ops->batch_begin(b, &whole) == SF_OK);
    CHECK(ops->lane(b, 1) == SF_OK && ops->lane(b, -1) == SF_OK);
    CHECK(ops->lane(b, 2) == SF_EINVAL);
    sub[1].slot = slot; /* lane 1's slots are not the step's */
    CHECK(sf_batch_lanes_check(&whole, 2, sub, &err) == SF_EINVAL && strstr(err.msg, "lane 1"));
    CHECK(ops->lanes_plan(b, 2, sub) == SF_OK && ops->batch_begin(b, &whole) == SF_EINVAL);
    sub[1].slot = slot + 1;
    sub[1].n_seqs = 1; /* the lanes leave a sequence out */
    sub[1].n_tokens = 1;
    CHECK(sf_batch_lanes_check(&whole, 2, sub, &err) == SF_EINVAL);
    CHECK(ops->lanes_plan(b, 3, sub) == SF_EINVAL);
    CHECK(ops->batch_begin(b, &whole) == SF_OK && ops->lane(b, 0) == SF_EINVAL); /* no lanes planned */
    sf_buf *buf = NULL, *v = NULL;
    REQUIRE(ops->buf_new(b, 4, 8, &buf, &err) == SF_OK, "%s", err.msg);
    CHECK(ops->buf_view(b, buf, 3, 2, &v, &err) == SF_EINVAL && v == NULL);
    CHECK(ops->buf_view(b, buf, 1, 3, &v, &err) == SF_OK && v != NULL);
    ops->buf_free(b, v);
    ops->buf_free(b, buf);
    sf_backend_close(b);
}

int main(void)
{
    RUN(split_steps_equal_whole_steps);
    RUN(small_steps_run_whole);
    RUN(backend_refuses_a_bad_split);
    return test_summary();
}
