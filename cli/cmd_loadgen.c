/* cmd_loadgen.c — `semflow loadgen`: load against a running server on this machine. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "gateway/loadgen.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: semflow loadgen [--url http://127.0.0.1:8080] [options]\n"
            "  --concurrency N        closed loop: N requests in flight (default 8)\n"
            "  --rate R               open loop: Poisson arrivals, R requests/s (overrides --concurrency)\n"
            "  --num-requests N       requests to issue (default 100)\n"
            "  --duration S           stop issuing after S seconds\n"
            "  --scenario FILE        classes mixing intents, API keys, prompt and output lengths (JSON)\n"
            "  --prompt-tokens D      without a scenario: prompt words, N | uniform:MIN:MAX | normal:MEAN:STD (32)\n"
            "  --output-tokens D      without a scenario: output tokens, same forms (32)\n"
            "  --prefix-tokens N      without a scenario: words every prompt begins with, the same for all (the\n"
            "                         system message with --chat): what the server's prefix cache finds (0)\n"
            "  --intent S             without a scenario: X-Semantic-Intent to send\n"
            "  --api-key K            without a scenario: bearer key\n"
            "  --chat                 without a scenario: use /v1/chat/completions\n"
            "  --model NAME           model field to send\n"
            "  --slo LIST             goodput targets, e.g. ttft=300ms,tpot=50ms,e2el=5s\n"
            "  --no-ignore-eos        let requests stop at EOS (default: exactly the drawn output length)\n"
            "  --timeout S            per request (default 300)\n"
            "  --seed N               draws of classes and lengths (default 1)\n"
            "  --json FILE            also write the report as JSON\n");
}

int sf_cmd_loadgen(int argc, char **argv)
{
    enum { O_URL = 256, O_CONC, O_RATE, O_NUM, O_DUR, O_SCEN, O_PT, O_OT, O_INTENT, O_KEY, O_CHAT, O_MODEL, O_SLO,
           O_NOEOS, O_TIMEOUT, O_SEED, O_JSON, O_PREFIX, O_HELP };
    static const struct option opts[] = {
        { "url", 1, 0, O_URL }, { "concurrency", 1, 0, O_CONC }, { "rate", 1, 0, O_RATE },
        { "num-requests", 1, 0, O_NUM }, { "duration", 1, 0, O_DUR }, { "scenario", 1, 0, O_SCEN },
        { "prompt-tokens", 1, 0, O_PT }, { "output-tokens", 1, 0, O_OT }, { "intent", 1, 0, O_INTENT },
        { "api-key", 1, 0, O_KEY }, { "chat", 0, 0, O_CHAT }, { "model", 1, 0, O_MODEL }, { "slo", 1, 0, O_SLO },
        { "no-ignore-eos", 0, 0, O_NOEOS }, { "timeout", 1, 0, O_TIMEOUT }, { "seed", 1, 0, O_SEED },
        { "json", 1, 0, O_JSON }, { "prefix-tokens", 1, 0, O_PREFIX }, { "help", 0, 0, O_HELP }, { 0, 0, 0, 0 },
    };
    sf_lg_config c;
    sf_lg_config_default(&c);
    sf_error err = { 0 };
    const char *scenario = NULL, *json_path = NULL;
    int o, rc = 0;
    optind = 1;
    opterr = 0;
    int li = -1;
    while ((li = -1, o = getopt_long(argc, argv, "", opts, &li)) != -1) {
        char *end = NULL;
        switch (o) {
        case O_URL: rc = sf_lg_parse_url(&c, optarg, &err); break;
        case O_CONC: c.concurrency = (int)strtol(optarg, &end, 10); rc = *end || c.concurrency < 1 || c.concurrency > 100000; break;
        case O_RATE: c.rate = strtod(optarg, &end); rc = *end || !(c.rate > 0 && c.rate <= 1e6); break;
        case O_NUM: c.num_requests = (int)strtol(optarg, &end, 10); rc = *end || c.num_requests < 1 || c.num_requests > 10000000; break;
        case O_DUR: c.duration_s = strtod(optarg, &end); rc = *end || !(c.duration_s > 0 && c.duration_s <= 86400); break;
        case O_SCEN: scenario = optarg; break;
        case O_PT: rc = sf_lg_parse_dist(optarg, &c.classes[0].prompt, &err); break;
        case O_OT: rc = sf_lg_parse_dist(optarg, &c.classes[0].output, &err); break;
        case O_PREFIX:
            c.classes[0].prefix_words = (int)strtol(optarg, &end, 10);
            rc = *end || c.classes[0].prefix_words < 0 || c.classes[0].prefix_words > 100000;
            break;
        case O_INTENT: snprintf(c.classes[0].intent, sizeof c.classes[0].intent, "%s", optarg); break;
        case O_KEY: snprintf(c.classes[0].api_key, sizeof c.classes[0].api_key, "%s", optarg); break;
        case O_CHAT: c.classes[0].chat = 1; break;
        case O_MODEL: snprintf(c.model, sizeof c.model, "%s", optarg); break;
        case O_SLO: rc = sf_lg_parse_slo(&c, optarg, &err); break;
        case O_NOEOS: c.ignore_eos = 0; break;
        case O_TIMEOUT: c.timeout_s = strtod(optarg, &end); rc = *end || !(c.timeout_s >= 1 && c.timeout_s <= 86400); break;
        case O_SEED: c.seed = strtoull(optarg, &end, 10); rc = *end != 0; break;
        case O_JSON: json_path = optarg; break;
        case O_HELP: usage(stdout); return 0;
        default:
            fprintf(stderr, "semflow loadgen: unknown or incomplete option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (rc) {
            if (err.msg[0]) fprintf(stderr, "semflow loadgen: %s\n", err.msg);
            else fprintf(stderr, "semflow loadgen: bad value '%s' for --%s\n", optarg, li >= 0 ? opts[li].name : "?");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "semflow loadgen: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (scenario && sf_lg_load_scenario(&c, scenario, &err)) {
        fprintf(stderr, "semflow loadgen: %s\n", err.msg);
        return 2;
    }
    sf_lg_result *res = NULL;
    if (sf_loadgen_run(&c, &res, &err)) {
        fprintf(stderr, "semflow loadgen: %s\n", err.msg);
        return 1;
    }
    sf_lg_report_table(&c, res, stdout);
    if (json_path && sf_lg_report_json(&c, res, json_path, &err)) {
        fprintf(stderr, "semflow loadgen: %s\n", err.msg);
        rc = 1;
    }
    int completed = 0;
    for (int i = 0; i < res->n; i++) completed += res->s[i].ok;
    if (!completed) {
        fprintf(stderr, "semflow loadgen: no request completed (is the server up at http://%s:%d?)\n", c.host, c.port);
        rc = 1;
    }
    sf_lg_result_free(res);
    return rc;
}
