/*
 * worker_main.c - the `zinfer-worker` process: one model replica behind the
 * router.
 *
 * It connects a DEALER socket to the router's backend address, registers
 * (role "worker", its slot count and context size), loads the model and
 * then runs the generator loop:
 *
 *   take new contexts and cancellations from the router (non-blocking while
 *   anything is running, 100 ms otherwise) -> --num-steps generator steps
 *   over every live context (each one batched forward pass: continuous
 *   batching) -> send each request's new token ids, log probabilities and
 *   final status -> release finished contexts -> heartbeat once a second.
 *
 * The router never sends more contexts than the worker has slots; a context
 * that arrives anyway, or that the generator cannot run (bad sampling
 * parameters, too long for a slot), is answered with an "error" message for
 * that request alone, so one bad request never stops the batch. Messages are
 * described in docs/protocol.md.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "args.h"
#include "codec.h"
#include "cpu_backend.h"
#include "generator.h"
#include "log.h"
#include "model.h"
#include "tokenizer.h"
#include "wire.h"

static const char USAGE[] =
    "usage: zinfer-worker [options]\n"
    "\n"
    "A model worker: connects to the router, registers, and generates tokens\n"
    "for the requests the router assigns (continuous batching).\n"
    "\n"
    "  --router ADDR      the router's backend address (default tcp://127.0.0.1:5556)\n"
    "  --model PATH       the GGUF model (default $ZINFER_MODEL or the downloaded default)\n"
    "  --threads N        compute threads (default: all CPUs)\n"
    "  --slots N          sequences generated at once (default 8)\n"
    "  --ctx-size N       positions per sequence (default 1024, at most the model's)\n"
    "  --batch-size N     tokens per forward pass (default 256)\n"
    "  --num-steps N      decode steps per scheduling round (default 1): more\n"
    "                     means fewer trips through the message loop, but new\n"
    "                     requests and cancellations wait up to N steps\n"
    "  --log-level L      debug|info|warn|error|off (default info)\n"
    "  -h, --help         this text\n";

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

typedef struct live_ctx {
    uint64_t rid;
    zi_text_context ctx;
    bool echo_sent; /* the prompt's ids (and log probabilities) went out */
} live_ctx;

typedef struct worker {
    zi_logger log;
    void *sock;
    zi_generator *gen;
    int slots, ctx_size;
    live_ctx *live; /* [slots] */
    int n_live;
    char model_name[256];
    int vocab;
} worker;

static void send_register(worker *w) {
    zi_msg m;
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 6);
    zi_pack_kv_str(&m.pk, "type", "register");
    zi_pack_kv_str(&m.pk, "role", "worker");
    zi_pack_kv_int(&m.pk, "slots", w->slots);
    zi_pack_kv_int(&m.pk, "max_length", w->ctx_size);
    zi_pack_kv_str(&m.pk, "model", w->model_name);
    zi_pack_kv_int(&m.pk, "vocab", w->vocab);
    zi_send_msg(w->sock, NULL, 0, false, &m);
    zi_msg_free(&m);
}

static void send_heartbeat(worker *w) { zi_send_heartbeat(w->sock, w->n_live); }

static void send_error(worker *w, uint64_t rid, const char *code, const char *msg) {
    zi_send_backend_error(w->sock, rid, code, msg);
}

static void drop_live(worker *w, int i) {
    zi_generator_release(w->gen, &w->live[i].ctx);
    zi_text_context_free(&w->live[i].ctx);
    w->live[i] = w->live[w->n_live - 1];
    w->n_live--;
}

static void drop_all(worker *w) {
    while (w->n_live > 0) drop_live(w, w->n_live - 1);
}

static void on_start(worker *w, const msgpack_object *o, uint64_t rid) {
    zi_error err = {0};
    const msgpack_object *c = zi_map_get(o, "context");
    if (w->n_live >= w->slots) {
        send_error(w, rid, "overloaded", "every slot of this worker is in use");
        return;
    }
    live_ctx *l = &w->live[w->n_live];
    l->rid = rid;
    l->echo_sent = false;
    zi_codec_limits lim = zi_codec_limits_default();
    if (!c) {
        send_error(w, rid, "internal", "context: missing in start message");
        return;
    }
    if (zi_codec_decode_text_context(c, &lim, "context", &l->ctx, &err)) {
        send_error(w, rid, "internal", err.msg);
        return;
    }
    int rc = zi_sampling_params_validate(&l->ctx.sampling_params, "sampling_params", &err);
    if (!rc && l->ctx.end_idx >= w->ctx_size)
        rc = zi_error_set(&err, ZI_ERANGE,
                          "prompt: %lld tokens leave no room in this worker's context of %d",
                          (long long)l->ctx.end_idx, w->ctx_size);
    if (rc) {
        send_error(w, rid, "invalid_request", err.msg);
        zi_text_context_free(&l->ctx);
        return;
    }
    /* The total length may not exceed one cache slot. */
    if (l->ctx.max_length > w->ctx_size) l->ctx.max_length = w->ctx_size;
    w->n_live++;
    zi_log(&w->log, ZI_LOG_DEBUG, "request %llu: %lld prompt tokens, max length %lld",
           (unsigned long long)rid, (long long)l->ctx.prompt_len, (long long)l->ctx.max_length);
}

static void on_message(worker *w, const void *buf, size_t len) {
    zi_error err = {0};
    msgpack_unpacked u;
    if (zi_msgpack_parse(buf, len, NULL, &u, &err)) {
        zi_log(&w->log, ZI_LOG_WARN, "bad message from the router: %s", err.msg);
        return;
    }
    const msgpack_object *o = &u.data;
    int64_t rid = 0;
    if (zi_map_str_is(o, "type", "start")) {
        if (zi_map_int(o, "rid", &rid, &err) == ZI_OK) on_start(w, o, (uint64_t)rid);
    } else if (zi_map_str_is(o, "type", "cancel")) {
        if (zi_map_int(o, "rid", &rid, &err) == ZI_OK)
            for (int i = 0; i < w->n_live; i++)
                if (w->live[i].rid == (uint64_t)rid) {
                    drop_live(w, i);
                    zi_log(&w->log, ZI_LOG_DEBUG, "request %lld cancelled", (long long)rid);
                    break;
                }
    } else if (zi_map_str_is(o, "type", "reregister")) {
        /* A restarted router knows none of our requests: drop them. */
        zi_log(&w->log, ZI_LOG_INFO, "router asks to register again; dropping %d requests",
               w->n_live);
        drop_all(w);
        send_register(w);
    } else {
        zi_log(&w->log, ZI_LOG_WARN, "unknown message type from the router");
    }
    msgpack_unpacked_destroy(&u);
}

/* Gathers the single-position log probabilities stored at [first,
 * first + count) of ctx into out; false when one is missing. */
static bool gather_logprobs(const zi_text_context *c, int64_t first, int64_t count,
                            zi_logprobs *out) {
    zi_logprobs_init(out);
    for (int64_t i = first; i < first + count; i++) {
        const zi_logprobs *lp = c->lp_data[i];
        if (!lp || lp->n != 1 ||
            zi_logprobs_push(out, lp->token_logprobs[0], lp->top[0].ids, lp->top[0].logprobs,
                             lp->top[0].n, NULL) != ZI_OK) {
            zi_logprobs_free(out);
            return false;
        }
    }
    return true;
}

/* Sends what the last steps produced for each live context; drops the
 * finished ones. The token that ended a sequence by EOS or a stop token id
 * is not part of the completion (as `zinfer generate` does), nor are its log
 * probabilities. The first message of an echo request also carries the
 * prompt's ids and, with logprobs, the prompt's log probabilities. */
static void send_outputs(worker *w) {
    for (int i = 0; i < w->n_live;) {
        live_ctx *l = &w->live[i];
        zi_text_context *c = &l->ctx;
        int64_t first, count;
        zi_text_context_take_outstanding(c, &first, &count);
        bool done = zi_text_context_is_done(c);
        if (done && count > 0 && (c->status == ZI_GEN_END_OF_SEQUENCE || c->status == ZI_GEN_STOP))
            count--;
        if (count > 0 || done) {
            zi_logprobs lp, plp;
            bool has_lp = c->log_probabilities > 0 && gather_logprobs(c, first, count, &lp);
            bool echo = c->log_probabilities_echo && !l->echo_sent;
            bool has_plp = echo && c->log_probabilities > 0 &&
                           gather_logprobs(c, 1, c->prompt_len - 1, &plp);
            zi_msg m;
            zi_msg_init(&m);
            msgpack_pack_map(&m.pk, 4 + has_lp + echo + has_plp);
            zi_pack_kv_str(&m.pk, "type", "tokens");
            zi_pack_kv_int(&m.pk, "rid", (int64_t)l->rid);
            zi_pack_str(&m.pk, "token_ids");
            zi_codec_pack_tokens(&m.pk, c->tokens + first, (size_t)count, NULL);
            zi_pack_kv_str(&m.pk, "status", zi_gen_status_name(c->status));
            if (has_lp) {
                zi_pack_str(&m.pk, "logprobs");
                zi_codec_pack_logprobs(&m.pk, &lp, NULL);
                zi_logprobs_free(&lp);
            }
            if (echo) {
                zi_pack_str(&m.pk, "prompt_token_ids");
                zi_codec_pack_tokens(&m.pk, c->tokens, (size_t)c->prompt_len, NULL);
                l->echo_sent = true;
            }
            if (has_plp) {
                zi_pack_str(&m.pk, "prompt_logprobs");
                zi_codec_pack_logprobs(&m.pk, &plp, NULL);
                zi_logprobs_free(&plp);
            }
            zi_send_msg(w->sock, NULL, 0, false, &m);
            zi_msg_free(&m);
        }
        if (done)
            drop_live(w, i);
        else
            i++;
    }
}

typedef struct wopts {
    char model[4096];
    const char *router;
    long long threads, slots, ctx, batch, steps;
    int log_level;
} wopts;

static int parse_args(int argc, char **argv, wopts *o) {
    zi_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "zinfer-worker: unknown option or missing value '%s' (see --help)\n",
                    a);
            return 2;
        }
        const char *v = argv[++i];
        long long iv = 0;
        int rc = 0;
        if (!strcmp(a, "--router"))
            o->router = v;
        else if (!strcmp(a, "--model"))
            snprintf(o->model, sizeof o->model, "%s", v);
        else if (!strcmp(a, "--threads"))
            rc = zi_parse_int(a, v, 0, 1024, &o->threads, &err);
        else if (!strcmp(a, "--slots"))
            rc = zi_parse_int(a, v, 1, 1024, &o->slots, &err);
        else if (!strcmp(a, "--ctx-size"))
            rc = zi_parse_int(a, v, 16, 1 << 20, &o->ctx, &err);
        else if (!strcmp(a, "--batch-size"))
            rc = zi_parse_int(a, v, 1, 1 << 16, &o->batch, &err);
        else if (!strcmp(a, "--num-steps"))
            rc = zi_parse_int(a, v, 1, 64, &o->steps, &err);
        else if (!strcmp(a, "--log-level")) {
            o->log_level = zi_log_level_parse(v);
            if (o->log_level < 0)
                rc = zi_error_set(&err, ZI_EINVAL, "--log-level: '%s' is unknown", v);
        } else {
            fprintf(stderr, "zinfer-worker: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        (void)iv;
        if (rc) {
            fprintf(stderr, "zinfer-worker: %s\n", err.msg);
            return 2;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    wopts o = {.router = "tcp://127.0.0.1:5556",
               .slots = 8,
               .ctx = 1024,
               .batch = 256,
               .steps = 1,
               .log_level = ZI_LOG_INFO};
    zi_default_model_path(o.model, sizeof o.model);
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    worker w;
    memset(&w, 0, sizeof w);
    w.log = (zi_logger){.out = stderr, .level = o.log_level, .tag = "zinfer-worker"};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    zi_error err = {0};
    zi_backend *be = NULL;
    zi_model *model = NULL;
    zi_cpu_options co = {.n_threads = (int)o.threads, .isa = NULL};
    if ((rc = zi_cpu_backend_create(&co, &be, &err)) ||
        (rc = zi_model_load(o.model, be, &model, &err))) {
        zi_log(&w.log, ZI_LOG_ERROR, "%s", err.msg);
        if (be) be->ops->destroy(be);
        return 1;
    }
    const zi_model_config *mc = zi_model_get_config(model);
    w.slots = (int)o.slots;
    w.ctx_size = (int)(o.ctx < mc->ctx_train ? o.ctx : mc->ctx_train);
    w.vocab = mc->n_vocab;
    const char *base = strrchr(o.model, '/');
    snprintf(w.model_name, sizeof w.model_name, "%.200s", base ? base + 1 : o.model);
    char *dot = strstr(w.model_name, ".gguf");
    if (dot) *dot = '\0';
    zi_generator_config gc = {
        .n_slots = w.slots, .ctx = w.ctx_size, .max_batch_tokens = (int)o.batch};
    w.live = calloc((size_t)w.slots, sizeof *w.live);
    if (!w.live || (rc = zi_generator_create(model, &gc, &w.gen, &err))) {
        zi_log(&w.log, ZI_LOG_ERROR, "%s", w.live ? err.msg : "out of memory");
        free(w.live);
        zi_model_free(model);
        be->ops->destroy(be);
        return 1;
    }
    void *zctx = zmq_ctx_new();
    w.sock = zi_backend_socket(zctx, o.router, &err);
    if (!w.sock) {
        zi_log(&w.log, ZI_LOG_ERROR, "%s", err.msg);
        rc = 1;
        goto out;
    }
    zi_log(&w.log, ZI_LOG_INFO, "model %s (%s x %d threads), %d slots x %d positions; router %s",
           w.model_name, zi_cpu_backend_isa(be), zi_cpu_backend_threads(be), w.slots, w.ctx_size,
           o.router);
    send_register(&w);
    int64_t last_hb = zi_now_ms();
    zi_text_context **batch = calloc((size_t)w.slots, sizeof *batch);
    if (!batch) {
        rc = 1;
        goto out;
    }
    while (!g_stop) {
        zmq_pollitem_t it = {w.sock, 0, ZMQ_POLLIN, 0};
        int pr = zmq_poll(&it, 1, w.n_live ? 0 : 100);
        if (pr < 0 && errno != EINTR) {
            zi_log(&w.log, ZI_LOG_ERROR, "poll: %s", zmq_strerror(errno));
            break;
        }
        /* Drain everything waiting before the next step. */
        for (;;) {
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, w.sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&msg);
                break;
            }
            on_message(&w, zmq_msg_data(&msg), zmq_msg_size(&msg));
            zmq_msg_close(&msg);
        }
        int64_t now = zi_now_ms();
        if (now - last_hb >= 1000) {
            send_heartbeat(&w);
            last_hb = now;
        }
        if (w.n_live == 0) continue;
        for (int i = 0; i < w.n_live; i++) batch[i] = &w.live[i].ctx;
        if (zi_generator_next_token(w.gen, batch, (size_t)w.n_live, (int)o.steps, &err)) {
            /* A failure of the step itself (not of one request): every
             * request in it ends with an error, the worker keeps serving. */
            zi_log(&w.log, ZI_LOG_ERROR, "step failed: %s", err.msg);
            for (int i = 0; i < w.n_live; i++) send_error(&w, w.live[i].rid, "internal", err.msg);
            drop_all(&w);
            continue;
        }
        send_outputs(&w);
    }
    free(batch);
    zi_log(&w.log, ZI_LOG_INFO, "shutting down");
out:
    drop_all(&w);
    zmq_close(w.sock);
    zmq_ctx_term(zctx);
    zi_generator_free(w.gen);
    free(w.live);
    zi_model_free(model);
    be->ops->destroy(be);
    return rc;
}
