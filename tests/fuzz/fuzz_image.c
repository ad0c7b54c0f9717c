/*
 * fuzz_image.c - libFuzzer entry point for the image decoder
 * (tokenizer_proc/image.h) and, on what decodes, the preprocessing
 * (image_prep.h) with small tiles: the input is image bytes. A refused
 * image leaves no pixels and a one-line message; a decoded one is within
 * the limits and goes through both projectors. A broken promise calls
 * __builtin_trap(); limits of 1 megapixel keep each run short.
 */
#include <stdint.h>
#include <string.h>

#include "image.h"
#include "image_prep.h"

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void prep(const zi_image_rgb *img, zi_image_proj proj, int longest) {
    zi_image_prep_params p;
    zi_image_prep_params_default(&p, proj);
    p.image_size = 32, p.patch_size = 8, p.n_merge = proj == ZI_IMAGE_PROJ_GEMMA3 ? 2 : 1;
    p.longest_edge = longest;
    zi_image_tiles t;
    zi_error err = {0};
    int rc = zi_image_prep(img, &p, &t, &err);
    if (rc != ZI_OK) {
        CHECK(t.data == NULL && err.msg[0] != '\0' && !strchr(err.msg, '\n'));
        return;
    }
    CHECK(t.data != NULL && t.n_tiles >= 1 && t.tile_size == 32);
    zi_image_layout_item items[64];
    size_t n;
    zi_image_layout(&p, &t, items, 64, &n, &err);
    zi_image_tiles_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zi_image_limits lim;
    zi_image_limits_default(&lim);
    lim.max_pixels = 1 << 20;
    lim.max_side = 4096;
    zi_image_rgb img;
    zi_error err = {0};
    int rc = zi_image_decode(data, size, &lim, &img, &err);
    if (rc != ZI_OK) {
        CHECK(img.pixels == NULL && img.width == 0);
        CHECK(err.msg[0] != '\0' && !strchr(err.msg, '\n'));
        return 0;
    }
    CHECK(img.pixels != NULL && img.width >= 1 && img.height >= 1);
    CHECK((uint64_t)img.width * img.height <= lim.max_pixels && img.width <= lim.max_side &&
          img.height <= lim.max_side);
    prep(&img, ZI_IMAGE_PROJ_GEMMA3, 0);
    prep(&img, ZI_IMAGE_PROJ_IDEFICS3, 96);
    prep(&img, ZI_IMAGE_PROJ_IDEFICS3, 0);
    zi_image_rgb_free(&img);
    return 0;
}
