/*
 * http_router.h - zinfer-http as a client of zinfer-router (client
 * protocol v1, docs/protocol.md): one ZeroMQ DEALER socket per HTTP
 * request, frames in and out, waits that also watch the HTTP client's
 * socket (so a client that goes away is noticed while its request waits
 * for tokens), and the text of single token ids (for log probabilities),
 * cached in the context (http_ctx.h) for its life.
 */
#ifndef ZI_HTTP_ROUTER_H
#define ZI_HTTP_ROUTER_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "http_ctx.h"
#include "http_error.h"
#include "wire.h"

/* One connection (a DEALER socket, plus a second one opened when token
 * texts are needed) to ctx's router; it keeps ctx (for the token texts),
 * which must outlive it. Not thread-safe: one HTTP request's thread uses
 * it. */
typedef struct zi_http_conn zi_http_conn;

/* 0, or -1 with e set (500). */
int zi_http_conn_open(zi_http_ctx *ctx, zi_http_conn **out, zi_http_error *e);
/* Closes the sockets; frames queued for sending (a cancel) still go out
 * (1 s linger in the ZeroMQ context's I/O thread). NULL is fine. */
void zi_http_conn_close(zi_http_conn *c);

/* Sends a built message; 0, or -1 with e set (503: the router does not
 * take it). */
int zi_http_conn_send(zi_http_conn *c, const zi_msg *m, zi_http_error *e);

/* A received reply: the parsed map points into buf. */
typedef struct zi_http_frame {
    char *buf;
    size_t len;
    msgpack_unpacked u;
    const msgpack_object *root;
} zi_http_frame;
void zi_http_frame_free(zi_http_frame *f);

/* The string under key as a NUL-terminated copy in out (cap bytes, cut);
 * "" when absent or not a string. */
void zi_http_frame_str(const msgpack_object *map, const char *key, char *out, size_t cap);

enum { ZI_HTTP_RECV_FRAME = 1, ZI_HTTP_RECV_TIMEOUT = 0, ZI_HTTP_RECV_GONE = -1 };

/* Waits up to timeout_ms for the next frame. client_fd >= 0 is the HTTP
 * client's socket: when the client closes its end meanwhile, returns
 * ZI_HTTP_RECV_GONE (a client that pipelines more bytes is not watched
 * further). A frame that does not parse as a map is skipped. */
int zi_http_conn_recv(zi_http_conn *c, int client_fd, int timeout_ms, zi_http_frame *f);

/* Sends m (a request with id `id`) and waits up to timeout_ms for the reply
 * of that id: 0 with *f holding a "result" frame; -1 with e set when the
 * router answers "error" (mapped as zi_http_router_error) or not at all
 * (503). */
int zi_http_call(zi_http_conn *c, const zi_msg *m, const char *id, int timeout_ms, zi_http_frame *f,
                 zi_http_error *e);

/* The model whose vocabulary zi_http_token_texts reads (NULL or "": the
 * default model's); a name longer than 127 bytes is cut. */
void zi_http_conn_set_model(zi_http_conn *c, const char *model);

/* The text of each of ids[0..n) (the router's detokenize of that id alone:
 * special tokens give ""), as pointers that stay valid for the life of
 * the connection's context (its token cache). 0, or -1 with e set. */
int zi_http_token_texts(zi_http_conn *c, const int64_t *ids, size_t n, const char **out,
                        zi_http_error *e);

/* Decodes a token-id array (numpy-style int64/int32, or a plain array) into
 * *ids (malloc'd, caller frees; NULL when n is 0). -1 when o is neither. */
int zi_http_decode_ids(const msgpack_object *o, int64_t **ids, size_t *n);
/* Decodes a float array (numpy-style float32/float64, or a plain array of
 * numbers) into *v (malloc'd). -1 when o is neither. */
int zi_http_decode_floats(const msgpack_object *o, double **v, size_t *n);

#endif
