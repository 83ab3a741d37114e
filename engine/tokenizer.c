/* tokenizer.c — loading (tokenizer.json folder/text, GGUF vocabulary), lifetime and lookups.
 * Encoding is in tok_encode.c / tok_bpe.c, decoding in tok_decode.c, chat templates in chat.c. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

const char tok_re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
const char tok_re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

pcre2_code *tok_regex(const char *pattern, sf_error *err)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        sf_err(err, SF_EFORMAT, "regex /%.200s/ does not compile at offset %zu: %s", pattern, (size_t)eo, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    return re;
}

int tok_alloc_vocab(sf_tokenizer *t, int n)
{
    int old = t->n_vocab;
    if (n <= old) return SF_OK;
    char **p = realloc(t->pieces, (size_t)n * sizeof *p);
    if (!p) return SF_ENOMEM;
    t->pieces = p;
    uint32_t *l = realloc(t->piece_len, (size_t)n * sizeof *l);
    if (!l) return SF_ENOMEM;
    t->piece_len = l;
    uint8_t *s = realloc(t->is_special, (size_t)n);
    if (!s) return SF_ENOMEM;
    t->is_special = s;
    uint8_t *e = realloc(t->is_eog, (size_t)n);
    if (!e) return SF_ENOMEM;
    t->is_eog = e;
    memset(p + old, 0, (size_t)(n - old) * sizeof *p);
    memset(l + old, 0, (size_t)(n - old) * sizeof *l);
    memset(s + old, 0, (size_t)(n - old));
    memset(e + old, 0, (size_t)(n - old));
    t->n_vocab = n;
    return SF_OK;
}

static int cmp_added(const void *a, const void *b)
{
    const tok_added *x = a, *y = b;
    unsigned cx = (unsigned char)x->content[0], cy = (unsigned char)y->content[0];
    if (cx != cy) return (int)cx - (int)cy;
    return x->len < y->len ? 1 : x->len > y->len ? -1 : 0; /* longest first within a bucket */
}

/* Token strings that end a turn in the chat formats we know. */
static const char *const eog_names[] = {
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>", "<|end_of_text|>", "<|end|>", "<end_of_turn>", "</s>",
};

int tok_finish(sf_tokenizer *t, sf_error *err)
{
    char name[8];
    for (int b = 0; b < 256; b++) {
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_id[b] = tok_strmap_get(&t->vocab, t->pieces, t->piece_len, name, 6);
    }
    if (t->n_added > 1) qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added);
    for (int c = 0, i = 0; c <= 256; c++) {
        while (i < t->n_added && (unsigned char)t->added[i].content[0] < c) i++;
        t->first_added[c] = i;
    }
    for (int i = 0; i < t->n_added; i++)
        for (size_t k = 0; k < SF_ARRAY_LEN(eog_names); k++)
            if (!strcmp(t->added[i].content, eog_names[k])) t->is_eog[t->added[i].id] = 1;
    for (int i = 0; i < t->n_post_pre; i++)
        if (t->post_pre[i] < 0 || t->post_pre[i] >= t->n_vocab)
            return sf_err(err, SF_EFORMAT, "post-processor adds token id %d, outside the vocabulary of %d", t->post_pre[i], t->n_vocab);
    for (int i = 0; i < t->n_post_post; i++)
        if (t->post_post[i] < 0 || t->post_post[i] >= t->n_vocab)
            return sf_err(err, SF_EFORMAT, "post-processor adds token id %d, outside the vocabulary of %d", t->post_post[i], t->n_vocab);
    return SF_OK;
}

/* Called after bos/eos are known: EOS always ends generation; template strings default to the pieces. */
static int finish_ids(sf_tokenizer *t)
{
    if (t->eos_id >= 0 && t->eos_id < t->n_vocab) t->is_eog[t->eos_id] = 1;
    if (!t->bos_str && t->bos_id >= 0 && t->pieces[t->bos_id] && !(t->bos_str = strdup(t->pieces[t->bos_id]))) return SF_ENOMEM;
    if (!t->eos_str && t->eos_id >= 0 && t->pieces[t->eos_id] && !(t->eos_str = strdup(t->pieces[t->eos_id]))) return SF_ENOMEM;
    return SF_OK;
}

void sf_tok_free(sf_tokenizer *t)
{
    if (!t) return;
    for (int i = 0; i < t->n_vocab; i++) free(t->pieces[i]);
    free(t->pieces);
    free(t->piece_len);
    free(t->scores);
    free(t->ptype);
    free(t->is_special);
    free(t->is_eog);
    tok_strmap_free(&t->vocab);
    tok_mergemap_free(&t->merges);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (int i = 0; i < t->n_norms; i++) {
        free(t->norms[i].a);
        free(t->norms[i].b);
        pcre2_code_free(t->norms[i].re);
    }
    free(t->norms);
    for (int i = 0; i < t->n_pres; i++) pcre2_code_free(t->pres[i].re);
    free(t->pres);
    for (int i = 0; i < t->n_decs; i++) {
        free(t->decs[i].a);
        free(t->decs[i].b);
    }
    free(t->decs);
    free(t->post_pre);
    free(t->post_post);
    free(t->chat_template);
    free(t->bos_str);
    free(t->eos_str);
    free(t);
}

int sf_tok_load_json(const char *json, const char *config_json, sf_tokenizer **out, sf_error *err)
{
    sf_error local;
    if (!err) err = &local; /* the loaders read err->code back */
    *out = NULL;
    if (!json) return sf_err(err, SF_EINVAL, "sf_tok_load_json: no tokenizer.json text given");
    sf_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return sf_err(err, SF_ENOMEM, "out of memory");
    int rc = tok_load_hf(t, json, config_json, err);
    if (!rc && finish_ids(t)) rc = sf_err(err, SF_ENOMEM, "out of memory");
    if (rc) {
        sf_tok_free(t);
        return rc;
    }
    *out = t;
    return SF_OK;
}

int sf_tok_load_dir(const char *dir, sf_tokenizer **out, sf_error *err)
{
    char path[4096];
    char *json = NULL, *cfg = NULL;
    int rc;
    *out = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if ((rc = sf_read_file(path, &json, NULL, err))) {
        if (rc == SF_ENOTFOUND)
            sf_err(err, rc, "%s not found: the model folder needs a Hugging Face tokenizer.json (tokenizer.model "
                   "alone is not supported; convert it with transformers' AutoTokenizer(...).save_pretrained)", path);
        goto cleanup;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (sf_read_file(path, &cfg, NULL, NULL)) cfg = NULL; /* optional */
    if ((rc = sf_tok_load_json(json, cfg, out, err))) sf_err_wrap(err, "loading tokenizer from %s", dir);
cleanup:
    free(json);
    free(cfg);
    return rc;
}

/* ---- GGUF vocabularies ---------------------------------------------------------------------- */
enum { GGUF_TOK_NORMAL = 1, GGUF_TOK_UNKNOWN, GGUF_TOK_CONTROL, GGUF_TOK_USER, GGUF_TOK_UNUSED, GGUF_TOK_BYTE };

/* Token type when the GGUF file has no tokenizer.ggml.token_type: <0xNN> pieces are bytes,
 * BOS/EOS control tokens, the unk id the unknown token. */
static int guess_type(const sf_tok_vocab *v, int i)
{
    const char *s = v->tokens[i];
    if (i == v->unk_id) return GGUF_TOK_UNKNOWN;
    if (i == v->bos_id || i == v->eos_id) return GGUF_TOK_CONTROL;
    if (strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>') return GGUF_TOK_BYTE;
    return GGUF_TOK_NORMAL;
}

static int push_norm(sf_tokenizer *t, int kind, const char *a, const char *b)
{
    tok_norm *p = realloc(t->norms, (size_t)(t->n_norms + 1) * sizeof *p);
    if (!p) return SF_ENOMEM;
    t->norms = p;
    p[t->n_norms] = (tok_norm){ .kind = kind, .a = a ? strdup(a) : NULL, .b = b ? strdup(b) : NULL };
    t->n_norms++;
    return (a && !p[t->n_norms - 1].a) || (b && !p[t->n_norms - 1].b) ? SF_ENOMEM : SF_OK;
}

static int push_dec(sf_tokenizer *t, tok_dec d)
{
    tok_dec *p = realloc(t->decs, (size_t)(t->n_decs + 1) * sizeof *p);
    if (!p) return SF_ENOMEM;
    t->decs = p;
    p[t->n_decs++] = d;
    t->has_decoder = 1;
    return SF_OK;
}

static int push_pre(sf_tokenizer *t, tok_pre pr)
{
    tok_pre *p = realloc(t->pres, (size_t)(t->n_pres + 1) * sizeof *p);
    if (!p) return SF_ENOMEM;
    t->pres = p;
    p[t->n_pres++] = pr;
    return SF_OK;
}

static int vocab_bpe_setup(sf_tokenizer *t, const sf_tok_vocab *v, sf_error *err)
{
    const char *pre = v->pre ? v->pre : "default";
    const char *re = NULL;
    if (!strcmp(pre, "default") || !strcmp(pre, "gpt-2") || !strcmp(pre, "gpt2") || !strcmp(pre, "smollm")) re = tok_re_gpt2;
    else if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "llama-v3")) re = tok_re_llama3;
    else if (!strcmp(pre, "qwen2") || !strcmp(pre, "deepseek-r1-qwen")) re = tok_re_qwen2;
    else
        return sf_err(err, SF_EUNSUPPORTED, "GGUF tokenizer.ggml.pre \"%s\" is not supported "
                      "(supported: default, gpt-2, smollm, llama-bpe, qwen2)", pre);
    tok_pre split = { .kind = TOK_PRE_SPLIT, .behavior = TOK_SPLIT_ISOLATED };
    if (!(split.re = tok_regex(re, err))) return err->code;
    if (push_pre(t, split)) {
        pcre2_code_free(split.re);
        return sf_err(err, SF_ENOMEM, "out of memory");
    }
    if (push_pre(t, (tok_pre){ .kind = TOK_PRE_BYTELEVEL }) || push_dec(t, (tok_dec){ .kind = TOK_DEC_BYTELEVEL }))
        return sf_err(err, SF_ENOMEM, "out of memory");
    t->ignore_merges = re == tok_re_llama3; /* as Llama-3's tokenizer.json sets */
    if (tok_mergemap_init(&t->merges, (size_t)v->n_merges)) return sf_err(err, SF_ENOMEM, "out of memory");
    for (int i = 0; i < v->n_merges; i++) {
        const char *m = v->merges[i], *sp = m ? strchr(m, ' ') : NULL;
        if (!sp) return sf_err(err, SF_EFORMAT, "GGUF merge %d \"%.64s\" is not \"left right\"", i, m ? m : "(null)");
        size_t la = (size_t)(sp - m), lb = strlen(sp + 1);
        int32_t a = tok_strmap_get(&t->vocab, t->pieces, t->piece_len, m, la);
        int32_t b = tok_strmap_get(&t->vocab, t->pieces, t->piece_len, sp + 1, lb);
        char *cat = malloc(la + lb + 1);
        if (!cat) return sf_err(err, SF_ENOMEM, "out of memory");
        memcpy(cat, m, la);
        memcpy(cat + la, sp + 1, lb);
        int32_t r = tok_strmap_get(&t->vocab, t->pieces, t->piece_len, cat, la + lb);
        free(cat);
        if (a < 0 || b < 0 || r < 0)
            return sf_err(err, SF_EFORMAT, "GGUF merge %d \"%.64s\" uses a token missing from the vocabulary", i, m);
        tok_mergemap_put(&t->merges, a, b, i, r);
    }
    return SF_OK;
}

static int vocab_spm_setup(sf_tokenizer *t, const sf_tok_vocab *v, sf_error *err)
{
    if (!v->scores) return sf_err(err, SF_EFORMAT, "GGUF SentencePiece vocabulary (model \"llama\") has no tokenizer.ggml.scores");
    t->scores = malloc((size_t)v->n_tokens * sizeof *t->scores);
    if (!t->scores) return sf_err(err, SF_ENOMEM, "out of memory");
    memcpy(t->scores, v->scores, (size_t)v->n_tokens * sizeof *t->scores);
    /* what llama.cpp and Llama-2's tokenizer.json do: "▁" prefix, spaces as "▁", byte fallback */
    if (push_norm(t, TOK_NORM_PREPEND, "\xe2\x96\x81", NULL) || push_norm(t, TOK_NORM_REPLACE, " ", "\xe2\x96\x81"))
        return sf_err(err, SF_ENOMEM, "out of memory");
    tok_dec rep = { .kind = TOK_DEC_REPLACE, .a = strdup("\xe2\x96\x81"), .b = strdup(" ") };
    if (!rep.a || !rep.b || push_dec(t, rep)) {
        free(rep.a);
        free(rep.b);
        return sf_err(err, SF_ENOMEM, "out of memory");
    }
    if (push_dec(t, (tok_dec){ .kind = TOK_DEC_BYTEFALLBACK }) || push_dec(t, (tok_dec){ .kind = TOK_DEC_FUSE }))
        return sf_err(err, SF_ENOMEM, "out of memory");
    tok_dec strip = { .kind = TOK_DEC_STRIP, .a = strdup(" "), .start = 1 };
    if (!strip.a || push_dec(t, strip)) {
        free(strip.a);
        return sf_err(err, SF_ENOMEM, "out of memory");
    }
    t->byte_fallback = 1;
    return SF_OK;
}

int sf_tok_from_vocab(const sf_tok_vocab *v, sf_tokenizer **out, sf_error *err)
{
    sf_tokenizer *t = NULL;
    sf_error local;
    int rc;
    if (!err) err = &local; /* the loaders read err->code back */
    *out = NULL;
    if (!v || !v->model || v->n_tokens <= 0 || !v->tokens)
        return sf_err(err, SF_EINVAL, "GGUF vocabulary is empty or has no tokenizer.ggml.model");
    int spm = !strcmp(v->model, "llama"), bpe = !strcmp(v->model, "gpt2");
    if (!spm && !bpe)
        return sf_err(err, SF_EUNSUPPORTED, "GGUF tokenizer.ggml.model \"%s\" is not supported (supported: llama, gpt2)", v->model);
    if (bpe && (v->n_merges <= 0 || !v->merges))
        return sf_err(err, SF_EFORMAT, "GGUF BPE vocabulary (model \"gpt2\") has no tokenizer.ggml.merges");
    if (!(t = calloc(1, sizeof *t))) return sf_err(err, SF_ENOMEM, "out of memory");
    t->model = spm ? TOK_MODEL_SPM : TOK_MODEL_BPE;
    t->unk_id = v->unk_id >= 0 && v->unk_id < v->n_tokens ? v->unk_id : -1;
    if ((rc = tok_alloc_vocab(t, v->n_tokens))) { sf_err(err, rc, "out of memory"); goto fail; }
    if (!(t->ptype = calloc((size_t)v->n_tokens, 1))) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto fail; }
    int n_added = 0;
    for (int i = 0; i < v->n_tokens; i++) {
        if (!v->tokens[i]) { rc = sf_err(err, SF_EFORMAT, "GGUF token %d has no text", i); goto fail; }
        if (!(t->pieces[i] = strdup(v->tokens[i]))) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto fail; }
        t->piece_len[i] = (uint32_t)strlen(v->tokens[i]);
        int ty = v->types ? v->types[i] : guess_type(v, i);
        if (ty < 0 || ty > 6) { /* GGUF token types are 0..6; a larger one would alias a known type */
            rc = sf_err(err, SF_EFORMAT, "GGUF token %d has type %d (valid types are 0..6)", i, ty);
            goto fail;
        }
        t->ptype[i] = (uint8_t)ty;
        if ((ty == GGUF_TOK_CONTROL || ty == GGUF_TOK_USER || ty == GGUF_TOK_UNKNOWN) && t->piece_len[i]) n_added++;
    }
    if (tok_strmap_init(&t->vocab, (size_t)v->n_tokens)) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto fail; }
    for (int i = 0; i < v->n_tokens; i++) tok_strmap_put(&t->vocab, t->pieces, t->piece_len, i);
    /* control, unknown and user-defined tokens are matched in text before the model, like HF added tokens */
    if (!(t->added = calloc((size_t)n_added + 1, sizeof *t->added))) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto fail; }
    for (int i = 0; i < v->n_tokens; i++) {
        int ty = t->ptype[i];
        if (!((ty == GGUF_TOK_CONTROL || ty == GGUF_TOK_USER || ty == GGUF_TOK_UNKNOWN) && t->piece_len[i])) continue;
        tok_added *a = &t->added[t->n_added++];
        a->id = i;
        if (!(a->content = strdup(t->pieces[i]))) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto fail; }
        a->len = t->piece_len[i];
        a->special = ty != GGUF_TOK_USER;
        t->is_special[i] = (uint8_t)a->special;
    }
    rc = spm ? vocab_spm_setup(t, v, err) : vocab_bpe_setup(t, v, err);
    if (rc) goto fail;
    t->bos_id = v->bos_id >= 0 && v->bos_id < v->n_tokens ? v->bos_id : -1;
    t->eos_id = v->eos_id >= 0 && v->eos_id < v->n_tokens ? v->eos_id : -1;
    int add_bos = v->add_bos >= 0 ? v->add_bos : spm, add_eos = v->add_eos >= 0 ? v->add_eos : 0;
    if (add_bos && t->bos_id >= 0 && !(t->post_pre = malloc(sizeof(int32_t)))) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto fail; }
    if (add_bos && t->bos_id >= 0) t->post_pre[t->n_post_pre++] = t->bos_id;
    if (add_eos && t->eos_id >= 0 && !(t->post_post = malloc(sizeof(int32_t)))) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto fail; }
    if (add_eos && t->eos_id >= 0) t->post_post[t->n_post_post++] = t->eos_id;
    if (v->chat_template && !(t->chat_template = strdup(v->chat_template))) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto fail; }
    if ((rc = tok_finish(t, err))) goto fail;
    if (finish_ids(t)) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto fail; }
    *out = t;
    return SF_OK;
fail:
    sf_tok_free(t);
    return rc;
}

/* ---- lookups -------------------------------------------------------------------------------- */
int sf_tok_vocab_size(const sf_tokenizer *t) { return t->n_vocab; }
int sf_tok_bos(const sf_tokenizer *t) { return t->bos_id; }
int sf_tok_eos(const sf_tokenizer *t) { return t->eos_id; }

int sf_tok_is_eog(const sf_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->is_eog[id];
}

int32_t sf_tok_lookup(const sf_tokenizer *t, const char *piece)
{
    size_t n = strlen(piece);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, piece, n)) return t->added[i].id;
    return tok_strmap_get(&t->vocab, t->pieces, t->piece_len, piece, n);
}

const char *sf_tok_piece(const sf_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab ? t->pieces[id] : NULL;
}
