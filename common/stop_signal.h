/*
 * stop_signal.h - SIGINT and SIGTERM as a request to stop, for the
 * long-running processes (zinfer serve, router, tokenizer, worker).
 *
 * Each of them runs a loop that checks zi_stop_requested() between polls
 * and shuts down cleanly when it turns true. The handlers are installed
 * without SA_RESTART, so a blocking poll returns (EINTR) at once. The flag
 * is the one piece of process-wide state here: a signal handler can reach
 * nothing else.
 */
#ifndef ZI_STOP_SIGNAL_H
#define ZI_STOP_SIGNAL_H

#include <stdbool.h>

/* Makes SIGINT and SIGTERM set the stop flag. */
void zi_stop_signals_install(void);

/* True once SIGINT or SIGTERM arrived, or zi_stop_request() was called. */
bool zi_stop_requested(void);

/* Sets the stop flag as a signal would (a loop that decides to end). */
void zi_stop_request(void);

#endif
