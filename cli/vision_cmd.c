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
#include "cpu_backend.h"
#include "vision.h"
#include "zi_error.h"

static const char *USAGE =
    "usage: zinfer encode-image --mmproj FILE --pixels FILE --out FILE [--threads N]\n"
    "  Runs the projector file's image tower on one tile: --pixels is raw float32,\n"
    "  image_size x image_size x 3 values (interleaved RGB, row-major, normalized\n"
    "  with the file's mean and std); writes n_tokens x lm_dim float32 to --out and\n"
    "  prints one JSON line: n_tokens, lm_dim, image_size, encode_ms.\n";

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

int zi_encode_image_main(int argc, char **argv) {
    const char *mmproj = NULL, *pixels = NULL, *out = NULL;
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
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--threads")) {
            if (zi_parse_int(a, v, 1, 1024, &threads, &err)) return usage_fail(err.msg);
        } else {
            char msg[256];
            snprintf(msg, sizeof msg, "unknown option '%.200s'", a);
            return usage_fail(msg);
        }
        i++;
    }
    if (!mmproj || !pixels || !out) return usage_fail("--mmproj, --pixels and --out are required");
    zi_backend *be = NULL;
    zi_vision *v = NULL;
    float *px = NULL, *emb = NULL;
    zi_cpu_options co = {.n_threads = (int)threads};
    int rc = zi_cpu_backend_create(&co, &be, &err);
    if (!rc) rc = zi_vision_load(mmproj, be, 0, &v, &err);
    const zi_vision_config *c = rc ? NULL : zi_vision_get_config(v);
    if (!rc) {
        const size_t n_px = (size_t)c->image_size * c->image_size * 3;
        px = malloc(n_px * sizeof(float));
        emb = malloc((size_t)c->n_tokens * c->lm_dim * sizeof(float));
        rc = !px || !emb ? zi_error_set(&err, ZI_ENOMEM, "out of memory")
                         : read_exact(pixels, n_px * sizeof(float), px, &err);
    }
    double ms = 0;
    if (!rc) {
        double t0 = now_ms();
        rc = zi_vision_encode(v, px, emb, &err);
        ms = now_ms() - t0;
    }
    if (!rc) {
        FILE *f = fopen(out, "wb");
        size_t n = (size_t)c->n_tokens * c->lm_dim;
        if (!f || fwrite(emb, sizeof(float), n, f) != n || fclose(f) != 0)
            rc = zi_error_set(&err, ZI_EIO, "cannot write %s: %s", out, strerror(errno));
    }
    if (!rc) {
        json_t *j = json_pack("{s:i, s:i, s:i, s:f}", "n_tokens", c->n_tokens, "lm_dim", c->lm_dim,
                              "image_size", c->image_size, "encode_ms", ms);
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
