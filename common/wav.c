/*
 * wav.c - RIFF/WAVE headers for mono speech output (see wav.h).
 */
#include "wav.h"

#include <math.h>
#include <string.h>

static uint8_t *put4(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

static uint8_t *put2(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
    return p + 2;
}

static uint8_t *tag(uint8_t *p, const char *t) {
    memcpy(p, t, 4);
    return p + 4;
}

size_t zi_wav_header(uint8_t *buf, uint32_t n_samples, uint32_t rate, int f32) {
    const uint32_t bytes = f32 ? 4 : 2, hdr = f32 ? 58 : 44;
    if ((uint64_t)n_samples * bytes + hdr - 8 > UINT32_MAX) return 0;
    const uint32_t data = n_samples * bytes;
    uint8_t *p = tag(buf, "RIFF");
    p = put4(p, data + hdr - 8);
    p = tag(p, "WAVE");
    p = tag(p, "fmt ");
    p = put4(p, f32 ? 18 : 16);
    p = put2(p, f32 ? 3 : 1); /* WAVE_FORMAT_IEEE_FLOAT or PCM */
    p = put2(p, 1);           /* mono */
    p = put4(p, rate);
    p = put4(p, rate * bytes);
    p = put2(p, (uint16_t)bytes);
    p = put2(p, (uint16_t)(bytes * 8));
    if (f32) {
        p = put2(p, 0); /* no extension */
        p = tag(p, "fact");
        p = put4(p, 4);
        p = put4(p, n_samples);
    }
    p = tag(p, "data");
    p = put4(p, data);
    return (size_t)(p - buf);
}

int16_t zi_wav_s16(float x) {
    if (!(x == x)) return 0;
    if (x > 1.0f) x = 1.0f;
    if (x < -1.0f) x = -1.0f;
    return (int16_t)lrintf(x * 32767.0f);
}
