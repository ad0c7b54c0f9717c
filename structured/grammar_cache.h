/*
 * grammar_cache.h - a worker's compiled grammars, cached by their source
 * text, so a schema or grammar sent again is not translated and compiled
 * again (each request needs its grammar twice besides: at admission, to
 * refuse a bad one, and for its slot).
 *
 * A source is a context's constraint: a JSON schema's text
 * (response_format json_schema; ZI_JSON_OBJECT_SCHEMA for json_object,
 * any object), GBNF text (the grammar key) or a regular expression (the
 * regex key). Schemas and regexes become GBNF (schema_grammar.h,
 * regex_grammar.h), then a zi_grammar (grammar.h).
 *
 * A bounded LRU of ZI_GRAMMAR_CACHE_ENTRIES grammars: a grammar in use is
 * counted (zi_grammar_cache_get / _put) and never evicted; when every
 * entry is in use a grammar is compiled outside the cache and freed by
 * its last put. Single-threaded, like the worker.
 */
#ifndef ZI_GRAMMAR_CACHE_H
#define ZI_GRAMMAR_CACHE_H

#include <stddef.h>

#include "grammar.h"
#include "types.h"
#include "zi_error.h"

#define ZI_GRAMMAR_CACHE_ENTRIES 32

typedef struct zi_grammar_cache zi_grammar_cache;

int zi_grammar_cache_create(zi_grammar_cache **out, zi_error *err);
void zi_grammar_cache_free(zi_grammar_cache *c); /* every grammar must have been put back */

/* The compiled constraint of context ctx (its json_schema, grammar or
 * regex; the context has one), from the cache or compiled now, counted in use until
 * zi_grammar_cache_put. Errors as zi_schema_to_gbnf and zi_grammar_compile
 * give them (a grammar made from a schema that grammar.h refuses is
 * prefixed "response_format.json_schema: "). */
int zi_grammar_cache_get(zi_grammar_cache *c, const zi_text_context *ctx, const zi_grammar **out,
                         zi_error *err);

/* Gives back a grammar from zi_grammar_cache_get (NULL: nothing). */
void zi_grammar_cache_put(zi_grammar_cache *c, const zi_grammar *g);

/* Cache hits and compilations so far (for tests and logs). */
void zi_grammar_cache_stats(const zi_grammar_cache *c, long *hits, long *compiled);

#endif
