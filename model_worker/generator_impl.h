/*
 * generator_impl.h - the generator's own structures (generator.h is its
 * interface), shared by its files: generator.c (scheduling, the step,
 * sampling, speculation, embeddings) and generator_constraint.c (structured
 * output's token masks). Nothing outside model_worker/generator*.c
 * includes it.
 */
#ifndef ZI_GENERATOR_IMPL_H
#define ZI_GENERATOR_IMPL_H

#include "device_sampler.h"
#include "generator.h"
#include "grammar.h"
#include "grammar_cache.h"
#include "kv_blocks.h"
#include "kv_disk.h"
#include "sampler.h"
#include "spec_draft.h"
#include "spec_lookup.h"
#include "state_ckpt.h"
#include "vocab_trie.h"

/* Sampler rows a context may have in one step: its token's, and one after
 * each draft. */
#define ZI_SPEC_ROWS (1 + ZI_SPEC_MAX_DRAFT)

/* One sequence slot. A context holds a slot from its first step until it
 * is released; preemption takes its blocks, not its slot, so `arrival`
 * (admission order: higher is newer) survives it. */
typedef struct gseq {
    int32_t *blocks; /* [max_blocks] its block table */
    int32_t n_blocks;
    int32_t n_registered; /* leading blocks registered for prefix sharing */
    uint64_t last_hash;   /* the chained hash of block n_registered - 1 */
    uint64_t seed;        /* the chain's start: its context's adapters' key (0: none) */
    uint64_t arrival;
    int looked_up; /* the prefix cache was asked since the last (re)start */
    /* Structured output: the context's grammar (from its json_schema or
     * grammar, held from the cache) and its state after the first gr_fed
     * generated tokens (-1: not started; gr_bad: they broke it). */
    const zi_grammar *gram;
    zi_grammar_state *gs;
    int64_t gr_fed;
    uint64_t gr_hash; /* of those tokens: a rollback and other tokens is seen */
    int gr_bad;
    /* This step's masks (generator_constraint.c): row 0 for the
     * sequence's own token, row j + 1 for the token after draft j;
     * [ZI_SPEC_ROWS][ceil(n_vocab / 32)], allocated at its first
     * constrained step. masked: computed this step. */
    int32_t *masks;
    int masked;
    /* Prompt-lookup speculation (spec_lookup.h): the adaptive draft
     * length, and this step's drafts, fed behind the sequence's last token
     * (n_draft 0: none). */
    zi_spec_state spec;
    int32_t n_draft;
    int32_t draft[ZI_SPEC_MAX_DRAFT];
    /* Of those, the drafts verified: all but those from the first one the
     * grammar refuses (a constrained draft-model draft is cut only after
     * the pass; its rows past n_verify are fed but not sampled). */
    int32_t n_verify;
    /* Draft-model speculation (spec_draft.h): its own adaptive length;
     * by_model: this step's drafts are the draft model's, proposed after
     * scheduling into the batch from index draft_at. */
    zi_spec_state dspec;
    int32_t by_model, draft_at;
    /* A context with images: its prompt's ids without the images' keys,
     * for the repetition penalty (pids_ok: built since the slot was
     * assigned). */
    int32_t *pids;
    size_t n_pids, pids_cap;
    int pids_ok;
} gseq;

struct zi_generator {
    zi_model *model;
    zi_kv_cache *kv;
    zi_kv_blocks *kb;
    zi_generator_config cfg;
    int n_vocab;        /* the model's: a logits row */
    int n_sample_vocab; /* ids a draw may give (cfg.sample_vocab, 0: n_vocab) */
    int32_t max_blocks; /* block table entries per sequence */
    uint8_t *slot_used; /* [n_slots] */
    gseq *seqs;         /* [n_slots] */
    int slots_used;
    uint64_t arrivals;
    zi_generator_stats stats;
    /* Adaptive prefill chunk (cfg.prefill_chunk == 0): moving averages of a
     * decode-only step's time and of its decode rows (t_decode, d_decode),
     * and of the extra time per prompt token in a mixed step (0: not
     * measured yet); times in seconds. */
    double t_decode, d_decode, t_prompt_token;
    /* step buffers, max_batch_tokens long */
    int32_t *tokens, *pos, *seq;
    uint8_t *want;
    int32_t *tables;           /* [n_slots][max_blocks] this step's block tables */
    zi_text_context **order;   /* [n_slots] the call's contexts, oldest first */
    zi_text_context **stepped; /* contexts in this step, in batch order */
    int *first_row;            /* [n_slots] each stepped context's first logits row */
    float *logits;             /* [logit_rows][n_vocab]: one per context, more for echo */
    size_t logit_rows;
    /* sampling */
    zi_sampler *sampler;
    zi_sampler_row *rows; /* [n_slots * ZI_SPEC_ROWS] */
    int *row_ctx;         /* [n_slots * ZI_SPEC_ROWS] sampled row -> stepped index, or for a
                           * row after a draft -1 - its spec_tok index */
    int32_t *out_tok;     /* [n_slots * ZI_SPEC_ROWS] */
    int32_t *sample_tok;  /* [n_slots] each stepped context's own token */
    int32_t *spec_tok;    /* [n_slots][ZI_SPEC_MAX_DRAFT] the tokens after each draft */
    int32_t *forbid;      /* EOS ids masked by min_new_tokens */
    size_t forbid_cap;
    const zi_grammar_vocab *gvocab; /* structured output (NULL: refused) */
    zi_grammar_cache *grammars;     /* compiled constraints, by their text */
    int32_t *top_ids;               /* log-probability scratch */
    float *top_lps;
    size_t top_cap, top_lps_cap;
    /* sampling on the device (NULL: the backend is not CUDA) */
    zi_device_sampler *dev;
    int *src_row; /* [n_slots * ZI_SPEC_ROWS] sampled row -> its logits row */
    /* draft-model speculation (NULL: cfg.draft_model is NULL) */
    zi_spec_draft *drafter;
    zi_spec_draft_req *dreqs; /* [n_slots] */
    /* embeddings (zi_generator_next_token_embed): this call's inputs, the
     * ones in this step (their table rows follow the text contexts'), and
     * the step's hidden-state rows */
    zi_embed_input *const *emb;
    size_t n_emb;
    zi_embed_input **emb_stepped; /* [emb_cap] */
    size_t emb_cap;
    zi_embed_step es;      /* this step's (es.n_stepped 0: none) */
    size_t table_rows_cap; /* rows g->tables holds (n_slots at first) */
    uint8_t *want_hidden;  /* [max_batch_tokens] */
    size_t want_hidden_cap;
    uint8_t *f32_attn; /* [max_batch_tokens]: zi_batch.f32_attn */
    size_t f32_attn_cap;
    float *hidden; /* [n_hidden][dim] */
    size_t hidden_cap;
    /* images: the step's input embedding rows (zi_batch.embd, [rows][dim]),
     * and for each token its row or -1 and its attention reach */
    float *embd;
    size_t embd_cap; /* rows */
    int32_t *embd_rows, *attn_pos; /* [max_batch_tokens] */
    int32_t *state_slots;          /* [n_slots] a step's table row -> its slot (a hybrid's
                                    * recurrent states, zi_batch.state_slots) */
    /* A hybrid's checkpoints for prefix reuse (state_ckpt.h; NULL: none),
     * in the KV cache's state rows from n_slots on; hashes: [max_blocks]
     * the chained hashes of a prefix match's blocks */
    zi_state_ckpts *ckpts;
    uint64_t *hashes;
    int dim;                       /* the model's */
    /* The disk tier (zi_generator_open_kv_disk; NULL: none): on_disk[id]
     * says block id's K/V need no write when it is evicted (queued when
     * registered, read from disk, or under a LoRA seed); disk_buf is a
     * block's payload read back. */
    zi_kv_disk *disk;
    uint8_t *on_disk; /* [cfg.kv_blocks] */
    void *disk_buf;
    /* a step's adapters (zi_batch.lora): [max_batch_tokens * ZI_MAX_LORA] */
    const struct zi_lora **lora_ptr;
    float *lora_sc;
};

/* The slot of an assigned context. */
static inline gseq *zi_gen_seq_of(zi_generator *g, const zi_text_context *c) {
    int64_t slot = -1;
    zi_text_context_cache_seq_id(c, &slot, NULL);
    return &g->seqs[slot];
}

/* Is context c's decoding constrained by a grammar (a JSON schema, a
 * grammar or a regex compiled to one)? */
static inline int zi_gen_constrained(const zi_generator *g, const zi_text_context *c) {
    return zi_text_context_constrained(c) && g->gvocab;
}

/* Structured output (generator_constraint.c): the masks of constrained
 * context c's rows this step, into q->masks: row 0 the tokens that keep
 * its completion a prefix of its grammar's; then, for each of the n_draft
 * drafts in turn, while the draft is in the mask of the row before it,
 * the mask after it (row j + 1: the grammar fed drafts 0..j, the budget
 * one token less). Stops at the first draft the grammar refuses (it can
 * never be accepted) and after an end-of-sequence draft. Returns the
 * drafts kept (0..n_draft), or -1 with err set when memory runs out. The
 * grammar state is left after the kept drafts: the next step's catch-up
 * sees by the token hash whether they were accepted, and starts over from
 * the verified tokens when not. */
int zi_gen_grammar_masks(zi_generator *g, const zi_text_context *c, const int32_t *draft,
                         int n_draft, zi_error *err);

#endif
