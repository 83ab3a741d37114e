/* request.h — one request inside the engine: its sequence, sampler state, streaming
 * detokenizer, stop-string matcher and the events it delivers. Internal to engine/.
 *
 * Lifetime: created by sf_engine_submit (any thread), then touched only by the engine thread
 * until its SF_EV_DONE / SF_EV_ERROR callback returns, after which the engine frees it. The one
 * field other threads write is `cancel` (atomic). */
#ifndef SF_REQUEST_H
#define SF_REQUEST_H

#include <stdatomic.h>

#include "engine.h"
#include "json_mask.h"
#include "sampler.h"
#include "scheduler.h"
#include "tokenizer.h"

struct sf_request {
    sf_seq seq;                 /* first: the scheduler's view (seq.owner == this) */
    sf_sampling sp;             /* copy; stop strings owned */
    sf_sampler_seq ss;
    sf_detok detok;
    const sf_tokenizer *tok;
    char *text;                 /* detokenized text not yet delivered (held back for stop strings) */
    size_t text_len;
    sf_event_cb cb;
    void *user;
    char tenant[64];
    int max_out;                /* output tokens at most */
    int n_out;                  /* output tokens so far */
    int had_token;              /* first token delivered (TTFT taken) */
    double t_submit, t_first;   /* sf_now_s clock */
    atomic_int cancel;
    struct sf_request *next_in; /* engine inbox link */
    int taken_slot;             /* engine thread: 1 + its entry among the tokens taken and not yet delivered; 0: none */
    sf_json json;               /* JSON output (sp.json): where the output stands in its object */
    sf_jschema *schema;         /* its schema, NULL: any object */
    /* prompt scoring (sp.prompt_logprobs): position i's log-probability, rank and top plk
     * (arrays of seq.n_prompt; i = 0 has none), filled as the steps that compute them are taken */
    float *plp;
    int32_t *prank;
    sf_logprob *ptop;
    int plk;
    int prompt_sent;            /* SF_EV_PROMPT delivered */
    int placed;                 /* engine thread, async scheduling: 1 + its logit row in the step in flight whose
                                 * id is still to come, when a stand-in for that id ends seq.tokens (the next step
                                 * was planned with it); 0: none */
};

/* Validate s against the model and copy it into a new request (sampler, detokenizer ready).
 * Any thread. SF_EINVAL with a message naming the bad value; SF_ENOMEM. */
int sf_request_new(const sf_submit *s, const sf_tokenizer *tok, int vocab, int max_model_len,
                   sf_request **out, sf_error *err);
void sf_request_free(sf_request *r);

/* What handling a sampled token decided. */
enum { SF_REQ_CONTINUE = 0, SF_REQ_FINISHED = 1 };

/* Engine thread: the model produced `id` for r (logprob and top as the sampler gave them),
 * handled in two halves so that the next step can be planned before the text work. take
 * records `id` (sampler state, the sequence's tokens) and says whether the token ends r
 * whatever its text: SF_REQ_CONTINUE, or SF_REQ_END_* (EOS, a stop id, max_tokens or context
 * end, out of memory) — r must then not be planned again. EOS is not shown; a stop id is (its
 * text, empty for a special token, as vLLM's stop_token_ids). deliver then does the rest for that
 * id with take's answer (`end`): SF_EV_TOKEN with the text that is safe to show, stop strings,
 * SF_EV_DONE; it returns SF_REQ_FINISHED when r is done (a stop string may end r although take
 * did not; the caller then removes r from the scheduler and frees it). */
enum { SF_REQ_END_STOP = 2, SF_REQ_END_LENGTH = 3, SF_REQ_END_ERROR = 4, SF_REQ_END_STOP_ID = 5,
       SF_REQ_END_PROMPT = 6, /* sp.prompt_only: the prompt is done, the id is dropped */
       SF_REQ_END_NO_FIT = 7  /* sp.json: no token of the vocabulary continues the form (a pattern or a
                               * choice needing a character no token has); an error, the id dropped */ };
int sf_request_take(sf_request *r, int32_t id);
/* Engine thread: the logits of prompt position pos (< seq.n_prompt - 1) came: score the token
 * after it (sp.prompt_logprobs). row: [vocab], raw. */
void sf_request_score(sf_request *r, int pos, const float *row, int vocab);
/* The same, scored elsewhere (the backend's score op): the token's log-probability, its rank
 * and k top entries (ids, log-probabilities; an id < 0 ends them), of which r keeps its own. */
void sf_request_score_put(sf_request *r, int pos, float lp, int32_t rank, const int32_t *top_id, const float *top_lp,
                          int k);
/* Async scheduling: whether r may be planned before its next id is known, with a stand-in for
 * it: the id cannot decide r's length (max_tokens, context) nor its draw's penalties (a form's
 * mask is computed once the id is in: step.c, form_masks). */
int sf_request_may_place(const sf_request *r);
int sf_request_deliver(sf_request *r, int32_t id, int end, float logprob, const sf_logprob *top, int n_top);

/* Engine thread: deliver SF_EV_DONE with this reason (flushing held-back text unless
 * cancelled), or SF_EV_ERROR when status != SF_OK. */
void sf_request_finish(sf_request *r, int reason, int status, const char *message);

#endif
