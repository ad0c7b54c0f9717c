/*
 * chat_template.c - the chat-template engine's public API and evaluator
 * (see chat_template.h).
 *
 * zi_chat_template_compile parses the source once (chat_template_parse.c)
 * into a tree kept in the template's own arena. zi_chat_template_render
 * walks that tree with a fresh per-render context: an arena with a byte
 * limit for every value the render creates, an output buffer with a size
 * limit, counters for loop iterations and evaluation steps, and a depth
 * counter that every recursive call passes through. Values are in
 * chat_template_value.c, operators in chat_template_ops.c, functions,
 * methods and tests in chat_template_builtins.c, filters in
 * chat_template_filters.c (chat_template_value_impl.h lists them).
 *
 * Extra variables (zi_chat_render_opts.vars) are checked with
 * zi_chat_value_check and converted into the render's values before the
 * template runs; their strings are referred to, not copied.
 *
 * Scoping follows jinja2: {% set %} writes to the innermost scope; every
 * for-loop iteration starts a fresh scope whose parent is the scope around
 * the loop (so assignments in a loop body are lost when the iteration
 * ends, which is why templates use namespace()); {% if %} opens no scope;
 * a macro body runs in a scope whose parent is the template's top level.
 */
#include "chat_template.h"
#include "keypath.h"

#include <stdlib.h>
#include <string.h>

#include "chat_template_parse.h"
#include "chat_template_value.h"
#include "utf8.h"

struct zi_chat_template {
    ct_arena arena;
    ct_nodes body;
    const char *src; /* normalised source */
    size_t src_len;
};

/* ---- scopes --------------------------------------------------------------- */

typedef struct frame {
    struct frame *parent;
    size_t n, cap;
    const char **names;
    size_t *lens;
    ct_value *vals;
} frame;

enum { FLOW_NONE, FLOW_BREAK, FLOW_CONTINUE };

typedef struct rt {
    ct_ctx c; /* first: builtins receive &rt.c */
    const zi_chat_template *t;
    frame *root;
    frame *cur;
    ct_buf *out;
    size_t max_output;
    int flow;
    const ct_value *block_input; /* operand of a {% set %}/{% filter %} block's filters */
} rt;

static frame *frame_new(rt *r, frame *parent) {
    frame *f = ct_calloc(&r->c.arena, 1, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

static int frame_set(rt *r, size_t off, frame *f, const char *name, size_t len, ct_value v) {
    for (size_t i = 0; i < f->n; i++)
        if (f->lens[i] == len && memcmp(f->names[i], name, len) == 0) {
            f->vals[i] = v;
            return ZI_OK;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **nn = ct_alloc(&r->c.arena, cap * sizeof *nn);
        size_t *nl = ct_alloc(&r->c.arena, cap * sizeof *nl);
        ct_value *nv = ct_alloc(&r->c.arena, cap * sizeof *nv);
        if (!nn || !nl || !nv) return ct_oom(&r->c, off);
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(nl, f->lens, f->n * sizeof *nl);
            memcpy(nv, f->vals, f->n * sizeof *nv);
        }
        f->names = nn;
        f->lens = nl;
        f->vals = nv;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->lens[f->n] = len;
    f->vals[f->n] = v;
    f->n++;
    return ZI_OK;
}

static int lookup(rt *r, const ct_node *n, ct_value *out) {
    for (frame *f = r->cur; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->lens[i] == n->slen && memcmp(f->names[i], n->s, n->slen) == 0) {
                *out = f->vals[i];
                return ZI_OK;
            }
    int found;
    TRY(ct_global(&r->c, n->off, n->s, n->slen, out, &found));
    if (!found) {
        *out = ct_undef();
        out->uk = 1;
        out->u.s.p = n->s;
        out->u.s.n = n->slen;
    }
    return ZI_OK;
}

/* ---- expressions ------------------------------------------------------- */

static int eval(rt *r, const ct_node *n, ct_value *out);
static int exec_body(rt *r, const ct_nodes *body);

#define SMALL_ARGS 8

/* Evaluated arguments of a call, filter or test. */
typedef struct argv_ {
    ct_value *v;
    size_t n;
    ct_kwarg *kw;
    size_t nkw;
    ct_value small[SMALL_ARGS];
    ct_kwarg small_kw[SMALL_ARGS];
} argv_;

static int eval_args(rt *r, const ct_node *n, argv_ *a) {
    a->n = n->l1.n;
    a->nkw = n->l2.n;
    a->v = a->n <= SMALL_ARGS ? a->small : ct_alloc(&r->c.arena, a->n * sizeof *a->v);
    a->kw = a->nkw <= SMALL_ARGS ? a->small_kw : ct_alloc(&r->c.arena, a->nkw * sizeof *a->kw);
    if (!a->v || !a->kw) return ct_oom(&r->c, n->off);
    for (size_t i = 0; i < a->n; i++) TRY(eval(r, n->l1.v[i], &a->v[i]));
    for (size_t i = 0; i < a->nkw; i++) {
        const ct_node *k = n->l2.v[i];
        a->kw[i].name = k->s;
        a->kw[i].len = k->slen;
        TRY(eval(r, k->a, &a->kw[i].v));
    }
    return ZI_OK;
}

/* Binds a for-loop or {% set %} target. */
static int assign(rt *r, const ct_node *target, const ct_value *v) {
    if (target->kind == CT_N_NAME)
        return frame_set(r, target->off, r->cur, target->s, target->slen, *v);
    if (target->kind == CT_N_NSREF) {
        ct_value ns;
        TRY(lookup(r, target->a, &ns));
        if (ns.t != CT_V_NS)
            return ct_fail(&r->c, target->off, ZI_EINVAL,
                           "cannot assign attribute on non-namespace object");
        if (ct_dict_set(&r->c, ns.u.d, ct_str_ref(target->s, target->slen), *v))
            return ct_oom(&r->c, target->off);
        return ZI_OK;
    }
    /* a tuple of targets: unpack */
    const ct_value *items;
    size_t n;
    if (v->t == CT_V_UNDEF || v->t == CT_V_NONE || v->t == CT_V_INT || v->t == CT_V_BOOL ||
        v->t == CT_V_FLOAT)
        return ct_fail(&r->c, target->off, ZI_EINVAL, "cannot unpack a non-iterable value");
    TRY(ct_iterate(&r->c, target->off, v, &items, &n));
    if (n != target->l1.n)
        return ct_fail(&r->c, target->off, ZI_EINVAL, "%s values to unpack (expected %zu, got %zu)",
                       n > target->l1.n ? "too many" : "not enough", target->l1.n, n);
    for (size_t i = 0; i < n; i++) {
        TRY(ct_enter(&r->c, target->off));
        TRY(assign(r, target->l1.v[i], &items[i]));
        ct_leave(&r->c);
    }
    return ZI_OK;
}

static int call_macro(rt *r, const ct_node *at, const ct_node *m, const argv_ *a, ct_value *out) {
    size_t np = m->l2.n, nd = m->l3.n;
    if (a->n > np)
        return ct_fail(&r->c, at->off, ZI_EINVAL,
                       "macro '%.*s' takes not more than %zu argument(s)", (int)m->slen, m->s, np);
    frame *f = frame_new(r, r->root);
    if (!f) return ct_oom(&r->c, at->off);
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i;
        for (i = 0; i < np; i++)
            if (m->l2.v[i]->slen == a->kw[k].len &&
                memcmp(m->l2.v[i]->s, a->kw[k].name, a->kw[k].len) == 0)
                break;
        if (i == np)
            return ct_fail(&r->c, at->off, ZI_EINVAL,
                           "macro '%.*s' takes no keyword argument '%.*s'", (int)m->slen, m->s,
                           (int)a->kw[k].len, a->kw[k].name);
        if (i < a->n)
            return ct_fail(&r->c, at->off, ZI_EINVAL, "macro '%.*s' got multiple values for '%.*s'",
                           (int)m->slen, m->s, (int)a->kw[k].len, a->kw[k].name);
    }
    frame *saved_cur = r->cur;
    ct_buf *saved_out = r->out;
    r->cur = f;
    /* Parameters in order, so that a default may use earlier parameters. */
    for (size_t i = 0; i < np; i++) {
        const ct_node *p = m->l2.v[i];
        ct_value v = ct_undef();
        int have = 0;
        if (i < a->n) v = a->v[i], have = 1;
        for (size_t k = 0; k < a->nkw && !have; k++)
            if (p->slen == a->kw[k].len && memcmp(p->s, a->kw[k].name, p->slen) == 0)
                v = a->kw[k].v, have = 1;
        if (!have && i + nd >= np) TRY(eval(r, m->l3.v[i + nd - np], &v));
        TRY(frame_set(r, p->off, f, p->s, p->slen, v));
    }
    ct_buf b;
    ct_buf_init(&b, &r->c, r->max_output, 0);
    r->out = &b;
    int rc = exec_body(r, &m->l1);
    r->cur = saved_cur;
    r->out = saved_out;
    TRY(rc);
    return ct_buf_value(&b, out);
}

static int eval_call(rt *r, const ct_node *n, ct_value *out) {
    ct_value callee;
    TRY(eval(r, n->a, &callee));
    argv_ a;
    TRY(eval_args(r, n, &a));
    switch (callee.t) {
    case CT_V_FUNC:
        return ct_call_func(&r->c, n->off, callee.u.fn, a.v, a.n, a.kw, a.nkw, out);
    case CT_V_MACRO:
        return call_macro(r, n, callee.u.m, &a, out);
    case CT_V_UNDEF:
        return ct_undefined_error(&r->c, n->off, &callee);
    default:
        return ct_fail(&r->c, n->off, ZI_EINVAL, "this value is not callable");
    }
}

static int eval_filter(rt *r, const ct_node *n, ct_value *out) {
    ct_value operand;
    if (n->a)
        TRY(eval(r, n->a, &operand));
    else
        operand = *r->block_input;
    argv_ a;
    TRY(eval_args(r, n, &a));
    return ct_apply_filter(&r->c, n->off, (int)n->i, n->s, n->slen, &operand, a.v, a.n, a.kw, a.nkw,
                           out);
}

static int eval_test(rt *r, const ct_node *n, ct_value *out) {
    ct_value operand;
    TRY(eval(r, n->a, &operand));
    argv_ a;
    TRY(eval_args(r, n, &a));
    int res;
    TRY(ct_apply_test(&r->c, n->off, (int)n->i, n->s, n->slen, &operand, a.v, a.n, a.kw, a.nkw,
                      &res));
    *out = ct_bool(res);
    return ZI_OK;
}

static int eval_seq(rt *r, const ct_node *n, ct_value *out) {
    ct_list *l = ct_list_new(&r->c, n->l1.n);
    if (!l) return ct_oom(&r->c, n->off);
    for (size_t i = 0; i < n->l1.n; i++) TRY(eval(r, n->l1.v[i], &l->v[l->n++]));
    ct_value v = {0};
    v.t = n->kind == CT_N_LIST ? CT_V_LIST : CT_V_TUPLE;
    v.u.l = l;
    *out = v;
    return ZI_OK;
}

static int eval_dict(rt *r, const ct_node *n, ct_value *out) {
    /* Key lookups are linear, so a literal costs n^2 / 8 steps. */
    TRY(ct_charge(&r->c, n->off, n->l1.n * n->l1.n / 8));
    ct_dict *d = ct_dict_new(&r->c, n->l1.n);
    if (!d) return ct_oom(&r->c, n->off);
    for (size_t i = 0; i < n->l1.n; i++) {
        ct_value k, v;
        TRY(eval(r, n->l1.v[i], &k));
        TRY(eval(r, n->l2.v[i], &v));
        if (ct_unhashable(&k))
            return ct_fail(&r->c, n->l1.v[i]->off, ZI_EINVAL, "unhashable dict key");
        if (ct_dict_set(&r->c, d, k, v)) return ct_oom(&r->c, n->off);
    }
    ct_value v = {0};
    v.t = CT_V_DICT;
    v.u.d = d;
    *out = v;
    return ZI_OK;
}

static int eval_getitem(rt *r, const ct_node *n, ct_value *out) {
    ct_value obj;
    TRY(eval(r, n->a, &obj));
    if (n->b->kind == CT_N_SLICE) {
        const ct_node *s = n->b;
        ct_value v[3];
        const ct_value *p[3] = {NULL, NULL, NULL};
        const ct_node *parts[3] = {s->a, s->b, s->c};
        for (int i = 0; i < 3; i++)
            if (parts[i]) {
                TRY(eval(r, parts[i], &v[i]));
                p[i] = &v[i];
            }
        return ct_slice(&r->c, n->off, &obj, p[0], p[1], p[2], out);
    }
    ct_value key;
    TRY(eval(r, n->b, &key));
    return ct_getitem(&r->c, n->off, &obj, &key, out);
}

static int eval_compare(rt *r, const ct_node *n, ct_value *out) {
    ct_value left;
    TRY(eval(r, n->a, &left));
    for (size_t i = 0; i < n->l1.n; i++) {
        const ct_node *o = n->l1.v[i];
        ct_value right;
        int res;
        TRY(eval(r, o->a, &right));
        TRY(ct_compare(&r->c, o->off, o->op, &left, &right, &res));
        if (!res) {
            *out = ct_bool(0);
            return ZI_OK;
        }
        left = right;
    }
    *out = ct_bool(1);
    return ZI_OK;
}

static int eval_concat(rt *r, const ct_node *n, ct_value *out) {
    ct_value acc;
    for (size_t i = 0; i < n->l1.n; i++) {
        ct_value v, sv;
        TRY(eval(r, n->l1.v[i], &v));
        TRY(ct_str_of(&r->c, n->off, &v, &sv));
        if (i == 0)
            acc = sv;
        else
            TRY(ct_str_concat(&r->c, n->off, &acc, sv.u.s.p, sv.u.s.n, &acc));
    }
    *out = acc;
    return ZI_OK;
}

static int eval_node(rt *r, const ct_node *n, ct_value *out) {
    ct_value a, b;
    switch (n->kind) {
    case CT_N_STR:
        *out = ct_str_ref(n->s, n->slen);
        return ZI_OK;
    case CT_N_INT:
        *out = ct_int(n->i);
        return ZI_OK;
    case CT_N_FLOAT:
        *out = ct_float(n->f);
        return ZI_OK;
    case CT_N_BOOL:
        *out = ct_bool((int)n->i);
        return ZI_OK;
    case CT_N_NONE:
        *out = ct_none();
        return ZI_OK;
    case CT_N_NAME:
        return lookup(r, n, out);
    case CT_N_GETATTR:
        TRY(eval(r, n->a, &a));
        return ct_getattr(&r->c, n->off, &a, n->s, n->slen, out);
    case CT_N_GETITEM:
        return eval_getitem(r, n, out);
    case CT_N_CALL:
        return eval_call(r, n, out);
    case CT_N_FILTER:
        return eval_filter(r, n, out);
    case CT_N_TEST:
        return eval_test(r, n, out);
    case CT_N_LIST:
    case CT_N_TUPLE:
        return eval_seq(r, n, out);
    case CT_N_DICT:
        return eval_dict(r, n, out);
    case CT_N_COND:
        TRY(eval(r, n->a, &a));
        if (ct_truthy(&a)) return eval(r, n->b, out);
        if (n->c) return eval(r, n->c, out);
        *out = ct_undef();
        return ZI_OK;
    case CT_N_AND:
    case CT_N_OR:
        TRY(eval(r, n->a, &a));
        if (ct_truthy(&a) == (n->kind == CT_N_OR)) {
            *out = a;
            return ZI_OK;
        }
        return eval(r, n->b, out);
    case CT_N_NOT:
        TRY(eval(r, n->a, &a));
        *out = ct_bool(!ct_truthy(&a));
        return ZI_OK;
    case CT_N_NEG:
    case CT_N_POS:
        TRY(eval(r, n->a, &a));
        return ct_negate(&r->c, n->off, &a, n->kind == CT_N_NEG, out);
    case CT_N_BINOP:
        TRY(eval(r, n->a, &a));
        TRY(eval(r, n->b, &b));
        return ct_binop(&r->c, n->off, n->op, &a, &b, out);
    case CT_N_CONCAT:
        return eval_concat(r, n, out);
    case CT_N_COMPARE:
        return eval_compare(r, n, out);
    default:
        return ct_fail(&r->c, n->off, ZI_EFORMAT, "this expression cannot be evaluated here");
    }
}

static int eval(rt *r, const ct_node *n, ct_value *out) {
    TRY(ct_enter(&r->c, n->off));
    TRY(ct_charge(&r->c, n->off, 1));
    TRY(eval_node(r, n, out));
    ct_leave(&r->c);
    return ZI_OK;
}

/* ---- statements ------------------------------------------------------ */

static int count_iteration(rt *r, size_t off) {
    if (++r->c.iterations > r->c.max_iterations)
        return ct_fail(&r->c, off, ZI_ERANGE,
                       "the template exceeded its limit of %zu loop iterations",
                       r->c.max_iterations);
    return ZI_OK;
}

static int exec_for(rt *r, const ct_node *n) {
    ct_value seq;
    TRY(eval(r, n->b, &seq));
    const ct_value *items;
    size_t count;
    TRY(ct_iterate(&r->c, n->b->off, &seq, &items, &count));
    frame *saved = r->cur;
    frame *f = frame_new(r, saved);
    if (!f) return ct_oom(&r->c, n->off);
    if (n->c) {
        /* `for x in xs if cond`: filter first, so loop.length and
         * loop.index count the kept items only. */
        ct_value *kept = ct_alloc(&r->c.arena, (count ? count : 1) * sizeof *kept);
        if (!kept) return ct_oom(&r->c, n->off);
        size_t k = 0;
        r->cur = f;
        for (size_t i = 0; i < count; i++) {
            int rc = count_iteration(r, n->off);
            ct_value cond;
            f->n = 0;
            if (!rc) rc = assign(r, n->a, &items[i]);
            if (!rc) rc = eval(r, n->c, &cond);
            if (rc) {
                r->cur = saved;
                return rc;
            }
            if (ct_truthy(&cond)) kept[k++] = items[i];
        }
        r->cur = saved;
        items = kept;
        count = k;
    }
    if (count == 0) return exec_body(r, &n->l2);
    ct_loop *loop = ct_alloc(&r->c.arena, sizeof *loop);
    if (!loop) return ct_oom(&r->c, n->off);
    loop->items = items;
    loop->n = count;
    loop->depth = 1;
    ct_value lv = {0};
    lv.t = CT_V_LOOP;
    lv.u.loop = loop;
    r->cur = f;
    int rc = ZI_OK;
    for (size_t i = 0; i < count && !rc; i++) {
        loop->i = i;
        f->n = 0; /* a fresh scope per iteration */
        rc = count_iteration(r, n->off);
        if (!rc) rc = frame_set(r, n->off, f, "loop", 4, lv);
        if (!rc) rc = assign(r, n->a, &items[i]);
        if (!rc) rc = exec_body(r, &n->l1);
        if (r->flow == FLOW_BREAK) {
            r->flow = FLOW_NONE;
            break;
        }
        r->flow = FLOW_NONE;
    }
    r->cur = saved;
    return rc;
}

/* Renders body into a new string (for macros, set blocks, filter blocks). */
static int capture(rt *r, const ct_nodes *body, ct_value *out) {
    ct_buf b;
    ct_buf_init(&b, &r->c, r->max_output, 0);
    ct_buf *saved = r->out;
    r->out = &b;
    int rc = exec_body(r, body);
    r->out = saved;
    TRY(rc);
    return ct_buf_value(&b, out);
}

static int apply_block_filters(rt *r, const ct_node *chain, ct_value *v) {
    if (!chain) return ZI_OK;
    const ct_value *saved = r->block_input;
    ct_value in = *v;
    r->block_input = &in;
    int rc = eval(r, chain, v);
    r->block_input = saved;
    return rc;
}

static int exec(rt *r, const ct_node *n) {
    ct_value v;
    switch (n->kind) {
    case CT_N_DATA:
        return ct_buf_add(r->out, n->s, n->slen);
    case CT_N_OUTPUT:
        TRY(eval(r, n->a, &v));
        return ct_to_str(&r->c, n->off, &v, r->out);
    case CT_N_IF:
        TRY(eval(r, n->a, &v));
        return exec_body(r, ct_truthy(&v) ? &n->l1 : &n->l2);
    case CT_N_FOR:
        return exec_for(r, n);
    case CT_N_SET:
        TRY(eval(r, n->b, &v));
        return assign(r, n->a, &v);
    case CT_N_SETBLOCK:
        TRY(capture(r, &n->l1, &v));
        TRY(apply_block_filters(r, n->b, &v));
        return assign(r, n->a, &v);
    case CT_N_FILTERBLOCK:
        TRY(capture(r, &n->l1, &v));
        TRY(apply_block_filters(r, n->b, &v));
        return ct_to_str(&r->c, n->off, &v, r->out);
    case CT_N_MACRO:
        v = ct_undef();
        v.t = CT_V_MACRO;
        v.u.m = n;
        return frame_set(r, n->off, r->cur, n->s, n->slen, v);
    case CT_N_BREAK:
        r->flow = FLOW_BREAK;
        return ZI_OK;
    case CT_N_CONTINUE:
        r->flow = FLOW_CONTINUE;
        return ZI_OK;
    case CT_N_SCOPE: {
        frame *saved = r->cur, *f = frame_new(r, saved);
        if (!f) return ct_oom(&r->c, n->off);
        r->cur = f;
        int rc = exec_body(r, &n->l1);
        r->cur = saved;
        return rc;
    }
    default:
        return ct_fail(&r->c, n->off, ZI_EFORMAT, "unexpected statement");
    }
}

static int exec_body(rt *r, const ct_nodes *body) {
    for (size_t i = 0; i < body->n; i++) {
        const ct_node *n = body->v[i];
        TRY(ct_enter(&r->c, n->off));
        TRY(ct_charge(&r->c, n->off, 1));
        TRY(exec(r, n));
        ct_leave(&r->c);
        if (r->flow) break;
    }
    return ZI_OK;
}

/* ---- API ------------------------------------------------------------------ */

int zi_chat_template_compile(const char *src, size_t len, zi_chat_template **out, zi_error *err) {
    if (out) *out = NULL;
    if (!out || (!src && len)) return zi_error_set(err, ZI_EINVAL, "chat template: NULL argument");
    if (len > ZI_CHAT_TEMPLATE_MAX_SOURCE)
        return zi_error_set(err, ZI_ERANGE, "chat template: %zu bytes, more than the limit of %zu",
                            len, ZI_CHAT_TEMPLATE_MAX_SOURCE);
    size_t bad = zi_utf8_bad_at(src ? src : "", len);
    if (bad < len)
        return ct_error_at(err, ZI_EINVAL, src, len, bad, "chat template ",
                           "not valid UTF-8 (byte %zu)", bad);
    zi_chat_template *t = calloc(1, sizeof *t);
    if (!t) return zi_error_set(err, ZI_ENOMEM, "chat template: out of memory");
    ct_arena_init(&t->arena, 0);
    zi_error perr = {0};
    int rc = ct_parse(&t->arena, src ? src : "", len, ct_filter_id, ct_test_id, &t->body, &t->src,
                      &t->src_len, &perr);
    if (rc) {
        zi_chat_template_free(t);
        return zi_error_set(err, rc, "chat template %s", perr.msg);
    }
    *out = t;
    return ZI_OK;
}

void zi_chat_template_free(zi_chat_template *t) {
    if (!t) return;
    ct_arena_free(&t->arena);
    free(t);
}

static int text_arg(rt *r, const char *what, size_t idx, const char *s, size_t len, ct_value *out) {
    if (!s) return zi_error_set(r->c.err, ZI_EINVAL, "chat message %zu: %s is NULL", idx, what);
    if (!len) len = strlen(s);
    size_t bad = zi_utf8_bad_at(s, len);
    if (bad < len)
        return zi_error_set(r->c.err, ZI_EINVAL,
                            "chat message %zu: %s is not valid UTF-8 at byte %zu", idx, what, bad);
    *out = ct_str_ref(s, len);
    return ZI_OK;
}

static int setup_message_list(rt *r, const zi_chat_message *msgs, size_t n) {
    ct_ctx *c = &r->c;
    ct_list *l = ct_list_new(c, n);
    if (!l) return ct_oom(c, 0);
    for (size_t i = 0; i < n; i++) {
        ct_value role, content = ct_none();
        TRY(text_arg(r, "role", i, msgs[i].role, msgs[i].role_len, &role));
        if (msgs[i].content)
            TRY(text_arg(r, "content", i, msgs[i].content, msgs[i].content_len, &content));
        ct_dict *d = ct_dict_new(c, 2);
        if (!d) return ct_oom(c, 0);
        d->k[0] = ct_str_ref("role", 4);
        d->v[0] = role;
        d->k[1] = ct_str_ref("content", 7);
        d->v[1] = content;
        d->n = 2;
        ct_value dv = {0};
        dv.t = CT_V_DICT;
        dv.u.d = d;
        l->v[l->n++] = dv;
    }
    ct_value lv = {0};
    lv.t = CT_V_LIST;
    lv.u.l = l;
    return frame_set(r, 0, r->root, "messages", 8, lv);
}

static int convert_value(rt *r, const zi_chat_value *v, ct_value *out);
static int check_value(const zi_chat_value *v, zi_keypath *p, int depth, zi_error *err);

/* opts.messages: checked like an extra variable, and each item must be a
 * dict with a string role, as a message list from the client is. */
static int setup_message_values(rt *r, const zi_chat_value *m) {
    ct_ctx *c = &r->c;
    zi_keypath p = {{0}, 0};
    zi_keypath_push(&p, "%s", "messages");
    int rc = check_value(m, &p, 1, c->err);
    if (rc) {
        zi_error_prefix(c->err, "chat template");
        return rc;
    }
    if (m->kind != ZI_CHAT_LIST)
        return zi_error_set(c->err, ZI_EINVAL, "chat template: messages: not a list");
    for (size_t i = 0; i < m->u.list.n; i++) {
        const zi_chat_value *it = &m->u.list.v[i];
        int has_role = 0;
        if (it->kind == ZI_CHAT_DICT)
            for (size_t j = 0; j < it->u.dict.n; j++)
                if (it->u.dict.v[j].key_len == 4 && !memcmp(it->u.dict.v[j].key, "role", 4))
                    has_role = it->u.dict.v[j].value.kind == ZI_CHAT_STR;
        if (!has_role)
            return zi_error_set(c->err, ZI_EINVAL,
                                "chat template: messages[%zu]: not a dict with a string role", i);
    }
    ct_value lv;
    TRY(convert_value(r, m, &lv));
    return frame_set(r, 0, r->root, "messages", 8, lv);
}

static int setup_globals(rt *r, const zi_chat_message *msgs, size_t n,
                         const zi_chat_render_opts *o) {
    ct_ctx *c = &r->c;
    if (o && o->messages) {
        if (n)
            return zi_error_set(c->err, ZI_EINVAL,
                                "chat template render: both msgs and opts.messages given");
        TRY(setup_message_values(r, o->messages));
    } else
        TRY(setup_message_list(r, msgs, n));
    TRY(frame_set(r, 0, r->root, "add_generation_prompt", 21,
                  ct_bool(o && o->add_generation_prompt)));
    const char *tok[2] = {o ? o->bos_token : NULL, o ? o->eos_token : NULL};
    const char *names[2] = {"bos_token", "eos_token"};
    for (int k = 0; k < 2; k++) {
        if (!tok[k]) continue;
        size_t len = strlen(tok[k]);
        if (zi_utf8_bad_at(tok[k], len) < len)
            return zi_error_set(c->err, ZI_EINVAL, "chat template: %s is not valid UTF-8",
                                names[k]);
        TRY(frame_set(r, 0, r->root, names[k], 9, ct_str_ref(tok[k], len)));
    }
    return ZI_OK;
}

/* ---- extra variables ------------------------------------------------------ */

/* The variables the renderer sets itself, besides the global functions
 * (ct_is_global). */
static const char *const reserved_names[] = {"messages", "add_generation_prompt", "bos_token",
                                             "eos_token"};

int zi_chat_var_reserved(const char *name, size_t len) {
    if (!name) return 0;
    for (size_t i = 0; i < sizeof reserved_names / sizeof reserved_names[0]; i++)
        if (strlen(reserved_names[i]) == len && memcmp(reserved_names[i], name, len) == 0) return 1;
    return ct_is_global(name, len);
}

static int check_value(const zi_chat_value *v, zi_keypath *p, int depth, zi_error *err) {
    if (depth > ZI_CHAT_VALUE_MAX_DEPTH)
        return zi_error_set(err, ZI_EINVAL, "%s: nested deeper than %d levels", p->s,
                            ZI_CHAT_VALUE_MAX_DEPTH);
    switch (v->kind) {
    case ZI_CHAT_NONE:
    case ZI_CHAT_BOOL:
    case ZI_CHAT_INT:
    case ZI_CHAT_FLOAT:
        return ZI_OK;
    case ZI_CHAT_STR: {
        if (!v->u.s.p && v->u.s.len) return zi_error_set(err, ZI_EINVAL, "%s: NULL string", p->s);
        size_t bad = zi_utf8_bad_at(v->u.s.p ? v->u.s.p : "", v->u.s.len);
        if (bad < v->u.s.len)
            return zi_error_set(err, ZI_EINVAL, "%s: not valid UTF-8 at byte %zu", p->s, bad);
        return ZI_OK;
    }
    case ZI_CHAT_LIST:
        if (!v->u.list.v && v->u.list.n)
            return zi_error_set(err, ZI_EINVAL, "%s: NULL list items", p->s);
        for (size_t i = 0; i < v->u.list.n; i++) {
            size_t old = zi_keypath_push(p, "[%zu]", i);
            int rc = check_value(&v->u.list.v[i], p, depth + 1, err);
            zi_keypath_pop(p, old);
            if (rc) return rc;
        }
        return ZI_OK;
    case ZI_CHAT_DICT:
        if (!v->u.dict.v && v->u.dict.n)
            return zi_error_set(err, ZI_EINVAL, "%s: NULL dict pairs", p->s);
        for (size_t i = 0; i < v->u.dict.n; i++) {
            const zi_chat_pair *kv = &v->u.dict.v[i];
            if (!kv->key && kv->key_len)
                return zi_error_set(err, ZI_EINVAL, "%s: key #%zu is NULL", p->s, i);
            size_t bad = zi_utf8_bad_at(kv->key ? kv->key : "", kv->key_len);
            if (bad < kv->key_len)
                return zi_error_set(err, ZI_EINVAL, "%s: key #%zu is not valid UTF-8 at byte %zu",
                                    p->s, i, bad);
            size_t old = zi_keypath_push_key(p, ".", kv->key ? kv->key : "", kv->key_len);
            int rc = check_value(&kv->value, p, depth + 1, err);
            zi_keypath_pop(p, old);
            if (rc) return rc;
        }
        return ZI_OK;
    default:
        return zi_error_set(err, ZI_EINVAL, "%s: unknown value kind %d", p->s, v->kind);
    }
}

int zi_chat_value_check(const zi_chat_value *v, const char *path, zi_error *err) {
    zi_keypath p = {{0}, 0};
    zi_keypath_push(&p, "%s", path ? path : "value");
    if (!v) return zi_error_set(err, ZI_EINVAL, "%s: NULL value", p.s);
    return check_value(v, &p, 1, err);
}

/* The template's value for a checked tree (depth is bounded by the check;
 * strings are referred to). */
static int convert_value(rt *r, const zi_chat_value *v, ct_value *out) {
    ct_ctx *c = &r->c;
    ct_value res = {0};
    switch (v->kind) {
    case ZI_CHAT_NONE:
        res = ct_none();
        break;
    case ZI_CHAT_BOOL:
        res = ct_bool(v->u.b);
        break;
    case ZI_CHAT_INT:
        res = ct_int(v->u.i);
        break;
    case ZI_CHAT_FLOAT:
        res = ct_float(v->u.f);
        break;
    case ZI_CHAT_STR:
        res = ct_str_ref(v->u.s.p ? v->u.s.p : "", v->u.s.len);
        break;
    case ZI_CHAT_LIST: {
        size_t n = v->u.list.n;
        if (n > SIZE_MAX / 4 / sizeof(ct_value)) return ct_oom(c, 0);
        TRY(ct_charge(c, 0, n));
        ct_list *l = ct_list_new(c, n);
        if (!l) return ct_oom(c, 0);
        for (size_t i = 0; i < n; i++) {
            TRY(convert_value(r, &v->u.list.v[i], &l->v[i]));
            l->n = i + 1;
        }
        res.t = CT_V_LIST;
        res.uk = CT_SEQ_LIST;
        res.u.l = l;
        break;
    }
    case ZI_CHAT_DICT: {
        size_t n = v->u.dict.n;
        if (n > SIZE_MAX / 4 / sizeof(ct_value)) return ct_oom(c, 0);
        /* ct_dict_set looks keys up linearly (so that a key given twice
         * behaves as in Python): n^2 / 8 steps, as a dict literal. */
        TRY(ct_charge(c, 0, n > (size_t)1 << 24 ? SIZE_MAX / 4 : n + n * n / 8));
        ct_dict *d = ct_dict_new(c, n);
        if (!d) return ct_oom(c, 0);
        for (size_t i = 0; i < n; i++) {
            const zi_chat_pair *kv = &v->u.dict.v[i];
            ct_value val;
            TRY(convert_value(r, &kv->value, &val));
            if (ct_dict_set(c, d, ct_str_ref(kv->key ? kv->key : "", kv->key_len), val))
                return ct_oom(c, 0);
        }
        res.t = CT_V_DICT;
        res.u.d = d;
        break;
    }
    default: /* refused by the check */
        return zi_error_set(c->err, ZI_EINVAL, "chat template: unknown value kind %d", v->kind);
    }
    *out = res;
    return ZI_OK;
}

static int setup_vars(rt *r, const zi_chat_render_opts *o) {
    ct_ctx *c = &r->c;
    if (!o || !o->n_vars) return ZI_OK;
    if (!o->vars) return zi_error_set(c->err, ZI_EINVAL, "chat template render: NULL vars");
    for (size_t i = 0; i < o->n_vars; i++) {
        const zi_chat_var *v = &o->vars[i];
        if (!v->name && v->name_len)
            return zi_error_set(c->err, ZI_EINVAL, "chat template: variable #%zu: NULL name", i);
        const char *name = v->name ? v->name : "";
        size_t bad = zi_utf8_bad_at(name, v->name_len);
        if (bad < v->name_len)
            return zi_error_set(c->err, ZI_EINVAL,
                                "chat template: variable #%zu: name not valid UTF-8 at byte %zu", i,
                                bad);
        zi_keypath p = {{0}, 0};
        zi_keypath_push_key(&p, "", name, v->name_len);
        if (zi_chat_var_reserved(name, v->name_len))
            return zi_error_set(c->err, ZI_EINVAL,
                                "chat template: %s: a name the renderer sets itself", p.s);
        for (size_t j = 0; j < i; j++)
            if (o->vars[j].name_len == v->name_len &&
                (v->name_len == 0 || memcmp(o->vars[j].name, name, v->name_len) == 0))
                return zi_error_set(c->err, ZI_EINVAL, "chat template: %s: given twice", p.s);
        int rc = check_value(&v->value, &p, 1, c->err);
        if (rc) {
            zi_error_prefix(c->err, "chat template");
            return rc;
        }
        ct_value val;
        TRY(convert_value(r, &v->value, &val));
        TRY(frame_set(r, 0, r->root, name, v->name_len, val));
    }
    return ZI_OK;
}

int zi_chat_template_render(const zi_chat_template *t, const zi_chat_message *msgs, size_t n,
                            const zi_chat_render_opts *opts, char **out, size_t *out_len,
                            zi_error *err) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !out || (n && !msgs))
        return zi_error_set(err, ZI_EINVAL, "chat template render: NULL argument");
    zi_chat_render_opts o = {0};
    if (opts) o = *opts;
    rt r;
    memset(&r, 0, sizeof r);
    ct_arena_init(&r.c.arena, o.max_memory ? o.max_memory : ZI_CHAT_TEMPLATE_DEFAULT_MAX_MEMORY);
    r.c.err = err;
    r.c.src = t->src;
    r.c.src_len = t->src_len;
    r.c.now = o.now;
    r.c.max_steps = o.max_steps ? o.max_steps : ZI_CHAT_TEMPLATE_DEFAULT_MAX_STEPS;
    r.c.max_iterations =
        o.max_iterations ? o.max_iterations : ZI_CHAT_TEMPLATE_DEFAULT_MAX_ITERATIONS;
    r.t = t;
    r.max_output = o.max_output ? o.max_output : ZI_CHAT_TEMPLATE_DEFAULT_MAX_OUTPUT;
    ct_buf result;
    ct_buf_init(&result, &r.c, r.max_output, 1);
    r.out = &result;
    int rc = ZI_OK;
    r.root = frame_new(&r, NULL);
    if (!r.root) rc = zi_error_set(err, ZI_ENOMEM, "chat template: out of memory");
    r.cur = r.root;
    if (!rc) rc = setup_globals(&r, msgs, n, opts);
    if (!rc) rc = setup_vars(&r, opts);
    if (!rc) rc = exec_body(&r, &t->body);
    if (!rc && !result.p) {
        result.p = malloc(1);
        if (!result.p)
            rc = zi_error_set(err, ZI_ENOMEM, "chat template: out of memory");
        else
            result.p[0] = '\0';
    }
    ct_ctx_release(&r.c);
    ct_arena_free(&r.c.arena);
    if (rc) {
        free(result.p);
        return rc;
    }
    *out = result.p;
    if (out_len) *out_len = result.n;
    return ZI_OK;
}
