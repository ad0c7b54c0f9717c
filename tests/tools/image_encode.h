/*
 * image_encode.h - test-only image encoders (JPEG, PNG, WebP, GIF) over the
 * same libraries the decoder uses, so tests can make inputs in every format
 * and variant: used by tests/unit/test_image.c and by the make_image tool
 * (which Python tests run). Not linked into zinfer.
 */
#ifndef ZI_IMAGE_ENCODE_H
#define ZI_IMAGE_ENCODE_H

#include <stddef.h>
#include <stdint.h>

/* Encodes px (w x h, `channels` 8-bit samples per pixel, rows top to
 * bottom) as `kind` into a malloc'd buffer (*out, *n). Kinds:
 *   jpeg          quality 95, 4:2:0; channels 1 (grey) or 3
 *   jpeg-q100     quality 100, no chroma subsampling; channels 1 or 3
 *   jpeg-cmyk     quality 100, channels 4 (C, M, Y, K as Adobe stores
 *                 them), Adobe marker; jpeg-ycck the same as YCCK
 *   png           8-bit; channels 1 grey, 2 grey+alpha, 3 RGB, 4 RGBA
 *   png16         as png at 16 bits (each sample v * 257)
 *   png-palette   channels 3: a palette of the distinct colours (<= 256)
 *   png-interlace as png, Adam7
 *   webp          lossless; channels 3 or 4
 *   webp-lossy    quality 90; channels 3 or 4
 *   gif           channels 3 or 4 (alpha < 128 becomes the transparent
 *                 index); a palette of the distinct colours, or RGB 3-3-2
 *                 when there are more than 255
 *   gif-interlace as gif, interlaced rows
 *   gif-anim      as gif, then a second frame of inverted colours
 *   gif-inset     as gif, but the frame leaves a 1-pixel border of the
 *                 screen uncovered, whose background index is 1
 * Returns 0, or -1 with a message on stderr. */
int zi_test_image_encode(const char *kind, const uint8_t *px, int w, int h, int channels,
                         uint8_t **out, size_t *n);

#endif
