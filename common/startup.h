/*
 * startup.h - how a child of `zinfer serve` that cannot start says so.
 *
 * A worker whose options or files cannot work (the model does not load,
 * its weights and KV cache do not fit in memory, a memory budget leaves no
 * KV block) fails the same way on every start: restarting it would only
 * repeat the error, with growing delays, while the server never becomes
 * healthy. Such a process exits with ZI_EXIT_CONFIG instead of 1, and
 * hands its one-line error to the supervisor through the pipe whose write
 * end $ZINFER_STARTUP_FD names. The supervisor (cli/serve.c) then reports
 * the error once, as its own last line, and stops the server with status
 * 1 instead of restarting the child. Started by hand (no such variable),
 * the process logs the error itself.
 *
 * A process exits with ZI_EXIT_CONFIG only before it starts serving: a
 * failure after that (a crash, a device error) keeps its ordinary status,
 * and the supervisor restarts it (the router resumes its requests).
 */
#ifndef ZI_STARTUP_H
#define ZI_STARTUP_H

#include <stdbool.h>
#include <stddef.h>

#define ZI_EXIT_CONFIG 78 /* sysexits.h's EX_CONFIG: "configuration error" */
#define ZI_STARTUP_FD_ENV "ZINFER_STARTUP_FD"

/* The supervisor's side, before fork: a pipe, both ends close-on-exec, the
 * read end non-blocking. 0, or -1 with errno set. */
int zi_startup_pipe(int fds[2]);

/* In the forked child, before exec: lets the write end survive exec and
 * names it in $ZINFER_STARTUP_FD. */
void zi_startup_pipe_child(int wr);

/* The supervisor's side, after the child exited: what it wrote (at most
 * cap - 1 bytes, one line, NUL-terminated; "" when nothing). Closes rd. */
void zi_startup_pipe_read(int rd, char *buf, size_t cap);

/* The child's side: hands msg to the supervisor when $ZINFER_STARTUP_FD
 * names a pipe. True when it was written (the caller need not log it). */
bool zi_startup_report(const char *msg);

#endif
