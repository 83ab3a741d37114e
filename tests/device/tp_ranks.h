/* tp_ranks.h — the rank processes of the 2-GPU device tests (test_tp_norm.c):
 * the GPUs the driver lists without initialising CUDA in the parent, and the fork of one process
 * per rank, each running rank_main(rank, bootstrap) on GPU `rank`. Header-only (static). */
#ifndef SF_TESTS_TP_RANKS_H
#define SF_TESTS_TP_RANKS_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* GPUs the driver lists, as CUDA_VISIBLE_DEVICES will show them to the ranks. */
static int tp_count_gpus(void)
{
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (v) {
        int k = *v ? 1 : 0;
        for (; *v; v++) k += *v == ',';
        n = n < k ? n : k;
    }
    return n;
}

/* Forks `ranks` processes running rank_main(rank, "127.0.0.1:port") and waits for them; codes[k]:
 * the exit status of rank k (128 + signal when killed). Returns 0, or -1 when a fork failed. */
static int tp_fork_ranks(int ranks, int port, int (*rank_main)(int, const char *), int *codes)
{
    char boot[64];
    snprintf(boot, sizeof boot, "127.0.0.1:%d", port);
    pid_t pid[16];
    int n = 0;
    for (int k = 0; k < ranks && k < 16; k++, n++) {
        fflush(stdout);
        pid[k] = fork();
        if (pid[k] == 0) {
            int rc = rank_main(k, boot);
            fflush(stdout);
            _exit(rc);
        }
        if (pid[k] < 0) break;
    }
    for (int k = 0; k < n; k++) {
        int st = 0;
        waitpid(pid[k], &st, 0);
        codes[k] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    return n == ranks ? 0 : -1;
}

#endif
