/*
 * http_images.c - image parts' data: URLs and base64 into a request's
 * image bytes, within the server's limits (http_images.h).
 */
#include "http_images.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "options.h"

zi_http_image_limits zi_http_image_limits_default(void) {
    zi_http_image_limits l = {(size_t)zi_option_def(ZI_O_MAX_IMAGES),
                              (size_t)zi_option_def(ZI_O_MAX_IMAGE_BYTES)};
    return l;
}

void zi_http_images_init(zi_http_images *im, const zi_http_image_limits *lim) {
    memset(im, 0, sizeof *im);
    im->lim = lim ? *lim : zi_http_image_limits_default();
}

void zi_http_images_free(zi_http_images *im) {
    for (size_t i = 0; i < im->n; i++) free(im->v[i].p);
    free(im->v);
    zi_http_image_limits lim = im->lim;
    memset(im, 0, sizeof *im);
    im->lim = lim;
}

/* ---- base64 ------------------------------------------------------------- */

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

static int b64_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

long long zi_base64_decode(const char *s, size_t len, uint8_t *out, size_t *bad) {
    uint32_t acc = 0;
    int q = 0, pad = 0; /* characters in the current group; '=' seen */
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (b64_space(c)) continue;
        if (c == '=') { /* padding ends the data: only after 2 or 3 characters of a group */
            if (q < 2 || pad >= 4 - q) {
                *bad = i;
                return -1;
            }
            pad++;
            continue;
        }
        int v = b64_value(c);
        if (pad || v < 0) { /* data after padding, or not in the alphabet */
            *bad = i;
            return -1;
        }
        acc = acc << 6 | (uint32_t)v;
        if (++q == 4) {
            out[o++] = (uint8_t)(acc >> 16);
            out[o++] = (uint8_t)(acc >> 8);
            out[o++] = (uint8_t)acc;
            q = 0;
            acc = 0;
        }
    }
    if (q == 1) { /* six bits make no byte */
        *bad = len;
        return -1;
    }
    if (q == 2) out[o++] = (uint8_t)(acc >> 4);
    if (q == 3) {
        out[o++] = (uint8_t)(acc >> 10);
        out[o++] = (uint8_t)(acc >> 2);
    }
    return (long long)o;
}

/* The decoded length of s[0..len), counting its data characters (what the
 * decoder will refuse is not judged here). */
static size_t b64_decoded_len(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        n += !b64_space(c) && c != '=';
    }
    return n / 4 * 3 + (n % 4 == 3 ? 2 : n % 4 == 2 ? 1 : 0);
}

/* ---- adding images ------------------------------------------------------ */

static int room_for_one(zi_http_images *im, const char *field, zi_http_error *e) {
    if (im->lim.max_images == 0)
        return zi_http_fail(e, 400, "invalid_value", field,
                            "%s: this server accepts no images (--max-images 0)", field);
    if (im->n >= im->lim.max_images)
        return zi_http_fail(e, 400, "invalid_value", field,
                            "%s: more than %zu images in one request (the server's limit, "
                            "--max-images)",
                            field, im->lim.max_images);
    if (im->n == im->cap) {
        size_t cap = im->cap ? 2 * im->cap : 4;
        zi_http_image *v = realloc(im->v, cap * sizeof *v);
        if (!v) return zi_http_fail(e, 500, "internal", NULL, "out of memory");
        im->v = v;
        im->cap = cap;
    }
    return 0;
}

int zi_http_images_add_base64(zi_http_images *im, const char *b64, size_t len, const char *field,
                              zi_http_error *e) {
    if (room_for_one(im, field, e)) return -1;
    size_t n = b64_decoded_len(b64, len);
    if (n == 0)
        return zi_http_fail(e, 400, "invalid_value", field, "%s: the image is empty", field);
    if (n > im->lim.max_image_bytes)
        return zi_http_fail(e, 413, "image_too_large", field,
                            "%s: the image is %zu bytes, more than the limit of %zu bytes per "
                            "image (the server's --max-image-bytes)",
                            field, n, im->lim.max_image_bytes);
    uint8_t *p = malloc(zi_base64_max(len));
    if (!p) return zi_http_fail(e, 500, "internal", NULL, "out of memory");
    size_t bad = 0;
    long long got = zi_base64_decode(b64, len, p, &bad);
    if (got < 0) {
        free(p);
        if (bad >= len)
            return zi_http_fail(e, 400, "invalid_value", field,
                                "%s: the image's base64 data is cut short (a lone last character)",
                                field);
        unsigned char c = (unsigned char)b64[bad];
        char shown[8] = "?";
        if (c >= 0x21 && c < 0x7f) shown[0] = (char)c;
        return zi_http_fail(e, 400, "invalid_value", field,
                            "%s: the image's data is not valid base64 ('%s' at character %zu)",
                            field, c == '=' ? "misplaced =" : shown, bad);
    }
    im->v[im->n++] = (zi_http_image){p, (size_t)got};
    return 0;
}

int zi_http_images_add_url(zi_http_images *im, const char *url, size_t len, const char *field,
                           zi_http_error *e) {
    if ((len >= 7 && !strncasecmp(url, "http://", 7)) ||
        (len >= 8 && !strncasecmp(url, "https://", 8)))
        return zi_http_fail(e, 400, "unsupported_value", field,
                            "%s: remote image URLs are not fetched by this server: send the "
                            "image itself as a data: URL (data:image/png;base64,...)",
                            field);
    if (len < 5 || strncasecmp(url, "data:", 5))
        return zi_http_fail(e, 400, "invalid_value", field,
                            "%s: not a data: URL (data:image/png;base64,...): images come in "
                            "the request, base64-encoded",
                            field);
    const char *comma = memchr(url, ',', len);
    if (!comma)
        return zi_http_fail(e, 400, "invalid_value", field,
                            "%s: the data: URL has no ',' before its data", field);
    /* The header: "[<media type>][;<parameter>]*;base64". */
    const char *h = url + 5;
    size_t hl = (size_t)(comma - h);
    if (hl < 7 || strncasecmp(comma - 7, ";base64", 7))
        return zi_http_fail(e, 400, "invalid_value", field,
                            "%s: the data: URL is not base64 (it needs ';base64,' before the "
                            "data: data:image/png;base64,...)",
                            field);
    size_t tl = strcspn(h, ";,"); /* the media type, when given */
    if (tl > 0 && !(tl > 6 && !strncasecmp(h, "image/", 6)) &&
        !(tl == 24 && !strncasecmp(h, "application/octet-stream", 24))) {
        char mt[64];
        size_t k = tl < sizeof mt - 1 ? tl : sizeof mt - 1;
        for (size_t i = 0; i < k; i++) mt[i] = h[i] >= 0x20 && h[i] < 0x7f ? h[i] : '?';
        mt[k] = 0;
        return zi_http_fail(e, 400, "invalid_value", field,
                            "%s: the data: URL's media type '%s' is not an image type (image/png, "
                            "image/jpeg, ...)",
                            field, mt);
    }
    return zi_http_images_add_base64(im, comma + 1, len - (size_t)(comma + 1 - url), field, e);
}
