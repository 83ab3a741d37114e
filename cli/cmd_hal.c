/* cmd_hal.c — `semflow hal [--json] [--recalibrate]`: what the hardware layer knows about
 * this machine: the CPU always, the GPU too when one is usable. */
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "hal/hal.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: semflow hal [--json] [--recalibrate]\n"
               "  Prints the CPU (cores, caches, RAM, measured memory bandwidth and GEMM rate) and,\n"
               "  when one is usable, the GPU (SMs, L2, HBM, PCIe bandwidth by chunk size).\n"
               "  Measurements are cached in $XDG_CACHE_HOME/semflow (or ~/.cache/semflow).\n"
               "  --json         machine-readable output: {\"cpu\": {...}, \"cuda\": {...} or null}\n"
               "  --recalibrate  measure again instead of reading the cache\n");
}

int sf_cmd_hal(int argc, char **argv)
{
    int as_json = 0, force = 0;
    static const struct option opts[] = {
        { "json", no_argument, NULL, 'j' }, { "recalibrate", no_argument, NULL, 'r' }, { "help", no_argument, NULL, 'h' }, { 0 }
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': as_json = 1; break;
        case 'r': force = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "semflow hal: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    sf_hw_info cpu, gpu;
    sf_error err = { 0 };
    if (sf_hal_cpu_probe(&cpu, force, &err) != SF_OK) {
        fprintf(stderr, "semflow hal: %s\n", err.msg);
        return 1;
    }
    int have_gpu = 0;
    if (sf_hal_cuda_available()) {
        if (sf_hal_cuda_probe(0, &gpu, force, &err) == SF_OK) have_gpu = 1;
        else fprintf(stderr, "semflow hal: GPU probe failed: %s\n", err.msg);
    }
    if (as_json) {
        json_t *o = json_object();
        char *s = sf_hw_info_json(&cpu);
        json_object_set_new(o, "cpu", json_loads(s, 0, NULL));
        free(s);
        if (have_gpu) {
            s = sf_hw_info_json(&gpu);
            json_object_set_new(o, "cuda", json_loads(s, 0, NULL));
            free(s);
        } else {
            json_object_set_new(o, "cuda", json_null());
        }
        json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(o);
    } else {
        sf_hw_info_print(stdout, &cpu);
        if (have_gpu) {
            fputc('\n', stdout);
            sf_hw_info_print(stdout, &gpu);
        } else {
            printf("\nGPU          none usable (CPU backend only)\n");
        }
    }
    return 0;
}
