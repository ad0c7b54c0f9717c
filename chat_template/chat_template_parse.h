/*
 * chat_template_parse.h - internal to the chat-template engine: the arena
 * both phases allocate from, the syntax tree, and the lexer + parser that
 * turn template source into that tree.
 *
 * chat_template.c (the public API and the evaluator) compiles a template by
 * calling ct_parse, keeps the tree for the template's lifetime and walks it
 * on every render. Nothing here is visible outside tokenizer_proc/. The
 * arena is chat_template_arena.c, the lexer and the text helpers
 * chat_template_lex.c (tokens: chat_template_lex.h), the parser
 * chat_template_parse.c.
 *
 * The lexer reproduces jinja2's with trim_blocks=True and lstrip_blocks=True
 * (the environment Hugging Face's apply_chat_template uses): newlines are
 * normalised to "\n", one trailing newline is dropped, "{%-"/"-%}" strip
 * whitespace, "{%+"/"+%}" disable lstrip/trim, and {% raw %} is honoured.
 * The parser follows jinja2's grammar and operator precedence.
 */
#ifndef ZI_CHAT_TEMPLATE_PARSE_H
#define ZI_CHAT_TEMPLATE_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

/* ---- error propagation ------------------------------------------------ */

/* Every function of the engine returns ZI_OK or an error code (the message
 * already recorded); TRY(x) returns x's code from the enclosing function
 * when it is not ZI_OK. Shared by the lexer, parser, evaluator and values. */
#define TRY(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_) return rc_;                                                                       \
    } while (0)

/* ---- arena ------------------------------------------------------------ */

/* A bump allocator: everything a template's tree or one render needs is
 * freed at once. `limit` (0 = none) caps the total bytes handed out, so a
 * hostile template cannot make a render consume unbounded memory. */
typedef struct ct_arena {
    struct ct_chunk *head;
    size_t used;  /* bytes handed out so far */
    size_t limit; /* 0: unlimited */
    int refused;  /* an allocation failed because of the limit */
} ct_arena;

void ct_arena_init(ct_arena *a, size_t limit);
void ct_arena_free(ct_arena *a);
/* 8-byte aligned, uninitialised; NULL when the limit or malloc fails. */
void *ct_alloc(ct_arena *a, size_t n);
/* Zeroed n * size bytes; NULL on overflow, the limit, or malloc failure. */
void *ct_calloc(ct_arena *a, size_t n, size_t size);

/* ---- syntax tree -------------------------------------------------------- */

enum ct_node_kind {
    /* statements */
    CT_N_DATA,        /* s: literal text */
    CT_N_OUTPUT,      /* a: expression printed */
    CT_N_IF,          /* a: test, l1: body, l2: else body (an elif is an IF in l2) */
    CT_N_FOR,         /* a: target, b: iterable, c: filter or NULL, l1: body, l2: else */
    CT_N_SET,         /* a: target (NAME, TUPLE of NAMEs, NSREF), b: value */
    CT_N_SETBLOCK,    /* a: target, b: FILTER chain (innermost a == NULL) or NULL, l1: body */
    CT_N_FILTERBLOCK, /* b: FILTER chain as for SETBLOCK, l1: body */
    CT_N_MACRO,       /* s: name, l1: body, l2: params (NAMEs), l3: defaults (last ones) */
    CT_N_BREAK,
    CT_N_CONTINUE,
    CT_N_SCOPE, /* l1: body rendered in place ({% generation %}) */
    /* expressions */
    CT_N_STR,   /* s */
    CT_N_INT,   /* i */
    CT_N_FLOAT, /* f */
    CT_N_BOOL,  /* i: 0 or 1 */
    CT_N_NONE,
    CT_N_NAME,    /* s */
    CT_N_NSREF,   /* s: attribute, a: NAME of the namespace (assignment target) */
    CT_N_GETATTR, /* a: object, s: attribute */
    CT_N_GETITEM, /* a: object, b: key or SLICE */
    CT_N_SLICE,   /* a: start, b: stop, c: step (each may be NULL) */
    CT_N_CALL,    /* a: callee, l1: positional args, l2: KWARGs */
    CT_N_KWARG,   /* s: name, a: value */
    CT_N_FILTER,  /* a: operand, s: name, i: builtin id or -1, l1/l2: args */
    CT_N_TEST,    /* a: operand, s: name, i: builtin id or -1, l1/l2: args */
    CT_N_LIST,    /* l1: items */
    CT_N_TUPLE,   /* l1: items */
    CT_N_DICT,    /* l1: keys, l2: values */
    CT_N_COND,    /* a: condition, b: value if true, c: value if false or NULL */
    CT_N_AND,     /* a, b */
    CT_N_OR,      /* a, b */
    CT_N_NOT,     /* a */
    CT_N_NEG,     /* a */
    CT_N_POS,     /* a */
    CT_N_BINOP,   /* op: CT_OP_*, a, b */
    CT_N_CONCAT,  /* l1: operands of ~ */
    CT_N_COMPARE, /* a: first operand, l1: OPERANDs */
    CT_N_OPERAND, /* op: CT_CMP_*, a: right-hand side */
};

enum { CT_OP_ADD, CT_OP_SUB, CT_OP_MUL, CT_OP_DIV, CT_OP_FLOORDIV, CT_OP_MOD, CT_OP_POW };
enum { CT_CMP_EQ, CT_CMP_NE, CT_CMP_LT, CT_CMP_LE, CT_CMP_GT, CT_CMP_GE, CT_CMP_IN, CT_CMP_NOTIN };

typedef struct ct_node ct_node;

typedef struct ct_nodes {
    ct_node **v;
    size_t n;
} ct_nodes;

struct ct_node {
    uint8_t kind; /* CT_N_* */
    uint8_t op;   /* CT_OP_* or CT_CMP_* */
    uint32_t off; /* byte offset in the normalised source, for error messages */
    const char *s;
    size_t slen;
    int64_t i;
    double f;
    ct_node *a, *b, *c;
    ct_nodes l1, l2, l3;
};

/* Limits the parser enforces so that neither it nor the evaluator (which
 * recurses along the tree) can exhaust the stack. */
#define CT_MAX_NESTING 100

/*
 * Parses src[0..len) (already validated as UTF-8) into a statement list.
 * The source is first normalised (newlines, trailing newline) into a copy
 * allocated from `a`; *norm / *norm_len receive it, and every node's `off`
 * and string points into it or into `a`. `resolve_filter` / `resolve_test`
 * map a filter or test name to a builtin id (or -1, which the evaluator
 * reports if the node is ever evaluated). Errors: ZI_EFORMAT for syntax,
 * ZI_EUNSUPPORTED for tags zinfer does not implement, ZI_ENOMEM; messages
 * start with "line L col C:".
 */
int ct_parse(ct_arena *a, const char *src, size_t len, int (*resolve_filter)(const char *, size_t),
             int (*resolve_test)(const char *, size_t), ct_nodes *out, const char **norm,
             size_t *norm_len, zi_error *err);

/* 1-based line and column (in characters) of byte offset `off` of the
 * normalised source. */
void ct_location(const char *src, size_t len, size_t off, unsigned *line, unsigned *col);

/* Records "<prefix>line L col C: <message>" in err and returns code: L and C
 * locate byte `off` of src[0..len) (ct_location), the message is fmt's. The
 * one place the engine's located errors are worded: the lexer and the
 * parser pass prefix "" (zi_chat_template_compile adds "chat template "),
 * the evaluator "chat template " (ct_fail). */
int ct_error_at(zi_error *err, int code, const char *src, size_t len, size_t off,
                const char *prefix, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

/* Python's str.isspace for one codepoint (what jinja2's \s and strip use). */
int ct_is_space(uint32_t cp);
/* Length of the whitespace suffix of s[0..n) in bytes (Python rstrip). */
size_t ct_space_suffix(const char *s, size_t n);

#endif
