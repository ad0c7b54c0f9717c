/*
 * wav.h - RIFF/WAVE headers and sample conversion for mono speech output
 * (zinfer decode-speech; the speech endpoints' response_format wav).
 *
 * Two sample formats: 16-bit PCM (format tag 1, what Python's wave module
 * and every player read) and 32-bit IEEE float (format tag 3, with the
 * 18-byte fmt chunk and the fact chunk that non-PCM formats carry).
 */
#ifndef ZI_WAV_H
#define ZI_WAV_H

#include <stddef.h>
#include <stdint.h>

/* The largest header zi_wav_header writes. */
#define ZI_WAV_HEADER_MAX 58

/* Writes the header of a mono file of n_samples samples at rate Hz into
 * buf (ZI_WAV_HEADER_MAX bytes): 16-bit PCM, or float32 when f32. Returns
 * its length (44 or 58), or 0 when the data would not fit the format's
 * 32-bit sizes. */
size_t zi_wav_header(uint8_t *buf, uint32_t n_samples, uint32_t rate, int f32);

/* A sample as 16-bit PCM: x clamped to [-1, 1], times 32767, rounded to
 * nearest (NaN as 0). */
int16_t zi_wav_s16(float x);

#endif
