/*
 * tokenizer.h - the tokenizer built from a GGUF file's metadata: byte-level
 * BPE ("gpt2"), SentencePiece-style ("llama") and WordPiece ("bert")
 * vocabularies.
 *
 * A library: the tokenizer process links it, and so does the `zinfer`
 * command for in-process use. It reads tokenizer.ggml.{model, pre, tokens,
 * token_type, merges, scores, bos/eos/unknown/padding ids, add_bos_token,
 * add_eos_token, add_space_prefix} (and general.name, for llama.cpp's
 * per-model token attributes) and reproduces llama.cpp's tokenization of
 * the same file exactly: special-token partitioning, then for "gpt2" the
 * pre-tokenizer the file names (tokenizer.ggml.pre) and BPE merges by rank
 * over the GPT-2 byte-to-unicode mapping; for "llama" the whole fragment,
 * spaces escaped as U+2581, merged pairwise by token score with byte
 * fallback to <0xXX> tokens; for "bert" the BERT normaliser (lowercase,
 * accents stripped, punctuation and CJK split off) and greedy
 * longest-token words with [UNK] (tokenizer_wpm.c).
 *
 * A zi_tokenizer is immutable after loading except for an internal cache of
 * pre-token results; it is NOT safe to call encode from several threads on
 * one tokenizer at once. It does not keep a reference to the zi_gguf.
 */
#ifndef ZI_TOKENIZER_H
#define ZI_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "types.h"
#include "zi_error.h"

typedef struct zi_tokenizer zi_tokenizer;

/* The longest token text a file may define; zi_tokenizer_load refuses
 * longer ones, so ZI_TOKEN_MAX_BYTES + 8 bytes always hold one token's
 * decoded text plus any held-back partial character. */
#define ZI_TOKEN_MAX_BYTES 16384

/* Token types as GGUF stores them in tokenizer.ggml.token_type. */
enum {
    ZI_TOKEN_NORMAL = 1,
    ZI_TOKEN_UNKNOWN = 2,
    ZI_TOKEN_CONTROL = 3,
    ZI_TOKEN_USER_DEFINED = 4,
    ZI_TOKEN_UNUSED = 5,
    ZI_TOKEN_BYTE = 6,
};

/* Builds the tokenizer. ZI_EUNSUPPORTED (naming the value) for a tokenizer
 * model other than "gpt2" (byte-level BPE), "llama" (SentencePiece-style)
 * and "bert" (WordPiece; tokenizer.ggml.pre is read for neither of the
 * last two), or a pre-tokenizer it does not
 * implement. "llama" files get llama.cpp's defaults for keys they lack: bos
 * 1, eos 2, unknown 0 (each only when inside the vocabulary), add_bos_token
 * and add_space_prefix true; scores 0 when tokenizer.ggml.scores is absent
 * (float32 or int32, at least one per token, else ZI_EFORMAT). "bert"
 * files get [PAD] 0, [UNK] 100, [CLS] 101 as BOS and [SEP] 102
 * (tokenizer.ggml.seperator_token_id, llama.cpp's spelling), and
 * tokenizer.ggml.normalizer.lowercase (default true) and .strip_accents
 * (default: as lowercase); ZI_EFORMAT when BOS or SEP is outside the
 * vocabulary. A byte with
 * neither a <0xXX> token nor a one-byte token is not refused at load, as
 * llama.cpp does not refuse it: encoding text that needs it fails.
 * Implemented tokenizer.ggml.pre values of "gpt2" files, as llama.cpp
 * defines them (names are case-sensitive):
 *  - the GPT-2 pattern: "gpt-2" ("gpt2" is accepted as an alias), "mpt",
 *    "olmo", "phi-2", "jais", "trillion", "granite-docling", "exaone4",
 *    "gigachat", "a.x-4.0", "mellum", "modern-bert", "jina-es", "jina-de",
 *    "jina-v2-es", "jina-v2-de";
 *  - each \p{N} codepoint split off first, then the GPT-2 pattern:
 *    "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
 *    "minerva-7b", "mellum2";
 *  - Llama 3's pattern: "llama-bpe", "llama3", "llama-v3", "falcon3",
 *    "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano" (with
 *    llama.cpp's ignore_merges: a piece that is a token is that token; and,
 *    as there, add_bos_token defaults to true when the file has a BOS id
 *    but no such key) and "dbrx", "smaug-bpe" (without either);
 *  - Qwen 2's (Llama 3's with single digits): "qwen2", "deepseek-r1-qwen",
 *    "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open";
 *    and "qwen35" (combining marks join letter runs);
 *  - GPT-4o's (o200k; gpt-oss files carry it too), letter runs split by
 *    ASCII case: "gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2";
 *  - regex lists: "falcon", "deepseek-llm", "deepseek-coder", and
 *    llama.cpp's default set for "default" or a missing key (GPT-NeoX,
 *    Aquila files).
 * Other llama.cpp names (e.g. "tekken", "chatglm-bpe", "bloom") are
 * refused. Whatever the pre-tokenizer, tokens named <|channel|>,
 * <|message|>, <|start|> and <|constrain|> are user-defined, as llama.cpp
 * makes gpt-oss's markers. ZI_EFORMAT for inconsistent
 * metadata (a merge without a space separating two parts, special token ids
 * out of range, token_type and tokens of different lengths, add_bos_token
 * without a bos id). Merge parts or results that are not tokens are
 * accepted, as llama.cpp accepts them (such a leftover symbol becomes
 * single-byte tokens). */
int zi_tokenizer_load(const zi_gguf *g, zi_tokenizer **out, zi_error *err);
/* The vocabulary half alone: every token's text, type, bytes and the
 * special ids, as zi_tokenizer_load reads them, without the pre-tokenizer
 * (tokenizer.ggml.pre is not read, no regex is compiled). Enough to decode
 * and to give token bytes (the worker's structured output); encoding
 * refuses (ZI_EINVAL). Built from the library zi_vocab, which links no
 * regex engine. */
int zi_tokenizer_load_vocab(const zi_gguf *g, zi_tokenizer **out, zi_error *err);
void zi_tokenizer_free(zi_tokenizer *tok);

int32_t zi_tokenizer_vocab_size(const zi_tokenizer *tok);
int32_t zi_tokenizer_bos(const zi_tokenizer *tok); /* -1 when the file has none */
int32_t zi_tokenizer_eos(const zi_tokenizer *tok); /* -1 when the file has none */
/* The markers of a reranker's (query, document) pair without a template,
 * as llama.cpp's format_prompt_rerank puts them: [bos] query [eos] [sep]
 * document [eos]; each is -1 when the vocabulary's add_bos_token,
 * add_eos_token, add_sep_token (default: WordPiece files only) leave it
 * out; eos falls back to the separator when the file has no EOS. */
void zi_tokenizer_pair_markers(const zi_tokenizer *tok, int32_t *bos, int32_t *eos, int32_t *sep);
/* The file's token type (ZI_TOKEN_*) of id, or -1 for an id outside the
 * vocabulary. */
int zi_tokenizer_token_type(const zi_tokenizer *tok, int32_t id);
/* True for tokens that end generation: the EOS token and tokens llama.cpp
 * recognises as end-of-turn by their text ("<|im_end|>", "<|endoftext|>",
 * "<|eot_id|>", ...). */
int zi_tokenizer_is_eog(const zi_tokenizer *tok, int32_t id);
/* Appends every end-of-generation id (zi_tokenizer_is_eog), ascending, to
 * out: the eos_token_ids of a context for this model. */
int zi_tokenizer_eog_ids(const zi_tokenizer *tok, zi_i32_list *out, zi_error *err);

/*
 * Encodes text[0..len) (UTF-8; never rejected for its content: as in
 * llama.cpp, each byte that does not start a well-formed sequence is encoded
 * as U+FFFD, and overlong forms as the character they spell; NUL bytes are
 * ordinary text). add_special: add BOS/EOS as the file's add_bos_token /
 * add_eos_token say ("bert": BOS and SEP always, as llama.cpp adds them). parse_special: text
 * spelling a control token (e.g.
 * "<|im_end|>") becomes that token; otherwise it is ordinary text.
 * (User-defined tokens are always matched, as llama.cpp does.) On success
 * *ids is malloc'd (free() it, even when *n is 0) and holds *n ids.
 * ZI_ERANGE for text over 2 GiB, ZI_ENOMEM when allocation fails,
 * ZI_EFORMAT (naming the byte) when a "llama" vocabulary has no token for a
 * byte the text falls back to, or when a "bert" word needs the unknown
 * token and the file has none. "llama" vocabularies: the bytes are not
 * validated nor replaced (invalid UTF-8 falls back to byte tokens), and a
 * space is put before the text and after each special token when the file's
 * add_space_prefix is set.
 */
int zi_tokenizer_encode(zi_tokenizer *tok, const char *text, size_t len, int add_special,
                        int parse_special, int32_t **ids, size_t *n, zi_error *err);

/*
 * The id of the one token a text names: text (special tokens parsed, no
 * BOS) must encode to exactly one token; -1 otherwise. tok is a
 * zi_tokenizer, taken as void * so that it serves as a lookup callback
 * (codec_mask.h's zi_codec_lookup_fn).
 */
int32_t zi_tokenizer_single_id(void *tok, const char *text);

/*
 * The bytes of one token (after undoing the byte-to-unicode mapping, or
 * U+2581 as ' ' for "llama" vocabularies). Control and unknown tokens yield
 * their text only when `special` is set, otherwise nothing.
 * Writes at most cap bytes and returns the full length (call again with a
 * larger buffer when the return exceeds cap), or -1 for an id outside the
 * vocabulary.
 */
int zi_tokenizer_token_bytes(const zi_tokenizer *tok, int32_t id, int special, char *buf,
                             size_t cap);

/* Token id's bytes as structured output matches them (the shape of
 * zi_token_bytes_fn, structured/vocab_trie.h; ctx is the tokenizer): the
 * token's bytes without special handling, and 0 for a control token, which
 * no constraint allows. */
int zi_tokenizer_constraint_bytes(const void *tok, int32_t id, char *buf, size_t cap);

/* Decodes ids into one malloc'd NUL-terminated byte string (*out, *len):
 * the tokens' bytes, except that one leading space of the first token is
 * dropped when the file's add_space_prefix is set (as llama.cpp's
 * detokenize does; when the first token is BOS nothing is dropped, so
 * [BOS, "\u2581Hi"] gives " Hi"). "llama" vocabularies: U+2581 decodes to
 * ' ', a byte token to its byte. "bert": U+2581 decodes to ' ' (so the
 * text starts with a space, as in llama.cpp), then llama.cpp's clean-up of
 * spaces: none before ? ! . , or 's 'm 're 've, and " ' " becomes "'"
 * (zi_detok_push does not clean up). ZI_EINVAL naming the index for an id
 * outside the vocabulary. */
int zi_tokenizer_decode(const zi_tokenizer *tok, const int32_t *ids, size_t n, int special,
                        char **out, size_t *len, zi_error *err);

/*
 * Incremental decoding for streaming: feed ids one at a time and get back
 * only complete UTF-8 characters (a character spelled by byte tokens comes
 * out once its last byte arrives); no leading space is dropped; an incomplete multi-byte sequence
 * at the end is held until the bytes that complete it arrive. zi_detok_flush emits whatever is held
 * (as raw bytes) at the end of a stream.
 */
typedef struct zi_detok {
    unsigned char pending[8];
    size_t n_pending;
} zi_detok;

void zi_detok_init(zi_detok *d);
/* Appends the decoded text of `id` to out (capacity cap, NUL-terminated) and
 * returns the number of bytes written, or -1 if id is invalid or out is too
 * small (ZI_TOKEN_MAX_BYTES + 8 always suffices). */
int zi_detok_push(zi_detok *d, const zi_tokenizer *tok, int32_t id, int special, char *out,
                  size_t cap);
int zi_detok_flush(zi_detok *d, char *out, size_t cap);

#endif
