/* test_regex.c — patterns to automata (engine/regex.c), against PCRE2 as the reference:
 *  - hand-written patterns and texts, each verdict also PCRE2's (anchored at both ends);
 *  - random patterns over a small alphabet with characters of 1 to 4 UTF-8 bytes (classes,
 *    ranges, negation, \d \w \s, groups, alternation, every quantifier form), each with random
 *    texts and texts walked through the automaton: whole-text verdicts equal PCRE2's, and a
 *    text is alive in the automaton exactly when PCRE2 finds it a partial or whole match;
 *  - the same patterns read as searches (JSON Schema's `pattern`) against PCRE2 unanchored;
 *  - Python's rules PCRE2 does not share ({,m}, '{' as a literal), and the refusals by name;
 *  - the caps: positions, states, repeat counts, nesting. */
#include "engine/regex.h"
#include "tests/lib/pcre_ref.h"
#include "tests/test.h"

/* P as a whole match: (?:P)\z anchored, `$` at the end only (as Python's fullmatch reads it) */
static int ref_new(pcre_ref *r, const char *pat)
{
    char buf[8192];
    snprintf(buf, sizeof buf, "(?:%s)\\z", pat);
    return pcre_ref_new(r, buf, PCRE2_ANCHORED | PCRE2_DOLLAR_ENDONLY);
}

/* some continuation of s matches */
static int ref_alive(pcre_ref *r, const char *s, size_t n)
{
    int rc = pcre_ref_run(r, s, n, PCRE2_PARTIAL_HARD);
    return rc >= 0 || rc == PCRE2_ERROR_PARTIAL;
}

static int state_of(const sf_regex *re, const char *s, size_t n)
{
    int st = 0;
    for (size_t i = 0; i < n && st >= 0; i++) st = sf_regex_next(re, st, (unsigned char)s[i]);
    return st;
}

static sf_regex *compile(const char *pat)
{
    sf_regex *re = NULL;
    sf_error err = { 0 };
    if (sf_regex_compile(pat, strlen(pat), 0, &re, &err) != SF_OK) {
        printf("  compile '%s': %s\n", pat, err.msg);
        return NULL;
    }
    return re;
}

static const struct { const char *pat, *yes[4], *no[4]; } cases[] = {
    { "abc", { "abc" }, { "", "ab", "abcd", "abd" } },
    { "a|bc|", { "a", "bc", "" }, { "b", "abc" } },
    { "[a-c]+x?", { "a", "cab", "abx" }, { "", "x", "abxx", "d" } },
    { "\\d{3}-\\d{4}", { "555-1234" }, { "555-123", "5555-1234", "55a-1234" } },
    { "(?:ab){2,3}", { "abab", "ababab" }, { "ab", "abababab" } },
    { "(?P<year>\\d{4})-(\\d\\d)", { "2026-12" }, { "2026-1", "26-12" } },
    { "[^a\\n]*", { "", "bcd", "\xc3\xa9\xe2\x82\xac" }, { "a", "b\n" } },
    { ".+", { "x", "\xf0\x9f\x98\x80 ok" }, { "", "a\nb" } },
    { "[\xc3\xa9-\xe2\x82\xac]", { "\xc3\xa9", "\xc3\xbf", "\xe2\x82\xac" }, { "e", "\xc3\xa8", "\xe2\x82\xad" } },
    { "\\w+@\\w+\\.com", { "a_1@b.com" }, { "a@b.org", "@b.com" } },
    { "(true|false)", { "true", "false" }, { "tru", "truefalse" } },
    { "^ab*$", { "a", "abbb" }, { "b" } },
    { "^a|b$|\\Ac\\Z", { "a", "b", "c" }, { "ab", "" } },
    { "a{0}b", { "b" }, { "ab" } },
    { "\\x41\\u00e9\\U0001F600", { "A\xc3\xa9\xf0\x9f\x98\x80" }, { "A" } },
    { "[]a]+", { "]", "a]a" }, { "" } },
    { "a*?b+?c??", { "b", "aabbc" }, { "c" } },
    { "[\\s\\d]+", { " 1\t2\n" }, { "a" } },
    { "\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\\\\\^\\$", { ".*+?()[]{}|\\^$" }, { "" } },
};

TEST(patterns)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        sf_regex *re = compile(cases[i].pat);
        REQUIRE(re, "pattern %zu '%s'", i, cases[i].pat);
        pcre_ref r;
        int pcre = ref_new(&r, cases[i].pat); /* PCRE2 writes \u as \x{...}: those are Python's alone */
        CHECK_MSG(pcre || strstr(cases[i].pat, "\\u"), "PCRE2 compiles '%s'", cases[i].pat);
        for (int k = 0; k < 4; k++) {
            const char *y = cases[i].yes[k], *n = cases[i].no[k];
            if (y) {
                CHECK_MSG(sf_regex_match(re, y, strlen(y)), "'%s' should match '%s'", cases[i].pat, y);
                CHECK_MSG(!pcre || pcre_ref_match(&r, y, strlen(y)), "PCRE2: '%s' should match '%s'", cases[i].pat, y);
            }
            if (n) {
                CHECK_MSG(!sf_regex_match(re, n, strlen(n)), "'%s' should not match '%s'", cases[i].pat, n);
                CHECK_MSG(!pcre || !pcre_ref_match(&r, n, strlen(n)), "PCRE2: '%s' should not match '%s'", cases[i].pat, n);
            }
        }
        if (pcre) pcre_ref_free(&r);
        sf_regex_free(re);
    }
}

/* Python's rules that PCRE2 (before 10.43) reads otherwise: {,m} is 0 to m; a brace that does
 * not make a quantifier is a literal */
TEST(python_rules)
{
    static const struct { const char *pat, *yes, *no; } c[] = {
        { "a{,2}", "aa", "aaa" }, { "a{,}", "aaaa", "b" }, { "a{", "a{", "a" }, { "a{x}", "a{x}", "a" },
        { "a{}", "a{}", "a" }, { "a{1,b}", "a{1,b}", "a" }, { "{", "{", "" }, { "x{2}{", "xx{", "xx" },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(c); i++) {
        sf_regex *re = compile(c[i].pat);
        REQUIRE(re, "'%s' compiles", c[i].pat);
        CHECK_MSG(sf_regex_match(re, c[i].yes, strlen(c[i].yes)), "'%s' should match '%s'", c[i].pat, c[i].yes);
        CHECK_MSG(!sf_regex_match(re, c[i].no, strlen(c[i].no)), "'%s' should not match '%s'", c[i].pat, c[i].no);
        sf_regex_free(re);
    }
}

TEST(refusals)
{
    static const struct { const char *pat, *msg; } c[] = {
        { "(a", "without its ')'" }, { "a)", "without its '('" }, { "[ab", "without its ']'" },
        { "*a", "nothing to repeat" }, { "a**", "repeat of a repeat" }, { "a{2}*", "repeat of a repeat" },
        { "a++", "possessive" }, { "(a)\\1", "back-references" }, { "(?P<x>a)(?P=x)", "back-references" },
        { "a(?=b)", "lookaround" }, { "(?<!a)b", "lookaround" }, { "\\bword", "word boundaries" },
        { "(?i)abc", "inline flags" }, { "a^b", "'^'" }, { "a$b", "'$'" }, { "(a$)", "'$'" },
        { "a\\Ab", "'\\A'" }, { "\\q", "unknown escape" }, { "\\x4", "hexadecimal" }, { "\\ud800", "names no character" },
        { "[z-a]", "end comes before its start" }, { "[a-\\d]", "class escape" }, { "[[:alpha:]]", "POSIX" },
        { "a{2,1}", "minimum is over its maximum" }, { "a{1001}", "over 1000" }, { "a{99999999999}", "over 1000" },
        { "(abcde){1000}", "written out" }, { "(a|b)*a(a|b){14}", "automaton states" },
        { "\xc3", "UTF-8" }, { "\xc0\xaf", "UTF-8" }, { "\xed\xa0\x80", "UTF-8" }, { "[^\\x00-\\U0010FFFF]", "no character" },
        { "\\", "ends with" }, { "(?", "not supported" }, { "(?P<a-b>x)", "group name" },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(c); i++) {
        sf_regex *re = NULL;
        sf_error err = { 0 };
        int rc = sf_regex_compile(c[i].pat, strlen(c[i].pat), 0, &re, &err);
        CHECK_MSG(rc == SF_EINVAL && !re && strstr(err.msg, c[i].msg) && strstr(err.msg, "at byte"),
                  "'%s': rc %d, '%s' (want '%s')", c[i].pat, rc, err.msg, c[i].msg);
        sf_regex_free(re);
    }
    char big[SF_REGEX_MAX_LEN + 2];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    sf_regex *re = NULL;
    sf_error err = { 0 };
    CHECK(sf_regex_compile(big, strlen(big), 0, &re, &err) == SF_EINVAL && strstr(err.msg, "over"));
    char deep[2 * SF_REGEX_MAX_NEST + 8];
    int n = 0;
    for (int k = 0; k <= SF_REGEX_MAX_NEST; k++) deep[n++] = '(';
    deep[n++] = 'a';
    for (int k = 0; k <= SF_REGEX_MAX_NEST; k++) deep[n++] = ')';
    deep[n] = 0;
    CHECK(sf_regex_compile(deep, strlen(deep), 0, &re, &err) == SF_EINVAL && strstr(err.msg, "nested"));
    deep[0] = 'x'; /* one level less, and one ')' too many */
    CHECK(sf_regex_compile(deep, strlen(deep), 0, &re, &err) == SF_EINVAL && strstr(err.msg, "without its '('"));
}

/* ---- random patterns ----------------------------------------------------------------------- */
static const char *const alpha[] = { "a", "b", "c", "0", "1", "-", " ", "\n", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "." };
#define N_ALPHA ((int)SF_ARRAY_LEN(alpha))

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static int rnd(int n)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (int)(rs % (uint64_t)n);
}

static void gen(char *o, size_t cap, int depth)
{
    static const char *const atoms[] = { "a", "b", "c", "0", "\\-", " ", "\\n", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\\.",
                                         ".", "[abc]", "[^a]", "[a-c0-1]", "[\xc3\xa9-\xe2\x82\xac]", "[^\xc3\xa9\\n]", "\\d",
                                         "\\w", "\\s", "\\D", "[\\d\xf0\x9f\x98\x80-]" };
    static const char *const quants[] = { "*", "+", "?", "{2}", "{0,2}", "{1,3}", "{2,}", "*?", "+?", "??", "{1,2}?" };
    int parts = 1 + rnd(4);
    for (int i = 0; i < parts; i++) {
        size_t l = strlen(o);
        if (depth < 3 && rnd(4) == 0) {
            char inner[1024] = "";
            gen(inner, sizeof inner, depth + 1);
            if (rnd(2)) {
                strncat(inner, "|", sizeof inner - strlen(inner) - 1);
                gen(inner + strlen(inner), sizeof inner - strlen(inner), depth + 1);
            }
            snprintf(o + l, cap - l, rnd(2) ? "(%s)" : "(?:%s)", inner);
        } else {
            snprintf(o + l, cap - l, "%s", atoms[rnd((int)SF_ARRAY_LEN(atoms))]);
        }
        l = strlen(o);
        if (rnd(3) == 0) snprintf(o + l, cap - l, "%s", quants[rnd((int)SF_ARRAY_LEN(quants))]);
    }
    if (depth == 0 && rnd(5) == 0) {
        size_t l = strlen(o);
        snprintf(o + l, cap - l, "|");
        gen(o + l + 1, cap - l - 1, 1);
    }
    if (depth == 0 && rnd(4) == 0) { /* anchors: no-ops for a whole match, not for a search */
        memmove(o + 1, o, strlen(o) + 1);
        o[0] = '^';
    }
    if (depth == 0 && rnd(4) == 0) strncat(o, "$", cap - strlen(o) - 1);
}

TEST(random_against_pcre2)
{
    int patterns = 0, texts = 0, matched = 0, alive_checked = 0;
    for (int t = 0; t < 1500; t++) {
        char pat[4096] = "";
        gen(pat, sizeof pat, 0);
        sf_regex *re = NULL;
        sf_error err = { 0 };
        if (sf_regex_compile(pat, strlen(pat), 0, &re, &err) != SF_OK) {
            CHECK_MSG(strstr(err.msg, "automaton states") != NULL, "'%s': %s", pat, err.msg);
            continue;
        }
        pcre_ref r;
        REQUIRE(ref_new(&r, pat), "PCRE2 compiles '%s'", pat);
        patterns++;
        for (int k = 0; k < 40; k++) {
            char s[256] = "";
            size_t n = 0;
            int len = rnd(8), walk = k & 1, st = 0;
            for (int c = 0; c < len; c++) {
                /* a walk takes only characters that keep the automaton alive */
                const char *a = alpha[rnd(N_ALPHA)];
                if (walk) {
                    int tries = 0, ns;
                    do {
                        a = alpha[rnd(N_ALPHA)];
                        ns = st;
                        for (const char *q = a; *q && ns >= 0; q++) ns = sf_regex_next(re, ns, (unsigned char)*q);
                    } while (ns < 0 && ++tries < 30);
                    if (ns < 0) break;
                    st = ns;
                }
                n += (size_t)snprintf(s + n, sizeof s - n, "%s", a);
            }
            int mine = sf_regex_match(re, s, n), theirs = pcre_ref_match(&r, s, n);
            CHECK_MSG(mine == theirs, "'%s' on '%s': %d, PCRE2 %d", pat, s, mine, theirs);
            /* PCRE2 reports no partial match of an empty text */
            int alive = state_of(re, s, n) >= 0, ralive = n ? ref_alive(&r, s, n) : alive;
            CHECK_MSG(alive == ralive, "'%s' on '%s': alive %d, PCRE2 %d", pat, s, alive, ralive);
            /* at a live state, more says whether a longer text can match */
            int st2 = state_of(re, s, n);
            if (st2 >= 0 && !sf_regex_more(re, st2)) CHECK_MSG(sf_regex_accepts(re, st2), "'%s' on '%s': a dead end", pat, s);
            texts++, matched += mine, alive_checked += alive;
        }
        pcre_ref_free(&r);
        sf_regex_free(re);
        if (test_cur_failed_) break;
    }
    printf("  %d patterns, %d texts (%d match, %d alive)\n", patterns, texts, matched, alive_checked);
    CHECK(patterns > 1000 && matched > 2000 && alive_checked > texts / 3);
}

/* JSON Schema's pattern: a search (ECMA-262), against PCRE2 unanchored with `$` at the end only */
TEST(search_against_pcre2)
{
    int patterns = 0, texts = 0, matched = 0;
    for (int t = 0; t < 800; t++) {
        char pat[4096] = "";
        gen(pat, sizeof pat, 0);
        sf_regex *re = NULL;
        sf_error err = { 0 };
        if (sf_regex_compile(pat, strlen(pat), SF_REGEX_SEARCH, &re, &err) != SF_OK) {
            CHECK_MSG(strstr(err.msg, "automaton states") != NULL, "'%s': %s", pat, err.msg);
            continue;
        }
        pcre_ref rc;
        REQUIRE(pcre_ref_new(&rc, pat, PCRE2_DOLLAR_ENDONLY), "PCRE2 compiles '%s'", pat);
        patterns++;
        for (int k = 0; k < 30; k++) {
            char s[256] = "";
            size_t n = 0;
            for (int c = rnd(10); c > 0; c--) n += (size_t)snprintf(s + n, sizeof s - n, "%s", alpha[rnd(N_ALPHA)]);
            int mine = sf_regex_match(re, s, n), theirs = pcre_ref_match(&rc, s, n);
            CHECK_MSG(mine == theirs, "search '%s' in '%s': %d, PCRE2 %d", pat, s, mine, theirs);
            texts++, matched += mine;
        }
        pcre_ref_free(&rc);
        sf_regex_free(re);
        if (test_cur_failed_) break;
    }
    printf("  %d patterns, %d texts (%d contain a match)\n", patterns, texts, matched);
    CHECK(patterns > 500 && matched > texts / 8 && matched < texts);
}

/* sizes users write: a date-time, an email-ish, a bounded any-text, a UUID */
TEST(sizes)
{
    static const char *const pats[] = {
        "\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}(\\.\\d{1,6})?(Z|[+-]\\d{2}:\\d{2})",
        "[a-zA-Z0-9._%+-]{1,64}@[a-zA-Z0-9.-]{1,63}\\.[a-zA-Z]{2,10}",
        ".{0,100}",
        "[^\\n]{1,250}", /* near the position cap: 15 a character outside ASCII */
        "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        "(Positive|Negative|Neutral)",
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(pats); i++) {
        double t0 = sf_now_s();
        sf_regex *re = compile(pats[i]);
        REQUIRE(re, "'%s' compiles", pats[i]);
        printf("  %-70s %5d states, compiled in %.1f ms\n", pats[i], sf_regex_states(re), (sf_now_s() - t0) * 1e3);
        CHECK(sf_regex_states(re) < SF_REGEX_MAX_STATES);
        sf_regex_free(re);
    }
}

int main(void)
{
    RUN(patterns);
    RUN(python_rules);
    RUN(refusals);
    RUN(random_against_pcre2);
    RUN(search_against_pcre2);
    RUN(sizes);
    return test_summary();
}
