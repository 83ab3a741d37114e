/* http.c — response helpers: JSON bodies and OpenAI-shaped errors. Worker threads only. */
#include "gw-impl.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/keyvalq_struct.h>

const char *gw_status_reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    }
    return "Error";
}

void gw_send_json(struct evhttp_request *req, int status, json_t *body)
{
    struct evbuffer *buf = evbuffer_new();
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!buf || !text) {
        free(text);
        if (buf) evbuffer_free(buf);
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    evbuffer_add(buf, text, strlen(text));
    evbuffer_add(buf, "\n", 1);
    free(text);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, status, gw_status_reason(status), buf);
    evbuffer_free(buf);
}

void gw_send_error(struct evhttp_request *req, const sf_gw_err *e, double retry_after_s)
{
    json_t *err = json_pack("{s:o, s:s, s:o, s:o}", "message", gw_json_text(e->msg, strlen(e->msg)), "type", e->type ? e->type : "invalid_request_error",
                            "param", e->param[0] ? json_string(e->param) : json_null(),
                            "code", e->code ? json_string(e->code) : json_null());
    if (!err) {
        /* e->msg is always UTF-8 we wrote, but a client string echoed into it may be cut
         * mid-character by the message buffer; fall back to a message without it */
        err = json_pack("{s:s, s:s, s:n, s:n}", "message", gw_status_reason(e->status), "type",
                        e->type ? e->type : "invalid_request_error", "param", "code");
    }
    if (e->status == 429 || e->status == 503) {
        char ra[32];
        snprintf(ra, sizeof ra, "%d", (int)ceil(retry_after_s > 1 ? retry_after_s : 1));
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", ra);
    }
    gw_send_json(req, e->status, json_pack("{s:o}", "error", err));
}

int gw_error(struct evhttp_request *req, int status, const char *type, const char *code, const char *param,
             const char *fmt, ...)
{
    sf_gw_err e = { .status = status, .type = type, .code = code };
    snprintf(e.param, sizeof e.param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    gw_send_error(req, &e, 1);
    return status;
}

const char *gw_body(struct evhttp_request *req, size_t *len)
{
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    *len = evbuffer_get_length(b);
    if (*len == 0) return NULL;
    return (const char *)evbuffer_pullup(b, -1);
}

const char *gw_header(struct evhttp_request *req, const char *name)
{
    return evhttp_find_header(evhttp_request_get_input_headers(req), name);
}

json_t *gw_json_text(const char *s, size_t n)
{
    /* engine text is whole UTF-8 sequences by contract; anything else (a model emitting a lone
     * byte-fallback token) is replaced with U+FFFD rather than failing the response */
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *buf = malloc(n * 3 + 1);
    if (!buf) return json_string("");
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len && i + len <= n && c != 0;
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)s[i + k] >> 6) == 2;
        if (ok && len > 1) { /* overlong forms and surrogates: let jansson judge the sequence */
            json_t *t = json_stringn(s + i, len);
            ok = t != NULL;
            json_decref(t);
        }
        if (ok) {
            memcpy(buf + o, s + i, len);
            o += len;
            i += len;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    j = json_stringn(buf, o);
    free(buf);
    return j ? j : json_string("");
}
