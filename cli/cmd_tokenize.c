/* cmd_tokenize.c — `semflow tokenize` and `semflow detokenize`.
 *
 *   semflow tokenize   --model M [--no-special] TEXT|-        prints the ids as a JSON array
 *   semflow detokenize --model M [--skip-special] ID...|'[ids]'  prints the text
 *
 * M is a Hugging Face folder (only its tokenizer.json/tokenizer_config.json are read, so this is
 * fast even for large models), a .gguf file or "demo". */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "common/sf.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

/* A folder: only its tokenizer files are read. A .gguf file or "demo": the model loader reads
 * it (the GGUF vocabulary lives in the model file) and the tokenizer is taken from it. */
static int load_tokenizer(const char *model, sf_tokenizer **t, sf_error *err)
{
    struct stat st;
    *t = NULL;
    if (strcmp(model, "demo") && stat(model, &st) == 0 && S_ISDIR(st.st_mode)) return sf_tok_load_dir(model, t, err);
    sf_load_opts o = { 0 };
    sf_model *m = NULL;
    int rc = sf_model_load(model, &o, &m, err);
    if (rc) return rc;
    if (!m->tok) {
        sf_model_free(m);
        return sf_err(err, SF_ENOTFOUND, "%s has no tokenizer (a GGUF file needs tokenizer.ggml.* metadata)", model);
    }
    *t = m->tok;
    m->tok = NULL;
    sf_model_free(m);
    return SF_OK;
}

static int read_stdin(char **out, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    if (!b) return SF_ENOMEM;
    for (;;) {
        if (n == cap) {
            char *p = realloc(b, cap *= 2);
            if (!p) { free(b); return SF_ENOMEM; }
            b = p;
        }
        size_t r = fread(b + n, 1, cap - n, stdin);
        n += r;
        if (r == 0) break;
    }
    *out = b;
    *len = n;
    return SF_OK;
}

static void usage(FILE *f, int detok)
{
    if (detok)
        fprintf(f, "usage: semflow detokenize --model M [--skip-special] ID... | '[ID, ...]'\n"
                   "  prints the text of the token ids (--skip-special drops BOS/EOS and other special tokens)\n");
    else
        fprintf(f, "usage: semflow tokenize --model M [--no-special] TEXT | -\n"
                   "  prints the token ids of TEXT (or of stdin with -) as a JSON array; BOS/EOS are added as\n"
                   "  Hugging Face's encode() does unless --no-special\n");
    fprintf(f, "  M: a Hugging Face model folder (reads tokenizer.json and tokenizer_config.json), a .gguf file,\n"
               "     or demo\n");
}

/* Shared option parsing: returns the index of the first positional argument, or -1 (usage). */
static int parse_opts(int argc, char **argv, int detok, const char **model, int *flag)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) { i++; break; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout, detok); exit(0); }
        if (!strcmp(a, "--model") || !strcmp(a, "-m")) {
            if (i + 1 >= argc) { fprintf(stderr, "semflow %s: --model needs a value\n", argv[0]); return -1; }
            *model = argv[++i];
        } else if (!strncmp(a, "--model=", 8)) {
            *model = a + 8;
        } else if (!strcmp(a, detok ? "--skip-special" : "--no-special")) {
            *flag = 1;
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "semflow %s: unknown option %s\n", argv[0], a);
            return -1;
        } else {
            break;
        }
    }
    if (!*model) { fprintf(stderr, "semflow %s: --model is required\n", argv[0]); return -1; }
    return i;
}

int sf_cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL;
    int no_special = 0, rc = 1;
    int first = parse_opts(argc, argv, 0, &model, &no_special);
    if (first < 0 || first != argc - 1) {
        if (first >= 0) fprintf(stderr, "semflow tokenize: give exactly one TEXT argument (quote it), or - for stdin\n");
        usage(stderr, 0);
        return 2;
    }
    sf_error err = { 0 };
    sf_tokenizer *t = NULL;
    char *text = NULL;
    size_t len;
    int32_t *ids = NULL;
    size_t n = 0;
    if (!strcmp(argv[first], "-")) {
        if (read_stdin(&text, &len)) { fprintf(stderr, "semflow tokenize: out of memory reading stdin\n"); goto cleanup; }
    } else if (!(text = strdup(argv[first]))) {
        goto cleanup;
    } else {
        len = strlen(text);
    }
    if (load_tokenizer(model, &t, &err)) { fprintf(stderr, "semflow tokenize: %s\n", err.msg); goto cleanup; }
    if (sf_tok_encode(t, text, len, !no_special, &ids, &n, &err)) { fprintf(stderr, "semflow tokenize: %s\n", err.msg); goto cleanup; }
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    printf("]\n");
    rc = 0;
cleanup:
    free(ids);
    free(text);
    sf_tok_free(t);
    return rc;
}

/* Collects ids from the arguments: integers, or one JSON array. */
static int parse_ids(int argc, char **argv, int first, int32_t **ids, size_t *n)
{
    size_t cap = (size_t)(argc - first) + 16;
    *n = 0;
    if (!(*ids = malloc(cap * sizeof **ids))) return -1;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (a[strspn(a, " \t")] == '[') {
            json_error_t je;
            json_t *arr = json_loads(a, 0, &je), *v;
            size_t k;
            if (!json_is_array(arr)) {
                fprintf(stderr, "semflow detokenize: argument %d is not a JSON array of integers (%s)\n", i - first + 1,
                        arr ? "not an array" : je.text);
                json_decref(arr);
                return -1;
            }
            json_array_foreach(arr, k, v) {
                if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
                    fprintf(stderr, "semflow detokenize: element %zu of the JSON array is not a token id\n", k);
                    json_decref(arr);
                    return -1;
                }
                if (*n == cap) {
                    int32_t *p = realloc(*ids, (cap *= 2) * sizeof *p);
                    if (!p) { json_decref(arr); return -1; }
                    *ids = p;
                }
                (*ids)[(*n)++] = (int32_t)json_integer_value(v);
            }
            json_decref(arr);
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(a, &end, 10);
        if (end == a || *end || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "semflow detokenize: \"%s\" is not a token id (give non-negative integers or a JSON array)\n", a);
            return -1;
        }
        if (*n == cap) {
            int32_t *p = realloc(*ids, (cap *= 2) * sizeof *p);
            if (!p) return -1;
            *ids = p;
        }
        (*ids)[(*n)++] = (int32_t)v;
    }
    return 0;
}

int sf_cmd_detokenize(int argc, char **argv)
{
    const char *model = NULL;
    int skip = 0, rc = 1;
    int first = parse_opts(argc, argv, 1, &model, &skip);
    if (first < 0 || first >= argc) {
        if (first >= 0) fprintf(stderr, "semflow detokenize: give token ids\n");
        usage(stderr, 1);
        return 2;
    }
    sf_error err = { 0 };
    sf_tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    if (parse_ids(argc, argv, first, &ids, &n)) {
        rc = 2;
        goto cleanup;
    }
    if (load_tokenizer(model, &t, &err)) { fprintf(stderr, "semflow detokenize: %s\n", err.msg); goto cleanup; }
    if (sf_tok_decode(t, ids, n, skip, &text, &err)) { fprintf(stderr, "semflow detokenize: %s\n", err.msg); goto cleanup; }
    fputs(text, stdout);
    putchar('\n');
    rc = 0;
cleanup:
    free(text);
    free(ids);
    sf_tok_free(t);
    return rc;
}
