/*
 * image_prep.c - llama.cpp's image preprocessing for the gemma3 and
 * idefics3 projectors (see image_prep.h), step for step:
 *
 * resize (img_tool::resize in tools/mtmd/mtmd-image.cpp)
 *   - same size: a copy;
 *   - PAD_NONE: resize_pillow straight to the target;
 *   - PAD_CEIL: scale = min(tw / sw, th / sh) in float; the image is
 *     resized to min(ceil(sw * scale), tw) x min(ceil(sh * scale), th),
 *     then drawn at ((tw - nw) / 2, (th - nh) / 2) (integer division) on
 *     a canvas filled with the pad colour (black).
 * resize_pillow (Pillow's Resample.c): per axis, scale = in / out,
 *   filterscale = max(scale, 1), support = radius * filterscale (1, 2, 3
 *   for bilinear, bicubic a = -0.5, lanczos 3); output pixel i takes input
 *   pixels [xmin, xmax) around center = (i + 0.5) * scale, weights
 *   filter((x - center + 0.5) / filterscale) normalized to sum 1, then
 *   fixed point round(w * 2^22) (half away from zero); sums start at 2^21
 *   and are shifted right by 22 and clamped to 0..255. Horizontal pass
 *   first, into an 8-bit image, then vertical. An axis whose size does not
 *   change is not resampled.
 * normalize (clip_image_f32::from_u8, normalize): f = v / 255.0f, then
 *   (f - mean[c]) / std[c], float arithmetic.
 * gemma3 (mtmd_image_preprocessor_fixed_size, gemma3 hparams:
 *   RESIZE_ALGO_BILINEAR, image_resize_pad left at PAD_CEIL): resize to
 *   image_size x image_size with PAD_CEIL, one tile.
 * idefics3 (mtmd_image_preprocessor_idefics3; hparams RESIZE_ALGO_LANCZOS):
 *   path A, when preproc_image_size (longest_edge) > 0 and no custom token
 *   limits: aspect = (double)w / h; the longer side becomes longest_edge
 *   and the other (int)(longest_edge / aspect) (or * aspect), plus one if
 *   odd; grid = ceil(side / image_size) per axis; the image is resized
 *   (lanczos, no pad) to that size, that is resized again to grid *
 *   image_size, tiles are cropped from it row by row, and the global image
 *   is the grid-sized image resized to image_size x image_size.
 *   Path B, otherwise (img_tool::calc_size_preserved_ratio with align =
 *   image_size, then llava_uhd::slice_image): refined size = each side
 *   rounded to a multiple of image_size (at least one), or with
 *   longest_edge scaled then ceiled to a multiple, then shrunk (floor) if
 *   over max_pixels or grown (ceil) if under min_pixels (pixels = tokens *
 *   patch_size^2 * n_merge^2); the image is resized to it with bicubic and
 *   PAD_CEIL (image_resize_algo_rf, image_pad_rf), tiles cropped row by
 *   row, and the global image is the original resized with bicubic and no
 *   pad (image_resize_algo_ov, image_pad_ov) to image_size x image_size.
 * tokens per tile (clip_n_output_tokens): (tile / patch)^2 / n_merge^2.
 */
#include "image_prep.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION_BITS (32 - 8 - 2)
#define MAX_RESIZE_SIDE 65536 /* resize_pillow's own range check */

void zi_image_prep_params_default(zi_image_prep_params *p, zi_image_proj proj) {
    memset(p, 0, sizeof *p);
    p->proj = proj;
    if (proj == ZI_IMAGE_PROJ_GEMMA3) {
        p->image_size = 896, p->patch_size = 14, p->n_merge = 4;
    } else {
        p->image_size = 512, p->patch_size = 16, p->n_merge = 1;
    }
    p->longest_edge = 0;
    p->min_tokens = p->max_tokens = -1;
    for (int c = 0; c < 3; c++) p->mean[c] = 0.5f, p->std[c] = 0.5f;
    p->max_tiles = ZI_IMAGE_PREP_DEFAULT_MAX_TILES;
}

int zi_image_prep_check(const zi_image_prep_params *p, zi_error *err) {
    if (p->proj != ZI_IMAGE_PROJ_GEMMA3 && p->proj != ZI_IMAGE_PROJ_IDEFICS3)
        return zi_error_set(err, ZI_EINVAL,
                            "image prep: projector kind %d is not gemma3 or idefics3",
                            (int)p->proj);
    if (p->image_size <= 0 || p->image_size > 8192)
        return zi_error_set(err, ZI_EINVAL, "image prep: image_size %d is out of range (1..8192)",
                            p->image_size);
    if (p->patch_size <= 0 || p->n_merge <= 0)
        return zi_error_set(err, ZI_EINVAL,
                            "image prep: patch_size %d, n_merge %d must be positive", p->patch_size,
                            p->n_merge);
    if (p->image_size % (p->patch_size * p->n_merge) != 0)
        return zi_error_set(
            err, ZI_EINVAL,
            "image prep: image_size %d is not a multiple of patch_size %d * n_merge %d",
            p->image_size, p->patch_size, p->n_merge);
    if (p->longest_edge < 0 || p->longest_edge > MAX_RESIZE_SIDE)
        return zi_error_set(err, ZI_EINVAL, "image prep: longest_edge %d is out of range",
                            p->longest_edge);
    for (int c = 0; c < 3; c++)
        if (!(p->std[c] != 0.0f) || !isfinite(p->std[c]) || !isfinite(p->mean[c]))
            return zi_error_set(err, ZI_EINVAL, "image prep: mean[%d] %g / std[%d] %g is unusable",
                                c, (double)p->mean[c], c, (double)p->std[c]);
    if (p->max_tiles <= 0)
        return zi_error_set(err, ZI_EINVAL, "image prep: max_tiles %d must be positive",
                            p->max_tiles);
    return ZI_OK;
}

/* ---- resize_pillow -------------------------------------------------------- */

static double filter_weight(zi_resize_algo algo, double x) {
    if (algo == ZI_RESIZE_LANCZOS) {
        if (-3.0 <= x && x < 3.0) {
            const double pi = 3.141592653589793238462643383279502884;
            double a = x == 0.0 ? 1.0 : sin(x * pi) / (x * pi);
            double y = x / 3.0;
            double b = y == 0.0 ? 1.0 : sin(y * pi) / (y * pi);
            return a * b;
        }
        return 0.0;
    }
    if (x < 0.0) x = -x;
    if (algo == ZI_RESIZE_BILINEAR) return x < 1.0 ? 1.0 - x : 0.0;
    const double a = -0.5;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

/* One axis's taps: bounds[2i] = first input pixel, bounds[2i+1] = count,
 * weights[i * ksize + k] fixed point. Returns ksize, or 0 on no memory. */
static int precompute(zi_resize_algo algo, int in, int out, int **bounds_out,
                      int32_t **weights_out) {
    double radius = algo == ZI_RESIZE_BILINEAR ? 1.0 : algo == ZI_RESIZE_BICUBIC ? 2.0 : 3.0;
    double scale = (double)in / out, filterscale = scale < 1.0 ? 1.0 : scale;
    double support = radius * filterscale;
    int ksize = (int)ceil(support) * 2 + 1;
    double *pre = malloc(sizeof(double) * (size_t)out * ksize);
    int *bounds = malloc(sizeof(int) * (size_t)out * 2);
    int32_t *w = malloc(sizeof(int32_t) * (size_t)out * ksize);
    if (!pre || !bounds || !w) {
        free(pre), free(bounds), free(w);
        return 0;
    }
    for (int xx = 0; xx < out; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = (int)(center + support + 0.5);
        if (xmax > in) xmax = in;
        xmax -= xmin;
        double *k = pre + (size_t)xx * ksize;
        int x;
        for (x = 0; x < xmax; x++) {
            double v = filter_weight(algo, (x + xmin - center + 0.5) * ss);
            k[x] = v;
            ww += v;
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0) k[x] /= ww;
        for (; x < ksize; x++) k[x] = 0;
        bounds[xx * 2 + 0] = xmin;
        bounds[xx * 2 + 1] = xmax;
    }
    const double fxp = ldexp(1.0, PRECISION_BITS);
    for (size_t i = 0; i < (size_t)out * ksize; i++)
        w[i] = (int32_t)(pre[i] * fxp + (pre[i] < 0 ? -0.5 : 0.5));
    free(pre);
    *bounds_out = bounds;
    *weights_out = w;
    return ksize;
}

static uint8_t clip8(int32_t v) {
    return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

static void pass_h(const uint8_t *src, int in_nx, int ny, uint8_t *dst, int out_nx, int ksize,
                   const int *bounds, const int32_t *w) {
    for (int yy = 0; yy < ny; yy++) {
        const uint8_t *srow = src + (size_t)yy * in_nx * 3;
        uint8_t *drow = dst + (size_t)yy * out_nx * 3;
        for (int xx = 0; xx < out_nx; xx++) {
            int xmin = bounds[xx * 2], xcnt = bounds[xx * 2 + 1];
            const int32_t *k = w + (size_t)xx * ksize;
            const uint8_t *p = srow + (size_t)xmin * 3;
            int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
            for (int x = 0; x < xcnt; x++, p += 3) {
                s0 += p[0] * k[x];
                s1 += p[1] * k[x];
                s2 += p[2] * k[x];
            }
            drow[xx * 3 + 0] = clip8(s0 >> PRECISION_BITS);
            drow[xx * 3 + 1] = clip8(s1 >> PRECISION_BITS);
            drow[xx * 3 + 2] = clip8(s2 >> PRECISION_BITS);
        }
    }
}

static int pass_v(const uint8_t *src, int nx, uint8_t *dst, int out_ny, int ksize,
                  const int *bounds, const int32_t *w) {
    size_t row = (size_t)nx * 3;
    int32_t *acc = malloc(sizeof(int32_t) * row);
    if (!acc) return -1;
    for (int yy = 0; yy < out_ny; yy++) {
        int ymin = bounds[yy * 2], ycnt = bounds[yy * 2 + 1];
        const int32_t *k = w + (size_t)yy * ksize;
        for (size_t i = 0; i < row; i++) acc[i] = 1 << (PRECISION_BITS - 1);
        for (int y = 0; y < ycnt; y++) {
            const uint8_t *s = src + (size_t)(ymin + y) * row;
            int32_t wy = k[y];
            for (size_t i = 0; i < row; i++) acc[i] += s[i] * wy;
        }
        uint8_t *d = dst + (size_t)yy * row;
        for (size_t i = 0; i < row; i++) d[i] = clip8(acc[i] >> PRECISION_BITS);
    }
    free(acc);
    return 0;
}

int zi_image_resize(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh,
                    zi_resize_algo algo, zi_error *err) {
    if (sw <= 0 || sh <= 0 || dw <= 0 || dh <= 0 || dw > MAX_RESIZE_SIDE || dh > MAX_RESIZE_SIDE ||
        sw > MAX_RESIZE_SIDE || sh > MAX_RESIZE_SIDE)
        return zi_error_set(err, ZI_EINVAL, "resize %d x %d to %d x %d is out of range (1..%d)", sw,
                            sh, dw, dh, MAX_RESIZE_SIDE);
    int need_h = dw != sw, need_v = dh != sh;
    if (!need_h && !need_v) {
        memcpy(dst, src, (size_t)sw * sh * 3);
        return ZI_OK;
    }
    int *bh = NULL, *bv = NULL;
    int32_t *wh = NULL, *wv = NULL;
    uint8_t *tmp = NULL;
    int kh = 0, kv = 0, rc = ZI_OK;
    if (need_h && !(kh = precompute(algo, sw, dw, &bh, &wh))) goto oom;
    if (need_v && !(kv = precompute(algo, sh, dh, &bv, &wv))) goto oom;
    if (need_h && need_v) {
        if (!(tmp = malloc((size_t)dw * sh * 3))) goto oom;
        pass_h(src, sw, sh, tmp, dw, kh, bh, wh);
        if (pass_v(tmp, dw, dst, dh, kv, bv, wv)) goto oom;
    } else if (need_h) {
        pass_h(src, sw, sh, dst, dw, kh, bh, wh);
    } else if (pass_v(src, sw, dst, dh, kv, bv, wv)) {
        goto oom;
    }
    goto done;
oom:
    rc = zi_error_set(err, ZI_ENOMEM, "resize %d x %d to %d x %d: no memory", sw, sh, dw, dh);
done:
    free(bh), free(bv), free(wh), free(wv), free(tmp);
    return rc;
}

/* ---- img_tool::resize, crop, normalize -------------------------------------- */

typedef struct u8img {
    int w, h;
    uint8_t *px;
} u8img;

typedef enum { PAD_NONE, PAD_CEIL } pad_style;

/* img_tool::resize; dst is allocated here. The pad colour is black (the
 * default of every call this file makes). */
static int resize_img(const u8img *src, u8img *dst, int tw, int th, zi_resize_algo algo,
                      pad_style pad, zi_error *err) {
    dst->w = tw, dst->h = th;
    if (tw <= 0 || th <= 0 || tw > MAX_RESIZE_SIDE || th > MAX_RESIZE_SIDE) {
        dst->px = NULL;
        return zi_error_set(err, ZI_EINVAL, "image prep: resize target %d x %d is out of range", tw,
                            th);
    }
    dst->px = calloc((size_t)tw * th, 3);
    if (!dst->px) return zi_error_set(err, ZI_ENOMEM, "image prep: no memory for %d x %d", tw, th);
    if (tw == src->w && th == src->h) {
        memcpy(dst->px, src->px, (size_t)tw * th * 3);
        return ZI_OK;
    }
    if (pad == PAD_NONE)
        return zi_image_resize(src->px, src->w, src->h, dst->px, tw, th, algo, err);
    float sw = (float)tw / (float)src->w, sh = (float)th / (float)src->h;
    float scale = sw < sh ? sw : sh;
    int nw = (int)ceilf((float)src->w * scale), nh = (int)ceilf((float)src->h * scale);
    if (nw > tw) nw = tw;
    if (nh > th) nh = th;
    uint8_t *tmp = malloc((size_t)(nw > 0 ? nw : 1) * (nh > 0 ? nh : 1) * 3);
    if (!tmp) return zi_error_set(err, ZI_ENOMEM, "image prep: no memory for %d x %d", nw, nh);
    int rc = zi_image_resize(src->px, src->w, src->h, tmp, nw, nh, algo, err);
    if (rc == ZI_OK) {
        int ox = (tw - nw) / 2, oy = (th - nh) / 2; /* canvas is already black */
        for (int y = 0; y < nh; y++)
            memcpy(dst->px + ((size_t)(y + oy) * tw + ox) * 3, tmp + (size_t)y * nw * 3,
                   (size_t)nw * 3);
    }
    free(tmp);
    return rc;
}

/* img_tool::crop of a size x size tile at (x, y), then from_u8 and
 * normalize into out. */
static void tile_to_f32(const u8img *img, int x0, int y0, int size, const zi_image_prep_params *p,
                        float *out) {
    assert(x0 >= 0 && y0 >= 0 && x0 + size <= img->w && y0 + size <= img->h);
    for (int y = 0; y < size; y++) {
        const uint8_t *s = img->px + ((size_t)(y0 + y) * img->w + x0) * 3;
        float *d = out + (size_t)y * size * 3;
        for (int i = 0; i < size * 3; i++) {
            int c = i % 3;
            float f = (float)s[i] / 255.0f;
            d[i] = (f - p->mean[c]) / p->std[c];
        }
    }
}

/* ---- the two projectors ---------------------------------------------------- */

static int alloc_tiles(zi_image_tiles *out, const zi_image_prep_params *p, int rows, int cols,
                       int n_tiles, zi_error *err) {
    int t = p->image_size;
    if (rows * cols > p->max_tiles)
        return zi_error_set(err, ZI_ERANGE,
                            "image prep: a %d x %d grid is over the limit of %d tiles", rows, cols,
                            p->max_tiles);
    out->data = malloc(sizeof(float) * (size_t)n_tiles * t * t * 3);
    if (!out->data)
        return zi_error_set(err, ZI_ENOMEM, "image prep: no memory for %d tiles of %d x %d",
                            n_tiles, t, t);
    out->n_tiles = n_tiles;
    out->tile_size = t;
    out->grid_rows = rows, out->grid_cols = cols;
    int side = t / p->patch_size;
    out->tokens_per_tile = side * side / (p->n_merge * p->n_merge);
    return ZI_OK;
}

static int prep_gemma3(const u8img *img, const zi_image_prep_params *p, zi_image_tiles *out,
                       zi_error *err) {
    u8img r = {0};
    int rc = resize_img(img, &r, p->image_size, p->image_size, ZI_RESIZE_BILINEAR, PAD_CEIL, err);
    if (rc == ZI_OK) rc = alloc_tiles(out, p, 0, 0, 1, err);
    if (rc == ZI_OK) tile_to_f32(&r, 0, 0, p->image_size, p, out->data);
    free(r.px);
    return rc;
}

/* Crops grid tiles from `refined` into out->data[0..), row by row. */
static void crop_grid(const u8img *refined, const zi_image_prep_params *p, zi_image_tiles *out) {
    size_t tile_floats = (size_t)p->image_size * p->image_size * 3;
    for (int y = 0; y < out->grid_rows; y++)
        for (int x = 0; x < out->grid_cols; x++)
            tile_to_f32(refined, x * p->image_size, y * p->image_size, p->image_size, p,
                        out->data + (size_t)(y * out->grid_cols + x) * tile_floats);
}

/* Path A: preproc_image_size given, no custom token limits. */
static int prep_idefics3_longest(const u8img *img, const zi_image_prep_params *p,
                                 zi_image_tiles *out, zi_error *err) {
    const int tile = p->image_size, le = p->longest_edge;
    const double aspect = (double)img->w / img->h;
    int rw, rh;
    if (img->w >= img->h) {
        rw = le;
        rh = (int)(le / aspect);
        rh += rh % 2;
    } else {
        rh = le;
        rw = (int)(le * aspect);
        rw += rw % 2;
    }
    if (rw <= 0 || rh <= 0)
        return zi_error_set(
            err, ZI_EINVAL,
            "image prep: a %d x %d image resized to a longest edge of %d is %d x %d", img->w,
            img->h, le, rw, rh);
    const int gx = (rw + tile - 1) / tile, gy = (rh + tile - 1) / tile;
    int rc = alloc_tiles(out, p, gy, gx, gx * gy + 1, err);
    if (rc != ZI_OK) return rc;
    u8img resized = {0}, refined = {0}, overview = {0};
    rc = resize_img(img, &resized, rw, rh, ZI_RESIZE_LANCZOS, PAD_NONE, err);
    if (rc == ZI_OK)
        rc = resize_img(&resized, &refined, gx * tile, gy * tile, ZI_RESIZE_LANCZOS, PAD_NONE, err);
    if (rc == ZI_OK)
        rc = resize_img(&refined, &overview, tile, tile, ZI_RESIZE_LANCZOS, PAD_NONE, err);
    if (rc == ZI_OK) {
        crop_grid(&refined, p, out);
        tile_to_f32(&overview, 0, 0, tile, p, out->data + (size_t)gx * gy * tile * tile * 3);
    }
    free(resized.px), free(refined.px), free(overview.px);
    return rc;
}

/* img_tool::calc_size_preserved_ratio, float arithmetic as there. */
static void calc_size_preserved_ratio(int width, int height, int f, int min_px, int max_px, int le,
                                      int *ow, int *oh) {
#define ROUND_BY(x) ((int)roundf((x) / (float)f) * f)
#define CEIL_BY(x) ((int)ceilf((x) / (float)f) * f)
#define FLOOR_BY(x) ((int)floorf((x) / (float)f) * f)
    int w_bar, h_bar;
    if (le > 0) {
        float sw = (float)le / (float)width, sh = (float)le / (float)height;
        float scale = sw < sh ? sw : sh;
        w_bar = CEIL_BY((float)width * scale);
        h_bar = CEIL_BY((float)height * scale);
    } else {
        w_bar = ROUND_BY((float)width);
        h_bar = ROUND_BY((float)height);
        if (w_bar < f) w_bar = f;
        if (h_bar < f) h_bar = f;
    }
    if (max_px > 0 && (int64_t)h_bar * w_bar > max_px) {
        float beta = sqrtf((float)height * (float)width / (float)max_px);
        h_bar = FLOOR_BY((float)height / beta);
        w_bar = FLOOR_BY((float)width / beta);
        if (h_bar < f) h_bar = f;
        if (w_bar < f) w_bar = f;
    } else if (min_px > 0 && (int64_t)h_bar * w_bar < min_px) {
        float beta = sqrtf((float)min_px / ((float)height * (float)width));
        h_bar = CEIL_BY((float)height * beta);
        w_bar = CEIL_BY((float)width * beta);
    }
#undef ROUND_BY
#undef CEIL_BY
#undef FLOOR_BY
    *ow = w_bar, *oh = h_bar;
}

/* Path B: llava-uhd slicing with the refined size above. */
static int prep_idefics3_refined(const u8img *img, const zi_image_prep_params *p,
                                 zi_image_tiles *out, zi_error *err) {
    const int tile = p->image_size;
    const int64_t patch_area = (int64_t)p->patch_size * p->patch_size * p->n_merge * p->n_merge;
    int64_t min_px = p->min_tokens > 0 ? p->min_tokens * patch_area : 0;
    int64_t max_px = p->max_tokens > 0 ? p->max_tokens * patch_area : 0;
    if (min_px > INT32_MAX || max_px > INT32_MAX)
        return zi_error_set(err, ZI_EINVAL, "image prep: min/max tokens %d / %d are too large",
                            p->min_tokens, p->max_tokens);
    int rw, rh;
    calc_size_preserved_ratio(img->w, img->h, tile, (int)min_px, (int)max_px, p->longest_edge, &rw,
                              &rh);
    if (rw <= 0 || rh <= 0 || rw > MAX_RESIZE_SIDE || rh > MAX_RESIZE_SIDE)
        return zi_error_set(err, ZI_EINVAL, "image prep: refined size %d x %d is out of range", rw,
                            rh);
    /* Whole tiles: every size above is a multiple of image_size. */
    assert(rw % tile == 0 && rh % tile == 0);
    const int gx = rw / tile, gy = rh / tile;
    int rc = alloc_tiles(out, p, gy, gx, gx * gy + 1, err);
    if (rc != ZI_OK) return rc;
    u8img overview = {0}, refined = {0};
    rc = resize_img(img, &overview, tile, tile, ZI_RESIZE_BICUBIC, PAD_NONE, err);
    if (rc == ZI_OK) rc = resize_img(img, &refined, rw, rh, ZI_RESIZE_BICUBIC, PAD_CEIL, err);
    if (rc == ZI_OK) {
        crop_grid(&refined, p, out);
        tile_to_f32(&overview, 0, 0, tile, p, out->data + (size_t)gx * gy * tile * tile * 3);
    }
    free(overview.px), free(refined.px);
    return rc;
}

int zi_image_prep(const zi_image_rgb *img, const zi_image_prep_params *p, zi_image_tiles *out,
                  zi_error *err) {
    assert(img && p && out);
    memset(out, 0, sizeof *out);
    int rc = zi_image_prep_check(p, err);
    if (rc != ZI_OK) return rc;
    if (!img->pixels || img->width == 0 || img->height == 0 || img->width > MAX_RESIZE_SIDE ||
        img->height > MAX_RESIZE_SIDE)
        return zi_error_set(err, ZI_EINVAL, "image prep: image of %u x %u pixels is out of range",
                            img->width, img->height);
    u8img src = {(int)img->width, (int)img->height, img->pixels};
    if (p->proj == ZI_IMAGE_PROJ_GEMMA3)
        rc = prep_gemma3(&src, p, out, err);
    else if (p->longest_edge > 0 && p->min_tokens <= 0 && p->max_tokens <= 0)
        rc = prep_idefics3_longest(&src, p, out, err);
    else
        rc = prep_idefics3_refined(&src, p, out, err);
    if (rc != ZI_OK) zi_image_tiles_free(out);
    return rc;
}

void zi_image_tiles_free(zi_image_tiles *t) {
    if (!t) return;
    free(t->data);
    memset(t, 0, sizeof *t);
}

size_t zi_image_tiles_n_tokens(const zi_image_tiles *t) {
    return (size_t)t->n_tiles * (size_t)t->tokens_per_tile;
}

/* ---- prompt layout (mtmd_tokenizer::add_media) ------------------------------ */

typedef struct layout_out {
    zi_image_layout_item *items;
    size_t cap, n;
} layout_out;

static void emit(layout_out *o, zi_image_layout_kind kind, const char *text, int tile, int n_tok) {
    if (o->n < o->cap) {
        zi_image_layout_item *it = &o->items[o->n];
        memset(it, 0, sizeof *it);
        it->kind = kind;
        snprintf(it->text, sizeof it->text, "%s", text);
        it->tile = tile;
        it->n_tokens = n_tok;
    }
    o->n++;
}

int zi_image_layout(const zi_image_prep_params *p, const zi_image_tiles *t,
                    zi_image_layout_item *items, size_t cap, size_t *n_items, zi_error *err) {
    layout_out o = {items, items ? cap : 0, 0};
    *n_items = 0;
    if (t->n_tiles <= 0) return zi_error_set(err, ZI_EINVAL, "image layout: no tiles");
    if (p->proj == ZI_IMAGE_PROJ_GEMMA3) {
        if (t->n_tiles != 1)
            return zi_error_set(err, ZI_EINVAL, "image layout: gemma3 has one tile");
        /* img_beg / img_end, added as text with specials parsed */
        emit(&o, ZI_IMAGE_LAYOUT_TEXT, "<start_of_image>", -1, 0);
        emit(&o, ZI_IMAGE_LAYOUT_TILE, "", 0, t->tokens_per_tile);
        emit(&o, ZI_IMAGE_LAYOUT_TEXT, "<end_of_image>", -1, 0);
    } else if (p->proj == ZI_IMAGE_PROJ_IDEFICS3) {
        int rows = t->grid_rows, cols = t->grid_cols;
        if (rows <= 0 || cols <= 0 || t->n_tiles != rows * cols + 1)
            return zi_error_set(err, ZI_EINVAL,
                                "image layout: %d tiles do not match a %d x %d grid", t->n_tiles,
                                rows, cols);
        char buf[64];
        for (int y = 0; y < rows; y++) {
            for (int x = 0; x < cols; x++) {
                /* sli_img_start_tmpl, 1-based row and column */
                snprintf(buf, sizeof buf, "<fake_token_around_image><row_%d_col_%d>", y + 1, x + 1);
                emit(&o, ZI_IMAGE_LAYOUT_TEXT, buf, -1, 0);
                emit(&o, ZI_IMAGE_LAYOUT_TILE, "", y * cols + x, t->tokens_per_tile);
            }
            if (y != rows - 1) emit(&o, ZI_IMAGE_LAYOUT_TOKEN, "\n", -1, 0); /* tok_row_end */
        }
        /* tok_ov_img_start, the overview, tok_ov_img_end */
        emit(&o, ZI_IMAGE_LAYOUT_TOKEN, "\n\n", -1, 0);
        emit(&o, ZI_IMAGE_LAYOUT_TOKEN, "<fake_token_around_image>", -1, 0);
        emit(&o, ZI_IMAGE_LAYOUT_TOKEN, "<global-img>", -1, 0);
        emit(&o, ZI_IMAGE_LAYOUT_TILE, "", rows * cols, t->tokens_per_tile);
        emit(&o, ZI_IMAGE_LAYOUT_TOKEN, "<fake_token_around_image>", -1, 0);
    } else {
        return zi_error_set(err, ZI_EINVAL, "image layout: projector kind %d", (int)p->proj);
    }
    *n_items = o.n;
    if (o.n > o.cap)
        return zi_error_set(err, ZI_ERANGE, "image layout: %zu items do not fit in %zu", o.n,
                            o.cap);
    return ZI_OK;
}
