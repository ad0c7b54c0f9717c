/*
 * codec_encode.c - the encoders of codec.h, and encoding to bytes. An
 * encoder refuses what its own decoder would refuse, so a bad value fails
 * where it was made rather than at the peer.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codec_internal.h"
#include "utf8.h"

/* ---- encoders -------------------------------------------------------------- */

/* Encoders refuse strings their own decoder would refuse, so a bad string
 * fails where it was made rather than at the peer. */
static int enc_str_ok(const zi_string *s, const char *name, size_t i, zi_error *err) {
    if (!s->p || zi_utf8_bad_at(s->p, s->len) == s->len) return ZI_OK;
    if (i == SIZE_MAX) return zi_error_set(err, ZI_EINVAL, "%s: not valid UTF-8", name);
    return zi_error_set(err, ZI_EINVAL, "%s[%zu]: not valid UTF-8", name, i);
}

/* Identifiers: also short and free of NUL bytes, as the decoder wants. */
static int enc_id_ok(const zi_string *s, const char *name, zi_error *err) {
    if (s->len > ZI_CODEC_ID_MAX_BYTES)
        return zi_error_set(err, ZI_EINVAL, "%s: %zu bytes exceed the limit of %d", name, s->len,
                            ZI_CODEC_ID_MAX_BYTES);
    if (s->len && memchr(s->p, 0, s->len))
        return zi_error_set(err, ZI_EINVAL, "%s: contains a NUL byte", name);
    return enc_str_ok(s, name, SIZE_MAX, err);
}

static int enc_list_ok(const zi_str_list *l, const char *name, zi_error *err) {
    for (size_t i = 0; i < l->n; i++) {
        int rc = enc_str_ok(&l->v[i], name, i, err);
        if (rc) return rc;
    }
    return ZI_OK;
}

#define P(expr)                                                                                    \
    do {                                                                                           \
        if ((expr) != 0) return zi_error_set(err, ZI_ENOMEM, "encode: out of memory");             \
    } while (0)

static int pack_key(msgpack_packer *pk, const char *k) {
    return msgpack_pack_str_with_body(pk, k, strlen(k));
}

/* Never hands msgpack a NULL source, even for zero bytes. */
static int pack_str(msgpack_packer *pk, const char *p, size_t n) {
    return msgpack_pack_str_with_body(pk, p ? p : "", p ? n : 0);
}

/* A request's or context's "lora": [{"id" or "name", "scale"}]. */
static int pack_lora(msgpack_packer *pk, const zi_lora_ref *l, size_t n) {
    if (msgpack_pack_array(pk, n)) return -1;
    for (size_t i = 0; i < n; i++) {
        if (msgpack_pack_map(pk, 2)) return -1;
        if (l[i].id >= 0 ? pack_key(pk, "id") || msgpack_pack_int32(pk, l[i].id)
                         : pack_key(pk, "name") || pack_key(pk, l[i].name))
            return -1;
        if (pack_key(pk, "scale") || msgpack_pack_double(pk, l[i].scale)) return -1;
    }
    return 0;
}

static int pack_np_header(msgpack_packer *pk, const char *dtype, size_t n, size_t bytes) {
    if (msgpack_pack_map(pk, 4) || pack_key(pk, "__np__") || msgpack_pack_true(pk) ||
        pack_key(pk, "dtype") || pack_key(pk, dtype) || pack_key(pk, "shape") ||
        msgpack_pack_array(pk, 1) || msgpack_pack_uint64(pk, n) || pack_key(pk, "data") ||
        msgpack_pack_bin(pk, bytes))
        return -1;
    return 0;
}

/* One element's bits, widened to 64: token ids go out as int64 (sign
 * extended), floats as their float32 bits. */
static uint64_t id_bits(const void *v, size_t i) {
    return (uint64_t)(int64_t)((const int32_t *)v)[i];
}

static uint64_t f32_bits(const void *v, size_t i) {
    uint32_t bits;
    memcpy(&bits, (const float *)v + i, 4);
    return bits;
}

/* A numpy array of n items of `item` bytes (bits(v, i), little-endian),
 * written through a small buffer; `what` names the value in errors. */
static int pack_np(msgpack_packer *pk, const char *what, const char *dtype, size_t item,
                   const void *v, size_t n, uint64_t (*bits)(const void *, size_t), zi_error *err) {
    if (!pk || (!v && n)) return zi_error_set(err, ZI_EINVAL, "%s: NULL pointer", what);
    if (n > UINT32_MAX / item)
        return zi_error_set(err, ZI_ERANGE, "%s: %zu is too many to encode", what, n);
    P(pack_np_header(pk, dtype, n, n * item));
    uint8_t buf[512]; /* a whole number of items of 4 or 8 bytes */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t x = bits(v, i);
        for (size_t b = 0; b < item; b++) buf[k++] = (uint8_t)(x >> (8 * b));
        if (k == sizeof buf) {
            P(msgpack_pack_bin_body(pk, buf, k));
            k = 0;
        }
    }
    if (k) P(msgpack_pack_bin_body(pk, buf, k));
    return ZI_OK;
}

int zi_codec_pack_tokens(msgpack_packer *pk, const int32_t *ids, size_t n, zi_error *err) {
    return pack_np(pk, "tokens", "int64", 8, ids, n, id_bits, err);
}

int zi_codec_pack_f32(msgpack_packer *pk, const float *v, size_t n, zi_error *err) {
    return pack_np(pk, "values", "float32", 4, v, n, f32_bits, err);
}

static int pack_i32_array(msgpack_packer *pk, const zi_i32_list *l) {
    if (msgpack_pack_array(pk, l->n)) return -1;
    for (size_t i = 0; i < l->n; i++)
        if (msgpack_pack_int32(pk, l->v[i])) return -1;
    return 0;
}

static int pack_str_list(msgpack_packer *pk, const zi_str_list *l) {
    if (msgpack_pack_array(pk, l->n)) return -1;
    for (size_t i = 0; i < l->n; i++)
        if (pack_str(pk, l->v[i].p, l->v[i].len)) return -1;
    return 0;
}

int zi_codec_pack_sampling_params(msgpack_packer *pk, const zi_sampling_params *sp, zi_error *err) {
    if (!pk || !sp) return zi_error_set(err, ZI_EINVAL, "sampling_params: NULL pointer");
    int rc = zi_sampling_params_validate(sp, "sampling_params", err);
    if (!rc) rc = enc_list_ok(&sp->stop, "sampling_params.stop", err);
    if (rc) return rc;
    P(msgpack_pack_map(pk, 14 + (sp->logit_bias.n > 0) + !sp->speculate));
    P(pack_key(pk, "top_k") || msgpack_pack_int32(pk, sp->top_k));
    P(pack_key(pk, "top_p") || msgpack_pack_double(pk, sp->top_p));
    P(pack_key(pk, "min_p") || msgpack_pack_double(pk, sp->min_p));
    P(pack_key(pk, "temperature") || msgpack_pack_double(pk, sp->temperature));
    P(pack_key(pk, "frequency_penalty") || msgpack_pack_double(pk, sp->frequency_penalty));
    P(pack_key(pk, "presence_penalty") || msgpack_pack_double(pk, sp->presence_penalty));
    P(pack_key(pk, "repetition_penalty") || msgpack_pack_double(pk, sp->repetition_penalty));
    P(pack_key(pk, "max_new_tokens") ||
      (sp->max_new_tokens < 0 ? msgpack_pack_nil(pk) : msgpack_pack_int64(pk, sp->max_new_tokens)));
    P(pack_key(pk, "min_new_tokens") || msgpack_pack_int64(pk, sp->min_new_tokens));
    P(pack_key(pk, "ignore_eos") ||
      (sp->ignore_eos ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    P(pack_key(pk, "stop") || (sp->stop.n ? pack_str_list(pk, &sp->stop) : msgpack_pack_nil(pk)));
    P(pack_key(pk, "stop_token_ids") ||
      (sp->stop_token_ids.n ? pack_i32_array(pk, &sp->stop_token_ids) : msgpack_pack_nil(pk)));
    P(pack_key(pk, "detokenize") ||
      (sp->detokenize ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    P(pack_key(pk, "seed") || msgpack_pack_uint64(pk, sp->seed));
    if (sp->logit_bias.n) { /* integer keys: what the decoder reads first */
        P(pack_key(pk, "logit_bias") || msgpack_pack_map(pk, sp->logit_bias.n));
        for (size_t i = 0; i < sp->logit_bias.n; i++)
            P(msgpack_pack_int32(pk, sp->logit_bias.v[i].id) ||
              msgpack_pack_float(pk, sp->logit_bias.v[i].bias));
    }
    if (!sp->speculate) P(pack_key(pk, "speculate") || msgpack_pack_false(pk));
    return ZI_OK;
}

/* Writes pre-encoded msgpack bytes, after checking they hold one object. */
static int pack_raw(msgpack_packer *pk, const zi_bytes *b, const char *name, zi_error *err) {
    int rc = zi_msgpack_check(b->p, b->len, NULL, err);
    if (rc) return zi_error_prefix(err, "%s", name);
    P(pk->callback(pk->data, (const char *)b->p, b->len));
    return ZI_OK;
}

int zi_codec_pack_request(msgpack_packer *pk, const zi_request *r, zi_error *err) {
    if (!pk || !r) return zi_error_set(err, ZI_EINVAL, "request: NULL pointer");
    if (!r->id.len) return zi_error_set(err, ZI_EINVAL, "id: must not be empty");
    bool has_prompt = r->prompt_kind == ZI_PROMPT_TEXT || r->prompt_kind == ZI_PROMPT_TOKENS;
    if (has_prompt == (r->n_messages > 0))
        return zi_error_set(err, ZI_EINVAL,
                            "prompt: exactly one of prompt and messages is required");
    int rc;
    if ((rc = enc_id_ok(&r->id, "id", err)) ||
        (rc = enc_id_ok(&r->model_name, "model_name", err)) ||
        (rc = enc_str_ok(&r->prompt_text, "prompt", SIZE_MAX, err)) ||
        (rc = enc_id_ok(&r->request_path, "request_path", err)) ||
        (rc = enc_list_ok(&r->stop, "stop", err)))
        return rc;
    for (size_t i = 0; i < r->n_messages; i++) {
        if ((rc = enc_str_ok(&r->messages[i].role, "messages.role", i, err)) ||
            (rc = enc_str_ok(&r->messages[i].content, "messages.content", i, err)) ||
            (rc = enc_str_ok(&r->messages[i].tool_call_id, "messages.tool_call_id", i, err)) ||
            (rc = enc_str_ok(&r->messages[i].name, "messages.name", i, err)) ||
            (rc = enc_str_ok(&r->messages[i].reasoning_content, "messages.reasoning_content", i,
                             err)))
            return rc;
    }
    if ((rc = zi_sampling_params_validate(&r->sampling_params, "sampling_params", err))) return rc;
    if (r->n_images && r->prompt_kind == ZI_PROMPT_TOKENS)
        return zi_error_set(err, ZI_EINVAL, "images: a prompt of token ids cannot place images");
    for (size_t i = 0; i < r->n_images; i++)
        if (!r->images[i].len || r->images[i].len > UINT32_MAX)
            return zi_error_set(err, ZI_EINVAL, "images[%zu]: %zu bytes is no image msgpack holds",
                                i, r->images[i].len);
    /* Nine keys always, the rest when set. */
    size_t n = 9 + (has_prompt ? 1 : 0) + (r->n_messages ? 1 : 0) + (r->stop.n ? 1 : 0) +
               (r->response_format.len ? 1 : 0) + (r->tools.len ? 1 : 0) +
               (r->chat_template_options.len ? 1 : 0) + (r->grammar.len ? 1 : 0) +
               (r->regex.len ? 1 : 0) + (r->timeout_ms ? 1 : 0) + (r->max_thinking_tokens ? 1 : 0) +
               (r->skip_special_tokens ? 0 : 1) + (r->n_images ? 1 : 0) + (r->n_lora ? 1 : 0) +
               (r->has_keep_alive ? 1 : 0) +
               (r->speech ? 2 + (r->voice.len ? 1 : 0) + (r->ap_text.len ? 3 : 0) : 0);
    P(msgpack_pack_map(pk, n));
    if (r->speech) { /* "input" takes the place of "prompt" */
        P(pack_key(pk, "op") || pack_key(pk, "speech") || pack_key(pk, "format") ||
          pack_key(pk, r->speech_format ? "s16" : "f32"));
        if (r->voice.len) P(pack_key(pk, "voice") || pack_str(pk, r->voice.p, r->voice.len));
        if (r->ap_text.len)
            P(pack_key(pk, "audio_prompt_transcription") ||
              pack_str(pk, r->ap_text.p, r->ap_text.len) || pack_key(pk, "audio_prompt_tokens") ||
              pack_i32_array(pk, &r->ap_tokens) || pack_key(pk, "audio_prompt_word_codes") ||
              pack_i32_array(pk, &r->ap_word_codes));
    }
    P(pack_key(pk, "id") || pack_str(pk, r->id.p, r->id.len));
    P(pack_key(pk, "index") || msgpack_pack_int64(pk, r->index));
    P(pack_key(pk, "model_name") || pack_str(pk, r->model_name.p, r->model_name.len));
    if (r->prompt_kind == ZI_PROMPT_TEXT)
        P(pack_key(pk, r->speech ? "input" : "prompt") ||
          pack_str(pk, r->prompt_text.p, r->prompt_text.len));
    if (r->prompt_kind == ZI_PROMPT_TOKENS) {
        P(pack_key(pk, "prompt"));
        if ((rc = zi_codec_pack_tokens(pk, r->prompt_tokens.v, r->prompt_tokens.n, err))) return rc;
    }
    if (r->n_messages) {
        P(pack_key(pk, "messages") || msgpack_pack_array(pk, r->n_messages));
        for (size_t i = 0; i < r->n_messages; i++) {
            const zi_message *m = &r->messages[i];
            P(msgpack_pack_map(pk, 2 + (m->tool_calls.len ? 1 : 0) + (m->tool_call_id.len ? 1 : 0) +
                                       (m->name.len ? 1 : 0) +
                                       (m->reasoning_content.len ? 1 : 0)) ||
              pack_key(pk, "role") || pack_str(pk, m->role.p, m->role.len) ||
              pack_key(pk, "content") ||
              (m->content_null ? msgpack_pack_nil(pk)
                               : pack_str(pk, m->content.p, m->content.len)));
            if (m->tool_calls.len) {
                P(pack_key(pk, "tool_calls"));
                if ((rc = pack_raw(pk, &m->tool_calls, "messages.tool_calls", err))) return rc;
            }
            if (m->tool_call_id.len)
                P(pack_key(pk, "tool_call_id") ||
                  pack_str(pk, m->tool_call_id.p, m->tool_call_id.len));
            if (m->name.len) P(pack_key(pk, "name") || pack_str(pk, m->name.p, m->name.len));
            if (m->reasoning_content.len)
                P(pack_key(pk, "reasoning_content") ||
                  pack_str(pk, m->reasoning_content.p, m->reasoning_content.len));
        }
    }
    if (r->n_images) {
        P(pack_key(pk, "images") || msgpack_pack_array(pk, r->n_images));
        for (size_t i = 0; i < r->n_images; i++)
            P(msgpack_pack_bin_with_body(pk, r->images[i].p, r->images[i].len));
    }
    if (r->tools.len) {
        P(pack_key(pk, "tools"));
        if ((rc = pack_raw(pk, &r->tools, "tools", err))) return rc;
    }
    if (r->response_format.len) {
        P(pack_key(pk, "response_format"));
        if ((rc = pack_raw(pk, &r->response_format, "response_format", err))) return rc;
    }
    if (r->grammar.len) P(pack_key(pk, "grammar") || pack_str(pk, r->grammar.p, r->grammar.len));
    if (r->regex.len) P(pack_key(pk, "regex") || pack_str(pk, r->regex.p, r->regex.len));
    P(pack_key(pk, "timestamp_ns") || msgpack_pack_int64(pk, r->timestamp_ns));
    if (r->timeout_ms) P(pack_key(pk, "timeout_ms") || msgpack_pack_int64(pk, r->timeout_ms));
    if (r->has_keep_alive) { /* in ms, which only a string can say */
        char ka[32];
        snprintf(ka, sizeof ka, "%lldms", (long long)r->keep_alive_ms);
        P(pack_key(pk, "keep_alive") ||
          pack_str(pk, r->keep_alive_ms < 0 ? "-1" : ka, strlen(r->keep_alive_ms < 0 ? "-1" : ka)));
    }
    if (r->max_thinking_tokens)
        P(pack_key(pk, "max_thinking_tokens") || msgpack_pack_int64(pk, r->max_thinking_tokens));
    if (!r->skip_special_tokens) P(pack_key(pk, "skip_special_tokens") || msgpack_pack_false(pk));
    if (r->n_lora) P(pack_key(pk, "lora") || pack_lora(pk, r->lora, r->n_lora));
    P(pack_key(pk, "request_path") ||
      (r->request_path.len ? pack_str(pk, r->request_path.p, r->request_path.len)
                           : pack_str(pk, "/", 1)));
    P(pack_key(pk, "logprobs") || msgpack_pack_int64(pk, r->logprobs));
    P(pack_key(pk, "echo") || (r->echo ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    if (r->stop.n) P(pack_key(pk, "stop") || pack_str_list(pk, &r->stop));
    if (r->chat_template_options.len) {
        P(pack_key(pk, "chat_template_options"));
        if ((rc = pack_raw(pk, &r->chat_template_options, "chat_template_options", err))) return rc;
    }
    P(pack_key(pk, "sampling_params"));
    if ((rc = zi_codec_pack_sampling_params(pk, &r->sampling_params, err))) return rc;
    P(pack_key(pk, "stream") || (r->stream ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    return ZI_OK;
}

int zi_codec_pack_logprobs(msgpack_packer *pk, const zi_logprobs *lp, zi_error *err) {
    if (!pk || !lp) return zi_error_set(err, ZI_EINVAL, "log_probabilities: NULL pointer");
    for (size_t i = 0; i < lp->n; i++) {
        float t = lp->token_logprobs[i];
        if (isnan(t) || (isinf(t) && t > 0))
            return zi_error_set(err, ZI_EINVAL,
                                "token_log_probabilities[%zu]: %g is not a log probability", i,
                                (double)t);
        for (size_t j = 0; j < lp->top[i].n; j++) {
            float x = lp->top[i].logprobs[j];
            if (lp->top[i].ids[j] < 0 || isnan(x) || (isinf(x) && x > 0))
                return zi_error_set(err, ZI_EINVAL,
                                    "top_log_probabilities[%zu]: entry %zu is invalid", i, j);
        }
    }
    P(msgpack_pack_map(pk, 2) || pack_key(pk, "token_log_probabilities"));
    int rc = zi_codec_pack_f32(pk, lp->token_logprobs, lp->n, err);
    if (rc) return rc;
    P(pack_key(pk, "top_log_probabilities") || msgpack_pack_array(pk, lp->n));
    for (size_t i = 0; i < lp->n; i++) {
        P(msgpack_pack_map(pk, lp->top[i].n));
        for (size_t j = 0; j < lp->top[i].n; j++)
            P(msgpack_pack_int32(pk, lp->top[i].ids[j]) ||
              msgpack_pack_float(pk, lp->top[i].logprobs[j]));
    }
    return ZI_OK;
}

int zi_codec_pack_text_response(msgpack_packer *pk, const zi_text_response *r, zi_error *err) {
    if (!pk || !r) return zi_error_set(err, ZI_EINVAL, "text_response: NULL pointer");
    if (r->is_text) {
        int rc = enc_str_ok(&r->text, "next_token", SIZE_MAX, err);
        if (rc) return rc;
    } else if (r->token < 0) {
        return zi_error_set(err, ZI_EINVAL, "next_token: %d is not a token id", (int)r->token);
    }
    P(msgpack_pack_map(pk, 2) || pack_key(pk, "next_token"));
    P(r->is_text ? pack_str(pk, r->text.p, r->text.len) : msgpack_pack_int32(pk, r->token));
    P(pack_key(pk, "log_probabilities"));
    if (!r->logprobs)
        P(msgpack_pack_nil(pk));
    else
        return zi_codec_pack_logprobs(pk, r->logprobs, err);
    return ZI_OK;
}

int zi_codec_pack_text_generation_response(msgpack_packer *pk, const zi_text_generation_response *r,
                                           zi_error *err) {
    if (!pk || !r) return zi_error_set(err, ZI_EINVAL, "text_generation_response: NULL pointer");
    const char *st = zi_gen_status_name(r->final_status);
    if (!st)
        return zi_error_set(err, ZI_EINVAL, "final_status: %d is not a status",
                            (int)r->final_status);
    P(msgpack_pack_map(pk, 2) || pack_key(pk, "tokens") || msgpack_pack_array(pk, r->n));
    for (size_t i = 0; i < r->n; i++) {
        int rc = zi_codec_pack_text_response(pk, &r->tokens[i], err);
        if (rc) return rc;
    }
    P(pack_key(pk, "final_status") || pack_key(pk, st));
    return ZI_OK;
}

/* One image of a context (zi_ctx_image; its embd stays behind): pixels as
 * one bin of float32 little-endian. */
static int pack_image(msgpack_packer *pk, const zi_ctx_image *im, zi_error *err) {
    size_t n = (size_t)im->n_tiles * (size_t)im->tile_size * (size_t)im->tile_size * 3;
    if (n * 4 > UINT32_MAX)
        return zi_error_set(err, ZI_EINVAL, "images: %zu pixel values exceed one msgpack bin", n);
    P(msgpack_pack_map(pk, 7));
    P(pack_key(pk, "hash") || msgpack_pack_uint64(pk, im->hash));
    P(pack_key(pk, "n_tiles") || msgpack_pack_int32(pk, im->n_tiles));
    P(pack_key(pk, "tile_size") || msgpack_pack_int32(pk, im->tile_size));
    P(pack_key(pk, "tile_tokens") || msgpack_pack_int32(pk, im->tile_tokens));
    P(pack_key(pk, "tile_first"));
    int rc = zi_codec_pack_tokens(pk, im->tile_first, (size_t)im->n_tiles, err);
    if (rc) return rc;
    P(pack_key(pk, "non_causal") ||
      (im->non_causal ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    P(pack_key(pk, "pixels") || msgpack_pack_bin(pk, n * 4));
    /* little-endian on the wire, whatever the host: in pieces */
    uint8_t buf[4096];
    for (size_t k = 0; k < n;) {
        size_t m = 0;
        for (; k < n && m + 4 <= sizeof buf; k++, m += 4) {
            uint32_t u;
            memcpy(&u, &im->pixels[k], 4);
            buf[m] = (uint8_t)u, buf[m + 1] = (uint8_t)(u >> 8);
            buf[m + 2] = (uint8_t)(u >> 16), buf[m + 3] = (uint8_t)(u >> 24);
        }
        P(msgpack_pack_bin_body(pk, buf, m));
    }
    return ZI_OK;
}

int zi_codec_pack_text_context(msgpack_packer *pk, const zi_text_context *c, zi_error *err) {
    if (!pk || !c) return zi_error_set(err, ZI_EINVAL, "context: NULL pointer");
    int rc = zi_text_context_check(c, err);
    if (!rc) rc = enc_id_ok(&c->request_id, "request_id", err);
    if (!rc) rc = enc_str_ok(&c->prompt, "prompt", SIZE_MAX, err);
    if (!rc) rc = enc_str_ok(&c->json_schema, "json_schema", SIZE_MAX, err);
    if (!rc) rc = enc_str_ok(&c->grammar, "grammar", SIZE_MAX, err);
    if (!rc) rc = enc_str_ok(&c->regex, "regex", SIZE_MAX, err);
    if (rc) return rc;
    size_t n_lp = 0;
    for (int64_t i = 0; i < c->end_idx; i++) n_lp += c->lp_data[i] != NULL;
    P(msgpack_pack_map(pk, C_N - (c->grammar.len ? 0 : 1) - (c->regex.len ? 0 : 1) -
                               (c->thinking_budget ? 0 : 4) - (c->n_images ? 0 : 1) -
                               (c->n_lora ? 0 : 1) - (c->n_tts_words ? 0 : 1)));
    P(pack_key(pk, "request_id") || pack_str(pk, c->request_id.p, c->request_id.len));
    P(pack_key(pk, "prompt") ||
      (c->prompt.len ? pack_str(pk, c->prompt.p, c->prompt.len) : msgpack_pack_nil(pk)));
    P(pack_key(pk, "max_length") || msgpack_pack_int64(pk, c->max_length));
    P(pack_key(pk, "tokens"));
    if ((rc = zi_codec_pack_tokens(pk, c->tokens, (size_t)c->end_idx, err))) return rc;
    P(pack_key(pk, "eos_token_ids") || pack_i32_array(pk, &c->eos_token_ids));
    P(pack_key(pk, "eos_sequences") || msgpack_pack_array(pk, c->n_eos_sequences));
    for (size_t i = 0; i < c->n_eos_sequences; i++) P(pack_i32_array(pk, &c->eos_sequences[i]));
    P(pack_key(pk, "log_probabilities") ||
      (c->log_probabilities ? msgpack_pack_int64(pk, c->log_probabilities) : msgpack_pack_nil(pk)));
    P(pack_key(pk, "log_probabilities_echo") ||
      (c->log_probabilities_echo ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    P(pack_key(pk, "ignore_eos") ||
      (c->ignore_eos ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    P(pack_key(pk, "json_schema") ||
      (c->has_json_schema ? pack_str(pk, c->json_schema.p, c->json_schema.len)
                          : msgpack_pack_nil(pk)));
    if (c->grammar.len) P(pack_key(pk, "grammar") || pack_str(pk, c->grammar.p, c->grammar.len));
    if (c->regex.len) P(pack_key(pk, "regex") || pack_str(pk, c->regex.p, c->regex.len));
    if (c->thinking_budget)
        P(pack_key(pk, "thinking_budget") || msgpack_pack_int64(pk, c->thinking_budget) ||
          pack_key(pk, "thinking_open") ||
          (c->thinking_open ? msgpack_pack_true(pk) : msgpack_pack_false(pk)) ||
          pack_key(pk, "thinking_end") || pack_i32_array(pk, &c->thinking_end) ||
          pack_key(pk, "thinking_harmony") ||
          (c->thinking_harmony ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    if (c->n_lora) P(pack_key(pk, "lora") || pack_lora(pk, c->lora, c->n_lora));
    if (c->n_tts_words) {
        P(pack_key(pk, "tts") || msgpack_pack_map(pk, 3) || pack_key(pk, "ids") ||
          msgpack_pack_array(pk, 8));
        for (int i = 0; i < 8; i++) P(msgpack_pack_int32(pk, c->tts_ids[i]));
        P(pack_key(pk, "words") || msgpack_pack_array(pk, c->n_tts_words));
        for (size_t i = 0; i < c->n_tts_words; i++) P(pack_i32_array(pk, &c->tts_words[i]));
        P(pack_key(pk, "format") || pack_key(pk, c->tts_format ? "s16" : "f32"));
    }
    P(pack_key(pk, "sampling_params"));
    if ((rc = zi_codec_pack_sampling_params(pk, &c->sampling_params, err))) return rc;
    P(pack_key(pk, "_matcher") || msgpack_pack_nil(pk));
    P(pack_key(pk, "_status") || pack_key(pk, zi_gen_status_name(c->status)));
    P(pack_key(pk, "_cache_seq_id") ||
      (c->cache_seq_id >= 0 ? msgpack_pack_int64(pk, c->cache_seq_id) : msgpack_pack_nil(pk)));
    /* Only [0, end_idx) is sent, so the receiver's array is that long. */
    P(pack_key(pk, "_size") || msgpack_pack_int64(pk, c->end_idx));
    P(pack_key(pk, "_start_idx") || msgpack_pack_int64(pk, c->start_idx));
    P(pack_key(pk, "_active_idx") || msgpack_pack_int64(pk, c->active_idx));
    P(pack_key(pk, "_end_idx") || msgpack_pack_int64(pk, c->end_idx));
    P(pack_key(pk, "_completion_start_idx") || msgpack_pack_int64(pk, c->completion_start_idx));
    P(pack_key(pk, "_completion_end_idx") || msgpack_pack_int64(pk, c->completion_end_idx));
    P(pack_key(pk, "_prompt_len") || msgpack_pack_int64(pk, c->prompt_len));
    P(pack_key(pk, "_committed_idx") || msgpack_pack_int64(pk, c->committed_idx));
    P(pack_key(pk, "_log_probabilities_data") || msgpack_pack_map(pk, n_lp));
    for (int64_t i = 0; i < c->end_idx; i++) {
        if (!c->lp_data[i]) continue;
        P(msgpack_pack_int64(pk, i));
        if ((rc = zi_codec_pack_logprobs(pk, c->lp_data[i], err))) return rc;
    }
    P(pack_key(pk, "_is_initial_prompt") ||
      (c->is_initial_prompt ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    P(pack_key(pk, "_draft_offset") || msgpack_pack_int64(pk, c->draft_offset));
    if (c->n_images) {
        P(pack_key(pk, "images") || msgpack_pack_array(pk, c->n_images));
        for (size_t i = 0; i < c->n_images && !rc; i++) rc = pack_image(pk, &c->images[i], err);
    }
    return rc;
}

/* ---- to and from bytes ----------------------------------------------------- */

static int finish_bytes(msgpack_sbuffer *sb, int rc, char **buf, size_t *len) {
    if (rc) {
        msgpack_sbuffer_destroy(sb);
        return rc;
    }
    *len = sb->size;
    *buf = msgpack_sbuffer_release(sb);
    return ZI_OK;
}

int zi_codec_request_to_bytes(const zi_request *r, char **buf, size_t *len, zi_error *err) {
    if (!buf || !len) return zi_error_set(err, ZI_EINVAL, "request: NULL output");
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    return finish_bytes(&sb, zi_codec_pack_request(&pk, r, err), buf, len);
}

int zi_codec_text_context_to_bytes(const zi_text_context *ctx, char **buf, size_t *len,
                                   zi_error *err) {
    if (!buf || !len) return zi_error_set(err, ZI_EINVAL, "context: NULL output");
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    return finish_bytes(&sb, zi_codec_pack_text_context(&pk, ctx, err), buf, len);
}
