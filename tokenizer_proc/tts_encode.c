/*
 * tts_encode.c - a speech request's prompt and codec-plan inputs
 * (tts_encode.h).
 */
#include "tts_encode.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codec_mask.h"
#include "read_all.h"
#include "tts_prompt.h"

static int voice_name_ok(const char *s, size_t n) {
    if (n == 0 || n > 64 || s[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

/* The speaker file of voice r->voice under dir, parsed. */
static int load_voice(const char *dir, const zi_request *r, zi_tts_speaker *sp, zi_error *err) {
    const char *v = r->voice.p;
    size_t n = r->voice.len;
    if (!voice_name_ok(v, n))
        return zi_error_set(err, ZI_EINVAL,
                            "voice: a voice name is 1 to 64 of A-Z a-z 0-9 _ . - (not starting "
                            "with '.')");
    if (!dir)
        return zi_error_set(err, ZI_EINVAL,
                            "voice: unknown voice '%.*s' (this server has no voices: --voices DIR)",
                            (int)n, v);
    char path[4400];
    snprintf(path, sizeof path, "%s/%.*s.json", dir, (int)n, v);
    /* Without blocking and only a regular file: a FIFO or a device under
     * the voices directory must not stall the tokenizer's loop. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return zi_error_set(err, ZI_EINVAL, "voice: unknown voice '%.*s'", (int)n, v);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return zi_error_set(err, ZI_EINVAL,
                            "voice: the speaker file of '%.*s' is not a regular file", (int)n, v);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return zi_error_set(err, ZI_ENOMEM, "out of memory");
    }
    char *p = NULL;
    size_t len = 0;
    int rc = zi_read_all(f, (size_t)16 << 20, &p, &len);
    fclose(f);
    if (rc == ZI_ERANGE)
        rc = zi_error_set(err, rc, "voice: the speaker file of '%.*s' is too large", (int)n, v);
    else if (rc == ZI_EIO)
        rc = zi_error_set(err, rc, "voice: cannot read the speaker file of '%.*s'", (int)n, v);
    else if (rc)
        rc = zi_error_set(err, rc, "out of memory");
    char field[128];
    snprintf(field, sizeof field, "voice %.*s", (int)n, v);
    if (!rc) rc = zi_tts_speaker_parse(p, len, field, sp, err);
    free(p);
    return rc;
}

void zi_tts_encoded_free(zi_tts_encoded *e) {
    if (!e) return;
    free(e->ids);
    for (size_t i = 0; i < e->n_words; i++) zi_i32_list_free(&e->words[i]);
    free(e->words);
    memset(e, 0, sizeof *e);
}

int zi_tts_encode(zi_tokenizer *tok, const char *voices_dir, const zi_request *r,
                  zi_tts_encoded *out, zi_error *err) {
    memset(out, 0, sizeof *out);
    zi_tts_speaker sp = {0};
    zi_tts_prompt pr = {0};
    zi_codec_ids ids;
    bool has_voice = r->voice.len > 0 || r->ap_text.len > 0;
    int rc = r->voice.len ? load_voice(voices_dir, r, &sp, err) : ZI_OK;
    if (!rc && r->ap_text.len) /* the seeds' form, split into words by the client's counts */
        rc =
            zi_tts_speaker_from_tokens(r->ap_text.p, r->ap_text.len, r->ap_tokens.v, r->ap_tokens.n,
                                       r->ap_word_codes.v, r->ap_word_codes.n, &sp, err);
    zi_tts_version v = has_voice && !rc ? sp.version : ZI_OUTETTS_0_2;
    if (!rc) rc = zi_codec_ids_find(v, zi_tokenizer_single_id, tok, &ids, err);
    if (!rc)
        rc = zi_tts_render(r->prompt_text.p, r->prompt_text.len, has_voice ? &sp : NULL, v, &pr,
                           err);
    if (!rc) rc = zi_tokenizer_encode(tok, pr.text, pr.len, 1, 1, &out->ids, &out->n, err);
    /* the context's bounds, named here as the client's text, not later as
     * an internal field the worker refuses */
    if (!rc && pr.n_words > ZI_TTS_MAX_WORDS)
        rc = zi_error_set(err, ZI_EINVAL, "input: %zu words once normalised (at most %d)",
                          pr.n_words, ZI_TTS_MAX_WORDS);
    if (!rc && !(out->words = calloc(pr.n_words, sizeof *out->words)))
        rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    /* each word alone, as plain text: how it is tokenized between the
     * prompt's "\n" and its duration token */
    for (size_t i = 0; !rc && i < pr.n_words; i++) {
        int32_t *w = NULL;
        size_t wn = 0;
        out->n_words = i + 1;
        rc = zi_tokenizer_encode(tok, pr.words[i], strlen(pr.words[i]), 0, 0, &w, &wn, err);
        if (!rc && (wn == 0 || wn > ZI_TTS_MAX_WORD_IDS))
            rc = zi_error_set(err, ZI_EINVAL, "input: word %zu encodes to %zu tokens (1 to %d)", i,
                              wn, ZI_TTS_MAX_WORD_IDS);
        if (!rc) rc = zi_i32_list_set(&out->words[i], w, wn, err);
        free(w);
    }
    if (!rc) {
        const int32_t m[8] = {ids.code0,      ids.n_codes,  ids.time0,   ids.n_times,
                              ids.code_start, ids.code_end, ids.newline, ids.audio_end};
        memcpy(out->marker_ids, m, sizeof m);
    }
    zi_tts_prompt_free(&pr);
    zi_tts_speaker_free(&sp);
    if (rc) zi_tts_encoded_free(out);
    return rc;
}
