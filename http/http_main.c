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

#include "http_ctx.h"
#include "http_server.h"
#include "log.h"
#include "options.h"
#include "response_store.h"
#include "stop_signal.h"

static const char USAGE[] =
    "usage: zinfer-http [options]\n"
    "\n"
    "Serves the OpenAI HTTP API (POST /v1/chat/completions, /v1/completions,\n"
    "/v1/responses, GET and DELETE /v1/responses/ID,\n"
    "GET /v1/models, /health, /metrics, POST /tokenize, /detokenize; docs/http.md)\n"
    "as a client of zinfer-router, and a chat page at / (unless --no-webui).\n"
    "`zinfer serve --http ADDR` starts it for you.\n"
    "Options (their ranges and defaults from common/options.c, as `zinfer serve`\n"
    "checks them):\n"
    "\n";

_Static_assert(sizeof((zi_http_config *)0)->host >= ZI_OPT_HOST_MAX,
               "zi_http_config.host holds any --listen host the table accepts");

int main(int argc, char **argv) {
    zi_logger lg = {.out = stderr, .level = ZI_LOG_INFO, .tag = "zinfer-http"};
    /* The defaults, from the table (options.h); --listen's is its def_text. */
    zi_http_config cfg = {.max_body = (size_t)zi_option_def(ZI_O_MAX_BODY_BYTES),
                          .images = zi_http_image_limits_default(),
                          .max_header = (size_t)zi_option_def(ZI_O_MAX_HEADER_BYTES),
                          .max_connections = (unsigned)zi_option_def(ZI_O_MAX_CONNECTIONS),
                          .timeout_s = (unsigned)zi_option_def(ZI_O_TIMEOUT),
                          .header_timeout_s = (unsigned)zi_option_def(ZI_O_HEADER_TIMEOUT),
                          .lg = &lg};
    const zi_option *listen = zi_option_get(ZI_O_LISTEN);
    zi_error err = {0};
    zi_option_host_port(listen, "--listen", listen->def_text, cfg.host, sizeof cfg.host, &cfg.port,
                        &err);
    cfg.api_key = getenv("ZINFER_API_KEY");
    const char *router = zi_option_get(ZI_O_HTTP_ROUTER)->def_text;
    long long router_timeout = zi_option_def(ZI_O_ROUTER_TIMEOUT);
    long long store_max = zi_option_def(ZI_O_RESPONSES_STORE_MAX);
    long long store_bytes = zi_option_def(ZI_O_RESPONSES_STORE_BYTES);
    int check_only = 0;
    /* Each value checked against options.h's table, as `zinfer serve`
     * checks what it passes on. */
    for (int i = 1; i < argc; i++) {
        zi_opt_id id;
        long long x;
        const char *v;
        int rc = zi_options_next(ZI_OWN_HTTP, argc, argv, &i, &id, &x, &v, &err);
        if (!rc && id == ZI_O_LISTEN)
            rc = zi_option_host_port(listen, "--listen", v, cfg.host, sizeof cfg.host, &cfg.port,
                                     &err);
        if (rc) {
            fprintf(stderr, "zinfer-http: %s\n", err.msg);
            return 2;
        }
        switch (id) {
        case ZI_O_HELP:
            fputs(USAGE, stdout);
            zi_options_usage(stdout, ZI_OWN_HTTP, 28);
            return 0;
        case ZI_O_CHECK_ARGS:
            check_only = 1;
            break;
        case ZI_O_HTTP_ROUTER:
            router = v;
            break;
        case ZI_O_API_KEY:
            cfg.api_key = v;
            break;
        case ZI_O_MAX_BODY_BYTES:
            cfg.max_body = (size_t)x;
            break;
        case ZI_O_MAX_IMAGES:
            cfg.images.max_images = (size_t)x;
            break;
        case ZI_O_MAX_IMAGE_BYTES:
            cfg.images.max_image_bytes = (size_t)x;
            break;
        case ZI_O_MAX_HEADER_BYTES:
            cfg.max_header = (size_t)x;
            break;
        case ZI_O_MAX_CONNECTIONS:
            cfg.max_connections = (unsigned)x;
            break;
        case ZI_O_TIMEOUT:
            cfg.timeout_s = (unsigned)x;
            break;
        case ZI_O_HEADER_TIMEOUT:
            cfg.header_timeout_s = (unsigned)x;
            break;
        case ZI_O_ROUTER_TIMEOUT:
            router_timeout = x;
            break;
        case ZI_O_RESPONSES_STORE_MAX:
            store_max = x;
            break;
        case ZI_O_RESPONSES_STORE_BYTES:
            store_bytes = x;
            break;
        case ZI_O_REASONING_FORMAT:
            cfg.reasoning_format = (int)x;
            break;
        case ZI_O_TOOL_CALL_FORMAT: /* choices in zi_tool_format's order */
            cfg.tool_format = (int)x;
            break;
        case ZI_O_MODEL_TOOL_CALL_FORMAT:
            if (zi_http_model_tool_formats_add(&cfg, v, &err)) {
                fprintf(stderr, "zinfer-http: %s\n", err.msg);
                return 2;
            }
            break;
        case ZI_O_NO_WEBUI:
            cfg.no_webui = 1;
            break;
        case ZI_O_LOG_LEVEL:
            lg.level = (int)x;
            break;
        default: /* --listen is read above; the table gives no other option */
            break;
        }
    }
    if (check_only) return 0;
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
    ctx.responses = zi_response_store_new((size_t)store_max, (size_t)store_bytes);
    if (!ctx.responses) {
        fprintf(stderr, "zinfer-http: out of memory\n");
        zi_http_ctx_destroy(&ctx);
        zmq_ctx_term(zctx);
        return 1;
    }
    zi_stop_signals_install();
    int rc = zi_http_serve(&ctx);
    zmq_ctx_term(zctx);
    zi_response_store_free(ctx.responses);
    zi_http_ctx_destroy(&ctx);
    return rc;
}
