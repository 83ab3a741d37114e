/* b1trace.cu — host side of the batch-1 kernel timeline (b1trace.h, b1trace.cuh). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "b1trace.cuh"
#include "b1trace.h"

extern "C" {
#include "../../common/sf.h"
}

/* the traced files' setters (SF_TR_SETTER) */
extern "C" int sf_k_gemv_stream_trace(void *buf);
extern "C" int sf_k_gemv_fused_trace(void *buf);
extern "C" int sf_k_attn_decode_trace(void *buf);
extern "C" int sf_k_attn_decode_mma_trace(void *buf);
extern "C" int sf_k_sample_trace(void *buf);
extern "C" int sf_k_embed_trace(void *buf);
extern "C" int sf_k_gemv_rows_trace(void *buf);

struct sf_k_trace {
    sf_tr_rec *d;
    unsigned cap;
    char path[512];
};

static int set_all(void *buf)
{
    int rc = sf_k_gemv_stream_trace(buf);
    if (!rc) rc = sf_k_gemv_fused_trace(buf);
    if (!rc) rc = sf_k_attn_decode_trace(buf);
    if (!rc) rc = sf_k_attn_decode_mma_trace(buf);
    if (!rc) rc = sf_k_sample_trace(buf);
    if (!rc) rc = sf_k_embed_trace(buf);
    if (!rc) rc = sf_k_gemv_rows_trace(buf);
    return rc;
}

extern "C" int sf_k_trace_open(sf_k_trace **out)
{
    *out = NULL;
    if (!tr_wanted()) return 0;
    const char *path = getenv("SEMFLOW_CUDA_TRACE");
    sf_k_trace *t = (sf_k_trace *)calloc(1, sizeof *t);
    if (!t) return (int)cudaErrorMemoryAllocation;
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev) snprintf(t->path, sizeof t->path, "%s.gpu%d", path, dev); /* one file per device */
    else snprintf(t->path, sizeof t->path, "%s", path);
    t->cap = (unsigned)sf_env_long("SEMFLOW_CUDA_TRACE_RECORDS", 131072, 1024, 1 << 24);
    sf_tr_rec head;
    memset(&head, 0, sizeof head);
    head.grid = t->cap;
    int rc = (int)cudaMalloc((void **)&t->d, ((size_t)t->cap + 1) * sizeof(sf_tr_rec));
    if (!rc) rc = (int)cudaMemcpy(t->d, &head, sizeof head, cudaMemcpyHostToDevice);
    if (!rc) rc = set_all(t->d);
    if (rc) {
        if (t->d) cudaFree(t->d);
        free(t);
        return rc;
    }
    SF_LOGI("cuda: tracing the batch-1 kernels into %s (%u records; timings include the tracing)", t->path, t->cap);
    *out = t;
    return 0;
}

extern "C" int sf_k_trace_close(sf_k_trace *t)
{
    if (!t) return 0;
    sf_tr_rec *h = NULL;
    FILE *f = NULL;
    int rc = (int)cudaDeviceSynchronize();
    if (!rc) rc = set_all(NULL);
    if (rc) goto cleanup;
    h = (sf_tr_rec *)malloc(((size_t)t->cap + 1) * sizeof *h);
    if (!h) { rc = (int)cudaErrorMemoryAllocation; goto cleanup; }
    if ((rc = (int)cudaMemcpy(h, t->d, ((size_t)t->cap + 1) * sizeof *h, cudaMemcpyDeviceToHost))) goto cleanup;
    if (!(f = fopen(t->path, "w"))) {
        SF_LOGE("cuda: trace file %s: %s (check SEMFLOW_CUDA_TRACE's folder exists and is writable)", t->path,
                strerror(errno));
        rc = -1;
        goto cleanup;
    }
    {
        const unsigned long long n = h[0].t0, first = n > t->cap ? n - t->cap : 0;
        fprintf(f, "# tag m k grid block sm t0 d_wait d_ready d_end (ns); %llu records appended, %llu kept\n", n,
                n - first);
        for (unsigned long long i = first; i < n; i++) {
            const sf_tr_rec *r = &h[1 + i % t->cap];
            fprintf(f, "%u %u %u %u %u %u %llu %u %u %u\n", r->id >> 24, r->m, r->k, r->grid, r->id & 0xffff,
                    (r->id >> 16) & 0xff, r->t0, r->d_wait, r->d_ready, r->d_end);
        }
    }
    if (fclose(f)) rc = -1;
    f = NULL;
    if (!rc) SF_LOGI("cuda: trace written to %s", t->path);
cleanup:
    if (f) fclose(f);
    free(h);
    cudaFree(t->d);
    free(t);
    return rc;
}
