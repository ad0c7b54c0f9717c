/*
 * router_lora.c - LoRA adapters loaded and unloaded while serving
 * (docs/lora.md; router_impl.h lists the router's files): the client ops
 * load_lora_adapter and unload_lora_adapter are sent as "lora" messages
 * (imsg_lora.h) to every live worker of the model and answered once each
 * has replied or died; the table of each model's adapters (those its
 * workers registered with, and those loaded since) answers lora_adapters
 * and is replayed to a worker that registers without them (a restarted
 * one, or a model loaded again), before any request reaches it.
 *
 * An unload is refused while a request in flight names the adapter (by
 * name, or by the id the table holds): the router sees every request
 * from admission to its end, so a worker never loses an adapter under a
 * running request.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "imsg_lora.h"
#include "router_impl.h"

#define LORA_MAX_OPS 8     /* load/unload ops waiting for workers at once */
#define LORA_OP_WORKERS 64 /* workers one op waits for at most */

typedef struct lora_entry {
    char model[ZI_ROUTER_MODEL_NAME];
    char name[ZI_LORA_REF_NAME_MAX];
    char path[1024]; /* "" for one a worker started with (--lora) */
    double scale;
    int id;       /* its place on the workers (a request's lora id) */
    double applied; /* set_lora_scales: the scale requests without adapters run it at (0: none) */
    bool runtime; /* loaded by load_lora_adapter (replayed to new workers) */
} lora_entry;

typedef struct lora_op {
    bool used, load;
    bool existed; /* the table named the adapter before the op */
    int64_t rid;
    unsigned char client[IDENT_MAX];
    size_t client_len;
    bool delim;
    char id[257];
    size_t id_len;
    lora_entry e;
    int wait[LORA_OP_WORKERS]; /* the workers' backend indices */
    bool answered[LORA_OP_WORKERS], ok[LORA_OP_WORKERS];
    int n, n_left, n_ok, n_not_found;
    char code[32], msg[ZI_ERROR_MSG_MAX];
} lora_op;

struct router_lora {
    lora_entry *v;
    size_t n, cap;
    lora_op ops[LORA_MAX_OPS];
    int64_t next_rid;
};

static struct router_lora *state(router *rt) {
    if (!rt->lora) rt->lora = calloc(1, sizeof *rt->lora);
    return rt->lora;
}

void lora_free(router *rt) {
    if (!rt->lora) return;
    free(rt->lora->v);
    free(rt->lora);
    rt->lora = NULL;
}

static lora_entry *find_entry(struct router_lora *s, const char *model, const char *name) {
    for (size_t i = 0; s && i < s->n; i++)
        if (!strcmp(s->v[i].model, model) && !strcmp(s->v[i].name, name)) return &s->v[i];
    return NULL;
}

static lora_entry *add_entry(struct router_lora *s, const lora_entry *e) {
    lora_entry *have = find_entry(s, e->model, e->name);
    if (have) {
        double applied = have->applied; /* a reload keeps its global scale */
        *have = *e;
        have->applied = applied;
        return have;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        lora_entry *v = realloc(s->v, cap * sizeof *v);
        if (!v) return NULL;
        s->v = v, s->cap = cap;
    }
    s->v[s->n] = *e;
    return &s->v[s->n++];
}

static void remove_entry(struct router_lora *s, const char *model, const char *name) {
    lora_entry *e = find_entry(s, model, name);
    if (e) *e = s->v[--s->n];
}

/* A "lora" message to worker b (rid 0: nobody waits for its answer). */
static void send_lora(router *rt, int b, int64_t rid, bool load, const lora_entry *e) {
    zi_im_lora m = {.rid = rid,
                    .load = load,
                    .name = {e->name, strlen(e->name)},
                    .path = {e->path, strlen(e->path)},
                    .scale = e->scale};
    zi_msg msg;
    if (zi_im_lora_pack(&m, &msg) == ZI_OK) to_backend(rt, b, &msg);
    zi_msg_free(&msg);
}

/* The client's reply to a finished op: a result, or the first error. */
static void op_reply(router *rt, lora_op *op) {
    struct router_lora *s = rt->lora;
    bool failed = op->load ? op->n_ok < op->n || op->n == 0
                           : op->code[0] && (op->n_not_found < op->n - op->n_ok || op->n_ok == 0);
    if (op->load && failed) { /* the workers that took it give it back */
        for (int i = 0; i < op->n; i++)
            if (op->ok[i]) send_lora(rt, op->wait[i], 0, false, &op->e);
        if (!op->existed) remove_entry(s, op->e.model, op->e.name); /* their replies named it */
    }
    if (failed) {
        zi_log(&rt->log, ZI_LOG_WARN, "%s_lora_adapter %s:%s: %s", op->load ? "load" : "unload",
               op->e.model, op->e.name, op->msg);
        send_error_raw(rt, op->client, op->client_len, op->delim, op->id, op->id_len,
                       op->code[0] ? op->code : "unavailable",
                       op->msg[0] ? op->msg : "every worker of the model stopped during the op",
                       op->code[0] ? (op->load ? "lora_path" : "lora_name") : NULL);
    } else {
        if (op->load)
            add_entry(s, &op->e);
        else
            remove_entry(s, op->e.model, op->e.name);
        zi_log(&rt->log, ZI_LOG_INFO, "%s_lora_adapter %s:%s on %d worker(s)",
               op->load ? "load" : "unload", op->e.model, op->e.name, op->n_ok);
        zi_imap b;
        zi_imap_init(&b);
        zi_imap_strn(&b, "id", op->id, op->id_len);
        zi_imap_str(&b, "event", "result");
        zi_imap_str(&b, "model", op->e.model);
        zi_imap_str(&b, "lora_name", op->e.name);
        zi_imap_str(&b, "status", op->load ? "loaded" : "unloaded");
        if (op->load) zi_imap_int(&b, "lora_id", op->e.id);
        zi_msg m;
        zi_msg_init(&m);
        if (zi_imap_close(&b, &m.pk) == ZI_OK)
            out_send_msg(rt, ZI_ROUTER_CLIENT, op->client, op->client_len, op->delim, &m);
        zi_msg_free(&m);
    }
    op->used = false;
}

/* Whether request r names adapter e (by name, or by e's id). */
static bool names_adapter(const void *val, const void *arg) {
    const rreq *r = val;
    const lora_entry *e = arg;
    if (strcmp(r->model, e->model)) return false;
    for (size_t i = 0; i < r->n_lora; i++)
        if (r->lora[i].id >= 0 ? r->lora[i].id == e->id : !strcmp(r->lora[i].name, e->name))
            return true;
    return false;
}

void lora_op_start(router *rt, const unsigned char *client, size_t client_len, bool delim,
                   const char *id, size_t id_len, const char *model, bool load, const char *name,
                   const char *path, double scale) {
    struct router_lora *s = state(rt);
    char msg[ZI_ERROR_MSG_MAX];
    if (!s) {
        send_error_raw(rt, client, client_len, delim, id, id_len, "internal", "out of memory",
                       NULL);
        return;
    }
    lora_op *op = NULL;
    for (int i = 0; i < LORA_MAX_OPS && !op; i++)
        if (!s->ops[i].used) op = &s->ops[i];
    if (!op) {
        send_error_raw(rt, client, client_len, delim, id, id_len, "overloaded",
                       "8 adapter loads and unloads are already under way; retry later", NULL);
        return;
    }
    memset(op, 0, sizeof *op);
    op->load = load;
    snprintf(op->e.model, sizeof op->e.model, "%s", model);
    snprintf(op->e.name, sizeof op->e.name, "%s", name);
    snprintf(op->e.path, sizeof op->e.path, "%s", path ? path : "");
    op->e.scale = scale;
    op->e.id = -1;
    op->e.runtime = true;
    const lora_entry *have = find_entry(s, model, name);
    op->existed = have != NULL;
    if (!load && have) {
        size_t pos = 0, users = 0;
        while (zi_req_table_find(&rt->reqs, &pos, names_adapter, have)) users++, pos++;
        if (users) {
            snprintf(msg, sizeof msg,
                     "lora_name: adapter '%s' of model '%s' is in use by %zu request(s) in "
                     "flight; unload it once they end",
                     name, model, users);
            send_error_raw(rt, client, client_len, delim, id, id_len, "in_use", msg, "lora_name");
            return;
        }
    }
    for (size_t b = 0; b < rt->n_be && op->n < LORA_OP_WORKERS; b++)
        if (rt->be[b].alive && rt->be[b].role == ROLE_WORKER && !strcmp(rt->be[b].model, model))
            op->wait[op->n++] = (int)b;
    if (op->n == 0) {
        if (!load && have) { /* nothing runs it: the table forgets it */
            op->client_len = 0;
            remove_entry(s, model, name);
            zi_imap b;
            zi_imap_init(&b);
            zi_imap_strn(&b, "id", id, id_len);
            zi_imap_str(&b, "event", "result");
            zi_imap_str(&b, "model", model);
            zi_imap_str(&b, "lora_name", name);
            zi_imap_str(&b, "status", "unloaded");
            zi_msg m;
            zi_msg_init(&m);
            if (zi_imap_close(&b, &m.pk) == ZI_OK)
                out_send_msg(rt, ZI_ROUTER_CLIENT, client, client_len, delim, &m);
            zi_msg_free(&m);
            return;
        }
        snprintf(msg, sizeof msg,
                 load ? "model_name: no worker of model '%s' is up to load the adapter into "
                        "(load the model first: load_model)"
                      : "lora_name: model '%s' has no adapter '%s'",
                 model, name);
        send_error_raw(rt, client, client_len, delim, id, id_len,
                       load ? "unavailable" : "not_found", msg, load ? "model_name" : "lora_name");
        return;
    }
    if (!load && !have) {
        snprintf(msg, sizeof msg, "lora_name: model '%s' has no adapter '%s'", model, name);
        send_error_raw(rt, client, client_len, delim, id, id_len, "not_found", msg, "lora_name");
        return;
    }
    op->used = true;
    op->rid = ++s->next_rid;
    op->n_left = op->n;
    memcpy(op->client, client, client_len);
    op->client_len = client_len;
    op->delim = delim;
    op->id_len = id_len < sizeof op->id ? id_len : sizeof op->id - 1;
    memcpy(op->id, id, op->id_len);
    for (int i = 0; i < op->n; i++) send_lora(rt, op->wait[i], op->rid, load, &op->e);
}

/* Worker b's names array (lora_done's or register's "loras") into the
 * table: each named place of b's model. */
static void learn_names(router *rt, int b, const msgpack_object *names) {
    struct router_lora *s = state(rt);
    if (!s || !names || names->type != MSGPACK_OBJECT_ARRAY) return;
    for (uint32_t i = 0; i < names->via.array.size; i++) {
        const msgpack_object *n = &names->via.array.ptr[i];
        if (n->type != MSGPACK_OBJECT_STR || n->via.str.size == 0 ||
            n->via.str.size >= ZI_LORA_REF_NAME_MAX)
            continue;
        lora_entry e = {.id = (int)i, .scale = 1.0};
        snprintf(e.model, sizeof e.model, "%s", rt->be[b].model);
        memcpy(e.name, n->via.str.ptr, n->via.str.size);
        lora_entry *have = find_entry(s, e.model, e.name);
        if (have)
            have->id = (int)i;
        else
            add_entry(s, &e);
    }
}

void lora_on_register(router *rt, int b, const msgpack_object *names) {
    if (rt->be[b].role != ROLE_WORKER) return;
    learn_names(rt, b, names);
    struct router_lora *s = rt->lora;
    for (size_t i = 0; s && i < s->n; i++) {
        const lora_entry *e = &s->v[i];
        if (!e->runtime || strcmp(e->model, rt->be[b].model)) continue;
        bool has = false;
        for (uint32_t k = 0;
             names && names->type == MSGPACK_OBJECT_ARRAY && k < names->via.array.size && !has;
             k++) {
            const msgpack_object *n = &names->via.array.ptr[k];
            has = n->type == MSGPACK_OBJECT_STR && n->via.str.size == strlen(e->name) &&
                  !memcmp(n->via.str.ptr, e->name, n->via.str.size);
        }
        if (!has) { /* ahead of any request: messages to b keep their order */
            zi_log(&rt->log, ZI_LOG_INFO, "worker %d: loading adapter '%s' (%s) it lacks", b,
                   e->name, e->path);
            send_lora(rt, b, 0, true, e);
        }
    }
}

/* Worker b answered op's message, or died (o NULL). */
static void op_answer(router *rt, lora_op *op, int b, const zi_im_lora_done *d) {
    for (int i = 0; i < op->n; i++) {
        if (op->wait[i] != b || (op->answered[i] && d)) continue;
        if (!d) { /* a dead worker's answer no longer counts */
            if (!op->answered[i]) op->n_left--;
            op->n_ok -= op->ok[i];
            op->n--;
            op->wait[i] = op->wait[op->n];
            op->answered[i] = op->answered[op->n];
            op->ok[i] = op->ok[op->n];
            i--;
            continue;
        }
        op->answered[i] = true;
        op->n_left--;
        if (d && d->ok) {
            op->ok[i] = true;
            op->n_ok++;
            if (op->load && op->e.id < 0) op->e.id = (int)d->id;
        } else {
            bool nf = d->code.p && d->code.n == 9 && !memcmp(d->code.p, "not_found", 9);
            op->n_not_found += nf;
            if (!op->code[0]) {
                snprintf(op->code, sizeof op->code, "%.*s", (int)(d->code.p ? d->code.n : 0),
                         d->code.p ? d->code.p : "");
                snprintf(op->msg, sizeof op->msg, "%.*s", (int)(d->message.p ? d->message.n : 0),
                         d->message.p ? d->message.p : "");
            }
        }
    }
    if (op->n_left == 0) op_reply(rt, op);
}

void lora_on_done(router *rt, int b, const msgpack_object *o) {
    zi_im_lora_done d;
    zi_im_lora_done_unpack(o, &d);
    learn_names(rt, b, d.loras);
    struct router_lora *s = rt->lora;
    for (int i = 0; s && d.rid && i < LORA_MAX_OPS; i++)
        if (s->ops[i].used && s->ops[i].rid == d.rid) {
            op_answer(rt, &s->ops[i], b, &d);
            return;
        }
    if (!d.ok)
        zi_log(&rt->log, ZI_LOG_WARN, "worker %d: adapter op failed: %.*s", b,
               (int)(d.message.p ? d.message.n : 0), d.message.p ? d.message.p : "");
}

void lora_backend_died(router *rt, int b) {
    struct router_lora *s = rt->lora;
    for (int i = 0; s && i < LORA_MAX_OPS; i++)
        if (s->ops[i].used) op_answer(rt, &s->ops[i], b, NULL);
}

void lora_list(router *rt, const unsigned char *client, size_t client_len, bool delim,
               const char *id, size_t id_len, const char *model) {
    struct router_lora *s = rt->lora;
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_strn(&b, "id", id, id_len);
    zi_imap_str(&b, "event", "result");
    size_t n = 0;
    for (size_t i = 0; s && i < s->n; i++) n += !model || !strcmp(s->v[i].model, model);
    msgpack_packer *pk = zi_imap_key(&b, "adapters");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; s && i < s->n; i++) {
        const lora_entry *e = &s->v[i];
        if (model && strcmp(e->model, model)) continue;
        zi_imap m;
        zi_imap_init(&m);
        zi_imap_str(&m, "model", e->model);
        zi_imap_str(&m, "name", e->name);
        zi_imap_int(&m, "lora_id", e->id);
        if (e->path[0]) zi_imap_str(&m, "path", e->path);
        if (e->runtime) zi_imap_double(&m, "scale", e->scale);
        zi_imap_double(&m, "applied_scale", e->applied);
        zi_imap_str(&m, "loaded", e->runtime ? "runtime" : "start");
        if (zi_imap_close(&m, pk)) zi_imap_fail(&b);
    }
    zi_msg out;
    zi_msg_init(&out);
    if (zi_imap_close(&b, &out.pk) == ZI_OK)
        out_send_msg(rt, ZI_ROUTER_CLIENT, client, client_len, delim, &out);
    else
        send_error_raw(rt, client, client_len, delim, id, id_len, "internal", "out of memory",
                       NULL);
    zi_msg_free(&out);
}

void lora_apply_global(router *rt, const char *model, zi_request *req) {
    struct router_lora *s = rt->lora;
    for (size_t i = 0; s && i < s->n && req->n_lora < ZI_MAX_LORA; i++) {
        const lora_entry *e = &s->v[i];
        if (e->applied == 0.0 || strcmp(e->model, model)) continue;
        zi_lora_ref *r = &req->lora[req->n_lora++];
        memset(r, 0, sizeof *r);
        r->id = -1;
        snprintf(r->name, sizeof r->name, "%s", e->name);
        r->scale = (float)e->applied;
    }
}

int lora_set_global(router *rt, const char *model, const msgpack_object *list, char *msg,
                    size_t cap) {
    struct router_lora *s = rt->lora;
    if (!list || list->type != MSGPACK_OBJECT_ARRAY) {
        snprintf(msg, cap, "adapters: %s", list ? "not an array" : "missing");
        return ZI_EINVAL;
    }
    double scales[ZI_MAX_LORA];
    lora_entry *which[ZI_MAX_LORA];
    uint32_t n = 0;
    for (uint32_t i = 0; i < list->via.array.size; i++) {
        const msgpack_object *m = &list->via.array.ptr[i];
        const msgpack_object *id = m->type == MSGPACK_OBJECT_MAP ? zi_map_get(m, "id") : NULL;
        const msgpack_object *nm = m->type == MSGPACK_OBJECT_MAP ? zi_map_get(m, "name") : NULL;
        const msgpack_object *sc = m->type == MSGPACK_OBJECT_MAP ? zi_map_get(m, "scale") : NULL;
        double v = 1.0;
        if (sc && (sc->type == MSGPACK_OBJECT_FLOAT32 || sc->type == MSGPACK_OBJECT_FLOAT64))
            v = sc->via.f64;
        else if (sc && sc->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            v = (double)sc->via.u64;
        else if (sc && sc->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            v = (double)sc->via.i64;
        else if (sc)
            v = 1e300;
        if (!(v > -1e6 && v < 1e6)) {
            snprintf(msg, cap, "adapters[%u].scale: not a finite number", i);
            return ZI_EINVAL;
        }
        lora_entry *e = NULL;
        for (size_t k = 0; s && k < s->n && !e; k++) {
            lora_entry *c = &s->v[k];
            if (strcmp(c->model, model)) continue;
            if (nm && nm->type == MSGPACK_OBJECT_STR
                    ? strlen(c->name) == nm->via.str.size &&
                          !memcmp(c->name, nm->via.str.ptr, nm->via.str.size)
                : id && id->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (uint64_t)c->id == id->via.u64
                                                                    : false)
                e = c;
        }
        if (!e) {
            snprintf(msg, cap,
                     "adapters[%u]: model '%s' has no such adapter (by \"id\" or \"name\")", i,
                     model);
            return ZI_EINVAL;
        }
        if (v == 0.0) continue;
        if (n == ZI_MAX_LORA) {
            snprintf(msg, cap, "adapters: more than %d applied at once", ZI_MAX_LORA);
            return ZI_EINVAL;
        }
        which[n] = e, scales[n++] = v;
    }
    for (size_t k = 0; s && k < s->n; k++)
        if (!strcmp(s->v[k].model, model)) s->v[k].applied = 0.0;
    for (uint32_t i = 0; i < n; i++) which[i]->applied = scales[i];
    return ZI_OK;
}
