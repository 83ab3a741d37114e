/* test_tp.c — tensor parallelism on the CPU backend with real rank processes (fork; the
 * followers run the same loop `semflow rank` runs): the logits of TP = 2, 4 and 8 equal TP = 1
 * over prefill, decode and a mixed two-sequence batch, on the demo model, tiny-random-llama-2
 * and synthetic configs (dummy weights) whose head counts divide 8 — with kv heads split, and
 * replicated (fewer kv heads than ranks), Qwen2 biases, a tied head and a vocabulary that
 * does not divide by the rank count; dummy weights filled per rank give the same logits. Then:
 * a rank's dummy fill covers exactly its slices; a sequence's block moved through a swap slot on
 * every rank gives TP = 1's logits; a follower killed mid-run, and one that hangs, end the
 * leader's step with an error naming the rank, within the timeout, not a hang. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "engine/forward.h"
#include "engine/shard.h"
#include "engine/tp.h"
#include "engine/swap.h"
#include "tests/test.h"

#define BS 16
#define NSTEPS 5

typedef struct step {
    int T, S, L;
    int32_t tokens[16], pos[16], slot[16], seq_start[3], seq_ctx[2], bt[2 * 4], rows[2];
} step;

/* A: 6-token prefill in block 0; decode x2; A decode + B 4-token prefill (block 1); decode both. */
static void make_steps(step *s, int vocab)
{
    memset(s, 0, sizeof(step) * NSTEPS);
    int a_len = 0, b_len = 0;
    for (int k = 0; k < NSTEPS; k++) {
        step *p = &s[k];
        int na = k == 0 ? 6 : 1, nb = k < 3 ? 0 : k == 3 ? 4 : 1;
        p->S = nb ? 2 : 1;
        for (int i = 0; i < na; i++, p->T++) {
            p->tokens[p->T] = (7 + 13 * (a_len + i) + k) % vocab;
            p->pos[p->T] = a_len + i;
            p->slot[p->T] = a_len + i; /* block 0 */
        }
        p->seq_start[1] = p->T;
        a_len += na;
        p->seq_ctx[0] = a_len;
        p->bt[0] = 0;
        p->rows[p->L++] = p->T - 1;
        if (nb) {
            for (int i = 0; i < nb; i++, p->T++) {
                p->tokens[p->T] = (3 + 29 * (b_len + i)) % vocab;
                p->pos[p->T] = b_len + i;
                p->slot[p->T] = BS + b_len + i; /* block 1 */
            }
            b_len += nb;
            p->seq_start[2] = p->T;
            p->seq_ctx[1] = b_len;
            p->bt[4] = 1;
            p->rows[p->L++] = p->T - 1;
        }
    }
}

static sf_batch batch_of(const step *p)
{
    return (sf_batch){ .n_tokens = p->T, .n_seqs = p->S, .tokens = p->tokens, .pos = p->pos, .slot = p->slot,
                       .seq_start = p->seq_start, .seq_ctx = p->seq_ctx, .block_table = p->bt, .max_blocks = 4,
                       .logit_rows = p->rows, .n_logits = p->L };
}

static sf_kv_config kv_of(const sf_model_config *c, int kv_heads)
{
    return (sf_kv_config){ .n_layers = c->n_layers, .n_blocks = 4, .block_size = BS, .n_kv_heads = kv_heads,
                           .head_dim = c->head_dim, .dtype = SF_DT_F32 };
}

/* TP=1 logits of every step: [NSTEPS][2][vocab] */
/* dummy: NULL to load the files, or dummy weights of that format (sf_load_opts.dummy_format) */
static float *reference(const char *path, const char *dummy, sf_model_config *cfg)
{
    sf_error err = { 0 };
    sf_model *m = NULL;
    sf_backend *b = NULL;
    sf_forward *f = NULL;
    float *out = NULL;
    sf_load_opts lo = { .dummy = dummy != NULL, .dummy_format = dummy };
    sf_backend_opts bo = { .name = "cpu", .n_threads = 1 };
    if (sf_model_load(path, &lo, &m, &err) || sf_backend_open(&bo, &b, &err) || sf_forward_new(b, m, 16, 2, &f, &err))
        goto done;
    *cfg = m->cfg;
    sf_kv_config kc = kv_of(&m->cfg, m->cfg.n_kv_heads);
    if (b->ops->kv_init(b, &kc, &err)) goto done;
    step s[NSTEPS];
    make_steps(s, m->cfg.vocab_size);
    out = calloc((size_t)NSTEPS * 2 * m->cfg.vocab_size, sizeof(float));
    for (int k = 0; k < NSTEPS && out; k++) {
        sf_batch bt = batch_of(&s[k]);
        if (sf_forward_step(f, &bt, out + (size_t)k * 2 * m->cfg.vocab_size, &err)) {
            free(out);
            out = NULL;
        }
    }
done:
    if (!out) printf("      reference for %s: %s\n", path, err.msg);
    sf_forward_free(f);
    if (b) sf_backend_close(b);
    sf_model_free(m);
    return out;
}

/* A TP group of the tests: rank 0's model, backend and leader, the followers' pids. */
typedef struct tp_group {
    sf_model *m;
    sf_backend *b;
    sf_tp *tp;
    pid_t pids[8];
} tp_group;

/* Starts the group: followers forked (they run sf_tp_follower_run), leader returned. */
static int start(const char *path, const char *dummy, int size, int timeout_ms, tp_group *g, sf_error *err)
{
    memset(g, 0, sizeof *g);
    pid_t *pids = g->pids;
    sf_tp_rank_opts o = { .rank = 0, .size = size, .model = path, .load_dummy = dummy != NULL,
                          .dummy_format = dummy, .backend = "cpu",
                          .n_threads = 1, .max_tokens = 16, .max_logits = 2, .shm_fd = -1, .timeout_ms = timeout_ms };
    int rc = sf_tp_group_create(&o, err);
    if (rc) return rc;
    fflush(stdout);
    for (int r = 1; r < size; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            sf_tp_rank_opts fo = o;
            fo.rank = r;
            sf_error ferr = { 0 };
            int frc = sf_tp_follower_run(&fo, &ferr);
            if (frc) fprintf(stderr, "follower: %s\n", ferr.msg);
            _exit(frc ? 1 : 0);
        }
        pids[r - 1] = pid;
    }
    /* dummy weights: each rank fills only its share; the logits must still equal TP=1's */
    sf_load_opts lo = { .dummy = dummy != NULL, .dummy_format = dummy, .shard_rank = 0, .shard_size = size };
    sf_backend_opts bo = { .name = "cpu", .n_threads = 1 };
    if (!(rc = sf_model_load(path, &lo, &g->m, err)) && !(rc = sf_backend_open(&bo, &g->b, err)))
        rc = sf_tp_leader_new(&o, g->m, g->b, pids, &g->tp, err);
    close(o.shm_fd);
    if (rc) /* the leader did not take the followers: stop them here */
        for (int r = 1; r < size; r++) {
            kill(pids[r - 1], SIGKILL);
            waitpid(pids[r - 1], NULL, 0);
        }
    return rc;
}

static void stop(tp_group *g)
{
    sf_tp_free(g->tp);
    if (g->b) sf_backend_close(g->b);
    sf_model_free(g->m);
}

/* Step p at TP, its logits (p->L rows) against ref_k, TP=1's for the same step: the largest
 * difference into *worst, the largest |ref| into *scale. */
static int step_vs_ref(sf_tp *tp, const step *p, const float *ref_k, int V, float *got, double *worst, double *scale,
                       sf_error *err)
{
    sf_batch bt = batch_of(p);
    int rc = sf_tp_step(tp, &bt, got, err);
    for (int i = 0; !rc && i < p->L * V; i++) {
        *worst = fmax(*worst, fabs((double)got[i] - ref_k[i]));
        *scale = fmax(*scale, fabs((double)ref_k[i]));
    }
    return rc;
}

/* max |tp - ref| over all steps' logits, relative to the largest |ref| */
static void check_tp(const char *what, const char *path, const char *dummy, int size)
{
    sf_model_config cfg;
    float *ref = reference(path, dummy, &cfg);
    REQUIRE(ref, "%s: no TP=1 reference", what);
    sf_error err = { 0 };
    tp_group g;
    int rc = start(path, dummy, size, 20000, &g, &err);
    CHECK_MSG(rc == SF_OK, "%s TP=%d: %s", what, size, err.msg);
    if (rc) {
        free(ref);
        stop(&g);
        return;
    }
    int V = cfg.vocab_size;
    sf_kv_config kc = kv_of(&cfg, sf_tp_kv_heads(g.tp));
    CHECK_MSG(sf_tp_kv_init(g.tp, &kc, &err) == SF_OK, "%s TP=%d kv_init: %s", what, size, err.msg);
    step s[NSTEPS];
    make_steps(s, V);
    float *got = calloc((size_t)2 * V, sizeof(float));
    double worst = 0, scale = 0;
    for (int k = 0; k < NSTEPS && got; k++) {
        rc = step_vs_ref(g.tp, &s[k], ref + (size_t)k * 2 * V, V, got, &worst, &scale, &err);
        CHECK_MSG(rc == SF_OK, "%s TP=%d step %d: %s", what, size, k, err.msg);
        if (rc) break;
    }
    CHECK_MSG(scale > 0 && worst <= 1e-4 * fmax(1.0, scale), "%s TP=%d: logits differ from TP=1 by %.3g (largest %.3g)",
              what, size, worst, scale);
    printf("      %s TP=%d: max |logit - TP1| = %.2e of %.2f\n", what, size, worst, scale);
    free(got);
    free(ref);
    stop(&g);
}

/* Preemption by swap under TP (engine/swap.h): sequence A's block goes out to a swap slot and
 * comes back into another block on every rank (the followers by sf_tp_kv_copy, rank 0 by the
 * same copy on its backend), and A's next steps, read from there, give TP=1's logits: a rank
 * that had not moved its share would attend over an empty block. */
TEST(tp_swap_moves_a_sequence)
{
    const char *path = test_data("tiny-random-llama-2");
    sf_model_config cfg;
    float *ref = reference(path, NULL, &cfg);
    REQUIRE(ref, "no TP=1 reference");
    sf_error err = { 0 };
    tp_group g;
    int rc = start(path, NULL, 2, 20000, &g, &err);
    CHECK_MSG(rc == SF_OK, "TP=2: %s", err.msg);
    if (rc) {
        free(ref);
        stop(&g);
        return;
    }
    const int V = cfg.vocab_size;
    sf_kv_config kc = kv_of(&cfg, sf_tp_kv_heads(g.tp));
    REQUIRE(sf_tp_kv_init(g.tp, &kc, &err) == SF_OK, "kv_init: %s", err.msg);
    REQUIRE(sf_tp_swap_init(g.tp, 2, &err) == SF_OK, "swap_init: %s", err.msg);
    const size_t bb = g.b->ops->kv_block_bytes(g.b, &kc);
    unsigned char *mem = calloc(2, bb);
    REQUIRE(mem, "out of memory");
    step s[NSTEPS];
    make_steps(s, V);
    float *got = calloc((size_t)2 * V, sizeof(float));
    double worst = 0, scale = 0;
    int batched_off = 0;
    for (int k = 0; k < NSTEPS && got; k++) {
        if (k == 3) { /* A: block 0 -> slot 1 -> block 2, on every rank */
            const int32_t out_b[1] = { 0 }, in_b[1] = { 2 }, slot[1] = { 1 };
            rc = sf_tp_kv_copy(g.tp, out_b, slot, 1, 1, &err);
            if (!rc) rc = sf_swap_copy_blocks(g.b, mem, bb, out_b, slot, 1, 1, &batched_off, &err);
            if (!rc) rc = sf_tp_kv_copy(g.tp, in_b, slot, 1, 0, &err);
            if (!rc) rc = sf_swap_copy_blocks(g.b, mem, bb, in_b, slot, 1, 0, &batched_off, &err);
            REQUIRE(rc == SF_OK, "the swap copies: %s", err.msg);
        }
        if (k >= 3) { /* A reads and writes block 2 from here on */
            s[k].bt[0] = 2;
            for (int t = 0; t < s[k].seq_start[1]; t++) s[k].slot[t] = 2 * BS + s[k].pos[t];
        }
        rc = step_vs_ref(g.tp, &s[k], ref + (size_t)k * 2 * V, V, got, &worst, &scale, &err);
        CHECK_MSG(rc == SF_OK, "step %d: %s", k, err.msg);
        if (rc) break;
    }
    CHECK_MSG(scale > 0 && worst <= 1e-4 * fmax(1.0, scale), "logits after the swap differ from TP=1 by %.3g (largest %.3g)",
              worst, scale);
    printf("      TP=2, A moved through a swap slot: max |logit - TP1| = %.2e of %.2f\n", worst, scale);
    free(got);
    free(mem);
    free(ref);
    stop(&g);
}

/* A copy a follower cannot run, sent to a fresh TP=2 group with 4 KV blocks and 2 swap slots:
 * the group fails at the next exchange, and the error names the follower and says why. */
static void bad_copy_fails(int32_t block, int32_t slot, const char *why)
{
    sf_error err = { 0 };
    tp_group g;
    int rc = start(test_data("tiny-random-llama-2"), NULL, 2, 20000, &g, &err);
    CHECK_MSG(rc == SF_OK, "TP=2: %s", err.msg);
    sf_kv_config kc = { 0 };
    if (!rc) kc = kv_of(&g.m->cfg, sf_tp_kv_heads(g.tp));
    if (!rc) rc = sf_tp_kv_init(g.tp, &kc, &err);
    if (!rc) rc = sf_tp_swap_init(g.tp, 2, &err);
    REQUIRE(rc == SF_OK, "setup: %s", err.msg);
    step s[NSTEPS];
    make_steps(s, g.m->cfg.vocab_size);
    float *got = calloc((size_t)2 * g.m->cfg.vocab_size, sizeof(float));
    rc = sf_tp_kv_copy(g.tp, &block, &slot, 1, 1, &err);
    if (rc == SF_OK && got) { /* the failure shows at the next exchange */
        sf_batch bt = batch_of(&s[0]);
        rc = sf_tp_step(g.tp, &bt, got, &err);
    }
    CHECK_MSG(rc == SF_ENODEV && strstr(err.msg, "rank 1") && strstr(err.msg, why),
              "block %d to slot %d: %d %s", block, slot, rc, err.msg);
    free(got);
    stop(&g);
}

TEST(tp_bad_swap_copies_fail_the_group)
{
    bad_copy_fails(1, 2, "swap slot 2 out of range");  /* past the followers' two slots */
    bad_copy_fails(9, 0, "out of range");               /* past the 4 KV blocks */
}

/* A synthetic config folder loaded with dummy weights (the same seed on every rank). */
static const char *synthetic(const char *name, const char *type, int vocab, int hidden, int inter, int heads, int kv,
                             int tied)
{
    static char dirs[4][256];
    static int n;
    char *dir = dirs[n++ % 4];
    snprintf(dir, 256, "%s/tp-%s-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name, (int)getpid());
    mkdir(dir, 0755);
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fprintf(f, "{\"model_type\": \"%s\", \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, "
               "\"num_hidden_layers\": 2, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
               "\"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000, "
               "\"tie_word_embeddings\": %s, \"torch_dtype\": \"bfloat16\"}\n",
            type, vocab, hidden, inter, heads, kv, tied ? "true" : "false");
    fclose(f);
    return dir;
}

static void rm_synthetic(const char *dir)
{
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

TEST(shard_shapes)
{
    /* 8 heads / 2 kv heads over 8 ranks: 1 query head each, kv head r/4 replicated */
    sf_model_config c = { .vocab_size = 1001, .hidden = 64, .intermediate = 100, .n_layers = 1, .n_heads = 8,
                          .n_kv_heads = 2, .head_dim = 8 };
    sf_error err = { 0 };
    CHECK(sf_shard_check(&c, 8, &err) == SF_OK);
    CHECK(sf_shard_check(&c, 3, &err) == SF_EINVAL && strstr(err.msg, "8 attention heads"));
    c.n_kv_heads = 4;
    c.n_heads = 12;
    CHECK(sf_shard_check(&c, 6, &err) == SF_EINVAL && strstr(err.msg, "kv heads"));
    CHECK(sf_shard_check(&c, 0, &err) == SF_EINVAL);
}

TEST(tp_demo)
{
    const char *dir = getenv("SEMFLOW_DEMO_DIR");
    REQUIRE(dir, "SEMFLOW_DEMO_DIR is not set (run through tests/run.sh)");
    sf_error err = { 0 };
    sf_model *m = NULL;
    sf_load_opts lo = { 0 };
    int rc = sf_model_load("demo", &lo, &m, &err); /* not inside REQUIRE: it evaluates twice */
    REQUIRE(rc == SF_OK, "demo: %s", err.msg);
    sf_model_config c = m->cfg;
    sf_model_free(m);
    for (int n = 2; n <= 8; n *= 2)
        if (sf_shard_check(&c, n, NULL) == SF_OK) check_tp("demo", "demo", NULL, n);
        else printf("      demo: %d heads / %d kv heads do not split %d ways\n", c.n_heads, c.n_kv_heads, n);
}

TEST(tp_tiny_random_llama2)
{
    const char *p = test_data("tiny-random-llama-2");
    check_tp("tiny-random-llama-2", p, NULL, 2);
    check_tp("tiny-random-llama-2", p, NULL, 4); /* 4 heads: TP=8 cannot split them */
}

TEST(tp_synthetic_kv_split)
{
    const char *d = synthetic("kvsplit", "llama", 1000, 64, 96, 8, 8, 0);
    REQUIRE(d, "cannot write a config");
    for (int n = 2; n <= 8; n *= 2) check_tp("synthetic 8q/8kv", d, "bf16", n);
    rm_synthetic(d);
}

TEST(tp_synthetic_gqa_replicated_bias_tied)
{
    /* qwen2: q/k/v biases; 2 kv heads on 4 and 8 ranks are replicated; 1001 = 8*125+1: padded vocab */
    const char *d = synthetic("gqa", "qwen2", 1001, 64, 100, 8, 2, 1);
    REQUIRE(d, "cannot write a config");
    for (int n = 2; n <= 8; n *= 2) check_tp("synthetic 8q/2kv qwen2 tied", d, "bf16", n);
    rm_synthetic(d);
}

/* GGUF's block formats read in place at TP: every rank's slices of Q4_K / Q6_K rows are whole
 * super-blocks, and a token's x meets the same int8 rounding in the ranks' halves as whole. */
TEST(tp_synthetic_q4_k_m)
{
    const char *d = synthetic("q4km", "llama", 1000, 512, 1024, 8, 2, 0);
    REQUIRE(d, "cannot write a config");
    check_tp("synthetic q4_k_m", d, "q4_k_m", 2);
    rm_synthetic(d);
}

/* Dummy weights of rank 1 of 2: its slices hold the full fill's values, rank 0's slices were
 * never written (zero pages, no memory). */
TEST(dummy_fill_of_a_shard)
{
    const char *d = synthetic("fill", "llama", 1000, 64, 96, 8, 8, 0);
    REQUIRE(d, "cannot write a config");
    sf_error err = { 0 };
    sf_model *full = NULL, *part = NULL;
    sf_load_opts lf = { .dummy = 1 }, lp = lf;
    lp.shard_rank = 1;
    lp.shard_size = 2;
    int rc = sf_model_load(d, &lf, &full, &err);
    if (!rc) rc = sf_model_load(d, &lp, &part, &err);
    CHECK_MSG(rc == SF_OK, "%s", err.msg);
    if (!rc) {
        const sf_view *wf = &full->layers[1].wq, *wp = &part->layers[1].wq; /* [64, 64]: rank 1 has rows 32.. */
        size_t half = sf_dtype_bytes(wf->dtype, 32 * wf->cols);
        const uint8_t *zero = calloc(1, half);
        CHECK(!memcmp((const char *)wp->data + half, (const char *)wf->data + half, half));
        CHECK(!memcmp(wp->data, zero, half) && memcmp(wf->data, zero, half));
        /* down [64, 96] row-parallel: rank 1 has columns 48.. of every row */
        const sf_view *df = &full->layers[0].wdown, *dp = &part->layers[0].wdown;
        size_t rb = sf_dtype_bytes(df->dtype, df->cols), hb = sf_dtype_bytes(df->dtype, 48);
        int ok_mine = 1, ok_other = 1;
        for (int64_t r = 0; r < df->rows; r++) {
            ok_mine &= !memcmp((const char *)dp->data + r * rb + hb, (const char *)df->data + r * rb + hb, hb);
            ok_other &= !memcmp((const char *)dp->data + r * rb, zero, hb);
        }
        CHECK(ok_mine && ok_other);
        CHECK(!memcmp(part->tok_embd.data, full->tok_embd.data, sf_dtype_bytes(df->dtype, 1000 * 64)));
        free((void *)zero);
    }
    sf_model_free(full);
    sf_model_free(part);
    rm_synthetic(d);
}

/* A follower killed (or stopped) between steps: the leader's next step fails within the
 * timeout with a message naming the rank, and stays failed. */
static void check_failure(int sig)
{
    const char *d = synthetic(sig == SIGKILL ? "kill" : "stop", "llama", 1000, 64, 96, 8, 8, 0);
    REQUIRE(d, "cannot write a config");
    sf_error err = { 0 };
    tp_group g;
    int rc = start(d, "bf16", 4, 3000, &g, &err); /* 4 ranks on a loaded 2-core host start slowly */
    CHECK_MSG(rc == SF_OK, "start: %s", err.msg);
    if (!rc) {
        sf_kv_config kc = kv_of(&g.m->cfg, sf_tp_kv_heads(g.tp));
        step s[NSTEPS];
        make_steps(s, g.m->cfg.vocab_size);
        float *got = calloc((size_t)2 * g.m->cfg.vocab_size, sizeof(float));
        sf_batch bt = batch_of(&s[0]);
        CHECK_MSG(sf_tp_kv_init(g.tp, &kc, &err) == SF_OK && sf_tp_step(g.tp, &bt, got, &err) == SF_OK, "%s", err.msg);
        kill(g.pids[1], sig); /* rank 2 */
        double t0 = sf_now_s();
        bt = batch_of(&s[1]);
        rc = sf_tp_step(g.tp, &bt, got, &err);
        double took = sf_now_s() - t0;
        CHECK_MSG(rc == SF_ENODEV, "step after the rank %s: %s", sig == SIGKILL ? "died" : "hung", sf_status_str(rc));
        CHECK_MSG(strstr(err.msg, "rank 2"), "the error names the rank: %s", err.msg);
        CHECK_MSG(took < 10.0, "noticed after %.1f s", took);
        printf("      %s after %.2f s: %s\n", sig == SIGKILL ? "killed" : "stopped", took, err.msg);
        bt = batch_of(&s[2]);
        CHECK(sf_tp_step(g.tp, &bt, got, &err) == SF_ENODEV);
        if (sig == SIGSTOP) kill(g.pids[1], SIGKILL);
        free(got);
    }
    stop(&g); /* reaps every follower: the others exit on the group's failure */
    rm_synthetic(d);
}

/* The all-reduce itself over real processes: sizes changing every round against the exact
 * sum, then a burst without host syncs (tp.c check_all_reduce), at 2, 4 and 8 ranks. */
TEST(tp_all_reduce_check)
{
    for (int size = 2; size <= 8; size *= 2) {
        sf_error err = { 0 };
        tp_group g;
        int rc = start("demo", NULL, size, 0, &g, &err);
        CHECK_MSG(rc == SF_OK, "TP=%d start: %s", size, err.msg);
        if (rc) continue;
        double worst = -1;
        rc = sf_tp_check_all_reduce(g.tp, 70000, 24, SF_COMM_PATH_AUTO, &worst, &err);
        CHECK_MSG(rc == SF_OK && worst == 0, "TP=%d: %s (worst %g)", size, err.msg, worst);
        /* the CPU communicator has no own path: forcing it falls back to shared memory */
        rc = sf_tp_check_all_reduce(g.tp, 5000, 4, SF_COMM_PATH_CUSTOM, &worst, &err);
        CHECK_MSG(rc == SF_OK && worst == 0, "TP=%d custom forced: %s", size, err.msg);
        CHECK(sf_tp_check_all_reduce(g.tp, 0, 4, SF_COMM_PATH_AUTO, &worst, &err) == SF_EINVAL);
        stop(&g);
    }
}

/* A draw's forms' masks made after its plan is sent (masks_later, as the engine does for a step
 * planned ahead): each step's rows held by a mask to the one token make_steps feeds next, taken
 * on every rank's device (src_row), so the last step's logits equal TP=1's only if every rank
 * drew with rank 0's masks. Then a prepare that fails: no rank draws (SF_EUNSUPPORTED back),
 * the step's gathered rows are still read, and the group goes on. */
typedef struct masks_later {
    sf_sample_row *rows;
    const step *next; /* the step after the one being drawn, or NULL */
    uint32_t *bits;   /* [2][words] */
    int words, fail;
} masks_later;

static int masks_later_prepare(void *arg)
{
    masks_later *q = arg;
    if (q->fail) return SF_EUNSUPPORTED;
    memset(q->bits, 0, sizeof *q->bits * 2 * (size_t)q->words);
    const step *n = q->next;
    int32_t want[2] = { n ? n->tokens[0] : -1, -1 };
    if (n && n->S == 2 && n->T - n->seq_start[1] == 1) want[1] = n->tokens[n->T - 1]; /* B's decode token */
    for (int r = 0; r < 2; r++) {
        if (want[r] < 0) continue;
        q->bits[r * q->words + want[r] / 32] |= 1u << (want[r] % 32);
        q->rows[r].allow = q->bits + r * q->words;
    }
    return SF_OK;
}

TEST(tp_masks_after_the_plan)
{
    sf_model_config cfg;
    float *ref = reference("demo", NULL, &cfg);
    REQUIRE(ref, "no TP=1 reference");
    const int V = cfg.vocab_size, words = (V + 31) / 32;
    sf_error err = { 0 };
    tp_group g;
    int rc = start("demo", NULL, 2, 20000, &g, &err);
    REQUIRE(rc == SF_OK, "start: %s", err.msg);
    sf_kv_config kc = kv_of(&cfg, sf_tp_kv_heads(g.tp));
    rc = sf_tp_kv_init(g.tp, &kc, &err);
    if (!rc) rc = sf_tp_defer(g.tp, 1, &err);
    CHECK_MSG(rc == SF_OK, "kv_init / defer: %s", err.msg);
    step s[NSTEPS];
    make_steps(s, V);
    uint32_t *bits = calloc((size_t)2 * words, sizeof *bits);
    float *got = calloc((size_t)2 * V, sizeof(float));
    int32_t ids[NSTEPS][2];
    int queued = 0;
    for (int k = 0; k < NSTEPS && !rc; k++) {
        step *p = &s[k];
        int32_t src[16];
        for (int i = 0; i < p->T; i++) src[i] = -1;
        if (k >= 1) src[0] = 0;        /* A's decode token: row 0 of the draw before */
        if (k >= 4) src[p->T - 1] = 1; /* B's: row 1 */
        sf_batch bt = batch_of(p);
        bt.src_row = src;
        sf_sample_row sr[2];
        for (int r = 0; r < 2; r++)
            sr[r] = (sf_sample_row){ .temperature = 0.9f, .top_p = 1, .repetition_penalty = 1, .seed = 5, .step = (uint64_t)k };
        masks_later q = { .rows = sr, .next = k + 1 < NSTEPS ? &s[k + 1] : NULL, .bits = bits, .words = words };
        sf_forward_sample smp = { .rows = sr, .ids = ids[k], .prepare = masks_later_prepare, .prepare_arg = &q };
        if ((rc = sf_tp_launch_sample(g.tp, &bt, &smp, &err)) || (rc = sf_tp_wait_sample(g.tp, &err))) break;
        if (++queued == 2) { /* the draw before this step's: taken after this step was queued */
            if ((rc = sf_tp_take(g.tp, &err))) break;
            queued--;
        }
    }
    while (!rc && queued-- > 0) rc = sf_tp_take(g.tp, &err);
    CHECK_MSG(rc == SF_OK, "steps with masks after the plan: %s", err.msg);
    int held = 0, all = 0;
    for (int k = 0; !rc && k + 1 < NSTEPS; k++) {
        const step *n = &s[k + 1];
        all += 1 + (n->S == 2 && n->T - n->seq_start[1] == 1);
        held += ids[k][0] == n->tokens[0];
        held += n->S == 2 && n->T - n->seq_start[1] == 1 && ids[k][1] == n->tokens[n->T - 1];
    }
    CHECK_MSG(!rc && held == all, "%d of %d draws held to their masks", held, all);
    /* the last step's gathered rows: every rank fed the masked draws' tokens */
    const float *r = ref + (size_t)(NSTEPS - 1) * 2 * V;
    double worst = 0, scale = 0;
    const int L = s[NSTEPS - 1].L;
    rc = rc ? rc : sf_forward_read_logits(sf_tp_forward(g.tp), L, got, &err);
    for (int i = 0; !rc && i < L * V; i++) {
        worst = fmax(worst, fabs((double)got[i] - r[i]));
        scale = fmax(scale, fabs((double)r[i]));
    }
    CHECK_MSG(!rc && scale > 0 && worst <= 1e-4 * fmax(1.0, scale), "last step's logits %.3g from TP=1's (%s)", worst,
              err.msg);
    /* the same step again (its tokens given), its masks failing: nobody draws, the rows are
     * still gathered, and the group goes on */
    if (!rc) {
        sf_batch bt = batch_of(&s[NSTEPS - 1]);
        sf_sample_row sr[2] = { { .temperature = 0, .top_p = 1, .repetition_penalty = 1 },
                                { .temperature = 0, .top_p = 1, .repetition_penalty = 1 } };
        masks_later q = { .rows = sr, .bits = bits, .words = words, .fail = 1 };
        int32_t none[2];
        sf_forward_sample smp = { .rows = sr, .ids = none, .prepare = masks_later_prepare, .prepare_arg = &q };
        rc = sf_tp_launch_sample(g.tp, &bt, &smp, &err);
        CHECK_MSG(rc == SF_EUNSUPPORTED, "a failed prepare: %s (%s)", sf_status_str(rc), err.msg);
        rc = sf_forward_read_logits(sf_tp_forward(g.tp), L, got, &err);
        worst = 0;
        for (int i = 0; !rc && i < L * V; i++) worst = fmax(worst, fabs((double)got[i] - r[i]));
        CHECK_MSG(!rc && worst <= 1e-4 * fmax(1.0, scale), "after a failed prepare: %.3g (%s)", worst, err.msg);
        CHECK_MSG(sf_tp_step(g.tp, &bt, got, &err) == SF_OK, "the step after: %s", err.msg);
    }
    printf("      %d draws held to masks sent after their plans; last logits %.2e from TP=1\n", held, worst);
    free(bits);
    free(got);
    free(ref);
    stop(&g);
}

TEST(tp_rank_killed) { check_failure(SIGKILL); }
TEST(tp_rank_hung) { check_failure(SIGSTOP); }

int main(void)
{
    setenv("SEMFLOW_LOG", "error", 0);
    RUN(shard_shapes);
    RUN(tp_demo);
    RUN(tp_tiny_random_llama2);
    RUN(tp_synthetic_kv_split);
    RUN(tp_synthetic_gqa_replicated_bias_tied);
    RUN(tp_synthetic_q4_k_m);
    RUN(dummy_fill_of_a_shard);
    RUN(tp_all_reduce_check);
    RUN(tp_masks_after_the_plan);
    RUN(tp_swap_moves_a_sequence);
    RUN(tp_bad_swap_copies_fail_the_group);
    RUN(tp_rank_killed);
    RUN(tp_rank_hung);
    return test_summary();
}
