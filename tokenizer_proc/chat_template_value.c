/*
 * chat_template_value.c - values, operations and builtins of the
 * chat-template engine (see chat_template_value.h).
 *
 * Semantics are Python's and jinja2's where a chat template can observe
 * them: bool is a kind of int, 1 == 1.0, [1] != (1,), "a" + 1 is a type
 * error, `//` and `%` floor, str() of a list is its repr, string lengths
 * and indices count codepoints, obj.name finds methods before dict keys
 * and obj[key] keys before methods, and an undefined value prints as ""
 * and iterates as empty but fails in arithmetic. tojson is Hugging Face's
 * (json.dumps with ensure_ascii=False), not jinja2's HTML-safe one.
 * Filters that are generators in jinja2 (map, select, items, ...) return
 * one-shot sequences that behave like generators. Case mapping uses the
 * C.UTF-8 locale's simple Unicode mappings (see case_locale).
 */
#include "chat_template_value.h"

#include "chat_template.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <locale.h>
#include <wctype.h>

#include "unicode.h"

/* ---- context ------------------------------------------------------------ */

int ct_fail(ct_ctx *c, size_t off, int code, const char *fmt, ...) {
    char msg[ZI_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned line, col;
    ct_location(c->src, c->src_len, off, &line, &col);
    return zi_error_set(c->err, code, "chat template line %u col %u: %s", line, col, msg);
}

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

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) return rc_;                                                                       \
    } while (0)

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

static ct_value *dict_get(ct_ctx *c, const ct_dict *d, const ct_value *k) {
    for (size_t i = 0; i < d->n; i++)
        if (ct_equal(c, &d->k[i], k)) return &d->v[i];
    return NULL;
}

static ct_value seq_value(int type, ct_list *l) {
    ct_value v = {0};
    v.t = (uint8_t)type;
    v.u.l = l;
    return v;
}

static ct_value gen_value(ct_list *l, int kind) {
    ct_value v = seq_value(CT_V_LIST, l);
    v.uk = (uint8_t)kind;
    return v;
}

/* A one-shot iterator (a generator or reversed()). */
static int is_iter(const ct_value *v) {
    return v->t == CT_V_LIST && (v->uk == CT_SEQ_GEN || v->uk == CT_SEQ_REVERSED);
}

/* A list or tuple proper (not a range, generator or view). */
static int is_plain_list(const ct_value *v) {
    return (v->t == CT_V_LIST || v->t == CT_V_TUPLE) && v->uk == CT_SEQ_LIST;
}

/* A real list or tuple (or range), which supports len, [] and slicing. */
static int is_plain_seq(const ct_value *v) {
    return (v->t == CT_V_LIST && (v->uk == CT_SEQ_LIST || v->uk == CT_SEQ_RANGE)) ||
           v->t == CT_V_TUPLE;
}

static ct_value map_value(int type, ct_dict *d) {
    ct_value v = {0};
    v.t = (uint8_t)type;
    v.u.d = d;
    return v;
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

static int buf_addc(ct_buf *b, char ch) {
    return ct_buf_add(b, &ch, 1);
}

static int buf_addz(ct_buf *b, const char *s) {
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

/* Strings inside a render are always valid UTF-8 (inputs are validated and
 * every operation works on whole codepoints). */
static size_t u8_len(unsigned char b) {
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

static uint32_t u8_get(const char *s, size_t n, size_t *len) {
    uint32_t cp = 0;
    size_t k = ct_utf8_next((const unsigned char *)s, n, &cp);
    if (!k) {
        k = 1;
        cp = (unsigned char)s[0];
    }
    *len = k;
    return cp;
}

static size_t u8_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

/* Byte offsets of every codepoint start plus the end (count + 1 entries). */
static size_t *u8_offsets(ct_ctx *c, const char *s, size_t n, size_t *count) {
    size_t k = u8_count(s, n);
    size_t *o = ct_alloc(&c->arena, (k + 1) * sizeof *o);
    if (!o) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i += u8_len((unsigned char)s[i])) o[j++] = i;
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
static const char *tname(const ct_value *v) {
    if (v->t == CT_V_LIST) {
        static const char *const kinds[] = {
            "list",        "generator",           "range", "dict_items", "dict_keys",
            "dict_values", "list_reverseiterator"};
        return v->uk < sizeof kinds / sizeof kinds[0] ? kinds[v->uk] : "list";
    }
    return type_name(v->t);
}

static int is_num(const ct_value *v) {
    return v->t == CT_V_INT || v->t == CT_V_BOOL || v->t == CT_V_FLOAT;
}
static int is_intlike(const ct_value *v) {
    return v->t == CT_V_INT || v->t == CT_V_BOOL;
}
static double as_double(const ct_value *v) {
    return v->t == CT_V_FLOAT ? v->u.f : (double)v->u.i;
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
        return is_iter(v) || v->u.l->n != 0;
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

static ct_value undef_attr(int objtype, const char *name, size_t n) {
    ct_value v = ct_undef();
    v.uk = 2;
    v.ut = (uint8_t)objtype;
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}

static int same_num(const ct_value *a, const ct_value *b) {
    if (is_intlike(a) && is_intlike(b)) return a->u.i == b->u.i;
    if (a->t == CT_V_FLOAT && b->t == CT_V_FLOAT) return a->u.f == b->u.f;
    const ct_value *f = a->t == CT_V_FLOAT ? a : b, *i = a->t == CT_V_FLOAT ? b : a;
    /* Exact int/float comparison, as Python does. */
    if (!(f->u.f >= -9223372036854775808.0 && f->u.f < 9223372036854775808.0)) return 0;
    if (f->u.f != floor(f->u.f)) return 0;
    return (int64_t)f->u.f == i->u.i;
}

int ct_equal(ct_ctx *c, const ct_value *a, const ct_value *b) {
    if (is_num(a) && is_num(b)) return same_num(a, b);
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
        if (a->uk != b->uk || is_iter(a)) return 0;
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
            ct_value *bv = dict_get(c, b->u.d, &a->u.d->k[i]);
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
    TRY(buf_addc(b, q));
    for (size_t i = 0; i < n;) {
        size_t k;
        uint32_t cp = u8_get(s + i, n - i, &k);
        if (cp == (uint32_t)q || cp == '\\') {
            TRY(buf_addc(b, '\\'));
            TRY(buf_addc(b, (char)cp));
        } else if (cp == '\n')
            TRY(buf_addz(b, "\\n"));
        else if (cp == '\r')
            TRY(buf_addz(b, "\\r"));
        else if (cp == '\t')
            TRY(buf_addz(b, "\\t"));
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
    return buf_addc(b, q);
}

static int repr(ct_ctx *c, size_t off, const ct_value *v, ct_buf *b);

static int repr_dict_body(ct_ctx *c, size_t off, const ct_dict *d, ct_buf *b) {
    TRY(buf_addc(b, '{'));
    for (size_t i = 0; i < d->n; i++) {
        if (i) TRY(buf_addz(b, ", "));
        TRY(repr(c, off, &d->k[i], b));
        TRY(buf_addz(b, ": "));
        TRY(repr(c, off, &d->v[i], b));
    }
    return buf_addc(b, '}');
}

static int repr(ct_ctx *c, size_t off, const ct_value *v, ct_buf *b) {
    char num[64];
    switch (v->t) {
    case CT_V_UNDEF:
        return buf_addz(b, "Undefined");
    case CT_V_NONE:
        return buf_addz(b, "None");
    case CT_V_BOOL:
        return buf_addz(b, v->u.i ? "True" : "False");
    case CT_V_INT:
        return buf_printf(b, "%lld", (long long)v->u.i);
    case CT_V_FLOAT:
        format_float(v->u.f, num, sizeof num);
        return buf_addz(b, num);
    case CT_V_STR:
        return repr_str(b, v->u.s.p, v->u.s.n);
    case CT_V_LIST:
    case CT_V_TUPLE: {
        if (is_iter(v)) return buf_printf(b, "<%s object>", tname(v));
        if (v->t == CT_V_LIST && v->uk == CT_SEQ_RANGE) {
            const ct_list *l = v->u.l;
            if (l->r_step == 1)
                return buf_printf(b, "range(%lld, %lld)", (long long)l->r_start,
                                  (long long)l->r_stop);
            return buf_printf(b, "range(%lld, %lld, %lld)", (long long)l->r_start,
                              (long long)l->r_stop, (long long)l->r_step);
        }
        TRY(ct_enter(c, off));
        if (v->t == CT_V_LIST && v->uk != CT_SEQ_LIST) TRY(buf_printf(b, "%s(", tname(v)));
        TRY(buf_addc(b, v->t == CT_V_LIST ? '[' : '('));
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) TRY(buf_addz(b, ", "));
            TRY(repr(c, off, &v->u.l->v[i], b));
        }
        if (v->t == CT_V_TUPLE && v->u.l->n == 1) TRY(buf_addc(b, ','));
        TRY(buf_addc(b, v->t == CT_V_LIST ? ']' : ')'));
        if (v->t == CT_V_LIST && v->uk != CT_SEQ_LIST) TRY(buf_addc(b, ')'));
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
        TRY(buf_addz(b, "<Namespace "));
        TRY(repr_dict_body(c, off, v->u.d, b));
        TRY(buf_addc(b, '>'));
        ct_leave(c);
        return ZI_OK;
    case CT_V_FUNC:
        return buf_addz(b, "<built-in function>");
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

typedef struct json_opts {
    int ensure_ascii;
    int sort_keys;
    int pretty;
    const char *indent;
    size_t indent_len;
    const char *item_sep, *key_sep;
    size_t item_sep_len, key_sep_len;
} json_opts;

static int json_str(ct_buf *b, const char *s, size_t n, int ensure_ascii) {
    TRY(buf_addc(b, '"'));
    size_t run = 0; /* start of the pending run of verbatim bytes */
    for (size_t i = 0; i < n;) {
        size_t k;
        uint32_t cp = u8_get(s + i, n - i, &k);
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
            TRY(buf_addz(b, esc));
            run = i + k;
        }
        i += k;
    }
    TRY(ct_buf_add(b, s + run, n - run));
    return buf_addc(b, '"');
}

static int json_newline(ct_buf *b, const json_opts *o, int level) {
    TRY(buf_addc(b, '\n'));
    for (int i = 0; i < level; i++) TRY(ct_buf_add(b, o->indent, o->indent_len));
    return ZI_OK;
}

/* The JSON text of a dict key (json.dumps converts scalar keys). */
static int json_key(ct_ctx *c, size_t off, const ct_value *k, ct_buf *b, const json_opts *o) {
    char num[64];
    switch (k->t) {
    case CT_V_STR:
        return json_str(b, k->u.s.p, k->u.s.n, o->ensure_ascii);
    case CT_V_NONE:
        return buf_addz(b, "\"null\"");
    case CT_V_BOOL:
        return buf_addz(b, k->u.i ? "\"true\"" : "\"false\"");
    case CT_V_INT:
        return buf_printf(b, "\"%lld\"", (long long)k->u.i);
    case CT_V_FLOAT:
        if (isnan(k->u.f)) return buf_addz(b, "\"NaN\"");
        if (isinf(k->u.f)) return buf_addz(b, k->u.f < 0 ? "\"-Infinity\"" : "\"Infinity\"");
        format_float(k->u.f, num, sizeof num);
        return buf_printf(b, "\"%s\"", num);
    default:
        return ct_fail(c, off, ZI_EINVAL,
                       "tojson: keys must be str, int, float, bool or None, not %s", tname(k));
    }
}

static int str_less(const ct_value *a, const ct_value *b) {
    size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    int r = memcmp(a->u.s.p, b->u.s.p, n);
    return r < 0 || (r == 0 && a->u.s.n < b->u.s.n);
}

static int json_dump(ct_ctx *c, size_t off, const ct_value *v, ct_buf *b, const json_opts *o,
                     int level) {
    char num[64];
    switch (v->t) {
    case CT_V_NONE:
        return buf_addz(b, "null");
    case CT_V_BOOL:
        return buf_addz(b, v->u.i ? "true" : "false");
    case CT_V_INT:
        return buf_printf(b, "%lld", (long long)v->u.i);
    case CT_V_FLOAT:
        if (isnan(v->u.f)) return buf_addz(b, "NaN");
        if (isinf(v->u.f)) return buf_addz(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        format_float(v->u.f, num, sizeof num);
        return buf_addz(b, num);
    case CT_V_STR:
        return json_str(b, v->u.s.p, v->u.s.n, o->ensure_ascii);
    case CT_V_LIST:
    case CT_V_TUPLE: {
        const ct_list *l = v->u.l;
        if (!(v->t == CT_V_TUPLE || v->uk == CT_SEQ_LIST))
            return ct_fail(c, off, ZI_EINVAL, "tojson: Object of type %s is not JSON serializable",
                           tname(v));
        if (l->n == 0) return buf_addz(b, "[]");
        TRY(ct_enter(c, off));
        TRY(buf_addc(b, '['));
        if (o->pretty) TRY(json_newline(b, o, level + 1));
        for (size_t i = 0; i < l->n; i++) {
            if (i) {
                TRY(ct_buf_add(b, o->item_sep, o->item_sep_len));
                if (o->pretty) TRY(json_newline(b, o, level + 1));
            }
            TRY(json_dump(c, off, &l->v[i], b, o, level + 1));
        }
        if (o->pretty) TRY(json_newline(b, o, level));
        TRY(buf_addc(b, ']'));
        ct_leave(c);
        return ZI_OK;
    }
    case CT_V_DICT: {
        const ct_dict *d = v->u.d;
        if (d->n == 0) return buf_addz(b, "{}");
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
                while (j > 0 && str_less(&d->k[x], &d->k[order[j - 1]])) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        TRY(buf_addc(b, '{'));
        if (o->pretty) TRY(json_newline(b, o, level + 1));
        for (size_t i = 0; i < d->n; i++) {
            if (i) {
                TRY(ct_buf_add(b, o->item_sep, o->item_sep_len));
                if (o->pretty) TRY(json_newline(b, o, level + 1));
            }
            TRY(json_key(c, off, &d->k[order[i]], b, o));
            TRY(ct_buf_add(b, o->key_sep, o->key_sep_len));
            TRY(json_dump(c, off, &d->v[order[i]], b, o, level + 1));
        }
        if (o->pretty) TRY(json_newline(b, o, level));
        TRY(buf_addc(b, '}'));
        ct_leave(c);
        return ZI_OK;
    }
    default:
        return ct_fail(c, off, ZI_EINVAL, "tojson: Object of type %s is not JSON serializable",
                       tname(v));
    }
}

/* ---- arithmetic and comparison -------------------------------------- */

static int type_error2(ct_ctx *c, size_t off, const char *op, const ct_value *a,
                       const ct_value *b) {
    return ct_fail(c, off, ZI_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                   tname(a), tname(b));
}

static int int_overflow(ct_ctx *c, size_t off) {
    return ct_fail(c, off, ZI_EUNSUPPORTED, "integer result does not fit in 64 bits");
}

/* Growable strings and lists. A concatenation result lives in a block with
 * spare room and a record of how much of the block is in use; a + b appends
 * in place when a ends where the used part ends. The usual accumulation
 * `{% set ns.s = ns.s + x %}` thus takes linear, not quadratic, memory in the
 * arena (which never frees). Older values keep seeing only their own prefix,
 * and a second append to the same old value copies. */
typedef struct strblock {
    size_t cap, used;
    char data[];
} strblock;

int ct_str_concat(ct_ctx *c, size_t off, const ct_value *a, const char *b, size_t bn,
                  ct_value *out) {
    TRY(ct_charge(c, off, bn / 64 + 1));
    if (a->uk == CT_STR_GROWABLE) {
        strblock *blk = (strblock *)(void *)(a->u.s.p - offsetof(strblock, data));
        if (blk->used == a->u.s.n && blk->cap - blk->used >= bn) {
            if (bn) memcpy(blk->data + blk->used, b, bn);
            blk->used += bn;
            *out = *a;
            out->u.s.n += bn;
            return ZI_OK;
        }
    }
    size_t n = a->u.s.n + bn;
    if (n < bn || n > SIZE_MAX / 4) return ct_oom(c, off);
    TRY(ct_charge(c, off, n / 64));
    size_t cap = n < 32 ? 64 : n * 2;
    strblock *blk = ct_alloc(&c->arena, sizeof *blk + cap);
    if (!blk) return ct_oom(c, off);
    blk->cap = cap;
    blk->used = n;
    if (a->u.s.n) memcpy(blk->data, a->u.s.p, a->u.s.n);
    if (bn) memcpy(blk->data + a->u.s.n, b, bn);
    *out = ct_str_ref(blk->data, n);
    out->uk = CT_STR_GROWABLE;
    return ZI_OK;
}

static int list_concat(ct_ctx *c, size_t off, const ct_value *a, const ct_value *b, ct_value *out) {
    const ct_list *x = a->u.l, *y = b->u.l;
    TRY(ct_charge(c, off, y->n / 8 + 1));
    ct_list *l = ct_calloc(&c->arena, 1, sizeof *l);
    if (!l) return ct_oom(c, off);
    if (x->fill && *x->fill == x->n && x->cap - x->n >= y->n) {
        if (y->n) memcpy(x->v + x->n, y->v, y->n * sizeof *x->v);
        *x->fill += y->n;
        l->v = x->v;
        l->cap = x->cap;
        l->fill = x->fill;
    } else {
        size_t n = x->n + y->n;
        if (n > SIZE_MAX / 2 / sizeof *l->v) return ct_oom(c, off);
        TRY(ct_charge(c, off, n / 8));
        l->cap = n < 4 ? 8 : n * 2;
        l->v = ct_alloc(&c->arena, l->cap * sizeof *l->v);
        l->fill = ct_alloc(&c->arena, sizeof *l->fill);
        if (!l->v || !l->fill) return ct_oom(c, off);
        if (x->n) memcpy(l->v, x->v, x->n * sizeof *l->v);
        if (y->n) memcpy(l->v + x->n, y->v, y->n * sizeof *l->v);
        *l->fill = n;
    }
    l->n = x->n + y->n;
    *out = seq_value(a->t, l);
    return ZI_OK;
}

/* seq * count for strings, lists and tuples. */
static int repeat(ct_ctx *c, size_t off, const ct_value *seq, int64_t count, ct_value *out) {
    size_t n = seq->t == CT_V_STR ? seq->u.s.n : seq->u.l->n;
    size_t unit = seq->t == CT_V_STR ? 1 : sizeof(ct_value);
    if (count <= 0 || n == 0) count = 0;
    /* Refuse a result larger than the memory limit before building it. */
    if (count && ((uint64_t)count > (uint64_t)(SIZE_MAX / unit / n) ||
                  (c->arena.limit && (size_t)count * n * unit > c->arena.limit))) {
        c->arena.refused = 1;
        return ct_oom(c, off);
    }
    if (seq->t == CT_V_STR) {
        ct_buf b;
        ct_buf_init(&b, c, 0, 0);
        for (int64_t i = 0; i < count; i++) TRY(ct_buf_add(&b, seq->u.s.p, n));
        return ct_buf_value(&b, out);
    }
    TRY(ct_charge(c, off, (size_t)count * n / 8 + 1));
    ct_list *l = ct_list_new(c, (size_t)count * n);
    if (!l) return ct_oom(c, off);
    for (int64_t i = 0; i < count; i++)
        for (size_t j = 0; j < n; j++) l->v[l->n++] = seq->u.l->v[j];
    *out = seq_value(seq->t, l);
    return ZI_OK;
}

static double py_fmod(double a, double b, double *floordiv) {
    double mod = fmod(a, b);
    double div = (a - mod) / b;
    if (mod != 0) {
        if ((b < 0) != (mod < 0)) {
            mod += b;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, b);
    }
    double fd;
    if (div != 0) {
        fd = floor(div);
        if (div - fd > 0.5) fd += 1.0;
    } else {
        fd = copysign(0.0, a / b);
    }
    if (floordiv) *floordiv = fd;
    return mod;
}

int ct_binop(ct_ctx *c, size_t off, int op, const ct_value *a, const ct_value *b, ct_value *out) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (a->t == CT_V_UNDEF) return ct_undefined_error(c, off, a);
    if (b->t == CT_V_UNDEF) return ct_undefined_error(c, off, b);
    if (is_num(a) && is_num(b)) {
        int ints = is_intlike(a) && is_intlike(b);
        int64_t x = a->u.i, y = b->u.i, r;
        double fx = as_double(a), fy = as_double(b);
        switch (op) {
        case CT_OP_ADD:
            if (!ints) break;
            if (__builtin_add_overflow(x, y, &r)) return int_overflow(c, off);
            *out = ct_int(r);
            return ZI_OK;
        case CT_OP_SUB:
            if (!ints) break;
            if (__builtin_sub_overflow(x, y, &r)) return int_overflow(c, off);
            *out = ct_int(r);
            return ZI_OK;
        case CT_OP_MUL:
            if (!ints) break;
            if (__builtin_mul_overflow(x, y, &r)) return int_overflow(c, off);
            *out = ct_int(r);
            return ZI_OK;
        case CT_OP_DIV:
            if (fy == 0) return ct_fail(c, off, ZI_EINVAL, "division by zero");
            *out = ct_float(fx / fy);
            return ZI_OK;
        case CT_OP_FLOORDIV:
        case CT_OP_MOD:
            if (ints) {
                if (y == 0) return ct_fail(c, off, ZI_EINVAL, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) {
                    if (op == CT_OP_MOD) {
                        *out = ct_int(0);
                        return ZI_OK;
                    }
                    return int_overflow(c, off);
                }
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    m += y;
                    q -= 1;
                }
                *out = ct_int(op == CT_OP_MOD ? m : q);
                return ZI_OK;
            }
            if (fy == 0) return ct_fail(c, off, ZI_EINVAL, "float division or modulo by zero");
            {
                double fd, m = py_fmod(fx, fy, &fd);
                *out = ct_float(op == CT_OP_MOD ? m : fd);
            }
            return ZI_OK;
        case CT_OP_POW:
            if (ints && y >= 0) {
                int64_t base = x, acc = 1, e = y;
                while (e) {
                    if (e & 1)
                        if (__builtin_mul_overflow(acc, base, &acc)) return int_overflow(c, off);
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base)) return int_overflow(c, off);
                }
                *out = ct_int(acc);
                return ZI_OK;
            }
            if (fx == 0 && fy < 0)
                return ct_fail(c, off, ZI_EINVAL, "0.0 cannot be raised to a negative power");
            if (fx < 0 && fy != floor(fy))
                return ct_fail(c, off, ZI_EUNSUPPORTED, "complex results are not supported");
            *out = ct_float(pow(fx, fy));
            if (isinf(out->u.f) && isfinite(fx) && isfinite(fy))
                return ct_fail(c, off, ZI_EINVAL,
                               "float power overflows (Numerical result out of range)");
            return ZI_OK;
        }
        /* float + - * */
        *out = ct_float(op == CT_OP_ADD ? fx + fy : op == CT_OP_SUB ? fx - fy : fx * fy);
        return ZI_OK;
    }
    if (op == CT_OP_ADD) {
        if (a->t == CT_V_STR && b->t == CT_V_STR)
            return ct_str_concat(c, off, a, b->u.s.p, b->u.s.n, out);
        if (is_plain_list(a) && a->t == b->t && is_plain_list(b))
            return list_concat(c, off, a, b, out);
        if (a->t == CT_V_STR || ((a->t == CT_V_LIST || a->t == CT_V_TUPLE) && a->uk == 0))
            return ct_fail(c, off, ZI_EINVAL, "can only concatenate %s (not \"%s\") to %s",
                           tname(a), tname(b), tname(a));
        return type_error2(c, off, "+", a, b);
    }
    if (op == CT_OP_MUL) {
        if ((a->t == CT_V_STR || is_plain_list(a)) && is_intlike(b))
            return repeat(c, off, a, b->u.i, out);
        if ((b->t == CT_V_STR || is_plain_list(b)) && is_intlike(a))
            return repeat(c, off, b, a->u.i, out);
    }
    if (op == CT_OP_MOD && a->t == CT_V_STR)
        return ct_fail(c, off, ZI_EUNSUPPORTED, "printf-style string formatting is not supported");
    return type_error2(c, off, names[op], a, b);
}

int ct_negate(ct_ctx *c, size_t off, const ct_value *a, int neg, ct_value *out) {
    if (a->t == CT_V_UNDEF) return ct_undefined_error(c, off, a);
    if (is_intlike(a)) {
        if (neg && a->u.i == INT64_MIN) return int_overflow(c, off);
        *out = ct_int(neg ? -a->u.i : a->u.i);
        return ZI_OK;
    }
    if (a->t == CT_V_FLOAT) {
        *out = ct_float(neg ? -a->u.f : a->u.f);
        return ZI_OK;
    }
    return ct_fail(c, off, ZI_EINVAL, "bad operand type for unary %c: '%s'", neg ? '-' : '+',
                   tname(a));
}

/* Python's a < b; *lt receives the result. */
static int less(ct_ctx *c, size_t off, const ct_value *a, const ct_value *b, const char *opname,
                int *lt) {
    if (a->t == CT_V_UNDEF) return ct_undefined_error(c, off, a);
    if (b->t == CT_V_UNDEF) return ct_undefined_error(c, off, b);
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b))
            *lt = a->u.i < b->u.i;
        else
            *lt = as_double(a) < as_double(b);
        return ZI_OK;
    }
    if (a->t == CT_V_STR && b->t == CT_V_STR) {
        TRY(ct_charge(c, off, (a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n) / 64 + 1));
        *lt = str_less(a, b);
        return ZI_OK;
    }
    if ((a->t == CT_V_LIST || a->t == CT_V_TUPLE) && a->t == b->t && a->uk == CT_SEQ_LIST &&
        b->uk == CT_SEQ_LIST) {
        const ct_list *x = a->u.l, *y = b->u.l;
        size_t i = 0;
        TRY(ct_charge(c, off, (x->n < y->n ? x->n : y->n) / 8 + 1));
        while (i < x->n && i < y->n && ct_equal(c, &x->v[i], &y->v[i])) i++;
        if (i < x->n && i < y->n) {
            TRY(ct_enter(c, off));
            TRY(less(c, off, &x->v[i], &y->v[i], opname, lt));
            ct_leave(c);
            return ZI_OK;
        }
        *lt = x->n < y->n;
        return ZI_OK;
    }
    return ct_fail(c, off, ZI_EINVAL, "'%s' not supported between instances of '%s' and '%s'",
                   opname, tname(a), tname(b));
}

static const char *memfind(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, nd, nn);
}

static int contains(ct_ctx *c, size_t off, const ct_value *item, const ct_value *seq, int *r) {
    switch (seq->t) {
    case CT_V_STR:
        if (item->t != CT_V_STR)
            return ct_fail(c, off, ZI_EINVAL,
                           "'in <string>' requires string as left operand, not %s", tname(item));
        TRY(ct_charge(c, off, seq->u.s.n / 64 + 1));
        *r = memfind(seq->u.s.p, seq->u.s.n, item->u.s.p, item->u.s.n) != NULL;
        return ZI_OK;
    case CT_V_LIST:
    case CT_V_TUPLE: {
        const ct_value *items;
        size_t n;
        TRY(ct_iterate(c, off, seq, &items, &n)); /* consumes a generator, as Python does */
        TRY(ct_charge(c, off, n / 8 + 1));
        *r = 0;
        for (size_t i = 0; i < n && !*r; i++) *r = ct_equal(c, item, &items[i]);
        return ZI_OK;
    }
    case CT_V_DICT:
        if (ct_unhashable(item))
            return ct_fail(c, off, ZI_EINVAL, "unhashable type: '%s'", tname(item));
        TRY(ct_charge(c, off, seq->u.d->n / 8 + 1));
        *r = dict_get(c, seq->u.d, item) != NULL;
        return ZI_OK;
    case CT_V_UNDEF:
        *r = 0;
        return ZI_OK;
    default:
        return ct_fail(c, off, ZI_EINVAL, "argument of type '%s' is not iterable", tname(seq));
    }
}

int ct_compare(ct_ctx *c, size_t off, int op, const ct_value *a, const ct_value *b, int *result) {
    int r = 0;
    switch (op) {
    case CT_CMP_EQ:
        *result = ct_equal(c, a, b);
        return ZI_OK;
    case CT_CMP_NE:
        *result = !ct_equal(c, a, b);
        return ZI_OK;
    case CT_CMP_LT:
        TRY(less(c, off, a, b, "<", &r));
        break;
    case CT_CMP_GT:
        TRY(less(c, off, b, a, ">", &r));
        break;
    case CT_CMP_LE:
        TRY(less(c, off, b, a, "<=", &r));
        r = !r;
        /* a <= b is not (b < a) only for totally ordered values; NaN aside
         * that holds for numbers and strings, and lists compare the same way. */
        if (a->t == CT_V_FLOAT && isnan(a->u.f)) r = 0;
        if (b->t == CT_V_FLOAT && isnan(b->u.f)) r = 0;
        break;
    case CT_CMP_GE:
        TRY(less(c, off, a, b, ">=", &r));
        r = !r;
        if (a->t == CT_V_FLOAT && isnan(a->u.f)) r = 0;
        if (b->t == CT_V_FLOAT && isnan(b->u.f)) r = 0;
        break;
    case CT_CMP_IN:
        TRY(contains(c, off, a, b, &r));
        break;
    default:
        TRY(contains(c, off, a, b, &r));
        r = !r;
        break;
    }
    *result = r;
    return ZI_OK;
}

/* ---- iteration, attributes, items ------------------------------------ */

int ct_iterate(ct_ctx *c, size_t off, const ct_value *v, const ct_value **items, size_t *n) {
    switch (v->t) {
    case CT_V_LIST:
    case CT_V_TUPLE:
        if (is_iter(v)) {
            ct_list *l = v->u.l;
            if (l->err_code) {
                int code = l->err_code;
                l->err_code = 0; /* a failed generator is finished */
                l->consumed = 1;
                return zi_error_set(c->err, code, "%s", l->err_msg);
            }
            if (l->consumed) {
                *items = NULL;
                *n = 0;
                return ZI_OK;
            }
            l->consumed = 1;
        }
        *items = v->u.l->v;
        *n = v->u.l->n;
        return ZI_OK;
    case CT_V_DICT:
        *items = v->u.d->k;
        *n = v->u.d->n;
        return ZI_OK;
    case CT_V_UNDEF:
        *items = NULL;
        *n = 0;
        return ZI_OK;
    case CT_V_STR: {
        TRY(ct_charge(c, off, v->u.s.n / 64 + 1));
        size_t k = u8_count(v->u.s.p, v->u.s.n);
        ct_value *o = ct_alloc(&c->arena, (k ? k : 1) * sizeof *o);
        if (!o) return ct_oom(c, off);
        size_t j = 0;
        for (size_t i = 0; i < v->u.s.n;) {
            size_t l = u8_len((unsigned char)v->u.s.p[i]);
            o[j++] = ct_str_ref(v->u.s.p + i, l);
            i += l;
        }
        *items = o;
        *n = k;
        return ZI_OK;
    }
    default:
        return ct_fail(c, off, ZI_EINVAL, "'%s' object is not iterable", tname(v));
    }
}

enum {
    /* globals */
    CT_F_RANGE,
    CT_F_NAMESPACE,
    CT_F_DICT,
    CT_F_RAISE,
    CT_F_STRFTIME,
    /* str methods */
    CT_F_STRIP,
    CT_F_LSTRIP,
    CT_F_RSTRIP,
    CT_F_LOWER,
    CT_F_UPPER,
    CT_F_TITLE,
    CT_F_CAPITALIZE,
    CT_F_STARTSWITH,
    CT_F_ENDSWITH,
    CT_F_REPLACE,
    CT_F_SPLIT,
    CT_F_JOIN,
    CT_F_FIND,
    CT_F_COUNT,
    /* dict methods */
    CT_F_ITEMS,
    CT_F_KEYS,
    CT_F_VALUES,
    CT_F_GET,
    /* loop methods */
    CT_F_CYCLE,
};

static const struct {
    const char *name;
    int id;
} str_methods[] =
    {
        {"strip", CT_F_STRIP},
        {"lstrip", CT_F_LSTRIP},
        {"rstrip", CT_F_RSTRIP},
        {"lower", CT_F_LOWER},
        {"upper", CT_F_UPPER},
        {"title", CT_F_TITLE},
        {"capitalize", CT_F_CAPITALIZE},
        {"startswith", CT_F_STARTSWITH},
        {"endswith", CT_F_ENDSWITH},
        {"replace", CT_F_REPLACE},
        {"split", CT_F_SPLIT},
        {"join", CT_F_JOIN},
        {"find", CT_F_FIND},
        {"count", CT_F_COUNT},
},
  dict_methods[] = {{"items", CT_F_ITEMS},
                    {"keys", CT_F_KEYS},
                    {"values", CT_F_VALUES},
                    {"get", CT_F_GET}},
  globals[] = {{"range", CT_F_RANGE},
               {"namespace", CT_F_NAMESPACE},
               {"dict", CT_F_DICT},
               {"raise_exception", CT_F_RAISE},
               {"strftime_now", CT_F_STRFTIME}};

static int name_eq(const char *a, size_t n, const char *z) {
    return strlen(z) == n && memcmp(a, z, n) == 0;
}

static int func_value(ct_ctx *c, size_t off, int id, const ct_value *self, ct_value *out) {
    ct_func *f = ct_alloc(&c->arena, sizeof *f);
    if (!f) return ct_oom(c, off);
    f->id = id;
    f->self = self ? *self : ct_none();
    ct_value v = {0};
    v.t = CT_V_FUNC;
    v.u.fn = f;
    *out = v;
    return ZI_OK;
}

int ct_is_global(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (name_eq(name, n, globals[i].name)) return 1;
    return 0;
}

int ct_global(ct_ctx *c, size_t off, const char *name, size_t n, ct_value *out, int *found) {
    *found = 0;
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (name_eq(name, n, globals[i].name)) {
            *found = 1;
            return func_value(c, off, globals[i].id, NULL, out);
        }
    return ZI_OK;
}

static int loop_attr(ct_ctx *c, size_t off, const ct_value *obj, const char *name, size_t n,
                     ct_value *out) {
    const ct_loop *l = obj->u.loop;
    if (name_eq(name, n, "index"))
        *out = ct_int((int64_t)l->i + 1);
    else if (name_eq(name, n, "index0"))
        *out = ct_int((int64_t)l->i);
    else if (name_eq(name, n, "revindex"))
        *out = ct_int((int64_t)(l->n - l->i));
    else if (name_eq(name, n, "revindex0"))
        *out = ct_int((int64_t)(l->n - l->i - 1));
    else if (name_eq(name, n, "first"))
        *out = ct_bool(l->i == 0);
    else if (name_eq(name, n, "last"))
        *out = ct_bool(l->i + 1 == l->n);
    else if (name_eq(name, n, "length"))
        *out = ct_int((int64_t)l->n);
    else if (name_eq(name, n, "depth"))
        *out = ct_int(l->depth);
    else if (name_eq(name, n, "depth0"))
        *out = ct_int(l->depth - 1);
    else if (name_eq(name, n, "previtem"))
        *out = l->i > 0 ? l->items[l->i - 1] : ct_undef();
    else if (name_eq(name, n, "nextitem"))
        *out = l->i + 1 < l->n ? l->items[l->i + 1] : ct_undef();
    else if (name_eq(name, n, "cycle"))
        return func_value(c, off, CT_F_CYCLE, obj, out);
    else
        *out = undef_attr(CT_V_LOOP, name, n);
    return ZI_OK;
}

int ct_getattr(ct_ctx *c, size_t off, const ct_value *obj, const char *name, size_t n,
               ct_value *out) {
    switch (obj->t) {
    case CT_V_UNDEF:
        return ct_undefined_error(c, off, obj);
    case CT_V_LOOP:
        return loop_attr(c, off, obj, name, n, out);
    case CT_V_STR:
        for (size_t i = 0; i < sizeof str_methods / sizeof str_methods[0]; i++)
            if (name_eq(name, n, str_methods[i].name))
                return func_value(c, off, str_methods[i].id, obj, out);
        break;
    case CT_V_DICT: {
        for (size_t i = 0; i < sizeof dict_methods / sizeof dict_methods[0]; i++)
            if (name_eq(name, n, dict_methods[i].name))
                return func_value(c, off, dict_methods[i].id, obj, out);
        ct_value *v = ct_dict_get_str(obj->u.d, name, n);
        if (v) {
            *out = *v;
            return ZI_OK;
        }
        break;
    }
    case CT_V_NS: {
        ct_value *v = ct_dict_get_str(obj->u.d, name, n);
        if (v) {
            *out = *v;
            return ZI_OK;
        }
        break;
    }
    default:
        break;
    }
    *out = undef_attr(obj->t, name, n);
    return ZI_OK;
}

int ct_getitem(ct_ctx *c, size_t off, const ct_value *obj, const ct_value *key, ct_value *out) {
    switch (obj->t) {
    case CT_V_UNDEF:
        return ct_undefined_error(c, off, obj);
    case CT_V_DICT: {
        TRY(ct_charge(c, off, obj->u.d->n / 8 + 1));
        ct_value *v = dict_get(c, obj->u.d, key);
        if (v) {
            *out = *v;
            return ZI_OK;
        }
        break;
    }
    case CT_V_LIST:
    case CT_V_TUPLE:
        if (is_intlike(key) && is_plain_seq(obj)) {
            int64_t i = key->u.i, n = (int64_t)obj->u.l->n;
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                *out = obj->u.l->v[i];
                return ZI_OK;
            }
            *out = ct_undef();
            return ZI_OK;
        }
        break;
    case CT_V_STR:
        if (is_intlike(key)) {
            TRY(ct_charge(c, off, obj->u.s.n / 64 + 1));
            int64_t i = key->u.i, n = (int64_t)u8_count(obj->u.s.p, obj->u.s.n);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                size_t b = 0;
                for (int64_t k = 0; k < i; k++) b += u8_len((unsigned char)obj->u.s.p[b]);
                *out = ct_str_ref(obj->u.s.p + b, u8_len((unsigned char)obj->u.s.p[b]));
                return ZI_OK;
            }
            *out = ct_undef();
            return ZI_OK;
        }
        break;
    default:
        break;
    }
    if (key->t == CT_V_STR) {
        /* jinja2 falls back to the attribute for string keys. */
        ct_value v;
        TRY(ct_getattr(c, off, obj, key->u.s.p, key->u.s.n, &v));
        *out = v;
        return ZI_OK;
    }
    *out = ct_undef();
    return ZI_OK;
}

static int slice_index(ct_ctx *c, size_t off, const ct_value *v, int *given, int64_t *out) {
    *given = 0;
    if (!v || v->t == CT_V_NONE) return ZI_OK;
    if (v->t == CT_V_UNDEF) return ct_undefined_error(c, off, v);
    if (!is_intlike(v))
        return ct_fail(c, off, ZI_EINVAL, "slice indices must be integers or None, not %s",
                       tname(v));
    *given = 1;
    *out = v->u.i;
    return ZI_OK;
}

int ct_slice(ct_ctx *c, size_t off, const ct_value *obj, const ct_value *start,
             const ct_value *stop, const ct_value *step, ct_value *out) {
    /* jinja2 slices with Python's own [] (not its lenient getitem), so
     * slicing anything but a string, list, tuple or range is an error. */
    if (obj->t == CT_V_UNDEF) return ct_undefined_error(c, off, obj);
    if (obj->t == CT_V_DICT) return ct_fail(c, off, ZI_EINVAL, "unhashable type: 'slice'");
    if (obj->t != CT_V_STR && !is_plain_seq(obj))
        return ct_fail(c, off, ZI_EINVAL, "'%s' object is not subscriptable", tname(obj));
    int g0, g1, g2;
    int64_t a = 0, b = 0, s = 1;
    TRY(slice_index(c, off, start, &g0, &a));
    TRY(slice_index(c, off, stop, &g1, &b));
    TRY(slice_index(c, off, step, &g2, &s));
    if (!g2) s = 1;
    if (s == 0) return ct_fail(c, off, ZI_EINVAL, "slice step cannot be zero");
    size_t *offs = NULL;
    int64_t n;
    if (obj->t == CT_V_STR) {
        size_t cnt;
        TRY(ct_charge(c, off, obj->u.s.n / 64 + 1));
        offs = u8_offsets(c, obj->u.s.p, obj->u.s.n, &cnt);
        if (!offs) return ct_oom(c, off);
        n = (int64_t)cnt;
    } else {
        n = (int64_t)obj->u.l->n;
    }
    /* Python's PySlice_AdjustIndices. */
    if (!g0)
        a = s > 0 ? 0 : n - 1;
    else if (a < 0) {
        a += n;
        if (a < 0) a = s > 0 ? 0 : -1;
    } else if (a >= n)
        a = s > 0 ? n : n - 1;
    if (!g1)
        b = s > 0 ? n : -1;
    else if (b < 0) {
        b += n;
        if (b < 0) b = s > 0 ? 0 : -1;
    } else if (b >= n)
        b = s > 0 ? n : n - 1;
    int64_t count = 0;
    if (s > 0 && a < b) count = (b - a - 1) / s + 1;
    if (s < 0 && b < a) count = (a - b - 1) / (-s) + 1;
    TRY(ct_charge(c, off, (size_t)count / 8 + 1));
    if (obj->t == CT_V_STR) {
        if (s == 1) {
            *out = ct_str_ref(obj->u.s.p + offs[a], count ? offs[b] - offs[a] : 0);
            return ZI_OK;
        }
        ct_buf buf;
        ct_buf_init(&buf, c, 0, 0);
        for (int64_t k = 0, i = a; k < count; k++, i += s)
            TRY(ct_buf_add(&buf, obj->u.s.p + offs[i], offs[i + 1] - offs[i]));
        return ct_buf_value(&buf, out);
    }
    ct_list *l = ct_list_new(c, (size_t)count);
    if (!l) return ct_oom(c, off);
    for (int64_t k = 0, i = a; k < count; k++, i += s) l->v[l->n++] = obj->u.l->v[i];
    *out = seq_value(obj->t, l);
    if (obj->t == CT_V_LIST && obj->uk == CT_SEQ_RANGE) {
        /* A slice of a range is a range. */
        const ct_list *r = obj->u.l;
        int64_t x, y;
        out->uk = CT_SEQ_RANGE;
        if (__builtin_mul_overflow(a, r->r_step, &x) || __builtin_add_overflow(r->r_start, x, &x) ||
            __builtin_mul_overflow(b, r->r_step, &y) || __builtin_add_overflow(r->r_start, y, &y) ||
            __builtin_mul_overflow(r->r_step, s, &l->r_step))
            return int_overflow(c, off);
        l->r_start = x;
        l->r_stop = y;
    }
    return ZI_OK;
}

/* ---- argument binding ------------------------------------------------- */

/* Maps positional and keyword arguments onto the parameter names of a
 * builtin; slot[i] is NULL for a parameter that was not given. */
static int bind(ct_ctx *c, size_t off, const char *fname, const char *const *params, size_t np,
                const ct_value *args, size_t nargs, const ct_kwarg *kw, size_t nkw,
                const ct_value **slot) {
    if (nargs > np)
        return ct_fail(c, off, ZI_EINVAL, "%s() takes at most %zu argument%s (%zu given)", fname,
                       np, np == 1 ? "" : "s", nargs);
    for (size_t i = 0; i < np; i++) slot[i] = i < nargs ? &args[i] : NULL;
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < np; i++)
            if (name_eq(kw[k].name, kw[k].len, params[i])) break;
        if (i == np)
            return ct_fail(c, off, ZI_EINVAL, "%s() got an unexpected keyword argument '%.*s'",
                           fname, (int)kw[k].len, kw[k].name);
        if (slot[i])
            return ct_fail(c, off, ZI_EINVAL, "%s() got multiple values for argument '%s'", fname,
                           params[i]);
        slot[i] = &kw[k].v;
    }
    return ZI_OK;
}

static int need_str(ct_ctx *c, size_t off, const char *what, const ct_value *v) {
    if (v->t == CT_V_STR) return ZI_OK;
    if (v->t == CT_V_UNDEF) return ct_undefined_error(c, off, v);
    return ct_fail(c, off, ZI_EINVAL, "%s must be a string, not %s", what, tname(v));
}

static int need_int(ct_ctx *c, size_t off, const char *what, const ct_value *v) {
    if (is_intlike(v)) return ZI_OK;
    if (v->t == CT_V_UNDEF) return ct_undefined_error(c, off, v);
    return ct_fail(c, off, ZI_EINVAL, "%s must be an integer, not %s", what, tname(v));
}

/* ---- string functions ------------------------------------------------- */

static int in_chars(uint32_t cp, const ct_value *chars) {
    for (size_t i = 0; i < chars->u.s.n;) {
        size_t k;
        if (u8_get(chars->u.s.p + i, chars->u.s.n - i, &k) == cp) return 1;
        i += k;
    }
    return 0;
}

/* str.strip / lstrip / rstrip with Python's whitespace or a set of chars. */
static ct_value strip(const ct_value *s, const ct_value *chars, int left, int right) {
    const char *p = s->u.s.p;
    size_t a = 0, b = s->u.s.n;
    if (left)
        while (a < b) {
            size_t k;
            uint32_t cp = u8_get(p + a, b - a, &k);
            if (chars ? !in_chars(cp, chars) : !ct_is_space(cp)) break;
            a += k;
        }
    if (right)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            size_t k;
            uint32_t cp = u8_get(p + st, b - st, &k);
            if (chars ? !in_chars(cp, chars) : !ct_is_space(cp)) break;
            b = st;
        }
    return ct_str_ref(p + a, b - a);
}

/* Case mapping: the simple (one-to-one) mappings of glibc's built-in
 * C.UTF-8 locale, which are Unicode's and match Python 3.11's str.lower /
 * str.upper for every codepoint whose Python result is one character.
 * Python's one-to-many mappings (e.g. "ß".upper() == "SS") are not done.
 * Without that locale only ASCII letters change case. */
static locale_t case_locale(ct_ctx *c) {
    if (!c->case_locale_tried) {
        c->case_locale_tried = 1;
        c->case_locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    }
    return (locale_t)c->case_locale;
}

void ct_ctx_release(ct_ctx *c) {
    if (c->case_locale) freelocale((locale_t)c->case_locale);
    c->case_locale = NULL;
}

static uint32_t to_lower(ct_ctx *c, uint32_t cp) {
    if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    locale_t l = case_locale(c);
    return l ? (uint32_t)towlower_l((wint_t)cp, l) : cp;
}

static uint32_t to_upper(ct_ctx *c, uint32_t cp) {
    if (cp < 0x80) return cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
    locale_t l = case_locale(c);
    return l ? (uint32_t)towupper_l((wint_t)cp, l) : cp;
}

static uint32_t to_title(ct_ctx *c, uint32_t cp) {
    if (cp < 0x80) return to_upper(c, cp);
    locale_t l = case_locale(c);
    if (!l) return cp;
    wctrans_t t = wctrans_l("totitle", l);
    return t ? (uint32_t)towctrans_l((wint_t)cp, t, l) : (uint32_t)towupper_l((wint_t)cp, l);
}

/* 1: lowercase letter, 2: uppercase or titlecase letter, 0: uncased. */
static int case_kind(ct_ctx *c, uint32_t cp) {
    if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? 1 : (cp >= 'A' && cp <= 'Z') ? 2 : 0;
    locale_t l = case_locale(c);
    if (!l) return 0;
    if (iswupper_l((wint_t)cp, l)) return 2;
    return iswlower_l((wint_t)cp, l) ? 1 : 0;
}

enum { CASE_LOWER, CASE_UPPER, CASE_CAPITALIZE, CASE_PYTITLE, CASE_JINJATITLE };

/* Word boundaries of jinja2's title filter: runs of -, whitespace, ( { [ <. */
static int title_sep(uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ct_is_space(cp);
}

static int change_case(ct_ctx *c, const ct_value *s, int mode, ct_value *out) {
    ct_buf b;
    ct_buf_init(&b, c, 0, 0);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    int prev_cased = 0, at_word_start = 1, first = 1;
    for (size_t i = 0; i < n;) {
        size_t k;
        uint32_t cp = u8_get(p + i, n - i, &k), m = cp;
        switch (mode) {
        case CASE_LOWER:
            m = to_lower(c, cp);
            if (cp == 0x3A3) {
                /* Python's final-sigma rule, without skipping case-ignorable
                 * characters: a word-final capital sigma becomes U+03C2. */
                size_t k2 = 0;
                uint32_t next = i + k < n ? u8_get(p + i + k, n - i - k, &k2) : 0;
                if (prev_cased && !(i + k < n && case_kind(c, next))) m = 0x3C2;
            }
            prev_cased = case_kind(c, cp) != 0;
            break;
        case CASE_UPPER:
            m = to_upper(c, cp);
            break;
        case CASE_CAPITALIZE:
            m = first ? to_title(c, cp) : to_lower(c, cp);
            break;
        case CASE_PYTITLE:
            m = prev_cased ? to_lower(c, cp) : to_title(c, cp);
            prev_cased = case_kind(c, cp) != 0;
            break;
        default:
            if (title_sep(cp)) {
                at_word_start = 1;
            } else {
                m = at_word_start ? to_upper(c, cp) : to_lower(c, cp);
                at_word_start = 0;
            }
        }
        first = 0;
        if (m == cp) {
            TRY(ct_buf_add(&b, p + i, k));
        } else {
            unsigned char enc[4];
            size_t el = zi_utf8_encode(m, enc);
            TRY(ct_buf_add(&b, (const char *)enc, el));
        }
        i += k;
    }
    return ct_buf_value(&b, out);
}

/* str.replace(old, new[, count]) with Python's rule for an empty `old`
 * (insert `new` before every character and at the end). */
static int replace(ct_ctx *c, size_t off, const ct_value *s, const ct_value *old,
                   const ct_value *new_, int64_t count, ct_value *out) {
    ct_buf b;
    ct_buf_init(&b, c, 0, 0);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    int64_t done = 0;
    if (old->u.s.n == 0) {
        while (count < 0 || done < count) {
            TRY(ct_buf_add(&b, new_->u.s.p, new_->u.s.n));
            done++;
            if (i >= n) break;
            size_t k = u8_len((unsigned char)p[i]);
            TRY(ct_buf_add(&b, p + i, k));
            i += k;
        }
        TRY(ct_buf_add(&b, p + i, n - i));
        return ct_buf_value(&b, out);
    }
    TRY(ct_charge(c, off, n / 64 + 1));
    while (count < 0 || done < count) {
        const char *hit = memfind(p + i, n - i, old->u.s.p, old->u.s.n);
        if (!hit) break;
        size_t at = (size_t)(hit - p);
        TRY(ct_buf_add(&b, p + i, at - i));
        TRY(ct_buf_add(&b, new_->u.s.p, new_->u.s.n));
        i = at + old->u.s.n;
        done++;
    }
    TRY(ct_buf_add(&b, p + i, n - i));
    return ct_buf_value(&b, out);
}

static int split(ct_ctx *c, size_t off, const ct_value *s, const ct_value *sep, int64_t maxsplit,
                 ct_value *out) {
    ct_list *l = ct_list_new(c, 0);
    if (!l) return ct_oom(c, off);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    TRY(ct_charge(c, off, n / 64 + 1));
    if (!sep) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            while (i < n) { /* skip whitespace */
                size_t k;
                if (!ct_is_space(u8_get(p + i, n - i, &k))) break;
                i += k;
            }
            if (i >= n) break;
            size_t j = i;
            if (maxsplit >= 0 && done >= maxsplit) {
                /* The rest, without trailing whitespace. */
                ct_value r = strip(&(ct_value){.t = CT_V_STR, .u.s = {p + i, n - i}}, NULL, 0, 1);
                if (ct_list_push(c, l, r)) return ct_oom(c, off);
                break;
            }
            while (j < n) {
                size_t k;
                if (ct_is_space(u8_get(p + j, n - j, &k))) break;
                j += k;
            }
            if (ct_list_push(c, l, ct_str_ref(p + i, j - i))) return ct_oom(c, off);
            done++;
            i = j;
        }
    } else {
        if (sep->u.s.n == 0) return ct_fail(c, off, ZI_EINVAL, "empty separator");
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || done < maxsplit)
                                  ? memfind(p + i, n - i, sep->u.s.p, sep->u.s.n)
                                  : NULL;
            if (!hit) {
                if (ct_list_push(c, l, ct_str_ref(p + i, n - i))) return ct_oom(c, off);
                break;
            }
            size_t at = (size_t)(hit - p);
            if (ct_list_push(c, l, ct_str_ref(p + i, at - i))) return ct_oom(c, off);
            i = at + sep->u.s.n;
            done++;
        }
    }
    *out = seq_value(CT_V_LIST, l);
    return ZI_OK;
}

/* Joins str() of every item with sep. */
static int join_items(ct_ctx *c, size_t off, const ct_value *items, size_t n, const char *sep,
                      size_t seplen, ct_value *out) {
    ct_buf b;
    ct_buf_init(&b, c, 0, 0);
    for (size_t i = 0; i < n; i++) {
        if (i) TRY(ct_buf_add(&b, sep, seplen));
        TRY(ct_to_str(c, off, &items[i], &b));
    }
    return ct_buf_value(&b, out);
}

static int affix(ct_ctx *c, size_t off, const ct_value *s, const ct_value *arg, int suffix,
                 int *r) {
    const ct_value *cands = arg;
    size_t nc = 1;
    if (arg->t == CT_V_TUPLE) {
        cands = arg->u.l->v;
        nc = arg->u.l->n;
    }
    *r = 0;
    for (size_t i = 0; i < nc; i++) {
        TRY(need_str(c, off, suffix ? "endswith argument" : "startswith argument", &cands[i]));
        size_t k = cands[i].u.s.n;
        if (k <= s->u.s.n && memcmp(s->u.s.p + (suffix ? s->u.s.n - k : 0), cands[i].u.s.p, k) == 0)
            *r = 1;
    }
    return ZI_OK;
}

static int list_of(ct_ctx *c, size_t off, const ct_value *v, ct_value *out) {
    const ct_value *items;
    size_t n;
    TRY(ct_iterate(c, off, v, &items, &n));
    ct_list *l = ct_list_new(c, n);
    if (!l) return ct_oom(c, off);
    if (n) memcpy(l->v, items, n * sizeof *items);
    l->n = n;
    *out = seq_value(CT_V_LIST, l);
    return ZI_OK;
}

static int items_of(ct_ctx *c, size_t off, const ct_dict *d, ct_value *out) {
    ct_list *l = ct_list_new(c, d->n);
    if (!l) return ct_oom(c, off);
    for (size_t i = 0; i < d->n; i++) {
        ct_list *pair = ct_list_new(c, 2);
        if (!pair) return ct_oom(c, off);
        pair->v[0] = d->k[i];
        pair->v[1] = d->v[i];
        pair->n = 2;
        l->v[l->n++] = seq_value(CT_V_TUPLE, pair);
    }
    *out = seq_value(CT_V_LIST, l);
    return ZI_OK;
}

/* ---- functions and methods ----------------------------------------------- */

static int strftime_now(ct_ctx *c, size_t off, const ct_value *fmt, ct_value *out) {
    char f[256], res[512];
    if (fmt->u.s.n >= sizeof f || memchr(fmt->u.s.p, '\0', fmt->u.s.n))
        return ct_fail(c, off, ZI_EINVAL, "strftime_now: unusable format");
    memcpy(f, fmt->u.s.p, fmt->u.s.n);
    f[fmt->u.s.n] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm)) return ct_fail(c, off, ZI_EINVAL, "strftime_now: no local time");
    size_t k = strftime(res, sizeof res, f, &tm);
    char *p = ct_alloc(&c->arena, k + 1);
    if (!p) return ct_oom(c, off);
    memcpy(p, res, k);
    *out = ct_str_ref(p, k);
    return ZI_OK;
}

/* namespace(...) and dict(...): an optional mapping plus keyword args. */
static int make_mapping(ct_ctx *c, size_t off, int type, const char *fname, const ct_value *args,
                        size_t nargs, const ct_kwarg *kw, size_t nkw, ct_value *out) {
    if (nargs > 1)
        return ct_fail(c, off, ZI_EINVAL, "%s() takes at most 1 positional argument", fname);
    size_t total = nkw + (nargs && args[0].t == CT_V_DICT ? args[0].u.d->n : 0);
    TRY(ct_charge(c, off, total * total / 8 + 1));
    ct_dict *d = ct_dict_new(c, total);
    if (!d) return ct_oom(c, off);
    if (nargs) {
        if (args[0].t != CT_V_DICT)
            return ct_fail(c, off, ZI_EUNSUPPORTED, "%s() only takes a mapping as its argument",
                           fname);
        for (size_t i = 0; i < args[0].u.d->n; i++)
            if (ct_dict_set(c, d, args[0].u.d->k[i], args[0].u.d->v[i])) return ct_oom(c, off);
    }
    for (size_t k = 0; k < nkw; k++)
        if (ct_dict_set(c, d, ct_str_ref(kw[k].name, kw[k].len), kw[k].v)) return ct_oom(c, off);
    *out = map_value(type, d);
    return ZI_OK;
}

#define RANGE_MAX 100000 /* jinja2's sandbox refuses longer ranges too */

static int range_fn(ct_ctx *c, size_t off, const ct_value *args, size_t nargs, ct_value *out) {
    if (nargs < 1 || nargs > 3)
        return ct_fail(c, off, ZI_EINVAL, "range expected 1 to 3 arguments, got %zu", nargs);
    for (size_t i = 0; i < nargs; i++) TRY(need_int(c, off, "range argument", &args[i]));
    int64_t a = 0, b, s = 1;
    if (nargs == 1)
        b = args[0].u.i;
    else {
        a = args[0].u.i;
        b = args[1].u.i;
        if (nargs == 3) s = args[2].u.i;
    }
    if (s == 0) return ct_fail(c, off, ZI_EINVAL, "range() arg 3 must not be zero");
    /* Count in 128 bits-free form: both bounds are int64, so use doubles
     * only to reject huge spans before the exact computation. */
    double span =
        s > 0 ? ((double)b - (double)a) / (double)s : ((double)a - (double)b) / (double)-s;
    if (span > RANGE_MAX + 1)
        return ct_fail(c, off, ZI_ERANGE, "range too big (more than %d items)", RANGE_MAX);
    int64_t count = 0;
    if (s > 0 && a < b) count = (b - a - 1) / s + 1;
    if (s < 0 && b < a) count = (a - b - 1) / (-s) + 1;
    if (count > RANGE_MAX)
        return ct_fail(c, off, ZI_ERANGE, "range too big (more than %d items)", RANGE_MAX);
    TRY(ct_charge(c, off, (size_t)count / 8 + 1));
    ct_list *l = ct_list_new(c, (size_t)count);
    if (!l) return ct_oom(c, off);
    for (int64_t k = 0; k < count; k++) l->v[l->n++] = ct_int(a + k * s);
    l->r_start = a;
    l->r_stop = b;
    l->r_step = s;
    *out = gen_value(l, CT_SEQ_RANGE);
    return ZI_OK;
}

int ct_call_func(ct_ctx *c, size_t off, const ct_func *f, const ct_value *args, size_t nargs,
                 const ct_kwarg *kw, size_t nkw, ct_value *out) {
    const ct_value *self = &f->self;
    const ct_value *a[3];
    switch (f->id) {
    case CT_F_RANGE:
        if (nkw) return ct_fail(c, off, ZI_EINVAL, "range() takes no keyword arguments");
        return range_fn(c, off, args, nargs, out);
    case CT_F_NAMESPACE:
        return make_mapping(c, off, CT_V_NS, "namespace", args, nargs, kw, nkw, out);
    case CT_F_DICT:
        return make_mapping(c, off, CT_V_DICT, "dict", args, nargs, kw, nkw, out);
    case CT_F_RAISE: {
        static const char *const p[] = {"message"};
        TRY(bind(c, off, "raise_exception", p, 1, args, nargs, kw, nkw, a));
        ct_value msg = ct_str_ref("", 0);
        if (a[0]) TRY(ct_str_of(c, off, a[0], &msg));
        /* Exactly the template's message: it is meant for the client. A
         * long one is cut at a character boundary so it stays UTF-8. */
        size_t n = msg.u.s.n;
        if (n > ZI_ERROR_MSG_MAX - 1) {
            n = ZI_ERROR_MSG_MAX - 1;
            while (n > 0 && ((unsigned char)msg.u.s.p[n] & 0xC0) == 0x80) n--;
        }
        return zi_error_set(c->err, ZI_EINVAL, "%.*s", (int)n, msg.u.s.p);
    }
    case CT_F_STRFTIME: {
        static const char *const p[] = {"format"};
        TRY(bind(c, off, "strftime_now", p, 1, args, nargs, kw, nkw, a));
        if (!a[0]) return ct_fail(c, off, ZI_EINVAL, "strftime_now() needs a format");
        TRY(need_str(c, off, "strftime_now format", a[0]));
        return strftime_now(c, off, a[0], out);
    }
    case CT_F_STRIP:
    case CT_F_LSTRIP:
    case CT_F_RSTRIP: {
        static const char *const p[] = {"chars"};
        TRY(bind(c, off, "strip", p, 1, args, nargs, kw, nkw, a));
        const ct_value *chars = a[0] && a[0]->t != CT_V_NONE ? a[0] : NULL;
        if (chars) TRY(need_str(c, off, "strip argument", chars));
        *out = strip(self, chars, f->id != CT_F_RSTRIP, f->id != CT_F_LSTRIP);
        return ZI_OK;
    }
    case CT_F_LOWER:
    case CT_F_UPPER:
    case CT_F_TITLE:
    case CT_F_CAPITALIZE:
        TRY(bind(c, off, "str method", NULL, 0, args, nargs, kw, nkw, a));
        return change_case(c, self,
                           f->id == CT_F_LOWER   ? CASE_LOWER
                           : f->id == CT_F_UPPER ? CASE_UPPER
                           : f->id == CT_F_TITLE ? CASE_PYTITLE
                                                 : CASE_CAPITALIZE,
                           out);
    case CT_F_STARTSWITH:
    case CT_F_ENDSWITH: {
        static const char *const p[] = {"prefix"};
        TRY(bind(c, off, f->id == CT_F_STARTSWITH ? "startswith" : "endswith", p, 1, args, nargs,
                 kw, nkw, a));
        if (!a[0]) return ct_fail(c, off, ZI_EINVAL, "startswith/endswith need an argument");
        int r;
        TRY(affix(c, off, self, a[0], f->id == CT_F_ENDSWITH, &r));
        *out = ct_bool(r);
        return ZI_OK;
    }
    case CT_F_REPLACE: {
        static const char *const p[] = {"old", "new", "count"};
        TRY(bind(c, off, "replace", p, 3, args, nargs, kw, nkw, a));
        if (!a[0] || !a[1]) return ct_fail(c, off, ZI_EINVAL, "replace() needs old and new");
        TRY(need_str(c, off, "replace argument", a[0]));
        TRY(need_str(c, off, "replace argument", a[1]));
        if (a[2]) TRY(need_int(c, off, "replace count", a[2]));
        return replace(c, off, self, a[0], a[1], a[2] ? a[2]->u.i : -1, out);
    }
    case CT_F_SPLIT: {
        static const char *const p[] = {"sep", "maxsplit"};
        TRY(bind(c, off, "split", p, 2, args, nargs, kw, nkw, a));
        const ct_value *sep = a[0] && a[0]->t != CT_V_NONE ? a[0] : NULL;
        if (sep) TRY(need_str(c, off, "split separator", sep));
        if (a[1]) TRY(need_int(c, off, "split maxsplit", a[1]));
        return split(c, off, self, sep, a[1] ? a[1]->u.i : -1, out);
    }
    case CT_F_JOIN: {
        static const char *const p[] = {"iterable"};
        TRY(bind(c, off, "join", p, 1, args, nargs, kw, nkw, a));
        if (!a[0]) return ct_fail(c, off, ZI_EINVAL, "join() needs an argument");
        const ct_value *items;
        size_t n;
        TRY(ct_iterate(c, off, a[0], &items, &n));
        for (size_t i = 0; i < n; i++)
            if (items[i].t != CT_V_STR)
                return ct_fail(c, off, ZI_EINVAL,
                               "sequence item %zu: expected str instance, %s found", i,
                               tname(&items[i]));
        return join_items(c, off, items, n, self->u.s.p, self->u.s.n, out);
    }
    case CT_F_FIND:
    case CT_F_COUNT: {
        static const char *const p[] = {"sub"};
        TRY(bind(c, off, f->id == CT_F_FIND ? "find" : "count", p, 1, args, nargs, kw, nkw, a));
        if (!a[0]) return ct_fail(c, off, ZI_EINVAL, "find/count need an argument");
        TRY(need_str(c, off, "find/count argument", a[0]));
        TRY(ct_charge(c, off, self->u.s.n / 64 + 1));
        const char *h = self->u.s.p;
        size_t n = self->u.s.n, sn = a[0]->u.s.n;
        if (f->id == CT_F_FIND) {
            const char *hit = memfind(h, n, a[0]->u.s.p, sn);
            *out = ct_int(hit ? (int64_t)u8_count(h, (size_t)(hit - h)) : -1);
            return ZI_OK;
        }
        int64_t cnt = 0;
        if (sn == 0)
            cnt = (int64_t)u8_count(h, n) + 1;
        else
            for (size_t i = 0;;) {
                const char *hit = memfind(h + i, n - i, a[0]->u.s.p, sn);
                if (!hit) break;
                cnt++;
                i = (size_t)(hit - h) + sn;
            }
        *out = ct_int(cnt);
        return ZI_OK;
    }
    case CT_F_ITEMS:
        TRY(bind(c, off, "items", NULL, 0, args, nargs, kw, nkw, a));
        TRY(items_of(c, off, self->u.d, out));
        out->uk = CT_SEQ_ITEMS;
        return ZI_OK;
    case CT_F_KEYS:
    case CT_F_VALUES: {
        TRY(bind(c, off, "keys", NULL, 0, args, nargs, kw, nkw, a));
        const ct_dict *d = self->u.d;
        ct_list *l = ct_list_new(c, d->n);
        if (!l) return ct_oom(c, off);
        if (d->n) memcpy(l->v, f->id == CT_F_KEYS ? d->k : d->v, d->n * sizeof *l->v);
        l->n = d->n;
        *out = gen_value(l, f->id == CT_F_KEYS ? CT_SEQ_KEYS : CT_SEQ_VALUES);
        return ZI_OK;
    }
    case CT_F_GET: {
        static const char *const p[] = {"key", "default"};
        TRY(bind(c, off, "get", p, 2, args, nargs, kw, nkw, a));
        if (!a[0]) return ct_fail(c, off, ZI_EINVAL, "get() needs a key");
        ct_value *v = dict_get(c, self->u.d, a[0]);
        *out = v ? *v : a[1] ? *a[1] : ct_none();
        return ZI_OK;
    }
    case CT_F_CYCLE:
        if (nargs == 0) return ct_fail(c, off, ZI_EINVAL, "no items for cycling given");
        *out = args[self->u.loop->i % nargs];
        return ZI_OK;
    }
    return ct_fail(c, off, ZI_EUNSUPPORTED, "unknown function");
}

/* ---- tests -------------------------------------------------------------- */

enum {
    T_BOOLEAN,
    T_CALLABLE,
    T_DEFINED,
    T_DIVISIBLEBY,
    T_EQ,
    T_EVEN,
    T_FALSE,
    T_FLOAT,
    T_GE,
    T_GT,
    T_IN,
    T_INTEGER,
    T_ITERABLE,
    T_LE,
    T_LOWER,
    T_LT,
    T_MAPPING,
    T_NE,
    T_NONE,
    T_NUMBER,
    T_ODD,
    T_SAMEAS,
    T_SEQUENCE,
    T_STRING,
    T_TRUE,
    T_UNDEFINED,
    T_UPPER,
};

static const struct {
    const char *name;
    int id;
} tests[] = {
    {"boolean", T_BOOLEAN},
    {"callable", T_CALLABLE},
    {"defined", T_DEFINED},
    {"divisibleby", T_DIVISIBLEBY},
    {"eq", T_EQ},
    {"equalto", T_EQ},
    {"==", T_EQ},
    {"even", T_EVEN},
    {"false", T_FALSE},
    {"float", T_FLOAT},
    {"ge", T_GE},
    {">=", T_GE},
    {"gt", T_GT},
    {"greaterthan", T_GT},
    {">", T_GT},
    {"in", T_IN},
    {"integer", T_INTEGER},
    {"iterable", T_ITERABLE},
    {"le", T_LE},
    {"<=", T_LE},
    {"lower", T_LOWER},
    {"lt", T_LT},
    {"lessthan", T_LT},
    {"<", T_LT},
    {"mapping", T_MAPPING},
    {"ne", T_NE},
    {"!=", T_NE},
    {"none", T_NONE},
    {"number", T_NUMBER},
    {"odd", T_ODD},
    {"sameas", T_SAMEAS},
    {"sequence", T_SEQUENCE},
    {"string", T_STRING},
    {"true", T_TRUE},
    {"undefined", T_UNDEFINED},
    {"upper", T_UPPER},
};

int ct_test_id(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (name_eq(name, n, tests[i].name)) return tests[i].id;
    return -1;
}

/* str.islower / str.isupper: some cased character, none of the other case. */
static int case_test(ct_ctx *c, const ct_value *s, int upper) {
    int cased = 0;
    for (size_t i = 0; i < s->u.s.n;) {
        size_t k;
        int kind = case_kind(c, u8_get(s->u.s.p + i, s->u.s.n - i, &k));
        if (kind == (upper ? 1 : 2)) return 0;
        if (kind) cased = 1;
        i += k;
    }
    return cased;
}

int ct_apply_test(ct_ctx *c, size_t off, int id, const char *name, size_t nlen, const ct_value *v,
                  const ct_value *args, size_t nargs, const ct_kwarg *kw, size_t nkw, int *result) {
    static const char *const p1[] = {"other"};
    const ct_value *a[1] = {NULL};
    if (id < 0)
        return ct_fail(c, off, ZI_EUNSUPPORTED, "no test named '%.*s'",
                       (int)(nlen > 60 ? 60 : nlen), name);
    int takes_arg = id == T_DIVISIBLEBY || id == T_EQ || id == T_NE || id == T_LT || id == T_LE ||
                    id == T_GT || id == T_GE || id == T_IN || id == T_SAMEAS;
    TRY(bind(c, off, "test", p1, takes_arg ? 1 : 0, args, nargs, kw, nkw, a));
    if (takes_arg && !a[0]) return ct_fail(c, off, ZI_EINVAL, "this test needs an argument");
    int r = 0;
    switch (id) {
    case T_BOOLEAN:
        r = v->t == CT_V_BOOL;
        break;
    case T_CALLABLE:
        r = v->t == CT_V_FUNC || v->t == CT_V_MACRO || v->t == CT_V_UNDEF;
        break;
    case T_DEFINED:
        r = v->t != CT_V_UNDEF;
        break;
    case T_UNDEFINED:
        r = v->t == CT_V_UNDEF;
        break;
    case T_DIVISIBLEBY: {
        ct_value m;
        TRY(ct_binop(c, off, CT_OP_MOD, v, a[0], &m));
        r = !ct_truthy(&m);
        break;
    }
    case T_EVEN:
    case T_ODD: {
        ct_value two = ct_int(2), m;
        TRY(ct_binop(c, off, CT_OP_MOD, v, &two, &m));
        ct_value want = ct_int(id == T_ODD);
        r = ct_equal(c, &m, &want);
        break;
    }
    case T_EQ:
        TRY(ct_compare(c, off, CT_CMP_EQ, v, a[0], &r));
        break;
    case T_NE:
        TRY(ct_compare(c, off, CT_CMP_NE, v, a[0], &r));
        break;
    case T_LT:
        TRY(ct_compare(c, off, CT_CMP_LT, v, a[0], &r));
        break;
    case T_LE:
        TRY(ct_compare(c, off, CT_CMP_LE, v, a[0], &r));
        break;
    case T_GT:
        TRY(ct_compare(c, off, CT_CMP_GT, v, a[0], &r));
        break;
    case T_GE:
        TRY(ct_compare(c, off, CT_CMP_GE, v, a[0], &r));
        break;
    case T_IN:
        TRY(ct_compare(c, off, CT_CMP_IN, v, a[0], &r));
        break;
    case T_FALSE:
        r = v->t == CT_V_BOOL && !v->u.i;
        break;
    case T_TRUE:
        r = v->t == CT_V_BOOL && v->u.i;
        break;
    case T_FLOAT:
        r = v->t == CT_V_FLOAT;
        break;
    case T_INTEGER:
        r = v->t == CT_V_INT;
        break;
    case T_NUMBER:
        r = is_num(v);
        break;
    case T_ITERABLE:
        r = v->t == CT_V_LIST || v->t == CT_V_TUPLE || v->t == CT_V_DICT || v->t == CT_V_STR ||
            v->t == CT_V_UNDEF || v->t == CT_V_LOOP;
        break;
    case T_SEQUENCE:
        r = is_plain_seq(v) || v->t == CT_V_DICT || v->t == CT_V_STR || v->t == CT_V_UNDEF;
        break;
    case T_MAPPING:
        r = v->t == CT_V_DICT;
        break;
    case T_NONE:
        r = v->t == CT_V_NONE;
        break;
    case T_STRING:
        r = v->t == CT_V_STR;
        break;
    case T_LOWER:
    case T_UPPER: {
        ct_value s;
        TRY(ct_str_of(c, off, v, &s));
        r = case_test(c, &s, id == T_UPPER);
        break;
    }
    case T_SAMEAS:
        if (v->t != a[0]->t)
            r = 0;
        else if (v->t == CT_V_NONE || v->t == CT_V_UNDEF)
            r = v->t == CT_V_NONE;
        else if (v->t == CT_V_BOOL)
            r = v->u.i == a[0]->u.i;
        else if (v->t == CT_V_INT)
            r = v->u.i == a[0]->u.i && v->u.i >= -5 && v->u.i <= 256;
        else if (v->t == CT_V_STR)
            r = v->u.s.p == a[0]->u.s.p && v->u.s.n == a[0]->u.s.n;
        else if (v->t == CT_V_LIST || v->t == CT_V_TUPLE)
            r = v->u.l == a[0]->u.l;
        else if (v->t == CT_V_DICT || v->t == CT_V_NS)
            r = v->u.d == a[0]->u.d;
        else
            r = ct_equal(c, v, a[0]);
        break;
    }
    *result = r;
    return ZI_OK;
}

/* ---- filters ------------------------------------------------------------ */

enum {
    F_ABS,
    F_CAPITALIZE,
    F_DEFAULT,
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
    F_UPPER,
};

static const struct {
    const char *name;
    int id;
} filters[] = {
    {"abs", F_ABS},
    {"capitalize", F_CAPITALIZE},
    {"count", F_LENGTH},
    {"d", F_DEFAULT},
    {"default", F_DEFAULT},
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
    {"upper", F_UPPER},
};

int ct_filter_id(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (name_eq(name, n, filters[i].name)) return filters[i].id;
    return -1;
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

/* select / reject / selectattr / rejectattr. */
static int select_filter(ct_ctx *c, size_t off, const ct_value *seq, const ct_value *args,
                         size_t nargs, const ct_kwarg *kw, size_t nkw, int by_attr, int keep,
                         ct_value *out) {
    (void)kw;
    if (nkw) return ct_fail(c, off, ZI_EUNSUPPORTED, "keyword arguments to select/reject");
    const ct_value *attr = NULL;
    if (by_attr) {
        if (nargs < 1) return ct_fail(c, off, ZI_EINVAL, "missing parameter for attribute name");
        attr = &args[0];
        args++;
        nargs--;
    }
    int test = -2; /* -2: truthiness */
    const char *tname = "";
    size_t tlen = 0;
    if (nargs) {
        TRY(need_str(c, off, "test name", &args[0]));
        tname = args[0].u.s.p;
        tlen = args[0].u.s.n;
        test = ct_test_id(tname, tlen);
        args++;
        nargs--;
    }
    const ct_value *items;
    size_t n;
    TRY(ct_iterate(c, off, seq, &items, &n));
    ct_list *l = ct_list_new(c, n);
    if (!l) return ct_oom(c, off);
    for (size_t i = 0; i < n; i++) {
        TRY(ct_charge(c, off, 1));
        ct_value x = items[i];
        if (attr) TRY(attr_path(c, off, &items[i], attr, &x));
        int r;
        if (test == -2)
            r = ct_truthy(&x);
        else
            TRY(ct_apply_test(c, off, test, tname, tlen, &x, args, nargs, NULL, 0, &r));
        if (r == keep) l->v[l->n++] = items[i];
    }
    *out = seq_value(CT_V_LIST, l);
    return ZI_OK;
}

static int map_filter(ct_ctx *c, size_t off, const ct_value *seq, const ct_value *args,
                      size_t nargs, const ct_kwarg *kw, size_t nkw, ct_value *out) {
    const ct_value *attr = NULL, *dflt = NULL;
    for (size_t k = 0; k < nkw; k++) {
        if (name_eq(kw[k].name, kw[k].len, "attribute"))
            attr = &kw[k].v;
        else if (name_eq(kw[k].name, kw[k].len, "default"))
            dflt = &kw[k].v;
        else
            return ct_fail(c, off, ZI_EINVAL, "map: unexpected keyword argument '%.*s'",
                           (int)kw[k].len, kw[k].name);
    }
    int fid = -1;
    const char *fname = NULL;
    size_t flen = 0;
    if (!attr) {
        if (nargs < 1) return ct_fail(c, off, ZI_EINVAL, "map requires a filter argument");
        TRY(need_str(c, off, "filter name", &args[0]));
        fname = args[0].u.s.p;
        flen = args[0].u.s.n;
        fid = ct_filter_id(fname, flen);
        args++;
        nargs--;
    }
    const ct_value *items;
    size_t n;
    TRY(ct_iterate(c, off, seq, &items, &n));
    ct_list *l = ct_list_new(c, n);
    if (!l) return ct_oom(c, off);
    for (size_t i = 0; i < n; i++) {
        TRY(ct_charge(c, off, 1));
        ct_value x;
        if (attr) {
            TRY(attr_path(c, off, &items[i], attr, &x));
            if (x.t == CT_V_UNDEF && dflt) x = *dflt;
        } else {
            TRY(ct_apply_filter(c, off, fid, fname, flen, &items[i], args, nargs, NULL, 0, &x));
        }
        l->v[l->n++] = x;
    }
    *out = seq_value(CT_V_LIST, l);
    return ZI_OK;
}

static int is_digit_c(char ch) {
    return ch >= '0' && ch <= '9';
}

/* Python float() of a string: optional whitespace, sign, digits with
 * single underscores between them, fraction, exponent, inf/nan. */
static int parse_float(const ct_value *s, double *out) {
    ct_value t = strip(s, NULL, 1, 1);
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
        TRY(need_int(c, off, "int base", base));
        b = (int)base->u.i;
        if (b != 0 && (b < 2 || b > 36))
            return ct_fail(c, off, ZI_EINVAL, "int() base must be >= 2 and <= 36, or 0");
    }
    if (is_intlike(v)) {
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
        ct_value t = strip(v, NULL, 1, 1);
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

static int html_escape(ct_ctx *c, size_t off, const ct_value *v, ct_value *out) {
    ct_value s;
    TRY(ct_str_of(c, off, v, &s));
    ct_buf b;
    ct_buf_init(&b, c, 0, 0);
    for (size_t i = 0; i < s.u.s.n; i++) {
        char ch = s.u.s.p[i];
        switch (ch) {
        case '&':
            TRY(buf_addz(&b, "&amp;"));
            break;
        case '<':
            TRY(buf_addz(&b, "&lt;"));
            break;
        case '>':
            TRY(buf_addz(&b, "&gt;"));
            break;
        case '"':
            TRY(buf_addz(&b, "&#34;"));
            break;
        case '\'':
            TRY(buf_addz(&b, "&#39;"));
            break;
        default:
            TRY(buf_addc(&b, ch));
        }
    }
    return ct_buf_value(&b, out);
}

/* Python's str.splitlines boundaries. */
static size_t line_break_len(const char *p, size_t n, size_t i) {
    unsigned char ch = (unsigned char)p[i];
    if (ch == '\r') return (i + 1 < n && p[i + 1] == '\n') ? 2 : 1;
    if (ch == '\n' || ch == '\v' || ch == '\f' || (ch >= 0x1C && ch <= 0x1E)) return 1;
    if (ch >= 0x80) {
        size_t k;
        uint32_t cp = u8_get(p + i, n - i, &k);
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
            TRY(need_int(c, off, "indent width", width));
            w = width->u.i;
        }
        if (w > 4096) return ct_fail(c, off, ZI_ERANGE, "indent width too large");
        for (int64_t i = 0; i < w; i++) TRY(buf_addc(&ind, ' '));
    }
    int do_first = first && ct_truthy(first), do_blank = blank && ct_truthy(blank);
    /* Lines as splitlines() gives them, after appending "\n" as jinja2 does. */
    ct_buf src;
    ct_buf_init(&src, c, 0, 0);
    TRY(ct_buf_add(&src, s.u.s.p, s.u.s.n));
    TRY(buf_addc(&src, '\n'));
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
            TRY(buf_addc(&b, '\n'));
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
        TRY(change_case(s->c, a, CASE_LOWER, &la));
        TRY(change_case(s->c, b, CASE_LOWER, &lb));
        return less(s->c, s->off, &la, &lb, "<", lt);
    }
    return less(s->c, s->off, a, b, "<", lt);
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
    *out = seq_value(CT_V_LIST, l);
    return ZI_OK;
}

static int tojson_filter(ct_ctx *c, size_t off, const ct_value *v, const ct_value **a,
                         ct_value *out) {
    /* Hugging Face's: tojson(x, ensure_ascii=False, indent=None,
     * separators=None, sort_keys=False) = json.dumps(...). */
    json_opts o = {0};
    o.ensure_ascii = a[0] && ct_truthy(a[0]);
    o.sort_keys = a[3] && ct_truthy(a[3]);
    ct_buf ind;
    ct_buf_init(&ind, c, 0, 0);
    if (a[1] && a[1]->t != CT_V_NONE) {
        o.pretty = 1;
        if (a[1]->t == CT_V_STR)
            TRY(ct_buf_add(&ind, a[1]->u.s.p, a[1]->u.s.n));
        else {
            TRY(need_int(c, off, "tojson indent", a[1]));
            if (a[1]->u.i > 4096) return ct_fail(c, off, ZI_ERANGE, "tojson indent too large");
            for (int64_t i = 0; i < a[1]->u.i; i++) TRY(buf_addc(&ind, ' '));
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
    TRY(json_dump(c, off, v, &b, &o, 0));
    return ct_buf_value(&b, out);
}

static int empty_generator(ct_ctx *c, size_t off, ct_value *out) {
    ct_list *l = ct_list_new(c, 0);
    if (!l) return ct_oom(c, off);
    *out = gen_value(l, CT_SEQ_GEN);
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
        *out = gen_value(l, CT_SEQ_GEN);
        return ZI_OK;
    }
    out->t = CT_V_LIST;
    out->uk = CT_SEQ_GEN;
    return ZI_OK;
}

int ct_apply_filter(ct_ctx *c, size_t off, int id, const char *name, size_t nlen, const ct_value *v,
                    const ct_value *args, size_t nargs, const ct_kwarg *kw, size_t nkw,
                    ct_value *out) {
    const ct_value *a[4] = {NULL, NULL, NULL, NULL};
    ct_value s;
    switch (id) {
    case F_ABS:
        TRY(bind(c, off, "abs", NULL, 0, args, nargs, kw, nkw, a));
        if (v->t == CT_V_FLOAT)
            *out = ct_float(fabs(v->u.f));
        else if (is_intlike(v)) {
            if (v->u.i == INT64_MIN) return int_overflow(c, off);
            *out = ct_int(v->u.i < 0 ? -v->u.i : v->u.i);
        } else if (v->t == CT_V_UNDEF)
            return ct_undefined_error(c, off, v);
        else
            return ct_fail(c, off, ZI_EINVAL, "bad operand type for abs(): '%s'", tname(v));
        return ZI_OK;
    case F_CAPITALIZE:
    case F_LOWER:
    case F_UPPER:
    case F_TITLE:
        TRY(bind(c, off, name, NULL, 0, args, nargs, kw, nkw, a));
        TRY(ct_str_of(c, off, v, &s));
        return change_case(c, &s,
                           id == F_LOWER   ? CASE_LOWER
                           : id == F_UPPER ? CASE_UPPER
                           : id == F_TITLE ? CASE_JINJATITLE
                                           : CASE_CAPITALIZE,
                           out);
    case F_DEFAULT: {
        static const char *const p[] = {"default_value", "boolean"};
        TRY(bind(c, off, "default", p, 2, args, nargs, kw, nkw, a));
        int use = v->t == CT_V_UNDEF || (a[1] && ct_truthy(a[1]) && !ct_truthy(v));
        *out = use ? (a[0] ? *a[0] : ct_str_ref("", 0)) : *v;
        return ZI_OK;
    }
    case F_ESCAPE:
        TRY(bind(c, off, "escape", NULL, 0, args, nargs, kw, nkw, a));
        return html_escape(c, off, v, out);
    case F_FIRST:
    case F_LAST: {
        TRY(bind(c, off, name, NULL, 0, args, nargs, kw, nkw, a));
        if (id == F_LAST && is_iter(v)) /* last() needs reversed() */
            return ct_fail(c, off, ZI_EINVAL, "'%s' object is not reversible", tname(v));
        const ct_value *items;
        size_t n;
        TRY(ct_iterate(c, off, v, &items, &n));
        *out = n ? items[id == F_FIRST ? 0 : n - 1] : ct_undef();
        return ZI_OK;
    }
    case F_FLOAT: {
        static const char *const p[] = {"default"};
        TRY(bind(c, off, "float", p, 1, args, nargs, kw, nkw, a));
        if (v->t == CT_V_UNDEF) return ct_undefined_error(c, off, v);
        double f;
        if (is_num(v))
            *out = ct_float(as_double(v));
        else if (v->t == CT_V_STR && parse_float(v, &f) == 0)
            *out = ct_float(f);
        else
            *out = a[0] ? *a[0] : ct_float(0.0);
        return ZI_OK;
    }
    case F_INT: {
        static const char *const p[] = {"default", "base"};
        TRY(bind(c, off, "int", p, 2, args, nargs, kw, nkw, a));
        if (v->t == CT_V_UNDEF) return ct_undefined_error(c, off, v);
        return int_filter(c, off, v, a[0], a[1], out);
    }
    case F_INDENT: {
        static const char *const p[] = {"width", "first", "blank"};
        TRY(bind(c, off, "indent", p, 3, args, nargs, kw, nkw, a));
        return indent_filter(c, off, v, a[0], a[1], a[2], out);
    }
    case F_ITEMS: {
        int rc = bind(c, off, "items", NULL, 0, args, nargs, kw, nkw, a);
        if (!rc && v->t == CT_V_UNDEF) {
            ct_list *l = ct_list_new(c, 0);
            if (!l) return ct_oom(c, off);
            *out = seq_value(CT_V_LIST, l);
        } else if (!rc && v->t != CT_V_DICT) {
            rc = ct_fail(c, off, ZI_EINVAL, "Can only get item pairs from a mapping.");
        } else if (!rc) {
            rc = items_of(c, off, v->u.d, out);
        }
        return as_generator(c, rc, out);
    }
    case F_JOIN: {
        static const char *const p[] = {"d", "attribute"};
        TRY(bind(c, off, "join", p, 2, args, nargs, kw, nkw, a));
        ct_value sep = ct_str_ref("", 0), seq = *v;
        if (a[0]) TRY(ct_str_of(c, off, a[0], &sep));
        if (a[1] && a[1]->t != CT_V_NONE) {
            ct_kwarg k = {"attribute", 9, *a[1]};
            TRY(map_filter(c, off, v, NULL, 0, &k, 1, &seq));
        }
        const ct_value *items;
        size_t n;
        TRY(ct_iterate(c, off, &seq, &items, &n));
        return join_items(c, off, items, n, sep.u.s.p, sep.u.s.n, out);
    }
    case F_LENGTH:
        TRY(bind(c, off, "length", NULL, 0, args, nargs, kw, nkw, a));
        switch (v->t) {
        case CT_V_STR:
            TRY(ct_charge(c, off, v->u.s.n / 64 + 1));
            *out = ct_int((int64_t)u8_count(v->u.s.p, v->u.s.n));
            return ZI_OK;
        case CT_V_LIST:
        case CT_V_TUPLE:
            if (is_iter(v))
                return ct_fail(c, off, ZI_EINVAL, "object of type '%s' has no len()", tname(v));
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
            return ct_fail(c, off, ZI_EINVAL, "object of type '%s' has no len()", tname(v));
        }
    case F_LIST:
        TRY(bind(c, off, "list", NULL, 0, args, nargs, kw, nkw, a));
        return list_of(c, off, v, out);
    case F_MAP:
        /* jinja2 looks at neither the arguments nor the items of a falsy value. */
        if (!ct_truthy(v)) return empty_generator(c, off, out);
        return as_generator(c, map_filter(c, off, v, args, nargs, kw, nkw, out), out);
    case F_SELECT:
    case F_REJECT:
    case F_SELECTATTR:
    case F_REJECTATTR:
        if (!ct_truthy(v)) return empty_generator(c, off, out);
        return as_generator(c,
                            select_filter(c, off, v, args, nargs, kw, nkw,
                                          id == F_SELECTATTR || id == F_REJECTATTR,
                                          id == F_SELECT || id == F_SELECTATTR, out),
                            out);
    case F_REPLACE: {
        static const char *const p[] = {"old", "new", "count"};
        TRY(bind(c, off, "replace", p, 3, args, nargs, kw, nkw, a));
        if (!a[0] || !a[1]) return ct_fail(c, off, ZI_EINVAL, "replace needs old and new");
        ct_value o, nw;
        TRY(ct_str_of(c, off, v, &s));
        TRY(ct_str_of(c, off, a[0], &o));
        TRY(ct_str_of(c, off, a[1], &nw));
        if (a[2] && a[2]->t != CT_V_NONE) TRY(need_int(c, off, "replace count", a[2]));
        return replace(c, off, &s, &o, &nw, a[2] && a[2]->t != CT_V_NONE ? a[2]->u.i : -1, out);
    }
    case F_REVERSE:
        TRY(bind(c, off, "reverse", NULL, 0, args, nargs, kw, nkw, a));
        if (v->t == CT_V_STR) {
            ct_value step = ct_int(-1);
            return ct_slice(c, off, v, NULL, NULL, &step, out);
        } else {
            /* reversed(x) where Python has it (an iterator), else a list. */
            int reversible = is_plain_seq(v) || v->t == CT_V_DICT || v->t == CT_V_UNDEF ||
                             (v->t == CT_V_LIST && v->uk >= CT_SEQ_ITEMS && v->uk <= CT_SEQ_VALUES);
            const ct_value *items;
            size_t n;
            TRY(ct_iterate(c, off, v, &items, &n));
            ct_list *l = ct_list_new(c, n);
            if (!l) return ct_oom(c, off);
            for (size_t i = 0; i < n; i++) l->v[l->n++] = items[n - 1 - i];
            *out = gen_value(l, reversible ? CT_SEQ_REVERSED : CT_SEQ_LIST);
            return ZI_OK;
        }
    case F_SAFE:
        TRY(bind(c, off, "safe", NULL, 0, args, nargs, kw, nkw, a));
        return ct_str_of(c, off, v, out);
    case F_SORT: {
        static const char *const p[] = {"reverse", "case_sensitive", "attribute"};
        TRY(bind(c, off, "sort", p, 3, args, nargs, kw, nkw, a));
        return sort_filter(c, off, v, a[0], a[1], a[2], out);
    }
    case F_STRING:
        TRY(bind(c, off, "string", NULL, 0, args, nargs, kw, nkw, a));
        return ct_str_of(c, off, v, out);
    case F_SUM: {
        static const char *const p[] = {"attribute", "start"};
        TRY(bind(c, off, "sum", p, 2, args, nargs, kw, nkw, a));
        const ct_value *items;
        size_t n;
        TRY(ct_iterate(c, off, v, &items, &n));
        ct_value acc = a[1] ? *a[1] : ct_int(0);
        for (size_t i = 0; i < n; i++) {
            ct_value x = items[i];
            if (a[0] && a[0]->t != CT_V_NONE) TRY(attr_path(c, off, &items[i], a[0], &x));
            TRY(ct_binop(c, off, CT_OP_ADD, &acc, &x, &acc));
        }
        *out = acc;
        return ZI_OK;
    }
    case F_TOJSON: {
        static const char *const p[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
        TRY(bind(c, off, "tojson", p, 4, args, nargs, kw, nkw, a));
        return tojson_filter(c, off, v, a, out);
    }
    case F_TRIM: {
        static const char *const p[] = {"chars"};
        TRY(bind(c, off, "trim", p, 1, args, nargs, kw, nkw, a));
        TRY(ct_str_of(c, off, v, &s));
        const ct_value *chars = a[0] && a[0]->t != CT_V_NONE ? a[0] : NULL;
        if (chars) TRY(need_str(c, off, "trim chars", chars));
        *out = strip(&s, chars, 1, 1);
        return ZI_OK;
    }
    default:
        return ct_fail(c, off, ZI_EUNSUPPORTED, "no filter named '%.*s'",
                       (int)(nlen > 60 ? 60 : nlen), name);
    }
}
