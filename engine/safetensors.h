/* safetensors.h — read-only view of a .safetensors file (internal to engine/).
 *
 * Layout: u64 LE header length N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets":
 * [begin, end]}, "__metadata__": {...}}, then the data. The file is mapped MAP_PRIVATE and
 * every tensor's data pointer points into the mapping: nothing is copied. Every offset, size
 * and shape is checked against the file before any pointer is handed out. */
#ifndef SF_SAFETENSORS_H
#define SF_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../hal/hal.h"

#define SF_ST_MAX_DIMS 4

typedef struct sf_st_tensor {
    char *name;
    sf_dtype dtype;
    int ndim;
    int64_t shape[SF_ST_MAX_DIMS];
    const void *data;         /* into the mapping */
    size_t nbytes;
} sf_st_tensor;

typedef struct sf_st_file {
    char path[1024];
    void *map;                /* whole file */
    size_t map_len;
    sf_st_tensor *tensors;
    int n_tensors;
} sf_st_file;

/* Open, map and validate. On error nothing is left open. */
int sf_st_open(const char *path, sf_st_file **out, sf_error *err);
/* Release the table; when keep_map is set the mapping is handed to the caller (who munmaps
 * map/map_len later), otherwise it is unmapped. NULL is fine. */
void sf_st_close(sf_st_file *f, int keep_map);
const sf_st_tensor *sf_st_find(const sf_st_file *f, const char *name);

#endif
