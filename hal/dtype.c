/* dtype.c — element types: names, block sizes, bytes, and what each backend keeps a weight
 * as. Pure functions, no backend: the loaders and their fuzz targets link it alone. */
#include "hal.h"

#include <string.h>

const char *sf_dtype_name(sf_dtype t)
{
    switch (t) {
    case SF_DT_F32: return "f32";
    case SF_DT_F16: return "f16";
    case SF_DT_BF16: return "bf16";
    case SF_DT_Q8_0: return "q8_0";
    case SF_DT_I32: return "i32";
    case SF_DT_I8: return "i8";
    case SF_DT_Q4_0: return "q4_0";
    case SF_DT_Q4_1: return "q4_1";
    case SF_DT_Q5_0: return "q5_0";
    case SF_DT_Q5_1: return "q5_1";
    case SF_DT_Q2_K: return "q2_k";
    case SF_DT_Q3_K: return "q3_k";
    case SF_DT_Q4_K: return "q4_k";
    case SF_DT_Q5_K: return "q5_k";
    case SF_DT_Q6_K: return "q6_k";
    case SF_DT_IQ4_NL: return "iq4_nl";
    case SF_DT_IQ4_XS: return "iq4_xs";
    default: return "unknown";
    }
}

/* GGUF block formats: elements and bytes per block */
static const struct { sf_dtype t; int elems, bytes; } blocks[] = {
    { SF_DT_Q8_0, 32, 34 }, { SF_DT_Q4_0, 32, 18 }, { SF_DT_Q4_1, 32, 20 }, { SF_DT_Q5_0, 32, 22 },
    { SF_DT_Q5_1, 32, 24 }, { SF_DT_Q2_K, 256, 84 }, { SF_DT_Q3_K, 256, 110 }, { SF_DT_Q4_K, 256, 144 },
    { SF_DT_Q5_K, 256, 176 }, { SF_DT_Q6_K, 256, 210 }, { SF_DT_IQ4_NL, 32, 18 }, { SF_DT_IQ4_XS, 256, 136 },
};

int sf_dtype_block(sf_dtype t)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(blocks); i++)
        if (blocks[i].t == t) return blocks[i].elems;
    return 1;
}

size_t sf_dtype_bytes(sf_dtype t, int64_t n)
{
    switch (t) {
    case SF_DT_F32: case SF_DT_I32: return (size_t)n * 4;
    case SF_DT_F16: case SF_DT_BF16: return (size_t)n * 2;
    case SF_DT_I8: return (size_t)n;
    default:
        for (size_t i = 0; i < SF_ARRAY_LEN(blocks); i++)
            if (blocks[i].t == t) return (size_t)(n / blocks[i].elems) * (size_t)blocks[i].bytes;
        return 0;
    }
}

int sf_qdev_ok(sf_dtype t) { return t == SF_DT_Q8_0 || t == SF_DT_Q4_K || t == SF_DT_Q5_K || t == SF_DT_Q6_K; }

sf_dtype sf_weight_dtype(const char *backend, sf_dtype t)
{
    if (!strcmp(backend, "cpu")) return t;
    /* CUDA: the formats qgemv.cu reads stay as they are, unless SEMFLOW_CUDA_QUANT=0 */
    return sf_qdev_ok(t) && sf_env_bool("SEMFLOW_CUDA_QUANT", 1) ? t : SF_DT_BF16;
}
