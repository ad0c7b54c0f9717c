/*
 * regex_grammar.c - regular expressions to GBNF expressions (see
 * regex_grammar.h): a recursive-descent parser over the pattern's code
 * points that writes the expression as it goes; classes are built as
 * sorted code point ranges so negation and the JSON-string restriction are
 * exact set operations.
 */
#include "regex_grammar.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "utf8.h"

#define MAX_CP 0x10FFFFu

void zi_gbnf_append(zi_gbnf_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (n > SIZE_MAX - 1 - b->n || zi_grow_to((void **)&b->p, &b->cap, 1, b->n + n + 1, 256)) {
        b->oom = true;
        return;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void zi_gbnf_printf(zi_gbnf_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        zi_gbnf_append(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    zi_gbnf_append(b, big, (size_t)n);
    free(big);
}

/* One code point as it may stand inside a GBNF literal or class. */
static void cp_escaped(zi_gbnf_buf *b, unsigned cp) {
    if (cp >= 0x20 && cp < 0x7F && !strchr("\"\\[]-^", (int)cp)) {
        char c = (char)cp;
        zi_gbnf_append(b, &c, 1);
    } else if (cp < 0x100) {
        zi_gbnf_printf(b, "\\x%02X", cp);
    } else if (cp < 0x10000) {
        zi_gbnf_printf(b, "\\u%04X", cp);
    } else {
        zi_gbnf_printf(b, "\\U%08X", cp);
    }
}

void zi_gbnf_class_cp(zi_gbnf_buf *b, unsigned cp) {
    cp_escaped(b, cp);
}

void zi_gbnf_literal_cp(zi_gbnf_buf *b, unsigned cp) {
    zi_gbnf_append(b, "\"", 1);
    cp_escaped(b, cp);
    zi_gbnf_append(b, "\"", 1);
}

void zi_gbnf_literal(zi_gbnf_buf *b, const char *s, size_t n) {
    zi_gbnf_append(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = zi_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (!k) k = 1, cp = (unsigned char)s[i]; /* callers pass valid UTF-8 */
        cp_escaped(b, cp);
        i += k;
    }
    zi_gbnf_append(b, "\"", 1);
}

/* ---- code point sets ---- */

typedef struct {
    uint32_t lo[ZI_REGEX_MAX_CLASS], hi[ZI_REGEX_MAX_CLASS];
    int n;
} cpset;

static bool set_add(cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == ZI_REGEX_MAX_CLASS) return false;
    s->lo[s->n] = lo, s->hi[s->n] = hi, s->n++;
    return true;
}

/* Sorts and merges the ranges. */
static void set_norm(cpset *s) {
    for (int i = 1; i < s->n; i++) /* insertion sort: classes are small */
        for (int j = i; j > 0 && s->lo[j - 1] > s->lo[j]; j--) {
            uint32_t t = s->lo[j];
            s->lo[j] = s->lo[j - 1], s->lo[j - 1] = t;
            t = s->hi[j], s->hi[j] = s->hi[j - 1], s->hi[j - 1] = t;
        }
    int m = 0;
    for (int i = 0; i < s->n; i++) {
        if (m && s->lo[i] <= s->hi[m - 1] + 1) {
            if (s->hi[i] > s->hi[m - 1]) s->hi[m - 1] = s->hi[i];
        } else {
            s->lo[m] = s->lo[i], s->hi[m] = s->hi[i], m++;
        }
    }
    s->n = m;
}

static void set_complement(cpset *s) {
    set_norm(s);
    cpset o = {.n = 0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->lo[i] > next) set_add(&o, next, s->lo[i] - 1);
        next = s->hi[i] + 1;
    }
    if (next <= MAX_CP) set_add(&o, next, MAX_CP);
    *s = o;
}

/* s minus [lo, hi]. */
static void set_remove(cpset *s, uint32_t lo, uint32_t hi) {
    cpset o = {.n = 0};
    for (int i = 0; i < s->n; i++) {
        if (s->hi[i] < lo || s->lo[i] > hi) {
            set_add(&o, s->lo[i], s->hi[i]);
            continue;
        }
        if (s->lo[i] < lo) set_add(&o, s->lo[i], lo - 1);
        if (s->hi[i] > hi) set_add(&o, hi + 1, s->hi[i]);
    }
    *s = o;
}

/* ---- the parser ---- */

typedef struct {
    const char *re;
    size_t len, pos;
    int mode, depth;
    zi_gbnf_buf *out;
    zi_error *err;
} rparser;

static int fail(rparser *p, int code, const char *what) {
    return zi_error_set(p->err, code, "offset %zu: %s", p->pos, what);
}

static bool at_end(const rparser *p) {
    return p->pos >= p->len;
}

static uint32_t peek(const rparser *p, size_t *k) {
    uint32_t cp;
    *k = zi_utf8_next((const unsigned char *)p->re + p->pos, p->len - p->pos, &cp);
    return *k ? cp : 0xFFFFFFFFu;
}

static int next_cp(rparser *p, uint32_t *cp) {
    size_t k;
    *cp = peek(p, &k);
    if (!k) return fail(p, ZI_EINVAL, "invalid UTF-8");
    p->pos += k;
    return ZI_OK;
}

/* The classes \d \w \s (upper case: negated) into s. */
static bool shorthand(uint32_t c, cpset *s) {
    cpset t = {.n = 0};
    switch (c | 0x20) {
    case 'd':
        set_add(&t, '0', '9');
        break;
    case 'w':
        set_add(&t, '0', '9'), set_add(&t, 'A', 'Z'), set_add(&t, 'a', 'z');
        set_add(&t, '_', '_');
        break;
    case 's':
        set_add(&t, '\t', '\r'), set_add(&t, ' ', ' ');
        break;
    default:
        return false;
    }
    if (c >= 'A' && c <= 'Z') set_complement(&t);
    for (int i = 0; i < t.n; i++) set_add(s, t.lo[i], t.hi[i]);
    return true;
}

static int hex_digits(rparser *p, int n, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < n; i++) {
        if (at_end(p)) return fail(p, ZI_EINVAL, "a hex escape ends early");
        char c = p->re[p->pos++];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return fail(p, ZI_EINVAL, "a hex escape needs hex digits");
        *v = *v * 16 + (uint32_t)d;
    }
    return ZI_OK;
}

/* After a backslash: one code point into *cp, or a class into s (*cp =
 * UINT32_MAX then). */
static int escape(rparser *p, cpset *s, uint32_t *cp, bool in_class) {
    uint32_t c;
    int rc = next_cp(p, &c);
    if (rc) return rc;
    if (shorthand(c, s)) {
        *cp = UINT32_MAX;
        return ZI_OK;
    }
    switch (c) {
    case 't':
        *cp = '\t';
        return ZI_OK;
    case 'n':
        *cp = '\n';
        return ZI_OK;
    case 'r':
        *cp = '\r';
        return ZI_OK;
    case 'f':
        *cp = '\f';
        return ZI_OK;
    case 'v':
        *cp = '\v';
        return ZI_OK;
    case '0':
        *cp = 0;
        return ZI_OK;
    case 'x':
        return hex_digits(p, 2, cp);
    case 'u':
        return hex_digits(p, 4, cp);
    case 'b':
        if (in_class) {
            *cp = '\b';
            return ZI_OK;
        }
        return fail(p, ZI_EUNSUPPORTED, "word boundaries (\\b) are not supported");
    default:
        break;
    }
    if (c >= '1' && c <= '9') return fail(p, ZI_EUNSUPPORTED, "backreferences are not supported");
    if (c < 0x80 && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
        return fail(p, ZI_EUNSUPPORTED,
                    "this escape is not supported (only \\d \\w \\s \\D \\W "
                    "\\S \\t \\n \\r \\f \\v \\0 \\xHH \\uHHHH and escaped "
                    "punctuation)");
    *cp = c;
    return ZI_OK;
}

/* The characters the mode lets a class hold. */
static void restrict_set(const rparser *p, cpset *s) {
    set_norm(s);
    set_remove(s, 0xD800, 0xDFFF);
    if (p->mode == ZI_REGEX_JSON) {
        set_remove(s, 0, 0x1F);
        set_remove(s, '"', '"');
        set_remove(s, '\\', '\\');
    }
}

static int emit_set(rparser *p, cpset *s) {
    restrict_set(p, s);
    if (s->n == 0) return fail(p, ZI_EINVAL, "a class that matches no character");
    zi_gbnf_append(p->out, "[", 1);
    for (int i = 0; i < s->n; i++) {
        cp_escaped(p->out, s->lo[i]);
        if (s->hi[i] != s->lo[i]) {
            zi_gbnf_append(p->out, "-", 1);
            cp_escaped(p->out, s->hi[i]);
        }
    }
    zi_gbnf_append(p->out, "]", 1);
    return ZI_OK;
}

/* One literal character, as the mode writes it. */
static void emit_char(rparser *p, uint32_t cp) {
    if (p->mode != ZI_REGEX_JSON || (cp >= 0x20 && cp != '"' && cp != '\\')) {
        zi_gbnf_literal_cp(p->out, cp);
        return;
    }
    char e[8];
    int n;
    switch (cp) {
    case '"':
        n = snprintf(e, sizeof e, "\\\"");
        break;
    case '\\':
        n = snprintf(e, sizeof e, "\\\\");
        break;
    case '\n':
        n = snprintf(e, sizeof e, "\\n");
        break;
    case '\t':
        n = snprintf(e, sizeof e, "\\t");
        break;
    case '\r':
        n = snprintf(e, sizeof e, "\\r");
        break;
    default:
        n = snprintf(e, sizeof e, "\\u%04x", cp);
        break;
    }
    zi_gbnf_literal(p->out, e, (size_t)n);
}

static int parse_class(rparser *p) {
    cpset s = {.n = 0};
    bool neg = false;
    if (!at_end(p) && p->re[p->pos] == '^') neg = true, p->pos++;
    bool first = true;
    for (;;) {
        if (at_end(p)) return fail(p, ZI_EINVAL, "unterminated class '['");
        if (p->re[p->pos] == ']' && !first) {
            p->pos++;
            break;
        }
        first = false;
        uint32_t lo;
        int rc = next_cp(p, &lo);
        if (!rc && lo == '\\') rc = escape(p, &s, &lo, true);
        if (rc) return rc;
        if (lo == UINT32_MAX) continue; /* a shorthand class, added */
        uint32_t hi = lo;
        if (p->pos + 1 < p->len && p->re[p->pos] == '-' && p->re[p->pos + 1] != ']') {
            p->pos++;
            cpset dummy = {.n = 0};
            rc = next_cp(p, &hi);
            if (!rc && hi == '\\') rc = escape(p, &dummy, &hi, true);
            if (rc) return rc;
            if (hi == UINT32_MAX) return fail(p, ZI_EINVAL, "a class range ends in a shorthand");
            if (hi < lo) return fail(p, ZI_EINVAL, "a class range ends before it starts");
        }
        if (!set_add(&s, lo, hi)) return fail(p, ZI_EINVAL, "too many ranges in a class");
    }
    if (neg) set_complement(&s);
    return emit_set(p, &s);
}

static int parse_alt(rparser *p);

static int parse_int(rparser *p, long *v) {
    size_t start = p->pos;
    *v = 0;
    while (!at_end(p) && p->re[p->pos] >= '0' && p->re[p->pos] <= '9') {
        *v = *v * 10 + (p->re[p->pos++] - '0');
        if (*v > 1000) return fail(p, ZI_EINVAL, "a repetition count over 1000");
    }
    return p->pos > start ? ZI_OK : -1;
}

/* A quantifier after an atom, if one follows. */
static int parse_quant(rparser *p) {
    if (at_end(p)) return ZI_OK;
    char c = p->re[p->pos];
    if (c == '*' || c == '+' || c == '?') {
        p->pos++;
        zi_gbnf_append(p->out, &c, 1);
    } else if (c == '{') {
        size_t save = p->pos++;
        long m, n;
        int rc = parse_int(p, &m);
        if (rc > 0) return rc;
        if (rc < 0) { /* not a quantifier: a literal '{' (as Python reads it) */
            p->pos = save;
            return ZI_OK;
        }
        n = m;
        bool open = false;
        if (!at_end(p) && p->re[p->pos] == ',') {
            p->pos++;
            rc = parse_int(p, &n);
            if (rc > 0) return rc;
            open = rc < 0;
        }
        if (at_end(p) || p->re[p->pos] != '}') {
            p->pos = save;
            return ZI_OK;
        }
        p->pos++;
        if (!open && n < m) return fail(p, ZI_EINVAL, "{m,n} with n < m");
        if (open)
            zi_gbnf_printf(p->out, "{%ld,}", m);
        else
            zi_gbnf_printf(p->out, "{%ld,%ld}", m, n);
    } else {
        return ZI_OK;
    }
    if (!at_end(p) && p->re[p->pos] == '?') p->pos++; /* lazy: the same language */
    if (!at_end(p) && (p->re[p->pos] == '+'))
        return fail(p, ZI_EUNSUPPORTED, "possessive quantifiers are not supported");
    if (!at_end(p) && strchr("*?{", p->re[p->pos]) && p->re[p->pos])
        return fail(p, ZI_EINVAL, "a quantifier after a quantifier");
    return ZI_OK;
}

static int parse_group(rparser *p) {
    if (++p->depth > ZI_REGEX_MAX_NESTING) return fail(p, ZI_EINVAL, "groups nested too deep");
    if (!at_end(p) && p->re[p->pos] == '?') {
        p->pos++;
        if (!at_end(p) && p->re[p->pos] == ':') {
            p->pos++;
        } else if (!at_end(p) && (p->re[p->pos] == 'P' || p->re[p->pos] == '<') &&
                   (p->re[p->pos] == 'P' || (p->pos + 1 < p->len && p->re[p->pos + 1] != '=' &&
                                             p->re[p->pos + 1] != '!'))) {
            if (p->re[p->pos] == 'P') p->pos++;
            if (at_end(p) || p->re[p->pos] != '<')
                return fail(p, ZI_EUNSUPPORTED, "(?P...) other than a named group");
            while (!at_end(p) && p->re[p->pos] != '>') p->pos++;
            if (at_end(p)) return fail(p, ZI_EINVAL, "unterminated group name");
            p->pos++;
        } else {
            return fail(p, ZI_EUNSUPPORTED,
                        "lookaround and inline flags ((?=, (?!, (?<=, (?<!, (?i) ...) are not "
                        "supported");
        }
    }
    int rc = parse_alt(p);
    if (rc) return rc;
    if (at_end(p) || p->re[p->pos] != ')') return fail(p, ZI_EINVAL, "unbalanced '('");
    p->pos++;
    p->depth--;
    return ZI_OK;
}

/* One atom and its quantifier; *done when the sequence ends here. */
static int parse_atom(rparser *p) {
    uint32_t c;
    int rc = next_cp(p, &c);
    if (rc) return rc;
    switch (c) {
    case '(':
        rc = parse_group(p);
        break;
    case '[':
        rc = parse_class(p);
        break;
    case '.': {
        cpset s = {.n = 0};
        set_add(&s, '\n', '\n');
        set_complement(&s);
        rc = emit_set(p, &s);
        break;
    }
    case '\\': {
        cpset s = {.n = 0};
        uint32_t cp;
        rc = escape(p, &s, &cp, false);
        if (!rc && cp == UINT32_MAX)
            rc = emit_set(p, &s);
        else if (!rc)
            emit_char(p, cp);
        break;
    }
    case '^':
    case '$':
        p->pos--;
        return fail(p, ZI_EUNSUPPORTED, "'^' and '$' are supported only at the ends of a pattern");
    case '*':
    case '+':
    case '?':
        p->pos--;
        return fail(p, ZI_EINVAL, "a quantifier with nothing before it");
    case ')':
        p->pos--;
        return fail(p, ZI_EINVAL, "unbalanced ')'");
    default:
        emit_char(p, c);
        break;
    }
    if (rc) return rc;
    return parse_quant(p);
}

/* The end of the pattern proper (before a final unescaped '$'). */
static bool at_stop(const rparser *p) {
    return at_end(p) || p->re[p->pos] == '|' || p->re[p->pos] == ')';
}

static int parse_seq(rparser *p) {
    zi_gbnf_append(p->out, "(", 1);
    bool empty = true;
    while (!at_stop(p)) {
        if (!empty) zi_gbnf_append(p->out, " ", 1);
        zi_gbnf_append(p->out, "(", 1);
        int rc = parse_atom(p);
        if (rc) return rc;
        zi_gbnf_append(p->out, ")", 1);
        empty = false;
    }
    if (empty) zi_gbnf_append(p->out, "\"\"", 2);
    zi_gbnf_append(p->out, ")", 1);
    return ZI_OK;
}

static int parse_alt(rparser *p) {
    zi_gbnf_append(p->out, "(", 1);
    int rc = parse_seq(p);
    while (!rc && !at_end(p) && p->re[p->pos] == '|') {
        p->pos++;
        zi_gbnf_append(p->out, " | ", 3);
        rc = parse_seq(p);
    }
    zi_gbnf_append(p->out, ")", 1);
    return rc;
}

int zi_regex_to_gbnf(const char *re, size_t len, int mode, zi_gbnf_buf *out, zi_error *err) {
    if (len > ZI_REGEX_MAX_LEN)
        return zi_error_set(err, ZI_EINVAL, "longer than %d bytes", ZI_REGEX_MAX_LEN);
    if (!zi_utf8_valid(re, len)) return zi_error_set(err, ZI_EINVAL, "invalid UTF-8");
    bool head = len > 0 && re[0] == '^';
    /* A final '$' not escaped (an odd run of backslashes before it escapes it). */
    size_t bs = 0;
    while (len >= 2 + bs && re[len - 2 - bs] == '\\') bs++;
    bool tail = len > (size_t)head && re[len - 1] == '$' && bs % 2 == 0;
    rparser p = {.re = re, .len = len - tail, .pos = head, .mode = mode, .out = out, .err = err};
    /* JSON Schema's pattern is a search: free text around an unanchored end. */
    static const char any_json[] = "([^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
                                   "[0-9a-fA-F]{4}))*";
    zi_gbnf_append(out, "(", 1);
    if (mode == ZI_REGEX_JSON && !head) zi_gbnf_printf(out, "%s ", any_json);
    int rc = parse_alt(&p);
    if (!rc && !at_end(&p)) rc = fail(&p, ZI_EINVAL, "unbalanced ')'");
    if (!rc && mode == ZI_REGEX_JSON && !tail) zi_gbnf_printf(out, " %s", any_json);
    zi_gbnf_append(out, ")", 1);
    if (!rc && out->oom) rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    return rc;
}
