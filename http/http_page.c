/*
 * http_page.c - which embedded file of the chat page a path names, and its
 * type (http_page.h). The files themselves are the generated table
 * zi_http_page_files.
 */
#include "http_page.h"

#include <string.h>

/* The table's entry named name (len bytes, not NUL-ended), or NULL. */
static const zi_http_page_file *by_name(const char *name, size_t len) {
    for (const zi_http_page_file *f = zi_http_page_files; f->name; f++)
        if (strlen(f->name) == len && !memcmp(f->name, name, len)) return f;
    return NULL;
}

const zi_http_page_file *zi_http_page_find(const char *path) {
    if (!path) return NULL;
    size_t len = strcspn(path, "?"); /* MHD gives the path without it; others may not */
    if (len == 1 && path[0] == '/') return by_name("index.html", 10);
    size_t plen = strlen(ZI_HTTP_PAGE_PREFIX);
    if (len <= plen || strncmp(path, ZI_HTTP_PAGE_PREFIX, plen)) return NULL;
    const char *name = path + plen;
    len -= plen;
    /* a base name only: no '/', so no "..", and nothing outside the table */
    if (memchr(name, '/', len)) return NULL;
    return by_name(name, len);
}

const char *zi_http_page_type(const zi_http_page_file *f) {
    static const struct {
        const char *ext, *type;
    } types[] = {
        {".html", "text/html; charset=utf-8"},
        {".js", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},
        {".svg", "image/svg+xml"},
        {".png", "image/png"},
    };
    const char *dot = f && f->name ? strrchr(f->name, '.') : NULL;
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(dot, types[i].ext)) return types[i].type;
    return "application/octet-stream";
}
