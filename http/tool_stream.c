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

enum { S_MORE, S_FAIL, S_DONE };

static const char HERMES_OPEN[] = "<tool_call>", HERMES_CLOSE[] = "</tool_call>";
static const char *const START_MARKERS[] = {"[TOOL_CALLS]", "<|python_tag|>"};

/* One call object as far as a scan got. */
typedef struct scall {
    char name[ZI_TS_NAME_MAX + 1];
    int has_name, has_args;
    size_t args_from, args_to; /* args_to: 0 while the object is open */
} scall;

typedef struct scan {
    const char *s;
    size_t n;
    int final;
    const json_t *names;
    scall calls[ZI_TS_MAX_CALLS];
    int ncalls;
    size_t end; /* S_DONE: the region's end */
} scan;

static int sp(char c) {
    return isspace((unsigned char)c);
}

static void skip_ws(const char *s, size_t n, size_t *i) {
    while (*i < n && sp(s[*i])) (*i)++;
}

/* A JSON string starting at *i (a '"'): S_DONE with *i just after it. */
static int str_end(const char *s, size_t n, size_t *i) {
    size_t j = *i + 1;
    while (j < n) {
        if (s[j] == '\\') {
            j += 2;
            continue;
        }
        if (s[j] == '"') {
            *i = j + 1;
            return S_DONE;
        }
        if ((unsigned char)s[j] < 0x20) return S_FAIL;
        j++;
    }
    return S_MORE;
}

static int literal_char(char c) {
    return isalnum((unsigned char)c) || c == '-' || c == '+' || c == '.';
}

/* Skips the JSON value at *i, loosely (brackets matched, strings closed;
 * the arguments are validated whole once they end). */
static int skip_value(const char *s, size_t n, size_t *i) {
    char stack[ZI_TS_MAX_DEPTH];
    int d = 0;
    size_t j = *i;
    for (;;) {
        if (j >= n) return S_MORE;
        char c = s[j];
        if (c == '"') {
            int r = str_end(s, n, &j);
            if (r != S_DONE) return r;
        } else if (c == '{' || c == '[') {
            if (d == ZI_TS_MAX_DEPTH) return S_FAIL;
            stack[d++] = c;
            j++;
        } else if (c == '}' || c == ']') {
            if (!d || stack[d - 1] != (c == '}' ? '{' : '[')) return S_FAIL;
            d--;
            j++;
        } else if (literal_char(c)) {
            while (j < n && literal_char(s[j])) j++;
            if (j >= n) return S_MORE; /* a number may go on */
        } else if (d && (sp(c) || c == ',' || c == ':')) {
            j++;
            continue;
        } else {
            return S_FAIL;
        }
        if (!d) {
            *i = j;
            return S_DONE;
        }
    }
}

static int known(const json_t *names, const char *name) {
    size_t i;
    json_t *x;
    json_array_foreach(names, i, x) if (!strcmp(json_string_value(x), name)) return 1;
    return 0;
}

static int key_is(const char *s, size_t from, size_t to, const char *k) {
    return to - from == strlen(k) && !memcmp(s + from, k, to - from);
}

/* The call object at *i (a '{'). */
static int scan_call(scan *sc, size_t *i) {
    const char *s = sc->s;
    size_t n = sc->n, j = *i + 1;
    if (sc->ncalls == ZI_TS_MAX_CALLS) return S_FAIL;
    scall *c = &sc->calls[sc->ncalls++];
    memset(c, 0, sizeof *c);
    for (;;) {
        skip_ws(s, n, &j);
        if (j >= n) return S_MORE;
        if (s[j] != '"') return S_FAIL;
        size_t k0 = j;
        int r = str_end(s, n, &j);
        if (r != S_DONE) return r;
        size_t k1 = j;
        skip_ws(s, n, &j);
        if (j >= n) return S_MORE;
        if (s[j++] != ':') return S_FAIL;
        skip_ws(s, n, &j);
        if (j >= n) return S_MORE;
        if (key_is(s, k0 + 1, k1 - 1, "name")) {
            if (c->has_name || s[j] != '"') return S_FAIL;
            size_t v0 = j;
            if ((r = str_end(s, n, &j)) != S_DONE) return r;
            json_t *v = json_loadb(s + v0, j - v0, JSON_DECODE_ANY, NULL);
            int ok = json_is_string(v) && json_string_length(v) <= ZI_TS_NAME_MAX &&
                     strlen(json_string_value(v)) == json_string_length(v) &&
                     known(sc->names, json_string_value(v));
            if (ok) snprintf(c->name, sizeof c->name, "%s", json_string_value(v));
            json_decref(v);
            if (!ok) return S_FAIL;
            c->has_name = 1;
        } else if (key_is(s, k0 + 1, k1 - 1, "arguments") ||
                   key_is(s, k0 + 1, k1 - 1, "parameters")) {
            if (c->has_args || s[j] != '{') return S_FAIL;
            c->has_args = 1;
            c->args_from = j;
            if ((r = skip_value(s, n, &j)) != S_DONE) return r;
            c->args_to = j;
        } else if ((r = skip_value(s, n, &j)) != S_DONE) {
            return r;
        }
        skip_ws(s, n, &j);
        if (j >= n) return S_MORE;
        if (s[j] == ',') {
            j++;
            continue;
        }
        if (s[j] != '}' || !c->has_name || !c->has_args) return S_FAIL;
        *i = j + 1;
        return S_DONE;
    }
}

/* A region's JSON from `from`: one call object or an array of them, then
 * for Hermes the closing tag (which the text's end may stand for). */
static int scan_region(scan *sc, size_t from, int hermes) {
    const char *s = sc->s;
    size_t n = sc->n, j = from;
    skip_ws(s, n, &j);
    if (j >= n) return S_MORE;
    int r;
    if (s[j] == '{') {
        if ((r = scan_call(sc, &j)) != S_DONE) return r;
    } else if (s[j] == '[') {
        for (j++;;) {
            skip_ws(s, n, &j);
            if (j >= n) return S_MORE;
            if (s[j] != '{') return S_FAIL;
            if ((r = scan_call(sc, &j)) != S_DONE) return r;
            skip_ws(s, n, &j);
            if (j >= n) return S_MORE;
            if (s[j] == ']') break;
            if (s[j++] != ',') return S_FAIL;
        }
        j++;
    } else {
        return S_FAIL;
    }
    if (hermes) {
        size_t k = j, cl = sizeof HERMES_CLOSE - 1;
        skip_ws(s, n, &k);
        size_t avail = n - k;
        if (avail >= cl && !memcmp(s + k, HERMES_CLOSE, cl)) {
            sc->end = k + cl;
            return S_DONE;
        }
        if (avail >= cl || memcmp(s + k, HERMES_CLOSE, avail)) return S_FAIL;
        if (!sc->final) return S_MORE;
        j = n; /* unclosed at the end of the text */
    }
    sc->end = j;
    return S_DONE;
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
    scan *sc = calloc(1, sizeof *sc);
    if (!sc) return -1;
    sc->s = ts->buf, sc->n = ts->len, sc->final = ts->final, sc->names = ts->names;
    int r = scan_region(sc, ts->json_from, ts->hermes), rc = 0;
    for (int k = 0; k < sc->ncalls && !rc; k++) {
        scall *c = &sc->calls[k];
        if (!c->has_name || !c->has_args) break;
        if (k == ts->region_started) {
            char id[ZI_TS_ID_LEN + 1];
            zi_tool_call_id(id, (unsigned)ts->n_calls);
            ts->region_started++, ts->n_calls++;
            ts->args_sent = c->args_from;
            rc = emit_ev(emit, arg, ZI_TS_CALL, ts->region_base + k, id, c->name, strlen(c->name));
        }
        if (!rc && k == ts->region_started - 1) {
            size_t to = c->args_to  ? c->args_to
                        : ts->final ? ts->len
                                    : utf8_cut(ts->buf, ts->args_sent, ts->len);
            assert(to >= ts->args_sent);
            rc = emit_ev(emit, arg, ZI_TS_ARGS, ts->region_base + k, NULL, ts->buf + ts->args_sent,
                         to - ts->args_sent);
            ts->args_sent = to;
        }
        if (c->args_to && k == ts->region_checked) {
            ts->region_checked++;
            if (!valid_args(ts->buf + c->args_from, c->args_to - c->args_from)) {
                r = S_FAIL; /* sent already: the stream is broken */
                break;
            }
        }
    }
    size_t end = sc->end;
    free(sc);
    if (rc) return rc;
    *more = 0;
    if (r == S_MORE && !ts->final) {
        *more = 1;
        return 0;
    }
    ts->in_region = 0;
    if (r == S_DONE) {
        ts->pos = end;
    } else if (ts->region_started) { /* committed: the rest goes on as content */
        if (r == S_FAIL)
            ts->broken = 1, ts->pos = ts->args_sent;
        else
            ts->truncated = 1, ts->pos = ts->len;
    } else { /* never a call: its text is content, the marker literal */
        ts->pos = ts->ws_before;
        ts->literal_at = ts->marker_from;
    }
    return 0;
}

static void open_region(zi_tool_stream *ts, int hermes, size_t ws_before, size_t marker_from,
                        size_t json_from) {
    ts->in_region = 1, ts->hermes = hermes;
    ts->ws_before = ws_before, ts->marker_from = marker_from, ts->json_from = json_from;
    ts->region_base = ts->n_calls;
    ts->region_started = ts->region_checked = 0;
    ts->pos = ws_before;
}

/* The start of the text: a Mistral / Llama 3 marker or bare JSON opens a
 * region. 1 when it waits for text. */
static int step_start(zi_tool_stream *ts) {
    size_t j = ts->pos;
    skip_ws(ts->buf, ts->len, &j);
    const char *p = ts->buf + j;
    size_t avail = ts->len - j;
    if (!avail && !ts->final) return 1;
    for (size_t m = 0; avail && m < sizeof START_MARKERS / sizeof START_MARKERS[0]; m++) {
        size_t ml = strlen(START_MARKERS[m]);
        if (avail < ml && !memcmp(p, START_MARKERS[m], avail) && !ts->final) return 1;
        if (avail >= ml && !memcmp(p, START_MARKERS[m], ml)) {
            ts->start_done = 1;
            open_region(ts, 0, ts->pos, j, j + ml);
            return 0;
        }
    }
    ts->start_done = 1;
    if (avail && (*p == '{' || *p == '[')) open_region(ts, 0, ts->pos, j, j);
    return 0;
}

/* Content from pos: sent up to a held whitespace run or marker prefix; a
 * `<tool_call>` opens a region. *more when it waits for text. */
static int step_content(zi_tool_stream *ts, zi_ts_emit emit, void *arg, int *more) {
    const char *s = ts->buf;
    size_t n = ts->len, ol = sizeof HERMES_OPEN - 1, ws0 = SIZE_MAX, i;
    int found = 0;
    for (i = ts->pos; i < n; i++) {
        if (sp(s[i])) {
            if (ws0 == SIZE_MAX) ws0 = i;
            continue;
        }
        if (s[i] == '<' && i != ts->literal_at) {
            size_t avail = n - i;
            if (avail >= ol && !memcmp(s + i, HERMES_OPEN, ol)) {
                found = 1;
                break;
            }
            if (avail < ol && !memcmp(s + i, HERMES_OPEN, avail) && !ts->final) break;
        }
        ws0 = SIZE_MAX;
    }
    size_t to = ws0 != SIZE_MAX ? ws0 : i;
    if (i == n && ts->final && !ts->n_calls) to = n; /* no calls: the text as it came */
    if (i == n && !ts->final && ws0 == SIZE_MAX) to = utf8_cut(s, ts->pos, n);
    int rc = emit_ev(emit, arg, ZI_TS_CONTENT, 0, NULL, s + ts->pos, to - ts->pos);
    ts->pos = i == n && ts->final ? n : to;
    *more = !found;
    if (found) open_region(ts, 1, to, i, i + ol);
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

void zi_tool_stream_init(zi_tool_stream *ts, const json_t *names) {
    memset(ts, 0, sizeof *ts);
    ts->names = names;
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

int zi_tool_stream_parse_all(const json_t *names, const char *text, size_t len, json_t **calls,
                             char **content) {
    *calls = NULL, *content = NULL;
    zi_tool_stream ts;
    zi_tool_stream_init(&ts, names);
    collect c = {.calls = json_array()};
    int rc = c.calls ? 0 : -1;
    if (!rc) rc = zi_tool_stream_feed(&ts, text, len, collect_event, &c);
    if (!rc) rc = zi_tool_stream_finish(&ts, collect_event, &c);
    if (!rc) rc = close_args(&c);
    int ok = !rc && zi_tool_stream_calls_ok(&ts);
    zi_tool_stream_free(&ts);
    free(c.args);
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
