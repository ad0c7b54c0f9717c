/*
 * http_speech.c - POST /v1/audio/speech's request and answer
 * (http_speech.h).
 */
#include "http_speech.h"

#include <math.h>
#include <string.h>

#include "wav.h"

static void put_str(msgpack_packer *pk, const char *s) {
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static const char *str_or_null(json_t *o, const char *key, zi_http_error *e, int *bad) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return NULL;
    if (!json_is_string(v)) {
        *bad = 1;
        zi_http_want(e, key, "a string", v);
        return NULL;
    }
    return json_string_value(v);
}

int zi_http_speech_request(json_t *o, const char *model, zi_msg *m, int *wav, zi_http_error *e) {
    static const char *const keys[] = {
        "model",        "input", "voice",       "response_format", "speed", "stream_format",
        "instructions", "seed",  "temperature", "top_p",           "top_k", "max_tokens"};
    if (zi_http_known_keys(o, keys, sizeof keys / sizeof *keys, e)) return -1;
    int bad = 0;
    const char *input = str_or_null(o, "input", e, &bad);
    const char *voice = bad ? NULL : str_or_null(o, "voice", e, &bad);
    const char *rf = bad ? NULL : str_or_null(o, "response_format", e, &bad);
    const char *sf = bad ? NULL : str_or_null(o, "stream_format", e, &bad);
    if (bad) return -1;
    if (!input) return zi_http_fail(e, 400, "missing", "input", "input is missing");
    if (!input[0])
        return zi_http_fail(e, 400, "invalid_value", "input", "input: the text is empty");
    *wav = 1;
    if (rf && !strcmp(rf, "pcm"))
        *wav = 0;
    else if (rf && strcmp(rf, "wav"))
        return zi_http_fail(e, 400, "unsupported_value", "response_format",
                            "response_format: '%.40s' is not supported (wav or pcm)", rf);
    if (sf && strcmp(sf, "audio"))
        return zi_http_fail(e, 400, "unsupported_value", "stream_format",
                            "stream_format: '%.40s' is not supported (audio: the bytes as they "
                            "are decoded)",
                            sf);
    json_t *ins = json_object_get(o, "instructions");
    if (ins && !json_is_null(ins))
        return zi_http_fail(e, 400, "unsupported_value", "instructions",
                            "instructions: not supported by this model (the voice is a speaker "
                            "file)");
    json_t *sp = json_object_get(o, "speed");
    if (sp && !json_is_null(sp)) {
        if (!json_is_number(sp)) return zi_http_want(e, "speed", "a number", sp);
        if (json_number_value(sp) != 1.0)
            return zi_http_fail(e, 400, "unsupported_value", "speed",
                                "speed: only 1 is supported (got %g)", json_number_value(sp));
    }
    /* sampling: zinfer's additions, under the names the completions API uses */
    static const char *const num[] = {"temperature", "top_p"};
    static const char *const ints[] = {"seed", "top_k", "max_tokens"};
    static const char *const sp_name[] = {"temperature", "top_p", "seed", "top_k",
                                          "max_new_tokens"};
    json_t *vals[5];
    int n_sp = 0;
    for (int i = 0; i < 2; i++) {
        vals[i] = json_object_get(o, num[i]);
        if (vals[i] && json_is_null(vals[i])) vals[i] = NULL;
        if (vals[i] && !json_is_number(vals[i]))
            return zi_http_want(e, num[i], "a number", vals[i]);
        n_sp += vals[i] != NULL;
    }
    for (int i = 0; i < 3; i++) {
        vals[2 + i] = json_object_get(o, ints[i]);
        if (vals[2 + i] && json_is_null(vals[2 + i])) vals[2 + i] = NULL;
        if (vals[2 + i] && !json_is_integer(vals[2 + i]))
            return zi_http_want(e, ints[i], "an integer", vals[2 + i]);
        n_sp += vals[2 + i] != NULL;
    }
    zi_msg_init(m);
    msgpack_packer *pk = &m->pk;
    msgpack_pack_map(pk, 5 + (voice != NULL) + (n_sp > 0));
    const char *kv[] = {"op",     "speech", "id",         "s",   "input", input,
                        "format", "s16",    "model_name", model, "voice", voice};
    for (int i = 0; i < 12; i += 2)
        if (kv[i + 1]) put_str(pk, kv[i]), put_str(pk, kv[i + 1]);
    if (n_sp) {
        put_str(pk, "sampling_params");
        msgpack_pack_map(pk, (size_t)n_sp);
        for (int i = 0; i < 5; i++) {
            if (!vals[i]) continue;
            put_str(pk, sp_name[i]);
            if (i < 2)
                msgpack_pack_double(pk, json_number_value(vals[i]));
            else
                msgpack_pack_int64(pk, json_integer_value(vals[i]));
        }
    }
    return 0;
}

size_t zi_http_speech_wav_header(uint8_t *buf, size_t n_samples, int rate) {
    return zi_wav_header(buf, (uint32_t)n_samples, (uint32_t)rate, 0);
}
