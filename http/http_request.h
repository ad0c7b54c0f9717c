/*
 * http_request.h - an OpenAI request body (POST /v1/chat/completions or
 * /v1/completions, JSON) checked field by field and turned into the
 * router's msgpack `generate` requests (docs/protocol.md), one per choice.
 *
 * Every field zinfer serves is translated (docs/http.md has the table);
 * unknown fields are ignored, as OpenAI's server does; a known field whose
 * value zinfer does not implement (audio and file parts, ...) is
 * refused with a 400 naming it, never silently dropped. Value ranges the
 * router checks (temperature, top_p, ...) are left to it: its error names
 * its own field, which zi_http_field_map translates back.
 */
#ifndef ZI_HTTP_REQUEST_H
#define ZI_HTTP_REQUEST_H

#include <jansson.h>
#include <stddef.h>

#include "http_error.h"
#include "http_images.h"
#include "http_tools.h"
#include "wire.h"

typedef enum zi_http_kind { ZI_HTTP_CHAT, ZI_HTTP_COMPLETION } zi_http_kind;

/* The most choices (n) one request may ask for. */
#define ZI_HTTP_MAX_N 16
/* The most stop strings. */
#define ZI_HTTP_MAX_STOP 16

/* How a chat completion's reasoning is returned (--reasoning-format, the
 * request's reasoning_format; docs/http.md, "Reasoning"). */
typedef enum zi_reasoning_format {
    ZI_REASONING_SEPARATE, /* apart from the content (reasoning_content) */
    ZI_REASONING_NONE,     /* left in the content as the model wrote it */
} zi_reasoning_format;

/* The most tokens a thinking section may be given (max_thinking_tokens). */
#define ZI_HTTP_MAX_THINKING 1000000

/* A chat request's reasoning settings. */
typedef struct zi_http_reasoning {
    zi_reasoning_format format;
    int format_given; /* the request named reasoning_format (else the server's default) */
    /* The rendered prompt ended inside an opened thinking section (Qwen 3
     * with thinking on, DeepSeek R1: `<think>\n`), so the model's text
     * holds only the closing marker. Set from the router's first chunk
     * ("reasoning_open", docs/protocol.md) before a chat_stream is made:
     * 1 a `<think>` section, 2 gpt-oss's harmony analysis channel
     * ("reasoning_harmony"). */
    int open;
    long long max_thinking_tokens; /* 0: no budget */
} zi_http_reasoning;

typedef struct zi_http_gen {
    zi_http_kind kind;
    int n;                       /* choices: router requests "g0" .. "g<n-1>" */
    int stream;                  /* answer with Server-Sent Events */
    int include_usage;           /* stream_options.include_usage */
    int logprobs;                /* -1: none; else the top alternatives per token (0..20) */
    int echo;                    /* completions: the prompt before the completion */
    char model[256];             /* as the request named it; "" when it named none */
    char *prompt;                /* completions with a text prompt: that text (for echo) */
    zi_msg req[ZI_HTTP_MAX_N];   /* the router requests, built */
    const char *field_map[40];   /* router field -> request field pairs, NULL-ended */
    zi_http_tools tools;         /* chat: tools and tool_choice (choice OFF without) */
    long long timeout_ms;        /* the request's timeout_ms; 0: the router's default */
    zi_http_reasoning reasoning; /* chat: how the reasoning is returned */
    json_t *api_req; /* another API's (http_api.h) own request data, for its renderer; or NULL.
                        zi_http_gen_free drops it */
} zi_http_gen;

/* Parses body (len bytes, not NUL-terminated) into g. 0, or -1 with e set
 * (400 naming the field: malformed JSON, a wrong type, an unsupported
 * value). On success the caller frees g with zi_http_gen_free. */
/* Chat messages' image_url parts (data: URLs) are decoded within lim
 * (NULL: the server's defaults; http_images.h) and become ZI_MEDIA_MARKER
 * in the message's text; their bytes go in each request's `images`. */
int zi_http_parse_generate(const char *body, size_t len, zi_http_kind kind,
                           const zi_http_image_limits *lim, zi_http_gen *g, zi_http_error *e);
/* The same from a parsed body (an object; borrowed): how the other APIs
 * (http_api.h) build their requests, translating theirs into this shape.
 * Errors name OpenAI's fields; a translator checks its own first.
 * images (not NULL; the caller's, who frees it after): its limits apply,
 * and it may already hold the images a translator decoded from its own
 * image parts (their markers written into the messages' text); image_url
 * parts of root's messages are appended. */
int zi_http_parse_generate_json(json_t *root, zi_http_kind kind, zi_http_images *images,
                                zi_http_gen *g, zi_http_error *e);
void zi_http_gen_free(zi_http_gen *g);

/* The value of key in o, or NULL when absent or null (OpenAI and Anthropic
 * treat null as "not given"). */
json_t *zi_http_get(json_t *o, const char *key);

/* Parses a JSON body that must be an object (tokenize, detokenize):
 * a new reference, or NULL with e set (400). */
json_t *zi_http_parse_object(const char *body, size_t len, zi_http_error *e);

#endif
