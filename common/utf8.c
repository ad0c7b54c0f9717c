/*
 * utf8.c - strict UTF-8 validation (see utf8.h). One table-driven decoder
 * of a character; the validators and the cleaner are loops over it.
 */
#include "utf8.h"

#include <stdlib.h>
#include <string.h>

size_t zi_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) {
        if (cp) *cp = c;
        return 1;
    }
    /* The lead byte fixes the length and the range of the second byte;
     * narrowing that range is what refuses overlong forms (E0, F0),
     * surrogates (ED) and code points above U+10FFFF (F4). C0, C1 and
     * F5..FF never start a well-formed character. */
    size_t need;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c == 0xe0)
        need = 2, lo = 0xa0;
    else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef)
        need = 2;
    else if (c == 0xed)
        need = 2, hi = 0x9f;
    else if (c == 0xf0)
        need = 3, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3)
        need = 3;
    else if (c == 0xf4)
        need = 3, hi = 0x8f;
    else
        return 0;
    if (n <= need) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    uint32_t v = c & (0x3fu >> need);
    for (size_t k = 1; k <= need; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        v = v << 6 | (s[k] & 0x3fu);
    }
    if (cp) *cp = v;
    return need + 1;
}

size_t zi_utf8_bad_at(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { /* ASCII runs are the common case */
            i++;
            continue;
        }
        size_t l = zi_utf8_next(u + i, n - i, NULL);
        if (!l) return i;
        i += l;
    }
    return n;
}

bool zi_utf8_valid(const char *s, size_t n) {
    return zi_utf8_bad_at(s, n) == n;
}

char *zi_utf8_clean(const char *s, size_t n, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    char *o = malloc(n * 3 + 1);
    if (!o) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        size_t l = zi_utf8_next(u + i, n - i, NULL);
        if (l) {
            memcpy(o + j, s + i, l);
            j += l;
            i += l;
        } else {
            memcpy(o + j, "\xef\xbf\xbd", 3);
            j += 3;
            i++;
        }
    }
    o[j] = '\0';
    if (out_len) *out_len = j;
    return o;
}
