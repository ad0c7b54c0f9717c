/*
 * router_schedule.c - where the router's requests run (router_impl.h lists
 * the router's files): the least-loaded backend of a role, the FIFO queue
 * of encoded requests waiting for a worker slot, the prompt-prefix
 * affinity that sends a request to the worker likely to have its prefix
 * cached, and dispatch(), which starts queued requests on workers.
 */
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "grow.h"
#include "router_impl.h"

/* The least-loaded live backend of a role; workers must have a free slot. */
int pick_backend(const router *rt, int role) {
    int best = -1;
    for (size_t i = 0; i < rt->n_be; i++) {
        const backend *b = &rt->be[i];
        if (!b->alive || b->role != role) continue;
        if (role == ROLE_WORKER && b->assigned >= b->slots) continue;
        if (best < 0 || b->assigned < rt->be[best].assigned) best = (int)i;
    }
    return best;
}

int count_alive(const router *rt, int role) {
    int n = 0;
    for (size_t i = 0; i < rt->n_be; i++) n += rt->be[i].alive && rt->be[i].role == role;
    return n;
}

/* The context limit for new requests: the smallest live worker's. */
int64_t worker_max_length(const router *rt) {
    int64_t m = 0;
    for (size_t i = 0; i < rt->n_be; i++)
        if (rt->be[i].alive && rt->be[i].role == ROLE_WORKER &&
            (m == 0 || rt->be[i].max_length < m))
            m = rt->be[i].max_length;
    return m;
}

int queue_push(router *rt, uint64_t rid) {
    if (rt->q_len == rt->q_cap) {
        uint64_t *q = zi_grow(rt->queue, &rt->q_cap, sizeof *q, 64);
        if (!q) return ZI_ENOMEM;
        rt->queue = q;
    }
    rt->queue[rt->q_len++] = rid;
    return ZI_OK;
}

int queue_push_front(router *rt, uint64_t rid) {
    int rc = queue_push(rt, rid);
    if (rc) return rc;
    memmove(rt->queue + 1, rt->queue, (rt->q_len - 1) * sizeof *rt->queue);
    rt->queue[0] = rid;
    return ZI_OK;
}

void queue_remove(router *rt, uint64_t rid) {
    for (size_t i = 0; i < rt->q_len; i++)
        if (rt->queue[i] == rid) {
            memmove(rt->queue + i, rt->queue + i + 1, (rt->q_len - i - 1) * sizeof *rt->queue);
            rt->q_len--;
            return;
        }
}

/* The prompt-prefix key of a context: a hash of its first 64 tokens, or of
 * fewer (a multiple of 16, the usual KV block) when the prompt is shorter;
 * 0 under 17 tokens. Requests that share a long prefix share the key. */
uint64_t prefix_key(const msgpack_object *ctx) {
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
void dispatch(router *rt) {
    while (rt->q_len > 0) {
        rreq *r = zi_req_table_get(&rt->reqs, rt->queue[0]);
        int w = pick_worker(rt, r);
        if (w < 0) return;
        uint64_t rid = rt->queue[0];
        memmove(rt->queue, rt->queue + 1, (rt->q_len - 1) * sizeof *rt->queue);
        rt->q_len--;
        if (!r) continue;
        if (r->prefix_key) rt->aff[ZI_AFFINITY_SLOT(r->prefix_key)] = (affinity){r->prefix_key, w};
        /* A resumed request starts from its resume message; the first
         * start message stays kept for the next failover. */
        const char *msg = r->resume_msg ? r->resume_msg : r->start_msg;
        size_t len = r->resume_msg ? r->resume_len : r->start_len;
        if (zi_send(rt->back, rt->be[w].ident, rt->be[w].ident_len, false, msg, len) != 0) {
            fail_request(rt, r, "worker_lost", "the chosen worker is unreachable", NULL);
            continue;
        }
        free(r->resume_msg);
        r->resume_msg = NULL;
        r->state = RS_RUNNING;
        if (!r->resumes) /* queue time: admission to its first worker */
            zi_im_hist_observe(&rt->metrics.hist[ZI_IM_HIST_QUEUE],
                               (double)(zi_now_ms() - r->t_recv_ms) / 1e3);
        r->wrk = w;
        rt->be[w].assigned++;
        rt->n_waiting--;
        zi_log(&rt->log, ZI_LOG_DEBUG, "request %llu -> worker %d", (unsigned long long)rid, w);
    }
}

void affinity_forget(router *rt, int b) {
    for (int i = 0; i < ZI_AFFINITY_SLOTS; i++)
        if (rt->aff[i].worker == b) rt->aff[i].worker = -1;
}
