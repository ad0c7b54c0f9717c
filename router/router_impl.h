/*
 * router_impl.h - the router core's state and what its files share;
 * included by the router's files and by white-box tests, nothing else.
 * The core (router_core.h, the static library zi_router_core) is the
 * request state machine without sockets; the shell around it is the
 * executable's:
 *
 *   core (zi_router_core, no ZeroMQ):
 *   router_core.c      the events (router_core.h), the outbox and clock,
 *                      the state transitions shared by the files below,
 *                      the counter check (zi_router_check), deadlines,
 *                      a client's or backend's connection closing
 *   router_client.c    the client side: client frames, the ops (generate,
 *                      cancel, health, models, tokenize, detokenize),
 *                      validation and admission
 *   router_backend.c   the backend side: register, heartbeats, encoded,
 *                      tokens, decoded, results and errors from backends,
 *                      dead backends; sending to a backend
 *   router_schedule.c  scheduling: the queue, choosing a tokenizer and a
 *                      worker (least loaded, prefix affinity), dispatch
 *   router_request.c   a request's end: replies to clients, the terminal
 *                      frames ("final", "error") and end_request
 *   router_failover.c  a dead worker's (tokenizer's) requests resumed on
 *                      another
 *   router_embed.c     the embed op's backend messages
 *   router_lora.c      LoRA adapters loaded and unloaded while serving
 *   router_restart.c   requests that outlive the router: the note in
 *                      "start", a restarted router's adoption of the
 *                      workers' sequences, the client's "resume"
 *   req_table.c        the request table
 *
 *   shell (zinfer-router only):
 *   router.c           main: options, the two ZeroMQ sockets and the
 *                      outbox that sends on them, the poll loop and its
 *                      100 ms tick, shutdown
 *   router_watch.c     the socket monitors: which connection a frame came
 *                      on, and connections that close (router_watch.h)
 *   router_zap.c       the CURVE key check (router_zap.h)
 *
 * There is no global state: every function takes the router. What one
 * core file defines and another uses is declared here; everything else
 * stays static in its file. These names carry no prefix: they are the
 * core library's internals (its API is router_core.h, zi_ prefixed), and
 * no other library is linked beside it.
 */
#ifndef ZI_ROUTER_IMPL_H
#define ZI_ROUTER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "embeddings.h"
#include "imsg.h"
#include "log.h"
#include "req_table.h"
#include "router_core.h"
#include "types.h"
#include "msg.h"

/* A backend's role, from its "register" message. */
enum { ROLE_NONE, ROLE_TOKENIZER, ROLE_WORKER };

/* What a request asked for (its client op). */
enum { K_GENERATE, K_TOKENIZE, K_DETOKENIZE, K_EMBED };

/* A request's phase (rreq.state): where it is on its way to a worker.
 * The states and their transitions are in router_core.h. */
enum { RS_ENCODING, RS_QUEUED, RS_RUNNING, RS_DECODING, RS_UTIL };

/* What a request holds on a tokenizer (rreq.tlink; router_core.h). */
enum { TL_NONE, TL_ON, TL_STATE, TL_WAITING };

/* The longest routing identity kept (longer envelopes are dropped). */
#define IDENT_MAX ZI_ROUTER_IDENT_MAX

typedef struct backend {
    unsigned char ident[IDENT_MAX];
    size_t ident_len;
    int role;
    bool alive;
    int slots;
    int64_t max_length;
    int64_t vocab;
    char model[ZI_ROUTER_MODEL_NAME]; /* the model it serves ("" from a backend that named none:
                                         any) */
    int assigned; /* workers: requests running; tokenizers: requests with state */
    int64_t last_seen;
    int64_t kv[ZI_N_KV_STATS]; /* workers: the KV counters of the last heartbeat */
    uint64_t disk;             /* workers: their disk tier's sharing id, from register (0: none) */
    zi_router_conn conn;       /* its connection when it registered */
} backend;

/* A message kept for a resend (failover), with the token ids it carries. */
typedef struct pend_msg {
    char *buf;
    size_t len, n_ids;
} pend_msg;

typedef struct rreq {
    uint64_t rid;
    unsigned char client[IDENT_MAX];
    size_t client_len;
    bool delim;
    char *id;
    size_t id_len;
    int kind;
    int state; /* its phase: RS_* */
    int tlink; /* what it holds on a tokenizer: TL_* */
    bool stream;
    int tok, wrk; /* backend indices, -1 when none (wrk stays set in RS_DECODING) */
    /* the model it runs on: its tokenizer and worker serve it ("": any) */
    char model[ZI_ROUTER_MODEL_NAME];
    bool loading; /* admitted waiting for its model's processes (--load-on-demand) */
    int64_t prompt_tokens, completion_tokens;
    char *text; /* the completion so far, when not streamed */
    size_t text_len;
    char *start_msg; /* the worker's "start" message, kept for failover */
    size_t start_len;
    /* Failover (router_failover.c): the ids the worker has sent so far
     * (the completion, the ending EOS left out), and the "start" message
     * that resumes from them while the request waits for a new worker. */
    int32_t *gen;
    size_t n_gen, gen_cap;
    bool gen_broken;  /* an id list could not be kept: no resume possible */
    bool echo_seen;   /* a worker's tokens arrived (the echo, if any, with them) */
    int resumes;      /* how many times it moved to another worker */
    bool note_resume; /* the next chunk says "resumed" */
    bool told_prompt; /* a chunk carried "prompt_tokens" */
    char *resume_msg;
    size_t resume_len;
    /* Tokenizer failover: the "encode" message, and the "decode" messages
     * the tokenizer has not answered yet (oldest first), kept to rebuild
     * the decode state on another tokenizer. */
    char *encode_msg;
    size_t encode_len;
    struct pend_msg *pend;
    size_t n_pend, pend_cap;
    bool pend_broken;    /* a decode message could not be kept */
    uint64_t prefix_key; /* a hash of the prompt's first tokens (0: too short) */
    int64_t index;       /* the request's index, echoed in its final frame */
    int64_t t_recv_ms;   /* core_now() at admission */
    int64_t t_first_ms;  /* core_now() at its first token (0: none yet) */
    int64_t t_last_ms;   /* core_now() at its latest tokens (inter-token latency) */
    /* Not streamed: what the final frame carries besides the text. */
    zi_logprobs lp; /* the completion's log probabilities, when asked for */
    bool has_lp;
    char *echo; /* a packed map: the echoed prompt's keys of the first decoded message */
    size_t echo_len;
    zi_router_conn client_conn; /* the client's connection (fd -1: unknown) */
    int64_t deadline_ms;        /* core_now() past which it ends "deadline_exceeded" (0: none) */
    /* the adapters it runs (its "lora", with MODEL:ADAPTER's): an unload
     * of one is refused while it is in flight (router_lora.c) */
    zi_lora_ref lora[ZI_MAX_LORA];
    size_t n_lora;
    /* RS_QUEUED: its place in its model's queue (rqueue), and its place in
     * the order of every queue (smaller: older; a resume goes first). */
    struct rreq *q_prev, *q_next;
    int64_t q_seq;
    struct rqueue *q_in; /* the queue it is in (queue_of when it was pushed) */
    /* the model record that counts it waiting (model_rec.waiting; NULL: none) */
    struct model_rec *wait_m;
    /* Router restart (router_restart.c). no_restart: asked for what a
     * restart cannot rebuild (log probabilities, echo) or has images (the
     * note would carry their bytes again): its start carries no note. orphan: taken over from a
     * worker after a restart, waiting for its client's "resume" since orphan_ms (TL_WAITING, no
     * tokenizer attached until then); adopted_done: the worker had ended it with adopted_status
     * before the restart. */
    bool no_restart, orphan, adopted_done;
    int64_t orphan_ms;
    int adopted_status; /* a zi_gen_status */
} rreq;

/* The requests of one model waiting for a worker (RS_QUEUED), oldest
 * first: a list through their q_prev / q_next. Every request of it has
 * the same workers to choose from, so when the oldest finds no free worker
 * none of the others does (dispatch looks at the heads only). */
typedef struct rqueue {
    rreq *head, *tail;
    size_t n;
} rqueue;

/* A client's "resume" for a request no worker has reported yet (a
 * restarted router waits for the workers' registers a while). */
typedef struct pending_resume {
    unsigned char client[IDENT_MAX];
    size_t client_len;
    bool delim;
    char *id;
    size_t id_len;
    int64_t tokens;
    zi_router_conn conn;
} pending_resume;

/* Prefix affinity: which worker last took a request whose prompt began
 * with a given key, so that the next one goes where its prefix is cached
 * in memory, and the disk tiers (their sharing ids, the latest first) of
 * the workers that took it, so that the next one can go to a worker that
 * reads one of them (--kv-disk) when none has it in memory. A disk id
 * outlives the worker: its files do. */
#define ZI_AFFINITY_SLOTS 1024
#define ZI_AFFINITY_DISKS 2
typedef struct affinity {
    uint64_t key;
    int worker;                       /* -1: none (it died) */
    uint64_t disk[ZI_AFFINITY_DISKS]; /* 0: none */
} affinity;

/* Keys are odd (0 means none): their low bit carries nothing. */
#define ZI_AFFINITY_SLOT(key) (((key) >> 1) % ZI_AFFINITY_SLOTS)

/* A model the router knows: named by --served-models (configured), or by
 * a backend's register. Requests are routed by it (router_schedule.c). */
#define ZI_ROUTER_MAX_MODELS ZI_IM_MAX_MODELS
typedef struct model_rec {
    char name[ZI_ROUTER_MODEL_NAME];
    bool configured;         /* named by --served-models */
    int64_t no_worker_since; /* core_now() when its last worker died (0: one is up, or none yet) */
    int64_t no_tok_since;    /* the same for its tokenizers */
    int64_t last_used_ms;    /* core_now() when a request of it was admitted or ended (0: never) */
    /* What load_model / unload_model asked (MW_*), until it is met: a load
     * until a worker of it registers (so MW_LOAD means no live worker
     * serves it, which zi_router_check asserts), an unload until the last
     * of its processes is gone or a request or load wants it back. */
    int want;
    /* keep_alive: how long it stays loaded once idle, as the latest
     * generate request of it said (ms, -1: forever); without one
     * (has_keep_alive false) the router's --keep-alive. */
    bool has_keep_alive;
    int64_t keep_alive_ms;
    rqueue q;       /* its requests waiting for a worker */
    size_t waiting; /* its requests counted in router.n_waiting */
    /* It could not be loaded (the model_failed op: zinfer serve saw its
     * processes fail to start), and why: its requests are refused with
     * that until a worker of it registers. */
    bool failed;
    char fail_msg[384];
} model_rec;

enum { MW_NONE, MW_LOAD, MW_UNLOAD };

typedef struct router {
    zi_logger log;
    model_rec models[ZI_ROUTER_MAX_MODELS]; /* the configured ones first, in their order */
    size_t n_models;
    bool on_demand; /* --load-on-demand: a configured model's requests wait for its processes */
    int64_t keep_alive_ms; /* --keep-alive: a model's default keep_alive (ms; -1: forever) */
    size_t starting;       /* --models-at-start: the first configured models want "load" */
    zi_router_io io;                 /* the outbox and the clock (router_core.h) */
    affinity aff[ZI_AFFINITY_SLOTS]; /* direct-mapped by key */
    zi_req_table reqs;
    backend *be;
    size_t n_be;
    rqueue any_q;                    /* the queue of requests of no model ("": any worker) */
    size_t q_len;                    /* queued requests, every model's */
    int64_t q_seq_back, q_seq_front; /* the last q_seq given at the back, at the front */
    uint64_t next_rid;
    size_t n_waiting; /* admitted and not yet running */
    long long max_queue, max_prompt, max_new, hb_timeout, max_frame;
    long long max_model_queue;  /* --max-queue-per-model (0: model_queue_limit's default) */
    long long max_thinking;     /* --max-thinking-tokens: the default budget (0: none) */
    long long failover_timeout; /* ms a request waits for a worker after the last died */
    int64_t no_worker_since;    /* core_now() when the last worker died (0: one is up) */
    int64_t no_tok_since;       /* the same for tokenizers */
    long long req_timeout;      /* --request-timeout: ms, 0 = none */
    long long client_hb;        /* --client-heartbeat: ms, 0 = none */
    zi_router_conn cur_conn;    /* the connection of the frame being handled */
    /* The last unknown backend asked to register again, and when (ms). */
    unsigned char rereg_ident[IDENT_MAX];
    size_t rereg_len;
    int64_t rereg_ms;
    long long max_embed_inputs, max_embed_tokens; /* per embed request */
    /* Router restart (router_restart.c): this start's epoch (in every
     * note), when it started, the resumes waiting for a worker's report,
     * and how long an adopted request waits for its client. */
    uint64_t epoch;
    int64_t t_start_ms;
    pending_resume *presume;
    size_t n_presume;
    long long resume_grace;
    /* Counters and histograms since start (the metrics op): finished
     * requests, tokens, latencies; running, waiting and the workers' KV
     * counters are filled in when asked. */
    zi_im_metrics metrics;
    struct router_lora *lora; /* router_lora.c's adapters and ops (NULL until the first) */
} router;

/* ---- router_core.c -------------------------------------------------------- */

/* The time now (io.now_ms), monotonic milliseconds. */
int64_t core_now(const router *rt);

/* Sends one frame through the outbox: 0, or -1 (errno set) when the peer
 * cannot be reached. */
int out_send(router *rt, zi_router_side side, const unsigned char *ident, size_t ident_len,
             bool delim, const void *data, size_t len);

/* out_send of a built message; an empty one (a failed encoder's) is not
 * sent: -1 with errno EINVAL. */
int out_send_msg(router *rt, zi_router_side side, const unsigned char *ident, size_t ident_len,
                 bool delim, const zi_msg *m);

/* The transitions of a request's tokenizer link and worker slot (the
 * state machine is in router_core.h); each keeps the backends' `assigned`
 * counts in step. */

/* TL_NONE or TL_WAITING -> TL_STATE (keeps_state) or TL_ON, on tokenizer t. */
void tok_attach(router *rt, rreq *r, int t, bool keeps_state);

/* TL_STATE -> TL_ON: the tokenizer dropped r's decode state by itself (a
 * final "decoded", its error), so r's end sends it no "release". */
void tok_dropped(rreq *r);

/* TL_ON or TL_STATE -> TL_NONE, or TL_WAITING when wait: r's tokenizer
 * count is given back (no message is sent). */
void tok_detach(router *rt, rreq *r, bool wait);

/* RS_RUNNING -> RS_DECODING: the worker is done with r (a final status,
 * its error, an embed's result) or gone; its slot is free. */
void wrk_release(router *rt, rreq *r);

/* Ends every request past its deadline with "deadline_exceeded". */
void deadline_check(router *rt, int64_t now);

/* ---- router_client.c ------------------------------------------------------ */

/* One frame from a client (ident: its routing id; delim: it came with an
 * empty delimiter frame, as from a REQ socket, and replies get one too).
 * Every frame that is not a cancel gets exactly one reply or starts a
 * request. */
void on_client_frame(router *rt, const unsigned char *ident, size_t ident_len, bool delim,
                     const void *buf, size_t len);

/* ---- router_backend.c ----------------------------------------------------- */

/* One frame from a tokenizer or worker (ident: its routing id). */
void on_backend_frame(router *rt, const unsigned char *ident, size_t ident_len, const void *buf,
                      size_t len);

/* Backend b missed its heartbeats or its connection closed (why says
 * which, for the log): it is no longer used. A worker's
 * requests are resumed on another worker, a tokenizer's generate
 * requests on another tokenizer (router_failover.c); its tokenize and
 * detokenize requests end with a "worker_lost" error. */
void backend_died(router *rt, int b, const char *why);

/* Sends m to backend b; nothing when b is -1 or dead (a failed send is
 * logged). */
void to_backend(router *rt, int b, const zi_msg *m);

/* "cancel" to a worker, or "release" to a tokenizer (type says which),
 * for request rid. */
void backend_rid_msg(router *rt, int b, zi_im_type type, uint64_t rid);

/* ---- router_embed.c ------------------------------------------------------- */

/* The embed op's backend messages: a tokenizer's embed_encoded (queued for
 * a worker as an embed message) and a worker's embedded (the client's
 * result). */
void on_embed_encoded(router *rt, rreq *r, const msgpack_object *o);
void on_embedded(router *rt, rreq *r, const msgpack_object *o);

/* ---- router_lora.c -------------------------------------------------------- */

/* load_lora_adapter (load) or unload_lora_adapter of adapter name on
 * model's live workers, answered to the client once each has replied
 * (or died): a result naming the adapter and its status, or the first
 * error. An unload of an adapter a request in flight names is refused
 * ("in_use"). path and scale: a load's. */
void lora_op_start(router *rt, const unsigned char *client, size_t client_len, bool delim,
                   const char *id, size_t id_len, const char *model, bool load, const char *name,
                   const char *path, double scale);
/* lora_adapters: the adapters of model (NULL: every model's). */
void lora_list(router *rt, const unsigned char *client, size_t client_len, bool delim,
               const char *id, size_t id_len, const char *model);
/* Worker b registered with the adapter names `names` (register's "loras",
 * may be NULL): they join the table, and each adapter loaded while
 * serving that b lacks is sent to it (before any request). */
void lora_on_register(router *rt, int b, const msgpack_object *names);
/* A worker's lora_done. */
void lora_on_done(router *rt, int b, const msgpack_object *o);
/* Worker b died: the ops waiting for it stop waiting. */
void lora_backend_died(router *rt, int b);
/* Frees the table (shutdown). */
void lora_free(router *rt);
/* set_lora_scales (llama-server's POST /lora-adapters): the adapters of
 * model that requests without any run, and their scales (list: maps with
 * "id" or "name", and "scale"; those left out or at 0 are not applied).
 * ZI_EINVAL with msg naming the entry at fault. */
int lora_set_global(router *rt, const char *model, const msgpack_object *list, char *msg,
                    size_t cap);
/* A request of model that names no adapter runs those set_lora_scales
 * applied (added to req's lora, at most ZI_MAX_LORA). */
void lora_apply_global(router *rt, const char *model, zi_request *req);

/* ---- router_schedule.c ---------------------------------------------------- */

/* Whether backend b serves model (NULL or "" is any model; a backend that
 * named no model serves any). */
bool serves(const backend *b, const char *model);

/* The least-loaded live backend of a role that serves model (-1: none);
 * workers must have a free slot. A tokenizer of a model that no live
 * tokenizer names is any tokenizer while the live workers serve one model
 * only (processes started by hand from differently named files). */
int pick_backend(const router *rt, int role, const char *model);

/* How many live backends have the role and serve model. */
int count_alive(const router *rt, int role, const char *model);

/* The context limit for new requests of model: the smallest live worker's
 * (0: no worker). */
int64_t worker_max_length(const router *rt, const char *model);

/* The record of model name (NULL: none). add: make one when there is none
 * (NULL when the table is full). */
model_rec *model_find(router *rt, const char *name, bool add);
/* The keep_alive that holds for m now (its latest request's, else the
 * router's default). */
int64_t model_keep_alive(const router *rt, const model_rec *m);

/* The model a request without a model_name runs on: the first configured
 * one; without --served-models, the first live worker's, or "" (any) when
 * none is up. */
const char *default_model(const router *rt);

/* How many requests of one model may wait (count in n_waiting) at once:
 * --max-queue-per-model, else all of --max-queue with one model and half
 * of it (at least 1) with several, so that one model's requests (one that
 * cannot load, or a flood) cannot fill the queue the others share. */
long long model_queue_limit(const router *rt);

/* The known model names, comma separated, into buf (for errors). */
void model_names(const router *rt, char *buf, size_t cap);

/* Appends r to its model's queue of requests waiting for a worker (O(1):
 * nothing is allocated, so it cannot fail). */
void queue_push(router *rt, rreq *r);

/* Takes r (RS_QUEUED) out of its model's queue. */
void queue_remove(router *rt, rreq *r);

/* The queue r waits in when queued: its model's, or the one of requests
 * of no model. */
rqueue *queue_of(router *rt, const rreq *r);

/* Counts r in (d = 1) or out of (d = -1) router.n_waiting and its model's
 * waiting count: admitted and not yet on a worker. */
void waiting_add(router *rt, rreq *r, int d);

/* The KV block size prefix affinity counts in: the largest one the live
 * workers' heartbeats report, ZI_ROUTER_BLOCK_DEFAULT before any has. */
int64_t worker_block_size(const router *rt);
#define ZI_ROUTER_BLOCK_DEFAULT 16 /* zinfer-worker's --block-size default */

/* The prompt-prefix key of an encoded context for model (0: too short to
 * share); the model's name is in the key, so one model's prompts never
 * send another's to a worker. */
uint64_t prefix_key(const router *rt, const msgpack_object *ctx, const char *model);

/* Starts queued requests on workers with free slots, oldest first; call
 * after anything that may free a slot or add a worker. Its cost does not
 * grow with the queues' length: each model's oldest request is looked at,
 * and a model without a free worker is passed over whole. */
void dispatch(router *rt);

/* Worker b is gone: no prefix stays bound to it (its memory); the disk
 * tier's ids stay (its files). */
void affinity_forget(router *rt, int b);

/* Worker b registered with keys (its register's "prefix_keys": the
 * prefix keys of the requests it took lately, oldest first; NULL: none):
 * each is noted as if b had just taken it, so that after a router restart
 * a worker warm for a prefix (in memory, or in its disk tier) is still
 * preferred. Values that are not keys (0, not a positive integer) are
 * skipped. */
void affinity_adopt(router *rt, int b, const msgpack_object *keys);

/* ---- router_failover.c --------------------------------------------------- */

/* Keeps the ids of a worker's tokens message (n of them) for r's resume;
 * on failure r can no longer be resumed (gen_broken), nothing else. */
void failover_keep(rreq *r, const int32_t *ids, size_t n);

/* r's worker died while running it: r goes back to the front of the
 * queue with a "start" message whose context is its prompt and the ids
 * generated so far, or, when that cannot be built, ends with
 * "worker_lost". The caller has released r's worker slot (wrk_release: r
 * is RS_DECODING). */
void failover_resume(router *rt, rreq *r);

/* The heartbeat tick: while no worker (of a request's model) is alive
 * for --failover-timeout, the requests waiting for one end (resumed ones
 * with "worker_lost", the others with "unavailable"); the same for
 * requests waiting for a tokenizer ("worker_lost"). Those waiting for a
 * model that could not be loaded (model_rec.failed, no worker of it up)
 * end at once, "unavailable" with the reason. */
void failover_check(router *rt, int64_t now);

/* Sends a "decode" message (m, carrying n_ids ids) to r's tokenizer and
 * keeps a copy until its answer (failover_decoded); with no tokenizer
 * (it died) the copy waits for the next one. */
void failover_decode(router *rt, rreq *r, const zi_msg *m, size_t n_ids);

/* r's tokenizer answered its oldest "decode". */
void failover_decoded(rreq *r);

/* r's tokenizer died (its decode state with it: tok_dropped): r waits
 * for another one (TL_WAITING, failover_attach), or ends with
 * "worker_lost" when it cannot be moved. */
void failover_tokenizer(router *rt, rreq *r);

/* Gives every request waiting for a tokenizer to a live one: its
 * "encode" again, or, once it was encoded, an "encode" with "replay" (the
 * ids the dead tokenizer had decoded) and then the unanswered "decode"
 * messages. Call when a tokenizer registers or a request starts waiting. */
void failover_attach(router *rt);

/* Adds r at the front of its model's queue, before every queued request
 * of every model. */
void queue_push_front(router *rt, rreq *r);

/* ---- router_restart.c ---------------------------------------------------- */

/* The "start" message of r with context ctx into m: with a note (the
 * router's record of r, handed back by the worker after a restart) when
 * note is given (a kept start's), else one made for r unless r is
 * no_restart. An imsg encoder's status. */
int restart_start_pack(router *rt, const rreq *r, const msgpack_object *ctx,
                       const msgpack_object *note, zi_msg *m);

/* A worker (backend b) registered with "live", the sequences it held
 * when this router started: each one this router can take over becomes
 * an orphan request waiting for its client's resume; the others are
 * cancelled on the worker. */
void restart_adopt(router *rt, int b, const msgpack_object *live);

/* A client's "resume" op: {"id", "tokens": the number of token ids it
 * holds of the stream}. */
void restart_resume(router *rt, const unsigned char *ident, size_t ident_len, bool delim,
                    const char *id, size_t id_len, const msgpack_object *o);

/* The tick: orphans whose client did not come back within
 * --resume-grace end (their worker slot freed); resumes that no worker
 * reported once the workers had time to register again are answered
 * "unavailable". */
void restart_check(router *rt, int64_t now);

/* Shutdown: the resumes still waiting are answered "unavailable", and
 * what the restart state holds is freed. */
void restart_free(router *rt);

/* ---- router_request.c ----------------------------------------------------- */

/* Sends m to a request's client; false (logged) when the client is gone. */
bool to_client(router *rt, const rreq *r, const zi_msg *m);

/* An "error" frame to a client that may have no request record (id: the
 * frame's id, may be empty; field: NULL or "" for none). msg and field may
 * quote client bytes: they are sent as valid UTF-8. */
void send_error_raw(router *rt, const unsigned char *client, size_t client_len, bool delim,
                    const char *id, size_t id_len, const char *code, const char *msg,
                    const char *field);

/* Removes r from the table, frees it, and releases what it holds on
 * backends (queue place, worker slot, tokenizer state): the one way a
 * request ends. The terminal frame (if any) has been sent by the caller. */
void end_request(router *rt, rreq *r);

/* Ends r with an "error" frame (logged). */
void fail_request(router *rt, rreq *r, const char *code, const char *msg, const char *field);

/* rc is an imsg encoder's result for m: true when m was built; else frees
 * m and ends r with an "internal" error (so r still gets its one terminal
 * frame) and returns false. err (may be NULL) is the encoder's error. */
bool built_or_fail(router *rt, rreq *r, int rc, zi_msg *m, const zi_error *err);

/* Ends r with its "final" frame (status: the finish reason; logged with
 * its token counts and times). */
void send_final(router *rt, rreq *r, const char *status, zi_im_str stop_string);

#endif
