/*
 * tts_cmd.c - the OuteTTS prompt and codec plan for `zinfer generate
 * --tts` (tts_cmd.h).
 */
#include "tts_cmd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "read_all.h"
#include "tts_prompt.h"

/* The --tts-speaker file (at most 64 MiB), *data malloc'd. */
static int read_file(const char *path, char **data, size_t *len, zi_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return zi_error_set(err, ZI_EIO, "--tts-speaker %s: cannot open it", path);
    int rc = zi_read_all(f, (size_t)64 << 20, data, len);
    fclose(f);
    if (rc == ZI_ERANGE) return zi_error_set(err, rc, "--tts-speaker %s: too large", path);
    if (rc == ZI_EIO) return zi_error_set(err, rc, "--tts-speaker %s: read error", path);
    return rc ? zi_error_set(err, rc, "out of memory") : ZI_OK;
}

void zi_cli_tts_free(zi_cli_tts *t) {
    if (!t) return;
    free(t->prompt);
    free(t->ids);
    zi_codec_plan_free(t->plan);
    memset(t, 0, sizeof *t);
}

int zi_cli_tts_prepare(zi_tokenizer *tok, const char *text, size_t len, const char *speaker_file,
                       zi_cli_tts *t, zi_error *err) {
    memset(t, 0, sizeof *t);
    zi_tts_speaker sp = {0};
    zi_tts_prompt pr = {0};
    zi_codec_ids ids;
    int32_t **wids = NULL;
    size_t *wn = NULL;
    int rc = ZI_OK;
    if (speaker_file) {
        char *json = NULL, field[4200];
        size_t jlen = 0;
        snprintf(field, sizeof field, "--tts-speaker %s", speaker_file);
        rc = read_file(speaker_file, &json, &jlen, err);
        if (!rc) rc = zi_tts_speaker_parse(json, jlen, field, &sp, err);
        free(json);
    }
    zi_tts_version v = speaker_file && !rc ? sp.version : ZI_OUTETTS_0_2;
    if (!rc) rc = zi_codec_ids_find(v, zi_tokenizer_single_id, tok, &ids, err);
    if (!rc) rc = zi_tts_render(text, len, speaker_file ? &sp : NULL, v, &pr, err);
    if (!rc) rc = zi_tokenizer_encode(tok, pr.text, pr.len, 1, 1, &t->ids, &t->n, err);
    if (!rc &&
        (!(wids = calloc(pr.n_words, sizeof *wids)) || !(wn = calloc(pr.n_words, sizeof *wn))))
        rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    /* each word alone, as plain text: how it is tokenized between the
     * prompt's "\n" and its duration token */
    for (size_t i = 0; !rc && i < pr.n_words; i++)
        rc =
            zi_tokenizer_encode(tok, pr.words[i], strlen(pr.words[i]), 0, 0, &wids[i], &wn[i], err);
    if (!rc)
        rc =
            zi_codec_plan_create(&ids, (const int32_t *const *)wids, wn, pr.n_words, &t->plan, err);
    for (size_t i = 0; wids && i < pr.n_words; i++) free(wids[i]);
    free(wids);
    free(wn);
    if (!rc) {
        t->prompt = pr.text;
        pr.text = NULL;
        t->audio_end = ids.audio_end;
    }
    zi_tts_prompt_free(&pr);
    zi_tts_speaker_free(&sp);
    return rc;
}
