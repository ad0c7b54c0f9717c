/*
 * curve.h - ZeroMQ CURVE keys for zinfer's sockets (docs/security.md):
 * reading key files and lists of allowed keys, writing a new key pair
 * (`zinfer keygen`), setting a socket's CURVE options, and watching a
 * connecting socket's handshakes so that a refused one is logged.
 *
 * A key file is text: blank lines and lines starting with '#' are skipped,
 * every other line (spaces around it trimmed) is one key in Z85, 40
 * characters for 32 bytes. A secret key file holds exactly one key and must
 * not be readable by group or others; a list (--backend-keys,
 * --client-keys, a .pub file) holds one or more public keys. Keys come only
 * from files: an option's value that looks like a key, not a file, is
 * refused (a command line is visible to every user of the machine).
 */
#ifndef ZI_CURVE_H
#define ZI_CURVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "zi_error.h"

#define ZI_CURVE_Z85_LEN 40          /* Z85 characters of one key */
#define ZI_CURVE_MAX_KEYS 65536      /* keys in one list, at most */
#define ZI_CURVE_FILE_MAX (4u << 20) /* bytes of one key file, at most */
#define ZI_CURVE_LINE_MAX 1024       /* bytes of one line, at most */

/* One key: its Z85 text (NUL-terminated) and its 32 bytes. */
typedef struct zi_curve_key {
    char z85[ZI_CURVE_Z85_LEN + 1];
    uint8_t raw[32];
} zi_curve_key;

/* A list of keys (owned; zi_curve_keys_free). */
typedef struct zi_curve_keys {
    zi_curve_key *v;
    size_t n;
} zi_curve_keys;

/* A connecting socket's CURVE settings: its own pair and the server's
 * public key. on == false: plain (no CURVE). */
typedef struct zi_curve_client {
    bool on;
    zi_curve_key secret, pub, server;
} zi_curve_client;

/* Parses a key file's text (len bytes; name names it in errors, as
 * "NAME:LINE: ..."). Appends every key to out (which starts empty or
 * holds earlier keys). ZI_EFORMAT for a malformed line (wrong length, a
 * character outside Z85, an over-long line), ZI_ERANGE past
 * ZI_CURVE_MAX_KEYS. No keys at all is not an error here. */
int zi_curve_parse(const char *text, size_t len, const char *name, zi_curve_keys *out,
                   zi_error *err);
void zi_curve_keys_free(zi_curve_keys *k);
/* True when k holds the 32-byte key raw. */
bool zi_curve_keys_has(const zi_curve_keys *k, const uint8_t raw[32]);

/* Reads a list of allowed public keys (at least one) from path; opt (the
 * option naming the file, e.g. "--backend-keys") starts every error. */
int zi_curve_load_list(const char *opt, const char *path, zi_curve_keys *out, zi_error *err);
/* Reads the single key of path. secret: the file must be a regular file
 * not readable, writable or executable by group or others (as ssh asks of
 * a private key), else ZI_EINVAL naming the mode and `chmod 600`. */
int zi_curve_load_key(const char *opt, const char *path, bool secret, zi_curve_key *out,
                      zi_error *err);
/* The public key of a secret key. */
int zi_curve_public(const zi_curve_key *secret, zi_curve_key *pub, zi_error *err);
/* Loads a connecting process's settings: its secret key from secret_path
 * (public key derived) and the server's public key from server_path.
 * Both NULL: plain (out->on false). One without the other: ZI_EINVAL. */
int zi_curve_client_load(const char *secret_path, const char *server_path, zi_curve_client *out,
                         zi_error *err);

/* True when s is 40 Z85 characters and no file of that name exists: a key
 * given where a file name belongs. */
bool zi_curve_is_key_text(const char *s);

/* Writes a new key pair: OUT.key (the secret key, mode 0600) and OUT.pub
 * (its public key). Refuses to replace an existing file unless force. */
int zi_curve_keygen(const char *out, bool force, zi_curve_key *pub, zi_error *err);

/* True when a ZeroMQ endpoint can only be reached from this machine:
 * ipc://, inproc://, tcp:// on 127.0.0.0/8, ::1, localhost or the "lo"
 * interface. A wildcard ("*"), 0.0.0.0 and every other address are not. */
bool zi_addr_is_loopback(const char *addr);

/* Makes sock a CURVE server with this secret key; domain (non-NULL) is its
 * ZAP domain, which tells the ZAP handler which list applies. Before bind. */
int zi_curve_set_server(void *sock, const zi_curve_key *secret, const char *domain, zi_error *err);
/* Makes sock a CURVE client (c->on; nothing when off). Before connect. */
int zi_curve_set_client(void *sock, const zi_curve_client *c, zi_error *err);

/* Watches a connecting socket's handshakes (a ZeroMQ socket monitor): a
 * refused key and a failed handshake (the server's key is not the one
 * expected, or the server speaks no CURVE) are logged once each until the
 * next successful handshake. It also tells whether the connection is up
 * (a worker lets go of its sequences when its router stays away:
 * --orphan-timeout). */
typedef struct zi_curve_watch {
    void *mon; /* PAIR socket receiving the monitor's events */
    const zi_logger *log;
    const char *peer; /* what the socket connects to, for the log */
    const zi_curve_client *curve;
    int last_failure; /* the failure last logged (1 refused key, 2 other); 0 after a
                         success */
    bool down;        /* the connection closed, and no handshake succeeded since */
} zi_curve_watch;

/* Starts watching sock (in context zctx). */
int zi_curve_watch_start(zi_curve_watch *w, void *zctx, void *sock, const char *peer,
                         const zi_curve_client *curve, const zi_logger *lg, zi_error *err);
/* Reads the events waiting (never blocks) and logs as above. */
void zi_curve_watch_poll(zi_curve_watch *w);
void zi_curve_watch_stop(zi_curve_watch *w);

#endif
