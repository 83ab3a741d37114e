/* cli.h — the subcommands of the semflow binary, one file each (cli/cmd_*.c).
 * Each takes argv with argv[0] = the command name and returns the process exit status
 * (0 ok, 1 runtime error, 2 usage error). */
#ifndef SF_CLI_H
#define SF_CLI_H

/* weak: a command whose file is not built shows up as "not part of this build" */
#define SF_CMD(name) int name(int argc, char **argv) __attribute__((weak))
SF_CMD(sf_cmd_serve);
SF_CMD(sf_cmd_generate);
SF_CMD(sf_cmd_perplexity);
SF_CMD(sf_cmd_tokenize);
SF_CMD(sf_cmd_detokenize);
SF_CMD(sf_cmd_bench);
SF_CMD(sf_cmd_loadgen);
SF_CMD(sf_cmd_top);
SF_CMD(sf_cmd_hal);
SF_CMD(sf_cmd_gen_model);
SF_CMD(sf_cmd_rank);
SF_CMD(sf_cmd_bench_kv_quality); /* `semflow bench kv-quality` (cmd_bench_kv.c) */
#undef SF_CMD

/* A flag's integer value, the whole string, within [lo, hi]; else a message naming the command
 * and the flag on stderr and -1 (cli/args.c). */
int sf_cli_long(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out);

/* vLLM's --speculative-config for the n-gram method, as JSON: {"method": "ngram",
 * "num_speculative_tokens": K, "prompt_lookup_max": N, "prompt_lookup_min": M,
 * "disable_by_batch_size": B} into c's spec_* (the engine checks the ranges); -1 with a message. */
struct sf_engine_config;
int sf_cli_spec_config(const char *cmd, const char *text, struct sf_engine_config *c);

/* The engine flags the offline commands share (--backend, --threads, --load-format,
 * --speculative-config) into c:
 * 1 when `flag` was one of them and v was good, -1 (a message on stderr) when v was not, 0 when
 * `flag` is another. */
int sf_cli_engine_flag(const char *cmd, const char *flag, const char *v, struct sf_engine_config *c);

#endif
