/*
 * tts_stream.c - block decoding of a speech request's codes (tts_stream.h).
 */
#include "tts_stream.h"

#include <stdlib.h>
#include <string.h>

int zi_tts_stream_init(zi_tts_stream *s, int block, int context, zi_error *err) {
    memset(s, 0, sizeof *s);
    if (block < 1 || context < 0)
        return zi_error_set(err, ZI_EINVAL, "tts stream: block %d / context %d out of range", block,
                            context);
    s->block = block, s->context = context;
    return ZI_OK;
}

void zi_tts_stream_free(zi_tts_stream *s) {
    if (!s) return;
    free(s->codes);
    memset(s, 0, sizeof *s);
}

int zi_tts_stream_push(zi_tts_stream *s, const int32_t *codes, size_t n, zi_error *err) {
    if (s->n_codes + n > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->n_codes + n) cap *= 2;
        int32_t *p = realloc(s->codes, cap * sizeof *p);
        if (!p) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        s->codes = p, s->cap = cap;
    }
    if (n) memcpy(s->codes + s->n_codes, codes, n * sizeof *codes);
    s->n_codes += n;
    return ZI_OK;
}

int zi_tts_stream_take(zi_tts_stream *s, zi_wavtok *w, int final, int emit, float **audio,
                       size_t *n_audio, size_t *cap_audio, zi_error *err) {
    const size_t B = (size_t)s->block, C = (size_t)s->context, N = s->n_codes;
    const int hop = w ? zi_wavtok_get_config(w)->hop : 0;
    float *win = NULL;
    int rc = ZI_OK;
    while (s->decoded_index < N) {
        size_t b0 = s->decoded_index, b1 = b0 + B;
        if (!final && b1 + C > N) break; /* its window's right edge is not known yet */
        if (b1 > N) b1 = N;
        size_t w0 = b0 > C ? b0 - C : 0, w1 = b1 + C < N ? b1 + C : N;
        if (emit) {
            if (!w) {
                rc = zi_error_set(err, ZI_EINVAL, "tts stream: no decoder");
                break;
            }
            size_t need = *n_audio + (b1 - b0) * (size_t)hop;
            if (need > *cap_audio) {
                size_t cap = *cap_audio ? *cap_audio : 4096;
                while (cap < need) cap *= 2;
                float *p = realloc(*audio, cap * sizeof *p);
                if (!p) {
                    rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
                    break;
                }
                *audio = p, *cap_audio = cap;
            }
            free(win);
            win = malloc((w1 - w0) * (size_t)hop * sizeof *win);
            if (!win) {
                rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
                break;
            }
            rc = zi_wavtok_decode(w, s->codes + w0, (int)(w1 - w0), NULL, win, err);
            if (rc) break;
            memcpy(*audio + *n_audio, win + (b0 - w0) * (size_t)hop,
                   (b1 - b0) * (size_t)hop * sizeof *win);
            *n_audio = need;
        }
        s->decoded_index = b1;
        s->block_counter++;
    }
    free(win);
    return rc;
}
