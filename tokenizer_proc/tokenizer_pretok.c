/*
 * tokenizer_pretok.c - the pre-tokenizers: which tokenizer.ggml.pre names
 * zinfer implements, the hand-written scanners that split clean text into
 * pieces, and the loop that encodes the pieces one by one (BPE in
 * tokenizer_bpe.c) through a direct-mapped cache of the results for short
 * pieces. The loop and the cache live beside the scanners so that the
 * compiler can inline the whole per-piece path.
 *
 * Three scanners, no regex engine. llama.cpp itself has hand-written
 * splitters for the first two patterns, and these are several times faster
 * than PCRE2's JIT on them; the third, which llama.cpp runs with std::regex,
 * would need PCRE2 stack in proportion to a word's length:
 *  - GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
 *    \s+(?!\S)|\s+, optionally preceded by a split that isolates every
 *    \p{N} codepoint (the "smollm"/"starcoder" family); each span between
 *    two numbers is then scanned on its own, as llama.cpp does.
 *  - Llama 3: (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|
 *    [^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *    \s*[\r\n]+|\s+(?!\S)|\s+, and its Qwen variants (\p{N} alone; Qwen
 *    3.5 also lets \p{M} join letter runs and leave punctuation runs).
 *  - GPT-4o (o200k, also gpt-oss's): Llama 3's with case-aware letter
 *    runs and [\r\n/]* after punctuation; see the comment above
 *    gpt4o_case for the pattern and what llama.cpp's way of running it
 *    makes of it.
 * The other pre-tokenizers are lists of regexes run by tokenizer_regex.c.
 *
 * To add a pre-tokenizer: a tok_pretok_kind (tokenizer_impl.h), its
 * scanning in tok_pretok_encode() or its regexes in tokenizer_regex.c, and
 * its names in k_pretoks.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "keypath.h" /* zi_printable */
#include "tokenizer_impl.h"
#include "unicode.h"

/* The tokenizer.ggml.pre names each pre-tokenizer answers to, as llama.cpp
 * defines them (llama-vocab.cpp), with its ignore_merges for the name. Only
 * names whose llama.cpp behaviour differs from the kind's in nothing but
 * the regexes are listed (no BOS/SEP or escaping quirks). */
static const struct {
    const char *name;
    tok_pretok_kind kind;
    int ignore_merges;
} k_pretoks[] = {
    {"gpt-2", TOK_PRETOK_GPT2, 0},
    {"gpt2", TOK_PRETOK_GPT2, 0},
    {"phi-2", TOK_PRETOK_GPT2, 0},
    {"jina-es", TOK_PRETOK_GPT2, 0},
    {"jina-de", TOK_PRETOK_GPT2, 0},
    {"jina-v2-es", TOK_PRETOK_GPT2, 0},
    {"jina-v2-de", TOK_PRETOK_GPT2, 0},
    {"gigachat", TOK_PRETOK_GPT2, 0},
    {"a.x-4.0", TOK_PRETOK_GPT2, 0},
    {"mellum", TOK_PRETOK_GPT2, 0},
    {"modern-bert", TOK_PRETOK_GPT2, 0},
    {"mpt", TOK_PRETOK_GPT2, 0},
    {"olmo", TOK_PRETOK_GPT2, 0},
    {"jais", TOK_PRETOK_GPT2, 0},
    {"trillion", TOK_PRETOK_GPT2, 0},
    {"granite-docling", TOK_PRETOK_GPT2, 0},
    {"exaone4", TOK_PRETOK_GPT2, 0},
    {"smollm", TOK_PRETOK_DIGITS_GPT2, 0},
    {"starcoder", TOK_PRETOK_DIGITS_GPT2, 0},
    {"refact", TOK_PRETOK_DIGITS_GPT2, 0},
    {"command-r", TOK_PRETOK_DIGITS_GPT2, 0},
    {"codeshell", TOK_PRETOK_DIGITS_GPT2, 0},
    {"exaone", TOK_PRETOK_DIGITS_GPT2, 0},
    {"minerva-7b", TOK_PRETOK_DIGITS_GPT2, 0},
    {"mellum2", TOK_PRETOK_DIGITS_GPT2, 0},
    {"llama3", TOK_PRETOK_LLAMA3, 1},
    {"llama-v3", TOK_PRETOK_LLAMA3, 1},
    {"llama-bpe", TOK_PRETOK_LLAMA3, 1},
    {"falcon3", TOK_PRETOK_LLAMA3, 1},
    {"falcon-h1", TOK_PRETOK_LLAMA3, 1},
    {"pixtral", TOK_PRETOK_LLAMA3, 1},
    {"midm-2.0", TOK_PRETOK_LLAMA3, 1},
    {"lfm2", TOK_PRETOK_LLAMA3, 1},
    {"jina-v5-nano", TOK_PRETOK_LLAMA3, 1},
    {"dbrx", TOK_PRETOK_LLAMA3, 0},
    {"smaug-bpe", TOK_PRETOK_LLAMA3, 0},
    {"qwen2", TOK_PRETOK_QWEN2, 0},
    {"deepseek-r1-qwen", TOK_PRETOK_QWEN2, 0},
    {"kormo", TOK_PRETOK_QWEN2, 0},
    {"f2llmv2", TOK_PRETOK_QWEN2, 0},
    {"megrez", TOK_PRETOK_QWEN2, 0},
    {"stablelm2", TOK_PRETOK_QWEN2, 0},
    {"hunyuan", TOK_PRETOK_QWEN2, 0},
    {"solar-open", TOK_PRETOK_QWEN2, 0},
    {"qwen35", TOK_PRETOK_QWEN35, 0},
    {"gpt-4o", TOK_PRETOK_GPT4O, 0}, /* gpt-oss files carry this name too */
    {"llama4", TOK_PRETOK_GPT4O, 0},
    {"kanana2", TOK_PRETOK_GPT4O, 0},
    {"talkie", TOK_PRETOK_GPT4O, 0},
    {"minimax-m2", TOK_PRETOK_GPT4O, 0}, /* its own type there, the same regex */
    {"falcon", TOK_PRETOK_FALCON, 0},
    {"", TOK_PRETOK_DEFAULT, 0}, /* no tokenizer.ggml.pre: llama.cpp's default */
    {"default", TOK_PRETOK_DEFAULT, 0},
    {"deepseek-llm", TOK_PRETOK_DEEPSEEK_LLM, 0},
    {"deepseek-coder", TOK_PRETOK_DEEPSEEK_CODER, 0},
};

static int pretok_index(zi_str name) {
    for (size_t i = 0; i < sizeof k_pretoks / sizeof *k_pretoks; i++) {
        if (zi_str_eq(name, k_pretoks[i].name)) return (int)i;
    }
    return -1;
}

int tok_pretok_lookup(zi_str name) {
    int i = pretok_index(name);
    return i < 0 ? -1 : (int)k_pretoks[i].kind;
}

/* ------------------------------------------------------------------------ */
/* the GPT-2 scanner */

#define OUT_OF_RANGE UINT32_MAX

typedef struct scanner {
    const unsigned char *s;
    size_t n;
    int digits_split; /* \p{N} codepoints end the current range */
} scanner;

/* The codepoint at byte pos as the current range sees it: flags 0 and
 * *cp = OUT_OF_RANGE past the end of the text or, when digits are split
 * off, at a number (which starts a range of its own). */
static uint16_t look(const scanner *sc, size_t pos, uint32_t *cp, size_t *len) {
    if (pos >= sc->n) {
        *cp = OUT_OF_RANGE;
        *len = 0;
        return 0;
    }
    *len = zi_utf8_decode(sc->s + pos, sc->n - pos, cp);
    uint16_t f = zi_unicode_flags(*cp);
    if (sc->digits_split && (f & ZI_UC_NUMBER)) {
        *cp = OUT_OF_RANGE;
        return 0;
    }
    return f;
}

enum { RUN_LETTER, RUN_NUMBER, RUN_OTHER };

static int run_match(uint16_t f, int what) {
    switch (what) {
    case RUN_LETTER:
        return (f & ZI_UC_LETTER) != 0;
    case RUN_NUMBER:
        return (f & ZI_UC_NUMBER) != 0;
    default:
        return f != 0 && !(f & (ZI_UC_WHITESPACE | ZI_UC_LETTER | ZI_UC_NUMBER));
    }
}

/* One match of the GPT-2 pattern starting at pos (a codepoint of the current
 * range with flags f); returns where it ends. */
static size_t gpt2_match(const scanner *sc, size_t pos, uint32_t cp, size_t len, uint16_t f) {
    uint32_t c1, c2;
    size_t l1, l2;
    if (cp == '\'') {
        look(sc, pos + 1, &c1, &l1);
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return pos + 2;
        if (c1 == 'r' || c1 == 'v' || c1 == 'l') {
            look(sc, pos + 2, &c2, &l2);
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
                return pos + 3;
        }
    }
    /* " ?X+" where X is letters, numbers or "other": the optional space
     * joins a following run. */
    size_t p = pos;
    uint16_t f2 = f;
    size_t l = len;
    if (cp == ' ') {
        p = pos + 1;
        f2 = look(sc, p, &c1, &l);
    }
    int what = -1;
    if (f2 & ZI_UC_LETTER)
        what = RUN_LETTER;
    else if (f2 & ZI_UC_NUMBER)
        what = RUN_NUMBER;
    else if (run_match(f2, RUN_OTHER))
        what = RUN_OTHER;
    if (what >= 0) {
        while (run_match(f2, what)) {
            p += l;
            f2 = look(sc, p, &c1, &l);
        }
        return p;
    }
    /* \s+(?!\S) then \s+: a whitespace run followed by more text leaves its
     * last whitespace character for the next piece. */
    size_t q = pos, last = pos, nws = 0;
    for (;;) {
        uint16_t fw = look(sc, q, &c1, &l);
        if (!(fw & ZI_UC_WHITESPACE)) break;
        last = q;
        q += l;
        nws++;
    }
    if (nws > 1) {
        look(sc, q, &c1, &l);
        if (c1 != OUT_OF_RANGE) return last;
    }
    if (nws > 0) return q;
    return pos + len;
}

size_t tok_gpt2_next(const unsigned char *s, size_t n, size_t pos, int digits_split) {
    scanner sc = {s, n, digits_split};
    uint32_t cp;
    size_t len = zi_utf8_decode(s + pos, n - pos, &cp);
    uint16_t f = zi_unicode_flags(cp);
    if (digits_split && (f & ZI_UC_NUMBER)) return pos + len;
    return gpt2_match(&sc, pos, cp, len, f);
}

/* ------------------------------------------------------------------------ */
/* the Llama 3 / Qwen 2 / Qwen 3.5 scanner */

/* Flags of the codepoint at byte pos (0 past the end) and its length. */
static inline uint16_t flags_at(const unsigned char *s, size_t n, size_t pos, uint32_t *cp,
                                size_t *len) {
    if (pos >= n) {
        *cp = OUT_OF_RANGE;
        *len = 0;
        return 0;
    }
    if (s[pos] < 0x80) {
        *cp = s[pos];
        *len = 1;
        return zi_unicode_ascii_flags[s[pos]];
    }
    *len = zi_utf8_decode(s + pos, n - pos, cp);
    return zi_unicode_flags(*cp);
}

static inline uint32_t ascii_lower(uint32_t c) {
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* The alternatives that Llama 3's pattern and GPT-4o's share, after
 * their letter runs, at byte pos (codepoint cp of len bytes, flags f):
 * \p{N}{1,max_digits}, " ?[^\s<letter>\p{N}]+[\r\n]*" (with slash, the
 * trailing class is [\r\n/]), then \s*[\r\n]+, \s+(?!\S) and \s+.
 * Returns where the match ends. */
static inline size_t rest_match(const unsigned char *s, size_t n, size_t pos, uint32_t cp,
                                size_t len, uint16_t f, int max_digits, uint16_t letter,
                                int slash) {
    uint32_t c1;
    size_t l1;

    /* \p{N}{1,3} or \p{N} */
    if (f & ZI_UC_NUMBER) {
        size_t p = pos + len;
        for (int k = 1; k < max_digits; k++) {
            if (!(flags_at(s, n, p, &c1, &l1) & ZI_UC_NUMBER)) break;
            p += l1;
        }
        return p;
    }

    /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
    const uint16_t stop = ZI_UC_WHITESPACE | ZI_UC_NUMBER | letter;
    size_t p = pos, l = len;
    uint16_t f2 = f;
    if (cp == ' ') {
        p = pos + 1;
        f2 = flags_at(s, n, p, &c1, &l);
    }
    if (!(f2 & stop) && f) {
        while (!(f2 & stop) && f2) {
            p += l;
            f2 = flags_at(s, n, p, &c1, &l);
        }
        while (p < n && (s[p] == '\r' || s[p] == '\n' || (slash && s[p] == '/'))) p++;
        return p;
    }

    /* \s*[\r\n]+ then \s+(?!\S) then \s+ */
    size_t q = pos, last = pos, end_rn = 0, nws = 0;
    for (;;) {
        uint16_t fw = flags_at(s, n, q, &c1, &l);
        if (!(fw & ZI_UC_WHITESPACE)) break;
        last = q;
        q += l;
        if (c1 == '\r' || c1 == '\n') end_rn = q;
        nws++;
    }
    if (end_rn) return end_rn;
    if (nws > 1 && q < n) return last;
    if (nws > 0) return q;
    return pos + len;
}

/* One match of the Llama 3 pattern at byte pos; returns where it ends.
 * max_digits is 3 (Llama 3) or 1 (Qwen); marks adds \p{M} to the letter
 * runs and removes it from the punctuation runs (Qwen 3.5). The branches
 * follow the regex's alternatives in order, as llama.cpp's own splitter
 * does (its facts: the contractions compare lower-cased, and a letter run
 * may start with any one codepoint that is not \r, \n or a number). */
static size_t llama3_match(const unsigned char *s, size_t n, size_t pos, int max_digits,
                           uint16_t letter) {
    uint32_t cp, c1, c2;
    size_t len, l1, l2;
    uint16_t f = flags_at(s, n, pos, &cp, &len);

    if (cp == '\'' && pos + 1 < n) {
        flags_at(s, n, pos + 1, &c1, &l1);
        c1 = ascii_lower(c1);
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return pos + 2;
        if (pos + 2 < n && (c1 == 'r' || c1 == 'v' || c1 == 'l')) {
            flags_at(s, n, pos + 2, &c2, &l2);
            c2 = ascii_lower(c2);
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
                return pos + 3;
        }
    }

    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (!(cp == '\r' || cp == '\n' || (f & ZI_UC_NUMBER))) {
        uint16_t f1 = flags_at(s, n, pos + len, &c1, &l1);
        if ((f & letter) || (f1 & letter)) {
            size_t p = pos + len;
            while (f1 & letter) {
                p += l1;
                f1 = flags_at(s, n, p, &c1, &l1);
            }
            return p;
        }
    }
    return rest_match(s, n, pos, cp, len, f, max_digits, letter, 0);
}

/* ------------------------------------------------------------------------ */
/* the GPT-4o (o200k) scanner */

/*
 * llama.cpp's GPT-4o pattern (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GPT4O)
 * rewrites the \p{Lu}/\p{Ll} classes of o200k's tokenizer.json as
 * lookaheads:
 *   [^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]
 *   |'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?
 *   |[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:...)?
 *   |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * It has no hand-written splitter for it, so std::regex runs it on the
 * "collapsed" text (tokenizer_regex.c's file comment), where every
 * non-ASCII letter is one unit standing for \p{L}. Such a letter is both
 * "upper" ([^a-z]) and "lower" ([^A-Z]); only ASCII letters have a case.
 * That, and std::regex's backtracking, give these letter runs, reproduced
 * here without a regex (PCRE2's JIT would need stack in proportion to a
 * run's length):
 *  - U = [A-Z] or a non-ASCII letter, W = [a-z] or a non-ASCII letter.
 *    From the run's start, take the longest run of U; if the codepoint
 *    after it is in W, the W-run starts there; else it starts at the last
 *    non-ASCII letter of the U-run; else (only ASCII capitals) the match is
 *    the U-run itself (the second alternative). The W-run is then as long
 *    as it goes, and one contraction may follow.
 *  - The optional first codepoint is anything but \r, \n, a letter or a
 *    number, and it joins only when a letter follows.
 * So "HELLOworld" stays one piece, "helloWORLD" is "hello" "WORLD",
 * "camelCase" is "camel" "Case", and "\xc3\x89AB" (ÉAB) is "É" "AB",
 * where o200k itself would keep "ÉAB" whole: llama.cpp decides.
 */

/* U, W or both (a non-ASCII letter) for a codepoint with flags f. */
enum { CASE_NONE = 0, CASE_UPPER = 1, CASE_LOWER = 2, CASE_BOTH = 3 };

static inline int gpt4o_case(uint32_t cp, uint16_t f) {
    if (!(f & ZI_UC_LETTER)) return CASE_NONE;
    if (cp >= 0x80) return CASE_BOTH;
    return cp <= 'Z' ? CASE_UPPER : CASE_LOWER;
}

/* The letter alternatives from byte q, a letter; returns where they end. */
static size_t gpt4o_letters(const unsigned char *s, size_t n, size_t q) {
    uint32_t c;
    size_t l, p = q, last_both = SIZE_MAX;
    int k;
    for (;;) { /* ((?=[\p{L}])([^a-z]))* */
        uint16_t f = flags_at(s, n, p, &c, &l);
        k = gpt4o_case(c, f);
        if (!(k & CASE_UPPER)) break;
        if (k == CASE_BOTH) last_both = p;
        p += l;
    }
    size_t low = k == CASE_LOWER ? p : last_both;
    if (low != SIZE_MAX) { /* ((?=[\p{L}])([^A-Z]))+ from where it can start */
        p = low;
        for (;;) {
            uint16_t f = flags_at(s, n, p, &c, &l);
            if (!(gpt4o_case(c, f) & CASE_LOWER)) break;
            p += l;
        }
    }
    if (p + 1 < n && s[p] == '\'') {
        uint32_t c1 = ascii_lower(s[p + 1]);
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return p + 2;
        if (p + 2 < n) {
            uint32_t c2 = ascii_lower(s[p + 2]);
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
                return p + 3;
        }
    }
    return p;
}

/* One match of the GPT-4o pattern at byte pos; returns where it ends. */
static size_t gpt4o_match(const unsigned char *s, size_t n, size_t pos) {
    uint32_t cp, c1;
    size_t len, l1;
    uint16_t f = flags_at(s, n, pos, &cp, &len);
    if (f & ZI_UC_LETTER) return gpt4o_letters(s, n, pos);
    if (!(f & ZI_UC_NUMBER) && cp != '\r' && cp != '\n' &&
        (flags_at(s, n, pos + len, &c1, &l1) & ZI_UC_LETTER))
        return gpt4o_letters(s, n, pos + len);
    return rest_match(s, n, pos, cp, len, f, 3, ZI_UC_LETTER, 1);
}

/* ------------------------------------------------------------------------ */
/* the piece loop and its cache */

/* The token whose text is exactly the GPT-2-mapped form of p[0..n), or -1
 * (ignore_merges). The lookup repeats tokenizer.c's string-table probe,
 * which is private to that file. */
static int32_t piece_as_token(zi_tokenizer *t, const unsigned char *p, size_t n) {
    if (n > TOK_MAX_TOKEN_BYTES) return -1;
    if (2 * n > t->map_cap) {
        unsigned char *b = realloc(t->map_buf, 2 * n);
        if (!b) return -1; /* BPE then decides, as without the shortcut */
        t->map_buf = b;
        t->map_cap = 2 * n;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t sid = t->byte_sid[p[i]];
        memcpy(t->map_buf + m, t->arena + t->str_off[sid], t->str_len[sid]);
        m += t->str_len[sid];
    }
    uint32_t h = tok_hash_bytes(t->map_buf, m) & t->str_hash_mask;
    for (;;) {
        int32_t sid = t->str_hash[h];
        if (sid < 0) return -1;
        if (t->str_len[sid] == m && memcmp(t->arena + t->str_off[sid], t->map_buf, m) == 0)
            return sid < t->n_vocab ? sid : -1;
        h = (h + 1) & t->str_hash_mask;
    }
}

static int bpe_or_whole(zi_tokenizer *t, const unsigned char *p, size_t n, tok_idvec *out) {
    if (t->ignore_merges) {
        int32_t id = piece_as_token(t, p, n);
        if (id >= 0) return tok_idvec_push(out, id);
    }
    return tok_bpe_piece(t, p, n, out);
}

/* Encodes one piece through the cache: a short piece seen before costs a
 * hash and a compare instead of a BPE run. */
static inline int encode_piece(zi_tokenizer *t, const unsigned char *p, size_t n, tok_idvec *out) {
    if (t->split_lens) return tok_idvec_push(t->split_lens, (int32_t)n);
    if (n > TOK_CACHE_KEY_MAX) return bpe_or_whole(t, p, n, out);
    uint32_t h = tok_hash_bytes(p, n);
    tok_cache_slot *slot = &t->cache[h & (TOK_CACHE_SLOTS - 1)];
    if (slot->klen == n && slot->hash == h && memcmp(slot->key, p, n) == 0) {
        for (size_t i = 0; i < slot->nids; i++) {
            if (tok_idvec_push(out, slot->ids[i])) return ZI_ENOMEM;
        }
        return ZI_OK;
    }
    size_t before = out->n;
    int rc = bpe_or_whole(t, p, n, out);
    if (rc) return rc;
    size_t nids = out->n - before;
    if (nids <= TOK_CACHE_IDS_MAX) {
        slot->hash = h;
        slot->klen = (uint8_t)n;
        slot->nids = (uint8_t)nids;
        memcpy(slot->key, p, n);
        if (nids) memcpy(slot->ids, out->v + before, nids * sizeof(int32_t));
    }
    return ZI_OK;
}

int tok_pretok_piece(zi_tokenizer *t, const unsigned char *p, size_t n, tok_idvec *out) {
    return encode_piece(t, p, n, out);
}

int tok_pretok_encode(zi_tokenizer *t, const unsigned char *s, size_t n, tok_idvec *out) {
    if (t->pretok >= TOK_PRETOK_FIRST_REGEX) return tok_regex_encode(t, s, n, out);
    size_t pos = 0;
    int rc;
    if (t->pretok == TOK_PRETOK_GPT2 || t->pretok == TOK_PRETOK_DIGITS_GPT2) {
        scanner sc = {s, n, t->pretok == TOK_PRETOK_DIGITS_GPT2};
        while (pos < n) {
            uint32_t cp;
            size_t len = zi_utf8_decode(s + pos, n - pos, &cp);
            uint16_t f = zi_unicode_flags(cp);
            size_t end;
            if (sc.digits_split && (f & ZI_UC_NUMBER))
                end = pos + len;
            else
                end = gpt2_match(&sc, pos, cp, len, f);
            if ((rc = encode_piece(t, s + pos, end - pos, out))) return rc;
            pos = end;
        }
        return ZI_OK;
    }
    if (t->pretok == TOK_PRETOK_GPT4O) {
        while (pos < n) {
            size_t end = gpt4o_match(s, n, pos);
            if ((rc = encode_piece(t, s + pos, end - pos, out))) return rc;
            pos = end;
        }
        return ZI_OK;
    }
    int max_digits = t->pretok == TOK_PRETOK_LLAMA3 ? 3 : 1;
    uint16_t letter = ZI_UC_LETTER | (t->pretok == TOK_PRETOK_QWEN35 ? ZI_UC_MARK : 0);
    while (pos < n) {
        size_t end = llama3_match(s, n, pos, max_digits, letter);
        if ((rc = encode_piece(t, s + pos, end - pos, out))) return rc;
        pos = end;
    }
    return ZI_OK;
}

int tok_pretok_split(zi_tokenizer *t, const unsigned char *s, size_t n, tok_idvec *lens) {
    t->split_lens = lens;
    int rc = tok_pretok_encode(t, s, n, lens);
    t->split_lens = NULL;
    return rc;
}

/* ------------------------------------------------------------------------ */
/* setup */

int tok_pretok_init(zi_tokenizer *t, zi_str name, zi_error *err) {
    int i = pretok_index(name);
    if (i < 0) {
        char shown[80]; /* the file's text, printable and on one line */
        zi_printable(shown, sizeof shown, name.ptr, name.len);
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "tokenizer.ggml.pre \"%s\" is not a supported pre-tokenizer", shown);
    }
    t->pretok = k_pretoks[i].kind;
    t->ignore_merges = k_pretoks[i].ignore_merges;
    /* llama.cpp's default for add_bos_token when the file has no such key:
     * true for the Llama 3 names that also ignore merges (tokenizer.c
     * reads the key over this, where the file has a BOS token). */
    t->add_bos = t->pretok == TOK_PRETOK_LLAMA3 && t->ignore_merges;
    if (t->pretok >= TOK_PRETOK_FIRST_REGEX) return tok_regex_new(t->pretok, &t->regex, err);
    return ZI_OK;
}

void tok_pretok_free(zi_tokenizer *t) {
    tok_regex_free(t->regex);
    t->regex = NULL;
    free(t->map_buf);
    t->map_buf = NULL;
}
