/* hal_lanes.c — what every backend with lanes (hal.h: lanes_plan, lane) checks of a split. */
#include "hal.h"

#include <string.h>

static int same(const int32_t *a, const int32_t *b, size_t n)
{
    return !n || (a && b && !memcmp(a, b, n * sizeof *a));
}

int sf_batch_lanes_check(const sf_batch *bt, int n, const sf_batch *sub, sf_error *err)
{
    if (n != 2)
        return sf_err(err, SF_EINVAL, "lanes: a step splits into 2 lanes, not %d", n);
    int t0 = 0, s0 = 0;
    for (int i = 0; i < n; i++) {
        const sf_batch *l = &sub[i];
        int T = l->n_tokens, S = l->n_seqs;
        if (T < 1 || S < 1 || l->n_logits != 0 || l->max_blocks != bt->max_blocks || t0 + T > bt->n_tokens ||
            s0 + S > bt->n_seqs)
            return sf_err(err, SF_EINVAL, "lanes: lane %d has %d tokens, %d sequences, %d logit rows, block tables of "
                          "%d (the step: %d tokens, %d sequences, tables of %d; a lane has at least one sequence, no "
                          "logit rows and the step's table width)", i, T, S, l->n_logits, l->max_blocks,
                          bt->n_tokens, bt->n_seqs, bt->max_blocks);
        if (l->seq_start[0] != 0 || l->seq_start[S] != T)
            return sf_err(err, SF_EINVAL, "lanes: lane %d's seq_start runs from %d to %d, not from 0 to its %d tokens",
                          i, l->seq_start[0], l->seq_start[S], T);
        for (int s = 0; s <= S; s++)
            if (l->seq_start[s] != bt->seq_start[s0 + s] - t0)
                return sf_err(err, SF_EINVAL, "lanes: lane %d's sequence %d starts at token %d, the step's sequence "
                              "%d at %d (lane %d begins at token %d)", i, s, l->seq_start[s], s0 + s,
                              bt->seq_start[s0 + s], i, t0);
        if (!same(l->tokens, bt->tokens + t0, T) || !same(l->pos, bt->pos + t0, T) ||
            !same(l->slot, bt->slot + t0, T) || !same(l->seq_ctx, bt->seq_ctx ? bt->seq_ctx + s0 : NULL, S) ||
            !same(l->block_table, bt->block_table + (size_t)s0 * bt->max_blocks, (size_t)S * bt->max_blocks))
            return sf_err(err, SF_EINVAL, "lanes: lane %d's tokens, positions, slots, contexts or block tables differ "
                          "from the step's sequences %d..%d", i, s0, s0 + S - 1);
        t0 += T;
        s0 += S;
    }
    if (t0 != bt->n_tokens || s0 != bt->n_seqs)
        return sf_err(err, SF_EINVAL, "lanes: the lanes hold %d tokens of %d sequences, the step %d of %d", t0, s0,
                      bt->n_tokens, bt->n_seqs);
    return SF_OK;
}
