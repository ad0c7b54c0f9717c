/*
 * tts_prompt.h - the OuteTTS prompt (versions 0.2 and 0.3), the text half
 * of the speech pipeline: the input text normalised as OuteTTS and
 * llama.cpp's OuteTTS example normalise it, an optional speaker prompt
 * (the words of a reference recording with their durations and codec
 * codes: an OuteTTS speaker JSON file, or the seeds'
 * audio_prompt_transcription + audio_prompt_tokens once aligned to words),
 * rendered into the text the codec LLM continues with codec tokens:
 *
 *   <|im_start|>\n<|text_start|>SPK1<|text_sep|>SPK2<|text_sep|>...
 *   W1<|text_sep|>W2...<|text_end|>\n<|audio_start|>\n
 *   SPK1<|t_0.08|><|code_start|><|257|><|740|>...<|code_end|>\n
 *   ...
 *
 * (0.3: <|space|> in place of <|text_sep|>, no <|code_start|>, and
 * <|space|> in place of <|code_end|>). The model then writes, per word of
 * the text, "W<|t_d|><|code_start|><|c|>...<|code_end|>\n", and
 * <|audio_end|> after the last (codec_mask.h holds it to that).
 *
 * Inputs come from clients: every fault is ZI_EINVAL (ZI_ERANGE for a
 * limit) naming the field it is in.
 */
#ifndef ZI_TTS_PROMPT_H
#define ZI_TTS_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

/* The seeds' limit on AudioGenerationRequest.input, in characters. */
#define ZI_TTS_MAX_TEXT_CHARS 4096
/* Codec tokens <|0|> .. <|4099|> (OuteTTS adds 4100; WavTokenizer's
 * codebook has 4096 of them: the decoder refuses the other four). */
#define ZI_TTS_CODEC_TOKENS 4100
/* Duration tokens <|t_0.00|> .. <|t_10.00|>, in hundredths. */
#define ZI_TTS_MAX_DURATION_CS 1000
/* A speaker prompt's limits: words, and bytes of a word. */
#define ZI_TTS_MAX_SPEAKER_WORDS 1024
#define ZI_TTS_MAX_WORD_BYTES 256

typedef enum zi_tts_version { ZI_OUTETTS_0_2 = 2, ZI_OUTETTS_0_3 = 3 } zi_tts_version;

typedef struct zi_tts_word {
    char *text;      /* the word as spoken, normalised (no spaces, no markers) */
    int duration_cs; /* its duration in hundredths of a second, 0..1000 */
    int32_t *codes;  /* its codec codes, each 0..ZI_TTS_CODEC_TOKENS-1 */
    size_t n_codes;  /* >= 1 */
} zi_tts_word;

typedef struct zi_tts_speaker {
    zi_tts_version version;
    zi_tts_word *words;
    size_t n_words;
} zi_tts_speaker;

/* The rendered prompt: its text (NUL-terminated) and the input's words,
 * in order, as the model must speak them (for codec_mask.h). */
typedef struct zi_tts_prompt {
    char *text;
    size_t len;
    char **words;
    size_t n_words;
} zi_tts_prompt;

/*
 * Normalises text as OuteTTS 0.2 / llama.cpp's example do: numbers
 * (ASCII digits, optionally with a decimal part) written out in English
 * words ("12.5" -> "twelve point five"; an integer part past 2^31 - 1 is
 * dropped, as there), ASCII lower case, - _ / , . \ as spaces, every other
 * byte that is not a-z or white space dropped, white space runs as one
 * space, none at the ends. *out (malloc'd, NUL-terminated) gets the words
 * separated by single spaces, possibly "" (nothing speakable). field names
 * the input in errors. ZI_EINVAL for invalid UTF-8, ZI_ERANGE past
 * ZI_TTS_MAX_TEXT_CHARS characters, ZI_ENOMEM.
 */
int zi_tts_normalize(const char *text, size_t len, const char *field, char **out, zi_error *err);

/*
 * Parses an OuteTTS speaker (the JSON its create_speaker / save_speaker
 * write: {"text": ..., "words": [{"word": "the", "duration": 0.08,
 * "codes": [257, 740, ...]}, ...], optional "version": "0.2" | "0.3"}).
 * Every word is checked: text 1..ZI_TTS_MAX_WORD_BYTES bytes of valid
 * UTF-8 without white space, '<', '|' or '>' (it must not make markers),
 * duration a number in [0, 10], codes a non-empty array of integers in
 * [0, ZI_TTS_CODEC_TOKENS). field names the input ("voice", a file name)
 * and each error its path ("voice: words[3].codes[7]: ..."). On success
 * *sp owns its words (zi_tts_speaker_free); on failure it is left empty.
 */
int zi_tts_speaker_parse(const char *json, size_t len, const char *field, zi_tts_speaker *sp,
                         zi_error *err);

/* WavTokenizer's frames per second (24 kHz audio, a hop of 320 samples):
 * a word of n codes lasts n / 75 s. */
#define ZI_TTS_CODES_PER_SECOND 75

/*
 * The seeds' form of a speaker prompt (AudioGenerationRequest's
 * audio_prompt_transcription and audio_prompt_tokens) made into words:
 * the transcription normalised as zi_tts_normalize does, its words given
 * word_codes[i] consecutive codes of codes[0..n_codes) each (the flat list
 * alone cannot be split into words: the caller passes the split, e.g. from
 * the aligner that made the codes), each duration word_codes[i] / 75 s.
 * Refused, naming the field: a transcription with no word or a word count
 * other than n_word_codes ("audio_prompt_transcription"), a code outside
 * [0, ZI_TTS_CODEC_TOKENS) ("audio_prompt_tokens[k]"), a word of no codes,
 * a word longer than 10 s or counts that do not add up to n_codes
 * ("audio_prompt_word_codes[i]"). Version 0.2.
 */
int zi_tts_speaker_from_tokens(const char *transcription, size_t len, const int32_t *codes,
                               size_t n_codes, const int32_t *word_codes, size_t n_word_codes,
                               zi_tts_speaker *sp, zi_error *err);

void zi_tts_speaker_free(zi_tts_speaker *sp);

/*
 * Renders the prompt for input text (normalised here: an input that is
 * empty or has no speakable word is ZI_EINVAL, field "input") with speaker
 * sp (NULL: none; the model then picks a voice) in version v (a speaker
 * of another version is ZI_EINVAL). *out is owned by the caller
 * (zi_tts_prompt_free) and left empty on failure.
 */
int zi_tts_render(const char *input, size_t len, const zi_tts_speaker *sp, zi_tts_version v,
                  zi_tts_prompt *out, zi_error *err);

void zi_tts_prompt_free(zi_tts_prompt *p);

#endif
