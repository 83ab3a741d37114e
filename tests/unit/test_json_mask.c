/* test_json_mask.c — JSON mode's recognizer and token mask (engine/json_mask.c):
 *  - documents written here, valid and not, whole, split at every byte, and every prefix of
 *    the valid ones (each must stay feedable: the mask never corners the model);
 *  - random objects from a generator (nesting, escapes, surrogate pairs, UTF-8, every number
 *    form), then mutated byte by byte: the recognizer's verdict against jansson's parser;
 *  - the mask over real vocabularies (TinyLlama's SentencePiece, GPT-2's byte-level BPE). */
#include <jansson.h>
#include <math.h>
#include <time.h>

#include "engine/json_mask.h"
#include "engine/tokenizer.h"
#include "tests/test.h"

static int whole(const char *s, size_t n)
{
    sf_json j;
    sf_json_init(&j);
    return sf_json_feed(&j, s, n) && sf_json_done(&j);
}

static const char *const valid[] = {
    "{}", " {} ", "\n{\"a\":1}", "{\"a\": [1, 2.5, -3e10, 0, -0.0, 1E+2, 2e-3]}", "{\"\":\"\"}",
    "{\"k\": {\"n\": null, \"t\": true, \"f\": false}}", "{\"a\":[[],[{}],[[[]]]]}",
    "{\"s\": \"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00\"}", "{\"u\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}",
    "{ \"a\" : 1 , \"b\" : [ 1 , { } ] }\n\n", "{\"z\":\"\\u0000\"}", "{\"n\": 123456789012}",
};

static const char *const invalid[] = {
    "", "[]", "1", "\"x\"", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{,}", "{\"a\":01}", "{\"a\":1.}",
    "{\"a\":.5}", "{\"a\":-}", "{\"a\":1e}", "{\"a\":tru}", "{\"a\":True}", "{\"a\":[1,]}", "{\"a\":[,1]}",
    "{a:1}", "{'a':1}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12G4\"}", "{\"a\":\"\\uDE00\"}", "{\"a\":\"\\uD83D\"}",
    "{\"a\":\"\\uD83Dx\"}", "{\"a\":\"\t\"}", "{\"a\":\"\xc3\"}", "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}",
    "{\"a\":\"\xf4\x90\x80\x80\"}", "{} {}", "{}x", "{\"a\":1}]", "{\"a\":[}", "{\"a\":NaN}", "{\"a\":+1}",
};

TEST(documents)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(valid); i++) {
        const char *s = valid[i];
        size_t n = strlen(s);
        if (!strcmp(s, "{\"z\":\"\\u0000\"}")) n = strlen(s); /* an escaped NUL is JSON */
        CHECK_MSG(whole(s, n), "valid document refused: %s", s);
        for (size_t k = 0; k <= n; k++) { /* split in two feeds at k; every prefix feedable */
            sf_json j;
            sf_json_init(&j);
            int a = sf_json_feed(&j, s, k);
            int b = a && sf_json_feed(&j, s + k, n - k) && sf_json_done(&j);
            CHECK_MSG(a && b, "valid document refused when split at %zu: %s", k, s);
        }
    }
    for (size_t i = 0; i < SF_ARRAY_LEN(invalid); i++)
        CHECK_MSG(!whole(invalid[i], strlen(invalid[i])), "invalid document accepted: %s", invalid[i]);
    /* nesting stops at SF_JSON_MAX_DEPTH */
    char deep[2 * SF_JSON_MAX_DEPTH + 8];
    size_t n = 0;
    deep[n++] = '{';
    memcpy(deep + n, "\"a\":", 4);
    n += 4;
    for (int d = 1; d < SF_JSON_MAX_DEPTH; d++) deep[n++] = '[';
    sf_json j;
    sf_json_init(&j);
    CHECK(sf_json_feed(&j, deep, n) && j.depth == SF_JSON_MAX_DEPTH && !sf_json_feed(&j, "[", 1));
    /* whitespace runs stop at SF_JSON_MAX_WS bytes, inside strings they do not count */
    char pad[SF_JSON_MAX_WS + 1];
    memset(pad, ' ', sizeof pad);
    pad[0] = '\n';
    sf_json_init(&j);
    CHECK(sf_json_feed(&j, "{", 1) && sf_json_feed(&j, pad, SF_JSON_MAX_WS) && !sf_json_feed(&j, " ", 1));
    sf_json_init(&j);
    CHECK(sf_json_feed(&j, pad, SF_JSON_MAX_WS) && sf_json_feed(&j, "{\"", 2) && sf_json_feed(&j, pad + 1, sizeof pad - 1) &&
          sf_json_feed(&j, "\":", 2) && sf_json_feed(&j, pad, SF_JSON_MAX_WS) && sf_json_feed(&j, "1}", 2) && sf_json_done(&j));
}

/* ---- random objects ------------------------------------------------------------------------ */
static sf_rng R;
static int rnd(int n) { return (int)(sf_rng_next(&R) % (uint64_t)n); }

typedef struct sbuf { char b[8192]; size_t n; } sbuf;
static void put(sbuf *s, const char *p) { size_t l = strlen(p); if (s->n + l < sizeof s->b) { memcpy(s->b + s->n, p, l); s->n += l; } }
static void ws(sbuf *s) { static const char *w[] = { "", "", " ", "\n", "\t", "\r\n  " }; put(s, w[rnd(6)]); }

static void gen_string(sbuf *s)
{
    static const char *parts[] = { "a", "key", "x y", "\\\"", "\\\\", "\\/", "\\n", "\\t", "\\u00e9", "\\u20AC",
                                   "\\uD83D\\uDE00", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "0", "{}", "[,]" };
    put(s, "\"");
    for (int i = rnd(4); i > 0; i--) put(s, parts[rnd((int)SF_ARRAY_LEN(parts))]);
    put(s, "\"");
}

static void gen_value(sbuf *s, int depth);

static void gen_object(sbuf *s, int depth)
{
    put(s, "{");
    ws(s);
    int n = depth > 3 ? 0 : rnd(4);
    for (int i = 0; i < n; i++) {
        if (i) { put(s, ","); ws(s); }
        gen_string(s);
        ws(s);
        put(s, ":");
        ws(s);
        gen_value(s, depth + 1);
        ws(s);
    }
    put(s, "}");
}

static void gen_value(sbuf *s, int depth)
{
    static const char *nums[] = { "0", "-0", "7", "-12", "3.25", "-0.5", "1e5", "2E-3", "6.02e+23", "10", "0.000" };
    static const char *lit[] = { "true", "false", "null" };
    switch (rnd(depth > 3 ? 3 : 5)) {
    case 0: put(s, nums[rnd((int)SF_ARRAY_LEN(nums))]); break;
    case 1: put(s, lit[rnd(3)]); break;
    case 2: gen_string(s); break;
    case 3: gen_object(s, depth); break;
    default: {
        put(s, "[");
        ws(s);
        int n = rnd(4);
        for (int i = 0; i < n; i++) {
            if (i) { put(s, ","); ws(s); }
            gen_value(s, depth + 1);
            ws(s);
        }
        put(s, "]");
    }
    }
}

/* jansson's verdict: a top-level object, the whole text, RFC numbers; 0/1, or -1 when it
 * refuses for a reason outside the grammar (a number too large for its types) */
static int jansson_ok(const char *s, size_t n)
{
    json_error_t e;
    json_t *v = json_loadb(s, n, JSON_ALLOW_NUL, &e);
    if (!v) return strstr(e.text, "overflow") || strstr(e.text, "too big") ? -1 : 0;
    int ok = json_is_object(v);
    json_decref(v);
    return ok;
}

TEST(random_against_jansson)
{
    sf_rng_seed(&R, 11);
    static const char alphabet[] = "{}[]:,\"\\u0129-.eE+ tfnlrasx\t\n\x01\xc3\xa9\xed\xa0\x80\xff";
    int agree = 0, valid_seen = 0, skipped = 0, generated_ok = 0;
    for (int it = 0; it < 6000; it++) {
        sbuf s = { .n = 0 };
        ws(&s);
        gen_object(&s, 0);
        ws(&s);
        if (it % 3 == 0) { /* the generator's own output: valid */
            int ok = whole(s.b, s.n);
            generated_ok += ok;
            CHECK_MSG(ok && jansson_ok(s.b, s.n) == 1, "generated object: ours %d jansson %d: %.*s", ok,
                      jansson_ok(s.b, s.n), (int)s.n, s.b);
            continue;
        }
        for (int m = 1 + rnd(2); m > 0 && s.n > 0; m--) { /* mutate: replace, insert or delete a byte */
            size_t at = (size_t)rnd((int)s.n);
            int op = rnd(3);
            char c = alphabet[rnd((int)sizeof alphabet - 1)];
            if (op == 0) s.b[at] = c;
            else if (op == 1 && s.n + 1 < sizeof s.b) { memmove(s.b + at + 1, s.b + at, s.n - at); s.b[at] = c; s.n++; }
            else { memmove(s.b + at, s.b + at + 1, s.n - at - 1); s.n--; }
        }
        int want = jansson_ok(s.b, s.n);
        if (want < 0) { skipped++; continue; }
        int got = whole(s.b, s.n);
        valid_seen += want;
        agree += got == want;
        CHECK_MSG(got == want, "ours %d, jansson %d: %.*s", got, want, (int)s.n, s.b);
    }
    printf("  %d generated objects accepted; %d mutated texts agree with jansson (%d of them valid), %d skipped\n",
           generated_ok, agree, valid_seen, skipped);
    CHECK(valid_seen > 100);
}

/* ---- the mask over real vocabularies ------------------------------------------------------- */
static int32_t tok_of(const sf_tokenizer *t, const char *text)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int32_t id = -1;
    if (sf_tok_encode(t, text, strlen(text), 0, &ids, &n, NULL) == SF_OK && n == 1) id = ids[0];
    free(ids);
    return id;
}

static void check_vocab(const char *dir)
{
    sf_tokenizer *t = NULL;
    sf_error err = { 0 };
    REQUIRE(sf_tok_load_dir(test_data(dir), &t, &err) == SF_OK, "%s: %s", dir, err.msg);
    int V = sf_tok_vocab_size(t) + 3; /* a logits row wider than the vocabulary, as models pad it */
    sf_json_vocab *v = NULL;
    double t0 = (double)clock() / CLOCKS_PER_SEC;
    REQUIRE(sf_json_vocab_new(t, V, &v, &err) == SF_OK, "%s: %s", dir, err.msg);
    double t1 = (double)clock() / CLOCKS_PER_SEC;
    float *l = malloc(sizeof(float) * V);
    sf_json j;
    sf_json_init(&j);
    /* at the start only text made of whitespace and a '{' may come: "{" is one of them */
    for (int i = 0; i < V; i++) l[i] = 0;
    int kept = sf_json_mask(&j, v, l);
    int32_t brace = tok_of(t, "{"), quote = tok_of(t, "\""), eos = sf_tok_eos(t);
    CHECK_MSG(kept > 0 && brace >= 0 && l[brace] == 0 && eos >= 0 && isinf(l[eos]), "%s: start: %d kept", dir, kept);
    CHECK_MSG(quote < 0 || isinf(l[quote]), "%s: a quote at the start", dir);
    for (int i = V - 3; i < V; i++) CHECK_MSG(isinf(l[i]), "%s: padding id %d kept", dir, i);
    /* in an object after a number: digits, '.', 'e', ',', '}' and whitespace start what may come */
    CHECK(sf_json_feed(&j, "{\"a\": 1", 7));
    for (int i = 0; i < V; i++) l[i] = 0;
    double t2 = (double)clock() / CLOCKS_PER_SEC;
    kept = sf_json_mask(&j, v, l);
    double t3 = (double)clock() / CLOCKS_PER_SEC;
    int32_t close = tok_of(t, "}");
    CHECK_MSG(close >= 0 && l[close] == 0 && (quote < 0 || isinf(l[quote])) && isinf(l[eos]), "%s: after a number", dir);
    /* inside a string most tokens fit */
    sf_json js = j;
    CHECK(sf_json_feed(&js, ", \"b\": \"", 8));
    for (int i = 0; i < V; i++) l[i] = 0;
    double t4 = (double)clock() / CLOCKS_PER_SEC;
    int in_str = sf_json_mask(&js, v, l);
    double t5 = (double)clock() / CLOCKS_PER_SEC;
    CHECK_MSG(in_str > V / 2, "%s: %d of %d tokens fit inside a string", dir, in_str, V);
    /* accept advances exactly as the text does; a token that does not fit leaves j alone */
    CHECK(sf_json_accept(&j, v, close) && sf_json_done(&j));
    sf_json before = j;
    CHECK(!sf_json_accept(&j, v, brace) && !memcmp(&before, &j, sizeof j));
    /* complete: only end-of-generation tokens remain, and they leave j as it is */
    for (int i = 0; i < V; i++) l[i] = 0;
    kept = sf_json_mask(&j, v, l);
    int n_eog = 0;
    for (int i = 0; i < V - 3; i++) n_eog += sf_tok_is_eog(t, i);
    CHECK_MSG(kept == n_eog && l[eos] == 0, "%s: complete: %d kept, %d end tokens", dir, kept, n_eog);
    CHECK(sf_json_accept(&j, v, eos) && sf_json_done(&j));
    printf("  %s: %d ids, texts built in %.0f ms; mask %.2f ms after a number, %.2f ms in a string (%d fit)\n",
           dir, V, (t1 - t0) * 1e3, (t3 - t2) * 1e3, (t5 - t4) * 1e3, in_str);
    free(l);
    sf_json_vocab_free(v);
    sf_tok_free(t);
}

TEST(mask_real_vocabularies)
{
    check_vocab("tinyllama-1.1b-chat-v1.0");
    check_vocab("gpt2-tokenizer");
}

int main(void)
{
    RUN(documents);
    RUN(random_against_jansson);
    RUN(mask_real_vocabularies);
    return test_summary();
}
