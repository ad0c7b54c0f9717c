/*
 * worker_main.c - the `zinfer-worker` process: one model replica behind the
 * router.
 *
 * It connects a DEALER socket to the router's backend address, registers
 * (role "worker", its slot count and context size), loads the model and
 * then runs the generator loop:
 *
 *   take new contexts and cancellations from the router (non-blocking while
 *   anything is running, 100 ms otherwise) -> --num-steps generator steps
 *   over every live context (each one batched forward pass: continuous
 *   batching) -> send each request's new token ids, log probabilities and
 *   final status -> release finished contexts -> heartbeat once a second.
 *
 * A worker that cannot start with its options and files (the model does
 * not load, its weights and KV cache do not fit in memory) exits with
 * ZI_EXIT_CONFIG, its error handed to `zinfer serve` (common/startup.h),
 * which stops instead of restarting it; a failure after it has started
 * keeps status 1, and serve restarts it.
 *
 * The router never sends more contexts than the worker has slots; a context
 * that arrives anyway, or that the generator cannot run (bad sampling
 * parameters, too long for a slot), is answered with an "error" message for
 * that request alone, so one bad request never stops the batch. Messages are
 * described in docs/protocol.md and encoded and decoded by protocol/imsg.h.
 *
 * Each sequence keeps the "start" message it came with (the router's note
 * in it), and ended ones are kept a few seconds: when the router asks to
 * register again (it restarted), the worker registers with them ("live")
 * and goes on generating; the new router takes over those its clients
 * come back for and cancels the rest (docs/protocol.md, "Router restart").
 * A router that stays away longer than --orphan-timeout (no connection)
 * leaves no one to send the tokens to: the worker drops its sequences and
 * frees their KV blocks.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "args.h"
#include "backend_select.h"
#include "codec.h"
#include "curve.h"
#include "cpu_backend.h"
#include "generator.h"
#include "imsg.h"
#include "imsg_lora.h"
#include "kv_blocks.h"
#include "log.h"
#include "lora.h"
#include "mem_plan.h"
#include "state_ckpt.h"
#include "model.h"
#include "options.h"
#include "spec_draft.h"
#include "tile_cache.h"
#include "vision.h"
#include "startup.h"
#include "vocab_trie.h"
#include "stop_signal.h"
#include "tokenizer.h"
#include "codec_mask.h"
#include "tts_stream.h"
#include "wav.h"
#include "wavtokenizer.h"
#include "wire.h"
#include "worker_embed.h"

static const char USAGE[] =
    "usage: zinfer-worker [options]\n"
    "\n"
    "A model worker: connects to the router, registers, and generates tokens\n"
    "for the requests the router assigns (continuous batching). Options (their\n"
    "ranges and defaults from common/options.c, as `zinfer serve` checks them):\n"
    "\n";

typedef struct live_ctx {
    uint64_t rid;
    zi_text_context ctx;
    bool echo_sent; /* the prompt's ids (and log probabilities) went out */
    /* The "start" message as it came (its context and the router's note):
     * handed back when a restarted router asks to register again. */
    char *start;
    size_t start_len;
    /* A speech request (its context's tts inputs): the codec plan its
     * draws are masked by (ctx.codec_plan points here) and its codes
     * decoded in blocks (tts_stream.h) */
    zi_codec_plan *plan;
    zi_tts_stream ts;
} live_ctx;

/* A sequence that ended lately: its final "tokens" message may have gone
 * to a router that died before passing it on, so a restarted router gets
 * it in the register's "live" list too (docs/protocol.md, "Router
 * restart"). Kept DONE_KEEP_MS, at most DONE_KEEP_MAX of them holding at
 * most DONE_KEEP_BYTES together. */
typedef struct done_seq {
    uint64_t rid;
    char *start;
    size_t start_len;
    int32_t *ids; /* the completion, the ending EOS left out */
    size_t n_ids;
    zi_gen_status status;
    int64_t t_ms; /* when it ended */
} done_seq;
#define DONE_KEEP_MS 15000
#define DONE_KEEP_MAX 256
#define DONE_KEEP_BYTES (64u << 20)

/* The --mmproj tower and the tiles it encoded lately (tile_cache.h), with
 * what it cost: the heartbeat's image counters. */
typedef struct wvision {
    zi_vision *v;
    zi_tile_cache *cache;
    uint64_t runs;  /* tiles run through the tower */
    double run_ms;  /* the time that took */
} wvision;

/* The prefix keys a worker remembers (the router's affinity table has
 * 1024 places). */
#define PKEYS_MAX 1024

typedef struct worker {
    zi_logger log;
    void *sock;
    zi_generator *gen;
    int slots, ctx_size;
    live_ctx *live; /* [slots] */
    int n_live;
    /* embed requests (worker_embed.h): each takes one of the slots too */
    zi_embed_job *jobs; /* [slots] */
    int n_jobs;
    zi_embed_model emodel;
    zi_rank_head rank; /* a reranker's classification head (emodel.rank points here) */
    zi_embed_input **emb; /* the unfinished inputs of a step */
    size_t emb_cap;
    char model_name[256];
    /* --kv-disk's directory and its sharing id (zi_kv_disk_share_id; 0:
     * no disk tier), told to the router in register for prefix affinity */
    const char *kv_disk_dir;
    uint64_t kv_disk_id;
    /* the router's prefix keys of the requests taken lately (start's
     * prefix_key), oldest first, each once: told in register, so that a
     * restarted router knows which prefixes this worker holds */
    uint64_t pkeys[PKEYS_MAX];
    int n_pkeys;
    char hybrid[32]; /* the architecture of a hybrid model (docs/hybrids.md), else "" */
    int vocab;
    bool encoder;    /* an encoder-only model (bert): embeddings, no generation */
    int64_t last_hb; /* when the last heartbeat went out (ms) */
    zi_curve_client curve; /* --curve-secret, --router-key */
    zi_curve_watch watch;  /* logs a refused CURVE handshake */
    const wvision *vision; /* --mmproj's tower (its v NULL: none) */
    /* LoRA adapters by place (a request's ids index them): --lora's in
     * order, then those loaded while serving (the lora message) in the
     * first free place; NULL: a free place (an unloaded adapter's) */
    zi_lora *loras[ZI_LORA_MAX_ADAPTERS];
    int n_loras;        /* places in use: loras[0..n_loras) */
    uint64_t lora_keys; /* the last zi_lora_key given */
    zi_model *model;    /* what adapters are loaded for */
    bool lora_budgeted; /* --memory-budget: adapters loaded while serving fit in lora_room */
    uint64_t lora_room; /* bytes of the budget the weights, buffers and KV cache leave */
    /* --tts-decoder: the speech codec decoder (NULL: none), on a CPU
     * backend of its own (the CUDA backend has none of its ops) */
    zi_backend *tts_be;
    zi_wavtok *tts;
    float *audio; /* the samples of one tokens message */
    size_t audio_cap;
    done_seq done[DONE_KEEP_MAX]; /* oldest first */
    int n_done;
    size_t done_bytes; /* their start messages and ids */
    long long orphan_ms;      /* --orphan-timeout (0: keep sequences until they end) */
    int64_t lost_ms;          /* when the router's connection closed (0: connected) */
    bool lost_held;           /* sequences were running then (the loss was logged) */
    uint64_t orphans_dropped; /* sequences dropped for want of a router */
} worker;

/* The adapters' names by place ("" for a free one), for register and
 * lora_done. */
static void lora_names(const worker *w, const char **names) {
    for (int i = 0; i < w->n_loras; i++) names[i] = w->loras[i] ? zi_lora_name(w->loras[i]) : "";
}

static size_t done_size(const done_seq *d) {
    return d->start_len + d->n_ids * sizeof *d->ids;
}

static void done_free(done_seq *d) {
    free(d->start);
    free(d->ids);
}

/* Forgets the ended sequences kept longer than DONE_KEEP_MS, and the
 * oldest while they hold more than DONE_KEEP_BYTES. */
static void done_prune(worker *w, int64_t now) {
    int k = 0;
    while (k < w->n_done &&
           (now - w->done[k].t_ms > DONE_KEEP_MS || w->done_bytes > DONE_KEEP_BYTES)) {
        w->done_bytes -= done_size(&w->done[k]);
        done_free(&w->done[k++]);
    }
    memmove(w->done, w->done + k, (size_t)(w->n_done - k) * sizeof *w->done);
    w->n_done -= k;
}

/* Keeps live sequence l, which ended with its ids [prompt_len, end). Its
 * start message moves into the record. */
static void done_keep(worker *w, live_ctx *l, int64_t end) {
    done_prune(w, zi_now_ms());
    if (w->n_done == DONE_KEEP_MAX) { /* the oldest goes first */
        w->done_bytes -= done_size(&w->done[0]);
        done_free(&w->done[0]);
        memmove(w->done, w->done + 1, (size_t)(DONE_KEEP_MAX - 1) * sizeof *w->done);
        w->n_done--;
    }
    const zi_text_context *c = &l->ctx;
    size_t n = end > c->prompt_len ? (size_t)(end - c->prompt_len) : 0;
    int32_t *ids = malloc(n ? n * sizeof *ids : 1);
    if (!ids || !l->start) { /* nothing to hand back: a restart ends it as unknown */
        free(ids);
        return;
    }
    if (n) memcpy(ids, c->tokens + c->prompt_len, n * sizeof *ids);
    w->done[w->n_done++] =
        (done_seq){l->rid, l->start, l->start_len, ids, n, c->status, zi_now_ms()};
    w->done_bytes += done_size(&w->done[w->n_done - 1]);
    l->start = NULL;
    done_prune(w, zi_now_ms());
}

/* Remembers the prefix key of a request taken (0: none), as the newest. */
static void pkey_note(worker *w, uint64_t key) {
    if (!key) return;
    int i = 0;
    while (i < w->n_pkeys && w->pkeys[i] != key) i++;
    if (i == w->n_pkeys && w->n_pkeys == PKEYS_MAX) i = 0; /* full: the oldest goes */
    if (i < w->n_pkeys) {
        memmove(&w->pkeys[i], &w->pkeys[i + 1], (size_t)(w->n_pkeys - i - 1) * sizeof *w->pkeys);
        w->n_pkeys--;
    }
    w->pkeys[w->n_pkeys++] = key;
}

/* register, with the sequences held ("live": running ones and those that
 * ended lately) when report is set: a router that restarted rebuilds its
 * requests from them (docs/protocol.md, "Router restart"). */
static void send_register(worker *w, bool report) {
    const char *names[ZI_LORA_MAX_ADAPTERS];
    lora_names(w, names);
    zi_im_live *live = NULL;
    size_t n = 0;
    if (report) done_prune(w, zi_now_ms());
    if (report && w->n_live + w->n_done > 0)
        live = calloc((size_t)(w->n_live + w->n_done), sizeof *live);
    for (int i = 0; live && i < w->n_live; i++) {
        const live_ctx *l = &w->live[i];
        if (!l->start) continue;
        const zi_text_context *c = &l->ctx;
        /* the ids already sent; those after go out in the next "tokens" */
        int64_t sent = c->completion_start_idx - c->prompt_len;
        live[n++] = (zi_im_live){.rid = (int64_t)l->rid,
                                 .start = l->start,
                                 .start_len = l->start_len,
                                 .token_ids = {.set = true,
                                               .v = c->tokens + c->prompt_len,
                                               .n = sent > 0 ? (size_t)sent : 0},
                                 .status = {"active", 6}};
    }
    for (int i = 0; live && i < w->n_done; i++) {
        const done_seq *d = &w->done[i];
        const char *st = zi_gen_status_name(d->status);
        live[n++] = (zi_im_live){.rid = (int64_t)d->rid,
                                 .start = d->start,
                                 .start_len = d->start_len,
                                 .token_ids = {.set = true, .v = d->ids, .n = d->n_ids},
                                 .status = {st, strlen(st)}};
    }
    zi_im_register reg = {
        .worker = true,
        .slots = w->slots,
        .max_length = w->ctx_size,
        .model = {w->model_name, strlen(w->model_name)},
        .vocab = w->vocab,
        .loras = names,
        .n_loras = (size_t)w->n_loras,
        .live = live,
        .n_live = n,
        .kv_disk_dir = {w->kv_disk_dir, w->kv_disk_dir ? strlen(w->kv_disk_dir) : 0},
        .kv_disk_id = w->kv_disk_id,
        .prefix_keys = w->pkeys,
        .n_prefix_keys = (size_t)w->n_pkeys};
    zi_msg m;
    if (zi_im_register_pack(&reg, &m) != ZI_OK) { /* out of memory: register without them */
        zi_msg_free(&m);
        reg.n_live = 0;
        zi_im_register_pack(&reg, &m);
    }
    if (n)
        zi_log(&w->log, ZI_LOG_INFO, "registering again with %zu sequences held (%d running)", n,
               w->n_live);
    zi_im_send(w->sock, &m);
    free(live);
}

/* A heartbeat with the load and the KV cache's counters (the router sums
 * them into `health`). */
static void send_heartbeat(worker *w) {
    zi_generator_stats st;
    zi_generator_get_stats(w->gen, &st);
    zi_im_heartbeat hb = {
        .load = w->n_live + w->n_jobs,
        .has_kv = true,
        .kv = {
            [ZI_KV_BLOCKS] = st.kv_blocks,
            [ZI_KV_BLOCK_SIZE] = st.block_size,
            [ZI_KV_USED] = st.kv_used,
            [ZI_KV_CACHED] = st.kv_cached,
            [ZI_KV_FREE] = st.kv_free,
            [ZI_KV_PREFIX_QUERY_TOKENS] = (int64_t)st.prefix_query_tokens,
            [ZI_KV_PREFIX_HIT_TOKENS] = (int64_t)st.prefix_hit_tokens,
            [ZI_KV_PREEMPTIONS] = (int64_t)st.preemptions,
            [ZI_KV_EVICTIONS] = (int64_t)st.evictions,
            [ZI_KV_SPEC_STEPS] = (int64_t)st.spec_steps,
            [ZI_KV_SPEC_DRAFTED] = (int64_t)st.spec_drafted,
            [ZI_KV_SPEC_ACCEPTED] = (int64_t)st.spec_accepted,
            [ZI_KV_IMAGE_TILES] = w->vision ? (int64_t)w->vision->runs : 0,
            [ZI_KV_IMAGE_ENCODE_US] = w->vision ? (int64_t)(w->vision->run_ms * 1e3) : 0,
            [ZI_KV_MEM_HIT_BLOCKS] = (int64_t)st.mem_hit_blocks,
            [ZI_KV_MEM_MISS_BLOCKS] = (int64_t)st.mem_miss_blocks,
            [ZI_KV_DISK_HIT_BLOCKS] = (int64_t)st.disk_hit_blocks,
            [ZI_KV_DISK_MISS_BLOCKS] = (int64_t)st.disk_miss_blocks,
            [ZI_KV_DISK_BYTES] = (int64_t)st.disk_bytes,
            [ZI_KV_DISK_WRITTEN] = (int64_t)st.disk_written_blocks,
            [ZI_KV_DISK_DROPPED] = (int64_t)st.disk_dropped_writes,
            [ZI_KV_DISK_REJECTED] = (int64_t)st.disk_rejected,
            [ZI_KV_DISK_READ_US] = (int64_t)st.disk_read_us,
            [ZI_KV_DISK_WRITE_US] = (int64_t)st.disk_write_us,
            [ZI_KV_ORPHANS_DROPPED] = (int64_t)w->orphans_dropped,
        }};
    zi_msg m;
    zi_im_heartbeat_pack(&hb, &m);
    zi_im_send(w->sock, &m);
}

/* Called after every layer of a forward pass: a pass over a long prompt
 * can outlast the router's heartbeat timeout, so heartbeats go out from
 * inside it too. */
static void on_progress(void *arg) {
    worker *w = arg;
    int64_t now = zi_now_ms();
    if (now - w->last_hb < 1000) return;
    send_heartbeat(w);
    w->last_hb = now;
}

/* The worker cannot start with its options and files: the error goes to
 * `zinfer serve` when it started this worker (which reports it once and
 * stops), else to the log. Returns the exit status for it. */
static int start_failed(worker *w, const char *msg) {
    if (!zi_startup_report(msg)) zi_log(&w->log, ZI_LOG_ERROR, "%s", msg);
    return ZI_EXIT_CONFIG;
}

/* An error ending request rid (its field: the path msg starts with). */
static void send_error(worker *w, uint64_t rid, const char *code, const char *msg) {
    zi_msg m;
    zi_im_error_pack(&(zi_im_error){.rid = (int64_t)rid, .code = code, .message = msg}, &m);
    zi_im_send(w->sock, &m);
}

static void drop_live(worker *w, int i) {
    zi_generator_release(w->gen, &w->live[i].ctx);
    zi_text_context_free(&w->live[i].ctx);
    zi_codec_plan_free(w->live[i].plan);
    zi_tts_stream_free(&w->live[i].ts);
    free(w->live[i].start);
    w->live[i] = w->live[w->n_live - 1];
    w->n_live--;
}

static void drop_job(worker *w, int i) {
    zi_embed_job_free(&w->jobs[i], w->gen);
    w->jobs[i] = w->jobs[--w->n_jobs];
}

/* --orphan-timeout: the router's connection closed and has not opened
 * again (a router that comes back, the same or a new one, reconnects; a
 * new one then asks for the sequences with reregister). Past the timeout
 * no client can get the tokens any more: the sequences and embed jobs are
 * dropped, their slots and KV blocks freed. */
static void check_orphans(worker *w, int64_t now) {
    if (!w->watch.down) {
        if (w->lost_ms && w->lost_held)
            zi_log(&w->log, ZI_LOG_INFO, "connected to the router again after %lld ms",
                   (long long)(now - w->lost_ms));
        w->lost_ms = 0;
        return;
    }
    if (!w->lost_ms) {
        w->lost_ms = now;
        w->lost_held = w->n_live + w->n_jobs > 0;
        if (w->lost_held)
            zi_log(&w->log, ZI_LOG_WARN,
                   "the router's connection closed; keeping %d sequences up to %lld ms "
                   "(--orphan-timeout) for a router to take them over",
                   w->n_live + w->n_jobs, w->orphan_ms);
        return;
    }
    if (w->orphan_ms <= 0 || now - w->lost_ms < w->orphan_ms || w->n_live + w->n_jobs == 0) return;
    zi_generator_stats st;
    zi_generator_get_stats(w->gen, &st);
    int used = st.kv_used, n = w->n_live + w->n_jobs;
    while (w->n_live > 0) drop_live(w, w->n_live - 1);
    while (w->n_jobs > 0) drop_job(w, w->n_jobs - 1);
    zi_generator_get_stats(w->gen, &st);
    w->orphans_dropped += (uint64_t)n;
    zi_log(&w->log, ZI_LOG_WARN,
           "no router for %lld ms (--orphan-timeout): dropped %d orphaned sequences, KV blocks "
           "in use %d -> %d",
           (long long)(now - w->lost_ms), n, used, st.kv_used);
}

static void drop_all(worker *w) {
    while (w->n_live > 0) drop_live(w, w->n_live - 1);
    while (w->n_jobs > 0) drop_job(w, w->n_jobs - 1);
    while (w->n_done > 0) done_free(&w->done[--w->n_done]);
    w->done_bytes = 0;
}

/* embed: a job of the request's inputs (worker_embed.h), run from the
 * next step on; a bad one is answered with an error naming the input. */
static void on_embed(worker *w, const msgpack_object *o, uint64_t rid) {
    zi_error err = {0};
    if (w->n_live + w->n_jobs >= w->slots) {
        send_error(w, rid, "overloaded", "every slot of this worker is in use");
        return;
    }
    if (w->hybrid[0]) { /* the generator would fail the whole step */
        char msg[160];
        snprintf(msg, sizeof msg, "embeddings of '%s' (a hybrid) are not supported", w->hybrid);
        send_error(w, rid, "unsupported", msg);
        return;
    }
    int rc = zi_embed_job_start(&w->jobs[w->n_jobs], rid, o, &w->emodel, &err);
    if (rc) {
        send_error(w, rid,
                   rc == ZI_EUNSUPPORTED ? "unsupported"
                   : rc == ZI_ENOMEM     ? "internal"
                                         : "invalid_request",
                   err.msg);
        return;
    }
    w->n_jobs++;
}

/* After a step: every job whose inputs are all done is answered and
 * dropped. */
static void send_embeddings(worker *w) {
    for (int i = w->n_jobs; i-- > 0;) {
        if (!zi_embed_job_done(&w->jobs[i])) continue;
        zi_error err = {0};
        zi_msg m;
        if (zi_embed_job_pack(&w->jobs[i], &m, &err) == ZI_OK) {
            zi_im_send(w->sock, &m); /* frees m */
        } else {
            zi_msg_free(&m);
            send_error(w, w->jobs[i].rid, "internal", err.msg);
        }
        drop_job(w, i);
    }
}

/* The unfinished inputs of every job, oldest job first, into w->emb. */
static int gather_inputs(worker *w, size_t *n, zi_error *err) {
    size_t need = 0;
    for (int i = 0; i < w->n_jobs; i++) need += w->jobs[i].req.n_inputs;
    if (need > w->emb_cap) {
        zi_embed_input **p = realloc(w->emb, need * sizeof *p);
        if (!p) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        w->emb = p;
        w->emb_cap = need;
    }
    *n = 0;
    for (int i = 0; i < w->n_jobs; i++)
        for (size_t k = 0; k < w->jobs[i].req.n_inputs; k++)
            if (!w->jobs[i].in[k].done) w->emb[(*n)++] = &w->jobs[i].in[k];
    return ZI_OK;
}

/* ZI_EINVAL naming `field` when an id of ids[0..n) is outside [0, vocab). */
static int check_ids(const worker *w, const char *field, const int32_t *ids, size_t n,
                     zi_error *err) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->vocab)
            return zi_error_set(err, ZI_EINVAL,
                                "%s[%zu]: token id %d is outside this model's "
                                "vocabulary of %d",
                                field, i, ids[i], w->vocab);
    return ZI_OK;
}

/* check_ids over a context's tokens, but an image's soft tokens hold keys
 * (negative, zi_ctx_image_key), which the codec matched to its images. */
static int check_ctx_tokens(const worker *w, const zi_text_context *c, zi_error *err) {
    for (int64_t i = 0; i < c->end_idx; i++)
        if (c->tokens[i] >= w->vocab ||
            (c->tokens[i] < 0 && !zi_text_context_soft_token(c, i, NULL, NULL)))
            return zi_error_set(err, ZI_EINVAL,
                                "context.tokens[%lld]: token id %d is outside this model's "
                                "vocabulary of %d",
                                (long long)i, c->tokens[i], w->vocab);
    return ZI_OK;
}

/* How many adapters are loaded. */
static int lora_count(const worker *w) {
    int n = 0;
    for (int i = 0; i < w->n_loras; i++) n += w->loras[i] != NULL;
    return n;
}

/* The request's adapters as indices of this worker's --lora list: a name
 * looked up, an id checked (ZI_EINVAL naming lora[i] otherwise). */
static int resolve_lora(const worker *w, zi_text_context *c, zi_error *err) {
    for (size_t i = 0; i < c->n_lora; i++) {
        zi_lora_ref *r = &c->lora[i];
        if (r->id < 0) {
            for (int j = 0; j < w->n_loras && r->id < 0; j++)
                if (w->loras[j] && !strcmp(zi_lora_name(w->loras[j]), r->name)) r->id = j;
            if (r->id < 0)
                return zi_error_set(err, ZI_EINVAL,
                                    "lora[%zu].name: this worker has no adapter '%s' (%d loaded)",
                                    i, r->name, lora_count(w));
        } else if (r->id >= w->n_loras || !w->loras[r->id]) {
            return zi_error_set(err, ZI_EINVAL,
                                "lora[%zu].id: %d is not an adapter of this worker (%d loaded)", i,
                                (int)r->id, lora_count(w));
        }
    }
    return ZI_OK;
}

/* A speech request's codec plan from its context's tts inputs, with the
 * codec ids this worker's decoder takes (the LLM's 4100 codec tokens cut
 * to the decoder's codebook, so a code it refuses is never drawn), and its
 * block decoder, which skips the blocks whose audio was sent before a
 * failover (the codes generated so far come with the context). */
static int speech_setup(worker *w, live_ctx *l, zi_error *err) {
    zi_text_context *c = &l->ctx;
    if (!w->tts)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "input: this worker has no speech decoder (zinfer serve "
                            "--tts-decoder FILE)");
    const int32_t *m = c->tts_ids;
    zi_codec_ids ids = {.code0 = m[0],
                        .n_codes = m[1],
                        .time0 = m[2],
                        .n_times = m[3],
                        .code_start = m[4],
                        .code_end = m[5],
                        .newline = m[6],
                        .audio_end = m[7]};
    int n_dec = zi_wavtok_get_config(w->tts)->n_vocab;
    if (ids.n_codes < 1 || ids.n_times < 1 || ids.code0 < 0 || ids.time0 < 0 ||
        ids.code0 + (int64_t)ids.n_codes > w->vocab || ids.time0 + (int64_t)ids.n_times > w->vocab)
        return zi_error_set(err, ZI_EINVAL, "context.tts.ids: outside this model's vocabulary");
    int32_t marks[4] = {ids.code_end, ids.newline, ids.audio_end,
                        ids.code_start < 0 ? ids.code_end : ids.code_start};
    int rc = check_ids(w, "context.tts.ids", marks, 4, err);
    for (size_t i = 0; !rc && i < c->n_tts_words; i++)
        rc = check_ids(w, "context.tts.words", c->tts_words[i].v, c->tts_words[i].n, err);
    if (rc) return rc;
    if (ids.n_codes > n_dec) ids.n_codes = n_dec;
    const int32_t **wv = malloc(c->n_tts_words * sizeof *wv);
    size_t *wn = malloc(c->n_tts_words * sizeof *wn);
    if (!wv || !wn) rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < c->n_tts_words; i++)
        wv[i] = c->tts_words[i].v, wn[i] = c->tts_words[i].n;
    if (!rc)
        rc = zi_codec_plan_create(&ids, (const int32_t *const *)wv, wn, c->n_tts_words, &l->plan,
                                  err);
    free(wv);
    free(wn);
    if (!rc) rc = zi_tts_stream_init(&l->ts, ZI_TTS_BLOCK_CODES, ZI_TTS_CONTEXT_CODES, err);
    int64_t n_gen = c->end_idx - c->prompt_len;
    int32_t *codes = n_gen > 0 && !rc ? malloc((size_t)n_gen * sizeof *codes) : NULL;
    if (!rc && n_gen > 0 && !codes) rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    if (!rc && n_gen > 0) { /* a failover: what the client has had already */
        size_t k = zi_codec_extract(&ids, c->tokens + c->prompt_len, (size_t)n_gen, codes);
        rc = zi_tts_stream_push(&l->ts, codes, k, err);
        size_t na = 0;
        if (!rc) rc = zi_tts_stream_take(&l->ts, NULL, 0, 0, NULL, &na, NULL, err);
    }
    free(codes);
    if (!rc) c->codec_plan = l->plan;
    return rc;
}

static void on_start(worker *w, const msgpack_object *c, uint64_t rid, const void *msg,
                     size_t msg_len) {
    zi_error err = {0};
    if (w->n_live >= w->slots) {
        send_error(w, rid, "overloaded", "every slot of this worker is in use");
        return;
    }
    live_ctx *l = &w->live[w->n_live];
    l->rid = rid;
    l->echo_sent = false;
    l->start = NULL;
    l->plan = NULL;
    memset(&l->ts, 0, sizeof l->ts);
    zi_codec_limits lim = zi_codec_limits_default();
    if (!c) {
        send_error(w, rid, "internal", "context: missing in start message");
        return;
    }
    if (zi_codec_decode_text_context(c, &lim, "context", &l->ctx, &err)) {
        send_error(w, rid, "internal", err.msg);
        return;
    }
    /* The codec checked the context's own invariants and its sampling
     * parameters; what only this worker knows is its vocabulary and context
     * size. A token id outside the vocabulary would fail the forward pass or
     * the sampler for every request in the step, so it is refused here, for
     * this request alone. A context arrives fresh: the worker assigns the
     * cache slot and runs every position. */
    int rc = ZI_OK;
    if (w->encoder)
        rc = zi_error_set(&err, ZI_EUNSUPPORTED,
                          "this model (%s) is an encoder: it serves embeddings (the embed op), "
                          "not generation",
                          w->model_name);
    if (!rc && (l->ctx.cache_seq_id >= 0 || l->ctx.start_idx != 0))
        rc = zi_error_set(&err, ZI_EINVAL, "context: already started (cache slot %lld, start %lld)",
                          (long long)l->ctx.cache_seq_id, (long long)l->ctx.start_idx);
    /* images: a vision tower to encode them, and tiles a step can hold */
    if (!rc) rc = zi_generator_check_images(w->gen, &l->ctx, &err);
    /* tiles of this worker's tower's shape: a mismatch found mid-step
     * would fail the whole step's requests, not this one */
    for (size_t i = 0; !rc && w->vision && w->vision->v && i < l->ctx.n_images; i++) {
        const zi_vision_config *c = zi_vision_get_config(w->vision->v);
        const zi_ctx_image *im = &l->ctx.images[i];
        if (im->tile_size != c->image_size || im->tile_tokens != c->n_tokens)
            rc = zi_error_set(&err, ZI_EINVAL,
                              "images[%zu]: tiles of %d px / %d tokens, this worker's projector "
                              "takes %d / %d (tokenizers and workers given different --mmproj "
                              "files?)",
                              i, im->tile_size, im->tile_tokens, c->image_size, c->n_tokens);
    }
    if (!rc) rc = resolve_lora(w, &l->ctx, &err);
    if (!rc) rc = check_ctx_tokens(w, &l->ctx, &err);
    if (!rc && l->ctx.n_tts_words) rc = speech_setup(w, l, &err);
    if (!rc)
        rc = check_ids(w, "context.eos_token_ids", l->ctx.eos_token_ids.v, l->ctx.eos_token_ids.n,
                       &err);
    if (!rc)
        rc = check_ids(w, "sampling_params.stop_token_ids", l->ctx.sampling_params.stop_token_ids.v,
                       l->ctx.sampling_params.stop_token_ids.n, &err);
    for (size_t i = 0; !rc && i < l->ctx.sampling_params.logit_bias.n; i++)
        if (l->ctx.sampling_params.logit_bias.v[i].id >= w->vocab)
            rc = zi_error_set(&err, ZI_EINVAL,
                              "sampling_params.logit_bias: token id %d is outside this model's "
                              "vocabulary of %d",
                              l->ctx.sampling_params.logit_bias.v[i].id, w->vocab);
    for (size_t i = 0; !rc && i < l->ctx.n_eos_sequences; i++)
        rc = check_ids(w, "context.eos_sequences", l->ctx.eos_sequences[i].v,
                       l->ctx.eos_sequences[i].n, &err);
    /* Structured output: a worker that can constrain decoding, and a
     * schema or grammar it can hold to (refused here with its reason; the
     * compiled grammar stays cached for the slot). */
    if (!rc) rc = zi_generator_check_constraint(w->gen, &l->ctx, &err);
    if (!rc && (l->ctx.grammar.len || l->ctx.regex.len) && l->ctx.eos_token_ids.n == 0)
        rc = zi_error_set(&err, ZI_EUNSUPPORTED,
                          "%s: the model has no end-of-sequence token to end the completion with",
                          l->ctx.regex.len ? "regex" : "grammar");
    /* The object must be able to end (check_ids refused EOS ids outside
     * the vocabulary above). */
    if (!rc && l->ctx.has_json_schema && l->ctx.eos_token_ids.n == 0)
        rc = zi_error_set(&err, ZI_EUNSUPPORTED,
                          "response_format: the model has no end-of-sequence token to end "
                          "the JSON object with");
    if (!rc && l->ctx.end_idx >= w->ctx_size)
        rc = zi_error_set(&err, ZI_ERANGE,
                          "prompt: %lld tokens leave no room in this worker's context of %d",
                          (long long)l->ctx.end_idx, w->ctx_size);
    if (rc) {
        send_error(w, rid,
                   rc == ZI_EUNSUPPORTED ? "unsupported"
                   : rc == ZI_ENOMEM     ? "internal"
                                         : "invalid_request",
                   err.msg);
        zi_text_context_free(&l->ctx);
        zi_codec_plan_free(l->plan);
        zi_tts_stream_free(&l->ts);
        l->plan = NULL;
        return;
    }
    /* The total length may not exceed one cache slot. */
    if (l->ctx.max_length > w->ctx_size) l->ctx.max_length = w->ctx_size;
    /* Without the copy (out of memory) it runs on; only a router restart
     * cannot hand it back. */
    if ((l->start = malloc(msg_len ? msg_len : 1))) {
        memcpy(l->start, msg, msg_len);
        l->start_len = msg_len;
    }
    w->n_live++;
    zi_log(&w->log, ZI_LOG_DEBUG, "request %llu: %lld prompt tokens, max length %lld",
           (unsigned long long)rid, (long long)l->ctx.prompt_len, (long long)l->ctx.max_length);
}

/* lora_done for rid: the outcome (code NULL: done) and the adapters now. */
static void send_lora_done(worker *w, int64_t rid, const char *code, const char *msg, int id) {
    const char *names[ZI_LORA_MAX_ADAPTERS];
    lora_names(w, names);
    zi_im_lora_done d = {.rid = rid,
                         .ok = code == NULL,
                         .code = {code, code ? strlen(code) : 0},
                         .message = {msg, msg ? strlen(msg) : 0},
                         .id = id,
                         .names = names,
                         .n_names = (size_t)w->n_loras};
    zi_msg m;
    if (zi_im_lora_done_pack(&d, &m) == ZI_OK) zi_im_send(w->sock, &m);
}

/* A load: the name is new, a place is free, the file is an adapter of
 * this model that fits in memory (under --memory-budget what the budget
 * has left, else on the CPU what the host has); it takes the first free
 * place, with a key of its own (zi_lora_key). */
static void lora_load(worker *w, const zi_im_lora *lm) {
    zi_error err = {0};
    zi_lora_spec spec = {.scale = (float)lm->scale};
    const char *code = "invalid_request";
    int place = -1;
    if (lm->name.n >= sizeof spec.name || lm->path.n >= sizeof spec.path) {
        send_lora_done(w, lm->rid, code,
                       lm->name.n >= sizeof spec.name ? "lora_name: longer than 63 bytes"
                                                      : "lora_path: too long",
                       -1);
        return;
    }
    memcpy(spec.name, lm->name.p, lm->name.n);
    memcpy(spec.path, lm->path.p, lm->path.n);
    for (int i = 0; i < w->n_loras; i++)
        if (w->loras[i] && !strcmp(zi_lora_name(w->loras[i]), spec.name)) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "lora_name: an adapter '%s' is already loaded (unload it first)", spec.name);
            send_lora_done(w, lm->rid, code, msg, -1);
            return;
        }
    for (int i = 0; i < ZI_LORA_MAX_ADAPTERS && place < 0; i++)
        if (i >= w->n_loras || !w->loras[i]) place = i;
    if (place < 0) {
        send_lora_done(w, lm->rid, "unsupported",
                       "lora_name: this worker holds 64 adapters, the most it takes", -1);
        return;
    }
    zi_lora *l = NULL;
    int rc = zi_lora_load(w->model, &spec, &l, &err);
    if (rc) {
        send_lora_done(w, lm->rid,
                       rc == ZI_EUNSUPPORTED ? "unsupported"
                       : rc == ZI_ENOMEM     ? "insufficient_memory"
                                             : code,
                       err.msg, -1);
        return;
    }
    const uint64_t bytes = zi_lora_bytes(l);
    const uint64_t avail = w->lora_budgeted ? w->lora_room
                           : !strcmp(zi_model_backend(w->model)->ops->name, "cpu")
                               ? zi_mem_available()
                               : UINT64_MAX;
    if (bytes > avail) {
        char msg[ZI_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg,
                 "lora_path: adapter '%s' takes %.1f MiB, and %s has %.1f MiB left for it "
                 "(the weights, working buffers, KV cache and loaded adapters hold the rest)",
                 spec.name, (double)bytes / 1048576.0,
                 w->lora_budgeted ? "the worker's --memory-budget" : "the host",
                 (double)avail / 1048576.0);
        zi_lora_free(l);
        send_lora_done(w, lm->rid, "insufficient_memory", msg, -1);
        return;
    }
    if (w->lora_budgeted) w->lora_room -= bytes;
    zi_lora_set_key(l, ++w->lora_keys);
    w->loras[place] = l;
    if (place >= w->n_loras) w->n_loras = place + 1;
    zi_generator_set_loras(w->gen, (const zi_lora *const *)w->loras, w->n_loras);
    zi_log(&w->log, ZI_LOG_INFO,
           "adapter %d '%s' loaded: %s, rank %d, alpha %g, %d weights, %.1f MiB", place, spec.name,
           spec.path, zi_lora_rank(l), (double)zi_lora_alpha(l), zi_lora_n_weights(l),
           (double)bytes / (1 << 20));
    send_lora_done(w, lm->rid, NULL, NULL, place);
}

/* An unload: refused while a request on this worker runs the adapter (its
 * place would be gone from under it); else freed, its place free again. */
static void lora_unload(worker *w, const zi_im_lora *lm) {
    int place = -1;
    for (int i = 0; i < w->n_loras && place < 0; i++)
        if (w->loras[i] && strlen(zi_lora_name(w->loras[i])) == lm->name.n &&
            !memcmp(zi_lora_name(w->loras[i]), lm->name.p, lm->name.n))
            place = i;
    char msg[200];
    if (place < 0) {
        snprintf(msg, sizeof msg, "lora_name: this worker has no adapter '%.*s'",
                 (int)(lm->name.n > 64 ? 64 : lm->name.n), lm->name.p);
        send_lora_done(w, lm->rid, "not_found", msg, -1);
        return;
    }
    int users = 0;
    for (int i = 0; i < w->n_live; i++)
        for (size_t j = 0; j < w->live[i].ctx.n_lora; j++)
            if (w->live[i].ctx.lora[j].id == place) {
                users++;
                break;
            }
    if (users) {
        snprintf(msg, sizeof msg,
                 "lora_name: adapter '%s' is in use by %d running request(s); unload it once "
                 "they end",
                 zi_lora_name(w->loras[place]), users);
        send_lora_done(w, lm->rid, "in_use", msg, -1);
        return;
    }
    zi_log(&w->log, ZI_LOG_INFO, "adapter %d '%s' unloaded", place, zi_lora_name(w->loras[place]));
    if (w->lora_budgeted) w->lora_room += zi_lora_bytes(w->loras[place]);
    zi_lora_free(w->loras[place]);
    w->loras[place] = NULL;
    while (w->n_loras > 0 && !w->loras[w->n_loras - 1]) w->n_loras--;
    zi_generator_set_loras(w->gen, (const zi_lora *const *)w->loras, w->n_loras);
    send_lora_done(w, lm->rid, NULL, NULL, place);
}

static void on_lora(worker *w, const msgpack_object *o) {
    zi_error err = {0};
    zi_im_lora lm;
    if (zi_im_lora_unpack(o, &lm, &err)) {
        int64_t rid = 0;
        zi_im_rid(o, &rid, NULL);
        send_lora_done(w, rid, "invalid_request", err.msg, -1);
        return;
    }
    if (w->encoder) {
        send_lora_done(w, lm.rid, "unsupported", "this model is an encoder: no LoRA adapters", -1);
        return;
    }
    if (lm.load)
        lora_load(w, &lm);
    else
        lora_unload(w, &lm);
}

/* The vocabulary as byte strings for structured output, read from the
 * model's own (already mapped) file, or NULL (logged). */
static zi_grammar_vocab *load_grammar_vocab(worker *w, const zi_model *model) {
    zi_error err = {0};
    zi_tokenizer *tok = NULL;
    zi_grammar_vocab *v = NULL;
    double t0 = (double)zi_now_ms();
    if (zi_tokenizer_load_vocab(zi_model_gguf(model), &tok, &err) ||
        zi_grammar_vocab_create(zi_tokenizer_vocab_size(tok), zi_tokenizer_constraint_bytes, tok, &v,
                                &err))
        zi_log(&w->log, ZI_LOG_WARN, "structured output off: %s", err.msg);
    else
        zi_log(&w->log, ZI_LOG_INFO, "structured output: %d tokens read in %.0f ms",
               (int)zi_grammar_vocab_size(v), (double)zi_now_ms() - t0);
    zi_tokenizer_free(tok);
    return v;
}

static void on_message(worker *w, const void *buf, size_t len) {
    zi_error err = {0};
    msgpack_unpacked u;
    if (zi_msgpack_parse(buf, len, NULL, &u, &err)) {
        zi_log(&w->log, ZI_LOG_WARN, "bad message from the router: %s", err.msg);
        return;
    }
    const msgpack_object *o = &u.data;
    int64_t rid = 0;
    zi_im_type type = zi_im_type_of(o);
    if (type == ZI_IM_START) {
        zi_im_start sm;
        if (zi_im_start_unpack(o, &sm, &err) == ZI_OK) {
            pkey_note(w, sm.prefix_key);
            on_start(w, sm.context, (uint64_t)sm.rid, buf, len);
        }
    } else if (type == ZI_IM_EMBED) {
        if (zi_im_rid(o, &rid, &err) == ZI_OK) on_embed(w, o, (uint64_t)rid);
    } else if (type == ZI_IM_CANCEL) {
        if (zi_im_rid(o, &rid, &err) == ZI_OK) {
            for (int i = 0; i < w->n_live; i++)
                if (w->live[i].rid == (uint64_t)rid) {
                    drop_live(w, i);
                    zi_log(&w->log, ZI_LOG_DEBUG, "request %lld cancelled", (long long)rid);
                    break;
                }
            for (int i = 0; i < w->n_jobs; i++)
                if (w->jobs[i].rid == (uint64_t)rid) {
                    drop_job(w, i);
                    break;
                }
        }
    } else if (type == ZI_IM_LORA) {
        on_lora(w, o);
    } else if (type == ZI_IM_REREGISTER) {
        /* A restarted router knows none of our requests: it gets the
         * sequences back with the register and takes over those its
         * clients come back for (it cancels the rest); a router that had
         * declared this worker dead cancels them all (they ran on
         * elsewhere). Embed jobs are not handed back. */
        zi_log(&w->log, ZI_LOG_INFO,
               "router asks to register again; handing back %d sequences, dropping %d embed jobs",
               w->n_live + w->n_done, w->n_jobs);
        while (w->n_jobs > 0) drop_job(w, w->n_jobs - 1);
        send_register(w, true);
    } else {
        zi_log(&w->log, ZI_LOG_WARN, "unknown message type from the router");
    }
    msgpack_unpacked_destroy(&u);
}

/* Gathers the single-position log probabilities stored at [first,
 * first + count) of ctx into out; false when one is missing. */
static bool gather_logprobs(const zi_text_context *c, int64_t first, int64_t count,
                            zi_logprobs *out) {
    zi_logprobs_init(out);
    for (int64_t i = first; i < first + count; i++) {
        const zi_logprobs *lp = c->lp_data[i];
        if (!lp || lp->n != 1 ||
            zi_logprobs_push(out, lp->token_logprobs[0], lp->top[0].ids, lp->top[0].logprobs,
                             lp->top[0].n, NULL) != ZI_OK) {
            zi_logprobs_free(out);
            return false;
        }
    }
    return true;
}

/* Sends what the last steps produced for each live context; drops the
 * finished ones. The token that ended a sequence by EOS or a stop token id
 * is not part of the completion (as `zinfer generate` does), nor are its log
 * probabilities. The first message of an echo request also carries the
 * prompt's ids and, with logprobs, the prompt's log probabilities. */
static void send_outputs(worker *w) {
    for (int i = 0; i < w->n_live;) {
        live_ctx *l = &w->live[i];
        zi_text_context *c = &l->ctx;
        int64_t first, count;
        zi_text_context_take_outstanding(c, &first, &count);
        bool done = zi_text_context_is_done(c);
        if (done && count > 0 && (c->status == ZI_GEN_END_OF_SEQUENCE || c->status == ZI_GEN_STOP))
            count--;
        zi_im_audio audio = {0};
        int arc = ZI_OK;
        zi_error aerr = {0};
        if (l->plan && (count > 0 || done)) { /* the blocks these codes complete */
            const zi_codec_ids *ids = zi_codec_plan_ids(l->plan);
            size_t na = 0;
            int32_t *codes = count > 0 ? malloc((size_t)count * sizeof *codes) : NULL;
            if (count > 0 && !codes) arc = zi_error_set(&aerr, ZI_ENOMEM, "out of memory");
            size_t k = codes ? zi_codec_extract(ids, c->tokens + first, (size_t)count, codes) : 0;
            if (!arc) arc = zi_tts_stream_push(&l->ts, codes, k, &aerr);
            free(codes);
            if (!arc)
                arc = zi_tts_stream_take(&l->ts, w->tts, done, 1, &w->audio, &na, &w->audio_cap,
                                         &aerr);
            const zi_wavtok_config *tc = zi_wavtok_get_config(w->tts);
            audio = (zi_im_audio){.data = w->audio,
                                  .len = na * sizeof(float),
                                  .format = c->tts_format ? "s16" : "f32",
                                  .sample_rate = tc->sample_rate};
            if (c->tts_format) { /* 16-bit PCM in place (little-endian hosts) */
                int16_t *o16 = (int16_t *)w->audio;
                for (size_t j = 0; j < na; j++) o16[j] = zi_wav_s16(w->audio[j]);
                audio.len = na * sizeof(int16_t);
            }
            if (!na) audio.data = NULL;
        }
        if (arc) {
            send_error(w, l->rid, "internal", aerr.msg);
            drop_live(w, i);
            continue;
        }
        if (count > 0 || done) {
            zi_logprobs lp, plp;
            bool has_lp = c->log_probabilities > 0 && gather_logprobs(c, first, count, &lp);
            bool echo = c->log_probabilities_echo && !l->echo_sent;
            bool has_plp =
                echo && c->log_probabilities > 0 && gather_logprobs(c, 1, c->prompt_len - 1, &plp);
            const char *status = zi_gen_status_name(c->status);
            zi_im_tokens tm = {
                .rid = (int64_t)l->rid,
                .token_ids = {.set = true, .v = c->tokens + first, .n = (size_t)count},
                .status = {status, strlen(status)},
                .logprobs = {.lp = has_lp ? &lp : NULL},
                .prompt_token_ids = {.set = echo, .v = c->tokens, .n = (size_t)c->prompt_len},
                .prompt_logprobs = {.lp = has_plp ? &plp : NULL},
                .audio = audio};
            zi_msg m;
            zi_error err = {0};
            if (zi_im_tokens_pack(&tm, &m, &err) == ZI_OK) {
                zi_im_send(w->sock, &m);
            } else {
                /* Nothing to send (a log probability that is not finite,
                 * or out of memory): end the request with an error, which
                 * the router sends on as its one final reply. */
                zi_msg_free(&m);
                send_error(w, l->rid, "internal",
                           err.msg[0] ? err.msg : "out of memory for a tokens message");
                done = true;
            }
            if (has_lp) zi_logprobs_free(&lp);
            if (has_plp) zi_logprobs_free(&plp);
            if (echo) l->echo_sent = true;
        }
        if (done) {
            done_keep(w, l, first + count);
            drop_live(w, i);
        } else {
            i++;
        }
    }
}

typedef struct wopts {
    char model[4096];
    const char *model_name; /* --model-name, or NULL: the file's */
    const char *draft; /* --draft-model, or NULL */
    const char *mmproj; /* --mmproj, or NULL */
    const char *tts_dec; /* --tts-decoder, or NULL */
    zi_lora_spec *lora; /* --lora's values, in order ([ZI_LORA_MAX_ADAPTERS]) */
    int n_lora;
    const char *router, *device;
    const char *curve_secret, *router_key; /* key files, or NULL */
    long long threads, slots, ctx, batch, steps, chunk, kv_tokens, kv_bytes, budget, block;
    long long act_bits;
    long long orphan_ms; /* --orphan-timeout */
    const char *kv_disk; /* --kv-disk, or NULL */
    long long kv_disk_bytes;
    int kv_type; /* --kv-type: zi_kv_type */
    int no_prefix_cache;
    int spec_lookup;
    int log_level;
} wopts;

/* The command line, each value checked against options.h's table (as
 * `zinfer serve` checks what it passes on). 0 to go on, else the exit
 * status: 0 for --help and --check-args, 2 for a bad option. */
static int parse_args(int argc, char **argv, wopts *o) {
    zi_error err = {0};
    int check_only = 0;
    for (int i = 1; i < argc; i++) {
        zi_opt_id id;
        long long x;
        const char *v;
        int rc = zi_options_next(ZI_OWN_WORKER, argc, argv, &i, &id, &x, &v, &err);
        if (!rc && id == ZI_O_DEVICE) {
            zi_device_spec spec;
            rc = zi_device_parse(v, &spec, &err);
        }
        if (rc) {
            fprintf(stderr, "zinfer-worker: %s\n", err.msg);
            return 2;
        }
        switch (id) {
        case ZI_O_HELP:
            fputs(USAGE, stdout);
            zi_options_usage(stdout, ZI_OWN_WORKER, 21);
            exit(0);
        case ZI_O_CHECK_ARGS:
            check_only = 1;
            break;
        case ZI_O_KV_DISK:
            o->kv_disk = v;
            break;
        case ZI_O_KV_DISK_BYTES:
            o->kv_disk_bytes = x;
            break;
        case ZI_O_NO_PREFIX_CACHE:
            o->no_prefix_cache = 1;
            break;
        case ZI_O_SPEC_LOOKUP:
        case ZI_O_NO_SPEC_LOOKUP:
            o->spec_lookup = id == ZI_O_SPEC_LOOKUP;
            break;
        case ZI_O_ROUTER:
            o->router = v;
            break;
        case ZI_O_DRAFT_MODEL:
            o->draft = v;
            break;
        case ZI_O_LORA:
            if (o->n_lora == ZI_LORA_MAX_ADAPTERS) {
                fprintf(stderr, "zinfer-worker: more than %d --lora adapters\n",
                        ZI_LORA_MAX_ADAPTERS);
                return 2;
            }
            if (zi_lora_spec_parse(v, &o->lora[o->n_lora], &err)) {
                fprintf(stderr, "zinfer-worker: %s\n", err.msg);
                return 2;
            }
            o->n_lora++;
            break;
        case ZI_O_MMPROJ:
            o->mmproj = v;
            break;
        case ZI_O_TTS_DECODER:
            o->tts_dec = v;
            break;
        case ZI_O_CURVE_SECRET:
            o->curve_secret = v;
            break;
        case ZI_O_ROUTER_KEY:
            o->router_key = v;
            break;
        case ZI_O_DEVICE:
            o->device = v;
            break;
        case ZI_O_MODEL:
            snprintf(o->model, sizeof o->model, "%s", v);
            break;
        case ZI_O_MODEL_NAME:
            o->model_name = v;
            break;
        case ZI_O_THREADS:
            o->threads = x;
            break;
        case ZI_O_SLOTS:
            o->slots = x;
            break;
        case ZI_O_CTX_SIZE:
            o->ctx = x;
            break;
        case ZI_O_BATCH_SIZE:
            o->batch = x;
            break;
        case ZI_O_NUM_STEPS:
            o->steps = x;
            break;
        case ZI_O_PREFILL_CHUNK:
            o->chunk = x;
            break;
        case ZI_O_ORPHAN_TIMEOUT:
            o->orphan_ms = x;
            break;
        case ZI_O_KV_CACHE_TOKENS:
            o->kv_tokens = x;
            break;
        case ZI_O_KV_CACHE_BYTES:
            o->kv_bytes = x;
            break;
        case ZI_O_MEMORY_BUDGET:
            o->budget = x;
            break;
        case ZI_O_BLOCK_SIZE:
            o->block = x;
            break;
        case ZI_O_ACT_BITS:
            o->act_bits = x;
            break;
        case ZI_O_KV_TYPE:
            o->kv_type = (int)x;
            break;
        case ZI_O_LOG_LEVEL:
            o->log_level = (int)x;
            break;
        default: /* the table gives the worker no other option */
            break;
        }
    }
    if (o->kv_tokens > 0 && o->kv_bytes > 0) {
        fprintf(stderr, "zinfer-worker: give --kv-cache-tokens or --kv-cache-bytes, not both\n");
        return 2;
    }
    /* What the backend would refuse at start, refused as serve refuses it. */
    if (o->act_bits != 16 && strcmp(o->device, "cpu") != 0) {
        fprintf(stderr, "zinfer-worker: --act-bits %lld is a CPU option (--device %s)\n",
                o->act_bits, o->device);
        return 2;
    }
    if (o->kv_type != ZI_KV_DEFAULT && strcmp(o->device, "cpu") != 0) {
        fprintf(stderr,
                "zinfer-worker: --kv-type %s is a CPU option: the CUDA backend keeps float32 K "
                "and V (--device %s; use --kv-type default)\n",
                zi_kv_type_name(o->kv_type), o->device);
        return 2;
    }
    if (check_only) exit(0);
    return 0;
}

/* ---- the process's phases ------------------------------------------------------ */

/* What the phases share besides the worker: the device, the model, the
 * structured-output vocabulary, and the KV cache's sizing (for the log). */
typedef struct wres {
    zi_backend *be;
    zi_model *model;
    zi_model *draft; /* --draft-model (NULL: none), on the same backend */
    wvision vision;  /* --mmproj's image tower (v NULL: none), on the same backend */
    zi_grammar_vocab *jv;
    uint64_t per_tok, kv_blocks;
    char kv_why[128];
    /* MemAvailable before the weights were loaded (0: unknown): what the
     * default budget must fit in. */
    uint64_t mem_avail;
} wres;

/* Soft tokens a worker keeps of tiles it encoded: 128 MiB, some fifty
 * gemma3 tiles (256 x 2560 floats) or a thousand SmolVLM ones. */
#define ZI_TILE_CACHE_BYTES ((size_t)128 << 20)

/* The generator's image encoder (generator.h): tile `tile` of im from the
 * tile cache, else through the --mmproj tower (whose tiles the tokenizer
 * prepared for the same file: their shape checked here all the same). */
static int encode_tile(void *user, const zi_ctx_image *im, int tile, float *out, zi_error *err) {
    wvision *wv = user;
    zi_vision *v = wv->v;
    const zi_vision_config *c = zi_vision_get_config(v);
    if (im->tile_size != c->image_size || im->tile_tokens != c->n_tokens)
        return zi_error_set(err, ZI_EINVAL,
                            "images: tiles of %d px / %d tokens, this worker's projector takes "
                            "%d / %d (tokenizers and workers given different --mmproj files?)",
                            im->tile_size, im->tile_tokens, c->image_size, c->n_tokens);
    const size_t n = (size_t)c->n_tokens * (size_t)c->lm_dim;
    if (wv->cache && zi_tile_cache_get(wv->cache, im->hash, tile, out, n)) return ZI_OK;
    const size_t px = (size_t)tile * (size_t)c->image_size * (size_t)c->image_size * 3;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = zi_vision_encode(v, im->pixels + px, out, err);
    clock_gettime(CLOCK_MONOTONIC, &b);
    wv->runs++;
    wv->run_ms += (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) * 1e-6;
    if (!rc && wv->cache) zi_tile_cache_put(wv->cache, im->hash, tile, out, n);
    return rc;
}

static void free_loras(worker *w) {
    for (int i = 0; i < w->n_loras; i++) zi_lora_free(w->loras[i]);
    w->n_loras = 0;
}

/* Frees what load() and the speech decoder's set-up made (each may be
 * NULL): the failed start-up paths and the shutdown share it. */
static void free_loaded(worker *w, wres *r) {
    zi_vision_free(r->vision.v);
    zi_tile_cache_free(r->vision.cache);
    free_loras(w);
    zi_model_free(r->draft);
    zi_model_free(r->model);
    zi_backend_free(r->be);
    zi_wavtok_free(w->tts);
    zi_backend_free(w->tts_be);
    w->tts = NULL, w->tts_be = NULL;
}

/* Load: the device backend and the model; the worker's slots, context and
 * name follow from the options and the model. Reports and returns the
 * exit status on failure (nothing left to free). */
static int load(worker *w, const wopts *o, wres *r) {
    zi_error err = {0};
    int rc;
    /* Before the weights take their share of it. */
    r->mem_avail = zi_mem_available();
    if ((rc = zi_backend_create_for_device(o->device, (int)o->threads, (int)o->act_bits, &r->be,
                                           &err)) ||
        (rc = zi_backend_set_kv_type(r->be, o->kv_type, &err)) ||
        (rc = zi_model_load(o->model, r->be, &r->model, &err))) {
        zi_backend_free(r->be);
        return start_failed(w, err.msg);
    }
    if (o->draft &&
        ((rc = zi_model_load(o->draft, r->be, &r->draft, &err)) ||
         (rc = zi_spec_draft_check_vocab(r->model, o->model, r->draft, o->draft, &err)))) {
        zi_model_free(r->draft);
        zi_model_free(r->model);
        zi_backend_free(r->be);
        return start_failed(w, err.msg);
    }
    for (int i = 0; i < o->n_lora; i++) {
        if ((rc = zi_lora_load(r->model, &o->lora[i], &w->loras[i], &err))) {
            free_loras(w);
            zi_model_free(r->draft);
            zi_model_free(r->model);
            zi_backend_free(r->be);
            return start_failed(w, err.msg);
        }
        w->n_loras++;
        zi_log(&w->log, ZI_LOG_INFO, "adapter %d '%s': %s, rank %d, alpha %g, %d weights, %.1f MiB",
               i, o->lora[i].name, o->lora[i].path, zi_lora_rank(w->loras[i]),
               (double)zi_lora_alpha(w->loras[i]), zi_lora_n_weights(w->loras[i]),
               (double)zi_lora_bytes(w->loras[i]) / (1 << 20));
    }
    w->model = r->model;
    const zi_model_config *mc = zi_model_get_config(r->model);
    if (o->mmproj &&
        ((rc = zi_vision_load(o->mmproj, r->be, mc->dim, &r->vision.v, &err)) ||
         !(r->vision.cache = zi_tile_cache_create(ZI_TILE_CACHE_BYTES)))) {
        if (!rc) zi_error_set(&err, ZI_ENOMEM, "out of memory");
        zi_vision_free(r->vision.v);
        free_loras(w);
        zi_model_free(r->draft);
        zi_model_free(r->model);
        zi_backend_free(r->be);
        return start_failed(w, err.msg);
    }
    w->slots = (int)o->slots;
    w->ctx_size = (int)(o->ctx < mc->ctx_train ? o->ctx : mc->ctx_train);
    w->vocab = mc->n_vocab;
    w->encoder = mc->encoder != 0;
    /* An encoder runs each input whole in one pass: at most a batch long. */
    if (w->encoder && w->ctx_size > o->batch) w->ctx_size = (int)o->batch;
    if (o->model_name)
        snprintf(w->model_name, sizeof w->model_name, "%.200s", o->model_name);
    else
        zi_model_name_of_path(o->model, w->model_name, 201);
    return 0;
}

/* The KV cache's size in bytes: the size asked for, what an explicit
 * memory budget leaves (the seeds' estimate_memory_footprint), or by
 * default every slot's full context, which with the weights must fit in
 * memory (mem_plan.h). r->kv_why says which, for the log. */
static int size_kv_cache(worker *w, const wopts *o, wres *r, uint64_t *kv_bytes, zi_error *err) {
    uint64_t per_tok = zi_model_kv_bytes_per_token(r->model);
    zi_mem_model mm, dm;
    zi_mem_model_of(r->model, (int)o->batch, w->slots, &mm);
    if (r->draft) zi_mem_model_of(r->draft, (int)o->batch, w->slots, &dm);
    if (o->no_prefix_cache) mm.state_ckpts_per_slot = 0; /* no checkpoints kept */
    uint64_t adapters = 0; /* --lora's A and B count with the weights */
    for (int i = 0; i < w->n_loras; i++) adapters += zi_lora_bytes(w->loras[i]);
    mm.weight_bytes += adapters;
    zi_mem_plan plan;
    int rc = zi_mem_plan_make(&mm, r->draft ? &dm : NULL, w->slots, w->ctx_size, (int)o->block,
                              &plan, err);
    if (rc) return rc;
    if (o->kv_tokens > 0) {
        *kv_bytes = (uint64_t)o->kv_tokens * per_tok;
        snprintf(r->kv_why, sizeof r->kv_why, "--kv-cache-tokens");
        if ((uint64_t)o->kv_tokens < (uint64_t)o->block)
            return zi_error_set(err, ZI_EINVAL,
                                "--kv-cache-tokens %lld is less than one KV block of %lld tokens",
                                o->kv_tokens, o->block);
    } else if (o->kv_bytes > 0) {
        *kv_bytes = (uint64_t)o->kv_bytes;
        snprintf(r->kv_why, sizeof r->kv_why, "--kv-cache-bytes");
        if (*kv_bytes / per_tok < (uint64_t)o->block)
            return zi_error_set(err, ZI_EINVAL,
                                "--kv-cache-bytes %lld holds no KV block of %lld tokens (%llu "
                                "bytes per token)",
                                o->kv_bytes, o->block, (unsigned long long)per_tok);
    } else if (o->budget > 0) {
        /* An explicit budget wins: the cache is what it leaves (and the
         * context is cut to it below). */
        uint64_t budget = (uint64_t)o->budget;
        *kv_bytes = zi_model_memory_left_for_kv(r->model, budget, (int)o->batch, w->slots);
        *kv_bytes = *kv_bytes > adapters ? *kv_bytes - adapters : 0;
        /* a hybrid's state rows come out of it too: a slot's, and its
         * checkpoints' with the prefix cache (generator.c) */
        const uint64_t states = (uint64_t)w->slots *
                                (uint64_t)(o->no_prefix_cache ? 1 : 1 + ZI_STATE_CKPT_PER_SLOT) *
                                zi_model_state_bytes_per_slot(r->model);
        *kv_bytes = *kv_bytes > states ? *kv_bytes - states : 0;
        snprintf(r->kv_why, sizeof r->kv_why, "what a %.0f MiB --memory-budget leaves",
                 (double)budget / (1 << 20));
        if (*kv_bytes / per_tok < (uint64_t)o->block)
            return zi_error_set(
                err, ZI_ENOMEM,
                "a %.1f MiB --memory-budget leaves no room for a KV block of %lld tokens: the "
                "weights take %.1f MiB and the working buffers %.1f MiB, the KV cache %llu bytes "
                "per token; %d slots x %d positions need a budget of %.1f MiB. Give a larger "
                "--memory-budget (or none: the default fits the configuration), or "
                "--kv-cache-tokens N",
                (double)budget / 1048576.0, o->block, (double)mm.weight_bytes / 1048576.0,
                (double)mm.work_bytes / 1048576.0, (unsigned long long)per_tok, w->slots,
                w->ctx_size, (double)plan.total_bytes / 1048576.0);
    } else {
        /* The default: the configuration's own need, checked against the
         * host's memory where the weights and cache live in it (a GPU's
         * allocations report their own failure). */
        if (!strcmp(r->be->ops->name, "cpu") &&
            (rc = zi_mem_plan_check(&plan, 1, r->mem_avail, err)))
            return rc;
        *kv_bytes = plan.kv_tokens * per_tok;
        snprintf(r->kv_why, sizeof r->kv_why,
                 "%d slots x %d positions: the default budget, %.0f MiB with the weights", w->slots,
                 w->ctx_size, (double)plan.total_bytes / (1 << 20));
    }
    return ZI_OK;
}

/* --kv-disk: the prefix cache's disk tier. Its files are keyed by the
 * backend's KV layout (its --kv-type) and what computed it (on the CPU
 * its kernels' ISA and the activation bits), so a worker never reads K/V
 * that it would not have computed itself, bit for bit. A tier that cannot be had is logged
 * and the worker serves without it. */
static void open_kv_disk(worker *w, const wopts *o, const wres *r) {
    zi_error err = {0};
    char tag[48], cpu[40] = "";
    const zi_backend *be = r->be;
    if (!strcmp(be->ops->name, "cpu"))
        snprintf(cpu, sizeof cpu, " %s a%d", zi_cpu_backend_isa(r->be),
                 zi_cpu_backend_act_bits(r->be));
    /* the default layout's tag as it always was; another --kv-type its name */
    if (be->kv_type == ZI_KV_DEFAULT)
        snprintf(tag, sizeof tag, "%s k%d+%d v%d%s", be->ops->name, be->kv_k_bytes,
                 be->kv_k_row_extra, be->kv_v_bytes, cpu);
    else
        snprintf(tag, sizeof tag, "%s %s%s", be->ops->name, zi_kv_type_name(be->kv_type), cpu);
    if (zi_generator_open_kv_disk(w->gen, o->kv_disk, (uint64_t)o->kv_disk_bytes, tag, &w->log,
                                  &err))
        zi_log(&w->log, ZI_LOG_WARN, "disk tier off: %s", err.msg);
    else {
        w->kv_disk_dir = o->kv_disk;
        w->kv_disk_id = zi_generator_kv_disk_id(w->gen);
        zi_log(&w->log, ZI_LOG_INFO, "KV disk tier: %s, up to %.1f MiB (%s), sharing id %016llx",
               o->kv_disk, (double)o->kv_disk_bytes / (1 << 20), tag,
               (unsigned long long)w->kv_disk_id);
    }
}

/* Sizes the KV cache (size_kv_cache), then creates the generator and reads
 * the vocabulary for structured output. Reports and returns the exit
 * status on failure (the model and backend are left to the caller). */
static int create_generator(worker *w, const wopts *o, wres *r) {
    zi_error err = {0};
    uint64_t per_tok = zi_model_kv_bytes_per_token(r->model), kv_bytes = 0;
    if (size_kv_cache(w, o, r, &kv_bytes, &err)) return start_failed(w, err.msg);
    kv_bytes = zi_model_estimate_kv_cache_size(r->model, kv_bytes, (int)o->block);
    uint64_t kv_blocks = kv_bytes / (per_tok * (uint64_t)o->block);
    if (kv_blocks > ZI_KV_BLOCKS_MAX) kv_blocks = ZI_KV_BLOCKS_MAX;
    if (kv_blocks < 1) /* size_kv_cache refuses each way of getting here */
        return start_failed(w, "the KV cache would hold no block");
    if ((int64_t)kv_blocks * o->block < w->ctx_size) {
        zi_log(&w->log, ZI_LOG_WARN, "--ctx-size %d reduced to %lld: the KV cache holds no more",
               w->ctx_size, (long long)kv_blocks * o->block);
        w->ctx_size = (int)(kv_blocks * (uint64_t)o->block);
    }
    r->per_tok = per_tok;
    r->kv_blocks = kv_blocks;
    if (o->budget > 0) { /* what adapters loaded while serving must fit in */
        uint64_t used = kv_blocks * (uint64_t)o->block * per_tok +
                        (uint64_t)w->slots *
                            (uint64_t)(o->no_prefix_cache ? 1 : 1 + ZI_STATE_CKPT_PER_SLOT) *
                            zi_model_state_bytes_per_slot(r->model);
        for (int i = 0; i < w->n_loras; i++) used += zi_lora_bytes(w->loras[i]);
        uint64_t left =
            zi_model_memory_left_for_kv(r->model, (uint64_t)o->budget, (int)o->batch, w->slots);
        w->lora_budgeted = true;
        w->lora_room = left > used ? left - used : 0;
    }
    zi_generator_config gc = {.n_slots = w->slots,
                              .ctx = w->ctx_size,
                              .max_batch_tokens = (int)o->batch,
                              .kv_blocks = (int)kv_blocks,
                              .block_size = (int)o->block,
                              .prefill_chunk = (int)o->chunk,
                              .prefix_cache = !o->no_prefix_cache,
                              .spec_lookup = o->spec_lookup,
                              .draft_model = r->draft,
                              .encode_tile = r->vision.v ? encode_tile : NULL,
                              .encode_user = &r->vision,
                              .loras = (const zi_lora *const *)w->loras,
                              .n_loras = w->n_loras};
    w->live = calloc((size_t)w->slots, sizeof *w->live);
    w->jobs = calloc((size_t)w->slots, sizeof *w->jobs);
    if (!w->live || !w->jobs || zi_generator_create(r->model, &gc, &w->gen, &err)) {
        if (!w->live || !w->jobs) zi_error_set(&err, ZI_ENOMEM, "out of memory");
        free(w->live);
        free(w->jobs);
        w->live = NULL, w->jobs = NULL;
        return start_failed(w, err.msg);
    }
    /* Embeddings: the file's pooling (llama.cpp's {arch}.pooling_type),
     * else mean; rank (a classifier head) is not run. */
    const zi_model_config *mc = zi_model_get_config(r->model);
    char pkey[64];
    uint32_t pt = ZI_POOLING_MEAN;
    snprintf(pkey, sizeof pkey, "%s.pooling_type", mc->arch);
    if (zi_gguf_get_u32_or(zi_model_gguf(r->model), pkey, ZI_POOLING_MEAN, &pt, NULL) != ZI_OK)
        pt = ZI_POOLING_MEAN;
    if (mc->n_recurrent > 0) snprintf(w->hybrid, sizeof w->hybrid, "%s", mc->arch);
    w->emodel = (zi_embed_model){.dim = mc->dim,
                                 .ctx = w->ctx_size,
                                 .vocab = w->vocab,
                                 .block_size = zi_generator_get_config(w->gen)->block_size,
                                 .whole = mc->encoder != 0,
                                 .max_batch = zi_generator_get_config(w->gen)->max_batch_tokens,
                                 .pooling = pt <= ZI_POOLING_RANK ? (int)pt : -2};
    /* A reranker (llama.cpp's rank pooling): its head, read once. A file
     * that says rank but has no head serves everything else. */
    if (pt == ZI_POOLING_RANK) {
        int hrc = zi_rank_head_load(&w->rank, zi_model_gguf(r->model), mc->arch, mc->dim,
                                    !strcmp(mc->arch, "qwen3"), &err);
        if (hrc == ZI_EUNSUPPORTED) {
            zi_log(&w->log, ZI_LOG_WARN, "%s", err.msg);
            w->emodel.pooling = -2;
        } else if (hrc) {
            zi_generator_free(w->gen);
            free(w->live);
            free(w->jobs);
            w->gen = NULL, w->live = NULL, w->jobs = NULL;
            return start_failed(w, err.msg);
        } else {
            w->emodel.rank = &w->rank;
            zi_log(&w->log, ZI_LOG_INFO, "reranker: %d output(s)%s%s",
                   zi_rank_head_outputs(&w->rank), w->rank.cls_w ? ", dense layer" : "",
                   w->rank.softmax ? ", softmax" : "");
        }
    }
    if (o->kv_disk) open_kv_disk(w, o, r);
    /* Structured output needs the tokens' bytes: the model file's
     * tokenizer, read once into a trie. Without one, such requests are
     * refused and everything else is served. */
    r->jv = load_grammar_vocab(w, r->model);
    if (r->jv && zi_generator_set_grammar_vocab(w->gen, r->jv, &err)) {
        zi_log(&w->log, ZI_LOG_WARN, "structured output off: %s", err.msg);
        zi_grammar_vocab_free(r->jv);
        r->jv = NULL;
    }
    return 0;
}

/* Connect and register: the socket to the router, the startup log lines,
 * the register message; heartbeats start from here (also from inside
 * forward passes). Reports and returns the exit status when the router
 * address is bad. */
static int connect_router(worker *w, const wopts *o, wres *r, void *zctx) {
    zi_error err = {0};
    w->sock = zi_backend_socket(zctx, o->router, &w->curve, &err);
    if (w->sock && zi_curve_watch_start(&w->watch, zctx, w->sock, "the router", &w->curve, &w->log,
                                        &err) != ZI_OK) {
        zmq_close(w->sock);
        w->sock = NULL;
    }
    if (!w->sock) return start_failed(w, err.msg);
    char dev[96];
    if (!strcmp(r->be->ops->name, "cpu"))
        snprintf(dev, sizeof dev, "cpu, %s x %d threads, %d-bit activations",
                 zi_cpu_backend_isa(r->be), zi_cpu_backend_threads(r->be),
                 zi_cpu_backend_act_bits(r->be));
    else
        snprintf(dev, sizeof dev, "%s", o->device);
    zi_log(&w->log, ZI_LOG_INFO, "model %s (%s), %d slots x up to %d positions; router %s",
           w->model_name, dev, w->slots, w->ctx_size, o->router);
    zi_log(&w->log, ZI_LOG_INFO,
           "KV cache: %llu blocks x %lld tokens = %llu tokens, %.1f MiB (%s; --kv-type %s, %llu "
           "bytes per token); prefix cache %s; prompt-lookup speculation %s; draft model %s",
           (unsigned long long)r->kv_blocks, o->block, (unsigned long long)r->kv_blocks * o->block,
           (double)(r->kv_blocks * o->block * r->per_tok) / (1 << 20), r->kv_why,
           zi_kv_type_name(r->be->kv_type), (unsigned long long)r->per_tok,
           zi_generator_get_config(w->gen)->prefix_cache ? "on" : "off",
           zi_generator_get_config(w->gen)->spec_lookup ? "on" : "off",
           o->draft ? o->draft : "none");
    const zi_model_config *mc = zi_model_get_config(r->model);
    if (mc->n_recurrent > 0)
        zi_log(&w->log, ZI_LOG_INFO,
               "'%s' is a hybrid: %d of %d layers keep recurrent states (%.1f KiB a slot, "
               "with checkpoints for prefix reuse); speculation is off for it (docs/hybrids.md)",
               mc->arch, mc->n_recurrent, mc->n_layers,
               (double)zi_model_state_bytes_per_slot(r->model) / 1024.0);
    if (mc->n_recurrent > 0 && !r->be->host_memory)
        zi_log(&w->log, ZI_LOG_WARN,
               "'%s' on the %s backend: its recurrent kernels have not yet been run on a device "
               "by the project's GPU check, and state checkpoints (prefix reuse) are off there "
               "(docs/cuda.md)",
               mc->arch, r->be->ops->name);
    send_register(w, false);
    w->last_hb = zi_now_ms();
    zi_model_set_progress(r->model, on_progress, w);
    if (r->draft) zi_model_set_progress(r->draft, on_progress, w);
    return 0;
}

/* One generator step over every live context; a failed step ends each of
 * its requests with an error. Nonzero when the device is in error for
 * good (the worker exits and zinfer serve starts a fresh one). */
static int step(worker *w, const wopts *o, zi_backend *be, zi_text_context **batch,
                uint64_t *last_preempt) {
    zi_error err = {0};
    for (int i = 0; i < w->n_live; i++) batch[i] = &w->live[i].ctx;
    size_t n_emb = 0;
    if (gather_inputs(w, &n_emb, &err) ||
        zi_generator_next_token_embed(w->gen, batch, (size_t)w->n_live, w->emb, n_emb,
                                      (int)o->steps, &err)) {
        /* A failure of the step itself (not of one request): every
         * request in it ends with an error, the worker keeps serving. */
        zi_log(&w->log, ZI_LOG_ERROR, "step failed: %s", err.msg);
        for (int i = 0; i < w->n_live; i++) send_error(w, w->live[i].rid, "internal", err.msg);
        for (int i = 0; i < w->n_jobs; i++) send_error(w, w->jobs[i].rid, "internal", err.msg);
        drop_all(w);
        /* A device error stays (sync reports the first one for good):
         * every later step would fail too. */
        zi_error dev = {0};
        if (be->ops->sync(be, &dev) != ZI_OK) {
            zi_log(&w->log, ZI_LOG_ERROR, "the device is in error (%s): exiting", dev.msg);
            return 1;
        }
        return 0;
    }
    zi_generator_stats st;
    zi_generator_get_stats(w->gen, &st);
    if (st.preemptions > *last_preempt) {
        zi_log(&w->log, ZI_LOG_INFO,
               "preempted %llu sequence(s): the KV cache is full (%d of %d blocks in use); "
               "%llu so far",
               (unsigned long long)(st.preemptions - *last_preempt), st.kv_used, st.kv_blocks,
               (unsigned long long)st.preemptions);
        *last_preempt = st.preemptions;
    }
    send_outputs(w);
    send_embeddings(w);
    return 0;
}

/* The loop: drain the router's messages (waiting up to 100 ms when idle),
 * heartbeat once a second, step the live contexts, until a stop signal.
 * Returns the process's exit status. */
static int serve(worker *w, const wopts *o, zi_backend *be) {
    uint64_t last_preempt = 0;
    zi_text_context **batch = calloc((size_t)w->slots, sizeof *batch);
    if (!batch) return 1;
    int rc = 0;
    while (!zi_stop_requested()) {
        zmq_pollitem_t it = {w->sock, 0, ZMQ_POLLIN, 0};
        int pr = zmq_poll(&it, 1, w->n_live + w->n_jobs ? 0 : 100);
        if (pr < 0 && errno != EINTR) {
            zi_log(&w->log, ZI_LOG_ERROR, "poll: %s", zmq_strerror(errno));
            break;
        }
        /* Drain everything waiting before the next step. */
        for (;;) {
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, w->sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&msg);
                break;
            }
            on_message(w, zmq_msg_data(&msg), zmq_msg_size(&msg));
            zmq_msg_close(&msg);
        }
        zi_curve_watch_poll(&w->watch);
        int64_t now = zi_now_ms();
        check_orphans(w, now);
        if (now - w->last_hb >= 1000) {
            send_heartbeat(w);
            w->last_hb = now;
        }
        if (w->n_live + w->n_jobs == 0) continue;
        if (step(w, o, be, batch, &last_preempt)) {
            rc = 1;
            break;
        }
        /* Going idle: the counters of the work just finished go out now,
         * not up to a second later (health then shows them at once). */
        if (w->n_live + w->n_jobs == 0) {
            send_heartbeat(w);
            w->last_hb = zi_now_ms();
        }
    }
    free(batch);
    zi_log(&w->log, ZI_LOG_INFO, "shutting down");
    return rc;
}

int main(int argc, char **argv) {
    /* The defaults, from the table (options.h). */
    wopts o = {.router = zi_option_get(ZI_O_ROUTER)->def_text,
               .device = zi_option_get(ZI_O_DEVICE)->def_text,
               .threads = zi_option_def(ZI_O_THREADS),
               .act_bits = zi_option_def(ZI_O_ACT_BITS),
               .kv_disk_bytes = zi_option_def(ZI_O_KV_DISK_BYTES),
               .slots = zi_option_def(ZI_O_SLOTS),
               .ctx = zi_option_def(ZI_O_CTX_SIZE),
               .batch = zi_option_def(ZI_O_BATCH_SIZE),
               .steps = zi_option_def(ZI_O_NUM_STEPS),
               .chunk = zi_option_def(ZI_O_PREFILL_CHUNK),
               .orphan_ms = zi_option_def(ZI_O_ORPHAN_TIMEOUT),
               .block = zi_option_def(ZI_O_BLOCK_SIZE),
               .log_level = (int)zi_option_def(ZI_O_LOG_LEVEL)};
    static zi_lora_spec lora_specs[ZI_LORA_MAX_ADAPTERS]; /* 260 KiB: off the stack */
    o.lora = lora_specs;
    zi_default_model_path(o.model, sizeof o.model);
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    worker w;
    memset(&w, 0, sizeof w);
    w.log = (zi_logger){.out = stderr, .level = o.log_level, .tag = "zinfer-worker"};
    w.orphan_ms = o.orphan_ms;
    zi_stop_signals_install();
    /* Keys before the model: a bad key file fails in a moment. */
    zi_error kerr = {0};
    if (zi_curve_client_load(o.curve_secret, o.router_key, &w.curve, &kerr) != ZI_OK)
        return start_failed(&w, kerr.msg);

    wres r = {0};
    if ((rc = load(&w, &o, &r))) return rc;
    if (o.tts_dec) { /* the CPU: the decoder's ops have no CUDA kernels */
        zi_error terr = {0};
        if (zi_backend_create_for_device("cpu", (int)o.threads, 0, &w.tts_be, &terr) ||
            zi_wavtok_load(o.tts_dec, w.tts_be, &w.tts, &terr)) {
            free_loaded(&w, &r);
            char msg[1024];
            snprintf(msg, sizeof msg, "--tts-decoder %.200s: %.700s", o.tts_dec, terr.msg);
            return start_failed(&w, msg);
        }
        zi_log(&w.log, ZI_LOG_INFO, "speech decoder: %s, %d codes, %d Hz", o.tts_dec,
               zi_wavtok_get_config(w.tts)->n_vocab, zi_wavtok_get_config(w.tts)->sample_rate);
    }
    w.vision = &r.vision;
    if ((rc = create_generator(&w, &o, &r))) {
        free_loaded(&w, &r); /* the speech decoder too, which this path leaked */
        return rc;
    }
    void *zctx = zmq_ctx_new();
    rc = connect_router(&w, &o, &r, zctx);
    if (!rc) rc = serve(&w, &o, r.be);

    /* Shutdown: every context released, then the socket, the generator,
     * the model and the device. */
    drop_all(&w);
    zi_curve_watch_stop(&w.watch);
    zmq_close(w.sock);
    zmq_ctx_term(zctx);
    zi_generator_free(w.gen);
    zi_grammar_vocab_free(r.jv);
    free(w.live);
    free(w.jobs);
    free(w.emb);
    zi_rank_head_free(&w.rank);
    free_loaded(&w, &r);
    free(w.audio);
    return rc;
}
