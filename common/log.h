/*
 * log.h - leveled logging to a stream, one line per message.
 *
 * A zi_logger is a small value each process creates from its flags and
 * passes to whatever logs; there is no global logger. A NULL logger logs
 * warnings and errors to stderr. Lines look like
 *   2026-11-22T10:00:00.123Z I zinfer: loaded 272 tensors
 */
#ifndef ZI_LOG_H
#define ZI_LOG_H

#include <stdio.h>

enum { ZI_LOG_DEBUG = 0, ZI_LOG_INFO = 1, ZI_LOG_WARN = 2, ZI_LOG_ERROR = 3, ZI_LOG_OFF = 4 };

typedef struct zi_logger {
    FILE *out;       /* where lines go; stderr when NULL */
    int level;       /* messages below this level are dropped */
    const char *tag; /* the process name printed on every line */
} zi_logger;

void zi_log(const zi_logger *lg, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parses "debug", "info", "warn", "error", "off"; -1 when unknown. */
int zi_log_level_parse(const char *s);

#endif
