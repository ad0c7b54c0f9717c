/*
 * codec_mask.h - holds an OuteTTS codec LLM's output to the audio section
 * of its prompt format (tts_prompt.h), token by token: after the prompt's
 * "<|audio_start|>\n" (and the speaker's words), for each word of the text
 * in turn
 *
 *   the word's own tokens (forced: the text is known, so the model cannot
 *   skip, repeat or invent words; llama.cpp's example forced each word's
 *   first token, its "guide tokens"), one duration token <|t_d|>,
 *   <|code_start|> (0.2 only), one or more codec tokens <|0|>..<|4099|>,
 *   <|code_end|> (0.3: <|space|>), "\n";
 *
 * then <|audio_end|>, the end marker, which the caller makes the request's
 * end-of-sequence id. The allowed set is a function of the generated
 * tokens alone (recomputed from them at each step, no state kept), so a
 * row's mask never depends on the batch, and a rollback or a replay after
 * preemption gives the same masks. It is given to the sampler as the
 * structured-output bitmask (sampler.h: bit j of word i allows token
 * 32 i + j), the path grammars take.
 */
#ifndef ZI_CODEC_MASK_H
#define ZI_CODEC_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

/* The marker ids of one vocabulary (zi_codec_ids_find fills them). */
typedef struct zi_codec_ids {
    int32_t code0;      /* <|0|>; codes are code0 .. code0 + n_codes - 1 */
    int32_t n_codes;    /* ZI_TTS_CODEC_TOKENS */
    int32_t time0;      /* <|t_0.00|>; durations time0 .. time0 + n_times - 1 */
    int32_t n_times;    /* 1001 */
    int32_t code_start; /* <|code_start|>; -1 in version 0.3 (none) */
    int32_t code_end;   /* <|code_end|>, or <|space|> in 0.3 */
    int32_t newline;    /* "\n" */
    int32_t audio_end;  /* <|audio_end|> */
} zi_codec_ids;

/* Looks a token's text up: its id, or -1 when the vocabulary lacks it. */
typedef int32_t (*zi_codec_lookup_fn)(void *user, const char *text);

/*
 * Fills ids for version (2: OuteTTS 0.2, 3: 0.3) from a vocabulary through
 * lookup: every codec and duration token must exist and be consecutive
 * (as OuteTTS adds them); ZI_EUNSUPPORTED naming the first token missing
 * otherwise (not a codec model).
 */
int zi_codec_ids_find(int version, zi_codec_lookup_fn lookup, void *user, zi_codec_ids *ids,
                      zi_error *err);

typedef struct zi_codec_plan zi_codec_plan;

/*
 * A plan for one request: the marker ids and the token ids of each of the
 * n_words words of the text (word i: word_ids[i][0..n_word_ids[i]), each
 * n >= 1). Copied. ZI_EINVAL for an empty word or no word, ZI_ENOMEM.
 */
int zi_codec_plan_create(const zi_codec_ids *ids, const int32_t *const *word_ids,
                         const size_t *n_word_ids, size_t n_words, zi_codec_plan **out,
                         zi_error *err);
void zi_codec_plan_free(zi_codec_plan *p);

/*
 * The tokens allowed after generated tokens gen[0..n_gen), into mask
 * (ceil(n_vocab / 32) int32 words, every one written). Generated tokens
 * that the plan would not have allowed (none are, when every draw used
 * these masks) leave only audio_end. Never an empty mask.
 */
void zi_codec_plan_mask(const zi_codec_plan *p, const int32_t *gen, size_t n_gen, int32_t n_vocab,
                        int32_t *mask);

/* The codec ids (token - code0) among tokens[0..n), in order, into codes
 * (room for n); returns how many. What llama.cpp's example kept. */
size_t zi_codec_extract(const zi_codec_ids *ids, const int32_t *tokens, size_t n, int32_t *codes);

const zi_codec_ids *zi_codec_plan_ids(const zi_codec_plan *p);

#endif
