/* test_tokenizer.c — tokenizer conformance against Hugging Face (tokenizer-conformance: 83
 * inputs x {gpt2, tinyllama}), streaming detokenization, hand-worked pre-tokenizer splits for
 * the GPT-2 / Llama-3 / Qwen2 regexes, hard cases, bad inputs, GGUF-style vocabularies. */
#include <jansson.h>

#include "engine/model.h"
#include "engine/tok_impl.h"
#include "engine/tokenizer.h"
#include "tests/test.h"

static sf_tokenizer *load_dir(const char *rel)
{
    sf_tokenizer *t = NULL;
    sf_error err = { 0 };
    if (sf_tok_load_dir(test_data(rel), &t, &err)) printf("# load %s: %s\n", rel, err.msg);
    return t;
}

static json_t *load_json(const char *rel)
{
    json_error_t je;
    json_t *j = json_load_file(test_data(rel), 0, &je);
    if (!j) printf("# %s: %s\n", rel, je.text);
    return j;
}

static int ids_equal(const int32_t *ids, size_t n, json_t *arr)
{
    if (json_array_size(arr) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, i)) != ids[i]) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
    printf("#   %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) printf(" %d", ids[i]);
    printf("\n");
}

/* Streams ids through sf_detok one by one: the pieces must be valid UTF-8 and concatenate to
 * the full decode. Returns 1 on success. */
static int stream_matches(const sf_tokenizer *t, const int32_t *ids, size_t n, int skip, const char *full)
{
    sf_detok d;
    char *acc = NULL;
    size_t acc_len = 0, prev = 0;
    int ok = 1;
    sf_detok_init(&d, t, skip);
    for (size_t i = 0; i < n && ok; i++) {
        if (sf_detok_push(&d, ids[i], &acc, &acc_len)) ok = 0;
        if (acc_len > prev && tok_utf8_check(acc + prev, acc_len - prev) != acc_len - prev) {
            printf("#   piece after token %zu is not valid UTF-8\n", i);
            ok = 0;
        }
        prev = acc_len;
    }
    if (ok && sf_detok_finish(&d, &acc, &acc_len)) ok = 0;
    if (ok && (acc_len != strlen(full) || memcmp(acc ? acc : "", full, acc_len))) {
        printf("#   stream \"%.*s\" != decode \"%s\"\n", (int)acc_len, acc ? acc : "", full);
        ok = 0;
    }
    free(acc);
    sf_detok_free(&d);
    return ok;
}

static void conformance_with(sf_tokenizer *t, const char *baseline)
{
    json_t *inputs = load_json("tokenizer-conformance/inputs.json");
    json_t *base = load_json(baseline);
    REQUIRE(t && inputs && base, "test data missing");
    json_t *entries = json_object_get(base, "entries");
    REQUIRE(json_array_size(entries) == 83 && json_array_size(inputs) == 83, "expected 83 cases");
    int bad_ids = 0, bad_dec = 0, bad_stream = 0;
    for (size_t i = 0; i < json_array_size(inputs); i++) {
        json_t *in = json_array_get(inputs, i), *e = NULL;
        const char *id = json_string_value(json_object_get(in, "id"));
        for (size_t k = 0; k < json_array_size(entries); k++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(entries, k), "id")), id)) e = json_array_get(entries, k);
        CHECK_MSG(e != NULL, "no baseline for %s", id);
        if (!e) continue;
        const char *text = json_string_value(json_object_get(in, "text"));
        int32_t *ids = NULL;
        size_t n = 0;
        sf_error err = { 0 };
        int rc = sf_tok_encode(t, text, strlen(text), 1, &ids, &n, &err);
        CHECK_MSG(rc == 0, "%s: encode: %s", id, err.msg);
        if (!ids_equal(ids, n, json_object_get(e, "input_ids"))) {
            bad_ids++;
            printf("#   %s: ids differ\n", id);
            print_ids("got", ids, n);
            json_t *x = json_object_get(e, "input_ids");
            printf("#   want:");
            for (size_t k = 0; k < json_array_size(x) && k < 40; k++) printf(" %d", (int)json_integer_value(json_array_get(x, k)));
            printf("\n");
        }
        /* decode the expected ids, so decoding is checked even where encoding differs */
        json_t *want_ids = json_object_get(e, "input_ids");
        size_t wn = json_array_size(want_ids);
        int32_t *w = malloc((wn + 1) * sizeof *w);
        for (size_t k = 0; k < wn; k++) w[k] = (int32_t)json_integer_value(json_array_get(want_ids, k));
        for (int skip = 0; skip < 2; skip++) {
            char *s = NULL;
            const char *want = json_string_value(json_object_get(e, skip ? "decoded_skip_special" : "decoded_with_special"));
            rc = sf_tok_decode(t, w, wn, skip, &s, &err);
            if (rc || strcmp(s, want)) {
                bad_dec++;
                printf("#   %s: decode(skip=%d) \"%s\" != \"%s\"\n", id, skip, s ? s : err.msg, want);
            } else if (!stream_matches(t, w, wn, skip, s)) {
                bad_stream++;
                printf("#   %s: streaming (skip=%d) differs\n", id, skip);
            }
            free(s);
        }
        free(w);
        free(ids);
    }
    CHECK_MSG(bad_ids == 0, "%d of 83 inputs encode differently", bad_ids);
    CHECK_MSG(bad_dec == 0, "%d decodes differ", bad_dec);
    CHECK_MSG(bad_stream == 0, "%d streamed decodes differ", bad_stream);
    json_decref(inputs);
    json_decref(base);
}

static void conformance(const char *tokdir, const char *baseline)
{
    sf_tokenizer *t = load_dir(tokdir);
    REQUIRE(t, "load %s", tokdir);
    conformance_with(t, baseline);
    sf_tok_free(t);
}

TEST(conformance_gpt2) { conformance("gpt2-tokenizer", "tokenizer-conformance/gpt2_multilingual.json"); }
TEST(conformance_tinyllama) { conformance("tinyllama-1.1b-chat-v1.0", "tokenizer-conformance/tinyllama_multilingual.json"); }

TEST(byte_table)
{
    /* bytes_to_unicode(): 188 printable bytes map to themselves, the rest to U+0100.. in order */
    uint32_t next = 0x100;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        uint32_t want = printable ? (uint32_t)b : next++;
        CHECK_MSG(tok_byte_to_cp[b] == want, "byte 0x%02x -> U+%04X, want U+%04X", b, tok_byte_to_cp[b], want);
        CHECK_MSG(tok_cp_to_byte(want) == b, "U+%04X -> %d, want %d", want, tok_cp_to_byte(want), b);
    }
}


/* ---- hand-built tokenizers: each expected pre-token is a vocab word (ignore_merges), every
 * printable ASCII character and \n is a fallback, so a wrong split shows up as single chars. */
static sf_tokenizer *make_tok(json_t *pre, const char *const *words, json_t *added, json_t *normalizer, sf_error *err)
{
    json_t *vocab = json_object();
    int id = 0;
    char c[2] = { 0, 0 };
    for (int ch = 32; ch < 127; ch++) {
        c[0] = (char)ch;
        json_object_set_new(vocab, c, json_integer(id++));
    }
    json_object_set_new(vocab, "\n", json_integer(id++));
    json_object_set_new(vocab, "\t", json_integer(id++));
    for (int i = 0; words && words[i]; i++)
        if (!json_object_get(vocab, words[i])) json_object_set_new(vocab, words[i], json_integer(id++));
    json_t *root = json_pack("{s:{s:s, s:o, s:[], s:b}, s:o, s:o, s:o}", "model", "type", "BPE", "vocab", vocab, "merges",
                             "ignore_merges", 1, "pre_tokenizer", pre ? pre : json_null(), "added_tokens",
                             added ? added : json_array(), "normalizer", normalizer ? normalizer : json_null());
    char *text = json_dumps(root, 0);
    sf_tokenizer *t = NULL;
    if (sf_tok_load_json(text, NULL, &t, err)) t = NULL;
    free(text);
    json_decref(root);
    return t;
}

/* Encodes text and compares the pieces with want (NULL-terminated); prints both on mismatch. */
static int pieces_are(const sf_tokenizer *t, const char *text, const char *const *want)
{
    int32_t *ids = NULL;
    size_t n = 0, k = 0;
    sf_error err = { 0 };
    if (sf_tok_encode(t, text, strlen(text), 0, &ids, &n, &err)) {
        printf("#   encode: %s\n", err.msg);
        return 0;
    }
    int ok = 1;
    for (k = 0; want[k]; k++)
        if (k >= n || strcmp(sf_tok_piece(t, ids[k]), want[k])) ok = 0;
    if (k != n) ok = 0;
    if (!ok) {
        printf("#   \"%s\" ->", text);
        for (size_t i = 0; i < n; i++) printf(" [%s]", sf_tok_piece(t, ids[i]));
        printf("\n");
    }
    free(ids);
    return ok;
}

static json_t *split_pre(const char *regex, const char *behavior)
{
    return json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", regex, "behavior", behavior, "invert", 0);
}

static const char *split_input = "I'M 12345 don't  stop!!\n\n  x";

TEST(split_llama3_regex)
{
    /* worked by hand: "'M" is a contraction only case-insensitively; digits go in threes; a
     * whitespace run before a word leaves its last space to the word (\s+(?!\S)); newlines
     * stay with the punctuation before them */
    static const char *const want[] = { "I", "'M", " ", "123", "45", " don", "'t", " ", " stop", "!!\n\n", " ", " x", NULL };
    sf_error err = { 0 };
    sf_tokenizer *t = make_tok(split_pre(tok_re_llama3, "Isolated"), want, NULL, NULL, &err);
    REQUIRE(t, "%s", err.msg);
    CHECK(pieces_are(t, split_input, want));
    sf_tok_free(t);
}

TEST(split_qwen2_regex)
{
    static const char *const want[] = { "I", "'M", " ", "1", "2", "3", "4", "5", " don", "'t", " ", " stop", "!!\n\n", " ", " x", NULL };
    sf_error err = { 0 };
    sf_tokenizer *t = make_tok(split_pre(tok_re_qwen2, "Isolated"), want, NULL, NULL, &err);
    REQUIRE(t, "%s", err.msg);
    CHECK(pieces_are(t, split_input, want));
    sf_tok_free(t);
}

TEST(split_gpt2_regex)
{
    /* GPT-2's contractions are case-sensitive, digits stay together with one leading space,
     * and the newline run is whitespace, not punctuation */
    static const char *const want[] = { "I", "'", "M", " 12345", " don", "'t", " ", " stop", "!!", "\n\n ", " x", NULL };
    sf_error err = { 0 };
    sf_tokenizer *t = make_tok(split_pre(tok_re_gpt2, "Isolated"), want, NULL, NULL, &err);
    REQUIRE(t, "%s", err.msg);
    CHECK(pieces_are(t, split_input, want));
    sf_tok_free(t);
}

TEST(split_behaviors)
{
    static const struct { const char *behavior; const char *const want[8]; } cases[] = {
        { "Removed", { "a", "b", "c" } },
        { "Isolated", { "a", "-", "b", "-", "-", "c" } },
        { "MergedWithPrevious", { "a-", "b-", "-", "c" } },
        { "MergedWithNext", { "a", "-b", "-", "-c" } },
        { "Contiguous", { "a", "-", "b", "--", "c" } },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        sf_error err = { 0 };
        json_t *pre = json_pack("{s:s, s:{s:s}, s:s}", "type", "Split", "pattern", "String", "-", "behavior", cases[i].behavior);
        sf_tokenizer *t = make_tok(pre, cases[i].want, NULL, NULL, &err);
        REQUIRE(t, "%s", err.msg);
        CHECK_MSG(pieces_are(t, "a-b--c", cases[i].want), "behavior %s", cases[i].behavior);
        sf_tok_free(t);
    }
}

TEST(metaspace_and_digits)
{
    sf_error err = { 0 };
    static const char *const ms[] = { "\xe2\x96\x81hello", "\xe2\x96\x81world", NULL };
    json_t *pre = json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", "\xe2\x96\x81", "prepend_scheme",
                            "first", "split", 1);
    sf_tokenizer *t = make_tok(pre, ms, NULL, NULL, &err);
    REQUIRE(t, "%s", err.msg);
    CHECK(pieces_are(t, "hello world", ms));
    sf_tok_free(t);
    static const char *const ind[] = { "ab", "1", "2", "3", "x", NULL }, *const cont[] = { "ab", "123", "x", NULL };
    t = make_tok(json_pack("{s:s, s:b}", "type", "Digits", "individual_digits", 1), ind, NULL, NULL, &err);
    REQUIRE(t, "%s", err.msg);
    CHECK(pieces_are(t, "ab123x", ind));
    sf_tok_free(t);
    t = make_tok(json_pack("{s:s, s:b}", "type", "Digits", "individual_digits", 0), cont, NULL, NULL, &err);
    REQUIRE(t, "%s", err.msg);
    CHECK(pieces_are(t, "ab123x", cont));
    sf_tok_free(t);
}

static json_t *added_tok(int id, const char *content, int lstrip, int rstrip, int single_word, int special)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content, "lstrip", lstrip, "rstrip", rstrip,
                     "single_word", single_word, "normalized", 0, "special", special);
}

TEST(added_token_flags)
{
    sf_error err = { 0 };
    static const char *const words[] = { "a", "a ", " b", "b", "hithere", "  ", NULL };
    json_t *added = json_array();
    json_array_append_new(added, added_tok(500, "<mask>", 1, 0, 0, 1));
    json_array_append_new(added, added_tok(501, "<r>", 0, 1, 0, 1));
    json_array_append_new(added, added_tok(502, "hi", 0, 0, 1, 0));
    json_array_append_new(added, added_tok(503, "<plain>", 0, 0, 0, 1));
    json_array_append_new(added, added_tok(504, "<plainer>", 0, 0, 0, 1));
    sf_tokenizer *t = make_tok(NULL, words, added, NULL, &err);
    REQUIRE(t, "%s", err.msg);
    static const char *const w1[] = { "a", "<mask>", " b", NULL };       /* lstrip eats the space before */
    CHECK(pieces_are(t, "a <mask> b", w1));
    static const char *const w2[] = { "a ", "<plain>", " b", NULL };     /* no lstrip: the space stays */
    CHECK(pieces_are(t, "a <plain> b", w2));
    static const char *const w3[] = { "a", "<r>", "b", NULL };           /* rstrip eats the spaces after */
    CHECK(pieces_are(t, "a<r>  b", w3));
    static const char *const w4[] = { "hi", " b", NULL };                /* single word: matches alone */
    CHECK(pieces_are(t, "hi b", w4));
    static const char *const w5[] = { "hithere", NULL };                 /* ... but not inside a word */
    CHECK(pieces_are(t, "hithere", w5));
    static const char *const w6[] = { "<plainer>", "<plain>", NULL };    /* longest match wins */
    CHECK(pieces_are(t, "<plainer><plain>", w6));
    /* skip_special drops special added tokens only */
    int32_t ids[] = { 500, 0 + 'a' - 32, 502 };
    char *s = NULL;
    int rc = sf_tok_decode(t, ids, 3, 1, &s, &err);
    REQUIRE(rc == 0, "%s", err.msg);
    CHECK_MSG(!strcmp(s, "a hi"), "got \"%s\"", s); /* no decoder: pieces joined by spaces, as HF does */
    free(s);
    sf_tok_free(t);
}

TEST(normalizers)
{
    sf_error err = { 0 };
    static const char *const words[] = { "_x_y", NULL };
    json_t *norm = json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}, {s:s}]}", "type", "Sequence", "normalizers", "type",
                             "Prepend", "prepend", " ", "type", "Replace", "pattern", "Regex", "\\s+", "content", "_", "type", "NFC");
    sf_tokenizer *t = make_tok(NULL, words, NULL, norm, &err);
    REQUIRE(t, "%s", err.msg);
    CHECK(pieces_are(t, "x \t y", words));
    sf_tok_free(t);
}

/* ---- hard cases on the real tokenizers ------------------------------------------------------ */
static const char *const hard[] = {
    "",
    " ",
    "   leading and trailing   ",
    "tabs\tand\t\ttabs\nnew\n\nlines\r\nCRLF\r\n",
    "many          spaces     \n   \n",
    "digits 0 12 123 1234 12345678901234567890 3.14159 -42 1e10",
    "emoji \xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 family, \xf0\x9f\x8f\xb3\xef\xb8\x8f\xe2\x80\x8d\xf0\x9f\x8c\x88 flag, \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd",
    "CJK \xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4",
    "combining e\xcc\x81 a\xcc\x8a n\xcc\x83 (decomposed) vs \xc3\xa9 (composed)",
    "code: for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n\treturn sum;",
    "def f(x):\n    return {'k': [1, 2, 3]}  # comment\n",
    "astral \xf0\x9d\x94\x98\xf0\x9d\x94\xab\xf0\x9d\x94\xa6 \xf0\x90\x8d\x88 and NBSP\xc2\xa0here and U+2028\xe2\x80\xa8there",
    "\xef\xbf\xbd replacement char and \x01\x02 controls",
};

static void hard_cases(const char *dir)
{
    sf_tokenizer *t = load_dir(dir);
    REQUIRE(t, "load %s", dir);
    for (size_t i = 0; i < SF_ARRAY_LEN(hard); i++) {
        const char *x = hard[i];
        int32_t *ids = NULL, *ids2 = NULL;
        size_t n = 0, n2 = 0;
        char *back = NULL;
        sf_error err = { 0 };
        CHECK_MSG(sf_tok_encode(t, x, strlen(x), 0, &ids, &n, &err) == 0, "case %zu: %s", i, err.msg);
        CHECK_MSG(sf_tok_decode(t, ids, n, 1, &back, &err) == 0, "case %zu: %s", i, err.msg);
        /* HF round-trips every string here exactly (SentencePiece: the Prepend'ed "▁" is the
         * space the decoder strips) */
        CHECK_MSG(back && !strcmp(back, x), "case %zu: \"%s\" -> \"%s\"", i, x, back ? back : "");
        CHECK_MSG(sf_tok_encode(t, back, strlen(back), 0, &ids2, &n2, &err) == 0 && n2 == n &&
                      (n == 0 || !memcmp(ids, ids2, n * sizeof *ids)),
                  "case %zu: encode(decode(encode(x))) differs", i);
        CHECK_MSG(stream_matches(t, ids, n, 1, back), "case %zu: streaming", i);
        free(ids);
        free(ids2);
        free(back);
    }
    /* special tokens written in the text are matched; empty text gives just BOS (if any) */
    int32_t *ids = NULL;
    size_t n = 0;
    sf_error err = { 0 };
    const char *eos = sf_tok_piece(t, sf_tok_eos(t));
    char text[64];
    snprintf(text, sizeof text, "end%sstart", eos);
    int rc = sf_tok_encode(t, text, strlen(text), 0, &ids, &n, &err);
    REQUIRE(rc == 0, "%s", err.msg);
    int found = 0;
    for (size_t i = 0; i < n; i++) found += ids[i] == sf_tok_eos(t);
    CHECK_MSG(found == 1, "%s: EOS written in text matched %d times", dir, found);
    free(ids);
    rc = sf_tok_encode(t, "", 0, 1, &ids, &n, &err);
    REQUIRE(rc == 0, "%s", err.msg);
    CHECK(n == (sf_tok_bos(t) >= 0 && !strstr(dir, "gpt2") ? 1u : 0u));
    free(ids);
    sf_tok_free(t);
}

TEST(hard_cases_gpt2) { hard_cases("gpt2-tokenizer"); }
TEST(hard_cases_tinyllama) { hard_cases("tinyllama-1.1b-chat-v1.0"); }

TEST(streaming_holds_partial_utf8)
{
    /* a character missing from the vocab becomes <0xNN> tokens: nothing may come out until the
     * last of its bytes arrives */
    sf_tokenizer *t = load_dir("tinyllama-1.1b-chat-v1.0");
    REQUIRE(t, "load");
    const char *x = "\xf0\x9f\xa6\x80"; /* U+1F980 crab, byte fallback */
    int32_t *ids = NULL;
    size_t n = 0;
    sf_error err = { 0 };
    int rc = sf_tok_encode(t, x, strlen(x), 0, &ids, &n, &err);
    REQUIRE(rc == 0 && n == 5, "got %zu ids", n); /* ▁ + 4 bytes */
    sf_detok d;
    char *out = NULL;
    size_t len = 0;
    sf_detok_init(&d, t, 1);
    for (size_t i = 0; i < n; i++) {
        CHECK(sf_detok_push(&d, ids[i], &out, &len) == 0);
        if (i + 1 < n) CHECK_MSG(len == 0, "released %zu bytes after token %zu", len, i);
    }
    CHECK(sf_detok_finish(&d, &out, &len) == 0);
    CHECK_MSG(len == 4 && !memcmp(out, x, 4), "got %zu bytes", len);
    sf_detok_free(&d);
    free(out);
    free(ids);
    sf_tok_free(t);
}

/* ---- bad inputs ------------------------------------------------------------------------------ */
TEST(invalid_utf8)
{
    sf_tokenizer *t = load_dir("gpt2-tokenizer");
    REQUIRE(t, "load");
    static const struct { const char *s; size_t off; } cases[] = {
        { "ab\xc3(", 2 }, { "\xc0\x80", 0 }, { "ok\xed\xa0\x80", 2 }, { "trunc\xe2\x82", 5 }, { "x\xff", 1 }, { "\xf4\x90\x80\x80", 0 },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        sf_error err = { 0 };
        char want[64];
        snprintf(want, sizeof want, "byte offset %zu", cases[i].off);
        CHECK_MSG(sf_tok_encode(t, cases[i].s, strlen(cases[i].s), 1, &ids, &n, &err) == SF_EINVAL && !ids,
                  "case %zu accepted", i);
        CHECK_MSG(strstr(err.msg, want) != NULL, "case %zu: \"%s\"", i, err.msg);
    }
    int32_t bad[] = { 15496, -1 };
    char *s = NULL;
    sf_error err = { 0 };
    CHECK(sf_tok_decode(t, bad, 2, 0, &s, &err) == SF_EINVAL && !s && strstr(err.msg, "position 1"));
    sf_detok d;
    sf_detok_init(&d, t, 0);
    size_t len = 0;
    CHECK(sf_detok_push(&d, 1 << 30, &s, &len) == SF_EINVAL);
    sf_detok_free(&d);
    sf_tok_free(t);
}

static int load_err(const char *json, const char *cfg, const char *want, int want_rc)
{
    sf_tokenizer *t = NULL;
    sf_error err = { 0 };
    int rc = sf_tok_load_json(json, cfg, &t, &err);
    if (rc != want_rc || t || !strstr(err.msg, want)) {
        printf("#   rc %d, message \"%s\"; wanted %d and \"%s\"\n", rc, err.msg, want_rc, want);
        sf_tok_free(t);
        return 0;
    }
    return 1;
}

TEST(bad_tokenizer_json)
{
    CHECK(load_err("{\"model\": {\"type\": \"BPE\", \"vocab\": {", NULL, "not valid JSON", SF_EFORMAT));
    CHECK(load_err("[1, 2]", NULL, "no \"model\"", SF_EFORMAT));
    CHECK(load_err("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", NULL, "Unigram", SF_EUNSUPPORTED));
    CHECK(load_err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}", NULL, "missing from model.vocab",
                   SF_EFORMAT));
    CHECK(load_err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", NULL, "not a token id", SF_EFORMAT));
    CHECK(load_err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": {\"type\": \"Lowercase\"}}",
                   NULL, "normalizer \"Lowercase\" is not supported", SF_EUNSUPPORTED));
    CHECK(load_err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", "
                   "\"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}", NULL, "does not compile", SF_EFORMAT));
    CHECK(load_err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"decoder\": {\"type\": \"WordPiece\"}}",
                   NULL, "decoder \"WordPiece\"", SF_EUNSUPPORTED));
    CHECK(load_err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"continuing_subword_prefix\": \"##\"}}",
                   NULL, "continuing_subword_prefix", SF_EUNSUPPORTED));
    CHECK(load_err("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "{not json", "tokenizer_config.json",
                   SF_EFORMAT));
    sf_tokenizer *t = NULL;
    sf_error err = { 0 };
    CHECK(sf_tok_load_dir("/nonexistent/model", &t, &err) == SF_ENOTFOUND && !t && strstr(err.msg, "tokenizer.json"));
    /* no error struct: still a status, never a crash */
    CHECK(sf_tok_load_json("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"pre_tokenizer\": "
                           "{\"type\": \"Digits\"}, \"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"[\"}, "
                           "\"content\": \"\"}}", NULL, &t, NULL) == SF_EFORMAT && !t);
    CHECK(sf_tok_load_json("{", NULL, &t, NULL) == SF_EFORMAT && !t);
}

/* CPU seconds of this process: on a shared machine wall time mostly measures the neighbours */
#include <time.h>
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- speed (reported, never asserted: the machines are shared) ----------------------------------------------------------- */
TEST(speed)
{
    const char *dirs[] = { "gpt2-tokenizer", "tinyllama-1.1b-chat-v1.0" };
    json_t *inputs = load_json("tokenizer-conformance/inputs.json");
    REQUIRE(inputs, "inputs");
    tok_buf text = { 0 };
    for (int rep = 0; rep < 20; rep++)
        for (size_t i = 0; i < json_array_size(inputs); i++) {
            tok_buf_puts(&text, json_string_value(json_object_get(json_array_get(inputs, i), "text")));
            tok_buf_puts(&text, "\n");
        }
    for (size_t k = 0; k < SF_ARRAY_LEN(dirs); k++) {
        double t0 = cpu_s();
        sf_tokenizer *t = load_dir(dirs[k]);
        double t1 = cpu_s();
        REQUIRE(t, "load");
        int32_t *ids = NULL;
        size_t n = 0;
        sf_error err = { 0 };
        CHECK(sf_tok_encode(t, text.p, text.len, 1, &ids, &n, &err) == 0);
        double t2 = cpu_s();
        char *back = NULL;
        CHECK(sf_tok_decode(t, ids, n, 1, &back, &err) == 0 && !strcmp(back, text.p));
        double t3 = cpu_s();
        printf("# %s (CPU time): load %.0f ms, encode %.1f MB/s = %.2f M tokens/s (%zu tokens), decode %.1f MB/s\n",
               dirs[k], (t1 - t0) * 1e3, text.len / (t2 - t1) / 1e6, n / (t2 - t1) / 1e6, n, text.len / (t3 - t2) / 1e6);
        free(back);
        free(ids);
        sf_tok_free(t);
    }
    free(text.p);
    json_decref(inputs);
}

/* ---- one tokenizer, several threads ---------------------------------------------------------- */
#include <pthread.h>

typedef struct worker {
    const sf_tokenizer *t;
    json_t *inputs;
    size_t mismatches;
    uint64_t sum;
} worker;

static void *encode_all(void *arg)
{
    worker *w = arg;
    for (int rep = 0; rep < 3; rep++)
        for (size_t i = 0; i < json_array_size(w->inputs); i++) {
            const char *x = json_string_value(json_object_get(json_array_get(w->inputs, i), "text"));
            int32_t *ids = NULL;
            size_t n = 0;
            char *back = NULL;
            if (sf_tok_encode(w->t, x, strlen(x), 1, &ids, &n, NULL) || sf_tok_decode(w->t, ids, n, 1, &back, NULL) ||
                strcmp(back, x))
                w->mismatches++;
            for (size_t k = 0; k < n; k++) w->sum = w->sum * 31 + (uint64_t)ids[k];
            free(ids);
            free(back);
        }
    return NULL;
}

TEST(threads_share_a_tokenizer)
{
    sf_tokenizer *t = load_dir("gpt2-tokenizer");
    json_t *inputs = load_json("tokenizer-conformance/inputs.json");
    REQUIRE(t && inputs, "test data");
    worker w[3] = { { t, inputs, 0, 0 }, { t, inputs, 0, 0 }, { t, inputs, 0, 0 } };
    pthread_t th[2];
    encode_all(&w[2]); /* reference, alone */
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, encode_all, &w[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) CHECK_MSG(w[i].mismatches == 0 && w[i].sum == w[2].sum, "thread %d differs", i);
    json_decref(inputs);
    sf_tok_free(t);
}

/* ---- GGUF vocabularies ------------------------------------------------------------------------ */
TEST(gguf_spm_llama2)
{
    /* the full Llama-2 vocabulary with SentencePiece scores, read by the GGUF loader: scoring by
     * SentencePiece must give HF's merges-based ids for TinyLlama (same vocabulary) */
    sf_model *m = NULL;
    sf_error err = { 0 };
    sf_load_opts o = { 0 };
    int rc = sf_model_load_gguf(test_data("llama-2-tiny-random-gguf/llama-2-tiny-random.gguf"), &o, &m, &err);
    REQUIRE(rc == 0 && m->tok, "%s", err.msg);
    CHECK(sf_tok_vocab_size(m->tok) == 32000 && sf_tok_bos(m->tok) == 1 && sf_tok_eos(m->tok) == 2);
    conformance_with(m->tok, "tokenizer-conformance/tinyllama_multilingual.json");
    /* whitespace runs are where SentencePiece scores and HF's merge order could part ways */
    sf_tokenizer *hf = load_dir("tinyllama-1.1b-chat-v1.0");
    REQUIRE(hf, "load");
    static const char *const ws[] = { "a  b", "a   b", "a    b", "x        y", "  lead", "trail   ", "\t\t x",
                                      "def f():\n    return 1\n\n\n        deep", "<s>hi</s> <unk>" };
    for (size_t i = 0; i < SF_ARRAY_LEN(ws); i++) {
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        CHECK(sf_tok_encode(m->tok, ws[i], strlen(ws[i]), 1, &a, &na, &err) == 0);
        CHECK(sf_tok_encode(hf, ws[i], strlen(ws[i]), 1, &b, &nb, &err) == 0);
        CHECK_MSG(na == nb && !memcmp(a, b, na * sizeof *a), "\"%s\": SentencePiece and HF BPE differ", ws[i]);
        free(a);
        free(b);
    }
    sf_tok_free(hf);
    /* an older GGUF without tokenizer.ggml.token_type: byte, control and unknown tokens are
     * recognised from the pieces and the bos/eos/unk ids, with the same result */
    int nv = sf_tok_vocab_size(m->tok);
    const char **pieces = malloc(sizeof *pieces * (size_t)nv);
    for (int i = 0; i < nv; i++) pieces[i] = sf_tok_piece(m->tok, i);
    sf_tok_vocab v = { .model = "llama", .n_tokens = nv, .tokens = pieces, .scores = m->tok->scores, .bos_id = 1,
                       .eos_id = 2, .unk_id = 0, .pad_id = -1, .add_bos = -1, .add_eos = -1 };
    sf_tokenizer *untyped = NULL;
    rc = sf_tok_from_vocab(&v, &untyped, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) conformance_with(untyped, "tokenizer-conformance/tinyllama_multilingual.json");
    sf_tok_free(untyped);
    free(pieces);
    sf_model_free(m);
}

TEST(gguf_bpe_gpt2)
{
    /* a "gpt2" GGUF vocabulary (tokens by id + merges), built here from GPT-2's tokenizer.json:
     * must encode exactly like the tokenizer.json itself */
    json_t *root = load_json("gpt2-tokenizer/tokenizer.json");
    REQUIRE(root, "load");
    json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges"), *v;
    const char *key;
    int n = (int)json_object_size(vocab);
    const char **tokens = calloc((size_t)n, sizeof *tokens);
    const char **mg = calloc(json_array_size(merges), sizeof *mg);
    int32_t *types = calloc((size_t)n, sizeof *types);
    json_object_foreach(vocab, key, v) {
        tokens[json_integer_value(v)] = key;
        types[json_integer_value(v)] = 1;
    }
    types[50256] = 3; /* <|endoftext|>: control */
    for (size_t i = 0; i < json_array_size(merges); i++) mg[i] = json_string_value(json_array_get(merges, i));
    sf_tok_vocab vb = { .model = "gpt2", .pre = "gpt-2", .n_tokens = n, .tokens = tokens, .types = types,
                        .n_merges = (int)json_array_size(merges), .merges = mg, .bos_id = 50256, .eos_id = 50256,
                        .unk_id = -1, .pad_id = -1, .add_bos = -1, .add_eos = -1 };
    sf_tokenizer *t = NULL;
    sf_error err = { 0 };
    int rc = sf_tok_from_vocab(&vb, &t, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) conformance_with(t, "tokenizer-conformance/gpt2_multilingual.json");
    CHECK(!rc && sf_tok_is_eog(t, 50256));
    sf_tok_free(t);
    /* bad vocabularies: a clear refusal */
    sf_tok_vocab bad = vb;
    bad.pre = "some-future-pre";
    CHECK(sf_tok_from_vocab(&bad, &t, &err) == SF_EUNSUPPORTED && !t && strstr(err.msg, "some-future-pre"));
    bad = vb;
    bad.model = "bert";
    CHECK(sf_tok_from_vocab(&bad, &t, &err) == SF_EUNSUPPORTED && !t && strstr(err.msg, "bert"));
    bad = vb;
    bad.n_merges = 0;
    CHECK(sf_tok_from_vocab(&bad, &t, &err) == SF_EFORMAT && !t && strstr(err.msg, "merges"));
    bad = vb;
    bad.model = "llama"; /* SentencePiece needs scores */
    CHECK(sf_tok_from_vocab(&bad, &t, &err) == SF_EFORMAT && !t && strstr(err.msg, "scores"));
    const char *badmerge[] = { "Ġ t", "nosuchtoken x" };
    bad = vb;
    bad.merges = badmerge;
    bad.n_merges = 2;
    CHECK(sf_tok_from_vocab(&bad, &t, &err) == SF_EFORMAT && !t && strstr(err.msg, "merge 1"));
    free(tokens);
    free(mg);
    free(types);
    json_decref(root);
}

static sf_tokenizer *tok_from(const char *json)
{
    sf_tokenizer *t = NULL;
    sf_error err = { 0 };
    if (sf_tok_load_json(json, NULL, &t, &err)) printf("#   load: %s\n", err.msg);
    return t;
}

static int encodes_to(const sf_tokenizer *t, const char *text, const int32_t *want, size_t nwant)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int ok = sf_tok_encode(t, text, strlen(text), 1, &ids, &n, NULL) == 0 && n == nwant && !memcmp(ids, want, n * sizeof *ids);
    if (!ok) print_ids(text, ids, n);
    free(ids);
    return ok;
}

TEST(unk_and_byte_fallback)
{
    /* "€" is missing from the vocab: one <unk> per character, or one for a run with fuse_unk;
     * with byte_fallback and all three <0xNN> present, its bytes */
    const char *fmt = "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": %s, \"byte_fallback\": %s, "
                      "\"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, \"ab\": 3, \"<0xE2>\": 4, \"<0x82>\": 5, \"<0xAC>\": 6}, "
                      "\"merges\": [\"a b\"]}, \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, "
                      "{\"type\": \"Fuse\"}]}}";
    char json[1024];
    snprintf(json, sizeof json, fmt, "false", "false");
    sf_tokenizer *t = tok_from(json);
    REQUIRE(t, "load");
    CHECK(encodes_to(t, "ab\xe2\x82\xac\xe2\x82\xac" "ab", (int32_t[]){ 3, 0, 0, 3 }, 4));
    sf_tok_free(t);
    snprintf(json, sizeof json, fmt, "true", "false");
    t = tok_from(json);
    REQUIRE(t, "load");
    CHECK(encodes_to(t, "ab\xe2\x82\xac\xe2\x82\xac" "ab", (int32_t[]){ 3, 0, 3 }, 3));
    sf_tok_free(t);
    snprintf(json, sizeof json, fmt, "true", "true");
    t = tok_from(json);
    REQUIRE(t, "load");
    CHECK(encodes_to(t, "a\xe2\x82\xac" "b", (int32_t[]){ 1, 4, 5, 6, 2 }, 5));
    /* decoding: whole bytes become the character; a lone byte becomes U+FFFD */
    char *s = NULL;
    CHECK(sf_tok_decode(t, (int32_t[]){ 1, 4, 5, 6, 2 }, 5, 0, &s, NULL) == 0 && !strcmp(s, "a\xe2\x82\xac" "b"));
    free(s);
    CHECK(sf_tok_decode(t, (int32_t[]){ 1, 4, 5, 2 }, 4, 0, &s, NULL) == 0 && !strcmp(s, "a\xef\xbf\xbd\xef\xbf\xbd" "b"));
    free(s);
    sf_tok_free(t);
}

TEST(metaspace_roundtrip_and_post)
{
    /* Metaspace pre-tokenizer + decoder (Mistral/Llama style without a normalizer), and a
     * TemplateProcessing that adds BOS and EOS */
    const char *json =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"<s>\": 0, \"</s>\": 1, \"\xe2\x96\x81\": 2, \"h\": 3, \"i\": 4, "
        "\"\xe2\x96\x81h\": 5, \"\xe2\x96\x81hi\": 6}, \"merges\": [\"\xe2\x96\x81 h\", \"\xe2\x96\x81h i\"]}, "
        "\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\", \"special\": true}, {\"id\": 1, \"content\": \"</s>\", \"special\": true}], "
        "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"always\", \"split\": true}, "
        "\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"always\"}, "
        "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, "
        "{\"Sequence\": {\"id\": \"A\"}}, {\"SpecialToken\": {\"id\": \"</s>\"}}], "
        "\"special_tokens\": {\"<s>\": {\"ids\": [0]}, \"</s>\": {\"ids\": [1]}}}}";
    sf_tokenizer *t = tok_from(json);
    REQUIRE(t, "load");
    CHECK(encodes_to(t, "hi hi", (int32_t[]){ 0, 6, 6, 1 }, 4));
    CHECK(sf_tok_bos(t) == 0 && sf_tok_eos(t) == 1 && sf_tok_is_eog(t, 1) && !sf_tok_is_eog(t, 6));
    CHECK(sf_tok_lookup(t, "\xe2\x96\x81hi") == 6 && sf_tok_lookup(t, "</s>") == 1 && sf_tok_lookup(t, "nope") == -1);
    char *s = NULL;
    CHECK(sf_tok_decode(t, (int32_t[]){ 0, 6, 6, 1 }, 4, 1, &s, NULL) == 0 && !strcmp(s, "hi hi"));
    free(s);
    CHECK(stream_matches(t, (int32_t[]){ 0, 6, 6, 1 }, 4, 1, "hi hi"));
    sf_tok_free(t);
}

/* ---- random strings: lossless round trips, whole-UTF-8 streaming, no crash on random bytes ---- */
static void random_text(sf_rng *r, tok_buf *b, int specials)
{
    static const uint32_t ranges[][2] = {
        { 0x20, 0x7e }, { 0x20, 0x20 }, { 0x09, 0x0a }, { 0x30, 0x39 }, { 0xa0, 0x17f }, { 0x300, 0x36f }, { 0x391, 0x3c9 },
        { 0x400, 0x44f }, { 0x5d0, 0x5ea }, { 0x627, 0x64a }, { 0x905, 0x939 }, { 0xe01, 0xe3a }, { 0x2000, 0x206f },
        { 0x3041, 0x30ff }, { 0x4e00, 0x9fff }, { 0xac00, 0xd7a3 }, { 0x1f300, 0x1f64f }, { 0x1f900, 0x1f9ff },
        { 0x200d, 0x200d }, { 0xfe0f, 0xfe0f }, { 0x10000, 0x10ffff },
    };
    static const char *const sp[] = { "<s>", "</s>", "<|endoftext|>", "<unk>" };
    b->len = 0;
    tok_buf_put(b, "", 0);
    int n = (int)(sf_rng_next(r) % 40);
    for (int i = 0; i < n; i++) {
        if (specials && sf_rng_next(r) % 25 == 0) {
            tok_buf_puts(b, sp[sf_rng_next(r) % 4]);
            continue;
        }
        const uint32_t *g = ranges[sf_rng_next(r) % SF_ARRAY_LEN(ranges)];
        uint32_t cp = g[0] + (uint32_t)(sf_rng_next(r) % (g[1] - g[0] + 1));
        if (cp >= 0xd800 && cp <= 0xdfff) cp = 'x';
        tok_utf8_put(b, cp);
    }
}

static void random_roundtrips(const char *dir, int specials)
{
    sf_tokenizer *t = load_dir(dir);
    REQUIRE(t, "load %s", dir);
    sf_rng r;
    sf_rng_seed(&r, 1234);
    tok_buf b = { 0 };
    int bad = 0;
    for (int it = 0; it < 300; it++) {
        random_text(&r, &b, specials);
        int32_t *ids = NULL;
        size_t n = 0;
        char *back = NULL;
        sf_error err = { 0 };
        int ok = sf_tok_encode(t, b.p, b.len, 0, &ids, &n, &err) == 0 && sf_tok_decode(t, ids, n, 0, &back, &err) == 0 &&
                 !strcmp(back, b.p) && stream_matches(t, ids, n, 0, back);
        if (!ok && bad++ < 3) printf("#   %s: \"%s\" -> \"%s\" %s\n", dir, b.p, back ? back : "", err.msg);
        free(ids);
        free(back);
    }
    CHECK_MSG(bad == 0, "%d of 300 random strings do not round-trip", bad);
    /* random bytes: valid UTF-8 or a clean SF_EINVAL, never a crash */
    for (int it = 0; it < 300; it++) {
        unsigned char raw[48];
        size_t n = sf_rng_next(&r) % sizeof raw;
        for (size_t i = 0; i < n; i++) raw[i] = (unsigned char)sf_rng_next(&r);
        int32_t *ids = NULL;
        size_t k = 0;
        int rc = sf_tok_encode(t, (const char *)raw, n, 1, &ids, &k, NULL);
        CHECK(rc == SF_OK || (rc == SF_EINVAL && !ids));
        CHECK((rc == SF_OK) == (tok_utf8_check((const char *)raw, n) == n));
        free(ids);
    }
    free(b.p);
    sf_tok_free(t);
}

/* byte-level BPE is lossless for any text, special tokens included */
TEST(random_roundtrip_gpt2) { random_roundtrips("gpt2-tokenizer", 1); }
/* SentencePiece-style: lossless too, as long as no special token sits in the text (HF then
 * prepends "▁" to the text after it, which decodes as an extra space) */
TEST(random_roundtrip_tinyllama) { random_roundtrips("tinyllama-1.1b-chat-v1.0", 0); }

TEST(nfc)
{
    /* expected values from Python's unicodedata.normalize('NFC', ...) */
    static const struct { const char *in, *out; } cases[] = {
        { "e\xcc\x81", "\xc3\xa9" },                                   /* e + acute -> é */
        { "\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xea\xb0\x81" },    /* Hangul jamo L V T -> 각 */
        { "\xe2\x84\xab", "\xc3\x85" },                                /* ANGSTROM SIGN (singleton) -> Å */
        { "a\xcc\x82\xcc\xa3", "\xe1\xba\xad" },                       /* marks reordered, then composed: ậ */
        { "q\xcc\x87\xcc\xa3", "q\xcc\xa3\xcc\x87" },                  /* no composite: only reordered */
        { "\xcc\x81" "e", "\xcc\x81" "e" },                            /* a leading mark stays */
        { "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 plain ascii", "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 plain ascii" },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        tok_buf b = { 0 };
        CHECK(tok_nfc(&b, cases[i].in, strlen(cases[i].in)) == 0);
        CHECK_MSG(b.p && !strcmp(b.p, cases[i].out), "case %zu: got \"%s\"", i, b.p ? b.p : "");
        free(b.p);
    }
    /* as a normalizer: the decomposed input reaches the model composed */
    sf_error err = { 0 };
    static const char *const words[] = { "caf\xc3\xa9", NULL };
    sf_tokenizer *t = make_tok(NULL, words, NULL, json_pack("{s:s}", "type", "NFC"), &err);
    REQUIRE(t, "%s", err.msg);
    CHECK(pieces_are(t, "cafe\xcc\x81", words));
    sf_tok_free(t);
}

TEST(added_tokens_normalized)
{
    /* normalized: true tokens are found in the normalized text (spaces became "_" here), the
     * others in the raw input */
    sf_error err = { 0 };
    static const char *const words[] = { "a_", "_b", NULL };
    json_t *added = json_array();
    json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b}", "id", 600, "content", "x_y", "normalized", 1, "special", 0));
    json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b}", "id", 601, "content", "p q", "normalized", 0, "special", 1));
    json_t *norm = json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "String", " ", "content", "_");
    sf_tokenizer *t = make_tok(NULL, words, added, norm, &err);
    REQUIRE(t, "%s", err.msg);
    static const char *const w1[] = { "a_", "x_y", "_b", NULL };
    CHECK(pieces_are(t, "a x y b", w1));
    static const char *const w2[] = { "a_", "p q", "_b", NULL };
    CHECK(pieces_are(t, "a p q b", w2));
    sf_tok_free(t);
}

TEST(config_add_bos_eos)
{
    /* LlamaTokenizerFast rebuilds its post-processor from add_bos_token / add_eos_token */
    char *json = NULL;
    sf_error err = { 0 };
    int rc = sf_read_file(test_data("tinyllama-1.1b-chat-v1.0/tokenizer.json"), &json, NULL, &err);
    REQUIRE(rc == 0, "%s", err.msg);
    static const struct { const char *cfg; int32_t want[4]; size_t n; } cases[] = {
        { "{\"tokenizer_class\": \"LlamaTokenizer\", \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}", { 1, 15043 }, 2 },
        { "{\"tokenizer_class\": \"LlamaTokenizer\", \"eos_token\": \"</s>\", \"add_eos_token\": true}", { 1, 15043, 2 }, 3 },
        { "{\"tokenizer_class\": \"LlamaTokenizer\", \"add_bos_token\": false}", { 15043 }, 1 },
        { "{\"tokenizer_class\": \"PreTrainedTokenizerFast\", \"add_bos_token\": false}", { 1, 15043 }, 2 },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        sf_tokenizer *t = NULL;
        rc = sf_tok_load_json(json, cases[i].cfg, &t, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        if (rc) continue;
        CHECK_MSG(encodes_to(t, "Hello", cases[i].want, cases[i].n), "config %zu", i);
        sf_tok_free(t);
    }
    free(json);
}

TEST(streaming_invalid_bytes_and_bounded_window)
{
    sf_tokenizer *t = load_dir("tinyllama-1.1b-chat-v1.0");
    REQUIRE(t, "load");
    int32_t e2 = 3 + 0xE2, x82 = 3 + 0x82, xac = 3 + 0xAC, x80 = 3 + 0x80; /* <0xNN> is id 3 + NN */
    int32_t x_id = sf_tok_lookup(t, "\xe2\x96\x81x");
    REQUIRE(x_id > 0 && !strcmp(sf_tok_piece(t, e2), "<0xE2>"), "vocab layout");
    /* "€" is released once whole; a stray continuation byte after it turns HF's whole byte run
     * into U+FFFDs, which cannot be taken back: the stream stays whole UTF-8 and says "€� x" */
    int32_t ids[] = { e2, x82, xac, x80, x_id };
    sf_detok d;
    char *out = NULL;
    size_t len = 0, prev = 0;
    sf_detok_init(&d, t, 1);
    for (size_t i = 0; i < SF_ARRAY_LEN(ids); i++) {
        CHECK(sf_detok_push(&d, ids[i], &out, &len) == 0);
        CHECK_MSG(tok_utf8_check(out + prev, len - prev) == len - prev, "piece %zu not UTF-8", i);
        if (i == 2) CHECK_MSG(len == 3 && !memcmp(out, "\xe2\x82\xac", 3), "euro not released whole");
        prev = len;
    }
    CHECK(sf_detok_finish(&d, &out, &len) == 0);
    CHECK_MSG(len == 8 && !memcmp(out, "\xe2\x82\xac\xef\xbf\xbd x", 8), "got \"%.*s\"", (int)len, out);
    sf_detok_free(&d);
    free(out);
    /* hostile id streams: skipped specials and endless invalid bytes keep the window small and
     * the stream equal to the full decode */
    static int32_t many[20000];
    for (size_t i = 0; i < SF_ARRAY_LEN(many); i++) many[i] = i % 2 ? x80 : 1; /* <s>, <0x80>, ... */
    out = NULL;
    len = 0;
    size_t widest = 0;
    sf_detok_init(&d, t, 1);
    for (size_t i = 0; i < SF_ARRAY_LEN(many); i++) {
        CHECK(sf_detok_push(&d, many[i], &out, &len) == 0);
        if (d.n - d.prefix_off > widest) widest = d.n - d.prefix_off;
    }
    CHECK(sf_detok_finish(&d, &out, &len) == 0);
    CHECK_MSG(widest <= 8, "decode window grew to %zu tokens", widest);
    char *full = NULL;
    CHECK(sf_tok_decode(t, many, SF_ARRAY_LEN(many), 1, &full, NULL) == 0);
    CHECK(full && len == strlen(full) && !memcmp(out, full, len) && len == 3 * SF_ARRAY_LEN(many) / 2);
    free(full);
    free(out);
    sf_detok_free(&d);
    sf_tok_free(t);
}

int main(void)
{
    RUN(byte_table);
    RUN(conformance_gpt2);
    RUN(conformance_tinyllama);
    RUN(gguf_spm_llama2);
    RUN(gguf_bpe_gpt2);
    RUN(split_llama3_regex);
    RUN(split_qwen2_regex);
    RUN(split_gpt2_regex);
    RUN(split_behaviors);
    RUN(metaspace_and_digits);
    RUN(added_token_flags);
    RUN(added_tokens_normalized);
    RUN(unk_and_byte_fallback);
    RUN(metaspace_roundtrip_and_post);
    RUN(config_add_bos_eos);
    RUN(normalizers);
    RUN(nfc);
    RUN(hard_cases_gpt2);
    RUN(hard_cases_tinyllama);
    RUN(streaming_holds_partial_utf8);
    RUN(streaming_invalid_bytes_and_bounded_window);
    RUN(random_roundtrip_gpt2);
    RUN(random_roundtrip_tinyllama);
    RUN(invalid_utf8);
    RUN(bad_tokenizer_json);
    RUN(threads_share_a_tokenizer);
    RUN(speed);
    return test_summary();
}
