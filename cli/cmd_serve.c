/* cmd_serve.c — `semflow serve`: the OpenAI-compatible HTTP server. */
#include <arpa/inet.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <jansson.h>

#include "bpf/monitor.h"
#include "cli/cli.h"
#include "gateway/dashboard.h"
#include "gateway/gateway.h"
#include "gateway/intent.h"
#include "gateway/tenants.h"
#include "hal/hal.h"

/* What serve adds around the gateway: the eBPF monitor (metrics, dashboard) and connection
 * steering. Every part is optional; without BPF the server runs and says why once. */
typedef struct serve_ctx {
    sf_gateway *gw;
    sf_monitor *mon;
    char mon_off[300];
    sf_dashboard *dash[64];
    sf_steer *steer;
    int gpu_of[SF_MON_MAX_GPUS]; /* CUDA ordinal -> the monitor's GPU number (NVML / PCI order) */
} serve_ctx;

static void extra_metrics(void *user, FILE *out)
{
    serve_ctx *x = user;
    char *text = sf_monitor_metrics(x->mon);
    if (text) fputs(text, out);
    free(text);
    sf_engine *e = x->gw ? sf_gateway_engine(x->gw) : NULL;
    if (!e) return;
    sf_engine_stats st;
    sf_engine_get_stats(e, &st);
    static const char *lane[SF_URGENCY_COUNT] = { "low", "normal", "high" };
    fputs("# HELP semflow_dma_swap_bytes_total KV swap bytes copied through the DMA scheduler (both directions)\n"
          "# TYPE semflow_dma_swap_bytes_total counter\n", out);
    for (int u = 0; u < SF_URGENCY_COUNT; u++)
        fprintf(out, "semflow_dma_swap_bytes_total{urgency=\"%s\"} %llu\n", lane[u], (unsigned long long)st.dma_bytes[u]);
    fprintf(out, "# HELP semflow_dma_deferred_total low-urgency swap-ins held back while the PCIe link was contended\n"
                 "# TYPE semflow_dma_deferred_total counter\nsemflow_dma_deferred_total %llu\n"
                 "# HELP semflow_dma_contention_index the contention index the DMA tuner last saw\n"
                 "# TYPE semflow_dma_contention_index gauge\nsemflow_dma_contention_index %.4f\n",
            (unsigned long long)st.dma_deferred, st.pcie_contention);
}

/* The dashboard's "server" object: engine queues, seats and KV, once the model is loaded. */
static char *dashboard_stats(void *user)
{
    serve_ctx *x = user;
    sf_engine *e = x->gw ? sf_gateway_engine(x->gw) : NULL;
    if (!e) return strdup("{\"ready\":false}");
    sf_engine_stats st;
    sf_engine_get_stats(e, &st);
    json_t *o = json_pack("{s:b, s:i, s:{s:i, s:i, s:i}, s:i, s:i, s:f, s:I, s:I, s:I, s:I, s:f}", "ready", 1,
                          "running", st.running, "waiting", "high", st.waiting[SF_URGENCY_HIGH], "normal",
                          st.waiting[SF_URGENCY_NORMAL], "low", st.waiting[SF_URGENCY_LOW], "kv_blocks_used",
                          st.kv_blocks_used, "kv_blocks_total", st.kv_blocks_total, "tokens_per_s", st.tokens_per_s,
                          "preemptions", (json_int_t)st.preemptions, "swaps_out", (json_int_t)st.swaps_out,
                          "swaps_in", (json_int_t)st.swaps_in, "dma_deferred", (json_int_t)st.dma_deferred,
                          "pcie_contention", st.pcie_contention);
    json_t *dec = json_object(); /* the scheduler policy's decisions, as in /metrics */
    for (int i = 0; dec && i < (int)SF_ARRAY_LEN(st.decisions); i++)
        json_object_set_new(dec, sf_decision_name(i), json_integer((json_int_t)st.decisions[i]));
    if (o) json_object_set_new(o, "swaps_dropped", json_integer((json_int_t)st.swaps_dropped));
    if (o && dec) {
        json_object_set_new(o, "decisions", dec);
        json_object_set_new(o, "degraded", json_boolean(st.degraded));
    } else {
        json_decref(dec);
    }
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return text;
}

/* The engine's DMA tuner reads the contention index of the GPU it copies to (engine thread). */
static double link_contention(void *user, int device)
{
    serve_ctx *x = user;
    if (device < 0 || device >= SF_MON_MAX_GPUS) return 0;
    return sf_monitor_contention(x->mon, x->gpu_of[device]);
}

/* CUDA numbers the devices it sees in CUDA_VISIBLE_DEVICES order, the monitor (NVML,
 * /dev/nvidiaN) in PCI bus order over all of them. serve asks CUDA for PCI bus order too
 * (CUDA_DEVICE_ORDER, unless set), so ordinal i is the i-th listed index, or i itself when
 * nothing is listed. UUID lists cannot be mapped without NVML's help: identity, with a warning. */
static void map_gpus(serve_ctx *x)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    for (int i = 0; i < SF_MON_MAX_GPUS; i++) x->gpu_of[i] = i;
    if (!v || !*v) return;
    char *end;
    const char *p = v;
    for (int i = 0; i < SF_MON_MAX_GPUS && *p; i++) {
        long g = strtol(p, &end, 10);
        if (end == p || g < 0 || g >= SF_MON_MAX_GPUS || (*end && *end != ',')) {
            SF_LOGW("CUDA_VISIBLE_DEVICES=%s is not a list of GPU indices: the PCIe contention index assumes CUDA "
                    "device N is GPU N", v);
            for (int k = 0; k < SF_MON_MAX_GPUS; k++) x->gpu_of[k] = k;
            return;
        }
        x->gpu_of[i] = (int)g;
        p = *end ? end + 1 : end;
    }
}

/* The contention index is against the link hal measured: the top of each serving GPU's pinned
 * H2D chunk-size curve (the calibration is cached, so the engine's own probe reads it back). */
static void measure_links(serve_ctx *x, const sf_engine_config *ec, sf_monitor_opts *mo)
{
    if ((ec->backend && !strcmp(ec->backend, "cpu")) || !sf_hal_cuda_available()) return;
    int n = ec->tensor_parallel > 1 ? ec->tensor_parallel : 1;
    for (int r = 0; r < n; r++) {
        int dev = ec->device + r, g = dev < SF_MON_MAX_GPUS ? x->gpu_of[dev] : -1;
        sf_hw_info hw;
        sf_error err = { 0 };
        if (g < 0) continue;
        if (sf_hal_cuda_probe(dev, &hw, 0, &err) != SF_OK) {
            SF_LOGW("PCIe contention index of GPU %d against a nominal link: %s", g, err.msg);
            continue;
        }
        double top = 0;
        for (int i = 0; i < SF_HAL_CHUNKS; i++) top = SF_MAX(top, hw.h2d_pinned_gbs[i]);
        mo->link_gbs_gpu[g] = top;
        mo->n_gpus = SF_MAX(mo->n_gpus, g + 1);
        SF_LOGI("PCIe link of GPU %d (CUDA device %d): %.1f GB/s measured (pinned H2D, largest chunk)", g, dev, top);
    }
}

static int worker_init(void *user, int worker, struct evhttp *http, struct event_base *base, sf_error *err)
{
    serve_ctx *x = user;
    sf_dashboard_opts o = { .monitor = x->mon, .monitor_off = x->mon_off, .stats = dashboard_stats, .stats_arg = x };
    if (worker >= (int)SF_ARRAY_LEN(x->dash)) return SF_OK;
    return sf_dashboard_register(http, base, &o, &x->dash[worker], err);
}

static void worker_fini(void *user, int worker)
{
    serve_ctx *x = user;
    if (worker < (int)SF_ARRAY_LEN(x->dash)) sf_dashboard_free(x->dash[worker]), x->dash[worker] = NULL;
}

static void worker_load(void *user, int worker, int inflight)
{
    serve_ctx *x = user;
    sf_steer_set_load(x->steer, worker, (uint32_t)inflight);
}

/* With two or more workers, worker 0 is kept for tenants whose default intent is high
 * urgency (lane 2), the others take every other tenant with client prefixes (lane 1).
 * Clients outside every prefix are left to the kernel's reuseport hash. */
static void steer_attach(serve_ctx *x)
{
    const sf_tenants *ts = sf_gateway_tenants(x->gw);
    int any = 0;
    for (int i = 0; i < ts->n; i++) any += ts->t[i].n_prefixes > 0;
    if (!any) return;
    const int *fds;
    int n = sf_gateway_listen_fds(x->gw, &fds);
    int lane_of[SF_STEER_MAX_WORKERS];
    if (n > SF_STEER_MAX_WORKERS) n = SF_STEER_MAX_WORKERS;
    for (int i = 0; i < n; i++) lane_of[i] = n >= 2 && i == 0 ? 2 : 1;
    sf_error err = { 0 };
    if (sf_steer_attach(fds, lane_of, n, &x->steer, &err)) {
        SF_LOGW("connection steering off: %s", err.msg);
        return;
    }
    for (int i = 0; i < ts->n; i++) {
        const sf_tenant *t = &ts->t[i];
        for (int k = 0; k < t->n_prefixes; k++) {
            char cidr[INET6_ADDRSTRLEN + 8];
            inet_ntop(t->prefixes[k].family, t->prefixes[k].addr, cidr, sizeof cidr);
            snprintf(cidr + strlen(cidr), sizeof cidr - strlen(cidr), "/%d", t->prefixes[k].bits);
            int lane = n >= 2 && t->default_intent.urgency == SF_URGENCY_HIGH ? 2 : 1;
            if (sf_steer_set_prefix(x->steer, cidr, lane, &err)) SF_LOGW("steering %s (tenant %s): %s", cidr, t->name, err.msg);
        }
    }
    SF_LOGI("connection steering on: %d workers, client prefixes of %d tenants", n, any);
}

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
            "  --device N                CUDA device (default 0; tensor-parallel rank r uses N + r)\n"
            "  --tensor-parallel-size N  split the model over N rank processes / GPUs (default 1)\n"
            "  --load-format dummy       random weights from config.json\n"
            "  --max-num-seqs N          running sequences at most (default 64)\n"
            "  --max-batched-tokens N    token budget per engine step (default 2048)\n"
            "  --max-logit-rows N        logit rows per step: next-token rows and prompt positions scored\n"
            "                            for echo / prompt_logprobs (default: --max-num-seqs)\n"
            "  --max-model-len N         context cap (default: the model's)\n"
            "  --num-kv-blocks N         KV blocks (default: sized from memory)\n"
            "  --kv-block-size N         tokens per KV block (default 16)\n"
            "  --kv-high-reserve F       share of KV blocks only high urgency may take (default 0.1)\n"
            "  --gpu-memory-utilization F (default 0.9)\n"
            "  --swap-space GiB          host memory for preemption by swap (default 1; 0: recompute only;\n"
            "                            under tensor parallelism, per rank)\n"
            "  --speculative-config J    n-gram speculative decoding (vLLM's JSON): {\"method\": \"ngram\",\n"
            "                            \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2,\n"
            "                            \"disable_by_batch_size\": 8}; off by default (docs/ENGINE.md)\n"
            "  --enable-prefix-caching / --no-enable-prefix-caching\n"
            "                            reuse the K/V of identical leading prompt blocks, per tenant (default on)\n"
            "  --step-shaping on|off     plan each step for the tightest max-latency / min-throughput present (default on)\n"
            "  --kv-degrade-threshold F  KV usage above which low urgency is degraded, not refused (default 0.92; 0: off)\n"
            "  --kv-degrade-restore F    KV usage below which it is restored (default 0.80)\n"
            "  --kv-degrade-hold S       seconds past either threshold before switching (default 5)\n"
            "  --relax-latency MS        max-latency low-urgency requests get while degraded (default 2000)\n"
            "  --sched-trace FILE        one TSV line per engine step (time, tokens, queues, KV) for tuning\n"
            "  --queue-limit N           waiting requests per urgency lane before 429 (default 256)\n"
            "  --max-body BYTES          largest request body (default 4194304)\n"
            "  --timeout S               per-connection read/write timeout (default 30)\n"
            "  --drain-timeout S         on SIGTERM, how long in-flight requests may finish (default 30;\n"
            "                            a second SIGTERM or SIGINT cancels them at once)\n"
            "  --bpf auto|off            eBPF monitor (/metrics, /dashboard) and connection steering (default auto)\n"
            "  --dma-tuner on|off        per-class chunks for KV swap copies, low-class swap-ins held back while\n"
            "                            other processes contend for the PCIe link (default on; see docs/OBSERVABILITY.md)\n");
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
           O_DRAIN, O_BPF, O_TP, O_SWAP, O_TUNER, O_TRACE, O_SHAPE, O_DEG_HI, O_DEG_LO, O_DEG_HOLD, O_RELAX, O_LOGITS, O_PREFIX, O_NO_PREFIX, O_SPEC, O_HELP };
    static const struct option opts[] = {
        { "model", 1, 0, O_MODEL }, { "host", 1, 0, O_HOST }, { "port", 1, 0, O_PORT },
        { "workers", 1, 0, O_WORKERS }, { "tenants", 1, 0, O_TENANTS }, { "served-model-name", 1, 0, O_NAME },
        { "backend", 1, 0, O_BACKEND }, { "threads", 1, 0, O_THREADS }, { "device", 1, 0, O_DEVICE },
        { "load-format", 1, 0, O_LOADFMT }, { "max-num-seqs", 1, 0, O_SEQS },
        { "max-batched-tokens", 1, 0, O_BATCHED }, { "max-model-len", 1, 0, O_MAXLEN },
        { "max-logit-rows", 1, 0, O_LOGITS },
        { "enable-prefix-caching", 0, 0, O_PREFIX }, { "no-enable-prefix-caching", 0, 0, O_NO_PREFIX },
        { "speculative-config", 1, 0, O_SPEC },
        { "num-kv-blocks", 1, 0, O_BLOCKS }, { "kv-block-size", 1, 0, O_BLOCKSZ },
        { "kv-high-reserve", 1, 0, O_RESERVE }, { "gpu-memory-utilization", 1, 0, O_GPUMEM },
        { "queue-limit", 1, 0, O_QLIMIT }, { "max-body", 1, 0, O_BODY }, { "timeout", 1, 0, O_TIMEOUT },
        { "drain-timeout", 1, 0, O_DRAIN }, { "bpf", 1, 0, O_BPF },
        { "tensor-parallel-size", 1, 0, O_TP }, { "swap-space", 1, 0, O_SWAP }, { "dma-tuner", 1, 0, O_TUNER },
        { "sched-trace", 1, 0, O_TRACE }, { "step-shaping", 1, 0, O_SHAPE },
        { "kv-degrade-threshold", 1, 0, O_DEG_HI }, { "kv-degrade-restore", 1, 0, O_DEG_LO },
        { "kv-degrade-hold", 1, 0, O_DEG_HOLD }, { "relax-latency", 1, 0, O_RELAX }, { "help", 0, 0, O_HELP },
        { 0, 0, 0, 0 },
    };
    sf_gateway_config c;
    sf_gateway_config_default(&c);
    double d;
    int o, bpf = 1;
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
        case O_TP: bad = num("--tensor-parallel-size", optarg, 1, 64, &d); c.engine.tensor_parallel = (int)d; break;
        case O_SEQS: bad = num("--max-num-seqs", optarg, 1, 65536, &d); c.engine.max_num_seqs = (int)d; break;
        case O_LOGITS: bad = num("--max-logit-rows", optarg, 1, 65536, &d); c.engine.max_logits = (int)d; break;
        case O_PREFIX: c.engine.prefix_caching = 1; break;
        case O_NO_PREFIX: c.engine.prefix_caching = 0; break;
        case O_SPEC: bad = sf_cli_spec_config("serve", optarg, &c.engine); break;
        case O_BATCHED: bad = num("--max-batched-tokens", optarg, 1, 1 << 24, &d); c.engine.max_batched_tokens = (int)d; break;
        case O_MAXLEN: bad = num("--max-model-len", optarg, 1, 1 << 24, &d); c.engine.max_model_len = (int)d; break;
        case O_BLOCKS: bad = num("--num-kv-blocks", optarg, 1, 1 << 26, &d); c.engine.num_kv_blocks = (int)d; break;
        case O_BLOCKSZ: bad = num("--kv-block-size", optarg, 1, 1024, &d); c.engine.kv_block_size = (int)d; break;
        case O_RESERVE: bad = num("--kv-high-reserve", optarg, 0, 0.9, &d); c.engine.kv_high_reserve = (float)d; break;
        case O_SWAP: bad = num("--swap-space", optarg, 0, 1 << 20, &d); c.engine.swap_space_gib = d; break;
        case O_TRACE: c.engine.sched_trace = optarg; break;
        case O_SHAPE:
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                fprintf(stderr, "semflow serve: --step-shaping must be 'on' or 'off'\n");
                return 2;
            }
            c.engine.step_shaping = !strcmp(optarg, "on");
            break;
        case O_DEG_HI: bad = num("--kv-degrade-threshold", optarg, 0, 1, &d); c.engine.kv_degrade_high = (float)d; break;
        case O_DEG_LO: bad = num("--kv-degrade-restore", optarg, 0, 1, &d); c.engine.kv_degrade_low = (float)d; break;
        case O_DEG_HOLD: bad = num("--kv-degrade-hold", optarg, 0, 3600, &d); c.engine.kv_degrade_hold_s = d; break;
        case O_RELAX: bad = num("--relax-latency", optarg, 0, 3600000, &d); c.engine.relax_latency_ms = (int)d; break;
        case O_GPUMEM: bad = num("--gpu-memory-utilization", optarg, 0.05, 1, &d); c.engine.gpu_memory_utilization = (float)d; break;
        case O_QLIMIT:
            bad = num("--queue-limit", optarg, 1, 1 << 20, &d);
            for (int u = 0; u < SF_URGENCY_COUNT; u++) c.engine.queue_limit[u] = (int)d;
            break;
        case O_BODY: bad = num("--max-body", optarg, 1024, 1 << 30, &d); c.max_body_bytes = (int)d; break;
        case O_TIMEOUT: bad = num("--timeout", optarg, 1, 3600, &d); c.timeout_s = (int)d; break;
        case O_DRAIN: bad = num("--drain-timeout", optarg, 0, 3600, &d); c.drain_timeout_s = d; break;
        case O_BPF:
            if (strcmp(optarg, "auto") && strcmp(optarg, "off")) {
                fprintf(stderr, "semflow serve: --bpf must be 'auto' or 'off'\n");
                return 2;
            }
            bpf = !strcmp(optarg, "auto");
            break;
        case O_TUNER:
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                fprintf(stderr, "semflow serve: --dma-tuner must be 'on' or 'off'\n");
                return 2;
            }
            c.engine.dma_tuner = !strcmp(optarg, "on");
            break;
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
    serve_ctx x;
    memset(&x, 0, sizeof x);
    /* before the monitor, libbpf or libcuda start a thread: one that left SIGTERM unblocked
     * would take it whenever the gateway's thread is not inside sigtimedwait, and die of it */
    sf_block_stop_signals(NULL);
    /* a connection is a descriptor: the soft limit up to the hard one (often 1024 of 524288),
     * as nginx's worker_rlimit_nofile and vLLM do */
    struct rlimit nofile;
    if (!getrlimit(RLIMIT_NOFILE, &nofile) && nofile.rlim_cur < nofile.rlim_max) {
        rlim_t was = nofile.rlim_cur;
        nofile.rlim_cur = nofile.rlim_max;
        if (!setrlimit(RLIMIT_NOFILE, &nofile))
            SF_LOGD("open-files limit raised from %llu to %llu", (unsigned long long)was,
                    (unsigned long long)nofile.rlim_max);
    }
    if (bpf) {
        sf_monitor_opts mo;
        sf_monitor_opts_default(&mo);
        setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0); /* before CUDA starts: see map_gpus */
        map_gpus(&x);
        measure_links(&x, &c.engine, &mo);
        if (sf_monitor_open(&mo, &x.mon, &err)) {
            snprintf(x.mon_off, sizeof x.mon_off, "%s", err.msg);
            SF_LOGI("eBPF monitor off: %s", err.msg);
            x.mon = NULL;
        }
    } else {
        snprintf(x.mon_off, sizeof x.mon_off, "disabled with --bpf off");
    }
    if (x.mon) {
        c.engine.pcie_contention = link_contention;
        c.engine.pcie_contention_arg = &x;
    }
    c.extra_metrics = extra_metrics;
    c.extra_metrics_user = &x;
    c.worker_init = worker_init;
    c.worker_fini = worker_fini;
    c.worker_init_user = &x;
    c.on_worker_load = worker_load;
    c.on_worker_load_user = &x;
    if (sf_gateway_new(&c, &x.gw, &err)) {
        fprintf(stderr, "semflow serve: %s\n", err.msg);
        sf_monitor_close(x.mon);
        return 1;
    }
    if (bpf) steer_attach(&x);
    int rc = sf_gateway_run(x.gw, &err);
    sf_gateway_free(x.gw); /* workers stopped: nothing calls into steer or the monitor any more */
    sf_steer_free(x.steer);
    sf_monitor_close(x.mon);
    if (rc) {
        fprintf(stderr, "semflow serve: %s\n", err.msg);
        return 1;
    }
    return 0;
}
