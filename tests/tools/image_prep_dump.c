/*
 * image_prep_dump.c - runs tokenizer_proc's image decoder and preprocessing
 * on files, for Python tests that compare them with references (Pillow's
 * resampler, a numpy transcription of llama.cpp's rules):
 *   image_prep_dump decode IMAGE OUT.rgb
 *       prints "W H", writes W * H * 3 bytes of RGB
 *   image_prep_dump resize ALGO IN.raw W H DW DH OUT.raw
 *       zi_image_resize (ALGO bilinear, bicubic or lanczos)
 *   image_prep_dump prep PROJ IMAGE OUT.f32 SIZE PATCH MERGE LONGEST [MIN MAX]
 *       PROJ gemma3 or idefics3, mean = std = 0.5; prints "n_tiles rows
 *       cols tokens_per_tile" and writes the tiles as float32
 * Exit status 0, or 1 with the error on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "image_prep.h"

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    uint8_t *b = malloc(cap);
    for (;;) {
        if (!b) break;
        size_t got = fread(b + len, 1, cap - len, f);
        len += got;
        if (len < cap) break;
        uint8_t *nb = realloc(b, cap * 2);
        if (!nb) {
            free(b);
            b = NULL;
            break;
        }
        b = nb, cap *= 2;
    }
    fclose(f);
    *n = len;
    return b;
}

static int write_all(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) return -1;
    return 0;
}

static int die(const char *what, const zi_error *err) {
    fprintf(stderr, "image_prep_dump: %s: %s\n", what, err ? err->msg : "failed");
    return 1;
}

int main(int argc, char **argv) {
    zi_error err = {0};
    if (argc == 4 && !strcmp(argv[1], "decode")) {
        size_t n;
        uint8_t *b = read_all(argv[2], &n);
        if (!b) return die(argv[2], NULL);
        zi_image_rgb img;
        if (zi_image_decode(b, n, NULL, &img, &err)) return die(argv[2], &err);
        printf("%u %u\n", img.width, img.height);
        if (write_all(argv[3], img.pixels, (size_t)img.width * img.height * 3))
            return die(argv[3], NULL);
        zi_image_rgb_free(&img);
        free(b);
        return 0;
    }
    if (argc == 9 && !strcmp(argv[1], "resize")) {
        zi_resize_algo algo = !strcmp(argv[2], "bilinear")  ? ZI_RESIZE_BILINEAR
                              : !strcmp(argv[2], "bicubic") ? ZI_RESIZE_BICUBIC
                                                            : ZI_RESIZE_LANCZOS;
        int w = atoi(argv[4]), h = atoi(argv[5]), dw = atoi(argv[6]), dh = atoi(argv[7]);
        size_t n;
        uint8_t *b = read_all(argv[3], &n);
        if (!b || w <= 0 || h <= 0 || dw <= 0 || dh <= 0 || n != (size_t)w * h * 3)
            return die(argv[3], NULL);
        uint8_t *o = malloc((size_t)dw * dh * 3);
        if (!o || zi_image_resize(b, w, h, o, dw, dh, algo, &err)) return die("resize", &err);
        if (write_all(argv[8], o, (size_t)dw * dh * 3)) return die(argv[8], NULL);
        free(o), free(b);
        return 0;
    }
    if ((argc == 9 || argc == 11) && !strcmp(argv[1], "prep")) {
        zi_image_prep_params p;
        zi_image_prep_params_default(&p, !strcmp(argv[2], "gemma3") ? ZI_IMAGE_PROJ_GEMMA3
                                                                    : ZI_IMAGE_PROJ_IDEFICS3);
        p.image_size = atoi(argv[5]), p.patch_size = atoi(argv[6]), p.n_merge = atoi(argv[7]);
        p.longest_edge = atoi(argv[8]);
        if (argc == 11) p.min_tokens = atoi(argv[9]), p.max_tokens = atoi(argv[10]);
        p.max_tiles = 1024;
        size_t n;
        uint8_t *b = read_all(argv[3], &n);
        if (!b) return die(argv[3], NULL);
        zi_image_rgb img;
        if (zi_image_decode(b, n, NULL, &img, &err)) return die(argv[3], &err);
        zi_image_tiles t;
        if (zi_image_prep(&img, &p, &t, &err)) return die("prep", &err);
        printf("%d %d %d %d\n", t.n_tiles, t.grid_rows, t.grid_cols, t.tokens_per_tile);
        if (write_all(argv[4], t.data,
                      sizeof(float) * (size_t)t.n_tiles * t.tile_size * t.tile_size * 3))
            return die(argv[4], NULL);
        zi_image_tiles_free(&t);
        zi_image_rgb_free(&img);
        free(b);
        return 0;
    }
    fprintf(stderr,
            "usage: image_prep_dump decode IMAGE OUT.rgb\n"
            "       image_prep_dump resize ALGO IN.raw W H DW DH OUT.raw\n"
            "       image_prep_dump prep PROJ IMAGE OUT.f32 SIZE PATCH MERGE LONGEST [MIN MAX]\n");
    return 1;
}
