/* gguf.c — GGUF v2/v3 parsing with bounds checks on every read. */
#include "gguf.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "model-impl.h"

#define GGUF_MAX_DEPTH 4

typedef struct cur {
    const uint8_t *p, *end, *base;
    const char *path;
    sf_error *err;
} cur;

static int trunc_err(cur *c, const char *what)
{
    return sf_err(c->err, SF_EFORMAT, "%s: truncated or corrupt GGUF: %s at byte %zu runs past the end "
                  "of the file (%zu bytes); download the file again", c->path, what,
                  (size_t)(c->p - c->base), (size_t)(c->end - c->base));
}

static int rd(cur *c, void *dst, size_t n, const char *what)
{
    if ((size_t)(c->end - c->p) < n) return trunc_err(c, what);
    memcpy(dst, c->p, n);
    c->p += n;
    return SF_OK;
}

static int rd_u32(cur *c, uint32_t *v, const char *what) { return rd(c, v, 4, what); }
static int rd_u64(cur *c, uint64_t *v, const char *what) { return rd(c, v, 8, what); }

/* A string: u64 length + bytes. out == NULL: skip it. */
static int rd_str(cur *c, char **out, const char *what)
{
    uint64_t n;
    int rc = rd_u64(c, &n, what);
    if (rc) return rc;
    if (n > (uint64_t)(c->end - c->p))
        return sf_err(c->err, SF_EFORMAT, "%s: corrupt GGUF: %s at byte %zu has length %llu, past the end of "
                      "the file (%zu bytes)", c->path, what, (size_t)(c->p - c->base) - 8,
                      (unsigned long long)n, (size_t)(c->end - c->base));
    if (out) {
        *out = malloc(n + 1);
        if (!*out) return sf_err(c->err, SF_ENOMEM, "out of memory reading %s", what);
        memcpy(*out, c->p, n);
        (*out)[n] = 0;
    }
    c->p += n;
    return SF_OK;
}

static const int scalar_size[SF_GGUF_NTYPES] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };

static const struct { int id; const char *name; int blck, size; } ggml_types[] = {
    { 0, "F32", 1, 4 }, { 1, "F16", 1, 2 }, { 2, "Q4_0", 32, 18 }, { 3, "Q4_1", 32, 20 },
    { 6, "Q5_0", 32, 22 }, { 7, "Q5_1", 32, 24 }, { 8, "Q8_0", 32, 34 }, { 9, "Q8_1", 32, 36 },
    { 10, "Q2_K", 256, 84 }, { 11, "Q3_K", 256, 110 }, { 12, "Q4_K", 256, 144 }, { 13, "Q5_K", 256, 176 },
    { 14, "Q6_K", 256, 210 }, { 15, "Q8_K", 256, 292 }, { 16, "IQ2_XXS", 0, 0 }, { 17, "IQ2_XS", 0, 0 },
    { 18, "IQ3_XXS", 0, 0 }, { 19, "IQ1_S", 0, 0 }, { 20, "IQ4_NL", 32, 18 }, { 21, "IQ3_S", 0, 0 },
    { 22, "IQ2_S", 0, 0 }, { 23, "IQ4_XS", 256, 136 }, { 24, "I8", 1, 1 }, { 25, "I16", 1, 2 },
    { 26, "I32", 1, 4 }, { 27, "I64", 1, 8 }, { 28, "F64", 1, 8 }, { 29, "IQ1_M", 0, 0 },
    { 30, "BF16", 1, 2 }, { 34, "TQ1_0", 0, 0 }, { 35, "TQ2_0", 0, 0 }, { 39, "MXFP4", 0, 0 },
};

const char *sf_gguf_type_name(int t)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(ggml_types); i++)
        if (ggml_types[i].id == t) return ggml_types[i].name;
    return "unknown";
}

static int rd_value(cur *c, sf_gguf_kv *kv, int type, int depth, const char *key);

/* Array: element type u32, count u64, elements. Numeric arrays stay in the file; string arrays
 * are copied when kv is given (top level), nested arrays are checked and skipped. */
static int rd_array(cur *c, sf_gguf_kv *kv, int depth, const char *key)
{
    uint32_t et;
    uint64_t n;
    int rc;
    if ((rc = rd_u32(c, &et, key)) || (rc = rd_u64(c, &n, key))) return rc;
    if (et >= SF_GGUF_NTYPES)
        return sf_err(c->err, SF_EFORMAT, "%s: corrupt GGUF: key '%s' is an array of unknown type %u",
                      c->path, key, et);
    if (depth >= GGUF_MAX_DEPTH)
        return sf_err(c->err, SF_EFORMAT, "%s: corrupt GGUF: key '%s' nests arrays too deep", c->path, key);
    size_t left = (size_t)(c->end - c->p);
    if (scalar_size[et]) {
        if (n > left / (uint64_t)scalar_size[et]) return trunc_err(c, key);
        if (kv) {
            kv->arr_type = (int)et;
            kv->arr_n = n;
            kv->arr_data = c->p;
        }
        c->p += n * (uint64_t)scalar_size[et];
        return SF_OK;
    }
    if (n > left / 8) return trunc_err(c, key); /* every string or array is at least 8 bytes */
    if (kv) {
        kv->arr_type = (int)et;
        kv->arr_n = n;
    }
    if (et == SF_GGUF_STRING && kv) {
        kv->arr_str = calloc(n ? n : 1, sizeof *kv->arr_str);
        if (!kv->arr_str) return sf_err(c->err, SF_ENOMEM, "out of memory reading '%s'", key);
    }
    for (uint64_t i = 0; i < n; i++) {
        if (et == SF_GGUF_STRING) rc = rd_str(c, kv ? &kv->arr_str[i] : NULL, key);
        else rc = rd_value(c, NULL, (int)et, depth + 1, key);
        if (rc) return rc;
    }
    return SF_OK;
}

static int rd_value(cur *c, sf_gguf_kv *kv, int type, int depth, const char *key)
{
    int rc;
    if (type == SF_GGUF_STRING) return rd_str(c, kv ? &kv->str : NULL, key);
    if (type == SF_GGUF_ARRAY) return rd_array(c, kv, depth, key);
    if (type < 0 || type >= SF_GGUF_NTYPES)
        return sf_err(c->err, SF_EFORMAT, "%s: corrupt GGUF: key '%s' has unknown value type %d", c->path, key, type);
    uint8_t b[8] = { 0 };
    if ((rc = rd(c, b, (size_t)scalar_size[type], key))) return rc;
    if (!kv) return SF_OK;
    int8_t i8; int16_t i16; int32_t i32; uint16_t u16; uint32_t u32; float f32;
    switch (type) {
    case SF_GGUF_U8: case SF_GGUF_BOOL: kv->num.i = b[0]; break;
    case SF_GGUF_I8: memcpy(&i8, b, 1); kv->num.i = i8; break;
    case SF_GGUF_U16: memcpy(&u16, b, 2); kv->num.i = u16; break;
    case SF_GGUF_I16: memcpy(&i16, b, 2); kv->num.i = i16; break;
    case SF_GGUF_U32: memcpy(&u32, b, 4); kv->num.i = u32; break;
    case SF_GGUF_I32: memcpy(&i32, b, 4); kv->num.i = i32; break;
    case SF_GGUF_F32: memcpy(&f32, b, 4); kv->num.f = f32; break;
    case SF_GGUF_U64: memcpy(&kv->num.u, b, 8); break;
    case SF_GGUF_I64: memcpy(&kv->num.i, b, 8); break;
    case SF_GGUF_F64: memcpy(&kv->num.f, b, 8); break;
    }
    return SF_OK;
}

int sf_gguf_open(const char *path, sf_gguf **out, sf_error *err)
{
    sf_gguf *g = NULL;
    int rc;
    *out = NULL;
    if (!(g = calloc(1, sizeof *g))) return sf_err(err, SF_ENOMEM, "out of memory");
    snprintf(g->path, sizeof g->path, "%s", path);
    if ((rc = sf_map_file(path, &g->map, &g->map_len, err))) goto fail;
    cur c = { .p = g->map, .end = (const uint8_t *)g->map + g->map_len, .base = g->map, .path = path, .err = err };
    char magic[4];
    if (g->map_len < 4 || (memcpy(magic, g->map, 4), memcmp(magic, "GGUF", 4))) {
        rc = sf_err(err, SF_EFORMAT, "%s is not a GGUF file (bad magic; expected \"GGUF\")", path);
        goto fail;
    }
    c.p += 4;
    if ((rc = rd_u32(&c, &g->version, "version"))) goto fail;
    if (g->version == 1) {
        rc = sf_err(err, SF_EUNSUPPORTED, "%s: GGUF version 1 is obsolete and not supported (versions 2 "
                    "and 3 are); convert the model again with a current llama.cpp", path);
        goto fail;
    }
    if (g->version != 2 && g->version != 3) {
        rc = sf_err(err, SF_EUNSUPPORTED, "%s: GGUF version %u is not supported (versions 2 and 3 are)",
                    path, g->version);
        goto fail;
    }
    uint64_t n_tensors, n_kv;
    if ((rc = rd_u64(&c, &n_tensors, "tensor count")) || (rc = rd_u64(&c, &n_kv, "metadata count"))) goto fail;
    size_t left = (size_t)(c.end - c.p);
    if (n_kv > left / 13 || n_tensors > left / 28) {
        rc = sf_err(err, SF_EFORMAT, "%s: corrupt GGUF: %llu metadata entries and %llu tensors cannot fit in "
                    "%zu bytes", path, (unsigned long long)n_kv, (unsigned long long)n_tensors, g->map_len);
        goto fail;
    }
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        rc = sf_err(err, SF_ENOMEM, "out of memory");
        goto fail;
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        sf_gguf_kv *kv = &g->kv[i];
        uint32_t type;
        g->n_kv = (int64_t)i + 1;
        if ((rc = rd_str(&c, &kv->key, "metadata key")) || (rc = rd_u32(&c, &type, kv->key))) goto fail;
        kv->type = (int)type;
        if ((rc = rd_value(&c, kv, (int)type, 0, kv->key))) goto fail;
    }
    g->alignment = 32;
    const sf_gguf_kv *al = sf_gguf_find(g, "general.alignment");
    if (al) {
        if (al->type != SF_GGUF_U32 || al->num.i == 0 || (al->num.i & (al->num.i - 1)) || al->num.i > (1 << 20)) {
            rc = sf_err(err, SF_EFORMAT, "%s: general.alignment must be a power of two (u32)", path);
            goto fail;
        }
        g->alignment = (uint32_t)al->num.i;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        sf_gguf_tensor *t = &g->tensors[i];
        uint32_t nd, type;
        g->n_tensors = (int64_t)i + 1;
        if ((rc = rd_str(&c, &t->name, "tensor name")) || (rc = rd_u32(&c, &nd, t->name))) goto fail;
        if (nd < 1 || nd > 4) {
            rc = sf_err(err, SF_EFORMAT, "%s: corrupt GGUF: tensor '%s' has %u dimensions (1..4 allowed)",
                        path, t->name, nd);
            goto fail;
        }
        t->n_dims = (int)nd;
        uint64_t ne[4] = { 1, 1, 1, 1 }, total = 1;
        for (uint32_t d = 0; d < nd; d++) {
            if ((rc = rd_u64(&c, &ne[d], t->name))) goto fail;
            if (ne[d] > (1ull << 40) || (ne[d] && total > (1ull << 48) / ne[d])) {
                rc = sf_err(err, SF_EFORMAT, "%s: corrupt GGUF: tensor '%s' dimension %u is %llu", path,
                            t->name, d, (unsigned long long)ne[d]);
                goto fail;
            }
            total *= ne[d];
        }
        for (int d = 0; d < 4; d++) t->ne[d] = (int64_t)ne[d];
        if ((rc = rd_u32(&c, &type, t->name)) || (rc = rd_u64(&c, &t->offset, t->name))) goto fail;
        t->ggml_type = (int)type;
        int blck = 0, size = 0;
        for (size_t k = 0; k < SF_ARRAY_LEN(ggml_types); k++)
            if (ggml_types[k].id == (int)type) blck = ggml_types[k].blck, size = ggml_types[k].size;
        if (blck && ne[0] % (uint64_t)blck == 0) t->nbytes = (size_t)(total / (uint64_t)blck * (uint64_t)size);
        switch (type) {
        case SF_GGML_F32: t->dtype = SF_DT_F32; t->supported = 1; break;
        case SF_GGML_F16: t->dtype = SF_DT_F16; t->supported = 1; break;
        case SF_GGML_BF16: t->dtype = SF_DT_BF16; t->supported = 1; break;
        default: {
            static const struct { int ggml; sf_dtype dt; } q[] = {
                { SF_GGML_Q8_0, SF_DT_Q8_0 }, { SF_GGML_Q4_0, SF_DT_Q4_0 }, { SF_GGML_Q4_1, SF_DT_Q4_1 },
                { SF_GGML_Q5_0, SF_DT_Q5_0 }, { SF_GGML_Q5_1, SF_DT_Q5_1 }, { SF_GGML_Q2_K, SF_DT_Q2_K },
                { SF_GGML_Q3_K, SF_DT_Q3_K }, { SF_GGML_Q4_K, SF_DT_Q4_K }, { SF_GGML_Q5_K, SF_DT_Q5_K },
                { SF_GGML_Q6_K, SF_DT_Q6_K }, { SF_GGML_IQ4_NL, SF_DT_IQ4_NL }, { SF_GGML_IQ4_XS, SF_DT_IQ4_XS },
            };
            for (size_t k = 0; k < SF_ARRAY_LEN(q); k++)
                if (q[k].ggml == (int)type) {
                    t->dtype = q[k].dt;
                    t->supported = ne[0] % (uint64_t)blck == 0;
                }
        }
        }
    }
    size_t pos = (size_t)(c.p - c.base);
    g->data_offset = (pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->data_offset > g->map_len) g->data_offset = g->map_len;
    size_t data_len = g->map_len - g->data_offset;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        sf_gguf_tensor *t = &g->tensors[i];
        if (!t->nbytes) continue; /* type without a known size: refused if the loader needs it */
        if (t->offset % g->alignment || t->offset > data_len || t->nbytes > data_len - t->offset) {
            rc = sf_err(err, SF_EFORMAT, "%s: truncated or corrupt GGUF: tensor '%s' (%zu bytes at data offset "
                        "%llu) does not fit in the %zu bytes of tensor data%s", path, t->name, t->nbytes,
                        (unsigned long long)t->offset, data_len,
                        t->offset % g->alignment ? " or is misaligned" : "");
            goto fail;
        }
        t->data = (const uint8_t *)g->map + g->data_offset + t->offset;
    }
    *out = g;
    return SF_OK;
fail:
    sf_gguf_close(g, 0);
    return rc;
}

void sf_gguf_close(sf_gguf *g, int keep_map)
{
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) {
        sf_gguf_kv *kv = &g->kv[i];
        free(kv->key);
        free(kv->str);
        if (kv->arr_str)
            for (uint64_t k = 0; k < kv->arr_n; k++) free(kv->arr_str[k]);
        free(kv->arr_str);
    }
    free(g->kv);
    for (int64_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->tensors);
    if (g->map && !keep_map) munmap(g->map, g->map_len);
    free(g);
}

const sf_gguf_kv *sf_gguf_find(const sf_gguf *g, const char *key)
{
    for (int64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key && !strcmp(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const sf_gguf_tensor *sf_gguf_find_tensor(const sf_gguf *g, const char *name)
{
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].name && !strcmp(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

int sf_gguf_get_int(const sf_gguf *g, const char *key, int64_t *out, sf_error *err)
{
    const sf_gguf_kv *kv = sf_gguf_find(g, key);
    if (!kv) return SF_ENOTFOUND;
    switch (kv->type) {
    case SF_GGUF_F32: case SF_GGUF_F64: *out = (int64_t)kv->num.f; return SF_OK;
    case SF_GGUF_STRING: case SF_GGUF_ARRAY:
        return sf_err(err, SF_EFORMAT, "%s: metadata '%s' should be a number", g->path, key);
    default: *out = kv->num.i; return SF_OK;
    }
}

int sf_gguf_get_float(const sf_gguf *g, const char *key, double *out, sf_error *err)
{
    const sf_gguf_kv *kv = sf_gguf_find(g, key);
    if (!kv) return SF_ENOTFOUND;
    switch (kv->type) {
    case SF_GGUF_F32: case SF_GGUF_F64: *out = kv->num.f; return SF_OK;
    case SF_GGUF_STRING: case SF_GGUF_ARRAY:
        return sf_err(err, SF_EFORMAT, "%s: metadata '%s' should be a number", g->path, key);
    default: *out = (double)kv->num.i; return SF_OK;
    }
}

const char *sf_gguf_get_str(const sf_gguf *g, const char *key)
{
    const sf_gguf_kv *kv = sf_gguf_find(g, key);
    return kv && kv->type == SF_GGUF_STRING ? kv->str : NULL;
}
