/* comm.c — choosing a communicator for a backend, and collectives on backend buffers. */
#include "comm.h"

#include <stdlib.h>
#include <string.h>

int sf_comm_default_timeout_ms(void)
{
    const char *e = getenv("SEMFLOW_TP_TIMEOUT_MS");
    long v = e ? strtol(e, NULL, 10) : 0;
    return v > 0 && v < 86400000 ? (int)v : 60000;
}

int sf_comm_open(const sf_comm_opts *o, sf_comm **out, sf_error *err)
{
    *out = NULL;
    if (o->size < 1 || o->size > SF_COMM_MAX_RANKS || o->rank < 0 || o->rank >= o->size)
        return sf_err(err, SF_EINVAL, "communicator: rank %d of %d (size must be 1..%d, rank in [0, size))", o->rank,
                      o->size, SF_COMM_MAX_RANKS);
    const char *be = o->backend ? o->backend : "cpu";
    if (!strcmp(be, "cpu")) return sf_comm_cpu_open(o, out, err);
    if (!strcmp(be, "cuda")) return sf_comm_nccl_open(o, out, err);
    return sf_err(err, SF_EUNSUPPORTED, "communicator: no tensor-parallel communicator for the '%s' backend "
                  "(cpu and cuda have one)", be);
}

void sf_comm_free(sf_comm *c)
{
    if (c) c->ops->destroy(c);
}

static int raw(sf_comm *c, sf_backend *b, sf_buf *x, void **p, sf_dtype *dt, void **stream, sf_error *err)
{
    if (!b->ops->buf_raw)
        return sf_err(err, SF_EUNSUPPORTED, "rank %d: the %s backend does not expose its buffers to a communicator "
                      "(no tensor parallelism on it)", c->rank, b->ops->name);
    int rc = b->ops->buf_raw(b, x, p, dt, stream);
    if (rc) return sf_err(err, rc, "rank %d: %s backend: buf_raw failed (logged above)", c->rank, b->ops->name);
    return SF_OK;
}

int sf_comm_all_reduce_buf(sf_comm *c, sf_backend *b, sf_buf *x, int rows, int64_t cols, sf_error *err)
{
    if (!c || c->size == 1) return SF_OK;
    void *p, *stream;
    sf_dtype dt;
    int rc = raw(c, b, x, &p, &dt, &stream, err);
    if (rc) return rc;
    return c->ops->all_reduce_sum(c, p, (int64_t)rows * cols, dt, stream, err);
}

int sf_comm_all_gather_buf(sf_comm *c, sf_backend *b, sf_buf *send, sf_buf *recv, int rows, int64_t cols,
                           sf_error *err)
{
    void *ps, *pr, *stream;
    sf_dtype dt, dt2;
    int rc;
    if (!c) return sf_err(err, SF_EINVAL, "all-gather without a communicator");
    if ((rc = raw(c, b, send, &ps, &dt, &stream, err)) || (rc = raw(c, b, recv, &pr, &dt2, &stream, err))) return rc;
    return c->ops->all_gather(c, ps, pr, sf_dtype_bytes(dt, (int64_t)rows * cols), stream, err);
}
