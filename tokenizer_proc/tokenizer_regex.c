/*
 * tokenizer_regex.c - the pre-tokenizers that llama.cpp defines as a list
 * of regexes (falcon, its default set, deepseek-llm, deepseek-coder), run
 * with PCRE2.
 *
 * llama.cpp applies the list in order: each regex splits every piece the
 * previous ones left, and the text between two matches stays a piece of its
 * own. It runs regexes other than its hand-written ones with std::regex on
 * a rewritten text, and the ids depend on that rewriting, so it is
 * reproduced here exactly:
 *  - A regex that names a Unicode category (\p{L}, \p{N}, \p{P}, \p{M},
 *    \p{S}) sees the "collapsed" text: ASCII codepoints as they are, any
 *    other codepoint as one code unit standing for its category (0xD1 N,
 *    0xD2 L, 0xD3 P, 0xD4 M, 0xD5 S, 0xD0 anything else), and \p{X}
 *    becomes a class of that unit plus the ASCII members of X. So the
 *    categories are llama.cpp's (unicode_data.c), never PCRE2's.
 *  - Any other regex sees the codepoints themselves.
 *  - In both, a non-ASCII White_Space codepoint is seen as U+000B, which is
 *    all that \s matches beyond ASCII (so U+3000 no longer matches a class
 *    that lists it, exactly as in llama.cpp).
 * Both texts are arrays of 32-bit code units, one per codepoint, matched by
 * PCRE2's 32-bit library without UTF or UCP: a unit is just a number, as a
 * char or wchar_t is to std::regex. The regexes are simple enough that
 * PCRE2's ECMAScript-like leftmost-alternative backtracking gives the same
 * matches.
 *
 * Two stages are not PCRE2: the GPT-2 pattern, which llama.cpp also runs by
 * hand (tok_gpt2_next), and deepseek-llm's \s+$, whose backtracking would
 * be quadratic in a long whitespace run; it only ever matches the trailing
 * whitespace of a piece, which a backward scan finds in linear time.
 */
#define PCRE2_CODE_UNIT_WIDTH 32
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

enum { STAGE_PCRE, STAGE_GPT2, STAGE_TRAILING_WS };

/* A stage of a list: a regex, or one of the hand-run ones. */
typedef struct {
    int kind;
    const char *pattern; /* llama.cpp's regex, non-ASCII written \x{...} */
} stage_def;

#define MAX_STAGES 6
#define GPT2                                                                                       \
    { STAGE_GPT2, NULL }
#define TRAILING_WS                                                                                \
    { STAGE_TRAILING_WS, "\\s+$" }

/* The lists, from llama.cpp's llama-vocab.cpp. */
static const struct {
    tok_pretok_kind kind;
    stage_def stages[MAX_STAGES];
} k_lists[] = {
    {TOK_PRETOK_FALCON,
     {{STAGE_PCRE, "[\\p{P}\\$\\+<=>\\^~\\|`]+"}, GPT2, {STAGE_PCRE, "[0-9][0-9][0-9]"}}},
    {TOK_PRETOK_DEFAULT,
     {{STAGE_PCRE, "[\\p{P}\\$\\+<=>\\^~\\|]+"},
      GPT2,
      {STAGE_PCRE, "\\p{N}+"},
      {STAGE_PCRE, "[0-9][0-9][0-9]"}}},
    {TOK_PRETOK_DEEPSEEK_LLM,
     {{STAGE_PCRE, "[\\r\\n]"},
      {STAGE_PCRE,
       "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
       "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
       "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}"
       "\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}"
       "\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
       "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}"
       "\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}"
       "\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}"
       "\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"
       "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
       "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
       "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}"
       "\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}"
       "\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"
       "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"
       "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}"
       "\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}"
       "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"},
      {STAGE_PCRE, "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}"
                   "\\x{3000}-\\x{3002}]+"},
      TRAILING_WS,
      {STAGE_PCRE, "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"},
      {STAGE_PCRE, "\\p{N}+"}}},
    {TOK_PRETOK_DEEPSEEK_CODER,
     {{STAGE_PCRE, "[\\r\\n]"},
      {STAGE_PCRE, "\\s?\\p{L}+"},
      {STAGE_PCRE, "\\s?\\p{P}+"},
      {STAGE_PCRE, "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"},
      {STAGE_PCRE, "\\p{N}"}}},
};

/* The collapsed unit of each category, and the category's ASCII members as
 * a class body (what llama.cpp substitutes for \p{X}). */
static const struct {
    const char *name; /* the X of \p{X} */
    uint32_t unit;
    const char *ascii;
} k_cats[] = {
    {"N", 0xD1, "0-9"},
    {"L", 0xD2, "A-Za-z"},
    {"P", 0xD3, "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"},
    {"M", 0xD4, ""},
    {"S", 0xD5, "\\$\\+<->\\^`\\|~"},
    /* llama.cpp reads the letter subcategories as \p{L} */
    {"Lu", 0xD2, "A-Za-z"},
    {"Ll", 0xD2, "A-Za-z"},
    {"Lt", 0xD2, "A-Za-z"},
    {"Lm", 0xD2, "A-Za-z"},
    {"Lo", 0xD2, "A-Za-z"},
};

/* A compiled stage. */
typedef struct {
    int kind;
    int collapsed; /* sees the collapsed text */
    int jit;       /* JIT-compiled: matched by pcre2_jit_match (fewer checks) */
    pcre2_code *code;
} stage;

struct tok_regex {
    stage st[MAX_STAGES];
    int n;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    /* Scratch, per encoded fragment: the two texts, each codepoint's byte
     * offset (n_cp + 1 entries), and the piece ends before and after a
     * stage (codepoint indices). */
    uint32_t *wide, *coll;
    size_t *boff;
    size_t cp_cap;
    size_t *cur, *nxt;
    size_t n_cur, n_nxt, ends_cap;
};

/* Generous: the lists match in linear time; this only stops a runaway. */
#define MATCH_LIMIT 10000000u

/* Rewrites pattern for the collapsed text (\p{X} -> class of its unit plus
 * its ASCII members, inside or outside brackets) into out (units). Returns
 * the unit count. out must hold 4 * strlen(pattern) + 64 units. */
static size_t collapse_pattern(const char *p, uint32_t *out) {
    size_t n = 0;
    int inside = 0;
    for (size_t i = 0; p[i]; i++) {
        if (p[i] == '\\' && p[i + 1] == 'p' && p[i + 2] == '{') {
            const char *close = strchr(p + i + 3, '}');
            size_t k = 0, nl = close ? (size_t)(close - (p + i + 3)) : 0;
            for (; close && k < sizeof k_cats / sizeof *k_cats; k++) {
                if (strlen(k_cats[k].name) == nl && !memcmp(k_cats[k].name, p + i + 3, nl)) break;
            }
            if (close && k < sizeof k_cats / sizeof *k_cats) {
                if (!inside) out[n++] = '[';
                out[n++] = k_cats[k].unit;
                for (const char *a = k_cats[k].ascii; *a; a++) out[n++] = (unsigned char)*a;
                if (!inside) out[n++] = ']';
                i = (size_t)(close - p);
                continue;
            }
        }
        if (p[i] == '\\' && p[i + 1]) { /* an escape passes whole */
            out[n++] = '\\';
            out[n++] = (unsigned char)p[++i];
            continue;
        }
        if (p[i] == '[') inside = 1;
        if (p[i] == ']' && inside) inside = 0;
        out[n++] = (unsigned char)p[i];
    }
    return n;
}

int tok_regex_new(tok_pretok_kind kind, struct tok_regex **out, zi_error *err) {
    *out = NULL;
    size_t li = 0;
    while (li < sizeof k_lists / sizeof *k_lists && k_lists[li].kind != kind) li++;
    if (li == sizeof k_lists / sizeof *k_lists)
        return zi_error_set(err, ZI_EUNSUPPORTED, "pre-tokenizer %d has no regex list", (int)kind);
    struct tok_regex *r = calloc(1, sizeof *r);
    if (!r) return zi_error_set(err, ZI_ENOMEM, "out of memory for the pre-tokenizer");
    int rc = ZI_OK;
    for (int s = 0; s < MAX_STAGES; s++) {
        const stage_def *d = &k_lists[li].stages[s];
        if (d->kind == STAGE_PCRE && !d->pattern) break; /* end of the list */
        stage *st = &r->st[r->n++];
        st->kind = d->kind;
        if (d->kind != STAGE_PCRE) continue;
        st->collapsed = strstr(d->pattern, "\\p{") != NULL;
        size_t cap = 4 * strlen(d->pattern) + 64;
        uint32_t *pat = malloc(cap * sizeof *pat);
        if (!pat) {
            rc = zi_error_set(err, ZI_ENOMEM, "out of memory for the pre-tokenizer");
            goto fail;
        }
        size_t np = collapse_pattern(d->pattern, pat);
        int ec;
        PCRE2_SIZE eo;
        st->code = pcre2_compile(pat, np, PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
        free(pat);
        if (!st->code) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(ec, msg, sizeof msg / sizeof *msg);
            char m8[128];
            size_t k = 0;
            for (; k + 1 < sizeof m8 && msg[k]; k++) m8[k] = msg[k] < 128 ? (char)msg[k] : '?';
            m8[k] = 0;
            rc = zi_error_set(err, ZI_EUNSUPPORTED, "PCRE2 refused the pre-tokenizer regex %s: %s",
                              d->pattern, m8);
            goto fail;
        }
        /* JIT where the platform has it; the interpreter gives the same
         * matches, slower. */
        st->jit = pcre2_jit_compile(st->code, PCRE2_JIT_COMPLETE) == 0;
    }
    r->md = pcre2_match_data_create(1, NULL);
    r->mctx = pcre2_match_context_create(NULL);
    if (!r->md || !r->mctx) {
        rc = zi_error_set(err, ZI_ENOMEM, "out of memory for the pre-tokenizer");
        goto fail;
    }
    pcre2_set_match_limit(r->mctx, MATCH_LIMIT);
    *out = r;
    return ZI_OK;
fail:
    tok_regex_free(r);
    return rc;
}

void tok_regex_free(struct tok_regex *r) {
    if (!r) return;
    for (int s = 0; s < r->n; s++) pcre2_code_free(r->st[s].code);
    pcre2_match_data_free(r->md);
    pcre2_match_context_free(r->mctx);
    free(r->wide);
    free(r->coll);
    free(r->boff);
    free(r->cur);
    free(r->nxt);
    free(r);
}

/* ------------------------------------------------------------------------ */
/* splitting */

static int reserve_cps(struct tok_regex *r, size_t n) {
    if (n <= r->cp_cap) return ZI_OK;
    size_t cap = r->cp_cap ? r->cp_cap : 1024;
    while (cap < n) cap *= 2;
    uint32_t *w = realloc(r->wide, cap * sizeof *w);
    if (!w) return ZI_ENOMEM;
    r->wide = w;
    uint32_t *c = realloc(r->coll, cap * sizeof *c);
    if (!c) return ZI_ENOMEM;
    r->coll = c;
    size_t *b = realloc(r->boff, (cap + 1) * sizeof *b);
    if (!b) return ZI_ENOMEM;
    r->boff = b;
    r->cp_cap = cap;
    return ZI_OK;
}

/* Appends the piece end e to the next stage's list. */
static inline int push_end(struct tok_regex *r, size_t e) {
    if (r->n_nxt == r->ends_cap) {
        size_t cap = r->ends_cap ? 2 * r->ends_cap : 256;
        size_t *a = realloc(r->cur, cap * sizeof *a);
        if (!a) return ZI_ENOMEM;
        r->cur = a;
        size_t *b = realloc(r->nxt, cap * sizeof *b);
        if (!b) return ZI_ENOMEM;
        r->nxt = b;
        r->ends_cap = cap;
    }
    r->nxt[r->n_nxt++] = e;
    return ZI_OK;
}

/* Collapsed unit of a non-ASCII codepoint's flags. */
static inline uint32_t collapsed_unit(uint16_t f) {
    if (f & ZI_UC_WHITESPACE) return 0x0B;
    switch (f & ZI_UC_CATEGORIES) {
    case ZI_UC_NUMBER:
        return 0xD1;
    case ZI_UC_LETTER:
        return 0xD2;
    case ZI_UC_PUNCT:
        return 0xD3;
    case ZI_UC_MARK:
        return 0xD4;
    case ZI_UC_SYMBOL:
        return 0xD5;
    default:
        return 0xD0;
    }
}

/* \s as std::regex sees it in the rewritten text (ASCII only). */
static inline int ascii_space(uint32_t u) {
    return u == ' ' || (u >= '\t' && u <= '\r');
}

/* Splits the piece [a, b) (codepoints) with one PCRE2 stage. */
static int split_pcre(struct tok_regex *r, const stage *st, size_t a, size_t b) {
    const uint32_t *subj = (st->collapsed ? r->coll : r->wide) + a;
    size_t len = b - a, start = 0, prev = 0;
    int rc;
    while (start < len) {
        int m = st->jit ? pcre2_jit_match(st->code, subj, len, start, 0, r->md, r->mctx)
                        : pcre2_match(st->code, subj, len, start, 0, r->md, r->mctx);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) return m == PCRE2_ERROR_NOMEMORY ? ZI_ENOMEM : ZI_ERANGE;
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(r->md);
        if (ov[0] > prev && (rc = push_end(r, a + ov[0]))) return rc;
        if (ov[1] > ov[0] && (rc = push_end(r, a + ov[1]))) return rc;
        prev = ov[1];
        start = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
    }
    if (prev < len) return push_end(r, b);
    return ZI_OK;
}

/* Splits [a, b) with the GPT-2 pattern run on its bytes. */
static int split_gpt2(struct tok_regex *r, const unsigned char *s, size_t a, size_t b) {
    const unsigned char *p = s + r->boff[a];
    size_t n = r->boff[b] - r->boff[a], pos = 0, cp = a;
    while (pos < n) {
        pos = tok_gpt2_next(p, n, pos, 0);
        while (r->boff[cp] - r->boff[a] < pos) cp++;
        int rc = push_end(r, cp);
        if (rc) return rc;
    }
    return ZI_OK;
}

/* \s+$: the trailing whitespace of [a, b) becomes a piece. */
static int split_trailing_ws(struct tok_regex *r, size_t a, size_t b) {
    size_t k = b;
    while (k > a && ascii_space(r->wide[k - 1])) k--;
    int rc;
    if (k > a && (rc = push_end(r, k))) return rc;
    return push_end(r, b);
}

int tok_regex_encode(zi_tokenizer *t, const unsigned char *s, size_t n, tok_idvec *out) {
    struct tok_regex *r = t->regex;
    int rc;
    if (n == 0) return ZI_OK;
    if ((rc = reserve_cps(r, n))) return rc;
    size_t ncp = 0;
    for (size_t pos = 0; pos < n;) {
        uint32_t cp;
        size_t l;
        uint16_t f;
        if (s[pos] < 0x80) {
            cp = s[pos];
            l = 1;
            r->wide[ncp] = r->coll[ncp] = cp;
        } else {
            l = zi_utf8_decode(s + pos, n - pos, &cp);
            f = zi_unicode_flags(cp);
            r->wide[ncp] = (f & ZI_UC_WHITESPACE) ? 0x0B : cp;
            r->coll[ncp] = collapsed_unit(f);
        }
        r->boff[ncp++] = pos;
        pos += l;
    }
    r->boff[ncp] = n;

    r->n_nxt = 0;
    if ((rc = push_end(r, ncp))) return rc;
    for (int si = 0; si < r->n; si++) {
        size_t *tmp = r->cur;
        r->cur = r->nxt;
        r->nxt = tmp;
        r->n_cur = r->n_nxt;
        r->n_nxt = 0;
        size_t a = 0;
        for (size_t k = 0; k < r->n_cur; k++) {
            size_t b = r->cur[k];
            const stage *st = &r->st[si];
            if (st->kind == STAGE_PCRE)
                rc = split_pcre(r, st, a, b);
            else if (st->kind == STAGE_GPT2)
                rc = split_gpt2(r, s, a, b);
            else
                rc = split_trailing_ws(r, a, b);
            if (rc) return rc;
            a = b;
        }
    }
    size_t a = 0;
    for (size_t k = 0; k < r->n_nxt; k++) {
        size_t b = r->nxt[k];
        rc = tok_pretok_piece(t, s + r->boff[a], r->boff[b] - r->boff[a], out);
        if (rc) return rc;
        a = b;
    }
    return ZI_OK;
}
