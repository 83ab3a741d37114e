/* tok_json.c — Hugging Face tokenizer.json (+ tokenizer_config.json) into a sf_tokenizer.
 *
 * Supported: model BPE; normalizers Sequence/Prepend/Replace/NFC; pre-tokenizers
 * ByteLevel/Split/Metaspace/Digits/WhitespaceSplit/Sequence; post-processors
 * TemplateProcessing/ByteLevel/RobertaProcessing/BertProcessing/Sequence; decoders
 * ByteLevel/Replace/ByteFallback/Fuse/Strip/Metaspace/Sequence. Anything else is rejected
 * with a message naming the component, so a tokenizer never silently encodes differently. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

const char tok_re_gpt2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static const char *jstr(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int jbool(json_t *o, const char *key, int dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

/* A {"String": s} or {"Regex": r} pattern. Exactly one of *str / *re is set. */
static int parse_pattern(json_t *pat, const char *where, char **str, pcre2_code **re, sf_error *err)
{
    const char *s = jstr(pat, "String"), *r = jstr(pat, "Regex");
    if (s) {
        if (!*s) return sf_err(err, SF_EFORMAT, "tokenizer.json: %s has an empty String pattern", where);
        if (!(*str = strdup(s))) return sf_err(err, SF_ENOMEM, "out of memory");
        return SF_OK;
    }
    if (r) {
        *re = tok_regex(r, err);
        return *re ? SF_OK : sf_err_wrap(err, "tokenizer.json: %s", where);
    }
    return sf_err(err, SF_EFORMAT, "tokenizer.json: %s needs a pattern {\"String\": ...} or {\"Regex\": ...}", where);
}

/* ---- normalizers ---------------------------------------------------------------------------- */
static int add_norm(sf_tokenizer *t, json_t *n, sf_error *err)
{
    const char *type = jstr(n, "type");
    if (!type) return sf_err(err, SF_EFORMAT, "tokenizer.json: normalizer without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers"), *it;
        size_t i;
        if (!json_is_array(list)) return sf_err(err, SF_EFORMAT, "tokenizer.json: Sequence normalizer without a \"normalizers\" array");
        json_array_foreach(list, i, it) {
            int rc = add_norm(t, it, err);
            if (rc) return rc;
        }
        return SF_OK;
    }
    tok_norm nm = { 0 };
    if (!strcmp(type, "Prepend")) {
        nm.kind = TOK_NORM_PREPEND;
        if (!jstr(n, "prepend")) return sf_err(err, SF_EFORMAT, "tokenizer.json: Prepend normalizer without \"prepend\"");
        nm.a = xstrdup(jstr(n, "prepend"));
    } else if (!strcmp(type, "Replace")) {
        nm.kind = TOK_NORM_REPLACE;
        const char *content = jstr(n, "content");
        if (!content) return sf_err(err, SF_EFORMAT, "tokenizer.json: Replace normalizer without \"content\"");
        int rc = parse_pattern(json_object_get(n, "pattern"), "Replace normalizer", &nm.a, &nm.re, err);
        if (rc) return rc;
        nm.b = xstrdup(content);
    } else if (!strcmp(type, "NFC")) {
        nm.kind = TOK_NORM_NFC;
    } else {
        return sf_err(err, SF_EUNSUPPORTED,
                      "tokenizer.json: normalizer \"%s\" is not supported (supported: Sequence, Prepend, Replace, NFC)", type);
    }
    tok_norm *p = realloc(t->norms, (size_t)(t->n_norms + 1) * sizeof *p);
    if (!p) return sf_err(err, SF_ENOMEM, "out of memory");
    t->norms = p;
    t->norms[t->n_norms++] = nm;
    return SF_OK;
}

/* ---- pre-tokenizers ------------------------------------------------------------------------- */
static int parse_prepend_scheme(json_t *o, int *scheme)
{
    const char *s = jstr(o, "prepend_scheme");
    if (s) {
        if (!strcmp(s, "always")) *scheme = TOK_PREPEND_ALWAYS;
        else if (!strcmp(s, "first")) *scheme = TOK_PREPEND_FIRST;
        else if (!strcmp(s, "never")) *scheme = TOK_PREPEND_NEVER;
        else return -1;
    } else {
        *scheme = jbool(o, "add_prefix_space", 1) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    }
    return 0;
}

static int copy_replacement(json_t *o, char out[8], sf_error *err)
{
    const char *r = jstr(o, "replacement");
    if (!r) r = "\xe2\x96\x81";
    size_t n = strlen(r);
    if (n == 0 || n >= 8 || tok_utf8_len((const unsigned char *)r, n) != (int)n)
        return sf_err(err, SF_EFORMAT, "tokenizer.json: Metaspace replacement must be one character, got \"%s\"", r);
    memcpy(out, r, n + 1);
    return SF_OK;
}

static int add_pre(sf_tokenizer *t, json_t *n, sf_error *err)
{
    const char *type = jstr(n, "type");
    int rc;
    if (!type) return sf_err(err, SF_EFORMAT, "tokenizer.json: pre_tokenizer without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "pretokenizers"), *it;
        size_t i;
        if (!json_is_array(list)) return sf_err(err, SF_EFORMAT, "tokenizer.json: Sequence pre_tokenizer without a \"pretokenizers\" array");
        json_array_foreach(list, i, it) {
            if ((rc = add_pre(t, it, err))) return rc;
        }
        return SF_OK;
    }
    tok_pre pr = { 0 };
    if (!strcmp(type, "ByteLevel")) {
        pr.kind = TOK_PRE_BYTELEVEL;
        pr.add_prefix_space = jbool(n, "add_prefix_space", 1);
        if (jbool(n, "use_regex", 1) && !(pr.re = tok_regex(tok_re_gpt2, err))) return sf_err_wrap(err, "ByteLevel pre_tokenizer");
    } else if (!strcmp(type, "Split")) {
        pr.kind = TOK_PRE_SPLIT;
        char *str = NULL;
        if ((rc = parse_pattern(json_object_get(n, "pattern"), "Split pre_tokenizer", &str, &pr.re, err))) return rc;
        if (str) { /* a literal: escape every ASCII punctuation/space byte and compile it */
            size_t L = strlen(str), k = 0;
            char *q = malloc(2 * L + 1);
            if (!q) {
                free(str);
                return sf_err(err, SF_ENOMEM, "out of memory");
            }
            for (size_t i = 0; i < L; i++) {
                unsigned char c = (unsigned char)str[i];
                if (c < 0x80 && !((c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'))) q[k++] = '\\';
                q[k++] = (char)c;
            }
            q[k] = 0;
            pr.re = tok_regex(q, err);
            free(q);
            free(str);
            if (!pr.re) return err->code;
        }
        const char *b = jstr(n, "behavior");
        if (!b) b = "Isolated";
        if (!strcmp(b, "Removed")) pr.behavior = TOK_SPLIT_REMOVED;
        else if (!strcmp(b, "Isolated")) pr.behavior = TOK_SPLIT_ISOLATED;
        else if (!strcmp(b, "MergedWithPrevious")) pr.behavior = TOK_SPLIT_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext")) pr.behavior = TOK_SPLIT_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous")) pr.behavior = TOK_SPLIT_CONTIGUOUS;
        else {
            pcre2_code_free(pr.re);
            return sf_err(err, SF_EUNSUPPORTED, "tokenizer.json: Split behavior \"%s\" is not supported", b);
        }
        pr.invert = jbool(n, "invert", 0);
    } else if (!strcmp(type, "Metaspace")) {
        pr.kind = TOK_PRE_METASPACE;
        if ((rc = copy_replacement(n, pr.replacement, err))) return rc;
        if (parse_prepend_scheme(n, &pr.prepend_scheme))
            return sf_err(err, SF_EFORMAT, "tokenizer.json: Metaspace prepend_scheme must be always|first|never");
        pr.split = jbool(n, "split", 1);
    } else if (!strcmp(type, "Digits")) {
        pr.kind = TOK_PRE_DIGITS;
        pr.behavior = jbool(n, "individual_digits", 0) ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS;
        if (!(pr.re = tok_regex("\\p{N}", err))) return err->code; /* Rust char::is_numeric */
    } else if (!strcmp(type, "WhitespaceSplit")) {
        pr.kind = TOK_PRE_WSPLIT;
        if (!(pr.re = tok_regex("\\s+", err))) return err->code;
    } else {
        return sf_err(err, SF_EUNSUPPORTED,
                      "tokenizer.json: pre_tokenizer \"%s\" is not supported (supported: ByteLevel, Split, Metaspace, "
                      "Digits, WhitespaceSplit, Sequence)", type);
    }
    tok_pre *p = realloc(t->pres, (size_t)(t->n_pres + 1) * sizeof *p);
    if (!p) {
        pcre2_code_free(pr.re);
        return sf_err(err, SF_ENOMEM, "out of memory");
    }
    t->pres = p;
    t->pres[t->n_pres++] = pr;
    return SF_OK;
}

/* ---- decoders ----------------------------------------------------------------------------- */
static int add_dec(sf_tokenizer *t, json_t *n, sf_error *err)
{
    const char *type = jstr(n, "type");
    int rc;
    if (!type) return sf_err(err, SF_EFORMAT, "tokenizer.json: decoder without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "decoders"), *it;
        size_t i;
        if (!json_is_array(list)) return sf_err(err, SF_EFORMAT, "tokenizer.json: Sequence decoder without a \"decoders\" array");
        json_array_foreach(list, i, it) {
            if ((rc = add_dec(t, it, err))) return rc;
        }
        return SF_OK;
    }
    tok_dec d = { 0 };
    if (!strcmp(type, "ByteLevel")) {
        d.kind = TOK_DEC_BYTELEVEL;
    } else if (!strcmp(type, "Replace")) {
        d.kind = TOK_DEC_REPLACE;
        pcre2_code *re = NULL;
        if ((rc = parse_pattern(json_object_get(n, "pattern"), "Replace decoder", &d.a, &re, err))) return rc;
        if (re) {
            pcre2_code_free(re);
            return sf_err(err, SF_EUNSUPPORTED, "tokenizer.json: Replace decoder with a Regex pattern is not supported");
        }
        d.b = xstrdup(jstr(n, "content") ? jstr(n, "content") : "");
    } else if (!strcmp(type, "ByteFallback")) {
        d.kind = TOK_DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d.kind = TOK_DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        d.kind = TOK_DEC_STRIP;
        d.a = xstrdup(jstr(n, "content") ? jstr(n, "content") : " ");
        d.start = (int)json_integer_value(json_object_get(n, "start"));
        d.stop = (int)json_integer_value(json_object_get(n, "stop"));
    } else if (!strcmp(type, "Metaspace")) {
        d.kind = TOK_DEC_METASPACE;
        if ((rc = copy_replacement(n, d.replacement, err))) return rc;
        if (parse_prepend_scheme(n, &d.prepend_scheme))
            return sf_err(err, SF_EFORMAT, "tokenizer.json: Metaspace prepend_scheme must be always|first|never");
    } else {
        return sf_err(err, SF_EUNSUPPORTED,
                      "tokenizer.json: decoder \"%s\" is not supported (supported: ByteLevel, Replace, ByteFallback, "
                      "Fuse, Strip, Metaspace, Sequence)", type);
    }
    tok_dec *p = realloc(t->decs, (size_t)(t->n_decs + 1) * sizeof *p);
    if (!p) return sf_err(err, SF_ENOMEM, "out of memory");
    t->decs = p;
    t->decs[t->n_decs++] = d;
    return SF_OK;
}

/* ---- post-processor ----------------------------------------------------------------------- */
static int post_push(int32_t **v, int *n, int32_t id)
{
    int32_t *p = realloc(*v, (size_t)(*n + 1) * sizeof *p);
    if (!p) return SF_ENOMEM;
    *v = p;
    p[(*n)++] = id;
    return SF_OK;
}

/* [name, id] pair of Roberta/Bert processors */
static int pair_id(json_t *pair)
{
    return json_is_array(pair) && json_is_integer(json_array_get(pair, 1)) ? (int)json_integer_value(json_array_get(pair, 1)) : -1;
}

static int add_post(sf_tokenizer *t, json_t *n, sf_error *err)
{
    const char *type = jstr(n, "type");
    if (!type) return sf_err(err, SF_EFORMAT, "tokenizer.json: post_processor without a \"type\"");
    if (!strcmp(type, "ByteLevel")) return SF_OK; /* offsets only */
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "processors"), *it;
        size_t i;
        json_array_foreach(list, i, it) {
            int rc = add_post(t, it, err);
            if (rc) return rc;
        }
        return SF_OK;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        int cls = pair_id(json_object_get(n, "cls")), sep = pair_id(json_object_get(n, "sep"));
        if (cls < 0 || sep < 0) return sf_err(err, SF_EFORMAT, "tokenizer.json: %s needs \"cls\" and \"sep\" as [token, id]", type);
        if (post_push(&t->post_pre, &t->n_post_pre, cls) || post_push(&t->post_post, &t->n_post_post, sep))
            return sf_err(err, SF_ENOMEM, "out of memory");
        return SF_OK;
    }
    if (strcmp(type, "TemplateProcessing"))
        return sf_err(err, SF_EUNSUPPORTED,
                      "tokenizer.json: post_processor \"%s\" is not supported (supported: TemplateProcessing, ByteLevel, "
                      "RobertaProcessing, BertProcessing, Sequence)", type);
    json_t *single = json_object_get(n, "single"), *specials = json_object_get(n, "special_tokens"), *it;
    size_t i;
    int seen_a = 0;
    if (!json_is_array(single)) return sf_err(err, SF_EFORMAT, "tokenizer.json: TemplateProcessing without a \"single\" template");
    json_array_foreach(single, i, it) {
        json_t *sp = json_object_get(it, "SpecialToken");
        if (json_object_get(it, "Sequence")) {
            seen_a = 1;
            continue;
        }
        const char *name = jstr(sp, "id");
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids"), *idv;
        size_t k;
        if (!name || !json_is_array(ids))
            return sf_err(err, SF_EFORMAT, "tokenizer.json: TemplateProcessing item %zu names a special token missing from \"special_tokens\"", i);
        json_array_foreach(ids, k, idv) {
            if (post_push(seen_a ? &t->post_post : &t->post_pre, seen_a ? &t->n_post_post : &t->n_post_pre,
                          (int32_t)json_integer_value(idv)))
                return sf_err(err, SF_ENOMEM, "out of memory");
        }
    }
    return SF_OK;
}

/* ---- model ---------------------------------------------------------------------------------- */
static int load_bpe(sf_tokenizer *t, json_t *model, sf_error *err)
{
    const char *type = jstr(model, "type");
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges"), *v;
    const char *key;
    int max_id = -1, rc;
    if (type && strcmp(type, "BPE"))
        return sf_err(err, SF_EUNSUPPORTED, "tokenizer.json: model type \"%s\" is not supported (only BPE)", type);
    if (!json_is_object(vocab)) return sf_err(err, SF_EFORMAT, "tokenizer.json: model.vocab is missing or not an object");
    const char *csp = jstr(model, "continuing_subword_prefix"), *eow = jstr(model, "end_of_word_suffix");
    if ((csp && *csp) || (eow && *eow))
        return sf_err(err, SF_EUNSUPPORTED, "tokenizer.json: BPE continuing_subword_prefix/end_of_word_suffix "
                      "(\"%s\"/\"%s\") are not supported; only empty ones are", csp ? csp : "", eow ? eow : "");
    if (json_is_number(json_object_get(model, "dropout")) && json_number_value(json_object_get(model, "dropout")) > 0)
        return sf_err(err, SF_EUNSUPPORTED, "tokenizer.json: BPE dropout is not supported for inference");
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 16777216)
            return sf_err(err, SF_EFORMAT, "tokenizer.json: model.vocab[\"%.64s\"] is not a token id", key);
        if (json_integer_value(v) > max_id) max_id = (int)json_integer_value(v);
    }
    if ((rc = tok_alloc_vocab(t, max_id + 1))) return sf_err(err, rc, "out of memory for %d tokens", max_id + 1);
    json_object_foreach(vocab, key, v) {
        int id = (int)json_integer_value(v);
        if (t->pieces[id]) return sf_err(err, SF_EFORMAT, "tokenizer.json: token id %d appears twice in model.vocab", id);
        if (!(t->pieces[id] = strdup(key))) return sf_err(err, SF_ENOMEM, "out of memory");
        t->piece_len[id] = (uint32_t)strlen(key);
    }
    t->model = TOK_MODEL_BPE;
    t->byte_fallback = jbool(model, "byte_fallback", 0);
    t->fuse_unk = jbool(model, "fuse_unk", 0);
    t->ignore_merges = jbool(model, "ignore_merges", 0);
    const char *unk = jstr(model, "unk_token");
    t->unk_id = -1;
    if (unk) {
        json_t *u = json_object_get(vocab, unk);
        if (!json_is_integer(u)) return sf_err(err, SF_EFORMAT, "tokenizer.json: unk_token \"%s\" is not in model.vocab", unk);
        t->unk_id = (int32_t)json_integer_value(u);
    }
    /* vocab map first: merges are resolved through it */
    if (tok_strmap_init(&t->vocab, (size_t)t->n_vocab)) return sf_err(err, SF_ENOMEM, "out of memory");
    for (int i = 0; i < t->n_vocab; i++)
        if (t->pieces[i]) tok_strmap_put(&t->vocab, t->pieces, t->piece_len, i);
    size_t nm = json_array_size(merges), i;
    if (merges && !json_is_array(merges)) return sf_err(err, SF_EFORMAT, "tokenizer.json: model.merges is not an array");
    if (tok_mergemap_init(&t->merges, nm)) return sf_err(err, SF_ENOMEM, "out of memory");
    char *tmp = NULL;
    size_t tmpcap = 0;
    rc = SF_OK;
    json_array_foreach(merges, i, v) {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(v)) {
            const char *s = json_string_value(v), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = sf_err(err, SF_EFORMAT, "tokenizer.json: merge %zu \"%.64s\" is not \"left right\"", i, s);
                break;
            }
            a = s; la = (size_t)(sp - s); b = sp + 1; lb = strlen(b);
        } else if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) &&
                   json_is_string(json_array_get(v, 1))) {
            a = json_string_value(json_array_get(v, 0)); la = json_string_length(json_array_get(v, 0));
            b = json_string_value(json_array_get(v, 1)); lb = json_string_length(json_array_get(v, 1));
        } else {
            rc = sf_err(err, SF_EFORMAT, "tokenizer.json: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", i);
            break;
        }
        int32_t ia = tok_strmap_get(&t->vocab, t->pieces, t->piece_len, a, la);
        int32_t ib = tok_strmap_get(&t->vocab, t->pieces, t->piece_len, b, lb);
        if (la + lb + 1 > tmpcap) {
            tmpcap = (la + lb + 1) * 2;
            char *p = realloc(tmp, tmpcap);
            if (!p) { rc = sf_err(err, SF_ENOMEM, "out of memory"); break; }
            tmp = p;
        }
        memcpy(tmp, a, la);
        memcpy(tmp + la, b, lb);
        int32_t im = tok_strmap_get(&t->vocab, t->pieces, t->piece_len, tmp, la + lb);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = sf_err(err, SF_EFORMAT, "tokenizer.json: merge %zu (\"%.*s\" + \"%.*s\") uses a token missing from model.vocab",
                        i, (int)SF_MIN(la, 40), a, (int)SF_MIN(lb, 40), b);
            break;
        }
        tok_mergemap_put(&t->merges, ia, ib, (int32_t)i, im);
    }
    free(tmp);
    return rc;
}

static int load_added(sf_tokenizer *t, json_t *added, sf_error *err)
{
    json_t *it;
    size_t i;
    if (!added || json_is_null(added)) return SF_OK;
    if (!json_is_array(added)) return sf_err(err, SF_EFORMAT, "tokenizer.json: added_tokens is not an array");
    int max_id = t->n_vocab - 1;
    json_array_foreach(added, i, it) {
        json_t *idv = json_object_get(it, "id");
        const char *c = jstr(it, "content");
        if (!json_is_integer(idv) || json_integer_value(idv) < 0 || json_integer_value(idv) > 16777216 || !c || !*c)
            return sf_err(err, SF_EFORMAT, "tokenizer.json: added_tokens[%zu] needs an integer \"id\" and a non-empty \"content\"", i);
        if (json_integer_value(idv) > max_id) max_id = (int)json_integer_value(idv);
    }
    if (max_id >= t->n_vocab && tok_alloc_vocab(t, max_id + 1)) return sf_err(err, SF_ENOMEM, "out of memory");
    t->added = calloc(json_array_size(added) ? json_array_size(added) : 1, sizeof *t->added);
    if (!t->added) return sf_err(err, SF_ENOMEM, "out of memory");
    json_array_foreach(added, i, it) {
        tok_added *a = &t->added[t->n_added++];
        a->id = (int32_t)json_integer_value(json_object_get(it, "id"));
        a->content = strdup(jstr(it, "content"));
        if (!a->content) return sf_err(err, SF_ENOMEM, "out of memory");
        a->len = strlen(a->content);
        a->special = jbool(it, "special", 0);
        a->lstrip = jbool(it, "lstrip", 0);
        a->rstrip = jbool(it, "rstrip", 0);
        a->single_word = jbool(it, "single_word", 0);
        a->normalized = jbool(it, "normalized", !a->special);
        if (!t->pieces[a->id]) {
            if (!(t->pieces[a->id] = strdup(a->content))) return sf_err(err, SF_ENOMEM, "out of memory");
            t->piece_len[a->id] = (uint32_t)a->len;
        }
        if (a->special) t->is_special[a->id] = 1;
    }
    return SF_OK;
}

/* bos_token / eos_token in tokenizer_config.json: a string or {"content": ...} */
static const char *config_token(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_string(v)) return json_string_value(v);
    return jstr(v, "content");
}

static int load_config(sf_tokenizer *t, const char *config_json, sf_error *err)
{
    json_error_t je;
    json_t *cfg = json_loads(config_json, 0, &je);
    int rc = SF_OK;
    if (!cfg || !json_is_object(cfg)) {
        rc = sf_err(err, SF_EFORMAT, "tokenizer_config.json: not a JSON object (line %d, column %d: %s)", je.line, je.column,
                    cfg ? "top level is not an object" : je.text);
        goto cleanup;
    }
    const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token");
    int32_t id;
    if (bos && (id = sf_tok_lookup(t, bos)) >= 0) {
        t->bos_id = id;
        t->bos_str = strdup(bos);
    }
    if (eos && (id = sf_tok_lookup(t, eos)) >= 0) {
        t->eos_id = id;
        t->eos_str = strdup(eos);
    }
    /* transformers' LlamaTokenizerFast / GemmaTokenizerFast rebuild the post-processor from
     * add_bos_token (default true) and add_eos_token (default false) when they load */
    const char *cls = jstr(cfg, "tokenizer_class");
    if (cls && (!strncmp(cls, "Llama", 5) || !strncmp(cls, "CodeLlama", 9) || !strncmp(cls, "Gemma", 5))) {
        int add_bos = jbool(cfg, "add_bos_token", 1), add_eos = jbool(cfg, "add_eos_token", 0);
        t->n_post_pre = t->n_post_post = 0;
        if ((add_bos && t->bos_id >= 0 && post_push(&t->post_pre, &t->n_post_pre, t->bos_id)) ||
            (add_eos && t->eos_id >= 0 && post_push(&t->post_post, &t->n_post_post, t->eos_id))) {
            rc = sf_err(err, SF_ENOMEM, "out of memory");
            goto cleanup;
        }
    }
    json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct)) {
        t->chat_template = strdup(json_string_value(ct));
    } else if (json_is_array(ct)) { /* [{name, template}, ...]: take "default", else the first */
        json_t *it;
        size_t i;
        const char *pick = NULL;
        json_array_foreach(ct, i, it) {
            const char *name = jstr(it, "name"), *tpl = jstr(it, "template");
            if (tpl && (!pick || (name && !strcmp(name, "default")))) pick = tpl;
        }
        if (pick) t->chat_template = strdup(pick);
    }
cleanup:
    json_decref(cfg);
    return rc;
}

int tok_load_hf(sf_tokenizer *t, const char *json, const char *config_json, sf_error *err)
{
    json_error_t je;
    json_t *root = json_loads(json, JSON_ALLOW_NUL, &je), *n;
    int rc;
    if (!root) {
        rc = sf_err(err, SF_EFORMAT, "tokenizer.json is not valid JSON (line %d, column %d: %s); re-download it", je.line,
                    je.column, je.text);
        goto cleanup;
    }
    if (!json_is_object(root) || !json_is_object(json_object_get(root, "model"))) {
        rc = sf_err(err, SF_EFORMAT, "tokenizer.json has no \"model\" object; is this a Hugging Face tokenizers file?");
        goto cleanup;
    }
    t->bos_id = t->eos_id = -1;
    if ((rc = load_bpe(t, json_object_get(root, "model"), err))) goto cleanup;
    if ((rc = load_added(t, json_object_get(root, "added_tokens"), err))) goto cleanup;
    if ((n = json_object_get(root, "normalizer")) && !json_is_null(n) && (rc = add_norm(t, n, err))) goto cleanup;
    if ((n = json_object_get(root, "pre_tokenizer")) && !json_is_null(n) && (rc = add_pre(t, n, err))) goto cleanup;
    if ((n = json_object_get(root, "decoder")) && !json_is_null(n)) {
        t->has_decoder = 1;
        if ((rc = add_dec(t, n, err))) goto cleanup;
    }
    if ((n = json_object_get(root, "post_processor")) && !json_is_null(n) && (rc = add_post(t, n, err))) goto cleanup;
    if ((rc = tok_finish(t, err))) goto cleanup;
    /* defaults, which tokenizer_config.json's bos_token / eos_token override: BOS is what the
     * post-processor puts first, EOS a conventional name */
    if (t->n_post_pre > 0) t->bos_id = t->post_pre[0];
    static const char *names[] = { "</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<eos>" };
    for (size_t i = 0; i < SF_ARRAY_LEN(names) && t->eos_id < 0; i++) t->eos_id = sf_tok_lookup(t, names[i]);
    if (config_json && (rc = load_config(t, config_json, err))) goto cleanup;
    rc = SF_OK;
cleanup:
    json_decref(root);
    return rc;
}
