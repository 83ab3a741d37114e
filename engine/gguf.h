/* gguf.h — read-only GGUF v2/v3 reader (internal to engine/).
 *
 * The file is mapped MAP_PRIVATE; metadata keys and strings are copied out (NUL-terminated),
 * numeric arrays and tensor data are pointers into the mapping. Every length, count and offset
 * is checked against the file before use: a truncated or corrupt file yields SF_EFORMAT, never
 * a crash. */
#ifndef SF_GGUF_H
#define SF_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "../hal/hal.h"

enum {
    SF_GGUF_U8 = 0, SF_GGUF_I8, SF_GGUF_U16, SF_GGUF_I16, SF_GGUF_U32, SF_GGUF_I32, SF_GGUF_F32,
    SF_GGUF_BOOL, SF_GGUF_STRING, SF_GGUF_ARRAY, SF_GGUF_U64, SF_GGUF_I64, SF_GGUF_F64,
    SF_GGUF_NTYPES
};

/* ggml tensor types this reader maps to sf_dtype */
enum {
    SF_GGML_F32 = 0, SF_GGML_F16 = 1, SF_GGML_Q4_0 = 2, SF_GGML_Q4_1 = 3, SF_GGML_Q5_0 = 6, SF_GGML_Q5_1 = 7,
    SF_GGML_Q8_0 = 8, SF_GGML_Q2_K = 10, SF_GGML_Q3_K = 11, SF_GGML_Q4_K = 12, SF_GGML_Q5_K = 13, SF_GGML_Q6_K = 14,
    SF_GGML_IQ4_NL = 20, SF_GGML_IQ4_XS = 23, SF_GGML_BF16 = 30
};

typedef struct sf_gguf_kv {
    char *key;
    int type;                 /* SF_GGUF_* */
    union { uint64_t u; int64_t i; double f; } num; /* scalar numbers and bool */
    char *str;                /* SF_GGUF_STRING */
    int arr_type;             /* SF_GGUF_ARRAY: element type */
    uint64_t arr_n;
    const uint8_t *arr_data;  /* raw elements in the file (numeric arrays) */
    char **arr_str;           /* string arrays, copied (arr_n entries) */
} sf_gguf_kv;

typedef struct sf_gguf_tensor {
    char *name;
    int n_dims;
    int64_t ne[4];            /* ne[0] = row length (in), ne[1] = rows (out) */
    int ggml_type;
    sf_dtype dtype;           /* valid when supported */
    int supported;
    uint64_t offset;          /* from the start of the data section */
    size_t nbytes;
    const void *data;
} sf_gguf_tensor;

typedef struct sf_gguf {
    char path[1024];
    void *map;
    size_t map_len;
    uint32_t version;
    uint32_t alignment;
    sf_gguf_kv *kv;
    int64_t n_kv;
    sf_gguf_tensor *tensors;
    int64_t n_tensors;
    size_t data_offset;
} sf_gguf;

/* Open, map and parse. Tensors of unsupported types parse fine (supported = 0); the loader
 * refuses them when it needs them. */
int sf_gguf_open(const char *path, sf_gguf **out, sf_error *err);
/* keep_map: hand the mapping to the caller (who munmaps map/map_len). */
void sf_gguf_close(sf_gguf *g, int keep_map);

const sf_gguf_kv *sf_gguf_find(const sf_gguf *g, const char *key);
const sf_gguf_tensor *sf_gguf_find_tensor(const sf_gguf *g, const char *name);
/* Scalar getters: SF_OK and *out set when the key exists with a numeric type; SF_ENOTFOUND
 * when missing (out untouched); SF_EFORMAT when it has another type. */
int sf_gguf_get_int(const sf_gguf *g, const char *key, int64_t *out, sf_error *err);
int sf_gguf_get_float(const sf_gguf *g, const char *key, double *out, sf_error *err);
const char *sf_gguf_get_str(const sf_gguf *g, const char *key); /* NULL if absent / not a string */
const char *sf_gguf_type_name(int ggml_type);

#endif
