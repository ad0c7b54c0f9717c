/*
 * router.c - the `zinfer-router` process: the front door of the server.
 *
 * Two ROUTER sockets: clients connect to --bind (client protocol v1,
 * docs/protocol.md), tokenizer and worker processes connect to --backend
 * and register. A generate request travels
 *
 *   client -> [validate, admit, assign rid] -> tokenizer "encode"
 *          -> "encoded" context -> queue -> least-loaded worker "start"
 *          -> "tokens" (per step) -> the request's tokenizer "decode"
 *          -> "decoded" text -> client "chunk" ... "final"
 *
 * The router is single-threaded: one zmq_poll loop over both sockets, with
 * a 100 ms tick for heartbeat checks. Every admitted request lives in the
 * request table (req_table.h) until exactly one terminal frame ("final" or
 * "error") has been sent for it: every path that ends a request goes
 * through end_request(), which sends nothing itself but undoes the
 * request's claims on backends (queue place, worker slot, tokenizer
 * decode state).
 *
 * A backend that misses heartbeats for --heartbeat-timeout ms is dead; each
 * request it held ends with a "worker_lost" error. Such requests are not
 * retried elsewhere: tokens may already have been streamed to the client,
 * and a re-run would repeat or (with sampling) contradict them, so the
 * client, which knows what it received, decides whether to resubmit.
 *
 * Every message, to a backend or to a client, is encoded and decoded by
 * common/imsg.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "args.h"
#include "codec.h"
#include "imsg.h"
#include "keypath.h"
#include "log.h"
#include "req_table.h"
#include "response_format.h"
#include "stop_signal.h"
#include "types.h"
#include "utf8.h"
#include "wire.h"

static const char USAGE[] =
    "usage: zinfer-router [options]\n"
    "\n"
    "The front door of the zinfer server: clients connect to --bind (msgpack\n"
    "over ZeroMQ, docs/protocol.md); tokenizer and worker processes connect\n"
    "to --backend and register.\n"
    "\n"
    "  --bind ADDR                 client socket (default tcp://127.0.0.1:5555)\n"
    "  --backend ADDR              backend socket (default tcp://127.0.0.1:5556)\n"
    "  --max-queue N               admitted requests not yet on a worker, tokenize and\n"
    "                              detokenize included (default 256)\n"
    "  --max-prompt-tokens N       longest prompt accepted (default 4096)\n"
    "  --max-new-tokens N          largest max_new_tokens; also the default (default 4096)\n"
    "  --heartbeat-timeout MS      a backend silent this long is dead (default 5000)\n"
    "  --max-frame-bytes N         largest client frame read (default 8388608); up to 4x\n"
    "                              that gets an error reply, a larger one closes the\n"
    "                              client's connection\n"
    "  --log-level L               debug|info|warn|error|off (default info)\n"
    "  -h, --help                  this text\n";

enum { ROLE_NONE, ROLE_TOKENIZER, ROLE_WORKER };

enum { K_GENERATE, K_TOKENIZE, K_DETOKENIZE };
enum { RS_ENCODING, RS_QUEUED, RS_RUNNING, RS_DECODING, RS_UTIL };

#define IDENT_MAX 256

typedef struct backend {
    unsigned char ident[IDENT_MAX];
    size_t ident_len;
    int role;
    bool alive;
    int slots;
    int64_t max_length;
    int64_t vocab;
    char model[128];
    int assigned; /* workers: requests running; tokenizers: requests with state */
    int64_t last_seen;
    int64_t kv[ZI_N_KV_STATS]; /* workers: the KV counters of the last heartbeat */
} backend;

typedef struct rreq {
    uint64_t rid;
    unsigned char client[IDENT_MAX];
    size_t client_len;
    bool delim;
    char *id;
    size_t id_len;
    int kind, state;
    bool stream;
    int tok, wrk;       /* backend indices, -1 when none */
    bool tok_has_state; /* the tokenizer holds decode state for it */
    bool worker_done;
    int64_t prompt_tokens, completion_tokens;
    char *text; /* the completion so far, when not streamed */
    size_t text_len;
    char *start_msg; /* the worker's "start" message while queued */
    size_t start_len;
    uint64_t prefix_key; /* a hash of the prompt's first tokens (0: too short) */
    int64_t index;       /* the request's index, echoed in its final frame */
    int64_t t_recv_ms;   /* zi_now_ms() at admission */
    int64_t t_first_ms;  /* zi_now_ms() at its first token (0: none yet) */
    /* Not streamed: what the final frame carries besides the text. */
    zi_logprobs lp; /* the completion's log probabilities, when asked for */
    bool has_lp;
    char *echo; /* a packed map: the echoed prompt's keys of the first decoded message */
    size_t echo_len;
} rreq;

/* Prefix affinity: which worker last took a request whose prompt began
 * with a given key, so that the next one goes where its prefix is cached. */
#define ZI_AFFINITY_SLOTS 1024
typedef struct affinity {
    uint64_t key;
    int worker;
} affinity;

/* Keys are odd (0 means none): their low bit carries nothing. */
#define ZI_AFFINITY_SLOT(key) (((key) >> 1) % ZI_AFFINITY_SLOTS)

typedef struct router {
    zi_logger log;
    affinity aff[ZI_AFFINITY_SLOTS]; /* direct-mapped by key */
    void *front, *back;
    zi_req_table reqs;
    backend *be;
    size_t n_be;
    uint64_t *queue;
    size_t q_len, q_cap;
    uint64_t next_rid;
    size_t n_waiting; /* admitted and not yet running */
    long long max_queue, max_prompt, max_new, hb_timeout, max_frame;
} router;

/* ---- sending to clients ---------------------------------------------------- */

/* Sends to a request's client; false when the client is gone. */
static bool to_client(router *rt, const rreq *r, const zi_msg *m) {
    if (zi_send_msg(rt->front, r->client, r->client_len, r->delim, m) == 0) return true;
    zi_log(&rt->log, ZI_LOG_INFO, "request %llu: client unreachable (%s); cancelling",
           (unsigned long long)r->rid, zmq_strerror(errno));
    return false;
}

/* An error frame to a client that may have no request record. */
static void send_error_raw(router *rt, const unsigned char *client, size_t client_len, bool delim,
                           const char *id, size_t id_len, const char *code, const char *msg,
                           const char *field) {
    bool f = field && field[0];
    /* Messages may quote client bytes: send them as valid UTF-8 only. */
    size_t ml = 0, fl = 0;
    char *mc = zi_utf8_clean(msg, strlen(msg), &ml);
    char *fc = f ? zi_utf8_clean(field, strlen(field), &fl) : NULL;
    zi_im_client_error e = {.id = {id, id_len},
                            .code = {code, strlen(code)},
                            .message = {mc ? mc : "out of memory", mc ? ml : 13}};
    if (f) e.field = (zi_im_str){fc ? fc : "", fc ? fl : 0};
    zi_msg m;
    zi_im_client_error_pack(&e, &m);
    zi_send_msg(rt->front, client, client_len, delim, &m);
    zi_msg_free(&m);
    free(mc);
    free(fc);
}

/* ---- backends ---------------------------------------------------------------- */

static void to_backend(router *rt, int b, const zi_msg *m) {
    if (b < 0 || !rt->be[b].alive) return;
    if (zi_send_msg(rt->back, rt->be[b].ident, rt->be[b].ident_len, false, m) != 0)
        zi_log(&rt->log, ZI_LOG_WARN, "backend %d unreachable: %s", b, zmq_strerror(errno));
}

/* "cancel" to a worker, or "release" to a tokenizer, for request rid. */
static void backend_rid_msg(router *rt, int b, zi_im_type type, uint64_t rid) {
    zi_msg m;
    if (type == ZI_IM_CANCEL)
        zi_im_cancel_pack((int64_t)rid, &m);
    else
        zi_im_release_pack((int64_t)rid, &m);
    to_backend(rt, b, &m);
    zi_msg_free(&m);
}

/* The least-loaded live backend of a role; workers must have a free slot. */
static int pick_backend(const router *rt, int role) {
    int best = -1;
    for (size_t i = 0; i < rt->n_be; i++) {
        const backend *b = &rt->be[i];
        if (!b->alive || b->role != role) continue;
        if (role == ROLE_WORKER && b->assigned >= b->slots) continue;
        if (best < 0 || b->assigned < rt->be[best].assigned) best = (int)i;
    }
    return best;
}

static int count_alive(const router *rt, int role) {
    int n = 0;
    for (size_t i = 0; i < rt->n_be; i++) n += rt->be[i].alive && rt->be[i].role == role;
    return n;
}

/* The context limit for new requests: the smallest live worker's. */
static int64_t worker_max_length(const router *rt) {
    int64_t m = 0;
    for (size_t i = 0; i < rt->n_be; i++)
        if (rt->be[i].alive && rt->be[i].role == ROLE_WORKER &&
            (m == 0 || rt->be[i].max_length < m))
            m = rt->be[i].max_length;
    return m;
}

/* ---- the request life cycle -------------------------------------------------- */

static void queue_remove(router *rt, uint64_t rid) {
    for (size_t i = 0; i < rt->q_len; i++)
        if (rt->queue[i] == rid) {
            memmove(rt->queue + i, rt->queue + i + 1, (rt->q_len - i - 1) * sizeof *rt->queue);
            rt->q_len--;
            return;
        }
}

/* Removes r from the table and releases what it holds on backends. The
 * terminal frame (if any) has been sent by the caller. */
static void end_request(router *rt, rreq *r) {
    if (r->state == RS_ENCODING || r->state == RS_QUEUED || r->state == RS_UTIL) rt->n_waiting--;
    if (r->state == RS_QUEUED) queue_remove(rt, r->rid);
    if (r->state == RS_RUNNING && !r->worker_done && r->wrk >= 0) {
        backend_rid_msg(rt, r->wrk, ZI_IM_CANCEL, r->rid);
        rt->be[r->wrk].assigned--;
    }
    if (r->tok >= 0) {
        if (r->tok_has_state) backend_rid_msg(rt, r->tok, ZI_IM_RELEASE, r->rid);
        rt->be[r->tok].assigned--;
    }
    zi_req_table_del(&rt->reqs, r->rid);
    zi_log(&rt->log, ZI_LOG_DEBUG, "request %llu ended", (unsigned long long)r->rid);
    free(r->id);
    free(r->text);
    free(r->start_msg);
    zi_logprobs_free(&r->lp);
    free(r->echo);
    free(r);
}

static void fail_request(router *rt, rreq *r, const char *code, const char *msg,
                         const char *field) {
    char id[80], why[200]; /* as one line: the message may quote client text */
    zi_printable(id, sizeof id, r->id, r->id_len);
    zi_printable_max(why, sizeof why, msg, strlen(msg), 180);
    zi_log(&rt->log, ZI_LOG_INFO, "request %llu (id '%s') ended with %s: %s",
           (unsigned long long)r->rid, id, code, why);
    send_error_raw(rt, r->client, r->client_len, r->delim, r->id, r->id_len, code, msg, field);
    end_request(rt, r);
}

static void send_final(router *rt, rreq *r, const char *status) {
    int64_t now = zi_now_ms();
    char id[80]; /* the client's id as one line of ASCII */
    zi_printable(id, sizeof id, r->id, r->id_len);
    zi_log(&rt->log, ZI_LOG_INFO,
           "request %llu (id '%s') %s: %lld prompt + %lld completion tokens, first token "
           "%lld ms, total %lld ms",
           (unsigned long long)r->rid, id, status, (long long)r->prompt_tokens,
           (long long)r->completion_tokens,
           (long long)(r->t_first_ms ? r->t_first_ms - r->t_recv_ms : -1),
           (long long)(now - r->t_recv_ms));
    zi_im_final f = {.id = {r->id, r->id_len},
                     .status = status,
                     .status_len = strlen(status),
                     .index = r->index,
                     .prompt_tokens = r->prompt_tokens,
                     .completion_tokens = r->completion_tokens,
                     .has_text = !r->stream,
                     .text = {r->text ? r->text : "", r->text_len},
                     .logprobs = {.lp = r->has_lp ? &r->lp : NULL}};
    /* The echoed prompt kept from the first decoded message (a map). */
    msgpack_unpacked eu;
    msgpack_unpacked_init(&eu);
    if (!r->stream && r->echo_len &&
        msgpack_unpack_next(&eu, r->echo, r->echo_len, NULL) == MSGPACK_UNPACK_SUCCESS) {
        f.prompt_token_ids = zi_map_get(&eu.data, "prompt_token_ids");
        f.prompt_logprobs = zi_map_get(&eu.data, "prompt_logprobs");
        f.prompt_text = zi_map_get(&eu.data, "prompt_text");
    }
    zi_msg m;
    zi_im_final_pack(&f, &m, NULL);
    msgpack_unpacked_destroy(&eu);
    to_client(rt, r, &m);
    zi_msg_free(&m);
    end_request(rt, r);
}

/* The prompt-prefix key of a context: a hash of its first 64 tokens, or of
 * fewer (a multiple of 16, the usual KV block) when the prompt is shorter;
 * 0 under 17 tokens. Requests that share a long prefix share the key. */
static uint64_t prefix_key(const msgpack_object *ctx) {
    const msgpack_object *t = ctx ? zi_map_get(ctx, "tokens") : NULL;
    zi_codec_limits lim = zi_codec_limits_default();
    int32_t *v = NULL;
    size_t n = 0;
    if (!t || zi_codec_decode_tokens(t, &lim, "tokens", &v, &n, NULL) != ZI_OK) return 0;
    size_t k = n > 0 ? (n - 1) / 16 * 16 : 0;
    if (k > 64) k = 64;
    uint64_t h = 0;
    if (k >= 16) {
        h = 1469598103934665603ULL;
        for (size_t i = 0; i < k; i++) h = (h ^ (uint32_t)v[i]) * 1099511628211ULL;
        h |= 1; /* never 0 */
    }
    free(v);
    return h;
}

/* The worker for r: the least loaded one with a free slot, unless the
 * worker that last took r's prefix is within two requests of it. */
static int pick_worker(router *rt, const rreq *r) {
    int w = pick_backend(rt, ROLE_WORKER);
    if (w < 0 || !r || !r->prefix_key) return w;
    const affinity *a = &rt->aff[ZI_AFFINITY_SLOT(r->prefix_key)];
    if (a->key != r->prefix_key || a->worker == w || a->worker < 0 || (size_t)a->worker >= rt->n_be)
        return w;
    const backend *p = &rt->be[a->worker];
    if (p->alive && p->role == ROLE_WORKER && p->assigned < p->slots &&
        p->assigned <= rt->be[w].assigned + 2)
        return a->worker;
    return w;
}

/* Starts queued requests on workers with free slots, oldest first. */
static void dispatch(router *rt) {
    while (rt->q_len > 0) {
        rreq *r = zi_req_table_get(&rt->reqs, rt->queue[0]);
        int w = pick_worker(rt, r);
        if (w < 0) return;
        uint64_t rid = rt->queue[0];
        memmove(rt->queue, rt->queue + 1, (rt->q_len - 1) * sizeof *rt->queue);
        rt->q_len--;
        if (!r) continue;
        if (r->prefix_key) rt->aff[ZI_AFFINITY_SLOT(r->prefix_key)] = (affinity){r->prefix_key, w};
        if (zi_send(rt->back, rt->be[w].ident, rt->be[w].ident_len, false, r->start_msg,
                    r->start_len) != 0) {
            fail_request(rt, r, "worker_lost", "the chosen worker is unreachable", NULL);
            continue;
        }
        free(r->start_msg);
        r->start_msg = NULL;
        r->state = RS_RUNNING;
        r->wrk = w;
        rt->be[w].assigned++;
        rt->n_waiting--;
        zi_log(&rt->log, ZI_LOG_DEBUG, "request %llu -> worker %d", (unsigned long long)rid, w);
    }
}

/* ---- client frames ----------------------------------------------------------- */

typedef struct client_ctx {
    const unsigned char *ident;
    size_t ident_len;
    bool delim;
    const char *id;
    size_t id_len;
} client_ctx;

static void client_error(router *rt, const client_ctx *c, const char *code, const char *msg,
                         const char *field) {
    send_error_raw(rt, c->ident, c->ident_len, c->delim, c->id, c->id_len, code, msg, field);
}

/* An error whose message starts with the field path (codec messages). */
static void client_error_msg(router *rt, const client_ctx *c, const char *code, const char *msg) {
    char field[128];
    zi_error_field(msg, field, sizeof field);
    client_error(rt, c, code, msg, field);
}

static bool any_req(const void *val, const void *arg) {
    (void)val;
    (void)arg;
    return true;
}

static bool is_client_req(const void *val, const void *arg) {
    const rreq *r = val;
    const client_ctx *c = arg;
    return r->client_len == c->ident_len && !memcmp(r->client, c->ident, c->ident_len) &&
           r->id_len == c->id_len && !memcmp(r->id, c->id, c->id_len);
}

static rreq *find_client_req(router *rt, const client_ctx *c) {
    size_t pos = 0;
    return zi_req_table_find(&rt->reqs, &pos, is_client_req, c);
}

static rreq *new_request(router *rt, const client_ctx *c, int kind) {
    rreq *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->id = malloc(c->id_len + 1);
    if (!r->id) {
        free(r);
        return NULL;
    }
    memcpy(r->id, c->id, c->id_len);
    r->id[c->id_len] = '\0';
    r->id_len = c->id_len;
    memcpy(r->client, c->ident, c->ident_len);
    r->client_len = c->ident_len;
    r->delim = c->delim;
    r->rid = ++rt->next_rid;
    r->kind = kind;
    r->tok = r->wrk = -1;
    r->stream = true;
    zi_logprobs_init(&r->lp);
    if (zi_req_table_put(&rt->reqs, r->rid, r, NULL) != ZI_OK) {
        free(r->id);
        free(r);
        return NULL;
    }
    return r;
}

/* The request's response_format: what it asks for must be something this
 * version can hold decoding to (a JSON object), and a JSON object needs
 * the end-of-sequence token. Returns the error code (msg filled in), or
 * NULL when the request may go. */
static const char *response_format_error(const zi_request *req, char *msg, size_t cap) {
    zi_error err = {0};
    int kind = ZI_RF_NONE;
    int rc = zi_response_format_kind(&req->response_format, &kind, NULL, &err);
    if (rc) {
        snprintf(msg, cap, "%.200s", err.msg);
        return rc == ZI_EUNSUPPORTED ? "unsupported" : "invalid_request";
    }
    if (kind != ZI_RF_NONE && req->sampling_params.ignore_eos) {
        snprintf(msg, cap,
                 "response_format: a JSON object ends with the end-of-sequence token, which "
                 "sampling_params.ignore_eos turns off");
        return "invalid_request";
    }
    return NULL;
}

static void op_generate(router *rt, const client_ctx *c, const msgpack_object *o) {
    zi_error err = {0};
    zi_request req;
    zi_codec_limits lim = zi_codec_limits_default();
    if (find_client_req(rt, c)) {
        client_error(rt, c, "invalid_request", "id: a request with this id is already in flight",
                     "id");
        return;
    }
    if (zi_codec_decode_request(o, &lim, "", &req, &err) != ZI_OK) {
        client_error_msg(rt, c, err.code == ZI_EUNSUPPORTED ? "unsupported" : "invalid_request",
                         err.msg);
        return;
    }
    char msg[256], rf_field[128];
    const char *code = NULL, *field = NULL;
    if (req.sampling_params.max_new_tokens > rt->max_new) {
        code = "invalid_request", field = "sampling_params.max_new_tokens";
        snprintf(msg, sizeof msg,
                 "sampling_params.max_new_tokens: %lld exceeds this server's "
                 "limit of %lld",
                 (long long)req.sampling_params.max_new_tokens, rt->max_new);
    } else if (req.sampling_params.max_new_tokens < 0 &&
               req.sampling_params.min_new_tokens > rt->max_new) {
        /* No max_new_tokens means "up to this server's limit", which the
         * minimum must fit under too. */
        code = "invalid_request", field = "sampling_params.min_new_tokens";
        snprintf(msg, sizeof msg,
                 "sampling_params.min_new_tokens: %lld exceeds this server's limit of %lld new "
                 "tokens",
                 (long long)req.sampling_params.min_new_tokens, rt->max_new);
    } else if ((code = response_format_error(&req, msg, sizeof msg))) {
        zi_error_field(msg, rf_field, sizeof rf_field); /* the path the message starts with */
        field = rf_field;
    } else if (req.prompt_kind == ZI_PROMPT_TOKENS &&
               req.prompt_tokens.n > (size_t)rt->max_prompt) {
        code = "invalid_request", field = "prompt";
        snprintf(msg, sizeof msg, "prompt: %zu tokens exceed this server's limit of %lld",
                 req.prompt_tokens.n, rt->max_prompt);
    } else if (req.model_name.len > 0) {
        bool known = false;
        for (size_t i = 0; i < rt->n_be; i++)
            known |= rt->be[i].alive && rt->be[i].role == ROLE_WORKER &&
                     !strcmp(rt->be[i].model, req.model_name.p);
        if (!known) {
            code = "invalid_request", field = "model_name";
            snprintf(msg, sizeof msg,
                     "model_name: no model named '%.100s' is served (see op "
                     "\"models\")",
                     req.model_name.p);
        }
    }
    int tk = pick_backend(rt, ROLE_TOKENIZER);
    if (!code && (tk < 0 || count_alive(rt, ROLE_WORKER) == 0)) {
        code = "unavailable";
        snprintf(msg, sizeof msg, "no %s is connected yet; retry shortly",
                 tk < 0 ? "tokenizer process" : "model worker");
    } else if (!code && rt->n_waiting >= (size_t)rt->max_queue) {
        code = "overloaded";
        snprintf(msg, sizeof msg,
                 "%zu requests are already waiting (--max-queue %lld); retry "
                 "later",
                 rt->n_waiting, rt->max_queue);
    }
    rreq *r = NULL;
    if (!code && !(r = new_request(rt, c, K_GENERATE))) {
        code = "internal";
        snprintf(msg, sizeof msg, "out of memory");
    }
    if (code) {
        client_error(rt, c, code, msg, field);
        zi_request_free(&req);
        return;
    }
    if (req.sampling_params.max_new_tokens < 0) req.sampling_params.max_new_tokens = rt->max_new;
    /* The seed's timestamp_ns: when the server received the request, unless
     * the client set it (then it travels on as given). */
    if (req.timestamp_ns == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        req.timestamp_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    }
    r->index = req.index;
    r->t_recv_ms = zi_now_ms();
    r->stream = req.stream;
    r->state = RS_ENCODING;
    r->tok = tk;
    r->tok_has_state = true;
    rt->be[tk].assigned++;
    rt->n_waiting++;
    zi_im_encode em = {.rid = (int64_t)r->rid,
                       .has_max_length = true,
                       .max_length = worker_max_length(rt),
                       .request = &req};
    zi_msg m;
    int rc = zi_im_encode_pack(&em, &m, &err);
    zi_request_free(&req);
    if (rc)
        fail_request(rt, r, "internal", err.msg, NULL);
    else
        to_backend(rt, tk, &m);
    zi_msg_free(&m);
}

static void op_cancel(router *rt, const client_ctx *c) {
    rreq *r = find_client_req(rt, c);
    /* Cancelling a request that already ended is the usual race: ignore. */
    if (!r || r->kind != K_GENERATE) return;
    zi_log(&rt->log, ZI_LOG_DEBUG, "request %llu cancelled by the client",
           (unsigned long long)r->rid);
    send_final(rt, r, "cancelled");
}

static void op_health(router *rt, const client_ctx *c) {
    int nw = count_alive(rt, ROLE_WORKER), nt = count_alive(rt, ROLE_TOKENIZER);
    size_t running = zi_req_table_count(&rt->reqs) - rt->n_waiting;
    const char *status = nw > 0 && nt > 0 ? "ok" : "unavailable";
    zi_im_health h = {.id = {c->id, c->id_len},
                      .status = status,
                      .status_len = strlen(status),
                      .workers = nw,
                      .tokenizers = nt,
                      .waiting = (int64_t)rt->n_waiting,
                      .running = (int64_t)running};
    /* The KV caches of the live workers, summed (block_size: the largest),
     * as their last heartbeats reported them, with the prefix-cache hit
     * rate: prompt tokens found cached / prompt tokens looked up. */
    int64_t *sum = h.kv;
    for (size_t i = 0; i < rt->n_be; i++) {
        if (!rt->be[i].alive || rt->be[i].role != ROLE_WORKER) continue;
        for (int k = 0; k < ZI_N_KV_STATS; k++)
            sum[k] = k == ZI_KV_BLOCK_SIZE ? (rt->be[i].kv[k] > sum[k] ? rt->be[i].kv[k] : sum[k])
                                           : sum[k] + rt->be[i].kv[k];
    }
    int64_t looked = sum[ZI_KV_PREFIX_QUERY_TOKENS], hit = sum[ZI_KV_PREFIX_HIT_TOKENS];
    h.prefix_hit_rate = looked > 0 ? (double)hit / (double)looked : 0.0;
    zi_msg m;
    zi_im_health_pack(&h, &m);
    zi_send_msg(rt->front, c->ident, c->ident_len, c->delim, &m);
    zi_msg_free(&m);
}

static void op_models(router *rt, const client_ctx *c) {
    int idx[ZI_IM_MAX_MODELS], n = 0;
    for (size_t i = 0; i < rt->n_be && n < ZI_IM_MAX_MODELS; i++) {
        if (!rt->be[i].alive || rt->be[i].role != ROLE_WORKER) continue;
        bool dup = false;
        for (int k = 0; k < n; k++) dup |= !strcmp(rt->be[idx[k]].model, rt->be[i].model);
        if (!dup) idx[n++] = (int)i;
    }
    zi_im_models ms = {.id = {c->id, c->id_len}, .n = (size_t)n};
    for (int k = 0; k < n; k++) {
        const backend *b = &rt->be[idx[k]];
        ms.v[k] = (zi_im_model_entry){{b->model, strlen(b->model)}, b->max_length, b->vocab};
    }
    zi_msg m;
    zi_im_models_pack(&ms, &m);
    zi_send_msg(rt->front, c->ident, c->ident_len, c->delim, &m);
    zi_msg_free(&m);
}

/* tokenize / detokenize: checked here, answered by a tokenizer process. */
static void op_util(router *rt, const client_ctx *c, const msgpack_object *o, int kind) {
    zi_error err = {0};
    zi_codec_limits lim = zi_codec_limits_default();
    const msgpack_object *v = zi_map_get(o, kind == K_TOKENIZE ? "text" : "token_ids");
    int32_t *ids = NULL;
    size_t n = 0;
    if (kind == K_TOKENIZE) {
        if (!v || v->type != MSGPACK_OBJECT_STR) {
            client_error(rt, c, "invalid_request", v ? "text: not a string" : "text: missing",
                         "text");
            return;
        }
        const msgpack_object *as = zi_map_get(o, "add_special");
        if (as && as->type != MSGPACK_OBJECT_BOOLEAN) {
            client_error(rt, c, "invalid_request", "add_special: not a bool", "add_special");
            return;
        }
    } else {
        int rc = v ? zi_codec_decode_tokens(v, &lim, "token_ids", &ids, &n, &err)
                   : zi_error_set(&err, ZI_EINVAL, "token_ids: missing");
        if (rc) {
            client_error_msg(rt, c, "invalid_request", err.msg);
            return;
        }
    }
    if (find_client_req(rt, c)) {
        free(ids);
        client_error(rt, c, "invalid_request", "id: a request with this id is already in flight",
                     "id");
        return;
    }
    int tk = pick_backend(rt, ROLE_TOKENIZER);
    if (tk >= 0 && rt->n_waiting >= (size_t)rt->max_queue) {
        /* tokenize/detokenize wait on the tokenizers as generate's encoding
         * does: the same bound keeps a flood of them (up to a frame of text
         * each) from queueing without end. */
        char msg[160];
        snprintf(msg, sizeof msg,
                 "%zu requests are already waiting (--max-queue %lld); retry later", rt->n_waiting,
                 rt->max_queue);
        free(ids);
        client_error(rt, c, "overloaded", msg, NULL);
        return;
    }
    rreq *r = tk < 0 ? NULL : new_request(rt, c, kind);
    if (!r) {
        free(ids);
        client_error(rt, c, tk < 0 ? "unavailable" : "internal",
                     tk < 0 ? "no tokenizer process is connected yet; retry shortly"
                            : "out of memory",
                     NULL);
        return;
    }
    r->state = RS_UTIL;
    r->tok = tk;
    rt->be[tk].assigned++;
    rt->n_waiting++;
    zi_msg m;
    if (kind == K_TOKENIZE) {
        const msgpack_object *as = zi_map_get(o, "add_special"); /* a bool, checked above */
        zi_im_tokenize tm = {.rid = (int64_t)r->rid,
                             .text = {v->via.str.ptr, v->via.str.size},
                             .has_add_special = as != NULL,
                             .add_special = as && as->via.boolean};
        zi_im_tokenize_pack(&tm, &m);
    } else {
        zi_im_detokenize dm = {.rid = (int64_t)r->rid, .token_ids = {.v = ids, .n = n}};
        zi_im_detokenize_pack(&dm, &m);
    }
    to_backend(rt, tk, &m);
    zi_msg_free(&m);
    free(ids);
}

static void on_client_frame(router *rt, const unsigned char *ident, size_t ident_len, bool delim,
                            const void *buf, size_t len) {
    zi_error err = {0};
    client_ctx c = {ident, ident_len, delim, "", 0};
    char msg[ZI_ERROR_MSG_MAX + 64];
    zi_codec_limits lim = zi_codec_limits_default();
    msgpack_unpacked u;
    bool oversize = len > (size_t)rt->max_frame;
    if (oversize || zi_msgpack_parse(buf, len, &lim, &u, &err) != ZI_OK) {
        if (oversize)
            snprintf(msg, sizeof msg, "the frame of %zu bytes exceeds the limit of %lld bytes", len,
                     rt->max_frame);
        else
            snprintf(msg, sizeof msg, "the frame is not one msgpack object: %s", err.msg);
        /* Refused whole, but its id may still be read (a client with many
         * requests in flight then knows which one failed). */
        const char *id;
        size_t n;
        if (zi_msgpack_peek_str(buf, len, "id", &id, &n) && n > 0 && n <= 256 &&
            zi_utf8_valid(id, n)) {
            c.id = id, c.id_len = n;
            /* Not when a request of that id is in flight: its client would
             * take this error for that request's end. */
            if (find_client_req(rt, &c)) c.id = "", c.id_len = 0;
        }
        client_error(rt, &c, "invalid_request", msg, NULL);
        return;
    }
    const msgpack_object *o = &u.data;
    const char *op = NULL;
    size_t op_len = 0;
    if (o->type != MSGPACK_OBJECT_MAP) {
        client_error(rt, &c, "invalid_request", "the frame is not a msgpack map", NULL);
    } else if (zi_map_str(o, "id", &c.id, &c.id_len, &err) != ZI_OK) {
        c.id = "", c.id_len = 0;
        client_error(rt, &c, "invalid_request", err.msg, "id");
    } else if (c.id_len == 0 || c.id_len > 256 || !zi_utf8_valid(c.id, c.id_len)) {
        bool utf8 = zi_utf8_valid(c.id, c.id_len);
        c.id = "", c.id_len = 0; /* it cannot be echoed back as a str */
        client_error(rt, &c, "invalid_request",
                     utf8 ? "id: must be 1 to 256 bytes" : "id: not valid UTF-8", "id");
    } else if (zi_map_str(o, "op", &op, &op_len, &err) != ZI_OK) {
        client_error(rt, &c, "invalid_request", err.msg, "op");
    } else if (op_len == 8 && !memcmp(op, "generate", 8)) {
        op_generate(rt, &c, o);
    } else if (op_len == 6 && !memcmp(op, "cancel", 6)) {
        op_cancel(rt, &c);
    } else if (op_len == 6 && !memcmp(op, "health", 6)) {
        op_health(rt, &c);
    } else if (op_len == 6 && !memcmp(op, "models", 6)) {
        op_models(rt, &c);
    } else if (op_len == 8 && !memcmp(op, "tokenize", 8)) {
        op_util(rt, &c, o, K_TOKENIZE);
    } else if (op_len == 10 && !memcmp(op, "detokenize", 10)) {
        op_util(rt, &c, o, K_DETOKENIZE);
    } else {
        snprintf(msg, sizeof msg,
                 "op: unknown operation '%.*s' (generate, cancel, health, "
                 "models, tokenize, detokenize)",
                 (int)(op_len > 64 ? 64 : op_len), op);
        client_error(rt, &c, "invalid_request", msg, "op");
    }
    msgpack_unpacked_destroy(&u);
}

/* ---- backend frames ---------------------------------------------------------- */

static int find_backend(const router *rt, const unsigned char *ident, size_t len) {
    for (size_t i = 0; i < rt->n_be; i++)
        if (rt->be[i].alive && rt->be[i].ident_len == len && !memcmp(rt->be[i].ident, ident, len))
            return (int)i;
    return -1;
}

static void on_register(router *rt, const unsigned char *ident, size_t len,
                        const msgpack_object *o) {
    int b = find_backend(rt, ident, len);
    if (b < 0) {
        /* Reuse a dead slot: its requests were all ended when it died. */
        for (size_t i = 0; i < rt->n_be && b < 0; i++)
            if (!rt->be[i].alive) b = (int)i;
        if (b < 0) {
            backend *p = realloc(rt->be, (rt->n_be + 1) * sizeof *p);
            if (!p) return;
            rt->be = p;
            b = (int)rt->n_be++;
        }
        memset(&rt->be[b], 0, sizeof rt->be[b]);
    }
    backend *be = &rt->be[b];
    memcpy(be->ident, ident, len);
    be->ident_len = len;
    zi_im_register reg;
    zi_im_register_unpack(o, &reg);
    be->role = reg.worker ? ROLE_WORKER : ROLE_TOKENIZER;
    be->slots = (int)reg.slots;
    be->max_length = reg.max_length;
    be->vocab = reg.vocab;
    if (reg.model.p)
        snprintf(be->model, sizeof be->model, "%.*s", (int)(reg.model.n > 120 ? 120 : reg.model.n),
                 reg.model.p);
    be->alive = true;
    be->last_seen = zi_now_ms();
    if (be->role == ROLE_WORKER)
        zi_log(&rt->log, ZI_LOG_INFO, "worker %d registered: model %s, %d slots, context %lld", b,
               be->model, be->slots, (long long)be->max_length);
    else
        zi_log(&rt->log, ZI_LOG_INFO, "tokenizer %d registered", b);
    dispatch(rt);
}

/* Looks up the request a backend message is about (rid: the message's,
 * 0 when it had none); it must belong to that backend. */
static rreq *backend_req(router *rt, int b, int64_t rid) {
    if (rid <= 0) return NULL;
    rreq *r = zi_req_table_get(&rt->reqs, (uint64_t)rid);
    if (!r || (r->tok != b && r->wrk != b)) return NULL;
    return r;
}

static void on_encoded(router *rt, int b, const msgpack_object *o) {
    zi_im_encoded em;
    zi_im_encoded_unpack(o, &em);
    int64_t rid = em.rid;
    rreq *r = backend_req(rt, b, rid);
    if (!r || r->state != RS_ENCODING) {
        if (rid > 0) backend_rid_msg(rt, b, ZI_IM_RELEASE, (uint64_t)rid); /* ended meanwhile */
        return;
    }
    const msgpack_object *ctx = em.context_obj;
    if (em.has_prompt_tokens) r->prompt_tokens = em.prompt_tokens;
    if (!ctx) {
        fail_request(rt, r, "internal", "the tokenizer sent no context", NULL);
        return;
    }
    if (r->prompt_tokens > rt->max_prompt) {
        char msg[160];
        snprintf(msg, sizeof msg, "prompt: %lld tokens exceed this server's limit of %lld",
                 (long long)r->prompt_tokens, rt->max_prompt);
        fail_request(rt, r, "invalid_request", msg, "prompt");
        return;
    }
    r->prefix_key = prefix_key(ctx);
    zi_msg m;
    zi_im_start_pack(&(zi_im_start){.rid = (int64_t)r->rid, .context = ctx}, &m);
    /* Keep the bytes: the sbuffer's storage becomes the request's. */
    r->start_len = m.sb.size;
    r->start_msg = msgpack_sbuffer_release(&m.sb);
    if (rt->q_len == rt->q_cap) {
        size_t cap = rt->q_cap ? rt->q_cap * 2 : 64;
        uint64_t *q = realloc(rt->queue, cap * sizeof *q);
        if (!q) {
            fail_request(rt, r, "internal", "out of memory", NULL);
            return;
        }
        rt->queue = q;
        rt->q_cap = cap;
    }
    rt->queue[rt->q_len++] = r->rid;
    r->state = RS_QUEUED;
    dispatch(rt);
}

static void on_tokens(router *rt, int b, const msgpack_object *o) {
    zi_im_tokens tm;
    int bad = zi_im_tokens_unpack(o, &tm, NULL);
    rreq *r = backend_req(rt, b, tm.rid);
    if (!r || r->wrk != b || r->worker_done) return;
    zi_gen_status status = tm.gstatus;
    if (bad) {
        fail_request(rt, r, "internal", "the worker sent a malformed tokens message", NULL);
        return;
    }
    zi_codec_limits lim = zi_codec_limits_default();
    int32_t *v = NULL;
    size_t n = 0;
    if (zi_codec_decode_tokens(tm.token_ids.raw, &lim, "token_ids", &v, &n, NULL) == ZI_OK)
        r->completion_tokens += (int64_t)n;
    free(v);
    if (zi_gen_status_is_done(status)) {
        r->worker_done = true;
        r->state = RS_DECODING;
        rt->be[b].assigned--;
    }
    /* Log probabilities and the echoed prompt ride along through the
     * tokenizer, so they reach the client in the same frame as their text:
     * the decode message carries the tokens message's fields as they came. */
    zi_msg m;
    tm.rid = (int64_t)r->rid;
    zi_im_decode_pack(&tm, &m, NULL);
    to_backend(rt, r->tok, &m);
    zi_msg_free(&m);
    if (r->worker_done) dispatch(rt);
}

/* Not streamed: appends a decoded message's log probabilities to the
 * request's and keeps its echoed prompt (ids, their log probabilities,
 * text: a packed map) for the final frame. */
static int keep_extras(rreq *r, const zi_im_decoded *d) {
    zi_codec_limits lim = zi_codec_limits_default();
    if (d->logprobs.raw) {
        zi_logprobs lp;
        int rc = zi_codec_decode_logprobs(d->logprobs.raw, &lim, "logprobs", &lp, NULL);
        if (rc) return rc; /* the final frame would carry fewer than the tokens */
        for (size_t i = 0; i < lp.n && !rc; i++)
            rc = zi_logprobs_push(&r->lp, lp.token_logprobs[i], lp.top[i].ids, lp.top[i].logprobs,
                                  lp.top[i].n, NULL);
        zi_logprobs_free(&lp);
        if (rc) return rc;
        r->has_lp = true;
    }
    const msgpack_object *pids = d->prompt_token_ids.raw;
    if ((pids || d->prompt_logprobs.raw || d->prompt_text_obj) && !r->echo) {
        zi_imap e;
        zi_imap_init(&e);
        zi_imap_object(&e, "prompt_token_ids", pids);
        zi_imap_object(&e, "prompt_logprobs", d->prompt_logprobs.raw);
        zi_imap_object(&e, "prompt_text", d->prompt_text_obj);
        zi_msg m;
        zi_msg_init(&m);
        int rc = zi_imap_close(&e, &m.pk);
        r->echo_len = m.sb.size;
        r->echo = msgpack_sbuffer_release(&m.sb);
        if (rc || !r->echo) return ZI_ENOMEM;
    }
    return ZI_OK;
}

static void on_decoded(router *rt, int b, const msgpack_object *o) {
    zi_im_decoded d;
    int bad = zi_im_decoded_unpack(o, &d, NULL);
    rreq *r = backend_req(rt, b, d.rid);
    if (!r || r->tok != b || r->kind != K_GENERATE) return;
    const msgpack_object *ids = d.token_ids.raw;
    zi_gen_status status = d.gstatus;
    if (bad) {
        fail_request(rt, r, "internal", "the tokenizer sent a malformed decoded message", NULL);
        return;
    }
    bool has_ids = (ids->type == MSGPACK_OBJECT_ARRAY && ids->via.array.size > 0) ||
                   (ids->type == MSGPACK_OBJECT_MAP && zi_map_get(ids, "data") &&
                    zi_map_get(ids, "data")->type == MSGPACK_OBJECT_BIN &&
                    zi_map_get(ids, "data")->via.bin.size > 0);
    if (has_ids && !r->t_first_ms) r->t_first_ms = zi_now_ms();
    /* What rides along to the client: the tokens' log probabilities, and
     * the echoed prompt (its ids, their log probabilities, its text). */
    zi_im_chunk ch = {.id = {r->id, r->id_len},
                      .text = d.text,
                      .token_ids = ids,
                      .logprobs = d.logprobs.raw,
                      .prompt_token_ids = d.prompt_token_ids.raw,
                      .prompt_logprobs = d.prompt_logprobs.raw,
                      .prompt_text = d.prompt_text_obj};
    bool extras = ch.logprobs || ch.prompt_token_ids || ch.prompt_logprobs || ch.prompt_text;
    if (r->stream && (d.text.n > 0 || has_ids || extras)) {
        zi_msg m;
        zi_im_chunk_pack(&ch, &m);
        bool ok = to_client(rt, r, &m);
        zi_msg_free(&m);
        if (!ok) {
            end_request(rt, r);
            return;
        }
    } else if (!r->stream && extras && keep_extras(r, &d) != ZI_OK) {
        fail_request(rt, r, "internal", "cannot keep the log probabilities", NULL);
        return;
    }
    if (!r->stream && d.text.n > 0) {
        char *p = realloc(r->text, r->text_len + d.text.n + 1);
        if (!p) {
            fail_request(rt, r, "internal", "out of memory for the completion text", NULL);
            return;
        }
        memcpy(p + r->text_len, d.text.p, d.text.n);
        r->text_len += d.text.n;
        p[r->text_len] = '\0';
        r->text = p;
    }
    if (zi_gen_status_is_done(status)) {
        r->tok_has_state = false;                      /* the tokenizer dropped it */
        send_final(rt, r, zi_gen_status_name(status)); /* cancels the worker on a stop string */
    }
}

static void on_util_result(router *rt, int b, const msgpack_object *o, const char *key) {
    zi_im_util_reply u;
    int bad = zi_im_util_reply_unpack(o, key, &u, NULL);
    rreq *r = backend_req(rt, b, u.rid);
    if (!r || r->state != RS_UTIL) return;
    if (bad) {
        fail_request(rt, r, "internal", "the tokenizer sent a malformed reply", NULL);
        return;
    }
    zi_msg m;
    zi_im_result_pack(&(zi_im_result){.id = {r->id, r->id_len}, .key = key, .value = u.value_obj},
                      &m);
    to_client(rt, r, &m);
    zi_msg_free(&m);
    end_request(rt, r);
}

static void on_heartbeat(router *rt, int b, const msgpack_object *o) {
    zi_im_heartbeat hb;
    zi_im_heartbeat_unpack(o, &hb);
    for (int i = 0; i < ZI_N_KV_STATS; i++)
        if (hb.kv_set[i]) rt->be[b].kv[i] = hb.kv[i];
}

static void on_backend_error(router *rt, int b, const msgpack_object *o) {
    zi_im_error e;
    zi_im_error_unpack(o, &e);
    rreq *r = backend_req(rt, b, e.rid);
    if (!r) return;
    const char *code = e.code ? e.code : "internal";
    const char *msg = e.message ? e.message : "backend error";
    if (b == r->tok) r->tok_has_state = false; /* a tokenizer error drops its state */
    if (b == r->wrk && !r->worker_done) {
        r->worker_done = true; /* the worker dropped it */
        rt->be[b].assigned--;
    }
    fail_request(rt, r, code, msg, e.field);
    dispatch(rt);
}

static void on_backend_frame(router *rt, const unsigned char *ident, size_t ident_len,
                             const void *buf, size_t len) {
    zi_error err = {0};
    msgpack_unpacked u;
    if (zi_msgpack_parse(buf, len, NULL, &u, &err) != ZI_OK) {
        zi_log(&rt->log, ZI_LOG_WARN, "malformed backend message: %s", err.msg);
        return;
    }
    const msgpack_object *o = &u.data;
    int b = find_backend(rt, ident, ident_len);
    zi_im_type type = zi_im_type_of(o);
    if (type == ZI_IM_REGISTER) {
        on_register(rt, ident, ident_len, o);
    } else if (b < 0) {
        /* Unknown (e.g. this router restarted): ask it to register again. */
        zi_msg m;
        zi_im_reregister_pack(&m);
        zi_send_msg(rt->back, ident, ident_len, false, &m);
        zi_msg_free(&m);
    } else {
        rt->be[b].last_seen = zi_now_ms();
        if (type == ZI_IM_HEARTBEAT)
            on_heartbeat(rt, b, o);
        else if (type == ZI_IM_ENCODED)
            on_encoded(rt, b, o);
        else if (type == ZI_IM_TOKENS)
            on_tokens(rt, b, o);
        else if (type == ZI_IM_DECODED)
            on_decoded(rt, b, o);
        else if (type == ZI_IM_TOKENIZED)
            on_util_result(rt, b, o, "token_ids");
        else if (type == ZI_IM_DETOKENIZED)
            on_util_result(rt, b, o, "text");
        else if (type == ZI_IM_ERROR)
            on_backend_error(rt, b, o);
        else
            zi_log(&rt->log, ZI_LOG_WARN, "backend %d: unknown message type", b);
    }
    msgpack_unpacked_destroy(&u);
}

/* A request that backend *arg (an int) holds: its tokenizer, or the
 * worker still running it. */
static bool held_by(const void *val, const void *arg) {
    const rreq *r = val;
    int b = *(const int *)arg;
    return r->tok == b || (r->wrk == b && !r->worker_done);
}

/* Every request the backend held ends with worker_lost (found in one
 * walk of the table that allocates nothing, so none is left without its
 * frame). */
static void backend_died(router *rt, int b) {
    backend *be = &rt->be[b];
    rreq *r;
    size_t pos = 0;
    zi_log(&rt->log, ZI_LOG_WARN, "%s %d missed heartbeats for %lld ms: declared dead",
           be->role == ROLE_WORKER ? "worker" : "tokenizer", b, rt->hb_timeout);
    be->alive = false;
    /* Its cache is gone, and a new worker may register in its place. */
    for (int i = 0; i < ZI_AFFINITY_SLOTS; i++)
        if (rt->aff[i].worker == b) rt->aff[i].worker = -1;
    while ((r = zi_req_table_find(&rt->reqs, &pos, held_by, &b))) {
        bool on_worker = r->wrk == b && !r->worker_done;
        if (r->tok == b) r->tok_has_state = false;
        if (on_worker) {
            r->worker_done = true;
            be->assigned--;
        }
        fail_request(rt, r, "worker_lost",
                     r->tok == b ? "the tokenizer process handling this request stopped "
                                   "responding; the request was not retried"
                                 : "the model worker running this request stopped responding; "
                                   "the request was not retried",
                     NULL);
    }
    be->assigned = 0;
    dispatch(rt);
}

/* ---- main loop ---------------------------------------------------------------- */

/* Reads one multipart message: the routing id, an optional empty delimiter
 * (REQ clients), then the payload. */
static void recv_routed(router *rt, void *sock, bool front) {
    zmq_msg_t parts[4];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_init(&tmp);
        if (zmq_msg_recv(&tmp, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&tmp);
            break;
        }
        more = zmq_msg_more(&tmp);
        if (n < 4)
            parts[n++] = tmp;
        else
            zmq_msg_close(&tmp); /* over-long envelopes are dropped below */
    }
    bool ok = n == 2 || (n == 3 && zmq_msg_size(&parts[1]) == 0);
    if (ok && zmq_msg_size(&parts[0]) <= IDENT_MAX) {
        zmq_msg_t *id = &parts[0], *pl = &parts[n - 1];
        if (front)
            on_client_frame(rt, zmq_msg_data(id), zmq_msg_size(id), n == 3, zmq_msg_data(pl),
                            zmq_msg_size(pl));
        else
            on_backend_frame(rt, zmq_msg_data(id), zmq_msg_size(id), zmq_msg_data(pl),
                             zmq_msg_size(pl));
    } else if (n > 0) {
        zi_log(&rt->log, ZI_LOG_WARN, "dropped a message with %d frames (expected 2)", n);
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&parts[i]);
}

static int parse_args(int argc, char **argv, router *rt, const char **bind, const char **back) {
    zi_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "zinfer-router: unknown option or missing value '%s' (see --help)\n",
                    a);
            return 2;
        }
        const char *v = argv[++i];
        int rc = 0;
        if (!strcmp(a, "--bind"))
            *bind = v;
        else if (!strcmp(a, "--backend"))
            *back = v;
        else if (!strcmp(a, "--max-queue"))
            rc = zi_parse_int(a, v, 1, 1 << 24, &rt->max_queue, &err);
        else if (!strcmp(a, "--max-prompt-tokens"))
            rc = zi_parse_int(a, v, 1, 1 << 24, &rt->max_prompt, &err);
        else if (!strcmp(a, "--max-new-tokens"))
            rc = zi_parse_int(a, v, 1, 1 << 24, &rt->max_new, &err);
        else if (!strcmp(a, "--heartbeat-timeout"))
            rc = zi_parse_int(a, v, 100, 3600000, &rt->hb_timeout, &err);
        else if (!strcmp(a, "--max-frame-bytes"))
            rc = zi_parse_int(a, v, 1024, 1LL << 31, &rt->max_frame, &err);
        else if (!strcmp(a, "--log-level")) {
            rt->log.level = zi_log_level_parse(v);
            if (rt->log.level < 0)
                rc = zi_error_set(&err, ZI_EINVAL, "--log-level: '%s' is unknown", v);
        } else {
            fprintf(stderr, "zinfer-router: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (rc) {
            fprintf(stderr, "zinfer-router: %s\n", err.msg);
            return 2;
        }
    }
    return 0;
}

/* max_msg: the largest message ZeroMQ takes from a peer (-1: any); one
 * larger closes that peer's connection without a reply, and is never held
 * in memory whole. */
static void *make_router_socket(router *rt, void *zctx, const char *addr, const char *what,
                                int64_t max_msg) {
    void *s = zmq_socket(zctx, ZMQ_ROUTER);
    int one = 1, zero = 0;
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
    /* Unroutable sends fail (EHOSTUNREACH) instead of vanishing: that is
     * how a departed client is noticed. No high-water mark: the router
     * never blocks on one slow peer. */
    zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(s, addr) != 0) {
        zi_log(&rt->log, ZI_LOG_ERROR, "cannot bind the %s socket to %s: %s", what, addr,
               zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    return s;
}

int main(int argc, char **argv) {
    router rt;
    memset(&rt, 0, sizeof rt);
    rt.log = (zi_logger){.out = stderr, .level = ZI_LOG_INFO, .tag = "zinfer-router"};
    rt.max_queue = 256;
    rt.max_prompt = 4096;
    rt.max_new = 4096;
    rt.hb_timeout = 5000;
    rt.max_frame = 8 << 20;
    const char *bind = "tcp://127.0.0.1:5555", *back = "tcp://127.0.0.1:5556";
    int rc = parse_args(argc, argv, &rt, &bind, &back);
    if (rc) return rc;
    zi_stop_signals_install();
    zi_req_table_init(&rt.reqs);
    void *zctx = zmq_ctx_new();
    /* Frames up to --max-frame-bytes are read, larger ones up to 4x that
     * are answered with an error, anything larger drops the connection:
     * one client cannot make the router hold an unbounded frame. */
    rt.front = make_router_socket(&rt, zctx, bind, "client", 4 * (int64_t)rt.max_frame);
    rt.back = rt.front ? make_router_socket(&rt, zctx, back, "backend", -1) : NULL;
    if (!rt.front || !rt.back) {
        if (rt.front) zmq_close(rt.front);
        zmq_ctx_term(zctx);
        return 1;
    }
    zi_log(&rt.log, ZI_LOG_INFO, "clients on %s, backends on %s", bind, back);
    int64_t last_check = zi_now_ms();
    while (!zi_stop_requested()) {
        zmq_pollitem_t it[2] = {{rt.front, 0, ZMQ_POLLIN, 0}, {rt.back, 0, ZMQ_POLLIN, 0}};
        int pr = zmq_poll(it, 2, 100);
        if (pr < 0 && errno != EINTR) {
            zi_log(&rt.log, ZI_LOG_ERROR, "poll: %s", zmq_strerror(errno));
            break;
        }
        /* Backends first: their replies free capacity for new requests. */
        for (int k = 0; k < 256 && pr > 0 && (it[1].revents & ZMQ_POLLIN); k++) {
            int ev = 0;
            size_t sz = sizeof ev;
            zmq_getsockopt(rt.back, ZMQ_EVENTS, &ev, &sz);
            if (!(ev & ZMQ_POLLIN)) break;
            recv_routed(&rt, rt.back, false);
        }
        for (int k = 0; k < 256 && pr > 0 && (it[0].revents & ZMQ_POLLIN); k++) {
            int ev = 0;
            size_t sz = sizeof ev;
            zmq_getsockopt(rt.front, ZMQ_EVENTS, &ev, &sz);
            if (!(ev & ZMQ_POLLIN)) break;
            recv_routed(&rt, rt.front, true);
        }
        int64_t now = zi_now_ms();
        if (now - last_check >= 100) {
            last_check = now;
            for (size_t i = 0; i < rt.n_be; i++)
                if (rt.be[i].alive && now - rt.be[i].last_seen > rt.hb_timeout)
                    backend_died(&rt, (int)i);
        }
    }
    /* Shutting down: every request still in flight gets its terminal frame
     * (one walk of the table, allocating nothing). */
    zi_log(&rt.log, ZI_LOG_INFO, "shutting down with %zu requests in flight",
           zi_req_table_count(&rt.reqs));
    size_t pos = 0;
    for (void *one; (one = zi_req_table_find(&rt.reqs, &pos, any_req, NULL));)
        fail_request(&rt, one, "unavailable", "the server is shutting down", NULL);
    zi_req_table_free(&rt.reqs);
    free(rt.be);
    free(rt.queue);
    /* The sockets drop unsent frames on close (LINGER 0, so that a gone peer
     * never holds the router); the terminal frames just queued get a
     * second to leave. */
    int linger_ms = 1000;
    zmq_setsockopt(rt.front, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
    zmq_close(rt.front);
    zmq_close(rt.back);
    zmq_ctx_term(zctx);
    return 0;
}
