/* safetensors.c — map a .safetensors file and check its header against the file. */
#include "safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "model-impl.h"

#define ST_MAX_HEADER (100u << 20) /* the format's own limit is 100 MB */

/* Element sizes of every dtype the format defines; `ok` marks those we can compute with. */
static const struct {
    const char *name;
    int size;
    int ok;
    sf_dtype dt;
} st_dtypes[] = {
    { "F32", 4, 1, SF_DT_F32 }, { "F16", 2, 1, SF_DT_F16 }, { "BF16", 2, 1, SF_DT_BF16 },
    { "F64", 8, 0, 0 }, { "I64", 8, 0, 0 }, { "U64", 8, 0, 0 }, { "I32", 4, 0, 0 },
    { "U32", 4, 0, 0 }, { "I16", 2, 0, 0 }, { "U16", 2, 0, 0 }, { "I8", 1, 0, 0 },
    { "U8", 1, 0, 0 }, { "BOOL", 1, 0, 0 }, { "F8_E4M3", 1, 0, 0 }, { "F8_E5M2", 1, 0, 0 },
};

typedef struct { size_t begin, end; int idx; } st_range;

static int range_cmp(const void *a, const void *b)
{
    const st_range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int parse_tensor(sf_st_file *f, const char *name, json_t *v, size_t data_len,
                        const uint8_t *data, sf_st_tensor *t, sf_error *err)
{
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
        json_array_size(jo) != 2)
        return sf_err(err, SF_EFORMAT,
                      "%s: tensor '%s': header entry needs \"dtype\", \"shape\" and "
                      "\"data_offsets\": [begin, end]; the file is corrupt or not safetensors",
                      f->path, name);
    const char *ds = json_string_value(jd);
    size_t i;
    int found = -1;
    for (i = 0; i < SF_ARRAY_LEN(st_dtypes); i++)
        if (!strcmp(st_dtypes[i].name, ds)) found = (int)i;
    if (found < 0)
        return sf_err(err, SF_EFORMAT, "%s: tensor '%s' has unknown dtype '%s'", f->path, name, ds);
    if (!st_dtypes[found].ok)
        return sf_err(err, SF_EUNSUPPORTED,
                      "%s: tensor '%s' has dtype %s; semflow loads BF16, F16 and F32 "
                      "safetensors (convert the checkpoint, e.g. save it with torch_dtype=bfloat16)",
                      f->path, name, ds);
    t->dtype = st_dtypes[found].dt;
    size_t nd = json_array_size(js);
    if (nd > SF_ST_MAX_DIMS)
        return sf_err(err, SF_EUNSUPPORTED, "%s: tensor '%s' has %zu dimensions (at most %d supported)",
                      f->path, name, nd, SF_ST_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t n = 1;
    for (i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0 || json_integer_value(d) > (1ll << 40))
            return sf_err(err, SF_EFORMAT, "%s: tensor '%s': shape[%zu] is not a valid size", f->path,
                          name, i);
        t->shape[i] = json_integer_value(d);
        if (t->shape[i] && n > UINT64_MAX / (uint64_t)t->shape[i] / 8)
            return sf_err(err, SF_EFORMAT, "%s: tensor '%s': shape is too large", f->path, name);
        n *= (uint64_t)t->shape[i];
    }
    json_t *b = json_array_get(jo, 0), *e = json_array_get(jo, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b))
        return sf_err(err, SF_EFORMAT, "%s: tensor '%s': data_offsets must be two integers begin <= end",
                      f->path, name);
    uint64_t begin = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(e);
    if (end > data_len)
        return sf_err(err, SF_EFORMAT,
                      "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the data "
                      "(%zu bytes); the file is truncated or corrupt (download it again)",
                      f->path, name, (unsigned long long)begin, (unsigned long long)end, data_len);
    uint64_t want = n * (uint64_t)st_dtypes[found].size;
    if (end - begin != want)
        return sf_err(err, SF_EFORMAT,
                      "%s: tensor '%s': data_offsets span %llu bytes but shape x %s needs %llu",
                      f->path, name, (unsigned long long)(end - begin), ds, (unsigned long long)want);
    t->data = data + begin;
    t->nbytes = (size_t)want;
    t->name = strdup(name);
    if (!t->name) return sf_err(err, SF_ENOMEM, "out of memory");
    return SF_OK;
}

int sf_st_open(const char *path, sf_st_file **out, sf_error *err)
{
    sf_st_file *f = NULL;
    json_t *hdr = NULL;
    st_range *ranges = NULL;
    int rc;
    *out = NULL;
    f = calloc(1, sizeof *f);
    if (!f) return sf_err(err, SF_ENOMEM, "out of memory");
    snprintf(f->path, sizeof f->path, "%s", path);
    rc = sf_map_file(path, &f->map, &f->map_len, err);
    if (rc) goto cleanup;
    if (f->map_len < 8) {
        rc = sf_err(err, SF_EFORMAT, "%s: %zu bytes is too short for a safetensors file (truncated?)",
                    path, f->map_len);
        goto cleanup;
    }
    uint64_t hlen;
    memcpy(&hlen, f->map, 8); /* little-endian hosts only (x86-64, arm64) */
    if (hlen > f->map_len - 8 || hlen > ST_MAX_HEADER || hlen < 2) {
        rc = sf_err(err, SF_EFORMAT,
                    "%s: header length %llu does not fit the file (%zu bytes); the file is "
                    "truncated or not safetensors",
                    path, (unsigned long long)hlen, f->map_len);
        goto cleanup;
    }
    const char *htext = (const char *)f->map + 8;
    const uint8_t *data = (const uint8_t *)f->map + 8 + hlen;
    size_t data_len = f->map_len - 8 - (size_t)hlen;
    json_error_t je;
    hdr = json_loadb(htext, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!hdr || !json_is_object(hdr)) {
        rc = sf_err(err, SF_EFORMAT, "%s: header is not a JSON object (%s at byte %d); the file is "
                    "corrupt or not safetensors",
                    path, hdr ? "not an object" : je.text, hdr ? 0 : je.position + 8);
        goto cleanup;
    }
    size_t cap = json_object_size(hdr);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    ranges = calloc(cap ? cap : 1, sizeof *ranges);
    if (!f->tensors || !ranges) {
        rc = sf_err(err, SF_ENOMEM, "out of memory");
        goto cleanup;
    }
    const char *key;
    json_t *v;
    json_object_foreach(hdr, key, v) {
        if (!strcmp(key, "__metadata__")) continue;
        sf_st_tensor *t = &f->tensors[f->n_tensors];
        rc = parse_tensor(f, key, v, data_len, data, t, err);
        if (rc) goto cleanup;
        ranges[f->n_tensors].begin = (size_t)((const uint8_t *)t->data - data);
        ranges[f->n_tensors].end = ranges[f->n_tensors].begin + t->nbytes;
        ranges[f->n_tensors].idx = f->n_tensors;
        f->n_tensors++;
    }
    qsort(ranges, (size_t)f->n_tensors, sizeof *ranges, range_cmp);
    for (int i = 1; i < f->n_tensors; i++) {
        if (ranges[i].begin < ranges[i - 1].end) {
            rc = sf_err(err, SF_EFORMAT, "%s: tensors '%s' and '%s' overlap in the file; it is corrupt",
                        path, f->tensors[ranges[i - 1].idx].name, f->tensors[ranges[i].idx].name);
            goto cleanup;
        }
    }
    rc = SF_OK;
    *out = f;
    f = NULL;
cleanup:
    free(ranges);
    json_decref(hdr);
    sf_st_close(f, 0);
    return rc;
}

void sf_st_close(sf_st_file *f, int keep_map)
{
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (f->map && !keep_map) munmap(f->map, f->map_len);
    free(f);
}

const sf_st_tensor *sf_st_find(const sf_st_file *f, const char *name)
{
    for (int i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}
