/*
 * chat_template_value_impl.h - shared by the four files that implement
 * chat_template_value.h, and included by nothing else:
 *   chat_template_value.c    values, containers, buffers, str()/repr(), json.dumps
 *   chat_template_ops.c      operators, comparison, iteration, attributes, items,
 *                            the builtin globals and method tables
 *   chat_template_builtins.c argument binding, string helpers, functions and
 *                            methods (ct_call_func), tests (ct_apply_test)
 *   chat_template_filters.c  the filters (ct_apply_filter)
 * What one of them defines and another uses is declared here; everything
 * else stays static in its file.
 */
#ifndef ZI_CHAT_TEMPLATE_VALUE_IMPL_H
#define ZI_CHAT_TEMPLATE_VALUE_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "chat_template_value.h"
#include "utf8.h"

/* ---- small predicates and constructors ---------------------------------- */

static inline int ct_is_num(const ct_value *v) {
    return v->t == CT_V_INT || v->t == CT_V_BOOL || v->t == CT_V_FLOAT;
}
static inline int ct_is_intlike(const ct_value *v) {
    return v->t == CT_V_INT || v->t == CT_V_BOOL;
}
static inline double ct_as_double(const ct_value *v) {
    return v->t == CT_V_FLOAT ? v->u.f : (double)v->u.i;
}

static inline ct_value ct_seq_value(int type, ct_list *l) {
    ct_value v = {0};
    v.t = (uint8_t)type;
    v.u.l = l;
    return v;
}

static inline ct_value ct_gen_value(ct_list *l, int kind) {
    ct_value v = ct_seq_value(CT_V_LIST, l);
    v.uk = (uint8_t)kind;
    return v;
}

static inline ct_value ct_map_value(int type, ct_dict *d) {
    ct_value v = {0};
    v.t = (uint8_t)type;
    v.u.d = d;
    return v;
}

/* A one-shot iterator (a generator or reversed()). */
static inline int ct_is_iter(const ct_value *v) {
    return v->t == CT_V_LIST && (v->uk == CT_SEQ_GEN || v->uk == CT_SEQ_REVERSED);
}

/* A list or tuple proper (not a range, generator or view). */
static inline int ct_is_plain_list(const ct_value *v) {
    return (v->t == CT_V_LIST || v->t == CT_V_TUPLE) && v->uk == CT_SEQ_LIST;
}

/* A real list or tuple (or range), which supports len, [] and slicing. */
static inline int ct_is_plain_seq(const ct_value *v) {
    return (v->t == CT_V_LIST && (v->uk == CT_SEQ_LIST || v->uk == CT_SEQ_RANGE)) ||
           v->t == CT_V_TUPLE;
}

/* 1 when a[0..n) is the NUL-terminated name z. */
static inline int ct_name_eq(const char *a, size_t n, const char *z) {
    return strlen(z) == n && memcmp(a, z, n) == 0;
}

/* One entry of a table of names a template may use (filters, tests,
 * globals, methods) and the builtin id each stands for. */
typedef struct ct_named {
    const char *name;
    int id;
} ct_named;

/* The id of name[0..n) in table[0..count), -1 when absent. */
static inline int ct_named_id(const ct_named *table, size_t count, const char *name, size_t n) {
    for (size_t i = 0; i < count; i++)
        if (ct_name_eq(name, n, table[i].name)) return table[i].id;
    return -1;
}
#define CT_NAMED_ID(table, name, n) ct_named_id(table, sizeof table / sizeof table[0], name, n)

/* ---- UTF-8 -------------------------------------------------------------- */

/* Strings inside a render are always valid UTF-8 (inputs are validated and
 * every operation works on whole codepoints). */
static inline size_t ct_u8_len(unsigned char b) {
    return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

/* The codepoint at s (a lone byte's value if s is not well-formed). */
static inline uint32_t ct_u8_get(const char *s, size_t n, size_t *len) {
    uint32_t cp = 0;
    size_t k = zi_utf8_next((const unsigned char *)s, n, &cp);
    if (!k) {
        k = 1;
        cp = (unsigned char)s[0];
    }
    *len = k;
    return cp;
}

/* Number of codepoints in s[0..n). */
static inline size_t ct_u8_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

/* Byte offsets of every codepoint start plus the end (count + 1 entries);
 * NULL when out of memory. */
size_t *ct_u8_offsets(ct_ctx *c, const char *s, size_t n, size_t *count);

/* ---- values (chat_template_value.c) ------------------------------------- */

/* Python's type name of a value, for messages. */
const char *ct_tname(const ct_value *v);
/* The undefined value `obj.name` gives for a missing attribute of an object
 * of type objtype (its message names both). */
ct_value ct_undef_attr(int objtype, const char *name, size_t n);
/* The value of key k (Python ==), or NULL. */
ct_value *ct_dict_get(ct_ctx *c, const ct_dict *d, const ct_value *k);
int ct_buf_addc(ct_buf *b, char ch);
int ct_buf_addz(ct_buf *b, const char *s);
/* Codepoint-wise a < b for two strings (Python's str ordering). */
int ct_str_less(const ct_value *a, const ct_value *b);

/* json.dumps options (Hugging Face's tojson). */
typedef struct ct_json_opts {
    int ensure_ascii;
    int sort_keys;
    int pretty;
    const char *indent;
    size_t indent_len;
    const char *item_sep, *key_sep;
    size_t item_sep_len, key_sep_len;
} ct_json_opts;

/* Appends json.dumps(v) at indentation level `level` to b. */
int ct_json_dump(ct_ctx *c, size_t off, const ct_value *v, ct_buf *b, const ct_json_opts *o,
                 int level);

/* ---- operators (chat_template_ops.c) ------------------------------------ */

/* The error for an integer result outside int64. */
int ct_int_overflow(ct_ctx *c, size_t off);
/* Python's a < b; *lt receives the result (opname names the operator in
 * type errors). */
int ct_less(ct_ctx *c, size_t off, const ct_value *a, const ct_value *b, const char *opname,
            int *lt);
/* First occurrence of nd[0..nn) in h[0..hn), or NULL. */
const char *ct_memfind(const char *h, size_t hn, const char *nd, size_t nn);

/* Builtin functions and methods: ct_func.id. */
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
    CT_F_FORMAT,
    /* dict methods */
    CT_F_ITEMS,
    CT_F_KEYS,
    CT_F_VALUES,
    CT_F_GET,
    /* loop methods */
    CT_F_CYCLE,
};

/* ---- builtins (chat_template_builtins.c) -------------------------------- */

/* Maps positional and keyword arguments onto the parameter names of a
 * builtin; slot[i] is NULL for a parameter that was not given. */
int ct_bind(ct_ctx *c, size_t off, const char *fname, const char *const *params, size_t np,
            const ct_value *args, size_t nargs, const ct_kwarg *kw, size_t nkw,
            const ct_value **slot);
/* A type error naming `what` unless v is a string / an integer. */
int ct_need_str(ct_ctx *c, size_t off, const char *what, const ct_value *v);
int ct_need_int(ct_ctx *c, size_t off, const char *what, const ct_value *v);
/* str.strip / lstrip / rstrip with Python's whitespace or a set of chars. */
ct_value ct_strip(const ct_value *s, const ct_value *chars, int left, int right);

/* Modes of ct_change_case: str.lower/upper/capitalize/title, jinja2's title. */
enum { CT_CASE_LOWER, CT_CASE_UPPER, CT_CASE_CAPITALIZE, CT_CASE_PYTITLE, CT_CASE_JINJATITLE };
int ct_change_case(ct_ctx *c, const ct_value *s, int mode, ct_value *out);
/* str.replace(old, new[, count]); count < 0: all. */
int ct_replace(ct_ctx *c, size_t off, const ct_value *s, const ct_value *old, const ct_value *new_,
               int64_t count, ct_value *out);
/* Joins str() of every item with sep. */
int ct_join_items(ct_ctx *c, size_t off, const ct_value *items, size_t n, const char *sep,
                  size_t seplen, ct_value *out);
/* The items of iterable v (ct_iterate) and an empty list *l with room for
 * all of them: how list(), reverse, map and select start. */
int ct_iterate_new_list(ct_ctx *c, size_t off, const ct_value *v, const ct_value **items, size_t *n,
                        ct_list **l);
/* list(v). */
int ct_list_of(ct_ctx *c, size_t off, const ct_value *v, ct_value *out);
/* dict.items() of d. */
int ct_items_of(ct_ctx *c, size_t off, const ct_dict *d, ct_value *out);

/* markupsafe's escape(): str(v) with & < > " ' replaced by entities, as a
 * Markup string (ct_value.ut == CT_STR_MARKUP); a Markup v is returned as
 * it is. */
int ct_html_escape(ct_ctx *c, size_t off, const ct_value *v, ct_value *out);

#endif
