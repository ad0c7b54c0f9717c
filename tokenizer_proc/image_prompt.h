/*
 * image_prompt.h - a prompt with images as token ids: the text split at
 * the media markers (ZI_MEDIA_MARKER, "<__media__>", one per image), each
 * image prepared for the projector (image_prep.h) and laid out in its
 * place as llama.cpp's mtmd_tokenize does: its marker texts tokenized,
 * its tiles as runs of soft-token positions.
 *
 * Tokenization follows mtmd: every text piece is encoded on its own
 * without special tokens (a piece of the prompt with the caller's
 * parse_special, the layout's texts with special tokens parsed); with
 * add_special, the vocabulary's BOS goes first and its EOS last where the
 * file asks for them. A soft-token position holds a key, not a vocabulary
 * id: zi_ctx_image_key(hash, k) (protocol/types.h) for the k-th soft token
 * of an image whose pixel values hash to `hash` (zi_ctx_image_hash), so
 * that a prefix cache (which hashes ids) reuses a repeated image's
 * positions and never mixes two images.
 */
#ifndef ZI_IMAGE_PROMPT_H
#define ZI_IMAGE_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "image_prep.h"
#include "tokenizer.h"
#include "vision_config.h"
#include "zi_error.h"

/* One image as placed in the prompt. */
typedef struct zi_prompt_image {
    uint64_t hash;       /* zi_ctx_image_hash of the tiles' floats */
    int n_tiles;         /* tiles (idefics3: the grid, then the global image) */
    int tile_size;       /* pixels per side */
    int tile_tokens;     /* soft tokens per tile */
    int64_t *tile_first; /* [n_tiles]: position of each tile's first soft token */
    float *pixels;       /* n_tiles * tile_size^2 * 3 (image_prep.h's tiles) */
} zi_prompt_image;

/* llama.cpp's preprocessing for the projector c describes. */
void zi_image_prompt_params(const zi_vision_config *c, zi_image_prep_params *pp);

/* Whether the projector's tiles are decoded non-causally (each soft token
 * sees its whole tile: gemma3, as llama.cpp's mtmd_decode_use_non_causal). */
int zi_image_prompt_non_causal(const zi_vision_config *c);

/*
 * Builds text[0..len)'s ids with n_images images (already decoded, in
 * marker order): *ids (malloc'd, *n_ids) and *images (malloc'd,
 * n_images entries; free with zi_prompt_images_free). The marker count
 * must equal n_images (ZI_EINVAL naming both). Errors of the preparation
 * or the layout name the image's index ("image 2: ...").
 */
int zi_image_prompt_build(zi_tokenizer *tok, const char *text, size_t len, int add_special,
                          int parse_special, const zi_image_rgb *imgs, size_t n_images,
                          const zi_image_prep_params *pp, int32_t **ids, size_t *n_ids,
                          zi_prompt_image **images, zi_error *err);

void zi_prompt_images_free(zi_prompt_image *images, size_t n);

#endif
