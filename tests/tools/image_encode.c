/*
 * image_encode.c - see image_encode.h. Plain uses of each library's
 * encoder; errors go to stderr since only tests call this.
 */
#include "image_encode.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gif_lib.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/encode.h>

static int fail(const char *kind, const char *why) {
    fprintf(stderr, "image_encode %s: %s\n", kind, why);
    return -1;
}

/* ---- JPEG ---- */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
} enc_jerr;
static void enc_jerror(j_common_ptr c) {
    longjmp(((enc_jerr *)c->err)->jb, 1);
}

/* cmyk: 0, or JCS_CMYK / JCS_YCCK for 4-channel input (Adobe marker) */
static int enc_jpeg(const uint8_t *px, int w, int h, int ch, int q100, int cmyk, uint8_t **out,
                    size_t *n) {
    if (cmyk ? ch != 4 : ch != 1 && ch != 3)
        return fail("jpeg", "channels must be 1 or 3 (4 for CMYK)");
    struct jpeg_compress_struct ci;
    enc_jerr je;
    unsigned char *volatile buf = NULL;
    unsigned long size = 0;
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = enc_jerror;
    if (setjmp(je.jb)) {
        jpeg_destroy_compress(&ci);
        free(buf);
        return fail("jpeg", "libjpeg error");
    }
    jpeg_create_compress(&ci);
    jpeg_mem_dest(&ci, (unsigned char **)&buf, &size);
    ci.image_width = (JDIMENSION)w, ci.image_height = (JDIMENSION)h;
    ci.input_components = ch;
    ci.in_color_space = cmyk ? JCS_CMYK : ch == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&ci);
    if (cmyk) jpeg_set_colorspace(&ci, (J_COLOR_SPACE)cmyk);
    jpeg_set_quality(&ci, q100 ? 100 : 95, TRUE);
    if (q100 && ch == 3)
        for (int c = 0; c < 3; c++)
            ci.comp_info[c].h_samp_factor = ci.comp_info[c].v_samp_factor = 1;
    jpeg_start_compress(&ci, TRUE);
    while (ci.next_scanline < ci.image_height) {
        JSAMPROW row = (JSAMPROW)(px + (size_t)ci.next_scanline * w * ch);
        jpeg_write_scanlines(&ci, &row, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    *out = buf, *n = size;
    return 0;
}

/* ---- PNG ---- */

typedef struct {
    uint8_t *b;
    size_t n, cap;
} membuf;

static void png_write_mem(png_structp png, png_bytep data, size_t len) {
    membuf *m = png_get_io_ptr(png);
    if (m->n + len > m->cap) {
        size_t cap = (m->cap + len) * 2;
        uint8_t *nb = realloc(m->b, cap);
        if (!nb) png_error(png, "no memory");
        m->b = nb, m->cap = cap;
    }
    memcpy(m->b + m->n, data, len);
    m->n += len;
}
static void png_flush_mem(png_structp png) {
    (void)png;
}

static int enc_png(const uint8_t *px, int w, int h, int ch, int depth16, int palette, int interlace,
                   uint8_t **out, size_t *n) {
    if (ch < 1 || ch > 4) return fail("png", "channels must be 1..4");
    if (palette && ch != 3) return fail("png-palette", "channels must be 3");
    png_color pal[256];
    int npal = 0;
    uint8_t *idx = NULL;
    if (palette) {
        idx = malloc((size_t)w * h);
        if (!idx) return fail("png-palette", "no memory");
        for (size_t i = 0; i < (size_t)w * h; i++) {
            const uint8_t *p = px + 3 * i;
            int k;
            for (k = 0; k < npal; k++)
                if (pal[k].red == p[0] && pal[k].green == p[1] && pal[k].blue == p[2]) break;
            if (k == npal) {
                if (npal == 256) {
                    free(idx);
                    return fail("png-palette", "more than 256 colours");
                }
                pal[npal].red = p[0], pal[npal].green = p[1], pal[npal].blue = p[2];
                npal++;
            }
            idx[i] = (uint8_t)k;
        }
    }
    membuf m = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    uint8_t *volatile row = NULL;
    if (!png || !info || setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(m.b), free(idx), free(row);
        return fail("png", "libpng error");
    }
    png_set_write_fn(png, &m, png_write_mem, png_flush_mem);
    static const int ctypes[5] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA,
                                  PNG_COLOR_TYPE_RGB, PNG_COLOR_TYPE_RGB_ALPHA};
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth16 ? 16 : 8,
                 palette ? PNG_COLOR_TYPE_PALETTE : ctypes[ch],
                 interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (palette) png_set_PLTE(png, info, pal, npal);
    png_write_info(png, info);
    int passes = interlace ? png_set_interlace_handling(png) : 1;
    int spp = palette ? 1 : ch;
    size_t rowbytes = (size_t)w * spp * (depth16 ? 2 : 1);
    row = malloc(rowbytes);
    if (!row) png_error(png, "no memory");
    for (int pass = 0; pass < passes; pass++)
        for (int y = 0; y < h; y++) {
            for (size_t i = 0; i < (size_t)w * spp; i++) {
                uint8_t v = palette ? idx[(size_t)y * w + i] : px[(size_t)y * w * ch + i];
                if (depth16)
                    row[2 * i] = v, row[2 * i + 1] = v; /* v * 257, big-endian */
                else
                    row[i] = v;
            }
            png_write_row(png, row);
        }
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    free(row), free(idx);
    *out = m.b, *n = m.n;
    return 0;
}

/* ---- WebP ---- */

static int enc_webp(const uint8_t *px, int w, int h, int ch, int lossy, uint8_t **out, size_t *n) {
    uint8_t *o = NULL;
    size_t sz;
    if (ch == 3)
        sz = lossy ? WebPEncodeRGB(px, w, h, w * 3, 90, &o)
                   : WebPEncodeLosslessRGB(px, w, h, w * 3, &o);
    else if (ch == 4)
        sz = lossy ? WebPEncodeRGBA(px, w, h, w * 4, 90, &o)
                   : WebPEncodeLosslessRGBA(px, w, h, w * 4, &o);
    else
        return fail("webp", "channels must be 3 or 4");
    if (!sz || !o) return fail("webp", "libwebp failed");
    /* WebPFree and free are different allocators in principle: copy. */
    *out = malloc(sz);
    if (!*out) {
        WebPFree(o);
        return fail("webp", "no memory");
    }
    memcpy(*out, o, sz);
    WebPFree(o);
    *n = sz;
    return 0;
}

/* ---- GIF ---- */

static int gif_write_mem(GifFileType *g, const GifByteType *data, int len) {
    membuf *m = g->UserData;
    if (m->n + (size_t)len > m->cap) {
        size_t cap = (m->cap + (size_t)len) * 2;
        uint8_t *nb = realloc(m->b, cap);
        if (!nb) return 0;
        m->b = nb, m->cap = cap;
    }
    memcpy(m->b + m->n, data, (size_t)len);
    m->n += (size_t)len;
    return len;
}

/* inset: the screen's background index is 1 and the frame covers only
 * the pixels one in from each edge (needs w, h >= 3). */
static int enc_gif(const uint8_t *px, int w, int h, int ch, int interlace, int anim, int inset,
                   uint8_t **out, size_t *n) {
    if (inset && (w < 3 || h < 3)) return fail("gif-inset", "needs 3 x 3 or more");
    if (ch != 3 && ch != 4) return fail("gif", "channels must be 3 or 4");
    GifColorType cols[256];
    int ncol = 0, q332 = 0;
    size_t np = (size_t)w * h;
    uint8_t *idx = malloc(np ? np : 1);
    if (!idx) return fail("gif", "no memory");
    /* Index 255 is kept for transparency. */
    for (size_t i = 0; i < np && !q332; i++) {
        const uint8_t *p = px + ch * i;
        if (ch == 4 && p[3] < 128) {
            idx[i] = 255;
            continue;
        }
        int k;
        for (k = 0; k < ncol; k++)
            if (cols[k].Red == p[0] && cols[k].Green == p[1] && cols[k].Blue == p[2]) break;
        if (k == ncol) {
            if (ncol == 255) {
                q332 = 1;
                break;
            }
            cols[ncol].Red = p[0], cols[ncol].Green = p[1], cols[ncol].Blue = p[2];
            ncol++;
        }
        idx[i] = (uint8_t)k;
    }
    if (q332) {
        for (int k = 0; k < 255; k++) {
            cols[k].Red = (uint8_t)((k >> 5) * 255 / 7);
            cols[k].Green = (uint8_t)(((k >> 2) & 7) * 255 / 7);
            cols[k].Blue = (uint8_t)((k & 3) * 255 / 3);
        }
        for (size_t i = 0; i < np; i++) {
            const uint8_t *p = px + ch * i;
            int k = (p[0] >> 5) << 5 | (p[1] >> 5) << 2 | p[2] >> 6;
            idx[i] = ch == 4 && p[3] < 128 ? 255 : (uint8_t)(k == 255 ? 254 : k);
        }
        ncol = 255;
    }
    for (int k = ncol; k < 256; k++) cols[k].Red = cols[k].Green = cols[k].Blue = 0;
    int err = 0;
    membuf m = {0};
    GifFileType *g = EGifOpen(&m, gif_write_mem, &err);
    if (!g) {
        free(idx);
        return fail("gif", "EGifOpen failed");
    }
    ColorMapObject *cm = GifMakeMapObject(256, cols);
    EGifSetGifVersion(g, true); /* GIF89a: the header carries extensions */
    int ok = cm && EGifPutScreenDesc(g, w, h, 8, inset ? 1 : 0, cm) == GIF_OK;
    for (int frame = 0; ok && frame < (anim ? 2 : 1); frame++) {
        GraphicsControlBlock gcb = {.DisposalMode = DISPOSAL_UNSPECIFIED,
                                    .UserInputFlag = false,
                                    .DelayTime = 10,
                                    .TransparentColor = ch == 4 ? 255 : NO_TRANSPARENT_COLOR};
        GifByteType ext[4];
        size_t len = EGifGCBToExtension(&gcb, ext);
        ok = EGifPutExtension(g, GRAPHICS_EXT_FUNC_CODE, (int)len, ext) == GIF_OK;
        ColorMapObject *fcm = NULL;
        if (ok && frame == 1) { /* the second frame: inverted colours, own map */
            GifColorType inv[256];
            for (int k = 0; k < 256; k++)
                inv[k].Red = (uint8_t)(255 - cols[k].Red),
                inv[k].Green = (uint8_t)(255 - cols[k].Green),
                inv[k].Blue = (uint8_t)(255 - cols[k].Blue);
            fcm = GifMakeMapObject(256, inv);
            ok = fcm != NULL;
        }
        int fx = inset, fw = w - 2 * inset, fh = h - 2 * inset;
        ok = ok && EGifPutImageDesc(g, fx, fx, fw, fh, interlace, fcm) == GIF_OK;
        GifFreeMapObject(fcm);
        static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
        for (int p = 0; ok && p < (interlace ? 4 : 1); p++)
            for (int y = interlace ? start[p] : 0; ok && y < fh; y += interlace ? step[p] : 1)
                ok = EGifPutLine(g, idx + (size_t)(y + fx) * w + fx, fw) == GIF_OK;
    }
    GifFreeMapObject(cm);
    if (EGifCloseFile(g, &err) != GIF_OK) ok = 0;
    free(idx);
    if (!ok) {
        free(m.b);
        return fail("gif", "giflib failed");
    }
    *out = m.b, *n = m.n;
    return 0;
}

int zi_test_image_encode(const char *kind, const uint8_t *px, int w, int h, int channels,
                         uint8_t **out, size_t *n) {
    *out = NULL, *n = 0;
    if (w <= 0 || h <= 0) return fail(kind, "empty image");
    if (!strcmp(kind, "jpeg")) return enc_jpeg(px, w, h, channels, 0, 0, out, n);
    if (!strcmp(kind, "jpeg-q100")) return enc_jpeg(px, w, h, channels, 1, 0, out, n);
    if (!strcmp(kind, "jpeg-cmyk")) return enc_jpeg(px, w, h, channels, 1, JCS_CMYK, out, n);
    if (!strcmp(kind, "jpeg-ycck")) return enc_jpeg(px, w, h, channels, 1, JCS_YCCK, out, n);
    if (!strcmp(kind, "png")) return enc_png(px, w, h, channels, 0, 0, 0, out, n);
    if (!strcmp(kind, "png16")) return enc_png(px, w, h, channels, 1, 0, 0, out, n);
    if (!strcmp(kind, "png-palette")) return enc_png(px, w, h, channels, 0, 1, 0, out, n);
    if (!strcmp(kind, "png-interlace")) return enc_png(px, w, h, channels, 0, 0, 1, out, n);
    if (!strcmp(kind, "webp")) return enc_webp(px, w, h, channels, 0, out, n);
    if (!strcmp(kind, "webp-lossy")) return enc_webp(px, w, h, channels, 1, out, n);
    if (!strcmp(kind, "gif")) return enc_gif(px, w, h, channels, 0, 0, 0, out, n);
    if (!strcmp(kind, "gif-interlace")) return enc_gif(px, w, h, channels, 1, 0, 0, out, n);
    if (!strcmp(kind, "gif-anim")) return enc_gif(px, w, h, channels, 0, 1, 0, out, n);
    if (!strcmp(kind, "gif-inset")) return enc_gif(px, w, h, channels, 0, 0, 1, out, n);
    return fail(kind, "unknown kind");
}
