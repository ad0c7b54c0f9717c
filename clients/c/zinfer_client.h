/*
 * zinfer_client.h - a small C client for zinfer's client protocol, version 1
 * (docs/protocol.md, docs/clients.md).
 *
 * One ZeroMQ DEALER socket to `zinfer-router`; every request is one msgpack
 * map, every reply a msgpack map with the request's "id" and an "event"
 * ("chunk", "final", "error" or "result"). Many requests may be in flight on
 * one client: zi_client_next_event() returns the next reply of one request
 * and keeps the replies of the others, in order, for later calls.
 *
 *     zi_client *c;
 *     zi_error err;
 *     if (zi_client_connect(&c, "tcp://127.0.0.1:5555", 60000, &err)) ...
 *     zi_client_request r;
 *     zi_client_request_init(&r);
 *     r.prompt = "The capital of France is";
 *     r.max_new_tokens = 16;
 *     char id[ZI_CLIENT_ID_MAX + 1];
 *     zi_client_generate(c, &r, id, sizeof id, &err);
 *     zi_client_event ev;
 *     while (zi_client_next_event(c, id, &ev, &err) == ZI_OK) {
 *         if (ev.kind == ZI_CLIENT_CHUNK) fwrite(ev.text, 1, ev.text_len, stdout);
 *         int done = ev.kind != ZI_CLIENT_CHUNK;
 *         zi_client_event_free(&ev);
 *         if (done) break;
 *     }
 *     zi_client_close(c);
 *
 * The library depends on libzmq, msgpack-c and zinfer's zi_error only; it
 * is not thread-safe (one client per thread, as with a ZeroMQ socket).
 */
#ifndef ZINFER_CLIENT_H
#define ZINFER_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

/* The longest request id the protocol allows. */
#define ZI_CLIENT_ID_MAX 256

typedef struct zi_client zi_client;

/* A generate request. zi_client_request_init() gives the defaults; set the
 * prompt (text, or token ids when prompt is NULL) and what you need. The
 * strings and arrays are borrowed for the duration of zi_client_generate. */
typedef struct zi_client_request {
    const char *id;            /* NULL: the client picks a unique one */
    const char *prompt;        /* text prompt (special-token text is parsed) */
    const int32_t *prompt_ids; /* used when prompt is NULL */
    size_t n_prompt_ids;
    int64_t max_new_tokens; /* <= 0: the server's default */
    int ignore_eos;         /* bool */
    int stream;             /* bool, default 1 */
    int set_temperature;    /* send temperature (else the server's greedy default) */
    double temperature;
    int set_top_k; /* send top_k */
    int64_t top_k;
    const char *const *stop; /* stop strings */
    size_t n_stop;
} zi_client_request;

typedef enum zi_client_event_kind {
    ZI_CLIENT_CHUNK,  /* text and token_ids of the newest tokens */
    ZI_CLIENT_FINAL,  /* status, usage, and text when not streamed */
    ZI_CLIENT_ERROR,  /* code, message, field (when one field was at fault) */
    ZI_CLIENT_RESULT, /* the answer to health, models, tokenize, detokenize */
} zi_client_event_kind;

/* One reply frame, decoded. Every pointer is owned by the event (NULL when
 * the frame had no such key) and freed by zi_client_event_free(). Strings
 * are NUL-terminated; text may also contain NUL bytes, so use text_len. */
typedef struct zi_client_event {
    zi_client_event_kind kind;
    char *id;
    char *text;
    size_t text_len;
    int64_t *token_ids;
    size_t n_token_ids;
    char *status;              /* final: end_of_sequence, maximum_length, stop, cancelled;
                                  health: ok / unavailable */
    int64_t prompt_tokens;     /* usage; -1 when absent */
    int64_t completion_tokens; /* usage; -1 when absent */
    char *code;                /* error */
    char *message;             /* error */
    char *field;               /* error, optional */
    int64_t workers, tokenizers, waiting, running; /* health; -1 when absent */
    unsigned char *raw;                            /* the whole frame, for keys not decoded here */
    size_t raw_len;
} zi_client_event;

/* Opens a DEALER socket connected to addr (e.g. "tcp://127.0.0.1:5555").
 * timeout_ms (> 0) bounds every wait for a reply; ZeroMQ connects lazily,
 * so an address nobody listens on shows up as a timeout on the first
 * reply, while a malformed address fails here. */
int zi_client_connect(zi_client **out, const char *addr, int timeout_ms, zi_error *err);

/* zi_client_connect with CURVE (docs/security.md): secret_z85 is this
 * client's secret key (its public key is derived), router_public_z85 the
 * router's public key, each 40 Z85 characters (read them from files, as
 * `zinfer keygen` writes them; zinfer-client --curve-secret does). Both NULL:
 * plain, as zi_client_connect. A router that refuses the key, or whose key
 * is not router_public_z85, never answers: a timeout on the first reply. */
int zi_client_connect_curve(zi_client **out, const char *addr, int timeout_ms,
                            const char *secret_z85, const char *router_public_z85, zi_error *err);

/* Closes the socket (pending requests are abandoned: the router cancels
 * them when it next tries to reply) and frees everything. NULL is fine. */
void zi_client_close(zi_client *c);

/* Router restarts (docs/protocol.md, "Router restart"): the client's
 * socket has a routing id of its own, and when its connection to the
 * router closes and opens again (a router restarted on the same address)
 * it sends "resume" for every open generate request with the token ids
 * received so far, so each stream goes on where it stopped. With a router
 * timeout of ms > 0, a router that stays away that long ends every open
 * generate request with one "error" reply of code "router_lost" (made by
 * the client); 0 (the default): they wait, bounded by the reply timeout
 * only. */
void zi_client_set_router_timeout(zi_client *c, int ms);

void zi_client_request_init(zi_client_request *r);

/* Sends a generate request; its id (r->id or the one picked) is copied to
 * id_out (capacity id_cap, at least ZI_CLIENT_ID_MAX + 1 is always enough). */
int zi_client_generate(zi_client *c, const zi_client_request *r, char *id_out, size_t id_cap,
                       zi_error *err);

/* The next reply of request id (or of any request when id is NULL), waiting
 * up to the client's timeout. Replies of other requests that arrive
 * meanwhile are kept for later calls; an "error" with id "" (the router
 * could not parse a frame) goes to whoever waits. On ZI_OK the caller owns ev and
 * frees it with zi_client_event_free(). A frame that is not a well-formed
 * reply gives ZI_EFORMAT; a timeout ZI_EIO. */
int zi_client_next_event(zi_client *c, const char *id, zi_client_event *ev, zi_error *err);

void zi_client_event_free(zi_client_event *ev);

/* Asks the router to stop generate request id; it then ends with a final
 * frame of status "cancelled" (which the caller still reads). */
int zi_client_cancel(zi_client *c, const char *id, zi_error *err);

/* One-shot operations: each sends its request and waits for the answer.
 * An "error" reply gives ZI_EINVAL with "code: message" in err. */
int zi_client_health(zi_client *c, zi_client_event *result, zi_error *err);
int zi_client_tokenize(zi_client *c, const char *text, int add_special, int64_t **ids,
                       size_t *n_ids, zi_error *err);
int zi_client_detokenize(zi_client *c, const int64_t *ids, size_t n_ids, char **text,
                         size_t *text_len, zi_error *err);

#endif
