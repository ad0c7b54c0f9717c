/*
 * info.c - `zinfer info`: describes a GGUF file from its header alone
 * (metadata and tensor table); no weight is read or handed to a backend.
 *
 * The GGUF reader (common/gguf.h) refuses at open a file holding a tensor
 * type zinfer cannot run, and gives back nothing else. So that such a file
 * is still described, info then reads it in two parts (header_only):
 *  - the metadata through the reader itself, over a private copy-on-write
 *    mapping of the file whose header says 0 tensors (only the first page
 *    is copied), so every key is validated as for any open;
 *  - the tensor table with its own walk (scan_tensors), which makes the
 *    reader's checks on every field and data range, with the block sizes
 *    of every type ggml defines (ggml_blocks), run or not.
 * A reader option that keeps tensors of types it cannot run (flagged, so
 * that zi_model_load still refuses them) would make this second path go.
 *
 * The memory estimate counts the weights (all tensor bytes) and a KV cache
 * holding every slot's full context at the defaults of `zinfer serve` and
 * zinfer-worker, sized by the model's own formula
 * (zi_model_config_kv_bytes_per_token, which zi_model_kv_bytes_per_token
 * is) for the CPU backend.
 */
#include "info.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "cpu_backend.h"
#include "gguf.h"
#include "model.h"
#include "utf8.h"
#include "zi_error.h"

/* `zinfer serve`'s and zinfer-worker's defaults (cli/serve.c,
 * model_worker/worker_main.c): --slots, and --ctx-size, which the worker
 * lowers to the model's trained length. */
#define INFO_SLOTS 8
#define INFO_CTX 4096
/* Distinct tensor types in one file: real files hold 2..6. */
#define INFO_MAX_TYPES 64

static const char USAGE[] =
    "usage: zinfer info [--model PATH] [--json]\n"
    "  Describes a GGUF file from its header, without loading the weights: the\n"
    "  architecture, parameter count (tensor elements), tensor types (tensors and bytes\n"
    "  each, naming the types zinfer cannot run yet), the tokenizer, whether a chat\n"
    "  template is present, the trained context length, and the memory a worker needs:\n"
    "  the weights plus a KV cache holding every slot's full context at the defaults of\n"
    "  zinfer serve (--slots 8, --ctx-size 4096 or the trained length if shorter) on\n"
    "  the CPU backend (activations and logits not counted). A file zinfer cannot run\n"
    "  is still described, with the reason. Exit 0 when described, 1 when the file\n"
    "  cannot be read (one line on stderr), 2 on bad usage.\n"
    "  --model PATH   the GGUF file (default: $ZINFER_MODEL, else\n"
    "                 $ZINFER_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
    "  --json         one JSON object on stdout instead of text. Keys (null where the\n"
    "                 file does not say or the value cannot be computed):\n"
    "    file, file_bytes, gguf_version, architecture, name,\n"
    "    hyperparameters {layers, embedding, feed_forward, heads, kv_heads, head_dim}\n"
    "      (null when zinfer cannot read them: see load_error),\n"
    "    parameters, tensors, tensor_bytes,\n"
    "    tensor_types {TYPE: {tensors, elements, bytes, runnable}} (TYPE as ggml names\n"
    "      it, e.g. Q4_1, or \"type N\" for a number ggml did not define),\n"
    "    unsupported_types [TYPE...], context_length, chat_template (true/false),\n"
    "    chat_template_bytes,\n"
    "    tokenizer {model, vocab_size, pre, bos_token_id, bos_token, eos_token_id,\n"
    "      eos_token},\n"
    "    memory {backend, slots, ctx_size, kv_bytes_per_token, kv_bytes_per_token_from,\n"
    "      kv_bytes, weights_bytes, total_bytes},\n"
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
} info;

/* ---- ggml's tensor types -------------------------------------------------------------- */

/* Elements and bytes per block of every type ggml defines (ggml.c's
 * type_traits; gguf-py's GGML_QUANT_SIZES), for the types the reader does
 * not know: their sizes are facts of the format even where zinfer has no
 * kernel. */
static const struct {
    int type;
    unsigned elems, bytes;
} ggml_blocks[] = {
    {0, 1, 4},      {1, 1, 2},      {2, 32, 18},   {3, 32, 20},    {6, 32, 22},    {7, 32, 24},
    {8, 32, 34},    {9, 32, 40},    {10, 256, 84}, {11, 256, 110}, {12, 256, 144}, {13, 256, 176},
    {14, 256, 210}, {15, 256, 292}, {16, 256, 66}, {17, 256, 74},  {18, 256, 98},  {19, 256, 50},
    {20, 32, 18},   {21, 256, 110}, {22, 256, 82}, {23, 256, 136}, {24, 1, 1},     {25, 1, 2},
    {26, 1, 4},     {27, 1, 8},     {28, 1, 8},    {29, 256, 56},  {30, 1, 2},     {34, 256, 54},
    {35, 256, 66},  {39, 32, 17},
};

/* A type zinfer can run is one the reader opens (gguf.h: it accepts
 * exactly the types the kernels implement). */
static int type_runnable(uint32_t t) {
    return t <= INT32_MAX && zi_ggml_type_block_bytes((int)t) != 0;
}

/* Block geometry of type t: the reader's, else ggml's; 0 when unknown. */
static int type_block(uint32_t t, uint64_t *elems, uint64_t *bytes) {
    if (type_runnable(t)) {
        *elems = zi_ggml_type_block_elems((int)t);
        *bytes = zi_ggml_type_block_bytes((int)t);
        return 1;
    }
    for (size_t i = 0; i < sizeof ggml_blocks / sizeof ggml_blocks[0]; i++)
        if ((uint32_t)ggml_blocks[i].type == t) {
            *elems = ggml_blocks[i].elems;
            *bytes = ggml_blocks[i].bytes;
            return 1;
        }
    return 0;
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

/* ---- the tensor table of a file the reader refuses ----------------------------------- */

typedef struct rd {
    const uint8_t *b;
    size_t size, pos;
} rd;

static uint64_t ld_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static int rd_u32(rd *r, uint32_t *v) {
    if (r->size - r->pos < 4) return 0;
    *v = (uint32_t)ld_le(r->b + r->pos, 4);
    r->pos += 4;
    return 1;
}

static int rd_u64(rd *r, uint64_t *v) {
    if (r->size - r->pos < 8) return 0;
    *v = ld_le(r->b + r->pos, 8);
    r->pos += 8;
    return 1;
}

/* A length-prefixed string: its bytes in *s, *len. */
static int rd_str(rd *r, const uint8_t **s, uint64_t *len) {
    if (!rd_u64(r, len) || *len > r->size - r->pos) return 0;
    *s = r->b + r->pos;
    r->pos += (size_t)*len;
    return 1;
}

/* Skips one metadata value of GGUF type t. The reader has validated the
 * metadata already; the bounds are checked again all the same. */
static int skip_value(rd *r, uint32_t t, int depth) {
    static const uint8_t scalar[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (t < 13 && scalar[t]) {
        if (r->size - r->pos < scalar[t]) return 0;
        r->pos += scalar[t];
        return 1;
    }
    if (t == ZI_GGUF_STRING) {
        const uint8_t *s;
        uint64_t len;
        return rd_str(r, &s, &len);
    }
    uint32_t et;
    uint64_t n;
    if (t != ZI_GGUF_ARRAY || depth > 8 || !rd_u32(r, &et) || !rd_u64(r, &n)) return 0;
    if (et < 13 && scalar[et]) {
        if (n > (r->size - r->pos) / scalar[et]) return 0;
        r->pos += (size_t)(n * scalar[et]);
        return 1;
    }
    /* Strings and arrays take at least 8 bytes each: n is bounded by the
     * file, and so is the work. */
    for (uint64_t i = 0; i < n; i++)
        if (!skip_value(r, et, depth + 1)) return 0;
    return 1;
}

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

typedef struct tensor_ref {
    const uint8_t *name; /* into the mapping */
    uint64_t name_len, offset, nbytes;
    int known;
} tensor_ref;

/*
 * Walks the metadata (n_kv entries) and the tensor table of the file in
 * b[0..size) and counts its tensors into in, checking what the reader
 * checks: the table's fields, shapes that fit, rows that are whole blocks,
 * aligned offsets and data inside the file (for every type whose block
 * size ggml defines; a type number it does not define has no known size).
 */
static int scan_tensors(info *in, const uint8_t *b, size_t size, uint64_t n_kv, uint64_t n_tensors,
                        uint32_t alignment, zi_error *err) {
    rd r = {.b = b, .size = size, .pos = 24}; /* magic, version, two counts */
    for (uint64_t i = 0; i < n_kv; i++) {
        const uint8_t *key;
        uint64_t klen;
        uint32_t t;
        if (!rd_str(&r, &key, &klen) || !rd_u32(&r, &t) || !skip_value(&r, t, 0))
            return zi_error_set(err, ZI_EFORMAT, "%s: metadata key #%llu runs past end of file",
                                in->path, (unsigned long long)i);
    }
    /* name length, n_dims, one dim, type, offset: 32 bytes at least */
    if (n_tensors > (size - r.pos) / 32)
        return zi_error_set(err, ZI_EFORMAT,
                            "%s: truncated or corrupt: the header claims %llu tensors, more than "
                            "the %zu bytes after the metadata can describe",
                            in->path, (unsigned long long)n_tensors, size - r.pos);
    tensor_ref *refs = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *refs);
    if (!refs)
        return zi_error_set(err, ZI_ENOMEM, "out of memory for %llu tensors",
                            (unsigned long long)n_tensors);
    int rc = ZI_OK;
    char nm[72];
    for (uint64_t i = 0; !rc && i < n_tensors; i++) {
        const uint8_t *name = NULL;
        uint64_t nlen = 0, ne[ZI_GGUF_MAX_DIMS] = {1, 1, 1, 1}, nelem = 1, rows = 1, eb, bb;
        uint32_t n_dims = 0, type = 0;
        int ok = rd_str(&r, &name, &nlen) && rd_u32(&r, &n_dims);
        show(nm, sizeof nm, name, name ? nlen : 0);
        refs[i].name = name;
        refs[i].name_len = nlen;
        if (ok && (n_dims < 1 || n_dims > ZI_GGUF_MAX_DIMS)) {
            rc =
                zi_error_set(err, ZI_EFORMAT, "%s: tensor #%llu '%s': n_dims is %u, expected 1..%d",
                             in->path, (unsigned long long)i, nm, n_dims, ZI_GGUF_MAX_DIMS);
            break;
        }
        for (uint32_t d = 0; ok && d < n_dims; d++) ok = rd_u64(&r, &ne[d]);
        ok = ok && rd_u32(&r, &type) && rd_u64(&r, &refs[i].offset);
        if (!ok) {
            rc = zi_error_set(err, ZI_EFORMAT, "%s: tensor #%llu '%s': table runs past end of file",
                              in->path, (unsigned long long)i, nm);
            break;
        }
        int overflow = 0;
        for (uint32_t d = 0; d < n_dims; d++) {
            overflow |= ne[d] > INT64_MAX || __builtin_mul_overflow(nelem, ne[d], &nelem);
            if (d > 0) overflow |= __builtin_mul_overflow(rows, ne[d], &rows);
        }
        refs[i].known = type_block(type, &eb, &bb);
        if (!overflow && refs[i].known) {
            if (ne[0] % eb != 0) {
                char tn[32];
                type_name(type, tn, sizeof tn);
                rc = zi_error_set(err, ZI_EFORMAT,
                                  "%s: tensor '%s': ne[0] = %llu is not a multiple of %s's block "
                                  "size %llu",
                                  in->path, nm, (unsigned long long)ne[0], tn,
                                  (unsigned long long)eb);
                break;
            }
            overflow |= __builtin_mul_overflow(ne[0] / eb, bb, &refs[i].nbytes) ||
                        __builtin_mul_overflow(refs[i].nbytes, rows, &refs[i].nbytes);
        }
        if (overflow || nelem > INT64_MAX) {
            rc = zi_error_set(err, ZI_EFORMAT, "%s: tensor '%s': element or byte count overflows",
                              in->path, nm);
            break;
        }
        rc = add_tensor(in, type, nelem, refs[i].nbytes, refs[i].known, err);
    }
    /* The data section starts at the next multiple of the alignment. */
    uint64_t data = ((uint64_t)r.pos + alignment - 1) / alignment * alignment;
    for (uint64_t i = 0; !rc && i < n_tensors; i++) {
        const tensor_ref *t = &refs[i];
        show(nm, sizeof nm, t->name, t->name_len);
        if (t->offset % alignment != 0)
            rc = zi_error_set(err, ZI_EFORMAT,
                              "%s: tensor '%s': offset %llu is not a multiple of the alignment %u",
                              in->path, nm, (unsigned long long)t->offset, alignment);
        else if (t->known && (t->offset > size || data > size - t->offset ||
                              t->nbytes > size - data - t->offset))
            rc = zi_error_set(err, ZI_EFORMAT,
                              "%s: tensor '%s': data [offset %llu, %llu bytes] extends past end "
                              "of file (size %zu)",
                              in->path, nm, (unsigned long long)(data + t->offset),
                              (unsigned long long)t->nbytes, size);
    }
    free(refs);
    return rc;
}

/* The part of a refused file that can be read (see the top of the file):
 * *meta over *map, a private mapping of *map_size bytes the caller unmaps
 * after closing *meta. *meta_failed tells a failure of the reader on the
 * metadata (the caller then has the reader's first word) from one of the
 * tensor table. */
static int header_only(info *in, zi_gguf **meta, void **map, size_t *map_size, int *meta_failed,
                       zi_error *err) {
    int fd = open(in->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zi_error_set(err, ZI_EIO, "cannot open %s: %s", in->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 24) {
        close(fd);
        *meta_failed = 1;
        return zi_error_set(err, ZI_EFORMAT, "%s: no room for a GGUF header", in->path);
    }
    size_t size = (size_t)st.st_size;
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return zi_error_set(err, ZI_EIO, "cannot map %s: %s", in->path, strerror(errno));
    uint8_t *b = m;
    uint64_t n_tensors = ld_le(b + 8, 8), n_kv = ld_le(b + 16, 8);
    memset(b + 8, 0, 8); /* tensor count 0: the reader reads the metadata only */
    int rc = zi_gguf_open_memory(b, size, meta, err);
    if (rc) {
        *meta_failed = 1;
    } else {
        in->version = zi_gguf_version(*meta);
        in->n_tensors = n_tensors;
        rc = scan_tensors(in, b, size, n_kv, n_tensors, zi_gguf_alignment(*meta), err);
        if (rc) {
            zi_gguf_close(*meta);
            *meta = NULL;
        }
    }
    if (rc) {
        munmap(m, size);
        return rc;
    }
    *map = m;
    *map_size = size;
    return ZI_OK;
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
    if (rc) return rc;
    in->kv_per_token = zi_model_config_kv_bytes_per_token(&in->cfg, be);
    in->kv_k_bytes = be->kv_k_bytes;
    in->kv_v_bytes = be->kv_v_bytes;
    in->kv_k_row_extra = be->kv_k_row_extra;
    zi_backend_free(be);
    in->ctx = in->cfg.ctx_train < INFO_CTX ? in->cfg.ctx_train : INFO_CTX;
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
    uint64_t kv = in->kv_per_token * (uint64_t)in->ctx * INFO_SLOTS;
    json_object_set_new(mem, "backend", json_string("cpu"));
    json_object_set_new(mem, "slots", json_integer(INFO_SLOTS));
    json_object_set_new(mem, "ctx_size", jint(in->have_cfg, in->ctx));
    json_object_set_new(mem, "kv_bytes_per_token", jint(in->have_cfg, (int64_t)in->kv_per_token));
    json_object_set_new(mem, "kv_bytes_per_token_from",
                        in->have_cfg ? json_string("metadata") : json_null());
    json_object_set_new(mem, "kv_bytes", jint(in->have_cfg, (int64_t)kv));
    json_object_set_new(mem, "weights_bytes", jint(in->bytes_known, (int64_t)in->bytes));
    json_object_set_new(mem, "total_bytes",
                        jint(in->have_cfg && in->bytes_known, (int64_t)(in->bytes + kv)));
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
    if (in->have_cfg && in->bytes_known) {
        uint64_t kv = in->kv_per_token * (uint64_t)in->ctx * INFO_SLOTS;
        printf(ROW "%.1f MiB (%llu bytes): %.1f MiB weights + %.1f MiB KV cache\n", "worker memory",
               mib(in->bytes + kv), (unsigned long long)(in->bytes + kv), mib(in->bytes), mib(kv));
        printf(ROW "KV cache: %d slots x %d positions x %llu bytes per token (CPU backend:\n", "",
               INFO_SLOTS, in->ctx, (unsigned long long)in->kv_per_token);
        printf(ROW "K %d + V %d bytes a value, %d bytes a K row more; from the metadata by the\n",
               "", in->kv_k_bytes, in->kv_v_bytes, in->kv_k_row_extra);
        printf(ROW "model's own formula, zi_model_kv_bytes_per_token); activations not counted\n",
               "");
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
    int json = 0;
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
            snprintf(path, sizeof path, "%s", argv[++i]);
        } else {
            char msg[256];
            snprintf(msg, sizeof msg, "unknown option '%.200s'", a);
            return usage_error(msg);
        }
    }
    info in = {.path = path, .bytes_known = 1};
    zi_error err = {0}, why = {0};
    zi_gguf *g = NULL;
    void *map = NULL;
    size_t map_size = 0;
    int rc = zi_gguf_open(path, &g, &why);
    if (rc == ZI_EUNSUPPORTED) {
        /* A version or tensor type zinfer does not read: describe what the
         * header says, if it can be read; else the reader's reason. */
        snprintf(in.load_error, sizeof in.load_error, "%s", why.msg);
        int meta_failed = 0;
        rc = header_only(&in, &g, &map, &map_size, &meta_failed, &err);
        if (rc && meta_failed) err = why;
    } else if (rc == ZI_OK) {
        in.version = zi_gguf_version(g);
        in.n_tensors = zi_gguf_tensor_count(g);
        for (uint64_t i = 0; !rc && i < in.n_tensors; i++) {
            const zi_gguf_tensor *t = zi_gguf_tensor_at(g, i);
            uint64_t n = 1;
            for (uint32_t d = 0; d < t->n_dims; d++) n *= (uint64_t)t->ne[d]; /* fits: reader */
            rc = add_tensor(&in, (uint32_t)t->type, n, t->nbytes, 1, &err);
        }
    } else {
        err = why;
    }
    if (!g) {
        fprintf(stderr, "zinfer: %s\n", err.msg);
        return 1;
    }
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
    if (map) munmap(map, map_size);
    if (rc) fprintf(stderr, "zinfer: %s\n", err.msg);
    return rc ? 1 : 0;
}
