/*
 * vision_cmd.h - `zinfer encode-image`: a projector file's soft tokens for
 * an image, written as float32 (the image tower alone, model_worker/vision.h).
 */
#ifndef ZI_VISION_CMD_H
#define ZI_VISION_CMD_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "tokenizer.h"
#include "zi_error.h"

/* argv[0] is "encode-image". Returns the process exit status. */
int zi_encode_image_main(int argc, char **argv);

/* A prompt with images for `zinfer logits` and `generate` (--mmproj,
 * --image): its ids (soft-token positions hold image keys,
 * tokenizer_proc/image_prompt.h), every tile's soft tokens, and per
 * position the embedding row it enters as (-1: its token) and how far it
 * attends (its own position, or a non-causal tile's last), ready for
 * zi_batch.embd / embd_rows / attn_pos. */
typedef struct zi_cli_images {
    int32_t *ids;
    size_t n;
    float *embd; /* rows of lm_dim floats */
    int32_t *embd_rows, *attn_pos;
    int n_images, n_tiles;
    double encode_ms;
} zi_cli_images;

/* Loads the projector onto be (its output must be lm_dim wide), decodes
 * and prepares the n_paths image files, lays them out at prompt's
 * ZI_MEDIA_MARKERs and encodes every tile. */
int zi_cli_images_build(zi_backend *be, zi_tokenizer *tok, int lm_dim, const char *mmproj,
                        const char *prompt, int parse_special, const char *const *paths,
                        int n_paths, zi_cli_images *out, zi_error *err);
void zi_cli_images_free(zi_cli_images *ci);

/* Where a pass over [start, start + want) may end so that no non-causal
 * tile is split: at most start + want, cut before a tile the end would
 * split, or (a tile at start longer than want) just after it. */
size_t zi_cli_images_chunk_end(const zi_cli_images *ci, size_t start, size_t want);

#endif
