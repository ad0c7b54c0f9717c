/*
 * router_sim.c - the socket-free router core harness shared by the router
 * unit tests; see router_sim.h.
 */
#include "router_sim.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

int sim_send(void *ctx, zi_router_side side, const unsigned char *ident, size_t ident_len,
             bool delim, const void *data, size_t len) {
    sim *s = ctx;
    char id[32];
    snprintf(id, sizeof id, "%.*s", (int)(ident_len < 31 ? ident_len : 31), (const char *)ident);
    for (int i = 0; side == ZI_ROUTER_CLIENT && i < s->n_gone; i++)
        if (!strcmp(s->gone[i], id)) return -1; /* EHOSTUNREACH, as ROUTER_MANDATORY */
    if (s->n_out == s->cap_out) {
        s->cap_out = s->cap_out ? 2 * s->cap_out : 64;
        s->out = realloc(s->out, s->cap_out * sizeof *s->out);
        assert_non_null(s->out);
    }
    sent *f = &s->out[s->n_out++];
    f->side = side;
    memcpy(f->ident, id, sizeof id);
    f->delim = delim;
    f->data = malloc(len ? len : 1);
    assert_non_null(f->data);
    memcpy(f->data, data, len);
    f->len = len;
    return 0;
}

int64_t sim_now(void *ctx) {
    return ((sim *)ctx)->now;
}

int64_t sim_wall(void *ctx) {
    (void)ctx;
    return 1700000000000000000LL;
}

void sim_init(sim *s) {
    memset(s, 0, sizeof *s);
    s->now = 1000000;
    zi_router_io io = {.ctx = s, .send = sim_send, .now_ms = sim_now, .wall_ns = sim_wall};
    zi_logger lg = {.out = stderr, .level = ZI_LOG_OFF, .tag = "test"};
    assert_int_equal(zi_router_init(&s->rt, &io, lg), ZI_OK);
}

void sim_clear(sim *s) {
    for (size_t i = 0; i < s->n_out; i++) free(s->out[i].data);
    s->n_out = 0;
}

void sim_free(sim *s) {
    zi_router_shutdown(&s->rt);
    sim_clear(s);
    free(s->out);
}

zi_router_conn conn_of(const char *ident) {
    int h = 3;
    for (const char *p = ident; *p; p++) h = h * 31 + (unsigned char)*p;
    return (zi_router_conn){(h & 0xffff) + 10, 1};
}

void from_backend(sim *s, const char *ident, zi_msg *m) {
    assert_true(m->sb.size > 0);
    assert_int_equal(zi_router_backend_frame(&s->rt, conn_of(ident), (const unsigned char *)ident,
                                             strlen(ident), m->sb.data, m->sb.size),
                     ZI_OK);
    zi_msg_free(m);
}

void from_client_imap(sim *s, const char *client, zi_imap *b) {
    zi_msg m;
    zi_msg_init(&m);
    assert_int_equal(zi_imap_close(b, &m.pk), ZI_OK);
    assert_int_equal(zi_router_client_frame(&s->rt, conn_of(client), (const unsigned char *)client,
                                            strlen(client), false, m.sb.data, m.sb.size),
                     ZI_OK);
    zi_msg_free(&m);
}

void sim_register(sim *s, const char *ident, bool worker, int slots, const char *model,
                  int64_t max_length, const char *const *loras, size_t n_loras) {
    zi_msg m;
    zi_im_register r = {.worker = worker,
                        .slots = slots,
                        .max_length = max_length,
                        .vocab = 1000,
                        .model = {model, strlen(model)},
                        .loras = loras,
                        .n_loras = n_loras};
    assert_int_equal(zi_im_register_pack(&r, &m), ZI_OK);
    from_backend(s, ident, &m);
}
