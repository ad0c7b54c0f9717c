/*
 * http_ctx.c - the zinfer-http context (http_ctx.h).
 */
#include "http_ctx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

int zi_http_ctx_init(zi_http_ctx *x, const zi_http_config *cfg, const zi_http_limits *lim,
                     void *zctx, const char *router_addr) {
    memset(x, 0, sizeof *x);
    x->cfg = *cfg;
    x->lim = *lim;
    x->zctx = zctx;
    x->router_addr = router_addr;
    if (pthread_mutex_init(&x->model.mu, NULL)) return -1;
    if (pthread_mutex_init(&x->tok.mu, NULL)) {
        pthread_mutex_destroy(&x->model.mu);
        return -1;
    }
    if (pthread_mutex_init(&x->watch.mu, NULL)) {
        pthread_mutex_destroy(&x->tok.mu);
        pthread_mutex_destroy(&x->model.mu);
        return -1;
    }
    return 0;
}

void zi_http_ctx_destroy(zi_http_ctx *x) {
    for (size_t i = 0; i < x->tok.cap; i++) free(x->tok.text[i]);
    free(x->tok.ids);
    free(x->tok.text);
    x->tok.ids = NULL, x->tok.text = NULL, x->tok.cap = x->tok.n = 0;
    pthread_mutex_destroy(&x->tok.mu);
    pthread_mutex_destroy(&x->model.mu);
    /* the server stopped: libmicrohttpd said "closed" for every connection */
    pthread_mutex_destroy(&x->watch.mu);
}

int zi_http_model_tool_formats_add(zi_http_config *cfg, const char *v, zi_error *err) {
    const char *flag = "--model-tool-call-format";
    for (const char *p = v;;) {
        size_t n = strcspn(p, ","), eq = n; /* the last '=': a name may hold one, F not */
        while (eq > 0 && p[eq - 1] != '=') eq--;
        eq = eq ? eq - 1 : n;
        if (eq >= n || eq == 0 || eq >= sizeof cfg->model_tool_format[0].name) {
            zi_error_set(err, ZI_EINVAL,
                         "%s: '%.*s' is not NAME=F (a model's name, up to %zu "
                         "bytes, '=' and a tool-call format)",
                         flag, (int)(n > 200 ? 200 : n), p,
                         sizeof cfg->model_tool_format[0].name - 1);
            return -1;
        }
        char f[64];
        snprintf(f, sizeof f, "%.*s", (int)(n - eq - 1 < sizeof f - 1 ? n - eq - 1 : sizeof f - 1),
                 p + eq + 1);
        long long x = 0;
        if (zi_option_parse(zi_option_get(ZI_O_TOOL_CALL_FORMAT), flag, f, &x, err)) return -1;
        if (x == 0) { /* auto: serve resolves it per model before passing it */
            zi_error_set(err, ZI_EINVAL,
                         "%s: %.*s: auto is not a format here (name the one "
                         "the model's chat template writes)",
                         flag, (int)eq, p);
            return -1;
        }
        int k = 0;
        while (k < cfg->n_model_tool_format && (strlen(cfg->model_tool_format[k].name) != eq ||
                                                memcmp(cfg->model_tool_format[k].name, p, eq)))
            k++;
        if (k == ZI_HTTP_MAX_TOOL_FORMATS) {
            zi_error_set(err, ZI_EINVAL, "%s: more than %d models", flag, ZI_HTTP_MAX_TOOL_FORMATS);
            return -1;
        }
        if (k == cfg->n_model_tool_format) cfg->n_model_tool_format++;
        snprintf(cfg->model_tool_format[k].name, sizeof cfg->model_tool_format[k].name, "%.*s",
                 (int)eq, p);
        cfg->model_tool_format[k].format = (int)x;
        if (!p[n]) return 0;
        p += n + 1;
    }
}

int zi_http_tool_format(const zi_http_config *cfg, const char *model) {
    if (!model) return cfg->tool_format;
    size_t len = strlen(model);
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < cfg->n_model_tool_format; k++)
            if (strlen(cfg->model_tool_format[k].name) == len &&
                !memcmp(cfg->model_tool_format[k].name, model, len))
                return cfg->model_tool_format[k].format;
        /* not listed: "MODEL:ADAPTER" runs MODEL, whose template it is */
        const char *colon = strrchr(model, ':');
        if (!colon || colon == model) break;
        len = (size_t)(colon - model);
    }
    return cfg->tool_format;
}
