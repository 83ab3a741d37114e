/* engine_collect.h — one request's events gathered for a test: tokens, text, finish reason,
 * usage, logprob checks; an optional self-cancel after n tokens. The engine thread writes
 * (on_event), the test thread waits (collect_wait). Header-only: include it once per test
 * binary. */
#ifndef SF_TESTS_ENGINE_COLLECT_H
#define SF_TESTS_ENGINE_COLLECT_H

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "../../engine/engine.h"

#define MAXTOK 512 /* tokens kept per request */

/* Collects one request's events; the engine thread writes, the test thread waits. */
typedef struct collect {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int32_t tokens[MAXTOK];
    int n_tokens;
    char text[8192];
    size_t text_len;
    int finish, status, prompt_tokens, completion_tokens, cached_tokens;
    char message[256]; /* SF_EV_ERROR's */
    double ttft, e2e;
    int n_top_seen, top_sorted, lp_ok;
    sf_engine *cancel_engine; /* cancel itself after cancel_after tokens */
    int cancel_after;
    int order; /* 1 + how many requests of the binary finished before this one */
    float lp[MAXTOK];                 /* each token's logprob */
    sf_logprob top[MAXTOK][5];        /* and its first 5 alternatives */
    /* SF_EV_PROMPT: how many came (1 is right), before which token, and what it said */
    int n_prompt_ev, prompt_ev_at, n_plp, plk;
    int32_t pids[MAXTOK], prank[MAXTOK];
    float plp[MAXTOK];
    sf_logprob ptop[MAXTOK][5];
} collect;

static int collect_finished; /* requests finished so far (collect.order) */

static void collect_init(collect *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->top_sorted = c->lp_ok = 1;
}

static void on_event(const sf_event *ev)
{
    collect *c = ev->user;
    pthread_mutex_lock(&c->mu);
    if (ev->text_len && c->text_len + ev->text_len < sizeof c->text) {
        memcpy(c->text + c->text_len, ev->text, ev->text_len);
        c->text_len += ev->text_len;
        c->text[c->text_len] = 0;
    }
    if (ev->type == SF_EV_PROMPT) {
        c->n_prompt_ev++;
        c->prompt_ev_at = c->n_tokens;
        c->n_plp = ev->n_prompt_lp < MAXTOK ? ev->n_prompt_lp : MAXTOK;
        c->plk = ev->prompt_k;
        for (int i = 0; i < c->n_plp; i++) {
            c->pids[i] = ev->prompt_ids[i];
            c->plp[i] = ev->prompt_lp[i];
            c->prank[i] = ev->prompt_rank[i];
            for (int k = 0; k < ev->prompt_k && k < 5; k++) c->ptop[i][k] = ev->prompt_top[(size_t)i * ev->prompt_k + k];
        }
    } else if (ev->type == SF_EV_TOKEN) {
        if (c->n_tokens < MAXTOK) {
            c->lp[c->n_tokens] = ev->logprob;
            for (int k = 0; k < ev->n_top && k < 5; k++) c->top[c->n_tokens][k] = ev->top[k];
            c->tokens[c->n_tokens++] = ev->token;
        }
        if (!(ev->logprob <= 0.0f)) c->lp_ok = 0;
        if (ev->n_top) {
            c->n_top_seen = ev->n_top;
            for (int i = 1; i < ev->n_top; i++)
                if (ev->top[i].logprob > ev->top[i - 1].logprob) c->top_sorted = 0;
        }
        if (c->cancel_engine && c->n_tokens == c->cancel_after) sf_engine_cancel(c->cancel_engine, ev->req);
    } else {
        c->finish = ev->type == SF_EV_DONE ? ev->finish_reason : -1;
        c->status = ev->type == SF_EV_ERROR ? ev->status : SF_OK;
        if (ev->type == SF_EV_ERROR) snprintf(c->message, sizeof c->message, "%s", ev->message ? ev->message : "");
        c->prompt_tokens = ev->prompt_tokens;
        c->completion_tokens = ev->completion_tokens;
        c->cached_tokens = ev->cached_tokens;
        c->ttft = ev->ttft_s;
        c->e2e = ev->e2e_s;
        c->order = __atomic_add_fetch(&collect_finished, 1, __ATOMIC_SEQ_CST);
        c->done = 1;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

static void collect_wait(collect *c)
{
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

#endif
