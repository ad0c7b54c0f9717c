/*
 * chat_template_arena.c - the bump allocator of the chat-template engine
 * (see ct_arena in chat_template_parse.h): a compiled template's tree and
 * everything one render makes are freed at once, and a render's arena
 * has a byte limit so that a hostile template cannot exhaust memory.
 */
#include "chat_template_parse.h"

#include <stdlib.h>
#include <string.h>

/* ---- arena ------------------------------------------------------------ */

struct ct_chunk {
    struct ct_chunk *next;
    size_t cap, used;
    max_align_t data[];
};

#define CT_CHUNK_MIN (64u * 1024u)

void ct_arena_init(ct_arena *a, size_t limit) {
    a->head = NULL;
    a->used = 0;
    a->limit = limit;
    a->refused = 0;
}

void ct_arena_free(ct_arena *a) {
    struct ct_chunk *c = a->head;
    while (c) {
        struct ct_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

void *ct_alloc(ct_arena *a, size_t n) {
    if (n == 0) n = 1;
    if (n > SIZE_MAX / 2) return NULL;
    n = (n + 15u) & ~(size_t)15u;
    if (a->limit && (n > a->limit || a->used > a->limit - n)) {
        a->refused = 1;
        return NULL;
    }
    struct ct_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > CT_CHUNK_MIN ? n : CT_CHUNK_MIN;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    a->used += n;
    return p;
}

void *ct_calloc(ct_arena *a, size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = ct_alloc(a, n * size);
    if (p) memset(p, 0, n * size);
    return p;
}
