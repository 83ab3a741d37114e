/* pcre_ref.h — PCRE2 as the reference the pattern tests check engine/regex.c against: a
 * pattern compiled with UTF (plus the caller's options), and its verdict on a text. */
#ifndef SF_TEST_PCRE_REF_H
#define SF_TEST_PCRE_REF_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

typedef struct pcre_ref {
    pcre2_code *code;
    pcre2_match_data *md;
} pcre_ref;

/* 1 when PCRE2 compiles pat (NUL-terminated) */
static inline int pcre_ref_new(pcre_ref *r, const char *pat, uint32_t opts)
{
    int e;
    PCRE2_SIZE off;
    r->code = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | opts, &e, &off, NULL);
    r->md = r->code ? pcre2_match_data_create_from_pattern(r->code, NULL) : NULL;
    return r->code != NULL;
}

/* pcre2_match's result on s[0..n): >= 0 a match, PCRE2_ERROR_PARTIAL with PCRE2_PARTIAL_HARD */
static inline int pcre_ref_run(pcre_ref *r, const char *s, size_t n, uint32_t opts)
{
    return pcre2_match(r->code, (PCRE2_SPTR)s, n, 0, opts, r->md, NULL);
}

static inline int pcre_ref_match(pcre_ref *r, const char *s, size_t n) { return pcre_ref_run(r, s, n, 0) >= 0; }

static inline void pcre_ref_free(pcre_ref *r)
{
    pcre2_match_data_free(r->md);
    pcre2_code_free(r->code);
    r->md = NULL;
    r->code = NULL;
}

#endif
