/* gw-request.h — one generation request inside the gateway (internal to gateway/).
 *
 * Threads: the handler and everything touching evhttp run on the request's worker thread.
 * The engine's callback (gw_req_on_event, engine thread) only copies each event into the
 * request's queue under req->mu and activates req->wake, an event on the worker's base; the
 * worker drains the queue in gw_req_on_wake and writes SSE chunks or the whole response.
 *
 * Lifetime of a gw_req: freed on the worker once (a) every submitted choice delivered its
 * DONE/ERROR and the worker processed it, and (b) the HTTP side is finished (reply ended, or
 * the connection closed). A closed connection cancels the choices still running. */
#ifndef SF_GW_REQUEST_H
#define SF_GW_REQUEST_H

#include "gw-impl.h"

/* SF_EV_PROMPT copied out of the engine: n prompt positions, k alternatives each */
typedef struct gw_plp {
    int n, k;
    int32_t *ids, *rank;
    float *lp;
    sf_logprob *top;           /* [n * k] */
} gw_plp;

typedef struct gw_ev {
    int choice, type;
    gw_plp *plp;               /* SF_EV_PROMPT */
    int32_t token;
    char *text;
    size_t text_len;
    float logprob;
    int n_top;
    sf_logprob top[SF_MAX_LOGPROBS];
    int finish, prompt_tokens, completion_tokens, cached_tokens;
    double e2e_s;              /* engine: submit to this DONE */
    char *message;
    int status;                /* SF_EV_ERROR: the engine's SF_E* */
    double t;                  /* sf_now_s() when the engine delivered it */
} gw_ev;

#define GW_MAX_UNSENT (4u << 20) /* bytes of stream a client may leave unread */

struct gw_req;
typedef struct gw_choice {
    struct gw_req *req;
    int idx;
    sf_request *r;
    int engine_done;           /* set by the engine thread under req->mu with its last event */
    int done;                  /* the worker processed the last event */
    int finish;
    int completion_tokens;
    int cached_tokens;         /* its prompt's tokens found in the prefix cache */
    double last_t;
    char *text;                /* whole responses: the text so far */
    size_t len, cap;
    json_t *lp;                /* whole responses with logprobs: accumulated */
    json_t *calls;             /* tools: the calls read from the reply (NULL: a plain reply) */
    char *said;                /* tools: the reply's text before its calls (malloc'd, or NULL) */
    int held;                  /* tools, streamed: 0 the reply's start is held until it shows what it is,
                                * 1 held to the end (it starts as a call), 2 streamed (it does not) */
    json_t *plp;               /* whole responses: vLLM's prompt_logprobs (NULL: not asked for) */
    char *echo;                /* echo: its prompt's text (malloc'd) */
    size_t echo_len;
    char *error;
    int error_status;          /* its SF_E*: SF_ENOFIT is the request's (no token continues its form) */
} gw_choice;

typedef struct gw_req {
    gw_worker *w;
    sf_gateway *gw;
    sf_engine *engine;
    struct evhttp_request *http; /* NULL once answered or the connection closed */
    struct evhttp_connection *conn;
    int kind, stream, include_usage, n, logprobs, top_logprobs;
    int per_prompt;            /* choices of each prompt (the request's n): ch[i] is prompt i / per_prompt's */
    int echo;                  /* completions: each choice's output follows its prompt's text (gw_choice.echo) */
    int scored;                /* the engine scores the prompt: an SF_EV_PROMPT comes before the tokens */
    int prompt_logprobs;       /* vLLM's prompt_logprobs asked for: its alternatives (-1: not asked) */
    int tokens_as_ids;         /* logprobs name tokens "token_id:<id>" (vLLM's return_tokens_as_token_ids) */
    int tools;                 /* replies are read for tool calls (SF_GW_TOOLS_*, NONE: not read) */
    char id[48];
    long created;
    sf_tenant *tenant;
    sf_intent intent;
    double t0;
    double t_submitted;        /* sf_now_s() after the last submit */
    double engine_s;           /* longest engine time (submit to DONE) among the choices */
    int prompt_tokens;
    int first_token;
    int text_offset;
    int engine_refs;           /* choices submitted whose DONE/ERROR the worker has not processed */
    int answered;              /* the response is complete (or abandoned) */
    int status;
    int cancelled;
    int slow;                  /* the client reads slower than we write: drop it (on_wake) */
    /* engine -> worker */
    pthread_mutex_t mu;
    gw_ev *q;
    int qn, qcap;
    int wake_pending;
    struct event *wake;
    struct event *hup;         /* EV_CLOSED on the client socket while waiting */
    gw_choice ch[];
} gw_req;

/* engine thread: the sf_submit callback (user = &req->ch[i]) */
void gw_req_on_event(const sf_event *ev);
/* worker thread */
void gw_req_on_wake(evutil_socket_t fd, short what, void *arg);         /* req->wake */
void gw_req_on_close(struct evhttp_connection *conn, void *arg);        /* connection close callback */
void gw_req_on_hup(evutil_socket_t fd, short what, void *arg);          /* EV_CLOSED on the client socket */
void gw_req_start_stream(gw_req *r);     /* 200 + SSE headers (+ the chat role chunks, an echo not waiting for scores) */
void gw_req_echo_whole(gw_req *r);       /* whole responses with echo: each choice's text starts with the prompt */
void gw_req_cancel_running(gw_req *r);   /* cancel choices the engine has not finished */
void gw_req_free(gw_req *r);
void gw_plp_free(gw_plp *p);
void gw_req_maybe_free(gw_req *r);       /* frees when nothing runs and the HTTP side is done */

#endif
