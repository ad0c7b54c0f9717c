/*
 * tts_cmd.h - `zinfer generate --tts TEXT`: the text half of speech on the
 * command line. The text (and an OuteTTS speaker file, --tts-speaker)
 * rendered as the OuteTTS prompt (structured/tts_prompt.h), encoded, and
 * the codec plan that holds the generation to the audio section
 * (structured/codec_mask.h); generate then prints the codec ids.
 */
#ifndef ZI_TTS_CMD_H
#define ZI_TTS_CMD_H

#include <stddef.h>
#include <stdint.h>

#include "codec_mask.h"
#include "tokenizer.h"
#include "zi_error.h"

typedef struct zi_cli_tts {
    char *prompt; /* the rendered prompt text */
    int32_t *ids; /* its tokens */
    size_t n;
    zi_codec_plan *plan;
    int32_t audio_end; /* the end marker: the request's end-of-sequence id */
} zi_cli_tts;

/*
 * Renders text (len bytes) with the speaker JSON file speaker_file (NULL:
 * none) for tok's vocabulary, OuteTTS 0.2 unless the speaker says 0.3.
 * Errors name the field ("input", "--tts-speaker FILE: words[2].codes[0]")
 * or say the model is no OuteTTS model. *t is freed by zi_cli_tts_free,
 * also after a failure.
 */
int zi_cli_tts_prepare(zi_tokenizer *tok, const char *text, size_t len, const char *speaker_file,
                       zi_cli_tts *t, zi_error *err);
void zi_cli_tts_free(zi_cli_tts *t);

#endif
