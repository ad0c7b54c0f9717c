/*
 * serve.h - `zinfer serve`: starts and supervises the server's processes
 * (one zinfer-router, T zinfer-tokenizer, N zinfer-worker), found next to
 * the running zinfer binary.
 */
#ifndef ZI_SERVE_H
#define ZI_SERVE_H

/* argv[0] is "serve"; returns the exit status. */
int zi_serve_main(int argc, char **argv);

#endif
