/*
 * chat_stream.c - the reasoning splitter in front of tool_stream
 * (chat_stream.h). A small state machine over a buffer of held bytes: the
 * held bytes are those that may still be a marker or trimmed whitespace;
 * everything before them has been reported.
 */
#include "chat_stream.h"

#include <stdlib.h>
#include <string.h>

static const char OPEN[] = "<think>", CLOSE[] = "</think>";
#define OPEN_LEN (sizeof OPEN - 1)
#define CLOSE_LEN (sizeof CLOSE - 1)

typedef enum mode {
    M_START, /* at the text's start: a thinking section may open */
    M_THINK, /* inside the thinking section */
    M_AFTER, /* after it, dropping whitespace before the content */
    M_BODY,  /* content: all of it goes on */
} mode;

struct zi_chat_stream {
    mode m;
    int tools;      /* content goes through ts */
    int started;    /* M_THINK: reasoning (non-space) was reported */
    int maybe_open; /* M_THINK: an opening marker may still come first */
    zi_tool_stream ts;
    char *hold; /* bytes not yet reported */
    size_t n, cap;
};

static int sp(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* A stream for g, with tool calls parsed or not. */
static zi_chat_stream *make(const zi_http_gen *g, int tools) {
    zi_chat_stream *cs = calloc(1, sizeof *cs);
    if (!cs) return NULL;
    cs->tools = tools;
    if (cs->tools) zi_tool_stream_init(&cs->ts, g->tools.names);
    if (g->reasoning.format == ZI_REASONING_NONE)
        cs->m = M_BODY;
    else if (g->reasoning.open)
        cs->m = M_THINK, cs->maybe_open = 1;
    else
        cs->m = M_START;
    return cs;
}

zi_chat_stream *zi_chat_stream_new(const zi_http_gen *g) {
    return make(g, g->tools.choice != ZI_TOOLS_OFF);
}

void zi_chat_stream_free(zi_chat_stream *cs) {
    if (!cs) return;
    if (cs->tools) zi_tool_stream_free(&cs->ts);
    free(cs->hold);
    free(cs);
}

int zi_chat_stream_calls_ok(const zi_chat_stream *cs) {
    return cs->tools && zi_tool_stream_calls_ok(&cs->ts);
}

/* Content text onward: through tool_stream, or out as it is. */
static int content(zi_chat_stream *cs, const char *s, size_t n, zi_ts_emit emit, void *arg) {
    if (!n) return 0;
    if (cs->tools) return zi_tool_stream_feed(&cs->ts, s, n, emit, arg);
    zi_ts_event ev = {.kind = ZI_TS_CONTENT, .text = s, .len = n};
    return emit(arg, &ev);
}

static int reasoning(const char *s, size_t n, zi_ts_emit emit, void *arg) {
    if (!n) return 0;
    zi_ts_event ev = {.kind = ZI_TS_REASONING, .text = s, .len = n};
    return emit(arg, &ev);
}

/* Drops the first k held bytes. */
static void eat(zi_chat_stream *cs, size_t k) {
    memmove(cs->hold, cs->hold + k, cs->n - k);
    cs->n -= k;
}

/* 1 when s[0..n) is a proper prefix of marker m (n < its length). */
static int prefix_of(const char *s, size_t n, const char *m, size_t mlen) {
    return n < mlen && !memcmp(s, m, n);
}

/* The length of the longest suffix of s[0..n) that is a proper prefix of
 * the closing marker (it may complete later). */
static size_t close_tail(const char *s, size_t n) {
    for (size_t k = n < CLOSE_LEN - 1 ? n : CLOSE_LEN - 1; k > 0; k--)
        if (!memcmp(s + n - k, CLOSE, k)) return k;
    return 0;
}

/* Reports what the held bytes decide; final: no more text comes. */
static int step(zi_chat_stream *cs, int final, zi_ts_emit emit, void *arg) {
    for (;;) {
        switch (cs->m) {
        case M_START:
        case M_THINK: {
            if (cs->m == M_START || cs->maybe_open) {
                size_t w = 0;
                while (w < cs->n && sp(cs->hold[w])) w++;
                if (cs->n - w >= OPEN_LEN && !memcmp(cs->hold + w, OPEN, OPEN_LEN)) {
                    eat(cs, w + OPEN_LEN);
                    cs->m = M_THINK, cs->maybe_open = 0;
                    continue;
                }
                if (!final && prefix_of(cs->hold + w, cs->n - w, OPEN, OPEN_LEN)) return 0;
                if (cs->m == M_START) { /* no thinking section: all content */
                    cs->m = M_BODY;
                    continue;
                }
                cs->maybe_open = 0;
            }
            char *end = memmem(cs->hold, cs->n, CLOSE, CLOSE_LEN);
            size_t upto =
                end ? (size_t)(end - cs->hold) : cs->n - (final ? 0 : close_tail(cs->hold, cs->n));
            size_t a = 0, b = upto;
            if (!cs->started)
                while (a < b && sp(cs->hold[a])) a++;
            while (b > a && sp(cs->hold[b - 1])) b--;
            if (b > a) {
                cs->started = 1;
                int rc = reasoning(cs->hold + a, b - a, emit, arg);
                if (rc) return rc;
            }
            if (end) {
                eat(cs, upto + CLOSE_LEN);
                cs->m = M_AFTER;
                continue;
            }
            /* whitespace before a non-space (or the marker) waits; at
             * the end it is trimmed */
            eat(cs, final ? cs->n : b > a ? b : a);
            return 0;
        }
        case M_AFTER: {
            size_t w = 0;
            while (w < cs->n && sp(cs->hold[w])) w++;
            eat(cs, w);
            if (!cs->n) return 0;
            cs->m = M_BODY;
            continue;
        }
        case M_BODY: {
            int rc = content(cs, cs->hold, cs->n, emit, arg);
            cs->n = 0;
            return rc;
        }
        }
    }
}

int zi_chat_stream_feed(zi_chat_stream *cs, const char *text, size_t n, zi_ts_emit emit,
                        void *arg) {
    if (!n) return 0;
    if (cs->m == M_BODY && !cs->n) return content(cs, text, n, emit, arg);
    if (cs->n + n > cs->cap) {
        size_t c = cs->cap ? cs->cap : 64;
        while (c < cs->n + n) c *= 2;
        char *h = realloc(cs->hold, c);
        if (!h) return -1;
        cs->hold = h, cs->cap = c;
    }
    memcpy(cs->hold + cs->n, text, n);
    cs->n += n;
    return step(cs, 0, emit, arg);
}

int zi_chat_stream_finish(zi_chat_stream *cs, zi_ts_emit emit, void *arg) {
    int rc = step(cs, 1, emit, arg);
    if (!rc && cs->tools) rc = zi_tool_stream_finish(&cs->ts, emit, arg);
    return rc;
}

typedef struct split_out {
    char *s[2];
    size_t n[2], cap[2];
    int oom;
} split_out;

static int split_emit(void *arg, const zi_ts_event *ev) {
    split_out *o = arg;
    int k = ev->kind == ZI_TS_REASONING;
    if (o->n[k] + ev->len + 1 > o->cap[k]) {
        size_t c = o->cap[k] ? o->cap[k] : 64;
        while (c < o->n[k] + ev->len + 1) c *= 2;
        char *b = realloc(o->s[k], c);
        if (!b) return -1;
        o->s[k] = b, o->cap[k] = c;
    }
    memcpy(o->s[k] + o->n[k], ev->text, ev->len);
    o->n[k] += ev->len;
    o->s[k][o->n[k]] = '\0';
    return 0;
}

int zi_chat_stream_split(const zi_http_gen *g, const char *text, size_t len, char **reasoning,
                         size_t *rlen, char **content, size_t *clen) {
    *reasoning = *content = NULL;
    *rlen = *clen = 0;
    zi_chat_stream *cs = make(g, 0);
    if (!cs) return -1;
    split_out o = {0};
    int rc = zi_chat_stream_feed(cs, text, len, split_emit, &o);
    if (!rc) rc = zi_chat_stream_finish(cs, split_emit, &o);
    zi_chat_stream_free(cs);
    for (int k = 0; !rc && k < 2; k++)
        if (!o.s[k] && !(o.s[k] = calloc(1, 1))) rc = -1;
    if (rc) {
        free(o.s[0]);
        free(o.s[1]);
        return -1;
    }
    *content = o.s[0], *clen = o.n[0];
    *reasoning = o.s[1], *rlen = o.n[1];
    return 0;
}
