/*
 * chat_template_parse.c - the parser of the chat-template engine (see
 * chat_template_parse.h): tokens from chat_template_lex.c become the
 * syntax tree the evaluator in chat_template.c walks.
 *
 * Statements are parsed by recursive descent, expressions by precedence
 * climbing over jinja2's levels (loosest first): conditional expression,
 * or, and, not, comparisons (in, not in), + -, ~, * / // %, **, unary - +,
 * then primaries with postfix . [] () | and "is" (see bin_ops).
 */
#include "chat_template_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_lex.h"

/* ---- parser ------------------------------------------------------------ */

typedef struct parser {
    ct_token *t;
    size_t i;
    ct_arena *a;
    zi_error *err;
    const char *src;
    size_t n;
    int depth;      /* recursion depth of the parser itself */
    int loop_depth; /* enclosing for loops, for break/continue */
    /* jinja2's "soft frame": inside an if statement or a conditional
     * expression (but not in a for, macro, filter or set block nested in
     * one), an unknown filter or test fails only if it is reached. */
    int soft;
    /* the FILTER and TEST nodes of unknown names outside a soft frame: the
     * first one refuses the template once it has parsed, as jinja2's
     * compiler does after its parser */
    struct nvec *unknown;
    int (*resolve_filter)(const char *, size_t);
    int (*resolve_test)(const char *, size_t);
} parser;

/* Records a syntax error at source offset `off` ("line L col C: ..."). */
#define perr(p, code, off, ...) ct_error_at((p)->err, code, (p)->src, (p)->n, off, "", __VA_ARGS__)

static ct_token *cur(parser *p) {
    return &p->t[p->i];
}
static ct_token *look(parser *p) {
    return p->t[p->i].type == TK_EOF ? &p->t[p->i] : &p->t[p->i + 1];
}
static void adv(parser *p) {
    if (p->t[p->i].type != TK_EOF) p->i++;
}

static int tok_is_name(const ct_token *t, const char *name) {
    return t->type == TK_NAME && t->len == strlen(name) && memcmp(t->s, name, t->len) == 0;
}

static int unexpected(parser *p, const char *expected) {
    char got[64];
    ct_token_describe(cur(p), got, sizeof got);
    if (expected) return perr(p, ZI_EFORMAT, cur(p)->off, "expected %s, got %s", expected, got);
    return perr(p, ZI_EFORMAT, cur(p)->off, "unexpected %s", got);
}

static int expect(parser *p, int type) {
    if (cur(p)->type == type) {
        adv(p);
        return ZI_OK;
    }
    ct_token want = {0};
    want.type = (uint8_t)type;
    char w[64];
    ct_token_describe(&want, w, sizeof w);
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
    ct_token *t = cur(p);
    adv(p);
    if (t->type == TK_DOT) {
        ct_token *at = cur(p);
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
        if (f->i < 0 && !p->soft) TRY(nvec_push(p, p->unknown, f));
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
    if (t->i < 0 && !p->soft) TRY(nvec_push(p, p->unknown, t));
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
    ct_token *t = cur(p);
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
    ct_token *t = cur(p);
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

/* ---- binary operators ---------------------------------------------------- */

/* jinja2's binary precedence levels, loosest first. Each level's operands
 * are parsed at the next level (those of the last one are unary
 * expressions with their filters), and every level is left-associative. */
enum { L_OR, L_AND, L_NOT, L_COMPARE, L_ADD, L_CONCAT, L_MUL, L_POW, L_UNARY };

/* What a level builds from its operands. */
enum {
    SHAPE_PAIR,    /* a node of the operator's kind per operator: a = left, b = right */
    SHAPE_CONCAT,  /* one CT_N_CONCAT node for the whole run: l1 = every operand */
    SHAPE_COMPARE, /* one CT_N_COMPARE node: a = first operand, l1 = CT_N_OPERANDs */
    SHAPE_NOT,     /* prefix `not`, which may repeat: CT_N_NOT, a = operand */
};

static const uint8_t level_shape[] = {
    [L_OR] = SHAPE_PAIR,         [L_AND] = SHAPE_PAIR, [L_NOT] = SHAPE_NOT,
    [L_COMPARE] = SHAPE_COMPARE, [L_ADD] = SHAPE_PAIR, [L_CONCAT] = SHAPE_CONCAT,
    [L_MUL] = SHAPE_PAIR,        [L_POW] = SHAPE_PAIR,
};

/* The binary operators: token type, for names the word(s) ("not in" is two
 * NAME tokens), and the node kind and CT_OP_* / CT_CMP_* they make. */
typedef struct bin_op {
    uint8_t level;
    uint8_t tok;
    const char *name, *name2;
    uint8_t kind, op;
} bin_op;

static const bin_op bin_ops[] = {
    {L_OR, TK_NAME, "or", NULL, CT_N_OR, 0},
    {L_AND, TK_NAME, "and", NULL, CT_N_AND, 0},
    {L_COMPARE, TK_EQ, NULL, NULL, CT_N_OPERAND, CT_CMP_EQ},
    {L_COMPARE, TK_NE, NULL, NULL, CT_N_OPERAND, CT_CMP_NE},
    {L_COMPARE, TK_LT, NULL, NULL, CT_N_OPERAND, CT_CMP_LT},
    {L_COMPARE, TK_LTEQ, NULL, NULL, CT_N_OPERAND, CT_CMP_LE},
    {L_COMPARE, TK_GT, NULL, NULL, CT_N_OPERAND, CT_CMP_GT},
    {L_COMPARE, TK_GTEQ, NULL, NULL, CT_N_OPERAND, CT_CMP_GE},
    {L_COMPARE, TK_NAME, "in", NULL, CT_N_OPERAND, CT_CMP_IN},
    {L_COMPARE, TK_NAME, "not", "in", CT_N_OPERAND, CT_CMP_NOTIN},
    {L_ADD, TK_ADD, NULL, NULL, CT_N_BINOP, CT_OP_ADD},
    {L_ADD, TK_SUB, NULL, NULL, CT_N_BINOP, CT_OP_SUB},
    {L_CONCAT, TK_TILDE, NULL, NULL, CT_N_CONCAT, 0},
    {L_MUL, TK_MUL, NULL, NULL, CT_N_BINOP, CT_OP_MUL},
    {L_MUL, TK_DIV, NULL, NULL, CT_N_BINOP, CT_OP_DIV},
    {L_MUL, TK_FLOORDIV, NULL, NULL, CT_N_BINOP, CT_OP_FLOORDIV},
    {L_MUL, TK_MOD, NULL, NULL, CT_N_BINOP, CT_OP_MOD},
    {L_POW, TK_POW, NULL, NULL, CT_N_BINOP, CT_OP_POW},
};

/* The operator of `level` at the current token, or NULL. */
static const bin_op *match_op(parser *p, int level) {
    for (size_t k = 0; k < sizeof bin_ops / sizeof bin_ops[0]; k++) {
        const bin_op *o = &bin_ops[k];
        if (o->level != level || cur(p)->type != o->tok) continue;
        if (o->name && !tok_is_name(cur(p), o->name)) continue;
        if (o->name2 && !tok_is_name(look(p), o->name2)) continue;
        return o;
    }
    return NULL;
}

/* An expression at precedence `level` and tighter (L_OR: a whole
 * expression without the conditional). */
static int parse_binary(parser *p, int level, ct_node **out) {
    if (level == L_UNARY) return parse_unary(p, 1, out);
    int shape = level_shape[level];
    if (shape == SHAPE_NOT) {
        if (!tok_is_name(cur(p), "not")) return parse_binary(p, level + 1, out);
        TRY(enter(p));
        ct_node *n;
        MK(n, p, CT_N_NOT, cur(p)->off);
        adv(p);
        TRY(parse_binary(p, level, &n->a));
        p->depth--;
        *out = n;
        return ZI_OK;
    }
    size_t off = cur(p)->off;
    ct_node *left;
    TRY(parse_binary(p, level + 1, &left));
    nvec run = {0}; /* CONCAT: the operands; COMPARE: the OPERAND nodes */
    const bin_op *o;
    while ((o = match_op(p, level))) {
        size_t op_off = cur(p)->off;
        adv(p);
        if (o->name2) adv(p);
        ct_node *n;
        if (shape == SHAPE_CONCAT) {
            if (!run.l.n) TRY(nvec_push(p, &run, left));
            TRY(parse_binary(p, level + 1, &n));
            TRY(nvec_push(p, &run, n));
            continue;
        }
        MK(n, p, o->kind, op_off);
        n->op = o->op;
        if (shape == SHAPE_COMPARE) {
            TRY(parse_binary(p, level + 1, &n->a));
            TRY(nvec_push(p, &run, n));
        } else {
            n->a = left;
            TRY(parse_binary(p, level + 1, &n->b));
            left = n;
        }
    }
    if (run.l.n) {
        ct_node *n;
        MK(n, p, shape == SHAPE_CONCAT ? CT_N_CONCAT : CT_N_COMPARE, off);
        if (shape == SHAPE_COMPARE) n->a = left;
        n->l1 = run.l;
        left = n;
    }
    *out = left;
    return ZI_OK;
}

static int parse_condexpr(parser *p, ct_node **out) {
    TRY(enter(p));
    ct_node *expr1;
    size_t n_unknown = p->unknown->l.n;
    int soft = p->soft;
    TRY(parse_binary(p, L_OR, &expr1));
    while (tok_is_name(cur(p), "if")) {
        /* all of a conditional expression is a soft frame, the value
         * before its `if` included */
        p->unknown->l.n = n_unknown;
        p->soft = 1;
        ct_node *c;
        MK(c, p, CT_N_COND, cur(p)->off);
        adv(p);
        c->b = expr1;
        TRY(parse_binary(p, L_OR, &c->a));
        if (tok_is_name(cur(p), "else")) {
            adv(p);
            TRY(parse_condexpr(p, &c->c));
        }
        expr1 = c;
    }
    p->soft = soft;
    p->depth--;
    *out = expr1;
    return ZI_OK;
}

static int parse_expression(parser *p, int with_condexpr, ct_node **out) {
    if (with_condexpr) return parse_condexpr(p, out);
    TRY(enter(p));
    TRY(parse_binary(p, L_OR, out));
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
    int soft = p->soft;
    p->soft = 0; /* the loop's filter and bodies are an inner frame */
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
    p->soft = soft;
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
    int soft = p->soft;
    p->soft = 1;
    for (;;) {
        TRY(parse_tuple(p, 0, 0, NULL, 0, 0, &node->a));
        TRY(parse_statements(p, &o, body_end, 0, &node->l1));
        ct_token *t = cur(p);
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
    p->soft = soft;
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
        int soft = p->soft;
        p->soft = 0;
        TRY(parse_filter(p, NULL, 0, &s->b));
        TRY(parse_statements(p, &o, ends, 1, &s->l1));
        p->soft = soft;
    }
    *out = s;
    return ZI_OK;
}

static int parse_macro_inner(parser *p, ct_node **out);

/* A macro's defaults and body are an inner frame: never soft. */
static int parse_macro(parser *p, ct_node **out) {
    int soft = p->soft;
    p->soft = 0;
    TRY(parse_macro_inner(p, out));
    p->soft = soft;
    return ZI_OK;
}

static int parse_macro_inner(parser *p, ct_node **out) {
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
    ct_token *t = cur(p);
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
        int soft = p->soft;
        p->soft = 0;
        TRY(parse_filter(p, NULL, 1, &n->b));
        TRY(parse_statements(p, &o, ends, 1, &n->l1));
        p->soft = soft;
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
        ct_token *t = cur(p);
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

int ct_parse(ct_arena *a, const char *src, size_t len, int (*resolve_filter)(const char *, size_t),
             int (*resolve_test)(const char *, size_t), ct_nodes *out, const char **norm,
             size_t *norm_len, zi_error *err) {
    size_t n;
    char *s = ct_normalise(a, src, len, &n);
    if (!s) return zi_error_set(err, ZI_ENOMEM, "out of memory reading template");
    ct_token *toks = NULL;
    int rc = ct_lex(a, s, n, err, &toks);
    if (rc == ZI_OK) {
        nvec unknown = {{NULL, 0}, 0};
        parser p = {.t = toks,
                    .a = a,
                    .err = err,
                    .src = s,
                    .n = n,
                    .resolve_filter = resolve_filter,
                    .resolve_test = resolve_test,
                    .unknown = &unknown};
        rc = subparse(&p, NULL, out);
        if (rc == ZI_OK && cur(&p)->type != TK_EOF) rc = unexpected(&p, NULL);
        /* Refused at load, as jinja2 refuses them when it compiles: an
         * unknown filter or test outside an if statement or conditional
         * expression. */
        if (rc == ZI_OK && unknown.l.n) {
            const ct_node *u = unknown.l.v[0];
            rc = perr(&p, ZI_EUNSUPPORTED, u->off, "%s '%.*s' is not supported",
                      u->kind == CT_N_FILTER ? "filter" : "test",
                      (int)(u->slen > 60 ? 60 : u->slen), u->s);
        }
    }
    free(toks);
    *norm = s;
    *norm_len = n;
    return rc;
}
