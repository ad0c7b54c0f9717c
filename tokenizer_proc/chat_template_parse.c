/*
 * chat_template_parse.c - arena, lexer and parser of the chat-template
 * engine (see chat_template_parse.h; the public API is chat_template.h).
 *
 * Lexing follows jinja2 3.x's Lexer with trim_blocks and lstrip_blocks on,
 * rule for rule, because the rendered prompt must match Hugging Face's
 * byte for byte:
 *  - the text before a tag loses all trailing whitespace when the tag opens
 *    with "-"; otherwise, unless it opens with "+" or is "{{", the run of
 *    whitespace between the last newline (or the start of a line) and the
 *    tag is dropped (lstrip_blocks);
 *  - "%}" and "#}" eat one following newline (trim_blocks), "-%}", "-}}"
 *    and "-#}" eat all following whitespace, "+%}" eats nothing;
 *  - inside a tag, an end marker only counts while brackets are balanced.
 * The parser is recursive descent with jinja2's precedence (lowest first):
 * conditional expression, or, and, not, comparisons (in, not in), + -, ~,
 * * / // %, **, unary - +, then primaries with postfix . [] () | and "is".
 */
#include "chat_template_parse.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ------------------------------------------------------------ */

struct ct_chunk {
    struct ct_chunk *next;
    size_t cap, used;
    max_align_t data[];
};

#define CT_CHUNK_MIN (64u * 1024u)

void ct_arena_init(ct_arena *a, size_t limit) {
    a->head = NULL;
    a->used = 0;
    a->limit = limit;
    a->refused = 0;
}

void ct_arena_free(ct_arena *a) {
    struct ct_chunk *c = a->head;
    while (c) {
        struct ct_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

void *ct_alloc(ct_arena *a, size_t n) {
    if (n == 0) n = 1;
    if (n > SIZE_MAX / 2) return NULL;
    n = (n + 15u) & ~(size_t)15u;
    if (a->limit && (n > a->limit || a->used > a->limit - n)) {
        a->refused = 1;
        return NULL;
    }
    struct ct_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > CT_CHUNK_MIN ? n : CT_CHUNK_MIN;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    a->used += n;
    return p;
}

void *ct_calloc(ct_arena *a, size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = ct_alloc(a, n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

/* ---- text helpers --------------------------------------------------- */

int ct_is_space(uint32_t cp) {
    if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
        return 1;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

size_t ct_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned char b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if (b >= 0xC2 && b <= 0xDF)
        len = 2, v = b & 0x1F, min = 0x80;
    else if (b >= 0xE0 && b <= 0xEF)
        len = 3, v = b & 0x0F, min = 0x800;
    else if (b >= 0xF0 && b <= 0xF4)
        len = 4, v = b & 0x07, min = 0x10000;
    else
        return 0;
    if (n < len) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

/* Start of the codepoint ending just before s[n] (n > 0; text is valid). */
static size_t utf8_prev(const char *s, size_t n) {
    size_t k = n - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    return k;
}

size_t ct_space_suffix(const char *s, size_t n) {
    size_t e = n;
    while (e > 0) {
        size_t b = utf8_prev(s, e);
        uint32_t cp;
        if (!ct_utf8_next((const unsigned char *)s + b, e - b, &cp) || !ct_is_space(cp)) break;
        e = b;
    }
    return n - e;
}

/* Length of the whitespace run at s[0..n). */
static size_t space_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = ct_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (!k || !ct_is_space(cp)) break;
        i += k;
    }
    return i;
}

void ct_location(const char *src, size_t len, size_t off, unsigned *line, unsigned *col) {
    unsigned l = 1, c = 1;
    if (off > len) off = len;
    for (size_t i = 0; i < off; i++) {
        if (src[i] == '\n')
            l++, c = 1;
        else if (((unsigned char)src[i] & 0xC0) != 0x80)
            c++;
    }
    *line = l;
    *col = c;
}

/* ---- tokens ------------------------------------------------------------ */

enum {
    TK_EOF,
    TK_DATA,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_ADD,
    TK_SUB,
    TK_DIV,
    TK_FLOORDIV,
    TK_MUL,
    TK_MOD,
    TK_POW,
    TK_TILDE,
    TK_LBRACKET,
    TK_RBRACKET,
    TK_LPAREN,
    TK_RPAREN,
    TK_LBRACE,
    TK_RBRACE,
    TK_EQ,
    TK_NE,
    TK_GT,
    TK_GTEQ,
    TK_LT,
    TK_LTEQ,
    TK_ASSIGN,
    TK_DOT,
    TK_COLON,
    TK_PIPE,
    TK_COMMA,
    TK_SEMICOLON,
};

typedef struct token {
    uint8_t type;
    uint32_t off;
    const char *s; /* NAME, DATA, STRING (unescaped) text */
    size_t len;
    int64_t i;
    double f;
} token;

/* Operators, longest first so that "//" wins over "/". */
static const struct {
    const char *text;
    uint8_t type;
} ops[] = {
    {"//", TK_FLOORDIV}, {"**", TK_POW},   {"==", TK_EQ},      {"!=", TK_NE},      {">=", TK_GTEQ},
    {"<=", TK_LTEQ},     {"+", TK_ADD},    {"-", TK_SUB},      {"/", TK_DIV},      {"*", TK_MUL},
    {"%", TK_MOD},       {"~", TK_TILDE},  {"[", TK_LBRACKET}, {"]", TK_RBRACKET}, {"(", TK_LPAREN},
    {")", TK_RPAREN},    {"{", TK_LBRACE}, {"}", TK_RBRACE},   {">", TK_GT},       {"<", TK_LT},
    {"=", TK_ASSIGN},    {".", TK_DOT},    {":", TK_COLON},    {"|", TK_PIPE},     {",", TK_COMMA},
    {";", TK_SEMICOLON},
};

static const char *op_text(int type) {
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        if (ops[k].type == type) return ops[k].text;
    return "?";
}

/* ---- lexer ------------------------------------------------------------- */

typedef struct lexer {
    const char *src;
    size_t n;
    size_t pos;
    token *toks;
    size_t ntok, cap;
    ct_arena *a;
    zi_error *err;
    int line_starting; /* the previous match ended with a newline */
} lexer;

static int lerr(lexer *lx, int code, size_t off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int lerr(lexer *lx, int code, size_t off, const char *fmt, ...) {
    char msg[ZI_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned line, col;
    ct_location(lx->src, lx->n, off, &line, &col);
    return zi_error_set(lx->err, code, "line %u col %u: %s", line, col, msg);
}

static token *push_tok(lexer *lx, int type, size_t off) {
    if (lx->ntok == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 256;
        token *t = realloc(lx->toks, cap * sizeof *t);
        if (!t) return NULL;
        lx->toks = t;
        lx->cap = cap;
    }
    token *t = &lx->toks[lx->ntok++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->off = (uint32_t)off;
    return t;
}

#define PUSH(lx, type, off, tvar)                                                                  \
    do {                                                                                           \
        tvar = push_tok(lx, type, off);                                                            \
        if (!tvar) return zi_error_set((lx)->err, ZI_ENOMEM, "out of memory lexing template");     \
    } while (0)

static int starts(const lexer *lx, size_t at, const char *s) {
    size_t k = strlen(s);
    return at <= lx->n && lx->n - at >= k && memcmp(lx->src + at, s, k) == 0;
}

/* Emits the text src[start..end) that precedes a tag, applying the
 * whitespace rules of the tag's sign ('-', '+' or 0). */
static int emit_text(lexer *lx, size_t start, size_t end, int sign, int is_var) {
    if (sign == '-') {
        end -= ct_space_suffix(lx->src + start, end - start);
    } else if (sign != '+' && !is_var) {
        size_t l = end;
        while (l > start && lx->src[l - 1] != '\n') l--;
        int after_newline = l > start;
        if ((after_newline || lx->line_starting) && l < end &&
            space_prefix(lx->src + l, end - l) == end - l)
            end = l;
    }
    if (end > start) {
        token *t;
        PUSH(lx, TK_DATA, start, t);
        t->s = lx->src + start;
        t->len = end - start;
    }
    return ZI_OK;
}

/* End of `(\d+_)*\d+` at i, or i when there is no digit there. */
static size_t scan_digits(const lexer *lx, size_t i, int (*isdig)(int)) {
    if (i >= lx->n || !isdig((unsigned char)lx->src[i])) return i;
    size_t e = i;
    for (;;) {
        while (e < lx->n && isdig((unsigned char)lx->src[e])) e++;
        if (e + 1 < lx->n && lx->src[e] == '_' && isdig((unsigned char)lx->src[e + 1])) {
            e++;
            continue;
        }
        return e;
    }
}

static int is_dec(int c) {
    return c >= '0' && c <= '9';
}
static int is_hex(int c) {
    return is_dec(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
static int is_oct(int c) {
    return c >= '0' && c <= '7';
}
static int is_bin(int c) {
    return c == '0' || c == '1';
}
static int is_name_start(int c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
static int is_name_char(int c) {
    return is_name_start(c) || is_dec(c);
}

/* Exponent `e[+-]?digits` at i: its end, or i when absent. */
static size_t scan_exponent(const lexer *lx, size_t i) {
    if (i >= lx->n || (lx->src[i] != 'e' && lx->src[i] != 'E')) return i;
    size_t j = i + 1;
    if (j < lx->n && (lx->src[j] == '+' || lx->src[j] == '-')) j++;
    size_t e = scan_digits(lx, j, is_dec);
    return e > j ? e : i;
}

/* Copies src[i..e) without underscores into buf (NUL-terminated). */
static int copy_number(const lexer *lx, size_t i, size_t e, char *buf, size_t cap) {
    size_t k = 0;
    for (size_t j = i; j < e; j++) {
        if (lx->src[j] == '_') continue;
        if (k + 1 >= cap) return -1;
        buf[k++] = lx->src[j];
    }
    buf[k] = '\0';
    return 0;
}

/* Numbers as jinja2 lexes them: a float (digits with a fraction and/or an
 * exponent, not right after a '.'), else an integer (0b/0o/0x prefixes,
 * decimal without leading zeros, or zeros). Returns 1 if one was lexed. */
static int lex_number(lexer *lx, int *rc) {
    size_t i = lx->pos;
    *rc = ZI_OK;
    if (!is_dec((unsigned char)lx->src[i])) return 0;
    char buf[512];
    size_t d = scan_digits(lx, i, is_dec);
    if (!(i > 0 && lx->src[i - 1] == '.')) {
        size_t e = d;
        if (d + 1 < lx->n && lx->src[d] == '.' && is_dec((unsigned char)lx->src[d + 1])) {
            e = scan_digits(lx, d + 1, is_dec);
            e = scan_exponent(lx, e);
        } else {
            e = scan_exponent(lx, d);
        }
        if (e > d) {
            token *t;
            if (copy_number(lx, i, e, buf, sizeof buf)) {
                *rc = lerr(lx, ZI_EFORMAT, i, "number literal too long");
                return 1;
            }
            t = push_tok(lx, TK_FLOAT, i);
            if (!t) {
                *rc = zi_error_set(lx->err, ZI_ENOMEM, "out of memory lexing template");
                return 1;
            }
            t->f = strtod(buf, NULL);
            lx->pos = e;
            return 1;
        }
    }
    int base = 10;
    size_t e;
    char p = i + 1 < lx->n ? lx->src[i + 1] : 0;
    if (lx->src[i] == '0' &&
        (p == 'b' || p == 'B' || p == 'o' || p == 'O' || p == 'x' || p == 'X')) {
        int (*isd)(int) = (p == 'b' || p == 'B')   ? is_bin
                          : (p == 'o' || p == 'O') ? is_oct
                                                   : is_hex;
        base = (p == 'b' || p == 'B') ? 2 : (p == 'o' || p == 'O') ? 8 : 16;
        /* `0x(_?[\da-f])+`: an underscore may also follow the prefix. */
        size_t j = i + 2;
        e = j;
        for (;;) {
            if (e < lx->n && isd((unsigned char)lx->src[e]))
                e++;
            else if (e + 1 < lx->n && lx->src[e] == '_' && isd((unsigned char)lx->src[e + 1]))
                e += 2;
            else
                break;
        }
        if (e == j) base = 10; /* just "0" followed by a name such as "b" */
    }
    if (base == 10) {
        if (lx->src[i] == '0') {
            e = i + 1;
            for (;;) {
                if (e < lx->n && lx->src[e] == '0')
                    e++;
                else if (e + 1 < lx->n && lx->src[e] == '_' && lx->src[e + 1] == '0')
                    e += 2;
                else
                    break;
            }
        } else {
            e = d;
        }
    }
    size_t from = base == 10 ? i : i + 2;
    if (copy_number(lx, from, e, buf, sizeof buf)) {
        *rc = lerr(lx, ZI_EFORMAT, i, "number literal too long");
        return 1;
    }
    errno = 0;
    unsigned long long v = strtoull(buf, NULL, base);
    if (errno == ERANGE || v > (unsigned long long)INT64_MAX) {
        *rc = lerr(lx, ZI_EUNSUPPORTED, i, "integer literal does not fit in 64 bits");
        return 1;
    }
    token *t = push_tok(lx, TK_INT, i);
    if (!t) {
        *rc = zi_error_set(lx->err, ZI_ENOMEM, "out of memory lexing template");
        return 1;
    }
    t->i = (int64_t)v;
    lx->pos = e;
    return 1;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return c - 'A' + 10;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string literal, unescaped the way jinja2 does it (Python's
 * "unicode-escape" codec applied after backslash-replacing non-ASCII). */
static int lex_string(lexer *lx) {
    size_t start = lx->pos;
    char q = lx->src[start];
    size_t i = start + 1;
    while (i < lx->n && lx->src[i] != q) i += (lx->src[i] == '\\' && i + 1 < lx->n) ? 2 : 1;
    if (i >= lx->n) return lerr(lx, ZI_EFORMAT, start, "unterminated string literal");
    size_t end = i; /* closing quote */
    /* The unescaped text is never longer than twice the raw text (the worst
     * case: a backslash before a 4-byte character becomes 10 characters). */
    size_t raw = end - start - 1;
    char *o = ct_alloc(lx->a, raw * 2 + 1);
    if (!o) return zi_error_set(lx->err, ZI_ENOMEM, "out of memory lexing template");
    size_t k = 0;
    for (size_t j = start + 1; j < end;) {
        char c = lx->src[j];
        if (c != '\\') {
            o[k++] = c;
            j++;
            continue;
        }
        char e = lx->src[j + 1]; /* exists: the closing quote is not escaped */
        size_t at = j;
        j += 2;
        switch (e) {
        case '\n':
            break;
        case '\\':
            o[k++] = '\\';
            break;
        case '\'':
            o[k++] = '\'';
            break;
        case '"':
            o[k++] = '"';
            break;
        case 'a':
            o[k++] = '\a';
            break;
        case 'b':
            o[k++] = '\b';
            break;
        case 'f':
            o[k++] = '\f';
            break;
        case 'n':
            o[k++] = '\n';
            break;
        case 'r':
            o[k++] = '\r';
            break;
        case 't':
            o[k++] = '\t';
            break;
        case 'v':
            o[k++] = '\v';
            break;
        case 'x':
        case 'u':
        case 'U': {
            size_t want = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (size_t h = 0; h < want; h++) {
                if (j + h >= end || !is_hex((unsigned char)lx->src[j + h]))
                    return lerr(lx, ZI_EFORMAT, at, "truncated \\%c escape in string literal", e);
                v = v * 16 + (uint32_t)hexval((unsigned char)lx->src[j + h]);
            }
            j += want;
            if (v > 0x10FFFF) return lerr(lx, ZI_EFORMAT, at, "illegal Unicode character escape");
            if (v >= 0xD800 && v <= 0xDFFF)
                return lerr(lx, ZI_EUNSUPPORTED, at, "surrogate escape in string literal");
            k += put_utf8(o + k, v);
            break;
        }
        case 'N':
            return lerr(lx, ZI_EUNSUPPORTED, at, "\\N{...} escapes are not supported");
        default:
            if (is_oct((unsigned char)e)) {
                uint32_t v = (uint32_t)(e - '0');
                for (int h = 0; h < 2 && j < end && is_oct((unsigned char)lx->src[j]); h++, j++)
                    v = v * 8 + (uint32_t)(lx->src[j] - '0');
                k += put_utf8(o + k, v);
            } else if ((unsigned char)e >= 0x80) {
                /* Python turned the character into \xNN/\uNNNN/\UNNNNNNNN
                 * before decoding; the backslash escapes that backslash. */
                uint32_t cp = 0;
                size_t cl =
                    ct_utf8_next((const unsigned char *)lx->src + j - 1, end - (j - 1), &cp);
                j = j - 1 + (cl ? cl : 1);
                o[k++] = '\\';
                k += (size_t)sprintf(o + k,
                                     cp < 0x100     ? "x%02x"
                                     : cp < 0x10000 ? "u%04x"
                                                    : "U%08x",
                                     (unsigned)cp);
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
    }
    o[k] = '\0';
    token *t;
    PUSH(lx, TK_STRING, start, t);
    t->s = o;
    t->len = k;
    lx->pos = end + 1;
    return ZI_OK;
}

/* Lexes the inside of a {{ }} or {% %} tag opened at tag_off, up to and
 * including its end marker. */
static int lex_tag(lexer *lx, int is_block, size_t tag_off) {
    char stack[CT_MAX_NESTING];
    size_t depth = 0;
    token *t;
    for (;;) {
        size_t i = lx->pos;
        if (i >= lx->n)
            return lerr(lx, ZI_EFORMAT, tag_off, "unclosed '%s' tag (the template ends first)",
                        is_block ? "{%" : "{{");
        if (depth == 0) {
            size_t end = 0;
            if (is_block) {
                if (starts(lx, i, "+%}"))
                    end = i + 3;
                else if (starts(lx, i, "-%}"))
                    end = i + 3 + space_prefix(lx->src + i + 3, lx->n - i - 3);
                else if (starts(lx, i, "%}"))
                    end = i + 2 + (starts(lx, i + 2, "\n") ? 1 : 0);
            } else {
                if (starts(lx, i, "-}}"))
                    end = i + 3 + space_prefix(lx->src + i + 3, lx->n - i - 3);
                else if (starts(lx, i, "}}"))
                    end = i + 2;
            }
            if (end) {
                PUSH(lx, is_block ? TK_BLOCK_END : TK_VAR_END, i, t);
                lx->line_starting = lx->src[end - 1] == '\n';
                lx->pos = end;
                return ZI_OK;
            }
        }
        size_t sp = space_prefix(lx->src + i, lx->n - i);
        if (sp) {
            lx->pos += sp;
            continue;
        }
        unsigned char c = (unsigned char)lx->src[i];
        int rc;
        if (lex_number(lx, &rc)) {
            if (rc) return rc;
            continue;
        }
        if (is_name_start(c)) {
            size_t e = i + 1;
            while (e < lx->n && is_name_char((unsigned char)lx->src[e])) e++;
            PUSH(lx, TK_NAME, i, t);
            t->s = lx->src + i;
            t->len = e - i;
            lx->pos = e;
            continue;
        }
        if (c == '\'' || c == '"') {
            if ((rc = lex_string(lx))) return rc;
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof ops / sizeof ops[0]; k++)
            if (starts(lx, i, ops[k].text)) break;
        if (k == sizeof ops / sizeof ops[0]) {
            if (c >= 0x80)
                return lerr(lx, ZI_EUNSUPPORTED, i, "non-ASCII character outside a string");
            return lerr(lx, ZI_EFORMAT, i, "unexpected character '%c'", c);
        }
        int type = ops[k].type;
        if (type == TK_LBRACE || type == TK_LPAREN || type == TK_LBRACKET) {
            if (depth == sizeof stack)
                return lerr(lx, ZI_EFORMAT, i, "brackets nested more than %d levels deep",
                            CT_MAX_NESTING);
            stack[depth++] = type == TK_LBRACE ? '}' : type == TK_LPAREN ? ')' : ']';
        } else if (type == TK_RBRACE || type == TK_RPAREN || type == TK_RBRACKET) {
            char want = stack[depth ? depth - 1 : 0];
            if (depth == 0) return lerr(lx, ZI_EFORMAT, i, "unexpected '%c'", c);
            if (want != (char)c)
                return lerr(lx, ZI_EFORMAT, i, "unexpected '%c', expected '%c'", c, want);
            depth--;
        }
        PUSH(lx, type, i, t);
        lx->pos = i + strlen(ops[k].text);
    }
}

/* `{%[-+]?\s*raw\s*(-%}\s*|%})` at i: its end, or 0. */
static size_t match_raw_begin(const lexer *lx, size_t i) {
    size_t j = i + 2;
    if (j < lx->n && (lx->src[j] == '-' || lx->src[j] == '+')) j++;
    j += space_prefix(lx->src + j, lx->n - j);
    if (!starts(lx, j, "raw")) return 0;
    j += 3;
    j += space_prefix(lx->src + j, lx->n - j);
    if (starts(lx, j, "-%}")) return j + 3 + space_prefix(lx->src + j + 3, lx->n - j - 3);
    if (starts(lx, j, "%}")) return j + 2;
    return 0;
}

/* After a raw begin tag: the data up to `{% endraw %}` (any sign). */
static int lex_raw_body(lexer *lx, size_t tag_off) {
    for (size_t i = lx->pos; i + 1 < lx->n; i++) {
        if (lx->src[i] != '{' || lx->src[i + 1] != '%') continue;
        size_t j = i + 2;
        int sign = 0;
        if (j < lx->n && (lx->src[j] == '-' || lx->src[j] == '+')) sign = lx->src[j++];
        j += space_prefix(lx->src + j, lx->n - j);
        if (!starts(lx, j, "endraw")) continue;
        j += 6;
        j += space_prefix(lx->src + j, lx->n - j);
        size_t end = 0;
        if (starts(lx, j, "+%}"))
            end = j + 3;
        else if (starts(lx, j, "-%}"))
            end = j + 3 + space_prefix(lx->src + j + 3, lx->n - j - 3);
        else if (starts(lx, j, "%}"))
            end = j + 2 + (starts(lx, j + 2, "\n") ? 1 : 0);
        if (!end) continue;
        int rc = emit_text(lx, lx->pos, i, sign, 0);
        if (rc) return rc;
        lx->line_starting = lx->src[end - 1] == '\n';
        lx->pos = end;
        return ZI_OK;
    }
    return lerr(lx, ZI_EFORMAT, tag_off, "missing end of raw directive");
}

static int lex(lexer *lx) {
    lx->line_starting = 1;
    token *t;
    while (lx->pos < lx->n) {
        size_t p = lx->pos;
        while (p + 1 < lx->n &&
               !(lx->src[p] == '{' &&
                 (lx->src[p + 1] == '{' || lx->src[p + 1] == '%' || lx->src[p + 1] == '#')))
            p++;
        if (p + 1 >= lx->n) {
            PUSH(lx, TK_DATA, lx->pos, t);
            t->s = lx->src + lx->pos;
            t->len = lx->n - lx->pos;
            lx->pos = lx->n;
            break;
        }
        char kind = lx->src[p + 1];
        int sign = 0;
        if (p + 2 < lx->n && (lx->src[p + 2] == '-' || lx->src[p + 2] == '+'))
            sign = lx->src[p + 2];
        size_t raw_end = kind == '%' ? match_raw_begin(lx, p) : 0;
        int rc = emit_text(lx, lx->pos, p, sign, kind == '{');
        if (rc) return rc;
        size_t body = p + 2 + (sign ? 1 : 0);
        if (raw_end) {
            lx->line_starting = lx->src[raw_end - 1] == '\n';
            lx->pos = raw_end;
            if ((rc = lex_raw_body(lx, p))) return rc;
        } else if (kind == '#') {
            size_t end = 0;
            for (size_t i = body; i + 1 < lx->n && !end; i++) {
                if ((lx->src[i] == '+' || lx->src[i] == '-') && starts(lx, i + 1, "#}")) {
                    end = i + 3;
                    if (lx->src[i] == '-') end += space_prefix(lx->src + end, lx->n - end);
                } else if (lx->src[i] == '#' && lx->src[i + 1] == '}') {
                    end = i + 2 + (starts(lx, i + 2, "\n") ? 1 : 0);
                }
            }
            if (!end) return lerr(lx, ZI_EFORMAT, p, "missing end of comment tag");
            lx->line_starting = lx->src[end - 1] == '\n';
            lx->pos = end;
        } else {
            PUSH(lx, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, p, t);
            lx->line_starting = 0;
            lx->pos = body;
            if ((rc = lex_tag(lx, kind == '%', p))) return rc;
        }
    }
    PUSH(lx, TK_EOF, lx->n, t);
    return ZI_OK;
}

/* ---- parser ------------------------------------------------------------ */

typedef struct parser {
    token *t;
    size_t i;
    ct_arena *a;
    zi_error *err;
    const char *src;
    size_t n;
    int depth;      /* recursion depth of the parser itself */
    int loop_depth; /* enclosing for loops, for break/continue */
    int (*resolve_filter)(const char *, size_t);
    int (*resolve_test)(const char *, size_t);
} parser;

static int perr(parser *p, int code, size_t off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int perr(parser *p, int code, size_t off, const char *fmt, ...) {
    char msg[ZI_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned line, col;
    ct_location(p->src, p->n, off, &line, &col);
    return zi_error_set(p->err, code, "line %u col %u: %s", line, col, msg);
}

static token *cur(parser *p) {
    return &p->t[p->i];
}
static token *look(parser *p) {
    return p->t[p->i].type == TK_EOF ? &p->t[p->i] : &p->t[p->i + 1];
}
static void adv(parser *p) {
    if (p->t[p->i].type != TK_EOF) p->i++;
}

static int tok_is_name(const token *t, const char *name) {
    return t->type == TK_NAME && t->len == strlen(name) && memcmp(t->s, name, t->len) == 0;
}

/* What a token is, for "expected X, got Y" messages. */
static void describe(const token *t, char *buf, size_t cap) {
    switch (t->type) {
    case TK_EOF:
        snprintf(buf, cap, "end of template");
        break;
    case TK_DATA:
        snprintf(buf, cap, "template data");
        break;
    case TK_VAR_BEGIN:
        snprintf(buf, cap, "begin of print statement");
        break;
    case TK_VAR_END:
        snprintf(buf, cap, "end of print statement");
        break;
    case TK_BLOCK_BEGIN:
        snprintf(buf, cap, "begin of statement block");
        break;
    case TK_BLOCK_END:
        snprintf(buf, cap, "end of statement block");
        break;
    case TK_NAME:
        if (t->s)
            snprintf(buf, cap, "'%.*s'", (int)(t->len > 40 ? 40 : t->len), t->s);
        else
            snprintf(buf, cap, "a name");
        break;
    case TK_STRING:
        snprintf(buf, cap, "string");
        break;
    case TK_INT:
        snprintf(buf, cap, "integer");
        break;
    case TK_FLOAT:
        snprintf(buf, cap, "float");
        break;
    default:
        snprintf(buf, cap, "'%s'", op_text(t->type));
        break;
    }
}

static int unexpected(parser *p, const char *expected) {
    char got[64];
    describe(cur(p), got, sizeof got);
    if (expected) return perr(p, ZI_EFORMAT, cur(p)->off, "expected %s, got %s", expected, got);
    return perr(p, ZI_EFORMAT, cur(p)->off, "unexpected %s", got);
}

static int expect(parser *p, int type) {
    if (cur(p)->type == type) {
        adv(p);
        return ZI_OK;
    }
    token want = {0};
    want.type = (uint8_t)type;
    char w[64];
    describe(&want, w, sizeof w);
    return unexpected(p, w);
}

static int expect_name(parser *p, const char *name) {
    if (tok_is_name(cur(p), name)) {
        adv(p);
        return ZI_OK;
    }
    char w[64];
    snprintf(w, sizeof w, "'%s'", name);
    return unexpected(p, w);
}

static ct_node *mk(parser *p, int kind, size_t off) {
    ct_node *n = ct_calloc(p->a, 1, sizeof *n);
    if (!n) {
        zi_error_set(p->err, ZI_ENOMEM, "out of memory parsing template");
        return NULL;
    }
    n->kind = (uint8_t)kind;
    n->off = (uint32_t)off;
    return n;
}

/* Growable node list in the arena (the old array is abandoned on growth;
 * at most doubling, so the waste is bounded by the final size). */
typedef struct nvec {
    ct_nodes l;
    size_t cap;
} nvec;

static int nvec_push(parser *p, nvec *v, ct_node *x) {
    if (v->l.n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        ct_node **nv = ct_alloc(p->a, cap * sizeof *nv);
        if (!nv) return zi_error_set(p->err, ZI_ENOMEM, "out of memory parsing template");
        if (v->l.n) memcpy(nv, v->l.v, v->l.n * sizeof *nv);
        v->l.v = nv;
        v->cap = cap;
    }
    v->l.v[v->l.n++] = x;
    return ZI_OK;
}

#define MK(var, p, kind, off)                                                                      \
    do {                                                                                           \
        var = mk(p, kind, off);                                                                    \
        if (!var) return ZI_ENOMEM;                                                                \
    } while (0)

static int enter(parser *p) {
    if (++p->depth > CT_MAX_NESTING)
        return perr(p, ZI_EFORMAT, cur(p)->off, "nested more than %d levels deep", CT_MAX_NESTING);
    return ZI_OK;
}

static int parse_expression(parser *p, int with_condexpr, ct_node **out);
static int parse_tuple(parser *p, int simplified, int with_condexpr, const char *extra_end,
                       int explicit_parens, int with_namespace, ct_node **out);
static int parse_unary(parser *p, int with_filter, ct_node **out);
static int parse_primary(parser *p, int with_namespace, ct_node **out);
static int subparse(parser *p, const char *const *ends, ct_nodes *body);

static int parse_call_args(parser *p, ct_nodes *args, ct_nodes *kwargs) {
    size_t open = cur(p)->off;
    TRY(expect(p, TK_LPAREN));
    nvec a = {0}, k = {0};
    int require_comma = 0;
    while (cur(p)->type != TK_RPAREN) {
        if (require_comma) {
            TRY(expect(p, TK_COMMA));
            if (cur(p)->type == TK_RPAREN) break;
        }
        if (cur(p)->type == TK_MUL || cur(p)->type == TK_POW)
            return perr(p, ZI_EUNSUPPORTED, cur(p)->off, "*args and **kwargs are not supported");
        if (cur(p)->type == TK_NAME && look(p)->type == TK_ASSIGN) {
            ct_node *kw;
            MK(kw, p, CT_N_KWARG, cur(p)->off);
            kw->s = cur(p)->s;
            kw->slen = cur(p)->len;
            adv(p);
            adv(p);
            TRY(parse_expression(p, 1, &kw->a));
            TRY(nvec_push(p, &k, kw));
        } else {
            if (k.l.n)
                return perr(p, ZI_EFORMAT, open, "positional argument follows keyword argument");
            ct_node *e;
            TRY(parse_expression(p, 1, &e));
            TRY(nvec_push(p, &a, e));
        }
        require_comma = 1;
    }
    TRY(expect(p, TK_RPAREN));
    *args = a.l;
    *kwargs = k.l;
    return ZI_OK;
}

/* A [start:stop:step] element or a plain key. */
static int parse_subscribed(parser *p, ct_node **out) {
    size_t off = cur(p)->off;
    ct_node *first = NULL;
    if (cur(p)->type != TK_COLON) {
        TRY(parse_expression(p, 1, &first));
        if (cur(p)->type != TK_COLON) {
            *out = first;
            return ZI_OK;
        }
    }
    adv(p); /* the colon */
    ct_node *s;
    MK(s, p, CT_N_SLICE, off);
    s->a = first;
    if (cur(p)->type != TK_COLON && cur(p)->type != TK_RBRACKET && cur(p)->type != TK_COMMA)
        TRY(parse_expression(p, 1, &s->b));
    if (cur(p)->type == TK_COLON) {
        adv(p);
        if (cur(p)->type != TK_RBRACKET && cur(p)->type != TK_COMMA)
            TRY(parse_expression(p, 1, &s->c));
    }
    *out = s;
    return ZI_OK;
}

static int parse_subscript(parser *p, ct_node *node, ct_node **out) {
    token *t = cur(p);
    adv(p);
    if (t->type == TK_DOT) {
        token *at = cur(p);
        adv(p);
        if (at->type == TK_NAME) {
            ct_node *g;
            MK(g, p, CT_N_GETATTR, t->off);
            g->a = node;
            g->s = at->s;
            g->slen = at->len;
            *out = g;
            return ZI_OK;
        }
        if (at->type != TK_INT) return perr(p, ZI_EFORMAT, at->off, "expected name or number");
        ct_node *k, *g;
        MK(k, p, CT_N_INT, at->off);
        k->i = at->i;
        MK(g, p, CT_N_GETITEM, t->off);
        g->a = node;
        g->b = k;
        *out = g;
        return ZI_OK;
    }
    /* '[' */
    nvec args = {0};
    while (cur(p)->type != TK_RBRACKET) {
        if (args.l.n) TRY(expect(p, TK_COMMA));
        ct_node *e;
        TRY(parse_subscribed(p, &e));
        TRY(nvec_push(p, &args, e));
    }
    TRY(expect(p, TK_RBRACKET));
    ct_node *g;
    MK(g, p, CT_N_GETITEM, t->off);
    g->a = node;
    if (args.l.n == 1) {
        g->b = args.l.v[0];
    } else {
        MK(g->b, p, CT_N_TUPLE, t->off);
        g->b->l1 = args.l;
    }
    *out = g;
    return ZI_OK;
}

static int parse_call(parser *p, ct_node *node, ct_node **out) {
    ct_node *c;
    MK(c, p, CT_N_CALL, cur(p)->off);
    c->a = node;
    TRY(parse_call_args(p, &c->l1, &c->l2));
    *out = c;
    return ZI_OK;
}

static int parse_postfix(parser *p, ct_node *node, ct_node **out) {
    for (;;) {
        int type = cur(p)->type;
        if (type == TK_DOT || type == TK_LBRACKET)
            TRY(parse_subscript(p, node, &node));
        else if (type == TK_LPAREN)
            TRY(parse_call(p, node, &node));
        else
            break;
    }
    *out = node;
    return ZI_OK;
}

/* A dotted name after '|' or 'is'. */
static int parse_dotted_name(parser *p, const char **s, size_t *len) {
    if (cur(p)->type != TK_NAME) return unexpected(p, "a name");
    const char *start = cur(p)->s;
    size_t end = cur(p)->off + cur(p)->len;
    adv(p);
    while (cur(p)->type == TK_DOT) {
        adv(p);
        if (cur(p)->type != TK_NAME) return unexpected(p, "a name");
        end = cur(p)->off + cur(p)->len;
        adv(p);
    }
    *s = start;
    *len = (size_t)(p->src + end - start);
    return ZI_OK;
}

static int parse_filter(parser *p, ct_node *node, int start_inline, ct_node **out) {
    while (cur(p)->type == TK_PIPE || start_inline) {
        if (!start_inline) adv(p);
        ct_node *f;
        MK(f, p, CT_N_FILTER, cur(p)->off);
        TRY(parse_dotted_name(p, &f->s, &f->slen));
        f->i = p->resolve_filter(f->s, f->slen);
        f->a = node;
        if (cur(p)->type == TK_LPAREN) TRY(parse_call_args(p, &f->l1, &f->l2));
        node = f;
        start_inline = 0;
    }
    *out = node;
    return ZI_OK;
}

static int parse_test(parser *p, ct_node *node, ct_node **out) {
    size_t off = cur(p)->off;
    adv(p); /* 'is' */
    int negated = 0;
    if (tok_is_name(cur(p), "not")) {
        adv(p);
        negated = 1;
    }
    ct_node *t;
    MK(t, p, CT_N_TEST, off);
    t->a = node;
    TRY(parse_dotted_name(p, &t->s, &t->slen));
    t->i = p->resolve_test(t->s, t->slen);
    int ty = cur(p)->type;
    if (ty == TK_LPAREN) {
        TRY(parse_call_args(p, &t->l1, &t->l2));
    } else if ((ty == TK_NAME || ty == TK_STRING || ty == TK_INT || ty == TK_FLOAT ||
                ty == TK_LBRACKET || ty == TK_LBRACE) &&
               !tok_is_name(cur(p), "else") && !tok_is_name(cur(p), "or") &&
               !tok_is_name(cur(p), "and")) {
        /* One argument without parentheses: `x is divisibleby 3`. */
        if (tok_is_name(cur(p), "is"))
            return perr(p, ZI_EFORMAT, cur(p)->off, "cannot chain multiple tests with 'is'");
        ct_node *arg;
        TRY(enter(p));
        TRY(parse_primary(p, 0, &arg));
        TRY(parse_postfix(p, arg, &arg));
        p->depth--;
        nvec a = {0};
        TRY(nvec_push(p, &a, arg));
        t->l1 = a.l;
    }
    if (negated) {
        ct_node *n;
        MK(n, p, CT_N_NOT, off);
        n->a = t;
        t = n;
    }
    *out = t;
    return ZI_OK;
}

static int parse_filter_expr(parser *p, ct_node *node, ct_node **out) {
    for (;;) {
        if (cur(p)->type == TK_PIPE)
            TRY(parse_filter(p, node, 0, &node));
        else if (tok_is_name(cur(p), "is"))
            TRY(parse_test(p, node, &node));
        else if (cur(p)->type == TK_LPAREN)
            TRY(parse_call(p, node, &node));
        else
            break;
    }
    *out = node;
    return ZI_OK;
}

static int parse_list(parser *p, ct_node **out) {
    ct_node *l;
    MK(l, p, CT_N_LIST, cur(p)->off);
    adv(p);
    nvec items = {0};
    while (cur(p)->type != TK_RBRACKET) {
        if (items.l.n) TRY(expect(p, TK_COMMA));
        if (cur(p)->type == TK_RBRACKET) break;
        ct_node *e;
        TRY(parse_expression(p, 1, &e));
        TRY(nvec_push(p, &items, e));
    }
    TRY(expect(p, TK_RBRACKET));
    l->l1 = items.l;
    *out = l;
    return ZI_OK;
}

static int parse_dict(parser *p, ct_node **out) {
    ct_node *d;
    MK(d, p, CT_N_DICT, cur(p)->off);
    adv(p);
    nvec keys = {0}, vals = {0};
    while (cur(p)->type != TK_RBRACE) {
        if (keys.l.n) TRY(expect(p, TK_COMMA));
        if (cur(p)->type == TK_RBRACE) break;
        ct_node *k, *v;
        TRY(parse_expression(p, 1, &k));
        TRY(expect(p, TK_COLON));
        TRY(parse_expression(p, 1, &v));
        TRY(nvec_push(p, &keys, k));
        TRY(nvec_push(p, &vals, v));
    }
    TRY(expect(p, TK_RBRACE));
    d->l1 = keys.l;
    d->l2 = vals.l;
    *out = d;
    return ZI_OK;
}

static int parse_primary(parser *p, int with_namespace, ct_node **out) {
    token *t = cur(p);
    ct_node *n;
    switch (t->type) {
    case TK_NAME:
        adv(p);
        if (tok_is_name(t, "true") || tok_is_name(t, "True") || tok_is_name(t, "false") ||
            tok_is_name(t, "False")) {
            MK(n, p, CT_N_BOOL, t->off);
            n->i = t->s[0] == 't' || t->s[0] == 'T';
        } else if (tok_is_name(t, "none") || tok_is_name(t, "None")) {
            MK(n, p, CT_N_NONE, t->off);
        } else if (with_namespace && cur(p)->type == TK_DOT) {
            adv(p);
            if (cur(p)->type != TK_NAME) return unexpected(p, "a name");
            MK(n, p, CT_N_NSREF, t->off);
            MK(n->a, p, CT_N_NAME, t->off);
            n->a->s = t->s;
            n->a->slen = t->len;
            n->s = cur(p)->s;
            n->slen = cur(p)->len;
            adv(p);
        } else {
            MK(n, p, CT_N_NAME, t->off);
            n->s = t->s;
            n->slen = t->len;
        }
        break;
    case TK_STRING: {
        /* Adjacent literals concatenate, as in Python. */
        size_t total = 0, k = p->i;
        while (p->t[k].type == TK_STRING) total += p->t[k++].len;
        MK(n, p, CT_N_STR, t->off);
        if (k == p->i + 1) {
            n->s = t->s;
        } else {
            char *buf = ct_alloc(p->a, total + 1);
            if (!buf) return zi_error_set(p->err, ZI_ENOMEM, "out of memory parsing template");
            size_t o = 0;
            for (size_t j = p->i; j < k; j++) {
                memcpy(buf + o, p->t[j].s, p->t[j].len);
                o += p->t[j].len;
            }
            buf[o] = '\0';
            n->s = buf;
        }
        n->slen = total;
        p->i = k;
        break;
    }
    case TK_INT:
        MK(n, p, CT_N_INT, t->off);
        n->i = t->i;
        adv(p);
        break;
    case TK_FLOAT:
        MK(n, p, CT_N_FLOAT, t->off);
        n->f = t->f;
        adv(p);
        break;
    case TK_LPAREN:
        adv(p);
        TRY(parse_tuple(p, 0, 1, NULL, 1, 0, &n));
        TRY(expect(p, TK_RPAREN));
        break;
    case TK_LBRACKET:
        TRY(parse_list(p, &n));
        break;
    case TK_LBRACE:
        TRY(parse_dict(p, &n));
        break;
    default:
        return unexpected(p, NULL);
    }
    *out = n;
    return ZI_OK;
}

static int parse_unary(parser *p, int with_filter, ct_node **out) {
    TRY(enter(p));
    token *t = cur(p);
    ct_node *node;
    if (t->type == TK_SUB || t->type == TK_ADD) {
        adv(p);
        MK(node, p, t->type == TK_SUB ? CT_N_NEG : CT_N_POS, t->off);
        TRY(parse_unary(p, 0, &node->a));
    } else {
        TRY(parse_primary(p, 0, &node));
    }
    TRY(parse_postfix(p, node, &node));
    if (with_filter) TRY(parse_filter_expr(p, node, &node));
    p->depth--;
    *out = node;
    return ZI_OK;
}

static int binop(parser *p, int op, size_t off, ct_node *l, ct_node *r, ct_node **out) {
    ct_node *n;
    MK(n, p, CT_N_BINOP, off);
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    *out = n;
    return ZI_OK;
}

static int parse_pow(parser *p, ct_node **out) {
    ct_node *left, *right;
    TRY(parse_unary(p, 1, &left));
    while (cur(p)->type == TK_POW) {
        size_t off = cur(p)->off;
        adv(p);
        TRY(parse_unary(p, 1, &right));
        TRY(binop(p, CT_OP_POW, off, left, right, &left));
    }
    *out = left;
    return ZI_OK;
}

static int parse_math2(parser *p, ct_node **out) {
    ct_node *left, *right;
    TRY(parse_pow(p, &left));
    for (;;) {
        int ty = cur(p)->type, op;
        if (ty == TK_MUL)
            op = CT_OP_MUL;
        else if (ty == TK_DIV)
            op = CT_OP_DIV;
        else if (ty == TK_FLOORDIV)
            op = CT_OP_FLOORDIV;
        else if (ty == TK_MOD)
            op = CT_OP_MOD;
        else
            break;
        size_t off = cur(p)->off;
        adv(p);
        TRY(parse_pow(p, &right));
        TRY(binop(p, op, off, left, right, &left));
    }
    *out = left;
    return ZI_OK;
}

static int parse_concat(parser *p, ct_node **out) {
    ct_node *first;
    size_t off = cur(p)->off;
    TRY(parse_math2(p, &first));
    if (cur(p)->type != TK_TILDE) {
        *out = first;
        return ZI_OK;
    }
    nvec args = {0};
    TRY(nvec_push(p, &args, first));
    while (cur(p)->type == TK_TILDE) {
        adv(p);
        ct_node *e;
        TRY(parse_math2(p, &e));
        TRY(nvec_push(p, &args, e));
    }
    ct_node *c;
    MK(c, p, CT_N_CONCAT, off);
    c->l1 = args.l;
    *out = c;
    return ZI_OK;
}

static int parse_math1(parser *p, ct_node **out) {
    ct_node *left, *right;
    TRY(parse_concat(p, &left));
    while (cur(p)->type == TK_ADD || cur(p)->type == TK_SUB) {
        int op = cur(p)->type == TK_ADD ? CT_OP_ADD : CT_OP_SUB;
        size_t off = cur(p)->off;
        adv(p);
        TRY(parse_concat(p, &right));
        TRY(binop(p, op, off, left, right, &left));
    }
    *out = left;
    return ZI_OK;
}

static int parse_compare(parser *p, ct_node **out) {
    size_t off = cur(p)->off;
    ct_node *expr;
    TRY(parse_math1(p, &expr));
    nvec ops_ = {0};
    for (;;) {
        int ty = cur(p)->type, op;
        size_t oo = cur(p)->off;
        if (ty == TK_EQ)
            op = CT_CMP_EQ;
        else if (ty == TK_NE)
            op = CT_CMP_NE;
        else if (ty == TK_LT)
            op = CT_CMP_LT;
        else if (ty == TK_LTEQ)
            op = CT_CMP_LE;
        else if (ty == TK_GT)
            op = CT_CMP_GT;
        else if (ty == TK_GTEQ)
            op = CT_CMP_GE;
        else if (tok_is_name(cur(p), "in"))
            op = CT_CMP_IN;
        else if (tok_is_name(cur(p), "not") && tok_is_name(look(p), "in")) {
            op = CT_CMP_NOTIN;
            adv(p);
        } else
            break;
        adv(p);
        ct_node *o;
        MK(o, p, CT_N_OPERAND, oo);
        o->op = (uint8_t)op;
        TRY(parse_math1(p, &o->a));
        TRY(nvec_push(p, &ops_, o));
    }
    if (!ops_.l.n) {
        *out = expr;
        return ZI_OK;
    }
    ct_node *c;
    MK(c, p, CT_N_COMPARE, off);
    c->a = expr;
    c->l1 = ops_.l;
    *out = c;
    return ZI_OK;
}

static int parse_not(parser *p, ct_node **out) {
    if (tok_is_name(cur(p), "not")) {
        TRY(enter(p));
        ct_node *n;
        MK(n, p, CT_N_NOT, cur(p)->off);
        adv(p);
        TRY(parse_not(p, &n->a));
        p->depth--;
        *out = n;
        return ZI_OK;
    }
    return parse_compare(p, out);
}

static int parse_and(parser *p, ct_node **out) {
    ct_node *left;
    TRY(parse_not(p, &left));
    while (tok_is_name(cur(p), "and")) {
        ct_node *n;
        MK(n, p, CT_N_AND, cur(p)->off);
        adv(p);
        n->a = left;
        TRY(parse_not(p, &n->b));
        left = n;
    }
    *out = left;
    return ZI_OK;
}

static int parse_or(parser *p, ct_node **out) {
    ct_node *left;
    TRY(parse_and(p, &left));
    while (tok_is_name(cur(p), "or")) {
        ct_node *n;
        MK(n, p, CT_N_OR, cur(p)->off);
        adv(p);
        n->a = left;
        TRY(parse_and(p, &n->b));
        left = n;
    }
    *out = left;
    return ZI_OK;
}

static int parse_condexpr(parser *p, ct_node **out) {
    TRY(enter(p));
    ct_node *expr1;
    TRY(parse_or(p, &expr1));
    while (tok_is_name(cur(p), "if")) {
        ct_node *c;
        MK(c, p, CT_N_COND, cur(p)->off);
        adv(p);
        c->b = expr1;
        TRY(parse_or(p, &c->a));
        if (tok_is_name(cur(p), "else")) {
            adv(p);
            TRY(parse_condexpr(p, &c->c));
        }
        expr1 = c;
    }
    p->depth--;
    *out = expr1;
    return ZI_OK;
}

static int parse_expression(parser *p, int with_condexpr, ct_node **out) {
    if (with_condexpr) return parse_condexpr(p, out);
    TRY(enter(p));
    TRY(parse_or(p, out));
    p->depth--;
    return ZI_OK;
}

static int is_tuple_end(parser *p, const char *extra_end) {
    int ty = cur(p)->type;
    if (ty == TK_VAR_END || ty == TK_BLOCK_END || ty == TK_RPAREN) return 1;
    return extra_end && tok_is_name(cur(p), extra_end);
}

static int parse_tuple(parser *p, int simplified, int with_condexpr, const char *extra_end,
                       int explicit_parens, int with_namespace, ct_node **out) {
    size_t off = cur(p)->off;
    nvec args = {0};
    int is_tuple = 0;
    for (;;) {
        if (args.l.n) TRY(expect(p, TK_COMMA));
        if (is_tuple_end(p, extra_end)) break;
        ct_node *e;
        if (simplified) {
            TRY(enter(p));
            TRY(parse_primary(p, with_namespace, &e));
            p->depth--;
        } else {
            TRY(parse_expression(p, with_condexpr, &e));
        }
        TRY(nvec_push(p, &args, e));
        if (cur(p)->type == TK_COMMA)
            is_tuple = 1;
        else
            break;
    }
    if (!is_tuple) {
        if (args.l.n) {
            *out = args.l.v[0];
            return ZI_OK;
        }
        if (!explicit_parens) return unexpected(p, "an expression");
    }
    ct_node *t;
    MK(t, p, CT_N_TUPLE, off);
    t->l1 = args.l;
    *out = t;
    return ZI_OK;
}

/* ---- statements ------------------------------------------------------- */

static int can_assign(const ct_node *n) {
    if (n->kind == CT_N_NAME || n->kind == CT_N_NSREF) return 1;
    if (n->kind != CT_N_TUPLE) return 0;
    for (size_t k = 0; k < n->l1.n; k++)
        if (!can_assign(n->l1.v[k])) return 0;
    return 1;
}

static int parse_assign_target(parser *p, const char *extra_end, int with_namespace,
                               ct_node **out) {
    size_t off = cur(p)->off;
    TRY(parse_tuple(p, 1, 1, extra_end, 0, with_namespace, out));
    if (!can_assign(*out)) return perr(p, ZI_EFORMAT, off, "cannot assign to this expression");
    return ZI_OK;
}

/* The tag that opened a block, for "not closed" messages. */
typedef struct opener {
    const char *name;
    size_t off;
} opener;

/* Skips an optional ':', expects the end of the opening tag, and parses
 * the body up to one of `ends` (left as the current token; consumed, with
 * the rest of its tag still to come, when drop_needle). */
static int parse_statements(parser *p, const opener *o, const char *const *ends, int drop_needle,
                            ct_nodes *body) {
    if (cur(p)->type == TK_COLON) adv(p);
    TRY(expect(p, TK_BLOCK_END));
    TRY(enter(p));
    TRY(subparse(p, ends, body));
    p->depth--;
    if (cur(p)->type == TK_EOF) {
        char want[160];
        size_t k = 0;
        want[0] = '\0';
        for (const char *const *e = ends; *e; e++)
            k += (size_t)snprintf(want + k, sizeof want - k, "%s'%s'", k ? " or " : "", *e);
        return perr(p, ZI_EFORMAT, o->off,
                    "'%s' block is never closed (the template ends before %s)", o->name, want);
    }
    if (drop_needle) adv(p);
    return ZI_OK;
}

static int parse_for(parser *p, ct_node **out) {
    static const char *const body_end[] = {"endfor", "else", NULL};
    static const char *const else_end[] = {"endfor", NULL};
    /* the "{%" of the tag */
    opener o = {"for", p->t[p->i - 1].off};
    ct_node *f;
    MK(f, p, CT_N_FOR, cur(p)->off);
    adv(p);
    TRY(parse_assign_target(p, "in", 0, &f->a));
    TRY(expect_name(p, "in"));
    TRY(parse_tuple(p, 0, 0, "recursive", 0, 0, &f->b));
    if (tok_is_name(cur(p), "if")) {
        adv(p);
        TRY(parse_expression(p, 1, &f->c));
    }
    if (tok_is_name(cur(p), "recursive"))
        return perr(p, ZI_EUNSUPPORTED, cur(p)->off, "recursive loops are not supported");
    p->loop_depth++;
    TRY(parse_statements(p, &o, body_end, 0, &f->l1));
    p->loop_depth--;
    int is_else = tok_is_name(cur(p), "else");
    adv(p);
    if (is_else) TRY(parse_statements(p, &o, else_end, 1, &f->l2));
    *out = f;
    return ZI_OK;
}

static int parse_if(parser *p, ct_node **out) {
    static const char *const body_end[] = {"elif", "else", "endif", NULL};
    static const char *const else_end[] = {"endif", NULL};
    /* the "{%" of the tag */
    opener o = {"if", p->t[p->i - 1].off};
    ct_node *result, *node;
    MK(result, p, CT_N_IF, cur(p)->off);
    adv(p);
    node = result;
    for (;;) {
        TRY(parse_tuple(p, 0, 0, NULL, 0, 0, &node->a));
        TRY(parse_statements(p, &o, body_end, 0, &node->l1));
        token *t = cur(p);
        adv(p);
        if (tok_is_name(t, "elif")) {
            ct_node *n;
            MK(n, p, CT_N_IF, t->off);
            nvec e = {0};
            TRY(nvec_push(p, &e, n));
            node->l2 = e.l;
            node = n;
            continue;
        }
        if (tok_is_name(t, "else")) TRY(parse_statements(p, &o, else_end, 1, &node->l2));
        break;
    }
    *out = result;
    return ZI_OK;
}

static int parse_set(parser *p, ct_node **out) {
    static const char *const ends[] = {"endset", NULL};
    /* the "{%" of the tag */
    opener o = {"set", p->t[p->i - 1].off};
    size_t off = cur(p)->off;
    adv(p);
    ct_node *target;
    TRY(parse_assign_target(p, NULL, 1, &target));
    ct_node *s;
    if (cur(p)->type == TK_ASSIGN) {
        adv(p);
        MK(s, p, CT_N_SET, off);
        s->a = target;
        TRY(parse_tuple(p, 0, 1, NULL, 0, 0, &s->b));
    } else {
        MK(s, p, CT_N_SETBLOCK, off);
        s->a = target;
        TRY(parse_filter(p, NULL, 0, &s->b));
        TRY(parse_statements(p, &o, ends, 1, &s->l1));
    }
    *out = s;
    return ZI_OK;
}

static int parse_macro(parser *p, ct_node **out) {
    static const char *const ends[] = {"endmacro", NULL};
    /* the "{%" of the tag */
    opener o = {"macro", p->t[p->i - 1].off};
    ct_node *m;
    MK(m, p, CT_N_MACRO, cur(p)->off);
    adv(p);
    if (cur(p)->type != TK_NAME) return unexpected(p, "a macro name");
    m->s = cur(p)->s;
    m->slen = cur(p)->len;
    adv(p);
    TRY(expect(p, TK_LPAREN));
    nvec params = {0}, defaults = {0};
    while (cur(p)->type != TK_RPAREN) {
        if (params.l.n) TRY(expect(p, TK_COMMA));
        if (cur(p)->type != TK_NAME) return unexpected(p, "a parameter name");
        ct_node *n;
        MK(n, p, CT_N_NAME, cur(p)->off);
        n->s = cur(p)->s;
        n->slen = cur(p)->len;
        adv(p);
        if (cur(p)->type == TK_ASSIGN) {
            adv(p);
            ct_node *d;
            TRY(parse_expression(p, 1, &d));
            TRY(nvec_push(p, &defaults, d));
        } else if (defaults.l.n) {
            return perr(p, ZI_EFORMAT, n->off, "non-default argument follows default argument");
        }
        TRY(nvec_push(p, &params, n));
    }
    TRY(expect(p, TK_RPAREN));
    m->l2 = params.l;
    m->l3 = defaults.l;
    int saved = p->loop_depth;
    p->loop_depth = 0;
    TRY(parse_statements(p, &o, ends, 1, &m->l1));
    p->loop_depth = saved;
    *out = m;
    return ZI_OK;
}

/* Parses one {% ... %} statement (the current token is its name), leaving
 * the closing block end as the current token. *out may stay NULL ({% print
 * %} appends its outputs to body directly). */
static int parse_statement(parser *p, nvec *body) {
    static const char *const unsupported[] = {"block", "extends", "include",    "import", "from",
                                              "call",  "with",    "autoescape", "do",     NULL};
    token *t = cur(p);
    if (t->type != TK_NAME) return unexpected(p, "a tag name");
    ct_node *n = NULL;
    if (tok_is_name(t, "for"))
        TRY(parse_for(p, &n));
    else if (tok_is_name(t, "if"))
        TRY(parse_if(p, &n));
    else if (tok_is_name(t, "set"))
        TRY(parse_set(p, &n));
    else if (tok_is_name(t, "macro"))
        TRY(parse_macro(p, &n));
    else if (tok_is_name(t, "break") || tok_is_name(t, "continue")) {
        if (!p->loop_depth)
            return perr(p, ZI_EFORMAT, t->off, "'%.*s' outside a for loop", (int)t->len, t->s);
        MK(n, p, t->s[0] == 'b' ? CT_N_BREAK : CT_N_CONTINUE, t->off);
        adv(p);
    } else if (tok_is_name(t, "print")) {
        adv(p);
        while (cur(p)->type != TK_BLOCK_END) {
            if (n) TRY(expect(p, TK_COMMA));
            MK(n, p, CT_N_OUTPUT, cur(p)->off);
            TRY(parse_expression(p, 1, &n->a));
            TRY(nvec_push(p, body, n));
        }
        return ZI_OK;
    } else if (tok_is_name(t, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        opener o = {"filter", p->t[p->i - 1].off};
        MK(n, p, CT_N_FILTERBLOCK, t->off);
        adv(p);
        TRY(parse_filter(p, NULL, 1, &n->b));
        TRY(parse_statements(p, &o, ends, 1, &n->l1));
    } else if (tok_is_name(t, "generation")) {
        /* Hugging Face's AssistantTracker tag: the body renders in place. */
        static const char *const ends[] = {"endgeneration", NULL};
        opener o = {"generation", p->t[p->i - 1].off};
        MK(n, p, CT_N_SCOPE, t->off);
        adv(p);
        TRY(parse_statements(p, &o, ends, 1, &n->l1));
    } else {
        for (const char *const *u = unsupported; *u; u++)
            if (tok_is_name(t, *u))
                return perr(p, ZI_EUNSUPPORTED, t->off, "the '%s' tag is not supported", *u);
        return perr(p, ZI_EFORMAT, t->off, "unknown or misplaced tag '%.*s'",
                    (int)(t->len > 40 ? 40 : t->len), t->s);
    }
    return nvec_push(p, body, n);
}

static int subparse(parser *p, const char *const *ends, ct_nodes *out) {
    nvec body = {0};
    for (;;) {
        token *t = cur(p);
        if (t->type == TK_EOF) break;
        if (t->type == TK_DATA) {
            ct_node *d;
            MK(d, p, CT_N_DATA, t->off);
            d->s = t->s;
            d->slen = t->len;
            TRY(nvec_push(p, &body, d));
            adv(p);
        } else if (t->type == TK_VAR_BEGIN) {
            adv(p);
            ct_node *o;
            MK(o, p, CT_N_OUTPUT, t->off);
            TRY(parse_tuple(p, 0, 1, NULL, 0, 0, &o->a));
            TRY(expect(p, TK_VAR_END));
            TRY(nvec_push(p, &body, o));
        } else if (t->type == TK_BLOCK_BEGIN) {
            adv(p);
            if (ends) {
                for (const char *const *e = ends; *e; e++)
                    if (tok_is_name(cur(p), *e)) {
                        *out = body.l;
                        return ZI_OK;
                    }
            }
            TRY(parse_statement(p, &body));
            TRY(expect(p, TK_BLOCK_END));
        } else {
            return unexpected(p, NULL);
        }
    }
    *out = body.l;
    return ZI_OK;
}

/* ---- entry point ------------------------------------------------------- */

/* Newlines (\r\n, \r) become \n and one trailing newline is dropped, as
 * jinja2 does to the whole source before lexing (keep_trailing_newline off). */
static char *normalise(ct_arena *a, const char *src, size_t len, size_t *out_len) {
    char *o = ct_alloc(a, len + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            o[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            o[k++] = src[i];
        }
    }
    if (k && o[k - 1] == '\n') k--;
    o[k] = '\0';
    *out_len = k;
    return o;
}

int ct_parse(ct_arena *a, const char *src, size_t len, int (*resolve_filter)(const char *, size_t),
             int (*resolve_test)(const char *, size_t), ct_nodes *out, const char **norm,
             size_t *norm_len, zi_error *err) {
    size_t n;
    char *s = normalise(a, src, len, &n);
    if (!s) return zi_error_set(err, ZI_ENOMEM, "out of memory reading template");
    lexer lx = {0};
    lx.src = s;
    lx.n = n;
    lx.a = a;
    lx.err = err;
    int rc = lex(&lx);
    if (rc == ZI_OK) {
        parser p = {0};
        p.t = lx.toks;
        p.a = a;
        p.err = err;
        p.src = s;
        p.n = n;
        p.resolve_filter = resolve_filter;
        p.resolve_test = resolve_test;
        rc = subparse(&p, NULL, out);
        if (rc == ZI_OK && cur(&p)->type != TK_EOF) rc = unexpected(&p, NULL);
    }
    free(lx.toks);
    *norm = s;
    *norm_len = n;
    return rc;
}
