/*
 * json_constraint.c - the JSON automaton and the allowed-token walk of
 * json_constraint.h.
 */
#include "json_constraint.h"

#include <stdlib.h>
#include <string.h>

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
    J_DONE,      /* the top-level object is closed */
};

static const char *const LITERALS[3] = {"true", "false", "null"};

void zi_json_state_init(zi_json_state *s) {
    memset(s, 0, sizeof *s);
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

static bool push(zi_json_state *s, uint8_t is_object) {
    if (s->depth == ZI_JSON_MAX_DEPTH) return false;
    s->stack[s->depth++] = is_object;
    s->mode = is_object ? J_OBJ_FIRST : J_ARR_FIRST;
    s->run = 0;
    return true;
}

/* Whitespace between tokens, at most ZI_JSON_MAX_WS in a row. */
static bool take_ws(zi_json_state *s) {
    return ++s->run <= ZI_JSON_MAX_WS;
}

/* The first byte of a value (mode J_VALUE or J_ARR_FIRST). */
static bool start_value(zi_json_state *s, uint8_t c) {
    s->run = 0;
    if (s->depth == 0 && c != '{') return false; /* the top level is an object */
    switch (c) {
    case '{':
        return push(s, 1);
    case '[':
        return push(s, 0);
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
        case J_OBJ_KEY:
            if (is_ws(c)) return take_ws(s);
            if (c == '"') {
                s->key = 1, s->mode = J_STR, s->run = 0;
                return true;
            }
            if (c == '}' && s->mode == J_OBJ_FIRST) {
                s->depth--;
                end_value(s);
                return true;
            }
            return false;
        case J_COLON:
            if (is_ws(c)) return take_ws(s);
            if (c != ':') return false;
            s->mode = J_VALUE, s->run = 0;
            return true;
        case J_OBJ_NEXT:
        case J_ARR_NEXT:
            if (is_ws(c)) return take_ws(s);
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
            if (c == '.' && (s->mode == J_NUM_ZERO || s->mode == J_NUM_INT))
                return num_byte(s, J_NUM_DOT);
            if ((c == 'e' || c == 'E') && s->mode != J_NUM_EXP) return num_byte(s, J_NUM_E);
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

/* ---- the vocabulary trie ---------------------------------------------- */

typedef struct jnode {
    int32_t child, sibling; /* -1: none */
    int32_t tok;            /* first token whose bytes end here, -1: none */
    uint8_t byte;
} jnode;

typedef struct jtrie {
    jnode *nodes; /* nodes[0] is the root */
    int32_t n, cap;
    int32_t *tok_next; /* [n_vocab] the next token with the same bytes */
} jtrie;

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
    zi_json_state_init(&s);
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

static void walk(const jtrie *t, int32_t node, const zi_json_state *s, int32_t *mask) {
    for (int32_t c = t->nodes[node].child; c >= 0; c = t->nodes[c].sibling) {
        zi_json_state st = *s;
        if (!feed_byte(&st, t->nodes[c].byte)) continue;
        for (int32_t id = t->nodes[c].tok; id >= 0; id = t->tok_next[id])
            mask[id >> 5] |= (int32_t)(1u << (id & 31));
        if (t->nodes[c].child >= 0) walk(t, c, &st, mask);
    }
}

void zi_json_allowed(const zi_json_vocab *v, const zi_json_state *s, const int32_t *eos,
                     size_t n_eos, int32_t *mask) {
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    if (s->mode == J_DONE) {
        memset(mask, 0, words * sizeof *mask);
        for (size_t i = 0; i < n_eos; i++)
            if (eos[i] >= 0 && eos[i] < v->n_vocab)
                mask[eos[i] >> 5] |= (int32_t)(1u << (eos[i] & 31));
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
