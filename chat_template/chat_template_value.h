/*
 * chat_template_value.h - internal to the chat-template engine: run-time
 * values with Python semantics, the per-render context, and the builtin
 * filters, tests, methods and globals.
 *
 * chat_template.c (the evaluator) walks the tree from chat_template_parse.h
 * and calls into this module for every operation on values: truthiness,
 * equality and ordering, arithmetic, str()/repr()/json.dumps() conversions,
 * attribute and item lookup, iteration, and the builtins. Values live in
 * the render's arena and are never mutated after construction, except a
 * namespace's attributes (which is what namespace() is for).
 */
#ifndef ZI_CHAT_TEMPLATE_VALUE_H
#define ZI_CHAT_TEMPLATE_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include "chat_template_parse.h"
#include "zi_error.h"

enum ct_vtype {
    CT_V_UNDEF, /* jinja2's default Undefined: falsy, prints "", iterates empty */
    CT_V_NONE,
    CT_V_BOOL,
    CT_V_INT,
    CT_V_FLOAT,
    CT_V_STR,
    CT_V_LIST,
    CT_V_TUPLE,
    CT_V_DICT,
    CT_V_NS,    /* namespace(): a dict whose attributes {% set ns.x %} may change */
    CT_V_FUNC,  /* builtin function or bound method */
    CT_V_MACRO, /* u.m: the CT_N_MACRO node */
    CT_V_LOOP,  /* the `loop` variable of a for loop */
};

typedef struct ct_list ct_list;
typedef struct ct_dict ct_dict;
typedef struct ct_func ct_func;
typedef struct ct_loop ct_loop;

/* What a CT_V_LIST value stands for in Python (CT_V_TUPLE is always a
 * plain tuple). They differ in printing, truthiness, len() and indexing. */
enum ct_seq_kind {
    CT_SEQ_LIST,
    CT_SEQ_GEN,      /* a generator (map, select, reject, items, ... results) */
    CT_SEQ_RANGE,    /* range(): prints as range(a, b[, s]) */
    CT_SEQ_ITEMS,    /* dict.items() */
    CT_SEQ_KEYS,     /* dict.keys() */
    CT_SEQ_VALUES,   /* dict.values() */
    CT_SEQ_REVERSED, /* reversed(list): an iterator */
};

/* A string made by concatenation, which later concatenations may extend in
 * place (see ct_str_concat). */
#define CT_STR_GROWABLE 1
/* ct_value.ut of a STR: a markupsafe Markup string (made by the safe and
 * escape filters). Only `+` treats it differently: Markup + str escapes
 * the str and gives Markup, as markupsafe does; everything else sees a
 * plain string. */
#define CT_STR_MARKUP 1

typedef struct ct_value {
    uint8_t t;  /* CT_V_* */
    uint8_t uk; /* UNDEF: 1 = name `u.s` is undefined, 2 = object of type `ut` lacks `u.s`;
                   LIST: the CT_SEQ_* kind; STR: CT_STR_GROWABLE or 0 */
    uint8_t ut; /* UNDEF with uk == 2: the CT_V_* type of that object */
    union {
        struct {
            const char *p;
            size_t n;
        } s;       /* STR text (UTF-8, not NUL-terminated); UNDEF: the missing name */
        int64_t i; /* INT, BOOL */
        double f;
        ct_list *l; /* LIST, TUPLE */
        ct_dict *d; /* DICT, NS */
        ct_func *fn;
        const ct_node *m;
        ct_loop *loop;
    } u;
} ct_value;

struct ct_list {
    size_t n, cap;
    ct_value *v;
    /* generators and iterators: iterating consumes them, and an error that
     * jinja2 would raise lazily (on iteration) is kept until then */
    uint8_t consumed;
    int err_code;
    const char *err_msg;
    int64_t r_start, r_stop, r_step; /* CT_SEQ_RANGE */
    size_t *fill; /* concatenation results: slots of v in use by any list sharing v */
};

struct ct_dict {
    size_t n, cap;
    ct_value *k, *v; /* insertion order, as Python dicts */
};

struct ct_func {
    int id;        /* CT_F_* in chat_template_value_impl.h */
    ct_value self; /* the bound object of a method */
};

struct ct_loop {
    const ct_value *items;
    size_t n, i;
    int depth; /* 1 for the outermost loop */
};

typedef struct ct_kwarg {
    const char *name;
    size_t len;
    ct_value v;
} ct_kwarg;

/* State shared by everything a render does. The evaluator embeds it. */
typedef struct ct_ctx {
    ct_arena arena;
    zi_error *err;
    const char *src; /* normalised template source, for error locations */
    size_t src_len;
    size_t steps, max_steps;
    size_t iterations, max_iterations;
    int depth;
    int64_t now;       /* strftime_now's moment (seconds since the epoch, UTC); 0: local time now */
    void *case_locale; /* locale_t for case mapping, made on first use */
    int case_locale_tried;
} ct_ctx;

/* Frees what a render's context holds outside its arena. */
void ct_ctx_release(ct_ctx *c);

/* Records "chat template line L col C: ..." for source offset `off` and
 * returns code (a macro over ct_error_at, so that printf-style arguments
 * are still checked against the format). */
#define ct_fail(c, off, code, ...)                                                                 \
    ct_error_at((c)->err, code, (c)->src, (c)->src_len, off, "chat template ", __VA_ARGS__)
/* Counts n units of work against max_steps. */
int ct_charge(ct_ctx *c, size_t off, size_t n);
/* Enters / leaves one level of nesting (ZI_ERANGE past the limit). */
int ct_enter(ct_ctx *c, size_t off);
static inline void ct_leave(ct_ctx *c) {
    c->depth--;
}
int ct_oom(ct_ctx *c, size_t off);

/* ---- constructors ------------------------------------------------------ */

static inline ct_value ct_undef(void) {
    ct_value v = {0};
    v.t = CT_V_UNDEF;
    return v;
}
static inline ct_value ct_none(void) {
    ct_value v = {0};
    v.t = CT_V_NONE;
    return v;
}
static inline ct_value ct_bool(int b) {
    ct_value v = {0};
    v.t = CT_V_BOOL;
    v.u.i = b != 0;
    return v;
}
static inline ct_value ct_int(int64_t i) {
    ct_value v = {0};
    v.t = CT_V_INT;
    v.u.i = i;
    return v;
}
static inline ct_value ct_float(double f) {
    ct_value v = {0};
    v.t = CT_V_FLOAT;
    v.u.f = f;
    return v;
}
/* A string value referring to p (not copied: p must outlive the render). */
static inline ct_value ct_str_ref(const char *p, size_t n) {
    ct_value v = {0};
    v.t = CT_V_STR;
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

ct_list *ct_list_new(ct_ctx *c, size_t cap);
int ct_list_push(ct_ctx *c, ct_list *l, ct_value v); /* ZI_ENOMEM only */
ct_dict *ct_dict_new(ct_ctx *c, size_t cap);
/* Sets key (replacing an equal key's value). */
int ct_dict_set(ct_ctx *c, ct_dict *d, ct_value k, ct_value v);
/* The value of a string key, or NULL. */
ct_value *ct_dict_get_str(const ct_dict *d, const char *k, size_t n);

/* ---- string building --------------------------------------------------- */

/* A growable byte string in the arena (old storage is abandoned on growth)
 * or, with heap set, in malloc'd memory the owner frees. */
typedef struct ct_buf {
    char *p;
    size_t n, cap;
    size_t max; /* ZI_ERANGE beyond this many bytes; 0: none */
    int heap;
    ct_ctx *c;
} ct_buf;

void ct_buf_init(ct_buf *b, ct_ctx *c, size_t max, int heap);
int ct_buf_add(ct_buf *b, const char *s, size_t n);
/* The buffer's content as a string value (in the arena). */
int ct_buf_value(ct_buf *b, ct_value *out);

/* ---- operations ------------------------------------------------------ */

int ct_truthy(const ct_value *v);
/* Python would refuse v as a dict key or set member (lists, dicts, some views). */
int ct_unhashable(const ct_value *v);
/* Python ==. */
int ct_equal(ct_ctx *c, const ct_value *a, const ct_value *b);
/* Appends str(v) (what {{ v }} prints) to b. */
int ct_to_str(ct_ctx *c, size_t off, const ct_value *v, ct_buf *b);
/* str(v) as a value (v itself when it is a string). */
int ct_str_of(ct_ctx *c, size_t off, const ct_value *v, ct_value *out);
/* An error for using an undefined value in an operation that needs one,
 * with jinja2's wording ("'x' is undefined"). */
int ct_undefined_error(ct_ctx *c, size_t off, const ct_value *v);

/* a + b for a string a and bytes b (see CT_STR_GROWABLE). */
int ct_str_concat(ct_ctx *c, size_t off, const ct_value *a, const char *b, size_t bn,
                  ct_value *out);
int ct_binop(ct_ctx *c, size_t off, int op, const ct_value *a, const ct_value *b, ct_value *out);
int ct_compare(ct_ctx *c, size_t off, int op, const ct_value *a, const ct_value *b, int *result);
int ct_negate(ct_ctx *c, size_t off, const ct_value *a, int neg, ct_value *out);

/* The items a for loop visits: list/tuple items, dict keys, string
 * characters, nothing for undefined; a type error otherwise. */
int ct_iterate(ct_ctx *c, size_t off, const ct_value *v, const ct_value **items, size_t *n);

/* obj.name: a method bound to obj, else (for mappings) the key's value,
 * else undefined. */
int ct_getattr(ct_ctx *c, size_t off, const ct_value *obj, const char *name, size_t n,
               ct_value *out);
/* obj[key]: the item, else (string keys) the attribute, else undefined. */
int ct_getitem(ct_ctx *c, size_t off, const ct_value *obj, const ct_value *key, ct_value *out);
/* obj[start:stop:step] for lists, tuples and strings (NULL: omitted). */
int ct_slice(ct_ctx *c, size_t off, const ct_value *obj, const ct_value *start,
             const ct_value *stop, const ct_value *step, ct_value *out);

/* ---- builtins ----------------------------------------------------------- */

int ct_filter_id(const char *name, size_t n); /* -1 when unknown */
int ct_test_id(const char *name, size_t n);   /* -1 when unknown */
/* The builtin global `name` (range, namespace, dict, raise_exception,
 * strftime_now) as a function value; *found is 0 when there is none. */
int ct_global(ct_ctx *c, size_t off, const char *name, size_t n, ct_value *out, int *found);
/* 1 when `name` is one of those globals. */
int ct_is_global(const char *name, size_t n);

int ct_apply_filter(ct_ctx *c, size_t off, int id, const char *name, size_t nlen,
                    const ct_value *operand, const ct_value *args, size_t nargs, const ct_kwarg *kw,
                    size_t nkw, ct_value *out);
int ct_apply_test(ct_ctx *c, size_t off, int id, const char *name, size_t nlen,
                  const ct_value *operand, const ct_value *args, size_t nargs, const ct_kwarg *kw,
                  size_t nkw, int *result);
/* Calls a CT_V_FUNC value. */
int ct_call_func(ct_ctx *c, size_t off, const ct_func *f, const ct_value *args, size_t nargs,
                 const ct_kwarg *kw, size_t nkw, ct_value *out);

#endif
