/*
 * grammar_cache.c - the worker's LRU of compiled grammars (see
 * grammar_cache.h): a small array searched linearly (32 entries), keyed
 * by the kind of source and its text.
 */
#include "grammar_cache.h"

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "schema_grammar.h"

/* The constraint kinds a context carries: its source text, compiled as
 * kind says. */
enum { K_SCHEMA = 1, K_GBNF = 2, K_REGEX = 3 };

typedef struct {
    char *text; /* NULL: a free entry */
    size_t len;
    int kind; /* K_SCHEMA, K_GBNF or K_REGEX */
    zi_grammar *g;
    int refs;
    uint64_t used; /* the tick of its last get */
} entry;

/* A grammar compiled outside the cache (every entry in use). */
typedef struct loose {
    zi_grammar *g;
    struct loose *next;
} loose;

struct zi_grammar_cache {
    entry e[ZI_GRAMMAR_CACHE_ENTRIES];
    loose *outside;
    uint64_t tick;
    long hits, compiled;
};

int zi_grammar_cache_create(zi_grammar_cache **out, zi_error *err) {
    *out = calloc(1, sizeof **out);
    return *out ? ZI_OK : zi_error_set(err, ZI_ENOMEM, "out of memory");
}

void zi_grammar_cache_free(zi_grammar_cache *c) {
    if (!c) return;
    for (int i = 0; i < ZI_GRAMMAR_CACHE_ENTRIES; i++) {
        free(c->e[i].text);
        zi_grammar_free(c->e[i].g);
    }
    while (c->outside) {
        loose *l = c->outside;
        c->outside = l->next;
        zi_grammar_free(l->g);
        free(l);
    }
    free(c);
}

static int compile(int kind, const char *text, size_t len, zi_grammar **g, zi_error *err) {
    if (kind == K_GBNF) return zi_grammar_compile(text, len, g, err);
    zi_gbnf_buf b = {0};
    int rc;
    if (kind == K_REGEX) { /* the regex becomes the grammar of its texts */
        zi_gbnf_printf(&b, "root ::= ");
        rc = zi_regex_to_gbnf(text, len, ZI_REGEX_TEXT, &b, err);
        if (!rc) rc = zi_grammar_compile(b.p, b.n, g, err);
        if (rc) zi_error_prefix(err, "regex");
    } else { /* the schema's own errors name their place in it already */
        rc = len == strlen(ZI_JSON_OBJECT_SCHEMA) && !memcmp(text, ZI_JSON_OBJECT_SCHEMA, len)
                 ? zi_schema_any_object_gbnf(&b, err)
                 : zi_schema_to_gbnf(text, len, &b, err);
        if (!rc) {
            rc = zi_grammar_compile(b.p, b.n, g, err);
            if (rc) zi_error_prefix(err, "response_format.json_schema");
        }
    }
    free(b.p);
    return rc;
}

int zi_grammar_cache_get(zi_grammar_cache *c, const zi_text_context *ctx, const zi_grammar **out,
                         zi_error *err) {
    int kind = ctx->has_json_schema ? K_SCHEMA : ctx->regex.len ? K_REGEX : K_GBNF;
    const zi_string *src = kind == K_SCHEMA  ? &ctx->json_schema
                           : kind == K_REGEX ? &ctx->regex
                                             : &ctx->grammar;
    assert(zi_text_context_constrained(ctx));
    c->tick++;
    int victim = -1;
    for (int i = 0; i < ZI_GRAMMAR_CACHE_ENTRIES; i++) {
        entry *e = &c->e[i];
        if (e->text && e->kind == kind && e->len == src->len &&
            !memcmp(e->text, src->p, src->len)) {
            e->refs++, e->used = c->tick, c->hits++;
            *out = e->g;
            return ZI_OK;
        }
        if (!e->refs &&
            (victim < 0 || !e->text || (c->e[victim].text && e->used < c->e[victim].used)))
            victim = i;
    }
    zi_grammar *g = NULL;
    int rc = compile(kind, src->p, src->len, &g, err);
    if (rc) return rc;
    c->compiled++;
    char *text = victim >= 0 ? malloc(src->len + 1) : NULL;
    if (!text) { /* every entry in use (or no memory for the key): outside */
        loose *l = malloc(sizeof *l);
        if (!l) {
            zi_grammar_free(g);
            return zi_error_set(err, ZI_ENOMEM, "out of memory");
        }
        *l = (loose){g, c->outside};
        c->outside = l;
        *out = g;
        return ZI_OK;
    }
    memcpy(text, src->p, src->len);
    text[src->len] = 0;
    entry *e = &c->e[victim];
    free(e->text);
    zi_grammar_free(e->g);
    *e = (entry){.text = text, .len = src->len, .kind = kind, .g = g, .refs = 1, .used = c->tick};
    *out = g;
    return ZI_OK;
}

void zi_grammar_cache_put(zi_grammar_cache *c, const zi_grammar *g) {
    if (!g) return;
    for (int i = 0; i < ZI_GRAMMAR_CACHE_ENTRIES; i++)
        if (c->e[i].g == g) {
            assert(c->e[i].refs > 0);
            c->e[i].refs--;
            return;
        }
    for (loose **l = &c->outside; *l; l = &(*l)->next)
        if ((*l)->g == g) {
            loose *d = *l;
            *l = d->next;
            zi_grammar_free(d->g);
            free(d);
            return;
        }
    assert(!"zi_grammar_cache_put: a grammar not from this cache");
}

void zi_grammar_cache_stats(const zi_grammar_cache *c, long *hits, long *compiled) {
    *hits = c->hits, *compiled = c->compiled;
}
