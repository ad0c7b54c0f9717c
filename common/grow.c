/*
 * grow.c - growing an array by doubling (grow.h).
 */
#include "grow.h"

#include <stdint.h>
#include <stdlib.h>

#include "zi_error.h"

void *zi_grow(void *p, size_t *cap, size_t elem, size_t first) {
    size_t n = *cap ? *cap : first;
    if (*cap && n > SIZE_MAX / 2) return NULL;
    if (*cap) n *= 2;
    if (elem && n > SIZE_MAX / elem) return NULL;
    void *q = realloc(p, n * elem);
    if (!q) return NULL;
    *cap = n;
    return q;
}

int zi_grow_to(void **p, size_t *cap, size_t elem, size_t need, size_t first) {
    if (need <= *cap) return ZI_OK;
    size_t n = *cap ? *cap : first ? first : 1;
    while (n < need) {
        if (n > SIZE_MAX / 2) return ZI_ENOMEM;
        n *= 2;
    }
    if (elem && n > SIZE_MAX / elem) return ZI_ENOMEM;
    void *q = realloc(*p, n * elem);
    if (!q) return ZI_ENOMEM;
    *p = q;
    *cap = n;
    return ZI_OK;
}
