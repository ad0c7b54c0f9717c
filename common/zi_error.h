/*
 * zi_error.h - status codes and the error record every fallible call fills.
 *
 * zinfer functions that can fail return an int status: 0 (ZI_OK) on success,
 * one of the negative ZI_E* codes otherwise, and write a one-line message
 * into the caller's zi_error naming the file, field or value at fault.
 * Nothing in zinfer aborts on input that comes from outside the process
 * (model files, client messages, flags); such input always ends here.
 */
#ifndef ZI_ERROR_H
#define ZI_ERROR_H

#include <stddef.h>

enum {
    ZI_OK = 0,
    ZI_EINVAL = -1,      /* a caller-supplied value is out of range or malformed */
    ZI_EIO = -2,         /* open/read/mmap failed */
    ZI_EFORMAT = -3,     /* a file or message is corrupt or truncated */
    ZI_EUNSUPPORTED = -4, /* well-formed but not something zinfer implements */
    ZI_ENOMEM = -5,      /* allocation failed or a configured limit was hit */
    ZI_ERANGE = -6,      /* a length exceeds a limit (context, vocabulary, ...) */
};

#define ZI_ERROR_MSG_MAX 512

typedef struct zi_error {
    int code;                    /* the ZI_E* code, ZI_OK when unset */
    char msg[ZI_ERROR_MSG_MAX];  /* NUL-terminated, one line */
} zi_error;

/* Records code and a printf-style message in err (which may be NULL) and
 * returns code, so callers write `return zi_error_set(err, ZI_EINVAL, ...)`.
 * The message is cut to ZI_ERROR_MSG_MAX - 1 bytes and kept one line: any
 * control character it quotes (a newline in a client's key) becomes a space. */
int zi_error_set(zi_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes an already-set message with more context ("loading X: ..."),
 * kept one line as above. */
int zi_error_prefix(zi_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Resets err to ZI_OK with an empty message. */
void zi_error_clear(zi_error *err);

/* A short name for a code, e.g. "invalid argument". */
const char *zi_status_name(int code);

#endif
