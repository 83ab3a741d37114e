/* test_json_mask.c — JSON mode's recognizer and token mask (engine/json_mask.c):
 *  - documents written here, valid and not, whole, split at every byte, and every prefix of
 *    the valid ones (each must stay feedable: the mask never corners the model);
 *  - random objects from a generator (nesting, escapes, surrogate pairs, UTF-8, every number
 *    form), then mutated byte by byte: the recognizer's verdict against jansson's parser;
 *  - the mask over real vocabularies (TinyLlama's SentencePiece, GPT-2's byte-level BPE);
 *  - choices (guided_choice): the list's checks, the recognizer, and random draws through the
 *    mask over both vocabularies that must each end on one of the strings;
 *  - patterns (guided_regex): random draws through the mask over both vocabularies, each output
 *    a whole match by PCRE2's verdict, the mask equal to feeding each token alone. */
#include <jansson.h>
#include <math.h>
#include <time.h>

#include "engine/json_mask.h"
#include "engine/tokenizer.h"
#include "tests/lib/pcre_ref.h"
#include "tests/test.h"

static int whole(const char *s, size_t n)
{
    sf_json j;
    sf_json_init(&j, NULL);
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
            sf_json_init(&j, NULL);
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
    sf_json_init(&j, NULL);
    CHECK(sf_json_feed(&j, deep, n) && j.depth == SF_JSON_MAX_DEPTH && !sf_json_feed(&j, "[", 1));
    /* whitespace runs stop at SF_JSON_MAX_WS bytes, inside strings they do not count */
    char pad[SF_JSON_MAX_WS + 1];
    memset(pad, ' ', sizeof pad);
    pad[0] = '\n';
    sf_json_init(&j, NULL);
    CHECK(sf_json_feed(&j, "{", 1) && sf_json_feed(&j, pad, SF_JSON_MAX_WS) && !sf_json_feed(&j, " ", 1));
    sf_json_init(&j, NULL);
    CHECK(sf_json_feed(&j, pad, SF_JSON_MAX_WS) && sf_json_feed(&j, "{\"", 2) && sf_json_feed(&j, pad + 1, sizeof pad - 1) &&
          sf_json_feed(&j, "\":", 2) && sf_json_feed(&j, pad, SF_JSON_MAX_WS) && sf_json_feed(&j, "1}", 2) && sf_json_done(&j));
}

/* ---- random objects ------------------------------------------------------------------------ */
static sf_rng R;
static int rnd(int n) { return (int)(sf_rng_next(&R) % (uint64_t)n); }

typedef struct sbuf { char b[8192]; size_t n; } sbuf;
static void put(sbuf *s, const char *p) { size_t l = strlen(p); if (s->n + l < sizeof s->b) { memcpy(s->b + s->n, p, l); s->n += l; } }
static void ws(sbuf *s) { static const char *w[] = { "", "", " ", "\n", "\t", "\r\n  " }; put(s, w[rnd(6)]); }

/* one or two bytes replaced, inserted or deleted, the new ones from alphabet */
static void mutate(sbuf *s, const char *alphabet, size_t n_alpha)
{
    for (int m = 1 + rnd(2); m > 0 && s->n > 0; m--) {
        size_t at = (size_t)rnd((int)s->n);
        int op = rnd(3);
        char c = alphabet[rnd((int)n_alpha)];
        if (op == 0) s->b[at] = c;
        else if (op == 1 && s->n + 1 < sizeof s->b) { memmove(s->b + at + 1, s->b + at, s->n - at); s->b[at] = c; s->n++; }
        else { memmove(s->b + at, s->b + at + 1, s->n - at - 1); s->n--; }
    }
}

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
        mutate(&s, alphabet, sizeof alphabet - 1);
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

/* ---- schemas ----------------------------------------------------------------------------------- */
static const char *const person =
    "{\"type\": \"object\", \"title\": \"p\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"description\": \"full name\"},"
    "\"age\": {\"type\": \"integer\"},"
    "\"score\": {\"type\": [\"number\", \"null\"]},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a\", \"bb\", \"b\", true, null]}, \"minItems\": 1, \"maxItems\": 3},"
    "\"addr\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"zip\": {\"const\": \"x\\u00e9\"}},"
    "           \"required\": [\"zip\"], \"additionalProperties\": false},"
    "\"extra\": {\"type\": \"object\"},"
    "\"any\": {}"
    "}, \"required\": [\"name\", \"age\", \"tags\"], \"additionalProperties\": false}";

static int with_schema(const sf_jschema *sc, const char *s)
{
    sf_json j;
    sf_json_init(&j, sc);
    return sf_json_feed(&j, s, strlen(s)) && sf_json_done(&j);
}

TEST(schema_compile)
{
    sf_jschema *sc = NULL;
    sf_error err = { 0 };
    CHECK_MSG(sf_jschema_compile(person, strlen(person), &sc, &err) == SF_OK, "%s", err.msg);
    sf_jschema_free(sc);
    static const struct { const char *schema, *says; } bad[] = {
        { "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"minLength\": 1}}}", "'minLength' at $.properties.a" },
        { "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": 1}}}", "'pattern' at $.properties.a must be a string" },
        { "{\"type\": \"object\", \"properties\": {\"a\": {\"pattern\": \"x\", \"enum\": [\"x\"]}}}", "with 'enum'" },
        { "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"a(?=b)\"}}}", "'pattern' at $.properties.a: regex: lookaround" },
        { "{\"type\": \"object\", \"properties\": {\"a\": {\"anyOf\": []}}}", "'anyOf'" },
        { "{\"type\": \"object\", \"properties\": {\"a\": {\"$ref\": \"#/x\"}}}", "'$ref'" },
        { "{\"type\": \"object\", \"additionalProperties\": true}", "additionalProperties" },
        { "{\"type\": \"array\"}", "root" },
        { "{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": [1, 2]}}}", "strings, booleans or null" },
        { "{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}", "required[0]" },
        { "{\"type\": \"object\", \"properties\": {\"a\\\"b\": {}}}", "property name" },
        { "{\"type\": \"objekt\"}", "not a JSON type" },
        { "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}}}", "minItems" },
        { "[1]", "$ must be an object" },
        { "{\"type\": ", "not JSON" },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(bad); i++) {
        sc = NULL;
        int rc = sf_jschema_compile(bad[i].schema, strlen(bad[i].schema), &sc, &err);
        CHECK_MSG(rc == SF_EINVAL && !sc && strstr(err.msg, bad[i].says), "%s: rc %d: %s", bad[i].schema, rc, err.msg);
    }
}

TEST(schema_documents)
{
    sf_jschema *sc = NULL;
    sf_error err = { 0 };
    REQUIRE(sf_jschema_compile(person, strlen(person), &sc, &err) == SF_OK, "%s", err.msg);
    static const char *const good[] = {
        "{\"name\": \"Ann\", \"age\": 31, \"tags\": [\"a\"]}",
        "{\"name\":\"\",\"age\":-0,\"score\":null,\"tags\":[\"bb\",true,null]}",
        "{\"name\": \"x\", \"age\": 7, \"score\": 2.5e3, \"tags\": [\"b\", \"a\"], \"addr\": {\"zip\": \"x\xc3\xa9\"}}",
        "{\"name\": \"x\", \"age\": 7, \"tags\": [null], \"addr\": {\"city\": \"P\", \"zip\": \"x\xc3\xa9\"}, \"extra\": {\"k\": [1, {}]}, \"any\": [true]}",
        "{\"name\": \"x\", \"age\": 7, \"tags\": [\"a\"], \"any\": \"s\"}",
    };
    static const char *const bad[] = {
        "{}",                                                           /* required missing */
        "{\"name\": \"Ann\", \"age\": 31}",                             /* tags required */
        "{\"age\": 31, \"name\": \"Ann\", \"tags\": [\"a\"]}",          /* out of order */
        "{\"name\": \"Ann\", \"age\": 31, \"tags\": [\"a\"], \"zz\": 1}", /* not a property */
        "{\"name\": \"Ann\", \"name\": \"B\", \"age\": 31, \"tags\": [\"a\"]}",
        "{\"name\": 5, \"age\": 31, \"tags\": [\"a\"]}",                /* wrong type */
        "{\"name\": \"A\", \"age\": 31.5, \"tags\": [\"a\"]}",          /* not an integer */
        "{\"name\": \"A\", \"age\": 3e1, \"tags\": [\"a\"]}",
        "{\"name\": \"A\", \"age\": 3, \"tags\": []}",                  /* minItems */
        "{\"name\": \"A\", \"age\": 3, \"tags\": [\"a\", \"a\", \"a\", \"a\"]}", /* maxItems */
        "{\"name\": \"A\", \"age\": 3, \"tags\": [\"c\"]}",             /* not in the enum */
        "{\"name\": \"A\", \"age\": 3, \"tags\": [\"a\\u0062\"]}",      /* written otherwise than the schema does */
        "{\"name\": \"A\", \"age\": 3, \"tags\": [false]}",
        "{\"name\": \"A\", \"age\": 3, \"tags\": [\"a\"], \"addr\": {\"city\": \"P\"}}", /* zip required */
        "{\"name\": \"A\", \"age\": 3, \"tags\": [\"a\"], \"score\": \"1\"}",
        "{\"name\": \"A\", \"age\": 3, \"tags\": [\"a\"], \"extra\": []}",
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(good); i++) {
        const char *s = good[i];
        size_t n = strlen(s);
        CHECK_MSG(with_schema(sc, s), "valid document refused: %s", s);
        for (size_t k = 0; k <= n; k++) {
            sf_json j;
            sf_json_init(&j, sc);
            int a = sf_json_feed(&j, s, k), b = a && sf_json_feed(&j, s + k, n - k) && sf_json_done(&j);
            CHECK_MSG(a && b, "valid document refused when split at %zu: %s", k, s);
        }
    }
    for (size_t i = 0; i < SF_ARRAY_LEN(bad); i++) CHECK_MSG(!with_schema(sc, bad[i]), "invalid document accepted: %s", bad[i]);
    /* a key narrows to the properties that can come: after "name", only "age" (required next) */
    sf_json j;
    sf_json_init(&j, sc);
    CHECK(sf_json_feed(&j, "{\"name\": \"A\", \"", 15) && !sf_json_feed(&j, "s", 1));
    sf_json_init(&j, sc);
    CHECK(sf_json_feed(&j, "{\"name\": \"A\", \"age\": 1, \"tags\": [\"a\"], \"", 40) && sf_json_feed(&j, "extra\": {", 9));
    sf_jschema_free(sc);
}

/* The subset's meaning, written from the schema's JSON for the random test: jansson parses the
 * instance (duplicate keys refused), properties must come in the listed order. */
static int ref_valid(json_t *v, json_t *s)
{
    if (json_is_true(s) || (json_is_object(s) && !json_object_get(s, "type") && !json_object_get(s, "enum") &&
                            !json_object_get(s, "const") && !json_object_get(s, "properties")))
        return 1;
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        json_t *vals = en ? en : NULL;
        if (cn) return json_equal(v, cn);
        size_t i;
        json_t *x;
        json_array_foreach(vals, i, x) if (json_equal(v, x)) return 1;
        return 0;
    }
    json_t *type = json_object_get(s, "type");
    int ok = 0;
    const char *names[8];
    int nn = 0;
    if (json_is_string(type)) names[nn++] = json_string_value(type);
    else {
        size_t i;
        json_t *x;
        json_array_foreach(type, i, x) if (nn < 8) names[nn++] = json_string_value(x);
    }
    for (int i = 0; i < nn && !ok; i++) {
        const char *t = names[i];
        if (!strcmp(t, "string")) ok = json_is_string(v);
        else if (!strcmp(t, "integer")) ok = json_is_integer(v);
        else if (!strcmp(t, "number")) ok = json_is_number(v);
        else if (!strcmp(t, "boolean")) ok = json_is_boolean(v);
        else if (!strcmp(t, "null")) ok = json_is_null(v);
        else if (!strcmp(t, "array") && json_is_array(v)) {
            json_t *items = json_object_get(s, "items"), *mi = json_object_get(s, "minItems"), *ma = json_object_get(s, "maxItems");
            ok = (!mi || (json_int_t)json_array_size(v) >= json_integer_value(mi)) &&
                 (!ma || (json_int_t)json_array_size(v) <= json_integer_value(ma));
            size_t k;
            json_t *x;
            json_array_foreach(v, k, x) if (ok && items) ok = ref_valid(x, items);
        } else if (!strcmp(t, "object") && json_is_object(v)) {
            json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
            if (!props) { ok = 1; continue; }
            ok = 1;
            const char *k;
            json_t *x;
            void *it = json_object_iter(props);
            json_object_foreach(v, k, x) { /* in the listed order: walk the properties forward */
                while (it && strcmp(json_object_iter_key(it), k)) it = json_object_iter_next(props, it);
                if (!it) { ok = 0; break; }
                if (!ref_valid(x, json_object_iter_value(it))) { ok = 0; break; }
                it = json_object_iter_next(props, it);
            }
            size_t ri;
            json_array_foreach(req, ri, x) if (ok && !json_object_get(v, json_string_value(x))) ok = 0;
        }
    }
    return ok;
}

/* a random instance of schema s (valid unless the dice say otherwise) */
static void gen_instance(sbuf *b, json_t *s, int depth)
{
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        json_t *x = cn ? cn : json_array_get(en, (size_t)rnd((int)json_array_size(en)));
        char *t = json_dumps(x, JSON_ENCODE_ANY | JSON_COMPACT);
        put(b, t);
        free(t);
        return;
    }
    json_t *type = json_object_get(s, "type");
    const char *t = json_is_string(type) ? json_string_value(type)
                    : json_is_array(type) ? json_string_value(json_array_get(type, (size_t)rnd((int)json_array_size(type))))
                                          : NULL;
    if (!t) { gen_value(b, depth + 2); return; }
    if (!strcmp(t, "string")) gen_string(b);
    else if (!strcmp(t, "integer")) put(b, rnd(2) ? "42" : "-7");
    else if (!strcmp(t, "number")) put(b, rnd(2) ? "3.5" : "1e3");
    else if (!strcmp(t, "boolean")) put(b, rnd(2) ? "true" : "false");
    else if (!strcmp(t, "null")) put(b, "null");
    else if (!strcmp(t, "array")) {
        json_t *items = json_object_get(s, "items");
        int n = 1 + rnd(3);
        put(b, "[");
        for (int i = 0; i < n; i++) {
            if (i) put(b, ", ");
            if (items) gen_instance(b, items, depth + 1);
            else gen_value(b, depth + 2);
        }
        put(b, "]");
    } else {
        json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
        if (!props) { gen_object(b, depth + 2); return; }
        put(b, "{");
        ws(b);
        int first = 1;
        const char *k;
        json_t *x;
        json_object_foreach(props, k, x) {
            int required = 0;
            size_t ri;
            json_t *r;
            json_array_foreach(req, ri, r) if (!strcmp(json_string_value(r), k)) required = 1;
            if (!required && rnd(2)) continue;
            if (!first) { put(b, ","); ws(b); }
            first = 0;
            put(b, "\"");
            put(b, k);
            put(b, "\":");
            ws(b);
            gen_instance(b, x, depth + 1);
        }
        ws(b);
        put(b, "}");
    }
}

TEST(schema_random_against_reference)
{
    json_t *schema = json_loads(person, 0, NULL);
    sf_jschema *sc = NULL;
    sf_error err = { 0 };
    REQUIRE(schema && sf_jschema_compile(person, strlen(person), &sc, &err) == SF_OK, "%s", err.msg);
    /* the free-form parts ("extra", "any") make duplicate keys possible that jansson refuses: not here */
    json_object_del(json_object_get(schema, "properties"), "extra");
    json_object_del(json_object_get(schema, "properties"), "any");
    char *text = json_dumps(schema, JSON_COMPACT);
    sf_jschema_free(sc);
    REQUIRE(sf_jschema_compile(text, strlen(text), &sc, &err) == SF_OK, "%s", err.msg);
    sf_rng_seed(&R, 5);
    static const char alphabet[] = "{}[]:,\"\\-.eE0179 tnabcx\xc3\xa9";
    int agree = 0, valid = 0, gen_ok = 0, n_gen = 0;
    for (int it = 0; it < 6000; it++) {
        sbuf b = { .n = 0 };
        gen_instance(&b, schema, 0);
        if (it % 3 == 0) {
            json_t *v = json_loadb(b.b, b.n, JSON_REJECT_DUPLICATES, NULL);
            int want = v && ref_valid(v, schema), got = 0;
            json_decref(v);
            sf_json j;
            sf_json_init(&j, sc);
            got = sf_json_feed(&j, b.b, b.n) && sf_json_done(&j);
            n_gen++;
            gen_ok += got;
            CHECK_MSG(got == want && want, "generated: ours %d reference %d: %.*s", got, want, (int)b.n, b.b);
            continue;
        }
        mutate(&b, alphabet, sizeof alphabet - 1);
        json_error_t je;
        json_t *v = json_loadb(b.b, b.n, JSON_REJECT_DUPLICATES, &je);
        int want = v && json_is_object(v) && ref_valid(v, schema);
        json_decref(v);
        sf_json j;
        sf_json_init(&j, sc);
        int got = sf_json_feed(&j, b.b, b.n) && sf_json_done(&j);
        /* (enum values are wanted byte for byte as the schema writes them, where the reference
         * compares values: a mutation would have to write a \u escape of 4 hex digits to tell) */
        valid += want;
        agree += got == want;
        CHECK_MSG(got == want, "ours %d, reference %d: %.*s", got, want, (int)b.n, b.b);
    }
    printf("  %d of %d generated instances accepted; %d mutated texts agree with the reference (%d valid)\n", gen_ok,
           n_gen, agree, valid);
    CHECK(valid > 100);
    free(text);
    json_decref(schema);
    sf_jschema_free(sc);
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

/* sf_json_mask_bits against sf_json_mask's row l (kept of V): the same tokens, every word written
 * over garbage, none past them; 1 when they agree */
static int bits_agree(const sf_json *j, const sf_json_vocab *v, const float *l, int V, int kept)
{
    const int words = (V + 31) / 32;
    uint32_t *b = malloc(sizeof *b * (size_t)(words + 1));
    memset(b, 0xA5, sizeof *b * (size_t)(words + 1));
    int ok = sf_json_mask_bits(j, v, b) == kept && b[words] == 0xA5A5A5A5u;
    for (int id = 0; id < words * 32; id++)
        ok &= (int)(b[id >> 5] >> (id & 31) & 1) == (id < V && !isinf(l[id]));
    free(b);
    return ok;
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
    sf_json_init(&j, NULL);
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
    uint32_t *bits = malloc(sizeof *bits * (size_t)(V + 31) / 32);
    double t6 = (double)clock() / CLOCKS_PER_SEC;
    int in_str_bits = sf_json_mask_bits(&js, v, bits);
    double t7 = (double)clock() / CLOCKS_PER_SEC;
    CHECK_MSG(in_str_bits == in_str && bits_agree(&js, v, l, V, in_str), "%s: in a string, bits %d, row %d", dir,
              in_str_bits, in_str);
    free(bits);
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
    printf("  %s: %d ids, texts built in %.0f ms; mask %.2f ms after a number, %.2f ms in a string (%d fit), "
           "%.2f ms there as bits\n", dir, V, (t1 - t0) * 1e3, (t3 - t2) * 1e3, (t5 - t4) * 1e3, in_str, (t7 - t6) * 1e3);
    free(l);
    sf_json_vocab_free(v);
    sf_tok_free(t);
}

/* The mask's trie walk against feeding every token alone, from states all over documents: the
 * prefixes of random objects, and of instances of the schema tests' person schema. */
static void mask_equals_token_by_token(const char *dir)
{
    sf_tokenizer *t = NULL;
    sf_error err = { 0 };
    REQUIRE(sf_tok_load_dir(test_data(dir), &t, &err) == SF_OK, "%s: %s", dir, err.msg);
    int V = sf_tok_vocab_size(t);
    sf_json_vocab *v = NULL;
    sf_jschema *sc = NULL;
    REQUIRE(sf_json_vocab_new(t, V, &v, &err) == SF_OK && sf_jschema_compile(person, strlen(person), &sc, &err) == SF_OK,
            "%s", err.msg);
    json_t *schema = json_loads(person, 0, NULL);
    float *l = malloc(sizeof(float) * (size_t)V);
    sf_rng_seed(&R, 21);
    int states = 0, bad = 0;
    for (int doc = 0; doc < 24; doc++) {
        sbuf b = { .n = 0 };
        const sf_jschema *use = doc % 2 ? sc : NULL;
        if (use) gen_instance(&b, schema, 0);
        else gen_object(&b, 0);
        for (size_t cut = 0; cut <= b.n; cut += 1 + (size_t)rnd(5)) {
            sf_json j;
            sf_json_init(&j, use);
            if (!sf_json_feed(&j, b.b, cut)) break; /* a generated instance may leave the schema (free parts) */
            for (int i = 0; i < V; i++) l[i] = 0;
            const int kept = sf_json_mask(&j, v, l);
            if (!bits_agree(&j, v, l, V, kept) && bad++ < 5)
                printf("  %s: after %.*s: the mask's bits differ from its row\n", dir, (int)cut, b.b);
            for (int id = 0; id < V; id++) {
                size_t n;
                const char *s = sf_json_vocab_text(v, id, &n);
                sf_json c;
                sf_json_copy(&c, &j);
                int want = sf_tok_is_eog(t, id) ? sf_json_done(&j) : !sf_json_done(&j) && n && sf_json_feed(&c, s, n);
                if (want != !isinf(l[id]) && bad++ < 5)
                    printf("  %s: after %.*s: token %d (%.*s) kept %d, alone %d\n", dir, (int)cut, b.b, id, (int)n, s,
                           !isinf(l[id]), want);
            }
            states++;
        }
    }
    CHECK_MSG(!bad && states > 200, "%s: %d disagreements over %d states", dir, bad, states);
    printf("  %s: the mask equals token-by-token feeding in %d states\n", dir, states);
    json_decref(schema);
    free(l);
    sf_jschema_free(sc);
    sf_json_vocab_free(v);
    sf_tok_free(t);
}

TEST(mask_real_vocabularies)
{
    check_vocab("tinyllama-1.1b-chat-v1.0");
    check_vocab("gpt2-tokenizer");
    mask_equals_token_by_token("tinyllama-1.1b-chat-v1.0");
    mask_equals_token_by_token("gpt2-tokenizer");
}

/* ---- draws through the mask ---------------------------------------------------------------- */
typedef struct drawer {
    const sf_tokenizer *t;
    const sf_json_vocab *v;
    int V;
    float *l;
    int32_t *keep;
    int every;       /* every this many states, the mask against feeding each token alone (0: never) */
    int held_only;   /* ... only inside a pattern-held string */
    int bad, states, masks;
    double mask_s;
    const char *dir;
} drawer;

/* One output drawn through the mask from j's state, uniform over what it keeps (an end token,
 * once kept, one time in four): 1 when it ended within `steps` and `cap` bytes, its text in
 * out[0..*n); what went wrong is counted in d->bad. */
static int draw_one(drawer *d, sf_json *j, int steps, char *out, size_t cap, size_t *n)
{
    *n = 0;
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < d->V; i++) d->l[i] = 0;
        double t0 = sf_now_s();
        const int kept = sf_json_mask(j, d->v, d->l);
        d->mask_s += sf_now_s() - t0, d->masks++;
        if (!bits_agree(j, d->v, d->l, d->V, kept) && d->bad++ < 5)
            printf("  %s: the mask's bits differ from its row after '%.*s'\n", d->dir, (int)*n, out);
        int k = 0;
        for (int i = 0; i < d->V; i++)
            if (d->l[i] == 0) d->keep[k++] = i;
        if (!k) {
            if (d->bad++ < 5) printf("  %s: nothing fits after '%.*s'\n", d->dir, (int)*n, out);
            return 0;
        }
        if (d->every && step % d->every == 0 && (!d->held_only || j->pat)) {
            for (int id = 0; id < d->V; id++) {
                size_t tl;
                const char *tx = sf_json_vocab_text(d->v, id, &tl);
                sf_json c;
                sf_json_copy(&c, j);
                int want = sf_tok_is_eog(d->t, id) ? sf_json_done(j) : tl && sf_json_feed(&c, tx, tl);
                if (want != (d->l[id] == 0) && d->bad++ < 5)
                    printf("  %s after '%.*s': token %d '%.*s' kept %d, alone %d\n", d->dir, (int)*n, out, id, (int)tl, tx,
                           d->l[id] == 0, want);
            }
            d->states++;
        }
        int32_t id = d->keep[sf_rng_next(&R) % (uint64_t)k];
        if (sf_json_done(j) && sf_rng_next(&R) % 4 == 0) id = sf_tok_eos(d->t);
        if (!sf_json_accept(j, d->v, id)) {
            d->bad++;
            return 0;
        }
        if (sf_tok_is_eog(d->t, id)) return 1;
        size_t tl;
        const char *tx = sf_json_vocab_text(d->v, id, &tl);
        if (*n + tl >= cap) return 0; /* whitespace runs and the like: not ended */
        memcpy(out + *n, tx, tl);
        *n += tl;
    }
    return 0;
}

static int drawer_new(drawer *d, const char *dir, int every, int held_only)
{
    sf_tokenizer *t = NULL;
    sf_json_vocab *v = NULL;
    sf_error err = { 0 };
    *d = (drawer){ .every = every, .held_only = held_only, .dir = dir };
    if (sf_tok_load_dir(test_data(dir), &t, &err) != SF_OK || sf_json_vocab_new(t, sf_tok_vocab_size(t), &v, &err) != SF_OK) {
        printf("  %s: %s\n", dir, err.msg);
        sf_tok_free(t);
        return 0;
    }
    d->t = t, d->v = v, d->V = sf_tok_vocab_size(t);
    d->l = malloc(sizeof(float) * (size_t)d->V);
    d->keep = malloc(sizeof(int32_t) * (size_t)d->V);
    return 1;
}

static void drawer_free(drawer *d)
{
    free(d->l);
    free(d->keep);
    sf_json_vocab_free((sf_json_vocab *)d->v);
    sf_tok_free((sf_tokenizer *)d->t);
}

/* ---- choices ------------------------------------------------------------------------------ */
static sf_jschema *choice(const char *list)
{
    sf_jschema *sc = NULL;
    return sf_jschema_choice(list, strlen(list), &sc, NULL) == SF_OK ? sc : NULL;
}

static int choice_whole(const sf_jschema *sc, const char *s)
{
    sf_json j;
    sf_json_init(&j, sc);
    return sf_json_feed(&j, s, strlen(s)) && sf_json_done(&j);
}

TEST(choice_recognizer)
{
    static const char *const bad[] = { "[]", "{}", "[1]", "[\"\"]", "[\"a\", \"a\"]", "\"a\"", "[\"a\", null]", "not json" };
    for (size_t i = 0; i < SF_ARRAY_LEN(bad); i++) {
        sf_jschema *sc = choice(bad[i]);
        CHECK_MSG(!sc, "refused: %s", bad[i]);
        sf_jschema_free(sc);
    }
    char big[70 * 8] = "[", *w = big + 1; /* 65 strings: one too many */
    for (int i = 0; i < 65; i++) w += sprintf(w, "%s\"c%d\"", i ? "," : "", i);
    strcpy(w, "]");
    sf_jschema *sc = choice(big);
    CHECK_MSG(!sc, "65 choices refused");
    sf_jschema_free(sc);
    char longc[300] = "[\"";
    memset(longc + 2, 'x', 256);
    strcpy(longc + 258, "\"]");
    CHECK_MSG(!(sc = choice(longc)), "a choice of 256 bytes refused");
    sf_jschema_free(sc);
    sc = choice("[\"yes\", \"no\", \"yes sir\", \"caf\u00e9\"]");
    REQUIRE(sc, "compile");
    CHECK(choice_whole(sc, "yes") && choice_whole(sc, "no") && choice_whole(sc, "yes sir") && choice_whole(sc, "caf\xc3\xa9"));
    CHECK(!choice_whole(sc, "ye") && !choice_whole(sc, "yes s") && !choice_whole(sc, "yes sir!") && !choice_whole(sc, " no") &&
          !choice_whole(sc, "") && !choice_whole(sc, "No") && !choice_whole(sc, "{}"));
    sf_jschema_free(sc);
}

/* Random draws through the mask (uniform over what it keeps) until an end token: the text of
 * the tokens drawn is one of the strings every time, and every string comes out. */
static void choice_draws(const char *dir)
{
    static const char *const opts[] = { "yes", "no", "yes, definitely", "positive", "negative", "{\"a\": 1}",
                                        "caf\xc3\xa9 cr\xc3\xa8me", "42" };
    sf_jschema *sc = choice("[\"yes\", \"no\", \"yes, definitely\", \"positive\", \"negative\", \"{\\\"a\\\": 1}\", "
                            "\"caf\u00e9 cr\u00e8me\", \"42\"]");
    drawer d;
    REQUIRE(sc && drawer_new(&d, dir, 0, 0), "%s", dir);
    int seen[8] = { 0 };
    sf_rng_seed(&R, 9);
    for (int run = 0; run < 400; run++) {
        sf_json j;
        sf_json_init(&j, sc);
        char out[512];
        size_t n;
        int ended = draw_one(&d, &j, 300, out, sizeof out, &n), which = -1;
        for (int c = 0; c < 8; c++)
            if (strlen(opts[c]) == n && !memcmp(opts[c], out, n)) which = c;
        if (!ended || which < 0) {
            if (d.bad++ < 3) printf("  %s: drew '%.*s'\n", dir, (int)n, out);
        } else {
            seen[which]++;
        }
    }
    int all = 1;
    for (int c = 0; c < 8; c++) all &= seen[c] > 0;
    CHECK_MSG(!d.bad, "%s: %d of 400 draws ended outside the choices", dir, d.bad);
    CHECK_MSG(all, "%s: every choice drawn (yes %d, no %d, 'yes, definitely' %d, ...)", dir, seen[0], seen[1], seen[2]);
    sf_jschema_free(sc);
    drawer_free(&d);
}

TEST(choice_draws_real_vocabularies)
{
    choice_draws("tinyllama-1.1b-chat-v1.0");
    choice_draws("gpt2-tokenizer");
}

/* ---- strings' pattern ----------------------------------------------------------------------- */
static const char *const pschema =
    "{\"type\": \"object\", \"properties\": {"
    "\"code\": {\"type\": \"string\", \"pattern\": \"^[A-Z]{2}-\\\\d{3}$\"},"
    "\"note\": {\"pattern\": \"caf\\u00e9|\\\\n|\\ud83d\\ude00\"},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"pattern\": \"^#\\\\w+\"}, \"maxItems\": 3},"
    "\"any\": {\"type\": [\"string\", \"integer\"], \"pattern\": \"x\"}}, \"required\": [\"code\"]}";

TEST(schema_pattern_documents)
{
    sf_jschema *sc = NULL;
    sf_error err = { 0 };
    REQUIRE(sf_jschema_compile(pschema, strlen(pschema), &sc, &err) == SF_OK, "%s", err.msg);
    static const char *const yes[] = {
        "{\"code\": \"AB-123\"}", "{\"code\": \"XY-000\", \"note\": \"un caf\xc3\xa9 noir\"}",
        "{\"code\": \"XY-000\", \"note\": \"line\\nbreak\"}", "{\"code\": \"XY-000\", \"note\": \"\xf0\x9f\x98\x80\"}",
        "{\"code\": \"AB-123\", \"tags\": [\"#a\", \"#b_2 and more\"]}", "{\"code\": \"AB-123\", \"any\": 42}",
        "{\"code\": \"AB-123\", \"any\": \"axb\"}", "{\"code\": \"AB-123\", \"tags\": [\"#a\\\"b\\\\\"]}",
    };
    static const char *const no[] = {
        "{\"code\": \"AB-12\"}", "{\"code\": \"xAB-123\"}", "{\"code\": \"AB-1234\"}", "{\"code\": \"AB-123\\n\"}",
        "{\"code\": \"AB-123\", \"note\": \"cafe\"}", "{\"code\": \"AB-123\", \"note\": \"\\\\n\"}",
        "{\"code\": \"AB-123\", \"tags\": [\"a#b\"]}", "{\"code\": \"AB-123\", \"any\": \"y\"}",
        "{\"code\": \"AB-123\", \"note\": \"\\ud83d\\ude01\"}",
        /* held strings write characters as themselves, not as \u escapes */
        "{\"code\": \"XY-000\", \"note\": \"un caf\\u00e9 noir\"}", "{\"code\": \"A\\u0042-123\"}",
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(yes); i++) CHECK_MSG(with_schema(sc, yes[i]), "accepts %s", yes[i]);
    for (size_t i = 0; i < SF_ARRAY_LEN(no); i++) CHECK_MSG(!with_schema(sc, no[i]), "refuses %s", no[i]);
    /* a string stops being fed where its pattern cannot hold: "AB-1" then a letter */
    sf_json j;
    sf_json_init(&j, sc);
    CHECK(sf_json_feed(&j, "{\"code\": \"AB-1", 14) && !sf_json_feed(&j, "x", 1));
    sf_jschema_free(sc);
}

/* Random strings (escapes, UTF-8, surrogate pairs) and their mutations as the value of a
 * property held to each of several patterns: ours against jansson's decoding searched by PCRE2. */
TEST(schema_pattern_random_against_pcre2)
{
    static const char *const pats[] = { "a", "^[a-z ]*$", "\\\\d{2,}", "^\\\\w+@\\\\w+$", "\\u00e9|\\\\\\\\", "^$", "[^x]x$" };
    sf_rng_seed(&R, 31);
    int texts = 0, valid = 0, bad = 0;
    for (size_t pi = 0; pi < SF_ARRAY_LEN(pats); pi++) {
        char schema[512];
        snprintf(schema, sizeof schema, "{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"pattern\": \"%s\"}}}",
                 pats[pi]);
        sf_jschema *sc = NULL;
        sf_error err = { 0 };
        json_t *js = json_loads(schema, 0, NULL);
        REQUIRE(js && sf_jschema_compile(schema, strlen(schema), &sc, &err) == SF_OK, "%s: %s", schema, err.msg);
        const char *pat = json_string_value(json_object_get(json_object_get(json_object_get(js, "properties"), "s"), "pattern"));
        pcre_ref re;
        REQUIRE(pcre_ref_new(&re, pat, PCRE2_DOLLAR_ENDONLY), "PCRE2 compiles %s", pat);
        static const char alphabet[] = "ax0179 @_\\\"u\xc3\xa9nd";
        for (int it = 0; it < 1500; it++) {
            sbuf b = { .n = 0 };
            put(&b, "{\"s\": ");
            if (it % 4 == 0) {
                static const char *const fixed[] = { "\"ab\"", "\"12\"", "\"a@b\"", "\"\"", "\"\\u00e9\"", "\"\\\\\"", "\"yx\"",
                                                     "\"ab cd\"", "\"x\"" };
                put(&b, fixed[rnd((int)SF_ARRAY_LEN(fixed))]);
            } else {
                gen_string(&b);
            }
            put(&b, "}");
            if (it % 2) mutate(&b, alphabet, sizeof alphabet - 1);
            json_t *v = json_loadb(b.b, b.n, JSON_REJECT_DUPLICATES, NULL);
            json_t *sv = json_object_get(v, "s");
            int u_escape = 0; /* held strings write characters as themselves, not as \u escapes */
            for (size_t q = 0; q + 1 < b.n; q++)
                if (b.b[q] == '\\') u_escape |= b.b[++q] == 'u';
            int want = json_is_object(v) && json_object_size(v) == 1 && json_is_string(sv) && !u_escape &&
                       pcre_ref_match(&re, json_string_value(sv), json_string_length(sv));
            json_decref(v);
            sf_json j;
            sf_json_init(&j, sc);
            int got = sf_json_feed(&j, b.b, b.n) && sf_json_done(&j);
            texts++, valid += want;
            if (got != want && bad++ < 5) printf("  /%s/: ours %d, reference %d: %.*s\n", pat, got, want, (int)b.n, b.b);
        }
        pcre_ref_free(&re);
        json_decref(js);
        sf_jschema_free(sc);
    }
    CHECK_MSG(!bad && valid > texts / 20 && valid < texts, "%d disagree; %d of %d valid", bad, valid, texts);
    printf("  %d texts agree with jansson + PCRE2 (%d valid)\n", texts, valid);
}

/* Draws under a schema with patterns: each output that ends parses, its code matches
 * ^[A-Z]{2}-\d{3}$ by PCRE2's verdict, and the mask equals feeding each token alone at states
 * inside the held strings. */
static void pattern_schema_draws(const char *dir)
{
    static const char *const sch = "{\"type\": \"object\", \"properties\": {\"code\": {\"type\": \"string\", \"pattern\": "
                                   "\"^[A-Z]{2}-\\\\d{3}$\"}, \"ok\": {\"type\": \"boolean\"}}, \"required\": [\"code\", \"ok\"]}";
    drawer d;
    sf_jschema *sc = NULL;
    pcre_ref re;
    REQUIRE(drawer_new(&d, dir, 2, 1), "%s", dir);
    REQUIRE(sf_jschema_compile(sch, strlen(sch), &sc, NULL) == SF_OK && pcre_ref_new(&re, "^[A-Z]{2}-\\d{3}$", PCRE2_DOLLAR_ENDONLY),
            "compile");
    int outs = 0;
    sf_rng_seed(&R, 23);
    for (int run = 0; run < 60; run++) {
        sf_json j;
        sf_json_init(&j, sc);
        char out[1024];
        size_t n;
        if (!draw_one(&d, &j, 300, out, sizeof out, &n)) continue;
        outs++;
        json_t *doc = json_loadb(out, n, 0, NULL), *code = json_object_get(doc, "code");
        if (!(json_is_string(code) && json_is_boolean(json_object_get(doc, "ok")) &&
              pcre_ref_match(&re, json_string_value(code), json_string_length(code))) && d.bad++ < 8)
            printf("  %s: drew '%.*s'\n", dir, (int)n, out);
        json_decref(doc);
    }
    CHECK_MSG(!d.bad && outs > 30 && d.states > 30, "%s: %d bad, %d outputs, %d states", dir, d.bad, outs, d.states);
    printf("  %s: %d outputs parse with a code that matches; the mask equals token-by-token feeding in %d states\n", dir,
           outs, d.states);
    pcre_ref_free(&re);
    sf_jschema_free(sc);
    drawer_free(&d);
}

TEST(schema_pattern_draws_real_vocabularies)
{
    pattern_schema_draws("tinyllama-1.1b-chat-v1.0");
    pattern_schema_draws("gpt2-tokenizer");
}

/* ---- patterns ----------------------------------------------------------------------------- */
/* Random draws through the mask for patterns: every output is a whole match by PCRE2's
 * verdict, and at every eighth state the mask equals feeding each token alone. */
static void regex_draws(const char *dir)
{
    static const char *const pats[] = {
        "\\d{4}-\\d{2}-\\d{2}", "(yes|no), because [a-z ]{1,12}\\.", "[a-z]{1,6}@[a-z]{1,6}\\.(com|org)",
        "[^\\n]{0,20}", "-?\\d+(\\.\\d+)?", "caf[\u00e9e] (cr\u00e8me|noir)!?", "\\{\"k\": \\[(\\d,){0,3}\\d\\]\\}",
    };
    drawer d;
    REQUIRE(drawer_new(&d, dir, 8, 0), "%s", dir);
    int outs = 0;
    sf_rng_seed(&R, 17);
    for (size_t pi = 0; pi < SF_ARRAY_LEN(pats); pi++) {
        sf_jschema *sc = NULL;
        sf_error err = { 0 };
        REQUIRE(sf_jschema_regex(pats[pi], strlen(pats[pi]), &sc, &err) == SF_OK, "%s: %s", pats[pi], err.msg);
        char anchored[256];
        snprintf(anchored, sizeof anchored, "(?:%s)\\z", pats[pi]);
        pcre_ref re;
        REQUIRE(pcre_ref_new(&re, anchored, PCRE2_ANCHORED), "PCRE2 compiles %s", anchored);
        for (int run = 0; run < 40; run++) {
            sf_json j;
            sf_json_init(&j, sc);
            char out[512];
            size_t n;
            if (!draw_one(&d, &j, 200, out, sizeof out, &n)) continue; /* an unbounded pattern may run to the step limit */
            outs++;
            if (!pcre_ref_match(&re, out, n) && d.bad++ < 8) printf("  %s: /%s/ drew '%.*s', no match\n", dir, pats[pi], (int)n, out);
        }
        pcre_ref_free(&re);
        sf_jschema_free(sc);
    }
    CHECK_MSG(!d.bad && outs > 200 && d.states > 100, "%s: %d bad, %d outputs, %d states", dir, d.bad, outs, d.states);
    printf("  %s: %d outputs all match; the mask equals token-by-token feeding in %d states; %.3f ms a mask\n", dir,
           outs, d.states, d.mask_s * 1e3 / d.masks);
    drawer_free(&d);
}

TEST(regex_draws_real_vocabularies)
{
    regex_draws("tinyllama-1.1b-chat-v1.0");
    regex_draws("gpt2-tokenizer");
}

int main(void)
{
    RUN(documents);
    RUN(random_against_jansson);
    RUN(schema_compile);
    RUN(schema_documents);
    RUN(schema_random_against_reference);
    RUN(schema_pattern_documents);
    RUN(schema_pattern_random_against_pcre2);
    RUN(mask_real_vocabularies);
    RUN(choice_recognizer);
    RUN(choice_draws_real_vocabularies);
    RUN(regex_draws_real_vocabularies);
    RUN(schema_pattern_draws_real_vocabularies);
    return test_summary();
}
