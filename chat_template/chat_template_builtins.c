/*
 * chat_template_builtins.c - builtin functions, methods and tests of the
 * chat-template engine (see chat_template_value.h): argument binding as
 * Python does it, the string helpers that str methods and filters share
 * (strip, case mapping, replace, split, join), the globals range(),
 * namespace(), dict(), raise_exception() and strftime_now(), the str,
 * dict and loop methods (ct_call_func), and the `is` tests
 * (ct_apply_test).
 *
 * Case mapping uses the C.UTF-8 locale's simple Unicode mappings (see
 * case_locale), as Python's str methods do for the scripts chat templates
 * use.
 */
#include "chat_template_value.h"

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <wctype.h>

#include "chat_template_value_impl.h"
#include "unicode.h"

/* ---- argument binding ------------------------------------------------- */

/* Maps positional and keyword arguments onto the parameter names of a
 * builtin; slot[i] is NULL for a parameter that was not given. */
int ct_bind(ct_ctx *c, size_t off, const char *fname, const char *const *params, size_t np,
            const ct_value *args, size_t nargs, const ct_kwarg *kw, size_t nkw,
            const ct_value **slot) {
    if (nargs > np)
        return ct_fail(c, off, ZI_EINVAL, "%s() takes at most %zu argument%s (%zu given)", fname,
                       np, np == 1 ? "" : "s", nargs);
    for (size_t i = 0; i < np; i++) slot[i] = i < nargs ? &args[i] : NULL;
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < np; i++)
            if (ct_name_eq(kw[k].name, kw[k].len, params[i])) break;
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

int ct_need_str(ct_ctx *c, size_t off, const char *what, const ct_value *v) {
    if (v->t == CT_V_STR) return ZI_OK;
    if (v->t == CT_V_UNDEF) return ct_undefined_error(c, off, v);
    return ct_fail(c, off, ZI_EINVAL, "%s must be a string, not %s", what, ct_tname(v));
}

int ct_need_int(ct_ctx *c, size_t off, const char *what, const ct_value *v) {
    if (ct_is_intlike(v)) return ZI_OK;
    if (v->t == CT_V_UNDEF) return ct_undefined_error(c, off, v);
    return ct_fail(c, off, ZI_EINVAL, "%s must be an integer, not %s", what, ct_tname(v));
}

/* ---- string functions ------------------------------------------------- */

static int in_chars(uint32_t cp, const ct_value *chars) {
    for (size_t i = 0; i < chars->u.s.n;) {
        size_t k;
        if (ct_u8_get(chars->u.s.p + i, chars->u.s.n - i, &k) == cp) return 1;
        i += k;
    }
    return 0;
}

/* str.strip / lstrip / rstrip with Python's whitespace or a set of chars. */
ct_value ct_strip(const ct_value *s, const ct_value *chars, int left, int right) {
    const char *p = s->u.s.p;
    size_t a = 0, b = s->u.s.n;
    if (left)
        while (a < b) {
            size_t k;
            uint32_t cp = ct_u8_get(p + a, b - a, &k);
            if (chars ? !in_chars(cp, chars) : !ct_is_space(cp)) break;
            a += k;
        }
    if (right)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            size_t k;
            uint32_t cp = ct_u8_get(p + st, b - st, &k);
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

/* Word boundaries of jinja2's title filter: runs of -, whitespace, ( { [ <. */
static int title_sep(uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ct_is_space(cp);
}

int ct_change_case(ct_ctx *c, const ct_value *s, int mode, ct_value *out) {
    ct_buf b;
    ct_buf_init(&b, c, 0, 0);
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    int prev_cased = 0, at_word_start = 1, first = 1;
    for (size_t i = 0; i < n;) {
        size_t k;
        uint32_t cp = ct_u8_get(p + i, n - i, &k), m = cp;
        switch (mode) {
        case CT_CASE_LOWER:
            m = to_lower(c, cp);
            if (cp == 0x3A3) {
                /* Python's final-sigma rule, without skipping case-ignorable
                 * characters: a word-final capital sigma becomes U+03C2. */
                size_t k2 = 0;
                uint32_t next = i + k < n ? ct_u8_get(p + i + k, n - i - k, &k2) : 0;
                if (prev_cased && !(i + k < n && case_kind(c, next))) m = 0x3C2;
            }
            prev_cased = case_kind(c, cp) != 0;
            break;
        case CT_CASE_UPPER:
            m = to_upper(c, cp);
            break;
        case CT_CASE_CAPITALIZE:
            m = first ? to_title(c, cp) : to_lower(c, cp);
            break;
        case CT_CASE_PYTITLE:
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
int ct_replace(ct_ctx *c, size_t off, const ct_value *s, const ct_value *old, const ct_value *new_,
               int64_t count, ct_value *out) {
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
            size_t k = ct_u8_len((unsigned char)p[i]);
            TRY(ct_buf_add(&b, p + i, k));
            i += k;
        }
        TRY(ct_buf_add(&b, p + i, n - i));
        return ct_buf_value(&b, out);
    }
    TRY(ct_charge(c, off, n / 64 + 1));
    while (count < 0 || done < count) {
        const char *hit = ct_memfind(p + i, n - i, old->u.s.p, old->u.s.n);
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
                if (!ct_is_space(ct_u8_get(p + i, n - i, &k))) break;
                i += k;
            }
            if (i >= n) break;
            size_t j = i;
            if (maxsplit >= 0 && done >= maxsplit) {
                /* The rest, without trailing whitespace. */
                ct_value r =
                    ct_strip(&(ct_value){.t = CT_V_STR, .u.s = {p + i, n - i}}, NULL, 0, 1);
                if (ct_list_push(c, l, r)) return ct_oom(c, off);
                break;
            }
            while (j < n) {
                size_t k;
                if (ct_is_space(ct_u8_get(p + j, n - j, &k))) break;
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
                                  ? ct_memfind(p + i, n - i, sep->u.s.p, sep->u.s.n)
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
    *out = ct_seq_value(CT_V_LIST, l);
    return ZI_OK;
}

/* Joins str() of every item with sep. */
int ct_join_items(ct_ctx *c, size_t off, const ct_value *items, size_t n, const char *sep,
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
        TRY(ct_need_str(c, off, suffix ? "endswith argument" : "startswith argument", &cands[i]));
        size_t k = cands[i].u.s.n;
        if (k <= s->u.s.n && memcmp(s->u.s.p + (suffix ? s->u.s.n - k : 0), cands[i].u.s.p, k) == 0)
            *r = 1;
    }
    return ZI_OK;
}

int ct_iterate_new_list(ct_ctx *c, size_t off, const ct_value *v, const ct_value **items, size_t *n,
                        ct_list **l) {
    TRY(ct_iterate(c, off, v, items, n));
    *l = ct_list_new(c, *n);
    return *l ? ZI_OK : ct_oom(c, off);
}

int ct_list_of(ct_ctx *c, size_t off, const ct_value *v, ct_value *out) {
    const ct_value *items;
    size_t n;
    ct_list *l;
    TRY(ct_iterate_new_list(c, off, v, &items, &n, &l));
    if (n) memcpy(l->v, items, n * sizeof *items);
    l->n = n;
    *out = ct_seq_value(CT_V_LIST, l);
    return ZI_OK;
}

int ct_items_of(ct_ctx *c, size_t off, const ct_dict *d, ct_value *out) {
    ct_list *l = ct_list_new(c, d->n);
    if (!l) return ct_oom(c, off);
    for (size_t i = 0; i < d->n; i++) {
        ct_list *pair = ct_list_new(c, 2);
        if (!pair) return ct_oom(c, off);
        pair->v[0] = d->k[i];
        pair->v[1] = d->v[i];
        pair->n = 2;
        l->v[l->n++] = ct_seq_value(CT_V_TUPLE, pair);
    }
    *out = ct_seq_value(CT_V_LIST, l);
    return ZI_OK;
}

/* ---- functions and methods ----------------------------------------------- */

static int strftime_now(ct_ctx *c, size_t off, const ct_value *fmt, ct_value *out) {
    char f[256], res[512];
    if (fmt->u.s.n >= sizeof f || memchr(fmt->u.s.p, '\0', fmt->u.s.n))
        return ct_fail(c, off, ZI_EINVAL, "strftime_now: unusable format");
    memcpy(f, fmt->u.s.p, fmt->u.s.n);
    f[fmt->u.s.n] = '\0';
    /* A fixed moment (tests, reproducible prompts) is formatted as UTC, the
     * current one as local time, which is what Python's datetime.now() does. */
    time_t now = c->now ? (time_t)c->now : time(NULL);
    struct tm tm;
    if (!(c->now ? gmtime_r(&now, &tm) : localtime_r(&now, &tm)))
        return ct_fail(c, off, ZI_EINVAL, "strftime_now: no local time");
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
    *out = ct_map_value(type, d);
    return ZI_OK;
}

#define RANGE_MAX 100000 /* jinja2's sandbox refuses longer ranges too */

static int range_fn(ct_ctx *c, size_t off, const ct_value *args, size_t nargs, ct_value *out) {
    if (nargs < 1 || nargs > 3)
        return ct_fail(c, off, ZI_EINVAL, "range expected 1 to 3 arguments, got %zu", nargs);
    for (size_t i = 0; i < nargs; i++) TRY(ct_need_int(c, off, "range argument", &args[i]));
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
    *out = ct_gen_value(l, CT_SEQ_RANGE);
    return ZI_OK;
}

/* Python's str.format for plain replacement fields: "{}", "{0}", "{name}",
 * and "{{" / "}}". A conversion (!r), a format spec (:>10) or an index or
 * attribute in a field ({0.x}, {a[1]}) is ZI_EUNSUPPORTED; what Python
 * refuses (a lone brace, a missing argument, mixing automatic and manual
 * numbering) is ZI_EINVAL with Python's message. */
static int str_format(ct_ctx *c, size_t off, const ct_value *self, const ct_value *args,
                      size_t nargs, const ct_kwarg *kw, size_t nkw, ct_value *out) {
    const char *p = self->u.s.p;
    size_t n = self->u.s.n;
    TRY(ct_charge(c, off, n / 64 + 1));
    ct_buf b;
    ct_buf_init(&b, c, 0, 0);
    int automatic = -1; /* -1: not known yet, 1: "{}", 0: "{N}" */
    size_t next = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '}') {
            if (i + 1 < n && p[i + 1] == '}') {
                TRY(ct_buf_addc(&b, '}'));
                i++;
                continue;
            }
            return ct_fail(c, off, ZI_EINVAL, "Single '}' encountered in format string");
        }
        if (ch != '{') {
            TRY(ct_buf_addc(&b, ch));
            continue;
        }
        if (i + 1 < n && p[i + 1] == '{') {
            TRY(ct_buf_addc(&b, '{'));
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < n && p[j] != '}' && p[j] != '{') j++;
        if (j >= n || p[j] != '}')
            return ct_fail(c, off, ZI_EINVAL, "Single '{' encountered in format string");
        const char *f = p + i + 1;
        size_t fn = j - i - 1;
        int digits = fn > 0 && fn < 10;
        for (size_t k = 0; k < fn; k++) {
            if (strchr("!:[.", f[k]))
                return ct_fail(c, off, ZI_EUNSUPPORTED,
                               "str.format field '{%.*s}' is not supported (only {}, {N} and "
                               "{name})",
                               (int)(fn > 40 ? 40 : fn), f);
            digits &= f[k] >= '0' && f[k] <= '9';
        }
        const ct_value *arg = NULL;
        if (fn == 0 || digits) {
            size_t idx = 0;
            if (fn == 0) {
                if (automatic == 0)
                    return ct_fail(c, off, ZI_EINVAL,
                                   "cannot switch from manual field specification to automatic "
                                   "field numbering");
                automatic = 1;
                idx = next++;
            } else {
                if (automatic == 1)
                    return ct_fail(c, off, ZI_EINVAL,
                                   "cannot switch from automatic field numbering to manual field "
                                   "specification");
                automatic = 0;
                for (size_t k = 0; k < fn; k++) idx = idx * 10 + (size_t)(f[k] - '0');
            }
            if (idx >= nargs)
                return ct_fail(c, off, ZI_EINVAL,
                               "Replacement index %zu out of range for positional args tuple", idx);
            arg = &args[idx];
        } else {
            for (size_t k = 0; k < nkw && !arg; k++)
                if (kw[k].len == fn && memcmp(kw[k].name, f, fn) == 0) arg = &kw[k].v;
            if (!arg) return ct_fail(c, off, ZI_EINVAL, "KeyError: '%.*s'", (int)fn, f);
        }
        ct_value s;
        TRY(ct_str_of(c, off, arg, &s));
        TRY(ct_buf_add(&b, s.u.s.p, s.u.s.n));
        i = j;
    }
    return ct_buf_value(&b, out);
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
        TRY(ct_bind(c, off, "raise_exception", p, 1, args, nargs, kw, nkw, a));
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
        TRY(ct_bind(c, off, "strftime_now", p, 1, args, nargs, kw, nkw, a));
        if (!a[0]) return ct_fail(c, off, ZI_EINVAL, "strftime_now() needs a format");
        TRY(ct_need_str(c, off, "strftime_now format", a[0]));
        return strftime_now(c, off, a[0], out);
    }
    case CT_F_STRIP:
    case CT_F_LSTRIP:
    case CT_F_RSTRIP: {
        static const char *const p[] = {"chars"};
        TRY(ct_bind(c, off, "strip", p, 1, args, nargs, kw, nkw, a));
        const ct_value *chars = a[0] && a[0]->t != CT_V_NONE ? a[0] : NULL;
        if (chars) TRY(ct_need_str(c, off, "strip argument", chars));
        *out = ct_strip(self, chars, f->id != CT_F_RSTRIP, f->id != CT_F_LSTRIP);
        return ZI_OK;
    }
    case CT_F_LOWER:
    case CT_F_UPPER:
    case CT_F_TITLE:
    case CT_F_CAPITALIZE:
        TRY(ct_bind(c, off, "str method", NULL, 0, args, nargs, kw, nkw, a));
        return ct_change_case(c, self,
                              f->id == CT_F_LOWER   ? CT_CASE_LOWER
                              : f->id == CT_F_UPPER ? CT_CASE_UPPER
                              : f->id == CT_F_TITLE ? CT_CASE_PYTITLE
                                                    : CT_CASE_CAPITALIZE,
                              out);
    case CT_F_STARTSWITH:
    case CT_F_ENDSWITH: {
        static const char *const p[] = {"prefix"};
        TRY(ct_bind(c, off, f->id == CT_F_STARTSWITH ? "startswith" : "endswith", p, 1, args, nargs,
                    kw, nkw, a));
        if (!a[0]) return ct_fail(c, off, ZI_EINVAL, "startswith/endswith need an argument");
        int r;
        TRY(affix(c, off, self, a[0], f->id == CT_F_ENDSWITH, &r));
        *out = ct_bool(r);
        return ZI_OK;
    }
    case CT_F_REPLACE: {
        static const char *const p[] = {"old", "new", "count"};
        TRY(ct_bind(c, off, "replace", p, 3, args, nargs, kw, nkw, a));
        if (!a[0] || !a[1]) return ct_fail(c, off, ZI_EINVAL, "replace() needs old and new");
        TRY(ct_need_str(c, off, "replace argument", a[0]));
        TRY(ct_need_str(c, off, "replace argument", a[1]));
        if (a[2]) TRY(ct_need_int(c, off, "replace count", a[2]));
        return ct_replace(c, off, self, a[0], a[1], a[2] ? a[2]->u.i : -1, out);
    }
    case CT_F_SPLIT: {
        static const char *const p[] = {"sep", "maxsplit"};
        TRY(ct_bind(c, off, "split", p, 2, args, nargs, kw, nkw, a));
        const ct_value *sep = a[0] && a[0]->t != CT_V_NONE ? a[0] : NULL;
        if (sep) TRY(ct_need_str(c, off, "split separator", sep));
        if (a[1]) TRY(ct_need_int(c, off, "split maxsplit", a[1]));
        return split(c, off, self, sep, a[1] ? a[1]->u.i : -1, out);
    }
    case CT_F_JOIN: {
        static const char *const p[] = {"iterable"};
        TRY(ct_bind(c, off, "join", p, 1, args, nargs, kw, nkw, a));
        if (!a[0]) return ct_fail(c, off, ZI_EINVAL, "join() needs an argument");
        const ct_value *items;
        size_t n;
        TRY(ct_iterate(c, off, a[0], &items, &n));
        for (size_t i = 0; i < n; i++)
            if (items[i].t != CT_V_STR)
                return ct_fail(c, off, ZI_EINVAL,
                               "sequence item %zu: expected str instance, %s found", i,
                               ct_tname(&items[i]));
        return ct_join_items(c, off, items, n, self->u.s.p, self->u.s.n, out);
    }
    case CT_F_FIND:
    case CT_F_COUNT: {
        static const char *const p[] = {"sub"};
        TRY(ct_bind(c, off, f->id == CT_F_FIND ? "find" : "count", p, 1, args, nargs, kw, nkw, a));
        if (!a[0]) return ct_fail(c, off, ZI_EINVAL, "find/count need an argument");
        TRY(ct_need_str(c, off, "find/count argument", a[0]));
        TRY(ct_charge(c, off, self->u.s.n / 64 + 1));
        const char *h = self->u.s.p;
        size_t n = self->u.s.n, sn = a[0]->u.s.n;
        if (f->id == CT_F_FIND) {
            const char *hit = ct_memfind(h, n, a[0]->u.s.p, sn);
            *out = ct_int(hit ? (int64_t)ct_u8_count(h, (size_t)(hit - h)) : -1);
            return ZI_OK;
        }
        int64_t cnt = 0;
        if (sn == 0)
            cnt = (int64_t)ct_u8_count(h, n) + 1;
        else
            for (size_t i = 0;;) {
                const char *hit = ct_memfind(h + i, n - i, a[0]->u.s.p, sn);
                if (!hit) break;
                cnt++;
                i = (size_t)(hit - h) + sn;
            }
        *out = ct_int(cnt);
        return ZI_OK;
    }
    case CT_F_FORMAT:
        return str_format(c, off, self, args, nargs, kw, nkw, out);
    case CT_F_ITEMS:
        TRY(ct_bind(c, off, "items", NULL, 0, args, nargs, kw, nkw, a));
        TRY(ct_items_of(c, off, self->u.d, out));
        out->uk = CT_SEQ_ITEMS;
        return ZI_OK;
    case CT_F_KEYS:
    case CT_F_VALUES: {
        TRY(ct_bind(c, off, "keys", NULL, 0, args, nargs, kw, nkw, a));
        const ct_dict *d = self->u.d;
        ct_list *l = ct_list_new(c, d->n);
        if (!l) return ct_oom(c, off);
        if (d->n) memcpy(l->v, f->id == CT_F_KEYS ? d->k : d->v, d->n * sizeof *l->v);
        l->n = d->n;
        *out = ct_gen_value(l, f->id == CT_F_KEYS ? CT_SEQ_KEYS : CT_SEQ_VALUES);
        return ZI_OK;
    }
    case CT_F_GET: {
        static const char *const p[] = {"key", "default"};
        TRY(ct_bind(c, off, "get", p, 2, args, nargs, kw, nkw, a));
        if (!a[0]) return ct_fail(c, off, ZI_EINVAL, "get() needs a key");
        ct_value *v = ct_dict_get(c, self->u.d, a[0]);
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

static const ct_named tests[] = {
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
    return CT_NAMED_ID(tests, name, n);
}

/* str.islower / str.isupper: some cased character, none of the other case. */
static int case_test(ct_ctx *c, const ct_value *s, int upper) {
    int cased = 0;
    for (size_t i = 0; i < s->u.s.n;) {
        size_t k;
        int kind = case_kind(c, ct_u8_get(s->u.s.p + i, s->u.s.n - i, &k));
        if (kind == (upper ? 1 : 2)) return 0;
        if (kind) cased = 1;
        i += k;
    }
    return cased;
}

/* The comparison (CT_CMP_*) a comparison test stands for, -1 for the others. */
static int test_cmp(int id) {
    static const struct {
        int test, cmp;
    } map[] = {{T_EQ, CT_CMP_EQ}, {T_NE, CT_CMP_NE}, {T_LT, CT_CMP_LT}, {T_LE, CT_CMP_LE},
               {T_GT, CT_CMP_GT}, {T_GE, CT_CMP_GE}, {T_IN, CT_CMP_IN}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].test == id) return map[i].cmp;
    return -1;
}

int ct_apply_test(ct_ctx *c, size_t off, int id, const char *name, size_t nlen, const ct_value *v,
                  const ct_value *args, size_t nargs, const ct_kwarg *kw, size_t nkw, int *result) {
    static const char *const p1[] = {"other"};
    const ct_value *a[1] = {NULL};
    if (id < 0)
        return ct_fail(c, off, ZI_EUNSUPPORTED, "no test named '%.*s'",
                       (int)(nlen > 60 ? 60 : nlen), name);
    int cmp = test_cmp(id);
    int takes_arg = cmp >= 0 || id == T_DIVISIBLEBY || id == T_SAMEAS;
    TRY(ct_bind(c, off, "test", p1, takes_arg ? 1 : 0, args, nargs, kw, nkw, a));
    if (takes_arg && !a[0]) return ct_fail(c, off, ZI_EINVAL, "this test needs an argument");
    if (cmp >= 0) return ct_compare(c, off, cmp, v, a[0], result);
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
        r = ct_is_num(v);
        break;
    case T_ITERABLE:
        r = v->t == CT_V_LIST || v->t == CT_V_TUPLE || v->t == CT_V_DICT || v->t == CT_V_STR ||
            v->t == CT_V_UNDEF || v->t == CT_V_LOOP;
        break;
    case T_SEQUENCE:
        r = ct_is_plain_seq(v) || v->t == CT_V_DICT || v->t == CT_V_STR || v->t == CT_V_UNDEF;
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
