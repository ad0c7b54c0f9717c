/*
 * router_core.h - the router's request state machine without sockets: the
 * core of `zinfer-router`, a static library (zi_router_core) that the
 * router executable, tests/unit/test_router_core.c and
 * tests/fuzz/fuzz_frame.c link. It includes no ZeroMQ header and calls no
 * ZeroMQ function.
 *
 * The core is driven by events, one call each:
 *
 *   zi_router_client_frame   a frame from a client
 *   zi_router_backend_frame  a frame from a tokenizer or worker
 *   zi_router_tick           the clock moved on (heartbeat timeouts,
 *                            --failover-timeout, request deadlines)
 *   zi_router_client_gone    a client's connection closed
 *   zi_router_backend_gone   a backend's connection closed
 *   zi_router_shutdown       the router stops: every request ends
 *
 * and answers through the outbox the shell gives it (zi_router_io): each
 * frame to send is one call of io.send, in the order it must go out. The
 * clock is io.now_ms: the core never reads a clock itself, so a test
 * decides what time it is. The shell (router.c, router_watch.c) owns the
 * sockets, the poll loop and the socket monitors, and turns what they
 * report into these calls.
 *
 * ---- The request state machine ------------------------------------------
 *
 * Every admitted request has a record (rreq, router_impl.h) in the
 * request table from admission until it ends; the record holds two state
 * variables and a few flags.
 *
 * The phase (rreq.state), where the request is on its way to a worker:
 *
 *   RS_ENCODING  at its tokenizer: generate ("encode"), embed
 *                ("embed_encode")                           [waiting]
 *   RS_UTIL      tokenize / detokenize at its tokenizer     [waiting]
 *   RS_QUEUED    encoded, in the FIFO queue for a worker slot, first
 *                or again after its worker died             [waiting]
 *   RS_RUNNING   on worker rreq.wrk, holding one of its slots (counted in
 *                that worker's `assigned`)
 *   RS_DECODING  off its worker: the worker reported a final status, or
 *                dropped it (its error, an embed's result); a generate
 *                request's tokenizer still decodes the last ids
 *
 * [waiting] phases are counted in router.n_waiting (what --max-queue
 * bounds, and each model's share of it --max-queue-per-model); RS_QUEUED
 * requests are in their model's queue (model_rec.q) exactly once.
 *
 * The tokenizer link (rreq.tlink), what the request holds on a tokenizer:
 *
 *   TL_NONE     none (an embed request once encoded)
 *   TL_ON       on tokenizer rreq.tok (counted in its `assigned`), which
 *               keeps no state for it: tokenize, detokenize, an embed
 *               being encoded, a generate request whose tokenizer has
 *               dropped its state (its final "decoded", or its error)
 *   TL_STATE    on tokenizer rreq.tok, which keeps its decode state (a
 *               generate request): its end sends that tokenizer "release"
 *   TL_WAITING  its tokenizer died: waiting for another; or admitted
 *               while its model loads (rreq.loading): waiting for a
 *               tokenizer and a worker of it (generate only)
 *
 * rreq.tok >= 0 exactly when the link is TL_ON or TL_STATE.
 *
 * Transitions (event: phase / link before -> after):
 *
 *   generate admitted             - -> ENCODING / STATE    ("encode")
 *   tokenize, detokenize admitted - -> UTIL / ON           ("tokenize"...)
 *   embed admitted                - -> ENCODING / ON       ("embed_encode")
 *   "encoded"                     ENCODING -> QUEUED
 *   "embed_encoded"               ENCODING / ON -> QUEUED / NONE
 *   a worker slot is free         QUEUED -> RUNNING        ("start", "embed")
 *   "tokens", status active       RUNNING -> RUNNING       ("decode")
 *   "tokens", a final status      RUNNING -> DECODING      ("decode")
 *   "decoded", a final status     RUNNING | DECODING / STATE -> end: "final"
 *                                 (RUNNING: a stop string; "cancel")
 *   "embedded"                    RUNNING -> DECODING -> end: "result"
 *   "tokenized" / "detokenized"   UTIL -> end: "result"
 *   a backend's "error"           any -> end: "error"
 *   client "cancel" (generate, embed)    any -> end: "final" cancelled
 *   past its deadline (generate) any -> end: "final" deadline_exceeded
 *   its client is gone            any -> end, no frame (counted cancelled)
 *   its worker died               RUNNING -> QUEUED (resumed), or end:
 *                                 "error" worker_lost when it cannot be
 *   its tokenizer died            generate: ON | STATE -> WAITING (or end:
 *                                 "error" worker_lost); tokenize,
 *                                 detokenize, embed: end "error" worker_lost
 *   a tokenizer registers         WAITING -> STATE ("encode" again, or
 *                                 "encode" with "replay" and the
 *                                 unanswered "decode" messages; a loading
 *                                 one once a worker of its model is up
 *                                 too, with that worker's max_length)
 *   tick, no worker for --failover-timeout     QUEUED -> end: "error"
 *   tick, no tokenizer for --failover-timeout  WAITING -> end: "error"
 *   client "model_failed" (its model could not load)
 *                                 ENCODING | QUEUED -> end: "error"
 *                                 unavailable
 *   shutdown                      any -> end: "error" unavailable
 *
 * Every end goes through end_request (router_impl.h), which undoes what
 * the phase and link hold: the queue place and n_waiting, the worker slot
 * ("cancel" to a worker still RUNNING it), the tokenizer's count
 * ("release" when the link is TL_STATE). The promise: every admitted
 * request gets exactly one terminal frame ("final", "error" or "result";
 * none when its client is gone) and no frame after it.
 *
 * Flags that are not states: stream, delim (how replies go out), has_lp
 * (log probabilities were kept), echo_seen (a worker's tokens arrived, so
 * a resume sends no second echo), note_resume (the next chunk says
 * "resumed"), gen_broken and pend_broken (an id list or decode message
 * could not be kept: that failover is off for the request).
 *
 * zi_router_check verifies the counters against the table; debug builds
 * (no NDEBUG) run it after every event and assert it holds.
 */
#ifndef ZI_ROUTER_CORE_H
#define ZI_ROUTER_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "zi_error.h"

typedef struct router zi_router; /* router_impl.h */

/* The two sides the core sends to. */
typedef enum { ZI_ROUTER_CLIENT, ZI_ROUTER_BACKEND } zi_router_side;

/* The outbox and clock the shell provides. */
typedef struct zi_router_io {
    void *ctx; /* passed to each function */
    /* Sends one frame to the peer with routing id ident on a side (delim:
     * an empty delimiter frame goes first, for a REQ client). Returns 0,
     * or -1 with errno set when the peer cannot be reached (a client that
     * is gone: its request is then cancelled). */
    int (*send)(void *ctx, zi_router_side side, const unsigned char *ident, size_t ident_len,
                bool delim, const void *data, size_t len);
    /* Monotonic milliseconds: heartbeats, deadlines, latencies. */
    int64_t (*now_ms)(void *ctx);
    /* Wall-clock nanoseconds since the epoch: a request's timestamp_ns. */
    int64_t (*wall_ns)(void *ctx);
} zi_router_io;

/* Which connection a frame came on (what the shell's socket monitor
 * tracks): its fd (-1: unknown) and the connection's number on that fd. */
typedef struct zi_router_conn {
    int fd;
    uint32_t epoch;
} zi_router_conn;

/* Sets rt up with the default options (those of `zinfer-router --help`),
 * the outbox io and the logger log. ZI_EINVAL when io lacks a function. */
int zi_router_init(zi_router *rt, const zi_router_io *io, zi_logger log);

/* Names a model this router serves (--served-models; zinfer serve gives
 * every model's): the first one named is the default of requests that
 * name none, and each is listed by the models op, "loading" until a
 * worker of it registers. ZI_EINVAL (err says why) for an empty name, one
 * of ZI_ROUTER_MODEL_NAME bytes or more, one named twice, or one too
 * many (64). Call before the first event. */
int zi_router_add_model(zi_router *rt, const char *name, zi_error *err);

/* --load-on-demand: a generate request for a configured model none of
 * whose processes is up is admitted and waits for them (up to
 * --failover-timeout) instead of being refused "unavailable"; the models
 * op tells "unloaded" models from "loading" ones and counts each model's
 * waiting and active requests and idle time, which `zinfer serve
 * --models-max` loads and unloads models by. */
void zi_router_set_on_demand(zi_router *rt, bool on);

/* --models-at-start: the first n configured models (all, by default) are
 * being started by whoever runs the router: each wants "load" (listed
 * "loading") until a worker of it registers; the others are "unloaded"
 * until a request or load_model wants them. Call in any order with
 * zi_router_add_model, before the first event. */
void zi_router_set_starting(zi_router *rt, size_t n);

/* --keep-alive: how long a model stays loaded once idle when its latest
 * generate request gave no keep_alive (ms; negative: forever, the
 * default). The models op reports it, with want "unload" once it has
 * passed; only `zinfer serve` acts on it. */
void zi_router_set_keep_alive(zi_router *rt, int64_t ms);

/* A frame from a client (ident: its routing id, at most ZI_ROUTER_IDENT_MAX
 * bytes; delim: it came with an empty delimiter frame, as from a REQ
 * socket, and replies get one too). Every frame that is not a cancel gets
 * exactly one reply or starts a request. ZI_EINVAL (nothing done) for an
 * over-long ident; else ZI_OK. */
int zi_router_client_frame(zi_router *rt, zi_router_conn conn, const unsigned char *ident,
                           size_t ident_len, bool delim, const void *buf, size_t len);

/* A frame from a tokenizer or worker (ident: its routing id). ZI_EINVAL
 * (nothing done) for an over-long ident; else ZI_OK. */
int zi_router_backend_frame(zi_router *rt, zi_router_conn conn, const unsigned char *ident,
                            size_t ident_len, const void *buf, size_t len);

/* The clock tick (the shell calls it every 100 ms): backends silent for
 * --heartbeat-timeout die, requests past --failover-timeout without a
 * worker or tokenizer end, so do requests past their deadline. ZI_OK. */
int zi_router_tick(zi_router *rt);

/* Client connection conn closed: its requests end without a reply. ZI_OK. */
int zi_router_client_gone(zi_router *rt, zi_router_conn conn);

/* Backend connection conn closed: that backend dies (its requests move on,
 * as for missed heartbeats). ZI_OK. */
int zi_router_backend_gone(zi_router *rt, zi_router_conn conn);

/* The router stops: every request in flight ends with an "error" frame
 * (code unavailable), then everything rt holds is freed. ZI_OK. */
int zi_router_shutdown(zi_router *rt);

/* Checks the router's counters against its request table: each backend's
 * `assigned` is the requests on it, n_waiting (and each model's share) the
 * requests in a waiting phase, the queues hold exactly the RS_QUEUED
 * requests, each in its model's, oldest first, a request's
 * tokenizer and worker indices agree with its phase and link, a model
 * wished loaded (load_model) has no live worker. ZI_OK, or
 * ZI_EINVAL with err saying what is off (err may be NULL). */
int zi_router_check(const zi_router *rt, zi_error *err);

/* The longest routing identity kept (longer envelopes are dropped). */
#define ZI_ROUTER_IDENT_MAX 256

/* A model name's room, its NUL included (longer registered names are cut). */
#define ZI_ROUTER_MODEL_NAME 128

#endif
