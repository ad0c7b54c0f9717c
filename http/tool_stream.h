/*
 * tool_stream.h - the model's tool calls parsed as its text arrives, for
 * zinfer-http's streamed and whole replies alike (docs/http.md, "Tool
 * calls"). Fed the completion piece by piece, it reports content text, the
 * start of each call (its name) and its arguments' JSON text in fragments,
 * as soon as each is certain: text that may still become a call marker or
 * a call is held back until decided, and nothing is reported twice.
 *
 * Formats (common/tool_call_format.h; the one given at init): generic is Hermes/Qwen
 * `<tool_call>{...}</tool_call>` anywhere in the text (any number; a last
 * one may be left unclosed), and at the text's start (after whitespace)
 * Mistral `[TOOL_CALLS]`, Llama 3 `<|python_tag|>` or a bare JSON call;
 * each holds a call object `{"name": str, "arguments" | "parameters":
 * object}` (other keys skipped) or an array of them. The other families'
 * formats have their own markers (docs/http.md, "Tool-call formats").
 *
 * A call is sent (committed) once its name is complete and names a known
 * tool and its arguments object has begun. A region that fails before that
 * is text. The arguments reported are the model's own text of the
 * arguments object, byte for byte (where the model writes them as XML
 * parameters, the JSON object tool_formats.c writes of them); a call that
 * turns out malformed after it was committed (bad JSON, truncated) marks
 * the stream broken or truncated, the text after what was sent continuing
 * as content.
 *
 * Whitespace: a run of whitespace is held until non-space text follows
 * (then sent); before a call marker it is dropped, at the end it is sent
 * only when no call was made. So a text without calls comes out unchanged.
 */
#ifndef ZI_TOOL_STREAM_H
#define ZI_TOOL_STREAM_H

#include <jansson.h>
#include <stddef.h>

#include "tool_formats.h"

#define ZI_TS_MAX_CALLS ZI_TF_MAX_CALLS /* calls in one region (array); more: malformed */
#define ZI_TS_MAX_DEPTH ZI_TF_MAX_DEPTH /* nesting of an arguments object */
#define ZI_TS_NAME_MAX ZI_TF_NAME_MAX   /* bytes of a tool's name (zi_http_tools_parse) */
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
    const json_t *names;   /* the tools' names (strings), borrowed */
    const json_t *tools;   /* the tools (router's shape), borrowed, or NULL */
    zi_tool_format format; /* as zi_tool_format_parser gives it */
    char *buf;             /* all text fed so far */
    size_t len, cap;
    size_t pos;         /* buf[0..pos) is decided (sent, or dropped) */
    int start_done;     /* the check for a call at the text's start is made */
    size_t literal_at;  /* a `<tool_call>` here is text (its region failed) */
    int in_region;      /* scanning a call region */
    int kind;           /* ... of this kind (tool_formats.c's) */
    size_t ws_before;   /* where the whitespace before the region began */
    size_t marker_from; /* the region's first byte (its marker, or the JSON) */
    size_t json_from;   /* the region's JSON */
    int region_base;    /* index of the region's first call */
    int region_started; /* the region's calls sent */
    int region_checked; /* the region's calls whose arguments were validated */
    size_t args_sent;   /* bytes of the current call's arguments sent */
    int n_calls;
    int broken, truncated, final;
} zi_tool_stream;

/* names: an array of the known tools' names (kept borrowed); format: the
 * tool-call format to parse (AUTO, hermes, mistral, llama3: generic). */
void zi_tool_stream_init(zi_tool_stream *ts, const json_t *names, zi_tool_format format);

/* Optional, after init: the tools (the router's shape, [{"type",
 * "function": {"name", "parameters"}}], kept borrowed) whose parameter
 * schemas say which XML-written values are strings (tool_formats.h). */
void zi_tool_stream_types(zi_tool_stream *ts, const json_t *tools);
void zi_tool_stream_free(zi_tool_stream *ts);

/* Appends n bytes of completion and reports what became certain. 0, -1 out
 * of memory, or emit's non-zero return. */
int zi_tool_stream_feed(zi_tool_stream *ts, const char *text, size_t n, zi_ts_emit emit, void *arg);

/* The completion ended: reports everything still held. Same returns. */
int zi_tool_stream_finish(zi_tool_stream *ts, zi_ts_emit emit, void *arg);

/* After finish: 1 when calls were made and every one is whole and valid. */
int zi_tool_stream_calls_ok(const zi_tool_stream *ts);

/* The whole text at once (format and tools as for init and types):
 * *calls a new array of OpenAI tool calls ({"id", "type": "function",
 * "function": {"name", "arguments"}}) and *content the content text
 * (malloc'd, NULL when empty), when calls_ok; else 0 with both NULL (the
 * text is all content), except that without calls in a text from which
 * the format drops markers (gpt-oss's message headers, ...) *content is
 * the content as a stream reports it (malloc'd, maybe ""). -1 out of
 * memory. */
int zi_tool_stream_parse_all(const json_t *names, zi_tool_format format, const json_t *tools,
                             const char *text, size_t len, json_t **calls, char **content);

/* A new tool-call id into out: ZI_TS_ID_LEN random letters and digits
 * (getrandom). Not OpenAI's "call_" + 24 characters: ids are opaque to
 * clients, and Mistral's templates refuse every length but 9, so an id of
 * this length can be sent back with any template (docs/http.md). salt
 * (the call's number) keeps ids distinct should getrandom fail. */
void zi_tool_call_id(char out[ZI_TS_ID_LEN + 1], unsigned salt);

#endif
