/*
 * tool_stream.c - incremental parser of a model's tool calls
 * (tool_stream.h). The text is kept whole; a call region is scanned again
 * from its start each time text arrives (regions are short), and what the
 * scan shows certain beyond what was already sent is reported.
 */
#include "tool_stream.h"

#include <assert.h>
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static int sp(char c) {
    return isspace((unsigned char)c);
}

static void skip_ws(const char *s, size_t n, size_t *i) {
    while (*i < n && sp(s[*i])) (*i)++;
}

/* The end of s[from..to) without a UTF-8 character cut at `to`. */
static size_t utf8_cut(const char *s, size_t from, size_t to) {
    size_t k = to;
    for (int back = 0; back < 4 && k > from; back++) {
        unsigned char c = (unsigned char)s[k - 1];
        if (c < 0x80) return to;
        if (c >= 0xC0) {
            size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            return to - (k - 1) >= need ? to : k - 1;
        }
        k--;
    }
    return to;
}

static int emit_ev(zi_ts_emit emit, void *arg, zi_ts_kind kind, int index, const char *id,
                   const char *text, size_t len) {
    if (!len && kind != ZI_TS_CALL) return 0;
    zi_ts_event ev = {.kind = kind, .index = index, .id = id, .text = text, .len = len};
    return emit(arg, &ev);
}

static int valid_args(const char *s, size_t n) {
    json_t *v = json_loadb(s, n, 0, NULL);
    int ok = json_is_object(v);
    json_decref(v);
    return ok;
}

void zi_tool_call_id(char out[ZI_TS_ID_LEN + 1], unsigned salt) {
    static const char ALNUM[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char rnd[32];
    int k = 0;
    /* Bytes under 248 (= 4 * 62) map evenly onto the 62 characters. */
    while (k < ZI_TS_ID_LEN) {
        if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) {
            /* No entropy (never on Linux >= 3.17 with a seeded pool): still
             * distinct ids within a text, which is what templates match. */
            for (size_t b = 0; b < sizeof rnd; b++) rnd[b] = (unsigned char)((salt + 1) * 37 + b);
        }
        for (size_t b = 0; b < sizeof rnd && k < ZI_TS_ID_LEN; b++)
            if (rnd[b] < 248) out[k++] = ALNUM[rnd[b] % 62];
    }
    out[ZI_TS_ID_LEN] = '\0';
}

/* Scans the current region and reports its progress; *more when it waits
 * for text. */
static int step_region(zi_tool_stream *ts, zi_ts_emit emit, void *arg, int *more) {
    zi_tf_scan *sc = calloc(1, sizeof *sc);
    if (!sc) return -1;
    sc->s = ts->buf, sc->n = ts->len, sc->final = ts->final;
    sc->names = ts->names, sc->tools = ts->tools;
    int r = zi_tf_scan_region(sc, ts->kind, ts->json_from), rc = sc->oom ? -1 : 0;
    size_t resume = ts->len; /* where the text goes on should a sent call break */
    for (int k = 0; k < sc->ncalls && !rc; k++) {
        zi_tf_call *c = &sc->calls[k];
        if (!c->has_name || !c->has_args) break;
        if (k == ts->region_started) {
            char id[ZI_TS_ID_LEN + 1];
            zi_tool_call_id(id, (unsigned)ts->n_calls);
            ts->region_started++, ts->n_calls++;
            ts->args_sent = 0;
            rc = emit_ev(emit, arg, ZI_TS_CALL, ts->region_base + k, id, c->name, strlen(c->name));
        }
        const char *a;
        size_t alen;
        int whole = zi_tf_call_args(sc, c, &a, &alen);
        if (!rc && k == ts->region_started - 1) {
            size_t to = whole || ts->final ? alen : utf8_cut(a, ts->args_sent, alen);
            assert(to >= ts->args_sent);
            rc = emit_ev(emit, arg, ZI_TS_ARGS, ts->region_base + k, NULL, a + ts->args_sent,
                         to - ts->args_sent);
            ts->args_sent = to;
            resume = c->written ? sc->fail_at : c->args_from + to;
        }
        if (whole && k == ts->region_checked) {
            ts->region_checked++;
            if (!valid_args(a, alen)) {
                r = ZI_TF_FAIL; /* sent already: the stream is broken */
                break;
            }
        }
    }
    size_t end = sc->end;
    zi_tf_scan_clear(sc);
    free(sc);
    if (rc) return rc;
    *more = 0;
    if (r == ZI_TF_MORE && !ts->final) {
        *more = 1;
        return 0;
    }
    ts->in_region = 0;
    if (r == ZI_TF_DONE) {
        ts->pos = end;
    } else if (ts->region_started) { /* committed: the rest goes on as content */
        if (r == ZI_TF_FAIL)
            ts->broken = 1, ts->pos = resume > ts->pos && resume <= ts->len ? resume : ts->len;
        else
            ts->truncated = 1, ts->pos = ts->len;
    } else { /* never a call: its text is content, the marker literal */
        ts->pos = ts->ws_before;
        ts->literal_at = ts->marker_from;
    }
    return 0;
}

static void open_region(zi_tool_stream *ts, int kind, size_t ws_before, size_t marker_from,
                        size_t json_from) {
    ts->in_region = 1, ts->kind = kind;
    ts->ws_before = ws_before, ts->marker_from = marker_from, ts->json_from = json_from;
    ts->region_base = ts->n_calls;
    ts->region_started = ts->region_checked = 0;
    ts->pos = ws_before;
}

/* The start of the text: the format's check there (Mistral / Llama 3
 * markers or bare JSON; Functionary's first recipient). 1 when it waits
 * for text. */
static int step_start(zi_tool_stream *ts) {
    size_t j = ts->pos, body;
    skip_ws(ts->buf, ts->len, &j);
    int kind, r = zi_tf_start(ts->format, ts->buf, ts->len, j, ts->final, &kind, &body);
    if (r == ZI_TF_MORE) return 1;
    ts->start_done = 1;
    if (r == ZI_TF_DONE) open_region(ts, kind, ts->pos, j, body);
    return 0;
}

/* Content from pos: sent up to a held whitespace run or opener prefix; an
 * opener opens a region. *more when it waits for text. */
static int step_content(zi_tool_stream *ts, zi_ts_emit emit, void *arg, int *more) {
    const char *s = ts->buf;
    size_t n = ts->len, ws0 = SIZE_MAX, i;
    const zi_tf_opener *op = zi_tf_openers(ts->format), *found = NULL;
    int hold = 0;
    for (i = ts->pos; i < n && !found && !hold; i++) {
        if (sp(s[i])) {
            if (ws0 == SIZE_MAX) ws0 = i;
            continue;
        }
        if (i != ts->literal_at)
            for (const zi_tf_opener *o = op; o->marker && !found; o++) {
                size_t ol = strlen(o->marker), avail = n - i;
                if (s[i] != o->marker[0]) continue;
                if (avail >= ol && !memcmp(s + i, o->marker, ol))
                    found = o;
                else if (avail < ol && !memcmp(s + i, o->marker, avail) && !ts->final)
                    hold = 1;
            }
        if (found || hold) break;
        ws0 = SIZE_MAX;
    }
    size_t to = ws0 != SIZE_MAX ? ws0 : i;
    if (i == n && ts->final && !ts->n_calls) to = n; /* no calls: the text as it came */
    if (i == n && !ts->final && ws0 == SIZE_MAX) to = utf8_cut(s, ts->pos, n);
    int rc = emit_ev(emit, arg, ZI_TS_CONTENT, 0, NULL, s + ts->pos, to - ts->pos);
    ts->pos = i == n && ts->final ? n : to;
    *more = !found;
    if (found) open_region(ts, found->kind, to, i, i + strlen(found->marker));
    return rc;
}

static int step(zi_tool_stream *ts, zi_ts_emit emit, void *arg) {
    for (;;) {
        int rc = 0, more = 0;
        if (ts->in_region)
            rc = step_region(ts, emit, arg, &more);
        else if (!ts->start_done)
            more = step_start(ts);
        else
            rc = step_content(ts, emit, arg, &more);
        if (rc || more) return rc;
    }
}

void zi_tool_stream_init(zi_tool_stream *ts, const json_t *names, zi_tool_format format) {
    memset(ts, 0, sizeof *ts);
    ts->names = names;
    ts->format = zi_tool_format_parser(format);
    ts->literal_at = SIZE_MAX;
}

void zi_tool_stream_free(zi_tool_stream *ts) {
    free(ts->buf);
    memset(ts, 0, sizeof *ts);
}

int zi_tool_stream_feed(zi_tool_stream *ts, const char *text, size_t n, zi_ts_emit emit,
                        void *arg) {
    assert(!ts->final);
    if (ts->len + n + 1 > ts->cap) {
        size_t c = ts->cap ? ts->cap : 256;
        while (c < ts->len + n + 1) c *= 2;
        char *b = realloc(ts->buf, c);
        if (!b) return -1;
        ts->buf = b, ts->cap = c;
    }
    if (n) memcpy(ts->buf + ts->len, text, n);
    ts->len += n;
    ts->buf[ts->len] = '\0';
    return step(ts, emit, arg);
}

int zi_tool_stream_finish(zi_tool_stream *ts, zi_ts_emit emit, void *arg) {
    if (!ts->buf && zi_tool_stream_feed(ts, "", 0, emit, arg)) return -1;
    ts->final = 1;
    int rc = step(ts, emit, arg);
    assert(rc || (ts->pos == ts->len && !ts->in_region));
    return rc;
}

int zi_tool_stream_calls_ok(const zi_tool_stream *ts) {
    return ts->n_calls > 0 && !ts->broken && !ts->truncated;
}

/* ---- the whole text at once --------------------------------------------- */

typedef struct collect {
    json_t *calls;
    char *args, *content; /* the last call's arguments so far; the content */
    size_t alen, acap, clen, ccap;
} collect;

static int add(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1) c *= 2;
        char *p = realloc(*b, c);
        if (!p) return -1;
        *b = p, *cap = c;
    }
    memcpy(*b + *len, s, n);
    (*b)[ *len += n] = '\0';
    return 0;
}

/* The last call's arguments into its object. */
static int close_args(collect *c) {
    size_t k = json_array_size(c->calls);
    if (!k) return 0;
    json_t *fn = json_object_get(json_array_get(c->calls, k - 1), "function");
    int rc = json_object_set_new(fn, "arguments", json_stringn(c->args ? c->args : "", c->alen));
    c->alen = 0;
    return rc;
}

static int collect_event(void *arg, const zi_ts_event *ev) {
    collect *c = arg;
    switch (ev->kind) {
    case ZI_TS_CONTENT:
        return add(&c->content, &c->clen, &c->ccap, ev->text, ev->len);
    case ZI_TS_CALL:
        if (close_args(c)) return -1;
        return json_array_append_new(c->calls, json_pack("{s:s, s:s, s:{s:s%, s:s}}", "id", ev->id,
                                                         "type", "function", "function", "name",
                                                         ev->text, ev->len, "arguments", ""));
    case ZI_TS_ARGS:
        return add(&c->args, &c->alen, &c->acap, ev->text, ev->len);
    case ZI_TS_REASONING: /* chat_stream's kind; this parser makes none */
        break;
    }
    return -1;
}

void zi_tool_stream_types(zi_tool_stream *ts, const json_t *tools) {
    ts->tools = tools;
}

int zi_tool_stream_parse_all(const json_t *names, zi_tool_format format, const json_t *tools,
                             const char *text, size_t len, json_t **calls, char **content) {
    *calls = NULL, *content = NULL;
    zi_tool_stream ts;
    zi_tool_stream_init(&ts, names, format);
    zi_tool_stream_types(&ts, tools);
    collect c = {.calls = json_array()};
    int rc = c.calls ? 0 : -1;
    if (!rc) rc = zi_tool_stream_feed(&ts, text, len, collect_event, &c);
    if (!rc) rc = zi_tool_stream_finish(&ts, collect_event, &c);
    if (!rc) rc = close_args(&c);
    int ok = !rc && zi_tool_stream_calls_ok(&ts);
    /* No calls: the content as streamed (a format's dropped markers gone). */
    int none = !rc && !ts.n_calls;
    zi_tool_stream_free(&ts);
    free(c.args);
    if (none && !(c.clen == len && (!len || !memcmp(c.content, text, len)))) {
        json_decref(c.calls);
        *content = c.content ? c.content : strdup("");
        return *content ? 0 : -1;
    }
    if (ok) {
        *calls = c.calls;
        *content = c.clen ? c.content : NULL;
        if (!c.clen) free(c.content);
        return 0;
    }
    json_decref(c.calls);
    free(c.content);
    return rc ? -1 : 0;
}
