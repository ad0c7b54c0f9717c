/*
 * tts_prompt.c - the OuteTTS prompt: text normalisation, speaker JSON,
 * rendering (tts_prompt.h).
 */
#include "tts_prompt.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utf8.h"

/* A growing NUL-terminated string. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np, b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) {
    sb_add(b, s, strlen(s));
}

/* ---- numbers in words (llama.cpp's OuteTTS example's rules) ---- */

static const char *const ONES[20] = {"zero",    "one",     "two",       "three",    "four",
                                     "five",    "six",     "seven",     "eight",    "nine",
                                     "ten",     "eleven",  "twelve",    "thirteen", "fourteen",
                                     "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"};
static const char *const TENS[10] = {"",      "",      "twenty",  "thirty", "forty",
                                     "fifty", "sixty", "seventy", "eighty", "ninety"};

static void under_thousand(sbuf *b, int n) {
    if (n >= 100) {
        sb_str(b, ONES[n / 100]);
        sb_str(b, " hundred ");
        n %= 100;
    }
    if (n >= 20) {
        sb_str(b, TENS[n / 10]);
        if (n % 10) {
            sb_str(b, "-");
            sb_str(b, ONES[n % 10]);
        }
    } else if (n > 0) {
        sb_str(b, ONES[n]);
    }
}

static int is_digit(char c) {
    return c >= '0' && c <= '9';
}

/* The digits s[0..n_int) (and, when n_frac > 0, the decimal digits after
 * the point at s[n_int + 1]) in words. An integer part past INT_MAX is one
 * space, as std::stoi's failure makes it there. */
static void number_words(sbuf *b, const char *s, size_t n_int, size_t n_frac, int has_point) {
    long long v = 0;
    for (size_t i = 0; i < n_int; i++) {
        v = v * 10 + (s[i] - '0');
        if (v > 2147483647LL) {
            sb_str(b, " ");
            return;
        }
    }
    int n = (int)v;
    if (n == 0) sb_str(b, "zero");
    if (n >= 1000000000) {
        under_thousand(b, n / 1000000000);
        sb_str(b, " billion ");
        n %= 1000000000;
    }
    if (n >= 1000000) {
        under_thousand(b, n / 1000000);
        sb_str(b, " million ");
        n %= 1000000;
    }
    if (n >= 1000) {
        under_thousand(b, n / 1000);
        sb_str(b, " thousand ");
        n %= 1000;
    }
    if (n > 0) under_thousand(b, n);
    if (has_point) {
        sb_str(b, " point");
        for (size_t i = 0; i < n_frac; i++) {
            sb_str(b, " ");
            sb_str(b, ONES[s[n_int + 1 + i] - '0']);
        }
    }
}

static int is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

int zi_tts_normalize(const char *text, size_t len, const char *field, char **out, zi_error *err) {
    *out = NULL;
    size_t bad = zi_utf8_bad_at(text, len);
    if (bad < len) return zi_error_set(err, ZI_EINVAL, "%s: invalid UTF-8 at byte %zu", field, bad);
    size_t chars = 0;
    for (size_t i = 0; i < len; i++) chars += ((unsigned char)text[i] & 0xC0) != 0x80;
    if (chars > ZI_TTS_MAX_TEXT_CHARS)
        return zi_error_set(err, ZI_ERANGE, "%s: %zu characters, more than the %d allowed", field,
                            chars, ZI_TTS_MAX_TEXT_CHARS);
    /* 1: numbers in words (the rest as it is) */
    sbuf a = {0};
    sb_add(&a, "", 0);
    for (size_t i = 0; i < len;) {
        if (!is_digit(text[i])) {
            sb_add(&a, text + i, 1);
            i++;
            continue;
        }
        size_t n_int = 0, n_frac = 0;
        while (i + n_int < len && is_digit(text[i + n_int])) n_int++;
        int point = i + n_int + 1 < len && text[i + n_int] == '.' && is_digit(text[i + n_int + 1]);
        if (point)
            while (i + n_int + 1 + n_frac < len && is_digit(text[i + n_int + 1 + n_frac])) n_frac++;
        number_words(&a, text + i, n_int, n_frac, point);
        i += n_int + (point ? 1 + n_frac : 0);
    }
    /* 2: lower case, separators as spaces, only a-z and white space kept,
     * runs of white space as one space, none at the ends */
    sbuf o = {0};
    sb_add(&o, "", 0);
    int pending_space = 0;
    for (size_t i = 0; !a.oom && i < a.len; i++) {
        unsigned char c = (unsigned char)a.p[i];
        if (c >= 'A' && c <= 'Z') c = (unsigned char)(c - 'A' + 'a');
        if (c == '-' || c == '_' || c == '/' || c == ',' || c == '.' || c == '\\') c = ' ';
        if (is_space(c)) {
            pending_space = 1;
            continue;
        }
        if (c < 'a' || c > 'z') continue;
        if (pending_space && o.len) sb_add(&o, " ", 1);
        pending_space = 0;
        char ch = (char)c;
        sb_add(&o, &ch, 1);
    }
    int oom = a.oom || o.oom;
    free(a.p);
    if (oom) {
        free(o.p);
        return zi_error_set(err, ZI_ENOMEM, "%s: out of memory", field);
    }
    *out = o.p;
    return ZI_OK;
}

/* ---- speaker JSON ---- */

void zi_tts_speaker_free(zi_tts_speaker *sp) {
    if (!sp) return;
    for (size_t i = 0; i < sp->n_words; i++) {
        free(sp->words[i].text);
        free(sp->words[i].codes);
    }
    free(sp->words);
    memset(sp, 0, sizeof *sp);
}

static int word_ok(const char *w, size_t n) {
    if (n == 0 || n > ZI_TTS_MAX_WORD_BYTES || !zi_utf8_valid(w, n)) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)w[i];
        if (is_space(c) || c == '<' || c == '|' || c == '>' || c == 0) return 0;
    }
    return 1;
}

static int parse_word(json_t *jw, size_t i, const char *field, zi_tts_word *w, zi_error *err) {
    if (!json_is_object(jw))
        return zi_error_set(err, ZI_EINVAL, "%s: words[%zu]: not an object", field, i);
    json_t *t = json_object_get(jw, "word"), *d = json_object_get(jw, "duration"),
           *c = json_object_get(jw, "codes");
    if (!json_is_string(t) || !word_ok(json_string_value(t), json_string_length(t)))
        return zi_error_set(err, ZI_EINVAL,
                            "%s: words[%zu].word: must be a string of 1..%d bytes of UTF-8 "
                            "without spaces, '<', '|' or '>'",
                            field, i, ZI_TTS_MAX_WORD_BYTES);
    double dur = json_is_number(d) ? json_number_value(d) : -1;
    if (!(dur >= 0 && dur <= ZI_TTS_MAX_DURATION_CS / 100.0))
        return zi_error_set(err, ZI_EINVAL,
                            "%s: words[%zu].duration: must be a number of seconds in [0, %d]",
                            field, i, ZI_TTS_MAX_DURATION_CS / 100);
    if (!json_is_array(c) || json_array_size(c) == 0)
        return zi_error_set(err, ZI_EINVAL, "%s: words[%zu].codes: must be a non-empty array",
                            field, i);
    size_t n = json_array_size(c);
    for (size_t k = 0; k < n; k++) {
        json_t *v = json_array_get(c, k);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= ZI_TTS_CODEC_TOKENS)
            return zi_error_set(err, ZI_EINVAL,
                                "%s: words[%zu].codes[%zu]: a codec id must be an integer in "
                                "[0, %d]",
                                field, i, k, ZI_TTS_CODEC_TOKENS - 1);
    }
    if (!(w->text = strdup(json_string_value(t))) || !(w->codes = malloc(n * sizeof *w->codes)))
        return zi_error_set(err, ZI_ENOMEM, "%s: out of memory", field);
    for (size_t k = 0; k < n; k++) w->codes[k] = (int32_t)json_integer_value(json_array_get(c, k));
    w->n_codes = n;
    /* hundredths, rounded as "%.2f" prints it */
    w->duration_cs = (int)lround(dur * 100.0);
    return ZI_OK;
}

int zi_tts_speaker_parse(const char *json, size_t len, const char *field, zi_tts_speaker *sp,
                         zi_error *err) {
    memset(sp, 0, sizeof *sp);
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root)
        return zi_error_set(err, ZI_EINVAL, "%s: not JSON: line %d: %s", field, je.line, je.text);
    int rc = ZI_OK;
    json_t *ver = json_object_get(root, "version"), *words = json_object_get(root, "words");
    sp->version = ZI_OUTETTS_0_2;
    if (!json_is_object(root))
        rc = zi_error_set(err, ZI_EINVAL, "%s: must be a JSON object", field);
    else if (ver && !(json_is_string(ver) && (!strcmp(json_string_value(ver), "0.2") ||
                                              !strcmp(json_string_value(ver), "0.3"))))
        rc = zi_error_set(err, ZI_EINVAL, "%s: version: must be \"0.2\" or \"0.3\"", field);
    else if (!json_is_array(words) || json_array_size(words) == 0)
        rc = zi_error_set(err, ZI_EINVAL, "%s: words: must be a non-empty array", field);
    else if (json_array_size(words) > ZI_TTS_MAX_SPEAKER_WORDS)
        rc = zi_error_set(err, ZI_ERANGE, "%s: words: %zu words, more than the %d allowed", field,
                          json_array_size(words), ZI_TTS_MAX_SPEAKER_WORDS);
    if (!rc && ver && !strcmp(json_string_value(ver), "0.3")) sp->version = ZI_OUTETTS_0_3;
    size_t n = rc ? 0 : json_array_size(words);
    if (n && !(sp->words = calloc(n, sizeof *sp->words)))
        rc = zi_error_set(err, ZI_ENOMEM, "%s: out of memory", field);
    for (size_t i = 0; !rc && i < n; i++) {
        sp->n_words = i + 1; /* so that free sees a half-parsed word */
        rc = parse_word(json_array_get(words, i), i, field, &sp->words[i], err);
    }
    json_decref(root);
    if (rc) zi_tts_speaker_free(sp);
    return rc;
}

int zi_tts_speaker_from_tokens(const char *transcription, size_t len, const int32_t *codes,
                               size_t n_codes, const int32_t *word_codes, size_t n_word_codes,
                               zi_tts_speaker *sp, zi_error *err) {
    memset(sp, 0, sizeof *sp);
    sp->version = ZI_OUTETTS_0_2;
    for (size_t k = 0; k < n_codes; k++)
        if (codes[k] < 0 || codes[k] >= ZI_TTS_CODEC_TOKENS)
            return zi_error_set(err, ZI_EINVAL,
                                "audio_prompt_tokens[%zu]: codec id %d is outside [0, %d]", k,
                                (int)codes[k], ZI_TTS_CODEC_TOKENS - 1);
    size_t sum = 0;
    for (size_t i = 0; i < n_word_codes; i++) {
        if (word_codes[i] < 1 ||
            word_codes[i] > ZI_TTS_MAX_DURATION_CS * ZI_TTS_CODES_PER_SECOND / 100)
            return zi_error_set(
                err, ZI_EINVAL, "audio_prompt_word_codes[%zu]: %d codes; a word has 1..%d", i,
                (int)word_codes[i], ZI_TTS_MAX_DURATION_CS * ZI_TTS_CODES_PER_SECOND / 100);
        sum += (size_t)word_codes[i];
    }
    if (sum != n_codes)
        return zi_error_set(err, ZI_EINVAL,
                            "audio_prompt_word_codes: the words have %zu codes in all, "
                            "audio_prompt_tokens %zu",
                            sum, n_codes);
    char *norm = NULL;
    int rc = zi_tts_normalize(transcription, len, "audio_prompt_transcription", &norm, err);
    if (rc) return rc;
    size_t n_words = norm[0] ? 1 : 0;
    for (const char *p = norm; *p; p++) n_words += *p == ' ';
    if (n_words == 0 || n_words != n_word_codes || n_words > ZI_TTS_MAX_SPEAKER_WORDS) {
        free(norm);
        if (n_words == 0)
            return zi_error_set(err, ZI_EINVAL, "audio_prompt_transcription: no word in it");
        if (n_words > ZI_TTS_MAX_SPEAKER_WORDS)
            return zi_error_set(err, ZI_EINVAL,
                                "audio_prompt_transcription: %zu words (at most %d)", n_words,
                                ZI_TTS_MAX_SPEAKER_WORDS);
        return zi_error_set(err, ZI_EINVAL,
                            "audio_prompt_transcription: %zu words, but "
                            "audio_prompt_word_codes splits the codes into %zu (at most %d)",
                            n_words, n_word_codes, ZI_TTS_MAX_SPEAKER_WORDS);
    }
    if (!(sp->words = calloc(n_words, sizeof *sp->words))) rc = ZI_ENOMEM;
    size_t at = 0;
    char *p = norm;
    for (size_t i = 0; !rc && i < n_words; i++) {
        char *e = strchr(p, ' ');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        zi_tts_word *w = &sp->words[i];
        sp->n_words = i + 1;
        w->n_codes = (size_t)word_codes[i];
        if (n > ZI_TTS_MAX_WORD_BYTES) {
            rc = zi_error_set(err, ZI_EINVAL,
                              "audio_prompt_transcription: word %zu is over %d bytes", i,
                              ZI_TTS_MAX_WORD_BYTES);
            break;
        }
        if (!(w->text = malloc(n + 1)) || !(w->codes = malloc(w->n_codes * sizeof *w->codes))) {
            rc = ZI_ENOMEM;
            break;
        }
        memcpy(w->text, p, n);
        w->text[n] = 0;
        memcpy(w->codes, codes + at, w->n_codes * sizeof *w->codes);
        at += w->n_codes;
        /* n / 75 s in hundredths, rounded */
        w->duration_cs =
            (int)((w->n_codes * 100 * 2 + ZI_TTS_CODES_PER_SECOND) / (2 * ZI_TTS_CODES_PER_SECOND));
        p = e ? e + 1 : p + n;
    }
    free(norm);
    if (rc == ZI_ENOMEM) zi_error_set(err, rc, "audio_prompt_tokens: out of memory");
    if (rc) zi_tts_speaker_free(sp);
    return rc;
}

/* ---- rendering ---- */

void zi_tts_prompt_free(zi_tts_prompt *p) {
    if (!p) return;
    free(p->text);
    for (size_t i = 0; i < p->n_words; i++) free(p->words[i]);
    free(p->words);
    memset(p, 0, sizeof *p);
}

int zi_tts_render(const char *input, size_t len, const zi_tts_speaker *sp, zi_tts_version v,
                  zi_tts_prompt *out, zi_error *err) {
    memset(out, 0, sizeof *out);
    if (v != ZI_OUTETTS_0_2 && v != ZI_OUTETTS_0_3)
        return zi_error_set(err, ZI_EINVAL, "OuteTTS prompt version %d is not 0.2 or 0.3", (int)v);
    if (sp && sp->version != v)
        return zi_error_set(err, ZI_EINVAL, "voice: a version 0.%d speaker for a 0.%d model",
                            (int)sp->version, (int)v);
    if (!input || len == 0) return zi_error_set(err, ZI_EINVAL, "input: the text is empty");
    char *norm = NULL;
    int rc = zi_tts_normalize(input, len, "input", &norm, err);
    if (rc) return rc;
    if (!norm[0]) {
        free(norm);
        return zi_error_set(err, ZI_EINVAL,
                            "input: no word to speak (after normalisation only letters a-z "
                            "and numbers are read)");
    }
    const char *sep = v == ZI_OUTETTS_0_3 ? "<|space|>" : "<|text_sep|>";
    const char *cstart = v == ZI_OUTETTS_0_3 ? "" : "<|code_start|>";
    const char *cend = v == ZI_OUTETTS_0_3 ? "<|space|>" : "<|code_end|>";
    size_t n_words = 1;
    for (const char *p = norm; *p; p++) n_words += *p == ' ';
    sbuf b = {0};
    int oom = !(out->words = calloc(n_words, sizeof *out->words));
    for (char *p = norm, *e; !oom && p; p = e ? e + 1 : NULL) {
        e = strchr(p, ' ');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char *w = malloc(n + 1);
        if (!w) {
            oom = 1;
            break;
        }
        memcpy(w, p, n);
        w[n] = 0;
        out->words[out->n_words++] = w;
    }
    sb_str(&b, "<|im_start|>\n<|text_start|>");
    for (size_t i = 0; sp && i < sp->n_words; i++) {
        sb_str(&b, sp->words[i].text);
        sb_str(&b, sep);
    }
    for (size_t i = 0; !oom && i < out->n_words; i++) {
        if (i) sb_str(&b, sep);
        sb_str(&b, out->words[i]);
    }
    sb_str(&b, "<|text_end|>\n<|audio_start|>\n");
    char num[32];
    for (size_t i = 0; sp && i < sp->n_words; i++) {
        const zi_tts_word *w = &sp->words[i];
        snprintf(num, sizeof num, "<|t_%d.%02d|>", w->duration_cs / 100, w->duration_cs % 100);
        sb_str(&b, w->text);
        sb_str(&b, num);
        sb_str(&b, cstart);
        for (size_t k = 0; k < w->n_codes; k++) {
            snprintf(num, sizeof num, "<|%d|>", (int)w->codes[k]);
            sb_str(&b, num);
        }
        sb_str(&b, cend);
        sb_str(&b, "\n");
    }
    free(norm);
    if (oom || b.oom) {
        free(b.p);
        zi_tts_prompt_free(out);
        return zi_error_set(err, ZI_ENOMEM, "input: out of memory rendering the prompt");
    }
    out->text = b.p;
    out->len = b.len;
    return ZI_OK;
}
