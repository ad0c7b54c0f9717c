/*
 * tokenizer_impl.h - what the tokenizer's source files share (internal: the
 * interface is tokenizer.h, and nothing outside tokenizer_proc/tokenizer*.c
 * includes this but the white-box test tests/unit/test_pretok.c).
 *
 * The tokenizer is one module split by stage, in the order text meets them:
 *
 *   tokenizer.c         loading: tokens, their attributes, the string table,
 *                       the GPT-2 byte mapping; zi_tokenizer_load / _free
 *   tokenizer_encode.c  zi_tokenizer_encode: special-token partition and
 *                       normalisation, then pre-tokenizer and BPE
 *   tokenizer_pretok.c  pre-tokenizers: tokenizer.ggml.pre names, the
 *                       hand-written scanners, the loop over the pieces
 *                       and their cache
 *   tokenizer_regex.c   the pre-tokenizers that are a list of regexes,
 *                       applied one after another with PCRE2
 *   tokenizer_bpe.c     the merge table, loaded and applied to one piece
 *   tokenizer_spm.c     SentencePiece-style ("llama") vocabularies: scores,
 *                       the merge by score, byte fallback, U+2581 escaping
 *   tokenizer_wpm.c     WordPiece ("bert") vocabularies: the BERT
 *                       normaliser, greedy longest-token words, [UNK]
 *   tokenizer_decode.c  what each token decodes to; decode and streaming
 *
 * This header holds the struct all of them read, the limits a file is held
 * to, and the few functions one file provides to another (tok_ prefix).
 * Structs only one file looks inside are declared here by tag alone.
 */
#ifndef ZI_TOKENIZER_IMPL_H
#define ZI_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "gguf.h"
#include "grow.h"
#include "tokenizer.h"
#include "zi_error.h"

/* Token attributes, derived from the GGUF token type plus the by-name fixups
 * llama.cpp applies (end-of-turn and FIM tokens are treated as control). */
enum {
    TOK_ATTR_NORMAL = 1 << 0,
    TOK_ATTR_UNKNOWN = 1 << 1,
    TOK_ATTR_CONTROL = 1 << 2,
    TOK_ATTR_USER = 1 << 3,
    TOK_ATTR_UNUSED = 1 << 4,
    TOK_ATTR_BYTE = 1 << 5,
    /* Whitespace before (LSTRIP) / after (RSTRIP) the token's text is
     * dropped when the partition finds it (llama.cpp sets these by model
     * name: Phi-3's special tokens are RSTRIP). */
    TOK_ATTR_LSTRIP = 1 << 6,
    TOK_ATTR_RSTRIP = 1 << 7,
};

/* Tokenizer models (tokenizer.ggml.model). */
typedef enum tok_model {
    TOK_MODEL_BPE, /* "gpt2": byte-level BPE (tokenizer_pretok.c, tokenizer_bpe.c) */
    TOK_MODEL_SPM, /* "llama": SentencePiece-style (tokenizer_spm.c) */
    TOK_MODEL_WPM, /* "bert": WordPiece (tokenizer_wpm.c) */
} tok_model;

/* Pre-tokenizers (see tokenizer_pretok.c, which maps names to them). The
 * first six are hand-written scanners; the others are lists of regexes
 * (tokenizer_regex.c). */
typedef enum tok_pretok_kind {
    TOK_PRETOK_GPT2,        /* the GPT-2 pattern alone */
    TOK_PRETOK_DIGITS_GPT2, /* \p{N} isolated first, then the GPT-2 pattern */
    TOK_PRETOK_LLAMA3,      /* Llama 3: [^\r\n\p{L}\p{N}]?\p{L}+, \p{N}{1,3}, ... */
    TOK_PRETOK_QWEN2,       /* as LLAMA3 with single \p{N} */
    TOK_PRETOK_QWEN35,      /* as QWEN2 with \p{M} joining letter runs */
    TOK_PRETOK_GPT4O,       /* o200k (GPT-4o, gpt-oss): case-aware letter runs */
    TOK_PRETOK_FALCON,      /* punctuation runs, GPT-2, [0-9]{3} */
    TOK_PRETOK_DEFAULT,     /* llama.cpp's default: as FALCON plus \p{N}+ */
    TOK_PRETOK_DEEPSEEK_LLM,
    TOK_PRETOK_DEEPSEEK_CODER,
} tok_pretok_kind;

/* The first kind that tokenizer_regex.c runs. */
#define TOK_PRETOK_FIRST_REGEX TOK_PRETOK_FALCON

/* Limits on what a file may hold. They keep every sid (tokens plus at most
 * three strings per merge) below 2^27, so 32-bit indices and the hash
 * tables never overflow, and bound what one token may decode to. Real
 * vocabularies are far inside them (SmolLM2: 49152 tokens of at most 162
 * bytes, 48900 merges). */
#define TOK_MAX_VOCAB (1u << 24)
#define TOK_MAX_MERGES (1u << 24)
#define TOK_MAX_TOKEN_BYTES ((unsigned)ZI_TOKEN_MAX_BYTES)
#define TOK_MAX_PIECE_BYTES 65536u

/* Direct-mapped cache of BPE results for short pieces (tokenizer_pretok.c). */
#define TOK_CACHE_SLOTS (1u << 15)
#define TOK_CACHE_KEY_MAX 26
#define TOK_CACHE_IDS_MAX 12

typedef struct tok_cache_slot {
    uint32_t hash;
    uint8_t klen; /* 0: empty (pieces are never empty) */
    uint8_t nids;
    char key[TOK_CACHE_KEY_MAX];
    int32_t ids[TOK_CACHE_IDS_MAX];
} tok_cache_slot;

/* A growable int32 vector for the output ids. */
typedef struct tok_idvec {
    int32_t *v;
    size_t n, cap;
} tok_idvec;

/* Appends id to v; ZI_ENOMEM when it cannot grow. Inline because it runs
 * for every id encoded. */
static inline int tok_idvec_push(tok_idvec *v, int32_t id) {
    if (v->n == v->cap) {
        int32_t *p = zi_grow(v->v, &v->cap, sizeof *p, 64);
        if (!p) return ZI_ENOMEM;
        v->v = p;
    }
    v->v[v->n++] = id;
    return ZI_OK;
}

/* Defined where they are used: the merge table's entries and BPE's working
 * symbols and candidates in tokenizer_bpe.c, the partition's fragments in
 * tokenizer_encode.c. */
struct tok_merge_entry;
struct tok_bpe_sym;
struct tok_bpe_cand;
struct tok_fragment;
struct tok_spm_sym;
struct tok_spm_bigram;
struct tok_regex;

/* Every string BPE can produce has a string id (sid): sids below n_vocab
 * are token ids, the others are merge parts or results that are not
 * tokens. */
struct zi_tokenizer {
    int32_t n_vocab;
    int32_t n_strings; /* tokens plus strings only merges name */
    uint32_t cap_strings;
    char *arena; /* texts of all strings */
    size_t arena_len, arena_cap;
    uint64_t *str_off; /* per sid */
    uint32_t *str_len; /* per sid */
    int32_t *str_hash; /* open addressing over sids, -1 empty */
    uint32_t str_hash_mask;

    uint8_t *type; /* token type from the file */
    uint8_t *attr;
    uint8_t *eog;
    char *piece_arena; /* decoded bytes of each token */
    uint64_t *piece_off;
    uint32_t *piece_len;

    struct tok_merge_entry *merges;
    uint64_t merge_mask;
    int merge_shift;

    int32_t byte_sid[256];        /* sid of each byte's GPT-2 character */
    int32_t single_byte_tok[256]; /* token whose text is exactly that byte, or -1 */

    int32_t *special; /* special-token candidates, longest text first */
    size_t n_special;

    int32_t bos, eos, unk, pad;
    int32_t sep; /* WPM: added after the ids with add_special, -1: none */
    int add_bos, add_eos;
    int add_sep; /* tokenizer.ggml.add_sep_token (WPM default): a reranker's pair separator */
    /* tokenizer.ggml.add_space_prefix (default: true for SPM, false for
     * BPE): SPM encoding puts a space before the text, and decoding drops
     * one leading space of the first token, for every model (llama.cpp). */
    int add_space_prefix;
    tok_model model;
    const struct tok_pretok_ops *pretok_ops; /* NULL: loaded for the vocabulary only */
    tok_pretok_kind pretok;
    int ignore_merges;       /* a piece that is a token is that token (Llama 3) */
    struct tok_regex *regex; /* the regex list of a regex kind, else NULL */
    unsigned char *map_buf;  /* scratch for ignore_merges: a piece's mapped text */
    size_t map_cap;
    tok_idvec *split_lens; /* set only by tok_pretok_split: record, do not encode */

    /* SPM only (tokenizer_spm.c): each token's score, the longest token
     * text, the token each byte falls back to (-1: none), and the byte that
     * had none when encoding failed with ZI_EFORMAT. */
    float *score;
    uint32_t max_token_len;
    int32_t spm_byte_tok[256];
    unsigned spm_missing_byte;

    /* WPM only (tokenizer_wpm.c): the normaliser's options, and scratch:
     * the word being built, the prefix hashes of one position. */
    int wpm_lower, wpm_strip;
    char *wpm_word;
    size_t wpm_word_cap;
    uint32_t *wpm_hash; /* max_token_len + 1 entries */

    tok_cache_slot *cache;

    /* Scratch reused across encode calls (the tokenizer is single-threaded). */
    unsigned char *norm;
    size_t norm_cap;
    struct tok_fragment *frag_a, *frag_b;
    size_t frag_cap;
    struct tok_bpe_sym *syms;
    struct tok_bpe_cand *heap;
    size_t sym_cap, heap_cap;
    char *spm_text;
    struct tok_spm_sym *spm_syms;
    struct tok_spm_bigram *spm_heap;
    size_t spm_text_cap, spm_sym_cap, spm_heap_cap;
};

/* FNV-1a over n bytes: the string table's and the piece cache's hash.
 * Inline because the cache hashes every piece it is asked for. */
static inline uint32_t tok_hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

/* tokenizer.c */

/* The sid of the string s[0..n), added with the next sid when it is new.
 * ZI_ENOMEM when the table cannot grow. */
int tok_str_find_or_add(zi_tokenizer *t, const char *s, size_t n, int32_t *sid);
/* The sid of the string s[0..n), or -1 when it is not in the table. */
int32_t tok_str_find(const zi_tokenizer *t, const char *s, size_t n);
/* tok_str_find with h = tok_hash_bytes(s, n) already computed. */
int32_t tok_str_find_hashed(const zi_tokenizer *t, const char *s, size_t n, uint32_t h);
/* Grows the byte buffer *p (capacity *cap) to hold at least need bytes:
 * 64 KiB first, then doubling, as the string arena and the decoded pieces
 * both grow. ZI_ENOMEM (the buffer is left as it was). */
int tok_reserve_bytes(char **p, size_t *cap, size_t need);
/* The byte a GPT-2-mapped codepoint stands for, or -1. */
int tok_cp_to_byte(uint32_t cp);

/* The pre-tokenizer as loading and freeing reach it, through pointers so
 * that the vocabulary half (tokenizer.c, tokenizer_decode.c and the model
 * loaders: library zi_vocab) links no regex engine. zi_tokenizer_load
 * (tokenizer_encode.c) passes tok_pretok_lookup/init/free; a
 * vocabulary-only load passes NULL and gets a tokenizer that cannot
 * encode. */
typedef struct tok_pretok_ops {
    int (*lookup)(zi_str name);
    int (*init)(zi_tokenizer *t, zi_str name, zi_error *err);
    void (*free)(zi_tokenizer *t);
} tok_pretok_ops;
/* zi_tokenizer_load with the pre-tokenizer ops (NULL: vocabulary only). */
int tok_load(const zi_gguf *g, const tok_pretok_ops *pretok, zi_tokenizer **out, zi_error *err);

/* tokenizer_pretok.c */

/* The pre-tokenizer tokenizer.ggml.pre names ("" when the key is missing),
 * or -1 when it is not one zinfer implements. */
int tok_pretok_lookup(zi_str name);
/* Sets t->pretok and what it needs (its regexes, ignore_merges) for the
 * tokenizer.ggml.pre value name. ZI_EUNSUPPORTED naming a value zinfer does
 * not implement (or a pattern PCRE2 refuses), ZI_ENOMEM. tok_pretok_free
 * releases it (safe on a tokenizer whose init failed or never ran). */
int tok_pretok_init(zi_tokenizer *t, zi_str name, zi_error *err);
void tok_pretok_free(zi_tokenizer *t);
/* Where the GPT-2 pattern's match starting at byte pos of the clean UTF-8
 * text s[0..n) ends; with digits_split, every \p{N} codepoint is a piece
 * of its own and ends the runs around it. */
size_t tok_gpt2_next(const unsigned char *s, size_t n, size_t pos, int digits_split);
/* The lengths in bytes of the pieces the pre-tokenizer splits the clean
 * text s[0..n) into, appended to lens (nothing is encoded): a test hook
 * (tests/unit/test_pretok.c). ZI_ENOMEM. */
int tok_pretok_split(zi_tokenizer *t, const unsigned char *s, size_t n, tok_idvec *lens);
/* Encodes one piece p[0..n) (n > 0) through the cache and BPE. */
int tok_pretok_piece(zi_tokenizer *t, const unsigned char *p, size_t n, tok_idvec *out);
/* Splits the clean UTF-8 text s[0..n) into pre-token pieces and appends
 * each piece's ids (from the cache or tok_bpe_piece). ZI_ENOMEM when
 * scratch or out cannot grow. */
int tok_pretok_encode(zi_tokenizer *t, const unsigned char *s, size_t n, tok_idvec *out);

/* tokenizer_regex.c */

/* Compiles the regex list of kind (>= TOK_PRETOK_FIRST_REGEX) into *out.
 * ZI_ENOMEM, ZI_EUNSUPPORTED naming the pattern PCRE2 refused. */
int tok_regex_new(tok_pretok_kind kind, struct tok_regex **out, zi_error *err);
void tok_regex_free(struct tok_regex *r);
/* Splits the clean UTF-8 text s[0..n) with the list and encodes each piece
 * (tok_pretok_piece). ZI_ENOMEM; ZI_ERANGE if a match exceeds PCRE2's limit. */
int tok_regex_encode(zi_tokenizer *t, const unsigned char *s, size_t n, tok_idvec *out);

/* tokenizer_bpe.c */

/* Reads tokenizer.ggml.merges into t->merges (the vocabulary is already
 * loaded); errors as zi_tokenizer_load documents them. */
int tok_load_merges(zi_tokenizer *t, const zi_gguf *g, zi_error *err);
/* Runs BPE over one pre-token piece p[0..n) (n > 0) and appends its ids.
 * ZI_ENOMEM when scratch or out cannot grow. */
int tok_bpe_piece(zi_tokenizer *t, const unsigned char *p, size_t n, tok_idvec *out);

/* tokenizer_spm.c */

/* Reads tokenizer.ggml.scores (float32 or int32, at least one per token;
 * absent: all 0) and finds each byte's fallback token, once the
 * vocabulary is loaded. ZI_EFORMAT naming the key, ZI_ENOMEM. */
int tok_spm_load(zi_tokenizer *t, const zi_gguf *g, zi_error *err);
/* Encodes one raw fragment s[0..n) (raw bytes, not validated), with a
 * space put in front when prefix_space is set, and appends its ids.
 * ZI_EFORMAT when a byte that must fall back has no token (the byte is
 * left in t->spm_missing_byte), ZI_ERANGE for a fragment over ~700 MB,
 * ZI_ENOMEM. */
int tok_spm_encode(zi_tokenizer *t, const char *s, size_t n, int prefix_space, tok_idvec *out);
/* Writes s[0..n) to out with each U+2581 turned back into ' ' (out needs n
 * bytes) and returns the length written. */
size_t tok_spm_unescape(const char *s, size_t n, char *out);

/* tokenizer_wpm.c */

/* Reads tokenizer.ggml.normalizer.{lowercase, strip_accents} and sizes the
 * scratch, once the vocabulary is loaded. ZI_EFORMAT naming the key,
 * ZI_ENOMEM. */
int tok_wpm_load(zi_tokenizer *t, const zi_gguf *g, zi_error *err);
/* Normalises and encodes one raw fragment s[0..n) (any bytes) and appends
 * its ids. ZI_EFORMAT when a word needs the unknown token and the file has
 * none, ZI_ENOMEM. */
int tok_wpm_encode(zi_tokenizer *t, const unsigned char *s, size_t n, tok_idvec *out);
/* llama.cpp's clean_up_tokenization_spaces over decoded text s[0..n), in
 * place; returns the new length. */
size_t tok_wpm_clean_spaces(char *s, size_t n);

/* tokenizer_decode.c */

/* Precomputes what each token decodes to (t->piece_*), once the
 * vocabulary and attributes are loaded. ZI_EFORMAT naming the token for one
 * that decodes to too much, ZI_ENOMEM. */
int tok_build_pieces(zi_tokenizer *t, zi_error *err);

#endif
