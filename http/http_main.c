/*
 * http_main.c - zinfer-http: the OpenAI-compatible HTTP front end
 * (docs/http.md). A client of zinfer-router like any other
 * (docs/protocol.md); `zinfer serve --http ADDR` starts and supervises it.
 * This file reads the command line and runs the server (http_server.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "args.h"
#include "http_ctx.h"
#include "http_server.h"
#include "log.h"
#include "stop_signal.h"

static const char USAGE[] =
    "usage: zinfer-http [options]\n"
    "\n"
    "Serves the OpenAI HTTP API (POST /v1/chat/completions, /v1/completions,\n"
    "GET /v1/models, /health, /metrics, POST /tokenize, /detokenize; docs/http.md)\n"
    "as a client of zinfer-router. `zinfer serve --http ADDR` starts it for you.\n"
    "\n"
    "  --listen HOST:PORT        HTTP address (default 127.0.0.1:8080)\n"
    "  --router ADDR             the router's client address (default tcp://127.0.0.1:5555)\n"
    "  --api-key KEY             require 'Authorization: Bearer KEY' (default: the\n"
    "                            ZINFER_API_KEY environment variable; none when unset)\n"
    "  --max-body-bytes B        largest request body, else 413 (default 4M)\n"
    "  --max-header-bytes B      memory for one request's header, else 431 (default 32K)\n"
    "  --max-connections N       open connections at once (default 256)\n"
    "  --timeout S               close a connection idle for S seconds (default 60)\n"
    "  --header-timeout S        close a connection whose request line and headers have\n"
    "                            not all arrived S seconds after it was accepted (a kept-\n"
    "                            alive connection: --timeout + S after its last answer)\n"
    "                            (default 10)\n"
    "  --router-timeout S        the longest wait for the router's next reply (default 300)\n"
    "  --log-level L             debug|info|warn|error|off (default info)\n"
    "  -h, --help                this text\n";

static int split_listen(const char *v, zi_http_config *c) {
    const char *colon = strrchr(v, ':');
    if (!colon || colon == v) return -1;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535) return -1;
    size_t n = (size_t)(colon - v);
    if (v[0] == '[' && n >= 2 && v[n - 1] == ']') v++, n -= 2; /* [::1]:8080 */
    if (n >= sizeof c->host) return -1;
    memcpy(c->host, v, n);
    c->host[n] = '\0';
    c->port = (int)port;
    return 0;
}

int main(int argc, char **argv) {
    zi_logger lg = {.out = stderr, .level = ZI_LOG_INFO, .tag = "zinfer-http"};
    zi_http_config cfg = {.port = 8080,
                          .max_body = 4 << 20,
                          .max_header = 32 << 10,
                          .max_connections = 256,
                          .timeout_s = 60,
                          .header_timeout_s = 10,
                          .lg = &lg};
    snprintf(cfg.host, sizeof cfg.host, "127.0.0.1");
    cfg.api_key = getenv("ZINFER_API_KEY");
    const char *router = "tcp://127.0.0.1:5555";
    long long router_timeout = 300;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "zinfer-http: unknown option or missing value '%s' (see --help)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        zi_error err = {0};
        long long x = 0;
        int rc = 0;
        if (!strcmp(a, "--listen")) {
            if (split_listen(v, &cfg))
                rc = zi_error_set(&err, ZI_EINVAL, "--listen: '%s' is not HOST:PORT", v);
        } else if (!strcmp(a, "--router"))
            router = v;
        else if (!strcmp(a, "--api-key"))
            cfg.api_key = v;
        else if (!strcmp(a, "--max-body-bytes")) {
            if (!(rc = zi_parse_size(a, v, 64, 1LL << 30, &x, &err))) cfg.max_body = (size_t)x;
        } else if (!strcmp(a, "--max-header-bytes")) {
            if (!(rc = zi_parse_size(a, v, 1024, 1LL << 24, &x, &err))) cfg.max_header = (size_t)x;
        } else if (!strcmp(a, "--max-connections")) {
            if (!(rc = zi_parse_int(a, v, 1, 65536, &x, &err))) cfg.max_connections = (unsigned)x;
        } else if (!strcmp(a, "--timeout")) {
            if (!(rc = zi_parse_int(a, v, 1, 86400, &x, &err))) cfg.timeout_s = (unsigned)x;
        } else if (!strcmp(a, "--header-timeout")) {
            if (!(rc = zi_parse_int(a, v, 1, 86400, &x, &err))) cfg.header_timeout_s = (unsigned)x;
        } else if (!strcmp(a, "--router-timeout")) {
            rc = zi_parse_int(a, v, 1, 86400, &router_timeout, &err);
        } else if (!strcmp(a, "--log-level")) {
            int l = zi_log_level_parse(v);
            if (l < 0) rc = zi_error_set(&err, ZI_EINVAL, "--log-level: '%s' is unknown", v);
            lg.level = l;
        } else {
            fprintf(stderr, "zinfer-http: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (rc) {
            fprintf(stderr, "zinfer-http: %s\n", err.msg);
            return 2;
        }
    }
    void *zctx = zmq_ctx_new();
    if (!zctx) {
        fprintf(stderr, "zinfer-http: cannot start ZeroMQ\n");
        return 1;
    }
    zi_http_limits lim = {(int)(router_timeout * 1000), 5000};
    zi_http_ctx ctx;
    if (zi_http_ctx_init(&ctx, &cfg, &lim, zctx, router)) {
        fprintf(stderr, "zinfer-http: cannot set up the server's state\n");
        zmq_ctx_term(zctx);
        return 1;
    }
    zi_stop_signals_install();
    int rc = zi_http_serve(&ctx);
    zmq_ctx_term(zctx);
    zi_http_ctx_destroy(&ctx);
    return rc;
}
