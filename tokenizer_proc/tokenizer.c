/*
 * tokenizer.c - byte-level BPE tokenizer reproducing llama.cpp's ids (see
 * tokenizer.h for the interface).
 *
 * Encoding runs in four stages, each mirroring what llama.cpp does for a
 * "gpt2"-model GGUF file:
 *
 *  1. Special-token partition. Control/unknown tokens (only when
 *     parse_special is set) and user-defined tokens (always) are searched
 *     for in the raw text, longest text first; every occurrence in the
 *     still-raw fragments becomes that token, splitting the fragment.
 *  2. Normalisation of each raw fragment: bytes that are not valid UTF-8
 *     become U+FFFD and odd-but-structurally-valid sequences (overlong forms)
 *     are re-encoded, because llama.cpp decodes to codepoints and re-encodes
 *     before BPE. Ordinary valid text is left untouched (and not copied).
 *  3. Pre-tokenization by a hand-written scanner (no regex engine): the
 *     GPT-2 pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
 *     ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, optionally preceded by a split that
 *     isolates every \p{N} codepoint (the "smollm"/"starcoder" family). The
 *     pre-tokenizer table below maps tokenizer.ggml.pre names to these.
 *  4. BPE on each piece: every byte starts as the token for its GPT-2
 *     byte-to-unicode character, then the adjacent pair with the lowest merge
 *     rank (leftmost on ties) is merged until none is left. Results for
 *     short pieces are kept in a bounded direct-mapped cache.
 *
 * Internally every string BPE can produce has a "string id" (sid): sids
 * below n_vocab are token ids; a merge part or result that is not in the
 * vocabulary gets a sid above it, and such a leftover symbol falls back to
 * single-byte tokens exactly as llama.cpp does. Merges are a hash map from
 * the pair of sids to (rank, result sid), so no strings are touched while
 * encoding.
 */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

/* Token attributes, derived from the GGUF token type plus the by-name fixups
 * llama.cpp applies (end-of-turn and FIM tokens are treated as control). */
enum {
    ATTR_NORMAL = 1 << 0,
    ATTR_UNKNOWN = 1 << 1,
    ATTR_CONTROL = 1 << 2,
    ATTR_USER = 1 << 3,
    ATTR_UNUSED = 1 << 4,
    ATTR_BYTE = 1 << 5,
};

/* Tokens that llama.cpp treats as end-of-generation (and as control) by
 * their text, whatever their type in the file. */
static const char *const k_eog_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
};

/* FIM tokens llama.cpp marks as control by their text. */
static const char *const k_control_texts[] = {
    "<|fim_prefix|>",  "<fim-prefix>",    "<fim_prefix>",   "<PRE>",        "<|code_prefix|>",
    "<|prefix|>",      "<|fim_suffix|>",  "<fim-suffix>",   "<fim_suffix>", "<SUF>",
    "<|code_suffix|>", "<|suffix|>",      "<|fim_middle|>", "<fim-middle>", "<fim_middle>",
    "<MID>",           "<|code_middle|>", "<|middle|>",     "<PAD>",        "[PAD]",
};

/* Pre-tokenizers. To add one: a kind, its scanning in encode_clean(), and
 * its names here. */
typedef enum pretok_kind {
    PRETOK_GPT2,        /* the GPT-2 pattern alone */
    PRETOK_DIGITS_GPT2, /* \p{N} isolated first, then the GPT-2 pattern */
} pretok_kind;

static const struct {
    const char *name;
    pretok_kind kind;
} k_pretoks[] = {
    {"gpt-2", PRETOK_GPT2},
    {"gpt2", PRETOK_GPT2},
    {"smollm", PRETOK_DIGITS_GPT2},
    {"starcoder", PRETOK_DIGITS_GPT2},
    {"refact", PRETOK_DIGITS_GPT2},
    {"command-r", PRETOK_DIGITS_GPT2},
    {"codeshell", PRETOK_DIGITS_GPT2},
    {"exaone", PRETOK_DIGITS_GPT2},
    {"minerva-7b", PRETOK_DIGITS_GPT2},
};

/* Limits on what a file may hold. They keep every sid (tokens plus at most
 * three strings per merge) below 2^27, so 32-bit indices and the hash
 * tables never overflow, and bound what one token may decode to. Real
 * vocabularies are far inside them (SmolLM2: 49152 tokens of at most 162
 * bytes, 48900 merges). */
#define MAX_VOCAB (1u << 24)
#define MAX_MERGES (1u << 24)
#define MAX_TOKEN_BYTES ((unsigned)ZI_TOKEN_MAX_BYTES)
#define MAX_PIECE_BYTES 65536u

/* Direct-mapped cache of BPE results for short pieces. */
#define CACHE_SLOTS (1u << 15)
#define CACHE_KEY_MAX 26
#define CACHE_IDS_MAX 12

typedef struct cache_slot {
    uint32_t hash;
    uint8_t klen; /* 0: empty (pieces are never empty) */
    uint8_t nids;
    char key[CACHE_KEY_MAX];
    int32_t ids[CACHE_IDS_MAX];
} cache_slot;

typedef struct merge_entry {
    uint64_t key; /* sid_left << 32 | sid_right; MERGE_EMPTY when free */
    int32_t rank;
    int32_t result;
} merge_entry;

#define MERGE_EMPTY UINT64_MAX

typedef struct bpe_sym {
    int32_t sid; /* -1 once merged into its left neighbour */
    int32_t prev, next;
} bpe_sym;

typedef struct bpe_cand {
    int32_t rank;
    int32_t left, right;
    int32_t lsid, rsid, result;
} bpe_cand;

typedef struct fragment {
    size_t off, len;
    int32_t token; /* -1: raw text */
} fragment;

/* A growable int32 vector for the output ids. */
typedef struct idvec {
    int32_t *v;
    size_t n, cap;
} idvec;

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

    merge_entry *merges;
    uint64_t merge_mask;
    int merge_shift;

    int32_t byte_sid[256];        /* sid of each byte's GPT-2 character */
    int32_t single_byte_tok[256]; /* token whose text is exactly that byte, or -1 */

    int32_t *special; /* special-token candidates, longest text first */
    size_t n_special;

    int32_t bos, eos, unk, pad;
    int add_bos, add_eos;
    pretok_kind pretok;

    cache_slot *cache;

    /* Scratch reused across encode calls (the tokenizer is single-threaded). */
    unsigned char *norm;
    size_t norm_cap;
    fragment *frag_a, *frag_b;
    size_t frag_cap;
    bpe_sym *syms;
    bpe_cand *heap;
    size_t sym_cap, heap_cap;
};

/* ------------------------------------------------------------------------ */
/* GPT-2 byte-to-unicode mapping: printable Latin-1 bytes stand for
 * themselves, the others are shifted to U+0100 and up in byte order. */

static uint32_t byte_to_cp(unsigned b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++) {
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) n++;
    }
    return 256 + n;
}

/* The byte a mapped codepoint stands for, or -1. */
static int cp_to_byte(uint32_t cp) {
    if (cp < 256) {
        if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE))
            return (int)cp;
        return -1;
    }
    if (cp >= 256 + 68) return -1; /* 68 bytes are shifted */
    uint32_t n = cp - 256;
    for (unsigned c = 0; c < 256; c++) {
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) {
            if (n == 0) return (int)c;
            n--;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------------ */
/* hashing */

static uint32_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

static uint64_t hash_pair(uint64_t key, int shift) {
    return (key * 0x9E3779B97F4A7C15ull) >> shift;
}

/* ------------------------------------------------------------------------ */
/* string table */

static int str_find(const zi_tokenizer *t, const char *s, size_t n) {
    uint32_t i = hash_bytes(s, n) & t->str_hash_mask;
    for (;;) {
        int32_t sid = t->str_hash[i];
        if (sid < 0) return -1;
        if (t->str_len[sid] == n && memcmp(t->arena + t->str_off[sid], s, n) == 0) return sid;
        i = (i + 1) & t->str_hash_mask;
    }
}

/* Inserts sid into the hash table; an entry with the same text is replaced,
 * so a later token with a duplicate text wins (as in llama.cpp). */
static void str_insert(zi_tokenizer *t, int32_t sid) {
    const char *s = t->arena + t->str_off[sid];
    uint32_t n = t->str_len[sid];
    uint32_t i = hash_bytes(s, n) & t->str_hash_mask;
    for (;;) {
        int32_t old = t->str_hash[i];
        if (old < 0 || (t->str_len[old] == n && memcmp(t->arena + t->str_off[old], s, n) == 0))
            break;
        i = (i + 1) & t->str_hash_mask;
    }
    t->str_hash[i] = sid;
}

static int str_rehash(zi_tokenizer *t, uint32_t cap) {
    int32_t *h = malloc(sizeof *h * cap);
    if (!h) return ZI_ENOMEM;
    memset(h, 0xFF, sizeof *h * cap);
    free(t->str_hash);
    t->str_hash = h;
    t->str_hash_mask = cap - 1;
    for (int32_t sid = 0; sid < t->n_strings; sid++) str_insert(t, sid);
    return ZI_OK;
}

/* Appends a string with the next sid (*sid_out); see str_insert for
 * duplicate texts. */
static int str_add(zi_tokenizer *t, const char *s, size_t n, int32_t *sid_out) {
    if ((uint32_t)t->n_strings == t->cap_strings) {
        uint32_t cap = t->cap_strings ? t->cap_strings * 2 : 1024;
        uint64_t *off = realloc(t->str_off, sizeof *off * cap);
        if (!off) return ZI_ENOMEM;
        t->str_off = off;
        uint32_t *len = realloc(t->str_len, sizeof *len * cap);
        if (!len) return ZI_ENOMEM;
        t->str_len = len;
        t->cap_strings = cap;
    }
    if ((uint64_t)(t->n_strings + 1) * 2 > (uint64_t)t->str_hash_mask + 1) {
        int rc = str_rehash(t, (t->str_hash_mask + 1) * 2);
        if (rc) return rc;
    }
    if (t->arena_len + n > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 65536;
        while (cap < t->arena_len + n) cap *= 2;
        char *a = realloc(t->arena, cap);
        if (!a) return ZI_ENOMEM;
        t->arena = a;
        t->arena_cap = cap;
    }
    memcpy(t->arena + t->arena_len, s, n);
    int32_t sid = t->n_strings++;
    t->str_off[sid] = t->arena_len;
    t->str_len[sid] = (uint32_t)n;
    t->arena_len += n;

    str_insert(t, sid);
    *sid_out = sid;
    return ZI_OK;
}

static int str_find_or_add(zi_tokenizer *t, const char *s, size_t n, int32_t *sid) {
    int found = str_find(t, s, n);
    if (found >= 0) {
        *sid = found;
        return ZI_OK;
    }
    return str_add(t, s, n, sid);
}

/* ------------------------------------------------------------------------ */
/* merges */

static merge_entry *merge_slot(const zi_tokenizer *t, uint64_t key) {
    uint64_t i = hash_pair(key, t->merge_shift);
    for (;;) {
        merge_entry *e = &t->merges[i];
        if (e->key == key || e->key == MERGE_EMPTY) return e;
        i = (i + 1) & t->merge_mask;
    }
}

static const merge_entry *merge_find(const zi_tokenizer *t, int32_t l, int32_t r) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    const merge_entry *e = merge_slot(t, key);
    return e->key == key ? e : NULL;
}

/* ------------------------------------------------------------------------ */
/* loading */

static int in_list(const char *s, size_t n, const char *const *list, size_t count) {
    for (size_t i = 0; i < count; i++) {
        if (strlen(list[i]) == n && memcmp(list[i], s, n) == 0) return 1;
    }
    return 0;
}

static int read_token_id(const zi_gguf *g, const char *key, int32_t n_vocab, int32_t *out,
                         zi_error *err) {
    *out = -1;
    if (!zi_gguf_find_kv(g, key)) return ZI_OK;
    uint32_t v;
    int rc = zi_gguf_get_u32(g, key, &v, err);
    if (rc) return rc;
    if (v >= (uint32_t)n_vocab)
        return zi_error_set(err, ZI_EFORMAT, "%s = %u is outside the vocabulary (%d tokens)", key,
                            v, n_vocab);
    *out = (int32_t)v;
    return ZI_OK;
}

/* A growable byte buffer for building the decoded pieces. */
typedef struct bytebuf {
    char *p;
    size_t len, cap;
} bytebuf;

static int bb_put(bytebuf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->len + n) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return ZI_ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return ZI_OK;
}

/* Decoded bytes of a normal token: each character mapped back to its byte;
 * a character outside the mapping is spelled out as llama.cpp does. */
static int build_normal_piece(const zi_tokenizer *t, int32_t id, bytebuf *b) {
    const unsigned char *s = (const unsigned char *)t->arena + t->str_off[id];
    size_t n = t->str_len[id], start = b->len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = zi_utf8_decode(s + i, n - i, &cp);
        int byte = cp_to_byte(cp);
        if (byte >= 0) {
            char c = (char)byte;
            if (bb_put(b, &c, 1)) return ZI_ENOMEM;
        } else {
            static const char hex[] = "0123456789abcdef";
            unsigned char u[4];
            size_t ul = zi_utf8_encode(cp, u);
            char h[8];
            for (size_t k = 0; k < ul; k++) {
                h[2 * k] = hex[u[k] >> 4];
                h[2 * k + 1] = hex[u[k] & 15];
            }
            if (bb_put(b, "[UNK_BYTE_0x", 12) || bb_put(b, h, 2 * ul) || bb_put(b, s, n) ||
                bb_put(b, "]", 1))
                return ZI_ENOMEM;
        }
        i += l;
        if (b->len - start > MAX_PIECE_BYTES) return ZI_EFORMAT; /* stop a blow-up early */
    }
    return ZI_OK;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Precomputes what each token decodes to (for special = 1; control and
 * unknown tokens are hidden at lookup time when special = 0). */
static int build_pieces(zi_tokenizer *t, zi_error *err) {
    size_t n = (size_t)t->n_vocab;
    t->piece_off = malloc(sizeof *t->piece_off * n);
    t->piece_len = malloc(sizeof *t->piece_len * n);
    if (!t->piece_off || !t->piece_len)
        return zi_error_set(err, ZI_ENOMEM, "out of memory for token pieces");
    bytebuf b = {NULL, 0, 0};
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t a = t->attr[id];
        const char *txt = t->arena + t->str_off[id];
        uint32_t tl = t->str_len[id];
        size_t start = b.len;
        int rc = ZI_OK;
        if (a & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER)) {
            rc = bb_put(&b, txt, tl); /* the raw text */
        } else if (a & ATTR_NORMAL) {
            rc = build_normal_piece(t, id, &b);
        } else if ((a & ATTR_BYTE) && tl == 6 && memcmp(txt, "<0x", 3) == 0 && txt[5] == '>' &&
                   hexval(txt[3]) >= 0 && hexval(txt[4]) >= 0) {
            char c = (char)(hexval(txt[3]) * 16 + hexval(txt[4]));
            rc = bb_put(&b, &c, 1);
        } /* unused / undefined types decode to nothing */
        if (rc == ZI_ENOMEM) {
            free(b.p);
            return zi_error_set(err, ZI_ENOMEM, "out of memory for token pieces");
        }
        if (rc || b.len - start > MAX_PIECE_BYTES) {
            free(b.p);
            return zi_error_set(err, ZI_EFORMAT,
                                "tokenizer.ggml.tokens[%d] does not decode to bytes: too many "
                                "characters outside the byte-level alphabet",
                                (int)id);
        }
        t->piece_off[id] = start;
        t->piece_len[id] = (uint32_t)(b.len - start);
    }
    t->piece_arena = b.p;
    return ZI_OK;
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const zi_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->str_len[x] != t->str_len[y]) return t->str_len[x] > t->str_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int load_vocab(zi_tokenizer *t, const zi_gguf *g, zi_error *err) {
    zi_str *toks = NULL;
    uint64_t n_toks = 0;
    int rc = zi_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &n_toks, err);
    if (rc) return rc;
    if (n_toks == 0 || n_toks > MAX_VOCAB) {
        free(toks);
        return zi_error_set(err, n_toks ? ZI_ERANGE : ZI_EFORMAT,
                            "tokenizer.ggml.tokens has %llu entries (limit %u)",
                            (unsigned long long)n_toks, MAX_VOCAB);
    }
    t->n_vocab = (int32_t)n_toks;

    const void *types = NULL;
    uint64_t n_types = 0;
    if (zi_gguf_find_kv(g, "tokenizer.ggml.token_type")) {
        rc =
            zi_gguf_get_array(g, "tokenizer.ggml.token_type", ZI_GGUF_INT32, &types, &n_types, err);
        if (rc) {
            free(toks);
            return rc;
        }
        if (n_types != n_toks) {
            free(toks);
            return zi_error_set(err, ZI_EFORMAT,
                                "tokenizer.ggml.token_type has %llu entries, tokens has %llu",
                                (unsigned long long)n_types, (unsigned long long)n_toks);
        }
    }

    t->type = malloc(n_toks);
    t->attr = malloc(n_toks);
    t->eog = calloc(n_toks, 1);
    if (!t->type || !t->attr || !t->eog) {
        free(toks);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for %llu tokens",
                            (unsigned long long)n_toks);
    }
    rc = str_rehash(t, 1u << 16);
    if (rc) {
        free(toks);
        return zi_error_set(err, rc, "out of memory for the token table");
    }
    for (uint64_t i = 0; i < n_toks; i++) {
        char empty[40];
        const char *s = toks[i].ptr;
        size_t n = (size_t)toks[i].len;
        if (n == 0) { /* llama.cpp's stand-in for an empty token text */
            n = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%llu]", (unsigned long long)i);
            s = empty;
        }
        if (n > MAX_TOKEN_BYTES) {
            free(toks);
            return zi_error_set(err, ZI_ERANGE,
                                "tokenizer.ggml.tokens[%llu] is %zu bytes (limit %u)",
                                (unsigned long long)i, n, MAX_TOKEN_BYTES);
        }
        int32_t sid;
        rc = str_add(t, s, n, &sid);
        if (rc) {
            free(toks);
            return zi_error_set(err, rc, "out of memory for the token table");
        }
        int32_t ty = ZI_TOKEN_NORMAL;
        if (types) memcpy(&ty, (const char *)types + 4 * i, 4);
        t->type[i] = (uint8_t)(ty >= 0 && ty <= 255 ? ty : 0);
        switch (ty) {
        case ZI_TOKEN_NORMAL:
            t->attr[i] = ATTR_NORMAL;
            break;
        case ZI_TOKEN_UNKNOWN:
            t->attr[i] = ATTR_UNKNOWN;
            break;
        case ZI_TOKEN_CONTROL:
            t->attr[i] = ATTR_CONTROL;
            break;
        case ZI_TOKEN_USER_DEFINED:
            t->attr[i] = ATTR_USER;
            break;
        case ZI_TOKEN_UNUSED:
            t->attr[i] = ATTR_UNUSED;
            break;
        case ZI_TOKEN_BYTE:
            t->attr[i] = ATTR_BYTE;
            break;
        default:
            t->attr[i] = 0;
            break;
        }
        if (in_list(s, n, k_eog_texts, sizeof k_eog_texts / sizeof *k_eog_texts)) {
            t->eog[i] = 1;
            t->attr[i] |= ATTR_CONTROL;
        } else if (in_list(s, n, k_control_texts,
                           sizeof k_control_texts / sizeof *k_control_texts)) {
            t->attr[i] |= ATTR_CONTROL;
        }
    }
    free(toks);
    return ZI_OK;
}

static int load_merges(zi_tokenizer *t, const zi_gguf *g, zi_error *err) {
    zi_str *merges = NULL;
    uint64_t n_merges = 0;
    int rc = zi_gguf_get_str_array(g, "tokenizer.ggml.merges", &merges, &n_merges, err);
    if (rc) return rc;
    if (n_merges > MAX_MERGES) {
        free(merges);
        return zi_error_set(err, ZI_ERANGE, "tokenizer.ggml.merges has %llu entries (limit %u)",
                            (unsigned long long)n_merges, MAX_MERGES);
    }
    uint64_t cap = 1024;
    while (cap < n_merges * 2) cap *= 2;
    t->merges = malloc(sizeof *t->merges * cap);
    if (!t->merges) {
        free(merges);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for %llu merges",
                            (unsigned long long)n_merges);
    }
    for (uint64_t i = 0; i < cap; i++) t->merges[i].key = MERGE_EMPTY;
    t->merge_mask = cap - 1;
    t->merge_shift = 64;
    for (uint64_t c = cap; c > 1; c >>= 1) t->merge_shift--;

    char *cat = NULL;
    size_t cat_cap = 0;
    for (uint64_t i = 0; i < n_merges; i++) {
        const char *s = merges[i].ptr;
        size_t n = (size_t)merges[i].len;
        /* The separator is the first space after the first byte. */
        const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
        if (!sp) {
            free(cat);
            free(merges);
            return zi_error_set(err, ZI_EFORMAT,
                                "tokenizer.ggml.merges[%llu] has no space separating two parts",
                                (unsigned long long)i);
        }
        size_t la = (size_t)(sp - s), lb = n - la - 1;
        if (lb == 0 || n > 2 * MAX_TOKEN_BYTES) {
            free(cat);
            free(merges);
            return zi_error_set(err, ZI_EFORMAT, "tokenizer.ggml.merges[%llu] is malformed",
                                (unsigned long long)i);
        }
        if (la + lb > cat_cap) {
            cat_cap = (la + lb) * 2;
            char *c = realloc(cat, cat_cap);
            if (!c) {
                free(cat);
                free(merges);
                return zi_error_set(err, ZI_ENOMEM, "out of memory for merges");
            }
            cat = c;
        }
        memcpy(cat, s, la);
        memcpy(cat + la, sp + 1, lb);
        int32_t a, b, r;
        if ((rc = str_find_or_add(t, s, la, &a)) || (rc = str_find_or_add(t, sp + 1, lb, &b)) ||
            (rc = str_find_or_add(t, cat, la + lb, &r))) {
            free(cat);
            free(merges);
            return zi_error_set(err, rc, "out of memory for merges");
        }
        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        merge_entry *e = merge_slot(t, key);
        if (e->key == MERGE_EMPTY) { /* the first (lowest) rank of a pair wins */
            e->key = key;
            e->rank = (int32_t)i;
            e->result = r;
        }
    }
    free(cat);
    free(merges);
    return ZI_OK;
}

int zi_tokenizer_load(const zi_gguf *g, zi_tokenizer **out, zi_error *err) {
    *out = NULL;
    zi_str model, pre = {"", 0};
    int rc = zi_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc) return rc;
    if (!zi_str_eq(model, "gpt2"))
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "tokenizer.ggml.model \"%.*s\" is not supported (only \"gpt2\", "
                            "byte-level BPE)",
                            (int)(model.len > 64 ? 64 : model.len), model.ptr);
    if (zi_gguf_find_kv(g, "tokenizer.ggml.pre")) {
        rc = zi_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
        if (rc) return rc;
    }
    int kind = -1;
    for (size_t i = 0; i < sizeof k_pretoks / sizeof *k_pretoks; i++) {
        if (zi_str_eq(pre, k_pretoks[i].name)) kind = (int)k_pretoks[i].kind;
    }
    if (kind < 0)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "tokenizer.ggml.pre \"%.*s\" is not a supported pre-tokenizer",
                            (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);

    zi_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return zi_error_set(err, ZI_ENOMEM, "out of memory for the tokenizer");
    t->pretok = (pretok_kind)kind;

    if ((rc = load_vocab(t, g, err)) || (rc = load_merges(t, g, err))) goto fail;

    for (unsigned b = 0; b < 256; b++) {
        unsigned char u[4];
        size_t ul = zi_utf8_encode(byte_to_cp(b), u);
        if ((rc = str_find_or_add(t, (const char *)u, ul, &t->byte_sid[b]))) {
            zi_error_set(err, rc, "out of memory for the byte table");
            goto fail;
        }
        char c = (char)b;
        int s = str_find(t, &c, 1);
        t->single_byte_tok[b] = s >= 0 && s < t->n_vocab ? s : -1;
    }

    if ((rc = read_token_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err)) ||
        (rc = read_token_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err)) ||
        (rc = read_token_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, err)) ||
        (rc = read_token_id(g, "tokenizer.ggml.padding_token_id", t->n_vocab, &t->pad, err)))
        goto fail;
    if ((rc = zi_gguf_get_bool_or(g, "tokenizer.ggml.add_bos_token", 0, &t->add_bos, err)) ||
        (rc = zi_gguf_get_bool_or(g, "tokenizer.ggml.add_eos_token", 0, &t->add_eos, err)))
        goto fail;
    if (t->add_bos && t->bos < 0) {
        rc = zi_error_set(err, ZI_EFORMAT,
                          "tokenizer.ggml.add_bos_token is true but there is no bos_token_id");
        goto fail;
    }
    if (t->add_eos && t->eos < 0) {
        rc = zi_error_set(err, ZI_EFORMAT,
                          "tokenizer.ggml.add_eos_token is true but there is no eos_token_id");
        goto fail;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;

    if ((rc = build_pieces(t, err))) goto fail;

    size_t n_special = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->attr[i] & (ATTR_CONTROL | ATTR_USER | ATTR_UNKNOWN)) n_special++;
    }
    t->special = malloc(sizeof *t->special * (n_special ? n_special : 1));
    t->cache = calloc(CACHE_SLOTS, sizeof *t->cache);
    if (!t->special || !t->cache) {
        rc = zi_error_set(err, ZI_ENOMEM, "out of memory for the tokenizer tables");
        goto fail;
    }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->attr[i] & (ATTR_CONTROL | ATTR_USER | ATTR_UNKNOWN)) t->special[t->n_special++] = i;
    }
    /* Longest text first, as llama.cpp tries them; ties by id for a stable
     * order. */
    qsort_r(t->special, t->n_special, sizeof *t->special, cmp_special, t);

    *out = t;
    return ZI_OK;
fail:
    zi_tokenizer_free(t);
    return rc;
}

void zi_tokenizer_free(zi_tokenizer *t) {
    if (!t) return;
    free(t->arena);
    free(t->str_off);
    free(t->str_len);
    free(t->str_hash);
    free(t->type);
    free(t->attr);
    free(t->eog);
    free(t->piece_arena);
    free(t->piece_off);
    free(t->piece_len);
    free(t->merges);
    free(t->special);
    free(t->cache);
    free(t->norm);
    free(t->frag_a);
    free(t->frag_b);
    free(t->syms);
    free(t->heap);
    free(t);
}

int32_t zi_tokenizer_vocab_size(const zi_tokenizer *t) {
    return t->n_vocab;
}
int32_t zi_tokenizer_bos(const zi_tokenizer *t) {
    return t->bos;
}
int32_t zi_tokenizer_eos(const zi_tokenizer *t) {
    return t->eos;
}

int zi_tokenizer_token_type(const zi_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return -1;
    return t->type[id];
}

int zi_tokenizer_is_eog(const zi_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

/* ------------------------------------------------------------------------ */
/* encoding */

static int idvec_push(idvec *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->v, sizeof *p * cap);
        if (!p) return ZI_ENOMEM;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = id;
    return ZI_OK;
}

static void heap_push(bpe_cand *h, size_t *n, bpe_cand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < c.rank || (h[p].rank == c.rank && h[p].left < c.left)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, size_t *n) {
    bpe_cand top = h[0];
    bpe_cand last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= *n) break;
        size_t m = l;
        if (l + 1 < *n && (h[l + 1].rank < h[l].rank ||
                           (h[l + 1].rank == h[l].rank && h[l + 1].left < h[l].left)))
            m = l + 1;
        if (last.rank < h[m].rank || (last.rank == h[m].rank && last.left < h[m].left)) break;
        h[i] = h[m];
        i = m;
    }
    h[i] = last;
    return top;
}

static void try_pair(const zi_tokenizer *t, bpe_cand *h, size_t *nh, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const merge_entry *e = merge_find(t, t->syms[l].sid, t->syms[r].sid);
    if (!e) return;
    bpe_cand c = {e->rank, l, r, t->syms[l].sid, t->syms[r].sid, e->result};
    heap_push(h, nh, c);
}

/* Runs BPE over one pre-token piece and appends its ids. */
static int bpe_piece(zi_tokenizer *t, const unsigned char *p, size_t n, idvec *out) {
    if (n == 1) {
        int32_t sid = t->byte_sid[p[0]];
        if (sid < t->n_vocab) return idvec_push(out, sid);
    }
    if (n > t->sym_cap) {
        size_t cap = t->sym_cap ? t->sym_cap : 256;
        while (cap < n) cap *= 2;
        bpe_sym *s = realloc(t->syms, sizeof *s * cap);
        if (!s) return ZI_ENOMEM;
        t->syms = s;
        t->sym_cap = cap;
    }
    /* Each merge adds at most two candidates; n-1 initial ones. */
    if (3 * n > t->heap_cap) {
        size_t cap = t->heap_cap ? t->heap_cap : 768;
        while (cap < 3 * n) cap *= 2;
        bpe_cand *h = realloc(t->heap, sizeof *h * cap);
        if (!h) return ZI_ENOMEM;
        t->heap = h;
        t->heap_cap = cap;
    }
    bpe_sym *sym = t->syms;
    for (size_t i = 0; i < n; i++) {
        sym[i].sid = t->byte_sid[p[i]];
        sym[i].prev = (int32_t)i - 1;
        sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(t, t->heap, &nh, (int32_t)i, (int32_t)i + 1);
    while (nh > 0) {
        bpe_cand c = heap_pop(t->heap, &nh);
        bpe_sym *l = &sym[c.left], *r = &sym[c.right];
        /* Stale when either side has been merged since it was queued. */
        if (l->sid != c.lsid || r->sid != c.rsid || l->next != c.right) continue;
        l->sid = c.result;
        r->sid = -1;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = c.left;
        try_pair(t, t->heap, &nh, l->prev, c.left);
        try_pair(t, t->heap, &nh, c.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        int32_t sid = sym[i].sid;
        if (sid < t->n_vocab) {
            if (idvec_push(out, sid)) return ZI_ENOMEM;
            continue;
        }
        /* Not a token: llama.cpp falls back to single-byte tokens over the
         * mapped text, dropping bytes that have none. */
        const unsigned char *s = (const unsigned char *)t->arena + t->str_off[sid];
        for (uint32_t k = 0; k < t->str_len[sid]; k++) {
            int32_t tok = t->single_byte_tok[s[k]];
            if (tok >= 0 && idvec_push(out, tok)) return ZI_ENOMEM;
        }
    }
    return ZI_OK;
}

static int encode_piece(zi_tokenizer *t, const unsigned char *p, size_t n, idvec *out) {
    if (n > CACHE_KEY_MAX) return bpe_piece(t, p, n, out);
    uint32_t h = hash_bytes(p, n);
    cache_slot *slot = &t->cache[h & (CACHE_SLOTS - 1)];
    if (slot->klen == n && slot->hash == h && memcmp(slot->key, p, n) == 0) {
        for (size_t i = 0; i < slot->nids; i++) {
            if (idvec_push(out, slot->ids[i])) return ZI_ENOMEM;
        }
        return ZI_OK;
    }
    size_t before = out->n;
    int rc = bpe_piece(t, p, n, out);
    if (rc) return rc;
    size_t nids = out->n - before;
    if (nids <= CACHE_IDS_MAX) {
        slot->hash = h;
        slot->klen = (uint8_t)n;
        slot->nids = (uint8_t)nids;
        memcpy(slot->key, p, n);
        if (nids) memcpy(slot->ids, out->v + before, nids * sizeof(int32_t));
    }
    return ZI_OK;
}

/* ---- pre-tokenizer ---- */

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

/* Splits clean UTF-8 text s[0..n) into pre-token pieces and BPE-encodes
 * each. */
static int encode_clean(zi_tokenizer *t, const unsigned char *s, size_t n, idvec *out) {
    scanner sc = {s, n, t->pretok == PRETOK_DIGITS_GPT2};
    size_t pos = 0;
    while (pos < n) {
        uint32_t cp;
        size_t len = zi_utf8_decode(s + pos, n - pos, &cp);
        uint16_t f = zi_unicode_flags(cp);
        size_t end;
        if (sc.digits_split && (f & ZI_UC_NUMBER))
            end = pos + len;
        else
            end = gpt2_match(&sc, pos, cp, len, f);
        int rc = encode_piece(t, s + pos, end - pos, out);
        if (rc) return rc;
        pos = end;
    }
    return ZI_OK;
}

/* Encodes one raw fragment: normalises it first when it holds bytes that
 * do not survive llama.cpp's decode/re-encode round trip unchanged. */
static int encode_raw(zi_tokenizer *t, const unsigned char *s, size_t n, idvec *out) {
    size_t i = 0;
    int clean = 1;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t l = zi_utf8_decode(s + i, n - i, &cp);
        unsigned char u[4];
        /* Same length means same bytes; an invalid byte decodes to U+FFFD
         * from one byte and an overlong form to a shorter encoding. */
        if (zi_utf8_encode(cp, u) != l) {
            clean = 0;
            break;
        }
        i += l;
    }
    if (clean) return encode_clean(t, s, n, out);

    /* Every input byte yields at most 3 output bytes (U+FFFD). */
    if (n > (SIZE_MAX - 16) / 3) return ZI_ERANGE;
    if (3 * n > t->norm_cap) {
        unsigned char *b = realloc(t->norm, 3 * n);
        if (!b) return ZI_ENOMEM;
        t->norm = b;
        t->norm_cap = 3 * n;
    }
    size_t m = 0;
    for (i = 0; i < n;) {
        uint32_t cp;
        size_t l = zi_utf8_decode(s + i, n - i, &cp);
        m += zi_utf8_encode(cp, t->norm + m);
        i += l;
    }
    return encode_clean(t, t->norm, m, out);
}

static int frag_reserve(zi_tokenizer *t, size_t need) {
    if (need <= t->frag_cap) return ZI_OK;
    size_t cap = t->frag_cap ? t->frag_cap : 16;
    while (cap < need) cap *= 2;
    fragment *a = realloc(t->frag_a, sizeof *a * cap);
    if (!a) return ZI_ENOMEM;
    t->frag_a = a;
    fragment *b = realloc(t->frag_b, sizeof *b * cap);
    if (!b) return ZI_ENOMEM;
    t->frag_b = b;
    t->frag_cap = cap;
    return ZI_OK;
}

/* Special-token partition; returns the fragment count (in t->frag_a) or a
 * negative status. */
static long partition(zi_tokenizer *t, const char *text, size_t len, int parse_special) {
    if (frag_reserve(t, 1)) return ZI_ENOMEM;
    t->frag_a[0] = (fragment){0, len, -1};
    size_t nf = 1;
    for (size_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        if (!parse_special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN))) continue;
        const char *tt = t->arena + t->str_off[id];
        size_t tl = t->str_len[id];
        size_t nb = 0;
        for (size_t f = 0; f < nf; f++) {
            fragment fr = t->frag_a[f];
            if (fr.token >= 0 || fr.len < tl) {
                if (frag_reserve(t, nb + 1)) return ZI_ENOMEM;
                t->frag_b[nb++] = fr;
                continue;
            }
            size_t pos = fr.off, end = fr.off + fr.len;
            for (;;) {
                const char *hit = memmem(text + pos, end - pos, tt, tl);
                if (!hit) break;
                size_t at = (size_t)(hit - text);
                if (frag_reserve(t, nb + 2)) return ZI_ENOMEM;
                if (at > pos) t->frag_b[nb++] = (fragment){pos, at - pos, -1};
                t->frag_b[nb++] = (fragment){at, tl, id};
                pos = at + tl;
            }
            if (pos < end) {
                if (frag_reserve(t, nb + 1)) return ZI_ENOMEM;
                t->frag_b[nb++] = (fragment){pos, end - pos, -1};
            }
        }
        fragment *tmp = t->frag_a;
        t->frag_a = t->frag_b;
        t->frag_b = tmp;
        nf = nb;
    }
    return (long)nf;
}

int zi_tokenizer_encode(zi_tokenizer *t, const char *text, size_t len, int add_special,
                        int parse_special, int32_t **ids, size_t *n, zi_error *err) {
    *ids = NULL;
    *n = 0;
    if (!text && len > 0) return zi_error_set(err, ZI_EINVAL, "encode: text is NULL");
    if (len > ((size_t)1 << 31))
        return zi_error_set(err, ZI_ERANGE, "encode: text of %zu bytes exceeds 2 GiB", len);
    idvec out = {NULL, 0, 0};
    int rc = ZI_OK;
    if (add_special && t->add_bos) rc = idvec_push(&out, t->bos);
    if (!rc && len > 0) {
        long nf = partition(t, text, len, parse_special);
        if (nf < 0) rc = (int)nf;
        for (long f = 0; !rc && f < nf; f++) {
            fragment fr = t->frag_a[f];
            if (fr.token >= 0)
                rc = idvec_push(&out, fr.token);
            else
                rc = encode_raw(t, (const unsigned char *)text + fr.off, fr.len, &out);
        }
    }
    if (!rc && add_special && t->add_eos) rc = idvec_push(&out, t->eos);
    if (rc) {
        free(out.v);
        return zi_error_set(err, rc, "encode: %s while encoding %zu bytes", zi_status_name(rc),
                            len);
    }
    if (!out.v) { /* an empty result is still a valid allocation */
        out.v = malloc(sizeof(int32_t));
        if (!out.v) return zi_error_set(err, ZI_ENOMEM, "encode: out of memory");
    }
    *ids = out.v;
    *n = out.n;
    return ZI_OK;
}

/* ------------------------------------------------------------------------ */
/* decoding */

static int piece_of(const zi_tokenizer *t, int32_t id, int special, const char **p, size_t *n) {
    if (id < 0 || id >= t->n_vocab) return -1;
    if (!special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN))) {
        *p = "";
        *n = 0;
        return 0;
    }
    *p = t->piece_arena ? t->piece_arena + t->piece_off[id] : "";
    *n = t->piece_len[id];
    return 0;
}

int zi_tokenizer_token_bytes(const zi_tokenizer *t, int32_t id, int special, char *buf,
                             size_t cap) {
    const char *p;
    size_t n;
    if (piece_of(t, id, special, &p, &n)) return -1;
    if (cap > 0 && n > 0) memcpy(buf, p, n < cap ? n : cap);
    return (int)n;
}

int zi_tokenizer_decode(const zi_tokenizer *t, const int32_t *ids, size_t n, int special,
                        char **out, size_t *len, zi_error *err) {
    *out = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t l;
        if (piece_of(t, ids[i], special, &p, &l))
            return zi_error_set(err, ZI_EINVAL, "decode: ids[%zu] = %d is outside the vocabulary",
                                i, (int)ids[i]);
        total += l;
    }
    char *s = malloc(total + 1);
    if (!s) return zi_error_set(err, ZI_ENOMEM, "decode: out of memory for %zu bytes", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = "";
        size_t l = 0;
        piece_of(t, ids[i], special, &p, &l);
        memcpy(s + k, p, l);
        k += l;
    }
    s[k] = '\0';
    *out = s;
    *len = k;
    return ZI_OK;
}

void zi_detok_init(zi_detok *d) {
    memset(d, 0, sizeof *d);
}

/* Bytes at the end of s[0..n) that begin a UTF-8 character still missing
 * continuation bytes (0 when the text ends on a character boundary). */
static size_t incomplete_tail(const unsigned char *s, size_t n) {
    size_t k = 0;
    while (k < n && k < 3 && (s[n - 1 - k] & 0xC0) == 0x80) k++;
    if (k == n) return 0; /* only continuation bytes: nothing to wait for */
    unsigned char lead = s[n - 1 - k];
    size_t want = zi_utf8_lead_len(lead);
    if (want >= 2 && want > k + 1) return k + 1;
    return 0;
}

int zi_detok_push(zi_detok *d, const zi_tokenizer *t, int32_t id, int special, char *out,
                  size_t cap) {
    const char *p;
    size_t n;
    if (piece_of(t, id, special, &p, &n)) return -1;
    size_t total = d->n_pending + n;
    if (cap == 0) return -1;
    /* Decide what to hold back by looking at the last few bytes of the
     * concatenation pending + piece. */
    unsigned char tail[8];
    size_t tn = total < 4 ? total : 4;
    for (size_t i = 0; i < tn; i++) {
        size_t at = total - tn + i;
        tail[i] = at < d->n_pending ? d->pending[at] : (unsigned char)p[at - d->n_pending];
    }
    size_t hold = incomplete_tail(tail, tn);
    size_t emit = total - hold;
    if (emit + 1 > cap) return -1;
    size_t from_pending = emit < d->n_pending ? emit : d->n_pending;
    memcpy(out, d->pending, from_pending);
    memcpy(out + from_pending, p, emit - from_pending);
    out[emit] = '\0';
    /* Keep the held bytes (they come from the piece and maybe pending). */
    unsigned char keep[8];
    for (size_t i = 0; i < hold; i++) {
        size_t at = emit + i;
        keep[i] = at < d->n_pending ? d->pending[at] : (unsigned char)p[at - d->n_pending];
    }
    memcpy(d->pending, keep, hold);
    d->n_pending = hold;
    return (int)emit;
}

int zi_detok_flush(zi_detok *d, char *out, size_t cap) {
    if (d->n_pending + 1 > cap) return -1;
    memcpy(out, d->pending, d->n_pending);
    out[d->n_pending] = '\0';
    int n = (int)d->n_pending;
    d->n_pending = 0;
    return n;
}
