/*
 * tts_stream.h - decodes a speech request's codec codes to audio in blocks
 * while the codec LLM still writes them (the seeds' TTSContext: the codes
 * so far, the decoded index, the block counter), so that audio streams.
 *
 * The WavTokenizer decoder (wavtokenizer.h) is not causal: its attention
 * block sees every frame and its convolutions reach 47 frames either side,
 * so a frame's samples change as later codes arrive. Decoding "everything
 * so far and emitting the new samples" would make the streamed audio
 * depend on when each round ended. Instead the samples of block b (codes
 * [b B, (b + 1) B), the last block shorter) always come from one decode of
 * the window
 *
 *     [max(0, b B - C), min(N, (b + 1) B + C))     N: the sequence's codes
 *
 * cut to the block's frames (hop samples a frame). A block is decoded once
 * its window's right edge is known: when (b + 1) B + C codes exist, or at
 * the end of the sequence. Its samples are then a function of the final
 * code sequence alone, whatever the rounds were: streamed output equals
 * the unstreamed call's, and a worker that takes a request over after a
 * failover (given the codes generated so far) emits exactly what the dead
 * one had not sent yet, by construction. The cost is C codes of latency
 * and (B + 2 C) / B decoder work; near a block edge the samples differ
 * from one whole-sequence decode by what the C codes of context leave out.
 */
#ifndef ZI_TTS_STREAM_H
#define ZI_TTS_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "wavtokenizer.h"
#include "zi_error.h"

/* The defaults: 64 codes a block (0.85 s at 75 codes a second), 24 codes
 * of context each side. */
enum { ZI_TTS_BLOCK_CODES = 64, ZI_TTS_CONTEXT_CODES = 24 };

typedef struct zi_tts_stream {
    int block, context; /* B and C above */
    int32_t *codes;     /* the sequence's codes so far */
    size_t n_codes, cap;
    size_t decoded_index; /* codes whose samples were emitted (block_counter B, or N at the end) */
    size_t block_counter; /* blocks emitted */
} zi_tts_stream;

/* block >= 1, context >= 0. */
int zi_tts_stream_init(zi_tts_stream *s, int block, int context, zi_error *err);
void zi_tts_stream_free(zi_tts_stream *s);

/* Appends n codes (checked against the decoder when decoded). */
int zi_tts_stream_push(zi_tts_stream *s, const int32_t *codes, size_t n, zi_error *err);

/*
 * Decodes every block that is ready (all of the rest when final) with w and
 * appends their samples to *audio (grown with realloc; *n_audio samples,
 * *cap_audio floats allocated). Returns the status of the decoder (a code
 * out of its range is ZI_EINVAL naming it). emit 0 skips the decode and
 * only advances the counters: a worker resuming a request uses it for the
 * codes whose audio was sent before.
 */
int zi_tts_stream_take(zi_tts_stream *s, zi_wavtok *w, int final, int emit, float **audio,
                       size_t *n_audio, size_t *cap_audio, zi_error *err);

#endif
