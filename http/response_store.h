/*
 * response_store.h - the responses zinfer-http keeps for OpenAI's
 * Responses API (docs/http.md, "Responses"): a request with `store: true`
 * leaves its response here, so `previous_response_id` can continue the
 * conversation and `GET` / `DELETE /v1/responses/{id}` can read or drop
 * it. Only in this process' memory (a restart forgets everything), and
 * bounded twice: at most max_entries responses and max_bytes bytes of
 * their texts; past either bound the least recently used ones (put or got
 * longest ago) are dropped. Thread safe: one mutex around every call
 * (libmicrohttpd runs one thread per connection).
 */
#ifndef ZI_RESPONSE_STORE_H
#define ZI_RESPONSE_STORE_H

#include <stddef.h>

/* The longest id kept ("resp_" and hex digits are far shorter). */
#define ZI_RESPONSE_ID_MAX 64

typedef struct zi_response_store zi_response_store;

/* An empty store with these bounds (0 entries or 0 bytes: nothing is ever
 * kept). NULL when out of memory. */
zi_response_store *zi_response_store_new(size_t max_entries, size_t max_bytes);
void zi_response_store_free(zi_response_store *s);

/* Keeps a copy of response (the response object's JSON text) and items
 * (the JSON text of the conversation's input items, earlier turns
 * included) under id, replacing an entry of that id, then drops the least
 * recently used entries until both bounds hold. 0 kept; 1 not kept (larger
 * than max_bytes alone, or the store keeps nothing, or id too long); -1
 * out of memory. */
int zi_response_store_put(zi_response_store *s, const char *id, const char *response,
                          const char *items);

/* Copies of id's texts (malloc'd; either pointer may be NULL when not
 * wanted), the entry becoming the most recently used. 0, 1 when id is not
 * (or no longer) kept, -1 out of memory. */
int zi_response_store_get(zi_response_store *s, const char *id, char **response, char **items);

/* Drops id's entry. 0, or 1 when it is not kept. */
int zi_response_store_delete(zi_response_store *s, const char *id);

/* How many entries and bytes are kept now (for tests and logs). */
void zi_response_store_usage(zi_response_store *s, size_t *entries, size_t *bytes);

#endif
