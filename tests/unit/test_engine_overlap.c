/* test_engine_overlap.c — the overlapped step loop (deliver a step's tokens while the next one
 * runs) against the serial one on the CPU backend with stories260K: 40 requests with seeded
 * sampling (temperature, top-k, top-p, min-p, penalties, logprobs), stop strings, EOS and
 * max_tokens, more of them than seats, submitted at once, must get exactly the same tokens,
 * text and finish reasons in both loops — with a roomy KV pool and with one so small that
 * sequences are preempted; the serial run warms up first (one decode step per batch size, as
 * on CUDA), which must change nothing. And the loop's clocks add up: the phases of a decode turn fit in
 * its wall time. */
#include <pthread.h>

#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "tests/lib/engine_collect.h"
#include "tests/lib/engine_wait.h"
#include "tests/test.h"

#define N_REQ 40

/* Request i's sampling: a mix of every sampler option, each request with its own seed. */
static sf_sampling sampling_of(int i)
{
    static char s_dot[] = ".", s_the[] = " the", s_lily[] = "Lily", s_zz[] = "zzq";
    sf_sampling sp;
    sf_sampling_default(&sp);
    sp.seed = 1000 + (uint64_t)i;
    sp.has_seed = 1;
    sp.max_tokens = 6 + (i * 11) % 60;
    sp.temperature = i % 5 == 0 ? 0.0f : 0.6f + 0.1f * (float)(i % 4);
    if (i % 3 == 1) sp.top_k = 5 + i % 20;
    if (i % 4 == 2) sp.top_p = 0.9f;
    if (i % 7 == 3) sp.min_p = 0.05f;
    if (i % 6 == 4) sp.presence_penalty = 0.5f, sp.frequency_penalty = 0.3f;
    if (i % 8 == 5) sp.repetition_penalty = 1.2f;
    if (i % 9 == 6) sp.logprobs = 2; /* its steps are sampled on the host */
    if (i % 2 == 0) sp.ignore_eos = 1;
    if (i % 4 == 1) sp.stop[sp.n_stop++] = s_dot;
    if (i % 5 == 2) sp.stop[sp.n_stop++] = s_the;
    if (i % 6 == 3) sp.stop[sp.n_stop++] = s_lily, sp.stop[sp.n_stop++] = s_zz;
    return sp;
}

/* Runs the N_REQ requests through one engine; serial: the serial loop. */
static int run_all(int serial, int kv_blocks, collect *res, sf_engine_stats *st, sf_error *err)
{
    static const char *words[] = { "Tom", "The sun", "A little bird", "Once", "Lily and Ben went", "The big dog", "One day" };
    sf_engine_config c;
    sf_engine_config_default(&c);
    c.model = test_data("stories260K/stories260K.gguf");
    c.backend = "cpu";
    c.n_threads = 1;
    c.max_num_seqs = 12;
    c.max_batched_tokens = 64;
    c.num_kv_blocks = kv_blocks;
    c.serial_steps = serial;
    sf_engine *e = NULL;
    int rc = sf_engine_new(&c, &e, err);
    if (rc) return rc;
    for (int i = 0; i < N_REQ && !rc; i++) {
        char text[128];
        int32_t *ids = NULL;
        size_t n = 0;
        snprintf(text, sizeof text, "%s %s", words[i % 7], i % 3 ? "saw" : "was happy. One day");
        if ((rc = sf_tok_encode(sf_engine_tokenizer(e), text, strlen(text), 1, &ids, &n, err))) break;
        collect_init(&res[i]);
        sf_submit s;
        memset(&s, 0, sizeof s);
        s.prompt = ids;
        s.n_prompt = (int)n;
        s.sampling = sampling_of(i);
        s.intent.urgency = SF_URGENCY_NORMAL;
        s.cb = on_event;
        s.user = &res[i];
        rc = sf_engine_submit(e, &s, NULL, NULL, err);
        free(ids);
    }
    for (int i = 0; i < N_REQ && !rc; i++) collect_wait(&res[i]);
    if (!rc) wait_idle(e, st);
    sf_engine_free(e);
    return rc;
}

static void overlap_equals_serial(int kv_blocks)
{
    static collect ser[N_REQ], ovl[N_REQ];
    sf_engine_stats st_s, st_o;
    sf_error err = { 0 };
    setenv("SEMFLOW_ENGINE_WARMUP", "1", 1); /* the serial run warms up first: it must change nothing */
    int rc = run_all(1, kv_blocks, ser, &st_s, &err);
    unsetenv("SEMFLOW_ENGINE_WARMUP");
    REQUIRE(rc == SF_OK, "serial run: %s", err.msg);
    REQUIRE(run_all(0, kv_blocks, ovl, &st_o, &err) == SF_OK, "overlapped run: %s", err.msg);
    CHECK(!st_s.overlapped && st_o.overlapped);
    int same = 0, stops = 0, eos = 0, lengths = 0;
    for (int i = 0; i < N_REQ; i++) {
        const collect *a = &ser[i], *b = &ovl[i];
        int eq = a->n_tokens == b->n_tokens && !memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t)) &&
                 !strcmp(a->text, b->text) && a->finish == b->finish && a->completion_tokens == b->completion_tokens;
        if (!eq)
            printf("      request %d: serial %d tokens (finish %d) \"%s\", overlapped %d tokens (finish %d) \"%s\"\n", i,
                   a->n_tokens, a->finish, a->text, b->n_tokens, b->finish, b->text);
        same += eq;
        stops += a->finish == SF_FINISH_STOP && a->completion_tokens > a->n_tokens; /* EOS or a stop id */
        eos += a->finish == SF_FINISH_STOP;
        lengths += a->finish == SF_FINISH_LENGTH;
    }
    CHECK_MSG(same == N_REQ, "%d of %d requests got the same tokens in both loops", same, N_REQ);
    /* the mix exercised what it is meant to: stops (strings or EOS) and lengths */
    printf("      mix: %d stopped (%d of them by EOS), %d at max_tokens; preemptions %llu / %llu\n", eos, stops, lengths, (unsigned long long)st_s.preemptions, (unsigned long long)st_o.preemptions);
    CHECK_MSG(eos > 0 && lengths > 0, "%d stopped, %d at max_tokens (%d by EOS)", eos, lengths, stops);
    CHECK_MSG(!kv_blocks || (st_s.preemptions > 0 && st_o.preemptions > 0), "no preemption with %d KV blocks: %llu / %llu",
              kv_blocks, (unsigned long long)st_s.preemptions, (unsigned long long)st_o.preemptions);
    CHECK_MSG(st_s.kv_blocks_used == 0 && st_o.kv_blocks_used == 0, "KV blocks left: %d / %d", st_s.kv_blocks_used,
              st_o.kv_blocks_used);
    /* the clocks: a decode turn's phases fit in its wall time, and the device's idle gap is
     * part of the host's work (CPU: the device is the host) */
    for (int m = 0; m < 2; m++) {
        const sf_engine_stats *s = m ? &st_o : &st_s;
        double phases = s->decode_wait_s + s->decode_take_s + s->decode_plan_s + s->decode_batch_s + s->decode_launch_s +
                        s->decode_deliver_s;
        CHECK_MSG(s->decode_steps > 0 && phases <= s->decode_step_s * 1.0001 && phases >= 0.5 * s->decode_step_s,
                  "%s: %llu decode turns of %.4f s, phases sum to %.4f s", m ? "overlapped" : "serial",
                  (unsigned long long)s->decode_steps, s->decode_step_s, phases);
        CHECK_MSG(s->decode_exposed_s <= s->decode_step_s * 1.0001 && s->decode_step_p50_ms > 0 &&
                  s->decode_step_p90_ms >= s->decode_step_p50_ms, "%s: idle gap %.4f s of %.4f, p50 %.3f p90 %.3f ms",
                  m ? "overlapped" : "serial", s->decode_exposed_s, s->decode_step_s, s->decode_step_p50_ms,
                  s->decode_step_p90_ms);
    }
}

TEST(overlap_equals_serial) { overlap_equals_serial(0); }
TEST(overlap_equals_serial_preempted) { overlap_equals_serial(12); }

int main(void)
{
    RUN(overlap_equals_serial);
    RUN(overlap_equals_serial_preempted);
    return test_summary();
}
