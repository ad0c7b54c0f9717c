/*
 * tts_encode.h - the tokenizer process's half of a speech request
 * (docs/speech.md): the voice resolved to a speaker file under --voices
 * DIR and parsed, the OuteTTS prompt rendered and encoded, and what the
 * worker needs to build the codec plan (the marker ids, each word's ids),
 * which travels in the context so failover rebuilds the same plan.
 */
#ifndef ZI_TTS_ENCODE_H
#define ZI_TTS_ENCODE_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"
#include "types.h"
#include "zi_error.h"

typedef struct zi_tts_encoded {
    int32_t *ids; /* the prompt's token ids */
    size_t n;
    int32_t marker_ids[8]; /* zi_codec_ids' fields in order (types.h tts_ids) */
    zi_i32_list *words;    /* each word's ids */
    size_t n_words;
} zi_tts_encoded;

/*
 * Encodes speech request r (r->speech: its input in prompt_text; its
 * voice, or the seeds' speaker prompt ap_text / ap_tokens / ap_word_codes
 * made into words by zi_tts_speaker_from_tokens) with tok. voices_dir (NULL: none) holds NAME.json
 * speaker files; a voice name is 1..64 of [A-Za-z0-9_.-] not starting with '.'. Errors name the
 * field: "input: ...", "voice: ..." (ZI_EINVAL / ZI_ERANGE), a model without OuteTTS's tokens
 * ZI_EUNSUPPORTED.
 */
int zi_tts_encode(zi_tokenizer *tok, const char *voices_dir, const zi_request *r,
                  zi_tts_encoded *out, zi_error *err);
void zi_tts_encoded_free(zi_tts_encoded *e);

#endif
