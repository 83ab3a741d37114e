/* semflow — one binary: serve | generate | bench | loadgen | top | hal | tokenize | ... */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} cmds[] = {
    { "serve", sf_cmd_serve, "OpenAI-compatible HTTP server" },
    { "generate", sf_cmd_generate, "generate text from a prompt (streams to stdout)" },
    { "perplexity", sf_cmd_perplexity, "a text's perplexity under the model (llama.cpp's method)" },
    { "tokenize", sf_cmd_tokenize, "print the token ids of a text as a JSON array" },
    { "detokenize", sf_cmd_detokenize, "print the text of token ids" },
    { "bench", sf_cmd_bench, "offline benchmarks (decode, prefill, throughput)" },
    { "loadgen", sf_cmd_loadgen, "load generator against a running server" },
    { "top", sf_cmd_top, "live PCIe / socket / queue dashboard (eBPF)" },
    { "hal", sf_cmd_hal, "print what the hardware layer measured" },
    { "gen-model", sf_cmd_gen_model, "write the demo model (random weights) as a HF folder" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: semflow <command> [options]   (semflow <command> --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-11s %s\n", cmds[i].name, cmds[i].help);
}

int main(int argc, char **argv)
{
    /* hidden: a tensor-parallel follower, started by the leader itself */
    if (argc >= 2 && !strcmp(argv[1], "rank")) {
        if (!sf_cmd_rank) {
            fprintf(stderr, "semflow: 'rank' is not part of this build\n");
            return 2;
        }
        return sf_cmd_rank(argc - 1, argv + 1);
    }
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        if (strcmp(argv[1], cmds[i].name)) continue;
        if (!cmds[i].fn) {
            fprintf(stderr, "semflow: '%s' is not part of this build\n", argv[1]);
            return 2;
        }
        return cmds[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "semflow: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
