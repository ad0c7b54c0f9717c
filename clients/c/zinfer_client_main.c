/*
 * zinfer_client_main.c - the `zinfer-client` command: sends one prompt to a
 * running `zinfer serve` (through the C client library, zinfer_client.h)
 * and streams the completion to stdout.
 *
 *   zinfer-client [--router ADDR] [--max-tokens N] [--ignore-eos]
 *                 [--temperature T] [--top-k K] [--stop TEXT]...
 *                 [--no-stream] [--json] [--timeout MS] [--router-timeout MS]
 *                 [--curve-secret FILE --router-key FILE] PROMPT
 *
 * It is both a usable tool and the C library's end-to-end test driver
 * (tests/e2e/test_server_load.py). Errors print one line on stderr
 * ("zinfer-client: <what is wrong>") and exit 1; bad usage exits 2.
 */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "curve.h"
#include "zinfer_client.h"

static const char USAGE[] =
    "usage: zinfer-client [options] PROMPT\n"
    "\n"
    "Sends PROMPT (special-token text such as <|im_start|> is parsed) to a\n"
    "running `zinfer serve` and streams the completion to stdout.\n"
    "\n"
    "  --router ADDR     the router's client address (default tcp://127.0.0.1:5555)\n"
    "  --max-tokens N    tokens to generate (default: the server's)\n"
    "  --ignore-eos      do not stop at end-of-sequence tokens\n"
    "  --temperature T   sample at temperature T (default: the server's, greedy)\n"
    "  --top-k K         sample among the K likeliest tokens (0 or -1: all)\n"
    "  --stop TEXT       end the completion before TEXT (repeat: up to 8)\n"
    "  --no-stream       ask for the whole text at the end instead of chunks\n"
    "  --json            print only, on one line, a JSON object with id, text,\n"
    "                    token_ids, finish_reason, prompt_tokens, completion_tokens\n"
    "  --timeout MS      longest wait for any reply (default 120000)\n"
    "  --router-timeout MS  how long to wait for a router that went away to come\n"
    "                    back (the stream then resumes where it stopped); past it\n"
    "                    the request ends with a router_lost error (default 30000)\n"
    "  --curve-secret FILE  this client's CURVE secret key (`zinfer keygen`), with\n"
    "  --router-key FILE    the router's public key (docs/security.md)\n"
    "  -h, --help        this text\n";

/* A positive integer flag value, or -1. */
static long long parse_pos(const char *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v <= 0) return -1;
    return v;
}

/* Growable buffers for the --json summary. */
typedef struct out_buf {
    char *text;
    size_t text_len, text_cap;
    int64_t *ids;
    size_t n_ids, ids_cap;
} out_buf;

static int append(out_buf *o, const zi_client_event *ev) {
    if (ev->text_len) {
        if (o->text_len + ev->text_len + 1 > o->text_cap) {
            size_t c = (o->text_len + ev->text_len + 1) * 2;
            char *p = realloc(o->text, c);
            if (!p) return -1;
            o->text = p, o->text_cap = c;
        }
        memcpy(o->text + o->text_len, ev->text, ev->text_len);
        o->text_len += ev->text_len;
    }
    if (ev->n_token_ids) {
        if (o->n_ids + ev->n_token_ids > o->ids_cap) {
            size_t c = (o->n_ids + ev->n_token_ids) * 2;
            int64_t *p = realloc(o->ids, c * sizeof *p);
            if (!p) return -1;
            o->ids = p, o->ids_cap = c;
        }
        memcpy(o->ids + o->n_ids, ev->token_ids, ev->n_token_ids * sizeof *o->ids);
        o->n_ids += ev->n_token_ids;
    }
    return 0;
}

static int print_json(const char *id, const out_buf *o, const zi_client_event *fin) {
    json_t *j = json_object(), *ids = json_array();
    if (!j || !ids) return -1;
    for (size_t i = 0; i < o->n_ids; i++) json_array_append_new(ids, json_integer(o->ids[i]));
    json_object_set_new(j, "id", json_string(id));
    json_t *t = json_stringn(o->text ? o->text : "", o->text_len);
    json_object_set_new(j, "text", t ? t : json_null()); /* the server sends valid UTF-8 */
    json_object_set_new(j, "token_ids", ids);
    json_object_set_new(j, "finish_reason", fin->status ? json_string(fin->status) : json_null());
    json_object_set_new(j, "prompt_tokens", json_integer(fin->prompt_tokens));
    json_object_set_new(j, "completion_tokens", json_integer(fin->completion_tokens));
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return -1;
    printf("%s\n", s);
    free(s);
    return 0;
}

int main(int argc, char **argv) {
    const char *router = "tcp://127.0.0.1:5555", *prompt = NULL;
    const char *curve_secret = NULL, *router_key = NULL;
    long long max_tokens = -1, timeout = 120000, router_timeout = 30000;
    int json = 0, stream = 1, ignore_eos = 0;
    const char *stop[8];
    size_t n_stop = 0;
    zi_client_request r;
    zi_client_request_init(&r);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--no-stream")) {
            stream = 0;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = 1;
        } else if (!strcmp(a, "--temperature") || !strcmp(a, "--top-k") || !strcmp(a, "--stop")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "zinfer-client: %s needs a value (see --help)\n", a);
                return 2;
            }
            const char *v = argv[++i];
            char *end;
            errno = 0;
            if (!strcmp(a, "--stop")) {
                if (n_stop == sizeof stop / sizeof stop[0]) {
                    fprintf(stderr, "zinfer-client: more than 8 --stop strings\n");
                    return 2;
                }
                stop[n_stop++] = v;
            } else if (!strcmp(a, "--temperature")) {
                r.temperature = strtod(v, &end);
                if (errno || end == v || *end || !(r.temperature >= 0)) {
                    fprintf(stderr, "zinfer-client: --temperature '%s' is not a number >= 0\n", v);
                    return 2;
                }
                r.set_temperature = 1;
            } else {
                r.top_k = strtoll(v, &end, 10);
                if (errno || end == v || *end || r.top_k < -1) {
                    fprintf(stderr, "zinfer-client: --top-k '%s' is not an integer >= -1\n", v);
                    return 2;
                }
                r.set_top_k = 1;
            }
        } else if (!strcmp(a, "--router") || !strcmp(a, "--max-tokens") ||
                   !strcmp(a, "--timeout") || !strcmp(a, "--router-timeout") ||
                   !strcmp(a, "--curve-secret") || !strcmp(a, "--router-key")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "zinfer-client: %s needs a value (see --help)\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--router")) {
                router = v;
            } else if (!strcmp(a, "--curve-secret")) {
                curve_secret = v;
            } else if (!strcmp(a, "--router-key")) {
                router_key = v;
            } else {
                long long n = parse_pos(v);
                bool ms = !strcmp(a, "--timeout") || !strcmp(a, "--router-timeout");
                if (n < 0 || (ms && n > 2147483647LL)) {
                    fprintf(stderr, "zinfer-client: %s '%s' is not a positive integer\n", a, v);
                    return 2;
                }
                if (!strcmp(a, "--timeout"))
                    timeout = n;
                else if (!strcmp(a, "--router-timeout"))
                    router_timeout = n;
                else
                    max_tokens = n;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "zinfer-client: unknown option '%s' (see --help)\n", a);
            return 2;
        } else if (prompt) {
            fprintf(stderr, "zinfer-client: only one PROMPT is allowed (quote it)\n");
            return 2;
        } else {
            prompt = a;
        }
    }
    if (!prompt) {
        fprintf(stderr, "zinfer-client: missing PROMPT (see --help)\n");
        return 2;
    }

    zi_error err = {0};
    zi_client *c = NULL;
    r.prompt = prompt;
    r.stop = n_stop ? stop : NULL;
    r.n_stop = n_stop;
    r.max_new_tokens = max_tokens;
    r.ignore_eos = ignore_eos;
    r.stream = stream;
    char id[ZI_CLIENT_ID_MAX + 1];
    zi_curve_client keys;
    int rc = zi_curve_client_load(curve_secret, router_key, &keys, &err);
    if (rc) {
        fprintf(stderr, "zinfer-client: %s\n", err.msg);
        return 2;
    }
    rc = zi_client_connect_curve(&c, router, (int)timeout, keys.on ? keys.secret.z85 : NULL,
                                 keys.on ? keys.server.z85 : NULL, &err);
    memset(&keys, 0, sizeof keys);
    if (!rc) zi_client_set_router_timeout(c, (int)router_timeout);
    if (!rc) rc = zi_client_generate(c, &r, id, sizeof id, &err);
    out_buf o = {0};
    zi_client_event ev;
    int status = 1;
    while (!rc && (rc = zi_client_next_event(c, id, &ev, &err)) == ZI_OK) {
        int done = ev.kind != ZI_CLIENT_CHUNK;
        if (ev.kind == ZI_CLIENT_ERROR) {
            fprintf(stderr, "zinfer-client: %s: %s%s%s%s\n", ev.code ? ev.code : "error",
                    ev.message ? ev.message : "(no message)", ev.field ? " (field " : "",
                    ev.field ? ev.field : "", ev.field ? ")" : "");
        } else if (ev.kind == ZI_CLIENT_RESULT) {
            fprintf(stderr, "zinfer-client: unexpected result frame for a generate request\n");
        } else if (append(&o, &ev)) {
            fprintf(stderr, "zinfer-client: out of memory\n");
            done = 1;
        } else if (!json && ev.text_len) {
            /* Chunks as they come; the final's text when not streamed. */
            fwrite(ev.text, 1, ev.text_len, stdout);
            fflush(stdout);
        }
        if (ev.kind == ZI_CLIENT_FINAL) {
            if (json ? print_json(id, &o, &ev) == 0 : (putchar('\n'), 1))
                status = 0;
            else
                fprintf(stderr, "zinfer-client: cannot write the JSON summary\n");
        }
        zi_client_event_free(&ev);
        if (done) break;
    }
    if (rc) fprintf(stderr, "zinfer-client: %s\n", err.msg);
    free(o.text);
    free(o.ids);
    zi_client_close(c);
    if (fflush(stdout) != 0) status = 1;
    return status;
}
