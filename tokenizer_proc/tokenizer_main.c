/*
 * tokenizer_main.c - the `zinfer-tokenizer` process: encodes requests into
 * TextContexts and decodes generated tokens back into text for the router.
 *
 * It connects a DEALER socket to the router's backend address and registers
 * (role "tokenizer"). The router sends it:
 *
 *   encode      a validated request -> the prompt's token ids (text is
 *               encoded, token ids checked against the vocabulary, chat
 *               messages rendered with the model's template) -> a
 *               zi_text_context (limits, sampling
 *               parameters, the model's end-of-generation ids) sent back as
 *               "encoded"; per-request decode state is created here.
 *               With "replay" (the router's tokenizer failover) only the
 *               decode state is made, fed those ids, and nothing sent.
 *   decode      a request's new token ids and the worker's status -> the new
 *               text (incremental detokenization, never splitting a UTF-8
 *               character; stop strings matched across token boundaries,
 *               the stop text itself never returned) -> "decoded".
 *   release     forget a request's decode state (it ended elsewhere).
 *   tokenize / detokenize   the client protocol's utility ops.
 *
 * The only state is the per-request decode state, so any number of these
 * processes can run; the router keeps each request on one of them.
 * Messages are described in docs/protocol.md and encoded and decoded by
 * protocol/imsg.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "tts_encode.h"
#include "args.h"
#include "chat_template.h"
#include "chat_template_source.h"
#include "chat_tools.h"
#include "chat_vars.h"
#include "codec.h"
#include "curve.h"
#include "gguf.h"
#include "embed_encode.h"
#include "grow.h"
#include "imsg.h"
#include "log.h"
#include "options.h"
#include "response_format.h"
#include "stop_match.h"
#include "startup.h"
#include "stop_signal.h"
#include "image.h"
#include "image_prompt.h"
#include "tokenizer.h"
#include "types.h"
#include "utf8.h"
#include "wire.h"

static const char USAGE[] =
    "usage: zinfer-tokenizer [options]\n"
    "\n"
    "A tokenizer process: connects to the router, registers, encodes prompts\n"
    "into contexts and decodes generated tokens into text (stop strings).\n"
    "Options (from common/options.c, as `zinfer serve` checks them):\n"
    "\n";

typedef struct dstate {
    uint64_t rid;
    zi_detok dt;
    zi_stop_matcher stop;
    bool detokenize; /* sampling_params.detokenize: false returns ids only (the text is
                        still decoded, unsent, when there are stop strings) */
    int64_t min_new; /* sampling_params.min_new_tokens: no stop string ends those */
    bool special;    /* !skip_special_tokens: control tokens' text is in the completion */
    int64_t n_gen;   /* tokens decoded so far */
    /* The rendered prompt ended inside an opened thinking section: said on
     * the first decoded message (docs/protocol.md), then cleared. */
    bool reasoning_open;
    bool reasoning_harmony; /* ... and it is harmony's analysis channel */
} dstate;

typedef struct tproc {
    zi_logger log;
    void *sock;
    zi_tokenizer *tok; /* NULL in ids-only mode (no_tok) */
    /* Why text is refused when the file's tokenizer is not supported (a
     * bert WPM vocabulary): the process then serves token-id requests
     * (embed with ids) and answers the text ones "unsupported". */
    char no_tok[600];
    int32_t vocab;
    char model_name[256]; /* what it registers as (--model-name, or the file's) */
    int64_t ctx_train;
    zi_i32_list eog; /* every end-of-generation id */
    zi_chat_template *tmpl;
    int tool_caps;        /* what tmpl does with tool messages (chat_tools.h) */
    const char *tmpl_arg; /* --chat-template, or NULL: the file's template */
    bool file_tmpl_bad;   /* the file has a template, but it does not compile */
    char *bos_text, *eos_text;
    char *rerank_tmpl; /* tokenizer.chat_template.rerank (embed_encode.h), or NULL */
    dstate *st;
    size_t n_st, cap_st;
    /* --mmproj: how requests' images are prepared (image_prompt.h) */
    bool images;
    zi_image_prep_params img_pp;
    bool img_non_causal;
    zi_image_limits img_lim;
    const char *voices; /* --voices DIR: speech requests' speaker files, or NULL */
} tproc;

static void send_register(tproc *t) {
    zi_msg m;
    zi_im_register_pack(&(zi_im_register){.worker = false,
                                          .vocab = t->vocab,
                                          .model = {t->model_name, strlen(t->model_name)}},
                        &m);
    zi_im_send(t->sock, &m);
}

static void send_heartbeat(tproc *t) {
    zi_msg m;
    zi_im_heartbeat_pack(&(zi_im_heartbeat){.load = (int64_t)t->n_st}, &m);
    zi_im_send(t->sock, &m);
}

/* An error ending request rid (its field: the path msg starts with). */
static void send_error(tproc *t, uint64_t rid, const char *code, const char *msg) {
    zi_msg m;
    zi_im_error_pack(&(zi_im_error){.rid = (int64_t)rid, .code = code, .message = msg}, &m);
    zi_im_send(t->sock, &m);
}

/* Sends a message an encoder built (rc: the encoder's result) or, when it
 * could not be built, an error ending request rid instead. Returns rc. */
static int send_built(tproc *t, uint64_t rid, int rc, zi_msg *m, const zi_error *err) {
    if (!rc) {
        zi_im_send(t->sock, m);
        return ZI_OK;
    }
    zi_msg_free(m);
    send_error(t, rid, "internal", err && err->msg[0] ? err->msg : "out of memory for a message");
    return rc;
}

static dstate *find_state(tproc *t, uint64_t rid) {
    for (size_t i = 0; i < t->n_st; i++)
        if (t->st[i].rid == rid) return &t->st[i];
    return NULL;
}

static void drop_state(tproc *t, uint64_t rid) {
    for (size_t i = 0; i < t->n_st; i++)
        if (t->st[i].rid == rid) {
            zi_stop_free(&t->st[i].stop);
            t->st[i] = t->st[--t->n_st];
            return;
        }
}

/* s[0..n) ends with the NUL-terminated tail. */
static bool ends_with(const char *s, size_t n, const char *tail) {
    size_t k = strlen(tail);
    return n >= k && !memcmp(s + n - k, tail, k);
}

/* How a rendered prompt leaves the thinking section (docs/protocol.md):
 * *open when it ends, but for whitespace, with `<think>` (the template
 * opened the section for the model: Qwen 3.5's unless enable_thinking is
 * false, which closes it instead; DeepSeek R1's), so the model writes the
 * reasoning and only the closing marker; or with harmony's
 * `<|channel|>analysis<|message|>`. *harmony when the prompt is gpt-oss's
 * harmony (it ends with `<|start|>assistant`, or with that analysis
 * opener): the section is the analysis channel, ended by `<|end|>`. */
static void thinking_markup(const char *s, size_t n, bool *open, bool *harmony) {
    static const char analysis[] = "<|channel|>analysis<|message|>";
    *harmony = ends_with(s, n, "<|start|>assistant") || ends_with(s, n, analysis);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == '\t')) n--;
    *open = ends_with(s, n, "<think>") || ends_with(s, n, analysis);
}

/* The prompt's token ids for a request r, decoded from the msgpack req
 * (malloc'd). */
static int prompt_ids(tproc *t, const zi_request *r, const msgpack_object *req,
                      const zi_image_rgb *imgs, zi_prompt_image **pis, int32_t **ids, size_t *n,
                      bool *reasoning_open, bool *harmony, zi_error *err) {
    *reasoning_open = *harmony = false;
    if (r->prompt_kind == ZI_PROMPT_TOKENS) {
        for (size_t i = 0; i < r->prompt_tokens.n; i++)
            if (r->prompt_tokens.v[i] >= t->vocab)
                return zi_error_set(err, ZI_EINVAL,
                                    "prompt[%zu]: token id %d is outside the vocabulary (0..%d)", i,
                                    r->prompt_tokens.v[i], t->vocab - 1);
        *n = r->prompt_tokens.n;
        *ids = malloc((*n ? *n : 1) * sizeof **ids);
        if (!*ids) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        if (*n) memcpy(*ids, r->prompt_tokens.v, *n * sizeof **ids);
        return ZI_OK;
    }
    if (r->prompt_kind == ZI_PROMPT_TEXT && r->n_images)
        return zi_image_prompt_build(t->tok, r->prompt_text.p, r->prompt_text.len, 1, 1, imgs,
                                     r->n_images, &t->img_pp, ids, n, pis, err);
    if (r->prompt_kind == ZI_PROMPT_TEXT)
        return zi_tokenizer_encode(t->tok, r->prompt_text.p ? r->prompt_text.p : "",
                                   r->prompt_text.len, 1, 1, ids, n, err);
    if (!t->tmpl) {
        char names[128];
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "messages: the model has no chat template%s; send a prompt instead, "
                            "or start the server with --chat-template FILE|NAME (built-in: %s)",
                            t->file_tmpl_bad ? " it can use (its own does not compile)" : "",
                            zi_chat_template_name_list(names, sizeof names));
    }
    /* Messages (with tool calls and tool results), tools and
     * chat_template_options, rendered as apply_chat_template(messages,
     * tools=tools, **options) would; made from the request's own msgpack. */
    char *text = NULL;
    size_t len = 0;
    int rc = zi_chat_render_request(t->tmpl, t->tool_caps, r, zi_map_get(req, "tools"),
                                    zi_map_get(req, "chat_template_options"), t->bos_text,
                                    t->eos_text, &text, &len, err);
    if (rc) return rc;
    thinking_markup(text, len, reasoning_open, harmony);
    /* The template writes its own special tokens (BOS included). */
    if (r->n_images)
        rc = zi_image_prompt_build(t->tok, text, len, 0, 1, imgs, r->n_images, &t->img_pp, ids, n,
                                   pis, err);
    else
        rc = zi_tokenizer_encode(t->tok, text, len, 0, 1, ids, n, err);
    free(text);
    return rc;
}

/* A thinking budget (docs/protocol.md): the context's budget, whether the
 * prompt opened the section, and the ids the worker forces to end it. A
 * constrained completion cannot take forced tokens its grammar may not
 * allow, so the two are refused together. */
static int thinking_budget(tproc *t, const zi_request *r, bool open, bool harmony,
                           zi_text_context *ctx, zi_error *err) {
    const char *end = harmony ? "<|end|><|start|>assistant<|channel|>final<|message|>"
                              : "\n</think>\n\n";
    if (zi_text_context_constrained(ctx) || r->response_format.len)
        return zi_error_set(err, ZI_EINVAL,
                            "max_thinking_tokens: cannot be combined with response_format, "
                            "grammar or regex (the forced end of the section may break them)");
    if (!t->tok)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "max_thinking_tokens: needs the model's tokenizer");
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = zi_tokenizer_encode(t->tok, end, strlen(end), 0, 1, &ids, &n, err);
    if (!rc) rc = zi_i32_list_set(&ctx->thinking_end, ids, n, err);
    free(ids);
    ctx->thinking_budget = r->max_thinking_tokens;
    ctx->thinking_open = open;
    ctx->thinking_harmony = harmony;
    return rc;
}

static int add_stops(const zi_str_list *l, const char **v, size_t *lens, size_t *n) {
    for (size_t i = 0; i < l->n; i++) {
        v[*n] = l->v[i].p ? l->v[i].p : "";
        lens[(*n)++] = l->v[i].len;
    }
    return 0;
}

/* A fresh decode state for request rid (any old one dropped): its stop
 * strings (the request's and its sampling parameters'), detokenize and
 * min_new_tokens. */
static int new_state(tproc *t, uint64_t rid, const zi_request *r, bool reasoning_open,
                     bool reasoning_harmony, zi_error *err) {
    size_t ns = r->stop.n + r->sampling_params.stop.n, k = 0;
    const char **sv = calloc(ns + 1, sizeof *sv);
    size_t *sl = calloc(ns + 1, sizeof *sl);
    int rc = ZI_OK;
    if (!sv || !sl) rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    if (!rc) {
        add_stops(&r->stop, sv, sl, &k);
        add_stops(&r->sampling_params.stop, sv, sl, &k);
        drop_state(t, rid);
        if (t->n_st == t->cap_st) {
            dstate *p = zi_grow(t->st, &t->cap_st, sizeof *p, 16);
            if (!p)
                rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
            else
                t->st = p;
        }
    }
    if (!rc) {
        dstate *d = &t->st[t->n_st];
        d->rid = rid;
        d->detokenize = r->sampling_params.detokenize;
        d->special = !r->skip_special_tokens;
        d->min_new = r->sampling_params.min_new_tokens;
        d->n_gen = 0;
        d->reasoning_open = reasoning_open;
        d->reasoning_harmony = reasoning_harmony;
        zi_detok_init(&d->dt);
        rc = zi_stop_init(&d->stop, sv, sl, k, err);
        if (!rc) t->n_st++;
    }
    free(sv);
    free(sl);
    return rc;
}

/* Feeds ids to a request's decode state: the text they complete, through
 * the stop matcher, is appended to *out; *used counts the ids consumed (a
 * stop string ends the feed, *stopped). */
static int feed_ids(tproc *t, dstate *d, const int32_t *ids, size_t n, char **out, size_t *out_len,
                    bool *stopped, size_t *used, zi_error *err) {
    char piece[ZI_TOKEN_MAX_BYTES + 16];
    int rc = ZI_OK;
    for (size_t i = 0; !rc && i < n && !*stopped; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab)
            return zi_error_set(err, ZI_EINVAL, "token_ids: id %d is outside the vocabulary",
                                ids[i]);
        *used = i + 1;
        d->n_gen++;
        if (!d->detokenize && d->stop.n == 0) continue; /* stop strings need the text */
        /* An end-of-generation token's text stays out even when special
         * tokens are kept (it ends the completion; vLLM's way too). */
        int sp = d->special && !zi_tokenizer_is_eog(t->tok, ids[i]);
        int w = zi_detok_push(&d->dt, t->tok, ids[i], sp, piece, sizeof piece);
        if (w < 0)
            return zi_error_set(err, ZI_EINVAL, "token_ids: id %d is outside the vocabulary",
                                ids[i]);
        /* A stop string must lie in text of the tokens after the first
         * min_new_tokens (the EOS and stop ids are masked until then too). */
        if (d->n_gen <= d->min_new)
            rc = zi_stop_pass(&d->stop, piece, (size_t)w, out, out_len, err);
        else
            rc = zi_stop_feed(&d->stop, piece, (size_t)w, out, out_len, stopped, err);
    }
    return rc;
}

/* An encode with "replay" (the router's failover, docs/protocol.md): the
 * request's decode state is rebuilt from the ids another tokenizer had
 * decoded, their text discarded (the client has it), so that the ids that
 * follow decode as they would have there. Nothing is sent on success. */
static void on_replay(tproc *t, const zi_request *r, const msgpack_object *replay, uint64_t rid) {
    zi_error err = {0};
    zi_codec_limits lim = zi_codec_limits_default();
    int32_t *ids = NULL;
    size_t n = 0, used = 0;
    char *out = NULL;
    size_t out_len = 0;
    bool stopped = false;
    int rc = zi_codec_decode_tokens(replay, &lim, "replay", &ids, &n, &err);
    if (!rc) rc = new_state(t, rid, r, false, false, &err);
    dstate *d = rc ? NULL : find_state(t, rid);
    if (!rc) rc = feed_ids(t, d, ids, n, &out, &out_len, &stopped, &used, &err);
    if (!rc && stopped)
        rc = zi_error_set(&err, ZI_EINVAL, "replay: a stop string ends within the replayed ids");
    if (rc) {
        send_error(t, rid, rc == ZI_ENOMEM ? "internal" : "invalid_request", err.msg);
        drop_state(t, rid);
    } else {
        zi_log(&t->log, ZI_LOG_DEBUG, "request %llu: decode state rebuilt from %zu ids",
               (unsigned long long)rid, n);
    }
    free(out);
    free(ids);
}

/* Prompt image pi into ctx (its pixels and positions move there). */
static int add_image(tproc *t, zi_text_context *ctx, zi_prompt_image *pi, zi_error *err) {
    zi_ctx_image im = {.hash = pi->hash,
                       .n_tiles = pi->n_tiles,
                       .tile_size = pi->tile_size,
                       .tile_tokens = pi->tile_tokens,
                       .non_causal = t->img_non_causal};
    if (!(im.tile_first = malloc((size_t)pi->n_tiles * sizeof *im.tile_first)))
        return zi_error_set(err, ZI_ENOMEM, "out of memory");
    for (int i = 0; i < pi->n_tiles; i++) im.tile_first[i] = (int32_t)pi->tile_first[i];
    im.pixels = pi->pixels, pi->pixels = NULL;
    int rc = zi_text_context_add_image(ctx, &im, err);
    zi_ctx_image_free(&im); /* what add_image did not take */
    return rc;
}

static void on_encode(tproc *t, const msgpack_object *o, uint64_t rid) {
    zi_im_encode em;
    zi_error err = {0};
    zi_request r;
    zi_request_init(&r);
    zi_text_context ctx;
    zi_text_context_zero(&ctx);
    int32_t *ids = NULL;
    size_t n = 0;
    const char *code = "invalid_request";
    int64_t max_length = t->ctx_train;
    /* The router sends the smallest worker's context; without one (no
     * worker connected) the model's own limit applies. */
    int rc = zi_im_encode_unpack(o, &em, &err);
    if (em.has_max_length && em.max_length >= 2) max_length = em.max_length;
    zi_codec_limits lim = zi_codec_limits_default();
    const msgpack_object *ro = em.request_obj;
    if (!rc) rc = zi_codec_decode_request(ro, &lim, "", &r, &err);
    const msgpack_object *replay = zi_map_get(o, "replay");
    if (!rc && replay) { /* a failover: the state, not the prompt */
        on_replay(t, &r, replay, rid);
        zi_request_free(&r);
        return;
    }
    /* A stop id outside the vocabulary could never stop anything: refuse it
     * here, with a message for the client (the worker refuses it too, for
     * this request alone, and the generator ignores such ids). */
    if (!rc && r.sampling_params.stop_token_ids.n > (size_t)t->vocab) /* bounds per-step work */
        rc = zi_error_set(&err, ZI_EINVAL,
                          "sampling_params.stop_token_ids: %zu ids, more than the vocabulary's %d",
                          r.sampling_params.stop_token_ids.n, t->vocab);
    for (size_t i = 0; !rc && i < r.sampling_params.stop_token_ids.n; i++)
        if (r.sampling_params.stop_token_ids.v[i] >= t->vocab)
            rc = zi_error_set(&err, ZI_EINVAL,
                              "sampling_params.stop_token_ids[%zu]: token id %d is outside the "
                              "vocabulary (0..%d)",
                              i, r.sampling_params.stop_token_ids.v[i], t->vocab - 1);
    /* A biased id outside the vocabulary has no logit to move. */
    for (size_t i = 0; !rc && i < r.sampling_params.logit_bias.n; i++)
        if (r.sampling_params.logit_bias.v[i].id >= t->vocab)
            rc = zi_error_set(&err, ZI_EINVAL,
                              "sampling_params.logit_bias: token id %d is outside the "
                              "vocabulary (0..%d)",
                              r.sampling_params.logit_bias.v[i].id, t->vocab - 1);
    /* Structured output (the router refused what cannot be honoured): the
     * worker holds decoding to a JSON object, of the schema if one is given. */
    int rf = ZI_RF_NONE;
    char *schema = NULL;
    if (!rc) rc = zi_response_format_kind(&r.response_format, &rf, &schema, &err);
    /* Images: r.images[0 .. r.n_images), each the file's bytes as the
     * client sent them (zi_bytes), in the order of the ZI_MEDIA_MARKERs in
     * r.prompt_text or the messages' contents (the decoder checked one
     * marker per image): decoded here (a bad one named by its index),
     * then laid out at their markers when the prompt is encoded. */
    if (!rc && r.n_images && !t->images)
        rc = zi_error_set(&err, ZI_EUNSUPPORTED,
                          "images: images need a model with an image projector: start the "
                          "server with --mmproj FILE");
    zi_image_rgb *imgs = NULL;
    zi_prompt_image *pis = NULL;
    if (!rc && r.n_images && !(imgs = calloc(r.n_images, sizeof *imgs)))
        rc = zi_error_set(&err, ZI_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < r.n_images; i++)
        if ((rc = zi_image_decode(r.images[i].p, r.images[i].len, &t->img_lim, &imgs[i], &err)))
            zi_error_prefix(&err, "images[%zu]", i);
    /* The cheap checks above first; then the template and the encoding. */
    bool reasoning_open = false, harmony = false;
    zi_tts_encoded tts = {0};
    if (!rc && r.speech && !t->tok)
        rc = zi_error_set(&err, ZI_EUNSUPPORTED, "input: this model's tokenizer is not supported");
    if (!rc && r.speech) { /* the OuteTTS prompt; the context carries the plan's inputs */
        rc = zi_tts_encode(t->tok, t->voices, &r, &tts, &err);
        if (!rc) ids = tts.ids, n = tts.n, tts.ids = NULL;
        r.sampling_params.detokenize = false; /* audio, not text, comes back */
    } else if (!rc)
        rc = prompt_ids(t, &r, ro, imgs, &pis, &ids, &n, &reasoning_open, &harmony, &err);
    for (size_t i = 0; imgs && i < r.n_images; i++) zi_image_rgb_free(&imgs[i]);
    free(imgs);
    if (!rc && n == 0) rc = zi_error_set(&err, ZI_EINVAL, "prompt: it encodes to no tokens");
    if (!rc && (int64_t)n >= max_length)
        rc = zi_error_set(&err, ZI_ERANGE,
                          "prompt: %zu tokens leave no room to generate within the context of "
                          "%lld",
                          n, (long long)max_length);
    /* A context takes ids >= 0 at soft-token positions and its images
     * then write their keys there (zi_text_context_add_image). */
    for (size_t i = 0; pis && i < n; i++)
        if (ids[i] < 0) ids[i] = 0;
    if (!rc) rc = zi_text_context_init(&ctx, ids, n, max_length, &r.sampling_params, &err);
    for (size_t i = 0; !rc && pis && i < r.n_images; i++)
        rc = add_image(t, &ctx, &pis[i], &err);
    zi_prompt_images_free(pis, pis ? r.n_images : 0);
    if (!rc && r.speech) { /* it ends at <|audio_end|> */
        rc = zi_text_context_set_eos(&ctx, &tts.marker_ids[7], 1, &err);
        memcpy(ctx.tts_ids, tts.marker_ids, sizeof ctx.tts_ids);
        ctx.tts_words = tts.words, ctx.n_tts_words = tts.n_words, ctx.tts_format = r.speech_format;
        tts.words = NULL, tts.n_words = 0;
    } else if (!rc)
        rc = zi_text_context_set_eos(&ctx, t->eog.v, t->eog.n, &err);
    zi_tts_encoded_free(&tts);
    if (!rc) {
        ctx.log_probabilities = r.logprobs;
        ctx.log_probabilities_echo = r.echo;
    }
    if (!rc && rf != ZI_RF_NONE) {
        const char *sj = rf == ZI_RF_JSON_SCHEMA ? schema : ZI_JSON_OBJECT_SCHEMA;
        ctx.has_json_schema = true;
        rc = zi_string_set(&ctx.json_schema, sj, strlen(sj), &err);
    }
    free(schema);
    if (!rc && r.grammar.len) /* the worker compiles it (and refuses a bad one) */
        rc = zi_string_set(&ctx.grammar, r.grammar.p, r.grammar.len, &err);
    if (!rc && r.regex.len) /* the worker compiles it too */
        rc = zi_string_set(&ctx.regex, r.regex.p, r.regex.len, &err);
    if (!rc && r.max_thinking_tokens)
        rc = thinking_budget(t, &r, reasoning_open, harmony, &ctx, &err);
    if (!rc) { /* the worker resolves and checks them */
        memcpy(ctx.lora, r.lora, sizeof ctx.lora);
        ctx.n_lora = r.n_lora;
    }
    if (!rc) {
        char rs[32];
        int len = snprintf(rs, sizeof rs, "%llu", (unsigned long long)rid);
        rc = zi_string_set(&ctx.request_id, rs, (size_t)len, &err);
    }
    if (rc == ZI_EUNSUPPORTED)
        code = "unsupported";
    else if (rc == ZI_ENOMEM)
        code = "internal";
    /* Decode state: the stop strings of the request and of its sampling
     * parameters both apply. */
    if (!rc) rc = new_state(t, rid, &r, reasoning_open, reasoning_open && harmony, &err);
    if (rc) {
        send_error(t, rid, rc == ZI_ENOMEM ? "internal" : code, err.msg);
    } else {
        zi_msg m;
        zi_im_encoded em2 = {.rid = (int64_t)rid,
                             .has_prompt_tokens = true,
                             .prompt_tokens = (int64_t)n,
                             .context = &ctx};
        if (zi_im_encoded_pack(&em2, &m, &err)) {
            zi_msg_free(&m);
            drop_state(t, rid);
            send_error(t, rid, "internal", err.msg);
        } else {
            zi_im_send(t->sock, &m);
        }
    }
    free(ids);
    zi_text_context_free(&ctx);
    zi_request_free(&r);
}

static void on_decode(tproc *t, const msgpack_object *o, uint64_t rid) {
    zi_error err = {0};
    dstate *d = find_state(t, rid);
    if (!d) return; /* released meanwhile */
    zi_codec_limits lim = zi_codec_limits_default();
    zi_im_tokens dm;
    int rc = zi_im_decode_unpack(o, &dm, &err);
    const int32_t *ids = dm.token_ids.v;
    size_t n = dm.token_ids.n;
    zi_gen_status status = rc ? ZI_GEN_ACTIVE : dm.gstatus;
    char *out = NULL;
    size_t out_len = 0;
    bool stopped = false;
    char piece[ZI_TOKEN_MAX_BYTES + 16];
    size_t used = 0;
    if (!rc) rc = feed_ids(t, d, ids, n, &out, &out_len, &stopped, &used, &err);
    if (!rc && (d->detokenize || d->stop.n > 0) && !stopped && zi_gen_status_is_done(status)) {
        int w = zi_detok_flush(&d->dt, piece, sizeof piece);
        bool s2 = false;
        if (w > 0) rc = zi_stop_feed(&d->stop, piece, (size_t)w, &out, &out_len, &s2, &err);
        if (!rc && !s2) rc = zi_stop_flush(&d->stop, &out, &out_len, &err);
        stopped = s2;
    }
    if (rc) {
        send_error(t, rid, "internal", err.msg);
        drop_state(t, rid);
    } else {
        if (stopped) status = ZI_GEN_STOP;
        /* Log probabilities and the echoed prompt pass through to the
         * router; the log probabilities of tokens cut by a stop string go. */
        const msgpack_object *lpo = dm.logprobs.raw;
        const msgpack_object *pids = dm.prompt_token_ids.raw;
        zi_logprobs cut;
        zi_logprobs_init(&cut);
        bool use_cut = false;
        if (lpo && stopped && used < n) {
            zi_logprobs all;
            if (zi_codec_decode_logprobs(lpo, &lim, "logprobs", &all, NULL) == ZI_OK) {
                use_cut = true;
                for (size_t i = 0; i < used && i < all.n && use_cut; i++)
                    use_cut = zi_logprobs_push(&cut, all.token_logprobs[i], all.top[i].ids,
                                               all.top[i].logprobs, all.top[i].n, NULL) == ZI_OK;
                zi_logprobs_free(&all);
            }
            if (!use_cut) { /* the client asked for them: an error, not tokens without them */
                zi_logprobs_free(&cut);
                send_error(t, rid, "internal", "logprobs: cannot cut them at the stop string");
                drop_state(t, rid);
                free(out);
                zi_im_tokens_free(&dm);
                return;
            }
        }
        /* The echoed prompt's text too (the seeds' echo: "the original
         * prompt along with the generated output"), special tokens shown. */
        char *ptext = NULL;
        size_t plen = 0;
        if (pids) { /* (left out, not sent empty, if the ids cannot be read) */
            int32_t *pv = NULL;
            size_t pn = 0;
            if (zi_codec_decode_tokens(pids, &lim, "prompt_token_ids", &pv, &pn, NULL) != ZI_OK ||
                zi_tokenizer_decode(t->tok, pv, pn, 1, &ptext, &plen, NULL) != ZI_OK)
                ptext = NULL;
            free(pv);
        }
        zi_im_decoded dd = {.rid = (int64_t)rid,
                            .logprobs = {.raw = use_cut ? NULL : lpo, .lp = use_cut ? &cut : NULL},
                            .prompt_token_ids = dm.prompt_token_ids,
                            .prompt_logprobs = dm.prompt_logprobs,
                            .reasoning_open = d->reasoning_open,
                            .reasoning_harmony = d->reasoning_harmony,
                            .audio = dm.audio}; /* a speech request's samples */
        d->reasoning_open = d->reasoning_harmony = false;
        char *pclean = NULL;
        if (ptext) {
            size_t pl = 0;
            pclean = zi_utf8_clean(ptext, plen, &pl);
            dd.prompt_text = (zi_im_str){pclean ? pclean : "", pclean ? pl : 0};
            free(ptext);
        }
        /* With detokenize false the text was decoded only to find stop
         * strings: none goes out. */
        if (!d->detokenize) out_len = 0;
        /* Only a flush at the end can leave a partial character. */
        size_t cl = 0;
        char *clean = zi_utf8_clean(out ? out : "", out_len, &cl);
        dd.text = (zi_im_str){clean ? clean : "", clean ? cl : 0};
        dd.token_ids = (zi_im_ids){.set = true, .v = ids, .n = stopped ? used : n};
        const char *sname = zi_gen_status_name(status);
        dd.status = (zi_im_str){sname, strlen(sname)};
        if (stopped && d->stop.matched >= 0) /* which one (Anthropic's stop_sequence) */
            dd.stop_string =
                (zi_im_str){d->stop.stops[d->stop.matched], d->stop.lens[d->stop.matched]};
        zi_msg m;
        zi_error perr = {0};
        int prc = send_built(t, rid, zi_im_decoded_pack(&dd, &m, &perr), &m, &perr);
        free(clean);
        free(pclean);
        zi_logprobs_free(&cut);
        if (prc || zi_gen_status_is_done(status)) drop_state(t, rid);
    }
    free(out);
    zi_im_tokens_free(&dm);
}

static void on_tokenize(tproc *t, const msgpack_object *o, uint64_t rid) {
    zi_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    zi_im_tokenize tm;
    int rc = zi_im_tokenize_unpack(o, &tm, &err);
    if (!rc)
        rc = zi_tokenizer_encode(t->tok, tm.text.p, tm.text.n, tm.add_special, 1, &ids, &n, &err);
    if (rc) {
        send_error(t, rid, "invalid_request", err.msg);
        return;
    }
    zi_msg m;
    int prc = zi_im_tokenized_pack(
        &(zi_im_util_reply){.rid = (int64_t)rid, .token_ids = {.set = true, .v = ids, .n = n}}, &m);
    send_built(t, rid, prc, &m, NULL);
    free(ids);
}

static void on_detokenize(tproc *t, const msgpack_object *o, uint64_t rid) {
    zi_error err = {0};
    char *text = NULL;
    size_t len = 0;
    zi_im_detokenize dm;
    int rc = zi_im_detokenize_unpack(o, &dm, &err);
    if (!rc) rc = zi_tokenizer_decode(t->tok, dm.token_ids.v, dm.token_ids.n, 0, &text, &len, &err);
    if (rc) {
        if (strncmp(err.msg, "token_ids", 9) != 0) zi_error_prefix(&err, "token_ids");
        send_error(t, rid, "invalid_request", err.msg);
    } else {
        size_t cl = 0;
        char *clean = zi_utf8_clean(text, len, &cl); /* ids may end mid-character */
        zi_msg m;
        int prc = zi_im_detokenized_pack(
            &(zi_im_util_reply){.rid = (int64_t)rid, .text = {clean ? clean : "", clean ? cl : 0}},
            &m);
        send_built(t, rid, prc, &m, NULL);
        free(clean);
    }
    free(text);
    zi_im_ids_free(&dm.token_ids);
}

/* embed_encode: the inputs' token ids back as embed_encoded (the router
 * passes them to a worker), or an error naming the input. */
static void on_embed_encode(tproc *t, const msgpack_object *o, uint64_t rid) {
    zi_error err = {0};
    zi_im_embed_encode em;
    zi_embeddings_request req;
    int64_t n_trunc = 0;
    int rc = zi_im_embed_encode_unpack(o, &em, &err);
    if (!rc) rc = zi_embed_encode(t->tok, t->vocab, &em, t->rerank_tmpl, &req, &n_trunc, &err);
    if (rc) {
        send_error(t, rid,
                   rc == ZI_ENOMEM         ? "internal"
                   : rc == ZI_EUNSUPPORTED ? "unsupported"
                                           : "invalid_request",
                   err.msg);
        return;
    }
    if (n_trunc)
        zi_log(&t->log, ZI_LOG_INFO, "request %llu: %lld embedding inputs truncated",
               (unsigned long long)rid, (long long)n_trunc);
    zi_msg m;
    zi_im_embed e = {.rid = (int64_t)rid,
                     .prompt_tokens = (int64_t)req.start[req.n_inputs],
                     .truncated = n_trunc,
                     .pooling = em.pooling,
                     .normalize = em.normalize,
                     .req = &req};
    int prc = zi_im_embed_pack(ZI_IM_EMBED_ENCODED, &e, &m, &err);
    send_built(t, rid, prc, &m, &err);
    zi_embeddings_request_free(&req);
}

static void on_message(tproc *t, const void *buf, size_t len) {
    zi_error err = {0};
    msgpack_unpacked u;
    if (zi_msgpack_parse(buf, len, NULL, &u, &err)) {
        zi_log(&t->log, ZI_LOG_WARN, "bad message from the router: %s", err.msg);
        return;
    }
    const msgpack_object *o = &u.data;
    int64_t rid = 0;
    zi_im_type type = zi_im_type_of(o);
    if (type == ZI_IM_REREGISTER) {
        while (t->n_st) drop_state(t, t->st[0].rid);
        send_register(t);
    } else if (zi_im_rid(o, &rid, &err) != ZI_OK) {
        zi_log(&t->log, ZI_LOG_WARN, "message from the router without rid");
    } else if (!t->tok && (type == ZI_IM_ENCODE || type == ZI_IM_TOKENIZE ||
                           type == ZI_IM_DETOKENIZE || type == ZI_IM_DECODE)) {
        send_error(t, (uint64_t)rid, "unsupported", t->no_tok);
    } else if (type == ZI_IM_ENCODE) {
        on_encode(t, o, (uint64_t)rid);
    } else if (type == ZI_IM_DECODE) {
        on_decode(t, o, (uint64_t)rid);
    } else if (type == ZI_IM_RELEASE) {
        drop_state(t, (uint64_t)rid);
    } else if (type == ZI_IM_TOKENIZE) {
        on_tokenize(t, o, (uint64_t)rid);
    } else if (type == ZI_IM_DETOKENIZE) {
        on_detokenize(t, o, (uint64_t)rid);
    } else if (type == ZI_IM_EMBED_ENCODE) {
        on_embed_encode(t, o, (uint64_t)rid);
    } else {
        zi_log(&t->log, ZI_LOG_WARN, "unknown message type from the router");
    }
    msgpack_unpacked_destroy(&u);
}

/* The model's context length and chat template, from the GGUF metadata;
 * --chat-template's instead of the file's, when given (an error then). */
static int load_meta(tproc *t, const zi_gguf *g, zi_error *err) {
    zi_str arch = {0};
    char key[160];
    t->ctx_train = 2048;
    if (zi_gguf_get_str(g, "general.architecture", &arch, NULL) == ZI_OK && arch.len < 100) {
        snprintf(key, sizeof key, "%.*s.context_length", (int)arch.len, arch.ptr);
        int64_t v;
        if (zi_gguf_get_i64(g, key, &v, NULL) == ZI_OK && v > 1) t->ctx_train = v;
    }
    if (!t->tok) return ZI_OK; /* ids only: no text, no template */
    if (zi_tokenizer_eog_ids(t->tok, &t->eog, err)) return err->code;
    zi_str rr = {0};
    if (zi_gguf_get_str(g, "tokenizer.chat_template.rerank", &rr, NULL) == ZI_OK &&
        !(t->rerank_tmpl = strndup(rr.ptr, (size_t)rr.len)))
        return zi_error_set(err, ZI_ENOMEM, "out of memory");
    zi_str tmpl = {0};
    if (t->tmpl_arg) {
        if (zi_chat_template_from_arg(t->tmpl_arg, &t->tmpl, err)) return err->code;
        zi_log(&t->log, ZI_LOG_INFO, "chat template: --chat-template %s", t->tmpl_arg);
    } else if (zi_gguf_get_str(g, "tokenizer.chat_template", &tmpl, NULL) == ZI_OK) {
        zi_error e2 = {0};
        if (zi_chat_template_compile(tmpl.ptr, (size_t)tmpl.len, &t->tmpl, &e2)) {
            zi_log(&t->log, ZI_LOG_WARN, "chat template not usable (messages refused): %s", e2.msg);
            t->file_tmpl_bad = true;
        }
    }
    char buf[ZI_TOKEN_MAX_BYTES + 1];
    int32_t ids[2] = {zi_tokenizer_bos(t->tok), zi_tokenizer_eos(t->tok)};
    char **dst[2] = {&t->bos_text, &t->eos_text};
    for (int i = 0; i < 2; i++) {
        if (ids[i] < 0) continue;
        int n = zi_tokenizer_token_bytes(t->tok, ids[i], 1, buf, sizeof buf - 1);
        if (n < 0 || n >= (int)sizeof buf) continue;
        buf[n] = '\0';
        *dst[i] = strdup(buf);
    }
    if (t->tmpl) {
        t->tool_caps = zi_chat_tools_native(t->tmpl, t->bos_text, t->eos_text);
        zi_log(&t->log, ZI_LOG_INFO, "chat template: tool messages %s",
               !t->tool_caps ? "sent as text turns (the template does not render them)"
               : t->tool_caps & ZI_CHAT_TOOLS_EMPTY_CONTENT
                   ? "rendered by the template (a null content as \"\")"
                   : "rendered by the template");
    }
    return ZI_OK;
}

/* A file whose tokenizer zinfer does not implement (err: why) still
 * serves token ids: the vocabulary size comes from tokenizer.ggml.tokens,
 * and text requests get err's message. */
static int ids_only(tproc *t, const zi_gguf *g, zi_error *err) {
    const zi_gguf_kv *toks = zi_gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!toks || toks->type != ZI_GGUF_ARRAY || toks->arr_len < 1 || toks->arr_len > (1u << 24))
        return err->code;
    snprintf(t->no_tok, sizeof t->no_tok, "%s; token ids only", err->msg);
    zi_log(&t->log, ZI_LOG_WARN, "text requests refused: %s", t->no_tok);
    t->vocab = (int32_t)toks->arr_len;
    memset(err, 0, sizeof *err);
    return ZI_OK;
}

int main(int argc, char **argv) {
    char model[4096];
    const char *router = zi_option_get(ZI_O_ROUTER)->def_text;
    int level = (int)zi_option_def(ZI_O_LOG_LEVEL);
    const char *tmpl_arg = NULL, *mmproj = NULL, *model_name = NULL, *voices = NULL;
    uint64_t max_pixels = (uint64_t)zi_option_def(ZI_O_MAX_IMAGE_PIXELS);
    const char *curve_secret = NULL, *router_key = NULL; /* key files */
    int check_only = 0;
    zi_default_model_path(model, sizeof model);
    /* Each value checked against options.h's table, as `zinfer serve`
     * checks what it passes on. */
    for (int i = 1; i < argc; i++) {
        zi_opt_id id;
        long long x;
        const char *v;
        zi_error aerr = {0};
        if (zi_options_next(ZI_OWN_TOKENIZER, argc, argv, &i, &id, &x, &v, &aerr)) {
            fprintf(stderr, "zinfer-tokenizer: %s\n", aerr.msg);
            return 2;
        }
        switch (id) {
        case ZI_O_HELP:
            fputs(USAGE, stdout);
            zi_options_usage(stdout, ZI_OWN_TOKENIZER, 21);
            return 0;
        case ZI_O_CHECK_ARGS:
            check_only = 1;
            break;
        case ZI_O_ROUTER:
            router = v;
            break;
        case ZI_O_CURVE_SECRET:
            curve_secret = v;
            break;
        case ZI_O_ROUTER_KEY:
            router_key = v;
            break;
        case ZI_O_MODEL:
            snprintf(model, sizeof model, "%s", v);
            break;
        case ZI_O_MODEL_NAME:
            model_name = v;
            break;
        case ZI_O_CHAT_TEMPLATE:
            tmpl_arg = v;
            break;
        case ZI_O_MMPROJ:
            mmproj = v;
            break;
        case ZI_O_MAX_IMAGE_PIXELS:
            max_pixels = (uint64_t)x;
            break;
        case ZI_O_VOICES:
            voices = v;
            break;
        case ZI_O_LOG_LEVEL:
            level = (int)x;
            break;
        default: /* the table gives the tokenizer no other option */
            break;
        }
    }
    if (check_only) return 0;
    tproc t;
    memset(&t, 0, sizeof t);
    t.log = (zi_logger){.out = stderr, .level = level, .tag = "zinfer-tokenizer"};
    t.tmpl_arg = tmpl_arg;
    t.voices = voices;
    if (model_name) /* the router sends it the requests for this name */
        snprintf(t.model_name, sizeof t.model_name, "%.200s", model_name);
    else
        zi_model_name_of_path(model, t.model_name, 201);
    zi_stop_signals_install();

    zi_error err = {0};
    /* Keys before the vocabulary: a bad key file fails in a moment. */
    zi_curve_client curve;
    zi_curve_watch watch = {0};
    if (zi_curve_client_load(curve_secret, router_key, &curve, &err) != ZI_OK) {
        zi_log(&t.log, ZI_LOG_ERROR, "%s", err.msg);
        return 2;
    }
    zi_gguf *g = NULL;
    int rc = zi_gguf_open(model, &g, &err);
    if (!rc && (rc = zi_tokenizer_load(g, &t.tok, &err))) zi_error_prefix(&err, "%s", model);
    if (rc == ZI_EUNSUPPORTED) rc = ids_only(&t, g, &err);
    if (!rc) {
        if (t.tok) t.vocab = zi_tokenizer_vocab_size(t.tok);
        rc = load_meta(&t, g, &err);
    }
    zi_gguf_close(g);
    if (!rc && mmproj) { /* its header only: the workers load the tower */
        zi_vision_config vc;
        rc = zi_vision_config_load(mmproj, 0, &vc, &err);
        if (!rc) {
            t.images = true;
            zi_image_prompt_params(&vc, &t.img_pp);
            t.img_non_causal = zi_image_prompt_non_causal(&vc);
            zi_image_limits_default(&t.img_lim);
            t.img_lim.max_pixels = max_pixels;
            zi_log(&t.log, ZI_LOG_INFO, "images: %s, %d px tiles of %d soft tokens", mmproj,
                   vc.image_size, vc.n_tokens);
        }
    }
    if (rc) {
        /* The same file fails the same way on every start: `zinfer serve`
         * reports it once and stops instead of restarting this process
         * (common/startup.h). */
        if (!zi_startup_report(err.msg)) zi_log(&t.log, ZI_LOG_ERROR, "%s", err.msg);
        zi_tokenizer_free(t.tok);
        zi_i32_list_free(&t.eog);
        return ZI_EXIT_CONFIG;
    }
    void *zctx = zmq_ctx_new();
    t.sock = zi_backend_socket(zctx, router, &curve, &err);
    if (t.sock &&
        zi_curve_watch_start(&watch, zctx, t.sock, "the router", &curve, &t.log, &err) != ZI_OK) {
        zmq_close(t.sock);
        t.sock = NULL;
    }
    if (!t.sock) {
        zi_log(&t.log, ZI_LOG_ERROR, "%s", err.msg);
        rc = 1;
    } else {
        zi_log(&t.log, ZI_LOG_INFO, "%d tokens, %zu end-of-generation ids, context %lld; router %s",
               t.vocab, t.eog.n, (long long)t.ctx_train, router);
        send_register(&t);
    }
    int64_t last_hb = zi_now_ms();
    while (!rc && !zi_stop_requested()) {
        zmq_pollitem_t it = {t.sock, 0, ZMQ_POLLIN, 0};
        int pr = zmq_poll(&it, 1, 200);
        if (pr < 0 && errno != EINTR) break;
        for (;;) {
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, t.sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&msg);
                break;
            }
            on_message(&t, zmq_msg_data(&msg), zmq_msg_size(&msg));
            zmq_msg_close(&msg);
            if (zi_now_ms() - last_hb >= 1000) break; /* keep heartbeating under load */
        }
        zi_curve_watch_poll(&watch);
        if (zi_now_ms() - last_hb >= 1000) {
            send_heartbeat(&t);
            last_hb = zi_now_ms();
        }
    }
    zi_log(&t.log, ZI_LOG_INFO, "shutting down");
    while (t.n_st) drop_state(&t, t.st[0].rid);
    free(t.st);
    zi_curve_watch_stop(&watch);
    zmq_close(t.sock);
    zmq_ctx_term(zctx);
    zi_tokenizer_free(t.tok);
    zi_i32_list_free(&t.eog);
    zi_chat_template_free(t.tmpl);
    free(t.bos_text);
    free(t.eos_text);
    free(t.rerank_tmpl);
    return rc;
}
