/* demo.c — the demo model: a real Hugging Face folder written from a fixed seed, so that
 * `--model demo` works on a fresh machine with no download. Its weights are random (outputs
 * are meaningless); its tokenizer is a byte-level BPE in the style of Llama 3 whose merges are
 * trained here, at write time, on a short embedded English text.
 *
 * Files: config.json, generation_config.json, model.safetensors (BF16), tokenizer.json,
 * tokenizer_config.json (llama-3 chat template), and a version stamp. Same seed, same bytes. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model-impl.h"

#define DEMO_STAMP_FILE "semflow-demo.version"
#define DEMO_STAMP "semflow demo model, format 1\n"
#define DEMO_VOCAB_TARGET 2000  /* BPE vocabulary (bytes + merges) plus the special tokens */

/* Llama 3's pre-tokenizer pattern (tokenizer.json, Split, behavior Isolated). */
static const char llama3_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char *const specials[] = { "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                        "<|end_header_id|>", "<|eot_id|>" };

static const char llama3_chat_template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/* Training text for the tokenizer's merges. */
static const char corpus[] =
    "The lighthouse stood at the edge of the harbor for more than two hundred years. Every night the keeper "
    "climbed the one hundred and twelve steps, trimmed the wick, wound the clockwork and watched the beam "
    "sweep across the water. Ships that saw the light knew where the rocks were, and they knew they were "
    "almost home.\n\n"
    "In the spring of 1893 a storm came in from the west. It rained for three days. The wind tore slates "
    "from the roofs of the town, and the fishing boats stayed tied to the pier. On the second night the "
    "keeper's daughter, who was eleven, noticed that the light had stopped turning. The clockwork had "
    "jammed. She wrapped herself in her father's coat, took a lantern, and went up the tower alone.\n\n"
    "\"I can't leave it dark,\" she said later. \"There were people out there. You don't think about being "
    "afraid when you know what has to be done.\" She turned the lens by hand, a quarter turn every few "
    "seconds, for six hours, until the storm eased and her father came back from the village with the "
    "doctor.\n\n"
    "Today the light is automatic. A small computer checks the lamp, the battery and the weather, and it "
    "sends a message to the coast guard if anything goes wrong. The tower is a museum now. Children visit "
    "it with their teachers, count the steps, and look at the old brass clockwork behind a sheet of glass. "
    "Many of them ask the same question: how did one person keep a light burning through a storm like "
    "that?\n\n"
    "A computer is a machine that follows instructions. A program is a list of those instructions, written "
    "in a language that people can read and that the machine can translate into the simple steps it "
    "understands. Most programs read some input, do some work, and write some output. A text editor reads "
    "the keys you press and writes letters to the screen. A web server reads requests from the network and "
    "writes pages back. A language model reads a sequence of tokens and predicts the next one.\n\n"
    "Memory is where a computer keeps what it is working on. It is fast but small compared with a disk, "
    "and it forgets everything when the power goes off. Moving data between memory and the processor "
    "often takes longer than the arithmetic itself, so good programs try to use each byte many times "
    "while it is close at hand. Engineers measure this with two numbers: how many operations per second "
    "the processor can do, and how many bytes per second the memory can deliver.\n\n"
    "Here is a simple recipe for bread. Mix 500 grams of flour, 10 grams of salt, 7 grams of yeast and "
    "350 milliliters of warm water. Knead the dough for ten minutes until it is smooth. Let it rise for an "
    "hour in a warm place, then shape it, let it rise again for 45 minutes, and bake it at 230 degrees for "
    "about 35 minutes. The loaf is done when it sounds hollow as you tap the bottom.\n\n"
    "The weather tomorrow will be cloudy in the morning with a chance of light rain. In the afternoon the "
    "clouds will clear from the north, and the temperature will reach 18 degrees. The wind will be light "
    "and from the southwest. On Saturday and Sunday expect sunshine and warmer weather, with highs between "
    "20 and 24 degrees.\n\n"
    "Questions and answers. What is the capital of France? Paris. How many days are there in a week? "
    "Seven. Which planet is closest to the sun? Mercury. What do bees make? Honey. Why is the sky blue? "
    "Because air scatters blue light from the sun more than it scatters red light. What is 12 times 12? "
    "It is 144. Who wrote the story about the lighthouse? Nobody famous; it is only an example.\n\n"
    "Once upon a time there was a small fox who lived at the edge of a forest. Every morning she ran down "
    "to the river to drink, and every evening she climbed the hill to watch the sun go down. One day she "
    "found a lost duckling crying by the water. \"Where is your mother?\" asked the fox. \"I don't know,\" "
    "said the duckling. \"We were swimming, and then she was gone.\" The fox was hungry, but she was also "
    "kind. She walked with the duckling along the river until they heard a loud, worried quacking. The "
    "mother duck flew to them, and the duckling ran to her. The fox went home to her den and slept well "
    "that night, because she had done something good.\n\n"
    "Please remember to water the plants on Monday, Wednesday and Friday. The keys are under the blue pot "
    "by the door. If the cat asks for food, she has already eaten; do not believe her. Call me if "
    "anything happens. Thank you, and see you next week!\n"
    "A river begins as rain falling on high ground. The water gathers into small streams, the streams "
    "join, and the river grows as it travels toward the sea. Along the way it carves valleys, carries sand "
    "and gravel, and builds wide plains where farmers grow wheat, barley, rice and vegetables. Cities were "
    "often founded beside rivers, because rivers provided drinking water, fish, transport and power for "
    "mills. When a river floods, it can destroy houses and bridges, but it also leaves behind rich soil.\n\n"
    "Some useful habits for writing software: keep functions short and give them clear names; check every "
    "error and report it with enough detail that someone can fix the cause; write tests for the cases you "
    "are afraid of; measure before you optimize; and delete code that nobody uses. Comments should explain "
    "why something is done, not repeat what the code already says. Review your own changes before asking "
    "others to review them.\n\n"
    "The human heart beats about seventy times each minute, pumping blood through arteries, capillaries and "
    "veins. Blood carries oxygen from the lungs to every cell and brings carbon dioxide back. Exercise "
    "strengthens the heart, while sleep, water and a balanced diet help the whole body recover. Doctors "
    "recommend walking at least thirty minutes a day, eating fruit and vegetables, and avoiding tobacco.\n\n"
    "Dear Maria, thank you for your letter and for the photographs of the garden. The roses look wonderful, "
    "and I was surprised how tall the sunflowers have grown. We are well here. Peter started his new job at "
    "the library in September, and the twins have joined the school orchestra: one plays the violin, the "
    "other the trumpet, which is louder than any of us expected. We hope to visit you in December, perhaps "
    "around the twentieth, if the trains are running. With love from all of us, Anna.\n\n"
    "Instructions for the printer: open the front cover, remove the orange packing tape, and insert the "
    "cartridge until it clicks. Close the cover and press the power button. Load plain paper into the tray "
    "with the printing side facing down. To connect wirelessly, hold the network button for five seconds, "
    "then choose the printer from the list on your computer or phone. If the light blinks red, check that "
    "the paper is not jammed.\n\n"
    "In mathematics, a prime number is a whole number greater than one whose only divisors are one and "
    "itself. The first primes are 2, 3, 5, 7, 11, 13, 17, 19, 23 and 29. Every whole number greater than one "
    "can be written as a product of primes in exactly one way, apart from the order of the factors. There "
    "are infinitely many primes: Euclid proved this more than two thousand years ago with a short and "
    "beautiful argument.\n\n"
    "Travel notes, day four. We left the village early and followed the old road north through the "
    "mountains. By noon the clouds had lifted, and we could see glaciers shining above the pine forests. We "
    "stopped at a farm that sold cheese, bread and apple juice, and the farmer's son showed us a shortcut "
    "across the meadows. In the evening we reached the lake, pitched the tents, cooked soup over a small "
    "stove, and watched the stars appear one by one.\n\n"
    "History remembers great battles and famous kings, but most of the past was made by ordinary people: "
    "builders, weavers, sailors, teachers, nurses and merchants. They learned skills from their parents, "
    "improved them a little, and taught them to their children. Knowledge grows slowly, like a tree, "
    "through thousands of small improvements that nobody writes down.\n";

/* ---- byte-level alphabet (GPT-2's bytes_to_unicode) ------------------------------------- */
static void byte_chars(char out[256][4])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        unsigned cp = keep ? (unsigned)b : 256u + (unsigned)n++;
        if (cp < 0x80) { out[b][0] = (char)cp; out[b][1] = 0; }
        else { out[b][0] = (char)(0xC0 | (cp >> 6)); out[b][1] = (char)(0x80 | (cp & 0x3F)); out[b][2] = 0; }
    }
}

/* ---- BPE training ------------------------------------------------------------------------ */
typedef struct bpe_word {
    int *sym;                 /* token ids */
    int n;
    int count;
} bpe_word;

typedef struct bpe {
    bpe_word *words;
    int n_words;
    char **tok;               /* token id -> bytes (NUL-terminated; the corpus has no NUL) */
    int n_tok;
    int (*merges)[2];
    int n_merges;
} bpe;

static int str_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void bpe_free(bpe *b)
{
    for (int i = 0; i < b->n_words; i++) free(b->words[i].sym);
    for (int i = 0; i < b->n_tok; i++) free(b->tok[i]);
    free(b->words);
    free(b->tok);
    free(b->merges);
}

/* Split the corpus with the Llama 3 pattern into unique pre-tokens with counts. */
static int bpe_words(bpe *b, sf_error *err)
{
    int rc = SF_OK, errc;
    PCRE2_SIZE eoff;
    char **pieces = NULL;
    size_t n = 0, cap = 0, len = strlen(corpus), at = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)llama3_pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &errc, &eoff, NULL);
    pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
    if (!re || !md) {
        rc = sf_err(err, SF_ERROR, "demo tokenizer: compiling the pre-tokenizer pattern failed (code %d)", errc);
        goto cleanup;
    }
    while (at < len) {
        int r = pcre2_match(re, (PCRE2_SPTR)corpus, len, at, 0, md, NULL);
        if (r < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] <= ov[0]) { at++; continue; }
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            char **np = realloc(pieces, cap * sizeof *np);
            if (!np) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto cleanup; }
            pieces = np;
        }
        pieces[n] = strndup(corpus + ov[0], ov[1] - ov[0]);
        if (!pieces[n++]) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto cleanup; }
        at = ov[1];
    }
    qsort(pieces, n, sizeof *pieces, str_cmp);
    b->words = calloc(n ? n : 1, sizeof *b->words);
    if (!b->words) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto cleanup; }
    for (size_t i = 0; i < n; i++) {
        if (b->n_words && !strcmp(pieces[i], pieces[i - 1])) {
            b->words[b->n_words - 1].count++;
            continue;
        }
        bpe_word *w = &b->words[b->n_words++];
        w->n = (int)strlen(pieces[i]);
        w->count = 1;
        w->sym = malloc(sizeof *w->sym * (size_t)w->n);
        if (!w->sym) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto cleanup; }
        for (int k = 0; k < w->n; k++) w->sym[k] = (unsigned char)pieces[i][k];
    }
cleanup:
    for (size_t i = 0; i < n; i++) free(pieces[i]);
    free(pieces);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc;
}

#define PAIR_SLOTS (1 << 16)

/* Train merges until the vocabulary has `target` tokens or no pair is left. Ties between
 * equally frequent pairs go to the smallest (left id, right id): the result depends on the
 * corpus alone. */
static int bpe_train(bpe *b, int target, sf_error *err)
{
    struct slot { uint64_t key; int64_t count; } *tab = NULL;
    int rc = SF_OK;
    b->tok = calloc((size_t)target, sizeof *b->tok);
    b->merges = calloc((size_t)target, sizeof *b->merges);
    tab = malloc(sizeof *tab * PAIR_SLOTS);
    if (!b->tok || !b->merges || !tab) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto cleanup; }
    for (int i = 0; i < 256; i++) {
        b->tok[i] = malloc(2);
        if (!b->tok[i]) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto cleanup; }
        b->tok[i][0] = (char)i;
        b->tok[i][1] = 0;
        b->n_tok++;
    }
    while (b->n_tok < target) {
        memset(tab, 0xff, sizeof *tab * PAIR_SLOTS);
        uint64_t best = UINT64_MAX;
        int64_t best_n = 0;
        for (int i = 0; i < b->n_words; i++) {
            bpe_word *w = &b->words[i];
            for (int k = 0; k + 1 < w->n; k++) {
                uint64_t key = (uint64_t)w->sym[k] << 32 | (uint32_t)w->sym[k + 1];
                uint64_t h = (key * 0x9e3779b97f4a7c15ull) >> 48;
                while (tab[h].key != UINT64_MAX && tab[h].key != key) h = (h + 1) & (PAIR_SLOTS - 1);
                if (tab[h].key == UINT64_MAX) { tab[h].key = key; tab[h].count = 0; }
                tab[h].count += w->count;
                if (tab[h].count > best_n || (tab[h].count == best_n && key < best)) {
                    best_n = tab[h].count;
                    best = key;
                }
            }
        }
        if (!best_n) break;
        int l = (int)(best >> 32), r = (int)(uint32_t)best;
        size_t ll = strlen(b->tok[l]), rl = strlen(b->tok[r]);
        char *s = malloc(ll + rl + 1);
        if (!s) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto cleanup; }
        memcpy(s, b->tok[l], ll);
        memcpy(s + ll, b->tok[r], rl + 1);
        int id = -1;
        for (int i = 256; i < b->n_tok && id < 0; i++)
            if (!strcmp(b->tok[i], s)) id = i;
        if (id < 0) {
            id = b->n_tok++;
            b->tok[id] = s;
        } else {
            free(s);
        }
        b->merges[b->n_merges][0] = l;
        b->merges[b->n_merges][1] = r;
        b->n_merges++;
        for (int i = 0; i < b->n_words; i++) {
            bpe_word *w = &b->words[i];
            int o = 0;
            for (int k = 0; k < w->n; k++) {
                if (k + 1 < w->n && w->sym[k] == l && w->sym[k + 1] == r) {
                    w->sym[o++] = id;
                    k++;
                } else {
                    w->sym[o++] = w->sym[k];
                }
            }
            w->n = o;
        }
        if (b->n_merges >= target) break;
    }
cleanup:
    free(tab);
    return rc;
}

/* Token bytes → byte-level string. */
static char *bytelevel(const char *bytes, char bc[256][4])
{
    size_t n = strlen(bytes);
    char *s = malloc(n * 2 + 1), *p = s;
    if (!s) return NULL;
    for (size_t i = 0; i < n; i++) {
        const char *c = bc[(unsigned char)bytes[i]];
        size_t l = strlen(c);
        memcpy(p, c, l);
        p += l;
    }
    *p = 0;
    return s;
}

/* ---- JSON files ------------------------------------------------------------------------- */
static int write_json(const char *dir, const char *name, json_t *j, sf_error *err)
{
    char path[1200];
    int rc = SF_OK;
    if (!j) return sf_err(err, SF_ENOMEM, "out of memory building %s", name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) != 0)
        rc = sf_err(err, SF_EIO, "writing %s failed: %s", path, strerror(errno));
    json_decref(j);
    return rc;
}

static json_t *added_token(int id, const char *content)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content, "single_word", 0,
                     "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

static int write_tokenizer(const char *dir, const bpe *b, sf_error *err)
{
    char bc[256][4];
    byte_chars(bc);
    int base = b->n_tok, rc;
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    for (int i = 0; i < b->n_tok; i++) {
        char *s = bytelevel(b->tok[i], bc);
        if (s) json_object_set_new(vocab, s, json_integer(i));
        free(s);
    }
    for (int i = 0; i < b->n_merges; i++) {
        char *l = bytelevel(b->tok[b->merges[i][0]], bc), *r = bytelevel(b->tok[b->merges[i][1]], bc);
        if (l && r) json_array_append_new(merges, json_sprintf("%s %s", l, r));
        free(l);
        free(r);
    }
    for (size_t i = 0; i < SF_ARRAY_LEN(specials); i++)
        json_array_append_new(added, added_token(base + (int)i, specials[i]));
    const char *bot = specials[0];
    json_t *tpl = json_pack(
        "{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}, {s:{s:s, s:i}}],"
        " s:{s:{s:s, s:[i], s:[s]}}}",
        "type", "TemplateProcessing",
        "single", "SpecialToken", "id", bot, "type_id", 0, "Sequence", "id", "A", "type_id", 0,
        "pair", "SpecialToken", "id", bot, "type_id", 0, "Sequence", "id", "A", "type_id", 0,
        "SpecialToken", "id", bot, "type_id", 1, "Sequence", "id", "B", "type_id", 1,
        "special_tokens", bot, "id", bot, "ids", base, "tokens", bot);
    json_t *root = json_pack(
        "{s:s, s:n, s:n, s:o, s:n,"
        " s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]},"
        " s:{s:s, s:[{s:s, s:b, s:b, s:b}, o]},"
        " s:{s:s, s:b, s:b, s:b},"
        " s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer",
        "pre_tokenizer", "type", "Sequence", "pretokenizers",
        "type", "Split", "pattern", "Regex", llama3_pattern, "behavior", "Isolated", "invert", 0,
        "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0,
        "post_processor", "type", "Sequence", "processors",
        "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 0, "use_regex", 1, tpl,
        "decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1,
        "model", "type", "BPE", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
        "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 1, "vocab", vocab, "merges", merges);
    if ((rc = write_json(dir, "tokenizer.json", root, err))) return rc;

    json_t *dec = json_object();
    for (size_t i = 0; i < SF_ARRAY_LEN(specials); i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", base + (int)i);
        json_object_set_new(dec, id, json_pack("{s:s, s:b, s:b, s:b, s:b, s:b}", "content", specials[i], "lstrip", 0,
                                               "normalized", 0, "rstrip", 0, "single_word", 0, "special", 1));
    }
    json_t *cfg = json_pack("{s:o, s:s, s:s, s:b, s:s, s:[s, s], s:i, s:s}", "added_tokens_decoder", dec,
                            "bos_token", specials[0], "chat_template", llama3_chat_template,
                            "clean_up_tokenization_spaces", 1, "eos_token", "<|eot_id|>", "model_input_names",
                            "input_ids", "attention_mask", "model_max_length", 2048, "tokenizer_class",
                            "PreTrainedTokenizerFast");
    return write_json(dir, "tokenizer_config.json", cfg, err);
}

/* ---- weights ------------------------------------------------------------------------------ */
enum { D_HIDDEN = 256, D_LAYERS = 4, D_HEADS = 8, D_KV = 4, D_HD = 32, D_INTER = 688 };

typedef struct demo_tensor { char name[96]; int64_t rows, cols; int norm; } demo_tensor;

static int demo_tensors(demo_tensor *t, int vocab)
{
    int n = 0;
#define T(R, C, NORM, ...) do { snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__); t[n].rows = R; t[n].cols = C; t[n].norm = NORM; n++; } while (0)
    T(vocab, D_HIDDEN, 0, "model.embed_tokens.weight");
    for (int l = 0; l < D_LAYERS; l++) {
        T(0, D_HIDDEN, 1, "model.layers.%d.input_layernorm.weight", l);
        T(D_HEADS * D_HD, D_HIDDEN, 0, "model.layers.%d.self_attn.q_proj.weight", l);
        T(D_KV * D_HD, D_HIDDEN, 0, "model.layers.%d.self_attn.k_proj.weight", l);
        T(D_KV * D_HD, D_HIDDEN, 0, "model.layers.%d.self_attn.v_proj.weight", l);
        T(D_HIDDEN, D_HEADS * D_HD, 0, "model.layers.%d.self_attn.o_proj.weight", l);
        T(0, D_HIDDEN, 1, "model.layers.%d.post_attention_layernorm.weight", l);
        T(D_INTER, D_HIDDEN, 0, "model.layers.%d.mlp.gate_proj.weight", l);
        T(D_INTER, D_HIDDEN, 0, "model.layers.%d.mlp.up_proj.weight", l);
        T(D_HIDDEN, D_INTER, 0, "model.layers.%d.mlp.down_proj.weight", l);
    }
    T(0, D_HIDDEN, 1, "model.norm.weight");
    T(vocab, D_HIDDEN, 0, "lm_head.weight");
#undef T
    return n;
}

static int write_weights(const char *dir, int vocab, uint64_t seed, sf_error *err)
{
    demo_tensor t[4 + D_LAYERS * 9];
    int n = demo_tensors(t, vocab), rc = SF_OK;
    char path[1200], *hdr = NULL;
    uint16_t *data = NULL;
    FILE *f = NULL;
    json_t *h = json_pack("{s:{s:s}}", "__metadata__", "format", "pt");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)((t[i].rows ? t[i].rows : 1) * t[i].cols) * 2;
        json_t *shape = t[i].rows ? json_pack("[I, I]", (json_int_t)t[i].rows, (json_int_t)t[i].cols)
                                  : json_pack("[I]", (json_int_t)t[i].cols);
        json_object_set_new(h, t[i].name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", "BF16", "shape", shape,
                                                    "data_offsets", (json_int_t)off, (json_int_t)(off + bytes)));
        off += bytes;
    }
    hdr = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    data = malloc(off);
    if (!hdr || !data) { rc = sf_err(err, SF_ENOMEM, "out of memory writing the demo weights"); goto cleanup; }
    sf_rng rng;
    sf_rng_seed(&rng, seed);
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        int64_t cnt = (t[i].rows ? t[i].rows : 1) * t[i].cols;
        for (int64_t j = 0; j < cnt; j++) {
            float x = sf_rng_normal(&rng);
            data[k++] = sf_f32_to_bf16(t[i].norm ? 1.0f + 0.1f * x : 0.02f * x);
        }
    }
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    uint64_t hl64 = padded;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    if (!f) { rc = sf_err(err, SF_EIO, "open %s for writing: %s", path, strerror(errno)); goto cleanup; }
    if (fwrite(&hl64, 8, 1, f) != 1 || fwrite(hdr, 1, hl, f) != hl || fwrite("        ", 1, padded - hl, f) != padded - hl ||
        fwrite(data, 1, off, f) != off) {
        rc = sf_err(err, SF_EIO, "writing %s: %s", path, strerror(errno));
        goto cleanup;
    }
    if (fclose(f) != 0) { f = NULL; rc = sf_err(err, SF_EIO, "writing %s: %s", path, strerror(errno)); goto cleanup; }
    f = NULL;
cleanup:
    if (f) fclose(f);
    free(hdr);
    free(data);
    return rc;
}

static int mkdir_p(const char *dir, sf_error *err)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return sf_err(err, SF_EIO, "mkdir %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return sf_err(err, SF_EIO, "mkdir %s: %s", buf, strerror(errno));
    return SF_OK;
}

int sf_demo_write(const char *dir, uint64_t seed, sf_error *err)
{
    bpe b = { 0 };
    char path[1200];
    int rc;
    if ((rc = mkdir_p(dir, err))) return rc;
    if ((rc = bpe_words(&b, err)) || (rc = bpe_train(&b, DEMO_VOCAB_TARGET - (int)SF_ARRAY_LEN(specials), err)) ||
        (rc = write_tokenizer(dir, &b, err)))
        goto cleanup;
    int base = b.n_tok, vocab = base + (int)SF_ARRAY_LEN(specials);
    int bot = base, eot_text = base + 1, eot = base + 4;
    json_t *cfg = json_pack(
        "{s:[s], s:b, s:f, s:i, s:[i, i], s:i, s:s, s:i, s:f, s:i, s:i, s:s, s:i, s:i, s:i, s:i, s:f, s:n, s:f,"
        " s:b, s:s, s:b, s:i}",
        "architectures", "LlamaForCausalLM", "attention_bias", 0, "attention_dropout", 0.0, "bos_token_id", bot,
        "eos_token_id", eot_text, eot, "head_dim", D_HD, "hidden_act", "silu", "hidden_size", D_HIDDEN,
        "initializer_range", 0.02, "intermediate_size", D_INTER, "max_position_embeddings", 2048, "model_type",
        "llama", "num_attention_heads", D_HEADS, "num_hidden_layers", D_LAYERS, "num_key_value_heads", D_KV,
        "pretraining_tp", 1, "rms_norm_eps", 1e-5, "rope_scaling", "rope_theta", 500000.0, "tie_word_embeddings", 0,
        "torch_dtype", "bfloat16", "use_cache", 1, "vocab_size", vocab);
    json_t *gen = json_pack("{s:i, s:[i, i]}", "bos_token_id", bot, "eos_token_id", eot_text, eot);
    if ((rc = write_json(dir, "config.json", cfg, err)) || (rc = write_json(dir, "generation_config.json", gen, err)) ||
        (rc = write_weights(dir, vocab, seed, err)))
        goto cleanup;
    snprintf(path, sizeof path, "%s/" DEMO_STAMP_FILE, dir);
    FILE *f = fopen(path, "w");
    if (!f || fputs(DEMO_STAMP, f) < 0 || fclose(f) != 0) {
        rc = sf_err(err, SF_EIO, "writing %s: %s", path, strerror(errno));
        goto cleanup;
    }
    rc = SF_OK;
cleanup:
    bpe_free(&b);
    return rc;
}

/* ---- where the demo lives ----------------------------------------------------------------- */
static int stamp_ok(const char *dir)
{
    char path[1200], *text = NULL;
    snprintf(path, sizeof path, "%s/" DEMO_STAMP_FILE, dir);
    if (sf_read_file(path, &text, NULL, NULL) != SF_OK) return 0;
    int ok = !strcmp(text, DEMO_STAMP);
    free(text);
    return ok;
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st; (void)flag; (void)ftw;
    remove(p);
    return 0;
}

static void rm_rf(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

int sf_demo_path(char *out, size_t n, sf_error *err)
{
    const char *e = getenv("SEMFLOW_DEMO_DIR"), *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[1024], tmp[1100], old[1100];
    int rc;
    if (e && *e) snprintf(dir, sizeof dir, "%s", e);
    else if (x && *x) snprintf(dir, sizeof dir, "%s/semflow/demo", x);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/semflow/demo", home);
    else return sf_err(err, SF_EINVAL, "no place for the demo model: set SEMFLOW_DEMO_DIR (or HOME)");
    if (strlen(dir) + 1 > n) return sf_err(err, SF_EINVAL, "demo model path too long: %s", dir);
    snprintf(out, n, "%s", dir);
    if (stamp_ok(dir)) return SF_OK;
    /* write into a temporary folder next to it, then rename into place */
    SF_LOGI("writing the demo model (random weights) to %s", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", dir, (int)getpid());
    snprintf(old, sizeof old, "%s.old.%d", dir, (int)getpid());
    rm_rf(tmp);
    if ((rc = sf_demo_write(tmp, SF_DEMO_SEED, err))) {
        rm_rf(tmp);
        return sf_err_wrap(err, "writing the demo model to %s", tmp);
    }
    if (stamp_ok(dir)) { /* another process finished first: keep its copy (same bytes) */
        rm_rf(tmp);
        return SF_OK;
    }
    if (rename(dir, old) != 0 && errno != ENOENT) {
        rm_rf(tmp);
        return sf_err(err, SF_EIO, "moving the old demo model %s aside: %s", dir, strerror(errno));
    }
    if (rename(tmp, dir) != 0) {
        int e2 = errno;
        rm_rf(tmp);
        if (stamp_ok(dir)) { rm_rf(old); return SF_OK; } /* another process got there first */
        return sf_err(err, SF_EIO, "rename %s -> %s: %s", tmp, dir, strerror(e2));
    }
    rm_rf(old);
    return SF_OK;
}
