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
    char buf[64];
    size_t k = 0;
    for (size_t i = 0; i < n && k < 48; i++) {
        unsigned char ch = (unsigned char)key[i];
        buf[k++] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
    }
    if (k < n) buf[k++] = '.', buf[k++] = '.', buf[k++] = '.';
    buf[k] = '\0';
    return zi_keypath_push(p, "%s%s", prefix, buf);
}

void zi_keypath_pop(zi_keypath *p, size_t old) {
    p->n = old;
    p->s[old] = '\0';
}
