/* comm.c — choosing a communicator for a backend, and collectives on backend buffers. */
#include "comm.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int sf_comm_default_timeout_ms(void)
{
    /* milliseconds, a plain integer: "5s" or "abc" warn and keep 60 s (read by strtol, "5s" had
     * been a 5 ms timeout that failed every collective of a real step) */
    return (int)sf_env_long("SEMFLOW_TP_TIMEOUT_MS", 60000, 1, 86400000);
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

/* The collective as a backend op (hal.h sf_coll_fn): arg is the communicator. Called when the
 * op is queued directly or captured, and again if a step falls back to running its ops. */
static int coll_all_reduce(void *arg, void *data, int64_t n, sf_dtype dt, void *stream)
{
    sf_comm *c = arg;
    int rc = c->ops->all_reduce_sum(c, data, n, dt, stream, &c->coll_err);
    if (rc) SF_LOGE("%s", c->coll_err.msg);
    return rc;
}

int sf_comm_skip_all_reduce(void)
{
    static int skip = -1;
    if (skip < 0) {
        skip = sf_env_bool("SEMFLOW_TP_SKIP_ALLREDUCE_WRONG_RESULTS", 0);
        if (skip) SF_LOGW("SEMFLOW_TP_SKIP_ALLREDUCE_WRONG_RESULTS=1: no all-reduce is run; every result is wrong "
                          "(for timing only)");
    }
    return skip;
}

int sf_comm_all_reduce_buf(sf_comm *c, sf_backend *b, sf_buf *x, int rows, int64_t cols, sf_error *err)
{
    if (!c || c->size == 1 || sf_comm_skip_all_reduce()) return SF_OK;
    if (b->ops->collective && (c->base_in_graph || sf_comm_takes_custom(c, (int64_t)rows * cols, SF_DT_BF16))) {
        c->coll_err.code = SF_OK;
        c->coll_err.msg[0] = 0;
        int rc = b->ops->collective(b, x, (int64_t)rows * cols, coll_all_reduce, c);
        if (!rc) return SF_OK;
        if (c->coll_err.code) return sf_err(err, c->coll_err.code, "%s", c->coll_err.msg);
        return sf_err(err, rc, "rank %d: %s backend: queueing the all-reduce of %d x %lld failed (logged above)",
                      c->rank, b->ops->name, rows, (long long)cols);
    }
    void *p, *stream;
    sf_dtype dt;
    int rc = raw(c, b, x, &p, &dt, &stream, err);
    if (rc) return rc;
    return c->ops->all_reduce_sum(c, p, (int64_t)rows * cols, dt, stream, err);
}

static int coll_all_reduce_norm(void *arg, const sf_coll_norm *a, void *stream)
{
    sf_comm *c = arg;
    int rc = c->ops->all_reduce_norm(c, a, stream, &c->coll_err);
    if (rc) SF_LOGE("%s", c->coll_err.msg);
    return rc;
}

int sf_comm_takes_norm(const sf_comm *c, const sf_backend *b, int rows, int64_t cols)
{
    return c && c->size > 1 && c->ops->all_reduce_norm && b->ops->collective_norm && c->norm_max_bytes &&
           c->path != SF_COMM_PATH_NCCL && rows >= c->norm_min_rows && cols <= c->norm_max_cols && cols % 8 == 0 &&
           sf_dtype_bytes(SF_DT_BF16, (int64_t)rows * cols) <= c->norm_max_bytes;
}

int sf_comm_all_reduce_norm_buf(sf_comm *c, sf_backend *b, sf_buf *x, sf_buf *res, const sf_weight *w, float eps,
                                int rows, int64_t cols, sf_buf *out, sf_error *err)
{
    int rc;
    if (sf_comm_takes_norm(c, b, rows, cols) && !sf_comm_skip_all_reduce()) {
        c->coll_err.code = SF_OK;
        c->coll_err.msg[0] = 0;
        if (!(rc = b->ops->collective_norm(b, x, res, w, eps, rows, out, coll_all_reduce_norm, c))) return SF_OK;
        if (c->coll_err.code) return sf_err(err, c->coll_err.code, "%s", c->coll_err.msg);
        return sf_err(err, rc, "rank %d: %s backend: queueing the all-reduce + rmsnorm of %d x %lld failed (logged "
                      "above)", c->rank, b->ops->name, rows, (long long)cols);
    }
    if ((rc = sf_comm_all_reduce_buf(c, b, x, rows, cols, err))) return rc;
    if ((rc = b->ops->rmsnorm(b, res ? res : x, res ? x : NULL, w, eps, rows, out)))
        return sf_err(err, rc, "rank %d: %s backend: rmsnorm of %d rows after the all-reduce failed (logged above)",
                      c ? c->rank : 0, b->ops->name, rows);
    return SF_OK;
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

int sf_comm_gather_rows_buf(sf_comm *c, sf_backend *b, sf_buf *send, sf_buf *tmp, sf_buf *out, int rows,
                            int64_t cols, int root, sf_error *err)
{
    void *ps, *pt, *po, *stream;
    sf_dtype dt, dt2, dt3;
    int rc;
    if (!c) return sf_err(err, SF_EINVAL, "gathering logit rows without a communicator");
    if (!c->ops->copy_2d)
        return sf_err(err, SF_EUNSUPPORTED, "rank %d: the %s communicator cannot lay gathered rows out (no copy_2d)",
                      c->rank, c->ops->name);
    if (root < 0 || root >= c->size)
        return sf_err(err, SF_EINVAL, "rank %d: gathering logit rows to rank %d of %d", c->rank, root, c->size);
    if ((rc = raw(c, b, send, &ps, &dt, &stream, err)) || (rc = raw(c, b, tmp, &pt, &dt2, &stream, err)) ||
        (rc = raw(c, b, out, &po, &dt3, &stream, err)))
        return rc;
    size_t row = sf_dtype_bytes(dt, cols), slice = row * (size_t)rows;
    /* one row: rank r's slice is already columns [r * cols, (r + 1) * cols) of out's row 0 */
    if ((rc = c->ops->all_gather(c, ps, rows == 1 ? po : pt, slice, stream, err)) || rows == 1 || c->rank != root)
        return rc;
    for (int r = 0; r < c->size; r++)
        if ((rc = c->ops->copy_2d(c, (char *)po + (size_t)r * row, row * (size_t)c->size, (char *)pt + (size_t)r * slice,
                                  row, row, (size_t)rows, stream, err)))
            return rc;
    return SF_OK;
}

int sf_comm_wait(sf_comm *c, sf_backend *b, sf_buf *x, const char *what, sf_error *err)
{
    if (!c || !c->ops->wait) return SF_OK;
    void *p, *stream;
    sf_dtype dt;
    int rc = raw(c, b, x, &p, &dt, &stream, err);
    return rc ? rc : c->ops->wait(c, stream, what, err);
}

int sf_comm_mark(sf_comm *c, sf_backend *b, sf_buf *x, sf_error *err)
{
    if (!c || !c->ops->mark) return SF_OK;
    void *p, *stream;
    sf_dtype dt;
    int rc = raw(c, b, x, &p, &dt, &stream, err);
    return rc ? rc : c->ops->mark(c, stream, err);
}

int sf_comm_wait_mark(sf_comm *c, const char *what, sf_error *err)
{
    return !c || !c->ops->wait_mark ? SF_OK : c->ops->wait_mark(c, what, err);
}

int sf_comm_takes_custom(const sf_comm *c, int64_t n, sf_dtype dt)
{
    size_t bytes = sf_dtype_bytes(dt, n);
    if (!c->custom_cap_bytes || dt != SF_DT_BF16 || bytes > c->custom_cap_bytes || c->path == SF_COMM_PATH_NCCL)
        return 0;
    if (c->path == SF_COMM_PATH_LL) return bytes <= c->ll_cap_bytes;
    return c->path != SF_COMM_PATH_AUTO || bytes <= c->custom_max_bytes;
}

int sf_comm_takes_ll(const sf_comm *c, int64_t n, sf_dtype dt)
{
    size_t bytes = sf_dtype_bytes(dt, n);
    if (!sf_comm_takes_custom(c, n, dt) || bytes > c->ll_cap_bytes || c->path == SF_COMM_PATH_ONESHOT) return 0;
    return c->path == SF_COMM_PATH_LL || bytes <= c->ll_max_bytes;
}


/* ---- the all-reduce crossover ------------------------------------------------------------ */
size_t sf_comm_pick_crossover(const size_t *bytes, const double *nccl_us, const double *own_us, int n, double margin)
{
    size_t best = 0;
    for (int i = 0; i < n; i++) {
        if (nccl_us[i] <= 0 || own_us[i] <= 0 || own_us[i] * (1 + margin) > nccl_us[i]) break;
        best = bytes[i];
    }
    return best;
}

static int crossover_path(const char *key, char *out, size_t n, int mkdirs)
{
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[600], safe[160];
    if (x && *x) snprintf(dir, sizeof dir, "%s/semflow", x);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/semflow", home);
    else return -1;
    if (mkdirs) {
        char parent[600];
        snprintf(parent, sizeof parent, "%.*s", (int)(strrchr(dir, '/') - dir), dir);
        mkdir(parent, 0755);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
    }
    snprintf(safe, sizeof safe, "%s", key);
    for (char *p = safe; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-'))
            *p = '_';
    snprintf(out, n, "%s/allreduce-%s.json", dir, safe);
    return 0;
}

int sf_comm_crossover_load(const char *key, size_t *crossover)
{
    char path[800];
    json_error_t je;
    if (crossover_path(key, path, sizeof path, 0)) return -1;
    json_t *o = json_load_file(path, 0, &je), *k = o ? json_object_get(o, "key") : NULL,
           *v = o ? json_object_get(o, "crossover_bytes") : NULL;
    int rc = -1;
    if (json_is_string(k) && !strcmp(json_string_value(k), key) && json_is_integer(v) && json_integer_value(v) >= 0) {
        *crossover = (size_t)json_integer_value(v);
        rc = 0;
    }
    json_decref(o);
    return rc;
}

void sf_comm_crossover_save(const char *key, size_t crossover, const size_t *bytes, const double *nccl_us,
                            const double *own_us, int n)
{
    char path[800], tmp[820];
    if (crossover_path(key, path, sizeof path, 1)) {
        SF_LOGW("all-reduce: no cache folder (set XDG_CACHE_HOME or HOME); the crossover is measured again next time");
        return;
    }
    json_t *o = json_object(), *t = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(t, json_pack("{s:I, s:f, s:f}", "bytes", (json_int_t)bytes[i], "nccl_us", nccl_us[i],
                                           "own_us", own_us[i]));
    json_object_set_new(o, "key", json_string(key));
    json_object_set_new(o, "crossover_bytes", json_integer((json_int_t)crossover));
    json_object_set_new(o, "measured", t);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file(o, tmp, JSON_INDENT(1)) == 0) rename(tmp, path);
    else SF_LOGW("all-reduce: cannot write %s (the crossover is measured again next time)", tmp);
    json_decref(o);
}
