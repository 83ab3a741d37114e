/* comm_custom.c — the host side of the peer-memory all-reduce kernels (comm_custom.h):
 * one region of device memory per rank, shared through CUDA IPC, and the kernel's launch. */
#include "comm_custom.h"

#include "comm.h"

#include <stdlib.h>
#include <string.h>

#if defined(SF_HAVE_CUDA)
#include <cuda_runtime.h>
#include <unistd.h>

#include "../kernels/cuda/allreduce.h"

_Static_assert(SF_AR_NORM_MAX_COLS == SF_ARN_MAX_COLS, "comm_custom.h repeats the fused kernel's limits");

struct sf_ar_custom {
    int rank, size, device;
    size_t buf_bytes, ll_bytes;
    char *own;                     /* cudaMalloc'd region */
    char *region[SF_AR_MAX_RANKS]; /* as mapped here; region[rank] = own */
    int opened[SF_AR_MAX_RANKS];   /* IPC mappings to close */
    unsigned *err_h, *err_d;       /* mapped host word the kernel reports a timeout in */
    uint64_t timeout_ns;
    int ll_pdl;                    /* LL launched with PDL (unless $SEMFLOW_TP_LL_PDL=0) */
    char gpus[SF_AR_MAX_RANKS * 20];
};

/* What each rank tells the others. */
typedef struct ar_rec {
    int ok;                        /* 0: this rank could not make its region (why is in its log) */
    char host[64];
    char bus[20];
    cudaIpcMemHandle_t handle;
} ar_rec;

static void release(sf_ar_custom *a)
{
    for (int i = 0; i < SF_AR_MAX_RANKS; i++)
        if (a->opened[i]) {
            cudaIpcCloseMemHandle(a->region[i]);
            a->opened[i] = 0;
        }
    if (a->own) cudaFree(a->own);
    if (a->err_h) cudaFreeHost(a->err_h);
    a->own = NULL;
    a->err_h = NULL;
}

void sf_ar_custom_free(sf_ar_custom *a)
{
    if (!a) return;
    cudaSetDevice(a->device);
    release(a);
    free(a);
}

/* This rank's record: a zeroed region (signals and buffers) and its IPC handle. */
static int make_region(sf_ar_custom *a, ar_rec *me)
{
    size_t bytes = sf_k_ar_region_bytes(a->buf_bytes, a->ll_bytes, a->size);
    cudaError_t e = cudaMalloc((void **)&a->own, bytes);
    if (e == cudaSuccess) e = cudaMemset(a->own, 0, bytes);
    if (e == cudaSuccess) e = cudaHostAlloc((void **)&a->err_h, sizeof(unsigned), cudaHostAllocMapped);
    if (e == cudaSuccess) {
        *a->err_h = 0;
        e = cudaHostGetDevicePointer((void **)&a->err_d, a->err_h, 0);
    }
    if (e == cudaSuccess) e = cudaIpcGetMemHandle(&me->handle, a->own);
    if (e == cudaSuccess) e = cudaDeviceGetPCIBusId(me->bus, sizeof me->bus, a->device);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        cudaGetLastError();
        SF_LOGW("rank %d: peer-memory all-reduce: cannot set up this GPU's region (%s); NCCL only", a->rank,
                cudaGetErrorString(e));
        return 0;
    }
    gethostname(me->host, sizeof me->host - 1);
    return 1;
}

int sf_ar_custom_open(int rank, int size, int device, size_t buf_bytes, int timeout_ms, sf_ar_exchange_fn exchange,
                      void *ctx, sf_ar_custom **out, sf_error *err)
{
    *out = NULL;
    if (size < 2 || size > SF_AR_MAX_RANKS)
        return sf_err(err, SF_EUNSUPPORTED, "peer-memory all-reduce: %d ranks (it takes 2..%d)", size, SF_AR_MAX_RANKS);
    sf_ar_custom *a = calloc(1, sizeof *a);
    ar_rec *all = calloc((size_t)size, sizeof *all), me;
    int rc = SF_OK, oks[SF_AR_MAX_RANKS], ok;
    char why[300] = "";
    if (!a || !all) {
        free(a);
        free(all);
        return sf_err(err, SF_ENOMEM, "peer-memory all-reduce: out of memory");
    }
    a->rank = rank;
    a->size = size;
    a->device = device;
    a->buf_bytes = (buf_bytes + 15) & ~(size_t)15;
    a->ll_bytes = SF_MIN(a->buf_bytes, SF_AR_LL_BYTES);
    a->timeout_ns = (uint64_t)(timeout_ms > 0 ? timeout_ms : 60000) * 1000000ull;
    a->ll_pdl = sf_env_bool("SEMFLOW_TP_LL_PDL", 1);
    memset(&me, 0, sizeof me);
    me.ok = make_region(a, &me);
    if ((rc = exchange(ctx, &me, sizeof me, all, err))) goto cleanup;

    /* every rank evaluates the same records in the same way */
    ok = 1;
    for (int i = 0; i < size && ok; i++) {
        if (!all[i].ok) snprintf(why, sizeof why, "rank %d could not make its region", i), ok = 0;
        else if (strncmp(all[i].host, all[0].host, sizeof all[i].host))
            snprintf(why, sizeof why, "ranks 0 and %d are on different hosts", i), ok = 0;
    }
    /* open the peers' regions (IPC enables peer access as it maps) */
    for (int i = 0; i < size && ok; i++) {
        int dev = -1, can = 0;
        if (i == rank) {
            a->region[i] = a->own;
            continue;
        }
        cudaError_t e = cudaDeviceGetByPCIBusId(&dev, all[i].bus);
        if (e == cudaSuccess) e = cudaDeviceCanAccessPeer(&can, device, dev);
        if (e == cudaSuccess && !can) {
            snprintf(why, sizeof why, "GPU %s (rank %d) cannot access GPU %s (rank %d) as peer memory", me.bus, rank,
                     all[i].bus, i);
            ok = 0;
            break;
        }
        if (e == cudaSuccess)
            e = cudaIpcOpenMemHandle((void **)&a->region[i], all[i].handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            cudaGetLastError();
            snprintf(why, sizeof why, "rank %d: mapping rank %d's region (GPU %s): %s", rank, i, all[i].bus,
                     cudaGetErrorString(e));
            ok = 0;
            break;
        }
        a->opened[i] = 1;
    }
    /* keep the path only if every rank mapped every region */
    if ((rc = exchange(ctx, &ok, sizeof ok, oks, err))) goto cleanup;
    for (int i = 0; i < size; i++)
        if (!oks[i]) {
            if (ok) snprintf(why, sizeof why, "rank %d could not map its peers' memory (see its log)", i);
            ok = 0;
        }
    if (!ok) {
        rc = sf_err(err, SF_EUNSUPPORTED, "peer-memory all-reduce off: %s; NCCL takes every message", why);
        goto cleanup;
    }
    for (int i = 0; i < size; i++)
        snprintf(a->gpus + strlen(a->gpus), sizeof a->gpus - strlen(a->gpus), "%s%s", i ? "-" : "", all[i].bus);
    free(all);
    *out = a;
    return SF_OK;
cleanup:
    free(all);
    sf_ar_custom_free(a);
    return rc;
}

size_t sf_ar_custom_cap(const sf_ar_custom *a) { return a ? a->buf_bytes : 0; }
size_t sf_ar_custom_ll_cap(const sf_ar_custom *a) { return a ? a->ll_bytes : 0; }
const char *sf_ar_custom_gpus(const sf_ar_custom *a) { return a ? a->gpus : ""; }

int sf_ar_custom_run(sf_ar_custom *a, void *data, int64_t n, sf_ar_kernel kernel, void *stream, sf_error *err)
{
    int ll = kernel == SF_AR_LL;
    size_t cap = ll ? a->ll_bytes : a->buf_bytes;
    if ((size_t)n * 2 > cap || ((uintptr_t)data & 15))
        return sf_err(err, SF_EINVAL, "rank %d: peer-memory all-reduce (%s) of %lld values at %p: more than %zu bytes "
                      "or not 16-byte aligned", a->rank, ll ? "LL" : "one-shot",
                      (long long)n, data, cap);
    sf_k_ar k;
    memset(&k, 0, sizeof k);
    for (int i = 0; i < a->size; i++) k.region[i] = a->region[i];
    k.data = data;
    k.n = n;
    k.buf_bytes = a->buf_bytes;
    k.rank = a->rank;
    k.size = a->size;
    k.timeout_ns = a->timeout_ns;
    k.err = a->err_d;
    k.ll = ll;
    k.ll_off = SF_AR_SIG_BYTES + 2 * a->buf_bytes;
    k.ll_bytes = a->ll_bytes;
    k.pdl = ll && a->ll_pdl;
    int e = sf_k_allreduce(&k, (cudaStream_t)stream);
    if (e)
        return sf_err(err, SF_ERROR, "rank %d: peer-memory all-reduce of %lld values: launch: %s", a->rank, (long long)n,
                      cudaGetErrorString((cudaError_t)e));
    return SF_OK;
}

int sf_ar_custom_run_norm(sf_ar_custom *a, const sf_coll_norm *n, unsigned flags, void *stream, sf_error *err)
{
    if (n->dt != SF_DT_BF16 || n->rows < 1 || n->cols < 8 || n->cols % 8 || n->cols > SF_AR_NORM_MAX_COLS ||
        (size_t)n->rows * n->cols * 2 > a->buf_bytes)
        return sf_err(err, SF_EINVAL, "rank %d: peer-memory all-reduce + rmsnorm of %lld x %lld %s: it takes bf16 "
                      "rows of a multiple of 8 up to %d values, up to %zu bytes", a->rank, (long long)n->rows,
                      (long long)n->cols, sf_dtype_name(n->dt), SF_AR_NORM_MAX_COLS, a->buf_bytes);
    sf_k_arn k;
    memset(&k, 0, sizeof k);
    for (int i = 0; i < a->size; i++) k.region[i] = a->region[i];
    k.x = n->x;
    k.res = n->res;
    k.w = n->w;
    k.out = n->out;
    k.rows = n->rows;
    k.cols = (int)n->cols;
    k.eps = n->eps;
    k.push_off = sf_k_ar_push_off(a->buf_bytes, a->ll_bytes, a->size);
    k.push_bytes = a->buf_bytes;
    k.rank = a->rank;
    k.size = a->size;
    k.timeout_ns = a->timeout_ns;
    k.err = a->err_d;
    k.pdl = !!(flags & SF_AR_NORM_PDL);
    k.early = !!(flags & SF_AR_NORM_EARLY);
    int e = sf_k_allreduce_norm(&k, (cudaStream_t)stream);
    if (e)
        return sf_err(err, SF_ERROR, "rank %d: peer-memory all-reduce + rmsnorm of %lld x %lld: launch: %s (buffers "
                      "16-byte aligned?)", a->rank, (long long)n->rows, (long long)n->cols,
                      cudaGetErrorString((cudaError_t)e));
    return SF_OK;
}

int sf_ar_custom_failed(const sf_ar_custom *a)
{
    return a ? (int)*(volatile unsigned *)a->err_h : 0;
}

#else

int sf_ar_custom_open(int rank, int size, int device, size_t buf_bytes, int timeout_ms, sf_ar_exchange_fn exchange,
                      void *ctx, sf_ar_custom **out, sf_error *err)
{
    *out = NULL;
    return sf_err(err, SF_ENODEV, "peer-memory all-reduce: built without CUDA");
}
void sf_ar_custom_free(sf_ar_custom *a) { (void)a; }
size_t sf_ar_custom_cap(const sf_ar_custom *a) { return 0; }
size_t sf_ar_custom_ll_cap(const sf_ar_custom *a) { return 0; }
const char *sf_ar_custom_gpus(const sf_ar_custom *a) { return ""; }
int sf_ar_custom_run(sf_ar_custom *a, void *data, int64_t n, sf_ar_kernel kernel, void *stream, sf_error *err)
{
    return sf_err(err, SF_ENODEV, "peer-memory all-reduce: built without CUDA");
}
int sf_ar_custom_run_norm(sf_ar_custom *a, const sf_coll_norm *n, unsigned flags, void *stream, sf_error *err)
{
    return sf_err(err, SF_ENODEV, "peer-memory all-reduce: built without CUDA");
}
int sf_ar_custom_failed(const sf_ar_custom *a) { return 0; }

#endif
