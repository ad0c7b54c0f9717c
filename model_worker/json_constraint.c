/*
 * json_constraint.c - the JSON automaton and the allowed-token walk of
 * json_constraint.h.
 */
#include "json_constraint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "grow.h"

/* Lexer modes. "After a value" is decided by the innermost container. */
enum {
    J_VALUE,     /* a value (after ':' or ',' in an array, or at the top) */
    J_ARR_FIRST, /* a value or ']' (after '[') */
    J_OBJ_FIRST, /* a key or '}' (after '{') */
    J_OBJ_KEY,   /* a key (after ',' in an object) */
    J_COLON,     /* ':' after a key */
    J_OBJ_NEXT,  /* ',' or '}' after a member */
    J_ARR_NEXT,  /* ',' or ']' after an element */
    J_STR,       /* inside a string */
    J_STR_ESC,   /* after a backslash */
    J_STR_HEX,   /* in \uXXXX */
    J_NUM_MINUS, /* after '-' */
    J_NUM_ZERO,  /* a leading 0 */
    J_NUM_INT,   /* integer digits */
    J_NUM_DOT,   /* after '.' */
    J_NUM_FRAC,  /* fraction digits */
    J_NUM_E,     /* after 'e' */
    J_NUM_ESIGN, /* after the exponent's sign */
    J_NUM_EXP,   /* exponent digits */
    J_LIT,       /* true, false, null */
    J_KEY,       /* a key of an object whose properties are given (schema) */
    J_ENUM,      /* a value from an enum or const (schema) */
    J_DONE,      /* the top-level object is closed */
};

/* ---- schemas ------------------------------------------------------------ */

/* What a schema node allows. */
enum { S_ANY, S_OBJECT, S_ARRAY, S_STRING, S_NUMBER, S_INTEGER, S_BOOLEAN, S_NULL, S_ENUM };

#define ANY 0  /* node 0: any JSON value */
#define ROOT 1 /* node 1: the top-level value */
#define MAX_NODES 1024
#define MAX_MEMBERS 64 /* properties of an object, values of an enum */

typedef struct snode {
    uint8_t kind;
    uint8_t closed;    /* an object: only its properties may appear */
    uint16_t items;    /* an array: its elements' node */
    uint32_t first, n; /* an object's properties, an enum's values */
    uint64_t required; /* an object: the properties it must have */
} snode;

typedef struct stext { /* a property name (between the quotes) or an enum value's JSON text */
    const char *p;
    uint32_t len;
    uint16_t node; /* a property's value */
} stext;

struct zi_json_schema {
    snode *nodes;
    size_t n_nodes;
    stext *members;
    size_t n_members;
    char **strs; /* owned texts */
    size_t n_strs;
};

static const snode NODE_ANY = {.kind = S_ANY}, NODE_FREE_OBJECT = {.kind = S_OBJECT};

/* Without a schema the top level is an object and the rest any JSON. */
static const snode *node_at(const zi_json_state *s, uint16_t id) {
    if (!s->sc) return id == ROOT ? &NODE_FREE_OBJECT : &NODE_ANY;
    return &s->sc->nodes[id];
}

static const stext *member(const zi_json_state *s, const snode *n, unsigned i) {
    return &s->sc->members[n->first + i];
}

static uint64_t all_members(const snode *n) {
    return n->n >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << n->n) - 1;
}

static const char *const LITERALS[3] = {"true", "false", "null"};

void zi_json_state_init(zi_json_state *s, const zi_json_schema *schema) {
    memset(s, 0, sizeof *s);
    s->sc = schema;
    s->mode = J_VALUE;
}

bool zi_json_complete(const zi_json_state *s) {
    return s->mode == J_DONE;
}

static bool is_ws(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(uint8_t c) {
    return c >= '0' && c <= '9';
}

/* A value just ended: continue in its container, or finish. */
static void end_value(zi_json_state *s) {
    s->run = 0;
    if (s->depth == 0)
        s->mode = J_DONE;
    else
        s->mode = s->stack[s->depth - 1] ? J_OBJ_NEXT : J_ARR_NEXT;
}

static bool push(zi_json_state *s, uint8_t is_object, uint16_t node) {
    if (s->depth == ZI_JSON_MAX_DEPTH) return false;
    s->node[s->depth] = node;
    s->seen[s->depth] = 0;
    s->stack[s->depth++] = is_object;
    s->mode = is_object ? J_OBJ_FIRST : J_ARR_FIRST;
    s->run = 0;
    return true;
}

/* Whitespace between tokens, at most ZI_JSON_MAX_WS in a row. */
static bool take_ws(zi_json_state *s) {
    return ++s->run <= ZI_JSON_MAX_WS;
}

/* The schema node of the value about to start: the root, an array's
 * items, or the property whose key was just read. */
static uint16_t value_node(const zi_json_state *s) {
    if (s->depth == 0) return ROOT;
    if (s->stack[s->depth - 1]) return s->vnode;
    const snode *a = node_at(s, s->node[s->depth - 1]);
    return a->kind == S_ARRAY ? a->items : ANY;
}

static bool start_value(zi_json_state *s, uint8_t c) {
    s->run = 0;
    s->int_only = 0;
    uint16_t id = value_node(s);
    const snode *n = node_at(s, id);
    switch (n->kind) {
    case S_OBJECT:
        return c == '{' && push(s, 1, id);
    case S_ARRAY:
        return c == '[' && push(s, 0, id);
    case S_STRING:
        if (c != '"') return false;
        break;
    case S_INTEGER:
        s->int_only = 1;
        /* fall through */
    case S_NUMBER:
        if (c != '-' && !is_digit(c)) return false;
        break;
    case S_BOOLEAN:
        if (c != 't' && c != 'f') return false;
        break;
    case S_NULL:
        if (c != 'n') return false;
        break;
    case S_ENUM: {
        uint64_t cand = 0;
        for (unsigned i = 0; i < n->n; i++)
            if (member(s, n, i)->p[0] == (char)c) cand |= (uint64_t)1 << i;
        if (!cand) return false;
        s->cand = cand, s->mpos = 1, s->vnode = id, s->mode = J_ENUM;
        return true;
    }
    default:
        break;
    }
    switch (c) {
    case '{':
        return push(s, 1, ANY);
    case '[':
        return push(s, 0, ANY);
    case '"':
        s->key = 0, s->mode = J_STR;
        return true;
    case '-':
        s->mode = J_NUM_MINUS, s->run = 1;
        return true;
    case '0':
        s->mode = J_NUM_ZERO, s->run = 1;
        return true;
    case 't':
        s->lit = 0, s->lit_pos = 1, s->mode = J_LIT;
        return true;
    case 'f':
        s->lit = 1, s->lit_pos = 1, s->mode = J_LIT;
        return true;
    case 'n':
        s->lit = 2, s->lit_pos = 1, s->mode = J_LIT;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            s->mode = J_NUM_INT, s->run = 1;
            return true;
        }
        return false;
    }
}

/* A string byte outside escapes: UTF-8 checked as RFC 3629 has it (no
 * overlong forms, no surrogates, nothing past U+10FFFF). */
static bool string_byte(zi_json_state *s, uint8_t c) {
    if (s->need_low) { /* after a high surrogate escape: its low half */
        if (c != '\\') return false;
        s->mode = J_STR_ESC;
        return true;
    }
    if (s->u8_left) {
        if (c < s->u8_lo || c > s->u8_hi) return false;
        s->u8_left--, s->u8_lo = 0x80, s->u8_hi = 0xbf;
        return true;
    }
    if (c == '"') {
        if (s->key)
            s->mode = J_COLON, s->run = 0;
        else
            end_value(s);
        return true;
    }
    if (c == '\\') {
        s->mode = J_STR_ESC;
        return true;
    }
    if (c < 0x20) return false;
    if (c < 0x80) return true;
    s->u8_lo = 0x80, s->u8_hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        s->u8_left = 1;
    else if (c >= 0xe0 && c <= 0xef)
        s->u8_left = 2, s->u8_lo = c == 0xe0 ? 0xa0 : 0x80, s->u8_hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
        s->u8_left = 3, s->u8_lo = c == 0xf0 ? 0x90 : 0x80, s->u8_hi = c == 0xf4 ? 0x8f : 0xbf;
    else
        return false;
    return true;
}

/* One more number byte, at most ZI_JSON_MAX_NUMBER in all. A '.', 'e' or
 * exponent sign needs a digit after it: taken only with room for one, so
 * no accepted prefix is a dead end. */
static bool num_byte(zi_json_state *s, uint8_t mode) {
    int need = mode == J_NUM_DOT || mode == J_NUM_E || mode == J_NUM_ESIGN ? 2 : 1;
    if (s->run + need > ZI_JSON_MAX_NUMBER) return false;
    s->run++;
    s->mode = mode;
    return true;
}

static bool feed_byte(zi_json_state *s, uint8_t c) {
    for (;;) {
        switch (s->mode) {
        case J_VALUE:
            if (is_ws(c)) return take_ws(s);
            return start_value(s, c);
        case J_ARR_FIRST:
            if (is_ws(c)) return take_ws(s);
            if (c == ']') {
                s->depth--;
                end_value(s);
                return true;
            }
            return start_value(s, c);
        case J_OBJ_FIRST:
        case J_OBJ_KEY: {
            if (is_ws(c)) return take_ws(s);
            const snode *o = node_at(s, s->node[s->depth - 1]);
            if (c == '"') {
                s->run = 0;
                if (!o->closed) { /* any key; its value any JSON */
                    s->key = 1, s->vnode = ANY, s->mode = J_STR;
                    return true;
                }
                s->cand = all_members(o) & ~s->seen[s->depth - 1];
                s->mpos = 0, s->mode = J_KEY;
                return s->cand != 0;
            }
            if (c == '}' && s->mode == J_OBJ_FIRST && !o->required) {
                s->depth--;
                end_value(s);
                return true;
            }
            return false;
        }
        case J_KEY: { /* one of the properties not given yet, byte by byte */
            const snode *o = node_at(s, s->node[s->depth - 1]);
            uint64_t next = 0;
            for (unsigned i = 0; i < o->n; i++) {
                if (!(s->cand >> i & 1)) continue;
                const stext *m = member(s, o, i);
                if (c == '"' && m->len == s->mpos) {
                    s->seen[s->depth - 1] |= (uint64_t)1 << i;
                    s->vnode = m->node, s->mode = J_COLON, s->run = 0;
                    return true;
                }
                if (m->len > s->mpos && m->p[s->mpos] == (char)c) next |= (uint64_t)1 << i;
            }
            if (!next) return false;
            s->cand = next, s->mpos++;
            return true;
        }
        case J_ENUM: { /* the JSON text of one of the values */
            const snode *e = node_at(s, s->vnode);
            uint64_t next = 0;
            bool whole = false;
            for (unsigned i = 0; i < e->n; i++) {
                if (!(s->cand >> i & 1)) continue;
                const stext *m = member(s, e, i);
                if (m->len > s->mpos && m->p[s->mpos] == (char)c) next |= (uint64_t)1 << i;
                whole |= m->len == s->mpos;
            }
            if (next) {
                s->cand = next, s->mpos++;
                return true;
            }
            if (!whole) return false;
            end_value(s); /* c is read again in the container */
            continue;
        }
        case J_COLON:
            if (is_ws(c)) return take_ws(s);
            if (c != ':') return false;
            s->mode = J_VALUE, s->run = 0;
            return true;
        case J_OBJ_NEXT:
        case J_ARR_NEXT:
            if (is_ws(c)) return take_ws(s);
            if (s->mode == J_OBJ_NEXT) { /* a closed object: keys left, required given */
                const snode *o = node_at(s, s->node[s->depth - 1]);
                uint64_t seen = s->seen[s->depth - 1];
                if (c == ',' && o->closed && !(all_members(o) & ~seen)) return false;
                if (c == '}' && (seen & o->required) != o->required) return false;
            }
            if (c == ',') {
                s->mode = s->mode == J_OBJ_NEXT ? J_OBJ_KEY : J_VALUE, s->run = 0;
                return true;
            }
            if (c == (s->mode == J_OBJ_NEXT ? '}' : ']')) {
                s->depth--;
                end_value(s);
                return true;
            }
            return false;
        case J_STR:
            return string_byte(s, c);
        case J_STR_ESC:
            if (c == 'u') {
                s->hex_left = 4, s->hex_hi = 0, s->mode = J_STR_HEX;
                return true;
            }
            if (s->need_low || !strchr("\"\\/bfnrt", c) || c == 0) return false;
            s->mode = J_STR;
            return true;
        case J_STR_HEX: {
            int h = is_digit(c)                              ? c - '0'
                    : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10
                                                             : -1;
            if (h < 0) return false;
            /* Surrogates come in pairs (strict parsers refuse a lone one):
             * decided by the first two digits, so no prefix is a dead end. */
            if (s->hex_left == 3) {
                int hi = s->hex_hi << 4 | h; /* the code unit's top byte */
                bool high = hi >= 0xd8 && hi <= 0xdb, low = hi >= 0xdc && hi <= 0xdf;
                if (s->need_low ? !low : low) return false;
                s->hex_hi = high ? 2 : 1;
            } else if (s->hex_left == 4) {
                if (s->need_low && h != 0xd) return false; /* a low half is \uDC00-\uDFFF */
                s->hex_hi = (uint8_t)h;
            }
            if (--s->hex_left == 0) {
                s->need_low = s->hex_hi == 2;
                s->mode = J_STR;
            }
            return true;
        }
        case J_NUM_MINUS:
            if (c == '0') return num_byte(s, J_NUM_ZERO);
            return c >= '1' && c <= '9' && num_byte(s, J_NUM_INT);
        case J_NUM_DOT:
            return is_digit(c) && num_byte(s, J_NUM_FRAC);
        case J_NUM_E:
            if (c == '+' || c == '-') return num_byte(s, J_NUM_ESIGN);
            return is_digit(c) && num_byte(s, J_NUM_EXP);
        case J_NUM_ESIGN:
            return is_digit(c) && num_byte(s, J_NUM_EXP);
        case J_NUM_ZERO:
        case J_NUM_INT:
        case J_NUM_FRAC:
        case J_NUM_EXP:
            if (is_digit(c) && s->mode != J_NUM_ZERO) return num_byte(s, s->mode);
            if (c == '.' && !s->int_only && (s->mode == J_NUM_ZERO || s->mode == J_NUM_INT))
                return num_byte(s, J_NUM_DOT);
            if ((c == 'e' || c == 'E') && !s->int_only && s->mode != J_NUM_EXP)
                return num_byte(s, J_NUM_E);
            /* Not part of the number: it ends here, and c is read again in
             * the container (numbers are never at the top level). */
            end_value(s);
            continue;
        case J_LIT: {
            const char *w = LITERALS[s->lit];
            if ((uint8_t)w[s->lit_pos] != c) return false;
            if (w[++s->lit_pos] == '\0') end_value(s);
            return true;
        }
        default:
            return false; /* J_DONE: only an end-of-sequence id */
        }
    }
}

bool zi_json_feed(zi_json_state *s, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!feed_byte(s, p[i])) return false;
    return true;
}

/* ---- schema compilation ------------------------------------------------- */

typedef struct compiler {
    zi_json_schema *sc;
    size_t cap_nodes, cap_members, cap_strs;
    char path[256];
    zi_error *err;
} compiler;

static const char *const ANNOTATIONS[] = {"title",   "description", "default", "examples",
                                          "$schema", "$id",         "$comment"};

static int cfail(compiler *c, int code, const char *what) {
    return zi_error_set(c->err, code, "%s: %s", c->path, what);
}

/* A property name or enum string usable byte for byte: printable, no quote
 * or backslash (so it needs no escape), valid UTF-8 (jansson checked). */
static bool plain_name(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch < 0x20 || ch == '"' || ch == '\\' || ch == 0x7f) return false;
    }
    return n <= 256;
}

static int add_node(compiler *c, uint16_t *id) {
    zi_json_schema *sc = c->sc;
    if (sc->n_nodes == MAX_NODES) return cfail(c, ZI_EUNSUPPORTED, "more than 1024 schemas");
    if (sc->n_nodes == c->cap_nodes) {
        snode *p = zi_grow(sc->nodes, &c->cap_nodes, sizeof *p, 16);
        if (!p) return cfail(c, ZI_ENOMEM, "out of memory");
        sc->nodes = p;
    }
    memset(&sc->nodes[sc->n_nodes], 0, sizeof *sc->nodes);
    *id = (uint16_t)sc->n_nodes++;
    return ZI_OK;
}

/* Reserves n members; returns the first's index. */
static int add_members(compiler *c, size_t n, uint32_t *first) {
    zi_json_schema *sc = c->sc;
    *first = (uint32_t)sc->n_members;
    if (n == 0) return ZI_OK; /* (members may still be NULL) */
    if (sc->n_members + n > c->cap_members) {
        size_t cap = c->cap_members ? c->cap_members : 16;
        while (cap < sc->n_members + n) cap *= 2;
        stext *p = realloc(sc->members, cap * sizeof *p);
        if (!p) return cfail(c, ZI_ENOMEM, "out of memory");
        sc->members = p, c->cap_members = cap;
    }
    memset(sc->members + sc->n_members, 0, n * sizeof *sc->members);
    sc->n_members += n;
    return ZI_OK;
}

static int keep_str(compiler *c, char *str) {
    zi_json_schema *sc = c->sc;
    if (sc->n_strs == c->cap_strs) {
        char **p = zi_grow(sc->strs, &c->cap_strs, sizeof *p, 16);
        if (!p) {
            free(str);
            return cfail(c, ZI_ENOMEM, "out of memory");
        }
        sc->strs = p;
    }
    sc->strs[sc->n_strs++] = str;
    return ZI_OK;
}

/* A copy of s that the schema owns (names outlive the JSON tree). */
static int keep_copy(compiler *c, const char *s, char **out) {
    size_t n = strlen(s);
    char *copy = malloc(n + 1);
    if (!copy) return cfail(c, ZI_ENOMEM, "out of memory");
    memcpy(copy, s, n + 1);
    *out = copy;
    return keep_str(c, copy);
}

static int compile_node(compiler *c, const json_t *j, int depth, uint16_t id);

/* A sub-schema at path + suffix. */
static int compile_child(compiler *c, const json_t *j, int depth, const char *suffix,
                         uint16_t *id) {
    size_t old = strlen(c->path);
    snprintf(c->path + old, sizeof c->path - old, "%s", suffix);
    int rc = add_node(c, id);
    if (!rc) rc = compile_node(c, j, depth + 1, *id);
    c->path[old] = '\0';
    return rc;
}

/* Whether value v has JSON type `type` (S_ANY: no type given). */
static bool of_type(const json_t *v, uint8_t type) {
    switch (type) {
    case S_ANY:
        return true;
    case S_STRING:
        return json_is_string(v);
    case S_INTEGER:
        return json_is_integer(v);
    case S_NUMBER:
        return json_is_number(v);
    case S_BOOLEAN:
        return json_is_boolean(v);
    case S_NULL:
        return json_is_null(v);
    default:
        return false; /* objects and arrays are not enum values here */
    }
}

/* enum / const: those of the values that have the schema's type (the
 * others can never validate), as their compact JSON texts. */
static int compile_enum(compiler *c, const json_t *values, uint8_t type, uint16_t id) {
    size_t k = 0;
    for (size_t i = 0; i < json_array_size(values); i++)
        k += of_type(json_array_get(values, i), type);
    if (k == 0 && json_array_size(values) > 0)
        return cfail(c, ZI_EINVAL, "enum/const: no value has the schema's type");
    if (k == 0 || k > MAX_MEMBERS)
        return cfail(c, ZI_EUNSUPPORTED, "enum: 1 to 64 values are supported");
    uint32_t first;
    int rc = add_members(c, k, &first);
    if (rc) return rc;
    snode *n = &c->sc->nodes[id];
    n->kind = S_ENUM, n->first = first, n->n = (uint32_t)k;
    for (size_t vi = 0, i = 0; vi < json_array_size(values); vi++) {
        const json_t *v = json_array_get(values, vi);
        if (!of_type(v, type)) continue;
        if (!(json_is_string(v) || json_is_integer(v) || json_is_boolean(v) || json_is_null(v)) ||
            (json_is_string(v) && !plain_name(json_string_value(v), json_string_length(v))))
            return cfail(c, ZI_EUNSUPPORTED,
                         "enum/const: only strings without escapes, integers, booleans and "
                         "null are supported");
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!text || (rc = keep_str(c, text)))
            return rc ? rc : cfail(c, ZI_ENOMEM, "out of memory");
        for (size_t j = 0; j < i; j++)
            if (strcmp(c->sc->members[first + j].p, text) == 0)
                return cfail(c, ZI_EINVAL, "enum: a value is given twice");
        c->sc->members[first + i++] = (stext){.p = text, .len = (uint32_t)strlen(text)};
    }
    return ZI_OK;
}

static int compile_node(compiler *c, const json_t *j, int depth, uint16_t id) {
    if (json_is_boolean(j))
        return cfail(c, ZI_EUNSUPPORTED, "boolean schemas are not supported (use {})");
    if (!json_is_object(j)) return cfail(c, ZI_EINVAL, "a schema must be an object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)j, key, v) {
        static const char *const known[] = {
            "type", "properties", "required", "additionalProperties", "items", "enum", "const"};
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0] && !ok; i++)
            ok = !strcmp(key, known[i]);
        for (size_t i = 0; i < sizeof ANNOTATIONS / sizeof ANNOTATIONS[0] && !ok; i++)
            ok = !strcmp(key, ANNOTATIONS[i]);
        if (!ok) {
            char msg[160];
            snprintf(msg, sizeof msg, "keyword '%.64s' is not supported", key);
            return cfail(c, ZI_EUNSUPPORTED, msg);
        }
    }
    const json_t *type = json_object_get(j, "type"), *en = json_object_get(j, "enum"),
                 *cn = json_object_get(j, "const"), *props = json_object_get(j, "properties"),
                 *items = json_object_get(j, "items"), *req = json_object_get(j, "required"),
                 *addl = json_object_get(j, "additionalProperties");
    static const struct {
        const char *name;
        uint8_t kind;
    } types[] = {{"object", S_OBJECT}, {"array", S_ARRAY},     {"string", S_STRING},
                 {"number", S_NUMBER}, {"integer", S_INTEGER}, {"boolean", S_BOOLEAN},
                 {"null", S_NULL}};
    uint8_t kind = S_ANY;
    if (type) {
        if (!json_is_string(type))
            return cfail(c, ZI_EUNSUPPORTED, "type: one type name is supported (not a list)");
        size_t i = 0;
        while (i < sizeof types / sizeof types[0] && strcmp(types[i].name, json_string_value(type)))
            i++;
        if (i == sizeof types / sizeof types[0]) return cfail(c, ZI_EINVAL, "type: unknown type");
        kind = types[i].kind;
    }
    if (en || cn) { /* the values fix the value: those of the type */
        if (en && cn) return cfail(c, ZI_EUNSUPPORTED, "enum with const");
        if (en && !json_is_array(en)) return cfail(c, ZI_EINVAL, "enum: must be an array");
        if (props || req || addl || items)
            return cfail(c, ZI_EUNSUPPORTED, "enum/const beside object or array keywords");
        json_t *one = NULL;
        if (cn && !(one = json_pack("[O]", cn))) return cfail(c, ZI_ENOMEM, "out of memory");
        int rc = compile_enum(c, en ? en : one, kind, id);
        json_decref(one);
        return rc;
    }
    if (!type) kind = props || req || addl ? S_OBJECT : items ? S_ARRAY : S_ANY;
    if ((kind == S_OBJECT || kind == S_ARRAY) && depth > ZI_JSON_MAX_DEPTH)
        return cfail(c, ZI_EUNSUPPORTED, "nested more than 16 containers deep");
    c->sc->nodes[id].kind = kind;
    if ((props || req || addl) && kind != S_OBJECT)
        return cfail(c, ZI_EUNSUPPORTED,
                     "properties, required and additionalProperties beside a type other than "
                     "object");
    if (items && kind != S_ARRAY)
        return cfail(c, ZI_EUNSUPPORTED, "items beside a type other than array");
    if (kind == S_ARRAY && items) {
        if (!json_is_object(items))
            return cfail(c, ZI_EUNSUPPORTED, "items: one schema (an object) is supported");
        uint16_t child;
        int rc = compile_child(c, items, depth, ".items", &child);
        if (rc) return rc;
        c->sc->nodes[id].items = child;
    }
    if (kind != S_OBJECT) return ZI_OK;
    if (props && !json_is_object(props))
        return cfail(c, ZI_EINVAL, "properties: must be an object");
    if (req && !json_is_array(req)) return cfail(c, ZI_EINVAL, "required: must be an array");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return cfail(c, ZI_EINVAL, "additionalProperties: must be a boolean or a schema");
    if (addl && json_is_object(addl)) { /* only a schema that allows anything */
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)addl, k, x) {
            bool note = false;
            for (size_t i = 0; i < sizeof ANNOTATIONS / sizeof ANNOTATIONS[0] && !note; i++)
                note = !strcmp(k, ANNOTATIONS[i]);
            if (!note)
                return cfail(c, ZI_EUNSUPPORTED,
                             "additionalProperties: only true, false or {} are supported");
        }
    }
    size_t np = props ? json_object_size(props) : 0;
    /* Names in required without a schema are properties of any value, each
     * counted once however often it is required. Only up to the member
     * limit are remembered (a client's list may be long: no pairwise
     * comparison of all of it); past it the rest is only checked. */
    const char *seen[MAX_MEMBERS + 1];
    size_t extra = 0;
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        const json_t *r = json_array_get(req, i);
        if (!json_is_string(r)) return cfail(c, ZI_EINVAL, "required: names must be strings");
        const char *name = json_string_value(r);
        if (props && json_object_get(props, name)) continue;
        if (addl && json_is_false(addl))
            return cfail(c, ZI_EINVAL,
                         "required: a name without a schema in properties, which "
                         "additionalProperties false forbids: no object can satisfy it");
        if (np + extra > MAX_MEMBERS) continue; /* over already */
        size_t k = 0;
        while (k < extra && strcmp(seen[k], name)) k++;
        if (k == extra) seen[extra++] = name;
    }
    if (np + extra > MAX_MEMBERS) return cfail(c, ZI_EUNSUPPORTED, "more than 64 properties");
    bool closed = np + extra > 0 || (addl && json_is_false(addl));
    c->sc->nodes[id].closed = closed;
    if (!closed) return ZI_OK;
    uint32_t first;
    int rc = add_members(c, np + extra, &first);
    if (rc) return rc;
    c->sc->nodes[id].first = first, c->sc->nodes[id].n = (uint32_t)(np + extra);
    size_t i = 0;
    json_object_foreach((json_t *)props, key, v) {
        if (!plain_name(key, strlen(key)))
            return cfail(c, ZI_EUNSUPPORTED,
                         "properties: names with quotes, backslashes or control characters are "
                         "not supported");
        char suffix[300];
        snprintf(suffix, sizeof suffix, ".properties.%.256s", key);
        uint16_t child;
        char *copy;
        if ((rc = compile_child(c, v, depth, suffix, &child)) || (rc = keep_copy(c, key, &copy)))
            return rc;
        c->sc->members[first + i] =
            (stext){.p = copy, .len = (uint32_t)strlen(copy), .node = child};
        i++;
    }
    for (size_t k = 0; req && k < json_array_size(req); k++) {
        const char *name = json_string_value(json_array_get(req, k));
        size_t m = 0;
        while (m < i && strcmp(c->sc->members[first + m].p, name)) m++;
        if (m == i) { /* required, no schema: any value */
            if (!plain_name(name, strlen(name)))
                return cfail(c, ZI_EUNSUPPORTED,
                             "required: names with quotes, backslashes or "
                             "control characters are not supported");
            char *copy;
            if ((rc = keep_copy(c, name, &copy))) return rc;
            c->sc->members[first + i++] =
                (stext){.p = copy, .len = (uint32_t)strlen(copy), .node = ANY};
        }
        c->sc->nodes[id].required |= (uint64_t)1 << m;
    }
    return ZI_OK;
}

void zi_json_schema_free(zi_json_schema *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_strs; i++) free(s->strs[i]);
    free(s->strs);
    free(s->nodes);
    free(s->members);
    free(s);
}

int zi_json_schema_compile(const char *text, size_t len, zi_json_schema **out, zi_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return zi_error_set(err, ZI_EINVAL, "response_format.json_schema: not JSON: %s", je.text);
    compiler c = {.err = err};
    snprintf(c.path, sizeof c.path, "response_format.json_schema");
    int rc =
        (c.sc = calloc(1, sizeof *c.sc)) ? ZI_OK : zi_error_set(err, ZI_ENOMEM, "out of memory");
    uint16_t any, top;
    if (!rc) rc = add_node(&c, &any); /* node 0: any value */
    if (!rc) rc = add_node(&c, &top); /* node 1: the root */
    if (!rc) rc = compile_node(&c, root, 1, top);
    if (!rc && c.sc->nodes[ROOT].kind != S_OBJECT)
        rc = cfail(&c, ZI_EUNSUPPORTED, "the top level must be an object (type object)");
    json_decref(root);
    if (rc) {
        zi_json_schema_free(c.sc);
        return rc;
    }
    *out = c.sc;
    return ZI_OK;
}

/* ---- the vocabulary trie ---------------------------------------------- */

typedef zi_trie_node jnode; /* vocab_trie.h, shared with grammar.c */
typedef zi_vocab_trie jtrie;

struct zi_json_vocab {
    int32_t n_vocab;
    uint8_t *bytes;   /* every token's bytes back to back */
    int64_t *offset;  /* [n_vocab + 1]; a control token has none */
    int32_t *plain;   /* mask: tokens that are plain string text */
    jtrie all, other; /* every token; the tokens that are not plain */
};

static int32_t trie_node(jtrie *t, uint8_t byte) {
    if (t->n == t->cap) {
        int32_t cap = t->cap ? t->cap * 2 : 4096;
        jnode *p = realloc(t->nodes, (size_t)cap * sizeof *p);
        if (!p) return -1;
        t->nodes = p, t->cap = cap;
    }
    t->nodes[t->n] = (jnode){.child = -1, .sibling = -1, .tok = -1, .byte = byte};
    return t->n++;
}

static int trie_add(jtrie *t, const uint8_t *p, size_t n, int32_t id) {
    int32_t at = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = t->nodes[at].child;
        while (c >= 0 && t->nodes[c].byte != p[i]) c = t->nodes[c].sibling;
        if (c < 0) {
            if ((c = trie_node(t, p[i])) < 0) return ZI_ENOMEM;
            t->nodes[c].sibling = t->nodes[at].child;
            t->nodes[at].child = c;
        }
        at = c;
    }
    t->tok_next[id] = t->nodes[at].tok;
    t->nodes[at].tok = id;
    return ZI_OK;
}

/* Plain string text: bytes that leave a string state as it was, whole
 * UTF-8 characters with no quote, backslash or control byte. */
static bool plain_text(const uint8_t *p, size_t n) {
    zi_json_state s;
    zi_json_state_init(&s, NULL);
    s.mode = J_STR;
    for (size_t i = 0; i < n; i++)
        if (p[i] == '"' || p[i] == '\\' || !string_byte(&s, p[i])) return false;
    return s.u8_left == 0;
}

void zi_json_vocab_free(zi_json_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->offset);
    free(v->plain);
    free(v->all.nodes);
    free(v->all.tok_next);
    free(v->other.nodes);
    free(v->other.tok_next);
    free(v);
}

int zi_json_vocab_create(const zi_tokenizer *tok, zi_json_vocab **out, zi_error *err) {
    *out = NULL;
    zi_json_vocab *v = calloc(1, sizeof *v);
    if (!v) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    int32_t V = zi_tokenizer_vocab_size(tok);
    v->n_vocab = V;
    size_t words = ((size_t)V + 31) / 32, cap = (size_t)V * 8 + 64, used = 0;
    v->bytes = malloc(cap);
    v->offset = malloc(((size_t)V + 1) * sizeof *v->offset);
    v->plain = calloc(words, sizeof *v->plain);
    v->all.tok_next = malloc((size_t)V * sizeof(int32_t));
    v->other.tok_next = malloc((size_t)V * sizeof(int32_t));
    int rc = v->bytes && v->offset && v->plain && v->all.tok_next && v->other.tok_next &&
                     trie_node(&v->all, 0) == 0 && trie_node(&v->other, 0) == 0
                 ? ZI_OK
                 : ZI_ENOMEM;
    char buf[ZI_TOKEN_MAX_BYTES + 16];
    for (int32_t id = 0; !rc && id < V; id++) {
        v->offset[id] = (int64_t)used;
        if (zi_tokenizer_token_type(tok, id) == ZI_TOKEN_CONTROL) continue;
        int n = zi_tokenizer_token_bytes(tok, id, 0, buf, sizeof buf);
        if (n <= 0 || (size_t)n > sizeof buf) continue; /* no bytes: never allowed */
        if (used + (size_t)n > cap) {
            uint8_t *p = realloc(v->bytes, cap * 2 + (size_t)n);
            if (!p) {
                rc = ZI_ENOMEM;
                break;
            }
            v->bytes = p, cap = cap * 2 + (size_t)n;
        }
        memcpy(v->bytes + used, buf, (size_t)n);
        const uint8_t *p = v->bytes + used;
        used += (size_t)n;
        rc = trie_add(&v->all, p, (size_t)n, id);
        if (!rc && plain_text(p, (size_t)n))
            v->plain[id >> 5] |= (int32_t)(1u << (id & 31));
        else if (!rc)
            rc = trie_add(&v->other, p, (size_t)n, id);
    }
    if (!rc) v->offset[V] = (int64_t)used;
    if (rc) {
        zi_json_vocab_free(v);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for the structured-output vocabulary");
    }
    *out = v;
    return ZI_OK;
}

int32_t zi_json_vocab_size(const zi_json_vocab *v) {
    return v->n_vocab;
}

const zi_vocab_trie *zi_json_vocab_trie(const zi_json_vocab *v) {
    return &v->all;
}

const uint8_t *zi_json_vocab_token(const zi_json_vocab *v, int32_t id, size_t *n) {
    *n = 0;
    if (id < 0 || id >= v->n_vocab) return NULL;
    *n = (size_t)(v->offset[id + 1] - v->offset[id]);
    return v->bytes + v->offset[id];
}

static void walk(const jtrie *t, int32_t node, const zi_json_state *s, int32_t *mask) {
    for (int32_t c = t->nodes[node].child; c >= 0; c = t->nodes[c].sibling) {
        zi_json_state st = *s;
        if (!feed_byte(&st, t->nodes[c].byte)) continue;
        for (int32_t id = t->nodes[c].tok; id >= 0; id = t->tok_next[id])
            mask[id >> 5] |= (int32_t)(1u << (id & 31));
        if (t->nodes[c].child >= 0) walk(t, c, &st, mask);
    }
}

void zi_json_eos_only(int32_t n_vocab, const int32_t *eos, size_t n_eos, int32_t *mask) {
    memset(mask, 0, ((size_t)n_vocab + 31) / 32 * sizeof *mask);
    for (size_t i = 0; i < n_eos; i++)
        if (eos[i] >= 0 && eos[i] < n_vocab) mask[eos[i] >> 5] |= (int32_t)(1u << (eos[i] & 31));
}

void zi_json_allowed(const zi_json_vocab *v, const zi_json_state *s, const int32_t *eos,
                     size_t n_eos, int32_t *mask) {
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    if (s->mode == J_DONE) {
        zi_json_eos_only(v->n_vocab, eos, n_eos, mask);
        return;
    }
    if (s->mode == J_STR && s->u8_left == 0 && !s->need_low) {
        memcpy(mask, v->plain, words * sizeof *mask);
        walk(&v->other, 0, s, mask);
    } else {
        memset(mask, 0, words * sizeof *mask);
        walk(&v->all, 0, s, mask);
    }
    /* An end-of-sequence id that is an ordinary token (bytes of its own)
     * must not end an object that is still open. */
    for (size_t i = 0; i < n_eos; i++)
        if (eos[i] >= 0 && eos[i] < v->n_vocab)
            mask[eos[i] >> 5] &= ~(int32_t)(1u << (eos[i] & 31));
}

bool zi_json_feed_token(const zi_json_vocab *v, zi_json_state *s, int32_t id) {
    if (id < 0 || id >= v->n_vocab) return false;
    int64_t a = v->offset[id], b = v->offset[id + 1];
    return b > a && zi_json_feed(s, v->bytes + a, (size_t)(b - a));
}
