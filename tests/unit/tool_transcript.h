/*
 * tool_transcript.h - what a zi_tool_stream reported, joined, for the
 * tool-call parser's unit tests (test_tool_stream.c, test_tool_formats.c):
 * a text fed whole, split at every byte, in three pieces and byte by byte
 * must give the same transcript. Included by one test file each (static
 * functions); the includer has included cmocka.h and tool_stream.h.
 */
#ifndef ZI_TOOL_TRANSCRIPT_H
#define ZI_TOOL_TRANSCRIPT_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TT_MAXC 8 /* calls a transcript holds */

typedef struct transcript {
    char content[4096];
    size_t clen;
    int n_calls;
    char name[TT_MAXC][64];
    char args[TT_MAXC][1024];
    char id[TT_MAXC][40];
    int ok; /* zi_tool_stream_calls_ok after finish */
} transcript;

/* What a stream parses with: the format, the tools' names and (for the
 * formats that type XML values) the tools themselves, or NULL. */
typedef struct setup {
    zi_tool_format f;
    const json_t *names, *tools;
} setup;

static void cat(char *dst, size_t cap, size_t *len, const char *s, size_t n) {
    assert_true(*len + n < cap);
    memcpy(dst + *len, s, n);
    dst[ *len += n] = '\0';
}

/* A generated tool-call id: exactly 9 ASCII letters and digits, as
 * Mistral's chat templates demand. */
static int is_call_id(const char *id) {
    if (!id || strlen(id) != ZI_TS_ID_LEN) return 0;
    for (const char *p = id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')))
            return 0;
    return 1;
}

/* Each event checked as it comes (calls once, in order, before their
 * arguments; every fragment whole UTF-8) and joined. */
static int record(void *arg, const zi_ts_event *ev) {
    transcript *t = arg;
    switch (ev->kind) {
    case ZI_TS_CONTENT:
        assert_true(ev->len > 0);
        cat(t->content, sizeof t->content, &t->clen, ev->text, ev->len);
        break;
    case ZI_TS_CALL:
        assert_int_equal(ev->index, t->n_calls); /* each once, in order */
        assert_true(t->n_calls < TT_MAXC);
        assert_true(is_call_id(ev->id));
        snprintf(t->name[t->n_calls], 64, "%.*s", (int)ev->len, ev->text);
        snprintf(t->id[t->n_calls], 40, "%s", ev->id);
        t->n_calls++;
        break;
    case ZI_TS_ARGS: {
        assert_true(ev->len > 0);
        assert_int_equal(ev->index, t->n_calls - 1); /* the current call's */
        size_t l = strlen(t->args[ev->index]);
        cat(t->args[ev->index], sizeof t->args[0], &l, ev->text, ev->len);
        json_t *frag = json_stringn(ev->text, ev->len); /* whole UTF-8, as JSON holds */
        assert_non_null(frag);
        json_decref(frag);
        break;
    }
    case ZI_TS_REASONING: /* chat_stream's, never tool_stream's */
        fail_msg("tool_stream reported reasoning");
        break;
    }
    return 0;
}

/* Feeds text in pieces cut at cuts[0..ncuts) (increasing). */
static void run(const setup *su, const char *text, const size_t *cuts, int ncuts, transcript *t) {
    memset(t, 0, sizeof *t);
    zi_tool_stream ts;
    zi_tool_stream_init(&ts, su->names, su->f);
    zi_tool_stream_types(&ts, su->tools);
    size_t from = 0, n = strlen(text);
    for (int i = 0; i <= ncuts; i++) {
        size_t to = i < ncuts ? cuts[i] : n;
        assert_int_equal(zi_tool_stream_feed(&ts, text + from, to - from, record, t), 0);
        from = to;
    }
    assert_int_equal(zi_tool_stream_finish(&ts, record, t), 0);
    t->ok = zi_tool_stream_calls_ok(&ts);
    zi_tool_stream_free(&ts);
}

/* The same transcript, call ids apart (they are random). */
static void assert_same(const transcript *a, const transcript *b) {
    assert_string_equal(a->content, b->content);
    assert_int_equal(a->n_calls, b->n_calls);
    assert_int_equal(a->ok, b->ok);
    for (int i = 0; i < a->n_calls; i++) {
        assert_string_equal(a->name[i], b->name[i]);
        assert_string_equal(a->args[i], b->args[i]);
    }
}

/* Whole (into *whole), every split in two, every split in three around
 * the middle, and byte by byte: the same transcript. */
static void all_splits(const setup *su, const char *text, transcript *whole) {
    size_t n = strlen(text);
    run(su, text, NULL, 0, whole);
    transcript *t = malloc(sizeof *t);
    assert_non_null(t);
    for (size_t c = 0; c <= n; c++) {
        run(su, text, &c, 1, t);
        assert_same(whole, t);
        size_t cc[2] = {c / 2, c};
        run(su, text, cc, 2, t);
        assert_same(whole, t);
    }
    size_t *bytes = malloc((n + 1) * sizeof *bytes);
    assert_non_null(bytes);
    for (size_t c = 0; c < n; c++) bytes[c] = c + 1;
    run(su, text, bytes, (int)(n ? n - 1 : 0), t);
    free(bytes);
    assert_same(whole, t);
    free(t);
}

#endif
