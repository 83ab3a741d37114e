/* sample_lp_case.h — the sample op's refusals of a row's logprobs and its answer on a row whose
 * allow mask leaves one id, shared by the CPU unit test (tests/unit/test_sample_op.c) and the
 * CUDA device test (tests/device/test_sample.c). Header-only: each test binary includes it once. */
#ifndef SF_TESTS_SAMPLE_LP_CASE_H
#define SF_TESTS_SAMPLE_LP_CASE_H

#include "../../hal/hal.h"
#include "../test.h"

/* r: a row of buf (vocab V, no penalty entries) whose mask allows `only` alone. */
static void sample_lp_case(sf_backend *be, sf_buf *buf, int V, sf_sample_row r, int32_t only)
{
    int32_t id = -1;
    sf_sample_lp lp;
    r.logprobs = 1; /* asked for with nowhere to put them */
    CHECK(be->ops->sample(be, buf, 1, V, &r, NULL, 0, &id, NULL) == SF_EINVAL);
    r.logprobs = 2 + SF_SAMPLE_TOP_MAX; /* more top entries than the op gives */
    CHECK(be->ops->sample(be, buf, 1, V, &r, NULL, 0, &id, &lp) == SF_EINVAL);
    r.logprobs = -1;
    CHECK(be->ops->sample(be, buf, 1, V, &r, NULL, 0, &id, &lp) == SF_EINVAL);
    r.logprobs = 1 + SF_SAMPLE_TOP_MAX; /* the one id allowed: log-probability 0, alone at the top */
    CHECK(be->ops->sample(be, buf, 1, V, &r, NULL, 0, &id, &lp) == SF_OK && id == only && lp.lp == 0.0f &&
          lp.n_top == 1 && lp.top_id[0] == only && lp.top_lp[0] == 0.0f);
}

#endif
