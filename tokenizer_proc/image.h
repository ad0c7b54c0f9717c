/*
 * image.h - decoding a request's image bytes (JPEG, PNG, WebP, GIF) into
 * 8-bit RGB, the input of image preprocessing (image_prep.h).
 *
 * The bytes come from clients, so everything here treats them as hostile:
 * the format is chosen by magic bytes (never by a name or a MIME type), the
 * size in the header is checked against explicit limits before any pixel
 * memory is allocated or any compressed data decoded, and every library's
 * fatal-error path returns here (libjpeg's error_exit and libpng's longjmp
 * come back through setjmp) as a ZI_E* status with a message naming the
 * problem. Nothing is left allocated after a failure.
 *
 * Channels follow llama.cpp's mtmd-helper, which loads images with
 * stb_image asking for 3 channels: alpha is dropped, not composited (stb
 * copies R, G, B and discards A); grey becomes R = G = B; palettes are
 * expanded; 16-bit samples keep their high byte (stb's 16-to-8 conversion
 * is v >> 8, as libpng's png_set_strip_16). GIF gives its first frame on
 * a canvas of the logical screen's size: black where the frame draws the
 * transparent index (stb starts from a zeroed canvas and drops alpha), and
 * outside the frame's rectangle the screen's background colour if its
 * index is above 0, else black (stb_image 2.30's first-frame rule). WebP (which llama.cpp hands to
 * ffmpeg) is decoded to RGB with alpha dropped; animated WebP is refused. JPEG pixels come from
 * libjpeg-turbo, whose IDCT and chroma upsampling differ from stb's own
 * decoder by a few levels; CMYK and YCCK JPEGs (Adobe, inverted) become
 * R = C*K/255, ... as stb does. EXIF orientation is ignored (stb ignores
 * it too).
 */
#ifndef ZI_IMAGE_H
#define ZI_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

typedef enum zi_image_format {
    ZI_IMAGE_UNKNOWN = 0,
    ZI_IMAGE_JPEG,
    ZI_IMAGE_PNG,
    ZI_IMAGE_WEBP,
    ZI_IMAGE_GIF,
} zi_image_format;

/* Defaults of zi_image_limits (zi_image_limits_default). 20 MiB of bytes
 * covers a photo from a phone; 40 megapixels (120 MB of RGB) is the most
 * one request may make this process hold; no side above 16384, which is
 * also below the 65536 that llama.cpp's resize accepts. */
#define ZI_IMAGE_DEFAULT_MAX_BYTES ((size_t)20 << 20)
#define ZI_IMAGE_DEFAULT_MAX_PIXELS ((uint64_t)40000000)
#define ZI_IMAGE_DEFAULT_MAX_SIDE 16384u

typedef struct zi_image_limits {
    size_t max_bytes;    /* the encoded image, in bytes */
    uint64_t max_pixels; /* width * height, from the header, before decoding */
    uint32_t max_side;   /* width and height each */
} zi_image_limits;

/* An 8-bit RGB image: width * height pixels, rows top to bottom, each
 * pixel R, G, B (the layout of llama.cpp's clip_image_u8). */
typedef struct zi_image_rgb {
    uint32_t width, height;
    uint8_t *pixels;        /* malloc'd, width * height * 3 bytes */
    zi_image_format format; /* what the bytes were */
} zi_image_rgb;

/* Fills lim with the ZI_IMAGE_DEFAULT_* values. */
void zi_image_limits_default(zi_image_limits *lim);

/* The format the first bytes announce: JPEG FF D8 FF, PNG's 8-byte
 * signature, "GIF87a"/"GIF89a", "RIFF" ... "WEBP". ZI_IMAGE_UNKNOWN if
 * none. */
zi_image_format zi_image_sniff(const uint8_t *bytes, size_t n);

/* "JPEG", "PNG", "WebP", "GIF" or "unknown". */
const char *zi_image_format_name(zi_image_format f);

/* Reads only the header: the format and the size in pixels (for GIF the
 * logical screen). Checks nothing against limits. ZI_EFORMAT when the
 * header is missing, cut or malformed. */
int zi_image_probe(const uint8_t *bytes, size_t n, zi_image_format *fmt, uint32_t *width,
                   uint32_t *height, zi_error *err);

/* Decodes bytes[0, n) into out (zeroed first; free with zi_image_rgb_free).
 * lim may be NULL for the defaults. Errors:
 *   ZI_EINVAL       empty input, or not any of the four formats ("not a
 *                   JPEG/PNG/WebP/GIF image (magic 3c 68 74 6d ...)")
 *   ZI_ERANGE       over a limit ("20000 x 20000 pixels is over the limit
 *                   of 40000000"), checked from the header first
 *   ZI_EFORMAT      cut short ("image is truncated") or corrupt (the
 *                   library's own words, prefixed with the format)
 *   ZI_EUNSUPPORTED a well-formed image this decoder does not handle
 *                   (animated WebP, a JPEG colour space other than grey,
 *                   YCbCr/RGB, CMYK/YCCK)
 *   ZI_ENOMEM       allocation failed
 * On failure out is left zeroed. */
int zi_image_decode(const uint8_t *bytes, size_t n, const zi_image_limits *lim, zi_image_rgb *out,
                    zi_error *err);

/* Frees img's pixels and zeroes it; NULL and zeroed images are fine. */
void zi_image_rgb_free(zi_image_rgb *img);

#endif
