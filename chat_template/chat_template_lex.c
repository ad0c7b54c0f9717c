/*
 * chat_template_lex.c - the lexer of the chat-template engine (see
 * chat_template_lex.h) with the source normalisation before it and the
 * token descriptions the parser's messages use, and the whitespace and
 * error-position helpers
 * every phase uses (ct_is_space, ct_space_suffix, ct_location,
 * ct_error_at; declared in chat_template_parse.h). UTF-8 decoding is
 * common/utf8.h's zi_utf8_next.
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
 */
#include "chat_template_lex.h"
#include "grow.h"
#include "unicode.h"
#include "utf8.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        if (!zi_utf8_next((const unsigned char *)s + b, e - b, &cp) || !ct_is_space(cp)) break;
        e = b;
    }
    return n - e;
}

/* Length of the whitespace run at s[0..n). */
static size_t space_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = zi_utf8_next((const unsigned char *)s + i, n - i, &cp);
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

int ct_error_at(zi_error *err, int code, const char *src, size_t len, size_t off,
                const char *prefix, const char *fmt, ...) {
    char msg[ZI_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* a name quoted from a string (`select("a\nb")`) may hold control
     * characters: zi_error_set keeps the message one line */
    unsigned line, col;
    ct_location(src, len, off, &line, &col);
    return zi_error_set(err, code, "%sline %u col %u: %s", prefix, line, col, msg);
}

/* ---- tokens ------------------------------------------------------------ */

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

const char *ct_op_text(int type) {
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        if (ops[k].type == type) return ops[k].text;
    return "?";
}

/* ---- lexer ------------------------------------------------------------- */

typedef struct lexer {
    const char *src;
    size_t n;
    size_t pos;
    ct_token *toks;
    size_t ntok, cap;
    ct_arena *a;
    zi_error *err;
    int line_starting; /* the previous match ended with a newline */
} lexer;

/* Records a syntax error at source offset `off` ("line L col C: ..."). */
#define lerr(lx, code, off, ...)                                                                   \
    ct_error_at((lx)->err, code, (lx)->src, (lx)->n, off, "", __VA_ARGS__)

static ct_token *push_tok(lexer *lx, int type, size_t off) {
    if (lx->ntok == lx->cap) {
        ct_token *t = zi_grow(lx->toks, &lx->cap, sizeof *t, 256);
        if (!t) return NULL;
        lx->toks = t;
    }
    ct_token *t = &lx->toks[lx->ntok++];
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
        ct_token *t;
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
            ct_token *t;
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
    ct_token *t = push_tok(lx, TK_INT, i);
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
            k += zi_utf8_encode(v, (unsigned char *)o + k);
            break;
        }
        case 'N':
            return lerr(lx, ZI_EUNSUPPORTED, at, "\\N{...} escapes are not supported");
        default:
            if (is_oct((unsigned char)e)) {
                uint32_t v = (uint32_t)(e - '0');
                for (int h = 0; h < 2 && j < end && is_oct((unsigned char)lx->src[j]); h++, j++)
                    v = v * 8 + (uint32_t)(lx->src[j] - '0');
                k += zi_utf8_encode(v, (unsigned char *)o + k);
            } else if ((unsigned char)e >= 0x80) {
                /* Python turned the character into \xNN/\uNNNN/\UNNNNNNNN
                 * before decoding; the backslash escapes that backslash. */
                uint32_t cp = 0;
                size_t cl =
                    zi_utf8_next((const unsigned char *)lx->src + j - 1, end - (j - 1), &cp);
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
    ct_token *t;
    PUSH(lx, TK_STRING, start, t);
    t->s = o;
    t->len = k;
    lx->pos = end + 1;
    return ZI_OK;
}

/* Lexes the inside of a {{ }} or {% %} tag opened at tag_off, up to and
 * including its end marker. */
/* A block tag's end marker at i: where the text after it starts ("+%}"
 * eats nothing, "-%}" all following whitespace, "%}" one newline), or 0
 * when there is none. */
static size_t block_end_at(const lexer *lx, size_t i) {
    if (starts(lx, i, "+%}")) return i + 3;
    if (starts(lx, i, "-%}")) return i + 3 + space_prefix(lx->src + i + 3, lx->n - i - 3);
    if (starts(lx, i, "%}")) return i + 2 + (starts(lx, i + 2, "\n") ? 1 : 0);
    return 0;
}

static int lex_tag(lexer *lx, int is_block, size_t tag_off) {
    char stack[CT_MAX_NESTING];
    size_t depth = 0;
    ct_token *t;
    for (;;) {
        size_t i = lx->pos;
        if (i >= lx->n)
            return lerr(lx, ZI_EFORMAT, tag_off, "unclosed '%s' tag (the template ends first)",
                        is_block ? "{%" : "{{");
        if (depth == 0) {
            size_t end = 0;
            if (is_block) {
                end = block_end_at(lx, i);
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
        size_t end = block_end_at(lx, j);
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
    ct_token *t;
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

int ct_lex(ct_arena *a, const char *src, size_t n, zi_error *err, ct_token **toks) {
    lexer lx = {0};
    lx.src = src;
    lx.n = n;
    lx.a = a;
    lx.err = err;
    int rc = lex(&lx);
    *toks = lx.toks;
    return rc;
}

/* What a token is, for "expected X, got Y" messages. */
void ct_token_describe(const ct_token *t, char *buf, size_t cap) {
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
        snprintf(buf, cap, "'%s'", ct_op_text(t->type));
        break;
    }
}

/* Newlines (\r\n, \r) become \n and one trailing newline is dropped, as
 * jinja2 does to the whole source before lexing (keep_trailing_newline off). */
char *ct_normalise(ct_arena *a, const char *src, size_t len, size_t *out_len) {
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
