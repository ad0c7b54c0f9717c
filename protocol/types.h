/*
 * types.h - the request, sampling, context and response types every zinfer
 * process shares, re-expressed in C after the seed documents' Python types
 * (docs/types.md says what the seeds are and maps every seed name).
 *
 * | seed type                       | here                          |
 * | ------------------------------- | ----------------------------- |
 * | SamplingParams                  | zi_sampling_params            |
 * | TokenGeneratorRequest (+Message)| zi_request (+ zi_message)     |
 * | TextContext / InputContext      | zi_text_context               |
 * | TextGenerationStatus            | zi_gen_status                 |
 * | LogProbabilities                | zi_logprobs                   |
 * | TextResponse                    | zi_text_response              |
 * | TextGenerationResponse          | zi_text_generation_response   |
 *
 * The router decodes a client's request into a zi_request; a tokenizer
 * process turns it into a zi_text_context (prompt tokens, limits, sampling
 * parameters) that travels to a model worker, whose scheduler then drives
 * the context with the index operations below (chunked prefill, update,
 * jump_ahead, rollback, reset on eviction). protocol/codec.h moves every one
 * of these types over the wire as msgpack.
 *
 * Ownership: each struct owns its heap memory (strings, arrays, nested
 * structs); *_init gives the seed's defaults, *_free releases everything and
 * leaves the struct in its init state. Strings are zi_string: bytes plus a
 * length, always NUL-terminated as well, so they may be used as C strings
 * where the format forbids embedded NULs.
 *
 * Every function that can be misused returns ZI_OK or a ZI_E* status and
 * fills a zi_error naming the field at fault. Nothing here asserts on or
 * crashes from caller input; a NULL pointer where one is required is
 * ZI_EINVAL.
 */
#ifndef ZI_TYPES_H
#define ZI_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

/* ---- small containers ------------------------------------------------------ */

typedef struct zi_string {
    char *p;    /* NULL when empty and never set; else NUL-terminated */
    size_t len; /* bytes, not counting the terminating NUL */
} zi_string;

typedef struct zi_str_list {
    zi_string *v;
    size_t n;
} zi_str_list;

typedef struct zi_i32_list {
    int32_t *v;
    size_t n;
} zi_i32_list;

/* Opaque msgpack bytes: one encoded object (tools, response_format, ...). */
typedef struct zi_bytes {
    uint8_t *p;
    size_t len; /* 0 means absent */
} zi_bytes;

/* Replaces s with a copy of p[0..len). ZI_ENOMEM on allocation failure. */
int zi_string_set(zi_string *s, const char *p, size_t len, zi_error *err);
void zi_string_free(zi_string *s);
int zi_str_list_push(zi_str_list *l, const char *p, size_t len, zi_error *err);
void zi_str_list_free(zi_str_list *l);
int zi_i32_list_push(zi_i32_list *l, int32_t v, zi_error *err);
/* Replaces l with a copy of v[0..n). */
int zi_i32_list_set(zi_i32_list *l, const int32_t *v, size_t n, zi_error *err);
bool zi_i32_list_contains(const zi_i32_list *l, int32_t v);
void zi_i32_list_free(zi_i32_list *l);
int zi_bytes_set(zi_bytes *b, const void *p, size_t len, zi_error *err);
void zi_bytes_free(zi_bytes *b);

/* ---- TextGenerationStatus -------------------------------------------------- */

/* The seed lists ACTIVE, END_OF_SEQUENCE and MAXIMUM_LENGTH; STOP (a stop
 * string or stop token id was produced) and CANCELLED (the client cancelled
 * or went away) are the further final states of zinfer's client protocol. */
typedef enum zi_gen_status {
    ZI_GEN_ACTIVE = 0,
    ZI_GEN_END_OF_SEQUENCE = 1,
    ZI_GEN_MAXIMUM_LENGTH = 2,
    ZI_GEN_STOP = 3,
    ZI_GEN_CANCELLED = 4,
    ZI_GEN_DEADLINE_EXCEEDED = 5, /* the request's timeout_ms passed (router) */
} zi_gen_status;
#define ZI_GEN_STATUS_COUNT 6

/* The wire name ("active", "end_of_sequence", "maximum_length", "stop",
 * "cancelled", "deadline_exceeded"); NULL for a value outside the enum. */
const char *zi_gen_status_name(int status);
/* Parses a wire name (exact, case-sensitive); ZI_EINVAL when unknown. */
int zi_gen_status_parse(const char *s, size_t len, zi_gen_status *out, zi_error *err);
/* True for every status but ACTIVE (the seed's is_done). */
bool zi_gen_status_is_done(zi_gen_status s);

/* ---- SamplingParams -------------------------------------------------------- */

/*
 * Field for field the seed's SamplingParams, with its defaults (set by
 * zi_sampling_params_init). Accepted ranges (zi_sampling_params_validate):
 *
 *   top_k               -1 or 0: no limit (whole vocabulary); k >= 1 keeps
 *                       the k most probable. Default 1 (greedy).
 *   top_p               (0, 1]. Default 1 (off).
 *   min_p               [0, 1]. Default 0 (off).
 *   temperature         [0, 1e6], finite; 0 means greedy. Default 1.
 *   frequency_penalty   [-2, 2] (the OpenAI range). Default 0.
 *   presence_penalty    [-2, 2]. Default 0.
 *   repetition_penalty  (0, 1e6]. Default 1 (off).
 *   max_new_tokens      -1 (none: until another limit) or [1, 2^31-1].
 *                       Default -1.
 *   min_new_tokens      [0, 2^31-1], and <= max_new_tokens when that is set.
 *   ignore_eos          default false.
 *   stop                list of non-empty strings. Default empty (None).
 *   stop_token_ids      list of token ids >= 0. Default empty (None).
 *   detokenize          default true.
 *   seed                any uint64. Default 0.
 *   logit_bias          (zinfer's, OpenAI's logit_bias) up to
 *                       ZI_LOGIT_BIAS_MAX entries {token id >= 0, bias},
 *                       each id at most once, each bias finite and in
 *                       [-100, 100]; added to the token's logit before every
 *                       other step of the sampler. Default empty. Whether an
 *                       id is inside the vocabulary only a process that
 *                       knows the model can say (the tokenizer and the
 *                       worker check it).
 *
 * NaN is rejected in every float field. An empty list stands for the seed's
 * None.
 */
#define ZI_LOGIT_BIAS_MAX 1024
#define ZI_LOGIT_BIAS_LIMIT 100.0

typedef struct zi_token_bias {
    int32_t id;
    float bias;
} zi_token_bias;

typedef struct zi_logit_bias {
    zi_token_bias *v;
    size_t n;
} zi_logit_bias;

typedef struct zi_sampling_params {
    int32_t top_k;
    double top_p;
    double min_p;
    double temperature;
    double frequency_penalty;
    double presence_penalty;
    double repetition_penalty;
    int64_t max_new_tokens;
    int64_t min_new_tokens;
    bool ignore_eos;
    zi_str_list stop;
    zi_i32_list stop_token_ids;
    bool detokenize;
    uint64_t seed;
    zi_logit_bias logit_bias;
    bool speculate; /* may the worker speculate this request (when its server does); default true */
} zi_sampling_params;

void zi_sampling_params_init(zi_sampling_params *sp);
void zi_sampling_params_free(zi_sampling_params *sp);
/* Deep copy; dst must not hold memory (it is overwritten). */
int zi_sampling_params_copy(zi_sampling_params *dst, const zi_sampling_params *src, zi_error *err);
/* Checks every field against the ranges above. The message names the field,
 * prefixed with path and a dot when path is non-empty, e.g.
 * "sampling_params.top_p: 1.5 is outside (0, 1]". path may be NULL. */
int zi_sampling_params_validate(const zi_sampling_params *sp, const char *path, zi_error *err);

/* ---- TokenGeneratorRequest ------------------------------------------------- */

typedef struct zi_message {
    zi_string role;    /* "system", "user", "assistant" (the seed's Literal) or "tool" */
    zi_string content; /* text; a list of text parts is joined with "\n" */
    /* content was nil or absent (empty string above): allowed only for an
     * assistant message with tool_calls; the template sees None */
    bool content_null;
    /* role "tool": the id of the call this result answers (empty: none) */
    zi_string tool_call_id;
    /* role "tool": the name of the function that gave the result (empty:
     * none) */
    zi_string name;
    /* role "assistant": the calls it made, the msgpack array as sent, its
     * shape checked by the decoder ([{"id", "type": "function", "function":
     * {"name", "arguments"}}]); len 0: none */
    zi_bytes tool_calls;
    /* role "assistant": its reasoning (the template reads
     * message.reasoning_content); len 0: none */
    zi_string reasoning_content;
} zi_message;

typedef enum zi_prompt_kind {
    ZI_PROMPT_NONE = 0, /* messages are used instead */
    ZI_PROMPT_TEXT = 1,
    ZI_PROMPT_TOKENS = 2,
} zi_prompt_kind;

/* A LoRA adapter a request runs under (the request's "lora", llama-server's
 * shape; docs/lora.md): one of the worker's --lora adapters, by its index
 * in their order (id >= 0) or by name (id -1), and the user's scale. */
#define ZI_MAX_LORA 4           /* adapters a request names at most */
#define ZI_LORA_REF_NAME_MAX 64 /* a name's bytes, its NUL included */
typedef struct zi_lora_ref {
    int32_t id;
    char name[ZI_LORA_REF_NAME_MAX]; /* when id is -1 */
    float scale;
} zi_lora_ref;

/* The seed's TokenGeneratorRequest plus `stream` from zinfer's protocol.
 * Exactly one of a prompt and messages is set in a valid request. The stop
 * strings of `stop` and of sampling_params.stop both apply. */
typedef struct zi_request {
    zi_string id; /* client-chosen, non-empty */
    int64_t index;
    zi_string model_name;
    zi_prompt_kind prompt_kind;
    zi_string prompt_text;     /* when ZI_PROMPT_TEXT */
    zi_i32_list prompt_tokens; /* when ZI_PROMPT_TOKENS */
    zi_message *messages;
    size_t n_messages;
    zi_sampling_params sampling_params;
    int64_t logprobs; /* top-N log probabilities per token; 0 = none */
    bool echo;
    zi_str_list stop;
    bool stream;                    /* default true */
    int64_t timestamp_ns;           /* default 0 */
    zi_string request_path;         /* default "/" */
    zi_bytes response_format;       /* opaque msgpack map, when present */
    zi_string grammar;              /* GBNF text, when present (non-empty) */
    zi_string regex;                /* a regular expression the whole completion matches,
                                     * when present (non-empty; regex_grammar.h) */
    zi_bytes tools;                 /* opaque msgpack array, when present */
    zi_bytes chat_template_options; /* opaque msgpack map, when present */
    int64_t timeout_ms;             /* the router ends it after this long; 0 = none
                                     * (then the server's --request-timeout) */
    int64_t max_thinking_tokens;    /* the thinking section's budget; 0 = none */
    bool has_keep_alive;            /* keep_alive was given (Ollama's): */
    int64_t keep_alive_ms;          /* how long its model stays loaded once idle; -1 forever */
    bool skip_special_tokens;       /* default true: control tokens' text is left out of
                                     * the completion (false: kept, e.g. a tool-call
                                     * format's markers that are control tokens) */
    /* The seed's images: each image file's bytes as sent (PNG, JPEG, ...;
     * not decoded here), in the order of the ZI_MEDIA_MARKERs in the
     * prompt text or the messages' contents. A request with images has as
     * many markers as images (the decoder checks). Each len > 0. */
    zi_bytes *images;
    size_t n_images;
    /* LoRA adapters (n_lora 0: none), applied together in this order. */
    zi_lora_ref lora[ZI_MAX_LORA];
    size_t n_lora;
    /* A speech request (op "speech", docs/speech.md): prompt_text holds its
     * "input" (the text to speak, ZI_PROMPT_TEXT), voice the name of a
     * speaker file (len 0: none), speech_format 0 float32 / 1 16-bit PCM. */
    bool speech;
    zi_string voice;
    int32_t speech_format;
    /* The seeds' speaker prompt instead of a voice (ap_text.len 0: none):
     * audio_prompt_transcription, audio_prompt_tokens (flat codes) and
     * audio_prompt_word_codes (how many codes each word has). */
    zi_string ap_text;
    zi_i32_list ap_tokens, ap_word_codes;
} zi_request;

/* Where an image goes in the text: llama.cpp's media marker
 * (mtmd_default_marker()). A client writes it into a text prompt itself;
 * zinfer-http writes it where a message held an image part. */
#define ZI_MEDIA_MARKER "<__media__>"

/* The protocol's ceilings on a request's images (the codec's default
 * limits; zinfer-http's --max-images and --max-image-bytes stop here). */
#define ZI_REQUEST_MAX_IMAGES 64
#define ZI_REQUEST_MAX_IMAGE_BYTES ((size_t)64 << 20)

/* The largest max_thinking_tokens. */
#define ZI_MAX_THINKING_TOKENS 1000000

/* The largest timeout_ms (and --request-timeout): one day. */
#define ZI_MAX_TIMEOUT_MS 86400000

/* Defaults: everything empty/0, stream = true, request_path = "/" (set
 * lazily: an empty request_path means "/"), sampling defaults. */
void zi_request_init(zi_request *r);
void zi_request_free(zi_request *r);
int zi_request_add_message(zi_request *r, const char *role, const char *content, size_t content_len,
                           zi_error *err);
/* Appends a copy of p[0..len) (len > 0) to r->images. */
int zi_request_add_image(zi_request *r, const void *p, size_t len, zi_error *err);
/* How many times ZI_MEDIA_MARKER occurs in s[0..n) (not overlapping). */
size_t zi_media_marker_count(const char *s, size_t n);

/* ---- LogProbabilities ------------------------------------------------------ */

/* Top log probabilities at one position: token id -> log probability. */
typedef struct zi_top_logprobs {
    int32_t *ids;
    float *logprobs;
    size_t n;
} zi_top_logprobs;

/* The seed's LogProbabilities: for each of n positions, the log probability
 * of the chosen token and the top candidates. */
typedef struct zi_logprobs {
    float *token_logprobs; /* n entries */
    zi_top_logprobs *top;  /* n entries */
    size_t n;
} zi_logprobs;

void zi_logprobs_init(zi_logprobs *lp);
void zi_logprobs_free(zi_logprobs *lp);
/* Appends one position with its top entries (ids/lps may be NULL when
 * n_top is 0). ZI_EINVAL for a NaN or +inf log probability or a negative id. */
int zi_logprobs_push(zi_logprobs *lp, float token_logprob, const int32_t *ids, const float *lps,
                     size_t n_top, zi_error *err);
/* Deep copy into *dst (overwritten). */
int zi_logprobs_copy(zi_logprobs *dst, const zi_logprobs *src, zi_error *err);

/* ---- TextResponse / TextGenerationResponse --------------------------------- */

/* The seed's TextResponse: next_token is an int (token id) or a str. */
typedef struct zi_text_response {
    bool is_text;
    int32_t token;         /* when !is_text */
    zi_string text;        /* when is_text */
    zi_logprobs *logprobs; /* NULL when none; owned */
} zi_text_response;

void zi_text_response_init(zi_text_response *r);
void zi_text_response_free(zi_text_response *r);

typedef struct zi_text_generation_response {
    zi_text_response *tokens;
    size_t n;
    zi_gen_status final_status;
} zi_text_generation_response;

void zi_text_generation_response_init(zi_text_generation_response *r);
void zi_text_generation_response_free(zi_text_generation_response *r);
/* Appends a copy of *t (the seed's append_token). */
int zi_text_generation_response_append(zi_text_generation_response *r, const zi_text_response *t,
                                       zi_error *err);

/* ---- TextContext ----------------------------------------------------------- */

/* The json_schema of a context whose completion must be a JSON object,
 * any (response_format {"type": "json_object"}). */
#define ZI_JSON_OBJECT_SCHEMA "{\"type\":\"object\"}"

/* The token array grows in multiples of this many slots (the seed's
 * CHUNK_SIZE). */
#define ZI_CTX_CHUNK 128

/* Passed to zi_text_context_set_token_indices for "leave unchanged" (the
 * seed's None). */
#define ZI_IDX_KEEP INT64_MIN

/*
 * Images in a context (the seeds' TextAndVisionContext's pixel_values).
 * The tokenizer process expands each image of a prompt into soft-token
 * positions and sends the pixels along; the worker's vision tower turns
 * each tile into tile_tokens input embeddings there (model.h's
 * zi_batch.embd). An image is n_tiles tiles of tile_size x tile_size
 * pixels; tile t's soft tokens are the positions
 * [tile_first[t], tile_first[t] + tile_tokens) of the context's tokens
 * (contiguous within a tile; text may lie between tiles). Rules
 * (zi_text_context_check): every soft token inside the prompt, tiles in
 * increasing position without overlap across all the images of the
 * context, n_tiles, tile_size and tile_tokens >= 1 (tile_size <=
 * ZI_CTX_IMAGE_MAX_SIDE), and the token at the k-th soft position of an
 * image (k = t * tile_tokens + j) is zi_ctx_image_key(hash, k).
 *
 * pixels: n_tiles * tile_size^2 * 3 floats (each tile interleaved RGB,
 * row-major, normalized: vision.h), finite; on the wire a msgpack bin of
 * float32 little-endian; hash is zi_ctx_image_hash of those pixels (the
 * decoder recomputes it). embd and tile_encoded are the worker's, filled
 * lazily by its generator and never sent.
 */
#define ZI_CTX_IMAGE_MAX_SIDE 8192

typedef struct zi_ctx_image {
    uint64_t hash;        /* zi_ctx_image_hash(pixels) */
    int32_t n_tiles;      /* >= 1 */
    int32_t tile_size;    /* pixels per side of a tile */
    int32_t tile_tokens;  /* soft tokens per tile */
    int32_t *tile_first;  /* [n_tiles] each tile's first soft-token position */
    bool non_causal;      /* each tile's tokens attend to the whole tile (gemma3) */
    float *pixels;        /* [n_tiles][tile_size][tile_size][3] */
    /* worker side (not on the wire): the soft tokens' embeddings, rows of
     * the model's dim, tile t's at [t * tile_tokens * dim] (NULL until the
     * first tile is encoded), and which tiles are in it */
    float *embd;
    uint8_t *tile_encoded; /* [n_tiles] */
} zi_ctx_image;

/* The token id (a key, never a vocabulary id) that stands at the k-th soft
 * token of an image with this hash: the prefix cache hashes token ids, so
 * a repeated image reuses its blocks and two images never share one.
 * Derivation: x = hash ^ ((uint64)(k + 1) * 0x9E3779B97F4A7C15), then
 * splitmix64's finalizer (x ^= x >> 30; x *= 0xBF58476D1CE4E5B9;
 * x ^= x >> 27; x *= 0x94D049BB133111EB; x ^= x >> 31), and the key is
 * -1 - (int32)(x >> 33): always negative, in [-2^31, -1], so it can never
 * equal a vocabulary id. */
static inline int32_t zi_ctx_image_key(uint64_t hash, int64_t k) {
    uint64_t x = hash ^ ((uint64_t)(k + 1) * 0x9E3779B97F4A7C15ull);
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (int32_t)(-1 - (int64_t)(x >> 33));
}

/* The hash of n pixel values (as their float32 bit patterns, so -0.0 and
 * 0.0 differ): FNV-1a-style over 64-bit little-endian words (an odd
 * trailing float padded with zero bits) mixed with the count, finalized
 * with splitmix64. Not cryptographic: a repeated image is found by it,
 * and the prefix cache also compares the keys it derives. */
uint64_t zi_ctx_image_hash(const float *pixels, size_t n);

/* Frees an image's arrays and zeroes it. */
void zi_ctx_image_free(zi_ctx_image *im);

/* A speech request's plan bounds (zi_text_context's tts_words): the words
 * of its text, and the token ids of one word. */
#define ZI_TTS_MAX_WORDS 4096
#define ZI_TTS_MAX_WORD_IDS 256

/*
 * The seed's TextContext. Token array layout:
 *
 *   0        committed   start        active        end          size
 *   |-----------|----------|-------------|-------------|------------|
 *   | completed (KV known) | next_tokens | not yet fed | preallocated
 *
 *   [0, start_idx)          completed: already run through the model; their
 *                           KV entries exist in the cache slot.
 *   [0, committed_idx)      the part of completed that is committed to the
 *                           prefix cache (committed_idx <= start_idx).
 *   [start_idx, active_idx) next_tokens, the active window fed in the next
 *                           step (the whole prompt for context encoding,
 *                           one token in token generation, a chunk of the
 *                           prompt under chunked prefill).
 *   [active_idx, end_idx)   valid tokens not in this step (the rest of a
 *                           chunked prompt).
 *   [0, prompt_len)         the prompt; [prompt_len, end_idx) generated.
 *   [end_idx, size)         preallocated slots (zeroed).
 *
 * Invariant, checked after every operation:
 *   0 <= committed_idx <= start_idx <= active_idx <= end_idx <= size,
 *   1 <= prompt_len <= end_idx,
 *   prompt_len <= completion_start_idx <= completion_end_idx <= end_idx.
 *
 * The fields are public for reading; change them only through the functions
 * below, which keep the invariant.
 */
typedef struct zi_text_context {
    zi_string request_id;  /* zinfer's addition: which request this is */
    zi_string prompt;      /* the original prompt text, when it was text */
    int32_t *tokens;       /* size slots */
    int64_t size;          /* allocated slots, a multiple of ZI_CTX_CHUNK */
    zi_logprobs **lp_data; /* size slots; per-index log probabilities or NULL */
    int64_t max_length;    /* total length (prompt + generated) at which generation stops */
    zi_i32_list eos_token_ids;
    zi_i32_list *eos_sequences; /* multi-token end sequences */
    size_t n_eos_sequences;
    int64_t log_probabilities; /* top-N to return; 0 = none */
    bool log_probabilities_echo;
    bool ignore_eos;
    bool has_json_schema;
    zi_string json_schema; /* JSON text of the schema (ZI_JSON_OBJECT_SCHEMA: any object) */
    zi_string grammar;     /* GBNF text the completion must match (len 0: none; never
                            * together with json_schema) */
    zi_string regex;       /* a regular expression the whole completion must match
                            * (structured/regex_grammar.h; len 0: none; never together
                            * with json_schema or grammar). The worker compiles it, as
                            * it compiles the other two. */
    zi_sampling_params sampling_params;
    zi_gen_status status;
    int64_t cache_seq_id; /* -1 when not assigned */
    int64_t start_idx, active_idx, end_idx, committed_idx;
    int64_t completion_start_idx, completion_end_idx; /* tokens not yet returned */
    int64_t prompt_len;
    bool is_initial_prompt;
    int64_t draft_offset;
    /* A thinking budget (the request's max_thinking_tokens; 0: none): once
     * the completion has spent this many tokens inside its `<think>`
     * section (opened at its start, or by the prompt when thinking_open)
     * without closing it, the worker puts thinking_end's ids (the text
     * "\n</think>\n\n") in place of the sampled ones. With
     * thinking_harmony the section is gpt-oss's analysis channel
     * (`<|channel|>analysis<|message|>` ... `<|end|>`) and thinking_end's
     * text `<|end|><|start|>assistant<|channel|>final<|message|>`. */
    int64_t thinking_budget;
    bool thinking_open;
    zi_i32_list thinking_end;
    bool thinking_harmony;
    /* Images (see zi_ctx_image above; in position order): the tokens at
     * their soft-token positions are keys (zi_ctx_image_key), negative. */
    zi_ctx_image *images;
    size_t n_images;
    /* The request's LoRA adapters (zi_request.lora; n_lora 0: none): the
     * worker resolves names to ids and refuses an adapter it lacks. */
    zi_lora_ref lora[ZI_MAX_LORA];
    size_t n_lora;
    /* An OuteTTS codec request (structured/codec_mask.h; NULL: none): the
     * worker masks every draw to the audio section's tokens. Borrowed
     * (the context never frees it) and not on the wire: what travels is
     * the plan's inputs below, from which the worker builds it. */
    const struct zi_codec_plan *codec_plan;
    /* A speech request's plan inputs (docs/speech.md; n_tts_words 0: not
     * one), on the wire as "tts": {"ids", "words", "format"}, so failover
     * and a router restart rebuild the same plan: the marker ids
     * (zi_codec_ids' eight fields in their order: code0, n_codes, time0,
     * n_times, code_start, code_end, newline, audio_end), each word's token
     * ids, and the audio format the client asked for (0: float32, 1:
     * 16-bit PCM). At most ZI_TTS_MAX_WORDS words of 1 to
     * ZI_TTS_MAX_WORD_IDS ids each. */
    int32_t tts_ids[8];
    zi_i32_list *tts_words;
    size_t n_tts_words;
    int32_t tts_format;
} zi_text_context;

/*
 * Builds a context for a prompt of n >= 1 tokens. sp (NULL: defaults) is
 * validated and copied; ignore_eos is taken from it. max_length is the
 * model's limit on the total length; it is lowered to
 * n + sp->max_new_tokens when that is set. Errors: empty prompt, a negative
 * token id, a prompt that leaves no room (n >= max_length), n +
 * min_new_tokens > max_length, invalid sampling parameters. After init:
 * start_idx = committed_idx = 0, active_idx = end_idx = prompt_len = n,
 * size = n rounded up to ZI_CTX_CHUNK, status active, no cache slot.
 * On failure ctx is left empty (safe to free).
 */
int zi_text_context_init(zi_text_context *ctx, const int32_t *prompt, size_t n, int64_t max_length,
                         const zi_sampling_params *sp, zi_error *err);
/* Zeroes a context without allocating (the state before init/decode). */
void zi_text_context_zero(zi_text_context *ctx);
void zi_text_context_free(zi_text_context *ctx);
/* Whether ctx's completion is constrained: a json_schema, a grammar or a
 * regex (it has at most one). */
bool zi_text_context_constrained(const zi_text_context *ctx);
/* Replaces the EOS id set (ids >= 0; duplicates kept once). */
int zi_text_context_set_eos(zi_text_context *ctx, const int32_t *ids, size_t n, zi_error *err);
/* Adds one multi-token EOS sequence (n >= 1 ids >= 0). */
int zi_text_context_add_eos_sequence(zi_text_context *ctx, const int32_t *ids, size_t n,
                                     zi_error *err);
/* Adds an image to a context whose prompt holds its soft-token positions
 * (any ids there are replaced by the image's keys): checks it against the
 * rules above (hash included) and the images already added, then takes
 * over im's arrays (im is zeroed; on failure im is left as it was and the
 * context unchanged). Errors name "images[i].field". */
int zi_text_context_add_image(zi_text_context *ctx, zi_ctx_image *im, zi_error *err);
/* Whether position pos of ctx is a soft token: then *image and *tile say
 * whose (either may be NULL). */
bool zi_text_context_soft_token(const zi_text_context *ctx, int64_t pos, size_t *image,
                                int32_t *tile);
/* Checks the invariant above and the field ranges; the message names the
 * first index at fault. Used after decoding. Token ids are >= 0 except at
 * the images' soft tokens, which hold their keys. The images' hashes are
 * not recomputed here (zi_text_context_add_image and the decoder do). */
int zi_text_context_check(const zi_text_context *ctx, zi_error *err);

/* active_idx - start_idx: tokens fed this step. */
static inline int64_t zi_text_context_active_length(const zi_text_context *ctx) {
    return ctx->active_idx - ctx->start_idx;
}
/* Completed plus active tokens (the seed's wording): active_idx. */
static inline int64_t zi_text_context_current_length(const zi_text_context *ctx) {
    return ctx->active_idx;
}
/* Context encoding: more than one token in the active window. */
static inline bool zi_text_context_is_ce(const zi_text_context *ctx) {
    return zi_text_context_active_length(ctx) > 1;
}
static inline bool zi_text_context_is_done(const zi_text_context *ctx) {
    return zi_gen_status_is_done(ctx->status);
}
static inline const int32_t *zi_text_context_next_tokens(const zi_text_context *ctx) {
    return ctx->tokens + ctx->start_idx;
}
static inline int64_t zi_text_context_generated_count(const zi_text_context *ctx) {
    return ctx->end_idx - ctx->prompt_len;
}
static inline const int32_t *zi_text_context_generated_tokens(const zi_text_context *ctx) {
    return ctx->tokens + ctx->prompt_len;
}
static inline bool zi_text_context_is_assigned_to_cache(const zi_text_context *ctx) {
    return ctx->cache_seq_id >= 0;
}

/* Adds the deltas to the four indices without touching the tokens (the
 * seed's bump_token_indices). All-or-nothing: when the result breaks the
 * invariant nothing changes and ZI_EINVAL names the index. */
int zi_text_context_bump_token_indices(zi_text_context *ctx, int64_t d_start, int64_t d_active,
                                       int64_t d_end, int64_t d_committed, zi_error *err);
/* Sets the indices given (ZI_IDX_KEEP leaves one unchanged); all-or-nothing
 * like bump. */
int zi_text_context_set_token_indices(zi_text_context *ctx, int64_t start, int64_t active,
                                      int64_t end, int64_t committed, zi_error *err);
/* Chunked prefill: shrinks the active window to at most max_tokens (>= 1)
 * tokens, active_idx = min(active_idx, start_idx + max_tokens). */
int zi_text_context_limit_active(zi_text_context *ctx, int64_t max_tokens, zi_error *err);

/*
 * Records the token sampled after a step (the seed's update). lp (may be
 * NULL) is always consumed: kept for the token's index or freed.
 *  - If active_idx < end_idx (a chunk of the prompt was fed and more prompt
 *    remains), the token is dropped and the window moves on: start_idx =
 *    active_idx, active_idx = end_idx.
 *  - Otherwise the token is written at end_idx (growing the array),
 *    start_idx = old active_idx, active_idx = end_idx = old end_idx + 1,
 *    completion_end_idx + 1, is_initial_prompt = false, and the status
 *    becomes END_OF_SEQUENCE (an EOS id or EOS sequence, unless ignore_eos),
 *    STOP (an id in sampling_params.stop_token_ids) or MAXIMUM_LENGTH
 *    (end_idx >= max_length), checked in that order.
 * Errors: a done context, an empty active window, a negative token id.
 */
int zi_text_context_update(zi_text_context *ctx, int32_t token, zi_logprobs *lp, zi_error *err);
/* echo: stores lp (consumed, may be NULL) as the log probability of prompt
 * token idx given the tokens before it, 1 <= idx < prompt_len (token 0 has
 * no prediction). ZI_ERANGE for another index. */
int zi_text_context_set_prompt_logprobs(zi_text_context *ctx, int64_t idx, zi_logprobs *lp,
                                        zi_error *err);
/* Appends a token that the model must also be fed next step (structured
 * output's forced tokens): written at end_idx, active_idx and end_idx + 1,
 * start_idx unchanged, returned to the user (completion_end_idx + 1); the
 * status updates as in update. Errors: a done context, a negative id,
 * active_idx < end_idx (a chunked prompt is pending). */
int zi_text_context_jump_ahead(zi_text_context *ctx, int32_t token, zi_error *err);
/*
 * Removes the last n generated tokens (the seed's rollback): end_idx -= n,
 * active_idx = end_idx (unless a pending chunk ends before it: that window
 * is kept), start_idx = min(start_idx, active_idx - 1) so the last
 * remaining token is fed again, committed_idx = min(committed_idx,
 * start_idx), completion indices clipped to end_idx, their log
 * probabilities dropped, and a done status other than CANCELLED goes back
 * to ACTIVE. Errors: n < 0 or n > the number of generated tokens (prompt
 * tokens cannot be rolled back).
 */
int zi_text_context_rollback(zi_text_context *ctx, int64_t n, zi_error *err);
/* Eviction (the seed's reset): all tokens so far become the prompt of the
 * next context-encoding step: start_idx = committed_idx = 0, active_idx =
 * end_idx (a chunk that was pending included), is_initial_prompt = true.
 * end, prompt_len, status and the cache slot are kept (the caller releases
 * the slot). */
void zi_text_context_reset(zi_text_context *ctx);
/*
 * How many steps can run without feeding a position >= max_seq_len (>= 1).
 * One step feeds [start_idx, active_idx) and samples a token; each later
 * step feeds the previous sample. So n steps feed positions up to
 * active_idx + n - 2 and n = max(0, max_seq_len - active_idx + 1). With a
 * chunked prompt pending (active_idx < end_idx) at most 1 (0 when
 * active_idx > max_seq_len). For token generation this equals the seed's
 * max_seq_len - start_idx.
 */
int zi_text_context_compute_num_available_steps(const zi_text_context *ctx, int64_t max_seq_len,
                                                int64_t *out, zi_error *err);
/*
 * min_new_tokens: for each of num_steps steps, out[s] = 1 when the token
 * sampled at step s (index active_idx + s) falls in [prompt_len,
 * prompt_len + min_new_tokens), i.e. EOS must be masked (every id in
 * eos_token_ids and sampling_params.stop_token_ids); else 0. The seed
 * returns (row, eos_id) pairs per step; a per-step flag carries the same.
 */
int zi_text_context_min_token_mask(const zi_text_context *ctx, int64_t num_steps, uint8_t *out,
                                   zi_error *err);
/* Cache slot (seq id >= 0). Assigning an assigned context or unassigning an
 * unassigned one is ZI_EINVAL; so is reading the id of an unassigned one. */
int zi_text_context_assign_to_cache(zi_text_context *ctx, int64_t seq_id, zi_error *err);
int zi_text_context_unassign_from_cache(zi_text_context *ctx, zi_error *err);
int zi_text_context_cache_seq_id(const zi_text_context *ctx, int64_t *out, zi_error *err);
/* Sets the status (e.g. STOP when the tokenizer sees a stop string,
 * CANCELLED); ZI_EINVAL for a value outside the enum. */
int zi_text_context_update_status(zi_text_context *ctx, int status, zi_error *err);
/* The seed's set_draft_offset (speculative decoding): 0 <= idx <= end_idx. */
int zi_text_context_set_draft_offset(zi_text_context *ctx, int64_t idx, zi_error *err);
/* The seed's outstanding_completion_tokens: the tokens (and their log
 * probabilities, ctx->lp_data[*first + i]) not yet returned to the user,
 * [*first, *first + *count); marks them returned. */
void zi_text_context_take_outstanding(zi_text_context *ctx, int64_t *first, int64_t *count);

#endif
