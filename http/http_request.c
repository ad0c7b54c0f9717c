/*
 * http_request.c - OpenAI request JSON -> the router's generate requests
 * (http_request.h). parse_* functions check one field each and say which;
 * pack_request writes one choice's msgpack request from the checked values.
 */
#include "http_request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "duration.h"
#include "keypath.h"
#include "types.h"

/* The checked values of one request, shared by its choices. */
typedef struct checked {
    json_t *root;
    json_t *messages;   /* chat: checked array */
    json_t *prompt_ids; /* completions: array of ints, or NULL */
    const char *prompt; /* completions: text prompt, or NULL */
    size_t prompt_len;
    json_t *stop;            /* string or array of strings, or NULL */
    json_t *response_format; /* an object of a type other than "text", or NULL */
    json_t *logit_bias;      /* a checked, non-empty object, or NULL (borrowed) */
    json_t *tool_format;     /* tool_choice required / named: the constraint (owned) */
    json_t *so_format;       /* structured_outputs.json as a response_format (owned) */
    const char *grammar;     /* GBNF (grammar, structured_outputs.grammar), or NULL */
    char *regex;             /* structured_outputs.regex or .choice (owned), or NULL */
    json_t *template_vars;   /* chat_template_kwargs with enable_thinking and
                              * reasoning_effort (owned), or NULL */
    zi_http_images *images;  /* the request's images: an API's translator's, then the
                              * image_url parts' (borrowed) */
    json_t *lora;            /* llama-server's "lora" list, passed on as it is (the
                              * router's codec checks it; borrowed), or NULL */
    double num[7];
    int has_num[7];
    long long max_tokens, min_tokens, top_k, timeout_ms;
    int skip_special, has_skip_special; /* vLLM's skip_special_tokens, when given */
    int has_max, has_min, has_top_k, ignore_eos, has_ignore_eos, has_timeout;
    int64_t keep_alive_ms; /* Ollama's keep_alive, in ms (-1: forever), when has_keep_alive */
    int has_keep_alive;
    unsigned long long seed;
} checked;

/* The float sampling fields, in the order of checked.num. */
static const char *const NUM_FIELDS[7] = {
    "temperature",        "top_p", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", NULL};

static int get_number(json_t *o, const char *key, double *out, int *has, zi_http_error *e) {
    json_t *v = zi_http_get(o, key);
    *has = 0;
    if (!v) return 0;
    if (!json_is_number(v)) return zi_http_want(e, key, "a number", v);
    *out = json_number_value(v);
    *has = 1;
    return 0;
}

static int get_int(json_t *o, const char *key, long long lo, long long hi, long long *out, int *has,
                   zi_http_error *e) {
    json_t *v = zi_http_get(o, key);
    *has = 0;
    if (!v) return 0;
    if (!json_is_integer(v)) return zi_http_want(e, key, "an integer", v);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return zi_http_fail(e, 400, "invalid_value", key, "%s: %lld is outside [%lld, %lld]", key,
                            x, lo, hi);
    *out = x;
    *has = 1;
    return 0;
}

static int get_bool(json_t *o, const char *key, int *out, zi_http_error *e) {
    json_t *v = zi_http_get(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return zi_http_want(e, key, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

static int unsupported(zi_http_error *e, const char *field, const char *why) {
    return zi_http_fail(e, 400, "unsupported_value", field, "%s: %s", field, why);
}

/* Fields zinfer knows and does not serve yet: refused when they ask for
 * something (an empty list or map, or null, asks for nothing). */
static int refuse_unserved(json_t *o, zi_http_kind kind, zi_http_error *e) {
    json_t *v;
    if ((v = zi_http_get(o, "functions")) && !(json_is_array(v) && json_array_size(v) == 0))
        return unsupported(e, "functions", "the legacy functions are not supported (use tools)");
    if (kind == ZI_HTTP_COMPLETION && (v = zi_http_get(o, "tools")) &&
        !(json_is_array(v) && json_array_size(v) == 0))
        return unsupported(e, "tools", "tools need /v1/chat/completions");
    if ((v = zi_http_get(o, "function_call")) &&
        !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
        return unsupported(e, "function_call", "function calls are not supported");
    if ((v = zi_http_get(o, "audio")))
        return unsupported(e, "audio", "audio output is not supported");
    if ((v = zi_http_get(o, "prediction")))
        return unsupported(e, "prediction", "predicted outputs are not supported");
    if ((v = zi_http_get(o, "web_search_options")))
        return unsupported(e, "web_search_options", "web search is not supported");
    if ((v = zi_http_get(o, "modalities"))) {
        if (!json_is_array(v)) return zi_http_want(e, "modalities", "an array", v);
        size_t i;
        json_t *m;
        json_array_foreach(
            v, i, m) if (!json_is_string(m) ||
                         strcmp(json_string_value(m),
                                "text")) return unsupported(e, "modalities",
                                                            "only [\"text\"] is supported");
    }
    if (kind == ZI_HTTP_COMPLETION) {
        if ((v = zi_http_get(o, "suffix")) && !(json_is_string(v) && !json_string_length(v)))
            return unsupported(e, "suffix", "suffixes (insertion) are not supported");
        if ((v = zi_http_get(o, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == 1))
            return unsupported(e, "best_of", "only 1 is supported (use n for several choices)");
    }
    return 0;
}

/* An image_url part ({"type": "image_url", "image_url": {"url", "detail"?}},
 * or image_url a bare URL string as some clients send): its image decoded
 * into im. pf: the part's field. */
static int image_part(json_t *part, const char *pf, zi_http_images *im, zi_http_error *e) {
    char f[160];
    json_t *iu = json_object_get(part, "image_url"), *url = iu;
    snprintf(f, sizeof f, "%s.image_url", pf);
    if (json_is_object(iu)) {
        json_t *d = json_object_get(iu, "detail");
        snprintf(f, sizeof f, "%s.image_url.detail", pf);
        if (d && !json_is_null(d)) {
            if (!json_is_string(d)) return zi_http_want(e, f, "a string", d);
            const char *ds = json_string_value(d);
            if (strcmp(ds, "auto") && strcmp(ds, "low") && strcmp(ds, "high"))
                return zi_http_fail(e, 400, "invalid_value", f,
                                    "%s: '%.40s' is not one of auto, low, high", f, ds);
        }
        url = json_object_get(iu, "url");
        snprintf(f, sizeof f, "%s.image_url.url", pf);
    }
    if (!json_is_string(url))
        return zi_http_want(e, f, iu && !json_is_object(iu) ? "an object {\"url\"}" : "a string",
                            url ? url : json_null());
    return zi_http_images_add_url(im, json_string_value(url), json_string_length(url), f, e);
}

/* One message's content as text: a string, or text parts joined with
 * "\n" (as vLLM joins them); NULL content only for an assistant. An
 * image_url part is decoded into im and is ZI_MEDIA_MARKER in the text. */
static int message_text(json_t *msg, size_t i, const char *role, zi_http_images *im, char **out,
                        zi_http_error *e) {
    char f[96];
    json_t *c = zi_http_get(msg, "content");
    snprintf(f, sizeof f, "messages[%zu].content", i);
    if (!c) {
        if (strcmp(role, "assistant"))
            return zi_http_fail(e, 400, "missing", f, "%s is missing", f);
        *out = strdup("");
        return *out ? 0 : zi_http_fail(e, 500, "internal", NULL, "out of memory");
    }
    if (json_is_string(c)) {
        *out = strndup(json_string_value(c), json_string_length(c));
        return *out ? 0 : zi_http_fail(e, 500, "internal", NULL, "out of memory");
    }
    if (!json_is_array(c)) return zi_http_want(e, f, "a string or an array of content parts", c);
    size_t total = 0, j;
    json_t *part;
    json_array_foreach(c, j, part) {
        char pf[128];
        snprintf(pf, sizeof pf, "%s[%zu]", f, j);
        if (!json_is_object(part)) return zi_http_want(e, pf, "a content part object", part);
        json_t *t = json_object_get(part, "type");
        snprintf(pf, sizeof pf, "%s[%zu].type", f, j);
        if (!json_is_string(t)) return zi_http_want(e, pf, "a string", t ? t : json_null());
        if (!strcmp(json_string_value(t), "image_url")) {
            snprintf(pf, sizeof pf, "%s[%zu]", f, j);
            if (image_part(part, pf, im, e)) return -1;
            total += sizeof ZI_MEDIA_MARKER;
            continue;
        }
        if (strcmp(json_string_value(t), "text"))
            return zi_http_fail(e, 400, "unsupported_value", pf,
                                "%s: '%s' parts are not supported (only \"text\" and "
                                "\"image_url\")",
                                pf, json_string_value(t));
        json_t *tx = json_object_get(part, "text");
        snprintf(pf, sizeof pf, "%s[%zu].text", f, j);
        if (!json_is_string(tx)) return zi_http_want(e, pf, "a string", tx ? tx : json_null());
        total += json_string_length(tx) + 1;
    }
    char *s = malloc(total + 1), *p = s;
    if (!s) return zi_http_fail(e, 500, "internal", NULL, "out of memory");
    json_array_foreach(c, j, part) {
        if (j) *p++ = '\n';
        if (!strcmp(json_string_value(json_object_get(part, "type")), "image_url")) {
            memcpy(p, ZI_MEDIA_MARKER, sizeof ZI_MEDIA_MARKER - 1);
            p += sizeof ZI_MEDIA_MARKER - 1;
            continue;
        }
        json_t *tx = json_object_get(part, "text");
        memcpy(p, json_string_value(tx), json_string_length(tx));
        p += json_string_length(tx);
    }
    *p = '\0';
    *out = s;
    return 0;
}

/* An assistant message's reasoning_content (vLLM's, DeepSeek's) or
 * reasoning (OpenRouter's, Ollama's): a string the chat template reads as
 * message.reasoning_content (Qwen 3's shows the last turn's). */
static int message_reasoning(json_t *m, size_t i, const char *role, json_t *nm, zi_http_error *e) {
    static const char *const keys[] = {"reasoning_content", "reasoning"};
    for (int k = 0; k < 2; k++) {
        json_t *v = zi_http_get(m, keys[k]);
        char f[96];
        snprintf(f, sizeof f, "messages[%zu].%s", i, keys[k]);
        if (!v) continue;
        if (!json_is_string(v)) return zi_http_want(e, f, "a string", v);
        if (strcmp(role, "assistant"))
            return zi_http_fail(e, 400, "invalid_value", f,
                                "%s: only assistant messages have reasoning", f);
        if (!json_string_length(v)) continue;
        if (memchr(json_string_value(v), 0, json_string_length(v)))
            return zi_http_fail(e, 400, "invalid_value", f, "%s holds a NUL character", f);
        if (json_object_get(nm, "reasoning_content"))
            return zi_http_fail(e, 400, "invalid_value", f,
                                "%s: give one of reasoning_content and reasoning", f);
        json_object_set(nm, "reasoning_content", v);
    }
    return 0;
}

/* messages -> a new array of the router's messages ({"role", "content"},
 * tool_calls, tool_call_id, name). */
static int parse_messages(json_t *o, checked *k, zi_http_error *e) {
    json_t *ms = zi_http_get(o, "messages");
    if (!ms) return zi_http_fail(e, 400, "missing", "messages", "messages is missing");
    if (!json_is_array(ms)) return zi_http_want(e, "messages", "an array", ms);
    if (!json_array_size(ms))
        return zi_http_fail(e, 400, "invalid_value", "messages", "messages is empty");
    k->messages = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        char f[96];
        snprintf(f, sizeof f, "messages[%zu]", i);
        if (!json_is_object(m)) return zi_http_want(e, f, "an object", m);
        json_t *r = json_object_get(m, "role");
        snprintf(f, sizeof f, "messages[%zu].role", i);
        if (!json_is_string(r)) return zi_http_want(e, f, "a string", r ? r : json_null());
        const char *role = json_string_value(r);
        if (!strcmp(role, "developer")) role = "system"; /* OpenAI's newer name for it */
        if (!strcmp(role, "function"))
            return zi_http_fail(e, 400, "unsupported_value", f,
                                "%s: 'function' messages are not supported (use tool)", f);
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
            strcmp(role, "tool"))
            return zi_http_fail(e, 400, "invalid_value", f,
                                "%s: '%s' is not one of system, developer, user, assistant, tool",
                                f, role);
        json_t *tc = zi_http_get(m, "tool_calls");
        snprintf(f, sizeof f, "messages[%zu].tool_calls", i);
        if (tc && !json_is_array(tc)) return zi_http_want(e, f, "an array", tc);
        if (tc && strcmp(role, "assistant"))
            return zi_http_fail(e, 400, "invalid_value", f, "%s: only assistant messages have them",
                                f);
        int calls = tc && json_array_size(tc);
        char *text;
        /* An assistant's tool calls may come without content. */
        if (message_text(m, i, calls ? "assistant" : role, k->images, &text, e)) return -1;
        json_t *content = calls && !zi_http_get(m, "content") ? json_null() : json_string(text);
        free(text);
        if (!content) { /* jansson checked the body's UTF-8; a NUL inside is the one way here */
            snprintf(f, sizeof f, "messages[%zu].content", i);
            return zi_http_fail(e, 400, "invalid_value", f, "%s holds a NUL character", f);
        }
        json_t *nm = json_object();
        json_object_set_new(nm, "role", json_string(role));
        json_object_set_new(nm, "content", content);
        /* Tool results and calls go as they are; the router's tokenizer
         * renders them with the template, or as text turns for a template
         * without tool support (docs/protocol.md). */
        if ((!strcmp(role, "tool") || calls) && zi_http_tools_message(m, i, nm, e)) {
            json_decref(nm);
            return -1;
        }
        if (message_reasoning(m, i, role, nm, e)) {
            json_decref(nm);
            return -1;
        }
        json_array_append_new(k->messages, nm);
    }
    return 0;
}

/* prompt: a string, token ids, or a list of one of those. */
static int parse_prompt(json_t *o, checked *k, zi_http_error *e) {
    json_t *p = zi_http_get(o, "prompt");
    if (!p) return zi_http_fail(e, 400, "missing", "prompt", "prompt is missing");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0); /* a batch of one */
    if (json_is_string(p)) {
        k->prompt = json_string_value(p);
        k->prompt_len = json_string_length(p);
        return 0;
    }
    if (!json_is_array(p)) return zi_http_want(e, "prompt", "a string or an array of token ids", p);
    if (!json_array_size(p))
        return zi_http_fail(e, 400, "invalid_value", "prompt", "prompt is empty");
    size_t i;
    json_t *t;
    json_array_foreach(p, i, t) {
        if (json_is_string(t) || json_is_array(t))
            return unsupported(e, "prompt",
                               "a batch of several prompts is not supported; send "
                               "one request per prompt");
        char f[64];
        snprintf(f, sizeof f, "prompt[%zu]", i);
        if (!json_is_integer(t)) return zi_http_want(e, f, "a token id (an integer)", t);
        if (json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
            return zi_http_fail(e, 400, "invalid_value", f, "%s: %lld is not a token id", f,
                                (long long)json_integer_value(t));
    }
    k->prompt_ids = p;
    return 0;
}

static int parse_stop(json_t *o, checked *k, zi_http_error *e) {
    json_t *s = zi_http_get(o, "stop");
    if (!s) return 0;
    if (json_is_string(s)) {
        k->stop = s;
        return 0;
    }
    if (!json_is_array(s)) return zi_http_want(e, "stop", "a string or an array of strings", s);
    if (json_array_size(s) > ZI_HTTP_MAX_STOP)
        return zi_http_fail(e, 400, "invalid_value", "stop", "stop: at most %d strings",
                            ZI_HTTP_MAX_STOP);
    size_t i;
    json_t *x;
    json_array_foreach(s, i, x) if (!json_is_string(x)) {
        char f[32];
        snprintf(f, sizeof f, "stop[%zu]", i);
        return zi_http_want(e, f, "a string", x);
    }
    k->stop = json_array_size(s) ? s : NULL;
    return 0;
}

static int parse_response_format(json_t *o, checked *k, zi_http_error *e) {
    json_t *rf = zi_http_get(o, "response_format");
    if (!rf) return 0;
    if (!json_is_object(rf)) return zi_http_want(e, "response_format", "an object", rf);
    json_t *t = json_object_get(rf, "type");
    if (!json_is_string(t))
        return zi_http_want(e, "response_format.type", "a string", t ? t : json_null());
    if (strcmp(json_string_value(t), "text")) k->response_format = rf; /* the router checks it */
    return 0;
}

/* One choice of structured_outputs.choice as a regular expression
 * matching it literally (ASCII punctuation escaped). */
static void regex_literal(const char *s, char *out, size_t *n) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c < 0x7F && !(c >= '0' && c <= '9') &&
            !((c | 0x20) >= 'a' && (c | 0x20) <= 'z'))
            out[(*n)++] = '\\';
        out[(*n)++] = (char)c;
    }
}

/* Structured output besides response_format: llama.cpp's `grammar`
 * (GBNF) and vLLM's `structured_outputs`, one of {"json": a schema,
 * "regex": a pattern, "grammar": GBNF, "choice": [strings]}. At most one
 * constraint per request (the router refuses a bad one, by field). */
static int parse_structured(json_t *o, checked *k, zi_http_error *e) {
    json_t *gr = zi_http_get(o, "grammar"), *so = zi_http_get(o, "structured_outputs");
    if (!gr && !so) return 0;
    const char *f = gr ? "grammar" : "structured_outputs";
    if ((gr && so) || k->response_format)
        return zi_http_fail(e, 400, "invalid_value", f,
                            "%s: give one of response_format, grammar and structured_outputs", f);
    if (gr) {
        if (!json_is_string(gr) || !json_string_length(gr))
            return zi_http_want(e, "grammar", "a non-empty string", gr);
        k->grammar = json_string_value(gr);
        return 0;
    }
    if (!json_is_object(so)) return zi_http_want(e, "structured_outputs", "an object", so);
    if (json_object_size(so) != 1)
        return zi_http_fail(e, 400, "invalid_value", "structured_outputs",
                            "structured_outputs: give exactly one of json, regex, grammar, choice");
    json_t *v;
    if ((v = json_object_get(so, "json"))) {
        json_t *schema = json_is_string(v) ? json_loads(json_string_value(v), JSON_DECODE_ANY, NULL)
                                           : json_incref(v);
        if (!schema || !(json_is_object(schema) || json_is_boolean(schema))) {
            json_decref(schema);
            return zi_http_want(e, "structured_outputs.json", "a JSON schema", v);
        }
        k->so_format = json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", schema);
        if (!k->so_format) return zi_http_fail(e, 500, "internal", NULL, "out of memory");
        k->response_format = k->so_format;
    } else if ((v = json_object_get(so, "regex"))) {
        if (!json_is_string(v) || !json_string_length(v))
            return zi_http_want(e, "structured_outputs.regex", "a non-empty string", v);
        if (!(k->regex = strdup(json_string_value(v))))
            return zi_http_fail(e, 500, "internal", NULL, "out of memory");
    } else if ((v = json_object_get(so, "grammar"))) {
        if (!json_is_string(v) || !json_string_length(v))
            return zi_http_want(e, "structured_outputs.grammar", "a non-empty string", v);
        k->grammar = json_string_value(v);
    } else if ((v = json_object_get(so, "choice"))) {
        size_t i, len = 4;
        json_t *c;
        if (!json_is_array(v) || !json_array_size(v))
            return zi_http_want(e, "structured_outputs.choice", "a non-empty array of strings", v);
        json_array_foreach(v, i, c) {
            if (!json_is_string(c) || !json_string_length(c))
                return zi_http_want(e, "structured_outputs.choice", "a non-empty array of strings",
                                    v);
            len += 2 * json_string_length(c) + 1;
        }
        if (!(k->regex = malloc(len)))
            return zi_http_fail(e, 500, "internal", NULL, "out of memory");
        size_t n = 0;
        json_array_foreach(v, i, c) {
            if (i) k->regex[n++] = '|';
            regex_literal(json_string_value(c), k->regex, &n);
        }
        k->regex[n] = 0;
    } else {
        return unsupported(
            e, "structured_outputs",
            "structured_outputs: only json, regex, grammar and choice are supported");
    }
    return 0;
}

/* logit_bias: an object of token id (a string of decimal digits, as
 * OpenAI's) -> a number in [-100, 100], at most ZI_LOGIT_BIAS_MAX entries.
 * Whether the ids are in the vocabulary the tokenizer says (the router's
 * sampling_params.logit_bias error comes back as logit_bias). */
static int parse_logit_bias(json_t *o, checked *k, zi_http_error *e) {
    json_t *v = zi_http_get(o, "logit_bias");
    if (!v) return 0;
    if (!json_is_object(v)) return zi_http_want(e, "logit_bias", "an object", v);
    if (json_object_size(v) > ZI_LOGIT_BIAS_MAX)
        return zi_http_fail(e, 400, "invalid_value", "logit_bias",
                            "logit_bias: %zu entries exceed the limit of %d", json_object_size(v),
                            ZI_LOGIT_BIAS_MAX);
    const char *key;
    json_t *b;
    json_object_foreach(v, key, b) {
        size_t n = strlen(key);
        long long id = n && n <= 10 ? 0 : -1;
        for (size_t i = 0; i < n && id >= 0; i++)
            id = key[i] >= '0' && key[i] <= '9' ? id * 10 + (key[i] - '0') : -1;
        if (id < 0 || id > INT32_MAX) {
            char nm[48];
            zi_printable(nm, sizeof nm, key, n);
            return zi_http_fail(e, 400, "invalid_value", "logit_bias",
                                "logit_bias: key \"%s\" is not a token id", nm);
        }
        if (!json_is_number(b))
            return zi_http_fail(e, 400, "invalid_type", "logit_bias",
                                "logit_bias.%s: expected a number, got %s", key,
                                zi_http_type_name(b));
        double x = json_number_value(b);
        if (!(x >= -ZI_LOGIT_BIAS_LIMIT && x <= ZI_LOGIT_BIAS_LIMIT))
            return zi_http_fail(e, 400, "invalid_value", "logit_bias",
                                "logit_bias.%s: %g is outside [-100, 100]", key, x);
    }
    if (json_object_size(v)) k->logit_bias = v;
    return 0;
}

/* Chat's reasoning fields (docs/http.md, "Reasoning"): reasoning_format,
 * max_thinking_tokens, and the chat template's variables:
 * chat_template_kwargs (an object, each key a variable), enable_thinking
 * (its enable_thinking) and reasoning_effort (its reasoning_effort). */
static int parse_reasoning(json_t *o, checked *k, zi_http_gen *g, zi_http_error *e) {
    json_t *v = zi_http_get(o, "reasoning_format");
    if (v) {
        if (!json_is_string(v)) return zi_http_want(e, "reasoning_format", "a string", v);
        const char *f = json_string_value(v);
        /* llama-server's names of the separate format too */
        if (!strcmp(f, "separate") || !strcmp(f, "auto") || !strcmp(f, "deepseek"))
            g->reasoning.format = ZI_REASONING_SEPARATE;
        else if (!strcmp(f, "none"))
            g->reasoning.format = ZI_REASONING_NONE;
        else {
            char nm[48];
            zi_printable(nm, sizeof nm, f, json_string_length(v));
            return zi_http_fail(e, 400, "invalid_value", "reasoning_format",
                                "reasoning_format: '%s' is not one of separate, none", nm);
        }
        g->reasoning.format_given = 1;
    }
    long long x;
    int has;
    if (get_int(o, "max_thinking_tokens", 1, ZI_HTTP_MAX_THINKING, &x, &has, e)) return -1;
    if (has) g->reasoning.max_thinking_tokens = x;
    json_t *kw = zi_http_get(o, "chat_template_kwargs"), *et = zi_http_get(o, "enable_thinking"),
           *re = zi_http_get(o, "reasoning_effort");
    if (kw && !json_is_object(kw)) return zi_http_want(e, "chat_template_kwargs", "an object", kw);
    if (et && !json_is_boolean(et)) return zi_http_want(e, "enable_thinking", "a boolean", et);
    if (re && !json_is_string(re)) return zi_http_want(e, "reasoning_effort", "a string", re);
    if (re && strcmp(json_string_value(re), "low") && strcmp(json_string_value(re), "medium") &&
        strcmp(json_string_value(re), "high")) {
        char nm[48];
        zi_printable(nm, sizeof nm, json_string_value(re), json_string_length(re));
        return zi_http_fail(e, 400, "invalid_value", "reasoning_effort",
                            "reasoning_effort: '%s' is not one of low, medium, high", nm);
    }
    const char *key;
    json_t *x2;
    json_object_foreach(kw, key, x2) {
        if (!key[0])
            return zi_http_fail(e, 400, "invalid_value", "chat_template_kwargs",
                                "chat_template_kwargs: a key is empty (keys name template "
                                "variables)");
    }
    if (!kw && !et && !re) return 0;
    k->template_vars = kw ? json_deep_copy(kw) : json_object();
    if (!k->template_vars) return zi_http_fail(e, 500, "internal", NULL, "out of memory");
    /* the top-level fields win over the same keys in chat_template_kwargs */
    if (et) json_object_set(k->template_vars, "enable_thinking", et);
    if (re) json_object_set(k->template_vars, "reasoning_effort", re);
    if (!json_object_size(k->template_vars)) {
        json_decref(k->template_vars);
        k->template_vars = NULL;
    }
    return 0;
}

/* The sampling fields, logprobs, n, stream. */
static int parse_options(json_t *o, zi_http_kind kind, checked *k, zi_http_gen *g,
                         zi_http_error *e) {
    for (int i = 0; NUM_FIELDS[i]; i++) {
        if (get_number(o, NUM_FIELDS[i], &k->num[i], &k->has_num[i], e)) return -1;
        if (k->has_num[i] && !isfinite(k->num[i]))
            return zi_http_fail(e, 400, "invalid_value", NUM_FIELDS[i], "%s is not finite",
                                NUM_FIELDS[i]);
    }
    const char *max_name = "max_tokens";
    if (kind == ZI_HTTP_CHAT && zi_http_get(o, "max_completion_tokens"))
        max_name = "max_completion_tokens";
    if (get_int(o, max_name, 1, INT32_MAX, &k->max_tokens, &k->has_max, e)) return -1;
    if (!k->has_max && kind == ZI_HTTP_COMPLETION)
        k->max_tokens = 16, k->has_max = 1; /* OpenAI's */
    if (get_int(o, "min_tokens", 0, INT32_MAX, &k->min_tokens, &k->has_min, e)) return -1;
    if (get_int(o, "top_k", -1, INT32_MAX, &k->top_k, &k->has_top_k, e)) return -1;
    k->has_skip_special = zi_http_get(o, "skip_special_tokens") != NULL;
    if (get_bool(o, "skip_special_tokens", &k->skip_special, e)) return -1;
    k->has_ignore_eos = zi_http_get(o, "ignore_eos") != NULL;
    if (get_bool(o, "ignore_eos", &k->ignore_eos, e)) return -1;
    /* zinfer's extension: the router's deadline (docs/http.md, "Deadlines") */
    if (get_int(o, "timeout_ms", 1, ZI_MAX_TIMEOUT_MS, &k->timeout_ms, &k->has_timeout, e))
        return -1;
    g->timeout_ms = k->has_timeout ? k->timeout_ms : 0;
    /* llama-server's LoRA adapters ([{"id" or "name", "scale"}], docs/lora.md) */
    k->lora = zi_http_get(o, "lora");
    if (k->lora && !json_is_array(k->lora)) return zi_http_want(e, "lora", "an array", k->lora);
    /* Ollama's keep_alive: how long the model stays loaded once idle */
    json_t *ka = zi_http_get(o, "keep_alive");
    if (ka && !json_is_null(ka)) {
        zi_error ke = {0};
        int krc =
            json_is_string(ka) ? zi_duration_parse(json_string_value(ka), json_string_length(ka),
                                                   "keep_alive", &k->keep_alive_ms, &ke)
            : json_is_number(ka)
                ? zi_duration_seconds(json_number_value(ka), "keep_alive", &k->keep_alive_ms, &ke)
                : zi_error_set(&ke, ZI_EINVAL,
                               "keep_alive: expected a number of seconds or a duration "
                               "such as \"5m\"");
        if (krc) return zi_http_fail(e, 400, "invalid_value", "keep_alive", "%s", ke.msg);
        k->has_keep_alive = 1;
    }
    long long x;
    int has;
    if (get_int(o, "n", 1, ZI_HTTP_MAX_N, &x, &has, e)) return -1;
    g->n = has ? (int)x : 1;
    json_t *sv = zi_http_get(o, "seed");
    if (sv) {
        if (!json_is_integer(sv)) return zi_http_want(e, "seed", "an integer", sv);
        k->seed = (unsigned long long)json_integer_value(sv);
    } else if (getrandom(&k->seed, sizeof k->seed, 0) != sizeof k->seed) {
        k->seed = (unsigned long long)zi_now_ms() * 0x9E3779B97F4A7C15ull;
    }
    if (get_bool(o, "stream", &g->stream, e)) return -1;
    json_t *so = zi_http_get(o, "stream_options");
    if (so) {
        if (!json_is_object(so)) return zi_http_want(e, "stream_options", "an object", so);
        json_t *iu = zi_http_get(so, "include_usage");
        if (iu && !json_is_boolean(iu))
            return zi_http_want(e, "stream_options.include_usage", "a boolean", iu);
        g->include_usage = iu && json_is_true(iu);
    }
    g->logprobs = -1;
    if (kind == ZI_HTTP_CHAT) {
        int lp = 0;
        if (get_bool(o, "logprobs", &lp, e)) return -1;
        if (get_int(o, "top_logprobs", 0, 20, &x, &has, e)) return -1;
        if (has && !lp)
            return zi_http_fail(e, 400, "invalid_value", "top_logprobs",
                                "top_logprobs needs logprobs set to true");
        if (lp) g->logprobs = has ? (int)x : 0;
    } else {
        if (get_int(o, "logprobs", 0, 20, &x, &has, e)) return -1;
        if (has) g->logprobs = (int)x;
        if (get_bool(o, "echo", &g->echo, e)) return -1;
    }
    json_t *m = zi_http_get(o, "model");
    if (m && !json_is_string(m)) return zi_http_want(e, "model", "a string", m);
    if (m && json_string_length(m) >= sizeof g->model)
        return zi_http_fail(e, 404, "model_not_found", "model", "model: the name is too long");
    if (m) snprintf(g->model, sizeof g->model, "%s", json_string_value(m));
    /* The router's names for what failed, back to the request's. */
    const char *map[] = {"sampling_params.max_new_tokens",
                         max_name,
                         "sampling_params.min_new_tokens",
                         "min_tokens",
                         "sampling_params.stop",
                         "stop",
                         "sampling_params.",
                         "",
                         "model_name",
                         "model",
                         "logprobs",
                         kind == ZI_HTTP_CHAT ? "top_logprobs" : "logprobs",
                         NULL};
    memcpy(g->field_map, map, sizeof map);
    return 0;
}

/* A JSON value as msgpack (response_format's schema). */
static void pack_json(msgpack_packer *pk, json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        msgpack_pack_map(pk, json_object_size(v));
        const char *key;
        json_t *x;
        json_object_foreach(v, key, x) {
            zi_pack_str(pk, key);
            pack_json(pk, x);
        }
        break;
    }
    case JSON_ARRAY: {
        msgpack_pack_array(pk, json_array_size(v));
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) pack_json(pk, x);
        break;
    }
    case JSON_STRING:
        zi_pack_strn(pk, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        msgpack_pack_int64(pk, json_integer_value(v));
        break;
    case JSON_REAL:
        msgpack_pack_double(pk, json_real_value(v));
        break;
    case JSON_TRUE:
        msgpack_pack_true(pk);
        break;
    case JSON_FALSE:
        msgpack_pack_false(pk);
        break;
    default:
        msgpack_pack_nil(pk);
        break;
    }
}

/* Choice i's router request. Choice i samples with seed + i, so the
 * choices differ and a seeded request still repeats as a whole. */
static void pack_request(const checked *k, const zi_http_gen *g, int i, msgpack_packer *pk) {
    int tools = g->tools.choice != ZI_TOOLS_OFF;
    /* Control tokens' text is kept with tools on (a format's markers may be
     * control tokens: Mistral's [TOOL_CALLS], Kimi K2's, Command R's, as
     * vLLM's tool parsers ask), unless the request says. */
    int keep_special = k->has_skip_special ? !k->skip_special : tools;
    int n_keys = 6 + (g->logprobs >= 0) + g->echo + (k->stop != NULL) + (g->model[0] != 0) +
                 (k->response_format != NULL) + tools + (k->grammar != NULL) + (k->regex != NULL) +
                 k->has_timeout + k->has_keep_alive + (k->template_vars != NULL) +
                 (g->reasoning.max_thinking_tokens > 0) + keep_special + (k->images->n > 0) +
                 (k->lora != NULL);
    msgpack_pack_map(pk, n_keys);
    char id[16];
    snprintf(id, sizeof id, "g%d", i);
    zi_pack_kv_str(pk, "op", "generate");
    zi_pack_kv_str(pk, "id", id);
    zi_pack_kv_int(pk, "index", i);
    zi_pack_kv_bool(pk, "stream", true);
    if (k->messages) {
        zi_pack_str(pk, "messages");
        pack_json(pk, k->messages);
    } else if (k->prompt) {
        zi_pack_kv_strn(pk, "prompt", k->prompt, k->prompt_len);
    } else {
        zi_pack_str(pk, "prompt");
        pack_json(pk, k->prompt_ids);
    }
    int n_sp = 3 + k->has_max + k->has_min + k->has_ignore_eos + (k->logit_bias != NULL);
    for (int j = 1; NUM_FIELDS[j]; j++) n_sp += k->has_num[j];
    zi_pack_str(pk, "sampling_params");
    msgpack_pack_map(pk, n_sp);
    /* OpenAI samples by default (temperature 1, no top-k); the router's
     * own default is greedy (top_k 1). */
    zi_pack_kv_int(pk, "top_k", k->has_top_k ? k->top_k : 0);
    zi_pack_str(pk, "temperature");
    msgpack_pack_double(pk, k->has_num[0] ? k->num[0] : 1.0);
    for (int j = 1; NUM_FIELDS[j]; j++)
        if (k->has_num[j]) {
            zi_pack_str(pk, NUM_FIELDS[j]);
            msgpack_pack_double(pk, k->num[j]);
        }
    if (k->has_max) zi_pack_kv_int(pk, "max_new_tokens", k->max_tokens);
    if (k->has_min) zi_pack_kv_int(pk, "min_new_tokens", k->min_tokens);
    if (k->has_ignore_eos) zi_pack_kv_bool(pk, "ignore_eos", k->ignore_eos);
    zi_pack_str(pk, "seed");
    msgpack_pack_uint64(pk, k->seed + (unsigned long long)i);
    if (k->logit_bias) { /* parse_logit_bias checked every key and value */
        zi_pack_str(pk, "logit_bias");
        msgpack_pack_map(pk, json_object_size(k->logit_bias));
        const char *key;
        json_t *b;
        json_object_foreach(k->logit_bias, key, b) {
            msgpack_pack_int64(pk, strtoll(key, NULL, 10));
            msgpack_pack_double(pk, json_number_value(b));
        }
    }
    /* 1 at least: the sampled token's own log probability comes with it. */
    if (g->logprobs >= 0) zi_pack_kv_int(pk, "logprobs", g->logprobs ? g->logprobs : 1);
    if (g->echo) zi_pack_kv_bool(pk, "echo", true);
    if (k->stop) {
        zi_pack_str(pk, "stop");
        pack_json(pk, k->stop);
    }
    if (g->model[0]) zi_pack_kv_str(pk, "model_name", g->model);
    if (k->response_format) {
        zi_pack_str(pk, "response_format");
        pack_json(pk, k->response_format);
    }
    if (tools) { /* for the chat template */
        zi_pack_str(pk, "tools");
        pack_json(pk, g->tools.tools);
    }
    if (k->grammar) zi_pack_kv_str(pk, "grammar", k->grammar);
    if (k->regex) zi_pack_kv_str(pk, "regex", k->regex);
    if (k->has_timeout) zi_pack_kv_int(pk, "timeout_ms", k->timeout_ms);
    if (k->has_keep_alive) { /* the router reads "NNNms" exactly */
        char ka[32];
        snprintf(ka, sizeof ka, "%lldms", (long long)k->keep_alive_ms);
        zi_pack_kv_str(pk, "keep_alive", k->keep_alive_ms < 0 ? "-1" : ka);
    }
    if (g->reasoning.max_thinking_tokens)
        zi_pack_kv_int(pk, "max_thinking_tokens", g->reasoning.max_thinking_tokens);
    if (keep_special) zi_pack_kv_bool(pk, "skip_special_tokens", 0);
    if (k->lora) {
        zi_pack_str(pk, "lora");
        pack_json(pk, k->lora);
    }
    if (k->template_vars) { /* the chat template's variables */
        zi_pack_str(pk, "chat_template_options");
        pack_json(pk, k->template_vars);
    }
    if (k->images->n) { /* in the order of the markers in the messages */
        zi_pack_str(pk, "images");
        msgpack_pack_array(pk, k->images->n);
        for (size_t j = 0; j < k->images->n; j++)
            msgpack_pack_bin_with_body(pk, k->images->v[j].p, k->images->v[j].len);
    }
}

json_t *zi_http_parse_object(const char *body, size_t len, zi_http_error *e) {
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root) {
        zi_http_fail(e, 400, "invalid_json", NULL,
                     "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                     je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        zi_http_fail(e, 400, "invalid_json", NULL, "the body must be a JSON object, not %s",
                     zi_http_type_name(root));
        json_decref(root);
        return NULL;
    }
    return root;
}

int zi_http_parse_generate(const char *body, size_t len, zi_http_kind kind,
                           const zi_http_image_limits *lim, zi_http_gen *g, zi_http_error *e) {
    json_t *root = zi_http_parse_object(body, len, e);
    if (!root) {
        memset(g, 0, sizeof *g);
        return -1;
    }
    zi_http_images im;
    zi_http_images_init(&im, lim);
    int rc = zi_http_parse_generate_json(root, kind, &im, g, e);
    zi_http_images_free(&im);
    json_decref(root);
    return rc;
}

int zi_http_parse_generate_json(json_t *root, zi_http_kind kind, zi_http_images *images,
                                zi_http_gen *g, zi_http_error *e) {
    memset(g, 0, sizeof *g);
    g->kind = kind;
    checked k;
    memset(&k, 0, sizeof k);
    k.root = json_incref(root);
    k.images = images;
    int rc = refuse_unserved(k.root, kind, e);
    if (!rc)
        rc = kind == ZI_HTTP_CHAT ? parse_messages(k.root, &k, e) : parse_prompt(k.root, &k, e);
    if (!rc) rc = parse_stop(k.root, &k, e);
    if (!rc) rc = parse_response_format(k.root, &k, e);
    if (!rc) rc = parse_structured(k.root, &k, e);
    if (!rc) rc = parse_options(k.root, kind, &k, g, e);
    if (!rc) rc = parse_logit_bias(k.root, &k, e);
    if (!rc && kind == ZI_HTTP_CHAT) rc = zi_http_tools_parse(k.root, &g->tools, e);
    if (!rc && kind == ZI_HTTP_CHAT) rc = parse_reasoning(k.root, &k, g, e);
    if (!rc && k.template_vars) { /* the router's errors name its field */
        int j = 0;
        while (g->field_map[j]) j += 2;
        g->field_map[j++] = "chat_template_options";
        g->field_map[j++] = "chat_template_kwargs";
        g->field_map[j] = NULL;
    }
    if (!rc && (k.tool_format = zi_http_tools_response_format(&g->tools))) {
        if (k.response_format || k.grammar || k.regex)
            rc = zi_http_fail(e, 400, "invalid_value", "response_format",
                              "response_format: cannot be combined with a tool_choice that "
                              "forces a call");
        k.response_format = k.tool_format;
        /* The constraint's errors are about the tools' parameters. */
        int j = 0;
        while (g->field_map[j]) j += 2;
        g->field_map[j++] = "response_format.json_schema.schema.properties.arguments";
        g->field_map[j++] = "tools.function.parameters";
        g->field_map[j++] = "response_format";
        g->field_map[j++] = "tool_choice";
        g->field_map[j] = NULL;
    }
    if (!rc && k.prompt && g->echo && !(g->prompt = strndup(k.prompt, k.prompt_len)))
        rc = zi_http_fail(e, 500, "internal", NULL, "out of memory");
    if (!rc)
        for (int i = 0; i < g->n; i++) {
            zi_msg_init(&g->req[i]);
            pack_request(&k, g, i, &g->req[i].pk);
        }
    if (rc) g->n = 0;
    json_decref(k.messages);
    json_decref(k.tool_format);
    json_decref(k.so_format);
    json_decref(k.template_vars);
    free(k.regex);
    json_decref(k.root);
    if (rc) zi_http_tools_free(&g->tools);
    return rc;
}

json_t *zi_http_get(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

void zi_http_gen_free(zi_http_gen *g) {
    for (int i = 0; i < g->n; i++) zi_msg_free(&g->req[i]);
    zi_http_tools_free(&g->tools);
    free(g->prompt);
    json_decref(g->api_req);
    g->n = 0;
    g->prompt = NULL;
    g->api_req = NULL;
}
