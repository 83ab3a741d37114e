/* test_chat.c — chat templates: each format rendered for the same conversation and compared with
 * the text the official Jinja template produces (worked out by hand, whitespace included),
 * format detection from tokenizer_config.json, and bad inputs. */
#include "engine/tokenizer.h"
#include "tests/test.h"

static const sf_chat_msg conv[] = {
    { "system", "You are terse." },
    { "user", "Hi there" },
    { "assistant", "Hello." },
    { "user", "2+2?" },
};

static char *render(const sf_tokenizer *t, int fmt, const sf_chat_msg *m, int n, int gen)
{
    char *s = NULL;
    sf_error err = { 0 };
    if (sf_chat_render(t, fmt, m, n, gen, &s, &err)) printf("# render: %s\n", err.msg);
    return s;
}

#define CHECK_STR(got, want)                                                                       \
    do {                                                                                           \
        char *g_ = (got);                                                                          \
        CHECK_MSG(g_ && !strcmp(g_, want), "got \"%s\"", g_ ? g_ : "(null)");                     \
        free(g_);                                                                                  \
    } while (0)

TEST(zephyr_matches_tinyllama_template)
{
    sf_tokenizer *t = NULL;
    sf_error err = { 0 };
    int rc = sf_tok_load_dir(test_data("tinyllama-1.1b-chat-v1.0"), &t, &err);
    REQUIRE(rc == 0, "%s", err.msg);
    CHECK(sf_tok_chat_format(t) == SF_CHAT_ZEPHYR);
    /* trim_blocks drops the newline after each {% %} tag; the one after each {{ }} stays */
    CHECK_STR(render(t, SF_CHAT_AUTO, conv, 4, 1),
              "<|system|>\nYou are terse.</s>\n<|user|>\nHi there</s>\n<|assistant|>\nHello.</s>\n"
              "<|user|>\n2+2?</s>\n<|assistant|>\n");
    CHECK_STR(render(t, SF_CHAT_AUTO, conv + 1, 1, 0), "<|user|>\nHi there</s>\n");
    /* the prompt encodes with the tokenizer: "<|user|>" is plain text, "</s>" is the EOS token */
    char *p = render(t, SF_CHAT_AUTO, conv + 1, 1, 1);
    int32_t *ids = NULL;
    size_t n = 0;
    rc = p ? sf_tok_encode(t, p, strlen(p), 0, &ids, &n, &err) : SF_ERROR;
    REQUIRE(rc == 0, "%s", err.msg);
    int eos_count = 0;
    for (size_t i = 0; i < n; i++) eos_count += ids[i] == sf_tok_eos(t);
    CHECK_MSG(eos_count == 1, "%d EOS tokens in the encoded prompt", eos_count);
    free(ids);
    free(p);
    sf_tok_free(t);
}

TEST(llama3)
{
    CHECK_STR(render(NULL, SF_CHAT_LLAMA3, conv, 2, 1),
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    /* content is trimmed (| trim) */
    sf_chat_msg m[] = { { "user", "  padded \n" } };
    CHECK_STR(render(NULL, SF_CHAT_LLAMA3, m, 1, 0),
              "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|>");
}

TEST(chatml)
{
    CHECK_STR(render(NULL, SF_CHAT_CHATML, conv, 3, 1),
              "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
              "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n");
    CHECK_STR(render(NULL, SF_CHAT_CHATML, conv + 1, 1, 0), "<|im_start|>user\nHi there<|im_end|>\n");
}

TEST(inst)
{
    CHECK_STR(render(NULL, SF_CHAT_INST, conv, 4, 1),
              "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello. </s><s>[INST] 2+2? [/INST]");
    CHECK_STR(render(NULL, SF_CHAT_INST, conv + 1, 1, 1), "<s>[INST] Hi there [/INST]");
    sf_chat_msg bad[] = { { "user", "a" }, { "user", "b" } };
    char *s = NULL;
    sf_error err = { 0 };
    CHECK(sf_chat_render(NULL, SF_CHAT_INST, bad, 2, 1, &s, &err) == SF_EINVAL && s == NULL);
    CHECK_MSG(strstr(err.msg, "alternate") != NULL, "message: %s", err.msg);
}

TEST(detect_and_names)
{
    static const struct { const char *tpl; int fmt; } cases[] = {
        { "{{ '<|start_header_id|>' + message['role'] }}", SF_CHAT_LLAMA3 },
        { "{% for m in messages %}{{'<|im_start|>' + m['role']}}{% endfor %}", SF_CHAT_CHATML },
        { "{{ bos_token + '[INST] ' + content }}", SF_CHAT_INST },
        { "{{ '<|user|>\\n' }}", SF_CHAT_ZEPHYR },
        { "{{ something else }}", SF_CHAT_CHATML },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cfg[512];
        sf_tokenizer *t = NULL;
        sf_error err = { 0 };
        char *json = NULL;
        int rc = sf_read_file(test_data("gpt2-tokenizer/tokenizer.json"), &json, NULL, &err);
        REQUIRE(rc == 0, "%s", err.msg);
        snprintf(cfg, sizeof cfg, "{\"chat_template\": \"%s\"}", cases[i].tpl);
        rc = sf_tok_load_json(json, cfg, &t, &err);
        free(json);
        REQUIRE(rc == 0, "%s", err.msg);
        CHECK_MSG(sf_tok_chat_format(t) == cases[i].fmt, "template %zu detected as %d", i, sf_tok_chat_format(t));
        sf_tok_free(t);
    }
    CHECK(sf_chat_format_from_name("llama3") == SF_CHAT_LLAMA3);
    CHECK(sf_chat_format_from_name("ChatML") == SF_CHAT_CHATML);
    CHECK(sf_chat_format_from_name("inst") == SF_CHAT_INST);
    CHECK(sf_chat_format_from_name("zephyr") == SF_CHAT_ZEPHYR);
    CHECK(sf_chat_format_from_name("raw") == SF_CHAT_RAW);
    CHECK(sf_chat_format_from_name("jinja") == -1);
    CHECK(sf_chat_format_from_name(NULL) == -1);
}

TEST(bad_messages)
{
    sf_chat_msg m[] = { { "user", NULL } };
    char *s = NULL;
    sf_error err = { 0 };
    CHECK(sf_chat_render(NULL, SF_CHAT_CHATML, m, 1, 1, &s, &err) == SF_EINVAL && !s);
    CHECK(strstr(err.msg, "message 0") != NULL);
    CHECK(sf_chat_render(NULL, 99, conv, 1, 1, &s, &err) == SF_EINVAL && !s);
    CHECK_STR(render(NULL, SF_CHAT_RAW, conv + 1, 2, 1), "Hi there\nHello.");
}

TEST(chatml_qwen2_default_system)
{
    /* Qwen2's template adds a system turn when the conversation has none (rendered with Jinja:
     * {% if loop.first and messages[0]['role'] != 'system' %}...) */
    static const char qwen2_cfg[] =
        "{\"chat_template\": \"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] "
        "+ '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}\"}";
    char *json = NULL;
    sf_error err = { 0 };
    sf_tokenizer *t = NULL;
    int rc = sf_read_file(test_data("gpt2-tokenizer/tokenizer.json"), &json, NULL, &err);
    REQUIRE(rc == 0, "%s", err.msg);
    rc = sf_tok_load_json(json, qwen2_cfg, &t, &err);
    free(json);
    REQUIRE(rc == 0, "%s", err.msg);
    CHECK(sf_tok_chat_format(t) == SF_CHAT_CHATML);
    CHECK_STR(render(t, SF_CHAT_AUTO, conv + 1, 1, 1),
              "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
              "<|im_start|>assistant\n");
    CHECK_STR(render(t, SF_CHAT_AUTO, conv, 2, 0),
              "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n");
    CHECK_STR(render(t, SF_CHAT_AUTO, conv, 0, 1), "<|im_start|>assistant\n");
    sf_tok_free(t);
}

/* Tools, a call and two results, rendered as Qwen2.5's and Llama 3.1's templates render them
 * (worked out from those templates by hand; the chatml text matches what vLLM shows Qwen2.5 is
 * given). */
static const char tools_json[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]";
static const sf_chat_msg tool_conv[] = {
    { "system", "Be brief.", NULL },
    { "user", "Weather in Paris?", NULL },
    { "assistant", "", "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                       "\"arguments\": \"{\\\"city\\\":\\\"Paris\\\"}\"}}]" },
    { "tool", "{\"temp\": 21}", NULL },
    { "tool", "sunny", NULL },
    { "user", "Thanks", NULL },
};

static char *render_tools(int fmt, const sf_chat_msg *m, int n, const char *tools, int *rc)
{
    char *s = NULL;
    sf_error err = { 0 };
    *rc = sf_chat_render_tools(NULL, fmt, m, n, 1, tools, &s, &err);
    if (*rc) printf("# render: %s\n", err.msg);
    return s;
}

TEST(tools)
{
    int rc;
    CHECK_STR(render_tools(SF_CHAT_CHATML, tool_conv, 6, tools_json, &rc),
              "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
              "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
              "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather now\", "
              "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": "
              "[\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
              "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
              "<args-json-object>}\n</tool_call><|im_end|>\n"
              "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
              "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
              "</tool_call><|im_end|>\n"
              "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\nsunny\n"
              "</tool_response><|im_end|>\n"
              "<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n");
    CHECK_STR(render_tools(SF_CHAT_LLAMA3, tool_conv, 6, tools_json, &rc),
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge "
              "Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for "
              "a function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
              "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use "
              "variables.\n\n"
              "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n        "
              "\"description\": \"Weather now\",\n        \"parameters\": {\n            \"type\": \"object\",\n"
              "            \"properties\": {\n                \"city\": {\n                    \"type\": \"string\"\n"
              "                }\n            },\n            \"required\": [\n                \"city\"\n            ]\n"
              "        }\n    }\n}\n\nWeather in Paris?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": "
              "{\"city\": \"Paris\"}}<|eot_id|>"
              "<|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"temp\\\": 21}\"<|eot_id|>"
              "<|start_header_id|>ipython<|end_header_id|>\n\n\"sunny\"<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nThanks<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    /* a call with text before it keeps the text (chatml); formats without a convention refuse */
    sf_chat_msg said[] = { { "user", "Hi", NULL }, { "assistant", "Let me look.", tool_conv[2].tool_calls } };
    CHECK_STR(render_tools(SF_CHAT_CHATML, said, 2, NULL, &rc),
              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nLet me look.\n<tool_call>\n{\"name\": "
              "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>assistant\n");
    char *s = render_tools(SF_CHAT_ZEPHYR, tool_conv, 6, tools_json, &rc);
    CHECK(!s && rc == SF_EUNSUPPORTED);
    s = render_tools(SF_CHAT_LLAMA3, tool_conv + 2, 1, tools_json, &rc); /* no first user message */
    CHECK(!s && rc == SF_EINVAL);
}

/* continue_final_message: the rendered chat ends where the final message's content does, in
 * every format (Llama 3 trims the content: the trimmed one is found); refusals */
TEST(continue_final)
{
    static const sf_chat_msg m[] = { { "user", "Tell a story." }, { "assistant", "Once upon a " } };
    static const struct { int fmt; const char *want; } c[] = {
        { SF_CHAT_CHATML, "<|im_start|>user\nTell a story.<|im_end|>\n<|im_start|>assistant\nOnce upon a " },
        { SF_CHAT_LLAMA3, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nTell a story.<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\nOnce upon a" },
        { SF_CHAT_ZEPHYR, "<|user|>\nTell a story.</s>\n<|assistant|>\nOnce upon a " },
        { SF_CHAT_INST, "<s>[INST] Tell a story. [/INST] Once upon a " }, /* the space before </s>: as transformers cuts */
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(c); i++) {
        char *s = render(NULL, c[i].fmt, m, 2, 0);
        sf_error err = { 0 };
        REQUIRE(s, "format %d renders", c[i].fmt);
        CHECK_MSG(sf_chat_continue_final(s, m[1].content, &err) == SF_OK, "%s", err.msg);
        CHECK_STR(s, c[i].want);
    }
    /* the content twice: cut after the last one */
    static const sf_chat_msg twice[] = { { "user", "ok" }, { "assistant", "ok" } };
    char *s = render(NULL, SF_CHAT_CHATML, twice, 2, 0);
    sf_error err = { 0 };
    REQUIRE(s && sf_chat_continue_final(s, "ok", &err) == SF_OK, "%s", err.msg);
    CHECK_STR(s, "<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\nok");
    /* a message the format does not render (zephyr drops other roles), and an empty one */
    static const sf_chat_msg odd[] = { { "user", "hi" }, { "developer", "result 42" } };
    s = render(NULL, SF_CHAT_ZEPHYR, odd, 2, 0);
    CHECK(s && sf_chat_continue_final(s, "result 42", &err) == SF_EINVAL && strstr(err.msg, "does not appear"));
    free(s);
    s = render(NULL, SF_CHAT_CHATML, odd, 1, 0);
    CHECK(s && sf_chat_continue_final(s, "  ", &err) == SF_EINVAL && strstr(err.msg, "empty"));
    free(s);
}

int main(void)
{
    RUN(zephyr_matches_tinyllama_template);
    RUN(llama3);
    RUN(chatml);
    RUN(chatml_qwen2_default_system);
    RUN(inst);
    RUN(detect_and_names);
    RUN(bad_messages);
    RUN(tools);
    RUN(continue_final);
    return test_summary();
}
