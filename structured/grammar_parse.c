/*
 * grammar_parse.c - the GBNF compiler of grammar.h: text to the rules of
 * grammar_impl.h, with every refusal naming line:column.
 *
 * A recursive-descent parser writes each rule's elements into a buffer of
 * its own; a group ( ... ) becomes a rule of its own, and a repetition is
 * expanded as llama.cpp does: x{m,n} is m copies of x then n-m nested
 * optional rules (x (x (x)?)?)?, x{m,} is m copies then a rule
 * `r ::= x r | ` . The buffers are then laid out in one array and checked:
 * every referenced rule defined, a root, and no left recursion (which the
 * stack matcher of grammar.c could not take; a repetition of something
 * that can be empty is not refused: see left_rec).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "grow.h"

#define NO_AT ((size_t)-1)

typedef struct prule {
    const char *name; /* into the text; NULL: a group or repetition of rule parent */
    size_t name_len;
    int32_t parent;
    size_t def_at, ref_at; /* offsets of its definition and first reference */
    gelem *el;
    int32_t n;
    size_t cap;
} prule;

typedef struct parser {
    const char *t;
    size_t len, i;
    prule *rules;
    int32_t n_rules;
    size_t cap_rules;
    uint32_t (*ranges)[2];
    int32_t n_ranges;
    size_t cap_ranges;
    gclass *classes;
    int32_t n_classes;
    size_t cap_classes;
    int32_t total; /* elements in all rules */
    int nesting;
    zi_error *err;
} parser;

static int perr(parser *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void line_col(const parser *p, size_t at, int *line, int *col) {
    if (at > p->len) at = p->len;
    *line = 1, *col = 1;
    for (size_t k = 0; k < at; k++) {
        if (p->t[k] == '\n')
            ++*line, *col = 1;
        else if (((uint8_t)p->t[k] & 0xC0) != 0x80)
            ++*col; /* columns count characters */
    }
}

static int perr(parser *p, size_t at, const char *fmt, ...) {
    int line, col;
    line_col(p, at, &line, &col);
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return zi_error_set(p->err, ZI_EINVAL, "grammar: line %d:%d: %s", line, col, what);
}

static int oom(parser *p) {
    return zi_error_set(p->err, ZI_ENOMEM, "out of memory compiling the grammar");
}

/* Room for need (>= 0) elements of size bytes in *ptr (grow.h). */
static int grow(void **ptr, size_t *cap, int32_t need, size_t size) {
    return zi_grow_to(ptr, cap, size, (size_t)need, 16);
}

static int peek(const parser *p) {
    return p->i < p->len ? (uint8_t)p->t[p->i] : -1;
}

/* Spaces, tabs and comments; newlines too when nl. */
static void space(parser *p, bool nl) {
    while (p->i < p->len) {
        char c = p->t[p->i];
        if (c == '#')
            while (p->i < p->len && p->t[p->i] != '\n' && p->t[p->i] != '\r') p->i++;
        else if (c == ' ' || c == '\t' || (nl && (c == '\n' || c == '\r')))
            p->i++;
        else
            break;
    }
}

static bool name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static int new_rule(parser *p, const char *name, size_t name_len, int32_t parent, int32_t *out) {
    if (p->n_rules >= ZI_GRAMMAR_MAX_RULES)
        return perr(p, p->i, "more than %d rules (groups and repetitions count)",
                    ZI_GRAMMAR_MAX_RULES);
    if (grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof *p->rules)) return oom(p);
    p->rules[p->n_rules] = (prule){
        .name = name, .name_len = name_len, .parent = parent, .def_at = NO_AT, .ref_at = NO_AT};
    *out = p->n_rules++;
    return ZI_OK;
}

/* The named rule, created (undefined) on first sight. Linear: the rule
 * count is bounded and names are short. */
static int named_rule(parser *p, const char *name, size_t n, int32_t *out) {
    for (int32_t r = 0; r < p->n_rules; r++)
        if (p->rules[r].name && p->rules[r].name_len == n && !memcmp(p->rules[r].name, name, n)) {
            *out = r;
            return ZI_OK;
        }
    return new_rule(p, name, n, -1, out);
}

static int emit(parser *p, int32_t r, uint32_t type, uint32_t v) {
    if (p->total >= ZI_GRAMMAR_MAX_ELEMS)
        return perr(p, p->i, "grammar too large: more than %d elements after expanding repetitions",
                    ZI_GRAMMAR_MAX_ELEMS);
    prule *R = &p->rules[r];
    if (grow((void **)&R->el, &R->cap, R->n + 1, sizeof *R->el)) return oom(p);
    R->el[R->n++] = (gelem){.type = type, .v = v};
    p->total++;
    return ZI_OK;
}

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* A class from the ranges p->ranges[from .. n_ranges) (unsorted),
 * negated when neg: sorts, merges, complements in place. */
static int add_class(parser *p, int32_t from, bool neg, uint32_t *out) {
    int32_t n = p->n_ranges - from;
    /* (an empty class [] has no ranges yet: p->ranges may be NULL) */
    if (n > 1) qsort(p->ranges + from, (size_t)n, sizeof *p->ranges, cmp_range);
    int32_t m = 0;
    for (int32_t k = 0; k < n; k++) {
        uint32_t *r = p->ranges[from + k];
        if (m && r[0] <= p->ranges[from + m - 1][1] + 1) {
            if (r[1] > p->ranges[from + m - 1][1]) p->ranges[from + m - 1][1] = r[1];
        } else {
            p->ranges[from + m][0] = r[0], p->ranges[from + m][1] = r[1], m++;
        }
    }
    p->n_ranges = from + m;
    if (neg) { /* the gaps between the merged ranges, over [0, 0x10FFFF] */
        uint32_t(*tmp)[2] = malloc(((size_t)m + 1) * sizeof *tmp);
        if (!tmp) return oom(p);
        int32_t k2 = 0;
        uint32_t next = 0;
        for (int32_t k = 0; k < m; k++) {
            if (p->ranges[from + k][0] > next)
                tmp[k2][0] = next, tmp[k2][1] = p->ranges[from + k][0] - 1, k2++;
            next = p->ranges[from + k][1] + 1;
        }
        if (next <= 0x10FFFF) tmp[k2][0] = next, tmp[k2][1] = 0x10FFFF, k2++;
        if (grow((void **)&p->ranges, &p->cap_ranges, from + k2, sizeof *p->ranges)) {
            free(tmp);
            return oom(p);
        }
        memcpy(p->ranges + from, tmp, (size_t)k2 * sizeof *tmp);
        free(tmp);
        p->n_ranges = from + k2, m = k2;
    }
    if (grow((void **)&p->classes, &p->cap_classes, p->n_classes + 1, sizeof *p->classes))
        return oom(p);
    gclass *c = &p->classes[p->n_classes];
    *c = (gclass){.off = (uint32_t)from, .n = (uint32_t)m};
    for (int32_t k = 0; k < m; k++)
        for (uint32_t cp = p->ranges[from + k][0]; cp <= p->ranges[from + k][1] && cp < 128; cp++)
            c->ascii[cp >> 6] |= 1ull << (cp & 63);
    *out = (uint32_t)p->n_classes++;
    return ZI_OK;
}

static int add_range(parser *p, uint32_t lo, uint32_t hi) {
    if (grow((void **)&p->ranges, &p->cap_ranges, p->n_ranges + 1, sizeof *p->ranges))
        return oom(p);
    p->ranges[p->n_ranges][0] = lo, p->ranges[p->n_ranges][1] = hi;
    p->n_ranges++;
    return ZI_OK;
}

static int hex(parser *p, size_t at, int digits, uint32_t *cp) {
    uint32_t v = 0;
    for (int k = 0; k < digits; k++, p->i++) {
        int c = peek(p);
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return perr(p, at, "bad escape: expected %d hex digits", digits);
        v = v * 16 + (uint32_t)d;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return perr(p, at, "bad escape: U+%X is not a Unicode scalar value", v);
    *cp = v;
    return ZI_OK;
}

/* One character of a literal or class: an escape or a UTF-8 character. */
static int one_char(parser *p, uint32_t *cp) {
    size_t at = p->i;
    int c = peek(p);
    if (c < 0) return perr(p, at, "unexpected end of grammar");
    if (c == '\\') {
        p->i++;
        int e = peek(p);
        p->i++;
        switch (e) {
        case 'x':
            return hex(p, at, 2, cp);
        case 'u':
            return hex(p, at, 4, cp);
        case 'U':
            return hex(p, at, 8, cp);
        case 't':
            *cp = '\t';
            return ZI_OK;
        case 'r':
            *cp = '\r';
            return ZI_OK;
        case 'n':
            *cp = '\n';
            return ZI_OK;
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
            *cp = (uint32_t)e;
            return ZI_OK;
        case -1:
            return perr(p, at, "unexpected end of grammar after '\\'");
        default:
            if (e >= 0x20 && e < 0x7F) return perr(p, at, "bad escape '\\%c'", e);
            return perr(p, at, "bad escape: '\\' followed by byte 0x%02X", (unsigned)e);
        }
    }
    int need = c < 0x80                 ? 0
               : c >= 0xC2 && c <= 0xDF ? 1
               : c >= 0xE0 && c <= 0xEF ? 2
               : c >= 0xF0 && c <= 0xF4 ? 3
                                        : -1;
    if (need < 0) return perr(p, at, "invalid UTF-8 in the grammar");
    uint32_t v = need == 0 ? (uint32_t)c : (uint32_t)c & (0x3Fu >> need);
    p->i++;
    for (int k = 0; k < need; k++, p->i++) {
        int b = peek(p);
        if (b < 0 || (b & 0xC0) != 0x80) return perr(p, at, "invalid UTF-8 in the grammar");
        v = v << 6 | ((uint32_t)b & 0x3F);
    }
    static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
    if (v < min[need] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return perr(p, at, "invalid UTF-8 in the grammar");
    *cp = v;
    return ZI_OK;
}

static int literal(parser *p, int32_t r) {
    size_t at = p->i++;
    for (;;) {
        int c = peek(p);
        if (c < 0) return perr(p, at, "unterminated string literal");
        if (c == '"') break;
        uint32_t cp, cls;
        int rc = one_char(p, &cp);
        if (!rc) rc = add_range(p, cp, cp);
        if (!rc) rc = add_class(p, p->n_ranges - 1, false, &cls);
        if (!rc) rc = emit(p, r, G_CHAR, cls);
        if (rc) return rc;
    }
    p->i++;
    return ZI_OK;
}

static int char_class(parser *p, int32_t r) {
    size_t at = p->i++;
    bool neg = peek(p) == '^';
    if (neg) p->i++;
    int32_t from = p->n_ranges;
    for (;;) {
        int c = peek(p);
        if (c < 0) return perr(p, at, "unterminated character class: '[' is not closed");
        if (c == ']') break;
        size_t cat = p->i;
        uint32_t lo, hi;
        int rc = one_char(p, &lo);
        if (rc) return rc;
        hi = lo;
        if (peek(p) == '-' && p->i + 1 < p->len && p->t[p->i + 1] != ']') {
            p->i++;
            if ((rc = one_char(p, &hi))) return rc;
            if (hi < lo) return perr(p, cat, "bad range in character class: end before start");
        }
        if ((rc = add_range(p, lo, hi))) return rc;
    }
    p->i++;
    uint32_t cls;
    int rc = add_class(p, from, neg, &cls);
    return rc ? rc : emit(p, r, G_CHAR, cls);
}

static int number(parser *p, long *v) {
    size_t at = p->i;
    long x = 0;
    if (!(peek(p) >= '0' && peek(p) <= '9')) return perr(p, at, "expected a number in {m,n}");
    while (peek(p) >= '0' && peek(p) <= '9') {
        x = x * 10 + (peek(p) - '0');
        p->i++;
        if (x > ZI_GRAMMAR_MAX_REPEAT)
            return perr(p, at, "repetition count over %d", ZI_GRAMMAR_MAX_REPEAT);
    }
    *v = x;
    return ZI_OK;
}

/* The repetition at p->i applied to the item r.el[item ..]. */
static int repetition(parser *p, int32_t r, int32_t item) {
    size_t at = p->i;
    int c = peek(p);
    long lo, hi; /* hi < 0: unbounded */
    p->i++;
    if (c == '*')
        lo = 0, hi = -1;
    else if (c == '+')
        lo = 1, hi = -1;
    else if (c == '?')
        lo = 0, hi = 1;
    else {
        int rc;
        space(p, true);
        if ((rc = number(p, &lo))) return rc;
        space(p, true);
        hi = lo;
        if (peek(p) == ',') {
            p->i++;
            space(p, true);
            hi = -1;
            if (peek(p) >= '0' && peek(p) <= '9' && (rc = number(p, &hi))) return rc;
            space(p, true);
        }
        if (peek(p) != '}') return perr(p, at, "expected '}' to close '{'");
        p->i++;
        if (hi >= 0 && hi < lo)
            return perr(p, at, "bad repetition: {%ld,%ld} has max < min", lo, hi);
    }
    int32_t n_item = p->rules[r].n - item;
    if (n_item == 0) return ZI_OK; /* "" repeated is still nothing */
    int rc;
    if (n_item > 1) { /* a literal of several characters: one rule */
        int32_t g;
        if ((rc = new_rule(p, NULL, 0, r, &g))) return rc;
        for (int32_t k = 0; k < n_item; k++)
            if ((rc = emit(p, g, p->rules[r].el[item + k].type, p->rules[r].el[item + k].v)))
                return rc;
        if ((rc = emit(p, g, G_END, 0))) return rc;
        p->rules[r].n = item, p->total -= n_item;
        if ((rc = emit(p, r, G_REF, (uint32_t)g))) return rc;
    }
    gelem e = p->rules[r].el[item];
    p->rules[r].n = item, p->total--;
    for (long k = 0; k < lo; k++)
        if ((rc = emit(p, r, e.type, e.v))) return rc;
    if (hi == lo) return ZI_OK;
    int32_t prev = -1;
    for (long k = 0; k < (hi < 0 ? 1 : hi - lo); k++) {
        int32_t g;
        if ((rc = new_rule(p, NULL, 0, r, &g))) return rc;
        /* unbounded: g ::= e g | ; bounded: g ::= e prev | */
        int32_t tail = hi < 0 ? g : prev;
        if ((rc = emit(p, g, e.type, e.v))) return rc;
        if (tail >= 0 && (rc = emit(p, g, G_REF, (uint32_t)tail))) return rc;
        if ((rc = emit(p, g, G_ALT, 0)) || (rc = emit(p, g, G_END, 0))) return rc;
        prev = g;
    }
    return emit(p, r, G_REF, (uint32_t)prev);
}

static int alternates(parser *p, int32_t r, bool nested);

static int sequence(parser *p, int32_t r, bool nested) {
    for (;;) {
        int c = peek(p), rc;
        int32_t item = p->rules[r].n;
        size_t at = p->i;
        if (c == '"') {
            rc = literal(p, r);
        } else if (c == '[') {
            rc = char_class(p, r);
        } else if (c == '.') {
            p->i++;
            uint32_t cls;
            rc = add_range(p, 0, 0x10FFFF);
            if (!rc) rc = add_class(p, p->n_ranges - 1, false, &cls);
            if (!rc) rc = emit(p, r, G_CHAR, cls);
        } else if (c >= 0 && name_char(c)) {
            while (name_char(peek(p))) p->i++;
            int32_t ref;
            rc = named_rule(p, p->t + at, p->i - at, &ref);
            if (!rc && p->rules[ref].ref_at == NO_AT) p->rules[ref].ref_at = at;
            if (!rc) rc = emit(p, r, G_REF, (uint32_t)ref);
        } else if (c == '(') {
            if (++p->nesting > ZI_GRAMMAR_MAX_NESTING)
                return perr(p, at, "parentheses nested deeper than %d", ZI_GRAMMAR_MAX_NESTING);
            p->i++;
            space(p, true);
            int32_t g;
            rc = new_rule(p, NULL, 0, r, &g);
            if (!rc) rc = alternates(p, g, true);
            if (!rc && peek(p) < 0)
                return perr(p, at, "unbalanced parentheses: this '(' is not closed");
            if (!rc && peek(p) != ')')
                return perr(p, p->i, "unexpected '%c' inside parentheses", peek(p));
            if (!rc) rc = emit(p, g, G_END, 0);
            if (!rc) rc = emit(p, r, G_REF, (uint32_t)g);
            p->i++, p->nesting--;
        } else if (c == '<' || c == '!') {
            return perr(p, at, "token references (<...>) are not supported");
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            return perr(p, at, "repetition '%c' with nothing before it", c);
        } else {
            return ZI_OK;
        }
        if (rc) return rc;
        space(p, nested);
        while ((c = peek(p)) == '*' || c == '+' || c == '?' || c == '{') {
            if ((rc = repetition(p, r, item))) return rc;
            space(p, nested);
        }
    }
}

static int alternates(parser *p, int32_t r, bool nested) {
    int rc = sequence(p, r, nested);
    while (!rc && peek(p) == '|') {
        p->i++;
        space(p, true);
        if (!(rc = emit(p, r, G_ALT, 0))) rc = sequence(p, r, nested);
    }
    return rc;
}

static int rule(parser *p) {
    size_t at = p->i;
    if (!name_char(peek(p))) return perr(p, at, "expected a rule name");
    while (name_char(peek(p))) p->i++;
    size_t name_len = p->i - at;
    space(p, false);
    if (p->len - p->i < 3 || memcmp(p->t + p->i, "::=", 3))
        return perr(p, p->i, "expected '::=' after rule name '%.*s'", (int)name_len, p->t + at);
    p->i += 3;
    space(p, true);
    int32_t r;
    int rc = named_rule(p, p->t + at, name_len, &r);
    if (rc) return rc;
    if (p->rules[r].def_at != NO_AT) {
        int line, col;
        line_col(p, p->rules[r].def_at, &line, &col);
        return perr(p, at, "rule '%.*s' defined twice (first at %d:%d)", (int)name_len, p->t + at,
                    line, col);
    }
    p->rules[r].def_at = at;
    if ((rc = alternates(p, r, false)) || (rc = emit(p, r, G_END, 0))) return rc;
    int c = peek(p);
    if (c == ')') return perr(p, p->i, "unbalanced parentheses: ')' without '('");
    if (c >= 0 && c != '\n' && c != '\r') {
        if (c >= 0x20 && c < 0x7F) return perr(p, p->i, "unexpected '%c'", c);
        return perr(p, p->i, "unexpected byte 0x%02X", (unsigned)c);
    }
    return ZI_OK;
}

/* ---- layout and checks -------------------------------------------------- */

static const prule *named_of(const parser *p, int32_t r) {
    while (!p->rules[r].name) r = p->rules[r].parent;
    return &p->rules[r];
}

/* Left recursion, found on the graph of left corners (an edge r -> s when
 * rule r can reach a reference to s before any character). An edge is a
 * tail edge when the reference ends its alternative: grammar.c's matcher
 * returns from it straight to the caller's parent, so a cycle of tail
 * edges only (the repetition of something nullable, as `(a*)*` makes)
 * revisits the same stack nodes and stops. A cycle with any other edge
 * grows the stack at each turn: that is refused. The cycles are found as
 * strongly connected components (Tarjan). */
typedef struct sccs {
    int32_t *index, *low, *stack, *comp;
    bool *on;
    int32_t n_index, sp, n_comp;
} sccs;

static void strong(const zi_grammar *g, const bool *nullable, sccs *c, int32_t r) {
    c->index[r] = c->low[r] = c->n_index++;
    c->stack[c->sp++] = r, c->on[r] = true;
    for (int32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++)
        for (int32_t k = g->alt_start[a]; g->elems[k].type == G_REF; k++) {
            int32_t s = (int32_t)g->elems[k].v;
            if (c->index[s] < 0) {
                strong(g, nullable, c, s);
                if (c->low[s] < c->low[r]) c->low[r] = c->low[s];
            } else if (c->on[s] && c->index[s] < c->low[r]) {
                c->low[r] = c->index[s];
            }
            if (!nullable[s]) break;
        }
    if (c->low[r] == c->index[r]) {
        int32_t x;
        do {
            x = c->stack[--c->sp];
            c->on[x] = false, c->comp[x] = c->n_comp;
        } while (x != r);
        c->n_comp++;
    }
}

static int left_rec(parser *p, const zi_grammar *g, const bool *nullable) {
    int32_t R = g->n_rules;
    sccs c = {.index = malloc((size_t)R * sizeof(int32_t)),
              .low = malloc((size_t)R * sizeof(int32_t)),
              .stack = malloc((size_t)R * sizeof(int32_t)),
              .comp = malloc((size_t)R * sizeof(int32_t)),
              .on = calloc((size_t)R, sizeof(bool))};
    int rc = c.index && c.low && c.stack && c.comp && c.on ? ZI_OK : oom(p);
    if (!rc) memset(c.index, 0xff, (size_t)R * sizeof(int32_t));
    for (int32_t r = 0; !rc && r < R; r++)
        if (c.index[r] < 0) strong(g, nullable, &c, r);
    for (int32_t r = 0; !rc && r < R; r++)
        for (int32_t a = g->alt_off[r]; !rc && a < g->alt_off[r + 1]; a++)
            for (int32_t k = g->alt_start[a]; g->elems[k].type == G_REF; k++) {
                int32_t s = (int32_t)g->elems[k].v;
                if (c.comp[s] == c.comp[r] && g->elems[k + 1].type > G_ALT) {
                    const prule *n = named_of(p, r);
                    rc = perr(p, n->def_at,
                              "left recursion: rule '%.*s' can reach itself before any character",
                              (int)n->name_len, n->name);
                    break;
                }
                if (!nullable[s]) break;
            }
    free(c.index), free(c.low), free(c.stack), free(c.comp), free(c.on);
    return rc;
}

static int layout(parser *p, zi_grammar *g) {
    int32_t R = p->n_rules;
    int32_t *start = malloc((size_t)R * sizeof *start);
    g->elems = malloc((size_t)(p->total + 1) * sizeof *g->elems);
    g->alt_off = malloc(((size_t)R + 1) * sizeof *g->alt_off);
    g->alt_start = malloc((size_t)(p->total + 1) * sizeof *g->alt_start);
    bool *nullable = calloc((size_t)R, sizeof *nullable);
    int rc = start && g->elems && g->alt_off && g->alt_start && nullable ? ZI_OK : oom(p);
    g->n_rules = R;
    int32_t n = 0, na = 0;
    for (int32_t r = 0; !rc && r < R; r++) {
        start[r] = n;
        g->alt_off[r] = na;
        g->alt_start[na++] = n;
        for (int32_t k = 0; k < p->rules[r].n; k++) {
            g->elems[n++] = p->rules[r].el[k];
            if (p->rules[r].el[k].type == G_ALT) g->alt_start[na++] = n;
        }
    }
    if (!rc) g->alt_off[R] = na, g->n_elems = n;
    /* nullable: to a fixed point */
    for (bool changed = true; !rc && changed;) {
        changed = false;
        for (int32_t r = 0; r < R; r++) {
            if (nullable[r]) continue;
            for (int32_t a = g->alt_off[r]; a < g->alt_off[r + 1] && !nullable[r]; a++) {
                int32_t k = g->alt_start[a];
                while (g->elems[k].type == G_REF && nullable[g->elems[k].v]) k++;
                if (g->elems[k].type <= G_ALT) nullable[r] = changed = true;
            }
        }
    }
    if (!rc) rc = left_rec(p, g, nullable);
    free(start);
    free(nullable);
    return rc;
}

/* Refuses a grammar whose root matches no text at all: every way through
 * it loops on references without end (`root ::= a`, `a ::= a`), which
 * the tail cycles left_rec lets through would otherwise leave as a state
 * that takes nothing. A rule is productive when one alternative has only
 * classes and productive references; found to a fixed point. */
static int productive(parser *p, const zi_grammar *g, int32_t root) {
    bool *ok = calloc((size_t)g->n_rules, sizeof *ok);
    if (!ok) return oom(p);
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < g->n_rules; r++)
            for (int32_t a = g->alt_off[r]; !ok[r] && a < g->alt_off[r + 1]; a++) {
                int32_t k = g->alt_start[a];
                while (g->elems[k].type == G_CHAR ||
                       (g->elems[k].type == G_REF && ok[g->elems[k].v]))
                    k++;
                if (g->elems[k].type <= G_ALT) ok[r] = changed = true;
            }
    }
    int rc = ok[root] ? ZI_OK
                      : perr(p, p->rules[root].def_at,
                             "rule 'root' matches no text: its references loop without end");
    free(ok);
    return rc;
}

/* The shortest character of class c in UTF-8 bytes (ZI_GMIN_INF: empty). */
static uint32_t class_min_bytes(const zi_grammar *g, const gclass *c) {
    if (c->ascii[0] | c->ascii[1]) return 1;
    if (c->n == 0) return ZI_GMIN_INF;
    uint32_t lo = g->ranges[c->off][0];
    return lo < 0x80 ? 1 : lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
}

static uint32_t elem_min(const zi_grammar *g, const uint32_t *rule_min, int32_t k) {
    gelem e = g->elems[k];
    return e.type == G_CHAR ? class_min_bytes(g, &g->classes[e.v]) : rule_min[e.v];
}

/* g->rest_min (grammar_impl.h). The rules' shortest texts to a fixed point
 * first: a round can only lower them, and a shortest derivation uses no
 * rule twice on a path, so n_rules + 1 rounds suffice; the rounds go from
 * the last rule (helper rules come after their users) to settle sooner. */
static int min_lengths(parser *p, zi_grammar *g) {
    int32_t R = g->n_rules;
    uint32_t *rule_min = malloc((size_t)R * sizeof *rule_min);
    g->rest_min = malloc((size_t)g->n_elems * sizeof *g->rest_min);
    if (!rule_min || !g->rest_min) {
        free(rule_min);
        return oom(p);
    }
    for (int32_t r = 0; r < R; r++) rule_min[r] = ZI_GMIN_INF;
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = R - 1; r >= 0; r--)
            for (int32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
                uint32_t sum = 0;
                for (int32_t k = g->alt_start[a]; g->elems[k].type > G_ALT; k++)
                    sum = zi_gmin_add(sum, elem_min(g, rule_min, k));
                if (sum < rule_min[r]) rule_min[r] = sum, changed = true;
            }
    }
    for (int32_t a = 0; a < g->alt_off[R]; a++) {
        int32_t end = g->alt_start[a];
        while (g->elems[end].type > G_ALT) end++;
        g->rest_min[end] = 0;
        for (int32_t k = end - 1; k >= g->alt_start[a]; k--)
            g->rest_min[k] = zi_gmin_add(elem_min(g, rule_min, k), g->rest_min[k + 1]);
    }
    free(rule_min);
    return ZI_OK;
}

void zi_grammar_free(zi_grammar *g) {
    if (!g) return;
    free(g->elems);
    free(g->alt_off);
    free(g->alt_start);
    free(g->classes);
    free(g->ranges);
    free(g->rest_min);
    free(g);
}

int zi_grammar_compile(const char *text, size_t len, zi_grammar **out, zi_error *err) {
    *out = NULL;
    if (len > ZI_GRAMMAR_MAX_TEXT)
        return zi_error_set(err, ZI_EINVAL, "grammar: %zu bytes, more than the limit of %d", len,
                            ZI_GRAMMAR_MAX_TEXT);
    parser p = {.t = text, .len = len, .err = err};
    int rc = ZI_OK;
    space(&p, true);
    while (!rc && p.i < p.len) {
        rc = rule(&p);
        space(&p, true);
    }
    if (!rc && p.n_rules == 0) rc = perr(&p, 0, "empty grammar: no rules");
    for (int32_t r = 0; !rc && r < p.n_rules; r++)
        if (p.rules[r].name && p.rules[r].def_at == NO_AT)
            rc = perr(&p, p.rules[r].ref_at, "undefined rule '%.*s'", (int)p.rules[r].name_len,
                      p.rules[r].name);
    int32_t root = -1;
    for (int32_t r = 0; !rc && r < p.n_rules; r++)
        if (p.rules[r].name && p.rules[r].name_len == 4 && !memcmp(p.rules[r].name, "root", 4))
            root = r;
    if (!rc && root < 0) rc = perr(&p, 0, "no rule named 'root' (the start rule)");
    zi_grammar *g = rc ? NULL : calloc(1, sizeof *g);
    if (!rc && !g) rc = oom(&p);
    if (!rc) rc = layout(&p, g);
    if (!rc) rc = productive(&p, g, root);
    if (!rc) {
        g->root = root;
        g->classes = p.classes, g->n_classes = p.n_classes;
        g->ranges = p.ranges, g->n_ranges = p.n_ranges;
        p.classes = NULL, p.ranges = NULL;
        rc = min_lengths(&p, g);
    }
    if (!rc) {
        *out = g;
    } else {
        zi_grammar_free(g);
    }
    for (int32_t r = 0; r < p.n_rules; r++) free(p.rules[r].el);
    free(p.rules);
    free(p.classes);
    free(p.ranges);
    return rc;
}
