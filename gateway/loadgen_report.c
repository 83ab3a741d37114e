/* loadgen_report.c — per-class statistics of a load run, as a table and as JSON. */
#include "loadgen.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

typedef struct stat4 { double mean, median, p90, p95, p99; int n; } stat4;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Percentiles by linear interpolation between closest ranks (numpy's default). */
static double pct(const double *v, int n, double p)
{
    if (n == 0) return 0;
    double pos = p / 100 * (n - 1);
    int lo = (int)pos;
    if (lo >= n - 1) return v[n - 1];
    return v[lo] + (v[lo + 1] - v[lo]) * (pos - lo);
}

static stat4 summarize(double *v, int n)
{
    stat4 s = { .n = n };
    if (!n) return s;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    s.mean = sum / n;
    s.median = pct(v, n, 50);
    s.p90 = pct(v, n, 90);
    s.p95 = pct(v, n, 95);
    s.p99 = pct(v, n, 99);
    return s;
}

typedef struct cls_stats {
    const char *name;
    int total, completed, rejected, failed, good;
    long out_tokens, in_tokens, cached_tokens;
    stat4 ttft, tpot, itl, e2el;
} cls_stats;

static int meets_slo(const sf_lg_config *c, const sf_lg_sample *s)
{
    return s->ok && (!c->slo_ttft_s || s->ttft <= c->slo_ttft_s) && (!c->slo_tpot_s || s->tpot <= c->slo_tpot_s) &&
           (!c->slo_e2el_s || s->e2el <= c->slo_e2el_s);
}

/* cls < 0: all classes together. */
static cls_stats compute(const sf_lg_config *c, const sf_lg_result *r, int cls)
{
    cls_stats st = { .name = cls < 0 ? "all" : c->classes[cls].name };
    int n = r->n, n_itl = 0;
    for (int i = 0; i < n; i++) n_itl += r->s[i].n_itl;
    double *ttft = calloc((size_t)n + 1, sizeof *ttft), *tpot = calloc((size_t)n + 1, sizeof *tpot);
    double *e2el = calloc((size_t)n + 1, sizeof *e2el), *itl = calloc((size_t)n_itl + 1, sizeof *itl);
    int a = 0, b = 0, k = 0;
    n_itl = 0;
    for (int i = 0; i < n && ttft && tpot && e2el && itl; i++) {
        const sf_lg_sample *s = &r->s[i];
        if (cls >= 0 && s->cls != cls) continue;
        st.total++;
        if (s->ok) {
            st.completed++;
            st.out_tokens += s->output_tokens;
            st.in_tokens += s->prompt_tokens;
            st.cached_tokens += s->cached_tokens;
            ttft[a++] = s->ttft;
            e2el[k++] = s->e2el;
            if (s->output_tokens > 1) tpot[b++] = s->tpot;
            memcpy(itl + n_itl, s->itl, sizeof *itl * (size_t)s->n_itl);
            n_itl += s->n_itl;
            st.good += meets_slo(c, s);
        } else if (s->status == 429) {
            st.rejected++;
        } else {
            st.failed++;
        }
    }
    st.ttft = summarize(ttft, a);
    st.tpot = summarize(tpot, b);
    st.e2el = summarize(e2el, k);
    st.itl = summarize(itl, n_itl);
    free(ttft), free(tpot), free(e2el), free(itl);
    return st;
}

static void row(FILE *f, const char *cls, const char *metric, stat4 s)
{
    fprintf(f, "  %-16s %-6s %10.2f %10.2f %10.2f %10.2f %8d\n", cls, metric, s.mean * 1e3, s.median * 1e3, s.p90 * 1e3,
            s.p99 * 1e3, s.n);
}

void sf_lg_report_table(const sf_lg_config *c, const sf_lg_result *r, FILE *f)
{
    cls_stats all = compute(c, r, -1);
    fprintf(f, "requests: %d issued, %d completed, %d rejected (429), %d failed in %.2f s\n", all.total, all.completed,
            all.rejected, all.failed, r->elapsed_s);
    fprintf(f, "throughput: %.2f req/s, %.1f output tokens/s, %.1f input tokens/s\n", all.completed / r->elapsed_s,
            all.out_tokens / r->elapsed_s, all.in_tokens / r->elapsed_s);
    if (all.cached_tokens)
        fprintf(f, "prefix cache: %ld of %ld prompt tokens found cached (%.1f%%)\n", all.cached_tokens, all.in_tokens,
                all.in_tokens ? 100.0 * all.cached_tokens / all.in_tokens : 0.0);
    if (c->slo_ttft_s || c->slo_tpot_s || c->slo_e2el_s)
        fprintf(f, "goodput: %.2f req/s (%d of %d completed met ttft<=%gms tpot<=%gms e2el<=%gms; 0 = no limit)\n",
                all.good / r->elapsed_s, all.good, all.completed, c->slo_ttft_s * 1e3, c->slo_tpot_s * 1e3,
                c->slo_e2el_s * 1e3);
    fprintf(f, "\n  %-16s %-6s %10s %10s %10s %10s %8s\n", "class", "ms", "mean", "median", "p90", "p99", "n");
    for (int k = -1; k < c->n_classes; k++) {
        if (k >= 0 && c->n_classes == 1) break;
        cls_stats s = k < 0 ? all : compute(c, r, k);
        row(f, s.name, "TTFT", s.ttft);
        row(f, s.name, "TPOT", s.tpot);
        row(f, s.name, "ITL", s.itl);
        row(f, s.name, "E2EL", s.e2el);
        if (k >= 0)
            fprintf(f, "  %-16s %d completed, %d rejected, %d failed, %.1f output tokens/s\n", s.name, s.completed,
                    s.rejected, s.failed, s.out_tokens / r->elapsed_s);
    }
}

static json_t *stat_json(stat4 s)
{
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:i}", "mean_ms", s.mean * 1e3, "median_ms", s.median * 1e3, "p90_ms",
                     s.p90 * 1e3, "p95_ms", s.p95 * 1e3, "p99_ms", s.p99 * 1e3, "n", s.n);
}

static json_t *cls_json(const cls_stats *s, double elapsed)
{
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:I, s:o, s:o, s:o, s:o}", "class", s->name, "issued",
                     s->total, "completed", s->completed, "rejected_429", s->rejected, "failed", s->failed,
                     "request_throughput", s->completed / elapsed, "output_throughput", s->out_tokens / elapsed,
                     "goodput", s->good / elapsed, "output_tokens", (json_int_t)s->out_tokens, "ttft", stat_json(s->ttft),
                     "tpot", stat_json(s->tpot), "itl", stat_json(s->itl), "e2el", stat_json(s->e2el));
    json_object_set_new(o, "input_tokens", json_integer((json_int_t)s->in_tokens));
    json_object_set_new(o, "cached_tokens", json_integer((json_int_t)s->cached_tokens));
    return o;
}

int sf_lg_report_json(const sf_lg_config *c, const sf_lg_result *r, const char *path, sf_error *err)
{
    cls_stats all = compute(c, r, -1);
    json_t *classes = json_array();
    for (int k = 0; k < c->n_classes; k++) {
        cls_stats s = compute(c, r, k);
        json_array_append_new(classes, cls_json(&s, r->elapsed_s));
    }
    /* issued_rate: requests issued per second of the issuing window (the offered load achieved) */
    double window = c->duration_s > 0 && c->duration_s < r->elapsed_s ? c->duration_s : r->elapsed_s;
    json_t *o = json_pack("{s:f, s:i, s:f, s:f, s:{s:f, s:f, s:f}, s:o, s:o}", "duration_s", r->elapsed_s, "concurrency",
                          c->rate > 0 ? 0 : c->concurrency, "request_rate", c->rate, "issued_rate",
                          window > 0 ? all.total / window : 0.0, "slo", "ttft_ms", c->slo_ttft_s * 1e3,
                          "tpot_ms", c->slo_tpot_s * 1e3, "e2el_ms", c->slo_e2el_s * 1e3, "all", cls_json(&all, r->elapsed_s),
                          "classes", classes);
    int rc = json_dump_file(o, path, JSON_INDENT(2));
    json_decref(o);
    if (rc) return sf_err(err, SF_EIO, "writing %s failed", path);
    return SF_OK;
}
