/* kv_quality.c — full-precision vs INT8 KV on the same prompts (see kv_quality.h). */
#include "kv_quality.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "kvcache.h"

typedef struct kvq {
    sf_backend *b;
    sf_forward *f;
    sf_kv_pool pool;
    int bs, max_blocks, chunk, vocab;
    /* the one sequence being run */
    int32_t *bt;
    int n_blocks, len, i8;
} kvq;

static void seq_reset(kvq *q, int i8)
{
    sf_kv_release(&q->pool, q->bt, q->n_blocks);
    q->n_blocks = q->len = 0;
    q->i8 = i8;
}

/* Appends n tokens (in chunks); logits of the last one into out [vocab]. */
static int feed(kvq *q, const int32_t *tok, int n, float *out, sf_error *err)
{
    for (int i0 = 0; i0 < n; i0 += q->chunk) {
        int k = SF_MIN(q->chunk, n - i0), need = (q->len + k + q->bs - 1) / q->bs;
        if (need > q->max_blocks) return sf_err(err, SF_EINVAL, "kv-quality: context of %d tokens exceeded", q->max_blocks * q->bs);
        if (need > q->n_blocks) {
            if (sf_kv_alloc_as(&q->pool, q->i8, need - q->n_blocks, q->bt + q->n_blocks) != SF_OK)
                return sf_err(err, SF_ENOMEM, "kv-quality: KV pool exhausted");
            q->n_blocks = need;
        }
        int32_t *pos = malloc(2 * sizeof(int32_t) * (size_t)k), *slot = pos + k, ss[2] = { 0, k };
        if (!pos) return sf_err(err, SF_ENOMEM, "kv-quality: out of memory");
        for (int i = 0; i < k; i++) {
            pos[i] = q->len + i;
            slot[i] = q->bt[pos[i] / q->bs] * q->bs + pos[i] % q->bs;
        }
        int32_t ctx = q->len + k, row = k - 1;
        sf_batch b = { .n_tokens = k, .n_seqs = 1, .tokens = tok + i0, .pos = pos, .slot = slot, .seq_start = ss,
                       .seq_ctx = &ctx, .block_table = q->bt, .max_blocks = q->max_blocks, .logit_rows = &row,
                       .n_logits = 1 };
        int rc = sf_forward_step(q->f, &b, out, err);
        free(pos);
        if (rc) return rc;
        q->len += k;
    }
    return SF_OK;
}

static int32_t argmax(const float *l, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

int sf_kvq_run(sf_backend *b, const sf_model *m, const int32_t *const *prompts, const int *lens, int n_prompts,
               const sf_kvq_opts *o, sf_kvq_stats *st, sf_error *err)
{
    memset(st, 0, sizeof *st);
    if (n_prompts < 1 || o->n_gen < 1 || o->chunk < 1)
        return sf_err(err, SF_EINVAL, "kv-quality: %d prompts, %d positions each, chunk %d; each must be at least 1",
                      n_prompts, o->n_gen, o->chunk);
    int longest = 0;
    for (int i = 0; i < n_prompts; i++) {
        if (lens[i] < 1) return sf_err(err, SF_EINVAL, "kv-quality: prompt %d is empty", i + 1);
        longest = SF_MAX(longest, lens[i]);
    }
    const sf_model_config *c = &m->cfg;
    if (c->max_pos > 0 && longest + o->n_gen > c->max_pos)
        return sf_err(err, SF_EINVAL, "kv-quality: a prompt of %d tokens plus %d positions is longer than %s's context "
                      "of %d; shorten the prompts or lower --gen", longest, o->n_gen, m->name, c->max_pos);
    kvq q = { .b = b, .bs = 16, .chunk = o->chunk, .vocab = c->vocab_size };
    q.max_blocks = (longest + o->n_gen + q.bs - 1) / q.bs;
    sf_kv_config kc = { .n_layers = c->n_layers, .n_blocks = q.max_blocks + 1, .block_size = q.bs,
                        .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                        .dtype = strcmp(b->ops->name, "cpu") ? SF_DT_BF16 : SF_DT_F32, .int8 = 1 };
    float *ref = NULL, *cur = NULL;
    int32_t *gen = NULL;
    int rc;
    double sum_abs = 0, sum_d2 = 0, sum_r2 = 0, floor_d2 = 0;
    long agree = 0, floor_agree = 0;
    st->prefix_min = o->n_gen;
    if ((rc = b->ops->kv_init(b, &kc, err)) || (rc = sf_kv_pool_init(&q.pool, kc.n_blocks, q.bs, err)) ||
        (rc = sf_forward_new(b, m, o->chunk, 1, &q.f, err)))
        goto cleanup;
    sf_kv_pool_enable_i8(&q.pool);
    q.bt = calloc((size_t)q.max_blocks, sizeof *q.bt);
    ref = malloc(sizeof(float) * (size_t)q.vocab * o->n_gen);
    cur = malloc(sizeof(float) * (size_t)q.vocab);
    gen = malloc(sizeof(int32_t) * (size_t)o->n_gen);
    if (!q.bt || !ref || !cur || !gen) {
        rc = sf_err(err, SF_ENOMEM, "kv-quality: out of memory for %d x %d logits", o->n_gen, q.vocab);
        goto cleanup;
    }
    size_t bb = b->ops->kv_block_bytes(b, &kc), scales = (size_t)c->n_layers * 2 * 2 * c->n_kv_heads * q.bs * 4;
    st->kv_bytes_full = (bb - scales) / q.bs;
    st->kv_bytes_i8 = ((bb - scales) / (kc.dtype == SF_DT_F32 ? 4 : 2) + scales / 2) / q.bs;
    for (int p = 0; p < n_prompts; p++) {
        /* 1. full precision, greedy */
        double t0 = sf_now_s();
        seq_reset(&q, 0);
        if ((rc = feed(&q, prompts[p], lens[p], ref, err))) goto cleanup;
        for (int g = 0; g < o->n_gen; g++) {
            gen[g] = argmax(ref + (size_t)g * q.vocab, q.vocab);
            if (g + 1 < o->n_gen && (rc = feed(&q, &gen[g], 1, ref + (size_t)(g + 1) * q.vocab, err))) goto cleanup;
        }
        /* 2. INT8, teacher-forced */
        double t1 = sf_now_s();
        seq_reset(&q, 1);
        for (int g = 0; g < o->n_gen; g++) {
            rc = g == 0 ? feed(&q, prompts[p], lens[p], cur, err) : feed(&q, &gen[g - 1], 1, cur, err);
            if (rc) goto cleanup;
            const float *r = ref + (size_t)g * q.vocab;
            for (int v = 0; v < q.vocab; v++) {
                double d = (double)cur[v] - r[v];
                sum_abs += fabs(d);
                sum_d2 += d * d;
                sum_r2 += (double)r[v] * r[v];
                st->max_abs = fmax(st->max_abs, fabs(d));
            }
            agree += argmax(cur, q.vocab) == gen[g];
            st->n_positions++;
        }
        double t2 = sf_now_s();
        st->s_full += t1 - t0;
        st->s_i8 += t2 - t1;
        /* 4. the noise floor: full precision, the prompt one token per step */
        seq_reset(&q, 0);
        q.chunk = 1;
        for (int g = 0; g < o->n_gen; g++) {
            rc = g == 0 ? feed(&q, prompts[p], lens[p], cur, err) : feed(&q, &gen[g - 1], 1, cur, err);
            if (rc) break;
            const float *r = ref + (size_t)g * q.vocab;
            for (int v = 0; v < q.vocab; v++) {
                double d = (double)cur[v] - r[v];
                floor_d2 += d * d;
                st->floor_max_abs = fmax(st->floor_max_abs, fabs(d));
            }
            floor_agree += argmax(cur, q.vocab) == gen[g];
        }
        q.chunk = o->chunk;
        if (rc) goto cleanup;
        /* 3. INT8, free-running greedy */
        seq_reset(&q, 1);
        if ((rc = feed(&q, prompts[p], lens[p], cur, err))) goto cleanup;
        int prefix = -1;
        for (int g = 0; g < o->n_gen; g++) {
            int32_t t = argmax(cur, q.vocab);
            if (t == gen[g]) st->greedy_same++;
            else if (prefix < 0) prefix = g;
            st->greedy_total++;
            if (g + 1 < o->n_gen && (rc = feed(&q, &t, 1, cur, err))) goto cleanup;
        }
        st->prefix_min = SF_MIN(st->prefix_min, prefix < 0 ? o->n_gen : prefix);
        st->n_prompts++;
    }
    st->mean_abs = sum_abs / ((double)st->n_positions * q.vocab);
    st->rel_l2 = sum_r2 > 0 ? sqrt(sum_d2 / sum_r2) : sqrt(sum_d2);
    st->top1 = (double)agree / st->n_positions;
    st->floor_rel_l2 = sum_r2 > 0 ? sqrt(floor_d2 / sum_r2) : sqrt(floor_d2);
    st->floor_top1 = (double)floor_agree / st->n_positions;
    rc = SF_OK;
cleanup:
    if (q.pool.n_blocks) seq_reset(&q, 0);
    sf_forward_free(q.f);
    sf_kv_pool_free(&q.pool);
    free(q.bt);
    free(ref);
    free(cur);
    free(gen);
    return rc;
}
