/*
 * types.c - see types.h. The containers, defaults, validation and the
 * TextContext index operations; the wire format lives in the codec
 * (codec.h, protocol/codec_*.c).
 */
#include "types.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- small containers ------------------------------------------------------ */

int zi_string_set(zi_string *s, const char *p, size_t len, zi_error *err) {
    if (!s || (!p && len)) return zi_error_set(err, ZI_EINVAL, "string: NULL pointer");
    char *q = malloc(len + 1);
    if (!q) return zi_error_set(err, ZI_ENOMEM, "string: out of memory (%zu bytes)", len);
    if (len) memcpy(q, p, len);
    q[len] = '\0';
    free(s->p);
    s->p = q;
    s->len = len;
    return ZI_OK;
}

void zi_string_free(zi_string *s) {
    if (!s) return;
    free(s->p);
    s->p = NULL;
    s->len = 0;
}

int zi_str_list_push(zi_str_list *l, const char *p, size_t len, zi_error *err) {
    if (!l) return zi_error_set(err, ZI_EINVAL, "string list: NULL pointer");
    zi_string *v = realloc(l->v, (l->n + 1) * sizeof *v);
    if (!v) return zi_error_set(err, ZI_ENOMEM, "string list: out of memory");
    l->v = v;
    v[l->n].p = NULL;
    v[l->n].len = 0;
    int rc = zi_string_set(&v[l->n], p, len, err);
    if (rc) return rc;
    l->n++;
    return ZI_OK;
}

void zi_str_list_free(zi_str_list *l) {
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) zi_string_free(&l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

int zi_i32_list_push(zi_i32_list *l, int32_t x, zi_error *err) {
    if (!l) return zi_error_set(err, ZI_EINVAL, "id list: NULL pointer");
    int32_t *v = realloc(l->v, (l->n + 1) * sizeof *v);
    if (!v) return zi_error_set(err, ZI_ENOMEM, "id list: out of memory");
    l->v = v;
    v[l->n++] = x;
    return ZI_OK;
}

int zi_i32_list_set(zi_i32_list *l, const int32_t *v, size_t n, zi_error *err) {
    if (!l || (!v && n)) return zi_error_set(err, ZI_EINVAL, "id list: NULL pointer");
    int32_t *q = NULL;
    if (n) {
        if (n > SIZE_MAX / sizeof *q) return zi_error_set(err, ZI_ENOMEM, "id list: too long");
        q = malloc(n * sizeof *q);
        if (!q) return zi_error_set(err, ZI_ENOMEM, "id list: out of memory (%zu ids)", n);
        memcpy(q, v, n * sizeof *q);
    }
    free(l->v);
    l->v = q;
    l->n = n;
    return ZI_OK;
}

bool zi_i32_list_contains(const zi_i32_list *l, int32_t x) {
    if (!l) return false;
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i] == x) return true;
    return false;
}

void zi_i32_list_free(zi_i32_list *l) {
    if (!l) return;
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

int zi_bytes_set(zi_bytes *b, const void *p, size_t len, zi_error *err) {
    if (!b || (!p && len)) return zi_error_set(err, ZI_EINVAL, "bytes: NULL pointer");
    uint8_t *q = NULL;
    if (len) {
        q = malloc(len);
        if (!q) return zi_error_set(err, ZI_ENOMEM, "bytes: out of memory (%zu bytes)", len);
        memcpy(q, p, len);
    }
    free(b->p);
    b->p = q;
    b->len = len;
    return ZI_OK;
}

void zi_bytes_free(zi_bytes *b) {
    if (!b) return;
    free(b->p);
    b->p = NULL;
    b->len = 0;
}

/* ---- TextGenerationStatus -------------------------------------------------- */

static const char *const status_names[ZI_GEN_STATUS_COUNT] = {
    "active", "end_of_sequence", "maximum_length", "stop", "cancelled", "deadline_exceeded",
};

const char *zi_gen_status_name(int status) {
    if (status < 0 || status >= ZI_GEN_STATUS_COUNT) return NULL;
    return status_names[status];
}

int zi_gen_status_parse(const char *s, size_t len, zi_gen_status *out, zi_error *err) {
    if (!s || !out) return zi_error_set(err, ZI_EINVAL, "status: NULL pointer");
    for (int i = 0; i < ZI_GEN_STATUS_COUNT; i++) {
        if (strlen(status_names[i]) == len && memcmp(status_names[i], s, len) == 0) {
            *out = (zi_gen_status)i;
            return ZI_OK;
        }
    }
    return zi_error_set(err, ZI_EINVAL,
                        "status: unknown value (expected active, end_of_sequence, "
                        "maximum_length, stop or cancelled)");
}

bool zi_gen_status_is_done(zi_gen_status s) {
    return s != ZI_GEN_ACTIVE;
}

/* ---- SamplingParams -------------------------------------------------------- */

void zi_sampling_params_init(zi_sampling_params *sp) {
    if (!sp) return;
    memset(sp, 0, sizeof *sp);
    sp->top_k = 1;
    sp->top_p = 1.0;
    sp->min_p = 0.0;
    sp->temperature = 1.0;
    sp->frequency_penalty = 0.0;
    sp->presence_penalty = 0.0;
    sp->repetition_penalty = 1.0;
    sp->max_new_tokens = -1;
    sp->min_new_tokens = 0;
    sp->ignore_eos = false;
    sp->detokenize = true;
    sp->seed = 0;
    sp->speculate = true;
}

void zi_sampling_params_free(zi_sampling_params *sp) {
    if (!sp) return;
    zi_str_list_free(&sp->stop);
    zi_i32_list_free(&sp->stop_token_ids);
    free(sp->logit_bias.v);
    zi_sampling_params_init(sp);
}

int zi_sampling_params_copy(zi_sampling_params *dst, const zi_sampling_params *src, zi_error *err) {
    if (!dst || !src) return zi_error_set(err, ZI_EINVAL, "sampling_params: NULL pointer");
    *dst = *src;
    dst->stop.v = NULL;
    dst->stop.n = 0;
    dst->stop_token_ids.v = NULL;
    dst->stop_token_ids.n = 0;
    dst->logit_bias.v = NULL;
    dst->logit_bias.n = 0;
    int rc = ZI_OK;
    for (size_t i = 0; i < src->stop.n && !rc; i++)
        rc = zi_str_list_push(&dst->stop, src->stop.v[i].p, src->stop.v[i].len, err);
    if (!rc)
        rc = zi_i32_list_set(&dst->stop_token_ids, src->stop_token_ids.v, src->stop_token_ids.n,
                             err);
    if (!rc && src->logit_bias.n) {
        dst->logit_bias.v = malloc(src->logit_bias.n * sizeof *dst->logit_bias.v);
        if (!dst->logit_bias.v)
            rc = zi_error_set(err, ZI_ENOMEM, "sampling_params.logit_bias: out of memory");
        else {
            memcpy(dst->logit_bias.v, src->logit_bias.v,
                   src->logit_bias.n * sizeof *dst->logit_bias.v);
            dst->logit_bias.n = src->logit_bias.n;
        }
    }
    if (rc) zi_sampling_params_free(dst);
    return rc;
}

/* Field name with an optional "path." in front, for messages. */
static const char *pfx_dot(const char *path) {
    return (path && *path) ? "." : "";
}

static int check_real(const char *path, const char *name, double v, double lo, bool lo_open,
                      double hi, zi_error *err) {
    const char *p = path ? path : "";
    if (isnan(v))
        return zi_error_set(err, ZI_EINVAL, "%s%s%s: NaN is not allowed", p, pfx_dot(path), name);
    bool below = lo_open ? !(v > lo) : !(v >= lo);
    if (below || !(v <= hi))
        return zi_error_set(err, ZI_EINVAL, "%s%s%s: %g is outside %c%g, %g]", p, pfx_dot(path),
                            name, v, lo_open ? '(' : '[', lo, hi);
    return ZI_OK;
}

/* logit_bias: the limits of types.h. Duplicates are looked for pairwise
 * (at most ZI_LOGIT_BIAS_MAX^2 / 2 comparisons, well under a millisecond). */
static int validate_logit_bias(const zi_logit_bias *lb, const char *p, const char *d,
                               zi_error *err) {
    if (lb->n > ZI_LOGIT_BIAS_MAX)
        return zi_error_set(err, ZI_EINVAL, "%s%slogit_bias: %zu entries exceed the limit of %d", p,
                            d, lb->n, ZI_LOGIT_BIAS_MAX);
    if (lb->n && !lb->v) return zi_error_set(err, ZI_EINVAL, "%s%slogit_bias: NULL entries", p, d);
    for (size_t i = 0; i < lb->n; i++) {
        const zi_token_bias *b = &lb->v[i];
        if (b->id < 0)
            return zi_error_set(err, ZI_EINVAL, "%s%slogit_bias: %d is not a token id", p, d,
                                (int)b->id);
        if (!(b->bias >= -ZI_LOGIT_BIAS_LIMIT && b->bias <= ZI_LOGIT_BIAS_LIMIT))
            return zi_error_set(err, ZI_EINVAL,
                                "%s%slogit_bias[%d]: bias %g is outside [-100, 100]", p, d,
                                (int)b->id, (double)b->bias);
        for (size_t j = 0; j < i; j++)
            if (lb->v[j].id == b->id)
                return zi_error_set(err, ZI_EINVAL, "%s%slogit_bias: token id %d is given twice", p,
                                    d, (int)b->id);
    }
    return ZI_OK;
}

int zi_sampling_params_validate(const zi_sampling_params *sp, const char *path, zi_error *err) {
    const char *p = path ? path : "";
    const char *d = pfx_dot(path);
    if (!sp)
        return zi_error_set(err, ZI_EINVAL, "%s: NULL sampling parameters",
                            *p ? p : "sampling_params");
    if (sp->top_k < -1)
        return zi_error_set(err, ZI_EINVAL,
                            "%s%stop_k: %d is invalid (use -1 or 0 for no limit, or k >= 1)", p, d,
                            (int)sp->top_k);
    int rc;
    if ((rc = check_real(path, "top_p", sp->top_p, 0.0, true, 1.0, err))) return rc;
    if ((rc = check_real(path, "min_p", sp->min_p, 0.0, false, 1.0, err))) return rc;
    if ((rc = check_real(path, "temperature", sp->temperature, 0.0, false, 1e6, err))) return rc;
    if ((rc = check_real(path, "frequency_penalty", sp->frequency_penalty, -2.0, false, 2.0, err)))
        return rc;
    if ((rc = check_real(path, "presence_penalty", sp->presence_penalty, -2.0, false, 2.0, err)))
        return rc;
    if ((rc = check_real(path, "repetition_penalty", sp->repetition_penalty, 0.0, true, 1e6, err)))
        return rc;
    if (sp->max_new_tokens != -1 && sp->max_new_tokens < 1)
        return zi_error_set(err, ZI_EINVAL,
                            "%s%smax_new_tokens: %lld is invalid (must be >= 1, or none)", p, d,
                            (long long)sp->max_new_tokens);
    if (sp->max_new_tokens > INT32_MAX)
        return zi_error_set(err, ZI_EINVAL, "%s%smax_new_tokens: %lld is too large (at most %d)", p,
                            d, (long long)sp->max_new_tokens, INT32_MAX);
    if (sp->min_new_tokens > INT32_MAX)
        return zi_error_set(err, ZI_EINVAL, "%s%smin_new_tokens: %lld is too large (at most %d)", p,
                            d, (long long)sp->min_new_tokens, INT32_MAX);
    if (sp->min_new_tokens < 0)
        return zi_error_set(err, ZI_EINVAL, "%s%smin_new_tokens: %lld is negative", p, d,
                            (long long)sp->min_new_tokens);
    if (sp->max_new_tokens != -1 && sp->min_new_tokens > sp->max_new_tokens)
        return zi_error_set(err, ZI_EINVAL, "%s%smin_new_tokens: %lld exceeds max_new_tokens %lld",
                            p, d, (long long)sp->min_new_tokens, (long long)sp->max_new_tokens);
    for (size_t i = 0; i < sp->stop.n; i++) {
        if (sp->stop.v[i].len == 0)
            return zi_error_set(err, ZI_EINVAL, "%s%sstop[%zu]: empty stop string", p, d, i);
    }
    for (size_t i = 0; i < sp->stop_token_ids.n; i++) {
        if (sp->stop_token_ids.v[i] < 0)
            return zi_error_set(err, ZI_EINVAL, "%s%sstop_token_ids[%zu]: %d is not a token id", p,
                                d, i, (int)sp->stop_token_ids.v[i]);
    }
    return validate_logit_bias(&sp->logit_bias, p, d, err);
}

/* ---- TokenGeneratorRequest ------------------------------------------------- */

void zi_request_init(zi_request *r) {
    if (!r) return;
    memset(r, 0, sizeof *r);
    zi_sampling_params_init(&r->sampling_params);
    r->stream = true;
    r->skip_special_tokens = true;
}

void zi_request_free(zi_request *r) {
    if (!r) return;
    zi_string_free(&r->id);
    zi_string_free(&r->model_name);
    zi_string_free(&r->prompt_text);
    zi_string_free(&r->voice);
    zi_string_free(&r->ap_text);
    zi_i32_list_free(&r->ap_tokens);
    zi_i32_list_free(&r->ap_word_codes);
    zi_i32_list_free(&r->prompt_tokens);
    for (size_t i = 0; i < r->n_messages; i++) {
        zi_string_free(&r->messages[i].role);
        zi_string_free(&r->messages[i].content);
        zi_string_free(&r->messages[i].tool_call_id);
        zi_string_free(&r->messages[i].reasoning_content);
        zi_string_free(&r->messages[i].name);
        zi_bytes_free(&r->messages[i].tool_calls);
    }
    free(r->messages);
    zi_sampling_params_free(&r->sampling_params);
    zi_str_list_free(&r->stop);
    zi_string_free(&r->request_path);
    zi_bytes_free(&r->response_format);
    zi_string_free(&r->grammar);
    zi_string_free(&r->regex);
    zi_bytes_free(&r->tools);
    zi_bytes_free(&r->chat_template_options);
    for (size_t i = 0; i < r->n_images; i++) zi_bytes_free(&r->images[i]);
    free(r->images);
    zi_request_init(r);
}

int zi_request_add_image(zi_request *r, const void *p, size_t len, zi_error *err) {
    if (!r || !p || !len) return zi_error_set(err, ZI_EINVAL, "images: an empty image");
    zi_bytes *v = realloc(r->images, (r->n_images + 1) * sizeof *v);
    if (!v) return zi_error_set(err, ZI_ENOMEM, "images: out of memory");
    r->images = v;
    v[r->n_images] = (zi_bytes){0};
    int rc = zi_bytes_set(&v[r->n_images], p, len, err);
    if (!rc) r->n_images++;
    return rc;
}

size_t zi_media_marker_count(const char *s, size_t n) {
    static const char m[] = ZI_MEDIA_MARKER;
    const size_t ml = sizeof m - 1;
    size_t k = 0;
    for (size_t i = 0; s && i + ml <= n;) {
        const char *q = memchr(s + i, '<', n - i);
        if (!q || (size_t)(q - s) + ml > n) break;
        i = (size_t)(q - s);
        if (!memcmp(q, m, ml)) {
            k++;
            i += ml;
        } else {
            i++;
        }
    }
    return k;
}

int zi_request_add_message(zi_request *r, const char *role, const char *content, size_t content_len,
                           zi_error *err) {
    if (!r || !role || (!content && content_len))
        return zi_error_set(err, ZI_EINVAL, "messages: NULL pointer");
    zi_message *m = realloc(r->messages, (r->n_messages + 1) * sizeof *m);
    if (!m) return zi_error_set(err, ZI_ENOMEM, "messages: out of memory");
    r->messages = m;
    zi_message *nm = &m[r->n_messages];
    memset(nm, 0, sizeof *nm);
    int rc = zi_string_set(&nm->role, role, strlen(role), err);
    if (!rc) rc = zi_string_set(&nm->content, content, content_len, err);
    if (rc) {
        zi_string_free(&nm->role);
        zi_string_free(&nm->content);
        return rc;
    }
    r->n_messages++;
    return ZI_OK;
}

/* ---- LogProbabilities ------------------------------------------------------ */

void zi_logprobs_init(zi_logprobs *lp) {
    if (lp) memset(lp, 0, sizeof *lp);
}

void zi_logprobs_free(zi_logprobs *lp) {
    if (!lp) return;
    for (size_t i = 0; i < lp->n; i++) {
        free(lp->top[i].ids);
        free(lp->top[i].logprobs);
    }
    free(lp->top);
    free(lp->token_logprobs);
    zi_logprobs_init(lp);
}

/* A log probability is <= 0 in theory; rounding may give a hair above, so
 * only NaN and +inf (no probability at all) are refused. -inf is p = 0. */
static bool logprob_ok(float v) {
    return !isnan(v) && !(isinf(v) && v > 0);
}

int zi_logprobs_push(zi_logprobs *lp, float token_logprob, const int32_t *ids, const float *lps,
                     size_t n_top, zi_error *err) {
    if (!lp || (n_top && (!ids || !lps)))
        return zi_error_set(err, ZI_EINVAL, "log_probabilities: NULL pointer");
    if (!logprob_ok(token_logprob))
        return zi_error_set(err, ZI_EINVAL,
                            "token_log_probabilities[%zu]: %g is not a log probability", lp->n,
                            (double)token_logprob);
    for (size_t j = 0; j < n_top; j++) {
        if (ids[j] < 0)
            return zi_error_set(err, ZI_EINVAL, "top_log_probabilities[%zu]: %d is not a token id",
                                lp->n, (int)ids[j]);
        if (!logprob_ok(lps[j]))
            return zi_error_set(err, ZI_EINVAL,
                                "top_log_probabilities[%zu][%d]: %g is not a log probability",
                                lp->n, (int)ids[j], (double)lps[j]);
    }
    float *t = realloc(lp->token_logprobs, (lp->n + 1) * sizeof *t);
    if (!t) return zi_error_set(err, ZI_ENOMEM, "log_probabilities: out of memory");
    lp->token_logprobs = t;
    zi_top_logprobs *tp = realloc(lp->top, (lp->n + 1) * sizeof *tp);
    if (!tp) return zi_error_set(err, ZI_ENOMEM, "log_probabilities: out of memory");
    lp->top = tp;
    zi_top_logprobs e = {NULL, NULL, n_top};
    if (n_top) {
        e.ids = malloc(n_top * sizeof *e.ids);
        e.logprobs = malloc(n_top * sizeof *e.logprobs);
        if (!e.ids || !e.logprobs) {
            free(e.ids);
            free(e.logprobs);
            return zi_error_set(err, ZI_ENOMEM, "log_probabilities: out of memory");
        }
        memcpy(e.ids, ids, n_top * sizeof *e.ids);
        memcpy(e.logprobs, lps, n_top * sizeof *e.logprobs);
    }
    t[lp->n] = token_logprob;
    tp[lp->n] = e;
    lp->n++;
    return ZI_OK;
}

int zi_logprobs_copy(zi_logprobs *dst, const zi_logprobs *src, zi_error *err) {
    if (!dst || !src) return zi_error_set(err, ZI_EINVAL, "log_probabilities: NULL pointer");
    zi_logprobs_init(dst);
    for (size_t i = 0; i < src->n; i++) {
        int rc = zi_logprobs_push(dst, src->token_logprobs[i], src->top[i].ids,
                                  src->top[i].logprobs, src->top[i].n, err);
        if (rc) {
            zi_logprobs_free(dst);
            return rc;
        }
    }
    return ZI_OK;
}

/* ---- TextResponse / TextGenerationResponse --------------------------------- */

void zi_text_response_init(zi_text_response *r) {
    if (r) memset(r, 0, sizeof *r);
}

void zi_text_response_free(zi_text_response *r) {
    if (!r) return;
    zi_string_free(&r->text);
    if (r->logprobs) {
        zi_logprobs_free(r->logprobs);
        free(r->logprobs);
    }
    zi_text_response_init(r);
}

void zi_text_generation_response_init(zi_text_generation_response *r) {
    if (r) memset(r, 0, sizeof *r);
}

void zi_text_generation_response_free(zi_text_generation_response *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n; i++) zi_text_response_free(&r->tokens[i]);
    free(r->tokens);
    zi_text_generation_response_init(r);
}

int zi_text_generation_response_append(zi_text_generation_response *r, const zi_text_response *t,
                                       zi_error *err) {
    if (!r || !t) return zi_error_set(err, ZI_EINVAL, "tokens: NULL pointer");
    zi_text_response c;
    zi_text_response_init(&c);
    c.is_text = t->is_text;
    c.token = t->token;
    int rc = ZI_OK;
    if (t->is_text) rc = zi_string_set(&c.text, t->text.p, t->text.len, err);
    if (!rc && t->logprobs) {
        c.logprobs = malloc(sizeof *c.logprobs);
        if (!c.logprobs)
            rc = zi_error_set(err, ZI_ENOMEM, "tokens: out of memory");
        else if ((rc = zi_logprobs_copy(c.logprobs, t->logprobs, err))) {
            free(c.logprobs);
            c.logprobs = NULL;
        }
    }
    if (!rc) {
        zi_text_response *v = realloc(r->tokens, (r->n + 1) * sizeof *v);
        if (!v)
            rc = zi_error_set(err, ZI_ENOMEM, "tokens: out of memory");
        else {
            r->tokens = v;
            v[r->n++] = c;
            return ZI_OK;
        }
    }
    zi_text_response_free(&c);
    return rc;
}

/* ---- TextContext ----------------------------------------------------------- */

void zi_text_context_zero(zi_text_context *ctx) {
    if (!ctx) return;
    memset(ctx, 0, sizeof *ctx);
    zi_sampling_params_init(&ctx->sampling_params);
    ctx->cache_seq_id = -1;
    ctx->is_initial_prompt = true;
}

bool zi_text_context_constrained(const zi_text_context *ctx) {
    return ctx->has_json_schema || ctx->grammar.len || ctx->regex.len;
}

void zi_text_context_free(zi_text_context *ctx) {
    if (!ctx) return;
    zi_string_free(&ctx->request_id);
    zi_string_free(&ctx->prompt);
    if (ctx->lp_data) {
        for (int64_t i = 0; i < ctx->size; i++) {
            if (ctx->lp_data[i]) {
                zi_logprobs_free(ctx->lp_data[i]);
                free(ctx->lp_data[i]);
            }
        }
    }
    free(ctx->lp_data);
    free(ctx->tokens);
    zi_i32_list_free(&ctx->eos_token_ids);
    zi_i32_list_free(&ctx->thinking_end);
    for (size_t i = 0; i < ctx->n_eos_sequences; i++) zi_i32_list_free(&ctx->eos_sequences[i]);
    free(ctx->eos_sequences);
    zi_string_free(&ctx->json_schema);
    zi_string_free(&ctx->grammar);
    zi_string_free(&ctx->regex);
    zi_sampling_params_free(&ctx->sampling_params);
    for (size_t i = 0; i < ctx->n_images; i++) zi_ctx_image_free(&ctx->images[i]);
    free(ctx->images);
    for (size_t i = 0; i < ctx->n_tts_words; i++) zi_i32_list_free(&ctx->tts_words[i]);
    free(ctx->tts_words);
    zi_text_context_zero(ctx);
}

/* ---- images ---------------------------------------------------------------- */

static uint64_t splitmix_fin(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t zi_ctx_image_hash(const float *pixels, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a's offset basis */
    for (size_t i = 0; i < n; i += 2) {
        uint32_t a, b = 0;
        memcpy(&a, pixels + i, 4);
        if (i + 1 < n) memcpy(&b, pixels + i + 1, 4);
        h ^= (uint64_t)a | (uint64_t)b << 32;
        h *= 0x100000001B3ull; /* FNV's prime */
        h ^= h >> 29;          /* FNV alone mixes high bits poorly */
    }
    return splitmix_fin(h ^ (uint64_t)n * 0x9E3779B97F4A7C15ull);
}

void zi_ctx_image_free(zi_ctx_image *im) {
    if (!im) return;
    free(im->tile_first);
    free(im->pixels);
    free(im->embd);
    free(im->tile_encoded);
    memset(im, 0, sizeof *im);
}

/* Image i's shape and positions: sizes in range, its tiles after prev_end
 * (the end of the previous tile) in order, inside the prompt. *end gets
 * the end of its last tile. */
static int check_image(const zi_ctx_image *im, size_t i, int64_t prev_end, int64_t prompt_len,
                       int64_t *end, zi_error *err) {
    if (im->n_tiles < 1)
        return zi_error_set(err, ZI_EINVAL, "images[%zu].n_tiles: %d (an image has a tile)", i,
                            (int)im->n_tiles);
    if (im->tile_size < 1 || im->tile_size > ZI_CTX_IMAGE_MAX_SIDE)
        return zi_error_set(err, ZI_EINVAL, "images[%zu].tile_size: %d is outside 1..%d", i,
                            (int)im->tile_size, ZI_CTX_IMAGE_MAX_SIDE);
    if (im->tile_tokens < 1 || im->tile_tokens > prompt_len)
        return zi_error_set(err, ZI_EINVAL,
                            "images[%zu].tile_tokens: %d is outside 1..%lld (the prompt's length)",
                            i, (int)im->tile_tokens, (long long)prompt_len);
    if (!im->tile_first || !im->pixels)
        return zi_error_set(err, ZI_EINVAL, "images[%zu]: tile_first or pixels missing", i);
    for (int32_t t = 0; t < im->n_tiles; t++) {
        int64_t f = im->tile_first[t];
        if (f < prev_end || f + im->tile_tokens > prompt_len)
            return zi_error_set(err, ZI_EINVAL,
                                "images[%zu].tile_first[%d]: tokens %lld..%lld are not inside "
                                "%lld..%lld (the prompt, after the tiles before)",
                                i, (int)t, (long long)f, (long long)(f + im->tile_tokens - 1),
                                (long long)prev_end, (long long)(prompt_len - 1));
        prev_end = f + im->tile_tokens;
    }
    *end = prev_end;
    return ZI_OK;
}

/* The tokens of ctx's images: structure (check_image) and each soft
 * token's key; then every other token must be an id (>= 0). */
static int check_images_tokens(const zi_text_context *ctx, zi_error *err) {
    int64_t prev = 0, n_soft = 0, n_neg = 0;
    if (ctx->n_images && !ctx->images)
        return zi_error_set(err, ZI_EINVAL, "images: NULL with %zu images", ctx->n_images);
    for (size_t i = 0; i < ctx->n_images; i++) { /* all the shapes, then the keys */
        int rc = check_image(&ctx->images[i], i, prev, ctx->prompt_len, &prev, err);
        if (rc) return rc;
    }
    for (size_t i = 0; i < ctx->n_images; i++) {
        const zi_ctx_image *im = &ctx->images[i];
        for (int32_t t = 0; t < im->n_tiles; t++)
            for (int32_t j = 0; j < im->tile_tokens; j++) {
                int64_t at = im->tile_first[t] + j, k = (int64_t)t * im->tile_tokens + j;
                int32_t key = zi_ctx_image_key(im->hash, k);
                if (ctx->tokens[at] != key)
                    return zi_error_set(err, ZI_EINVAL,
                                        "tokens[%lld]: %d is not images[%zu]'s key %d for its "
                                        "soft token %lld (zi_ctx_image_key)",
                                        (long long)at, (int)ctx->tokens[at], i, (int)key,
                                        (long long)k);
            }
        n_soft += (int64_t)im->n_tiles * im->tile_tokens;
    }
    for (int64_t i = 0; i < ctx->end_idx; i++) n_neg += ctx->tokens[i] < 0;
    if (n_neg == n_soft) return ZI_OK; /* every key is negative: they are the soft tokens */
    for (int64_t i = 0; i < ctx->end_idx; i++)
        if (ctx->tokens[i] < 0 && !zi_text_context_soft_token(ctx, i, NULL, NULL))
            return zi_error_set(err, ZI_EINVAL, "tokens[%lld]: %d is not a token id", (long long)i,
                                (int)ctx->tokens[i]);
    return ZI_OK;
}

bool zi_text_context_soft_token(const zi_text_context *ctx, int64_t pos, size_t *image,
                                int32_t *tile) {
    for (size_t i = 0; i < ctx->n_images; i++) {
        const zi_ctx_image *im = &ctx->images[i];
        if (!im->n_tiles || pos < im->tile_first[0]) break; /* in order: none further */
        for (int32_t t = 0; t < im->n_tiles; t++)
            if (pos >= im->tile_first[t] && pos < (int64_t)im->tile_first[t] + im->tile_tokens) {
                if (image) *image = i;
                if (tile) *tile = t;
                return true;
            }
    }
    return false;
}

int zi_text_context_add_image(zi_text_context *ctx, zi_ctx_image *im, zi_error *err) {
    if (!ctx || !im || !ctx->tokens)
        return zi_error_set(err, ZI_EINVAL, "images: NULL or uninitialised context");
    size_t i = ctx->n_images;
    int64_t prev = 0, end;
    if (i) {
        const zi_ctx_image *last = &ctx->images[i - 1];
        prev = (int64_t)last->tile_first[last->n_tiles - 1] + last->tile_tokens;
    }
    int rc = check_image(im, i, prev, ctx->prompt_len, &end, err);
    if (rc) return rc;
    size_t n_pix = (size_t)im->n_tiles * (size_t)im->tile_size * (size_t)im->tile_size * 3;
    for (size_t k = 0; k < n_pix; k++)
        if (!isfinite(im->pixels[k]))
            return zi_error_set(err, ZI_EINVAL, "images[%zu].pixels: value %zu is not finite", i,
                                k);
    if (zi_ctx_image_hash(im->pixels, n_pix) != im->hash)
        return zi_error_set(err, ZI_EINVAL,
                            "images[%zu].hash: does not match the pixels (zi_ctx_image_hash)", i);
    zi_ctx_image *v = realloc(ctx->images, (i + 1) * sizeof *v);
    if (!v) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    ctx->images = v;
    v[i] = *im;
    v[i].embd = NULL;
    v[i].tile_encoded = NULL;
    free(im->embd);
    free(im->tile_encoded);
    memset(im, 0, sizeof *im);
    ctx->n_images = i + 1;
    for (int32_t t = 0; t < v[i].n_tiles; t++)
        for (int32_t j = 0; j < v[i].tile_tokens; j++)
            ctx->tokens[v[i].tile_first[t] + j] =
                zi_ctx_image_key(v[i].hash, (int64_t)t * v[i].tile_tokens + j);
    return ZI_OK;
}

/* Grows the token and log-probability arrays to hold at least `need` slots,
 * in whole chunks; new slots are zero. */
static int ctx_reserve(zi_text_context *ctx, int64_t need, zi_error *err) {
    if (need <= ctx->size) return ZI_OK;
    /* Indices stay below 2^31, so index arithmetic elsewhere cannot overflow. */
    const int64_t max_slots = (int64_t)INT32_MAX / ZI_CTX_CHUNK * ZI_CTX_CHUNK;
    if (need > max_slots)
        return zi_error_set(err, ZI_ERANGE, "tokens: %lld slots is too many", (long long)need);
    /* Double, so a long generation costs amortised O(1) per token; stay in
     * whole chunks like the seed's array. */
    int64_t cap = ctx->size * 2;
    if (cap < need) cap = need;
    cap = (cap + ZI_CTX_CHUNK - 1) / ZI_CTX_CHUNK * ZI_CTX_CHUNK;
    if (cap > max_slots) cap = max_slots;
    int32_t *t = realloc(ctx->tokens, (size_t)cap * sizeof *t);
    if (!t)
        return zi_error_set(err, ZI_ENOMEM, "tokens: out of memory (%lld slots)", (long long)cap);
    ctx->tokens = t;
    zi_logprobs **l = realloc(ctx->lp_data, (size_t)cap * sizeof *l);
    if (!l)
        return zi_error_set(err, ZI_ENOMEM, "tokens: out of memory (%lld slots)", (long long)cap);
    ctx->lp_data = l;
    memset(t + ctx->size, 0, (size_t)(cap - ctx->size) * sizeof *t);
    for (int64_t i = ctx->size; i < cap; i++) l[i] = NULL;
    ctx->size = cap;
    return ZI_OK;
}

int zi_text_context_init(zi_text_context *ctx, const int32_t *prompt, size_t n, int64_t max_length,
                         const zi_sampling_params *sp, zi_error *err) {
    if (!ctx) return zi_error_set(err, ZI_EINVAL, "context: NULL pointer");
    zi_text_context_zero(ctx);
    if (!prompt || n == 0)
        return zi_error_set(err, ZI_EINVAL, "prompt: empty (a context needs at least one token)");
    if (n > INT32_MAX) return zi_error_set(err, ZI_ERANGE, "prompt: %zu tokens is too many", n);
    for (size_t i = 0; i < n; i++) {
        if (prompt[i] < 0)
            return zi_error_set(err, ZI_EINVAL, "prompt[%zu]: %d is not a token id", i,
                                (int)prompt[i]);
    }
    int rc;
    if (sp) {
        if ((rc = zi_sampling_params_validate(sp, "sampling_params", err))) return rc;
        if ((rc = zi_sampling_params_copy(&ctx->sampling_params, sp, err))) return rc;
    }
    const zi_sampling_params *s = &ctx->sampling_params;
    int64_t len = (int64_t)n;
    if (s->max_new_tokens > 0 && s->max_new_tokens < max_length - len)
        max_length = len + s->max_new_tokens;
    if (len >= max_length) {
        zi_text_context_free(ctx);
        return zi_error_set(err, ZI_ERANGE,
                            "prompt: %lld tokens leave no room under max_length %lld",
                            (long long)len, (long long)max_length);
    }
    if (s->min_new_tokens > max_length - len) {
        rc =
            zi_error_set(err, ZI_EINVAL,
                         "sampling_params.min_new_tokens: %lld new tokens do not fit: prompt %lld, "
                         "max_length %lld",
                         (long long)s->min_new_tokens, (long long)len, (long long)max_length);
        zi_text_context_free(ctx);
        return rc;
    }
    if ((rc = ctx_reserve(ctx, len, err))) {
        zi_text_context_free(ctx);
        return rc;
    }
    memcpy(ctx->tokens, prompt, n * sizeof *prompt);
    ctx->max_length = max_length;
    ctx->ignore_eos = s->ignore_eos;
    ctx->active_idx = ctx->end_idx = ctx->prompt_len = len;
    ctx->completion_start_idx = ctx->completion_end_idx = len;
    return ZI_OK;
}

int zi_text_context_set_eos(zi_text_context *ctx, const int32_t *ids, size_t n, zi_error *err) {
    if (!ctx || (!ids && n)) return zi_error_set(err, ZI_EINVAL, "eos_token_ids: NULL pointer");
    zi_i32_list l = {NULL, 0};
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0) {
            zi_i32_list_free(&l);
            return zi_error_set(err, ZI_EINVAL, "eos_token_ids[%zu]: %d is not a token id", i,
                                (int)ids[i]);
        }
        if (zi_i32_list_contains(&l, ids[i])) continue; /* a set, as in the seed */
        int rc = zi_i32_list_push(&l, ids[i], err);
        if (rc) {
            zi_i32_list_free(&l);
            return rc;
        }
    }
    zi_i32_list_free(&ctx->eos_token_ids);
    ctx->eos_token_ids = l;
    return ZI_OK;
}

int zi_text_context_add_eos_sequence(zi_text_context *ctx, const int32_t *ids, size_t n,
                                     zi_error *err) {
    if (!ctx || !ids || n == 0)
        return zi_error_set(err, ZI_EINVAL, "eos_sequences: empty sequence");
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0)
            return zi_error_set(err, ZI_EINVAL, "eos_sequences[%zu][%zu]: %d is not a token id",
                                ctx->n_eos_sequences, i, (int)ids[i]);
    }
    zi_i32_list *v = realloc(ctx->eos_sequences, (ctx->n_eos_sequences + 1) * sizeof *v);
    if (!v) return zi_error_set(err, ZI_ENOMEM, "eos_sequences: out of memory");
    ctx->eos_sequences = v;
    v[ctx->n_eos_sequences].v = NULL;
    v[ctx->n_eos_sequences].n = 0;
    int rc = zi_i32_list_set(&v[ctx->n_eos_sequences], ids, n, err);
    if (rc) return rc;
    ctx->n_eos_sequences++;
    return ZI_OK;
}

/* The layout invariant for a candidate set of indices; names the first
 * index at fault. */
static int check_indices(const zi_text_context *ctx, int64_t start, int64_t active, int64_t end,
                         int64_t committed, zi_error *err) {
    if (committed < 0)
        return zi_error_set(err, ZI_EINVAL, "committed_idx: %lld is negative",
                            (long long)committed);
    if (committed > start)
        return zi_error_set(err, ZI_EINVAL, "committed_idx: %lld is beyond start_idx %lld",
                            (long long)committed, (long long)start);
    if (start > active)
        return zi_error_set(err, ZI_EINVAL, "start_idx: %lld is beyond active_idx %lld",
                            (long long)start, (long long)active);
    if (active > end)
        return zi_error_set(err, ZI_EINVAL, "active_idx: %lld is beyond end_idx %lld",
                            (long long)active, (long long)end);
    if (end > ctx->size)
        return zi_error_set(err, ZI_EINVAL, "end_idx: %lld is beyond the token array (size %lld)",
                            (long long)end, (long long)ctx->size);
    if (end < ctx->prompt_len)
        return zi_error_set(err, ZI_EINVAL, "end_idx: %lld is below prompt_len %lld",
                            (long long)end, (long long)ctx->prompt_len);
    return ZI_OK;
}

int zi_text_context_check(const zi_text_context *ctx, zi_error *err) {
    if (!ctx) return zi_error_set(err, ZI_EINVAL, "context: NULL pointer");
    if (ctx->size < 0 || ctx->size % ZI_CTX_CHUNK || (ctx->size && (!ctx->tokens || !ctx->lp_data)))
        return zi_error_set(err, ZI_EINVAL, "size: %lld is not a whole number of chunks",
                            (long long)ctx->size);
    if (ctx->prompt_len < 1)
        return zi_error_set(err, ZI_EINVAL,
                            "prompt_len: %lld (a context needs at least one prompt token)",
                            (long long)ctx->prompt_len);
    int rc =
        check_indices(ctx, ctx->start_idx, ctx->active_idx, ctx->end_idx, ctx->committed_idx, err);
    if (rc) return rc;
    if (ctx->completion_start_idx < ctx->prompt_len ||
        ctx->completion_start_idx > ctx->completion_end_idx)
        return zi_error_set(err, ZI_EINVAL,
                            "completion_start_idx: %lld is outside [prompt_len %lld, "
                            "completion_end_idx %lld]",
                            (long long)ctx->completion_start_idx, (long long)ctx->prompt_len,
                            (long long)ctx->completion_end_idx);
    if (ctx->completion_end_idx > ctx->end_idx)
        return zi_error_set(err, ZI_EINVAL, "completion_end_idx: %lld is beyond end_idx %lld",
                            (long long)ctx->completion_end_idx, (long long)ctx->end_idx);
    if (ctx->max_length <= ctx->prompt_len)
        return zi_error_set(err, ZI_EINVAL, "max_length: %lld leaves no room after prompt_len %lld",
                            (long long)ctx->max_length, (long long)ctx->prompt_len);
    if (ctx->status < 0 || ctx->status >= ZI_GEN_STATUS_COUNT)
        return zi_error_set(err, ZI_EINVAL, "status: %d is not a generation status",
                            (int)ctx->status);
    if (ctx->cache_seq_id < -1)
        return zi_error_set(err, ZI_EINVAL, "cache_seq_id: %lld is negative",
                            (long long)ctx->cache_seq_id);
    if (ctx->log_probabilities < 0)
        return zi_error_set(err, ZI_EINVAL, "log_probabilities: %lld is negative",
                            (long long)ctx->log_probabilities);
    if (ctx->draft_offset < 0 || ctx->draft_offset > ctx->end_idx)
        return zi_error_set(err, ZI_EINVAL, "draft_offset: %lld is outside [0, end_idx %lld]",
                            (long long)ctx->draft_offset, (long long)ctx->end_idx);
    if ((rc = check_images_tokens(ctx, err))) return rc;
    for (size_t i = 0; i < ctx->eos_token_ids.n; i++) {
        if (ctx->eos_token_ids.v[i] < 0)
            return zi_error_set(err, ZI_EINVAL, "eos_token_ids[%zu]: %d is not a token id", i,
                                (int)ctx->eos_token_ids.v[i]);
    }
    for (size_t i = 0; i < ctx->n_eos_sequences; i++) {
        if (ctx->eos_sequences[i].n == 0)
            return zi_error_set(err, ZI_EINVAL, "eos_sequences[%zu]: empty sequence", i);
        for (size_t j = 0; j < ctx->eos_sequences[i].n; j++) {
            if (ctx->eos_sequences[i].v[j] < 0)
                return zi_error_set(err, ZI_EINVAL, "eos_sequences[%zu][%zu]: %d is not a token id",
                                    i, j, (int)ctx->eos_sequences[i].v[j]);
        }
    }
    return zi_sampling_params_validate(&ctx->sampling_params, "sampling_params", err);
}

static int ctx_ready(const zi_text_context *ctx, const char *op, zi_error *err) {
    if (!ctx) return zi_error_set(err, ZI_EINVAL, "%s: NULL context", op);
    if (ctx->prompt_len < 1 || !ctx->tokens)
        return zi_error_set(err, ZI_EINVAL, "%s: context was not initialised", op);
    return ZI_OK;
}

/* Moves to the given indices when they keep the invariant; otherwise
 * changes nothing. */
static int apply_indices(zi_text_context *ctx, int64_t s, int64_t a, int64_t e, int64_t c,
                         zi_error *err) {
    int rc = check_indices(ctx, s, a, e, c, err);
    if (rc) return rc;
    ctx->start_idx = s;
    ctx->active_idx = a;
    ctx->end_idx = e;
    ctx->committed_idx = c;
    /* Tokens cut off the end are no longer owed to the user. */
    if (ctx->completion_end_idx > e) ctx->completion_end_idx = e;
    if (ctx->completion_start_idx > ctx->completion_end_idx)
        ctx->completion_start_idx = ctx->completion_end_idx;
    if (ctx->draft_offset > e) ctx->draft_offset = e;
    return ZI_OK;
}

int zi_text_context_bump_token_indices(zi_text_context *ctx, int64_t d_start, int64_t d_active,
                                       int64_t d_end, int64_t d_committed, zi_error *err) {
    int rc = ctx_ready(ctx, "bump_token_indices", err);
    if (rc) return rc;
    int64_t s, a, e, c;
    if (__builtin_add_overflow(ctx->start_idx, d_start, &s) ||
        __builtin_add_overflow(ctx->active_idx, d_active, &a) ||
        __builtin_add_overflow(ctx->end_idx, d_end, &e) ||
        __builtin_add_overflow(ctx->committed_idx, d_committed, &c))
        return zi_error_set(err, ZI_EINVAL, "bump_token_indices: index overflow");
    return apply_indices(ctx, s, a, e, c, err);
}

int zi_text_context_set_token_indices(zi_text_context *ctx, int64_t start, int64_t active,
                                      int64_t end, int64_t committed, zi_error *err) {
    int rc = ctx_ready(ctx, "set_token_indices", err);
    if (rc) return rc;
    return apply_indices(ctx, start == ZI_IDX_KEEP ? ctx->start_idx : start,
                         active == ZI_IDX_KEEP ? ctx->active_idx : active,
                         end == ZI_IDX_KEEP ? ctx->end_idx : end,
                         committed == ZI_IDX_KEEP ? ctx->committed_idx : committed, err);
}

int zi_text_context_limit_active(zi_text_context *ctx, int64_t max_tokens, zi_error *err) {
    int rc = ctx_ready(ctx, "limit_active", err);
    if (rc) return rc;
    if (max_tokens < 1)
        return zi_error_set(err, ZI_EINVAL, "limit_active: max_tokens %lld must be >= 1",
                            (long long)max_tokens);
    if (zi_text_context_active_length(ctx) > max_tokens)
        ctx->active_idx = ctx->start_idx + max_tokens;
    return ZI_OK;
}

static bool ends_with_eos_sequence(const zi_text_context *ctx) {
    for (size_t i = 0; i < ctx->n_eos_sequences; i++) {
        const zi_i32_list *q = &ctx->eos_sequences[i];
        int64_t n = (int64_t)q->n;
        /* Only generated tokens may complete a sequence: a prompt that ends
         * in one must not stop generation before it starts. */
        if (n > ctx->end_idx - ctx->prompt_len) continue;
        if (memcmp(ctx->tokens + ctx->end_idx - n, q->v, (size_t)n * sizeof *q->v) == 0)
            return true;
    }
    return false;
}

/* After a token was appended at end_idx - 1. */
static void status_after_append(zi_text_context *ctx, int32_t token) {
    if (!ctx->ignore_eos &&
        (zi_i32_list_contains(&ctx->eos_token_ids, token) || ends_with_eos_sequence(ctx)))
        ctx->status = ZI_GEN_END_OF_SEQUENCE;
    else if (zi_i32_list_contains(&ctx->sampling_params.stop_token_ids, token))
        ctx->status = ZI_GEN_STOP;
    else if (ctx->end_idx >= ctx->max_length)
        ctx->status = ZI_GEN_MAXIMUM_LENGTH;
}

static void free_lp(zi_logprobs *lp) {
    if (!lp) return;
    zi_logprobs_free(lp);
    free(lp);
}

int zi_text_context_update(zi_text_context *ctx, int32_t token, zi_logprobs *lp, zi_error *err) {
    int rc = ctx_ready(ctx, "update", err);
    if (rc) goto drop;
    if (zi_text_context_is_done(ctx)) {
        rc = zi_error_set(err, ZI_EINVAL, "update: the context is done (status %s)",
                          zi_gen_status_name(ctx->status));
        goto drop;
    }
    if (token < 0) {
        rc = zi_error_set(err, ZI_EINVAL, "update: %d is not a token id", (int)token);
        goto drop;
    }
    if (ctx->active_idx == ctx->start_idx) {
        rc = zi_error_set(err, ZI_EINVAL,
                          "update: the active window is empty (start_idx == active_idx == %lld)",
                          (long long)ctx->start_idx);
        goto drop;
    }
    if (ctx->active_idx < ctx->end_idx) {
        /* A chunk of the prompt was fed; its sample means nothing yet. */
        ctx->start_idx = ctx->active_idx;
        ctx->active_idx = ctx->end_idx;
        free_lp(lp);
        return ZI_OK;
    }
    if ((rc = ctx_reserve(ctx, ctx->end_idx + 1, err))) goto drop;
    int64_t at = ctx->end_idx;
    ctx->tokens[at] = token;
    free_lp(ctx->lp_data[at]);
    ctx->lp_data[at] = lp;
    ctx->start_idx = ctx->active_idx;
    ctx->active_idx = ctx->end_idx = at + 1;
    ctx->completion_end_idx++;
    ctx->is_initial_prompt = false;
    status_after_append(ctx, token);
    return ZI_OK;
drop:
    free_lp(lp);
    return rc;
}

int zi_text_context_set_prompt_logprobs(zi_text_context *ctx, int64_t idx, zi_logprobs *lp,
                                        zi_error *err) {
    int rc = ctx_ready(ctx, "set_prompt_logprobs", err);
    if (!rc && (idx < 1 || idx >= ctx->prompt_len))
        rc = zi_error_set(err, ZI_ERANGE,
                          "set_prompt_logprobs: index %lld is not a prompt token after the first "
                          "(1..%lld)",
                          (long long)idx, (long long)ctx->prompt_len - 1);
    if (rc) {
        free_lp(lp);
        return rc;
    }
    free_lp(ctx->lp_data[idx]);
    ctx->lp_data[idx] = lp;
    return ZI_OK;
}

int zi_text_context_jump_ahead(zi_text_context *ctx, int32_t token, zi_error *err) {
    int rc = ctx_ready(ctx, "jump_ahead", err);
    if (rc) return rc;
    if (zi_text_context_is_done(ctx))
        return zi_error_set(err, ZI_EINVAL, "jump_ahead: the context is done (status %s)",
                            zi_gen_status_name(ctx->status));
    if (token < 0)
        return zi_error_set(err, ZI_EINVAL, "jump_ahead: %d is not a token id", (int)token);
    if (ctx->active_idx < ctx->end_idx)
        return zi_error_set(
            err, ZI_EINVAL,
            "jump_ahead: a chunked prompt is pending (active_idx %lld < end_idx %lld)",
            (long long)ctx->active_idx, (long long)ctx->end_idx);
    if ((rc = ctx_reserve(ctx, ctx->end_idx + 1, err))) return rc;
    int64_t at = ctx->end_idx;
    ctx->tokens[at] = token;
    free_lp(ctx->lp_data[at]);
    ctx->lp_data[at] = NULL;
    ctx->active_idx = ctx->end_idx = at + 1;
    ctx->completion_end_idx++;
    ctx->is_initial_prompt = false;
    status_after_append(ctx, token);
    return ZI_OK;
}

int zi_text_context_rollback(zi_text_context *ctx, int64_t n, zi_error *err) {
    int rc = ctx_ready(ctx, "rollback", err);
    if (rc) return rc;
    int64_t gen = zi_text_context_generated_count(ctx);
    if (n < 0 || n > gen)
        return zi_error_set(err, ZI_EINVAL, "rollback: %lld tokens is outside [0, %lld generated]",
                            (long long)n, (long long)gen);
    if (n == 0) return ZI_OK;
    int64_t e = ctx->end_idx - n;
    for (int64_t i = e; i < ctx->end_idx; i++) {
        free_lp(ctx->lp_data[i]);
        ctx->lp_data[i] = NULL;
        ctx->tokens[i] = 0;
    }
    /* A chunk still pending before the new end stays as it was (a reset
     * context re-encoding in chunks); else the window ends at the end. */
    if (ctx->active_idx == ctx->end_idx || ctx->active_idx > e) ctx->active_idx = e;
    ctx->end_idx = e;
    if (ctx->start_idx > ctx->active_idx - 1) ctx->start_idx = ctx->active_idx - 1; /* >= 0 */
    if (ctx->committed_idx > ctx->start_idx) ctx->committed_idx = ctx->start_idx;
    if (ctx->completion_end_idx > e) ctx->completion_end_idx = e;
    if (ctx->completion_start_idx > ctx->completion_end_idx)
        ctx->completion_start_idx = ctx->completion_end_idx;
    if (ctx->status != ZI_GEN_CANCELLED) ctx->status = ZI_GEN_ACTIVE;
    if (ctx->draft_offset > e) ctx->draft_offset = e;
    return ZI_OK;
}

void zi_text_context_reset(zi_text_context *ctx) {
    if (!ctx) return;
    /* All tokens become the next prompt, a chunk that was pending too. */
    ctx->start_idx = 0;
    ctx->active_idx = ctx->end_idx;
    ctx->committed_idx = 0;
    ctx->is_initial_prompt = true;
}

int zi_text_context_compute_num_available_steps(const zi_text_context *ctx, int64_t max_seq_len,
                                                int64_t *out, zi_error *err) {
    int rc = ctx_ready(ctx, "compute_num_available_steps", err);
    if (rc) return rc;
    if (!out) return zi_error_set(err, ZI_EINVAL, "compute_num_available_steps: NULL output");
    if (max_seq_len < 1 || max_seq_len > INT32_MAX)
        return zi_error_set(err, ZI_EINVAL,
                            "compute_num_available_steps: max_seq_len %lld is outside [1, %d]",
                            (long long)max_seq_len, INT32_MAX);
    /* Indices stay below INT32_MAX (ctx_reserve), so nothing here overflows. */
    if (ctx->active_idx < ctx->end_idx)
        *out = ctx->active_idx <= max_seq_len ? 1 : 0;
    else
        *out = ctx->active_idx > max_seq_len + 1 ? 0 : max_seq_len - ctx->active_idx + 1;
    return ZI_OK;
}

int zi_text_context_min_token_mask(const zi_text_context *ctx, int64_t num_steps, uint8_t *out,
                                   zi_error *err) {
    int rc = ctx_ready(ctx, "get_min_token_logit_mask", err);
    if (rc) return rc;
    if (num_steps < 1 || !out)
        return zi_error_set(err, ZI_EINVAL,
                            "get_min_token_logit_mask: num_steps %lld must be >= 1 with an output",
                            (long long)num_steps);
    int64_t lo = ctx->prompt_len, hi = ctx->prompt_len + ctx->sampling_params.min_new_tokens;
    for (int64_t s = 0; s < num_steps; s++) {
        int64_t i = ctx->active_idx + s;
        out[s] = (i >= lo && i < hi) ? 1 : 0;
    }
    return ZI_OK;
}

int zi_text_context_assign_to_cache(zi_text_context *ctx, int64_t seq_id, zi_error *err) {
    if (!ctx) return zi_error_set(err, ZI_EINVAL, "assign_to_cache: NULL context");
    if (seq_id < 0)
        return zi_error_set(err, ZI_EINVAL, "assign_to_cache: seq id %lld is negative",
                            (long long)seq_id);
    if (ctx->cache_seq_id >= 0)
        return zi_error_set(err, ZI_EINVAL, "assign_to_cache: already assigned to cache slot %lld",
                            (long long)ctx->cache_seq_id);
    ctx->cache_seq_id = seq_id;
    return ZI_OK;
}

int zi_text_context_unassign_from_cache(zi_text_context *ctx, zi_error *err) {
    if (!ctx) return zi_error_set(err, ZI_EINVAL, "unassign_from_cache: NULL context");
    if (ctx->cache_seq_id < 0)
        return zi_error_set(err, ZI_EINVAL, "unassign_from_cache: not assigned to a cache slot");
    ctx->cache_seq_id = -1;
    return ZI_OK;
}

int zi_text_context_cache_seq_id(const zi_text_context *ctx, int64_t *out, zi_error *err) {
    if (!ctx || !out) return zi_error_set(err, ZI_EINVAL, "cache_seq_id: NULL pointer");
    if (ctx->cache_seq_id < 0)
        return zi_error_set(err, ZI_EINVAL, "cache_seq_id: not assigned to a cache slot");
    *out = ctx->cache_seq_id;
    return ZI_OK;
}

int zi_text_context_update_status(zi_text_context *ctx, int status, zi_error *err) {
    if (!ctx) return zi_error_set(err, ZI_EINVAL, "update_status: NULL context");
    if (!zi_gen_status_name(status))
        return zi_error_set(err, ZI_EINVAL, "update_status: %d is not a generation status", status);
    ctx->status = (zi_gen_status)status;
    return ZI_OK;
}

int zi_text_context_set_draft_offset(zi_text_context *ctx, int64_t idx, zi_error *err) {
    if (!ctx) return zi_error_set(err, ZI_EINVAL, "set_draft_offset: NULL context");
    if (idx < 0 || idx > ctx->end_idx)
        return zi_error_set(err, ZI_EINVAL, "set_draft_offset: %lld is outside [0, end_idx %lld]",
                            (long long)idx, (long long)ctx->end_idx);
    ctx->draft_offset = idx;
    return ZI_OK;
}

void zi_text_context_take_outstanding(zi_text_context *ctx, int64_t *first, int64_t *count) {
    int64_t f = 0, c = 0;
    if (ctx) {
        f = ctx->completion_start_idx;
        c = ctx->completion_end_idx - ctx->completion_start_idx;
        ctx->completion_start_idx = ctx->completion_end_idx;
    }
    if (first) *first = f;
    if (count) *count = c;
}
