/*
 * tool_stream.h - the model's tool calls parsed as its text arrives, for
 * zinfer-http's streamed and whole replies alike (docs/http.md, "Tool
 * calls"). Fed the completion piece by piece, it reports content text, the
 * start of each call (its name) and its arguments' JSON text in fragments,
 * as soon as each is certain: text that may still become a call marker or
 * a call is held back until decided, and nothing is reported twice.
 *
 * Formats: Hermes/Qwen `<tool_call>{...}</tool_call>` anywhere in the text
 * (any number; a last one may be left unclosed), and at the text's start
 * (after whitespace) Mistral `[TOOL_CALLS]`, Llama 3 `<|python_tag|>` or a
 * bare JSON call; each holds a call object `{"name": str, "arguments" |
 * "parameters": object}` (other keys skipped) or an array of them.
 *
 * A call is sent (committed) once its name is complete and names a known
 * tool and its arguments object has begun. A region that fails before that
 * is text. The arguments reported are the model's own text of the
 * arguments object, byte for byte; a call that turns out malformed after it
 * was committed (bad JSON, truncated) marks the stream broken or truncated,
 * the text after what was sent continuing as content.
 *
 * Whitespace: a run of whitespace is held until non-space text follows
 * (then sent); before a call marker it is dropped, at the end it is sent
 * only when no call was made. So a text without calls comes out unchanged.
 */
#ifndef ZI_TOOL_STREAM_H
#define ZI_TOOL_STREAM_H

#include <jansson.h>
#include <stddef.h>

#define ZI_TS_MAX_CALLS 64 /* calls in one region (array); more: a malformed region */
#define ZI_TS_MAX_DEPTH 64 /* nesting of an arguments object */
#define ZI_TS_NAME_MAX 128 /* bytes of a tool's name, as zi_http_tools_parse bounds it */
/* A generated tool-call id's length: 9, the only length Mistral's chat
 * templates accept (they raise on any other; docs/http.md). */
#define ZI_TS_ID_LEN 9

typedef enum zi_ts_kind {
    ZI_TS_CONTENT,   /* text: content */
    ZI_TS_CALL,      /* a call starts: index, id, text = its name */
    ZI_TS_ARGS,      /* text: the next fragment of call index's arguments */
    ZI_TS_REASONING, /* text: the next fragment of the reasoning (chat_stream.h; never
                      * reported by tool_stream itself) */
} zi_ts_kind;

typedef struct zi_ts_event {
    zi_ts_kind kind;
    int index;        /* CALL, ARGS: the call's index, 0, 1, ... over the whole text */
    const char *id;   /* CALL: ZI_TS_ID_LEN letters and digits (zi_tool_call_id) */
    const char *text; /* not NUL-terminated; valid during the callback */
    size_t len;
} zi_ts_event;

/* Receives each event; a non-zero return stops the parser and is returned. */
typedef int (*zi_ts_emit)(void *arg, const zi_ts_event *ev);

typedef struct zi_tool_stream {
    const json_t *names; /* the tools' names (strings), borrowed */
    char *buf;           /* all text fed so far */
    size_t len, cap;
    size_t pos;         /* buf[0..pos) is decided (sent, or dropped) */
    int start_done;     /* the check for a call at the text's start is made */
    size_t literal_at;  /* a `<tool_call>` here is text (its region failed) */
    int in_region;      /* scanning a call region */
    int hermes;         /* ... a `<tool_call>` block */
    size_t ws_before;   /* where the whitespace before the region began */
    size_t marker_from; /* the region's first byte (its marker, or the JSON) */
    size_t json_from;   /* the region's JSON */
    int region_base;    /* index of the region's first call */
    int region_started; /* the region's calls sent */
    int region_checked; /* the region's calls whose arguments were validated */
    size_t args_sent;   /* the end of the arguments bytes sent */
    int n_calls;
    int broken, truncated, final;
} zi_tool_stream;

/* names: an array of the known tools' names (kept borrowed). */
void zi_tool_stream_init(zi_tool_stream *ts, const json_t *names);
void zi_tool_stream_free(zi_tool_stream *ts);

/* Appends n bytes of completion and reports what became certain. 0, -1 out
 * of memory, or emit's non-zero return. */
int zi_tool_stream_feed(zi_tool_stream *ts, const char *text, size_t n, zi_ts_emit emit, void *arg);

/* The completion ended: reports everything still held. Same returns. */
int zi_tool_stream_finish(zi_tool_stream *ts, zi_ts_emit emit, void *arg);

/* After finish: 1 when calls were made and every one is whole and valid. */
int zi_tool_stream_calls_ok(const zi_tool_stream *ts);

/* The whole text at once: *calls a new array of OpenAI tool calls ({"id",
 * "type": "function", "function": {"name", "arguments"}}) and *content the
 * content text (malloc'd, NULL when empty), when calls_ok; else 0 with
 * both NULL (the text is all content). -1 out of memory. */
int zi_tool_stream_parse_all(const json_t *names, const char *text, size_t len, json_t **calls,
                             char **content);

/* A new tool-call id into out: ZI_TS_ID_LEN random letters and digits
 * (getrandom). Not OpenAI's "call_" + 24 characters: ids are opaque to
 * clients, and Mistral's templates refuse every length but 9, so an id of
 * this length can be sent back with any template (docs/http.md). salt
 * (the call's number) keeps ids distinct should getrandom fail. */
void zi_tool_call_id(char out[ZI_TS_ID_LEN + 1], unsigned salt);

#endif
