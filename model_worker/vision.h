/*
 * vision.h - image towers from llama.cpp's projector files (`--mmproj`,
 * GGUF architecture "clip"): the pixels of one image tile in, the text
 * model's input embeddings ("soft tokens") out.
 *
 * Two projectors, both a SigLIP vision transformer (llama.cpp's
 * tools/mtmd/models/siglip.cpp and clip.cpp build_vit) followed by a
 * projector:
 *   gemma3    the patches average-pooled n_merge x n_merge (64 x 64 patches
 *             of 896 px -> 16 x 16 = 256 soft tokens), an RMS norm times
 *             mm.soft_emb_norm, and mm.input_projection (stored transposed
 *             in the file: [n_embd rows][lm_dim], as llama.cpp reads it);
 *   idefics3  SmolVLM's: the patches pixel-shuffled by the scale factor s
 *             (each s x s block of patches becomes one token of s*s*n_embd
 *             values) and mm.model.fc.
 * The transformer: patch embedding (a convolution of stride patch_size,
 * computed as one product over the patches' pixels), learned position
 * embeddings, then per layer pre-LayerNorm (with bias), attention with
 * Q/K/V/O biases over all the tile's patches (non-causal), a residual,
 * pre-LayerNorm, GELU feed-forward with biases, a residual; the post
 * LayerNorm last.
 *
 * Everything runs through the backend's ops (kernels/backend.h): products
 * (matmul_tile where the backend has it: a tile needs no batch
 * invariance; the CPU's runs on AMX-BF16 tiles with operands split into
 * bf16 hi + lo, kernels/cpu/tile_mm.h, packed at load), layer norms, GELU,
 * span_attention (tile_precision: float32 on the CPU's tiles, ~1e-11
 * cosine distance from float64 at the end of the tower), and
 * the pooling and shuffling as gather_rows and weighted_sum_rows, so the
 * tower runs wherever the text model does. Only the im2col of the pixels
 * is done on the host.
 *
 * A tile's pixels are what llama.cpp's preprocessing makes of the image
 * (tokenizer_proc/image_prep.h): image_size x image_size x 3 floats,
 * interleaved RGB, row-major, already normalized with the file's mean and
 * std.
 */
#ifndef ZI_VISION_H
#define ZI_VISION_H

#include "backend.h"
#include "vision_config.h"
#include "zi_error.h"

typedef struct zi_vision zi_vision;

/* Opens the projector file at path and loads its tower onto be. Refuses,
 * naming the key or tensor, a file that is not a clip vision projector of
 * a supported type, or whose shapes disagree; lm_dim > 0 is the text
 * model's embedding length, which the projector's output must equal. */
int zi_vision_load(const char *path, zi_backend *be, int lm_dim, zi_vision **out, zi_error *err);

const zi_vision_config *zi_vision_get_config(const zi_vision *v);

/* The soft tokens of one tile: pixels (host memory, image_size^2 * 3
 * floats, see above) -> out (host memory, n_tokens * lm_dim floats, in
 * llama.cpp's order: row-major over the pooled or shuffled grid). */
int zi_vision_encode(zi_vision *v, const float *pixels, float *out, zi_error *err);

void zi_vision_free(zi_vision *v);

#endif
