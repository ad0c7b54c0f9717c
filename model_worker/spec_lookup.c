/*
 * spec_lookup.c - see spec_lookup.h.
 */
#include "spec_lookup.h"

#include <assert.h>

int zi_spec_propose(const int32_t *tokens, int64_t n, int k, int32_t *out) {
    if (k > ZI_SPEC_MAX_DRAFT) k = ZI_SPEC_MAX_DRAFT;
    if (k <= 0 || n < 2) return 0;
    int32_t last = tokens[n - 1];
    int best = 0;
    int64_t best_e = -1;
    /* e: where an earlier occurrence of the suffix ends (tokens[e] ==
     * tokens[n - 1]); the most recent first, so that a tie keeps it. */
    for (int64_t e = n - 2; e >= 0; e--) {
        if (tokens[e] != last) continue;
        int len = 1;
        while (len < ZI_SPEC_MAX_NGRAM && e - len >= 0 && tokens[e - len] == tokens[n - 1 - len])
            len++;
        if (len > best) {
            best = len, best_e = e;
            if (best == ZI_SPEC_MAX_NGRAM) break;
        }
    }
    if (best < ZI_SPEC_MIN_NGRAM) return 0;
    int m = 0;
    for (int64_t i = best_e + 1; i < n && m < k; i++) out[m++] = tokens[i];
    assert(m >= 1); /* best_e <= n - 2 */
    return m;
}

int zi_spec_accept(const int32_t *draft, int n_draft, const int32_t *target) {
    int a = 0;
    while (a < n_draft && draft[a] == target[a]) a++;
    return a;
}

void zi_spec_state_init(zi_spec_state *s) {
    *s = (zi_spec_state){.k = ZI_SPEC_START_DRAFT, .next_pause = ZI_SPEC_MIN_PAUSE};
}

int zi_spec_draft_len(zi_spec_state *s, int cap) {
    if (s->pause > 0) {
        s->pause--;
        return 0;
    }
    int k = s->k < cap ? s->k : cap;
    return k > 0 ? k : 0;
}

void zi_spec_record(zi_spec_state *s, int proposed, int accepted) {
    assert(accepted >= 0 && accepted <= proposed);
    if (proposed <= 0) return;
    if (accepted > 0) {
        s->k = accepted == proposed ? s->k + 2 : accepted + 1;
        if (s->k > ZI_SPEC_MAX_DRAFT) s->k = ZI_SPEC_MAX_DRAFT;
    } else {
        s->k = s->k / 2 > 1 ? s->k / 2 : 1;
    }
    /* A verification that kept at least half its drafts paid for its rows
     * (a row costs a CPU step a good part of a token); one that kept less
     * is a failure. */
    if (2 * accepted >= proposed) {
        s->fails = 0;
        s->next_pause = ZI_SPEC_MIN_PAUSE;
        return;
    }
    if (++s->fails >= ZI_SPEC_MAX_FAILS) {
        /* re-probe later with a short draft; a failed re-probe (one
         * more fail) pauses twice as long */
        s->pause = s->next_pause;
        s->next_pause =
            s->next_pause * 2 < ZI_SPEC_MAX_PAUSE ? s->next_pause * 2 : ZI_SPEC_MAX_PAUSE;
        s->fails = ZI_SPEC_MAX_FAILS - 1;
        s->k = ZI_SPEC_START_DRAFT;
    }
}
