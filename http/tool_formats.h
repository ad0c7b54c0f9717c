/*
 * tool_formats.h - the scanners of the tool-call formats of chat-model
 * families (the formats themselves, their names and detection:
 * common/tool_call_format.h), which tool_stream.c (the streaming driver)
 * runs over the text a call region holds so far (docs/http.md, "Tool-call
 * formats").
 *
 * A format is a set of openers, markers that start a call region anywhere
 * in the text (and for some formats a check at the text's start). A
 * region's scanner says whether the region is whole (ZI_TF_DONE, with
 * where it ends), may still grow (ZI_TF_MORE) or is not a call region
 * after all (ZI_TF_FAIL), and gives each call as far as it got: its name
 * once complete and a known tool's, and its arguments' JSON text so far.
 * Where the model writes the arguments as JSON that text is the model's
 * own (a span of the text); where it writes them otherwise (XML
 * parameters: Qwen3-Coder, GLM-4.5) the scanner writes the JSON, only from
 * what is decided, so that the JSON of a longer text always extends the
 * JSON of a shorter one and streamed fragments join to the whole text's.
 *
 * A region that holds no call (gpt-oss's `<|channel|>final<|message|>`
 * header, Functionary's `>>>all\n`) is DONE with no calls: its text is
 * dropped.
 */
#ifndef ZI_TOOL_FORMATS_H
#define ZI_TOOL_FORMATS_H

#include <jansson.h>
#include <stddef.h>

#include "tool_call_format.h"

#define ZI_TF_MAX_CALLS 64 /* calls in one region; more: not a call region */
#define ZI_TF_MAX_DEPTH 64 /* nesting of an arguments object */
#define ZI_TF_NAME_MAX 128 /* bytes of a tool's name, as zi_http_tools_parse bounds it */

/* ---- region scanning (for tool_stream.c) -------------------------------- */

enum { ZI_TF_MORE, ZI_TF_FAIL, ZI_TF_DONE };

/* One opener: its marker and the kind of region it starts. */
typedef struct zi_tf_opener {
    const char *marker;
    int kind;
} zi_tf_opener;

/* The format's openers, ended by a NULL marker. */
const zi_tf_opener *zi_tf_openers(zi_tool_format f);

/* One call as far as a scan got. */
typedef struct zi_tf_call {
    char name[ZI_TF_NAME_MAX + 1];
    int has_name, has_args; /* sent once both are set */
    size_t args_from;       /* the arguments' first byte in the text */
    size_t args_to;         /* model-written JSON: its end, 0 while open */
    size_t args_bad;        /* ... where it went wrong (not JSON), or 0 */
    int written;            /* the JSON is json[] (written by the scanner) */
    int json_done;          /* written: the arguments are whole */
    char *json;             /* written: the arguments' JSON so far */
    size_t json_len, json_cap;
} zi_tf_call;

typedef struct zi_tf_scan {
    const char *s; /* the whole text so far */
    size_t n;
    int final;           /* no more text comes */
    const json_t *names; /* the tools' names */
    const json_t *tools; /* the tools (router's shape), for XML values' types; may be NULL */
    zi_tf_call calls[ZI_TF_MAX_CALLS];
    int ncalls;
    size_t end;     /* DONE: the region's end */
    size_t fail_at; /* FAIL in a written call: where the text goes on */
    int oom;
} zi_tf_scan;

/* Scans the region of kind `kind` whose text (after its opener) begins at
 * from. ZI_TF_MORE / ZI_TF_FAIL / ZI_TF_DONE; sc->oom set when out of
 * memory (then FAIL). */
int zi_tf_scan_region(zi_tf_scan *sc, int kind, size_t from);

/* The check at the text's start, at s[from] (its first non-space byte):
 * ZI_TF_MORE while undecided, ZI_TF_FAIL when no region opens there,
 * ZI_TF_DONE when one does: its *kind, and *body where its scan begins. */
int zi_tf_start(zi_tool_format f, const char *s, size_t n, size_t from, int final, int *kind,
                size_t *body);

/* The arguments' JSON text so far of call c: *p, *len; 1 when whole. */
int zi_tf_call_args(const zi_tf_scan *sc, const zi_tf_call *c, const char **p, size_t *len);

/* Frees what the scan's calls hold (sc stays usable for a new scan). */
void zi_tf_scan_clear(zi_tf_scan *sc);

#endif
