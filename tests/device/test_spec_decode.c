/* test_spec_decode.c — n-gram speculative decoding on the CUDA backend: requests on prompts that
 * repeat themselves, with 4-token drafts and without, on stories260K (trained: its greedy
 * tokens are stable). A drafted step computes the drafts' positions in one pass (the prefill
 * kernels) where decoding computes one position a step, so the GPU's rounding may differ
 * between the two; what must hold: drafts were computed and kept, the first output token
 * (no draft before it) is the same with the same logprob, and every token the two runs share
 * from the start has its logprob within bf16 noise. One seat, so the decodes batch alike.
 * The drafted steps of 2-6 positions run gemv_rows.cu's kernels, one-position steps the
 * one-row ones: both within 3e-3 of a float64 reference (test_gemv), but rounded apart, so a
 * shared token's logprob may move by about one bf16 step of its logit (0.0625 for logits in
 * [8, 16): 0.052 measured on stories260K) and a near tie may go the other way (5 of 6 requests
 * the same). The same check with SEMFLOW_CUDA_GEMV_ROWS=0 (a child process: the switch is read
 * once), where both kinds of step round alike, must find every request the same and every
 * logprob equal: that one holds the drafting itself to decoding exactly. */
#include <math.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../engine/engine.h"
#include "../../engine/tokenizer.h"
#include "../test.h"
#include "../lib/engine_collect.h"
#include "../lib/engine_wait.h"

enum { N = 6, OUT = 80 };
static int exact; /* the child's run: SEMFLOW_CUDA_GEMV_ROWS=0 */

static sf_engine *open_engine(int spec, sf_error *err)
{
    sf_engine_config c;
    sf_engine_config_default(&c);
    c.model = test_data("stories260K/stories260K.gguf");
    c.backend = "cuda";
    c.max_num_seqs = 1;
    c.gpu_memory_utilization = 0.3f;
    c.spec_tokens = spec;
    /* the exact run draws every row on the host: a drafted step's rows are drawn there, and a
     * step without drafts would otherwise draw on the GPU, whose log-sum-exp rounds apart from
     * the host's (float against double sums, ~1e-6) */
    c.host_sampling = exact;
    sf_engine *e = NULL;
    return sf_engine_new(&c, &e, err) == SF_OK ? e : NULL;
}

TEST(spec_matches_plain)
{
    static const char *texts[] = {
        "Once upon a time, there was a little girl named Lily. She loved to play outside. Once upon a time, there was",
        "Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had",
        "The sun was big and the sun was hot and the sun was",
        "One day, a cat saw a dog. The cat and the dog played. One day, a cat saw",
    };
    static collect out[2][N];
    sf_error err = { 0 };
    sf_engine_stats st = { 0 };
    for (int pass = 0; pass < 2; pass++) {
        sf_engine *e = open_engine(pass ? 4 : 0, &err);
        REQUIRE(e, "engine: %s", err.msg);
        for (int i = 0; i < N; i++) {
            int32_t *ids = NULL;
            size_t n = 0;
            REQUIRE(sf_tok_encode(sf_engine_tokenizer(e), texts[i % 4], strlen(texts[i % 4]), 1, &ids, &n, NULL) == SF_OK,
                    "encode");
            collect_init(&out[pass][i]);
            sf_submit s;
            memset(&s, 0, sizeof s);
            s.prompt = ids;
            s.n_prompt = (int)n;
            sf_sampling_default(&s.sampling);
            s.sampling.temperature = i < 4 ? 0.0f : 0.7f;
            s.sampling.seed = 11;
            s.sampling.has_seed = 1;
            s.sampling.max_tokens = OUT;
            s.sampling.ignore_eos = 1;
            s.sampling.logprobs = 1;
            s.cb = on_event;
            s.user = &out[pass][i];
            double retry;
            CHECK_MSG(sf_engine_submit(e, &s, NULL, &retry, &err) == SF_OK, "submit: %s", err.msg);
            free(ids);
            collect_wait(&out[pass][i]);
        }
        if (pass) wait_idle(e, &st);
        sf_engine_free(e);
    }
    int same = 0, first_ok = 1;
    float worst = 0;
    for (int i = 0; i < N; i++) {
        const collect *a = &out[0][i], *b = &out[1][i];
        int t = 0;
        while (t < a->n_tokens && t < b->n_tokens && a->tokens[t] == b->tokens[t]) {
            worst = SF_MAX(worst, fabsf(a->lp[t] - b->lp[t]));
            t++;
        }
        same += t == a->n_tokens && t == b->n_tokens;
        first_ok &= a->n_tokens > 0 && b->n_tokens > 0 && a->tokens[0] == b->tokens[0] && fabsf(a->lp[0] - b->lp[0]) < 1e-3f;
    }
    printf("  %llu steps with drafts, %llu of %llu draft tokens accepted; %d of %d requests token for token the same, "
           "shared tokens' logprobs within %.2g\n", (unsigned long long)st.spec_steps,
           (unsigned long long)st.spec_accepted_tokens, (unsigned long long)st.spec_draft_tokens, same, N, (double)worst);
    CHECK_MSG(st.spec_draft_tokens > 0 && st.spec_accepted_tokens > 0, "drafts computed and kept");
    CHECK_MSG(first_ok, "the first output token the same");
    if (exact) {
        CHECK_MSG(same == N && worst == 0.0f, "rows kernels off: %d of %d requests the same, logprobs differ by %g",
                  same, N, (double)worst);
    } else {
        CHECK_MSG(worst < 0.1f, "shared tokens' logprobs differ by %g", (double)worst);
        CHECK_MSG(same >= N - 2, "only %d of %d requests token for token the same", same, N);
    }
}

int main(void)
{
    const pid_t pid = fork();
    if (pid == 0) { /* before any CUDA call in this process */
        setenv("SEMFLOW_CUDA_GEMV_ROWS", "0", 1);
        exact = 1;
        printf("with SEMFLOW_CUDA_GEMV_ROWS=0:\n");
        RUN(spec_matches_plain);
        fflush(stdout);
        _exit(test_failed_ ? 1 : 0); /* its PASS or FAIL line counts; the summary is the parent's */
    }
    int status = 0;
    const int waited = pid > 0 && waitpid(pid, &status, 0) == pid;
    RUN(spec_matches_plain);
    CHECK_MSG(waited && WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the run with SEMFLOW_CUDA_GEMV_ROWS=0 failed (above)");
    return test_summary();
}
