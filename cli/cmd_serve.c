/* cmd_serve.c — `semflow serve`: the OpenAI-compatible HTTP server. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "gateway/gateway.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: semflow serve --model M [options]\n"
            "  --model M                 Hugging Face folder, .gguf file, or 'demo'\n"
            "  --host H                  address to listen on (default 127.0.0.1)\n"
            "  --port P                  port (default 8080; 0 picks a free one and logs it)\n"
            "  --workers N               event-loop threads, one SO_REUSEPORT socket each (default: cores)\n"
            "  --tenants FILE            API keys, default intents and limits (JSON; see docs/API.md)\n"
            "  --served-model-name NAME  model id clients use (default: the model's name)\n"
            "  --backend auto|cpu|cuda   (default auto)\n"
            "  --threads N               CPU backend threads (default: all cores)\n"
            "  --device N                CUDA device (default 0)\n"
            "  --load-format dummy       random weights from config.json\n"
            "  --max-num-seqs N          running sequences at most (default 64)\n"
            "  --max-batched-tokens N    token budget per engine step (default 2048)\n"
            "  --max-model-len N         context cap (default: the model's)\n"
            "  --num-kv-blocks N         KV blocks (default: sized from memory)\n"
            "  --kv-block-size N         tokens per KV block (default 16)\n"
            "  --kv-high-reserve F       share of KV blocks only high urgency may take (default 0.1)\n"
            "  --gpu-memory-utilization F (default 0.9)\n"
            "  --queue-limit N           waiting requests per urgency lane before 429 (default 256)\n"
            "  --max-body BYTES          largest request body (default 4194304)\n"
            "  --timeout S               per-connection read/write timeout (default 30)\n"
            "  --drain-timeout S         on SIGTERM, how long in-flight requests may finish (default 30)\n");
}

static int num(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end;
    double d = strtod(v, &end);
    if (!*v || *end || !(d >= lo && d <= hi)) {
        fprintf(stderr, "semflow serve: %s '%s' must be a number from %g to %g\n", flag, v, lo, hi);
        return -1;
    }
    *out = d;
    return 0;
}

int sf_cmd_serve(int argc, char **argv)
{
    enum { O_MODEL = 256, O_HOST, O_PORT, O_WORKERS, O_TENANTS, O_NAME, O_BACKEND, O_THREADS, O_DEVICE, O_LOADFMT,
           O_SEQS, O_BATCHED, O_MAXLEN, O_BLOCKS, O_BLOCKSZ, O_RESERVE, O_GPUMEM, O_QLIMIT, O_BODY, O_TIMEOUT,
           O_DRAIN, O_HELP };
    static const struct option opts[] = {
        { "model", 1, 0, O_MODEL }, { "host", 1, 0, O_HOST }, { "port", 1, 0, O_PORT },
        { "workers", 1, 0, O_WORKERS }, { "tenants", 1, 0, O_TENANTS }, { "served-model-name", 1, 0, O_NAME },
        { "backend", 1, 0, O_BACKEND }, { "threads", 1, 0, O_THREADS }, { "device", 1, 0, O_DEVICE },
        { "load-format", 1, 0, O_LOADFMT }, { "max-num-seqs", 1, 0, O_SEQS },
        { "max-batched-tokens", 1, 0, O_BATCHED }, { "max-model-len", 1, 0, O_MAXLEN },
        { "num-kv-blocks", 1, 0, O_BLOCKS }, { "kv-block-size", 1, 0, O_BLOCKSZ },
        { "kv-high-reserve", 1, 0, O_RESERVE }, { "gpu-memory-utilization", 1, 0, O_GPUMEM },
        { "queue-limit", 1, 0, O_QLIMIT }, { "max-body", 1, 0, O_BODY }, { "timeout", 1, 0, O_TIMEOUT },
        { "drain-timeout", 1, 0, O_DRAIN }, { "help", 0, 0, O_HELP }, { 0, 0, 0, 0 },
    };
    sf_gateway_config c;
    sf_gateway_config_default(&c);
    double d;
    int o;
    optind = 1;
    opterr = 0;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (o) {
        case O_MODEL: c.engine.model = optarg; break;
        case O_HOST: c.host = optarg; break;
        case O_PORT: bad = num("--port", optarg, 0, 65535, &d); c.port = (int)d; break;
        case O_WORKERS: bad = num("--workers", optarg, 1, 64, &d); c.workers = (int)d; break;
        case O_TENANTS: c.tenants_path = optarg; break;
        case O_NAME: c.served_name = optarg; break;
        case O_BACKEND: c.engine.backend = optarg; break;
        case O_THREADS: bad = num("--threads", optarg, 0, 1024, &d); c.engine.n_threads = (int)d; break;
        case O_DEVICE: bad = num("--device", optarg, 0, 64, &d); c.engine.device = (int)d; break;
        case O_LOADFMT:
            if (strcmp(optarg, "dummy") && strcmp(optarg, "auto")) {
                fprintf(stderr, "semflow serve: --load-format must be 'auto' or 'dummy'\n");
                return 2;
            }
            c.engine.load_dummy = !strcmp(optarg, "dummy");
            break;
        case O_SEQS: bad = num("--max-num-seqs", optarg, 1, 65536, &d); c.engine.max_num_seqs = (int)d; break;
        case O_BATCHED: bad = num("--max-batched-tokens", optarg, 1, 1 << 24, &d); c.engine.max_batched_tokens = (int)d; break;
        case O_MAXLEN: bad = num("--max-model-len", optarg, 1, 1 << 24, &d); c.engine.max_model_len = (int)d; break;
        case O_BLOCKS: bad = num("--num-kv-blocks", optarg, 1, 1 << 26, &d); c.engine.num_kv_blocks = (int)d; break;
        case O_BLOCKSZ: bad = num("--kv-block-size", optarg, 1, 1024, &d); c.engine.kv_block_size = (int)d; break;
        case O_RESERVE: bad = num("--kv-high-reserve", optarg, 0, 0.9, &d); c.engine.kv_high_reserve = (float)d; break;
        case O_GPUMEM: bad = num("--gpu-memory-utilization", optarg, 0.05, 1, &d); c.engine.gpu_memory_utilization = (float)d; break;
        case O_QLIMIT:
            bad = num("--queue-limit", optarg, 1, 1 << 20, &d);
            for (int u = 0; u < SF_URGENCY_COUNT; u++) c.engine.queue_limit[u] = (int)d;
            break;
        case O_BODY: bad = num("--max-body", optarg, 1024, 1 << 30, &d); c.max_body_bytes = (int)d; break;
        case O_TIMEOUT: bad = num("--timeout", optarg, 1, 3600, &d); c.timeout_s = (int)d; break;
        case O_DRAIN: bad = num("--drain-timeout", optarg, 0, 3600, &d); c.drain_timeout_s = d; break;
        case O_HELP: usage(stdout); return 0;
        default:
            fprintf(stderr, "semflow serve: unknown or incomplete option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "semflow serve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!c.engine.model) {
        fprintf(stderr, "semflow serve: --model is required (a Hugging Face folder, a .gguf file, or 'demo')\n");
        return 2;
    }
    sf_error err = { 0 };
    sf_gateway *gw = NULL;
    if (sf_gateway_new(&c, &gw, &err)) {
        fprintf(stderr, "semflow serve: %s\n", err.msg);
        return 1;
    }
    int rc = sf_gateway_run(gw, &err);
    sf_gateway_free(gw);
    if (rc) {
        fprintf(stderr, "semflow serve: %s\n", err.msg);
        return 1;
    }
    return 0;
}
