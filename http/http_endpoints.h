/*
 * http_endpoints.h - what each path of zinfer-http answers (docs/http.md),
 * apart from the HTTP library: a request (method, path, whole body) in, a
 * status with a JSON body or a stream of Server-Sent Events out.
 *
 *   POST /v1/chat/completions, POST /v1/completions   generation
 *   GET  /v1/models, GET /v1/models/{id}              the served model
 *   GET  /health                                      200 / 503
 *   GET  /metrics                                     Prometheus text (the router's counters)
 *   POST /tokenize, POST /detokenize                  vLLM's shapes
 *   POST /v1/load_lora_adapter, /v1/unload_lora_adapter   vLLM's (LoRA, docs/lora.md)
 *   GET, POST /lora-adapters                          llama-server's adapters, global scales
 *   POST /v1/embeddings                               OpenAI's (http_embed.h)
 *
 * http_server.c does the HTTP part (connections, limits, the API key) and
 * calls zi_http_handle once a request's body is complete.
 */
#ifndef ZI_HTTP_ENDPOINTS_H
#define ZI_HTTP_ENDPOINTS_H

#include <jansson.h>
#include <stddef.h>
#include <sys/types.h>

#include "http_ctx.h"

typedef struct zi_http_stream zi_http_stream;

typedef struct zi_http_audio zi_http_audio;

typedef struct zi_http_answer {
    int status;
    json_t *json; /* the body; NULL for a stream or text */
    char *text;   /* a text/plain body (malloc'd; /metrics), or NULL */
    size_t text_len;
    const char *content_type; /* text's type when not text/plain (audio/wav), or NULL */
    zi_http_stream *stream; /* an SSE stream to read with zi_http_stream_read */
    zi_http_audio *audio;   /* a speech answer's bytes to read with zi_http_audio_read
                             * (content_type says which) */
    const char *allow;      /* 405: the methods the path takes (the Allow header) */
} zi_http_answer;

/* Answers one request, with ctx's waits (ctx->lim), router and cached
 * model; a stream keeps ctx until freed. client_fd is the client's socket (watched while
 * waiting, so a client that goes away cancels its generation), -1 if
 * unknown. Never fails: an error is an answer too. */
void zi_http_handle(zi_http_ctx *ctx, const char *method, const char *path, const char *body,
                    size_t len, int client_fd, zi_http_answer *a);

/* The next bytes of a stream into buf (at most max): > 0 bytes, 0 at its
 * end, -1 when the client went away or the stream broke (its requests are
 * cancelled). Blocks until the router sends something. */
ssize_t zi_http_stream_read(zi_http_stream *s, char *buf, size_t max);
/* The next bytes of a speech answer (POST /v1/audio/speech: the WAV
 * header, then the samples as the router's chunks bring them), as
 * zi_http_stream_read. */
ssize_t zi_http_audio_read(zi_http_audio *s, char *buf, size_t max);
/* Frees it; a speech request still running is cancelled. */
void zi_http_audio_free(zi_http_audio *s);

/* Frees the stream; a generation still running is cancelled (the router's
 * cancel op, so its worker slots are freed at once). */
void zi_http_stream_free(zi_http_stream *s);

#endif
