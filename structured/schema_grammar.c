/*
 * schema_grammar.c - JSON Schema to GBNF (see schema_grammar.h): the
 * schema is parsed with jansson and walked once; each subschema becomes a
 * rule `sN` (a $ref target one rule, memoized, so recursive schemas are
 * recursive rules), composed over a fixed prelude of JSON rules (ws,
 * value, object, array, string, number, the formats). Integer bounds
 * become digit grammars (the decimal strings of a range, split by length
 * and first digit), as llama.cpp's json-schema-to-grammar does.
 */
#include "schema_grammar.h"

#include "grow.h"
#include "utf8.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PFX "response_format.json_schema"
#define BIG 9999999999999999LL /* the largest 16-digit integer */
#define MAX_PTR 512
/* Appends a string literal. */
#define APPEND(b, lit) zi_gbnf_append((b), (lit), sizeof(lit) - 1)

static const char PRELUDE[] =
    "ws ::= ( \" \" | \"\\n\" [ \\t]{0,20} )?\n"
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* "
    ")? \"}\"\n"
    "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "number ::= integer ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "frac ::= \".\" [0-9]{0,15} [1-9]\n"
    "date ::= [0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | "
    "\"3\" [01] )\n"
    "time ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" "
    "[0-9]{1,6} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n"
    "date-time ::= date \"T\" time\n"
    "uuid ::= [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} "
    "\"-\" [0-9a-fA-F]{12}\n"
    "octet ::= \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]\n"
    "ipv4 ::= octet \".\" octet \".\" octet \".\" octet\n"
    "atext ::= [A-Za-z0-9!#$%&'*+/=?^_`{|}~-]\n"
    "label ::= [A-Za-z0-9] ( [A-Za-z0-9-]{0,30} [A-Za-z0-9] )?\n"
    "email ::= atext{1,32} ( \".\" atext{1,32} ){0,2} \"@\" label ( \".\" label ){1,3}\n";

static const char *const ANNOTATIONS[] = {
    "title",    "description",   "default",         "examples",
    "$schema",  "$id",           "$comment",        "deprecated",
    "readOnly", "writeOnly",     "contentEncoding", "$anchor",
    "nullable", "discriminator", "strict",          "contentMediaType",
    NULL};
static const char *const KEYWORDS[] = {"type",
                                       "properties",
                                       "required",
                                       "additionalProperties",
                                       "items",
                                       "prefixItems",
                                       "minItems",
                                       "maxItems",
                                       "enum",
                                       "const",
                                       "anyOf",
                                       "oneOf",
                                       "allOf",
                                       "$ref",
                                       "pattern",
                                       "format",
                                       "minLength",
                                       "maxLength",
                                       "minimum",
                                       "maximum",
                                       "exclusiveMinimum",
                                       "exclusiveMaximum",
                                       "$defs",
                                       "definitions",
                                       "uniqueItems",
                                       NULL};

typedef struct {
    const json_t *target;
    int id;
} refmemo;

typedef struct {
    json_t *root;
    zi_gbnf_buf *out;
    zi_error *err;
    int n_rules, depth;
    refmemo *refs;
    size_t n_refs, cap_refs;
    char ptr[MAX_PTR]; /* the JSON pointer of the subschema being compiled */
    size_t plen;
} sgen;

static bool in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

/* An error, its message led by the field as a dotted path (the
 * protocol's "field") and ending with the JSON pointer. */
static int sfail(sgen *g, int code, const char *fmt, const char *arg) {
    char what[1024], dotted[MAX_PTR];
    snprintf(what, sizeof what, fmt, arg);
    size_t n = 0;
    for (const char *p = g->ptr; *p && n + 1 < sizeof dotted; p++) {
        if (*p == '/')
            dotted[n++] = '.';
        else if (*p == '~' && (p[1] == '0' || p[1] == '1'))
            dotted[n++] = *++p == '0' ? '~' : '/';
        else
            dotted[n++] = *p;
    }
    dotted[n] = 0;
    /* a key quoted from the schema may hold a newline: zi_error_set keeps
     * the message one line */
    return zi_error_set(g->err, code, PFX "%s: %s (at #%s)", dotted, what, g->ptr);
}

/* Appends "/seg" (escaped) to the pointer; returns the old length. */
static size_t ptr_push(sgen *g, const char *seg) {
    size_t old = g->plen;
    char tmp[MAX_PTR];
    size_t n = 0;
    tmp[n++] = '/';
    for (const char *s = seg; *s && n + 3 < sizeof tmp; s++) {
        if (*s == '~' || *s == '/')
            tmp[n++] = '~', tmp[n++] = *s == '~' ? '0' : '1';
        else
            tmp[n++] = *s;
    }
    if (g->plen + n + 1 < MAX_PTR) {
        memcpy(g->ptr + g->plen, tmp, n);
        g->plen += n;
        g->ptr[g->plen] = 0;
    }
    return old;
}

static size_t ptr_push_index(sgen *g, size_t i) {
    char s[32];
    snprintf(s, sizeof s, "%zu", i);
    return ptr_push(g, s);
}

static void ptr_pop(sgen *g, size_t old) {
    g->plen = old;
    g->ptr[old] = 0;
}

static int new_rule(sgen *g) {
    return g->n_rules++;
}

/* Writes "sID ::= body\n". */
static int put_rule(sgen *g, int id, zi_gbnf_buf *body) {
    zi_gbnf_printf(g->out, "s%d ::= %s\n", id, body->p ? body->p : "\"\"");
    bool oom = body->oom;
    free(body->p);
    *body = (zi_gbnf_buf){0};
    if (oom || g->out->oom) return zi_error_set(g->err, ZI_ENOMEM, "out of memory");
    return ZI_OK;
}

static int visit(sgen *g, const json_t *s, int *id);
static int object_rule(sgen *g, const json_t *s, zi_gbnf_buf *b);
static int array_rule(sgen *g, const json_t *s, zi_gbnf_buf *b);
static int visit_all(sgen *g, const json_t *s, zi_gbnf_buf *b);

/* A non-negative integer keyword (or -1 when absent). */
static int count_kw(sgen *g, const json_t *s, const char *key, long *v) {
    const json_t *j = json_object_get(s, key);
    *v = -1;
    if (!j) return ZI_OK;
    double d = json_number_value(j);
    if (!json_is_number(j) || d < 0 || d != floor(d))
        return sfail(g, ZI_EINVAL, "'%s' must be a non-negative integer", key);
    if (d > ZI_SCHEMA_MAX_LENGTH)
        return sfail(g, ZI_EUNSUPPORTED, "'%s' over 1000 is not supported", key);
    *v = (long)d;
    return ZI_OK;
}

/* ---- integers as digit grammars ---- */

/* The decimal strings from x to y, both of d digits (x <= y). */
static void same_len(zi_gbnf_buf *b, const char *x, const char *y, int d) {
    if (d == 0) {
        APPEND(b, "\"\"");
        return;
    }
    bool x_low = true, y_high = true;
    for (int i = 1; i < d; i++) x_low &= x[i] == '0', y_high &= y[i] == '9';
    if (x_low && y_high) {
        zi_gbnf_printf(b, "[%c-%c]", x[0], y[0]);
        if (d > 1) zi_gbnf_printf(b, " [0-9]{%d}", d - 1);
        return;
    }
    if (x[0] == y[0]) {
        zi_gbnf_printf(b, "\"%c\" ", x[0]);
        same_len(b, x + 1, y + 1, d - 1);
        return;
    }
    char nines[20], zeros[20];
    memset(nines, '9', sizeof nines), memset(zeros, '0', sizeof zeros);
    zi_gbnf_printf(b, "( \"%c\" ( ", x[0]);
    same_len(b, x + 1, nines, d - 1);
    APPEND(b, " )");
    if (x[0] + 1 <= y[0] - 1) zi_gbnf_printf(b, " | [%c-%c] [0-9]{%d}", x[0] + 1, y[0] - 1, d - 1);
    zi_gbnf_printf(b, " | \"%c\" ( ", y[0]);
    same_len(b, zeros, y + 1, d - 1);
    APPEND(b, " ) )");
}

/* The decimal strings (no leading zeros) of a..b, 0 <= a <= b <= BIG. */
static void nonneg_range(zi_gbnf_buf *b, long long a, long long hi) {
    APPEND(b, "( ");
    long long p = 1;
    bool first = true;
    for (int d = 1; d <= 16; d++, p *= 10) {
        long long lo_d = d == 1 ? 0 : p, hi_d = p * 10 - 1;
        long long x = a > lo_d ? a : lo_d, y = hi < hi_d ? hi : hi_d;
        if (x > y) continue;
        char xs[24], ys[24];
        snprintf(xs, sizeof xs, "%lld", x), snprintf(ys, sizeof ys, "%lld", y);
        if (!first) APPEND(b, " | ");
        first = false;
        APPEND(b, "( ");
        same_len(b, xs, ys, d);
        APPEND(b, " )");
    }
    APPEND(b, " )");
}

/* The integers lo..hi (|lo|, |hi| <= BIG, lo <= hi). */
static void int_range(zi_gbnf_buf *b, long long lo, long long hi) {
    APPEND(b, "( ");
    if (lo < 0) {
        APPEND(b, "\"-\" ");
        nonneg_range(b, hi < -1 ? -hi : 1, -lo);
        if (hi >= 0) APPEND(b, " | ");
    }
    if (hi >= 0) nonneg_range(b, lo > 0 ? lo : 0, hi);
    APPEND(b, " )");
}

static long long clamp_ll(double v) {
    return v > (double)BIG ? BIG : v < -(double)BIG ? -BIG : (long long)v;
}

/* The bounds of a number or integer: [lo, hi], each maybe exclusive. */
static int bounds(sgen *g, const json_t *s, double *lo, bool *lo_x, double *hi, bool *hi_x,
                  bool *any) {
    *lo = -INFINITY, *hi = INFINITY, *lo_x = *hi_x = *any = false;
    static const char *const K[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        const json_t *j = json_object_get(s, K[i]);
        if (!j) continue;
        if (!json_is_number(j))
            return sfail(g, json_is_boolean(j) ? ZI_EUNSUPPORTED : ZI_EINVAL,
                         "'%s' must be a number (draft-4 booleans are not supported)", K[i]);
        double v = json_number_value(j);
        bool x = i % 2 == 1;
        *any = true;
        if (i < 2 && (v > *lo || (v == *lo && x))) *lo = v, *lo_x = x;
        if (i >= 2 && (v < *hi || (v == *hi && x))) *hi = v, *hi_x = x;
    }
    return ZI_OK;
}

static int integer_rule(sgen *g, const json_t *s, zi_gbnf_buf *b) {
    double lo, hi;
    bool lx, hx, any;
    int rc = bounds(g, s, &lo, &lx, &hi, &hx, &any);
    if (rc) return rc;
    if (!any) {
        APPEND(b, "integer");
        return ZI_OK;
    }
    long long a = clamp_ll(lx ? floor(lo) + 1 : ceil(lo));
    long long z = clamp_ll(hx ? ceil(hi) - 1 : floor(hi));
    if (a > z) return sfail(g, ZI_EINVAL, "%sno integer lies within the bounds", "");
    int_range(b, a, z);
    return ZI_OK;
}

/* A bounded number: the integers inside, and k.f for the integer parts
 * whose whole interval lies inside (no exponent). */
static int number_rule(sgen *g, const json_t *s, zi_gbnf_buf *b) {
    double lo, hi;
    bool lx, hx, any;
    int rc = bounds(g, s, &lo, &lx, &hi, &hx, &any);
    if (rc) return rc;
    if (!any) {
        APPEND(b, "number");
        return ZI_OK;
    }
    long long a = clamp_ll(lx ? floor(lo) + 1 : ceil(lo));
    long long z = clamp_ll(hx ? ceil(hi) - 1 : floor(hi));
    long long pa = clamp_ll(ceil(lo) > 0 ? ceil(lo) : 0), pz = clamp_ll(floor(hi) - 1);
    long long na = clamp_ll(ceil(-hi) > 0 ? ceil(-hi) : 0), nz = clamp_ll(floor(-lo) - 1);
    bool first = true;
    APPEND(b, "( ");
    if (a <= z) int_range(b, a, z), first = false;
    if (pa <= pz) {
        zi_gbnf_append(b, first ? "" : " | ", first ? 0 : 3);
        nonneg_range(b, pa, pz);
        APPEND(b, " frac");
        first = false;
    }
    if (na <= nz) {
        zi_gbnf_append(b, first ? "" : " | ", first ? 0 : 3);
        APPEND(b, "\"-\" ");
        nonneg_range(b, na, nz);
        APPEND(b, " frac");
        first = false;
    }
    APPEND(b, " )");
    if (first) return sfail(g, ZI_EINVAL, "%sno number lies within the bounds", "");
    return ZI_OK;
}

/* ---- strings ---- */

static int string_rule(sgen *g, const json_t *s, zi_gbnf_buf *b) {
    const json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    long mn, mx;
    int rc = count_kw(g, s, "minLength", &mn);
    if (!rc) rc = count_kw(g, s, "maxLength", &mx);
    if (rc) return rc;
    if ((pat || fmt) && (mn >= 0 || mx >= 0))
        return sfail(g, ZI_EUNSUPPORTED, "%s with minLength or maxLength is not supported",
                     pat ? "pattern" : "format");
    if (pat && fmt) return sfail(g, ZI_EUNSUPPORTED, "%spattern with format is not supported", "");
    APPEND(b, "\"\\\"\" ");
    if (pat) {
        if (!json_is_string(pat)) return sfail(g, ZI_EINVAL, "%s'pattern' must be a string", "");
        size_t old = ptr_push(g, "pattern");
        zi_error e = {0};
        rc =
            zi_regex_to_gbnf(json_string_value(pat), json_string_length(pat), ZI_REGEX_JSON, b, &e);
        if (rc) return sfail(g, rc, "pattern: %s", e.msg);
        ptr_pop(g, old);
    } else if (fmt) {
        static const char *const F[] = {"date", "time", "date-time", "uuid", "email", "ipv4", NULL};
        const char *f = json_string_value(fmt);
        if (!f) return sfail(g, ZI_EINVAL, "%s'format' must be a string", "");
        if (!in_list(F, f))
            return sfail(g, ZI_EUNSUPPORTED,
                         "format '%s' is not supported (date, time, date-time, uuid, email, ipv4)",
                         f);
        zi_gbnf_append(b, f, strlen(f));
    } else if (mx >= 0) {
        if (mn > mx) return sfail(g, ZI_EINVAL, "%sminLength over maxLength", "");
        zi_gbnf_printf(b, "char{%ld,%ld}", mn < 0 ? 0 : mn, mx);
    } else if (mn > 0) {
        zi_gbnf_printf(b, "char{%ld,}", mn);
    } else {
        APPEND(b, "char*");
    }
    APPEND(b, " \"\\\"\"");
    return ZI_OK;
}

/* ---- enum / const ---- */

static int literal_value(sgen *g, const json_t *v, zi_gbnf_buf *b) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
    if (!t) return zi_error_set(g->err, ZI_ENOMEM, "out of memory");
    zi_gbnf_literal(b, t, strlen(t));
    free(t);
    return ZI_OK;
}

static int cmp_cstr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The sorted, distinct texts v[lo..hi), all sharing their first `at`
 * bytes, as a trie of alternatives: the common prefix once, then a group
 * per next character. An enum of many values is then a few parse stacks
 * at each byte rather than one per value (grammar.h keeps at most
 * ZI_GRAMMAR_MAX_STACKS). */
static void enum_trie(zi_gbnf_buf *b, char **v, size_t lo, size_t hi, size_t at) {
    if (hi - lo == 1) {
        zi_gbnf_literal(b, v[lo] + at, strlen(v[lo] + at));
        return;
    }
    size_t end = at; /* the common prefix, cut back to a character boundary */
    while (v[lo][end] && v[lo][end] == v[hi - 1][end]) end++;
    while (end > at && ((unsigned char)v[lo][end] & 0xC0) == 0x80) end--;
    if (end > at) {
        zi_gbnf_literal(b, v[lo] + at, end - at);
        APPEND(b, " ");
    }
    APPEND(b, "(");
    size_t i = lo;
    if (!v[i][end]) i++; /* one value ends here: an empty alternative first */
    if (i > lo) APPEND(b, " ");
    for (bool first = i == lo; i < hi; first = false) {
        size_t n = 1; /* the next character's bytes */
        while (((unsigned char)v[i][end + n] & 0xC0) == 0x80) n++;
        size_t j = i + 1;
        while (j < hi && !strncmp(v[j] + end, v[i] + end, n)) j++;
        if (first)
            APPEND(b, " ");
        else
            APPEND(b, " | ");
        enum_trie(b, v, i, j, end);
        i = j;
    }
    APPEND(b, " )");
}

static int enum_rule(sgen *g, const json_t *s, zi_gbnf_buf *b) {
    const json_t *c = json_object_get(s, "const"), *e = json_object_get(s, "enum");
    if (c && e) return sfail(g, ZI_EUNSUPPORTED, "%senum with const is not supported", "");
    if (c) return literal_value(g, c, b);
    if (!json_is_array(e) || json_array_size(e) == 0)
        return sfail(g, ZI_EINVAL, "%s'enum' must be a non-empty array", "");
    if (json_array_size(e) > ZI_SCHEMA_MAX_ENUM)
        return sfail(g, ZI_EUNSUPPORTED, "%san enum of over 1024 values is not supported", "");
    size_t n = json_array_size(e), k = 0;
    char **v = calloc(n, sizeof *v);
    int rc = v ? ZI_OK : zi_error_set(g->err, ZI_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < n; i++) {
        v[i] = json_dumps(json_array_get(e, i),
                          JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
        if (!v[i]) rc = zi_error_set(g->err, ZI_ENOMEM, "out of memory");
    }
    if (!rc) {
        qsort(v, n, sizeof *v, cmp_cstr);
        for (size_t i = 0; i < n; i++) { /* distinct */
            char *t = v[i];
            v[i] = NULL;
            if (k == 0 || strcmp(v[k - 1], t))
                v[k++] = t;
            else
                free(t);
        }
        APPEND(b, "( ");
        enum_trie(b, v, 0, k, 0);
        APPEND(b, " )");
    }
    for (size_t i = 0; v && i < n; i++) free(v[i]);
    free(v);
    return rc;
}

/* The rule for one type name. */
static int typed_rule(sgen *g, const json_t *s, const char *t, zi_gbnf_buf *b) {
    if (!strcmp(t, "string")) return string_rule(g, s, b);
    if (!strcmp(t, "integer")) return integer_rule(g, s, b);
    if (!strcmp(t, "number")) return number_rule(g, s, b);
    if (!strcmp(t, "boolean")) return APPEND(b, "( \"true\" | \"false\" )"), ZI_OK;
    if (!strcmp(t, "null")) return APPEND(b, "\"null\""), ZI_OK;
    if (!strcmp(t, "object")) return object_rule(g, s, b);
    if (!strcmp(t, "array")) return array_rule(g, s, b);
    return sfail(g, ZI_EINVAL, "unknown type '%s'", t);
}

/* The type a schema without "type" describes, from its keywords. */
static const char *implied_type(const json_t *s) {
    static const char *const OBJ[] = {"properties", "additionalProperties", "required", NULL};
    static const char *const ARR[] = {"items", "prefixItems", "minItems", "maxItems", NULL};
    static const char *const STR[] = {"pattern", "format", "minLength", "maxLength", NULL};
    static const char *const NUM[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                      NULL};
    const char *const *L[4] = {OBJ, ARR, STR, NUM};
    const char *T[4] = {"object", "array", "string", "number"};
    for (int i = 0; i < 4; i++)
        for (const char *const *k = L[i]; *k; k++)
            if (json_object_get(s, *k)) return T[i];
    return NULL;
}

/* Keywords that give a value's shape (so may not stand beside $ref or a
 * combinator, whose meaning would then be an intersection). */
static const char *shape_keyword(const json_t *s, const char *except) {
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (!strcmp(k, except) || in_list(ANNOTATIONS, k) || !strcmp(k, "$defs") ||
            !strcmp(k, "definitions"))
            continue;
        return k;
    }
    return NULL;
}

static int resolve_ref(sgen *g, const json_t *s, const json_t **target) {
    const char *r = json_string_value(json_object_get(s, "$ref"));
    if (!r) return sfail(g, ZI_EINVAL, "%s'$ref' must be a string", "");
    if (r[0] != '#') return sfail(g, ZI_EUNSUPPORTED, "$ref '%s' (only local references, #...)", r);
    const json_t *t = g->root;
    const char *p = r + 1;
    while (*p == '/') {
        p++;
        char seg[256];
        size_t n = 0;
        for (; *p && *p != '/' && n + 1 < sizeof seg; p++) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1'))
                seg[n++] = p[1] == '0' ? '~' : '/', p++;
            else
                seg[n++] = *p;
        }
        seg[n] = 0;
        if (json_is_object(t))
            t = json_object_get(t, seg);
        else if (json_is_array(t))
            t = json_array_get(t, (size_t)strtoul(seg, NULL, 10));
        else
            t = NULL;
        if (!t) return sfail(g, ZI_EINVAL, "$ref '%s' points at nothing", r);
    }
    if (*p) return sfail(g, ZI_EUNSUPPORTED, "$ref '%s' (only JSON pointers)", r);
    *target = t;
    return ZI_OK;
}

static int visit_ref(sgen *g, const json_t *s, int *id) {
    const char *k = shape_keyword(s, "$ref");
    if (k) return sfail(g, ZI_EUNSUPPORTED, "keyword '%s' beside $ref is not supported", k);
    const json_t *t;
    int rc = resolve_ref(g, s, &t);
    if (rc) return rc;
    for (size_t i = 0; i < g->n_refs; i++)
        if (g->refs[i].target == t) return *id = g->refs[i].id, ZI_OK;
    if (g->n_refs == g->cap_refs) {
        refmemo *r = zi_grow(g->refs, &g->cap_refs, sizeof *r, 16);
        if (!r) return zi_error_set(g->err, ZI_ENOMEM, "out of memory");
        g->refs = r;
    }
    int me = new_rule(g), child;
    g->refs[g->n_refs++] = (refmemo){t, me};
    /* errors inside name the pointer the reference leads to */
    char saved[MAX_PTR];
    size_t saved_len = g->plen;
    memcpy(saved, g->ptr, sizeof saved);
    const char *r = json_string_value(json_object_get(s, "$ref"));
    snprintf(g->ptr, sizeof g->ptr, "%s", r + 1);
    g->plen = strlen(g->ptr);
    rc = visit(g, t, &child);
    if (rc) return rc;
    memcpy(g->ptr, saved, sizeof saved), g->plen = saved_len;
    zi_gbnf_buf b = {0};
    zi_gbnf_printf(&b, "s%d", child);
    *id = me;
    return put_rule(g, me, &b);
}

/* anyOf / oneOf: any branch. */
static int visit_any(sgen *g, const json_t *s, const char *kw, zi_gbnf_buf *b) {
    const char *k = shape_keyword(s, kw);
    if (k) return sfail(g, ZI_EUNSUPPORTED, "keyword '%s' beside anyOf/oneOf is not supported", k);
    const json_t *l = json_object_get(s, kw);
    if (!json_is_array(l) || json_array_size(l) == 0)
        return sfail(g, ZI_EINVAL, "'%s' must be a non-empty array", kw);
    size_t old = ptr_push(g, kw);
    APPEND(b, "( ");
    for (size_t i = 0; i < json_array_size(l); i++) {
        size_t o2 = ptr_push_index(g, i);
        int child, rc = visit(g, json_array_get(l, i), &child);
        if (rc) return rc;
        ptr_pop(g, o2);
        zi_gbnf_printf(b, "%ss%d", i ? " | " : "", child);
    }
    APPEND(b, " )");
    ptr_pop(g, old);
    return ZI_OK;
}

static int visit(sgen *g, const json_t *s, int *id) {
    if (json_is_true(s)) return *id = -1, ZI_OK;
    if (json_is_false(s)) return sfail(g, ZI_EINVAL, "%sthe schema false matches nothing", "");
    if (!json_is_object(s))
        return sfail(g, ZI_EINVAL, "%sa schema must be an object or a boolean", "");
    if (g->depth >= ZI_SCHEMA_MAX_NESTING)
        return sfail(g, ZI_EUNSUPPORTED, "%sschemas nested over 64 deep", "");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (in_list(ANNOTATIONS, k)) continue;
        if (!in_list(KEYWORDS, k))
            return sfail(g, ZI_EUNSUPPORTED, "keyword '%s' is not supported", k);
    }
    const json_t *u = json_object_get(s, "uniqueItems");
    if (u && !json_is_false(u))
        return sfail(g, ZI_EUNSUPPORTED, "%skeyword 'uniqueItems' (true) is not supported", "");
    if (json_object_get(s, "$ref")) return visit_ref(g, s, id);
    g->depth++;
    zi_gbnf_buf b = {0};
    int rc = ZI_OK;
    const json_t *type = json_object_get(s, "type");
    if (json_object_get(s, "anyOf")) {
        rc = visit_any(g, s, "anyOf", &b);
    } else if (json_object_get(s, "oneOf")) {
        rc = visit_any(g, s, "oneOf", &b);
    } else if (json_object_get(s, "allOf")) {
        rc = visit_all(g, s, &b);
    } else if (json_object_get(s, "enum") || json_object_get(s, "const")) {
        rc = enum_rule(g, s, &b);
    } else if (json_is_array(type)) {
        APPEND(&b, "( ");
        for (size_t i = 0; !rc && i < json_array_size(type); i++) {
            const char *t = json_string_value(json_array_get(type, i));
            if (!t) rc = sfail(g, ZI_EINVAL, "%s'type' must hold type names", "");
            if (i) APPEND(&b, " | ");
            if (!rc) rc = typed_rule(g, s, t, &b);
        }
        APPEND(&b, " )");
        if (!rc && json_array_size(type) == 0) rc = sfail(g, ZI_EINVAL, "%s'type' is empty", "");
    } else if (type) {
        if (!json_is_string(type))
            rc = sfail(g, ZI_EINVAL, "%s'type' must be a string or a list", "");
        else
            rc = typed_rule(g, s, json_string_value(type), &b);
    } else {
        const char *t = implied_type(s);
        if (t)
            rc = typed_rule(g, s, t, &b);
        else
            APPEND(&b, "value");
    }
    g->depth--;
    if (rc) {
        free(b.p);
        return rc;
    }
    *id = new_rule(g);
    return put_rule(g, *id, &b);
}

/* ---- objects and arrays ---- */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A rule for the characters of a JSON string that are none of the names
 * n[0..k) (sorted, all sharing their first `at` bytes). */
static int not_names(sgen *g, const char **n, size_t k, size_t at, int *id) {
    zi_gbnf_buf b = {0};
    bool terminal = false;
    APPEND(&b, "( [^\"\\\\\\x00-\\x1F");
    for (size_t i = 0; i < k; i++) {
        if (!n[i][at]) {
            terminal = true;
            continue;
        }
        uint32_t cp;
        if (!zi_utf8_next((const unsigned char *)n[i] + at, strlen(n[i] + at), &cp)) cp = 0xFFFD;
        zi_gbnf_class_cp(&b, cp);
    }
    APPEND(&b, "] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) ) char*");
    for (size_t i = 0; i < k;) {
        if (!n[i][at]) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t w = zi_utf8_next((const unsigned char *)n[i] + at, strlen(n[i] + at), &cp);
        if (!w) return sfail(g, ZI_EINVAL, "property name '%s' is not UTF-8", n[i]);
        size_t j = i + 1;
        while (j < k && !strncmp(n[j] + at, n[i] + at, w)) j++;
        int child, rc = not_names(g, n + i, j - i, at + w, &child);
        if (rc) {
            free(b.p);
            return rc;
        }
        APPEND(&b, " | ");
        zi_gbnf_literal(&b, n[i] + at, w);
        zi_gbnf_printf(&b, " s%d", child);
        i = j;
    }
    if (!terminal) APPEND(&b, " | \"\"");
    *id = new_rule(g);
    return put_rule(g, *id, &b);
}

static void ref_or_value(zi_gbnf_buf *b, int id) {
    if (id < 0)
        APPEND(b, "value");
    else
        zi_gbnf_printf(b, "s%d", id);
}

static int object_rule(sgen *g, const json_t *s, zi_gbnf_buf *b) {
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *ap = json_object_get(s, "additionalProperties");
    if (!props && !ap && !req) {
        APPEND(b, "object");
        return ZI_OK;
    }
    if (props && !json_is_object(props))
        return sfail(g, ZI_EINVAL, "%s'properties' must be an object", "");
    if (req && !json_is_array(req)) return sfail(g, ZI_EINVAL, "%s'required' must be an array", "");
    size_t n = json_object_size(props);
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *r = json_string_value(json_array_get(req, i));
        if (!r) return sfail(g, ZI_EINVAL, "%s'required' must hold strings", "");
        if (!json_object_get(props, r))
            return sfail(g, ZI_EUNSUPPORTED,
                         "required property '%s' without a schema in 'properties' is not "
                         "supported",
                         r);
    }
    const char **names = calloc(n + 1, sizeof *names);
    int *kv = calloc(n + 1, sizeof *kv);
    bool *must = calloc(n + 1, sizeof *must);
    int rc = names && kv && must ? ZI_OK : zi_error_set(g->err, ZI_ENOMEM, "out of memory");
    size_t i = 0;
    const char *k;
    const json_t *v;
    size_t old = ptr_push(g, "properties");
    json_object_foreach((json_t *)props, k, v) {
        if (rc) break;
        names[i] = k;
        for (size_t r = 0; r < json_array_size(req); r++)
            if (!strcmp(json_string_value(json_array_get(req, r)), k)) must[i] = true;
        int child;
        size_t o2 = ptr_push(g, k);
        rc = visit(g, v, &child);
        if (rc) break;
        ptr_pop(g, o2);
        zi_gbnf_buf kb = {0};
        json_t *ks = json_string(k);
        char *key = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!key) {
            rc = zi_error_set(g->err, ZI_ENOMEM, "out of memory");
            break;
        }
        zi_gbnf_literal(&kb, key, strlen(key));
        free(key);
        APPEND(&kb, " ws \":\" ws ");
        ref_or_value(&kb, child);
        APPEND(&kb, " ws");
        kv[i] = new_rule(g);
        rc = put_rule(g, kv[i], &kb);
        i++;
    }
    if (!rc) ptr_pop(g, old);
    /* the extra keys: any string but the names, with ap's values */
    int akv = -1;
    if (!rc && ap && !json_is_false(ap)) {
        int val = -1, nk = -1;
        if (!json_is_true(ap)) {
            size_t o2 = ptr_push(g, "additionalProperties");
            rc = visit(g, ap, &val);
            if (!rc) ptr_pop(g, o2);
        }
        if (!rc && n) {
            qsort(names, n, sizeof *names, cmp_str);
            rc = not_names(g, names, n, 0, &nk);
        }
        if (!rc) {
            zi_gbnf_buf ab = {0};
            APPEND(&ab, "\"\\\"\" ");
            if (nk >= 0)
                zi_gbnf_printf(&ab, "s%d", nk);
            else
                APPEND(&ab, "char*");
            APPEND(&ab, " \"\\\"\" ws \":\" ws ");
            ref_or_value(&ab, val);
            APPEND(&ab, " ws");
            akv = new_rule(g);
            rc = put_rule(g, akv, &ab);
        }
    }
    /* rest[i]: after a member, properties i.. (each "," first) */
    int *rest = rc ? NULL : calloc(n + 1, sizeof *rest);
    if (!rc && !rest) rc = zi_error_set(g->err, ZI_ENOMEM, "out of memory");
    for (size_t j = n + 1; !rc && j-- > 0;) {
        zi_gbnf_buf rb = {0};
        if (j == n) {
            if (akv >= 0) zi_gbnf_printf(&rb, "( \",\" ws s%d )*", akv);
        } else {
            zi_gbnf_printf(&rb, "( \",\" ws s%d )%s s%d", kv[j], must[j] ? "" : "?", rest[j + 1]);
        }
        rest[j] = new_rule(g);
        rc = put_rule(g, rest[j], &rb);
    }
    if (!rc) {
        APPEND(b, "\"{\" ws ( ");
        bool any_required = false;
        for (size_t j = 0; j < n; j++) {
            zi_gbnf_printf(b, "%ss%d s%d", j ? " | " : "", kv[j], rest[j + 1]);
            if (must[j]) {
                any_required = true;
                break;
            }
        }
        if (!any_required && akv >= 0) zi_gbnf_printf(b, "%ss%d s%d", n ? " | " : "", akv, rest[n]);
        if (!any_required && n == 0 && akv < 0) APPEND(b, "\"\"");
        zi_gbnf_append(b, any_required ? " ) \"}\"" : " )? \"}\"", any_required ? 6 : 7);
    }
    free(rest);
    free(names), free(kv), free(must);
    return rc;
}

/* allOf: one schema, or object schemas merged (their properties in order,
 * their required lists joined; no other properties). */
static int visit_all(sgen *g, const json_t *s, zi_gbnf_buf *b) {
    const json_t *l = json_object_get(s, "allOf");
    if (!json_is_array(l) || json_array_size(l) == 0)
        return sfail(g, ZI_EINVAL, "%s'allOf' must be a non-empty array", "");
    const char *k = shape_keyword(s, "allOf");
    if (json_array_size(l) == 1 && !k) {
        size_t old = ptr_push(g, "allOf");
        ptr_push(g, "0");
        int child, rc = visit(g, json_array_get(l, 0), &child);
        if (rc) return rc;
        ptr_pop(g, old);
        ref_or_value(b, child);
        return ZI_OK;
    }
    json_t *props = json_object(), *req = json_array(), *m = json_object();
    int rc = props && req && m ? ZI_OK : zi_error_set(g->err, ZI_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i <= json_array_size(l); i++) {
        const json_t *p = i == 0 ? s : json_array_get(l, i - 1);
        if (i && json_object_get(p, "$ref")) rc = resolve_ref(g, p, &p);
        if (rc) break;
        if (!json_is_object(p)) {
            rc = sfail(g, ZI_EUNSUPPORTED, "%sallOf of other than object schemas", "");
            break;
        }
        const json_t *v;
        json_object_foreach((json_t *)p, k, v) {
            if (in_list(ANNOTATIONS, k) || !strcmp(k, "$defs") || !strcmp(k, "definitions") ||
                (i == 0 && !strcmp(k, "allOf")))
                continue;
            if (!strcmp(k, "type") && json_is_string(v) && !strcmp(json_string_value(v), "object"))
                continue;
            if (!strcmp(k, "properties") && json_is_object(v)) {
                json_object_update((json_t *)props, (json_t *)v);
            } else if (!strcmp(k, "required") && json_is_array(v)) {
                json_array_extend(req, (json_t *)v);
            } else if (!strcmp(k, "additionalProperties") && json_is_false(v)) {
            } else {
                rc = sfail(g, ZI_EUNSUPPORTED,
                           "keyword '%s' in allOf (only object schemas: properties, required) is "
                           "not supported",
                           k);
                break;
            }
        }
    }
    if (!rc) {
        json_object_set(m, "properties", props);
        json_object_set(m, "required", req);
        rc = object_rule(g, m, b);
    }
    json_decref(props), json_decref(req), json_decref(m);
    return rc;
}

static int array_rule(sgen *g, const json_t *s, zi_gbnf_buf *b) {
    const json_t *items = json_object_get(s, "items"), *pre = json_object_get(s, "prefixItems");
    long mn, mx;
    int rc = count_kw(g, s, "minItems", &mn);
    if (!rc) rc = count_kw(g, s, "maxItems", &mx);
    if (rc) return rc;
    if (mn < 0) mn = 0;
    if (mx >= 0 && mn > mx) return sfail(g, ZI_EINVAL, "%sminItems over maxItems", "");
    if (pre && !json_is_array(pre))
        return sfail(g, ZI_EINVAL, "%s'prefixItems' must be an array", "");
    if (json_is_array(items))
        return sfail(g, ZI_EUNSUPPORTED, "%s'items' as an array (draft 4 tuples; use prefixItems)",
                     "");
    size_t np = json_array_size(pre);
    if (mx >= 0 && (size_t)mx < np) np = (size_t)mx;
    if (np > ZI_SCHEMA_MAX_LENGTH) return sfail(g, ZI_EUNSUPPORTED, "%sover 1000 prefixItems", "");
    bool more = !json_is_false(items) && (mx < 0 || (size_t)mx > np);
    if (!more && (size_t)mn > np)
        return sfail(g, ZI_EINVAL, "%sminItems over the items allowed", "");
    int item = -1;
    if (more && items) {
        size_t old = ptr_push(g, "items");
        rc = visit(g, items, &item);
        if (rc) return rc;
        ptr_pop(g, old);
    }
    /* seg[i]: the elements from prefix item i on, each after a comma */
    int next = -1; /* the rule for the elements after the prefix */
    zi_gbnf_buf tb = {0};
    if (more) {
        long lo = mn > (long)np ? mn - (long)np : 0;
        APPEND(&tb, "( \",\" ws ");
        ref_or_value(&tb, item);
        if (mx < 0)
            zi_gbnf_printf(&tb, " ws ){%ld,}", lo);
        else
            zi_gbnf_printf(&tb, " ws ){%ld,%ld}", lo, mx - (long)np);
    }
    next = new_rule(g);
    if ((rc = put_rule(g, next, &tb))) return rc;
    for (size_t i = np; i-- > 1;) {
        size_t old = ptr_push(g, "prefixItems");
        ptr_push_index(g, i);
        int child;
        rc = visit(g, json_array_get(pre, i), &child);
        if (rc) return rc;
        ptr_pop(g, old);
        zi_gbnf_buf sb = {0};
        APPEND(&sb, "( \",\" ws ");
        ref_or_value(&sb, child);
        zi_gbnf_printf(&sb, " ws s%d )%s", next, (long)i + 1 > mn ? "?" : "");
        next = new_rule(g);
        if ((rc = put_rule(g, next, &sb))) return rc;
    }
    APPEND(b, "\"[\" ws ( ");
    if (np > 0) {
        size_t old = ptr_push(g, "prefixItems");
        ptr_push(g, "0");
        int child;
        rc = visit(g, json_array_get(pre, 0), &child);
        if (rc) return rc;
        ptr_pop(g, old);
        ref_or_value(b, child);
        zi_gbnf_printf(b, " ws s%d )%s \"]\"", next, mn > 0 ? "" : "?");
    } else if (more) { /* the first element has no comma: written out */
        ref_or_value(b, item);
        APPEND(b, " ws ( \",\" ws ");
        ref_or_value(b, item);
        long lo = mn > 1 ? mn - 1 : 0;
        if (mx < 0)
            zi_gbnf_printf(b, " ws ){%ld,} )%s \"]\"", lo, mn > 0 ? "" : "?");
        else
            zi_gbnf_printf(b, " ws ){%ld,%ld} )%s \"]\"", lo, mx - 1, mn > 0 ? "" : "?");
    } else {
        APPEND(b, "\"\" ) \"]\"");
    }
    return ZI_OK;
}

static int finish(zi_gbnf_buf *out, zi_error *err) {
    if (out->oom) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    return ZI_OK;
}

int zi_schema_to_gbnf(const char *text, size_t len, zi_gbnf_buf *out, zi_error *err) {
    if (len > ZI_SCHEMA_MAX_TEXT)
        return zi_error_set(err, ZI_EINVAL, PFX ": longer than %d bytes", ZI_SCHEMA_MAX_TEXT);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!root) return zi_error_set(err, ZI_EINVAL, PFX ": not JSON: %s", je.text);
    sgen g = {.root = root, .out = out, .err = err};
    zi_gbnf_append(out, PRELUDE, sizeof PRELUDE - 1);
    int id, rc = visit(&g, root, &id);
    if (!rc) {
        if (id < 0)
            zi_gbnf_printf(out, "root ::= value\n");
        else
            zi_gbnf_printf(out, "root ::= s%d\n", id);
        rc = finish(out, err);
    }
    free(g.refs);
    json_decref(root);
    return rc;
}

int zi_schema_any_object_gbnf(zi_gbnf_buf *out, zi_error *err) {
    zi_gbnf_append(out, PRELUDE, sizeof PRELUDE - 1);
    zi_gbnf_printf(out, "root ::= object\n");
    return finish(out, err);
}
