/*
 * duration.h - keep_alive durations as Ollama spells them: a number of
 * seconds (42, 1.5), or a number with a unit, several in a row ("300ms",
 * "30s", "5m", "1h30m"); negative means "forever". Read into milliseconds
 * by the request codec (keep_alive), zinfer-http and the --keep-alive
 * option of zinfer serve and zinfer-router.
 */
#ifndef ZI_DURATION_H
#define ZI_DURATION_H

#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

/* The longest duration kept: ten years, in ms (longer ones are refused). */
#define ZI_DURATION_MAX_MS (10LL * 366 * 24 * 3600 * 1000)

/* s (n bytes, not NUL-terminated) as a duration: *ms its milliseconds,
 * rounded down, or -1 for a negative one (forever). ZI_EINVAL with err
 * naming field for anything else: empty, a unit other than ms, s, m, h, a
 * bare number after a unit, more than ZI_DURATION_MAX_MS. */
int zi_duration_parse(const char *s, size_t n, const char *field, int64_t *ms, zi_error *err);

/* seconds (a JSON or msgpack number) as a duration the same way. */
int zi_duration_seconds(double seconds, const char *field, int64_t *ms, zi_error *err);

#endif
