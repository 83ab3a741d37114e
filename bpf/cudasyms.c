/* cudasyms.c — where libcuda's copy entry points are: the symbol table with the cookie data
 * for bpf/trace.bpf.c, ELF symbol -> file offset resolution, and discovery of libcuda copies
 * (ldconfig's cache and the maps of running processes). */
#include "bpf/bpf_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bpf/monitor.h"
#include "bpf/trace.h"

#define H SF_DIR_H2D
#define D SF_DIR_D2H
#define DD SF_DIR_D2D
#define O SF_DIR_OTHER
#define DESC SF_TR_DIR_DESC
#define S SF_TR_KIND_SCALAR

/* Per-thread-default-stream variants: _ptds for synchronous calls, _ptsz for async ones. */
const sf_cuda_sym sf_cuda_syms[] = {
    { "cuMemcpy", O, 3, S }, { "cuMemcpy_ptds", O, 3, S },
    { "cuMemcpyAsync", O, 3, S }, { "cuMemcpyAsync_ptsz", O, 3, S },
    { "cuMemcpyHtoD", H, 3, S }, { "cuMemcpyHtoD_v2", H, 3, S }, { "cuMemcpyHtoD_v2_ptds", H, 3, S },
    { "cuMemcpyDtoH", D, 3, S }, { "cuMemcpyDtoH_v2", D, 3, S }, { "cuMemcpyDtoH_v2_ptds", D, 3, S },
    { "cuMemcpyDtoD", DD, 3, S }, { "cuMemcpyDtoD_v2", DD, 3, S }, { "cuMemcpyDtoD_v2_ptds", DD, 3, S },
    { "cuMemcpyHtoDAsync", H, 3, S }, { "cuMemcpyHtoDAsync_v2", H, 3, S }, { "cuMemcpyHtoDAsync_v2_ptsz", H, 3, S },
    { "cuMemcpyDtoHAsync", D, 3, S }, { "cuMemcpyDtoHAsync_v2", D, 3, S }, { "cuMemcpyDtoHAsync_v2_ptsz", D, 3, S },
    { "cuMemcpyDtoDAsync", DD, 3, S }, { "cuMemcpyDtoDAsync_v2", DD, 3, S }, { "cuMemcpyDtoDAsync_v2_ptsz", DD, 3, S },
    /* arrays: HtoA(dstArray, dstOffset, srcHost, ByteCount), AtoH(dstHost, srcArray, srcOffset, ByteCount) */
    { "cuMemcpyHtoA_v2", H, 4, S }, { "cuMemcpyHtoA_v2_ptds", H, 4, S },
    { "cuMemcpyAtoH_v2", D, 4, S }, { "cuMemcpyAtoH_v2_ptds", D, 4, S },
    { "cuMemcpyHtoAAsync_v2", H, 4, S }, { "cuMemcpyHtoAAsync_v2_ptsz", H, 4, S },
    { "cuMemcpyAtoHAsync_v2", D, 4, S }, { "cuMemcpyAtoHAsync_v2_ptsz", D, 4, S },
    { "cuMemcpyDtoA_v2", DD, 4, S }, { "cuMemcpyDtoA_v2_ptds", DD, 4, S },
    { "cuMemcpyAtoD_v2", DD, 4, S }, { "cuMemcpyAtoD_v2_ptds", DD, 4, S },
    /* Peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount) */
    { "cuMemcpyPeer", DD, 5, S }, { "cuMemcpyPeer_ptds", DD, 5, S },
    { "cuMemcpyPeerAsync", DD, 5, S }, { "cuMemcpyPeerAsync_ptsz", DD, 5, S },
    /* descriptors: direction from the memory types, bytes = WidthInBytes * Height (* Depth) */
    { "cuMemcpy2D", DESC, 1, SF_TR_KIND_2D }, { "cuMemcpy2D_v2", DESC, 1, SF_TR_KIND_2D },
    { "cuMemcpy2D_v2_ptds", DESC, 1, SF_TR_KIND_2D },
    { "cuMemcpy2DUnaligned", DESC, 1, SF_TR_KIND_2D }, { "cuMemcpy2DUnaligned_v2", DESC, 1, SF_TR_KIND_2D },
    { "cuMemcpy2DUnaligned_v2_ptds", DESC, 1, SF_TR_KIND_2D },
    { "cuMemcpy2DAsync", DESC, 1, SF_TR_KIND_2D }, { "cuMemcpy2DAsync_v2", DESC, 1, SF_TR_KIND_2D },
    { "cuMemcpy2DAsync_v2_ptsz", DESC, 1, SF_TR_KIND_2D },
    { "cuMemcpy3D", DESC, 1, SF_TR_KIND_3D }, { "cuMemcpy3D_v2", DESC, 1, SF_TR_KIND_3D },
    { "cuMemcpy3D_v2_ptds", DESC, 1, SF_TR_KIND_3D },
    { "cuMemcpy3DAsync", DESC, 1, SF_TR_KIND_3D }, { "cuMemcpy3DAsync_v2", DESC, 1, SF_TR_KIND_3D },
    { "cuMemcpy3DAsync_v2_ptsz", DESC, 1, SF_TR_KIND_3D },
    { "cuMemcpy3DPeer", DESC, 1, SF_TR_KIND_3D }, { "cuMemcpy3DPeer_ptds", DESC, 1, SF_TR_KIND_3D },
    { "cuMemcpy3DPeerAsync", DESC, 1, SF_TR_KIND_3D }, { "cuMemcpy3DPeerAsync_ptsz", DESC, 1, SF_TR_KIND_3D },
    /* batch(dsts, srcs, sizes, count, ...): unified addresses, direction unknown */
    { "cuMemcpyBatchAsync", O, 3, SF_TR_KIND_BATCH }, { "cuMemcpyBatchAsync_ptsz", O, 3, SF_TR_KIND_BATCH },
    { "cuMemcpyBatchAsync_v2", O, 3, SF_TR_KIND_BATCH }, { "cuMemcpyBatchAsync_v2_ptsz", O, 3, SF_TR_KIND_BATCH },
    { NULL, 0, 0, 0 },
};

#ifdef SF_HAVE_BPF
#include <gelf.h>
#include <libelf.h>

int sf_elf_sym_offsets(const char *path, const char *const *names, int n, uint64_t *offsets, sf_error *err)
{
    int fd = -1, rc = SF_OK;
    Elf *elf = NULL;
    Elf_Scn *scn = NULL;
    size_t nph = 0;

    memset(offsets, 0, (size_t)n * sizeof *offsets);
    if (elf_version(EV_CURRENT) == EV_NONE) return sf_err(err, SF_ERROR, "libelf: %s", elf_errmsg(-1));
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return sf_err(err, SF_ENOTFOUND, "opening %s: %s", path, strerror(errno));
    if (!(elf = elf_begin(fd, ELF_C_READ, NULL)) || elf_kind(elf) != ELF_K_ELF || elf_getphdrnum(elf, &nph)) {
        rc = sf_err(err, SF_EFORMAT, "%s is not an ELF shared object", path);
        goto cleanup;
    }
    while ((scn = elf_nextscn(elf, scn))) {
        GElf_Shdr sh;
        Elf_Data *data;
        if (!gelf_getshdr(scn, &sh) || (sh.sh_type != SHT_DYNSYM && sh.sh_type != SHT_SYMTAB)) continue;
        if (!(data = elf_getdata(scn, NULL)) || !sh.sh_entsize) continue;
        for (size_t i = 0; i < sh.sh_size / sh.sh_entsize; i++) {
            GElf_Sym sym;
            const char *nm;
            if (!gelf_getsym(data, (int)i, &sym) || GELF_ST_TYPE(sym.st_info) != STT_FUNC || !sym.st_value) continue;
            if (!(nm = elf_strptr(elf, sh.sh_link, sym.st_name))) continue;
            for (int k = 0; k < n; k++) {
                if (offsets[k] || strcmp(nm, names[k])) continue;
                /* virtual address -> file offset through the executable PT_LOAD holding it */
                for (size_t p = 0; p < nph; p++) {
                    GElf_Phdr ph;
                    if (!gelf_getphdr(elf, (int)p, &ph) || ph.p_type != PT_LOAD) continue;
                    if (sym.st_value >= ph.p_vaddr && sym.st_value < ph.p_vaddr + ph.p_memsz) {
                        offsets[k] = sym.st_value - ph.p_vaddr + ph.p_offset;
                        break;
                    }
                }
            }
        }
    }
cleanup:
    if (elf) elf_end(elf);
    close(fd);
    return rc;
}
#else
int sf_elf_sym_offsets(const char *path, const char *const *names, int n, uint64_t *offsets, sf_error *err)
{
    return sf_err(err, SF_EUNSUPPORTED, "BPF is off in this build");
}
#endif

static int add_path(char paths[][512], int n, int max, const char *p)
{
    char real[PATH_MAX];
    if (n >= max || !realpath(p, real) || strlen(real) >= 512) return n;
    for (int i = 0; i < n; i++)
        if (!strcmp(paths[i], real)) return n;
    strcpy(paths[n], real);
    return n + 1;
}

int sf_cuda_discover(char paths[][512], int max, int with_ldconfig)
{
    return sf_cuda_discover_filtered(paths, max, with_ldconfig, NULL, NULL);
}

int sf_cuda_discover_filtered(char paths[][512], int max, int with_ldconfig, int (*skip)(int pid, void *arg),
                              void *arg)
{
    int n = 0;
    char line[1024];
    FILE *f = with_ldconfig ? popen("ldconfig -p 2>/dev/null", "r") : NULL;
    if (f) {
        while (fgets(line, sizeof line, f)) {
            char *arrow = strstr(line, "=> ");
            if (!strstr(line, "libcuda.so") || !arrow) continue;
            arrow += 3;
            arrow[strcspn(arrow, "\n")] = 0;
            n = add_path(paths, n, max, arrow);
        }
        pclose(f);
    }
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char mp[64];
        if (de->d_name[0] < '1' || de->d_name[0] > '9') continue;
        if (skip && skip(atoi(de->d_name), arg)) continue;
        snprintf(mp, sizeof mp, "/proc/%s/maps", de->d_name);
        FILE *m = fopen(mp, "re");
        if (!m) continue;
        while (fgets(line, sizeof line, m)) {
            char *p = strchr(line, '/');
            if (!p || !strstr(p, "/libcuda.so")) continue;
            p[strcspn(p, "\n")] = 0;
            /* the maps of a process in another mount namespace name its own files */
            char rooted[600];
            snprintf(rooted, sizeof rooted, "/proc/%s/root%s", de->d_name, p);
            n = add_path(paths, n, max, access(p, R_OK) == 0 ? p : rooted);
            break;
        }
        fclose(m);
    }
    if (d) closedir(d);
    return n;
}
