/* swap.c — host swap space for preempted sequences' K/V (see swap.h). */
#include "swap.h"

#include <string.h>

/* The swap space copies whole KV blocks by id (sf_dma_copy_units), never raw bytes. */
static int no_byte_copy(void *arg, void *dst, const void *src, size_t n, int dir, sf_error *err)
{
    return sf_err(err, SF_EUNSUPPORTED, "swap: KV blocks are copied by block id, not as %zu raw bytes", n);
}

int sf_swap_init(sf_swap *w, sf_backend *be, size_t block_bytes, double gib, sf_error *err)
{
    return sf_swap_init_opts(w, be, block_bytes, gib, NULL, err);
}

int sf_swap_init_slots(sf_swap *w, sf_backend *be, size_t block_bytes, int n_slots, sf_error *err)
{
    memset(w, 0, sizeof *w);
    if (n_slots < 1 || block_bytes == 0) return SF_OK;
    w->n_slots = n_slots;
    w->be = be;
    w->block_bytes = block_bytes;
    w->bytes = (size_t)w->n_slots * block_bytes;
    void *mem = NULL;
    w->pinned = be->ops->host_alloc != NULL;
    int rc = sf_backend_host_alloc(be, w->bytes, &mem, err);
    if (rc != SF_OK && w->pinned) { /* swap still works from plain memory, only slower */
        SF_LOGW("swap space: %s; using pageable memory instead (swap copies will be slower)",
                err ? err->msg : "pinning failed");
        w->pinned = 0;
        rc = sf_backend_host_alloc(NULL, w->bytes, &mem, err);
    }
    if (rc != SF_OK) {
        memset(w, 0, sizeof *w);
        return sf_err_wrap(err, "swap space (lower --swap-space; 0 turns it off)");
    }
    w->mem = mem;
    return SF_OK;
}

int sf_swap_init_opts(sf_swap *w, sf_backend *be, size_t block_bytes, double gib, const sf_swap_opts *so,
                      sf_error *err)
{
    memset(w, 0, sizeof *w);
    if (!(gib >= 0)) return sf_err(err, SF_EINVAL, "swap space %g GiB: it must be 0 (off) or more", gib);
    if (gib == 0 || !be->ops->kv_copy_out || !be->ops->kv_copy_in || block_bytes == 0) return SF_OK;
    double n = gib * (double)(1u << 30) / (double)block_bytes;
    if (n < 1) return SF_OK;
    int rc = sf_swap_init_slots(w, be, block_bytes, n > (double)(1 << 24) ? 1 << 24 : (int)n, err);
    if (rc != SF_OK) return rc;
    sf_dma_opts o = { .copy = no_byte_copy, .hw = be->ops->hw(be), .defer = 1 };
    if (so) {
        o.untuned = so->untuned;
        o.contention = so->contention;
        o.contention_arg = so->contention_arg;
        w->peers = so->peers;
        w->peers_arg = so->peers_arg;
    }
    rc = sf_dma_new(&o, &w->dma, err);
    if (rc != SF_OK) sf_swap_free(w);
    return rc;
}

void sf_swap_free(sf_swap *w)
{
    if (!w) return;
    if (w->mem) sf_backend_host_free(w->pinned ? w->be : NULL, w->mem);
    sf_dma_free(w->dma);
    memset(w, 0, sizeof *w);
}

int sf_swap_in_ok(sf_swap *w, int urgency, int higher_busy)
{
    if (!w->dma || urgency != SF_URGENCY_LOW || !sf_dma_tuned(w->dma)) return 1;
    int ok = sf_dma_may_start(w->dma, urgency, SF_DMA_H2D);
    if (ok && higher_busy && sf_dma_contended(w->dma)) {
        double now = sf_now_s();
        if (!w->held_since) w->held_since = now;
        ok = now - w->held_since >= SF_SWAP_MAX_HOLD_S;
        if (!ok) sf_dma_count_deferred(w->dma);
    }
    if (ok) w->held_since = 0;
    return ok;
}

typedef struct run_arg {
    sf_swap *w;
    const sf_swap_op *op;
    int dir;
} run_arg;

int sf_swap_copy_blocks(sf_backend *be, unsigned char *mem, size_t block_bytes, const int32_t *blocks,
                        const int32_t *slots, int n, int d2h, int *batched_off, sf_error *err)
{
    if (be->ops->kv_copy_blocks && !*batched_off) { /* one call for the piece, blocks wherever their slots are */
        int rc = be->ops->kv_copy_blocks(be, blocks, slots, n, mem, block_bytes, d2h);
        if (rc == SF_OK) return SF_OK;
        if (rc == SF_EINVAL) /* the arguments, not the batched copy: per-block copies would fail alike */
            return sf_err(err, rc, "swap: the %s backend refused to copy %d KV blocks %s (from block %d): a block id "
                          "out of range or a bad slot (its log line says which)", be->ops->name, n, d2h ? "out" : "in",
                          blocks[0]);
        /* nothing is lost by trying the per-block copies: the same bytes go to the same places */
        SF_LOGW("swap: the %s backend's batched KV copy failed (%s of %d blocks); using per-block copies from now on",
                be->ops->name, d2h ? "out" : "in", n);
        *batched_off = 1;
    }
    for (int i = 0; i < n;) {
        int k = 1;
        while (i + k < n && slots[i + k] == slots[i] + k) k++;
        unsigned char *host = mem + (size_t)slots[i] * block_bytes;
        int rc = d2h ? be->ops->kv_copy_out(be, blocks + i, k, host) : be->ops->kv_copy_in(be, blocks + i, k, host);
        if (rc != SF_OK)
            return sf_err(err, rc, "swap: %s of %d KV blocks from block %d failed on the %s backend",
                          d2h ? "copy out" : "copy in", k, blocks[i], be->ops->name);
        i += k;
    }
    return SF_OK;
}

/* Copy op blocks [first, first + count): the other ranks' shares first (they queue their copies
 * behind the steps already sent to them), then this rank's. */
static int copy_units(void *arg, int first, int count, sf_error *err)
{
    run_arg *a = arg;
    const sf_swap_op *op = a->op;
    const int d2h = a->dir == SF_DMA_D2H;
    if (a->w->peers) {
        int rc = a->w->peers(a->w->peers_arg, op->blocks + first, op->slots + first, count, d2h, err);
        if (rc != SF_OK) return rc;
    }
    return sf_swap_copy_blocks(a->w->be, a->w->mem, a->w->block_bytes, op->blocks + first, op->slots + first, count,
                               d2h, &a->w->batched_off, err);
}

int sf_swap_run(sf_swap *w, const sf_swap_op *op, int dir, sf_error *err)
{
    if (!w->n_slots) return sf_err(err, SF_EINVAL, "swap: no swap space");
    for (int i = 0; i < op->n; i++)
        if (op->slots[i] < 0 || op->slots[i] >= w->n_slots)
            return sf_err(err, SF_EINVAL, "swap: slot %d out of range [0, %d)", op->slots[i], w->n_slots);
    run_arg a = { w, op, dir };
    return sf_dma_copy_units(w->dma, op->n, w->block_bytes, dir, op->urgency, copy_units, &a, err);
}
