/*
 * read_all.c - the whole of a stream into memory, up to a limit
 * (read_all.h).
 */
#include "read_all.h"

#include <stdint.h>
#include <stdlib.h>

#include "grow.h"
#include "zi_error.h"

int zi_read_all(FILE *f, size_t max, char **buf, size_t *len) {
    *buf = NULL, *len = 0;
    if (max > SIZE_MAX / 2) max = SIZE_MAX / 2; /* so that max + 2 cannot wrap */
    size_t cap = 0, n = 0;
    char *p = NULL;
    int rc = ZI_OK;
    for (;;) {
        /* Room for one byte past max (to tell "exactly max" from "more")
         * and the NUL. */
        if (n + 1 >= cap) {
            if (zi_grow_to((void **)&p, &cap, 1, n + 2, 1 << 16) != ZI_OK) {
                rc = ZI_ENOMEM;
                break;
            }
        }
        size_t want = cap - 1 - n;
        if (want > max + 1 - n) want = max + 1 - n;
        size_t got = fread(p + n, 1, want, f);
        n += got;
        if (n > max) {
            rc = ZI_ERANGE;
            break;
        }
        if (got == 0) {
            if (ferror(f)) rc = ZI_EIO;
            break;
        }
    }
    if (rc != ZI_OK) {
        free(p);
        return rc;
    }
    if (!p && !(p = malloc(1))) return ZI_ENOMEM;
    p[n] = 0;
    *buf = p, *len = n;
    return ZI_OK;
}
