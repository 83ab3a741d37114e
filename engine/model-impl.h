/* model-impl.h — internals shared by the model loaders (model.c, loader_hf.c, loader_gguf.c,
 * demo.c, progress.c). Not for use outside engine/. */
#ifndef SF_MODEL_IMPL_H
#define SF_MODEL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* Element size in bytes of a dense dtype (F32/F16/BF16), or 0 (block formats: sf_dtype_bytes). */
size_t sf_ld_elem_size(sf_dtype t);
const char *sf_ld_dtype_name(sf_dtype t);

/* A fresh, zeroed model; NULL on out of memory (err set). */
sf_model *sf_model_alloc(sf_error *err);
/* Take ownership of a mapping / malloc'd buffer; both are released by sf_model_free. */
int sf_model_add_map(sf_model *m, void *addr, size_t len, sf_error *err);
int sf_model_add_owned(sf_model *m, void *p, sf_error *err);
/* Allocate n_layers layer records (zeroed). */
int sf_model_alloc_layers(sf_model *m, sf_error *err);
/* Copy the basename of path (without a trailing '/' or extension ext) into m->name. */
void sf_model_set_name(sf_model *m, const char *path, const char *ext);

/* Memory-map a whole file read-only (MAP_PRIVATE). len == 0 files are refused (SF_EFORMAT). */
int sf_map_file(const char *path, void **addr, size_t *len, sf_error *err);

/* Dummy weights (dummy.c): from the config.json in folder `path`, or from `preset` when not
 * NULL (path is then "preset:NAME"). */
int sf_model_load_dummy(const char *path, const sf_model_config *preset, const sf_load_opts *o, sf_model **out,
                        sf_error *err);
/* Fill every weight of m (config already set, layers allocated) with random values: matrices
 * with std about 0.02, norms 1.0, stored as `format` (sf_dummy_format_check). Uses several
 * threads. */
int sf_model_fill_dummy(sf_model *m, const char *format, uint64_t seed, int progress, sf_error *err);
/* The same, filling only what tensor-parallel rank `rank` of `size` reads (size <= 1: all). */
int sf_model_fill_dummy_shard(sf_model *m, const char *format, uint64_t seed, int progress, int rank, int size,
                              sf_error *err);

/* generation_config.json text: adds its eos ids to cfg (config.c). */
int sf_config_merge_eos_json(const char *json_text, sf_model_config *cfg, sf_error *err);


/* ---- progress bar on stderr (only when enabled, stderr is a TTY and total > 256 MiB) ---- */
typedef struct sf_progress {
    int on;
    const char *label;
    uint64_t total, done;
    double t0, last;
} sf_progress;
void sf_progress_begin(sf_progress *p, const char *label, uint64_t total, int enabled);
void sf_progress_add(sf_progress *p, uint64_t n);  /* single thread only */
void sf_progress_end(sf_progress *p);
/* Touch every page of [addr, addr+len) (so the load cost is paid, and shown, up front). */
void sf_progress_touch(sf_progress *p, const void *addr, size_t len);

#endif
