/*
 * chat_template_value.c - values and printing for the chat-template engine
 * (see chat_template_value.h): the render context and its errors,
 * containers, string buffers, type names, truthiness and ==, str() and
 * repr(), and json.dumps (what tojson prints).
 *
 * Semantics are Python's and jinja2's where a chat template can observe
 * them: bool is a kind of int, 1 == 1.0, [1] != (1,), str() of a list is
 * its repr, and an undefined value prints as "". tojson is Hugging Face's
 * (json.dumps with ensure_ascii=False), not jinja2's HTML-safe one.
 * Operators live in chat_template_ops.c, functions, methods and tests in
 * chat_template_builtins.c, filters in chat_template_filters.c; what they
 * share is in chat_template_value_impl.h.
 */
#include "chat_template_value.h"

#include "chat_template.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_value_impl.h"
#include "unicode.h"

/* ---- context ------------------------------------------------------------ */

int ct_charge(ct_ctx *c, size_t off, size_t n) {
    c->steps += n;
    if (c->steps > c->max_steps)
        return ct_fail(c, off, ZI_ERANGE, "the template exceeded its limit of %zu evaluation steps",
                       c->max_steps);
    return ZI_OK;
}

int ct_enter(ct_ctx *c, size_t off) {
    if (c->depth >= ZI_CHAT_TEMPLATE_MAX_DEPTH)
        return ct_fail(c, off, ZI_ERANGE, "the template nests deeper than %d levels",
                       ZI_CHAT_TEMPLATE_MAX_DEPTH);
    c->depth++;
    return ZI_OK;
}

int ct_oom(ct_ctx *c, size_t off) {
    if (c->arena.refused)
        return ct_fail(c, off, ZI_ENOMEM,
                       "the template used more than its limit of %zu bytes of memory",
                       c->arena.limit);
    return ct_fail(c, off, ZI_ENOMEM, "out of memory");
}

/* ---- containers --------------------------------------------------------- */

ct_list *ct_list_new(ct_ctx *c, size_t cap) {
    ct_list *l = ct_calloc(&c->arena, 1, sizeof *l);
    if (!l) return NULL;
    l->cap = cap;
    if (cap && !(l->v = ct_alloc(&c->arena, cap * sizeof *l->v))) return NULL;
    return l;
}

int ct_list_push(ct_ctx *c, ct_list *l, ct_value v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        if (cap > SIZE_MAX / sizeof *l->v) return ZI_ENOMEM;
        ct_value *nv = ct_alloc(&c->arena, cap * sizeof *nv);
        if (!nv) return ZI_ENOMEM;
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return ZI_OK;
}

ct_dict *ct_dict_new(ct_ctx *c, size_t cap) {
    ct_dict *d = ct_alloc(&c->arena, sizeof *d);
    if (!d) return NULL;
    d->n = 0;
    d->cap = 0;
    d->k = d->v = NULL;
    if (cap) {
        d->k = ct_alloc(&c->arena, cap * sizeof *d->k);
        d->v = ct_alloc(&c->arena, cap * sizeof *d->v);
        if (!d->k || !d->v) return NULL;
        d->cap = cap;
    }
    return d;
}

int ct_dict_set(ct_ctx *c, ct_dict *d, ct_value k, ct_value v) {
    for (size_t i = 0; i < d->n; i++)
        if (ct_equal(c, &d->k[i], &k)) {
            d->v[i] = v;
            return ZI_OK;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        ct_value *nk = ct_alloc(&c->arena, cap * sizeof *nk);
        ct_value *nv = ct_alloc(&c->arena, cap * sizeof *nv);
        if (!nk || !nv) return ZI_ENOMEM;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return ZI_OK;
}

ct_value *ct_dict_get_str(const ct_dict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == CT_V_STR && d->k[i].u.s.n == n && memcmp(d->k[i].u.s.p, k, n) == 0)
            return &d->v[i];
    return NULL;
}

ct_value *ct_dict_get(ct_ctx *c, const ct_dict *d, const ct_value *k) {
    for (size_t i = 0; i < d->n; i++)
        if (ct_equal(c, &d->k[i], k)) return &d->v[i];
    return NULL;
}

/* ---- buffers ------------------------------------------------------------ */

void ct_buf_init(ct_buf *b, ct_ctx *c, size_t max, int heap) {
    b->p = NULL;
    b->n = b->cap = 0;
    b->max = max;
    b->heap = heap;
    b->c = c;
}

int ct_buf_add(ct_buf *b, const char *s, size_t n) {
    if (n == 0) return ZI_OK;
    if (b->max && (n > b->max || b->n > b->max - n))
        return zi_error_set(b->c->err, ZI_ERANGE,
                            "chat template: the rendered text exceeds the limit of %zu bytes",
                            b->max);
    if ((n >> 6) && b->c->steps + (n >> 6) > b->c->max_steps) {
        b->c->steps += n >> 6;
        return zi_error_set(
            b->c->err, ZI_ERANGE,
            "chat template: the template exceeded its limit of %zu evaluation steps",
            b->c->max_steps);
    }
    b->c->steps += n >> 6;
    if (b->cap - b->n < n + 1) {
        size_t need = b->n + n + 1;
        size_t cap = b->cap ? b->cap : 64;
        while (cap < need) {
            if (cap > SIZE_MAX / 2)
                return zi_error_set(b->c->err, ZI_ENOMEM, "chat template: out of memory");
            cap *= 2;
        }
        char *p;
        if (b->heap) {
            if (b->c->arena.limit && cap > b->c->arena.limit)
                return zi_error_set(b->c->err, ZI_ENOMEM,
                                    "chat template: output larger than the memory limit");
            p = realloc(b->p, cap);
        } else {
            p = ct_alloc(&b->c->arena, cap);
            if (p && b->n) memcpy(p, b->p, b->n);
        }
        if (!p && b->c->arena.refused)
            return zi_error_set(b->c->err, ZI_ENOMEM,
                                "chat template: the template used more than its limit of %zu "
                                "bytes of memory",
                                b->c->arena.limit);
        if (!p) return zi_error_set(b->c->err, ZI_ENOMEM, "chat template: out of memory");
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return ZI_OK;
}

int ct_buf_addc(ct_buf *b, char ch) {
    return ct_buf_add(b, &ch, 1);
}

int ct_buf_addz(ct_buf *b, const char *s) {
    return ct_buf_add(b, s, strlen(s));
}

static int buf_printf(ct_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int buf_printf(ct_buf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) k = 0;
    if ((size_t)k >= sizeof tmp) k = sizeof tmp - 1;
    return ct_buf_add(b, tmp, (size_t)k);
}

int ct_buf_value(ct_buf *b, ct_value *out) {
    if (b->heap) {
        char *p = ct_alloc(&b->c->arena, b->n + 1);
        if (!p) return ct_oom(b->c, 0);
        if (b->n) memcpy(p, b->p, b->n);
        *out = ct_str_ref(p, b->n);
        return ZI_OK;
    }
    *out = ct_str_ref(b->n ? b->p : "", b->n);
    return ZI_OK;
}

/* ---- UTF-8 ------------------------------------------------------------- */

/* Byte offsets of every codepoint start plus the end (count + 1 entries). */
size_t *ct_u8_offsets(ct_ctx *c, const char *s, size_t n, size_t *count) {
    size_t k = ct_u8_count(s, n);
    size_t *o = ct_alloc(&c->arena, (k + 1) * sizeof *o);
    if (!o) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i += ct_u8_len((unsigned char)s[i])) o[j++] = i;
    o[j] = n;
    *count = k;
    return o;
}

/* ---- type names and predicates ----------------------------------------- */

static const char *type_name(int t) {
    switch (t) {
    case CT_V_UNDEF:
        return "Undefined";
    case CT_V_NONE:
        return "NoneType";
    case CT_V_BOOL:
        return "bool";
    case CT_V_INT:
        return "int";
    case CT_V_FLOAT:
        return "float";
    case CT_V_STR:
        return "str";
    case CT_V_LIST:
        return "list";
    case CT_V_TUPLE:
        return "tuple";
    case CT_V_DICT:
        return "dict";
    case CT_V_NS:
        return "Namespace";
    case CT_V_FUNC:
        return "builtin_function_or_method";
    case CT_V_MACRO:
        return "Macro";
    default:
        return "LoopContext";
    }
}

/* Python's type name of a value, for messages. */
const char *ct_tname(const ct_value *v) {
    if (v->t == CT_V_LIST) {
        static const char *const kinds[] = {
            "list",        "generator",           "range", "dict_items", "dict_keys",
            "dict_values", "list_reverseiterator"};
        return v->uk < sizeof kinds / sizeof kinds[0] ? kinds[v->uk] : "list";
    }
    return type_name(v->t);
}

int ct_unhashable(const ct_value *v) {
    return v->t == CT_V_DICT ||
           (v->t == CT_V_LIST &&
            (v->uk == CT_SEQ_LIST || v->uk == CT_SEQ_ITEMS || v->uk == CT_SEQ_KEYS));
}

int ct_truthy(const ct_value *v) {
    switch (v->t) {
    case CT_V_UNDEF:
    case CT_V_NONE:
        return 0;
    case CT_V_BOOL:
    case CT_V_INT:
        return v->u.i != 0;
    case CT_V_FLOAT:
        return v->u.f != 0.0;
    case CT_V_STR:
        return v->u.s.n != 0;
    case CT_V_LIST:
    case CT_V_TUPLE:
        return ct_is_iter(v) || v->u.l->n != 0;
    case CT_V_DICT:
        return v->u.d->n != 0;
    default:
        return 1;
    }
}

int ct_undefined_error(ct_ctx *c, size_t off, const ct_value *v) {
    if (v->uk == 1)
        return ct_fail(c, off, ZI_EINVAL, "'%.*s' is undefined",
                       (int)(v->u.s.n > 80 ? 80 : v->u.s.n), v->u.s.p);
    if (v->uk == 2)
        return ct_fail(c, off, ZI_EINVAL, "'%s object' has no attribute '%.*s'", type_name(v->ut),
                       (int)(v->u.s.n > 80 ? 80 : v->u.s.n), v->u.s.p);
    return ct_fail(c, off, ZI_EINVAL, "an undefined value was used");
}

ct_value ct_undef_attr(int objtype, const char *name, size_t n) {
    ct_value v = ct_undef();
    v.uk = 2;
    v.ut = (uint8_t)objtype;
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}

static int same_num(const ct_value *a, const ct_value *b) {
    if (ct_is_intlike(a) && ct_is_intlike(b)) return a->u.i == b->u.i;
    if (a->t == CT_V_FLOAT && b->t == CT_V_FLOAT) return a->u.f == b->u.f;
    const ct_value *f = a->t == CT_V_FLOAT ? a : b, *i = a->t == CT_V_FLOAT ? b : a;
    /* Exact int/float comparison, as Python does. */
    if (!(f->u.f >= -9223372036854775808.0 && f->u.f < 9223372036854775808.0)) return 0;
    if (f->u.f != floor(f->u.f)) return 0;
    return (int64_t)f->u.f == i->u.i;
}

int ct_equal(ct_ctx *c, const ct_value *a, const ct_value *b) {
    if (ct_is_num(a) && ct_is_num(b)) return same_num(a, b);
    if (a->t != b->t) return 0;
    switch (a->t) {
    case CT_V_UNDEF:
    case CT_V_NONE:
        return 1;
    case CT_V_STR:
        return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case CT_V_LIST:
    case CT_V_TUPLE:
        if (a->u.l == b->u.l) return 1;
        if (a->uk != b->uk || ct_is_iter(a)) return 0;
        if (a->u.l->n != b->u.l->n) return 0;
        /* Equality cannot fail, so its work is counted here and the limit
         * is enforced by the next ct_charge. */
        c->steps += a->u.l->n / 8;
        if (c->depth >= ZI_CHAT_TEMPLATE_MAX_DEPTH)
            return 0; /* absurdly deep values never compare equal */
        c->depth++;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!ct_equal(c, &a->u.l->v[i], &b->u.l->v[i])) {
                c->depth--;
                return 0;
            }
        c->depth--;
        return 1;
    case CT_V_DICT: {
        if (a->u.d == b->u.d) return 1;
        if (a->u.d->n != b->u.d->n) return 0;
        c->steps += a->u.d->n * a->u.d->n / 8;
        if (c->depth >= ZI_CHAT_TEMPLATE_MAX_DEPTH) return 0;
        c->depth++;
        int eq = 1;
        for (size_t i = 0; i < a->u.d->n && eq; i++) {
            ct_value *bv = ct_dict_get(c, b->u.d, &a->u.d->k[i]);
            eq = bv && ct_equal(c, &a->u.d->v[i], bv);
        }
        c->depth--;
        return eq;
    }
    case CT_V_NS:
        return a->u.d == b->u.d;
    case CT_V_FUNC:
        return a->u.fn == b->u.fn;
    case CT_V_MACRO:
        return a->u.m == b->u.m;
    default:
        return a->u.loop == b->u.loop;
    }
}

/* ---- str() and repr() --------------------------------------------------- */

/* Python's repr of a float (shortest round-tripping digits; scientific
 * notation outside 1e-4 <= |x| < 1e16). json.dumps writes floats the same. */
static void format_float(double f, char *out, size_t cap) {
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0) {
        snprintf(out, cap, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char tmp[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp is [-]d[.ddd]e[+-]XX */
    char digits[32];
    size_t nd = 0;
    const char *q = tmp;
    int neg = 0;
    if (*q == '-') neg = 1, q++;
    while (*q && *q != 'e') {
        if (*q != '.') digits[nd++] = *q;
        q++;
    }
    int e = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    size_t k = 0;
    char o[96];
    if (neg) o[k++] = '-';
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) o[k++] = (size_t)i < nd ? digits[i] : '0';
            o[k++] = '.';
            if ((size_t)e + 1 < nd)
                for (size_t i = (size_t)e + 1; i < nd; i++) o[k++] = digits[i];
            else
                o[k++] = '0';
        } else {
            o[k++] = '0';
            o[k++] = '.';
            for (int i = 0; i < -e - 1; i++) o[k++] = '0';
            for (size_t i = 0; i < nd; i++) o[k++] = digits[i];
        }
        o[k] = '\0';
    } else {
        o[k++] = digits[0];
        if (nd > 1) {
            o[k++] = '.';
            for (size_t i = 1; i < nd; i++) o[k++] = digits[i];
        }
        snprintf(o + k, sizeof o - k, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    snprintf(out, cap, "%s", o);
}

/* Python's str.isprintable for one codepoint. */
static int printable(uint32_t cp) {
    if (cp == ' ') return 1;
    uint16_t f = zi_unicode_flags(cp);
    return !(f & (ZI_UC_CONTROL | ZI_UC_UNDEFINED | ZI_UC_SEPARATOR));
}

static int repr_str(ct_buf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    TRY(ct_buf_addc(b, q));
    for (size_t i = 0; i < n;) {
        size_t k;
        uint32_t cp = ct_u8_get(s + i, n - i, &k);
        if (cp == (uint32_t)q || cp == '\\') {
            TRY(ct_buf_addc(b, '\\'));
            TRY(ct_buf_addc(b, (char)cp));
        } else if (cp == '\n')
            TRY(ct_buf_addz(b, "\\n"));
        else if (cp == '\r')
            TRY(ct_buf_addz(b, "\\r"));
        else if (cp == '\t')
            TRY(ct_buf_addz(b, "\\t"));
        else if (cp < 0x20 || cp == 0x7F)
            TRY(buf_printf(b, "\\x%02x", (unsigned)cp));
        else if (cp < 0x80 || printable(cp))
            TRY(ct_buf_add(b, s + i, k));
        else if (cp < 0x100)
            TRY(buf_printf(b, "\\x%02x", (unsigned)cp));
        else if (cp < 0x10000)
            TRY(buf_printf(b, "\\u%04x", (unsigned)cp));
        else
            TRY(buf_printf(b, "\\U%08x", (unsigned)cp));
        i += k;
    }
    return ct_buf_addc(b, q);
}

static int repr(ct_ctx *c, size_t off, const ct_value *v, ct_buf *b);

static int repr_dict_body(ct_ctx *c, size_t off, const ct_dict *d, ct_buf *b) {
    TRY(ct_buf_addc(b, '{'));
    for (size_t i = 0; i < d->n; i++) {
        if (i) TRY(ct_buf_addz(b, ", "));
        TRY(repr(c, off, &d->k[i], b));
        TRY(ct_buf_addz(b, ": "));
        TRY(repr(c, off, &d->v[i], b));
    }
    return ct_buf_addc(b, '}');
}

static int repr(ct_ctx *c, size_t off, const ct_value *v, ct_buf *b) {
    char num[64];
    switch (v->t) {
    case CT_V_UNDEF:
        return ct_buf_addz(b, "Undefined");
    case CT_V_NONE:
        return ct_buf_addz(b, "None");
    case CT_V_BOOL:
        return ct_buf_addz(b, v->u.i ? "True" : "False");
    case CT_V_INT:
        return buf_printf(b, "%lld", (long long)v->u.i);
    case CT_V_FLOAT:
        format_float(v->u.f, num, sizeof num);
        return ct_buf_addz(b, num);
    case CT_V_STR:
        return repr_str(b, v->u.s.p, v->u.s.n);
    case CT_V_LIST:
    case CT_V_TUPLE: {
        if (ct_is_iter(v)) return buf_printf(b, "<%s object>", ct_tname(v));
        if (v->t == CT_V_LIST && v->uk == CT_SEQ_RANGE) {
            const ct_list *l = v->u.l;
            if (l->r_step == 1)
                return buf_printf(b, "range(%lld, %lld)", (long long)l->r_start,
                                  (long long)l->r_stop);
            return buf_printf(b, "range(%lld, %lld, %lld)", (long long)l->r_start,
                              (long long)l->r_stop, (long long)l->r_step);
        }
        TRY(ct_enter(c, off));
        if (v->t == CT_V_LIST && v->uk != CT_SEQ_LIST) TRY(buf_printf(b, "%s(", ct_tname(v)));
        TRY(ct_buf_addc(b, v->t == CT_V_LIST ? '[' : '('));
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) TRY(ct_buf_addz(b, ", "));
            TRY(repr(c, off, &v->u.l->v[i], b));
        }
        if (v->t == CT_V_TUPLE && v->u.l->n == 1) TRY(ct_buf_addc(b, ','));
        TRY(ct_buf_addc(b, v->t == CT_V_LIST ? ']' : ')'));
        if (v->t == CT_V_LIST && v->uk != CT_SEQ_LIST) TRY(ct_buf_addc(b, ')'));
        ct_leave(c);
        return ZI_OK;
    }
    case CT_V_DICT:
        TRY(ct_enter(c, off));
        TRY(repr_dict_body(c, off, v->u.d, b));
        ct_leave(c);
        return ZI_OK;
    case CT_V_NS:
        TRY(ct_enter(c, off));
        TRY(ct_buf_addz(b, "<Namespace "));
        TRY(repr_dict_body(c, off, v->u.d, b));
        TRY(ct_buf_addc(b, '>'));
        ct_leave(c);
        return ZI_OK;
    case CT_V_FUNC:
        return ct_buf_addz(b, "<built-in function>");
    case CT_V_MACRO:
        return buf_printf(b, "<Macro '%.*s'>", (int)v->u.m->slen, v->u.m->s);
    default:
        return buf_printf(b, "<LoopContext %zu/%zu>", v->u.loop->i + 1, v->u.loop->n);
    }
}

int ct_to_str(ct_ctx *c, size_t off, const ct_value *v, ct_buf *b) {
    if (v->t == CT_V_STR) return ct_buf_add(b, v->u.s.p, v->u.s.n);
    if (v->t == CT_V_UNDEF) return ZI_OK;
    return repr(c, off, v, b);
}

int ct_str_of(ct_ctx *c, size_t off, const ct_value *v, ct_value *out) {
    if (v->t == CT_V_STR) {
        *out = *v;
        return ZI_OK;
    }
    if (v->t == CT_V_UNDEF) {
        *out = ct_str_ref("", 0);
        return ZI_OK;
    }
    ct_buf b;
    ct_buf_init(&b, c, 0, 0);
    TRY(repr(c, off, v, &b));
    return ct_buf_value(&b, out);
}

/* ---- json.dumps ------------------------------------------------------- */

static int json_str(ct_buf *b, const char *s, size_t n, int ensure_ascii) {
    TRY(ct_buf_addc(b, '"'));
    size_t run = 0; /* start of the pending run of verbatim bytes */
    for (size_t i = 0; i < n;) {
        size_t k;
        uint32_t cp = ct_u8_get(s + i, n - i, &k);
        const char *esc = NULL;
        char tmp[16];
        switch (cp) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
                if (cp >= 0x10000) {
                    uint32_t v = cp - 0x10000;
                    snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", (unsigned)(0xD800 + (v >> 10)),
                             (unsigned)(0xDC00 + (v & 0x3FF)));
                } else {
                    snprintf(tmp, sizeof tmp, "\\u%04x", (unsigned)cp);
                }
                esc = tmp;
            }
        }
        if (esc) {
            TRY(ct_buf_add(b, s + run, i - run));
            TRY(ct_buf_addz(b, esc));
            run = i + k;
        }
        i += k;
    }
    TRY(ct_buf_add(b, s + run, n - run));
    return ct_buf_addc(b, '"');
}

static int json_newline(ct_buf *b, const ct_json_opts *o, int level) {
    TRY(ct_buf_addc(b, '\n'));
    for (int i = 0; i < level; i++) TRY(ct_buf_add(b, o->indent, o->indent_len));
    return ZI_OK;
}

/* The JSON text of a dict key (json.dumps converts scalar keys). */
static int json_key(ct_ctx *c, size_t off, const ct_value *k, ct_buf *b, const ct_json_opts *o) {
    switch (k->t) {
    case CT_V_STR:
        return json_str(b, k->u.s.p, k->u.s.n, o->ensure_ascii);
    case CT_V_NONE:
    case CT_V_BOOL:
    case CT_V_INT:
    case CT_V_FLOAT: /* the scalar's own JSON text, quoted */
        TRY(ct_buf_addc(b, '"'));
        TRY(ct_json_dump(c, off, k, b, o, 0));
        return ct_buf_addc(b, '"');
    default:
        return ct_fail(c, off, ZI_EINVAL,
                       "tojson: keys must be str, int, float, bool or None, not %s", ct_tname(k));
    }
}

int ct_str_less(const ct_value *a, const ct_value *b) {
    size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    int r = memcmp(a->u.s.p, b->u.s.p, n);
    return r < 0 || (r == 0 && a->u.s.n < b->u.s.n);
}

int ct_json_dump(ct_ctx *c, size_t off, const ct_value *v, ct_buf *b, const ct_json_opts *o,
                 int level) {
    char num[64];
    switch (v->t) {
    case CT_V_NONE:
        return ct_buf_addz(b, "null");
    case CT_V_BOOL:
        return ct_buf_addz(b, v->u.i ? "true" : "false");
    case CT_V_INT:
        return buf_printf(b, "%lld", (long long)v->u.i);
    case CT_V_FLOAT:
        if (isnan(v->u.f)) return ct_buf_addz(b, "NaN");
        if (isinf(v->u.f)) return ct_buf_addz(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        format_float(v->u.f, num, sizeof num);
        return ct_buf_addz(b, num);
    case CT_V_STR:
        return json_str(b, v->u.s.p, v->u.s.n, o->ensure_ascii);
    case CT_V_LIST:
    case CT_V_TUPLE: {
        const ct_list *l = v->u.l;
        if (!(v->t == CT_V_TUPLE || v->uk == CT_SEQ_LIST))
            return ct_fail(c, off, ZI_EINVAL, "tojson: Object of type %s is not JSON serializable",
                           ct_tname(v));
        if (l->n == 0) return ct_buf_addz(b, "[]");
        TRY(ct_enter(c, off));
        TRY(ct_buf_addc(b, '['));
        if (o->pretty) TRY(json_newline(b, o, level + 1));
        for (size_t i = 0; i < l->n; i++) {
            if (i) {
                TRY(ct_buf_add(b, o->item_sep, o->item_sep_len));
                if (o->pretty) TRY(json_newline(b, o, level + 1));
            }
            TRY(ct_json_dump(c, off, &l->v[i], b, o, level + 1));
        }
        if (o->pretty) TRY(json_newline(b, o, level));
        TRY(ct_buf_addc(b, ']'));
        ct_leave(c);
        return ZI_OK;
    }
    case CT_V_DICT: {
        const ct_dict *d = v->u.d;
        if (d->n == 0) return ct_buf_addz(b, "{}");
        TRY(ct_enter(c, off));
        size_t *order = ct_alloc(&c->arena, d->n * sizeof *order);
        if (!order) return ct_oom(c, off);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) {
            for (size_t i = 0; i < d->n; i++)
                if (d->k[i].t != CT_V_STR)
                    return ct_fail(c, off, ZI_EUNSUPPORTED,
                                   "tojson: sort_keys needs string keys in this engine");
            /* Insertion sort: stable, and dicts in templates are small. */
            for (size_t i = 1; i < d->n; i++) {
                size_t x = order[i], j = i;
                TRY(ct_charge(c, off, i));
                while (j > 0 && ct_str_less(&d->k[x], &d->k[order[j - 1]])) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        TRY(ct_buf_addc(b, '{'));
        if (o->pretty) TRY(json_newline(b, o, level + 1));
        for (size_t i = 0; i < d->n; i++) {
            if (i) {
                TRY(ct_buf_add(b, o->item_sep, o->item_sep_len));
                if (o->pretty) TRY(json_newline(b, o, level + 1));
            }
            TRY(json_key(c, off, &d->k[order[i]], b, o));
            TRY(ct_buf_add(b, o->key_sep, o->key_sep_len));
            TRY(ct_json_dump(c, off, &d->v[order[i]], b, o, level + 1));
        }
        if (o->pretty) TRY(json_newline(b, o, level));
        TRY(ct_buf_addc(b, '}'));
        ct_leave(c);
        return ZI_OK;
    }
    default:
        return ct_fail(c, off, ZI_EINVAL, "tojson: Object of type %s is not JSON serializable",
                       ct_tname(v));
    }
}
