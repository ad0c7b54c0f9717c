/*
 * codec_mask.c - the OuteTTS audio section as a token-level state machine
 * (codec_mask.h).
 */
#include "codec_mask.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tts_prompt.h"

struct zi_codec_plan {
    zi_codec_ids ids;
    int32_t *tok; /* every word's tokens, in order */
    size_t *off;  /* [n_words + 1]: word i is tok[off[i] .. off[i + 1]) */
    size_t n_words;
};

int zi_codec_ids_find(int version, zi_codec_lookup_fn lookup, void *user, zi_codec_ids *ids,
                      zi_error *err) {
    memset(ids, 0, sizeof *ids);
    char name[32];
    ids->code0 = lookup(user, "<|0|>");
    ids->n_codes = ZI_TTS_CODEC_TOKENS;
    ids->time0 = lookup(user, "<|t_0.00|>");
    ids->n_times = ZI_TTS_MAX_DURATION_CS + 1;
    ids->code_start = version == ZI_OUTETTS_0_3 ? -1 : lookup(user, "<|code_start|>");
    ids->code_end = lookup(user, version == ZI_OUTETTS_0_3 ? "<|space|>" : "<|code_end|>");
    ids->newline = lookup(user, "\n");
    ids->audio_end = lookup(user, "<|audio_end|>");
    const char *missing = ids->code0 < 0                                     ? "<|0|>"
                          : ids->time0 < 0                                   ? "<|t_0.00|>"
                          : version != ZI_OUTETTS_0_3 && ids->code_start < 0 ? "<|code_start|>"
                          : ids->code_end < 0
                              ? (version == ZI_OUTETTS_0_3 ? "<|space|>" : "<|code_end|>")
                          : ids->newline < 0   ? "\\n"
                          : ids->audio_end < 0 ? "<|audio_end|>"
                                               : NULL;
    if (missing)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "not an OuteTTS 0.%d codec model: its vocabulary has no %s token",
                            version, missing);
    /* the ends of both ranges, and a sample inside, where OuteTTS puts them */
    const int32_t probes[4][2] = {{ids->n_codes - 1, ids->code0 + ids->n_codes - 1},
                                  {ids->n_codes / 2, ids->code0 + ids->n_codes / 2},
                                  {ids->n_times - 1, ids->time0 + ids->n_times - 1},
                                  {ids->n_times / 2, ids->time0 + ids->n_times / 2}};
    for (int k = 0; k < 4; k++) {
        if (k < 2)
            snprintf(name, sizeof name, "<|%d|>", (int)probes[k][0]);
        else
            snprintf(name, sizeof name, "<|t_%d.%02d|>", (int)probes[k][0] / 100,
                     (int)probes[k][0] % 100);
        if (lookup(user, name) != probes[k][1])
            return zi_error_set(err, ZI_EUNSUPPORTED,
                                "not an OuteTTS codec model: token %s is not at id %d", name,
                                (int)probes[k][1]);
    }
    return ZI_OK;
}

int zi_codec_plan_create(const zi_codec_ids *ids, const int32_t *const *word_ids,
                         const size_t *n_word_ids, size_t n_words, zi_codec_plan **out,
                         zi_error *err) {
    *out = NULL;
    if (n_words == 0) return zi_error_set(err, ZI_EINVAL, "input: no word to speak");
    size_t total = 0;
    for (size_t i = 0; i < n_words; i++) {
        if (n_word_ids[i] == 0)
            return zi_error_set(err, ZI_EINVAL, "input: word %zu encodes to no token", i);
        total += n_word_ids[i];
    }
    zi_codec_plan *p = calloc(1, sizeof *p);
    if (p) p->tok = malloc(total * sizeof *p->tok), p->off = malloc((n_words + 1) * sizeof *p->off);
    if (!p || !p->tok || !p->off) {
        zi_codec_plan_free(p);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for the codec plan");
    }
    p->ids = *ids;
    p->n_words = n_words;
    size_t k = 0;
    for (size_t i = 0; i < n_words; i++) {
        p->off[i] = k;
        memcpy(p->tok + k, word_ids[i], n_word_ids[i] * sizeof *p->tok);
        k += n_word_ids[i];
    }
    p->off[n_words] = k;
    *out = p;
    return ZI_OK;
}

void zi_codec_plan_free(zi_codec_plan *p) {
    if (!p) return;
    free(p->tok);
    free(p->off);
    free(p);
}

const zi_codec_ids *zi_codec_plan_ids(const zi_codec_plan *p) {
    return &p->ids;
}

/* Where the audio section stands: inside word `word` at token `k` of it
 * (ST_WORD), or after it waiting for its duration, <|code_start|>, its
 * first code, more codes or <|code_end|>, the newline; ST_END after the
 * last word's newline; ST_BAD after a token the plan did not allow. */
enum { ST_WORD, ST_TIME, ST_CSTART, ST_CODE1, ST_CODE, ST_NL, ST_END, ST_BAD };

typedef struct pos {
    int st;
    size_t word, k;
} pos;

static int in_range(int32_t t, int32_t first, int32_t n) {
    return t >= first && t - first < n;
}

static pos advance(const zi_codec_plan *p, pos s, int32_t t) {
    const zi_codec_ids *id = &p->ids;
    switch (s.st) {
    case ST_WORD:
        if (t != p->tok[p->off[s.word] + s.k]) break;
        if (++s.k == p->off[s.word + 1] - p->off[s.word]) s.st = ST_TIME;
        return s;
    case ST_TIME:
        if (!in_range(t, id->time0, id->n_times)) break;
        s.st = id->code_start >= 0 ? ST_CSTART : ST_CODE1;
        return s;
    case ST_CSTART:
        if (t != id->code_start) break;
        s.st = ST_CODE1;
        return s;
    case ST_CODE1:
    case ST_CODE:
        if (in_range(t, id->code0, id->n_codes)) {
            s.st = ST_CODE;
            return s;
        }
        if (s.st == ST_CODE1 || t != id->code_end) break;
        s.st = ST_NL;
        return s;
    case ST_NL:
        if (t != id->newline) break;
        if (++s.word == p->n_words) {
            s.st = ST_END;
        } else {
            s.st = ST_WORD;
            s.k = 0;
        }
        return s;
    default:
        break;
    }
    s.st = ST_BAD;
    return s;
}

static void allow(int32_t *mask, int32_t n_vocab, int32_t t) {
    if (t >= 0 && t < n_vocab) mask[t >> 5] |= (int32_t)(1u << (t & 31));
}

static void allow_range(int32_t *mask, int32_t n_vocab, int32_t first, int32_t n) {
    for (int32_t t = first; t < first + n; t++) allow(mask, n_vocab, t);
}

void zi_codec_plan_mask(const zi_codec_plan *p, const int32_t *gen, size_t n_gen, int32_t n_vocab,
                        int32_t *mask) {
    pos s = {ST_WORD, 0, 0};
    for (size_t i = 0; i < n_gen && s.st != ST_BAD; i++) s = advance(p, s, gen[i]);
    memset(mask, 0, ((size_t)n_vocab + 31) / 32 * sizeof *mask);
    const zi_codec_ids *id = &p->ids;
    switch (s.st) {
    case ST_WORD:
        allow(mask, n_vocab, p->tok[p->off[s.word] + s.k]);
        break;
    case ST_TIME:
        allow_range(mask, n_vocab, id->time0, id->n_times);
        break;
    case ST_CSTART:
        allow(mask, n_vocab, id->code_start);
        break;
    case ST_CODE:
        allow(mask, n_vocab, id->code_end);
        /* fall through */
    case ST_CODE1:
        allow_range(mask, n_vocab, id->code0, id->n_codes);
        break;
    case ST_NL:
        allow(mask, n_vocab, id->newline);
        break;
    default:
        allow(mask, n_vocab, id->audio_end);
        break;
    }
}

size_t zi_codec_extract(const zi_codec_ids *ids, const int32_t *tokens, size_t n, int32_t *codes) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (in_range(tokens[i], ids->code0, ids->n_codes)) codes[k++] = tokens[i] - ids->code0;
    return k;
}
