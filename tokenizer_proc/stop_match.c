/*
 * stop_match.c - stop strings over a stream of text (see stop_match.h).
 */
#include "stop_match.h"

#include <stdlib.h>
#include <string.h>

static int append(char **buf, size_t *len, size_t *cap, const char *s, size_t n, zi_error *err) {
    if (n == 0) return ZI_OK;
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1) c *= 2;
        char *p = realloc(*buf, c);
        if (!p) return zi_error_set(err, ZI_ENOMEM, "out of memory for stop-string text");
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return ZI_OK;
}

/* Appends to a caller buffer whose capacity is not tracked: grow to fit. */
static int append_out(char **out, size_t *out_len, const char *s, size_t n, zi_error *err) {
    if (n == 0) return ZI_OK;
    char *p = realloc(*out, *out_len + n + 1);
    if (!p) return zi_error_set(err, ZI_ENOMEM, "out of memory for decoded text");
    memcpy(p + *out_len, s, n);
    *out_len += n;
    p[*out_len] = '\0';
    *out = p;
    return ZI_OK;
}

int zi_stop_init(zi_stop_matcher *m, const char *const *stops, const size_t *lens, size_t n,
                 zi_error *err) {
    memset(m, 0, sizeof *m);
    m->matched = -1;
    if (n == 0) return ZI_OK;
    m->stops = calloc(n, sizeof *m->stops);
    m->lens = calloc(n, sizeof *m->lens);
    if (!m->stops || !m->lens) goto oom;
    for (size_t i = 0; i < n; i++) {
        if (lens[i] == 0) continue;
        char *c = malloc(lens[i] + 1);
        if (!c) goto oom;
        memcpy(c, stops[i], lens[i]);
        c[lens[i]] = '\0';
        m->stops[m->n] = c;
        m->lens[m->n] = lens[i];
        m->n++;
    }
    return ZI_OK;
oom:
    zi_stop_free(m);
    return zi_error_set(err, ZI_ENOMEM, "out of memory for stop strings");
}

void zi_stop_free(zi_stop_matcher *m) {
    for (size_t i = 0; m->stops && i < m->n; i++) free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    free(m->held);
    memset(m, 0, sizeof *m);
}

/* Length of the longest proper suffix of held that is a prefix of a stop. */
static size_t partial_suffix(const zi_stop_matcher *m) {
    size_t best = 0;
    for (size_t i = 0; i < m->n; i++) {
        size_t max = m->lens[i] - 1 < m->held_len ? m->lens[i] - 1 : m->held_len;
        for (size_t k = max; k > best; k--) {
            if (memcmp(m->held + m->held_len - k, m->stops[i], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

int zi_stop_feed(zi_stop_matcher *m, const char *text, size_t len, char **out, size_t *out_len,
                 bool *stopped, zi_error *err) {
    *stopped = m->stopped;
    if (m->stopped) return ZI_OK;
    if (m->n == 0) return append_out(out, out_len, text, len, err);
    int rc = append(&m->held, &m->held_len, &m->held_cap, text, len, err);
    if (rc) return rc;
    /* The earliest occurrence of any stop string wins. */
    size_t cut = m->held_len;
    for (size_t i = 0; i < m->n; i++) {
        const char *p = memmem(m->held, m->held_len, m->stops[i], m->lens[i]);
        if (p && (size_t)(p - m->held) < cut) cut = (size_t)(p - m->held), m->matched = (int)i;
    }
    if (cut < m->held_len) {
        rc = append_out(out, out_len, m->held, cut, err);
        if (rc) return rc;
        m->held_len = 0;
        m->stopped = true;
        *stopped = true;
        return ZI_OK;
    }
    size_t keep = partial_suffix(m);
    rc = append_out(out, out_len, m->held, m->held_len - keep, err);
    if (rc) return rc;
    memmove(m->held, m->held + m->held_len - keep, keep);
    m->held_len = keep;
    return ZI_OK;
}

int zi_stop_flush(zi_stop_matcher *m, char **out, size_t *out_len, zi_error *err) {
    if (m->stopped || m->held_len == 0) return ZI_OK;
    int rc = append_out(out, out_len, m->held, m->held_len, err);
    m->held_len = 0;
    return rc;
}

int zi_stop_pass(zi_stop_matcher *m, const char *text, size_t len, char **out, size_t *out_len,
                 zi_error *err) {
    if (m->stopped) return ZI_OK;
    int rc = zi_stop_flush(m, out, out_len, err);
    return rc ? rc : append_out(out, out_len, text, len, err);
}
