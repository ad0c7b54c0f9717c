/*
 * vision_config.h - what a projector file (llama.cpp's `--mmproj`, GGUF
 * architecture "clip") says about its image tower: the kind of projector,
 * the tile and patch sizes, the widths, the normalization. Read from the
 * header alone, so that a process that only prepares images (the
 * tokenizer process) needs no backend; model_worker/vision.h loads the
 * tower itself.
 */
#ifndef ZI_VISION_CONFIG_H
#define ZI_VISION_CONFIG_H

#include "gguf.h"
#include "zi_error.h"

typedef enum zi_vision_kind {
    ZI_VISION_GEMMA3 = 1,
    ZI_VISION_IDEFICS3 = 2,
} zi_vision_kind;

/* What the file says, checked at load. */
typedef struct zi_vision_config {
    zi_vision_kind kind;
    int image_size;   /* clip.vision.image_size: a tile's side in pixels */
    int patch_size;   /* clip.vision.patch_size */
    int n_embd;       /* clip.vision.embedding_length */
    int n_ff;         /* clip.vision.feed_forward_length */
    int n_layers;     /* clip.vision.block_count */
    int n_heads;      /* clip.vision.attention.head_count */
    float eps;        /* clip.vision.attention.layer_norm_epsilon */
    int n_merge;      /* gemma3: pooling side (default 4); idefics3: shuffle factor */
    int lm_dim;       /* the projector's output: the text model's embedding length */
    float mean[3], std[3]; /* clip.vision.image_mean / image_std */
    int preproc_size; /* idefics3: clip.vision.preproc_image_size (longest edge), else 0 */
    int n_patches;    /* (image_size / patch_size)^2 */
    int n_tokens;     /* soft tokens per tile */
} zi_vision_config;

/* The settings of the projector file g, checked (the key named on a
 * refusal: not a clip vision projector, an unsupported projector type or
 * activation, sizes out of range or inconsistent). lm_dim > 0 is the text
 * model's embedding length, which the projector's output must equal. */
int zi_vision_read_config(const zi_gguf *g, int lm_dim, zi_vision_config *c, zi_error *err);

/* The same from the file at path (opened and closed here). */
int zi_vision_config_load(const char *path, int lm_dim, zi_vision_config *c, zi_error *err);

#endif
