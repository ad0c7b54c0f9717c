/*
 * http_page.h - the chat page that zinfer-http serves (docs/http.md,
 * "Chat page"): index.html at /, its other files under /page/. The files
 * live in http/page/ and are compiled into the binary (page_embed.c
 * writes them as C arrays at build time), so the binary serves them
 * without the source tree. Like llama-server's web UI, the page is public
 * (no API key); what it calls is the API, which needs the key when one is
 * set (the page has a field for it). `--no-webui` turns the page off.
 */
#ifndef ZI_HTTP_PAGE_H
#define ZI_HTTP_PAGE_H

#include <stddef.h>

/* One embedded file: its base name ("chat.js"), bytes and length (a NUL
 * follows the bytes, not counted). */
typedef struct zi_http_page_file {
    const char *name;
    const unsigned char *data;
    size_t size;
} zi_http_page_file;

/* The embedded files, ended by an entry whose name is NULL (written at
 * build time: page_embed.c). Constant data, shared by every thread. */
extern const zi_http_page_file zi_http_page_files[];

/* The path under which the page's files other than index.html are served. */
#define ZI_HTTP_PAGE_PREFIX "/page/"

/* What the page may load: its own origin's script, style and API, nothing
 * else (no inline script, no outside host, no framing). */
#define ZI_HTTP_PAGE_CSP                                                                           \
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "                \
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

/* The file a request path names: "/" is index.html, ZI_HTTP_PAGE_PREFIX
 * NAME the file NAME (a query string after '?' is ignored); NULL for any
 * other path. */
const zi_http_page_file *zi_http_page_find(const char *path);

/* The Content-Type of f, from its name's extension (charset utf-8 for
 * text); application/octet-stream for one it does not know. */
const char *zi_http_page_type(const zi_http_page_file *f);

#endif
