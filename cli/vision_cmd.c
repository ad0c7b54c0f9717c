/*
 * vision_cmd.c - `zinfer encode-image`: runs a projector file's image tower
 * (model_worker/vision.h) on one tile of pixel values and writes its soft
 * tokens, so that the tower can be checked against a reference by itself.
 *
 * The pixels are a raw float32 file of image_size x image_size x 3 values
 * (interleaved RGB, row-major, already normalized as the projector's
 * preprocessing makes them); the output is n_tokens x lm_dim float32.
 */
#include "vision_cmd.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "backend_select.h"
#include "image.h"
#include "image_prompt.h"
#include "read_all.h"
#include "vision.h"
#include "zi_error.h"

static const char *USAGE =
    "usage: zinfer encode-image --mmproj FILE (--image IMG | --pixels FILE) --out FILE\n"
    "                           [--threads N] [--device cpu|cuda|cuda:N]\n"
    "  Runs the projector file's image tower. --image: an image file (JPEG, PNG, WebP,\n"
    "  GIF), decoded and prepared as llama.cpp does for the projector, every tile\n"
    "  encoded; --pixels: one tile of raw float32, image_size x image_size x 3 values\n"
    "  (interleaved RGB, row-major, normalized with the file's mean and std). Writes\n"
    "  the soft tokens (n_tokens x lm_dim float32, tiles in order) to --out and prints\n"
    "  one JSON line: n_tokens, n_tiles, lm_dim, image_size, encode_ms. --device: the\n"
    "  backend the tower runs on (default cpu).\n";

static int usage_fail(const char *msg) {
    fprintf(stderr, "zinfer encode-image: %s\n%s", msg, USAGE);
    return 2;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* The whole file at path, which must be exactly `want` bytes. */
static int read_exact(const char *path, size_t want, void *buf, zi_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return zi_error_set(err, ZI_EIO, "cannot open %s: %s", path, strerror(errno));
    size_t got = fread(buf, 1, want, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != want || extra)
        return zi_error_set(err, ZI_EINVAL, "%s is not %zu bytes (image_size^2 x 3 float32)", path,
                            want);
    return ZI_OK;
}

static int read_file(const char *path, uint8_t **buf, size_t *n, size_t max, zi_error *err);

/* An image file's tiles as the tower takes them (*px malloc'd). */
static int image_tiles(const zi_vision_config *c, const char *path, float **px, int *n_tiles,
                       zi_error *err) {
    zi_image_limits lim;
    zi_image_limits_default(&lim);
    uint8_t *bytes = NULL;
    size_t n = 0;
    zi_image_rgb img = {0};
    zi_image_tiles t = {0};
    zi_image_prep_params pp;
    zi_image_prompt_params(c, &pp);
    int rc = read_file(path, &bytes, &n, lim.max_bytes, err);
    if (!rc) rc = zi_image_decode(bytes, n, &lim, &img, err);
    if (!rc) rc = zi_image_prep(&img, &pp, &t, err);
    if (!rc && (t.tile_size != c->image_size || t.tokens_per_tile != c->n_tokens))
        rc = zi_error_set(err, ZI_EINVAL, "tiles of %d px / %d tokens, the tower takes %d / %d",
                          t.tile_size, t.tokens_per_tile, c->image_size, c->n_tokens);
    if (rc) zi_error_prefix(err, "%s", path);
    if (!rc) *px = t.data, *n_tiles = t.n_tiles, t.data = NULL;
    free(bytes);
    zi_image_rgb_free(&img);
    zi_image_tiles_free(&t);
    return rc;
}

int zi_encode_image_main(int argc, char **argv) {
    const char *mmproj = NULL, *pixels = NULL, *image = NULL, *out = NULL, *device = NULL;
    long long threads = 0;
    zi_error err = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (!v) {
            char msg[256];
            snprintf(msg, sizeof msg, "unknown option or missing value: '%.200s'", a);
            return usage_fail(msg);
        }
        if (!strcmp(a, "--mmproj"))
            mmproj = v;
        else if (!strcmp(a, "--pixels"))
            pixels = v;
        else if (!strcmp(a, "--image"))
            image = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--threads")) {
            if (zi_parse_int(a, v, 1, 1024, &threads, &err)) return usage_fail(err.msg);
        } else {
            char msg[256];
            snprintf(msg, sizeof msg, "unknown option '%.200s'", a);
            return usage_fail(msg);
        }
        i++;
    }
    if (!mmproj || !out || !pixels == !image)
        return usage_fail("--mmproj, --out and one of --image and --pixels are required");
    zi_backend *be = NULL;
    zi_vision *v = NULL;
    float *px = NULL, *emb = NULL;
    int rc = zi_backend_create_for_device(device, (int)threads, 0, &be, &err);
    if (!rc) rc = zi_vision_load(mmproj, be, 0, &v, &err);
    const zi_vision_config *c = rc ? NULL : zi_vision_get_config(v);
    int n_tiles = 1;
    if (!rc && image) {
        rc = image_tiles(c, image, &px, &n_tiles, &err);
    } else if (!rc) {
        const size_t n_px = (size_t)c->image_size * c->image_size * 3;
        px = malloc(n_px * sizeof(float));
        rc = !px ? zi_error_set(&err, ZI_ENOMEM, "out of memory")
                 : read_exact(pixels, n_px * sizeof(float), px, &err);
    }
    if (!rc && !(emb = malloc((size_t)n_tiles * c->n_tokens * c->lm_dim * sizeof(float))))
        rc = zi_error_set(&err, ZI_ENOMEM, "out of memory");
    double ms = 0;
    for (int t = 0; !rc && t < n_tiles; t++) {
        double t0 = now_ms();
        rc = zi_vision_encode(v, px + (size_t)t * c->image_size * c->image_size * 3,
                              emb + (size_t)t * c->n_tokens * c->lm_dim, &err);
        ms += now_ms() - t0;
    }
    if (!rc) {
        FILE *f = fopen(out, "wb");
        size_t n = (size_t)n_tiles * c->n_tokens * c->lm_dim;
        if (!f || fwrite(emb, sizeof(float), n, f) != n || fclose(f) != 0)
            rc = zi_error_set(&err, ZI_EIO, "cannot write %s: %s", out, strerror(errno));
    }
    if (!rc) {
        json_t *j = json_pack("{s:i, s:i, s:i, s:i, s:f}", "n_tokens", n_tiles * c->n_tokens,
                              "n_tiles", n_tiles, "lm_dim", c->lm_dim, "image_size",
                              c->image_size, "encode_ms", ms);
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        if (s) printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        fprintf(stderr, "zinfer encode-image: %s\n", err.msg);
    }
    free(px);
    free(emb);
    zi_vision_free(v);
    if (be) zi_backend_free(be);
    return rc ? 1 : 0;
}

/* ---- prompts with images (zinfer logits, generate) ---- */

static int read_file(const char *path, uint8_t **buf, size_t *n, size_t max, zi_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return zi_error_set(err, ZI_EIO, "cannot open %s: %s", path, strerror(errno));
    int rc = zi_read_all(f, max, (char **)buf, n);
    fclose(f);
    if (rc == ZI_ERANGE) return zi_error_set(err, rc, "%s is over %zu bytes", path, max);
    if (rc == ZI_EIO) return zi_error_set(err, rc, "cannot read %s", path);
    return rc ? zi_error_set(err, rc, "out of memory") : ZI_OK;
}

int zi_cli_images_build(zi_backend *be, zi_tokenizer *tok, int lm_dim, const char *mmproj,
                        const char *prompt, int parse_special, const char *const *paths,
                        int n_paths, zi_cli_images *out, zi_error *err) {
    memset(out, 0, sizeof *out);
    zi_vision *v = NULL;
    zi_image_rgb *imgs = calloc((size_t)(n_paths > 0 ? n_paths : 1), sizeof *imgs);
    zi_prompt_image *pis = NULL;
    int rc = imgs ? zi_vision_load(mmproj, be, lm_dim, &v, err)
                  : zi_error_set(err, ZI_ENOMEM, "out of memory");
    zi_image_limits lim;
    zi_image_limits_default(&lim);
    for (int i = 0; !rc && i < n_paths; i++) {
        uint8_t *bytes = NULL;
        size_t n = 0;
        rc = read_file(paths[i], &bytes, &n, lim.max_bytes, err);
        if (!rc) rc = zi_image_decode(bytes, n, &lim, &imgs[i], err);
        if (rc) zi_error_prefix(err, "%s", paths[i]);
        free(bytes);
    }
    const zi_vision_config *c = rc ? NULL : zi_vision_get_config(v);
    zi_image_prep_params pp;
    if (!rc) {
        zi_image_prompt_params(c, &pp);
        rc = zi_image_prompt_build(tok, prompt, strlen(prompt), 1, parse_special, imgs,
                                   (size_t)n_paths, &pp, &out->ids, &out->n, &pis, err);
    }
    if (!rc) {
        out->n_images = n_paths;
        for (int i = 0; i < n_paths; i++) out->n_tiles += pis[i].n_tiles;
        out->embd = malloc((size_t)out->n_tiles * c->n_tokens * (size_t)lm_dim * sizeof(float));
        out->embd_rows = malloc(out->n * sizeof(int32_t));
        out->attn_pos = malloc(out->n * sizeof(int32_t));
        if (!out->embd || !out->embd_rows || !out->attn_pos)
            rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    }
    for (size_t i = 0; !rc && i < out->n; i++) out->embd_rows[i] = -1, out->attn_pos[i] = (int32_t)i;
    int row = 0;
    for (int i = 0; !rc && i < n_paths; i++) {
        const zi_prompt_image *pi = &pis[i];
        if (pi->tile_tokens != c->n_tokens || pi->tile_size != c->image_size) {
            rc = zi_error_set(err, ZI_EINVAL, "image %d: tiles of %d px / %d tokens, the tower takes %d / %d",
                              i, pi->tile_size, pi->tile_tokens, c->image_size, c->n_tokens);
            break;
        }
        for (int t = 0; !rc && t < pi->n_tiles; t++, row++) {
            const size_t px = (size_t)t * c->image_size * c->image_size * 3;
            double t0 = now_ms();
            rc = zi_vision_encode(v, pi->pixels + px,
                                  out->embd + (size_t)row * c->n_tokens * lm_dim, err);
            out->encode_ms += now_ms() - t0;
            for (int k = 0; !rc && k < c->n_tokens; k++) {
                const size_t at = (size_t)pi->tile_first[t] + (size_t)k;
                out->embd_rows[at] = row * c->n_tokens + k;
                if (zi_image_prompt_non_causal(c)) /* each sees its whole tile */
                    out->attn_pos[at] = (int32_t)(pi->tile_first[t] + c->n_tokens - 1);
            }
        }
    }
    zi_prompt_images_free(pis, (size_t)n_paths);
    for (int i = 0; imgs && i < n_paths; i++) zi_image_rgb_free(&imgs[i]);
    free(imgs);
    zi_vision_free(v);
    if (rc) zi_cli_images_free(out);
    return rc;
}

void zi_cli_images_free(zi_cli_images *ci) {
    free(ci->ids);
    free(ci->embd);
    free(ci->embd_rows);
    free(ci->attn_pos);
    memset(ci, 0, sizeof *ci);
}

size_t zi_cli_images_chunk_end(const zi_cli_images *ci, size_t start, size_t want) {
    size_t end = start + want < ci->n ? start + want : ci->n;
    if (end == ci->n || ci->attn_pos[end - 1] < (int32_t)end) return end; /* nothing split */
    /* end splits the tile holding end - 1: cut before it, or take it whole */
    const int32_t last = ci->attn_pos[end - 1];
    size_t first = end - 1;
    while (first > start && ci->attn_pos[first - 1] == last) first--;
    return first > start ? first : (size_t)last + 1;
}
