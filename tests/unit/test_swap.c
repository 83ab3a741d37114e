/* test_swap.c — preemption by swap. The engine on the CPU backend with stories260K: 32
 * concurrent requests on a 12-block KV pool, swapping to host memory, give token for token the
 * output of each request run alone, and compute no token twice; a swap space too small for most
 * sequences falls back to recompute with the same output; swap off preempts by recompute only.
 * The scheduler alone: a random workload over a simulated KV memory checks after every swap that
 * each sequence finds its own tokens' K/V, and that no KV block or swap slot leaks. The DMA
 * scheduler copies whole blocks in runs sized by urgency. */
#include <pthread.h>

#include "engine/dma.h"
#include "engine/engine.h"
#include "engine/kvcache.h"
#include "engine/scheduler.h"
#include "engine/tokenizer.h"
#include "tests/test.h"
#include "tests/lib/engine_collect.h"
#include "tests/lib/engine_wait.h"

/* The engine every test here runs: stories260K on one CPU thread, a small KV pool. */
static void swap_config(sf_engine_config *c, int kv_blocks)
{
    sf_engine_config_default(c);
    c->model = test_data("stories260K/stories260K.gguf");
    c->backend = "cpu";
    c->n_threads = 1;
    c->max_num_seqs = 8;
    c->max_batched_tokens = 64;
    c->num_kv_blocks = kv_blocks;
}

static sf_engine *open_engine(int kv_blocks, double swap_gib, sf_error *err)
{
    sf_engine_config c;
    swap_config(&c, kv_blocks);
    c.swap_space_gib = swap_gib;
    sf_engine *e = NULL;
    if (sf_engine_new(&c, &e, err) != SF_OK) return NULL;
    return e;
}

enum { N = 32 };
static int32_t prompts[N][64];
static int np[N];
static collect ref[N]; /* each request alone, on a pool that never preempts */

static sf_sampling sampling(int i)
{
    sf_sampling sp;
    sf_sampling_default(&sp);
    sp.max_tokens = 8 + (i * 7) % 40;
    sp.ignore_eos = 1;
    if (i % 2) sp.temperature = 0; /* half greedy, half seeded sampling: the rng state must carry over too */
    else sp.seed = 1000 + (uint64_t)i, sp.has_seed = 1;
    return sp;
}

static int submit(sf_engine *e, int i, collect *c, sf_error *err)
{
    sf_submit s;
    memset(&s, 0, sizeof s);
    s.prompt = prompts[i];
    s.n_prompt = np[i];
    s.sampling = sampling(i);
    s.intent.urgency = i % 3 == 0 ? SF_URGENCY_LOW : SF_URGENCY_NORMAL;
    s.cb = on_event;
    s.user = c;
    double retry;
    return sf_engine_submit(e, &s, NULL, &retry, err);
}

static int make_reference(void)
{
    static int made;
    if (made) return 0;
    sf_error err = { 0 };
    sf_engine *e = open_engine(0, 0, &err);
    if (!e) {
        printf("engine: %s\n", err.msg);
        return -1;
    }
    static const char *words[] = { "Tom", "The sun", "A little bird", "Once", "Lily and Ben went", "The big dog" };
    for (int i = 0; i < N; i++) {
        char text[128];
        snprintf(text, sizeof text, "%s %s", words[i % 6], i % 3 == 0 ? "was happy. One day" : "saw");
        int32_t *ids = NULL;
        size_t n = 0;
        if (sf_tok_encode(sf_engine_tokenizer(e), text, strlen(text), 1, &ids, &n, NULL) != SF_OK) return -1;
        np[i] = (int)SF_MIN(n, (size_t)64);
        memcpy(prompts[i], ids, (size_t)np[i] * sizeof(int32_t));
        free(ids);
        collect_init(&ref[i]);
        if (submit(e, i, &ref[i], &err) != SF_OK) return -1;
        collect_wait(&ref[i]);
    }
    sf_engine_free(e);
    made = 1;
    return 0;
}

/* All N at once on a 12-block pool with the given swap space; returns the stats delta. */
static void run_concurrent(double swap_gib, sf_engine_stats *st, int *same, long *computed)
{
    static collect many[N];
    sf_error err = { 0 };
    *same = -1;
    sf_engine *e = open_engine(12, swap_gib, &err);
    if (!e) {
        printf("engine: %s\n", err.msg);
        return;
    }
    for (int i = 0; i < N; i++) {
        collect_init(&many[i]);
        if (submit(e, i, &many[i], &err) != SF_OK) printf("submit %d: %s\n", i, err.msg);
    }
    *same = 0;
    *computed = 0;
    for (int i = 0; i < N; i++) {
        collect_wait(&many[i]);
        *same += many[i].n_tokens == ref[i].n_tokens && many[i].finish == ref[i].finish &&
                 !memcmp(many[i].tokens, ref[i].tokens, (size_t)ref[i].n_tokens * sizeof(int32_t));
        *computed += np[i] + ref[i].n_tokens - 1; /* the last token is sampled, never fed back */
    }
    wait_idle(e, st);
    sf_engine_free(e);
}

TEST(swap_resumes_exactly)
{
    REQUIRE(make_reference() == 0, "reference runs failed");
    sf_engine_stats st;
    int same;
    long computed;
    run_concurrent(1.0, &st, &same, &computed);
    CHECK_MSG(same == N, "%d of %d requests match their solo run", same, N);
    CHECK_MSG(st.swaps_out > 0 && st.swaps_out <= st.preemptions, "%llu swaps for %llu preemptions",
              (unsigned long long)st.swaps_out, (unsigned long long)st.preemptions);
    /* every swap-out came back, or its sequence ended while out (async: its last token in flight) */
    CHECK_MSG(st.swaps_in + st.swaps_dropped == st.swaps_out, "%llu swapped out, %llu in, %llu dropped",
              (unsigned long long)st.swaps_out, (unsigned long long)st.swaps_in, (unsigned long long)st.swaps_dropped);
    CHECK_MSG(st.swap_fallbacks == 0, "%llu fallbacks with 1 GiB of swap", (unsigned long long)st.swap_fallbacks);
    /* with every preemption by swap, no token's K/V is computed twice */
    CHECK_MSG((long)(st.tokens_prefill + st.tokens_decode) == computed, "%llu tokens computed, %ld needed",
              (unsigned long long)(st.tokens_prefill + st.tokens_decode), computed);
    CHECK_MSG(st.kv_blocks_used == 0 && st.swap_blocks_used == 0, "left: %d KV blocks, %d swap slots",
              st.kv_blocks_used, st.swap_blocks_used);
    printf("  swap: %llu preemptions, %llu swapped out and in; %llu tokens computed\n",
           (unsigned long long)st.preemptions, (unsigned long long)st.swaps_out,
           (unsigned long long)(st.tokens_prefill + st.tokens_decode));
}

TEST(small_swap_falls_back_to_recompute)
{
    REQUIRE(make_reference() == 0, "reference runs failed");
    sf_engine_stats st;
    int same;
    long computed;
    /* stories260K: 5 layers x K,V x 4 heads x 16 tokens x 8 dims x 4 bytes = 20 KiB per block: 1 slot */
    run_concurrent(1.5 * 20480 / (double)(1u << 30), &st, &same, &computed);
    CHECK_MSG(st.swap_blocks_total == 1, "swap space of %d blocks, expected 1", st.swap_blocks_total);
    CHECK_MSG(same == N, "%d of %d requests match their solo run", same, N);
    CHECK_MSG(st.swap_fallbacks > 0 && st.swaps_out > 0, "%llu swaps, %llu fallbacks",
              (unsigned long long)st.swaps_out, (unsigned long long)st.swap_fallbacks);
    CHECK(st.swaps_out + st.swap_fallbacks <= st.preemptions);
    CHECK_MSG(st.kv_blocks_used == 0 && st.swap_blocks_used == 0, "left: %d KV blocks, %d swap slots",
              st.kv_blocks_used, st.swap_blocks_used);
    printf("  small swap: %llu preemptions, %llu by swap, %llu fell back to recompute\n",
           (unsigned long long)st.preemptions, (unsigned long long)st.swaps_out,
           (unsigned long long)st.swap_fallbacks);
}

TEST(swap_off_recomputes)
{
    REQUIRE(make_reference() == 0, "reference runs failed");
    sf_engine_stats st;
    int same;
    long computed;
    run_concurrent(0, &st, &same, &computed);
    CHECK_MSG(same == N, "%d of %d requests match their solo run", same, N);
    CHECK(st.preemptions > 0 && st.swaps_out == 0 && st.swap_blocks_total == 0);
    CHECK_MSG((long)(st.tokens_prefill + st.tokens_decode) > computed, "recompute should compute tokens again");
}

/* ---- copies in whole blocks through the DMA scheduler ---------------------------------------- */

static int byte_copy(void *arg, void *dst, const void *src, size_t n, int dir, sf_error *err)
{
    memcpy(dst, src, n);
    return SF_OK;
}

typedef struct runs { int n, first[64], count[64]; } runs;

static int record_run(void *arg, int first, int count, sf_error *err)
{
    runs *r = arg;
    if (r->n == 64) return sf_err(err, SF_ERROR, "too many runs");
    r->first[r->n] = first;
    r->count[r->n++] = count;
    return SF_OK;
}

TEST(dma_copies_whole_blocks_per_urgency)
{
    sf_dma_opts o = { .copy = byte_copy };
    sf_dma *d = NULL;
    sf_error err = { 0 };
    REQUIRE(sf_dma_new(&o, &d, &err) == SF_OK, "dma: %s", err.msg);
    /* 20 KiB blocks: low (64 KiB chunks) copies 3 at a time, normal (128 KiB) 6, high (512 KiB) 25 */
    static const int per[SF_URGENCY_COUNT] = { 3, 6, 25 };
    for (int u = 0; u < SF_URGENCY_COUNT; u++) {
        runs r = { 0 };
        CHECK(sf_dma_copy_units(d, 40, 20480, SF_DMA_D2H, u, record_run, &r, &err) == SF_OK);
        int next = 0, ok = 1;
        for (int i = 0; i < r.n; i++) {
            ok &= r.first[i] == next && r.count[i] == SF_MIN(per[u], 40 - next);
            next += r.count[i];
        }
        CHECK_MSG(ok && next == 40, "urgency %d: %d runs covering %d blocks", u, r.n, next);
    }
    sf_dma_stats st;
    sf_dma_get_stats(d, &st);
    CHECK(st.bytes[SF_URGENCY_LOW][SF_DMA_D2H] == 40 * 20480 && st.chunks[SF_URGENCY_LOW] == 14);
    CHECK(st.chunks[SF_URGENCY_HIGH] == 2);
    CHECK(sf_dma_copy_units(d, 2, 0, SF_DMA_H2D, 1, record_run, NULL, &err) == SF_EINVAL);
    sf_dma_free(d);
}

/* ---- the scheduler alone, over a simulated KV memory ---------------------------------------- */

typedef struct fake {
    sf_seq q;
    int want, got, done, id;
} fake;

TEST(random_workload_kv_follows_swaps)
{
    enum { BLOCKS = 64, BS = 8, SWAP = 40, MAXF = 1500 };
    sf_kv_pool pool;
    sf_sched s;
    sf_error err = { 0 };
    REQUIRE(sf_kv_pool_init(&pool, BLOCKS, BS, &err) == SF_OK, "pool");
    sf_sched_config c = { .max_num_seqs = 10, .max_batched_tokens = 80, .max_model_len = 256,
                          .kv_high_reserve = 0.1f, .swap_blocks = SWAP };
    REQUIRE(sf_sched_init(&s, &c, &pool, &err) == SF_OK, "sched: %s", err.msg);
    /* "K/V" of a token = a hash of (sequence, position, token) */
    static uint32_t kv[BLOCKS * BS], swap[SWAP * BS];
    fake **all = calloc(MAXF, sizeof *all);
    sf_rng rng;
    sf_rng_seed(&rng, 7);
    int n_all = 0, bad = 0, steps = 0, checked = 0;
    char why[160] = "";
#define KVOF(f, t) ((uint32_t)(f)->id * 2654435761u ^ (uint32_t)(t) * 40503u ^ (uint32_t)(f)->q.tokens[t])
    for (; steps < 30000; steps++) {
        if (steps < 2500 && n_all < MAXF && sf_rng_uniform(&rng) < 0.3f) {
            fake *f = calloc(1, sizeof *f);
            int n = 1 + (int)(sf_rng_next(&rng) % 120);
            int32_t p[128];
            for (int i = 0; i < n; i++) p[i] = (int32_t)(sf_rng_next(&rng) % 1000);
            sf_seq_init(&f->q, p, n, NULL);
            f->q.urgency = (int)(sf_rng_next(&rng) % 3);
            f->q.owner = f;
            f->id = n_all;
            f->want = 1 + (int)(sf_rng_next(&rng) % 30);
            all[n_all++] = f;
            sf_sched_add(&s, &f->q);
        }
        if (n_all && sf_rng_uniform(&rng) < 0.03f) { /* cancel one */
            fake *f = all[sf_rng_next(&rng) % (uint64_t)n_all];
            if (!f->done) sf_sched_remove(&s, &f->q), f->done = 1;
        }
        const sf_plan *p = sf_sched_plan(&s);
        for (int i = 0; i < p->n_stuck; i++) ((fake *)p->stuck[i]->owner)->done = 1;
        /* run the copies as the engine does: every swap-out, then every swap-in */
        for (int i = 0; i < p->n_swap_out; i++) {
            const sf_swap_op *o = &p->swap_out[i];
            for (int j = 0; o->seq && j < o->n; j++)
                memcpy(swap + o->slots[j] * BS, kv + o->blocks[j] * BS, BS * sizeof *kv);
        }
        for (int i = 0; i < p->n_swap_in; i++) {
            const sf_swap_op *o = &p->swap_in[i];
            for (int j = 0; o->seq && j < o->n; j++)
                memcpy(kv + o->blocks[j] * BS, swap + o->slots[j] * BS, BS * sizeof *kv);
        }
        /* every planned sequence finds its computed tokens' K/V; then the step writes its own */
        for (int i = 0; i < p->n_items; i++) {
            const sf_plan_item *it = &p->items[i];
            if (!it->seq) continue;
            fake *f = it->seq->owner;
            for (int t = 0; t < it->start; t++, checked++)
                if (kv[it->seq->blocks[t / BS] * BS + t % BS] != KVOF(f, t) && !bad++)
                    snprintf(why, sizeof why, "step %d: sequence %d lost the K/V of position %d of %d", steps,
                             f->id, t, it->start);
            for (int t = it->start; t < it->start + it->n; t++) kv[it->seq->blocks[t / BS] * BS + t % BS] = KVOF(f, t);
        }
        if (p->n_tokens) sf_sched_commit(&s);
        else sf_sched_discard(&s);
        for (int i = 0; i < p->n_items; i++) {
            sf_seq *q = p->items[i].seq;
            if (!q || !p->items[i].logits) continue;
            fake *f = q->owner;
            sf_seq_append(q, (int32_t)(sf_rng_next(&rng) % 1000));
            if (++f->got >= f->want) sf_sched_remove(&s, q), f->done = 1;
        }
        if (bad || (steps >= 2500 && s.n_running + sf_sched_waiting_total(&s) == 0)) break;
    }
#undef KVOF
    CHECK_MSG(!bad, "%s", why);
    CHECK_MSG(s.n_running + sf_sched_waiting_total(&s) == 0, "work left after %d steps", steps);
    sf_sched_plan(&s); /* the last step's swap-ins give their slots back */
    sf_sched_discard(&s);
    CHECK_MSG(pool.n_free == pool.n_blocks, "leak: %d of %d KV blocks free", pool.n_free, pool.n_blocks);
    CHECK_MSG(s.swap.n_free == s.swap.n_blocks, "leak: %d of %d swap slots free", s.swap.n_free, s.swap.n_blocks);
    CHECK_MSG(s.swaps_out > 100 && s.swap_fallbacks > 0, "%llu swaps, %llu fallbacks: the workload should force both",
              (unsigned long long)s.swaps_out, (unsigned long long)s.swap_fallbacks);
    printf("  %d requests, %d steps, %llu preemptions: %llu by swap, %llu fell back; %d K/V positions checked\n",
           n_all, steps, (unsigned long long)s.preemptions, (unsigned long long)s.swaps_out,
           (unsigned long long)s.swap_fallbacks, checked);
    for (int i = 0; i < n_all; i++) {
        sf_seq_free(&all[i]->q);
        free(all[i]);
    }
    free(all);
    sf_sched_free(&s);
    sf_kv_pool_free(&pool);
}

/* The DMA tuner's gate (sf_sched_config.swap_in_ok): while it says no, a sequence preempted by
 * swap stays waiting even when blocks are free; once it says yes, its K/V comes back. */
static int gate_open, gate_calls, gate_urgency = -1;
static int gate(void *arg, int urgency)
{
    gate_calls++;
    gate_urgency = urgency;
    return gate_open;
}

TEST(swap_in_waits_for_the_gate)
{
    sf_kv_pool pool;
    sf_sched s;
    sf_error err = { 0 };
    REQUIRE(sf_kv_pool_init(&pool, 8, 4, &err) == SF_OK, "pool");
    sf_sched_config c = { .max_num_seqs = 4, .max_batched_tokens = 32, .max_model_len = 32, .kv_high_reserve = 0,
                          .swap_blocks = 16, .swap_in_ok = gate };
    REQUIRE(sf_sched_init(&s, &c, &pool, &err) == SF_OK, "sched: %s", err.msg);
    int32_t p[24];
    for (int i = 0; i < 24; i++) p[i] = i + 1;
    sf_seq lo, hi;
    sf_seq_init(&lo, p, 20, NULL);
    sf_seq_init(&hi, p, 24, NULL);
    lo.urgency = SF_URGENCY_LOW;
    hi.urgency = SF_URGENCY_HIGH;
    sf_sched_add(&s, &lo);
    const sf_plan *pl = sf_sched_plan(&s);
    CHECK(pl->n_tokens == 20);
    sf_sched_commit(&s);
    sf_seq_append(&lo, 99);
    sf_sched_add(&s, &hi); /* needs 6 of the 8 blocks: lo (5) is preempted by swap */
    pl = sf_sched_plan(&s);
    CHECK_MSG(pl->n_swap_out == 1 && lo.n_swap == 5, "%d swap-outs, %d blocks swapped", pl->n_swap_out, lo.n_swap);
    sf_sched_commit(&s);
    sf_sched_remove(&s, &hi);
    gate_open = 0;
    gate_calls = 0;
    for (int k = 0; k < 3; k++) { /* blocks are free, the gate is closed: nothing runs */
        pl = sf_sched_plan(&s);
        CHECK_MSG(pl->n_swap_in == 0 && pl->n_tokens == 0, "step %d: %d swap-ins, %d tokens", k, pl->n_swap_in,
                  pl->n_tokens);
        sf_sched_discard(&s);
    }
    CHECK_MSG(gate_calls == 3 && gate_urgency == SF_URGENCY_LOW, "gate asked %d times (urgency %d)", gate_calls,
              gate_urgency);
    gate_open = 1;
    pl = sf_sched_plan(&s);
    CHECK_MSG(pl->n_swap_in == 1 && pl->swap_in[0].n == 5 && pl->n_tokens == 1,
              "gate open: %d swap-ins, %d tokens", pl->n_swap_in, pl->n_tokens);
    sf_sched_commit(&s);
    sf_sched_remove(&s, &lo);
    sf_sched_plan(&s);
    sf_sched_discard(&s);
    CHECK_MSG(pool.n_free == pool.n_blocks && s.swap.n_free == s.swap.n_blocks, "leak: %d/%d blocks, %d/%d slots",
              pool.n_free, pool.n_blocks, s.swap.n_free, s.swap.n_blocks);
    sf_seq_free(&lo);
    sf_seq_free(&hi);
    sf_sched_free(&s);
    sf_kv_pool_free(&pool);
}

/* The engine with its DMA tuner seeing a fully contended link, and with the tuner off: the same
 * tokens as each request alone, and nothing left behind. */
static double always_contended(void *arg, int device) { return 1.0; }

TEST(tuner_on_and_off_keep_outputs_exact)
{
    REQUIRE(make_reference() == 0, "reference runs failed");
    for (int tuner = 0; tuner < 2; tuner++) {
        static collect many[N];
        sf_engine_config c;
        swap_config(&c, 12);
        c.dma_tuner = tuner;
        c.pcie_contention = always_contended;
        sf_engine *e = NULL;
        sf_error err = { 0 };
        REQUIRE(sf_engine_new(&c, &e, &err) == SF_OK, "engine: %s", err.msg);
        for (int i = 0; i < N; i++) {
            collect_init(&many[i]);
            if (submit(e, i, &many[i], &err) != SF_OK) printf("submit %d: %s\n", i, err.msg);
        }
        int same = 0;
        for (int i = 0; i < N; i++) {
            collect_wait(&many[i]);
            same += many[i].n_tokens == ref[i].n_tokens &&
                    !memcmp(many[i].tokens, ref[i].tokens, (size_t)ref[i].n_tokens * sizeof(int32_t));
        }
        sf_engine_stats st;
        wait_idle(e, &st);
        CHECK_MSG(same == N, "tuner %s: %d of %d requests match their solo run", tuner ? "on" : "off", same, N);
        CHECK_MSG(st.swaps_out > 0 && st.swaps_in + st.swaps_dropped == st.swaps_out, "tuner %s: %llu out, %llu in, %llu dropped",
                  tuner ? "on" : "off", (unsigned long long)st.swaps_out, (unsigned long long)st.swaps_in,
                  (unsigned long long)st.swaps_dropped);
        CHECK_MSG(st.pcie_contention == 1.0, "the engine saw contention %g", st.pcie_contention);
        CHECK_MSG(st.dma_bytes[SF_URGENCY_LOW] > 0, "no low-class swap bytes counted");
        /* tuner on: low-class swap-ins wait while normal-class sequences run on the contended link */
        CHECK_MSG(tuner ? st.dma_deferred > 0 : st.dma_deferred == 0, "tuner %s held back %llu swap-ins",
                  tuner ? "on" : "off", (unsigned long long)st.dma_deferred);
        CHECK(st.kv_blocks_used == 0 && st.swap_blocks_used == 0);
        printf("  tuner %s: %llu swaps (%llu dropped), %llu low-class swap-ins held back\n", tuner ? "on" : "off",
               (unsigned long long)st.swaps_out, (unsigned long long)st.swaps_dropped, (unsigned long long)st.dma_deferred);
        sf_engine_free(e);
    }
}

int main(void)
{
    RUN(dma_copies_whole_blocks_per_urgency);
    RUN(random_workload_kv_follows_swaps);
    RUN(swap_resumes_exactly);
    RUN(small_swap_falls_back_to_recompute);
    RUN(swap_off_recomputes);
    RUN(swap_in_waits_for_the_gate);
    RUN(tuner_on_and_off_keep_outputs_exact);
    return test_summary();
}
