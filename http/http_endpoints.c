/*
 * http_endpoints.c - the paths of zinfer-http (http_endpoints.h): request
 * in, router calls, OpenAI-shaped answer out.
 */
#include "http_endpoints.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "http_api.h"
#include "http_speech.h"
#include "wav.h"
#include "http_embed.h"
#include "http_messages.h"
#include "http_rerank.h"
#include "http_reply.h"
#include "http_request.h"
#include "http_responses.h"
#include "http_router.h"
#include "imsg.h"
#include "stop_signal.h"

static void answer_error(zi_http_answer *a, const zi_http_error *e) {
    a->status = e->status;
    a->json = zi_http_error_json(e);
}

/* ---- one-shot router ops ------------------------------------------------ */

/* Sends {op, id} on c (or, when c is NULL, on a connection opened and closed
 * here) and waits up to health_timeout_ms for its result: 0 with *f to free,
 * or -1 with e set. */
static int router_op(zi_http_ctx *ctx, zi_http_conn *c, const char *op, const char *id,
                     zi_http_frame *f, zi_http_error *e) {
    zi_http_conn *own = NULL;
    if (!c) {
        if (zi_http_conn_open(ctx, &own, e)) return -1;
        c = own;
    }
    zi_msg m;
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 2);
    zi_pack_kv_str(&m.pk, "op", op);
    zi_pack_kv_str(&m.pk, "id", id);
    int rc = zi_http_call(c, &m, id, ctx->lim.health_timeout_ms, f, e);
    zi_msg_free(&m);
    zi_http_conn_close(own);
    return rc;
}

/* ---- the served models ------------------------------------------------ */

/* The router's models op as read here: each model's name, context length
 * and state ("loaded" or "loading"; an older router sends none: loaded). */
typedef struct model_list {
    int n;
    char name[ZI_HTTP_MAX_MODELS][128];
    long long max_length[ZI_HTTP_MAX_MODELS];
    char state[ZI_HTTP_MAX_MODELS][16];
} model_list;

/* The models, from ctx->model once the router listed them all loaded and
 * manages none (then the models of a running server do not change), else
 * from the router's models op (c: a connection to ask on, or NULL for one of its own). */
static int model_list_get(zi_http_ctx *ctx, zi_http_conn *c, model_list *l, zi_http_error *e) {
    zi_http_model *sm = &ctx->model;
    memset(l, 0, sizeof *l);
    pthread_mutex_lock(&sm->mu);
    l->n = sm->n;
    for (int k = 0; k < sm->n; k++) {
        memcpy(l->name[k], sm->name[k], sizeof l->name[k]);
        l->max_length[k] = sm->max_length[k];
        snprintf(l->state[k], sizeof l->state[k], "loaded");
    }
    pthread_mutex_unlock(&sm->mu);
    if (l->n) return 0;
    zi_http_frame f;
    if (router_op(ctx, c, "models", "m", &f, e)) return -1;
    const msgpack_object *ms = zi_map_get(f.root, "models");
    int all_loaded = 1;
    for (uint32_t k = 0; ms && ms->type == MSGPACK_OBJECT_ARRAY && k < ms->via.array.size &&
                         l->n < ZI_HTTP_MAX_MODELS;
         k++) {
        const msgpack_object *m = &ms->via.array.ptr[k];
        int64_t ml = 0;
        zi_map_int(m, "max_length", &ml, NULL);
        zi_http_frame_str(m, "name", l->name[l->n], sizeof l->name[l->n]);
        zi_http_frame_str(m, "state", l->state[l->n], sizeof l->state[l->n]);
        if (!l->state[l->n][0]) snprintf(l->state[l->n], sizeof l->state[l->n], "loaded");
        /* a model a --load-on-demand router reports (idle_ms) may unload */
        all_loaded &= !strcmp(l->state[l->n], "loaded") && !zi_map_get(m, "idle_ms");
        l->max_length[l->n++] = ml;
    }
    zi_http_frame_free(&f);
    if (!l->n) return zi_http_fail(e, 503, "unavailable", NULL, "no model is being served yet");
    if (all_loaded) {
        pthread_mutex_lock(&sm->mu);
        for (int k = 0; k < l->n; k++) {
            memcpy(sm->name[k], l->name[k], sizeof sm->name[k]);
            sm->max_length[k] = l->max_length[k];
        }
        sm->n = l->n;
        pthread_mutex_unlock(&sm->mu);
    }
    return 0;
}

/* The model a request names (want; NULL or "": the default, the router's
 * first): its name into name and its context length into *max_length
 * (may be NULL); a name the router does not serve is a 404 that lists the
 * served ones. */
static int served_model(zi_http_ctx *ctx, zi_http_conn *c, const char *want, char *name, size_t cap,
                        long long *max_length, zi_http_error *e) {
    model_list *l = malloc(sizeof *l);
    if (!l) return zi_http_fail(e, 500, "internal", NULL, "out of memory");
    if (model_list_get(ctx, c, l, e)) {
        free(l);
        return -1;
    }
    int k = 0;
    if (want && want[0])
        for (k = 0; k < l->n && strcmp(l->name[k], want); k++) {
        }
    /* "MODEL:ADAPTER", a LoRA adapter of a served model (vLLM's way): the
     * router splits it; the reply names what the client asked for */
    const char *colon = k == l->n && want ? strrchr(want, ':') : NULL;
    if (colon && colon[1] && colon > want) {
        int j = 0;
        while (j < l->n && (strlen(l->name[j]) != (size_t)(colon - want) ||
                            memcmp(l->name[j], want, (size_t)(colon - want))))
            j++;
        if (j < l->n) {
            snprintf(name, cap, "%s", want);
            if (max_length) *max_length = l->max_length[j];
            free(l);
            return 0;
        }
    }
    if (k == l->n) {
        char names[400];
        size_t at = 0;
        for (int j = 0; j < l->n && at < sizeof names; j++)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s'%s'", j ? ", " : "",
                                   l->name[j]);
        free(l);
        return zi_http_fail(e, 404, "model_not_found", "model",
                            "model: '%s' is not served here (this server serves %s)", want, names);
    }
    snprintf(name, cap, "%s", l->name[k]);
    if (max_length) *max_length = l->max_length[k];
    free(l);
    return 0;
}

static json_t *model_json(const char *name, long long max_length, const char *state) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(name));
    json_object_set_new(o, "object", json_string("model"));
    json_object_set_new(o, "created", json_integer(0));
    json_object_set_new(o, "owned_by", json_string("zinfer"));
    json_object_set_new(o, "max_model_len", json_integer(max_length));
    json_object_set_new(o, "state", json_string(state));
    return o;
}

/* The body's "model" (absent or null: the default) resolved as
 * served_model does. */
static int check_model(zi_http_ctx *ctx, zi_http_conn *c, json_t *body, char *name, size_t cap,
                       long long *max_length, zi_http_error *e) {
    json_t *m = json_object_get(body, "model");
    if (m && !json_is_null(m) && !json_is_string(m))
        return zi_http_fail(e, 400, "invalid_type", "model", "model: expected a string");
    return served_model(ctx, c, m && json_is_string(m) ? json_string_value(m) : NULL, name, cap,
                        max_length, e);
}

/* The router's lora_adapters op: each adapter's model, name, id, path
 * (of one loaded while serving) and global scale (llama-server's: what
 * requests without adapters run it at, 0: not applied); NULL when the
 * router cannot say. */
static json_t *lora_adapters(zi_http_ctx *ctx) {
    zi_http_frame f;
    zi_http_error e;
    if (router_op(ctx, NULL, "lora_adapters", "a", &f, &e)) return NULL;
    const msgpack_object *as = zi_map_get(f.root, "adapters");
    json_t *out = json_array();
    for (uint32_t k = 0; as && as->type == MSGPACK_OBJECT_ARRAY && k < as->via.array.size; k++) {
        const msgpack_object *m = &as->via.array.ptr[k];
        char model[256] = "", name[64] = "", path[1024] = "";
        int64_t id = -1;
        double scale = 1.0;
        zi_http_frame_str(m, "model", model, sizeof model);
        zi_http_frame_str(m, "name", name, sizeof name);
        zi_http_frame_str(m, "path", path, sizeof path);
        zi_map_int(m, "lora_id", &id, NULL);
        /* llama-server's "scale": the global one (set_lora_scales), 0 when not applied */
        const msgpack_object *s = zi_map_get(m, "applied_scale");
        if (s && (s->type == MSGPACK_OBJECT_FLOAT64 || s->type == MSGPACK_OBJECT_FLOAT32))
            scale = s->via.f64;
        else
            scale = 0.0;
        json_t *o = json_object();
        json_object_set_new(o, "id", json_integer(id));
        json_object_set_new(o, "name", json_string(name));
        json_object_set_new(o, "model", json_string(model));
        json_object_set_new(o, "path", path[0] ? json_string(path) : json_null());
        json_object_set_new(o, "scale", json_real(scale));
        json_array_append_new(out, o);
    }
    zi_http_frame_free(&f);
    return out;
}

/* GET /v1/models: every model the router knows, with its state, then
 * each LoRA adapter as vLLM lists one ("id" MODEL:ADAPTER, the name a
 * request gives, "parent" its model, "root" its file); GET
 * /v1/models/ID: that one. */
static void models(zi_http_ctx *ctx, const char *id, zi_http_answer *a) {
    zi_http_error e;
    model_list *l = malloc(sizeof *l);
    if (!l) {
        zi_http_fail(&e, 500, "internal", NULL, "out of memory");
        answer_error(a, &e);
        return;
    }
    if (model_list_get(ctx, NULL, l, &e)) {
        free(l);
        answer_error(a, &e);
        return;
    }
    json_t *data = json_array();
    for (int k = 0; k < l->n; k++)
        json_array_append_new(data, model_json(l->name[k], l->max_length[k], l->state[k]));
    json_t *ads = lora_adapters(ctx);
    for (size_t i = 0; ads && i < json_array_size(ads); i++) {
        json_t *ad = json_array_get(ads, i);
        const char *parent = json_string_value(json_object_get(ad, "model"));
        int k = 0;
        while (k < l->n && strcmp(l->name[k], parent)) k++;
        if (k == l->n) continue;
        char name[400];
        snprintf(name, sizeof name, "%s:%s", parent,
                 json_string_value(json_object_get(ad, "name")));
        json_t *o = model_json(name, l->max_length[k], l->state[k]);
        json_object_set_new(o, "parent", json_string(parent));
        json_t *path = json_object_get(ad, "path");
        json_object_set(o, "root", json_is_string(path) ? path : json_object_get(ad, "name"));
        json_array_append_new(data, o);
    }
    json_decref(ads);
    free(l);
    a->status = 200;
    if (id) { /* a model or an adapter, MODEL:ADAPTER */
        size_t k = 0;
        while (k < json_array_size(data) &&
               strcmp(json_string_value(json_object_get(json_array_get(data, k), "id")), id))
            k++;
        if (k == json_array_size(data)) {
            zi_http_fail(&e, 404, "model_not_found", "model", "model '%s' is not served here", id);
            answer_error(a, &e);
        } else {
            a->json = json_incref(json_array_get(data, k));
        }
        json_decref(data);
        return;
    }
    a->json = json_object();
    json_object_set_new(a->json, "object", json_string("list"));
    json_object_set_new(a->json, "data", data);
}

/* Sends msg (freed here), a model or adapter op of id "l", and waits for
 * its answer with the generation wait (a load may read a file on every
 * worker), not the health one. On failure the router's field model_name
 * is named as the client's: model. */
static int call_model_op(zi_http_ctx *ctx, zi_http_conn *c, zi_msg *msg, zi_http_frame *f,
                         zi_http_error *e) {
    int rc = zi_http_call(c, msg, "l", ctx->lim.router_timeout_ms, f, e);
    zi_msg_free(msg);
    if (rc && e->param[0] && !strcmp(e->param, "model_name"))
        snprintf(e->param, sizeof e->param, "model");
    return rc;
}

/* POST /models/load, POST /models/unload (llama-server's router mode):
 * body {"model": NAME}; the router's load_model / unload_model, whose
 * wish zinfer serve acts on. 200 {"success": true, "model", "status"}:
 * "loading" or "loaded", "unloading" (it waits for its requests) or
 * "unloaded". */
static void models_load(zi_http_ctx *ctx, const char *body, size_t len, int load,
                        zi_http_answer *a) {
    zi_http_error e;
    zi_http_conn *c = NULL;
    json_t *o = zi_http_parse_object(body, len, &e);
    json_t *m = o ? json_object_get(o, "model") : NULL;
    if (!o) goto fail;
    if (!m) {
        zi_http_fail(&e, 400, "missing", "model", "model is missing");
        goto fail;
    }
    if (!json_is_string(m) || !json_string_length(m)) {
        zi_http_fail(&e, 400, "invalid_type", "model", "model: expected a model's name");
        goto fail;
    }
    if (zi_http_conn_open(ctx, &c, &e)) goto fail;
    zi_msg msg;
    zi_msg_init(&msg);
    msgpack_pack_map(&msg.pk, 3);
    zi_pack_kv_str(&msg.pk, "op", load ? "load_model" : "unload_model");
    zi_pack_kv_str(&msg.pk, "id", "l");
    zi_pack_kv_strn(&msg.pk, "model_name", json_string_value(m), json_string_length(m));
    zi_http_frame f;
    if (call_model_op(ctx, c, &msg, &f, &e)) goto fail;
    char name[256], status[32];
    zi_http_frame_str(f.root, "model", name, sizeof name);
    zi_http_frame_str(f.root, "status", status, sizeof status);
    zi_http_frame_free(&f);
    a->status = 200;
    a->json = json_object();
    json_object_set_new(a->json, "success", json_true());
    json_object_set_new(a->json, "model", json_string(name));
    json_object_set_new(a->json, "status", json_string(status));
    zi_http_conn_close(c);
    json_decref(o);
    return;
fail:
    zi_http_conn_close(c);
    json_decref(o);
    answer_error(a, &e);
}

/* POST /v1/load_lora_adapter {"lora_name", "lora_path"[, "model",
 * "scale"]} and POST /v1/unload_lora_adapter {"lora_name"[, "model"]}
 * (vLLM's): the router's load_lora_adapter / unload_lora_adapter on
 * every worker of the model (absent: the default one). 200 with vLLM's
 * text; an unload of an adapter in use is a 409. */
static void lora_load(zi_http_ctx *ctx, const char *body, size_t len, int load, zi_http_answer *a) {
    zi_http_error e;
    zi_http_conn *c = NULL;
    json_t *o = zi_http_parse_object(body, len, &e);
    if (!o) goto fail;
    static const char *const keys[] = {"lora_name", "lora_path", "model", "scale", NULL};
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int known = 0;
        for (int i = 0; keys[i]; i++) known |= !strcmp(k, keys[i]) && (load || i == 0 || i == 2);
        if (!known) {
            zi_http_fail(&e, 400, "unknown_parameter", k, "%s: unknown parameter", k);
            goto fail;
        }
    }
    json_t *name = json_object_get(o, "lora_name"), *path = json_object_get(o, "lora_path");
    json_t *model = json_object_get(o, "model"), *scale = json_object_get(o, "scale");
    if (!name || !json_is_string(name)) {
        zi_http_fail(&e, 400, name ? "invalid_type" : "missing", "lora_name",
                     name ? "lora_name: expected a string" : "lora_name is missing");
        goto fail;
    }
    if (load && (!path || !json_is_string(path))) {
        zi_http_fail(&e, 400, path ? "invalid_type" : "missing", "lora_path",
                     path ? "lora_path: expected a string" : "lora_path is missing");
        goto fail;
    }
    if (model && !json_is_null(model) && !json_is_string(model)) {
        zi_http_fail(&e, 400, "invalid_type", "model", "model: expected a string");
        goto fail;
    }
    if (scale && !json_is_number(scale)) {
        zi_http_fail(&e, 400, "invalid_type", "scale", "scale: expected a number");
        goto fail;
    }
    if (zi_http_conn_open(ctx, &c, &e)) goto fail;
    int has_model = model && json_is_string(model);
    zi_msg msg;
    zi_msg_init(&msg);
    msgpack_pack_map(&msg.pk, 3 + (uint32_t)has_model + (load ? 1u + (scale != NULL) : 0u));
    zi_pack_kv_str(&msg.pk, "op", load ? "load_lora_adapter" : "unload_lora_adapter");
    zi_pack_kv_str(&msg.pk, "id", "l");
    zi_pack_kv_strn(&msg.pk, "lora_name", json_string_value(name), json_string_length(name));
    if (has_model)
        zi_pack_kv_strn(&msg.pk, "model_name", json_string_value(model), json_string_length(model));
    if (load) {
        zi_pack_kv_strn(&msg.pk, "lora_path", json_string_value(path), json_string_length(path));
        if (scale) {
            zi_pack_str(&msg.pk, "scale");
            msgpack_pack_double(&msg.pk, json_number_value(scale));
        }
    }
    zi_http_frame f;
    if (call_model_op(ctx, c, &msg, &f, &e)) goto fail;
    zi_http_frame_free(&f);
    char text[200];
    int n = snprintf(text, sizeof text, "Success: LoRA adapter '%s' %s successfully.",
                     json_string_value(name), load ? "added" : "removed");
    a->status = 200;
    a->text = strdup(text);
    a->text_len = a->text ? (size_t)n : 0;
    zi_http_conn_close(c);
    json_decref(o);
    return;
fail:
    zi_http_conn_close(c);
    json_decref(o);
    answer_error(a, &e);
}

/* POST /lora-adapters (llama-server's): [{"id" or "name", "scale"}] sets
 * the default model's global adapters, those requests without "lora" (or
 * MODEL:ADAPTER) run; those left out are not applied. The router's
 * set_lora_scales; 200 {"success": true}. */
static void lora_scales(zi_http_ctx *ctx, const char *body, size_t len, zi_http_answer *a) {
    zi_http_error e;
    zi_http_conn *c = NULL;
    json_error_t je;
    json_t *arr = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!arr || !json_is_array(arr)) {
        zi_http_fail(&e, 400, "invalid_type", NULL,
                     "the body must be a JSON array of {\"id\" or \"name\", \"scale\"}");
        goto fail;
    }
    zi_msg msg;
    zi_msg_init(&msg);
    msgpack_pack_map(&msg.pk, 3);
    zi_pack_kv_str(&msg.pk, "op", "set_lora_scales");
    zi_pack_kv_str(&msg.pk, "id", "s");
    zi_pack_str(&msg.pk, "adapters");
    msgpack_pack_array(&msg.pk, json_array_size(arr));
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *m = json_array_get(arr, i), *id = json_object_get(m, "id");
        json_t *name = json_object_get(m, "name"), *scale = json_object_get(m, "scale");
        if (!json_is_object(m) || (!json_is_integer(id) && !json_is_string(name)) ||
            (scale && !json_is_number(scale))) {
            zi_msg_free(&msg);
            zi_http_fail(&e, 400, "invalid_type", NULL,
                         "[%zu]: expected {\"id\": int or \"name\": str, \"scale\": number}", i);
            goto fail;
        }
        msgpack_pack_map(&msg.pk, 1 + (scale != NULL));
        if (json_is_string(name))
            zi_pack_kv_strn(&msg.pk, "name", json_string_value(name), json_string_length(name));
        else {
            zi_pack_str(&msg.pk, "id");
            msgpack_pack_int64(&msg.pk, json_integer_value(id));
        }
        if (scale) {
            zi_pack_str(&msg.pk, "scale");
            msgpack_pack_double(&msg.pk, json_number_value(scale));
        }
    }
    if (zi_http_conn_open(ctx, &c, &e)) {
        zi_msg_free(&msg);
        goto fail;
    }
    zi_http_frame f;
    int rc = zi_http_call(c, &msg, "s", ctx->lim.health_timeout_ms, &f, &e);
    zi_msg_free(&msg);
    if (rc) goto fail;
    zi_http_frame_free(&f);
    a->status = 200;
    a->json = json_pack("{s:b}", "success", 1);
    zi_http_conn_close(c);
    json_decref(arr);
    return;
fail:
    zi_http_conn_close(c);
    json_decref(arr);
    answer_error(a, &e);
}

/* ---- metrics ------------------------------------------------------------ */

/* Appends printf output to a growing text; -1 when out of memory. */
static int addf(char **b, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int addf(char **b, size_t *len, size_t *cap, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    return zi_http_buf_add(b, len, cap, line,
                           (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* The router's metrics op in Prometheus' text format (version 0.0.4). */
static void metrics(zi_http_ctx *ctx, zi_http_answer *a) {
    zi_http_error e;
    zi_http_frame f;
    if (router_op(ctx, NULL, "metrics", "x", &f, &e)) {
        answer_error(a, &e);
        return;
    }
    zi_im_metrics mt;
    zi_error err = {0};
    if (zi_im_metrics_unpack(f.root, &mt, &err)) {
        zi_http_frame_free(&f);
        zi_http_fail(&e, 500, "internal", NULL, "malformed metrics from the router: %s", err.msg);
        answer_error(a, &e);
        return;
    }
    zi_http_frame_free(&f);
    char *b = NULL;
    size_t len = 0, cap = 0;
    int bad = 0;
#define ADD(...) bad |= addf(&b, &len, &cap, __VA_ARGS__)
    ADD("# HELP zinfer_requests_running Requests on a worker or being decoded.\n"
        "# TYPE zinfer_requests_running gauge\nzinfer_requests_running %lld\n",
        (long long)mt.running);
    ADD("# HELP zinfer_requests_waiting Requests admitted and waiting for a worker or a "
        "tokenizer.\n# TYPE zinfer_requests_waiting gauge\nzinfer_requests_waiting %lld\n",
        (long long)mt.waiting);
    ADD("# HELP zinfer_requests_finished_total Generate requests ended, by how.\n"
        "# TYPE zinfer_requests_finished_total counter\n");
    for (int k = 0; k < ZI_IM_N_FIN; k++)
        ADD("zinfer_requests_finished_total{reason=\"%s\"} %lld\n", zi_im_finish_names[k],
            (long long)mt.finished[k]);
    ADD("# HELP zinfer_prompt_tokens_total Prompt tokens of finished requests.\n"
        "# TYPE zinfer_prompt_tokens_total counter\nzinfer_prompt_tokens_total %lld\n",
        (long long)mt.prompt_tokens);
    ADD("# HELP zinfer_generation_tokens_total Tokens generated by finished requests.\n"
        "# TYPE zinfer_generation_tokens_total counter\nzinfer_generation_tokens_total %lld\n",
        (long long)mt.generation_tokens);
    static const struct {
        const char *name, *type, *help;
        int stat; /* a zi_kv_stat index, or -1: used / blocks, -2: hit / query tokens,
                   * -3: speculation's accepted / drafted tokens, -4: image encode
                   * microseconds as seconds */
    } kv[] = {
        {"zinfer_kv_cache_blocks", "gauge", "KV cache blocks of the worker.", ZI_KV_BLOCKS},
        {"zinfer_kv_cache_blocks_used", "gauge", "KV cache blocks in use.", ZI_KV_USED},
        {"zinfer_kv_cache_usage_ratio", "gauge", "KV cache blocks in use / blocks.", -1},
        {"zinfer_prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix "
         "cache.",
         ZI_KV_PREFIX_QUERY_TOKENS},
        {"zinfer_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
         ZI_KV_PREFIX_HIT_TOKENS},
        {"zinfer_prefix_cache_hit_rate", "gauge", "Prefix cache hits / queries.", -2},
        {"zinfer_preemptions_total", "counter", "Requests preempted for KV cache room.",
         ZI_KV_PREEMPTIONS},
        {"zinfer_spec_verifications_total", "counter",
         "Speculation: a sequence's drafts checked in a step.", ZI_KV_SPEC_STEPS},
        {"zinfer_spec_draft_tokens_total", "counter", "Speculation: draft tokens fed.",
         ZI_KV_SPEC_DRAFTED},
        {"zinfer_spec_accepted_tokens_total", "counter", "Speculation: draft tokens accepted.",
         ZI_KV_SPEC_ACCEPTED},
        {"zinfer_spec_acceptance_rate", "gauge", "Speculation: accepted / draft tokens.", -3},
        {"zinfer_image_tiles_encoded_total", "counter",
         "Images: tiles run through the image tower (--mmproj).", ZI_KV_IMAGE_TILES},
        {"zinfer_image_encode_seconds_total", "counter",
         "Images: seconds spent running the image tower.", -4},
        {"zinfer_kv_memory_hit_blocks_total", "counter", "Prefix cache: blocks found in memory.",
         ZI_KV_MEM_HIT_BLOCKS},
        {"zinfer_kv_memory_miss_blocks_total", "counter",
         "Prefix cache: lookups memory could not answer.", ZI_KV_MEM_MISS_BLOCKS},
        {"zinfer_kv_disk_hit_blocks_total", "counter",
         "Prefix cache: blocks read back from the disk tier (--kv-disk).", ZI_KV_DISK_HIT_BLOCKS},
        {"zinfer_kv_disk_miss_blocks_total", "counter",
         "Prefix cache: lookups the disk tier could not answer.", ZI_KV_DISK_MISS_BLOCKS},
        {"zinfer_kv_disk_bytes", "gauge", "Bytes of block files in the --kv-disk directory.",
         ZI_KV_DISK_BYTES},
        {"zinfer_kv_disk_written_blocks_total", "counter", "Block files written to --kv-disk.",
         ZI_KV_DISK_WRITTEN},
        {"zinfer_kv_disk_dropped_writes_total", "counter",
         "Blocks not written to --kv-disk (queue full, write failed).", ZI_KV_DISK_DROPPED},
        {"zinfer_kv_disk_rejected_files_total", "counter",
         "Block files ignored: corrupt, truncated, foreign or stale.", ZI_KV_DISK_REJECTED},
        {"zinfer_kv_disk_read_seconds_total", "counter", "Seconds reading from --kv-disk.",
         ZI_KV_DISK_READ_US},
        {"zinfer_kv_disk_write_seconds_total", "counter",
         "Seconds writing to --kv-disk (its writer thread, off the steps).", ZI_KV_DISK_WRITE_US},
        {"zinfer_orphaned_sequences_dropped_total", "counter",
         "Sequences a worker dropped when no router came back within --orphan-timeout.",
         ZI_KV_ORPHANS_DROPPED},
    };
    for (size_t j = 0; j < sizeof kv / sizeof kv[0]; j++) {
        ADD("# HELP %s %s\n# TYPE %s %s\n", kv[j].name, kv[j].help, kv[j].name, kv[j].type);
        for (size_t w = 0; w < mt.n_workers; w++) {
            const int64_t *s = mt.worker_kv[w];
            if (kv[j].stat == ZI_KV_DISK_READ_US || kv[j].stat == ZI_KV_DISK_WRITE_US)
                ADD("%s{worker=\"%zu\"} %.6f\n", kv[j].name, w, (double)s[kv[j].stat] / 1e6);
            else if (kv[j].stat >= 0)
                ADD("%s{worker=\"%zu\"} %lld\n", kv[j].name, w, (long long)s[kv[j].stat]);
            else if (kv[j].stat == -4)
                ADD("%s{worker=\"%zu\"} %.6f\n", kv[j].name, w,
                    (double)s[ZI_KV_IMAGE_ENCODE_US] / 1e6);
            else {
                static const int ratio[3][2] = {
                    {ZI_KV_USED, ZI_KV_BLOCKS},
                    {ZI_KV_PREFIX_HIT_TOKENS, ZI_KV_PREFIX_QUERY_TOKENS},
                    {ZI_KV_SPEC_ACCEPTED, ZI_KV_SPEC_DRAFTED}};
                int64_t num = s[ratio[-1 - kv[j].stat][0]], den = s[ratio[-1 - kv[j].stat][1]];
                ADD("%s{worker=\"%zu\"} %.6g\n", kv[j].name, w,
                    den > 0 ? (double)num / (double)den : 0.0);
            }
        }
    }
    static const char *const hist[ZI_IM_N_HIST][2] = {
        {"zinfer_time_to_first_token_seconds", "Time from admission to the first token."},
        {"zinfer_inter_token_latency_seconds", "Time between a request's tokens."},
        {"zinfer_e2e_request_latency_seconds", "Time from admission to the end."},
        {"zinfer_request_queue_time_seconds", "Time from admission to a worker."},
    };
    for (int h = 0; h < ZI_IM_N_HIST; h++) {
        ADD("# HELP %s %s\n# TYPE %s histogram\n", hist[h][0], hist[h][1], hist[h][0]);
        long long cum = 0;
        for (int k = 0; k <= ZI_IM_HIST_BUCKETS; k++) {
            cum += mt.hist[h].count[k];
            if (k < ZI_IM_HIST_BUCKETS)
                ADD("%s_bucket{le=\"%g\"} %lld\n", hist[h][0], zi_im_hist_bounds[k], cum);
            else
                ADD("%s_bucket{le=\"+Inf\"} %lld\n", hist[h][0], cum);
        }
        ADD("%s_sum %.9g\n%s_count %lld\n", hist[h][0], mt.hist[h].sum, hist[h][0], cum);
    }
#undef ADD
    if (bad) {
        free(b);
        zi_http_fail(&e, 500, "internal", NULL, "out of memory");
        answer_error(a, &e);
        return;
    }
    a->status = 200;
    a->text = b;
    a->text_len = len;
}

/* ---- health, tokenize, detokenize -------------------------------------- */

static void health(zi_http_ctx *ctx, zi_http_answer *a) {
    zi_http_error e;
    zi_http_frame f;
    if (router_op(ctx, NULL, "health", "h", &f, &e)) {
        answer_error(a, &e);
        return;
    }
    char status[32];
    zi_http_frame_str(f.root, "status", status, sizeof status);
    a->json = json_object();
    json_object_set_new(a->json, "status", json_string(status));
    static const char *const keys[] = {"workers", "tokenizers", "waiting", "running", NULL};
    for (int i = 0; keys[i]; i++) {
        int64_t v;
        if (!zi_map_int(f.root, keys[i], &v, NULL))
            json_object_set_new(a->json, keys[i], json_integer(v));
    }
    a->status = strcmp(status, "ok") ? 503 : 200;
    zi_http_frame_free(&f);
}

static void tokenize(zi_http_ctx *ctx, const char *body, size_t len, int detok, zi_http_answer *a) {
    zi_http_error e;
    json_t *o = zi_http_parse_object(body, len, &e);
    zi_http_conn *c = NULL;
    char name[256];
    long long ml;
    if (!o) goto fail;
    if (zi_http_conn_open(ctx, &c, &e) || check_model(ctx, c, o, name, sizeof name, &ml, &e))
        goto fail;
    zi_msg m;
    zi_msg_init(&m);
    if (!detok) {
        json_t *p = json_object_get(o, "prompt"), *as = json_object_get(o, "add_special_tokens");
        if (json_object_get(o, "messages")) {
            zi_http_fail(&e, 400, "unsupported_value", "messages",
                         "messages: tokenizing a chat is not supported yet (send prompt)");
            goto fail_msg;
        }
        if (!p) {
            zi_http_fail(&e, 400, "missing", "prompt", "prompt is missing");
            goto fail_msg;
        }
        if (!json_is_string(p)) {
            zi_http_fail(&e, 400, "invalid_type", "prompt", "prompt: expected a string");
            goto fail_msg;
        }
        if (as && !json_is_boolean(as)) {
            zi_http_fail(&e, 400, "invalid_type", "add_special_tokens",
                         "add_special_tokens: expected a boolean");
            goto fail_msg;
        }
        msgpack_pack_map(&m.pk, 5);
        zi_pack_kv_str(&m.pk, "op", "tokenize");
        zi_pack_kv_str(&m.pk, "id", "k");
        zi_pack_kv_str(&m.pk, "model_name", name);
        zi_pack_kv_strn(&m.pk, "text", json_string_value(p), json_string_length(p));
        zi_pack_kv_bool(&m.pk, "add_special", !as || json_is_true(as));
    } else {
        json_t *t = json_object_get(o, "tokens"), *x;
        size_t i;
        if (!t) {
            zi_http_fail(&e, 400, "missing", "tokens", "tokens is missing");
            goto fail_msg;
        }
        if (!json_is_array(t)) {
            zi_http_fail(&e, 400, "invalid_type", "tokens",
                         "tokens: expected an array of token ids");
            goto fail_msg;
        }
        json_array_foreach(t, i, x) if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                                        json_integer_value(x) > INT32_MAX) {
            char f[32];
            snprintf(f, sizeof f, "tokens[%zu]", i);
            zi_http_fail(&e, 400, "invalid_value", f, "%s: expected a token id", f);
            goto fail_msg;
        }
        msgpack_pack_map(&m.pk, 4);
        zi_pack_kv_str(&m.pk, "op", "detokenize");
        zi_pack_kv_str(&m.pk, "id", "k");
        zi_pack_kv_str(&m.pk, "model_name", name);
        zi_pack_str(&m.pk, "token_ids");
        msgpack_pack_array(&m.pk, json_array_size(t));
        json_array_foreach(t, i, x) msgpack_pack_int64(&m.pk, json_integer_value(x));
    }
    zi_http_frame f;
    int rc = zi_http_call(c, &m, "k", ctx->lim.router_timeout_ms, &f, &e);
    zi_msg_free(&m);
    if (rc) goto fail;
    a->status = 200;
    a->json = json_object();
    if (!detok) {
        const msgpack_object *ids = zi_map_get(f.root, "token_ids");
        int64_t *v = NULL;
        size_t n = 0;
        if (ids) zi_http_decode_ids(ids, &v, &n);
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_integer(v[i]));
        free(v);
        json_object_set_new(a->json, "count", json_integer((json_int_t)n));
        json_object_set_new(a->json, "max_model_len", json_integer(ml));
        json_object_set_new(a->json, "tokens", arr);
    } else {
        const msgpack_object *t = zi_map_get(f.root, "text");
        json_t *s = t && t->type == MSGPACK_OBJECT_STR
                        ? json_stringn(t->via.str.ptr, t->via.str.size)
                        : NULL;
        json_object_set_new(a->json, "prompt", s ? s : json_string(""));
    }
    zi_http_frame_free(&f);
    zi_http_conn_close(c);
    json_decref(o);
    return;
fail_msg:
    zi_msg_free(&m);
fail:
    zi_http_conn_close(c);
    json_decref(o);
    answer_error(a, &e);
}

/* The router's embed op for m (id "e"), on a connection opened here, the
 * body's model checked against the served one (its name into name): 0 with
 * *f to free, or -1 with e set. m is freed. */
static int embed_call(zi_http_ctx *ctx, json_t *o, zi_msg *m, char *name, size_t cap,
                      zi_http_frame *f, zi_http_error *e) {
    zi_http_conn *c = NULL;
    int rc = zi_http_conn_open(ctx, &c, e) || check_model(ctx, c, o, name, cap, NULL, e);
    if (!rc) rc = zi_http_call(c, m, "e", ctx->lim.router_timeout_ms, f, e);
    zi_msg_free(m);
    zi_http_conn_close(c);
    return rc ? -1 : 0;
}

/* POST /v1/embeddings (http_embed.h): the router's embed op. */
static void embeddings(zi_http_ctx *ctx, const char *body, size_t len, zi_http_answer *a) {
    zi_http_error e;
    json_t *o = zi_http_parse_object(body, len, &e);
    char name[256];
    int base64 = 0;
    zi_msg m;
    zi_http_frame f;
    if (!o || zi_http_embed_request(o, &m, &base64, &e) ||
        embed_call(ctx, o, &m, name, sizeof name, &f, &e))
        goto fail;
    a->json = zi_http_embed_answer(f.root, name, base64, &e);
    zi_http_frame_free(&f);
    if (!a->json) goto fail;
    a->status = 200;
    json_decref(o);
    return;
fail:
    json_decref(o);
    answer_error(a, &e);
}

/* POST /v1/rerank, /rerank (http_rerank.h): the embed op with a query. */
static void rerank(zi_http_ctx *ctx, const char *body, size_t len, zi_http_answer *a) {
    zi_http_error e;
    json_t *o = zi_http_parse_object(body, len, &e);
    char name[256];
    zi_msg m;
    zi_http_frame f;
    zi_http_rerank rr = {0};
    if (!o || zi_http_rerank_request(o, &m, &rr, &e)) goto fail;
    if (embed_call(ctx, o, &m, name, sizeof name, &f, &e)) {
        zi_http_rerank_error_fields(&e);
        goto fail;
    }
    a->json = zi_http_rerank_answer(f.root, name, &rr, &e);
    zi_http_frame_free(&f);
    if (!a->json) goto fail;
    a->status = 200;
    zi_http_rerank_free(&rr);
    json_decref(o);
    return;
fail:
    zi_http_rerank_free(&rr);
    json_decref(o);
    answer_error(a, &e);
}

/* ---- generation ------------------------------------------------------- */

struct zi_http_stream {
    zi_http_ctx *ctx;
    const zi_http_api *api;
    zi_http_conn *conn;
    zi_http_gen g;
    zi_http_result r;
    int client_fd;
    char *out;
    size_t len, cap, pos;
    int ended; /* the stream's last bytes are in out */
};

/* Cancels every choice not yet final (no reply of its own; the router
 * frees the worker slot). */
static void cancel_running(zi_http_conn *c, const zi_http_result *r) {
    zi_http_error e;
    for (int i = 0; i < r->g->n; i++) {
        if (r->ch[i].status[0]) continue;
        char id[16];
        snprintf(id, sizeof id, "g%d", i);
        zi_msg m;
        zi_msg_init(&m);
        msgpack_pack_map(&m.pk, 2);
        zi_pack_kv_str(&m.pk, "op", "cancel");
        zi_pack_kv_str(&m.pk, "id", id);
        zi_http_conn_send(c, &m, &e);
        zi_msg_free(&m);
    }
}

/* The next frame of this generation applied to r: 0 with *d, -1 with e
 * set (router error, timeout), -2 when the client went away. */
static int next_delta(const zi_http_ctx *ctx, zi_http_conn *c, zi_http_result *r, int client_fd,
                      zi_http_delta *d, zi_http_error *e) {
    for (;;) {
        zi_http_frame f;
        int rc = zi_http_conn_recv(c, client_fd, ctx->lim.router_timeout_ms, &f);
        if (rc == ZI_HTTP_RECV_GONE) return -2;
        if (rc == ZI_HTTP_RECV_TIMEOUT)
            return zi_http_fail(e, 503, "unavailable", NULL, "the router sent nothing for %d ms",
                                ctx->lim.router_timeout_ms);
        rc = zi_http_result_apply(r, f.root, d, e);
        zi_http_frame_free(&f);
        if (rc <= 0) return rc;
    }
}

/* One generation under api (http_api.h): parse, send a request per
 * choice, and answer whole or as a stream. */
static void generate(zi_http_ctx *ctx, const zi_http_api *api, const char *body, size_t len,
                     int client_fd, zi_http_answer *a) {
    zi_http_stream *s = calloc(1, sizeof *s);
    zi_http_error e;
    char model[256];
    if (!s) {
        zi_http_fail(&e, 500, "internal", NULL, "out of memory");
        answer_error(a, &e);
        return;
    }
    s->ctx = ctx;
    s->api = api;
    s->client_fd = client_fd;
    if (api->parse(ctx, body, len, &s->g, &e) || zi_http_conn_open(ctx, &s->conn, &e)) goto fail;
    /* The server's settings every API's chat shares. */
    if (!s->g.reasoning.format_given)
        s->g.reasoning.format = (zi_reasoning_format)ctx->cfg.reasoning_format;
    /* The request's model (or the default) names the answer; one not
     * served is a 404 here (the router would refuse it too, in its own
     * protocol's words). The request carries model_name when it named one,
     * so the router routes it to that model's processes. */
    if (served_model(ctx, s->conn, s->g.model, model, sizeof model, NULL, &e)) goto fail;
    /* Tool calls are read in the format of the model that writes them
     * (several models' chat templates differ). */
    s->g.tools.format = (zi_tool_format)zi_http_tool_format(&ctx->cfg, model);
    zi_http_conn_set_model(s->conn, s->g.model);
    zi_http_result_init(&s->r, &s->g, model);
    s->r.ctx = ctx;
    for (int i = 0; i < s->g.n; i++)
        if (zi_http_conn_send(s->conn, &s->g.req[i], &e)) goto fail;
    /* The first frame decides between an error status and 200: a request
     * the router refuses (a bad value, overloaded, starting) is answered
     * with its status even when streamed. */
    zi_http_delta d;
    int rc = next_delta(s->ctx, s->conn, &s->r, client_fd, &d, &e);
    if (rc == -2) {
        zi_http_fail(&e, 499, "client_closed", NULL, "the client went away");
        goto fail;
    }
    if (rc) goto fail;
    if (s->g.stream) {
        if (api->delta(&s->r, &d, s->conn, &s->out, &s->len, &s->cap, &e)) goto fail;
        a->status = 200;
        a->stream = s;
        return;
    }
    while (s->r.n_done < s->g.n) {
        rc = next_delta(s->ctx, s->conn, &s->r, client_fd, &d, &e);
        if (rc == -2) zi_http_fail(&e, 499, "client_closed", NULL, "the client went away");
        if (rc) goto fail;
    }
    a->json = api->full(&s->r, s->conn, &e);
    if (!a->json) goto fail;
    a->status = 200;
    zi_http_stream_free(s);
    return;
fail:
    a->status = e.status;
    a->json = api->error_json(&e);
    zi_http_stream_free(s);
}

ssize_t zi_http_stream_read(zi_http_stream *s, char *buf, size_t max) {
    while (s->pos == s->len) {
        if (s->ended) return 0;
        s->pos = s->len = 0;
        zi_http_error e;
        if (s->r.n_done == s->g.n) {
            if (s->api->end(&s->r, &s->out, &s->len, &s->cap)) return -1;
            s->ended = 1;
            continue;
        }
        if (zi_stop_requested()) return -1;
        zi_http_delta d;
        int rc = next_delta(s->ctx, s->conn, &s->r, s->client_fd, &d, &e);
        if (rc == -2) return -1;
        if (!rc) rc = s->api->delta(&s->r, &d, s->conn, &s->out, &s->len, &s->cap, &e);
        if (rc) { /* an error mid-stream: said in the stream, which then ends */
            cancel_running(s->conn, &s->r);
            for (int i = 0; i < s->g.n; i++)
                if (!s->r.ch[i].status[0]) snprintf(s->r.ch[i].status, 32, "cancelled");
            s->r.n_done = s->g.n;
            if (s->api->stream_error(&s->r, &e, &s->out, &s->len, &s->cap)) return -1;
            s->ended = 1;
        }
    }
    size_t n = s->len - s->pos < max ? s->len - s->pos : max;
    memcpy(buf, s->out + s->pos, n);
    s->pos += n;
    return (ssize_t)n;
}

void zi_http_stream_free(zi_http_stream *s) {
    if (!s) return;
    if (s->conn && s->r.g) cancel_running(s->conn, &s->r);
    zi_http_conn_close(s->conn);
    zi_http_result_free(&s->r);
    zi_http_gen_free(&s->g);
    free(s->out);
    free(s);
}

/* POST /v1/audio/speech (http_speech.h): the router's speech op, its
 * chunks' 16-bit samples sent on as they come (chunked transfer; a WAV
 * header with open sizes first). An error before the first chunk (a bad
 * voice, an unknown model) is the answer's status; one after it can only
 * cut the stream short. */
struct zi_http_audio {
    zi_http_ctx *ctx;
    zi_http_conn *conn;
    int client_fd;
    char *buf;
    size_t len, cap, pos;
    int ended;   /* the final frame came (or the stream broke) */
    int running; /* the request may still run: cancelled when freed */
};

static int audio_put(zi_http_audio *s, const void *p, size_t n) {
    if (s->pos == s->len) s->pos = s->len = 0; /* all sent: reuse the room */
    if (s->len + n > s->cap) {
        size_t nc = s->cap ? s->cap : 1 << 16;
        while (nc < s->len + n) nc *= 2;
        char *q = realloc(s->buf, nc);
        if (!q) return -1;
        s->buf = q, s->cap = nc;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
    return 0;
}

/* The next frame of request "s": 1 audio appended (or none), 0 final,
 * -1 error (e set; *routed when the router ended the request). */
static int audio_next(zi_http_audio *s, int *rate, int *routed, zi_http_error *e) {
    for (;;) {
        zi_http_frame f;
        int rc = zi_http_conn_recv(s->conn, s->client_fd, s->ctx->lim.router_timeout_ms, &f);
        if (rc == ZI_HTTP_RECV_GONE)
            return zi_http_fail(e, 499, "client_closed", NULL, "the client went away");
        if (rc == ZI_HTTP_RECV_TIMEOUT)
            return zi_http_fail(e, 503, "unavailable", NULL, "the router sent nothing for %d ms",
                                s->ctx->lim.router_timeout_ms);
        char ev[16], id[8];
        zi_http_frame_str(f.root, "event", ev, sizeof ev);
        zi_http_frame_str(f.root, "id", id, sizeof id);
        if (strcmp(id, "s")) {
            zi_http_frame_free(&f);
            continue;
        }
        if (!strcmp(ev, "error")) {
            char code[64], msg[ZI_HTTP_MSG_MAX], field[128];
            zi_http_frame_str(f.root, "code", code, sizeof code);
            zi_http_frame_str(f.root, "message", msg, sizeof msg);
            zi_http_frame_str(f.root, "field", field, sizeof field);
            zi_http_frame_free(&f);
            *routed = 1;
            return zi_http_router_error(e, code, msg, field[0] ? field : NULL, NULL);
        }
        const msgpack_object *au = zi_map_get(f.root, "audio");
        const msgpack_object *d = au ? zi_map_get(au, "data") : NULL;
        int64_t sr = 0;
        if (au && !zi_map_int(au, "sample_rate", &sr, NULL) && sr > 0 && rate) *rate = (int)sr;
        rc = 1;
        if (d && d->type == MSGPACK_OBJECT_BIN && d->via.bin.size &&
            audio_put(s, d->via.bin.ptr, d->via.bin.size))
            rc = zi_http_fail(e, 500, "internal", NULL, "out of memory");
        if (!strcmp(ev, "final") && rc == 1) rc = 0;
        zi_http_frame_free(&f);
        return rc;
    }
}

ssize_t zi_http_audio_read(zi_http_audio *s, char *buf, size_t max) {
    while (s->pos == s->len && !s->ended) {
        zi_http_error e;
        int routed = 0, rc = audio_next(s, NULL, &routed, &e);
        if (rc < 0) { /* the status went out: the stream can only end short */
            if (routed) s->running = 0;
            s->ended = 1;
            return -1;
        }
        if (rc == 0) s->ended = 1, s->running = 0;
    }
    size_t n = s->len - s->pos < max ? s->len - s->pos : max;
    memcpy(buf, s->buf + s->pos, n);
    s->pos += n;
    return (ssize_t)n;
}

void zi_http_audio_free(zi_http_audio *s) {
    if (!s) return;
    if (s->running && s->conn) { /* free its worker slot at once */
        zi_msg cm;
        zi_http_error ce;
        zi_msg_init(&cm);
        msgpack_pack_map(&cm.pk, 2);
        zi_pack_kv_str(&cm.pk, "op", "cancel");
        zi_pack_kv_str(&cm.pk, "id", "s");
        zi_http_conn_send(s->conn, &cm, &ce);
        zi_msg_free(&cm);
    }
    zi_http_conn_close(s->conn);
    free(s->buf);
    free(s);
}

static void audio_speech(zi_http_ctx *ctx, const char *body, size_t len, int client_fd,
                         zi_http_answer *a) {
    zi_http_error e;
    json_t *o = zi_http_parse_object(body, len, &e);
    zi_http_audio *s = calloc(1, sizeof *s);
    char name[256];
    zi_msg m;
    int wav = 1, rate = 24000, routed = 0, rc = -1;
    if (!s) {
        zi_http_fail(&e, 500, "internal", NULL, "out of memory");
        goto fail;
    }
    s->ctx = ctx, s->client_fd = client_fd;
    if (!o || zi_http_conn_open(ctx, &s->conn, &e) ||
        check_model(ctx, s->conn, o, name, sizeof name, NULL, &e))
        goto fail;
    if (zi_http_speech_request(o, name, &m, &wav, &e)) goto fail;
    rc = zi_http_conn_send(s->conn, &m, &e);
    zi_msg_free(&m);
    if (rc) goto fail;
    s->running = 1;
    /* the first frame decides the status: an error, or the audio starts */
    rc = audio_next(s, &rate, &routed, &e);
    if (rc < 0) {
        if (routed) s->running = 0;
        goto fail;
    }
    if (rc == 0) s->ended = 1, s->running = 0;
    if (wav) { /* open sizes: the length is not known while it streams */
        uint8_t h[ZI_WAV_HEADER_MAX];
        size_t hn = zi_http_speech_wav_header(h, 0, rate);
        memset(h + 4, 0xff, 4);
        memset(h + hn - 4, 0xff, 4);
        char *nb = malloc(s->cap > hn + s->len ? s->cap : hn + s->len + 1);
        if (!nb) {
            zi_http_fail(&e, 500, "internal", NULL, "out of memory");
            goto fail;
        }
        memcpy(nb, h, hn);
        if (s->len) memcpy(nb + hn, s->buf, s->len);
        free(s->buf);
        s->buf = nb, s->len += hn, s->cap = s->cap > s->len ? s->cap : s->len;
    }
    json_decref(o);
    a->status = 200;
    a->audio = s;
    a->content_type = wav ? "audio/wav" : "audio/pcm";
    return;
fail:
    zi_http_audio_free(s);
    json_decref(o);
    answer_error(a, &e);
}

/* ---- routing ---------------------------------------------------------- */

void zi_http_handle(zi_http_ctx *ctx, const char *method, const char *path, const char *body,
                    size_t len, int client_fd, zi_http_answer *a) {
    memset(a, 0, sizeof *a);
    zi_http_error e;
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    const char *want = NULL;
    if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/v1/completions")) {
        if (post) {
            generate(ctx,
                     path[4] == 'c' && path[5] == 'h' ? &zi_http_api_chat
                                                      : &zi_http_api_completions,
                     body, len, client_fd, a);
            return;
        }
        want = "POST";
    } else if (!strcmp(path, "/v1/messages") || !strcmp(path, "/v1/messages/count_tokens")) {
        if (post) {
            generate(ctx, path[12] ? &zi_http_api_count_tokens : &zi_http_api_messages, body, len,
                     client_fd, a);
            return;
        }
        want = "POST";
    } else if (!strcmp(path, "/v1/responses")) {
        if (post) {
            generate(ctx, &zi_http_api_responses, body, len, client_fd, a);
            return;
        }
        want = "POST";
    } else if (!strncmp(path, "/v1/responses/", 14) && path[14]) {
        int del = !strcmp(method, "DELETE");
        if (get || del) {
            a->json = zi_http_responses_stored(ctx, path + 14, del, &e);
            if (a->json)
                a->status = 200;
            else
                answer_error(a, &e);
            return;
        }
        want = "GET, DELETE";
    } else if (!strcmp(path, "/v1/models") || !strncmp(path, "/v1/models/", 11)) {
        if (get) {
            models(ctx, path[10] == '/' ? path + 11 : NULL, a);
            return;
        }
        want = "GET";
    } else if (!strcmp(path, "/models/load") || !strcmp(path, "/models/unload")) {
        if (post) {
            models_load(ctx, body, len, path[8] == 'l', a);
            return;
        }
        want = "POST";
    } else if (!strcmp(path, "/v1/load_lora_adapter") || !strcmp(path, "/v1/unload_lora_adapter")) {
        if (post) {
            lora_load(ctx, body, len, path[4] == 'l', a);
            return;
        }
        want = "POST";
    } else if (!strcmp(path, "/lora-adapters")) {
        if (get) {
            a->json = lora_adapters(ctx);
            a->status = a->json ? 200 : 503;
            if (!a->json) {
                zi_http_fail(&e, 503, "unavailable", NULL, "the router did not list its adapters");
                answer_error(a, &e);
            }
            return;
        }
        if (post) {
            lora_scales(ctx, body, len, a);
            return;
        }
        want = "GET, POST";
    } else if (!strcmp(path, "/metrics")) {
        if (get) {
            metrics(ctx, a);
            return;
        }
        want = "GET";
    } else if (!strcmp(path, "/health")) {
        if (get) {
            health(ctx, a);
            return;
        }
        want = "GET";
    } else if (!strcmp(path, "/v1/audio/speech")) {
        if (post) {
            audio_speech(ctx, body, len, client_fd, a);
            return;
        }
        want = "POST";
    } else if (!strcmp(path, "/v1/embeddings")) {
        if (post) {
            embeddings(ctx, body, len, a);
            return;
        }
        want = "POST";
    } else if (!strcmp(path, "/v1/rerank") || !strcmp(path, "/rerank")) {
        if (post) {
            rerank(ctx, body, len, a);
            return;
        }
        want = "POST";
    } else if (!strcmp(path, "/tokenize") || !strcmp(path, "/detokenize")) {
        if (post) {
            tokenize(ctx, body, len, path[1] == 'd', a);
            return;
        }
        want = "POST";
    } else {
        zi_http_fail(&e, 404, "not_found", NULL, "%s %s: no such path", method, path);
        a->status = e.status;
        a->json =
            zi_http_messages_path(path) ? zi_http_messages_error_json(&e) : zi_http_error_json(&e);
        return;
    }
    zi_http_fail(&e, 405, "method_not_allowed", NULL, "%s %s: the method is not allowed (use %s)",
                 method, path, want);
    answer_error(a, &e);
    if (zi_http_messages_path(path)) { /* Anthropic's clients read their own shape */
        json_decref(a->json);
        a->json = zi_http_messages_error_json(&e);
    }
    a->allow = want;
}
