/*
 * http_ctx.c - the zinfer-http context (http_ctx.h).
 */
#include "http_ctx.h"

#include <stdlib.h>
#include <string.h>

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
