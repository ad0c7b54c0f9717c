/*
 * lora.h - LoRA adapters, read from llama.cpp's GGUF adapter format and
 * checked against the loaded base model.
 *
 * The format (llama.cpp's convert_lora_to_gguf.py): general.type
 * "adapter", adapter.type "lora", general.architecture the base model's,
 * adapter.lora.alpha, and for each adapted weight W ([rows][cols], GGUF ne
 * [cols, rows]) two tensors, "<W's name>.lora_a" (ne [cols, rank]: A,
 * rank rows of cols) and "<W's name>.lora_b" (ne [rank, rows]: B, rows
 * rows of rank). The product W x becomes W x + s B (A x) with s = the
 * user's scale * alpha / rank (alpha 0: the user's scale), as llama.cpp's
 * llama_adapter_lora_weight::get_scale.
 *
 * Adapted weights: a decoder layer's attn_q, attn_k, attn_v, attn_output,
 * ffn_gate, ffn_up and ffn_down; A and B are float32 or float16 in the
 * file and in backend memory alike (B transposed). The model (model.h zi_batch.lora)
 * runs each token of a pass with its own adapter, or none.
 *
 * zi_lora_load never aborts on a bad file: every refusal is one line that
 * names the file and the key or tensor at fault.
 */
#ifndef ZI_LORA_H
#define ZI_LORA_H

#include "model.h"
#include "zi_error.h"

/* The weights of a layer an adapter may adapt. */
typedef enum zi_lora_target {
    ZI_LORA_Q,
    ZI_LORA_K,
    ZI_LORA_V,
    ZI_LORA_O,
    ZI_LORA_GATE,
    ZI_LORA_UP,
    ZI_LORA_DOWN,
    ZI_LORA_N_TARGETS
} zi_lora_target;

/* Adapters one process loads at most (--lora, repeated). */
#define ZI_LORA_MAX_ADAPTERS 64
/* The longest adapter name, its NUL included. */
#define ZI_LORA_NAME_MAX 64

/* A --lora value: NAME=FILE[:SCALE] (SCALE a finite number, default 1;
 * a FILE holding ':' takes its last part as the scale only when that part
 * is a number). */
typedef struct zi_lora_spec {
    char name[ZI_LORA_NAME_MAX];
    char path[4096];
    float scale;
} zi_lora_spec;

/* Parses s into *out; ZI_EINVAL naming what is wrong ("--lora 'x': ..."). */
int zi_lora_spec_parse(const char *s, zi_lora_spec *out, zi_error *err);

typedef struct zi_lora zi_lora;

/* Reads the adapter at spec->path and checks it against model m (its
 * architecture; each adapted tensor exists in m with the shape A and B
 * imply; one rank throughout; float32 or float16), then copies A and B
 * to m's backend. ZI_EUNSUPPORTED on a backend without the lora op or for
 * an encoder. m must outlive the adapter. */
int zi_lora_load(zi_model *m, const zi_lora_spec *spec, zi_lora **out, zi_error *err);
void zi_lora_free(zi_lora *l);

const char *zi_lora_name(const zi_lora *l);
float zi_lora_default_scale(const zi_lora *l); /* the spec's SCALE */
int zi_lora_rank(const zi_lora *l);
float zi_lora_alpha(const zi_lora *l);
int zi_lora_n_weights(const zi_lora *l); /* weights it adapts */
uint64_t zi_lora_bytes(const zi_lora *l); /* its A and B in the backend's memory */
const zi_model *zi_lora_model(const zi_lora *l);
/* The key the prefix cache seeds an adapter's sequences with beside its id
 * (generator.h): 0 after load; a worker that loads adapters while serving
 * gives each load its own, so blocks cached under an unloaded adapter are
 * never reused under the one loaded in its place. */
uint64_t zi_lora_key(const zi_lora *l);
void zi_lora_set_key(zi_lora *l, uint64_t key);
/* The factor a product's term is multiplied by for a user's scale:
 * user_scale * alpha / rank (alpha 0: user_scale). */
float zi_lora_scale(const zi_lora *l, float user_scale);
/* Layer `layer`'s term for target t: 1 with *a (A, [rank][cols]), *bt
 * (B transposed, [rank][rows]) and *type (ZI_TYPE_F32 or ZI_TYPE_F16, as
 * in the file) set, backend memory, as the backend's lora op takes them
 * (backend.h zi_lora_row); 0 when the adapter leaves that weight alone. */
int zi_lora_term(const zi_lora *l, int layer, zi_lora_target t, const void **a, const void **bt,
                 int *type);

#endif
