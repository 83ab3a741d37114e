/* test_engine_overlap.c — the overlapped step loop (deliver a step's tokens while the next one
 * runs) and async scheduling (queue the next step before the ids of the one in flight are
 * taken) against the serial loop on the CPU backend with stories260K: 40 requests with seeded
 * sampling (temperature, top-k, top-p, min-p, penalties, logprobs), stop strings, EOS and
 * max_tokens, more of them than seats, submitted at once, must get exactly the same tokens,
 * text and finish reasons in every loop — with a roomy KV pool and with one so small that
 * sequences are preempted; the serial run warms up first (one decode step per batch size, as
 * on CUDA), which must change nothing. Some requests are held to a form (JSON mode, a pattern):
 * async scheduling queues their steps' forward passes ahead and makes their masks once the ids
 * before them are in. Requests that cancel themselves mid-run (a client that
 * disconnects) end cancelled in every loop with a prefix of the same tokens. And the loop's
 * clocks add up: the phases of a decode turn fit in its wall time. */
#include <pthread.h>

#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "tests/lib/engine_collect.h"
#include "tests/lib/engine_wait.h"
#include "tests/test.h"

#define N_REQ 40

enum { SERIAL = 0, OVERLAP = 1, ASYNC = 2 };
static const char *mode_name[] = { "serial", "overlapped", "async" };

/* Request i cancels itself (from its event callback) after this many tokens; 0: never. */
static int cancel_after(int i) { return i % 10 == 7 ? 3 + i % 4 : 0; }

/* Request i's sampling: a mix of every sampler option, each request with its own seed. plain:
 * no logprobs (every step is drawn on the backend, so async scheduling runs throughout). */
static sf_sampling sampling_of(int i, int plain)
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
    if (i % 9 == 6 && !plain) sp.logprobs = 2; /* its steps are sampled on the host */
    if (i % 2 == 0) sp.ignore_eos = 1;
    if (i % 8 == 7) sp.json = 1, sp.ignore_eos = 0; /* a form: JSON mode (7 also cancels itself) */
    if (i % 12 == 10) { /* a form: a pattern */
        static const char pat[] = "[A-Z][a-z]+( [a-z]+){1,6}\\.";
        sp.json = sp.regex = 1, sp.ignore_eos = 0;
        sp.schema = pat, sp.schema_len = sizeof pat - 1;
    }
    if (i % 4 == 1) sp.stop[sp.n_stop++] = s_dot;
    if (i % 5 == 2) sp.stop[sp.n_stop++] = s_the;
    if (i % 6 == 3) sp.stop[sp.n_stop++] = s_lily, sp.stop[sp.n_stop++] = s_zz;
    return sp;
}

/* the id of "." after a word, set by run_all (-1: none); requests i with i % 5 == 3 stop on it */
static int32_t stop_id = -1;
static int is_stop_id_req(int i) { return i % 5 == 3 && stop_id >= 0; }

/* Runs the N_REQ requests through one engine in one of the loops. */
static int run_all(int mode, int kv_blocks, int plain, collect *res, sf_engine_stats *st, sf_error *err)
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
    c.serial_steps = mode == SERIAL;
    c.async_steps = mode == ASYNC;
    c.mask_threads = mode == SERIAL ? 1 : 3; /* the forms' masks on the engine thread, or shared out */
    sf_engine *e = NULL;
    int rc = sf_engine_new(&c, &e, err);
    if (rc) return rc;
    int32_t *dot = NULL;
    stop_id = -1;
    size_t n_dot = 0;
    /* the id of "." after a word (alone it would take a word-start marker) */
    if (sf_tok_encode(sf_engine_tokenizer(e), "a.", 2, 0, &dot, &n_dot, err) == SF_OK && n_dot > 1) stop_id = dot[n_dot - 1];
    free(dot);
    for (int i = 0; i < N_REQ && !rc; i++) {
        char text[128];
        int32_t *ids = NULL;
        size_t n = 0;
        snprintf(text, sizeof text, "%s %s", words[i % 7], i % 3 ? "saw" : "was happy. One day");
        if ((rc = sf_tok_encode(sf_engine_tokenizer(e), text, strlen(text), 1, &ids, &n, err))) break;
        collect_init(&res[i]);
        res[i].cancel_engine = cancel_after(i) ? e : NULL;
        res[i].cancel_after = cancel_after(i);
        sf_submit s;
        memset(&s, 0, sizeof s);
        s.prompt = ids;
        s.n_prompt = (int)n;
        s.sampling = sampling_of(i, plain);
        if (is_stop_id_req(i)) { /* a stop id: the token itself ends the request at its take (shown) */
            s.sampling.stop_ids[0] = stop_id;
            s.sampling.n_stop_ids = 1;
        }
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

/* Both runs gave request i the same tokens, text and finish; one that cancelled itself ended
 * cancelled in both, the tokens of one a prefix of the other's (a cancel takes effect at the
 * engine's next turn, which may come a step later in one loop than in the other). */
static int same_result(int i, const collect *a, const collect *b)
{
    if (cancel_after(i) && a->finish == SF_FINISH_CANCELLED && b->finish == SF_FINISH_CANCELLED) {
        int n = SF_MIN(a->n_tokens, b->n_tokens);
        return n >= cancel_after(i) && !memcmp(a->tokens, b->tokens, (size_t)n * sizeof(int32_t));
    }
    return a->n_tokens == b->n_tokens && !memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t)) &&
           !strcmp(a->text, b->text) && a->finish == b->finish && a->completion_tokens == b->completion_tokens;
}

/* The serial loop against `mode` over the mix, with kv_blocks KV blocks (0: roomy). */
static void loop_equals_serial(int mode, int kv_blocks, int plain)
{
    static collect ser[N_REQ], oth[N_REQ];
    sf_engine_stats st_s, st_o;
    sf_error err = { 0 };
    setenv("SEMFLOW_ENGINE_WARMUP", "1", 1); /* the serial run warms up first: it must change nothing */
    int rc = run_all(SERIAL, kv_blocks, plain, ser, &st_s, &err);
    unsetenv("SEMFLOW_ENGINE_WARMUP");
    REQUIRE(rc == SF_OK, "serial run: %s", err.msg);
    REQUIRE(run_all(mode, kv_blocks, plain, oth, &st_o, &err) == SF_OK, "%s run: %s", mode_name[mode], err.msg);
    CHECK(!st_s.overlapped && st_o.overlapped && !st_s.async && st_o.async == (mode == ASYNC));
    int same = 0, stops = 0, eos = 0, lengths = 0, cancels = 0, forms = 0;
    for (int i = 0; i < N_REQ; i++) {
        const collect *a = &ser[i], *b = &oth[i];
        int eq = same_result(i, a, b);
        if (!eq)
            printf("      request %d: serial %d tokens (finish %d) \"%s\", %s %d tokens (finish %d) \"%s\"\n", i,
                   a->n_tokens, a->finish, a->text, mode_name[mode], b->n_tokens, b->finish, b->text);
        same += eq;
        /* EOS (not shown) or the stop id (the last token shown) */
        stops += a->finish == SF_FINISH_STOP && (a->completion_tokens > a->n_tokens ||
                                                 (is_stop_id_req(i) && a->n_tokens && a->tokens[a->n_tokens - 1] == stop_id));
        eos += a->finish == SF_FINISH_STOP;
        lengths += a->finish == SF_FINISH_LENGTH;
        cancels += a->finish == SF_FINISH_CANCELLED;
        forms += sampling_of(i, plain).json && a->n_tokens > 1;
    }
    CHECK_MSG(same == N_REQ, "%d of %d requests got the same tokens in both loops", same, N_REQ);
    /* the mix exercised what it is meant to: stops (strings, EOS or a stop id), lengths and cancels */
    printf("      mix: %d stopped (%d of them by EOS or a stop id), %d at max_tokens, %d cancelled, %d held to forms; "
           "preemptions %llu / %llu; steps queued ahead %llu (%llu with forms' rows)\n", eos, stops, lengths, cancels,
           forms, (unsigned long long)st_s.preemptions, (unsigned long long)st_o.preemptions,
           (unsigned long long)st_o.async_steps, (unsigned long long)st_o.async_form_steps);
    CHECK_MSG(stops > 0 && lengths > 0 && cancels > 0 && forms > 0,
              "%d stopped, %d at max_tokens (%d by EOS), %d cancelled, %d held to forms", eos, lengths, stops, cancels, forms);
    CHECK_MSG(mode != ASYNC || st_o.async_form_steps > 0, "no step with forms' rows queued ahead (of %llu)",
              (unsigned long long)st_o.async_steps);
    CHECK_MSG(!kv_blocks || (st_s.preemptions > 0 && st_o.preemptions > 0), "no preemption with %d KV blocks: %llu / %llu",
              kv_blocks, (unsigned long long)st_s.preemptions, (unsigned long long)st_o.preemptions);
    /* async scheduling ran: most decode steps (every one, bar the first of each batch, when no
     * request wants logprobs) were queued ahead */
    CHECK_MSG(mode != ASYNC || st_o.async_steps * (plain ? 2 : 8) > st_o.decode_steps,
              "%llu of %llu decode steps queued ahead", (unsigned long long)st_o.async_steps,
              (unsigned long long)st_o.decode_steps);
    CHECK_MSG(st_s.kv_blocks_used == 0 && st_o.kv_blocks_used == 0, "KV blocks left: %d / %d", st_s.kv_blocks_used,
              st_o.kv_blocks_used);
    /* the clocks: a decode turn's phases fit in its wall time, and the device's idle gap is
     * part of the host's work (CPU: the device is the host) */
    for (int m = 0; m < 2; m++) {
        const sf_engine_stats *s = m ? &st_o : &st_s;
        const char *name = m ? mode_name[mode] : "serial";
        double phases = s->decode_wait_s + s->decode_take_s + s->decode_plan_s + s->decode_batch_s + s->decode_launch_s +
                        s->decode_deliver_s;
        CHECK_MSG(s->decode_steps > 0 && phases <= s->decode_step_s * 1.0001 && phases >= 0.5 * s->decode_step_s,
                  "%s: %llu decode turns of %.4f s, phases sum to %.4f s", name, (unsigned long long)s->decode_steps,
                  s->decode_step_s, phases);
        CHECK_MSG(s->decode_exposed_s <= s->decode_step_s * 1.0001 && s->decode_step_p50_ms > 0 &&
                  s->decode_step_p90_ms >= s->decode_step_p50_ms, "%s: idle gap %.4f s of %.4f, p50 %.3f p90 %.3f ms",
                  name, s->decode_exposed_s, s->decode_step_s, s->decode_step_p50_ms, s->decode_step_p90_ms);
    }
}

TEST(overlap_equals_serial) { loop_equals_serial(OVERLAP, 0, 0); }
TEST(overlap_equals_serial_preempted) { loop_equals_serial(OVERLAP, 12, 0); }
TEST(async_equals_serial) { loop_equals_serial(ASYNC, 0, 0); }
TEST(async_equals_serial_preempted) { loop_equals_serial(ASYNC, 12, 0); }
TEST(async_equals_serial_plain) { loop_equals_serial(ASYNC, 0, 1); }

int main(void)
{
    unsetenv("SEMFLOW_ENGINE_ASYNC"); /* each run picks its loop through the config */
    unsetenv("SEMFLOW_ENGINE_OVERLAP");
    RUN(overlap_equals_serial);
    RUN(overlap_equals_serial_preempted);
    RUN(async_equals_serial);
    RUN(async_equals_serial_preempted);
    RUN(async_equals_serial_plain);
    return test_summary();
}
