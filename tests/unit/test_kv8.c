/* test_kv8.c — the INT8 KV cache on the CPU backend:
 *  - RoPE + KV write and paged attention with INT8 and full-precision sequences in the same
 *    batches, against a float64 reference (tests/lib/kv8_case.h: the write within the
 *    quantisation bound, the read exact up to fp32 rounding);
 *  - the scheduler with INT8 sequences: half a block each, so the same pool runs twice the
 *    context, and every unit comes back; an INT8 sequence preempted by swap and back;
 *  - end to end on stories260K: greedy text with INT8 KV against the full-precision text
 *    and the quality figures of engine/kv_quality.h. */
#include "engine/engine.h"
#include "engine/kv_quality.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "engine/scheduler.h"
#include "hal/hal.h"
#include "tests/lib/kv8_case.h"
#include "tests/test.h"

static sf_rng R;
static float normal(void) { return sf_rng_normal(&R); }

TEST(int8_rope_kv_attention_vs_reference)
{
    static const kv8_case cases[] = {
        /* GQA 2, interleaved RoPE, three sequences (INT8, full, INT8), prefill then decode */
        { 3, 4, 2, 16, 4, 1, 3, { { 7, 1, 1 }, { 3, 2, 1 }, { 5, 1, 1 } }, { 1, 0, 1 } },
        /* GQA 8, head size 64, block size 16, contexts crossing blocks, chunked prefill */
        { 2, 8, 1, 64, 16, 0, 3, { { 40, 1, 1 }, { 17, 15, 1 } }, { 1, 1 } },
        /* head size 10 (the scalar path), block size 1, MHA */
        { 1, 2, 2, 10, 1, 0, 3, { { 5, 1, 1 } }, { 1 } },
        /* a realistic head: 128 dims, GQA 4, INT8 beside full precision */
        { 2, 8, 2, 128, 16, 0, 3, { { 33, 1, 1 }, { 20, 1, 1 } }, { 0, 1 } },
    };
    sf_backend *B = NULL;
    sf_error err = { 0 };
    sf_backend_opts o = { .name = "cpu", .n_threads = 2 };
    REQUIRE(sf_backend_open(&o, &B, &err) == SF_OK, "%s", err.msg);
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        const kv8_case *c = &cases[i];
        kv8_result r;
        int ok = kv8_run(B, c, normal, 0.0, 1e-4, &r);
        CHECK_MSG(ok, "case %zu (H=%d Hkv=%d hd=%d bs=%d): %s", i, c->H, c->Hkv, c->hd, c->bs, r.why);
        printf("  H=%d Hkv=%d hd=%-3d bs=%-2d: %d tokens, write %.2f of the bound, rope %.1e, attention %.1e; "
               "INT8 vs exact KV %.1e\n", c->H, c->Hkv, c->hd, c->bs, r.tokens_checked, r.worst_write, r.worst_q,
               r.worst_out, r.quant_effect);
    }
    sf_backend_close(B);
}

/* A pool of 8 blocks of 4 tokens: a full-precision sequence of 32 tokens fills it; two INT8
 * sequences of 32 tokens fit at once; mixed, the units add up; all come back. */
TEST(scheduler_int8_half_blocks)
{
    sf_kv_pool pool;
    sf_sched s;
    sf_error err = { 0 };
    REQUIRE(sf_kv_pool_init(&pool, 8, 4, &err) == SF_OK, "%s", err.msg);
    sf_kv_pool_enable_i8(&pool);
    sf_sched_config sc = { .max_num_seqs = 4, .max_batched_tokens = 64, .max_model_len = 64, .kv_high_reserve = 0 };
    REQUIRE(sf_sched_init(&s, &sc, &pool, &err) == SF_OK, "%s", err.msg);
    int32_t prompt[32];
    for (int i = 0; i < 32; i++) prompt[i] = i;
    sf_seq q[3];
    for (int i = 0; i < 3; i++) {
        REQUIRE(sf_seq_init(&q[i], prompt, 32, &err) == SF_OK, "%s", err.msg);
        q[i].max_len = 64;
        q[i].urgency = SF_URGENCY_NORMAL;
        q[i].kv_i8 = i < 2;
    }
    sf_sched_add(&s, &q[0]);
    sf_sched_add(&s, &q[1]);
    const sf_plan *p = sf_sched_plan(&s);
    CHECK_MSG(p->n_items == 2 && p->n_tokens == 64, "both INT8 sequences admitted (%d items, %d tokens)", p->n_items,
              p->n_tokens);
    CHECK(q[0].n_blocks == 8 && q[1].n_blocks == 8 && q[0].kv_i8_held && sf_kv_is_i8(&pool, q[0].blocks[0]));
    CHECK_MSG(pool.n_free_units == 0 && s.held_low_units == 16, "free units %d, held %d", pool.n_free_units,
              s.held_low_units);
    sf_batch b;
    sf_sched_batch(&s, &b);
    int slots_ok = 1;
    for (int t = 0; t < b.n_tokens; t++) slots_ok &= b.slot[t] / 4 >= pool.n_blocks; /* INT8 ids */
    CHECK_MSG(slots_ok, "every slot of the batch is in an INT8 block");
    sf_sched_commit(&s);
    sf_sched_remove(&s, &q[1]);
    CHECK(pool.n_free_units == 8 && pool.n_free == 4);
    /* a full-precision sequence of 32 tokens needs all 8 pairs: it waits until q0 leaves */
    sf_sched_add(&s, &q[2]);
    p = sf_sched_plan(&s);
    CHECK_MSG(q[2].n_blocks == 0, "the full-precision sequence does not fit beside the INT8 one");
    sf_sched_commit(&s);
    sf_sched_remove(&s, &q[0]);
    p = sf_sched_plan(&s);
    CHECK(q[2].n_blocks == 8 && !q[2].kv_i8_held && !sf_kv_is_i8(&pool, q[2].blocks[0]) && pool.n_free == 0);
    sf_sched_commit(&s);
    sf_sched_remove(&s, &q[2]);
    CHECK_MSG(pool.n_free == 8 && pool.n_free_units == 16 && s.held_low_units == 0, "leak: %d pairs, %d units free",
              pool.n_free, pool.n_free_units);
    /* a pool without INT8 blocks gives full ones to a sequence that asks for INT8 */
    pool.i8_ok = 0;
    sf_seq r;
    REQUIRE(sf_seq_init(&r, prompt, 8, &err) == SF_OK, "%s", err.msg);
    r.max_len = 16;
    r.kv_i8 = 1;
    sf_sched_add(&s, &r);
    sf_sched_plan(&s);
    CHECK(r.n_blocks == 2 && !r.kv_i8_held && !sf_kv_is_i8(&pool, r.blocks[0]));
    sf_sched_commit(&s);
    sf_sched_remove(&s, &r);
    sf_seq_free(&r);
    for (int i = 0; i < 3; i++) sf_seq_free(&q[i]);
    sf_sched_free(&s);
    sf_kv_pool_free(&pool);
}

/* An INT8 sequence preempted by swap: its INT8 blocks go out (their bytes, through the CPU
 * backend's copies), a full-precision high-urgency sequence takes the memory, and it comes
 * back into INT8 blocks with the same bytes; nothing leaks. */
TEST(int8_sequence_swaps_out_and_in)
{
    sf_kv_pool pool;
    sf_sched s;
    sf_backend *B = NULL;
    sf_error err = { 0 };
    sf_backend_opts bo = { .name = "cpu", .n_threads = 1 };
    REQUIRE(sf_backend_open(&bo, &B, &err) == SF_OK, "%s", err.msg);
    sf_kv_config kc = { .n_layers = 2, .n_blocks = 8, .block_size = 4, .n_kv_heads = 2, .head_dim = 8,
                        .dtype = SF_DT_F32, .int8 = 1 };
    REQUIRE(B->ops->kv_init(B, &kc, &err) == SF_OK, "%s", err.msg);
    size_t bb = B->ops->kv_block_bytes(B, &kc);
    REQUIRE(sf_kv_pool_init(&pool, 8, 4, &err) == SF_OK, "pool");
    sf_kv_pool_enable_i8(&pool);
    sf_sched_config c = { .max_num_seqs = 4, .max_batched_tokens = 32, .max_model_len = 32, .kv_high_reserve = 0,
                          .swap_blocks = 16 };
    REQUIRE(sf_sched_init(&s, &c, &pool, &err) == SF_OK, "sched: %s", err.msg);
    int32_t p[24];
    for (int i = 0; i < 24; i++) p[i] = i + 1;
    sf_seq lo, hi;
    sf_seq_init(&lo, p, 20, NULL);
    sf_seq_init(&hi, p, 24, NULL);
    lo.urgency = SF_URGENCY_LOW;
    lo.kv_i8 = 1;
    hi.urgency = SF_URGENCY_HIGH;
    sf_sched_add(&s, &lo);
    const sf_plan *pl = sf_sched_plan(&s);
    CHECK(pl->n_tokens == 20 && lo.n_blocks == 5 && lo.kv_i8_held && pool.n_free_units == 11);
    sf_sched_commit(&s);
    /* the K/V the step would have written: a pattern in lo's INT8 blocks */
    unsigned char *pat = malloc(5 * bb), *host = calloc(16, bb), *back = malloc(5 * bb);
    for (size_t i = 0; i < 5 * bb; i++) pat[i] = (unsigned char)(i * 31 + 7);
    CHECK(B->ops->kv_copy_in(B, lo.blocks, 5, pat) == SF_OK);
    sf_seq_append(&lo, 99);
    sf_sched_add(&s, &hi); /* 6 full blocks = 12 units, 11 free: lo is preempted by swap */
    pl = sf_sched_plan(&s);
    REQUIRE(pl->n_swap_out == 1 && lo.n_swap == 5, "%d swap-outs, %d blocks swapped", pl->n_swap_out, lo.n_swap);
    const sf_swap_op *o = &pl->swap_out[0];
    int kinds_ok = 1;
    for (int i = 0; i < o->n; i++) kinds_ok &= sf_kv_is_i8(&pool, o->blocks[i]);
    CHECK_MSG(kinds_ok, "the swapped-out blocks are INT8 blocks");
    for (int i = 0; i < o->n; i++) CHECK(B->ops->kv_copy_out(B, &o->blocks[i], 1, host + (size_t)o->slots[i] * bb) == SF_OK);
    CHECK(hi.n_blocks == 6 && !hi.kv_i8_held);
    sf_sched_commit(&s);
    sf_sched_remove(&s, &hi);
    pl = sf_sched_plan(&s);
    REQUIRE(pl->n_swap_in == 1 && pl->swap_in[0].n == 5, "%d swap-ins", pl->n_swap_in);
    o = &pl->swap_in[0];
    kinds_ok = lo.kv_i8_held;
    for (int i = 0; i < o->n; i++) kinds_ok &= sf_kv_is_i8(&pool, o->blocks[i]);
    CHECK_MSG(kinds_ok, "it comes back into INT8 blocks");
    for (int i = 0; i < o->n; i++) CHECK(B->ops->kv_copy_in(B, &o->blocks[i], 1, host + (size_t)o->slots[i] * bb) == SF_OK);
    CHECK(B->ops->kv_copy_out(B, lo.blocks, 5, back) == SF_OK);
    size_t used = 2 * (2 * 64 + 2 * 8 * sizeof(float)); /* an INT8 block's bytes in its host image */
    int same = 1;
    for (int i = 0; i < 5; i++) same &= !memcmp(pat + (size_t)i * bb, back + (size_t)i * bb, used);
    CHECK_MSG(same, "the INT8 rows and scales came back unchanged");
    sf_sched_commit(&s);
    sf_sched_remove(&s, &lo);
    sf_sched_plan(&s);
    sf_sched_discard(&s);
    CHECK_MSG(pool.n_free_units == 16 && s.swap.n_free == s.swap.n_blocks && s.held_low_units == 0,
              "leak: %d/16 units, %d/%d slots", pool.n_free_units, s.swap.n_free, s.swap.n_blocks);
    free(pat); free(host); free(back);
    sf_seq_free(&lo);
    sf_seq_free(&hi);
    sf_sched_free(&s);
    sf_kv_pool_free(&pool);
    sf_backend_close(B);
}

/* stories260K, CPU: greedy from BOS for 256 steps with INT8 KV against the f32-KV text (which
 * test_forward checks against llama2.c's published output), and the logit figures on a few
 * prompts. Bounds are a margin under what was measured (docs/CUDA.md, "8-bit KV"). */
TEST(stories260k_int8_end_to_end)
{
    sf_error err = { 0 };
    sf_model *m = NULL;
    sf_backend *b = NULL;
    sf_load_opts lo = { 0 };
    REQUIRE(sf_model_load(test_data("stories260K/stories260K.gguf"), &lo, &m, &err) == SF_OK, "loading: %s", err.msg);
    sf_backend_opts o = { .name = "cpu", .n_threads = 2 };
    REQUIRE(sf_backend_open(&o, &b, &err) == SF_OK, "%s", err.msg);
    int32_t bos = m->cfg.bos_id;
    const int32_t *p1[1] = { &bos };
    int l1[1] = { 1 };
    sf_kvq_opts qo = { .n_gen = 256, .chunk = 64 };
    sf_kvq_stats st;
    CHECK_MSG(sf_kvq_run(b, m, p1, l1, 1, &qo, &st, &err) == SF_OK, "%s", err.msg);
    printf("  greedy 256 steps from BOS: %ld of %ld tokens identical, identical prefix %d; top-1 (teacher-forced) %.1f%%, "
           "rel L2 %.3g, max |dlogit| %.3g\n", st.greedy_same, st.greedy_total, st.prefix_min, 100 * st.top1, st.rel_l2,
           st.max_abs);
    CHECK_MSG(st.top1 >= 0.95 && st.rel_l2 < 0.05, "top-1 %.3f, rel L2 %.3g", st.top1, st.rel_l2);
    CHECK_MSG(st.prefix_min >= 64, "INT8 greedy text departs after %d tokens", st.prefix_min);
    /* prompts through the tokenizer: short stories' openings */
    static const char *const texts[] = { "Once upon a time, there was a little girl named Lily.",
                                         "Tom and his dog went to the park", "The sun was hot and the sky" };
    int32_t *ids[3] = { 0 };
    int lens[3];
    for (int i = 0; i < 3; i++) {
        size_t n = 0;
        REQUIRE(sf_tok_encode(m->tok, texts[i], strlen(texts[i]), 1, &ids[i], &n, &err) == SF_OK, "%s", err.msg);
        lens[i] = (int)n;
    }
    qo.n_gen = 48;
    CHECK_MSG(sf_kvq_run(b, m, (const int32_t *const *)ids, lens, 3, &qo, &st, &err) == SF_OK, "%s", err.msg);
    printf("  3 prompts x 48 positions: top-1 %.1f%%, rel L2 %.3g, mean |dlogit| %.3g, greedy %ld/%ld identical\n",
           100 * st.top1, st.rel_l2, st.mean_abs, st.greedy_same, st.greedy_total);
    CHECK_MSG(st.top1 >= 0.95 && st.rel_l2 < 0.05, "top-1 %.3f, rel L2 %.3g", st.top1, st.rel_l2);
    for (int i = 0; i < 3; i++) free(ids[i]);
    sf_backend_close(b);
    sf_model_free(m);
}

int main(void)
{
    sf_rng_seed(&R, 20261130);
    RUN(int8_rope_kv_attention_vs_reference);
    RUN(scheduler_int8_half_blocks);
    RUN(int8_sequence_swaps_out_and_in);
    RUN(stories260k_int8_end_to_end);
    return test_summary();
}
