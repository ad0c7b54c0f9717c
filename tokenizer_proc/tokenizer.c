/*
 * tokenizer.c - byte-level BPE tokenizer reproducing llama.cpp's ids (see
 * tokenizer.h for the interface): loading a GGUF file's tokenizer.
 *
 * Encoding runs in four stages, each mirroring what llama.cpp does for a
 * "gpt2"-model GGUF file (tokenizer_impl.h maps the files):
 *
 *  1. Special-token partition (tokenizer_encode.c). Control/unknown tokens
 *     (only when parse_special is set) and user-defined tokens (always) are
 *     searched for in the raw text, longest text first.
 *  2. Normalisation of each raw fragment to what llama.cpp's decode and
 *     re-encode to codepoints makes of it (tokenizer_encode.c).
 *  3. Pre-tokenization by a hand-written scanner, no regex engine
 *     (tokenizer_pretok.c).
 *  4. BPE on each piece over the GPT-2 byte-to-unicode mapping, by merge
 *     rank (tokenizer_bpe.c).
 *
 * Decoding looks up bytes precomputed per token (tokenizer_decode.c).
 *
 * This file builds what all of them read: every token text and every string
 * a merge names goes into one string table, so each has a "string id" (sid):
 * sids below n_vocab are token ids; a merge part or result that is not in
 * the vocabulary gets a sid above it. The tokens' attributes come from their
 * GGUF type plus llama.cpp's by-text fixups (the tables below).
 */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keypath.h" /* zi_printable */
#include "tokenizer_impl.h"
#include "unicode.h"

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
    "</s>", /* unless <|tool_response> or <|plamo:eos|> is one too (fix_eog) */
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
    /* DeepSeek's; parenthesised so that clang's -Wstring-concatenation
     * sees the split literal is one element (the -Dfuzz=true build) */
    ("<\xef\xbd\x9c"
     "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"),
    "[e~[",
};

/* FIM tokens llama.cpp marks as control by their text. */
static const char *const k_control_texts[] = {
    "<|fim_prefix|>",  "<fim-prefix>",    "<fim_prefix>",   "<PRE>",        "<|code_prefix|>",
    "<|prefix|>",      "<|fim_suffix|>",  "<fim-suffix>",   "<fim_suffix>", "<SUF>",
    "<|code_suffix|>", "<|suffix|>",      "<|fim_middle|>", "<fim-middle>", "<fim_middle>",
    "<MID>",           "<|code_middle|>", "<|middle|>",     "<PAD>",        "[PAD]",
};

/* The attributes of each GGUF token type (ZI_TOKEN_*); an undefined type
 * gets none. */
static const uint8_t k_type_attr[] = {
    [ZI_TOKEN_NORMAL] = TOK_ATTR_NORMAL,   [ZI_TOKEN_UNKNOWN] = TOK_ATTR_UNKNOWN,
    [ZI_TOKEN_CONTROL] = TOK_ATTR_CONTROL, [ZI_TOKEN_USER_DEFINED] = TOK_ATTR_USER,
    [ZI_TOKEN_UNUSED] = TOK_ATTR_UNUSED,   [ZI_TOKEN_BYTE] = TOK_ATTR_BYTE,
};

/* ------------------------------------------------------------------------ */
/* GPT-2 byte-to-unicode mapping: printable Latin-1 bytes stand for
 * themselves, the others are shifted to U+0100 and up in byte order. */

static int maps_to_itself(uint32_t b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static uint32_t byte_to_cp(unsigned b) {
    if (maps_to_itself(b)) return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++) {
        if (!maps_to_itself(c)) n++;
    }
    return 256 + n;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return maps_to_itself(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1; /* 68 bytes are shifted */
    uint32_t n = cp - 256;
    for (unsigned c = 0; c < 256; c++) {
        if (!maps_to_itself(c)) {
            if (n == 0) return (int)c;
            n--;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------------ */
/* string table */

int32_t tok_str_find(const zi_tokenizer *t, const char *s, size_t n) {
    return tok_str_find_hashed(t, s, n, tok_hash_bytes(s, n));
}

int32_t tok_str_find_hashed(const zi_tokenizer *t, const char *s, size_t n, uint32_t h) {
    uint32_t i = h & t->str_hash_mask;
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
    uint32_t i = tok_hash_bytes(s, n) & t->str_hash_mask;
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

int tok_reserve_bytes(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return ZI_OK;
    size_t c = *cap ? *cap : 65536;
    while (c < need) c *= 2;
    char *q = realloc(*p, c);
    if (!q) return ZI_ENOMEM;
    *p = q;
    *cap = c;
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
    if (tok_reserve_bytes(&t->arena, &t->arena_cap, t->arena_len + n)) return ZI_ENOMEM;
    memcpy(t->arena + t->arena_len, s, n);
    int32_t sid = t->n_strings++;
    t->str_off[sid] = t->arena_len;
    t->str_len[sid] = (uint32_t)n;
    t->arena_len += n;

    str_insert(t, sid);
    *sid_out = sid;
    return ZI_OK;
}

int tok_str_find_or_add(zi_tokenizer *t, const char *s, size_t n, int32_t *sid) {
    int32_t found = tok_str_find(t, s, n);
    if (found >= 0) {
        *sid = found;
        return ZI_OK;
    }
    return str_add(t, s, n, sid);
}

/* ------------------------------------------------------------------------ */
/* loading */

static int in_list(const char *s, size_t n, const char *const *list, size_t count) {
    for (size_t i = 0; i < count; i++) {
        if (strlen(list[i]) == n && memcmp(list[i], s, n) == 0) return 1;
    }
    return 0;
}

/* A token id the file may give (*out = dflt when the key is absent, or -1
 * when dflt is outside the vocabulary, as llama.cpp drops such a default). */
static int read_token_id(const zi_gguf *g, const char *key, int32_t n_vocab, int32_t dflt,
                         int32_t *out, zi_error *err) {
    *out = dflt < n_vocab ? dflt : -1;
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
    if (n_toks == 0 || n_toks > TOK_MAX_VOCAB) {
        free(toks);
        return zi_error_set(err, n_toks ? ZI_ERANGE : ZI_EFORMAT,
                            "tokenizer.ggml.tokens has %llu entries (limit %u)",
                            (unsigned long long)n_toks, TOK_MAX_VOCAB);
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
        if (n > TOK_MAX_TOKEN_BYTES) {
            free(toks);
            return zi_error_set(err, ZI_ERANGE,
                                "tokenizer.ggml.tokens[%llu] is %zu bytes (limit %u)",
                                (unsigned long long)i, n, TOK_MAX_TOKEN_BYTES);
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
        t->attr[i] = ty >= 0 && ty < (int32_t)(sizeof k_type_attr / sizeof *k_type_attr)
                         ? k_type_attr[ty]
                         : 0;
        if (in_list(s, n, k_eog_texts, sizeof k_eog_texts / sizeof *k_eog_texts)) {
            t->eog[i] = 1;
            t->attr[i] |= TOK_ATTR_CONTROL;
        } else if (in_list(s, n, k_control_texts,
                           sizeof k_control_texts / sizeof *k_control_texts)) {
            t->attr[i] |= TOK_ATTR_CONTROL;
        }
    }
    free(toks);
    return ZI_OK;
}

/* The end-of-generation token whose text is s, or -1. */
static int32_t eog_by_text(const zi_tokenizer *t, const char *s) {
    int32_t id = tok_str_find(t, s, strlen(s));
    return id >= 0 && id < t->n_vocab && t->eog[id] ? id : -1;
}

/* gpt-oss's (o200k_harmony's) message markers: llama.cpp makes these
 * user-defined whatever the file says, in every vocabulary that has them,
 * so that they are always rendered when decoding (the server parses the
 * channels out of the text) and always matched when encoding, even
 * without special-token parsing. */
static const char *const k_user_texts[] = {"<|channel|>", "<|message|>", "<|start|>",
                                           "<|constrain|>"};

/* llama.cpp's exceptions to its end-of-generation list: with <|return|>
 * and <|call|> (gpt-oss) or <|call|>/<|calls|> and <|flush|> (solar-open)
 * also in it, <|end|> is only user-defined; with <|tool_response> (Gemma 4)
 * or <|plamo:eos|> in it, </s> is a normal token. The k_user_texts come
 * first, as there. */
static void fix_eog(zi_tokenizer *t) {
    for (size_t i = 0; i < sizeof k_user_texts / sizeof *k_user_texts; i++) {
        int32_t id = tok_str_find(t, k_user_texts[i], strlen(k_user_texts[i]));
        if (id >= 0 && id < t->n_vocab) t->attr[id] = TOK_ATTR_USER;
    }
    int32_t end = eog_by_text(t, "<|end|>"), s = eog_by_text(t, "</s>");
    int call = eog_by_text(t, "<|call|>") >= 0 || eog_by_text(t, "<|calls|>") >= 0;
    if (end >= 0 && call &&
        (eog_by_text(t, "<|return|>") >= 0 || eog_by_text(t, "<|flush|>") >= 0)) {
        t->eog[end] = 0;
        t->attr[end] = TOK_ATTR_USER;
    }
    if (s >= 0 &&
        (eog_by_text(t, "<|tool_response>") >= 0 || eog_by_text(t, "<|plamo:eos|>") >= 0)) {
        t->eog[s] = 0;
        t->attr[s] = TOK_ATTR_NORMAL;
    }
}

/* Sets the attribute bit on the token whose text is s (if any) or clears
 * it. */
static void set_attr_by_text(zi_tokenizer *t, const char *s, uint8_t bit, int on) {
    int32_t id = tok_str_find(t, s, strlen(s));
    if (id < 0 || id >= t->n_vocab) return;
    t->attr[id] = on ? (uint8_t)(t->attr[id] | bit) : (uint8_t)(t->attr[id] & ~bit);
}

static char lower_ascii(char c) {
    return c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
}

/* True when the string value of key contains needle (lowercase ASCII);
 * with fold, the value's ASCII letters are lowercased first, as llama.cpp
 * lowercases general.name (only). */
static int kv_contains(const zi_gguf *g, const char *key, const char *needle, int fold) {
    const zi_gguf_kv *kv = zi_gguf_find_kv(g, key);
    if (!kv || kv->type != ZI_GGUF_STRING) return 0; /* optional, as in llama.cpp */
    size_t n = (size_t)kv->str.len, m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++) {
        size_t k = 0;
        while (k < m && (fold ? lower_ascii(kv->str.ptr[i + k]) : kv->str.ptr[i + k]) == needle[k])
            k++;
        if (k == m) return 1;
    }
    return 0;
}

/* llama.cpp's per-model token attributes, in its order (the first rule
 * that applies): the mask token drops whitespace before it (LSTRIP) for
 * tokenizer.ggml.pre jina-v2-de/-es/-code and general.architecture
 * nomic-bert-moe/jina-bert-v3 ("<mask>") and for a general.name containing
 * "modern-bert" ("[MASK]"); for a name containing "phi-3" or "phi3"
 * (case-insensitive), whitespace after a special token is dropped
 * (RSTRIP), except after <unk>, <s> and <|endoftext|>; </s> is RSTRIP too. */
static void set_strip_attrs(zi_tokenizer *t, const zi_gguf *g) {
    static const char *const mask_pre[] = {"jina-v2-de", "jina-v2-es", "jina-v2-code"};
    int mask = kv_contains(g, "general.architecture", "nomic-bert-moe", 0) ||
               kv_contains(g, "general.architecture", "jina-bert-v3", 0);
    for (size_t i = 0; i < 3; i++) mask |= kv_contains(g, "tokenizer.ggml.pre", mask_pre[i], 0);
    if (mask) {
        set_attr_by_text(t, "<mask>", TOK_ATTR_LSTRIP, 1);
        return;
    }
    if (kv_contains(g, "general.name", "phi-3", 1) || kv_contains(g, "general.name", "phi3", 1)) {
        for (size_t k = 0; k < t->n_special; k++) t->attr[t->special[k]] |= TOK_ATTR_RSTRIP;
        set_attr_by_text(t, "</s>", TOK_ATTR_RSTRIP, 1);
        set_attr_by_text(t, "<unk>", TOK_ATTR_RSTRIP, 0);
        set_attr_by_text(t, "<s>", TOK_ATTR_RSTRIP, 0);
        set_attr_by_text(t, "<|endoftext|>", TOK_ATTR_RSTRIP, 0);
    } else if (kv_contains(g, "general.name", "modern-bert", 1)) {
        set_attr_by_text(t, "[MASK]", TOK_ATTR_LSTRIP, 1);
    }
}

int zi_tokenizer_load_vocab(const zi_gguf *g, zi_tokenizer **out, zi_error *err) {
    return tok_load(g, NULL, out, err);
}

int tok_load(const zi_gguf *g, const tok_pretok_ops *pretok_ops, zi_tokenizer **out,
             zi_error *err) {
    *out = NULL;
    zi_str model, pre = {"", 0};
    int rc = zi_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc) return rc;
    tok_model mk;
    if (zi_str_eq(model, "gpt2"))
        mk = TOK_MODEL_BPE;
    else if (zi_str_eq(model, "llama"))
        mk = TOK_MODEL_SPM;
    else if (zi_str_eq(model, "bert"))
        mk = TOK_MODEL_WPM;
    else {
        /* The value is the file's: quoted as printable ASCII so that a
         * newline or invalid UTF-8 in it cannot break the one-line message
         * (found by tests/fuzz/fuzz_tokenizer.c). */
        char shown[80];
        zi_printable(shown, sizeof shown, model.ptr, model.len);
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "tokenizer.ggml.model \"%s\" is not supported (only \"gpt2\", "
                            "byte-level BPE, \"llama\", SentencePiece-style, and \"bert\", "
                            "WordPiece)",
                            shown);
    }
    int kind = 0;
    if (mk == TOK_MODEL_BPE && pretok_ops) { /* llama.cpp ignores the key for SPM */
        if (zi_gguf_find_kv(g, "tokenizer.ggml.pre")) {
            rc = zi_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
            if (rc) return rc;
        }
        kind = pretok_ops->lookup(pre);
        if (kind < 0) {
            char shown[80]; /* printable, one line (as for the model above) */
            zi_printable(shown, sizeof shown, pre.ptr, pre.len);
            return zi_error_set(err, ZI_EUNSUPPORTED,
                                "tokenizer.ggml.pre \"%s\" is not a supported pre-tokenizer",
                                shown);
        }
    }

    zi_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return zi_error_set(err, ZI_ENOMEM, "out of memory for the tokenizer");
    t->model = mk;
    t->pretok_ops = pretok_ops;
    if (mk == TOK_MODEL_BPE && pretok_ops && (rc = pretok_ops->init(t, pre, err))) goto fail;

    if ((rc = load_vocab(t, g, err))) goto fail;
    if ((rc = mk == TOK_MODEL_SPM   ? tok_spm_load(t, g, err)
              : mk == TOK_MODEL_WPM ? tok_wpm_load(t, g, err)
                                    : tok_load_merges(t, g, err)))
        goto fail;

    /* SPM needs no GPT-2 byte strings (and must not look them up). */
    for (unsigned b = 0; b < 256 && mk == TOK_MODEL_BPE; b++) {
        unsigned char u[4];
        size_t ul = zi_utf8_encode(byte_to_cp(b), u);
        if ((rc = tok_str_find_or_add(t, (const char *)u, ul, &t->byte_sid[b]))) {
            zi_error_set(err, rc, "out of memory for the byte table");
            goto fail;
        }
        char c = (char)b;
        int32_t s = tok_str_find(t, &c, 1);
        t->single_byte_tok[b] = s >= 0 && s < t->n_vocab ? s : -1;
    }

    /* llama.cpp's defaults: SPM files have <unk> <s> </s> as ids 0 1 2, add
     * BOS and put a space before the text; WPM ("bert") files have [PAD]
     * [UNK] [CLS] [SEP] as 0 100 101 102, [CLS] being BOS, and no EOS. */
    int spm = mk == TOK_MODEL_SPM, wpm = mk == TOK_MODEL_WPM;
    if ((rc = read_token_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab,
                            spm   ? 1
                            : wpm ? 101
                                  : -1,
                            &t->bos, err)) ||
        (rc = read_token_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, spm ? 2 : -1, &t->eos,
                            err)) ||
        (rc = read_token_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab,
                            spm   ? 0
                            : wpm ? 100
                                  : -1,
                            &t->unk, err)) ||
        (rc = read_token_id(g, "tokenizer.ggml.seperator_token_id", t->n_vocab, wpm ? 102 : -1,
                            &t->sep, err)) ||
        (rc = read_token_id(g, "tokenizer.ggml.padding_token_id", t->n_vocab, wpm ? 0 : -1, &t->pad,
                            err)))
        goto fail;
    /* The default of add_bos_token: SPM and WPM files add BOS; for BPE,
     * what the pre-tokenizer set (tok_pretok_init: the Llama 3 group adds
     * it). (WPM encoding adds BOS and SEP whatever the keys say.) */
    if ((rc = zi_gguf_get_bool_or(g, "tokenizer.ggml.add_bos_token",
                                  spm || wpm || (t->add_bos && t->bos >= 0), &t->add_bos, err)) ||
        (rc = zi_gguf_get_bool_or(g, "tokenizer.ggml.add_eos_token", 0, &t->add_eos, err)) ||
        (rc = zi_gguf_get_bool_or(g, "tokenizer.ggml.add_sep_token", wpm, &t->add_sep, err)) ||
        (rc = zi_gguf_get_bool_or(g, "tokenizer.ggml.add_space_prefix", spm, &t->add_space_prefix,
                                  err)))
        goto fail;
    if (wpm && (t->bos < 0 || t->sep < 0)) {
        rc = zi_error_set(err, ZI_EFORMAT,
                          "a \"bert\" vocabulary needs tokenizer.ggml.bos_token_id and "
                          "seperator_token_id (defaults 101 and 102 are outside its %d tokens)",
                          t->n_vocab);
        goto fail;
    }
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
    fix_eog(t);

    if ((rc = tok_build_pieces(t, err))) goto fail;

    size_t n_special = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER | TOK_ATTR_UNKNOWN)) n_special++;
    }
    t->special = malloc(sizeof *t->special * (n_special ? n_special : 1));
    t->cache = calloc(TOK_CACHE_SLOTS, sizeof *t->cache);
    if (!t->special || !t->cache) {
        rc = zi_error_set(err, ZI_ENOMEM, "out of memory for the tokenizer tables");
        goto fail;
    }
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->attr[i] & (TOK_ATTR_CONTROL | TOK_ATTR_USER | TOK_ATTR_UNKNOWN))
            t->special[t->n_special++] = i;
    }
    /* Longest text first, as llama.cpp tries them; ties by id for a stable
     * order. */
    qsort_r(t->special, t->n_special, sizeof *t->special, cmp_special, t);
    set_strip_attrs(t, g);

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
    free(t->score);
    free(t->spm_text);
    free(t->spm_syms);
    free(t->spm_heap);
    free(t->wpm_word);
    free(t->wpm_hash);
    if (t->pretok_ops) t->pretok_ops->free(t);
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

void zi_tokenizer_pair_markers(const zi_tokenizer *t, int32_t *bos, int32_t *eos, int32_t *sep) {
    *bos = t->add_bos ? t->bos : -1;
    *eos = t->add_eos ? (t->eos >= 0 ? t->eos : t->sep) : -1;
    *sep = t->add_sep ? t->sep : -1;
}

int zi_tokenizer_token_type(const zi_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return -1;
    return t->type[id];
}

int zi_tokenizer_is_eog(const zi_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

int zi_tokenizer_eog_ids(const zi_tokenizer *t, zi_i32_list *out, zi_error *err) {
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->eog[id] && zi_i32_list_push(out, id, err)) return err->code;
    return ZI_OK;
}
