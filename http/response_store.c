/*
 * response_store.c - the bounded, least-recently-used store of Responses
 * API responses (response_store.h). A doubly linked list, most recent
 * first, searched linearly: --responses-store-max bounds it (options.c),
 * and one lookup per request is cheap next to generating.
 */
#include "response_store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    struct entry *prev, *next;
    char id[ZI_RESPONSE_ID_MAX + 1];
    char *response, *items;
    size_t bytes; /* what this entry counts against max_bytes */
} entry;

struct zi_response_store {
    pthread_mutex_t mu;
    entry *head, *tail; /* most and least recently used */
    size_t n, bytes;
    size_t max_entries, max_bytes;
};

zi_response_store *zi_response_store_new(size_t max_entries, size_t max_bytes) {
    zi_response_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (pthread_mutex_init(&s->mu, NULL)) {
        free(s);
        return NULL;
    }
    s->max_entries = max_entries;
    s->max_bytes = max_bytes;
    return s;
}

static void unlink_entry(zi_response_store *s, entry *x) {
    if (x->prev)
        x->prev->next = x->next;
    else
        s->head = x->next;
    if (x->next)
        x->next->prev = x->prev;
    else
        s->tail = x->prev;
    x->prev = x->next = NULL;
}

static void push_front(zi_response_store *s, entry *x) {
    x->prev = NULL;
    x->next = s->head;
    if (s->head) s->head->prev = x;
    s->head = x;
    if (!s->tail) s->tail = x;
}

static void drop(zi_response_store *s, entry *x) {
    unlink_entry(s, x);
    s->n--;
    s->bytes -= x->bytes;
    free(x->response);
    free(x->items);
    free(x);
}

static entry *find(zi_response_store *s, const char *id) {
    for (entry *x = s->head; x; x = x->next)
        if (!strcmp(x->id, id)) return x;
    return NULL;
}

void zi_response_store_free(zi_response_store *s) {
    if (!s) return;
    while (s->head) drop(s, s->head);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int zi_response_store_put(zi_response_store *s, const char *id, const char *response,
                          const char *items) {
    size_t idn = strlen(id), rn = strlen(response), in = strlen(items);
    size_t bytes = sizeof(entry) + rn + in + 2;
    if (idn > ZI_RESPONSE_ID_MAX || !s->max_entries || bytes > s->max_bytes) return 1;
    entry *x = calloc(1, sizeof *x);
    if (!x) return -1;
    x->response = malloc(rn + 1);
    x->items = malloc(in + 1);
    if (!x->response || !x->items) {
        free(x->response);
        free(x->items);
        free(x);
        return -1;
    }
    memcpy(x->id, id, idn + 1);
    memcpy(x->response, response, rn + 1);
    memcpy(x->items, items, in + 1);
    x->bytes = bytes;
    pthread_mutex_lock(&s->mu);
    entry *old = find(s, id);
    if (old) drop(s, old);
    push_front(s, x);
    s->n++;
    s->bytes += bytes;
    while (s->n > s->max_entries || s->bytes > s->max_bytes) drop(s, s->tail);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int zi_response_store_get(zi_response_store *s, const char *id, char **response, char **items) {
    if (response) *response = NULL;
    if (items) *items = NULL;
    pthread_mutex_lock(&s->mu);
    entry *x = find(s, id);
    if (!x) {
        pthread_mutex_unlock(&s->mu);
        return 1;
    }
    unlink_entry(s, x);
    push_front(s, x);
    int rc = 0;
    if (response && !(*response = strdup(x->response))) rc = -1;
    if (!rc && items && !(*items = strdup(x->items))) rc = -1;
    pthread_mutex_unlock(&s->mu);
    if (rc && response) {
        free(*response);
        *response = NULL;
    }
    return rc;
}

int zi_response_store_delete(zi_response_store *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    entry *x = find(s, id);
    int found = x != NULL;
    if (x) drop(s, x);
    pthread_mutex_unlock(&s->mu);
    return found ? 0 : 1;
}

void zi_response_store_usage(zi_response_store *s, size_t *entries, size_t *bytes) {
    pthread_mutex_lock(&s->mu);
    if (entries) *entries = s->n;
    if (bytes) *bytes = s->bytes;
    pthread_mutex_unlock(&s->mu);
}
