/*
 * chat_stream.c - the reasoning splitter in front of tool_stream
 * (chat_stream.h). A small state machine over a buffer of held bytes: the
 * held bytes are those that may still be a marker or trimmed whitespace;
 * everything before them has been reported. gpt-oss's harmony messages
 * are a second machine: a header up to <|message|>, then a body up to
 * the next marker.
 */
#include "chat_stream.h"

#include <stdio.h>
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
    M_HEAD,  /* harmony: a message's header, up to <|message|> */
    M_MSG,   /* harmony: a message's body */
} mode;

/* Harmony's markers (as the tokenizer decodes gpt-oss's tokens). */
static const char H_CHANNEL[] = "<|channel|>", H_START[] = "<|start|>", H_MESSAGE[] = "<|message|>";
/* What ends a body: <|end|>, or the end of generation's <|call|> and
 * <|return|> should they be text, or a new message's header. */
static const char *const H_ENDS[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>",
                                     "<|channel|>"};
#define H_HEAD_MAX 512 /* a longer header is no harmony header: content */

/* Where a harmony body goes. */
enum { B_REASONING, B_CONTENT, B_CALL };

struct zi_chat_stream {
    mode m;
    int tools;      /* content goes through ts */
    int started;    /* M_THINK: reasoning (non-space) was reported */
    int maybe_open; /* M_THINK: an opening marker may still come first */
    zi_tool_stream ts;
    char *hold; /* bytes not yet reported */
    size_t n, cap;
    /* harmony */
    const json_t *names; /* the tools' names (with tools) */
    int body;            /* M_MSG: B_* */
    int n_calls, bad_calls;
    char *args; /* the current call's arguments, checked at its end */
    size_t alen, acap;
};

static int sp(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* A stream for g, with tool calls parsed or not. */
static zi_chat_stream *make(const zi_http_gen *g, int tools) {
    zi_chat_stream *cs = calloc(1, sizeof *cs);
    if (!cs) return NULL;
    cs->tools = tools;
    if (cs->tools) {
        zi_tool_stream_init(&cs->ts, g->tools.names, zi_http_tools_format(&g->tools));
        zi_tool_stream_types(&cs->ts, g->tools.tools);
    }
    cs->names = tools ? g->tools.names : NULL;
    if (g->reasoning.format == ZI_REASONING_NONE)
        cs->m = M_BODY;
    else if (g->reasoning.open == 2) /* the prompt opened harmony's analysis channel */
        cs->m = M_MSG, cs->body = B_REASONING;
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
    free(cs->args);
    free(cs);
}

int zi_chat_stream_calls_ok(const zi_chat_stream *cs) {
    if (cs->n_calls) return !cs->bad_calls; /* harmony's */
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

static int starts(const char *s, size_t n, const char *m) {
    size_t k = strlen(m);
    return n >= k && !memcmp(s, m, k);
}

/* The length of the longest suffix of s[0..n) that may still become a
 * harmony marker ("<|" and letters, not yet closed). */
static size_t marker_tail(const char *s, size_t n) {
    for (size_t k = n < 12 ? n : 12; k > 0; k--) {
        const char *t = s + n - k;
        if (t[0] != '<') continue;
        for (size_t j = 0; j < sizeof H_ENDS / sizeof *H_ENDS; j++)
            if (k < strlen(H_ENDS[j]) && !memcmp(t, H_ENDS[j], k)) return k;
    }
    return 0;
}

/* A harmony message's header h[0..n) ("<|channel|>analysis", or
 * "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather
 * <|constrain|>json"): where its body goes. A call to a known tool starts
 * the call. */
static int harmony_header(zi_chat_stream *cs, const char *h, size_t n, zi_ts_emit emit, void *arg) {
    char channel[32] = "", name[ZI_TS_NAME_MAX + 1] = "";
    const char *c = NULL;
    for (const char *p = h; (p = memmem(p, (size_t)(h + n - p), H_CHANNEL, sizeof H_CHANNEL - 1));
         p++)
        c = p + sizeof H_CHANNEL - 1; /* the last one */
    for (size_t k = 0; c && c + k < h + n && k + 1 < sizeof channel &&
                       ((c[k] >= 'a' && c[k] <= 'z') || c[k] == '_');
         k++)
        channel[k] = c[k], channel[k + 1] = '\0';
    const char *to = memmem(h, n, "to=functions.", 13);
    if (to) {
        to += 13;
        size_t k = 0;
        while (to + k < h + n && !sp(to[k]) && to[k] != '<' && k < ZI_TS_NAME_MAX) k++;
        memcpy(name, to, k);
        name[k] = '\0';
    }
    int known = 0;
    size_t i;
    json_t *x;
    json_array_foreach(cs->names, i, x) known |= name[0] && !strcmp(json_string_value(x), name);
    cs->body = !strcmp(channel, "analysis") ? B_REASONING : B_CONTENT;
    if (!known) return 0;
    cs->body = B_CALL;
    cs->alen = 0;
    char id[ZI_TS_ID_LEN + 1];
    zi_tool_call_id(id, (unsigned)cs->n_calls);
    zi_ts_event ev = {
        .kind = ZI_TS_CALL, .index = cs->n_calls++, .id = id, .text = name, .len = strlen(name)};
    return emit(arg, &ev);
}

/* A harmony body's next n bytes, where the header said. */
static int harmony_body(zi_chat_stream *cs, const char *s, size_t n, zi_ts_emit emit, void *arg) {
    if (!n) return 0;
    if (cs->body == B_REASONING) return reasoning(s, n, emit, arg);
    if (cs->body == B_CONTENT) {
        zi_ts_event ev = {.kind = ZI_TS_CONTENT, .text = s, .len = n};
        return emit(arg, &ev);
    }
    if (cs->alen + n > cs->acap) {
        size_t c = cs->acap ? cs->acap : 64;
        while (c < cs->alen + n) c *= 2;
        char *a = realloc(cs->args, c);
        if (!a) return -1;
        cs->args = a, cs->acap = c;
    }
    memcpy(cs->args + cs->alen, s, n);
    cs->alen += n;
    zi_ts_event ev = {.kind = ZI_TS_ARGS, .index = cs->n_calls - 1, .text = s, .len = n};
    return emit(arg, &ev);
}

/* A harmony call ended: its arguments must be a JSON object. */
static void check_call(zi_chat_stream *cs) {
    json_t *v = json_loadb(cs->args ? cs->args : "", cs->alen, 0, NULL);
    if (!json_is_object(v)) cs->bad_calls = 1;
    json_decref(v);
    cs->body = B_CONTENT;
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
                if (cs->m == M_START && (starts(cs->hold + w, cs->n - w, H_CHANNEL) ||
                                         starts(cs->hold + w, cs->n - w, H_START))) {
                    eat(cs, w); /* gpt-oss: harmony messages */
                    cs->m = M_HEAD;
                    continue;
                }
                if (cs->m == M_START && !final &&
                    (prefix_of(cs->hold + w, cs->n - w, H_CHANNEL, sizeof H_CHANNEL - 1) ||
                     prefix_of(cs->hold + w, cs->n - w, H_START, sizeof H_START - 1)))
                    return 0;
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
        case M_HEAD: {
            char *msg = memmem(cs->hold, cs->n, H_MESSAGE, sizeof H_MESSAGE - 1);
            if (!msg) {
                if (final) { /* a header cut short says nothing */
                    cs->n = 0;
                    return 0;
                }
                if (cs->n <= H_HEAD_MAX) return 0;
                cs->m = M_BODY; /* no harmony after all */
                continue;
            }
            size_t hl = (size_t)(msg - cs->hold);
            int rc = harmony_header(cs, cs->hold, hl, emit, arg);
            if (rc) return rc;
            eat(cs, hl + sizeof H_MESSAGE - 1);
            cs->m = M_MSG;
            continue;
        }
        case M_MSG: {
            size_t end = cs->n, tail = 0;
            for (size_t k = 0; k < sizeof H_ENDS / sizeof *H_ENDS; k++) {
                char *at = memmem(cs->hold, end, H_ENDS[k], strlen(H_ENDS[k]));
                if (at) end = (size_t)(at - cs->hold);
            }
            int found = end < cs->n;
            if (!found && !final) tail = marker_tail(cs->hold, cs->n);
            int rc = harmony_body(cs, cs->hold, end - tail, emit, arg);
            if (rc) return rc;
            eat(cs, end - tail);
            if (!found && !final) return 0;
            if (cs->body == B_CALL) check_call(cs);
            if (!found) return 0;
            cs->m = M_HEAD;
            continue;
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
    char *s[2]; /* content, reasoning */
    size_t n[2], cap[2];
    json_t *calls; /* OpenAI's tool calls */
    char *args;    /* the last call's arguments so far */
    size_t alen, acap;
} split_out;

static int add(char **b, size_t *n, size_t *cap, const char *s, size_t k) {
    if (*n + k + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *n + k + 1) c *= 2;
        char *p = realloc(*b, c);
        if (!p) return -1;
        *b = p, *cap = c;
    }
    memcpy(*b + *n, s, k);
    *n += k;
    (*b)[*n] = '\0';
    return 0;
}

/* The last call's arguments into its "function". */
static int close_args(split_out *o) {
    size_t k = json_array_size(o->calls);
    if (!k) return 0;
    json_t *fn = json_object_get(json_array_get(o->calls, k - 1), "function");
    int rc = json_object_set_new(fn, "arguments", json_stringn(o->args ? o->args : "", o->alen));
    o->alen = 0;
    return rc;
}

static int split_emit(void *arg, const zi_ts_event *ev) {
    split_out *o = arg;
    switch (ev->kind) {
    case ZI_TS_CONTENT:
    case ZI_TS_REASONING: {
        int k = ev->kind == ZI_TS_REASONING;
        return add(&o->s[k], &o->n[k], &o->cap[k], ev->text, ev->len);
    }
    case ZI_TS_CALL:
        if (close_args(o)) return -1;
        return json_array_append_new(o->calls, json_pack("{s:s, s:s, s:{s:s%, s:s}}", "id", ev->id,
                                                         "type", "function", "function", "name",
                                                         ev->text, ev->len, "arguments", ""));
    case ZI_TS_ARGS:
        return add(&o->args, &o->alen, &o->acap, ev->text, ev->len);
    }
    return -1;
}

/* Runs text through a stream (with tools or not) into o; 1 when calls
 * were made and are whole, 0 when not, -1 out of memory. */
static int split_run(const zi_http_gen *g, int tools, const char *text, size_t len, split_out *o) {
    memset(o, 0, sizeof *o);
    zi_chat_stream *cs = make(g, tools);
    if (!cs || !(o->calls = json_array())) {
        zi_chat_stream_free(cs);
        return -1;
    }
    int rc = zi_chat_stream_feed(cs, text, len, split_emit, o);
    if (!rc) rc = zi_chat_stream_finish(cs, split_emit, o);
    if (!rc) rc = close_args(o);
    int ok = zi_chat_stream_calls_ok(cs);
    zi_chat_stream_free(cs);
    for (int k = 0; !rc && k < 2; k++)
        if (!o->s[k] && !(o->s[k] = calloc(1, 1))) rc = -1;
    return rc ? -1 : ok;
}

static void split_free(split_out *o) {
    free(o->s[0]);
    free(o->s[1]);
    free(o->args);
    json_decref(o->calls);
}

int zi_chat_stream_split(const zi_http_gen *g, const char *text, size_t len, char **reasoning,
                         size_t *rlen, char **content, size_t *clen, json_t **calls) {
    *reasoning = *content = NULL;
    *rlen = *clen = 0;
    *calls = NULL;
    split_out o;
    int tools = g->tools.choice != ZI_TOOLS_OFF;
    int rc = split_run(g, tools, text, len, &o);
    if (rc == 0 && tools) { /* no calls, or broken ones: the text is content */
        split_free(&o);
        rc = split_run(g, 0, text, len, &o);
    }
    if (rc < 0) {
        split_free(&o);
        return -1;
    }
    if (rc == 1) {
        *calls = o.calls;
        o.calls = NULL;
    }
    *content = o.s[0], *clen = o.n[0];
    *reasoning = o.s[1], *rlen = o.n[1];
    o.s[0] = o.s[1] = NULL;
    split_free(&o);
    return 0;
}
