/*
 * generator.c - see generator.h.
 *
 * One step: schedule (give sequences their slot, look up cached prefixes,
 * share the step's token budget out oldest first, allocate KV blocks and
 * preempt the newest sequence when they run out), gather every scheduled
 * context's window into one zi_batch with its block table (logits wanted at
 * each window's last token, and at every token of a prompt window whose log
 * probabilities are echoed), run the model once, sample every context whose
 * window reached its last token with the fused sampling processor
 * (sampler.h), record each token with its log probabilities when asked, and
 * register the blocks that became full for prefix sharing.
 *
 * On the CUDA backend (device_sampler.h) a step whose contexts want no log
 * probabilities runs the pass and the sampling on the device: the logits
 * stay there and only the token ids come back. Every other step, and every
 * step on the CPU backend, takes the host path: the pass's logits are
 * downloaded and sampled by sampler.h.
 *
 * The structures are in generator_impl.h; structured output's masks are in
 * generator_constraint.c.
 */
#include "generator.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec_mask.h"
#include "generator_impl.h"
#include "grow.h"
#include "lora.h"

int zi_generator_create(zi_model *m, const zi_generator_config *cfg_in, zi_generator **out,
                        zi_error *err) {
    zi_generator_config cfg = *cfg_in;
    if (cfg.block_size == 0) cfg.block_size = 16;
    if (cfg.n_slots < 1 || cfg.n_slots > 65536 || cfg.ctx < 2 || cfg.max_batch_tokens < 1 ||
        cfg.max_batch_tokens > (1 << 20) || cfg.block_size < 1 || cfg.block_size > 4096 ||
        cfg.kv_blocks < 0 || cfg.prefill_chunk < 0 || cfg.sample_vocab < 0 ||
        cfg.sample_vocab > zi_model_get_config(m)->n_vocab)
        return zi_error_set(err, ZI_EINVAL,
                            "generator: n_slots %d (1..65536), ctx %d (>= 2), max_batch_tokens %d "
                            "(1..1048576), block_size %d (1..4096), kv_blocks %d, prefill_chunk "
                            "%d, sample_vocab %d out of range",
                            cfg.n_slots, cfg.ctx, cfg.max_batch_tokens, cfg.block_size,
                            cfg.kv_blocks, cfg.prefill_chunk, cfg.sample_vocab);
    int64_t max_blocks = (cfg.ctx + cfg.block_size - 1) / cfg.block_size;
    if (cfg.kv_blocks == 0) {
        int64_t all = max_blocks * cfg.n_slots;
        cfg.kv_blocks = all > ZI_KV_BLOCKS_MAX ? ZI_KV_BLOCKS_MAX : (int)all;
    }
    if (cfg.kv_blocks < max_blocks)
        return zi_error_set(err, ZI_EINVAL,
                            "kv cache: %d blocks of %d tokens cannot hold one sequence of %d "
                            "positions (--ctx-size); give it at least %lld tokens",
                            cfg.kv_blocks, cfg.block_size, cfg.ctx,
                            (long long)(max_blocks * cfg.block_size));
    if (cfg.prefill_chunk > cfg.max_batch_tokens) cfg.prefill_chunk = cfg.max_batch_tokens;
    /* A hybrid's recurrent state covers its sequence from the start
     * (model.h): it cannot be rolled back past rejected drafts, so no
     * speculation; a prefix is resumed from a state checkpoint
     * (state_ckpt.h, docs/hybrids.md). */
    const int hybrid = zi_model_get_config(m)->n_recurrent > 0;
    if (hybrid) {
        if (cfg.draft_model)
            return zi_error_set(err, ZI_EUNSUPPORTED,
                                "draft-model speculation is not supported for '%s' (a hybrid: "
                                "its recurrent state cannot be rolled back)",
                                zi_model_get_config(m)->arch);
        cfg.spec_lookup = 0;
    }
    if (cfg.draft_model && zi_model_get_config(cfg.draft_model)->n_recurrent > 0)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "a hybrid ('%s') cannot be the draft model: its recurrent state "
                            "cannot be rolled back",
                            zi_model_get_config(cfg.draft_model)->arch);
    const int dim = zi_model_get_config(m)->dim;
    if (cfg.image_dim == 0) cfg.image_dim = dim;
    if (cfg.image_dim != dim)
        return zi_error_set(err, ZI_EINVAL,
                            "generator: image_dim %d is not the model's embedding length %d (the "
                            "projector must match the text model)",
                            cfg.image_dim, dim);
    zi_generator *g = calloc(1, sizeof *g);
    if (!g) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    g->model = m;
    g->cfg = cfg;
    g->max_blocks = (int32_t)max_blocks;
    g->n_vocab = zi_model_get_config(m)->n_vocab;
    g->n_sample_vocab = cfg.sample_vocab ? cfg.sample_vocab : g->n_vocab;
    g->dim = dim;
    int rc = zi_kv_cache_create_paged(m, cfg.kv_blocks, cfg.block_size, cfg.ctx, &g->kv, err);
    /* a hybrid's states: one per slot, then the checkpoints */
    const int n_ckpt = hybrid && cfg.prefix_cache ? ZI_STATE_CKPT_PER_SLOT * cfg.n_slots : 0;
    if (!rc) rc = zi_kv_cache_add_states(g->kv, cfg.n_slots + n_ckpt, err);
    if (!rc && n_ckpt) rc = zi_state_ckpts_create(n_ckpt, &g->ckpts, err);
    if (!rc && n_ckpt && !(g->hashes = malloc((size_t)max_blocks * sizeof *g->hashes)))
        rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    if (!rc) rc = zi_kv_blocks_create(cfg.kv_blocks, cfg.block_size, &g->kb, err);
    if (rc) {
        zi_generator_free(g);
        return rc;
    }
    size_t B = (size_t)cfg.max_batch_tokens, S = (size_t)cfg.n_slots, R = S * ZI_SPEC_ROWS;
    g->slot_used = calloc(S, 1);
    g->seqs = calloc(S, sizeof *g->seqs);
    g->tokens = malloc(B * sizeof *g->tokens);
    g->pos = malloc(B * sizeof *g->pos);
    g->seq = malloc(B * sizeof *g->seq);
    g->lora_ptr = malloc(B * ZI_MAX_LORA * sizeof *g->lora_ptr);
    g->lora_sc = malloc(B * ZI_MAX_LORA * sizeof *g->lora_sc);
    g->want = malloc(B);
    g->tables = malloc(S * (size_t)max_blocks * sizeof *g->tables);
    g->order = malloc(S * sizeof *g->order);
    g->stepped = malloc(S * sizeof *g->stepped);
    g->logits = malloc(S * (size_t)g->n_vocab * sizeof *g->logits);
    g->logit_rows = S;
    g->table_rows_cap = S;
    g->first_row = malloc(S * sizeof *g->first_row);
    g->rows = malloc(R * sizeof *g->rows);
    g->row_ctx = malloc(R * sizeof *g->row_ctx);
    g->out_tok = malloc(R * sizeof *g->out_tok);
    g->sample_tok = malloc(S * sizeof *g->sample_tok);
    g->spec_tok = malloc(S * ZI_SPEC_MAX_DRAFT * sizeof *g->spec_tok);
    g->src_row = malloc(R * sizeof *g->src_row);
    g->embd_rows = malloc(B * sizeof *g->embd_rows);
    g->attn_pos = malloc(B * sizeof *g->attn_pos);
    g->state_slots = malloc(S * sizeof *g->state_slots);
    int ok = g->embd_rows && g->attn_pos && g->state_slots && g->slot_used && g->seqs &&
             g->tokens && g->pos && g->seq && g->want && g->tables && g->order && g->stepped &&
             g->logits && g->first_row && g->rows && g->row_ctx && g->out_tok && g->sample_tok &&
             g->spec_tok && g->src_row && g->lora_ptr && g->lora_sc;
    for (size_t i = 0; ok && i < S; i++)
        ok = (g->seqs[i].blocks = malloc((size_t)max_blocks * sizeof(int32_t))) != NULL;
    if (!ok) {
        zi_generator_free(g);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for a generator of %d slots",
                            cfg.n_slots);
    }
    if ((rc = zi_sampler_create(&g->sampler, g->n_sample_vocab, err)) ||
        (cfg.n_slots <= 65535 &&
         (rc = zi_device_sampler_create(m, g->n_sample_vocab, cfg.n_slots, &g->dev, err)))) {
        zi_generator_free(g);
        return rc;
    }
    if (cfg.draft_model) {
        if (zi_model_get_config(cfg.draft_model)->n_vocab != g->n_vocab) {
            zi_generator_free(g);
            return zi_error_set(err, ZI_EINVAL, "draft model: %d vocabulary rows, the model %d",
                                zi_model_get_config(cfg.draft_model)->n_vocab, g->n_vocab);
        }
        /* as many positions as the target's pool, and room for drafts */
        rc = zi_spec_draft_create(cfg.draft_model, cfg.n_slots, cfg.ctx,
                                  cfg.kv_blocks + cfg.n_slots, cfg.block_size, cfg.max_batch_tokens,
                                  g->n_sample_vocab, &g->drafter, err);
        if (!rc && !(g->dreqs = malloc(S * sizeof *g->dreqs)))
            rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
        if (rc) {
            zi_generator_free(g);
            return rc;
        }
    }
    g->stats.kv_blocks = cfg.kv_blocks;
    g->stats.block_size = cfg.block_size;
    g->stats.kv_bytes = zi_kv_cache_bytes(g->kv);
    *out = g;
    return ZI_OK;
}

void zi_generator_free(zi_generator *g) {
    if (!g) return;
    zi_kv_disk_close(g->disk); /* writes what is queued (it holds copies, not the cache) */
    free(g->on_disk);
    free(g->disk_buf);
    zi_kv_cache_free(g->kv);
    zi_kv_blocks_free(g->kb);
    free(g->state_slots);
    zi_state_ckpts_free(g->ckpts);
    free(g->hashes);
    if (g->seqs)
        for (int i = 0; i < g->cfg.n_slots; i++) {
            free(g->seqs[i].blocks);
            free(g->seqs[i].masks);
            free(g->seqs[i].pids);
            zi_grammar_state_free(g->seqs[i].gs);
            zi_grammar_cache_put(g->grammars, g->seqs[i].gram);
        }
    zi_grammar_cache_free(g->grammars);
    free(g->seqs);
    free(g->slot_used);
    free(g->tokens);
    free(g->pos);
    free(g->seq);
    free(g->lora_ptr);
    free(g->lora_sc);
    free(g->want);
    free(g->tables);
    free(g->order);
    free(g->stepped);
    free(g->logits);
    free(g->first_row);
    free(g->rows);
    free(g->row_ctx);
    free(g->out_tok);
    free(g->sample_tok);
    free(g->spec_tok);
    free(g->src_row);
    free(g->emb_stepped);
    free(g->want_hidden);
    free(g->f32_attn);
    free(g->hidden);
    free(g->embd);
    free(g->embd_rows);
    free(g->attn_pos);
    zi_device_sampler_free(g->dev);
    zi_spec_draft_free(g->drafter);
    free(g->dreqs);
    free(g->forbid);
    free(g->top_ids);
    free(g->top_lps);
    zi_sampler_free(g->sampler);
    free(g);
}

/* The disk tier's eviction hook (zi_kv_blocks_set_evict_hook): a cached
 * block leaving memory whose write was dropped is queued now. */
static void evicted(void *ctx, int32_t id, uint64_t hash, uint64_t parent, const int32_t *tokens) {
    zi_generator *g = ctx;
    if (!g->on_disk[id]) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        void *buf = zi_kv_disk_write_begin(g->disk, hash, parent, tokens);
        if (buf && zi_kv_cache_read_block(g->kv, id, buf) == ZI_OK)
            zi_kv_disk_write_commit(g->disk);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        g->stats.disk_queue_us +=
            (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000);
    }
    g->on_disk[id] = 0; /* the block starts over */
}

int zi_generator_open_kv_disk(zi_generator *g, const char *dir, uint64_t max_bytes,
                              const char *kv_tag, const zi_logger *log, zi_error *err) {
    if (g->disk) return zi_error_set(err, ZI_EINVAL, "--kv-disk: the disk tier is open already");
    if (!g->cfg.prefix_cache)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "--kv-disk needs the prefix cache (not with --no-prefix-cache)");
    const zi_model_config *mc = zi_model_get_config(g->model);
    if (mc->n_recurrent > 0)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "--kv-disk: '%s' is a hybrid, whose prefixes also need a recurrent "
                            "state; the disk tier is not supported for it",
                            mc->arch);
    zi_kv_disk_identity id = {.model = zi_kv_disk_model_id(zi_model_gguf(g->model)),
                              .block_size = (uint32_t)g->cfg.block_size,
                              .n_kv_heads = (uint32_t)mc->n_kv_heads,
                              .head_dim = (uint32_t)mc->head_dim};
    snprintf(id.kv_tag, sizeof id.kv_tag, "%s", kv_tag ? kv_tag : "");
    int n_layers;
    zi_kv_cache_block_layout(g->kv, &n_layers, &id.k_bytes, &id.v_bytes);
    id.n_layers = (uint32_t)n_layers;
    g->on_disk = calloc((size_t)g->cfg.kv_blocks, 1);
    g->disk_buf = malloc(zi_kv_disk_payload_bytes(&id));
    if (!g->on_disk || !g->disk_buf) {
        free(g->on_disk);
        free(g->disk_buf);
        g->on_disk = g->disk_buf = NULL;
        return zi_error_set(err, ZI_ENOMEM, "out of memory for the disk tier");
    }
    /* queued writes: 32 MiB (at least 4 blocks), outside the KV cache */
    int rc = zi_kv_disk_open(dir, max_bytes, 32u << 20, &id, log, &g->disk, err);
    if (rc) {
        free(g->on_disk);
        free(g->disk_buf);
        g->on_disk = g->disk_buf = NULL;
        return rc;
    }
    zi_kv_blocks_set_evict_hook(g->kb, evicted, g);
    return ZI_OK;
}

int zi_generator_slots_used(const zi_generator *g) {
    return g->slots_used;
}

uint64_t zi_generator_kv_disk_id(const zi_generator *g) {
    return g->disk ? zi_kv_disk_share_id(g->disk) : 0;
}

const zi_generator_config *zi_generator_get_config(const zi_generator *g) {
    return &g->cfg;
}

void zi_generator_get_stats(const zi_generator *g, zi_generator_stats *out) {
    *out = g->stats;
    zi_kv_blocks_stats ks;
    zi_kv_blocks_get_stats(g->kb, &ks);
    out->kv_used = ks.used;
    out->kv_cached = ks.cached;
    out->kv_free = ks.free;
    out->evictions = ks.evictions;
    out->device_sampled = zi_device_sampler_count(g->dev);
    zi_device_sampler_graph_stats(g->dev, &out->graph_captures, &out->graph_replays);
    if (g->disk) {
        zi_kv_disk_stats ds;
        zi_kv_disk_get_stats(g->disk, &ds);
        out->disk_bytes = ds.bytes;
        out->disk_written_blocks = ds.written_blocks;
        out->disk_dropped_writes = ds.dropped_writes;
        out->disk_rejected = ds.rejected;
        out->disk_read_us = ds.read_us;
        out->disk_write_us = ds.write_us;
    }
}

int zi_generator_check(const zi_generator *g, zi_error *err) {
    return zi_kv_blocks_check(g->kb, err);
}

/* The prefix-cache key of a context's adapters (zi_kv_blocks_match_seeded):
 * 0 without any, else a hash of their ids, keys (zi_lora_key) and scales
 * in order. */
static uint64_t lora_seed(const zi_generator *g, const zi_text_context *c) {
    uint64_t h = 0;
    for (size_t i = 0; i < c->n_lora; i++) {
        uint32_t bits;
        memcpy(&bits, &c->lora[i].scale, sizeof bits);
        const int id = c->lora[i].id;
        const uint64_t key =
            id >= 0 && id < g->cfg.n_loras && g->cfg.loras[id] ? zi_lora_key(g->cfg.loras[id]) : 0;
        h = (h ^ key) * 0x9e3779b97f4a7c15ULL;
        h = (h ^ ((uint64_t)(uint32_t)id << 32 | bits)) * 0x9e3779b97f4a7c15ULL;
        h ^= h >> 29;
    }
    return c->n_lora && h == 0 ? 1 : h;
}

void zi_generator_set_loras(zi_generator *g, const zi_lora *const *loras, int n) {
    g->cfg.loras = loras;
    g->cfg.n_loras = n;
}

/* Gives a sequence's blocks back (shared ones stay with their other users,
 * registered ones stay cached). Last block first: the pool evicts the least
 * recently released cached block first, so a cached chain loses its tail
 * before its head, and what stays can still be matched from the start. */
static void drop_blocks(zi_generator *g, gseq *q) {
    for (int32_t i = q->n_blocks; i-- > 0;) zi_kv_blocks_release(g->kb, q->blocks[i]);
    q->n_blocks = q->n_registered = 0;
    q->last_hash = q->seed;
    if (g->drafter) zi_spec_draft_reset(g->drafter, (int)(q - g->seqs));
}

void zi_generator_release(zi_generator *g, zi_text_context *ctx) {
    int64_t slot;
    if (zi_text_context_cache_seq_id(ctx, &slot, NULL) != ZI_OK) return;
    if (slot >= 0 && slot < g->cfg.n_slots && g->slot_used[slot]) {
        drop_blocks(g, &g->seqs[slot]);
        if (g->ckpts) zi_state_ckpts_disown(g->ckpts, (int)slot);
        g->slot_used[slot] = 0;
        g->slots_used--;
    }
    zi_text_context_unassign_from_cache(ctx, NULL);
}

int zi_generator_check_images(const zi_generator *g, const zi_text_context *c, zi_error *err) {
    if (!c->n_images) return ZI_OK;
    if (!g->cfg.encode_tile)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "images: this worker has no vision tower (--mmproj) to encode them");
    if (c->log_probabilities_echo)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "echo: a prompt with images cannot be echoed (its image positions "
                            "are not tokens)");
    for (size_t i = 0; i < c->n_images; i++) {
        const zi_ctx_image *im = &c->images[i];
        if (im->non_causal && im->tile_tokens > g->cfg.max_batch_tokens)
            return zi_error_set(err, ZI_EINVAL,
                                "images[%zu]: a tile of %d soft tokens, which attend to each "
                                "other, must run in one step, and a step holds %d tokens: "
                                "raise --batch-size to at least %d",
                                i, (int)im->tile_tokens, g->cfg.max_batch_tokens,
                                (int)im->tile_tokens);
    }
    return ZI_OK;
}

/* Gives every context in the batch a slot, or fails without changing any. */
static int assign_slots(zi_generator *g, zi_text_context *const *batch, size_t n, zi_error *err) {
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t slot = -1;
        zi_text_context_cache_seq_id(batch[i], &slot, NULL);
        if (slot >= 0 && (slot >= g->cfg.n_slots || !g->slot_used[slot]))
            return zi_error_set(err, ZI_EINVAL,
                                "a context holds cache slot %lld, which this generator did "
                                "not give it",
                                (long long)slot);
        if (slot < 0 && !zi_text_context_is_done(batch[i])) {
            need++;
            int rc = zi_generator_check_images(g, batch[i], err);
            if (rc) return rc;
        }
        if (batch[i]->end_idx > g->cfg.ctx)
            return zi_error_set(err, ZI_ERANGE,
                                "a context of %lld tokens exceeds the %d positions "
                                "of a sequence",
                                (long long)batch[i]->end_idx, g->cfg.ctx);
    }
    if (need > (size_t)(g->cfg.n_slots - g->slots_used))
        return zi_error_set(err, ZI_ENOMEM, "no free KV-cache slot (%d of %d in use, %zu needed)",
                            g->slots_used, g->cfg.n_slots, need);
    int next = 0;
    for (size_t i = 0; i < n; i++) {
        zi_text_context *c = batch[i];
        if (zi_text_context_is_assigned_to_cache(c) || zi_text_context_is_done(c)) continue;
        while (g->slot_used[next]) next++;
        g->slot_used[next] = 1;
        g->slots_used++;
        gseq *q = &g->seqs[next];
        q->n_blocks = q->n_registered = 0;
        q->seed = lora_seed(g, c);
        q->last_hash = q->seed;
        q->looked_up = 0;
        q->gr_fed = -1;
        zi_spec_state_init(&q->spec);
        zi_spec_state_init(&q->dspec);
        q->n_draft = 0;
        q->pids_ok = 0;
        zi_grammar_state_free(q->gs);
        zi_grammar_cache_put(g->grammars, q->gram);
        q->gs = NULL, q->gram = NULL;
        q->arrival = ++g->arrivals;
        zi_text_context_assign_to_cache(c, next, NULL);
    }
    return ZI_OK;
}

/* Grows a scratch array to hold n elements of size sz (grow.h). */
static int grow(void **p, size_t *cap, size_t n, size_t sz, zi_error *err) {
    if (zi_grow_to(p, cap, sz, n, 16))
        return zi_error_set(err, ZI_ENOMEM, "out of memory for %zu sampling entries", n);
    return ZI_OK;
}

/* One position's log probabilities (the token's and the top n) as a fresh
 * single-entry zi_logprobs, for zi_text_context_update and friends. */
static int make_logprobs(zi_generator *g, const float *row, int32_t token, int64_t top_n,
                         zi_logprobs **out, zi_error *err) {
    int32_t n = (int32_t)(top_n < g->n_vocab ? top_n : g->n_vocab);
    int rc = grow((void **)&g->top_ids, &g->top_cap, (size_t)n, sizeof *g->top_ids, err);
    if (!rc && (size_t)n > g->top_lps_cap)
        rc = grow((void **)&g->top_lps, &g->top_lps_cap, (size_t)n, sizeof *g->top_lps, err);
    float tok_lp = 0;
    if (!rc)
        rc = zi_sampler_logprobs(row, g->n_vocab, token, n, &tok_lp, g->top_ids, g->top_lps, err);
    if (rc) return rc;
    zi_logprobs *lp = malloc(sizeof *lp);
    if (!lp) return zi_error_set(err, ZI_ENOMEM, "out of memory for log probabilities");
    zi_logprobs_init(lp);
    if ((rc = zi_logprobs_push(lp, tok_lp, g->top_ids, g->top_lps, (size_t)n, err))) {
        zi_logprobs_free(lp);
        free(lp);
        return rc;
    }
    *out = lp;
    return ZI_OK;
}

/* The positions of c the disk tier may hold: those before its first
 * image's soft tokens, whose K/V come from the worker's --mmproj, which
 * the files' identity does not name (a LoRA adapter's blocks are kept out
 * by their seed). */
static int64_t disk_positions(const zi_text_context *c) {
    int64_t p = INT64_MAX;
    for (size_t i = 0; i < c->n_images; i++)
        if (c->images[i].n_tiles > 0 && c->images[i].tile_first[0] < p)
            p = c->images[i].tile_first[0];
    return p;
}

/* The disk tier: queues registered block id (hash, parent, tokens) to
 * be written, a copy of its K/V taken now (so that a killed worker's
 * prefixes are on disk, not only the evicted ones); a block the tier must
 * not hold (skip: under a LoRA seed, or after an image) is never written.
 * A full queue drops it: the eviction hook tries again. */
static void queue_write(zi_generator *g, int32_t id, int skip, uint64_t hash, uint64_t parent,
                        const int32_t *tk) {
    if (skip) {
        g->on_disk[id] = 1;
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    void *buf = zi_kv_disk_write_begin(g->disk, hash, parent, tk);
    if (buf && zi_kv_cache_read_block(g->kv, id, buf) == ZI_OK) {
        zi_kv_disk_write_commit(g->disk);
        g->on_disk[id] = 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    g->stats.disk_queue_us +=
        (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000);
}

/* Registers the blocks of c that are now full (every position fed) for
 * prefix sharing, and marks them committed (the seeds' committed_idx). */
static void register_full_blocks(zi_generator *g, zi_text_context *c) {
    if (!g->cfg.prefix_cache) return;
    gseq *q = zi_gen_seq_of(g, c);
    int bs = g->cfg.block_size;
    int32_t full = (int32_t)(c->start_idx / bs);
    if (full > q->n_blocks) full = q->n_blocks;
    for (; q->n_registered < full; q->n_registered++) {
        const int32_t *tk = c->tokens + (size_t)q->n_registered * bs;
        const int32_t id = q->blocks[q->n_registered];
        const uint64_t parent = q->last_hash;
        q->last_hash = zi_kv_blocks_register(g->kb, id, parent, tk);
        if (g->disk && zi_kv_blocks_registered(g->kb, id) && !g->on_disk[id])
            queue_write(g, id,
                        q->seed != 0 || (int64_t)(q->n_registered + 1) * bs > disk_positions(c),
                        q->last_hash, parent, tk);
    }
    if ((int64_t)full * bs > c->committed_idx)
        zi_text_context_set_token_indices(c, ZI_IDX_KEEP, ZI_IDX_KEEP, ZI_IDX_KEEP,
                                          (int64_t)full * bs, NULL);
}

/* Prompt tokens per step of a window whose every position's logits are
 * kept (echo): bounds the logits buffer (a row is n_vocab floats). */
#define ZI_ECHO_ROWS 64

/* Does this window need the log probabilities of its prompt tokens (echo)?
 * Then every position's logits are kept, not only the last one's. */
static int wants_echo(const zi_text_context *c) {
    return c->log_probabilities > 0 && c->log_probabilities_echo &&
           c->start_idx + 1 < c->prompt_len;
}

/* Preemption (the seeds' reset): the sequence gives its blocks back and
 * all its tokens become a prompt to encode again when memory allows; its
 * generated tokens stand, and with prefix caching its own registered
 * blocks may still be found then. */
static void preempt(zi_generator *g, zi_text_context *c) {
    gseq *q = zi_gen_seq_of(g, c);
    drop_blocks(g, q);
    q->looked_up = 0;
    zi_text_context_reset(c);
    g->stats.preemptions++;
}

/* A hybrid's prefix match of `got` blocks, whose chained hashes the
 * lookup left in g->hashes: the longest part of it that ends where a
 * checkpoint was taken, that checkpoint copied into the
 * sequence's state slot; the blocks past it are given back (their K/V is
 * of no use without the state there). Returns the blocks kept. */
static int32_t resume_state(zi_generator *g, zi_text_context *c, gseq *q, int32_t got) {
    const int bs = g->cfg.block_size;
    int32_t keep = got;
    int row = -1;
    for (; keep > 0 && row < 0; keep--)
        row = zi_state_ckpts_find(g->ckpts, g->hashes[keep - 1], c->tokens, (int64_t)keep * bs);
    if (row >= 0) keep++; /* the loop stepped past it */
    const int slot = (int)(q - g->seqs);
    if (row >= 0 && zi_kv_cache_copy_state(g->kv, slot, g->cfg.n_slots + row, NULL) != ZI_OK)
        keep = 0;
    for (int32_t j = got; j-- > keep;) zi_kv_blocks_release(g->kb, q->blocks[j]);
    q->last_hash = keep > 0 ? g->hashes[keep - 1] : q->seed;
    return keep;
}

/* After a step, a hybrid's sequence whose state now covers exactly its
 * registered blocks leaves a checkpoint of it (state_ckpt.h): of its
 * prompt while it encodes one, else its latest. The state is copied only
 * when the checkpoint is new: not at a chunk's end before the prompt's
 * last whole block (the sequence's prompt checkpoint, which replaces it a
 * few steps later, schedule cuts a pass there), and not when a row holds
 * that exact prefix already (the same chained hash and tokens give the
 * same state: a repeated prompt, or its greedy reply). */
static void checkpoint_state(zi_generator *g, zi_text_context *c) {
    gseq *q = zi_gen_seq_of(g, c);
    const int bs = g->cfg.block_size;
    const int64_t fed = c->start_idx;
    if (!g->ckpts || fed <= 0 || fed % bs || (int64_t)q->n_registered * bs != fed) return;
    const int slot = (int)(q - g->seqs);
    assert(zi_kv_cache_state_length(g->kv, slot) == fed);
    const int kind = fed < c->prompt_len ? ZI_CKPT_PROMPT : ZI_CKPT_LATEST;
    if (kind == ZI_CKPT_PROMPT && fed < (c->prompt_len - 1) / bs * bs) return;
    const int held = zi_state_ckpts_find(g->ckpts, q->last_hash, c->tokens, fed) >= 0;
    int row = zi_state_ckpts_take(g->ckpts, slot, kind, q->last_hash, c->tokens, fed);
    if (row >= 0 && !held &&
        zi_kv_cache_copy_state(g->kv, g->cfg.n_slots + row, slot, NULL) != ZI_OK)
        zi_state_ckpts_drop(g->ckpts, row); /* it holds no such state */
}

/* The disk tier's part of a prefix lookup whose first `got` blocks were
 * found in memory (q->blocks, q->last_hash): reads the next blocks from
 * disk into blocks of the pool (taken from the free or cached ones, never
 * by preempting a sequence) and registers them, going back to memory
 * after each one (a later block may still be cached), up to max blocks.
 * Runs at the request's admission, in the step that schedules it (its
 * time: disk_read_us). Returns the blocks now held. */
static int32_t match_disk(zi_generator *g, zi_text_context *c, gseq *q, int32_t got, int32_t max) {
    const int bs = g->cfg.block_size;
    while (got < max && zi_kv_blocks_available(g->kb) > 0) {
        const int32_t *tk = c->tokens + (size_t)got * bs;
        const uint64_t parent = q->last_hash;
        const uint64_t h = zi_kv_blocks_hash(g->kb, parent, tk);
        if (!zi_kv_disk_read(g->disk, h, parent, tk, g->disk_buf)) {
            g->stats.disk_miss_blocks++;
            break;
        }
        const int32_t id = zi_kv_blocks_alloc(g->kb);
        if (id < 0) break;
        if (zi_kv_cache_write_block(g->kv, id, g->disk_buf) != ZI_OK) {
            zi_kv_blocks_release(g->kb, id);
            break;
        }
        zi_kv_blocks_register(g->kb, id, parent, tk);
        g->on_disk[id] = zi_kv_blocks_registered(g->kb, id);
        if (g->hashes) g->hashes[got] = h;
        q->blocks[got++] = id;
        q->last_hash = h;
        g->stats.disk_hit_blocks++;
        if (got == max) break;
        int32_t more = zi_kv_blocks_match_seeded(
            g->kb, h, c->tokens + (size_t)got * bs, (int64_t)(max - got) * bs, max - got,
            q->blocks + got, g->hashes ? g->hashes + got : NULL, &q->last_hash);
        got += more;
        g->stats.mem_hit_blocks += (uint64_t)more;
        if (got < max) g->stats.mem_miss_blocks++;
    }
    return got;
}

/* A context at the start of (re-)encoding takes the cached blocks of its
 * longest registered prefix, leaving at least one token to feed (its
 * logits). Not for echoed log probabilities, which need every position. */
static void match_prefix(zi_generator *g, zi_text_context *c, gseq *q) {
    if (!g->cfg.prefix_cache || q->looked_up || q->n_blocks > 0 || c->start_idx != 0 ||
        (c->log_probabilities > 0 && c->log_probabilities_echo))
        return;
    q->looked_up = 1; /* once per (re)start, even if it waits for memory */
    int64_t eligible = c->end_idx - 1;
    int32_t max = (int32_t)(eligible / g->cfg.block_size);
    g->stats.prefix_query_tokens += (uint64_t)eligible;
    if (max < 1) return;
    /* a hybrid's state checkpoints are looked up by these blocks' hashes
     * (resume_state): g->hashes is allocated for them */
    int32_t got = zi_kv_blocks_match_seeded(g->kb, q->seed, c->tokens, eligible, max, q->blocks,
                                            g->hashes, &q->last_hash);
    g->stats.mem_hit_blocks += (uint64_t)got;
    if (got < max) g->stats.mem_miss_blocks++;
    if (got < max && g->disk && q->seed == 0) {
        int64_t dmax = disk_positions(c) / g->cfg.block_size;
        if (got < dmax) got = match_disk(g, c, q, got, dmax < max ? (int32_t)dmax : max);
    }
    if (got > 0 && g->ckpts) got = resume_state(g, c, q, got);
    if (got == 0) return;
    q->n_blocks = q->n_registered = got;
    int64_t at = (int64_t)got * g->cfg.block_size;
    g->stats.prefix_hit_tokens += (uint64_t)at;
    zi_text_context_set_token_indices(c, at, ZI_IDX_KEEP, ZI_IDX_KEEP, at, NULL);
}

/* Blocks for positions [0, upto) of c's sequence: allocates what is
 * missing, preempting the newest sequences (newer than c) when the pool is
 * empty. Returns how many positions are covered (< upto when even that did
 * not free enough). */
static int64_t ensure_blocks(zi_generator *g, zi_text_context *c, size_t n, int64_t upto) {
    gseq *q = zi_gen_seq_of(g, c);
    int bs = g->cfg.block_size;
    if (upto > (int64_t)g->max_blocks * bs)
        upto = (int64_t)g->max_blocks * bs; /* q->blocks' size */
    while ((int64_t)q->n_blocks * bs < upto) {
        int32_t id = zi_kv_blocks_alloc(g->kb);
        if (id < 0) {
            /* the newest context (other than c) that holds blocks */
            zi_text_context *victim = NULL;
            for (size_t i = n; i-- > 0;) {
                zi_text_context *o = g->order[i];
                gseq *oq = zi_gen_seq_of(g, o);
                if (oq->arrival > q->arrival && oq->n_blocks > 0) {
                    victim = o;
                    break;
                }
            }
            if (!victim) break;
            preempt(g, victim);
            continue;
        }
        q->blocks[q->n_blocks++] = id;
    }
    int64_t have = (int64_t)q->n_blocks * bs;
    return have < upto ? have : upto;
}

/* Can c's next token be speculated? A decode step of one token, greedy
 * or sampled, with penalties, logit bias, min_new_tokens, log
 * probabilities and structured-output masks (each verification row is
 * processed as if the drafts before it had been generated: its mask is the
 * grammar's after them, zi_gen_grammar_masks). */
static int spec_eligible(const zi_generator *g, const zi_text_context *c) {
    const zi_sampling_params *sp = &c->sampling_params;
    /* (a thinking budget may replace the sampled token: no drafts) */
    return (g->cfg.spec_lookup || g->drafter) && sp->speculate && !c->is_initial_prompt &&
           c->active_idx == c->end_idx && c->start_idx + 1 == c->end_idx && !c->thinking_budget &&
           !c->codec_plan; /* (its mask is for its own row only) */
}

/* Drafts for a decoding context whose last token is scheduled: at most cap
 * of them (the step's budget left), never more than could be emitted
 * before max_length (the model's token after the last draft is emitted
 * too) or fed within the sequence's positions, and only with KV blocks got
 * without preempting anyone. They go in q->draft / q->n_draft. */
static void propose_drafts(zi_generator *g, zi_text_context *c, gseq *q, int cap) {
    int64_t room = c->max_length - c->end_idx - 1, pos_room = g->cfg.ctx - c->end_idx;
    if (room < cap) cap = (int)room;
    if (pos_room < cap) cap = (int)pos_room;
    if (cap > ZI_SPEC_MAX_DRAFT) cap = ZI_SPEC_MAX_DRAFT;
    if (cap <= 0) return;
    int n = 0;
    if (g->cfg.spec_lookup) {
        int k = zi_spec_draft_len(&q->spec, cap);
        /* only over the tokens after the last image: keys are no ids */
        int64_t base = 0;
        if (c->n_images) {
            const zi_ctx_image *im = &c->images[c->n_images - 1];
            base = (int64_t)im->tile_first[im->n_tiles - 1] + im->tile_tokens;
        }
        n = k > 0 ? zi_spec_propose(c->tokens + base, c->end_idx - base, k, q->draft) : 0;
    }
    /* No lookup draft: the draft model's, proposed once the step is
     * scheduled (propose_by_model); here its length and room. */
    q->by_model = n == 0 && g->drafter && !c->n_images; /* it has no image embeddings */
    if (q->by_model) {
        int k = zi_spec_draft_len(&q->dspec, cap);
        n = k > 0 ? zi_spec_draft_reserve(g->drafter, (int)(q - g->seqs), c->end_idx, k) : 0;
        q->by_model = n > 0;
    }
    int bs = g->cfg.block_size;
    while (n > 0 && (int64_t)q->n_blocks * bs < c->end_idx + n) {
        if (q->n_blocks >= g->max_blocks || zi_kv_blocks_available(g->kb) == 0) {
            n = (int)((int64_t)q->n_blocks * bs - c->end_idx);
            break;
        }
        q->blocks[q->n_blocks++] = zi_kv_blocks_alloc(g->kb);
    }
    q->n_draft = n > 0 ? n : 0;
    assert(q->n_draft <= cap && c->end_idx + q->n_draft <= (int64_t)q->n_blocks * bs);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The time of a decode-only step of n rows, from the measured ones
 * (t_decode over d_decode rows): each row more or fewer costs about what a
 * prompt token costs (both are one row of every product; attention and
 * sampling aside), and a step never costs less than its share of the
 * measured one. Before any decode-only step is measured (a burst of
 * requests keeps every step mixed), a step's fixed cost is taken as 16
 * prompt tokens (the chunk before anything is measured). 0: nothing
 * known. */
static double decode_time(const zi_generator *g, int n) {
    if (g->t_decode <= 0) return (n > 16 ? n : 16) * g->t_prompt_token;
    double t = g->t_decode + (n - g->d_decode) * g->t_prompt_token;
    double floor = g->t_decode * n / g->d_decode;
    return t > floor ? t : floor;
}

/* Prompt tokens allowed in a step beside n_decoding running decodes while
 * n_waiting prompts wait for their first token. Fixed when configured; else
 * sized so that the step takes about `stretch` times a decode-only step of
 * the decodes running now: (stretch - 1) * decode_time / (time per prompt
 * token), both measured on the last steps, so it follows the context
 * length (whose attention makes long prompts dearer per token), the number
 * of streams and the machine. Each waiting prompt gets one decode step's time
 * (stretch 2: one long prompt beside running streams keeps their
 * inter-token latency near 2x): a burst of W requests gets W times that,
 * so it fills the batch at the pace of prompt-only steps instead of a few
 * tokens per step, and the streams beside it slow down for as long as the
 * burst's prompts take (their first tokens count as much as the streams'
 * next ones; 32 requests at once on a 2-core machine: most of the
 * --batch-size budget, 256 tokens, goes to prompts until they are in). */
#define ZI_ITL_STRETCH 2.0
static int prompt_chunk(const zi_generator *g, int n_waiting, int n_decoding) {
    if (g->cfg.prefill_chunk > 0) return g->cfg.prefill_chunk;
    double t = decode_time(g, n_decoding);
    double share = n_waiting > 1 ? (double)n_waiting : 1.0;
    double c = t > 0 && g->t_prompt_token > 0
                   ? (ZI_ITL_STRETCH - 1.0) * share * t / g->t_prompt_token
                   : 16 * share; /* nothing measured yet */
    if (c < 1) return 1;
    return c > g->cfg.max_batch_tokens ? g->cfg.max_batch_tokens : (int)c;
}

/* Updates the averages behind prompt_chunk with a step of n_decode decode
 * tokens and n_prompt prompt tokens that took dt seconds. A prompt-only
 * step seeds the time per prompt token (its fixed cost included: an upper
 * estimate, replaced by mixed steps' marginal cost). */
static void time_step(zi_generator *g, int n_decode, int n_prompt, double dt) {
    const double a = 0.25; /* weight of the newest step */
    if (n_decode > 0 && n_prompt == 0) {
        g->t_decode = g->t_decode > 0 ? (1 - a) * g->t_decode + a * dt : dt;
        g->d_decode = g->d_decode > 0 ? (1 - a) * g->d_decode + a * n_decode : n_decode;
    } else if (n_decode > 0 && g->t_prompt_token > 0) {
        double per = (dt - decode_time(g, n_decode)) / n_prompt;
        if (per <= 0) per = 1e-6;
        g->t_prompt_token = (1 - a) * g->t_prompt_token + a * per;
    } else if (n_prompt > 0 && g->t_prompt_token <= 0) {
        g->t_prompt_token = dt / (n_prompt + n_decode);
    }
}

static int by_arrival(zi_generator *g, const zi_text_context *a, const zi_text_context *b) {
    return zi_gen_seq_of(g, a)->arrival < zi_gen_seq_of(g, b)->arrival;
}

/* What schedule_batch put in this step's batch, for the phases after it. */
typedef struct step_plan {
    int n_tokens;              /* tokens in the batch (g->tokens, pos, seq, want) */
    int n_stepped;             /* contexts in it (g->stepped, g->first_row) */
    int n_rows;                /* logits rows wanted */
    int n_prompt, n_decode;    /* its prompt and decode tokens, for time_step */
    int n_waiting, n_decoding; /* live contexts waiting for a first token / decoding */
    int n_embd;                /* image rows in g->embd (tokens with embd_rows >= 0) */
    int non_causal;            /* some token reaches past itself (g->attn_pos) */
} step_plan;

/* ---- images ---------------------------------------------------------------- */

/* The non_causal tile that holds position pos of c, as [*f, *e); 0 when
 * none does. */
static int noncausal_tile_at(const zi_text_context *c, int64_t pos, int64_t *f, int64_t *e) {
    size_t i;
    int32_t t;
    if (!zi_text_context_soft_token(c, pos, &i, &t) || !c->images[i].non_causal) return 0;
    *f = c->images[i].tile_first[t];
    *e = *f + c->images[i].tile_tokens;
    return 1;
}

/* The tokens a window from c->start_idx must take at least: the rest of
 * the non_causal tile it starts in (a prefix-cache hit may start it
 * inside one), or 0. */
static int64_t tile_rest(const zi_text_context *c) {
    int64_t f, e;
    return c->n_images && noncausal_tile_at(c, c->start_idx, &f, &e) ? e - c->start_idx : 0;
}

/* A window of len tokens from c->start_idx, cut so that it does not end
 * inside a non_causal tile (whose tokens all attend to each other, so
 * they run in one pass): before the tile, or to 0 (it waits) when it
 * starts in the tile and cannot take the rest. */
static int64_t tile_cut(const zi_text_context *c, int64_t len) {
    if (!c->n_images || len < 1) return len;
    int64_t end = c->start_idx + len, f, e;
    if (!noncausal_tile_at(c, end - 1, &f, &e) || e <= end) return len;
    return f > c->start_idx ? f - c->start_idx : 0;
}

/* Tile t of im, encoded once per context (cfg.encode_tile) into im->embd,
 * allocated at its first tile. */
static int encode_tile(zi_generator *g, zi_ctx_image *im, int32_t t, zi_error *err) {
    size_t per = (size_t)im->tile_tokens * (size_t)g->dim;
    if (!im->embd) {
        im->embd = malloc(per * (size_t)im->n_tiles * sizeof *im->embd);
        im->tile_encoded = calloc((size_t)im->n_tiles, 1);
        if (!im->embd || !im->tile_encoded) {
            free(im->embd), free(im->tile_encoded);
            im->embd = NULL, im->tile_encoded = NULL;
            return zi_error_set(err, ZI_ENOMEM, "out of memory for an image's %d x %d embeddings",
                                (int)im->n_tiles * (int)im->tile_tokens, g->dim);
        }
        g->stats.images_encoded++;
    }
    if (im->tile_encoded[t]) return ZI_OK;
    double t0 = now_s();
    int rc = g->cfg.encode_tile(g->cfg.encode_user, im, t, im->embd + (size_t)t * per, err);
    g->stats.image_encode_ms += (now_s() - t0) * 1e3;
    if (rc) return rc;
    im->tile_encoded[t] = 1;
    g->stats.tiles_encoded++;
    return ZI_OK;
}

/* The soft tokens of c's window of len tokens, the step's tokens [T0, T0
 * + len): each enters as its tile's embedding row, copied into the step's
 * g->embd, and in a non_causal tile (whole in the window: tile_cut)
 * reaches the tile's last position. */
static int feed_images(zi_generator *g, zi_text_context *c, int T0, int64_t len, step_plan *p,
                       zi_error *err) {
    const int64_t s = c->start_idx, e = s + len;
    const size_t row = (size_t)g->dim;
    for (size_t i = 0; i < c->n_images; i++) {
        zi_ctx_image *im = &c->images[i];
        for (int32_t t = 0; t < im->n_tiles; t++) {
            const int64_t f = im->tile_first[t], fe = f + im->tile_tokens;
            const int64_t lo = f > s ? f : s, hi = fe < e ? fe : e;
            if (f >= e) return ZI_OK; /* in position order: none further */
            if (lo >= hi) continue;
            assert(!im->non_causal || hi == fe);
            int rc = encode_tile(g, im, t, err);
            if (!rc)
                rc = grow((void **)&g->embd, &g->embd_cap, (size_t)p->n_embd + (size_t)(hi - lo),
                          row * sizeof *g->embd, err);
            if (rc) return rc;
            p->non_causal |= im->non_causal;
            for (int64_t at = lo; at < hi; at++) {
                const int T = T0 + (int)(at - s);
                const size_t k = (size_t)t * (size_t)im->tile_tokens + (size_t)(at - f);
                memcpy(g->embd + (size_t)p->n_embd * row, im->embd + k * row,
                       row * sizeof *g->embd);
                g->embd_rows[T] = p->n_embd++;
                if (im->non_causal) g->attn_pos[T] = (int32_t)(fe - 1);
            }
        }
    }
    return ZI_OK;
}

/* The prompt's ids of a context with images, without the images' keys
 * (the repetition penalty's history: an image is no token), built once
 * per slot assignment into q->pids. NULL when memory runs out. */
static const int32_t *prompt_ids(const zi_text_context *c, gseq *q, size_t *n, zi_error *err) {
    if (!q->pids_ok) {
        if (grow((void **)&q->pids, &q->pids_cap, (size_t)c->prompt_len, sizeof *q->pids, err))
            return NULL;
        size_t k = 0;
        int64_t at = 0;
        for (size_t i = 0; i < c->n_images; i++)
            for (int32_t t = 0; t < c->images[i].n_tiles; t++) {
                for (; at < c->images[i].tile_first[t]; at++) q->pids[k++] = c->tokens[at];
                at += c->images[i].tile_tokens;
            }
        for (; at < c->prompt_len; at++) q->pids[k++] = c->tokens[at];
        q->n_pids = k;
        q->pids_ok = 1;
    }
    *n = q->n_pids;
    return q->pids;
}

/* The logits row of stepped context i's last token (its window's end). */
static int last_row(const zi_generator *g, const step_plan *p, int i) {
    return i + 1 < p->n_stepped ? g->first_row[i + 1] - 1 : p->n_rows - 1;
}

/* Phase 1, schedule the batch: the live contexts oldest first (the budget
 * and the memory go to the oldest sequences, and preemption takes the
 * newest, so every request finishes), each one's window cut to the step's
 * budget and to the KV blocks it can get, gathered with its block table. */
static int schedule_batch(zi_generator *g, zi_text_context *const *batch, size_t n, step_plan *p,
                          zi_error *err) {
    memset(p, 0, sizeof *p);
    size_t n_live = 0;
    for (size_t i = 0; i < n; i++) {
        zi_text_context *c = batch[i];
        if (zi_text_context_is_done(c)) continue;
        size_t j = n_live++;
        while (j > 0 && by_arrival(g, c, g->order[j - 1])) {
            g->order[j] = g->order[j - 1];
            j--;
        }
        g->order[j] = c;
        gseq *q = zi_gen_seq_of(g, c);
        q->n_draft = q->n_verify = q->masked = 0;
        p->n_decoding += !c->is_initial_prompt;
        p->n_waiting += c->is_initial_prompt;
    }
    /* While some sequence decodes, prompts get at most prefill_chunk
     * tokens per step, so that the decodes beside them keep their pace. */
    int budget = g->cfg.max_batch_tokens;
    int prompt_budget = p->n_decoding ? prompt_chunk(g, p->n_waiting, p->n_decoding) : budget;
    for (size_t i = 0; i < n_live && budget > 0; i++) {
        zi_text_context *c = g->order[i];
        gseq *q = zi_gen_seq_of(g, c);
        if (zi_text_context_is_done(c)) continue; /* cannot happen: kept for clarity */
        match_prefix(g, c, q);
        int64_t len = zi_text_context_active_length(c);
        int prompt = c->is_initial_prompt;
        int64_t cap = prompt ? (prompt_budget < budget ? prompt_budget : budget) : budget;
        if (wants_echo(c) && cap > ZI_ECHO_ROWS) cap = ZI_ECHO_ROWS;
        /* a window that starts in a non_causal tile takes the rest of it
         * whole: beyond the prompt chunk, within the step's budget */
        int64_t rest = tile_rest(c);
        if (rest > cap) cap = rest < budget ? rest : budget;
        if (len > cap) len = cap;
        len = tile_cut(c, len);
        if (g->ckpts && prompt) { /* a pass ends at the prompt's last whole block: checkpoint */
            const int64_t B = (c->end_idx - 1) / g->cfg.block_size * g->cfg.block_size;
            /* (not inside a tile that runs whole: the window could never start) */
            if (c->start_idx < B && c->start_idx + len > B &&
                tile_cut(c, B - c->start_idx) == B - c->start_idx)
                len = B - c->start_idx;
        }
        if (len < 1) continue;
        int64_t covered = ensure_blocks(g, c, n_live, c->start_idx + len);
        len = tile_cut(c, covered - c->start_idx);
        if (len < 1) continue;                        /* waits for memory */
        if (len < zi_text_context_active_length(c)) { /* chunked prefill */
            int rc = zi_text_context_limit_active(c, len, err);
            if (rc) return rc;
        }
        /* The window fits the step's budget and the blocks the sequence holds. */
        assert(len <= budget && c->start_idx + len <= (int64_t)q->n_blocks * g->cfg.block_size);
        if (len == 1 && spec_eligible(g, c)) propose_drafts(g, c, q, budget - 1);
        if (q->n_draft > 0 && !q->by_model && zi_gen_constrained(g, c)) {
            /* cut the lookup draft at the first token its grammar refuses
             * before it takes rows (a draft model's drafts come after the
             * pass is laid out: build_sampler_rows cuts them) */
            int kept = zi_gen_grammar_masks(g, c, q->draft, q->n_draft, err);
            if (kept < 0) return ZI_ENOMEM;
            q->n_draft = kept;
        }
        int echo = wants_echo(c);
        int32_t row = (int32_t)p->n_stepped;
        g->state_slots[row] = (int32_t)(q - g->seqs);
        memcpy(g->tables + (size_t)row * g->max_blocks, q->blocks,
               (size_t)q->n_blocks * sizeof *q->blocks);
        g->first_row[p->n_stepped] = p->n_rows;
        const int T0 = p->n_tokens;
        for (int64_t j = 0; j < len; j++) {
            int T = p->n_tokens++;
            g->tokens[T] = c->tokens[c->start_idx + j];
            g->pos[T] = (int32_t)(c->start_idx + j);
            g->seq[T] = row;
            g->want[T] = echo || j == len - 1;
            g->embd_rows[T] = -1;
            g->attn_pos[T] = g->pos[T];
            p->n_rows += g->want[T];
        }
        if (c->n_images) {
            int rc = feed_images(g, c, T0, len, p, err);
            if (rc) return rc;
        }
        q->draft_at = p->n_tokens;
        for (int32_t j = 0; j < q->n_draft; j++) { /* behind the last token, every row wanted */
            int T = p->n_tokens++;
            g->tokens[T] = q->draft[j];
            g->pos[T] = (int32_t)(c->end_idx + j);
            g->seq[T] = row;
            g->want[T] = 1;
            g->embd_rows[T] = -1;
            g->attn_pos[T] = g->pos[T];
            p->n_rows++;
        }
        len += q->n_draft;
        budget -= (int)len;
        if (prompt)
            prompt_budget -= (int)len, p->n_prompt += (int)len;
        else
            p->n_decode += (int)len;
        g->stepped[p->n_stepped++] = c;
    }
    assert(p->n_tokens <= g->cfg.max_batch_tokens && p->n_stepped <= g->cfg.n_slots);
    assert(p->n_rows >= p->n_stepped && p->n_rows <= p->n_tokens);
    return ZI_OK;
}

/* Phase 1b, draft-model speculation: the drafts of the scheduled
 * sequences that reserved some (propose_drafts), all in one run of the
 * draft model (spec_draft.h), written into the batch where their rows
 * are. Greedy: the proposals are deterministic tokens, which the accept
 * rule (accept_drafts) needs for sampled requests to stay exact. */
static int propose_by_model(zi_generator *g, const step_plan *p, zi_error *err) {
    int n = 0;
    for (int i = 0; i < p->n_stepped; i++) {
        zi_text_context *c = g->stepped[i];
        gseq *q = zi_gen_seq_of(g, c);
        if (!q->by_model || q->n_draft == 0) continue;
        g->dreqs[n++] = (zi_spec_draft_req){.slot = (int)(q - g->seqs),
                                            .tokens = c->tokens,
                                            .n_tokens = c->end_idx,
                                            .k = q->n_draft,
                                            .out = q->draft};
    }
    if (n == 0) return ZI_OK;
    int rc = zi_spec_draft_propose(g->drafter, g->dreqs, n, err);
    for (int i = 0; !rc && i < p->n_stepped; i++) {
        gseq *q = zi_gen_seq_of(g, g->stepped[i]);
        if (q->by_model && q->n_draft > 0)
            memcpy(g->tokens + q->draft_at, q->draft, (size_t)q->n_draft * sizeof *q->draft);
    }
    return rc;
}

/* Phase 2, the sampler rows: one for every stepped context whose window
 * reached the end of its tokens (a chunk in the middle of a prompt has
 * nothing to sample), with its parameters, history, EOS mask
 * (min_new_tokens) and structured-output mask; *n_sample gets how many. */
static int build_sampler_rows(zi_generator *g, const step_plan *p, int *n_sample, zi_error *err) {
    size_t n_forbid = 0;
    for (int i = 0; i < p->n_stepped; i++) {
        const zi_text_context *c = g->stepped[i];
        n_forbid += c->eos_token_ids.n + c->sampling_params.stop_token_ids.n;
    }
    int rc = grow((void **)&g->forbid, &g->forbid_cap, n_forbid, sizeof *g->forbid, err);
    if (rc) return rc;
    *n_sample = 0;
    size_t used = 0;
    for (int i = 0; i < p->n_stepped; i++) {
        zi_text_context *c = g->stepped[i];
        g->sample_tok[i] = 0;
        if (c->active_idx < c->end_idx) continue;
        zi_sampler_row *r = &g->rows[*n_sample];
        g->row_ctx[(*n_sample)++] = i;
        int64_t n_gen = c->end_idx - c->prompt_len;
        uint8_t mask = 0;
        zi_text_context_min_token_mask(c, 1, &mask, NULL);
        gseq *q = zi_gen_seq_of(g, c);
        int n_draft = q->n_draft; /* its rows follow its token's */
        size_t n_pids = (size_t)c->prompt_len;
        const int32_t *pids = c->n_images ? prompt_ids(c, q, &n_pids, err) : c->tokens;
        if (!pids) return ZI_ENOMEM;
        *r = (zi_sampler_row){
            .logits = g->logits + (size_t)(last_row(g, p, i) - n_draft) * g->n_vocab,
            .params = &c->sampling_params,
            .prompt_ids = pids,
            .n_prompt = n_pids,
            .generated_ids = c->tokens + c->prompt_len,
            .n_generated = (size_t)n_gen,
            .step = (uint64_t)n_gen,
            .eos_forbid = g->forbid ? g->forbid + used : NULL,
        };
        q->n_verify = n_draft;
        if (zi_gen_constrained(g, c)) {
            /* its masks (scheduling made them when it cut a lookup draft);
             * a draft model's drafts are cut here, their rows past the
             * first refused one left unsampled */
            if (!q->masked) {
                int kept = zi_gen_grammar_masks(g, c, q->draft, n_draft, err);
                if (kept < 0) return ZI_ENOMEM;
                q->n_verify = kept;
            }
            r->bitmask = q->masks;
        } else if (c->codec_plan) { /* an OuteTTS codec request (codec_mask.h) */
            if (!q->masks && !(q->masks = malloc(ZI_SPEC_ROWS * (((size_t)g->n_vocab + 31) / 32) *
                                                 sizeof *q->masks)))
                return zi_error_set(err, ZI_ENOMEM, "out of memory for codec masks");
            zi_codec_plan_mask(c->codec_plan, c->tokens + c->prompt_len, (size_t)n_gen, g->n_vocab,
                               q->masks);
            r->bitmask = q->masks;
        }
        if (mask) { /* ids outside the vocabulary cannot be sampled anyway */
            const zi_i32_list *lists[2] = {&c->eos_token_ids, &c->sampling_params.stop_token_ids};
            size_t k = 0;
            for (int l = 0; l < 2; l++)
                for (size_t j = 0; j < lists[l]->n; j++)
                    if (lists[l]->v[j] >= 0 && lists[l]->v[j] < g->n_sample_vocab)
                        g->forbid[used + k++] = lists[l]->v[j];
            r->n_eos_forbid = k;
            used += k;
        }
    }
    assert(used <= n_forbid && *n_sample <= p->n_stepped);
    /* Speculation: a row after each draft, as the context's own row but in
     * the state the token after that draft would be drawn in without
     * speculation: the drafts up to it count as generated (penalties), the
     * EOS mask holds while min_new_tokens is not reached, and the step is
     * that token's (so a sampled row uses the same uniform: see
     * accept_drafts), and with structured output the grammar's mask after
     * it. Its token goes into spec_tok. */
    int n_own = *n_sample;
    size_t words = ((size_t)g->n_vocab + 31) / 32;
    for (int k = 0; k < n_own; k++) {
        int i = g->row_ctx[k];
        const zi_text_context *c = g->stepped[i];
        const gseq *q = zi_gen_seq_of(g, c);
        int first = last_row(g, p, i) - q->n_draft;
        for (int j = 0; j < q->n_verify; j++) {
            zi_sampler_row *r = &g->rows[*n_sample];
            *r = g->rows[k];
            r->logits = g->logits + (size_t)(first + 1 + j) * g->n_vocab;
            r->step += 1 + (uint64_t)j;
            r->more_generated_ids = q->draft;
            r->n_more_generated = (size_t)j + 1;
            if (r->step >= (uint64_t)c->sampling_params.min_new_tokens) r->n_eos_forbid = 0;
            if (r->bitmask) r->bitmask = q->masks + (size_t)(j + 1) * words;
            g->row_ctx[(*n_sample)++] = -1 - (i * ZI_SPEC_MAX_DRAFT + j);
        }
    }
    return ZI_OK;
}

/* Samples rows [k, k + n) on the host, or on the device from the logits
 * rows g->src_row names. */
static int draw(zi_generator *g, int k, int n, int on_device, zi_error *err) {
    if (on_device)
        return zi_device_sampler_sample(g->dev, &g->rows[k], &g->src_row[k], n, &g->out_tok[k],
                                        err);
    return zi_sampler_sample(g->sampler, &g->rows[k], (size_t)n, &g->out_tok[k], err);
}

/* Phase 3, the draw: the fused sampler over the rows (on the host, or on
 * the device with the same semantics), each token landing in its
 * context's g->sample_tok entry. */
static int sample_rows(zi_generator *g, int n_sample, int on_device, zi_error *err) {
    int rc = n_sample ? draw(g, 0, n_sample, on_device, err) : ZI_OK;
    if (rc == ZI_ERANGE) {
        /* A row with every token masked: its EOS mask (min_new_tokens)
         * covered the whole vocabulary. Drop that mask for the row rather
         * than fail the step, and so every other request in it. */
        rc = ZI_OK;
        for (int k = 0; k < n_sample && !rc; k++) {
            if (g->out_tok[k] >= 0) continue;
            g->rows[k].n_eos_forbid = 0;
            rc = draw(g, k, 1, on_device, err);
        }
    }
    if (rc) return rc;
    for (int k = 0; k < n_sample; k++) {
        assert(g->out_tok[k] >= 0 && g->out_tok[k] < g->n_sample_vocab);
        if (g->row_ctx[k] >= 0)
            g->sample_tok[g->row_ctx[k]] = g->out_tok[k];
        else
            g->spec_tok[-1 - g->row_ctx[k]] = g->out_tok[k];
    }
    return ZI_OK;
}

/* Speculation, after c's own token was recorded: the drafts the model
 * agrees with, then the model's token after the last of them, each
 * recorded as if it had been its own step (zi_text_context_update checks
 * EOS, stop ids, EOS sequences and max_length after every one, and the
 * tokens after one that ends the sequence are dropped). The K/V of the
 * rejected drafts stay in the blocks past the accepted length, where no
 * attention reads them before the next steps write those positions again;
 * start_idx stops at the first position not verified, so the prefix cache
 * never registers a block that holds one.
 *
 * The same rule serves sampled rows. A prompt-lookup draft x is a point
 * mass, so the standard rule accepts it with probability p(x) (p: the
 * row's distribution after temperature, top_k, top_p, min_p) and on
 * rejection draws from p without x, renormalised. Drawing y from p with
 * the row's own uniform (zi_sampler_uniform(seed, step), the draw the
 * token would get without speculation) and accepting x iff y == x does
 * exactly that: P(y == x) = p(x), and given y != x, y follows p without
 * x. So the output follows the target's distribution, and a seeded
 * request gets the very tokens it gets without speculation. */
static int accept_drafts(zi_generator *g, zi_text_context *c, gseq *q, int i, int row0,
                         zi_error *err) {
    int32_t target[ZI_SPEC_ROWS];
    target[0] = c->tokens[c->end_idx - 1];
    memcpy(target + 1, g->spec_tok + (size_t)i * ZI_SPEC_MAX_DRAFT,
           (size_t)q->n_verify * sizeof *target);
    /* (drafts past n_verify, refused by the grammar, are never accepted;
     * they count as drafted: their rows were fed) */
    int a = zi_spec_accept(q->draft, q->n_verify, target);
    zi_spec_record(q->by_model ? &q->dspec : &q->spec, q->n_draft, a);
    if (q->by_model) g->stats.draft_model_drafted += (uint64_t)q->n_draft;
    if (q->by_model) g->stats.draft_model_accepted += (uint64_t)a;
    g->stats.spec_steps++;
    g->stats.spec_drafted += (uint64_t)q->n_draft;
    for (int j = 1; j <= a && !zi_text_context_is_done(c); j++) {
        /* its log probabilities: the row after draft j - 1 (row0: c's own) */
        zi_logprobs *lp = NULL;
        int rc = c->log_probabilities > 0
                     ? make_logprobs(g, g->logits + (size_t)(row0 + j) * g->n_vocab, target[j],
                                     c->log_probabilities, &lp, err)
                     : ZI_OK;
        if (!rc) rc = zi_text_context_update(c, target[j], lp, err);
        if (rc) return rc;
        g->stats.spec_accepted++;
    }
    return ZI_OK;
}

/* The thinking budget (zi_text_context.thinking_budget): the token to
 * record in place of tok, the sampled one. The section starts at the
 * completion's start when the prompt opened it, else where the completion
 * begins (after whitespace) with `<think>`; it ends at `</think>` (gpt-oss's
 * harmony, thinking_harmony: `<|channel|>analysis<|message|>` and
 * `<|end|>`). Once
 * budget tokens were spent inside it, thinking_end's ids follow one per
 * step. The state is read again from the completion's bytes each time (at
 * most the budget's tokens: little next to a step), so it survives
 * preemption and failover without state of its own. */
static int32_t thinking_token(const zi_generator *g, const zi_text_context *c, int32_t tok) {
    const char *open = c->thinking_harmony ? "<|channel|>analysis<|message|>" : "<think>";
    const char *close = c->thinking_harmony ? "<|end|>" : "</think>";
    const size_t lo = strlen(open), lc = strlen(close);
    if (!c->thinking_budget || !c->thinking_end.n || !g->gvocab) return tok;
    int64_t n_gen = c->end_idx - c->prompt_len, k = (int64_t)c->thinking_end.n;
    int64_t start = c->thinking_open ? 0 : -1; /* the section's first token */
    size_t no = 0, nc = 0;                     /* bytes of open / close matched */
    for (int64_t i = 0; i < n_gen; i++) {
        /* the budget is spent: what follows is the forced end (whose own
         * closing marker is not the model's), decided below */
        if (start >= 0 && i - start >= c->thinking_budget) break;
        size_t n = 0;
        const uint8_t *b = zi_grammar_vocab_token(g->gvocab, c->tokens[c->prompt_len + i], &n);
        for (size_t j = 0; j < n; j++) {
            char ch = (char)b[j];
            if (start < 0) {
                if (!no && (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r')) continue;
                if (ch != open[no]) return tok; /* no section: no budget */
                if (++no == lo) start = i + 1;
                continue;
            }
            nc = ch == close[nc] ? nc + 1 : ch == '<' ? 1 : 0;
            if (nc == lc) return tok; /* closed */
        }
    }
    if (start < 0) return tok;
    int64_t over = n_gen - start - c->thinking_budget;
    return over >= 0 && over < k ? c->thinking_end.v[over] : tok;
}

/* Phase 4, record the outputs: echoed prompt log probabilities, then each
 * context's token (with its log probabilities when asked) through
 * zi_text_context_update, which also moves a chunked prompt's window on;
 * blocks that became full are registered for prefix sharing. */
static int record_outputs(zi_generator *g, const step_plan *p, zi_error *err) {
    int rc = ZI_OK;
    for (int i = 0; i < p->n_stepped; i++) {
        zi_text_context *c = g->stepped[i];
        int first = g->first_row[i], last = last_row(g, p, i);
        assert(first <= last);
        if (c->log_probabilities > 0 && c->log_probabilities_echo) {
            /* echo: prompt token p+1 given positions 0..p (a window that
             * wanted no echo has one row, at a position past the prompt). */
            for (int row = first; row <= last; row++) {
                int64_t at = c->start_idx + (row - first);
                if (at + 1 >= c->prompt_len) break;
                zi_logprobs *lp = NULL;
                rc = make_logprobs(g, g->logits + (size_t)row * g->n_vocab, c->tokens[at + 1],
                                   c->log_probabilities, &lp, err);
                if (!rc) rc = zi_text_context_set_prompt_logprobs(c, at + 1, lp, err);
                if (rc) return rc;
            }
        }
        int32_t tok = g->sample_tok[i];
        if (c->active_idx == c->end_idx) tok = thinking_token(g, c, tok);
        zi_logprobs *lp = NULL;
        gseq *q = zi_gen_seq_of(g, c);
        int own = last - q->n_draft; /* c's own row; the drafts' follow it */
        if (c->log_probabilities > 0 && c->active_idx == c->end_idx &&
            (rc = make_logprobs(g, g->logits + (size_t)own * g->n_vocab, tok, c->log_probabilities,
                                &lp, err)))
            return rc;
        if ((rc = zi_text_context_update(c, tok, lp, err))) return rc;
        if (q->n_draft > 0 && (rc = accept_drafts(g, c, q, i, own, err))) return rc;
        register_full_blocks(g, c);
        checkpoint_state(g, c);
    }
    return ZI_OK;
}

/* Can this step run on the device? Only when nothing in it reads the
 * logits on the host: record_outputs reads them for log probabilities
 * (the token's, and the echoed prompt's), and nothing else does. The GPU
 * sampler has no logit bias either: a step with a biased row samples on
 * the host, so the bias is never skipped. */
static int device_step_ok(const zi_generator *g, const step_plan *p) {
    if (!g->dev) return 0;
    for (int i = 0; i < p->n_stepped; i++)
        if (g->stepped[i]->log_probabilities > 0 || g->stepped[i]->sampling_params.logit_bias.n ||
            zi_gen_seq_of((zi_generator *)g, g->stepped[i])->n_draft > 0)
            return 0;
    return 1;
}

/* The step's pass and sampling on the device (device_sampler.h): the rows
 * are built first (they read only the contexts), the pass and the
 * sampling are queued back to back, and only the token ids come back. */
static int step_on_device(zi_generator *g, const step_plan *p, const zi_batch *b, zi_error *err) {
    int n_sample = 0;
    int rc = build_sampler_rows(g, p, &n_sample, err);
    if (rc) return rc;
    for (int k = 0; k < n_sample; k++) g->src_row[k] = last_row(g, p, g->row_ctx[k]);
    double t0 = now_s();
    if ((rc = zi_device_sampler_forward(g->dev, g->kv, b, err))) return rc;
    rc = sample_rows(g, n_sample, 1, err);
    /* the pass's own errors (seen at the sync) come first: its tokens are
     * not to be trusted then */
    zi_error ferr = {0};
    int rf = zi_device_sampler_finish(g->dev, &ferr);
    if (rf) {
        if (err) *err = ferr;
        return rf;
    }
    if (rc) return rc;
    time_step(g, p->n_decode, p->n_prompt, now_s() - t0);
    g->stats.prefill_chunk = prompt_chunk(g, p->n_waiting, p->n_decoding);
    return record_outputs(g, p, err);
}

/* Embeddings, phase 1b (embedder.h): the unfinished inputs after the text
 * contexts, in the step's remaining budget (beside decodes, what the
 * prompt chunk leaves); their table rows follow the contexts'. */
static int schedule_embeds(zi_generator *g, step_plan *p, zi_error *err) {
    g->es.n_stepped = g->es.n_hidden = 0;
    if (!g->n_emb) return ZI_OK;
    size_t rows = (size_t)p->n_stepped + g->n_emb;
    int rc = grow((void **)&g->tables, &g->table_rows_cap, rows,
                  (size_t)g->max_blocks * sizeof *g->tables, err);
    if (!rc)
        rc = grow((void **)&g->emb_stepped, &g->emb_cap, g->n_emb, sizeof *g->emb_stepped, err);
    if (!rc)
        rc = grow((void **)&g->want_hidden, &g->want_hidden_cap, (size_t)g->cfg.max_batch_tokens, 1,
                  err);
    if (!rc)
        rc = grow((void **)&g->f32_attn, &g->f32_attn_cap, (size_t)g->cfg.max_batch_tokens, 1, err);
    if (rc) return rc;
    memset(g->want_hidden, 0, (size_t)p->n_tokens);
    memset(g->f32_attn, 0, (size_t)p->n_tokens);
    int budget = g->cfg.max_batch_tokens - p->n_tokens;
    if (p->n_decoding) {
        int chunk = prompt_chunk(g, p->n_waiting + 1, p->n_decoding) - p->n_prompt;
        if (chunk < budget) budget = chunk;
    }
    g->es = (zi_embed_step){.tokens = g->tokens,
                            .pos = g->pos,
                            .seq = g->seq,
                            .want_logits = g->want,
                            .want_hidden = g->want_hidden,
                            .f32_attn = g->f32_attn,
                            .tables = g->tables,
                            .table_stride = g->max_blocks,
                            .block_size = g->cfg.block_size,
                            .n_tokens = p->n_tokens,
                            .first_row = p->n_stepped,
                            .stepped = g->emb_stepped};
    zi_embed_schedule(g->emb, g->n_emb, g->kb, budget, g->cfg.max_batch_tokens - p->n_tokens,
                      &g->es);
    p->n_prompt += g->es.n_tokens - p->n_tokens;
    p->n_tokens = g->es.n_tokens;
    assert(p->n_tokens <= g->cfg.max_batch_tokens);
    return grow((void **)&g->hidden, &g->hidden_cap, (size_t)g->es.n_hidden,
                (size_t)zi_model_get_config(g->model)->dim * sizeof *g->hidden, err);
}

void zi_generator_release_embed(zi_generator *g, zi_embed_input *e) {
    zi_embed_release(e, g->kb);
}

/* The step's adapters (zi_batch.lora): each text token runs its context's,
 * *k places a token (the most any stepped context has; 0: none). */
static int step_loras(zi_generator *g, const step_plan *p, int n_text, int *k, zi_error *err) {
    *k = 0;
    for (int i = 0; i < p->n_stepped; i++)
        if ((int)g->stepped[i]->n_lora > *k) *k = (int)g->stepped[i]->n_lora;
    if (*k == 0) return ZI_OK;
    for (int i = 0; i < p->n_stepped; i++)
        for (size_t j = 0; j < g->stepped[i]->n_lora; j++)
            if (g->stepped[i]->lora[j].id < 0 || g->stepped[i]->lora[j].id >= g->cfg.n_loras ||
                !g->cfg.loras[g->stepped[i]->lora[j].id])
                return zi_error_set(err, ZI_EINVAL,
                                    "lora[%zu]: adapter %d is not one of the %d loaded", j,
                                    (int)g->stepped[i]->lora[j].id, g->cfg.n_loras);
    for (int T = 0; T < p->n_tokens; T++) {
        const zi_text_context *c = T < n_text ? g->stepped[g->seq[T]] : NULL;
        for (int j = 0; j < *k; j++) {
            const int has = c && (size_t)j < c->n_lora;
            g->lora_ptr[(size_t)T * *k + j] = has ? g->cfg.loras[c->lora[j].id] : NULL;
            g->lora_sc[(size_t)T * *k + j] = has ? c->lora[j].scale : 0.0f;
        }
    }
    return ZI_OK;
}

/* One step over the live contexts: schedule, one forward pass, sample,
 * record. *any_live is set when something ran. */
static int step(zi_generator *g, zi_text_context *const *batch, size_t n, int *any_live,
                zi_error *err) {
    step_plan p;
    int rc = schedule_batch(g, batch, n, &p, err);
    if (!rc) rc = propose_by_model(g, &p, err);
    const int n_text = p.n_tokens; /* the embedding inputs' tokens follow */
    if (!rc) rc = schedule_embeds(g, &p, err);
    if (rc) return rc;
    for (int T = n_text; T < p.n_tokens; T++) g->embd_rows[T] = -1, g->attn_pos[T] = g->pos[T];
    *any_live = p.n_stepped > 0 || g->es.n_stepped > 0;
    if (!*any_live) return ZI_OK;
    if ((rc = grow((void **)&g->logits, &g->logit_rows, (size_t)p.n_rows,
                   (size_t)g->n_vocab * sizeof *g->logits, err)))
        return rc;
    int lora_k = 0;
    if ((rc = step_loras(g, &p, n_text, &lora_k, err))) return rc;
    zi_batch b = {.n_tokens = p.n_tokens,
                  .tokens = g->tokens,
                  .pos = g->pos,
                  .seq = g->seq,
                  .want_logits = g->want,
                  .block_tables = g->tables,
                  .n_table_rows = p.n_stepped + g->es.n_stepped,
                  .table_stride = g->max_blocks,
                  .want_hidden = g->es.n_stepped ? g->want_hidden : NULL,
                  .hidden = g->hidden,
                  .f32_attn = g->es.n_stepped ? g->f32_attn : NULL,
                  .embd = p.n_embd ? g->embd : NULL,
                  .embd_rows = p.n_embd ? g->embd_rows : NULL,
                  .attn_pos = p.non_causal ? g->attn_pos : NULL,
                  .state_slots = g->state_slots,
                  .lora = lora_k ? g->lora_ptr : NULL,
                  .lora_scale = g->lora_sc,
                  .lora_k = lora_k};
    /* (a step with image rows runs on the host path: its uploads are not
     * for a captured pass) */
    if (!g->es.n_stepped && !p.n_embd && device_step_ok(g, &p))
        return step_on_device(g, &p, &b, err);
    double t0 = now_s();
    if ((rc = zi_model_forward(g->model, g->kv, &b, g->logits, err))) return rc;
    if (g->es.n_stepped) zi_embed_collect(&g->es, g->hidden, g->kb);
    time_step(g, p.n_decode, p.n_prompt, now_s() - t0);
    g->stats.prefill_chunk = prompt_chunk(g, p.n_waiting, p.n_decoding);
    int n_sample = 0;
    if ((rc = build_sampler_rows(g, &p, &n_sample, err))) return rc;
    if ((rc = sample_rows(g, n_sample, 0, err))) return rc;
    return record_outputs(g, &p, err);
}

int zi_generator_next_token(zi_generator *g, zi_text_context *const *batch, size_t n, int num_steps,
                            zi_error *err) {
    return zi_generator_next_token_embed(g, batch, n, NULL, 0, num_steps, err);
}

int zi_generator_next_token_embed(zi_generator *g, zi_text_context *const *batch, size_t n,
                                  zi_embed_input *const *embeds, size_t n_embeds, int num_steps,
                                  zi_error *err) {
    if (n > (size_t)g->cfg.n_slots)
        return zi_error_set(err, ZI_EINVAL, "a batch of %zu contexts exceeds the %d slots", n,
                            g->cfg.n_slots);
    if (n_embeds > 0 && zi_model_get_config(g->model)->n_recurrent > 0)
        return zi_error_set(err, ZI_EUNSUPPORTED, "embeddings of '%s' (a hybrid) are not supported",
                            zi_model_get_config(g->model)->arch);
    for (size_t k = 0; k < n_embeds; k++)
        if (embeds[k]->n_tokens > g->cfg.ctx ||
            embeds[k]->max_blocks <
                (embeds[k]->n_tokens + g->cfg.block_size - 1) / g->cfg.block_size)
            return zi_error_set(err, ZI_ERANGE,
                                "an embedding input of %d tokens exceeds the %d positions "
                                "of a sequence",
                                embeds[k]->n_tokens, g->cfg.ctx);
    g->emb = embeds;
    g->n_emb = n_embeds;
    int rc = assign_slots(g, batch, n, err);
    for (int s = 0; !rc && s < num_steps; s++) {
        int live = 0;
        rc = step(g, batch, n, &live, err);
        if (!live) break;
    }
    g->emb = NULL;
    g->n_emb = 0;
    g->es.n_stepped = 0;
    return rc;
}
