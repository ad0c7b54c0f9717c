/*
 * options.h - the one table of the server's command-line options.
 *
 * Every option that `zinfer serve` takes or passes on to a child process
 * (zinfer-router, zinfer-tokenizer, zinfer-worker, zinfer-http) is
 * declared once, in options.c: its name, the kind of value, the accepted
 * range or choices, the default, which processes take it, and its help
 * line. serve and every child read their command line with
 * zi_options_next and print their option lines with zi_options_usage, so
 * a value is accepted or refused by serve exactly as by the child it is
 * meant for, with the same message ("--max-queue: '0' is not an integer
 * in 1..16777216"), and no help line states a range other than the one
 * checked.
 *
 * Every one of these processes also takes --check-args: it reads and
 * checks its whole command line as it would to start, then exits 0
 * without starting anything (serve also checks what its options say
 * together, --keys and the model and template files it names; a child
 * opens no file). A bad option exits 2 with the message, as always.
 */
#ifndef ZI_OPTIONS_H
#define ZI_OPTIONS_H

#include <stdio.h>

#include "zi_error.h"

/* The options, in the order --help lists them. */
typedef enum zi_opt_id {
    /* where things are: files, addresses, how many processes */
    ZI_O_MODEL,
    ZI_O_MODELS_DIR,
    ZI_O_MODEL_NAME,
    ZI_O_SERVED_MODELS,
    ZI_O_MODELS_MAX,
    ZI_O_LOAD_ON_DEMAND,
    ZI_O_KEEP_ALIVE,
    ZI_O_MODELS_AT_START,
    ZI_O_CHAT_TEMPLATE,
    ZI_O_MMPROJ,
    ZI_O_MAX_IMAGE_PIXELS,
    ZI_O_TTS_DECODER,
    ZI_O_VOICES,
    ZI_O_WORKERS,
    ZI_O_TOKENIZERS,
    ZI_O_BIND,
    ZI_O_BACKEND,
    ZI_O_ROUTER,
    ZI_O_LISTEN,
    ZI_O_HTTP_ROUTER,
    ZI_O_API_KEY,
    ZI_O_KEYS,
    ZI_O_INSECURE,
    /* zinfer-worker */
    ZI_O_THREADS,
    ZI_O_DEVICE,
    ZI_O_ACT_BITS,
    ZI_O_SLOTS,
    ZI_O_CTX_SIZE,
    ZI_O_KV_CACHE_TOKENS,
    ZI_O_KV_CACHE_BYTES,
    ZI_O_KV_TYPE,
    ZI_O_MEMORY_BUDGET,
    ZI_O_BATCH_SIZE,
    ZI_O_PREFILL_CHUNK,
    ZI_O_BLOCK_SIZE,
    ZI_O_NUM_STEPS,
    ZI_O_NO_PREFIX_CACHE,
    ZI_O_KV_DISK,
    ZI_O_KV_DISK_BYTES,
    ZI_O_SPEC_LOOKUP,
    ZI_O_NO_SPEC_LOOKUP,
    ZI_O_DRAFT_MODEL,
    ZI_O_LORA,
    ZI_O_ORPHAN_TIMEOUT,
    /* zinfer-router */
    ZI_O_MAX_QUEUE,
    ZI_O_MAX_QUEUE_PER_MODEL,
    ZI_O_RESUME_GRACE,
    ZI_O_MAX_PROMPT_TOKENS,
    ZI_O_MAX_NEW_TOKENS,
    ZI_O_MAX_THINKING_TOKENS,
    ZI_O_MAX_EMBED_INPUTS,
    ZI_O_MAX_EMBED_TOKENS,
    ZI_O_HEARTBEAT_TIMEOUT,
    ZI_O_FAILOVER_TIMEOUT,
    ZI_O_REQUEST_TIMEOUT,
    ZI_O_CLIENT_HEARTBEAT,
    ZI_O_MAX_FRAME_BYTES,
    /* zinfer-http */
    ZI_O_MAX_BODY_BYTES,
    ZI_O_MAX_IMAGES,
    ZI_O_MAX_IMAGE_BYTES,
    ZI_O_MAX_HEADER_BYTES,
    ZI_O_MAX_CONNECTIONS,
    ZI_O_TIMEOUT,
    ZI_O_HEADER_TIMEOUT,
    ZI_O_ROUTER_TIMEOUT,
    ZI_O_RESPONSES_STORE_MAX,
    ZI_O_RESPONSES_STORE_BYTES,
    ZI_O_REASONING_FORMAT,
    ZI_O_TOOL_CALL_FORMAT,
    ZI_O_MODEL_TOOL_CALL_FORMAT,
    ZI_O_NO_WEBUI,
    /* CURVE key files (serve makes them from --keys) */
    ZI_O_ROUTER_CURVE_SECRET,
    ZI_O_BACKEND_KEYS,
    ZI_O_CLIENT_KEYS,
    ZI_O_CURVE_SECRET,
    ZI_O_ROUTER_KEY,
    /* every process */
    ZI_O_LOG_LEVEL,
    ZI_O_CHECK_ARGS,
    ZI_O_HELP, /* -h, --help */
    ZI_O_COUNT
} zi_opt_id;

typedef enum zi_opt_type {
    ZI_OPT_FLAG,     /* no value (*num is 1) */
    ZI_OPT_INT,      /* an integer in lo..hi, and one of choices when set ("8|16") */
    ZI_OPT_SIZE,     /* a byte count in lo..hi, K/M/G/T suffixes (zi_parse_size) */
    ZI_OPT_ENUM,     /* one of the words in choices; *num is its index */
    ZI_OPT_HOSTPORT, /* HOST:PORT or [IPv6]:PORT: port lo..hi, host < ZI_OPT_HOST_MAX bytes */
    ZI_OPT_STRING,   /* any text: a path, an address or a key, which its user checks */
} zi_opt_type;

/* The longest HOST of a ZI_OPT_HOSTPORT value, its NUL included. */
#define ZI_OPT_HOST_MAX 256

/* Which processes take an option (zi_option.owners). ZI_OWN_SERVE: `zinfer
 * serve` takes it (as serve_name when that is set) and acts on it itself;
 * ZI_OWN_SERVE_PASS: serve checks it and passes it on, under `name` and
 * unchanged, to each child that takes it. */
enum {
    ZI_OWN_ROUTER = 1u << 0,
    ZI_OWN_TOKENIZER = 1u << 1,
    ZI_OWN_WORKER = 1u << 2,
    ZI_OWN_HTTP = 1u << 3,
    ZI_OWN_SERVE = 1u << 4,
    ZI_OWN_SERVE_PASS = 1u << 5,
    ZI_OWN_CHILDREN = ZI_OWN_ROUTER | ZI_OWN_TOKENIZER | ZI_OWN_WORKER | ZI_OWN_HTTP,
};

typedef struct zi_option {
    const char *name;       /* as the children spell it: "--max-queue" */
    const char *serve_name; /* as zinfer serve spells it, when that differs */
    zi_opt_type type;
    long long lo, hi;    /* INT, SIZE: the range; HOSTPORT: the port's */
    const char *choices; /* ENUM: "debug|info|..."; INT: the values allowed, or NULL */
    long long def;       /* the default (ENUM: its index) */
    /* How --help says the default when not def: "tcp://127.0.0.1:5555"; ""
     * says nothing (the help line explains, or there is none) and lets def
     * lie outside lo..hi (0 for "not given"). */
    const char *def_text;
    unsigned owners;        /* ZI_OWN_* */
    const char *metavar;    /* "N", "MS", "ADDR"; NULL for a FLAG */
    const char *help;       /* wrapped by zi_options_usage */
    const char *serve_help; /* serve's help and default, when they differ */
} zi_option;

/* The table's entry for id (ZI_O_COUNT: NULL). */
const zi_option *zi_option_get(zi_opt_id id);

/* An option's default (def), for the processes' initial settings. */
long long zi_option_def(zi_opt_id id);

/* The option `flag` names in the processes `who` (ZI_OWN_* bits: one
 * child's, or ZI_OWN_SERVE | ZI_OWN_SERVE_PASS, which matches serve_name
 * where set), or NULL. *id (may be NULL) is set when found. */
const zi_option *zi_option_find(unsigned who, const char *flag, zi_opt_id *id);

/* Checks s as the value of option o, named flag in the message (the
 * spelling the user gave): ZI_OK with *num set (INT, SIZE; ENUM: the
 * choice's index; FLAG, STRING and HOSTPORT: 0), else ZI_EINVAL. */
int zi_option_parse(const zi_option *o, const char *flag, const char *s, long long *num,
                    zi_error *err);

/* Reads the option at argv[*i] as the processes `who` take it (see
 * zi_option_find): *id says which, *num its value as zi_option_parse
 * gives it (a FLAG's is 1), *str the value's text (NULL for a FLAG);
 * *i moves to the option's last argument. "-h" is ZI_O_HELP. ZI_EINVAL
 * with err set for an unknown option or a missing or bad value. */
int zi_options_next(unsigned who, int argc, char **argv, int *i, zi_opt_id *id, long long *num,
                    const char **str, zi_error *err);

/* "HOST:PORT" or "[IPv6]:PORT" (checked as ZI_OPT_HOSTPORT) split into
 * host (the brackets dropped; cap >= ZI_OPT_HOST_MAX) and *port. */
int zi_option_host_port(const zi_option *o, const char *flag, const char *s, char *host, size_t cap,
                        int *port, zi_error *err);

/* Prints the --help line of every option whose owners hold all the bits
 * of all_of, in table order: the name and metavar padded to col columns,
 * then the help, its default and its accepted range ("(default 256)
 * [1..16777216]"), wrapped at 79 columns. With ZI_OWN_SERVE or
 * ZI_OWN_SERVE_PASS in all_of, serve's names and help. */
void zi_options_usage(FILE *out, unsigned all_of, int col);

#endif
