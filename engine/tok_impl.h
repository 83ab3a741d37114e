/* tok_impl.h — internals of the tokenizer (engine/tokenizer.c, engine/tok_*.c, engine/chat.c).
 *
 * A tokenizer is a pipeline, as in Hugging Face `tokenizers`:
 *   added-token split -> normalizers -> pre-tokenizers -> model (BPE | SPM) -> post-processor
 * and for decoding: ids -> pieces -> decoders. Everything here is built once at load time and
 * read-only afterwards, so any number of threads may encode/decode with the same tokenizer;
 * per-call scratch (PCRE2 match data, heaps) lives on the caller's stack or heap. */
#ifndef SF_TOK_IMPL_H
#define SF_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>

#include "tokenizer.h"

/* ---- growable byte buffer and string list ------------------------------------------------- */
typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf;
int tok_buf_put(tok_buf *b, const void *s, size_t n);   /* SF_OK | SF_ENOMEM; keeps p NUL-terminated */
static inline int tok_buf_puts(tok_buf *b, const char *s) { return tok_buf_put(b, s, __builtin_strlen(s)); }

/* A list of strings stored back to back in one buffer: item i is buf.p[off[i] .. off[i]+len[i]). */
typedef struct tok_strs {
    tok_buf buf;
    size_t *off, *len;
    size_t n, cap;
} tok_strs;
int tok_strs_push(tok_strs *l, const char *s, size_t n);   /* s must not point into l */
void tok_strs_clear(tok_strs *l);
void tok_strs_free(tok_strs *l);
#define TOK_STR(l, i) ((l)->buf.p + (l)->off[i])

/* ---- hash maps (open addressing, power-of-two capacity, built once) ------------------------ */
/* string -> id; keys are owned by the caller (the vocab's piece strings). */
typedef struct tok_strmap {
    uint32_t mask;
    int32_t *slot;            /* id or -1 */
} tok_strmap;
int tok_strmap_init(tok_strmap *m, size_t n_keys);
/* Inserts id under key pieces[id]; an existing key keeps its first id. */
void tok_strmap_put(tok_strmap *m, char *const *pieces, const uint32_t *lens, int32_t id);
int32_t tok_strmap_get(const tok_strmap *m, char *const *pieces, const uint32_t *lens, const char *s, size_t n);
void tok_strmap_free(tok_strmap *m);

/* (left id, right id) -> (rank, merged id) */
typedef struct tok_merge {
    uint64_t key;             /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank, id;
} tok_merge;
typedef struct tok_mergemap {
    uint32_t mask;
    tok_merge *slot;
} tok_mergemap;
int tok_mergemap_init(tok_mergemap *m, size_t n_keys);
void tok_mergemap_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const tok_merge *tok_mergemap_get(const tok_mergemap *m, int32_t a, int32_t b);
void tok_mergemap_free(tok_mergemap *m);

/* ---- UTF-8 ---------------------------------------------------------------------------------- */
/* Length of the valid UTF-8 sequence at s (n bytes available), 0 if invalid. */
int tok_utf8_len(const unsigned char *s, size_t n);
/* Offset of the first invalid byte, or n when s is valid UTF-8. */
size_t tok_utf8_check(const char *s, size_t n);
/* Rust String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD. */
int tok_utf8_lossy(tok_buf *out, const char *s, size_t n);
/* Decodes one code point at s (valid UTF-8 assumed); *adv = its byte length. */
uint32_t tok_utf8_cp(const char *s, size_t n, int *adv);
int tok_utf8_put(tok_buf *b, uint32_t cp);
/* cp's UTF-8 into c (room for 4); returns its length */
int tok_utf8_enc(uint32_t cp, unsigned char *c);

/* tok_nfc.c: appends the NFC form of valid UTF-8 s[0..n) to out. */
int tok_nfc(tok_buf *out, const char *s, size_t n);

/* GPT-2 byte <-> unicode mapping used by ByteLevel. */
extern const uint16_t tok_byte_to_cp[256];
int tok_cp_to_byte(uint32_t cp);   /* -1 if cp is not one of the 256 mapped code points */

/* ---- pipeline descriptions ---------------------------------------------------------------- */
enum { TOK_NORM_PREPEND = 1, TOK_NORM_REPLACE, TOK_NORM_NFC };
typedef struct tok_norm {
    int kind;
    char *a, *b;              /* PREPEND: a = text. REPLACE: a = pattern string (or NULL), b = content */
    pcre2_code *re;           /* REPLACE with a Regex pattern */
} tok_norm;

enum { TOK_SPLIT_REMOVED = 1, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT, TOK_SPLIT_CONTIGUOUS };
enum { TOK_PRE_BYTELEVEL = 1, TOK_PRE_SPLIT, TOK_PRE_METASPACE, TOK_PRE_DIGITS, TOK_PRE_WSPLIT };
enum { TOK_PREPEND_ALWAYS = 0, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };
typedef struct tok_pre {
    int kind;
    pcre2_code *re;           /* SPLIT / BYTELEVEL(use_regex) / DIGITS / WSPLIT */
    int behavior, invert;     /* SPLIT */
    int add_prefix_space;     /* BYTELEVEL */
    char replacement[8];      /* METASPACE (UTF-8 of one char) */
    int prepend_scheme, split;/* METASPACE */
} tok_pre;

enum { TOK_DEC_BYTELEVEL = 1, TOK_DEC_REPLACE, TOK_DEC_BYTEFALLBACK, TOK_DEC_FUSE, TOK_DEC_STRIP, TOK_DEC_METASPACE };
typedef struct tok_dec {
    int kind;
    char *a, *b;              /* REPLACE: pattern -> content. STRIP: a = content char */
    int start, stop;          /* STRIP */
    char replacement[8];      /* METASPACE */
    int prepend_scheme;       /* METASPACE */
} tok_dec;

typedef struct tok_added {
    int32_t id;
    char *content;
    size_t len;
    int special, lstrip, rstrip, single_word, normalized;
} tok_added;

enum { TOK_MODEL_BPE = 1, TOK_MODEL_SPM };

struct sf_tokenizer {
    int model;                /* TOK_MODEL_* */
    /* vocabulary: n_vocab entries; pieces[i] NULL for holes in the id space */
    int n_vocab;
    char **pieces;
    uint32_t *piece_len;
    float *scores;            /* SPM only */
    uint8_t *ptype;           /* GGUF token type per id (1 normal, 3 control, 6 byte...), 0 unknown */
    uint8_t *is_special;      /* special added token (skipped by decode(skip_special)) */
    uint8_t *is_eog;
    tok_strmap vocab;         /* model vocab (not added tokens) */
    tok_mergemap merges;
    int32_t byte_id[256];     /* <0xNN> tokens, -1 if absent */
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;
    /* added tokens, matched leftmost-longest in raw text */
    tok_added *added;
    int n_added;
    int first_added[257];     /* added[] is sorted by first byte: first_added[c]..first_added[c+1] */
    /* pipeline */
    tok_norm *norms;
    int n_norms;
    tok_pre *pres;
    int n_pres;
    tok_dec *decs;
    int n_decs;
    int has_decoder;          /* 0: pieces are joined with " " as HF does without a decoder */
    /* post-processor: ids added around the sequence when add_special */
    int32_t *post_pre, *post_post;
    int n_post_pre, n_post_post;
    int32_t bos_id, eos_id;
    char *chat_template;      /* tokenizer_config.json chat_template, or GGUF tokenizer.chat_template */
    char *bos_str, *eos_str;  /* as written in chat templates */
};

/* tokenizer.c */
int tok_alloc_vocab(struct sf_tokenizer *t, int n);
int tok_finish(struct sf_tokenizer *t, sf_error *err);   /* maps, byte ids, added index */
pcre2_code *tok_regex(const char *pattern, sf_error *err);

/* tok_json.c */
int tok_load_hf(struct sf_tokenizer *t, const char *json, const char *config_json, sf_error *err);
/* tok_vocab.c */
extern const char tok_re_gpt2[], tok_re_llama3[], tok_re_qwen2[];

/* tok_bpe.c: one pre-tokenized word -> ids appended to *ids. The scratch holds per-call buffers
 * reused from word to word (one per encode call, never shared between threads). */
typedef struct tok_scratch tok_scratch;
tok_scratch *tok_scratch_new(void);
void tok_scratch_free(tok_scratch *sc);
int tok_bpe_word(const struct sf_tokenizer *t, tok_scratch *sc, const char *s, size_t n, int32_t **ids, size_t *nids, size_t *cap);
int tok_spm_word(const struct sf_tokenizer *t, tok_scratch *sc, const char *s, size_t n, int32_t **ids, size_t *nids, size_t *cap);
int tok_ids_push(int32_t **ids, size_t *n, size_t *cap, int32_t id);

#endif
