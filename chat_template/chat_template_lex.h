/*
 * chat_template_lex.h - internal to the chat-template parser: the tokens
 * chat_template_lex.c produces and chat_template_parse.c consumes.
 *
 * The lexer reproduces jinja2 3.x's with trim_blocks and lstrip_blocks on
 * (see chat_template_lex.c); a template becomes DATA tokens for literal
 * text and, for each {{ }} or {% %} tag, a BEGIN token, the tag's
 * expression tokens and an END token. Nothing outside these two files
 * includes this header.
 */
#ifndef ZI_CHAT_TEMPLATE_LEX_H
#define ZI_CHAT_TEMPLATE_LEX_H

#include <stddef.h>
#include <stdint.h>

#include "chat_template_parse.h"
#include "zi_error.h"

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

typedef struct ct_token {
    uint8_t type;
    uint32_t off;
    const char *s; /* NAME, DATA, STRING (unescaped) text */
    size_t len;
    int64_t i;
    double f;
} ct_token;

/* The text of an operator token ("//", "(", ...), "?" for other types. */
const char *ct_op_text(int type);

/* What a token is, for "expected X, got Y" messages: "end of template",
 * "'name'", "string", "'+'", ... (cut to fit buf[0..cap)). */
void ct_token_describe(const ct_token *t, char *buf, size_t cap);

/* A copy of src[0..len) from `a` with newlines (\r\n, \r) made \n and one
 * trailing newline dropped, as jinja2 treats the whole source before
 * lexing (keep_trailing_newline off); *out_len receives its length. NULL
 * when `a` refuses the allocation. */
char *ct_normalise(ct_arena *a, const char *src, size_t len, size_t *out_len);

/*
 * Splits the normalised source src[0..n) into tokens ending with TK_EOF.
 * *toks receives a malloc'd array the caller frees, on success and on
 * failure alike. Unescaped string literals are allocated from `a`. Errors:
 * ZI_EFORMAT ("line L col C: ..."), ZI_ENOMEM.
 */
int ct_lex(ct_arena *a, const char *src, size_t n, zi_error *err, ct_token **toks);

#endif
