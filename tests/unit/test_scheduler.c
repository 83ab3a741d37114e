/* test_scheduler.c — the scheduler driven directly, without a model: token budget, chunked
 * prefill, decode priority, urgency lanes and deadlines, the high-urgency KV reserve,
 * preemption by recompute, and a long random workload checking invariants and leaks. */
#include <math.h>

#include "engine/engine.h"
#include "engine/kvcache.h"
#include "engine/scheduler.h"
#include "tests/test.h"

/* A fake request: a sequence that wants `want` output tokens. */
typedef struct fake {
    sf_seq q;
    int want, got;
    int finished, stuck;
    int id;
    int scored;         /* positions scored (logit rows of score_at .. + n_score) */
} fake;

static fake *fake_new(int id, int urgency, int n_prompt, int want)
{
    fake *f = calloc(1, sizeof *f);
    int32_t *p = malloc((size_t)(n_prompt + 1) * sizeof *p);
    for (int i = 0; i < n_prompt; i++) p[i] = (id * 131 + i) % 1000;
    sf_seq_init(&f->q, p, n_prompt, NULL);
    free(p);
    f->q.urgency = urgency;
    f->q.owner = f;
    f->want = want;
    f->id = id;
    return f;
}

static void fake_free(fake *f)
{
    if (!f) return;
    sf_seq_free(&f->q);
    free(f);
}

typedef struct world {
    sf_kv_pool pool;
    sf_sched s;
    int bad;            /* invariant violations seen */
    char why[256];
    uint64_t *kv;       /* per slot, what "K/V" the last step wrote there */
    uint64_t *swap_kv;  /* per swap slot (blocks of one slot each: block_size values) */
    int *holders;       /* [n_blocks] scratch: holders counted over the sequences */
} world;

static int table_quantum; /* the block table's stride quantum of the worlds made next */
static int prefix_cache;  /* the prefix cache of the worlds made next */
static int swap_blocks;   /* and their swap space */

static int world_init(world *w, int n_blocks, int bs, int max_seqs, int budget, int max_len, float reserve)
{
    memset(w, 0, sizeof *w);
    sf_error err = { 0 };
    if (sf_kv_pool_init(&w->pool, n_blocks, bs, &err) != SF_OK) return -1;
    sf_sched_config c = { .max_num_seqs = max_seqs, .max_batched_tokens = budget, .max_model_len = max_len,
                          .kv_high_reserve = reserve, .table_quantum = table_quantum, .prefix_cache = prefix_cache,
                          .swap_blocks = swap_blocks };
    w->swap_kv = calloc((size_t)SF_MAX(swap_blocks, 1) * (size_t)bs, sizeof *w->swap_kv);
    w->kv = calloc((size_t)n_blocks * (size_t)bs, sizeof *w->kv);
    w->holders = calloc((size_t)n_blocks, sizeof *w->holders);
    if (sf_sched_init(&w->s, &c, &w->pool, &err) != SF_OK) {
        printf("sched init: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* A world with the prefix cache: blocks of 16 tokens, 8 seats, contexts of up to 2048. */
static int cached_world_init(world *w, int n_blocks, int budget, float reserve)
{
    prefix_cache = 1;
    int rc = world_init(w, n_blocks, 16, 8, budget, 2048, reserve);
    prefix_cache = 0;
    return rc;
}

static void world_free(world *w)
{
    free(w->kv);
    free(w->swap_kv);
    free(w->holders);
    sf_sched_free(&w->s);
    sf_kv_pool_free(&w->pool);
}

static void note_bad(world *w, const char *what)
{
    if (!w->bad) snprintf(w->why, sizeof w->why, "step %llu: %s", (unsigned long long)w->s.steps, what);
    w->bad++;
}

typedef struct counts {
    world *w;
    int distinct;       /* blocks held, each once */
    int low_counted;    /* blocks low/normal urgency holds and counts (held_low_units / 2) */
    int waiting_holders;
} counts;

static void count_blocks(sf_seq *q, void *arg)
{
    counts *c = arg;
    for (int j = 0; j < q->n_blocks; j++) c->distinct += c->w->holders[q->blocks[j]]++ == 0;
    if (q->urgency < SF_URGENCY_HIGH) c->low_counted += q->n_blocks - q->n_uncounted;
    if (q->state == SF_SEQ_WAITING && q->n_blocks) c->waiting_holders++;
}

/* What a step writes at position t of a sequence: a stand-in for its K/V, which depends on the
 * salt and every token up to t. */
static uint64_t kv_at(const sf_seq *q, int t)
{
    uint64_t h = q->cache_salt * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i <= t; i++) h = (h ^ (uint32_t)q->tokens[i]) * 0x100000001b3ull;
    return h;
}

/* Invariants after planning. */
static void check_plan(world *w, const sf_plan *p)
{
    sf_sched *s = &w->s;
    int live = 0, tokens = 0, rows = 0;
    if (p->n_tokens > s->cfg.max_batched_tokens) note_bad(w, "token budget exceeded");
    for (int i = 0; i < p->n_items; i++) {
        const sf_plan_item *it = &p->items[i];
        if (!it->seq) continue;
        live++;
        tokens += it->n;
        if (it->seq->state != SF_SEQ_RUNNING) note_bad(w, "planned sequence not running");
        if (it->seq->plan_idx != i) note_bad(w, "plan_idx mismatch");
        if (it->n < 1) note_bad(w, "empty item");
        if (it->start != it->seq->n_computed) note_bad(w, "item does not start at n_computed");
        if (it->start + it->n > it->seq->n_tokens) note_bad(w, "item beyond known tokens");
        if (sf_kv_blocks_for(&w->pool, it->start + it->n) > it->seq->n_blocks) note_bad(w, "blocks missing");
        if (it->logits != (it->start + it->n == it->seq->n_tokens)) note_bad(w, "logits flag wrong");
        /* scored positions: every one of the item's in [score_from, score_to), in order */
        const int a = SF_MAX(it->start, it->seq->score_from), z = SF_MIN(it->start + it->n, it->seq->score_to);
        if (it->n_score != SF_MAX(0, z - a) || (it->n_score && it->score_at != a)) note_bad(w, "scored positions wrong");
        rows += it->logits + it->n_score;
    }
    if (rows > s->cfg.max_logits) note_bad(w, "more logit rows than max_logits");
    if (tokens != p->n_tokens) note_bad(w, "n_tokens does not add up");
    if (p->n_decode + p->n_prefill != p->n_tokens) note_bad(w, "decode + prefill != tokens");
    if (live > s->cfg.max_num_seqs || s->n_running > s->cfg.max_num_seqs) note_bad(w, "seat limit exceeded");
    counts c = { .w = w };
    memset(w->holders, 0, (size_t)w->pool.n_blocks * sizeof *w->holders);
    sf_sched_foreach(s, count_blocks, &c);
    if (c.distinct + w->pool.n_free != w->pool.n_blocks) note_bad(w, "blocks leaked or double-counted");
    for (int b = 0; b < w->pool.n_blocks; b++)
        if (w->holders[b] != sf_kv_refs(&w->pool, b)) { note_bad(w, "a block's count is not its holders"); break; }
    if (2 * c.low_counted != s->held_low_units) note_bad(w, "held_low_units out of sync");
    if (s->held_low_units > 2 * w->pool.n_blocks - s->reserve_units) note_bad(w, "reserve taken by low/normal urgency");
    if (c.waiting_holders) note_bad(w, "waiting sequence holds blocks");
    if (w->pool.n_evictable + w->pool.n_stack != w->pool.n_free) note_bad(w, "free pairs not plain + evictable");
    /* the cache: every computed position holds what its own tokens wrote (a block found cached
     * held the same prefix, and nobody wrote into a block while another shares it); the blocks a
     * step writes are its item's alone and not registered */
    for (int i = 0; i < p->n_items; i++) {
        const sf_plan_item *it = &p->items[i];
        const sf_seq *q = it->seq;
        if (!q) continue;
        const int bs = w->pool.block_size;
        for (int t = 0; t < it->start; t++)
            if (w->kv[(size_t)q->blocks[t / bs] * bs + t % bs] != kv_at(q, t)) {
                note_bad(w, "a computed position does not hold its sequence's K/V");
                t = it->start;
                i = p->n_items;
            }
        for (int j = it->start / bs; j < sf_kv_blocks_for(&w->pool, it->start + it->n) && i < p->n_items; j++)
            if (sf_kv_refs(&w->pool, q->blocks[j]) != 1 || (w->pool.pc_on && w->pool.pc_reg[q->blocks[j]])) {
                note_bad(w, "a step writes into a shared or registered block");
                break;
            }
    }
    for (sf_seq *q = s->running.next; q != &s->running; q = q->next)
        if (q->plan_idx >= 0 && (q->plan_idx >= p->n_items || p->items[q->plan_idx].seq != q)) note_bad(w, "stale plan_idx");
    for (sf_seq *q = s->waiting.next; q != &s->waiting; q = q->next)
        if (q->plan_idx >= 0) note_bad(w, "waiting with plan_idx");
    for (int i = 0; i < p->n_items; i++) if (p->items[i].seq && p->items[i].seq->plan_idx != i) note_bad(w, "item/seq mismatch");
    /* the batch: every slot used once, positions in range */
    sf_batch b;
    sf_sched_batch(s, &b);
    if (b.n_tokens != p->n_tokens || b.n_seqs != live) note_bad(w, "batch size mismatch");
    /* logit rows: every item's last token when it has logits, then every item's scored positions */
    if (b.n_logits != rows) note_bad(w, "logit rows do not add up");
    for (int pass = 0, L = 0; pass < 2 && b.n_logits == rows; pass++)
        for (int i = 0, T = 0; i < p->n_items; i++) {
            const sf_plan_item *it = &p->items[i];
            if (!it->seq) continue;
            if (pass == 0 && it->logits && b.logit_rows[L++] != T + it->n - 1) note_bad(w, "next-token row misplaced");
            for (int j = 0; pass == 1 && j < it->n_score; j++)
                if (b.logit_rows[L++] != T + it->score_at - it->start + j) note_bad(w, "scored row misplaced");
            T += it->n;
        }
    /* the block table: each row the sequence's blocks then zeros, the stride the widest
     * sequence's blocks rounded up to the quantum */
    int widest = 1, q = SF_MAX(s->cfg.table_quantum, 1);
    for (int i = 0, r = 0; i < p->n_items; i++) {
        const sf_seq *sq = p->items[i].seq;
        if (!sq) continue;
        widest = SF_MAX(widest, sq->n_blocks);
        const int32_t *row = b.block_table + (size_t)r++ * b.max_blocks;
        for (int j = 0; j < b.max_blocks; j++)
            if (row[j] != (j < sq->n_blocks ? sq->blocks[j] : 0)) { note_bad(w, "block table row wrong"); break; }
    }
    if (live && b.max_blocks != (widest + q - 1) / q * q) note_bad(w, "block table stride not the rounded widest");
    static unsigned char seen[1 << 16];
    int slots = w->pool.n_blocks * w->pool.block_size;
    if (slots <= (int)sizeof seen) {
        memset(seen, 0, (size_t)slots);
        for (int t = 0; t < b.n_tokens; t++) {
            if (b.slot[t] < 0 || b.slot[t] >= slots || seen[b.slot[t]]++) { note_bad(w, "bad or repeated slot"); break; }
        }
    }
}

/* One step: plan, check, "write" the planned positions' K/V, commit, then "sample" for every
 * item with logits. Finished fakes are removed from the scheduler. Returns the plan. */
static const sf_plan *step(world *w)
{
    const sf_plan *p = sf_sched_plan(&w->s);
    const size_t bsz = (size_t)w->pool.block_size;
    /* the copies before the step, as the engine runs them: every swap-out, then every swap-in */
    for (int i = 0; i < p->n_swap_out; i++)
        for (int j = 0; p->swap_out[i].seq && j < p->swap_out[i].n; j++)
            memcpy(w->swap_kv + p->swap_out[i].slots[j] * bsz, w->kv + p->swap_out[i].blocks[j] * bsz, bsz * sizeof *w->kv);
    for (int i = 0; i < p->n_swap_in; i++)
        for (int j = 0; p->swap_in[i].seq && j < p->swap_in[i].n; j++)
            memcpy(w->kv + p->swap_in[i].blocks[j] * bsz, w->swap_kv + p->swap_in[i].slots[j] * bsz, bsz * sizeof *w->kv);
    check_plan(w, p);
    for (int i = 0; i < p->n_items; i++) {
        const sf_plan_item *it = &p->items[i];
        if (!it->seq) continue;
        const int bs = w->pool.block_size;
        for (int t = it->start; t < it->start + it->n; t++)
            w->kv[(size_t)it->seq->blocks[t / bs] * bs + t % bs] = kv_at(it->seq, t);
    }
    for (int i = 0; i < p->n_stuck; i++) ((fake *)p->stuck[i]->owner)->stuck = 1;
    sf_sched_commit(&w->s);
    for (int i = 0; i < p->n_items; i++) {
        sf_seq *q = p->items[i].seq;
        if (q) ((fake *)q->owner)->scored += p->items[i].n_score;
        if (!q || !p->items[i].logits) continue;
        fake *f = q->owner;
        sf_seq_append(q, 7 + f->got);
        f->got++;
        if (f->got >= f->want) {
            sf_sched_remove(&w->s, q);
            f->finished = 1;
        }
    }
    return p;
}

TEST(token_budget_and_chunked_prefill)
{
    world w;
    int wrc = world_init(&w, 1000, 16, 8, 64, 4096, 0.0f);
    REQUIRE(wrc == 0, "init");
    fake *f = fake_new(1, SF_URGENCY_NORMAL, 200, 3);
    sf_sched_add(&w.s, &f->q);
    int chunks[8], n = 0;
    while (!f->finished && n < 8) {
        const sf_plan *p = step(&w);
        CHECK(p->n_tokens <= 64);
        chunks[n++] = p->n_tokens;
    }
    CHECK_MSG(n == 6, "steps %d", n);
    CHECK(chunks[0] == 64 && chunks[1] == 64 && chunks[2] == 64 && chunks[3] == 8);
    CHECK(chunks[4] == 1 && chunks[5] == 1);
    CHECK(f->got == 3 && f->q.n_tokens == 203);
    CHECK(w.pool.n_free == 1000);
    CHECK_MSG(!w.bad, "%s", w.why);
    fake_free(f);
    world_free(&w);
}

TEST(decode_never_starved)
{
    world w;
    int wrc = world_init(&w, 1000, 16, 8, 64, 4096, 0.0f);
    REQUIRE(wrc == 0, "init");
    fake *d[4], *big;
    for (int i = 0; i < 4; i++) {
        d[i] = fake_new(i, SF_URGENCY_LOW, 5, 1000);
        sf_sched_add(&w.s, &d[i]->q);
    }
    step(&w); /* 4 prompts of 5 tokens: one step */
    big = fake_new(9, SF_URGENCY_HIGH, 1000, 1);
    sf_sched_add(&w.s, &big->q);
    for (int k = 0; k < 10; k++) {
        const sf_plan *p = step(&w);
        CHECK_MSG(p->n_decode == 4, "step %d: %d decodes", k, p->n_decode);
        CHECK(p->n_tokens <= 64);
        if (k < 5) CHECK_MSG(p->n_prefill == 60, "prefill %d", p->n_prefill);
    }
    CHECK_MSG(!w.bad, "%s", w.why);
    for (int i = 0; i < 4; i++) sf_sched_remove(&w.s, &d[i]->q), fake_free(d[i]);
    sf_sched_remove(&w.s, &big->q);
    fake_free(big);
    CHECK(w.pool.n_free == 1000);
    world_free(&w);
}

TEST(urgency_and_deadline_order)
{
    world w;
    int wrc = world_init(&w, 1000, 16, 2, 256, 4096, 0.0f);
    REQUIRE(wrc == 0, "init");
    fake *low[10];
    for (int i = 0; i < 10; i++) {
        low[i] = fake_new(i, SF_URGENCY_LOW, 10, 50);
        sf_sched_add(&w.s, &low[i]->q);
    }
    step(&w);
    CHECK(w.s.n_running == 2 && w.s.n_waiting[SF_URGENCY_LOW] == 8);
    /* two normal requests: the later one has the earlier deadline */
    fake *n1 = fake_new(20, SF_URGENCY_NORMAL, 10, 5), *n2 = fake_new(21, SF_URGENCY_NORMAL, 10, 5);
    n1->q.deadline = 100.0;
    n2->q.deadline = 50.0;
    sf_sched_add(&w.s, &n1->q);
    sf_sched_add(&w.s, &n2->q);
    fake *hi = fake_new(30, SF_URGENCY_HIGH, 10, 5);
    sf_sched_add(&w.s, &hi->q);
    CHECK(w.s.waiting.next == &hi->q && hi->q.next == &n2->q && n2->q.next == &n1->q);
    step(&w);
    /* seats were full: both low ones were preempted for the high and the earliest-deadline normal */
    CHECK_MSG(hi->q.state == SF_SEQ_RUNNING && n2->q.state == SF_SEQ_RUNNING, "hi %d n2 %d", hi->q.state, n2->q.state);
    CHECK(n1->q.state == SF_SEQ_WAITING);
    CHECK(w.s.preemptions == 2);
    /* everything finishes */
    for (int k = 0; k < 2000 && w.s.n_running + sf_sched_waiting_total(&w.s) > 0; k++) step(&w);
    for (int i = 0; i < 10; i++) {
        CHECK(low[i]->finished && low[i]->got == 50);
        fake_free(low[i]);
    }
    CHECK(n1->finished && n2->finished && hi->finished);
    CHECK(w.pool.n_free == 1000);
    CHECK_MSG(!w.bad, "%s", w.why);
    fake_free(n1), fake_free(n2), fake_free(hi);
    world_free(&w);
}

TEST(high_reserve_honored)
{
    world w;
    int wrc = world_init(&w, 100, 16, 16, 4096, 4096, 0.2f);
    REQUIRE(wrc == 0, "init");
    CHECK(w.s.reserve_units == 2 * 20);
    fake *low[8];
    for (int i = 0; i < 8; i++) {
        low[i] = fake_new(i, SF_URGENCY_NORMAL, 16 * 14, 500); /* 14 blocks each, 16 after 20 steps */
        sf_sched_add(&w.s, &low[i]->q);
    }
    for (int k = 0; k < 20; k++) step(&w);
    CHECK_MSG(w.s.held_low_units <= 2 * 80, "held_low_units %d", w.s.held_low_units);
    CHECK(w.pool.n_free >= 20);
    CHECK_MSG(w.s.n_running == 5 && w.s.preemptions == 0, "running %d", w.s.n_running);
    fake *hi = fake_new(99, SF_URGENCY_HIGH, 16 * 10, 2);
    uint64_t pre = w.s.preemptions;
    sf_sched_add(&w.s, &hi->q);
    step(&w);
    CHECK_MSG(hi->q.state == SF_SEQ_RUNNING, "high admitted from the reserve");
    CHECK_MSG(w.s.preemptions == pre, "no preemption needed");
    CHECK_MSG(!w.bad, "%s", w.why);
    for (int k = 0; k < 5000 && w.s.n_running + sf_sched_waiting_total(&w.s) > 0; k++) step(&w);
    for (int i = 0; i < 8; i++) {
        CHECK(low[i]->finished);
        fake_free(low[i]);
    }
    CHECK(hi->finished);
    CHECK(w.pool.n_free == 100);
    fake_free(hi);
    world_free(&w);
}

TEST(preempt_lowest_class_and_resume)
{
    world w;
    int wrc = world_init(&w, 10, 4, 8, 256, 4096, 0.0f);
    REQUIRE(wrc == 0, "init");
    fake *lo = fake_new(1, SF_URGENCY_LOW, 8, 12), *no = fake_new(2, SF_URGENCY_NORMAL, 8, 12);
    sf_sched_add(&w.s, &lo->q);
    sf_sched_add(&w.s, &no->q);
    for (int k = 0; k < 3; k++) step(&w); /* each holds 3 blocks: 8 prompt + 3 generated */
    CHECK(lo->q.n_blocks == 3 && no->q.n_blocks == 3 && w.pool.n_free == 4);
    fake *hi = fake_new(3, SF_URGENCY_HIGH, 20, 3); /* needs 5 blocks */
    sf_sched_add(&w.s, &hi->q);
    step(&w);
    CHECK_MSG(hi->q.state == SF_SEQ_RUNNING, "high admitted");
    CHECK_MSG(lo->q.state == SF_SEQ_WAITING && lo->q.n_preempted == 1, "low preempted");
    CHECK_MSG(no->q.state == SF_SEQ_RUNNING && no->q.n_preempted == 0, "normal kept");
    CHECK(lo->q.n_blocks == 0 && lo->q.n_computed == 0);
    int lo_tokens = lo->q.n_tokens;
    CHECK(lo_tokens == 8 + lo->got);
    for (int k = 0; k < 200 && w.s.n_running + sf_sched_waiting_total(&w.s) > 0; k++) step(&w);
    CHECK(lo->finished && lo->got == 12 && lo->q.n_tokens == 20);
    /* tokens survived preemption: prompt then 7, 8, 9, ... */
    int ok = 1;
    for (int i = 0; i < 12; i++) ok &= lo->q.tokens[8 + i] == 7 + i;
    CHECK(ok);
    CHECK(no->finished && hi->finished && w.pool.n_free == 10);
    CHECK_MSG(!w.bad, "%s", w.why);
    fake_free(lo), fake_free(no), fake_free(hi);
    world_free(&w);
}

TEST(too_long_for_pool_is_stuck)
{
    world w;
    int wrc = world_init(&w, 4, 4, 4, 64, 4096, 0.0f);
    REQUIRE(wrc == 0, "init");
    fake *big = fake_new(1, SF_URGENCY_NORMAL, 30, 1), *grow = fake_new(2, SF_URGENCY_NORMAL, 14, 10);
    sf_sched_add(&w.s, &big->q);
    sf_sched_add(&w.s, &grow->q);
    for (int k = 0; k < 20; k++) step(&w);
    CHECK(big->stuck && big->q.state == SF_SEQ_DONE);
    CHECK_MSG(grow->stuck && grow->got == 3, "grew to 17 tokens, stuck on the 5th block: got %d", grow->got);
    CHECK(w.pool.n_free == 4);
    CHECK_MSG(!w.bad, "%s", w.why);
    fake_free(big), fake_free(grow);
    world_free(&w);
}

TEST(bad_config_rejected)
{
    sf_kv_pool pool;
    sf_sched s;
    sf_error err = { 0 };
    sf_kv_pool_init(&pool, 10, 16, &err);
    sf_sched_config c = { .max_num_seqs = 64, .max_batched_tokens = 32, .max_model_len = 128 };
    CHECK(sf_sched_init(&s, &c, &pool, &err) == SF_EINVAL);
    CHECK(strstr(err.msg, "max_batched_tokens") != NULL);
    c.max_batched_tokens = 64;
    c.kv_high_reserve = 1.5f;
    CHECK(sf_sched_init(&s, &c, &pool, &err) == SF_EINVAL);
    sf_kv_pool_free(&pool);
}

/* Prompts scored beside decodes: at most max_logits (here the 4 seats) rows a step, the
 * decodes first; each prompt position scored once; the scored prompts get through. */
TEST(scored_prompts_fit_the_logit_rows)
{
    world w;
    int wrc = world_init(&w, 1000, 16, 4, 64, 4096, 0.0f);
    REQUIRE(wrc == 0, "init");
    fake *f[4];
    for (int i = 0; i < 4; i++) {
        f[i] = fake_new(i, SF_URGENCY_NORMAL, i < 2 ? 5 : 100, i < 2 ? 60 : 2);
        if (i >= 2) f[i]->q.score_to = 99;
        sf_sched_add(&w.s, &f[i]->q);
    }
    int steps = 0, max_rows = 0;
    while ((!f[2]->finished || !f[3]->finished) && steps++ < 500) {
        const sf_plan *p = step(&w);
        int rows = 0;
        for (int i = 0; i < p->n_items; i++) if (p->items[i].seq) rows += p->items[i].logits + p->items[i].n_score;
        max_rows = SF_MAX(max_rows, rows);
    }
    CHECK_MSG(f[2]->finished && f[3]->finished && f[2]->scored == 99 && f[3]->scored == 99,
              "after %d steps: finished %d %d, scored %d %d", steps, f[2]->finished, f[3]->finished, f[2]->scored,
              f[3]->scored);
    CHECK_MSG(max_rows == 4, "at most %d logit rows a step (4 allowed)", max_rows);
    CHECK_MSG(f[0]->got >= 40 && f[1]->got >= 40, "the decodes went on beside: %d %d tokens", f[0]->got, f[1]->got);
    CHECK_MSG(!w.bad, "%s", w.why);
    for (int i = 0; i < 4; i++) fake_free(f[i]);
    world_free(&w);
}

/* Three sequences of one group (the same 100-token prompt) and one of none behind them: the first
 * plan admits the first of the group and the one behind (the siblings let it pass), the siblings
 * come in once the first has computed the prompt, and find its 96 whole tokens cached. */
TEST(group_waits_for_its_prompt)
{
    world w;
    REQUIRE(cached_world_init(&w, 200, 256, 0.0f) == 0, "init");
    fake *f[4];
    for (int i = 0; i < 4; i++) {
        f[i] = fake_new(i < 3 ? 7 : 8, SF_URGENCY_NORMAL, 100, 4);
        f[i]->q.group = i < 3 ? 42 : 0;
        sf_sched_add(&w.s, &f[i]->q);
    }
    step(&w);
    CHECK_MSG(f[0]->q.state == SF_SEQ_RUNNING && f[3]->q.state == SF_SEQ_RUNNING && f[1]->q.state == SF_SEQ_WAITING &&
                  f[2]->q.state == SF_SEQ_WAITING, "first plan: the group's first and the other one run, states %d %d %d %d",
              f[0]->q.state, f[1]->q.state, f[2]->q.state, f[3]->q.state);
    int steps = 0;
    while ((f[1]->q.state == SF_SEQ_WAITING || f[2]->q.state == SF_SEQ_WAITING) && steps++ < 20) step(&w);
    CHECK_MSG(f[0]->q.n_computed >= 100, "the siblings came in after the prompt was computed (%d)", f[0]->q.n_computed);
    CHECK_MSG(f[1]->q.n_cached == 96 && f[2]->q.n_cached == 96, "they found it cached: %d, %d tokens", f[1]->q.n_cached,
              f[2]->q.n_cached);
    while (!f[0]->finished || !f[1]->finished || !f[2]->finished || !f[3]->finished) step(&w);
    CHECK_MSG(!w.bad, "%s", w.why);
    for (int i = 0; i < 4; i++) fake_free(f[i]);
    world_free(&w);
}

/* Eight sequences sharing a 640-token beginning found in the prefix cache: the pool holds it
 * once, and the KV demand the degrade policy watches counts it once, not eight times. */
TEST(prefix_shared_counts_once)
{
    world w;
    REQUIRE(cached_world_init(&w, 200, 2048, 0.1f) == 0, "init");
    fake *f[8];
    for (int i = 0; i < 8; i++) {
        f[i] = fake_new(100 + i, SF_URGENCY_NORMAL, 656, i ? 3 : 20); /* the first still runs when the rest do */
        for (int t = 0; t < 640; t++) f[i]->q.tokens[t] = 5000 + t;
        f[i]->q.max_len = 656 + f[i]->want;
    }
    sf_sched_add(&w.s, &f[0]->q);
    while (f[0]->q.n_computed < 656) step(&w);
    for (int i = 1; i < 8; i++) sf_sched_add(&w.s, &f[i]->q);
    step(&w);
    int found = 1;
    for (int i = 1; i < 8; i++) found &= f[i]->q.n_cached == 640 && f[i]->q.n_uncounted == 40;
    CHECK_MSG(found, "each later sequence found the 40 shared blocks held by the first");
    /* held: 40 shared + 1 block of each one's own 16 tokens (+ the first's decode block) */
    CHECK_MSG(w.pool.n_free >= 200 - 40 - 8 - 1, "%d of 200 blocks free", w.pool.n_free);
    step(&w); /* a plan with all eight running: the policy's figures are refreshed at its start */
    CHECK(w.s.n_running == 8);
    double d = sf_sched_kv_demand(&w.s);
    CHECK_MSG(d < 0.5, "KV demand %.2f (the shared blocks counted once: 0.28 + the high class's headroom; eight times: ~1.7)", d);
    CHECK_MSG(!w.bad, "%s", w.why);
    while (!f[0]->finished || !f[7]->finished) step(&w);
    for (int i = 0; i < 8; i++) fake_free(f[i]);
    world_free(&w);
}

/* A few thousand random steps: arrivals of every class, random prompt and output lengths,
 * cancellations, a pool small enough to force preemption, block tables with a rounded stride,
 * a fifth of the prompts scored. Invariants are checked every step;
 * at the end every request has finished (or was cancelled) and every block is back. With the
 * prefix cache (and swap space), prompts are one of a few shared beginnings, of two salts, then
 * their own tokens, and every step checks that each computed position holds its own
 * sequence's K/V (check_plan). */
static void random_workload_run(int cached, int swap)
{
    world w;
    table_quantum = 16; /* as the engine sets it: 512 / 8 + 1 blocks -> a stride of up to 80 */
    prefix_cache = cached;
    swap_blocks = swap;
    int wrc = world_init(&w, 96, 8, 12, 96, 512, 0.15f);
    table_quantum = prefix_cache = swap_blocks = 0;
    REQUIRE(wrc == 0, "init");
    sf_rng rng;
    sf_rng_seed(&rng, 42);
    enum { MAXF = 4000 };
    fake **all = calloc(MAXF, sizeof *all);
    int n_all = 0, cancelled = 0;
    int steps = 0;
    for (; steps < 40000; steps++) {
        if (steps < 3000 && n_all < MAXF && sf_rng_uniform(&rng) < 0.25f) {
            int urg = (int)(sf_rng_next(&rng) % 3);
            int np = 1 + (int)(sf_rng_next(&rng) % 200);
            int want = 1 + (int)(sf_rng_next(&rng) % 40);
            fake *f = fake_new(n_all, urg, np, want);
            if (cached) { /* one of 4 beginnings of up to 120 tokens, the rest its own */
                int len = (int)(sf_rng_next(&rng) % 121), shared = SF_MIN(np, len), which = (int)(sf_rng_next(&rng) % 4);
                for (int i = 0; i < shared; i++) f->q.tokens[i] = 2000 + which * 200 + i;
                f->q.cache_salt = sf_rng_next(&rng) % 2;
            }
            fake *prev = n_all ? all[n_all - 1] : NULL;
            if (cached && prev && prev->q.n_prompt <= np && prev->q.state == SF_SEQ_WAITING && sf_rng_uniform(&rng) < 0.3f) {
                /* another choice of the request before: its prompt, its group */
                memcpy(f->q.tokens, prev->q.tokens, (size_t)prev->q.n_prompt * sizeof *f->q.tokens);
                f->q.n_tokens = f->q.n_prompt = np = prev->q.n_prompt;
                f->q.max_len = prev->q.n_prompt;
                f->q.cache_salt = prev->q.cache_salt;
                f->q.urgency = prev->q.urgency;
                if (!prev->q.group) prev->q.group = 1000 + (uint64_t)prev->id;
                f->q.group = prev->q.group;
            }
            if (sf_rng_uniform(&rng) < 0.3f) f->q.deadline = (double)steps + sf_rng_uniform(&rng) * 50.0;
            if (sf_rng_uniform(&rng) < 0.2f) f->q.score_to = np - 1; /* its prompt scored */
            sf_sched_add(&w.s, &f->q);
            all[n_all++] = f;
        }
        if (n_all && sf_rng_uniform(&rng) < 0.05f) {
            fake *f = all[sf_rng_next(&rng) % (uint64_t)n_all];
            if (!f->finished && !f->stuck && f->q.state != SF_SEQ_DONE) {
                sf_sched_remove(&w.s, &f->q);
                f->finished = 1;
                cancelled++;
            }
        }
        step(&w);
        if (w.bad) break;
        if (steps >= 3000 && w.s.n_running + sf_sched_waiting_total(&w.s) == 0) break;
    }
    CHECK_MSG(!w.bad, "%d violations, first: %s", w.bad, w.why);
    CHECK_MSG(w.s.n_running + sf_sched_waiting_total(&w.s) == 0, "work left after %d steps", steps);
    int done = 0, stuck = 0, scored_ok = 1;
    for (int i = 0; i < n_all; i++) {
        done += all[i]->finished;
        stuck += all[i]->stuck;
        /* a prompt that was computed whole (it drew a token) was scored once, whatever preempted it */
        if (all[i]->got && all[i]->scored != all[i]->q.score_to) scored_ok = 0;
    }
    CHECK_MSG(scored_ok, "a scored prompt's positions were scored more or less than once");
    CHECK_MSG(done + stuck == n_all, "%d of %d finished", done + stuck, n_all);
    CHECK_MSG(w.pool.n_free == w.pool.n_blocks, "leak: %d of %d blocks free", w.pool.n_free, w.pool.n_blocks);
    CHECK_MSG(w.s.preemptions > 0, "workload should force preemption");
    if (cached) {
        CHECK_MSG(w.s.prefix_hits > w.s.prefix_queries / 20, "the shared beginnings were found: %llu of %llu tokens",
                  (unsigned long long)w.s.prefix_hits, (unsigned long long)w.s.prefix_queries);
        CHECK_MSG(w.pool.pc_evictions > 0, "a pool this small evicts cached blocks");
    }
    if (swap) CHECK_MSG(w.s.swaps_out > 0 && w.s.swaps_in > 0, "swaps %llu out, %llu in", (unsigned long long)w.s.swaps_out,
                        (unsigned long long)w.s.swaps_in);
    printf("  random workload%s%s: %d requests, %d cancelled, %d steps, %llu preemptions (%llu by swap), %llu prefill + "
           "%llu decode tokens; prefix cache %llu of %llu prompt tokens, %llu evictions\n",
           cached ? ", prefix cache" : "", swap ? ", swap" : "", n_all, cancelled, steps,
           (unsigned long long)w.s.preemptions, (unsigned long long)w.s.swaps_out, (unsigned long long)w.s.tokens_prefill,
           (unsigned long long)w.s.tokens_decode, (unsigned long long)w.s.prefix_hits,
           (unsigned long long)w.s.prefix_queries, (unsigned long long)w.pool.pc_evictions);
    for (int i = 0; i < n_all; i++) fake_free(all[i]);
    free(all);
    world_free(&w);
}

TEST(random_workload) { random_workload_run(0, 0); }
TEST(random_workload_prefix_cache) { random_workload_run(1, 0); }
TEST(random_workload_prefix_cache_swap) { random_workload_run(1, 24); }

int main(void)
{
    RUN(token_budget_and_chunked_prefill);
    RUN(decode_never_starved);
    RUN(urgency_and_deadline_order);
    RUN(high_reserve_honored);
    RUN(preempt_lowest_class_and_resume);
    RUN(too_long_for_pool_is_stuck);
    RUN(bad_config_rejected);
    RUN(scored_prompts_fit_the_logit_rows);
    RUN(prefix_shared_counts_once);
    RUN(group_waits_for_its_prompt);
    RUN(random_workload);
    RUN(random_workload_prefix_cache);
    RUN(random_workload_prefix_cache_swap);
    return test_summary();
}
