/*
 * keypath.c - error-message paths into nested values (keypath.h).
 */
#include "keypath.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

size_t zi_keypath_push(zi_keypath *p, const char *fmt, ...) {
    size_t old = p->n;
    if (p->n + 1 >= sizeof p->s) return old;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(p->s + p->n, sizeof p->s - p->n, fmt, ap);
    va_end(ap);
    if (k < 0) k = 0;
    if ((size_t)k >= sizeof p->s - p->n) {
        p->n = sizeof p->s - 1;
        memcpy(p->s + p->n - 3, "...", 3);
    } else {
        p->n += (size_t)k;
    }
    return old;
}

size_t zi_keypath_push_key(zi_keypath *p, const char *prefix, const char *key, size_t n) {
    char buf[80];
    zi_printable(buf, sizeof buf, key, n);
    return zi_keypath_push(p, "%s%s", prefix, buf);
}

void zi_keypath_pop(zi_keypath *p, size_t old) {
    p->n = old;
    p->s[old] = '\0';
}

void zi_printable(char *out, size_t cap, const char *s, size_t n) {
    zi_printable_max(out, cap, s, n, 64);
}

void zi_printable_max(char *out, size_t cap, const char *s, size_t n, size_t max) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        out[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (n > max && k + 4 < cap) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = '\0';
}
