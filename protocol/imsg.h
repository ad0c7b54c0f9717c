/*
 * imsg.h - the server's messages, one struct, one encoder and one decoder
 * each: the internal protocol between zinfer-router and its backends
 * (register, heartbeat, encode, encoded, start, tokens, decode, decoded,
 * ...) and the router's replies to clients (chunk, final, error, result).
 * docs/protocol.md describes every message and its keys.
 *
 * Why a module: every message is one msgpack map, and a map's header holds
 * its entry count. Counting entries by hand beside a run of optional keys
 * is easy to get wrong, and a wrong count silently corrupts the frame. So
 * every map here is written by a zi_imap, a builder that counts the entries
 * it is given and writes the (smallest) map header when it closes: the
 * bytes are those a correct hand count would give, in the same key order.
 *
 * Encoders (zi_im_*_pack) initialise *out (a zi_msg, msg.h) and fill it;
 * the caller sends it only on ZI_OK, and calls zi_msg_free either way. On
 * failure (ZI_ENOMEM, or an error of a codec.h encoder such as a NaN log
 * probability) *out is empty: a map with a counted key and no value never
 * leaves the builder. Decoders (zi_im_*_unpack) read a parsed
 * map without copying: string and passed-through fields point into the
 * msgpack object, so it must outlive the struct. Each decoder accepts and
 * refuses exactly what the processes' own checks did before this module
 * (the refusal messages are the same), and says in its comment what the
 * receiver does with a missing field.
 *
 * Fields a process only passes on (log probabilities, the echoed prompt)
 * travel as the msgpack objects they arrived as (zi_im_ids.raw,
 * zi_im_lps.raw), so the router forwards bytes it never decodes; the
 * process that makes them gives typed values instead.
 */
#ifndef ZI_IMSG_H
#define ZI_IMSG_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "types.h"
#include "msg.h"
#include "zi_error.h"

/* ---- the map builder ------------------------------------------------------- */

/* A msgpack map being built: entries go to a buffer, after room for the
 * largest map header, and are counted; zi_imap_close writes the smallest
 * header for that count just before them, so no count is ever written by
 * hand. A map in which any write failed is never written out. */
typedef struct zi_imap {
    msgpack_sbuffer sb; /* 5 bytes of header room, then the entries */
    msgpack_packer pk;
    uint32_t n; /* entries so far */
    bool bad;   /* a write failed or a value was not packed: close fails */
} zi_imap;

void zi_imap_init(zi_imap *b);
/* Frees the scratch buffer of a map that will not be closed. */
void zi_imap_free(zi_imap *b);
/* Marks b failed: a caller that took a key and could not pack its value. */
void zi_imap_fail(zi_imap *b);
/* Counts one entry and packs its key; the caller packs exactly one value
 * with the packer returned, or calls zi_imap_fail. */
msgpack_packer *zi_imap_key(zi_imap *b, const char *key);
void zi_imap_str(zi_imap *b, const char *key, const char *val);
void zi_imap_strn(zi_imap *b, const char *key, const char *val, size_t n);
void zi_imap_int(zi_imap *b, const char *key, int64_t val);
void zi_imap_bool(zi_imap *b, const char *key, bool val);
void zi_imap_double(zi_imap *b, const char *key, double val);
/* Packs a parsed msgpack object as the value (when o is NULL, nothing). */
void zi_imap_object(zi_imap *b, const char *key, const msgpack_object *o);
/* Closes child and packs it as the value of key. */
void zi_imap_map(zi_imap *b, const char *key, zi_imap *child);
/* The entries counted so far. */
uint32_t zi_imap_count(const zi_imap *b);
/* Writes the map (header, then entries) to out and frees b. ZI_OK, or
 * ZI_ENOMEM, writing nothing, when b failed; ZI_ENOMEM also when the write
 * to out failed. */
int zi_imap_close(zi_imap *b, msgpack_packer *out);
/* Closes the message map b into out (initialised here), which takes over
 * b's buffer: ZI_OK, or ZI_ENOMEM with out empty when b failed. Every
 * message encoder (imsg.c, imsg_embed.c, imsg_lora.c) ends with it. */
int zi_imap_close_msg(zi_imap *b, zi_msg *out);

/* ---- values that are typed on one side and passed through on another ------- */

/* A string: p NULL means absent. */
typedef struct zi_im_str {
    const char *p;
    size_t n;
} zi_im_str;

/* The string at key in the map o; {NULL, 0} when absent or not a string. */
zi_im_str zi_im_str_at(const msgpack_object *o, const char *key);

/* Token ids: the msgpack object they arrived as (raw), or v[0..n) to be
 * packed numpy-style. set: present (an optional field). own: what a
 * decoder allocated for v (freed by zi_im_ids_free). */
typedef struct zi_im_ids {
    bool set;
    const msgpack_object *raw;
    const int32_t *v;
    size_t n;
    int32_t *own;
} zi_im_ids;

void zi_im_ids_free(zi_im_ids *ids);

/* Log probabilities: the object they arrived as (raw), or typed (lp);
 * absent when both are NULL. */
typedef struct zi_im_lps {
    const msgpack_object *raw;
    const zi_logprobs *lp;
} zi_im_lps;

/* A speech request's new audio (docs/speech.md): on the wire "audio":
 * {"data": bin (little-endian samples), "format": "f32" | "s16",
 * "sample_rate": int}. raw: as it came (passed on whole); else data[0..len)
 * with format and sample_rate to pack (data NULL: absent). */
typedef struct zi_im_audio {
    const msgpack_object *raw;
    const void *data;
    size_t len;
    const char *format;
    int64_t sample_rate;
} zi_im_audio;

/* ---- message types ---------------------------------------------------------- */

typedef enum zi_im_type {
    ZI_IM_UNKNOWN,
    ZI_IM_REGISTER,    /* backend -> router */
    ZI_IM_HEARTBEAT,   /* backend -> router */
    ZI_IM_ERROR,       /* backend -> router */
    ZI_IM_REREGISTER,  /* router -> backend */
    ZI_IM_ENCODE,      /* router -> tokenizer */
    ZI_IM_ENCODED,     /* tokenizer -> router */
    ZI_IM_DECODE,      /* router -> tokenizer */
    ZI_IM_DECODED,     /* tokenizer -> router */
    ZI_IM_RELEASE,     /* router -> tokenizer */
    ZI_IM_TOKENIZE,    /* router -> tokenizer */
    ZI_IM_TOKENIZED,   /* tokenizer -> router */
    ZI_IM_DETOKENIZE,  /* router -> tokenizer */
    ZI_IM_DETOKENIZED, /* tokenizer -> router */
    ZI_IM_START,       /* router -> worker */
    ZI_IM_CANCEL,      /* router -> worker */
    ZI_IM_TOKENS,      /* worker -> router */
    /* the embed op's (imsg_embed.h) */
    ZI_IM_EMBED_ENCODE,  /* router -> tokenizer */
    ZI_IM_EMBED_ENCODED, /* tokenizer -> router */
    ZI_IM_EMBED,         /* router -> worker */
    ZI_IM_EMBEDDED,      /* worker -> router */
    /* adapters loaded and unloaded at run time (imsg_lora.h) */
    ZI_IM_LORA,      /* router -> worker */
    ZI_IM_LORA_DONE, /* worker -> router */
    ZI_IM_N_TYPES
} zi_im_type;

/* The "type" string of t ("register", ...). */
const char *zi_im_type_name(zi_im_type t);
/* The type of a parsed internal message (ZI_IM_UNKNOWN when its "type" is
 * missing, not a string or not one of these). */
zi_im_type zi_im_type_of(const msgpack_object *o);
/* The "rid" of a message: ZI_EINVAL ("rid: missing", "rid: not an
 * integer", "rid: out of range") when it is not an int64. */
int zi_im_rid(const msgpack_object *o, int64_t *rid, zi_error *err);

/* ---- registration and liveness ---------------------------------------------- */

/* One sequence a worker holds when it registers again with a router
 * that restarted (docs/protocol.md, "Router restart"): its rid, the
 * "start" message it got (whole, as it came: its context and the
 * router's "note"), the ids generated so far (after the prompt, those
 * already sent in "tokens" messages; the ending EOS left out) and its
 * status ("active", or the final one of a sequence that ended lately). */
typedef struct zi_im_live {
    int64_t rid;
    const char *start; /* msgpack bin */
    size_t start_len;
    zi_im_ids token_ids;
    zi_im_str status;
    zi_gen_status gstatus; /* unpack: status parsed */
} zi_im_live;

/* One entry of register's "live" array: ZI_EINVAL naming the key ("rid:
 * ...", "start: missing or not bin", the codec's token errors, "status:
 * ...") when it is not one; token_ids decoded into own (free it with
 * zi_im_ids_free), start pointing into o. */
int zi_im_live_unpack(const msgpack_object *o, zi_im_live *m, zi_error *err);

/* register: a tokenizer sends role, vocab and model (the name of the
 * model it tokenizes for; absent from an older one: any model); a worker
 * also slots and max_length, with LoRA adapters "loras", their names by
 * id ("" for a free place; imsg_lora.h), after a router restart "live",
 * the sequences it holds (packed from live[0..n_live) when n_live > 0),
 * and with a prefix cache disk tier (--kv-disk) "kv_disk": {"dir": its
 * directory as given, "id": its sharing id as 16 hex digits (kv_disk.h's
 * zi_kv_disk_share_id: equal for workers that read each other's block
 * files)}. */
typedef struct zi_im_register {
    bool worker;
    int64_t slots, max_length, vocab;
    zi_im_str model;
    const char *const *loras; /* pack: n_loras names (none: the key is left out) */
    size_t n_loras;
    const msgpack_object *loras_obj; /* unpack: the array, or NULL */
    const zi_im_live *live;          /* pack */
    size_t n_live;
    const msgpack_object *live_obj;  /* unpack: the "live" array, NULL when absent */
    zi_im_str kv_disk_dir;           /* the disk tier's directory (for logs) */
    uint64_t kv_disk_id;             /* its sharing id (0: no disk tier; pack: no "kv_disk") */
    /* The prefix-affinity keys of the requests the worker took lately
     * (their start's prefix_key), oldest first: a router that restarted
     * knows from them which prefixes the worker holds. pack: n_prefix_keys
     * of them (none: the key is left out); unpack: prefix_keys_obj, the
     * array, or NULL. */
    const uint64_t *prefix_keys;
    size_t n_prefix_keys;
    const msgpack_object *prefix_keys_obj;
} zi_im_register;

/* ZI_EINVAL (nothing to send) when a live entry's ids cannot be packed. */
int zi_im_register_pack(const zi_im_register *m, zi_msg *out);
/* Never fails: a role other than "worker" is a tokenizer; slots outside
 * 1..65535 is 1, max_length under 2 is 2048, vocab absent is 0, model
 * absent stays absent (p NULL), live_obj NULL unless "live" is an array;
 * a "kv_disk" whose "id" is not 16 hex digits (or is 0) is no disk tier
 * (kv_disk_id 0). */
void zi_im_register_unpack(const msgpack_object *o, zi_im_register *m);

/* reregister: no fields. */
int zi_im_reregister_pack(zi_msg *out);

/* heartbeat: load, and from a worker its KV counters (msg.h's ZI_KV_*). */
typedef struct zi_im_heartbeat {
    int64_t load;
    bool has_kv;
    int64_t kv[ZI_N_KV_STATS];
    bool kv_set[ZI_N_KV_STATS]; /* unpack: the counters present as integers */
} zi_im_heartbeat;

int zi_im_heartbeat_pack(const zi_im_heartbeat *m, zi_msg *out);
/* Never fails: load absent is 0; has_kv when "kv" is a map, and then each
 * counter that is an integer is set (a receiver keeps its last value of
 * the others). */
void zi_im_heartbeat_unpack(const msgpack_object *o, zi_im_heartbeat *m);

/* error (backend -> router): the request rid ends with code and message;
 * field (optional) names the request's key at fault. */
typedef struct zi_im_error {
    int64_t rid;
    /* pack: field NULL takes the path the message starts with
     * (zi_error_field), "" leaves it out */
    const char *code, *message, *field;
    /* unpack: copies, each set only when a string that fits (a longer code
     * or field is left unset, a longer message is cut) */
    char code_buf[64], message_buf[ZI_ERROR_MSG_MAX], field_buf[128];
} zi_im_error;

int zi_im_error_pack(const zi_im_error *m, zi_msg *out);
/* Never fails: rid 0 when not an int64; code, message and field point at
 * the buffers or are NULL. */
void zi_im_error_unpack(const msgpack_object *o, zi_im_error *m);

/* ---- router <-> tokenizer --------------------------------------------------- */

/* encode: rid, max_length (the smallest worker's), the validated request. */
typedef struct zi_im_encode {
    int64_t rid;
    bool has_max_length;
    int64_t max_length;
    const zi_request *request;         /* pack */
    const msgpack_object *request_obj; /* unpack (NULL: absent) */
} zi_im_encode;

int zi_im_encode_pack(const zi_im_encode *m, zi_msg *out, zi_error *err);
/* ZI_EINVAL "request: missing"; a max_length that is not an int64 is
 * absent (the receiver uses its model's). */
int zi_im_encode_unpack(const msgpack_object *o, zi_im_encode *m, zi_error *err);

/* encoded: rid, prompt_tokens, context (a zi_text_context). */
typedef struct zi_im_encoded {
    int64_t rid;
    bool has_prompt_tokens;
    int64_t prompt_tokens;
    const zi_text_context *context;    /* pack */
    const msgpack_object *context_obj; /* unpack (NULL: absent) */
} zi_im_encoded;

int zi_im_encoded_pack(const zi_im_encoded *m, zi_msg *out, zi_error *err);
/* Never fails: rid 0 when not an int64, context_obj NULL when absent. */
void zi_im_encoded_unpack(const msgpack_object *o, zi_im_encoded *m);

/* tokens (worker -> router) and decode (router -> tokenizer): a request's
 * new token ids and status, with its log probabilities and, once, the
 * echoed prompt. */
typedef struct zi_im_tokens {
    int64_t rid;
    zi_im_ids token_ids;
    zi_im_str status;      /* the zi_gen_status name */
    zi_gen_status gstatus; /* unpack: status parsed */
    zi_im_lps logprobs;
    zi_im_ids prompt_token_ids;
    zi_im_lps prompt_logprobs;
    zi_im_audio audio; /* a speech request's samples for these tokens */
} zi_im_tokens;

int zi_im_tokens_pack(const zi_im_tokens *m, zi_msg *out, zi_error *err);
/* ZI_EINVAL when token_ids is missing or status is not a known status
 * string (the router's "malformed tokens message"); token_ids stays raw.
 * rid is read first (0 when not an int64). */
int zi_im_tokens_unpack(const msgpack_object *o, zi_im_tokens *m, zi_error *err);
int zi_im_decode_pack(const zi_im_tokens *m, zi_msg *out, zi_error *err);
/* The tokenizer's checks, in its order: "token_ids: missing", the
 * codec's token errors (token_ids decoded into own: zi_im_tokens_free),
 * then status ("status: missing", "status: not a string", unknown). */
int zi_im_decode_unpack(const msgpack_object *o, zi_im_tokens *m, zi_error *err);
void zi_im_tokens_free(zi_im_tokens *m);

/* decoded: new text, the token ids consumed, the status, and what rides
 * along (log probabilities, the echoed prompt's ids, text and log
 * probabilities). */
typedef struct zi_im_decoded {
    int64_t rid;
    zi_im_str text;
    zi_im_ids token_ids;
    zi_im_str status;
    zi_gen_status gstatus; /* unpack: status parsed */
    zi_im_lps logprobs;
    zi_im_ids prompt_token_ids;
    zi_im_str prompt_text;                 /* pack */
    const msgpack_object *prompt_text_obj; /* unpack: passed on as it came */
    zi_im_lps prompt_logprobs;
    /* "reasoning_open": true on a request's first decoded message when its
     * rendered prompt ended inside an opened thinking section */
    bool reasoning_open;
    /* "reasoning_harmony": true with reasoning_open when the opened section
     * is gpt-oss's harmony analysis channel (not `<think>`) */
    bool reasoning_harmony;
    zi_im_str stop_string; /* "stop_string": the stop string that ended it (p NULL: none) */
    zi_im_audio audio;     /* passed on from decode */
} zi_im_decoded;

int zi_im_decoded_pack(const zi_im_decoded *m, zi_msg *out, zi_error *err);
/* ZI_EINVAL (the router's "malformed decoded message") when text is not a
 * string, token_ids is missing or status is not a known status string;
 * rid is read first. */
int zi_im_decoded_unpack(const msgpack_object *o, zi_im_decoded *m, zi_error *err);

/* cancel (router -> worker) and release (router -> tokenizer): rid only. */
int zi_im_cancel_pack(int64_t rid, zi_msg *out);
int zi_im_release_pack(int64_t rid, zi_msg *out);

/* tokenize: rid, text, add_special (optional bool). */
typedef struct zi_im_tokenize {
    int64_t rid;
    zi_im_str text;
    bool has_add_special;
    bool add_special;
} zi_im_tokenize;

int zi_im_tokenize_pack(const zi_im_tokenize *m, zi_msg *out);
/* The tokenizer's: an add_special that is not a bool is absent (true);
 * then text: "text: missing" / "text: not a string". */
int zi_im_tokenize_unpack(const msgpack_object *o, zi_im_tokenize *m, zi_error *err);

/* detokenize: rid, token_ids. */
typedef struct zi_im_detokenize {
    int64_t rid;
    zi_im_ids token_ids;
} zi_im_detokenize;

int zi_im_detokenize_pack(const zi_im_detokenize *m, zi_msg *out);
/* "token_ids: missing" or the codec's token errors; token_ids decoded
 * into own (zi_im_ids_free). */
int zi_im_detokenize_unpack(const msgpack_object *o, zi_im_detokenize *m, zi_error *err);

/* tokenized / detokenized: rid and the answer (token_ids / text). */
typedef struct zi_im_util_reply {
    int64_t rid;
    zi_im_ids token_ids;             /* tokenized */
    zi_im_str text;                  /* detokenized */
    const msgpack_object *value_obj; /* unpack: the answer as it came */
} zi_im_util_reply;

int zi_im_tokenized_pack(const zi_im_util_reply *m, zi_msg *out);
int zi_im_detokenized_pack(const zi_im_util_reply *m, zi_msg *out);
/* key: "token_ids" or "text". ZI_EINVAL when it is missing (any type is
 * passed on to the client); rid is read first. */
int zi_im_util_reply_unpack(const msgpack_object *o, const char *key, zi_im_util_reply *m,
                            zi_error *err);

/* ---- router -> worker ------------------------------------------------------- */

/* start: rid and the context as the tokenizer made it (passed through);
 * note: the router's own record of the request (a map the worker keeps
 * with the message and hands back after a router restart, unread). */
typedef struct zi_im_start {
    int64_t rid;
    const msgpack_object *context; /* NULL: absent */
    const msgpack_object *note;    /* NULL: absent */
    uint64_t prefix_key;           /* the router's prefix-affinity key (0: absent) */
} zi_im_start;

int zi_im_start_pack(const zi_im_start *m, zi_msg *out);
/* The rid: zi_im_rid's errors; context and note NULL when absent (the
 * worker answers a missing context with an error of its own); prefix_key
 * 0 when absent or not a positive integer. */
int zi_im_start_unpack(const msgpack_object *o, zi_im_start *m, zi_error *err);

/* ---- router -> client (docs/protocol.md, "Replies") ------------------------- */

/* chunk: new text and token ids, and what rides along. */
typedef struct zi_im_chunk {
    zi_im_str id;
    zi_im_str text;
    const msgpack_object *token_ids;
    const msgpack_object *logprobs, *prompt_token_ids, *prompt_logprobs, *prompt_text;
    bool resumed;        /* "resumed": true (the first chunk after a failover) */
    bool reasoning_open; /* "reasoning_open": true (the decoded message's) */
    bool reasoning_harmony; /* "reasoning_harmony": true (the decoded message's) */
    int64_t prompt_tokens; /* "prompt_tokens": the prompt's length, on a request's first
                            * chunk only (0: not sent) */
    const msgpack_object *audio; /* a speech request's samples (zi_im_audio's map) */
} zi_im_chunk;

int zi_im_chunk_pack(const zi_im_chunk *m, zi_msg *out);
int zi_im_chunk_unpack(const msgpack_object *o, zi_im_chunk *m, zi_error *err);

/* final: status, index, usage; not streamed, also the whole text, the log
 * probabilities and the echoed prompt. */
typedef struct zi_im_final {
    zi_im_str id;
    zi_im_str status;
    int64_t index, prompt_tokens, completion_tokens;
    bool has_text; /* not streamed */
    zi_im_str text;
    zi_im_lps logprobs;
    const msgpack_object *prompt_token_ids, *prompt_logprobs, *prompt_text;
    zi_im_str stop_string; /* "stop_string", status "stop" by a stop string (p NULL: none) */
} zi_im_final;

int zi_im_final_pack(const zi_im_final *m, zi_msg *out, zi_error *err);
int zi_im_final_unpack(const msgpack_object *o, zi_im_final *m, zi_error *err);

/* error (router -> client): code, message, field (optional). */
typedef struct zi_im_client_error {
    zi_im_str id, code, message, field; /* field.p NULL: absent */
} zi_im_client_error;

int zi_im_client_error_pack(const zi_im_client_error *m, zi_msg *out);
int zi_im_client_error_unpack(const msgpack_object *o, zi_im_client_error *m, zi_error *err);

/* result of health. */
typedef struct zi_im_health {
    zi_im_str id;
    zi_im_str status;
    int64_t workers, tokenizers, waiting, running;
    int64_t kv[ZI_N_KV_STATS];
    double prefix_hit_rate;
} zi_im_health;

int zi_im_health_pack(const zi_im_health *m, zi_msg *out);
int zi_im_health_unpack(const msgpack_object *o, zi_im_health *m, zi_error *err);

/* result of metrics: the router's counters since it started, for
 * Prometheus (zinfer-http's GET /metrics, docs/http.md). Histograms keep
 * a count per bucket (not cumulative; the last is above every bound) and
 * the sum of the observations, in seconds. */
#define ZI_IM_HIST_BUCKETS 16
extern const double zi_im_hist_bounds[ZI_IM_HIST_BUCKETS]; /* upper bounds, ascending */
enum { ZI_IM_HIST_TTFT, ZI_IM_HIST_ITL, ZI_IM_HIST_E2E, ZI_IM_HIST_QUEUE, ZI_IM_N_HIST };
/* "time_to_first_token", "inter_token_latency", "e2e_latency", "queue_time" */
extern const char *const zi_im_hist_names[ZI_IM_N_HIST];
enum {
    ZI_IM_FIN_EOS,
    ZI_IM_FIN_LENGTH,
    ZI_IM_FIN_STOP,
    ZI_IM_FIN_CANCELLED,
    ZI_IM_FIN_DEADLINE,
    ZI_IM_FIN_ERROR,
    ZI_IM_N_FIN
};
/* "end_of_sequence", "maximum_length", "stop", "cancelled", "deadline_exceeded",
 * "error" */
extern const char *const zi_im_finish_names[ZI_IM_N_FIN];

typedef struct zi_im_hist {
    int64_t count[ZI_IM_HIST_BUCKETS + 1];
    double sum;
} zi_im_hist;

/* Adds one observation of `seconds` to h. */
void zi_im_hist_observe(zi_im_hist *h, double seconds);

#define ZI_IM_MAX_WORKERS 64
typedef struct zi_im_metrics {
    zi_im_str id;
    int64_t running, waiting;
    int64_t finished[ZI_IM_N_FIN]; /* generate requests ended, by how */
    int64_t prompt_tokens, generation_tokens;
    zi_im_hist hist[ZI_IM_N_HIST];
    size_t n_workers; /* the live workers' KV counters, as in health */
    int64_t worker_kv[ZI_IM_MAX_WORKERS][ZI_N_KV_STATS];
} zi_im_metrics;

int zi_im_metrics_pack(const zi_im_metrics *m, zi_msg *out);
int zi_im_metrics_unpack(const msgpack_object *o, zi_im_metrics *m, zi_error *err);

/* result of models: one entry per served model, the default first.
 * state: "loaded" (a worker of it is up), "loading", or (a
 * --load-on-demand router's) "unloaded": no process of it up and no
 * request waiting for one; max_length and vocab are 0 until it is loaded. state is absent from an
 * older router's (unpack: p NULL). */
#define ZI_IM_MAX_MODELS 64
typedef struct zi_im_model_entry {
    zi_im_str name;
    int64_t max_length, vocab;
    zi_im_str state;
    /* With has_usage (a --load-on-demand router's): its requests in flight
     * (active), those of them not on a worker yet (waiting), and the ms
     * since one was admitted or ended (idle_ms; never used: since the
     * router started). */
    bool has_usage;
    int64_t waiting, active, idle_ms;
    /* With has_usage: what is asked of it ("load", "unload": load_model,
     * unload_model or its keep_alive passed; "none"), and how long it stays
     * loaded once idle (keep_alive_ms; -1: forever). */
    zi_im_str want;
    int64_t keep_alive_ms;
} zi_im_model_entry;

typedef struct zi_im_models {
    zi_im_str id;
    size_t n;
    zi_im_model_entry v[ZI_IM_MAX_MODELS];
} zi_im_models;

int zi_im_models_pack(const zi_im_models *m, zi_msg *out);

/* result of load_model / unload_model: the model and where it stands
 * ("loading", "loaded", "unloading", "unloaded"). */
typedef struct zi_im_model_status {
    zi_im_str id, model, status;
} zi_im_model_status;

int zi_im_model_status_pack(const zi_im_model_status *m, zi_msg *out);
int zi_im_model_status_unpack(const msgpack_object *o, zi_im_model_status *m, zi_error *err);
int zi_im_models_unpack(const msgpack_object *o, zi_im_models *m, zi_error *err);

/* result of tokenize / detokenize: key ("token_ids" / "text") and the
 * tokenizer's answer, passed on. */
typedef struct zi_im_result {
    zi_im_str id;
    const char *key;
    const msgpack_object *value;
} zi_im_result;

int zi_im_result_pack(const zi_im_result *m, zi_msg *out);
/* key: the result's key ("token_ids" or "text"), as the caller expects it. */
int zi_im_result_unpack(const msgpack_object *o, const char *key, zi_im_result *m, zi_error *err);

#endif
