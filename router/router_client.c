/*
 * router_client.c - the router's client side (router_impl.h lists the
 * router's files): one client frame (client protocol v1,
 * docs/protocol.md) is parsed, its id and op read, and the op run:
 * generate (validated, admitted, given a rid and sent to a tokenizer as
 * "encode"), cancel, health and models (answered here from the backend
 * records), tokenize and detokenize (checked here, answered by a
 * tokenizer), load_model and unload_model (a wish kept in the model's
 * record, which zinfer serve reads with models and acts on),
 * model_failed (zinfer serve says a model cannot load: its waiting
 * requests end with the reason). A frame that cannot be read gets one
 * "error" frame.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "imsg_embed.h"
#include "keypath.h"
#include "response_format.h"
#include "router_impl.h"
#include "utf8.h"

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
    r->tlink = TL_NONE;
    r->client_conn = rt->cur_conn;
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
    if (req->grammar.len && req->sampling_params.ignore_eos) {
        snprintf(msg, cap,
                 "grammar: a grammar's completion ends with the end-of-sequence token, which "
                 "sampling_params.ignore_eos turns off");
        return "invalid_request";
    }
    if (req->regex.len && req->sampling_params.ignore_eos) {
        snprintf(msg, cap,
                 "regex: a regex's completion ends with the end-of-sequence token, which "
                 "sampling_params.ignore_eos turns off");
        return "invalid_request";
    }
    if (kind != ZI_RF_NONE && req->sampling_params.ignore_eos) {
        snprintf(msg, cap,
                 "response_format: a JSON object ends with the end-of-sequence token, which "
                 "sampling_params.ignore_eos turns off");
        return "invalid_request";
    }
    return NULL;
}

/* The model a request names (name, len bytes; len 0: none) into *model:
 * a known model's name, or the default one when it names none. With
 * adapter (else NULL), "MODEL:ADAPTER" (vLLM's way of naming a LoRA
 * adapter) is MODEL with *adapter the bytes after the last ':' (a name
 * that is itself a model's wins); *adapter is "" otherwise. false (msg
 * filled in, naming the known models) when no such model is served. */
static bool resolve_model(router *rt, const char *name, size_t len, const char **model,
                          zi_im_str *adapter, char *msg, size_t cap) {
    if (adapter) *adapter = (zi_im_str){"", 0};
    if (len == 0) {
        *model = default_model(rt);
        return true;
    }
    char want[ZI_ROUTER_MODEL_NAME];
    const model_rec *mr = NULL;
    if (len < sizeof want) {
        memcpy(want, name, len);
        want[len] = '\0';
        mr = strlen(want) == len ? model_find(rt, want, false) : NULL;
        char *colon = mr || !adapter || strlen(want) != len ? NULL : strrchr(want, ':');
        if (colon && colon[1]) {
            *colon = '\0';
            if ((mr = model_find(rt, want, false)))
                *adapter = (zi_im_str){name + (colon + 1 - want), len - (size_t)(colon + 1 - want)};
        }
    }
    if (mr) {
        *model = mr->name;
        return true;
    }
    char names[200];
    model_names(rt, names, sizeof names);
    char shown[104]; /* the client's bytes, printable and on one line */
    zi_printable(shown, sizeof shown, name, len);
    snprintf(msg, cap, "model_name: no model named '%s' is served (known: %s; see op \"models\")",
             shown, names[0] ? names : "none yet");
    return false;
}

/* The "unavailable" message for model when it has no tokenizer (tk < 0)
 * or no worker. */
static void unavailable_msg(const char *model, int tk, char *msg, size_t cap) {
    const char *what = tk < 0 ? "tokenizer process" : "model worker";
    if (model && model[0])
        snprintf(msg, cap, "model '%.100s' is loading: no %s of it is connected yet; retry shortly",
                 model, what);
    else
        snprintf(msg, cap, "no %s is connected yet; retry shortly", what);
}

/* The per-model share of the queue (model_queue_limit): true (msg filled
 * in) when model already has that many requests waiting. */
static bool model_queue_full(router *rt, const char *model, char *msg, size_t cap) {
    const model_rec *m = model_find(rt, model, false);
    long long limit = model_queue_limit(rt);
    if (!m || m->waiting < (size_t)limit) return false;
    snprintf(msg, cap,
             "%zu requests of model '%.100s' are already waiting (--max-queue-per-model %lld); "
             "retry later",
             m->waiting, m->name, limit);
    return true;
}

/* --load-on-demand: whether a request for model, which has no tokenizer
 * or no worker up, may wait for them (a configured model); if so, its
 * wait for each starts now unless one is under way. */
static bool load_on_demand(router *rt, const char *model) {
    model_rec *mr = rt->on_demand ? model_find(rt, model, false) : NULL;
    if (!mr || !mr->configured) return false;
    int64_t now = core_now(rt);
    if (count_alive(rt, ROLE_TOKENIZER, model) == 0 &&
        (!mr->no_tok_since || now - mr->no_tok_since >= rt->failover_timeout))
        mr->no_tok_since = now;
    if (count_alive(rt, ROLE_WORKER, model) == 0 &&
        (!mr->no_worker_since || now - mr->no_worker_since >= rt->failover_timeout))
        mr->no_worker_since = now;
    return true;
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
    char msg[512], rf_field[128];
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
    }
    const char *model = "";
    zi_im_str adapter;
    if (!code &&
        !resolve_model(rt, req.model_name.p, req.model_name.len, &model, &adapter, msg, sizeof msg))
        code = "invalid_request", field = "model_name";
    if (!code && adapter.n == 0 && req.n_lora == 0) /* set_lora_scales' global adapters */
        lora_apply_global(rt, model, &req);
    if (!code && adapter.n > 0) { /* "MODEL:ADAPTER": the adapter joins the request's "lora" */
        if (adapter.n >= ZI_LORA_REF_NAME_MAX || req.n_lora >= ZI_MAX_LORA) {
            code = "invalid_request", field = "model_name";
            snprintf(msg, sizeof msg, "model_name: the adapter after ':' %s",
                     req.n_lora >= ZI_MAX_LORA ? "is one more than the 4 a request may run"
                                               : "has a name over 63 bytes");
        } else {
            zi_lora_ref *lr = &req.lora[req.n_lora++];
            lr->id = -1;
            memcpy(lr->name, adapter.p, adapter.n);
            lr->name[adapter.n] = '\0';
            lr->scale = 1.0f;
        }
    }
    int tk = pick_backend(rt, ROLE_TOKENIZER, model);
    bool no_worker = count_alive(rt, ROLE_WORKER, model) == 0;
    const model_rec *fm = model_find(rt, model, false);
    if (!code && no_worker && fm && fm->failed) { /* it would wait for nothing */
        code = "unavailable";
        snprintf(msg, sizeof msg, "model '%.100s' could not be loaded: %.380s", model,
                 fm->fail_msg);
    }
    bool wait = !code && (tk < 0 || no_worker) && load_on_demand(rt, model);
    if (!code && !wait && (tk < 0 || no_worker)) {
        code = "unavailable";
        unavailable_msg(model, tk, msg, sizeof msg);
    } else if (!code && rt->n_waiting >= (size_t)rt->max_queue) {
        code = "overloaded";
        snprintf(msg, sizeof msg,
                 "%zu requests are already waiting (--max-queue %lld); retry "
                 "later",
                 rt->n_waiting, rt->max_queue);
    } else if (!code && model_queue_full(rt, model, msg, sizeof msg)) {
        code = "overloaded";
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
    /* The default thinking budget, where a forced end of the section can
     * break nothing (docs/protocol.md). */
    if (!req.max_thinking_tokens && rt->max_thinking && req.n_messages &&
        !req.response_format.len && !req.grammar.len && !req.regex.len)
        req.max_thinking_tokens = rt->max_thinking;
    /* The seed's timestamp_ns: when the server received the request, unless
     * the client set it (then it travels on as given). */
    if (req.timestamp_ns == 0) req.timestamp_ns = rt->io.wall_ns(rt->io.ctx);
    r->index = req.index;
    /* what a router restart cannot rebuild: the log probabilities of the
     * tokens generated meanwhile, the echo; and images, whose bytes the
     * note would carry to the worker a second time (router_restart.c) */
    r->no_restart = req.logprobs > 0 || req.echo || req.n_images > 0;
    r->t_recv_ms = core_now(rt);
    long long timeout = req.timeout_ms ? req.timeout_ms : rt->req_timeout;
    if (timeout > 0) r->deadline_ms = r->t_recv_ms + timeout;
    r->stream = req.stream;
    snprintf(r->model, sizeof r->model, "%s", model);
    memcpy(r->lora, req.lora, req.n_lora * sizeof *req.lora);
    r->n_lora = req.n_lora;
    model_rec *mr = model_find(rt, model, false);
    if (mr) {
        mr->last_used_ms = r->t_recv_ms;
        /* keep_alive: the latest request's holds (Ollama's); none: the default */
        mr->has_keep_alive = req.has_keep_alive;
        mr->keep_alive_ms = req.has_keep_alive ? req.keep_alive_ms : 0;
        /* An unload that is done (no worker left) gives way to this request,
         * which loads the model back; one still under way waits for it. */
        if (mr->want == MW_UNLOAD && count_alive(rt, ROLE_WORKER, model) == 0) mr->want = MW_NONE;
    }
    r->state = RS_ENCODING; /* the tokenizer keeps its decode state from here */
    if (!wait)
        tok_attach(rt, r, tk, true);
    else /* failover_attach encodes it once its model's tokenizer and a worker
          * are up, against the context the worker reports (before, the
          * limit is not known: the model's training context is no bound) */
        r->tlink = TL_WAITING, r->loading = true;
    waiting_add(rt, r, 1);
    zi_im_encode em = {.rid = (int64_t)r->rid,
                       .has_max_length = true,
                       .max_length = worker_max_length(rt, model),
                       .request = &req};
    zi_msg m;
    int rc = zi_im_encode_pack(&em, &m, &err);
    zi_request_free(&req);
    /* Kept for a tokenizer failover (router_failover.c); without it (out
     * of memory) the request runs, only that failover is off. */
    if (!rc && (r->encode_msg = malloc(m.sb.size ? m.sb.size : 1))) {
        memcpy(r->encode_msg, m.sb.data, m.sb.size);
        r->encode_len = m.sb.size;
    }
    if (rc)
        fail_request(rt, r, "internal", err.msg, NULL);
    else if (wait && !r->encode_msg)
        fail_request(rt, r, "internal", "out of memory", NULL);
    else if (!wait)
        to_backend(rt, tk, &m);
    zi_msg_free(&m);
}

/* embed: checked here (shape, options, the input count); its tokenizer
 * encodes and bounds the inputs (router_embed.c takes it from there). */
/* An embed input that is one string or a non-empty list of strings. */
static bool zi_embed_all_strings(const msgpack_object *in) {
    if (in->type == MSGPACK_OBJECT_STR) return true;
    if (in->type != MSGPACK_OBJECT_ARRAY || in->via.array.size == 0) return false;
    for (uint32_t i = 0; i < in->via.array.size; i++)
        if (in->via.array.ptr[i].type != MSGPACK_OBJECT_STR) return false;
    return true;
}

/* Whether map key k is one of keys[0..n) (an op's known keys). */
static bool key_known(const msgpack_object *k, const char *const *keys, size_t n) {
    for (size_t j = 0; k->type == MSGPACK_OBJECT_STR && j < n; j++)
        if (strlen(keys[j]) == k->via.str.size && !memcmp(keys[j], k->via.str.ptr, k->via.str.size))
            return true;
    return false;
}

static void op_embed(router *rt, const client_ctx *c, const msgpack_object *o) {
    static const char *const keys[] = {"op",       "id",         "input", "pooling", "normalize",
                                       "truncate", "model_name", "query"};
    char msg[512];
    const char *code = "invalid_request", *field = NULL;
    msg[0] = '\0';
    for (uint32_t i = 0; i < o->via.map.size && !msg[0]; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        bool known = key_known(k, keys, sizeof keys / sizeof *keys);
        if (!known)
            snprintf(msg, sizeof msg, "unknown key '%.*s' in an embed request",
                     k->type == MSGPACK_OBJECT_STR
                         ? (int)(k->via.str.size > 64 ? 64 : k->via.str.size)
                         : 1,
                     k->type == MSGPACK_OBJECT_STR ? k->via.str.ptr : "?");
    }
    const msgpack_object *in = zi_map_get(o, "input"), *po = zi_map_get(o, "pooling");
    const msgpack_object *no = zi_map_get(o, "normalize"), *tr = zi_map_get(o, "truncate");
    const msgpack_object *mn = zi_map_get(o, "model_name"), *qu = zi_map_get(o, "query");
    zi_pooling pooling = ZI_POOLING_RANK;
    if (msg[0]) {
    } else if (!in) {
        field = "input", snprintf(msg, sizeof msg, "input: missing");
    } else if (in->type != MSGPACK_OBJECT_STR && in->type != MSGPACK_OBJECT_ARRAY &&
               in->type != MSGPACK_OBJECT_MAP) {
        field = "input";
        snprintf(msg, sizeof msg, "input: a string, a list of strings or token ids expected");
    } else if (in->type == MSGPACK_OBJECT_ARRAY && in->via.array.size > 0 &&
               in->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
               in->via.array.ptr[0].type != MSGPACK_OBJECT_NEGATIVE_INTEGER &&
               in->via.array.size > (uint64_t)rt->max_embed_inputs) {
        field = "input";
        snprintf(msg, sizeof msg, "input: %u inputs exceed this server's limit of %lld",
                 in->via.array.size, rt->max_embed_inputs);
    } else if (po && (po->type != MSGPACK_OBJECT_STR ||
                      zi_pooling_parse(po->via.str.ptr, po->via.str.size, &pooling) != ZI_OK)) {
        field = "pooling", snprintf(msg, sizeof msg, "pooling: one of none, mean, cls, last, rank");
    } else if (qu && qu->type != MSGPACK_OBJECT_STR) {
        field = "query", snprintf(msg, sizeof msg, "query: not a string");
    } else if (qu && qu->via.str.size == 0) {
        field = "query", snprintf(msg, sizeof msg, "query: empty");
    } else if (qu && pooling != ZI_POOLING_RANK) {
        field = "pooling", snprintf(msg, sizeof msg, "pooling: a query needs rank (or none given)");
    } else if (qu && !zi_embed_all_strings(in)) {
        field = "input";
        snprintf(msg, sizeof msg, "input: with a query, a document string or a list of them");
    } else if (no && no->type != MSGPACK_OBJECT_BOOLEAN) {
        field = "normalize", snprintf(msg, sizeof msg, "normalize: not a bool");
    } else if (tr && tr->type != MSGPACK_OBJECT_BOOLEAN) {
        field = "truncate", snprintf(msg, sizeof msg, "truncate: not a bool");
    } else if (mn && mn->type != MSGPACK_OBJECT_STR) {
        field = "model_name", snprintf(msg, sizeof msg, "model_name: not a string");
    }
    const char *model = "";
    if (!msg[0] && !resolve_model(rt, mn ? mn->via.str.ptr : NULL, mn ? mn->via.str.size : 0,
                                  &model, NULL, msg, sizeof msg))
        field = "model_name";
    if (!msg[0] && find_client_req(rt, c))
        field = "id", snprintf(msg, sizeof msg, "id: a request with this id is already in flight");
    int tk = pick_backend(rt, ROLE_TOKENIZER, model);
    if (!msg[0] && (tk < 0 || count_alive(rt, ROLE_WORKER, model) == 0)) {
        code = "unavailable";
        unavailable_msg(model, tk, msg, sizeof msg);
    } else if (!msg[0] && rt->n_waiting >= (size_t)rt->max_queue) {
        code = "overloaded";
        snprintf(msg, sizeof msg,
                 "%zu requests are already waiting (--max-queue %lld); retry later", rt->n_waiting,
                 rt->max_queue);
    } else if (!msg[0] && model_queue_full(rt, model, msg, sizeof msg)) {
        code = "overloaded";
    }
    rreq *r = NULL;
    if (!msg[0] && !(r = new_request(rt, c, K_EMBED)))
        code = "internal", snprintf(msg, sizeof msg, "out of memory");
    if (msg[0]) {
        client_error(rt, c, code, msg, field);
        return;
    }
    r->t_recv_ms = core_now(rt);
    snprintf(r->model, sizeof r->model, "%s", model);
    r->state = RS_ENCODING; /* the tokenizer keeps no state for an embed */
    tok_attach(rt, r, tk, false);
    waiting_add(rt, r, 1);
    zi_im_embed_encode em = {.rid = (int64_t)r->rid,
                             .max_length = worker_max_length(rt, model),
                             .max_tokens = rt->max_embed_tokens,
                             .truncate = tr && tr->via.boolean,
                             .normalize = no && no->via.boolean,
                             .input = in};
    if (po) em.pooling = (zi_im_str){po->via.str.ptr, po->via.str.size};
    if (qu) {
        em.query = (zi_im_str){qu->via.str.ptr, qu->via.str.size};
        em.pooling = (zi_im_str){"rank", 4};
    }
    zi_msg m;
    if (built_or_fail(rt, r, zi_im_embed_encode_pack(&em, &m), &m, NULL)) {
        to_backend(rt, tk, &m);
        zi_msg_free(&m);
    }
}

static void op_cancel(router *rt, const client_ctx *c) {
    rreq *r = find_client_req(rt, c);
    /* Cancelling a request that already ended is the usual race: ignore. */
    if (!r || (r->kind != K_GENERATE && r->kind != K_EMBED)) return;
    zi_log(&rt->log, ZI_LOG_DEBUG, "request %llu cancelled by the client",
           (unsigned long long)r->rid);
    send_final(rt, r, "cancelled", (zi_im_str){0});
}

static void op_health(router *rt, const client_ctx *c) {
    int nw = count_alive(rt, ROLE_WORKER, NULL), nt = count_alive(rt, ROLE_TOKENIZER, NULL);
    size_t running = zi_req_table_count(&rt->reqs) - rt->n_waiting;
    const char *status = nw > 0 && nt > 0 ? "ok" : "unavailable";
    zi_im_health h = {.id = {c->id, c->id_len},
                      .status = {status, strlen(status)},
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
    out_send_msg(rt, ZI_ROUTER_CLIENT, c->ident, c->ident_len, c->delim, &m);
    zi_msg_free(&m);
}

/* metrics: the counters kept since start, with what is in flight now and
 * each live worker's KV counters. */
static void op_metrics(router *rt, const client_ctx *c) {
    zi_im_metrics *m = &rt->metrics;
    m->id = (zi_im_str){c->id, c->id_len};
    m->waiting = (int64_t)rt->n_waiting;
    m->running = (int64_t)(zi_req_table_count(&rt->reqs) - rt->n_waiting);
    m->n_workers = 0;
    for (size_t i = 0; i < rt->n_be && m->n_workers < ZI_IM_MAX_WORKERS; i++)
        if (rt->be[i].alive && rt->be[i].role == ROLE_WORKER)
            memcpy(m->worker_kv[m->n_workers++], rt->be[i].kv, sizeof rt->be[i].kv);
    zi_msg out;
    zi_im_metrics_pack(m, &out);
    out_send_msg(rt, ZI_ROUTER_CLIENT, c->ident, c->ident_len, c->delim, &out);
    zi_msg_free(&out);
}

/* A request of model *arg (a char *). */
static bool of_model(const void *val, const void *arg) {
    return !strcmp(((const rreq *)val)->model, (const char *)arg);
}

/* models: every model the router knows, the configured ones first (the
 * first is the default), each "loaded" while a worker of it is up, else
 * "loading" (with --load-on-demand "unloaded" when no process of it is up
 * and no request waits for it), with its live workers' context limit and
 * vocabulary; with --load-on-demand also its requests and idle time. */
static void op_models(router *rt, const client_ctx *c) {
    zi_im_models ms = {.id = {c->id, c->id_len}};
    int64_t now = core_now(rt);
    for (size_t k = 0; k < rt->n_models && ms.n < ZI_IM_MAX_MODELS; k++) {
        const model_rec *mr = &rt->models[k];
        const char *name = mr->name;
        int64_t vocab = 0, waiting = 0, active = 0;
        for (size_t i = 0; i < rt->n_be && !vocab; i++)
            if (rt->be[i].alive && rt->be[i].role == ROLE_WORKER && !strcmp(rt->be[i].model, name))
                vocab = rt->be[i].vocab;
        size_t pos = 0;
        for (const rreq *r; (r = zi_req_table_find(&rt->reqs, &pos, of_model, name)); pos++) {
            active++;
            waiting += r->state == RS_ENCODING || r->state == RS_QUEUED;
        }
        bool up = count_alive(rt, ROLE_WORKER, name) > 0;
        bool any = up || count_alive(rt, ROLE_TOKENIZER, name) > 0;
        const char *state = up           ? "loaded"
                            : mr->failed ? "failed"
                            : !rt->on_demand || any || waiting > 0 || mr->want == MW_LOAD
                                ? "loading"
                                : "unloaded";
        /* What is asked of it: load_model's or unload_model's wish, else an
         * unload once its keep_alive has passed with nothing in flight. */
        int64_t ka = model_keep_alive(rt, mr);
        const char *want = mr->want == MW_LOAD     ? "load"
                           : mr->want == MW_UNLOAD ? "unload"
                           : ka >= 0 && any && active == 0 && now - mr->last_used_ms >= ka
                               ? "unload"
                               : "none";
        ms.v[ms.n++] = (zi_im_model_entry){{name, strlen(name)},
                                           up ? worker_max_length(rt, name) : 0,
                                           vocab,
                                           {state, strlen(state)},
                                           rt->on_demand,
                                           waiting,
                                           active,
                                           now - mr->last_used_ms,
                                           {want, strlen(want)},
                                           ka};
    }
    zi_msg m;
    zi_im_models_pack(&ms, &m);
    out_send_msg(rt, ZI_ROUTER_CLIENT, c->ident, c->ident_len, c->delim, &m);
    zi_msg_free(&m);
}

/* Answers the client's model op: model is now status. */
static void reply_model_status(router *rt, const client_ctx *c, const char *model,
                               const char *status) {
    zi_im_model_status st = {.id = {c->id, c->id_len},
                             .model = {model, strlen(model)},
                             .status = {status, strlen(status)}};
    zi_msg m;
    zi_im_model_status_pack(&st, &m);
    out_send_msg(rt, ZI_ROUTER_CLIENT, c->ident, c->ident_len, c->delim, &m);
    zi_msg_free(&m);
}

/* load_model / unload_model: the wish is kept in the model's record and
 * reported by the models op; zinfer serve acts on it (an unload waits
 * until no request of the model is in flight). The reply says where the
 * model stands now. */
static void op_model_wish(router *rt, const client_ctx *c, const msgpack_object *o, bool load) {
    const char *op = load ? "load_model" : "unload_model";
    static const char *const keys[] = {"op", "id", "model_name"};
    char msg[400];
    msg[0] = '\0';
    for (uint32_t i = 0; i < o->via.map.size && !msg[0]; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        bool known = key_known(k, keys, sizeof keys / sizeof *keys);
        if (!known) {
            char shown[80];
            zi_printable(shown, sizeof shown, k->type == MSGPACK_OBJECT_STR ? k->via.str.ptr : "?",
                         k->type == MSGPACK_OBJECT_STR ? k->via.str.size : 1);
            snprintf(msg, sizeof msg, "unknown key '%s' in a %s request", shown, op);
        }
    }
    if (msg[0]) {
        client_error(rt, c, "invalid_request", msg, NULL);
        return;
    }
    const msgpack_object *mn = zi_map_get(o, "model_name");
    if (!mn || mn->type != MSGPACK_OBJECT_STR || mn->via.str.size == 0) {
        client_error(rt, c, "invalid_request",
                     !mn ? "model_name: missing" : "model_name: not a non-empty string",
                     "model_name");
        return;
    }
    const char *model = "";
    if (!resolve_model(rt, mn->via.str.ptr, mn->via.str.size, &model, NULL, msg, sizeof msg)) {
        client_error(rt, c, "invalid_request", msg, "model_name");
        return;
    }
    model_rec *mr = model_find(rt, model, false);
    if (!rt->on_demand || !mr || !mr->configured) {
        snprintf(msg, sizeof msg, "%s: %s", op,
                 !rt->on_demand ? "this router loads and unloads no model (zinfer serve manages "
                                  "the models of a server with several, --models-max or "
                                  "--keep-alive, and no client keys)"
                                : "a model no zinfer serve of this router started");
        client_error(rt, c, "unsupported", msg, NULL);
        return;
    }
    bool up = count_alive(rt, ROLE_WORKER, model) > 0;
    bool any = up || count_alive(rt, ROLE_TOKENIZER, model) > 0;
    if (load && !up && mr->failed) { /* its supervisor will not try again */
        snprintf(msg, sizeof msg, "load_model: model '%.100s' could not be loaded: %.250s", model,
                 mr->fail_msg);
        client_error(rt, c, "unavailable", msg, NULL);
        return;
    }
    size_t pos = 0;
    bool busy = zi_req_table_find(&rt->reqs, &pos, of_model, model) != NULL;
    const char *status;
    if (load) {
        mr->want = up ? MW_NONE : MW_LOAD; /* a wished unload gives way */
        status = up ? "loaded" : "loading";
    } else {
        /* Kept even when nothing of it is up: processes still starting are
         * stopped too. */
        mr->want = MW_UNLOAD;
        status = any || busy ? "unloading" : "unloaded";
    }
    zi_log(&rt->log, ZI_LOG_INFO, "%s %s: %s", op, model, status);
    reply_model_status(rt, c, model, status);
}

/* model_failed: whoever starts a model's processes (zinfer serve) says it
 * could not load them (a bad file, not enough memory) and why. The
 * requests waiting for it end now, "unavailable" with that reason, and
 * new ones are refused with it, until a worker of it registers; without
 * this they waited --failover-timeout for nothing and held their places
 * in the queue the other models share. */
static void op_model_failed(router *rt, const client_ctx *c, const msgpack_object *o) {
    static const char *const keys[] = {"op", "id", "model_name", "message"};
    char msg[400];
    msg[0] = '\0';
    for (uint32_t i = 0; i < o->via.map.size && !msg[0]; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        if (key_known(k, keys, sizeof keys / sizeof *keys)) continue;
        char shown[80];
        zi_printable(shown, sizeof shown, k->type == MSGPACK_OBJECT_STR ? k->via.str.ptr : "?",
                     k->type == MSGPACK_OBJECT_STR ? k->via.str.size : 1);
        snprintf(msg, sizeof msg, "unknown key '%s' in a model_failed request", shown);
    }
    if (msg[0]) {
        client_error(rt, c, "invalid_request", msg, NULL);
        return;
    }
    const msgpack_object *mn = zi_map_get(o, "model_name"), *why = zi_map_get(o, "message");
    const char *model = "";
    if (!mn || mn->type != MSGPACK_OBJECT_STR || mn->via.str.size == 0) {
        client_error(rt, c, "invalid_request",
                     !mn ? "model_name: missing" : "model_name: not a non-empty string",
                     "model_name");
        return;
    }
    if (!why || why->type != MSGPACK_OBJECT_STR || why->via.str.size == 0 ||
        !zi_utf8_valid(why->via.str.ptr, why->via.str.size)) {
        client_error(rt, c, "invalid_request",
                     !why ? "message: missing" : "message: not a non-empty UTF-8 string",
                     "message");
        return;
    }
    if (!resolve_model(rt, mn->via.str.ptr, mn->via.str.size, &model, NULL, msg, sizeof msg)) {
        client_error(rt, c, "invalid_request", msg, "model_name");
        return;
    }
    model_rec *mr = model_find(rt, model, false);
    if (!mr) { /* (resolve_model names known models only) */
        client_error(rt, c, "invalid_request", "model_name: not a model of this router",
                     "model_name");
        return;
    }
    mr->failed = true;
    mr->want = MW_NONE; /* a wished load cannot be met */
    /* Cut at a character boundary: the reason goes out in error frames. */
    size_t n =
        why->via.str.size < sizeof mr->fail_msg - 1 ? why->via.str.size : sizeof mr->fail_msg - 1;
    while (n > 0 && n < why->via.str.size && ((unsigned char)why->via.str.ptr[n] & 0xC0) == 0x80)
        n--;
    memcpy(mr->fail_msg, why->via.str.ptr, n);
    mr->fail_msg[n] = '\0';
    zi_log(&rt->log, ZI_LOG_WARN, "model %s could not be loaded: %s", model, mr->fail_msg);
    failover_check(rt, core_now(rt)); /* its waiting requests end now */
    const char *status = count_alive(rt, ROLE_WORKER, model) > 0 ? "loaded" : "failed";
    reply_model_status(rt, c, model, status);
}

/* load_lora_adapter / unload_lora_adapter (vLLM's names and fields) and
 * lora_adapters: checked here, run by router_lora.c. model_name absent:
 * the default model. */
static void op_lora(router *rt, const client_ctx *c, const msgpack_object *o, int which) {
    static const char *const names[] = {"load_lora_adapter", "unload_lora_adapter", "lora_adapters",
                                        "set_lora_scales"};
    static const char *const keys[] = {"op", "id", "model_name", "lora_name", "lora_path", "scale"};
    static const char *const set_keys[] = {"op", "id", "model_name", "adapters"};
    const size_t n_keys = which == 0 ? 6 : which == 1 ? 4 : which == 2 ? 3 : 4;
    char msg[400];
    msg[0] = '\0';
    for (uint32_t i = 0; i < o->via.map.size && !msg[0]; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        if (!key_known(k, which == 3 ? set_keys : keys, n_keys)) {
            char shown[80];
            zi_printable(shown, sizeof shown, k->type == MSGPACK_OBJECT_STR ? k->via.str.ptr : "?",
                         k->type == MSGPACK_OBJECT_STR ? k->via.str.size : 1);
            snprintf(msg, sizeof msg, "unknown key '%s' in a %s request", shown, names[which]);
        }
    }
    if (msg[0]) {
        client_error(rt, c, "invalid_request", msg, NULL);
        return;
    }
    const msgpack_object *mn = zi_map_get(o, "model_name");
    if (mn && mn->type != MSGPACK_OBJECT_STR) {
        client_error(rt, c, "invalid_request", "model_name: not a string", "model_name");
        return;
    }
    const char *model = NULL;
    if ((mn || which != 2) && /* lora_adapters without a model: every model's */
        !resolve_model(rt, mn ? mn->via.str.ptr : NULL, mn ? mn->via.str.size : 0, &model, NULL,
                       msg, sizeof msg)) {
        client_error(rt, c, "invalid_request", msg, "model_name");
        return;
    }
    if (which == 3) {
        if (lora_set_global(rt, model, zi_map_get(o, "adapters"), msg, sizeof msg)) {
            client_error_msg(rt, c, "invalid_request", msg);
            return;
        }
        which = 2; /* the answer: the model's adapters now */
    }
    if (which == 2) {
        lora_list(rt, c->ident, c->ident_len, c->delim, c->id, c->id_len, model);
        return;
    }
    char name[ZI_LORA_REF_NAME_MAX], path[1024] = "";
    const msgpack_object *ln = zi_map_get(o, "lora_name");
    if (!ln || ln->type != MSGPACK_OBJECT_STR || ln->via.str.size == 0 ||
        ln->via.str.size >= sizeof name) {
        client_error(rt, c, "invalid_request",
                     !ln ? "lora_name: missing" : "lora_name: not a string of 1 to 63 bytes",
                     "lora_name");
        return;
    }
    memcpy(name, ln->via.str.ptr, ln->via.str.size);
    name[ln->via.str.size] = '\0';
    for (size_t i = 0; i < ln->via.str.size; i++)
        if ((unsigned char)name[i] <= ' ' || name[i] == ':') {
            client_error(rt, c, "invalid_request",
                         "lora_name: a name has no spaces, control characters or ':'", "lora_name");
            return;
        }
    double scale = 1.0;
    if (which == 0) {
        const msgpack_object *lp = zi_map_get(o, "lora_path");
        if (!lp || lp->type != MSGPACK_OBJECT_STR || lp->via.str.size == 0 ||
            lp->via.str.size >= sizeof path || memchr(lp->via.str.ptr, 0, lp->via.str.size)) {
            client_error(rt, c, "invalid_request",
                         !lp ? "lora_path: missing" : "lora_path: not a path of 1 to 1023 bytes",
                         "lora_path");
            return;
        }
        memcpy(path, lp->via.str.ptr, lp->via.str.size);
        path[lp->via.str.size] = '\0';
        const msgpack_object *sc = zi_map_get(o, "scale");
        if (sc) {
            if (sc->type == MSGPACK_OBJECT_FLOAT32 || sc->type == MSGPACK_OBJECT_FLOAT64)
                scale = sc->via.f64;
            else if (sc->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
                scale = (double)sc->via.u64;
            else if (sc->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
                scale = (double)sc->via.i64;
            else
                scale = 1e300;
            if (!(scale > -1e6 && scale < 1e6)) {
                client_error(rt, c, "invalid_request", "scale: not a finite number", "scale");
                return;
            }
        }
    }
    lora_op_start(rt, c->ident, c->ident_len, c->delim, c->id, c->id_len, model, which == 0, name,
                  path, scale);
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
    /* The model whose vocabulary to use: model_name's, else the default. */
    const msgpack_object *mn = zi_map_get(o, "model_name");
    const char *model = "";
    char mmsg[400];
    if (mn && mn->type != MSGPACK_OBJECT_STR) {
        free(ids);
        client_error(rt, c, "invalid_request", "model_name: not a string", "model_name");
        return;
    }
    zi_im_str adapter; /* a tokenizer's work is the same under any adapter */
    if (!resolve_model(rt, mn ? mn->via.str.ptr : NULL, mn ? mn->via.str.size : 0, &model, &adapter,
                       mmsg, sizeof mmsg)) {
        free(ids);
        client_error(rt, c, "invalid_request", mmsg, "model_name");
        return;
    }
    int tk = pick_backend(rt, ROLE_TOKENIZER, model);
    char msg[400];
    if (tk >= 0 && rt->n_waiting >= (size_t)rt->max_queue) {
        /* tokenize/detokenize wait on the tokenizers as generate's encoding
         * does: the same bound keeps a flood of them (up to a frame of text
         * each) from queueing without end. */
        snprintf(msg, sizeof msg,
                 "%zu requests are already waiting (--max-queue %lld); retry later", rt->n_waiting,
                 rt->max_queue);
        free(ids);
        client_error(rt, c, "overloaded", msg, NULL);
        return;
    }
    if (tk >= 0 && model_queue_full(rt, model, msg, sizeof msg)) {
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
    snprintf(r->model, sizeof r->model, "%s", model);
    tok_attach(rt, r, tk, false);
    waiting_add(rt, r, 1);
    zi_msg m;
    int rc;
    if (kind == K_TOKENIZE) {
        const msgpack_object *as = zi_map_get(o, "add_special"); /* a bool, checked above */
        zi_im_tokenize tm = {.rid = (int64_t)r->rid,
                             .text = {v->via.str.ptr, v->via.str.size},
                             .has_add_special = as != NULL,
                             .add_special = as && as->via.boolean};
        rc = zi_im_tokenize_pack(&tm, &m);
    } else {
        zi_im_detokenize dm = {.rid = (int64_t)r->rid, .token_ids = {.v = ids, .n = n}};
        rc = zi_im_detokenize_pack(&dm, &m);
    }
    if (built_or_fail(rt, r, rc, &m, NULL)) {
        to_backend(rt, tk, &m);
        zi_msg_free(&m);
    }
    free(ids);
}

void on_client_frame(router *rt, const unsigned char *ident, size_t ident_len, bool delim,
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
    } else if ((op_len == 8 && !memcmp(op, "generate", 8)) ||
               (op_len == 6 && !memcmp(op, "speech", 6))) { /* speech: a generate with input */
        op_generate(rt, &c, o);
    } else if (op_len == 6 && !memcmp(op, "cancel", 6)) {
        op_cancel(rt, &c);
    } else if (op_len == 6 && !memcmp(op, "resume", 6)) {
        restart_resume(rt, c.ident, c.ident_len, c.delim, c.id, c.id_len, o);
    } else if (op_len == 6 && !memcmp(op, "health", 6)) {
        op_health(rt, &c);
    } else if (op_len == 6 && !memcmp(op, "models", 6)) {
        op_models(rt, &c);
    } else if (op_len == 7 && !memcmp(op, "metrics", 7)) {
        op_metrics(rt, &c);
    } else if (op_len == 8 && !memcmp(op, "tokenize", 8)) {
        op_util(rt, &c, o, K_TOKENIZE);
    } else if (op_len == 10 && !memcmp(op, "detokenize", 10)) {
        op_util(rt, &c, o, K_DETOKENIZE);
    } else if (op_len == 5 && !memcmp(op, "embed", 5)) {
        op_embed(rt, &c, o);
    } else if (op_len == 10 && !memcmp(op, "load_model", 10)) {
        op_model_wish(rt, &c, o, true);
    } else if (op_len == 12 && !memcmp(op, "unload_model", 12)) {
        op_model_wish(rt, &c, o, false);
    } else if (op_len == 12 && !memcmp(op, "model_failed", 12)) {
        op_model_failed(rt, &c, o);
    } else if (op_len == 17 && !memcmp(op, "load_lora_adapter", 17)) {
        op_lora(rt, &c, o, 0);
    } else if (op_len == 19 && !memcmp(op, "unload_lora_adapter", 19)) {
        op_lora(rt, &c, o, 1);
    } else if (op_len == 13 && !memcmp(op, "lora_adapters", 13)) {
        op_lora(rt, &c, o, 2);
    } else if (op_len == 15 && !memcmp(op, "set_lora_scales", 15)) {
        op_lora(rt, &c, o, 3);
    } else {
        char shown[80]; /* the client's bytes, printable and on one line */
        zi_printable(shown, sizeof shown, op, op_len);
        snprintf(msg, sizeof msg,
                 "op: unknown operation '%s' (generate, speech, cancel, resume, health, models, "
                 "metrics, tokenize, detokenize, embed, load_model, unload_model, "
                 "model_failed, load_lora_adapter, unload_lora_adapter, lora_adapters, "
                 "set_lora_scales)",
                 shown);
        client_error(rt, &c, "invalid_request", msg, "op");
    }
    msgpack_unpacked_destroy(&u);
}
