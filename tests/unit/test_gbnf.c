/* test_gbnf.c — GBNF grammars written out as patterns (engine/gbnf.c):
 *  - hand-written grammars (llama.cpp's README's kind: multi-line groups, comments, escapes,
 *    classes, repetitions, rules used in several places) and texts they take or not;
 *  - random grammars of rules that refer to later ones, each written twice by the generator,
 *    as GBNF and as the PCRE2 pattern it means: the written-out pattern's verdicts on random
 *    texts and texts walked through its automaton equal PCRE2's;
 *  - the refusals, with their line and column: recursion (direct and through other rules), an
 *    undefined rule, a rule defined twice, no root, syntax errors, a grammar too large. */
#include "engine/gbnf.h"
#include "engine/regex.h"
#include "tests/lib/pcre_ref.h"
#include "tests/test.h"

static sf_regex *compile(const char *g, sf_error *err)
{
    char *rx = NULL;
    sf_regex *re = NULL;
    if (sf_gbnf_to_regex(g, strlen(g), &rx, err) == SF_OK) sf_regex_compile(rx, strlen(rx), 0, &re, err);
    free(rx);
    return re;
}

static int takes(const sf_regex *re, const char *s) { return sf_regex_match(re, s, strlen(s)); }

TEST(grammars)
{
    static const struct { const char *g, *yes[4], *no[4]; } c[] = {
        { "root ::= \"yes\" | \"no\"", { "yes", "no" }, { "", "yess", "yesno" } },
        { "# a comment\nroot ::= greeting \", \" name  # after a rule\ngreeting ::= \"hello\" | \"hi\"\nname ::= [A-Z] [a-z]{1,8}\n",
          { "hello, Ann", "hi, Bob" }, { "hi, bob", "hi, B", "hey, Ann" } },
        { "root ::= (\n  \"1. \" move \" \" move \"\\n\"\n  ([1-9] [0-9]? \". \" move \" \" move \"\\n\")*\n)\n"
          "move ::= (pawn | piece | castle) [+#]?\npawn ::= [a-h] [1-8]\npiece ::= [NBRQK] [a-h]? [1-8]? \"x\"? [a-h] [1-8]\n"
          "castle ::= \"O-O\" \"-O\"?\n",
          { "1. e4 e5\n", "1. e4 e5\n2. Nf3 Nc6\n3. O-O Qxd8#\n" }, { "1. e4\n", "1. e9 e5\n", "1. e4 e5\n2. Zf3 Nc6\n" } },
        { "root ::= item (\",\" ws item)*\nitem ::= [a-z]+ | num\nnum ::= \"-\"? [0-9]+ (\".\" [0-9]+)?\nws ::= [ \\t]*",
          { "a", "a, -1.5,b", "x,\t  y" }, { "", "a,", "1.", "a;b" } },
        { "root ::= \"\\\"\" [^\"\\\\\\n]* \"\\\"\"", { "\"\"", "\"caf\xc3\xa9 ok\"" }, { "\"a\"b\"", "\"a\nb\"", "\"a\\b\"" } },
        { "root ::= \"\\x41\\u00e9\\U0001F600\" . [\\-\\]] [^a-c]", { "A\xc3\xa9\xf0\x9f\x98\x80" "\n-d", "A\xc3\xa9\xf0\x9f\x98\x80x]\xe2\x82\xac" },
          { "A\xc3\xa9\xf0\x9f\x98\x80x-a", "A" } },
        { "root ::= (\"ab\"{2} | \"c\"{1,} \"d\"{0,2}) e?\ne ::= \"!\"{3}", { "abab", "ccdd", "c!!!", "abab!!!" }, { "ab", "cddd", "c!!" } },
        { "root ::= (\"a\"*)? \"b\"", { "b", "aaab" }, { "a" } },
        { "root ::= \"\"\nunused ::= \"x\"", { "" }, { "x" } },
        { "root ::= \"a\" |\n  \"b\" |\n  \"c\"", { "a", "b", "c" }, { "ab" } },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(c); i++) {
        sf_error err = { 0 };
        sf_regex *re = compile(c[i].g, &err);
        REQUIRE(re, "grammar %zu: %s", i, err.msg);
        for (int k = 0; k < 4; k++) {
            if (c[i].yes[k]) CHECK_MSG(takes(re, c[i].yes[k]), "grammar %zu takes '%s'", i, c[i].yes[k]);
            if (c[i].no[k]) CHECK_MSG(!takes(re, c[i].no[k]), "grammar %zu refuses '%s'", i, c[i].no[k]);
        }
        sf_regex_free(re);
    }
}

TEST(refusals)
{
    static const struct { const char *g, *says; } c[] = {
        { "root ::= \"(\" root \")\" | \"x\"", "line 1, column 14: rule 'root' refers back to itself" },
        { "root ::= a\na ::= \"x\" b\nb ::= \"y\" a?", "rule 'a' refers back to itself" },
        { "root ::= a", "line 1, column 10: rule 'a' is not defined" },
        { "root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice" },
        { "answer ::= \"a\"", "no rule 'root'" },
        { "root ::= \"abc", "a literal without its closing" },
        { "root ::= \"\\q\"", "unknown escape" },
        { "root ::= [a-", "a class without its closing" },
        { "root ::= []", "an empty class" },
        { "root ::= [z-a]", "end comes before its start" },
        { "root = \"a\"", "'::=' was expected" },
        { "root ::= (\"a\"", "a '(' without its ')'" },
        { "root ::= \"a\"{2,1}", "maximum is under its minimum" },
        { "root ::= \"a\"{x}", "{m}, {m,} or {m,n}" },
        { "root ::= \"a\" )", "')' was not expected" },
        { "::= \"a\"", "a rule's name was expected" },
        { "root ::= \"\\uD800\"", "names no character" },
        { "root ::= \"\xc3\"", "not valid UTF-8" },
        { "root ::= c c c c\nc ::= b b b b b b b b\nb ::= a a a a a a a a\na ::= e e e e e e e e\ne ::= \"\"", "over 16384 bytes" },
        { "root ::= a a a a a a a a\na ::= b b b b b b b b\nb ::= c c c c c c c c\nc ::= \"0123456789\"",
          "over 4096 bytes long once its repeats" },
        { "root ::= (\"a\" | \"b\")* \"a\" (\"a\" | \"b\"){14}", "automaton states" },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(c); i++) {
        sf_error err = { 0 };
        sf_regex *re = compile(c[i].g, &err);
        CHECK_MSG(!re && err.code == SF_EINVAL && strstr(err.msg, c[i].says), "'%s': '%s' (want '%s')", c[i].g, err.msg, c[i].says);
        sf_regex_free(re);
    }
    /* groups nested past the cap, and a chain of rules as deep; empty groups repeated past the
     * pattern's parts */
    char g[4096] = "root ::= ";
    for (int k = 0; k <= SF_REGEX_MAX_NEST; k++) strcat(g, "(");
    strcat(g, "\"a\"");
    for (int k = 0; k <= SF_REGEX_MAX_NEST; k++) strcat(g, ")");
    sf_error err = { 0 };
    sf_regex *re = compile(g, &err);
    CHECK_MSG(!re && strstr(err.msg, "nested over 100 deep"), "%s", err.msg);
    sf_regex_free(re);
    strcpy(g, "root ::= r0\n");
    for (int k = 0; k <= SF_REGEX_MAX_NEST; k++) sprintf(g + strlen(g), "r%d ::= r%d\n", k, k + 1);
    sprintf(g + strlen(g), "r%d ::= \"a\"\n", SF_REGEX_MAX_NEST + 1);
    CHECK_MSG(!(re = compile(g, &err)) && strstr(err.msg, "nested over 100 deep"), "%s", err.msg);
    sf_regex_free(re);
    CHECK_MSG(!(re = compile("root ::= ((\"\"{500}){500}){500}", &err)) && strstr(err.msg, "parts"), "%s", err.msg);
    sf_regex_free(re);
}

/* ---- random grammars, each also written as the PCRE2 pattern it means ------------------------ */
static uint64_t rs = 0x243F6A8885A308D3ull;
static int rnd(int n)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (int)(rs % (uint64_t)n);
}

/* characters: GBNF's writing in a literal and in a class, PCRE2's (\x{..} everywhere), the text */
static const struct { const char *lit, *cls, *pcre, *text; } chars[] = {
    { "a", "a", "\\x{61}", "a" }, { "b", "b", "\\x{62}", "b" }, { "0", "0", "\\x{30}", "0" }, { "-", "\\-", "\\x{2d}", "-" },
    { " ", " ", "\\x{20}", " " }, { "\\n", "\\n", "\\x{0a}", "\n" }, { "\\\"", "\"", "\\x{22}", "\"" },
    { "\\\\", "\\\\", "\\x{5c}", "\\" }, { "\xc3\xa9", "\\u00e9", "\\x{e9}", "\xc3\xa9" }, { "\\x41", "A", "\\x{41}", "A" },
    { "\xf0\x9f\x98\x80", "\\U0001F600", "\\x{1f600}", "\xf0\x9f\x98\x80" }, { "]", "\\]", "\\x{5d}", "]" },
};
#define N_CHARS ((int)SF_ARRAY_LEN(chars))

typedef struct sb { char s[16384]; size_t n; } sb;
static void put(sb *b, const char *t) { size_t l = strlen(t); if (b->n + l < sizeof b->s) memcpy(b->s + b->n, t, l + 1), b->n += l; }

enum { N_RULES = 5 };
static char pcre_of[N_RULES][16384];

static void gen_seq(sb *g, sb *p, int rule, int depth);

static void gen_alts(sb *g, sb *p, int rule, int depth)
{
    int n = 1 + rnd(3);
    for (int i = 0; i < n; i++) {
        if (i) put(g, " | "), put(p, "|");
        gen_seq(g, p, rule, depth);
    }
}

static void gen_seq(sb *g, sb *p, int rule, int depth)
{
    int n = 1 + rnd(3);
    for (int i = 0; i < n; i++) {
        sb eg = { .n = 0 }, ep = { .n = 0 };
        int k = rnd(10);
        if (k < 3) { /* a literal of 1-3 characters */
            put(&eg, "\""), put(&ep, "(?:");
            for (int c = 1 + rnd(3); c > 0; c--) {
                int ch = rnd(N_CHARS);
                put(&eg, chars[ch].lit), put(&ep, chars[ch].pcre);
            }
            put(&eg, "\""), put(&ep, ")");
        } else if (k < 5) { /* a class, perhaps negated, with a range */
            int neg = rnd(3) == 0;
            put(&eg, neg ? "[^" : "["), put(&ep, neg ? "[^" : "[");
            for (int c = 1 + rnd(3); c > 0; c--) {
                int ch = rnd(N_CHARS);
                put(&eg, chars[ch].cls), put(&ep, chars[ch].pcre);
            }
            if (rnd(2)) put(&eg, "a-c"), put(&ep, "\\x{61}-\\x{63}");
            put(&eg, "]"), put(&ep, "]");
        } else if (k < 6) {
            put(&eg, "."), put(&ep, "(?s:.)");
        } else if (k < 8 && rule + 1 < N_RULES) { /* a later rule */
            int r = rule + 1 + rnd(N_RULES - rule - 1);
            char name[16];
            snprintf(name, sizeof name, "r%d", r);
            put(&eg, name), put(&ep, "(?:"), put(&ep, pcre_of[r]), put(&ep, ")");
        } else if (depth < 2) {
            put(&eg, "("), put(&ep, "(?:");
            gen_alts(&eg, &ep, rule, depth + 1);
            put(&eg, ")"), put(&ep, ")");
        } else {
            put(&eg, "\"x\""), put(&ep, "x");
        }
        static const char *const q[] = { "*", "+", "?", "{2}", "{0,2}", "{1,}" };
        int quants = rnd(4) == 0 ? 1 + (rnd(4) == 0) : 0;
        for (int t = 0; t < quants; t++) { /* a second quantifier applies to the first's result */
            const char *qq = q[rnd((int)SF_ARRAY_LEN(q))];
            sb w = { .n = 0 };
            put(&w, "(?:"), put(&w, ep.s), put(&w, ")"), put(&w, qq);
            ep = w;
            put(&eg, qq);
        }
        put(g, eg.s), put(g, " "), put(p, ep.s);
    }
}

TEST(random_against_pcre2)
{
    int grammars = 0, texts = 0, matched = 0;
    for (int t = 0; t < 600; t++) {
        sb g = { .n = 0 };
        int too_long = 0;
        for (int r = N_RULES - 1; r >= 0; r--) { /* later rules first: a rule's pattern is known when referred to */
            sb body = { .n = 0 }, p = { .n = 0 };
            gen_alts(&body, &p, r, 0);
            snprintf(pcre_of[r], sizeof pcre_of[r], "%s", p.s);
            too_long |= p.n + 64 >= sizeof p.s; /* a rule copied into many places: past the buffers */
            char head[32];
            snprintf(head, sizeof head, "%s ::= ", r ? (char[8]){ 'r', (char)('0' + r), 0 } : "root");
            sb line = { .n = 0 };
            put(&line, head), put(&line, body.s), put(&line, "\n");
            sb all = { .n = 0 };
            put(&all, line.s), put(&all, g.s);
            g = all;
        }
        if (too_long) continue;
        sf_error err = { 0 };
        sf_regex *re = compile(g.s, &err);
        if (!re) {
            CHECK_MSG(strstr(err.msg, "automaton states") || strstr(err.msg, "written out"), "%s: %s", g.s, err.msg);
            continue;
        }
        static char full[16448];
        snprintf(full, sizeof full, "(?:%s)\\z", pcre_of[0]);
        pcre_ref pc;
        REQUIRE(pcre_ref_new(&pc, full, PCRE2_ANCHORED), "PCRE2 compiles %s", full);
        grammars++;
        for (int k = 0; k < 30; k++) {
            char s[512] = "";
            size_t n = 0;
            int st = 0, walk = k & 1;
            for (int c = rnd(10); c > 0; c--) {
                const char *a = chars[rnd(N_CHARS)].text;
                if (walk) { /* only characters that keep the automaton alive */
                    int tries = 0, ns;
                    do {
                        a = rnd(8) ? chars[rnd(N_CHARS)].text : "x";
                        ns = st;
                        for (const char *q = a; *q && ns >= 0; q++) ns = sf_regex_next(re, ns, (unsigned char)*q);
                    } while (ns < 0 && ++tries < 40);
                    if (ns < 0) break;
                    st = ns;
                }
                n += (size_t)snprintf(s + n, sizeof s - n, "%s", a);
            }
            int mine = sf_regex_match(re, s, n), theirs = pcre_ref_match(&pc, s, n);
            CHECK_MSG(mine == theirs, "grammar\n%s on '%s': %d, PCRE2 %d (%s)", g.s, s, mine, theirs, full);
            texts++, matched += mine;
        }
        pcre_ref_free(&pc);
        sf_regex_free(re);
        if (test_cur_failed_) break;
    }
    printf("  %d grammars, %d texts (%d taken)\n", grammars, texts, matched);
    CHECK(grammars > 400 && matched > texts / 5);
}

int main(void)
{
    RUN(grammars);
    RUN(refusals);
    RUN(random_against_pcre2);
    return test_summary();
}
