/* trace.h — structs and constants shared by bpf/trace.bpf.c and bpf/monitor.c.
 *
 * Copy accounting: one BPF program is attached (uprobe) to every libcuda copy entry point; the
 * attach cookie says how to read the copy's size and direction:
 *   bits  0..7   SF_TR_DIR_*   direction, or SF_TR_DIR_DESC: read it from the descriptor
 *   bits  8..15  argument (1-based) holding the byte count, the descriptor pointer, or for
 *                batch copies the sizes array (the count is the next argument)
 *   bits 16..23  SF_TR_KIND_*  how to read the size */
#ifndef SF_TRACE_H
#define SF_TRACE_H

#define SF_TR_HIST 32
#define SF_TR_DIRS 4            /* h2d, d2h, d2d, other: same order as SF_DIR_* in monitor.h */
#define SF_TR_DIR_DESC 15       /* direction from the descriptor's memory types */
#define SF_TR_BATCH_MAX 64      /* batch copies: sizes read per call (the rest are counted as calls only) */

enum {
    SF_TR_KIND_SCALAR = 0,      /* argument is the byte count */
    SF_TR_KIND_2D = 1,          /* argument points to a CUDA_MEMCPY2D */
    SF_TR_KIND_3D = 2,          /* argument points to a CUDA_MEMCPY3D or CUDA_MEMCPY3D_PEER */
    SF_TR_KIND_BATCH = 3,       /* argument is a size_t sizes[count], count the next argument */
};

#define SF_TR_COOKIE(dir, arg, kind) ((unsigned long long)(dir) | ((unsigned long long)(arg) << 8) | \
                                      ((unsigned long long)(kind) << 16))

/* Offsets into the driver API descriptors (x86-64 layout of cuda.h). */
#define SF_CU2D_SRC_MEMTYPE 16
#define SF_CU2D_DST_MEMTYPE 72
#define SF_CU2D_WIDTH 112       /* WidthInBytes, then Height */
#define SF_CU3D_SRC_MEMTYPE 32
#define SF_CU3D_DST_MEMTYPE 120
#define SF_CU3D_WIDTH 176       /* WidthInBytes, Height, Depth */
enum { SF_CU_MEM_HOST = 1, SF_CU_MEM_DEVICE = 2, SF_CU_MEM_ARRAY = 3, SF_CU_MEM_UNIFIED = 4 };

struct sf_tr_dma_key {
    unsigned int tgid;
    unsigned int dir;
};

struct sf_tr_dma_val {
    unsigned long long bytes, calls;
    unsigned long long hist[SF_TR_HIST];
};

struct sf_tr_sock_val {
    unsigned long long tx_bytes, rx_bytes, tx_calls, rx_calls;
};

#endif
