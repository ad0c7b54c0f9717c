/*
 * speech_cmd.c - `zinfer decode-speech` (see speech_cmd.h): codes in, a
 * mono WAV file (16-bit PCM or float32) out, and optionally the decoder's
 * spectrogram output as raw float32.
 */
#include "speech_cmd.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "backend_select.h"
#include "read_all.h"
#include "wav.h"
#include "wavtokenizer.h"
#include "zi_error.h"

static const char *USAGE =
    "usage: zinfer decode-speech --model FILE (--codes C1,C2,... | --codes-file FILE)\n"
    "                            --out FILE.wav [--format s16|f32] [--spec FILE]\n"
    "                            [--threads N] [--device cpu]\n"
    "  Runs a speech codec decoder (GGUF architecture wavtokenizer-dec, OuteTTS's\n"
    "  WavTokenizer) on a sequence of codec codes, all decoded at once, and writes\n"
    "  the waveform as a mono WAV file at the decoder's rate (24000 Hz): 16-bit PCM\n"
    "  (--format s16, the default) or float32 (f32). --spec: also write the\n"
    "  decoder's output before the inverse STFT (n_codes x (n_fft + 2) float32: the\n"
    "  log-magnitudes, then the phases, per code). Prints one JSON line: n_codes,\n"
    "  n_samples, sample_rate, n_fft, hop, format, decode_ms. The decoder runs on\n"
    "  the cpu backend (other backends lack its convolution ops). --codes-file: the\n"
    "  codes as text separated by commas and/or white space, '-' for stdin (what\n"
    "  zinfer generate --tts prints).\n";

static int usage_fail(const char *msg) {
    fprintf(stderr, "zinfer decode-speech: %s\n%s", msg, USAGE);
    return 2;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* The samples as a WAV file at path. */
static int write_wav(const char *path, const float *audio, size_t n, int rate, int f32,
                     zi_error *err) {
    uint8_t hdr[ZI_WAV_HEADER_MAX];
    size_t hl = n <= UINT32_MAX ? zi_wav_header(hdr, (uint32_t)n, (uint32_t)rate, f32) : 0;
    if (!hl) return zi_error_set(err, ZI_ERANGE, "%zu samples do not fit a WAV file", n);
    FILE *f = fopen(path, "wb");
    if (!f) return zi_error_set(err, ZI_EIO, "cannot write %s: %s", path, strerror(errno));
    int ok = fwrite(hdr, 1, hl, f) == hl;
    if (f32) {
        for (size_t i = 0; ok && i < n; i++) { /* little-endian, as the format is */
            uint32_t u;
            memcpy(&u, &audio[i], 4);
            uint8_t b[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
            ok = fwrite(b, 1, 4, f) == 4;
        }
    } else {
        for (size_t i = 0; ok && i < n; i++) {
            const uint16_t u = (uint16_t)zi_wav_s16(audio[i]);
            uint8_t b[2] = {(uint8_t)u, (uint8_t)(u >> 8)};
            ok = fwrite(b, 1, 2, f) == 2;
        }
    }
    if (fclose(f) != 0) ok = 0;
    return ok ? ZI_OK : zi_error_set(err, ZI_EIO, "cannot write %s: %s", path, strerror(errno));
}

/* The codes of a text file (or stdin for "-"): decimal integers separated
 * by commas and / or white space, at most 16 MiB of text. */
static int read_codes_file(const char *path, int32_t **codes, size_t *n, zi_error *err) {
    enum { MAX_BYTES = 16 << 20 };
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (f == stdin) path = "stdin";
    if (!f) return zi_error_set(err, ZI_EIO, "cannot open %s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0;
    int rd = zi_read_all(f, MAX_BYTES, &text, &len);
    if (f != stdin) fclose(f);
    if (rd == ZI_ERANGE) return zi_error_set(err, rd, "%s is over 16 MiB", path);
    if (rd == ZI_EIO) return zi_error_set(err, rd, "cannot read %s", path);
    if (rd) return zi_error_set(err, rd, "out of memory");
    size_t cap = 256, cnt = 0;
    int32_t *v = malloc(cap * sizeof *v);
    int rc = v ? ZI_OK : zi_error_set(err, ZI_ENOMEM, "out of memory");
    for (const char *p = text; !rc;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        const long long x = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : -1;
        if (x < 0 || errno || x > INT32_MAX - 1 ||
            (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r')) {
            rc = zi_error_set(err, ZI_EINVAL, "%s: item %zu is not a code (a non-negative integer)",
                              path, cnt);
            break;
        }
        if (cnt == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) {
                rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
                break;
            }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
        p = end;
    }
    free(text);
    if (rc) {
        free(v);
        return rc;
    }
    *codes = v, *n = cnt;
    return ZI_OK;
}

int zi_decode_speech_main(int argc, char **argv) {
    const char *model = NULL, *codes_s = NULL, *codes_file = NULL, *out = NULL, *spec_path = NULL,
               *device = NULL, *format = "s16";
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
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--codes"))
            codes_s = v;
        else if (!strcmp(a, "--codes-file"))
            codes_file = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--spec"))
            spec_path = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--format"))
            format = v;
        else if (!strcmp(a, "--threads")) {
            if (zi_parse_int(a, v, 1, 1024, &threads, &err)) return usage_fail(err.msg);
        } else {
            char msg[256];
            snprintf(msg, sizeof msg, "unknown option '%.200s'", a);
            return usage_fail(msg);
        }
        i++;
    }
    if (!model || !out || !codes_s == !codes_file)
        return usage_fail("--model, --out and one of --codes and --codes-file are required");
    if (strcmp(format, "s16") && strcmp(format, "f32"))
        return usage_fail("--format: expected s16 or f32");
    const int f32 = !strcmp(format, "f32");
    int32_t *codes = NULL;
    size_t n = 0;
    if (codes_s && zi_parse_id_list("--codes", codes_s, INT32_MAX - 1, &codes, &n, &err))
        return usage_fail(err.msg);
    if (codes_file && read_codes_file(codes_file, &codes, &n, &err)) {
        fprintf(stderr, "zinfer decode-speech: %s\n", err.msg);
        return 1;
    }
    if (n == 0 || n > INT32_MAX) {
        free(codes);
        return usage_fail(codes_s ? "--codes: expected at least one code"
                                  : "--codes-file: expected at least one code");
    }
    zi_backend *be = NULL;
    zi_wavtok *w = NULL;
    float *spec = NULL, *audio = NULL;
    int rc = zi_backend_create_for_device(device, (int)threads, 0, &be, &err);
    if (!rc) rc = zi_wavtok_load(model, be, &w, &err);
    const zi_wavtok_config *c = rc ? NULL : zi_wavtok_get_config(w);
    if (!rc && (!(audio = malloc(n * (size_t)c->hop * sizeof(float))) ||
                (spec_path && !(spec = malloc(n * (size_t)c->n_out * sizeof(float))))))
        rc = zi_error_set(&err, ZI_ENOMEM, "out of memory for %zu codes", n);
    double ms = 0;
    if (!rc) {
        double t0 = now_ms();
        rc = zi_wavtok_decode(w, codes, (int)n, spec, audio, &err);
        ms = now_ms() - t0;
    }
    if (!rc) rc = write_wav(out, audio, n * (size_t)c->hop, c->sample_rate, f32, &err);
    if (!rc && spec_path) {
        FILE *f = fopen(spec_path, "wb");
        const size_t m = n * (size_t)c->n_out;
        int bad = !f || fwrite(spec, sizeof(float), m, f) != m;
        if (f && fclose(f) != 0) bad = 1; /* closed on every path */
        if (bad) rc = zi_error_set(&err, ZI_EIO, "cannot write %s: %s", spec_path, strerror(errno));
    }
    if (!rc) {
        json_t *j =
            json_pack("{s:I, s:I, s:i, s:i, s:i, s:s, s:f}", "n_codes", (json_int_t)n, "n_samples",
                      (json_int_t)(n * (size_t)c->hop), "sample_rate", c->sample_rate, "n_fft",
                      c->n_fft, "hop", c->hop, "format", format, "decode_ms", ms);
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
        if (s) printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        fprintf(stderr, "zinfer decode-speech: %s\n", err.msg);
    }
    free(codes);
    free(spec);
    free(audio);
    zi_wavtok_free(w);
    if (be) zi_backend_free(be);
    return rc ? 1 : 0;
}
