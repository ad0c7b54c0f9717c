/*
 * chat_template_ops.c - operators and iteration for the chat-template
 * engine (see chat_template_value.h): + - * / // % ** and ~ with Python's
 * types and overflow rules, unary minus, ordering, `in`, the items a for
 * loop visits, obj.name (methods before dict keys), obj[key] (keys before
 * methods) and slicing, the loop variable's attributes, and the table of
 * builtin globals and methods that attribute lookup binds.
 *
 * String lengths and indices count codepoints; `//` and `%` floor as in
 * Python; an undefined operand is an error.
 */
#include "chat_template_value.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_value_impl.h"

/* ---- arithmetic and comparison -------------------------------------- */

static int type_error2(ct_ctx *c, size_t off, const char *op, const ct_value *a,
                       const ct_value *b) {
    return ct_fail(c, off, ZI_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                   ct_tname(a), ct_tname(b));
}

int ct_int_overflow(ct_ctx *c, size_t off) {
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
    *out = ct_seq_value(a->t, l);
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
    *out = ct_seq_value(seq->t, l);
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
    if (ct_is_num(a) && ct_is_num(b)) {
        int ints = ct_is_intlike(a) && ct_is_intlike(b);
        int64_t x = a->u.i, y = b->u.i, r;
        double fx = ct_as_double(a), fy = ct_as_double(b);
        switch (op) {
        case CT_OP_ADD:
            if (!ints) break;
            if (__builtin_add_overflow(x, y, &r)) return ct_int_overflow(c, off);
            *out = ct_int(r);
            return ZI_OK;
        case CT_OP_SUB:
            if (!ints) break;
            if (__builtin_sub_overflow(x, y, &r)) return ct_int_overflow(c, off);
            *out = ct_int(r);
            return ZI_OK;
        case CT_OP_MUL:
            if (!ints) break;
            if (__builtin_mul_overflow(x, y, &r)) return ct_int_overflow(c, off);
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
                    return ct_int_overflow(c, off);
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
                        if (__builtin_mul_overflow(acc, base, &acc)) return ct_int_overflow(c, off);
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base))
                        return ct_int_overflow(c, off);
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
        if (a->t == CT_V_STR && b->t == CT_V_STR) {
            if (a->ut != CT_STR_MARKUP && b->ut != CT_STR_MARKUP)
                return ct_str_concat(c, off, a, b->u.s.p, b->u.s.n, out);
            /* markupsafe: Markup + str and str + Markup escape the str */
            ct_value ea, eb;
            TRY(ct_html_escape(c, off, a, &ea));
            TRY(ct_html_escape(c, off, b, &eb));
            ea.uk = 0; /* a new string, never grown in place */
            TRY(ct_str_concat(c, off, &ea, eb.u.s.p, eb.u.s.n, out));
            out->ut = CT_STR_MARKUP;
            return ZI_OK;
        }
        if (ct_is_plain_list(a) && a->t == b->t && ct_is_plain_list(b))
            return list_concat(c, off, a, b, out);
        if (a->t == CT_V_STR || ((a->t == CT_V_LIST || a->t == CT_V_TUPLE) && a->uk == 0))
            return ct_fail(c, off, ZI_EINVAL, "can only concatenate %s (not \"%s\") to %s",
                           ct_tname(a), ct_tname(b), ct_tname(a));
        return type_error2(c, off, "+", a, b);
    }
    if (op == CT_OP_MUL) {
        if ((a->t == CT_V_STR || ct_is_plain_list(a)) && ct_is_intlike(b))
            return repeat(c, off, a, b->u.i, out);
        if ((b->t == CT_V_STR || ct_is_plain_list(b)) && ct_is_intlike(a))
            return repeat(c, off, b, a->u.i, out);
    }
    if (op == CT_OP_MOD && a->t == CT_V_STR)
        return ct_fail(c, off, ZI_EUNSUPPORTED, "printf-style string formatting is not supported");
    return type_error2(c, off, names[op], a, b);
}

int ct_negate(ct_ctx *c, size_t off, const ct_value *a, int neg, ct_value *out) {
    if (a->t == CT_V_UNDEF) return ct_undefined_error(c, off, a);
    if (ct_is_intlike(a)) {
        if (neg && a->u.i == INT64_MIN) return ct_int_overflow(c, off);
        *out = ct_int(neg ? -a->u.i : a->u.i);
        return ZI_OK;
    }
    if (a->t == CT_V_FLOAT) {
        *out = ct_float(neg ? -a->u.f : a->u.f);
        return ZI_OK;
    }
    return ct_fail(c, off, ZI_EINVAL, "bad operand type for unary %c: '%s'", neg ? '-' : '+',
                   ct_tname(a));
}

/* Python's a < b; *lt receives the result. */
int ct_less(ct_ctx *c, size_t off, const ct_value *a, const ct_value *b, const char *opname,
            int *lt) {
    if (a->t == CT_V_UNDEF) return ct_undefined_error(c, off, a);
    if (b->t == CT_V_UNDEF) return ct_undefined_error(c, off, b);
    if (ct_is_num(a) && ct_is_num(b)) {
        if (ct_is_intlike(a) && ct_is_intlike(b))
            *lt = a->u.i < b->u.i;
        else
            *lt = ct_as_double(a) < ct_as_double(b);
        return ZI_OK;
    }
    if (a->t == CT_V_STR && b->t == CT_V_STR) {
        TRY(ct_charge(c, off, (a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n) / 64 + 1));
        *lt = ct_str_less(a, b);
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
            TRY(ct_less(c, off, &x->v[i], &y->v[i], opname, lt));
            ct_leave(c);
            return ZI_OK;
        }
        *lt = x->n < y->n;
        return ZI_OK;
    }
    return ct_fail(c, off, ZI_EINVAL, "'%s' not supported between instances of '%s' and '%s'",
                   opname, ct_tname(a), ct_tname(b));
}

const char *ct_memfind(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, nd, nn);
}

static int contains(ct_ctx *c, size_t off, const ct_value *item, const ct_value *seq, int *r) {
    switch (seq->t) {
    case CT_V_STR:
        if (item->t != CT_V_STR)
            return ct_fail(c, off, ZI_EINVAL,
                           "'in <string>' requires string as left operand, not %s", ct_tname(item));
        TRY(ct_charge(c, off, seq->u.s.n / 64 + 1));
        *r = ct_memfind(seq->u.s.p, seq->u.s.n, item->u.s.p, item->u.s.n) != NULL;
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
            return ct_fail(c, off, ZI_EINVAL, "unhashable type: '%s'", ct_tname(item));
        TRY(ct_charge(c, off, seq->u.d->n / 8 + 1));
        *r = ct_dict_get(c, seq->u.d, item) != NULL;
        return ZI_OK;
    case CT_V_UNDEF:
        *r = 0;
        return ZI_OK;
    default:
        return ct_fail(c, off, ZI_EINVAL, "argument of type '%s' is not iterable", ct_tname(seq));
    }
}

static int is_nan(const ct_value *v) {
    return v->t == CT_V_FLOAT && isnan(v->u.f);
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
        TRY(ct_less(c, off, a, b, "<", &r));
        break;
    case CT_CMP_GT:
        TRY(ct_less(c, off, b, a, ">", &r));
        break;
    /* a <= b is not (b < a) only for totally ordered values; NaN aside
     * that holds for numbers and strings, and lists compare the same way. */
    case CT_CMP_LE:
        TRY(ct_less(c, off, b, a, "<=", &r));
        r = !r && !is_nan(a) && !is_nan(b);
        break;
    case CT_CMP_GE:
        TRY(ct_less(c, off, a, b, ">=", &r));
        r = !r && !is_nan(a) && !is_nan(b);
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
        if (ct_is_iter(v)) {
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
        size_t k = ct_u8_count(v->u.s.p, v->u.s.n);
        ct_value *o = ct_alloc(&c->arena, (k ? k : 1) * sizeof *o);
        if (!o) return ct_oom(c, off);
        size_t j = 0;
        for (size_t i = 0; i < v->u.s.n;) {
            size_t l = ct_u8_len((unsigned char)v->u.s.p[i]);
            o[j++] = ct_str_ref(v->u.s.p + i, l);
            i += l;
        }
        *items = o;
        *n = k;
        return ZI_OK;
    }
    default:
        return ct_fail(c, off, ZI_EINVAL, "'%s' object is not iterable", ct_tname(v));
    }
}

/* The methods of str and dict values, and the global functions. */
static const ct_named str_methods[] = {
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
    {"format", CT_F_FORMAT},
};
static const ct_named dict_methods[] = {
    {"items", CT_F_ITEMS},
    {"keys", CT_F_KEYS},
    {"values", CT_F_VALUES},
    {"get", CT_F_GET},
};
static const ct_named globals[] = {
    {"range", CT_F_RANGE},           {"namespace", CT_F_NAMESPACE},   {"dict", CT_F_DICT},
    {"raise_exception", CT_F_RAISE}, {"strftime_now", CT_F_STRFTIME},
};

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
    return CT_NAMED_ID(globals, name, n) >= 0;
}

int ct_global(ct_ctx *c, size_t off, const char *name, size_t n, ct_value *out, int *found) {
    int id = CT_NAMED_ID(globals, name, n);
    *found = id >= 0;
    return *found ? func_value(c, off, id, NULL, out) : ZI_OK;
}

static int loop_attr(ct_ctx *c, size_t off, const ct_value *obj, const char *name, size_t n,
                     ct_value *out) {
    const ct_loop *l = obj->u.loop;
    if (ct_name_eq(name, n, "index"))
        *out = ct_int((int64_t)l->i + 1);
    else if (ct_name_eq(name, n, "index0"))
        *out = ct_int((int64_t)l->i);
    else if (ct_name_eq(name, n, "revindex"))
        *out = ct_int((int64_t)(l->n - l->i));
    else if (ct_name_eq(name, n, "revindex0"))
        *out = ct_int((int64_t)(l->n - l->i - 1));
    else if (ct_name_eq(name, n, "first"))
        *out = ct_bool(l->i == 0);
    else if (ct_name_eq(name, n, "last"))
        *out = ct_bool(l->i + 1 == l->n);
    else if (ct_name_eq(name, n, "length"))
        *out = ct_int((int64_t)l->n);
    else if (ct_name_eq(name, n, "depth"))
        *out = ct_int(l->depth);
    else if (ct_name_eq(name, n, "depth0"))
        *out = ct_int(l->depth - 1);
    else if (ct_name_eq(name, n, "previtem"))
        *out = l->i > 0 ? l->items[l->i - 1] : ct_undef();
    else if (ct_name_eq(name, n, "nextitem"))
        *out = l->i + 1 < l->n ? l->items[l->i + 1] : ct_undef();
    else if (ct_name_eq(name, n, "cycle"))
        return func_value(c, off, CT_F_CYCLE, obj, out);
    else
        *out = ct_undef_attr(CT_V_LOOP, name, n);
    return ZI_OK;
}

int ct_getattr(ct_ctx *c, size_t off, const ct_value *obj, const char *name, size_t n,
               ct_value *out) {
    switch (obj->t) {
    case CT_V_UNDEF:
        return ct_undefined_error(c, off, obj);
    case CT_V_LOOP:
        return loop_attr(c, off, obj, name, n, out);
    case CT_V_STR: {
        int id = CT_NAMED_ID(str_methods, name, n);
        if (id >= 0) return func_value(c, off, id, obj, out);
        break;
    }
    case CT_V_DICT: {
        int id = CT_NAMED_ID(dict_methods, name, n);
        if (id >= 0) return func_value(c, off, id, obj, out);
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
    *out = ct_undef_attr(obj->t, name, n);
    return ZI_OK;
}

int ct_getitem(ct_ctx *c, size_t off, const ct_value *obj, const ct_value *key, ct_value *out) {
    switch (obj->t) {
    case CT_V_UNDEF:
        return ct_undefined_error(c, off, obj);
    case CT_V_DICT: {
        TRY(ct_charge(c, off, obj->u.d->n / 8 + 1));
        ct_value *v = ct_dict_get(c, obj->u.d, key);
        if (v) {
            *out = *v;
            return ZI_OK;
        }
        break;
    }
    case CT_V_LIST:
    case CT_V_TUPLE:
        if (ct_is_intlike(key) && ct_is_plain_seq(obj)) {
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
        if (ct_is_intlike(key)) {
            TRY(ct_charge(c, off, obj->u.s.n / 64 + 1));
            int64_t i = key->u.i, n = (int64_t)ct_u8_count(obj->u.s.p, obj->u.s.n);
            if (i < 0) i += n;
            if (i >= 0 && i < n) {
                size_t b = 0;
                for (int64_t k = 0; k < i; k++) b += ct_u8_len((unsigned char)obj->u.s.p[b]);
                *out = ct_str_ref(obj->u.s.p + b, ct_u8_len((unsigned char)obj->u.s.p[b]));
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
    if (!ct_is_intlike(v))
        return ct_fail(c, off, ZI_EINVAL, "slice indices must be integers or None, not %s",
                       ct_tname(v));
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
    if (obj->t != CT_V_STR && !ct_is_plain_seq(obj))
        return ct_fail(c, off, ZI_EINVAL, "'%s' object is not subscriptable", ct_tname(obj));
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
        offs = ct_u8_offsets(c, obj->u.s.p, obj->u.s.n, &cnt);
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
    *out = ct_seq_value(obj->t, l);
    if (obj->t == CT_V_LIST && obj->uk == CT_SEQ_RANGE) {
        /* A slice of a range is a range. */
        const ct_list *r = obj->u.l;
        int64_t x, y;
        out->uk = CT_SEQ_RANGE;
        if (__builtin_mul_overflow(a, r->r_step, &x) || __builtin_add_overflow(r->r_start, x, &x) ||
            __builtin_mul_overflow(b, r->r_step, &y) || __builtin_add_overflow(r->r_start, y, &y) ||
            __builtin_mul_overflow(r->r_step, s, &l->r_step))
            return ct_int_overflow(c, off);
        l->r_start = x;
        l->r_stop = y;
    }
    return ZI_OK;
}
