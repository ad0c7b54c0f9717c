/*
 * router_sim.h - a socket-free harness for the router core's unit tests
 * (test_router_core.c, test_router_lora.c): the core runs with an io whose
 * send records every frame in an outbox, whose clock is the test's and
 * whose peers' frames are built with the real encoders (protocol/imsg.h),
 * so a test scripts events and reads back exactly what the core sent.
 */
#ifndef ZI_TEST_ROUTER_SIM_H
#define ZI_TEST_ROUTER_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "imsg.h"
#include "router_core.h"
#include "router_impl.h"

/* One frame the core sent: to which side and peer, whether with an empty
 * delimiter frame, and its bytes (owned by the outbox). */
typedef struct sent {
    zi_router_side side;
    char ident[32];
    bool delim;
    char *data;
    size_t len;
} sent;

/* How many clients a test may mark as gone. */
#define MAX_GONE 64

/* The core under test and what it sent. `now` is the monotonic clock
 * (ms) the core reads; a test advances it. A client named in gone[] has
 * left: sends to it fail as ROUTER_MANDATORY's do and are not recorded. */
typedef struct sim {
    router rt;
    int64_t now;
    sent *out;
    size_t n_out, cap_out;
    char gone[MAX_GONE][32];
    int n_gone;
} sim;

/* The io's send: records the frame in s->out (fails the test on no
 * memory); returns -1 for a client in s->gone, else 0. */
int sim_send(void *ctx, zi_router_side side, const unsigned char *ident, size_t ident_len,
             bool delim, const void *data, size_t len);

/* The io's clocks: s->now, and a fixed wall time. */
int64_t sim_now(void *ctx);
int64_t sim_wall(void *ctx);

/* Zeroes s, sets the clock to 1000000 ms and starts the core on the
 * recording io with logging off. No model is added. */
void sim_init(sim *s);

/* Drops every recorded frame (the outbox stays allocated). */
void sim_clear(sim *s);

/* Shuts the core down and frees the outbox. */
void sim_free(sim *s);

/* Each peer's connection: its fd is derived from its name, so a test can
 * close it (zi_router_backend_gone(&s->rt, conn_of(name))). */
zi_router_conn conn_of(const char *ident);

/* Feeds the packed message m to the core as a frame from backend ident
 * (asserting it is accepted) and frees m. */
void from_backend(sim *s, const char *ident, zi_msg *m);

/* Closes the request map b and feeds it to the core as a frame from
 * client `client` (asserting it is accepted). */
void from_client_imap(sim *s, const char *client, zi_imap *b);

/* A backend registers: worker or tokenizer of model `model` with `slots`
 * slots, context max_length, vocabulary 1000 and the start-time LoRA
 * adapters loras[0..n_loras) (NULL, 0: none). */
void sim_register(sim *s, const char *ident, bool worker, int slots, const char *model,
                  int64_t max_length, const char *const *loras, size_t n_loras);

#endif
