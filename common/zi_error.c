/*
 * zi_error.c - see zi_error.h.
 */
#include "zi_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The message is one line whatever it quotes (a key, a name, a parser's
 * excerpt of the input): control characters become spaces. */
static void one_line(char *msg) {
    for (char *q = msg; *q; q++)
        if ((unsigned char)*q < 0x20) *q = ' ';
}

int zi_error_set(zi_error *err, int code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    one_line(err->msg);
    return code;
}

int zi_error_prefix(zi_error *err, const char *fmt, ...) {
    if (!err) return ZI_OK;
    char prefix[ZI_ERROR_MSG_MAX];
    char old[ZI_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* Build "prefix: old" by hand so an over-long result is cut, not refused. */
    size_t n = strlen(prefix);
    /* A long prefix (a path) must not push the message itself out. */
    if (n > sizeof err->msg / 2) n = sizeof err->msg / 2;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3;
    size_t m = strnlen(old, room);
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = '\0';
    one_line(err->msg);
    return err->code;
}

void zi_error_clear(zi_error *err) {
    if (!err) return;
    err->code = ZI_OK;
    err->msg[0] = '\0';
}

const char *zi_status_name(int code) {
    switch (code) {
    case ZI_OK: return "ok";
    case ZI_EINVAL: return "invalid argument";
    case ZI_EIO: return "i/o error";
    case ZI_EFORMAT: return "bad format";
    case ZI_EUNSUPPORTED: return "unsupported";
    case ZI_ENOMEM: return "out of memory";
    case ZI_ERANGE: return "out of range";
    default: return "unknown error";
    }
}
