/*
 * log.c - see log.h.
 */
#include "log.h"

#include <stdarg.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

void zi_log(const zi_logger *lg, int level, const char *fmt, ...) {
    int min = lg ? lg->level : ZI_LOG_WARN;
    if (level < min || level >= ZI_LOG_OFF) return;
    FILE *out = (lg && lg->out) ? lg->out : stderr;
    const char *tag = (lg && lg->tag) ? lg->tag : "zinfer";
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fprintf per line so concurrent writers do not interleave mid-line. */
    fprintf(out, "%s.%03ldZ %c %s: %s\n", stamp, (long)(tv.tv_usec / 1000), "DIWE"[level], tag,
            line);
    fflush(out);
}

int zi_log_level_parse(const char *s) {
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}
