/*
 * generator.h - the worker's token generator: the seeds' TokenGenerator /
 * TextGenerationPipeline, next_token(batch, num_steps) and release(context)
 * (seed names: docs/types.md).
 *
 * A zi_generator owns one paged KV cache (a fixed pool of blocks, never
 * more memory than configured) over one model, and up to n_slots sequences.
 * Each step is ONE batched forward pass over the scheduled contexts: decode
 * steps (one token each) and prompt windows together, which is what lets
 * requests join and leave the running batch between steps (continuous
 * batching). Scheduling, oldest request first:
 *
 *   - the step carries at most max_batch_tokens tokens, and while any
 *     sequence is decoding, prompts get at most prefill_chunk of them (by
 *     default adapted, from measured step times, so that such a step takes
 *     about 2x a decode-only one):
 *     long prompts are cut into chunks (zi_text_context_limit_active, the
 *     seeds' active_idx < end_idx layout) that share steps with the decodes,
 *     so running streams keep flowing;
 *   - prefix caching: a context that starts (or restarts) encoding takes
 *     the cached blocks of its longest registered prefix and feeds only the
 *     rest; blocks register once full (kv_blocks.h);
 *   - preemption: when the pool has no block left, the newest sequence
 *     gives its blocks back and is reset to re-encode later (the seeds'
 *     reset()); it is never failed, and as the oldest always progresses no
 *     request starves. The pool must hold one whole sequence (ctx).
 *
 * Each context's token is chosen by the fused sampling processor
 * (sampler.h) with the context's own sampling parameters, penalties over
 * its prompt and generated tokens, the min_new_tokens EOS mask, and a draw
 * seeded by (sampling_params.seed, tokens generated so far). Outputs do not
 * depend on batch composition: the kernels give a token the same bits alone
 * or batched, and the draw is counter based, so a seeded request repeats
 * exactly whatever runs beside it.
 *
 * Prompt-lookup speculation (cfg.spec_lookup; spec_lookup.h,
 * docs/speculative.md): a greedy decoding context without penalties, bias,
 * masks or log probabilities may feed, behind its last token, up to
 * ZI_SPEC_MAX_DRAFT tokens guessed from its own earlier tokens, in the same
 * pass as everything else; the drafts the model's own argmax agrees with
 * are emitted, then the model's token after the last of them, so one step
 * can emit several tokens and the output is the non-speculative one.
 * Draft-model speculation (cfg.draft_model; spec_draft.h): where lookup
 * has no draft, a smaller model with the same vocabulary proposes them
 * greedily, for all such contexts in one run before the pass; they are
 * verified the same way.
 *
 * Images (zi_text_context.images, types.h): a token at an image's soft
 * token position enters the pass as its tile's embedding row
 * (zi_batch.embd), the tile encoded by cfg.encode_tile when its first soft
 * token is fed (so a tile whose every position a prefix-cache hit covered
 * is never encoded), and kept in the image (im->embd) for the context's
 * life; the ids there are keys (zi_ctx_image_key), which the prefix cache
 * matches like any id. The tokens of a non_causal tile attend to the
 * whole tile (zi_batch.attn_pos), so a window never ends inside one: it
 * is cut before the tile, and a window that starts in it takes the rest
 * of the tile whole (beyond the prompt chunk, within the step's budget).
 * Keys are never vocabulary ids: the repetition penalty reads the prompt
 * without them, prompt lookup searches only the tokens after the last
 * image, the draft model does not draft for such contexts, and echoed
 * prompt log probabilities are refused (zi_generator_check_images).
 *
 * Log probabilities (ctx->log_probabilities > 0) come from the raw logits
 * and are recorded with each token (zi_text_context_update); with
 * log_probabilities_echo the prompt's tokens 1..prompt_len-1 get theirs too
 * (zi_text_context_set_prompt_logprobs), which keeps the logits of every
 * prompt position for those windows.
 */
#ifndef ZI_GENERATOR_H
#define ZI_GENERATOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "embedder.h"
#include "model.h"
#include "types.h"
#include "log.h"
#include "zi_error.h"

typedef struct zi_generator_config {
    int n_slots;          /* sequences held at once */
    int ctx;              /* positions per sequence at most */
    int max_batch_tokens; /* tokens per forward pass (the step's budget) */
    int kv_blocks;        /* KV pool in blocks; 0: n_slots * ceil(ctx / block_size), which
                           * never needs preemption. At least ceil(ctx / block_size). */
    int block_size;       /* positions per KV block; 0: 16 */
    int prefill_chunk;    /* prompt tokens per step while some sequence decodes; 0: adapt
                           * it so such a step takes ~2x a decode-only step */
    int prefix_cache;     /* share full blocks between sequences with equal prefixes */
    int sample_vocab;     /* tokens are drawn from ids 0..sample_vocab-1, which must hold every
                           * id of a context too (the sampler's vocabulary); 0: the model's
                           * whole vocabulary. `zinfer generate` passes the tokenizer's, as a
                           * model may pad its output rows beyond the ids that have text. */
    int spec_lookup;      /* prompt-lookup speculation for the requests that allow it
                           * (sampling_params.speculate; no structured output;
                           * docs/speculative.md) */
    zi_model *draft_model; /* draft-model speculation (spec_draft.h): a model with the same
                            * vocabulary (zi_spec_draft_check_vocab), on the same backend,
                            * outliving the generator; it proposes where prompt lookup has
                            * nothing (or is off). NULL: none */
    /* Images (zi_text_context.images; the paragraph on images above): the soft
     * tokens of tile `tile` of im, im->tile_tokens rows of image_dim
     * floats, into out (the worker runs its vision tower, vision.h).
     * Called during zi_generator_next_token, at most once per tile and
     * context, when the tile's first soft token is fed. An error fails
     * the step. NULL: contexts with images are refused. */
    int (*encode_tile)(void *user, const zi_ctx_image *im, int tile, float *out, zi_error *err);
    void *encode_user;
    int image_dim; /* the rows' length: the model's dim (0: taken from the model) */
    /* LoRA adapters (lora.h; loaded for the model, outliving the
     * generator): a context's zi_text_context.lora ids index them, and
     * each of its tokens runs those adapters; its prefix-cache blocks are
     * keyed by them (a prefix is shared only under the same adapters and
     * scales, and zi_lora_key). NULL: contexts with adapters fail the
     * step; a NULL entry is a free place (an unloaded adapter's). */
    const struct zi_lora *const *loras;
    int n_loras;
} zi_generator_config;

/* Counters, for logs and the router's metrics. */
typedef struct zi_generator_stats {
    int32_t kv_blocks, block_size;
    uint64_t kv_bytes;
    int32_t kv_used, kv_cached, kv_free;
    uint64_t prefix_query_tokens; /* prompt tokens looked up in the prefix cache */
    uint64_t prefix_hit_tokens;   /* of those, found cached (not computed again) */
    uint64_t preemptions;         /* sequences sent back to re-encoding */
    uint64_t evictions;           /* cached blocks reused for other K/V */
    int32_t prefill_chunk;        /* the prompt tokens per step beside decodes, now */
    uint64_t device_sampled;      /* tokens sampled on the GPU (device_sampler.h) */
    uint64_t graph_captures;      /* decode passes captured in CUDA graphs (device_sampler.h) */
    uint64_t graph_replays;       /* passes replayed from them */
    uint64_t spec_steps;          /* speculation: verifications (a sequence's drafts in a step) */
    uint64_t spec_drafted;        /* draft tokens fed for verification */
    uint64_t spec_accepted;       /* of those, accepted (emitted without a step of their own) */
    uint64_t draft_model_drafted; /* of spec_drafted, proposed by the draft model */
    uint64_t draft_model_accepted; /* of those, accepted */
    uint64_t images_encoded;       /* images whose first tile was encoded */
    uint64_t tiles_encoded;        /* tiles run through cfg.encode_tile */
    double image_encode_ms;        /* milliseconds spent in cfg.encode_tile */
    /* The prefix cache per tier, in blocks (zi_generator_open_kv_disk):
     * found in memory, and lookups memory could not answer (each one
     * then asked of the disk tier when there is one); read back from
     * disk, and lookups the disk could not answer. */
    uint64_t mem_hit_blocks, mem_miss_blocks;
    uint64_t disk_hit_blocks, disk_miss_blocks;
    uint64_t disk_bytes;          /* in the tier's directory (kv_disk.h) */
    uint64_t disk_written_blocks; /* files written */
    uint64_t disk_dropped_writes; /* blocks not written (queue full, write failed) */
    uint64_t disk_rejected;       /* files ignored: corrupt, truncated, foreign, stale */
    uint64_t disk_read_us, disk_write_us;
    uint64_t disk_queue_us; /* the steps' time copying blocks into the write queue */
} zi_generator_stats;

typedef struct zi_generator zi_generator;

/* Replaces the config's adapters (a worker loading or unloading one while
 * serving): loras[0..n) from the next step on. A context whose adapter is
 * gone fails its next step: unload only adapters no context runs. */
void zi_generator_set_loras(zi_generator *g, const struct zi_lora *const *loras, int n);

/* m must outlive the generator. */
int zi_generator_create(zi_model *m, const zi_generator_config *cfg, zi_generator **out,
                        zi_error *err);
void zi_generator_free(zi_generator *g);

/*
 * Adds the disk tier (kv_disk.h; docs/engine.md, "The disk tier") to the
 * prefix cache: every full block registered for sharing is queued to be
 * written to dir (and a cached block evicted from memory, if its write
 * was dropped), and a prefix lookup that memory cannot answer reads the
 * next blocks from dir at the request's admission. kv_tag names the
 * backend's KV type and computation (zi_kv_disk_identity.kv_tag), which
 * the caller knows (the activation bits, the KV type). Only for the
 * blocks of contexts without LoRA adapters (their ids are the worker's
 * own) and before a context's first image (its K/V comes from the
 * worker's projector, which the files do not name), and not for hybrids
 * (a prefix also needs a recurrent state):
 * ZI_EUNSUPPORTED for those, and without the prefix cache. At most once,
 * before the first step.
 */
int zi_generator_open_kv_disk(zi_generator *g, const char *dir, uint64_t max_bytes,
                              const char *kv_tag, const zi_logger *log, zi_error *err);
/* The disk tier's sharing id (zi_kv_disk_share_id): 0 without one. */
uint64_t zi_generator_kv_disk_id(const zi_generator *g);

/*
 * Runs up to num_steps steps over the n contexts of batch. A context without
 * a cache slot gets one (ZI_ENOMEM "no free KV-cache slot" when all are in
 * use; nothing has run then). Each step feeds every context that is not done
 * its active window (cut to the step's remaining budget and to the KV blocks
 * it can get; a context that gets neither waits for the next step, a
 * preempted one re-encodes later), samples the next token from the
 * window's last position and records it with zi_text_context_update. The
 * loop ends early when every context is done; a context that finishes
 * (EOS, a stop token id, maximum length) is not fed again, so num_steps > 1
 * checks the stop conditions after every token. On error the contexts are
 * left as the last completed step left them.
 */
int zi_generator_next_token(zi_generator *g, zi_text_context *const *batch, size_t n, int num_steps,
                            zi_error *err);

/*
 * Embeddings (embedder.h): zi_generator_next_token with n_embeds embedding
 * inputs beside the text contexts. Each step, after the text contexts have
 * their windows, the inputs that are not done get the step's remaining
 * token budget (at most the prompt chunk while some sequence decodes),
 * oldest first: an input takes the KV blocks of its whole length when it
 * starts (it waits while the pool has too few free or cached ones; it never
 * preempts a text context), runs in one or more chunks, takes the final
 * hidden states its pooling wants, and at its last token is finished
 * (zi_embed_finish), its blocks given back at once (never registered for
 * prefix sharing), and `done` set. Steps with embeddings run on the host
 * path (zi_model_forward). An input longer than the context, or whose
 * block table (max_blocks) cannot hold its length, is ZI_ERANGE.
 */
int zi_generator_next_token_embed(zi_generator *g, zi_text_context *const *batch, size_t n,
                                  zi_embed_input *const *embeds, size_t n_embeds, int num_steps,
                                  zi_error *err);
/* Gives an unfinished input's blocks back (a cancelled request). */
void zi_generator_release_embed(zi_generator *g, zi_embed_input *e);

/* Frees ctx's cache slot (the seeds' release); a no-op for a context
 * without one. */
void zi_generator_release(zi_generator *g, zi_text_context *ctx);

/*
 * Structured output (grammar.h): with a vocabulary set, a context with
 * has_json_schema (response_format json_object or json_schema; its
 * json_schema is the schema's JSON text, ZI_JSON_OBJECT_SCHEMA for any
 * object), a grammar (GBNF) or a regex (compiled to GBNF,
 * regex_grammar.h) draws each token from those that keep its
 * completion a prefix of a sentence of that grammar (schemas are compiled
 * to grammars, schema_grammar.h), and an end-of-sequence id only where the
 * grammar can end. Compiled grammars are kept in a cache by their text
 * (grammar_cache.h), so a schema sent again is not compiled again. One
 * that does not compile (the worker refuses those first) allows only
 * end-of-sequence. A grammar that runs out of memory finding a mask fails
 * the step (ZI_ENOMEM) rather than draw from a narrower one. v (NULL:
 * none) must outlive the generator and have the model's vocabulary size
 * (ZI_EINVAL otherwise).
 */
typedef struct zi_grammar_vocab zi_grammar_vocab;
int zi_generator_set_grammar_vocab(zi_generator *g, const zi_grammar_vocab *v, zi_error *err);
/* Compiles context c's constraint (json_schema, grammar or regex; none: ZI_OK)
 * into the cache, to refuse a bad one at admission: ZI_EUNSUPPORTED
 * without a vocabulary set or for unsupported schema keywords, ZI_EINVAL
 * for a bad schema or grammar (message naming the field). */
int zi_generator_check_constraint(zi_generator *g, const zi_text_context *c, zi_error *err);

/* Whether context c's images can run here, to refuse at admission what
 * zi_generator_next_token would refuse (ZI_EUNSUPPORTED: no encode_tile,
 * or echoed prompt log probabilities; ZI_EINVAL: a non_causal tile of
 * more soft tokens than a step's budget, max_batch_tokens, --batch-size).
 * ZI_OK for a context without images. */
int zi_generator_check_images(const zi_generator *g, const zi_text_context *c, zi_error *err);

/* Slots in use, for load reporting. */
int zi_generator_slots_used(const zi_generator *g);
/* The configuration in effect (defaults filled in). */
const zi_generator_config *zi_generator_get_config(const zi_generator *g);
void zi_generator_get_stats(const zi_generator *g, zi_generator_stats *out);
/* Checks the KV block pool's invariant (kv_blocks.h); for tests. */
int zi_generator_check(const zi_generator *g, zi_error *err);

#endif
