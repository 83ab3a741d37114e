/* completions.c — POST /v1/chat/completions and /v1/completions: authentication, parameters,
 * intent, context checks, tenant admission and submission to the engine. The way back
 * (streaming or whole responses) is respond.c; the request's life is described in gw-request.h. */
#include "gw-request.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/bufferevent.h>

#include "intent.h"

static void fail(gw_worker *w, struct evhttp_request *req, const sf_gw_err *e, double retry_after, const char *tenant,
                 const char *cls)
{
    gw_send_error(req, e, retry_after);
    sf_metrics_request(&w->gw->metrics, tenant, cls, e->status);
}

static void free_ids(int32_t **ids, int *n, int np)
{
    for (int i = 0; ids && i < np; i++) free(ids[i]);
    free(ids);
    free(n);
}

void gw_route_generate(gw_worker *w, struct evhttp_request *req, int kind, sf_engine *engine)
{
    sf_gateway *gw = w->gw;
    sf_gw_params p;
    sf_gw_err e = { 0 };
    int32_t **ids = NULL; /* each prompt's ids */
    int *n_ids = NULL, np = 0, total_ids = 0;
    double t0 = sf_now_s(), retry = 1;
    const char *why = NULL;
    sf_intent intent;
    sf_intent_default(&intent);

    sf_tenant *tenant = sf_tenants_auth(gw->tenants, gw_header(req, "Authorization"));
    if (!tenant) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
        sf_gw_fail(&e, 401, "authentication_error", "invalid_api_key", NULL,
                   gw_header(req, "Authorization") ? "the API key is not valid for this server"
                                                   : "missing API key; send 'Authorization: Bearer <key>'");
        return fail(w, req, &e, 0, "-", "-");
    }
    size_t len;
    const char *body = gw_body(req, &len);
    if (len > (size_t)gw->cfg.max_body_bytes) {
        sf_gw_fail(&e, 413, "invalid_request_error", "payload_too_large", NULL,
                   "the body is %zu bytes; this server accepts at most %d (--max-body)", len, gw->cfg.max_body_bytes);
        return fail(w, req, &e, 0, tenant->name, "-");
    }
    if (sf_gw_params_parse(kind, body, len, &p, &e)) return fail(w, req, &e, 0, tenant->name, "-");

    /* intent: header, else the body's "intent", else the tenant's default; then the tenant's cap */
    const char *hdr = gw_header(req, "X-Semantic-Intent");
    sf_error ie = { 0 };
    if (hdr) {
        if (sf_intent_parse(hdr, strlen(hdr), &intent, &ie)) {
            sf_gw_fail(&e, 400, "invalid_request_error", "invalid_intent", "X-Semantic-Intent", "%s", ie.msg);
            goto reject;
        }
    } else if (p.has_intent) {
        intent = p.intent;
    } else {
        intent = tenant->default_intent;
    }
    /* echo what the scheduler will see: after defaults and the tenant's urgency cap */
    sf_tenant_cap(tenant, &intent);
    char applied[160];
    sf_intent_format(&intent, applied, sizeof applied);
    evhttp_add_header(evhttp_request_get_output_headers(req), "X-Semantic-Intent-Applied", applied);
    if (p.model && strcmp(p.model, gw->model_name)) {
        sf_gw_fail(&e, 404, "invalid_request_error", "model_not_found", "model",
                   "the model '%.100s' does not exist; this server serves '%s'", p.model, gw->model_name);
        goto reject;
    }
    np = kind == SF_GW_CHAT ? 1 : p.n_prompts;
    ids = calloc((size_t)np, sizeof *ids);
    n_ids = calloc((size_t)np, sizeof *n_ids);
    if (!ids || !n_ids) {
        sf_gw_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto reject;
    }
    for (int k = 0; k < np; k++) {
        if (gw_tokenize_prompt(engine, &p, k, &ids[k], &n_ids[k], &e)) goto reject;
        /* vLLM's truncate_prompt_tokens: the prompt's last tokens (its beginning, BOS too, dropped) */
        int keep = p.truncate > 0 ? p.truncate : p.truncate < 0 ? gw->max_model_len - 1 : 0;
        if (keep > 0 && n_ids[k] > keep) {
            memmove(ids[k], ids[k] + (n_ids[k] - keep), (size_t)keep * sizeof *ids[k]);
            n_ids[k] = keep;
            if (kind == SF_GW_COMPLETIONS) p.prompts[k].text = NULL; /* an echo decodes what was kept */
        }
        total_ids += n_ids[k];
    }
    if (sf_gw_force_call(&p, sf_tok_chat_format(sf_engine_tokenizer(engine)) == SF_CHAT_LLAMA3, &e)) goto reject;
    for (int k = 0; k < np; k++) {
        char which[32] = "";
        if (np > 1) snprintf(which, sizeof which, " (prompt %d)", k);
        if (n_ids[k] >= gw->max_model_len) {
            sf_gw_fail(&e, 400, "invalid_request_error", "context_length_exceeded", kind == SF_GW_CHAT ? "messages" : "prompt",
                       "the prompt%s is %d tokens; this model's context is %d tokens, which must also hold the output",
                       which, n_ids[k], gw->max_model_len);
            goto reject;
        }
        if (p.max_tokens_given && n_ids[k] + p.sampling.max_tokens > gw->max_model_len) {
            sf_gw_fail(&e, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                       "this model's context is %d tokens; the prompt%s is %d and max_tokens asks for %d more; lower "
                       "max_tokens to at most %d", gw->max_model_len, which, n_ids[k], p.sampling.max_tokens,
                       gw->max_model_len - n_ids[k]);
            goto reject;
        }
    }
    if (sf_tenant_admit(tenant, t0, &retry, &why)) {
        sf_metrics_add(&gw->metrics, !strcmp(why, "rate") ? &gw->metrics.rejected_tenant_rate
                                                          : &gw->metrics.rejected_tenant_conc, 1);
        sf_gw_fail(&e, 429, "rate_limit_error", !strcmp(why, "rate") ? "tenant_token_rate" : "tenant_concurrency", NULL,
                   !strcmp(why, "rate") ? "tenant '%s' used its output-token rate; retry after the Retry-After seconds"
                                        : "tenant '%s' has its maximum of concurrent requests in flight",
                   tenant->name);
        goto reject;
    }

    const int nc = np * p.n; /* choice prompt * n + j, as OpenAI indexes a batch's choices */
    gw_req *r = calloc(1, sizeof *r + sizeof(gw_choice) * (size_t)nc);
    if (!r) {
        sf_tenant_release(tenant);
        sf_gw_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto reject;
    }
    r->w = w;
    r->gw = gw;
    r->engine = engine;
    r->http = req;
    r->conn = evhttp_request_get_connection(req);
    r->kind = kind;
    r->stream = p.stream;
    r->include_usage = p.include_usage;
    r->n = nc;
    r->per_prompt = p.n;
    r->logprobs = p.logprobs;
    r->tools = p.tool_choice;
    r->top_logprobs = p.top_logprobs;
    r->echo = p.echo;
    r->scored = p.sampling.prompt_logprobs != 0;
    r->prompt_logprobs = p.prompt_logprobs;
    r->tokens_as_ids = p.tokens_as_ids;
    r->tenant = tenant;
    r->intent = intent;
    r->t0 = t0;
    r->prompt_tokens = total_ids; /* each prompt once, whatever n (OpenAI's usage) */
    r->created = (long)time(NULL);
    const uint64_t serial = atomic_fetch_add(&gw->next_id, 1); /* the server's count of requests */
    snprintf(r->id, sizeof r->id, "%s-%lx%06lx", kind == SF_GW_CHAT ? "chatcmpl" : "cmpl", (unsigned long)r->created,
             (unsigned long)serial & 0xffffff);
    pthread_mutex_init(&r->mu, NULL);
    r->wake = event_new(w->base, -1, 0, gw_req_on_wake, r);
    sf_metrics_active(&gw->metrics, 1);
    gw_worker_load(w, 1);
    int echo_ok = 1;
    for (int i = 0; r->echo && i < nc; i++) { /* the prompt as given; token ids decoded (special tokens kept) */
        const sf_gw_prompt *pr = &p.prompts[i / p.n];
        gw_choice *c = &r->ch[i];
        const gw_choice *first = &r->ch[i - i % p.n]; /* its prompt's first choice: decoded once */
        char *dec = NULL;
        const char *text = pr->text ? pr->text : first != c ? first->echo : NULL;
        size_t len = pr->text ? pr->len : first != c ? first->echo_len : 0;
        if (text) {
            if ((c->echo = malloc(len + 1))) memcpy(c->echo, text, len), c->echo_len = len;
        } else if (sf_tok_decode(sf_engine_tokenizer(engine), ids[i / p.n], (size_t)n_ids[i / p.n], 0, &dec, NULL) == SF_OK) {
            c->echo = dec, c->echo_len = strlen(dec);
        }
        echo_ok &= c->echo != NULL;
    }
    if (!r->wake || !echo_ok) {
        r->answered = 1;
        gw_req_free(r);
        sf_gw_fail(&e, 500, "server_error", NULL, NULL, echo_ok ? "event_new failed" : "out of memory for the echo");
        goto reject;
    }
    if (!r->stream) gw_req_echo_whole(r);

    sf_submit s;
    memset(&s, 0, sizeof s);
    s.sampling = p.sampling;
    s.intent = intent;
    snprintf(s.tenant, sizeof s.tenant, "%s", tenant->name);
    s.cache_salt = p.cache_salt;
    s.cb = gw_req_on_event;
    int rc = SF_OK;
    sf_error serr = { 0 };
    for (int i = 0; i < nc; i++) {
        const int pi = i / p.n, j = i % p.n; /* prompt, its choice */
        r->ch[i].req = r;
        r->ch[i].idx = i;
        s.prompt = ids[pi];
        s.n_prompt = n_ids[pi];
        if (!p.max_tokens_given) { /* the rest of the context; for completions OpenAI's 16 at most */
            s.sampling.max_tokens = gw->max_model_len - n_ids[pi];
            if (kind == SF_GW_COMPLETIONS && s.sampling.max_tokens > 16) s.sampling.max_tokens = 16;
        }
        if (p.n > 1 && p.sampling.has_seed) s.sampling.seed = p.sampling.seed + (uint64_t)j;
        /* a prompt's choices: one computes it, the others find it in the prefix cache */
        s.group = p.n > 1 ? (serial << 16 | (uint64_t)pi) + 1 : 0; /* prompts < 2^16 */
        s.user = &r->ch[i];
        sf_request *sr = NULL;
        rc = sf_engine_submit(engine, &s, &sr, &retry, &serr);
        if (rc) break;
        pthread_mutex_lock(&r->mu);
        r->ch[i].r = sr;
        pthread_mutex_unlock(&r->mu);
        r->engine_refs++;
    }
    free_ids(ids, n_ids, np);
    ids = NULL;
    n_ids = NULL;
    sf_metrics_add(&gw->metrics, &gw->metrics.prompt_tokens, (uint64_t)total_ids * (uint64_t)(rc ? 0 : p.n));
    if (rc) {
        /* nothing was sent yet: answer now and let already-submitted choices (n > 1) wind down */
        if (rc == SF_AGAIN) {
            sf_metrics_add(&gw->metrics, &gw->metrics.rejected_queue_full, 1);
            sf_gw_fail(&e, 429, "rate_limit_error", "queue_full", NULL, "%s (%s urgency); retry after the Retry-After seconds",
                       serr.msg, sf_urgency_name(intent.urgency));
        } else if (rc == SF_EINVAL) {
            sf_gw_fail(&e, 400, "invalid_request_error", NULL, NULL, "%s", serr.msg);
        } else if (rc == SF_ECANCELED || rc == SF_ENODEV) {
            /* shutting down, or an engine that stopped for good (a dead tensor-parallel rank):
             * the engine's message says which */
            int draining = atomic_load(&gw->draining);
            sf_gw_fail(&e, 503, "service_unavailable", draining ? "draining" : "engine_unavailable", NULL, "%s%s",
                       serr.msg, draining ? "" : "; restart the server");
        } else {
            sf_gw_fail(&e, 500, "server_error", NULL, NULL, "submitting to the engine: %s", serr.msg);
        }
        gw_send_error(req, &e, retry);
        r->http = NULL;
        r->answered = 1;
        r->status = e.status;
        sf_metrics_request(&gw->metrics, tenant->name, intent.cls, e.status);
        gw_req_cancel_running(r);
        sf_gw_params_free(&p);
        gw_req_maybe_free(r);
        return;
    }
    sf_gw_params_free(&p);
    evhttp_connection_set_closecb(r->conn, gw_req_on_close, r);
    struct bufferevent *bev = evhttp_connection_get_bufferevent(r->conn);
    if (bev && (event_base_get_features(w->base) & EV_FEATURE_EARLY_CLOSE)) {
        r->hup = event_new(w->base, bufferevent_getfd(bev), EV_CLOSED, gw_req_on_hup, r);
        if (r->hup) event_add(r->hup, NULL);
    }
    if (r->stream) gw_req_start_stream(r);
    return;

reject:
    free_ids(ids, n_ids, np);
    fail(w, req, &e, retry, tenant->name, intent.cls);
    sf_gw_params_free(&p);
}
