/*
 * http_speech.h - POST /v1/audio/speech (OpenAI's shape, docs/http.md):
 * the request body checked and turned into the router's speech op, and
 * the answer's bytes (a WAV file or raw 16-bit PCM at 24 kHz) made from the
 * audio the op's chunks carry.
 */
#ifndef ZI_HTTP_SPEECH_H
#define ZI_HTTP_SPEECH_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "http_error.h"
#include "msg.h"

/* Checks body o (model, input, voice, response_format, speed,
 * stream_format, instructions; zinfer's seed, temperature, top_p, top_k,
 * max_tokens) and writes the speech op (id "s", 16-bit samples, model_name
 * model) into m. *wav: 1 for response_format "wav" (the default), 0 for
 * "pcm". -1 with a 400 naming the field: a format other than wav or pcm,
 * a speed other than 1, stream_format "sse", instructions. */
int zi_http_speech_request(json_t *o, const char *model, zi_msg *m, int *wav, zi_http_error *e);

/* The 44-byte WAV header of n_samples 16-bit mono samples at rate into buf. */
size_t zi_http_speech_wav_header(uint8_t *buf, size_t n_samples, int rate);

#endif
