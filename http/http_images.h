/*
 * http_images.h - the images of one HTTP request: image parts of the
 * three chat APIs (OpenAI's image_url, Anthropic's image blocks, the
 * Responses API's input_image) decoded from base64 into the bytes the
 * router's request carries as `images` (docs/protocol.md, "Images"),
 * within the server's --max-images and --max-image-bytes.
 *
 * Each API's parser calls zi_http_images_add_url or _add_base64 for a part
 * and writes ZI_MEDIA_MARKER ("<__media__>") into the message's text where
 * the part was, so the chat template renders the marker where the image
 * goes (as llama-server does) and the images stay in the markers' order.
 * Only data: URLs with base64 are read: remote http(s) URLs are refused
 * (this server fetches nothing). Errors name the part's field as the API
 * spells it ("messages[1].content[2].image_url.url").
 */
#ifndef ZI_HTTP_IMAGES_H
#define ZI_HTTP_IMAGES_H

#include <stddef.h>
#include <stdint.h>

#include "http_error.h"

typedef struct zi_http_image_limits {
    size_t max_images;      /* images in one request (--max-images), else 400 */
    size_t max_image_bytes; /* bytes of one image once decoded (--max-image-bytes), else 413 */
} zi_http_image_limits;

/* The server's defaults: the options table's (common/options.c). */
zi_http_image_limits zi_http_image_limits_default(void);

typedef struct zi_http_image {
    uint8_t *p;
    size_t len; /* > 0 */
} zi_http_image;

typedef struct zi_http_images {
    zi_http_image_limits lim;
    zi_http_image *v;
    size_t n, cap;
} zi_http_images;

/* Empty, with lim (NULL: the defaults). */
void zi_http_images_init(zi_http_images *im, const zi_http_image_limits *lim);
void zi_http_images_free(zi_http_images *im);

/* A URL of an image part (len bytes, not NUL-terminated): a data: URL
 * ("data:[<media type>][;<parameter>]*;base64,<data>") is decoded and
 * appended; anything else is refused. 0, or -1 with e set naming field:
 * 400 for a remote or other URL, a data URL that is not base64, bad
 * base64, an empty image, more than lim.max_images images; 413 for an
 * image over lim.max_image_bytes. */
int zi_http_images_add_url(zi_http_images *im, const char *url, size_t len, const char *field,
                           zi_http_error *e);
/* Base64 data alone (Anthropic's {"type": "base64", "data"}): the same
 * checks and errors as a data URL's. */
int zi_http_images_add_base64(zi_http_images *im, const char *b64, size_t len, const char *field,
                              zi_http_error *e);

/* Decodes standard base64 (RFC 4648 section 4, '=' padding optional, also
 * the URL-safe alphabet's '-' and '_'; ASCII whitespace between groups is
 * skipped, as MIME writers wrap lines) into out, which holds at least
 * zi_base64_max(len) bytes. The decoded length, or -1 for a character
 * outside the alphabet, misplaced padding or a lone trailing character;
 * *bad is then the offset of the first offending byte. */
long long zi_base64_decode(const char *s, size_t len, uint8_t *out, size_t *bad);
/* An upper bound of the decoded length of len base64 characters. */
static inline size_t zi_base64_max(size_t len) {
    return len / 4 * 3 + 3;
}

#endif
