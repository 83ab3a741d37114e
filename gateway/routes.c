/* routes.c — the small routes: /health, /metrics, /v1/models, /tokenize, /detokenize. */
#include "gw-impl.h"

#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "../engine/tokenizer.h"

void gw_route_health(sf_gateway *gw, struct evhttp_request *req)
{
    if (atomic_load(&gw->draining)) {
        gw_error(req, 503, "service_unavailable", "draining", NULL, "the server is shutting down");
        return;
    }
    if (!atomic_load(&gw->engine)) {
        gw_error(req, 503, "service_unavailable", "loading", NULL, "the model is still loading");
        return;
    }
    /* the hot path of load balancers' probes: a fixed body, no JSON encoding per request */
    static const char body[] = "{\"status\":\"ok\"}\n";
    struct evbuffer *buf = evbuffer_new();
    evbuffer_add_reference(buf, body, sizeof body - 1, NULL, NULL);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, 200, "OK", buf);
    evbuffer_free(buf);
}

void gw_route_metrics(sf_gateway *gw, struct evhttp_request *req)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        gw_error(req, 500, "server_error", NULL, NULL, "open_memstream failed");
        return;
    }
    fprintf(f, "# HELP semflow_ready 1 when the model is loaded and requests are admitted.\n"
               "# TYPE semflow_ready gauge\nsemflow_ready %d\n",
            atomic_load(&gw->engine) != NULL && !atomic_load(&gw->draining));
    sf_metrics_render(&gw->metrics, atomic_load(&gw->engine), f);
    if (gw->cfg.extra_metrics) gw->cfg.extra_metrics(gw->cfg.extra_metrics_user, f);
    fclose(f);
    struct evbuffer *buf = evbuffer_new();
    evbuffer_add(buf, text, len);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; version=0.0.4");
    evhttp_send_reply(req, 200, "OK", buf);
    evbuffer_free(buf);
    free(text);
}

void gw_route_models(sf_gateway *gw, struct evhttp_request *req)
{
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", gw->model_name, "object", "model", "created",
                          (json_int_t)gw->created, "owned_by", "semflow", "max_model_len", gw->max_model_len);
    gw_send_json(req, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

static int starts_with_bos(const sf_tokenizer *t, const char *text)
{
    int bos = sf_tok_bos(t);
    const char *piece = bos >= 0 ? sf_tok_piece(t, bos) : NULL;
    return piece && *piece && !strncmp(text, piece, strlen(piece));
}

int gw_tokenize_prompt(sf_engine *engine, const sf_gw_params *p, int which, int32_t **ids, int *n, sf_gw_err *e)
{
    const sf_tokenizer *t = sf_engine_tokenizer(engine);
    const sf_gw_prompt *pr = p->kind == SF_GW_CHAT ? NULL : &p->prompts[which];
    sf_error err = { 0 };
    size_t nn = 0;
    *ids = NULL;
    if (pr && pr->ids) {
        int vocab = sf_tok_vocab_size(t);
        for (int i = 0; i < pr->n_ids; i++)
            if (pr->ids[i] >= vocab)
                return p->n_prompts > 1
                           ? sf_gw_fail(e, 400, "invalid_request_error", NULL, "prompt",
                                        "'prompt[%d][%d]' is token id %d; the vocabulary has %d tokens", which, i,
                                        pr->ids[i], vocab)
                           : sf_gw_fail(e, 400, "invalid_request_error", NULL, "prompt",
                                        "'prompt[%d]' is token id %d; the vocabulary has %d tokens", i, pr->ids[i], vocab);
        *ids = malloc(sizeof **ids * (size_t)(pr->n_ids ? pr->n_ids : 1));
        if (!*ids) return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(*ids, pr->ids, sizeof **ids * (size_t)pr->n_ids);
        *n = pr->n_ids;
        return SF_OK;
    }
    if (!t) return sf_gw_fail(e, 400, "invalid_request_error", NULL, "prompt",
                              "this model has no tokenizer; send the prompt as an array of token ids");
    int rc;
    if (p->kind == SF_GW_CHAT) {
        char *text = NULL;
        rc = sf_chat_render_tools(t, SF_CHAT_AUTO, p->msgs, p->n_msgs, p->add_generation_prompt, p->tools, &text, &err);
        if (rc) return sf_gw_fail(e, 400, "invalid_request_error", NULL, rc == SF_EUNSUPPORTED ? "tools" : "messages",
                                  "chat template: %s", err.msg);
        if (p->continue_final && (rc = sf_chat_continue_final(text, p->msgs[p->n_msgs - 1].content, &err))) {
            free(text);
            return sf_gw_fail(e, 400, "invalid_request_error", NULL, "continue_final_message", "%s", err.msg);
        }
        rc = sf_tok_encode(t, text, strlen(text), !starts_with_bos(t, text), ids, &nn, &err);
        free(text);
    } else {
        rc = sf_tok_encode(t, pr->text, pr->len, 1, ids, &nn, &err);
    }
    if (rc) return sf_gw_fail(e, 400, "invalid_request_error", NULL, p->kind == SF_GW_CHAT ? "messages" : "prompt",
                              "tokenizing the prompt: %s", err.msg);
    *n = (int)nn;
    return SF_OK;
}

static int check_model(sf_gateway *gw, struct evhttp_request *req, json_t *body)
{
    json_t *m = json_object_get(body, "model");
    if (!m || json_is_null(m)) return 0;
    if (!json_is_string(m)) return gw_error(req, 400, "invalid_request_error", NULL, "model", "'model' must be a string");
    if (strcmp(json_string_value(m), gw->model_name))
        return gw_error(req, 404, "invalid_request_error", "model_not_found", "model",
                        "the model '%.100s' does not exist; this server serves '%s'", json_string_value(m), gw->model_name);
    return 0;
}

static json_t *read_object(struct evhttp_request *req)
{
    size_t len;
    const char *body = gw_body(req, &len);
    json_error_t je;
    if (!body) {
        gw_error(req, 400, "invalid_request_error", NULL, NULL, "the request body is empty; send a JSON object");
        return NULL;
    }
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        gw_error(req, 400, "invalid_request_error", NULL, NULL, "the body is not valid JSON (line %d, column %d): %s",
                 je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        gw_error(req, 400, "invalid_request_error", NULL, NULL, "the body must be a JSON object");
        return NULL;
    }
    return o;
}

void gw_route_tokenize(sf_gateway *gw, struct evhttp_request *req, sf_engine *engine)
{
    json_t *o = read_object(req);
    if (!o) return;
    sf_gw_params p;
    sf_gw_err e = { 0 };
    int32_t *ids = NULL;
    int n = 0;
    if (check_model(gw, req, o)) goto done;
    /* reuse the completion/chat parsers for the prompt part; sampling fields are ignored */
    int kind = json_object_get(o, "messages") ? SF_GW_CHAT : SF_GW_COMPLETIONS;
    json_t *ast = json_object_get(o, "add_special_tokens");
    if (ast && !json_is_boolean(ast)) {
        gw_error(req, 400, "invalid_request_error", NULL, "add_special_tokens", "'add_special_tokens' must be true or false");
        goto done;
    }
    size_t len;
    const char *body = gw_body(req, &len);
    if (sf_gw_params_parse(kind, body, len, &p, &e)) {
        gw_send_error(req, &e, 0);
        goto done;
    }
    int rc = kind == SF_GW_COMPLETIONS && p.n_prompts > 1
                 ? sf_gw_fail(&e, 400, "invalid_request_error", NULL, "prompt", "/tokenize takes one prompt; this has %d",
                              p.n_prompts)
                 : gw_tokenize_prompt(engine, &p, 0, &ids, &n, &e);
    sf_gw_params_free(&p);
    if (rc) {
        gw_send_error(req, &e, 0);
        goto done;
    }
    const sf_tokenizer *t = sf_engine_tokenizer(engine);
    if (kind == SF_GW_COMPLETIONS && ast && json_is_false(ast) && n > 0 && ids[0] == sf_tok_bos(t)) {
        memmove(ids, ids + 1, sizeof *ids * (size_t)(n - 1)); /* vLLM: add_special_tokens false drops BOS */
        n--;
    }
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    gw_send_json(req, 200, json_pack("{s:i, s:i, s:o, s:n}", "count", n, "max_model_len", gw->max_model_len, "tokens",
                                     arr, "token_strs"));
done:
    free(ids);
    json_decref(o);
}

void gw_route_detokenize(sf_gateway *gw, struct evhttp_request *req, sf_engine *engine)
{
    json_t *o = read_object(req);
    if (!o) return;
    int32_t *ids = NULL;
    if (check_model(gw, req, o)) goto done;
    const sf_tokenizer *t = sf_engine_tokenizer(engine);
    json_t *toks = json_object_get(o, "tokens");
    if (!json_is_array(toks)) {
        gw_error(req, 400, "invalid_request_error", NULL, "tokens", "'tokens' must be an array of token ids");
        goto done;
    }
    if (!t) {
        gw_error(req, 400, "invalid_request_error", NULL, NULL, "this model has no tokenizer");
        goto done;
    }
    size_t n = json_array_size(toks), i;
    int vocab = sf_tok_vocab_size(t);
    ids = malloc(sizeof *ids * (n ? n : 1));
    json_t *x;
    json_array_foreach(toks, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= vocab) {
            gw_error(req, 400, "invalid_request_error", NULL, "tokens",
                     "'tokens[%zu]' must be a token id from 0 to %d", i, vocab - 1);
            goto done;
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    char *text = NULL;
    sf_error err = { 0 };
    if (sf_tok_decode(t, ids, n, 0, &text, &err)) {
        gw_error(req, 400, "invalid_request_error", NULL, "tokens", "decoding: %s", err.msg);
        goto done;
    }
    json_t *s = json_stringn_nocheck(text, strlen(text));
    free(text);
    gw_send_json(req, 200, json_pack("{s:o}", "prompt", s));
done:
    free(ids);
    json_decref(o);
}
