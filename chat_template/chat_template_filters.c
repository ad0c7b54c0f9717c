/*
 * chat_template_filters.c - the builtin filters of the chat-template engine
 * (see chat_template_value.h): the name table ct_filter_id resolves, one
 * small function per filter, and ct_apply_filter, which checks a filter's
 * arguments against its parameter list and dispatches through the table.
 *
 * Filters that are generators in jinja2 (map, select, items, ...) return
 * one-shot sequences that behave like generators, and an error jinja2
 * would raise lazily is kept until the sequence is iterated.
 */
#include "chat_template_value.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_value_impl.h"

/* ---- filters ------------------------------------------------------------ */

enum {
    F_ABS,
    F_CAPITALIZE,
    F_DEFAULT,
    F_DICTSORT,
    F_ESCAPE,
    F_FIRST,
    F_FLOAT,
    F_INDENT,
    F_INT,
    F_ITEMS,
    F_JOIN,
    F_LAST,
    F_LENGTH,
    F_LIST,
    F_LOWER,
    F_MAP,
    F_MAX,
    F_MIN,
    F_REJECT,
    F_REJECTATTR,
    F_REPLACE,
    F_REVERSE,
    F_SAFE,
    F_SELECT,
    F_SELECTATTR,
    F_SORT,
    F_STRING,
    F_SUM,
    F_TITLE,
    F_TOJSON,
    F_TRIM,
    F_UNIQUE,
    F_UPPER,
    F_COUNT /* the number of filters */
};

static const ct_named filters[] = {
    {"abs", F_ABS},
    {"capitalize", F_CAPITALIZE},
    {"count", F_LENGTH},
    {"d", F_DEFAULT},
    {"default", F_DEFAULT},
    {"dictsort", F_DICTSORT},
    {"e", F_ESCAPE},
    {"escape", F_ESCAPE},
    {"first", F_FIRST},
    {"float", F_FLOAT},
    {"indent", F_INDENT},
    {"int", F_INT},
    {"items", F_ITEMS},
    {"join", F_JOIN},
    {"last", F_LAST},
    {"length", F_LENGTH},
    {"list", F_LIST},
    {"lower", F_LOWER},
    {"map", F_MAP},
    {"max", F_MAX},
    {"min", F_MIN},
    {"reject", F_REJECT},
    {"rejectattr", F_REJECTATTR},
    {"replace", F_REPLACE},
    {"reverse", F_REVERSE},
    {"safe", F_SAFE},
    {"select", F_SELECT},
    {"selectattr", F_SELECTATTR},
    {"sort", F_SORT},
    {"string", F_STRING},
    {"sum", F_SUM},
    {"title", F_TITLE},
    {"tojson", F_TOJSON},
    {"trim", F_TRIM},
    {"unique", F_UNIQUE},
    {"upper", F_UPPER},
};

int ct_filter_id(const char *name, size_t n) {
    return CT_NAMED_ID(filters, name, n);
}

/* item[attr] along a dotted path ("a.b", "0"), as jinja2's attrgetter. */
static int attr_path(ct_ctx *c, size_t off, const ct_value *item, const ct_value *path,
                     ct_value *out) {
    ct_value cur = *item;
    if (path->t != CT_V_STR) return ct_getitem(c, off, &cur, path, out);
    const char *p = path->u.s.p;
    size_t n = path->u.s.n, i = 0;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != '.') j++;
        ct_value key = ct_str_ref(p + i, j - i), next;
        int digits = j > i;
        for (size_t k = i; k < j; k++) digits &= p[k] >= '0' && p[k] <= '9';
        if (digits && j - i < 18) {
            int64_t v = 0;
            for (size_t k = i; k < j; k++) v = v * 10 + (p[k] - '0');
            key = ct_int(v);
        }
        TRY(ct_getitem(c, off, &cur, &key, &next));
        cur = next;
        if (j >= n) break;
        i = j + 1;
    }
    *out = cur;
    return ZI_OK;
}

/* What map or select does to each item of a sequence: follow the
 * attribute path `attr` (map: falling back to `dflt` when undefined), then
 * map applies filter `id` when there is no attribute path, and select keeps
 * the items whose test `id` (-2: truthiness) gives `keep`. */
typedef struct item_op {
    int is_map;
    const ct_value *attr, *dflt;
    int id;
    const char *name; /* the filter's or test's name as written */
    size_t nlen;
    const ct_value *args; /* its arguments */
    size_t nargs;
    int keep;
} item_op;

/* Takes the string naming the filter or test (a type error naming `what`
 * otherwise) off the front of op's arguments; *id is its builtin id. */
static int shift_name(ct_ctx *c, size_t off, const char *what, item_op *op,
                      int (*lookup)(const char *, size_t)) {
    TRY(ct_need_str(c, off, what, &op->args[0]));
    op->name = op->args[0].u.s.p;
    op->nlen = op->args[0].u.s.n;
    op->id = lookup(op->name, op->nlen);
    op->args++;
    op->nargs--;
    return ZI_OK;
}

/* The list map or select makes of seq. */
static int map_or_select(ct_ctx *c, size_t off, const ct_value *seq, const item_op *op,
                         ct_value *out) {
    const ct_value *items;
    size_t n;
    ct_list *l;
    TRY(ct_iterate_new_list(c, off, seq, &items, &n, &l));
    for (size_t i = 0; i < n; i++) {
        TRY(ct_charge(c, off, 1));
        ct_value x = items[i];
        if (op->attr) {
            TRY(attr_path(c, off, &items[i], op->attr, &x));
            if (x.t == CT_V_UNDEF && op->dflt) x = *op->dflt;
        }
        if (op->is_map) {
            if (!op->attr)
                TRY(ct_apply_filter(c, off, op->id, op->name, op->nlen, &items[i], op->args,
                                    op->nargs, NULL, 0, &x));
            l->v[l->n++] = x;
            continue;
        }
        int r;
        if (op->id == -2)
            r = ct_truthy(&x);
        else
            TRY(ct_apply_test(c, off, op->id, op->name, op->nlen, &x, op->args, op->nargs, NULL, 0,
                              &r));
        if (r == op->keep) l->v[l->n++] = items[i];
    }
    *out = ct_seq_value(CT_V_LIST, l);
    return ZI_OK;
}

/* select / reject / selectattr / rejectattr. */
static int select_filter(ct_ctx *c, size_t off, const ct_value *seq, const ct_value *args,
                         size_t nargs, const ct_kwarg *kw, size_t nkw, int by_attr, int keep,
                         ct_value *out) {
    (void)kw;
    if (nkw) return ct_fail(c, off, ZI_EUNSUPPORTED, "keyword arguments to select/reject");
    item_op op = {.id = -2, .name = "", .args = args, .nargs = nargs, .keep = keep};
    if (by_attr) {
        if (op.nargs < 1) return ct_fail(c, off, ZI_EINVAL, "missing parameter for attribute name");
        op.attr = &op.args[0];
        op.args++;
        op.nargs--;
    }
    if (op.nargs) TRY(shift_name(c, off, "test name", &op, ct_test_id));
    return map_or_select(c, off, seq, &op, out);
}

static int map_filter(ct_ctx *c, size_t off, const ct_value *seq, const ct_value *args,
                      size_t nargs, const ct_kwarg *kw, size_t nkw, ct_value *out) {
    item_op op = {.is_map = 1, .id = -1, .args = args, .nargs = nargs};
    for (size_t k = 0; k < nkw; k++) {
        if (ct_name_eq(kw[k].name, kw[k].len, "attribute"))
            op.attr = &kw[k].v;
        else if (ct_name_eq(kw[k].name, kw[k].len, "default"))
            op.dflt = &kw[k].v;
        else
            return ct_fail(c, off, ZI_EINVAL, "map: unexpected keyword argument '%.*s'",
                           (int)kw[k].len, kw[k].name);
    }
    if (!op.attr) {
        if (op.nargs < 1) return ct_fail(c, off, ZI_EINVAL, "map requires a filter argument");
        TRY(shift_name(c, off, "filter name", &op, ct_filter_id));
    }
    return map_or_select(c, off, seq, &op, out);
}

static int is_digit_c(char ch) {
    return ch >= '0' && ch <= '9';
}

/* Python float() of a string: optional whitespace, sign, digits with
 * single underscores between them, fraction, exponent, inf/nan. */
static int parse_float(const ct_value *s, double *out) {
    ct_value t = ct_strip(s, NULL, 1, 1);
    char buf[128];
    size_t k = 0;
    const char *p = t.u.s.p;
    size_t n = t.u.s.n;
    if (n == 0 || n >= sizeof buf) return -1;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '_') {
            if (i == 0 || i + 1 >= n || !is_digit_c(p[i - 1]) || !is_digit_c(p[i + 1])) return -1;
            continue;
        }
        if (!(is_digit_c(ch) || ch == '.' || ch == 'e' || ch == 'E' || ch == '+' || ch == '-' ||
              (ch | 32) == 'i' || (ch | 32) == 'n' || (ch | 32) == 'f' || (ch | 32) == 't' ||
              (ch | 32) == 'y' || (ch | 32) == 'a'))
            return -1;
        buf[k++] = ch;
    }
    buf[k] = '\0';
    /* strtod accepts hex floats and "infinity"/"nan(...)" forms that
     * Python rejects; keep the forms Python shares with it. */
    for (size_t i = 0; i < k; i++)
        if (buf[i] == 'x' || buf[i] == 'X' || buf[i] == '(') return -1;
    char *end;
    double v = strtod(buf, &end);
    if (*end) return -1;
    *out = v;
    return 0;
}

static int int_filter(ct_ctx *c, size_t off, const ct_value *v, const ct_value *dflt,
                      const ct_value *base, ct_value *out) {
    ct_value d = dflt ? *dflt : ct_int(0);
    int b = 10;
    if (base) {
        TRY(ct_need_int(c, off, "int base", base));
        b = (int)base->u.i;
        if (b != 0 && (b < 2 || b > 36))
            return ct_fail(c, off, ZI_EINVAL, "int() base must be >= 2 and <= 36, or 0");
    }
    if (ct_is_intlike(v)) {
        *out = ct_int(v->u.i);
        return ZI_OK;
    }
    if (v->t == CT_V_FLOAT) {
        if (!(v->u.f > -9223372036854775808.0 && v->u.f < 9223372036854775808.0))
            *out = d;
        else
            *out = ct_int((int64_t)v->u.f);
        return ZI_OK;
    }
    if (v->t == CT_V_STR) {
        ct_value t = ct_strip(v, NULL, 1, 1);
        char buf[80];
        size_t k = 0;
        int ok = t.u.s.n > 0 && t.u.s.n < sizeof buf;
        for (size_t i = 0; ok && i < t.u.s.n; i++) {
            char ch = t.u.s.p[i];
            if (ch == '_') {
                ok = i > 0 && i + 1 < t.u.s.n && t.u.s.p[i - 1] != '_' && t.u.s.p[i + 1] != '_';
                continue;
            }
            buf[k++] = ch;
        }
        if (ok) {
            buf[k] = '\0';
            char *end;
            errno = 0;
            long long r = strtoll(buf, &end, b);
            if (!*end && errno == 0 && end != buf &&
                (buf[0] != '0' || b != 10 || k == 1 || strspn(buf, "0") == k)) {
                *out = ct_int(r);
                return ZI_OK;
            }
        }
        double f;
        if (parse_float(v, &f) == 0 && f > -9223372036854775808.0 && f < 9223372036854775808.0) {
            *out = ct_int((int64_t)f);
            return ZI_OK;
        }
    }
    *out = d;
    return ZI_OK;
}

int ct_html_escape(ct_ctx *c, size_t off, const ct_value *v, ct_value *out) {
    if (v->t == CT_V_STR && v->ut == CT_STR_MARKUP) {
        *out = *v;
        return ZI_OK;
    }
    ct_value s;
    TRY(ct_str_of(c, off, v, &s));
    ct_buf b;
    ct_buf_init(&b, c, 0, 0);
    for (size_t i = 0; i < s.u.s.n; i++) {
        char ch = s.u.s.p[i];
        switch (ch) {
        case '&':
            TRY(ct_buf_addz(&b, "&amp;"));
            break;
        case '<':
            TRY(ct_buf_addz(&b, "&lt;"));
            break;
        case '>':
            TRY(ct_buf_addz(&b, "&gt;"));
            break;
        case '"':
            TRY(ct_buf_addz(&b, "&#34;"));
            break;
        case '\'':
            TRY(ct_buf_addz(&b, "&#39;"));
            break;
        default:
            TRY(ct_buf_addc(&b, ch));
        }
    }
    TRY(ct_buf_value(&b, out));
    out->ut = CT_STR_MARKUP;
    return ZI_OK;
}

/* Python's str.splitlines boundaries. */
static size_t line_break_len(const char *p, size_t n, size_t i) {
    unsigned char ch = (unsigned char)p[i];
    if (ch == '\r') return (i + 1 < n && p[i + 1] == '\n') ? 2 : 1;
    if (ch == '\n' || ch == '\v' || ch == '\f' || (ch >= 0x1C && ch <= 0x1E)) return 1;
    if (ch >= 0x80) {
        size_t k;
        uint32_t cp = ct_u8_get(p + i, n - i, &k);
        if (cp == 0x85 || cp == 0x2028 || cp == 0x2029) return k;
    }
    return 0;
}

static int indent_filter(ct_ctx *c, size_t off, const ct_value *v, const ct_value *width,
                         const ct_value *first, const ct_value *blank, ct_value *out) {
    ct_value s;
    TRY(ct_str_of(c, off, v, &s));
    ct_buf ind;
    ct_buf_init(&ind, c, 0, 0);
    if (width && width->t == CT_V_STR)
        TRY(ct_buf_add(&ind, width->u.s.p, width->u.s.n));
    else {
        int64_t w = 4;
        if (width) {
            TRY(ct_need_int(c, off, "indent width", width));
            w = width->u.i;
        }
        if (w > 4096) return ct_fail(c, off, ZI_ERANGE, "indent width too large");
        for (int64_t i = 0; i < w; i++) TRY(ct_buf_addc(&ind, ' '));
    }
    int do_first = first && ct_truthy(first), do_blank = blank && ct_truthy(blank);
    /* Lines as splitlines() gives them, after appending "\n" as jinja2 does. */
    ct_buf src;
    ct_buf_init(&src, c, 0, 0);
    TRY(ct_buf_add(&src, s.u.s.p, s.u.s.n));
    TRY(ct_buf_addc(&src, '\n'));
    const char *p = src.p;
    size_t n = src.n;
    ct_buf b;
    ct_buf_init(&b, c, 0, 0);
    if (do_first) TRY(ct_buf_add(&b, ind.p, ind.n));
    size_t i = 0, line = 0;
    while (i < n) {
        size_t j = i, br = 0;
        while (j < n && !(br = line_break_len(p, n, j))) j++;
        if (line > 0) {
            TRY(ct_buf_addc(&b, '\n'));
            if (j > i || do_blank) TRY(ct_buf_add(&b, ind.p, ind.n));
        }
        TRY(ct_buf_add(&b, p + i, j - i));
        line++;
        i = j + br;
    }
    return ct_buf_value(&b, out);
}

/* Stable merge sort of items by (case-folded) key. */
typedef struct sort_ctx {
    ct_ctx *c;
    size_t off;
    int case_sensitive;
} sort_ctx;

static int sort_key_less(sort_ctx *s, const ct_value *a, const ct_value *b, int *lt) {
    if (!s->case_sensitive && a->t == CT_V_STR && b->t == CT_V_STR) {
        ct_value la, lb;
        TRY(ct_change_case(s->c, a, CT_CASE_LOWER, &la));
        TRY(ct_change_case(s->c, b, CT_CASE_LOWER, &lb));
        return ct_less(s->c, s->off, &la, &lb, "<", lt);
    }
    return ct_less(s->c, s->off, a, b, "<", lt);
}

static int merge_sort(sort_ctx *s, ct_value *v, ct_value *keys, ct_value *tmpv, ct_value *tmpk,
                      size_t n, int reverse) {
    if (n < 2) return ZI_OK;
    size_t h = n / 2;
    TRY(merge_sort(s, v, keys, tmpv, tmpk, h, reverse));
    TRY(merge_sort(s, v + h, keys + h, tmpv, tmpk, n - h, reverse));
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int take_right;
        TRY(ct_charge(s->c, s->off, 1));
        /* Python's reverse sort keeps equal items in order, so "right goes
         * first" only when strictly ordered the other way. */
        TRY(sort_key_less(s, reverse ? &keys[i] : &keys[j], reverse ? &keys[j] : &keys[i],
                          &take_right));
        if (take_right)
            tmpv[k] = v[j], tmpk[k++] = keys[j++];
        else
            tmpv[k] = v[i], tmpk[k++] = keys[i++];
    }
    while (i < h) tmpv[k] = v[i], tmpk[k++] = keys[i++];
    while (j < n) tmpv[k] = v[j], tmpk[k++] = keys[j++];
    memcpy(v, tmpv, n * sizeof *v);
    memcpy(keys, tmpk, n * sizeof *keys);
    return ZI_OK;
}

static int sort_filter(ct_ctx *c, size_t off, const ct_value *seq, const ct_value *rev,
                       const ct_value *cs, const ct_value *attr, ct_value *out) {
    const ct_value *items;
    size_t n;
    TRY(ct_iterate(c, off, seq, &items, &n));
    ct_value *v = ct_alloc(&c->arena, (n ? n : 1) * 4 * sizeof *v);
    if (!v) return ct_oom(c, off);
    ct_value *keys = v + n, *tv = v + 2 * n, *tk = v + 3 * n;
    for (size_t i = 0; i < n; i++) {
        v[i] = items[i];
        keys[i] = items[i];
        if (attr && attr->t != CT_V_NONE) TRY(attr_path(c, off, &items[i], attr, &keys[i]));
    }
    sort_ctx s = {c, off, cs && ct_truthy(cs)};
    TRY(ct_enter(c, off));
    TRY(merge_sort(&s, v, keys, tv, tk, n, rev && ct_truthy(rev)));
    ct_leave(c);
    ct_list *l = ct_list_new(c, 0);
    if (!l) return ct_oom(c, off);
    l->v = v;
    l->n = l->cap = n;
    *out = ct_seq_value(CT_V_LIST, l);
    return ZI_OK;
}

static int tojson_filter(ct_ctx *c, size_t off, const ct_value *v, const ct_value **a,
                         ct_value *out) {
    /* Hugging Face's: tojson(x, ensure_ascii=False, indent=None,
     * separators=None, sort_keys=False) = json.dumps(...). */
    ct_json_opts o = {0};
    o.ensure_ascii = a[0] && ct_truthy(a[0]);
    o.sort_keys = a[3] && ct_truthy(a[3]);
    ct_buf ind;
    ct_buf_init(&ind, c, 0, 0);
    if (a[1] && a[1]->t != CT_V_NONE) {
        o.pretty = 1;
        if (a[1]->t == CT_V_STR)
            TRY(ct_buf_add(&ind, a[1]->u.s.p, a[1]->u.s.n));
        else {
            TRY(ct_need_int(c, off, "tojson indent", a[1]));
            if (a[1]->u.i > 4096) return ct_fail(c, off, ZI_ERANGE, "tojson indent too large");
            for (int64_t i = 0; i < a[1]->u.i; i++) TRY(ct_buf_addc(&ind, ' '));
        }
    }
    o.indent = ind.p ? ind.p : "";
    o.indent_len = ind.n;
    o.item_sep = o.pretty ? "," : ", ";
    o.item_sep_len = strlen(o.item_sep);
    o.key_sep = ": ";
    o.key_sep_len = 2;
    if (a[2] && a[2]->t != CT_V_NONE) {
        if ((a[2]->t != CT_V_TUPLE && a[2]->t != CT_V_LIST) || a[2]->u.l->n != 2 ||
            a[2]->u.l->v[0].t != CT_V_STR || a[2]->u.l->v[1].t != CT_V_STR)
            return ct_fail(c, off, ZI_EINVAL, "tojson separators must be two strings");
        o.item_sep = a[2]->u.l->v[0].u.s.p;
        o.item_sep_len = a[2]->u.l->v[0].u.s.n;
        o.key_sep = a[2]->u.l->v[1].u.s.p;
        o.key_sep_len = a[2]->u.l->v[1].u.s.n;
    }
    ct_buf b;
    ct_buf_init(&b, c, 0, 0);
    TRY(ct_json_dump(c, off, v, &b, &o, 0));
    return ct_buf_value(&b, out);
}

static int empty_generator(ct_ctx *c, size_t off, ct_value *out) {
    ct_list *l = ct_list_new(c, 0);
    if (!l) return ct_oom(c, off);
    *out = ct_gen_value(l, CT_SEQ_GEN);
    return ZI_OK;
}

/* Turns the result of a filter that is a generator in jinja2 into one: a
 * failure becomes a generator that raises it when iterated, as jinja2's
 * lazy evaluation would (limits are never deferred). */
static int as_generator(ct_ctx *c, int rc, ct_value *out) {
    if (rc == ZI_ERANGE || rc == ZI_ENOMEM) return rc;
    if (rc) {
        ct_list *l = ct_list_new(c, 0);
        char *msg = l ? ct_alloc(&c->arena, strlen(c->err->msg) + 1) : NULL;
        if (!msg) return ct_oom(c, 0);
        strcpy(msg, c->err->msg);
        l->err_code = rc;
        l->err_msg = msg;
        zi_error_clear(c->err);
        *out = ct_gen_value(l, CT_SEQ_GEN);
        return ZI_OK;
    }
    out->t = CT_V_LIST;
    out->uk = CT_SEQ_GEN;
    return ZI_OK;
}

/* ---- one function per filter ------------------------------------------- */

/* One application of a filter: the operand, the arguments as given, and
 * (for a filter with a parameter list) those arguments bound to it, a[i]
 * NULL for a parameter that was not given. */
typedef struct filter_call {
    int id;
    const ct_value *v;
    const ct_value *args;
    size_t nargs;
    const ct_kwarg *kw;
    size_t nkw;
    const ct_value *a[4];
} filter_call;

static int f_abs(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *v = f->v;
    if (v->t == CT_V_FLOAT)
        *out = ct_float(fabs(v->u.f));
    else if (ct_is_intlike(v)) {
        if (v->u.i == INT64_MIN) return ct_int_overflow(c, off);
        *out = ct_int(v->u.i < 0 ? -v->u.i : v->u.i);
    } else if (v->t == CT_V_UNDEF)
        return ct_undefined_error(c, off, v);
    else
        return ct_fail(c, off, ZI_EINVAL, "bad operand type for abs(): '%s'", ct_tname(v));
    return ZI_OK;
}

/* capitalize, lower, upper, title */
static int f_case(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    ct_value s;
    TRY(ct_str_of(c, off, f->v, &s));
    return ct_change_case(c, &s,
                          f->id == F_LOWER   ? CT_CASE_LOWER
                          : f->id == F_UPPER ? CT_CASE_UPPER
                          : f->id == F_TITLE ? CT_CASE_JINJATITLE
                                             : CT_CASE_CAPITALIZE,
                          out);
}

static int f_default(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    (void)c, (void)off;
    const ct_value *v = f->v, *const *a = f->a;
    int use = v->t == CT_V_UNDEF || (a[1] && ct_truthy(a[1]) && !ct_truthy(v));
    *out = use ? (a[0] ? *a[0] : ct_str_ref("", 0)) : *v;
    return ZI_OK;
}

static int f_escape(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    return ct_html_escape(c, off, f->v, out);
}

/* Markup(v): the text of str(v), marked safe. */
static int f_safe(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    TRY(ct_str_of(c, off, f->v, out));
    out->ut = CT_STR_MARKUP;
    return ZI_OK;
}

/* first, last */
static int f_first_last(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *v = f->v;
    if (f->id == F_LAST && ct_is_iter(v)) /* last() needs reversed() */
        return ct_fail(c, off, ZI_EINVAL, "'%s' object is not reversible", ct_tname(v));
    const ct_value *items;
    size_t n;
    TRY(ct_iterate(c, off, v, &items, &n));
    *out = n ? items[f->id == F_FIRST ? 0 : n - 1] : ct_undef();
    return ZI_OK;
}

static int f_float(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *v = f->v;
    if (v->t == CT_V_UNDEF) return ct_undefined_error(c, off, v);
    double x;
    if (ct_is_num(v))
        *out = ct_float(ct_as_double(v));
    else if (v->t == CT_V_STR && parse_float(v, &x) == 0)
        *out = ct_float(x);
    else
        *out = f->a[0] ? *f->a[0] : ct_float(0.0);
    return ZI_OK;
}

static int f_int(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    if (f->v->t == CT_V_UNDEF) return ct_undefined_error(c, off, f->v);
    return int_filter(c, off, f->v, f->a[0], f->a[1], out);
}

static int f_indent(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    return indent_filter(c, off, f->v, f->a[0], f->a[1], f->a[2], out);
}

/* items binds its own arguments: jinja2 raises their errors lazily. */
static int f_items(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *v = f->v;
    int rc = ct_bind(c, off, "items", NULL, 0, f->args, f->nargs, f->kw, f->nkw, f->a);
    if (!rc && v->t == CT_V_UNDEF) {
        ct_list *l = ct_list_new(c, 0);
        if (!l) return ct_oom(c, off);
        *out = ct_seq_value(CT_V_LIST, l);
    } else if (!rc && v->t != CT_V_DICT) {
        rc = ct_fail(c, off, ZI_EINVAL, "Can only get item pairs from a mapping.");
    } else if (!rc) {
        rc = ct_items_of(c, off, v->u.d, out);
    }
    return as_generator(c, rc, out);
}

static int f_join(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *v = f->v, *const *a = f->a;
    ct_value sep = ct_str_ref("", 0), seq = *v;
    if (a[0]) TRY(ct_str_of(c, off, a[0], &sep));
    if (a[1] && a[1]->t != CT_V_NONE) {
        ct_kwarg k = {"attribute", 9, *a[1]};
        TRY(map_filter(c, off, v, NULL, 0, &k, 1, &seq));
    }
    const ct_value *items;
    size_t n;
    TRY(ct_iterate(c, off, &seq, &items, &n));
    return ct_join_items(c, off, items, n, sep.u.s.p, sep.u.s.n, out);
}

static int f_length(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *v = f->v;
    switch (v->t) {
    case CT_V_STR:
        TRY(ct_charge(c, off, v->u.s.n / 64 + 1));
        *out = ct_int((int64_t)ct_u8_count(v->u.s.p, v->u.s.n));
        return ZI_OK;
    case CT_V_LIST:
    case CT_V_TUPLE:
        if (ct_is_iter(v))
            return ct_fail(c, off, ZI_EINVAL, "object of type '%s' has no len()", ct_tname(v));
        *out = ct_int((int64_t)v->u.l->n);
        return ZI_OK;
    case CT_V_DICT:
        *out = ct_int((int64_t)v->u.d->n);
        return ZI_OK;
    case CT_V_UNDEF:
        *out = ct_int(0);
        return ZI_OK;
    case CT_V_LOOP:
        *out = ct_int((int64_t)v->u.loop->n);
        return ZI_OK;
    default:
        return ct_fail(c, off, ZI_EINVAL, "object of type '%s' has no len()", ct_tname(v));
    }
}

static int f_list(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    return ct_list_of(c, off, f->v, out);
}

/* map binds its own arguments; jinja2 looks at neither them nor the items
 * of a falsy value. */
static int f_map(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    if (!ct_truthy(f->v)) return empty_generator(c, off, out);
    return as_generator(c, map_filter(c, off, f->v, f->args, f->nargs, f->kw, f->nkw, out), out);
}

/* select, reject, selectattr, rejectattr: as map. */
static int f_select(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    if (!ct_truthy(f->v)) return empty_generator(c, off, out);
    int id = f->id;
    return as_generator(c,
                        select_filter(c, off, f->v, f->args, f->nargs, f->kw, f->nkw,
                                      id == F_SELECTATTR || id == F_REJECTATTR,
                                      id == F_SELECT || id == F_SELECTATTR, out),
                        out);
}

static int f_replace(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *const *a = f->a;
    if (!a[0] || !a[1]) return ct_fail(c, off, ZI_EINVAL, "replace needs old and new");
    ct_value s, o, nw;
    TRY(ct_str_of(c, off, f->v, &s));
    TRY(ct_str_of(c, off, a[0], &o));
    TRY(ct_str_of(c, off, a[1], &nw));
    if (a[2] && a[2]->t != CT_V_NONE) TRY(ct_need_int(c, off, "replace count", a[2]));
    return ct_replace(c, off, &s, &o, &nw, a[2] && a[2]->t != CT_V_NONE ? a[2]->u.i : -1, out);
}

static int f_reverse(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *v = f->v;
    if (v->t == CT_V_STR) {
        ct_value step = ct_int(-1);
        return ct_slice(c, off, v, NULL, NULL, &step, out);
    }
    /* reversed(x) where Python has it (an iterator), else a list. */
    int reversible = ct_is_plain_seq(v) || v->t == CT_V_DICT || v->t == CT_V_UNDEF ||
                     (v->t == CT_V_LIST && v->uk >= CT_SEQ_ITEMS && v->uk <= CT_SEQ_VALUES);
    const ct_value *items;
    size_t n;
    ct_list *l;
    TRY(ct_iterate_new_list(c, off, v, &items, &n, &l));
    for (size_t i = 0; i < n; i++) l->v[l->n++] = items[n - 1 - i];
    *out = ct_gen_value(l, reversible ? CT_SEQ_REVERSED : CT_SEQ_LIST);
    return ZI_OK;
}

/* safe, string */
static int f_string(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    return ct_str_of(c, off, f->v, out);
}

/* dictsort(case_sensitive=False, by='key', reverse=False): the (key,
 * value) pairs sorted by key or value, as a list. */
static int f_dictsort(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *const *a = f->a;
    if (f->v->t == CT_V_UNDEF) return ct_undefined_error(c, off, f->v);
    if (f->v->t != CT_V_DICT)
        return ct_fail(c, off, ZI_EINVAL, "'%s' object has no attribute 'items'", ct_tname(f->v));
    int pos = 0;
    if (a[1]) {
        TRY(ct_need_str(c, off, "dictsort by", a[1]));
        if (ct_name_eq(a[1]->u.s.p, a[1]->u.s.n, "value"))
            pos = 1;
        else if (!ct_name_eq(a[1]->u.s.p, a[1]->u.s.n, "key"))
            return ct_fail(c, off, ZI_EINVAL, "You can only sort by either \"key\" or \"value\"");
    }
    ct_value pairs;
    TRY(ct_items_of(c, off, f->v->u.d, &pairs));
    const ct_value *items;
    size_t n;
    TRY(ct_iterate(c, off, &pairs, &items, &n));
    ct_value *v = ct_alloc(&c->arena, (n ? n : 1) * 4 * sizeof *v);
    if (!v) return ct_oom(c, off);
    ct_value *keys = v + n, *tv = v + 2 * n, *tk = v + 3 * n;
    for (size_t i = 0; i < n; i++) {
        v[i] = items[i];
        keys[i] = items[i].u.l->v[pos];
    }
    sort_ctx s = {c, off, a[0] && ct_truthy(a[0])};
    TRY(ct_enter(c, off));
    TRY(merge_sort(&s, v, keys, tv, tk, n, a[2] && ct_truthy(a[2])));
    ct_leave(c);
    ct_list *l = ct_list_new(c, 0);
    if (!l) return ct_oom(c, off);
    l->v = v;
    l->n = l->cap = n;
    *out = ct_seq_value(CT_V_LIST, l);
    return ZI_OK;
}

/* min / max(case_sensitive=False, attribute=None): the first smallest
 * (largest) item; undefined for an empty sequence. */
static int f_min_max(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *const *a = f->a;
    const ct_value *items;
    size_t n;
    TRY(ct_iterate(c, off, f->v, &items, &n));
    if (!n) {
        *out = ct_undef();
        return ZI_OK;
    }
    sort_ctx s = {c, off, a[0] && ct_truthy(a[0])};
    int has_attr = a[1] && a[1]->t != CT_V_NONE;
    size_t best = 0;
    ct_value bk = items[0];
    if (has_attr) TRY(attr_path(c, off, &items[0], a[1], &bk));
    for (size_t i = 1; i < n; i++) {
        ct_value k = items[i];
        if (has_attr) TRY(attr_path(c, off, &items[i], a[1], &k));
        TRY(ct_charge(c, off, 1));
        int better;
        TRY(f->id == F_MIN ? sort_key_less(&s, &k, &bk, &better)
                           : sort_key_less(&s, &bk, &k, &better));
        if (better) best = i, bk = k;
    }
    *out = items[best];
    return ZI_OK;
}

static int f_sort(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    return sort_filter(c, off, f->v, f->a[0], f->a[1], f->a[2], out);
}

static int f_sum(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *const *a = f->a;
    const ct_value *items;
    size_t n;
    TRY(ct_iterate(c, off, f->v, &items, &n));
    ct_value acc = a[1] ? *a[1] : ct_int(0);
    for (size_t i = 0; i < n; i++) {
        ct_value x = items[i];
        if (a[0] && a[0]->t != CT_V_NONE) TRY(attr_path(c, off, &items[i], a[0], &x));
        TRY(ct_binop(c, off, CT_OP_ADD, &acc, &x, &acc));
    }
    *out = acc;
    return ZI_OK;
}

static int f_tojson(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    return tojson_filter(c, off, f->v, f->a, out);
}

static int f_trim(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    ct_value s;
    TRY(ct_str_of(c, off, f->v, &s));
    const ct_value *chars = f->a[0] && f->a[0]->t != CT_V_NONE ? f->a[0] : NULL;
    if (chars) TRY(ct_need_str(c, off, "trim chars", chars));
    *out = ct_strip(&s, chars, 1, 1);
    return ZI_OK;
}

/* unique(case_sensitive=False, attribute=None): the items in order, each
 * key (lower-cased strings unless case_sensitive) once; a generator. The
 * keys must be hashable, as in Python's set. Quadratic, but charged. */
static int unique_items(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    const ct_value *const *a = f->a;
    const ct_value *items;
    size_t n;
    TRY(ct_iterate(c, off, f->v, &items, &n));
    ct_list *l = ct_list_new(c, n);
    ct_value *keys = ct_alloc(&c->arena, (n ? n : 1) * sizeof *keys);
    if (!l || !keys) return ct_oom(c, off);
    int cs = a[0] && ct_truthy(a[0]);
    size_t nk = 0;
    for (size_t i = 0; i < n; i++) {
        ct_value k = items[i];
        if (a[1] && a[1]->t != CT_V_NONE) TRY(attr_path(c, off, &items[i], a[1], &k));
        if (!cs && k.t == CT_V_STR) TRY(ct_change_case(c, &k, CT_CASE_LOWER, &k));
        if (ct_unhashable(&k))
            return ct_fail(c, off, ZI_EINVAL, "unhashable type: '%s'", ct_tname(&k));
        TRY(ct_charge(c, off, nk / 8 + 1));
        int seen = 0;
        for (size_t j = 0; j < nk && !seen; j++) seen = ct_equal(c, &keys[j], &k);
        if (seen) continue;
        keys[nk++] = k;
        l->v[l->n++] = items[i];
    }
    *out = ct_seq_value(CT_V_LIST, l);
    return ZI_OK;
}

static int f_unique(ct_ctx *c, size_t off, filter_call *f, ct_value *out) {
    return as_generator(c, unique_items(c, off, f, out), out);
}

/* ---- dispatch -------------------------------------------------------------- */

/* A parameter list for filter_defs: the names and their count. */
#define PARAMS(...)                                                                                \
    (const char *const[]){__VA_ARGS__},                                                            \
        sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)

/* Every filter by id: the name its argument errors use and its parameters
 * (ct_apply_filter binds the arguments to them first), or a NULL name for
 * a filter that checks its own arguments, and the function. */
static const struct filter_def {
    const char *fname;
    const char *const *params;
    size_t np;
    int (*fn)(ct_ctx *c, size_t off, filter_call *f, ct_value *out);
} filter_defs[F_COUNT] = {
    [F_ABS] = {"abs", NULL, 0, f_abs},
    [F_CAPITALIZE] = {"capitalize", NULL, 0, f_case},
    [F_DEFAULT] = {"default", PARAMS("default_value", "boolean"), f_default},
    [F_DICTSORT] = {"dictsort", PARAMS("case_sensitive", "by", "reverse"), f_dictsort},
    [F_ESCAPE] = {"escape", NULL, 0, f_escape},
    [F_FIRST] = {"first", NULL, 0, f_first_last},
    [F_FLOAT] = {"float", PARAMS("default"), f_float},
    [F_INDENT] = {"indent", PARAMS("width", "first", "blank"), f_indent},
    [F_INT] = {"int", PARAMS("default", "base"), f_int},
    [F_ITEMS] = {NULL, NULL, 0, f_items},
    [F_JOIN] = {"join", PARAMS("d", "attribute"), f_join},
    [F_LAST] = {"last", NULL, 0, f_first_last},
    [F_LENGTH] = {"length", NULL, 0, f_length},
    [F_LIST] = {"list", NULL, 0, f_list},
    [F_LOWER] = {"lower", NULL, 0, f_case},
    [F_MAP] = {NULL, NULL, 0, f_map},
    [F_MAX] = {"max", PARAMS("case_sensitive", "attribute"), f_min_max},
    [F_MIN] = {"min", PARAMS("case_sensitive", "attribute"), f_min_max},
    [F_REJECT] = {NULL, NULL, 0, f_select},
    [F_REJECTATTR] = {NULL, NULL, 0, f_select},
    [F_REPLACE] = {"replace", PARAMS("old", "new", "count"), f_replace},
    [F_REVERSE] = {"reverse", NULL, 0, f_reverse},
    [F_SAFE] = {"safe", NULL, 0, f_safe},
    [F_SELECT] = {NULL, NULL, 0, f_select},
    [F_SELECTATTR] = {NULL, NULL, 0, f_select},
    [F_SORT] = {"sort", PARAMS("reverse", "case_sensitive", "attribute"), f_sort},
    [F_STRING] = {"string", NULL, 0, f_string},
    [F_SUM] = {"sum", PARAMS("attribute", "start"), f_sum},
    [F_TITLE] = {"title", NULL, 0, f_case},
    [F_TOJSON] = {"tojson", PARAMS("ensure_ascii", "indent", "separators", "sort_keys"), f_tojson},
    [F_TRIM] = {"trim", PARAMS("chars"), f_trim},
    [F_UNIQUE] = {"unique", PARAMS("case_sensitive", "attribute"), f_unique},
    [F_UPPER] = {"upper", NULL, 0, f_case},
};

int ct_apply_filter(ct_ctx *c, size_t off, int id, const char *name, size_t nlen, const ct_value *v,
                    const ct_value *args, size_t nargs, const ct_kwarg *kw, size_t nkw,
                    ct_value *out) {
    if (id < 0 || id >= F_COUNT)
        return ct_fail(c, off, ZI_EUNSUPPORTED, "no filter named '%.*s'",
                       (int)(nlen > 60 ? 60 : nlen), name);
    const struct filter_def *d = &filter_defs[id];
    filter_call f = {id, v, args, nargs, kw, nkw, {NULL, NULL, NULL, NULL}};
    if (d->fname) TRY(ct_bind(c, off, d->fname, d->params, d->np, args, nargs, kw, nkw, f.a));
    return d->fn(c, off, &f, out);
}
