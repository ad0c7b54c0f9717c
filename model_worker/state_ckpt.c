/*
 * state_ckpt.c - see state_ckpt.h.
 */
#include "state_ckpt.h"

#include <stdlib.h>
#include <string.h>

typedef struct ckpt {
    int64_t len; /* 0: free */
    uint64_t hash;
    int32_t *tokens; /* [len] */
    uint64_t used;   /* the table's clock when last found or taken */
    int owner, kind; /* owner -1: none */
} ckpt;

struct zi_state_ckpts {
    int n;
    ckpt *c;
    uint64_t clock;
};

int zi_state_ckpts_create(int n, zi_state_ckpts **out, zi_error *err) {
    zi_state_ckpts *t = calloc(1, sizeof *t);
    if (t) t->c = calloc((size_t)(n > 0 ? n : 1), sizeof *t->c);
    if (!t || !t->c) {
        free(t);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for %d state checkpoints", n);
    }
    t->n = n;
    for (int i = 0; i < n; i++) t->c[i].owner = -1;
    *out = t;
    return ZI_OK;
}

void zi_state_ckpts_free(zi_state_ckpts *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) free(t->c[i].tokens);
    free(t->c);
    free(t);
}

int zi_state_ckpts_count(const zi_state_ckpts *t) {
    return t->n;
}

static int same(const ckpt *c, uint64_t hash, const int32_t *tokens, int64_t len) {
    return c->len == len && c->hash == hash &&
           memcmp(c->tokens, tokens, (size_t)len * sizeof *tokens) == 0;
}

int zi_state_ckpts_find(zi_state_ckpts *t, uint64_t hash, const int32_t *tokens, int64_t len) {
    for (int i = 0; i < t->n; i++)
        if (len > 0 && same(&t->c[i], hash, tokens, len)) {
            t->c[i].used = ++t->clock;
            return i;
        }
    return -1;
}

int zi_state_ckpts_take(zi_state_ckpts *t, int owner, int kind, uint64_t hash,
                        const int32_t *tokens, int64_t len) {
    if (len <= 0 || t->n == 0) return -1;
    int pick = -1;
    for (int i = 0; i < t->n && pick < 0; i++)
        if (same(&t->c[i], hash, tokens, len)) pick = i;
    for (int i = 0; i < t->n && pick < 0; i++)
        if (t->c[i].len && t->c[i].owner == owner && t->c[i].kind == kind) pick = i;
    for (int i = 0; i < t->n && pick < 0; i++)
        if (!t->c[i].len) pick = i;
    if (pick < 0) { /* the least recently used, another owner's current ones last */
        uint64_t best = UINT64_MAX;
        for (int pass = 0; pass < 2 && pick < 0; pass++)
            for (int i = 0; i < t->n; i++) {
                const ckpt *c = &t->c[i];
                if (pass == 0 && c->owner >= 0 && c->owner != owner) continue;
                if (c->used < best) best = c->used, pick = i;
            }
    }
    ckpt *c = &t->c[pick];
    /* the row another owner took of this prefix becomes the caller's: its
     * own older one of the kind is then no longer its */
    for (int i = 0; i < t->n; i++)
        if (i != pick && t->c[i].owner == owner && t->c[i].kind == kind) t->c[i].owner = -1;
    if (!same(c, hash, tokens, len)) {
        int32_t *tk = realloc(c->tokens, (size_t)len * sizeof *tk);
        if (!tk) return -1;
        memcpy(tk, tokens, (size_t)len * sizeof *tk);
        c->tokens = tk, c->len = len, c->hash = hash;
    }
    c->owner = owner, c->kind = kind, c->used = ++t->clock;
    return pick;
}

void zi_state_ckpts_drop(zi_state_ckpts *t, int row) {
    ckpt *c = &t->c[row];
    c->len = 0, c->hash = 0, c->owner = -1, c->used = 0;
}

void zi_state_ckpts_disown(zi_state_ckpts *t, int owner) {
    for (int i = 0; i < t->n; i++)
        if (t->c[i].owner == owner) t->c[i].owner = -1;
}
