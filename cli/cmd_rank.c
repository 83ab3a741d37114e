/* cmd_rank.c — `semflow rank`: a tensor-parallel follower process (hidden command). The leader
 * (serve / generate / bench with --tensor-parallel-size N) starts N-1 of these from its own
 * binary; each joins the group, loads its shard and runs the leader's step plans until told to
 * stop. Exit status: 0 on a clean stop, 1 when the group failed (the reason is printed). */
#include <stdio.h>

#include "cli/cli.h"
#include "engine/tp.h"

int sf_cmd_rank(int argc, char **argv)
{
    sf_tp_rank_opts o;
    sf_error err = { 0 };
    if (sf_tp_parse_rank_args(argc, argv, &o, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    if (sf_tp_follower_run(&o, &err)) {
        fprintf(stderr, "semflow rank: %s\n", err.msg);
        return 1;
    }
    return 0;
}
