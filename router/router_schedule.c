/*
 * router_schedule.c - where the router's requests run (router_impl.h lists
 * the router's files): the models it knows and the default one, the
 * least-loaded backend of a role serving a request's model, the FIFO queue
 * of encoded requests waiting for a worker slot, the prompt-prefix
 * affinity that sends a request to the worker likely to have its prefix
 * cached, and dispatch(), which starts queued requests on workers.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "grow.h"
#include "router_impl.h"

bool serves(const backend *b, const char *model) {
    return !model || !model[0] || !b->model[0] || !strcmp(b->model, model);
}

/* How many distinct models the live workers serve (counted up to 2). */
static int worker_models(const router *rt) {
    const char *first = NULL;
    for (size_t i = 0; i < rt->n_be; i++) {
        const backend *b = &rt->be[i];
        if (!b->alive || b->role != ROLE_WORKER) continue;
        if (!first)
            first = b->model;
        else if (strcmp(first, b->model))
            return 2;
    }
    return first ? 1 : 0;
}

static int least_loaded(const router *rt, int role, const char *model) {
    int best = -1;
    for (size_t i = 0; i < rt->n_be; i++) {
        const backend *b = &rt->be[i];
        if (!b->alive || b->role != role || !serves(b, model)) continue;
        if (role == ROLE_WORKER && b->assigned >= b->slots) continue;
        if (best < 0 || b->assigned < rt->be[best].assigned) best = (int)i;
    }
    return best;
}

/* The least-loaded live backend of a role serving model; workers must
 * have a free slot. */
int pick_backend(const router *rt, int role, const char *model) {
    int b = least_loaded(rt, role, model);
    /* No --served-models and one model served: a tokenizer started by hand
     * from a file named otherwise still tokenizes for it (it reads the
     * same vocabulary). */
    bool configured = rt->n_models > 0 && rt->models[0].configured;
    if (b < 0 && role == ROLE_TOKENIZER && model && model[0] && !configured &&
        worker_models(rt) <= 1) {
        /* ... but never one of a model that live workers serve: that is
         * another model's vocabulary. */
        for (size_t i = 0; i < rt->n_be; i++) {
            const backend *t = &rt->be[i];
            if (!t->alive || t->role != ROLE_TOKENIZER ||
                (t->model[0] && count_alive(rt, ROLE_WORKER, t->model) > 0))
                continue;
            if (b < 0 || t->assigned < rt->be[b].assigned) b = (int)i;
        }
    }
    return b;
}

int count_alive(const router *rt, int role, const char *model) {
    int n = 0;
    for (size_t i = 0; i < rt->n_be; i++)
        n += rt->be[i].alive && rt->be[i].role == role && serves(&rt->be[i], model);
    return n;
}

/* The context limit for new requests of model: the smallest live worker's. */
int64_t worker_max_length(const router *rt, const char *model) {
    int64_t m = 0;
    for (size_t i = 0; i < rt->n_be; i++)
        if (rt->be[i].alive && rt->be[i].role == ROLE_WORKER && serves(&rt->be[i], model) &&
            (m == 0 || rt->be[i].max_length < m))
            m = rt->be[i].max_length;
    return m;
}

model_rec *model_find(router *rt, const char *name, bool add) {
    if (!name || !name[0]) return NULL;
    for (size_t i = 0; i < rt->n_models; i++)
        if (!strcmp(rt->models[i].name, name)) return &rt->models[i];
    if (!add || rt->n_models == ZI_ROUTER_MAX_MODELS || strlen(name) >= ZI_ROUTER_MODEL_NAME)
        return NULL;
    model_rec *m = &rt->models[rt->n_models++];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    return m;
}

int64_t model_keep_alive(const router *rt, const model_rec *m) {
    return m->has_keep_alive ? m->keep_alive_ms : rt->keep_alive_ms;
}

const char *default_model(const router *rt) {
    if (rt->n_models > 0 && rt->models[0].configured) return rt->models[0].name;
    for (size_t i = 0; i < rt->n_be; i++)
        if (rt->be[i].alive && rt->be[i].role == ROLE_WORKER) return rt->be[i].model;
    return "";
}

long long model_queue_limit(const router *rt) {
    if (rt->max_model_queue > 0) return rt->max_model_queue;
    if (rt->n_models <= 1) return rt->max_queue;
    return rt->max_queue / 2 > 0 ? rt->max_queue / 2 : 1;
}

void model_names(const router *rt, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < rt->n_models && n + 1 < cap; i++) {
        int w = snprintf(buf + n, cap - n, "%s'%s'", i ? ", " : "", rt->models[i].name);
        if (w < 0) break;
        n += (size_t)w;
    }
    if (n >= cap && cap > 4) memcpy(buf + cap - 4, "...", 4); /* cut: say so */
}

rqueue *queue_of(router *rt, const rreq *r) {
    model_rec *m = model_find(rt, r->model, false);
    return m ? &m->q : &rt->any_q;
}

void waiting_add(router *rt, rreq *r, int d) {
    if (d > 0) r->wait_m = model_find(rt, r->model, false);
    assert(d > 0 || (rt->n_waiting > 0 && (!r->wait_m || r->wait_m->waiting > 0)));
    rt->n_waiting += (size_t)d; /* (a -1 wraps back) */
    if (r->wait_m) r->wait_m->waiting += (size_t)d;
}

void queue_push(router *rt, rreq *r) {
    rqueue *q = r->q_in = queue_of(rt, r);
    r->q_seq = ++rt->q_seq_back;
    r->q_next = NULL;
    r->q_prev = q->tail;
    if (q->tail)
        q->tail->q_next = r;
    else
        q->head = r;
    q->tail = r;
    q->n++;
    rt->q_len++;
}

void queue_push_front(router *rt, rreq *r) {
    rqueue *q = r->q_in = queue_of(rt, r);
    r->q_seq = --rt->q_seq_front;
    r->q_prev = NULL;
    r->q_next = q->head;
    if (q->head)
        q->head->q_prev = r;
    else
        q->tail = r;
    q->head = r;
    q->n++;
    rt->q_len++;
}

void queue_remove(router *rt, rreq *r) {
    rqueue *q = r->q_in;
    assert(q && q->n > 0 && rt->q_len > 0);
    if (r->q_prev)
        r->q_prev->q_next = r->q_next;
    else
        q->head = r->q_next;
    if (r->q_next)
        r->q_next->q_prev = r->q_prev;
    else
        q->tail = r->q_prev;
    r->q_prev = r->q_next = NULL;
    r->q_in = NULL;
    q->n--;
    rt->q_len--;
}

/* The workers' KV block size. The register message does not carry it,
 * but each worker's heartbeat does (its "kv" map's "block_size", from its
 * --block-size), and the first comes within a second of registering. The
 * key is computed before a worker is chosen, so it has to fit every
 * worker: the largest block size is a whole number of each smaller one
 * (block sizes are powers of two in practice), so a prefix of whole large
 * blocks is whole blocks on every worker. */
int64_t worker_block_size(const router *rt) {
    int64_t bs = 0;
    for (size_t i = 0; i < rt->n_be; i++) {
        int64_t v = rt->be[i].kv[ZI_KV_BLOCK_SIZE];
        /* (a value no worker would send is not taken) */
        if (rt->be[i].alive && rt->be[i].role == ROLE_WORKER && v > bs && v <= 65536) bs = v;
    }
    return bs > 0 ? bs : ZI_ROUTER_BLOCK_DEFAULT;
}

/* The prompt-prefix key of a context: a hash of its first tokens in whole
 * KV blocks (B tokens each, worker_block_size), at most the blocks that
 * cover 64 tokens, and short of the prompt's last token (which a worker
 * always computes, so the blocks it could reuse end before it); 0 when
 * that is not one whole block. A worker's prefix cache matches whole
 * blocks only, so two prompts that share those blocks share the key, and
 * a key over a part-block would tell apart prompts whose cached blocks
 * are the same. With the default B = 16 this is the first 16..64 tokens. */
uint64_t prefix_key(const router *rt, const msgpack_object *ctx, const char *model) {
    const msgpack_object *t = ctx ? zi_map_get(ctx, "tokens") : NULL;
    zi_codec_limits lim = zi_codec_limits_default();
    int32_t *v = NULL;
    size_t n = 0;
    if (!t || zi_codec_decode_tokens(t, &lim, "tokens", &v, &n, NULL) != ZI_OK) return 0;
    size_t bs = (size_t)worker_block_size(rt);
    size_t cap = (64 + bs - 1) / bs * bs; /* the blocks that cover 64 tokens */
    size_t k = n > 0 ? (n - 1) / bs * bs : 0;
    if (k > cap) k = cap;
    uint64_t h = 0;
    if (k >= bs) {
        h = 1469598103934665603ULL;
        for (const char *c = model ? model : ""; *c; c++)
            h = (h ^ (unsigned char)*c) * 1099511628211ULL;
        for (size_t i = 0; i < k; i++) h = (h ^ (uint32_t)v[i]) * 1099511628211ULL;
        h |= 1; /* never 0 */
    }
    free(v);
    return h;
}

/* Whether worker p can take a request of model now. */
static bool can_take(const backend *p, const char *model) {
    return p->alive && p->role == ROLE_WORKER && serves(p, model) && p->assigned < p->slots;
}

/* Whether the disk tier of sharing id disk holds a's prefix. */
static bool disk_holds(const affinity *a, uint64_t disk) {
    for (int i = 0; disk && i < ZI_AFFINITY_DISKS; i++)
        if (a->disk[i] == disk) return true;
    return false;
}

/* The worker for r: the least loaded one of r's model with a free slot
 * (w), unless a warm one is within two requests of it: the worker that
 * last took r's prefix (of the same model: the key holds the model's
 * name), which has it in memory; else, when w reads no disk tier that
 * holds it, the least loaded worker that does (it reads the prefix from
 * disk instead of computing it). */
static int pick_worker(router *rt, const rreq *r) {
    int w = pick_backend(rt, ROLE_WORKER, r ? r->model : NULL);
    if (w < 0 || !r || !r->prefix_key) return w;
    const affinity *a = &rt->aff[ZI_AFFINITY_SLOT(r->prefix_key)];
    if (a->key != r->prefix_key || a->worker == w) return w;
    int near = rt->be[w].assigned + 2;
    if (a->worker >= 0 && (size_t)a->worker < rt->n_be) {
        const backend *p = &rt->be[a->worker];
        if (can_take(p, r->model) && p->assigned <= near) return a->worker;
    }
    if (disk_holds(a, rt->be[w].disk)) return w;
    int d = -1;
    for (size_t i = 0; i < rt->n_be; i++) {
        const backend *p = &rt->be[i];
        if (can_take(p, r->model) && p->assigned <= near && disk_holds(a, p->disk) &&
            (d < 0 || p->assigned < rt->be[d].assigned))
            d = (int)i;
    }
    return d >= 0 ? d : w;
}

/* Worker w took a request of prefix key: it holds the prefix in memory,
 * and its disk tier (if any) will, besides the tiers that held it before
 * (a slot another key takes starts over). */
static void affinity_note(router *rt, uint64_t key, int w) {
    affinity *a = &rt->aff[ZI_AFFINITY_SLOT(key)];
    if (a->key != key) *a = (affinity){.key = key, .worker = -1};
    a->worker = w;
    uint64_t disk = rt->be[w].disk;
    if (!disk || a->disk[0] == disk) return;
    int i = 1;
    while (i < ZI_AFFINITY_DISKS - 1 && a->disk[i] != disk) i++;
    memmove(&a->disk[1], &a->disk[0], (size_t)i * sizeof a->disk[0]);
    a->disk[0] = disk;
}

/* The oldest queued request that a worker can take now, and that worker
 * (*w), or NULL: each queue's head, since a queue's requests share their
 * workers (a head without one means none of its queue has one), the
 * oldest of those first. */
static rreq *next_startable(router *rt, int *w) {
    rreq *best = NULL;
    for (size_t k = 0; k <= rt->n_models; k++) {
        rreq *r = k < rt->n_models ? rt->models[k].q.head : rt->any_q.head;
        if (!r || (best && best->q_seq < r->q_seq)) continue;
        int c = pick_worker(rt, r);
        if (c >= 0) best = r, *w = c;
    }
    return best;
}

/* Starts queued requests on workers with free slots, oldest first: each
 * model's requests in their order; one whose model has no free worker
 * waits without holding up another model's, and costs nothing for the
 * requests queued behind it. */
void dispatch(router *rt) {
    int w = -1;
    for (rreq *r; rt->q_len > 0 && (r = next_startable(rt, &w));) {
        /* A resumed request starts from its resume message; the first
         * start message stays kept for the next failover. */
        const char *msg = r->resume_msg ? r->resume_msg : r->start_msg;
        size_t len = r->resume_msg ? r->resume_len : r->start_len;
        if (out_send(rt, ZI_ROUTER_BACKEND, rt->be[w].ident, rt->be[w].ident_len, false, msg,
                     len) != 0) {
            fail_request(rt, r, "worker_lost", "the chosen worker is unreachable", NULL);
            continue;
        }
        queue_remove(rt, r);
        if (r->prefix_key) affinity_note(rt, r->prefix_key, w);
        free(r->resume_msg);
        r->resume_msg = NULL;
        /* RS_QUEUED -> RS_RUNNING: a worker slot instead of a queue place. */
        r->state = RS_RUNNING;
        if (!r->resumes) /* queue time: admission to its first worker */
            zi_im_hist_observe(&rt->metrics.hist[ZI_IM_HIST_QUEUE],
                               (double)(core_now(rt) - r->t_recv_ms) / 1e3);
        r->wrk = w;
        rt->be[w].assigned++;
        waiting_add(rt, r, -1);
        zi_log(&rt->log, ZI_LOG_DEBUG, "request %llu -> worker %d (%s)", (unsigned long long)r->rid,
               w, r->model[0] ? r->model : "any model");
    }
}

void affinity_adopt(router *rt, int b, const msgpack_object *keys) {
    if (!keys || keys->type != MSGPACK_OBJECT_ARRAY) return;
    for (uint32_t i = 0; i < keys->via.array.size; i++) {
        const msgpack_object *k = &keys->via.array.ptr[i];
        if (k->type == MSGPACK_OBJECT_POSITIVE_INTEGER && (k->via.u64 & 1))
            affinity_note(rt, k->via.u64, b);
    }
}

void affinity_forget(router *rt, int b) {
    for (int i = 0; i < ZI_AFFINITY_SLOTS; i++)
        if (rt->aff[i].worker == b) rt->aff[i].worker = -1;
}
