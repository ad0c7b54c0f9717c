/*
 * image.c - image bytes to 8-bit RGB: JPEG by libjpeg-turbo, PNG by libpng,
 * WebP by libwebp, GIF (first frame) by giflib. See image.h for the rules
 * (limits before decoding, channels as llama.cpp's stb_image gives them).
 *
 * Each decoder reads from memory through its library's source hook and
 * reports a read past the end as "image is truncated"; libjpeg and libpng
 * report fatal errors by longjmp, so their pixel buffer pointers are
 * volatile and freed on the way back.
 */
#include "image.h"

#include <assert.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gif_lib.h>
#include <jerror.h>
#include <jpeglib.h>
#include <png.h>
#include <webp/decode.h>

/* A progressive JPEG may carry any number of scans, each a full pass over
 * the coefficients; real encoders write at most a few dozen. Past this the
 * input is an attempt to burn CPU (libjpeg-turbo's djpeg -maxscans). */
#define ZI_JPEG_MAX_SCANS 500

void zi_image_limits_default(zi_image_limits *lim) {
    lim->max_bytes = ZI_IMAGE_DEFAULT_MAX_BYTES;
    lim->max_pixels = ZI_IMAGE_DEFAULT_MAX_PIXELS;
    lim->max_side = ZI_IMAGE_DEFAULT_MAX_SIDE;
}

zi_image_format zi_image_sniff(const uint8_t *b, size_t n) {
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
    if (n >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return ZI_IMAGE_JPEG;
    if (n >= 8 && memcmp(b, png_sig, 8) == 0) return ZI_IMAGE_PNG;
    if (n >= 6 && (memcmp(b, "GIF87a", 6) == 0 || memcmp(b, "GIF89a", 6) == 0)) return ZI_IMAGE_GIF;
    if (n >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0) return ZI_IMAGE_WEBP;
    return ZI_IMAGE_UNKNOWN;
}

const char *zi_image_format_name(zi_image_format f) {
    switch (f) {
    case ZI_IMAGE_JPEG:
        return "JPEG";
    case ZI_IMAGE_PNG:
        return "PNG";
    case ZI_IMAGE_WEBP:
        return "WebP";
    case ZI_IMAGE_GIF:
        return "GIF";
    default:
        return "unknown";
    }
}

static int err_truncated(zi_error *err, zi_image_format f) {
    return zi_error_set(err, ZI_EFORMAT, "image is truncated (%s data ends early)",
                        zi_image_format_name(f));
}

/* The size check every decoder makes from the header, before allocating. */
static int check_size(uint64_t w, uint64_t h, const zi_image_limits *lim, zi_error *err) {
    if (w == 0 || h == 0)
        return zi_error_set(err, ZI_EFORMAT, "image has no pixels (%llu x %llu)",
                            (unsigned long long)w, (unsigned long long)h);
    if (w * h > lim->max_pixels)
        return zi_error_set(err, ZI_ERANGE, "%llu x %llu pixels is over the limit of %llu pixels",
                            (unsigned long long)w, (unsigned long long)h,
                            (unsigned long long)lim->max_pixels);
    if (w > lim->max_side || h > lim->max_side)
        return zi_error_set(err, ZI_ERANGE, "%llu x %llu pixels: a side is over the limit of %u",
                            (unsigned long long)w, (unsigned long long)h, lim->max_side);
    return ZI_OK;
}

/* ---- header probes (no decoding) ---------------------------------------- */

static uint32_t be16(const uint8_t *p) {
    return (uint32_t)p[0] << 8 | p[1];
}
static uint32_t be32(const uint8_t *p) {
    return be16(p) << 16 | be16(p + 2);
}
static uint32_t le16(const uint8_t *p) {
    return (uint32_t)p[1] << 8 | p[0];
}

/* The first SOFn marker's size; walks the marker segments by their lengths. */
static int probe_jpeg(const uint8_t *b, size_t n, uint32_t *w, uint32_t *h, zi_error *err) {
    size_t i = 2;
    for (;;) {
        while (i < n && b[i] != 0xff) i++; /* stray bytes: libjpeg skips them too */
        while (i < n && b[i] == 0xff) i++;
        if (i >= n) return err_truncated(err, ZI_IMAGE_JPEG);
        uint8_t m = b[i++];
        if (m == 0xd8 || (m >= 0xd0 && m <= 0xd7) || m == 0x01) continue;
        if (m == 0xd9 || m == 0xda)
            return zi_error_set(err, ZI_EFORMAT, "JPEG: no frame header before %s",
                                m == 0xd9 ? "the end marker" : "the scan");
        if (i + 2 > n) return err_truncated(err, ZI_IMAGE_JPEG);
        uint32_t len = be16(b + i);
        if (len < 2) return zi_error_set(err, ZI_EFORMAT, "JPEG: marker segment of length %u", len);
        int sof = m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc;
        if (sof) {
            if (len < 8) return zi_error_set(err, ZI_EFORMAT, "JPEG: frame header too short");
            if (i + 7 > n) return err_truncated(err, ZI_IMAGE_JPEG);
            *h = be16(b + i + 3);
            *w = be16(b + i + 5);
            return ZI_OK;
        }
        i += len;
    }
}

static int probe_webp(const uint8_t *b, size_t n, uint32_t *w, uint32_t *h, zi_error *err) {
    int iw = 0, ih = 0;
    WebPBitstreamFeatures f;
    VP8StatusCode st = WebPGetFeatures(b, n, &f);
    if (st == VP8_STATUS_NOT_ENOUGH_DATA) return err_truncated(err, ZI_IMAGE_WEBP);
    if (st != VP8_STATUS_OK)
        return zi_error_set(err, ZI_EFORMAT, "WebP: malformed header (libwebp status %d)", (int)st);
    iw = f.width, ih = f.height;
    *w = (uint32_t)iw, *h = (uint32_t)ih;
    return ZI_OK;
}

int zi_image_probe(const uint8_t *b, size_t n, zi_image_format *fmt, uint32_t *w, uint32_t *h,
                   zi_error *err) {
    *fmt = zi_image_sniff(b, n);
    *w = *h = 0;
    switch (*fmt) {
    case ZI_IMAGE_JPEG:
        return probe_jpeg(b, n, w, h, err);
    case ZI_IMAGE_PNG:
        /* The signature, then IHDR: length, "IHDR", width, height. */
        if (n < 24) return err_truncated(err, ZI_IMAGE_PNG);
        if (memcmp(b + 12, "IHDR", 4) != 0)
            return zi_error_set(err, ZI_EFORMAT, "PNG: first chunk is not IHDR");
        *w = be32(b + 16), *h = be32(b + 20);
        return ZI_OK;
    case ZI_IMAGE_GIF:
        if (n < 10) return err_truncated(err, ZI_IMAGE_GIF);
        *w = le16(b + 6), *h = le16(b + 8);
        return ZI_OK;
    case ZI_IMAGE_WEBP:
        return probe_webp(b, n, w, h, err);
    default:
        break;
    }
    if (n == 0) return zi_error_set(err, ZI_EINVAL, "image is empty (0 bytes)");
    char hex[3 * 8 + 1] = "";
    size_t k = n < 8 ? n : 8;
    size_t at = 0;
    for (size_t i = 0; i < k; i++)
        at += (size_t)snprintf(hex + at, sizeof hex - at, i ? " %02x" : "%02x", b[i]);
    return zi_error_set(err, ZI_EINVAL, "not a JPEG/PNG/WebP/GIF image (magic %s%s)", hex,
                        n > 8 ? " ..." : "");
}

/* ---- JPEG ---------------------------------------------------------------- */

typedef struct jpeg_err {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    int truncated;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err;

static void jpeg_on_error(j_common_ptr c) {
    jpeg_err *e = (jpeg_err *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

/* libjpeg only warns at the end of the data (and pads with a fake end
 * marker, giving grey pixels); zinfer refuses the image instead. Other
 * warnings (extraneous bytes, corrupt entropy data it recovers from) are
 * what stb_image accepts too. */
static void jpeg_on_message(j_common_ptr c, int level) {
    jpeg_err *e = (jpeg_err *)c->err;
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) {
        e->truncated = 1;
        snprintf(e->msg, sizeof e->msg, "data ends early");
        longjmp(e->jb, 1);
    }
}

static void jpeg_on_progress(j_common_ptr c) {
    if (c->is_decompressor) {
        j_decompress_ptr d = (j_decompress_ptr)c;
        if (d->input_scan_number > ZI_JPEG_MAX_SCANS) {
            jpeg_err *e = (jpeg_err *)c->err;
            snprintf(e->msg, sizeof e->msg, "more than %d scans", ZI_JPEG_MAX_SCANS);
            longjmp(e->jb, 1);
        }
    }
}

/* stb_image's CMYK blend (its stbi__blinn_8x8): x * y / 255, rounded. */
static uint8_t blinn(unsigned x, unsigned y) {
    unsigned t = x * y + 128;
    return (uint8_t)((t + (t >> 8)) >> 8);
}

static int decode_jpeg(const uint8_t *b, size_t n, const zi_image_limits *lim, zi_image_rgb *out,
                       zi_error *err) {
    struct jpeg_decompress_struct ci;
    jpeg_err je;
    struct jpeg_progress_mgr prog = {.progress_monitor = jpeg_on_progress};
    uint8_t *volatile pix = NULL;
    uint8_t *volatile row4 = NULL;
    volatile int rc = ZI_OK;
    memset(&ci, 0, sizeof ci);
    memset(&je, 0, sizeof je);
    ci.err = jpeg_std_error(&je.pub);
    je.pub.error_exit = jpeg_on_error;
    je.pub.emit_message = jpeg_on_message;
    if (setjmp(je.jb)) {
        if (rc == ZI_OK)
            rc = je.truncated ? err_truncated(err, ZI_IMAGE_JPEG)
                              : zi_error_set(err, ZI_EFORMAT, "JPEG: %s", je.msg);
        goto done;
    }
    jpeg_create_decompress(&ci);
    ci.progress = &prog;
    jpeg_mem_src(&ci, (unsigned char *)b, (unsigned long)n);
    jpeg_read_header(&ci, TRUE);
    if ((rc = check_size(ci.image_width, ci.image_height, lim, err)) != ZI_OK) goto done;
    int cmyk = 0;
    switch (ci.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
        ci.out_color_space = JCS_RGB;
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        ci.out_color_space = JCS_CMYK;
        cmyk = 1;
        break;
    default:
        rc = zi_error_set(err, ZI_EUNSUPPORTED, "JPEG: colour space %d with %d components",
                          (int)ci.jpeg_color_space, ci.num_components);
        goto done;
    }
    jpeg_start_decompress(&ci);
    uint32_t w = ci.output_width, h = ci.output_height;
    if ((rc = check_size(w, h, lim, err)) != ZI_OK) goto done;
    if (ci.output_components != (cmyk ? 4 : 3)) {
        rc = zi_error_set(err, ZI_EFORMAT, "JPEG: %d output components", ci.output_components);
        goto done;
    }
    pix = malloc((size_t)w * h * 3);
    if (cmyk) row4 = malloc((size_t)w * 4);
    if (!pix || (cmyk && !row4)) {
        rc = zi_error_set(err, ZI_ENOMEM, "JPEG: no memory for %u x %u pixels", w, h);
        goto done;
    }
    while (ci.output_scanline < h) {
        uint8_t *dst = pix + (size_t)ci.output_scanline * w * 3;
        JSAMPROW row = cmyk ? row4 : dst;
        if (jpeg_read_scanlines(&ci, &row, 1) != 1) {
            rc = err_truncated(err, ZI_IMAGE_JPEG);
            goto done;
        }
        if (cmyk) /* Adobe writes CMYK inverted; libjpeg hands YCCK over as CMYK */
            for (uint32_t x = 0; x < w; x++) {
                const uint8_t *s = row4 + 4 * x;
                dst[3 * x + 0] = blinn(s[0], s[3]);
                dst[3 * x + 1] = blinn(s[1], s[3]);
                dst[3 * x + 2] = blinn(s[2], s[3]);
            }
    }
    jpeg_finish_decompress(&ci);
    out->width = w, out->height = h, out->pixels = pix;
    pix = NULL;
done:
    jpeg_destroy_decompress(&ci);
    free(pix);
    free(row4);
    return rc;
}

/* ---- PNG ----------------------------------------------------------------- */

typedef struct png_src {
    const uint8_t *b;
    size_t n, off;
    int truncated;
    char msg[160];
} png_src;

static void png_on_error(png_structp png, png_const_charp msg) {
    png_src *s = png_get_error_ptr(png);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png, (void)msg; /* libpng recovers; stb_image would not have looked */
}

static void png_on_read(png_structp png, png_bytep dst, size_t len) {
    png_src *s = png_get_io_ptr(png);
    if (len > s->n - s->off) {
        s->truncated = 1;
        png_error(png, "data ends early");
    }
    memcpy(dst, s->b + s->off, len);
    s->off += len;
}

static int decode_png(const uint8_t *b, size_t n, const zi_image_limits *lim, zi_image_rgb *out,
                      zi_error *err) {
    png_src src = {.b = b, .n = n};
    png_structp png =
        png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
    if (!png) return zi_error_set(err, ZI_ENOMEM, "PNG: no memory for the decoder");
    png_infop info = png_create_info_struct(png);
    uint8_t *volatile pix = NULL;
    png_bytep *volatile rows = NULL;
    volatile int rc = ZI_OK;
    if (!info) {
        rc = zi_error_set(err, ZI_ENOMEM, "PNG: no memory for the decoder");
        goto done;
    }
    if (setjmp(png_jmpbuf(png))) {
        if (rc == ZI_OK)
            rc = src.truncated ? err_truncated(err, ZI_IMAGE_PNG)
                               : zi_error_set(err, ZI_EFORMAT, "PNG: %s", src.msg);
        goto done;
    }
    png_set_read_fn(png, &src, png_on_read);
    png_read_info(png, info);
    png_uint_32 w, h;
    int depth, ctype, interlace;
    png_get_IHDR(png, info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
    if ((rc = check_size(w, h, lim, err)) != ZI_OK) goto done;
    /* stb_image's 3-channel load: palettes expanded, tRNS ignored (its alpha
     * would be dropped anyway), 16 bits to the high byte, alpha dropped,
     * grey replicated. */
    if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png);
    if (ctype & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
    if (ctype == PNG_COLOR_TYPE_GRAY || ctype == PNG_COLOR_TYPE_GRAY_ALPHA)
        png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_channels(png, info) != 3 || png_get_bit_depth(png, info) != 8 ||
        png_get_rowbytes(png, info) != (size_t)w * 3) {
        rc = zi_error_set(err, ZI_EFORMAT, "PNG: colour type %d depth %d did not become 8-bit RGB",
                          ctype, depth);
        goto done;
    }
    pix = malloc((size_t)w * h * 3);
    rows = malloc(sizeof(png_bytep) * h);
    if (!pix || !rows) {
        rc = zi_error_set(err, ZI_ENOMEM, "PNG: no memory for %u x %u pixels", (unsigned)w,
                          (unsigned)h);
        goto done;
    }
    for (png_uint_32 y = 0; y < h; y++) rows[y] = pix + (size_t)y * w * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL); /* a file cut after its pixels is still cut */
    out->width = w, out->height = h, out->pixels = pix;
    pix = NULL;
done:
    png_destroy_read_struct(&png, info ? &info : NULL, NULL);
    free(pix);
    free(rows);
    return rc;
}

/* ---- WebP ---------------------------------------------------------------- */

static int decode_webp(const uint8_t *b, size_t n, const zi_image_limits *lim, zi_image_rgb *out,
                       zi_error *err) {
    WebPBitstreamFeatures f;
    VP8StatusCode st = WebPGetFeatures(b, n, &f);
    if (st == VP8_STATUS_NOT_ENOUGH_DATA) return err_truncated(err, ZI_IMAGE_WEBP);
    if (st != VP8_STATUS_OK)
        return zi_error_set(err, ZI_EFORMAT, "WebP: malformed header (libwebp status %d)", (int)st);
    if (f.has_animation)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "WebP: animated images are not supported (send one frame as a still)");
    int rc = check_size((uint64_t)f.width, (uint64_t)f.height, lim, err);
    if (rc != ZI_OK) return rc;
    size_t size = (size_t)f.width * f.height * 3;
    uint8_t *pix = malloc(size);
    if (!pix)
        return zi_error_set(err, ZI_ENOMEM, "WebP: no memory for %d x %d pixels", f.width,
                            f.height);
    WebPDecoderConfig cfg;
    if (!WebPInitDecoderConfig(&cfg)) {
        free(pix);
        return zi_error_set(err, ZI_EUNSUPPORTED, "WebP: libwebp version mismatch");
    }
    cfg.output.colorspace = MODE_RGB; /* alpha dropped, not premultiplied */
    cfg.output.is_external_memory = 1;
    cfg.output.u.RGBA.rgba = pix;
    cfg.output.u.RGBA.stride = f.width * 3;
    cfg.output.u.RGBA.size = size;
    st = WebPDecode(b, n, &cfg);
    WebPFreeDecBuffer(&cfg.output);
    if (st != VP8_STATUS_OK) {
        free(pix);
        if (st == VP8_STATUS_NOT_ENOUGH_DATA) return err_truncated(err, ZI_IMAGE_WEBP);
        return zi_error_set(err, ZI_EFORMAT, "WebP: corrupt data (libwebp status %d)", (int)st);
    }
    out->width = (uint32_t)f.width, out->height = (uint32_t)f.height, out->pixels = pix;
    return ZI_OK;
}

/* ---- GIF ----------------------------------------------------------------- */

typedef struct gif_src {
    const uint8_t *b;
    size_t n, off;
    int truncated;
} gif_src;

static int gif_on_read(GifFileType *g, GifByteType *dst, int len) {
    gif_src *s = g->UserData;
    size_t want = len < 0 ? 0 : (size_t)len;
    if (want > s->n - s->off) {
        s->truncated = 1;
        want = s->n - s->off;
    }
    memcpy(dst, s->b + s->off, want);
    s->off += want;
    return (int)want;
}

static int gif_fail(GifFileType *g, const gif_src *s, zi_error *err) {
    if (s->truncated) return err_truncated(err, ZI_IMAGE_GIF);
    const char *m = GifErrorString(g ? g->Error : D_GIF_ERR_READ_FAILED);
    return zi_error_set(err, ZI_EFORMAT, "GIF: %s", m ? m : "decoding failed");
}

/* stb_image's first frame: pixels outside the frame's rectangle take the
 * screen's background colour when its index is above 0 (stb skips index
 * 0) and inside the global table; otherwise they stay black. */
static void gif_background(const GifFileType *g, uint8_t *canvas, const GifImageDesc *d) {
    int bg = g->SBackGroundColor;
    const ColorMapObject *cm = g->SColorMap;
    if (bg <= 0 || !cm || !cm->Colors || bg >= cm->ColorCount) return;
    const GifColorType c = cm->Colors[bg];
    int64_t x0 = d->Left, y0 = d->Top, x1 = x0, y1 = y0;
    if (d->Width > 0 && d->Height > 0) x1 = x0 + d->Width, y1 = y0 + d->Height;
    for (int64_t y = 0; y < g->SHeight; y++)
        for (int64_t x = 0; x < g->SWidth; x++) {
            if (x >= x0 && x < x1 && y >= y0 && y < y1) continue;
            uint8_t *px = canvas + ((size_t)y * (size_t)g->SWidth + (size_t)x) * 3;
            px[0] = c.Red, px[1] = c.Green, px[2] = c.Blue;
        }
}

/* Draws the first image record onto the zeroed canvas (stb_image's first
 * frame: the transparent index, and indices past the colour table, stay
 * black; see gif_background for the rest). */
static int gif_first_frame(GifFileType *g, gif_src *s, uint8_t *canvas, const zi_image_limits *lim,
                           zi_error *err) {
    int transparent = -1;
    for (;;) {
        GifRecordType rt;
        if (DGifGetRecordType(g, &rt) == GIF_ERROR) return gif_fail(g, s, err);
        if (rt == TERMINATE_RECORD_TYPE)
            return zi_error_set(err, ZI_EFORMAT, "GIF: no image in the file");
        if (rt == EXTENSION_RECORD_TYPE) {
            int code;
            GifByteType *ext = NULL;
            if (DGifGetExtension(g, &code, &ext) == GIF_ERROR) return gif_fail(g, s, err);
            if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4) {
                GraphicsControlBlock gcb;
                if (DGifExtensionToGCB(ext[0], ext + 1, &gcb) == GIF_OK)
                    transparent = gcb.TransparentColor;
            }
            while (ext)
                if (DGifGetExtensionNext(g, &ext) == GIF_ERROR) return gif_fail(g, s, err);
            continue;
        }
        if (rt != IMAGE_DESC_RECORD_TYPE) return zi_error_set(err, ZI_EFORMAT, "GIF: bad record");
        if (DGifGetImageDesc(g) == GIF_ERROR) return gif_fail(g, s, err);
        break;
    }
    const GifImageDesc *d = &g->Image;
    gif_background(g, canvas, d);
    if (d->Width <= 0 || d->Height <= 0) return ZI_OK; /* draws nothing */
    int rc = check_size((uint64_t)d->Width, (uint64_t)d->Height, lim, err);
    if (rc != ZI_OK) return zi_error_prefix(err, "GIF frame");
    const ColorMapObject *cm = d->ColorMap ? d->ColorMap : g->SColorMap;
    if (!cm || !cm->Colors) return zi_error_set(err, ZI_EFORMAT, "GIF: frame has no colour table");
    GifPixelType *line = malloc((size_t)d->Width);
    if (!line) return zi_error_set(err, ZI_ENOMEM, "GIF: no memory for a %d-pixel line", d->Width);
    /* Interlaced frames arrive in four passes of rows. */
    static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
    int passes = d->Interlace ? 4 : 1;
    uint32_t sw = (uint32_t)g->SWidth, sh = (uint32_t)g->SHeight;
    for (int p = 0; p < passes; p++) {
        int y0 = d->Interlace ? start[p] : 0, dy = d->Interlace ? step[p] : 1;
        for (int y = y0; y < d->Height; y += dy) {
            if (DGifGetLine(g, line, d->Width) == GIF_ERROR) {
                free(line);
                return gif_fail(g, s, err);
            }
            int64_t cy = (int64_t)d->Top + y;
            if (cy < 0 || cy >= (int64_t)sh) continue;
            for (int x = 0; x < d->Width; x++) {
                int64_t cx = (int64_t)d->Left + x;
                int ix = line[x];
                if (cx < 0 || cx >= (int64_t)sw || ix == transparent || ix >= cm->ColorCount)
                    continue;
                uint8_t *px = canvas + ((size_t)cy * sw + (size_t)cx) * 3;
                px[0] = cm->Colors[ix].Red, px[1] = cm->Colors[ix].Green,
                px[2] = cm->Colors[ix].Blue;
            }
        }
    }
    free(line);
    return ZI_OK;
}

static int decode_gif(const uint8_t *b, size_t n, const zi_image_limits *lim, zi_image_rgb *out,
                      zi_error *err) {
    gif_src src = {.b = b, .n = n};
    int gerr = 0;
    GifFileType *g = DGifOpen(&src, gif_on_read, &gerr);
    if (!g) {
        if (src.truncated) return err_truncated(err, ZI_IMAGE_GIF);
        const char *m = GifErrorString(gerr);
        return zi_error_set(err, ZI_EFORMAT, "GIF: %s", m ? m : "bad header");
    }
    int rc = check_size((uint64_t)(g->SWidth < 0 ? 0 : g->SWidth),
                        (uint64_t)(g->SHeight < 0 ? 0 : g->SHeight), lim, err);
    uint8_t *canvas = NULL;
    if (rc == ZI_OK) {
        canvas = calloc((size_t)g->SWidth * (size_t)g->SHeight, 3);
        if (!canvas)
            rc = zi_error_set(err, ZI_ENOMEM, "GIF: no memory for %d x %d pixels", g->SWidth,
                              g->SHeight);
    }
    if (rc == ZI_OK) rc = gif_first_frame(g, &src, canvas, lim, err);
    if (rc == ZI_OK) {
        out->width = (uint32_t)g->SWidth, out->height = (uint32_t)g->SHeight;
        out->pixels = canvas;
        canvas = NULL;
    }
    free(canvas);
    DGifCloseFile(g, &gerr);
    return rc;
}

/* ---- entry points -------------------------------------------------------- */

int zi_image_decode(const uint8_t *bytes, size_t n, const zi_image_limits *lim, zi_image_rgb *out,
                    zi_error *err) {
    assert(out);
    zi_image_limits dflt;
    if (!lim) {
        zi_image_limits_default(&dflt);
        lim = &dflt;
    }
    memset(out, 0, sizeof *out);
    if (!bytes || n == 0) return zi_error_set(err, ZI_EINVAL, "image is empty (0 bytes)");
    if (n > lim->max_bytes)
        return zi_error_set(err, ZI_ERANGE, "image of %zu bytes is over the limit of %zu bytes", n,
                            lim->max_bytes);
    zi_image_format fmt;
    uint32_t w, h;
    int rc = zi_image_probe(bytes, n, &fmt, &w, &h, err);
    if (rc != ZI_OK) return rc;
    /* The cheap header read first: a 20000 x 20000 header is refused here,
     * before any library sets up a decoder. */
    if ((rc = check_size(w, h, lim, err)) != ZI_OK) return rc;
    switch (fmt) {
    case ZI_IMAGE_JPEG:
        rc = decode_jpeg(bytes, n, lim, out, err);
        break;
    case ZI_IMAGE_PNG:
        rc = decode_png(bytes, n, lim, out, err);
        break;
    case ZI_IMAGE_WEBP:
        rc = decode_webp(bytes, n, lim, out, err);
        break;
    case ZI_IMAGE_GIF:
        rc = decode_gif(bytes, n, lim, out, err);
        break;
    default:
        return zi_error_set(err, ZI_EINVAL, "unknown image format");
    }
    if (rc != ZI_OK) {
        free(out->pixels);
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->format = fmt;
    return ZI_OK;
}

void zi_image_rgb_free(zi_image_rgb *img) {
    if (!img) return;
    free(img->pixels);
    memset(img, 0, sizeof *img);
}
