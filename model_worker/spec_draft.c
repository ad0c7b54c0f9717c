/*
 * spec_draft.c - see spec_draft.h.
 *
 * Per slot: its block table in the draft's own pool and the token ids
 * whose K/V the draft cache holds at positions 0..n_fed-1 (the tokens of
 * the sequence up to its last proposal, then the drafts fed after them).
 * A proposal feeds from the first position where that record and the
 * sequence's tokens differ: rejected drafts are overwritten there, as the
 * target's are (attention never reads past a row's own position).
 */
#include "spec_draft.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kv_blocks.h"

typedef struct dslot {
    int32_t *blocks; /* [max_blocks] */
    int32_t n_blocks;
    int32_t *fed; /* [ctx] the token at each position fed */
    int64_t n_fed;
} dslot;

struct zi_spec_draft {
    zi_model *m;
    zi_kv_cache *kv;
    zi_kv_blocks *kb;
    int n_slots, ctx, block_size, max_blocks, max_batch, n_vocab, sample_vocab;
    dslot *slots;
    /* pass buffers: max_batch (>= n_slots) tokens, n_slots tables and rows */
    int32_t *tokens, *pos, *seq, *tables;
    uint8_t *want;
    float *logits;
    int64_t *cursor; /* [n_slots] per request: the next position to feed */
    int *row_req;    /* [n_slots] logits row -> request */
    uint64_t passes, fed_tokens;
};

/* FNV-1a over the token strings, each ended by a 0xff byte (not UTF-8). */
static uint64_t hash_strings(const zi_str *s, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++) {
        for (uint64_t j = 0; j < s[i].len; j++) h = (h ^ (uint8_t)s[i].ptr[j]) * 0x100000001b3ull;
        h = (h ^ 0xffu) * 0x100000001b3ull;
    }
    return h;
}

/* The tokenizer's identity in a file: its model name and its token
 * strings' count and hash (n = 0 when the file has none). */
static int tok_identity(const zi_gguf *g, const char *path, zi_str *model, uint64_t *n,
                        uint64_t *hash, zi_error *err) {
    *n = 0, *hash = 0, model->ptr = "", model->len = 0;
    if (zi_gguf_find_kv(g, "tokenizer.ggml.model") &&
        zi_gguf_get_str(g, "tokenizer.ggml.model", model, err)) {
        zi_error_prefix(err, "%s", path);
        return ZI_EINVAL;
    }
    if (!zi_gguf_find_kv(g, "tokenizer.ggml.tokens")) return ZI_OK;
    zi_str *s = NULL;
    if (zi_gguf_get_str_array(g, "tokenizer.ggml.tokens", &s, n, err)) {
        zi_error_prefix(err, "%s", path);
        return ZI_EINVAL;
    }
    *hash = hash_strings(s, *n);
    free(s);
    return ZI_OK;
}

int zi_spec_draft_check_vocab(const zi_model *target, const char *target_path,
                              const zi_model *draft, const char *draft_path, zi_error *err) {
    int tv = zi_model_get_config(target)->n_vocab, dv = zi_model_get_config(draft)->n_vocab;
    if (tv != dv)
        return zi_error_set(err, ZI_EINVAL,
                            "--draft-model %s has %d vocabulary rows, the model %s %d: a draft "
                            "model needs the same vocabulary",
                            draft_path, dv, target_path, tv);
    zi_str tm, dm;
    uint64_t tn, dn, th, dh;
    if (tok_identity(zi_model_gguf(target), target_path, &tm, &tn, &th, err) ||
        tok_identity(zi_model_gguf(draft), draft_path, &dm, &dn, &dh, err))
        return ZI_EINVAL;
    if (tm.len != dm.len || memcmp(tm.ptr, dm.ptr, tm.len))
        return zi_error_set(err, ZI_EINVAL,
                            "--draft-model %s has tokenizer.ggml.model \"%.*s\", the model %s "
                            "\"%.*s\": a draft model needs the same vocabulary",
                            draft_path, (int)dm.len, dm.ptr, target_path, (int)tm.len, tm.ptr);
    if (tn != dn || th != dh)
        return zi_error_set(err, ZI_EINVAL,
                            "--draft-model %s: its tokenizer.ggml.tokens (%llu strings) differ "
                            "from those of the model %s (%llu): a draft model needs the same "
                            "vocabulary",
                            draft_path, (unsigned long long)dn, target_path,
                            (unsigned long long)tn);
    return ZI_OK;
}

int zi_spec_draft_create(zi_model *m, int n_slots, int ctx, int n_blocks, int block_size,
                         int max_batch_tokens, int sample_vocab, zi_spec_draft **out,
                         zi_error *err) {
    int n_vocab = zi_model_get_config(m)->n_vocab;
    if (n_slots < 1 || ctx < 2 || block_size < 1 ||
        n_blocks < (ctx + block_size - 1) / block_size || max_batch_tokens < 1 ||
        sample_vocab < 1 || sample_vocab > n_vocab)
        return zi_error_set(err, ZI_EINVAL,
                            "draft model: n_slots %d, ctx %d, %d blocks of %d, max_batch_tokens "
                            "%d, sample_vocab %d out of range",
                            n_slots, ctx, n_blocks, block_size, max_batch_tokens, sample_vocab);
    zi_spec_draft *d = calloc(1, sizeof *d);
    if (!d) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    d->m = m;
    d->n_slots = n_slots, d->ctx = ctx, d->block_size = block_size;
    d->max_blocks = (ctx + block_size - 1) / block_size;
    d->max_batch = max_batch_tokens > n_slots ? max_batch_tokens : n_slots;
    d->n_vocab = n_vocab, d->sample_vocab = sample_vocab;
    int rc = zi_kv_cache_create_paged(m, n_blocks, block_size, ctx, &d->kv, err);
    if (!rc) rc = zi_kv_blocks_create(n_blocks, block_size, &d->kb, err);
    if (rc) {
        zi_error_prefix(err, "draft model");
        zi_spec_draft_free(d);
        return rc;
    }
    size_t S = (size_t)n_slots, B = (size_t)d->max_batch;
    d->slots = calloc(S, sizeof *d->slots);
    d->tokens = malloc(B * sizeof *d->tokens);
    d->pos = malloc(B * sizeof *d->pos);
    d->seq = malloc(B * sizeof *d->seq);
    d->want = malloc(B);
    d->tables = malloc(S * (size_t)d->max_blocks * sizeof *d->tables);
    d->logits = malloc(S * (size_t)n_vocab * sizeof *d->logits);
    d->cursor = malloc(S * sizeof *d->cursor);
    d->row_req = malloc(S * sizeof *d->row_req);
    int ok = d->slots && d->tokens && d->pos && d->seq && d->want && d->tables && d->logits &&
             d->cursor && d->row_req;
    for (size_t i = 0; ok && i < S; i++)
        ok = (d->slots[i].blocks = malloc((size_t)d->max_blocks * sizeof(int32_t))) &&
             (d->slots[i].fed = malloc((size_t)ctx * sizeof(int32_t)));
    if (!ok) {
        zi_spec_draft_free(d);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for a draft model of %d slots", n_slots);
    }
    *out = d;
    return ZI_OK;
}

void zi_spec_draft_free(zi_spec_draft *d) {
    if (!d) return;
    zi_kv_cache_free(d->kv);
    zi_kv_blocks_free(d->kb);
    if (d->slots)
        for (int i = 0; i < d->n_slots; i++) {
            free(d->slots[i].blocks);
            free(d->slots[i].fed);
        }
    free(d->slots);
    free(d->tokens);
    free(d->pos);
    free(d->seq);
    free(d->want);
    free(d->tables);
    free(d->logits);
    free(d->cursor);
    free(d->row_req);
    free(d);
}

void zi_spec_draft_reset(zi_spec_draft *d, int slot) {
    assert(slot >= 0 && slot < d->n_slots);
    dslot *s = &d->slots[slot];
    for (int32_t i = s->n_blocks; i-- > 0;) zi_kv_blocks_release(d->kb, s->blocks[i]);
    s->n_blocks = 0;
    s->n_fed = 0;
}

int zi_spec_draft_reserve(zi_spec_draft *d, int slot, int64_t n_tokens, int k) {
    assert(slot >= 0 && slot < d->n_slots && n_tokens >= 1);
    dslot *s = &d->slots[slot];
    if (k < 1 || n_tokens > d->ctx) return 0;
    if (n_tokens + k - 1 > d->ctx) k = (int)(d->ctx - n_tokens + 1);
    int64_t upto = n_tokens + k - 1; /* positions fed: the sequence, then k - 1 drafts */
    while ((int64_t)s->n_blocks * d->block_size < upto) {
        int32_t id = zi_kv_blocks_alloc(d->kb);
        if (id < 0) break;
        s->blocks[s->n_blocks++] = id;
    }
    int64_t have = (int64_t)s->n_blocks * d->block_size;
    if (have < upto) k = have < n_tokens ? 0 : (int)(have - n_tokens + 1);
    return k;
}

/* The highest-scoring id among those that can be drawn (the lowest on a
 * tie, as the sampler's greedy draw). */
static int32_t argmax(const float *row, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

/* One pass over the d->tokens.. prepared for n_tok tokens of n requests. */
static int run_pass(zi_spec_draft *d, int n_tok, int n, zi_error *err) {
    zi_batch b = {.n_tokens = n_tok,
                  .tokens = d->tokens,
                  .pos = d->pos,
                  .seq = d->seq,
                  .want_logits = d->want,
                  .block_tables = d->tables,
                  .n_table_rows = n,
                  .table_stride = d->max_blocks};
    d->passes++;
    d->fed_tokens += (uint64_t)n_tok;
    int rc = zi_model_forward(d->m, d->kv, &b, d->logits, err);
    if (rc) zi_error_prefix(err, "draft model");
    return rc;
}

int zi_spec_draft_propose(zi_spec_draft *d, const zi_spec_draft_req *reqs, int n, zi_error *err) {
    assert(n >= 0 && n <= d->n_slots);
    int max_k = 0;
    for (int r = 0; r < n; r++) {
        const zi_spec_draft_req *q = &reqs[r];
        dslot *s = &d->slots[q->slot];
        assert(q->k >= 1 && q->n_tokens >= 1 &&
               q->n_tokens + q->k - 1 <= (int64_t)s->n_blocks * d->block_size);
        /* the first position whose K/V is not that of the sequence's token;
         * the last token is fed again in any case (its logits) */
        int64_t same = 0, lim = s->n_fed < q->n_tokens - 1 ? s->n_fed : q->n_tokens - 1;
        while (same < lim && s->fed[same] == q->tokens[same]) same++;
        d->cursor[r] = same;
        memcpy(d->tables + (size_t)r * d->max_blocks, s->blocks,
               (size_t)s->n_blocks * sizeof *s->blocks);
        if (q->k > max_k) max_k = q->k;
    }
    /* Catch-up: every request's unfed tokens, in passes of max_batch
     * tokens; a request's last token gives its first draft. */
    for (int left = n; left > 0;) {
        int T = 0, rows = 0;
        for (int r = 0; r < n && T < d->max_batch; r++) {
            const zi_spec_draft_req *q = &reqs[r];
            if (d->cursor[r] >= q->n_tokens) continue;
            int64_t take = q->n_tokens - d->cursor[r];
            if (take > d->max_batch - T) take = d->max_batch - T;
            for (int64_t j = 0; j < take; j++, T++) {
                d->tokens[T] = q->tokens[d->cursor[r] + j];
                d->pos[T] = (int32_t)(d->cursor[r] + j);
                d->seq[T] = r;
                d->want[T] = d->cursor[r] + j == q->n_tokens - 1;
                if (d->want[T]) d->row_req[rows++] = r;
            }
            d->cursor[r] += take;
        }
        int rc = run_pass(d, T, n, err);
        if (rc) return rc;
        for (int i = 0; i < rows; i++) {
            const zi_spec_draft_req *q = &reqs[d->row_req[i]];
            q->out[0] = argmax(d->logits + (size_t)i * d->n_vocab, d->sample_vocab);
            left--;
        }
    }
    /* Then one token per pass for every request that wants more. */
    for (int j = 1; j < max_k; j++) {
        int T = 0;
        for (int r = 0; r < n; r++) {
            const zi_spec_draft_req *q = &reqs[r];
            if (q->k <= j) continue;
            d->tokens[T] = q->out[j - 1];
            d->pos[T] = (int32_t)(q->n_tokens + j - 1);
            d->seq[T] = r;
            d->want[T] = 1;
            d->row_req[T++] = r;
        }
        int rc = run_pass(d, T, n, err);
        if (rc) return rc;
        for (int i = 0; i < T; i++)
            reqs[d->row_req[i]].out[j] =
                argmax(d->logits + (size_t)i * d->n_vocab, d->sample_vocab);
    }
    /* What the cache now holds: the sequence, then the drafts fed. */
    for (int r = 0; r < n; r++) {
        const zi_spec_draft_req *q = &reqs[r];
        dslot *s = &d->slots[q->slot];
        memcpy(s->fed, q->tokens, (size_t)q->n_tokens * sizeof *s->fed);
        memcpy(s->fed + q->n_tokens, q->out, (size_t)(q->k - 1) * sizeof *s->fed);
        s->n_fed = q->n_tokens + q->k - 1;
    }
    return ZI_OK;
}

void zi_spec_draft_counts(const zi_spec_draft *d, uint64_t *passes, uint64_t *tokens) {
    *passes = d->passes;
    *tokens = d->fed_tokens;
}
