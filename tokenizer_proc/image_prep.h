/*
 * image_prep.h - an RGB image (image.h) to the float tiles a vision tower
 * reads, and the prompt layout around them, exactly as llama.cpp's mtmd
 * does it for two projectors:
 *
 *   GEMMA3   (clip.projector_type "gemma3", SigLIP): one tile. The image is
 *            resized, aspect kept, to fit image_size x image_size and
 *            centred on black (mtmd_image_preprocessor_fixed_size calling
 *            img_tool::resize with RESIZE_ALGO_BILINEAR and PAD_CEIL).
 *   IDEFICS3 (clip.projector_type "idefics3", SmolVLM): a grid of
 *            image_size tiles cut from the image resized to whole tiles,
 *            then one global image (mtmd_image_preprocessor_idefics3).
 *
 * Resizing is llama.cpp's img_tool::resize_pillow (Pillow's separable
 * resampler with 22-bit fixed-point weights, bit for bit); normalization
 * is clip_image_f32::from_u8 then normalize: (v / 255.0f - mean[c]) /
 * std[c] in float. The exact rules, with the llama.cpp functions they
 * follow, are written at each step in image_prep.c.
 *
 * Filling zi_image_prep_params from an mmproj GGUF (the lead's loader):
 *   proj        clip.projector_type ("gemma3" / "idefics3")
 *   image_size  clip.vision.image_size
 *   patch_size  clip.vision.patch_size
 *   n_merge     clip.vision.projector.scale_factor if present; otherwise
 *               4 for gemma3 and 1 for idefics3 (llama.cpp's defaults)
 *   longest_edge clip.vision.preproc_image_size (idefics3; 0 if absent:
 *               older files, which take llama.cpp's other path)
 *   mean, std   clip.vision.image_mean, clip.vision.image_std
 *   min_tokens, max_tokens  not in the file: mtmd's image_min_tokens /
 *               image_max_tokens context options (-1 = unset); only
 *               idefics3 reads them, and setting either switches it to
 *               the size-limited path, as in llama.cpp
 * zi_image_prep_params_default fills the rest for a projector kind.
 */
#ifndef ZI_IMAGE_PREP_H
#define ZI_IMAGE_PREP_H

#include <stddef.h>
#include <stdint.h>

#include "image.h"
#include "zi_error.h"

typedef enum zi_image_proj {
    ZI_IMAGE_PROJ_GEMMA3 = 1,
    ZI_IMAGE_PROJ_IDEFICS3 = 2,
} zi_image_proj;

/* Resampling filters of img_tool::resize_pillow (Pillow's). */
typedef enum zi_resize_algo {
    ZI_RESIZE_BILINEAR = 0,
    ZI_RESIZE_BICUBIC, /* Pillow's a = -0.5 */
    ZI_RESIZE_LANCZOS, /* a = 3 */
} zi_resize_algo;

/* Refuses grids of more tiles than this by default (the idefics3 path
 * without preproc_image_size rounds the image to whole tiles and can make
 * hundreds of 512 x 512 x 3 float tiles from one large image). */
#define ZI_IMAGE_PREP_DEFAULT_MAX_TILES 64

typedef struct zi_image_prep_params {
    zi_image_proj proj;
    int image_size;             /* tile side in pixels (gemma3 896, SmolVLM 512) */
    int patch_size;             /* tower patch side (gemma3 14, SmolVLM 16) */
    int n_merge;                /* patches merged per side by the projector */
    int longest_edge;           /* idefics3 resize target of the longer side; 0 = none */
    int min_tokens, max_tokens; /* idefics3 custom token limits; -1 = unset */
    float mean[3], std[3];
    int max_tiles; /* grid tiles allowed (the global image not counted) */
} zi_image_prep_params;

/* The prepared tiles, in the order llama.cpp encodes them and the prompt
 * holds them: for IDEFICS3 the grid row by row (tile r * cols + c), then
 * the global image last (mtmd's ov_img_first is false for idefics3); for
 * GEMMA3 the one tile. */
typedef struct zi_image_tiles {
    int n_tiles;         /* tiles in data (grid_rows * grid_cols + 1 for idefics3) */
    int tile_size;       /* each tile is tile_size x tile_size x 3 floats */
    int grid_rows;       /* 0 for gemma3 */
    int grid_cols;       /* 0 for gemma3 */
    int tokens_per_tile; /* soft tokens each tile becomes: (tile/patch)^2 / n_merge^2 */
    float *data;         /* n_tiles * tile_size * tile_size * 3, each tile row-major,
                            pixels R, G, B interleaved (clip_image_f32) */
} zi_image_tiles;

/* Fills p for the projector kind: what llama.cpp uses when an optional
 * key is absent (n_merge 4 for gemma3, 1 for idefics3; longest_edge 0;
 * min/max tokens unset) and the usual values of the required keys (gemma3
 * 896 / 14, idefics3 512 / 16; mean = std = 0.5, SigLIP's, which both
 * families' files carry); max_tiles the default. The loader then
 * overwrites what the file states. */
void zi_image_prep_params_default(zi_image_prep_params *p, zi_image_proj proj);

/* Checks p's fields (positive sizes, image_size a multiple of patch_size *
 * n_merge, std not zero); ZI_EINVAL naming the field. */
int zi_image_prep_check(const zi_image_prep_params *p, zi_error *err);

/* Prepares img into out (zeroed first; free with zi_image_tiles_free).
 * Errors: ZI_EINVAL for bad params or an image whose resized side would be
 * 0 (llama.cpp throws there), ZI_ERANGE for a grid over p->max_tiles,
 * ZI_ENOMEM. */
int zi_image_prep(const zi_image_rgb *img, const zi_image_prep_params *p, zi_image_tiles *out,
                  zi_error *err);

void zi_image_tiles_free(zi_image_tiles *t);

/* One step of the prompt text around an image, as mtmd_tokenizer::add_media
 * lays it out:
 *   TEXT   text tokenized with special tokens parsed (mtmd's
 *          add_text(string, true)), e.g. "<start_of_image>" or
 *          "<fake_token_around_image><row_1_col_2>"
 *   TOKEN  exactly one token: the lowest id whose piece (special tokens
 *          rendered) equals text (mtmd's lookup_token), e.g. "\n\n"
 *   TILE   tokens_per_tile soft-token positions filled by tile `tile`'s
 *          embeddings (its index in zi_image_tiles.data) */
typedef enum zi_image_layout_kind {
    ZI_IMAGE_LAYOUT_TEXT = 1,
    ZI_IMAGE_LAYOUT_TOKEN,
    ZI_IMAGE_LAYOUT_TILE,
} zi_image_layout_kind;

typedef struct zi_image_layout_item {
    zi_image_layout_kind kind;
    char text[64]; /* TEXT and TOKEN; "" for TILE */
    int tile;      /* TILE: index into the tiles; -1 otherwise */
    int n_tokens;  /* TILE: tokens_per_tile; 0 otherwise */
} zi_image_layout_item;

/* Writes the layout of one image (which replaces the prompt's media
 * marker) into items[0, cap) and the number it needs into *n_items.
 * GEMMA3: TEXT "<start_of_image>", TILE 0, TEXT "<end_of_image>".
 * IDEFICS3, for r in rows, c in cols: TEXT "<fake_token_around_image>
 * <row_{r+1}_col_{c+1}>" (one string), TILE r*cols+c; after each row but
 * the last, TOKEN "\n"; then TOKEN "\n\n", TOKEN
 * "<fake_token_around_image>", TOKEN "<global-img>", TILE (the global
 * image, last), TOKEN "<fake_token_around_image>".
 * Returns ZI_ERANGE (with *n_items set) when cap is too small; items may be
 * NULL with cap 0 to ask for the count. */
int zi_image_layout(const zi_image_prep_params *p, const zi_image_tiles *t,
                    zi_image_layout_item *items, size_t cap, size_t *n_items, zi_error *err);

/* The total soft tokens of the image: n_tiles * tokens_per_tile. */
size_t zi_image_tiles_n_tokens(const zi_image_tiles *t);

/* img_tool::resize_pillow on its own: src (sw x sh RGB) to dst (dw x dh),
 * separable, horizontal pass first, 22-bit fixed-point weights; a
 * dimension that does not change is not resampled (a copy when neither
 * does). dst must hold dw * dh * 3 bytes. ZI_ENOMEM or ZI_EINVAL (a side
 * <= 0 or > 65536). Exposed for tests against Pillow. */
int zi_image_resize(const uint8_t *src, int sw, int sh, uint8_t *dst, int dw, int dh,
                    zi_resize_algo algo, zi_error *err);

#endif
