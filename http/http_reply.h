/*
 * http_reply.h - the router's replies to a request's `generate`s gathered
 * per choice and rendered as OpenAI's JSON: the whole response
 * (chat.completion / text_completion), or Server-Sent Events chunks
 * (chat.completion.chunk / text_completion) for a stream, with logprobs in
 * each endpoint's shape and the usage (docs/http.md).
 */
#ifndef ZI_HTTP_REPLY_H
#define ZI_HTTP_REPLY_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "http_request.h"
#include "http_router.h"

#define ZI_HTTP_TOP_MAX 24

/* One token's log probability and the alternatives the router sent. */
typedef struct zi_http_lp {
    int64_t id;
    double lp;
    int has_lp; /* 0 for an echoed prompt's first token */
    int n_top;
    int64_t top_id[ZI_HTTP_TOP_MAX];
    double top_lp[ZI_HTTP_TOP_MAX];
} zi_http_lp;

typedef struct zi_http_choice {
    char *text; /* the completion so far (not NUL-terminated) */
    size_t len, cap;
    zi_http_lp *lp; /* one per completion token, when logprobs were asked */
    size_t n_lp, cap_lp;
    zi_http_lp *prompt_lp; /* echo: one per prompt token */
    size_t n_prompt_lp;
    char *prompt_text; /* echo: the prompt as the router rendered it */
    size_t prompt_text_len;
    char status[32];   /* the router's final status, "" while running */
    char *stop_string; /* status "stop": the stop string that ended it, or NULL */
    long long prompt_tokens, completion_tokens;
    int started;               /* a stream sent this choice's first chunk */
    struct zi_chat_stream *cs; /* a streamed chat: its reasoning, content and calls so far */
    size_t lp_sent;            /* ... and the log probabilities sent */
} zi_http_choice;

typedef struct zi_http_result {
    zi_http_gen *g; /* its reasoning.open is set from the router's first chunk */
    char id[48];    /* "chatcmpl-..." / "cmpl-..." */
    long long created;
    char model[256];
    zi_http_choice ch[ZI_HTTP_MAX_N];
    int n_done;
    struct zi_http_ctx *ctx;        /* the process' context (http_api.h), set by the caller */
    void *api_state;                /* an API renderer's own state, or NULL ... */
    void (*api_state_free)(void *); /* ... freed with this by zi_http_result_free */
} zi_http_result;

/* g is borrowed; model is the name to answer with. */
void zi_http_result_init(zi_http_result *r, zi_http_gen *g, const char *model);
void zi_http_result_free(zi_http_result *r);

/* What one frame added to a choice: its index, and where its new text and
 * log probabilities start. */
typedef struct zi_http_delta {
    int index;
    size_t text_from, lp_from;
    int final; /* the frame ended the choice */
    int first; /* the choice's first frame (echo's prompt came with it) */
} zi_http_delta;

/* Applies one frame of request "g<i>". 0 with *d set; 1 for a frame of no
 * choice of this request (ignored); -1 with e set for an "error" frame, a
 * malformed one, or a final "deadline_exceeded" (504 deadline_exceeded:
 * OpenAI has no finish_reason for it; the choice is final all the same). */
int zi_http_result_apply(zi_http_result *r, const msgpack_object *frame, zi_http_delta *d,
                         zi_http_error *e);

/* The whole response (stream false). NULL with e set when token texts
 * could not be had for the log probabilities. */
json_t *zi_http_render_full(zi_http_result *r, zi_http_conn *c, zi_http_error *e);

/* The SSE chunk(s) for delta d appended to *out as "data: {...}\n\n"
 * (a role chunk first for a chat choice's first delta; the finish_reason
 * on the choice's last chunk). -1 with e set as above. */
int zi_http_render_delta(zi_http_result *r, const zi_http_delta *d, zi_http_conn *c, char **out,
                         size_t *len, size_t *cap, zi_http_error *e);

/* The end of a stream: the usage chunk when asked, then "data: [DONE]". */
int zi_http_render_end(zi_http_result *r, char **out, size_t *len, size_t *cap);

/* An error inside a stream, as vLLM sends it: data: {"error": {...}}. */
int zi_http_render_stream_error(const zi_http_error *e, char **out, size_t *len, size_t *cap);

/* A JSON string of n bytes that may not be valid UTF-8 (a token's text):
 * bad bytes become U+FFFD; s NULL gives "". NULL when out of memory. */
json_t *zi_http_jstr(const char *s, size_t n);

/* Appends n bytes to a growing buffer; -1 when out of memory. */
int zi_http_buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n);

#endif
