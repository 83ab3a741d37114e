/* test_prefix_cache.c — the prefix cache on the CUDA backend: requests whose prompts share a
 * beginning, one alone and then the rest, give with the cache what an engine without it gives
 * (the K/V of the shared blocks read from blocks another request wrote, the prompt's rest
 * computed from the first block boundary after them by the chunked-prefill kernels). With one
 * seat, so both engines decode the same batches, stories260K (trained: its greedy tokens are
 * stable) must give the same tokens, logprobs within bf16 noise. With 8 seats the two runs
 * batch their decodes differently (the cached requests start decoding sooner), and a decode
 * batch of another size rounds differently on the GPU, so there only the first output token,
 * which the cached K/V decide, is compared: its logprob within bf16 noise (also for a 1B-shaped
 * model with random weights, whose near-ties may flip ids). */
#include <math.h>

#include "../../engine/engine.h"
#include "../test.h"
#include "../lib/engine_collect.h"
#include "../lib/engine_wait.h"

static sf_engine *open_engine(const char *model, int dummy, int cached, int seats, int budget, sf_error *err)
{
    sf_engine_config c;
    sf_engine_config_default(&c);
    c.model = model;
    c.load_dummy = dummy;
    c.backend = "cuda";
    c.max_num_seqs = seats;
    c.max_batched_tokens = budget;
    c.max_model_len = 2048;
    c.gpu_memory_utilization = 0.5f;
    c.prefix_caching = cached;
    sf_engine *e = NULL;
    return sf_engine_new(&c, &e, err) == SF_OK ? e : NULL;
}

enum { N = 8, OUT = 16 };

/* Submit every prompt (the first alone) and wait for all. */
static void run(sf_engine *e, int32_t (*prompts)[1024], const int *np, collect *out)
{
    sf_error err = { 0 };
    for (int i = 0; i < N; i++) {
        collect_init(&out[i]);
        sf_submit s;
        memset(&s, 0, sizeof s);
        s.prompt = prompts[i];
        s.n_prompt = np[i];
        sf_sampling_default(&s.sampling);
        s.sampling.temperature = 0;
        s.sampling.max_tokens = OUT;
        s.sampling.ignore_eos = 1;
        s.sampling.logprobs = 1;
        s.cb = on_event;
        s.user = &out[i];
        double retry;
        CHECK_MSG(sf_engine_submit(e, &s, NULL, &retry, &err) == SF_OK, "submit: %s", err.msg);
        if (i == 0) collect_wait(&out[0]);
    }
    for (int i = 0; i < N; i++) collect_wait(&out[i]);
}

static void compare(const char *model, int dummy, int shared_len, int seats, int budget, int whole_tokens, float tol)
{
    static int32_t prompts[N][1024];
    int np[N];
    sf_rng rng;
    sf_rng_seed(&rng, 11);
    /* the shared beginning, then 5-40 tokens of each prompt's own; token ids low enough for any vocabulary */
    for (int k = 0; k < shared_len; k++) prompts[0][k] = 1 + (int32_t)(sf_rng_next(&rng) % 500);
    for (int i = 0; i < N; i++) {
        np[i] = shared_len + 5 + (int)(sf_rng_next(&rng) % 36);
        for (int k = 0; k < np[i]; k++)
            prompts[i][k] = k < shared_len ? prompts[0][k] : 1 + (int32_t)(sf_rng_next(&rng) % 500);
    }
    static collect ref[N], got[N];
    sf_error err = { 0 };
    sf_engine *e = open_engine(model, dummy, 0, seats, budget, &err);
    REQUIRE(e, "%s: %s", model, err.msg);
    run(e, prompts, np, ref);
    sf_engine_free(e);
    e = open_engine(model, dummy, 1, seats, budget, &err);
    REQUIRE(e, "%s: %s", model, err.msg);
    run(e, prompts, np, got);
    int same = 0, cached_ok = 1;
    float worst_first = 0, worst = 0;
    for (int i = 0; i < N; i++) {
        int n = SF_MIN(got[i].n_tokens, ref[i].n_tokens);
        same += got[i].n_tokens == ref[i].n_tokens && !memcmp(got[i].tokens, ref[i].tokens, (size_t)n * sizeof(int32_t));
        if (n) worst_first = SF_MAX(worst_first, fabsf(got[i].lp[0] - ref[i].lp[0]));
        for (int t = 0; t < n && got[i].tokens[t] == ref[i].tokens[t]; t++)
            worst = SF_MAX(worst, fabsf(got[i].lp[t] - ref[i].lp[t]));
        if (i && got[i].cached_tokens < shared_len / 16 * 16) cached_ok = 0;
    }
    sf_engine_stats st;
    wait_idle(e, &st);
    printf("  %s, %d seat%s: %d-token beginning, %llu of %llu prompt tokens found cached; %d of %d requests with the same tokens; "
           "first token's logprob within %.2g, the equal tokens' within %.2g\n", model, seats, seats > 1 ? "s" : "", shared_len,
           (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_queries, same, N, (double)worst_first,
           (double)worst);
    CHECK_MSG(cached_ok, "every request after the first found the shared whole blocks cached");
    CHECK_MSG(worst_first < tol, "first token's logprob differs by %g (tolerance %g)", (double)worst_first, (double)tol);
    if (whole_tokens) {
        CHECK_MSG(same == N, "%d of %d requests give the tokens computed whole", same, N);
        CHECK_MSG(worst < tol, "logprobs differ by %g", (double)worst);
    }
    CHECK(st.kv_blocks_used == 0);
    sf_engine_free(e);
}

TEST(stories260K_one_seat) { compare(test_data("stories260K/stories260K.gguf"), 0, 150, 1, 64, 1, 2e-2f); }
TEST(stories260K_eight_seats) { compare(test_data("stories260K/stories260K.gguf"), 0, 150, 8, 64, 0, 2e-2f); }
TEST(dummy_1b_long_beginning) { compare("preset:1b", 1, 700, 8, 256, 0, 5e-2f); }

int main(void)
{
    RUN(stories260K_one_seat);
    RUN(stories260K_eight_seats);
    RUN(dummy_1b_long_beginning);
    return test_summary();
}
