/*
 * duration.c - see duration.h: the keep_alive durations' one reader, so
 * that a request's field and the --keep-alive option accept exactly the
 * same spellings.
 */
#include "duration.h"

#include <math.h>
#include <stdbool.h>

int zi_duration_seconds(double seconds, const char *field, int64_t *ms, zi_error *err) {
    if (!isfinite(seconds))
        return zi_error_set(err, ZI_EINVAL, "%s: not a finite number of seconds", field);
    if (seconds < 0) {
        *ms = -1;
        return ZI_OK;
    }
    if (seconds * 1000.0 > (double)ZI_DURATION_MAX_MS)
        return zi_error_set(err, ZI_EINVAL, "%s: more than ten years", field);
    *ms = (int64_t)(seconds * 1000.0);
    return ZI_OK;
}

int zi_duration_parse(const char *s, size_t n, const char *field, int64_t *ms, zi_error *err) {
    size_t i = 0;
    bool neg = false;
    if (i < n && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
    if (i == n)
        return zi_error_set(err, ZI_EINVAL,
                            "%s: empty; a number of seconds or a duration such as 30s, 5m, 1h",
                            field);
    double total = 0;
    bool unit_seen = false;
    while (i < n) {
        double v = 0, scale = 1;
        bool digits = false, dot = false;
        for (; i < n && ((s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && !dot)); i++) {
            if (s[i] == '.') {
                dot = true;
            } else if (dot) {
                scale /= 10, v += (s[i] - '0') * scale, digits = true;
            } else {
                v = v * 10 + (s[i] - '0'), digits = true;
            }
        }
        if (!digits)
            return zi_error_set(err, ZI_EINVAL,
                                "%s: '%.*s' is not a duration (a number of seconds, or such as "
                                "300ms, 30s, 5m, 1h30m; negative: forever)",
                                field, (int)(n > 64 ? 64 : n), s);
        double unit_ms;
        if (i == n && !unit_seen) {
            unit_ms = 1000; /* a bare number: seconds */
        } else if (n - i >= 2 && s[i] == 'm' && s[i + 1] == 's') {
            unit_ms = 1, i += 2;
        } else if (i < n && (s[i] == 's' || s[i] == 'm' || s[i] == 'h')) {
            unit_ms = s[i] == 's' ? 1000 : s[i] == 'm' ? 60000 : 3600000;
            i++;
        } else {
            return zi_error_set(err, ZI_EINVAL,
                                "%s: '%.*s' is not a duration (units: ms, s, m, h, as in 30s, 5m, "
                                "1h30m; negative: forever)",
                                field, (int)(n > 64 ? 64 : n), s);
        }
        unit_seen = true;
        total += v * unit_ms;
        if (total > (double)ZI_DURATION_MAX_MS)
            return neg ? (*ms = -1, ZI_OK)
                       : zi_error_set(err, ZI_EINVAL, "%s: more than ten years", field);
    }
    *ms = neg && total > 0 ? -1 : (int64_t)total;
    return ZI_OK;
}
