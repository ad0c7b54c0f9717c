/*
 * http_reply.c - router replies gathered per choice and rendered as
 * OpenAI's JSON and SSE chunks (http_reply.h).
 */
#include "http_reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "chat_stream.h"
#include "codec.h"
#include "grow.h"
#include "tool_stream.h"
#include "utf8.h"

int zi_http_buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return -1;
        *buf = b, *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

json_t *zi_http_jstr(const char *s, size_t n) {
    if (!s) return json_string("");
    if (zi_utf8_valid(s, n)) return json_stringn(s, n);
    size_t m;
    char *c = zi_utf8_clean(s, n, &m);
    json_t *j = c ? json_stringn(c, m) : json_string("");
    free(c);
    return j;
}

void zi_http_result_init(zi_http_result *r, zi_http_gen *g, const char *model) {
    memset(r, 0, sizeof *r);
    r->g = g;
    unsigned char rnd[12];
    if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) memset(rnd, 0, sizeof rnd);
    int k = snprintf(r->id, sizeof r->id, "%s", g->kind == ZI_HTTP_CHAT ? "chatcmpl-" : "cmpl-");
    for (size_t i = 0; i < sizeof rnd; i++)
        k += snprintf(r->id + k, sizeof r->id - k, "%02x", rnd[i]);
    r->created = (long long)time(NULL);
    snprintf(r->model, sizeof r->model, "%s", model);
}

void zi_http_result_free(zi_http_result *r) {
    if (r->api_state && r->api_state_free) r->api_state_free(r->api_state);
    r->api_state = NULL;
    for (int i = 0; i < ZI_HTTP_MAX_N; i++) {
        free(r->ch[i].text);
        free(r->ch[i].lp);
        free(r->ch[i].prompt_lp);
        free(r->ch[i].prompt_text);
        free(r->ch[i].stop_string);
        zi_chat_stream_free(r->ch[i].cs);
    }
    memset(r->ch, 0, sizeof r->ch);
}

/* LogProbabilities (docs/protocol.md) for the tokens ids[0..n) into lp[0..n). */
static int decode_lps(const msgpack_object *o, const int64_t *ids, size_t n, zi_http_lp *lp) {
    const msgpack_object *tl = zi_map_get(o, "token_log_probabilities");
    const msgpack_object *top = zi_map_get(o, "top_log_probabilities");
    double *v = NULL;
    size_t nv = 0;
    if (!tl || zi_http_decode_floats(tl, &v, &nv) || nv != n || !top ||
        top->type != MSGPACK_OBJECT_ARRAY || top->via.array.size != n) {
        free(v);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        zi_http_lp *x = &lp[i];
        memset(x, 0, sizeof *x);
        x->id = ids[i], x->lp = v[i], x->has_lp = 1;
        const msgpack_object *m = &top->via.array.ptr[i];
        if (m->type != MSGPACK_OBJECT_MAP) continue;
        for (uint32_t j = 0; j < m->via.map.size && x->n_top < ZI_HTTP_TOP_MAX; j++) {
            const msgpack_object_kv *kv = &m->via.map.ptr[j];
            if (kv->key.type != MSGPACK_OBJECT_POSITIVE_INTEGER) continue;
            double val =
                kv->val.type == MSGPACK_OBJECT_FLOAT32 || kv->val.type == MSGPACK_OBJECT_FLOAT64
                    ? kv->val.via.f64
                    : 0.0;
            /* insertion sort, most probable first */
            int k = x->n_top++;
            while (k > 0 && x->top_lp[k - 1] < val) {
                x->top_lp[k] = x->top_lp[k - 1], x->top_id[k] = x->top_id[k - 1];
                k--;
            }
            x->top_lp[k] = val, x->top_id[k] = (int64_t)kv->key.via.u64;
        }
    }
    free(v);
    return 0;
}

static int bad_frame(zi_http_error *e, const char *what) {
    return zi_http_fail(e, 500, "internal", NULL, "malformed reply from the router: %s", what);
}

/* echo: the prompt's ids, text and log probabilities of the first chunk. */
static int apply_prompt(zi_http_choice *c, const msgpack_object *f, zi_http_error *e) {
    const msgpack_object *pt = zi_map_get(f, "prompt_text");
    if (pt && pt->type == MSGPACK_OBJECT_STR && !c->prompt_text) {
        c->prompt_text = strndup(pt->via.str.ptr, pt->via.str.size);
        c->prompt_text_len = c->prompt_text ? strlen(c->prompt_text) : 0;
    }
    const msgpack_object *pi = zi_map_get(f, "prompt_token_ids");
    const msgpack_object *pl = zi_map_get(f, "prompt_logprobs");
    if (!pi || !pl) return 0;
    int64_t *ids;
    size_t n;
    if (zi_http_decode_ids(pi, &ids, &n)) return bad_frame(e, "prompt_token_ids");
    if (!n) return 0;
    free(c->prompt_lp);
    c->prompt_lp = calloc(n, sizeof *c->prompt_lp);
    if (!c->prompt_lp || decode_lps(pl, ids + 1, n - 1, c->prompt_lp + 1)) {
        free(ids);
        return bad_frame(e, "prompt_logprobs");
    }
    c->prompt_lp[0].id = ids[0]; /* the first token has no prediction */
    c->n_prompt_lp = n;
    free(ids);
    return 0;
}

int zi_http_result_apply(zi_http_result *r, const msgpack_object *f, zi_http_delta *d,
                         zi_http_error *e) {
    char id[300], ev[16];
    zi_http_frame_str(f, "id", id, sizeof id);
    zi_http_frame_str(f, "event", ev, sizeof ev);
    if (!strcmp(ev, "error") && (!id[0] || id[0] == 'g')) {
        char code[64], msg[ZI_HTTP_MSG_MAX], field[128];
        zi_http_frame_str(f, "code", code, sizeof code);
        zi_http_frame_str(f, "message", msg, sizeof msg);
        zi_http_frame_str(f, "field", field, sizeof field);
        return zi_http_router_error(e, code, msg, field, r->g->field_map);
    }
    char *end;
    long i = id[0] == 'g' ? strtol(id + 1, &end, 10) : -1;
    if (i < 0 || i >= r->g->n || *end) return 1;
    zi_http_choice *c = &r->ch[i];
    if (c->status[0]) return 1; /* already final */
    memset(d, 0, sizeof *d);
    d->index = (int)i, d->text_from = c->len, d->lp_from = c->n_lp;
    d->first = !c->started;
    c->started = 1;
    if (!strcmp(ev, "final")) {
        zi_http_frame_str(f, "status", c->status, sizeof c->status);
        if (!c->status[0]) snprintf(c->status, sizeof c->status, "end_of_sequence");
        const msgpack_object *u = zi_map_get(f, "usage");
        int64_t pt = 0, ct = 0;
        if (u)
            zi_map_int(u, "prompt_tokens", &pt, NULL),
                zi_map_int(u, "completion_tokens", &ct, NULL);
        c->prompt_tokens = pt, c->completion_tokens = ct;
        const msgpack_object *ss = zi_map_get(f, "stop_string");
        if (ss && ss->type == MSGPACK_OBJECT_STR && !c->stop_string)
            c->stop_string = strndup(ss->via.str.ptr, ss->via.str.size);
        d->final = 1;
        r->n_done++;
        /* A deadline is no normal finish: OpenAI has no finish_reason for
         * it, so it is an error an SDK raises (docs/http.md, "Deadlines"). */
        if (!strcmp(c->status, "deadline_exceeded")) {
            if (r->g->timeout_ms)
                return zi_http_fail(e, 504, "deadline_exceeded", "timeout_ms",
                                    "timeout_ms: the request's deadline (%lld ms) passed after "
                                    "%lld generated tokens",
                                    r->g->timeout_ms, (long long)ct);
            return zi_http_fail(e, 504, "deadline_exceeded", NULL,
                                "the server's deadline for a request (--request-timeout) passed "
                                "after %lld generated tokens",
                                (long long)ct);
        }
        return 0;
    }
    if (strcmp(ev, "chunk")) return 1;
    int64_t pt; /* the first chunk's prompt length (the final frame says it again) */
    if (!zi_map_int(f, "prompt_tokens", &pt, NULL)) c->prompt_tokens = pt;
    if (d->first && r->g->echo && apply_prompt(c, f, e)) return -1;
    /* The rendered prompt opened a thinking section (docs/protocol.md);
     * every choice has the same prompt. */
    const msgpack_object *ro = zi_map_get(f, "reasoning_open");
    const msgpack_object *rh = zi_map_get(f, "reasoning_harmony");
    if (d->first && ro && ro->type == MSGPACK_OBJECT_BOOLEAN && ro->via.boolean)
        r->g->reasoning.open = rh && rh->type == MSGPACK_OBJECT_BOOLEAN && rh->via.boolean ? 2 : 1;
    const msgpack_object *t = zi_map_get(f, "text");
    if (t && t->type == MSGPACK_OBJECT_STR &&
        zi_http_buf_add(&c->text, &c->len, &c->cap, t->via.str.ptr, t->via.str.size))
        return zi_http_fail(e, 500, "internal", NULL, "out of memory");
    const msgpack_object *lp = zi_map_get(f, "logprobs");
    if (r->g->logprobs >= 0 && lp) {
        const msgpack_object *ti = zi_map_get(f, "token_ids");
        int64_t *ids = NULL;
        size_t n = 0;
        if (!ti || zi_http_decode_ids(ti, &ids, &n)) return bad_frame(e, "token_ids");
        while (c->n_lp + n > c->cap_lp) {
            zi_http_lp *p = zi_grow(c->lp, &c->cap_lp, sizeof *c->lp, 64);
            if (!p) {
                free(ids);
                return zi_http_fail(e, 500, "internal", NULL, "out of memory");
            }
            c->lp = p;
        }
        int rc = decode_lps(lp, ids, n, c->lp + c->n_lp);
        free(ids);
        if (rc) return bad_frame(e, "logprobs");
        c->n_lp += n;
    }
    return 0;
}

static const char *finish_reason(const char *status) {
    return !strcmp(status, "maximum_length") ? "length" : "stop";
}

/* The texts of lp[0..n) and their alternatives, in order: token, then its
 * tops. *texts is malloc'd. */
static int lp_texts(zi_http_conn *c, const zi_http_lp *lp, size_t n, const char ***texts,
                    zi_http_error *e) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += 1 + (size_t)lp[i].n_top;
    int64_t *ids = malloc((k ? k : 1) * sizeof *ids);
    *texts = calloc(k ? k : 1, sizeof **texts);
    if (!ids || !*texts) {
        free(ids);
        free(*texts);
        return zi_http_fail(e, 500, "internal", NULL, "out of memory");
    }
    k = 0;
    for (size_t i = 0; i < n; i++) {
        ids[k++] = lp[i].id;
        for (int j = 0; j < lp[i].n_top; j++) ids[k++] = lp[i].top_id[j];
    }
    int rc = zi_http_token_texts(c, ids, k, *texts, e);
    free(ids);
    if (rc) free(*texts);
    return rc;
}

static json_t *bytes_of(const char *s) {
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        json_array_append_new(a, json_integer(*p));
    return a;
}

/* Chat's logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}. */
static json_t *chat_logprobs(const zi_http_result *r, const zi_http_lp *lp, size_t n,
                             zi_http_conn *c, zi_http_error *e) {
    const char **texts;
    if (lp_texts(c, lp, n, &texts, e)) return NULL;
    json_t *content = json_array();
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *tt = texts[k++];
        json_t *ent = json_object(), *tops = json_array();
        json_object_set_new(ent, "token", zi_http_jstr(tt, strlen(tt)));
        json_object_set_new(ent, "logprob", json_real(lp[i].lp));
        json_object_set_new(ent, "bytes", bytes_of(tt));
        for (int j = 0; j < lp[i].n_top; j++) {
            const char *x = texts[k++];
            if (j >= r->g->logprobs) continue;
            json_t *t = json_object();
            json_object_set_new(t, "token", zi_http_jstr(x, strlen(x)));
            json_object_set_new(t, "logprob", json_real(lp[i].top_lp[j]));
            json_object_set_new(t, "bytes", bytes_of(x));
            json_array_append_new(tops, t);
        }
        json_object_set_new(ent, "top_logprobs", tops);
        json_array_append_new(content, ent);
    }
    free(texts);
    json_t *o = json_object();
    json_object_set_new(o, "content", content);
    json_object_set_new(o, "refusal", json_null());
    return o;
}

/* Completions' logprobs: {tokens, token_logprobs, top_logprobs, text_offset}
 * for the echoed prompt's tokens (pn of them, pl) then the completion's. */
static json_t *completion_logprobs(const zi_http_result *r, const zi_http_lp *pl, size_t pn,
                                   const zi_http_lp *lp, size_t n, size_t offset, zi_http_conn *c,
                                   zi_http_error *e) {
    json_t *o = json_object(), *tokens = json_array(), *tlp = json_array(), *top = json_array(),
           *off = json_array();
    json_object_set_new(o, "tokens", tokens);
    json_object_set_new(o, "token_logprobs", tlp);
    json_object_set_new(o, "top_logprobs", top);
    json_object_set_new(o, "text_offset", off);
    for (int part = 0; part < 2; part++) {
        const zi_http_lp *v = part ? lp : pl;
        size_t m = part ? n : pn;
        if (!m) continue;
        const char **texts;
        if (lp_texts(c, v, m, &texts, e)) {
            json_decref(o);
            return NULL;
        }
        size_t k = 0;
        for (size_t i = 0; i < m; i++) {
            const char *tt = texts[k++];
            json_array_append_new(tokens, zi_http_jstr(tt, strlen(tt)));
            json_array_append_new(tlp, v[i].has_lp ? json_real(v[i].lp) : json_null());
            json_array_append_new(off, json_integer((json_int_t)offset));
            offset += strlen(tt);
            json_t *d = v[i].has_lp ? json_object() : json_null();
            for (int j = 0; j < v[i].n_top; j++) {
                const char *x = texts[k++];
                if (j < r->g->logprobs) json_object_set_new(d, x, json_real(v[i].top_lp[j]));
            }
            json_array_append_new(top, d);
        }
        free(texts);
    }
    return o;
}

static json_t *usage_json(const zi_http_result *r) {
    long long pt = r->ch[0].prompt_tokens, ct = 0;
    for (int i = 0; i < r->g->n; i++) ct += r->ch[i].completion_tokens;
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(pt));
    json_object_set_new(u, "completion_tokens", json_integer(ct));
    json_object_set_new(u, "total_tokens", json_integer(pt + ct));
    return u;
}

static json_t *envelope(const zi_http_result *r, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(r->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(r->created));
    json_object_set_new(o, "model", zi_http_jstr(r->model, strlen(r->model)));
    return o;
}

/* The echoed prompt: the request's own text, else the router's rendering. */
static void echo_text(const zi_http_result *r, const zi_http_choice *c, const char **s, size_t *n) {
    *s = r->g->prompt ? r->g->prompt : c->prompt_text ? c->prompt_text : "";
    *n = strlen(*s);
}

json_t *zi_http_render_full(zi_http_result *r, zi_http_conn *conn, zi_http_error *e) {
    int chat = r->g->kind == ZI_HTTP_CHAT;
    json_t *o = envelope(r, chat ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    json_object_set_new(o, "choices", choices);
    for (int i = 0; i < r->g->n; i++) {
        zi_http_choice *c = &r->ch[i];
        json_t *ch = json_object(), *lp = json_null();
        json_object_set_new(ch, "index", json_integer(i));
        const char *es = "";
        size_t en = 0;
        if (r->g->echo) echo_text(r, c, &es, &en);
        if (r->g->logprobs >= 0) {
            lp = chat ? chat_logprobs(r, c->lp, c->n_lp, conn, e)
                      : completion_logprobs(r, c->prompt_lp, c->n_prompt_lp, c->lp, c->n_lp, 0,
                                            conn, e);
            if (!lp) {
                json_decref(ch);
                json_decref(o);
                return NULL;
            }
        }
        const char *finish = finish_reason(c->status);
        if (chat) {
            json_t *m = json_object();
            json_object_set_new(m, "role", json_string("assistant"));
            /* The reasoning, content and calls as the stream reports
             * them (chat_stream.h). */
            char *reasoning, *text;
            size_t rn, tn;
            json_t *calls;
            if (zi_chat_stream_split(r->g, c->text ? c->text : "", c->len, &reasoning, &rn, &text,
                                     &tn, &calls)) {
                json_decref(m);
                json_decref(ch);
                json_decref(lp);
                json_decref(o);
                zi_http_fail(e, 500, "internal", NULL, "out of memory");
                return NULL;
            }
            if (calls) {
                json_object_set_new(m, "content", tn ? zi_http_jstr(text, tn) : json_null());
                json_object_set_new(m, "tool_calls", calls);
                finish = "tool_calls";
            } else {
                json_object_set_new(m, "content", zi_http_jstr(text, tn));
            }
            if (rn) json_object_set_new(m, "reasoning_content", zi_http_jstr(reasoning, rn));
            free(text);
            free(reasoning);
            json_object_set_new(m, "refusal", json_null());
            json_object_set_new(ch, "message", m);
        } else {
            char *all = NULL;
            size_t len = 0, cap = 0;
            zi_http_buf_add(&all, &len, &cap, es, en);
            zi_http_buf_add(&all, &len, &cap, c->text ? c->text : "", c->len);
            json_object_set_new(ch, "text", zi_http_jstr(all ? all : "", len));
            free(all);
        }
        json_object_set_new(ch, "logprobs", lp);
        json_object_set_new(ch, "finish_reason", json_string(finish));
        json_array_append_new(choices, ch);
    }
    json_object_set_new(o, "usage", usage_json(r));
    return o;
}

/* Appends "data: <o>\n\n" and drops o. */
static int add_event(json_t *o, char **out, size_t *len, size_t *cap) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return -1;
    int rc = zi_http_buf_add(out, len, cap, "data: ", 6) ||
             zi_http_buf_add(out, len, cap, s, strlen(s)) ||
             zi_http_buf_add(out, len, cap, "\n\n", 2);
    free(s);
    return rc ? -1 : 0;
}

/* One chunk with one choice: delta (chat) or text (completions). */
static json_t *chunk(const zi_http_result *r, int index, json_t *delta_or_text, json_t *lp,
                     const char *finish) {
    int chat = r->g->kind == ZI_HTTP_CHAT;
    json_t *o = envelope(r, chat ? "chat.completion.chunk" : "text_completion");
    json_t *ch = json_object(), *choices = json_array();
    json_object_set_new(ch, "index", json_integer(index));
    json_object_set_new(ch, chat ? "delta" : "text", delta_or_text);
    json_object_set_new(ch, "logprobs", lp ? lp : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_array_append_new(choices, ch);
    json_object_set_new(o, "choices", choices);
    if (r->g->include_usage) json_object_set_new(o, "usage", json_null());
    return o;
}

/* A JSON string's value with n more bytes (s may hold invalid UTF-8). */
static json_t *str_cat(json_t *old, const char *s, size_t n) {
    size_t m = json_string_length(old);
    char *b = malloc(m + n + 1);
    if (!b) return NULL;
    if (m) memcpy(b, json_string_value(old), m);
    if (n) memcpy(b + m, s, n);
    json_t *j = zi_http_jstr(b, m + n);
    free(b);
    return j;
}

/* chat_stream's events as chat deltas (chat_stream.h): reasoning text
 * joined (reasoning_content), content text joined, a call's start as its
 * own delta, its argument fragments joined. */
static int chat_event(void *arg, const zi_ts_event *ev) {
    json_t *deltas = arg, *d = NULL;
    size_t n = json_array_size(deltas);
    json_t *last = n ? json_array_get(deltas, n - 1) : NULL;
    json_t *lc = json_object_get(last, "content");
    json_t *lr = json_object_get(last, "reasoning_content");
    json_t *lt = json_array_get(json_object_get(last, "tool_calls"), 0);
    json_t *lfn = json_object_get(lt, "function");
    switch (ev->kind) {
    case ZI_TS_REASONING:
        if (lr)
            return json_object_set_new(last, "reasoning_content", str_cat(lr, ev->text, ev->len));
        d = json_pack("{s:o}", "reasoning_content", zi_http_jstr(ev->text, ev->len));
        break;
    case ZI_TS_CONTENT:
        if (lc) return json_object_set_new(last, "content", str_cat(lc, ev->text, ev->len));
        d = json_pack("{s:o}", "content", zi_http_jstr(ev->text, ev->len));
        break;
    case ZI_TS_CALL:
        d = json_pack("{s:[{s:i, s:s, s:s, s:{s:o, s:s}}]}", "tool_calls", "index", ev->index, "id",
                      ev->id, "type", "function", "function", "name",
                      zi_http_jstr(ev->text, ev->len), "arguments", "");
        break;
    case ZI_TS_ARGS:
        if (lt && !json_object_get(lt, "id") &&
            json_integer_value(json_object_get(lt, "index")) == ev->index)
            return json_object_set_new(
                lfn, "arguments", str_cat(json_object_get(lfn, "arguments"), ev->text, ev->len));
        d = json_pack("{s:[{s:i, s:{s:o}}]}", "tool_calls", "index", ev->index, "function",
                      "arguments", zi_http_jstr(ev->text, ev->len));
        break;
    }
    return json_array_append_new(deltas, d);
}

/* A chat choice's delta through the choice's chat_stream: the reasoning
 * streams as reasoning_content, content as usual, a call starts once its
 * name is known and its arguments stream as they come (docs/http.md).
 * The log probabilities ride with the next chunk sent. */
static int render_chat_delta(zi_http_result *r, const zi_http_delta *d, zi_http_conn *conn,
                             char **out, size_t *len, size_t *cap, zi_http_error *e) {
    zi_http_choice *c = &r->ch[d->index];
    if (!c->cs && !(c->cs = zi_chat_stream_new(r->g))) goto oom;
    json_t *deltas = json_array(), *delta;
    if (!deltas) goto oom;
    int rc = zi_chat_stream_feed(c->cs, c->text ? c->text + d->text_from : "",
                                 c->len - d->text_from, chat_event, deltas);
    if (!rc && d->final) rc = zi_chat_stream_finish(c->cs, chat_event, deltas);
    size_t k;
    json_array_foreach(deltas, k, delta) {
        if (rc) break;
        json_t *lp = NULL;
        if (r->g->logprobs >= 0 && c->lp_sent < c->n_lp) {
            if (!(lp = chat_logprobs(r, c->lp + c->lp_sent, c->n_lp - c->lp_sent, conn, e))) {
                json_decref(deltas);
                return -1;
            }
            c->lp_sent = c->n_lp;
        }
        rc = add_event(chunk(r, d->index, json_incref(delta), lp, NULL), out, len, cap);
    }
    json_decref(deltas);
    if (rc) goto oom;
    if (!d->final) return 0;
    json_t *lp = NULL;
    if (r->g->logprobs >= 0 && c->lp_sent < c->n_lp) {
        if (!(lp = chat_logprobs(r, c->lp + c->lp_sent, c->n_lp - c->lp_sent, conn, e))) return -1;
        c->lp_sent = c->n_lp;
    }
    const char *finish = zi_chat_stream_calls_ok(c->cs) ? "tool_calls" : finish_reason(c->status);
    if (add_event(chunk(r, d->index, json_object(), lp, finish), out, len, cap)) goto oom;
    return 0;
oom:
    return zi_http_fail(e, 500, "internal", NULL, "out of memory");
}

int zi_http_render_delta(zi_http_result *r, const zi_http_delta *d, zi_http_conn *conn, char **out,
                         size_t *len, size_t *cap, zi_http_error *e) {
    zi_http_choice *c = &r->ch[d->index];
    if (r->g->kind == ZI_HTTP_CHAT) { /* one path: chat_stream (format none passes all) */
        if (d->first) {
            json_t *delta = json_object();
            json_object_set_new(delta, "role", json_string("assistant"));
            json_object_set_new(delta, "content", json_string(""));
            if (add_event(chunk(r, d->index, delta, NULL, NULL), out, len, cap)) goto oom;
        }
        return render_chat_delta(r, d, conn, out, len, cap, e);
    }
    const char *es = "";
    size_t en = 0;
    if (r->g->echo && d->first) echo_text(r, c, &es, &en);
    size_t text_from = d->text_from, lp_from = d->lp_from;
    size_t nt = c->len - text_from, nl = c->n_lp - lp_from;
    const char *finish = d->final ? finish_reason(c->status) : NULL;
    int has_prompt_lp = d->first && c->n_prompt_lp;
    if (nt || nl || en || has_prompt_lp) {
        json_t *lp = NULL;
        if (r->g->logprobs >= 0) {
            size_t offset = text_from + (r->g->echo ? strlen(r->g->prompt     ? r->g->prompt
                                                             : c->prompt_text ? c->prompt_text
                                                                              : "")
                                                    : 0);
            if (has_prompt_lp) offset = 0;
            lp = completion_logprobs(r, has_prompt_lp ? c->prompt_lp : NULL,
                                     has_prompt_lp ? c->n_prompt_lp : 0, c->lp + lp_from, nl,
                                     offset, conn, e);
            if (!lp) return -1;
        }
        char *s = NULL;
        size_t sl = 0, sc = 0;
        zi_http_buf_add(&s, &sl, &sc, es, en);
        zi_http_buf_add(&s, &sl, &sc, c->text ? c->text + text_from : "", nt);
        json_t *body = zi_http_jstr(s ? s : "", sl);
        free(s);
        if (add_event(chunk(r, d->index, body, lp, NULL), out, len, cap)) goto oom;
    }
    if (finish && add_event(chunk(r, d->index, json_string(""), NULL, finish), out, len, cap))
        goto oom;
    return 0;
oom:
    return zi_http_fail(e, 500, "internal", NULL, "out of memory");
}

int zi_http_render_end(zi_http_result *r, char **out, size_t *len, size_t *cap) {
    if (r->g->include_usage) {
        json_t *o =
            envelope(r, r->g->kind == ZI_HTTP_CHAT ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", usage_json(r));
        if (add_event(o, out, len, cap)) return -1;
    }
    return zi_http_buf_add(out, len, cap, "data: [DONE]\n\n", 14);
}

int zi_http_render_stream_error(const zi_http_error *e, char **out, size_t *len, size_t *cap) {
    return add_event(zi_http_error_json(e), out, len, cap);
}
