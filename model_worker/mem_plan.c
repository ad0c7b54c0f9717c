/*
 * mem_plan.c - see mem_plan.h.
 */
#include "mem_plan.h"

#include <stdio.h>
#include <string.h>

#include "cpu_backend.h"
#include "state_ckpt.h"

void zi_mem_model_of(const zi_model *m, int max_batch_tokens, int max_logit_rows,
                     zi_mem_model *out) {
    out->weight_bytes = zi_model_weight_bytes(m);
    out->kv_bytes_per_token = zi_model_kv_bytes_per_token(m);
    out->work_bytes =
        zi_model_config_work_bytes(zi_model_get_config(m), max_batch_tokens, max_logit_rows);
    out->state_bytes_per_slot = zi_model_state_bytes_per_slot(m);
    out->state_ckpts_per_slot = ZI_STATE_CKPT_PER_SLOT;
}

/* The bytes backend be holds for tensor t once loaded: the CPU backend's
 * repacked layout where it repacks a matrix (its own decision; a 3-D
 * tensor of experts is prepared as one matrix of ne[1] * ne[2] rows, as
 * moe.c's load_experts does), anything else at the file's size. */
static uint64_t held_bytes(const zi_backend *be, const zi_gguf_tensor *t) {
    if (strcmp(be->ops->name, "cpu") || (t->n_dims != 2 && t->n_dims != 3)) return t->nbytes;
    return zi_cpu_backend_held_bytes(be, (int)t->type, t->ne[1] * t->ne[2], t->ne[0], t->nbytes);
}

int zi_mem_model_of_file(const zi_gguf *g, const zi_backend *be, int max_batch_tokens,
                         int max_logit_rows, zi_model_config *cfg, zi_mem_model *out,
                         zi_error *err) {
    int rc = zi_model_read_config(g, cfg, err);
    if (rc) return rc;
    uint64_t weights = 0, n = zi_gguf_tensor_count(g);
    for (uint64_t i = 0; i < n; i++) {
        const zi_gguf_tensor *t = zi_gguf_tensor_at(g, i);
        if (t->size_unknown)
            return zi_error_set(err, ZI_EUNSUPPORTED, "tensor '%.*s': its type's size is unknown",
                                (int)(t->name.len > 128 ? 128 : t->name.len), t->name.ptr);
        if (__builtin_add_overflow(weights, held_bytes(be, t), &weights))
            return zi_error_set(err, ZI_ERANGE, "the tensors' byte count overflows");
    }
    /* The output rows (the logits' width): the embedding's rows, as the
     * model takes them when it loads. */
    const zi_gguf_tensor *emb = zi_gguf_find_tensor(g, "token_embd.weight");
    if (emb && emb->n_dims >= 2 && emb->ne[1] > 0 && emb->ne[1] <= INT32_MAX)
        cfg->n_vocab = (int)emb->ne[1];
    out->weight_bytes = weights;
    out->kv_bytes_per_token = zi_model_config_kv_bytes_per_token(cfg, be);
    out->work_bytes = zi_model_config_work_bytes(cfg, max_batch_tokens, max_logit_rows);
    out->state_bytes_per_slot = zi_model_config_state_bytes_per_slot(cfg);
    out->state_ckpts_per_slot = ZI_STATE_CKPT_PER_SLOT;
    return ZI_OK;
}

int zi_mem_plan_make(const zi_mem_model *model, const zi_mem_model *draft, int slots, int ctx,
                     int block_size, zi_mem_plan *out, zi_error *err) {
    memset(out, 0, sizeof *out);
    if (slots < 1 || ctx < 1 || block_size < 1)
        return zi_error_set(err, ZI_EINVAL,
                            "memory plan: %d slots, %d positions, blocks of %d (each must be >= 1)",
                            slots, ctx, block_size);
    out->slots = slots, out->ctx = ctx, out->block_size = block_size;
    /* Each sequence takes whole blocks, as the generator allocates them. */
    uint64_t per_seq =
        ((uint64_t)ctx + (uint64_t)block_size - 1) / (uint64_t)block_size * (uint64_t)block_size;
    uint64_t tokens = per_seq * (uint64_t)slots, kv = 0, t = 0;
    uint64_t states = 0;
    int of = __builtin_mul_overflow(tokens, model->kv_bytes_per_token, &kv);
    /* a hybrid's state slots: each sequence's, and its checkpoints' (with
     * the prefix cache only) */
    of |= __builtin_mul_overflow((uint64_t)slots * (1 + (uint64_t)model->state_ckpts_per_slot),
                                 model->state_bytes_per_slot, &states);
    of |= __builtin_add_overflow(kv, states, &kv);
    uint64_t weights = model->weight_bytes, work = model->work_bytes,
             per_tok = model->kv_bytes_per_token;
    if (draft) {
        /* The draft model's cache has a block per slot more than the
         * model's, for the drafts (generator.c). */
        uint64_t dtok = tokens + (uint64_t)slots * (uint64_t)block_size, dkv = 0;
        of |= __builtin_mul_overflow(dtok, draft->kv_bytes_per_token, &dkv);
        of |= __builtin_add_overflow(kv, dkv, &kv);
        of |= __builtin_add_overflow(weights, draft->weight_bytes, &weights);
        of |= __builtin_add_overflow(work, draft->work_bytes, &work);
        of |= __builtin_add_overflow(per_tok, draft->kv_bytes_per_token, &per_tok);
    }
    of |= __builtin_add_overflow(weights, kv, &t);
    of |= __builtin_add_overflow(t, work, &t);
    if (of)
        return zi_error_set(err, ZI_ERANGE,
                            "memory plan: %d slots x %d positions of KV cache overflow a byte "
                            "count",
                            slots, ctx);
    out->kv_tokens = tokens;
    out->weight_bytes = weights;
    out->kv_bytes_per_token = per_tok;
    out->kv_bytes = kv;
    out->work_bytes = work;
    out->total_bytes = t;
    return ZI_OK;
}

uint64_t zi_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    uint64_t avail = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            avail = kb > UINT64_MAX / 1024 ? UINT64_MAX : (uint64_t)kb * 1024u;
            break;
        }
    }
    fclose(f);
    return avail;
}

uint64_t zi_mem_usable(uint64_t available) {
    return available / 100 * ZI_MEM_SHARE_PCT + available % 100 * ZI_MEM_SHARE_PCT / 100;
}

static double mib(uint64_t b) {
    return (double)b / 1048576.0;
}

int zi_mem_plan_check(const zi_mem_plan *p, int workers, uint64_t available, zi_error *err) {
    if (available == 0) return ZI_OK;
    if (workers < 1) workers = 1;
    uint64_t usable = zi_mem_usable(available), need = 0;
    int of = __builtin_mul_overflow(p->total_bytes, (uint64_t)workers, &need);
    if (!of && need <= usable) return ZI_OK;
    char all[96] = "";
    if (workers > 1)
        snprintf(all, sizeof all, " per worker, x %d workers = %.1f MiB", workers,
                 of ? mib(UINT64_MAX) : mib(need));
    return zi_error_set(
        err, ZI_ENOMEM,
        "the model and its KV cache do not fit in memory: weights %.1f MiB, KV cache %llu bytes "
        "per token x %d slots x %d positions = %.1f MiB, working buffers %.1f MiB; needed %.1f "
        "MiB%s, available %.1f MiB (%d%% of MemAvailable %.1f MiB). Lower --ctx-size or "
        "--slots%s, or size the KV cache with --kv-cache-tokens N or --memory-budget B",
        mib(p->weight_bytes), (unsigned long long)p->kv_bytes_per_token, p->slots, p->ctx,
        mib(p->kv_bytes), mib(p->work_bytes), mib(p->total_bytes), all, mib(usable),
        ZI_MEM_SHARE_PCT, mib(available), workers > 1 ? " (or --workers)" : "");
}
