/*
 * test_tts_prompt.c - cmocka tests for structured/tts_prompt.c and
 * structured/codec_mask.c: OuteTTS text normalisation (numbers in words,
 * case, separators, dropped characters, the length limit, bad UTF-8), the
 * rendered prompt with and without a speaker in versions 0.2 and 0.3,
 * speaker JSON faults each named by its path, the seeds' transcription +
 * flat codes split into words, and the codec mask's state
 * machine over a whole audio section (forced word tokens, durations,
 * codes, markers, the end) and after a token it did not allow.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec_mask.h"
#include "tts_prompt.h"

static void norm_is(const char *in, const char *want) {
    char *out = NULL;
    zi_error e = {0};
    assert_int_equal(zi_tts_normalize(in, strlen(in), "input", &out, &e), ZI_OK);
    assert_string_equal(out, want);
    free(out);
}

static void test_normalize(void **state) {
    (void)state;
    norm_is("Hello, World!", "hello world");
    norm_is("  It's 12.5 degrees  ", "its twelve point five degrees");
    norm_is("1234567", "one million two hundred thirty four thousand five hundred sixty seven");
    norm_is("0 and 100", "zero and one hundred");
    norm_is("a-b_c/d\\e.f", "a b c d e f");
    norm_is("caf\xc3\xa9 na\xc3\xafve", "caf nave");
    norm_is("99999999999 x", "x"); /* past int: dropped, as llama.cpp */
    norm_is("!!!", "");
    char *out = NULL;
    zi_error e = {0};
    assert_int_equal(zi_tts_normalize("a\xff", 2, "input", &out, &e), ZI_EINVAL);
    assert_non_null(strstr(e.msg, "input: invalid UTF-8"));
    char *big = malloc(ZI_TTS_MAX_TEXT_CHARS + 2);
    memset(big, 'a', ZI_TTS_MAX_TEXT_CHARS + 1);
    big[ZI_TTS_MAX_TEXT_CHARS + 1] = 0;
    assert_int_equal(zi_tts_normalize(big, ZI_TTS_MAX_TEXT_CHARS, "input", &out, &e), ZI_OK);
    free(out);
    assert_int_equal(zi_tts_normalize(big, ZI_TTS_MAX_TEXT_CHARS + 1, "input", &out, &e),
                     ZI_ERANGE);
    assert_non_null(strstr(e.msg, "input: 4097 characters"));
    free(big);
}

static const char *SPEAKER = "{\"text\": \"the overall\", \"words\": ["
                             "{\"word\": \"the\", \"duration\": 0.08, \"codes\": [257, 740]},"
                             "{\"word\": \"overall\", \"duration\": 0.36, \"codes\": [127]}]}";

static void test_render(void **state) {
    (void)state;
    zi_tts_prompt p;
    zi_error e = {0};
    assert_int_equal(zi_tts_render("Hi there", 8, NULL, ZI_OUTETTS_0_2, &p, &e), ZI_OK);
    assert_string_equal(p.text, "<|im_start|>\n<|text_start|>hi<|text_sep|>there<|text_end|>\n"
                                "<|audio_start|>\n");
    assert_int_equal(p.n_words, 2);
    assert_string_equal(p.words[1], "there");
    zi_tts_prompt_free(&p);
    zi_tts_speaker sp;
    assert_int_equal(zi_tts_speaker_parse(SPEAKER, strlen(SPEAKER), "voice", &sp, &e), ZI_OK);
    assert_int_equal(zi_tts_render("Go", 2, &sp, ZI_OUTETTS_0_2, &p, &e), ZI_OK);
    assert_string_equal(p.text, "<|im_start|>\n<|text_start|>the<|text_sep|>overall<|text_sep|>go"
                                "<|text_end|>\n<|audio_start|>\n"
                                "the<|t_0.08|><|code_start|><|257|><|740|><|code_end|>\n"
                                "overall<|t_0.36|><|code_start|><|127|><|code_end|>\n");
    zi_tts_prompt_free(&p);
    /* a 0.2 speaker for a 0.3 model */
    assert_int_equal(zi_tts_render("Go", 2, &sp, ZI_OUTETTS_0_3, &p, &e), ZI_EINVAL);
    sp.version = ZI_OUTETTS_0_3;
    assert_int_equal(zi_tts_render("Go", 2, &sp, ZI_OUTETTS_0_3, &p, &e), ZI_OK);
    assert_string_equal(p.text, "<|im_start|>\n<|text_start|>the<|space|>overall<|space|>go"
                                "<|text_end|>\n<|audio_start|>\n"
                                "the<|t_0.08|><|257|><|740|><|space|>\n"
                                "overall<|t_0.36|><|127|><|space|>\n");
    zi_tts_prompt_free(&p);
    zi_tts_speaker_free(&sp);
    assert_int_equal(zi_tts_render("", 0, NULL, ZI_OUTETTS_0_2, &p, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "input: the text is empty");
    assert_int_equal(zi_tts_render("?!", 2, NULL, ZI_OUTETTS_0_2, &p, &e), ZI_EINVAL);
    assert_non_null(strstr(e.msg, "input: no word to speak"));
    assert_null(p.text);
}

static void speaker_fails(const char *json, const char *want) {
    zi_tts_speaker sp;
    zi_error e = {0};
    assert_int_not_equal(zi_tts_speaker_parse(json, strlen(json), "voice", &sp, &e), ZI_OK);
    if (!strstr(e.msg, want)) fail_msg("'%s' lacks '%s'", e.msg, want);
    assert_int_equal(sp.n_words, 0);
}

static void test_speaker_errors(void **state) {
    (void)state;
    speaker_fails("{", "voice: not JSON");
    speaker_fails("[]", "voice: must be a JSON object");
    speaker_fails("{\"words\": []}", "voice: words: must be a non-empty array");
    speaker_fails("{\"version\": \"1.0\", \"words\": [1]}", "voice: version");
    speaker_fails("{\"words\": [{\"word\": \"a\", \"duration\": 0.1, \"codes\": [1]}, 7]}",
                  "voice: words[1]: not an object");
    speaker_fails("{\"words\": [{\"word\": \"<|im_end|>\", \"duration\": 0.1, \"codes\": [1]}]}",
                  "voice: words[0].word");
    speaker_fails("{\"words\": [{\"word\": \"a b\", \"duration\": 0.1, \"codes\": [1]}]}",
                  "voice: words[0].word");
    speaker_fails("{\"words\": [{\"word\": \"a\", \"duration\": 11, \"codes\": [1]}]}",
                  "voice: words[0].duration");
    speaker_fails("{\"words\": [{\"word\": \"a\", \"duration\": 0.1, \"codes\": []}]}",
                  "voice: words[0].codes: must be a non-empty array");
    speaker_fails("{\"words\": [{\"word\": \"a\", \"duration\": 0.1, \"codes\": [1, 4100]}]}",
                  "voice: words[0].codes[1]: a codec id must be an integer in [0, 4099]");
    speaker_fails("{\"words\": [{\"word\": \"a\", \"duration\": 0.1, \"codes\": [-1]}]}",
                  "voice: words[0].codes[0]");
}

static void flat_fails(const char *text, const int32_t *codes, size_t n, const int32_t *wc,
                       size_t nw, const char *want) {
    zi_tts_speaker sp;
    zi_error e = {0};
    assert_int_equal(zi_tts_speaker_from_tokens(text, strlen(text), codes, n, wc, nw, &sp, &e),
                     ZI_EINVAL);
    if (!strstr(e.msg, want)) fail_msg("'%s' lacks '%s'", e.msg, want);
    assert_int_equal(sp.n_words, 0);
}

/* The seeds' transcription + flat codes, split into words by counts. */
static void test_speaker_from_tokens(void **state) {
    (void)state;
    const int32_t codes[] = {257, 740, 636, 1, 2, 3, 4, 4099};
    const int32_t wc[] = {3, 5};
    zi_tts_speaker sp;
    zi_error e = {0};
    assert_int_equal(zi_tts_speaker_from_tokens("The remarkable!", 15, codes, 8, wc, 2, &sp, &e),
                     ZI_OK);
    assert_int_equal(sp.n_words, 2);
    assert_string_equal(sp.words[0].text, "the");
    assert_string_equal(sp.words[1].text, "remarkable");
    assert_int_equal(sp.words[0].n_codes, 3);
    assert_int_equal(sp.words[1].codes[4], 4099);
    assert_int_equal(sp.words[0].duration_cs, 4); /* 3 / 75 s = 0.04 */
    assert_int_equal(sp.words[1].duration_cs, 7); /* 5 / 75 s = 0.0667 */
    zi_tts_prompt p;
    assert_int_equal(zi_tts_render("Go", 2, &sp, ZI_OUTETTS_0_2, &p, &e), ZI_OK);
    assert_non_null(strstr(p.text, "\nremarkable<|t_0.07|><|code_start|><|1|><|2|><|3|><|4|>"
                                   "<|4099|><|code_end|>\n"));
    zi_tts_prompt_free(&p);
    zi_tts_speaker_free(&sp);
    const int32_t bad[] = {257, 4100};
    const int32_t one[] = {2}, two[] = {1, 1}, zero[] = {0, 2};
    flat_fails("a", bad, 2, one, 1, "audio_prompt_tokens[1]: codec id 4100 is outside [0, 4099]");
    const int32_t neg[] = {-3};
    const int32_t c1[] = {1};
    flat_fails("a", neg, 1, c1, 1, "audio_prompt_tokens[0]: codec id -3");
    flat_fails("a b c", codes, 2, two, 2, "audio_prompt_transcription: 3 words");
    flat_fails("?!", codes, 2, two, 2, "audio_prompt_transcription: no word");
    flat_fails("a b", codes, 2, zero, 2, "audio_prompt_word_codes[0]: 0 codes");
    flat_fails("a b", codes, 3, two, 2, "the words have 2 codes in all, audio_prompt_tokens 3");
}

/* A small vocabulary: 0..9 text, 10 "\n", 11 <|code_start|>, 12
 * <|code_end|>, 13 <|audio_end|>, 14.. codes (4100), then durations. */
enum { NL = 10, CS = 11, CE = 12, AE = 13, C0 = 14, T0 = C0 + 4100, NV = T0 + 1001 };

static int32_t small_lookup(void *user, const char *t) {
    (void)user;
    if (!strcmp(t, "\n")) return NL;
    if (!strcmp(t, "<|code_start|>")) return CS;
    if (!strcmp(t, "<|code_end|>")) return CE;
    if (!strcmp(t, "<|audio_end|>")) return AE;
    int a, b;
    char end;
    if (sscanf(t, "<|t_%d.%d|%c", &a, &b, &end) == 3) return T0 + a * 100 + b;
    if (sscanf(t, "<|%d|%c", &a, &end) == 2) return C0 + a;
    return -1;
}

static int allowed(const int32_t *m, int32_t t) {
    return (int)((uint32_t)m[t >> 5] >> (t & 31) & 1u);
}

static int count(const int32_t *m) {
    int n = 0;
    for (int32_t t = 0; t < NV; t++) n += allowed(m, t);
    return n;
}

static void test_mask(void **state) {
    (void)state;
    zi_codec_ids ids;
    zi_error e = {0};
    assert_int_equal(zi_codec_ids_find(2, small_lookup, NULL, &ids, &e), ZI_OK);
    assert_int_equal(zi_codec_ids_find(3, small_lookup, NULL, &ids, &e), ZI_EUNSUPPORTED);
    assert_non_null(strstr(e.msg, "<|space|>"));
    assert_int_equal(zi_codec_ids_find(2, small_lookup, NULL, &ids, &e), ZI_OK);
    const int32_t w0[] = {3, 4}, w1[] = {5};
    const int32_t *words[] = {w0, w1};
    const size_t nw[] = {2, 1};
    zi_codec_plan *p;
    assert_int_equal(zi_codec_plan_create(&ids, words, nw, 2, &p, &e), ZI_OK);
    int32_t *m = malloc((NV + 31) / 32 * sizeof *m);
    /* the section, token by token, with what each step allows */
    const int32_t seq[] = {3, 4, T0 + 8, CS, C0 + 5, C0 + 4099, CE, NL, 5, T0, CS, C0, CE, NL, AE};
    const int n_allowed[] = {1, 1, 1001, 1, 4100, 4101, 4101, 1, 1, 1001, 1, 4100, 4101, 1, 1};
    for (size_t i = 0; i < sizeof seq / sizeof *seq; i++) {
        zi_codec_plan_mask(p, seq, i, NV, m);
        assert_int_equal(count(m), n_allowed[i]);
        assert_true(allowed(m, seq[i]));
    }
    /* code_end only after a code; EOS ... the end stays the end */
    zi_codec_plan_mask(p, seq, 4, NV, m);
    assert_false(allowed(m, CE));
    zi_codec_plan_mask(p, seq, 15, NV, m);
    assert_int_equal(count(m), 1);
    assert_true(allowed(m, AE));
    /* a token the plan did not allow: only the end */
    const int32_t bad[] = {3, 7};
    zi_codec_plan_mask(p, bad, 2, NV, m);
    assert_int_equal(count(m), 1);
    assert_true(allowed(m, AE));
    int32_t codes[16];
    assert_int_equal(zi_codec_extract(&ids, seq, 15, codes), 3);
    assert_int_equal(codes[0], 5);
    assert_int_equal(codes[1], 4099);
    assert_int_equal(codes[2], 0);
    free(m);
    zi_codec_plan_free(p);
    const size_t empty[] = {0};
    assert_int_equal(zi_codec_plan_create(&ids, words, empty, 1, &p, &e), ZI_EINVAL);
    assert_int_equal(zi_codec_plan_create(&ids, words, nw, 0, &p, &e), ZI_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_normalize),      cmocka_unit_test(test_render),
        cmocka_unit_test(test_speaker_errors), cmocka_unit_test(test_speaker_from_tokens),
        cmocka_unit_test(test_mask),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
