/*
 * keygen.h - `zinfer keygen OUT`: writes a new CURVE key pair, OUT.key and
 * OUT.pub, for the server's processes and clients (docs/security.md).
 */
#ifndef ZI_KEYGEN_H
#define ZI_KEYGEN_H

/* argv[0] is "keygen"; returns the exit status (0, 1 cannot write, 2 bad
 * usage). */
int zi_keygen_main(int argc, char **argv);

#endif
