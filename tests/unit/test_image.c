/*
 * test_image.c - cmocka tests for tokenizer_proc/image.c (decoding) and
 * image_prep.c (llama.cpp's preprocessing).
 *
 * Decoding: round trips through each library's encoder (PNG, lossless WebP
 * and GIF exact, JPEG and lossy WebP close) at odd sizes, with RGBA, grey,
 * grey+alpha, 16-bit, palette and interlaced inputs; then hostile inputs:
 * every format cut at many points, bytes overwritten at many places, wrong
 * magic, headers claiming 20000 x 20000 pixels (refused before decoding,
 * timed), animated GIF (first frame) and animated WebP (refused). Run it
 * under the ASan build to check that no failure path leaks.
 *
 * Preprocessing: hand-computed resizes, normalization, gemma3's padding,
 * idefics3's grid for several sizes on both of llama.cpp's paths, tile
 * contents, tokens per tile and the prompt layout.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "image.h"
#include "image_encode.h"
#include "image_prep.h"

/* A deterministic pattern with a few hundred colours at most when
 * `few` (for GIF and palettes), smooth otherwise (for JPEG). */
static uint8_t *pattern(int w, int h, int ch, int few) {
    uint8_t *p = malloc((size_t)w * h * ch + 1);
    assert_non_null(p);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint8_t *q = p + ((size_t)y * w + x) * ch;
            int v[4];
            if (few) {
                v[0] = (x * 37 + y * 11) % 5 * 60, v[1] = (x / 3 + y * 7) % 6 * 50;
                v[2] = (x + y) % 4 * 80, v[3] = (x + 2 * y) % 3 == 0 ? 0 : 255;
            } else {
                v[0] = (x * 255) / (w > 1 ? w - 1 : 1), v[1] = (y * 255) / (h > 1 ? h - 1 : 1);
                v[2] = (x + y) * 255 / (w + h), v[3] = 1 + (x * 7 + y * 3) % 255;
            }
            for (int c = 0; c < ch; c++) q[c] = (uint8_t)v[c];
        }
    return p;
}

static uint8_t *encode(const char *kind, const uint8_t *px, int w, int h, int ch, size_t *n) {
    uint8_t *out = NULL;
    assert_int_equal(zi_test_image_encode(kind, px, w, h, ch, &out, n), 0);
    return out;
}

static void decode_ok(const uint8_t *b, size_t n, zi_image_rgb *img, int w, int h) {
    zi_error err = {0};
    int rc = zi_image_decode(b, n, NULL, img, &err);
    if (rc != ZI_OK) fail_msg("decode: %s", err.msg);
    assert_int_equal(img->width, w);
    assert_int_equal(img->height, h);
}

/* Expected RGB from `ch`-channel input the way stb_image's 3-channel load
 * gives it: grey replicated, alpha dropped. */
static void expect_rgb(const zi_image_rgb *img, const uint8_t *px, int ch) {
    size_t np = (size_t)img->width * img->height;
    for (size_t i = 0; i < np; i++) {
        const uint8_t *s = px + i * ch;
        uint8_t want[3] = {s[0], ch >= 3 ? s[1] : s[0], ch >= 3 ? s[2] : s[0]};
        if (memcmp(img->pixels + 3 * i, want, 3) != 0)
            fail_msg("pixel %zu: got %d %d %d want %d %d %d", i, img->pixels[3 * i],
                     img->pixels[3 * i + 1], img->pixels[3 * i + 2], want[0], want[1], want[2]);
    }
}

static const int sizes[][2] = {{1, 1}, {333, 517}, {3000, 10}, {7, 3}, {10, 3000}};
#define N_SIZES (sizeof sizes / sizeof sizes[0])

static void roundtrip_exact(const char *kind, int ch, int few) {
    for (size_t s = 0; s < N_SIZES; s++) {
        int w = sizes[s][0], h = sizes[s][1];
        uint8_t *px = pattern(w, h, ch, few);
        size_t n;
        uint8_t *b = encode(kind, px, w, h, ch, &n);
        zi_image_rgb img;
        decode_ok(b, n, &img, w, h);
        expect_rgb(&img, px, ch);
        zi_image_rgb_free(&img);
        free(b), free(px);
    }
}

static void test_png_roundtrip(void **state) {
    (void)state;
    for (int ch = 1; ch <= 4; ch++) {
        roundtrip_exact("png", ch, 0);
        roundtrip_exact("png16", ch, 0);
        roundtrip_exact("png-interlace", ch, 0);
    }
    roundtrip_exact("png-palette", 3, 1);
}

static void test_webp_lossless_roundtrip(void **state) {
    (void)state;
    roundtrip_exact("webp", 3, 0);
    roundtrip_exact("webp", 4, 0); /* alpha is never 0 in the pattern: RGB kept */
}

static void test_gif_roundtrip(void **state) {
    (void)state;
    roundtrip_exact("gif", 3, 1);
    roundtrip_exact("gif-interlace", 3, 1);
}

/* Mean and largest absolute difference over all samples. */
static void close_to(const zi_image_rgb *img, const uint8_t *px, int ch, double mean_max,
                     int max_max) {
    size_t np = (size_t)img->width * img->height;
    double sum = 0;
    int worst = 0;
    for (size_t i = 0; i < np; i++)
        for (int c = 0; c < 3; c++) {
            int d = abs((int)img->pixels[3 * i + c] - (int)px[i * ch + (ch >= 3 ? c : 0)]);
            sum += d;
            if (d > worst) worst = d;
        }
    double mean = sum / (double)(np * 3);
    if (img->width < 16 || img->height < 16) /* 4:2:0 chroma over a steep 7 x 3 ramp */
        mean_max = 30, max_max = 160;
    if (mean > mean_max || worst > max_max)
        fail_msg("%u x %u: mean diff %.3f (max %.3f), worst %d (max %d)", img->width, img->height,
                 mean, mean_max, worst, max_max);
}

static void test_lossy_close(void **state) {
    (void)state;
    for (size_t s = 0; s < N_SIZES; s++) {
        int w = sizes[s][0], h = sizes[s][1];
        for (int ch = 1; ch <= 3; ch += 2) {
            uint8_t *px = pattern(w, h, ch, 0);
            size_t n;
            uint8_t *b = encode("jpeg-q100", px, w, h, ch, &n);
            zi_image_rgb img;
            decode_ok(b, n, &img, w, h);
            close_to(&img, px, ch, 1.5, 12);
            if (ch == 1) /* grey JPEG: R = G = B */
                for (size_t i = 0; i < (size_t)w * h; i++)
                    assert_true(img.pixels[3 * i] == img.pixels[3 * i + 1] &&
                                img.pixels[3 * i] == img.pixels[3 * i + 2]);
            zi_image_rgb_free(&img);
            free(b);
            b = encode("jpeg", px, w, h, ch, &n);
            decode_ok(b, n, &img, w, h);
            close_to(&img, px, ch, 4.0, 80);
            zi_image_rgb_free(&img);
            free(b), free(px);
        }
        uint8_t *px = pattern(w, h, 3, 0);
        size_t n;
        uint8_t *b = encode("webp-lossy", px, w, h, 3, &n);
        zi_image_rgb img;
        decode_ok(b, n, &img, w, h);
        close_to(&img, px, 3, 4.0, 90);
        zi_image_rgb_free(&img);
        free(b), free(px);
    }
}

/* CMYK and YCCK JPEGs: R = C * K / 255 and so on (stb_image's rule). */
static void test_jpeg_cmyk(void **state) {
    (void)state;
    const char *kinds2[] = {"jpeg-cmyk", "jpeg-ycck"};
    for (int k = 0; k < 2; k++) {
        int w = 48, h = 32;
        uint8_t *px = pattern(w, h, 4, 0);
        size_t n;
        uint8_t *b = encode(kinds2[k], px, w, h, 4, &n);
        zi_image_rgb img;
        decode_ok(b, n, &img, w, h);
        uint8_t *want = malloc((size_t)w * h * 3);
        for (size_t i = 0; i < (size_t)w * h; i++)
            for (int c = 0; c < 3; c++)
                want[3 * i + c] = (uint8_t)((px[4 * i + c] * px[4 * i + 3] + 127) / 255);
        close_to(&img, want, 3, 2.0, 16);
        zi_image_rgb_free(&img);
        free(want), free(b), free(px);
    }
}

/* GIF's transparent index and pixels the first frame leaves alone are
 * black; an animated GIF gives its first frame. */
static void test_gif_transparent_and_animated(void **state) {
    (void)state;
    int w = 40, h = 30;
    uint8_t *px = pattern(w, h, 4, 1);
    size_t n;
    uint8_t *b = encode("gif", px, w, h, 4, &n);
    zi_image_rgb img;
    decode_ok(b, n, &img, w, h);
    for (size_t i = 0; i < (size_t)w * h; i++) {
        const uint8_t *s = px + 4 * i;
        uint8_t want[3] = {0, 0, 0};
        if (s[3] >= 128) memcpy(want, s, 3);
        assert_memory_equal(img.pixels + 3 * i, want, 3);
    }
    zi_image_rgb_free(&img);
    free(b);
    free(px);
    /* a frame inset by one pixel: the border takes the background colour
     * (index 1 = the second distinct colour in scan order) */
    px = pattern(w, h, 3, 1);
    b = encode("gif-inset", px, w, h, 3, &n);
    decode_ok(b, n, &img, w, h);
    /* the encoder numbers colours as the whole image's scan meets them */
    uint8_t bgc[3] = {0, 0, 0};
    for (size_t i = 1; i < (size_t)w * h; i++)
        if (memcmp(px + 3 * i, px, 3) != 0) {
            memcpy(bgc, px + 3 * i, 3);
            break;
        }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            const uint8_t *want =
                x == 0 || y == 0 || x == w - 1 || y == h - 1 ? bgc : px + ((size_t)y * w + x) * 3;
            assert_memory_equal(img.pixels + ((size_t)y * w + x) * 3, want, 3);
        }
    zi_image_rgb_free(&img);
    free(b);
    b = encode("gif-anim", px, w, h, 3, &n);
    decode_ok(b, n, &img, w, h);
    expect_rgb(&img, px, 3);
    zi_image_rgb_free(&img);
    free(b), free(px);
}

/* ---- hostile input ---- */

static const char *kinds[] = {"jpeg",       "png", "png-interlace", "webp",
                              "webp-lossy", "gif", "gif-interlace"};

/* Decodes b cut to `cut` bytes: an error naming truncation (past the
 * first bytes, where the magic or header is what is missing), or, for GIF
 * cut only in its trailer byte, the full image. */
static void check_cut(const char *kind, const uint8_t *b, size_t n, size_t cut,
                      const zi_image_rgb *full) {
    uint8_t *c = malloc(cut ? cut : 1);
    memcpy(c, b, cut);
    zi_image_rgb img;
    zi_error err = {0};
    int rc = zi_image_decode(c, cut, NULL, &img, &err);
    if (rc == ZI_OK) {
        if (strncmp(kind, "gif", 3) != 0 || cut + 1 < n)
            fail_msg("%s cut at %zu of %zu decoded", kind, cut, n);
        assert_memory_equal(img.pixels, full->pixels, (size_t)full->width * full->height * 3);
        zi_image_rgb_free(&img);
    } else {
        assert_null(img.pixels);
        assert_true(err.msg[0] != 0);
        if (cut >= 32 && !strstr(err.msg, "truncated"))
            fail_msg("%s cut at %zu of %zu: %s", kind, cut, n, err.msg);
    }
    free(c);
}

static void test_truncated(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        int w = 57, h = 43, ch = 3;
        uint8_t *px = pattern(w, h, ch, 1);
        size_t n;
        uint8_t *b = encode(kinds[k], px, w, h, ch, &n);
        zi_image_rgb full;
        decode_ok(b, n, &full, w, h);
        size_t step = n / 97 + 1;
        for (size_t cut = 0; cut < n; cut += step) check_cut(kinds[k], b, n, cut, &full);
        for (size_t cut = n > 40 ? n - 40 : 0; cut < n; cut++)
            check_cut(kinds[k], b, n, cut, &full);
        zi_image_rgb_free(&full);
        free(b), free(px);
    }
}

static void test_corrupt_bytes(void **state) {
    (void)state;
    uint32_t rng = 12345;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        int w = 33, h = 21;
        uint8_t *px = pattern(w, h, 3, 1);
        size_t n;
        uint8_t *b = encode(kinds[k], px, w, h, 3, &n);
        uint8_t *c = malloc(n);
        for (int trial = 0; trial < 300; trial++) {
            memcpy(c, b, n);
            int flips = 1 + trial % 4;
            for (int f = 0; f < flips; f++) {
                rng = rng * 1103515245u + 12345u;
                size_t at = (rng >> 8) % n;
                rng = rng * 1103515245u + 12345u;
                c[at] = (uint8_t)(rng >> 16);
            }
            zi_image_rgb img;
            zi_error err = {0};
            int rc = zi_image_decode(c, n, NULL, &img, &err);
            if (rc == ZI_OK) {
                assert_non_null(img.pixels);
                zi_image_rgb_free(&img);
            } else {
                assert_null(img.pixels);
                assert_true(err.msg[0] != 0);
            }
        }
        /* a valid header followed by garbage: the "bad data" case */
        memcpy(c, b, n);
        for (size_t i = n / 3; i < n; i++) c[i] = (uint8_t)(i * 131);
        zi_image_rgb img;
        zi_error err = {0};
        if (zi_image_decode(c, n, NULL, &img, &err) == ZI_OK) zi_image_rgb_free(&img);
        free(c), free(b), free(px);
    }
}

static void test_wrong_magic(void **state) {
    (void)state;
    zi_image_rgb img;
    zi_error err = {0};
    const char *html = "<html><body>not an image</body></html>";
    assert_int_equal(zi_image_decode((const uint8_t *)html, strlen(html), NULL, &img, &err),
                     ZI_EINVAL);
    assert_non_null(
        strstr(err.msg, "not a JPEG/PNG/WebP/GIF image (magic 3c 68 74 6d 6c 3e 3c 62 ...)"));
    assert_null(img.pixels);
    assert_int_equal(zi_image_decode((const uint8_t *)"", 0, NULL, &img, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "empty"));
    assert_int_equal(zi_image_decode((const uint8_t *)"\xff\xd8", 2, NULL, &img, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "(magic ff d8)"));
    /* RIFF but not WebP (a WAV file) */
    assert_int_equal(
        zi_image_decode((const uint8_t *)"RIFF\x24\0\0\0WAVEfmt ", 16, NULL, &img, &err),
        ZI_EINVAL);
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

/* Headers that claim 20000 x 20000 pixels, followed by little: refused from
 * the header, fast, with the size in the message. */
static void test_huge_header(void **state) {
    (void)state;
    uint8_t png[64] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a,
                       0,    0,   0,   13,  'I',  'H',  'D',  'R'};
    put_be32(png + 16, 20000), put_be32(png + 20, 20000);
    png[24] = 8, png[25] = 2;
    uint8_t gif[64] = {'G', 'I', 'F', '8', '9', 'a', 0x20, 0x4e, 0x20, 0x4e, 0xf7, 0, 0};
    uint8_t jpg[64] = {0xff, 0xd8, 0xff, 0xe0, 0, 16,   'J', 'F',  'I',  'F', 0,  1,    1,
                       0,    0,    1,    0,    1, 0,    0,   0xff, 0xc0, 0,   17, 8,    0x4e,
                       0x20, 0x4e, 0x20, 3,    1, 0x22, 0,   2,    0x11, 1,   3,  0x11, 1};
    /* WebP extended header: VP8X with a 20000 x 20000 canvas */
    uint8_t webp[64] = {'R', 'I', 'F', 'F', 56, 0, 0, 0, 'W', 'E',  'B',  'P', 'V',  'P',  '8',
                        'X', 10,  0,   0,   0,  0, 0, 0, 0,   0x1f, 0x4e, 0,   0x1f, 0x4e, 0};
    struct {
        const uint8_t *b;
        size_t n;
        const char *name;
    } cases[] = {{png, sizeof png, "PNG"},
                 {gif, sizeof gif, "GIF"},
                 {jpg, sizeof jpg, "JPEG"},
                 {webp, 30, "WebP"}};
    for (size_t i = 0; i < 4; i++) {
        zi_image_rgb img;
        zi_error err = {0};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = zi_image_decode(cases[i].b, cases[i].n, NULL, &img, &err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        if (rc != ZI_ERANGE ||
            !strstr(err.msg, "20000 x 20000 pixels is over the limit of 40000000"))
            fail_msg("%s: rc %d: %s", cases[i].name, rc, err.msg);
        assert_true(ms < 50.0);
        assert_null(img.pixels);
    }
    /* explicit limits: bytes, side, pixels */
    int w = 50, h = 20;
    uint8_t *px = pattern(w, h, 3, 0);
    size_t n;
    uint8_t *b = encode("png", px, w, h, 3, &n);
    zi_image_limits lim;
    zi_image_limits_default(&lim);
    zi_image_rgb img;
    zi_error err = {0};
    lim.max_bytes = n - 1;
    assert_int_equal(zi_image_decode(b, n, &lim, &img, &err), ZI_ERANGE);
    assert_non_null(strstr(err.msg, "bytes is over the limit"));
    zi_image_limits_default(&lim);
    lim.max_side = 49;
    assert_int_equal(zi_image_decode(b, n, &lim, &img, &err), ZI_ERANGE);
    assert_non_null(strstr(err.msg, "50 x 20 pixels: a side is over the limit of 49"));
    zi_image_limits_default(&lim);
    lim.max_pixels = 999;
    assert_int_equal(zi_image_decode(b, n, &lim, &img, &err), ZI_ERANGE);
    lim.max_pixels = 1000;
    assert_int_equal(zi_image_decode(b, n, &lim, &img, &err), ZI_OK);
    zi_image_rgb_free(&img);
    free(b), free(px);
}

/* An animated WebP (VP8X with the animation flag, an ANIM chunk, one ANMF
 * frame holding a lossless 1x1 image) is refused by name. */
static void test_animated_webp(void **state) {
    (void)state;
    uint8_t one[3] = {10, 20, 30};
    size_t n;
    uint8_t *still = encode("webp", one, 1, 1, 3, &n);
    /* still = RIFF hdr (12) + VP8L chunk; reuse that chunk inside ANMF */
    size_t vp8l = n - 12;
    size_t anmf_payload = 16 + vp8l;
    size_t total = 12 + 18 + 14 + 8 + anmf_payload;
    uint8_t *a = calloc(1, total);
    memcpy(a, "RIFF", 4);
    uint32_t riff = (uint32_t)(total - 8);
    a[4] = (uint8_t)riff, a[5] = (uint8_t)(riff >> 8), a[6] = (uint8_t)(riff >> 16),
    a[7] = (uint8_t)(riff >> 24);
    memcpy(a + 8, "WEBPVP8X", 8);
    a[16] = 10;
    a[20] = 0x02; /* animation flag */
    size_t o = 30;
    memcpy(a + o, "ANIM", 4), a[o + 4] = 6;
    o += 14;
    memcpy(a + o, "ANMF", 4);
    a[o + 4] = (uint8_t)anmf_payload, a[o + 5] = (uint8_t)(anmf_payload >> 8);
    a[o + 8 + 12] = 100; /* duration */
    memcpy(a + o + 8 + 16, still + 12, vp8l);
    zi_image_rgb img;
    zi_error err = {0};
    int rc = zi_image_decode(a, total, NULL, &img, &err);
    if (rc != ZI_EUNSUPPORTED || !strstr(err.msg, "animated"))
        fail_msg("animated WebP: rc %d: %s", rc, err.msg);
    free(a), free(still);
}

/* ---- preprocessing ---- */

static void test_resize_hand_computed(void **state) {
    (void)state;
    /* 2 -> 4 bilinear: centers 0.25, 0.75, 1.25, 1.75 in input space; the
     * edges take one pixel, the middle ones 3/4 + 1/4 (rounded down after
     * the 2^21 bias: 50.5 -> 50). */
    uint8_t in2[6] = {0, 0, 0, 200, 200, 200}, out4[12];
    assert_int_equal(zi_image_resize(in2, 2, 1, out4, 4, 1, ZI_RESIZE_BILINEAR, NULL), ZI_OK);
    const uint8_t want4[4] = {0, 50, 150, 200};
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < 3; c++) assert_int_equal(out4[3 * i + c], want4[i]);
    /* 4 -> 2 bilinear: filterscale 2, weights 3/7, 3/7, 1/7 and 1/7, 3/7,
     * 3/7 over [0, 70, 140, 210]: 50 and 160. */
    uint8_t in4[12], out2[6];
    for (int i = 0; i < 4; i++) in4[3 * i] = in4[3 * i + 1] = in4[3 * i + 2] = (uint8_t)(70 * i);
    assert_int_equal(zi_image_resize(in4, 4, 1, out2, 2, 1, ZI_RESIZE_BILINEAR, NULL), ZI_OK);
    assert_int_equal(out2[0], 50);
    assert_int_equal(out2[3], 160);
    /* the same along the vertical axis */
    assert_int_equal(zi_image_resize(in4, 1, 4, out2, 1, 2, ZI_RESIZE_BILINEAR, NULL), ZI_OK);
    assert_int_equal(out2[0], 50);
    assert_int_equal(out2[3], 160);
    /* a uniform image stays uniform under every filter, any size */
    uint8_t *u = malloc(37 * 23 * 3), *d = malloc(64 * 5 * 3);
    for (int i = 0; i < 37 * 23 * 3; i++)
        u[i] = (uint8_t)(i % 3 == 0 ? 17 : i % 3 == 1 ? 128 : 250);
    for (int a = 0; a <= 2; a++) {
        assert_int_equal(zi_image_resize(u, 37, 23, d, 64, 5, (zi_resize_algo)a, NULL), ZI_OK);
        for (int i = 0; i < 64 * 5; i++) {
            assert_int_equal(d[3 * i], 17);
            assert_int_equal(d[3 * i + 1], 128);
            assert_int_equal(d[3 * i + 2], 250);
        }
    }
    free(u), free(d);
    zi_error err = {0};
    uint8_t x[3];
    assert_int_equal(zi_image_resize(in2, 2, 1, x, 0, 1, ZI_RESIZE_BILINEAR, &err), ZI_EINVAL);
}

static zi_image_rgb solid(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
    zi_image_rgb img = {(uint32_t)w, (uint32_t)h, malloc((size_t)w * h * 3), ZI_IMAGE_PNG};
    for (size_t i = 0; i < (size_t)w * h; i++)
        img.pixels[3 * i] = r, img.pixels[3 * i + 1] = g, img.pixels[3 * i + 2] = b;
    return img;
}

static void test_gemma3_normalize_and_pad(void **state) {
    (void)state;
    zi_image_prep_params p;
    zi_image_prep_params_default(&p, ZI_IMAGE_PROJ_GEMMA3);
    p.mean[0] = 0.5f, p.mean[1] = 0.25f, p.mean[2] = 0.0f;
    p.std[0] = 0.5f, p.std[1] = 0.25f, p.std[2] = 2.0f;
    /* 896 x 896: no resize; (v / 255 - mean) / std */
    zi_image_rgb img = solid(896, 896, 255, 102, 0);
    zi_image_tiles t;
    zi_error err = {0};
    assert_int_equal(zi_image_prep(&img, &p, &t, &err), ZI_OK);
    assert_int_equal(t.n_tiles, 1);
    assert_int_equal(t.grid_rows, 0);
    assert_int_equal(t.tokens_per_tile, 256);
    assert_float_equal(t.data[0], 1.0, 1e-6);
    assert_float_equal(t.data[1], (0.4 - 0.25) / 0.25, 1e-6);
    assert_float_equal(t.data[2], 0.0, 1e-6);
    zi_image_tiles_free(&t);
    zi_image_rgb_free(&img);
    /* 2:1 -> scaled to 896 x 448, centred at row 224 on black */
    zi_image_prep_params_default(&p, ZI_IMAGE_PROJ_GEMMA3);
    img = solid(1000, 500, 255, 255, 255);
    assert_int_equal(zi_image_prep(&img, &p, &t, &err), ZI_OK);
    for (int y = 0; y < 896; y++) {
        float want = y < 224 || y >= 672 ? -1.0f : 1.0f;
        for (int x = 0; x < 896; x += 97)
            for (int c = 0; c < 3; c++)
                if (t.data[((size_t)y * 896 + x) * 3 + c] != want)
                    fail_msg("row %d col %d: %f, want %f", y, x,
                             t.data[((size_t)y * 896 + x) * 3 + c], want);
    }
    zi_image_tiles_free(&t);
    zi_image_rgb_free(&img);
    /* 1 x 3 (tall): width ceil(1 * 896/3) = 299, offset (896 - 299) / 2 = 298 */
    img = solid(1, 3, 255, 255, 255);
    assert_int_equal(zi_image_prep(&img, &p, &t, &err), ZI_OK);
    for (int x = 0; x < 896; x++) {
        float want = x < 298 || x >= 298 + 299 ? -1.0f : 1.0f;
        assert_true(t.data[((size_t)400 * 896 + x) * 3] == want);
    }
    zi_image_tiles_free(&t);
    zi_image_rgb_free(&img);
}

typedef struct grid_case {
    int w, h, longest, min_tok, max_tok, rows, cols;
} grid_case;

static void test_idefics3_grid(void **state) {
    (void)state;
    const grid_case cases[] = {
        /* path A: longest edge 1536, tiles of 512 */
        {1000, 500, 1536, -1, -1, 2, 3}, /* 1536 x 768 */
        {500, 1000, 1536, -1, -1, 3, 2}, /* 768 x 1536 */
        {333, 517, 1536, -1, -1, 3, 2},  /* (int)(1536 * 333/517) = 989, odd -> 990 */
        {100, 100, 1536, -1, -1, 3, 3},  /* small images are scaled up */
        {1, 1, 1536, -1, -1, 3, 3},
        {3000, 10, 1536, -1, -1, 1, 3}, /* height (int)5.12 = 5 -> 6 */
        {1024, 512, 1024, -1, -1, 1, 2},
        {2048, 2047, 2048, -1, -1, 4, 4}, /* (int)(2048 / 1.000489) = 2047 -> 2048 */
        /* path B: no longest edge: each side rounded to tiles, at least one */
        {1000, 500, 0, -1, -1, 1, 2},
        {100, 100, 0, -1, -1, 1, 1},
        {1300, 2000, 0, -1, -1, 4, 3}, /* round(2.54) = 3, round(3.91) = 4 */
        /* path B with a token cap: 128 tokens * 16^2 * 4^2 = 524288 pixels */
        {2000, 2000, 0, -1, 128, 1, 1},
        {2000, 1000, 1536, -1, 128, 1, 2}, /* a token limit given: path B */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const grid_case *c = &cases[i];
        zi_image_prep_params p;
        zi_image_prep_params_default(&p, ZI_IMAGE_PROJ_IDEFICS3);
        p.n_merge = 4, p.longest_edge = c->longest;
        p.min_tokens = c->min_tok, p.max_tokens = c->max_tok;
        zi_image_rgb img = solid(c->w, c->h, 10, 20, 30);
        zi_image_tiles t;
        zi_error err = {0};
        int rc = zi_image_prep(&img, &p, &t, &err);
        if (rc != ZI_OK) fail_msg("case %zu: %s", i, err.msg);
        if (t.grid_rows != c->rows || t.grid_cols != c->cols)
            fail_msg("case %zu (%d x %d, longest %d): grid %d x %d, want %d x %d", i, c->w, c->h,
                     c->longest, t.grid_rows, t.grid_cols, c->rows, c->cols);
        assert_int_equal(t.n_tiles, c->rows * c->cols + 1);
        assert_int_equal(t.tokens_per_tile, 64);
        assert_int_equal(t.tile_size, 512);
        zi_image_tiles_free(&t);
        zi_image_rgb_free(&img);
    }
}

static void test_idefics3_tiles_and_errors(void **state) {
    (void)state;
    /* 1024 x 512 with longest edge 1024: both resizes are copies, so the
     * tiles are the image's halves exactly; the global image is last. */
    int w = 1024, h = 512;
    zi_image_rgb img = {(uint32_t)w, (uint32_t)h, malloc((size_t)w * h * 3), ZI_IMAGE_PNG};
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < 3; c++)
                img.pixels[((size_t)y * w + x) * 3 + c] = (uint8_t)((x * 3 + y * 5 + c * 40) & 255);
    zi_image_prep_params p;
    zi_image_prep_params_default(&p, ZI_IMAGE_PROJ_IDEFICS3);
    p.n_merge = 4, p.longest_edge = 1024;
    zi_image_tiles t;
    zi_error err = {0};
    assert_int_equal(zi_image_prep(&img, &p, &t, &err), ZI_OK);
    assert_int_equal(t.n_tiles, 3);
    for (int tile = 0; tile < 2; tile++)
        for (int y = 0; y < 512; y += 7)
            for (int x = 0; x < 512; x += 5)
                for (int c = 0; c < 3; c++) {
                    uint8_t v = img.pixels[((size_t)y * w + tile * 512 + x) * 3 + c];
                    float want = ((float)v / 255.0f - 0.5f) / 0.5f;
                    assert_true(
                        t.data[(size_t)tile * 512 * 512 * 3 + ((size_t)y * 512 + x) * 3 + c] ==
                        want);
                }
    zi_image_tiles_free(&t);
    /* layout: 1 x 2 grid */
    assert_int_equal(zi_image_prep(&img, &p, &t, &err), ZI_OK);
    zi_image_layout_item items[16];
    size_t ni;
    assert_int_equal(zi_image_layout(&p, &t, items, 16, &ni, &err), ZI_OK);
    assert_int_equal(ni, 9);
    assert_string_equal(items[0].text, "<fake_token_around_image><row_1_col_1>");
    assert_int_equal(items[1].kind, ZI_IMAGE_LAYOUT_TILE);
    assert_int_equal(items[1].tile, 0);
    assert_int_equal(items[1].n_tokens, 64);
    assert_string_equal(items[2].text, "<fake_token_around_image><row_1_col_2>");
    assert_int_equal(items[3].tile, 1);
    assert_int_equal(items[4].kind, ZI_IMAGE_LAYOUT_TOKEN);
    assert_string_equal(items[4].text, "\n\n");
    assert_string_equal(items[5].text, "<fake_token_around_image>");
    assert_string_equal(items[6].text, "<global-img>");
    assert_int_equal(items[7].tile, 2);
    assert_string_equal(items[8].text, "<fake_token_around_image>");
    assert_int_equal(zi_image_tiles_n_tokens(&t), 192);
    assert_int_equal(zi_image_layout(&p, &t, NULL, 0, &ni, &err), ZI_ERANGE);
    assert_int_equal(ni, 9);
    zi_image_tiles_free(&t);
    zi_image_rgb_free(&img);
    /* 2 x 2 grid: a row end between the rows only */
    img = solid(800, 800, 1, 2, 3);
    p.longest_edge = 1024;
    assert_int_equal(zi_image_prep(&img, &p, &t, &err), ZI_OK);
    assert_int_equal(zi_image_layout(&p, &t, items, 16, &ni, &err), ZI_OK);
    assert_int_equal(ni, 4 * 2 + 1 + 5);
    assert_int_equal(items[4].kind, ZI_IMAGE_LAYOUT_TOKEN);
    assert_string_equal(items[4].text, "\n");
    assert_string_equal(items[5].text, "<fake_token_around_image><row_2_col_1>");
    /* the global image of a uniform image is uniform */
    const float *g = t.data + (size_t)4 * 512 * 512 * 3;
    for (size_t i = 0; i < (size_t)512 * 512; i += 1000)
        assert_true(g[3 * i] == ((float)1 / 255.0f - 0.5f) / 0.5f);
    zi_image_tiles_free(&t);
    zi_image_rgb_free(&img);
    /* errors: a side that resizes to 0, too many tiles, bad params */
    img = solid(10000, 1, 1, 2, 3);
    p.longest_edge = 1536;
    assert_int_equal(zi_image_prep(&img, &p, &t, &err), ZI_EINVAL);
    assert_null(t.data);
    zi_image_rgb_free(&img);
    img = solid(8000, 600, 1, 2, 3);
    p.longest_edge = 0, p.max_tiles = 8;
    assert_int_equal(zi_image_prep(&img, &p, &t, &err), ZI_ERANGE);
    assert_non_null(strstr(err.msg, "over the limit of 8 tiles"));
    p.max_tiles = 64, p.patch_size = 15;
    assert_int_equal(zi_image_prep(&img, &p, &t, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "patch_size"));
    zi_image_rgb_free(&img);
    /* gemma3 layout */
    zi_image_prep_params_default(&p, ZI_IMAGE_PROJ_GEMMA3);
    img = solid(5, 5, 0, 0, 0);
    assert_int_equal(zi_image_prep(&img, &p, &t, &err), ZI_OK);
    assert_int_equal(zi_image_layout(&p, &t, items, 16, &ni, &err), ZI_OK);
    assert_int_equal(ni, 3);
    assert_string_equal(items[0].text, "<start_of_image>");
    assert_int_equal(items[1].n_tokens, 256);
    assert_string_equal(items[2].text, "<end_of_image>");
    zi_image_tiles_free(&t);
    zi_image_rgb_free(&img);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_png_roundtrip),
        cmocka_unit_test(test_webp_lossless_roundtrip),
        cmocka_unit_test(test_gif_roundtrip),
        cmocka_unit_test(test_lossy_close),
        cmocka_unit_test(test_jpeg_cmyk),
        cmocka_unit_test(test_gif_transparent_and_animated),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_corrupt_bytes),
        cmocka_unit_test(test_wrong_magic),
        cmocka_unit_test(test_huge_header),
        cmocka_unit_test(test_animated_webp),
        cmocka_unit_test(test_resize_hand_computed),
        cmocka_unit_test(test_gemma3_normalize_and_pad),
        cmocka_unit_test(test_idefics3_grid),
        cmocka_unit_test(test_idefics3_tiles_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
