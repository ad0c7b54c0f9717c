/*
 * make_image.c - writes an image file from raw pixels with the encoders of
 * tests/tools/image_encode.c, so Python tests can make inputs in every
 * format the decoder reads:
 *   make_image KIND WIDTH HEIGHT CHANNELS IN.raw OUT
 * IN.raw holds WIDTH * HEIGHT * CHANNELS bytes, rows top to bottom ("-"
 * reads stdin). KIND is one of image_encode.h's (jpeg, png, png16,
 * png-palette, png-interlace, webp, webp-lossy, gif, gif-interlace,
 * gif-anim, ...). Exit status 0, or 1 with a message on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image_encode.h"

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: make_image KIND WIDTH HEIGHT CHANNELS IN.raw OUT\n");
        return 1;
    }
    long w = strtol(argv[2], NULL, 10), h = strtol(argv[3], NULL, 10);
    long ch = strtol(argv[4], NULL, 10);
    if (w <= 0 || h <= 0 || w > 65535 || h > 65535 || ch < 1 || ch > 4) {
        fprintf(stderr, "make_image: bad size %s x %s x %s\n", argv[2], argv[3], argv[4]);
        return 1;
    }
    size_t need = (size_t)w * (size_t)h * (size_t)ch;
    uint8_t *px = malloc(need);
    FILE *in = strcmp(argv[5], "-") ? fopen(argv[5], "rb") : stdin;
    if (!px || !in) {
        fprintf(stderr, "make_image: cannot read %s\n", argv[5]);
        return 1;
    }
    size_t got = fread(px, 1, need, in);
    if (in != stdin) fclose(in);
    if (got != need) {
        fprintf(stderr, "make_image: %s has %zu bytes, want %zu\n", argv[5], got, need);
        return 1;
    }
    uint8_t *out = NULL;
    size_t n = 0;
    if (zi_test_image_encode(argv[1], px, (int)w, (int)h, (int)ch, &out, &n) != 0) return 1;
    free(px);
    FILE *f = fopen(argv[6], "wb");
    if (!f || fwrite(out, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "make_image: cannot write %s\n", argv[6]);
        return 1;
    }
    free(out);
    return 0;
}
